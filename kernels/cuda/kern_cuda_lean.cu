/* kern_cuda_lean: the CUDA backend's attention for lean activations, the
 * "cuda" table's attention_lean_fwd / _bwd (contract: kern_device.h; the
 * CPU's kern_cpu_lean.c is the reference, compared in the start-up
 * self-test and tests/gpu/test_cuda_lean.c).
 *
 * fp32 and UNOPTIMISED (no tensor cores), like kern_cuda_llama.cu's
 * attention, but without its T x T scratch: nothing is written but the
 * outputs, so the interface's scratch (KERN_ATT_LEAN_SCRATCH) is unused.
 *  - forward: one block per (sequence, query head, row t); the row's keys
 *    in chunks of ATT_LEAN_THREADS, an online softmax over the chunks (the
 *    running max m and sum l, the output row rescaled in shared memory
 *    when m grows), out = o / l, lse = m + log l;
 *  - backward, rows: one block per (sequence, query head, row t): D =
 *    dout_t . out_t, then per key chunk p = e^(s - lse), dS = p (dout_t .
 *    v_u - D) ds/dx, dq_t += sum dS k_u;
 *  - backward, columns: one block per (sequence, key/value head, key u):
 *    for the group's query heads and the rows t >= u that see u, in chunks,
 *    p and dS recomputed (D again from dout_t . out_t), dk_u += sum dS q_t,
 *    dv_u += sum p dout_t, in a fixed order (no atomics: reproducible).
 * Exponentials and tanh in double, divisions correctly rounded (the build
 * uses --use_fast_math; see kern_cuda_llama.cu).
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

extern "C" {
#include "kern_device.h"
}
#include "kern_cuda.h"
#include "kern_cuda_lean.h"
#include "kern_cuda_llama.h"
#include "kern_cuda_impl.cuh"

#define ATT_LEAN_THREADS 128

struct lean_args {
    const float *q, *k, *v, *dout, *out, *lsec;
    float *o, *lse, *dq, *dk, *dv;
    const int *pos; /* [B*T] or NULL */
    int B, T, NH, NKV, hs, ldq, ldkv, ldo;
    float scale, cap;
    int window;
};

/* the warp and block reductions: kern_cuda_impl.cuh (warp_sum, block_max, ...) */

static __device__ __forceinline__ float lexp(float x)
{
    return (float)exp((double)x);
}

/* the first key row t of sequence b sees */
static __device__ __forceinline__ int lean_lo(const lean_args &a, int b, int t)
{
    int lo = a.pos != nullptr ? t - a.pos[(size_t)b * a.T + t] : 0;
    if (a.window > 0 && t - a.window + 1 > lo)
        lo = t - a.window + 1;
    return lo;
}

static __device__ __forceinline__ float lean_tanh(const lean_args &a, float x)
{
    return (float)tanh((double)__fdiv_rn(x * a.scale, a.cap));
}

static __device__ __forceinline__ float lean_score(const lean_args &a, float x)
{
    return a.cap > 0.0f ? a.cap * lean_tanh(a, x) : x * a.scale;
}

static __device__ __forceinline__ float ldot(const float *x, const float *y, int n)
{
    float acc = 0.0f;
    for (int c = 0; c < n; c++)
        acc += x[c] * y[c];
    return acc;
}

/* block (b, h, t) = blockIdx.x / (NH T), / T % NH, % T */
static __global__ void k_lean_fwd(lean_args a)
{
    extern __shared__ float dyn[]; /* q_t [hs], o [hs], p [blockDim] */
    __shared__ float sh[32];
    int t = blockIdx.x % a.T, h = blockIdx.x / a.T % a.NH, b = blockIdx.x / (a.T * a.NH);
    int kvh = h / (a.NH / a.NKV);
    float *qs = dyn, *os = dyn + a.hs, *ps = dyn + 2 * a.hs;
    const float *qt = a.q + ((size_t)b * a.T + t) * a.ldq + (size_t)h * a.hs;
    const float *kb = a.k + (size_t)b * a.T * a.ldkv + (size_t)kvh * a.hs;
    const float *vb = a.v + (size_t)b * a.T * a.ldkv + (size_t)kvh * a.hs;
    for (int c = threadIdx.x; c < a.hs; c += blockDim.x) {
        qs[c] = qt[c];
        os[c] = 0.0f;
    }
    __syncthreads();
    float m = -INFINITY, l = 0.0f;
    int lo = lean_lo(a, b, t);
    for (int u0 = lo; u0 <= t; u0 += blockDim.x) {
        int u = u0 + (int)threadIdx.x, n = t - u0 + 1 < (int)blockDim.x ? t - u0 + 1 : blockDim.x;
        float s = u <= t ? lean_score(a, ldot(qs, kb + (size_t)u * a.ldkv, a.hs)) : -INFINITY;
        float mn = fmaxf(m, block_max(s, sh));
        float p = u <= t ? lexp(s - mn) : 0.0f;
        ps[threadIdx.x] = p;
        float sum = block_sum(p, sh); /* its barriers publish ps */
        float alpha = m == -INFINITY ? 0.0f : lexp(m - mn);
        for (int c = threadIdx.x; c < a.hs; c += blockDim.x) {
            float acc = 0.0f;
            for (int j = 0; j < n; j++)
                acc += ps[j] * vb[(size_t)(u0 + j) * a.ldkv + c];
            os[c] = os[c] * alpha + acc;
        }
        l = l * alpha + sum;
        m = mn;
        __syncthreads(); /* ps is rewritten by the next chunk */
    }
    float inv = __fdiv_rn(1.0f, l);
    float *ot = a.o + ((size_t)b * a.T + t) * a.ldo + (size_t)h * a.hs;
    for (int c = threadIdx.x; c < a.hs; c += blockDim.x)
        ot[c] = os[c] * inv;
    if (threadIdx.x == 0)
        a.lse[((size_t)b * a.NH + h) * a.T + t] = (float)((double)m + log((double)l));
}

/* p and dS of (row t of head h, key u), from q_t, dout_t (any memory) and D */
static __device__ __forceinline__ void lean_pds(const lean_args &a, const float *qt,
                                                const float *gt, float D, float lse,
                                                const float *ku, const float *vu, float *p,
                                                float *ds)
{
    float raw = ldot(qt, ku, a.hs), dp = ldot(gt, vu, a.hs);
    float f = a.scale;
    if (a.cap > 0.0f) {
        float th = lean_tanh(a, raw);
        f *= 1.0f - th * th;
    }
    *p = lexp(lean_score(a, raw) - lse);
    *ds = *p * (dp - D) * f;
}

/* backward, rows: block (b, h, t); dq_t += sum_u dS k_u */
static __global__ void k_lean_bwd_rows(lean_args a)
{
    extern __shared__ float dyn[]; /* q_t [hs], dout_t [hs], dS [blockDim] */
    __shared__ float sh[32];
    int t = blockIdx.x % a.T, h = blockIdx.x / a.T % a.NH, b = blockIdx.x / (a.T * a.NH);
    int kvh = h / (a.NH / a.NKV);
    float *qs = dyn, *gs = dyn + a.hs, *dss = dyn + 2 * a.hs;
    size_t qo = ((size_t)b * a.T + t) * a.ldq + (size_t)h * a.hs;
    size_t oo = ((size_t)b * a.T + t) * a.ldo + (size_t)h * a.hs;
    float dpart = 0.0f;
    for (int c = threadIdx.x; c < a.hs; c += blockDim.x) {
        qs[c] = a.q[qo + c];
        gs[c] = a.dout[oo + c];
        dpart += a.dout[oo + c] * a.out[oo + c];
    }
    float D = block_sum(dpart, sh); /* its barriers publish qs, gs */
    float lse = a.lsec[((size_t)b * a.NH + h) * a.T + t];
    const float *kb = a.k + (size_t)b * a.T * a.ldkv + (size_t)kvh * a.hs;
    const float *vb = a.v + (size_t)b * a.T * a.ldkv + (size_t)kvh * a.hs;
    float acc[8]; /* channels c = threadIdx.x + i * blockDim.x, hs <= 8 * blockDim */
    for (int i = 0; i < 8; i++)
        acc[i] = 0.0f;
    int lo = lean_lo(a, b, t);
    for (int u0 = lo; u0 <= t; u0 += blockDim.x) {
        int u = u0 + (int)threadIdx.x, n = t - u0 + 1 < (int)blockDim.x ? t - u0 + 1 : blockDim.x;
        float p = 0.0f, ds = 0.0f;
        if (u <= t)
            lean_pds(a, qs, gs, D, lse, kb + (size_t)u * a.ldkv, vb + (size_t)u * a.ldkv, &p,
                     &ds);
        dss[threadIdx.x] = ds;
        __syncthreads();
        for (int i = 0, c = threadIdx.x; c < a.hs; i++, c += blockDim.x)
            for (int j = 0; j < n; j++)
                acc[i] += dss[j] * kb[(size_t)(u0 + j) * a.ldkv + c];
        __syncthreads();
    }
    for (int i = 0, c = threadIdx.x; c < a.hs; i++, c += blockDim.x)
        a.dq[qo + c] += acc[i];
}

/* backward, columns: block (b, kvh, u); dk_u, dv_u over the group's rows */
static __global__ void k_lean_bwd_cols(lean_args a)
{
    extern __shared__ float dyn[]; /* k_u [hs], v_u [hs], p [blockDim], dS [blockDim] */
    int u = blockIdx.x % a.T, kvh = blockIdx.x / a.T % a.NKV, b = blockIdx.x / (a.T * a.NKV);
    int G = a.NH / a.NKV;
    float *ks = dyn, *vs = dyn + a.hs, *ps = dyn + 2 * a.hs, *dss = ps + blockDim.x;
    size_t ko = ((size_t)b * a.T + u) * a.ldkv + (size_t)kvh * a.hs;
    for (int c = threadIdx.x; c < a.hs; c += blockDim.x) {
        ks[c] = a.k[ko + c];
        vs[c] = a.v[ko + c];
    }
    __syncthreads();
    float ak[8], av[8];
    for (int i = 0; i < 8; i++)
        ak[i] = av[i] = 0.0f;
    for (int h = kvh * G; h < (kvh + 1) * G; h++)
        for (int t0 = u; t0 < a.T; t0 += blockDim.x) {
            int t = t0 + (int)threadIdx.x, n = a.T - t0 < (int)blockDim.x ? a.T - t0 : blockDim.x;
            float p = 0.0f, ds = 0.0f;
            if (t < a.T && lean_lo(a, b, t) <= u) {
                const float *qt = a.q + ((size_t)b * a.T + t) * a.ldq + (size_t)h * a.hs;
                const float *gt = a.dout + ((size_t)b * a.T + t) * a.ldo + (size_t)h * a.hs;
                const float *ot = a.out + ((size_t)b * a.T + t) * a.ldo + (size_t)h * a.hs;
                lean_pds(a, qt, gt, ldot(gt, ot, a.hs),
                         a.lsec[((size_t)b * a.NH + h) * a.T + t], ks, vs, &p, &ds);
            }
            ps[threadIdx.x] = p;
            dss[threadIdx.x] = ds;
            __syncthreads();
            for (int i = 0, c = threadIdx.x; c < a.hs; i++, c += blockDim.x)
                for (int j = 0; j < n; j++) {
                    size_t r = (size_t)b * a.T + t0 + j;
                    ak[i] += dss[j] * a.q[r * a.ldq + (size_t)h * a.hs + c];
                    av[i] += ps[j] * a.dout[r * a.ldo + (size_t)h * a.hs + c];
                }
            __syncthreads();
        }
    for (int i = 0, c = threadIdx.x; c < a.hs; i++, c += blockDim.x) {
        a.dk[ko + c] += ak[i];
        a.dv[ko + c] += av[i];
    }
}

static lean_args lean_shape(int B, int T, int NH, int NKV, int hs, int ldq, int ldkv,
                            const int *pos, const kern_att_opts *o)
{
    lean_args a = {};
    a.B = B, a.T = T, a.NH = NH, a.NKV = NKV, a.hs = hs, a.ldq = ldq, a.ldkv = ldkv;
    a.ldo = NH * hs;
    a.pos = pos;
    a.scale = 1.0f / sqrtf((float)hs); /* host code: as the CPU computes it */
    if (o != NULL) {
        if (o->scale != 0.0f)
            a.scale = o->scale;
        a.cap = o->softcap > 0.0f ? o->softcap : 0.0f;
        a.window = o->window > 0 ? o->window : 0;
    }
    return a;
}

/* the kernels keep 8 channels per thread at most */
static bool lean_fits(kern_device *d, int hs)
{
    if (hs <= 8 * ATT_LEAN_THREADS)
        return true;
    cu_ok_rt(d, cudaErrorInvalidValue, "attention_lean: head size over 1024", __FILE__, __LINE__);
    return false;
}

extern "C" void kern_cuda_attention_lean_fwd(kern_device *d, float *out, float *lse,
                                             float *scratch, const float *q, const float *k,
                                             const float *v, int ldq, int ldkv, const int *pos,
                                             const kern_att_opts *opts, int B, int T, int NH,
                                             int NKV, int hs)
{
    (void)scratch;
    if (!cu_enter(d) || B * T == 0 || !lean_fits(d, hs))
        return;
    lean_args a = lean_shape(B, T, NH, NKV, hs, ldq, ldkv, pos, opts);
    a.q = q, a.k = k, a.v = v, a.o = out, a.lse = lse;
    size_t shm = (2 * (size_t)hs + ATT_LEAN_THREADS) * sizeof(float);
    k_lean_fwd<<<(unsigned)((size_t)B * NH * T), ATT_LEAN_THREADS, shm,
                 IM(d)->stream>>>(a);
    CU_LAUNCHED(d, "attention_lean_fwd");
}

extern "C" void kern_cuda_attention_lean_bwd(kern_device *d, float *dq, float *dk, float *dv,
                                             float *scratch, const float *dout, const float *q,
                                             const float *k, const float *v, const float *lse,
                                             const float *out, int ldq, int ldkv,
                                             const int *pos, const kern_att_opts *opts, int B,
                                             int T, int NH, int NKV, int hs)
{
    (void)scratch;
    if (!cu_enter(d) || B * T == 0 || !lean_fits(d, hs))
        return;
    lean_args a = lean_shape(B, T, NH, NKV, hs, ldq, ldkv, pos, opts);
    a.q = q, a.k = k, a.v = v, a.dout = dout, a.out = out, a.lsec = lse;
    a.dq = dq, a.dk = dk, a.dv = dv;
    cudaStream_t st = IM(d)->stream;
    size_t shr = (2 * (size_t)hs + ATT_LEAN_THREADS) * sizeof(float);
    size_t shc = (2 * (size_t)hs + 2 * ATT_LEAN_THREADS) * sizeof(float);
    /* dq first, then dk / dv: GPT-2's dq, dk, dv are slices of one dqkv but
     * never the same floats, so the order is only for reproducibility */
    k_lean_bwd_rows<<<(unsigned)((size_t)B * NH * T), ATT_LEAN_THREADS, shr, st>>>(a);
    if (!CU_LAUNCHED(d, "attention_lean_bwd (rows)"))
        return;
    k_lean_bwd_cols<<<(unsigned)((size_t)B * NKV * T), ATT_LEAN_THREADS, shc, st>>>(a);
    CU_LAUNCHED(d, "attention_lean_bwd (cols)");
}
