/* kern_cuda_pointwise: GELU, Gemma's GELU gate, soft-capping, the residual
 * add, for the CUDA backend (kern_cuda_impl.cuh). */
#include "kern_cuda_impl.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

/* -------------------------------------------------------------- pointwise */

#define GELU_S 0.7978845608028654f

__device__ __forceinline__ float fast_tanh(float u)
{
    return 1.0f - __fdiv_rn(2.0f, exp_poly(2.0f * u) + 1.0f);
}

/* gelu(x) and gelu'(x), the tanh approximation (GPT-2's, Gemma's gate) */
__device__ __forceinline__ float gelu_val(float x)
{
    return 0.5f * x * (1.0f + fast_tanh(GELU_S * (x + 0.044715f * x * x * x)));
}

__device__ __forceinline__ float gelu_grad(float x)
{
    float th = fast_tanh(GELU_S * (x + 0.044715f * x * x * x));
    float sech2 = 1.0f - th * th;
    float xc = fminf(fmaxf(x, -20.0f), 20.0f);
    return 0.5f * (1.0f + th) + 0.5f * xc * sech2 * GELU_S * (1.0f + 3.0f * 0.044715f * xc * xc);
}

__global__ void k_gelu_fwd(float *out, const float *inp, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = gelu_val(inp[i]);
}

__global__ void k_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dinp[i] += gelu_grad(inp[i]) * dout[i];
}

/* Gemma's gate: gelu(gate) * up */
__global__ void k_geglu_fwd(float *out, const float *gate, const float *up, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = gelu_val(gate[i]) * up[i];
}

__global__ void k_geglu_bwd(float *dgate, float *dup, const float *dout, const float *gate,
                            const float *up, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = gate[i], gi = dout[i];
        dgate[i] += gelu_grad(g) * (gi * up[i]);
        dup[i] += gi * gelu_val(g);
    }
}

/* Soft-capping: tanh in double (--use_fast_math changes only single
 * precision), so the capped logits agree with the CPU's tanhf to fp32
 * rounding. */
__global__ void k_softcap_fwd(float *out, const float *inp, float cap, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = cap * (float)tanh((double)__fdiv_rn(inp[i], cap));
}

__global__ void k_softcap_bwd(float *dinp, const float *dout, const float *inp, float cap,
                              size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float th = (float)tanh((double)__fdiv_rn(inp[i], cap));
        dinp[i] = dout[i] * (1.0f - th * th);
    }
}

__global__ void k_add(float *out, const float *a, const float *b, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

void cu_gelu_fwd(kern_device *d, float *out, const float *inp, size_t n)
{
    CU_LIVE(d);
    PROF(d, KP_GELU_FWD);
    k_gelu_fwd<<<grid_for(n, 256), 256, 0, IM(d)->stream>>>(out, inp, n);
    CU_LAUNCHED(d, "gelu_fwd");
}

void cu_gelu_bwd(kern_device *d, float *dinp, const float *inp, const float *dout,
                        size_t n)
{
    CU_LIVE(d);
    PROF(d, KP_GELU_BWD);
    k_gelu_bwd<<<grid_for(n, 256), 256, 0, IM(d)->stream>>>(dinp, inp, dout, n);
    CU_LAUNCHED(d, "gelu_bwd");
}

__global__ void k_scale(float *x, float s, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

void cu_geglu_fwd(kern_device *d, float *out, const float *gate, const float *up, size_t n)
{
    CU_LIVE(d);
    PROF(d, KP_GELU_FWD);
    if (n == 0)
        return;
    k_geglu_fwd<<<grid_for(n, 256), 256, 0, IM(d)->stream>>>(out, gate, up, n);
    CU_LAUNCHED(d, "geglu_fwd");
}

void cu_geglu_bwd(kern_device *d, float *dgate, float *dup, const float *dout,
                  const float *gate, const float *up, size_t n)
{
    CU_LIVE(d);
    PROF(d, KP_GELU_BWD);
    if (n == 0)
        return;
    k_geglu_bwd<<<grid_for(n, 256), 256, 0, IM(d)->stream>>>(dgate, dup, dout, gate, up, n);
    CU_LAUNCHED(d, "geglu_bwd");
}

void cu_softcap_fwd(kern_device *d, float *out, const float *inp, float cap, size_t n)
{
    CU_LIVE(d);
    PROF(d, KP_ADD);
    if (n == 0)
        return;
    k_softcap_fwd<<<grid_for(n, 256), 256, 0, IM(d)->stream>>>(out, inp, cap, n);
    CU_LAUNCHED(d, "softcap_fwd");
}

void cu_softcap_bwd(kern_device *d, float *dinp, const float *dout, const float *inp,
                    float cap, size_t n)
{
    CU_LIVE(d);
    PROF(d, KP_ADD);
    if (n == 0)
        return;
    k_softcap_bwd<<<grid_for(n, 256), 256, 0, IM(d)->stream>>>(dinp, dout, inp, cap, n);
    CU_LAUNCHED(d, "softcap_bwd");
}

void cu_scale(kern_device *d, float *x, float s, size_t n)
{
    CU_LIVE(d);
    PROF(d, KP_ADD);
    if (n == 0)
        return;
    k_scale<<<grid_for(n, 256), 256, 0, IM(d)->stream>>>(x, s, n);
    CU_LAUNCHED(d, "scale");
}

/* 16-bit weights to fp32 (exact): bf16 is the upper half of an fp32, a
 * half goes through the hardware conversion. */
__global__ void k_widen16(float *out, const uint16_t *in, size_t n, int f16)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = f16 ? __half2float(__ushort_as_half(in[i])) : __uint_as_float((uint32_t)in[i] << 16);
}

void cu_widen16(kern_device *d, float *out, const uint16_t *in, size_t n, int f16)
{
    CU_LIVE(d);
    PROF(d, KP_ADD);
    if (n == 0)
        return;
    k_widen16<<<grid_for(n, 256), 256, 0, IM(d)->stream>>>(out, in, n, f16);
    CU_LAUNCHED(d, "widen16");
}

/* fp32 to bf16, to nearest, ties to even: __float2bfloat16_rn, the
 * function kern_bf16_round is on the CPU (NaN quiet, overflow to Inf,
 * subnormals kept), so both backends store the same bits. */
__global__ void k_narrow_bf16(uint16_t *out, const float *in, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(in[i]));
}

void cu_narrow_bf16(kern_device *d, uint16_t *out, const float *in, size_t n)
{
    CU_LIVE(d);
    PROF(d, KP_ADD);
    if (n == 0)
        return;
    k_narrow_bf16<<<grid_for(n, 256), 256, 0, IM(d)->stream>>>(out, in, n);
    CU_LAUNCHED(d, "narrow_bf16");
}

/* NF4 codes times their block's absmax, rebuilt from
 * the double quantization per value; __fmul_rn / __fadd_rn keep each
 * step one rounded fp32 operation (no contraction into an FMA under
 * --use_fast_math), the CPU's bits exactly. */
__global__ void k_dequant_nf4(float *out, kern_nf4 q, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint8_t byte = q.codes[i / 2];
        uint8_t c = i % 2 == 0 ? (uint8_t)(byte >> 4) : (uint8_t)(byte & 15);
        size_t b = i / 64;
        float am = q.absmax != NULL
                       ? q.absmax[b]
                       : __fadd_rn(__fmul_rn(q.nested_map[q.qabsmax[b]], q.nested_absmax[b / 256]),
                                   q.offset);
        out[i] = __fmul_rn(q.map[c], am);
    }
}

void cu_dequant_nf4(kern_device *d, float *out, const kern_nf4 *q, size_t n)
{
    CU_LIVE(d);
    PROF(d, KP_ADD);
    if (n == 0)
        return;
    k_dequant_nf4<<<grid_for(n, 256), 256, 0, IM(d)->stream>>>(out, *q, n);
    CU_LAUNCHED(d, "dequant_nf4");
}

void cu_add(kern_device *d, float *out, const float *a, const float *b, size_t n)
{
    CU_LIVE(d);
    PROF(d, KP_ADD);
    k_add<<<grid_for(n, 256), 256, 0, IM(d)->stream>>>(out, a, b, n);
    CU_LAUNCHED(d, "add");
}
