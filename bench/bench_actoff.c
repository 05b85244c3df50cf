/* bench_actoff: the CPU step-time cost of activation checkpoints in host
 * memory and of token-chunked recomputed blocks, next to plain
 * recomputation, on a LLaMA-shaped model (forward + backward of one micro
 * batch; the modes interleaved rep by rep; medians), with each mode's
 * device activation bytes and host checkpoint bytes.
 *
 * Usage: bench_actoff [--threads N] [--reps N] [--seq T] [--chunk ROWS]
 * (--chunk: lean_chunk, the token chunk and the head's; default 1024)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "host_mem.h"
#include "kern_device.h"
#include "model.h"
#include "rng.h"

typedef struct mode {
    const char *name;
    bool lean, tok, offload;
} mode;

static const mode modes[] = {
    {"recompute", false, false, false},
    {"recompute + host checkpoints", false, false, true},
    {"recompute + lean (whole rows)", true, false, false},
    {"recompute + lean + token chunks", true, true, false},
    {"recompute + lean + token chunks + host checkpoints", true, true, true},
};
#define NMODES (sizeof modes / sizeof modes[0])

typedef struct runner {
    kern_device *d;
    model *m;
    host_mem h;
} runner;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int open_mode(const mode *md, int threads, int T, int chunk, runner *r)
{
    kern_device_info info = {.kind = KERN_DEV_CPU, .index = 0, .name = "cpu0", .mem_total = 0};
    acc_err err = {0};
    spec_model sm;
    memset(&sm, 0, sizeof sm);
    snprintf(sm.arch, sizeof sm.arch, "llama");
    sm.n_layer = 8;
    sm.n_head = 8;
    sm.n_kv_head = 2;
    sm.n_embd = 256;
    sm.intermediate_size = 688;
    sm.seq_len = T;
    sm.vocab_size = 1000;
    sm.padded_vocab_size = 1024;
    model_config cfg;
    if (kern_device_open(&info, threads, &r->d, &err) != 0 || model_config_from_spec(&sm, &cfg, &err) != 0)
        goto fail;
    cfg.lean_acts = md->lean;
    cfg.lean_tokens = md->tok;
    cfg.act_offload = md->offload;
    cfg.lean_chunk = chunk;
    host_mem_init(&r->h, 0);
    model_opts mo = {.B = 0, .T = T, .grad_tail = MODEL_GRAD_EXTRA};
    if (model_create_ex(r->d, &cfg, &mo, &r->m, &err) != 0)
        goto fail;
    r->m->host = &r->h;
    if (model_init_seed(r->m, 7, &err) != 0 || model_acts_alloc(r->m, 1, 1, &err) != 0)
        goto fail;
    return 0;
fail:
    fprintf(stderr, "bench_actoff: %s: %s\n", md->name, err.msg);
    return -1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int threads = 1, reps = 3, T = 1024, chunk = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--threads"))
            threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seq"))
            T = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--chunk"))
            chunk = atoi(argv[i + 1]);
    }
    if (threads < 1 || reps < 1 || reps > 64 || T < 2 || chunk < 0) {
        fprintf(stderr, "usage: bench_actoff [--threads N] [--reps N] [--seq T] [--chunk ROWS]\n");
        return 1;
    }
    runner r[NMODES];
    for (size_t k = 0; k < NMODES; k++)
        if (open_mode(&modes[k], threads, T, chunk, &r[k]) != 0)
            return 1;
    int *tok = malloc((size_t)T * sizeof *tok), *tgt = malloc((size_t)T * sizeof *tgt);
    float *w = malloc((size_t)T * sizeof *w);
    if (tok == NULL || tgt == NULL || w == NULL)
        return 1;
    rng g;
    rng_seed(&g, 1, 2);
    for (int i = 0; i < T; i++) {
        tok[i] = (int)rng_below(&g, 1000);
        tgt[i] = (int)rng_below(&g, 1000);
        w[i] = 1.0f / (float)T;
    }
    double t[NMODES][64];
    for (int rep = 0; rep <= reps; rep++) /* rep 0: warm-up */
        for (size_t k = 0; k < NMODES; k++) {
            double loss, t0 = now_s();
            model_forward(r[k].m, tok, tgt, w, 1, 1, &loss);
            model_backward(r[k].m, 1);
            if (rep > 0)
                t[k][rep - 1] = now_s() - t0;
        }
    printf("LLaMA-shaped: 8 layers, hidden 256, 8 heads (2 KV), MLP 688, vocab 1000; seq %d, m 1, fp32, "
           "%d thread(s), token chunk %d, median of %d\n\n", T, threads, chunk > 0 ? chunk : 1024, reps);
    printf("| mode | forward + backward | vs recompute | device activations | host checkpoints |\n"
           "|---|---|---|---|---|\n");
    double base = 0;
    for (size_t k = 0; k < NMODES; k++) {
        qsort(t[k], (size_t)reps, sizeof t[k][0], cmp_double);
        double med = t[k][reps / 2];
        if (k == 0)
            base = med;
        printf("| %s | %.3f s | %.2fx | %.2f MiB | %.2f MiB |\n", modes[k].name, med, med / base,
               (double)r[k].m->act_bytes / (1 << 20), (double)host_mem_peak(&r[k].h) / (1 << 20));
    }
    for (size_t k = 0; k < NMODES; k++) {
        model_free(r[k].m);
        host_mem_destroy(&r[k].h);
        kern_device_close(r[k].d);
    }
    free(tok);
    free(tgt);
    free(w);
    return 0;
}
