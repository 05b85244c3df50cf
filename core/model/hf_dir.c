/* hf_dir: see hf_dir.h. */
#include "hf_dir.h"

#include <errno.h>
#include <stdarg.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"
#include "safepath.h"

#define CONFIG_MAX (16u << 20)
#define INDEX_MAX (64u << 20)
#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"

typedef struct hf_entry {
    const char *name; /* owned by the file's header */
    int file;
    st_tensor t;
} hf_entry;

struct hf_dir {
    char path[PATH_MAX];
    int header_only;
    const char *roots; /* while opening: the roots the directory was opened under */
    int dfd;           /* while opening: the directory, checked under them */
    json_t *config;
    int nfiles;
    st_file **files;
    char **file_names;
    int n;
    hf_entry *e; /* sorted by name */
    int sharded;
};

static const char *const tokenizer_files[] = {
    "generation_config.json", "tokenizer.json",  "tokenizer_config.json", "tokenizer.model",
    "special_tokens_map.json", "added_tokens.json", "vocab.json",         "merges.txt",
    "chat_template.jinja",
};

const char *hf_path(const hf_dir *h) { return h->path; }
json_t *hf_config(const hf_dir *h) { return h->config; }

static int bad(acc_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(acc_err *err, const char *fmt, ...)
{
    char msg[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return acc_err_set(err, ACC_EINVAL, HF_FIELD, "%s", msg);
}

/* ---- opening */

/* A file of the directory, through safepath.h: regular, not blocking, a
 * symlink only to a target under the roots. ACC_ENOTFOUND when absent. */
static int open_member(const hf_dir *h, const char *name, int *fd, acc_err *err)
{
    acc_err e = {0};
    int rc = sp_open_in(h->roots, h->dfd, h->path, name, HF_FIELD, fd, &e);
    if (rc == ACC_ENOTFOUND)
        return rc;
    return rc != 0 ? bad(err, "%s", e.msg) : 0;
}

/* A JSON object file of the directory. Not JSON: its line and column
 * only, never jansson's text, which quotes the file's bytes. */
static int load_json(const hf_dir *h, const char *name, size_t max, json_t **out, acc_err *err)
{
    char shown[PATH_MAX + 64], *text;
    size_t len;
    int fd;
    snprintf(shown, sizeof shown, "%s/%s", h->path, name);
    int rc = open_member(h, name, &fd, err);
    if (rc != 0)
        return rc;
    acc_err e = {0};
    rc = fsu_read_fd(fd, shown, &text, &len, max, &e);
    close(fd);
    if (rc != 0)
        return rc == ACC_ENOMEM ? acc_err_set(err, rc, NULL, "%s", e.msg) : bad(err, "%s", e.msg);
    json_error_t je;
    *out = json_loadb(text, len, 0, &je);
    free(text);
    if (*out == NULL)
        return bad(err, "%s: not valid JSON (line %d, column %d)", shown, je.line, je.column);
    if (!json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return bad(err, "%s: not a JSON object", shown);
    }
    return 0;
}

static int add_file(hf_dir *h, const char *name, acc_err *err)
{
    for (int i = 0; i < h->nfiles; i++)
        if (!strcmp(h->file_names[i], name))
            return i;
    if (name[0] == '\0' || strchr(name, '/') != NULL || !strcmp(name, "..") || !strcmp(name, "."))
        return bad(err, "%s/%s: shard name '%s' is not a file name in the directory", h->path,
                   INDEX_NAME, name);
    st_file **f = realloc(h->files, (size_t)(h->nfiles + 1) * sizeof *f);
    if (f != NULL)
        h->files = f;
    char **nm = realloc(h->file_names, (size_t)(h->nfiles + 1) * sizeof *nm);
    if (nm != NULL)
        h->file_names = nm;
    char *dup = strdup(name);
    if (f == NULL || nm == NULL || dup == NULL) {
        free(dup);
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory opening %s", h->path);
    }
    char path[PATH_MAX + 256];
    snprintf(path, sizeof path, "%s/%s", h->path, name);
    st_file *sf = NULL;
    acc_err e = {0};
    int fd;
    int rc = open_member(h, name, &fd, err);
    if (rc == ACC_ENOTFOUND) {
        free(dup);
        return h->sharded ? bad(err, "%s/%s names shard %s, which is missing", h->path, INDEX_NAME, name)
                          : bad(err, "%s has neither %s nor %s", h->path, SINGLE_NAME, INDEX_NAME);
    }
    if (rc != 0) {
        free(dup);
        return rc;
    }
    rc = h->header_only ? st_open_header_fd(fd, path, &sf, &e) : st_open_fd(fd, path, &sf, &e);
    close(fd); /* a mapping outlives its descriptor */
    if (rc != 0) {
        free(dup);
        return rc == ACC_ENOMEM ? acc_err_set(err, rc, NULL, "%s", e.msg) : bad(err, "%s", e.msg);
    }
    h->files[h->nfiles] = sf;
    h->file_names[h->nfiles] = dup;
    return h->nfiles++;
}

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const hf_entry *)a)->name, ((const hf_entry *)b)->name);
}

static const hf_entry *find(const hf_dir *h, const char *name)
{
    hf_entry key = {.name = name};
    return h->n ? bsearch(&key, h->e, (size_t)h->n, sizeof *h->e, cmp_entry) : NULL;
}

/* Every tensor of every file, sorted by name; no name twice. */
static int index_tensors(hf_dir *h, acc_err *err)
{
    size_t total = 0;
    for (int i = 0; i < h->nfiles; i++)
        total += (size_t)st_count(h->files[i]);
    h->e = calloc(total ? total : 1, sizeof *h->e);
    if (h->e == NULL)
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory opening %s", h->path);
    for (int i = 0; i < h->nfiles; i++)
        for (int k = 0; k < st_count(h->files[i]); k++) {
            hf_entry *e = &h->e[h->n++];
            st_at(h->files[i], k, &e->t);
            e->name = e->t.name;
            e->file = i;
        }
    qsort(h->e, (size_t)h->n, sizeof *h->e, cmp_entry);
    for (int i = 1; i < h->n; i++)
        if (!strcmp(h->e[i].name, h->e[i - 1].name))
            return bad(err, "%s: tensor %s is in both %s and %s", h->path, h->e[i].name,
                       h->file_names[h->e[i - 1].file], h->file_names[h->e[i].file]);
    return 0;
}

static int open_sharded(hf_dir *h, const char *index_path, json_t *index, acc_err *err)
{
    json_t *map = json_object_get(index, "weight_map");
    if (!json_is_object(map) || json_object_size(map) == 0)
        return bad(err, "%s: weight_map must be a non-empty object", index_path);
    const char *name;
    json_t *v;
    json_object_foreach(map, name, v) {
        if (!json_is_string(v))
            return bad(err, "%s: weight_map.%s must be a file name", index_path, name);
        int rc = add_file(h, json_string_value(v), err);
        if (rc < 0)
            return rc;
    }
    int rc = index_tensors(h, err);
    if (rc != 0)
        return rc;
    json_object_foreach(map, name, v) { /* the index and the shards must agree */
        const hf_entry *e = find(h, name);
        if (e == NULL || strcmp(h->file_names[e->file], json_string_value(v)) != 0)
            return bad(err, "%s places tensor %s in %s, which does not hold it", index_path, name,
                       json_string_value(v));
    }
    for (int i = 0; i < h->n; i++)
        if (json_object_get(map, h->e[i].name) == NULL)
            return bad(err, "%s/%s holds tensor %s, which %s does not list", h->path,
                       h->file_names[h->e[i].file], h->e[i].name, INDEX_NAME);
    return 0;
}

/* The side files hf_save copies must be what any other file of the
 * directory may be (a symlink out of the roots would be copied into the
 * output). */
static int check_side_files(const hf_dir *h, acc_err *err)
{
    for (size_t i = 0; i < sizeof tokenizer_files / sizeof tokenizer_files[0]; i++) {
        int fd;
        int rc = open_member(h, tokenizer_files[i], &fd, err);
        if (rc == ACC_ENOTFOUND)
            continue;
        if (rc != 0)
            return rc;
        close(fd);
    }
    return 0;
}

static int open_files(hf_dir *h, acc_err *err)
{
    int rc = load_json(h, "config.json", CONFIG_MAX, &h->config, err);
    if (rc == ACC_ENOTFOUND)
        return bad(err, "%s has no config.json (not a Hugging Face model directory)", h->path);
    if (rc != 0 || h->header_only == HF_OPEN_CONFIG) /* planning: config.json alone */
        return rc;
    json_t *index = NULL;
    char path[PATH_MAX + 64];
    if (rc == 0) {
        snprintf(path, sizeof path, "%s/%s", h->path, INDEX_NAME);
        rc = load_json(h, INDEX_NAME, INDEX_MAX, &index, err);
        if (rc == 0) {
            h->sharded = 1;
            rc = open_sharded(h, path, index, err);
        } else if (rc == ACC_ENOTFOUND && (rc = add_file(h, SINGLE_NAME, err)) >= 0) {
            rc = index_tensors(h, err);
        }
    }
    json_decref(index);
    if (rc == 0)
        rc = check_side_files(h, err);
    return rc;
}

/* dfd >= 0: the directory, open already (not closed here); else opened
 * under the roots. */
static int open_dir(const char *roots, int dfd, const char *dir, int header_only, hf_dir **out, acc_err *err)
{
    hf_dir *h = calloc(1, sizeof *h);
    if (h == NULL)
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    h->header_only = header_only;
    h->roots = roots != NULL ? roots : "";
    h->dfd = dfd;
    int rc = 0;
    size_t dl = strlen(dir);
    while (dl > 1 && dir[dl - 1] == '/')
        dl--;
    if (dl + 64 >= sizeof h->path)
        rc = bad(err, "path too long: %s", dir);
    if (rc == 0) {
        memcpy(h->path, dir, dl);
        acc_err e = {0};
        if (dfd < 0 && (rc = sp_open_dir(h->roots, h->path, HF_FIELD, &h->dfd, NULL, 0, &e)) != 0)
            rc = bad(err, "%s", e.msg);
    }
    if (rc == 0)
        rc = open_files(h, err);
    if (dfd < 0 && h->dfd >= 0)
        close(h->dfd);
    h->dfd = -1;
    h->roots = NULL;
    if (rc != 0) {
        hf_close(h);
        return rc;
    }
    *out = h;
    return 0;
}

int hf_open_under(const char *roots, const char *dir, int header_only, hf_dir **out, acc_err *err)
{
    return open_dir(roots, -1, dir, header_only, out, err);
}

int hf_open_at(int dfd, const char *dir, int header_only, hf_dir **out, acc_err *err)
{
    return open_dir(dir, dfd, dir, header_only, out, err);
}

int hf_open(const char *dir, int header_only, hf_dir **out, acc_err *err)
{
    return hf_open_under("", dir, header_only, out, err);
}

void hf_close(hf_dir *h)
{
    if (h == NULL)
        return;
    for (int i = 0; i < h->nfiles; i++) {
        st_close(h->files[i]);
        free(h->file_names[i]);
    }
    free(h->files);
    free(h->file_names);
    free(h->e);
    json_decref(h->config);
    free(h);
}

/* ---- config.json */

/* ---- tensors */

int hf_has(const hf_dir *h, const char *name) { return find(h, name) != NULL; }

static int is_float(st_dtype d) { return d == ST_F32 || d == ST_BF16 || d == ST_F16; }

static int ignored(const char *name, const char *const *ignore)
{
    size_t n = strlen(name);
    for (int i = 0; ignore != NULL && ignore[i] != NULL; i++) {
        size_t k = strlen(ignore[i]);
        if (n >= k && !strcmp(name + n - k, ignore[i]))
            return 1;
    }
    return 0;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t used = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < ndim && used < n; d++)
        used += (size_t)snprintf(buf + used, n - used, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (used < n)
        snprintf(buf + used, n - used, "]");
}

int hf_check(const hf_dir *h, const hf_tensor *want, int n, const char *const *ignore,
             acc_err *err)
{
    char *seen = calloc((size_t)h->n + 1, 1);
    if (seen == NULL)
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    st_dtype cfg_dtype = ST_F32;
    json_t *td = json_object_get(h->config, "torch_dtype");
    int rc = 0, check_dtype = td != NULL && !json_is_null(td);
    if (check_dtype) {
        char field[PATH_MAX + 32];
        snprintf(field, sizeof field, "%s/config.json: torch_dtype", h->path);
        if (!json_is_string(td))
            rc = bad(err, "%s must be a string", field);
        else
            rc = hf_dtype_of(json_string_value(td), field, &cfg_dtype, err);
    }
    for (int i = 0; rc == 0 && i < n; i++) {
        const hf_entry *e = find(h, want[i].name);
        if (e == NULL) {
            if (!want[i].optional)
                rc = bad(err, "%s/%s: missing tensor %s", h->path,
                         h->sharded ? INDEX_NAME : SINGLE_NAME, want[i].name);
            continue;
        }
        const char *file = h->file_names[e->file];
        seen[e - h->e] = 1;
        if (want[i].optional) { /* a tensor the layout ties away: it would be ignored */
            rc = bad(err, "%s/%s: tensor %s is not used: the model ties it to the embedding "
                          "(tie_word_embeddings); remove it or set tie_word_embeddings to false",
                     h->path, file, want[i].name);
            continue;
        }
        int same = e->t.ndim == want[i].ndim;
        for (int d = 0; same && d < want[i].ndim; d++)
            same = e->t.shape[d] == want[i].shape[d];
        if (want[i].quant4) { /* packed 4-bit codes */
            char exp[96];
            shape_str(exp, sizeof exp, want[i].ndim, want[i].shape);
            if (!same || e->t.dtype != ST_U8)
                rc = bad(err, "%s/%s: 4-bit tensor %s must be U8 of shape %s (%s)", h->path, file,
                         want[i].name, exp, "transformers' bitsandbytes layout");
            continue;
        }
        if (!same) {
            char got[96], exp[96];
            shape_str(got, sizeof got, e->t.ndim, e->t.shape);
            shape_str(exp, sizeof exp, want[i].ndim, want[i].shape);
            rc = bad(err, "%s/%s: tensor %s has shape %s, config.json implies %s", h->path, file,
                     want[i].name, got, exp);
        } else if (!is_float(e->t.dtype))
            rc = bad(err, "%s/%s: tensor %s has dtype %s (F32, BF16 or F16 expected)", h->path, file,
                     want[i].name, st_dtype_name(e->t.dtype));
        else if (check_dtype && e->t.dtype != cfg_dtype)
            rc = bad(err, "%s/%s: tensor %s has dtype %s, config.json's torch_dtype is %s", h->path,
                     file, want[i].name, st_dtype_name(e->t.dtype), hf_torch_dtype(cfg_dtype));
    }
    for (int i = 0; rc == 0 && i < h->n; i++)
        if (!seen[i] && !ignored(h->e[i].name, ignore))
            rc = bad(err, "%s/%s: unexpected tensor %s (not in the layout config.json describes)",
                     h->path, h->file_names[h->e[i].file], h->e[i].name);
    free(seen);
    return rc;
}

int hf_read(const hf_dir *h, const char *name, float *dst, size_t count, acc_err *err)
{
    const hf_entry *e = find(h, name);
    if (e == NULL)
        return bad(err, "%s: missing tensor %s", h->path, name);
    if (h->header_only)
        return acc_err_set(err, ACC_ESTATE, NULL, "%s opened for its headers only", h->path);
    int rc = st_to_f32(&e->t, dst, count, err);
    if (rc != 0)
        acc_err_prefix(err, "%s/%s", h->path, h->file_names[e->file]);
    st_release(h->files[e->file], &e->t);
    return rc;
}

int hf_tensor_info(const hf_dir *h, const char *name, st_tensor *out)
{
    const hf_entry *e = find(h, name);
    if (e == NULL)
        return ACC_ENOTFOUND;
    *out = e->t;
    return 0;
}

int hf_read_bytes(const hf_dir *h, const char *name, void *dst, size_t nbytes, acc_err *err)
{
    const hf_entry *e = find(h, name);
    if (e == NULL)
        return bad(err, "%s: missing tensor %s", h->path, name);
    if (h->header_only || e->t.data == NULL)
        return acc_err_set(err, ACC_ESTATE, NULL, "%s opened for its headers only", h->path);
    if (e->t.nbytes != nbytes)
        return bad(err, "%s/%s: tensor %s has %zu bytes, %zu expected", h->path,
                   h->file_names[e->file], name, e->t.nbytes, nbytes);
    memcpy(dst, e->t.data, nbytes);
    st_release(h->files[e->file], &e->t);
    return 0;
}

st_dtype hf_dtype(const hf_dir *h)
{
    st_dtype td;
    json_t *t = json_object_get(h->config, "torch_dtype");
    if (h->n == 0 && json_is_string(t) && hf_dtype_of(json_string_value(t), HF_FIELD, &td, NULL) == 0)
        return td; /* config only (HF_OPEN_CONFIG): what config.json says the weights are */
    uint64_t bytes[3] = {0};
    const st_dtype d[3] = {ST_F32, ST_BF16, ST_F16};
    for (int i = 0; i < h->n; i++)
        for (int k = 0; k < 3; k++)
            if (h->e[i].t.dtype == d[k])
                bytes[k] += h->e[i].t.nbytes;
    int best = 0;
    for (int k = 1; k < 3; k++)
        if (bytes[k] > bytes[best])
            best = k;
    return d[best];
}

const char *hf_torch_dtype(st_dtype d)
{
    return d == ST_BF16 ? "bfloat16" : d == ST_F16 ? "float16" : d == ST_F32 ? "float32" : "?";
}

int hf_dtype_of(const char *s, const char *field, st_dtype *out, acc_err *err)
{
    if (!strcmp(s, "float32"))
        *out = ST_F32;
    else if (!strcmp(s, "bfloat16"))
        *out = ST_BF16;
    else if (!strcmp(s, "float16"))
        *out = ST_F16;
    else
        return bad(err, "%s: unsupported dtype '%s' (float32, bfloat16 or float16)", field, s);
    return 0;
}

/* ---- writing */

typedef struct fill_ctx {
    const hf_tensor *t;
    int base;          /* the shard's first tensor */
    hf_fill_fn fill;
    void *ctx;
    float *stage;      /* fp32 values of one tensor */
    st_dtype dtype;
} fill_ctx;

static size_t numel(const hf_tensor *t)
{
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= (size_t)t->shape[d];
    return n;
}

static int fill_shard(void *vctx, int i, void *buf, acc_err *err)
{
    fill_ctx *c = vctx;
    const hf_tensor *t = &c->t[c->base + i];
    int rc = c->fill(c->ctx, c->base + i, c->stage, err);
    if (rc != 0)
        return rc;
    return st_from_f32(c->dtype, c->stage, numel(t), buf, err);
}

/* Bytes of each tensor on disk, overflow-checked. */
static int tensor_bytes(const hf_tensor *t, int n, st_dtype d, uint64_t *bytes, size_t *max_numel,
                        acc_err *err)
{
    *max_numel = 0;
    for (int i = 0; i < n; i++) {
        uint64_t e = 1;
        if (t[i].ndim < 0 || t[i].ndim > 2)
            return acc_err_set(err, ACC_EINVAL, NULL, "tensor %s: bad rank", t[i].name);
        for (int k = 0; k < t[i].ndim; k++)
            if (t[i].shape[k] < 0 || __builtin_mul_overflow(e, (uint64_t)t[i].shape[k], &e))
                return acc_err_set(err, ACC_EINVAL, NULL, "tensor %s: size overflows", t[i].name);
        if (e > SIZE_MAX / sizeof(float) || __builtin_mul_overflow(e, st_dtype_size(d), &bytes[i]))
            return acc_err_set(err, ACC_EINVAL, NULL, "tensor %s: size overflows", t[i].name);
        if (e > *max_numel)
            *max_numel = (size_t)e;
    }
    return 0;
}

static int write_json(const char *path, const json_t *j, acc_err *err)
{
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(15));
    if (text == NULL)
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory writing %s", path);
    size_t len = strlen(text);
    char *withnl = realloc(text, len + 2);
    if (withnl == NULL) {
        free(text);
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory writing %s", path);
    }
    withnl[len] = '\n';
    int rc = fsu_write_atomic(path, withnl, len + 1, err);
    free(withnl);
    return rc;
}

static int write_shards(const char *dir, const hf_tensor *t, int n, const uint64_t *bytes,
                        fill_ctx *fc, uint64_t max, acc_err *err)
{
    int *shard = calloc((size_t)n + 1, sizeof *shard), nshards = n ? 1 : 0;
    st_tensor *st = calloc((size_t)n + 1, sizeof *st);
    json_t *map = json_object();
    if (shard == NULL || st == NULL || map == NULL) {
        free(shard);
        free(st);
        json_decref(map);
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory writing %s", dir);
    }
    uint64_t cur = 0, total = 0; /* as transformers: a new shard when the next tensor would overflow */
    for (int i = 0; i < n; i++) {
        if (cur > 0 && cur + bytes[i] > max) {
            nshards++;
            cur = 0;
        }
        shard[i] = nshards - 1;
        cur += bytes[i];
        total += bytes[i];
    }
    int rc = 0;
    char name[64], path[PATH_MAX + 64];
    st_meta md[] = {{"format", "pt"}};
    for (int s = 0, first = 0; rc == 0 && s < nshards; s++) {
        int cnt = 0;
        while (first + cnt < n && shard[first + cnt] == s) {
            const hf_tensor *h = &t[first + cnt];
            st[cnt] = (st_tensor){.name = h->name, .dtype = fc->dtype, .ndim = h->ndim,
                                  .shape = {h->shape[0], h->shape[1]}, .nbytes = bytes[first + cnt]};
            cnt++;
        }
        if (nshards == 1)
            snprintf(name, sizeof name, "%s", SINGLE_NAME);
        else
            snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, nshards);
        for (int k = 0; k < cnt && rc == 0; k++)
            if (json_object_set_new(map, t[first + k].name, json_string(name)) != 0)
                rc = acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
        snprintf(path, sizeof path, "%s/%s", dir, name);
        fc->base = first;
        if (rc == 0)
            rc = st_write_fill(path, st, cnt, md, 1, fill_shard, fc, err);
        first += cnt;
    }
    if (rc == 0 && nshards > 1) {
        json_t *index = json_pack("{s:{s:I}, s:O}", "metadata", "total_size", (json_int_t)total,
                                  "weight_map", map);
        snprintf(path, sizeof path, "%s/%s", dir, INDEX_NAME);
        rc = index ? write_json(path, index, err) : acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
        json_decref(index);
    }
    json_decref(map);
    free(st);
    free(shard);
    return rc;
}

/* The source's side files, each through safepath.h under the source's
 * roots and copied from that descriptor (never by name: a symlink out of
 * the roots would be copied into the output). */
static int copy_side_files(const char *src, const char *roots, const char *dir, acc_err *err)
{
    char a[PATH_MAX], b[PATH_MAX];
    if (realpath(src, a) != NULL && realpath(dir, b) != NULL && !strcmp(a, b))
        return 0; /* saving over the source: they are there already */
    int sfd;
    int rc = sp_open_dir(roots, src, HF_FIELD, &sfd, NULL, 0, err);
    for (size_t i = 0; rc == 0 && i < sizeof tokenizer_files / sizeof tokenizer_files[0]; i++) {
        char from[PATH_MAX + 64], to[PATH_MAX + 64];
        snprintf(from, sizeof from, "%s/%s", src, tokenizer_files[i]);
        snprintf(to, sizeof to, "%s/%s", dir, tokenizer_files[i]);
        int fd;
        rc = sp_open_in(roots, sfd, src, tokenizer_files[i], HF_FIELD, &fd, err);
        if (rc == ACC_ENOTFOUND) {
            rc = 0;
            continue;
        }
        if (rc == 0) {
            rc = fsu_copy_fd(fd, from, to, err);
            close(fd);
        }
    }
    if (sfd >= 0)
        close(sfd);
    return rc;
}

int hf_copy_tokenizer(const char *src, const char *roots, const char *dir, acc_err *err)
{
    return copy_side_files(src, roots ? roots : "", dir, err);
}

int hf_save_side(const char *dir, const hf_save_opts *o, acc_err *err)
{
    char path[PATH_MAX + 64];
    json_t *c = o->config ? json_deep_copy(o->config) : json_object();
    int rc = 0;
    if (c == NULL || json_object_set_new(c, "torch_dtype", json_string(hf_torch_dtype(o->dtype))) != 0)
        rc = acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (rc == 0)
        rc = write_json(path, c, err);
    json_decref(c);
    if (rc == 0 && o->src_dir != NULL)
        rc = copy_side_files(o->src_dir, o->src_roots ? o->src_roots : "", dir, err);
    if (rc == 0)
        rc = fsu_fsync_dir(dir, err);
    return rc;
}

int hf_save(const char *dir, const hf_tensor *t, int n, hf_fill_fn fill, void *ctx,
            const hf_save_opts *o, acc_err *err)
{
    if (!is_float(o->dtype))
        return acc_err_set(err, ACC_EINVAL, NULL, "cannot save weights as %s", st_dtype_name(o->dtype));
    uint64_t *bytes = calloc((size_t)n + 1, sizeof *bytes);
    if (bytes == NULL)
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    size_t max_numel = 0;
    int rc = tensor_bytes(t, n, o->dtype, bytes, &max_numel, err);
    fill_ctx fc = {.t = t, .fill = fill, .ctx = ctx, .dtype = o->dtype};
    if (rc == 0 && (fc.stage = malloc((max_numel ? max_numel : 1) * sizeof(float))) == NULL)
        rc = acc_err_set(err, ACC_ENOMEM, NULL, "out of memory saving %s", dir);
    if (rc == 0)
        rc = fsu_mkdir_p(dir, 0750, err);
    if (rc == 0)
        rc = write_shards(dir, t, n, bytes, &fc, o->max_shard_bytes ? o->max_shard_bytes : HF_SHARD_DEFAULT,
                          err);
    if (rc == 0)
        rc = hf_save_side(dir, o, err);
    free(fc.stage);
    free(bytes);
    if (rc != 0 && err != NULL && strstr(err->msg, dir) == NULL)
        acc_err_prefix(err, "saving %s", dir);
    return rc;
}
