/* kern_cuda_matmul: the linear layers: cuBLASLt / cuBLAS products, bias epilogue, bf16 mode, for the CUDA backend (kern_cuda_impl.cuh). */
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
 * given) through cublasLtMatmul on fp32 operands: fp32 compute (TF32 when
 * allowed), or in bf16 mode CUBLAS_COMPUTE_32F_FAST_16BF (the library
 * rounds each operand to bf16 for the tensor-core products and accumulates
 * in fp32, so no bf16 copy is ever made). Same column-major swap as
 * rm_gemm. Returns 1 done, 0 no cuBLASLt algorithm (the caller uses
 * cuBLAS), -1 failed (sticky error set). */
static int lt_gemm(kern_device *d, bool ta, bool tb, int M, int N, int K, const float *A, int lda,
                   const float *B, int ldb, float beta, float *C, int ldc, const float *bias)
{
    cu_impl *im = IM(d);
    if (im->err_code != 0) /* an earlier product of the same op failed */
        return -1;
    if (im->lt == NULL)
        return 0;
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasComputeType_t ct = im->bf16   ? CUBLAS_COMPUTE_32F_FAST_16BF
                             : im->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                        : CUBLAS_COMPUTE_32F;
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
    /* the compute type is part of the algorithm: bf16 and tf32 key it */
    key.tf32 = im->tf32, key.beta1 = beta != 0.0f, key.bf16 = im->bf16;
    key.lda = lda, key.ldb = ldb, key.ldc = ldc;
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
    LT_OK(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, tb ? K : N, tb ? N : K, ldb));
    LT_OK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, ta ? M : K, ta ? K : M, lda));
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

/* A product of the linear layers: cuBLASLt, else cuBLAS. fp32 mode:
 * cublasSgemm. bf16 mode: cublasGemmEx on the same fp32 operands with
 * CUBLAS_COMPUTE_32F_FAST_16BF, the rounding and accumulation lt_gemm
 * asks for, so either path computes the same function. Returns whether
 * cuBLASLt did it (with the bias, if given). */
static bool lin_gemm(kern_device *d, bool ta, bool tb, int M, int N, int K, const float *A,
                     int lda, const float *B, int ldb, float beta, float *C, int ldc,
                     const float *bias)
{
    cu_impl *im = IM(d);
    int r = lt_gemm(d, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, bias);
    if (r != 0)
        return r == 1;
    if (!im->bf16) {
        rm_gemm(d, ta, tb, M, N, K, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
        return false;
    }
    const float one = 1.0f;
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    BL_OK(d, cublasGemmEx(im->blas, ob, oa, N, M, K, &one, B, CUDA_R_32F, ldb, A, CUDA_R_32F, lda,
                          &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F_FAST_16BF,
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
    bool fused = lin_gemm(d, false, true, N, OC, C, inp, C, w, C, 0.0f, out, OC, ep);
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
    if (dinp != NULL) /* dinp[N,C] += dout[N,OC] w[OC,C] */
        lin_gemm(d, false, false, N, C, OC, dout, OC, w, C, 1.0f, dinp, C, NULL);
    if (dw != NULL) /* dw[OC,C] += dout^T inp (NULL: a frozen weight) */
        lin_gemm(d, true, false, OC, C, N, dout, OC, inp, C, 1.0f, dw, C, NULL);
    if (IM(d)->err_code != 0)
        return;
    if (dbias != NULL)
        colsum_launch(d, NULL, dbias, dout, NULL, NULL, NULL, N, OC);
}
