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

#include "fsutil.h"
#include "rng.h"

enum {
    P_WTE, P_WPE, P_LN1W, P_LN1B, P_QKVW, P_QKVB, P_ATTPROJW, P_ATTPROJB,
    P_LN2W, P_LN2B, P_FCW, P_FCB, P_FCPROJW, P_FCPROJB, P_LNFW, P_LNFB,
};

#define HEADER_INTS 256

int model_tensor_decays(int i)
{
    return i == P_WTE || i == P_WPE || i == P_QKVW || i == P_ATTPROJW || i == P_FCW ||
           i == P_FCPROJW;
}

static void tensor_sizes(const model_config *c, size_t *sz)
{
    size_t C = (size_t)c->channels, L = (size_t)c->n_layer;
    sz[P_WTE] = (size_t)c->padded_vocab_size * C;
    sz[P_WPE] = (size_t)c->max_seq_len * C;
    sz[P_LN1W] = L * C;
    sz[P_LN1B] = L * C;
    sz[P_QKVW] = L * 3 * C * C;
    sz[P_QKVB] = L * 3 * C;
    sz[P_ATTPROJW] = L * C * C;
    sz[P_ATTPROJB] = L * C;
    sz[P_LN2W] = L * C;
    sz[P_LN2B] = L * C;
    sz[P_FCW] = L * 4 * C * C;
    sz[P_FCB] = L * 4 * C;
    sz[P_FCPROJW] = L * C * 4 * C;
    sz[P_FCPROJB] = L * C;
    sz[P_LNFW] = C;
    sz[P_LNFB] = C;
}

size_t model_num_params(const model_config *cfg)
{
    size_t sz[MODEL_NTENSORS], n = 0;
    tensor_sizes(cfg, sz);
    for (int i = 0; i < MODEL_NTENSORS; i++)
        n += sz[i];
    return n;
}

static int check_shape(const model_config *c, acc_err *err)
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
    return 0;
}

int model_config_from_spec(const spec_model *sm, model_config *cfg, acc_err *err)
{
    if (sm->arch[0] != '\0' && strcmp(sm->arch, "gpt2") != 0)
        return acc_err_set(err, ACC_EINVAL, "model.arch", "unknown arch \"%s\" (gpt2)", sm->arch);
    cfg->max_seq_len = sm->seq_len;
    cfg->vocab_size = sm->vocab_size;
    cfg->padded_vocab_size = sm->padded_vocab_size > 0 ? sm->padded_vocab_size : sm->vocab_size;
    cfg->n_layer = sm->n_layer;
    cfg->n_head = sm->n_head;
    cfg->channels = sm->n_embd;
    return check_shape(cfg, err);
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

/* An unchecked open by name (tools, tests): still a regular file only. */
static int open_regular(const char *path, int *fd, acc_err *err)
{
    struct stat st;
    *fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (*fd < 0)
        return acc_err_set(err, ACC_EINVAL, "model.init_from", "cannot open %s: %s", path, strerror(errno));
    if (fstat(*fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(*fd);
        *fd = -1;
        return acc_err_set(err, ACC_EINVAL, "model.init_from", "%s is not a regular file", path);
    }
    return 0;
}

int model_config_from_file(const char *path, const spec_model *sm, model_config *cfg,
                           acc_err *err)
{
    int fd;
    int rc = open_regular(path, &fd, err);
    if (rc != 0)
        return rc;
    rc = model_config_from_fd(fd, path, sm, cfg, err);
    close(fd);
    return rc;
}

int model_config_from_fd(int fd, const char *path, const spec_model *sm, model_config *cfg,
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
    if ((rc = check_shape(cfg, err)) != 0) {
        if (err != NULL)
            snprintf(err->field, sizeof err->field, "model.init_from");
        return rc;
    }
    uint64_t want = (uint64_t)HEADER_INTS * 4 + (uint64_t)model_num_params(cfg) * 4;
    if ((uint64_t)size < want)
        return acc_err_set(err, ACC_EINVAL, "model.init_from",
                           "%s: %ld bytes, its header needs %llu", path, size,
                           (unsigned long long)want);
    return config_matches(cfg, sm, path, err);
}

/* ---- activation layout
 *
 * Stored mode keeps every layer's activations for the backward. Recompute
 * mode keeps only each layer's output on the residual stream (resid3, L
 * copies) plus ONE layer's worth of the rest (slot 0), and model_backward
 * re-runs a block's forward from its stored input before its backward. The
 * kernels are deterministic, so both modes give the same bits. */

typedef struct act_slot {
    size_t off, count;
    int is_int;
} act_slot;

enum {
    A_ENCODED, A_LN1, A_LN1_MEAN, A_LN1_RSTD, A_QKV, A_ATTY, A_LSE, A_ATTPROJ, A_RESID2,
    A_LN2, A_LN2_MEAN, A_LN2_RSTD, A_FCH, A_FCH_GELU, A_FCPROJ, A_RESID3, A_LNF,
    A_LNF_MEAN, A_LNF_RSTD, A_LOGITS, A_LOSSES, A_DRESID, A_DLN, A_DATTY, A_DQKV,
    A_DBIG1, A_DBIG2, A_ATT_SCRATCH, A_TOKENS, A_TARGETS, A_WEIGHTS, A_COUNT
};

static size_t act_counts(const model_config *c, int B, int T, int recompute, size_t *cnt)
{
    size_t BT = (size_t)B * T, C = (size_t)c->channels, L = (size_t)c->n_layer;
    size_t Ls = recompute ? 1 : L; /* layers whose inner activations are kept */
    size_t lse = (size_t)B * c->n_head * T;
    size_t per[A_COUNT] = {
        [A_ENCODED] = BT * C, [A_LN1] = Ls * BT * C, [A_LN1_MEAN] = Ls * BT,
        [A_LN1_RSTD] = Ls * BT, [A_QKV] = Ls * BT * 3 * C, [A_ATTY] = Ls * BT * C,
        [A_LSE] = Ls * lse, [A_ATTPROJ] = Ls * BT * C, [A_RESID2] = Ls * BT * C,
        [A_LN2] = Ls * BT * C, [A_LN2_MEAN] = Ls * BT, [A_LN2_RSTD] = Ls * BT,
        [A_FCH] = Ls * BT * 4 * C, [A_FCH_GELU] = Ls * BT * 4 * C, [A_FCPROJ] = Ls * BT * C,
        [A_RESID3] = L * BT * C, [A_LNF] = BT * C, [A_LNF_MEAN] = BT, [A_LNF_RSTD] = BT,
        [A_LOGITS] = BT * (size_t)c->padded_vocab_size, [A_LOSSES] = BT,
        [A_DRESID] = BT * C, [A_DLN] = BT * C, [A_DATTY] = BT * C, [A_DQKV] = BT * 3 * C,
        [A_DBIG1] = BT * 4 * C, [A_DBIG2] = BT * 4 * C,
        [A_ATT_SCRATCH] = KERN_ATT_SCRATCH(T, c->n_head),
        [A_TOKENS] = BT, [A_TARGETS] = BT, [A_WEIGHTS] = BT,
    };
    size_t total = 0;
    for (int i = 0; i < A_COUNT; i++) {
        cnt[i] = per[i];
        total += (per[i] + 15) / 16 * 16; /* keep every array 64-byte aligned */
    }
    return total * sizeof(float);
}

uint64_t model_state_bytes(const model_config *cfg)
{
    uint64_t params = model_num_params(cfg) * sizeof(float);
    return 3 * params + (params + MODEL_GRAD_EXTRA * sizeof(float));
}

uint64_t model_act_bytes(const model_config *cfg, int B, int T, int recompute)
{
    size_t cnt[A_COUNT];
    return B > 0 ? act_counts(cfg, B, T, recompute, cnt) : 0;
}

uint64_t model_device_bytes(const model_config *cfg, int B, int T, int recompute)
{
    return model_state_bytes(cfg) + model_act_bytes(cfg, B, T, recompute);
}

static void carve_acts(model_gpt2 *m)
{
    size_t cnt[A_COUNT];
    act_counts(&m->cfg, m->B, m->T, m->recompute, cnt);
    void *ptr[A_COUNT];
    char *p = m->act_mem;
    for (int i = 0; i < A_COUNT; i++) {
        ptr[i] = p;
        p += (cnt[i] + 15) / 16 * 16 * sizeof(float);
    }
    model_acts *a = &m->a;
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

void model_acts_free(model_gpt2 *m)
{
    if (m->act_mem != NULL)
        m->dev->ops->free(m->dev, m->act_mem);
    m->act_mem = NULL;
    m->act_bytes = 0;
    m->B = 0;
    memset(&m->a, 0, sizeof m->a);
}

int model_acts_alloc(model_gpt2 *m, int B, int recompute, acc_err *err)
{
    model_acts_free(m);
    if (B < 1)
        return acc_err_set(err, ACC_EINVAL, "train_micro_batch_size_per_gpu",
                           "micro batch %d must be >= 1", B);
    size_t cnt[A_COUNT];
    size_t bytes = act_counts(&m->cfg, B, m->T, recompute, cnt);
    int rc = m->dev->ops->alloc(m->dev, bytes, &m->act_mem, err);
    if (rc != 0) {
        m->act_mem = NULL;
        return rc;
    }
    m->dev->ops->zero(m->dev, m->act_mem, bytes);
    m->act_bytes = bytes;
    m->B = B;
    m->recompute = recompute;
    carve_acts(m);
    return 0;
}

static int alloc_state(model_gpt2 *m, acc_err *err)
{
    size_t pb = m->nparams * sizeof(float), gb = pb + MODEL_GRAD_EXTRA * sizeof(float);
    kern_device *dev = m->dev;
    const kern_ops *k = dev->ops;
    int rc = k->alloc(dev, pb, (void **)&m->params, err);
    if (rc == 0)
        rc = k->alloc(dev, gb, (void **)&m->grads, err);
    if (rc == 0)
        rc = k->alloc(dev, pb, (void **)&m->adam_m, err);
    if (rc == 0)
        rc = k->alloc(dev, pb, (void **)&m->adam_v, err);
    if (rc != 0)
        return rc;
    k->zero(dev, m->params, pb);
    k->zero(dev, m->grads, gb);
    k->zero(dev, m->adam_m, pb);
    k->zero(dev, m->adam_v, pb);
    return 0;
}

int model_create(kern_device *dev, const model_config *cfg, int B, int T, model_gpt2 **out,
                 acc_err *err)
{
    *out = NULL;
    if (T > cfg->max_seq_len || B < 0 || T < 1)
        return acc_err_set(err, ACC_EINVAL, "model.seq_len", "seq_len %d with max_seq_len %d",
                           T, cfg->max_seq_len);
    model_gpt2 *m = calloc(1, sizeof *m);
    if (m == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory");
    m->cfg = *cfg;
    m->dev = dev;
    m->T = T;
    tensor_sizes(cfg, m->tensor_size);
    for (int i = 0; i < MODEL_NTENSORS; i++) {
        m->tensor_off[i] = m->nparams;
        m->nparams += m->tensor_size[i];
    }
    int rc = alloc_state(m, err);
    if (rc == 0 && B > 0)
        rc = model_acts_alloc(m, B, 0, err);
    if (rc != 0) {
        model_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

void model_free(model_gpt2 *m)
{
    if (m == NULL)
        return;
    const kern_ops *k = m->dev->ops;
    model_acts_free(m);
    k->free(m->dev, m->adam_v);
    k->free(m->dev, m->adam_m);
    k->free(m->dev, m->grads);
    k->free(m->dev, m->params);
    free(m);
}

/* ---- parameters in and out */

int model_init_seed(model_gpt2 *m, uint64_t seed, acc_err *err)
{
    float *host = malloc(m->nparams * sizeof *host);
    if (host == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory for init");
    rng r;
    rng_seed(&r, seed, 0x1417ULL);
    double resid_std = 0.02 / sqrt(2.0 * m->cfg.n_layer);
    for (int i = 0; i < MODEL_NTENSORS; i++) {
        float *t = host + m->tensor_off[i];
        size_t n = m->tensor_size[i];
        int is_ln_w = i == P_LN1W || i == P_LN2W || i == P_LNFW;
        int is_matrix = model_tensor_decays(i);
        double std = (i == P_ATTPROJW || i == P_FCPROJW) ? resid_std : 0.02;
        for (size_t j = 0; j < n; j++)
            t[j] = is_ln_w ? 1.0f : is_matrix ? (float)(std * rng_normal(&r)) : 0.0f;
    }
    /* padded vocabulary rows stay zero: they are never a target */
    size_t C = (size_t)m->cfg.channels;
    memset(host + (size_t)m->cfg.vocab_size * C, 0,
           (size_t)(m->cfg.padded_vocab_size - m->cfg.vocab_size) * C * sizeof *host);
    m->dev->ops->upload(m->dev, m->params, host, m->nparams * sizeof *host);
    free(host);
    return 0;
}

int model_load_llmc(model_gpt2 *m, const char *path, acc_err *err)
{
    int fd;
    int rc = open_regular(path, &fd, err);
    if (rc != 0)
        return rc;
    rc = model_load_llmc_fd(m, fd, path, err);
    close(fd);
    return rc;
}

int model_load_llmc_fd(model_gpt2 *m, int fd, const char *path, acc_err *err)
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
    float *host = NULL;
    if (rc == 0 && (host = malloc(m->nparams * sizeof *host)) == NULL)
        rc = acc_err_set(err, ACC_ENOMEM, field, "out of host memory loading %s", path);
    if (rc == 0 && fread(host, sizeof *host, m->nparams, f) != m->nparams)
        rc = acc_err_set(err, ACC_EINVAL, field, "%s: truncated parameters", path);
    fclose(f);
    if (rc == 0)
        m->dev->ops->upload(m->dev, m->params, host, m->nparams * sizeof *host);
    free(host);
    return rc;
}

int model_save_llmc(const model_gpt2 *m, const char *path, acc_err *err)
{
    float *host = malloc(m->nparams * sizeof *host);
    if (host == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory saving %s", path);
    m->dev->ops->download(m->dev, host, m->params, m->nparams * sizeof *host);
    int32_t h[HEADER_INTS] = {MODEL_LLMC_MAGIC, MODEL_LLMC_VERSION, m->cfg.max_seq_len,
                              m->cfg.vocab_size, m->cfg.n_layer, m->cfg.n_head,
                              m->cfg.channels, m->cfg.padded_vocab_size};
    fsu_chunk c[2] = {{h, sizeof h}, {host, m->nparams * sizeof *host}};
    int rc = fsu_write_atomic_chunks(path, c, 2, err);
    free(host);
    return rc;
}

/* ---- forward / backward */

static float *P(const model_gpt2 *m, float *base, int tensor, int layer, size_t per_layer)
{
    return base + m->tensor_off[tensor] + (size_t)layer * per_layer;
}

/* One block's activations: layer l's slot (slot 0 in recompute mode) and
 * its output on the residual stream (always layer l's own). */
typedef struct block_acts {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *lse, *attproj, *resid2;
    float *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu, *fcproj, *resid3;
} block_acts;

static block_acts block_at(const model_gpt2 *m, int l)
{
    const model_acts *a = &m->a;
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
static float *block_input(const model_gpt2 *m, int l)
{
    size_t bt = (size_t)m->B * m->T;
    return l == 0 ? m->a.encoded : m->a.resid3 + (size_t)(l - 1) * bt * m->cfg.channels;
}

static void block_forward(model_gpt2 *m, int l, int B)
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
    k->attention_fwd(d, b.atty, b.lse, m->a.att_scratch, b.qkv, B, T, C, NH);
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

void model_forward(model_gpt2 *m, const int *tokens, const int *targets, const float *weights,
                   int nseq, int want_grad, double *loss_sum)
{
    kern_device *d = m->dev;
    const kern_ops *k = d->ops;
    model_acts *a = &m->a;
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
static void block_backward(model_gpt2 *m, int l, int B)
{
    kern_device *d = m->dev;
    const kern_ops *k = d->ops;
    model_acts *a = &m->a;
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

void model_backward(model_gpt2 *m, int nseq)
{
    model_backward_notify(m, nseq, NULL, NULL);
}

void model_backward_notify(model_gpt2 *m, int nseq, model_grads_done_fn done, void *ctx)
{
    kern_device *d = m->dev;
    const kern_ops *k = d->ops;
    model_acts *a = &m->a;
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

size_t model_block_params(const model_config *cfg)
{
    size_t sz[MODEL_NTENSORS], n = 0;
    tensor_sizes(cfg, sz);
    for (int i = P_LN1W; i <= P_FCPROJB; i++)
        n += sz[i] / (size_t)cfg->n_layer;
    return n;
}

int model_grad_spans(const model_gpt2 *m, int lo, int hi, int ends, kern_span *out)
{
    int n = 0;
    size_t L = (size_t)m->cfg.n_layer;
    if (ends) /* wte, wpe: the buffer's start */
        out[n++] = (kern_span){0, m->tensor_off[P_LN1W]};
    for (int i = P_LN1W; hi > lo && i <= P_FCPROJB; i++) {
        size_t per = m->tensor_size[i] / L;
        out[n++] = (kern_span){m->tensor_off[i] + (size_t)lo * per, (size_t)(hi - lo) * per};
    }
    if (ends) /* lnfw, lnfb and the spare slots: the buffer's end */
        out[n++] = (kern_span){m->tensor_off[P_LNFW],
                               m->nparams + MODEL_GRAD_EXTRA - m->tensor_off[P_LNFW]};
    return n;
}

void model_zero_grad(model_gpt2 *m)
{
    m->dev->ops->zero(m->dev, m->grads, (m->nparams + MODEL_GRAD_EXTRA) * sizeof(float));
}

double model_grad_sumsq(model_gpt2 *m)
{
    return m->dev->ops->sumsq(m->dev, m->grads, m->nparams);
}

void model_adamw(model_gpt2 *m, float lr, const spec_optim *o, float grad_scale)
{
    m->adam_t++;
    for (int i = 0; i < MODEL_NTENSORS; i++) {
        size_t off = m->tensor_off[i];
        float wd = model_tensor_decays(i) ? (float)o->weight_decay : 0.0f;
        m->dev->ops->adamw(m->dev, m->params + off, m->grads + off, m->adam_m + off,
                           m->adam_v + off, m->tensor_size[i], lr, (float)o->beta1,
                           (float)o->beta2, (float)o->eps, wd, grad_scale, m->adam_t);
    }
}
