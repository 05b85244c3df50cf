/* model_gpt2: the "gpt2" model family (model.h), on one device.
 *
 * Architecture: token + learned position embeddings, n_layer pre-LayerNorm
 * blocks (causal multi-head attention, GELU MLP of 4C), a final LayerNorm,
 * and logits through the token embedding (tied weights).
 *
 * Layout (model_family_gpt2.layout): llm.c's order, so an llm.c .bin maps
 * onto the flat buffer directly: wte, wpe, then each block tensor for all
 * layers in turn (h.0.ln_1.weight, h.1.ln_1.weight, ..., h.0.ln_1.bias,
 * ...: ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb,
 * fcprojw, fcprojb), then ln_f.weight, ln_f.bias. Names and file shapes
 * are Hugging Face GPT-2's (GPT2LMHeadModel without the "transformer."
 * prefix): the Conv1D matrices are stored [in, out] in files and [out, in]
 * in the buffer (transposed), wte in files without the padded rows. Weight
 * decay on the matrices (wte, wpe, qkvw, attprojw, fcw, fcprojw) only.
 *
 * The file composes blocks.h's pieces (LayerNorm, linear with LoRA on the
 * Conv1D layers -- PEFT's fan_in_fan_out, adapters A [r, in], B [out, r]
 * -- fused multi-head attention, the GELU FFN, the tied head and loss);
 * it calls no kernel itself. PEFT's default LoRA target is c_attn.
 *
 * Activations (acts_alloc): for micro_batch x seq_len tokens and one
 * layer's worth of backward scratch, sized by the micro batch only, so
 * gradient accumulation costs no memory. In recompute mode only each
 * block's output on the residual stream is kept; the backward re-runs a
 * block's forward before its backward (about one extra forward of cost;
 * the kernels are deterministic, so both modes give the same bits).
 * Rows of wte beyond vocab_size (padding) never get probability mass.
 *
 * Native files for init_from (model_gpt2_files.c): an llm.c .bin (fp32,
 * version 3) or a safetensors GPT-2 (Hugging Face names; wpe keeps the
 * file's rows); under LoRA they hold the base model, after the adapters.
 */
#ifndef ACC_MODEL_GPT2_H
#define ACC_MODEL_GPT2_H

#include "model.h"

#define MODEL_LLMC_MAGIC 20240326
#define MODEL_LLMC_VERSION 3

extern const model_family model_family_gpt2;

/* GPT-2's handle is the generic one. */
typedef model model_gpt2;

/* Parameters from an llm.c .bin (config must match model_config_from_fd):
 * by name (tools, tests; regular file only) or from an open descriptor
 * (read from its start through a dup; fd stays open; `path` for messages). */
int model_load_llmc(model *m, const char *path, acc_err *err);
int model_load_llmc_fd(model *m, int fd, const char *path, acc_err *err);
/* The family table's config_from_fd / load_fd_host (model.h): an llm.c
 * .bin, or a safetensors file by its name's suffix (model_gpt2_files.c). */
int model_gpt2_config_from_fd(int fd, const char *path, const spec_model *sm, model_config *cfg,
                              acc_err *err);
int model_gpt2_load_fd_host(const model *m, int fd, const char *path, float *host, acc_err *err);
/* Write the base model's parameters as an llm.c .bin (atomically: temp,
 * fsync, rename). */
int model_save_llmc(const model *m, const char *path, acc_err *err);

/* The shape of a safetensors GPT-2 file (for init_from checks): n_layer,
 * channels, vocabulary rows, positions. */
int model_gpt2_safetensors_shape(const char *path, int *n_layer, int *channels, int *vocab,
                                 int *max_seq_len, acc_err *err);

#endif
