/* GPU: the CUDA backend's LLaMA-family ops (kern_cuda_llama.cu) against the
 * CPU backend's (kern_cpu_llama.c) on random inputs: fp32, max |gpu - cpu|
 * / max |cpu| under 1e-5 per output tensor (2e-5 for attention's
 * backward over long rows: sums of T products in other orders), backwards
 * accumulating into non-zero gradients, RoPE's backward overwriting. Shapes
 * of a small LLaMA layer (rows past a block, head sizes 64 and 128, an odd
 * half head, GQA / MQA / MHA, positions that restart), then the same ops in
 * bf16 mode (they stay fp32), then the start-up self-test. Exits 77
 * (skipped) with a message where no GPU is present. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern_cuda.h"
#include "kern_device.h"
#include "kern_discover.h"
#include "kern_rope.h"
#include "kern_selftest.h"
#include "gpu_fixture.h"

#define TOL 1e-5
#define TOL_ATT_BWD 2e-5

static kern_device *cpu, *gpu;
static int failures;
static uint64_t rng_state = 0x243f6a8885a308d3ull;

static double urand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

typedef struct buf2 {
    void *c, *g; /* the same tensor on the CPU device and on the GPU */
    size_t n, esz;
} buf2;

static void *xalloc(kern_device *d, size_t bytes)
{
    void *p = NULL;
    acc_err err = {0};
    if (d->ops->alloc(d, bytes, &p, &err) != 0) {
        fprintf(stderr, "FATAL: alloc %zu on %s: %s\n", bytes, d->ops->backend, err.msg);
        exit(1);
    }
    return p;
}

static buf2 put(const void *host, size_t n, size_t esz)
{
    buf2 b = {xalloc(cpu, n * esz), xalloc(gpu, n * esz), n, esz};
    cpu->ops->upload(cpu, b.c, host, n * esz);
    gpu->ops->upload(gpu, b.g, host, n * esz);
    return b;
}

static buf2 rnd(size_t n, float lo, float hi)
{
    float *h = malloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++)
        h[i] = lo + (hi - lo) * (float)urand();
    buf2 b = put(h, n, sizeof(float));
    free(h);
    return b;
}

static buf2 ints(const int *h, size_t n)
{
    return put(h, n, sizeof(int));
}

static void drop(buf2 *b)
{
    cpu->ops->free(cpu, b->c);
    gpu->ops->free(gpu, b->g);
    b->c = b->g = NULL;
}

static void check_dev(const char *what)
{
    acc_err err = {0};
    if (kern_cuda_last_error(gpu, &err) != 0) {
        fprintf(stderr, "FATAL: CUDA error after %s: %s\n", what, err.msg);
        exit(1);
    }
}

/* relative error against the largest reference value */
static void cmp(const char *name, const buf2 *b, double tol)
{
    check_dev(name);
    float *hc = malloc(b->n * sizeof *hc), *hg = malloc(b->n * sizeof *hg);
    cpu->ops->download(cpu, hc, b->c, b->n * sizeof *hc);
    gpu->ops->download(gpu, hg, b->g, b->n * sizeof *hg);
    check_dev(name);
    double md = 0.0, mr = 0.0;
    size_t worst = 0;
    int nonfinite = 0;
    for (size_t i = 0; i < b->n; i++) {
        if (!isfinite(hg[i]) || !isfinite(hc[i]))
            nonfinite++;
        double dd = fabs((double)hg[i] - (double)hc[i]);
        if (dd > md) {
            md = dd;
            worst = i;
        }
        mr = fmax(mr, fabs((double)hc[i]));
    }
    double rel = mr > 0 ? md / mr : md;
    int ok = rel < tol && nonfinite == 0 && mr > 0;
    printf("%-4s %-34s n=%-8zu rel %.3e (max |ref| %.3e, worst [%zu] cpu %.8g gpu %.8g)\n",
           ok ? "ok" : "FAIL", name, b->n, rel, mr, worst, (double)hc[worst], (double)hg[worst]);
    if (!ok)
        failures++;
    free(hc);
    free(hg);
}

/* the GPU's copy of b := the CPU's (so a backward sees the same inputs) */
static void sync_to_gpu(const buf2 *b)
{
    void *h = malloc(b->n * b->esz);
    cpu->ops->download(cpu, h, b->c, b->n * b->esz);
    gpu->ops->upload(gpu, b->g, h, b->n * b->esz);
    free(h);
}

#define BOTH(call_c, call_g) \
    do {                     \
        kern_device *D = cpu; \
        call_c;              \
        D = gpu;             \
        call_g;              \
    } while (0)
#define FC(b) ((float *)(b).c)
#define FG(b) ((float *)(b).g)
#define IC(b) ((int *)(b).c)
#define IG(b) ((int *)(b).g)

static void test_embed_norm_mlp(int N, int C, int I, int V)
{
    printf("-- embedding, RMSNorm, SwiGLU: N=%d C=%d I=%d\n", N, C, I);
    int *ht = malloc((size_t)N * sizeof *ht);
    for (int n = 0; n < N; n++)
        ht[n] = (int)(urand() * 8) % 8; /* few tokens: repeats hit the atomics */
    buf2 tok = ints(ht, N), wte = rnd((size_t)V * C, -1, 1), x = rnd((size_t)N * C, 0, 0);
    free(ht);
    BOTH(D->ops->embed_fwd(D, FC(x), IC(tok), FC(wte), N, C),
         D->ops->embed_fwd(D, FG(x), IG(tok), FG(wte), N, C));
    cmp("embed_fwd", &x, TOL);
    buf2 dx = rnd((size_t)N * C, -1, 1);
    BOTH(D->ops->embed_bwd(D, FC(wte), FC(dx), IC(tok), N, C),
         D->ops->embed_bwd(D, FG(wte), FG(dx), IG(tok), N, C));
    cmp("embed_bwd dwte (+=)", &wte, TOL);
    buf2 inp = rnd((size_t)N * C, -3, 3), w = rnd(C, 0.5f, 1.5f), out = rnd((size_t)N * C, 0, 0);
    buf2 rstd = rnd(N, 0, 0), dw = rnd(C, -1, 1), dout = rnd((size_t)N * C, -1, 1);
    BOTH(D->ops->rmsnorm_fwd(D, FC(out), FC(rstd), FC(inp), FC(w), 1e-5f, N, C),
         D->ops->rmsnorm_fwd(D, FG(out), FG(rstd), FG(inp), FG(w), 1e-5f, N, C));
    cmp("rmsnorm_fwd out", &out, TOL);
    cmp("rmsnorm_fwd rstd", &rstd, TOL);
    sync_to_gpu(&rstd);
    BOTH(D->ops->rmsnorm_bwd(D, FC(dx), FC(dw), FC(dout), FC(inp), FC(w), FC(rstd), N, C),
         D->ops->rmsnorm_bwd(D, FG(dx), FG(dw), FG(dout), FG(inp), FG(w), FG(rstd), N, C));
    cmp("rmsnorm_bwd dinp (+=)", &dx, TOL);
    cmp("rmsnorm_bwd dw (+=)", &dw, TOL);
    size_t n = (size_t)N * I;
    buf2 gate = rnd(n, -8, 8), up = rnd(n, -2, 2), h = rnd(n, 0, 0);
    buf2 dh = rnd(n, -1, 1), dgate = rnd(n, -1, 1), dup = rnd(n, -1, 1);
    BOTH(D->ops->swiglu_fwd(D, FC(h), FC(gate), FC(up), n),
         D->ops->swiglu_fwd(D, FG(h), FG(gate), FG(up), n));
    cmp("swiglu_fwd", &h, TOL);
    BOTH(D->ops->swiglu_bwd(D, FC(dgate), FC(dup), FC(dh), FC(gate), FC(up), n),
         D->ops->swiglu_bwd(D, FG(dgate), FG(dup), FG(dh), FG(gate), FG(up), n));
    cmp("swiglu_bwd dgate (+=)", &dgate, TOL);
    cmp("swiglu_bwd dup (+=)", &dup, TOL);
    buf2 *all[] = {&tok, &wte, &x, &dx, &inp, &w, &out, &rstd, &dw, &dout,
                   &gate, &up, &h, &dh, &dgate, &dup};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        drop(all[i]);
}

static void test_rope_attention(int B, int T, int NH, int NKV, int hs, int packed)
{
    printf("-- RoPE + attention: B=%d T=%d NH=%d NKV=%d hs=%d, positions %s\n", B, T, NH, NKV,
           hs, packed ? "restarting" : "t");
    int P = T + 16;
    kern_rope_cfg cfg = {.theta = 500000.0, .type = KERN_ROPE_LLAMA3, .factor = 8.0,
                         .low_freq_factor = 1.0, .high_freq_factor = 4.0,
                         .original_max_pos = 256};
    size_t tn = KERN_ROPE_TABLE(P, hs);
    float *hc = malloc(tn * sizeof *hc), *hsn = malloc(tn * sizeof *hsn);
    int *hp = malloc((size_t)B * T * sizeof *hp);
    acc_err err = {0};
    if (kern_rope_table(&cfg, P, hs, hc, hsn, &err) != 0) {
        fprintf(stderr, "FAIL: rope table: %s\n", err.msg);
        exit(1);
    }
    for (int n = 0; n < B * T; n++)
        hp[n] = n % T < T / 3 ? n % T : n % T - T / 3 + 16; /* a second document */
    buf2 ct = put(hc, tn, sizeof(float)), sn = put(hsn, tn, sizeof(float));
    buf2 pos = ints(hp, (size_t)B * T);
    free(hc), free(hsn), free(hp);
    const int *pc = packed ? IC(pos) : NULL, *pg = packed ? IG(pos) : NULL;
    size_t qn = (size_t)B * T * NH * hs, kn = (size_t)B * T * NKV * hs;
    buf2 q = rnd(qn, -2, 2), k = rnd(kn, -2, 2), v = rnd(kn, -2, 2), kr = rnd(kn, 0, 0);
    BOTH(D->ops->rope_fwd(D, FC(q), FC(q), FC(ct), FC(sn), pc, B, T, NH, hs),
         D->ops->rope_fwd(D, FG(q), FG(q), FG(ct), FG(sn), pg, B, T, NH, hs));
    cmp("rope_fwd q (in place)", &q, TOL);
    BOTH(D->ops->rope_fwd(D, FC(kr), FC(k), FC(ct), FC(sn), pc, B, T, NKV, hs),
         D->ops->rope_fwd(D, FG(kr), FG(k), FG(ct), FG(sn), pg, B, T, NKV, hs));
    cmp("rope_fwd k", &kr, TOL);
    sync_to_gpu(&q);
    sync_to_gpu(&kr);
    buf2 out = rnd(qn, 0, 0), lse = rnd((size_t)B * NH * T, 0, 0);
    buf2 scr = rnd(KERN_ATT_SCRATCH(T, NH), -1, 1); /* garbage must not matter */
    BOTH(D->ops->gqa_attention_fwd(D, FC(out), FC(lse), FC(scr), FC(q), FC(kr), FC(v), B, T, NH, NKV, hs),
         D->ops->gqa_attention_fwd(D, FG(out), FG(lse), FG(scr), FG(q), FG(kr), FG(v), B, T, NH, NKV, hs));
    cmp("gqa_attention_fwd out", &out, TOL);
    cmp("gqa_attention_fwd lse", &lse, TOL);
    sync_to_gpu(&out);
    sync_to_gpu(&lse);
    buf2 dout = rnd(qn, -1, 1), dq = rnd(qn, -1, 1), dk = rnd(kn, -1, 1), dv = rnd(kn, -1, 1);
    BOTH(D->ops->gqa_attention_bwd(D, FC(dq), FC(dk), FC(dv), FC(scr), FC(dout), FC(q), FC(kr), FC(v), FC(lse), FC(out), B, T, NH, NKV, hs),
         D->ops->gqa_attention_bwd(D, FG(dq), FG(dk), FG(dv), FG(scr), FG(dout), FG(q), FG(kr), FG(v), FG(lse), FG(out), B, T, NH, NKV, hs));
    cmp("gqa_attention_bwd dq (+=)", &dq, TOL_ATT_BWD);
    cmp("gqa_attention_bwd dk (+=)", &dk, TOL_ATT_BWD);
    cmp("gqa_attention_bwd dv (+=)", &dv, TOL_ATT_BWD);
    sync_to_gpu(&dq);
    sync_to_gpu(&dk);
    BOTH(D->ops->rope_bwd(D, FC(dq), FC(dq), FC(ct), FC(sn), pc, B, T, NH, hs),
         D->ops->rope_bwd(D, FG(dq), FG(dq), FG(ct), FG(sn), pg, B, T, NH, hs));
    cmp("rope_bwd dq (in place)", &dq, TOL);
    BOTH(D->ops->rope_bwd(D, FC(k), FC(dk), FC(ct), FC(sn), pc, B, T, NKV, hs),
         D->ops->rope_bwd(D, FG(k), FG(dk), FG(ct), FG(sn), pg, B, T, NKV, hs));
    cmp("rope_bwd dk (overwrites)", &k, TOL);
    buf2 *all[] = {&ct, &sn, &pos, &q, &k, &v, &kr, &out, &lse, &scr, &dout, &dq, &dk, &dv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        drop(all[i]);
}

static void test_all(void)
{
    test_embed_norm_mlp(2 * 150, 320, 864, 50);
    test_rope_attention(2, 150, 8, 2, 64, 1);  /* GQA, 4 query heads per key/value head */
    test_rope_attention(3, 37, 4, 1, 128, 0);  /* MQA, a LLaMA-sized head */
    test_rope_attention(2, 300, 3, 3, 34, 1);  /* MHA, half head 17, rows past a block */
}

int main(void)
{
    kern_device_info g[KERN_MAX_DEVICES];
    acc_err err = {0};
    int rc = gpu_start_pair(g, &cpu, &gpu);
    if (rc != 0)
        return rc;
    printf("GPU %s (sm_%d%d)\n", g[0].name, g[0].cc_major, g[0].cc_minor);
    if (kern_llama_ops_check(gpu, &err) != 0) {
        fprintf(stderr, "FAIL: %s\n", err.msg);
        return 1;
    }
    test_all();
    check_dev("all LLaMA ops");
    if (gpu->in_use != 0) {
        fprintf(stderr, "FAIL: %llu bytes left allocated on the GPU\n",
                (unsigned long long)gpu->in_use);
        failures++;
    }
    /* bf16 mode touches only the matmuls: these ops stay fp32 */
    if (gpu->ops->set_precision(gpu, 1, &err) != 0) {
        fprintf(stderr, "FAIL: bf16: %s\n", err.msg);
        failures++;
    } else {
        printf("-- the same in bf16 mode (still fp32, tolerance unchanged)\n");
        test_all();
        check_dev("bf16 mode");
        gpu->ops->set_precision(gpu, 0, &err);
    }
    kern_device_close(gpu);
    kern_device_close(cpu);
    /* the start-up self-test, which includes these ops */
    if (kern_selftest_device(&g[0], &err) != 0) {
        fprintf(stderr, "FAIL: self-test: %s\n", err.msg);
        failures++;
    } else {
        printf("ok   start-up self-test (with the LLaMA ops)\n");
    }
    return gpu_verdict(failures, "all CUDA LLaMA-op checks passed");
}
