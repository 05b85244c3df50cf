/* kern_cuda_loss: the fused softmax + cross-entropy (and its gradient), for the CUDA backend (kern_cuda_impl.cuh). */
#include "kern_cuda_impl.cuh"

/* ------------------------------------------------------------------ loss */

#define XENT_THREADS 512

/* one block per row: max, sum of exp (double), loss, then the gradient in place */
__global__ void k_xent(float *logits, float *losses, double *loss_sum, const int *targets,
                       const float *weights, int V, int Vp, int want_grad)
{
    __shared__ float shf[32];
    __shared__ double shd[32];
    int n = blockIdx.x;
    float *l = logits + (size_t)n * Vp;
    float mx = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x)
        mx = fmaxf(mx, l[v]);
    mx = block_max(mx, shf);
    double s = 0.0;
    for (int v = threadIdx.x; v < V; v += blockDim.x)
        s += (double)exp_poly(l[v] - mx);
    s = block_sum_d(s, shd);
    int tgt = targets[n];
    if (threadIdx.x == 0) {
        float loss = (float)(log(s) - (double)(l[tgt] - mx));
        losses[n] = loss;
        atomicAdd(loss_sum, (double)weights[n] * (double)loss);
    }
    if (!want_grad)
        return;
    __syncthreads(); /* l[tgt] is read before anyone overwrites it */
    float w = weights[n];
    float inv = (float)(1.0 / s);
    for (int v = threadIdx.x; v < Vp; v += blockDim.x)
        l[v] = v < V ? w * (exp_poly(l[v] - mx) * inv - (v == tgt ? 1.0f : 0.0f)) : 0.0f;
}

void cu_xent(kern_device *d, float *logits, float *losses, double *loss_sum,
                    const int *targets, const float *weights, int N, int V, int Vp,
                    int want_grad)
{
    *loss_sum = 0.0;
    CU_LIVE(d);
    PROF(d, KP_XENT);
    cu_impl *im = IM(d);
    if (!CU_OK(d, cudaMemsetAsync(im->scratch, 0, sizeof(double), im->stream)))
        return;
    if (N > 0) {
        k_xent<<<(unsigned)N, XENT_THREADS, 0, im->stream>>>(logits, losses, im->scratch,
                                                             targets, weights, V, Vp, want_grad);
        if (!CU_LAUNCHED(d, "xent"))
            return;
    }
    if (CU_OK(d, cudaMemcpyAsync(loss_sum, im->scratch, sizeof(double), cudaMemcpyDeviceToHost,
                                 im->stream)))
        CU_OK(d, cudaStreamSynchronize(im->stream));
}
