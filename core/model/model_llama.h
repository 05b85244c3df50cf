/* model_llama: the "llama" model family (model.h): LLaMA 1-3, Mistral,
 * Qwen2 (Hugging Face model_type llama, mistral, qwen2), on one device.
 *
 * Architecture: token embedding (no positions); n_layer pre-norm blocks of
 *   x += o_proj(attention(rope(q_proj(h)), rope(k_proj(h)), v_proj(h))),
 *        h = RMSNorm(x) (input_layernorm)
 *   x += down_proj(silu(gate_proj(h)) * up_proj(h)), h = RMSNorm(x)
 *        (post_attention_layernorm)
 * a final RMSNorm (model.norm) and lm_head, or the embedding when
 * tie_word_embeddings. Attention is causal, grouped-query (n_kv_head key /
 * value heads, MHA when equal to n_head) and keeps no T x T matrix (the
 * kern_ops gqa_attention ops). The rotary embedding is Hugging Face's
 * rotate-half layout (the checkpoints' q/k rows are already permuted for
 * it) with rope_theta and rope_scaling none / linear / llama3 (kern_rope.h).
 * Biases: q/k/v with attention_bias, o_proj with attention_out_bias
 * (config.json's attention_bias sets both; Qwen2's registry row,
 * MODEL_HF_QKV_BIAS, q/k/v only); mlp_bias is refused.
 *
 * The file composes blocks.h's pieces (RMSNorm, linear with LoRA, RoPE,
 * grouped-query attention, the SiLU-gated FFN, the head and loss); it
 * calls no kernel itself.
 *
 * Layout (Hugging Face names, one block's tensors contiguous, so one
 * layer's gradients are one span): model.embed_tokens.weight [V, C]
 * (padded_vocab_size rows in the buffer, the padding zero and never in a
 * file), per layer input_layernorm, q/k/v_proj (+ biases), o_proj (+ bias),
 * post_attention_layernorm, gate/up/down_proj, then model.norm.weight and
 * lm_head.weight [V, C] (padded likewise) unless tied. Decay on the 2-D
 * tensors only.
 *
 * Activations (stored mode: every block's; recompute mode: each block's
 * output on the residual stream plus one block's worth, rebuilt before its
 * backward, same kernels, same bits) are one device allocation sized by
 * llama_act_bytes, the rotary tables for T positions included.
 */
#ifndef ACC_MODEL_LLAMA_H
#define ACC_MODEL_LLAMA_H

#include "model.h"

extern const model_family model_family_llama;

/* The logits of the last forward, [nseq * T, padded_vocab_size] on the
 * device (after a want_grad forward: dloss/dlogits); NULL for a model of
 * another family or without activations. For tests and tools. */
const float *model_llama_logits(const model *m);

#endif
