/* kern_cuda_llama: the CUDA backend's LLaMA-family ops. Contract:
 * kern_cuda_llama.h / kern_device.h; the CPU backend (kern_cpu_llama.c) is
 * the reference, compared op by op in the start-up self-test and in
 * tests/gpu/test_cuda_llama.c.
 *
 * Correctness first; none of this is tuned yet:
 *  - embedding: a grid-stride gather; its backward atomicAdds per element
 *    (tokens repeat), as encoder_bwd does;
 *  - RMSNorm: one 256-thread block per row; dw by column sums over
 *    256-row chunks, atomicAdd into the gradient;
 *  - RoPE, SwiGLU: grid-stride, one thread per rotated pair / element;
 *  - grouped-query attention: UNOPTIMISED plain kernels, no tensor cores,
 *    no cuBLAS. One sequence at a time; the forward runs one block per
 *    (query head, row t): the scaled scores of row t into the scratch, max,
 *    e^x, sum, lse, then out_t = sum_u p_u v_u, thread per channel. The
 *    backward is two kernels: one block per (query head, row t) rebuilds
 *    P from lse and writes P and dS = P (dP - <P, dP>) / sqrt(hs) to the
 *    scratch and adds dq_t; then one block per (key/value head, key u)
 *    sums dk_u and dv_u over the group's query heads and rows t >= u in a
 *    fixed order (no atomics). The scratch is the interface's (two NH x T
 *    x T matrices of one sequence); no layer keeps a T x T matrix.
 *    Options (Qwen3 / Gemma 2, kern_att_opts): the scale, capped scores
 *    (the backward's rows recompute each raw product for the cap's
 *    derivative) and a sliding window (the first key a row sees).
 *
 * Precision: the build uses --use_fast_math, so the exponentials (softmax,
 * silu) and lse's log are computed in double (fast-math changes only
 * single precision) and divisions / square roots that set a result use
 * the correctly rounded __fdiv_rn / __fsqrt_rn: the ops agree with the
 * CPU's libm to fp32 summation-order error. Atomic sums (dwte, dw) make
 * the results not bitwise reproducible run to run, as elsewhere on CUDA.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

extern "C" {
#include "kern_device.h"
}
#include "kern_cuda.h"
#include "kern_cuda_impl.cuh"
#include "kern_cuda_llama.h"

#define LL_THREADS 256 /* blocks of the row kernels */
#define LL_ROWS 256    /* rows per block of a column reduction */
#define ATT_THREADS 128

static __device__ __forceinline__ float exp_d(float x)
{
    return (float)exp((double)x);
}

/* ---- embedding without positions */

static __global__ void k_embed_fwd(float *out, const int *tok, const float *wte, int C,
                                   size_t total)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = wte[(size_t)tok[i / C] * C + i % C];
}

static __global__ void k_embed_bwd(float *dwte, const float *dout, const int *tok, int C,
                                   size_t total)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        atomicAdd(&dwte[(size_t)tok[i / C] * C + i % C], dout[i]);
}

extern "C" void kern_cuda_embed_fwd(kern_device *d, float *out, const int *tok,
                                    const float *wte, int N, int C)
{
    CU_LIVE(d);
    size_t total = (size_t)N * C;
    if (total == 0)
        return;
    k_embed_fwd<<<grid_for(total, 256), 256, 0, IM(d)->stream>>>(out, tok, wte, C, total);
    CU_LAUNCHED(d, "embed_fwd");
}

extern "C" void kern_cuda_embed_bwd(kern_device *d, float *dwte, const float *dout,
                                    const int *tok, int N, int C)
{
    CU_LIVE(d);
    size_t total = (size_t)N * C;
    if (total == 0)
        return;
    k_embed_bwd<<<grid_for(total, 256), 256, 0, IM(d)->stream>>>(dwte, dout, tok, C, total);
    CU_LAUNCHED(d, "embed_bwd");
}

/* ---- RMSNorm: one block per row */

/* the weight with its offset, added only when there is one (rmsnorm_fwd's
 * arithmetic unchanged) */
static __device__ __forceinline__ float ofs_w(const float *w, float offset, int c)
{
    return offset != 0.0f ? w[c] + offset : w[c];
}

static __global__ void k_rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *w,
                                     float offset, float eps, int C)
{
    __shared__ float sh[32];
    const float *x = inp + (size_t)blockIdx.x * C;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        ss += x[c] * x[c];
    ss = block_sum(ss, sh);
    float s = __fdiv_rn(1.0f, __fsqrt_rn(__fdiv_rn(ss, (float)C) + eps));
    float *o = out + (size_t)blockIdx.x * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        o[c] = x[c] * s * ofs_w(w, offset, c);
    if (threadIdx.x == 0)
        rstd[blockIdx.x] = s;
}

/* dinp += s g w - x s^3 / C * sum_c g w x */
static __global__ void k_rmsnorm_bwd_inp(float *dinp, const float *dout, const float *inp,
                                         const float *w, float offset, const float *rstd,
                                         int C)
{
    __shared__ float sh[32];
    size_t row = blockIdx.x;
    const float *x = inp + row * C, *g = dout + row * C;
    float dot = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        dot += g[c] * ofs_w(w, offset, c) * x[c];
    dot = block_sum(dot, sh);
    float s = rstd[row];
    float k = __fdiv_rn(dot * s * s * s, (float)C);
    float *di = dinp + row * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        di[c] += s * g[c] * ofs_w(w, offset, c) - k * x[c];
}

/* dw[c] += sum over the block's rows of g x rstd: thread per column */
static __global__ void k_rmsnorm_bwd_w(float *dw, const float *dout, const float *inp,
                                       const float *rstd, int N, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    int r0 = blockIdx.y * LL_ROWS, r1 = r0 + LL_ROWS < N ? r0 + LL_ROWS : N;
    float s = 0.0f;
    for (int n = r0; n < r1; n++)
        s += dout[(size_t)n * C + c] * inp[(size_t)n * C + c] * rstd[n];
    atomicAdd(&dw[c], s);
}

extern "C" void kern_cuda_rmsnorm_ofs_fwd(kern_device *d, float *out, float *rstd,
                                          const float *inp, const float *w, float offset,
                                          float eps, int N, int C)
{
    CU_LIVE(d);
    if (N <= 0 || C <= 0)
        return;
    k_rmsnorm_fwd<<<(unsigned)N, LL_THREADS, 0, IM(d)->stream>>>(out, rstd, inp, w, offset, eps,
                                                                C);
    CU_LAUNCHED(d, "rmsnorm_fwd");
}

extern "C" void kern_cuda_rmsnorm_ofs_bwd(kern_device *d, float *dinp, float *dw,
                                          const float *dout, const float *inp, const float *w,
                                          float offset, const float *rstd, int N, int C)
{
    CU_LIVE(d);
    if (N <= 0 || C <= 0)
        return;
    k_rmsnorm_bwd_inp<<<(unsigned)N, LL_THREADS, 0, IM(d)->stream>>>(dinp, dout, inp, w, offset,
                                                                    rstd, C);
    if (!CU_LAUNCHED(d, "rmsnorm_bwd_inp") || dw == NULL) /* dw NULL: a frozen weight */
        return;
    dim3 grid((unsigned)((C + 255) / 256), (unsigned)((N + LL_ROWS - 1) / LL_ROWS));
    k_rmsnorm_bwd_w<<<grid, 256, 0, IM(d)->stream>>>(dw, dout, inp, rstd, N, C);
    CU_LAUNCHED(d, "rmsnorm_bwd_w");
}

extern "C" void kern_cuda_rmsnorm_fwd(kern_device *d, float *out, float *rstd,
                                      const float *inp, const float *w, float eps, int N, int C)
{
    kern_cuda_rmsnorm_ofs_fwd(d, out, rstd, inp, w, 0.0f, eps, N, C);
}

extern "C" void kern_cuda_rmsnorm_bwd(kern_device *d, float *dinp, float *dw, const float *dout,
                                      const float *inp, const float *w, const float *rstd, int N,
                                      int C)
{
    kern_cuda_rmsnorm_ofs_bwd(d, dinp, dw, dout, inp, w, 0.0f, rstd, N, C);
}

/* ---- RoPE: one thread per rotated pair; dir = 1 forward, -1 transpose */

static __global__ void k_rope(float *out, const float *inp, const float *cos_t,
                              const float *sin_t, const int *pos, int T, int H, int half,
                              float dir, size_t total)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int j = (int)(i % half);
        size_t nh = i / half;         /* (token, head) */
        size_t n = nh / H;            /* token */
        int p = pos != NULL ? pos[n] : (int)(n % T);
        float c = cos_t[(size_t)p * half + j], s = dir * sin_t[(size_t)p * half + j];
        size_t off = nh * 2 * half;
        float x1 = inp[off + j], x2 = inp[off + j + half];
        out[off + j] = x1 * c - x2 * s;
        out[off + j + half] = x2 * c + x1 * s;
    }
}

static void rope_launch(kern_device *d, float *out, const float *inp, const float *cos_t,
                        const float *sin_t, const int *pos, int B, int T, int H, int hs,
                        float dir)
{
    size_t total = (size_t)B * T * H * (hs / 2);
    if (total == 0)
        return;
    k_rope<<<grid_for(total, 256), 256, 0, IM(d)->stream>>>(out, inp, cos_t, sin_t, pos, T, H,
                                                          hs / 2, dir, total);
    CU_LAUNCHED(d, "rope");
}

extern "C" void kern_cuda_rope_fwd(kern_device *d, float *out, const float *inp,
                                   const float *cos_t, const float *sin_t, const int *pos, int B,
                                   int T, int H, int hs)
{
    CU_LIVE(d);
    rope_launch(d, out, inp, cos_t, sin_t, pos, B, T, H, hs, 1.0f);
}

extern "C" void kern_cuda_rope_bwd(kern_device *d, float *dinp, const float *dout,
                                   const float *cos_t, const float *sin_t, const int *pos, int B,
                                   int T, int H, int hs)
{
    CU_LIVE(d);
    rope_launch(d, dinp, dout, cos_t, sin_t, pos, B, T, H, hs, -1.0f);
}

/* ---- SwiGLU */

static __device__ __forceinline__ float sigmoid_d(float x)
{
    return (float)(1.0 / (1.0 + exp(-(double)x)));
}

static __global__ void k_swiglu_fwd(float *out, const float *gate, const float *up, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = gate[i];
        out[i] = g * sigmoid_d(g) * up[i];
    }
}

static __global__ void k_swiglu_bwd(float *dgate, float *dup, const float *dout,
                                    const float *gate, const float *up, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = gate[i], sg = sigmoid_d(g), gi = dout[i];
        dgate[i] += gi * up[i] * sg * (1.0f + g * (1.0f - sg));
        dup[i] += gi * g * sg;
    }
}

extern "C" void kern_cuda_swiglu_fwd(kern_device *d, float *out, const float *gate,
                                     const float *up, size_t n)
{
    CU_LIVE(d);
    if (n == 0)
        return;
    k_swiglu_fwd<<<grid_for(n, 256), 256, 0, IM(d)->stream>>>(out, gate, up, n);
    CU_LAUNCHED(d, "swiglu_fwd");
}

extern "C" void kern_cuda_swiglu_bwd(kern_device *d, float *dgate, float *dup,
                                     const float *dout, const float *gate, const float *up,
                                     size_t n)
{
    CU_LIVE(d);
    if (n == 0)
        return;
    k_swiglu_bwd<<<grid_for(n, 256), 256, 0, IM(d)->stream>>>(dgate, dup, dout, gate, up, n);
    CU_LAUNCHED(d, "swiglu_bwd");
}

/* ---- grouped-query attention (unoptimised: see the header comment) */

/* one sequence's views: rows of [T, H, hs] have stride H * hs */
struct gqa_seq {
    const float *q, *k, *v, *dout;
    float *out, *dq, *dk, *dv;
    float *lse;       /* [NH, T] of this sequence */
    const float *lsec;
    const int *pos;   /* [T] this sequence's positions (packed documents), or NULL */
    int T, NH, NKV, hs;
    float scale;
    float cap;  /* > 0: scores capped at cap * tanh(s / cap) */
    int window; /* > 0: keys t - window < u <= t only */
};

/* The first key row t sees: its document's first token, and no further
 * back than the window. */
static __device__ __forceinline__ int gqa_lo(const gqa_seq &s, int t)
{
    int lo = s.pos != nullptr ? t - s.pos[t] : 0;
    if (s.window > 0 && t - s.window + 1 > lo)
        lo = t - s.window + 1;
    return lo;
}

/* tanh of a scaled product over the cap, in double (fast-math) */
static __device__ __forceinline__ float gqa_tanh(const gqa_seq &s, float x)
{
    return (float)tanh((double)__fdiv_rn(x * s.scale, s.cap));
}

/* The score of a raw product: scaled, capped when the call caps. */
static __device__ __forceinline__ float gqa_score(const gqa_seq &s, float x)
{
    return s.cap > 0.0f ? s.cap * gqa_tanh(s, x) : x * s.scale;
}

static __device__ __forceinline__ float gqa_dot(const float *a, const float *b, int n)
{
    float acc = 0.0f;
    for (int c = 0; c < n; c++)
        acc += a[c] * b[c];
    return acc;
}

/* forward: block (t, h) = blockIdx.x % T, blockIdx.x / T */
static __global__ void k_gqa_fwd(gqa_seq s, float *att)
{
    extern __shared__ float dyn[]; /* q_t [hs] */
    __shared__ float sh[32];
    int t = blockIdx.x % s.T, h = blockIdx.x / s.T, kvh = h / (s.NH / s.NKV);
    int ldq = s.NH * s.hs, ldk = s.NKV * s.hs;
    const float *qt = s.q + (size_t)t * ldq + (size_t)h * s.hs;
    for (int c = threadIdx.x; c < s.hs; c += blockDim.x)
        dyn[c] = qt[c];
    __syncthreads();
    float *a = att + ((size_t)h * s.T + t) * s.T;
    int lo = gqa_lo(s, t);
    float mx = -INFINITY;
    for (int u = lo + (int)threadIdx.x; u <= t; u += blockDim.x) {
        const float *ku = s.k + (size_t)u * ldk + (size_t)kvh * s.hs;
        a[u] = gqa_score(s, gqa_dot(dyn, ku, s.hs));
        mx = fmaxf(mx, a[u]);
    }
    mx = block_max(mx, sh);
    float sum = 0.0f;
    for (int u = lo + (int)threadIdx.x; u <= t; u += blockDim.x) {
        float e = exp_d(a[u] - mx);
        a[u] = e;
        sum += e;
    }
    sum = block_sum(sum, sh); /* its barriers also publish a[] to the block */
    if (threadIdx.x == 0)
        s.lse[(size_t)h * s.T + t] = (float)((double)mx + log((double)sum));
    float inv = __fdiv_rn(1.0f, sum);
    float *ot = s.out + (size_t)t * ldq + (size_t)h * s.hs;
    for (int c = threadIdx.x; c < s.hs; c += blockDim.x) {
        float acc = 0.0f;
        for (int u = lo; u <= t; u++)
            acc += a[u] * inv * s.v[(size_t)u * ldk + (size_t)kvh * s.hs + c];
        ot[c] = acc;
    }
}

/* backward, rows: P and dS of row t of head h into the scratch; dq_t += dS K */
static __global__ void k_gqa_bwd_rows(gqa_seq s, float *P, float *dS)
{
    extern __shared__ float dyn[]; /* q_t [hs], dout_t [hs] */
    __shared__ float sh[32];
    int t = blockIdx.x % s.T, h = blockIdx.x / s.T, kvh = h / (s.NH / s.NKV);
    int ldq = s.NH * s.hs, ldk = s.NKV * s.hs;
    size_t qo = (size_t)t * ldq + (size_t)h * s.hs;
    float *qs = dyn, *gs = dyn + s.hs;
    for (int c = threadIdx.x; c < s.hs; c += blockDim.x) {
        qs[c] = s.q[qo + c];
        gs[c] = s.dout[qo + c];
    }
    __syncthreads();
    size_t row = ((size_t)h * s.T + t) * s.T;
    int lo = gqa_lo(s, t);
    float l = s.lsec[(size_t)h * s.T + t], dot = 0.0f;
    for (int u = lo + (int)threadIdx.x; u <= t; u += blockDim.x) {
        const float *ku = s.k + (size_t)u * ldk + (size_t)kvh * s.hs;
        const float *vu = s.v + (size_t)u * ldk + (size_t)kvh * s.hs;
        float sc = 0.0f, dp = 0.0f;
        for (int c = 0; c < s.hs; c++) {
            sc += qs[c] * ku[c];
            dp += gs[c] * vu[c];
        }
        float p = exp_d(gqa_score(s, sc) - l);
        P[row + u] = p;
        dS[row + u] = dp;
        dot += p * dp;
    }
    dot = block_sum(dot, sh);
    for (int u = lo + (int)threadIdx.x; u <= t; u += blockDim.x) {
        float f = s.scale;
        if (s.cap > 0.0f) { /* the cap's derivative, from the raw product again */
            float th = gqa_tanh(s, gqa_dot(qs, s.k + (size_t)u * ldk + (size_t)kvh * s.hs, s.hs));
            f *= 1.0f - th * th;
        }
        dS[row + u] = P[row + u] * (dS[row + u] - dot) * f;
    }
    __syncthreads();
    for (int c = threadIdx.x; c < s.hs; c += blockDim.x) {
        float acc = 0.0f;
        for (int u = lo; u <= t; u++)
            acc += dS[row + u] * s.k[(size_t)u * ldk + (size_t)kvh * s.hs + c];
        s.dq[qo + c] += acc;
    }
}

/* backward, columns: block (u, kvh); dk_u += sum dS^T q, dv_u += sum P^T dout
 * over the group's heads and the rows t >= u, in a fixed order */
static __global__ void k_gqa_bwd_cols(gqa_seq s, const float *P, const float *dS)
{
    int u = blockIdx.x % s.T, kvh = blockIdx.x / s.T, G = s.NH / s.NKV;
    int ldq = s.NH * s.hs, ldk = s.NKV * s.hs;
    for (int c = threadIdx.x; c < s.hs; c += blockDim.x) {
        float ak = 0.0f, av = 0.0f;
        for (int h = kvh * G; h < (kvh + 1) * G; h++)
            for (int t = u; t < s.T; t++) {
                if (gqa_lo(s, t) > u)
                    continue; /* another document's row: P, dS not written */
                size_t at = ((size_t)h * s.T + t) * s.T + u;
                size_t qo = (size_t)t * ldq + (size_t)h * s.hs + c;
                ak += dS[at] * s.q[qo];
                av += P[at] * s.dout[qo];
            }
        size_t ko = (size_t)u * ldk + (size_t)kvh * s.hs + c;
        s.dk[ko] += ak;
        s.dv[ko] += av;
    }
}

static gqa_seq gqa_shape(int T, int NH, int NKV, int hs, const kern_att_opts *o)
{
    gqa_seq s = {};
    s.T = T, s.NH = NH, s.NKV = NKV, s.hs = hs;
    s.scale = 1.0f / sqrtf((float)hs); /* host code: as the CPU computes it */
    if (o != NULL) {
        if (o->scale != 0.0f)
            s.scale = o->scale;
        s.cap = o->softcap > 0.0f ? o->softcap : 0.0f;
        s.window = o->window > 0 ? o->window : 0;
    }
    return s;
}

extern "C" void kern_cuda_gqa_attention_fwd(kern_device *d, float *out, float *lse,
                                            float *scratch, const float *q, const float *k,
                                            const float *v, int B, int T, int NH, int NKV,
                                            int hs)
{
    kern_cuda_gqa_attention_pos_fwd(d, out, lse, scratch, q, k, v, NULL, B, T, NH, NKV, hs);
}

extern "C" void kern_cuda_gqa_attention_bwd(kern_device *d, float *dq, float *dk, float *dv,
                                            float *scratch, const float *dout, const float *q,
                                            const float *k, const float *v, const float *lse,
                                            const float *out, int B, int T, int NH, int NKV,
                                            int hs)
{
    kern_cuda_gqa_attention_pos_bwd(d, dq, dk, dv, scratch, dout, q, k, v, lse, out, NULL, B, T,
                                    NH, NKV, hs);
}

extern "C" void kern_cuda_gqa_attention_pos_fwd(kern_device *d, float *out, float *lse,
                                                float *scratch, const float *q, const float *k,
                                                const float *v, const int *pos, int B, int T,
                                                int NH, int NKV, int hs)
{
    kern_cuda_gqa_attention_opt_fwd(d, out, lse, scratch, q, k, v, pos, NULL, B, T, NH, NKV, hs);
}

extern "C" void kern_cuda_gqa_attention_pos_bwd(kern_device *d, float *dq, float *dk,
                                                float *dv, float *scratch, const float *dout,
                                                const float *q, const float *k, const float *v,
                                                const float *lse, const float *out,
                                                const int *pos, int B, int T, int NH, int NKV,
                                                int hs)
{
    kern_cuda_gqa_attention_opt_bwd(d, dq, dk, dv, scratch, dout, q, k, v, lse, out, pos, NULL,
                                    B, T, NH, NKV, hs);
}

extern "C" void kern_cuda_gqa_attention_opt_fwd(kern_device *d, float *out, float *lse,
                                                float *scratch, const float *q, const float *k,
                                                const float *v, const int *pos,
                                                const kern_att_opts *opts, int B, int T,
                                                int NH, int NKV, int hs)
{
    CU_LIVE(d);
    if (B <= 0 || T <= 0 || NH <= 0)
        return;
    size_t qs = (size_t)T * NH * hs, ks = (size_t)T * NKV * hs;
    for (int b = 0; b < B; b++) {
        gqa_seq s = gqa_shape(T, NH, NKV, hs, opts);
        s.q = q + b * qs, s.k = k + b * ks, s.v = v + b * ks;
        s.out = out + b * qs, s.lse = lse + (size_t)b * NH * T;
        s.pos = pos != NULL ? pos + (size_t)b * T : NULL;
        k_gqa_fwd<<<(unsigned)(T * NH), ATT_THREADS, (size_t)hs * sizeof(float),
                    IM(d)->stream>>>(s, scratch);
        if (!CU_LAUNCHED(d, "gqa_attention_fwd"))
            return;
    }
}

extern "C" void kern_cuda_gqa_attention_opt_bwd(kern_device *d, float *dq, float *dk,
                                                float *dv, float *scratch, const float *dout,
                                                const float *q, const float *k, const float *v,
                                                const float *lse, const float *out,
                                                const int *pos, const kern_att_opts *opts,
                                                int B, int T, int NH, int NKV, int hs)
{
    (void)out; /* the rows hold all of P: <P, dP> directly */
    CU_LIVE(d);
    if (B <= 0 || T <= 0 || NH <= 0)
        return;
    size_t qs = (size_t)T * NH * hs, ks = (size_t)T * NKV * hs;
    float *P = scratch, *dS = scratch + (size_t)NH * T * T;
    for (int b = 0; b < B; b++) {
        gqa_seq s = gqa_shape(T, NH, NKV, hs, opts);
        s.q = q + b * qs, s.k = k + b * ks, s.v = v + b * ks, s.dout = dout + b * qs;
        s.dq = dq + b * qs, s.dk = dk + b * ks, s.dv = dv + b * ks;
        s.lsec = lse + (size_t)b * NH * T;
        s.pos = pos != NULL ? pos + (size_t)b * T : NULL;
        k_gqa_bwd_rows<<<(unsigned)(T * NH), ATT_THREADS, 2 * (size_t)hs * sizeof(float),
                         IM(d)->stream>>>(s, P, dS);
        if (!CU_LAUNCHED(d, "gqa_attention_bwd_rows"))
            return;
        k_gqa_bwd_cols<<<(unsigned)(T * NKV), ATT_THREADS, 0, IM(d)->stream>>>(s, P, dS);
        if (!CU_LAUNCHED(d, "gqa_attention_bwd_cols"))
            return;
    }
}

/* ---- generation: n new queries against the key/value cache (h-gen,
 * issue 24). One block per (query i, head h), as k_gqa_fwd's rows: the
 * scores of the keys query i sees into its scratch row, max, e^x, sum,
 * then out_i = sum_u p_u v_u, a thread per channel. Unoptimised. */
struct gqa_cache {
    const float *q, *kc, *vc;
    float *out, *att;
    int ldq, p0, P, NH, NKV, hs;
    float scale, cap;
    int window;
};

static __global__ void k_gqa_cache_fwd(gqa_cache c)
{
    extern __shared__ float dyn[]; /* q_i [hs] */
    __shared__ float sh[32];
    int i = blockIdx.x / c.NH, h = blockIdx.x % c.NH, t = c.p0 + i;
    int kvh = h / (c.NH / c.NKV), ldk = c.NKV * c.hs;
    gqa_seq s = {};
    s.scale = c.scale, s.cap = c.cap, s.window = c.window;
    const float *qi = c.q + (size_t)i * c.ldq + (size_t)h * c.hs;
    for (int x = threadIdx.x; x < c.hs; x += blockDim.x)
        dyn[x] = qi[x];
    __syncthreads();
    float *a = c.att + (size_t)blockIdx.x * c.P;
    int lo = gqa_lo(s, t);
    float mx = -INFINITY;
    for (int u = lo + (int)threadIdx.x; u <= t; u += blockDim.x) {
        a[u] = gqa_score(s, gqa_dot(dyn, c.kc + (size_t)u * ldk + (size_t)kvh * c.hs, c.hs));
        mx = fmaxf(mx, a[u]);
    }
    mx = block_max(mx, sh);
    float sum = 0.0f;
    for (int u = lo + (int)threadIdx.x; u <= t; u += blockDim.x) {
        float e = exp_d(a[u] - mx);
        a[u] = e;
        sum += e;
    }
    sum = block_sum(sum, sh); /* its barriers also publish a[] to the block */
    float inv = __fdiv_rn(1.0f, sum);
    float *oi = c.out + (size_t)i * c.NH * c.hs + (size_t)h * c.hs;
    for (int x = threadIdx.x; x < c.hs; x += blockDim.x) {
        float acc = 0.0f;
        for (int u = lo; u <= t; u++)
            acc += a[u] * inv * c.vc[(size_t)u * ldk + (size_t)kvh * c.hs + x];
        oi[x] = acc;
    }
}

extern "C" void kern_cuda_attention_cache_fwd(kern_device *d, float *out, float *scratch,
                                              const float *q, int ldq, const float *kc,
                                              const float *vc, const kern_att_opts *opts, int p0,
                                              int n, int NH, int NKV, int hs)
{
    CU_LIVE(d);
    if (n <= 0 || NH <= 0)
        return;
    gqa_seq s = gqa_shape(p0 + n, NH, NKV, hs, opts);
    gqa_cache c = {q, kc, vc, out, scratch, ldq, p0, p0 + n, NH, NKV, hs, s.scale, s.cap,
                   s.window};
    k_gqa_cache_fwd<<<(unsigned)(n * NH), ATT_THREADS, (size_t)hs * sizeof(float),
                      IM(d)->stream>>>(c);
    CU_LAUNCHED(d, "attention_cache_fwd");
}
