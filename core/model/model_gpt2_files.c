/* model_gpt2_files: GPT-2's native checkpoint files for init_from (llm.c
 * .bin, safetensors) and llm.c output; see model_gpt2.h. */
#include "model_gpt2.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checked.h"
#include "fsutil.h"
#include "safepath.h"

#define HEADER_INTS 256

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
    cfg->tie_word_embeddings = cfg->attention_bias = cfg->attention_out_bias = cfg->mlp_bias = true;
    if ((rc = model_family_gpt2.config_check(cfg, err)) != 0) {
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
    int rc = model_family_gpt2.config_from_spec(sm, cfg, err);
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

int model_gpt2_config_from_fd(int fd, const char *path, const spec_model *sm,
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
    size_t base = m->cfg.lora.r > 0 ? m->layout.ntrain : 0; /* LoRA: the base after the adapters */
    if (rc == 0 && fread(host + base, sizeof *host, m->nparams - base, f) != m->nparams - base)
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

int model_gpt2_load_fd_host(const model *m, int fd, const char *path, float *host,
                             acc_err *err)
{
    return ends_with(path, ".safetensors") ? load_safetensors_host(m, fd, path, host, err)
                                           : load_llmc_host(m, fd, path, host, err);
}

int model_load_llmc_fd(model *m, int fd, const char *path, acc_err *err)
{
    float *host = calloc(m->nparams, sizeof *host);
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
    size_t base = m->cfg.lora.r > 0 ? m->layout.ntrain : 0; /* the base model only */
    fsu_chunk c[2] = {{h, sizeof h}, {host + base, (m->nparams - base) * sizeof *host}};
    int rc = fsu_write_atomic_chunks(path, c, 2, err);
    free(host);
    return rc;
}

