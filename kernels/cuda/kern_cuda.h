/* kern_cuda: the CUDA backend of kern_device (fp32; bf16 linear layers and
 * TF32 as options).
 *
 * kern_cuda_open() opens GPU `info->index` for the calling thread and fills
 * the "cuda" kern_ops table: every op of kern_device.h with the CPU
 * backend's semantics (same shapes, backwards accumulate into gradients,
 * padded-vocabulary masking in xent, AdamW with decoupled decay, sumsq in
 * double). All work runs on one CUDA stream per device, in order; upload,
 * download, xent (its loss sum) and sumsq return only when their result is
 * on the host, so host buffers may be reused at once.
 *
 * Memory: a caching allocator over cudaMalloc. d->in_use / d->peak count
 * the bytes asked (as on CPU); the budget is info->mem_total (when non-zero)
 * capped by the free memory at open minus a margin. Over budget, or a
 * cudaMalloc that fails even after the cache was released, is ACC_EOOM with
 * a message naming the bytes asked, the bytes in use and the bytes free.
 *
 * Errors: most ops return void, so the first CUDA/cuBLAS failure is kept as
 * a sticky error in the device (later ops become no-ops) and is read with
 * kern_cuda_last_error(): 0 when all went well, else its ACC_EDEVICE code
 * with the call, file and line in err. Callers check it once per step.
 */
#ifndef ACC_KERN_CUDA_H
#define ACC_KERN_CUDA_H

#include "err.h"
#include "kern_device.h"
#include "kern_discover.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kern_device kern_device;

int kern_cuda_open(const kern_device_info *info, int threads, kern_device **out, acc_err *err);

/* 0, or the first CUDA/cuBLAS error of this device (sticky) in *err. */
int kern_cuda_last_error(kern_device *d, acc_err *err);

/* Wait for all work queued on the device. 0 or the sticky error. */
int kern_cuda_sync(kern_device *d, acc_err *err);

/* The device's cudaStream_t (as void *), for the NCCL communicator. */
void *kern_cuda_stream(kern_device *d);

/* Let fp32 matrix products use TF32 tensor cores (off by default: the fp32
 * path must match the CPU backend to 1e-5). For benchmarks. */
int kern_cuda_set_tf32(kern_device *d, int on, acc_err *err);

/* bf16 compute for the linear layers (matmul_fwd / matmul_bwd): operands
 * rounded to bf16, products accumulated in fp32 into the fp32 outputs and
 * gradients; weights, optimizer state and every other kernel stay fp32.
 * The products read the fp32 operands in place with
 * CUBLAS_COMPUTE_32F_FAST_16BF (cuBLASLt, else cublasGemmEx): cuBLAS
 * rounds them to bf16 for the tensor cores, so bf16 mode allocates
 * nothing and a bf16 job never holds more device memory than in fp32. The
 * start-up self-test checks that rounding against the CPU reference
 * (docs/cuda.md). Off by default. It is the device's ops->set_precision,
 * which a job's "precision": "bf16" calls. */
int kern_cuda_set_bf16(kern_device *d, int on, acc_err *err);

/* Bytes held by the caching allocator (in use + cached), for /v1/devices. */
unsigned long long kern_cuda_reserved(kern_device *d);
/* EXPERIMENTAL (not yet run on a GPU): in bf16 mode, attention through the
 * tiled tensor-core kernels of kern_cuda_flash.h (head size 64) instead of
 * cuBLAS on one sequence's T x T scores. Off by default; also on at open
 * with ACCUMD_CUDA_FLASH=1 in the environment. */
int kern_cuda_set_flash(kern_device *d, int on, acc_err *err);

/* Per-op GPU time, for benchmarks: on = 1 records a pair of CUDA events
 * around every op on the device's stream (off: nothing is recorded). */
#define KERN_CUDA_PROF_OPS 17
int kern_cuda_set_profile(kern_device *d, int on, acc_err *err);
/* Waits for the stream, then fills ms[k], calls[k], names[k] (static
 * strings) for the KERN_CUDA_PROF_OPS ops over what was recorded since the
 * last read (or set_profile), and forgets it. Returns KERN_CUDA_PROF_OPS,
 * or -1 with err. */
int kern_cuda_profile_read(kern_device *d, double *ms, int *calls, const char **names,
                           acc_err *err);
#define KERN_CUDA_MARGIN (512ull << 20) /* left free on the GPU at open */
#define KERN_CUDA_SMALL (1ull << 20)    /* blocks below round to 512 B, others to 2 MiB */

/* The caching allocator's block size for an allocation of `bytes`
 * (kern_cuda.cu cu_alloc takes its blocks this size): 512-byte steps
 * below CU_SMALL (1 MiB), 2 MiB steps from there; 0 asks for 1 byte.
 * Saturated at UINT64_MAX. Plain C (kern_cuda_plan.c), in every build. */
uint64_t kern_cuda_alloc_size(uint64_t bytes);
/* Device memory a CUDA device holds outside its accounting: the margin
 * the budget leaves free at open (CU_MARGIN, 512 MiB: the CUDA context,
 * cuBLAS / cuBLASLt handles and the 32 MiB cuBLASLt workspace, the
 * 16-byte scratch, NCCL's buffers). */
uint64_t kern_cuda_runtime_bytes(void);
/* A table holding only backend "cuda" and the planning queries
 * (alloc_size, runtime_bytes), for planning without a
 * GPU (kern_backend_ops). */
extern const kern_ops kern_cuda_plan_ops;

/* Free bytes on the whole GPU now (cudaMemGetInfo: other processes' use
 * included); 0 with a sticky error if the query fails. */
unsigned long long kern_cuda_free_bytes(kern_device *d);

#ifdef __cplusplus
}
#endif

#endif
