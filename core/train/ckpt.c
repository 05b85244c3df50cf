/* ckpt: see ckpt.h. */
#include "ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "checked.h"
#include "fsutil.h"
#include "hf_dir.h"
#include "model_hf.h"
#include "model_lora.h"
#include "model_shard.h"
#include "safepath.h"
#include "safetensors.h"

#define STATE_FORMAT "accumd-state-1"

/* The weights go to model.safetensors under the family's layout (names,
 * file shapes and orientation: model.h), so this file knows no family. */

/* The weights and, with `opt` (a replica's: the whole trainable range
 * [0, ngrad)), its moments, to host memory; without, *mom1 = *mom2 = NULL (the caller has
 * them, gathered). */
static int download_all(const model *m, const adamw *opt, float **params, float **mom1,
                        float **mom2, acc_err *err)
{
    size_t bytes = m->nparams * sizeof(float), mbytes = m->ngrad * sizeof(float);
    *params = malloc(bytes);
    *mom1 = opt != NULL ? malloc(mbytes) : NULL;
    *mom2 = opt != NULL ? malloc(mbytes) : NULL;
    if (*params == NULL || (opt != NULL && (*mom1 == NULL || *mom2 == NULL))) {
        free(*params);
        free(*mom1);
        free(*mom2);
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory for a checkpoint");
    }
    model_params_download(m, *params);
    if (opt != NULL) { /* from the device, or the host copy when offloaded */
        adamw_moment_get(opt, 0, *mom1);
        adamw_moment_get(opt, 1, *mom2);
    }
    return 0;
}

static bool c_lora(const model *m)
{
    return m->cfg.lora.r > 0;
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
 * model.safetensors holds them exactly (F32); under LoRA only the trainable
 * prefix [0, ngrad) (the adapters: the base is the job's input). The
 * moments are always the whole trainable range's, gathered at every ZeRO
 * stage. */
static int write_state_file(const char *path, const model *m, const float *mom1, const float *mom2,
                            const float *master, const ckpt_state *st, const char *spec_json,
                            acc_err *err)
{
    size_t nmom = m->ngrad, nmaster = c_lora(m) ? m->ngrad : m->nparams;
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
        {"job_uid", st->job_uid}, /* last: left out when empty */
    };
    int nmeta = (int)(sizeof md / sizeof md[0]) - (st->job_uid[0] == '\0');
    st_tensor t[3] = {
        {.name = "adam.m", .dtype = ST_F32, .ndim = 1, .shape = {(int64_t)nmom},
         .data = mom1, .nbytes = nmom * sizeof(float)},
        {.name = "adam.v", .dtype = ST_F32, .ndim = 1, .shape = {(int64_t)nmom},
         .data = mom2, .nbytes = nmom * sizeof(float)},
        {.name = "params", .dtype = ST_F32, .ndim = 1, .shape = {(int64_t)nmaster},
         .data = master, .nbytes = nmaster * sizeof(float)},
    };
    return st_write(path, t, master ? 3 : 2, md, nmeta, err);
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

/* Steps of the complete checkpoints in the directory `dfd` (named `dir`),
 * newest first; removes partial ones. */
static int list_ckpts_at(int dfd, const char *dir, int **steps, int *n, acc_err *err)
{
    *steps = NULL;
    *n = 0;
    int dd = dup(dfd);
    DIR *d = dd >= 0 ? fdopendir(dd) : NULL;
    if (d == NULL) {
        if (dd >= 0)
            close(dd);
        return acc_err_set(err, ACC_EIO, "", "opendir %s: %s", dir, strerror(errno));
    }
    rewinddir(d);
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

static int list_ckpts(const char *dir, int **steps, int *n, acc_err *err)
{
    *steps = NULL;
    *n = 0;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return errno == ENOENT ? 0 : acc_err_set(err, ACC_EIO, "", "opendir %s: %s", dir, strerror(errno));
    int rc = list_ckpts_at(dfd, dir, steps, n, err);
    close(dfd);
    return rc;
}

static void prune(const char *dir, int keep, int protect)
{
    int *steps, n;
    if (list_ckpts(dir, &steps, &n, NULL) != 0)
        return;
    for (int i = keep; i < n; i++) {
        char p[PATH_MAX];
        if (steps[i] == protect)
            continue;
        snprintf(p, sizeof p, "%s/ckpt-%08d", dir, steps[i]);
        fsu_rm_rf(p, NULL);
    }
    free(steps);
}

void ckpt_prune(const char *output_dir, int keep, int protect_step)
{
    if (keep > 0)
        prune(output_dir, keep, protect_step);
}

/* The weights as a Hugging Face directory's: one model.safetensors (the
 * bytes ckpt_save always wrote) or, over 5 GB, shards with an index; then
 * config.json and the source's tokenizer files. */
static int write_weights(const char *dir, const model *m, const float *params, int step,
                         const char *hf_src, const char *hf_roots, st_dtype dtype, acc_err *err)
{
    char file[PATH_MAX + 64];
    model_hf_save_opts o = {.dtype = dtype, .src_dir = hf_src, .src_roots = hf_roots, .host_params = params};
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
    return ckpt_save_as(output_dir, m, opt, st, spec_json, keep, hf_src, NULL, ST_F32, path_out, path_n,
                        err);
}

/* LoRA: the PEFT adapter directory's files, and with merge the merged model
 * as the Hugging Face directory dir/merged (model_lora.h). */
static int write_lora(const char *dir, const model *m, float *params, int step,
                      const char *hf_src, const char *hf_roots, st_dtype dtype, acc_err *err)
{
    int rc = model_lora_save(&m->layout, &m->cfg, params, dir, hf_src ? hf_src : "", err);
    if (rc != 0 || !m->cfg.lora.merge)
        return rc;
    char sub[PATH_MAX + 16];
    if (snprintf(sub, sizeof sub, "%s/" CKPT_MERGED_DIR, dir) >= (int)sizeof sub)
        return acc_err_set(err, ACC_EINVAL, "", "output path too long");
    if (mkdir(sub, 0750) != 0)
        return acc_err_set(err, ACC_EIO, "", "mkdir %s: %s", sub, strerror(errno));
    /* the master weights were written already: fold the adapters in place */
    model_lora_merge_host(&m->layout, &m->cfg, params);
    return write_weights(sub, m, params, step, hf_src, hf_roots, dtype, err);
}

/* A write that failed for want of room: the failed call's errno says
 * ENOSPC or EDQUOT, or the file system has no block left for us (a layer
 * between may have replaced errno). */
static bool out_of_space(const char *output_dir, int saved_errno)
{
    if (saved_errno == ENOSPC || saved_errno == EDQUOT)
        return true;
    struct statvfs vs;
    return statvfs(output_dir, &vs) == 0 && vs.f_bavail == 0;
}

uint64_t ckpt_bytes_estimate(const model *m)
{
    /* weights (+ the fp32 copy in the state at worst) and two moments */
    return acc_sat_mul_u64(acc_sat_add_u64(acc_sat_mul_u64(m->nparams, 2), acc_sat_mul_u64(m->ngrad, 2)),
                           sizeof(float));
}

uint64_t ckpt_free_bytes(const char *output_dir)
{
    struct statvfs vs;
    if (statvfs(output_dir, &vs) != 0)
        return UINT64_MAX; /* unknown: let a write say */
    return acc_sat_mul_u64(vs.f_bavail, vs.f_frsize);
}

/* opt (a replica's, downloaded here) or the host moments gm1, gm2. */
static int save_impl(const char *output_dir, const model *m, const adamw *opt, const float *gm1,
                     const float *gm2, const ckpt_state *st, const char *spec_json, int keep,
                     const char *hf_src, const char *hf_roots, st_dtype dtype, char *path_out,
                     size_t path_n, acc_err *err)
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
    bool lora = m->cfg.lora.r > 0;
    if (rc == 0 && !lora)
        rc = write_weights(partial, m, params, st->step, hf_src, hf_roots, dtype, err);
    if (rc == 0) { /* narrower weights on disk (or an adapter): the exact ones for resuming */
        snprintf(file, sizeof file, "%s/state.safetensors", partial);
        rc = write_state_file(file, m, opt != NULL ? mom1 : gm1, opt != NULL ? mom2 : gm2,
                              dtype == ST_F32 && !lora ? NULL : params, st, spec_json, err);
    }
    if (rc == 0 && lora) /* after the state: merging changes params */
        rc = write_lora(partial, m, params, st->step, hf_src, hf_roots, dtype, err);
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
    int write_errno = errno; /* the failed call's, before the clean-up below */
    free(params);
    free(mom1);
    free(mom2);
    if (rc != 0) {
        fsu_rm_rf(partial, NULL);
        if (rc == ACC_EIO && out_of_space(output_dir, write_errno))
            rc = err != NULL ? (err->code = ACC_ENOSPACE) : ACC_ENOSPACE;
        acc_err_prefix(err, "checkpoint at step %d", st->step);
        return rc;
    }
    if (path_out != NULL)
        snprintf(path_out, path_n, "%s", final);
    if (keep > 0)
        prune(output_dir, keep, -1);
    return 0;
}

int ckpt_save_as(const char *output_dir, const model *m, const adamw *opt, const ckpt_state *st,
                 const char *spec_json, int keep, const char *hf_src, const char *hf_roots, st_dtype dtype,
                 char *path_out, size_t path_n, acc_err *err)
{
    if (opt->lo != 0 || opt->hi != m->ngrad)
        return acc_err_set(err, ACC_EINTERNAL, "", "checkpoint of a ZeRO shard: gather the moments first");
    return save_impl(output_dir, m, opt, NULL, NULL, st, spec_json, keep, hf_src, hf_roots, dtype, path_out,
                     path_n, err);
}

int ckpt_save_gathered(const char *output_dir, const model *m, const float *mom1, const float *mom2,
                       const ckpt_state *st, const char *spec_json, int keep, const char *hf_src,
                       const char *hf_roots, st_dtype dtype, char *path_out, size_t path_n, acc_err *err)
{
    return save_impl(output_dir, m, NULL, mom1, mom2, st, spec_json, keep, hf_src, hf_roots, dtype, path_out,
                     path_n, err);
}

/* ---- loading */

/* *out is set on every path (0 on an error). */
static int meta_int(const st_file *f, const char *key, long long *out, acc_err *err)
{
    const char *v = st_get_meta(f, key);
    char *end;
    *out = 0;
    if (v == NULL)
        return acc_err_set(err, ACC_EINVAL, "resume_from", "checkpoint state has no %s", key);
    errno = 0;
    *out = strtoll(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0')
        /* not the value: it is the file's bytes */
        return acc_err_set(err, ACC_EINVAL, "resume_from", "checkpoint state: %s is not an integer", key);
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

/* Open `name` in the directory `dfd` (called `dir`) as safetensors: a
 * regular file, no symlink (safepath.h), read through that descriptor. */
static int st_open_at(int dfd, const char *dir, const char *name, st_file **f, acc_err *err)
{
    char shown[PATH_MAX + 64];
    int fd;
    snprintf(shown, sizeof shown, "%s/%s", dir, name);
    int rc = sp_openat(dfd, name, 0, "resume_from", &fd, err);
    if (rc != 0) {
        if (err != NULL)
            snprintf(err->msg, sizeof err->msg, "%.400s: %s", shown,
                     rc == ACC_ENOTFOUND ? "missing" : "not a regular file (or a symlink)");
        return rc;
    }
    rc = st_open_fd(fd, shown, f, err);
    close(fd);
    return rc;
}

/* err's code and field replaced, its message kept (st_open's, which names
 * the file and never quotes its bytes). */
static int refield(acc_err *err, int code, const char *field)
{
    char msg[sizeof err->msg] = "unreadable";
    if (err != NULL)
        snprintf(msg, sizeof msg, "%s", err->msg);
    return acc_err_set(err, code, field, "%s", msg);
}

int ckpt_load_weights_fd(int fd, const char *path, model *m, acc_err *err)
{
    st_file *f;
    int rc = st_open_fd(fd, path, &f, err);
    if (rc != 0)
        return refield(err, rc == ACC_ENOMEM ? rc : ACC_EINVAL, "model.init_from");
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

int ckpt_load_weights(const char *path, model *m, acc_err *err)
{
    int fd;
    int rc = sp_open_file("", path, "model.init_from", &fd, NULL, 0, err);
    if (rc != 0)
        return rc;
    rc = ckpt_load_weights_fd(fd, path, m, err);
    close(fd);
    return rc;
}

/* The state metadata: step, adam_t, split, seed, recompute, job_uid. */
static int read_state_meta(const st_file *sf, const char *path, ckpt_state *st, acc_err *err)
{
    const char *fmt = st_get_meta(sf, "format");
    if (fmt == NULL || strcmp(fmt, STATE_FORMAT) != 0)
        return acc_err_set(err, ACC_EINVAL, "resume_from", "%s: not an accumd training state", path);
    long long v[6] = {0};
    const char *keys[6] = {"step", "adam_t", "micro_batch", "accum_steps", "seed", "recompute"};
    for (int i = 0; i < 6; i++) {
        int rc = meta_int(sf, keys[i], &v[i], err);
        if (rc != 0)
            return rc;
    }
    if (v[0] < 0 || v[0] > 1000000000 || v[1] < 0 || v[1] > 1000000000 || v[2] < 0 || v[2] > (1 << 24) ||
        v[3] < 0 || v[3] > (1 << 24))
        return acc_err_set(err, ACC_EINVAL, "resume_from", "%s: state values out of range", path);
    *st = (ckpt_state){.step = (int)v[0], .adam_t = (int)v[1], .micro_batch = (int)v[2],
                       .accum_steps = (int)v[3], .seed = (uint64_t)v[4], .recompute = v[5] != 0};
    const char *uid = st_get_meta(sf, "job_uid");
    if (uid != NULL)
        snprintf(st->job_uid, sizeof st->job_uid, "%s", uid);
    return 0;
}

/* Weights over 5 GB were written as shards (write_weights). */
static int sharded_at(int dfd)
{
    struct stat sb;
    return fstatat(dfd, "model.safetensors.index.json", &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(sb.st_mode);
}

/* The shards of a checkpoint directory, by the index (hf_dir.h opens them
 * from the directory's descriptor, opened and checked). */
static int load_sharded(int dfd, const char *dir, model *m, acc_err *err)
{
    hf_dir *h = NULL;
    int rc = hf_open_at(dfd, dir, 0, &h, err);
    if (rc == 0)
        rc = model_hf_check(h, &m->cfg, err);
    if (rc == 0)
        rc = model_hf_load(m, h, err);
    hf_close(h);
    return rc;
}

int ckpt_load_at(int dfd, const char *dir, model *m, adamw *opt, ckpt_state *st, acc_err *err)
{
    char path[PATH_MAX + 32];
    st_file *mf = NULL, *sf = NULL;
    float *params = NULL;
    ckpt_state got;
    snprintf(path, sizeof path, "%s/state.safetensors", dir);
    int rc = st_open_at(dfd, dir, "state.safetensors", &sf, err);
    if (rc == 0)
        rc = read_state_meta(sf, path, &got, err);
    if (rc == 0)
        rc = check_shape_meta(sf, &m->cfg, err);
    st_tensor tm, tv;
    if (rc == 0 && (st_get(sf, "adam.m", &tm, err) != 0 || st_get(sf, "adam.v", &tv, err) != 0 ||
                    tm.nbytes != m->ngrad * sizeof(float) || tv.nbytes != tm.nbytes ||
                    opt->lo > opt->hi || opt->hi > m->ngrad))
        rc = acc_err_set(err, ACC_EINVAL, "resume_from", "%s: optimizer state does not match the model", path);
    st_tensor tp;
    int master = rc == 0 && st_get(sf, "params", &tp, NULL) == 0;
    size_t nmaster = c_lora(m) ? m->ngrad : m->nparams; /* LoRA: the adapters (the caller
                                                          * loaded the frozen base) */
    if (c_lora(m) && !master)
        rc = acc_err_set(err, ACC_EINVAL, "resume_from", "%s: no adapter weights", path);
    if (master && (tp.dtype != ST_F32 || tp.nbytes != nmaster * sizeof(float)))
        rc = acc_err_set(err, ACC_EINVAL, "resume_from", "%s: master weights do not match the model", path);
    if (rc == 0 && master) { /* the fp32 weights beside a narrower model.safetensors */
        model_weights_upload(m, tp.data, 0, nmaster); /* a ZeRO-3 rank: its pieces */
    } else if (rc == 0 && sharded_at(dfd)) {
        rc = load_sharded(dfd, dir, m, err);
    } else if (rc == 0) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        rc = st_open_at(dfd, dir, "model.safetensors", &mf, err);
        if (rc == 0 && ((params = malloc(m->nparams * sizeof *params)) == NULL))
            rc = acc_err_set(err, ACC_ENOMEM, "", "out of host memory");
        if (rc == 0)
            rc = model_safetensors_read(&m->layout, mf, path, "resume_from", params, err);
        if (rc == 0)
            model_params_upload(m, params);
    }
    if (rc == 0) {
        /* the whole trainable range's moments on disk: this optimizer's range of them
         * (a ZeRO shard of any world size, or all), on the device or the
         * host (offloaded) */
        if (m->shard != NULL) { /* ZeRO-3: the partition's pieces, in its order, through
                                 * the gradient buffer's partition (free until the first step) */
            size_t each = (opt->hi - opt->lo) * sizeof(float);
            float *buf = malloc(each > 0 ? each : 1);
            if (buf == NULL)
                rc = acc_err_set(err, ACC_ENOMEM, "", "out of host memory loading the optimizer state");
            for (int i = 0; rc == 0 && i < 2; i++) {
                const float *whole = (const float *)(i == 0 ? tm.data : tv.data);
                if (model_shard_grads_on_host(m)) { /* no device gradient partition: scattered on the host */
                    model_shard_scatter_host(m, whole, buf);
                } else {
                    model_shard_scatter_host(m, whole, m->grads);
                    m->dev->ops->download(m->dev, buf, m->grads, each);
                }
                adamw_moment_set(opt, i, buf);
            }
            model_zero_grad(m);
            free(buf);
        } else {
            adamw_moment_set(opt, 0, (const float *)tm.data + opt->lo);
            adamw_moment_set(opt, 1, (const float *)tv.data + opt->lo);
        }
        opt->t = got.adam_t;
        *st = got;
    }
    free(params);
    st_close(mf);
    st_close(sf);
    if (rc != 0 && err != NULL && strstr(err->msg, dir) == NULL)
        acc_err_prefix(err, "checkpoint %s", dir);
    return rc;
}

int ckpt_load(const char *dir, model *m, adamw *opt, ckpt_state *st, acc_err *err)
{
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return acc_err_set(err, ACC_EINVAL, "resume_from", "checkpoint %s: %s", dir, strerror(errno));
    int rc = ckpt_load_at(dfd, dir, m, opt, st, err);
    close(dfd);
    return rc;
}

/* Both files open and verify (CRC); *st gets the state metadata. */
static int verify_at(int dfd, const char *dir, ckpt_state *st, acc_err *err)
{
    char path[PATH_MAX + 32];
    st_file *f;
    int rc;
    if (sharded_at(dfd)) { /* every shard opens and its checksum verifies */
        hf_dir *h = NULL;
        rc = hf_open_at(dfd, dir, 0, &h, err);
        hf_close(h);
    } else if ((rc = st_open_at(dfd, dir, "model.safetensors", &f, err)) == 0) {
        st_close(f);
    }
    if (rc != 0)
        return rc;
    if ((rc = st_open_at(dfd, dir, "state.safetensors", &f, err)) != 0)
        return rc;
    snprintf(path, sizeof path, "%s/state.safetensors", dir);
    rc = read_state_meta(f, path, st, err);
    st_close(f);
    return rc;
}

int ckpt_check_model_at(int dfd, const char *dir, const model_config *cfg, acc_err *err)
{
    st_file *f;
    int rc = st_open_at(dfd, dir, "state.safetensors", &f, err);
    if (rc != 0)
        return rc;
    rc = check_shape_meta(f, cfg, err);
    st_close(f);
    if (rc != 0 && err != NULL && strstr(err->msg, dir) == NULL)
        acc_err_prefix(err, "checkpoint %s", dir);
    return rc;
}

int ckpt_peek(const char *dir, ckpt_state *st, acc_err *err)
{
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return acc_err_set(err, ACC_EINVAL, "resume_from", "checkpoint %s: %s", dir, strerror(errno));
    int rc = verify_at(dfd, dir, st, err);
    close(dfd);
    return rc;
}

/* Whose checkpoint: NULL when `st` may be resumed by the job `uid`, else why not. */
static const char *foreign(const ckpt_state *st, const char *uid, bool adopt_unnamed, char *why, size_t n)
{
    if (uid == NULL || uid[0] == '\0')
        return NULL;
    if (st->job_uid[0] == '\0') {
        if (adopt_unnamed)
            return NULL;
        snprintf(why, n, "it names no job (written before job ids existed, or by another job)");
        return why;
    }
    if (strcmp(st->job_uid, uid) != 0) {
        snprintf(why, n, "it was written by another job (job uid %.32s, this job is %.32s)", st->job_uid, uid);
        return why;
    }
    return NULL;
}

int ckpt_find_at(int outfd, const char *output_dir, const char *uid, bool adopt_unnamed,
                 ckpt_reject_fn reject, void *ctx, int *ckpt_fd, char *path_out, size_t path_n,
                 ckpt_state *st_out, acc_err *err)
{
    int *steps, n;
    if (ckpt_fd != NULL)
        *ckpt_fd = -1;
    int rc = list_ckpts_at(outfd, output_dir, &steps, &n, err);
    if (rc != 0)
        return rc;
    rc = ACC_ENOTFOUND;
    for (int i = 0; i < n; i++) {
        char name[32], dir[PATH_MAX + 32], why[256];
        snprintf(name, sizeof name, "ckpt-%08d", steps[i]);
        snprintf(dir, sizeof dir, "%s/%s", output_dir, name);
        acc_err e = {0};
        ckpt_state st;
        int cfd;
        const char *bad = NULL;
        if (sp_openat(outfd, name, 1, "resume_from", &cfd, &e) != 0) {
            bad = "not a directory (or a symlink)";
        } else if (verify_at(cfd, dir, &st, &e) != 0) {
            bad = e.msg;
        } else {
            bad = foreign(&st, uid, adopt_unnamed, why, sizeof why);
        }
        if (bad != NULL) {
            if (cfd >= 0)
                close(cfd);
            if (reject != NULL)
                reject(ctx, dir, bad);
            continue;
        }
        snprintf(path_out, path_n, "%s", dir);
        if (st_out != NULL)
            *st_out = st;
        if (ckpt_fd != NULL)
            *ckpt_fd = cfd;
        else
            close(cfd);
        rc = 0;
        break;
    }
    free(steps);
    if (rc == ACC_ENOTFOUND)
        acc_err_set(err, ACC_ENOTFOUND, "", "no usable checkpoint under %s", output_dir);
    return rc;
}

int ckpt_find_latest(const char *output_dir, char *path_out, size_t path_n, acc_err *err)
{
    int dfd = open(output_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return errno == ENOENT ? acc_err_set(err, ACC_ENOTFOUND, "", "no usable checkpoint under %s", output_dir)
                               : acc_err_set(err, ACC_EIO, "", "opendir %s: %s", output_dir, strerror(errno));
    int rc = ckpt_find_at(dfd, output_dir, NULL, true, NULL, NULL, NULL, path_out, path_n, NULL, err);
    close(dfd);
    return rc;
}

int ckpt_resolve_at(int fd, const char *path, ckpt_reject_fn reject, void *ctx, int *ckpt_fd,
                    char *dir_out, size_t dir_n, ckpt_state *st, acc_err *err)
{
    struct stat sb;
    *ckpt_fd = -1;
    if (fstatat(fd, "state.safetensors", &sb, AT_SYMLINK_NOFOLLOW) == 0) {
        /* one checkpoint directory */
        int rc = verify_at(fd, path, st, err);
        if (rc != 0)
            return refield(err, ACC_EINVAL, "resume_from");
        if ((*ckpt_fd = dup(fd)) < 0)
            return acc_err_set(err, ACC_EIO, "resume_from", "dup: %s", strerror(errno));
        snprintf(dir_out, dir_n, "%s", path);
        return 0;
    }
    int rc = ckpt_find_at(fd, path, NULL, true, reject, ctx, ckpt_fd, dir_out, dir_n, st, err);
    if (rc != 0)
        return acc_err_set(err, rc == ACC_ENOTFOUND ? ACC_EINVAL : rc, "resume_from",
                           "no usable checkpoint at %s (name a checkpoint directory or a job's output "
                           "directory)", path);
    return 0;
}

int ckpt_resolve(const char *path, char *dir_out, size_t dir_n, acc_err *err)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return acc_err_set(err, ACC_EINVAL, "resume_from", "no usable checkpoint at %s: %s", path, strerror(errno));
    int cfd;
    ckpt_state st;
    int rc = ckpt_resolve_at(fd, path, NULL, NULL, &cfd, dir_out, dir_n, &st, err);
    if (cfd >= 0)
        close(cfd);
    close(fd);
    return rc;
}

/* The newest good checkpoint of the job in its own output_dir (only
 * checkpoints carrying its job_uid); ACC_ENOTFOUND without one. */
static int find_own(const ckpt_job *j, ckpt_reject_fn reject, void *ctx, int *fd, char *dir, size_t n,
                    ckpt_state *st)
{
    int ofd;
    *fd = -1;
    if (j->output_dir[0] == '\0' || sp_open_dir(j->output_root, j->output_dir, "output_dir", &ofd, NULL, 0, NULL) != 0)
        return ACC_ENOTFOUND;
    int rc = ckpt_find_at(ofd, j->output_dir, j->job_uid, j->adopt_unnamed, reject, ctx, fd, dir, n, st, NULL);
    close(ofd);
    return rc;
}

/* resume_from: a checkpoint directory or a job's output directory under
 * output_root, opened through safepath and verified. */
static int find_named(const ckpt_job *j, ckpt_reject_fn reject, void *ctx, int *fd, char *dir, size_t n,
                      ckpt_state *st, acc_err *err)
{
    int rfd;
    int rc = sp_open_dir(j->output_root, j->resume_from, "resume_from", &rfd, NULL, 0, err);
    if (rc != 0)
        return rc;
    rc = ckpt_resolve_at(rfd, j->resume_from, reject, ctx, fd, dir, n, st, err);
    close(rfd);
    return rc;
}

int ckpt_discover(const ckpt_job *j, ckpt_reject_fn reject, void *ctx, int *ckpt_fd, char *dir_out,
                  size_t dir_n, ckpt_state *st, acc_err *err)
{
    bool own = find_own(j, reject, ctx, ckpt_fd, dir_out, dir_n, st) == 0;
    if (j->output_dir[0] != '\0')
        ckpt_prune(j->output_dir, j->keep, own ? st->step : -1);
    if (own || j->resume_from[0] == '\0')
        return 0;
    return find_named(j, reject, ctx, ckpt_fd, dir_out, dir_n, st, err);
}

int ckpt_check_resume_from(const char *output_root, const char *resume_from, const model_config *cfg,
                           int max_steps, acc_err *err)
{
    if (resume_from[0] == '\0')
        return 0;
    int rfd, cfd = -1;
    char dir[PATH_MAX];
    ckpt_state st;
    int rc = sp_open_dir(output_root, resume_from, "resume_from", &rfd, NULL, 0, err);
    if (rc != 0)
        return rc;
    rc = ckpt_resolve_at(rfd, resume_from, NULL, NULL, &cfd, dir, sizeof dir, &st, err);
    close(rfd);
    if (rc == 0)
        rc = ckpt_check_model_at(cfd, dir, cfg, err);
    if (cfd >= 0)
        close(cfd);
    if (rc == 0 && st.step > max_steps)
        rc = acc_err_set(err, ACC_EINVAL, "resume_from", "checkpoint %s is at step %d, past max_steps %d", dir,
                         st.step, max_steps);
    return rc;
}
