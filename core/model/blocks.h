/* blocks: the shared pieces every model family is composed of, forward and
 * backward, each calling kernels only through the device table (kern_ops).
 *
 * A family file (model_<family>.c) maps config.json to model_config, names
 * its tensors (its layout) and composes these blocks; it writes no kernel
 * call of its own. The pieces:
 *
 *   blk_linear   y = x W^T (+ b) (+ (alpha/r) B A x: LoRA, PEFT's meaning).
 *                LoRA lives here only, so every family's linear layers have
 *                it, GPT-2's Conv1D ones too (their buffer copy is already
 *                [out, in]: PEFT's fan_in_fan_out).
 *   blk_norm     LayerNorm (weight, bias), RMSNorm, RMSNorm with the +1
 *                weight (Gemma).
 *   blk_embed    token embedding, + learned positions (GPT-2), * scale.
 *   blk_rope     rotary embedding on q / k (tables built at acts_alloc).
 *   blk_attn     causal attention: one fused qkv buffer (GPT-2's MHA) or
 *                separate q, k, v (grouped-query, packed positions).
 *   blk_ffn      up -> activation (-> * gate) -> down: GELU (tanh) or
 *                SiLU, gated or not.
 *   blk_head     the LM head's product and the fused softmax + loss.
 *   blk_layers_* the layer loop: per-layer weight hooks (model_layer_begin
 *                / _end), recompute before backward, the done callbacks.
 *
 * Weights are named by their layout offset (size_t; BLK_NONE: absent) and
 * fetched through model_weight (model.h: the one weight store; a frozen
 * tensor in a 16-bit dtype is widened right before its op). Gradients go
 * to m->grads at the same offset, or nowhere for a frozen tensor.
 *
 * Accumulation: every backward ADDS into its input gradient (dx += ...) as
 * the kernels do; the caller zeroes a buffer before the first block that
 * writes it. The order of kernel calls inside each block is fixed, so a
 * family composed of blocks computes bit for bit what the same calls
 * written out would.
 *
 * Activations: a family lists its arrays' float counts for B x T (one
 * enum); blk_acts_bytes sums them (each rounded up to 16 floats, 64-byte
 * aligned, saturated on overflow) and blk_acts_alloc carves one device
 * allocation into them. With model_config.act_bf16 the layer loop keeps
 * what the backward needs in bf16 ("bf16 activation storage" below).
 */
#ifndef ACC_BLOCKS_H
#define ACC_BLOCKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kern_rope.h"
#include "model.h"

#define BLK_NONE SIZE_MAX
#define BLK_KEEP_MAX 24 /* arrays a family's blk_keep may list */

/* ---- one forward or backward: the model, its device, this micro batch */

typedef struct blk_lora_acts {
    float *u;     /* [layers kept][per_layer][N, r]: (alpha/r) A x of each adapter */
    float *tmp;   /* [N, widest output]: B u before it joins y */
    float *du;    /* [N, r] */
    int per_layer;/* adapted linears per block (blk_lora_per_layer) */
} blk_lora_acts;

struct blk_keep;

typedef struct blk_run {
    model *m;
    kern_device *d;
    const kern_ops *k;
    int B, T, N;              /* N = B * T rows */
    const int *pos;           /* device positions of packed documents, or NULL (p = t) */
    blk_lora_acts lora;       /* LoRA's activations (u NULL: no adapters) */
    bool infer;               /* inference (blk_infer): LoRA's u holds one [N, r] per
                               * adapter of the current block, nothing kept */
    const struct blk_keep *keep; /* bf16 activation storage (cfg.act_bf16), or NULL */
} blk_run;

/* A run over nseq sequences of m->T tokens. */
blk_run blk_run_of(model *m, int nseq);
/* Rows [n0, n0 + n) of r as a run of their own, for per-token ops (norms,
 * linears, activations, residuals; not rotary or attention): N = n, LoRA's
 * kept u at those rows of each adapter's [B*T, r]. */
blk_run blk_rows(const blk_run *r, int n0, int n);

/* ---- weights (layout offsets) */

/* Offset of the tensor named printf(fmt, layer), or BLK_NONE. */
size_t blk_off(const model *m, const char *fmt, int layer);
/* The fp32 weights at off for the next op (model_weight; slot 1 for a
 * vector used beside a slot-0 matrix); NULL for BLK_NONE. */
const float *blk_w(model *m, size_t off, int slot);
/* The gradient at off; NULL when absent or frozen (no gradient). */
float *blk_g(const model *m, size_t off);

/* ---- linear: y[N,out] = x[N,in] W^T + b, W [out, in] in the buffer */

typedef struct blk_linear {
    size_t w, b;         /* weight, bias (BLK_NONE: none) */
    size_t la, lb;       /* LoRA A [r, in], B [out, r] (BLK_NONE: not adapted) */
    int in, out;
    int slot;            /* its place among its block's adapters (-1: none) */
} blk_linear;

/* Fill L from the layout: weight `wname`, bias `bname` (NULL or absent:
 * none), both printf formats of `layer`; the adapters PEFT names for the
 * weight. *slots counts the block's adapted linears (start it at 0 for
 * each block). */
void blk_linear_init(const model *m, blk_linear *L, const char *wname, const char *bname,
                     int layer, int in, int out, int *slots);
void blk_linear_fwd(blk_run *r, int layer, const blk_linear *L, float *y, const float *x);
/* dx += dy W (+ the adapter's), dW += dy^T x, db += colsum(dy) */
void blk_linear_bwd(blk_run *r, int layer, const blk_linear *L, float *dx, const float *dy,
                    const float *x);

/* Adapted linears per block under cfg's LoRA (0 without). */
int blk_lora_per_layer(const model_config *cfg);

/* ---- norms */

typedef enum blk_norm_kind {
    BLK_LAYERNORM,   /* (x - mean) * rstd * w + b */
    BLK_RMSNORM,     /* x * rstd * w */
    BLK_RMSNORM_P1,  /* x * rstd * (1 + w) (Gemma) */
} blk_norm_kind;

typedef struct blk_norm {
    blk_norm_kind kind;
    size_t w, b;     /* b: LayerNorm only */
    float eps;       /* RMSNorm's (LayerNorm's kernel uses its own 1e-5) */
    int C;
} blk_norm;

/* out [N,C]; mean [N] (LayerNorm only; NULL otherwise), rstd [N] kept. */
void blk_norm_fwd(blk_run *r, const blk_norm *n, float *out, float *mean, float *rstd,
                  const float *x);
/* dx += ..., dw (db) += ... */
void blk_norm_bwd(blk_run *r, const blk_norm *n, float *dx, const float *dout, const float *x,
                  const float *mean, const float *rstd);

/* ---- embedding: out[n] = wte[tok[n]] (+ wpe[t]) (* scale) */

typedef struct blk_embed {
    size_t wte, wpe; /* wpe BLK_NONE: no learned positions */
    int C;
    float scale;     /* 0 or 1: none (Gemma: sqrt(hidden)) */
} blk_embed;

void blk_embed_fwd(blk_run *r, const blk_embed *e, float *out, const int *tok);
/* dwte (dwpe) += dout (dout is scaled in place first when scale is set) */
void blk_embed_bwd(blk_run *r, const blk_embed *e, float *dout, const int *tok);

/* ---- rotary embedding (kern_rope.h) */

typedef struct blk_rope {
    float *cos, *sin; /* device tables [T, hs/2] */
    int hs;
} blk_rope;

/* The rotary config of cfg (rope_theta default 10000, scaling). */
void blk_rope_cfg(const model_config *cfg, kern_rope_cfg *out);
/* Floats of one table for T positions. */
uint64_t blk_rope_floats(int T, int hs);
/* Build the tables for m->T positions on the host and upload them. */
int blk_rope_upload(model *m, const blk_rope *rp, acc_err *err);
/* x [N, H, hs] rotated in place; the backward rotates dx back in place. */
void blk_rope_fwd(blk_run *r, const blk_rope *rp, float *x, int H);
void blk_rope_bwd(blk_run *r, const blk_rope *rp, float *dx, int H);

/* ---- attention (causal) */

typedef struct blk_attn {
    int NH, NKV, hs;     /* query heads, key/value heads, head size */
    /* variants (0: off); the kernels that honour them come with their families */
    int window;          /* sliding window: keys u in (t - window, t] */
    float softcap;       /* scores -> softcap * tanh(scores / softcap) */
    float scale;         /* score scale (0: 1 / sqrt(hs)) */
} blk_attn;

/* Separate q [N,NH,hs], k, v [N,NKV,hs] -> out [N,NH,hs]; lse [B,NH,T];
 * scratch KERN_ATT_SCRATCH(T, NH) floats. Honours r->pos. */
void blk_attn_fwd(blk_run *r, const blk_attn *a, float *out, float *lse, float *scratch,
                  const float *q, const float *k, const float *v);
/* dq, dk, dv += ... */
void blk_attn_bwd(blk_run *r, const blk_attn *a, float *dq, float *dk, float *dv,
                  float *scratch, const float *dout, const float *q, const float *k,
                  const float *v, const float *lse, const float *out);
/* One fused buffer qkv [N, 3 C] (multi-head, NKV = NH, C = NH hs). */
void blk_attn_fused_fwd(blk_run *r, const blk_attn *a, float *out, float *lse, float *scratch,
                        const float *qkv);
void blk_attn_fused_bwd(blk_run *r, const blk_attn *a, float *dqkv, float *scratch,
                        const float *dout, const float *qkv, const float *lse, const float *out);

/* ---- feed-forward: down(act(up x) [* gate x]) */

typedef enum blk_act {
    BLK_GELU_TANH,   /* GELU, tanh approximation */
    BLK_SILU,
} blk_act;

typedef struct blk_ffn {
    blk_linear up, gate, down; /* gate.w BLK_NONE: not gated */
    blk_act act;
    int I;                     /* intermediate width */
} blk_ffn;

/* The FFN's kept activations: pre = the activation's input (gated: the
 * gate projection), up (gated only), h = act(...) the down projection's
 * input; [N, I] each. */
typedef struct blk_ffn_acts {
    float *pre, *up, *h;
} blk_ffn_acts;

/* Backward scratch, [N, I] each (dup: gated only). */
typedef struct blk_ffn_grads {
    float *dh, *dpre, *dup;
} blk_ffn_grads;

/* y [N, C] = the FFN of x [N, C]. */
void blk_ffn_fwd(blk_run *r, int layer, const blk_ffn *f, const blk_ffn_acts *a, float *y,
                 const float *x);
/* dx must be zeroed by the caller; dx += d(FFN)/dx dy */
void blk_ffn_bwd(blk_run *r, int layer, const blk_ffn *f, const blk_ffn_acts *a,
                 const blk_ffn_grads *g, float *dx, const float *dy, const float *x);

/* ---- LM head and loss */

typedef struct blk_head {
    size_t w;        /* [Vp, C] (the token embedding when tied) */
    int C, V, Vp;
    float softcap;   /* final-logit soft-capping (0: none) */
    float *raw;      /* softcap: [N, Vp] device floats, the logits before the cap (the
                      * cap's backward needs them; the family's activations) */
} blk_head;

/* logits [N, Vp] = x W^T; losses [N]; *loss_sum (blk_xent's contract:
 * kern_ops.xent; with want_grad logits become dloss/dlogits). */
void blk_head_fwd(blk_run *r, const blk_head *h, float *logits, float *losses,
                  double *loss_sum, const float *x, const int *targets, const float *weights,
                  int want_grad);
/* dx += dlogits W, dW += dlogits^T x (with a cap, dlogits is first taken
 * through the cap's backward, in place) */
void blk_head_bwd(blk_run *r, const blk_head *h, float *dx, float *dlogits, const float *x);

/* Lean activations (model_config.lean_acts): the LM head and the loss in
 * chunks of blk_head_chunk rows, never the whole [N, Vp] logits. Per chunk:
 * its logits (and raw logits with a cap) in `logits` / h->raw, sized
 * blk_head_rows(N, true) x Vp, its losses, and with want_grad their
 * gradient taken at once through the head: dx[chunk] += dlogits W, dW +=
 * dlogits^T x. *loss_sum is the chunks' sums added in order. The
 * functions of blk_head_fwd + blk_head_bwd within fp32 summation order. */
#define BLK_HEAD_CHUNK 1024
void blk_head_lean(blk_run *r, const blk_head *h, float *logits, float *losses,
                   double *loss_sum, const float *x, const int *targets, const float *weights,
                   int want_grad, float *dx);
/* rows per chunk: cfg->lean_chunk, or BLK_HEAD_CHUNK when that is 0 */
int blk_head_chunk(const model_config *cfg);
/* rows of the logits buffer: N, or at most one chunk with lean_acts */
uint64_t blk_head_rows(uint64_t N, const model_config *cfg);

/* ---- inputs: tokens, targets, weights (and packed positions) uploaded */

typedef struct blk_inputs {
    int *tokens, *targets;
    float *weights;
    int *pos;        /* [N] or NULL: no room for positions (family without packing) */
} blk_inputs;

/* Upload them; r->pos becomes in->pos when m->positions is set. */
void blk_inputs_upload(blk_run *r, const blk_inputs *in, const int *tokens, const int *targets,
                       const float *weights);

/* ---- the layer loop */

typedef void (*blk_layer_fn)(blk_run *r, int layer);

/* For l = 0..L-1: model_layer_begin, fwd(l), (r->keep: into the bf16
 * store, "bf16 activation storage" below), model_layer_end. */
void blk_layers_forward(blk_run *r, int L, blk_layer_fn fwd);
/* For l = L-1..0: model_layer_begin, (r->keep: out of the bf16 store),
 * (recompute: fwd(l)), bwd(l), model_layer_end, done(ctx, l); done may
 * be NULL. */
void blk_layers_backward(blk_run *r, int L, blk_layer_fn fwd, blk_layer_fn bwd,
                         void (*done)(void *ctx, int layer), void *ctx);

/* ---- the whole stack: embedding, the blocks, final norm, head and loss */

typedef struct blk_stack {
    const blk_embed *emb;
    const blk_norm *norm;       /* the final norm */
    const blk_head *head;
    int L;                      /* blocks */
    blk_layer_fn fwd, bwd;      /* one block's forward / backward (bwd: dresid holds
                                 * d(block output) on entry, d(block input) on exit) */
    float *x0, *xL;             /* the embedding's output (block 0's input), block L-1's output */
    float *lnf, *lnf_mean, *lnf_rstd; /* the final norm's output and statistics */
    float *logits, *losses;
    float *dresid, *dln;        /* [N, C] backward scratch (dln: one token chunk with tok_chunk) */
    /* recompute mode, optional (zero: none) */
    blk_layer_fn refwd;         /* the backward's recomputation of a block (NULL: fwd) */
    int tok_chunk;              /* > 0: the final norm's backward in chunks of this many rows */
    /* act_offload: block l's input lives in device slot ck_slot[l % 2] (x0
     * is ck_slot[0], xL ck_slot[L % 2]); after block l's forward it is
     * downloaded to ck_host + l * ck_stride, and uploaded back before block
     * l's recomputation (block L-1's never left its slot). With act_bf16
     * ck_slot[0] is the one fp32 row every block reads and overwrites,
     * ck_slot[1] its bf16 staging, and the host checkpoints after the first
     * are bf16 (blocks.c "activation checkpoints in host memory") */
    float *ck_slot[2];
    float *ck_host;             /* [L][ck_stride] host floats, or NULL: no offload */
    size_t ck_stride;           /* floats per checkpoint (m->B * T * C) */
    int ck_C;                   /* floats per row of a checkpoint */
} blk_stack;

/* Block l's input (l = L: the last block's output) where the embedding's
 * output is at enc and block l's output at outs + l B T C (stored or
 * recomputed); with act_offload (model_act_offload) device slot l % 2 of
 * outs (two of B T C floats; enc unused). */
float *blk_ck_at(const model *m, float *enc, float *outs, int l);
/* With act_offload in m's mode, s's ck_* fields over those slots and
 * m->ck_host; nothing otherwise. */
void blk_stack_ck(const model *m, float *outs, blk_stack *s);

/* Upload the inputs, embed, the blocks (blk_layers_forward), final norm,
 * head and loss. With lean_acts and want_grad the head's backward runs here
 * (blk_head_lean): its weight gradient is accumulated and its dx parked in
 * s->dresid (no block's forward touches it) for blk_stack_backward. */
void blk_stack_forward(blk_run *r, const blk_stack *s, const blk_inputs *in, const int *tokens,
                       const int *targets, const float *weights, int want_grad,
                       double *loss_sum);
/* The backward of the last forward (want_grad): head, final norm, the
 * blocks (blk_layers_backward, done per block), the embedding, done(-1). */
void blk_stack_backward(blk_run *r, const blk_stack *s, const int *tokens,
                        void (*done)(void *ctx, int layer), void *ctx);

/* ---- activations */

/* Bytes of arrays of cnt[0..n) floats, each rounded up to 16 floats
 * (saturated: ACC_SIZE_OVERFLOW). */
uint64_t blk_acts_bytes(const uint64_t *cnt, int n);
/* The common act_bytes check: bytes fits size_t and B x T an int, else
 * ACC_EINVAL naming model.seq_len (one sequence overflows: one_overflows)
 * or the micro batch. */
int blk_acts_check(uint64_t bytes, int one_overflows, int B, int T, acc_err *err);
/* Allocate m->act_bytes on the device, zeroed, carved into ptr[0..n)
 * (cnt as blk_acts_bytes took them); *mem holds the allocation. */
int blk_acts_alloc(model *m, const uint64_t *cnt, int n, void **mem, float **ptr,
                   acc_err *err);
/* Free *mem (NULL: nothing) and clear ptr[0..n). */
void blk_acts_free(model *m, void **mem, float **ptr, int n);

/* ---- bf16 activation storage (model_config.act_bf16)
 *
 * In fp32 a family keeps every block's inner activations (stored mode) or
 * one block's (recompute), and each block's output on the residual stream
 * ([L] rows of [B*T, C]). With act_bf16 it allocates instead:
 *   - ONE block's inner activations in fp32, the working slot
 *     (blk_inner_layers: 1; blk_inner_slot: 0), whatever the mode;
 *   - ONE fp32 row of the residual stream (blk_resid_rows: 1): block l
 *     reads it (block 0: the embedding's output instead) and writes its
 *     output over it (every family reads its input before it writes its
 *     output);
 *   - per-row statistics (norms' rstd / mean, attention's log-sum-exp)
 *     as in fp32 (every block's stored, one with recompute): small, and
 *     kept exact;
 *   - a bf16 store (blk_keep_floats) for blocks 0 .. L-2, and the layer
 *     loop (blk_layers_*) moves values through it with narrow_bf16 /
 *     widen16. After the forward of block l < L-1:
 *       its output is rounded to bf16 IN PLACE (narrowed into the store,
 *       widened back), so block l+1 and every backward read the same
 *       rounded value;
 *       in stored mode (no recompute) the family's kept arrays of the
 *       working slot (blk_keep: normed inputs, projections, attention
 *       output, MLP pre-activations, LoRA's u; not the statistics) are
 *       narrowed into block l's part of the store (the forward itself used
 *       them in fp32).
 *     Before block l's backward its input (block l-1's output) is widened
 *     back into the row (with recompute: before and again after the
 *     block's recomputation, whose output lands there) and, stored mode,
 *     its kept arrays back into the slot. The last block's output and
 *     kept arrays are never stored: they stay in fp32 in the row and the
 *     slot until its backward, the first one.
 * So rounding to bf16 (to nearest, ties to even) happens at fixed points:
 * each block's output but the last, seen rounded by the next block and
 * by the backward; stored mode only, the kept arrays of every block but
 * the last, between its forward and its backward. With recompute the
 * backward rebuilds the inner activations in fp32 from the rounded block
 * input, bit for bit the forward's. The embedding's output, the final
 * norm, the logits, the statistics and every gradient stay fp32. Bytes:
 * 2 per stored value, the store one more array of the family's
 * allocation (rounded up as blk_acts_bytes rounds floats); for L >= 2 a
 * bf16 job's activations are smaller than fp32's (L = 1: equal).
 *
 * With act_offload in recompute mode (model_act_offload: host
 * checkpoints) the store is not allocated (blk_keep_on is false): the
 * same rounding points hold, the host keeps the checkpoints instead
 * (the embedding's output in fp32, blocks 0 .. L-2's rounded outputs in
 * bf16: model_act_host_bytes), and the device one fp32 row plus a bf16
 * staging (blk_ck_floats); blk_stack_forward / _backward move them
 * (blocks.c "activation checkpoints in host memory"). The results are
 * the bits of bf16 recompute without offload. Token chunks (lean_tokens)
 * read the same row: a chunk reads its input rows before it writes its
 * output rows. */

typedef struct blk_keep {
    int n;                         /* the family's kept arrays (stored mode; 0 with recompute) */
    float *slot[BLK_KEEP_MAX];     /* each one's fp32 working array */
    uint64_t cnt[BLK_KEEP_MAX];    /* its floats for m->B sequences */
    uint64_t layer_vals;           /* bf16 values of one block's kept arrays (sum of cnt) */
    float *rows;                   /* the residual stream's fp32 row */
    uint64_t row_vals;             /* values of one row: B*T*C for m->B */
    int C;
    uint16_t *out;                 /* [L-1][row_vals]: each block's output but the last's */
    uint16_t *inner;               /* [L-1][layer_vals] (stored mode) */
} blk_keep;

/* Blocks whose inner activations a family allocates in fp32: L in stored
 * fp32, 1 with recompute or act_bf16. */
uint64_t blk_inner_layers(const model_config *c, int recompute);
/* Block l's slot among them: l, or 0. */
size_t blk_inner_slot(const model *m, int l);
/* Rows of the residual stream a family allocates: L, or 1 with act_bf16. */
uint64_t blk_resid_rows(const model_config *c);
/* The row block l's output goes to: l, or 0. */
size_t blk_resid_row(const model *m, int l);
/* Floats a family allocates for the blocks' inputs and outputs (past the
 * embedding's output), btc = B*T*C: with act_offload in this mode
 * (model_act_offload) two rows (the device slots), or with act_bf16 one
 * row and a bf16 staging row (btc / 2 floats, rounded up); otherwise
 * blk_resid_rows rows. */
uint64_t blk_ck_floats(const model_config *c, int recompute, uint64_t btc);
/* The bf16 store in use (act_bf16 without act_offload in this mode); with
 * act_offload the host checkpoints take its place (blk_stack.ck_host). */
bool blk_keep_on(const model_config *c, int recompute);
/* Floats of the bf16 store (0 without act_bf16): L-1 blocks' outputs of
 * row_vals values each and, without recompute, L-1 blocks' kept arrays
 * (cnt[kept[i]], the slot's counts), at 2 bytes a value (saturated). */
uint64_t blk_keep_floats(const model_config *c, int recompute, const uint64_t *cnt,
                         const int *kept, int nkept, uint64_t row_vals);
/* k for m's allocation (act_bf16): a[] the family's arrays, cnt[] their
 * counts, kept[0..nkept) the arrays narrowed in stored mode, rows the
 * residual stream, store the a[] entry blk_keep_floats sized. */
void blk_keep_init(blk_keep *k, const model *m, float *const *a, const uint64_t *cnt,
                   const int *kept, int nkept, float *rows, float *store);

/* ---- inference (generate.h): a key/value cache and one chunk of scratch
 *
 * A family's infer entry (model.h) runs n <= chunk tokens at positions
 * p0 .. p0+n-1 through its blocks: each block's keys and values (after RoPE)
 * are stored at those rows of the block's cache and the queries attend to
 * every cached row up to their own (kern_ops.attention_cache_fwd); then the
 * final norm and the head on the LAST row only, into `logits` [Vp]. The
 * arrays are sized from the config alone, so every family shares them:
 * QD = n_head * head_dim, KD = n_kv_head * head_dim, I the MLP width.
 * The cache is fp32, or bf16 for a model whose weights are 16-bit: keys
 * and values rounded to bf16 as they are stored (after RoPE), the
 * queries attending to the rounded ones. */
typedef struct blk_infer {
    int chunk, P;          /* rows one call runs; positions the cache holds */
    int KD;                /* floats of one position's keys in one block */
    float *kc, *vc;        /* [L][P, KD] */
    float *x, *x2, *h, *tmp;    /* [chunk, max(C, QD)] */
    float *q, *att;        /* [chunk, QD] */
    float *k, *v;          /* [chunk, KD] */
    float *qkv;            /* [chunk, QD + 2 KD] (fused projections) */
    float *f1, *f2, *f3;   /* [chunk, I] */
    float *st1, *st2;      /* [chunk * max(NH, 1)] norms' statistics */
    float *scores;         /* KERN_ATT_CACHE_SCRATCH(chunk, P, NH) */
    float *cos, *sin;      /* rotary tables [P, hs/2] (decoders) */
    float *logits, *raw;   /* [Vp] each (raw: before a final cap) */
    float *lora_u, *lora_tmp; /* [per_layer, chunk, r], [chunk, widest output] */
    int *tok, *pos;        /* [chunk] */
    void *mem;             /* the one allocation */
    /* A 16-bit model (blk_infer_cache16): the cache in bf16, kc16 / vc16
     * [L][P, KD] (kc, vc NULL), stored through narrow_bf16 and widened
     * into kw / vw [P, KD], one block at a time, where attention reads it. */
    uint16_t *kc16, *vc16;
    float *kw, *vw;
} blk_infer;

/* Whether cfg's cache is kept in bf16: its weights are 16-bit
 * (weights_dtype bf16 or f16). */
bool blk_infer_cache16(const model_config *cfg);

/* Device bytes of blk_infer_alloc's arrays (saturated: ACC_SIZE_OVERFLOW). */
uint64_t blk_infer_bytes(const model_config *cfg, int chunk, int P);
/* Allocate them on m's device (zeroed); the rotary tables built for P
 * positions. ACC_EOOM past the budget. */
int blk_infer_alloc(model *m, int chunk, int P, blk_infer *s, acc_err *err);
void blk_infer_free(model *m, blk_infer *s);
/* A run of n rows at positions p0.. (tokens and positions uploaded). */
blk_run blk_infer_run(model *m, blk_infer *s, const int *tokens, int n, int p0);
/* Keys / values of the n new rows (k, v rows ld floats apart, KD each) into
 * block `layer`'s cache rows p0.. */
void blk_infer_store(blk_run *r, blk_infer *s, int layer, const float *k, const float *v,
                     int ld, int p0);
/* The n queries (rows ldq apart) against block `layer`'s cache, into out. */
void blk_infer_attn(blk_run *r, blk_infer *s, const blk_attn *a, int layer, float *out,
                    const float *q, int ldq, int p0);
/* The final norm and the head on the last of r's rows of x (softcap
 * honoured) into s->logits. */
void blk_infer_head(blk_run *r, blk_infer *s, const blk_norm *norm, const blk_head *head,
                    const float *x);

#endif
