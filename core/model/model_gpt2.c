/* model_gpt2: see model_gpt2.h. A family file: config.json mapping,
 * tensor names (llm.c's order), and the composition of blocks.h's pieces;
 * its native files are model_gpt2_files.c. */
#include "model_gpt2.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#include "checked.h"
#include "rng.h"

/* The 16 tensor groups, in llm.c's order (a block group holds all layers). */
enum {
    P_WTE, P_WPE, P_LN1W, P_LN1B, P_QKVW, P_QKVB, P_ATTPROJW, P_ATTPROJB,
    P_LN2W, P_LN2B, P_FCW, P_FCB, P_FCPROJW, P_FCPROJB, P_LNFW, P_LNFB, P_NGROUPS
};

/* Hugging Face name (%d = layer), file shape in units of C, and whether
 * the group is a Conv1D matrix (transposed in the buffer, decays). */
typedef struct group_def {
    const char *name;
    int in_mult, out_mult; /* matrices: file [in*C, out*C]; vectors: [out*C] */
    bool matrix;
} group_def;

static const group_def groups[P_NGROUPS] = {
    [P_WTE] = {"wte.weight", 0, 0, true},
    [P_WPE] = {"wpe.weight", 0, 0, true},
    [P_LN1W] = {"h.%d.ln_1.weight", 0, 1, false},
    [P_LN1B] = {"h.%d.ln_1.bias", 0, 1, false},
    [P_QKVW] = {"h.%d.attn.c_attn.weight", 1, 3, true},
    [P_QKVB] = {"h.%d.attn.c_attn.bias", 0, 3, false},
    [P_ATTPROJW] = {"h.%d.attn.c_proj.weight", 1, 1, true},
    [P_ATTPROJB] = {"h.%d.attn.c_proj.bias", 0, 1, false},
    [P_LN2W] = {"h.%d.ln_2.weight", 0, 1, false},
    [P_LN2B] = {"h.%d.ln_2.bias", 0, 1, false},
    [P_FCW] = {"h.%d.mlp.c_fc.weight", 1, 4, true},
    [P_FCB] = {"h.%d.mlp.c_fc.bias", 0, 4, false},
    [P_FCPROJW] = {"h.%d.mlp.c_proj.weight", 4, 1, true},
    [P_FCPROJB] = {"h.%d.mlp.c_proj.bias", 0, 1, false},
    [P_LNFW] = {"ln_f.weight", 0, 1, false},
    [P_LNFB] = {"ln_f.bias", 0, 1, false},
};

static int group_layered(int g)
{
    return g >= P_LN1W && g <= P_FCPROJB;
}

/* ---- config */

static int gpt2_check(const model_config *c, acc_err *err)
{
    if (c->n_layer < 1 || c->n_head < 1 || c->channels < 1 || c->max_seq_len < 1)
        return acc_err_set(err, ACC_EINVAL, "model",
                           "n_layer, n_head, n_embd and seq_len must be >= 1");
    if (c->channels % c->n_head != 0)
        return acc_err_set(err, ACC_EINVAL, "model.n_head",
                           "n_embd %d is not a multiple of n_head %d", c->channels, c->n_head);
    if (c->vocab_size < 1 || c->padded_vocab_size < c->vocab_size)
        return acc_err_set(err, ACC_EINVAL, "model.padded_vocab_size",
                           "padded_vocab_size %d must be >= vocab_size %d >= 1",
                           c->padded_vocab_size, c->vocab_size);
    if ((c->n_kv_head != 0 && c->n_kv_head != c->n_head) ||
        (c->head_dim != 0 && c->head_dim * c->n_head != c->channels))
        return acc_err_set(err, ACC_EINVAL, "model.n_head",
                           "gpt2 has n_head key/value heads of n_embd / n_head channels");
    if (c->intermediate_size != 0 && (int64_t)c->intermediate_size != 4 * (int64_t)c->channels)
        return acc_err_set(err, ACC_EINVAL, "model", "gpt2's MLP is 4 * n_embd wide");
    return 0;
}

static int gpt2_config_from_spec(const spec_model *sm, model_config *cfg, acc_err *err)
{
    cfg->max_seq_len = sm->seq_len;
    cfg->vocab_size = sm->vocab_size;
    cfg->padded_vocab_size = sm->padded_vocab_size > 0 ? sm->padded_vocab_size : sm->vocab_size;
    cfg->n_layer = sm->n_layer;
    cfg->n_head = sm->n_head;
    cfg->channels = sm->n_embd;
    cfg->tie_word_embeddings = cfg->attention_bias = cfg->attention_out_bias = cfg->mlp_bias = true;
    return gpt2_check(cfg, err);
}

static int gpt2_config_from_hf(const json_t *hf, model_config *cfg, acc_err *err)
{
    int rc = model_hf_int(hf, "n_layer", -1, &cfg->n_layer, err);
    if (rc == 0)
        rc = model_hf_int(hf, "n_head", -1, &cfg->n_head, err);
    if (rc == 0)
        rc = model_hf_int(hf, "n_embd", -1, &cfg->channels, err);
    if (rc == 0)
        rc = model_hf_int(hf, "vocab_size", -1, &cfg->vocab_size, err);
    if (rc == 0)
        rc = model_hf_int(hf, "n_positions", 1024, &cfg->max_seq_len, err);
    if (rc == 0)
        rc = model_hf_int(hf, "n_inner", 0, &cfg->intermediate_size, err);
    if (rc != 0)
        return rc;
    if ((rc = model_hf_num(hf, "layer_norm_epsilon", 1e-5, &cfg->norm_eps, err)) != 0)
        return rc;
    cfg->padded_vocab_size = cfg->vocab_size;
    cfg->tie_word_embeddings = cfg->attention_bias = cfg->attention_out_bias = cfg->mlp_bias = true;
    rc = gpt2_check(cfg, err);
    if (rc != 0 && err != NULL)
        snprintf(err->field, sizeof err->field, "model.from");
    return rc;
}

static int gpt2_config_to_hf(const model_config *cfg, json_t *hf, acc_err *err)
{
    json_t *arch = json_pack("[s]", "GPT2LMHeadModel");
    int bad = arch == NULL;
    bad |= json_object_set_new(hf, "architectures", arch) != 0;
    bad |= json_object_set_new(hf, "model_type", json_string("gpt2")) != 0;
    bad |= json_object_set_new(hf, "n_layer", json_integer(cfg->n_layer)) != 0;
    bad |= json_object_set_new(hf, "n_head", json_integer(cfg->n_head)) != 0;
    bad |= json_object_set_new(hf, "n_embd", json_integer(cfg->channels)) != 0;
    bad |= json_object_set_new(hf, "vocab_size", json_integer(cfg->vocab_size)) != 0;
    bad |= json_object_set_new(hf, "n_positions", json_integer(cfg->max_seq_len)) != 0;
    bad |= json_object_set_new(hf, "n_ctx", json_integer(cfg->max_seq_len)) != 0;
    bad |= json_object_set_new(hf, "layer_norm_epsilon", json_real(1e-5)) != 0;
    bad |= json_object_set_new(hf, "tie_word_embeddings", json_true()) != 0;
    return bad ? acc_err_set(err, ACC_ENOMEM, "", "out of host memory for config.json") : 0;
}

/* ---- layout */

static int gpt2_layout(const model_config *c, model_layout *out, acc_err *err)
{
    int64_t C = c->channels;
    int L = c->n_layer, cap = 0, rc = 0;
    char name[MODEL_NAME_MAX];
    for (int g = 0; rc == 0 && g < P_NGROUPS; g++) {
        const group_def *d = &groups[g];
        int layers = group_layered(g) ? L : 1;
        for (int l = 0; rc == 0 && l < layers; l++) {
            int64_t shape[2];
            int ndim = 2;
            size_t count = 0;
            snprintf(name, sizeof name, d->name, l);
            if (g == P_WTE) { /* the file drops the padded rows */
                shape[0] = c->vocab_size;
                shape[1] = C;
                count = (size_t)c->padded_vocab_size * (size_t)C;
            } else if (g == P_WPE) {
                shape[0] = c->max_seq_len;
                shape[1] = C;
            } else if (d->matrix) {
                shape[0] = d->in_mult * C;
                shape[1] = d->out_mult * C;
            } else {
                ndim = 1;
                shape[0] = d->out_mult * C;
            }
            rc = model_layout_add(out, &cap, name, group_layered(g) ? l : -1, ndim, shape, count,
                                  d->matrix, true, d->matrix && g != P_WTE && g != P_WPE,
                                  "model.n_embd", err);
        }
    }
    return rc;
}

/* ---- activations: every block's (stored) or one block's (recompute);
 * each block's output on the residual stream always */

enum {
    A_ENCODED, A_LN1, A_LN1_MEAN, A_LN1_RSTD, A_QKV, A_ATTY, A_LSE, A_ATTPROJ, A_RESID2,
    A_LN2, A_LN2_MEAN, A_LN2_RSTD, A_FCH, A_FCH_GELU, A_FCPROJ, A_RESID3, A_LNF,
    A_LNF_MEAN, A_LNF_RSTD, A_LOGITS, A_LOSSES, A_DRESID, A_DLN, A_DATTY, A_DQKV,
    A_DBIG1, A_DBIG2, A_ATT_SCRATCH, A_TOKENS, A_TARGETS, A_WEIGHTS,
    A_LORA_U, A_LORA_TMP, A_LORA_DU,
    A_KEEP, /* bf16 activation storage: the store (blocks.h; 0 floats in fp32) */
    A_COUNT
};

/* What a block's backward reads from its working slot, narrowed to bf16
 * between its forward and its backward with act_bf16 in stored mode (the
 * norms' statistics and the log-sum-exp stay fp32; the projections'
 * outputs attproj and fcproj are not read by the backward). */
static const int kept[] = {A_LN1, A_QKV, A_ATTY, A_RESID2, A_LN2, A_FCH, A_FCH_GELU, A_LORA_U};
#define NKEPT ((int)(sizeof kept / sizeof kept[0]))
_Static_assert(sizeof kept / sizeof kept[0] <= BLK_KEEP_MAX, "blk_keep holds BLK_KEEP_MAX arrays");

static uint64_t act_counts(const model_config *c, int B, int T, int recompute, uint64_t *cnt)
{
    uint64_t BT = acc_sat_mul_u64((uint64_t)B, (uint64_t)T), C = (uint64_t)c->channels;
    uint64_t L = (uint64_t)c->n_layer, NH = (uint64_t)c->n_head;
    uint64_t Ls = recompute ? 1 : L; /* layers whose statistics are kept */
    uint64_t Lk = blk_inner_layers(c, recompute); /* whose other inner activations are */
    uint64_t btc = acc_sat_mul_u64(BT, C), lbtc = acc_sat_mul_u64(Lk, btc);
    uint64_t lbt = acc_sat_mul_u64(Ls, BT), R = (uint64_t)c->lora.r;
    uint64_t btr = acc_sat_mul_u64(BT, R);
    bool off = model_act_offload(c, recompute); /* the blocks' inputs: two device slots */
    uint64_t per[A_COUNT] = {
        [A_ENCODED] = off ? 0 : btc, [A_LN1] = lbtc, [A_LN1_MEAN] = lbt,
        [A_LN1_RSTD] = lbt, [A_QKV] = acc_sat_mul_u64(lbtc, 3), [A_ATTY] = lbtc,
        [A_LSE] = acc_sat_mul3_u64(Ls, BT, NH), [A_ATTPROJ] = lbtc, [A_RESID2] = lbtc,
        [A_LN2] = lbtc, [A_LN2_MEAN] = lbt, [A_LN2_RSTD] = lbt,
        [A_FCH] = acc_sat_mul_u64(lbtc, 4), [A_FCH_GELU] = acc_sat_mul_u64(lbtc, 4),
        [A_FCPROJ] = lbtc, [A_RESID3] = blk_ck_floats(c, recompute, btc), [A_LNF] = btc,
        [A_LNF_MEAN] = BT, [A_LNF_RSTD] = BT,
        [A_LOGITS] = acc_sat_mul_u64(blk_head_rows(BT, c),
                                     (uint64_t)c->padded_vocab_size),
        [A_LOSSES] = BT,
        [A_DRESID] = btc, [A_DLN] = btc, [A_DATTY] = btc, [A_DQKV] = acc_sat_mul_u64(btc, 3),
        [A_DBIG1] = acc_sat_mul_u64(btc, 4), [A_DBIG2] = acc_sat_mul_u64(btc, 4),
        [A_ATT_SCRATCH] = c->lean_acts ? KERN_ATT_LEAN_SCRATCH(T, NH)
                                       : acc_sat_mul3_u64(2 * NH, (uint64_t)T, (uint64_t)T),
        [A_TOKENS] = BT, [A_TARGETS] = BT, [A_WEIGHTS] = BT,
        [A_LORA_U] = acc_sat_mul3_u64(Lk, (uint64_t)blk_lora_per_layer(c), btr),
        [A_LORA_TMP] = R > 0 ? acc_sat_mul_u64(btc, 4) : 0, [A_LORA_DU] = btr,
    };
    per[A_KEEP] = blk_keep_floats(c, recompute, per, kept, NKEPT, btc);
    memcpy(cnt, per, sizeof per);
    return blk_acts_bytes(cnt, A_COUNT);
}

static int gpt2_act_bytes(const model_config *cfg, int B, int T, int recompute, uint64_t *bytes,
                          acc_err *err)
{
    uint64_t cnt[A_COUNT];
    *bytes = act_counts(cfg, B, T, recompute, cnt);
    return blk_acts_check(*bytes, act_counts(cfg, 1, T, recompute, cnt) == ACC_SIZE_OVERFLOW, B,
                          T, err);
}

/* ---- the composition */

typedef struct gpt2_block {
    blk_norm ln1, ln2;
    blk_linear qkv, proj;
    blk_ffn ffn;
} gpt2_block;

typedef struct gpt2_state {
    blk_embed emb;
    blk_norm lnf;
    blk_head head;
    blk_attn attn;
    gpt2_block *blk; /* [L] */
    void *mem;
    float *a[A_COUNT];
    int lora_per_layer; /* adapted linears per block (blk_lora_per_layer) */
    blk_keep keep;      /* bf16 activation storage (act_bf16) */
} gpt2_state;

static gpt2_state *G(const model *m)
{
    return m->impl;
}

static blk_norm layernorm(const model *m, int wg, int bg, int l)
{
    return (blk_norm){BLK_LAYERNORM, blk_off(m, groups[wg].name, l), blk_off(m, groups[bg].name, l),
                      0.0f, m->cfg.channels};
}

static int gpt2_create(model *m, acc_err *err)
{
    const model_config *c = &m->cfg;
    gpt2_state *s = calloc(1, sizeof *s);
    if (s != NULL)
        s->blk = calloc((size_t)c->n_layer, sizeof *s->blk);
    if (s == NULL || s->blk == NULL) {
        free(s);
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory");
    }
    int C = c->channels;
    s->emb = (blk_embed){blk_off(m, "wte.weight", 0), blk_off(m, "wpe.weight", 0), C, 0.0f};
    s->lnf = layernorm(m, P_LNFW, P_LNFB, 0);
    s->head = (blk_head){.w = s->emb.wte, .C = C, .V = c->vocab_size, .Vp = c->padded_vocab_size};
    s->attn = (blk_attn){.NH = c->n_head, .NKV = c->n_head, .hs = C / c->n_head};
    for (int l = 0; l < c->n_layer; l++) {
        gpt2_block *b = &s->blk[l];
        int slots = 0;
        b->ln1 = layernorm(m, P_LN1W, P_LN1B, l);
        b->ln2 = layernorm(m, P_LN2W, P_LN2B, l);
#define LIN(dst, g, in, out) \
    blk_linear_init(m, dst, groups[g].name, groups[g + 1].name, l, in, out, &slots)
        LIN(&b->qkv, P_QKVW, C, 3 * C);
        LIN(&b->proj, P_ATTPROJW, C, C);
        LIN(&b->ffn.up, P_FCW, C, 4 * C);
        LIN(&b->ffn.down, P_FCPROJW, 4 * C, C);
#undef LIN
        b->ffn.gate = (blk_linear){.w = BLK_NONE, .b = BLK_NONE, .la = BLK_NONE, .lb = BLK_NONE,
                                   .slot = -1};
        b->ffn.act = BLK_GELU_TANH;
        b->ffn.I = 4 * C;
    }
    s->lora_per_layer = blk_lora_per_layer(c);
    m->impl = s;
    return 0;
}

static void gpt2_destroy(model *m)
{
    if (G(m) != NULL)
        free(G(m)->blk);
    free(G(m));
    m->impl = NULL;
}

static void gpt2_acts_free(model *m)
{
    if (G(m) != NULL)
        blk_acts_free(m, &G(m)->mem, G(m)->a, A_COUNT);
}

static int gpt2_acts_alloc(model *m, acc_err *err)
{
    uint64_t cnt[A_COUNT];
    act_counts(&m->cfg, m->B, m->T, m->recompute, cnt);
    gpt2_state *s = G(m);
    int rc = blk_acts_alloc(m, cnt, A_COUNT, &s->mem, s->a, err);
    if (rc == 0 && blk_keep_on(&m->cfg, m->recompute))
        blk_keep_init(&s->keep, m, s->a, cnt, kept, NKEPT, s->a[A_RESID3], s->a[A_KEEP]);
    return rc;
}

static blk_run run_of(model *m, int nseq)
{
    float *const *a = G(m)->a;
    blk_run r = blk_run_of(m, nseq);
    r.lora = (blk_lora_acts){a[A_LORA_U], a[A_LORA_TMP], a[A_LORA_DU], G(m)->lora_per_layer};
    r.keep = blk_keep_on(&m->cfg, m->recompute) ? &G(m)->keep : NULL;
    return r;
}

/* Block l's kept activations (slot 0 in recompute mode), its input and
 * output on the residual stream. */
typedef struct block_acts {
    float *x, *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *lse, *attproj, *resid2;
    float *ln2, *ln2_mean, *ln2_rstd, *fcproj, *out;
    blk_ffn_acts ffn;
} block_acts;

static block_acts block_at(const model *m, int l)
{
    float *const *a = G(m)->a;
    size_t C = (size_t)m->cfg.channels, bt = (size_t)m->B * m->T; /* sized for m->B */
    size_t s = m->recompute ? 0 : (size_t)l; /* statistics */
    size_t k = blk_inner_slot(m, l);          /* the other inner arrays */
    return (block_acts){
        .x = blk_ck_at(m, a[A_ENCODED], a[A_RESID3], l),
        .ln1 = a[A_LN1] + k * bt * C, .ln1_mean = a[A_LN1_MEAN] + s * bt,
        .ln1_rstd = a[A_LN1_RSTD] + s * bt, .qkv = a[A_QKV] + k * bt * 3 * C,
        .atty = a[A_ATTY] + k * bt * C, .lse = a[A_LSE] + s * bt * (size_t)m->cfg.n_head,
        .attproj = a[A_ATTPROJ] + k * bt * C, .resid2 = a[A_RESID2] + k * bt * C,
        .ln2 = a[A_LN2] + k * bt * C, .ln2_mean = a[A_LN2_MEAN] + s * bt,
        .ln2_rstd = a[A_LN2_RSTD] + s * bt, .fcproj = a[A_FCPROJ] + k * bt * C,
        .out = blk_ck_at(m, a[A_ENCODED], a[A_RESID3], l + 1),
        .ffn = {a[A_FCH] + k * bt * 4 * C, NULL, a[A_FCH_GELU] + k * bt * 4 * C},
    };
}

static void block_forward(blk_run *r, int l)
{
    gpt2_state *s = G(r->m);
    const gpt2_block *b = &s->blk[l];
    block_acts x = block_at(r->m, l);
    size_t nc = (size_t)r->N * (size_t)b->proj.out;
    blk_norm_fwd(r, &b->ln1, x.ln1, x.ln1_mean, x.ln1_rstd, x.x);
    blk_linear_fwd(r, l, &b->qkv, x.qkv, x.ln1);
    blk_attn_fused_fwd(r, &s->attn, x.atty, x.lse, s->a[A_ATT_SCRATCH], x.qkv);
    blk_linear_fwd(r, l, &b->proj, x.attproj, x.atty);
    r->k->add(r->d, x.resid2, x.x, x.attproj, nc);
    blk_norm_fwd(r, &b->ln2, x.ln2, x.ln2_mean, x.ln2_rstd, x.resid2);
    blk_ffn_fwd(r, l, &b->ffn, &x.ffn, x.fcproj, x.ln2);
    r->k->add(r->d, x.out, x.resid2, x.fcproj, nc);
}

/* dresid holds d(block output) on entry and d(block input) on exit. */
static void block_backward(blk_run *r, int l)
{
    gpt2_state *s = G(r->m);
    float *const *a = s->a;
    const gpt2_block *b = &s->blk[l];
    block_acts x = block_at(r->m, l);
    size_t nc = (size_t)r->N * (size_t)b->proj.out * sizeof(float);
    /* MLP branch: dresid is d(resid3) and flows to both fcproj and resid2 */
    blk_ffn_grads fg = {a[A_DBIG1], a[A_DBIG2], NULL};
    blk_ffn_bwd(r, l, &b->ffn, &x.ffn, &fg, a[A_DLN], a[A_DRESID], x.ln2);
    blk_norm_bwd(r, &b->ln2, a[A_DRESID], a[A_DLN], x.resid2, x.ln2_mean, x.ln2_rstd);
    /* attention branch: dresid is now d(resid2) */
    r->k->zero(r->d, a[A_DATTY], nc);
    blk_linear_bwd(r, l, &b->proj, a[A_DATTY], a[A_DRESID], x.atty);
    r->k->zero(r->d, a[A_DQKV], 3 * nc);
    blk_attn_fused_bwd(r, &s->attn, a[A_DQKV], a[A_ATT_SCRATCH], a[A_DATTY], x.qkv, x.lse,
                       x.atty);
    r->k->zero(r->d, a[A_DLN], nc);
    blk_linear_bwd(r, l, &b->qkv, a[A_DLN], a[A_DQKV], x.ln1);
    blk_norm_bwd(r, &b->ln1, a[A_DRESID], a[A_DLN], x.x, x.ln1_mean, x.ln1_rstd);
}

/* The stack over the activations. */
static blk_stack stack_of(const model *m)
{
    gpt2_state *s = G(m);
    float *const *a = s->a;
    blk_stack st = {.emb = &s->emb, .norm = &s->lnf, .head = &s->head, .L = m->cfg.n_layer,
                    .fwd = block_forward, .bwd = block_backward, .x0 = block_at(m, 0).x,
                    .xL = block_at(m, m->cfg.n_layer).x, .lnf = a[A_LNF],
                    .lnf_mean = a[A_LNF_MEAN], .lnf_rstd = a[A_LNF_RSTD],
                    .logits = a[A_LOGITS], .losses = a[A_LOSSES], .dresid = a[A_DRESID],
                    .dln = a[A_DLN]};
    blk_stack_ck(m, a[A_RESID3], &st);
    return st;
}

static void gpt2_forward(model *m, const int *tokens, const int *targets, const float *weights,
                         int nseq, int want_grad, double *loss_sum)
{
    float *const *a = G(m)->a;
    blk_run r = run_of(m, nseq);
    blk_inputs in = {(int *)a[A_TOKENS], (int *)a[A_TARGETS], a[A_WEIGHTS], NULL};
    blk_stack st = stack_of(m);
    blk_stack_forward(&r, &st, &in, tokens, targets, weights, want_grad, loss_sum);
}

static void gpt2_backward(model *m, int nseq, void (*done)(void *ctx, int layer), void *ctx)
{
    blk_run r = run_of(m, nseq);
    blk_stack st = stack_of(m);
    blk_stack_backward(&r, &st, (const int *)G(m)->a[A_TOKENS], done, ctx);
}

/* ---- seeded init: N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)),
 * biases 0, LayerNorm weights 1, padded wte rows 0; the draws walk the
 * layout in order (llm.c's), padded rows included, so the weights are a
 * function of (config, seed) only (LoRA's adapters: model_lora_init's). */

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static int gpt2_init_host(const model *m, uint64_t seed, float *host, acc_err *err)
{
    (void)err;
    rng r;
    rng_seed(&r, seed, 0x1417ULL);
    double resid_std = 0.02 / sqrt(2.0 * m->cfg.n_layer);
    for (int k = 0; k < m->layout.n; k++) {
        const model_tensor *t = &m->layout.t[k];
        if (t->adapter)
            continue;
        float *p = host + t->offset;
        bool ln_w = strstr(t->name, "ln_") != NULL && ends_with(t->name, ".weight");
        double std = ends_with(t->name, "c_proj.weight") ? resid_std : 0.02;
        for (size_t j = 0; j < t->count; j++)
            p[j] = ln_w ? 1.0f : t->decays ? (float)(std * rng_normal(&r)) : 0.0f;
        if (!strcmp(t->name, "wte.weight")) /* padded rows: never a target */
            memset(p + model_tensor_file_count(t), 0,
                   (t->count - model_tensor_file_count(t)) * sizeof *p);
    }
    return 0;
}

static const float *gpt2_logits(const model *m)
{
    return G(m)->a[A_LOGITS];
}

static const float *gpt2_token_losses(const model *m)
{
    return G(m)->a[A_LOSSES];
}

static const model_hf_name gpt2_hf[] = {{"GPT2LMHeadModel", "gpt2", 0}, {0}};
static const char *const gpt2_lora_default[] = {"c_attn", NULL}; /* PEFT's for GPT-2 */

/* Inference: block_forward over blk_infer's arrays, the positions' rows of
 * wpe from p0, attention against the key/value cache. */
static void gpt2_infer(model *m, blk_infer *s, const int *tokens, int n, int p0)
{
    gpt2_state *g = G(m);
    blk_run r = blk_infer_run(m, s, tokens, n, p0);
    int C = m->cfg.channels;
    size_t nc = (size_t)n * (size_t)C;
    const float *wte = blk_w(m, g->emb.wte, 0);
    r.k->encoder_fwd(r.d, s->x, s->tok, wte, blk_w(m, g->emb.wpe, 1) + (size_t)p0 * C, 1, n, C);
    for (int l = 0; l < m->cfg.n_layer; l++) {
        const gpt2_block *b = &g->blk[l];
        model_layer_begin(m, l, false);
        blk_norm_fwd(&r, &b->ln1, s->h, s->st1, s->st2, s->x);
        blk_linear_fwd(&r, l, &b->qkv, s->qkv, s->h);
        blk_infer_store(&r, s, l, s->qkv + C, s->qkv + 2 * C, 3 * C, p0);
        blk_infer_attn(&r, s, &g->attn, l, s->att, s->qkv, 3 * C, p0);
        blk_linear_fwd(&r, l, &b->proj, s->tmp, s->att);
        r.k->add(r.d, s->x2, s->x, s->tmp, nc);
        blk_norm_fwd(&r, &b->ln2, s->h, s->st1, s->st2, s->x2);
        blk_ffn_acts fa = {s->f1, NULL, s->f3};
        blk_ffn_fwd(&r, l, &b->ffn, &fa, s->tmp, s->h);
        r.k->add(r.d, s->x, s->x2, s->tmp, nc);
        model_layer_end(m, l, false);
    }
    blk_infer_head(&r, s, &g->lnf, &g->head, s->x);
}

const model_family model_family_gpt2 = {
    .name = "gpt2",
    .hf_names = gpt2_hf,
    .lora_default_targets = gpt2_lora_default,
    .config_from_spec = gpt2_config_from_spec,
    .config_check = gpt2_check,
    .layout = gpt2_layout,
    .act_bytes = gpt2_act_bytes,
    .acts_alloc = gpt2_acts_alloc,
    .acts_free = gpt2_acts_free,
    .forward = gpt2_forward,
    .backward = gpt2_backward,
    .init_host = gpt2_init_host,
    .create = gpt2_create,
    .destroy = gpt2_destroy,
    .config_from_hf = gpt2_config_from_hf,
    .config_to_hf = gpt2_config_to_hf,
    .config_from_fd = model_gpt2_config_from_fd,
    .load_fd_host = model_gpt2_load_fd_host,
    .logits = gpt2_logits,
    .token_losses = gpt2_token_losses,
    .infer = gpt2_infer,
};
