/* kern_selftest: see kern_selftest.h. Each op runs on both devices on the
 * same inputs (uploaded from one host copy); outputs are downloaded and
 * compared. Backward ops take each device's own forward results. */
#include "kern_selftest.h"

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

static void test_matmul(st_ctx *c)
{
    st_buf inp = st_new(c, (size_t)N * C, -1, 1), w = st_new(c, (size_t)OC * C, -1, 1);
    st_buf bias = st_new(c, OC, -1, 1), out = st_new(c, (size_t)N * OC, 0, 0);
    BOTH(c, D->ops->matmul_fwd(D, F(out, d), F(inp, d), F(w, d), F(bias, d), N, C, OC),
         D->ops->matmul_fwd(D, F(out, r), F(inp, r), F(w, r), F(bias, r), N, C, OC));
    st_cmp(c, "matmul_fwd", &out);
    st_buf dinp = st_new(c, (size_t)N * C, -1, 1), dw = st_new(c, (size_t)OC * C, -1, 1);
    st_buf db = st_new(c, OC, -1, 1);
    BOTH(c, D->ops->matmul_bwd(D, F(dinp, d), F(dw, d), F(db, d), F(out, d), F(inp, d), F(w, d), N, C, OC),
         D->ops->matmul_bwd(D, F(dinp, r), F(dw, r), F(db, r), F(out, r), F(inp, r), F(w, r), N, C, OC));
    st_cmp(c, "matmul_bwd dinp", &dinp);
    st_cmp(c, "matmul_bwd dw", &dw);
    st_cmp(c, "matmul_bwd dbias", &db);
    st_buf *all[] = {&inp, &w, &bias, &out, &dinp, &dw, &db};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        st_free(c, all[i]);
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

int kern_selftest(kern_device *dev, kern_device *ref, double tol, acc_err *err)
{
    st_ctx c = {.dev = dev, .ref = ref, .tol = tol, .rng = 20261202, .err = err};
    test_encoder_layernorm(&c);
    test_matmul(&c);
    test_attention(&c);
    test_pointwise(&c);
    test_xent(&c);
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
