/* model_gpt2 against an independent double-precision GPT-2 written here
 * from the architecture's description (not from the engine's code):
 *   - an llm.c-format checkpoint written by this test loads and gives the
 *     reference logits;
 *   - the whole model's gradient equals central finite differences of the
 *     reference loss, every parameter;
 *   - padded vocabulary rows get no probability and no gradient;
 *   - bad checkpoints are refused with the field named.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kern_device.h"
#include "model_gpt2.h"
#include "rng.h"

enum { L = 2, NH = 2, C = 8, V = 11, VP = 16, MAXT = 9, T = 6, B = 2 };

/* ------------------------------------------------ the reference model */

typedef struct ref_layout {
    size_t wte, wpe, ln1w, ln1b, qkvw, qkvb, apw, apb, ln2w, ln2b, fcw, fcb, fpw, fpb, lnfw,
        lnfb, total;
} ref_layout;

static ref_layout layout(void)
{
    ref_layout o;
    size_t at = 0;
#define TAKE(f, n) (o.f = at, at += (n))
    TAKE(wte, VP * C);
    TAKE(wpe, MAXT * C);
    TAKE(ln1w, L * C);
    TAKE(ln1b, L * C);
    TAKE(qkvw, L * 3 * C * C);
    TAKE(qkvb, L * 3 * C);
    TAKE(apw, L * C * C);
    TAKE(apb, L * C);
    TAKE(ln2w, L * C);
    TAKE(ln2b, L * C);
    TAKE(fcw, L * 4 * C * C);
    TAKE(fcb, L * 4 * C);
    TAKE(fpw, L * C * 4 * C);
    TAKE(fpb, L * C);
    TAKE(lnfw, C);
    TAKE(lnfb, C);
#undef TAKE
    o.total = at;
    return o;
}

static void ref_ln(double *out, const double *x, const double *w, const double *b)
{
    double m = 0, v = 0;
    for (int i = 0; i < C; i++)
        m += x[i];
    m /= C;
    for (int i = 0; i < C; i++)
        v += (x[i] - m) * (x[i] - m);
    v /= C;
    for (int i = 0; i < C; i++)
        out[i] = (x[i] - m) / sqrt(v + 1e-5) * w[i] + b[i];
}

/* y[o] = b[o] + sum_i W[o][i] x[i], W is [out][in] */
static void ref_linear(double *y, const double *x, const double *W, const double *b, int in,
                       int out)
{
    for (int o = 0; o < out; o++) {
        double s = b ? b[o] : 0.0;
        for (int i = 0; i < in; i++)
            s += W[(size_t)o * in + i] * x[i];
        y[o] = s;
    }
}

/* logits[B][T][VP] from double parameters p */
static void ref_forward(const double *p, const int *tok, double *logits)
{
    ref_layout o = layout();
    static double x[B][T][C], h[B][T][C], qkv[B][T][3 * C], y[B][T][C], tmp[4 * C];
    int hs = C / NH;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int i = 0; i < C; i++)
                x[b][t][i] = p[o.wte + (size_t)tok[b * T + t] * C + i] + p[o.wpe + (size_t)t * C + i];
    for (int l = 0; l < L; l++) {
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                ref_ln(h[b][t], x[b][t], p + o.ln1w + l * C, p + o.ln1b + l * C);
                ref_linear(qkv[b][t], h[b][t], p + o.qkvw + (size_t)l * 3 * C * C,
                           p + o.qkvb + l * 3 * C, C, 3 * C);
            }
        for (int b = 0; b < B; b++)
            for (int hd = 0; hd < NH; hd++)
                for (int t = 0; t < T; t++) {
                    double w[T], mx = -1e300, z = 0;
                    for (int u = 0; u <= t; u++) {
                        double s = 0;
                        for (int i = 0; i < hs; i++)
                            s += qkv[b][t][hd * hs + i] * qkv[b][u][C + hd * hs + i];
                        w[u] = s / sqrt((double)hs);
                        mx = fmax(mx, w[u]);
                    }
                    for (int u = 0; u <= t; u++)
                        z += (w[u] = exp(w[u] - mx));
                    for (int i = 0; i < hs; i++) {
                        double s = 0;
                        for (int u = 0; u <= t; u++)
                            s += w[u] / z * qkv[b][u][2 * C + hd * hs + i];
                        y[b][t][hd * hs + i] = s;
                    }
                }
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                double a[C];
                ref_linear(a, y[b][t], p + o.apw + (size_t)l * C * C, p + o.apb + l * C, C, C);
                for (int i = 0; i < C; i++)
                    x[b][t][i] += a[i];
                ref_ln(h[b][t], x[b][t], p + o.ln2w + l * C, p + o.ln2b + l * C);
                ref_linear(tmp, h[b][t], p + o.fcw + (size_t)l * 4 * C * C, p + o.fcb + l * 4 * C,
                           C, 4 * C);
                for (int i = 0; i < 4 * C; i++) {
                    double u = tmp[i];
                    tmp[i] = 0.5 * u * (1 + tanh(sqrt(2 / M_PI) * (u + 0.044715 * u * u * u)));
                }
                ref_linear(a, tmp, p + o.fpw + (size_t)l * C * 4 * C, p + o.fpb + l * C, 4 * C, C);
                for (int i = 0; i < C; i++)
                    x[b][t][i] += a[i];
            }
    }
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            ref_ln(h[b][t], x[b][t], p + o.lnfw, p + o.lnfb);
            ref_linear(logits + ((size_t)b * T + t) * VP, h[b][t], p + o.wte, NULL, C, VP);
        }
}

/* mean cross-entropy over the real vocabulary */
static double ref_loss(const double *p, const int *tok, const int *tgt)
{
    static double logits[B * T * VP];
    ref_forward(p, tok, logits);
    double s = 0;
    for (int n = 0; n < B * T; n++) {
        const double *l = logits + (size_t)n * VP;
        double mx = -1e300, z = 0;
        for (int v = 0; v < V; v++)
            mx = fmax(mx, l[v]);
        for (int v = 0; v < V; v++)
            z += exp(l[v] - mx);
        s += log(z) + mx - l[tgt[n]];
    }
    return s / (B * T);
}

/* ------------------------------------------------ fixtures */

typedef struct fx {
    char path[64];
    float *params;
    double *pd;
    size_t n;
    int tok[B * T], tgt[B * T];
} fx;

static void write_checkpoint(const char *path, const int32_t *hdr, const float *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    int32_t h[256] = {0};
    memcpy(h, hdr, 8 * sizeof *h);
    assert_int_equal(fwrite(h, sizeof h, 1, f), 1);
    if (n > 0)
        assert_int_equal(fwrite(p, sizeof *p, n, f), n);
    fclose(f);
}

static int setup(void **state)
{
    static fx f;
    ref_layout o = layout();
    f.n = o.total;
    f.params = malloc(f.n * sizeof *f.params);
    f.pd = malloc(f.n * sizeof *f.pd);
    if (!f.params || !f.pd)
        return -1;
    rng r;
    rng_seed(&r, 99, 3);
    for (size_t i = 0; i < f.n; i++)
        f.params[i] = (float)(0.3 * rng_normal(&r));
    /* LayerNorm weights near 1 so the signal keeps its scale */
    size_t lnw[] = {o.ln1w, o.ln2w};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < L * C; i++)
            f.params[lnw[k] + i] += 1.0f;
    for (size_t i = 0; i < C; i++)
        f.params[o.lnfw + i] += 1.0f;
    for (size_t i = 0; i < f.n; i++)
        f.pd[i] = f.params[i];
    for (int n = 0; n < B * T; n++) {
        f.tok[n] = (int)rng_below(&r, V);
        f.tgt[n] = (int)rng_below(&r, V);
    }
    snprintf(f.path, sizeof f.path, "/tmp/accumd-model-XXXXXX");
    int fd = mkstemp(f.path);
    if (fd < 0)
        return -1;
    close(fd);
    int32_t hdr[8] = {20240326, 3, MAXT, V, L, NH, C, VP};
    write_checkpoint(f.path, hdr, f.params, f.n);
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    unlink(f->path);
    free(f->params);
    free(f->pd);
    return 0;
}

static spec_model spec_for_file(void)
{
    spec_model sm;
    memset(&sm, 0, sizeof sm);
    snprintf(sm.arch, sizeof sm.arch, "gpt2");
    sm.n_layer = L;
    sm.n_head = NH;
    sm.n_embd = C;
    sm.seq_len = T;
    sm.vocab_size = V;
    return sm;
}

static model_gpt2 *load_model(fx *f, kern_device **dev)
{
    kern_device_info info = {.kind = KERN_DEV_CPU, .name = "cpu0", .mem_total = 1 << 26};
    acc_err err = {0};
    assert_int_equal(kern_device_open(&info, 2, dev, &err), 0);
    spec_model sm = spec_for_file();
    snprintf(sm.init_from, sizeof sm.init_from, "%s", f->path);
    model_config cfg;
    assert_int_equal(model_config_from_file(f->path, &sm, &cfg, &err), 0);
    assert_int_equal(cfg.padded_vocab_size, VP);
    assert_int_equal(cfg.max_seq_len, MAXT);
    model_gpt2 *m;
    assert_int_equal(model_create(*dev, &cfg, B, T, &m, &err), 0);
    assert_int_equal(m->nparams, f->n);
    assert_int_equal(model_load_llmc(m, f->path, &err), 0);
    return m;
}

/* Where a GPT-2 tensor group starts (its layer-0 tensor, llm.c order),
 * and its floats over all layers. */
static size_t toff(const model *m, const char *name)
{
    const model_tensor *t = model_find_tensor(m, name);
    assert_non_null(t);
    return t->offset;
}

static size_t tsize(const model *m, const char *name)
{
    const model_tensor *t = model_find_tensor(m, name);
    assert_non_null(t);
    return t->count * (size_t)(t->layer >= 0 ? m->cfg.n_layer : 1);
}

/* ------------------------------------------------ tests */

static void test_checkpoint_logits(void **state)
{
    fx *f = *state;
    kern_device *dev;
    model_gpt2 *m = load_model(f, &dev);
    float w[B * T];
    for (int n = 0; n < B * T; n++)
        w[n] = 1.0f;
    double loss;
    model_forward(m, f->tok, f->tgt, w, B, 0, &loss);
    static double want[B * T * VP];
    ref_forward(f->pd, f->tok, want);
    double mx = 0, worst = 0;
    for (size_t i = 0; i < (size_t)B * T * VP; i++)
        mx = fmax(mx, fabs(want[i]));
    for (size_t i = 0; i < (size_t)B * T * VP; i++)
        worst = fmax(worst, fabs(model_logits(m)[i] - want[i]));
    print_message("logits: max |ref| %.4g, max |diff| %.3g\n", mx, worst);
    assert_true(mx > 0.1);
    assert_true(worst <= 1e-5 * mx);
    double ref = ref_loss(f->pd, f->tok, f->tgt) * B * T;
    assert_true(fabs(loss - ref) <= 1e-5 * ref);
    model_free(m);
    kern_device_close(dev);
}

static void test_gradient_check(void **state)
{
    fx *f = *state;
    kern_device *dev;
    model_gpt2 *m = load_model(f, &dev);
    float w[B * T];
    for (int n = 0; n < B * T; n++)
        w[n] = 1.0f / (B * T);
    double loss;
    model_zero_grad(m);
    model_forward(m, f->tok, f->tgt, w, B, 1, &loss);
    model_backward(m, B);
    const float *g = m->grads;
    double gmax = 0;
    for (size_t i = 0; i < f->n; i++)
        gmax = fmax(gmax, fabs(g[i]));
    const double h = 1e-5;
    size_t bad = 0;
    double worst = 0;
    for (size_t i = 0; i < f->n; i++) {
        double save = f->pd[i];
        f->pd[i] = save + h;
        double lp = ref_loss(f->pd, f->tok, f->tgt);
        f->pd[i] = save - h;
        double lm = ref_loss(f->pd, f->tok, f->tgt);
        f->pd[i] = save;
        double num = (lp - lm) / (2 * h);
        double diff = fabs(num - g[i]);
        worst = fmax(worst, diff);
        if (diff > 2e-5 * gmax + 1e-7) {
            if (bad++ < 5)
                print_error("param %zu: analytic %.8g numeric %.8g\n", i, g[i], num);
        }
    }
    print_message("gradient check: %zu params, max |g| %.4g, max |diff| %.3g\n", f->n, gmax,
                  worst);
    assert_int_equal(bad, 0);
    /* padded vocabulary rows: no gradient at all */
    ref_layout o = layout();
    for (size_t i = o.wte + (size_t)V * C; i < o.wte + (size_t)VP * C; i++)
        assert_true(g[i] == 0.0f);
    model_free(m);
    kern_device_close(dev);
}

static void test_bad_checkpoints(void **state)
{
    fx *f = *state;
    char path[64];
    snprintf(path, sizeof path, "/tmp/accumd-badckpt-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    spec_model sm = spec_for_file();
    model_config cfg;
    acc_err err = {0};

    int32_t bad_magic[8] = {20240520, 3, MAXT, V, L, NH, C, VP};
    write_checkpoint(path, bad_magic, f->params, f->n);
    assert_int_equal(model_config_from_file(path, &sm, &cfg, &err), ACC_EINVAL);
    assert_string_equal(err.field, "model.init_from");
    assert_non_null(strstr(err.msg, "magic"));

    int32_t bad_version[8] = {20240326, 5, MAXT, V, L, NH, C, VP};
    write_checkpoint(path, bad_version, f->params, f->n);
    assert_int_equal(model_config_from_file(path, &sm, &cfg, &err), ACC_EINVAL);
    assert_non_null(strstr(err.msg, "version"));

    int32_t ok[8] = {20240326, 3, MAXT, V, L, NH, C, VP};
    write_checkpoint(path, ok, f->params, f->n / 2);
    assert_int_equal(model_config_from_file(path, &sm, &cfg, &err), ACC_EINVAL);
    assert_non_null(strstr(err.msg, "bytes"));

    write_checkpoint(path, ok, f->params, f->n);
    sm.n_layer = 3;
    assert_int_equal(model_config_from_file(path, &sm, &cfg, &err), ACC_EINVAL);
    assert_non_null(strstr(err.msg, "n_layer"));
    sm = spec_for_file();
    sm.seq_len = MAXT + 1;
    assert_int_equal(model_config_from_file(path, &sm, &cfg, &err), ACC_EINVAL);
    assert_non_null(strstr(err.msg, "seq_len"));

    assert_int_equal(model_config_from_file("/nonexistent/x.bin", &sm, &cfg, &err), ACC_EINVAL);
    assert_string_equal(err.field, "model.init_from");
    unlink(path);
}

static void test_seed_init(void **state)
{
    kern_device_info info = {.kind = KERN_DEV_CPU, .name = "cpu0", .mem_total = 0};
    kern_device *dev;
    acc_err err = {0};
    assert_int_equal(kern_device_open(&info, 1, &dev, &err), 0);
    spec_model sm = spec_for_file();
    sm.n_layer = 4;
    sm.n_embd = 64;
    sm.n_head = 4;
    sm.padded_vocab_size = 16;
    model_config cfg;
    assert_int_equal(model_config_from_spec(&sm, &cfg, &err), 0);
    model_gpt2 *a, *b;
    assert_int_equal(model_create(dev, &cfg, 1, T, &a, &err), 0);
    assert_int_equal(model_create(dev, &cfg, 1, T, &b, &err), 0);
    assert_int_equal(model_init_seed(a, 5, &err), 0);
    assert_int_equal(model_init_seed(b, 5, &err), 0);
    assert_memory_equal(a->params, b->params, a->nparams * sizeof(float));
    /* std of the qkv weights ~0.02, of the residual projections ~0.02/sqrt(2L) */
    size_t off = toff(a, "h.0.attn.c_attn.weight"), n = tsize(a, "h.0.attn.c_attn.weight");
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)a->params[off + i] * a->params[off + i];
    assert_true(fabs(sqrt(s / n) - 0.02) < 0.002);
    off = toff(a, "h.0.mlp.c_proj.weight"), n = tsize(a, "h.0.mlp.c_proj.weight");
    s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)a->params[off + i] * a->params[off + i];
    assert_true(fabs(sqrt(s / n) - 0.02 / sqrt(8.0)) < 0.001);
    assert_true(a->params[toff(a, "h.0.ln_1.weight")] == 1.0f); /* ln1w */
    assert_true(a->params[toff(a, "h.0.ln_1.bias")] == 0.0f); /* ln1b */
    assert_int_equal(model_init_seed(b, 6, &err), 0);
    assert_memory_not_equal(a->params, b->params, a->nparams * sizeof(float));
    model_free(a);
    model_free(b);
    assert_true(dev->in_use == 0);
    kern_device_close(dev);
}

/* The gradient spans of the bucketed reduction: any cut of the layers into
 * buckets, plus the ends once, covers the gradient buffer (spare slots
 * included) exactly once; model_backward_notify reports layers last to
 * first, then -1, and computes the same gradients as model_backward. */
static void count_spans(const kern_span *sp, int n, unsigned char *hits, size_t total)
{
    assert_true(n <= MODEL_MAX_GRAD_SPANS);
    for (int k = 0; k < n; k++) {
        assert_true(sp[k].off + sp[k].n <= total);
        for (size_t i = 0; i < sp[k].n; i++)
            hits[sp[k].off + i]++;
    }
}

typedef struct notify_log {
    int layers[16];
    int n;
} notify_log;

static void log_layer(void *ctx, int layer)
{
    notify_log *l = ctx;
    if (l->n < 16)
        l->layers[l->n] = layer;
    l->n++;
}

static void test_grad_spans(void **state)
{
    enum { NL = 4 };
    kern_device_info info = {.kind = KERN_DEV_CPU, .name = "cpu0", .mem_total = 0};
    kern_device *dev;
    acc_err err = {0};
    assert_int_equal(kern_device_open(&info, 1, &dev, &err), 0);
    spec_model sm = spec_for_file();
    sm.n_layer = NL;
    sm.n_embd = 32;
    sm.n_head = 4;
    sm.padded_vocab_size = 16;
    model_config cfg;
    assert_int_equal(model_config_from_spec(&sm, &cfg, &err), 0);
    model_gpt2 *m;
    assert_int_equal(model_create(dev, &cfg, 1, T, &m, &err), 0);
    assert_int_equal(model_init_seed(m, 3, &err), 0);
    size_t total = m->nparams + MODEL_GRAD_EXTRA;
    unsigned char *hits = calloc(total, 1);
    assert_non_null(hits);
    /* cuts: {4}, {2,2}, {1,1,1,1}, {3,1}: bucket boundaries from the top */
    static const int cuts[4][NL + 1] = {{4, 0}, {4, 2, 0}, {4, 3, 2, 1, 0}, {4, 1, 0}};
    for (int c = 0; c < 4; c++) {
        memset(hits, 0, total);
        kern_span sp[MODEL_MAX_GRAD_SPANS];
        int j = 0;
        for (; cuts[c][j] != 0; j++) {
            int n = model_grad_spans(m, cuts[c][j + 1], cuts[c][j], 0, sp);
            assert_int_equal(n, 12);
            count_spans(sp, n, hits, total);
        }
        count_spans(sp, model_grad_spans(m, 0, 0, 1, sp), hits, total);
        for (size_t i = 0; i < total; i++)
            if (hits[i] != 1)
                fail_msg("cut %d: float %zu covered %d times", c, i, hits[i]);
    }
    assert_int_equal(model_block_params(&cfg) * NL + toff(m, "h.0.ln_1.weight") +
                         (m->nparams - toff(m, "ln_f.weight")),
                     m->nparams);
    free(hits);

    /* notify order and the same gradients as the plain backward */
    int tok[T], tgt[T];
    float w[T];
    for (int t = 0; t < T; t++) {
        tok[t] = (t * 5) % V;
        tgt[t] = (t * 5 + 1) % V;
        w[t] = 1.0f / T;
    }
    double loss;
    float *g1 = malloc(m->nparams * sizeof *g1);
    assert_non_null(g1);
    model_zero_grad(m);
    model_forward(m, tok, tgt, w, 1, 1, &loss);
    model_backward(m, 1);
    memcpy(g1, m->grads, m->nparams * sizeof *g1);
    model_zero_grad(m);
    model_forward(m, tok, tgt, w, 1, 1, &loss);
    notify_log log = {0};
    model_backward_notify(m, 1, log_layer, &log);
    assert_int_equal(log.n, NL + 1);
    for (int i = 0; i < NL; i++)
        assert_int_equal(log.layers[i], NL - 1 - i);
    assert_int_equal(log.layers[NL], -1);
    assert_memory_equal(g1, m->grads, m->nparams * sizeof *g1);
    free(g1);
    model_free(m);
    kern_device_close(dev);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checkpoint_logits),
        cmocka_unit_test(test_gradient_check),
        cmocka_unit_test(test_bad_checkpoints),
        cmocka_unit_test(test_seed_init),
        cmocka_unit_test(test_grad_spans),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
