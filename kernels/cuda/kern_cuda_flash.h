/* kern_cuda_flash: causal attention in tiles on bf16 tensor cores, never
 * writing a T x T matrix to memory (EXPERIMENTAL, opt-in).
 *
 * The device interface's attention contract (kern_device.h): out[B,T,C] and
 * lse[B,NH,T] from qkv[B,T,3C] forward; dqkv += ... backward from dout, qkv,
 * lse and out. q, k, v, the probabilities and dout are rounded to bf16 for
 * the products (WMMA 16x16x16, fp32 accumulation); the softmax, lse, its
 * rescaling and every accumulator stay fp32. So it computes the bf16 mode's
 * attention, within bf16's tolerance of the CPU's fp32 attention.
 *
 * Forward: one block of 4 warps per (sequence, head, 64 queries); each warp
 * owns 16 query rows and runs the online softmax over the 64-key tiles at
 * or before its diagonal. Backward (the FlashAttention-2 order): one block
 * per (sequence, head, 64 keys); it loops over the query tiles at or after
 * its diagonal, rebuilds the probabilities from lse, accumulates dK and dV
 * for its keys in registers and adds its share of dQ with atomicAdd (so dQ
 * is not bitwise reproducible). D = rowsum(dout * out) is computed per query
 * tile from out.
 *
 * Only head size 64 (GPT-2's); kern_cuda_flash_supported() says whether a
 * shape can use it. Both calls queue on `stream` and return the launch
 * status (cudaSuccess or the error); nothing is allocated.
 */
#ifndef ACC_KERN_CUDA_FLASH_H
#define ACC_KERN_CUDA_FLASH_H

#include <cuda_runtime.h>

int kern_cuda_flash_supported(int C, int NH);

cudaError_t kern_cuda_flash_fwd(cudaStream_t stream, float *out, float *lse, const float *qkv,
                                int B, int T, int C, int NH);

cudaError_t kern_cuda_flash_bwd(cudaStream_t stream, float *dqkv, const float *dout,
                                const float *qkv, const float *lse, const float *out, int B,
                                int T, int C, int NH);

#endif
