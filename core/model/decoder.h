/* decoder: the pre-norm decoder-only transformer that LLaMA (Mistral,
 * Qwen2), Qwen3 and Gemma 2 are, composed of blocks.h's pieces once, so a
 * family file is its config.json mapping, its description and its
 * registry row.
 *
 * One block, Hugging Face's names (model.layers.N.*):
 *   h = norm(x) [input_layernorm]
 *   q, k, v = projections of h [self_attn.{q,k,v}_proj, optional biases]
 *   q, k per head RMSNorm-ed over head_dim [self_attn.{q,k}_norm] (qk_norm)
 *   q, k rotated (RoPE); attention (GQA; cfg's query scale, score cap, and
 *   the sliding window on the layers cfg marks); o = o_proj(attention)
 *   x' = x + o, or x + norm(o) [post_attention_layernorm] (sandwich)
 *   h = norm(x') [post_attention_layernorm; sandwich: pre_feedforward_]
 *   f = down(act(gate(h)) * up(h)) [mlp.*]
 *   out = x' + f, or x' + norm(f) [post_feedforward_layernorm] (sandwich)
 * then model.norm, the head (lm_head.weight, or the embedding when tied)
 * and the logits' cap. The embedding may be scaled (Gemma: sqrt(hidden),
 * rounded to fp32). Norms are RMSNorm or RMSNorm with the +1 weight.
 *
 * The description (dec_desc) is the family's; the numbers (shapes, eps,
 * caps, window, sliding layers) are model_config's. The functions below
 * are model_family entries (or the body of one, for the two that take a
 * config and so need the description passed).
 */
#ifndef ACC_DECODER_H
#define ACC_DECODER_H

#include <stdbool.h>

#include "blocks.h"
#include "model.h"

typedef struct dec_desc {
    blk_norm_kind norm; /* BLK_RMSNORM or BLK_RMSNORM_P1 */
    blk_act act;        /* of the gated FFN: BLK_SILU or BLK_GELU_TANH */
    bool qk_norm;       /* per-head q / k RMSNorm before RoPE (Qwen3) */
    bool sandwich;      /* norms after attention and FFN, before FFN (Gemma 2) */
    bool embed_scale;   /* embedding times sqrt(hidden) (Gemma) */
} dec_desc;

/* the head size (head_dim, or channels / heads) and key/value heads */
int dec_head_dim(const model_config *c);
int dec_kv_heads(const model_config *c);
/* the rows of the embedding / head: the vocabulary rounded up to 64 */
int dec_round_vocab(int v);
/* layer l is a sliding-window layer */
bool dec_sliding(const model_config *c, int l);

/* config: the keys every decoder family reads from / writes to config.json
 * (shapes, eps, rope_theta, attention_bias -- default qkv_bias_only, an
 * output bias only without it --, mlp_bias; rope_scaling refused unless the
 * family reads it), and the shape checks; errors name "model.<key>" */
int dec_config_from_hf(const json_t *hf, model_config *cfg, bool qkv_bias_only,
                       bool rope_scaling, acc_err *err);
/* config.json's activation `key`, when present, must be `want` */
int dec_hf_act(const json_t *hf, const char *key, const char *want, acc_err *err);
/* rc, or (rc 0) dec_check's verdict on the config read from config.json,
 * its field named in the message, the error's field "model.from" */
int dec_check_hf(int rc, const model_config *cfg, acc_err *err);
int dec_config_to_hf(const model_config *c, const char *arch, json_t *hf, acc_err *err);
int dec_config_from_spec(const spec_model *sm, model_config *cfg, acc_err *err);
int dec_check(const model_config *c, acc_err *err);

int dec_layout(const dec_desc *d, const model_config *c, model_layout *out, acc_err *err);
int dec_act_bytes(const dec_desc *d, const model_config *cfg, int B, int T, int recompute,
                  uint64_t *bytes, acc_err *err);

/* create keeps *d in the family's state; the rest read it from there */
int dec_create(model *m, const dec_desc *d, acc_err *err);
void dec_destroy(model *m);
int dec_acts_alloc(model *m, acc_err *err);
void dec_acts_free(model *m);
void dec_forward(model *m, const int *tokens, const int *targets, const float *weights,
                 int nseq, int want_grad, double *loss_sum);
void dec_backward(model *m, int nseq, void (*done)(void *ctx, int layer), void *ctx);
/* N(0, 0.02) matrices, norms 1 (RMSNorm) or 0 (the +1 kind), biases 0 */
int dec_init_host(const model *m, uint64_t seed, float *host, acc_err *err);
const float *dec_logits(const model *m);
const float *dec_token_losses(const model *m);

/* the family's infer entry (model.h, blocks.h's blk_infer) */
void dec_infer(model *m, blk_infer *s, const int *tokens, int n, int p0);

#endif
