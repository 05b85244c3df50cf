/* kern_cuda_flash: tiled causal attention on bf16 tensor cores.
 * Contract: kern_cuda_flash.h. Layout notes: every shared tile is row-major
 * with padded leading dimensions (LDB bf16, LDF float: multiples of 8 and 4
 * as WMMA wants, and off the 32-bank period); every fragment pointer is a
 * multiple of 32 bytes from the 128-byte aligned base. Lane l of a warp
 * owns row l/2 of the warp's 16 rows and its columns 32*(l%2) .. +31. */
#include <cuda_bf16.h>
#include <mma.h>
#include <stdint.h>

#include "kern_cuda_flash.h"

using namespace nvcuda;

#define HS 64     /* head size */
#define TILE 64   /* queries / keys per tile */
#define NW 4      /* warps per block, 16 rows each */
#define LDB 72    /* bf16 tile leading dimension */
#define LDF 68    /* float tile leading dimension */

typedef __nv_bfloat16 bf16;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_acc;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> frag_a_row;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major> frag_a_col;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> frag_b_row;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> frag_b_col;

struct fwd_smem {
    bf16 q[TILE * LDB], k[TILE * LDB], v[TILE * LDB];
    float s[NW][16 * LDF];
    bf16 p[NW][16 * LDB];
    float o[NW][16 * LDF];
};

struct bwd_smem {
    bf16 k[TILE * LDB], v[TILE * LDB], q[TILE * LDB], dout[TILE * LDB];
    bf16 p[TILE * LDB], ds[TILE * LDB]; /* [query][key] of the current query tile */
    float s[NW][16 * LDF];              /* per warp: S, then dP */
    float acc[NW][16 * LDF];            /* per warp: dQ partial, then dK / dV out */
    float lse[TILE], dd[TILE];          /* per query row: lse, rowsum(dout * out) */
};

int kern_cuda_flash_supported(int C, int NH)
{
    return NH > 0 && C % NH == 0 && C / NH == HS;
}

/* rows [t0, t0 + TILE) x HS of one head's view (row stride ld) -> bf16 tile;
 * rows at or past T are zero */
__device__ static void load_tile(bf16 *dst, const float *src, size_t ld, int t0, int T)
{
    for (int i = threadIdx.x; i < TILE * HS; i += NW * 32) {
        int r = i / HS, c = i % HS;
        float x = t0 + r < T ? src[(size_t)(t0 + r) * ld + c] : 0.0f;
        dst[r * LDB + c] = __float2bfloat16_rn(x);
    }
}

/* C(16 x 64, ldc LDF) = A(16 x 64 row-major, lda LDB) * B^T, B given as
 * 64 rows x 64 (row-major, LDB): acc[n] over the four 16-column blocks */
__device__ static void mm_abt(float *c, const bf16 *a, const bf16 *b)
{
    for (int n = 0; n < 4; n++) {
        frag_acc acc;
        wmma::fill_fragment(acc, 0.0f);
        for (int kk = 0; kk < 4; kk++) {
            frag_a_row fa;
            frag_b_col fb;
            wmma::load_matrix_sync(fa, a + kk * 16, LDB);
            wmma::load_matrix_sync(fb, b + (n * 16) * LDB + kk * 16, LDB);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(c + n * 16, acc, LDF, wmma::mem_row_major);
    }
}

/* C(16 x 64) (+)= A(16 x 64 row-major) * B(64 x 64 row-major); add: C holds
 * the running value (loaded, accumulated, stored back) */
__device__ static void mm_ab(float *c, const bf16 *a, const bf16 *b, bool add)
{
    for (int n = 0; n < 4; n++) {
        frag_acc acc;
        if (add)
            wmma::load_matrix_sync(acc, c + n * 16, LDF, wmma::mem_row_major);
        else
            wmma::fill_fragment(acc, 0.0f);
        for (int kk = 0; kk < 4; kk++) {
            frag_a_row fa;
            frag_b_row fb;
            wmma::load_matrix_sync(fa, a + kk * 16, LDB);
            wmma::load_matrix_sync(fb, b + (kk * 16) * LDB + n * 16, LDB);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(c + n * 16, acc, LDF, wmma::mem_row_major);
    }
}

__global__ void __launch_bounds__(NW * 32)
    k_flash_fwd(float *out, float *lse, const float *qkv, int T, int C, int NH, float scale)
{
    extern __shared__ __align__(128) unsigned char smem_raw[];
    fwd_smem &sm = *reinterpret_cast<fwd_smem *>(smem_raw);
    /* the last query tiles see the most keys: start them first */
    int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r = lane >> 1, half = lane & 1;
    int q0 = qt * TILE, qi = q0 + warp * 16 + r;
    size_t ld = 3 * (size_t)C;
    const float *base = qkv + (size_t)b * T * ld + h * HS;
    load_tile(sm.q, base, ld, q0, T);
    float *orow = &sm.o[warp][r * LDF + half * 32];
    float *srow = &sm.s[warp][r * LDF + half * 32];
    bf16 *prow = &sm.p[warp][r * LDB + half * 32];
    for (int c = 0; c < 32; c++)
        orow[c] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int kt = 0; kt <= qt; kt++) { /* causal: keys up to the diagonal tile */
        int k0 = kt * TILE;
        __syncthreads(); /* the previous K, V tiles are no longer read */
        load_tile(sm.k, base + C, ld, k0, T);
        load_tile(sm.v, base + 2 * C, ld, k0, T);
        __syncthreads();
        mm_abt(sm.s[warp], sm.q + warp * 16 * LDB, sm.k);
        __syncwarp();
        float mx = -INFINITY;
        for (int c = 0; c < 32; c++) {
            int kj = k0 + half * 32 + c;
            float x = kj <= qi && kj < T ? srow[c] * scale : -INFINITY;
            srow[c] = x;
            mx = fmaxf(mx, x);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        float mnew = fmaxf(m, mx);
        float alpha = mnew == -INFINITY ? 1.0f : __expf(m - mnew);
        float sum = 0.0f;
        for (int c = 0; c < 32; c++) {
            float p = mnew == -INFINITY ? 0.0f : __expf(srow[c] - mnew);
            prow[c] = __float2bfloat16_rn(p);
            sum += p;
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        l = l * alpha + sum;
        m = mnew;
        for (int c = 0; c < 32; c++)
            orow[c] *= alpha;
        __syncwarp();
        mm_ab(sm.o[warp], sm.p[warp], sm.v, true);
        __syncwarp();
    }
    if (qi < T) {
        float inv = 1.0f / l;
        float *dst = out + ((size_t)b * T + qi) * C + h * HS + half * 32;
        for (int c = 0; c < 32; c++)
            dst[c] = orow[c] * inv;
        if (half == 0)
            lse[((size_t)b * NH + h) * T + qi] = m + logf(l);
    }
}

/* per query row of the tile: lse, and D = rowsum(dout * out) in fp32 */
__device__ static void load_row_stats(bwd_smem &sm, const float *lse_bh, const float *dout_b,
                                      const float *out_b, int C, int q0, int T)
{
    int t = threadIdx.x, row = t >> 1, half = t & 1, q = q0 + row;
    float d = 0.0f;
    if (q < T) {
        const float *g = dout_b + (size_t)q * C + half * 32, *o = out_b + (size_t)q * C + half * 32;
        for (int c = 0; c < 32; c++)
            d += g[c] * o[c];
    }
    d += __shfl_xor_sync(0xffffffffu, d, 1);
    if (half == 0) {
        sm.dd[row] = d;
        sm.lse[row] = q < T ? lse_bh[q] : 0.0f;
    }
}

__global__ void __launch_bounds__(NW * 32)
    k_flash_bwd(float *dqkv, const float *dout, const float *qkv, const float *lse,
                const float *out, int T, int C, int NH, float scale)
{
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bwd_smem &sm = *reinterpret_cast<bwd_smem *>(smem_raw);
    int kt = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r = lane >> 1, half = lane & 1;
    int k0 = kt * TILE, nqt = (T + TILE - 1) / TILE;
    size_t ld = 3 * (size_t)C;
    const float *base = qkv + (size_t)b * T * ld + h * HS;
    const float *dout_b = dout + (size_t)b * T * C + h * HS, *out_b = out + (size_t)b * T * C + h * HS;
    const float *lse_bh = lse + ((size_t)b * NH + h) * T;
    float *dq_b = dqkv + (size_t)b * T * ld + h * HS;
    load_tile(sm.k, base + C, ld, k0, T);
    load_tile(sm.v, base + 2 * C, ld, k0, T);
    frag_acc dk[4], dv[4]; /* this warp's 16 keys x 64 dims */
    for (int n = 0; n < 4; n++) {
        wmma::fill_fragment(dk[n], 0.0f);
        wmma::fill_fragment(dv[n], 0.0f);
    }
    float *srow = &sm.s[warp][r * LDF + half * 32];
    for (int qt = kt; qt < nqt; qt++) { /* causal: queries from the diagonal tile on */
        int q0 = qt * TILE, rq = warp * 16 + r, qi = q0 + rq;
        __syncthreads(); /* the previous query tile is no longer read */
        load_tile(sm.q, base, ld, q0, T);
        load_tile(sm.dout, dout_b, (size_t)C, q0, T);
        load_row_stats(sm, lse_bh, dout_b, out_b, C, q0, T);
        __syncthreads();
        /* P = exp(scale q.k - lse), kept in registers and as bf16 */
        mm_abt(sm.s[warp], sm.q + warp * 16 * LDB, sm.k);
        __syncwarp();
        float p[32], row_lse = sm.lse[rq], row_d = sm.dd[rq];
        for (int c = 0; c < 32; c++) {
            int kj = k0 + half * 32 + c;
            p[c] = kj <= qi && qi < T && kj < T ? __expf(srow[c] * scale - row_lse) : 0.0f;
            sm.p[rq * LDB + half * 32 + c] = __float2bfloat16_rn(p[c]);
        }
        __syncwarp();
        /* dP = dout v^T; dS = P (dP - D), times scale: the gradient of q.k */
        mm_abt(sm.s[warp], sm.dout + warp * 16 * LDB, sm.v);
        __syncwarp();
        for (int c = 0; c < 32; c++)
            sm.ds[rq * LDB + half * 32 + c] = __float2bfloat16_rn(p[c] * (srow[c] - row_d) * scale);
        __syncthreads(); /* every warp's P and dS rows: dK and dV sum over all 64 queries */
        for (int kk = 0; kk < 4; kk++) {
            frag_a_col fpt, fdst; /* P^T, dS^T: keys of this warp x queries kk */
            wmma::load_matrix_sync(fpt, sm.p + (kk * 16) * LDB + warp * 16, LDB);
            wmma::load_matrix_sync(fdst, sm.ds + (kk * 16) * LDB + warp * 16, LDB);
            for (int n = 0; n < 4; n++) {
                frag_b_row fdo, fq;
                wmma::load_matrix_sync(fdo, sm.dout + (kk * 16) * LDB + n * 16, LDB);
                wmma::mma_sync(dv[n], fpt, fdo, dv[n]);
                wmma::load_matrix_sync(fq, sm.q + (kk * 16) * LDB + n * 16, LDB);
                wmma::mma_sync(dk[n], fdst, fq, dk[n]);
            }
        }
        /* dQ (this warp's 16 queries) += dS K, added across key tiles */
        mm_ab(sm.acc[warp], sm.ds + warp * 16 * LDB, sm.k, false);
        __syncwarp();
        for (int i = lane; i < 16 * HS; i += 32) {
            int rr = i / HS, c = i % HS, t = q0 + warp * 16 + rr;
            if (t < T)
                atomicAdd(&dq_b[(size_t)t * ld + c], sm.acc[warp][rr * LDF + c]);
        }
        __syncwarp();
    }
    /* dK, dV of this warp's 16 keys: += into dqkv (one block owns them) */
    for (int which = 0; which < 2; which++) {
        for (int n = 0; n < 4; n++)
            wmma::store_matrix_sync(sm.acc[warp] + n * 16, which ? dv[n] : dk[n], LDF,
                                    wmma::mem_row_major);
        __syncwarp();
        for (int i = lane; i < 16 * HS; i += 32) {
            int rr = i / HS, c = i % HS, t = k0 + warp * 16 + rr;
            if (t < T)
                dq_b[(size_t)t * ld + (which ? 2 : 1) * C + c] += sm.acc[warp][rr * LDF + c];
        }
        __syncwarp();
    }
}

cudaError_t kern_cuda_flash_fwd(cudaStream_t stream, float *out, float *lse, const float *qkv,
                                int B, int T, int C, int NH)
{
    size_t smem = sizeof(fwd_smem);
    cudaError_t e = cudaFuncSetAttribute(k_flash_fwd, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem);
    if (e != cudaSuccess)
        return e;
    dim3 grid((unsigned)((T + TILE - 1) / TILE), (unsigned)NH, (unsigned)B);
    k_flash_fwd<<<grid, NW * 32, smem, stream>>>(out, lse, qkv, T, C, NH,
                                                 0.125f /* 1 / sqrt(HS) */);
    return cudaGetLastError();
}

cudaError_t kern_cuda_flash_bwd(cudaStream_t stream, float *dqkv, const float *dout,
                                const float *qkv, const float *lse, const float *out, int B,
                                int T, int C, int NH)
{
    size_t smem = sizeof(bwd_smem);
    cudaError_t e = cudaFuncSetAttribute(k_flash_bwd, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem);
    if (e != cudaSuccess)
        return e;
    dim3 grid((unsigned)((T + TILE - 1) / TILE), (unsigned)NH, (unsigned)B);
    k_flash_bwd<<<grid, NW * 32, smem, stream>>>(dqkv, dout, qkv, lse, out, T, C, NH,
                                                 0.125f /* 1 / sqrt(HS) */);
    return cudaGetLastError();
}
