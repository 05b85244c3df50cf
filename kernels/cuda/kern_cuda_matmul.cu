/* kern_cuda_matmul: the linear layers: cuBLASLt / cuBLAS products, bias epilogue, bf16 operands, for the CUDA backend (kern_cuda_impl.cuh). */
#include "kern_cuda_impl.cuh"

/* ---------------------------------------------------------------- matmul */

/* Row-major C[M,N] = op(A)[M,K] op(B)[K,N] (alpha 1), batched with strides:
 * cuBLAS is column-major, so compute C^T = op(B)^T op(A)^T by swapping. */
void rm_gemm(kern_device *d, bool ta, bool tb, int M, int N, int K, const float *A,
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

void cu_matmul_fwd(kern_device *d, float *out, const float *inp, const float *w,
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

void cu_matmul_bwd(kern_device *d, float *dinp, float *dw, float *dbias,
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
    if (dw != NULL) /* dw[OC,C] += dout^T inp (NULL: a frozen weight) */
        lin_gemm(d, true, false, OC, C, N, dout, OC, inp, C, 1.0f, dw, C, NULL, dout16);
    if (IM(d)->err_code != 0)
        return;
    if (dbias != NULL)
        colsum_launch(d, NULL, dbias, dout, NULL, NULL, NULL, N, OC);
}
