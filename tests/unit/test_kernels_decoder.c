/* Qwen3's and Gemma 2's CPU ops (kern_device.h, the end of kern_ops):
 *
 *  - the options that are off leave the old ops' bits alone: RMSNorm with
 *    offset 0 is rmsnorm_fwd / _bwd, attention with options {0, 0, 0},
 *    NULL, the default scale spelled out or a window as long as the
 *    sequence is gqa_attention_pos_fwd / _bwd, bit for bit;
 *  - the new ops are the old ones composed, bit for bit where the
 *    arithmetic is the same: RMSNorm with offset 1 is RMSNorm with w + 1,
 *    the GELU gate is gelu_fwd(gate) * up and its backward gelu_bwd's;
 *  - soft-capping against double-precision tanh, its backward in place;
 *  - attention with every option on (a query scale, capped scores, a
 *    window of 3, packed documents, GQA): the forward against a double
 *    reference written here, the backward against central finite
 *    differences of that reference (step 1e-5, 1e-4 of the largest
 *    gradient, as test_kernels_llama.c); a window of 1 makes each query
 *    see only itself;
 *  - kern_decoder_ops_check names a missing op.
 * The PyTorch comparison of the same ops is kernels_decoder_torch
 * (tests/support/qwen3_gemma2_ops_torch.py).
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

enum { B = 2, T = 7, NH = 4, NKV = 2, HS = 8, C = 24 };
#define N (B * T)
#define QN (N * NH * HS)
#define KN (N * NKV * HS)
#define LN (B * NH * T)

static kern_device *dev;
static rng r;

static int setup(void **state)
{
    (void)state;
    kern_device_info info = {.kind = KERN_DEV_CPU, .index = 0, .name = "cpu0", .mem_total = 0};
    acc_err err = {0};
    rng_seed(&r, 19, 6);
    return kern_device_open(&info, 2, &dev, &err);
}

static int teardown(void **state)
{
    (void)state;
    kern_device_close(dev);
    return 0;
}

static void fill(float *x, size_t n, double scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(scale * rng_normal(&r));
}

/* max |got - want| <= tol * max(max |want|, 1) */
static void assert_close(const float *got, const double *want, size_t n, double tol,
                         const char *what)
{
    double md = 0.0, mw = 1.0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        double dd = fabs((double)got[i] - want[i]);
        if (!(dd <= md))
            md = dd, at = i;
        mw = fmax(mw, fabs(want[i]));
    }
    if (!(md <= tol * mw))
        fail_msg("%s: [%zu] %.9g, want %.9g (|diff| %.3g > %.3g)", what, at, (double)got[at],
                 want[at], md, tol * mw);
}

/* ------------------------------------------------------------- RMSNorm */

static void test_rmsnorm_offset(void **state)
{
    (void)state;
    static float x[N * C], w[C], w1[C], g[N * C], o1[N * C], o2[N * C], s1[N], s2[N];
    static float dx1[N * C], dx2[N * C], dw1[C], dw2[C];
    fill(x, N * C, 2);
    fill(w, C, 0.5);
    fill(g, N * C, 1);
    for (int c = 0; c < C; c++)
        w1[c] = w[c] + 1.0f;
    for (int ofs = 0; ofs <= 1; ofs++) { /* offset 0: w itself; offset 1: w + 1 */
        const float *wref = ofs ? w1 : w;
        memset(dx1, 0, sizeof dx1), memset(dx2, 0, sizeof dx2);
        memset(dw1, 0, sizeof dw1), memset(dw2, 0, sizeof dw2);
        dev->ops->rmsnorm_ofs_fwd(dev, o1, s1, x, w, (float)ofs, 1e-6f, N, C);
        dev->ops->rmsnorm_fwd(dev, o2, s2, x, wref, 1e-6f, N, C);
        assert_memory_equal(o1, o2, sizeof o1);
        assert_memory_equal(s1, s2, sizeof s1);
        dev->ops->rmsnorm_ofs_bwd(dev, dx1, dw1, g, x, w, (float)ofs, s1, N, C);
        dev->ops->rmsnorm_bwd(dev, dx2, dw2, g, x, wref, s2, N, C);
        assert_memory_equal(dx1, dx2, sizeof dx1);
        assert_memory_equal(dw1, dw2, sizeof dw1);
    }
}

/* ------------------------------------------------ GELU gate, soft-capping */

static void test_geglu_is_gelu_times_up(void **state)
{
    (void)state;
    enum { M = 300 };
    static float gate[M], up[M], g[M], out[M], gl[M], gu[M], dg1[M], du1[M], dg2[M];
    fill(gate, M, 3);
    fill(up, M, 1);
    fill(g, M, 1);
    dev->ops->geglu_fwd(dev, out, gate, up, M);
    dev->ops->gelu_fwd(dev, gl, gate, M);
    for (int i = 0; i < M; i++) {
        float want = gl[i] * up[i];
        assert_memory_equal(&out[i], &want, sizeof want);
        gu[i] = g[i] * up[i];
    }
    memset(dg1, 0, sizeof dg1), memset(du1, 0, sizeof du1), memset(dg2, 0, sizeof dg2);
    dev->ops->geglu_bwd(dev, dg1, du1, g, gate, up, M);
    dev->ops->gelu_bwd(dev, dg2, gate, gu, M);
    assert_memory_equal(dg1, dg2, sizeof dg1);
    for (int i = 0; i < M; i++) /* == : accumulated onto +0, a -0 product reads +0 */
        assert_true(du1[i] == g[i] * gl[i]);
    /* and it accumulates */
    dev->ops->geglu_bwd(dev, dg1, du1, g, gate, up, M);
    for (int i = 0; i < M; i++)
        assert_true(fabsf(dg1[i] - 2.0f * dg2[i]) <= 1e-6f * fmaxf(1.0f, fabsf(dg2[i])));
}

static void test_softcap(void **state)
{
    (void)state;
    enum { M = 500 };
    const float cap = 30.0f;
    static float x[M], y[M], g[M], dx[M];
    static double want[M];
    fill(x, M, 40); /* well past the cap */
    fill(g, M, 1);
    dev->ops->softcap_fwd(dev, y, x, cap, M);
    for (int i = 0; i < M; i++) {
        want[i] = cap * tanh((double)x[i] / cap);
        assert_true(fabsf(y[i]) <= cap);
    }
    assert_close(y, want, M, 1e-6, "softcap_fwd");
    for (int i = 0; i < M; i++) {
        double th = tanh((double)x[i] / cap);
        want[i] = g[i] * (1.0 - th * th);
    }
    memcpy(dx, g, sizeof dx);
    dev->ops->softcap_bwd(dev, dx, dx, x, cap, M); /* in place: overwritten */
    assert_close(dx, want, M, 1e-6, "softcap_bwd (in place)");
    dev->ops->softcap_fwd(dev, x, x, cap, M); /* in place */
    assert_memory_equal(x, y, sizeof x);
}

/* ----------------------------------------------------------- attention */

typedef struct att_in {
    float q[QN], k[KN], v[KN], g[QN];
    int pos[N];
} att_in;

typedef struct att_out {
    float out[QN], lse[LN], dq[QN], dk[KN], dv[KN];
} att_out;

static float scratch[KERN_ATT_SCRATCH(T, NH)];

static void att_inputs(att_in *in)
{
    fill(in->q, QN, 1.5);
    fill(in->k, KN, 1.5);
    fill(in->v, KN, 1);
    fill(in->g, QN, 1);
    for (int t = 0; t < T; t++) {
        in->pos[t] = t < 4 ? t : t - 4; /* two documents in sequence 0 */
        in->pos[T + t] = t;
    }
}

static void att_run(const att_in *in, const kern_att_opts *o, int with_opts, att_out *res)
{
    memset(res->dq, 0, sizeof res->dq);
    memset(res->dk, 0, sizeof res->dk);
    memset(res->dv, 0, sizeof res->dv);
    if (with_opts) {
        dev->ops->gqa_attention_opt_fwd(dev, res->out, res->lse, scratch, in->q, in->k, in->v,
                                        in->pos, o, B, T, NH, NKV, HS);
        dev->ops->gqa_attention_opt_bwd(dev, res->dq, res->dk, res->dv, scratch, in->g, in->q,
                                        in->k, in->v, res->lse, res->out, in->pos, o, B, T, NH,
                                        NKV, HS);
    } else {
        dev->ops->gqa_attention_pos_fwd(dev, res->out, res->lse, scratch, in->q, in->k, in->v,
                                        in->pos, B, T, NH, NKV, HS);
        dev->ops->gqa_attention_pos_bwd(dev, res->dq, res->dk, res->dv, scratch, in->g, in->q,
                                        in->k, in->v, res->lse, res->out, in->pos, B, T, NH,
                                        NKV, HS);
    }
}

static void test_attention_options_off(void **state)
{
    (void)state;
    static att_in in;
    static att_out plain, got;
    att_inputs(&in);
    att_run(&in, NULL, 0, &plain);
    const kern_att_opts off[] = {{0, 0, 0}, {1.0f / sqrtf((float)HS), 0, 0}, {0, 0, T},
                                 {0, -1.0f, -3}};
    att_run(&in, NULL, 1, &got);
    assert_memory_equal(&got, &plain, sizeof got);
    for (size_t i = 0; i < sizeof off / sizeof *off; i++) {
        att_run(&in, &off[i], 1, &got);
        assert_memory_equal(&got, &plain, sizeof got);
    }
}

/* A window of one key: each query sees itself only, so out = its v and
 * lse = its own (scaled, capped) score. */
static void test_attention_window_one(void **state)
{
    (void)state;
    static att_in in;
    static att_out got;
    att_inputs(&in);
    kern_att_opts o = {.scale = 0.5f, .softcap = 3.0f, .window = 1};
    att_run(&in, &o, 1, &got);
    for (int n = 0; n < N; n++)
        for (int h = 0; h < NH; h++) {
            const float *q = in.q + ((size_t)n * NH + h) * HS;
            const float *k = in.k + ((size_t)n * NKV + h / (NH / NKV)) * HS;
            const float *v = in.v + ((size_t)n * NKV + h / (NH / NKV)) * HS;
            double s = 0.0;
            for (int i = 0; i < HS; i++) {
                s += (double)q[i] * k[i];
                assert_float_equal(got.out[((size_t)n * NH + h) * HS + i], v[i], 1e-6);
            }
            double want = 3.0 * tanh(s * 0.5 / 3.0);
            int b = n / T, t = n % T;
            assert_float_equal(got.lse[((size_t)b * NH + h) * T + t], want, 1e-5);
        }
    for (size_t i = 0; i < QN; i++) /* the softmax of one key has no gradient */
        assert_float_equal(got.dq[i], 0.0f, 1e-6);
}

/* double reference: loss = sum(out * g) for q, k, v in double */
static double ref_forward(const double *q, const double *k, const double *v, const att_in *in,
                          const kern_att_opts *o, double *out)
{
    double loss = 0.0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                int kvh = h / (NH / NKV), lo = t - in->pos[b * T + t];
                if (t - o->window + 1 > lo)
                    lo = t - o->window + 1;
                double s[T], mx = -INFINITY, sum = 0.0;
                const double *qt = q + (((size_t)b * T + t) * NH + h) * HS;
                for (int u = lo; u <= t; u++) {
                    const double *ku = k + (((size_t)b * T + u) * NKV + kvh) * HS;
                    double dot = 0.0;
                    for (int i = 0; i < HS; i++)
                        dot += qt[i] * ku[i];
                    s[u] = o->softcap * tanh(dot * o->scale / o->softcap);
                    mx = fmax(mx, s[u]);
                }
                for (int u = lo; u <= t; u++)
                    sum += exp(s[u] - mx);
                for (int i = 0; i < HS; i++) {
                    double acc = 0.0;
                    for (int u = lo; u <= t; u++)
                        acc += exp(s[u] - mx) / sum * v[(((size_t)b * T + u) * NKV + kvh) * HS + i];
                    size_t at = (((size_t)b * T + t) * NH + h) * HS + i;
                    if (out != NULL)
                        out[at] = acc;
                    loss += acc * in->g[at];
                }
            }
    return loss;
}

/* central differences of the double reference in each element of x */
static void ref_grad(double *q, double *k, double *v, double *x, size_t n, const att_in *in,
                     const kern_att_opts *o, double *grad)
{
    const double h = 1e-5;
    for (size_t i = 0; i < n; i++) {
        double keep = x[i];
        x[i] = keep + h;
        double up = ref_forward(q, k, v, in, o, NULL);
        x[i] = keep - h;
        double dn = ref_forward(q, k, v, in, o, NULL);
        x[i] = keep;
        grad[i] = (up - dn) / (2 * h);
    }
}

static void test_attention_options_gradients(void **state)
{
    (void)state;
    static att_in in;
    static att_out got;
    static double q[QN], k[KN], v[KN], want[QN];
    att_inputs(&in);
    for (size_t i = 0; i < QN; i++)
        q[i] = in.q[i];
    for (size_t i = 0; i < KN; i++)
        k[i] = in.k[i], v[i] = in.v[i];
    kern_att_opts o = {.scale = 0.3f, .softcap = 2.0f, .window = 3};
    att_run(&in, &o, 1, &got);
    ref_forward(q, k, v, &in, &o, want);
    assert_close(got.out, want, QN, 1e-5, "attention with options: out");
    ref_grad(q, k, v, q, QN, &in, &o, want);
    assert_close(got.dq, want, QN, 1e-4, "attention with options: dq");
    ref_grad(q, k, v, k, KN, &in, &o, want);
    assert_close(got.dk, want, KN, 1e-4, "attention with options: dk");
    ref_grad(q, k, v, v, KN, &in, &o, want);
    assert_close(got.dv, want, KN, 1e-4, "attention with options: dv");
}

/* ------------------------------------------------------ ops availability */

static void test_decoder_ops_check(void **state)
{
    (void)state;
    acc_err err = {0};
    assert_int_equal(kern_decoder_ops_check(dev, &err), 0);
    kern_ops lacking = *dev->ops;
    lacking.geglu_bwd = NULL;
    kern_device fake = *dev;
    fake.ops = &lacking;
    assert_int_equal(kern_decoder_ops_check(&fake, &err), ACC_EDEVICE);
    assert_non_null(strstr(err.msg, "geglu_bwd"));
    assert_int_equal(kern_llama_ops_check(&fake, &err), 0); /* the LLaMA set is whole */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm_offset),
        cmocka_unit_test(test_geglu_is_gelu_times_up),
        cmocka_unit_test(test_softcap),
        cmocka_unit_test(test_attention_options_off),
        cmocka_unit_test(test_attention_window_one),
        cmocka_unit_test(test_attention_options_gradients),
        cmocka_unit_test(test_decoder_ops_check),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
