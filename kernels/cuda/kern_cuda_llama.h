/* kern_cuda_llama: the CUDA backend's LLaMA-family ops, the end of the
 * "cuda" kern_ops table (semantics: kern_device.h, with the CPU backend
 * kernels/cpu/kern_cpu_llama.c as the reference; notes in
 * kern_cuda_llama.cu). Every op queues on the device's stream; a launch
 * failure becomes the device's sticky error (kern_cuda.h).
 * The device state (the sticky error, the current device, the stream) is
 * kern_cuda_impl.cuh's, as for the other op files. Included by .cu files
 * only.
 */
#ifndef ACC_KERN_CUDA_LLAMA_H
#define ACC_KERN_CUDA_LLAMA_H

#include <cuda_runtime.h>
#include <stddef.h>

typedef struct kern_device kern_device;

extern "C" {
void kern_cuda_embed_fwd(kern_device *d, float *out, const int *tok, const float *wte, int N,
                         int C);
void kern_cuda_embed_bwd(kern_device *d, float *dwte, const float *dout, const int *tok, int N,
                         int C);
void kern_cuda_rmsnorm_fwd(kern_device *d, float *out, float *rstd, const float *inp,
                           const float *w, float eps, int N, int C);
void kern_cuda_rmsnorm_bwd(kern_device *d, float *dinp, float *dw, const float *dout,
                           const float *inp, const float *w, const float *rstd, int N, int C);
void kern_cuda_rope_fwd(kern_device *d, float *out, const float *inp, const float *cos_t,
                        const float *sin_t, const int *pos, int B, int T, int H, int hs);
void kern_cuda_rope_bwd(kern_device *d, float *dinp, const float *dout, const float *cos_t,
                        const float *sin_t, const int *pos, int B, int T, int H, int hs);
void kern_cuda_swiglu_fwd(kern_device *d, float *out, const float *gate, const float *up,
                          size_t n);
void kern_cuda_swiglu_bwd(kern_device *d, float *dgate, float *dup, const float *dout,
                          const float *gate, const float *up, size_t n);
void kern_cuda_gqa_attention_fwd(kern_device *d, float *out, float *lse, float *scratch,
                                 const float *q, const float *k, const float *v, int B, int T,
                                 int NH, int NKV, int hs);
void kern_cuda_gqa_attention_bwd(kern_device *d, float *dq, float *dk, float *dv,
                                 float *scratch, const float *dout, const float *q,
                                 const float *k, const float *v, const float *lse,
                                 const float *out, int B, int T, int NH, int NKV, int hs);
/* packed sequences: keys of the query's own document only (kern_device.h) */
void kern_cuda_gqa_attention_pos_fwd(kern_device *d, float *out, float *lse, float *scratch,
                                     const float *q, const float *k, const float *v,
                                     const int *pos, int B, int T, int NH, int NKV, int hs);
void kern_cuda_gqa_attention_pos_bwd(kern_device *d, float *dq, float *dk, float *dv,
                                     float *scratch, const float *dout, const float *q,
                                     const float *k, const float *v, const float *lse,
                                     const float *out, const int *pos, int B, int T, int NH,
                                     int NKV, int hs);
/* Qwen3 / Gemma 2 (kern_device.h): RMSNorm with an offset on the weight,
 * attention with options */
void kern_cuda_rmsnorm_ofs_fwd(kern_device *d, float *out, float *rstd, const float *inp,
                               const float *w, float offset, float eps, int N, int C);
void kern_cuda_rmsnorm_ofs_bwd(kern_device *d, float *dinp, float *dw, const float *dout,
                               const float *inp, const float *w, float offset,
                               const float *rstd, int N, int C);
void kern_cuda_gqa_attention_opt_fwd(kern_device *d, float *out, float *lse, float *scratch,
                                     const float *q, const float *k, const float *v,
                                     const int *pos, const struct kern_att_opts *opts, int B,
                                     int T, int NH, int NKV, int hs);
void kern_cuda_gqa_attention_opt_bwd(kern_device *d, float *dq, float *dk, float *dv,
                                     float *scratch, const float *dout, const float *q,
                                     const float *k, const float *v, const float *lse,
                                     const float *out, const int *pos,
                                     const struct kern_att_opts *opts, int B, int T, int NH,
                                     int NKV, int hs);
/* generation: attention against a key/value cache */
void kern_cuda_attention_cache_fwd(kern_device *d, float *out, float *scratch, const float *q,
                                   int ldq, const float *kc, const float *vc,
                                   const struct kern_att_opts *opts, int p0, int n, int NH,
                                   int NKV, int hs);
}

#endif
