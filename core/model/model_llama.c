/* model_llama: see model_llama.h. */
#include "model_llama.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "kern_rope.h"
#include "model_lora.h"
#include "rng.h"

#define VOCAB_PAD 64 /* rows of the embedding / lm_head rounded up to this */
#define NONE SIZE_MAX

/* ---- config */

bool model_llama_o_bias(const model_config *c)
{
    return c->attention_bias && strcmp(c->model_type, "qwen2") != 0;
}

static int head_dim(const model_config *c)
{
    return c->head_dim > 0 ? c->head_dim : (c->n_head > 0 ? c->channels / c->n_head : 0);
}

static int kv_heads(const model_config *c)
{
    return c->n_kv_head > 0 ? c->n_kv_head : c->n_head;
}

static void rope_cfg(const model_config *c, kern_rope_cfg *r)
{
    *r = (kern_rope_cfg){
        .theta = c->rope_theta > 0 ? c->rope_theta : 10000.0,
        .type = c->rope_scaling == MODEL_ROPE_LINEAR   ? KERN_ROPE_LINEAR
                : c->rope_scaling == MODEL_ROPE_LLAMA3 ? KERN_ROPE_LLAMA3
                                                       : KERN_ROPE_NONE,
        .factor = c->rope_factor,
        .low_freq_factor = c->rope_low_freq_factor,
        .high_freq_factor = c->rope_high_freq_factor,
        .original_max_pos = c->rope_original_max_pos,
    };
}

static int llama_check(const model_config *c, acc_err *err)
{
    if (c->n_layer < 1 || c->n_head < 1 || c->channels < 1 || c->max_seq_len < 1 ||
        c->intermediate_size < 1)
        return acc_err_set(err, ACC_EINVAL, "model",
                           "n_layer, n_head, n_embd, intermediate_size and seq_len must be >= 1");
    if (c->head_dim == 0 && c->channels % c->n_head != 0)
        return acc_err_set(err, ACC_EINVAL, "model.n_head",
                           "n_embd %d is not a multiple of n_head %d", c->channels, c->n_head);
    int hs = head_dim(c), nkv = kv_heads(c);
    if (hs < 2 || hs % 2 != 0)
        return acc_err_set(err, ACC_EINVAL, "model.n_head",
                           "the head size %d must be even (rotary pairs)", hs);
    if (nkv < 1 || c->n_head % nkv != 0)
        return acc_err_set(err, ACC_EINVAL, "model.n_kv_head",
                           "n_head %d is not a multiple of the key/value heads %d", c->n_head, nkv);
    if ((int64_t)c->n_head * hs > INT32_MAX / 2 || (int64_t)c->intermediate_size > INT32_MAX / 2)
        return acc_err_set(err, ACC_EINVAL, "model", "the projections are too wide");
    if (c->vocab_size < 1 || c->padded_vocab_size < c->vocab_size)
        return acc_err_set(err, ACC_EINVAL, "model.padded_vocab_size",
                           "padded_vocab_size %d must be >= vocab_size %d >= 1",
                           c->padded_vocab_size, c->vocab_size);
    if (!(c->norm_eps > 0) || !isfinite(c->norm_eps))
        return acc_err_set(err, ACC_EINVAL, "model.rms_norm_eps", "must be a positive number");
    if (c->mlp_bias)
        return acc_err_set(err, ACC_EINVAL, "model.mlp_bias", "MLP biases are not supported");
    kern_rope_cfg r;
    rope_cfg(c, &r);
    int rc = kern_rope_check(&r, hs, err);
    if (rc != 0 && err != NULL) {
        char key[sizeof err->field];
        snprintf(key, sizeof key, "%s", err->field);
        snprintf(err->field, sizeof err->field, "model.%.100s", key);
    }
    return rc;
}

static int round_vocab(int v)
{
    int64_t p = ((int64_t)v + VOCAB_PAD - 1) / VOCAB_PAD * VOCAB_PAD;
    return p > INT32_MAX ? v : (int)p;
}

static int llama_config_from_spec(const spec_model *sm, model_config *cfg, acc_err *err)
{
    cfg->max_seq_len = sm->seq_len;
    cfg->vocab_size = sm->vocab_size;
    cfg->padded_vocab_size = sm->padded_vocab_size > 0 ? sm->padded_vocab_size
                                                       : round_vocab(sm->vocab_size);
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
    return llama_check(cfg, err);
}

/* config.json members; errors say "config.json: key ..." (the caller adds
 * the directory). */
static int cfg_int(const json_t *hf, const char *key, int def, int *out, acc_err *err)
{
    const json_t *v = json_object_get(hf, key);
    if ((v == NULL || json_is_null(v)) && def >= 0) {
        *out = def;
        return 0;
    }
    if (v == NULL)
        return acc_err_set(err, ACC_EINVAL, "model.from", "config.json has no %s", key);
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > INT32_MAX)
        return acc_err_set(err, ACC_EINVAL, "model.from",
                           "config.json: %s must be an integer in [1, 2^31)", key);
    *out = (int)json_integer_value(v);
    return 0;
}

static int cfg_num(const json_t *hf, const char *key, double def, double *out, acc_err *err)
{
    const json_t *v = json_object_get(hf, key);
    if (v == NULL || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_number(v))
        return acc_err_set(err, ACC_EINVAL, "model.from", "config.json: %s must be a number", key);
    *out = json_number_value(v);
    return 0;
}

static int cfg_bool(const json_t *hf, const char *key, bool def, bool *out, acc_err *err)
{
    const json_t *v = json_object_get(hf, key);
    if (v == NULL || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v))
        return acc_err_set(err, ACC_EINVAL, "model.from",
                           "config.json: %s must be true or false", key);
    *out = json_is_true(v);
    return 0;
}

static int rope_from_hf(const json_t *hf, model_config *cfg, acc_err *err)
{
    const json_t *rs = json_object_get(hf, "rope_scaling");
    if (rs == NULL || json_is_null(rs)) {
        cfg->rope_scaling = MODEL_ROPE_NONE;
        return 0;
    }
    if (!json_is_object(rs))
        return acc_err_set(err, ACC_EINVAL, "model.from",
                           "config.json: rope_scaling must be an object or null");
    const json_t *t = json_object_get(rs, "rope_type");
    if (t == NULL)
        t = json_object_get(rs, "type"); /* the older spelling */
    const char *type = json_string_value(t);
    if (type == NULL)
        return acc_err_set(err, ACC_EINVAL, "model.from",
                           "config.json: rope_scaling has no rope_type");
    if (!strcmp(type, "default")) {
        cfg->rope_scaling = MODEL_ROPE_NONE;
        return 0;
    }
    if (strcmp(type, "linear") != 0 && strcmp(type, "llama3") != 0)
        return acc_err_set(err, ACC_EINVAL, "model.from",
                           "config.json: rope_scaling.rope_type %s is not supported "
                           "(default, linear, llama3)", type);
    int rc = cfg_num(rs, "factor", 0, &cfg->rope_factor, err);
    cfg->rope_scaling = !strcmp(type, "linear") ? MODEL_ROPE_LINEAR : MODEL_ROPE_LLAMA3;
    if (rc == 0 && cfg->rope_scaling == MODEL_ROPE_LLAMA3) {
        rc = cfg_num(rs, "low_freq_factor", 0, &cfg->rope_low_freq_factor, err);
        if (rc == 0)
            rc = cfg_num(rs, "high_freq_factor", 0, &cfg->rope_high_freq_factor, err);
        if (rc == 0)
            rc = cfg_int(rs, "original_max_position_embeddings", 0, &cfg->rope_original_max_pos,
                         err);
    }
    if (rc != 0 && err != NULL && strstr(err->msg, "rope_scaling") == NULL)
        acc_err_prefix(err, "rope_scaling");
    return rc;
}

static int llama_config_from_hf(const json_t *hf, model_config *cfg, acc_err *err)
{
    const char *type = json_string_value(json_object_get(hf, "model_type"));
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", type ? type : "llama");
    int rc = cfg_int(hf, "num_hidden_layers", -1, &cfg->n_layer, err);
    if (rc == 0)
        rc = cfg_int(hf, "num_attention_heads", -1, &cfg->n_head, err);
    if (rc == 0)
        rc = cfg_int(hf, "num_key_value_heads", cfg->n_head, &cfg->n_kv_head, err);
    if (rc == 0)
        rc = cfg_int(hf, "hidden_size", -1, &cfg->channels, err);
    if (rc == 0)
        rc = cfg_int(hf, "head_dim", 0, &cfg->head_dim, err);
    if (rc == 0)
        rc = cfg_int(hf, "intermediate_size", -1, &cfg->intermediate_size, err);
    if (rc == 0)
        rc = cfg_int(hf, "vocab_size", -1, &cfg->vocab_size, err);
    if (rc == 0)
        rc = cfg_int(hf, "max_position_embeddings", 2048, &cfg->max_seq_len, err);
    if (rc == 0)
        rc = cfg_num(hf, "rms_norm_eps", 1e-6, &cfg->norm_eps, err);
    if (rc == 0)
        rc = cfg_num(hf, "rope_theta", 10000.0, &cfg->rope_theta, err);
    if (rc == 0)
        rc = cfg_bool(hf, "tie_word_embeddings", false, &cfg->tie_word_embeddings, err);
    if (rc == 0) /* Qwen2 always has q/k/v biases; LLaMA when attention_bias */
        rc = cfg_bool(hf, "attention_bias", !strcmp(cfg->model_type, "qwen2"),
                      &cfg->attention_bias, err);
    if (rc == 0)
        rc = cfg_bool(hf, "mlp_bias", false, &cfg->mlp_bias, err);
    if (rc == 0)
        rc = rope_from_hf(hf, cfg, err);
    const char *act = json_string_value(json_object_get(hf, "hidden_act"));
    if (rc == 0 && act != NULL && strcmp(act, "silu") != 0)
        rc = acc_err_set(err, ACC_EINVAL, "model.from",
                         "config.json: hidden_act %s is not supported (silu)", act);
    bool sliding = false;
    if (rc == 0 && !strcmp(cfg->model_type, "qwen2"))
        rc = cfg_bool(hf, "use_sliding_window", false, &sliding, err);
    if (rc == 0 && sliding)
        rc = acc_err_set(err, ACC_EINVAL, "model.from",
                         "config.json: use_sliding_window is not supported");
    if (rc != 0)
        return rc;
    cfg->padded_vocab_size = round_vocab(cfg->vocab_size);
    rc = llama_check(cfg, err);
    if (rc != 0 && err != NULL) {
        acc_err_prefix(err, "config.json (%s)", err->field);
        snprintf(err->field, sizeof err->field, "model.from");
    }
    return rc;
}

static int llama_config_to_hf(const model_config *c, json_t *hf, acc_err *err)
{
    const char *type = c->model_type[0] ? c->model_type : "llama";
    const char *arch = !strcmp(type, "qwen2")     ? "Qwen2ForCausalLM"
                       : !strcmp(type, "mistral") ? "MistralForCausalLM"
                                                  : "LlamaForCausalLM";
    int bad = 0;
    bad |= json_object_set_new(hf, "architectures", json_pack("[s]", arch)) != 0;
    bad |= json_object_set_new(hf, "model_type", json_string(type)) != 0;
    bad |= json_object_set_new(hf, "num_hidden_layers", json_integer(c->n_layer)) != 0;
    bad |= json_object_set_new(hf, "num_attention_heads", json_integer(c->n_head)) != 0;
    bad |= json_object_set_new(hf, "num_key_value_heads", json_integer(kv_heads(c))) != 0;
    bad |= json_object_set_new(hf, "hidden_size", json_integer(c->channels)) != 0;
    if (c->head_dim > 0)
        bad |= json_object_set_new(hf, "head_dim", json_integer(c->head_dim)) != 0;
    bad |= json_object_set_new(hf, "intermediate_size", json_integer(c->intermediate_size)) != 0;
    bad |= json_object_set_new(hf, "vocab_size", json_integer(c->vocab_size)) != 0;
    bad |= json_object_set_new(hf, "max_position_embeddings", json_integer(c->max_seq_len)) != 0;
    bad |= json_object_set_new(hf, "rms_norm_eps", json_real(c->norm_eps)) != 0;
    bad |= json_object_set_new(hf, "rope_theta",
                               json_real(c->rope_theta > 0 ? c->rope_theta : 10000.0)) != 0;
    bad |= json_object_set_new(hf, "tie_word_embeddings", json_boolean(c->tie_word_embeddings)) != 0;
    bad |= json_object_set_new(hf, "hidden_act", json_string("silu")) != 0;
    if (strcmp(type, "qwen2") != 0 && strcmp(type, "mistral") != 0)
        bad |= json_object_set_new(hf, "attention_bias", json_boolean(c->attention_bias)) != 0;
    json_t *rs = json_null();
    if (c->rope_scaling == MODEL_ROPE_LINEAR)
        rs = json_pack("{s:s, s:f}", "rope_type", "linear", "factor", c->rope_factor);
    else if (c->rope_scaling == MODEL_ROPE_LLAMA3)
        rs = json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor", c->rope_factor,
                       "low_freq_factor", c->rope_low_freq_factor, "high_freq_factor",
                       c->rope_high_freq_factor, "original_max_position_embeddings",
                       c->rope_original_max_pos);
    bad |= json_object_set_new(hf, "rope_scaling", rs) != 0;
    return bad ? acc_err_set(err, ACC_ENOMEM, "", "out of host memory for config.json") : 0;
}

/* ---- layout */

static int llama_layout(const model_config *c, model_layout *out, acc_err *err)
{
    int64_t C = c->channels, V = c->vocab_size, I = c->intermediate_size;
    int64_t QD = (int64_t)c->n_head * head_dim(c), KD = (int64_t)kv_heads(c) * head_dim(c);
    size_t vrows = (size_t)c->padded_vocab_size * (size_t)C; /* checked below by layout_add */
    int cap = 0, rc;
    const char *f = "model.n_embd";
    char n[MODEL_NAME_MAX];
    if ((uint64_t)c->padded_vocab_size > SIZE_MAX / (uint64_t)C)
        return acc_err_set(err, ACC_EINVAL, "model.vocab_size", "the embedding overflows sizes");
    int64_t emb[2] = {V, C}, vecC[1] = {C};
    rc = model_layout_add(out, &cap, "model.embed_tokens.weight", -1, 2, emb, vrows, true, true,
                          false, f, err);
    for (int l = 0; rc == 0 && l < c->n_layer; l++) {
        const struct { const char *name; int64_t r, k; } t[] = {
            {"input_layernorm.weight", C, 0},
            {"self_attn.q_proj.weight", QD, C}, {"self_attn.q_proj.bias", c->attention_bias ? QD : 0, -1},
            {"self_attn.k_proj.weight", KD, C}, {"self_attn.k_proj.bias", c->attention_bias ? KD : 0, -1},
            {"self_attn.v_proj.weight", KD, C}, {"self_attn.v_proj.bias", c->attention_bias ? KD : 0, -1},
            {"self_attn.o_proj.weight", C, QD}, {"self_attn.o_proj.bias", model_llama_o_bias(c) ? C : 0, -1},
            {"post_attention_layernorm.weight", C, 0},
            {"mlp.gate_proj.weight", I, C}, {"mlp.up_proj.weight", I, C}, {"mlp.down_proj.weight", C, I},
        };
        for (size_t i = 0; rc == 0 && i < sizeof t / sizeof t[0]; i++) {
            if (t[i].r == 0)
                continue; /* an absent bias */
            int64_t shape[2] = {t[i].r, t[i].k};
            int ndim = t[i].k > 0 ? 2 : 1;
            snprintf(n, sizeof n, "model.layers.%d.%s", l, t[i].name);
            rc = model_layout_add(out, &cap, n, l, ndim, shape, 0, ndim == 2, true, false, f, err);
        }
    }
    if (rc == 0)
        rc = model_layout_add(out, &cap, "model.norm.weight", -1, 1, vecC, 0, false, true, false, f,
                              err);
    if (rc == 0 && !c->tie_word_embeddings)
        rc = model_layout_add(out, &cap, "lm_head.weight", -1, 2, emb, vrows, true, true, false, f,
                              err);
    return rc;
}

/* ---- activations */

enum {
    A_ENC, A_RESID, A_LN1, A_RSTD1, A_Q, A_K, A_V, A_ATTY, A_LSE, A_RESID2, A_LN2, A_RSTD2,
    A_GATE, A_UP, A_H, A_LNF, A_RSTDF, A_LOGITS, A_LOSSES, A_DRESID, A_DLN, A_DATTY, A_DQ,
    A_DK, A_DV, A_DH, A_DGATE, A_DUP, A_ATT_SCRATCH, A_COS, A_SIN, A_TOKENS, A_TARGETS,
    A_WEIGHTS, A_POS,
    A_LORA_U,   /* LoRA: (alpha/r) A x of each adapted projection [Ls][targets][BT, r] */
    A_LORA_TMP, /* LoRA: B u before it joins the projection [BT, widest output] */
    A_LORA_DU,  /* LoRA: d u [BT, r] */
    A_COUNT
};

/* The projections LoRA may adapt, in block order (model_lora.h). */
enum { P_Q, P_K, P_V, P_O, P_G, P_U, P_D, P_COUNT };
static const char *const proj_names[P_COUNT] = {
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "mlp.gate_proj.weight",    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
};

/* Floats of each array for B x T (saturated); bytes of all of them, each
 * rounded up to 16 floats (64-byte aligned). */
static uint64_t act_counts(const model_config *c, int B, int T, int recompute, uint64_t *cnt)
{
    uint64_t BT = acc_sat_mul_u64((uint64_t)B, (uint64_t)T), C = (uint64_t)c->channels;
    uint64_t L = (uint64_t)c->n_layer, NH = (uint64_t)c->n_head, hs = (uint64_t)head_dim(c);
    uint64_t Ls = recompute ? 1 : L;
    uint64_t QD = NH * hs, KD = (uint64_t)kv_heads(c) * hs, I = (uint64_t)c->intermediate_size;
    uint64_t btc = acc_sat_mul_u64(BT, C), btq = acc_sat_mul_u64(BT, QD);
    uint64_t btk = acc_sat_mul_u64(BT, KD), bti = acc_sat_mul_u64(BT, I);
    uint64_t rope = acc_sat_mul_u64((uint64_t)T, hs / 2);
    uint64_t R = (uint64_t)c->lora.r, wide = C > QD ? C : QD;
    wide = I > wide ? I : wide;
    uint64_t btr = acc_sat_mul_u64(BT, R);
    uint64_t per[A_COUNT] = {
        [A_ENC] = btc, [A_RESID] = acc_sat_mul_u64(L, btc),
        [A_LN1] = acc_sat_mul_u64(Ls, btc), [A_RSTD1] = acc_sat_mul_u64(Ls, BT),
        [A_Q] = acc_sat_mul_u64(Ls, btq), [A_K] = acc_sat_mul_u64(Ls, btk),
        [A_V] = acc_sat_mul_u64(Ls, btk), [A_ATTY] = acc_sat_mul_u64(Ls, btq),
        [A_LSE] = acc_sat_mul3_u64(Ls, BT, NH), [A_RESID2] = acc_sat_mul_u64(Ls, btc),
        [A_LN2] = acc_sat_mul_u64(Ls, btc), [A_RSTD2] = acc_sat_mul_u64(Ls, BT),
        [A_GATE] = acc_sat_mul_u64(Ls, bti), [A_UP] = acc_sat_mul_u64(Ls, bti),
        [A_H] = acc_sat_mul_u64(Ls, bti),
        [A_LNF] = btc, [A_RSTDF] = BT,
        [A_LOGITS] = acc_sat_mul_u64(BT, (uint64_t)c->padded_vocab_size), [A_LOSSES] = BT,
        [A_DRESID] = btc, [A_DLN] = btc, [A_DATTY] = btq, [A_DQ] = btq, [A_DK] = btk,
        [A_DV] = btk, [A_DH] = bti, [A_DGATE] = bti, [A_DUP] = bti,
        [A_ATT_SCRATCH] = acc_sat_mul3_u64(2 * NH, (uint64_t)T, (uint64_t)T),
        [A_COS] = rope, [A_SIN] = rope,
        [A_TOKENS] = BT, [A_TARGETS] = BT, [A_WEIGHTS] = BT,
        [A_POS] = BT, /* packed documents' positions (m->positions) */
        [A_LORA_U] = acc_sat_mul3_u64(Ls, (uint64_t)c->lora.n_targets, btr),
        [A_LORA_TMP] = R > 0 ? acc_sat_mul_u64(BT, wide) : 0,
        [A_LORA_DU] = btr,
    };
    uint64_t total = 0;
    for (int i = 0; i < A_COUNT; i++) {
        cnt[i] = per[i];
        total = acc_sat_add_u64(total, acc_sat_round_up_u64(per[i], 16));
    }
    return acc_sat_mul_u64(total, sizeof(float));
}

static int llama_act_bytes(const model_config *cfg, int B, int T, int recompute, uint64_t *bytes,
                           acc_err *err)
{
    uint64_t cnt[A_COUNT];
    *bytes = act_counts(cfg, B, T, recompute, cnt);
    if (*bytes != ACC_SIZE_OVERFLOW && *bytes <= SIZE_MAX && (uint64_t)B * (uint64_t)T <= INT32_MAX)
        return 0;
    int one = act_counts(cfg, 1, T, recompute, cnt) == ACC_SIZE_OVERFLOW;
    return acc_err_set(err, ACC_EINVAL, one ? "model.seq_len" : "train_micro_batch_size_per_gpu",
                       "the activations for micro batch %d x seq_len %d overflow sizes", B, T);
}

static void llama_gemm_extent(const model_config *c, uint64_t n, model_gemm_extent *out)
{
    uint64_t C = (uint64_t)c->channels, vp = (uint64_t)c->padded_vocab_size;
    uint64_t QD = (uint64_t)c->n_head * (uint64_t)head_dim(c), I = (uint64_t)c->intermediate_size;
    uint64_t in = C > I ? C : I; /* widest input of a projection */
    in = QD > in ? QD : in;
    uint64_t wide = vp > in ? vp : in; /* widest output (the logits) or input */
    /* A side: N x the widest operand; B side: the largest weight (vocab, MLP,
     * attention) or a projection's input for its weight gradient */
    uint64_t b = acc_sat_mul_u64(vp, C), w = acc_sat_mul_u64(I, C), q = acc_sat_mul_u64(QD, C);
    uint64_t x = acc_sat_mul_u64(n, in);
    b = w > b ? w : b;
    b = q > b ? q : b;
    b = x > b ? x : b;
    uint64_t R = (uint64_t)c->lora.r; /* the adapters: A [r, in], B [out, r], u [n, r] */
    uint64_t ra = acc_sat_mul_u64(R, wide);
    b = ra > b ? ra : b;
    wide = R > wide ? R : wide;
    out->a_elems = acc_sat_mul_u64(n, wide);
    out->b_elems = b;
}

typedef struct layer_off {
    size_t ln1, wq, bq, wk, bk, wv, bv, wo, bo, ln2, wg, wu, wd;
    size_t la[P_COUNT], lb[P_COUNT]; /* LoRA adapters A, B of each projection (NONE) */
} layer_off;

typedef struct llama_acts {
    float *ptr[A_COUNT];
} llama_acts;

typedef struct llama_state {
    size_t emb, norm, head; /* head: emb when tied */
    layer_off *lo;          /* [L] */
    void *act_mem;
    llama_acts a;
    int slot[P_COUNT];      /* LoRA: the projection's place among a block's adapters */
    int packed;             /* the last forward had m->positions (A_POS holds them) */
} llama_state;

static llama_state *S(const model *m)
{
    return m->impl;
}

static size_t off_of(const model *m, const char *name)
{
    const model_tensor *t = model_layout_find(&m->layout, name);
    return t ? t->offset : NONE;
}

static int llama_create(model *m, acc_err *err)
{
    llama_state *s = calloc(1, sizeof *s);
    if (s != NULL)
        s->lo = calloc((size_t)m->cfg.n_layer, sizeof *s->lo);
    if (s == NULL || s->lo == NULL) {
        free(s);
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory");
    }
    s->emb = off_of(m, "model.embed_tokens.weight");
    s->norm = off_of(m, "model.norm.weight");
    s->head = m->cfg.tie_word_embeddings ? s->emb : off_of(m, "lm_head.weight");
    char n[MODEL_NAME_MAX];
#define OFF(field, suffix)                                                       \
    do {                                                                         \
        snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix);                  \
        s->lo[l].field = off_of(m, n);                                           \
    } while (0)
    for (int l = 0; l < m->cfg.n_layer; l++) {
        OFF(ln1, "input_layernorm.weight");
        OFF(wq, "self_attn.q_proj.weight");
        OFF(bq, "self_attn.q_proj.bias");
        OFF(wk, "self_attn.k_proj.weight");
        OFF(bk, "self_attn.k_proj.bias");
        OFF(wv, "self_attn.v_proj.weight");
        OFF(bv, "self_attn.v_proj.bias");
        OFF(wo, "self_attn.o_proj.weight");
        OFF(bo, "self_attn.o_proj.bias");
        OFF(ln2, "post_attention_layernorm.weight");
        OFF(wg, "mlp.gate_proj.weight");
        OFF(wu, "mlp.up_proj.weight");
        OFF(wd, "mlp.down_proj.weight");
        for (int p = 0; p < P_COUNT; p++) {
            snprintf(n, sizeof n, "model.layers.%d.%s", l, proj_names[p]);
            model_lora_find(m, n, &s->lo[l].la[p], &s->lo[l].lb[p]);
        }
    }
#undef OFF
    for (int p = 0, k = 0; p < P_COUNT; p++)
        s->slot[p] = m->cfg.n_layer > 0 && s->lo[0].la[p] != NONE ? k++ : -1;
    m->impl = s;
    return 0;
}

static void llama_destroy(model *m)
{
    llama_state *s = S(m);
    if (s != NULL)
        free(s->lo);
    free(s);
    m->impl = NULL;
}

static void llama_acts_free(model *m)
{
    llama_state *s = S(m);
    if (s == NULL)
        return;
    if (s->act_mem != NULL)
        m->dev->ops->free(m->dev, s->act_mem);
    s->act_mem = NULL;
    memset(&s->a, 0, sizeof s->a);
}

static int upload_rope(model *m, acc_err *err)
{
    int hs = head_dim(&m->cfg);
    size_t n = KERN_ROPE_TABLE(m->T, hs);
    float *cs = malloc(2 * n * sizeof *cs + 1);
    if (cs == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory for the rotary tables");
    kern_rope_cfg r;
    rope_cfg(&m->cfg, &r);
    int rc = kern_rope_table(&r, m->T, hs, cs, cs + n, err);
    if (rc == 0) {
        m->dev->ops->upload(m->dev, S(m)->a.ptr[A_COS], cs, n * sizeof *cs);
        m->dev->ops->upload(m->dev, S(m)->a.ptr[A_SIN], cs + n, n * sizeof *cs);
    }
    free(cs);
    return rc;
}

static int llama_acts_alloc(model *m, acc_err *err)
{
    llama_state *s = S(m);
    size_t bytes = (size_t)m->act_bytes; /* checked by act_bytes */
    int rc = kern_llama_ops_check(m->dev, err);
    if (rc == 0)
        rc = m->dev->ops->alloc(m->dev, bytes, &s->act_mem, err);
    if (rc != 0) {
        s->act_mem = NULL;
        return rc;
    }
    m->dev->ops->zero(m->dev, s->act_mem, bytes);
    uint64_t cnt[A_COUNT];
    act_counts(&m->cfg, m->B, m->T, m->recompute, cnt);
    char *p = s->act_mem;
    for (int i = 0; i < A_COUNT; i++) {
        s->a.ptr[i] = (float *)p;
        p += (cnt[i] + 15) / 16 * 16 * sizeof(float);
    }
    rc = upload_rope(m, err);
    if (rc != 0)
        llama_acts_free(m);
    return rc;
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

/* ---- forward / backward */

typedef struct block_acts {
    float *ln1, *rstd1, *q, *k, *v, *atty, *lse, *resid2, *ln2, *rstd2, *gate, *up, *h, *out;
} block_acts;

static block_acts block_at(const model *m, int l)
{
    float *const *a = S(m)->a.ptr;
    const model_config *c = &m->cfg;
    size_t bt = (size_t)m->B * m->T, C = (size_t)c->channels, hs = (size_t)head_dim(c);
    size_t QD = (size_t)c->n_head * hs, KD = (size_t)kv_heads(c) * hs;
    size_t I = (size_t)c->intermediate_size, s = m->recompute ? 0 : (size_t)l;
    block_acts b = {
        .ln1 = a[A_LN1] + s * bt * C, .rstd1 = a[A_RSTD1] + s * bt,
        .q = a[A_Q] + s * bt * QD, .k = a[A_K] + s * bt * KD, .v = a[A_V] + s * bt * KD,
        .atty = a[A_ATTY] + s * bt * QD, .lse = a[A_LSE] + s * bt * (size_t)c->n_head,
        .resid2 = a[A_RESID2] + s * bt * C, .ln2 = a[A_LN2] + s * bt * C,
        .rstd2 = a[A_RSTD2] + s * bt, .gate = a[A_GATE] + s * bt * I, .up = a[A_UP] + s * bt * I,
        .h = a[A_H] + s * bt * I, .out = a[A_RESID] + (size_t)l * bt * C,
    };
    return b;
}

static float *block_input(const model *m, int l)
{
    size_t bt = (size_t)m->B * m->T;
    float *const *a = S(m)->a.ptr;
    return l == 0 ? a[A_ENC] : a[A_RESID] + (size_t)(l - 1) * bt * m->cfg.channels;
}

/* The fp32 weights of the tensor at `off` for the next op (model_weight:
 * a frozen 16-bit base tensor is widened into the fetch scratch). */
static const float *weight_of(model *m, size_t off)
{
    return model_weight(m, off, 0);
}

/* A bias (NULL when absent), fetched into the second slot so the matrix
 * it goes with stays valid. */
static const float *bias_of(model *m, size_t off)
{
    return off == NONE ? NULL : model_weight(m, off, 1);
}

/* Packed documents: the positions on the device, else NULL (p = t). */
static const int *positions_of(const model *m)
{
    return S(m)->packed ? (const int *)S(m)->a.ptr[A_POS] : NULL;
}

/* The gradient of the tensor at `off`; NULL when it has none (absent, or
 * frozen under LoRA: past m->ngrad) so the kernels skip it. */
static float *G(const model *m, size_t off)
{
    return off == NONE || off >= m->ngrad ? NULL : m->grads + off;
}

/* u = (alpha/r) A x of projection p in block l, kept for the backward. */
static float *lora_u(const model *m, int l, int p)
{
    const llama_state *s = S(m);
    size_t bt = (size_t)m->B * m->T, r = (size_t)m->cfg.lora.r;
    size_t layer = m->recompute ? 0 : (size_t)l;
    return s->a.ptr[A_LORA_U] +
           (layer * (size_t)m->cfg.lora.n_targets + (size_t)s->slot[p]) * bt * r;
}

/* y[N,out] += B u, u = (alpha/r) A x[N,in]: projection p's adapter (none:
 * nothing), from existing matmul ops so every backend has it. */
static void lora_fwd(model *m, int l, int p, float *y, const float *x, int N, int in, int out)
{
    const layer_off *o = &S(m)->lo[l];
    if (o->la[p] == NONE)
        return;
    kern_device *d = m->dev;
    int r = m->cfg.lora.r;
    float *u = lora_u(m, l, p), *tmp = S(m)->a.ptr[A_LORA_TMP];
    d->ops->matmul_fwd(d, u, x, m->params + o->la[p], NULL, N, in, r);
    d->ops->scale(d, u, model_lora_scale(&m->cfg), (size_t)N * r);
    d->ops->matmul_fwd(d, tmp, u, m->params + o->lb[p], NULL, N, r, out);
    d->ops->add(d, y, y, tmp, (size_t)N * out);
}

/* The adapter's backward from dy[N,out]: dB += dy^T u, du = (alpha/r) dy B,
 * dA += du^T x, dx += du A. */
static void lora_bwd(model *m, int l, int p, float *dx, const float *dy, const float *x, int N,
                     int in, int out)
{
    const layer_off *o = &S(m)->lo[l];
    if (o->la[p] == NONE)
        return;
    kern_device *d = m->dev;
    int r = m->cfg.lora.r;
    float *du = S(m)->a.ptr[A_LORA_DU];
    d->ops->zero(d, du, (size_t)N * r * sizeof(float));
    d->ops->matmul_bwd(d, du, G(m, o->lb[p]), NULL, dy, lora_u(m, l, p), m->params + o->lb[p],
                       N, r, out);
    d->ops->scale(d, du, model_lora_scale(&m->cfg), (size_t)N * r);
    d->ops->matmul_bwd(d, dx, G(m, o->la[p]), NULL, du, x, m->params + o->la[p], N, in, r);
}

static void block_forward(model *m, int l, int B)
{
    kern_device *d = m->dev;
    const kern_ops *k = d->ops;
    const model_config *c = &m->cfg;
    float *const *a = S(m)->a.ptr;
    const layer_off *o = &S(m)->lo[l];
    int T = m->T, C = c->channels, NH = c->n_head, NKV = kv_heads(c), hs = head_dim(c);
    int QD = NH * hs, KD = NKV * hs, I = c->intermediate_size, N = B * T;
    float *x = block_input(m, l), *tmp = a[A_DLN];
    block_acts b = block_at(m, l);
    k->rmsnorm_fwd(d, b.ln1, b.rstd1, x, weight_of(m, o->ln1), (float)c->norm_eps, N, C);
    k->matmul_fwd(d, b.q, b.ln1, weight_of(m, o->wq), bias_of(m, o->bq), N, C, QD);
    lora_fwd(m, l, P_Q, b.q, b.ln1, N, C, QD);
    k->matmul_fwd(d, b.k, b.ln1, weight_of(m, o->wk), bias_of(m, o->bk), N, C, KD);
    lora_fwd(m, l, P_K, b.k, b.ln1, N, C, KD);
    k->matmul_fwd(d, b.v, b.ln1, weight_of(m, o->wv), bias_of(m, o->bv), N, C, KD);
    lora_fwd(m, l, P_V, b.v, b.ln1, N, C, KD);
    const int *pos = positions_of(m);
    k->rope_fwd(d, b.q, b.q, a[A_COS], a[A_SIN], pos, B, T, NH, hs);
    k->rope_fwd(d, b.k, b.k, a[A_COS], a[A_SIN], pos, B, T, NKV, hs);
    if (pos != NULL)
        k->gqa_attention_pos_fwd(d, b.atty, b.lse, a[A_ATT_SCRATCH], b.q, b.k, b.v, pos, B, T, NH, NKV,
                                 hs);
    else
        k->gqa_attention_fwd(d, b.atty, b.lse, a[A_ATT_SCRATCH], b.q, b.k, b.v, B, T, NH, NKV, hs);
    k->matmul_fwd(d, tmp, b.atty, weight_of(m, o->wo), bias_of(m, o->bo), N, QD, C);
    lora_fwd(m, l, P_O, tmp, b.atty, N, QD, C);
    k->add(d, b.resid2, x, tmp, (size_t)N * C);
    k->rmsnorm_fwd(d, b.ln2, b.rstd2, b.resid2, weight_of(m, o->ln2), (float)c->norm_eps, N, C);
    k->matmul_fwd(d, b.gate, b.ln2, weight_of(m, o->wg), NULL, N, C, I);
    lora_fwd(m, l, P_G, b.gate, b.ln2, N, C, I);
    k->matmul_fwd(d, b.up, b.ln2, weight_of(m, o->wu), NULL, N, C, I);
    lora_fwd(m, l, P_U, b.up, b.ln2, N, C, I);
    k->swiglu_fwd(d, b.h, b.gate, b.up, (size_t)N * I);
    k->matmul_fwd(d, tmp, b.h, weight_of(m, o->wd), NULL, N, I, C);
    lora_fwd(m, l, P_D, tmp, b.h, N, I, C);
    k->add(d, b.out, b.resid2, tmp, (size_t)N * C);
}

static void llama_forward(model *m, const int *tokens, const int *targets, const float *weights,
                          int nseq, int want_grad, double *loss_sum)
{
    kern_device *d = m->dev;
    const kern_ops *k = d->ops;
    llama_state *s = S(m);
    float *const *a = s->a.ptr;
    int B = nseq, T = m->T, C = m->cfg.channels, L = m->cfg.n_layer, N = B * T;
    int Vp = m->cfg.padded_vocab_size;
    k->upload(d, a[A_TOKENS], tokens, (size_t)N * sizeof(int));
    k->upload(d, a[A_TARGETS], targets, (size_t)N * sizeof(int));
    k->upload(d, a[A_WEIGHTS], weights, (size_t)N * sizeof(float));
    s->packed = m->positions != NULL;
    if (s->packed)
        k->upload(d, a[A_POS], m->positions, (size_t)N * sizeof(int));
    k->embed_fwd(d, a[A_ENC], (const int *)a[A_TOKENS], weight_of(m, s->emb), N, C);
    for (int l = 0; l < L; l++)
        block_forward(m, l, B);
    k->rmsnorm_fwd(d, a[A_LNF], a[A_RSTDF], block_input(m, L), weight_of(m, s->norm),
                   (float)m->cfg.norm_eps, N, C);
    k->matmul_fwd(d, a[A_LOGITS], a[A_LNF], weight_of(m, s->head), NULL, N, C, Vp);
    k->xent(d, a[A_LOGITS], a[A_LOSSES], loss_sum, (const int *)a[A_TARGETS], a[A_WEIGHTS], N,
            m->cfg.vocab_size, Vp, want_grad);
}

/* dresid holds d(block output) on entry and d(block input) on exit. */
static void block_backward(model *m, int l, int B)
{
    kern_device *d = m->dev;
    const kern_ops *k = d->ops;
    const model_config *c = &m->cfg;
    float *const *a = S(m)->a.ptr;
    const layer_off *o = &S(m)->lo[l];
    int T = m->T, C = c->channels, NH = c->n_head, NKV = kv_heads(c), hs = head_dim(c);
    int QD = NH * hs, KD = NKV * hs, I = c->intermediate_size, N = B * T;
    size_t f = sizeof(float);
    float *x = block_input(m, l);
    float *dresid = a[A_DRESID], *dln = a[A_DLN];
    block_acts b = block_at(m, l);
    /* MLP: dresid = d(out) flows into down_proj and on to resid2 */
    k->zero(d, a[A_DH], (size_t)N * I * f);
    k->matmul_bwd(d, a[A_DH], G(m, o->wd), NULL, dresid, b.h, weight_of(m, o->wd), N, I, C);
    lora_bwd(m, l, P_D, a[A_DH], dresid, b.h, N, I, C);
    k->zero(d, a[A_DGATE], (size_t)N * I * f);
    k->zero(d, a[A_DUP], (size_t)N * I * f);
    k->swiglu_bwd(d, a[A_DGATE], a[A_DUP], a[A_DH], b.gate, b.up, (size_t)N * I);
    k->zero(d, dln, (size_t)N * C * f);
    k->matmul_bwd(d, dln, G(m, o->wg), NULL, a[A_DGATE], b.ln2, weight_of(m, o->wg), N, C, I);
    lora_bwd(m, l, P_G, dln, a[A_DGATE], b.ln2, N, C, I);
    k->matmul_bwd(d, dln, G(m, o->wu), NULL, a[A_DUP], b.ln2, weight_of(m, o->wu), N, C, I);
    lora_bwd(m, l, P_U, dln, a[A_DUP], b.ln2, N, C, I);
    k->rmsnorm_bwd(d, dresid, G(m, o->ln2), dln, b.resid2, weight_of(m, o->ln2), b.rstd2, N, C);
    /* attention: dresid is now d(resid2) */
    k->zero(d, a[A_DATTY], (size_t)N * QD * f);
    k->matmul_bwd(d, a[A_DATTY], G(m, o->wo), G(m, o->bo), dresid, b.atty, weight_of(m, o->wo), N, QD, C);
    lora_bwd(m, l, P_O, a[A_DATTY], dresid, b.atty, N, QD, C);
    k->zero(d, a[A_DQ], (size_t)N * QD * f);
    k->zero(d, a[A_DK], (size_t)N * KD * f);
    k->zero(d, a[A_DV], (size_t)N * KD * f);
    const int *pos = positions_of(m);
    if (pos != NULL)
        k->gqa_attention_pos_bwd(d, a[A_DQ], a[A_DK], a[A_DV], a[A_ATT_SCRATCH], a[A_DATTY], b.q, b.k,
                                 b.v, b.lse, b.atty, pos, B, T, NH, NKV, hs);
    else
        k->gqa_attention_bwd(d, a[A_DQ], a[A_DK], a[A_DV], a[A_ATT_SCRATCH], a[A_DATTY], b.q, b.k,
                             b.v, b.lse, b.atty, B, T, NH, NKV, hs);
    k->rope_bwd(d, a[A_DQ], a[A_DQ], a[A_COS], a[A_SIN], pos, B, T, NH, hs);
    k->rope_bwd(d, a[A_DK], a[A_DK], a[A_COS], a[A_SIN], pos, B, T, NKV, hs);
    k->zero(d, dln, (size_t)N * C * f);
    k->matmul_bwd(d, dln, G(m, o->wq), G(m, o->bq), a[A_DQ], b.ln1, weight_of(m, o->wq), N, C, QD);
    lora_bwd(m, l, P_Q, dln, a[A_DQ], b.ln1, N, C, QD);
    k->matmul_bwd(d, dln, G(m, o->wk), G(m, o->bk), a[A_DK], b.ln1, weight_of(m, o->wk), N, C, KD);
    lora_bwd(m, l, P_K, dln, a[A_DK], b.ln1, N, C, KD);
    k->matmul_bwd(d, dln, G(m, o->wv), G(m, o->bv), a[A_DV], b.ln1, weight_of(m, o->wv), N, C, KD);
    lora_bwd(m, l, P_V, dln, a[A_DV], b.ln1, N, C, KD);
    k->rmsnorm_bwd(d, dresid, G(m, o->ln1), dln, x, weight_of(m, o->ln1), b.rstd1, N, C);
}

static void llama_backward(model *m, int nseq, void (*done)(void *ctx, int layer), void *ctx)
{
    kern_device *d = m->dev;
    const kern_ops *k = d->ops;
    llama_state *s = S(m);
    float *const *a = s->a.ptr;
    int B = nseq, T = m->T, C = m->cfg.channels, L = m->cfg.n_layer, N = B * T;
    int Vp = m->cfg.padded_vocab_size;
    k->zero(d, a[A_DRESID], (size_t)N * C * sizeof(float));
    k->zero(d, a[A_DLN], (size_t)N * C * sizeof(float));
    /* logits hold dloss/dlogits (forward with want_grad) */
    k->matmul_bwd(d, a[A_DLN], G(m, s->head), NULL, a[A_LOGITS], a[A_LNF], weight_of(m, s->head), N, C, Vp);
    k->rmsnorm_bwd(d, a[A_DRESID], G(m, s->norm), a[A_DLN], block_input(m, L), weight_of(m, s->norm),
                   a[A_RSTDF], N, C);
    for (int l = L - 1; l >= 0; l--) {
        if (m->recompute) /* rebuild the block's inner activations (same bits) */
            block_forward(m, l, B);
        block_backward(m, l, B);
        if (done != NULL)
            done(ctx, l);
    }
    if (G(m, s->emb) != NULL) /* frozen under LoRA */
        k->embed_bwd(d, G(m, s->emb), a[A_DRESID], (const int *)a[A_TOKENS], N, C);
    if (done != NULL)
        done(ctx, -1);
}

const float *model_llama_logits(const model *m)
{
    if (m->family != &model_family_llama || S(m) == NULL || S(m)->act_mem == NULL)
        return NULL;
    return S(m)->a.ptr[A_LOGITS];
}

static const float *llama_token_losses(const model *m)
{
    return S(m) == NULL || S(m)->act_mem == NULL ? NULL : S(m)->a.ptr[A_LOSSES];
}

static const char *const llama_hf_types[] = {"llama", "mistral", "qwen2", NULL};

const model_family model_family_llama = {
    .name = "llama",
    .hf_model_types = llama_hf_types,
    .config_from_spec = llama_config_from_spec,
    .config_check = llama_check,
    .layout = llama_layout,
    .act_bytes = llama_act_bytes,
    .gemm_extent = llama_gemm_extent,
    .acts_alloc = llama_acts_alloc,
    .acts_free = llama_acts_free,
    .forward = llama_forward,
    .backward = llama_backward,
    .init_host = llama_init_host,
    .create = llama_create,
    .destroy = llama_destroy,
    .config_from_hf = llama_config_from_hf,
    .config_to_hf = llama_config_to_hf,
    .logits = model_llama_logits,
    .token_losses = llama_token_losses,
    .packing = true,
};
