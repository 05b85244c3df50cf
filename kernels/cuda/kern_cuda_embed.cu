/* kern_cuda_embed: token + position embeddings, for the CUDA backend (kern_cuda_impl.cuh). */
#include "kern_cuda_impl.cuh"

/* ------------------------------------------------------------ embeddings */

__global__ void k_encoder_fwd(float *out, const int *tok, const float *wte, const float *wpe,
                              int T, int C, size_t total)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t n = i / C;
        int c = (int)(i % C);
        out[i] = wte[(size_t)tok[n] * C + c] + wpe[(size_t)(n % T) * C + c];
    }
}

/* dwpe[t,c] += sum_b dout[b,t,c]: one thread per (t,c), no atomics */
__global__ void k_encoder_bwd_wpe(float *dwpe, const float *dout, int B, int T, int C)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)T * C)
        return;
    float s = 0.0f;
    for (int b = 0; b < B; b++)
        s += dout[(size_t)b * T * C + i];
    dwpe[i] += s;
}

__global__ void k_encoder_bwd_wte(float *dwte, const float *dout, const int *tok, int C,
                                  size_t total)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t n = i / C;
        int c = (int)(i % C);
        atomicAdd(&dwte[(size_t)tok[n] * C + c], dout[i]);
    }
}

void cu_encoder_fwd(kern_device *d, float *out, const int *tok, const float *wte,
                           const float *wpe, int B, int T, int C)
{
    CU_LIVE(d);
    PROF(d, KP_ENC_FWD);
    size_t total = (size_t)B * T * C;
    k_encoder_fwd<<<grid_for(total, 256), 256, 0, IM(d)->stream>>>(out, tok, wte, wpe, T, C,
                                                                   total);
    CU_LAUNCHED(d, "encoder_fwd");
}

void cu_encoder_bwd(kern_device *d, float *dwte, float *dwpe, const float *dout,
                           const int *tok, int B, int T, int C)
{
    CU_LIVE(d);
    PROF(d, KP_ENC_BWD);
    if (B <= 0 || T <= 0 || C <= 0)
        return;
    size_t tc = (size_t)T * C, total = (size_t)B * T * C;
    k_encoder_bwd_wpe<<<(unsigned)((tc + 255) / 256), 256, 0, IM(d)->stream>>>(dwpe, dout, B, T,
                                                                               C);
    CU_LAUNCHED(d, "encoder_bwd_wpe");
    k_encoder_bwd_wte<<<grid_for(total, 256), 256, 0, IM(d)->stream>>>(dwte, dout, tok, C,
                                                                       total);
    CU_LAUNCHED(d, "encoder_bwd_wte");
}
