/* GPU: bf16 activation storage (blocks.h). narrow_bf16 on the GPU gives
 * kern_bf16_round's bits (the host's) for every bf16 value's neighbourhood:
 * all 65536 upper halves, each with the lower halves that decide the
 * rounding (0, 1, just below / at / just above the tie, all ones) and two
 * random ones; a NaN stays a NaN. Then a small LLaMA (GQA) trained with
 * act_bf16 on the CUDA backend matches the CPU backend's bf16 run (losses
 * and gradient norms within 1e-2 relative, stored and recompute), both
 * allocate the same activation bytes, and those are below the fp32
 * activations'. Exits 77 (skipped) where no GPU is present. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern_cuda.h"
#include "gpu_fixture.h"
#include "adamw.h"
#include "model.h"

enum { L = 4, NH = 4, NKV = 2, C = 64, I = 96, V = 101, VP = 128, MAXT = 64, T = 32, B = 4,
       STEPS = 10 };

static int failures;

static void check(int ok, const char *what, double cpu, double gpu)
{
    printf("%s %s (cpu %.10g gpu %.10g)\n", ok ? "ok  " : "FAIL", what, cpu, gpu);
    failures += !ok;
}

static void narrow_bits(kern_device *gpu)
{
    static const uint32_t lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff};
    enum { NL = sizeof lows / sizeof lows[0] + 2 };
    size_t n = (size_t)65536 * NL;
    float *x = malloc(n * sizeof *x);
    uint16_t *got = malloc(n * sizeof *got);
    void *dx = NULL, *dy = NULL;
    acc_err err = {0};
    if (x == NULL || got == NULL || gpu->ops->alloc(gpu, n * sizeof *x, &dx, &err) != 0 ||
        gpu->ops->alloc(gpu, n * sizeof *got, &dy, &err) != 0) {
        fprintf(stderr, "FAIL: narrow_bf16: out of memory\n");
        failures++;
        return;
    }
    uint64_t s = 11;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        size_t k = i % NL;
        uint32_t u = (uint32_t)(i / NL) << 16 | (k < NL - 2 ? lows[k] : (uint32_t)(s >> 48));
        memcpy(&x[i], &u, sizeof u);
    }
    gpu->ops->upload(gpu, dx, x, n * sizeof *x);
    gpu->ops->narrow_bf16(gpu, dy, dx, n);
    gpu->ops->download(gpu, got, dy, n * sizeof *got);
    size_t bad = 0, nans = 0;
    for (size_t i = 0; i < n; i++) {
        float want = kern_bf16_round(x[i]), g = kern_bf16_to_f32(got[i]);
        if (isnan(x[i]))
            nans++, bad += !isnan(g);
        else
            bad += memcmp(&want, &g, sizeof g) != 0;
    }
    check(bad == 0, "narrow_bf16: kern_bf16_round's bits (NaN stays NaN), values checked",
          (double)n, (double)bad);
    printf("     (%zu NaN inputs among them)\n", nans);
    gpu->ops->free(gpu, dx);
    gpu->ops->free(gpu, dy);
    free(x);
    free(got);
}

typedef struct run {
    double loss[STEPS], gnorm[STEPS];
    uint64_t act_bytes;
} run;

static int train(kern_device *d, int recompute, int act_bf16, run *r)
{
    model_config cfg = {.family = model_family_by_arch("llama"), .n_layer = L, .n_head = NH,
                        .n_kv_head = NKV, .channels = C, .intermediate_size = I, .vocab_size = V,
                        .padded_vocab_size = VP, .max_seq_len = MAXT, .norm_eps = 1e-5,
                        .rope_theta = 10000.0, .act_bf16 = act_bf16};
    snprintf(cfg.model_type, sizeof cfg.model_type, "llama");
    model *m = NULL;
    adamw *opt = NULL;
    acc_err err = {0};
    if (model_create(d, &cfg, 0, T, &m, &err) != 0 || model_acts_alloc(m, B, recompute, &err) != 0 ||
        adamw_create(d, 0, m->ngrad, &opt, &err) != 0 || model_init_seed(m, 5, &err) != 0) {
        fprintf(stderr, "FAIL: llama on %s: %s\n", d->ops->backend, err.msg);
        failures++;
        return -1;
    }
    int rc = gpu_train_steps(m, opt, B, T, 1, STEPS, 3, 3, 2, r->loss, r->gnorm);
    r->act_bytes = m->act_bytes;
    failures += (rc != 0) + gpu_cuda_failed(d);
    adamw_free(opt);
    model_free(m);
    return rc;
}

static void compare(kern_device *cpu, kern_device *gpu, int recompute)
{
    run c = {0}, g = {0}, f = {0};
    if (train(cpu, recompute, 1, &c) || train(gpu, recompute, 1, &g) ||
        train(gpu, recompute, 0, &f))
        return;
    char what[96];
    for (int i = 0; i < STEPS; i++) {
        snprintf(what, sizeof what, "recompute %d step %d: loss within 1e-2", recompute, i);
        check(fabs(c.loss[i] - g.loss[i]) <= 1e-2 * fabs(c.loss[i]), what, c.loss[i], g.loss[i]);
        snprintf(what, sizeof what, "recompute %d step %d: |g| within 1e-2", recompute, i);
        check(fabs(c.gnorm[i] - g.gnorm[i]) <= 1e-2 * fabs(c.gnorm[i]), what, c.gnorm[i],
              g.gnorm[i]);
    }
    snprintf(what, sizeof what, "recompute %d: the same activation bytes", recompute);
    check(c.act_bytes == g.act_bytes, what, (double)c.act_bytes, (double)g.act_bytes);
    snprintf(what, sizeof what, "recompute %d: below fp32 activations' %llu", recompute,
             (unsigned long long)f.act_bytes);
    check(g.act_bytes < f.act_bytes, what, (double)c.act_bytes, (double)g.act_bytes);
}

int main(void)
{
    kern_device_info g[KERN_MAX_DEVICES];
    kern_device *cpu = NULL, *gpu = NULL;
    int rc = gpu_start_pair(g, &cpu, &gpu);
    if (rc != 0)
        return rc;
    acc_err err = {0};
    if (gpu->ops->narrow_bf16 == NULL || kern_llama_ops_check(gpu, &err) != 0) {
        fprintf(stderr, "FAIL: the CUDA backend lacks narrow_bf16 or a LLaMA op %s\n", err.msg);
        return 1;
    }
    narrow_bits(gpu);
    if (cpu->ops->set_precision(cpu, 1, &err) != 0 || gpu->ops->set_precision(gpu, 1, &err) != 0) {
        fprintf(stderr, "FAIL: bf16: %s\n", err.msg);
        return 1;
    }
    compare(cpu, gpu, 0);
    compare(cpu, gpu, 1);
    kern_device_close(gpu);
    kern_device_close(cpu);
    return gpu_verdict(failures, "bf16 activation storage on the GPU matches the CPU backend");
}
