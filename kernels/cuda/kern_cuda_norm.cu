/* kern_cuda_norm: LayerNorm and the column reductions of the bias / LayerNorm gradients, for the CUDA backend (kern_cuda_impl.cuh). */
#include "kern_cuda_impl.cuh"

/* ------------------------------------------------------------- layernorm */

/* one warp per row */
__global__ void k_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp,
                                const float *w, const float *b, int N, int C)
{
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N)
        return;
    const float *x = inp + (size_t)row * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32)
        s += x[c];
    float m = __fdiv_rn(warp_sum(s), (float)C);
    float v = 0.0f;
    for (int c = lane; c < C; c += 32)
        v += (x[c] - m) * (x[c] - m);
    v = __fdiv_rn(warp_sum(v), (float)C);
    float r = __fdiv_rn(1.0f, __fsqrt_rn(v + 1e-5f));
    float *o = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32)
        o[c] = (x[c] - m) * r * w[c] + b[c];
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

__global__ void k_layernorm_bwd_inp(float *dinp, const float *dout, const float *inp,
                                    const float *w, const float *mean, const float *rstd, int N,
                                    int C)
{
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N)
        return;
    const float *x = inp + (size_t)row * C, *g = dout + (size_t)row * C;
    float m = mean[row], s = rstd[row];
    float a = 0.0f, bb = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float dn = g[c] * w[c];
        a += dn;
        bb += dn * (x[c] - m) * s;
    }
    a = __fdiv_rn(warp_sum(a), (float)C);
    bb = __fdiv_rn(warp_sum(bb), (float)C);
    float *di = dinp + (size_t)row * C;
    for (int c = lane; c < C; c += 32) {
        float norm = (x[c] - m) * s;
        di[c] += s * (g[c] * w[c] - a - norm * bb);
    }
}

#define COL_ROWS 256 /* rows per block of a column reduction */

/* column sums over a chunk of rows: block (32, 8), grid (cols/32, rows/COL_ROWS);
 * acc1[c] += sum g[n,c] * (mode ? (x[n,c]-mean[n])*rstd[n] : 1), acc2[c] += sum g[n,c] */
__global__ void k_colsum(float *acc1, float *acc2, const float *g, const float *x,
                         const float *mean, const float *rstd, int N, int C)
{
    __shared__ float s1[8][33], s2[8][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    int r0 = blockIdx.y * COL_ROWS, r1 = min(N, r0 + COL_ROWS);
    float a = 0.0f, b = 0.0f;
    if (c < C) {
        for (int n = r0 + threadIdx.y; n < r1; n += 8) {
            float gv = g[(size_t)n * C + c];
            if (x != NULL)
                a += gv * (x[(size_t)n * C + c] - mean[n]) * rstd[n];
            b += gv;
        }
    }
    s1[threadIdx.y][threadIdx.x] = a;
    s2[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        for (int k = 1; k < 8; k++) {
            a += s1[k][threadIdx.x];
            b += s2[k][threadIdx.x];
        }
        if (acc1 != NULL)
            atomicAdd(&acc1[c], a);
        if (acc2 != NULL)
            atomicAdd(&acc2[c], b);
    }
}

void colsum_launch(kern_device *d, float *acc1, float *acc2, const float *g,
                          const float *x, const float *mean, const float *rstd, int N, int C)
{
    dim3 grid((unsigned)((C + 31) / 32), (unsigned)((N + COL_ROWS - 1) / COL_ROWS));
    k_colsum<<<grid, dim3(32, 8), 0, IM(d)->stream>>>(acc1, acc2, g, x, mean, rstd, N, C);
    CU_LAUNCHED(d, "colsum");
}

void cu_layernorm_fwd(kern_device *d, float *out, float *mean, float *rstd,
                             const float *inp, const float *w, const float *b, int N, int C)
{
    CU_LIVE(d);
    PROF(d, KP_LN_FWD);
    if (N <= 0)
        return;
    k_layernorm_fwd<<<(unsigned)((N + 7) / 8), 256, 0, IM(d)->stream>>>(out, mean, rstd, inp, w,
                                                                        b, N, C);
    CU_LAUNCHED(d, "layernorm_fwd");
}

void cu_layernorm_bwd(kern_device *d, float *dinp, float *dw, float *db,
                             const float *dout, const float *inp, const float *w,
                             const float *mean, const float *rstd, int N, int C)
{
    CU_LIVE(d);
    PROF(d, KP_LN_BWD);
    if (N <= 0)
        return;
    k_layernorm_bwd_inp<<<(unsigned)((N + 7) / 8), 256, 0, IM(d)->stream>>>(dinp, dout, inp, w,
                                                                            mean, rstd, N, C);
    CU_LAUNCHED(d, "layernorm_bwd");
    if (dw != NULL) /* NULL: a frozen norm (LoRA) */
        colsum_launch(d, dw, db, dout, inp, mean, rstd, N, C);
}
