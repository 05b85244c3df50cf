/* kern_cuda_impl: what the CUDA backend's translation units share (private
 * to kernels/cuda/): the device state (cu_impl), the sticky-error checks,
 * the per-op profile scope, the warp/block reductions and exp polynomial
 * that must match the CPU, and the ops each file defines for the table in
 * kern_cuda.cu. One file per op family (each read and changed alone):
 *   kern_cuda.cu            memory (caching allocator), open/close, the
 *                           kern_ops table, the kern_cuda.h API
 *   kern_cuda_embed.cu      token + position embeddings
 *   kern_cuda_norm.cu       LayerNorm, column reductions
 *   kern_cuda_matmul.cu     cuBLASLt / cuBLAS products, bf16 operands
 *   kern_cuda_attention.cu  causal attention (the flash path: kern_cuda_flash.cu)
 *   kern_cuda_pointwise.cu  GELU, add
 *   kern_cuda_loss.cu       fused softmax + cross-entropy
 *   kern_cuda_optim.cu      AdamW, sum of squares
 *   kern_cuda_llama.cu      the decoder families' ops (RMSNorm, RoPE, SwiGLU, GQA)
 * The contract of the whole backend is kern_cuda.h; see kern_cuda.cu's
 * header for the design.
 */
#ifndef ACC_KERN_CUDA_IMPL_CUH
#define ACC_KERN_CUDA_IMPL_CUH

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

#define CU_MARGIN KERN_CUDA_MARGIN /* left free on the GPU: context, cuBLAS, NCCL (kern_cuda.h) */
#define CU_SMALL KERN_CUDA_SMALL   /* blocks below this round to 512 B, others to 2 MiB */

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

static inline cu_impl *IM(kern_device *d) { return (cu_impl *)d->impl; }

static inline void cu_sticky_code(kern_device *d, int code, const char *what, const char *why,
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

static inline void cu_sticky(kern_device *d, const char *what, const char *why, const char *file,
                      int line)
{
    cu_sticky_code(d, ACC_EDEVICE, what, why, file, line);
}

static inline bool cu_ok_rt(kern_device *d, cudaError_t rc, const char *what, const char *file,
                     int line)
{
    if (rc == cudaSuccess)
        return true;
    cu_sticky(d, what, cudaGetErrorString(rc), file, line);
    return false;
}

static inline bool cu_ok_blas(kern_device *d, cublasStatus_t rc, const char *what, const char *file,
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
static inline cudaError_t launch_error(void)
{
    cudaError_t e = cudaGetLastError();
    return e == cudaErrorNotReady ? cudaSuccess : e;
}
#define CU_LAUNCHED(d, name) cu_ok_rt((d), launch_error(), "launch of " name, __FILE__, __LINE__)
/* Ops may come from a thread whose current device is another GPU (a test
 * or a benchmark driving several devices): make this one current. false
 * once the device has a sticky error. */
static inline bool cu_enter(kern_device *d)
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
    KP_SUMSQ, KP_N
};
static const char *const kp_name[KP_N] = {
    "zero", "copy", "upload", "encoder_fwd", "encoder_bwd", "layernorm_fwd", "layernorm_bwd",
    "matmul_fwd", "matmul_bwd", "attention_fwd", "attention_bwd", "gelu_fwd", "gelu_bwd", "add",
    "xent", "adamw", "sumsq"};

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

static inline unsigned grid_for(size_t n, unsigned threads)
{
    size_t g = (n + threads - 1) / threads;
    if (g > 65535u * 16u)
        g = 65535u * 16u;
    return g == 0 ? 1u : (unsigned)g;
}

/* ------------------------------------------------------------ reductions */

static __device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

static __device__ __forceinline__ double warp_sum_d(double v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* block-wide reductions; blockDim.x a multiple of 32, at most 1024;
 * every thread gets the result; sh: 32 elements of shared memory */
static __device__ float block_sum(float v, float *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0)
        sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0f;
    return warp_sum(v);
}

static __device__ float block_max(float v, float *sh)
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

static __device__ double block_sum_d(double v, double *sh)
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
static __device__ __forceinline__ float exp_poly(float x)
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

/* ---- the ops, one family per file (see above) */

int cu_alloc(kern_device *d, size_t bytes, void **out, acc_err *err);
void cu_free(kern_device *d, void *p);
void cu_zero(kern_device *d, void *p, size_t bytes);
void cu_copy(kern_device *d, void *dst, const void *src, size_t bytes);
void cu_upload(kern_device *d, void *dst, const void *host, size_t bytes);
void cu_download(kern_device *d, void *host, const void *src, size_t bytes);
void cu_encoder_fwd(kern_device *d, float *out, const int *tok, const float *wte,
                           const float *wpe, int B, int T, int C);
void cu_encoder_bwd(kern_device *d, float *dwte, float *dwpe, const float *dout,
                           const int *tok, int B, int T, int C);
void colsum_launch(kern_device *d, float *acc1, float *acc2, const float *g,
                          const float *x, const float *mean, const float *rstd, int N, int C);
void cu_layernorm_fwd(kern_device *d, float *out, float *mean, float *rstd,
                             const float *inp, const float *w, const float *b, int N, int C);
void cu_layernorm_bwd(kern_device *d, float *dinp, float *dw, float *db,
                             const float *dout, const float *inp, const float *w,
                             const float *mean, const float *rstd, int N, int C);
void rm_gemm(kern_device *d, bool ta, bool tb, int M, int N, int K, const float *A,
                    int lda, long long sA, const float *B, int ldb, long long sB, float beta,
                    float *C, int ldc, long long sC, int batch);
void cu_matmul_fwd(kern_device *d, float *out, const float *inp, const float *w,
                          const float *bias, int N, int C, int OC);
void cu_matmul_bwd(kern_device *d, float *dinp, float *dw, float *dbias,
                          const float *dout, const float *inp, const float *w, int N, int C,
                          int OC);
void cu_attention_fwd(kern_device *d, float *out, float *lse, float *scratch,
                             const float *qkv, int B, int T, int C, int NH);
void cu_attention_bwd(kern_device *d, float *dqkv, float *scratch, const float *dout,
                             const float *qkv, const float *lse, const float *out, int B, int T,
                             int C, int NH);
void cu_gelu_fwd(kern_device *d, float *out, const float *inp, size_t n);
void cu_gelu_bwd(kern_device *d, float *dinp, const float *inp, const float *dout,
                        size_t n);
void cu_add(kern_device *d, float *out, const float *a, const float *b, size_t n);
void cu_scale(kern_device *d, float *x, float s, size_t n);
void cu_geglu_fwd(kern_device *d, float *out, const float *gate, const float *up, size_t n);
void cu_geglu_bwd(kern_device *d, float *dgate, float *dup, const float *dout,
                  const float *gate, const float *up, size_t n);
void cu_softcap_fwd(kern_device *d, float *out, const float *inp, float cap, size_t n);
void cu_softcap_bwd(kern_device *d, float *dinp, const float *dout, const float *inp,
                    float cap, size_t n);
void cu_widen16(kern_device *d, float *out, const uint16_t *in, size_t n, int f16);
void cu_narrow_bf16(kern_device *d, uint16_t *out, const float *in, size_t n);
void cu_dequant_nf4(kern_device *d, float *out, const kern_nf4 *q, size_t n);
void cu_xent(kern_device *d, float *logits, float *losses, double *loss_sum,
                    const int *targets, const float *weights, int N, int V, int Vp,
                    int want_grad);
void cu_adamw(kern_device *d, float *p, const float *g, float *m, float *v, size_t n,
                     float lr, float beta1, float beta2, float eps, float weight_decay,
                     float grad_scale, int t);
double cu_sumsq(kern_device *d, const float *x, size_t n);

#endif
