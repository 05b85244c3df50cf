/* model_gpt2: see model_gpt2.h. */
#include "model_gpt2.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checked.h"
#include "fsutil.h"
#include "rng.h"
#include "safepath.h"

/* The 16 tensor groups, in llm.c's order (a block group holds all layers). */
enum {
    P_WTE, P_WPE, P_LN1W, P_LN1B, P_QKVW, P_QKVB, P_ATTPROJW, P_ATTPROJB,
    P_LN2W, P_LN2B, P_FCW, P_FCB, P_FCPROJW, P_FCPROJB, P_LNFW, P_LNFB, P_NGROUPS
};

#define HEADER_INTS 256

/* Hugging Face name (%d = layer), file shape in units of C (0: see below),
 * and whether the group is a Conv1D matrix (transposed) / decays. */
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

/* The group of the k-th tensor of the layout (L layers). */
static int group_of(int k, int L)
{
    if (k < 2)
        return k;
    if (k < 2 + 12 * L)
        return P_LN1W + (k - 2) / L;
    return P_LNFW + (k - 2 - 12 * L);
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
    cfg->tie_word_embeddings = cfg->attention_bias = cfg->mlp_bias = true;
    return gpt2_check(cfg, err);
}

/* A positive int member of a Hugging Face config (absent: `def`, if >= 0). */
static int hf_int(const json_t *hf, const char *key, int def, int *out, acc_err *err)
{
    const json_t *v = json_object_get(hf, key);
    if ((v == NULL || json_is_null(v)) && def >= 0) {
        *out = def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > INT32_MAX)
        return acc_err_set(err, ACC_EINVAL, "model.from",
                           "config.json: \"%s\" must be an integer in [1, 2^31)", key);
    *out = (int)json_integer_value(v);
    return 0;
}

static int gpt2_config_from_hf(const json_t *hf, model_config *cfg, acc_err *err)
{
    int rc = hf_int(hf, "n_layer", -1, &cfg->n_layer, err);
    if (rc == 0)
        rc = hf_int(hf, "n_head", -1, &cfg->n_head, err);
    if (rc == 0)
        rc = hf_int(hf, "n_embd", -1, &cfg->channels, err);
    if (rc == 0)
        rc = hf_int(hf, "vocab_size", -1, &cfg->vocab_size, err);
    if (rc == 0)
        rc = hf_int(hf, "n_positions", 1024, &cfg->max_seq_len, err);
    if (rc == 0)
        rc = hf_int(hf, "n_inner", 0, &cfg->intermediate_size, err);
    if (rc != 0)
        return rc;
    const json_t *eps = json_object_get(hf, "layer_norm_epsilon");
    cfg->norm_eps = json_is_number(eps) ? json_number_value(eps) : 1e-5;
    cfg->padded_vocab_size = cfg->vocab_size;
    cfg->tie_word_embeddings = cfg->attention_bias = cfg->mlp_bias = true;
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

/* ---- native files: llm.c .bin, safetensors */

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static int read_header(FILE *f, const char *path, int32_t *h, acc_err *err)
{
    const char *field = "model.init_from";
    if (fread(h, sizeof(int32_t), HEADER_INTS, f) != HEADER_INTS)
        return acc_err_set(err, ACC_EINVAL, field, "%s: shorter than the 1024-byte header", path);
    /* messages never echo the file's bytes: it may be anything */
    if (h[0] != MODEL_LLMC_MAGIC)
        return acc_err_set(err, ACC_EINVAL, field,
                           "%s: not an llm.c GPT-2 checkpoint (no magic number %d in its header)", path,
                           MODEL_LLMC_MAGIC);
    if (h[1] != MODEL_LLMC_VERSION)
        return acc_err_set(err, ACC_EINVAL, field,
                           "%s: unsupported llm.c version, only fp32 version %d is supported", path,
                           MODEL_LLMC_VERSION);
    return 0;
}

static int config_matches(const model_config *c, const spec_model *sm, const char *path,
                          acc_err *err)
{
    const char *field = "model.init_from";
    if (sm->n_layer != c->n_layer || sm->n_head != c->n_head || sm->n_embd != c->channels)
        return acc_err_set(err, ACC_EINVAL, field,
                           "%s has n_layer %d, n_head %d, n_embd %d; the spec asks for %d, %d, %d",
                           path, c->n_layer, c->n_head, c->channels, sm->n_layer, sm->n_head,
                           sm->n_embd);
    if (sm->vocab_size > c->vocab_size)
        return acc_err_set(err, ACC_EINVAL, field, "%s has vocab_size %d < the spec's %d", path,
                           c->vocab_size, sm->vocab_size);
    if (sm->seq_len > c->max_seq_len)
        return acc_err_set(err, ACC_EINVAL, field, "%s has max_seq_len %d < the spec's seq_len %d",
                           path, c->max_seq_len, sm->seq_len);
    return 0;
}

/* A stdio stream over a copy of `fd` (the caller keeps fd). */
static FILE *stream_of(int fd)
{
    int d = dup(fd);
    FILE *f = d >= 0 ? fdopen(d, "rb") : NULL;
    if (f == NULL && d >= 0)
        close(d);
    if (f != NULL)
        rewind(f); /* a dup shares the offset: read from the start */
    return f;
}

static int config_from_llmc(int fd, const char *path, const spec_model *sm, model_config *cfg,
                            acc_err *err)
{
    FILE *f = stream_of(fd);
    if (f == NULL)
        return acc_err_set(err, ACC_EINVAL, "model.init_from", "cannot read %s: %s", path,
                           strerror(errno));
    int32_t h[HEADER_INTS];
    int rc = read_header(f, path, h, err);
    long size = 0;
    if (rc == 0 && fseek(f, 0, SEEK_END) == 0)
        size = ftell(f);
    fclose(f);
    if (rc != 0)
        return rc;
    cfg->max_seq_len = h[2];
    cfg->vocab_size = h[3];
    cfg->n_layer = h[4];
    cfg->n_head = h[5];
    cfg->channels = h[6];
    cfg->padded_vocab_size = h[7] > 0 ? h[7] : h[3];
    cfg->tie_word_embeddings = cfg->attention_bias = cfg->mlp_bias = true;
    if ((rc = gpt2_check(cfg, err)) != 0) {
        if (err != NULL)
            snprintf(err->field, sizeof err->field, "model.init_from");
        return rc;
    }
    model_layout l;
    if ((rc = model_layout_build(cfg, &l, err)) != 0) {
        if (err != NULL)
            snprintf(err->field, sizeof err->field, "model.init_from");
        return rc;
    }
    uint64_t want = acc_sat_add_u64((uint64_t)HEADER_INTS * 4, acc_sat_mul_u64(l.nparams, 4));
    model_layout_free(&l);
    if ((uint64_t)size < want)
        return acc_err_set(err, ACC_EINVAL, "model.init_from",
                           "%s: %ld bytes, its header needs %llu", path, size,
                           (unsigned long long)want);
    return config_matches(cfg, sm, path, err);
}

/* The GPT-2 shape of an open safetensors file. */
static int st_shape(const st_file *f, const char *path, int *n_layer, int *channels, int *vocab,
                    int *max_seq_len, acc_err *err)
{
    st_tensor wte, wpe, t;
    int rc = 0;
    if (st_get(f, "wte.weight", &wte, NULL) != 0 || st_get(f, "wpe.weight", &wpe, NULL) != 0 ||
        wte.ndim != 2 || wpe.ndim != 2)
        rc = acc_err_set(err, ACC_EINVAL, "model.init_from",
                         "%s is not a GPT-2 checkpoint (no wte.weight / wpe.weight)", path);
    int layers = 0;
    char name[MODEL_NAME_MAX];
    while (rc == 0 && layers < 100000) {
        snprintf(name, sizeof name, "h.%d.ln_1.weight", layers);
        if (st_get(f, name, &t, NULL) != 0)
            break;
        layers++;
    }
    if (rc == 0 && (wte.shape[0] > INT32_MAX || wte.shape[1] > INT32_MAX || wpe.shape[0] > INT32_MAX))
        rc = acc_err_set(err, ACC_EINVAL, "model.init_from", "%s: tensor shapes out of range",
                         path);
    if (rc == 0) {
        *n_layer = layers;
        *channels = (int)wte.shape[1];
        *vocab = (int)wte.shape[0];
        *max_seq_len = (int)wpe.shape[0];
    }
    return rc;
}

/* st_open_fd with the error's field set to init_from. */
static int st_open_init(int fd, const char *path, st_file **f, acc_err *err)
{
    int rc = st_open_fd(fd, path, f, err);
    if (rc == 0 || rc == ACC_ENOMEM)
        return rc;
    *f = NULL;
    char msg[sizeof err->msg] = "";
    if (err != NULL)
        snprintf(msg, sizeof msg, "%s", err->msg);
    return acc_err_set(err, ACC_EINVAL, "model.init_from", "%s", msg);
}

int model_gpt2_safetensors_shape(const char *path, int *n_layer, int *channels, int *vocab,
                                 int *max_seq_len, acc_err *err)
{
    int fd;
    int rc = sp_open_file("", path, "model.init_from", &fd, NULL, 0, err);
    if (rc != 0)
        return rc;
    st_file *f;
    rc = st_open_init(fd, path, &f, err);
    close(fd);
    if (rc != 0)
        return rc;
    rc = st_shape(f, path, n_layer, channels, vocab, max_seq_len, err);
    st_close(f);
    return rc;
}

/* init_from a safetensors GPT-2: the spec's shape, checked against the
 * file; wpe keeps the file's rows. */
static int config_from_safetensors(int fd, const char *path, const spec_model *sm,
                                   model_config *cfg, acc_err *err)
{
    int layers, channels, vocab, max_seq;
    st_file *f = NULL;
    int rc = gpt2_config_from_spec(sm, cfg, err);
    if (rc == 0)
        rc = st_open_init(fd, path, &f, err);
    if (rc == 0)
        rc = st_shape(f, path, &layers, &channels, &vocab, &max_seq, err);
    st_close(f);
    if (rc != 0)
        return rc;
    if (layers != cfg->n_layer || channels != cfg->channels || vocab != cfg->vocab_size ||
        max_seq < sm->seq_len)
        return acc_err_set(err, ACC_EINVAL, "model.init_from",
                           "%s has n_layer %d, n_embd %d, vocab %d, %d positions; the spec asks for "
                           "%d, %d, %d, seq_len %d", path, layers, channels, vocab, max_seq,
                           cfg->n_layer, cfg->channels, cfg->vocab_size, sm->seq_len);
    cfg->max_seq_len = max_seq;
    return 0;
}

static int gpt2_config_from_fd(int fd, const char *path, const spec_model *sm,
                               model_config *cfg, acc_err *err)
{
    return ends_with(path, ".safetensors") ? config_from_safetensors(fd, path, sm, cfg, err)
                                           : config_from_llmc(fd, path, sm, cfg, err);
}

static int load_llmc_host(const model *m, int fd, const char *path, float *host, acc_err *err)
{
    const char *field = "model.init_from";
    FILE *f = stream_of(fd);
    if (f == NULL)
        return acc_err_set(err, ACC_EINVAL, field, "cannot read %s: %s", path, strerror(errno));
    int32_t h[HEADER_INTS];
    int rc = read_header(f, path, h, err);
    if (rc == 0 && (h[2] != m->cfg.max_seq_len || h[3] != m->cfg.vocab_size ||
                    h[4] != m->cfg.n_layer || h[5] != m->cfg.n_head || h[6] != m->cfg.channels ||
                    (h[7] > 0 ? h[7] : h[3]) != m->cfg.padded_vocab_size))
        rc = acc_err_set(err, ACC_EINVAL, field, "%s: header does not match the model", path);
    if (rc == 0 && fread(host, sizeof *host, m->nparams, f) != m->nparams)
        rc = acc_err_set(err, ACC_EINVAL, field, "%s: truncated parameters", path);
    fclose(f);
    return rc;
}

static int load_safetensors_host(const model *m, int fd, const char *path, float *host,
                                 acc_err *err)
{
    st_file *f;
    int rc = st_open_init(fd, path, &f, err);
    if (rc != 0)
        return rc;
    rc = model_safetensors_read(&m->layout, f, path, "model.init_from", host, err);
    st_close(f);
    return rc;
}

static int gpt2_load_fd_host(const model *m, int fd, const char *path, float *host,
                             acc_err *err)
{
    return ends_with(path, ".safetensors") ? load_safetensors_host(m, fd, path, host, err)
                                           : load_llmc_host(m, fd, path, host, err);
}

int model_load_llmc_fd(model *m, int fd, const char *path, acc_err *err)
{
    float *host = malloc(m->nparams * sizeof *host);
    if (host == NULL)
        return acc_err_set(err, ACC_ENOMEM, "model.init_from", "out of host memory loading %s",
                           path);
    int rc = load_llmc_host(m, fd, path, host, err);
    if (rc == 0)
        model_params_upload(m, host);
    free(host);
    return rc;
}

int model_load_llmc(model *m, const char *path, acc_err *err)
{
    int fd;
    int rc = sp_open_file("", path, "model.init_from", &fd, NULL, 0, err);
    if (rc != 0)
        return rc;
    rc = model_load_llmc_fd(m, fd, path, err);
    close(fd);
    return rc;
}

int model_save_llmc(const model *m, const char *path, acc_err *err)
{
    float *host = malloc(m->nparams * sizeof *host);
    if (host == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory saving %s", path);
    model_params_download(m, host);
    int32_t h[HEADER_INTS] = {MODEL_LLMC_MAGIC, MODEL_LLMC_VERSION, m->cfg.max_seq_len,
                              m->cfg.vocab_size, m->cfg.n_layer, m->cfg.n_head,
                              m->cfg.channels, m->cfg.padded_vocab_size};
    fsu_chunk c[2] = {{h, sizeof h}, {host, m->nparams * sizeof *host}};
    int rc = fsu_write_atomic_chunks(path, c, 2, err);
    free(host);
    return rc;
}

/* ---- seeded init: N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)),
 * biases 0, LayerNorm weights 1, padded wte rows 0; the draws walk the
 * layout in order (llm.c's), padded rows included, so the weights are a
 * function of (config, seed) only. */

static int gpt2_init_host(const model *m, uint64_t seed, float *host, acc_err *err)
{
    (void)err;
    rng r;
    rng_seed(&r, seed, 0x1417ULL);
    double resid_std = 0.02 / sqrt(2.0 * m->cfg.n_layer);
    for (int k = 0; k < m->layout.n; k++) {
        const model_tensor *t = &m->layout.t[k];
        int g = group_of(k, m->cfg.n_layer);
        float *p = host + t->offset;
        int is_ln_w = g == P_LN1W || g == P_LN2W || g == P_LNFW;
        double std = (g == P_ATTPROJW || g == P_FCPROJW) ? resid_std : 0.02;
        for (size_t j = 0; j < t->count; j++)
            p[j] = is_ln_w ? 1.0f : t->decays ? (float)(std * rng_normal(&r)) : 0.0f;
    }
    /* padded vocabulary rows stay zero: they are never a target */
    size_t C = (size_t)m->cfg.channels;
    memset(host + (size_t)m->cfg.vocab_size * C, 0,
           (size_t)(m->cfg.padded_vocab_size - m->cfg.vocab_size) * C * sizeof *host);
    return 0;
}

/* ---- activations
 *
 * Stored mode keeps every layer's activations for the backward. Recompute
 * mode keeps only each layer's output on the residual stream (resid3, L
 * copies) plus ONE layer's worth of the rest (slot 0), and the backward
 * re-runs a block's forward from its stored input before its backward. */

typedef struct gpt2_acts {
    float *encoded;                                     /* [BT,C] */
    float *ln1, *ln1_mean, *ln1_rstd;                   /* [L,BT,C], [L,BT] */
    float *qkv;                                         /* [L,BT,3C] */
    float *atty;                                        /* [L,BT,C] */
    float *lse;                                         /* [L,B,NH,T] attention rows' log-sum-exp */
    float *attproj, *resid2;                            /* [L,BT,C] */
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fch, *fch_gelu;                              /* [L,BT,4C] */
    float *fcproj, *resid3;                             /* [L,BT,C] */
    float *lnf, *lnf_mean, *lnf_rstd;                   /* [BT,C], [BT] */
    float *logits;                                      /* [BT,Vp] */
    float *losses;                                      /* [BT] */
    /* backward scratch, one layer at a time */
    float *dresid, *dln, *datty, *dqkv, *dbig1, *dbig2;
    float *att_scratch;                                 /* KERN_ATT_SCRATCH(T, NH): fwd and bwd */
    /* inputs */
    int *tokens, *targets;
    float *weights;
} gpt2_acts;

/* The family's state: where each group starts, and the activations. */
typedef struct gpt2_state {
    size_t off[P_NGROUPS];
    void *act_mem;
    gpt2_acts a;
} gpt2_state;

static gpt2_state *G(const model *m)
{
    return m->impl;
}

enum {
    A_ENCODED, A_LN1, A_LN1_MEAN, A_LN1_RSTD, A_QKV, A_ATTY, A_LSE, A_ATTPROJ, A_RESID2,
    A_LN2, A_LN2_MEAN, A_LN2_RSTD, A_FCH, A_FCH_GELU, A_FCPROJ, A_RESID3, A_LNF,
    A_LNF_MEAN, A_LNF_RSTD, A_LOGITS, A_LOSSES, A_DRESID, A_DLN, A_DATTY, A_DQKV,
    A_DBIG1, A_DBIG2, A_ATT_SCRATCH, A_TOKENS, A_TARGETS, A_WEIGHTS, A_COUNT
};

/* Floats of each activation array for B x T (saturated), and the bytes of
 * them all, each rounded up to 16 floats (64-byte aligned arrays). */
static uint64_t act_counts(const model_config *c, int B, int T, int recompute, uint64_t *cnt)
{
    uint64_t BT = acc_sat_mul_u64((uint64_t)B, (uint64_t)T), C = (uint64_t)c->channels;
    uint64_t L = (uint64_t)c->n_layer, NH = (uint64_t)c->n_head;
    uint64_t Ls = recompute ? 1 : L; /* layers whose inner activations are kept */
    uint64_t btc = acc_sat_mul_u64(BT, C), lbtc = acc_sat_mul_u64(Ls, btc);
    uint64_t lbt = acc_sat_mul_u64(Ls, BT);
    uint64_t lse = acc_sat_mul_u64(BT, NH);
    uint64_t per[A_COUNT] = {
        [A_ENCODED] = btc, [A_LN1] = lbtc, [A_LN1_MEAN] = lbt,
        [A_LN1_RSTD] = lbt, [A_QKV] = acc_sat_mul_u64(lbtc, 3), [A_ATTY] = lbtc,
        [A_LSE] = acc_sat_mul_u64(Ls, lse), [A_ATTPROJ] = lbtc, [A_RESID2] = lbtc,
        [A_LN2] = lbtc, [A_LN2_MEAN] = lbt, [A_LN2_RSTD] = lbt,
        [A_FCH] = acc_sat_mul_u64(lbtc, 4), [A_FCH_GELU] = acc_sat_mul_u64(lbtc, 4),
        [A_FCPROJ] = lbtc, [A_RESID3] = acc_sat_mul_u64(L, btc), [A_LNF] = btc,
        [A_LNF_MEAN] = BT, [A_LNF_RSTD] = BT,
        [A_LOGITS] = acc_sat_mul_u64(BT, (uint64_t)c->padded_vocab_size), [A_LOSSES] = BT,
        [A_DRESID] = btc, [A_DLN] = btc, [A_DATTY] = btc, [A_DQKV] = acc_sat_mul_u64(btc, 3),
        [A_DBIG1] = acc_sat_mul_u64(btc, 4), [A_DBIG2] = acc_sat_mul_u64(btc, 4),
        /* KERN_ATT_SCRATCH(T, NH), checked */
        [A_ATT_SCRATCH] = acc_sat_mul3_u64(2 * NH, (uint64_t)T, (uint64_t)T),
        [A_TOKENS] = BT, [A_TARGETS] = BT, [A_WEIGHTS] = BT,
    };
    uint64_t total = 0;
    for (int i = 0; i < A_COUNT; i++) {
        cnt[i] = per[i];
        total = acc_sat_add_u64(total, acc_sat_round_up_u64(per[i], 16));
    }
    return acc_sat_mul_u64(total, sizeof(float));
}

static int gpt2_act_bytes(const model_config *cfg, int B, int T, int recompute, uint64_t *bytes,
                          acc_err *err)
{
    uint64_t cnt[A_COUNT];
    *bytes = act_counts(cfg, B, T, recompute, cnt);
    if (*bytes != ACC_SIZE_OVERFLOW && *bytes <= SIZE_MAX)
        return 0;
    /* name what made it overflow: the sequence alone, or the micro batch */
    int one = act_counts(cfg, 1, T, recompute, cnt) == ACC_SIZE_OVERFLOW;
    return acc_err_set(err, ACC_EINVAL, one ? "model.seq_len" : "train_micro_batch_size_per_gpu",
                       "the activations for micro batch %d x seq_len %d overflow 64-bit sizes",
                       B, T);
}

static void gpt2_gemm_extent(const model_config *c, uint64_t n, model_gemm_extent *out)
{
    uint64_t C = (uint64_t)c->channels, vp = (uint64_t)c->padded_vocab_size;
    uint64_t c4 = acc_sat_mul_u64(4, C);
    uint64_t wide = c4 > vp ? c4 : vp;
    /* A side: N x max(4C, Vp) (fc / fc-proj activations, the logits' gradient);
     * B side: max(Vp C, 4C C, N 4C) (wte, the MLP weights, fc-proj's input) */
    uint64_t b = acc_sat_mul_u64(vp, C), w = acc_sat_mul_u64(c4, C), x = acc_sat_mul_u64(n, c4);
    if (w > b)
        b = w;
    if (x > b)
        b = x;
    out->a_elems = acc_sat_mul_u64(n, wide);
    out->b_elems = b;
}

static void carve_acts(model *m)
{
    gpt2_state *s = G(m);
    uint64_t cnt[A_COUNT];
    act_counts(&m->cfg, m->B, m->T, m->recompute, cnt);
    void *ptr[A_COUNT];
    char *p = s->act_mem;
    for (int i = 0; i < A_COUNT; i++) {
        ptr[i] = p;
        p += (cnt[i] + 15) / 16 * 16 * sizeof(float); /* checked by act_bytes */
    }
    gpt2_acts *a = &s->a;
    a->encoded = ptr[A_ENCODED];
    a->ln1 = ptr[A_LN1];
    a->ln1_mean = ptr[A_LN1_MEAN];
    a->ln1_rstd = ptr[A_LN1_RSTD];
    a->qkv = ptr[A_QKV];
    a->atty = ptr[A_ATTY];
    a->lse = ptr[A_LSE];
    a->attproj = ptr[A_ATTPROJ];
    a->resid2 = ptr[A_RESID2];
    a->ln2 = ptr[A_LN2];
    a->ln2_mean = ptr[A_LN2_MEAN];
    a->ln2_rstd = ptr[A_LN2_RSTD];
    a->fch = ptr[A_FCH];
    a->fch_gelu = ptr[A_FCH_GELU];
    a->fcproj = ptr[A_FCPROJ];
    a->resid3 = ptr[A_RESID3];
    a->lnf = ptr[A_LNF];
    a->lnf_mean = ptr[A_LNF_MEAN];
    a->lnf_rstd = ptr[A_LNF_RSTD];
    a->logits = ptr[A_LOGITS];
    a->losses = ptr[A_LOSSES];
    a->dresid = ptr[A_DRESID];
    a->dln = ptr[A_DLN];
    a->datty = ptr[A_DATTY];
    a->dqkv = ptr[A_DQKV];
    a->dbig1 = ptr[A_DBIG1];
    a->dbig2 = ptr[A_DBIG2];
    a->att_scratch = ptr[A_ATT_SCRATCH];
    a->tokens = ptr[A_TOKENS];
    a->targets = ptr[A_TARGETS];
    a->weights = ptr[A_WEIGHTS];
}

static int gpt2_create(model *m, acc_err *err)
{
    gpt2_state *s = calloc(1, sizeof *s);
    if (s == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory");
    int L = m->cfg.n_layer;
    for (int k = 0; k < m->layout.n; k++) {
        int g = group_of(k, L);
        if (!group_layered(g) || m->layout.t[k].layer == 0)
            s->off[g] = m->layout.t[k].offset;
    }
    m->impl = s;
    return 0;
}

static void gpt2_destroy(model *m)
{
    free(m->impl);
    m->impl = NULL;
}

static void gpt2_acts_free(model *m)
{
    gpt2_state *s = G(m);
    if (s == NULL)
        return;
    if (s->act_mem != NULL)
        m->dev->ops->free(m->dev, s->act_mem);
    s->act_mem = NULL;
    memset(&s->a, 0, sizeof s->a);
}

static int gpt2_acts_alloc(model *m, acc_err *err)
{
    gpt2_state *s = G(m);
    size_t bytes = (size_t)m->act_bytes; /* checked by act_bytes */
    int rc = m->dev->ops->alloc(m->dev, bytes, &s->act_mem, err);
    if (rc != 0) {
        s->act_mem = NULL;
        return rc;
    }
    m->dev->ops->zero(m->dev, s->act_mem, bytes);
    carve_acts(m);
    return 0;
}

/* ---- forward / backward */

static float *P(const model *m, float *base, int tensor, int layer, size_t per_layer)
{
    return base + G(m)->off[tensor] + (size_t)layer * per_layer;
}

/* One block's activations: layer l's slot (slot 0 in recompute mode) and
 * its output on the residual stream (always layer l's own). */
typedef struct block_acts {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *lse, *attproj, *resid2;
    float *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu, *fcproj, *resid3;
} block_acts;

static block_acts block_at(const model *m, int l)
{
    const gpt2_acts *a = &G(m)->a;
    size_t C = (size_t)m->cfg.channels, bt = (size_t)m->B * m->T; /* sized for m->B */
    size_t lse_l = (size_t)m->B * m->cfg.n_head * m->T;
    size_t s = m->recompute ? 0 : (size_t)l;
    block_acts b = {
        .ln1 = a->ln1 + s * bt * C, .ln1_mean = a->ln1_mean + s * bt,
        .ln1_rstd = a->ln1_rstd + s * bt, .qkv = a->qkv + s * bt * 3 * C,
        .atty = a->atty + s * bt * C, .lse = a->lse + s * lse_l,
        .attproj = a->attproj + s * bt * C, .resid2 = a->resid2 + s * bt * C,
        .ln2 = a->ln2 + s * bt * C, .ln2_mean = a->ln2_mean + s * bt,
        .ln2_rstd = a->ln2_rstd + s * bt, .fch = a->fch + s * bt * 4 * C,
        .fch_gelu = a->fch_gelu + s * bt * 4 * C, .fcproj = a->fcproj + s * bt * C,
        .resid3 = a->resid3 + (size_t)l * bt * C,
    };
    return b;
}

/* The residual stream entering block l. */
static float *block_input(const model *m, int l)
{
    size_t bt = (size_t)m->B * m->T;
    return l == 0 ? G(m)->a.encoded : G(m)->a.resid3 + (size_t)(l - 1) * bt * m->cfg.channels;
}

static void block_forward(model *m, int l, int B)
{
    kern_device *d = m->dev;
    const kern_ops *k = d->ops;
    int T = m->T, C = m->cfg.channels, NH = m->cfg.n_head;
    size_t BT = (size_t)B * T, C_ = (size_t)C;
    float *p = m->params, *resid = block_input(m, l);
    block_acts b = block_at(m, l);
    k->layernorm_fwd(d, b.ln1, b.ln1_mean, b.ln1_rstd, resid, P(m, p, P_LN1W, l, C_),
                     P(m, p, P_LN1B, l, C_), (int)BT, C);
    k->matmul_fwd(d, b.qkv, b.ln1, P(m, p, P_QKVW, l, 3 * C_ * C_), P(m, p, P_QKVB, l, 3 * C_),
                  (int)BT, C, 3 * C);
    k->attention_fwd(d, b.atty, b.lse, G(m)->a.att_scratch, b.qkv, B, T, C, NH);
    k->matmul_fwd(d, b.attproj, b.atty, P(m, p, P_ATTPROJW, l, C_ * C_),
                  P(m, p, P_ATTPROJB, l, C_), (int)BT, C, C);
    k->add(d, b.resid2, resid, b.attproj, BT * C_);
    k->layernorm_fwd(d, b.ln2, b.ln2_mean, b.ln2_rstd, b.resid2, P(m, p, P_LN2W, l, C_),
                     P(m, p, P_LN2B, l, C_), (int)BT, C);
    k->matmul_fwd(d, b.fch, b.ln2, P(m, p, P_FCW, l, 4 * C_ * C_), P(m, p, P_FCB, l, 4 * C_),
                  (int)BT, C, 4 * C);
    k->gelu_fwd(d, b.fch_gelu, b.fch, BT * 4 * C_);
    k->matmul_fwd(d, b.fcproj, b.fch_gelu, P(m, p, P_FCPROJW, l, 4 * C_ * C_),
                  P(m, p, P_FCPROJB, l, C_), (int)BT, 4 * C, C);
    k->add(d, b.resid3, b.resid2, b.fcproj, BT * C_);
}

static void gpt2_forward(model *m, const int *tokens, const int *targets, const float *weights,
                   int nseq, int want_grad, double *loss_sum)
{
    kern_device *d = m->dev;
    const kern_ops *k = d->ops;
    gpt2_acts *a = &G(m)->a;
    int B = nseq, T = m->T, C = m->cfg.channels, L = m->cfg.n_layer;
    int Vp = m->cfg.padded_vocab_size;
    size_t BT = (size_t)B * T;
    k->upload(d, a->tokens, tokens, BT * sizeof(int));
    k->upload(d, a->targets, targets, BT * sizeof(int));
    k->upload(d, a->weights, weights, BT * sizeof(float));

    float *p = m->params;
    k->encoder_fwd(d, a->encoded, a->tokens, P(m, p, P_WTE, 0, 0), P(m, p, P_WPE, 0, 0), B, T, C);
    for (int l = 0; l < L; l++)
        block_forward(m, l, B);
    k->layernorm_fwd(d, a->lnf, a->lnf_mean, a->lnf_rstd, block_input(m, L),
                     P(m, p, P_LNFW, 0, 0), P(m, p, P_LNFB, 0, 0), (int)BT, C);
    k->matmul_fwd(d, a->logits, a->lnf, P(m, p, P_WTE, 0, 0), NULL, (int)BT, C, Vp);
    k->xent(d, a->logits, a->losses, loss_sum, a->targets, a->weights, (int)BT,
            m->cfg.vocab_size, Vp, want_grad);
}

/* dresid holds d(block output) on entry and d(block input) on exit. */
static void block_backward(model *m, int l, int B)
{
    kern_device *d = m->dev;
    const kern_ops *k = d->ops;
    gpt2_acts *a = &G(m)->a;
    int T = m->T, C = m->cfg.channels, NH = m->cfg.n_head;
    size_t BT = (size_t)B * T, C_ = (size_t)C;
    float *p = m->params, *g = m->grads, *resid_in = block_input(m, l);
    block_acts b = block_at(m, l);
    /* MLP branch: dresid is d(resid3) and flows to both fcproj and resid2 */
    k->zero(d, a->dbig1, BT * 4 * C_ * sizeof(float));
    k->matmul_bwd(d, a->dbig1, P(m, g, P_FCPROJW, l, 4 * C_ * C_), P(m, g, P_FCPROJB, l, C_),
                  a->dresid, b.fch_gelu, P(m, p, P_FCPROJW, l, 4 * C_ * C_), (int)BT, 4 * C, C);
    k->zero(d, a->dbig2, BT * 4 * C_ * sizeof(float));
    k->gelu_bwd(d, a->dbig2, b.fch, a->dbig1, BT * 4 * C_);
    k->zero(d, a->dln, BT * C_ * sizeof(float));
    k->matmul_bwd(d, a->dln, P(m, g, P_FCW, l, 4 * C_ * C_), P(m, g, P_FCB, l, 4 * C_),
                  a->dbig2, b.ln2, P(m, p, P_FCW, l, 4 * C_ * C_), (int)BT, C, 4 * C);
    k->layernorm_bwd(d, a->dresid, P(m, g, P_LN2W, l, C_), P(m, g, P_LN2B, l, C_), a->dln,
                     b.resid2, P(m, p, P_LN2W, l, C_), b.ln2_mean, b.ln2_rstd, (int)BT, C);
    /* attention branch: dresid is now d(resid2) */
    k->zero(d, a->datty, BT * C_ * sizeof(float));
    k->matmul_bwd(d, a->datty, P(m, g, P_ATTPROJW, l, C_ * C_), P(m, g, P_ATTPROJB, l, C_),
                  a->dresid, b.atty, P(m, p, P_ATTPROJW, l, C_ * C_), (int)BT, C, C);
    k->zero(d, a->dqkv, BT * 3 * C_ * sizeof(float));
    k->attention_bwd(d, a->dqkv, a->att_scratch, a->datty, b.qkv, b.lse, b.atty, B, T, C, NH);
    k->zero(d, a->dln, BT * C_ * sizeof(float));
    k->matmul_bwd(d, a->dln, P(m, g, P_QKVW, l, 3 * C_ * C_), P(m, g, P_QKVB, l, 3 * C_),
                  a->dqkv, b.ln1, P(m, p, P_QKVW, l, 3 * C_ * C_), (int)BT, C, 3 * C);
    k->layernorm_bwd(d, a->dresid, P(m, g, P_LN1W, l, C_), P(m, g, P_LN1B, l, C_), a->dln,
                     resid_in, P(m, p, P_LN1W, l, C_), b.ln1_mean, b.ln1_rstd, (int)BT, C);
}

static void gpt2_backward(model *m, int nseq, void (*done)(void *ctx, int layer), void *ctx)
{
    kern_device *d = m->dev;
    const kern_ops *k = d->ops;
    gpt2_acts *a = &G(m)->a;
    int B = nseq, T = m->T, C = m->cfg.channels, L = m->cfg.n_layer;
    int Vp = m->cfg.padded_vocab_size;
    size_t BT = (size_t)B * T, C_ = (size_t)C;
    float *p = m->params, *g = m->grads;

    k->zero(d, a->dresid, BT * C_ * sizeof(float));
    k->zero(d, a->dln, BT * C_ * sizeof(float));
    /* logits hold dloss/dlogits (model_forward, want_grad) */
    k->matmul_bwd(d, a->dln, P(m, g, P_WTE, 0, 0), NULL, a->logits, a->lnf,
                  P(m, p, P_WTE, 0, 0), (int)BT, C, Vp);
    k->layernorm_bwd(d, a->dresid, P(m, g, P_LNFW, 0, 0), P(m, g, P_LNFB, 0, 0), a->dln,
                     block_input(m, L), P(m, p, P_LNFW, 0, 0), a->lnf_mean, a->lnf_rstd,
                     (int)BT, C);
    for (int l = L - 1; l >= 0; l--) {
        /* recompute mode: rebuild this block's inner activations from its
         * stored input (same kernels, same bits as the first forward) */
        if (m->recompute)
            block_forward(m, l, B);
        block_backward(m, l, B);
        if (done != NULL)
            done(ctx, l);
    }
    k->encoder_bwd(d, P(m, g, P_WTE, 0, 0), P(m, g, P_WPE, 0, 0), a->dresid, a->tokens, B, T, C);
    if (done != NULL)
        done(ctx, -1);
}

static const float *gpt2_logits(const model *m)
{
    return G(m)->a.logits;
}

static const float *gpt2_token_losses(const model *m)
{
    return G(m)->a.losses;
}

static const model_hf_name gpt2_hf[] = {{"GPT2LMHeadModel", "gpt2", 0}, {0}};

const model_family model_family_gpt2 = {
    .name = "gpt2",
    .hf_names = gpt2_hf,
    .config_from_spec = gpt2_config_from_spec,
    .config_check = gpt2_check,
    .layout = gpt2_layout,
    .act_bytes = gpt2_act_bytes,
    .gemm_extent = gpt2_gemm_extent,
    .acts_alloc = gpt2_acts_alloc,
    .acts_free = gpt2_acts_free,
    .forward = gpt2_forward,
    .backward = gpt2_backward,
    .init_host = gpt2_init_host,
    .create = gpt2_create,
    .destroy = gpt2_destroy,
    .config_from_hf = gpt2_config_from_hf,
    .config_to_hf = gpt2_config_to_hf,
    .config_from_fd = gpt2_config_from_fd,
    .load_fd_host = gpt2_load_fd_host,
    .logits = gpt2_logits,
    .token_losses = gpt2_token_losses,
};
