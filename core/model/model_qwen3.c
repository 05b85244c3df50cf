/* model_qwen3: the Qwen3 family (Qwen3ForCausalLM), a decoder.h
 * description: RMSNorm, SwiGLU, per-head q/k RMSNorm before RoPE, no q/k/v
 * biases unless attention_bias (then o_proj has one too), tied or untied
 * head; head_dim as config.json gives it (not hidden / heads). */
#include <string.h>

#include "decoder.h"

static const dec_desc qwen3 = {.norm = BLK_RMSNORM, .act = BLK_SILU, .qk_norm = true};

static int qwen3_config_from_hf(const json_t *hf, model_config *cfg, acc_err *err)
{
    bool sliding = false;
    int rc = dec_config_from_hf(hf, cfg, false, false, err);
    if (rc == 0)
        rc = model_hf_bool(hf, "tie_word_embeddings", false, &cfg->tie_word_embeddings, err);
    if (rc == 0)
        rc = model_hf_bool(hf, "use_sliding_window", false, &sliding, err);
    if (rc == 0 && sliding) /* Qwen3's published models leave it off */
        rc = acc_err_set(err, ACC_EINVAL, "model.from",
                         "config.json: use_sliding_window is not supported for qwen3");
    if (rc == 0)
        rc = dec_hf_act(hf, "hidden_act", "silu", err);
    return dec_check_hf(rc, cfg, err);
}

static int qwen3_config_to_hf(const model_config *c, json_t *hf, acc_err *err)
{
    int rc = dec_config_to_hf(c, "Qwen3ForCausalLM", hf, err);
    if (rc == 0 && (json_object_set_new(hf, "hidden_act", json_string("silu")) != 0 ||
                    json_object_set_new(hf, "use_sliding_window", json_false()) != 0))
        rc = acc_err_set(err, ACC_ENOMEM, "", "out of host memory for config.json");
    return rc;
}

static int qwen3_config_from_spec(const spec_model *sm, model_config *cfg, acc_err *err)
{
    snprintf(cfg->model_type, sizeof cfg->model_type, "qwen3");
    return dec_config_from_spec(sm, cfg, err);
}

static int qwen3_layout(const model_config *c, model_layout *out, acc_err *err)
{
    return dec_layout(&qwen3, c, out, err);
}

static int qwen3_act_bytes(const model_config *c, int B, int T, int recompute, uint64_t *bytes,
                           acc_err *err)
{
    return dec_act_bytes(&qwen3, c, B, T, recompute, bytes, err);
}

static int qwen3_create(model *m, acc_err *err)
{
    return dec_create(m, &qwen3, err);
}


static const char *const qwen3_lora_default[] = {"q_proj", "v_proj", NULL}; /* PEFT's */

static const model_hf_name qwen3_hf[] = {
    {"Qwen3ForCausalLM", "qwen3", 0},
    {0},
};

const model_family model_family_qwen3 = {
    .name = "qwen3",
    .hf_names = qwen3_hf,
    .lora_default_targets = qwen3_lora_default,
    .config_from_spec = qwen3_config_from_spec,
    .config_check = dec_check,
    .layout = qwen3_layout,
    .act_bytes = qwen3_act_bytes,
    .token_chunks = true,
    .acts_alloc = dec_acts_alloc,
    .acts_free = dec_acts_free,
    .forward = dec_forward,
    .backward = dec_backward,
    .init_host = dec_init_host,
    .create = qwen3_create,
    .destroy = dec_destroy,
    .config_from_hf = qwen3_config_from_hf,
    .config_to_hf = qwen3_config_to_hf,
    .logits = dec_logits,
    .token_losses = dec_token_losses,
    .packing = true,
    .infer = dec_infer,
};
