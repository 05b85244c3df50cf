/* kern_cpu_llama: the CPU backend's LLaMA-family ops, the end of the "cpu"
 * kern_ops table (semantics: kern_device.h; notes: kern_cpu_llama.c). */
#ifndef ACC_KERN_CPU_LLAMA_H
#define ACC_KERN_CPU_LLAMA_H

#include "kern_device.h"

void kern_cpu_embed_fwd(kern_device *d, float *out, const int *tok, const float *wte, int N,
                        int C);
void kern_cpu_embed_bwd(kern_device *d, float *dwte, const float *dout, const int *tok, int N,
                        int C);
void kern_cpu_rmsnorm_fwd(kern_device *d, float *out, float *rstd, const float *inp,
                          const float *w, float eps, int N, int C);
void kern_cpu_rmsnorm_bwd(kern_device *d, float *dinp, float *dw, const float *dout,
                          const float *inp, const float *w, const float *rstd, int N, int C);
void kern_cpu_rope_fwd(kern_device *d, float *out, const float *inp, const float *cos_t,
                       const float *sin_t, const int *pos, int B, int T, int H, int hs);
void kern_cpu_rope_bwd(kern_device *d, float *dinp, const float *dout, const float *cos_t,
                       const float *sin_t, const int *pos, int B, int T, int H, int hs);
void kern_cpu_swiglu_fwd(kern_device *d, float *out, const float *gate, const float *up,
                         size_t n);
void kern_cpu_swiglu_bwd(kern_device *d, float *dgate, float *dup, const float *dout,
                         const float *gate, const float *up, size_t n);
void kern_cpu_gqa_attention_fwd(kern_device *d, float *out, float *lse, float *scratch,
                                const float *q, const float *k, const float *v, int B, int T,
                                int NH, int NKV, int hs);
void kern_cpu_gqa_attention_bwd(kern_device *d, float *dq, float *dk, float *dv,
                                float *scratch, const float *dout, const float *q,
                                const float *k, const float *v, const float *lse,
                                const float *out, int B, int T, int NH, int NKV, int hs);

/* packed sequences: keys of the query's own document only (kern_device.h) */
void kern_cpu_gqa_attention_pos_fwd(kern_device *d, float *out, float *lse, float *scratch,
                                    const float *q, const float *k, const float *v,
                                    const int *pos, int B, int T, int NH, int NKV, int hs);
void kern_cpu_gqa_attention_pos_bwd(kern_device *d, float *dq, float *dk, float *dv,
                                    float *scratch, const float *dout, const float *q,
                                    const float *k, const float *v, const float *lse,
                                    const float *out, const int *pos, int B, int T, int NH,
                                    int NKV, int hs);

/* Qwen3 / Gemma 2 (kern_device.h): RMSNorm with an offset on the weight,
 * attention with options */
void kern_cpu_rmsnorm_ofs_fwd(kern_device *d, float *out, float *rstd, const float *inp,
                              const float *w, float offset, float eps, int N, int C);
void kern_cpu_rmsnorm_ofs_bwd(kern_device *d, float *dinp, float *dw, const float *dout,
                              const float *inp, const float *w, float offset,
                              const float *rstd, int N, int C);
void kern_cpu_gqa_attention_opt_fwd(kern_device *d, float *out, float *lse, float *scratch,
                                    const float *q, const float *k, const float *v,
                                    const int *pos, const kern_att_opts *opts, int B, int T,
                                    int NH, int NKV, int hs);
void kern_cpu_gqa_attention_opt_bwd(kern_device *d, float *dq, float *dk, float *dv,
                                    float *scratch, const float *dout, const float *q,
                                    const float *k, const float *v, const float *lse,
                                    const float *out, const int *pos,
                                    const kern_att_opts *opts, int B, int T, int NH, int NKV,
                                    int hs);

/* generation: attention against a key/value cache */
void kern_cpu_attention_cache_fwd(kern_device *d, float *out, float *scratch, const float *q,
                                  int ldq, const float *kc, const float *vc,
                                  const kern_att_opts *opts, int p0, int n, int NH, int NKV,
                                  int hs);

#endif
