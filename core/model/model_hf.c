/* model_hf: see model_hf.h. */
#include "model_hf.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fsutil.h"
#include "nf4.h"
#include "safepath.h"

static const char *const ignore_suffixes[] = {".rotary_emb.inv_freq", ".attn.bias",
                                              ".attn.masked_bias", NULL};
/* a 4-bit directory's side tensors, checked by nf4_check_side */
static const char *const ignore_nf4[] = {".rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias",
                                         ".weight.absmax", ".weight.quant_map",
                                         ".weight.nested_absmax", ".weight.nested_quant_map",
                                         ".weight.quant_state.bitsandbytes__nf4", NULL};

/* An error from a family's config reader ("config.json: ...") or the layout,
 * with the directory in front. */
static int in_dir(const hf_dir *h, int rc, acc_err *err)
{
    if (rc != 0 && err != NULL) {
        if (strstr(err->msg, hf_path(h)) == NULL)
            acc_err_prefix(err, "%s", hf_path(h));
        if (rc == ACC_EINVAL)
            snprintf(err->field, sizeof err->field, "%s", HF_FIELD);
    }
    return rc;
}

int model_hf_config(const hf_dir *h, model_config *cfg, acc_err *err)
{
    char file[PATH_MAX + 16];
    const model_family *family;
    snprintf(file, sizeof file, "%s/config.json", hf_path(h));
    int rc = model_family_of_hf(hf_config(h), file, &family, err);
    if (rc != 0)
        return rc;
    memset(cfg, 0, sizeof *cfg);
    return in_dir(h, model_config_from_hf(hf_config(h), cfg, err), err);
}

/* GPT2LMHeadModel's state dict names its tensors "transformer.*". */
static const char *name_prefix(const hf_dir *h, const model_layout *l)
{
    static const char pre[] = "transformer.";
    char n[HF_NAME_LEN + 16];
    if (l->n == 0 || hf_has(h, l->t[0].name))
        return "";
    snprintf(n, sizeof n, "%s%s", pre, l->t[0].name);
    return hf_has(h, n) ? pre : "";
}

/* The layout as hf_dir's expected tensors (+ an optional tied lm_head);
 * a 4-bit directory's quantized weights as their packed U8 codes. */
static int wanted(const hf_dir *h, const model_config *cfg, const model_layout *l, hf_tensor **out,
                  int *n, acc_err *err)
{
    const char *pre = name_prefix(h, l);
    hf_tensor *w = calloc((size_t)l->n + 1, sizeof *w);
    if (w == NULL)
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of host memory");
    for (int i = 0; i < l->n; i++) {
        const model_tensor *t = &l->t[i];
        snprintf(w[i].name, sizeof w[i].name, "%s%s", pre, t->name);
        w[i].ndim = t->ndim;
        for (int d = 0; d < t->ndim && d < 2; d++)
            w[i].shape[d] = t->shape[d];
        if (cfg->quant_in_files && model_tensor_nf4(cfg, t)) { /* [(n + 1) / 2, 1] */
            w[i].quant4 = 1;
            w[i].shape[0] = (int64_t)nf4_sizes_of(model_tensor_file_count(t)).bytes;
            w[i].shape[1] = 1;
        }
    }
    *n = l->n;
    if (model_layout_find(l, "lm_head.weight") == NULL && l->n > 0 && l->t[0].ndim == 2) {
        hf_tensor *e = &w[(*n)++]; /* tied: some exporters write the copy anyway */
        snprintf(e->name, sizeof e->name, "lm_head.weight");
        e->ndim = 2;
        e->shape[0] = l->t[0].shape[0];
        e->shape[1] = l->t[0].shape[1];
        e->optional = 1;
    }
    *out = w;
    return 0;
}

/* ---- a 4-bit directory */

/* Side tensor `suffix` of 4-bit weight `w`: its dtype and element count,
 * 1-D (transformers saves them so). */
static int nf4_side_tensor(const hf_dir *h, const char *w, const char *suffix, st_dtype dt,
                           size_t count, acc_err *err)
{
    char name[HF_NAME_LEN + 64];
    st_tensor t;
    snprintf(name, sizeof name, "%s%s", w, suffix);
    if (hf_tensor_info(h, name, &t) != 0)
        return acc_err_set(err, ACC_EINVAL, HF_FIELD, "%s: 4-bit weight %s has no tensor %s",
                           hf_path(h), w, name);
    size_t es = st_dtype_size(t.dtype);
    if (t.dtype != dt || t.ndim != 1 || es == 0 || t.nbytes / es != count)
        return acc_err_set(err, ACC_EINVAL, HF_FIELD,
                           "%s: quant state tensor %s must be %s of shape [%zu] (block size 64%s)",
                           hf_path(h), name, st_dtype_name(dt), count,
                           suffix[1] == 'n' ? ", nested block size 256" : "");
    return 0;
}

/* The JSON of w's quant_state.bitsandbytes__nf4 (read when the directory
 * is mapped): quant_type nf4, blocksize 64, the weight's shape, and under
 * double quantization nested_blocksize 256 and a numeric nested_offset
 * (into *offset). */
static int nf4_quant_state(const hf_dir *h, const model_config *cfg, const model_tensor *t,
                           const char *w, float *offset, acc_err *err)
{
    char name[HF_NAME_LEN + 64];
    st_tensor info;
    snprintf(name, sizeof name, "%s.quant_state.bitsandbytes__fp4", w);
    if (hf_tensor_info(h, name, &info) == 0)
        return acc_err_set(err, ACC_EINVAL, HF_FIELD, "%s: tensor %s: fp4 is not supported yet (nf4 only)",
                           hf_path(h), name);
    snprintf(name, sizeof name, "%s.quant_state.bitsandbytes__nf4", w);
    if (hf_tensor_info(h, name, &info) != 0 || info.dtype != ST_U8 || info.ndim != 1)
        return acc_err_set(err, ACC_EINVAL, HF_FIELD,
                           "%s: 4-bit weight %s has no quant state %s (U8, 1-D: its JSON)",
                           hf_path(h), w, name);
    if (info.data == NULL)
        return 0; /* header only: its bytes are checked when the directory is mapped */
    if (info.nbytes > 4096)
        return acc_err_set(err, ACC_EINVAL, HF_FIELD, "%s: quant state %s is too long", hf_path(h),
                           name);
    char text[4097];
    int rc = hf_read_bytes(h, name, text, info.nbytes, err);
    if (rc != 0)
        return rc;
    json_t *j = json_loadb(text, info.nbytes, 0, NULL);
    const json_t *shape = json_object_get(j, "shape");
    const char *qt = json_string_value(json_object_get(j, "quant_type"));
    const json_t *bs = json_object_get(j, "blocksize"), *nbs = json_object_get(j, "nested_blocksize");
    const json_t *off = json_object_get(j, "nested_offset");
    const char *why = NULL;
    if (!json_is_object(j))
        why = "not a JSON object";
    else if (qt == NULL || strcmp(qt, "nf4") != 0)
        why = "quant_type is not nf4 (fp4 and others are not supported yet)";
    else if (!json_is_integer(bs) || json_integer_value(bs) != NF4_BLOCK)
        why = "blocksize is not 64";
    else if (!json_is_array(shape) || json_array_size(shape) != 2 ||
             json_integer_value(json_array_get(shape, 0)) != t->shape[0] ||
             json_integer_value(json_array_get(shape, 1)) != t->shape[1])
        why = "shape is not the weight's";
    else if (cfg->quant_nested && (!json_is_integer(nbs) || json_integer_value(nbs) != NF4_NESTED_BLOCK))
        why = "nested_blocksize is not 256";
    else if (cfg->quant_nested && !json_is_number(off))
        why = "nested_offset is not a number";
    if (why == NULL && cfg->quant_nested)
        *offset = (float)json_number_value(off);
    json_decref(j);
    return why == NULL ? 0
                       : acc_err_set(err, ACC_EINVAL, HF_FIELD, "%s: quant state %s: %s", hf_path(h),
                                     name, why);
}

/* Every 4-bit weight's side tensors (and, mapped, its quant state). */
static int nf4_check_side(const hf_dir *h, const model_config *cfg, const model_layout *l,
                          acc_err *err)
{
    int rc = 0;
    for (int i = 0; rc == 0 && i < l->n; i++) {
        const model_tensor *t = &l->t[i];
        if (!model_tensor_nf4(cfg, t))
            continue;
        nf4_sizes s = nf4_sizes_of(model_tensor_file_count(t));
        float off;
        rc = nf4_side_tensor(h, t->name, ".absmax", cfg->quant_nested ? ST_U8 : ST_F32, s.blocks, err);
        if (rc == 0)
            rc = nf4_side_tensor(h, t->name, ".quant_map", ST_F32, NF4_MAP, err);
        if (rc == 0 && cfg->quant_nested)
            rc = nf4_side_tensor(h, t->name, ".nested_absmax", ST_F32, s.nested, err);
        if (rc == 0 && cfg->quant_nested)
            rc = nf4_side_tensor(h, t->name, ".nested_quant_map", ST_F32, NF4_DYN_MAP, err);
        if (rc == 0)
            rc = nf4_quant_state(h, cfg, t, t->name, &off, err);
    }
    return rc;
}

int model_hf_check(const hf_dir *h, const model_config *cfg, acc_err *err)
{
    model_layout l = {0};
    int rc = in_dir(h, model_layout_build(cfg, &l, err), err);
    hf_tensor *w = NULL;
    int n = 0;
    model_layout base = model_layout_base(&l); /* LoRA adapters are not in the directory */
    if (rc == 0)
        rc = wanted(h, cfg, &base, &w, &n, err);
    if (rc == 0)
        rc = hf_check(h, w, n, cfg->quant_in_files ? ignore_nf4 : ignore_suffixes, err);
    if (rc == 0 && cfg->quant_in_files)
        rc = nf4_check_side(h, cfg, &base, err);
    free(w);
    model_layout_free(&l);
    return rc;
}

int model_hf_validate(const char *dir, model_config *cfg, acc_err *err)
{
    return model_hf_validate_under("", dir, cfg, err);
}

int model_hf_validate_under(const char *roots, const char *dir, model_config *cfg, acc_err *err)
{
    hf_dir *h;
    int rc = hf_open_under(roots, dir, 1, &h, err);
    if (rc != 0)
        return rc;
    model_config c;
    rc = model_hf_config(h, &c, err);
    if (rc == 0 && c.quant_in_files) { /* mapped: the quant states' JSON is checked */
        hf_close(h);
        h = NULL;
        rc = hf_open_under(roots, dir, 0, &h, err);
    }
    if (rc == 0)
        rc = model_hf_check(h, &c, err);
    if (rc == 0 && cfg != NULL)
        *cfg = c;
    hf_close(h);
    return rc;
}

int model_hf_config_only(const char *roots, const char *dir, model_config *cfg, acc_err *err)
{
    hf_dir *h;
    int rc = hf_open_under(roots, dir, HF_OPEN_CONFIG, &h, err);
    if (rc != 0)
        return rc;
    model_config c;
    model_layout l = {0};
    rc = model_hf_config(h, &c, err);
    if (rc == 0)
        rc = in_dir(h, model_layout_build(&c, &l, err), err);
    model_layout_free(&l);
    if (rc == 0 && cfg != NULL)
        *cfg = c;
    hf_close(h);
    return rc;
}

static size_t largest_tensor(const model_layout *l)
{
    size_t n = 1;
    for (int i = 0; i < l->n; i++) {
        size_t c = model_tensor_file_count(&l->t[i]);
        n = c > n ? c : n;
    }
    return n;
}

/* file [r, c] -> buffer [c, r] */
static void transpose(float *dst, const float *src, size_t r, size_t c)
{
    for (size_t i = 0; i < r; i++)
        for (size_t j = 0; j < c; j++)
            dst[j * r + i] = src[i * c + j];
}

/* 4-bit weight t of the directory into m's store, byte for byte. */
static int nf4_load(model *m, const hf_dir *h, const char *pre, const model_tensor *t, acc_err *err)
{
    char name[HF_NAME_LEN + 64];
    bool nested = m->cfg.quant_nested;
    nf4_sizes s = nf4_sizes_of(model_tensor_file_count(t));
    uint8_t *codes = malloc(s.bytes), *q = malloc(s.blocks);
    float *am = malloc(s.blocks * sizeof *am), *nam = malloc((s.nested + 1) * sizeof *nam);
    float map[NF4_MAP], nmap[NF4_DYN_MAP], off = 0.0f;
    int rc = codes && q && am && nam ? 0 : acc_err_set(err, ACC_ENOMEM, "", "out of host memory loading %s", t->name);
#define NF4_READ(suffix, dst, bytes)                                                   \
    if (rc == 0) {                                                                     \
        snprintf(name, sizeof name, "%s%s%s", pre, t->name, suffix);                   \
        rc = hf_read_bytes(h, name, dst, bytes, err);                                  \
    }
    NF4_READ("", codes, s.bytes)
    NF4_READ(".quant_map", map, sizeof map)
    if (nested) {
        NF4_READ(".absmax", q, s.blocks)
        NF4_READ(".nested_absmax", nam, s.nested * sizeof(float))
        NF4_READ(".nested_quant_map", nmap, sizeof nmap)
    } else {
        NF4_READ(".absmax", am, s.blocks * sizeof(float))
    }
#undef NF4_READ
    snprintf(name, sizeof name, "%s%s", pre, t->name);
    if (rc == 0)
        rc = nf4_quant_state(h, &m->cfg, t, name, &off, err);
    model_nf4_parts p = {.codes = codes, .map = map, .absmax = nested ? NULL : am,
                         .qabsmax = nested ? q : NULL, .nested_absmax = nam, .nested_map = nmap,
                         .offset = off};
    if (rc == 0)
        rc = model_nf4_store(m, t, &p, err);
    free(codes), free(q), free(am), free(nam);
    return rc;
}

int model_hf_load(model *m, const hf_dir *h, acc_err *err)
{
    model_layout base = model_layout_base(&m->layout); /* LoRA adapters are not in it */
    const model_layout *l = &base;
    const char *pre = name_prefix(h, l);
    size_t big = largest_tensor(l);
    float *buf = malloc(big * sizeof *buf), *tb = NULL;
    int rc = buf == NULL ? acc_err_set(err, ACC_ENOMEM, "", "out of host memory loading %s",
                                       hf_path(h))
                         : 0;
    for (int i = 0; rc == 0 && i < l->n; i++) {
        const model_tensor *t = &l->t[i];
        char name[HF_NAME_LEN + 16];
        snprintf(name, sizeof name, "%s%s", pre, t->name);
        size_t n = model_tensor_file_count(t);
        if (m->cfg.quant_in_files && model_tensor_nf4(&m->cfg, t)) { /* as stored */
            rc = t->dtype == ST_NF4 ? nf4_load(m, h, pre, t, err)
                                    : acc_err_set(err, ACC_EINVAL, "lora.r",
                                                  "%s is a 4-bit model: it trains only through "
                                                  "LoRA adapters (QLoRA)", hf_path(h));
            continue;
        }
        rc = hf_read(h, name, buf, n, err);
        const float *src = buf;
        if (rc == 0 && t->transposed) {
            if (tb == NULL && (tb = malloc(big * sizeof *tb)) == NULL) {
                rc = acc_err_set(err, ACC_ENOMEM, "", "out of host memory loading %s", hf_path(h));
                break;
            }
            transpose(tb, buf, (size_t)t->shape[0], (size_t)t->shape[1]);
            src = tb;
        }
        if (rc == 0) /* padding rows past n stay as model_create left them: 0 */
            model_weights_upload(m, src, t->offset, n);
    }
    free(tb);
    free(buf);
    return rc;
}

int model_hf_load_dir(model *m, const char *dir, acc_err *err)
{
    return model_hf_load_under(m, "", dir, err);
}

int model_hf_load_under(model *m, const char *roots, const char *dir, acc_err *err)
{
    hf_dir *h;
    int rc = hf_open_under(roots, dir, 0, &h, err);
    if (rc != 0)
        return rc;
    model_config c;
    rc = model_hf_config(h, &c, err);
    if (rc == 0 && (c.family != m->cfg.family || c.n_layer != m->cfg.n_layer ||
                    c.channels != m->cfg.channels || c.vocab_size != m->cfg.vocab_size ||
                    c.n_head != m->cfg.n_head || c.intermediate_size != m->cfg.intermediate_size))
        rc = acc_err_set(err, ACC_EINVAL, HF_FIELD, "%s/config.json describes another model",
                         hf_path(h));
    if (rc == 0)
        rc = model_hf_check(h, &m->cfg, err);
    if (rc == 0)
        rc = model_hf_load(m, h, err);
    hf_close(h);
    return rc;
}

/* ---- saving */

typedef struct save_ctx {
    const model *m;
    model_layout base; /* the layout without LoRA adapters */
    const float *host; /* model_hf_save_opts.host_params */
    float *tb; /* transpose staging */
} save_ctx;

static int fill_tensor(void *vctx, int i, float *buf, acc_err *err)
{
    (void)err;
    save_ctx *s = vctx;
    const model_tensor *t = &s->base.t[i];
    size_t n = model_tensor_file_count(t);
    if (s->host != NULL) { /* the caller's host copy (model.h's file order) */
        model_tensor_to_file(t, s->host, buf);
        return 0;
    }
    if (!t->transposed) {
        model_weights_download(s->m, buf, t->offset, n);
        return 0;
    }
    /* buffer [shape[1], shape[0]] -> file [shape[0], shape[1]] */
    model_weights_download(s->m, s->tb, t->offset, n);
    transpose(buf, s->tb, (size_t)t->shape[1], (size_t)t->shape[0]);
    return 0;
}

/* The source's config.json (read by hf_dir, under its roots), NULL when
 * it cannot be read: the family's keys are written anyway. */
static json_t *source_config(const char *src_dir, const char *roots)
{
    hf_dir *h;
    if (hf_open_under(roots, src_dir, HF_OPEN_CONFIG, &h, NULL) != 0)
        return NULL;
    json_t *c = json_incref(hf_config(h));
    hf_close(h);
    return c;
}

static int output_config(const model *m, const char *src_dir, const char *src_roots, json_t **out,
                         acc_err *err)
{
    json_t *c = NULL;
    if (src_dir != NULL) {
        c = source_config(src_dir, src_roots);
        if (!json_is_object(c)) {
            json_decref(c);
            c = NULL;
        }
    }
    if (c == NULL && (c = json_object()) == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory");
    /* what accumd writes is never 4-bit: the merged model is the
     * dequantized base plus the adapters */
    json_object_del(c, "quantization_config");
    const model_family *f = model_family_of(&m->cfg);
    int rc = f->config_to_hf ? f->config_to_hf(&m->cfg, c, err)
                             : acc_err_set(err, ACC_EINVAL, "model.arch",
                                           "family %s cannot write a config.json", f->name);
    if (rc != 0) {
        json_decref(c);
        return rc;
    }
    *out = c;
    return 0;
}

uint64_t model_hf_bytes(const model *m, st_dtype d)
{
    uint64_t b = 0;
    model_layout l = model_layout_base(&m->layout);
    for (int i = 0; i < l.n; i++) /* counts checked by the layout */
        b += (uint64_t)model_tensor_file_count(&l.t[i]) * st_dtype_size(d);
    return b;
}

int model_hf_save_config(const model *m, const char *dir, const model_hf_save_opts *o,
                         acc_err *err)
{
    json_t *config = NULL;
    int rc = output_config(m, o->src_dir, o->src_roots, &config, err);
    hf_save_opts ho = {.dtype = o->dtype, .config = config, .src_dir = o->src_dir, .src_roots = o->src_roots};
    if (rc == 0)
        rc = hf_save_side(dir, &ho, err);
    json_decref(config);
    return rc;
}

int model_hf_save(const model *m, const char *dir, const model_hf_save_opts *o, acc_err *err)
{
    save_ctx s = {.m = m, .base = model_layout_base(&m->layout), .host = o->host_params};
    const model_layout *l = &s.base;
    hf_tensor *t = calloc((size_t)l->n + 1, sizeof *t);
    s.tb = malloc(largest_tensor(l) * sizeof(float));
    json_t *config = NULL;
    int rc = t == NULL || s.tb == NULL ? acc_err_set(err, ACC_ENOMEM, "", "out of host memory")
                                       : output_config(m, o->src_dir, o->src_roots, &config, err);
    for (int i = 0; rc == 0 && i < l->n; i++) {
        snprintf(t[i].name, sizeof t[i].name, "%s", l->t[i].name);
        t[i].ndim = l->t[i].ndim;
        for (int d = 0; d < t[i].ndim && d < 2; d++)
            t[i].shape[d] = l->t[i].shape[d];
    }
    hf_save_opts ho = {.dtype = o->dtype, .max_shard_bytes = o->max_shard_bytes, .config = config,
                       .src_dir = o->src_dir, .src_roots = o->src_roots};
    if (rc == 0)
        rc = hf_save(dir, t, l->n, fill_tensor, &s, &ho, err);
    json_decref(config);
    free(s.tb);
    free(t);
    return rc;
}
