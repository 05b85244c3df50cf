/* kern_cpu: every kernel's forward against a plain double-precision
 * reference, and every backward against central finite differences of that
 * reference (so the differences are clean). Backwards must accumulate (+=):
 * gradients start from a non-zero base and only the increment is checked.
 * Run with two kernel threads so the splits are exercised.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kern_device.h"
#include "rng.h"

enum { B = 2, T = 5, C = 8, NH = 2, OC = 12, V = 10, VP = 16 };
#define N (B * T)
#define FD_H 1e-4

typedef struct fx {
    kern_device *dev;
    rng r;
} fx;

static int setup(void **state)
{
    static fx f;
    kern_device_info info = {.kind = KERN_DEV_CPU, .index = 0, .name = "cpu0", .mem_total = 0};
    acc_err err = {0};
    if (kern_device_open(&info, 2, &f.dev, &err) != 0)
        return -1;
    rng_seed(&f.r, 7, 1);
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    kern_device_close(f->dev);
    return 0;
}

static void fill(rng *r, float *x, double *xd, size_t n, double scale)
{
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)(scale * rng_normal(r));
        if (xd)
            xd[i] = x[i];
    }
}

static void assert_close(const float *got, const double *want, size_t n, double rtol,
                         const char *what)
{
    double mx = 0;
    for (size_t i = 0; i < n; i++)
        mx = fmax(mx, fabs(want[i]));
    for (size_t i = 0; i < n; i++) {
        double tol = rtol * (mx > 1 ? mx : 1);
        if (fabs(got[i] - want[i]) > tol) {
            print_error("%s[%zu]: got %.8g want %.8g (tol %.3g)\n", what, i, got[i], want[i], tol);
            fail();
        }
    }
}

/* Objective of a reference: sum(g .* f(inputs)) with g fixed. */
typedef double (*objective)(void *ctx);

/* increment = analytic gradient added by the kernel (after - base) */
static void fd_check(objective f, void *ctx, double *x, size_t n, const float *increment,
                     double rtol, const char *what)
{
    double *num = malloc(n * sizeof *num);
    assert_non_null(num);
    for (size_t i = 0; i < n; i++) {
        double save = x[i];
        x[i] = save + FD_H;
        double fp = f(ctx);
        x[i] = save - FD_H;
        double fm = f(ctx);
        x[i] = save;
        num[i] = (fp - fm) / (2 * FD_H);
    }
    assert_close(increment, num, n, rtol, what);
    free(num);
}

static void sub_base(float *after, const float *base, size_t n)
{
    for (size_t i = 0; i < n; i++)
        after[i] -= base[i];
}

/* ---------------------------------------------------------------- matmul */

typedef struct mm_ctx {
    double x[N * C], w[OC * C], b[OC], g[N * OC], out[N * OC];
} mm_ctx;

static void ref_matmul(mm_ctx *c)
{
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = c->b[o];
            for (int i = 0; i < C; i++)
                s += c->x[n * C + i] * c->w[o * C + i];
            c->out[n * OC + o] = s;
        }
}

static double mm_obj(void *p)
{
    mm_ctx *c = p;
    ref_matmul(c);
    double s = 0;
    for (int i = 0; i < N * OC; i++)
        s += c->g[i] * c->out[i];
    return s;
}

static void test_matmul(void **state)
{
    fx *f = *state;
    kern_device *d = f->dev;
    static mm_ctx c;
    float x[N * C], w[OC * C], b[OC], g[N * OC], out[N * OC];
    float dx[N * C], dw[OC * C], db[OC], bx[N * C], bw[OC * C], bb[OC];
    fill(&f->r, x, c.x, N * C, 1);
    fill(&f->r, w, c.w, OC * C, 0.5);
    fill(&f->r, b, c.b, OC, 0.5);
    fill(&f->r, g, c.g, N * OC, 1);
    d->ops->matmul_fwd(d, out, x, w, b, N, C, OC);
    ref_matmul(&c);
    assert_close(out, c.out, N * OC, 1e-5, "matmul out");
    fill(&f->r, bx, NULL, N * C, 1);
    fill(&f->r, bw, NULL, OC * C, 1);
    fill(&f->r, bb, NULL, OC, 1);
    memcpy(dx, bx, sizeof dx);
    memcpy(dw, bw, sizeof dw);
    memcpy(db, bb, sizeof db);
    d->ops->matmul_bwd(d, dx, dw, db, g, x, w, N, C, OC);
    sub_base(dx, bx, N * C);
    sub_base(dw, bw, OC * C);
    sub_base(db, bb, OC);
    fd_check(mm_obj, &c, c.x, N * C, dx, 1e-4, "matmul dinp");
    fd_check(mm_obj, &c, c.w, OC * C, dw, 1e-4, "matmul dw");
    fd_check(mm_obj, &c, c.b, OC, db, 1e-4, "matmul dbias");
}

/* ------------------------------------------------------------- layernorm */

typedef struct ln_ctx {
    double x[N * C], w[C], b[C], g[N * C], out[N * C];
} ln_ctx;

static void ref_layernorm(ln_ctx *c)
{
    for (int n = 0; n < N; n++) {
        double m = 0, v = 0;
        for (int i = 0; i < C; i++)
            m += c->x[n * C + i];
        m /= C;
        for (int i = 0; i < C; i++)
            v += (c->x[n * C + i] - m) * (c->x[n * C + i] - m);
        v /= C;
        for (int i = 0; i < C; i++)
            c->out[n * C + i] = (c->x[n * C + i] - m) / sqrt(v + 1e-5) * c->w[i] + c->b[i];
    }
}

static double ln_obj(void *p)
{
    ln_ctx *c = p;
    ref_layernorm(c);
    double s = 0;
    for (int i = 0; i < N * C; i++)
        s += c->g[i] * c->out[i];
    return s;
}

static void test_layernorm(void **state)
{
    fx *f = *state;
    kern_device *d = f->dev;
    static ln_ctx c;
    float x[N * C], w[C], b[C], g[N * C], out[N * C], mean[N], rstd[N];
    float dx[N * C], dw[C], db[C], bx[N * C], bw[C], bb[C];
    fill(&f->r, x, c.x, N * C, 2);
    fill(&f->r, w, c.w, C, 1);
    fill(&f->r, b, c.b, C, 1);
    fill(&f->r, g, c.g, N * C, 1);
    d->ops->layernorm_fwd(d, out, mean, rstd, x, w, b, N, C);
    ref_layernorm(&c);
    assert_close(out, c.out, N * C, 1e-5, "layernorm out");
    fill(&f->r, bx, NULL, N * C, 1);
    fill(&f->r, bw, NULL, C, 1);
    fill(&f->r, bb, NULL, C, 1);
    memcpy(dx, bx, sizeof dx);
    memcpy(dw, bw, sizeof dw);
    memcpy(db, bb, sizeof db);
    d->ops->layernorm_bwd(d, dx, dw, db, g, x, w, mean, rstd, N, C);
    sub_base(dx, bx, N * C);
    sub_base(dw, bw, C);
    sub_base(db, bb, C);
    fd_check(ln_obj, &c, c.x, N * C, dx, 1e-4, "layernorm dinp");
    fd_check(ln_obj, &c, c.w, C, dw, 1e-4, "layernorm dw");
    fd_check(ln_obj, &c, c.b, C, db, 1e-4, "layernorm db");
}

/* ------------------------------------------------------------- attention */

typedef struct at_ctx {
    double qkv[N * 3 * C], g[N * C], out[N * C];
} at_ctx;

static void ref_attention(at_ctx *c)
{
    int hs = C / NH;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                double s[T], mx = -1e300, sum = 0;
                const double *q = c->qkv + (b * T + t) * 3 * C + h * hs;
                for (int u = 0; u <= t; u++) {
                    const double *k = c->qkv + (b * T + u) * 3 * C + C + h * hs;
                    double dot = 0;
                    for (int i = 0; i < hs; i++)
                        dot += q[i] * k[i];
                    s[u] = dot / sqrt((double)hs);
                    mx = fmax(mx, s[u]);
                }
                for (int u = 0; u <= t; u++)
                    sum += (s[u] = exp(s[u] - mx));
                double *o = c->out + (b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) {
                    double acc = 0;
                    for (int u = 0; u <= t; u++)
                        acc += s[u] / sum * c->qkv[(b * T + u) * 3 * C + 2 * C + h * hs + i];
                    o[i] = acc;
                }
            }
}

static double at_obj(void *p)
{
    at_ctx *c = p;
    ref_attention(c);
    double s = 0;
    for (int i = 0; i < N * C; i++)
        s += c->g[i] * c->out[i];
    return s;
}

static void test_attention(void **state)
{
    fx *f = *state;
    kern_device *d = f->dev;
    static at_ctx c;
    float qkv[N * 3 * C], g[N * C], out[N * C], att[B * NH * T * T], datt[B * NH * T * T];
    float dqkv[N * 3 * C], base[N * 3 * C];
    fill(&f->r, qkv, c.qkv, N * 3 * C, 1);
    fill(&f->r, g, c.g, N * C, 1);
    d->ops->attention_fwd(d, out, att, qkv, B, T, C, NH);
    ref_attention(&c);
    assert_close(out, c.out, N * C, 1e-5, "attention out");
    /* causal: no weight on the future */
    for (int t = 0; t < T; t++)
        for (int u = t + 1; u < T; u++)
            assert_true(att[t * T + u] == 0.0f);
    fill(&f->r, base, NULL, N * 3 * C, 1);
    memcpy(dqkv, base, sizeof dqkv);
    d->ops->attention_bwd(d, dqkv, datt, g, qkv, att, B, T, C, NH);
    sub_base(dqkv, base, N * 3 * C);
    fd_check(at_obj, &c, c.qkv, N * 3 * C, dqkv, 1e-4, "attention dqkv");
}

/* ------------------------------------------------------------------ gelu */

typedef struct ge_ctx {
    double x[N * C], g[N * C], out[N * C];
} ge_ctx;

static void ref_gelu(ge_ctx *c)
{
    for (int i = 0; i < N * C; i++) {
        double x = c->x[i];
        c->out[i] = 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    }
}

static double ge_obj(void *p)
{
    ge_ctx *c = p;
    ref_gelu(c);
    double s = 0;
    for (int i = 0; i < N * C; i++)
        s += c->g[i] * c->out[i];
    return s;
}

static void test_gelu(void **state)
{
    fx *f = *state;
    kern_device *d = f->dev;
    static ge_ctx c;
    float x[N * C], g[N * C], out[N * C], dx[N * C], base[N * C];
    fill(&f->r, x, c.x, N * C, 2);
    fill(&f->r, g, c.g, N * C, 1);
    d->ops->gelu_fwd(d, out, x, N * C);
    ref_gelu(&c);
    assert_close(out, c.out, N * C, 1e-5, "gelu out");
    fill(&f->r, base, NULL, N * C, 1);
    memcpy(dx, base, sizeof dx);
    d->ops->gelu_bwd(d, dx, x, g, N * C);
    sub_base(dx, base, N * C);
    fd_check(ge_obj, &c, c.x, N * C, dx, 1e-4, "gelu dinp");

    /* saturation far out in both directions (the exp is clamped there) */
    float big[6] = {-1e30f, -100.0f, -12.0f, 12.0f, 100.0f, 1e30f}, gb[6], ones[6], dbig[6];
    for (int i = 0; i < 6; i++) {
        ones[i] = 1.0f;
        dbig[i] = 0.0f;
    }
    d->ops->gelu_fwd(d, gb, big, 6);
    d->ops->gelu_bwd(d, dbig, big, ones, 6);
    for (int i = 0; i < 6; i++) {
        float want = big[i] > 0 ? big[i] : 0.0f;
        assert_true(fabsf(gb[i] - want) <= 1e-6f * fabsf(big[i]));
        assert_true(fabsf(dbig[i] - (big[i] > 0 ? 1.0f : 0.0f)) <= 1e-6f);
    }
}

/* ------------------------------------------------------------- embedding */

typedef struct en_ctx {
    int tok[N];
    double wte[V * C], wpe[T * C], g[N * C], out[N * C];
} en_ctx;

static void ref_encoder(en_ctx *c)
{
    for (int n = 0; n < N; n++)
        for (int i = 0; i < C; i++)
            c->out[n * C + i] = c->wte[c->tok[n] * C + i] + c->wpe[(n % T) * C + i];
}

static double en_obj(void *p)
{
    en_ctx *c = p;
    ref_encoder(c);
    double s = 0;
    for (int i = 0; i < N * C; i++)
        s += c->g[i] * c->out[i];
    return s;
}

static void test_encoder(void **state)
{
    fx *f = *state;
    kern_device *d = f->dev;
    static en_ctx c;
    int tok[N];
    float wte[V * C], wpe[T * C], g[N * C], out[N * C];
    float dwte[V * C], dwpe[T * C], bte[V * C], bpe[T * C];
    for (int n = 0; n < N; n++)
        c.tok[n] = tok[n] = (int)rng_below(&f->r, 4); /* repeats: accumulation */
    fill(&f->r, wte, c.wte, V * C, 1);
    fill(&f->r, wpe, c.wpe, T * C, 1);
    fill(&f->r, g, c.g, N * C, 1);
    d->ops->encoder_fwd(d, out, tok, wte, wpe, B, T, C);
    ref_encoder(&c);
    assert_close(out, c.out, N * C, 1e-6, "encoder out");
    fill(&f->r, bte, NULL, V * C, 1);
    fill(&f->r, bpe, NULL, T * C, 1);
    memcpy(dwte, bte, sizeof dwte);
    memcpy(dwpe, bpe, sizeof dwpe);
    d->ops->encoder_bwd(d, dwte, dwpe, g, tok, B, T, C);
    sub_base(dwte, bte, V * C);
    sub_base(dwpe, bpe, T * C);
    fd_check(en_obj, &c, c.wte, V * C, dwte, 1e-4, "encoder dwte");
    fd_check(en_obj, &c, c.wpe, T * C, dwpe, 1e-4, "encoder dwpe");
}

/* ------------------------------------------------ softmax + cross-entropy */

typedef struct xe_ctx {
    int tgt[N];
    double logits[N * VP], w[N], losses[N];
} xe_ctx;

static double xe_obj(void *p)
{
    xe_ctx *c = p;
    double s = 0;
    for (int n = 0; n < N; n++) {
        const double *l = c->logits + n * VP;
        double mx = -1e300, sum = 0;
        for (int v = 0; v < V; v++)
            mx = fmax(mx, l[v]);
        for (int v = 0; v < V; v++)
            sum += exp(l[v] - mx);
        c->losses[n] = log(sum) + mx - l[c->tgt[n]];
        s += c->w[n] * c->losses[n];
    }
    return s;
}

static void test_xent(void **state)
{
    fx *f = *state;
    kern_device *d = f->dev;
    static xe_ctx c;
    int tgt[N];
    float logits[N * VP], w[N], losses[N];
    for (int n = 0; n < N; n++) {
        c.tgt[n] = tgt[n] = (int)rng_below(&f->r, V);
        w[n] = (float)(n % 3 == 0 ? 0.0 : 0.1 * (n + 1)); /* masked and weighted */
        c.w[n] = w[n];
    }
    fill(&f->r, logits, c.logits, N * VP, 3);
    /* huge padded logits must not matter */
    for (int n = 0; n < N; n++)
        for (int v = V; v < VP; v++)
            c.logits[n * VP + v] = logits[n * VP + v] = 50.0f;
    double want = xe_obj(&c), got = 0;
    d->ops->xent(d, logits, losses, &got, tgt, w, N, V, VP, 1);
    assert_close(losses, c.losses, N, 1e-5, "xent losses");
    assert_true(fabs(got - want) <= 1e-5 * fabs(want));
    /* logits now hold the gradient; padded columns are zero */
    for (int n = 0; n < N; n++)
        for (int v = V; v < VP; v++)
            assert_true(logits[n * VP + v] == 0.0f);
    fd_check(xe_obj, &c, c.logits, N * VP, logits, 1e-4, "xent dlogits");
    /* forward-only leaves the logits alone */
    float l2[N * VP];
    fill(&f->r, l2, NULL, N * VP, 1);
    float keep[N * VP];
    memcpy(keep, l2, sizeof keep);
    d->ops->xent(d, l2, losses, &got, tgt, w, N, V, VP, 0);
    assert_memory_equal(l2, keep, sizeof keep);
}

/* ----------------------------------------------------- adamw, sumsq, add */

static void test_adamw(void **state)
{
    fx *f = *state;
    kern_device *d = f->dev;
    enum { M = 10003 }; /* the threaded path, and a tail that is not a multiple of 4 */
    static float p[M], g[M], m[M], v[M];
    static double pd[M], md[M], vd[M];
    fill(&f->r, p, pd, M, 1);
    memset(m, 0, sizeof m);
    memset(v, 0, sizeof v);
    memset(md, 0, sizeof md);
    memset(vd, 0, sizeof vd);
    const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, scale = 0.5;
    for (int t = 1; t <= 3; t++) {
        fill(&f->r, g, NULL, M, 1);
        d->ops->adamw(d, p, g, m, v, M, (float)lr, (float)b1, (float)b2, (float)eps, (float)wd,
                      (float)scale, t);
        for (int i = 0; i < M; i++) {
            double gi = g[i] * scale;
            md[i] = b1 * md[i] + (1 - b1) * gi;
            vd[i] = b2 * vd[i] + (1 - b2) * gi * gi;
            double mh = md[i] / (1 - pow(b1, t)), vh = vd[i] / (1 - pow(b2, t));
            pd[i] -= lr * (mh / (sqrt(vh) + eps) + wd * pd[i]);
        }
    }
    assert_close(p, pd, M, 1e-5, "adamw params");
}

static void test_sumsq_and_add(void **state)
{
    fx *f = *state;
    kern_device *d = f->dev;
    enum { M = 10007 };
    static float x[M], y[M], z[M];
    static double xd[M];
    fill(&f->r, x, xd, M, 1);
    fill(&f->r, y, NULL, M, 1);
    double want = 0;
    for (int i = 0; i < M; i++)
        want += xd[i] * xd[i];
    assert_true(fabs(d->ops->sumsq(d, x, M) - want) <= 1e-10 * want);
    d->ops->add(d, z, x, y, M);
    for (int i = 0; i < M; i++)
        assert_true(z[i] == x[i] + y[i]);
}

/* ------------------------------------------------------ memory accounting */

static void test_memory_accounting(void **state)
{
    kern_device_info info = {.kind = KERN_DEV_CPU, .name = "cpu9", .mem_total = 1000};
    kern_device *d;
    acc_err err = {0};
    assert_int_equal(kern_device_open(&info, 1, &d, &err), 0);
    void *a, *b, *c;
    assert_int_equal(d->ops->alloc(d, 600, &a, &err), 0);
    assert_int_equal(d->ops->alloc(d, 300, &b, &err), 0);
    assert_true(d->in_use == 900 && d->peak == 900);
    assert_int_equal(d->ops->alloc(d, 200, &c, &err), ACC_EOOM);
    assert_null(c);
    assert_non_null(strstr(err.msg, "cpu9"));
    d->ops->free(d, a);
    assert_true(d->in_use == 300 && d->peak == 900);
    kern_device_reset_peak(d);
    assert_true(d->peak == 300);
    assert_int_equal(d->ops->alloc(d, 700, &c, &err), 0); /* exactly the budget */
    assert_true(d->peak == 1000);
    d->ops->free(d, b);
    d->ops->free(d, c);
    assert_true(d->in_use == 0);
    kern_device_close(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),   cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_attention), cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_encoder),  cmocka_unit_test(test_xent),
        cmocka_unit_test(test_adamw),    cmocka_unit_test(test_sumsq_and_add),
        cmocka_unit_test(test_memory_accounting),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
