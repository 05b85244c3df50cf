/* model_llama: see model_llama.h. A family file: config.json mapping and
 * its description of decoder.h's block (tensor names and composition). */
#include "model_llama.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decoder.h"
#include "checked.h"
#include "rng.h"

/* ---- config */

static int llama_config_from_spec(const spec_model *sm, model_config *cfg, acc_err *err)
{
    cfg->max_seq_len = sm->seq_len;
    cfg->vocab_size = sm->vocab_size;
    cfg->padded_vocab_size = sm->padded_vocab_size > 0 ? sm->padded_vocab_size
                                                       : dec_round_vocab(sm->vocab_size);
    cfg->n_layer = sm->n_layer;
    cfg->n_head = sm->n_head;
    cfg->channels = sm->n_embd;
    cfg->n_kv_head = sm->n_kv_head;
    cfg->intermediate_size = sm->intermediate_size;
    if (cfg->intermediate_size == 0) { /* LLaMA's 8/3 C, rounded up to 64 */
        int64_t w = ((int64_t)sm->n_embd * 8 / 3 + 63) / 64 * 64;
        cfg->intermediate_size = w > INT32_MAX / 2 ? 0 : (int)w;
    }
    if (cfg->norm_eps == 0)
        cfg->norm_eps = 1e-5;
    if (cfg->model_type[0] == '\0')
        snprintf(cfg->model_type, sizeof cfg->model_type, "llama");
    return dec_check(cfg, err);
}

static int rope_from_hf(const json_t *hf, model_config *cfg, acc_err *err)
{
    const json_t *rs = json_object_get(hf, "rope_scaling");
    cfg->rope_scaling = MODEL_ROPE_NONE;
    if (rs == NULL || json_is_null(rs))
        return 0;
    if (!json_is_object(rs))
        return acc_err_set(err, ACC_EINVAL, "model.from",
                           "config.json: rope_scaling must be an object or null");
    const json_t *t = json_object_get(rs, "rope_type");
    const char *type = json_string_value(t ? t : json_object_get(rs, "type")); /* older spelling */
    if (type == NULL)
        return acc_err_set(err, ACC_EINVAL, "model.from",
                           "config.json: rope_scaling has no rope_type");
    if (!strcmp(type, "default"))
        return 0;
    if (strcmp(type, "linear") != 0 && strcmp(type, "llama3") != 0)
        return acc_err_set(err, ACC_EINVAL, "model.from",
                           "config.json: rope_scaling.rope_type %s is not supported "
                           "(default, linear, llama3)", type);
    int rc = model_hf_num(rs, "factor", 0, &cfg->rope_factor, err);
    cfg->rope_scaling = !strcmp(type, "linear") ? MODEL_ROPE_LINEAR : MODEL_ROPE_LLAMA3;
    if (rc == 0 && cfg->rope_scaling == MODEL_ROPE_LLAMA3) {
        rc = model_hf_num(rs, "low_freq_factor", 0, &cfg->rope_low_freq_factor, err);
        if (rc == 0)
            rc = model_hf_num(rs, "high_freq_factor", 0, &cfg->rope_high_freq_factor, err);
        if (rc == 0)
            rc = model_hf_int(rs, "original_max_position_embeddings", 0,
                              &cfg->rope_original_max_pos, err);
    }
    if (rc != 0 && err != NULL && strstr(err->msg, "rope_scaling") == NULL)
        acc_err_prefix(err, "rope_scaling");
    return rc;
}

static int llama_config_from_hf(const json_t *hf, model_config *cfg, acc_err *err)
{
    const model_hf_name *row = model_hf_name_of(cfg->model_type);
    bool qkv_only = row != NULL && (row->flags & MODEL_HF_QKV_BIAS);
    bool sliding = false;
    int rc = dec_config_from_hf(hf, cfg, qkv_only, true, err);
    if (rc == 0)
        rc = model_hf_bool(hf, "tie_word_embeddings", false, &cfg->tie_word_embeddings, err);
    if (rc == 0)
        rc = rope_from_hf(hf, cfg, err);
    if (rc == 0)
        rc = dec_hf_act(hf, "hidden_act", "silu", err);
    if (rc == 0)
        rc = model_hf_bool(hf, "use_sliding_window", false, &sliding, err);
    if (rc == 0 && sliding)
        rc = acc_err_set(err, ACC_EINVAL, "model.from",
                         "config.json: use_sliding_window is not supported");
    return dec_check_hf(rc, cfg, err);
}

static int llama_config_to_hf(const model_config *c, json_t *hf, acc_err *err)
{
    const model_hf_name *row = model_hf_name_of(c->model_type);
    row = row != NULL ? row : &model_family_llama.hf_names[0];
    int bad = 0;
#define SET(key, value) (bad |= json_object_set_new(hf, key, value) != 0)
    SET("architectures", json_pack("[s]", row->architecture));
    SET("model_type", json_string(row->model_type));
    SET("num_hidden_layers", json_integer(c->n_layer));
    SET("num_attention_heads", json_integer(c->n_head));
    SET("num_key_value_heads", json_integer(dec_kv_heads(c)));
    SET("hidden_size", json_integer(c->channels));
    if (c->head_dim > 0)
        SET("head_dim", json_integer(c->head_dim));
    SET("intermediate_size", json_integer(c->intermediate_size));
    SET("vocab_size", json_integer(c->vocab_size));
    SET("max_position_embeddings", json_integer(c->max_seq_len));
    SET("rms_norm_eps", json_real(c->norm_eps));
    SET("rope_theta", json_real(c->rope_theta > 0 ? c->rope_theta : 10000.0));
    SET("tie_word_embeddings", json_boolean(c->tie_word_embeddings));
    SET("hidden_act", json_string("silu"));
    if (!(row->flags & MODEL_HF_QKV_BIAS)) /* Qwen2's are implied by its type */
        SET("attention_bias", json_boolean(c->attention_bias));
    json_t *rs = json_null();
    if (c->rope_scaling == MODEL_ROPE_LINEAR)
        rs = json_pack("{s:s, s:f}", "rope_type", "linear", "factor", c->rope_factor);
    else if (c->rope_scaling == MODEL_ROPE_LLAMA3)
        rs = json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor", c->rope_factor,
                       "low_freq_factor", c->rope_low_freq_factor, "high_freq_factor",
                       c->rope_high_freq_factor, "original_max_position_embeddings",
                       c->rope_original_max_pos);
    SET("rope_scaling", rs);
#undef SET
    return bad ? acc_err_set(err, ACC_ENOMEM, "", "out of host memory for config.json") : 0;
}

/* ---- the composition: decoder.h's block with LLaMA's pieces (RMSNorm,
 * SwiGLU; no q/k norm, no sandwich norms) */

static const dec_desc llama = {.norm = BLK_RMSNORM, .act = BLK_SILU};

static int llama_layout(const model_config *c, model_layout *out, acc_err *err)
{
    return dec_layout(&llama, c, out, err);
}

static int llama_act_bytes(const model_config *cfg, int B, int T, int recompute, uint64_t *bytes,
                           acc_err *err)
{
    return dec_act_bytes(&llama, cfg, B, T, recompute, bytes, err);
}

static int llama_create(model *m, acc_err *err)
{
    return dec_create(m, &llama, err);
}

/* ---- seeded init: N(0, 0.02) matrices (transformers' initializer_range),
 * norms 1, biases 0, padded rows 0; draws in layout order. */

static int llama_init_host(const model *m, uint64_t seed, float *host, acc_err *err)
{
    (void)err;
    rng r;
    rng_seed(&r, seed, 0x11a3aULL);
    for (int k = 0; k < m->layout.n; k++) {
        const model_tensor *t = &m->layout.t[k];
        float *p = host + t->offset;
        if (t->adapter) /* model_lora_init's, so the base draws as without LoRA */
            continue;
        size_t n = model_tensor_file_count(t); /* padded rows stay 0 */
        bool norm = strstr(t->name, "norm.weight") != NULL;
        for (size_t j = 0; j < n; j++)
            p[j] = norm ? 1.0f : t->decays ? (float)(0.02 * rng_normal(&r)) : 0.0f;
    }
    return 0;
}

const float *model_llama_logits(const model *m)
{
    return m->family == &model_family_llama ? dec_logits(m) : NULL;
}

static const char *const llama_lora_default[] = {"q_proj", "v_proj", NULL}; /* PEFT's */

static const model_hf_name llama_hf[] = {
    {"LlamaForCausalLM", "llama", 0},
    {"MistralForCausalLM", "mistral", 0},
    {"Qwen2ForCausalLM", "qwen2", MODEL_HF_QKV_BIAS},
    {0},
};

const model_family model_family_llama = {
    .name = "llama",
    .hf_names = llama_hf,
    .lora_default_targets = llama_lora_default,
    .config_from_spec = llama_config_from_spec,
    .config_check = dec_check,
    .layout = llama_layout,
    .act_bytes = llama_act_bytes,
    .token_chunks = true,
    .acts_alloc = dec_acts_alloc,
    .acts_free = dec_acts_free,
    .forward = dec_forward,
    .backward = dec_backward,
    .init_host = llama_init_host,
    .create = llama_create,
    .destroy = dec_destroy,
    .config_from_hf = llama_config_from_hf,
    .config_to_hf = llama_config_to_hf,
    .logits = model_llama_logits,
    .token_losses = dec_token_losses,
    .packing = true,
    .infer = dec_infer,
};
