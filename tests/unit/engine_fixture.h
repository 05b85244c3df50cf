/* engine_fixture: shared helpers of the engine tests (header-only, static).
 *
 * A tiny GPT-2 job spec over a generated text file, CPU device lists, and
 * relative comparisons of float vectors.
 */
#ifndef ACC_ENGINE_FIXTURE_H
#define ACC_ENGINE_FIXTURE_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train_cfg.h"
#include "kern_discover.h"

/* Write `n` bytes of English-like text (deterministic) to a temp file. */
static inline void fx_write_text(char *path, size_t cap, size_t n)
{
    static const char *words[] = {"the", "model", "learns", "to", "predict", "next",
                                  "byte", "of", "text", "and", "accumulates", "gradients",
                                  "in", "place", "across", "micro", "steps", "while"};
    snprintf(path, cap, "/tmp/accumd-fx-XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0)
        abort();
    FILE *f = fdopen(fd, "w");
    unsigned x = 12345;
    size_t w = 0;
    while (w < n) {
        x = x * 1103515245u + 12345u;
        const char *s = words[(x >> 16) % (sizeof words / sizeof *words)];
        w += (size_t)fprintf(f, "%s%s", s, (x >> 8) % 7 == 0 ? ".\n" : " ");
    }
    fclose(f);
}

static inline void fx_tiny_spec(train_cfg *s, const char *train, int B, int m, int a, int w)
{
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "fixture");
    snprintf(s->model.arch, sizeof s->model.arch, "gpt2");
    s->model.n_layer = 2;
    s->model.n_head = 2;
    s->model.n_embd = 32;
    s->model.seq_len = 16;
    s->model.vocab_size = 256;
    s->model.padded_vocab_size = 264; /* exercises the padded rows */
    snprintf(s->data.train, sizeof s->data.train, "%s", train);
    s->data.format = SPEC_DATA_TEXT;
    s->train_batch_size = B;
    s->micro_batch = m;
    s->accum_steps = a;
    s->devices = w;
    s->optim.lr = 1e-3;
    s->optim.beta1 = 0.9;
    s->optim.beta2 = 0.95;
    s->optim.eps = 1e-8;
    s->optim.weight_decay = 0.1;
    s->optim.grad_clip = 1.0;
    s->lr.type = SPEC_LR_CONSTANT;
    s->max_steps = 4;
    s->eval_batches = 1;
    s->seed = 1337;
}

static inline void fx_devices(kern_device_info *d, int n, uint64_t budget)
{
    memset(d, 0, sizeof *d * (size_t)n);
    for (int i = 0; i < n; i++) {
        d[i].kind = KERN_DEV_CPU;
        d[i].index = i;
        snprintf(d[i].name, sizeof d[i].name, "cpu%d", i);
        d[i].mem_total = budget;
    }
}

/* ||a - b|| / ||a|| in double */
static inline double fx_rel_diff(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)a[i] * a[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#endif
