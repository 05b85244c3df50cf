/* kern_cuda_lean: the CUDA backend's attention for lean activations, the
 * "cuda" table's attention_lean_fwd / _bwd (semantics: kern_device.h, the
 * CPU's kern_cpu_lean.c the reference; notes in kern_cuda_lean.cu).
 * Included by .cu files only. */
#ifndef ACC_KERN_CUDA_LEAN_H
#define ACC_KERN_CUDA_LEAN_H

typedef struct kern_device kern_device;
struct kern_att_opts;

extern "C" {
void kern_cuda_attention_lean_fwd(kern_device *d, float *out, float *lse, float *scratch,
                                  const float *q, const float *k, const float *v, int ldq,
                                  int ldkv, const int *pos, const struct kern_att_opts *opts,
                                  int B, int T, int NH, int NKV, int hs);
void kern_cuda_attention_lean_bwd(kern_device *d, float *dq, float *dk, float *dv,
                                  float *scratch, const float *dout, const float *q,
                                  const float *k, const float *v, const float *lse,
                                  const float *out, int ldq, int ldkv, const int *pos,
                                  const struct kern_att_opts *opts, int B, int T, int NH,
                                  int NKV, int hs);
}

#endif
