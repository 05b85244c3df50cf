/* kern_cpu_llama: the CPU backend's LLaMA-family ops (contract:
 * kern_device.h, the end of kern_ops; hooked into the "cpu" table in
 * kern_cpu.c).
 *
 * Same rules as kern_cpu.c: OpenMP teams of d->threads, products through
 * cblas_sgemm, reductions over fixed index ranges summed in a fixed order,
 * so nothing depends on the thread count but the sgemm blocking. Every op
 * stays fp32 in bf16 mode.
 *
 * Qwen3's and Gemma 2's ops are here too: RMSNorm with an offset on the
 * weight (rmsnorm_fwd / _bwd are its offset 0) and attention with options
 * (scale, capped scores, a sliding window; the plain and packed entries are
 * its options 0, arithmetic unchanged). With a cap, the backward reads each
 * row's raw products twice (the cap's derivative needs them) before they
 * become probabilities; uncapped, it is the path it always was.
 *
 * Grouped-query attention mirrors attention_fwd/bwd: one (sequence, query
 * head) per task in the forward, each thread in its own T x T slices of the
 * scratch (so at most NH threads); the backward runs one (sequence,
 * key/value head) per task and its group's query heads one after another,
 * so dk / dv of a key/value head are written by one thread only, in a fixed
 * order. Products go through sgemm on the strided head views; scores above
 * the diagonal are computed and then ignored. Only lse is kept.
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stddef.h>

#include "kern_cpu_llama.h"

/* ---- embedding without positions */

void kern_cpu_embed_fwd(kern_device *d, float *out, const int *tok, const float *wte, int N,
                        int C)
{
#pragma omp parallel for num_threads(d->threads)
    for (int n = 0; n < N; n++) {
        const float *we = wte + (size_t)tok[n] * C;
        float *o = out + (size_t)n * C;
        for (int c = 0; c < C; c++)
            o[c] = we[c];
    }
}

/* Columns split over threads so that no two threads write one row. */
void kern_cpu_embed_bwd(kern_device *d, float *dwte, const float *dout, const int *tok, int N,
                        int C)
{
    enum { CB = 16 };
    int nblk = (C + CB - 1) / CB;
#pragma omp parallel for num_threads(d->threads)
    for (int blk = 0; blk < nblk; blk++) {
        int c0 = blk * CB, c1 = c0 + CB < C ? c0 + CB : C;
        for (int n = 0; n < N; n++) {
            const float *g = dout + (size_t)n * C;
            float *we = dwte + (size_t)tok[n] * C;
            for (int c = c0; c < c1; c++)
                we[c] += g[c];
        }
    }
}

/* ---- RMSNorm (offset 0) and RMSNorm with an offset on the weight
 * (Gemma's 1 + w). The offset is added only when it is not 0, so that
 * rmsnorm_fwd / _bwd multiply by w itself, as they always have. */

static inline float ofs_w(const float *w, float offset, int c)
{
    return offset != 0.0f ? w[c] + offset : w[c];
}

void kern_cpu_rmsnorm_ofs_fwd(kern_device *d, float *out, float *rstd, const float *inp,
                              const float *w, float offset, float eps, int N, int C)
{
#pragma omp parallel for num_threads(d->threads)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float ss = 0.0f;
        for (int c = 0; c < C; c++)
            ss += x[c] * x[c];
        float s = 1.0f / sqrtf(ss / (float)C + eps);
        float *o = out + (size_t)n * C;
        for (int c = 0; c < C; c++)
            o[c] = x[c] * s * ofs_w(w, offset, c);
        rstd[n] = s;
    }
}

/* d/dx of x r w' with r = (mean(x^2) + eps)^-1/2, w' = w + offset:
 * dx_j = r (g_j w'_j) - x_j r^3 / C * sum_c g_c w'_c x_c;  dw_c = sum_n g x r */
void kern_cpu_rmsnorm_ofs_bwd(kern_device *d, float *dinp, float *dw, const float *dout,
                              const float *inp, const float *w, float offset,
                              const float *rstd, int N, int C)
{
#pragma omp parallel for num_threads(d->threads)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *g = dout + (size_t)n * C;
        float s = rstd[n], dot = 0.0f;
        for (int c = 0; c < C; c++)
            dot += g[c] * ofs_w(w, offset, c) * x[c];
        float k = dot * s * s * s / (float)C;
        float *di = dinp + (size_t)n * C;
        for (int c = 0; c < C; c++)
            di[c] += s * g[c] * ofs_w(w, offset, c) - k * x[c];
    }
    if (dw == NULL) /* a frozen weight (LoRA) */
        return;
    enum { CB = 64 };
    int nblk = (C + CB - 1) / CB;
#pragma omp parallel for num_threads(d->threads)
    for (int blk = 0; blk < nblk; blk++) {
        int c0 = blk * CB, c1 = c0 + CB < C ? c0 + CB : C;
        float sw[CB] = {0};
        for (int n = 0; n < N; n++) {
            const float *g = dout + (size_t)n * C, *x = inp + (size_t)n * C;
            float s = rstd[n];
            for (int c = c0; c < c1; c++)
                sw[c - c0] += g[c] * x[c] * s;
        }
        for (int c = c0; c < c1; c++)
            dw[c] += sw[c - c0];
    }
}

void kern_cpu_rmsnorm_fwd(kern_device *d, float *out, float *rstd, const float *inp,
                          const float *w, float eps, int N, int C)
{
    kern_cpu_rmsnorm_ofs_fwd(d, out, rstd, inp, w, 0.0f, eps, N, C);
}

void kern_cpu_rmsnorm_bwd(kern_device *d, float *dinp, float *dw, const float *dout,
                          const float *inp, const float *w, const float *rstd, int N, int C)
{
    kern_cpu_rmsnorm_ofs_bwd(d, dinp, dw, dout, inp, w, 0.0f, rstd, N, C);
}

/* ---- RoPE (rotate-half): pair (i, i + hs/2) of each head rotated by the
 * angle of the token's position; dir = +1 forward, -1 the transpose. Both
 * elements of a pair are read before either is written: in place is safe. */

static void rope_apply(kern_device *d, float *out, const float *inp, const float *cos_t,
                       const float *sin_t, const int *pos, int B, int T, int H, int hs,
                       float dir)
{
    int half = hs / 2;
#pragma omp parallel for num_threads(d->threads)
    for (int n = 0; n < B * T; n++) {
        int p = pos != NULL ? pos[n] : n % T;
        const float *cr = cos_t + (size_t)p * half, *sr = sin_t + (size_t)p * half;
        for (int h = 0; h < H; h++) {
            size_t off = ((size_t)n * H + h) * hs;
            const float *x = inp + off;
            float *o = out + off;
            for (int i = 0; i < half; i++) {
                float c = cr[i], s = dir * sr[i], x1 = x[i], x2 = x[i + half];
                o[i] = x1 * c - x2 * s;
                o[i + half] = x2 * c + x1 * s;
            }
        }
    }
}

void kern_cpu_rope_fwd(kern_device *d, float *out, const float *inp, const float *cos_t,
                       const float *sin_t, const int *pos, int B, int T, int H, int hs)
{
    rope_apply(d, out, inp, cos_t, sin_t, pos, B, T, H, hs, 1.0f);
}

void kern_cpu_rope_bwd(kern_device *d, float *dinp, const float *dout, const float *cos_t,
                       const float *sin_t, const int *pos, int B, int T, int H, int hs)
{
    rope_apply(d, dinp, dout, cos_t, sin_t, pos, B, T, H, hs, -1.0f);
}

/* ---- SwiGLU */

static inline float sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

void kern_cpu_swiglu_fwd(kern_device *d, float *out, const float *gate, const float *up,
                         size_t n)
{
#pragma omp parallel for num_threads(d->threads)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g * sigmoid(g) * up[i];
    }
}

/* silu'(g) = sig(g) (1 + g (1 - sig(g))) */
void kern_cpu_swiglu_bwd(kern_device *d, float *dgate, float *dup, const float *dout,
                         const float *gate, const float *up, size_t n)
{
#pragma omp parallel for num_threads(d->threads)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i], sg = sigmoid(g), gi = dout[i];
        dgate[i] += gi * up[i] * sg * (1.0f + g * (1.0f - sg));
        dup[i] += gi * g * sg;
    }
}

/* ---- grouped-query attention, with the options of kern_att_opts */

/* one call's row rules: the score scale, the cap, the window */
typedef struct att_rule {
    float scale, cap;
    int window;
} att_rule;

static att_rule att_rule_of(const kern_att_opts *o, int hs)
{
    att_rule r = {1.0f / sqrtf((float)hs), 0.0f, 0};
    if (o != NULL) {
        if (o->scale != 0.0f)
            r.scale = o->scale;
        r.cap = o->softcap > 0.0f ? o->softcap : 0.0f;
        r.window = o->window > 0 ? o->window : 0;
    }
    return r;
}

/* The score of a raw product x: scaled, then capped when the rule caps. */
static inline float att_score(float x, const att_rule *r)
{
    x *= r->scale;
    return r->cap > 0.0f ? r->cap * tanhf(x / r->cap) : x;
}

/* The first key row t may see: its document's first token (pos: this
 * sequence's positions, NULL = one document), and no further back than the
 * window. */
static inline int row_lo(const int *pos, const att_rule *r, int t)
{
    int lo = pos != NULL ? t - pos[t] : 0;
    if (r->window > 0 && t - r->window + 1 > lo)
        lo = t - r->window + 1;
    return lo;
}

/* In place: raw products -> probabilities over the row's keys; lse[t] of
 * each row. */
static void softmax_rows(float *att, float *lse, int T, const att_rule *r, const int *pos)
{
    for (int t = 0; t < T; t++) {
        float *a = att + (size_t)t * T;
        int lo = row_lo(pos, r, t);
        float mx = -INFINITY;
        for (int u = lo; u <= t; u++) {
            a[u] = att_score(a[u], r);
            if (a[u] > mx)
                mx = a[u];
        }
        float sum = 0.0f;
        for (int u = lo; u <= t; u++) {
            a[u] = expf(a[u] - mx);
            sum += a[u];
        }
        float inv = 1.0f / sum;
        for (int u = lo; u <= t; u++)
            a[u] *= inv;
        for (int u = 0; u < lo; u++)
            a[u] = 0.0f;
        for (int u = t + 1; u < T; u++)
            a[u] = 0.0f;
        lse[t] = mx + logf(sum);
    }
}

/* In place: raw products -> the forward's probabilities, from lse. */
static void probs_rows(float *att, const float *lse, int T, const att_rule *r, const int *pos)
{
    for (int t = 0; t < T; t++) {
        float *a = att + (size_t)t * T;
        int lo = row_lo(pos, r, t);
        for (int u = 0; u < lo; u++)
            a[u] = 0.0f;
        for (int u = lo; u <= t; u++)
            a[u] = expf(att_score(a[u], r) - lse[t]);
        for (int u = t + 1; u < T; u++)
            a[u] = 0.0f;
    }
}

/* In place in da (uncapped scores): da <- att (da - <att, da>) scale on the
 * row's keys, 0 elsewhere. */
static void softmax_bwd_rows(float *da, const float *att, int T, const att_rule *r,
                             const int *pos)
{
    for (int t = 0; t < T; t++) {
        const float *ar = att + (size_t)t * T;
        float *dr = da + (size_t)t * T;
        int lo = row_lo(pos, r, t);
        float dot = 0.0f;
        for (int u = lo; u <= t; u++)
            dot += ar[u] * dr[u];
        for (int u = 0; u < lo; u++)
            dr[u] = 0.0f;
        for (int u = lo; u <= t; u++)
            dr[u] = ar[u] * (dr[u] - dot) * r->scale;
        for (int u = t + 1; u < T; u++)
            dr[u] = 0.0f;
    }
}

/* Capped scores: att holds the raw products, da = dout v^T. Both become
 * what the uncapped path has after softmax_bwd_rows: att the
 * probabilities, da d(loss)/d(raw product) = p (da - <p, da>) (1 - th^2)
 * scale with th = tanh(s / cap) (the cap's derivative needs the raw
 * product, so each row is read twice before it is overwritten). */
static void capped_bwd_rows(float *att, float *da, const float *lse, int T, const att_rule *r,
                            const int *pos)
{
    for (int t = 0; t < T; t++) {
        float *a = att + (size_t)t * T, *dr = da + (size_t)t * T;
        int lo = row_lo(pos, r, t);
        float dot = 0.0f;
        for (int u = lo; u <= t; u++)
            dot += expf(att_score(a[u], r) - lse[t]) * dr[u];
        for (int u = 0; u < lo; u++)
            a[u] = dr[u] = 0.0f;
        for (int u = lo; u <= t; u++) {
            float th = tanhf(a[u] * r->scale / r->cap), p = expf(r->cap * th - lse[t]);
            dr[u] = p * (dr[u] - dot) * (1.0f - th * th) * r->scale;
            a[u] = p;
        }
        for (int u = t + 1; u < T; u++)
            a[u] = dr[u] = 0.0f;
    }
}

/* The scratch has one pair of T x T slices per query head. */
static int gqa_threads(const kern_device *d, int NH)
{
    return d->threads < NH ? d->threads : NH;
}

/* one (sequence, head)'s views: rows of a [B,T,H,hs] tensor have stride H*hs */
typedef struct gqa_view {
    size_t q, kv; /* offsets of the head's first row in q / out and in k / v */
    int ldq, ldkv;
} gqa_view;

static gqa_view gqa_at(int b, int h, int T, int NH, int NKV, int hs)
{
    int kvh = h / (NH / NKV);
    gqa_view w = {((size_t)b * T * NH + h) * hs, ((size_t)b * T * NKV + kvh) * hs, NH * hs,
                  NKV * hs};
    return w;
}

void kern_cpu_gqa_attention_fwd(kern_device *d, float *out, float *lse, float *scratch,
                                const float *q, const float *k, const float *v, int B, int T,
                                int NH, int NKV, int hs)
{
    kern_cpu_gqa_attention_opt_fwd(d, out, lse, scratch, q, k, v, NULL, NULL, B, T, NH, NKV, hs);
}

void kern_cpu_gqa_attention_bwd(kern_device *d, float *dq, float *dk, float *dv,
                                float *scratch, const float *dout, const float *q,
                                const float *k, const float *v, const float *lse,
                                const float *out, int B, int T, int NH, int NKV, int hs)
{
    kern_cpu_gqa_attention_opt_bwd(d, dq, dk, dv, scratch, dout, q, k, v, lse, out, NULL, NULL,
                                   B, T, NH, NKV, hs);
}

void kern_cpu_gqa_attention_pos_fwd(kern_device *d, float *out, float *lse, float *scratch,
                                    const float *q, const float *k, const float *v,
                                    const int *pos, int B, int T, int NH, int NKV, int hs)
{
    kern_cpu_gqa_attention_opt_fwd(d, out, lse, scratch, q, k, v, pos, NULL, B, T, NH, NKV, hs);
}

void kern_cpu_gqa_attention_pos_bwd(kern_device *d, float *dq, float *dk, float *dv,
                                    float *scratch, const float *dout, const float *q,
                                    const float *k, const float *v, const float *lse,
                                    const float *out, const int *pos, int B, int T, int NH,
                                    int NKV, int hs)
{
    kern_cpu_gqa_attention_opt_bwd(d, dq, dk, dv, scratch, dout, q, k, v, lse, out, pos, NULL,
                                   B, T, NH, NKV, hs);
}

void kern_cpu_gqa_attention_opt_fwd(kern_device *d, float *out, float *lse, float *scratch,
                                    const float *q, const float *k, const float *v,
                                    const int *pos, const kern_att_opts *opts, int B, int T,
                                    int NH, int NKV, int hs)
{
    att_rule r = att_rule_of(opts, hs);
    size_t tt = (size_t)T * T;
#pragma omp parallel for num_threads(gqa_threads(d, NH)) schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        gqa_view w = gqa_at(bh / NH, bh % NH, T, NH, NKV, hs);
        float *a = scratch + 2 * (size_t)omp_get_thread_num() * tt;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, q + w.q, w.ldq,
                    k + w.kv, w.ldkv, 0.0f, a, T);
        softmax_rows(a, lse + (size_t)bh * T, T, &r, pos ? pos + (size_t)(bh / NH) * T : NULL);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, v + w.kv,
                    w.ldkv, 0.0f, out + w.q, w.ldq);
    }
}

void kern_cpu_gqa_attention_opt_bwd(kern_device *d, float *dq, float *dk, float *dv,
                                    float *scratch, const float *dout, const float *q,
                                    const float *k, const float *v, const float *lse,
                                    const float *out, const int *pos,
                                    const kern_att_opts *opts, int B, int T, int NH, int NKV,
                                    int hs)
{
    (void)out; /* the full T x T backward has <att, datt> directly */
    att_rule r = att_rule_of(opts, hs);
    size_t tt = (size_t)T * T;
    int G = NH / NKV;
#pragma omp parallel for num_threads(gqa_threads(d, NH)) schedule(static)
    for (int bk = 0; bk < B * NKV; bk++) {
        int b = bk / NKV;
        float *a = scratch + 2 * (size_t)omp_get_thread_num() * tt, *da = a + tt;
        for (int h = (bk % NKV) * G; h < (bk % NKV + 1) * G; h++) {
            gqa_view w = gqa_at(b, h, T, NH, NKV, hs);
            const int *pb = pos ? pos + (size_t)b * T : NULL;
            const float *lh = lse + ((size_t)b * NH + h) * T;
            /* the forward's raw products, rebuilt */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, q + w.q,
                        w.ldq, k + w.kv, w.ldkv, 0.0f, a, T);
            if (r.cap > 0.0f) { /* through out = att v, then the capped softmax */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f,
                            dout + w.q, w.ldq, v + w.kv, w.ldkv, 0.0f, da, T);
                capped_bwd_rows(a, da, lh, T, &r, pb);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, a, T,
                            dout + w.q, w.ldq, 1.0f, dv + w.kv, w.ldkv);
            } else { /* through out = att v: datt = dout v^T, dv += att^T dout */
                probs_rows(a, lh, T, &r, pb);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f,
                            dout + w.q, w.ldq, v + w.kv, w.ldkv, 0.0f, da, T);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, a, T,
                            dout + w.q, w.ldq, 1.0f, dv + w.kv, w.ldkv);
                softmax_bwd_rows(da, a, T, &r, pb);
            }
            /* through the scores q k^T: dq += dpre k, dk += dpre^T q */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, da, T,
                        k + w.kv, w.ldkv, 1.0f, dq + w.q, w.ldq);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, da, T,
                        q + w.q, w.ldq, 1.0f, dk + w.kv, w.ldkv);
        }
    }
}

/* ---- generation: n new queries against the key/value cache. One (query,
 * head) per task: its scores over the keys it sees (a gemv on the cache's
 * head view), the softmax in a fixed order, then the values' weighted sum
 * (a second gemv), so nothing depends on the thread count. */
void kern_cpu_attention_cache_fwd(kern_device *d, float *out, float *scratch, const float *q,
                                  int ldq, const float *kc, const float *vc,
                                  const kern_att_opts *opts, int p0, int n, int NH, int NKV,
                                  int hs)
{
    att_rule r = att_rule_of(opts, hs);
    int G = NH / NKV, KD = NKV * hs, P = p0 + n;
#pragma omp parallel for num_threads(d->threads) schedule(static)
    for (int ih = 0; ih < n * NH; ih++) {
        int i = ih / NH, h = ih % NH, t = p0 + i;
        int lo = r.window > 0 && t - r.window + 1 > 0 ? t - r.window + 1 : 0, len = t + 1 - lo;
        float *a = scratch + (size_t)ih * (size_t)P;
        const float *kh = kc + (size_t)lo * KD + (size_t)(h / G) * hs;
        const float *vh = vc + (size_t)lo * KD + (size_t)(h / G) * hs;
        cblas_sgemv(CblasRowMajor, CblasNoTrans, len, hs, 1.0f, kh, KD,
                    q + (size_t)i * ldq + (size_t)h * hs, 1, 0.0f, a, 1);
        float mx = -INFINITY, sum = 0.0f;
        for (int u = 0; u < len; u++) {
            a[u] = att_score(a[u], &r);
            mx = a[u] > mx ? a[u] : mx;
        }
        for (int u = 0; u < len; u++) {
            a[u] = expf(a[u] - mx);
            sum += a[u];
        }
        cblas_sgemv(CblasRowMajor, CblasTrans, len, hs, 1.0f / sum, vh, KD, a, 1, 0.0f,
                    out + (size_t)i * NH * hs + (size_t)h * hs, 1);
    }
}
