/* kern_cuda: the CUDA backend of kern_device (fp32). Contract: kern_cuda.h.
 *
 * One CUDA stream, one cuBLAS and one cuBLASLt handle per device; every op
 * is queued on that stream in call order. The linear layers' products go
 * through cublasLtMatmul (fp32 compute, bias epilogue, algorithm chosen per
 * shape and operand alignment and cached; cublasSgemm when cuBLASLt offers
 * none; bf16 operands with fp32 accumulation when kern_cuda_set_bf16 is
 * on). The four products of attention are cublasSgemmStridedBatched over
 * heads on the strided q/k/v views of qkv, so attention needs no memory
 * beyond the att buffer of the interface (scores above the diagonal are
 * computed, then masked to 0, as on CPU). The rest are kernels written here: one warp per
 * row for LayerNorm and the causal softmax, one block per row for the fused
 * softmax + cross-entropy (+ its gradient, in place in the logits),
 * column-chunk reductions with atomicAdd for bias / LayerNorm / embedding
 * gradients (backwards accumulate, +=), grid-stride loops for pointwise ops.
 *
 * Precision: the build uses --use_fast_math, so kernels that must match the
 * CPU reference to 1e-5 avoid the fast intrinsics: exp is the same
 * polynomial the CPU backend uses (relative error < 2e-7), divisions and
 * square roots use the correctly rounded __fdiv_rn / __fsqrt_rn, and the
 * loss and sum-of-squares reductions run in double.
 *
 * Errors: CU_OK / BL_OK check every CUDA runtime, cuBLAS and cuBLASLt
 * call (teardown ignores its own, having no one to report to); the first
 * failure is kept in the device (sticky) and turns later ops into no-ops.
 * No global mutable state: everything lives in the device's cu_impl.
 */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "kern_device.h"
}
#include "kern_cuda.h"
#include "kern_cuda_flash.h"
#include "kern_cuda_llama.h"

#define CU_MARGIN (512ull << 20) /* left free on the GPU: context, cuBLAS, NCCL */
#define CU_SMALL (1ull << 20)    /* blocks below this round to 512 B, others to 2 MiB */

typedef struct cu_block {
    void *ptr;
    size_t size;  /* bytes reserved by cudaMalloc */
    size_t bytes; /* bytes asked (accounted), when used */
    int used;
} cu_block;

/* a cuBLASLt algorithm chosen for one problem shape (heuristic cache) */
typedef struct lt_key {
    int M, N, K, ta, tb, bias, tf32, beta1, bf16;
    int lda, ldb, ldc;
    unsigned al_a, al_b, al_c;
} lt_key;

typedef struct lt_entry {
    lt_key key;
    cublasLtMatmulAlgo_t algo;
    int ok; /* 0: cuBLASLt has no algorithm for it, use cublasSgemm */
} lt_entry;

#define LT_CACHE 64
#define LT_WORKSPACE (32ull << 20)

typedef struct cu_impl {
    int ordinal;
    cudaStream_t stream;
    cublasHandle_t blas;
    cublasLtHandle_t lt;     /* NULL: cuBLASLt off (ACCUMD_CUDA_NO_LT=1) */
    void *lt_ws;
    lt_entry lt_cache[LT_CACHE];
    int lt_n, lt_next;
    int tf32;
    int bf16;                /* linear-layer products in bf16 (kern_cuda_set_bf16) */
    int flash;               /* bf16 mode: tiled tensor-core attention (kern_cuda_set_flash) */
    void *bf_a, *bf_b;       /* their bf16 operand copies, accounted, grown on demand */
    size_t bf_a_bytes, bf_b_bytes;
    cu_block *blocks;
    int nblocks, cap;
    unsigned long long reserved;
    double *scratch; /* [0] loss sum, [1] sum of squares */
    int prof_on;             /* kern_cuda_set_profile */
    struct prof_rec *prof;   /* event pairs recorded since the last read */
    int prof_n, prof_cap;
    int err_code;
    char err_msg[480];
} cu_impl;

static cu_impl *IM(kern_device *d) { return (cu_impl *)d->impl; }

static void cu_sticky_code(kern_device *d, int code, const char *what, const char *why,
                           const char *file, int line)
{
    cu_impl *im = IM(d);
    if (im->err_code != 0)
        return;
    im->err_code = code;
    const char *base = strrchr(file, '/');
    snprintf(im->err_msg, sizeof im->err_msg, "device %.64s: %.160s failed: %.160s (%s:%d)",
             d->info.name, what, why, base ? base + 1 : file, line);
}

static void cu_sticky(kern_device *d, const char *what, const char *why, const char *file,
                      int line)
{
    cu_sticky_code(d, ACC_EDEVICE, what, why, file, line);
}

static bool cu_ok_rt(kern_device *d, cudaError_t rc, const char *what, const char *file,
                     int line)
{
    if (rc == cudaSuccess)
        return true;
    cu_sticky(d, what, cudaGetErrorString(rc), file, line);
    return false;
}

static bool cu_ok_blas(kern_device *d, cublasStatus_t rc, const char *what, const char *file,
                       int line)
{
    if (rc == CUBLAS_STATUS_SUCCESS)
        return true;
    cu_sticky(d, what, cublasGetStatusString(rc), file, line);
    return false;
}

#define CU_OK(d, call) cu_ok_rt((d), (call), #call, __FILE__, __LINE__)
#define BL_OK(d, call) cu_ok_blas((d), (call), #call, __FILE__, __LINE__)
/* A launch never legitimately fails with "not ready": that is a query's
 * result left as the thread's last error (an event or stream polled by
 * another module, e.g. the NCCL wait), not this launch's. */
static cudaError_t launch_error(void)
{
    cudaError_t e = cudaGetLastError();
    return e == cudaErrorNotReady ? cudaSuccess : e;
}
#define CU_LAUNCHED(d, name) cu_ok_rt((d), launch_error(), "launch of " name, __FILE__, __LINE__)
/* Ops may come from a thread whose current device is another GPU (a test
 * or a benchmark driving several devices): make this one current. false
 * once the device has a sticky error. */
static bool cu_enter(kern_device *d)
{
    cu_impl *im = IM(d);
    if (im->err_code != 0)
        return false;
    int cur = -1;
    if (!cu_ok_rt(d, cudaGetDevice(&cur), "cudaGetDevice", __FILE__, __LINE__))
        return false;
    return cur == im->ordinal ||
           cu_ok_rt(d, cudaSetDevice(im->ordinal), "cudaSetDevice", __FILE__, __LINE__);
}

#define CU_LIVE(d)                  \
    do {                            \
        if (!cu_enter(d))           \
            return;                 \
    } while (0)

/* ---- per-op GPU time for benchmarks (kern_cuda_set_profile): a pair of
 * events around each op on the stream; nothing when off */
enum {
    KP_ZERO, KP_COPY, KP_UPLOAD, KP_ENC_FWD, KP_ENC_BWD, KP_LN_FWD, KP_LN_BWD, KP_MM_FWD,
    KP_MM_BWD, KP_ATT_FWD, KP_ATT_BWD, KP_GELU_FWD, KP_GELU_BWD, KP_ADD, KP_XENT, KP_ADAMW,
    KP_SUMSQ, KP_TO_BF16, KP_N
};
static const char *const kp_name[KP_N] = {
    "zero", "copy", "upload", "encoder_fwd", "encoder_bwd", "layernorm_fwd", "layernorm_bwd",
    "matmul_fwd", "matmul_bwd", "attention_fwd", "attention_bwd", "gelu_fwd", "gelu_bwd", "add",
    "xent", "adamw", "sumsq", "to_bf16"};

static_assert(KP_N == KERN_CUDA_PROF_OPS, "kern_cuda.h's op count");

struct prof_rec {
    int op;
    cudaEvent_t a, b;
};

/* Records the op's start at construction and its end at scope exit. Event
 * failures are ignored: profiling must never change what the op does. */
struct prof_scope {
    cu_impl *im;
    int idx;
    prof_scope(kern_device *d, int op) : im(IM(d)), idx(-1)
    {
        if (!im->prof_on)
            return;
        if (im->prof_n == im->prof_cap) {
            int cap = im->prof_cap ? 2 * im->prof_cap : 1024;
            prof_rec *p = (prof_rec *)realloc(im->prof, (size_t)cap * sizeof *p);
            if (p == NULL)
                return;
            for (int i = im->prof_cap; i < cap; i++)
                p[i].a = p[i].b = NULL;
            im->prof = p;
            im->prof_cap = cap;
        }
        prof_rec *r = &im->prof[im->prof_n];
        /* a failed event call also sets the thread's last CUDA error, which
         * the next launch check would report: clear it */
        if ((r->a == NULL && cudaEventCreate(&r->a) != cudaSuccess) ||
            (r->b == NULL && cudaEventCreate(&r->b) != cudaSuccess)) {
            (void)cudaGetLastError();
            return;
        }
        r->op = op;
        if (cudaEventRecord(r->a, im->stream) == cudaSuccess)
            idx = im->prof_n++;
        else
            (void)cudaGetLastError();
    }
    ~prof_scope()
    {
        if (idx >= 0 && cudaEventRecord(im->prof[idx].b, im->stream) != cudaSuccess)
            (void)cudaGetLastError();
    }
};
#define PROF(d, op) prof_scope prof_scope_((d), (op))

static unsigned grid_for(size_t n, unsigned threads)
{
    size_t g = (n + threads - 1) / threads;
    if (g > 65535u * 16u)
        g = 65535u * 16u;
    return g == 0 ? 1u : (unsigned)g;
}

/* ---------------------------------------------------------------- memory */

static size_t cu_round(size_t bytes)
{
    if (bytes == 0)
        bytes = 1;
    if (bytes < CU_SMALL)
        return (bytes + 511) & ~(size_t)511;
    return (bytes + (2ull << 20) - 1) & ~(size_t)((2ull << 20) - 1);
}

static void cu_release_cache(kern_device *d)
{
    cu_impl *im = IM(d);
    int j = 0;
    for (int i = 0; i < im->nblocks; i++) {
        if (!im->blocks[i].used) {
            CU_OK(d, cudaFree(im->blocks[i].ptr));
            im->reserved -= im->blocks[i].size;
        } else {
            im->blocks[j++] = im->blocks[i];
        }
    }
    im->nblocks = j;
}

static int cu_oom(kern_device *d, size_t bytes, acc_err *err)
{
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) {
        (void)cudaGetLastError();
        fr = 0;
    }
    return acc_err_set(err, ACC_EOOM, "",
                       "device %s: out of memory allocating %zu bytes "
                       "(%llu of %llu bytes in use, %zu bytes free on the GPU)",
                       d->info.name, bytes, (unsigned long long)d->in_use,
                       (unsigned long long)d->budget, fr);
}

static int cu_alloc(kern_device *d, size_t bytes, void **out, acc_err *err)
{
    cu_impl *im = IM(d);
    *out = NULL;
    if (!cu_enter(d))
        return acc_err_set(err, im->err_code, "", "%s", im->err_msg);
    if (d->budget != 0 && d->in_use + bytes > d->budget)
        return cu_oom(d, bytes, err);
    size_t size = cu_round(bytes);
    /* best fit among cached blocks, wasting at most a quarter */
    int best = -1;
    for (int i = 0; i < im->nblocks; i++) {
        cu_block *b = &im->blocks[i];
        if (!b->used && b->size >= size && b->size <= size + size / 4 &&
            (best < 0 || b->size < im->blocks[best].size))
            best = i;
    }
    if (best < 0) {
        if (im->nblocks == im->cap) {
            int cap = im->cap ? 2 * im->cap : 64;
            cu_block *nb = (cu_block *)realloc(im->blocks, (size_t)cap * sizeof *nb);
            if (nb == NULL)
                return acc_err_set(err, ACC_ENOMEM, "", "device %s: host allocation failed",
                                   d->info.name);
            im->blocks = nb;
            im->cap = cap;
        }
        void *p = NULL;
        cudaError_t rc = cudaMalloc(&p, size);
        if (rc == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            cu_release_cache(d);
            rc = cudaMalloc(&p, size);
        }
        if (rc == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            return cu_oom(d, bytes, err);
        }
        if (rc != cudaSuccess) {
            cu_ok_rt(d, rc, "cudaMalloc", __FILE__, __LINE__);
            return acc_err_set(err, ACC_EDEVICE, "", "%s", im->err_msg);
        }
        best = im->nblocks++;
        im->blocks[best].ptr = p;
        im->blocks[best].size = size;
        im->reserved += size;
    }
    im->blocks[best].used = 1;
    im->blocks[best].bytes = bytes;
    d->in_use += bytes;
    if (d->in_use > d->peak)
        d->peak = d->in_use;
    *out = im->blocks[best].ptr;
    return 0;
}

static void cu_free(kern_device *d, void *p)
{
    if (p == NULL)
        return;
    cu_impl *im = IM(d);
    for (int i = 0; i < im->nblocks; i++) {
        if (im->blocks[i].ptr == p && im->blocks[i].used) {
            /* stream order makes reuse safe: later ops queue after earlier ones */
            im->blocks[i].used = 0;
            d->in_use -= im->blocks[i].bytes;
            return;
        }
    }
    cu_sticky(d, "free", "pointer not allocated on this device", __FILE__, __LINE__);
}

static void cu_zero(kern_device *d, void *p, size_t bytes)
{
    CU_LIVE(d);
    PROF(d, KP_ZERO);
    CU_OK(d, cudaMemsetAsync(p, 0, bytes, IM(d)->stream));
}

static void cu_copy(kern_device *d, void *dst, const void *src, size_t bytes)
{
    CU_LIVE(d);
    PROF(d, KP_COPY);
    CU_OK(d, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, IM(d)->stream));
}

static void cu_upload(kern_device *d, void *dst, const void *host, size_t bytes)
{
    CU_LIVE(d);
    PROF(d, KP_UPLOAD);
    if (CU_OK(d, cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, IM(d)->stream)))
        CU_OK(d, cudaStreamSynchronize(IM(d)->stream));
}

static void cu_download(kern_device *d, void *host, const void *src, size_t bytes)
{
    CU_LIVE(d);
    if (CU_OK(d, cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, IM(d)->stream)))
        CU_OK(d, cudaStreamSynchronize(IM(d)->stream));
}

/* ------------------------------------------------------------ reductions */

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ double warp_sum_d(double v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* block-wide reductions; blockDim.x a multiple of 32, at most 1024 */
__device__ float block_max(float v, float *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0)
        sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -INFINITY;
    return warp_max(v);
}

__device__ double block_sum_d(double v, double *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum_d(v);
    __syncthreads();
    if (lane == 0)
        sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0;
    return warp_sum_d(v);
}

/* e^x as in kern_cpu.c: 2^n p(r), degree-6 Taylor p, x clamped to [-87, 88].
 * The clamp is written as the CPU's comparisons, not fminf/fmaxf, so that a
 * NaN stays NaN (fmaxf(NaN, -87) is -87) and a diverged run shows it. */
__device__ __forceinline__ float exp_poly(float x)
{
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    float t = x * 1.44269504f;
    int n = (int)(t + 128.5f) - 128;
    float r = x - (float)n * 0.693145752f - (float)n * 1.42860677e-6f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.66666667e-1f + r * (4.16666667e-2f +
                                                   r * (8.33333333e-3f + r * 1.38888889e-3f)))));
    return p * __int_as_float((n + 127) * (1 << 23));
}

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

static void cu_encoder_fwd(kern_device *d, float *out, const int *tok, const float *wte,
                           const float *wpe, int B, int T, int C)
{
    CU_LIVE(d);
    PROF(d, KP_ENC_FWD);
    size_t total = (size_t)B * T * C;
    k_encoder_fwd<<<grid_for(total, 256), 256, 0, IM(d)->stream>>>(out, tok, wte, wpe, T, C,
                                                                   total);
    CU_LAUNCHED(d, "encoder_fwd");
}

static void cu_encoder_bwd(kern_device *d, float *dwte, float *dwpe, const float *dout,
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

static void colsum_launch(kern_device *d, float *acc1, float *acc2, const float *g,
                          const float *x, const float *mean, const float *rstd, int N, int C)
{
    dim3 grid((unsigned)((C + 31) / 32), (unsigned)((N + COL_ROWS - 1) / COL_ROWS));
    k_colsum<<<grid, dim3(32, 8), 0, IM(d)->stream>>>(acc1, acc2, g, x, mean, rstd, N, C);
    CU_LAUNCHED(d, "colsum");
}

static void cu_layernorm_fwd(kern_device *d, float *out, float *mean, float *rstd,
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

static void cu_layernorm_bwd(kern_device *d, float *dinp, float *dw, float *db,
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
    colsum_launch(d, dw, db, dout, inp, mean, rstd, N, C);
}

/* ---------------------------------------------------------------- matmul */

/* Row-major C[M,N] = op(A)[M,K] op(B)[K,N] (alpha 1), batched with strides:
 * cuBLAS is column-major, so compute C^T = op(B)^T op(A)^T by swapping. */
static void rm_gemm(kern_device *d, bool ta, bool tb, int M, int N, int K, const float *A,
                    int lda, long long sA, const float *B, int ldb, long long sB, float beta,
                    float *C, int ldc, long long sC, int batch)
{
    const float one = 1.0f;
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (batch == 1)
        BL_OK(d, cublasSgemm(IM(d)->blas, ob, oa, N, M, K, &one, B, ldb, A, lda, &beta, C, ldc));
    else
        BL_OK(d, cublasSgemmStridedBatched(IM(d)->blas, ob, oa, N, M, K, &one, B, ldb, sB, A,
                                           lda, sA, &beta, C, ldc, sC, batch));
}

/* Largest power of two (4..256) dividing the address: cuBLASLt's heuristic
 * must be told, else it assumes 256-byte aligned operands. */
static unsigned align_of(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    unsigned al = 256;
    while (al > 4 && a % al != 0)
        al >>= 1;
    return al;
}

static bool key_eq(const lt_key *a, const lt_key *b)
{
    return a->M == b->M && a->N == b->N && a->K == b->K && a->ta == b->ta && a->tb == b->tb &&
           a->bias == b->bias && a->tf32 == b->tf32 && a->beta1 == b->beta1 &&
           a->bf16 == b->bf16 && a->lda == b->lda && a->ldb == b->ldb && a->ldc == b->ldc &&
           a->al_a == b->al_a && a->al_b == b->al_b && a->al_c == b->al_c;
}

/* Row-major C[M,N] = op(A) op(B) + beta C (+ bias[N] per row when bias is
 * given) through cublasLtMatmul, fp32 compute (TF32 when allowed). Same
 * column-major swap as rm_gemm. Returns 1 done, 0 no cuBLASLt algorithm
 * (the caller uses cublasSgemm), -1 failed (sticky error set). */
static int lt_gemm(kern_device *d, bool ta, bool tb, int M, int N, int K, const void *A, int lda,
                   const void *B, int ldb, float beta, float *C, int ldc, const float *bias,
                   bool bf16)
{
    cu_impl *im = IM(d);
    if (im->err_code != 0) /* an earlier product of the same op failed */
        return -1;
    if (im->lt == NULL)
        return 0;
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasComputeType_t ct = im->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    cublasStatus_t st;
    lt_entry *e = NULL;
    int rc = -1, nres = 0;
    uint64_t ws = LT_WORKSPACE;
    const float one = 1.0f;
    lt_key key;
    memset(&key, 0, sizeof key);
    key.M = M, key.N = N, key.K = K, key.ta = ta, key.tb = tb, key.bias = bias != NULL;
    key.tf32 = im->tf32, key.beta1 = beta != 0.0f, key.bf16 = bf16;
    key.lda = lda, key.ldb = ldb, key.ldc = ldc;
    cudaDataType_t ab = bf16 ? CUDA_R_16BF : CUDA_R_32F;
    if (bf16)
        ct = CUBLAS_COMPUTE_32F; /* bf16 products, fp32 accumulation */
    key.al_a = align_of(B), key.al_b = align_of(A), key.al_c = align_of(C);
    memset(&res, 0, sizeof res);
#define LT_OK(call)              \
    do {                         \
        if (!BL_OK(d, call))     \
            goto out;            \
    } while (0)
    LT_OK(cublasLtMatmulDescCreate(&op, ct, CUDA_R_32F));
    /* cuBLASLt's A is our B, its B our A (C^T = op(B)^T op(A)^T) */
    LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ob, sizeof ob));
    LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &oa, sizeof oa));
    if (bias != NULL) {
        LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                             sizeof bias));
    }
    LT_OK(cublasLtMatrixLayoutCreate(&la, ab, tb ? K : N, tb ? N : K, ldb));
    LT_OK(cublasLtMatrixLayoutCreate(&lb, ab, ta ? M : K, ta ? K : M, lda));
    LT_OK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, N, M, ldc));
    for (int i = 0; i < im->lt_n; i++)
        if (key_eq(&im->lt_cache[i].key, &key))
            e = &im->lt_cache[i];
    if (e == NULL) {
        LT_OK(cublasLtMatmulPreferenceCreate(&pref));
        LT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                   &ws, sizeof ws));
        LT_OK(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.al_a, sizeof key.al_a));
        LT_OK(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.al_b, sizeof key.al_b));
        LT_OK(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.al_c, sizeof key.al_c));
        LT_OK(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.al_c, sizeof key.al_c));
        /* any refusal here (no algorithm for this alignment, shape or
         * epilogue) only means cublasSgemm does this product: checked, not
         * an error */
        st = cublasLtMatmulAlgoGetHeuristic(im->lt, op, la, lb, lc, lc, pref, 1, &res, &nres);
        int slot = im->lt_n < LT_CACHE ? im->lt_n++ : (im->lt_next++ % LT_CACHE);
        e = &im->lt_cache[slot];
        e->key = key;
        e->ok = st == CUBLAS_STATUS_SUCCESS && nres > 0;
        if (e->ok)
            e->algo = res.algo;
    }
    if (!e->ok) {
        rc = 0;
        goto out;
    }
    LT_OK(cublasLtMatmul(im->lt, op, &one, B, la, A, lb, &beta, C, lc, C, lc, &e->algo,
                         im->lt_ws, LT_WORKSPACE, im->stream));
    rc = 1;
out:
#undef LT_OK
    if (pref != NULL)
        BL_OK(d, cublasLtMatmulPreferenceDestroy(pref));
    if (lc != NULL)
        BL_OK(d, cublasLtMatrixLayoutDestroy(lc));
    if (lb != NULL)
        BL_OK(d, cublasLtMatrixLayoutDestroy(lb));
    if (la != NULL)
        BL_OK(d, cublasLtMatrixLayoutDestroy(la));
    if (op != NULL)
        BL_OK(d, cublasLtMatmulDescDestroy(op));
    return im->err_code != 0 ? -1 : rc;
}

/* fp32 [rows, cols] with leading dimension ld -> dense bf16 [rows, cols] */
__global__ void k_to_bf16(__nv_bfloat16 *dst, const float *src, int cols, int ld, size_t total)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / cols;
        int c = (int)(i % cols);
        dst[i] = __float2bfloat16_rn(src[r * ld + c]);
    }
}

/* grow one of the two bf16 operand buffers; an allocation failure is a
 * sticky ACC_EOOM, so the trainer's OOM path sees it */
static void *bf_scratch(kern_device *d, int which, size_t bytes)
{
    cu_impl *im = IM(d);
    void **p = which ? &im->bf_b : &im->bf_a;
    size_t *have = which ? &im->bf_b_bytes : &im->bf_a_bytes;
    if (*p != NULL && *have >= bytes)
        return *p;
    cu_free(d, *p);
    *p = NULL;
    *have = 0;
    acc_err e = {0};
    if (cu_alloc(d, bytes, p, &e) != 0) {
        cu_sticky_code(d, e.code == ACC_EOOM ? ACC_EOOM : ACC_EDEVICE, "bf16 operand buffer", e.msg,
                       __FILE__, __LINE__);
        return NULL;
    }
    *have = bytes;
    return *p;
}

/* copy a row-major fp32 operand [rows, cols] (leading dimension ld) to bf16 */
static const void *to_bf16(kern_device *d, int which, const float *src, int rows, int cols, int ld)
{
    PROF(d, KP_TO_BF16);
    size_t total = (size_t)rows * cols;
    __nv_bfloat16 *dst = (__nv_bfloat16 *)bf_scratch(d, which, total * sizeof *dst);
    if (dst == NULL)
        return NULL;
    k_to_bf16<<<grid_for(total, 256), 256, 0, IM(d)->stream>>>(dst, src, cols, ld, total);
    return CU_LAUNCHED(d, "to_bf16") ? dst : NULL;
}

/* A product of the linear layers: cuBLASLt, else cublasSgemm (fp32); in
 * bf16 mode both operands are first rounded to bf16 (dense copies), then
 * cuBLASLt or cublasGemmEx multiply them with fp32 accumulation into the
 * fp32 C. Returns whether cuBLASLt did it (with the bias, if given). */
static bool lin_gemm(kern_device *d, bool ta, bool tb, int M, int N, int K, const float *A,
                     int lda, const float *B, int ldb, float beta, float *C, int ldc,
                     const float *bias, const void *a16_done)
{
    cu_impl *im = IM(d);
    if (!im->bf16) {
        int r = lt_gemm(d, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, bias, false);
        if (r < 0)
            return false;
        if (r == 0)
            rm_gemm(d, ta, tb, M, N, K, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
        return r == 1;
    }
    int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    /* a16_done: A's dense bf16 copy already made (matmul_bwd's dout) */
    const void *a16 = a16_done != NULL ? a16_done : to_bf16(d, 0, A, ar, ac, lda);
    const void *b16 = a16 != NULL ? to_bf16(d, 1, B, br, bc, ldb) : NULL;
    if (b16 == NULL)
        return false;
    int r = lt_gemm(d, ta, tb, M, N, K, a16, ac, b16, bc, beta, C, ldc, bias, true);
    if (r != 0)
        return r == 1;
    const float one = 1.0f;
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    BL_OK(d, cublasGemmEx(im->blas, ob, oa, N, M, K, &one, b16, CUDA_R_16BF, bc, a16,
                          CUDA_R_16BF, ac, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT));
    return false;
}

__global__ void k_add_bias(float *out, const float *bias, int OC, size_t total)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] += bias[i % OC];
}

static void cu_matmul_fwd(kern_device *d, float *out, const float *inp, const float *w,
                          const float *bias, int N, int C, int OC)
{
    CU_LIVE(d);
    PROF(d, KP_MM_FWD);
    if (N <= 0)
        return;
    /* the bias epilogue wants a 16-byte aligned bias; else a separate pass */
    const float *ep = bias != NULL && (uintptr_t)bias % 16 == 0 ? bias : NULL;
    bool fused = lin_gemm(d, false, true, N, OC, C, inp, C, w, C, 0.0f, out, OC, ep, NULL);
    if (IM(d)->err_code != 0)
        return;
    if (bias != NULL && !(fused && ep != NULL)) {
        size_t total = (size_t)N * OC;
        k_add_bias<<<grid_for(total, 256), 256, 0, IM(d)->stream>>>(out, bias, OC, total);
        CU_LAUNCHED(d, "add_bias");
    }
}

static void cu_matmul_bwd(kern_device *d, float *dinp, float *dw, float *dbias,
                          const float *dout, const float *inp, const float *w, int N, int C,
                          int OC)
{
    CU_LIVE(d);
    PROF(d, KP_MM_BWD);
    if (N <= 0)
        return;
    /* bf16: both products read the same dense [N, OC] copy of dout, made
     * once (the output layer's is m T Vp elements) */
    const void *dout16 = IM(d)->bf16 ? to_bf16(d, 0, dout, N, OC, OC) : NULL;
    if (IM(d)->bf16 && dout16 == NULL)
        return;
    if (dinp != NULL) /* dinp[N,C] += dout[N,OC] w[OC,C] */
        lin_gemm(d, false, false, N, C, OC, dout, OC, w, C, 1.0f, dinp, C, NULL, dout16);
    /* dw[OC,C] += dout^T inp */
    lin_gemm(d, true, false, OC, C, N, dout, OC, inp, C, 1.0f, dw, C, NULL, dout16);
    if (IM(d)->err_code != 0)
        return;
    if (dbias != NULL)
        colsum_launch(d, NULL, dbias, dout, NULL, NULL, NULL, N, OC);
}

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
static void cu_attention_fwd(kern_device *d, float *out, float *lse, float *scratch,
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

static void cu_attention_bwd(kern_device *d, float *dqkv, float *scratch, const float *dout,
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

/* -------------------------------------------------------------- pointwise */

#define GELU_S 0.7978845608028654f

__device__ __forceinline__ float fast_tanh(float u)
{
    return 1.0f - __fdiv_rn(2.0f, exp_poly(2.0f * u) + 1.0f);
}

__global__ void k_gelu_fwd(float *out, const float *inp, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + fast_tanh(GELU_S * (x + 0.044715f * x * x * x)));
    }
}

__global__ void k_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = inp[i];
        float th = fast_tanh(GELU_S * (x + 0.044715f * x * x * x));
        float sech2 = 1.0f - th * th;
        float xc = fminf(fmaxf(x, -20.0f), 20.0f);
        float dg = 0.5f * (1.0f + th) +
                   0.5f * xc * sech2 * GELU_S * (1.0f + 3.0f * 0.044715f * xc * xc);
        dinp[i] += dg * dout[i];
    }
}

__global__ void k_add(float *out, const float *a, const float *b, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

static void cu_gelu_fwd(kern_device *d, float *out, const float *inp, size_t n)
{
    CU_LIVE(d);
    PROF(d, KP_GELU_FWD);
    k_gelu_fwd<<<grid_for(n, 256), 256, 0, IM(d)->stream>>>(out, inp, n);
    CU_LAUNCHED(d, "gelu_fwd");
}

static void cu_gelu_bwd(kern_device *d, float *dinp, const float *inp, const float *dout,
                        size_t n)
{
    CU_LIVE(d);
    PROF(d, KP_GELU_BWD);
    k_gelu_bwd<<<grid_for(n, 256), 256, 0, IM(d)->stream>>>(dinp, inp, dout, n);
    CU_LAUNCHED(d, "gelu_bwd");
}

static void cu_add(kern_device *d, float *out, const float *a, const float *b, size_t n)
{
    CU_LIVE(d);
    PROF(d, KP_ADD);
    k_add<<<grid_for(n, 256), 256, 0, IM(d)->stream>>>(out, a, b, n);
    CU_LAUNCHED(d, "add");
}

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

static void cu_xent(kern_device *d, float *logits, float *losses, double *loss_sum,
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

/* ------------------------------------------------------------- optimizer */

__global__ void k_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr,
                        float beta1, float beta2, float eps, float wd, float scale, float ic1,
                        float ic2)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float gi = g[i] * scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float mh = mi * ic1, vh = vi * ic2;
        p[i] -= lr * (__fdiv_rn(mh, __fsqrt_rn(vh) + eps) + wd * p[i]);
    }
}

static void cu_adamw(kern_device *d, float *p, const float *g, float *m, float *v, size_t n,
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

static double cu_sumsq(kern_device *d, const float *x, size_t n)
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

/* ------------------------------------------------------------ open/close */

static void cu_teardown(kern_device *d)
{
    cu_impl *im = IM(d);
    if (im != NULL) {
        (void)cudaSetDevice(im->ordinal);
        if (im->stream != NULL)
            (void)cudaStreamSynchronize(im->stream);
        for (int i = 0; i < im->prof_cap; i++) {
            if (im->prof[i].a != NULL)
                (void)cudaEventDestroy(im->prof[i].a);
            if (im->prof[i].b != NULL)
                (void)cudaEventDestroy(im->prof[i].b);
        }
        free(im->prof);
        for (int i = 0; i < im->nblocks; i++)
            (void)cudaFree(im->blocks[i].ptr);
        free(im->blocks);
        if (im->scratch != NULL)
            (void)cudaFree(im->scratch);
        if (im->lt_ws != NULL)
            (void)cudaFree(im->lt_ws);
        if (im->lt != NULL)
            (void)cublasLtDestroy(im->lt);
        if (im->blas != NULL)
            (void)cublasDestroy(im->blas);
        if (im->stream != NULL)
            (void)cudaStreamDestroy(im->stream);
        free(im);
    }
    free(d);
}

static void cu_close(kern_device *d)
{
    cu_teardown(d);
}

/* kern_ops.set_precision: bf16 linear layers (kern_cuda_set_bf16) */
static int cu_set_precision(kern_device *d, int bf16, acc_err *err)
{
    return kern_cuda_set_bf16(d, bf16, err);
}

static void cu_mem_info(kern_device *d, kern_mem_info *out)
{
    out->reserved = kern_cuda_reserved(d);
    out->free_bytes = kern_cuda_free_bytes(d);
}

static int cu_workspace_reserve(kern_device *d, const kern_workspace *w, acc_err *err)
{
    if (w->a_bytes > SIZE_MAX || w->b_bytes > SIZE_MAX)
        return acc_err_set(err, ACC_EOOM, "", "device %s: workspace of %llu + %llu bytes",
                           d->info.name, (unsigned long long)w->a_bytes,
                           (unsigned long long)w->b_bytes);
    return kern_cuda_bf16_reserve(d, (size_t)w->a_bytes, (size_t)w->b_bytes, err);
}

static const kern_ops cuda_ops = {
    /* .backend = */ "cuda",
    /* .alloc = */ cu_alloc,
    /* .free = */ cu_free,
    /* .zero = */ cu_zero,
    /* .copy = */ cu_copy,
    /* .upload = */ cu_upload,
    /* .download = */ cu_download,
    /* .encoder_fwd = */ cu_encoder_fwd,
    /* .encoder_bwd = */ cu_encoder_bwd,
    /* .layernorm_fwd = */ cu_layernorm_fwd,
    /* .layernorm_bwd = */ cu_layernorm_bwd,
    /* .matmul_fwd = */ cu_matmul_fwd,
    /* .matmul_bwd = */ cu_matmul_bwd,
    /* .attention_fwd = */ cu_attention_fwd,
    /* .attention_bwd = */ cu_attention_bwd,
    /* .gelu_fwd = */ cu_gelu_fwd,
    /* .gelu_bwd = */ cu_gelu_bwd,
    /* .add = */ cu_add,
    /* .xent = */ cu_xent,
    /* .adamw = */ cu_adamw,
    /* .sumsq = */ cu_sumsq,
    /* .close = */ cu_close,
    /* .last_error = */ kern_cuda_last_error,
    /* .mem_info = */ cu_mem_info,
    /* .workspace_size = */ kern_cuda_workspace_size,
    /* .workspace_reserve = */ cu_workspace_reserve,
    /* .set_precision = */ cu_set_precision,
    /* the LLaMA family's ops: kern_cuda_llama.cu */
    /* .embed_fwd = */ kern_cuda_embed_fwd,
    /* .embed_bwd = */ kern_cuda_embed_bwd,
    /* .rmsnorm_fwd = */ kern_cuda_rmsnorm_fwd,
    /* .rmsnorm_bwd = */ kern_cuda_rmsnorm_bwd,
    /* .rope_fwd = */ kern_cuda_rope_fwd,
    /* .rope_bwd = */ kern_cuda_rope_bwd,
    /* .swiglu_fwd = */ kern_cuda_swiglu_fwd,
    /* .swiglu_bwd = */ kern_cuda_swiglu_bwd,
    /* .gqa_attention_fwd = */ kern_cuda_gqa_attention_fwd,
    /* .gqa_attention_bwd = */ kern_cuda_gqa_attention_bwd,
};

/* the op files' hooks into the device state (kern_cuda_llama.h) */
extern "C" bool kern_cuda_enter(kern_device *d)
{
    return cu_enter(d);
}

extern "C" bool kern_cuda_check(kern_device *d, cudaError_t e, const char *what,
                                const char *file, int line)
{
    return cu_ok_rt(d, e == cudaErrorNotReady ? cudaSuccess : e, what, file, line);
}

static int open_fail(kern_device *d, acc_err *err)
{
    int rc = acc_err_set(err, ACC_EDEVICE, "devices", "%s", IM(d)->err_msg);
    cu_teardown(d);
    return rc;
}

extern "C" int kern_cuda_open(const kern_device_info *info, int threads, kern_device **out,
                              acc_err *err)
{
    *out = NULL;
    if (info->kind != KERN_DEV_CUDA)
        return acc_err_set(err, ACC_EINVAL, "devices", "device %s is not a CUDA device",
                           info->name);
    kern_device *d = (kern_device *)calloc(1, sizeof *d);
    cu_impl *im = (cu_impl *)calloc(1, sizeof *im);
    if (d == NULL || im == NULL) {
        free(d);
        free(im);
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory opening %s", info->name);
    }
    d->ops = &cuda_ops;
    d->info = *info;
    d->threads = threads > 0 ? threads : 1;
    d->impl = im;
    im->ordinal = info->index;
    if (!CU_OK(d, cudaSetDevice(info->index)))
        return open_fail(d, err);
    size_t fr = 0, tot = 0;
    if (!CU_OK(d, cudaStreamCreateWithFlags(&im->stream, cudaStreamNonBlocking)) ||
        !BL_OK(d, cublasCreate(&im->blas)) || !BL_OK(d, cublasSetStream(im->blas, im->stream)) ||
        !BL_OK(d, cublasSetMathMode(im->blas, CUBLAS_DEFAULT_MATH)) ||
        !CU_OK(d, cudaMalloc((void **)&im->scratch, 2 * sizeof(double))) ||
        !CU_OK(d, cudaMemGetInfo(&fr, &tot)))
        return open_fail(d, err);
    const char *fl = getenv("ACCUMD_CUDA_FLASH"); /* experimental: kern_cuda_flash.h */
    im->flash = fl != NULL && strcmp(fl, "1") == 0;
    const char *nolt = getenv("ACCUMD_CUDA_NO_LT"); /* debugging: cublasSgemm only */
    if (nolt == NULL || strcmp(nolt, "1") != 0) {
        if (!BL_OK(d, cublasLtCreate(&im->lt)) ||
            !CU_OK(d, cudaMalloc(&im->lt_ws, LT_WORKSPACE)) ||
            !CU_OK(d, cudaMemGetInfo(&fr, &tot)))
            return open_fail(d, err);
    }
    uint64_t avail = fr > CU_MARGIN ? (uint64_t)(fr - CU_MARGIN) : 0;
    d->budget = info->mem_total != 0 && info->mem_total < avail ? info->mem_total : avail;
    if (d->budget == 0)
        d->budget = 1; /* 0 would mean unlimited */
    *out = d;
    return 0;
}

extern "C" int kern_cuda_last_error(kern_device *d, acc_err *err)
{
    cu_impl *im = IM(d);
    if (im->err_code == 0)
        return 0;
    return acc_err_set(err, im->err_code, "devices", "%s", im->err_msg);
}

extern "C" int kern_cuda_sync(kern_device *d, acc_err *err)
{
    if (IM(d)->err_code == 0)
        CU_OK(d, cudaStreamSynchronize(IM(d)->stream));
    return kern_cuda_last_error(d, err);
}

extern "C" void *kern_cuda_stream(kern_device *d)
{
    return (void *)IM(d)->stream;
}

extern "C" int kern_cuda_set_tf32(kern_device *d, int on, acc_err *err)
{
    if (IM(d)->err_code == 0 &&
        BL_OK(d, cublasSetMathMode(IM(d)->blas,
                                   on ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH)))
        IM(d)->tf32 = on != 0;
    return kern_cuda_last_error(d, err);
}

extern "C" int kern_cuda_set_bf16(kern_device *d, int on, acc_err *err)
{
    cu_impl *im = IM(d);
    if (!on && cu_enter(d)) { /* give the operand copies back */
        cu_free(d, im->bf_a);
        cu_free(d, im->bf_b);
        im->bf_a = im->bf_b = NULL;
        im->bf_a_bytes = im->bf_b_bytes = 0;
    }
    im->bf16 = on != 0;
    return kern_cuda_last_error(d, err);
}

extern "C" unsigned long long kern_cuda_reserved(kern_device *d)
{
    return IM(d)->reserved;
}

extern "C" unsigned long long kern_cuda_free_bytes(kern_device *d)
{
    size_t free_b = 0, total = 0;
    if (!cu_enter(d) || !CU_OK(d, cudaMemGetInfo(&free_b, &total)))
        return 0;
    return free_b;
}

extern "C" int kern_cuda_bf16_reserve(kern_device *d, size_t a_bytes, size_t b_bytes,
                                      acc_err *err)
{
    cu_impl *im = IM(d);
    if (!cu_enter(d))
        return kern_cuda_last_error(d, err);
    /* both go back first, so that a smaller size never waits on a larger */
    cu_free(d, im->bf_a);
    cu_free(d, im->bf_b);
    im->bf_a = im->bf_b = NULL;
    im->bf_a_bytes = im->bf_b_bytes = 0;
    if (!im->bf16)
        return kern_cuda_last_error(d, err);
    int rc = 0;
    if (a_bytes > 0 && (rc = cu_alloc(d, a_bytes, &im->bf_a, err)) == 0)
        im->bf_a_bytes = a_bytes;
    if (rc == 0 && b_bytes > 0 && (rc = cu_alloc(d, b_bytes, &im->bf_b, err)) == 0)
        im->bf_b_bytes = b_bytes;
    if (rc != 0) { /* not sticky: the caller adapts (ACC_EOOM) or fails */
        cu_free(d, im->bf_a);
        im->bf_a = NULL;
        im->bf_a_bytes = 0;
        return rc;
    }
    return kern_cuda_last_error(d, err);
}

extern "C" int kern_cuda_set_profile(kern_device *d, int on, acc_err *err)
{
    IM(d)->prof_on = on != 0;
    IM(d)->prof_n = 0;
    return kern_cuda_last_error(d, err);
}

extern "C" int kern_cuda_profile_read(kern_device *d, double *ms, int *calls, const char **names,
                                      acc_err *err)
{
    cu_impl *im = IM(d);
    for (int k = 0; k < KP_N; k++) {
        ms[k] = 0.0;
        calls[k] = 0;
        names[k] = kp_name[k];
    }
    if (!cu_enter(d) || !CU_OK(d, cudaStreamSynchronize(im->stream))) {
        kern_cuda_last_error(d, err);
        return -1;
    }
    for (int i = 0; i < im->prof_n; i++) {
        float t = 0.0f;
        if (cudaEventElapsedTime(&t, im->prof[i].a, im->prof[i].b) == cudaSuccess) {
            ms[im->prof[i].op] += t;
            calls[im->prof[i].op]++;
        } else {
            (void)cudaGetLastError();
        }
    }
    im->prof_n = 0;
    return KP_N;
}

extern "C" int kern_cuda_set_flash(kern_device *d, int on, acc_err *err)
{
    IM(d)->flash = on != 0;
    return kern_cuda_last_error(d, err);
}
