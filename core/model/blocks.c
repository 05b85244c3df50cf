/* blocks: see blocks.h. */
#include "blocks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "model_lora.h"

blk_run blk_run_of(model *m, int nseq)
{
    return (blk_run){.m = m, .d = m->dev, .k = m->dev->ops, .B = nseq, .T = m->T,
                     .N = nseq * m->T};
}

blk_run blk_rows(const blk_run *r, int n0, int n)
{
    blk_run c = *r;
    c.B = 1;
    c.T = c.N = n;
    c.pos = r->pos != NULL ? r->pos + n0 : NULL;
    if (c.lora.u != NULL && !r->infer)
        c.lora.u += (size_t)n0 * (size_t)r->m->cfg.lora.r;
    return c;
}

/* ---- weights */

size_t blk_off(const model *m, const char *fmt, int layer)
{
    char n[MODEL_NAME_MAX];
    if (fmt == NULL)
        return BLK_NONE;
    snprintf(n, sizeof n, fmt, layer);
    const model_tensor *t = model_layout_find(&m->layout, n);
    return t ? t->offset : BLK_NONE;
}

const float *blk_w(model *m, size_t off, int slot)
{
    return off == BLK_NONE ? NULL : model_weight(m, off, slot);
}

float *blk_g(const model *m, size_t off)
{
    return off == BLK_NONE ? NULL : model_grad((model *)m, off);
}

/* ---- linear, with its LoRA adapter */

void blk_linear_init(const model *m, blk_linear *L, const char *wname, const char *bname,
                     int layer, int in, int out, int *slots)
{
    char n[MODEL_NAME_MAX];
    *L = (blk_linear){.w = blk_off(m, wname, layer), .b = blk_off(m, bname, layer), .in = in,
                      .out = out, .slot = -1, .la = BLK_NONE, .lb = BLK_NONE};
    snprintf(n, sizeof n, wname, layer);
    model_lora_find(m, n, &L->la, &L->lb);
    if (L->la != BLK_NONE)
        L->slot = (*slots)++;
}

int blk_lora_per_layer(const model_config *cfg)
{
    if (cfg->lora.r == 0)
        return 0;
    model_layout l;
    if (model_layout_build(cfg, &l, NULL) != 0)
        return 0;
    int n = 0;
    for (int i = 0; i < l.n && l.t[i].adapter; i++)
        n += l.t[i].layer == 0;
    model_layout_free(&l);
    return n / 2; /* A and B */
}

/* u = (alpha/r) A x of L's adapter in block `layer`, kept for the backward. */
static float *lora_u(const blk_run *r, int layer, const blk_linear *L)
{
    const model *m = r->m;
    size_t bt = (size_t)m->B * m->T, R = (size_t)m->cfg.lora.r;
    size_t kept = blk_inner_slot(m, layer);
    if (r->infer) /* one block's worth, the run's rows */
        return r->lora.u + (size_t)L->slot * (size_t)r->N * R;
    return r->lora.u + (kept * (size_t)r->lora.per_layer + (size_t)L->slot) * bt * R;
}

void blk_linear_fwd(blk_run *r, int layer, const blk_linear *L, float *y, const float *x)
{
    model *m = r->m;
    r->k->matmul_fwd(r->d, y, x, blk_w(m, L->w, 0), blk_w(m, L->b, 1), r->N, L->in, L->out);
    if (L->la == BLK_NONE)
        return;
    /* y += B u, u = (alpha/r) A x, from existing matmul ops so every backend has it */
    int R = m->cfg.lora.r;
    float *u = lora_u(r, layer, L);
    r->k->matmul_fwd(r->d, u, x, m->params + L->la, NULL, r->N, L->in, R);
    r->k->scale(r->d, u, model_lora_scale(&m->cfg), (size_t)r->N * R);
    r->k->matmul_fwd(r->d, r->lora.tmp, u, m->params + L->lb, NULL, r->N, R, L->out);
    r->k->add(r->d, y, y, r->lora.tmp, (size_t)r->N * L->out);
}

void blk_linear_bwd(blk_run *r, int layer, const blk_linear *L, float *dx, const float *dy,
                    const float *x)
{
    model *m = r->m;
    r->k->matmul_bwd(r->d, dx, blk_g(m, L->w), blk_g(m, L->b), dy, x, blk_w(m, L->w, 0), r->N,
                     L->in, L->out);
    if (L->la == BLK_NONE)
        return;
    /* dB += dy^T u, du = (alpha/r) dy B, dA += du^T x, dx += du A */
    int R = m->cfg.lora.r;
    float *du = r->lora.du;
    r->k->zero(r->d, du, (size_t)r->N * R * sizeof(float));
    r->k->matmul_bwd(r->d, du, blk_g(m, L->lb), NULL, dy, lora_u(r, layer, L),
                     m->params + L->lb, r->N, R, L->out);
    r->k->scale(r->d, du, model_lora_scale(&m->cfg), (size_t)r->N * R);
    r->k->matmul_bwd(r->d, dx, blk_g(m, L->la), NULL, du, x, m->params + L->la, r->N, L->in, R);
}

/* ---- norms */

void blk_norm_fwd(blk_run *r, const blk_norm *n, float *out, float *mean, float *rstd,
                  const float *x)
{
    model *m = r->m;
    switch (n->kind) {
    case BLK_LAYERNORM:
        r->k->layernorm_fwd(r->d, out, mean, rstd, x, blk_w(m, n->w, 0), blk_w(m, n->b, 1), r->N,
                            n->C);
        return;
    case BLK_RMSNORM:
        r->k->rmsnorm_fwd(r->d, out, rstd, x, blk_w(m, n->w, 0), n->eps, r->N, n->C);
        return;
    case BLK_RMSNORM_P1:
        r->k->rmsnorm_ofs_fwd(r->d, out, rstd, x, blk_w(m, n->w, 0), 1.0f, n->eps, r->N, n->C);
        return;
    }
    abort(); /* an unknown kind */
}

void blk_norm_bwd(blk_run *r, const blk_norm *n, float *dx, const float *dout, const float *x,
                  const float *mean, const float *rstd)
{
    model *m = r->m;
    switch (n->kind) {
    case BLK_LAYERNORM:
        r->k->layernorm_bwd(r->d, dx, blk_g(m, n->w), blk_g(m, n->b), dout, x, blk_w(m, n->w, 0),
                            mean, rstd, r->N, n->C);
        return;
    case BLK_RMSNORM:
        r->k->rmsnorm_bwd(r->d, dx, blk_g(m, n->w), dout, x, blk_w(m, n->w, 0), rstd, r->N, n->C);
        return;
    case BLK_RMSNORM_P1:
        r->k->rmsnorm_ofs_bwd(r->d, dx, blk_g(m, n->w), dout, x, blk_w(m, n->w, 0), 1.0f, rstd,
                              r->N, n->C);
        return;
    }
    abort();
}

/* ---- embedding */

static bool scaled(float s)
{
    return s != 0.0f && s != 1.0f;
}

void blk_embed_fwd(blk_run *r, const blk_embed *e, float *out, const int *tok)
{
    model *m = r->m;
    if (e->wpe != BLK_NONE)
        r->k->encoder_fwd(r->d, out, tok, blk_w(m, e->wte, 0), blk_w(m, e->wpe, 1), r->B, r->T,
                          e->C);
    else
        r->k->embed_fwd(r->d, out, tok, blk_w(m, e->wte, 0), r->N, e->C);
    if (scaled(e->scale))
        r->k->scale(r->d, out, e->scale, (size_t)r->N * e->C);
}

void blk_embed_bwd(blk_run *r, const blk_embed *e, float *dout, const int *tok)
{
    model *m = r->m;
    float *dwte = blk_g(m, e->wte), *dwpe = blk_g(m, e->wpe);
    if (dwte == NULL && dwpe == NULL) /* frozen under LoRA */
        return;
    if (scaled(e->scale))
        r->k->scale(r->d, dout, e->scale, (size_t)r->N * e->C);
    if (e->wpe != BLK_NONE)
        r->k->encoder_bwd(r->d, dwte, dwpe, dout, tok, r->B, r->T, e->C);
    else
        r->k->embed_bwd(r->d, dwte, dout, tok, r->N, e->C);
}

/* ---- rotary embedding */

void blk_rope_cfg(const model_config *c, kern_rope_cfg *out)
{
    *out = (kern_rope_cfg){
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

uint64_t blk_rope_floats(int T, int hs)
{
    return acc_sat_mul_u64((uint64_t)T, (uint64_t)hs / 2);
}

int blk_rope_upload(model *m, const blk_rope *rp, acc_err *err)
{
    size_t n = KERN_ROPE_TABLE(m->T, rp->hs);
    float *cs = malloc(2 * n * sizeof *cs + 1);
    if (cs == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory for the rotary tables");
    kern_rope_cfg rc_;
    blk_rope_cfg(&m->cfg, &rc_);
    int rc = kern_rope_table(&rc_, m->T, rp->hs, cs, cs + n, err);
    if (rc == 0) {
        m->dev->ops->upload(m->dev, rp->cos, cs, n * sizeof *cs);
        m->dev->ops->upload(m->dev, rp->sin, cs + n, n * sizeof *cs);
    }
    free(cs);
    return rc;
}

void blk_rope_fwd(blk_run *r, const blk_rope *rp, float *x, int H)
{
    r->k->rope_fwd(r->d, x, x, rp->cos, rp->sin, r->pos, r->B, r->T, H, rp->hs);
}

void blk_rope_bwd(blk_run *r, const blk_rope *rp, float *dx, int H)
{
    r->k->rope_bwd(r->d, dx, dx, rp->cos, rp->sin, r->pos, r->B, r->T, H, rp->hs);
}

/* ---- attention */

/* The fused (GPT-2) kernels have no variants. */
static void plain_only(const blk_attn *a)
{
    if (a->window != 0 || a->softcap != 0.0f || a->scale != 0.0f)
        abort(); /* config_check refuses what the kernels lack */
}

/* The variants (Gemma 2) through the attention with options; without any,
 * the plain kernels as before. */
static bool attn_variant(const blk_attn *a, kern_att_opts *o)
{
    *o = (kern_att_opts){.scale = a->scale, .softcap = a->softcap, .window = a->window};
    return a->window != 0 || a->softcap != 0.0f || a->scale != 0.0f;
}

static bool lean(const blk_run *r)
{
    return r->m->cfg.lean_acts;
}

void blk_attn_fwd(blk_run *r, const blk_attn *a, float *out, float *lse, float *scratch,
                  const float *q, const float *k, const float *v)
{
    kern_att_opts o;
    bool variant = attn_variant(a, &o);
    if (lean(r))
        r->k->attention_lean_fwd(r->d, out, lse, scratch, q, k, v, a->NH * a->hs,
                                 a->NKV * a->hs, r->pos, &o, r->B, r->T, a->NH, a->NKV, a->hs);
    else if (variant)
        r->k->gqa_attention_opt_fwd(r->d, out, lse, scratch, q, k, v, r->pos, &o, r->B, r->T,
                                    a->NH, a->NKV, a->hs);
    else if (r->pos != NULL)
        r->k->gqa_attention_pos_fwd(r->d, out, lse, scratch, q, k, v, r->pos, r->B, r->T, a->NH,
                                    a->NKV, a->hs);
    else
        r->k->gqa_attention_fwd(r->d, out, lse, scratch, q, k, v, r->B, r->T, a->NH, a->NKV,
                                a->hs);
}

void blk_attn_bwd(blk_run *r, const blk_attn *a, float *dq, float *dk, float *dv,
                  float *scratch, const float *dout, const float *q, const float *k,
                  const float *v, const float *lse, const float *out)
{
    kern_att_opts o;
    bool variant = attn_variant(a, &o);
    if (lean(r))
        r->k->attention_lean_bwd(r->d, dq, dk, dv, scratch, dout, q, k, v, lse, out,
                                 a->NH * a->hs, a->NKV * a->hs, r->pos, &o, r->B, r->T, a->NH,
                                 a->NKV, a->hs);
    else if (variant)
        r->k->gqa_attention_opt_bwd(r->d, dq, dk, dv, scratch, dout, q, k, v, lse, out, r->pos,
                                    &o, r->B, r->T, a->NH, a->NKV, a->hs);
    else if (r->pos != NULL)
        r->k->gqa_attention_pos_bwd(r->d, dq, dk, dv, scratch, dout, q, k, v, lse, out, r->pos,
                                    r->B, r->T, a->NH, a->NKV, a->hs);
    else
        r->k->gqa_attention_bwd(r->d, dq, dk, dv, scratch, dout, q, k, v, lse, out, r->B, r->T,
                                a->NH, a->NKV, a->hs);
}

void blk_attn_fused_fwd(blk_run *r, const blk_attn *a, float *out, float *lse, float *scratch,
                        const float *qkv)
{
    plain_only(a);
    int C = a->NH * a->hs;
    if (lean(r)) /* q, k, v side by side in each row of qkv */
        r->k->attention_lean_fwd(r->d, out, lse, scratch, qkv, qkv + C, qkv + 2 * C, 3 * C,
                                 3 * C, NULL, NULL, r->B, r->T, a->NH, a->NH, a->hs);
    else
        r->k->attention_fwd(r->d, out, lse, scratch, qkv, r->B, r->T, C, a->NH);
}

void blk_attn_fused_bwd(blk_run *r, const blk_attn *a, float *dqkv, float *scratch,
                        const float *dout, const float *qkv, const float *lse, const float *out)
{
    plain_only(a);
    int C = a->NH * a->hs;
    if (lean(r))
        r->k->attention_lean_bwd(r->d, dqkv, dqkv + C, dqkv + 2 * C, scratch, dout, qkv,
                                 qkv + C, qkv + 2 * C, lse, out, 3 * C, 3 * C, NULL, NULL, r->B,
                                 r->T, a->NH, a->NH, a->hs);
    else
        r->k->attention_bwd(r->d, dqkv, scratch, dout, qkv, lse, out, r->B, r->T, C, a->NH);
}

/* ---- feed-forward */

static bool gated(const blk_ffn *f)
{
    return f->gate.w != BLK_NONE;
}

void blk_ffn_fwd(blk_run *r, int layer, const blk_ffn *f, const blk_ffn_acts *a, float *y,
                 const float *x)
{
    size_t n = (size_t)r->N * f->I;
    if (gated(f)) {
        blk_linear_fwd(r, layer, &f->gate, a->pre, x);
        blk_linear_fwd(r, layer, &f->up, a->up, x);
        if (f->act == BLK_SILU)
            r->k->swiglu_fwd(r->d, a->h, a->pre, a->up, n);
        else /* Gemma's tanh-GELU gate */
            r->k->geglu_fwd(r->d, a->h, a->pre, a->up, n);
    } else {
        blk_linear_fwd(r, layer, &f->up, a->pre, x);
        if (f->act != BLK_GELU_TANH)
            abort();
        r->k->gelu_fwd(r->d, a->h, a->pre, n);
    }
    blk_linear_fwd(r, layer, &f->down, y, a->h);
}

void blk_ffn_bwd(blk_run *r, int layer, const blk_ffn *f, const blk_ffn_acts *a,
                 const blk_ffn_grads *g, float *dx, const float *dy, const float *x)
{
    size_t n = (size_t)r->N * f->I, fb = n * sizeof(float);
    r->k->zero(r->d, g->dh, fb);
    blk_linear_bwd(r, layer, &f->down, g->dh, dy, a->h);
    if (gated(f)) {
        r->k->zero(r->d, g->dpre, fb);
        r->k->zero(r->d, g->dup, fb);
        if (f->act == BLK_SILU)
            r->k->swiglu_bwd(r->d, g->dpre, g->dup, g->dh, a->pre, a->up, n);
        else
            r->k->geglu_bwd(r->d, g->dpre, g->dup, g->dh, a->pre, a->up, n);
        r->k->zero(r->d, dx, (size_t)r->N * f->up.in * sizeof(float));
        blk_linear_bwd(r, layer, &f->gate, dx, g->dpre, x);
        blk_linear_bwd(r, layer, &f->up, dx, g->dup, x);
    } else {
        r->k->zero(r->d, g->dpre, fb);
        r->k->gelu_bwd(r->d, g->dpre, a->pre, g->dh, n);
        r->k->zero(r->d, dx, (size_t)r->N * f->up.in * sizeof(float));
        blk_linear_bwd(r, layer, &f->up, dx, g->dpre, x);
    }
}

/* ---- LM head and loss */

void blk_head_fwd(blk_run *r, const blk_head *h, float *logits, float *losses,
                  double *loss_sum, const float *x, const int *targets, const float *weights,
                  int want_grad)
{
    size_t n = (size_t)r->N * h->Vp;
    if (h->softcap != 0.0f) { /* the raw logits kept for the cap's backward */
        r->k->matmul_fwd(r->d, h->raw, x, blk_w(r->m, h->w, 0), NULL, r->N, h->C, h->Vp);
        r->k->softcap_fwd(r->d, logits, h->raw, h->softcap, n);
    } else {
        r->k->matmul_fwd(r->d, logits, x, blk_w(r->m, h->w, 0), NULL, r->N, h->C, h->Vp);
    }
    r->k->xent(r->d, logits, losses, loss_sum, targets, weights, r->N, h->V, h->Vp, want_grad);
}

void blk_head_bwd(blk_run *r, const blk_head *h, float *dx, float *dlogits, const float *x)
{
    if (h->softcap != 0.0f)
        r->k->softcap_bwd(r->d, dlogits, dlogits, h->raw, h->softcap, (size_t)r->N * h->Vp);
    r->k->matmul_bwd(r->d, dx, blk_g(r->m, h->w), NULL, dlogits, x, blk_w(r->m, h->w, 0), r->N,
                     h->C, h->Vp);
}

int blk_head_chunk(const model_config *cfg)
{
    return cfg->lean_chunk > 0 ? cfg->lean_chunk : BLK_HEAD_CHUNK;
}

uint64_t blk_head_rows(uint64_t N, const model_config *cfg)
{
    uint64_t ch = (uint64_t)blk_head_chunk(cfg);
    return cfg->lean_acts && N > ch ? ch : N;
}

void blk_head_lean(blk_run *r, const blk_head *h, float *logits, float *losses,
                   double *loss_sum, const float *x, const int *targets, const float *weights,
                   int want_grad, float *dx)
{
    const float *w = blk_w(r->m, h->w, 0);
    float *dw = blk_g(r->m, h->w);
    int ch = blk_head_chunk(&r->m->cfg);
    *loss_sum = 0.0;
    for (int n0 = 0; n0 < r->N; n0 += ch) {
        int nc = r->N - n0 < ch ? r->N - n0 : ch;
        const float *xc = x + (size_t)n0 * h->C;
        size_t n = (size_t)nc * h->Vp;
        double part = 0.0;
        if (h->softcap != 0.0f) {
            r->k->matmul_fwd(r->d, h->raw, xc, w, NULL, nc, h->C, h->Vp);
            r->k->softcap_fwd(r->d, logits, h->raw, h->softcap, n);
        } else {
            r->k->matmul_fwd(r->d, logits, xc, w, NULL, nc, h->C, h->Vp);
        }
        r->k->xent(r->d, logits, losses + n0, &part, targets + n0, weights + n0, nc, h->V, h->Vp,
                   want_grad);
        *loss_sum += part;
        if (!want_grad)
            continue;
        if (h->softcap != 0.0f)
            r->k->softcap_bwd(r->d, logits, logits, h->raw, h->softcap, n);
        r->k->matmul_bwd(r->d, dx + (size_t)n0 * h->C, dw, NULL, logits, xc, w, nc, h->C,
                         h->Vp);
    }
}

/* ---- inputs */

void blk_inputs_upload(blk_run *r, const blk_inputs *in, const int *tokens, const int *targets,
                       const float *weights)
{
    size_t N = (size_t)r->N;
    r->k->upload(r->d, in->tokens, tokens, N * sizeof(int));
    r->k->upload(r->d, in->targets, targets, N * sizeof(int));
    r->k->upload(r->d, in->weights, weights, N * sizeof(float));
    r->pos = NULL;
    if (r->m->positions != NULL && in->pos != NULL) {
        r->k->upload(r->d, in->pos, r->m->positions, N * sizeof(int));
        r->pos = in->pos;
    }
}

/* ---- bf16 activation storage (blocks.h) */

uint64_t blk_inner_layers(const model_config *c, int recompute)
{
    return recompute || c->act_bf16 ? 1 : (uint64_t)c->n_layer;
}

size_t blk_inner_slot(const model *m, int l)
{
    return m->recompute || m->cfg.act_bf16 ? 0 : (size_t)l;
}

uint64_t blk_resid_rows(const model_config *c)
{
    return c->act_bf16 ? 1 : (uint64_t)c->n_layer;
}

/* bf16 with host checkpoints: one fp32 row and its bf16 staging */
static bool ck_bf16(const model_config *c, int recompute)
{
    return c->act_bf16 && model_act_offload(c, recompute);
}

uint64_t blk_ck_floats(const model_config *c, int recompute, uint64_t btc)
{
    if (ck_bf16(c, recompute))
        return acc_sat_add_u64(btc, btc / 2 + btc % 2);
    return acc_sat_mul_u64(model_act_offload(c, recompute) ? 2 : blk_resid_rows(c), btc);
}

bool blk_keep_on(const model_config *c, int recompute)
{
    return c->act_bf16 && !model_act_offload(c, recompute);
}

size_t blk_resid_row(const model *m, int l)
{
    return m->cfg.act_bf16 ? 0 : (size_t)l;
}

/* bf16 values of one block's kept arrays */
static uint64_t keep_layer_vals(const uint64_t *cnt, const int *kept, int nkept)
{
    uint64_t v = 0;
    for (int i = 0; i < nkept; i++)
        v = acc_sat_add_u64(v, cnt[kept[i]]);
    return v;
}

uint64_t blk_keep_floats(const model_config *c, int recompute, const uint64_t *cnt,
                         const int *kept, int nkept, uint64_t row_vals)
{
    if (!blk_keep_on(c, recompute))
        return 0;
    uint64_t stored = (uint64_t)c->n_layer - 1; /* every block but the last */
    uint64_t per = recompute ? row_vals : acc_sat_add_u64(row_vals, keep_layer_vals(cnt, kept, nkept));
    uint64_t vals = acc_sat_mul_u64(stored, per);
    return vals == ACC_SIZE_OVERFLOW ? vals : vals / 2 + vals % 2; /* two values a float */
}

void blk_keep_init(blk_keep *k, const model *m, float *const *a, const uint64_t *cnt,
                   const int *kept, int nkept, float *rows, float *store)
{
    *k = (blk_keep){.rows = rows, .C = m->cfg.channels, .out = (uint16_t *)store};
    k->row_vals = (uint64_t)m->B * (uint64_t)m->T * (uint64_t)m->cfg.channels;
    for (int i = 0; !m->recompute && i < nkept && k->n < BLK_KEEP_MAX; i++)
        if (cnt[kept[i]] > 0) {
            k->slot[k->n] = a[kept[i]];
            k->cnt[k->n++] = cnt[kept[i]];
            k->layer_vals += cnt[kept[i]];
        }
    k->inner = k->out + (size_t)(m->cfg.n_layer - 1) * k->row_vals;
}

/* After block l's forward (l < L-1: the last block's output and kept
 * arrays stay in fp32 until its backward, which comes first): its output
 * rounded to bf16 in place and kept in the store, then in stored mode its
 * kept arrays narrowed into its part of the store. */
static void keep_after_forward(blk_run *r, int l, int L)
{
    const blk_keep *k = r->keep;
    if (l == L - 1)
        return;
    size_t n = (size_t)r->N * (size_t)k->C;
    uint16_t *out = k->out + (size_t)l * k->row_vals;
    r->k->narrow_bf16(r->d, out, k->rows, n);
    r->k->widen16(r->d, k->rows, out, n, 0);
    uint16_t *p = k->inner + (size_t)l * k->layer_vals;
    for (int i = 0; i < k->n; p += k->cnt[i], i++)
        r->k->narrow_bf16(r->d, p, k->slot[i], (size_t)k->cnt[i]);
}

/* Block l's input (block l-1's output) widened back into the fp32 row. */
static void keep_input(blk_run *r, int l)
{
    const blk_keep *k = r->keep;
    if (l > 0)
        r->k->widen16(r->d, k->rows, k->out + (size_t)(l - 1) * k->row_vals,
                      (size_t)r->N * (size_t)k->C, 0);
}

/* Stored mode: block l's kept arrays widened back into the slot (the last
 * block's are still there). */
static void keep_inner(blk_run *r, int l, int L)
{
    const blk_keep *k = r->keep;
    if (l == L - 1)
        return;
    const uint16_t *p = k->inner + (size_t)l * k->layer_vals;
    for (int i = 0; i < k->n; p += k->cnt[i], i++)
        r->k->widen16(r->d, k->slot[i], p, (size_t)k->cnt[i], 0);
}

/* ---- the layer loop */

void blk_layers_forward(blk_run *r, int L, blk_layer_fn fwd)
{
    for (int l = 0; l < L; l++) {
        model_layer_begin(r->m, l, false);
        fwd(r, l);
        if (r->keep != NULL)
            keep_after_forward(r, l, L);
        model_layer_end(r->m, l, false);
    }
}

void blk_layers_backward(blk_run *r, int L, blk_layer_fn fwd, blk_layer_fn bwd,
                         void (*done)(void *ctx, int layer), void *ctx)
{
    for (int l = L - 1; l >= 0; l--) {
        model_layer_begin(r->m, l, true);
        if (r->keep != NULL)
            keep_input(r, l);
        if (r->m->recompute) { /* rebuild the block's inner activations (same bits) */
            fwd(r, l);
            if (r->keep != NULL) /* its output went to the input's row: the input again */
                keep_input(r, l);
        } else if (r->keep != NULL) {
            keep_inner(r, l, L);
        }
        bwd(r, l);
        model_layer_end(r->m, l, true);
        if (done != NULL)
            done(ctx, l);
    }
}

/* ---- activation checkpoints in host memory (blk_stack.ck_host)
 *
 * fp32: checkpoint l (block l's input) is B T C floats at ck_host + l
 * ck_stride, and block l's input lives in device slot l % 2.
 * bf16 (act_bf16; blocks.h "bf16 activation storage" with act_offload):
 * the device has one fp32 row, which every block reads and writes its
 * output over (as without offload), and a bf16 staging area after it.
 * Checkpoint 0 (the embedding's output, never rounded) is B T C floats,
 * checkpoints 1 .. L-1 (blocks 0 .. L-2's outputs, rounded to bf16 in
 * place after their forward as without offload) B T C bf16 values each
 * after it. */

static size_t ck_bytes(const blk_run *r, const blk_stack *s)
{
    return (size_t)r->N * (size_t)s->ck_C * sizeof(float);
}

/* Checkpoint l's host copy (bf16: l >= 1 are uint16 values). */
static void *ck_host_at(const blk_run *r, const blk_stack *s, int l)
{
    if (!r->m->cfg.act_bf16 || l == 0)
        return s->ck_host + (size_t)l * s->ck_stride;
    uint16_t *rounded = (uint16_t *)(s->ck_host + s->ck_stride); /* after checkpoint 0 */
    return rounded + (size_t)(l - 1) * s->ck_stride;
}

float *blk_ck_at(const model *m, float *enc, float *outs, int l)
{
    size_t btc = (size_t)m->B * m->T * (size_t)m->cfg.channels;
    if (ck_bf16(&m->cfg, m->recompute))
        return outs;
    if (model_act_offload(&m->cfg, m->recompute))
        return outs + (size_t)(l % 2) * btc;
    return l == 0 ? enc : outs + blk_resid_row(m, l - 1) * btc;
}

void blk_stack_ck(const model *m, float *outs, blk_stack *s)
{
    if (!model_act_offload(&m->cfg, m->recompute))
        return;
    s->ck_stride = (size_t)m->B * m->T * (size_t)m->cfg.channels;
    s->ck_slot[0] = blk_ck_at(m, NULL, outs, 0);
    s->ck_slot[1] = ck_bf16(&m->cfg, m->recompute) ? outs + s->ck_stride /* the staging */
                                                   : blk_ck_at(m, NULL, outs, 1);
    s->ck_host = m->ck_host;
    s->ck_C = m->cfg.channels;
}

/* bf16, after block l's forward (l < L-1): its output (the row) rounded in
 * place through the staging, which then holds checkpoint l + 1. */
static void ck_round_output(blk_run *r, const blk_stack *s, int l, int want_grad)
{
    size_t n = (size_t)r->N * (size_t)s->ck_C;
    uint16_t *bf = (uint16_t *)s->ck_slot[1];
    r->k->narrow_bf16(r->d, bf, s->ck_slot[0], n);
    r->k->widen16(r->d, s->ck_slot[0], bf, n, 0);
    if (want_grad)
        r->k->download(r->d, ck_host_at(r, s, l + 1), bf, n * sizeof(uint16_t));
}

/* bf16: checkpoint l back into the row (l >= 1 through the staging;
 * again: only widened, the staging still holds it) */
static void ck_restore_bf16(blk_run *r, const blk_stack *s, int l, bool again)
{
    if (l == 0) {
        r->k->upload(r->d, s->ck_slot[0], ck_host_at(r, s, 0), ck_bytes(r, s));
        return;
    }
    size_t n = (size_t)r->N * (size_t)s->ck_C;
    uint16_t *bf = (uint16_t *)s->ck_slot[1];
    if (!again)
        r->k->upload(r->d, bf, ck_host_at(r, s, l), n * sizeof(uint16_t));
    r->k->widen16(r->d, s->ck_slot[0], bf, n, 0);
}

/* The copies are the device's download / upload, in the compute order:
 * on CPU devices memcpy between the device budget and host memory. */
static void layers_forward_offload(blk_run *r, const blk_stack *s, int want_grad)
{
    bool bf16 = r->m->cfg.act_bf16;
    if (bf16 && want_grad) /* block 0's input, before block 0 writes over it */
        r->k->download(r->d, ck_host_at(r, s, 0), s->ck_slot[0], ck_bytes(r, s));
    for (int l = 0; l < s->L; l++) {
        model_layer_begin(r->m, l, false);
        s->fwd(r, l);
        model_layer_end(r->m, l, false);
        if (want_grad && !bf16) /* block l's input, before block l + 1 writes over its slot */
            r->k->download(r->d, ck_host_at(r, s, l), s->ck_slot[l % 2], ck_bytes(r, s));
        if (bf16 && l < s->L - 1)
            ck_round_output(r, s, l, want_grad);
    }
}

static void layers_backward_offload(blk_run *r, const blk_stack *s, blk_layer_fn refwd,
                                    void (*done)(void *ctx, int layer), void *ctx)
{
    bool bf16 = r->m->cfg.act_bf16;
    for (int l = s->L - 1; l >= 0; l--) {
        model_layer_begin(r->m, l, true);
        if (bf16) /* the row holds the next block's input (l = L-1: the output) */
            ck_restore_bf16(r, s, l, false);
        else if (l < s->L - 1) /* block L-1's input is still in its slot */
            r->k->upload(r->d, s->ck_slot[l % 2], ck_host_at(r, s, l), ck_bytes(r, s));
        refwd(r, l);
        if (bf16) /* the recomputed output went over the input: the input again */
            ck_restore_bf16(r, s, l, true);
        s->bwd(r, l);
        model_layer_end(r->m, l, true);
        if (done != NULL)
            done(ctx, l);
    }
}

/* The final norm's backward from the head's dx (parked in dresid) with
 * dln one chunk of rows: per chunk, as the whole-N path does per row. */
static void final_norm_bwd_chunked(blk_run *r, const blk_stack *s)
{
    size_t C = (size_t)s->norm->C;
    for (int n0 = 0; n0 < r->N; n0 += s->tok_chunk) {
        int nc = r->N - n0 < s->tok_chunk ? r->N - n0 : s->tok_chunk;
        blk_run c = blk_rows(r, n0, nc);
        float *dres = s->dresid + (size_t)n0 * C;
        r->k->copy(r->d, s->dln, dres, (size_t)nc * C * sizeof(float));
        r->k->zero(r->d, dres, (size_t)nc * C * sizeof(float));
        blk_norm_bwd(&c, s->norm, dres, s->dln, s->xL + (size_t)n0 * C,
                     s->lnf_mean != NULL ? s->lnf_mean + n0 : NULL, s->lnf_rstd + n0);
    }
}

/* ---- the whole stack */

void blk_stack_forward(blk_run *r, const blk_stack *s, const blk_inputs *in, const int *tokens,
                       const int *targets, const float *weights, int want_grad,
                       double *loss_sum)
{
    blk_inputs_upload(r, in, tokens, targets, weights);
    blk_embed_fwd(r, s->emb, s->x0, in->tokens);
    if (s->ck_host != NULL)
        layers_forward_offload(r, s, want_grad);
    else
        blk_layers_forward(r, s->L, s->fwd);
    blk_norm_fwd(r, s->norm, s->lnf, s->lnf_mean, s->lnf_rstd, s->xL);
    if (lean(r)) { /* the head's dx parked in dresid until the backward */
        if (want_grad)
            r->k->zero(r->d, s->dresid, (size_t)r->N * (size_t)s->norm->C * sizeof(float));
        blk_head_lean(r, s->head, s->logits, s->losses, loss_sum, s->lnf, in->targets,
                      in->weights, want_grad, s->dresid);
    } else {
        blk_head_fwd(r, s->head, s->logits, s->losses, loss_sum, s->lnf, in->targets,
                     in->weights, want_grad);
    }
}

/* d(loss)/d(xL) into dresid: the head's backward (lean: done in the
 * forward, its dx parked in dresid) and the final norm's. */
static void head_norm_bwd(blk_run *r, const blk_stack *s)
{
    size_t nc = (size_t)r->N * (size_t)s->norm->C * sizeof(float);
    if (lean(r) && s->tok_chunk > 0) {
        final_norm_bwd_chunked(r, s);
        return;
    }
    if (lean(r)) { /* the chunked head ran in the forward: its dx is in dresid */
        r->k->copy(r->d, s->dln, s->dresid, nc);
        r->k->zero(r->d, s->dresid, nc);
    } else {
        r->k->zero(r->d, s->dresid, nc);
        r->k->zero(r->d, s->dln, nc);
        /* logits hold dloss/dlogits (the forward with want_grad) */
        blk_head_bwd(r, s->head, s->dln, s->logits, s->lnf);
    }
    blk_norm_bwd(r, s->norm, s->dresid, s->dln, s->xL, s->lnf_mean, s->lnf_rstd);
}

void blk_stack_backward(blk_run *r, const blk_stack *s, const int *tokens,
                        void (*done)(void *ctx, int layer), void *ctx)
{
    blk_layer_fn refwd = s->refwd != NULL ? s->refwd : s->fwd;
    head_norm_bwd(r, s);
    if (s->ck_host != NULL)
        layers_backward_offload(r, s, refwd, done, ctx);
    else
        blk_layers_backward(r, s->L, refwd, s->bwd, done, ctx);
    blk_embed_bwd(r, s->emb, s->dresid, tokens);
    if (done != NULL)
        done(ctx, -1);
}

/* ---- activations */

uint64_t blk_acts_bytes(const uint64_t *cnt, int n)
{
    uint64_t total = 0;
    for (int i = 0; i < n; i++)
        total = acc_sat_add_u64(total, acc_sat_round_up_u64(cnt[i], 16));
    return acc_sat_mul_u64(total, sizeof(float));
}

int blk_acts_check(uint64_t bytes, int one_overflows, int B, int T, acc_err *err)
{
    if (bytes != ACC_SIZE_OVERFLOW && bytes <= SIZE_MAX && (uint64_t)B * (uint64_t)T <= INT32_MAX)
        return 0;
    return acc_err_set(err, ACC_EINVAL,
                       one_overflows ? "model.seq_len" : "train_micro_batch_size_per_gpu",
                       "the activations for micro batch %d x seq_len %d overflow sizes", B, T);
}

int blk_acts_alloc(model *m, const uint64_t *cnt, int n, void **mem, float **ptr, acc_err *err)
{
    size_t bytes = (size_t)m->act_bytes; /* checked by the family's act_bytes */
    int rc = m->dev->ops->alloc(m->dev, bytes, mem, err);
    if (rc != 0) {
        *mem = NULL;
        return rc;
    }
    m->dev->ops->zero(m->dev, *mem, bytes);
    char *p = *mem;
    for (int i = 0; i < n; i++) {
        ptr[i] = (float *)p;
        p += (cnt[i] + 15) / 16 * 16 * sizeof(float);
    }
    return 0;
}

void blk_acts_free(model *m, void **mem, float **ptr, int n)
{
    if (*mem != NULL)
        m->dev->ops->free(m->dev, *mem);
    *mem = NULL;
    memset(ptr, 0, (size_t)n * sizeof *ptr);
}

/* ---- inference */

enum {
    I_KC, I_VC, I_X, I_X2, I_H, I_TMP, I_Q, I_ATT, I_K, I_V, I_QKV, I_F1, I_F2, I_F3, I_ST1,
    I_ST2, I_SCORES, I_COS, I_SIN, I_LOGITS, I_RAW, I_LORA_U, I_LORA_TMP, I_TOK, I_POS, I_KW, I_VW, I_COUNT
};

bool blk_infer_cache16(const model_config *cfg)
{
    return cfg->weights_dtype == ST_BF16 || cfg->weights_dtype == ST_F16;
}

static int infer_hs(const model_config *c)
{
    return c->head_dim > 0 ? c->head_dim : c->channels / c->n_head;
}

static uint64_t infer_counts(const model_config *c, int chunk, int P, uint64_t *cnt)
{
    uint64_t n = (uint64_t)chunk, L = (uint64_t)c->n_layer, NH = (uint64_t)c->n_head;
    uint64_t hs = (uint64_t)infer_hs(c), NKV = c->n_kv_head > 0 ? (uint64_t)c->n_kv_head : NH;
    uint64_t C = (uint64_t)c->channels, QD = NH * hs, KD = NKV * hs;
    uint64_t I = c->intermediate_size > 0 ? (uint64_t)c->intermediate_size : 4 * C;
    uint64_t wide = C > QD ? C : QD, R = (uint64_t)c->lora.r, Vp = (uint64_t)c->padded_vocab_size;
    uint64_t out = QD + 2 * KD > I ? QD + 2 * KD : I;
    out = out > wide ? out : wide;
    /* the cache: L x P x KD values, 4 bytes each, or 2 (and one block widened) */
    bool c16 = blk_infer_cache16(c);
    uint64_t cache = acc_sat_mul3_u64(L, (uint64_t)P, KD), widened = c16 ? (uint64_t)P * KD : 0;
    if (c16)
        cache = cache / 2 + cache % 2; /* in floats' room */
    uint64_t per[I_COUNT] = {
        [I_KC] = cache, [I_VC] = cache, [I_KW] = widened, [I_VW] = widened,
        [I_X] = n * wide, [I_X2] = n * wide, [I_H] = n * wide, [I_TMP] = n * wide,
        [I_Q] = n * QD, [I_ATT] = n * QD, [I_K] = n * KD, [I_V] = n * KD,
        [I_QKV] = n * (QD + 2 * KD), [I_F1] = n * I, [I_F2] = n * I, [I_F3] = n * I,
        [I_ST1] = n * NH, [I_ST2] = n * NH,
        [I_SCORES] = acc_sat_mul3_u64(n, NH, (uint64_t)P),
        [I_COS] = blk_rope_floats(P, (int)hs), [I_SIN] = blk_rope_floats(P, (int)hs),
        [I_LOGITS] = Vp, [I_RAW] = Vp,
        [I_LORA_U] = acc_sat_mul3_u64((uint64_t)blk_lora_per_layer(c), n, R),
        [I_LORA_TMP] = R > 0 ? n * out : 0, [I_TOK] = n, [I_POS] = n,
    };
    memcpy(cnt, per, sizeof per);
    return blk_acts_bytes(cnt, I_COUNT);
}

uint64_t blk_infer_bytes(const model_config *cfg, int chunk, int P)
{
    uint64_t cnt[I_COUNT];
    return infer_counts(cfg, chunk, P, cnt);
}

int blk_infer_alloc(model *m, int chunk, int P, blk_infer *s, acc_err *err)
{
    uint64_t cnt[I_COUNT];
    uint64_t bytes = infer_counts(&m->cfg, chunk, P, cnt);
    *s = (blk_infer){.chunk = chunk, .P = P};
    if (bytes == ACC_SIZE_OVERFLOW || bytes > SIZE_MAX)
        return acc_err_set(err, ACC_EINVAL, "max_new_tokens",
                           "the key/value cache for %d positions overflows sizes", P);
    int rc = m->dev->ops->alloc(m->dev, (size_t)bytes, &s->mem, err);
    if (rc != 0) {
        s->mem = NULL;
        return rc;
    }
    m->dev->ops->zero(m->dev, s->mem, (size_t)bytes);
    float *a[I_COUNT];
    char *p = s->mem;
    for (int i = 0; i < I_COUNT; i++) {
        a[i] = (float *)p;
        p += (cnt[i] + 15) / 16 * 16 * sizeof(float);
    }
    const model_config *c = &m->cfg;
    int hs = infer_hs(c);
    s->KD = (c->n_kv_head > 0 ? c->n_kv_head : c->n_head) * hs;
    s->kc = a[I_KC], s->vc = a[I_VC], s->x = a[I_X], s->x2 = a[I_X2], s->h = a[I_H];
    s->tmp = a[I_TMP], s->q = a[I_Q], s->att = a[I_ATT], s->k = a[I_K], s->v = a[I_V];
    s->qkv = a[I_QKV], s->f1 = a[I_F1], s->f2 = a[I_F2], s->f3 = a[I_F3];
    s->st1 = a[I_ST1], s->st2 = a[I_ST2], s->scores = a[I_SCORES];
    s->cos = a[I_COS], s->sin = a[I_SIN], s->logits = a[I_LOGITS], s->raw = a[I_RAW];
    s->lora_u = a[I_LORA_U], s->lora_tmp = a[I_LORA_TMP];
    s->tok = (int *)a[I_TOK], s->pos = (int *)a[I_POS];
    if (blk_infer_cache16(c)) {
        s->kc16 = (uint16_t *)a[I_KC], s->vc16 = (uint16_t *)a[I_VC], s->kc = s->vc = NULL;
        s->kw = a[I_KW], s->vw = a[I_VW];
        if (m->dev->ops->narrow_bf16 == NULL)
            rc = acc_err_set(err, ACC_EDEVICE, "device", "the %s backend has no narrow_bf16 (a 16-bit model's cache)",
                             m->dev->ops->backend);
    }
    if (rc == 0 && hs % 2 == 0) { /* the rotary tables (decoders; GPT-2, learned positions, never reads them) */
        size_t n = KERN_ROPE_TABLE(P, hs);
        float *cs = malloc(2 * n * sizeof *cs + 1);
        kern_rope_cfg rcfg;
        blk_rope_cfg(c, &rcfg);
        if (cs == NULL)
            rc = acc_err_set(err, ACC_ENOMEM, "", "out of host memory for the rotary tables");
        else if ((rc = kern_rope_table(&rcfg, P, hs, cs, cs + n, err)) == 0) {
            m->dev->ops->upload(m->dev, s->cos, cs, n * sizeof *cs);
            m->dev->ops->upload(m->dev, s->sin, cs + n, n * sizeof *cs);
        }
        free(cs);
    }
    if (rc != 0)
        blk_infer_free(m, s);
    return rc;
}

void blk_infer_free(model *m, blk_infer *s)
{
    if (s->mem != NULL)
        m->dev->ops->free(m->dev, s->mem);
    *s = (blk_infer){0};
}

blk_run blk_infer_run(model *m, blk_infer *s, const int *tokens, int n, int p0)
{
    int pos[256];
    for (int i0 = 0; i0 < n; i0 += 256) { /* positions p0.., in pieces */
        int k = n - i0 < 256 ? n - i0 : 256;
        for (int i = 0; i < k; i++)
            pos[i] = p0 + i0 + i;
        m->dev->ops->upload(m->dev, s->pos + i0, pos, (size_t)k * sizeof(int));
    }
    m->dev->ops->upload(m->dev, s->tok, tokens, (size_t)n * sizeof(int));
    return (blk_run){.m = m, .d = m->dev, .k = m->dev->ops, .B = 1, .T = n, .N = n,
                     .pos = s->pos, .infer = true,
                     .lora = {s->lora_u, s->lora_tmp, NULL, blk_lora_per_layer(&m->cfg)}};
}

/* bf16: each row rounded into the 16-bit cache */
static void store16(blk_run *r, blk_infer *s, int layer, const float *k, const float *v, int ld, int p0)
{
    size_t KD = (size_t)s->KD, row0 = (size_t)layer * s->P + (size_t)p0;
    if ((size_t)ld == KD) {
        r->k->narrow_bf16(r->d, s->kc16 + row0 * KD, k, (size_t)r->N * KD);
        r->k->narrow_bf16(r->d, s->vc16 + row0 * KD, v, (size_t)r->N * KD);
        return;
    }
    for (int i = 0; i < r->N; i++) {
        r->k->narrow_bf16(r->d, s->kc16 + (row0 + (size_t)i) * KD, k + (size_t)i * ld, KD);
        r->k->narrow_bf16(r->d, s->vc16 + (row0 + (size_t)i) * KD, v + (size_t)i * ld, KD);
    }
}

void blk_infer_store(blk_run *r, blk_infer *s, int layer, const float *k, const float *v,
                     int ld, int p0)
{
    if (s->kc16 != NULL) {
        store16(r, s, layer, k, v, ld, p0);
        return;
    }
    size_t KD = (size_t)s->KD, f = sizeof(float);
    float *kc = s->kc + ((size_t)layer * s->P + (size_t)p0) * KD;
    float *vc = s->vc + ((size_t)layer * s->P + (size_t)p0) * KD;
    if ((size_t)ld == KD) {
        r->k->copy(r->d, kc, k, (size_t)r->N * KD * f);
        r->k->copy(r->d, vc, v, (size_t)r->N * KD * f);
        return;
    }
    for (int i = 0; i < r->N; i++) { /* strided rows (a fused qkv) */
        r->k->copy(r->d, kc + (size_t)i * KD, k + (size_t)i * ld, KD * f);
        r->k->copy(r->d, vc + (size_t)i * KD, v + (size_t)i * ld, KD * f);
    }
}

void blk_infer_attn(blk_run *r, blk_infer *s, const blk_attn *a, int layer, float *out,
                    const float *q, int ldq, int p0)
{
    kern_att_opts o;
    bool opt = attn_variant(a, &o);
    size_t off = (size_t)layer * s->P * (size_t)s->KD;
    const float *kc, *vc;
    if (s->kc16 != NULL) { /* the rows up to the last new one, widened */
        size_t n = ((size_t)p0 + (size_t)r->N) * (size_t)s->KD;
        r->k->widen16(r->d, s->kw, s->kc16 + off, n, 0);
        r->k->widen16(r->d, s->vw, s->vc16 + off, n, 0);
        kc = s->kw, vc = s->vw;
    } else {
        kc = s->kc + off, vc = s->vc + off;
    }
    r->k->attention_cache_fwd(r->d, out, s->scores, q, ldq, kc, vc,
                              opt ? &o : NULL, p0, r->N, a->NH, a->NKV, a->hs);
}

void blk_infer_head(blk_run *r, blk_infer *s, const blk_norm *norm, const blk_head *head,
                    const float *x)
{
    blk_run one = *r;
    one.B = one.T = one.N = 1;
    const float *last = x + (size_t)(r->N - 1) * head->C;
    blk_norm_fwd(&one, norm, s->tmp, s->st1, s->st2, last);
    const float *w = blk_w(r->m, head->w, 0);
    if (head->softcap != 0.0f) {
        r->k->matmul_fwd(r->d, s->raw, s->tmp, w, NULL, 1, head->C, head->Vp);
        r->k->softcap_fwd(r->d, s->logits, s->raw, head->softcap, (size_t)head->Vp);
    } else {
        r->k->matmul_fwd(r->d, s->logits, s->tmp, w, NULL, 1, head->C, head->Vp);
    }
}
