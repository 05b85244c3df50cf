/* kern_cpu_lean: the CPU backend's tiled attention (contract: kern_device.h,
 * attention_lean_fwd / _bwd; hooked into the "cpu" table in kern_cpu.c).
 *
 * Never a T x T matrix: the scratch is one bq x bk tile pair per thread
 * (KERN_ATT_LEAN_TILE).
 *
 * Forward: one (sequence, query head) per task; for each tile of BQ
 * queries it walks the key tiles the tile's rows may see (causal, the
 * document of pos, the window) with an online softmax: each row keeps its
 * running maximum m and sum l, the output rows accumulate straight in `out`
 * (rescaled by e^(m_old - m_new) when the maximum grows) and are divided by
 * l at the end; lse = m + log l.
 *
 * Backward (tiles again, probabilities rebuilt from lse): one (sequence,
 * key/value head) per task, its group's query heads one after another, so
 * dq of those heads and dk / dv of the key/value head are written by one
 * thread in a fixed order. Per (query tile, key tile): P = e^(s - lse),
 * dv += P^T dout, dP = dout v^T, dS = P (dP - D) ds/dx with D = rowsum(dout
 * * out) (the forward's output), dq += dS k, dk += dS^T q. Products are
 * cblas_sgemm on strided tile views; nothing depends on the thread count.
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stddef.h>

#include "kern_cpu_lean.h"

/* one call's geometry and row rules */
typedef struct lean_geo {
    int T, NH, NKV, hs, ldq, ldkv, ldo;
    int bq, bk; /* the tiles: min(T, BQ) x min(T, BK) */
    float scale, cap;
    int window;
} lean_geo;

static lean_geo geo_of(const kern_att_opts *o, int T, int NH, int NKV, int hs, int ldq,
                       int ldkv)
{
    lean_geo g = {T, NH, NKV, hs, ldq, ldkv, NH * hs, (int)KERN_ATT_LEAN_TQ(T),
                  (int)KERN_ATT_LEAN_TK(T), 1.0f / sqrtf((float)hs), 0.0f, 0};
    if (o != NULL) {
        if (o->scale != 0.0f)
            g.scale = o->scale;
        g.cap = o->softcap > 0.0f ? o->softcap : 0.0f;
        g.window = o->window > 0 ? o->window : 0;
    }
    return g;
}

/* the score of a raw product: scaled, then capped (as kern_cpu_llama.c) */
static inline float score(float x, const lean_geo *g)
{
    x *= g->scale;
    return g->cap > 0.0f ? g->cap * tanhf(x / g->cap) : x;
}

/* the first key query t sees (pos: this sequence's positions or NULL) */
static inline int first_key(const int *pos, const lean_geo *g, int t)
{
    int lo = pos != NULL ? t - pos[t] : 0;
    if (g->window > 0 && t - g->window + 1 > lo)
        lo = t - g->window + 1;
    return lo;
}

/* the first key any row of [q0, q1) sees */
static int tile_first_key(const int *pos, const lean_geo *g, int q0, int q1)
{
    int lo = q0;
    for (int t = q0; t < q1; t++) {
        int f = first_key(pos, g, t);
        lo = f < lo ? f : lo;
    }
    return lo;
}

static int lean_threads(const kern_device *d, int NH)
{
    return d->threads < NH ? d->threads : NH;
}

/* ---- forward */

/* S (nq x nk raw products) -> this tile's unnormalised probabilities under
 * each row's updated maximum; rescales the row's output and sum. */
static void fwd_tile_rows(float *S, float *m, float *l, float *orow, const int *pos,
                          const lean_geo *g, int q0, int nq, int k0, int nk)
{
    for (int i = 0; i < nq; i++) {
        int t = q0 + i, lo = first_key(pos, g, t);
        float *s = S + (size_t)i * g->bk, mx = m[i];
        for (int j = 0; j < nk; j++) {
            int u = k0 + j;
            if (u < lo || u > t)
                continue;
            s[j] = score(s[j], g);
            mx = s[j] > mx ? s[j] : mx;
        }
        if (mx == -INFINITY) { /* no key of this row yet */
            for (int j = 0; j < nk; j++)
                s[j] = 0.0f;
            continue;
        }
        float sum = 0.0f;
        for (int j = 0; j < nk; j++) {
            int u = k0 + j;
            s[j] = u < lo || u > t ? 0.0f : expf(s[j] - mx);
            sum += s[j];
        }
        if (mx != m[i]) {
            float a = m[i] == -INFINITY ? 0.0f : expf(m[i] - mx);
            float *o = orow + (size_t)i * g->ldo;
            for (int c = 0; c < g->hs; c++)
                o[c] *= a;
            l[i] *= a;
            m[i] = mx;
        }
        l[i] += sum;
    }
}

static void fwd_query_tile(float *out, float *lse, float *scr, const float *q, const float *k,
                           const float *v, const int *pos, const lean_geo *g, int q0, int nq)
{
    float *S = scr, *m = scr + g->bq * g->bk, *l = m + g->bq;
    float *orow = out + (size_t)q0 * g->ldo;
    for (int i = 0; i < nq; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
        for (int c = 0; c < g->hs; c++)
            orow[(size_t)i * g->ldo + c] = 0.0f;
    }
    int lo = tile_first_key(pos, g, q0, q0 + nq);
    for (int k0 = lo / g->bk * g->bk; k0 < q0 + nq; k0 += g->bk) {
        int nk = q0 + nq - k0 < g->bk ? q0 + nq - k0 : g->bk;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, g->hs, 1.0f,
                    q + (size_t)q0 * g->ldq, g->ldq, k + (size_t)k0 * g->ldkv, g->ldkv, 0.0f, S,
                    g->bk);
        fwd_tile_rows(S, m, l, orow, pos, g, q0, nq, k0, nk);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, g->hs, nk, 1.0f, S, g->bk,
                    v + (size_t)k0 * g->ldkv, g->ldkv, 1.0f, orow, g->ldo);
    }
    for (int i = 0; i < nq; i++) {
        float inv = 1.0f / l[i];
        for (int c = 0; c < g->hs; c++)
            orow[(size_t)i * g->ldo + c] *= inv;
        lse[q0 + i] = m[i] + logf(l[i]);
    }
}

void kern_cpu_attention_lean_fwd(kern_device *d, float *out, float *lse, float *scratch,
                                 const float *q, const float *k, const float *v, int ldq,
                                 int ldkv, const int *pos, const kern_att_opts *opts, int B,
                                 int T, int NH, int NKV, int hs)
{
    lean_geo g = geo_of(opts, T, NH, NKV, hs, ldq, ldkv);
    int G = NH / NKV;
#pragma omp parallel for num_threads(lean_threads(d, NH)) schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        float *scr = scratch + (size_t)omp_get_thread_num() * KERN_ATT_LEAN_TILE(T);
        const float *qb = q + (size_t)b * T * ldq + (size_t)h * hs;
        const float *kb = k + (size_t)b * T * ldkv + (size_t)(h / G) * hs;
        const float *vb = v + (size_t)b * T * ldkv + (size_t)(h / G) * hs;
        float *ob = out + (size_t)b * T * g.ldo + (size_t)h * hs;
        const int *pb = pos != NULL ? pos + (size_t)b * T : NULL;
        for (int q0 = 0; q0 < T; q0 += g.bq)
            fwd_query_tile(ob, lse + (size_t)bh * T, scr, qb, kb, vb, pb, &g, q0,
                           T - q0 < g.bq ? T - q0 : g.bq);
    }
}

/* ---- backward */

/* the views of one (sequence, query head) */
typedef struct bwd_view {
    const float *q, *k, *v, *dout, *out, *lse;
    float *dq, *dk, *dv;
    const int *pos;
} bwd_view;

/* S: raw products -> P; dP -> dS (both nq x nk), row D from the caller. */
static void bwd_tile_rows(float *S, float *dP, const float *D, const float *lse,
                          const int *pos, const lean_geo *g, int q0, int nq, int k0, int nk)
{
    for (int i = 0; i < nq; i++) {
        int t = q0 + i, lo = first_key(pos, g, t);
        float *s = S + (size_t)i * g->bk, *dp = dP + (size_t)i * g->bk;
        for (int j = 0; j < nk; j++) {
            int u = k0 + j;
            if (u < lo || u > t) {
                s[j] = dp[j] = 0.0f;
            } else if (g->cap > 0.0f) {
                float th = tanhf(s[j] * g->scale / g->cap), p = expf(g->cap * th - lse[t]);
                dp[j] = p * (dp[j] - D[i]) * (1.0f - th * th) * g->scale;
                s[j] = p;
            } else {
                float p = expf(s[j] * g->scale - lse[t]);
                dp[j] = p * (dp[j] - D[i]) * g->scale;
                s[j] = p;
            }
        }
    }
}

static void bwd_query_tile(const bwd_view *w, float *scr, const lean_geo *g, int q0, int nq)
{
    float *S = scr, *dP = scr + g->bq * g->bk, *D = dP + g->bq * g->bk;
    for (int i = 0; i < nq; i++) { /* D = rowsum(dout * out) */
        const float *a = w->dout + (size_t)(q0 + i) * g->ldo, *o = w->out + (size_t)(q0 + i) * g->ldo;
        float s = 0.0f;
        for (int c = 0; c < g->hs; c++)
            s += a[c] * o[c];
        D[i] = s;
    }
    const float *qt = w->q + (size_t)q0 * g->ldq, *dot = w->dout + (size_t)q0 * g->ldo;
    int lo = tile_first_key(w->pos, g, q0, q0 + nq);
    for (int k0 = lo / g->bk * g->bk; k0 < q0 + nq; k0 += g->bk) {
        int nk = q0 + nq - k0 < g->bk ? q0 + nq - k0 : g->bk;
        const float *kt = w->k + (size_t)k0 * g->ldkv, *vt = w->v + (size_t)k0 * g->ldkv;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, g->hs, 1.0f, qt, g->ldq, kt,
                    g->ldkv, 0.0f, S, g->bk);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, g->hs, 1.0f, dot, g->ldo,
                    vt, g->ldkv, 0.0f, dP, g->bk);
        bwd_tile_rows(S, dP, D, w->lse, w->pos, g, q0, nq, k0, nk);
        /* dv += P^T dout, dq += dS k, dk += dS^T q */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, g->hs, nq, 1.0f, S, g->bk, dot,
                    g->ldo, 1.0f, w->dv + (size_t)k0 * g->ldkv, g->ldkv);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, g->hs, nk, 1.0f, dP, g->bk,
                    kt, g->ldkv, 1.0f, w->dq + (size_t)q0 * g->ldq, g->ldq);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, g->hs, nq, 1.0f, dP, g->bk, qt,
                    g->ldq, 1.0f, w->dk + (size_t)k0 * g->ldkv, g->ldkv);
    }
}

void kern_cpu_attention_lean_bwd(kern_device *d, float *dq, float *dk, float *dv,
                                 float *scratch, const float *dout, const float *q,
                                 const float *k, const float *v, const float *lse,
                                 const float *out, int ldq, int ldkv, const int *pos,
                                 const kern_att_opts *opts, int B, int T, int NH, int NKV,
                                 int hs)
{
    lean_geo g = geo_of(opts, T, NH, NKV, hs, ldq, ldkv);
    int G = NH / NKV;
#pragma omp parallel for num_threads(lean_threads(d, NH)) schedule(static)
    for (int bk = 0; bk < B * NKV; bk++) {
        int b = bk / NKV, kvh = bk % NKV;
        float *scr = scratch + (size_t)omp_get_thread_num() * KERN_ATT_LEAN_TILE(T);
        size_t kv = (size_t)b * T * ldkv + (size_t)kvh * hs;
        for (int h = kvh * G; h < (kvh + 1) * G; h++) {
            size_t qo = (size_t)b * T * ldq + (size_t)h * hs;
            size_t oo = (size_t)b * T * g.ldo + (size_t)h * hs;
            bwd_view w = {q + qo, k + kv, v + kv, dout + oo, out + oo,
                          lse + ((size_t)b * NH + h) * T, dq + qo, dk + kv, dv + kv,
                          pos != NULL ? pos + (size_t)b * T : NULL};
            for (int q0 = 0; q0 < T; q0 += g.bq)
                bwd_query_tile(&w, scr, &g, q0, T - q0 < g.bq ? T - q0 : g.bq);
        }
    }
}
