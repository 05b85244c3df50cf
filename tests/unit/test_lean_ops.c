/* Lean activations (issue 20) against today's kernels, on CPU devices:
 *   - the tiled attention (attention_lean_fwd / _bwd, no T x T buffer)
 *     gives the outputs, lse and gradients of the T x T kernels
 *     (gqa_attention_opt_fwd / _bwd; GPT-2's fused attention_fwd / _bwd)
 *     within 1e-6 relative (2-norm of the difference over the 2-norm of
 *     today's result), on LLaMA and GPT-2 shapes: GQA, multi-head, odd T and
 *     T not a multiple of the tile, several tiles, a sliding window,
 *     soft-capped scores with a query scale, packed documents;
 *   - garbage in the lean scratch does not matter;
 *   - a whole model (LLaMA with GQA, GPT-2 with its tied head) in lean mode
 *     (the tiled attention and the chunked LM head + cross-entropy) gives
 *     the loss and every weight gradient (the head's and, through dx, all
 *     others) of the same model without it, within 1e-6 relative, with T
 *     and the number of rows not multiples of the tile or the chunk; and
 *     its activations are smaller. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern_device.h"
#include "model.h"
#include "rng.h"

#define TOL 1e-6

static kern_device *open_cpu(int threads)
{
    kern_device_info info = {.kind = KERN_DEV_CPU, .index = 0, .name = "cpu0", .mem_total = 0};
    kern_device *d = NULL;
    acc_err err = {0};
    assert_int_equal(kern_device_open(&info, threads, &d, &err), 0);
    return d;
}

static float *randn(rng *r, size_t n, double s)
{
    float *x = malloc(n * sizeof *x + 1);
    assert_non_null(x);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(rng_normal(r) * s);
    return x;
}

static float *zeros(size_t n)
{
    float *x = calloc(n + 1, sizeof *x);
    assert_non_null(x);
    return x;
}

/* ||a - b|| / ||b|| */
static double rel(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)a[i] - (double)b[i];
        num += e * e;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void expect_close(const char *what, const char *name, const float *a, const float *b,
                         size_t n)
{
    double r = rel(a, b, n);
    if (!(r <= TOL))
        fail_msg("%s: %s differs by %.3g relative (tolerance %g)", what, name, r, TOL);
}

/* one attention case: shapes and options */
typedef struct att_case {
    const char *name;
    int B, T, NH, NKV, hs;
    kern_att_opts opts;
    int packed; /* documents restart every few tokens */
} att_case;

static void run_gqa_case(kern_device *d, const att_case *c, rng *r)
{
    size_t N = (size_t)c->B * c->T, qn = N * c->NH * c->hs, kn = N * c->NKV * c->hs;
    size_t ln = (size_t)c->B * c->NH * c->T;
    float *q = randn(r, qn, 1.0), *k = randn(r, kn, 1.0), *v = randn(r, kn, 1.0);
    float *dout = randn(r, qn, 1.0);
    float *o1 = zeros(qn), *o2 = zeros(qn), *l1 = zeros(ln), *l2 = zeros(ln);
    float *dq1 = randn(r, qn, 0.1), *dk1 = randn(r, kn, 0.1), *dv1 = randn(r, kn, 0.1);
    float *dq2 = malloc(qn * sizeof *dq2 + 1), *dk2 = malloc(kn * sizeof *dk2 + 1),
          *dv2 = malloc(kn * sizeof *dv2 + 1);
    assert_true(dq2 && dk2 && dv2);
    memcpy(dq2, dq1, qn * sizeof *dq2); /* both accumulate into the same start */
    memcpy(dk2, dk1, kn * sizeof *dk2);
    memcpy(dv2, dv1, kn * sizeof *dv2);
    int *pos = NULL;
    if (c->packed) {
        pos = malloc(N * sizeof *pos);
        assert_non_null(pos);
        for (size_t i = 0; i < N; i++) /* documents of 5, 40, 77, ... tokens */
            pos[i] = (i % (size_t)c->T == 0 || pos[i - 1] + 1 >= 5 + 35 * (int)(i % 3))
                         ? 0
                         : pos[i - 1] + 1;
    }
    float *full = zeros(KERN_ATT_SCRATCH(c->T, c->NH));
    size_t ls = KERN_ATT_LEAN_SCRATCH(c->T, c->NH);
    float *lean = malloc(ls * sizeof *lean + 1);
    assert_non_null(lean);
    for (size_t i = 0; i < ls; i++)
        lean[i] = 1e30f; /* garbage in the scratch must not matter */
    int ldq = c->NH * c->hs, ldkv = c->NKV * c->hs;
    d->ops->gqa_attention_opt_fwd(d, o1, l1, full, q, k, v, pos, &c->opts, c->B, c->T, c->NH,
                                  c->NKV, c->hs);
    d->ops->attention_lean_fwd(d, o2, l2, lean, q, k, v, ldq, ldkv, pos, &c->opts, c->B, c->T,
                               c->NH, c->NKV, c->hs);
    expect_close(c->name, "out", o2, o1, qn);
    expect_close(c->name, "lse", l2, l1, ln);
    for (size_t i = 0; i < ls; i++)
        lean[i] = -1e30f;
    d->ops->gqa_attention_opt_bwd(d, dq1, dk1, dv1, full, dout, q, k, v, l1, o1, pos, &c->opts,
                                  c->B, c->T, c->NH, c->NKV, c->hs);
    d->ops->attention_lean_bwd(d, dq2, dk2, dv2, lean, dout, q, k, v, l1, o1, ldq, ldkv, pos,
                               &c->opts, c->B, c->T, c->NH, c->NKV, c->hs);
    expect_close(c->name, "dq", dq2, dq1, qn);
    expect_close(c->name, "dk", dk2, dk1, kn);
    expect_close(c->name, "dv", dv2, dv1, kn);
    print_message("%-28s out %.2g lse %.2g dq %.2g dk %.2g dv %.2g\n", c->name, rel(o2, o1, qn),
                  rel(l2, l1, ln), rel(dq2, dq1, qn), rel(dk2, dk1, kn), rel(dv2, dv1, kn));
    float *bufs[] = {q, k, v, dout, o1, o2, l1, l2, dq1, dk1, dv1, dq2, dk2, dv2, full, lean};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        free(bufs[i]);
    free(pos);
}

static void test_gqa_attention(void **state)
{
    (void)state;
    kern_device *d = open_cpu(3);
    rng r;
    rng_seed(&r, 20, 1);
    static const att_case cases[] = {
        {"llama gqa T=131", 2, 131, 8, 2, 16, {0, 0, 0}, 0},
        {"llama mha T=64", 1, 64, 4, 4, 32, {0, 0, 0}, 0},
        {"llama gqa T=5", 3, 5, 4, 1, 8, {0, 0, 0}, 0},
        {"llama T=200 packed", 2, 200, 4, 2, 16, {0, 0, 0}, 1},
        {"window 37 T=150", 2, 150, 4, 2, 16, {0, 0, 37}, 0},
        {"window 64 T=129", 1, 129, 2, 1, 16, {0, 0, 64}, 0},
        {"softcap+scale T=97", 2, 97, 4, 2, 16, {0.3f, 5.0f, 0}, 0},
        {"softcap+window+packed", 2, 190, 4, 2, 16, {0.2f, 4.0f, 50}, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        run_gqa_case(d, &cases[i], &r);
    kern_device_close(d);
}

/* GPT-2's fused layout through the lean op's strides */
static void test_gpt2_attention(void **state)
{
    (void)state;
    kern_device *d = open_cpu(2);
    rng r;
    rng_seed(&r, 20, 2);
    static const int shapes[][4] = {{2, 67, 4, 64}, {1, 130, 12, 96}, {2, 3, 2, 8}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int B = shapes[s][0], T = shapes[s][1], NH = shapes[s][2], C = shapes[s][3];
        size_t N = (size_t)B * T, ln = (size_t)B * NH * T;
        float *qkv = randn(&r, N * 3 * C, 1.0), *dout = randn(&r, N * C, 1.0);
        float *o1 = zeros(N * C), *o2 = zeros(N * C), *l1 = zeros(ln), *l2 = zeros(ln);
        float *d1 = randn(&r, N * 3 * C, 0.1), *d2 = malloc(N * 3 * C * sizeof *d2);
        assert_non_null(d2);
        memcpy(d2, d1, N * 3 * C * sizeof *d2);
        float *full = zeros(KERN_ATT_SCRATCH(T, NH)), *lean = zeros(KERN_ATT_LEAN_SCRATCH(T, NH));
        d->ops->attention_fwd(d, o1, l1, full, qkv, B, T, C, NH);
        d->ops->attention_lean_fwd(d, o2, l2, lean, qkv, qkv + C, qkv + 2 * C, 3 * C, 3 * C,
                                   NULL, NULL, B, T, NH, NH, C / NH);
        char name[64];
        snprintf(name, sizeof name, "gpt2 B=%d T=%d NH=%d C=%d", B, T, NH, C);
        expect_close(name, "out", o2, o1, N * C);
        expect_close(name, "lse", l2, l1, ln);
        d->ops->attention_bwd(d, d1, full, dout, qkv, l1, o1, B, T, C, NH);
        d->ops->attention_lean_bwd(d, d2, d2 + C, d2 + 2 * C, lean, dout, qkv, qkv + C,
                                   qkv + 2 * C, l1, o1, 3 * C, 3 * C, NULL, NULL, B, T, NH, NH,
                                   C / NH);
        expect_close(name, "dqkv", d2, d1, N * 3 * C);
        print_message("%-28s out %.2g dqkv %.2g\n", name, rel(o2, o1, N * C),
                      rel(d2, d1, N * 3 * C));
        float *bufs[] = {qkv, dout, o1, o2, l1, l2, d1, d2, full, lean};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
            free(bufs[i]);
    }
    kern_device_close(d);
}

/* ---- whole models, lean against not */

typedef struct model_case {
    const char *name, *arch;
    int B, T, L, NH, NKV, C, V;
    int gemma_like; /* soft-capped scores and logits, a sliding layer */
} model_case;

/* loss and gradients of one forward + backward of a seeded model */
static double model_step(const model_case *c, bool lean_acts, float **grads, size_t *ngrad,
                         uint64_t *act_bytes)
{
    kern_device *d = open_cpu(2);
    spec_model sm;
    memset(&sm, 0, sizeof sm);
    snprintf(sm.arch, sizeof sm.arch, "%s", c->arch);
    sm.n_layer = c->L;
    sm.n_head = c->NH;
    sm.n_kv_head = c->NKV;
    sm.n_embd = c->C;
    sm.seq_len = c->T;
    sm.vocab_size = c->V;
    sm.padded_vocab_size = (c->V + 7) / 8 * 8; /* padded columns too */
    model_config cfg;
    acc_err err = {0};
    if (model_config_from_spec(&sm, &cfg, &err) != 0)
        fail_msg("%s: %s", c->name, err.msg);
    if (c->gemma_like) {
        cfg.attn_logit_softcapping = 3.0;
        cfg.final_logit_softcapping = 2.0;
        cfg.query_pre_attn_scalar = 12.0;
        cfg.sliding_window = 37;
        cfg.sliding_layers[0] = 1; /* layer 0 slides */
    }
    cfg.lean_acts = lean_acts;
    cfg.lean_chunk = 100; /* several chunks, the last a partial one */
    model *m = NULL;
    if (model_create(d, &cfg, c->B, c->T, &m, &err) != 0)
        fail_msg("%s: %s", c->name, err.msg);
    assert_int_equal(model_init_seed(m, 7, &err), 0);
    size_t N = (size_t)c->B * c->T;
    int *tok = malloc(N * sizeof *tok), *tgt = malloc(N * sizeof *tgt);
    float *w = malloc(N * sizeof *w);
    assert_true(tok && tgt && w);
    rng r;
    rng_seed(&r, 20, 3);
    for (size_t i = 0; i < N; i++) {
        tok[i] = (int)rng_below(&r, (uint64_t)c->V);
        tgt[i] = (int)rng_below(&r, (uint64_t)c->V);
        w[i] = i % 5 == 3 ? 0.0f : 1.0f / (float)N; /* some tokens without loss */
    }
    double loss = 0;
    model_forward(m, tok, tgt, w, c->B, 1, &loss);
    model_backward(m, c->B);
    *ngrad = m->ngrad;
    *grads = malloc(m->ngrad * sizeof **grads);
    assert_non_null(*grads);
    d->ops->download(d, *grads, m->grads, m->ngrad * sizeof **grads);
    *act_bytes = m->act_bytes;
    free(tok);
    free(tgt);
    free(w);
    model_free(m);
    kern_device_close(d);
    return loss;
}

static void test_models(void **state)
{
    (void)state;
    static const model_case cases[] = {
        {"llama gqa", "llama", 4, 70, 2, 4, 2, 64, 300, 0},
        {"llama mha odd T", "llama", 3, 97, 1, 2, 2, 32, 77, 0},
        {"gpt2 tied head", "gpt2", 4, 70, 2, 4, 0, 64, 300, 0},
        {"gemma-like caps+window", "llama", 3, 90, 2, 4, 2, 48, 100, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const model_case *c = &cases[i];
        float *g0, *g1;
        size_t n0, n1;
        uint64_t a0, a1;
        double l0 = model_step(c, false, &g0, &n0, &a0);
        double l1 = model_step(c, true, &g1, &n1, &a1);
        assert_int_equal(n0, n1);
        double lr = fabs(l1 - l0) / fabs(l0);
        if (!(lr <= TOL))
            fail_msg("%s: loss %.9g lean vs %.9g (rel %.3g)", c->name, l1, l0, lr);
        expect_close(c->name, "weight gradients", g1, g0, n0);
        assert_true(a1 < a0); /* no T x T scratch, one chunk of logits at most */
        print_message("%-28s loss rel %.2g grads rel %.2g acts %llu -> %llu bytes\n", c->name,
                      lr, rel(g1, g0, n0), (unsigned long long)a0, (unsigned long long)a1);
        free(g0);
        free(g1);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gqa_attention),
        cmocka_unit_test(test_gpt2_attention),
        cmocka_unit_test(test_models),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
