/* kern_cuda_optim: AdamW and the sum of squares, for the CUDA backend (kern_cuda_impl.cuh). */
#include "kern_cuda_impl.cuh"

/* ------------------------------------------------------------- optimizer */

/* Every operation rounded on its own (the _rn intrinsics: no fused
 * multiply-add, which nvcc would otherwise contract), in the CPU kernel's
 * order (kern_cpu.c adamw_one): the same bits as the CPU AdamW for the same
 * inputs, so an offloaded optimizer (host AdamW, core/train/adamw.c) steps
 * exactly as this kernel does. */
__global__ void k_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr,
                        float beta1, float beta2, float eps, float wd, float scale, float ic1,
                        float ic2)
{
    const float nb1 = __fsub_rn(1.0f, beta1), nb2 = __fsub_rn(1.0f, beta2);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float gi = __fmul_rn(g[i], scale);
        float mi = __fadd_rn(__fmul_rn(beta1, m[i]), __fmul_rn(nb1, gi));
        float vi = __fadd_rn(__fmul_rn(beta2, v[i]), __fmul_rn(__fmul_rn(nb2, gi), gi));
        m[i] = mi;
        v[i] = vi;
        float mh = __fmul_rn(mi, ic1), vh = __fmul_rn(vi, ic2);
        float pi = p[i];
        float upd = __fadd_rn(__fdiv_rn(mh, __fadd_rn(__fsqrt_rn(vh), eps)), __fmul_rn(wd, pi));
        p[i] = __fsub_rn(pi, __fmul_rn(lr, upd));
    }
}

void cu_adamw(kern_device *d, float *p, const float *g, float *m, float *v, size_t n,
                     float lr, float beta1, float beta2, float eps, float weight_decay,
                     float grad_scale, int t)
{
    CU_LIVE(d);
    PROF(d, KP_ADAMW);
    /* bias corrections on the host, exactly as the CPU backend computes them */
    float ic1 = 1.0f / (1.0f - powf(beta1, (float)t));
    float ic2 = 1.0f / (1.0f - powf(beta2, (float)t));
    k_adamw<<<grid_for(n, 256), 256, 0, IM(d)->stream>>>(p, g, m, v, n, lr, beta1, beta2, eps,
                                                         weight_decay, grad_scale, ic1, ic2);
    CU_LAUNCHED(d, "adamw");
}

__global__ void k_sumsq(double *out, const float *x, size_t n)
{
    __shared__ double sh[32];
    double s = 0.0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        s += (double)x[i] * (double)x[i];
    s = block_sum_d(s, sh);
    if (threadIdx.x == 0)
        atomicAdd(out, s);
}

double cu_sumsq(kern_device *d, const float *x, size_t n)
{
    if (!cu_enter(d))
        return 0.0;
    PROF(d, KP_SUMSQ);
    cu_impl *im = IM(d);
    double h = 0.0;
    if (!CU_OK(d, cudaMemsetAsync(im->scratch + 1, 0, sizeof(double), im->stream)))
        return 0.0;
    unsigned g = grid_for(n, 256);
    if (g > 1024)
        g = 1024;
    k_sumsq<<<g, 256, 0, im->stream>>>(im->scratch + 1, x, n);
    if (!CU_LAUNCHED(d, "sumsq"))
        return 0.0;
    if (CU_OK(d, cudaMemcpyAsync(&h, im->scratch + 1, sizeof(double), cudaMemcpyDeviceToHost,
                                 im->stream)))
        CU_OK(d, cudaStreamSynchronize(im->stream));
    return h;
}
