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
#include "safetensors.h"

#define NAME_LEN 64
#define STATE_FORMAT "accumd-state-1"

/* The Hugging Face name and orientation of each of the model's 16 tensors
 * (llm.c order, see model_gpt2.h). Matrices are stored [out, in] by the
 * model and [in, out] (Conv1D) by GPT-2 checkpoints. */
typedef struct hf_tensor {
    const char *name;    /* printf format, %d = layer */
    int layered;
    int out_mult, in_mult; /* matrices: out = out_mult*C, in = in_mult*C; 0 = vector/embedding */
} hf_tensor;

static const hf_tensor hf_map[MODEL_NTENSORS] = {
    {"wte.weight", 0, 0, 0},
    {"wpe.weight", 0, 0, 0},
    {"h.%d.ln_1.weight", 1, 0, 0},
    {"h.%d.ln_1.bias", 1, 0, 0},
    {"h.%d.attn.c_attn.weight", 1, 3, 1},
    {"h.%d.attn.c_attn.bias", 1, 0, 0},
    {"h.%d.attn.c_proj.weight", 1, 1, 1},
    {"h.%d.attn.c_proj.bias", 1, 0, 0},
    {"h.%d.ln_2.weight", 1, 0, 0},
    {"h.%d.ln_2.bias", 1, 0, 0},
    {"h.%d.mlp.c_fc.weight", 1, 4, 1},
    {"h.%d.mlp.c_fc.bias", 1, 0, 0},
    {"h.%d.mlp.c_proj.weight", 1, 1, 4},
    {"h.%d.mlp.c_proj.bias", 1, 0, 0},
    {"ln_f.weight", 0, 0, 0},
    {"ln_f.bias", 0, 0, 0},
};

/* One HF tensor: where it lives in the model's flat layout and its shape. */
typedef struct hf_slot {
    char name[NAME_LEN];
    size_t off, count;   /* floats, in the model layout */
    int ndim;
    int64_t shape[2];    /* HF shape */
    int transpose;       /* model [shape[1], shape[0]] <-> HF [shape[0], shape[1]] */
} hf_slot;

static int n_slots(const model_config *c)
{
    int n = 0;
    for (int i = 0; i < MODEL_NTENSORS; i++)
        n += hf_map[i].layered ? c->n_layer : 1;
    return n;
}

static void build_slots(const model_gpt2 *m, hf_slot *s)
{
    const model_config *c = &m->cfg;
    int64_t C = c->channels;
    int k = 0;
    for (int i = 0; i < MODEL_NTENSORS; i++) {
        const hf_tensor *h = &hf_map[i];
        int layers = h->layered ? c->n_layer : 1;
        size_t per = m->tensor_size[i] / (size_t)layers;
        for (int l = 0; l < layers; l++, k++) {
            hf_slot *t = &s[k];
            snprintf(t->name, sizeof t->name, h->name, l);
            t->off = m->tensor_off[i] + (size_t)l * per;
            t->count = per;
            t->transpose = h->out_mult > 0;
            if (t->transpose) {
                t->ndim = 2;
                t->shape[0] = h->in_mult * C;
                t->shape[1] = h->out_mult * C;
            } else if (i == 0) { /* wte without its padded rows */
                t->ndim = 2;
                t->shape[0] = c->vocab_size;
                t->shape[1] = C;
                t->count = (size_t)c->vocab_size * (size_t)C;
            } else if (i == 1) {
                t->ndim = 2;
                t->shape[0] = c->max_seq_len;
                t->shape[1] = C;
            } else {
                t->ndim = 1;
                t->shape[0] = (int64_t)per;
            }
        }
    }
}

/* dst[c][r] = src[r][c] for a rows x cols matrix */
static void transpose(float *dst, const float *src, size_t rows, size_t cols)
{
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++)
            dst[c * rows + r] = src[r * cols + c];
}

static int download_all(const model_gpt2 *m, float **params, float **mom1, float **mom2, acc_err *err)
{
    size_t bytes = m->nparams * sizeof(float);
    *params = malloc(bytes);
    *mom1 = malloc(bytes);
    *mom2 = malloc(bytes);
    if (*params == NULL || *mom1 == NULL || *mom2 == NULL) {
        free(*params);
        free(*mom1);
        free(*mom2);
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory for a checkpoint");
    }
    kern_device *d = m->dev;
    d->ops->download(d, *params, m->params, bytes);
    d->ops->download(d, *mom1, m->adam_m, bytes);
    d->ops->download(d, *mom2, m->adam_v, bytes);
    return 0;
}

static int write_model_file(const char *path, const model_gpt2 *m, const float *params, int step,
                            acc_err *err)
{
    int n = n_slots(&m->cfg);
    hf_slot *s = calloc((size_t)n, sizeof *s);
    st_tensor *t = calloc((size_t)n, sizeof *t);
    float *hf = malloc(m->nparams * sizeof *hf); /* transposed copies */
    int rc = 0;
    if (s == NULL || t == NULL || hf == NULL)
        rc = acc_err_set(err, ACC_ENOMEM, "", "out of host memory for a checkpoint");
    if (rc == 0) {
        build_slots(m, s);
        for (int i = 0; i < n; i++) {
            const float *src = params + s[i].off;
            if (s[i].transpose) {
                transpose(hf + s[i].off, src, (size_t)s[i].shape[1], (size_t)s[i].shape[0]);
                src = hf + s[i].off;
            }
            t[i] = (st_tensor){.name = s[i].name, .dtype = ST_F32, .ndim = s[i].ndim,
                               .shape = {s[i].shape[0], s[i].shape[1]}, .data = src,
                               .nbytes = s[i].count * sizeof(float)};
        }
        char step_s[24];
        snprintf(step_s, sizeof step_s, "%d", step);
        st_meta md[] = {{"format", "pt"}, {"step", step_s}, {"producer", "accumd"}};
        rc = st_write(path, t, n, md, 3, err);
    }
    free(hf);
    free(t);
    free(s);
    return rc;
}

static int write_state_file(const char *path, const model_gpt2 *m, const float *mom1,
                            const float *mom2, const ckpt_state *st, const char *spec_json,
                            acc_err *err)
{
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
    st_tensor t[2] = {
        {.name = "adam.m", .dtype = ST_F32, .ndim = 1, .shape = {(int64_t)m->nparams},
         .data = mom1, .nbytes = m->nparams * sizeof(float)},
        {.name = "adam.v", .dtype = ST_F32, .ndim = 1, .shape = {(int64_t)m->nparams},
         .data = mom2, .nbytes = m->nparams * sizeof(float)},
    };
    return st_write(path, t, 2, md, (int)(sizeof md / sizeof md[0]), err);
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

int ckpt_save(const char *output_dir, const model_gpt2 *m, const ckpt_state *st,
              const char *spec_json, int keep, char *path_out, size_t path_n, acc_err *err)
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
    rc = download_all(m, &params, &mom1, &mom2, err);
    if (rc == 0) {
        snprintf(file, sizeof file, "%s/model.safetensors", partial);
        rc = write_model_file(file, m, params, st->step, err);
    }
    if (rc == 0) {
        snprintf(file, sizeof file, "%s/state.safetensors", partial);
        rc = write_state_file(file, m, mom1, mom2, st, spec_json, err);
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

static int read_weights(const st_file *f, const char *path, const model_gpt2 *m, float *params,
                        acc_err *err)
{
    int n = n_slots(&m->cfg);
    hf_slot *s = calloc((size_t)n, sizeof *s);
    if (s == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory");
    build_slots(m, s);
    memset(params, 0, m->nparams * sizeof *params); /* padded wte rows stay 0 */
    int rc = 0;
    for (int i = 0; rc == 0 && i < n; i++) {
        st_tensor t;
        rc = st_get(f, s[i].name, &t, err);
        if (rc != 0) {
            rc = acc_err_set(err, ACC_EINVAL, "model.init_from", "%s has no tensor %s", path, s[i].name);
            break;
        }
        if (t.dtype != ST_F32 || t.ndim != s[i].ndim || t.shape[0] != s[i].shape[0] ||
            (t.ndim == 2 && t.shape[1] != s[i].shape[1])) {
            rc = acc_err_set(err, ACC_EINVAL, "model.init_from",
                             "%s: tensor %s has the wrong dtype or shape for this model", path, s[i].name);
            break;
        }
        if (s[i].transpose)
            transpose(params + s[i].off, t.data, (size_t)s[i].shape[0], (size_t)s[i].shape[1]);
        else
            memcpy(params + s[i].off, t.data, s[i].count * sizeof(float));
    }
    free(s);
    return rc;
}

int ckpt_load_weights(const char *path, model_gpt2 *m, acc_err *err)
{
    st_file *f;
    int rc = st_open(path, &f, err);
    if (rc != 0)
        return acc_err_set(err, ACC_EINVAL, "model.init_from", "%s", err ? err->msg : "unreadable");
    float *params = malloc(m->nparams * sizeof *params);
    if (params == NULL)
        rc = acc_err_set(err, ACC_ENOMEM, "", "out of host memory");
    if (rc == 0)
        rc = read_weights(f, path, m, params, err);
    if (rc == 0)
        m->dev->ops->upload(m->dev, m->params, params, m->nparams * sizeof *params);
    free(params);
    st_close(f);
    return rc;
}

int ckpt_weights_shape(const char *path, int *n_layer, int *channels, int *vocab,
                       int *max_seq_len, acc_err *err)
{
    st_file *f;
    if (st_open(path, &f, err) != 0)
        return acc_err_set(err, ACC_EINVAL, "model.init_from", "%s", err ? err->msg : "unreadable");
    st_tensor wte, wpe, t;
    int rc = 0;
    if (st_get(f, "wte.weight", &wte, NULL) != 0 || st_get(f, "wpe.weight", &wpe, NULL) != 0 ||
        wte.ndim != 2 || wpe.ndim != 2)
        rc = acc_err_set(err, ACC_EINVAL, "model.init_from",
                         "%s is not a GPT-2 checkpoint (no wte.weight / wpe.weight)", path);
    int layers = 0;
    char name[NAME_LEN];
    while (rc == 0 && layers < 100000) {
        snprintf(name, sizeof name, "h.%d.ln_1.weight", layers);
        if (st_get(f, name, &t, NULL) != 0)
            break;
        layers++;
    }
    if (rc == 0) {
        *n_layer = layers;
        *channels = (int)wte.shape[1];
        *vocab = (int)wte.shape[0];
        *max_seq_len = (int)wpe.shape[0];
    }
    st_close(f);
    return rc;
}

int ckpt_load(const char *dir, model_gpt2 *m, ckpt_state *st, acc_err *err)
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
                    tm.nbytes != m->nparams * sizeof(float) || tv.nbytes != tm.nbytes))
        rc = acc_err_set(err, ACC_EINVAL, "resume_from", "%s: optimizer state does not match the model", path);
    if (rc == 0) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        rc = st_open(path, &mf, err);
    }
    if (rc == 0 && ((params = malloc(m->nparams * sizeof *params)) == NULL))
        rc = acc_err_set(err, ACC_ENOMEM, "", "out of host memory");
    if (rc == 0)
        rc = read_weights(mf, path, m, params, err);
    if (rc == 0) {
        kern_device *d = m->dev;
        d->ops->upload(d, m->params, params, m->nparams * sizeof *params);
        d->ops->upload(d, m->adam_m, tm.data, tm.nbytes);
        d->ops->upload(d, m->adam_v, tv.data, tv.nbytes);
        m->adam_t = (int)v[1];
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
    const char *files[] = {"model.safetensors", "state.safetensors"};
    for (int i = 0; i < 2; i++) {
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
