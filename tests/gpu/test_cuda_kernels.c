/* GPU: every kernel of the CUDA backend against the CPU backend on random
 * inputs (fp32: max |gpu - cpu| / max |cpu| under 1e-5 per output tensor,
 * backwards accumulating into non-zero gradients); bf16 linear layers
 * against the CPU's bf16 (1e-4: the same rounded operands) on the test's
 * shapes and on LLaMA-2-7B's, an odd one included, taking no device
 * memory; copies, and the CUDA
 * allocator's accounting, cache and out-of-memory behaviour under a budget
 * cap. Exits 77 (skipped) with a message where no GPU is present. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern_cuda.h"
#include "kern_device.h"
#include "kern_discover.h"
#include "gpu_fixture.h"

#define TOL 1e-5

static kern_device *cpu, *gpu;
static int failures;
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

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
    void *base_c, *base_g; /* the allocations (c, g may be offset into them) */
} buf2;

static size_t g_off; /* elements every new tensor is offset by (alignment tests) */

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
    buf2 b = {NULL, NULL, n, esz, xalloc(cpu, (n + g_off) * esz), xalloc(gpu, (n + g_off) * esz)};
    b.c = (char *)b.base_c + g_off * esz;
    b.g = (char *)b.base_g + g_off * esz;
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

static buf2 rnd_int(size_t n, int below)
{
    int *h = malloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++)
        h[i] = (int)(urand() * below) % below;
    buf2 b = put(h, n, sizeof(int));
    free(h);
    return b;
}

static void drop(buf2 *b)
{
    cpu->ops->free(cpu, b->base_c);
    gpu->ops->free(gpu, b->base_g);
    b->c = b->g = b->base_c = b->base_g = NULL;
}

static void check_dev(const char *what)
{
    acc_err err = {0};
    if (kern_cuda_last_error(gpu, &err) != 0) {
        fprintf(stderr, "FATAL: CUDA error after %s: %s\n", what, err.msg);
        exit(1);
    }
}

static void expect(int ok, const char *fmt, const char *what)
{
    if (!ok) {
        fprintf(stderr, "FAIL: %s %s\n", fmt, what);
        failures++;
    }
}

/* compare a float tensor: relative error against the largest reference value */
static double cmp(const char *name, const buf2 *b, double tol)
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
        if (fabs((double)hc[i]) > mr)
            mr = fabs((double)hc[i]);
    }
    double rel = mr > 0 ? md / mr : md;
    int ok = rel < tol && nonfinite == 0 && mr > 0;
    printf("%-4s %-28s n=%-8zu rel %.3e (max |ref| %.3e, worst [%zu] cpu %.8g gpu %.8g)\n",
           ok ? "ok" : "FAIL", name, b->n, rel, mr, worst, (double)hc[worst], (double)hg[worst]);
    if (!ok)
        failures++;
    free(hc);
    free(hg);
    return rel;
}

static void cmp_scalar(const char *name, double c, double g, double tol)
{
    double rel = fabs(c - g) / (fabs(c) > 0 ? fabs(c) : 1.0);
    int ok = rel < tol && isfinite(g);
    printf("%-4s %-28s cpu %.12g gpu %.12g rel %.3e\n", ok ? "ok" : "FAIL", name, c, g, rel);
    if (!ok)
        failures++;
}

/* ---- the kernels */

enum { B = 3, T = 37, C = 96, NH = 4, OC = 160, V = 101, VP = 128 };
#define N (B * T)

static void test_encoder(void)
{
    buf2 tok = rnd_int(N, V), wte = rnd((size_t)VP * C, -1, 1), wpe = rnd((size_t)T * C, -1, 1);
    buf2 out = rnd((size_t)N * C, -1, 1), dout = rnd((size_t)N * C, -1, 1);
    buf2 dwte = rnd((size_t)VP * C, -1, 1), dwpe = rnd((size_t)T * C, -1, 1);
    cpu->ops->encoder_fwd(cpu, out.c, tok.c, wte.c, wpe.c, B, T, C);
    gpu->ops->encoder_fwd(gpu, out.g, tok.g, wte.g, wpe.g, B, T, C);
    cmp("encoder_fwd out", &out, TOL);
    cpu->ops->encoder_bwd(cpu, dwte.c, dwpe.c, dout.c, tok.c, B, T, C);
    gpu->ops->encoder_bwd(gpu, dwte.g, dwpe.g, dout.g, tok.g, B, T, C);
    cmp("encoder_bwd dwte (+=)", &dwte, TOL);
    cmp("encoder_bwd dwpe (+=)", &dwpe, TOL);
    drop(&tok), drop(&wte), drop(&wpe), drop(&out), drop(&dout), drop(&dwte), drop(&dwpe);
}

static void test_layernorm(void)
{
    buf2 inp = rnd((size_t)N * C, -3, 5), w = rnd(C, 0.5f, 1.5f), b = rnd(C, -1, 1);
    buf2 out = rnd((size_t)N * C, -1, 1), mean = rnd(N, 0, 1), rstd = rnd(N, 0, 1);
    cpu->ops->layernorm_fwd(cpu, out.c, mean.c, rstd.c, inp.c, w.c, b.c, N, C);
    gpu->ops->layernorm_fwd(gpu, out.g, mean.g, rstd.g, inp.g, w.g, b.g, N, C);
    cmp("layernorm_fwd out", &out, TOL);
    cmp("layernorm_fwd mean", &mean, TOL);
    cmp("layernorm_fwd rstd", &rstd, TOL);
    /* the backward from the CPU's mean/rstd on both, so only the backward is compared */
    float *h = malloc(N * sizeof *h);
    cpu->ops->download(cpu, h, mean.c, N * sizeof *h);
    gpu->ops->upload(gpu, mean.g, h, N * sizeof *h);
    cpu->ops->download(cpu, h, rstd.c, N * sizeof *h);
    gpu->ops->upload(gpu, rstd.g, h, N * sizeof *h);
    free(h);
    buf2 dout = rnd((size_t)N * C, -1, 1), dinp = rnd((size_t)N * C, -1, 1);
    buf2 dw = rnd(C, -1, 1), db = rnd(C, -1, 1);
    cpu->ops->layernorm_bwd(cpu, dinp.c, dw.c, db.c, dout.c, inp.c, w.c, mean.c, rstd.c, N, C);
    gpu->ops->layernorm_bwd(gpu, dinp.g, dw.g, db.g, dout.g, inp.g, w.g, mean.g, rstd.g, N, C);
    cmp("layernorm_bwd dinp (+=)", &dinp, TOL);
    cmp("layernorm_bwd dw (+=)", &dw, TOL);
    cmp("layernorm_bwd db (+=)", &db, TOL);
    drop(&inp), drop(&w), drop(&b), drop(&out), drop(&mean), drop(&rstd);
    drop(&dout), drop(&dinp), drop(&dw), drop(&db);
}

static void test_matmul(double tol)
{
    buf2 inp = rnd((size_t)N * C, -1, 1), w = rnd((size_t)OC * C, -0.5f, 0.5f);
    buf2 bias = rnd(OC, -1, 1), out = rnd((size_t)N * OC, -1, 1);
    cpu->ops->matmul_fwd(cpu, out.c, inp.c, w.c, bias.c, N, C, OC);
    gpu->ops->matmul_fwd(gpu, out.g, inp.g, w.g, bias.g, N, C, OC);
    cmp("matmul_fwd out (bias)", &out, tol);
    cpu->ops->matmul_fwd(cpu, out.c, inp.c, w.c, NULL, N, C, OC);
    gpu->ops->matmul_fwd(gpu, out.g, inp.g, w.g, NULL, N, C, OC);
    cmp("matmul_fwd out (no bias)", &out, tol);
    buf2 dout = rnd((size_t)N * OC, -1, 1), dinp = rnd((size_t)N * C, -1, 1);
    buf2 dw = rnd((size_t)OC * C, -1, 1), db = rnd(OC, -1, 1);
    cpu->ops->matmul_bwd(cpu, dinp.c, dw.c, db.c, dout.c, inp.c, w.c, N, C, OC);
    gpu->ops->matmul_bwd(gpu, dinp.g, dw.g, db.g, dout.g, inp.g, w.g, N, C, OC);
    cmp("matmul_bwd dinp (+=)", &dinp, tol);
    cmp("matmul_bwd dw (+=)", &dw, tol);
    cmp("matmul_bwd dbias (+=)", &db, tol);
    cpu->ops->matmul_bwd(cpu, NULL, dw.c, NULL, dout.c, inp.c, w.c, N, C, OC);
    gpu->ops->matmul_bwd(gpu, NULL, dw.g, NULL, dout.g, inp.g, w.g, N, C, OC);
    cmp("matmul_bwd dw (no dinp/dbias)", &dw, tol);
    drop(&inp), drop(&w), drop(&bias), drop(&out), drop(&dout), drop(&dinp), drop(&dw), drop(&db);
}

/* One linear layer's products at n x k -> n x oc (matmul_fwd with bias,
 * matmul_bwd into all three gradients), GPU against CPU within tol; the
 * GPU allocates nothing while they run (its peak stays at the test's own
 * buffers: in bf16 no operand copies, no workspace). */
static void matmul_at(const char *what, int n, int k, int oc, double tol)
{
    char name[96];
    buf2 inp = rnd((size_t)n * k, -1, 1), w = rnd((size_t)oc * k, -0.05f, 0.05f);
    buf2 bias = rnd(oc, -1, 1), out = rnd((size_t)n * oc, -1, 1);
    buf2 dout = rnd((size_t)n * oc, -1, 1), dinp = rnd((size_t)n * k, -1, 1);
    buf2 dw = rnd((size_t)oc * k, -1, 1), db = rnd(oc, -1, 1);
    kern_device_reset_peak(gpu);
    cpu->ops->matmul_fwd(cpu, out.c, inp.c, w.c, bias.c, n, k, oc);
    gpu->ops->matmul_fwd(gpu, out.g, inp.g, w.g, bias.g, n, k, oc);
    snprintf(name, sizeof name, "%s fwd", what);
    cmp(name, &out, tol);
    cpu->ops->matmul_bwd(cpu, dinp.c, dw.c, db.c, dout.c, inp.c, w.c, n, k, oc);
    gpu->ops->matmul_bwd(gpu, dinp.g, dw.g, db.g, dout.g, inp.g, w.g, n, k, oc);
    snprintf(name, sizeof name, "%s dinp", what);
    cmp(name, &dinp, tol);
    snprintf(name, sizeof name, "%s dw", what);
    cmp(name, &dw, tol);
    snprintf(name, sizeof name, "%s dbias", what);
    cmp(name, &db, tol);
    expect(gpu->peak == gpu->in_use, "no device memory taken by the products:", what);
    drop(&inp), drop(&w), drop(&bias), drop(&out), drop(&dout), drop(&dinp), drop(&dw), drop(&db);
}

/* LLaMA-2-7B's linear layers (C 4096, MLP 11008, vocabulary 32000) on a
 * few hundred rows, and an odd shape whose every dimension is odd (rows
 * off every alignment past 4 bytes), then the same off the 16-byte grid */
static void test_matmul_llama(double tol)
{
    matmul_at("llama q/o proj 256x4096x4096", 256, 4096, 4096, tol);
    matmul_at("llama mlp up 128x4096x11008", 128, 4096, 11008, tol);
    matmul_at("llama mlp down 128x11008x4096", 128, 11008, 4096, tol);
    matmul_at("llama lm head 64x4096x32000", 64, 4096, 32000, tol);
    matmul_at("odd 77x4097x1001", 77, 4097, 1001, tol);
    g_off = 1;
    matmul_at("odd 77x4097x1001 (offset)", 77, 4097, 1001, tol);
    g_off = 0;
}

/* matmuls with aligned operands, then with operands off the 16-byte grid */
static void test_matmul_offsets(double tol)
{
    test_matmul(tol);
    g_off = 1;
    test_matmul(tol);
    g_off = 0;
}

static void test_attention(double tol)
{
    size_t nlse = (size_t)B * NH * T, nscr = KERN_ATT_SCRATCH(T, NH);
    buf2 qkv = rnd((size_t)N * 3 * C, -2, 2), out = rnd((size_t)N * C, -1, 1);
    buf2 lse = rnd(nlse, -1, 1), scr = rnd(nscr, -1, 1); /* garbage in the scratch must not matter */
    cpu->ops->attention_fwd(cpu, out.c, lse.c, scr.c, qkv.c, B, T, C, NH);
    gpu->ops->attention_fwd(gpu, out.g, lse.g, scr.g, qkv.g, B, T, C, NH);
    cmp("attention_fwd out", &out, tol);
    cmp("attention_fwd lse", &lse, tol);
    /* both backwards from the CPU's lse, so only the backward is compared */
    float *h = malloc(nlse * sizeof *h);
    cpu->ops->download(cpu, h, lse.c, nlse * sizeof *h);
    gpu->ops->upload(gpu, lse.g, h, nlse * sizeof *h);
    free(h);
    buf2 dout = rnd((size_t)N * C, -1, 1), dqkv = rnd((size_t)N * 3 * C, -1, 1);
    cpu->ops->attention_bwd(cpu, dqkv.c, scr.c, dout.c, qkv.c, lse.c, out.c, B, T, C, NH);
    gpu->ops->attention_bwd(gpu, dqkv.g, scr.g, dout.g, qkv.g, lse.g, out.g, B, T, C, NH);
    cmp("attention_bwd dqkv (+=)", &dqkv, tol);
    drop(&qkv), drop(&out), drop(&lse), drop(&scr), drop(&dout), drop(&dqkv);
}

#ifdef GPU_TEST_FLASH_ONLY
/* The tiled tensor-core attention (bf16 mode, head size 64) against the
 * CPU's fp32 attention: T = 100 (a partial tile) and 192 (three whole). */
static void test_flash_attention(int FT, double tol)
{
    enum { FB = 2, FC = 128, FNH = 2 };
    size_t n = (size_t)FB * FT, nlse = (size_t)FB * FNH * FT;
    buf2 qkv = rnd(n * 3 * FC, -2, 2), out = rnd(n * FC, -1, 1), lse = rnd(nlse, -1, 1);
    buf2 scr = rnd(KERN_ATT_SCRATCH(FT, FNH), -1, 1);
    cpu->ops->attention_fwd(cpu, out.c, lse.c, scr.c, qkv.c, FB, FT, FC, FNH);
    gpu->ops->attention_fwd(gpu, out.g, lse.g, scr.g, qkv.g, FB, FT, FC, FNH);
    cmp("flash attention_fwd out", &out, tol);
    cmp("flash attention_fwd lse", &lse, tol);
    buf2 dout = rnd(n * FC, -1, 1), dqkv = rnd(n * 3 * FC, -1, 1);
    cpu->ops->attention_bwd(cpu, dqkv.c, scr.c, dout.c, qkv.c, lse.c, out.c, FB, FT, FC, FNH);
    gpu->ops->attention_bwd(gpu, dqkv.g, scr.g, dout.g, qkv.g, lse.g, out.g, FB, FT, FC, FNH);
    cmp("flash attention_bwd dqkv (+=)", &dqkv, tol);
    drop(&qkv), drop(&out), drop(&lse), drop(&scr), drop(&dout), drop(&dqkv);
}
#endif

static void test_pointwise(void)
{
    size_t n = 100003;
    buf2 x = rnd(n, -30, 30), x2 = rnd(n, -3, 3), y = rnd(n, -1, 1), g = rnd(n, -1, 1);
    buf2 dx = rnd(n, -1, 1);
    cpu->ops->gelu_fwd(cpu, y.c, x.c, n);
    gpu->ops->gelu_fwd(gpu, y.g, x.g, n);
    cmp("gelu_fwd (|x| < 30)", &y, TOL);
    cpu->ops->gelu_fwd(cpu, y.c, x2.c, n);
    gpu->ops->gelu_fwd(gpu, y.g, x2.g, n);
    cmp("gelu_fwd (|x| < 3)", &y, TOL);
    cpu->ops->gelu_bwd(cpu, dx.c, x2.c, g.c, n);
    gpu->ops->gelu_bwd(gpu, dx.g, x2.g, g.g, n);
    cmp("gelu_bwd dinp (+=)", &dx, TOL);
    cpu->ops->gelu_bwd(cpu, dx.c, x.c, g.c, n);
    gpu->ops->gelu_bwd(gpu, dx.g, x.g, g.g, n);
    cmp("gelu_bwd dinp (|x| < 30)", &dx, TOL);
    cpu->ops->add(cpu, y.c, x.c, x2.c, n);
    gpu->ops->add(gpu, y.g, x.g, x2.g, n);
    cmp("add", &y, TOL);
    drop(&x), drop(&x2), drop(&y), drop(&g), drop(&dx);
}

static void test_xent(void)
{
    for (int want = 0; want <= 1; want++) {
        buf2 logits = rnd((size_t)N * VP, -4, 4); /* padded columns hold garbage */
        buf2 losses = rnd(N, 0, 1), tgt = rnd_int(N, V), wt = rnd(N, 0, 0.1f);
        double lc = -1, lg = -2;
        cpu->ops->xent(cpu, logits.c, losses.c, &lc, tgt.c, wt.c, N, V, VP, want);
        gpu->ops->xent(gpu, logits.g, losses.g, &lg, tgt.g, wt.g, N, V, VP, want);
        cmp(want ? "xent losses (grad)" : "xent losses", &losses, TOL);
        cmp_scalar(want ? "xent loss_sum (grad)" : "xent loss_sum", lc, lg, TOL);
        cmp(want ? "xent dlogits (padded = 0)" : "xent logits untouched", &logits, TOL);
        drop(&logits), drop(&losses), drop(&tgt), drop(&wt);
    }
}

static void test_adamw_sumsq(void)
{
    size_t n = 300007;
    buf2 p = rnd(n, -1, 1), g = rnd(n, -1, 1), m = rnd(n, -0.1f, 0.1f), v = rnd(n, 0, 0.01f);
    for (int t = 1; t <= 3; t++) {
        cpu->ops->adamw(cpu, p.c, g.c, m.c, v.c, n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, t);
        gpu->ops->adamw(gpu, p.g, g.g, m.g, v.g, n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, t);
    }
    cmp("adamw params (3 steps)", &p, TOL);
    cmp("adamw m", &m, TOL);
    cmp("adamw v", &v, TOL);
    double sc = cpu->ops->sumsq(cpu, g.c, n), sg = gpu->ops->sumsq(gpu, g.g, n);
    check_dev("sumsq");
    cmp_scalar("sumsq (double)", sc, sg, 1e-9);
    drop(&p), drop(&g), drop(&m), drop(&v);
}

static void test_copies(void)
{
    size_t n = 4099;
    buf2 a = rnd(n, -1, 1), b = rnd(n, -1, 1);
    cpu->ops->copy(cpu, b.c, a.c, n * sizeof(float));
    gpu->ops->copy(gpu, b.g, a.g, n * sizeof(float));
    cmp("copy", &b, 1e-30);
    cpu->ops->zero(cpu, (float *)a.c + 7, 100 * sizeof(float));
    gpu->ops->zero(gpu, (float *)a.g + 7, 100 * sizeof(float));
    cmp("zero (part)", &a, 1e-30);
    drop(&a), drop(&b);
}

/* ---- the allocator */

static void test_alloc(const kern_device_info *gi)
{
    kern_device_info cap = *gi;
    cap.mem_total = 8ull << 20; /* budget cap */
    kern_device *d = NULL;
    acc_err err = {0};
    if (kern_cuda_open(&cap, 1, &d, &err) != 0) {
        fprintf(stderr, "FAIL: kern_cuda_open (capped): %s\n", err.msg);
        failures++;
        return;
    }
    expect(strcmp(d->ops->backend, "cuda") == 0, "backend name", d->ops->backend);
    expect(d->budget == (8ull << 20), "budget is the cap", "");
    void *a = NULL, *b = NULL, *c = NULL;
    expect(d->ops->alloc(d, 4u << 20, &a, &err) == 0 && a != NULL, "alloc 4 MiB", err.msg);
    expect(d->in_use == (4u << 20) && d->peak == (4u << 20), "in_use/peak after 4 MiB", "");
    expect(d->ops->alloc(d, 1000, &b, &err) == 0, "alloc 1000 B", err.msg);
    expect(d->in_use == (4u << 20) + 1000, "in_use counts bytes asked", "");
    /* what the planner adds for CUDA devices (kern_cuda_alloc_size): the blocks the cache holds */
    expect(kern_cuda_reserved(d) == kern_cuda_alloc_size(4u << 20) + kern_cuda_alloc_size(1000) &&
               kern_cuda_alloc_size(1000) == 1024,
           "reserved = the planner's rounding of each allocation", "");
    acc_err_clear(&err);
    int rc = d->ops->alloc(d, 5u << 20, &c, &err);
    printf("over budget: rc %d, %s\n", rc, err.msg);
    expect(rc == ACC_EOOM && c == NULL, "over budget is ACC_EOOM", err.msg);
    expect(strstr(err.msg, "5242880") != NULL && strstr(err.msg, "free") != NULL,
           "OOM message names bytes asked and free", err.msg);
    expect(d->in_use == (4u << 20) + 1000, "failed alloc leaves in_use", "");
    void *old = a;
    d->ops->free(d, a);
    expect(d->in_use == 1000, "free returns bytes", "");
    expect(d->peak == (4u << 20) + 1000, "peak kept after free", "");
    kern_device_reset_peak(d);
    expect(d->peak == 1000, "reset_peak", "");
    unsigned long long res = kern_cuda_reserved(d);
    expect(d->ops->alloc(d, (4u << 20) - 100, &a, &err) == 0, "realloc", err.msg);
    expect(a == old && kern_cuda_reserved(d) == res, "cached block reused, nothing new reserved",
           "");
    /* the block works: write, read back */
    float h[4] = {1, 2, 3, 4}, r[4] = {0};
    d->ops->upload(d, a, h, sizeof h);
    d->ops->download(d, r, a, sizeof r);
    expect(memcmp(h, r, sizeof h) == 0, "round trip through a cached block", "");
    d->ops->free(d, a);
    d->ops->free(d, b);
    expect(d->in_use == 0, "all freed", "");
    expect(kern_cuda_last_error(d, &err) == 0, "no sticky error", err.msg);
    kern_device_close(d);

    /* uncapped: the budget is the free memory minus a margin; asking more is OOM */
    kern_device_info full = *gi;
    full.mem_total = 0;
    if (kern_cuda_open(&full, 1, &d, &err) != 0) {
        fprintf(stderr, "FAIL: kern_cuda_open: %s\n", err.msg);
        failures++;
        return;
    }
    printf("uncapped budget %llu of %llu bytes\n", (unsigned long long)d->budget,
           (unsigned long long)gi->mem_total);
    expect(d->budget > 0 && d->budget < gi->mem_total, "budget below the card's memory", "");
    expect(d->budget + kern_cuda_runtime_bytes() <= gi->mem_total,
           "the planner's runtime bytes are left free (budget + runtime <= the card)", "");
    acc_err_clear(&err);
    rc = d->ops->alloc(d, (size_t)d->budget + (1u << 20), &c, &err);
    expect(rc == ACC_EOOM, "beyond free memory is ACC_EOOM", err.msg);
    kern_device_close(d);
}

int main(void)
{
    kern_device_info g[KERN_MAX_DEVICES];
    acc_err err = {0};
    int rc = gpu_start_pair(g, &cpu, &gpu);
    if (rc != 0)
        return rc;
    printf("GPU %s (sm_%d%d), budget %llu bytes\n", g[0].name, g[0].cc_major, g[0].cc_minor,
           (unsigned long long)gpu->budget);
#ifdef GPU_TEST_FLASH_ONLY
    /* EXPERIMENTAL, its own program (gpu_cuda_flash) so that a fault here
     * cannot take the other kernels' verdicts with it: the tiled bf16
     * tensor-core attention against the CPU's fp32 attention */
    if (kern_cuda_set_bf16(gpu, 1, &err) != 0 || kern_cuda_set_flash(gpu, 1, &err) != 0) {
        fprintf(stderr, "FAIL: bf16 + flash: %s\n", err.msg);
        return 1;
    }
    printf("-- tiled bf16 attention, kern_cuda_flash (tolerance 1e-2)\n");
    test_flash_attention(100, 1e-2);
    test_flash_attention(192, 1e-2);
    check_dev("flash attention");
    kern_device_close(gpu);
    kern_device_close(cpu);
    printf(failures ? "%d check(s) failed\n" : "flash attention checks passed\n", failures);
    return failures ? 1 : 0;
#endif
    test_encoder();
    test_layernorm();
    test_matmul(TOL);
    /* operands off the 16-byte grid: cuBLASLt with its alignment hint, or
     * cublasSgemm, and the bias outside the epilogue */
    g_off = 1;
    printf("-- operands offset by one float\n");
    test_matmul(TOL);
    g_off = 3;
    test_attention(TOL);
    g_off = 0;
    test_attention(TOL);
    test_pointwise();
    test_xent();
    test_adamw_sumsq();
    test_copies();
    check_dev("all kernels");
    expect(gpu->in_use == 0, "every test buffer freed on the GPU", "");
    /* TF32 tensor cores (benchmarks only): works, within TF32's precision */
    if (kern_cuda_set_tf32(gpu, 1, &err) != 0) {
        fprintf(stderr, "FAIL: tf32: %s\n", err.msg);
        failures++;
    } else {
        printf("-- TF32 matmuls (tolerance 1e-2)\n");
        test_matmul(1e-2);
        kern_cuda_set_tf32(gpu, 0, &err);
    }
    /* bf16 linear layers: operands rounded to bf16, fp32 accumulation */
    if (kern_cuda_set_bf16(gpu, 1, &err) != 0) {
        fprintf(stderr, "FAIL: bf16: %s\n", err.msg);
        failures++;
    } else {
        printf("-- bf16 matmuls (tolerance 1e-2)\n");
        test_matmul_offsets(1e-2);
        /* bf16 mode runs attention's products on TF32 tensor cores */
        printf("-- attention in bf16 mode: TF32 products (tolerance 1e-2)\n");
        test_attention(1e-2);
        check_dev("bf16");
        /* against the CPU backend in bf16 (the reference semantics: the
         * same rounded operands, fp32 accumulation), through set_precision */
        if (cpu->ops->set_precision(cpu, 1, &err) != 0 ||
            gpu->ops->set_precision(gpu, 1, &err) != 0) {
            fprintf(stderr, "FAIL: set_precision bf16: %s\n", err.msg);
            failures++;
        } else {
            printf("-- bf16 matmuls vs the CPU's bf16 (tolerance 1e-4)\n");
            test_matmul_offsets(1e-4);
            /* cuBLAS's own rounding of the fp32 operands (FAST_16BF) is
             * the CPU's round-to-nearest-even: the same products */
            printf("-- bf16 matmuls, LLaMA-like shapes, vs the CPU's bf16 (tolerance 1e-4)\n");
            test_matmul_llama(1e-4);
            check_dev("bf16 vs CPU bf16");
            expect(cpu->ops->set_precision(cpu, 0, &err) == 0, "CPU bf16 off", err.msg);
        }
        expect(kern_cuda_set_bf16(gpu, 0, &err) == 0, "bf16 off", err.msg);
        expect(gpu->in_use == 0, "every bf16 test buffer freed on the GPU", "");
    }
    kern_device_close(gpu);
    /* the cublasSgemm path alone (cuBLASLt off) */
    setenv("ACCUMD_CUDA_NO_LT", "1", 1);
    if (kern_cuda_open(&g[0], 1, &gpu, &err) != 0) {
        fprintf(stderr, "open: %s\n", err.msg);
        return 1;
    }
    printf("-- cuBLAS sgemm only (ACCUMD_CUDA_NO_LT=1)\n");
    test_matmul_offsets(TOL);
    unsetenv("ACCUMD_CUDA_NO_LT");
    check_dev("sgemm path");
    kern_device_close(gpu);
    kern_device_close(cpu);
    test_alloc(&g[0]);
    return gpu_verdict(failures, "all CUDA kernel checks passed");
}
