/* model_lora: LoRA adapters (PEFT's meaning and names) on a family's layout.
 *
 * Config. model_lora_apply resolves the spec's "lora" section against the
 * model: the targets are module names as the family's Hugging Face tensor
 * names end ("q_proj" for "model.layers.0.self_attn.q_proj.weight");
 * "all-linear" is every 2-D weight inside the blocks (PEFT: every linear
 * layer but the output head); no list is PEFT's default for LLaMA
 * (q_proj, v_proj). A name the model does not have is ACC_EINVAL naming
 * "lora.target_modules[i]".
 *
 * Layout. With cfg->lora.r > 0 the layout is the adapters first, then the
 * family's tensors shifted after them and frozen (trains = false): for each
 * targeted weight W [out, in] of block l, in block and layout order,
 * "base_model.model.<module>.lora_A.weight" A [r, in] and ".lora_B.weight"
 * B [out, r] (PEFT's names), layer l, trainable, decaying. So the trainable
 * floats are the prefix [0, ntrain) of the buffer: gradients, AdamW moments
 * and the reduction cover that prefix only (model.h), and the frozen base
 * costs its parameters alone. The forward is y = W x + (alpha / r) B (A x)
 * (the family composes it from matmul_fwd / matmul_bwd).
 *
 * Init. A as PEFT's (torch's kaiming_uniform, a = sqrt(5)): uniform in
 * [-1/sqrt(in), 1/sqrt(in)), from the job seed in layout order; B = 0, so
 * training starts from the base model's function exactly.
 *
 * Output. model_lora_save writes a PEFT adapter directory
 * (adapter_config.json, adapter_model.safetensors in F32);
 * model_lora_merge_host folds W += (alpha / r) B A into a host buffer for
 * the merged Hugging Face model.
 */
#ifndef ACC_MODEL_LORA_H
#define ACC_MODEL_LORA_H

#include "model.h"

/* cfg->lora from the spec's lora section and save.merge_lora (r = 0: none,
 * cfg unchanged). */
int model_lora_apply(const spec_lora *sl, bool merge, model_config *cfg, acc_err *err);

/* Rebuild the family's layout l (ntrain = nparams on entry) with the
 * adapters first and the base frozen. */
int model_lora_layout(const model_config *cfg, model_layout *l, acc_err *err);

/* alpha / r (0 without LoRA). */
float model_lora_scale(const model_config *cfg);

/* Offsets of the adapters of the base tensor `base` in m's layout
 * (SIZE_MAX each when it has none). */
void model_lora_find(const model *m, const char *base, size_t *a, size_t *b);

/* The seeded init of the adapters (A uniform, B zero), uploaded. */
int model_lora_init(model *m, uint64_t seed, acc_err *err);

/* W += scale * B A for every adapted weight of the host buffer params
 * (the layout's floats). */
void model_lora_merge_host(const model_layout *l, const model_config *cfg, float *params);

/* The PEFT adapter directory's two files into the existing `dir` from the
 * host buffer params; base_model names the base (model.from, or ""). */
int model_lora_save(const model_layout *l, const model_config *cfg, const float *params,
                    const char *dir, const char *base_model, acc_err *err);

#endif
