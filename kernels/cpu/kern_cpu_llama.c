/* kern_cpu_llama: the CPU backend's LLaMA-family ops (contract:
 * kern_device.h, the end of kern_ops; hooked into the "cpu" table in
 * kern_cpu.c).
 *
 * Same rules as kern_cpu.c: OpenMP teams of d->threads, products through
 * cblas_sgemm, reductions over fixed index ranges summed in a fixed order,
 * so nothing depends on the thread count but the sgemm blocking. Every op
 * stays fp32 in bf16 mode.
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

/* ---- RMSNorm */

void kern_cpu_rmsnorm_fwd(kern_device *d, float *out, float *rstd, const float *inp,
                          const float *w, float eps, int N, int C)
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
            o[c] = x[c] * s * w[c];
        rstd[n] = s;
    }
}

/* d/dx of x r w with r = (mean(x^2) + eps)^-1/2:
 * dx_j = r (g_j w_j) - x_j r^3 / C * sum_c g_c w_c x_c;  dw_c = sum_n g x r */
void kern_cpu_rmsnorm_bwd(kern_device *d, float *dinp, float *dw, const float *dout,
                          const float *inp, const float *w, const float *rstd, int N, int C)
{
#pragma omp parallel for num_threads(d->threads)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *g = dout + (size_t)n * C;
        float s = rstd[n], dot = 0.0f;
        for (int c = 0; c < C; c++)
            dot += g[c] * w[c] * x[c];
        float k = dot * s * s * s / (float)C;
        float *di = dinp + (size_t)n * C;
        for (int c = 0; c < C; c++)
            di[c] += s * g[c] * w[c] - k * x[c];
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

/* ---- grouped-query attention */

/* The first key row t may see: its document's first token (pos: this
 * sequence's positions, NULL = one document). */
static inline int row_lo(const int *pos, int t)
{
    return pos != NULL ? t - pos[t] : 0;
}

/* In place: scores -> probabilities (causal within the row's document,
 * scaled); lse[t] of each row. */
static void softmax_rows(float *att, float *lse, int T, float scale, const int *pos)
{
    for (int t = 0; t < T; t++) {
        float *a = att + (size_t)t * T;
        int lo = row_lo(pos, t);
        float mx = -INFINITY;
        for (int u = lo; u <= t; u++) {
            a[u] *= scale;
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

/* In place: scores -> the forward's probabilities, from lse. */
static void probs_rows(float *att, const float *lse, int T, float scale, const int *pos)
{
    for (int t = 0; t < T; t++) {
        float *a = att + (size_t)t * T;
        int lo = row_lo(pos, t);
        for (int u = 0; u < lo; u++)
            a[u] = 0.0f;
        for (int u = lo; u <= t; u++)
            a[u] = expf(a[u] * scale - lse[t]);
        for (int u = t + 1; u < T; u++)
            a[u] = 0.0f;
    }
}

/* In place in da: da <- att (da - <att, da>) scale on the row's keys, 0
 * elsewhere. */
static void softmax_bwd_rows(float *da, const float *att, int T, float scale, const int *pos)
{
    for (int t = 0; t < T; t++) {
        const float *ar = att + (size_t)t * T;
        float *dr = da + (size_t)t * T;
        int lo = row_lo(pos, t);
        float dot = 0.0f;
        for (int u = lo; u <= t; u++)
            dot += ar[u] * dr[u];
        for (int u = 0; u < lo; u++)
            dr[u] = 0.0f;
        for (int u = lo; u <= t; u++)
            dr[u] = ar[u] * (dr[u] - dot) * scale;
        for (int u = t + 1; u < T; u++)
            dr[u] = 0.0f;
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
    kern_cpu_gqa_attention_pos_fwd(d, out, lse, scratch, q, k, v, NULL, B, T, NH, NKV, hs);
}

void kern_cpu_gqa_attention_bwd(kern_device *d, float *dq, float *dk, float *dv,
                                float *scratch, const float *dout, const float *q,
                                const float *k, const float *v, const float *lse,
                                const float *out, int B, int T, int NH, int NKV, int hs)
{
    kern_cpu_gqa_attention_pos_bwd(d, dq, dk, dv, scratch, dout, q, k, v, lse, out, NULL, B, T, NH,
                                   NKV, hs);
}

void kern_cpu_gqa_attention_pos_fwd(kern_device *d, float *out, float *lse, float *scratch,
                                    const float *q, const float *k, const float *v,
                                    const int *pos, int B, int T, int NH, int NKV, int hs)
{
    float scale = 1.0f / sqrtf((float)hs);
    size_t tt = (size_t)T * T;
#pragma omp parallel for num_threads(gqa_threads(d, NH)) schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        gqa_view w = gqa_at(bh / NH, bh % NH, T, NH, NKV, hs);
        float *a = scratch + 2 * (size_t)omp_get_thread_num() * tt;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, q + w.q, w.ldq,
                    k + w.kv, w.ldkv, 0.0f, a, T);
        softmax_rows(a, lse + (size_t)bh * T, T, scale, pos ? pos + (size_t)(bh / NH) * T : NULL);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, v + w.kv,
                    w.ldkv, 0.0f, out + w.q, w.ldq);
    }
}

void kern_cpu_gqa_attention_pos_bwd(kern_device *d, float *dq, float *dk, float *dv,
                                    float *scratch, const float *dout, const float *q,
                                    const float *k, const float *v, const float *lse,
                                    const float *out, const int *pos, int B, int T, int NH,
                                    int NKV, int hs)
{
    (void)out; /* the full T x T backward has <att, datt> directly */
    float scale = 1.0f / sqrtf((float)hs);
    size_t tt = (size_t)T * T;
    int G = NH / NKV;
#pragma omp parallel for num_threads(gqa_threads(d, NH)) schedule(static)
    for (int bk = 0; bk < B * NKV; bk++) {
        int b = bk / NKV;
        float *a = scratch + 2 * (size_t)omp_get_thread_num() * tt, *da = a + tt;
        for (int h = (bk % NKV) * G; h < (bk % NKV + 1) * G; h++) {
            gqa_view w = gqa_at(b, h, T, NH, NKV, hs);
            /* the forward's probabilities, rebuilt */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, q + w.q,
                        w.ldq, k + w.kv, w.ldkv, 0.0f, a, T);
            const int *pb = pos ? pos + (size_t)b * T : NULL;
            probs_rows(a, lse + ((size_t)b * NH + h) * T, T, scale, pb);
            /* through out = att v: datt = dout v^T, dv += att^T dout */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, dout + w.q,
                        w.ldq, v + w.kv, w.ldkv, 0.0f, da, T);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, a, T,
                        dout + w.q, w.ldq, 1.0f, dv + w.kv, w.ldkv);
            softmax_bwd_rows(da, a, T, scale, pb);
            /* through the scores q k^T: dq += dpre k, dk += dpre^T q */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, da, T,
                        k + w.kv, w.ldkv, 1.0f, dq + w.q, w.ldq);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, da, T,
                        q + w.q, w.ldq, 1.0f, dk + w.kv, w.ldkv);
        }
    }
}
