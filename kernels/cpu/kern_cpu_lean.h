/* kern_cpu_lean: the CPU backend's tiled attention for lean activations,
 * the "cpu" table's attention_lean_fwd / _bwd (semantics: kern_device.h;
 * notes: kern_cpu_lean.c). */
#ifndef ACC_KERN_CPU_LEAN_H
#define ACC_KERN_CPU_LEAN_H

#include "kern_device.h"

void kern_cpu_attention_lean_fwd(kern_device *d, float *out, float *lse, float *scratch,
                                 const float *q, const float *k, const float *v, int ldq,
                                 int ldkv, const int *pos, const kern_att_opts *opts, int B,
                                 int T, int NH, int NKV, int hs);
void kern_cpu_attention_lean_bwd(kern_device *d, float *dq, float *dk, float *dv,
                                 float *scratch, const float *dout, const float *q,
                                 const float *k, const float *v, const float *lse,
                                 const float *out, int ldq, int ldkv, const int *pos,
                                 const kern_att_opts *opts, int B, int T, int NH, int NKV,
                                 int hs);

#endif
