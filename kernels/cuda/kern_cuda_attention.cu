/* kern_cuda_attention: causal multi-head attention (batched cuBLAS products, softmax kernels; the tiled path is kern_cuda_flash.cu), for the CUDA backend (kern_cuda_impl.cuh). */
#include "kern_cuda_impl.cuh"

/* ------------------------------------------------------------- attention */

/* One warp per row (head, t) of one sequence: scores -> probabilities in place (scaled, causal: 0 above the diagonal),
 * and each row's log-sum-exp (in double: fast-math's logf is approximate) */
__global__ void k_causal_softmax(float *att, float *lse, int T, float scale, size_t rows)
{
    size_t row = blockIdx.x * (size_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= rows)
        return;
    int t = (int)(row % T);
    float *a = att + row * T;
    float mx = -INFINITY;
    for (int u = lane; u <= t; u += 32)
        mx = fmaxf(mx, a[u] * scale);
    mx = warp_max(mx);
    float s = 0.0f;
    for (int u = lane; u <= t; u += 32) {
        float e = exp_poly(a[u] * scale - mx);
        a[u] = e;
        s += e;
    }
    float sum = warp_sum(s);
    float inv = __fdiv_rn(1.0f, sum);
    for (int u = lane; u < T; u += 32)
        a[u] = u <= t ? a[u] * inv : 0.0f;
    if (lane == 0)
        lse[row] = (float)((double)mx + log((double)sum));
}

/* scores -> the forward's probabilities, rebuilt from each row's lse */
__global__ void k_causal_probs(float *att, const float *lse, int T, float scale, size_t rows)
{
    size_t row = blockIdx.x * (size_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= rows)
        return;
    int t = (int)(row % T);
    float *a = att + row * T;
    float l = lse[row];
    for (int u = lane; u < T; u += 32)
        a[u] = u <= t ? exp_poly(a[u] * scale - l) : 0.0f;
}

/* da <- att * (da - <att, da>) * scale on u <= t, 0 above */
__global__ void k_softmax_bwd(float *datt, const float *att, int T, float scale, size_t rows)
{
    size_t row = blockIdx.x * (size_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= rows)
        return;
    int t = (int)(row % T);
    const float *a = att + row * T;
    float *g = datt + row * T;
    float dot = 0.0f;
    for (int u = lane; u <= t; u += 32)
        dot += a[u] * g[u];
    dot = warp_sum(dot);
    for (int u = lane; u < T; u += 32)
        g[u] = u <= t ? a[u] * (g[u] - dot) * scale : 0.0f;
}

/* In bf16 mode attention's batched products run on TF32 tensor cores
 * (inputs rounded to 10-bit mantissas, fp32 accumulation): more precise
 * than the bf16 the mode allows, and about ten times the fp32 SIMT rate.
 * The CPU reference computes them in fp32; the difference is within the
 * bf16 tolerance (tests/gpu). Returns whether the mode was switched. */
static bool attn_math_begin(kern_device *d)
{
    cu_impl *im = IM(d);
    if (!im->bf16 || im->tf32)
        return false;
    return BL_OK(d, cublasSetMathMode(im->blas, CUBLAS_TF32_TENSOR_OP_MATH));
}

static void attn_math_end(kern_device *d, bool switched)
{
    if (switched)
        BL_OK(d, cublasSetMathMode(IM(d)->blas, CUBLAS_DEFAULT_MATH));
}

/* The tiled kernels (kern_cuda_flash.cu) compute bf16 attention: only in
 * bf16 mode, when switched on, for the head size they support. */
static bool use_flash(kern_device *d, int C, int NH)
{
    return IM(d)->flash && IM(d)->bf16 && kern_cuda_flash_supported(C, NH);
}

/* One sequence at a time, its heads batched: the scratch holds that
 * sequence's T x T probabilities (and their gradient) for all heads, so no
 * layer keeps a T x T matrix; the backward rebuilds them from lse. */
void cu_attention_fwd(kern_device *d, float *out, float *lse, float *scratch,
                             const float *qkv, int B, int T, int C, int NH)
{
    CU_LIVE(d);
    PROF(d, KP_ATT_FWD);
    if (B <= 0 || T <= 0)
        return;
    if (use_flash(d, C, NH)) {
        cudaError_t e = kern_cuda_flash_fwd(IM(d)->stream, out, lse, qkv, B, T, C, NH);
        cu_ok_rt(d, e == cudaErrorNotReady ? cudaSuccess : e, /* a stale query result */
                 "flash attention forward", __FILE__, __LINE__);
        return;
    }
    int hs = C / NH, ld = 3 * C;
    long long tt = (long long)T * T;
    float scale = 1.0f / sqrtf((float)hs);
    size_t rows = (size_t)NH * T; /* one sequence, all heads */
    bool tc = attn_math_begin(d);
    for (int b = 0; b < B && IM(d)->err_code == 0; b++) {
        const float *q = qkv + (size_t)b * T * ld;
        /* scores = q k^T, batched over heads */
        rm_gemm(d, false, true, T, T, hs, q, ld, hs, q + C, ld, hs, 0.0f, scratch, T, tt, NH);
        k_causal_softmax<<<(unsigned)((rows + 7) / 8), 256, 0, IM(d)->stream>>>(
            scratch, lse + (size_t)b * rows, T, scale, rows);
        if (!CU_LAUNCHED(d, "causal_softmax"))
            break;
        /* out = att v */
        rm_gemm(d, false, false, T, hs, T, scratch, T, tt, q + 2 * C, ld, hs, 0.0f,
                out + (size_t)b * T * C, C, hs, NH);
    }
    attn_math_end(d, tc);
}

void cu_attention_bwd(kern_device *d, float *dqkv, float *scratch, const float *dout,
                             const float *qkv, const float *lse, const float *out, int B, int T,
                             int C, int NH)
{
    CU_LIVE(d);
    PROF(d, KP_ATT_BWD);
    if (B <= 0 || T <= 0)
        return;
    if (use_flash(d, C, NH)) {
        cudaError_t e = kern_cuda_flash_bwd(IM(d)->stream, dqkv, dout, qkv, lse, out, B, T, C, NH);
        cu_ok_rt(d, e == cudaErrorNotReady ? cudaSuccess : e, /* a stale query result */
                 "flash attention backward", __FILE__, __LINE__);
        return;
    }
    int hs = C / NH, ld = 3 * C;
    long long tt = (long long)T * T;
    float scale = 1.0f / sqrtf((float)hs);
    size_t rows = (size_t)NH * T;
    float *att = scratch, *datt = scratch + (size_t)NH * tt;
    unsigned grid = (unsigned)((rows + 7) / 8);
    bool tc = attn_math_begin(d);
    for (int b = 0; b < B && IM(d)->err_code == 0; b++) {
        const float *q = qkv + (size_t)b * T * ld, *g = dout + (size_t)b * T * C;
        float *dq = dqkv + (size_t)b * T * ld;
        /* the forward's probabilities, rebuilt from q k^T and lse */
        rm_gemm(d, false, true, T, T, hs, q, ld, hs, q + C, ld, hs, 0.0f, att, T, tt, NH);
        k_causal_probs<<<grid, 256, 0, IM(d)->stream>>>(att, lse + (size_t)b * rows, T, scale,
                                                       rows);
        if (!CU_LAUNCHED(d, "causal_probs"))
            break;
        /* datt = dout v^T; dv += att^T dout */
        rm_gemm(d, false, true, T, T, hs, g, C, hs, q + 2 * C, ld, hs, 0.0f, datt, T, tt, NH);
        rm_gemm(d, true, false, T, hs, T, att, T, tt, g, C, hs, 1.0f, dq + 2 * C, ld, hs, NH);
        k_softmax_bwd<<<grid, 256, 0, IM(d)->stream>>>(datt, att, T, scale, rows);
        if (!CU_LAUNCHED(d, "softmax_bwd"))
            break;
        /* dq += dpre k; dk += dpre^T q */
        rm_gemm(d, false, false, T, hs, T, datt, T, tt, q + C, ld, hs, 1.0f, dq, ld, hs, NH);
        rm_gemm(d, true, false, T, hs, T, datt, T, tt, q, ld, hs, 1.0f, dq + C, ld, hs, NH);
    }
    attn_math_end(d, tc);
}
