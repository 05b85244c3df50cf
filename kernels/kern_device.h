/* kern_device: what the training engine needs from one device.
 *
 * A device is opened for one rank of one job and used by that rank's thread
 * only. It owns a memory budget: every allocation goes through ops->alloc,
 * which counts bytes in use and the peak since the last reset, and fails
 * with ACC_EOOM (never aborts) when the budget would be exceeded, exactly as
 * a failed cudaMalloc is reported by the CUDA backend. Pointers returned by
 * alloc are device pointers: the host reaches them only through upload /
 * download (on CPU devices they happen to be host memory).
 *
 * The kernels are the GPT-2 building blocks, then the LLaMA family's
 * (RMSNorm, RoPE, SwiGLU, grouped-query attention), then Qwen3's and
 * Gemma 2's (soft-capping, the tanh-GELU gate, RMSNorm with an offset,
 * attention with a scale / cap / window): the end of kern_ops, optional
 * per backend. Shapes: N rows (tokens, B*T),
 * C channels, OC output channels, NH heads, V real vocabulary, Vp padded
 * vocabulary. Every backward ACCUMULATES into its weight gradients (+=), so
 * micro-steps sum in place; activation gradients are accumulated as noted.
 * A backend fills a kern_ops table; the trainer never knows which backend
 * it runs on.
 */
#ifndef ACC_KERN_DEVICE_H
#define ACC_KERN_DEVICE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "err.h"
#include "kern_discover.h"

typedef struct kern_device kern_device;

/* What kern_device_mem_info reports (see there). */
typedef struct kern_mem_info {
    uint64_t reserved, free_bytes;
} kern_mem_info;

/* Attention options (gqa_attention_opt_fwd / _bwd). Zero means "off" in
 * each field: scale 0 is 1 / sqrt(hs) (Gemma 2 passes
 * query_pre_attn_scalar^-1/2), softcap 0 leaves the scores uncapped (Gemma
 * 2: attn_logit_softcapping), window 0 is no window (Gemma 2's sliding
 * layers: sliding_window keys, the query's own included). */
typedef struct kern_att_opts {
    float scale;
    float softcap;
    int window;
} kern_att_opts;

/* One NF4 weight for dequant_nf4 (core/model/nf4.h
 * states the format): device pointers to its packed codes (n values, two
 * a byte, the even index in the high nibble), its 16-value map, and its
 * per-block (64 values) absmax: fp32 `absmax`, or with double quantization
 * (absmax NULL) `qabsmax` codes on the 256-value `nested_map`, an fp32
 * `nested_absmax` per 256 codes, and the fp32 `offset` (a host value). */
typedef struct kern_nf4 {
    const uint8_t *codes;
    const float *map;
    const float *absmax;
    const uint8_t *qabsmax;
    const float *nested_absmax;
    const float *nested_map;
    float offset;
} kern_nf4;

typedef struct kern_ops {
    const char *backend; /* "cpu", "cuda" */

    /* memory: accounted against the device budget */
    int (*alloc)(kern_device *d, size_t bytes, void **out, acc_err *err);
    void (*free)(kern_device *d, void *p);
    void (*zero)(kern_device *d, void *p, size_t bytes);
    void (*copy)(kern_device *d, void *dst, const void *src, size_t bytes);
    void (*upload)(kern_device *d, void *dst, const void *host, size_t bytes);
    void (*download)(kern_device *d, void *host, const void *src, size_t bytes);

    /* out[b,t,:] = wte[tok[b,t],:] + wpe[t,:] */
    void (*encoder_fwd)(kern_device *d, float *out, const int *tok, const float *wte,
                        const float *wpe, int B, int T, int C);
    /* dwte[tok] += dout, dwpe[t] += dout */
    void (*encoder_bwd)(kern_device *d, float *dwte, float *dwpe, const float *dout,
                        const int *tok, int B, int T, int C);

    /* out = (inp - mean) * rstd * w + b, per row; keeps mean and rstd */
    void (*layernorm_fwd)(kern_device *d, float *out, float *mean, float *rstd,
                          const float *inp, const float *w, const float *b, int N, int C);
    /* dinp += ..., dw += ..., db += ...; dw and db both NULL: a frozen
     * norm (LoRA), only dinp */
    void (*layernorm_bwd)(kern_device *d, float *dinp, float *dw, float *db, const float *dout,
                          const float *inp, const float *w, const float *mean,
                          const float *rstd, int N, int C);

    /* out[N,OC] = inp[N,C] * w[OC,C]^T + bias[OC] (bias may be NULL) */
    void (*matmul_fwd)(kern_device *d, float *out, const float *inp, const float *w,
                       const float *bias, int N, int C, int OC);
    /* dinp += dout*w, dw += dout^T*inp, dbias += colsum(dout) (dinp, dw and dbias
     * may be NULL: dw NULL for a frozen weight, LoRA) */
    void (*matmul_bwd)(kern_device *d, float *dinp, float *dw, float *dbias, const float *dout,
                       const float *inp, const float *w, int N, int C, int OC);

    /* Causal multi-head attention, without keeping the T x T probabilities:
     * qkv[B,T,3C] holds q,k,v; out[B,T,C]; lse[B,NH,T] keeps each row's
     * log-sum-exp of its scaled scores (s_u = q.k_u / sqrt(hs), u <= t), all
     * the backward needs to rebuild the probabilities p_u = exp(s_u - lse).
     * scratch: KERN_ATT_SCRATCH(T, NH) floats, one sequence's worth (all
     * heads), any contents before and after. */
    void (*attention_fwd)(kern_device *d, float *out, float *lse, float *scratch,
                          const float *qkv, int B, int T, int C, int NH);
    /* dqkv += ...; the probabilities are recomputed from qkv and lse (one
     * more q k^T per sequence); same scratch. out is the forward's output
     * (a tiled backward needs rowsum(dout * out); others may ignore it). */
    void (*attention_bwd)(kern_device *d, float *dqkv, float *scratch, const float *dout,
                          const float *qkv, const float *lse, const float *out, int B, int T,
                          int C, int NH);

    /* GELU, tanh approximation (GPT-2's) */
    void (*gelu_fwd)(kern_device *d, float *out, const float *inp, size_t n);
    /* dinp += gelu'(inp) * dout */
    void (*gelu_bwd)(kern_device *d, float *dinp, const float *inp, const float *dout, size_t n);

    /* out = a + b (the residual stream) */
    void (*add)(kern_device *d, float *out, const float *a, const float *b, size_t n);

    /* Fused softmax + cross-entropy over the first V of Vp logits per row
     * (padded columns get no probability). losses[n] = -log p[target] for
     * every row; *loss_sum = sum_n weight[n] * losses[n] (double). When
     * want_grad, logits is overwritten with d(loss_sum)/d(logits) =
     * weight[n] * (p - onehot(target)), zero in padded columns. */
    void (*xent)(kern_device *d, float *logits, float *losses, double *loss_sum,
                 const int *targets, const float *weights, int N, int V, int Vp,
                 int want_grad);

    /* AdamW, decoupled decay: g' = g*grad_scale; m,v moments; t >= 1 */
    void (*adamw)(kern_device *d, float *p, const float *g, float *m, float *v, size_t n,
                  float lr, float beta1, float beta2, float eps, float weight_decay,
                  float grad_scale, int t);
    /* sum of squares, accumulated in double */
    double (*sumsq)(kern_device *d, const float *x, size_t n);

    void (*close)(kern_device *d);

    /* The first failure of an asynchronous device (a kernel launch, a copy)
     * since open: 0, or its code with the message in err. Kernels return
     * void, so the trainer asks once a step. CPU devices never fail here. */
    int (*last_error)(kern_device *d, acc_err *err);

    /* What the device holds beyond the accounting (kern_device_mem_info).
     * NULL: reserved = in use, free = the budget left. */
    void (*mem_info)(kern_device *d, kern_mem_info *out);
    /* Precision of the linear layers: bf16 = 0 (the default after open) is
     * fp32 throughout; bf16 = 1 makes matmul_fwd and matmul_bwd round BOTH
     * operands of each of their products to bf16 (kern_bf16_round:
     * round-to-nearest-even, NaN stays NaN, Inf stays Inf) and accumulate
     * the products in fp32 into the fp32 outputs / gradients (the bias add
     * and dbias stay fp32; gradients still accumulate +=). Weights,
     * gradients, optimizer state, activations and every other kernel
     * stay fp32, so bf16 = 1 is the same function on every backend and the
     * CPU is the reference -- except attention's internal products, fp32 on
     * the CPU, which the CUDA backend runs on TF32 tensor cores in bf16 mode
     * (finer than bf16; within the bf16 tolerance of the GPU tests). The
     * CUDA backend's operand rounding is cuBLAS's own down-conversion
     * (CUBLAS_COMPUTE_32F_FAST_16BF), which the start-up self-test checks
     * against the CPU's kern_bf16_round within that tolerance.
     * Called once after open, before any kernel (tests may switch it again
     * between kernels). 0, or an error (ACC_ENOMEM / ACC_EDEVICE) in err.
     * Memory: bf16 mode takes no device memory, so no kernel needs more
     * device bytes in bf16 than in fp32. The CPU backend rounds operand
     * panels into a fixed-size host scratch (KERN_CPU_BF16_SCRATCH,
     * kern_cpu.h, bytes per kernel thread) allocated here and freed at
     * close, outside the device budget; the CUDA backend makes no copies:
     * cuBLAS reads the fp32 operands in place and rounds them on the way
     * to the tensor cores (kern_cuda.h, docs/cuda.md). */
    int (*set_precision)(kern_device *d, int bf16, acc_err *err);

    /* ---- The LLaMA family's ops (kernels/cpu/kern_cpu_llama.c,
     * kernels/cuda/kern_cuda_llama.cu). Optional for a backend: NULL means
     * it lacks them, and kern_llama_ops_check() turns that into an error
     * for the caller (the self-test skips them on such a device). fp32
     * always: bf16 mode (set_precision) changes only matmul_fwd/bwd.
     * Shapes: N rows (B*T tokens), C channels, NH query heads, NKV key/value
     * heads (NH a multiple of NKV; NKV == NH is plain multi-head attention),
     * hs head size (even), I the MLP's intermediate size. */

    /* out[n,:] = wte[tok[n],:] (a token embedding without positions) */
    void (*embed_fwd)(kern_device *d, float *out, const int *tok, const float *wte, int N,
                      int C);
    /* dwte[tok[n],:] += dout[n,:] */
    void (*embed_bwd)(kern_device *d, float *dwte, const float *dout, const int *tok, int N,
                      int C);

    /* RMSNorm per row: rstd[n] = 1 / sqrt(mean_c(inp[n,c]^2) + eps) (kept
     * for the backward), out[n,c] = inp[n,c] * rstd[n] * w[c]. out may not
     * alias inp. */
    void (*rmsnorm_fwd)(kern_device *d, float *out, float *rstd, const float *inp,
                        const float *w, float eps, int N, int C);
    /* dinp += ..., dw += ... (from the forward's inp and rstd); dw may be
     * NULL (a frozen weight) */
    void (*rmsnorm_bwd)(kern_device *d, float *dinp, float *dw, const float *dout,
                        const float *inp, const float *w, const float *rstd, int N, int C);

    /* Rotary position embedding, Hugging Face's rotate-half layout: in each
     * head of x[B,T,H,hs] the pairs are (i, i + hs/2), i < hs/2, rotated by
     * the angle p * inv_freq[i] of the token's position p:
     *   out[i]        = x[i] cos - x[i + hs/2] sin
     *   out[i + hs/2] = x[i + hs/2] cos + x[i] sin
     * cos_t, sin_t: [P, hs/2] device tables, row p = position p
     * (kern_rope_table in kern_rope.h builds them on the host). pos: [B*T]
     * device ints, the position of token (b,t) (packed sequences restart
     * them), each in [0, P); NULL means p = t. Call once for q (H = NH) and
     * once for k (H = NKV). out may be inp (in place). */
    void (*rope_fwd)(kern_device *d, float *out, const float *inp, const float *cos_t,
                     const float *sin_t, const int *pos, int B, int T, int H, int hs);
    /* The transpose (rotation by -angle): dinp = R^T dout, OVERWRITTEN, not
     * accumulated (RoPE has no weights; the model runs it in place on the
     * attention's dq / dk before the projections' backward). dinp may be
     * dout (in place). */
    void (*rope_bwd)(kern_device *d, float *dinp, const float *dout, const float *cos_t,
                     const float *sin_t, const int *pos, int B, int T, int H, int hs);

    /* SwiGLU's gate: out[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + e^-x);
     * gate, up, out: [N, I], n = N * I elements. out may be gate or up. */
    void (*swiglu_fwd)(kern_device *d, float *out, const float *gate, const float *up,
                       size_t n);
    /* dgate += dout * up * silu'(gate), dup += dout * silu(gate) */
    void (*swiglu_bwd)(kern_device *d, float *dgate, float *dup, const float *dout,
                       const float *gate, const float *up, size_t n);

    /* Grouped-query causal attention, without keeping the T x T
     * probabilities. Separate buffers (the LLaMA projections are separate):
     * q[B,T,NH,hs], k and v [B,T,NKV,hs], out[B,T,NH,hs]; query head h
     * attends with key/value head h / (NH / NKV). Scores s_u = q.k_u /
     * sqrt(hs), u <= t (causal within the B sequences; packed documents
     * inside one sequence see each other, as in Hugging Face without a
     * document mask). lse[B,NH,T] keeps each row's log-sum-exp for the
     * backward. scratch: KERN_ATT_SCRATCH(T, NH) floats (one sequence, all
     * query heads), any contents before and after. */
    void (*gqa_attention_fwd)(kern_device *d, float *out, float *lse, float *scratch,
                              const float *q, const float *k, const float *v, int B, int T,
                              int NH, int NKV, int hs);
    /* dq += ..., dk += ..., dv += ... (dk, dv summed over the group's query
     * heads); probabilities rebuilt from q, k and lse; same scratch. out is
     * the forward's output (a tiled backward needs rowsum(dout * out)). */
    void (*gqa_attention_bwd)(kern_device *d, float *dq, float *dk, float *dv, float *scratch,
                              const float *dout, const float *q, const float *k,
                              const float *v, const float *lse, const float *out, int B,
                              int T, int NH, int NKV, int hs);

    /* Packed sequences (data.packing): the same two ops with the tokens'
     * positions pos [B*T] (device ints, as rope_fwd takes them), each
     * document's restarting at 0 and rising by one: query t of sequence b
     * attends to keys u in [t - pos[b*T+t], t] only, its own document, so
     * no attention crosses from one document into another. pos NULL is
     * gqa_attention_fwd / _bwd exactly. */
    void (*gqa_attention_pos_fwd)(kern_device *d, float *out, float *lse, float *scratch,
                                  const float *q, const float *k, const float *v,
                                  const int *pos, int B, int T, int NH, int NKV, int hs);
    void (*gqa_attention_pos_bwd)(kern_device *d, float *dq, float *dk, float *dv,
                                  float *scratch, const float *dout, const float *q,
                                  const float *k, const float *v, const float *lse,
                                  const float *out, const int *pos, int B, int T, int NH,
                                  int NKV, int hs);

    /* x[i] *= s (LoRA's alpha / r on the adapter path) */
    void (*scale)(kern_device *d, float *x, float s, size_t n);

    /* Planning extras (pure, callable without a device through
     * kern_backend_ops): what one allocation of `bytes` really takes from
     * the device (the backend allocator's rounding; NULL: exactly
     * `bytes`), and the device memory the backend holds outside the
     * accounting (context, library workspaces, collectives' buffers;
     * NULL: none). The planner adds both to a row's device bytes. */
    uint64_t (*alloc_size)(uint64_t bytes);
    uint64_t (*runtime_bytes)(void);
    /* out[i] = in[i] widened exactly to fp32: bf16 (f16 = 0) or IEEE
     * binary16 (f16 = 1) bit patterns. The LoRA base kept in the dtype it
     * was loaded in (model.h) is fetched through it one tensor at a time
     * (kern_bf16_to_f32 / kern_f16_to_f32 are the reference). */
    void (*widen16)(kern_device *d, float *out, const uint16_t *in, size_t n, int f16);

    /* ---- Qwen3's and Gemma 2's ops (kernels/cpu/kern_cpu_llama.c,
     * kernels/cuda/kern_cuda_llama.cu), optional like the LLaMA family's:
     * kern_decoder_ops_check() names the first one missing. fp32 always.
     * Qwen3's per-head q/k RMSNorm needs no op of its own: it is
     * rmsnorm_fwd / rmsnorm_bwd over the N * H rows of hs channels of
     * q[N,H,hs] (k[N,NKV,hs]) with the [hs] weight, rstd [N * H]. */

    /* Soft-capping (Gemma 2's final logits): out[i] = cap * tanh(inp[i] /
     * cap), cap > 0. out may be inp. */
    void (*softcap_fwd)(kern_device *d, float *out, const float *inp, float cap, size_t n);
    /* dinp[i] = dout[i] * (1 - tanh(inp[i] / cap)^2), from the forward's
     * INPUT, OVERWRITTEN, not accumulated (no weights; the model runs it in
     * place on the logits' gradient). dinp may be dout. */
    void (*softcap_bwd)(kern_device *d, float *dinp, const float *dout, const float *inp,
                        float cap, size_t n);

    /* The tanh-GELU gate (Gemma's gelu_pytorch_tanh): out[i] = gelu(gate[i]) *
     * up[i], gelu(x) = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) as
     * gelu_fwd computes it. out may be gate or up. */
    void (*geglu_fwd)(kern_device *d, float *out, const float *gate, const float *up,
                      size_t n);
    /* dgate += dout * up * gelu'(gate), dup += dout * gelu(gate) */
    void (*geglu_bwd)(kern_device *d, float *dgate, float *dup, const float *dout,
                      const float *gate, const float *up, size_t n);

    /* RMSNorm with an offset on the weight (Gemma's x * (1 + w): offset 1):
     * out = inp * rstd * (w + offset); offset 0 is rmsnorm_fwd exactly.
     * Same rstd, aliasing rule and shapes as rmsnorm_fwd. */
    void (*rmsnorm_ofs_fwd)(kern_device *d, float *out, float *rstd, const float *inp,
                            const float *w, float offset, float eps, int N, int C);
    /* dinp += ..., dw += sum_n dout * inp * rstd (d/dw of w + offset is 1);
     * dw may be NULL */
    void (*rmsnorm_ofs_bwd)(kern_device *d, float *dinp, float *dw, const float *dout,
                            const float *inp, const float *w, float offset,
                            const float *rstd, int N, int C);

    /* gqa_attention_pos_fwd / _bwd with the options of kern_att_opts
     * (below): a query scale, soft-capped scores, a sliding window. The
     * score of query t and key u is s = q.k_u * scale, then cap * tanh(s /
     * cap) when softcap > 0; query t sees keys u <= t of its document (pos)
     * with t - u < window when window > 0. lse keeps the log-sum-exp of
     * those (capped) scores. opts NULL, or {0, 0, 0}, is
     * gqa_attention_pos_fwd / _bwd exactly (bit for bit on the CPU). */
    void (*gqa_attention_opt_fwd)(kern_device *d, float *out, float *lse, float *scratch,
                                  const float *q, const float *k, const float *v,
                                  const int *pos, const kern_att_opts *opts, int B,
                                  int T, int NH, int NKV, int hs);
    void (*gqa_attention_opt_bwd)(kern_device *d, float *dq, float *dk, float *dv,
                                  float *scratch, const float *dout, const float *q,
                                  const float *k, const float *v, const float *lse,
                                  const float *out, const int *pos,
                                  const kern_att_opts *opts, int B, int T, int NH,
                                  int NKV, int hs);

    /* ---- Lean activations (issue 20): attention without a T x T buffer,
     * used when the model's lean_acts is on (model.h). The function of
     * gqa_attention_opt_fwd / _bwd (opts NULL: the plain one; pos NULL: one
     * document per sequence), on strided views so both layouts share it:
     * row (b,t) of query head h is q[(b*T+t)*ldq + h*hs ..], of key/value
     * head h/(NH/NKV) k, v[(b*T+t)*ldkv + ..]; dq has q's strides, dk and dv
     * k's; out and dout are [B,T,NH,hs]. GPT-2's qkv[B,T,3C] is q = qkv,
     * k = qkv + C, v = qkv + 2C, ldq = ldkv = 3C, NKV = NH. scratch:
     * KERN_ATT_LEAN_SCRATCH(T, NH) floats, any contents before and after. The
     * forward is an online softmax over key tiles keeping lse; the backward
     * rebuilds the probabilities tile by tile from lse and uses out for
     * rowsum(dout * out). Optional: NULL where a backend lacks them (the
     * model then refuses lean activations, naming the backend). */
    void (*attention_lean_fwd)(kern_device *d, float *out, float *lse, float *scratch,
                               const float *q, const float *k, const float *v, int ldq,
                               int ldkv, const int *pos, const kern_att_opts *opts, int B,
                               int T, int NH, int NKV, int hs);
    void (*attention_lean_bwd)(kern_device *d, float *dq, float *dk, float *dv, float *scratch,
                               const float *dout, const float *q, const float *k,
                               const float *v, const float *lse, const float *out, int ldq,
                               int ldkv, const int *pos, const kern_att_opts *opts, int B,
                               int T, int NH, int NKV, int hs);
    /* out[i] = map[code i] * absmax of block i / 64, the
     * absmax itself nested_map[qabsmax] * nested_absmax[block / 256] +
     * offset under double quantization: each product and sum one fp32
     * operation, rounded to nearest (no fused multiply-add), so every
     * backend gives the same bits as nf4_dequantize. The QLoRA base is
     * fetched through it one tensor at a time (model.h's weight store). */
    void (*dequant_nf4)(kern_device *d, float *out, const kern_nf4 *q, size_t n);
    /* ---- Generation (core/model/generate.h; kernels/cpu/kern_cpu_llama.c).
     * Optional: NULL means the backend cannot generate with a key/value
     * cache (gen_ctx_new names the op). fp32.
     * Attention of n new queries against a cache: q [n, NH*hs] with rows ldq
     * floats apart (GPT-2's fused qkv: 3 C), kc and vc [P, NKV*hs] holding
     * positions 0 .. p0+n-1 (the new tokens' keys and values already at rows
     * p0 .. p0+n-1). Query i, at position p0+i, sees keys u <= p0+i (and
     * p0+i-u < window when opts->window > 0) with gqa_attention_opt_fwd's
     * scores (opts NULL: plain). out [n, NH*hs] (rows NH*hs apart). scratch:
     * KERN_ATT_CACHE_SCRATCH(n, p0 + n, NH) floats. No lse (no backward). */
    void (*attention_cache_fwd)(kern_device *d, float *out, float *scratch, const float *q,
                                int ldq, const float *kc, const float *vc,
                                const kern_att_opts *opts, int p0, int n, int NH, int NKV,
                                int hs);
    /* out[i] = in[i] narrowed to bf16, rounded to nearest, ties to even:
     * the upper half of kern_bf16_round(in[i]) (NaN stays a quiet NaN,
     * past bf16's largest: +-Inf, subnormals kept). The inverse of widen16
     * (f16 = 0) on bf16 values, so narrow then widen is kern_bf16_round.
     * bf16 activation storage (model_config.act_bf16, blocks.h) keeps a
     * block's activations through it between the forward and the backward;
     * the key/value cache of a 16-bit model is stored through it
     * (generate.h). */
    void (*narrow_bf16)(kern_device *d, uint16_t *out, const float *in, size_t n);
    /* ---- Host memory (the optimizer offload, core/train/adamw.c). OPTIONAL
     * (NULL: nothing to do, as on CPU devices): page-lock the `bytes` of
     * host memory at `p` so that upload / download from and to it run at
     * the bus's speed (CUDA: cudaHostRegister); 0, or ACC_EDEVICE with the
     * runtime's message (nothing registered then). host_unregister undoes
     * a successful host_register of the same `p`. */
    int (*host_register)(kern_device *d, void *p, size_t bytes, acc_err *err);
    void (*host_unregister)(kern_device *d, void *p);
} kern_ops;

struct kern_device {
    const kern_ops *ops;
    kern_device_info info;
    uint64_t budget;   /* bytes this device may allocate */
    uint64_t in_use;   /* bytes allocated now */
    uint64_t peak;     /* most bytes in use since open or the last reset */
    int threads;       /* kernel threads (CPU) */
    void *impl;        /* backend state */
};

/* Open the device described by `info` (its mem_total is the budget) for the
 * calling thread, with `threads` kernel threads on CPU devices. */
int kern_device_open(const kern_device_info *info, int threads, kern_device **out,
                     acc_err *err);
void kern_device_close(kern_device *d);

/* Peak := in use (call between phases to measure one of them). */
void kern_device_reset_peak(kern_device *d);

/* What the device holds beyond the accounting, for /v1/devices:
 * `reserved` = bytes taken from the device's memory (CUDA: the caching
 * allocator's blocks, in use + cached; CPU: in use), `free_bytes` = bytes
 * still free on the device (CUDA: cudaMemGetInfo, other processes' use
 * included; CPU: the budget left). Cheap enough for once a step; call from
 * the device's own thread. */
void kern_device_mem_info(kern_device *d, kern_mem_info *out);

/* The planning extras of a table (kern_ops.alloc_size / runtime_bytes):
 * `bytes` itself and 0 where the table leaves them NULL (or ops is NULL). */
uint64_t kern_alloc_size(const kern_ops *ops, uint64_t bytes);
uint64_t kern_runtime_bytes(const kern_ops *ops);

/* A backend's ops table without opening a device, for pure queries
 * (alloc_size, runtime_bytes): CPU devices get the CPU table; CUDA devices get the
 * CUDA backend's planning table (kernels/cuda/kern_cuda_plan.c, plain C, in
 * every build, so a build without CUDA plans for CUDA devices the same
 * way), whose kernels are NULL. NULL for an unknown kind. */
const kern_ops *kern_backend_ops(kern_dev_kind kind);

/* Floats of attention scratch: two T x T matrices per head of one sequence
 * (scores / probabilities and their gradient). Independent of B: the
 * sequences go one after another, the heads side by side. */
#define KERN_ATT_SCRATCH(T, NH) (2 * (size_t)(NH) * (size_t)(T) * (size_t)(T))

/* The lean attention's tiles (attention_lean_fwd / _bwd): bq = min(T, BQ)
 * queries x bk = min(T, BK) keys; its scratch is, per query head (the
 * backend runs at most NH threads), one pair of tiles and one row of bq:
 * at most NH (2 BQ BK + BQ) floats whatever T. */
#define KERN_ATT_LEAN_BQ 64
#define KERN_ATT_LEAN_BK 64
#define KERN_ATT_LEAN_TQ(T) ((size_t)(T) < KERN_ATT_LEAN_BQ ? (size_t)(T) : KERN_ATT_LEAN_BQ)
#define KERN_ATT_LEAN_TK(T) ((size_t)(T) < KERN_ATT_LEAN_BK ? (size_t)(T) : KERN_ATT_LEAN_BK)
#define KERN_ATT_LEAN_TILE(T) (2 * KERN_ATT_LEAN_TQ(T) * KERN_ATT_LEAN_TK(T) + KERN_ATT_LEAN_TQ(T))
#define KERN_ATT_LEAN_SCRATCH(T, NH) ((size_t)(NH) * KERN_ATT_LEAN_TILE(T))
/* Floats of attention_cache_fwd's scratch: one score row per query and head. */
#define KERN_ATT_CACHE_SCRATCH(n, P, NH) ((size_t)(n) * (size_t)(NH) * (size_t)(P))

/* 0 when d's backend has every LLaMA-family op of kern_ops; otherwise
 * ACC_EDEVICE naming the device, its backend and the first missing op. */
int kern_llama_ops_check(const kern_device *d, acc_err *err);

/* 0 when d's backend has every op Qwen3 and Gemma 2 add to kern_ops
 * (soft-capping, the tanh-GELU gate, RMSNorm with an offset, attention
 * with options); otherwise ACC_EDEVICE naming the first missing op. */
int kern_decoder_ops_check(const kern_device *d, acc_err *err);

/* x rounded to the nearest bf16 value (ties to even), returned as the fp32
 * holding it: the upper 16 bits of the result are the bf16 value, the lower
 * 16 are zero. NaN stays NaN (quiet), +-Inf stays +-Inf, finite values past
 * bf16's largest round to +-Inf, subnormals round within bf16's subnormals
 * (no flush to zero). The same function as CUDA's __float2bfloat16_rn. */
static inline float kern_bf16_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        u |= 0x00400000u; /* NaN: keep it quiet, so the truncation keeps it a NaN */
    else
        u += 0x7fffu + ((u >> 16) & 1u); /* to nearest, ties to even */
    u &= 0xffff0000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* The fp32 value of a bf16 bit pattern (exact). */
static inline float kern_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* The fp32 value of an IEEE binary16 bit pattern (exact: subnormals
 * normalised, Inf and NaN kept). */
static inline float kern_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    if (e == 0x1f)
        u = sign | 0x7f800000u | (m << 13);
    else if (e != 0)
        u = sign | ((e + 112) << 23) | (m << 13);
    else if (m == 0)
        u = sign;
    else { /* subnormal: normalise */
        e = 113;
        while (!(m & 0x400u)) {
            m <<= 1;
            e--;
        }
        u = sign | (e << 23) | ((m & 0x3ffu) << 13);
    }
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

#endif
