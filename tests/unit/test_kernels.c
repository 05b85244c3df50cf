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

/* ------------------------------------------------------------------ bf16 */

static float from_bits(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static uint32_t to_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

/* kern_bf16_round: to nearest, ties to even, on every kind of value */
static const struct {
    uint32_t in, out;
} bf16_cases[] = {
    {0x3f800000u, 0x3f800000u}, /* 1: already bf16 */
    {0x3f808000u, 0x3f800000u}, /* 1 + 2^-8: a tie, to the even 1 */
    {0x3f818000u, 0x3f820000u}, /* 1 + 3 2^-8: a tie, to the even 1 + 2^-6 */
    {0x3f808001u, 0x3f810000u}, /* just above the tie: up */
    {0x3f807fffu, 0x3f800000u}, /* just below the tie: down */
    {0xbf808000u, 0xbf800000u}, /* negative ties: to even, sign kept */
    {0xbf818000u, 0xbf820000u},
    {0xbf80c000u, 0xbf810000u}, /* negative, above the tie: away from 0 */
    {0x40490fdbu, 0x40490000u}, /* pi -> 3.140625 */
    {0xc0490fdbu, 0xc0490000u}, /* -pi */
    {0x3fffffffu, 0x40000000u}, /* carry into the exponent: 2 */
    {0x00000000u, 0x00000000u}, /* +0 */
    {0x80000000u, 0x80000000u}, /* -0 */
    {0x7f800000u, 0x7f800000u}, /* +Inf */
    {0xff800000u, 0xff800000u}, /* -Inf */
    {0x7f7f7fffu, 0x7f7f0000u}, /* below the tie under bf16's largest */
    {0x7f7f8000u, 0x7f800000u}, /* tie above bf16's largest, odd: overflows to Inf */
    {0x7f7fffffu, 0x7f800000u}, /* FLT_MAX -> Inf */
    {0xff7fffffu, 0xff800000u}, /* -FLT_MAX -> -Inf */
    {0x00000001u, 0x00000000u}, /* smallest subnormal -> 0 */
    {0x00008000u, 0x00000000u}, /* subnormal tie, even: down to 0 */
    {0x00018000u, 0x00020000u}, /* subnormal tie, odd: up */
    {0x0000c000u, 0x00010000u}, /* subnormal above the tie: smallest bf16 subnormal */
    {0x00012345u, 0x00010000u}, /* subnormal, below the tie */
    {0x807fffffu, 0x80800000u}, /* largest negative subnormal -> -FLT_MIN */
    {0x00800000u, 0x00800000u}, /* FLT_MIN: bf16 */
};

static const uint32_t bf16_nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u,
                                     0x7f80ffffu, 0x7fffffffu};

static void test_bf16_round(void **state)
{
    for (size_t i = 0; i < sizeof bf16_cases / sizeof *bf16_cases; i++) {
        uint32_t got = to_bits(kern_bf16_round(from_bits(bf16_cases[i].in)));
        if (got != bf16_cases[i].out)
            print_error("bf16(0x%08x) = 0x%08x, want 0x%08x\n", bf16_cases[i].in, got,
                        bf16_cases[i].out);
        assert_true(got == bf16_cases[i].out);
    }
    /* NaN stays NaN, even when its payload is only in the dropped bits
     * (plain truncation would turn 0x7f800001 into Inf) */
    for (size_t i = 0; i < sizeof bf16_nans / sizeof *bf16_nans; i++) {
        float r = kern_bf16_round(from_bits(bf16_nans[i]));
        assert_true(isnan(r));
        assert_true((to_bits(r) & 0xffffu) == 0);
        assert_true((to_bits(r) >> 31) == (bf16_nans[i] >> 31));
    }
    /* idempotent, and at most half a bf16 ulp (2^-8 relative) away */
    rng r;
    rng_seed(&r, 11, 1);
    for (int i = 0; i < 100000; i++) {
        float x = (float)(rng_normal(&r) * exp(8.0 * rng_normal(&r)));
        float y = kern_bf16_round(x);
        assert_true(kern_bf16_round(y) == y);
        assert_true(fabs((double)y - x) <= ldexp(fabs((double)x), -8));
    }
}

/* narrow_bf16 (bf16 activation storage): the upper half of
 * kern_bf16_round, for the edge cases above, every upper half with the
 * lower halves that decide the rounding, and NaNs (a NaN stays a NaN of its
 * sign); widen16 of the result is kern_bf16_round exactly. */
static void test_narrow_bf16(void **state)
{
    kern_device *d = ((fx *)*state)->dev;
    static const uint32_t lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff};
    size_t nl = sizeof lows / sizeof *lows, ne = sizeof bf16_cases / sizeof *bf16_cases;
    size_t nn = sizeof bf16_nans / sizeof *bf16_nans, n = 65536 * nl + ne + nn;
    float *x = malloc(n * sizeof *x), *back = malloc(n * sizeof *back);
    uint16_t *h = malloc(n * sizeof *h);
    assert_non_null(x);
    assert_non_null(back);
    assert_non_null(h);
    for (size_t i = 0; i < 65536 * nl; i++)
        x[i] = from_bits((uint32_t)(i / nl) << 16 | lows[i % nl]);
    for (size_t i = 0; i < ne; i++)
        x[65536 * nl + i] = from_bits(bf16_cases[i].in);
    for (size_t i = 0; i < nn; i++)
        x[65536 * nl + ne + i] = from_bits(bf16_nans[i]);
    d->ops->narrow_bf16(d, h, x, n);
    d->ops->widen16(d, back, h, n, 0);
    for (size_t i = 0; i < n; i++) {
        uint32_t want = to_bits(kern_bf16_round(x[i]));
        if (isnan(x[i])) {
            assert_true(isnan(back[i]) && (to_bits(back[i]) >> 31) == (to_bits(x[i]) >> 31));
            continue;
        }
        if (((uint32_t)h[i] << 16) != want || to_bits(back[i]) != want)
            fail_msg("narrow_bf16(0x%08x) = 0x%04x, want 0x%08x", to_bits(x[i]), h[i], want);
    }
    free(x);
    free(back);
    free(h);
}

/* A bf16 device's products see the rounded operands, bit for bit: row n
 * of x holds edge value n at column n % MC_ and zeros elsewhere, w is the
 * identity, so out[n, n % MC_] = bf16(x) * 1 exactly (the other terms are
 * 0 * 0). MC_ = 11 puts the values in every lane of the backend's 4-wide
 * rounding and in its scalar tail; the weight gradient (dout transposed)
 * sees them the same way. */
static void test_bf16_matmul_rounds_operands(void **state)
{
    enum { NC = sizeof bf16_cases / sizeof *bf16_cases, NE = NC + 6, MC_ = 11 };
    kern_device_info info = {.kind = KERN_DEV_CPU, .name = "cpu0"};
    kern_device *d;
    acc_err err = {0};
    assert_int_equal(kern_device_open(&info, 2, &d, &err), 0);
    assert_int_equal(d->ops->set_precision(d, 1, &err), 0);
    static float x[NE * MC_], w[MC_ * MC_], out[NE * MC_], dw[MC_ * MC_];
    uint32_t in[NE], want[NE];
    for (int i = 0; i < NE; i++) {
        in[i] = i < NC ? bf16_cases[i].in : bf16_nans[i - NC];
        want[i] = i < NC ? bf16_cases[i].out : 0x7fc00000u;
    }
    memset(x, 0, sizeof x);
    memset(w, 0, sizeof w);
    for (int n = 0; n < NE; n++)
        x[n * MC_ + n % MC_] = from_bits(in[n]);
    for (int c = 0; c < MC_; c++)
        w[c * MC_ + c] = 1.0f;
    d->ops->matmul_fwd(d, out, x, w, NULL, NE, MC_, MC_);
    for (int n = 0; n < NE; n++) {
        uint32_t got = to_bits(out[n * MC_ + n % MC_]), wb = want[n];
        if (n >= NC) { /* NaN in, NaN out */
            assert_true(isnan(from_bits(got)));
            continue;
        }
        if (wb == 0x80000000u) /* -0 * 1 + 0 * 0: either zero */
            got &= 0x7fffffffu, wb = 0;
        if (got != wb)
            print_error("bf16 matmul of 0x%08x: 0x%08x, want 0x%08x\n", in[n], got, wb);
        assert_true(got == wb);
    }
    /* the weight gradient rounds dout: dw[o, c] += sum_n bf16(dout[n, o]) bf16(x'[n, c])
     * with dout = x (edge values), x' = rows of the identity (row n: 1 at n % MC_) */
    static float eye[NE * MC_];
    memset(eye, 0, sizeof eye);
    for (int n = 0; n < NE; n++)
        eye[n * MC_ + n % MC_] = 1.0f;
    for (int n = 0; n < NE; n++) {
        memset(dw, 0, sizeof dw);
        /* one row at a time, so each dw element is one product */
        d->ops->matmul_bwd(d, NULL, dw, NULL, x + n * MC_, eye + n * MC_, w, 1, MC_, MC_);
        int o = n % MC_;
        uint32_t got = to_bits(dw[o * MC_ + o]), wb = want[n];
        if (n >= NC) {
            assert_true(isnan(from_bits(got)));
            continue;
        }
        if (wb == 0x80000000u)
            got &= 0x7fffffffu, wb = 0;
        assert_true(got == wb);
    }
    /* the weight operand is rounded too: 1 x (1 + 2^-8) -> 1 */
    float one = 1.0f, wt = from_bits(0x3f808000u), o1;
    d->ops->matmul_fwd(d, &o1, &one, &wt, NULL, 1, 1, 1);
    assert_true(o1 == 1.0f);
    /* and back in fp32 it is not */
    assert_int_equal(d->ops->set_precision(d, 0, &err), 0);
    d->ops->matmul_fwd(d, &o1, &one, &wt, NULL, 1, 1, 1);
    assert_true(o1 == wt);
    kern_device_close(d);
}

/* sum_k bf16(a[i,k]) bf16(b[j,k]) in double, with sum_k |.| for the bound;
 * a row i at a + i*sai + k*sak, b row j at b + j*sbj + k*sbk */
static void ref_bf16_dot(const float *a, size_t sai, size_t sak, const float *b, size_t sbj,
                         size_t sbk, int I, int J, int K, int round, double *out, double *absum)
{
    for (int i = 0; i < I; i++)
        for (int j = 0; j < J; j++) {
            double s = 0, sa = 0;
            for (int k = 0; k < K; k++) {
                float av = a[i * sai + k * sak], bv = b[j * sbj + k * sbk];
                if (round)
                    av = kern_bf16_round(av), bv = kern_bf16_round(bv);
                s += (double)av * bv;
                sa += fabs((double)av * bv);
            }
            out[(size_t)i * J + j] = s;
            absum[(size_t)i * J + j] = sa;
        }
}

/* got - base vs want: fp32 accumulation of bf16 x bf16 products, so within
 * a few fp32 roundings of the sum of |terms| (and of the base added to) */
static void assert_fp32_of(const float *got, const float *base, const double *want,
                           const double *absum, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        double b = base ? base[i] : 0.0;
        double tol = 1e-5 * (absum[i] + fabs(b)) + 1e-30;
        if (!(fabs((double)got[i] - (b + want[i])) <= tol)) {
            print_error("%s[%zu]: got %.9g want %.9g (tol %.3g)\n", what, i, got[i],
                        b + want[i], tol);
            fail();
        }
    }
}

/* ||got - base - want|| / ||want|| */
static double rel_err(const float *got, const float *base, const double *want, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)got[i] - (base ? base[i] : 0.0) - want[i];
        num += e * e;
        den += want[i] * want[i];
    }
    return sqrt(num / den);
}

/* matmul_fwd / matmul_bwd in bf16, shapes past the 256-wide panels in
 * every dimension (rows, channels, output channels, and N as the weight
 * gradient's inner dimension): equal, to fp32 accumulation, to a double
 * reference on bf16-rounded operands, and a bf16-sized distance (not 0)
 * from the fp32 products. */
static void test_bf16_matmul(void **state)
{
    enum { MN = 300, MC = 264, MOC = 280 };
    kern_device_info info = {.kind = KERN_DEV_CPU, .name = "cpu0"};
    kern_device *d;
    acc_err err = {0};
    assert_int_equal(kern_device_open(&info, 2, &d, &err), 0);
    rng r;
    rng_seed(&r, 5, 3);
    float *x = malloc(sizeof(float) * MN * MC), *w = malloc(sizeof(float) * MOC * MC);
    float *b = malloc(sizeof(float) * MOC), *g = malloc(sizeof(float) * MN * MOC);
    float *out = malloc(sizeof(float) * MN * MOC), *out32 = malloc(sizeof(float) * MN * MOC);
    float *dx = malloc(sizeof(float) * MN * MC), *bx = malloc(sizeof(float) * MN * MC);
    float *dw = malloc(sizeof(float) * MOC * MC), *bw = malloc(sizeof(float) * MOC * MC);
    float *db = malloc(sizeof(float) * MOC), *bb = malloc(sizeof(float) * MOC);
    size_t big = (size_t)MN * MOC > (size_t)MOC * MC ? (size_t)MN * MOC : (size_t)MOC * MC;
    big = big > (size_t)MN * MC ? big : (size_t)MN * MC;
    double *want = malloc(sizeof(double) * big), *absum = malloc(sizeof(double) * big);
    double *want32 = malloc(sizeof(double) * big), *abs32 = malloc(sizeof(double) * big);
    assert_true(x && w && b && g && out && out32 && dx && bx && dw && bw && db && bb && want &&
                absum && want32 && abs32);
    fill(&r, x, NULL, (size_t)MN * MC, 1);
    fill(&r, w, NULL, (size_t)MOC * MC, 0.5);
    fill(&r, b, NULL, MOC, 0.5);
    fill(&r, g, NULL, (size_t)MN * MOC, 1);

    /* fp32 first: the untouched path, for the bitwise check after */
    d->ops->matmul_fwd(d, out32, x, w, b, MN, MC, MOC);
    uint64_t in_use = d->in_use;
    assert_int_equal(d->ops->set_precision(d, 1, &err), 0);
    assert_true(d->in_use == in_use); /* the scratch is outside the budget */

    /* forward: out = bf16(x) bf16(w)^T + b (bias in fp32) */
    d->ops->matmul_fwd(d, out, x, w, b, MN, MC, MOC);
    ref_bf16_dot(x, MC, 1, w, MC, 1, MN, MOC, MC, 1, want, absum);
    for (int n = 0; n < MN; n++)
        for (int o = 0; o < MOC; o++)
            want[(size_t)n * MOC + o] += b[o], absum[(size_t)n * MOC + o] += fabs(b[o]);
    assert_fp32_of(out, NULL, want, absum, (size_t)MN * MOC, "bf16 matmul out");
    ref_bf16_dot(x, MC, 1, w, MC, 1, MN, MOC, MC, 0, want32, abs32);
    for (int n = 0; n < MN; n++)
        for (int o = 0; o < MOC; o++)
            want32[(size_t)n * MOC + o] += b[o];
    double e_fwd = rel_err(out, NULL, want32, (size_t)MN * MOC);

    /* backward, accumulating onto a non-zero base */
    fill(&r, bx, NULL, (size_t)MN * MC, 1);
    fill(&r, bw, NULL, (size_t)MOC * MC, 1);
    fill(&r, bb, NULL, MOC, 1);
    memcpy(dx, bx, sizeof(float) * MN * MC);
    memcpy(dw, bw, sizeof(float) * MOC * MC);
    memcpy(db, bb, sizeof(float) * MOC);
    d->ops->matmul_bwd(d, dx, dw, db, g, x, w, MN, MC, MOC);
    /* dinp[n,c] += sum_o bf16(g[n,o]) bf16(w[o,c]) */
    ref_bf16_dot(g, MOC, 1, w, 1, MC, MN, MC, MOC, 1, want, absum);
    assert_fp32_of(dx, bx, want, absum, (size_t)MN * MC, "bf16 matmul dinp");
    ref_bf16_dot(g, MOC, 1, w, 1, MC, MN, MC, MOC, 0, want32, abs32);
    double e_dx = rel_err(dx, bx, want32, (size_t)MN * MC);
    /* dw[o,c] += sum_n bf16(g[n,o]) bf16(x[n,c]) */
    ref_bf16_dot(g, 1, MOC, x, 1, MC, MOC, MC, MN, 1, want, absum);
    assert_fp32_of(dw, bw, want, absum, (size_t)MOC * MC, "bf16 matmul dw");
    ref_bf16_dot(g, 1, MOC, x, 1, MC, MOC, MC, MN, 0, want32, abs32);
    double e_dw = rel_err(dw, bw, want32, (size_t)MOC * MC);
    /* dbias += colsum(dout), fp32 on the unrounded gradient */
    for (int o = 0; o < MOC; o++) {
        double s = 0, sa = 0;
        for (int n = 0; n < MN; n++)
            s += g[(size_t)n * MOC + o], sa += fabs(g[(size_t)n * MOC + o]);
        want[o] = s;
        absum[o] = sa;
    }
    assert_fp32_of(db, bb, want, absum, MOC, "bf16 matmul dbias");
    /* without dinp / dbias */
    memcpy(dw, bw, sizeof(float) * MOC * MC);
    d->ops->matmul_bwd(d, NULL, dw, NULL, g, x, w, MN, MC, MOC);
    ref_bf16_dot(g, 1, MOC, x, 1, MC, MOC, MC, MN, 1, want, absum);
    assert_fp32_of(dw, bw, want, absum, (size_t)MOC * MC, "bf16 matmul dw alone");

    /* the rounding really happened: a bf16-sized distance from fp32 */
    print_message("bf16 vs fp32 products, relative: out %.3g, dinp %.3g, dw %.3g\n", e_fwd,
                  e_dx, e_dw);
    assert_true(e_fwd > 1e-3 && e_fwd < 1e-2);
    assert_true(e_dx > 1e-3 && e_dx < 1e-2);
    assert_true(e_dw > 1e-3 && e_dw < 1e-2);

    /* back to fp32: bit for bit what it computed before */
    assert_int_equal(d->ops->set_precision(d, 0, &err), 0);
    d->ops->matmul_fwd(d, out, x, w, b, MN, MC, MOC);
    assert_memory_equal(out, out32, sizeof(float) * MN * MOC);
    kern_device_close(d);
    free(x), free(w), free(b), free(g), free(out), free(out32), free(dx), free(bx);
    free(dw), free(bw), free(db), free(bb), free(want), free(absum), free(want32), free(abs32);
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
    double qkv[N * 3 * C], g[N * C], out[N * C], lse[B * NH * T];
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
                c->lse[(b * NH + h) * T + t] = mx + log(sum);
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
    float qkv[N * 3 * C], g[N * C], out[N * C], lse[B * NH * T];
    float scratch[KERN_ATT_SCRATCH(T, NH)];
    float dqkv[N * 3 * C], base[N * 3 * C];
    fill(&f->r, qkv, c.qkv, N * 3 * C, 1);
    fill(&f->r, g, c.g, N * C, 1);
    /* the scratch holds nothing between the calls: garbage must not matter */
    for (size_t i = 0; i < KERN_ATT_SCRATCH(T, NH); i++)
        scratch[i] = 1e30f;
    d->ops->attention_fwd(d, out, lse, scratch, qkv, B, T, C, NH);
    ref_attention(&c);
    assert_close(out, c.out, N * C, 1e-5, "attention out");
    /* the rows' log-sum-exp, all the backward keeps (causal: u <= t only) */
    assert_close(lse, c.lse, B * NH * T, 1e-5, "attention lse");
    fill(&f->r, base, NULL, N * 3 * C, 1);
    memcpy(dqkv, base, sizeof dqkv);
    for (size_t i = 0; i < KERN_ATT_SCRATCH(T, NH); i++)
        scratch[i] = -1e30f;
    d->ops->attention_bwd(d, dqkv, scratch, g, qkv, lse, out, B, T, C, NH);
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
        cmocka_unit_test(test_bf16_round), cmocka_unit_test(test_bf16_matmul_rounds_operands),
        cmocka_unit_test(test_bf16_matmul),
        cmocka_unit_test(test_narrow_bf16),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
