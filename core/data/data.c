/* data: see data.h. */
#include "data.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data_prep.h"
#include "rng.h"
#include "safepath.h"

typedef struct data_file {
    void *map;
    size_t map_len;
    const uint8_t *bytes;    /* text */
    const uint16_t *tokens;  /* shards */
    uint64_t ntokens;
    uint64_t first_sample;   /* global id of this file's sample 0 */
    uint64_t nsamples;
} data_file;

struct data_source {
    spec_data_format fmt;
    int seq_len;
    size_t nfiles;
    data_file *files;
    uint64_t nsamples, ntokens;
    struct prep_samples *prep; /* the JSONL formats (owned), else NULL */
    uint64_t *win;             /* packed: [nsamples+1], window w = records [win[w], win[w+1]) */
};

/* Open through safepath (under the roots, a regular file, no blocking)
 * and map what was checked. */
static int map_file(const char *roots, const char *path, const char *field, data_file *f, acc_err *err)
{
    int fd;
    int rc = sp_open_file(roots, path, field, &fd, NULL, 0, err);
    if (rc != 0)
        return rc;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return acc_err_set(err, ACC_EINVAL, field, "%s: cannot stat %s: %s", field, path, strerror(errno));
    }
    f->map_len = (size_t)st.st_size;
    if (f->map_len == 0) {
        close(fd);
        return acc_err_set(err, ACC_EINVAL, field, "%s is empty", path);
    }
    f->map = mmap(NULL, f->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        return acc_err_set(err, ACC_EINVAL, field, "cannot map %s: %s", path, strerror(errno));
    }
    return 0;
}

static int check_shard(const char *path, const char *field, int vocab, data_file *f,
                       acc_err *err)
{
    size_t hdr = DATA_HEADER_INTS * sizeof(int32_t);
    if (f->map_len < hdr)
        return acc_err_set(err, ACC_EINVAL, field, "%s: shorter than the %zu-byte header",
                           path, hdr);
    int32_t h[DATA_HEADER_INTS];
    memcpy(h, f->map, hdr);
    /* messages never echo the file's bytes: it may not be a shard at all */
    if (h[0] != DATA_SHARD_MAGIC)
        return acc_err_set(err, ACC_EINVAL, field,
                           "%s: not a token shard (its header lacks the magic number %d)", path,
                           DATA_SHARD_MAGIC);
    if (h[1] != DATA_SHARD_VERSION)
        return acc_err_set(err, ACC_EINVAL, field, "%s: unsupported shard version (want %d)",
                           path, DATA_SHARD_VERSION);
    if (h[2] < 0 || (uint64_t)h[2] * 2 > f->map_len - hdr)
        return acc_err_set(err, ACC_EINVAL, field,
                           "%s: the header's token count does not match the file's %zu tokens", path,
                           (f->map_len - hdr) / 2);
    f->tokens = (const uint16_t *)((const char *)f->map + hdr);
    f->ntokens = (uint64_t)h[2];
    for (uint64_t i = 0; i < f->ntokens; i++)
        if (f->tokens[i] >= vocab)
            return acc_err_set(err, ACC_EINVAL, field,
                               "%s: the token at position %llu is >= vocab_size %d", path,
                               (unsigned long long)i, vocab);
    return 0;
}

static int open_one(data_source *ds, const char *roots, const char *path, const char *field, int vocab,
                    data_file *f, acc_err *err)
{
    int rc = map_file(roots, path, field, f, err);
    if (rc != 0)
        return rc;
    if (ds->fmt == SPEC_DATA_TEXT) {
        f->bytes = f->map;
        f->ntokens = f->map_len;
    } else if ((rc = check_shard(path, field, vocab, f, err)) != 0) {
        return rc;
    }
    f->nsamples = f->ntokens > (uint64_t)ds->seq_len ? (f->ntokens - 1) / (uint64_t)ds->seq_len : 0;
    f->first_sample = ds->nsamples;
    ds->nsamples += f->nsamples;
    ds->ntokens += f->ntokens;
    return 0;
}

static int expand_paths(const char *path, spec_data_format fmt, const char *field, glob_t *g,
                        acc_err *err)
{
    int flags = fmt == SPEC_DATA_TOKENS ? 0 : GLOB_NOCHECK | GLOB_NOMAGIC;
    int rc = glob(path, flags, NULL, g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g->gl_pathc == 0))
        return acc_err_set(err, ACC_EINVAL, field, "no file matches %s", path);
    if (rc != 0)
        return acc_err_set(err, ACC_EINVAL, field, "cannot expand %s", path);
    if (fmt == SPEC_DATA_TEXT && g->gl_pathc != 1)
        return acc_err_set(err, ACC_EINVAL, field, "text data is one file, %s matches %zu",
                           path, g->gl_pathc);
    return 0;
}

int data_open(const char *path, spec_data_format fmt, int seq_len, int vocab_size,
              const char *field, data_source **out, acc_err *err)
{
    return data_open_under("", path, fmt, seq_len, vocab_size, field, out, err);
}

int data_open_under(const char *roots, const char *path, spec_data_format fmt, int seq_len,
                    int vocab_size, const char *field, data_source **out, acc_err *err)
{
    *out = NULL;
    if (path == NULL || path[0] == '\0')
        return acc_err_set(err, ACC_EINVAL, field, "no data path given");
    if (spec_data_is_jsonl(fmt)) /* tokenized first: data_prep.h, data_open_prepared */
        return acc_err_set(err, ACC_EINVAL, field, "a JSONL format is opened through data_prep");
    if (fmt == SPEC_DATA_TEXT && vocab_size < 256)
        return acc_err_set(err, ACC_EINVAL, "model.vocab_size",
                           "text data is byte tokens: vocab_size must be >= 256, got %d",
                           vocab_size);
    if (seq_len < 1)
        return acc_err_set(err, ACC_EINVAL, "model.seq_len", "must be >= 1");
    data_source *ds = calloc(1, sizeof *ds);
    if (ds == NULL)
        return acc_err_set(err, ACC_ENOMEM, field, "out of memory");
    ds->fmt = fmt;
    ds->seq_len = seq_len;
    glob_t g;
    memset(&g, 0, sizeof g);
    int rc = expand_paths(path, fmt, field, &g, err);
    if (rc == 0) {
        ds->files = calloc(g.gl_pathc, sizeof *ds->files);
        if (ds->files == NULL)
            rc = acc_err_set(err, ACC_ENOMEM, field, "out of memory");
    }
    for (size_t i = 0; rc == 0 && i < g.gl_pathc; i++) {
        ds->nfiles++;
        rc = open_one(ds, roots, g.gl_pathv[i], field, vocab_size, &ds->files[i], err);
    }
    if (rc == 0 && ds->nsamples == 0)
        rc = acc_err_set(err, ACC_EINVAL, field,
                         "%s is too short: %llu tokens, a sample needs seq_len+1 = %d", path,
                         (unsigned long long)ds->ntokens, seq_len + 1);
    globfree(&g);
    if (rc != 0) {
        data_close(ds);
        return rc;
    }
    *out = ds;
    return 0;
}

/* Greedy in file order: a window takes the next record while the tokens
 * fit in seq_len+1 (each record does alone: data_prep cut it). */
static int pack_windows(data_source *ds, const char *field, acc_err *err)
{
    const struct prep_samples *p = ds->prep;
    uint64_t cap = (uint64_t)ds->seq_len + 1, n = 0;
    ds->win = malloc((size_t)(p->n + 1) * sizeof *ds->win);
    if (ds->win == NULL)
        return acc_err_set(err, ACC_ENOMEM, field, "out of memory for the packed windows");
    for (uint64_t r = 0; r < p->n;) {
        uint64_t used = 0;
        ds->win[n++] = r;
        while (r < p->n && used + (p->off[r + 1] - p->off[r]) <= cap)
            used += p->off[r + 1] - p->off[r], r++;
        if (used == 0) /* cannot happen after data_prep; never loop forever */
            return acc_err_set(err, ACC_EINTERNAL, field, "record %llu is longer than a window",
                               (unsigned long long)r);
    }
    ds->win[n] = p->n;
    ds->nsamples = n;
    return 0;
}

int data_open_prepared(struct prep_samples *ps, int seq_len, int packing, const char *field,
                       data_source **out, acc_err *err)
{
    *out = NULL;
    data_source *ds = calloc(1, sizeof *ds);
    struct prep_samples *own = malloc(sizeof *own);
    if (ds == NULL || own == NULL || seq_len < 1) {
        free(ds);
        free(own);
        prep_free(ps);
        return seq_len < 1 ? acc_err_set(err, ACC_EINVAL, "model.seq_len", "must be >= 1")
                           : acc_err_set(err, ACC_ENOMEM, field, "out of memory");
    }
    *own = *ps;
    memset(ps, 0, sizeof *ps);
    ds->prep = own;
    ds->seq_len = seq_len;
    ds->nsamples = own->n;
    ds->ntokens = own->ntokens;
    int rc = packing ? pack_windows(ds, field, err) : 0;
    if (rc != 0) {
        data_close(ds);
        return rc;
    }
    *out = ds;
    return 0;
}

int data_is_packed(const data_source *ds)
{
    return ds->win != NULL;
}

void data_close(data_source *ds)
{
    if (ds == NULL)
        return;
    if (ds->prep != NULL) {
        prep_free(ds->prep);
        free(ds->prep);
    }
    free(ds->win);
    for (size_t i = 0; i < ds->nfiles; i++)
        if (ds->files[i].map != NULL)
            munmap(ds->files[i].map, ds->files[i].map_len);
    free(ds->files);
    free(ds);
}

uint64_t data_num_samples(const data_source *ds) { return ds->nsamples; }
uint64_t data_num_tokens(const data_source *ds) { return ds->ntokens; }

/* A prepared sample: its tokens (at most seq_len+1, data_prep cut them),
 * then padding without loss. Packed: the window's records one after the
 * other; target i carries loss when token i+1 is of the same record and
 * its mask says so. */
static void prepared_sample(const data_source *ds, uint64_t id, int *tokens, uint8_t *tmask, int *pos)
{
    const struct prep_samples *p = ds->prep;
    uint64_t r0 = ds->win ? ds->win[id] : id, r1 = ds->win ? ds->win[id + 1] : id + 1;
    uint64_t lo = p->off[r0], n = p->off[r1] - lo;
    int T = ds->seq_len;
    for (int t = 0; t <= T; t++)
        tokens[t] = (uint64_t)t < n ? p->ids[lo + (uint64_t)t] : 0;
    if (tmask != NULL)
        for (int i = 0; i < T; i++)
            tmask[i] = (uint64_t)(i + 1) < n ? p->mask[lo + (uint64_t)i + 1] != 0 : 0;
    if (pos != NULL)
        for (int i = 0; i < T; i++)
            pos[i] = i;
    /* record boundaries: the first token of each record after the first */
    for (uint64_t r = r0; r < r1; r++) {
        uint64_t start = p->off[r] - lo, end = p->off[r + 1] - lo;
        if (tmask != NULL && start > 0)
            tmask[start - 1] = 0; /* the previous record's last token predicts nothing here */
        for (uint64_t k = start; pos != NULL && k < end && k < (uint64_t)T; k++)
            pos[k] = (int)(k - start);
    }
    for (uint64_t k = n; pos != NULL && k < (uint64_t)T; k++)
        pos[k] = (int)(k - n);
}

void data_sample_pos(const data_source *ds, uint64_t id, int *pos)
{
    if (ds->win == NULL) {
        for (int i = 0; i < ds->seq_len; i++)
            pos[i] = i;
        return;
    }
    const struct prep_samples *p = ds->prep;
    uint64_t lo = p->off[ds->win[id]], n = p->off[ds->win[id + 1]] - lo;
    for (uint64_t r = ds->win[id]; r < ds->win[id + 1]; r++) {
        uint64_t start = p->off[r] - lo, end = p->off[r + 1] - lo;
        for (uint64_t k = start; k < end && k < (uint64_t)ds->seq_len; k++)
            pos[k] = (int)(k - start);
    }
    for (uint64_t k = n; k < (uint64_t)ds->seq_len; k++)
        pos[k] = (int)(k - n);
}

void data_sample_masked(const data_source *ds, uint64_t id, int *tokens, uint8_t *tmask)
{
    if (ds->prep != NULL) {
        prepared_sample(ds, id, tokens, tmask, NULL);
        return;
    }
    data_sample(ds, id, tokens);
    memset(tmask, 1, (size_t)ds->seq_len);
}

uint64_t data_sample_inputs(const data_source *ds, uint64_t id)
{
    if (ds->prep == NULL)
        return (uint64_t)ds->seq_len;
    const struct prep_samples *p = ds->prep;
    uint64_t r0 = ds->win ? ds->win[id] : id, r1 = ds->win ? ds->win[id + 1] : id + 1;
    uint64_t n = p->off[r1] - p->off[r0];
    return n < (uint64_t)ds->seq_len ? n : (uint64_t)ds->seq_len;
}

uint64_t data_sample_targets(const data_source *ds, uint64_t id)
{
    if (ds->prep == NULL)
        return (uint64_t)ds->seq_len;
    const struct prep_samples *p = ds->prep;
    uint64_t r0 = ds->win ? ds->win[id] : id, r1 = ds->win ? ds->win[id + 1] : id + 1, n = 0;
    for (uint64_t r = r0; r < r1; r++) {
        uint64_t lo = p->off[r], hi = p->off[r + 1];
        for (uint64_t k = lo + 1; k < hi && k - lo <= (uint64_t)ds->seq_len; k++)
            n += p->mask[k] != 0;
    }
    return n;
}

void data_sample(const data_source *ds, uint64_t id, int *tokens)
{
    if (ds->prep != NULL) {
        prepared_sample(ds, id, tokens, NULL, NULL);
        return;
    }
    /* files are few: a linear scan is fine */
    size_t fi = 0;
    while (fi + 1 < ds->nfiles && id >= ds->files[fi + 1].first_sample)
        fi++;
    const data_file *f = &ds->files[fi];
    uint64_t start = (id - f->first_sample) * (uint64_t)ds->seq_len;
    for (int t = 0; t <= ds->seq_len; t++)
        tokens[t] = f->bytes ? f->bytes[start + (uint64_t)t] : f->tokens[start + (uint64_t)t];
}

int data_order_init(data_order *o, uint64_t nsamples, uint64_t seed, acc_err *err)
{
    memset(o, 0, sizeof *o);
    o->perm = malloc(nsamples * sizeof *o->perm);
    if (o->perm == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory for the order of %llu samples",
                           (unsigned long long)nsamples);
    o->n = nsamples;
    o->seed = seed;
    o->epoch = UINT64_MAX;
    return 0;
}

void data_order_free(data_order *o)
{
    free(o->perm);
    o->perm = NULL;
}

/* Fisher-Yates from a generator keyed by (seed, epoch). */
static void shuffle_epoch(data_order *o, uint64_t epoch)
{
    rng r;
    rng_seed(&r, o->seed, 0x5eed0000ULL + epoch);
    for (uint64_t i = 0; i < o->n; i++)
        o->perm[i] = i;
    for (uint64_t i = o->n; i > 1; i--) {
        uint64_t j = rng_below(&r, i);
        uint64_t tmp = o->perm[i - 1];
        o->perm[i - 1] = o->perm[j];
        o->perm[j] = tmp;
    }
    o->epoch = epoch;
}

uint64_t data_order_sample(data_order *o, uint64_t slot)
{
    uint64_t epoch = slot / o->n;
    if (epoch != o->epoch)
        shuffle_epoch(o, epoch);
    return o->perm[slot % o->n];
}
