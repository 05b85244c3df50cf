/* model_gemma2: the Gemma 2 family (Gemma2ForCausalLM), a decoder.h
 * description: RMSNorm with the +1 weight, the embedding times
 * sqrt(hidden), norms before and after attention and the FFN, the
 * tanh-GELU gated FFN, a tied head; from config.json the attention scale
 * query_pre_attn_scalar^-1/2, attention and final-logit soft-capping, and
 * sliding_window on the layers layer_types names "sliding_attention" --
 * without layer_types the even layers 0, 2, 4, ... (Gemma 2's pattern). */
#include <string.h>

#include "decoder.h"

static const dec_desc gemma2 = {.norm = BLK_RMSNORM_P1, .act = BLK_GELU_TANH, .sandwich = true,
                                .embed_scale = true};

/* layer_types, or the even layers */
static int sliding_from_hf(const json_t *hf, model_config *cfg, acc_err *err)
{
    const json_t *types = json_object_get(hf, "layer_types");
    bool given = types != NULL && !json_is_null(types);
    if (cfg->n_layer > MODEL_MAX_SLIDING)
        return acc_err_set(err, ACC_EINVAL, "model.from",
                           "config.json: num_hidden_layers %d is more than %d", cfg->n_layer,
                           MODEL_MAX_SLIDING);
    if (given && (!json_is_array(types) || json_array_size(types) != (size_t)cfg->n_layer))
        return acc_err_set(err, ACC_EINVAL, "model.from",
                           "config.json: layer_types must be an array of num_hidden_layers "
                           "strings");
    memset(cfg->sliding_layers, 0, sizeof cfg->sliding_layers);
    for (int l = 0; l < cfg->n_layer; l++) {
        const char *t = given ? json_string_value(json_array_get(types, (size_t)l)) : NULL;
        if (given && (t == NULL || (strcmp(t, "sliding_attention") != 0 &&
                                    strcmp(t, "full_attention") != 0)))
            return acc_err_set(err, ACC_EINVAL, "model.from",
                               "config.json: layer_types[%d] must be \"sliding_attention\" or "
                               "\"full_attention\"", l);
        if (given ? strcmp(t, "sliding_attention") == 0 : l % 2 == 0)
            cfg->sliding_layers[l / 64] |= 1ull << (l % 64);
    }
    return 0;
}

static int gemma2_config_from_hf(const json_t *hf, model_config *cfg, acc_err *err)
{
    int rc = dec_config_from_hf(hf, cfg, false, false, err);
    if (rc == 0)
        rc = model_hf_bool(hf, "tie_word_embeddings", true, &cfg->tie_word_embeddings, err);
    if (rc == 0)
        rc = model_hf_num(hf, "query_pre_attn_scalar", 0, &cfg->query_pre_attn_scalar, err);
    if (rc == 0)
        rc = model_hf_num(hf, "attn_logit_softcapping", 0, &cfg->attn_logit_softcapping, err);
    if (rc == 0)
        rc = model_hf_num(hf, "final_logit_softcapping", 0, &cfg->final_logit_softcapping, err);
    if (rc == 0)
        rc = model_hf_int(hf, "sliding_window", 0, &cfg->sliding_window, err);
    if (rc == 0)
        rc = sliding_from_hf(hf, cfg, err);
    if (rc == 0) /* the newer key, or the older one */
        rc = dec_hf_act(hf, json_object_get(hf, "hidden_activation") ? "hidden_activation"
                                                                      : "hidden_act",
                        "gelu_pytorch_tanh", err);
    if (rc == 0 && !cfg->tie_word_embeddings)
        rc = acc_err_set(err, ACC_EINVAL, "model.from",
                         "config.json: gemma2 ties its head (tie_word_embeddings true)");
    return dec_check_hf(rc, cfg, err);
}

static json_t *layer_types(const model_config *c)
{
    json_t *a = json_array();
    for (int l = 0; a != NULL && l < c->n_layer; l++)
        json_array_append_new(a, json_string(dec_sliding(c, l) ? "sliding_attention"
                                                                : "full_attention"));
    return a;
}

static json_t *cap_json(double cap)
{
    return cap > 0 ? json_real(cap) : json_null();
}

static int gemma2_config_to_hf(const model_config *c, json_t *hf, acc_err *err)
{
    int rc = dec_config_to_hf(c, "Gemma2ForCausalLM", hf, err), bad = 0;
    if (rc != 0)
        return rc;
#define SET(key, value) (bad |= json_object_set_new(hf, key, value) != 0)
    SET("hidden_activation", json_string("gelu_pytorch_tanh"));
    SET("hidden_act", json_string("gelu_pytorch_tanh"));
    SET("query_pre_attn_scalar", c->query_pre_attn_scalar > 0 ? json_real(c->query_pre_attn_scalar)
                                                              : json_integer(dec_head_dim(c)));
    SET("attn_logit_softcapping", cap_json(c->attn_logit_softcapping));
    SET("final_logit_softcapping", cap_json(c->final_logit_softcapping));
    SET("sliding_window", c->sliding_window > 0 ? json_integer(c->sliding_window) : json_null());
    if (json_object_get(hf, "layer_types") != NULL) /* written where the input had it */
        SET("layer_types", layer_types(c));
#undef SET
    return bad ? acc_err_set(err, ACC_ENOMEM, "", "out of host memory for config.json") : 0;
}

static int gemma2_config_from_spec(const spec_model *sm, model_config *cfg, acc_err *err)
{
    snprintf(cfg->model_type, sizeof cfg->model_type, "gemma2");
    cfg->tie_word_embeddings = true;
    return dec_config_from_spec(sm, cfg, err);
}

static int gemma2_layout(const model_config *c, model_layout *out, acc_err *err)
{
    return dec_layout(&gemma2, c, out, err);
}

static int gemma2_act_bytes(const model_config *c, int B, int T, int recompute, uint64_t *bytes,
                            acc_err *err)
{
    return dec_act_bytes(&gemma2, c, B, T, recompute, bytes, err);
}

static int gemma2_create(model *m, acc_err *err)
{
    return dec_create(m, &gemma2, err);
}


static const char *const gemma2_lora_default[] = {"q_proj", "v_proj", NULL}; /* PEFT's */

static const model_hf_name gemma2_hf[] = {
    {"Gemma2ForCausalLM", "gemma2", 0},
    {0},
};

const model_family model_family_gemma2 = {
    .name = "gemma2",
    .hf_names = gemma2_hf,
    .lora_default_targets = gemma2_lora_default,
    .config_from_spec = gemma2_config_from_spec,
    .config_check = dec_check,
    .layout = gemma2_layout,
    .act_bytes = gemma2_act_bytes,
    .token_chunks = true,
    .acts_alloc = dec_acts_alloc,
    .acts_free = dec_acts_free,
    .forward = dec_forward,
    .backward = dec_backward,
    .init_host = dec_init_host,
    .create = gemma2_create,
    .destroy = dec_destroy,
    .config_from_hf = gemma2_config_from_hf,
    .config_to_hf = gemma2_config_to_hf,
    .logits = dec_logits,
    .token_losses = dec_token_losses,
    .packing = true,
    .infer = dec_infer,
};
