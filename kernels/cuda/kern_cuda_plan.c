/* kern_cuda_plan: the CUDA backend's pure planning queries, in plain C so
 * that every build -- with CUDA or without -- predicts a CUDA device's
 * bytes the same way (kern_cuda.h). */
#include "kern_cuda.h"

#include "checked.h"

void kern_cuda_workspace_size(const kern_gemm_extent *e, int bf16, kern_workspace *out)
{
    /* lin_gemm's bf16 copies: one buffer per operand side, grown to the
     * largest operand of that side and kept */
    out->a_bytes = bf16 ? acc_sat_mul_u64(2, e->a_elems) : 0;
    out->b_bytes = bf16 ? acc_sat_mul_u64(2, e->b_elems) : 0;
}

const kern_ops kern_cuda_plan_ops = {
    .backend = "cuda",
    .workspace_size = kern_cuda_workspace_size,
};
