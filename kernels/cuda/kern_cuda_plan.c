/* kern_cuda_plan: the CUDA backend's pure planning queries, in plain C so
 * that every build -- with CUDA or without -- predicts a CUDA device's
 * bytes the same way (kern_cuda.h). */
#include "kern_cuda.h"

uint64_t kern_cuda_alloc_size(uint64_t bytes)
{
    uint64_t step = bytes < KERN_CUDA_SMALL ? 512 : 2ull << 20;
    if (bytes == 0)
        bytes = 1;
    if (bytes > UINT64_MAX - (step - 1))
        return UINT64_MAX;
    return (bytes + step - 1) / step * step;
}

uint64_t kern_cuda_runtime_bytes(void) { return KERN_CUDA_MARGIN; }

const kern_ops kern_cuda_plan_ops = {
    .backend = "cuda",
    .alloc_size = kern_cuda_alloc_size,
    .runtime_bytes = kern_cuda_runtime_bytes,
};
