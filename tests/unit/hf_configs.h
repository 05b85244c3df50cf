/* hf_configs: the published config.json of the LLaMA models the planner's
 * figures are about, a writer of a model directory holding one, and the
 * dry-run specs over such a directory (header-only, static). The planner
 * reads it as POST /v1/plan does (plan_only: config.json alone). Shared by
 * the tests and bench/bench_long_ctx.c, so that the figures of both come
 * from the same values and spec; no cmocka here (the bench includes it).
 */
#ifndef ACC_HF_CONFIGS_H
#define ACC_HF_CONFIGS_H

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "train_cfg.h"

/* functions, not static arrays: a file using one alone would warn of the
 * other unused (-Wunused-const-variable) */
static inline const char *fx_llama2_7b_config(void)
{
    return "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 4096,"
           " \"intermediate_size\": 11008, \"num_hidden_layers\": 32, \"num_attention_heads\": 32,"
           " \"num_key_value_heads\": 32, \"vocab_size\": 32000, \"max_position_embeddings\": 4096,"
           " \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, \"tie_word_embeddings\": false,"
           " \"torch_dtype\": \"float16\", \"hidden_act\": \"silu\"}";
}

static inline const char *fx_llama31_8b_config(void)
{
    return "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 4096,"
           " \"intermediate_size\": 14336, \"num_hidden_layers\": 32, \"num_attention_heads\": 32,"
           " \"num_key_value_heads\": 8, \"vocab_size\": 128256, \"max_position_embeddings\": 131072,"
           " \"rms_norm_eps\": 1e-05, \"rope_theta\": 500000.0, \"tie_word_embeddings\": false,"
           " \"rope_scaling\": {\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
           " \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"},"
           " \"torch_dtype\": \"bfloat16\", \"hidden_act\": \"silu\"}";
}

/* root/name/config.json holding `json` (root/name must not exist yet).
 * 0, or -1 with errno where a step failed. */
static inline int fx_write_config(const char *root, const char *name, const char *json)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", root, name);
    if (mkdir(path, 0700) != 0)
        return -1;
    snprintf(path, sizeof path, "%s/%s/config.json", root, name);
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return -1;
    if (fputs(json, f) == EOF) {
        fclose(f);
        return -1;
    }
    return fclose(f) == 0 ? 0 : -1;
}

/* A dry run's spec (plan_only) of the model directory root/dir at seq T,
 * the data under root; the rest (batch, devices, modes) is the caller's. */
static inline void fx_plan_spec(train_cfg *s, const char *root, const char *dir, int T)
{
    memset(s, 0, sizeof *s);
    snprintf(s->model.from, sizeof s->model.from, "%s/%s", root, dir);
    snprintf(s->data_roots, sizeof s->data_roots, "%s", root);
    s->plan_only = true;
    s->model.seq_len = T;
}

/* The QLoRA dry run of the long-context figures: the base quantized at
 * load to NF4, LoRA r 16 all-linear, bf16, one sequence on one device,
 * with recomputation (lean activations and host checkpoints: the
 * caller's). */
static inline void fx_qlora_plan_spec(train_cfg *s, const char *root, const char *dir, int T)
{
    fx_plan_spec(s, root, dir, T);
    s->model.quantize_nf4 = true;
    s->lora = (spec_lora){.r = 16, .alpha = 32, .all_linear = true};
    s->precision = SPEC_BF16;
    s->train_batch_size = s->micro_batch = s->accum_steps = s->devices = 1;
    s->activation_checkpointing = true;
}

#endif
