/* kern_cuda: the CUDA backend of kern_device (fp32). Contract: kern_cuda.h.
 *
 * One CUDA stream, one cuBLAS and one cuBLASLt handle per device; every op
 * is queued on that stream in call order. The linear layers' products go
 * through cublasLtMatmul (fp32 compute, bias epilogue, algorithm chosen per
 * shape and operand alignment and cached; cublasSgemm when cuBLASLt offers
 * none; in bf16 mode, kern_cuda_set_bf16, the same fp32 operands with
 * CUBLAS_COMPUTE_32F_FAST_16BF: rounded to bf16 by the library, fp32
 * accumulation, no copies). The four products of attention are cublasSgemmStridedBatched over
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
#include "kern_cuda_impl.cuh"
#include "kern_cuda_lean.h"
#include "kern_cuda_llama.h"

/* ---------------------------------------------------------------- memory */

/* the planner's formula (kern_cuda_plan.c), so both round alike */
static size_t cu_round(size_t bytes)
{
    uint64_t r = kern_cuda_alloc_size(bytes);
    return r > SIZE_MAX ? SIZE_MAX : (size_t)r;
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

int cu_alloc(kern_device *d, size_t bytes, void **out, acc_err *err)
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

void cu_free(kern_device *d, void *p)
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

void cu_zero(kern_device *d, void *p, size_t bytes)
{
    CU_LIVE(d);
    PROF(d, KP_ZERO);
    CU_OK(d, cudaMemsetAsync(p, 0, bytes, IM(d)->stream));
}

void cu_copy(kern_device *d, void *dst, const void *src, size_t bytes)
{
    CU_LIVE(d);
    PROF(d, KP_COPY);
    CU_OK(d, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, IM(d)->stream));
}

void cu_upload(kern_device *d, void *dst, const void *host, size_t bytes)
{
    CU_LIVE(d);
    PROF(d, KP_UPLOAD);
    if (CU_OK(d, cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, IM(d)->stream)))
        CU_OK(d, cudaStreamSynchronize(IM(d)->stream));
}

void cu_download(kern_device *d, void *host, const void *src, size_t bytes)
{
    CU_LIVE(d);
    if (CU_OK(d, cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, IM(d)->stream)))
        CU_OK(d, cudaStreamSynchronize(IM(d)->stream));
}

/* Page-locks host memory for the optimizer offload's copies (kern_device.h). */
static int cu_host_register(kern_device *d, void *p, size_t bytes, acc_err *err)
{
    if (bytes == 0)
        return 0;
    cudaError_t e = cudaSetDevice(IM(d)->ordinal);
    if (e == cudaSuccess)
        e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
    if (e != cudaSuccess)
        return acc_err_set(err, ACC_EDEVICE, "devices", "cudaHostRegister of %zu bytes on %s: %s", bytes,
                           d->info.name, cudaGetErrorString(e));
    return 0;
}

static void cu_host_unregister(kern_device *d, void *p)
{
    if (p != NULL && cudaSetDevice(IM(d)->ordinal) == cudaSuccess)
        (void)cudaHostUnregister(p);
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
    /* .gqa_attention_pos_fwd = */ kern_cuda_gqa_attention_pos_fwd,
    /* .gqa_attention_pos_bwd = */ kern_cuda_gqa_attention_pos_bwd,
    /* .scale = */ cu_scale,
    /* .alloc_size = */ kern_cuda_alloc_size,
    /* .runtime_bytes = */ kern_cuda_runtime_bytes,
    /* .widen16 = */ cu_widen16,
    /* Qwen3's and Gemma 2's: kern_cuda_pointwise.cu, kern_cuda_llama.cu */
    /* .softcap_fwd = */ cu_softcap_fwd,
    /* .softcap_bwd = */ cu_softcap_bwd,
    /* .geglu_fwd = */ cu_geglu_fwd,
    /* .geglu_bwd = */ cu_geglu_bwd,
    /* .rmsnorm_ofs_fwd = */ kern_cuda_rmsnorm_ofs_fwd,
    /* .rmsnorm_ofs_bwd = */ kern_cuda_rmsnorm_ofs_bwd,
    /* .gqa_attention_opt_fwd = */ kern_cuda_gqa_attention_opt_fwd,
    /* .gqa_attention_opt_bwd = */ kern_cuda_gqa_attention_opt_bwd,
    /* lean activations: kern_cuda_lean.cu */
    /* .attention_lean_fwd = */ kern_cuda_attention_lean_fwd,
    /* .attention_lean_bwd = */ kern_cuda_attention_lean_bwd,
    /* .dequant_nf4 = */ cu_dequant_nf4,
    /* generation: kern_cuda_llama.cu */
    /* .attention_cache_fwd = */ kern_cuda_attention_cache_fwd,
    /* bf16 activation storage: kern_cuda_pointwise.cu */
    /* .narrow_bf16 = */ cu_narrow_bf16,
    /* host memory: the optimizer offload's pinned buffers */
    /* .host_register = */ cu_host_register,
    /* .host_unregister = */ cu_host_unregister,
};

/* the op files' hooks into the device state (kern_cuda_llama.h) */
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
    IM(d)->bf16 = on != 0;
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
