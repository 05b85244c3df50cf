/* kern_selftest: see kern_selftest.h. Each op runs on both devices on the
 * same inputs (uploaded from one host copy); outputs are downloaded and
 * compared. Backward ops take each device's own forward results. */
#include "kern_selftest.h"

#include "kern_rope.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* shapes: small, but past a warp / a tile in every dimension */
enum { B = 2, T = 37, C = 48, NH = 3, OC = 80, V = 101, VP = 128 };
#define N (B * T)

typedef struct st_ctx {
    kern_device *dev, *ref;
    double tol;
    uint64_t rng;
    int rc;          /* first failure (0 = none so far) */
    acc_err *err;
} st_ctx;

/* one buffer on both devices */
typedef struct st_buf {
    void *d, *r;
    size_t bytes;
} st_buf;

static float uniform(st_ctx *c, float lo, float hi)
{
    c->rng = c->rng * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * (float)((c->rng >> 40) * (1.0 / 16777216.0));
}

static void fail_alloc(st_ctx *c, int rc, const acc_err *e)
{
    if (c->rc == 0) {
        c->rc = rc;
        *c->err = *e;
    }
}

/* n floats in [lo, hi) (or ints in [0, imax) when imax > 0) on both */
static st_buf st_make(st_ctx *c, size_t n, float lo, float hi, int imax)
{
    st_buf b = {NULL, NULL, n * sizeof(float)};
    void *h = malloc(b.bytes);
    acc_err e = {0};
    int rc;
    if (h == NULL) {
        fail_alloc(c, acc_err_set(&e, ACC_ENOMEM, "", "self-test: out of host memory"), &e);
        return b;
    }
    for (size_t i = 0; i < n; i++) {
        if (imax > 0)
            ((int *)h)[i] = (int)uniform(c, 0.0f, (float)imax) % imax;
        else
            ((float *)h)[i] = uniform(c, lo, hi);
    }
    if ((rc = c->dev->ops->alloc(c->dev, b.bytes, &b.d, &e)) != 0 ||
        (rc = c->ref->ops->alloc(c->ref, b.bytes, &b.r, &e)) != 0) {
        fail_alloc(c, rc, &e);
    } else {
        c->dev->ops->upload(c->dev, b.d, h, b.bytes);
        c->ref->ops->upload(c->ref, b.r, h, b.bytes);
    }
    free(h);
    return b;
}

static st_buf st_new(st_ctx *c, size_t n, float lo, float hi)
{
    return st_make(c, n, lo, hi, 0);
}

static st_buf st_ints(st_ctx *c, size_t n, int imax)
{
    return st_make(c, n, 0.0f, 0.0f, imax);
}

static void st_free(st_ctx *c, st_buf *b)
{
    if (b->d != NULL)
        c->dev->ops->free(c->dev, b->d);
    if (b->r != NULL)
        c->ref->ops->free(c->ref, b->r);
    b->d = b->r = NULL;
}

static int st_ready(const st_ctx *c, const st_buf *b)
{
    return c->rc == 0 && b->d != NULL && b->r != NULL;
}

/* max |dev - ref| / max |ref| over the buffer, as floats */
static void st_cmp(st_ctx *c, const char *what, const st_buf *b)
{
    if (!st_ready(c, b))
        return;
    size_t n = b->bytes / sizeof(float);
    float *hd = malloc(b->bytes), *hr = malloc(b->bytes);
    acc_err e = {0};
    if (hd == NULL || hr == NULL) {
        fail_alloc(c, acc_err_set(&e, ACC_ENOMEM, "", "self-test: out of host memory"), &e);
    } else {
        c->dev->ops->download(c->dev, hd, b->d, b->bytes);
        c->ref->ops->download(c->ref, hr, b->r, b->bytes);
        double md = 0.0, mr = 0.0;
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) {
            double dd = fabs((double)hd[i] - (double)hr[i]);
            if (!(dd <= md)) { /* also catches NaN */
                md = dd;
                bad = i;
            }
            mr = fmax(mr, fabs((double)hr[i]));
        }
        double rel = md / (mr > 0.0 ? mr : 1.0);
        if (!(rel <= c->tol))
            c->rc = acc_err_set(c->err, ACC_EDEVICE, "devices",
                                "self-test of %s (%s) against the CPU: %s differs by %.3g "
                                "(relative, tolerance %.0e; [%zu] = %.9g, CPU %.9g)",
                                c->dev->info.name, c->dev->ops->backend, what, rel, c->tol, bad,
                                (double)hd[bad], (double)hr[bad]);
    }
    free(hd);
    free(hr);
}

static void st_scalar(st_ctx *c, const char *what, double got, double want)
{
    double rel = fabs(got - want) / (fabs(want) > 0.0 ? fabs(want) : 1.0);
    if (c->rc == 0 && !(rel <= c->tol))
        c->rc = acc_err_set(c->err, ACC_EDEVICE, "devices",
                            "self-test of %s (%s) against the CPU: %s is %.9g, CPU %.9g",
                            c->dev->info.name, c->dev->ops->backend, what, got, want);
}

/* run the same call on both devices: X(dev, buffer side) */
#define BOTH(c, call_d, call_r)         \
    do {                                \
        if ((c)->rc == 0) {             \
            kern_device *D = (c)->dev;  \
            call_d;                     \
            D = (c)->ref;               \
            call_r;                     \
        }                               \
    } while (0)
#define F(b, side) ((float *)(b).side)
#define I(b, side) ((int *)(b).side)

/* n random finite 16-bit patterns (bf16, or binary16 with f16) on both,
 * subnormals and both signs included */
static st_buf st_halves(st_ctx *c, size_t n, int f16)
{
    st_buf b = {NULL, NULL, n * sizeof(uint16_t)};
    uint16_t *h = malloc(b.bytes);
    acc_err e = {0};
    int rc;
    if (h == NULL) {
        fail_alloc(c, acc_err_set(&e, ACC_ENOMEM, "", "self-test: out of host memory"), &e);
        return b;
    }
    for (size_t i = 0; i < n; i++) {
        uint16_t v = (uint16_t)uniform(c, 0.0f, 65536.0f);
        unsigned emask = f16 ? 0x7c00u : 0x7f80u; /* all-ones exponent: Inf / NaN */
        h[i] = (v & emask) == emask ? (uint16_t)(v & ~0x4000u) : v;
    }
    if ((rc = c->dev->ops->alloc(c->dev, b.bytes, &b.d, &e)) != 0 ||
        (rc = c->ref->ops->alloc(c->ref, b.bytes, &b.r, &e)) != 0) {
        fail_alloc(c, rc, &e);
    } else {
        c->dev->ops->upload(c->dev, b.d, h, b.bytes);
        c->ref->ops->upload(c->ref, b.r, h, b.bytes);
    }
    free(h);
    return b;
}

static void test_encoder_layernorm(st_ctx *c)
{
    st_buf tok = st_ints(c, N, V), wte = st_new(c, (size_t)VP * C, -1, 1);
    st_buf wpe = st_new(c, (size_t)T * C, -1, 1), out = st_new(c, (size_t)N * C, 0, 0);
    BOTH(c, D->ops->encoder_fwd(D, F(out, d), I(tok, d), F(wte, d), F(wpe, d), B, T, C),
         D->ops->encoder_fwd(D, F(out, r), I(tok, r), F(wte, r), F(wpe, r), B, T, C));
    st_cmp(c, "encoder_fwd", &out);
    st_buf dout = st_new(c, (size_t)N * C, -1, 1);
    BOTH(c, D->ops->encoder_bwd(D, F(wte, d), F(wpe, d), F(dout, d), I(tok, d), B, T, C),
         D->ops->encoder_bwd(D, F(wte, r), F(wpe, r), F(dout, r), I(tok, r), B, T, C));
    st_cmp(c, "encoder_bwd dwte", &wte);
    st_cmp(c, "encoder_bwd dwpe", &wpe);
    st_buf ln = st_new(c, (size_t)N * C, 0, 0), mean = st_new(c, N, 0, 0), rstd = st_new(c, N, 0, 0);
    st_buf w = st_new(c, C, 0.5f, 1.5f), bias = st_new(c, C, -0.5f, 0.5f);
    BOTH(c, D->ops->layernorm_fwd(D, F(ln, d), F(mean, d), F(rstd, d), F(out, d), F(w, d), F(bias, d), N, C),
         D->ops->layernorm_fwd(D, F(ln, r), F(mean, r), F(rstd, r), F(out, r), F(w, r), F(bias, r), N, C));
    st_cmp(c, "layernorm_fwd", &ln);
    st_cmp(c, "layernorm_fwd rstd", &rstd);
    st_buf dinp = st_new(c, (size_t)N * C, -1, 1), dw = st_new(c, C, -1, 1), db = st_new(c, C, -1, 1);
    BOTH(c, D->ops->layernorm_bwd(D, F(dinp, d), F(dw, d), F(db, d), F(dout, d), F(out, d), F(w, d), F(mean, d), F(rstd, d), N, C),
         D->ops->layernorm_bwd(D, F(dinp, r), F(dw, r), F(db, r), F(dout, r), F(out, r), F(w, r), F(mean, r), F(rstd, r), N, C));
    st_cmp(c, "layernorm_bwd dinp", &dinp);
    st_cmp(c, "layernorm_bwd dw", &dw);
    st_cmp(c, "layernorm_bwd db", &db);
    st_buf *all[] = {&tok, &wte, &wpe, &out, &dout, &ln, &mean, &rstd, &w, &bias, &dinp, &dw, &db};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        st_free(c, all[i]);
}

/* matmul_fwd (with bias) and matmul_bwd for n x k -> n x oc; `mode`
 * names the precision in the messages */
static void matmul_shape(st_ctx *c, const char *mode, int n, int k, int oc)
{
    char name[4][64];
    snprintf(name[0], sizeof name[0], "matmul_fwd%s", mode);
    snprintf(name[1], sizeof name[1], "matmul_bwd dinp%s", mode);
    snprintf(name[2], sizeof name[2], "matmul_bwd dw%s", mode);
    snprintf(name[3], sizeof name[3], "matmul_bwd dbias%s", mode);
    st_buf inp = st_new(c, (size_t)n * k, -1, 1), w = st_new(c, (size_t)oc * k, -1, 1);
    st_buf bias = st_new(c, oc, -1, 1), out = st_new(c, (size_t)n * oc, 0, 0);
    BOTH(c, D->ops->matmul_fwd(D, F(out, d), F(inp, d), F(w, d), F(bias, d), n, k, oc),
         D->ops->matmul_fwd(D, F(out, r), F(inp, r), F(w, r), F(bias, r), n, k, oc));
    st_cmp(c, name[0], &out);
    st_buf dinp = st_new(c, (size_t)n * k, -1, 1), dw = st_new(c, (size_t)oc * k, -1, 1);
    st_buf db = st_new(c, oc, -1, 1);
    BOTH(c, D->ops->matmul_bwd(D, F(dinp, d), F(dw, d), F(db, d), F(out, d), F(inp, d), F(w, d), n, k, oc),
         D->ops->matmul_bwd(D, F(dinp, r), F(dw, r), F(db, r), F(out, r), F(inp, r), F(w, r), n, k, oc));
    st_cmp(c, name[1], &dinp);
    st_cmp(c, name[2], &dw);
    st_cmp(c, name[3], &db);
    st_buf *all[] = {&inp, &w, &bias, &out, &dinp, &dw, &db};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        st_free(c, all[i]);
}

static void test_matmul(st_ctx *c)
{
    matmul_shape(c, "", N, C, OC);
}

/* set_precision on both devices; an error is the self-test's failure */
static void st_precision(st_ctx *c, int bf16)
{
    acc_err e = {0};
    int rc = c->dev->ops->set_precision(c->dev, bf16, &e);
    if (rc == 0)
        rc = c->ref->ops->set_precision(c->ref, bf16, &e);
    if (rc != 0)
        fail_alloc(c, rc, &e);
}

/* bf16 mode, as a job's "precision": "bf16" runs the linear layers: the
 * device's products (on CUDA: cuBLAS's own down-conversion of the fp32
 * operands) against the CPU's (operands rounded to bf16, fp32
 * accumulation), within KERN_SELFTEST_BF16_TOL; the usual shapes and an
 * odd one (no dimension a multiple of 2, so no operand row is aligned
 * past 4 bytes). Both devices are back in fp32 after. */
static void test_matmul_bf16(st_ctx *c)
{
    if (c->rc != 0)
        return;
    double tol = c->tol;
    c->tol = fmax(tol, KERN_SELFTEST_BF16_TOL);
    st_precision(c, 1);
    matmul_shape(c, " (bf16)", N, C, OC);
    matmul_shape(c, " (bf16, odd shape)", 37, 45, 101);
    c->tol = tol;
    if (c->rc == 0)
        st_precision(c, 0);
    else { /* keep the first failure; still leave both in fp32 */
        acc_err e = {0};
        (void)c->dev->ops->set_precision(c->dev, 0, &e);
        (void)c->ref->ops->set_precision(c->ref, 0, &e);
    }
}

static void test_attention(st_ctx *c)
{
    st_buf qkv = st_new(c, (size_t)N * 3 * C, -2, 2), out = st_new(c, (size_t)N * C, 0, 0);
    st_buf lse = st_new(c, (size_t)B * NH * T, 0, 0);
    st_buf scr = st_new(c, KERN_ATT_SCRATCH(T, NH), -1, 1);
    BOTH(c, D->ops->attention_fwd(D, F(out, d), F(lse, d), F(scr, d), F(qkv, d), B, T, C, NH),
         D->ops->attention_fwd(D, F(out, r), F(lse, r), F(scr, r), F(qkv, r), B, T, C, NH));
    st_cmp(c, "attention_fwd", &out);
    st_cmp(c, "attention_fwd lse", &lse);
    st_buf dout = st_new(c, (size_t)N * C, -1, 1), dqkv = st_new(c, (size_t)N * 3 * C, -1, 1);
    BOTH(c, D->ops->attention_bwd(D, F(dqkv, d), F(scr, d), F(dout, d), F(qkv, d), F(lse, d), F(out, d), B, T, C, NH),
         D->ops->attention_bwd(D, F(dqkv, r), F(scr, r), F(dout, r), F(qkv, r), F(lse, r), F(out, r), B, T, C, NH));
    st_cmp(c, "attention_bwd", &dqkv);
    st_buf *all[] = {&qkv, &out, &lse, &scr, &dout, &dqkv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        st_free(c, all[i]);
}

static void test_pointwise(st_ctx *c)
{
    size_t n = (size_t)N * 4 * C;
    st_buf x = st_new(c, n, -6, 6), y = st_new(c, n, 0, 0), g = st_new(c, n, -1, 1);
    st_buf dx = st_new(c, n, -1, 1);
    BOTH(c, D->ops->gelu_fwd(D, F(y, d), F(x, d), n), D->ops->gelu_fwd(D, F(y, r), F(x, r), n));
    st_cmp(c, "gelu_fwd", &y);
    BOTH(c, D->ops->gelu_bwd(D, F(dx, d), F(x, d), F(g, d), n),
         D->ops->gelu_bwd(D, F(dx, r), F(x, r), F(g, r), n));
    st_cmp(c, "gelu_bwd", &dx);
    BOTH(c, D->ops->add(D, F(y, d), F(x, d), F(g, d), n), D->ops->add(D, F(y, r), F(x, r), F(g, r), n));
    st_cmp(c, "add", &y);
    BOTH(c, D->ops->copy(D, F(dx, d), F(y, d), n * sizeof(float)),
         D->ops->copy(D, F(dx, r), F(y, r), n * sizeof(float)));
    st_cmp(c, "copy", &dx);
    BOTH(c, D->ops->zero(D, F(dx, d), n / 2 * sizeof(float)),
         D->ops->zero(D, F(dx, r), n / 2 * sizeof(float)));
    st_cmp(c, "zero", &dx);
    double sd = 0.0, sr = 0.0;
    BOTH(c, sd = D->ops->sumsq(D, F(x, d), n), sr = D->ops->sumsq(D, F(x, r), n));
    st_scalar(c, "sumsq", sd, sr);
    st_buf m = st_new(c, n, -0.1f, 0.1f), v = st_new(c, n, 0.0f, 0.01f); /* v >= 0 */
    BOTH(c, D->ops->adamw(D, F(x, d), F(g, d), F(m, d), F(v, d), n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 3),
         D->ops->adamw(D, F(x, r), F(g, r), F(m, r), F(v, r), n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 3));
    st_cmp(c, "adamw params", &x);
    st_cmp(c, "adamw m", &m);
    st_cmp(c, "adamw v", &v);
    st_free(c, &m);
    st_free(c, &v);
    st_buf *all[] = {&x, &y, &g, &dx};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        st_free(c, all[i]);
}

static void test_xent(st_ctx *c)
{
    st_buf logits = st_new(c, (size_t)N * VP, -4, 4), losses = st_new(c, N, 0, 0);
    st_buf tgt = st_ints(c, N, V), w = st_new(c, N, 0.0f, 1.0f / N);
    double ld = 0.0, lr = 0.0;
    BOTH(c, D->ops->xent(D, F(logits, d), F(losses, d), &ld, I(tgt, d), F(w, d), N, V, VP, 1),
         D->ops->xent(D, F(logits, r), F(losses, r), &lr, I(tgt, r), F(w, r), N, V, VP, 1));
    st_cmp(c, "xent losses", &losses);
    st_cmp(c, "xent dlogits", &logits);
    st_scalar(c, "xent loss sum", ld, lr);
    st_buf *all[] = {&logits, &losses, &tgt, &w};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        st_free(c, all[i]);
}

/* ---- the LLaMA family's ops: past a warp in the head size and the rows,
 * GQA with two query heads per key/value head, llama3 rotary tables with
 * positions that restart (packed sequences) */
enum { LNH = 4, LNKV = 2, LHS = 34, LI = 80, LP = T + 8 };
#define LQ ((size_t)N * LNH * LHS)
#define LK ((size_t)N * LNKV * LHS)

/* the rotary tables and a positions array, uploaded to both */
static void st_rope_inputs(st_ctx *c, st_buf *ct, st_buf *sn, st_buf *pos)
{
    *ct = st_new(c, (size_t)LP * LHS / 2, 0, 0);
    *sn = st_new(c, (size_t)LP * LHS / 2, 0, 0);
    *pos = st_ints(c, N, 1);
    float *hc = malloc(ct->bytes), *hs = malloc(sn->bytes);
    int hp[N];
    acc_err e = {0};
    kern_rope_cfg cfg = {.theta = 500000.0, .type = KERN_ROPE_LLAMA3, .factor = 8.0,
                         .low_freq_factor = 1.0, .high_freq_factor = 4.0,
                         .original_max_pos = 64};
    int rc = hc == NULL || hs == NULL
                 ? acc_err_set(&e, ACC_ENOMEM, "", "self-test: out of host memory")
                 : kern_rope_table(&cfg, LP, LHS, hc, hs, &e);
    if (rc != 0) {
        fail_alloc(c, rc, &e);
    } else if (st_ready(c, ct) && st_ready(c, sn) && st_ready(c, pos)) {
        for (int n = 0; n < N; n++)
            hp[n] = n % T < T / 2 ? n % T : n % T - T / 2 + 5; /* restarts at 5 */
        c->dev->ops->upload(c->dev, ct->d, hc, ct->bytes);
        c->ref->ops->upload(c->ref, ct->r, hc, ct->bytes);
        c->dev->ops->upload(c->dev, sn->d, hs, sn->bytes);
        c->ref->ops->upload(c->ref, sn->r, hs, sn->bytes);
        c->dev->ops->upload(c->dev, pos->d, hp, sizeof hp);
        c->ref->ops->upload(c->ref, pos->r, hp, sizeof hp);
    }
    free(hc);
    free(hs);
}

static void test_llama_norm_mlp(st_ctx *c)
{
    st_buf tok = st_ints(c, N, V), wte = st_new(c, (size_t)VP * C, -1, 1);
    st_buf x = st_new(c, (size_t)N * C, 0, 0);
    BOTH(c, D->ops->embed_fwd(D, F(x, d), I(tok, d), F(wte, d), N, C),
         D->ops->embed_fwd(D, F(x, r), I(tok, r), F(wte, r), N, C));
    st_cmp(c, "embed_fwd", &x);
    st_buf dx = st_new(c, (size_t)N * C, -1, 1);
    BOTH(c, D->ops->embed_bwd(D, F(wte, d), F(dx, d), I(tok, d), N, C),
         D->ops->embed_bwd(D, F(wte, r), F(dx, r), I(tok, r), N, C));
    st_cmp(c, "embed_bwd dwte", &wte);
    st_buf out = st_new(c, (size_t)N * C, 0, 0), rstd = st_new(c, N, 0, 0);
    st_buf w = st_new(c, C, 0.5f, 1.5f), dw = st_new(c, C, -1, 1);
    st_buf dout = st_new(c, (size_t)N * C, -1, 1);
    BOTH(c, D->ops->rmsnorm_fwd(D, F(out, d), F(rstd, d), F(x, d), F(w, d), 1e-6f, N, C),
         D->ops->rmsnorm_fwd(D, F(out, r), F(rstd, r), F(x, r), F(w, r), 1e-6f, N, C));
    st_cmp(c, "rmsnorm_fwd", &out);
    st_cmp(c, "rmsnorm_fwd rstd", &rstd);
    BOTH(c, D->ops->rmsnorm_bwd(D, F(dx, d), F(dw, d), F(dout, d), F(x, d), F(w, d), F(rstd, d), N, C),
         D->ops->rmsnorm_bwd(D, F(dx, r), F(dw, r), F(dout, r), F(x, r), F(w, r), F(rstd, r), N, C));
    st_cmp(c, "rmsnorm_bwd dinp", &dx);
    st_cmp(c, "rmsnorm_bwd dw", &dw);
    size_t n = (size_t)N * LI;
    st_buf gate = st_new(c, n, -6, 6), up = st_new(c, n, -2, 2), h = st_new(c, n, 0, 0);
    st_buf dh = st_new(c, n, -1, 1), dgate = st_new(c, n, -1, 1), dup = st_new(c, n, -1, 1);
    BOTH(c, D->ops->swiglu_fwd(D, F(h, d), F(gate, d), F(up, d), n),
         D->ops->swiglu_fwd(D, F(h, r), F(gate, r), F(up, r), n));
    st_cmp(c, "swiglu_fwd", &h);
    BOTH(c, D->ops->swiglu_bwd(D, F(dgate, d), F(dup, d), F(dh, d), F(gate, d), F(up, d), n),
         D->ops->swiglu_bwd(D, F(dgate, r), F(dup, r), F(dh, r), F(gate, r), F(up, r), n));
    st_cmp(c, "swiglu_bwd dgate", &dgate);
    st_cmp(c, "swiglu_bwd dup", &dup);
    BOTH(c, D->ops->scale(D, F(h, d), 0.37f, n), D->ops->scale(D, F(h, r), 0.37f, n));
    st_cmp(c, "scale", &h);
    for (int f16 = 0; f16 <= 1; f16++) {
        st_buf w16 = st_halves(c, n, f16);
        BOTH(c, D->ops->widen16(D, F(h, d), (const uint16_t *)w16.d, n, f16),
             D->ops->widen16(D, F(h, r), (const uint16_t *)w16.r, n, f16));
        st_cmp(c, f16 ? "widen16 (f16)" : "widen16 (bf16)", &h);
        st_free(c, &w16);
    }
    if (c->dev->ops->narrow_bf16 != NULL) { /* rounded to bf16 and widened back: the same bits */
        st_buf h16 = st_new(c, (n + 1) / 2, 0, 0), back = st_new(c, n, 0, 0);
        BOTH(c, D->ops->narrow_bf16(D, (uint16_t *)F(h16, d), F(gate, d), n),
             D->ops->narrow_bf16(D, (uint16_t *)F(h16, r), F(gate, r), n));
        BOTH(c, D->ops->widen16(D, F(back, d), (const uint16_t *)F(h16, d), n, 0),
             D->ops->widen16(D, F(back, r), (const uint16_t *)F(h16, r), n, 0));
        st_cmp(c, "narrow_bf16", &back);
        st_free(c, &h16);
        st_free(c, &back);
    }
    st_buf *all[] = {&tok, &wte, &x, &dx, &out, &rstd, &w, &dw, &dout,
                     &gate, &up, &h, &dh, &dgate, &dup};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        st_free(c, all[i]);
}

static void test_llama_attention(st_ctx *c)
{
    st_buf ct, sn, pos;
    st_rope_inputs(c, &ct, &sn, &pos);
    st_buf q = st_new(c, LQ, -2, 2), k = st_new(c, LK, -2, 2), v = st_new(c, LK, -2, 2);
    /* q rotated in place at the given positions, k out of place at t */
    BOTH(c, D->ops->rope_fwd(D, F(q, d), F(q, d), F(ct, d), F(sn, d), I(pos, d), B, T, LNH, LHS),
         D->ops->rope_fwd(D, F(q, r), F(q, r), F(ct, r), F(sn, r), I(pos, r), B, T, LNH, LHS));
    st_cmp(c, "rope_fwd (positions)", &q);
    st_buf kr = st_new(c, LK, 0, 0);
    BOTH(c, D->ops->rope_fwd(D, F(kr, d), F(k, d), F(ct, d), F(sn, d), NULL, B, T, LNKV, LHS),
         D->ops->rope_fwd(D, F(kr, r), F(k, r), F(ct, r), F(sn, r), NULL, B, T, LNKV, LHS));
    st_cmp(c, "rope_fwd", &kr);
    st_buf out = st_new(c, LQ, 0, 0), lse = st_new(c, (size_t)B * LNH * T, 0, 0);
    st_buf scr = st_new(c, KERN_ATT_SCRATCH(T, LNH), -1, 1);
    BOTH(c, D->ops->gqa_attention_fwd(D, F(out, d), F(lse, d), F(scr, d), F(q, d), F(kr, d), F(v, d), B, T, LNH, LNKV, LHS),
         D->ops->gqa_attention_fwd(D, F(out, r), F(lse, r), F(scr, r), F(q, r), F(kr, r), F(v, r), B, T, LNH, LNKV, LHS));
    st_cmp(c, "gqa_attention_fwd", &out);
    st_cmp(c, "gqa_attention_fwd lse", &lse);
    st_buf dout = st_new(c, LQ, -1, 1), dq = st_new(c, LQ, -1, 1);
    st_buf dk = st_new(c, LK, -1, 1), dv = st_new(c, LK, -1, 1);
    BOTH(c, D->ops->gqa_attention_bwd(D, F(dq, d), F(dk, d), F(dv, d), F(scr, d), F(dout, d), F(q, d), F(kr, d), F(v, d), F(lse, d), F(out, d), B, T, LNH, LNKV, LHS),
         D->ops->gqa_attention_bwd(D, F(dq, r), F(dk, r), F(dv, r), F(scr, r), F(dout, r), F(q, r), F(kr, r), F(v, r), F(lse, r), F(out, r), B, T, LNH, LNKV, LHS));
    st_cmp(c, "gqa_attention_bwd dq", &dq);
    st_cmp(c, "gqa_attention_bwd dk", &dk);
    st_cmp(c, "gqa_attention_bwd dv", &dv);
    BOTH(c, D->ops->rope_bwd(D, F(dq, d), F(dq, d), F(ct, d), F(sn, d), I(pos, d), B, T, LNH, LHS),
         D->ops->rope_bwd(D, F(dq, r), F(dq, r), F(ct, r), F(sn, r), I(pos, r), B, T, LNH, LHS));
    st_cmp(c, "rope_bwd (positions, in place)", &dq);
    BOTH(c, D->ops->rope_bwd(D, F(k, d), F(dk, d), F(ct, d), F(sn, d), NULL, B, T, LNKV, LHS),
         D->ops->rope_bwd(D, F(k, r), F(dk, r), F(ct, r), F(sn, r), NULL, B, T, LNKV, LHS));
    st_cmp(c, "rope_bwd", &k);
    st_buf *all[] = {&ct, &sn, &pos, &q, &k, &v, &kr, &out, &lse, &scr, &dout, &dq, &dk, &dv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        st_free(c, all[i]);
}

/* Packed documents (data.packing): positions that restart at 0 at each
 * document boundary, attention within each document only. */
static void test_llama_packed_attention(st_ctx *c)
{
    st_buf pos = st_ints(c, N, 1);
    int hp[N];
    if (st_ready(c, &pos)) {
        for (int n = 0; n < N; n++) { /* documents of 3, 5 and the rest of each sequence */
            int t = n % T;
            hp[n] = t < 3 ? t : t < 8 ? t - 3 : t - 8;
        }
        c->dev->ops->upload(c->dev, pos.d, hp, sizeof hp);
        c->ref->ops->upload(c->ref, pos.r, hp, sizeof hp);
    }
    st_buf q = st_new(c, LQ, -2, 2), k = st_new(c, LK, -2, 2), v = st_new(c, LK, -2, 2);
    st_buf out = st_new(c, LQ, 0, 0), lse = st_new(c, (size_t)B * LNH * T, 0, 0);
    st_buf scr = st_new(c, KERN_ATT_SCRATCH(T, LNH), -1, 1);
    BOTH(c, D->ops->gqa_attention_pos_fwd(D, F(out, d), F(lse, d), F(scr, d), F(q, d), F(k, d), F(v, d), I(pos, d), B, T, LNH, LNKV, LHS),
         D->ops->gqa_attention_pos_fwd(D, F(out, r), F(lse, r), F(scr, r), F(q, r), F(k, r), F(v, r), I(pos, r), B, T, LNH, LNKV, LHS));
    st_cmp(c, "gqa_attention_pos_fwd", &out);
    st_cmp(c, "gqa_attention_pos_fwd lse", &lse);
    st_buf dout = st_new(c, LQ, -1, 1), dq = st_new(c, LQ, -1, 1);
    st_buf dk = st_new(c, LK, -1, 1), dv = st_new(c, LK, -1, 1);
    BOTH(c, D->ops->gqa_attention_pos_bwd(D, F(dq, d), F(dk, d), F(dv, d), F(scr, d), F(dout, d), F(q, d), F(k, d), F(v, d), F(lse, d), F(out, d), I(pos, d), B, T, LNH, LNKV, LHS),
         D->ops->gqa_attention_pos_bwd(D, F(dq, r), F(dk, r), F(dv, r), F(scr, r), F(dout, r), F(q, r), F(k, r), F(v, r), F(lse, r), F(out, r), I(pos, r), B, T, LNH, LNKV, LHS));
    st_cmp(c, "gqa_attention_pos_bwd dq", &dq);
    st_cmp(c, "gqa_attention_pos_bwd dk", &dk);
    st_cmp(c, "gqa_attention_pos_bwd dv", &dv);
    st_buf *all[] = {&pos, &q, &k, &v, &out, &lse, &scr, &dout, &dq, &dk, &dv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        st_free(c, all[i]);
}

/* A backend without the LLaMA ops (NULL entries) is tested without them:
 * kern_llama_ops_check tells the caller that needs them. */
static void test_llama(st_ctx *c)
{
    acc_err e = {0};
    if (kern_llama_ops_check(c->dev, &e) != 0)
        return;
    test_llama_norm_mlp(c);
    test_llama_attention(c);
    test_llama_packed_attention(c);
}

/* ---- Qwen3's and Gemma 2's ops: soft-capping with logits past the cap,
 * the tanh-GELU gate, RMSNorm with Gemma's offset (and per head, q/k norm's
 * rows), attention with a query scale, capped scores and a window shorter
 * than the sequences, over packed documents */
static void test_decoder_pointwise(st_ctx *c)
{
    size_t n = (size_t)N * LI;
    st_buf x = st_new(c, n, -60, 60), y = st_new(c, n, 0, 0), g = st_new(c, n, -1, 1);
    st_buf dx = st_new(c, n, 0, 0);
    BOTH(c, D->ops->softcap_fwd(D, F(y, d), F(x, d), 30.0f, n),
         D->ops->softcap_fwd(D, F(y, r), F(x, r), 30.0f, n));
    st_cmp(c, "softcap_fwd", &y);
    BOTH(c, D->ops->softcap_bwd(D, F(dx, d), F(g, d), F(x, d), 30.0f, n),
         D->ops->softcap_bwd(D, F(dx, r), F(g, r), F(x, r), 30.0f, n));
    st_cmp(c, "softcap_bwd", &dx);
    st_buf gate = st_new(c, n, -6, 6), up = st_new(c, n, -2, 2);
    st_buf dgate = st_new(c, n, -1, 1), dup = st_new(c, n, -1, 1);
    BOTH(c, D->ops->geglu_fwd(D, F(y, d), F(gate, d), F(up, d), n),
         D->ops->geglu_fwd(D, F(y, r), F(gate, r), F(up, r), n));
    st_cmp(c, "geglu_fwd", &y);
    BOTH(c, D->ops->geglu_bwd(D, F(dgate, d), F(dup, d), F(g, d), F(gate, d), F(up, d), n),
         D->ops->geglu_bwd(D, F(dgate, r), F(dup, r), F(g, r), F(gate, r), F(up, r), n));
    st_cmp(c, "geglu_bwd dgate", &dgate);
    st_cmp(c, "geglu_bwd dup", &dup);
    /* Gemma's 1 + w over C channels, then per head: N * LNH rows of LHS */
    const int rows[2] = {N, N * LNH}, cols[2] = {C, LHS};
    for (int i = 0; i < 2; i++) {
        size_t m = (size_t)rows[i] * cols[i];
        st_buf in = st_new(c, m, -2, 2), out = st_new(c, m, 0, 0), rstd = st_new(c, rows[i], 0, 0);
        st_buf w = st_new(c, cols[i], -0.5f, 0.5f), dw = st_new(c, cols[i], -1, 1);
        st_buf din = st_new(c, m, -1, 1), dout = st_new(c, m, -1, 1);
        float off = i == 0 ? 1.0f : 0.0f;
        BOTH(c, D->ops->rmsnorm_ofs_fwd(D, F(out, d), F(rstd, d), F(in, d), F(w, d), off, 1e-6f, rows[i], cols[i]),
             D->ops->rmsnorm_ofs_fwd(D, F(out, r), F(rstd, r), F(in, r), F(w, r), off, 1e-6f, rows[i], cols[i]));
        st_cmp(c, i == 0 ? "rmsnorm_ofs_fwd (1 + w)" : "rmsnorm_ofs_fwd (per head)", &out);
        BOTH(c, D->ops->rmsnorm_ofs_bwd(D, F(din, d), F(dw, d), F(dout, d), F(in, d), F(w, d), off, F(rstd, d), rows[i], cols[i]),
             D->ops->rmsnorm_ofs_bwd(D, F(din, r), F(dw, r), F(dout, r), F(in, r), F(w, r), off, F(rstd, r), rows[i], cols[i]));
        st_cmp(c, "rmsnorm_ofs_bwd dinp", &din);
        st_cmp(c, "rmsnorm_ofs_bwd dw", &dw);
        st_buf *all[] = {&in, &out, &rstd, &w, &dw, &din, &dout};
        for (size_t j = 0; j < sizeof all / sizeof *all; j++)
            st_free(c, all[j]);
    }
    st_buf *all[] = {&x, &y, &g, &dx, &gate, &up, &dgate, &dup};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        st_free(c, all[i]);
}

static void test_decoder_attention(st_ctx *c)
{
    st_buf pos = st_ints(c, N, 1);
    int hp[N];
    if (st_ready(c, &pos)) {
        for (int n = 0; n < N; n++) /* a document of 6, then one of the rest */
            hp[n] = n % T < 6 ? n % T : n % T - 6;
        c->dev->ops->upload(c->dev, pos.d, hp, sizeof hp);
        c->ref->ops->upload(c->ref, pos.r, hp, sizeof hp);
    }
    const kern_att_opts opts = {.scale = 0.21f, .softcap = 2.5f, .window = 7};
    st_buf q = st_new(c, LQ, -3, 3), k = st_new(c, LK, -3, 3), v = st_new(c, LK, -2, 2);
    st_buf out = st_new(c, LQ, 0, 0), lse = st_new(c, (size_t)B * LNH * T, 0, 0);
    st_buf scr = st_new(c, KERN_ATT_SCRATCH(T, LNH), -1, 1);
    BOTH(c, D->ops->gqa_attention_opt_fwd(D, F(out, d), F(lse, d), F(scr, d), F(q, d), F(k, d), F(v, d), I(pos, d), &opts, B, T, LNH, LNKV, LHS),
         D->ops->gqa_attention_opt_fwd(D, F(out, r), F(lse, r), F(scr, r), F(q, r), F(k, r), F(v, r), I(pos, r), &opts, B, T, LNH, LNKV, LHS));
    st_cmp(c, "gqa_attention_opt_fwd", &out);
    st_cmp(c, "gqa_attention_opt_fwd lse", &lse);
    st_buf dout = st_new(c, LQ, -1, 1), dq = st_new(c, LQ, -1, 1);
    st_buf dk = st_new(c, LK, -1, 1), dv = st_new(c, LK, -1, 1);
    BOTH(c, D->ops->gqa_attention_opt_bwd(D, F(dq, d), F(dk, d), F(dv, d), F(scr, d), F(dout, d), F(q, d), F(k, d), F(v, d), F(lse, d), F(out, d), I(pos, d), &opts, B, T, LNH, LNKV, LHS),
         D->ops->gqa_attention_opt_bwd(D, F(dq, r), F(dk, r), F(dv, r), F(scr, r), F(dout, r), F(q, r), F(k, r), F(v, r), F(lse, r), F(out, r), I(pos, r), &opts, B, T, LNH, LNKV, LHS));
    st_cmp(c, "gqa_attention_opt_bwd dq", &dq);
    st_cmp(c, "gqa_attention_opt_bwd dk", &dk);
    st_cmp(c, "gqa_attention_opt_bwd dv", &dv);
    st_buf *all[] = {&pos, &q, &k, &v, &out, &lse, &scr, &dout, &dq, &dk, &dv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        st_free(c, all[i]);
}

/* Like test_llama: a backend without these ops is tested without them
 * (kern_decoder_ops_check tells the caller that needs them). */
static void test_decoder(st_ctx *c)
{
    acc_err e = {0};
    if (kern_decoder_ops_check(c->dev, &e) != 0)
        return;
    test_decoder_pointwise(c);
    test_decoder_attention(c);
}

/* n random bytes on both devices */
static st_buf st_bytes(st_ctx *c, size_t n)
{
    st_buf b = {NULL, NULL, n};
    uint8_t *h = malloc(n);
    acc_err e = {0};
    int rc;
    if (h == NULL) {
        fail_alloc(c, acc_err_set(&e, ACC_ENOMEM, "", "self-test: out of host memory"), &e);
        return b;
    }
    for (size_t i = 0; i < n; i++)
        h[i] = (uint8_t)uniform(c, 0.0f, 256.0f);
    if ((rc = c->dev->ops->alloc(c->dev, n, &b.d, &e)) != 0 ||
        (rc = c->ref->ops->alloc(c->ref, n, &b.r, &e)) != 0) {
        fail_alloc(c, rc, &e);
    } else {
        c->dev->ops->upload(c->dev, b.d, h, n);
        c->ref->ops->upload(c->ref, b.r, h, n);
    }
    free(h);
    return b;
}

/* dequant_nf4 on random codes, with an fp32 absmax and
 * double quantized (past one nested block, an odd count); a backend
 * without the op is tested without it (the model refuses a 4-bit base on
 * it). */
static void test_nf4(st_ctx *c)
{
    if (c->dev->ops->dequant_nf4 == NULL)
        return;
    size_t n = 64 * 300 + 7, nb = (n + 63) / 64, nn = (nb + 255) / 256;
    st_buf codes = st_bytes(c, (n + 1) / 2), q = st_bytes(c, nb);
    st_buf map = st_new(c, 16, -1, 1), am = st_new(c, nb, 0, 2);
    st_buf nam = st_new(c, nn, 0, 1), nmap = st_new(c, 256, -1, 1);
    st_buf out = st_new(c, n, 0, 0);
    for (int nested = 0; nested <= 1; nested++) {
        kern_nf4 qd = {codes.d, F(map, d), nested ? NULL : F(am, d), q.d, F(nam, d), F(nmap, d), 0.37f};
        kern_nf4 qr = {codes.r, F(map, r), nested ? NULL : F(am, r), q.r, F(nam, r), F(nmap, r), 0.37f};
        BOTH(c, D->ops->dequant_nf4(D, F(out, d), &qd, n), D->ops->dequant_nf4(D, F(out, r), &qr, n));
        st_cmp(c, nested ? "dequant_nf4 (double quantization)" : "dequant_nf4", &out);
    }
    st_buf *all[] = {&codes, &q, &map, &am, &nam, &nmap, &out};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        st_free(c, all[i]);
}

/* Lean activations (issue 20): the tiled attention on the LLaMA shapes with
 * every option and packed documents, and on GPT-2's fused qkv; a backend
 * without it is tested without it (the model refuses lean_acts there). */
static void test_lean(st_ctx *c)
{
    if (c->dev->ops->attention_lean_fwd == NULL || c->dev->ops->attention_lean_bwd == NULL)
        return;
    st_buf pos = st_ints(c, N, 1);
    int hp[N];
    if (st_ready(c, &pos)) {
        for (int n = 0; n < N; n++) /* a document of 9, then one of the rest */
            hp[n] = n % T < 9 ? n % T : n % T - 9;
        c->dev->ops->upload(c->dev, pos.d, hp, sizeof hp);
        c->ref->ops->upload(c->ref, pos.r, hp, sizeof hp);
    }
    const kern_att_opts opts = {.scale = 0.19f, .softcap = 3.0f, .window = 11};
    int lq = LNH * LHS, lk = LNKV * LHS;
    st_buf q = st_new(c, LQ, -3, 3), k = st_new(c, LK, -3, 3), v = st_new(c, LK, -2, 2);
    st_buf out = st_new(c, LQ, 0, 0), lse = st_new(c, (size_t)B * LNH * T, 0, 0);
    st_buf scr = st_new(c, KERN_ATT_LEAN_SCRATCH(T, LNH), -1, 1);
    BOTH(c, D->ops->attention_lean_fwd(D, F(out, d), F(lse, d), F(scr, d), F(q, d), F(k, d), F(v, d), lq, lk, I(pos, d), &opts, B, T, LNH, LNKV, LHS),
         D->ops->attention_lean_fwd(D, F(out, r), F(lse, r), F(scr, r), F(q, r), F(k, r), F(v, r), lq, lk, I(pos, r), &opts, B, T, LNH, LNKV, LHS));
    st_cmp(c, "attention_lean_fwd", &out);
    st_cmp(c, "attention_lean_fwd lse", &lse);
    st_buf dout = st_new(c, LQ, -1, 1), dq = st_new(c, LQ, -1, 1);
    st_buf dk = st_new(c, LK, -1, 1), dv = st_new(c, LK, -1, 1);
    BOTH(c, D->ops->attention_lean_bwd(D, F(dq, d), F(dk, d), F(dv, d), F(scr, d), F(dout, d), F(q, d), F(k, d), F(v, d), F(lse, d), F(out, d), lq, lk, I(pos, d), &opts, B, T, LNH, LNKV, LHS),
         D->ops->attention_lean_bwd(D, F(dq, r), F(dk, r), F(dv, r), F(scr, r), F(dout, r), F(q, r), F(k, r), F(v, r), F(lse, r), F(out, r), lq, lk, I(pos, r), &opts, B, T, LNH, LNKV, LHS));
    st_cmp(c, "attention_lean_bwd dq", &dq);
    st_cmp(c, "attention_lean_bwd dk", &dk);
    st_cmp(c, "attention_lean_bwd dv", &dv);
    /* GPT-2's layout: q, k, v side by side in qkv[B,T,3C], no options */
    st_buf qkv = st_new(c, (size_t)N * 3 * C, -2, 2), o2 = st_new(c, (size_t)N * C, 0, 0);
    st_buf l2 = st_new(c, (size_t)B * NH * T, 0, 0), g2 = st_new(c, (size_t)N * C, -1, 1);
    st_buf dqkv = st_new(c, (size_t)N * 3 * C, -1, 1);
    st_buf s2 = st_new(c, KERN_ATT_LEAN_SCRATCH(T, NH), -1, 1);
    BOTH(c, D->ops->attention_lean_fwd(D, F(o2, d), F(l2, d), F(s2, d), F(qkv, d), F(qkv, d) + C, F(qkv, d) + 2 * C, 3 * C, 3 * C, NULL, NULL, B, T, NH, NH, C / NH),
         D->ops->attention_lean_fwd(D, F(o2, r), F(l2, r), F(s2, r), F(qkv, r), F(qkv, r) + C, F(qkv, r) + 2 * C, 3 * C, 3 * C, NULL, NULL, B, T, NH, NH, C / NH));
    st_cmp(c, "attention_lean_fwd (qkv)", &o2);
    BOTH(c, D->ops->attention_lean_bwd(D, F(dqkv, d), F(dqkv, d) + C, F(dqkv, d) + 2 * C, F(s2, d), F(g2, d), F(qkv, d), F(qkv, d) + C, F(qkv, d) + 2 * C, F(l2, d), F(o2, d), 3 * C, 3 * C, NULL, NULL, B, T, NH, NH, C / NH),
         D->ops->attention_lean_bwd(D, F(dqkv, r), F(dqkv, r) + C, F(dqkv, r) + 2 * C, F(s2, r), F(g2, r), F(qkv, r), F(qkv, r) + C, F(qkv, r) + 2 * C, F(l2, r), F(o2, r), 3 * C, 3 * C, NULL, NULL, B, T, NH, NH, C / NH));
    st_cmp(c, "attention_lean_bwd (dqkv)", &dqkv);
    st_buf *all[] = {&pos, &q, &k, &v, &out, &lse, &scr, &dout, &dq, &dk, &dv,
                     &qkv, &o2, &l2, &g2, &dqkv, &s2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        st_free(c, all[i]);
}

/* generation: the last 4 of T positions' queries
 * against a cache of T, with Gemma 2's options and without (a backend
 * without the op is tested without it: gen_ctx_new names it) */
static void test_generation(st_ctx *c)
{
    if (c->dev->ops->attention_cache_fwd == NULL)
        return;
    const int n = 4, p0 = T - n, ldq = 3 * LNH * LHS; /* q rows as wide as a fused qkv */
    const kern_att_opts opts = {.scale = 0.21f, .softcap = 2.5f, .window = 7};
    st_buf q = st_new(c, (size_t)n * ldq, -3, 3), out = st_new(c, (size_t)n * LNH * LHS, 0, 0);
    st_buf kc = st_new(c, (size_t)T * LNKV * LHS, -3, 3), vc = st_new(c, (size_t)T * LNKV * LHS, -2, 2);
    st_buf scr = st_new(c, KERN_ATT_CACHE_SCRATCH(n, T, LNH), -1, 1);
    for (int i = 0; i < 2; i++) {
        const kern_att_opts *o = i == 0 ? NULL : &opts;
        BOTH(c, D->ops->attention_cache_fwd(D, F(out, d), F(scr, d), F(q, d), ldq, F(kc, d), F(vc, d), o, p0, n, LNH, LNKV, LHS),
             D->ops->attention_cache_fwd(D, F(out, r), F(scr, r), F(q, r), ldq, F(kc, r), F(vc, r), o, p0, n, LNH, LNKV, LHS));
        st_cmp(c, i == 0 ? "attention_cache_fwd" : "attention_cache_fwd (options)", &out);
    }
    st_buf *all[] = {&q, &out, &kc, &vc, &scr};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        st_free(c, all[i]);
}

/* The same bytes on both devices' buffers (b->bytes each), else a failure
 * naming `what` and the first differing 16-bit word. */
static void st_same_bits(st_ctx *c, const char *what, const st_buf *b)
{
    if (!st_ready(c, b))
        return;
    uint16_t *hd = malloc(b->bytes), *hr = malloc(b->bytes);
    acc_err e = {0};
    if (hd == NULL || hr == NULL) {
        fail_alloc(c, acc_err_set(&e, ACC_ENOMEM, "", "self-test: out of host memory"), &e);
    } else {
        c->dev->ops->download(c->dev, hd, b->d, b->bytes);
        c->ref->ops->download(c->ref, hr, b->r, b->bytes);
        for (size_t i = 0; i < b->bytes / sizeof *hd; i++)
            if (hd[i] != hr[i]) {
                c->rc = acc_err_set(c->err, ACC_EDEVICE, "devices",
                                    "self-test of %s (%s) against the CPU: %s differs at [%zu]: "
                                    "0x%04x, CPU 0x%04x", c->dev->info.name, c->dev->ops->backend,
                                    what, i, hd[i], hr[i]);
                break;
            }
    }
    free(hd);
    free(hr);
}

/* bf16 activation storage: narrow_bf16 on random fp32 values of every
 * magnitude, exact ties (both parities), subnormals, values past bf16's
 * largest, +-Inf: the same bits on both (round to nearest, ties to even).
 * NaN is left out: both keep it a NaN, its payload may differ. */
static void test_narrow(st_ctx *c)
{
    if (c->dev->ops->narrow_bf16 == NULL)
        return;
    enum { NV = 4096 };
    float *h = malloc(NV * sizeof *h);
    acc_err e = {0};
    if (h == NULL) {
        fail_alloc(c, acc_err_set(&e, ACC_ENOMEM, "", "self-test: out of host memory"), &e);
        return;
    }
    for (size_t i = 0; i < NV; i++) {
        uint32_t u = (uint32_t)uniform(c, 0.0f, 65536.0f) << 16 | (uint32_t)uniform(c, 0.0f, 65536.0f);
        if (i % 4 == 1)
            u = (u & 0xffff0000u) | 0x8000u; /* a tie */
        if ((u & 0x7f800000u) == 0x7f800000u)
            u &= 0xff800000u; /* Inf, not NaN */
        memcpy(&h[i], &u, sizeof u);
    }
    h[0] = 3.40282347e38f;  /* rounds past bf16's largest: Inf */
    h[2] = 1e-40f;          /* subnormal */
    h[3] = -0.0f;
    st_buf x = {NULL, NULL, NV * sizeof(float)}, y = {NULL, NULL, NV * sizeof(uint16_t)};
    int rc;
    if ((rc = c->dev->ops->alloc(c->dev, x.bytes, &x.d, &e)) != 0 ||
        (rc = c->ref->ops->alloc(c->ref, x.bytes, &x.r, &e)) != 0 ||
        (rc = c->dev->ops->alloc(c->dev, y.bytes, &y.d, &e)) != 0 ||
        (rc = c->ref->ops->alloc(c->ref, y.bytes, &y.r, &e)) != 0) {
        fail_alloc(c, rc, &e);
    } else {
        c->dev->ops->upload(c->dev, x.d, h, x.bytes);
        c->ref->ops->upload(c->ref, x.r, h, x.bytes);
        BOTH(c, D->ops->narrow_bf16(D, (uint16_t *)y.d, F(x, d), NV),
             D->ops->narrow_bf16(D, (uint16_t *)y.r, F(x, r), NV));
        st_same_bits(c, "narrow_bf16", &y);
    }
    free(h);
    st_free(c, &x);
    st_free(c, &y);
}

/* host_register (the optimizer offload's pinned buffers): a registered
 * host buffer takes a download and gives an upload back, the same bytes
 * (a backend without the op has nothing to pin: skipped) */
static void test_host_register(st_ctx *c)
{
    if (c->dev->ops->host_register == NULL)
        return;
    const size_t n = 4099;
    st_buf a = st_new(c, n, -2, 2), b = st_new(c, n, 0, 0);
    float *h = malloc(n * sizeof(float));
    acc_err e = {0};
    int rc = h == NULL ? acc_err_set(&e, ACC_ENOMEM, "", "self-test: out of host memory") : 0;
    if (rc == 0 && st_ready(c, &a) && st_ready(c, &b)) {
        rc = c->dev->ops->host_register(c->dev, h, n * sizeof(float), &e);
        if (rc == 0) {
            c->dev->ops->download(c->dev, h, a.d, a.bytes);
            c->dev->ops->upload(c->dev, b.d, h, b.bytes);
            c->dev->ops->host_unregister(c->dev, h);
            c->ref->ops->copy(c->ref, b.r, a.r, a.bytes);
            st_cmp(c, "host_register (download, upload)", &b);
        }
    }
    if (rc != 0)
        fail_alloc(c, rc, &e);
    free(h);
    st_free(c, &a);
    st_free(c, &b);
}

int kern_selftest(kern_device *dev, kern_device *ref, double tol, acc_err *err)
{
    st_ctx c = {.dev = dev, .ref = ref, .tol = tol, .rng = 20261202, .err = err};
    test_encoder_layernorm(&c);
    test_matmul(&c);
    test_matmul_bf16(&c);
    test_attention(&c);
    test_pointwise(&c);
    test_xent(&c);
    test_llama(&c);
    test_decoder(&c);
    test_nf4(&c);
    test_lean(&c);
    test_generation(&c);
    test_narrow(&c);
    test_host_register(&c);
    acc_err e = {0};
    int rc = dev->ops->last_error(dev, &e); /* a fault wins: the numbers mean nothing then */
    if (rc != 0) {
        *err = e;
        return rc;
    }
    return c.rc;
}

int kern_selftest_device(const kern_device_info *info, acc_err *err)
{
    kern_device_info ci = {.kind = KERN_DEV_CPU, .index = 0, .mem_total = 0};
    snprintf(ci.name, sizeof ci.name, "cpu-reference");
    kern_device *dev = NULL, *ref = NULL;
    int rc = kern_device_open(info, 1, &dev, err);
    if (rc == 0)
        rc = kern_device_open(&ci, 1, &ref, err);
    if (rc == 0)
        rc = kern_selftest(dev, ref, KERN_SELFTEST_TOL, err);
    kern_device_close(ref);
    kern_device_close(dev);
    return rc;
}
