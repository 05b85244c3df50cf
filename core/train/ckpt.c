/* ckpt: see ckpt.h. */
#include "ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fsutil.h"
#include "hf_dir.h"
#include "model_hf.h"
#include "safetensors.h"

#define STATE_FORMAT "accumd-state-1"

/* The weights go to model.safetensors under the family's layout (names,
 * file shapes and orientation: model.h), so this file knows no family. */

static int download_all(const model *m, const adamw *opt, float **params, float **mom1,
                        float **mom2, acc_err *err)
{
    size_t bytes = m->nparams * sizeof(float), mbytes = (opt->hi - opt->lo) * sizeof(float);
    *params = malloc(bytes);
    *mom1 = malloc(mbytes);
    *mom2 = malloc(mbytes);
    if (*params == NULL || *mom1 == NULL || *mom2 == NULL) {
        free(*params);
        free(*mom1);
        free(*mom2);
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory for a checkpoint");
    }
    kern_device *d = m->dev;
    model_params_download(m, *params);
    d->ops->download(d, *mom1, opt->m, mbytes);
    d->ops->download(d, *mom2, opt->v, mbytes);
    return 0;
}

static int write_model_file(const char *path, const model *m, const float *params, int step,
                            acc_err *err)
{
    char step_s[24];
    snprintf(step_s, sizeof step_s, "%d", step);
    st_meta md[] = {{"format", "pt"}, {"step", step_s}, {"producer", "accumd"}};
    return model_safetensors_write(&m->layout, params, path, md, 3, err);
}

/* master: the fp32 weights in the model's flat layout, or NULL when
 * model.safetensors holds them exactly (F32). */
static int write_state_file(const char *path, const model *m, const adamw *opt,
                            const float *mom1, const float *mom2, const float *master,
                            const ckpt_state *st, const char *spec_json, acc_err *err)
{
    size_t nmom = opt->hi - opt->lo;
    const model_config *c = &m->cfg;
    char v[12][32];
    snprintf(v[0], 32, "%d", st->step);
    snprintf(v[1], 32, "%d", st->adam_t);
    snprintf(v[2], 32, "%d", st->micro_batch);
    snprintf(v[3], 32, "%d", st->accum_steps);
    snprintf(v[4], 32, "%" PRIu64, st->seed);
    snprintf(v[5], 32, "%d", st->recompute ? 1 : 0);
    snprintf(v[6], 32, "%d", c->n_layer);
    snprintf(v[7], 32, "%d", c->n_head);
    snprintf(v[8], 32, "%d", c->channels);
    snprintf(v[9], 32, "%d", c->vocab_size);
    snprintf(v[10], 32, "%d", c->padded_vocab_size);
    snprintf(v[11], 32, "%d", c->max_seq_len);
    st_meta md[] = {
        {"format", STATE_FORMAT}, {"step", v[0]},        {"adam_t", v[1]},
        {"micro_batch", v[2]},    {"accum_steps", v[3]}, {"seed", v[4]},
        {"recompute", v[5]},      {"n_layer", v[6]},     {"n_head", v[7]},
        {"channels", v[8]},       {"vocab_size", v[9]},  {"padded_vocab_size", v[10]},
        {"max_seq_len", v[11]},   {"spec", spec_json ? spec_json : "{}"},
    };
    st_tensor t[3] = {
        {.name = "adam.m", .dtype = ST_F32, .ndim = 1, .shape = {(int64_t)nmom},
         .data = mom1, .nbytes = nmom * sizeof(float)},
        {.name = "adam.v", .dtype = ST_F32, .ndim = 1, .shape = {(int64_t)nmom},
         .data = mom2, .nbytes = nmom * sizeof(float)},
        {.name = "params", .dtype = ST_F32, .ndim = 1, .shape = {(int64_t)m->nparams},
         .data = master, .nbytes = m->nparams * sizeof(float)},
    };
    return st_write(path, t, master ? 3 : 2, md, (int)(sizeof md / sizeof md[0]), err);
}

/* ---- listing checkpoints */

static int parse_ckpt_name(const char *name, int *step)
{
    char *end;
    if (strncmp(name, "ckpt-", 5) != 0)
        return -1;
    long s = strtol(name + 5, &end, 10);
    if (end == name + 5 || *end != '\0' || s < 0 || s > 1000000000)
        return -1;
    *step = (int)s;
    return 0;
}

static int cmp_desc(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x < y) - (x > y);
}

/* Steps of the complete checkpoints under dir, newest first; removes partial ones. */
static int list_ckpts(const char *dir, int **steps, int *n, acc_err *err)
{
    *steps = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (d == NULL)
        return errno == ENOENT ? 0 : acc_err_set(err, ACC_EIO, "", "opendir %s: %s", dir, strerror(errno));
    int cap = 0, rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (!strncmp(e->d_name, "ckpt-", 5) && len > 8 && !strcmp(e->d_name + len - 8, ".partial")) {
            char p[PATH_MAX];
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            fsu_rm_rf(p, NULL); /* an interrupted write: never trusted */
            continue;
        }
        int step;
        if (parse_ckpt_name(e->d_name, &step) != 0)
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 8;
            int *ns = realloc(*steps, (size_t)cap * sizeof *ns);
            if (ns == NULL) {
                rc = acc_err_set(err, ACC_ENOMEM, "", "out of memory");
                break;
            }
            *steps = ns;
        }
        (*steps)[(*n)++] = step;
    }
    closedir(d);
    if (rc == 0 && *n > 1)
        qsort(*steps, (size_t)*n, sizeof **steps, cmp_desc);
    return rc;
}

static void prune(const char *dir, int keep)
{
    int *steps, n;
    if (list_ckpts(dir, &steps, &n, NULL) != 0)
        return;
    for (int i = keep; i < n; i++) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/ckpt-%08d", dir, steps[i]);
        fsu_rm_rf(p, NULL);
    }
    free(steps);
}

/* The weights as a Hugging Face directory's: one model.safetensors (the
 * bytes ckpt_save always wrote) or, over 5 GB, shards with an index; then
 * config.json and the source's tokenizer files. */
static int write_weights(const char *dir, const model *m, const float *params, int step,
                         const char *hf_src, st_dtype dtype, acc_err *err)
{
    char file[PATH_MAX + 64];
    model_hf_save_opts o = {.dtype = dtype, .src_dir = hf_src};
    const model_family *f = model_family_of(&m->cfg);
    if (dtype != ST_F32 || model_hf_bytes(m, dtype) > HF_SHARD_DEFAULT)
        return model_hf_save(m, dir, &o, err);
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    int rc = write_model_file(file, m, params, step, err);
    if (rc == 0 && f->config_to_hf != NULL)
        rc = model_hf_save_config(m, dir, &o, err);
    return rc;
}

int ckpt_save(const char *output_dir, const model *m, const adamw *opt, const ckpt_state *st,
              const char *spec_json, int keep, char *path_out, size_t path_n, acc_err *err)
{
    return ckpt_save_hf(output_dir, m, opt, st, spec_json, keep, NULL, path_out, path_n, err);
}

int ckpt_save_hf(const char *output_dir, const model *m, const adamw *opt, const ckpt_state *st,
                 const char *spec_json, int keep, const char *hf_src, char *path_out,
                 size_t path_n, acc_err *err)
{
    return ckpt_save_as(output_dir, m, opt, st, spec_json, keep, hf_src, ST_F32, path_out, path_n,
                        err);
}

int ckpt_save_as(const char *output_dir, const model *m, const adamw *opt, const ckpt_state *st,
                 const char *spec_json, int keep, const char *hf_src, st_dtype dtype,
                 char *path_out, size_t path_n, acc_err *err)
{
    char final[PATH_MAX], partial[PATH_MAX + 16], file[PATH_MAX + 64];
    if (snprintf(final, sizeof final, "%s/ckpt-%08d", output_dir, st->step) >= (int)sizeof final)
        return acc_err_set(err, ACC_EINVAL, "", "output path too long");
    snprintf(partial, sizeof partial, "%s.partial", final);
    int rc = fsu_mkdir_p(output_dir, 0750, err);
    if (rc != 0)
        return rc;
    fsu_rm_rf(partial, NULL);
    if (mkdir(partial, 0750) != 0)
        return acc_err_set(err, ACC_EIO, "", "checkpoint at step %d: mkdir %s: %s", st->step,
                           partial, strerror(errno));
    float *params, *mom1, *mom2;
    rc = download_all(m, opt, &params, &mom1, &mom2, err);
    if (rc == 0)
        rc = write_weights(partial, m, params, st->step, hf_src, dtype, err);
    if (rc == 0) { /* narrower weights on disk: the exact ones for resuming here */
        snprintf(file, sizeof file, "%s/state.safetensors", partial);
        rc = write_state_file(file, m, opt, mom1, mom2, dtype == ST_F32 ? NULL : params, st,
                              spec_json, err);
    }
    if (rc == 0) {
        free(params);
        free(mom1);
        free(mom2);
        params = mom1 = mom2 = NULL;
        fsu_rm_rf(final, NULL); /* a same-step checkpoint from an earlier life */
        if (rename(partial, final) != 0)
            rc = acc_err_set(err, ACC_EIO, "", "rename %s: %s", partial, strerror(errno));
        else
            rc = fsu_fsync_dir(output_dir, err);
    }
    free(params);
    free(mom1);
    free(mom2);
    if (rc != 0) {
        fsu_rm_rf(partial, NULL);
        acc_err_prefix(err, "checkpoint at step %d", st->step);
        return rc;
    }
    if (path_out != NULL)
        snprintf(path_out, path_n, "%s", final);
    if (keep > 0)
        prune(output_dir, keep);
    return 0;
}

/* ---- loading */

static int meta_int(const st_file *f, const char *key, long long *out, acc_err *err)
{
    const char *v = st_get_meta(f, key);
    char *end;
    if (v == NULL)
        return acc_err_set(err, ACC_EINVAL, "resume_from", "checkpoint state has no %s", key);
    errno = 0;
    *out = strtoll(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0')
        return acc_err_set(err, ACC_EINVAL, "resume_from", "checkpoint state: bad %s '%s'", key, v);
    return 0;
}

static int check_shape_meta(const st_file *f, const model_config *c, acc_err *err)
{
    const struct { const char *key; int want; } k[] = {
        {"n_layer", c->n_layer},       {"n_head", c->n_head},
        {"channels", c->channels},     {"vocab_size", c->vocab_size},
        {"padded_vocab_size", c->padded_vocab_size}, {"max_seq_len", c->max_seq_len},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        long long v;
        int rc = meta_int(f, k[i].key, &v, err);
        if (rc != 0)
            return rc;
        if (v != k[i].want)
            return acc_err_set(err, ACC_EINVAL, "resume_from",
                               "checkpoint has %s %lld, the job's model has %d", k[i].key, v, k[i].want);
    }
    return 0;
}

int ckpt_load_weights(const char *path, model *m, acc_err *err)
{
    st_file *f;
    int rc = st_open(path, &f, err);
    if (rc != 0)
        return acc_err_set(err, ACC_EINVAL, "model.init_from", "%s", err ? err->msg : "unreadable");
    float *params = malloc(m->nparams * sizeof *params);
    if (params == NULL)
        rc = acc_err_set(err, ACC_ENOMEM, "", "out of host memory");
    if (rc == 0)
        rc = model_safetensors_read(&m->layout, f, path, "model.init_from", params, err);
    if (rc == 0)
        model_params_upload(m, params);
    free(params);
    st_close(f);
    return rc;
}

/* Weights over 5 GB were written as shards (write_weights). */
static int sharded(const char *dir)
{
    char path[PATH_MAX + 64];
    struct stat sb;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    return stat(path, &sb) == 0;
}

static int load_sharded(const char *dir, model *m, acc_err *err)
{
    hf_dir *h = NULL;
    int rc = hf_open(dir, 0, &h, err);
    if (rc == 0)
        rc = model_hf_check(h, &m->cfg, err);
    if (rc == 0)
        rc = model_hf_load(m, h, err);
    hf_close(h);
    return rc;
}

int ckpt_load(const char *dir, model *m, adamw *opt, ckpt_state *st, acc_err *err)
{
    char path[PATH_MAX + 32];
    st_file *mf = NULL, *sf = NULL;
    float *params = NULL, *mom = NULL;
    snprintf(path, sizeof path, "%s/state.safetensors", dir);
    int rc = st_open(path, &sf, err);
    if (rc == 0) {
        const char *fmt = st_get_meta(sf, "format");
        if (fmt == NULL || strcmp(fmt, STATE_FORMAT) != 0)
            rc = acc_err_set(err, ACC_EINVAL, "resume_from", "%s: not an accumd training state", path);
    }
    if (rc == 0)
        rc = check_shape_meta(sf, &m->cfg, err);
    long long v[6] = {0};
    const char *keys[6] = {"step", "adam_t", "micro_batch", "accum_steps", "seed", "recompute"};
    for (int i = 0; rc == 0 && i < 6; i++)
        rc = meta_int(sf, keys[i], &v[i], err);
    st_tensor tm, tv;
    if (rc == 0 && (st_get(sf, "adam.m", &tm, err) != 0 || st_get(sf, "adam.v", &tv, err) != 0 ||
                    tm.nbytes != (opt->hi - opt->lo) * sizeof(float) || tv.nbytes != tm.nbytes))
        rc = acc_err_set(err, ACC_EINVAL, "resume_from", "%s: optimizer state does not match the model", path);
    st_tensor tp;
    int master = rc == 0 && st_get(sf, "params", &tp, NULL) == 0;
    if (master && (tp.dtype != ST_F32 || tp.nbytes != m->nparams * sizeof(float)))
        rc = acc_err_set(err, ACC_EINVAL, "resume_from", "%s: master weights do not match the model", path);
    if (rc == 0 && master) /* the fp32 weights beside a narrower model.safetensors */
        model_params_upload(m, tp.data);
    else if (rc == 0 && sharded(dir))
        rc = load_sharded(dir, m, err);
    else if (rc == 0) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        rc = st_open(path, &mf, err);
        if (rc == 0 && ((params = malloc(m->nparams * sizeof *params)) == NULL))
            rc = acc_err_set(err, ACC_ENOMEM, "", "out of host memory");
        if (rc == 0)
            rc = model_safetensors_read(&m->layout, mf, path, "model.init_from", params, err);
        if (rc == 0)
            model_params_upload(m, params);
    }
    if (rc == 0) {
        kern_device *d = m->dev;
        d->ops->upload(d, opt->m, tm.data, tm.nbytes);
        d->ops->upload(d, opt->v, tv.data, tv.nbytes);
        opt->t = (int)v[1];
        *st = (ckpt_state){.step = (int)v[0], .adam_t = (int)v[1], .micro_batch = (int)v[2],
                           .accum_steps = (int)v[3], .seed = (uint64_t)v[4], .recompute = v[5] != 0};
    }
    free(params);
    free(mom);
    st_close(mf);
    st_close(sf);
    if (rc != 0 && err != NULL && strstr(err->msg, dir) == NULL)
        acc_err_prefix(err, "checkpoint %s", dir);
    return rc;
}

static int verify_dir(const char *dir, acc_err *err)
{
    char path[PATH_MAX + 32];
    const char *files[] = {"state.safetensors", "model.safetensors"};
    if (sharded(dir)) { /* every shard opens and its checksum verifies */
        hf_dir *h = NULL;
        int rc = hf_open(dir, 0, &h, err);
        hf_close(h);
        if (rc != 0)
            return rc;
    }
    for (int i = 0; i < (sharded(dir) ? 1 : 2); i++) {
        st_file *f;
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        int rc = st_open(path, &f, err);
        if (rc != 0)
            return rc;
        st_close(f);
    }
    return 0;
}

int ckpt_find_latest(const char *output_dir, char *path_out, size_t path_n, acc_err *err)
{
    int *steps, n;
    int rc = list_ckpts(output_dir, &steps, &n, err);
    if (rc != 0)
        return rc;
    rc = ACC_ENOTFOUND;
    for (int i = 0; i < n; i++) {
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s/ckpt-%08d", output_dir, steps[i]);
        acc_err e = {0};
        if (verify_dir(dir, &e) == 0) {
            snprintf(path_out, path_n, "%s", dir);
            rc = 0;
            break;
        }
    }
    free(steps);
    if (rc == ACC_ENOTFOUND)
        acc_err_set(err, ACC_ENOTFOUND, "", "no usable checkpoint under %s", output_dir);
    return rc;
}

int ckpt_peek(const char *dir, ckpt_state *st, acc_err *err)
{
    char path[PATH_MAX + 32];
    st_file *sf;
    int rc = verify_dir(dir, err);
    if (rc != 0)
        return rc;
    snprintf(path, sizeof path, "%s/state.safetensors", dir);
    if ((rc = st_open(path, &sf, err)) != 0)
        return rc;
    long long v[6] = {0};
    const char *keys[6] = {"step", "adam_t", "micro_batch", "accum_steps", "seed", "recompute"};
    for (int i = 0; rc == 0 && i < 6; i++)
        rc = meta_int(sf, keys[i], &v[i], err);
    if (rc == 0)
        *st = (ckpt_state){.step = (int)v[0], .adam_t = (int)v[1], .micro_batch = (int)v[2],
                           .accum_steps = (int)v[3], .seed = (uint64_t)v[4], .recompute = v[5] != 0};
    st_close(sf);
    return rc;
}

int ckpt_resolve(const char *path, char *dir_out, size_t dir_n, acc_err *err)
{
    char probe[PATH_MAX + 32];
    snprintf(probe, sizeof probe, "%s/state.safetensors", path);
    struct stat sb;
    if (stat(probe, &sb) == 0) {
        snprintf(dir_out, dir_n, "%s", path);
        return 0;
    }
    int rc = ckpt_find_latest(path, dir_out, dir_n, err);
    if (rc != 0)
        return acc_err_set(err, rc == ACC_ENOTFOUND ? ACC_EINVAL : rc, "resume_from",
                           "no usable checkpoint at %s", path);
    return 0;
}
