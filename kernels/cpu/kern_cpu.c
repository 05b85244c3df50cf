/* kern_cpu: the CPU backend of kern_device.
 *
 * A CPU device is a slice of the host: host memory counted against a budget
 * (0 = unlimited) and `threads` OpenMP threads of the rank thread that opened
 * it. Matrix products go through cblas_sgemm. OpenBLAS's own thread pool is
 * process-wide and serialises concurrent callers, so it is pinned to one
 * thread and each rank splits its products over its own OpenMP team instead:
 * ranks then run side by side and a rank never uses more than `threads`
 * cores. Reductions (bias, LayerNorm and embedding gradients, sums of
 * squares) are split over fixed index ranges and summed in a fixed order, so
 * they do not depend on the thread count. The products do, in the last
 * bits: OpenBLAS picks its kernel blocking by the rows of a call, and a
 * rank's threads each multiply a slice of the rows. The same job with the
 * same threads per device gives the same bits (docs/engine.md).
 *
 * bf16 (set_precision): matmul_fwd / matmul_bwd round both operands of each
 * product to bf16 and accumulate in fp32 (bf16_gemm below: blocked, rounded
 * panels in a fixed per-thread host scratch, cblas_sgemm on the panels);
 * the fp32 path is untouched.
 */
#include <cblas.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kern_cpu.h"
#include "kern_cpu_lean.h"
#include "kern_cpu_llama.h"
#include "kern_device.h"

/* Kernels never read floating-point exception flags or errno, so GCC may
 * if-convert float selects (GELU's clamps): without it the GELU loops stay
 * scalar. No result bit changes. (sqrtf's errno check survives this pragma,
 * hence the SSE2 intrinsics in AdamW.) */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math", "no-math-errno")
#endif

#define CPU_ALIGN 64      /* cache line; also the header size */
#define SUMSQ_CHUNKS 64   /* fixed partition of sumsq, independent of threads */

typedef struct cpu_block {
    size_t bytes;
} cpu_block;

static int cpu_alloc(kern_device *d, size_t bytes, void **out, acc_err *err)
{
    *out = NULL;
    if (d->budget != 0 && d->in_use + bytes > d->budget)
        return acc_err_set(err, ACC_EOOM, "",
                           "device %s: out of memory allocating %zu bytes "
                           "(%llu of %llu bytes in use)",
                           d->info.name, bytes, (unsigned long long)d->in_use,
                           (unsigned long long)d->budget);
    void *raw = NULL;
    if (posix_memalign(&raw, CPU_ALIGN, CPU_ALIGN + (bytes ? bytes : 1)) != 0)
        return acc_err_set(err, ACC_ENOMEM, "", "device %s: host allocation of %zu bytes failed",
                           d->info.name, bytes);
    ((cpu_block *)raw)->bytes = bytes;
    d->in_use += bytes;
    if (d->in_use > d->peak)
        d->peak = d->in_use;
    *out = (char *)raw + CPU_ALIGN;
    return 0;
}

static void cpu_free(kern_device *d, void *p)
{
    if (p == NULL)
        return;
    cpu_block *b = (cpu_block *)((char *)p - CPU_ALIGN);
    d->in_use -= b->bytes;
    free(b);
}

static void cpu_zero(kern_device *d, void *p, size_t bytes) { memset(p, 0, bytes); }

static void cpu_copy(kern_device *d, void *dst, const void *src, size_t bytes)
{
    memmove(dst, src, bytes);
}

/* ---- embeddings */

static void cpu_encoder_fwd(kern_device *d, float *out, const int *tok, const float *wte,
                            const float *wpe, int B, int T, int C)
{
#pragma omp parallel for num_threads(d->threads)
    for (int n = 0; n < B * T; n++) {
        const float *we = wte + (size_t)tok[n] * C;
        const float *pe = wpe + (size_t)(n % T) * C;
        float *o = out + (size_t)n * C;
        for (int c = 0; c < C; c++)
            o[c] = we[c] + pe[c];
    }
}

/* Columns are split over threads so that no two threads write one row. */
static void cpu_encoder_bwd(kern_device *d, float *dwte, float *dwpe, const float *dout,
                            const int *tok, int B, int T, int C)
{
    enum { CB = 16 };
    int nblk = (C + CB - 1) / CB;
#pragma omp parallel for num_threads(d->threads)
    for (int blk = 0; blk < nblk; blk++) {
        int c0 = blk * CB, c1 = c0 + CB < C ? c0 + CB : C;
        for (int n = 0; n < B * T; n++) {
            const float *g = dout + (size_t)n * C;
            float *we = dwte + (size_t)tok[n] * C;
            float *pe = dwpe + (size_t)(n % T) * C;
            for (int c = c0; c < c1; c++) {
                we[c] += g[c];
                pe[c] += g[c];
            }
        }
    }
}

/* ---- layernorm */

static void cpu_layernorm_fwd(kern_device *d, float *out, float *mean, float *rstd,
                              const float *inp, const float *w, const float *b, int N, int C)
{
#pragma omp parallel for num_threads(d->threads)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float m = 0.0f;
        for (int c = 0; c < C; c++)
            m += x[c];
        m /= (float)C;
        float var = 0.0f;
        for (int c = 0; c < C; c++)
            var += (x[c] - m) * (x[c] - m);
        var /= (float)C;
        float s = 1.0f / sqrtf(var + 1e-5f);
        float *o = out + (size_t)n * C;
        for (int c = 0; c < C; c++)
            o[c] = (x[c] - m) * s * w[c] + b[c];
        mean[n] = m;
        rstd[n] = s;
    }
}

static void cpu_layernorm_bwd(kern_device *d, float *dinp, float *dw, float *db,
                              const float *dout, const float *inp, const float *w,
                              const float *mean, const float *rstd, int N, int C)
{
#pragma omp parallel for num_threads(d->threads)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *g = dout + (size_t)n * C;
        float m = mean[n], s = rstd[n];
        float mean_dn = 0.0f, mean_dn_norm = 0.0f;
        for (int c = 0; c < C; c++) {
            float dn = g[c] * w[c];
            mean_dn += dn;
            mean_dn_norm += dn * (x[c] - m) * s;
        }
        mean_dn /= (float)C;
        mean_dn_norm /= (float)C;
        float *di = dinp + (size_t)n * C;
        for (int c = 0; c < C; c++) {
            float norm = (x[c] - m) * s;
            di[c] += s * (g[c] * w[c] - mean_dn - norm * mean_dn_norm);
        }
    }
    enum { CB = 64 };
    int nblk = dw != NULL ? (C + CB - 1) / CB : 0; /* NULL: a frozen norm (LoRA) */
#pragma omp parallel for num_threads(d->threads)
    for (int blk = 0; blk < nblk; blk++) {
        int c0 = blk * CB, c1 = c0 + CB < C ? c0 + CB : C;
        float sw[CB] = {0}, sb[CB] = {0};
        for (int n = 0; n < N; n++) {
            const float *g = dout + (size_t)n * C, *x = inp + (size_t)n * C;
            float m = mean[n], s = rstd[n];
            for (int c = c0; c < c1; c++) {
                sw[c - c0] += g[c] * (x[c] - m) * s;
                sb[c - c0] += g[c];
            }
        }
        for (int c = c0; c < c1; c++) {
            dw[c] += sw[c - c0];
            db[c] += sb[c - c0];
        }
    }
}

/* ---- matmul: rows (or output channels) split over the rank's threads */

static void split_range(int n, int parts, int id, int *lo, int *hi)
{
    *lo = (int)((long long)n * id / parts);
    *hi = (int)((long long)n * (id + 1) / parts);
}

/* acc[c] += sum_n x[n,c] for c in [c0,c1), summed in n order; row-wise so
 * it streams memory, through a local buffer so the order per column is
 * exactly 0..N-1 whatever the split */
static void colsum_add(float *acc, const float *x, int N, int C, int c0, int c1)
{
    enum { CHUNK = 256 };
    float part[CHUNK];
    for (int lo = c0; lo < c1; lo += CHUNK) {
        int hi = lo + CHUNK < c1 ? lo + CHUNK : c1;
        memset(part, 0, sizeof part);
        for (int n = 0; n < N; n++) {
            const float *row = x + (size_t)n * C;
            for (int c = lo; c < hi; c++)
                part[c - lo] += row[c];
        }
        for (int c = lo; c < hi; c++)
            acc[c] += part[c - lo];
    }
}

/* ---- bf16 products (set_precision(bf16 = 1)), emulated: OpenBLAS has no
 * sbgemm. C[M,Nc] = beta C + op(A)[M,K] op(B)[K,Nc] (row-major, op = the
 * transpose when ta / tb) with both operands rounded to bf16: the product is
 * tiled into BF_T x BF_T blocks of C and BF_K-deep slices of K; each tile's
 * operand blocks are rounded into the calling thread's scratch (two dense
 * BF_T x BF_K panels) and multiplied there by cblas_sgemm in fp32. A
 * product of two bf16 values is exact in fp32, so this is a bf16 x bf16 ->
 * fp32 product; every element of C sums its K slices in ascending order, a
 * fixed order. The A block is rounded once per (row tile, K slice) and
 * reused for all column tiles; re-rounding the B block per row tile costs
 * 1/(2 BF_T) of the product's flops. Measured cost: bench/RESULTS.md. */

#define BF_T KERN_CPU_BF16_TILE
#define BF_K KERN_CPU_BF16_DEPTH

typedef struct cpu_impl {
    int bf16;        /* linear layers in bf16 */
    float *scratch;  /* [threads][2][BF_T * BF_K]: rounded operand panels */
} cpu_impl;

/* o[c] = kern_bf16_round(s[c]), four at a time: the same bit operations
 * (kern_bf16_round does not inline here -- this file's optimize pragma
 * differs from the header's -- and GCC does not vectorise its memcpy bit
 * casts) */
static void round_row(float *restrict o, const float *restrict s, int cols)
{
    int c = 0;
#ifdef __SSE2__
    const __m128i absm = _mm_set1_epi32(0x7fffffff), inf = _mm_set1_epi32(0x7f800000);
    const __m128i quiet = _mm_set1_epi32(0x00400000), half = _mm_set1_epi32(0x7fff);
    const __m128i one = _mm_set1_epi32(1), hi = _mm_set1_epi32((int)0xffff0000u);
    for (; c + 4 <= cols; c += 4) {
        __m128i u = _mm_castps_si128(_mm_loadu_ps(s + c));
        __m128i nan = _mm_cmpgt_epi32(_mm_and_si128(u, absm), inf);
        __m128i lsb = _mm_and_si128(_mm_srli_epi32(u, 16), one);
        __m128i rnd = _mm_add_epi32(u, _mm_add_epi32(half, lsb));
        __m128i r = _mm_or_si128(_mm_and_si128(nan, _mm_or_si128(u, quiet)),
                                 _mm_andnot_si128(nan, rnd));
        _mm_storeu_ps(o + c, _mm_castsi128_ps(_mm_and_si128(r, hi)));
    }
#endif
    for (; c < cols; c++)
        o[c] = kern_bf16_round(s[c]);
}

/* dst[r * cols + c] = bf16(src[(r0 + r) * ld + c0 + c]) */
static void round_block(float *restrict dst, const float *restrict src, size_t ld, int r0,
                        int rows, int c0, int cols)
{
    for (int r = 0; r < rows; r++)
        round_row(dst + (size_t)r * cols, src + (size_t)(r0 + r) * ld + c0, cols);
}

/* One thread's share: rows [m0, m1) of C, all its columns. */
static void bf16_gemm(float *scratch, int ta, int tb, int m0, int m1, int Nc, int K,
                      const float *A, int lda, const float *B, int ldb, float beta, float *Cm,
                      int ldc)
{
    float *pa = scratch, *pb = scratch + BF_T * BF_K;
    for (int i0 = m0; i0 < m1; i0 += BF_T) {
        int mi = m1 - i0 < BF_T ? m1 - i0 : BF_T;
        if (K <= 0 && beta == 0.0f) /* no product: C := 0, as sgemm would */
            for (int i = i0; i < i0 + mi; i++)
                memset(Cm + (size_t)i * ldc, 0, (size_t)Nc * sizeof *Cm);
        for (int k0 = 0; k0 < K; k0 += BF_K) {
            int kk = K - k0 < BF_K ? K - k0 : BF_K;
            float bk = k0 == 0 ? beta : 1.0f;
            /* op(A) block [mi, kk]: A is [M,K] (ld lda), or [K,M] when ta */
            if (ta)
                round_block(pa, A, (size_t)lda, k0, kk, i0, mi); /* [kk, mi] */
            else
                round_block(pa, A, (size_t)lda, i0, mi, k0, kk); /* [mi, kk] */
            for (int j0 = 0; j0 < Nc; j0 += BF_T) {
                int nj = Nc - j0 < BF_T ? Nc - j0 : BF_T;
                /* op(B) block [kk, nj]: B is [K,Nc] (ld ldb), or [Nc,K] when tb */
                if (tb)
                    round_block(pb, B, (size_t)ldb, j0, nj, k0, kk); /* [nj, kk] */
                else
                    round_block(pb, B, (size_t)ldb, k0, kk, j0, nj); /* [kk, nj] */
                cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                            tb ? CblasTrans : CblasNoTrans, mi, nj, kk, 1.0f, pa, ta ? mi : kk,
                            pb, tb ? kk : nj, bk, Cm + (size_t)i0 * ldc + j0, ldc);
            }
        }
    }
}

static float *bf16_scratch(kern_device *d)
{
    cpu_impl *im = d->impl;
    return im->scratch + (size_t)omp_get_thread_num() * 2 * BF_T * BF_K;
}

static int cpu_bf16(const kern_device *d)
{
    const cpu_impl *im = d->impl;
    return im != NULL && im->bf16;
}

/* The bf16 path's bias add: fp32, after the product, as in the fp32 path. */
static void add_bias_rows(float *out, const float *bias, int r0, int r1, int OC)
{
    for (int n = r0; n < r1; n++)
        for (int o = 0; o < OC; o++)
            out[(size_t)n * OC + o] += bias[o];
}

static void cpu_matmul_fwd_bf16(kern_device *d, float *out, const float *inp, const float *w,
                                const float *bias, int N, int C, int OC)
{
#pragma omp parallel num_threads(d->threads)
    {
        int r0, r1;
        split_range(N, omp_get_num_threads(), omp_get_thread_num(), &r0, &r1);
        if (r1 > r0) {
            /* out[N,OC] = inp[N,C] w[OC,C]^T */
            bf16_gemm(bf16_scratch(d), 0, 1, r0, r1, OC, C, inp, C, w, C, 0.0f, out, OC);
            if (bias != NULL)
                add_bias_rows(out, bias, r0, r1, OC);
        }
    }
}

static void cpu_matmul_bwd_bf16(kern_device *d, float *dinp, float *dw, float *dbias,
                                const float *dout, const float *inp, const float *w, int N,
                                int C, int OC)
{
#pragma omp parallel num_threads(d->threads)
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int r0, r1, o0, o1;
        split_range(N, nt, id, &r0, &r1);
        split_range(OC, nt, id, &o0, &o1);
        float *scr = bf16_scratch(d);
        /* dinp[N,C] += dout[N,OC] w[OC,C] */
        if (dinp != NULL && r1 > r0)
            bf16_gemm(scr, 0, 0, r0, r1, C, OC, dout, OC, w, C, 1.0f, dinp, C);
        if (o1 > o0 && dw != NULL) {
            /* dw[OC,C] += dout^T[OC,N] inp[N,C] */
            bf16_gemm(scr, 1, 0, o0, o1, C, N, dout, OC, inp, C, 1.0f, dw, C);
            if (dbias != NULL)
                colsum_add(dbias, dout, N, OC, o0, o1);
        }
    }
}

static void cpu_matmul_fwd(kern_device *d, float *out, const float *inp, const float *w,
                           const float *bias, int N, int C, int OC)
{
    if (cpu_bf16(d)) {
        cpu_matmul_fwd_bf16(d, out, inp, w, bias, N, C, OC);
        return;
    }
#pragma omp parallel num_threads(d->threads)
    {
        int r0, r1;
        split_range(N, omp_get_num_threads(), omp_get_thread_num(), &r0, &r1);
        if (r1 > r0) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, OC, C, 1.0f,
                        inp + (size_t)r0 * C, C, w, C, 0.0f, out + (size_t)r0 * OC, OC);
            if (bias != NULL)
                for (int n = r0; n < r1; n++)
                    for (int o = 0; o < OC; o++)
                        out[(size_t)n * OC + o] += bias[o];
        }
    }
}

static void cpu_matmul_bwd(kern_device *d, float *dinp, float *dw, float *dbias,
                           const float *dout, const float *inp, const float *w, int N, int C,
                           int OC)
{
    if (cpu_bf16(d)) {
        cpu_matmul_bwd_bf16(d, dinp, dw, dbias, dout, inp, w, N, C, OC);
        return;
    }
#pragma omp parallel num_threads(d->threads)
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int r0, r1, o0, o1;
        split_range(N, nt, id, &r0, &r1);
        split_range(OC, nt, id, &o0, &o1);
        if (dinp != NULL && r1 > r0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, C, OC, 1.0f,
                        dout + (size_t)r0 * OC, OC, w, C, 1.0f, dinp + (size_t)r0 * C, C);
        if (o1 > o0 && dw != NULL) {
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, o1 - o0, C, N, 1.0f,
                        dout + o0, OC, inp, C, 1.0f, dw + (size_t)o0 * C, C);
            if (dbias != NULL)
                colsum_add(dbias, dout, N, OC, o0, o1);
        }
    }
}

/* ---- attention: one (sequence, head) pair per task, over all pairs at once;
 * each thread works in its own two T x T slices of the scratch (the
 * scratch has NH pairs of slices, so at most NH threads), so writes never
 * overlap and no pair depends on which thread ran it. The products go through sgemm on the strided q/k/v views
 * of qkv; the scores above the diagonal are computed and then ignored
 * (0 there), which costs less than the scalar loops it replaces. Only the
 * rows' log-sum-exp is kept for the backward, which rebuilds the
 * probabilities from q k^T: T x T per head is never stored per layer. */

/* In place: scores -> probabilities (causal, scaled); lse[t] of each row. */
static void causal_softmax_rows(float *att, float *lse, int T, float scale)
{
    for (int t = 0; t < T; t++) {
        float *a = att + (size_t)t * T;
        float mx = -INFINITY;
        for (int u = 0; u <= t; u++) {
            a[u] *= scale;
            if (a[u] > mx)
                mx = a[u];
        }
        float sum = 0.0f;
        for (int u = 0; u <= t; u++) {
            a[u] = expf(a[u] - mx);
            sum += a[u];
        }
        float inv = 1.0f / sum;
        for (int u = 0; u <= t; u++)
            a[u] *= inv;
        for (int u = t + 1; u < T; u++)
            a[u] = 0.0f;
        lse[t] = mx + logf(sum);
    }
}

/* In place: scores -> the forward's probabilities, from lse. */
static void causal_probs_rows(float *att, const float *lse, int T, float scale)
{
    for (int t = 0; t < T; t++) {
        float *a = att + (size_t)t * T;
        for (int u = 0; u <= t; u++)
            a[u] = expf(a[u] * scale - lse[t]);
        for (int u = t + 1; u < T; u++)
            a[u] = 0.0f;
    }
}

/* Threads for attention: the scratch has one pair of slices per head. */
static int attention_threads(const kern_device *d, int NH)
{
    return d->threads < NH ? d->threads : NH;
}

/* a[T,T] = q k^T for one (sequence, head) view of qkv (row stride 3C) */
static void qk_scores(float *a, const float *q, int T, int C, int hs)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, q, 3 * C, q + C, 3 * C,
                0.0f, a, T);
}

static void cpu_attention_fwd(kern_device *d, float *out, float *lse, float *scratch,
                              const float *qkv, int B, int T, int C, int NH)
{
    int hs = C / NH, ld = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    size_t tt = (size_t)T * T;
#pragma omp parallel for num_threads(attention_threads(d, NH)) schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        const float *q = qkv + (size_t)b * T * ld + h * hs;
        float *a = scratch + 2 * (size_t)omp_get_thread_num() * tt;
        qk_scores(a, q, T, C, hs);
        causal_softmax_rows(a, lse + (size_t)bh * T, T, scale);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, q + 2 * C,
                    ld, 0.0f, out + (size_t)b * T * C + h * hs, C);
    }
}

static void cpu_attention_bwd(kern_device *d, float *dqkv, float *scratch, const float *dout,
                              const float *qkv, const float *lse, const float *out, int B,
                              int T, int C, int NH)
{
    int hs = C / NH, ld = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    size_t tt = (size_t)T * T;
#pragma omp parallel for num_threads(attention_threads(d, NH)) schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        const float *q = qkv + (size_t)b * T * ld + h * hs;
        const float *g = dout + (size_t)b * T * C + h * hs;
        float *dq = dqkv + (size_t)b * T * ld + h * hs;
        float *a = scratch + 2 * (size_t)omp_get_thread_num() * tt, *da = a + tt;
        /* the forward's probabilities, rebuilt */
        qk_scores(a, q, T, C, hs);
        causal_probs_rows(a, lse + (size_t)bh * T, T, scale);
        /* through out = att v: datt = dout v^T, dv += att^T dout */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, g, C,
                    q + 2 * C, ld, 0.0f, da, T);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, g, C,
                    1.0f, dq + 2 * C, ld);
        /* through the softmax: dpre = att (datt - <att, datt>) * scale, in place */
        for (int t = 0; t < T; t++) {
            const float *ar = a + (size_t)t * T;
            float *dr = da + (size_t)t * T;
            float dot = 0.0f;
            for (int u = 0; u <= t; u++)
                dot += ar[u] * dr[u];
            for (int u = 0; u <= t; u++)
                dr[u] = ar[u] * (dr[u] - dot) * scale;
            for (int u = t + 1; u < T; u++)
                dr[u] = 0.0f;
        }
        /* through the scores q k^T: dq += dpre k, dk += dpre^T q */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, da, T,
                    q + C, ld, 1.0f, dq, ld);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, da, T, q, ld,
                    1.0f, dq + C, ld);
    }
}

/* ---- pointwise */

#define GELU_S 0.7978845608028654f /* sqrt(2/pi) */

/* e^x without a libm call, so loops over it vectorise: 2^n p(r) with
 * n = round(x / ln2), r = x - n ln2 in [-ln2/2, ln2/2] (ln2 split in two
 * for exactness) and p the degree-6 Taylor polynomial, relative error
 * < 2e-7. x is clamped to [-87, 88], where 2^n stays a normal float. */
static inline float exp_poly(float x)
{
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    /* t + 128.5 > 0 here, so truncation rounds to nearest without a branch */
    float t = x * 1.44269504f;
    int n = (int)(t + 128.5f) - 128;
    float r = x - (float)n * 0.693145752f - (float)n * 1.42860677e-6f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.66666667e-1f + r * (4.16666667e-2f +
                                                   r * (8.33333333e-3f + r * 1.38888889e-3f)))));
    int32_t bits = (n + 127) * (1 << 23);
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* tanh(u) = 1 - 2/(e^2u + 1): saturates correctly (1 at the top, -1 at the
 * bottom), and its absolute error near 0 (~1e-7) is harmless inside
 * 0.5 x (1 + tanh). Several times cheaper than tanhf. */
static inline float fast_tanh(float u)
{
    return 1.0f - 2.0f / (exp_poly(2.0f * u) + 1.0f);
}

/* gelu(x) and gelu'(x), the tanh approximation (GPT-2's, Gemma's gate) */
static inline float gelu_val(float x)
{
    return 0.5f * x * (1.0f + fast_tanh(GELU_S * (x + 0.044715f * x * x * x)));
}

static inline float gelu_grad(float x)
{
    float th = fast_tanh(GELU_S * (x + 0.044715f * x * x * x));
    float sech2 = 1.0f - th * th;
    /* sech2 is exactly 0 long before |x| = 20; clamping keeps x^2 finite
     * there so 0 * inf cannot make a NaN */
    float xc = x < -20.0f ? -20.0f : x > 20.0f ? 20.0f : x;
    return 0.5f * (1.0f + th) + 0.5f * xc * sech2 * GELU_S * (1.0f + 3.0f * 0.044715f * xc * xc);
}

static void cpu_gelu_fwd(kern_device *d, float *out, const float *inp, size_t n)
{
#pragma omp parallel for simd num_threads(d->threads)
    for (size_t i = 0; i < n; i++)
        out[i] = gelu_val(inp[i]);
}

static void cpu_gelu_bwd(kern_device *d, float *dinp, const float *inp, const float *dout,
                         size_t n)
{
#pragma omp parallel for simd num_threads(d->threads)
    for (size_t i = 0; i < n; i++)
        dinp[i] += gelu_grad(inp[i]) * dout[i];
}

static void cpu_geglu_fwd(kern_device *d, float *out, const float *gate, const float *up,
                          size_t n)
{
#pragma omp parallel for simd num_threads(d->threads)
    for (size_t i = 0; i < n; i++)
        out[i] = gelu_val(gate[i]) * up[i];
}

static void cpu_geglu_bwd(kern_device *d, float *dgate, float *dup, const float *dout,
                          const float *gate, const float *up, size_t n)
{
#pragma omp parallel for simd num_threads(d->threads)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i], gi = dout[i];
        dgate[i] += gelu_grad(g) * (gi * up[i]);
        dup[i] += gi * gelu_val(g);
    }
}

/* libm's tanhf: the capped logits feed the loss directly */
static void cpu_softcap_fwd(kern_device *d, float *out, const float *inp, float cap, size_t n)
{
#pragma omp parallel for num_threads(d->threads)
    for (size_t i = 0; i < n; i++)
        out[i] = cap * tanhf(inp[i] / cap);
}

static void cpu_softcap_bwd(kern_device *d, float *dinp, const float *dout, const float *inp,
                            float cap, size_t n)
{
#pragma omp parallel for num_threads(d->threads)
    for (size_t i = 0; i < n; i++) {
        float th = tanhf(inp[i] / cap);
        dinp[i] = dout[i] * (1.0f - th * th);
    }
}

static void cpu_add(kern_device *d, float *out, const float *a, const float *b, size_t n)
{
#pragma omp parallel for num_threads(d->threads)
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

static void cpu_scale(kern_device *d, float *x, float s, size_t n)
{
#pragma omp parallel for num_threads(d->threads)
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
}

static void cpu_widen16(kern_device *d, float *out, const uint16_t *in, size_t n, int f16)
{
#pragma omp parallel for num_threads(d->threads)
    for (size_t i = 0; i < n; i++)
        out[i] = f16 ? kern_f16_to_f32(in[i]) : kern_bf16_to_f32(in[i]);
}

static void cpu_narrow_bf16(kern_device *d, uint16_t *out, const float *in, size_t n)
{
#pragma omp parallel for num_threads(d->threads)
    for (size_t i = 0; i < n; i++) {
        float r = kern_bf16_round(in[i]);
        uint32_t u;
        memcpy(&u, &r, sizeof u);
        out[i] = (uint16_t)(u >> 16);
    }
}

/* NF4 codes times their block's absmax (kern_device.h). The
 * absmax of a block is rebuilt per value: two fp32 operations, cheaper
 * than a scratch buffer and the same bits. */
static float nf4_absmax_at(const kern_nf4 *q, size_t b)
{
    if (q->absmax != NULL)
        return q->absmax[b];
    float v = q->nested_map[q->qabsmax[b]] * q->nested_absmax[b / 256];
    return v + q->offset;
}

static void cpu_dequant_nf4(kern_device *d, float *out, const kern_nf4 *q, size_t n)
{
#pragma omp parallel for num_threads(d->threads)
    for (size_t i = 0; i < n; i++) {
        uint8_t byte = q->codes[i / 2];
        uint8_t c = i % 2 == 0 ? (uint8_t)(byte >> 4) : (uint8_t)(byte & 15);
        out[i] = q->map[c] * nf4_absmax_at(q, i / 64);
    }
}

/* ---- loss */

static void cpu_xent(kern_device *d, float *logits, float *losses, double *loss_sum,
                     const int *targets, const float *weights, int N, int V, int Vp,
                     int want_grad)
{
#pragma omp parallel for num_threads(d->threads)
    for (int n = 0; n < N; n++) {
        float *l = logits + (size_t)n * Vp;
        float mx = -INFINITY;
        for (int v = 0; v < V; v++)
            if (l[v] > mx)
                mx = l[v];
        double sum = 0.0;
        for (int v = 0; v < V; v++)
            sum += exp((double)(l[v] - mx));
        losses[n] = (float)(log(sum) - (double)(l[targets[n]] - mx));
        if (!want_grad)
            continue;
        float w = weights[n];
        float inv = (float)(1.0 / sum);
        for (int v = 0; v < V; v++)
            l[v] = w * (expf(l[v] - mx) * inv - (v == targets[n] ? 1.0f : 0.0f));
        for (int v = V; v < Vp; v++)
            l[v] = 0.0f;
    }
    double s = 0.0;
    for (int n = 0; n < N; n++)
        s += (double)weights[n] * losses[n];
    *loss_sum = s;
}

/* ---- optimizer */

typedef struct adamw_k {
    float lr, beta1, beta2, eps, wd, scale, ic1, ic2;
} adamw_k;

static inline void adamw_one(float *p, const float *g, float *m, float *v, size_t i,
                             const adamw_k *k)
{
    float gi = g[i] * k->scale;
    m[i] = k->beta1 * m[i] + (1.0f - k->beta1) * gi;
    v[i] = k->beta2 * v[i] + (1.0f - k->beta2) * gi * gi;
    float mh = m[i] * k->ic1, vh = v[i] * k->ic2;
    p[i] -= k->lr * (mh / (sqrtf(vh) + k->eps) + k->wd * p[i]);
}

/* The same arithmetic four lanes at a time (sqrtf's errno check keeps the
 * compiler from vectorising the scalar loop); every lane computes exactly
 * what adamw_one computes, so the split never changes a bit. */
static void adamw_span(float *p, const float *g, float *m, float *v, size_t lo, size_t hi,
                       const adamw_k *k)
{
    size_t i = lo;
#ifdef __SSE2__
    const __m128 b1 = _mm_set1_ps(k->beta1), b2 = _mm_set1_ps(k->beta2);
    const __m128 nb1 = _mm_set1_ps(1.0f - k->beta1), nb2 = _mm_set1_ps(1.0f - k->beta2);
    const __m128 sc = _mm_set1_ps(k->scale), ic1 = _mm_set1_ps(k->ic1), ic2 = _mm_set1_ps(k->ic2);
    const __m128 lr = _mm_set1_ps(k->lr), eps = _mm_set1_ps(k->eps), wd = _mm_set1_ps(k->wd);
    for (; i + 4 <= hi; i += 4) {
        __m128 gi = _mm_mul_ps(_mm_loadu_ps(g + i), sc);
        __m128 mi = _mm_add_ps(_mm_mul_ps(b1, _mm_loadu_ps(m + i)), _mm_mul_ps(nb1, gi));
        __m128 vi = _mm_add_ps(_mm_mul_ps(b2, _mm_loadu_ps(v + i)),
                               _mm_mul_ps(_mm_mul_ps(nb2, gi), gi));
        _mm_storeu_ps(m + i, mi);
        _mm_storeu_ps(v + i, vi);
        __m128 mh = _mm_mul_ps(mi, ic1), vh = _mm_mul_ps(vi, ic2);
        __m128 pi = _mm_loadu_ps(p + i);
        __m128 upd = _mm_add_ps(_mm_div_ps(mh, _mm_add_ps(_mm_sqrt_ps(vh), eps)),
                                _mm_mul_ps(wd, pi));
        _mm_storeu_ps(p + i, _mm_sub_ps(pi, _mm_mul_ps(lr, upd)));
    }
#endif
    for (; i < hi; i++)
        adamw_one(p, g, m, v, i, k);
}

static void cpu_adamw(kern_device *d, float *p, const float *g, float *m, float *v, size_t n,
                      float lr, float beta1, float beta2, float eps, float weight_decay,
                      float grad_scale, int t)
{
    adamw_k k = {.lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps, .wd = weight_decay,
                 .scale = grad_scale,
                 .ic1 = 1.0f / (1.0f - powf(beta1, (float)t)),
                 .ic2 = 1.0f / (1.0f - powf(beta2, (float)t))};
    if (n < 4096) { /* LayerNorm and bias tensors: not worth a thread team */
        adamw_span(p, g, m, v, 0, n, &k);
        return;
    }
#pragma omp parallel num_threads(d->threads)
    {
        size_t nt = (size_t)omp_get_num_threads(), id = (size_t)omp_get_thread_num();
        size_t lo = n * id / nt / 4 * 4, hi = id + 1 == nt ? n : n * (id + 1) / nt / 4 * 4;
        adamw_span(p, g, m, v, lo, hi, &k);
    }
}

static double cpu_sumsq(kern_device *d, const float *x, size_t n)
{
    double part[SUMSQ_CHUNKS];
#pragma omp parallel for num_threads(d->threads)
    for (int k = 0; k < SUMSQ_CHUNKS; k++) {
        size_t lo = n * (size_t)k / SUMSQ_CHUNKS, hi = n * (size_t)(k + 1) / SUMSQ_CHUNKS;
        double s = 0.0;
        for (size_t i = lo; i < hi; i++)
            s += (double)x[i] * x[i];
        part[k] = s;
    }
    double s = 0.0;
    for (int k = 0; k < SUMSQ_CHUNKS; k++)
        s += part[k];
    return s;
}

static void cpu_close(kern_device *d)
{
    cpu_impl *im = d->impl;
    if (im != NULL)
        free(im->scratch);
    free(im);
    free(d);
}

/* bf16 = 1: allocate the rounding scratch (KERN_CPU_BF16_SCRATCH bytes per
 * kernel thread, host memory outside the budget); bf16 = 0 gives it back. */
static int cpu_set_precision(kern_device *d, int bf16, acc_err *err)
{
    cpu_impl *im = d->impl;
    if (!bf16) {
        if (im != NULL) {
            free(im->scratch);
            im->scratch = NULL;
            im->bf16 = 0;
        }
        return 0;
    }
    if (im == NULL && (im = d->impl = calloc(1, sizeof *im)) == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "device %s: out of host memory for bf16",
                           d->info.name);
    if (im->scratch == NULL) {
        im->scratch = malloc((size_t)d->threads * KERN_CPU_BF16_SCRATCH);
        if (im->scratch == NULL)
            return acc_err_set(err, ACC_ENOMEM, "",
                               "device %s: out of host memory for the bf16 scratch (%zu bytes)",
                               d->info.name, (size_t)d->threads * KERN_CPU_BF16_SCRATCH);
    }
    im->bf16 = 1;
    return 0;
}

static int cpu_last_error(kern_device *d, acc_err *err)
{
    return 0; /* every CPU kernel has finished when it returns */
}

static const kern_ops cpu_ops = {
    .backend = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .zero = cpu_zero,
    .copy = cpu_copy,
    .upload = cpu_copy,
    .download = cpu_copy,
    .encoder_fwd = cpu_encoder_fwd,
    .encoder_bwd = cpu_encoder_bwd,
    .layernorm_fwd = cpu_layernorm_fwd,
    .layernorm_bwd = cpu_layernorm_bwd,
    .matmul_fwd = cpu_matmul_fwd,
    .matmul_bwd = cpu_matmul_bwd,
    .attention_fwd = cpu_attention_fwd,
    .attention_bwd = cpu_attention_bwd,
    .gelu_fwd = cpu_gelu_fwd,
    .gelu_bwd = cpu_gelu_bwd,
    .add = cpu_add,
    .xent = cpu_xent,
    .adamw = cpu_adamw,
    .sumsq = cpu_sumsq,
    .close = cpu_close,
    .last_error = cpu_last_error,
    .set_precision = cpu_set_precision,
    /* the LLaMA family's ops: kern_cpu_llama.c */
    .embed_fwd = kern_cpu_embed_fwd,
    .embed_bwd = kern_cpu_embed_bwd,
    .rmsnorm_fwd = kern_cpu_rmsnorm_fwd,
    .rmsnorm_bwd = kern_cpu_rmsnorm_bwd,
    .rope_fwd = kern_cpu_rope_fwd,
    .rope_bwd = kern_cpu_rope_bwd,
    .swiglu_fwd = kern_cpu_swiglu_fwd,
    .swiglu_bwd = kern_cpu_swiglu_bwd,
    .gqa_attention_fwd = kern_cpu_gqa_attention_fwd,
    .gqa_attention_bwd = kern_cpu_gqa_attention_bwd,
    .gqa_attention_pos_fwd = kern_cpu_gqa_attention_pos_fwd,
    .gqa_attention_pos_bwd = kern_cpu_gqa_attention_pos_bwd,
    .scale = cpu_scale,
    .widen16 = cpu_widen16,
    /* Qwen3's and Gemma 2's: here and kern_cpu_llama.c */
    .softcap_fwd = cpu_softcap_fwd,
    .softcap_bwd = cpu_softcap_bwd,
    .geglu_fwd = cpu_geglu_fwd,
    .geglu_bwd = cpu_geglu_bwd,
    .rmsnorm_ofs_fwd = kern_cpu_rmsnorm_ofs_fwd,
    .rmsnorm_ofs_bwd = kern_cpu_rmsnorm_ofs_bwd,
    .gqa_attention_opt_fwd = kern_cpu_gqa_attention_opt_fwd,
    .gqa_attention_opt_bwd = kern_cpu_gqa_attention_opt_bwd,
    /* lean activations: kern_cpu_lean.c */
    .attention_lean_fwd = kern_cpu_attention_lean_fwd,
    .attention_lean_bwd = kern_cpu_attention_lean_bwd,
    .dequant_nf4 = cpu_dequant_nf4,
    /* generation: kern_cpu_llama.c */
    .attention_cache_fwd = kern_cpu_attention_cache_fwd,
    .narrow_bf16 = cpu_narrow_bf16,
};

const kern_ops *kern_cpu_ops(void)
{
    return &cpu_ops;
}

int kern_cpu_open(const kern_device_info *info, int threads, kern_device **out, acc_err *err)
{
    *out = NULL;
    kern_device *d = calloc(1, sizeof *d);
    if (d == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory opening %s", info->name);
    d->ops = &cpu_ops;
    d->info = *info;
    d->budget = info->mem_total;
    d->threads = threads > 0 ? threads : 1;
    /* see the header comment: ranks parallelise sgemm themselves */
    openblas_set_num_threads(1);
    *out = d;
    return 0;
}
