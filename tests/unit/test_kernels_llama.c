/* The LLaMA family's CPU ops (kern_cpu_llama.c) and rotary tables
 * (kern_rope.c): every forward against a plain double-precision reference
 * written here; every backward against central finite differences twice:
 *
 *  - of the double reference (step 1e-5: truncation ~1e-10, rounding
 *    ~1e-11), compared at 1e-4 of the largest gradient: what fp32 kernels
 *    can promise, and what every other kernel test of the engine uses;
 *  - around the fp32 op itself (the kernel's own forward, the loss summed
 *    in double), which proves the backward is the gradient of the forward
 *    the device really computes. Step h = 1e-2 on inputs of size ~1:
 *    truncation h^2/6 |f'''| ~ 2e-5 |f'''| (f''' is O(1..10) for these
 *    ops), rounding noise: only the outputs that depend on the perturbed
 *    input change, each carrying fp32's ~6e-8 relative rounding, so about
 *    1e-6 / (2h) = 5e-5 on a loss of size ~10. Tolerance 2e-3 of the
 *    largest gradient (at least 1): ten times that noise, small enough
 *    that a term missing from a backward (>= 1% here) fails.
 *
 * The loss is sum(out * g) with random g. Backwards must accumulate (+=)
 * where the contract says so: gradients start from a random base and only
 * the increment is checked. RoPE's tables are checked against frequencies
 * computed here in another form (the llama3 bands as one clamped blend);
 * grouped-query attention against multi-head attention on k / v repeated
 * per group, and MHA against the GPT-2 attention op on packed qkv. Run with
 * two kernel threads so the splits are exercised.
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
#include "kern_rope.h"
#include "rng.h"

enum { B = 2, T = 7, NH = 4, NKV = 2, HS = 8, HALF = HS / 2, C = 24, I = 20, V = 11, P = 64 };
#define N (B * T)
#define QN (N * NH * HS)
#define KN (N * NKV * HS)
#define H_REF 1e-5
#define TOL_REF 1e-4
#define H_OP 1e-2
#define TOL_OP 2e-3

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

typedef struct fx {
    kern_device *dev; /* two kernel threads: the ops under test */
    kern_device *one; /* one thread: the finite differences' thousands of
                       * forwards (same bits: test_threads_do_not_matter),
                       * without an OpenMP join per call on a busy machine */
    rng r;
} fx;

static int setup(void **state)
{
    static fx f;
    kern_device_info info = {.kind = KERN_DEV_CPU, .index = 0, .name = "cpu0", .mem_total = 0};
    acc_err err = {0};
    if (kern_device_open(&info, 2, &f.dev, &err) != 0 ||
        kern_device_open(&info, 1, &f.one, &err) != 0)
        return -1;
    rng_seed(&f.r, 15, 2);
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    kern_device_close(f->dev);
    kern_device_close(f->one);
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

static void to_double(double *xd, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        xd[i] = x[i];
}

/* |got - want| <= rtol * max(1, max |want|) everywhere */
static void assert_close(const float *got, const double *want, size_t n, double rtol,
                         const char *what)
{
    double mx = 1.0;
    for (size_t i = 0; i < n; i++)
        mx = fmax(mx, fabs(want[i]));
    for (size_t i = 0; i < n; i++)
        if (!(fabs(got[i] - want[i]) <= rtol * mx)) {
            print_error("%s[%zu]: got %.8g want %.8g (tol %.3g)\n", what, i, got[i], want[i],
                        rtol * mx);
            fail();
        }
}

static void sub_base(float *after, const float *base, size_t n)
{
    for (size_t i = 0; i < n; i++)
        after[i] -= base[i];
}

static double dot_g(const double *g, const double *out, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += g[i] * out[i];
    return s;
}

static double dot_gf(const double *g, const float *out, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += g[i] * (double)out[i];
    return s;
}

typedef double (*loss_fn)(void *ctx);

/* Both finite-difference checks of `incr` (the kernel's gradient increment
 * for one input): over xd (what ref reads, double) and over xf (what the
 * fp32 op reads; the step actually taken is the difference of the two
 * rounded points). */
static void fd_both(loss_fn ref, loss_fn op, void *ctx, double *xd, float *xf, size_t n,
                    const float *incr, const char *what)
{
    double *num = malloc(n * sizeof *num);
    assert_non_null(num);
    for (size_t i = 0; i < n; i++) {
        double save = xd[i];
        xd[i] = save + H_REF;
        double lp = ref(ctx);
        xd[i] = save - H_REF;
        double lm = ref(ctx);
        xd[i] = save;
        num[i] = (lp - lm) / (2 * H_REF);
    }
    print_message("  %s: against the double reference\n", what);
    assert_close(incr, num, n, TOL_REF, what);
    for (size_t i = 0; i < n; i++) {
        float save = xf[i], xp = (float)(save + H_OP), xm = (float)(save - H_OP);
        xf[i] = xp;
        double lp = op(ctx);
        xf[i] = xm;
        double lm = op(ctx);
        xf[i] = save;
        num[i] = (lp - lm) / ((double)xp - (double)xm);
    }
    print_message("  %s: around the fp32 op\n", what);
    assert_close(incr, num, n, TOL_OP, what);
    free(num);
}

/* ------------------------------------------------------------ embedding */

static void test_embed(void **state)
{
    fx *f = *state;
    kern_device *d = f->dev;
    int tok[N];
    float wte[V * C], out[N * C], g[N * C], dwte[V * C], base[V * C];
    double want[V * C];
    for (int n = 0; n < N; n++)
        tok[n] = (int)rng_below(&f->r, 4); /* repeats: the backward must accumulate */
    fill(&f->r, wte, NULL, V * C, 1);
    fill(&f->r, g, NULL, N * C, 1);
    d->ops->embed_fwd(d, out, tok, wte, N, C);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            assert_true(out[n * C + c] == wte[tok[n] * C + c]);
    fill(&f->r, base, NULL, V * C, 1);
    memcpy(dwte, base, sizeof dwte);
    d->ops->embed_bwd(d, dwte, g, tok, N, C);
    to_double(want, base, V * C);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            want[tok[n] * C + c] += g[n * C + c];
    assert_close(dwte, want, V * C, 1e-6, "embed dwte");
}

/* -------------------------------------------------------------- RMSNorm */

#define EPS 1e-5f

typedef struct rms_ctx {
    kern_device *d;
    double x[N * C], w[C], g[N * C], out[N * C], rstd[N];
    float xf[N * C], wf[C], outf[N * C], rstdf[N];
} rms_ctx;

static void ref_rmsnorm(rms_ctx *c)
{
    for (int n = 0; n < N; n++) {
        double ss = 0.0;
        for (int i = 0; i < C; i++)
            ss += c->x[n * C + i] * c->x[n * C + i];
        double r = 1.0 / sqrt(ss / C + (double)EPS);
        c->rstd[n] = r;
        for (int i = 0; i < C; i++)
            c->out[n * C + i] = c->x[n * C + i] * r * c->w[i];
    }
}

static double rms_ref(void *p)
{
    rms_ctx *c = p;
    ref_rmsnorm(c);
    return dot_g(c->g, c->out, N * C);
}

static double rms_op(void *p)
{
    rms_ctx *c = p;
    c->d->ops->rmsnorm_fwd(c->d, c->outf, c->rstdf, c->xf, c->wf, EPS, N, C);
    return dot_gf(c->g, c->outf, N * C);
}

static void test_rmsnorm(void **state)
{
    fx *f = *state;
    kern_device *d = f->dev;
    static rms_ctx c;
    float g[N * C], dx[N * C], bx[N * C], dw[C], bw[C];
    c.d = d;
    fill(&f->r, c.xf, c.x, N * C, 2);
    for (int i = 0; i < C; i++)
        c.w[i] = c.wf[i] = (float)(0.5 + rng_uniform(&f->r));
    fill(&f->r, g, c.g, N * C, 1);
    rms_op(&c);
    ref_rmsnorm(&c);
    assert_close(c.outf, c.out, N * C, 1e-6, "rmsnorm out");
    assert_close(c.rstdf, c.rstd, N, 1e-6, "rmsnorm rstd");
    fill(&f->r, bx, NULL, N * C, 1);
    fill(&f->r, bw, NULL, C, 1);
    memcpy(dx, bx, sizeof dx);
    memcpy(dw, bw, sizeof dw);
    float rstd[N];
    memcpy(rstd, c.rstdf, sizeof rstd);
    d->ops->rmsnorm_bwd(d, dx, dw, g, c.xf, c.wf, rstd, N, C);
    sub_base(dx, bx, N * C);
    sub_base(dw, bw, C);
    c.d = f->one; /* the finite differences' forwards */
    fd_both(rms_ref, rms_op, &c, c.x, c.xf, N * C, dx, "rmsnorm dinp");
    fd_both(rms_ref, rms_op, &c, c.w, c.wf, C, dw, "rmsnorm dw");
}

/* ------------------------------------------------------- rotary tables */

/* The frequencies again, independently: theta^-(2i/hs) as 1 / theta^(2i/hs),
 * and llama3's three bands as one blend with the smoothing clamped to
 * [0, 1] (1 keeps the frequency, 0 divides it by the factor). */
static double my_inv_freq(const kern_rope_cfg *cfg, int i, int hs)
{
    double f = 1.0 / pow(cfg->theta, (double)(2 * i) / (double)hs);
    if (cfg->type == KERN_ROPE_LINEAR)
        return f / cfg->factor;
    if (cfg->type == KERN_ROPE_LLAMA3) {
        double ctx_over_wavelen = cfg->original_max_pos * f / (2.0 * M_PI);
        double s = (ctx_over_wavelen - cfg->low_freq_factor) /
                   (cfg->high_freq_factor - cfg->low_freq_factor);
        s = s < 0.0 ? 0.0 : s > 1.0 ? 1.0 : s;
        return s * f + (1.0 - s) * f / cfg->factor;
    }
    return f;
}

static const kern_rope_cfg ROPE_NONE = {.theta = 10000.0, .type = KERN_ROPE_NONE};
static const kern_rope_cfg ROPE_LINEAR = {.theta = 10000.0, .type = KERN_ROPE_LINEAR,
                                          .factor = 4.0};
/* Llama 3.1's published scaling on a small head: with theta 500000 and
 * hs = 8 the four wavelengths (6.3, 167, 4443, 118000) fall in the kept,
 * kept, blended and scaled bands of L = 8192, high 4, low 1. */
static const kern_rope_cfg ROPE_LLAMA3 = {.theta = 500000.0, .type = KERN_ROPE_LLAMA3,
                                          .factor = 8.0, .low_freq_factor = 1.0,
                                          .high_freq_factor = 4.0, .original_max_pos = 8192};

static void check_table(const kern_rope_cfg *cfg, const char *what)
{
    static float ct[P * HALF], st[P * HALF];
    double inv[HALF];
    acc_err err = {0};
    assert_int_equal(kern_rope_inv_freq(cfg, HS, inv, &err), 0);
    for (int i = 0; i < HALF; i++)
        assert_true(fabs(inv[i] - my_inv_freq(cfg, i, HS)) <= 1e-12 * inv[i]);
    assert_int_equal(kern_rope_table(cfg, P, HS, ct, st, &err), 0);
    double wc[P * HALF], ws[P * HALF];
    for (int p = 0; p < P; p++)
        for (int i = 0; i < HALF; i++) {
            wc[p * HALF + i] = cos(p * my_inv_freq(cfg, i, HS));
            ws[p * HALF + i] = sin(p * my_inv_freq(cfg, i, HS));
        }
    /* floats of values in [-1, 1]: half an ulp of 1 at most */
    assert_close(ct, wc, P * HALF, 6e-8, what);
    assert_close(st, ws, P * HALF, 6e-8, what);
}

static void test_rope_tables(void **state)
{
    (void)state;
    check_table(&ROPE_NONE, "rope table none");
    check_table(&ROPE_LINEAR, "rope table linear");
    check_table(&ROPE_LLAMA3, "rope table llama3");
    /* llama3 as configured above: every band is met */
    double inv[HALF], base[HALF];
    acc_err err = {0};
    kern_rope_cfg plain = ROPE_LLAMA3;
    plain.type = KERN_ROPE_NONE;
    assert_int_equal(kern_rope_inv_freq(&ROPE_LLAMA3, HS, inv, &err), 0);
    assert_int_equal(kern_rope_inv_freq(&plain, HS, base, &err), 0);
    assert_true(inv[0] == base[0] && inv[1] == base[1]);              /* kept */
    assert_true(inv[2] < base[2] && inv[2] > base[2] / 8.0);          /* blended */
    assert_true(fabs(inv[3] - base[3] / 8.0) <= 1e-15 * base[3]);     /* scaled */
    /* with factor 1 there is nothing to scale: llama3 is the plain table */
    kern_rope_cfg one = ROPE_LLAMA3;
    one.factor = 1.0;
    assert_int_equal(kern_rope_inv_freq(&one, HS, inv, &err), 0);
    for (int i = 0; i < HALF; i++)
        assert_true(fabs(inv[i] - base[i]) <= 1e-15 * base[i]);
    /* linear: position f * p scaled is position p unscaled */
    static float cl[P * HALF], sl[P * HALF], cn[P * HALF], sn[P * HALF];
    assert_int_equal(kern_rope_table(&ROPE_LINEAR, P, HS, cl, sl, &err), 0);
    assert_int_equal(kern_rope_table(&ROPE_NONE, P, HS, cn, sn, &err), 0);
    for (int p = 0; 4 * p < P; p++)
        for (int i = 0; i < HALF; i++) {
            assert_true(fabsf(cl[4 * p * HALF + i] - cn[p * HALF + i]) <= 1e-6f);
            assert_true(fabsf(sl[4 * p * HALF + i] - sn[p * HALF + i]) <= 1e-6f);
        }
}

static void expect_bad(const kern_rope_cfg *cfg, int hs, const char *field)
{
    acc_err err = {0};
    assert_int_equal(kern_rope_check(cfg, hs, &err), ACC_EINVAL);
    assert_string_equal(err.field, field);
}

static void test_rope_bad_config(void **state)
{
    (void)state;
    kern_rope_cfg c = ROPE_LLAMA3;
    expect_bad(&c, 7, "head_dim");
    expect_bad(&c, 0, "head_dim");
    c.theta = 0.0;
    expect_bad(&c, HS, "rope_theta");
    c = ROPE_LLAMA3;
    c.factor = -1.0;
    expect_bad(&c, HS, "rope_scaling.factor");
    c = ROPE_LLAMA3;
    c.high_freq_factor = c.low_freq_factor;
    expect_bad(&c, HS, "rope_scaling.high_freq_factor");
    c = ROPE_LLAMA3;
    c.low_freq_factor = 0.0;
    expect_bad(&c, HS, "rope_scaling.low_freq_factor");
    c = ROPE_LLAMA3;
    c.original_max_pos = 0;
    expect_bad(&c, HS, "rope_scaling.original_max_position_embeddings");
    c = ROPE_LINEAR;
    c.factor = NAN;
    expect_bad(&c, HS, "rope_scaling.factor");
    c.type = (kern_rope_type)9;
    expect_bad(&c, HS, "rope_scaling.rope_type");
    size_t n = 0;
    acc_err err = {0};
    assert_int_equal(kern_rope_table_floats(0, HS, &n, &err), ACC_EINVAL);
    assert_int_equal(kern_rope_table_floats(P, HS, &n, &err), 0);
    assert_int_equal(n, P * HALF);
    assert_int_equal(kern_rope_table_floats(P, 5, &n, &err), ACC_EINVAL);
}

/* ----------------------------------------------------------- RoPE kernel */

typedef struct rope_ctx {
    kern_device *d;
    const int *pos;
    double x[QN], g[QN], out[QN], c[P * HALF], s[P * HALF];
    float xf[QN], outf[QN], ct[P * HALF], st[P * HALF];
} rope_ctx;

static void ref_rope(rope_ctx *c)
{
    for (int n = 0; n < N; n++) {
        int p = c->pos != NULL ? c->pos[n] : n % T;
        for (int h = 0; h < NH; h++) {
            const double *x = c->x + (n * NH + h) * HS;
            double *o = c->out + (n * NH + h) * HS;
            for (int i = 0; i < HALF; i++) {
                double cs = c->c[p * HALF + i], sn = c->s[p * HALF + i];
                o[i] = x[i] * cs - x[i + HALF] * sn;
                o[i + HALF] = x[i + HALF] * cs + x[i] * sn;
            }
        }
    }
}

static double rope_ref(void *p)
{
    rope_ctx *c = p;
    ref_rope(c);
    return dot_g(c->g, c->out, QN);
}

static double rope_op(void *p)
{
    rope_ctx *c = p;
    c->d->ops->rope_fwd(c->d, c->outf, c->xf, c->ct, c->st, c->pos, B, T, NH, HS);
    return dot_gf(c->g, c->outf, QN);
}

static void rope_case(fx *f, const int *pos, const char *what)
{
    kern_device *d = f->dev;
    static rope_ctx c;
    acc_err err = {0};
    c.d = d;
    c.pos = pos;
    assert_int_equal(kern_rope_table(&ROPE_LLAMA3, P, HS, c.ct, c.st, &err), 0);
    for (int p = 0; p < P; p++) /* the reference's own angles */
        for (int i = 0; i < HALF; i++) {
            c.c[p * HALF + i] = cos(p * my_inv_freq(&ROPE_LLAMA3, i, HS));
            c.s[p * HALF + i] = sin(p * my_inv_freq(&ROPE_LLAMA3, i, HS));
        }
    fill(&f->r, c.xf, c.x, QN, 1);
    float g[QN];
    fill(&f->r, g, c.g, QN, 1);
    rope_op(&c);
    ref_rope(&c);
    print_message("%s\n", what);
    /* the tables' float rounding (<= 6e-8) on inputs ~1, summed twice */
    assert_close(c.outf, c.out, QN, 3e-7, "rope out");
    /* in place gives the same */
    static float inplace[QN];
    memcpy(inplace, c.xf, sizeof inplace);
    d->ops->rope_fwd(d, inplace, inplace, c.ct, c.st, pos, B, T, NH, HS);
    assert_memory_equal(inplace, c.outf, sizeof inplace);
    /* the backward: the transpose, overwriting its output; in place too */
    static float dx[QN], dx2[QN];
    for (int i = 0; i < QN; i++)
        dx[i] = 1e30f; /* overwritten, not accumulated */
    d->ops->rope_bwd(d, dx, g, c.ct, c.st, pos, B, T, NH, HS);
    memcpy(dx2, g, sizeof dx2);
    d->ops->rope_bwd(d, dx2, dx2, c.ct, c.st, pos, B, T, NH, HS);
    assert_memory_equal(dx, dx2, sizeof dx);
    c.d = f->one; /* the finite differences' forwards */
    fd_both(rope_ref, rope_op, &c, c.x, c.xf, QN, dx, "rope dinp");
    /* a rotation: the backward undoes the forward */
    double back[QN];
    rope_op(&c); /* the finite differences left a perturbed output */
    memcpy(dx2, c.outf, sizeof dx2);
    d->ops->rope_bwd(d, dx2, dx2, c.ct, c.st, pos, B, T, NH, HS);
    to_double(back, c.xf, QN);
    assert_close(dx2, back, QN, 1e-6, "rope bwd(fwd(x))");
}

static void test_rope(void **state)
{
    fx *f = *state;
    rope_case(f, NULL, "positions t");
    /* packed sequences: positions restart inside a row of the batch, and
     * run past T (a later window of a long document) */
    int pos[N];
    for (int t = 0; t < T; t++) {
        pos[t] = t < 3 ? t : t - 3;
        pos[T + t] = 50 + t;
    }
    rope_case(f, pos, "positions given");
    /* positions do matter: the same input at other positions differs */
    static float a[QN], b[QN], ct[P * HALF], st[P * HALF], x[QN];
    acc_err err = {0};
    assert_int_equal(kern_rope_table(&ROPE_NONE, P, HS, ct, st, &err), 0);
    fill(&f->r, x, NULL, QN, 1);
    f->dev->ops->rope_fwd(f->dev, a, x, ct, st, NULL, B, T, NH, HS);
    f->dev->ops->rope_fwd(f->dev, b, x, ct, st, pos, B, T, NH, HS);
    assert_memory_equal(a, b, (size_t)3 * NH * HS * sizeof(float)); /* t < 3: same positions */
    assert_memory_not_equal(a + 3 * NH * HS, b + 3 * NH * HS, (size_t)NH * HS * sizeof(float));
}

/* --------------------------------------------------------------- SwiGLU */

typedef struct sw_ctx {
    kern_device *d;
    double gate[N * I], up[N * I], g[N * I], out[N * I];
    float gatef[N * I], upf[N * I], outf[N * I];
} sw_ctx;

static void ref_swiglu(sw_ctx *c)
{
    for (int i = 0; i < N * I; i++)
        c->out[i] = c->gate[i] / (1.0 + exp(-c->gate[i])) * c->up[i];
}

static double sw_ref(void *p)
{
    sw_ctx *c = p;
    ref_swiglu(c);
    return dot_g(c->g, c->out, N * I);
}

static double sw_op(void *p)
{
    sw_ctx *c = p;
    c->d->ops->swiglu_fwd(c->d, c->outf, c->gatef, c->upf, N * I);
    return dot_gf(c->g, c->outf, N * I);
}

static void test_swiglu(void **state)
{
    fx *f = *state;
    kern_device *d = f->dev;
    static sw_ctx c;
    float g[N * I], dg[N * I], du[N * I], bg[N * I], bu[N * I];
    c.d = d;
    fill(&f->r, c.gatef, c.gate, N * I, 3);
    c.gatef[0] = -90.0f, c.gate[0] = -90.0; /* silu's tails: exp overflows, no NaN */
    c.gatef[1] = 90.0f, c.gate[1] = 90.0;
    fill(&f->r, c.upf, c.up, N * I, 1);
    fill(&f->r, g, c.g, N * I, 1);
    sw_op(&c);
    ref_swiglu(&c);
    assert_close(c.outf, c.out, N * I, 1e-6, "swiglu out");
    /* out may be gate or up */
    static float alias[N * I];
    memcpy(alias, c.gatef, sizeof alias);
    d->ops->swiglu_fwd(d, alias, alias, c.upf, N * I);
    assert_memory_equal(alias, c.outf, sizeof alias);
    memcpy(alias, c.upf, sizeof alias);
    d->ops->swiglu_fwd(d, alias, c.gatef, alias, N * I);
    assert_memory_equal(alias, c.outf, sizeof alias);
    fill(&f->r, bg, NULL, N * I, 1);
    fill(&f->r, bu, NULL, N * I, 1);
    memcpy(dg, bg, sizeof dg);
    memcpy(du, bu, sizeof du);
    d->ops->swiglu_bwd(d, dg, du, g, c.gatef, c.upf, N * I);
    sub_base(dg, bg, N * I);
    sub_base(du, bu, N * I);
    c.d = f->one; /* the finite differences' forwards */
    fd_both(sw_ref, sw_op, &c, c.gate, c.gatef, N * I, dg, "swiglu dgate");
    fd_both(sw_ref, sw_op, &c, c.up, c.upf, N * I, du, "swiglu dup");
}

/* ------------------------------------------------ grouped-query attention */

typedef struct gq_ctx {
    kern_device *d;
    int nkv;
    double q[QN], k[QN], v[QN], g[QN], out[QN], lse[B * NH * T];
    float qf[QN], kf[QN], vf[QN], outf[QN], lsef[B * NH * T];
    float scratch[KERN_ATT_SCRATCH(T, NH)];
} gq_ctx;

/* k, v: [B,T,nkv,HS]; query head h reads key/value head h / (NH / nkv) */
static void ref_gqa(gq_ctx *c)
{
    int G = NH / c->nkv;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                double s[T], mx = -1e300, sum = 0;
                const double *q = c->q + ((b * T + t) * NH + h) * HS;
                for (int u = 0; u <= t; u++) {
                    const double *k = c->k + ((b * T + u) * c->nkv + h / G) * HS;
                    double dot = 0;
                    for (int i = 0; i < HS; i++)
                        dot += q[i] * k[i];
                    s[u] = dot / sqrt((double)HS);
                    mx = fmax(mx, s[u]);
                }
                for (int u = 0; u <= t; u++)
                    sum += (s[u] = exp(s[u] - mx));
                c->lse[(b * NH + h) * T + t] = mx + log(sum);
                double *o = c->out + ((b * T + t) * NH + h) * HS;
                for (int i = 0; i < HS; i++) {
                    double acc = 0;
                    for (int u = 0; u <= t; u++)
                        acc += s[u] / sum * c->v[((b * T + u) * c->nkv + h / G) * HS + i];
                    o[i] = acc;
                }
            }
}

static double gq_ref(void *p)
{
    gq_ctx *c = p;
    ref_gqa(c);
    return dot_g(c->g, c->out, QN);
}

static double gq_op(void *p)
{
    gq_ctx *c = p;
    c->d->ops->gqa_attention_fwd(c->d, c->outf, c->lsef, c->scratch, c->qf, c->kf, c->vf, B, T,
                                 NH, c->nkv, HS);
    return dot_gf(c->g, c->outf, QN);
}

static void gqa_case(fx *f, int nkv)
{
    kern_device *d = f->dev;
    static gq_ctx c;
    size_t kn = (size_t)N * nkv * HS;
    static float g[QN], dq[QN], dk[QN], dv[QN], bq[QN], bk[QN], bv[QN];
    print_message("NKV = %d\n", nkv);
    c.d = d;
    c.nkv = nkv;
    fill(&f->r, c.qf, c.q, QN, 1);
    fill(&f->r, c.kf, c.k, kn, 1);
    fill(&f->r, c.vf, c.v, kn, 1);
    fill(&f->r, g, c.g, QN, 1);
    for (size_t i = 0; i < KERN_ATT_SCRATCH(T, NH); i++)
        c.scratch[i] = 1e30f; /* garbage in the scratch must not matter */
    gq_op(&c);
    ref_gqa(&c);
    assert_close(c.outf, c.out, QN, 1e-5, "gqa out");
    assert_close(c.lsef, c.lse, B * NH * T, 1e-5, "gqa lse");
    fill(&f->r, bq, NULL, QN, 1);
    fill(&f->r, bk, NULL, kn, 1);
    fill(&f->r, bv, NULL, kn, 1);
    memcpy(dq, bq, sizeof dq);
    memcpy(dk, bk, kn * sizeof *dk);
    memcpy(dv, bv, kn * sizeof *dv);
    static float out[QN], lse[B * NH * T];
    memcpy(out, c.outf, sizeof out);
    memcpy(lse, c.lsef, sizeof lse);
    for (size_t i = 0; i < KERN_ATT_SCRATCH(T, NH); i++)
        c.scratch[i] = -1e30f;
    d->ops->gqa_attention_bwd(d, dq, dk, dv, c.scratch, g, c.qf, c.kf, c.vf, lse, out, B, T, NH,
                              nkv, HS);
    sub_base(dq, bq, QN);
    sub_base(dk, bk, kn);
    sub_base(dv, bv, kn);
    c.d = f->one; /* the finite differences' forwards */
    fd_both(gq_ref, gq_op, &c, c.q, c.qf, QN, dq, "gqa dq");
    fd_both(gq_ref, gq_op, &c, c.k, c.kf, kn, dk, "gqa dk");
    fd_both(gq_ref, gq_op, &c, c.v, c.vf, kn, dv, "gqa dv");
}

static void test_gqa_gradients(void **state)
{
    fx *f = *state;
    gqa_case(f, NKV); /* two query heads per key/value head */
    gqa_case(f, 1);   /* multi-query */
    gqa_case(f, NH);  /* multi-head */
}

/* GQA == MHA on k / v repeated per group: outputs, lse and dq equal, and
 * each key/value head's dk / dv is the sum over its group's copies. */
static void repeat_case(fx *f, int nkv)
{
    kern_device *d = f->dev;
    int G = NH / nkv;
    size_t kn = (size_t)N * nkv * HS;
    static float q[QN], k[QN], v[QN], kr[QN], vr[QN], g[QN];
    static float o1[QN], o2[QN], l1[B * NH * T], l2[B * NH * T];
    static float dq1[QN], dq2[QN], dk1[QN], dv1[QN], dkr[QN], dvr[QN];
    static float scr[KERN_ATT_SCRATCH(T, NH)];
    fill(&f->r, q, NULL, QN, 1);
    fill(&f->r, k, NULL, kn, 1);
    fill(&f->r, v, NULL, kn, 1);
    fill(&f->r, g, NULL, QN, 1);
    for (int n = 0; n < N; n++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < HS; i++) {
                kr[(n * NH + h) * HS + i] = k[(n * nkv + h / G) * HS + i];
                vr[(n * NH + h) * HS + i] = v[(n * nkv + h / G) * HS + i];
            }
    d->ops->gqa_attention_fwd(d, o1, l1, scr, q, k, v, B, T, NH, nkv, HS);
    d->ops->gqa_attention_fwd(d, o2, l2, scr, q, kr, vr, B, T, NH, NH, HS);
    double want[QN];
    to_double(want, o2, QN);
    assert_close(o1, want, QN, 1e-6, "gqa vs repeated out");
    to_double(want, l2, B * NH * T);
    assert_close(l1, want, B * NH * T, 1e-6, "gqa vs repeated lse");
    memset(dq1, 0, sizeof dq1), memset(dk1, 0, sizeof dk1), memset(dv1, 0, sizeof dv1);
    memset(dq2, 0, sizeof dq2), memset(dkr, 0, sizeof dkr), memset(dvr, 0, sizeof dvr);
    d->ops->gqa_attention_bwd(d, dq1, dk1, dv1, scr, g, q, k, v, l1, o1, B, T, NH, nkv, HS);
    d->ops->gqa_attention_bwd(d, dq2, dkr, dvr, scr, g, q, kr, vr, l2, o2, B, T, NH, NH, HS);
    to_double(want, dq2, QN);
    assert_close(dq1, want, QN, 1e-6, "gqa vs repeated dq");
    double wk[QN] = {0}, wv[QN] = {0};
    for (int n = 0; n < N; n++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < HS; i++) {
                wk[(n * nkv + h / G) * HS + i] += dkr[(n * NH + h) * HS + i];
                wv[(n * nkv + h / G) * HS + i] += dvr[(n * NH + h) * HS + i];
            }
    assert_close(dk1, wk, kn, 1e-6, "gqa vs repeated dk");
    assert_close(dv1, wv, kn, 1e-6, "gqa vs repeated dv");
}

static void test_gqa_is_repeated_mha(void **state)
{
    fx *f = *state;
    repeat_case(f, NKV);
    repeat_case(f, 1);
}

/* MHA (NKV == NH) on separate q / k / v is the GPT-2 attention op on the
 * same numbers packed as qkv [B,T,3C] */
static void test_mha_is_gpt2_attention(void **state)
{
    fx *f = *state;
    kern_device *d = f->dev;
    enum { CC = NH * HS };
    static float q[QN], k[QN], v[QN], qkv[N * 3 * CC], g[QN];
    static float o1[QN], o2[QN], l1[B * NH * T], l2[B * NH * T], scr[KERN_ATT_SCRATCH(T, NH)];
    static float dq[QN], dk[QN], dv[QN], dqkv[N * 3 * CC];
    fill(&f->r, q, NULL, QN, 1);
    fill(&f->r, k, NULL, QN, 1);
    fill(&f->r, v, NULL, QN, 1);
    fill(&f->r, g, NULL, QN, 1);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < CC; i++) {
            qkv[n * 3 * CC + i] = q[n * CC + i];
            qkv[n * 3 * CC + CC + i] = k[n * CC + i];
            qkv[n * 3 * CC + 2 * CC + i] = v[n * CC + i];
        }
    d->ops->gqa_attention_fwd(d, o1, l1, scr, q, k, v, B, T, NH, NH, HS);
    d->ops->attention_fwd(d, o2, l2, scr, qkv, B, T, CC, NH);
    double want[N * 3 * CC];
    to_double(want, o2, QN);
    assert_close(o1, want, QN, 1e-6, "mha vs attention out");
    to_double(want, l2, B * NH * T);
    assert_close(l1, want, B * NH * T, 1e-6, "mha vs attention lse");
    memset(dq, 0, sizeof dq), memset(dk, 0, sizeof dk), memset(dv, 0, sizeof dv);
    memset(dqkv, 0, sizeof dqkv);
    d->ops->gqa_attention_bwd(d, dq, dk, dv, scr, g, q, k, v, l1, o1, B, T, NH, NH, HS);
    d->ops->attention_bwd(d, dqkv, scr, g, qkv, l2, o2, B, T, CC, NH);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < CC; i++) {
            want[n * CC + i] = dqkv[n * 3 * CC + i];
            want[QN + n * CC + i] = dqkv[n * 3 * CC + CC + i];
            want[2 * QN + n * CC + i] = dqkv[n * 3 * CC + 2 * CC + i];
        }
    assert_close(dq, want, QN, 1e-6, "mha vs attention dq");
    assert_close(dk, want + QN, QN, 1e-6, "mha vs attention dk");
    assert_close(dv, want + 2 * QN, QN, 1e-6, "mha vs attention dv");
}

/* ------------------------------------------------------ thread counts */

/* Every op's result is bitwise the same with 1 and 3 kernel threads (row /
 * element splits, fixed column blocks for dw and dwte, one (sequence, head)
 * or (sequence, key/value head) per task for attention). */
typedef struct run_out {
    float emb[N * C], dwte[V * C], rms[N * C], rstd[N], dx[N * C], dw[C];
    float rope[QN], drope[QN], sw[N * I], dg[N * I], du[N * I];
    float att[QN], lse[B * NH * T], dq[QN], dk[KN], dv[KN];
} run_out;

static void run_all(kern_device *d, run_out *o, int seed)
{
    static float x[N * C], w[C], g[N * C], gate[N * I], up[N * I], gi[N * I];
    static float q[QN], k[KN], v[KN], gq[QN], ct[P * HALF], st[P * HALF];
    static float scr[KERN_ATT_SCRATCH(T, NH)];
    int tok[N], pos[N];
    rng r;
    rng_seed(&r, (uint64_t)seed, 3);
    for (int n = 0; n < N; n++) {
        tok[n] = (int)rng_below(&r, 3);
        pos[n] = (n * 7) % P;
    }
    fill(&r, x, NULL, N * C, 1), fill(&r, w, NULL, C, 1), fill(&r, g, NULL, N * C, 1);
    fill(&r, gate, NULL, N * I, 2), fill(&r, up, NULL, N * I, 1), fill(&r, gi, NULL, N * I, 1);
    fill(&r, q, NULL, QN, 1), fill(&r, k, NULL, KN, 1), fill(&r, v, NULL, KN, 1);
    fill(&r, gq, NULL, QN, 1);
    acc_err err = {0};
    assert_int_equal(kern_rope_table(&ROPE_LLAMA3, P, HS, ct, st, &err), 0);
    memset(o, 0, sizeof *o);
    const kern_ops *K = d->ops;
    K->embed_fwd(d, o->emb, tok, x, N, C); /* x as a table of N rows */
    K->embed_bwd(d, o->dwte, g, tok, N, C);
    K->rmsnorm_fwd(d, o->rms, o->rstd, x, w, EPS, N, C);
    K->rmsnorm_bwd(d, o->dx, o->dw, g, x, w, o->rstd, N, C);
    K->rope_fwd(d, o->rope, q, ct, st, pos, B, T, NH, HS);
    K->rope_bwd(d, o->drope, gq, ct, st, pos, B, T, NH, HS);
    K->swiglu_fwd(d, o->sw, gate, up, N * I);
    K->swiglu_bwd(d, o->dg, o->du, gi, gate, up, N * I);
    K->gqa_attention_fwd(d, o->att, o->lse, scr, q, k, v, B, T, NH, NKV, HS);
    K->gqa_attention_bwd(d, o->dq, o->dk, o->dv, scr, gq, q, k, v, o->lse, o->att, B, T, NH,
                         NKV, HS);
}

static void test_threads_do_not_matter(void **state)
{
    (void)state;
    static run_out a, b;
    kern_device_info info = {.kind = KERN_DEV_CPU, .index = 0, .name = "cpu0", .mem_total = 0};
    acc_err err = {0};
    kern_device *d1 = NULL, *d3 = NULL;
    assert_int_equal(kern_device_open(&info, 1, &d1, &err), 0);
    assert_int_equal(kern_device_open(&info, 3, &d3, &err), 0);
    run_all(d1, &a, 99);
    run_all(d3, &b, 99);
    assert_memory_equal(&a, &b, sizeof a);
    kern_device_close(d1);
    kern_device_close(d3);
}

/* ------------------------------------------------------ ops availability */

static void test_ops_check(void **state)
{
    fx *f = *state;
    acc_err err = {0};
    assert_int_equal(kern_llama_ops_check(f->dev, &err), 0);
    kern_ops lacking = *f->dev->ops;
    lacking.rope_bwd = NULL;
    kern_device fake = *f->dev;
    fake.ops = &lacking;
    assert_int_equal(kern_llama_ops_check(&fake, &err), ACC_EDEVICE);
    assert_non_null(strstr(err.msg, "rope_bwd"));
    assert_non_null(strstr(err.msg, "cpu"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embed),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope_tables),
        cmocka_unit_test(test_rope_bad_config),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_gqa_gradients),
        cmocka_unit_test(test_gqa_is_repeated_mha),
        cmocka_unit_test(test_mha_is_gpt2_attention),
        cmocka_unit_test(test_threads_do_not_matter),
        cmocka_unit_test(test_ops_check),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
