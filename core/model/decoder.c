/* decoder: see decoder.h. */
#include "decoder.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "rng.h"

#define VOCAB_PAD 64 /* rows of the embedding / lm_head rounded up to this */

/* ---- config */

int dec_head_dim(const model_config *c)
{
    return c->head_dim > 0 ? c->head_dim : (c->n_head > 0 ? c->channels / c->n_head : 0);
}

int dec_kv_heads(const model_config *c)
{
    return c->n_kv_head > 0 ? c->n_kv_head : c->n_head;
}

bool dec_sliding(const model_config *c, int l)
{
    return c->sliding_window > 0 && l >= 0 && l < MODEL_MAX_SLIDING &&
           (c->sliding_layers[l / 64] >> (l % 64) & 1u);
}

int dec_check(const model_config *c, acc_err *err)
{
    if (c->n_layer < 1 || c->n_head < 1 || c->channels < 1 || c->max_seq_len < 1 ||
        c->intermediate_size < 1)
        return acc_err_set(err, ACC_EINVAL, "model",
                           "n_layer, n_head, n_embd, intermediate_size and seq_len must be >= 1");
    if (c->head_dim == 0 && c->channels % c->n_head != 0)
        return acc_err_set(err, ACC_EINVAL, "model.n_head",
                           "n_embd %d is not a multiple of n_head %d", c->channels, c->n_head);
    int hs = dec_head_dim(c), nkv = dec_kv_heads(c);
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
    if (c->sliding_window < 0 || c->attn_logit_softcapping < 0 ||
        c->final_logit_softcapping < 0 || c->query_pre_attn_scalar < 0)
        return acc_err_set(err, ACC_EINVAL, "model.sliding_window",
                           "sliding_window, the soft-capping values and query_pre_attn_scalar "
                           "must be >= 0");
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

int dec_round_vocab(int v)
{
    int64_t p = ((int64_t)v + VOCAB_PAD - 1) / VOCAB_PAD * VOCAB_PAD;
    return p > INT32_MAX ? v : (int)p;
}

int dec_config_from_spec(const spec_model *sm, model_config *cfg, acc_err *err)
{
    cfg->max_seq_len = sm->seq_len;
    cfg->vocab_size = sm->vocab_size;
    cfg->padded_vocab_size = sm->padded_vocab_size > 0 ? sm->padded_vocab_size
                                                       : dec_round_vocab(sm->vocab_size);
    cfg->n_layer = sm->n_layer;
    cfg->n_head = sm->n_head;
    cfg->channels = sm->n_embd;
    cfg->n_kv_head = sm->n_kv_head;
    cfg->intermediate_size = sm->intermediate_size > 0 ? sm->intermediate_size : 4 * sm->n_embd;
    if (cfg->norm_eps == 0)
        cfg->norm_eps = 1e-6;
    return dec_check(cfg, err);
}

int dec_config_from_hf(const json_t *hf, model_config *cfg, bool qkv_bias_only,
                       bool rope_scaling, acc_err *err)
{
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
    if (rc == 0) /* Qwen2: q/k/v biases always; the others: q/k/v/o when attention_bias */
        rc = model_hf_bool(hf, "attention_bias", qkv_bias_only, &cfg->attention_bias, err);
    cfg->attention_out_bias = cfg->attention_bias && !qkv_bias_only;
    if (rc == 0)
        rc = model_hf_bool(hf, "mlp_bias", false, &cfg->mlp_bias, err);
    const json_t *rs = json_object_get(hf, "rope_scaling");
    if (rc == 0 && !rope_scaling && rs != NULL && !json_is_null(rs))
        rc = acc_err_set(err, ACC_EINVAL, "model.from",
                         "config.json: rope_scaling is not supported for %s", cfg->model_type);
    cfg->padded_vocab_size = dec_round_vocab(cfg->vocab_size);
    return rc;
}

int dec_hf_act(const json_t *hf, const char *key, const char *want, acc_err *err)
{
    const char *act = json_string_value(json_object_get(hf, key));
    if (act != NULL && strcmp(act, want) != 0)
        return acc_err_set(err, ACC_EINVAL, "model.from",
                           "config.json: %s %s is not supported (%s)", key, act, want);
    return 0;
}

int dec_check_hf(int rc, const model_config *cfg, acc_err *err)
{
    if (rc == 0 && (rc = dec_check(cfg, err)) != 0 && err != NULL) {
        acc_err_prefix(err, "config.json (%s)", err->field);
        snprintf(err->field, sizeof err->field, "model.from");
    }
    return rc;
}

int dec_config_to_hf(const model_config *c, const char *arch, json_t *hf, acc_err *err)
{
    int bad = 0;
#define SET(key, value) (bad |= json_object_set_new(hf, key, value) != 0)
    SET("architectures", json_pack("[s]", arch));
    SET("model_type", json_string(c->model_type));
    SET("num_hidden_layers", json_integer(c->n_layer));
    SET("num_attention_heads", json_integer(c->n_head));
    SET("num_key_value_heads", json_integer(dec_kv_heads(c)));
    SET("hidden_size", json_integer(c->channels));
    SET("head_dim", json_integer(dec_head_dim(c)));
    SET("intermediate_size", json_integer(c->intermediate_size));
    SET("vocab_size", json_integer(c->vocab_size));
    SET("max_position_embeddings", json_integer(c->max_seq_len));
    SET("rms_norm_eps", json_real(c->norm_eps));
    SET("rope_theta", json_real(c->rope_theta > 0 ? c->rope_theta : 10000.0));
    SET("rope_scaling", json_null());
    SET("tie_word_embeddings", json_boolean(c->tie_word_embeddings));
    SET("attention_bias", json_boolean(c->attention_bias));
#undef SET
    return bad ? acc_err_set(err, ACC_ENOMEM, "", "out of host memory for config.json") : 0;
}

/* ---- layout: Hugging Face names in module order */

int dec_layout(const dec_desc *d, const model_config *c, model_layout *out, acc_err *err)
{
    int64_t C = c->channels, V = c->vocab_size, I = c->intermediate_size, hs = dec_head_dim(c);
    int64_t QD = (int64_t)c->n_head * hs, KD = (int64_t)dec_kv_heads(c) * hs;
    int cap = 0, rc;
    const char *f = "model.n_embd";
    char n[MODEL_NAME_MAX];
    if ((uint64_t)c->padded_vocab_size > SIZE_MAX / (uint64_t)C)
        return acc_err_set(err, ACC_EINVAL, "model.vocab_size", "the embedding overflows sizes");
    size_t vrows = (size_t)c->padded_vocab_size * (size_t)C;
    int64_t emb[2] = {V, C}, vecC[1] = {C};
    int64_t qb = c->attention_bias ? QD : 0, kb = c->attention_bias ? KD : 0;
    int64_t ob = c->attention_out_bias ? C : 0, qk = d->qk_norm ? hs : 0, sw = d->sandwich ? C : 0;
    rc = model_layout_add(out, &cap, "model.embed_tokens.weight", -1, 2, emb, vrows, true, true,
                          false, f, err);
    for (int l = 0; rc == 0 && l < c->n_layer; l++) {
        const struct { const char *name; int64_t r, k; } t[] = {
            {"input_layernorm.weight", C, 0},
            {"self_attn.q_proj.weight", QD, C}, {"self_attn.q_proj.bias", qb, 0},
            {"self_attn.k_proj.weight", KD, C}, {"self_attn.k_proj.bias", kb, 0},
            {"self_attn.v_proj.weight", KD, C}, {"self_attn.v_proj.bias", kb, 0},
            {"self_attn.o_proj.weight", C, QD}, {"self_attn.o_proj.bias", ob, 0},
            {"self_attn.q_norm.weight", qk, 0}, {"self_attn.k_norm.weight", qk, 0},
            {"post_attention_layernorm.weight", C, 0},
            {"pre_feedforward_layernorm.weight", sw, 0},
            {"post_feedforward_layernorm.weight", sw, 0},
            {"mlp.gate_proj.weight", I, C}, {"mlp.up_proj.weight", I, C},
            {"mlp.down_proj.weight", C, I},
        };
        for (size_t i = 0; rc == 0 && i < sizeof t / sizeof t[0]; i++) {
            if (t[i].r == 0)
                continue; /* absent in this family or config */
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

/* ---- activations: every block's (stored) or one block's (recompute, act_bf16) */

enum {
    A_ENC, A_RESID, A_LN1, A_RSTD1, A_Q, A_K, A_V, A_ATTY, A_LSE, A_RESID2, A_LN2, A_RSTD2,
    A_GATE, A_UP, A_H, A_LNF, A_RSTDF, A_LOGITS, A_LOSSES, A_DRESID, A_DLN, A_DATTY, A_DQ,
    A_DK, A_DV, A_DH, A_DGATE, A_DUP, A_ATT_SCRATCH, A_COS, A_SIN, A_TOKENS, A_TARGETS,
    A_WEIGHTS, A_POS, A_LORA_U, A_LORA_TMP, A_LORA_DU,
    /* qk_norm: the projections before their norm, the norms' rstd, their gradients */
    A_QRAW, A_KRAW, A_QRSTD, A_KRSTD, A_DQRAW, A_DKRAW,
    /* sandwich: attention and FFN outputs before their norm, the norms' rstd */
    A_AO, A_RSTDAO, A_FO, A_RSTDFO, A_DBR,
    A_RAWLOGITS, /* the logits before their cap */
    A_KEEP,      /* bf16 activation storage: the store (blocks.h; 0 floats in fp32) */
    A_COUNT
};

/* What a block's backward reads from its working slot, narrowed to bf16
 * between its forward and its backward with act_bf16 in stored mode (the
 * per-row statistics stay fp32: blocks.h). */
static const int kept[] = {A_LN1, A_Q, A_K, A_V, A_ATTY, A_RESID2, A_LN2, A_GATE, A_UP, A_H,
                           A_LORA_U, A_QRAW, A_KRAW, A_AO, A_FO};
#define NKEPT ((int)(sizeof kept / sizeof kept[0]))
_Static_assert(sizeof kept / sizeof kept[0] <= BLK_KEEP_MAX, "blk_keep holds BLK_KEEP_MAX arrays");

/* lean_tokens in effect: a recomputed block's per-token parts in chunks */
static bool tok_mode(const model_config *c, int recompute)
{
    return c->lean_acts && c->lean_tokens && recompute;
}

static uint64_t act_counts(const dec_desc *d, const model_config *c, int B, int T, int recompute,
                           uint64_t *cnt)
{
    uint64_t BT = acc_sat_mul_u64((uint64_t)B, (uint64_t)T), C = (uint64_t)c->channels;
    uint64_t L = (uint64_t)c->n_layer, NH = (uint64_t)c->n_head, hs = (uint64_t)dec_head_dim(c);
    uint64_t Ls = recompute ? 1 : L, NKV = (uint64_t)dec_kv_heads(c); /* statistics */
    uint64_t Lk = blk_inner_layers(c, recompute); /* the other inner arrays */
    uint64_t QD = NH * hs, KD = NKV * hs, I = (uint64_t)c->intermediate_size;
    uint64_t btc = acc_sat_mul_u64(BT, C), btq = acc_sat_mul_u64(BT, QD);
    uint64_t btk = acc_sat_mul_u64(BT, KD);
    uint64_t R = (uint64_t)c->lora.r, wide = C > QD ? C : QD, btr = acc_sat_mul_u64(BT, R);
    uint64_t logits = acc_sat_mul_u64(blk_head_rows(BT, c),
                                      (uint64_t)c->padded_vocab_size);
    uint64_t qk = d->qk_norm ? 1 : 0, sw = d->sandwich ? 1 : 0;
    wide = I > wide ? I : wide;
    /* the per-token arrays hold one token chunk in tok_mode (Ls is 1 then),
     * all B x T rows otherwise; the blocks' outputs blk_ck_floats: L rows,
     * or one (act_bf16: the others in A_KEEP), or with act_offload the
     * device slots (the checkpoints on the host; no A_ENC then) */
    bool off = model_act_offload(c, recompute);
    uint64_t rows = tok_mode(c, recompute) ? model_linear_rows(c, BT, recompute) : BT;
    uint64_t rc_ = acc_sat_mul_u64(rows, C), ri = acc_sat_mul_u64(rows, I);
    uint64_t per[A_COUNT] = {
        [A_ENC] = off ? 0 : btc, [A_RESID] = blk_ck_floats(c, recompute, btc),
        [A_LN1] = acc_sat_mul_u64(Lk, rc_), [A_RSTD1] = acc_sat_mul_u64(Ls, rows),
        [A_Q] = acc_sat_mul_u64(Lk, btq), [A_K] = acc_sat_mul_u64(Lk, btk),
        [A_V] = acc_sat_mul_u64(Lk, btk), [A_ATTY] = acc_sat_mul_u64(Lk, btq),
        [A_LSE] = acc_sat_mul3_u64(Ls, BT, NH), [A_RESID2] = acc_sat_mul_u64(Lk, rc_),
        [A_LN2] = acc_sat_mul_u64(Lk, rc_), [A_RSTD2] = acc_sat_mul_u64(Ls, rows),
        [A_GATE] = acc_sat_mul_u64(Lk, ri), [A_UP] = acc_sat_mul_u64(Lk, ri),
        [A_H] = acc_sat_mul_u64(Lk, ri), [A_LNF] = btc, [A_RSTDF] = BT,
        [A_LOGITS] = logits, [A_LOSSES] = BT,
        [A_DRESID] = btc, [A_DLN] = rc_, [A_DATTY] = btq, [A_DQ] = btq, [A_DK] = btk,
        [A_DV] = btk, [A_DH] = ri, [A_DGATE] = ri, [A_DUP] = ri,
        [A_ATT_SCRATCH] = c->lean_acts ? KERN_ATT_LEAN_SCRATCH(T, NH)
                                       : acc_sat_mul3_u64(2 * NH, (uint64_t)T, (uint64_t)T),
        [A_COS] = blk_rope_floats(T, (int)hs), [A_SIN] = blk_rope_floats(T, (int)hs),
        [A_TOKENS] = BT, [A_TARGETS] = BT, [A_WEIGHTS] = BT, [A_POS] = BT,
        [A_LORA_U] = acc_sat_mul3_u64(Lk, (uint64_t)blk_lora_per_layer(c), btr),
        [A_LORA_TMP] = R > 0 ? acc_sat_mul_u64(rows, wide) : 0, [A_LORA_DU] = acc_sat_mul_u64(rows, R),
        [A_QRAW] = acc_sat_mul3_u64(qk, Lk, btq), [A_KRAW] = acc_sat_mul3_u64(qk, Lk, btk),
        [A_QRSTD] = acc_sat_mul3_u64(qk, Ls, BT * NH), [A_KRSTD] = acc_sat_mul3_u64(qk, Ls, BT * NKV),
        [A_DQRAW] = qk * btq, [A_DKRAW] = qk * btk,
        [A_AO] = acc_sat_mul3_u64(sw, Lk, rc_), [A_RSTDAO] = acc_sat_mul3_u64(sw, Ls, rows),
        [A_FO] = acc_sat_mul3_u64(sw, Lk, rc_), [A_RSTDFO] = acc_sat_mul3_u64(sw, Ls, rows),
        [A_DBR] = sw * rc_,
        [A_RAWLOGITS] = c->final_logit_softcapping > 0 ? logits : 0,
    };
    per[A_KEEP] = blk_keep_floats(c, recompute, per, kept, NKEPT, btc);
    memcpy(cnt, per, sizeof per);
    return blk_acts_bytes(cnt, A_COUNT);
}

int dec_act_bytes(const dec_desc *d, const model_config *cfg, int B, int T, int recompute,
                  uint64_t *bytes, acc_err *err)
{
    uint64_t cnt[A_COUNT];
    *bytes = act_counts(d, cfg, B, T, recompute, cnt);
    return blk_acts_check(*bytes, act_counts(d, cfg, 1, T, recompute, cnt) == ACC_SIZE_OVERFLOW, B,
                          T, err);
}

/* ---- the composition */

typedef struct dec_block {
    blk_norm ln1, ln2, qn, kn, pa, pf; /* pa, pf: sandwich; qn, kn: qk_norm (C = hs) */
    blk_linear q, k, v, o;
    blk_attn attn;
    blk_ffn ffn;
} dec_block;

typedef struct dec_state {
    dec_desc desc;
    blk_embed emb;
    blk_norm norm;
    blk_head head;
    blk_rope rope;
    dec_block *blk; /* [L] */
    void *mem;
    float *a[A_COUNT];
    int lora_per_layer; /* adapted linears per block (blk_lora_per_layer, at create) */
    int packed;     /* the last forward had m->positions (A_POS holds them) */
    blk_keep keep;  /* bf16 activation storage (act_bf16) */
} dec_state;

static dec_state *S(const model *m)
{
    return m->impl;
}

static blk_norm norm_of(const model *m, const dec_desc *d, const char *name, int l, int C)
{
    return (blk_norm){d->norm, blk_off(m, name, l), BLK_NONE, (float)m->cfg.norm_eps, C};
}

static void block_init(model *m, dec_block *b, int l)
{
    const model_config *c = &m->cfg;
    const dec_desc *d = &S(m)->desc;
    int C = c->channels, hs = dec_head_dim(c), QD = c->n_head * hs, KD = dec_kv_heads(c) * hs;
    int I = c->intermediate_size, slots = 0; /* LoRA: in block order */
    b->ln1 = norm_of(m, d, "model.layers.%d.input_layernorm.weight", l, C);
    b->ln2 = norm_of(m, d, d->sandwich ? "model.layers.%d.pre_feedforward_layernorm.weight"
                                       : "model.layers.%d.post_attention_layernorm.weight", l, C);
    b->pa = norm_of(m, d, "model.layers.%d.post_attention_layernorm.weight", l, C);
    b->pf = norm_of(m, d, "model.layers.%d.post_feedforward_layernorm.weight", l, C);
    b->qn = (blk_norm){BLK_RMSNORM, blk_off(m, "model.layers.%d.self_attn.q_norm.weight", l),
                       BLK_NONE, (float)c->norm_eps, hs};
    b->kn = b->qn;
    b->kn.w = blk_off(m, "model.layers.%d.self_attn.k_norm.weight", l);
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
    b->ffn.act = d->act;
    b->ffn.I = I;
    b->attn = (blk_attn){.NH = c->n_head, .NKV = dec_kv_heads(c), .hs = hs,
                         .window = dec_sliding(c, l) ? c->sliding_window : 0,
                         .softcap = (float)c->attn_logit_softcapping,
                         .scale = c->query_pre_attn_scalar > 0
                                      ? (float)(1.0 / sqrt(c->query_pre_attn_scalar)) : 0.0f};
}

int dec_create(model *m, const dec_desc *d, acc_err *err)
{
    const model_config *c = &m->cfg;
    dec_state *s = calloc(1, sizeof *s);
    if (s != NULL)
        s->blk = calloc((size_t)c->n_layer, sizeof *s->blk);
    if (s == NULL || s->blk == NULL) {
        free(s);
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory");
    }
    m->impl = s;
    s->desc = *d;
    int C = c->channels;
    s->emb = (blk_embed){.wte = blk_off(m, "model.embed_tokens.weight", 0), .wpe = BLK_NONE, .C = C,
                         .scale = d->embed_scale ? (float)sqrt((double)C) : 0.0f};
    s->norm = norm_of(m, d, "model.norm.weight", 0, C);
    s->head = (blk_head){.w = c->tie_word_embeddings ? s->emb.wte : blk_off(m, "lm_head.weight", 0),
                         .C = C, .V = c->vocab_size, .Vp = c->padded_vocab_size,
                         .softcap = (float)c->final_logit_softcapping};
    s->rope.hs = dec_head_dim(c);
    for (int l = 0; l < c->n_layer; l++)
        block_init(m, &s->blk[l], l);
    s->lora_per_layer = blk_lora_per_layer(c);
    return 0;
}

void dec_destroy(model *m)
{
    if (S(m) != NULL)
        free(S(m)->blk);
    free(S(m));
    m->impl = NULL;
}

void dec_acts_free(model *m)
{
    if (S(m) != NULL)
        blk_acts_free(m, &S(m)->mem, S(m)->a, A_COUNT);
}

int dec_acts_alloc(model *m, acc_err *err)
{
    dec_state *s = S(m);
    uint64_t cnt[A_COUNT];
    act_counts(&s->desc, &m->cfg, m->B, m->T, m->recompute, cnt);
    const model_config *c = &m->cfg;
    bool more = s->desc.norm != BLK_RMSNORM || s->desc.act != BLK_SILU || c->sliding_window > 0 ||
                c->attn_logit_softcapping > 0 || c->final_logit_softcapping > 0 ||
                c->query_pre_attn_scalar > 0; /* the ops after the LLaMA family's */
    int rc = kern_llama_ops_check(m->dev, err);
    if (rc == 0 && more)
        rc = kern_decoder_ops_check(m->dev, err);
    if (rc == 0)
        rc = blk_acts_alloc(m, cnt, A_COUNT, &s->mem, s->a, err);
    if (rc != 0)
        return rc;
    if (blk_keep_on(&m->cfg, m->recompute))
        blk_keep_init(&s->keep, m, s->a, cnt, kept, NKEPT, s->a[A_RESID], s->a[A_KEEP]);
    s->rope.cos = s->a[A_COS];
    s->rope.sin = s->a[A_SIN];
    s->head.raw = s->a[A_RAWLOGITS];
    if ((rc = blk_rope_upload(m, &s->rope, err)) != 0)
        dec_acts_free(m);
    return rc;
}

static blk_run run_of(model *m, int nseq)
{
    dec_state *s = S(m);
    blk_run r = blk_run_of(m, nseq);
    r.pos = s->packed ? (const int *)s->a[A_POS] : NULL;
    r.keep = blk_keep_on(&m->cfg, m->recompute) ? &s->keep : NULL;
    r.lora = (blk_lora_acts){s->a[A_LORA_U], s->a[A_LORA_TMP], s->a[A_LORA_DU],
                             s->lora_per_layer};
    return r;
}

/* Block l's kept activations (slot 0 in recompute mode) and its input. */
typedef struct block_acts {
    float *x, *ln1, *rstd1, *q, *k, *v, *atty, *lse, *resid2, *ln2, *rstd2, *out;
    float *qraw, *kraw, *qrstd, *krstd, *ao, *rstdao, *fo, *rstdfo;
    blk_ffn_acts ffn;
} block_acts;

/* Block l's input (l = L: the last block's output): the embedding's output
 * and the blocks' outputs, or with act_offload device slot l % 2. */
static float *ck_at(const model *m, int l)
{
    return blk_ck_at(m, S(m)->a[A_ENC], S(m)->a[A_RESID], l);
}

static block_acts block_at(const model *m, int l)
{
    float *const *a = S(m)->a;
    const model_config *c = &m->cfg;
    size_t bt = (size_t)m->B * m->T, C = (size_t)c->channels, hs = (size_t)dec_head_dim(c);
    size_t NH = (size_t)c->n_head, NKV = (size_t)dec_kv_heads(c), QD = NH * hs, KD = NKV * hs;
    size_t I = (size_t)c->intermediate_size, s = m->recompute ? 0 : (size_t)l; /* statistics */
    size_t k = blk_inner_slot(m, l); /* the other inner arrays */
    bool qk = S(m)->desc.qk_norm, sw = S(m)->desc.sandwich;
    return (block_acts){
        .x = ck_at(m, l),
        .ln1 = a[A_LN1] + k * bt * C, .rstd1 = a[A_RSTD1] + s * bt,
        .q = a[A_Q] + k * bt * QD, .k = a[A_K] + k * bt * KD, .v = a[A_V] + k * bt * KD,
        .atty = a[A_ATTY] + k * bt * QD, .lse = a[A_LSE] + s * bt * NH,
        .resid2 = a[A_RESID2] + k * bt * C, .ln2 = a[A_LN2] + k * bt * C,
        .rstd2 = a[A_RSTD2] + s * bt, .out = ck_at(m, l + 1),
        .qraw = qk ? a[A_QRAW] + k * bt * QD : NULL, .kraw = qk ? a[A_KRAW] + k * bt * KD : NULL,
        .qrstd = qk ? a[A_QRSTD] + s * bt * NH : NULL, .krstd = qk ? a[A_KRSTD] + s * bt * NKV : NULL,
        .ao = sw ? a[A_AO] + k * bt * C : NULL, .rstdao = sw ? a[A_RSTDAO] + s * bt : NULL,
        .fo = sw ? a[A_FO] + k * bt * C : NULL, .rstdfo = sw ? a[A_RSTDFO] + s * bt : NULL,
        .ffn = {a[A_GATE] + k * bt * I, a[A_UP] + k * bt * I, a[A_H] + k * bt * I},
    };
}

/* A per-head norm: rows of hs over the N * H heads of x. */
static blk_run heads_of(const blk_run *r, int H)
{
    blk_run h = *r;
    h.N = r->N * H;
    return h;
}

/* y (the attention's or the FFN's output, unnormed in `raw` under
 * sandwich) joins the residual: out = x + y, or x + norm(y) */
static void residual_fwd(blk_run *r, const blk_norm *n, bool sandwich, float *out,
                         const float *x, float *raw, float *rstd, float *tmp)
{
    if (sandwich)
        blk_norm_fwd(r, n, tmp, NULL, rstd, raw);
    r->k->add(r->d, out, x, sandwich ? tmp : raw, (size_t)r->N * n->C);
}

static void block_forward(blk_run *r, int l)
{
    dec_state *s = S(r->m);
    const dec_block *b = &s->blk[l];
    bool qk = s->desc.qk_norm, sw = s->desc.sandwich;
    block_acts x = block_at(r->m, l);
    float *tmp = s->a[A_DLN];
    blk_norm_fwd(r, &b->ln1, x.ln1, NULL, x.rstd1, x.x);
    blk_linear_fwd(r, l, &b->q, qk ? x.qraw : x.q, x.ln1);
    blk_linear_fwd(r, l, &b->k, qk ? x.kraw : x.k, x.ln1);
    blk_linear_fwd(r, l, &b->v, x.v, x.ln1);
    if (qk) {
        blk_run rq = heads_of(r, b->attn.NH), rk = heads_of(r, b->attn.NKV);
        blk_norm_fwd(&rq, &b->qn, x.q, NULL, x.qrstd, x.qraw);
        blk_norm_fwd(&rk, &b->kn, x.k, NULL, x.krstd, x.kraw);
    }
    blk_rope_fwd(r, &s->rope, x.q, b->attn.NH);
    blk_rope_fwd(r, &s->rope, x.k, b->attn.NKV);
    blk_attn_fwd(r, &b->attn, x.atty, x.lse, s->a[A_ATT_SCRATCH], x.q, x.k, x.v);
    float *ao = sw ? x.ao : tmp;
    blk_linear_fwd(r, l, &b->o, ao, x.atty);
    residual_fwd(r, &b->pa, sw, x.resid2, x.x, ao, x.rstdao, tmp);
    blk_norm_fwd(r, &b->ln2, x.ln2, NULL, x.rstd2, x.resid2);
    float *fo = sw ? x.fo : tmp;
    blk_ffn_fwd(r, l, &b->ffn, &x.ffn, fo, x.ln2);
    residual_fwd(r, &b->pf, sw, x.out, x.resid2, fo, x.rstdfo, tmp);
}

/* d(block output) in dresid -> d(the unnormed branch output) in dy: the
 * same gradient, or through the sandwich norm */
static const float *branch_bwd(blk_run *r, const blk_norm *n, bool sandwich, float *dy,
                               const float *dresid, const float *raw, const float *rstd)
{
    if (!sandwich)
        return dresid;
    r->k->zero(r->d, dy, (size_t)r->N * n->C * sizeof(float));
    blk_norm_bwd(r, n, dy, dresid, raw, NULL, rstd);
    return dy;
}

/* d(attention output) in A_DATTY -> the gradients of the projections'
 * outputs over the whole sequence: attention and rotary backward into
 * A_DQ / A_DK / A_DV, then (q / k normed per head) through the head norms.
 * *dq, *dk: where q's and k's end up (A_DV holds v's). Shared by
 * block_backward and the token-chunked block_backward_tok. */
static void attn_core_bwd(blk_run *r, int l, const block_acts *x, const float **dq_out,
                          const float **dk_out)
{
    dec_state *s = S(r->m);
    float *const *a = s->a;
    const dec_block *b = &s->blk[l];
    size_t N = (size_t)r->N, f = sizeof(float);
    r->k->zero(r->d, a[A_DQ], N * (size_t)b->q.out * f);
    r->k->zero(r->d, a[A_DK], N * (size_t)b->k.out * f);
    r->k->zero(r->d, a[A_DV], N * (size_t)b->v.out * f);
    blk_attn_bwd(r, &b->attn, a[A_DQ], a[A_DK], a[A_DV], a[A_ATT_SCRATCH], a[A_DATTY], x->q, x->k,
                 x->v, x->lse, x->atty);
    blk_rope_bwd(r, &s->rope, a[A_DQ], b->attn.NH);
    blk_rope_bwd(r, &s->rope, a[A_DK], b->attn.NKV);
    float *dq = a[A_DQ], *dk = a[A_DK];
    if (s->desc.qk_norm) {
        blk_run rq = heads_of(r, b->attn.NH), rk = heads_of(r, b->attn.NKV);
        dq = a[A_DQRAW], dk = a[A_DKRAW];
        r->k->zero(r->d, dq, N * (size_t)b->q.out * f);
        r->k->zero(r->d, dk, N * (size_t)b->k.out * f);
        blk_norm_bwd(&rq, &b->qn, dq, a[A_DQ], x->qraw, NULL, x->qrstd);
        blk_norm_bwd(&rk, &b->kn, dk, a[A_DK], x->kraw, NULL, x->krstd);
    }
    *dq_out = dq;
    *dk_out = dk;
}

/* dresid holds d(block output) on entry and d(block input) on exit. */
static void block_backward(blk_run *r, int l)
{
    dec_state *s = S(r->m);
    float *const *a = s->a;
    const dec_block *b = &s->blk[l];
    bool sw = s->desc.sandwich;
    block_acts x = block_at(r->m, l);
    size_t N = (size_t)r->N, f = sizeof(float);
    blk_ffn_grads fg = {a[A_DH], a[A_DGATE], a[A_DUP]};
    const float *dy = branch_bwd(r, &b->pf, sw, a[A_DBR], a[A_DRESID], x.fo, x.rstdfo);
    blk_ffn_bwd(r, l, &b->ffn, &x.ffn, &fg, a[A_DLN], dy, x.ln2);
    blk_norm_bwd(r, &b->ln2, a[A_DRESID], a[A_DLN], x.resid2, NULL, x.rstd2);
    /* attention: dresid is now d(resid2) */
    dy = branch_bwd(r, &b->pa, sw, a[A_DBR], a[A_DRESID], x.ao, x.rstdao);
    r->k->zero(r->d, a[A_DATTY], N * (size_t)b->o.in * f);
    blk_linear_bwd(r, l, &b->o, a[A_DATTY], dy, x.atty);
    const float *dq, *dk;
    attn_core_bwd(r, l, &x, &dq, &dk);
    r->k->zero(r->d, a[A_DLN], N * (size_t)b->q.in * f);
    blk_linear_bwd(r, l, &b->q, a[A_DLN], dq, x.ln1);
    blk_linear_bwd(r, l, &b->k, a[A_DLN], dk, x.ln1);
    blk_linear_bwd(r, l, &b->v, a[A_DLN], a[A_DV], x.ln1);
    blk_norm_bwd(r, &b->ln1, a[A_DRESID], a[A_DLN], x.x, NULL, x.rstd1);
}

/* ---- a recomputed block in token chunks (model_config.lean_tokens)
 *
 * The per-token parts (norms, projections, residuals, the FFN) run on
 * chunks of blk_head_chunk rows through blk_rows, with the same kernel
 * calls per chunk as block_forward / block_backward make on all rows; only
 * attention and rotary run on the whole sequence. So the arrays of those
 * parts hold one chunk (act_counts), and q, k, v, the attention's output
 * and lse are the whole-sequence ones. Row results are the same bits; the
 * weight gradients are summed chunk by chunk (fp32 summation order). */

static int tok_chunk(const model *m)
{
    return blk_head_chunk(&m->cfg);
}

/* Rows [n0, n0 + *nc) of r's chunk at n0. */
static blk_run chunk_at(const blk_run *r, int n0, int *nc)
{
    int ch = tok_chunk(r->m);
    *nc = r->N - n0 < ch ? r->N - n0 : ch;
    return blk_rows(r, n0, *nc);
}

/* ln1 -> q, k, v chunk by chunk (q / k normed per head), then rotary and
 * attention over the whole sequence: x->atty, x->lse. */
static void attn_whole_tok(blk_run *r, int l, const block_acts *x)
{
    dec_state *s = S(r->m);
    const dec_block *b = &s->blk[l];
    bool qk = s->desc.qk_norm;
    size_t C = (size_t)b->ln1.C, QD = (size_t)b->q.out, KD = (size_t)b->k.out;
    int NH = b->attn.NH, NKV = b->attn.NKV, nc;
    for (int n0 = 0; n0 < r->N; n0 += nc) {
        blk_run c = chunk_at(r, n0, &nc);
        size_t o = (size_t)n0;
        blk_norm_fwd(&c, &b->ln1, x->ln1, NULL, x->rstd1, x->x + o * C);
        blk_linear_fwd(&c, l, &b->q, (qk ? x->qraw : x->q) + o * QD, x->ln1);
        blk_linear_fwd(&c, l, &b->k, (qk ? x->kraw : x->k) + o * KD, x->ln1);
        blk_linear_fwd(&c, l, &b->v, x->v + o * KD, x->ln1);
        if (qk) {
            blk_run rq = heads_of(&c, NH), rk = heads_of(&c, NKV);
            blk_norm_fwd(&rq, &b->qn, x->q + o * QD, NULL, x->qrstd + o * (size_t)NH,
                         x->qraw + o * QD);
            blk_norm_fwd(&rk, &b->kn, x->k + o * KD, NULL, x->krstd + o * (size_t)NKV,
                         x->kraw + o * KD);
        }
    }
    blk_rope_fwd(r, &s->rope, x->q, NH);
    blk_rope_fwd(r, &s->rope, x->k, NKV);
    blk_attn_fwd(r, &b->attn, x->atty, x->lse, s->a[A_ATT_SCRATCH], x->q, x->k, x->v);
}

/* The chunk c at row n0 after attention: output projection, residual,
 * ln2, FFN, and the block's output rows into out (NULL: not needed; the
 * sandwich norm's rstd still is). Leaves the chunk's activations. */
static void tail_fwd_tok(blk_run *c, int l, const block_acts *x, size_t n0, float *out)
{
    dec_state *s = S(c->m);
    const dec_block *b = &s->blk[l];
    bool sw = s->desc.sandwich;
    size_t C = (size_t)b->ln1.C, QD = (size_t)b->q.out;
    float *tmp = s->a[A_DLN];
    float *ao = sw ? x->ao : tmp;
    blk_linear_fwd(c, l, &b->o, ao, x->atty + n0 * QD);
    residual_fwd(c, &b->pa, sw, x->resid2, x->x + n0 * C, ao, x->rstdao, tmp);
    blk_norm_fwd(c, &b->ln2, x->ln2, NULL, x->rstd2, x->resid2);
    float *fo = sw ? x->fo : tmp;
    blk_ffn_fwd(c, l, &b->ffn, &x->ffn, fo, x->ln2);
    if (out != NULL)
        residual_fwd(c, &b->pf, sw, out + n0 * C, x->resid2, fo, x->rstdfo, tmp);
    else if (sw)
        blk_norm_fwd(c, &b->pf, tmp, NULL, x->rstdfo, fo);
}

static void block_forward_tok(blk_run *r, int l)
{
    block_acts x = block_at(r->m, l);
    attn_whole_tok(r, l, &x);
    int nc;
    for (int n0 = 0; n0 < r->N; n0 += nc) {
        blk_run c = chunk_at(r, n0, &nc);
        tail_fwd_tok(&c, l, &x, (size_t)n0, x.out);
    }
}

/* The backward's recomputation: what outlives a chunk (attention's). */
static void block_refwd_tok(blk_run *r, int l)
{
    block_acts x = block_at(r->m, l);
    attn_whole_tok(r, l, &x);
}

/* The FFN half and the output projection's backward, chunk by chunk (each
 * chunk's tail recomputed first): dresid becomes d(resid2), DATTY d(atty). */
static void tail_bwd_tok(blk_run *r, int l, const block_acts *x)
{
    dec_state *s = S(r->m);
    float *const *a = s->a;
    const dec_block *b = &s->blk[l];
    bool sw = s->desc.sandwich;
    size_t C = (size_t)b->ln1.C, QD = (size_t)b->q.out;
    blk_ffn_grads fg = {a[A_DH], a[A_DGATE], a[A_DUP]};
    r->k->zero(r->d, a[A_DATTY], (size_t)r->N * QD * sizeof(float));
    int nc;
    for (int n0 = 0; n0 < r->N; n0 += nc) {
        blk_run c = chunk_at(r, n0, &nc);
        size_t o = (size_t)n0;
        float *dres = a[A_DRESID] + o * C;
        tail_fwd_tok(&c, l, x, o, NULL);
        const float *dy = branch_bwd(&c, &b->pf, sw, a[A_DBR], dres, x->fo, x->rstdfo);
        blk_ffn_bwd(&c, l, &b->ffn, &x->ffn, &fg, a[A_DLN], dy, x->ln2);
        blk_norm_bwd(&c, &b->ln2, dres, a[A_DLN], x->resid2, NULL, x->rstd2);
        dy = branch_bwd(&c, &b->pa, sw, a[A_DBR], dres, x->ao, x->rstdao);
        blk_linear_bwd(&c, l, &b->o, a[A_DATTY] + o * QD, dy, x->atty + o * QD);
    }
}

/* The q, k, v projections' and ln1's backward chunk by chunk (ln1
 * recomputed per chunk) from dq, dk, dv: dresid becomes d(block input). */
static void qkv_bwd_tok(blk_run *r, int l, const block_acts *x, const float *dq,
                        const float *dk)
{
    dec_state *s = S(r->m);
    float *const *a = s->a;
    const dec_block *b = &s->blk[l];
    size_t C = (size_t)b->ln1.C, QD = (size_t)b->q.out, KD = (size_t)b->k.out;
    int nc;
    for (int n0 = 0; n0 < r->N; n0 += nc) {
        blk_run c = chunk_at(r, n0, &nc);
        size_t o = (size_t)n0;
        blk_norm_fwd(&c, &b->ln1, x->ln1, NULL, x->rstd1, x->x + o * C);
        r->k->zero(r->d, a[A_DLN], (size_t)nc * C * sizeof(float));
        blk_linear_bwd(&c, l, &b->q, a[A_DLN], dq + o * QD, x->ln1);
        blk_linear_bwd(&c, l, &b->k, a[A_DLN], dk + o * KD, x->ln1);
        blk_linear_bwd(&c, l, &b->v, a[A_DLN], a[A_DV] + o * KD, x->ln1);
        blk_norm_bwd(&c, &b->ln1, a[A_DRESID] + o * C, a[A_DLN], x->x + o * C, NULL, x->rstd1);
    }
}

/* block_backward's order, the per-token parts in chunks (after
 * block_refwd_tok). */
static void block_backward_tok(blk_run *r, int l)
{
    block_acts x = block_at(r->m, l);
    tail_bwd_tok(r, l, &x);
    const float *dq, *dk;
    attn_core_bwd(r, l, &x, &dq, &dk);
    qkv_bwd_tok(r, l, &x, dq, dk);
}

/* the stack around the blocks (blocks.h's skeleton) */
static blk_stack stack_of(model *m)
{
    dec_state *s = S(m);
    float *const *a = s->a;
    bool tok = tok_mode(&m->cfg, m->recompute);
    blk_stack st = {.emb = &s->emb, .norm = &s->norm, .head = &s->head, .L = m->cfg.n_layer,
                    .fwd = tok ? block_forward_tok : block_forward,
                    .bwd = tok ? block_backward_tok : block_backward,
                    .refwd = tok ? block_refwd_tok : NULL, .tok_chunk = tok ? tok_chunk(m) : 0,
                    .x0 = ck_at(m, 0), .xL = ck_at(m, m->cfg.n_layer), .lnf = a[A_LNF],
                    .lnf_rstd = a[A_RSTDF], .logits = a[A_LOGITS], .losses = a[A_LOSSES],
                    .dresid = a[A_DRESID], .dln = a[A_DLN]};
    blk_stack_ck(m, a[A_RESID], &st);
    return st;
}

void dec_forward(model *m, const int *tokens, const int *targets, const float *weights, int nseq,
                 int want_grad, double *loss_sum)
{
    dec_state *s = S(m);
    float *const *a = s->a;
    blk_run r = run_of(m, nseq);
    blk_inputs in = {(int *)a[A_TOKENS], (int *)a[A_TARGETS], a[A_WEIGHTS], (int *)a[A_POS]};
    blk_stack st = stack_of(m);
    blk_stack_forward(&r, &st, &in, tokens, targets, weights, want_grad, loss_sum);
    s->packed = r.pos != NULL; /* the backward's run rotates at the same positions */
}

void dec_backward(model *m, int nseq, void (*done)(void *ctx, int layer), void *ctx)
{
    blk_run r = run_of(m, nseq);
    blk_stack st = stack_of(m);
    blk_stack_backward(&r, &st, (const int *)S(m)->a[A_TOKENS], done, ctx);
}

int dec_init_host(const model *m, uint64_t seed, float *host, acc_err *err)
{
    (void)err;
    rng r;
    rng_seed(&r, seed, 0xdec0deULL);
    float one = S(m) != NULL && S(m)->desc.norm == BLK_RMSNORM_P1 ? 0.0f : 1.0f;
    for (int k = 0; k < m->layout.n; k++) {
        const model_tensor *t = &m->layout.t[k];
        float *p = host + t->offset;
        if (t->adapter) /* model_lora_init's */
            continue;
        size_t n = model_tensor_file_count(t); /* padded rows stay 0 */
        bool norm = strstr(t->name, "norm.weight") != NULL;
        for (size_t j = 0; j < n; j++)
            p[j] = norm ? one : t->decays ? (float)(0.02 * rng_normal(&r)) : 0.0f;
    }
    return 0;
}

const float *dec_logits(const model *m)
{
    return S(m) == NULL || S(m)->mem == NULL ? NULL : S(m)->a[A_LOGITS];
}

const float *dec_token_losses(const model *m)
{
    return S(m) == NULL || S(m)->mem == NULL ? NULL : S(m)->a[A_LOSSES];
}

/* ---- inference: block_forward's composition over blk_infer's arrays,
 * attention against the key/value cache */

static void block_infer(blk_run *r, blk_infer *s, int l, int p0)
{
    dec_state *ds = S(r->m);
    const dec_block *b = &ds->blk[l];
    bool qk = ds->desc.qk_norm, sw = ds->desc.sandwich;
    int NH = b->attn.NH, NKV = b->attn.NKV, hs = b->attn.hs;
    size_t N = (size_t)r->N, C = (size_t)b->ln1.C;
    blk_rope rope = {s->cos, s->sin, hs};
    blk_norm_fwd(r, &b->ln1, s->h, NULL, s->st1, s->x);
    blk_linear_fwd(r, l, &b->q, qk ? s->att : s->q, s->h);
    blk_linear_fwd(r, l, &b->k, qk ? s->tmp : s->k, s->h);
    blk_linear_fwd(r, l, &b->v, s->v, s->h);
    if (qk) {
        blk_run rq = heads_of(r, NH), rk = heads_of(r, NKV);
        blk_norm_fwd(&rq, &b->qn, s->q, NULL, s->st1, s->att);
        blk_norm_fwd(&rk, &b->kn, s->k, NULL, s->st2, s->tmp);
    }
    blk_rope_fwd(r, &rope, s->q, NH);
    blk_rope_fwd(r, &rope, s->k, NKV);
    blk_infer_store(r, s, l, s->k, s->v, NKV * hs, p0);
    blk_infer_attn(r, s, &b->attn, l, s->att, s->q, NH * hs, p0);
    blk_linear_fwd(r, l, &b->o, s->tmp, s->att);
    if (sw)
        blk_norm_fwd(r, &b->pa, s->h, NULL, s->st1, s->tmp);
    r->k->add(r->d, s->x2, s->x, sw ? s->h : s->tmp, N * C);
    blk_norm_fwd(r, &b->ln2, s->h, NULL, s->st1, s->x2);
    blk_ffn_acts fa = {s->f1, s->f2, s->f3};
    blk_ffn_fwd(r, l, &b->ffn, &fa, s->tmp, s->h);
    if (sw)
        blk_norm_fwd(r, &b->pf, s->h, NULL, s->st1, s->tmp);
    r->k->add(r->d, s->x, s->x2, sw ? s->h : s->tmp, N * C);
}

void dec_infer(model *m, blk_infer *s, const int *tokens, int n, int p0)
{
    dec_state *ds = S(m);
    blk_run r = blk_infer_run(m, s, tokens, n, p0);
    blk_embed_fwd(&r, &ds->emb, s->x, s->tok);
    for (int l = 0; l < m->cfg.n_layer; l++) {
        model_layer_begin(m, l, false);
        block_infer(&r, s, l, p0);
        model_layer_end(m, l, false);
    }
    blk_infer_head(&r, s, &ds->norm, &ds->head, s->x);
}
