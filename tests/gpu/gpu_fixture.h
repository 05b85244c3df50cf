/* gpu_fixture: the GPU tests' common start and end (header-only).
 *
 * gpu_list_or_skip() lists the GPUs; it returns 0 when there is at least
 * one, 77 (meson's "skipped") with a SKIP line when there is none, and 1
 * when the query itself failed. gpu_open_pair() opens the CPU reference
 * device and the first GPU; gpu_start_pair() does both. gpu_train_steps()
 * trains a small model on synthetic batches, the same way on either
 * device, for the tests that compare the CPU and CUDA backends' training.
 * gpu_verdict() ends a test. */
#ifndef ACC_GPU_FIXTURE_H
#define ACC_GPU_FIXTURE_H

#include <stdio.h>

#include "kern_discover.h"

static inline int gpu_list_or_skip(kern_device_info *g, int *n)
{
    acc_err err = {0};
    *n = 0;
    if (kern_cuda_query(g, KERN_MAX_DEVICES, n, &err) != 0) {
        fprintf(stderr, "kern_cuda_query failed: %s\n", err.msg);
        return 1;
    }
    if (*n == 0) {
        printf("SKIP: no CUDA GPU on this machine\n");
        return 77;
    }
    return 0;
}

/* A CPU reference device and the first GPU, side by side (kern_cuda.h must
 * be included before this header). Returns 0, or 1 with a message. */
#ifdef ACC_KERN_CUDA_H
#include "kern_cpu.h"
#include "kern_device.h"

static inline int gpu_open_pair(const kern_device_info *g, kern_device **cpu, kern_device **gpu)
{
    acc_err err = {0};
    kern_device_info ci = {.kind = KERN_DEV_CPU, .index = 0, .mem_total = 0};
    snprintf(ci.name, sizeof ci.name, "cpu0");
    if (kern_cpu_open(&ci, 1, cpu, &err) != 0 || kern_cuda_open(&g[0], 1, gpu, &err) != 0) {
        fprintf(stderr, "open: %s\n", err.msg);
        return 1;
    }
    return 0;
}

/* gpu_list_or_skip, then gpu_open_pair on the first GPU: 0, 77 or 1 (a
 * test's exit status). */
static inline int gpu_start_pair(kern_device_info *g, kern_device **cpu, kern_device **gpu)
{
    int n = 0;
    int skip = gpu_list_or_skip(g, &n);
    if (skip != 0)
        return skip;
    return gpu_open_pair(g, cpu, gpu) != 0 ? 1 : 0;
}

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "adamw.h"
#include "model.h"

/* `steps` AdamW steps of m on its device, each of `micro` accumulated
 * micro-steps over B rows of T tokens: tokens from a 64-bit LCG seeded
 * with `seed`, each target tok * mul + add (mod the vocabulary: learnable),
 * every token weighing 1 / (micro B T). Each step's summed loss and
 * gradient norm out. AdamW's eps is 1e-5, not 1e-8: some gradients are
 * exactly zero in exact arithmetic (GPT-2's key bias: softmax ignores a
 * constant added to a row of scores) and rounding noise on both backends
 * (~1e-10, of different sign) would otherwise be normalised by AdamW into
 * full +-lr steps that differ between CPU and GPU without changing any
 * loss. Returns 0, or -1 with a FAIL line (out of host memory). */
static inline int gpu_train_steps(model *m, adamw *opt, int B, int T, int micro, int steps, uint64_t seed,
                                  int mul, int add, double *loss, double *gnorm)
{
    spec_optim o = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-5, .weight_decay = 0.1};
    int V = m->cfg.vocab_size;
    int *tok = malloc(sizeof(int) * B * T), *tgt = malloc(sizeof(int) * B * T);
    float *w = malloc(sizeof(float) * B * T);
    if (tok == NULL || tgt == NULL || w == NULL) {
        fprintf(stderr, "FAIL: out of host memory for the batches\n");
        free(tok), free(tgt), free(w);
        return -1;
    }
    uint64_t s = seed;
    for (int step = 0; step < steps; step++) {
        model_zero_grad(m);
        double sum = 0.0;
        for (int k = 0; k < micro; k++) {
            for (int i = 0; i < B * T; i++) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                tok[i] = (int)((s >> 33) % (uint64_t)V);
                tgt[i] = (tok[i] * mul + add) % V;
                w[i] = 1.0f / ((float)micro * (float)B * (float)T);
            }
            double l = 0.0;
            model_forward(m, tok, tgt, w, B, 1, &l);
            model_backward(m, B);
            sum += l;
        }
        loss[step] = sum;
        gnorm[step] = sqrt(model_grad_sumsq(m));
        adamw_step(opt, &m->layout, m->params, m->grads, 1e-3f, &o, 1.0f);
    }
    free(tok), free(tgt), free(w);
    return 0;
}

/* After a run on d: 1 with a FAIL line where the CUDA backend holds a
 * sticky error, else 0 (a CPU device has none). */
static inline int gpu_cuda_failed(kern_device *d)
{
    acc_err err = {0};
    if (strcmp(d->ops->backend, "cuda") == 0 && kern_cuda_last_error(d, &err) != 0) {
        fprintf(stderr, "FAIL: CUDA error: %s\n", err.msg);
        return 1;
    }
    return 0;
}
#endif

/* A test's end: the count of failed checks and exit status 1, or `passed`
 * and 0. */
static inline int gpu_verdict(int failures, const char *passed)
{
    if (failures) {
        printf("%d check(s) failed\n", failures);
        return 1;
    }
    printf("%s\n", passed);
    return 0;
}

#endif
