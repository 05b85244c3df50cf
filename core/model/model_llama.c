/* model_llama: see model_llama.h. A family file: config.json mapping,
 * tensor names, and the composition of blocks.h's pieces. */
#include "model_llama.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#include "checked.h"
#include "rng.h"

#define VOCAB_PAD 64 /* rows of the embedding / lm_head rounded up to this */

/* ---- config */

static int head_dim(const model_config *c)
{
    return c->head_dim > 0 ? c->head_dim : (c->n_head > 0 ? c->channels / c->n_head : 0);
}

static int kv_heads(const model_config *c)
{
    return c->n_kv_head > 0 ? c->n_kv_head : c->n_head;
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
    blk_rope_cfg(c, &r);
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
    int rc = model_hf_int(hf, "num_hidden_layers", -1, &cfg->n_layer, err);
    if (rc == 0)
        rc = model_hf_int(hf, "num_attention_heads", -1, &cfg->n_head, err);
    if (rc == 0)
        rc = model_hf_int(hf, "num_key_value_heads", cfg->n_head, &cfg->n_kv_head, err);
    if (rc == 0)
        rc = model_hf_int(hf, "hidden_size", -1, &cfg->channels, err);
    if (rc == 0)
        rc = model_hf_int(hf, "head_dim", 0, &cfg->head_dim, err);
    if (rc == 0)
        rc = model_hf_int(hf, "intermediate_size", -1, &cfg->intermediate_size, err);
    if (rc == 0)
        rc = model_hf_int(hf, "vocab_size", -1, &cfg->vocab_size, err);
    if (rc == 0)
        rc = model_hf_int(hf, "max_position_embeddings", 2048, &cfg->max_seq_len, err);
    if (rc == 0)
        rc = model_hf_num(hf, "rms_norm_eps", 1e-6, &cfg->norm_eps, err);
    if (rc == 0)
        rc = model_hf_num(hf, "rope_theta", 10000.0, &cfg->rope_theta, err);
    if (rc == 0)
        rc = model_hf_bool(hf, "tie_word_embeddings", false, &cfg->tie_word_embeddings, err);
    if (rc == 0) /* Qwen2: q/k/v biases always; LLaMA: q/k/v/o when attention_bias */
        rc = model_hf_bool(hf, "attention_bias", qkv_only, &cfg->attention_bias, err);
    cfg->attention_out_bias = cfg->attention_bias && !qkv_only;
    if (rc == 0)
        rc = model_hf_bool(hf, "mlp_bias", false, &cfg->mlp_bias, err);
    if (rc == 0)
        rc = rope_from_hf(hf, cfg, err);
    const char *act = json_string_value(json_object_get(hf, "hidden_act"));
    if (rc == 0 && act != NULL && strcmp(act, "silu") != 0)
        rc = acc_err_set(err, ACC_EINVAL, "model.from",
                         "config.json: hidden_act %s is not supported (silu)", act);
    if (rc == 0)
        rc = model_hf_bool(hf, "use_sliding_window", false, &sliding, err);
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
    const model_hf_name *row = model_hf_name_of(c->model_type);
    row = row != NULL ? row : &model_family_llama.hf_names[0];
    int bad = 0;
#define SET(key, value) (bad |= json_object_set_new(hf, key, value) != 0)
    SET("architectures", json_pack("[s]", row->architecture));
    SET("model_type", json_string(row->model_type));
    SET("num_hidden_layers", json_integer(c->n_layer));
    SET("num_attention_heads", json_integer(c->n_head));
    SET("num_key_value_heads", json_integer(kv_heads(c)));
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

/* ---- layout: Hugging Face names, one block's tensors contiguous */

static int llama_layout(const model_config *c, model_layout *out, acc_err *err)
{
    int64_t C = c->channels, V = c->vocab_size, I = c->intermediate_size;
    int64_t QD = (int64_t)c->n_head * head_dim(c), KD = (int64_t)kv_heads(c) * head_dim(c);
    int cap = 0, rc;
    const char *f = "model.n_embd";
    char n[MODEL_NAME_MAX];
    if ((uint64_t)c->padded_vocab_size > SIZE_MAX / (uint64_t)C)
        return acc_err_set(err, ACC_EINVAL, "model.vocab_size", "the embedding overflows sizes");
    size_t vrows = (size_t)c->padded_vocab_size * (size_t)C;
    int64_t emb[2] = {V, C}, vecC[1] = {C};
    int64_t qb = c->attention_bias ? QD : 0, kb = c->attention_bias ? KD : 0;
    rc = model_layout_add(out, &cap, "model.embed_tokens.weight", -1, 2, emb, vrows, true, true,
                          false, f, err);
    for (int l = 0; rc == 0 && l < c->n_layer; l++) {
        const struct { const char *name; int64_t r, k; } t[] = {
            {"input_layernorm.weight", C, 0},
            {"self_attn.q_proj.weight", QD, C}, {"self_attn.q_proj.bias", qb, -1},
            {"self_attn.k_proj.weight", KD, C}, {"self_attn.k_proj.bias", kb, -1},
            {"self_attn.v_proj.weight", KD, C}, {"self_attn.v_proj.bias", kb, -1},
            {"self_attn.o_proj.weight", C, QD},
            {"self_attn.o_proj.bias", c->attention_out_bias ? C : 0, -1},
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

/* ---- activations: every block's (stored) or one block's (recompute) */

enum {
    A_ENC, A_RESID, A_LN1, A_RSTD1, A_Q, A_K, A_V, A_ATTY, A_LSE, A_RESID2, A_LN2, A_RSTD2,
    A_GATE, A_UP, A_H, A_LNF, A_RSTDF, A_LOGITS, A_LOSSES, A_DRESID, A_DLN, A_DATTY, A_DQ,
    A_DK, A_DV, A_DH, A_DGATE, A_DUP, A_ATT_SCRATCH, A_COS, A_SIN, A_TOKENS, A_TARGETS,
    A_WEIGHTS, A_POS, A_LORA_U, A_LORA_TMP, A_LORA_DU, A_COUNT
};

static uint64_t act_counts(const model_config *c, int B, int T, int recompute, uint64_t *cnt)
{
    uint64_t BT = acc_sat_mul_u64((uint64_t)B, (uint64_t)T), C = (uint64_t)c->channels;
    uint64_t L = (uint64_t)c->n_layer, NH = (uint64_t)c->n_head, hs = (uint64_t)head_dim(c);
    uint64_t Ls = recompute ? 1 : L;
    uint64_t QD = NH * hs, KD = (uint64_t)kv_heads(c) * hs, I = (uint64_t)c->intermediate_size;
    uint64_t btc = acc_sat_mul_u64(BT, C), btq = acc_sat_mul_u64(BT, QD);
    uint64_t btk = acc_sat_mul_u64(BT, KD), bti = acc_sat_mul_u64(BT, I);
    uint64_t R = (uint64_t)c->lora.r, wide = C > QD ? C : QD, btr = acc_sat_mul_u64(BT, R);
    wide = I > wide ? I : wide;
    uint64_t per[A_COUNT] = {
        [A_ENC] = btc, [A_RESID] = acc_sat_mul_u64(L, btc),
        [A_LN1] = acc_sat_mul_u64(Ls, btc), [A_RSTD1] = acc_sat_mul_u64(Ls, BT),
        [A_Q] = acc_sat_mul_u64(Ls, btq), [A_K] = acc_sat_mul_u64(Ls, btk),
        [A_V] = acc_sat_mul_u64(Ls, btk), [A_ATTY] = acc_sat_mul_u64(Ls, btq),
        [A_LSE] = acc_sat_mul3_u64(Ls, BT, NH), [A_RESID2] = acc_sat_mul_u64(Ls, btc),
        [A_LN2] = acc_sat_mul_u64(Ls, btc), [A_RSTD2] = acc_sat_mul_u64(Ls, BT),
        [A_GATE] = acc_sat_mul_u64(Ls, bti), [A_UP] = acc_sat_mul_u64(Ls, bti),
        [A_H] = acc_sat_mul_u64(Ls, bti), [A_LNF] = btc, [A_RSTDF] = BT,
        [A_LOGITS] = acc_sat_mul_u64(BT, (uint64_t)c->padded_vocab_size), [A_LOSSES] = BT,
        [A_DRESID] = btc, [A_DLN] = btc, [A_DATTY] = btq, [A_DQ] = btq, [A_DK] = btk,
        [A_DV] = btk, [A_DH] = bti, [A_DGATE] = bti, [A_DUP] = bti,
        [A_ATT_SCRATCH] = acc_sat_mul3_u64(2 * NH, (uint64_t)T, (uint64_t)T),
        [A_COS] = blk_rope_floats(T, (int)hs), [A_SIN] = blk_rope_floats(T, (int)hs),
        [A_TOKENS] = BT, [A_TARGETS] = BT, [A_WEIGHTS] = BT, [A_POS] = BT,
        [A_LORA_U] = acc_sat_mul3_u64(Ls, (uint64_t)blk_lora_per_layer(c), btr),
        [A_LORA_TMP] = R > 0 ? acc_sat_mul_u64(BT, wide) : 0, [A_LORA_DU] = btr,
    };
    memcpy(cnt, per, sizeof per);
    return blk_acts_bytes(cnt, A_COUNT);
}

static int llama_act_bytes(const model_config *cfg, int B, int T, int recompute, uint64_t *bytes,
                           acc_err *err)
{
    uint64_t cnt[A_COUNT];
    *bytes = act_counts(cfg, B, T, recompute, cnt);
    return blk_acts_check(*bytes, act_counts(cfg, 1, T, recompute, cnt) == ACC_SIZE_OVERFLOW, B,
                          T, err);
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

/* ---- the composition */

typedef struct llama_block {
    blk_norm ln1, ln2;
    blk_linear q, k, v, o;
    blk_ffn ffn;
} llama_block;

typedef struct llama_state {
    blk_embed emb;
    blk_norm norm;
    blk_head head;
    blk_rope rope;
    blk_attn attn;
    llama_block *blk; /* [L] */
    void *mem;
    float *a[A_COUNT];
    int lora_per_layer; /* adapted linears per block (blk_lora_per_layer) */
    int packed;       /* the last forward had m->positions (A_POS holds them) */
} llama_state;

static llama_state *S(const model *m)
{
    return m->impl;
}

static int llama_create(model *m, acc_err *err)
{
    const model_config *c = &m->cfg;
    llama_state *s = calloc(1, sizeof *s);
    if (s != NULL)
        s->blk = calloc((size_t)c->n_layer, sizeof *s->blk);
    if (s == NULL || s->blk == NULL) {
        free(s);
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory");
    }
    int C = c->channels, hs = head_dim(c), QD = c->n_head * hs, KD = kv_heads(c) * hs;
    int I = c->intermediate_size;
    float eps = (float)c->norm_eps;
    s->emb = (blk_embed){.wte = blk_off(m, "model.embed_tokens.weight", 0), .wpe = BLK_NONE, .C = C};
    s->norm = (blk_norm){BLK_RMSNORM, blk_off(m, "model.norm.weight", 0), BLK_NONE, eps, C};
    s->head = (blk_head){.w = c->tie_word_embeddings ? s->emb.wte : blk_off(m, "lm_head.weight", 0),
                         .C = C, .V = c->vocab_size, .Vp = c->padded_vocab_size};
    s->rope.hs = hs;
    s->attn = (blk_attn){.NH = c->n_head, .NKV = kv_heads(c), .hs = hs};
    for (int l = 0; l < c->n_layer; l++) {
        llama_block *b = &s->blk[l];
        int slots = 0; /* LoRA: in block order, as the adapters' activations are laid out */
        b->ln1 = (blk_norm){BLK_RMSNORM, blk_off(m, "model.layers.%d.input_layernorm.weight", l),
                            BLK_NONE, eps, C};
        b->ln2 = (blk_norm){BLK_RMSNORM,
                            blk_off(m, "model.layers.%d.post_attention_layernorm.weight", l),
                            BLK_NONE, eps, C};
#define LIN(dst, mod, in, out)                                                                \
    blk_linear_init(m, dst, "model.layers.%d." mod ".weight", "model.layers.%d." mod ".bias", l, \
                    in, out, &slots)
        LIN(&b->q, "self_attn.q_proj", C, QD);
        LIN(&b->k, "self_attn.k_proj", C, KD);
        LIN(&b->v, "self_attn.v_proj", C, KD);
        LIN(&b->o, "self_attn.o_proj", QD, C);
        LIN(&b->ffn.gate, "mlp.gate_proj", C, I);
        LIN(&b->ffn.up, "mlp.up_proj", C, I);
        LIN(&b->ffn.down, "mlp.down_proj", I, C);
#undef LIN
        b->ffn.act = BLK_SILU;
        b->ffn.I = I;
    }
    s->lora_per_layer = blk_lora_per_layer(c);
    m->impl = s;
    return 0;
}

static void llama_destroy(model *m)
{
    if (S(m) != NULL)
        free(S(m)->blk);
    free(S(m));
    m->impl = NULL;
}

static void llama_acts_free(model *m)
{
    if (S(m) != NULL)
        blk_acts_free(m, &S(m)->mem, S(m)->a, A_COUNT);
}

static int llama_acts_alloc(model *m, acc_err *err)
{
    llama_state *s = S(m);
    uint64_t cnt[A_COUNT];
    act_counts(&m->cfg, m->B, m->T, m->recompute, cnt);
    int rc = kern_llama_ops_check(m->dev, err);
    if (rc == 0)
        rc = blk_acts_alloc(m, cnt, A_COUNT, &s->mem, s->a, err);
    if (rc != 0)
        return rc;
    s->rope.cos = s->a[A_COS];
    s->rope.sin = s->a[A_SIN];
    if ((rc = blk_rope_upload(m, &s->rope, err)) != 0)
        llama_acts_free(m);
    return rc;
}

/* A run of nseq sequences over the activations (the forward's positions). */
static blk_run run_of(model *m, int nseq)
{
    llama_state *s = S(m);
    blk_run r = blk_run_of(m, nseq);
    r.pos = s->packed ? (const int *)s->a[A_POS] : NULL;
    r.lora = (blk_lora_acts){s->a[A_LORA_U], s->a[A_LORA_TMP], s->a[A_LORA_DU],
                             S(m)->lora_per_layer};
    return r;
}

/* Block l's kept activations (slot 0 in recompute mode) and its input. */
typedef struct block_acts {
    float *x, *ln1, *rstd1, *q, *k, *v, *atty, *lse, *resid2, *ln2, *rstd2, *out;
    blk_ffn_acts ffn;
} block_acts;

static block_acts block_at(const model *m, int l)
{
    float *const *a = S(m)->a;
    const model_config *c = &m->cfg;
    size_t bt = (size_t)m->B * m->T, C = (size_t)c->channels, hs = (size_t)head_dim(c);
    size_t QD = (size_t)c->n_head * hs, KD = (size_t)kv_heads(c) * hs;
    size_t I = (size_t)c->intermediate_size, s = m->recompute ? 0 : (size_t)l;
    return (block_acts){
        .x = l == 0 ? a[A_ENC] : a[A_RESID] + (size_t)(l - 1) * bt * C,
        .ln1 = a[A_LN1] + s * bt * C, .rstd1 = a[A_RSTD1] + s * bt,
        .q = a[A_Q] + s * bt * QD, .k = a[A_K] + s * bt * KD, .v = a[A_V] + s * bt * KD,
        .atty = a[A_ATTY] + s * bt * QD, .lse = a[A_LSE] + s * bt * (size_t)c->n_head,
        .resid2 = a[A_RESID2] + s * bt * C, .ln2 = a[A_LN2] + s * bt * C,
        .rstd2 = a[A_RSTD2] + s * bt, .out = a[A_RESID] + (size_t)l * bt * C,
        .ffn = {a[A_GATE] + s * bt * I, a[A_UP] + s * bt * I, a[A_H] + s * bt * I},
    };
}

static void block_forward(blk_run *r, int l)
{
    llama_state *s = S(r->m);
    const llama_block *b = &s->blk[l];
    block_acts x = block_at(r->m, l);
    float *tmp = s->a[A_DLN];
    blk_norm_fwd(r, &b->ln1, x.ln1, NULL, x.rstd1, x.x);
    blk_linear_fwd(r, l, &b->q, x.q, x.ln1);
    blk_linear_fwd(r, l, &b->k, x.k, x.ln1);
    blk_linear_fwd(r, l, &b->v, x.v, x.ln1);
    blk_rope_fwd(r, &s->rope, x.q, s->attn.NH);
    blk_rope_fwd(r, &s->rope, x.k, s->attn.NKV);
    blk_attn_fwd(r, &s->attn, x.atty, x.lse, s->a[A_ATT_SCRATCH], x.q, x.k, x.v);
    blk_linear_fwd(r, l, &b->o, tmp, x.atty);
    r->k->add(r->d, x.resid2, x.x, tmp, (size_t)r->N * b->o.out);
    blk_norm_fwd(r, &b->ln2, x.ln2, NULL, x.rstd2, x.resid2);
    blk_ffn_fwd(r, l, &b->ffn, &x.ffn, tmp, x.ln2);
    r->k->add(r->d, x.out, x.resid2, tmp, (size_t)r->N * b->o.out);
}

/* dresid holds d(block output) on entry and d(block input) on exit. */
static void block_backward(blk_run *r, int l)
{
    llama_state *s = S(r->m);
    float *const *a = s->a;
    const llama_block *b = &s->blk[l];
    block_acts x = block_at(r->m, l);
    size_t N = (size_t)r->N, f = sizeof(float);
    blk_ffn_grads fg = {a[A_DH], a[A_DGATE], a[A_DUP]};
    blk_ffn_bwd(r, l, &b->ffn, &x.ffn, &fg, a[A_DLN], a[A_DRESID], x.ln2);
    blk_norm_bwd(r, &b->ln2, a[A_DRESID], a[A_DLN], x.resid2, NULL, x.rstd2);
    /* attention: dresid is now d(resid2) */
    r->k->zero(r->d, a[A_DATTY], N * (size_t)b->o.in * f);
    blk_linear_bwd(r, l, &b->o, a[A_DATTY], a[A_DRESID], x.atty);
    r->k->zero(r->d, a[A_DQ], N * (size_t)b->q.out * f);
    r->k->zero(r->d, a[A_DK], N * (size_t)b->k.out * f);
    r->k->zero(r->d, a[A_DV], N * (size_t)b->v.out * f);
    blk_attn_bwd(r, &s->attn, a[A_DQ], a[A_DK], a[A_DV], a[A_ATT_SCRATCH], a[A_DATTY], x.q, x.k,
                 x.v, x.lse, x.atty);
    blk_rope_bwd(r, &s->rope, a[A_DQ], s->attn.NH);
    blk_rope_bwd(r, &s->rope, a[A_DK], s->attn.NKV);
    r->k->zero(r->d, a[A_DLN], N * (size_t)b->q.in * f);
    blk_linear_bwd(r, l, &b->q, a[A_DLN], a[A_DQ], x.ln1);
    blk_linear_bwd(r, l, &b->k, a[A_DLN], a[A_DK], x.ln1);
    blk_linear_bwd(r, l, &b->v, a[A_DLN], a[A_DV], x.ln1);
    blk_norm_bwd(r, &b->ln1, a[A_DRESID], a[A_DLN], x.x, NULL, x.rstd1);
}

/* The stack over the activations. */
static blk_stack stack_of(const model *m)
{
    llama_state *s = S(m);
    float *const *a = s->a;
    return (blk_stack){.emb = &s->emb, .norm = &s->norm, .head = &s->head, .L = m->cfg.n_layer,
                       .fwd = block_forward, .bwd = block_backward, .x0 = a[A_ENC],
                       .xL = block_at(m, m->cfg.n_layer).x, .lnf = a[A_LNF],
                       .lnf_rstd = a[A_RSTDF], .logits = a[A_LOGITS], .losses = a[A_LOSSES],
                       .dresid = a[A_DRESID], .dln = a[A_DLN]};
}

static void llama_forward(model *m, const int *tokens, const int *targets, const float *weights,
                          int nseq, int want_grad, double *loss_sum)
{
    float *const *a = S(m)->a;
    blk_run r = run_of(m, nseq);
    blk_inputs in = {(int *)a[A_TOKENS], (int *)a[A_TARGETS], a[A_WEIGHTS], (int *)a[A_POS]};
    blk_stack st = stack_of(m);
    S(m)->packed = m->positions != NULL; /* the backward reuses the forward's positions */
    blk_stack_forward(&r, &st, &in, tokens, targets, weights, want_grad, loss_sum);
}

static void llama_backward(model *m, int nseq, void (*done)(void *ctx, int layer), void *ctx)
{
    blk_run r = run_of(m, nseq);
    blk_stack st = stack_of(m);
    blk_stack_backward(&r, &st, (const int *)S(m)->a[A_TOKENS], done, ctx);
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
    if (m->family != &model_family_llama || S(m) == NULL || S(m)->mem == NULL)
        return NULL;
    return S(m)->a[A_LOGITS];
}

static const float *llama_token_losses(const model *m)
{
    return S(m) == NULL || S(m)->mem == NULL ? NULL : S(m)->a[A_LOSSES];
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
