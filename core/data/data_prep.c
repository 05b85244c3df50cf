/* data_prep: see data_prep.h. */
#include "data_prep.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "chat.h"
#include "checked.h"
#include "fsutil.h"
#include "parquet.h"
#include "records.h"
#include "safepath.h"
#include "tok.h"

#define PREP_MAGIC 0x3150455250434341ULL /* "ACCPREP1" */
enum { HDR_WORDS = 8 };

/* What a sample is made with: tokenizer, template, the spec's options. */
typedef struct prep_ctx {
    const data_cfg *spec;
    tok_tokenizer *tok;
    tok_files tf;            /* the tokenizer's files as read: parsed and hashed */
    jinja_template *tpl;     /* chat only */
    rec_format rfmt;
    int max_tokens;          /* seq_len + 1 */
} prep_ctx;

/* One sample's ids and mask, reused across lines. */
typedef struct sample_buf {
    tok_ids ids;
    uint8_t *mask;
    size_t mask_cap;
} sample_buf;

static rec_format rec_fmt_of(spec_data_format f)
{
    return f == SPEC_DATA_CHAT                ? REC_CHAT
           : f == SPEC_DATA_PROMPT_COMPLETION ? REC_PROMPT_COMPLETION
           : f == SPEC_DATA_TEXT_LINES        ? REC_TEXT_LINES
                                              : REC_TEXT_JSONL;
}

static void ctx_free(prep_ctx *c)
{
    jinja_free(c->tpl);
    tok_free(c->tok);
    tok_files_free(&c->tf);
    memset(c, 0, sizeof *c);
}

static int ctx_open(const data_cfg *s, prep_ctx *c, acc_err *err)
{
    memset(c, 0, sizeof *c);
    c->spec = s;
    c->rfmt = rec_fmt_of(s->data.format);
    c->max_tokens = s->model.seq_len + 1;
    /* under the data roots, each file through the descriptor checked */
    int rc = tok_files_read(s->data_roots, s->data.tokenizer, "data.tokenizer", &c->tf, err);
    if (rc == 0)
        rc = tok_load_files(&c->tf, s->data.tokenizer, &c->tok, err);
    if (rc != 0) {
        tok_files_free(&c->tf);
        if (err != NULL)
            snprintf(err->field, sizeof err->field, "data.tokenizer");
        return rc;
    }
    if (tok_vocab_size(c->tok) > s->model.vocab_size) {
        rc = acc_err_set(err, ACC_EINVAL, "data.tokenizer",
                         "the tokenizer in %s has %d ids, the model's vocab_size is %d", s->data.tokenizer,
                         tok_vocab_size(c->tok), s->model.vocab_size);
    } else if (c->rfmt == REC_CHAT) {
        rc = chat_template_load(s->data.chat_template, c->tok, "data.chat_template", &c->tpl, err);
    }
    if (rc != 0)
        ctx_free(c);
    return rc;
}

static int mask_fit(sample_buf *b, size_t n, acc_err *err)
{
    if (n <= b->mask_cap && b->mask != NULL) /* never NULL after: memcpy / memset of 0 bytes */
        return 0;
    size_t cap = n < 256 ? 256 : n * 2;
    uint8_t *m = realloc(b->mask, cap);
    if (m == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    b->mask = m;
    b->mask_cap = cap;
    return 0;
}

/* encode(text) with the tokenizer's special tokens, plus EOS when the
 * post-processor did not add it. */
static int encode_plain(const prep_ctx *c, tok_encoder *enc, const char *text, size_t len, int eos,
                        tok_ids *ids, acc_err *err)
{
    int rc = tok_encode(enc, text, len, TOK_ADD_SPECIAL, ids, err);
    int32_t e = tok_get_config(c->tok)->eos_id;
    if (rc == 0 && eos && e >= 0 && (ids->n == 0 || ids->v[ids->n - 1] != e))
        rc = tok_ids_push(ids, e) != 0 ? acc_err_set(err, ACC_ENOMEM, "", "out of memory") : 0;
    return rc;
}

static int encode_chat(const prep_ctx *c, tok_encoder *enc, const rec_record *r, sample_buf *b,
                       acc_err *err)
{
    chat_sample cs;
    memset(&cs, 0, sizeof cs);
    chat_train_on on = c->spec->data.train_on == SPEC_TRAIN_ALL ? CHAT_TRAIN_ALL : CHAT_TRAIN_ASSISTANT;
    int rc = chat_encode_record(c->tpl, c->tok, enc, r, on, &cs, err);
    if (rc == 0)
        rc = mask_fit(b, cs.ids.n, err);
    for (size_t i = 0; rc == 0 && i < cs.ids.n; i++)
        if (tok_ids_push(&b->ids, cs.ids.v[i]) != 0)
            rc = acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    if (rc == 0)
        memcpy(b->mask, cs.mask, cs.ids.n);
    chat_sample_free(&cs);
    return rc;
}

static int encode_prompt_completion(const prep_ctx *c, tok_encoder *enc, const rec_record *r,
                                    sample_buf *b, acc_err *err)
{
    const rec_message *p = &r->msg[0], *q = &r->msg[1];
    size_t n = p->len + q->len;
    char *both = malloc(n + 1);
    if (both == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    memcpy(both, p->content, p->len);
    memcpy(both + p->len, q->content, q->len);
    int rc = encode_plain(c, enc, p->content, p->len, 0, &b->ids, err);
    size_t np = b->ids.n;
    b->ids.n = 0;
    if (rc == 0)
        rc = encode_plain(c, enc, both, n, 1, &b->ids, err);
    free(both);
    if (rc == 0)
        rc = mask_fit(b, b->ids.n, err);
    bool all = c->spec->data.train_on == SPEC_TRAIN_ALL;
    for (size_t i = 0; rc == 0 && i < b->ids.n; i++)
        b->mask[i] = all || i >= np;
    return rc;
}

/* One record's ids and mask into b (b->ids emptied first). */
static int encode_record(const prep_ctx *c, tok_encoder *enc, const rec_record *r, sample_buf *b,
                         acc_err *err)
{
    b->ids.n = 0;
    if (c->rfmt == REC_CHAT)
        return encode_chat(c, enc, r, b, err);
    if (c->rfmt == REC_PROMPT_COMPLETION)
        return encode_prompt_completion(c, enc, r, b, err);
    int rc = encode_plain(c, enc, r->msg[0].content, r->msg[0].len, 1, &b->ids, err);
    if (rc == 0)
        rc = mask_fit(b, b->ids.n, err);
    if (rc == 0)
        memset(b->mask, 1, b->ids.n);
    return rc;
}

/* ---- the file ---------------------------------------------------------------- */

typedef struct mapped {
    void *p;
    size_t len;
} mapped;

/* A data file the spec names: under the roots, a regular file, opened
 * without blocking (safepath.h). */
static int open_data(const data_cfg *s, const char *path, const char *field, int *fd, acc_err *err)
{
    return sp_open_file(s->data_roots, path, field, fd, NULL, 0, err);
}

static int map_fd(int fd, const char *path, const char *field, mapped *m, acc_err *err)
{
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        return acc_err_set(err, ACC_EINVAL, field, "%s is not a regular file", path);
    if (st.st_size == 0)
        return acc_err_set(err, ACC_EINVAL, field, "%s is empty", path);
    m->len = (size_t)st.st_size;
    m->p = mmap(NULL, m->len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m->p == MAP_FAILED) {
        m->p = NULL;
        return acc_err_set(err, ACC_EINVAL, field, "cannot map %s: %s", path, strerror(errno));
    }
    return 0;
}

/* The prepared cache (state_dir, accumd's own file): opened by name. */
static int map_path(const char *path, const char *field, mapped *m, acc_err *err)
{
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return acc_err_set(err, ACC_EINVAL, field, "cannot open %s: %s", path, strerror(errno));
    int rc = map_fd(fd, path, field, m, err);
    close(fd);
    return rc;
}

static int map_data(const data_cfg *s, const char *path, const char *field, mapped *m, acc_err *err)
{
    int fd;
    memset(m, 0, sizeof *m);
    int rc = open_data(s, path, field, &fd, err);
    if (rc != 0)
        return rc;
    rc = map_fd(fd, path, field, m, err);
    close(fd);
    return rc;
}

static void unmap(mapped *m)
{
    if (m->p != NULL)
        munmap(m->p, m->len);
    m->p = NULL;
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* ---- the files: a path, a glob, or a list of them ------------------------------ */

/* data.train / data.val name one file, a glob (wildcards in the file name),
 * or several of those separated by newlines (a JSON list in the spec): the
 * files in the list's order, each glob's matches sorted by name (byte
 * order), duplicates kept. */
typedef struct prep_files {
    char **v;
    size_t n, cap;
} prep_files;

static void files_free(prep_files *f)
{
    for (size_t i = 0; i < f->n; i++)
        free(f->v[i]);
    free(f->v);
    memset(f, 0, sizeof *f);
}

static int files_push(prep_files *f, const char *path)
{
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 8;
        char **v = realloc(f->v, cap * sizeof *v);
        if (v == NULL)
            return -1;
        f->v = v;
        f->cap = cap;
    }
    if ((f->v[f->n] = strdup(path)) == NULL)
        return -1;
    f->n++;
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int expand_one(const char *pat, const char *field, prep_files *f, acc_err *err)
{
    if (strpbrk(pat, "*?[") == NULL)
        return files_push(f, pat) ? acc_err_set(err, ACC_ENOMEM, field, "out of memory") : 0;
    glob_t g;
    memset(&g, 0, sizeof g);
    int rc = glob(pat, GLOB_NOSORT, NULL, &g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
        globfree(&g);
        return acc_err_set(err, ACC_EINVAL, field, "no file matches %s", pat);
    }
    if (rc != 0) {
        globfree(&g);
        return acc_err_set(err, ACC_EINVAL, field, "cannot expand %s", pat);
    }
    qsort(g.gl_pathv, g.gl_pathc, sizeof *g.gl_pathv, by_name);
    for (size_t i = 0; rc == 0 && i < g.gl_pathc; i++)
        if (files_push(f, g.gl_pathv[i]) != 0)
            rc = acc_err_set(err, ACC_ENOMEM, field, "out of memory");
    globfree(&g);
    return rc;
}

static int expand_files(const char *spec_path, const char *field, prep_files *f, acc_err *err)
{
    memset(f, 0, sizeof *f);
    char *list = strdup(spec_path), *save = NULL;
    if (list == NULL)
        return acc_err_set(err, ACC_ENOMEM, field, "out of memory");
    int rc = 0;
    for (char *p = strtok_r(list, "\n", &save); rc == 0 && p != NULL; p = strtok_r(NULL, "\n", &save))
        rc = expand_one(p, field, f, err);
    free(list);
    if (rc == 0 && f->n == 0)
        rc = acc_err_set(err, ACC_EINVAL, field, "no data file given");
    if (rc != 0)
        files_free(f);
    return rc;
}

/* ---- Parquet rows as the records' JSON lines -------------------------------------- */

/* the columns a record reads (records.h); the rest of a row is never read */
static const char *const record_columns[] = {"messages", "conversations", "prompt", "completion", "text", NULL};

static int open_parquet(const data_cfg *s, const char *path, const char *field, pq_reader **r, acc_err *err)
{
    int fd;
    int rc = open_data(s, path, field, &fd, err);
    if (rc != 0)
        return rc;
    rc = pq_open(fd, base_name(path), field, r, err);
    if (rc != 0)
        return rc;
    /* a record's column of a shape the reader leaves out: say so, not "missing" */
    for (int i = 0; record_columns[i] != NULL; i++) {
        const char *why = pq_column_unsupported(*r, record_columns[i]);
        if (why != NULL) {
            rc = acc_err_set(err, ACC_EINVAL, field, "%s: column %s: %s is not read", base_name(path),
                             record_columns[i], why);
            pq_close(*r);
            *r = NULL;
            return rc;
        }
    }
    pq_select(*r, record_columns);
    return 0;
}

static bool is_parquet_file(const data_cfg *s, const char *path, const char *field)
{
    int fd;
    if (open_data(s, path, field, &fd, NULL) != 0)
        return false;
    bool yes = pq_fd_is_parquet(fd);
    close(fd);
    return yes;
}

/* Rows appended to *buf as JSON lines until it holds `limit` bytes or the
 * rows end (*end set). */
static int parquet_lines(pq_reader *r, size_t limit, char **buf, size_t *len, size_t *cap, bool *end, acc_err *err)
{
    *len = 0;
    *end = false;
    while (*len < limit) {
        json_t *row;
        int rc = pq_next(r, &row, err);
        if (rc == ACC_ENOTFOUND) {
            *end = true;
            return 0;
        }
        if (rc != 0)
            return rc;
        char *line = json_dumps(row, JSON_COMPACT);
        json_decref(row);
        if (line == NULL)
            return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
        size_t n = strlen(line);
        if (*len + n + 1 > *cap) {
            size_t c = (*len + n + 1) * 2;
            char *b = realloc(*buf, c);
            if (b == NULL) {
                free(line);
                return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
            }
            *buf = b;
            *cap = c;
        }
        memcpy(*buf + *len, line, n);
        (*buf)[*len + n] = '\n';
        *len += n + 1;
        free(line);
    }
    return 0;
}

/* ---- the format, when the spec does not name it ------------------------------------ */

static int format_of_keys(bool messages, bool prompt, bool completion, bool text, spec_data_format *out)
{
    if (messages)
        *out = SPEC_DATA_CHAT;
    else if (prompt && completion)
        *out = SPEC_DATA_PROMPT_COMPLETION;
    else if (text)
        *out = SPEC_DATA_TEXT_JSONL;
    else
        return -1;
    return 0;
}

bool prep_has_tokenizer(const char *roots, const char *dir)
{
    char path[PATH_MAX + 32];
    int fd;
    if (dir == NULL || dir[0] == '\0' || (size_t)snprintf(path, sizeof path, "%s/tokenizer.json", dir) >= sizeof path ||
        sp_open_file(roots, path, "data.tokenizer", &fd, NULL, 0, NULL) != 0)
        return false;
    close(fd);
    return true;
}

int prep_infer_format(const char *roots, const char *train, bool tokenizer, spec_data_format *out, acc_err *err)
{
    const char *field = "data.format";
    prep_files f;
    data_cfg s;
    memset(&s, 0, sizeof s);
    snprintf(s.data_roots, sizeof s.data_roots, "%s", roots);
    int rc = expand_files(train, "data.train", &f, err);
    if (rc != 0)
        return rc;
    const char *path = f.v[0];
    char why[256] = "";
    if (is_parquet_file(&s, path, "data.train")) {
        pq_reader *r;
        if ((rc = open_parquet(&s, path, "data.train", &r, err)) == 0) {
            if (format_of_keys(pq_has_column(r, "messages") || pq_has_column(r, "conversations"),
                               pq_has_column(r, "prompt"), pq_has_column(r, "completion"), pq_has_column(r, "text"),
                               out) != 0)
                snprintf(why, sizeof why, "%s has no messages, conversations, prompt/completion or text column",
                         base_name(path));
            pq_close(r);
        }
    } else {
        int fd;
        if ((rc = open_data(&s, path, "data.train", &fd, err)) == 0) {
            char buf[65536];
            ssize_t got = pread(fd, buf, sizeof buf - 1, 0);
            close(fd);
            buf[got > 0 ? got : 0] = '\0';
            const char *line = buf + strspn(buf, " \t\r\n");
            json_t *o = json_loadb(line, strcspn(line, "\n"), 0, NULL);
            if (json_is_object(o)) {
                if (format_of_keys(json_object_get(o, "messages") || json_object_get(o, "conversations"),
                                   json_object_get(o, "prompt"), json_object_get(o, "completion"),
                                   json_object_get(o, "text"), out) != 0)
                    snprintf(why, sizeof why,
                             "the first record of %s has no messages, conversations, prompt/completion or text key",
                             base_name(path));
            } else {
                /* plain text: bytes for a byte-level model; a model with a
                 * tokenizer never trains on raw bytes */
                *out = tokenizer ? SPEC_DATA_TEXT_LINES : SPEC_DATA_TEXT;
            }
            json_decref(o);
        }
    }
    if (rc == 0 && why[0] != '\0')
        rc = acc_err_set(err, ACC_EINVAL, field, "cannot tell the format: %s; give data.format", why);
    files_free(&f);
    return rc;
}

/* ---- submit-time check ------------------------------------------------------- */

/* The records of [buf, buf+len) ("name:N", N the line or Parquet row);
 * `full`: the buffer holds the whole file. */
static int check_lines(const prep_ctx *c, tok_encoder *enc, const char *buf, size_t len, int full, const char *path,
                       const char *field, acc_err *err)
{
    int rc = 0, seen = 0, rendered = 0;
    size_t at = 0;
    sample_buf sb;
    memset(&sb, 0, sizeof sb);
    for (uint64_t line = 1; rc == 0 && at < len && line <= PREP_CHECK_LINES; line++) {
        const char *nl = memchr(buf + at, '\n', len - at);
        if (nl == NULL && !full)
            break; /* cut by the bound: the rest is checked while preparing */
        size_t end = nl ? (size_t)(nl - buf) : len;
        char where[PATH_MAX + 32];
        snprintf(where, sizeof where, "%s:%llu", base_name(path), (unsigned long long)line);
        rec_record r;
        int pr = rec_parse(c->rfmt, buf + at, end - at, where, field, &r, err);
        if (pr == 0) {
            seen++;
            if (rendered++ < PREP_CHECK_RENDERS && (rc = encode_record(c, enc, &r, &sb, err)) != 0)
                acc_err_prefix(err, "%s", where);
            rec_clear(&r);
        } else if (pr != ACC_ENOTFOUND) {
            rc = pr;
        }
        at = end + 1;
    }
    if (rc == 0 && seen == 0 && full)
        rc = acc_err_set(err, ACC_EINVAL, field, "%s holds no samples (%s)", path,
                         len == 0 ? "no rows" : "only blank lines");
    if (rc != 0 && err != NULL)
        snprintf(err->field, sizeof err->field, "%s", field);
    tok_ids_free(&sb.ids);
    free(sb.mask);
    return rc;
}

/* The first rows of a Parquet file, as records (bounded as JSONL's). */
static int check_parquet(const prep_ctx *c, tok_encoder *enc, const char *path, const char *field, acc_err *err)
{
    pq_reader *r;
    int rc = open_parquet(c->spec, path, field, &r, err);
    if (rc != 0)
        return rc;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    bool end;
    rc = parquet_lines(r, PREP_CHECK_BYTES, &buf, &len, &cap, &end, err);
    pq_close(r);
    if (rc != 0 && err != NULL)
        snprintf(err->field, sizeof err->field, "%s", field);
    if (rc == 0)
        rc = check_lines(c, enc, buf ? buf : "", len, end, path, field, err);
    free(buf);
    return rc;
}

static int check_file(const prep_ctx *c, tok_encoder *enc, const char *path, const char *field,
                      acc_err *err)
{
    if (is_parquet_file(c->spec, path, field))
        return check_parquet(c, enc, path, field, err);
    int fd;
    int rc0 = open_data(c->spec, path, field, &fd, err);
    if (rc0 != 0)
        return rc0;
    char *buf = malloc(PREP_CHECK_BYTES);
    ssize_t got = buf ? pread(fd, buf, PREP_CHECK_BYTES, 0) : -1;
    struct stat st;
    int full = fstat(fd, &st) == 0 && (size_t)st.st_size <= PREP_CHECK_BYTES;
    close(fd);
    if (got < 0) {
        free(buf);
        return acc_err_set(err, buf ? ACC_EINVAL : ACC_ENOMEM, field, "cannot read %s", path);
    }
    int rc = check_lines(c, enc, buf, (size_t)got, full, path, field, err);
    free(buf);
    return rc;
}

/* Every file of the list opened under the roots (a Parquet file's footer
 * read); the first one's records checked. */
static int check_files(const prep_ctx *c, tok_encoder *enc, const char *spec_path, const char *field, acc_err *err)
{
    prep_files f;
    int rc = expand_files(spec_path, field, &f, err);
    for (size_t i = 0; rc == 0 && i < f.n; i++) {
        if (i == 0) {
            rc = check_file(c, enc, f.v[i], field, err);
        } else if (is_parquet_file(c->spec, f.v[i], field)) {
            pq_reader *r;
            if ((rc = open_parquet(c->spec, f.v[i], field, &r, err)) == 0)
                pq_close(r);
        } else {
            int fd;
            if ((rc = open_data(c->spec, f.v[i], field, &fd, err)) == 0)
                close(fd);
        }
    }
    files_free(&f);
    return rc;
}

int prep_validate(const data_cfg *s, acc_err *err)
{
    prep_ctx c;
    int rc = ctx_open(s, &c, err);
    if (rc != 0)
        return rc;
    tok_encoder *enc = NULL;
    rc = tok_encoder_new(c.tok, &enc, err);
    if (rc == 0) /* one time bound for all of the check's renders */
        tok_encoder_begin(enc);
    if (rc == 0)
        rc = check_files(&c, enc, s->data.train, "data.train", err);
    if (rc == 0 && s->data.val[0] != '\0')
        rc = check_files(&c, enc, s->data.val, "data.val", err);
    tok_encoder_free(enc);
    ctx_free(&c);
    return rc;
}

/* ---- the cache key --------------------------------------------------------- */

/* every file's bytes, in order, read through its checked descriptor */
static int hash_files(EVP_MD_CTX *h, const data_cfg *s, const prep_files *f, const char *field, acc_err *err)
{
    enum { BLOCK = 1 << 20 };
    char *buf = malloc(BLOCK);
    if (buf == NULL)
        return acc_err_set(err, ACC_ENOMEM, field, "out of memory");
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < f->n; i++) {
        int fd;
        if ((rc = open_data(s, f->v[i], field, &fd, err)) != 0)
            break;
        uint64_t n = 0;
        for (ssize_t k; (k = read(fd, buf, BLOCK)) != 0; n += (uint64_t)k) {
            if (k < 0 && errno == EINTR)
                continue;
            if (k < 0 || EVP_DigestUpdate(h, buf, (size_t)k) != 1) {
                rc = acc_err_set(err, ACC_EINVAL, field, "cannot read %s", f->v[i]);
                break;
            }
        }
        close(fd);
        /* the file's length: [a][bc] and [ab][c] differ */
        if (rc == 0 && EVP_DigestUpdate(h, &n, sizeof n) != 1)
            rc = acc_err_set(err, ACC_EIO, field, "cannot hash %s", f->v[i]);
    }
    free(buf);
    return rc;
}

static int cache_key(const prep_ctx *c, const prep_files *files, const char *field, char out[65], acc_err *err)
{
    const data_cfg *s = c->spec;
    char opts[512];
    const char *tsrc = "";
    if (c->rfmt == REC_CHAT)
        tsrc = !strcmp(s->data.chat_template, "auto") ? tok_get_config(c->tok)->chat_template
                                                       : chat_named_template(s->data.chat_template);
    int n = snprintf(opts, sizeof opts, "accumd-prep %d|format %d|seq_len %d|packing %d|train_on %d|overlong %d|"
                                        "template %s|",
                     PREP_VERSION, (int)s->data.format, s->model.seq_len, (int)s->data.packing,
                     (int)s->data.train_on, (int)s->data.overlong, s->data.chat_template);
    EVP_MD_CTX *h = EVP_MD_CTX_new();
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    int ok = h != NULL && EVP_DigestInit_ex(h, EVP_sha256(), NULL) == 1 &&
             EVP_DigestUpdate(h, opts, (size_t)n) == 1 &&
             EVP_DigestUpdate(h, tsrc ? tsrc : "", tsrc ? strlen(tsrc) + 1 : 1) == 1 &&
             /* the tokenizer's bytes as parsed, not the files read again */
             EVP_DigestUpdate(h, c->tf.json, c->tf.json_len) == 1 &&
             (c->tf.config != NULL ? EVP_DigestUpdate(h, c->tf.config, c->tf.config_len)
                                   : EVP_DigestUpdate(h, "-", 1)) == 1;
    int rc = ok ? hash_files(h, s, files, field, err) : 0;
    ok = ok && rc == 0 && EVP_DigestFinal_ex(h, md, &mdlen) == 1;
    EVP_MD_CTX_free(h);
    if (rc != 0)
        return rc;
    if (!ok)
        return acc_err_set(err, ACC_EIO, "data.tokenizer", "cannot hash the tokenizer files in %s",
                           s->data.tokenizer);
    for (unsigned i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
    return 0;
}

/* ---- the cache file: header, off[n+1], ids[ntokens], mask[ntokens] ------------ */

static int cache_path(const data_cfg *s, const char *key, char *dir, size_t dn, char *file, size_t fn)
{
    if ((size_t)snprintf(dir, dn, "%s/%s", s->data.cache_dir, key) >= dn ||
        (size_t)snprintf(file, fn, "%s/samples.bin", dir) >= fn)
        return -1;
    return 0;
}

static void header_of(const prep_samples *p, uint64_t h[HDR_WORDS])
{
    h[0] = PREP_MAGIC;
    h[1] = p->n;
    h[2] = p->ntokens;
    h[3] = p->lines;
    h[4] = p->truncated;
    h[5] = p->dropped;
    h[6] = p->no_target;
    h[7] = PREP_VERSION;
}

/* The cached samples, when a complete file of the right size is there. */
static int cache_read(const char *file, prep_samples *p)
{
    mapped m;
    if (map_path(file, "", &m, NULL) != 0)
        return -1;
    uint64_t h[HDR_WORDS];
    uint64_t need = 0, t1, t2;
    if (m.len < sizeof h)
        goto bad;
    memcpy(h, m.p, sizeof h);
    if (h[0] != PREP_MAGIC || h[7] != PREP_VERSION || acc_mul_u64(h[1] + 1, 8, &t1) ||
        acc_mul_u64(h[2], 5, &t2) || acc_add_u64(t1, t2, &need) || acc_add_u64(need, sizeof h, &need) ||
        need != m.len)
        goto bad;
    p->n = h[1];
    p->ntokens = h[2];
    p->lines = h[3];
    p->truncated = h[4];
    p->dropped = h[5];
    p->no_target = h[6];
    p->off = (const uint64_t *)((const char *)m.p + sizeof h);
    p->ids = (const int32_t *)(p->off + p->n + 1);
    p->mask = (const uint8_t *)(p->ids + p->ntokens);
    if (p->off[p->n] != p->ntokens)
        goto bad;
    p->map = m.p;
    p->map_len = m.len;
    p->from_cache = 1;
    return 0;
bad:
    unmap(&m);
    return -1;
}

/* Best effort: a job whose cache cannot be written still trains. */
static void cache_write(const data_cfg *s, const prep_samples *p)
{
    char dir[PATH_MAX], file[PATH_MAX + 16];
    acc_err e = {0};
    if (s->data.cache_dir[0] == '\0' || cache_path(s, p->key, dir, sizeof dir, file, sizeof file) != 0 ||
        fsu_mkdir_p(dir, 0750, &e) != 0)
        return;
    uint64_t h[HDR_WORDS];
    header_of(p, h);
    fsu_chunk c[4] = {{h, sizeof h},
                      {p->off, (size_t)(p->n + 1) * sizeof *p->off},
                      {p->ids, (size_t)p->ntokens * sizeof *p->ids},
                      {p->mask, (size_t)p->ntokens}};
    (void)fsu_write_atomic_chunks(file, c, 4, &e);
}

/* ---- tokenizing on all cores ---------------------------------------------- */

typedef struct worker {
    const prep_ctx *c;
    const prep_opts *o;
    const char *data;
    size_t lo, hi;         /* byte range, whole lines */
    pthread_t th;
    int started;
    /* out */
    tok_ids ids;
    uint8_t *mask;
    size_t mask_n, mask_cap;
    uint64_t *lens;
    size_t nlens, lens_cap;
    uint64_t lines, truncated, dropped, no_target;
    _Atomic uint64_t done_bytes;
    atomic_int finished;   /* set last: rc, err and the outputs are final */
    int rc;
    uint64_t err_line;     /* line within the range (1-based) */
    acc_err err;
} worker;

static int worker_keep(worker *w, const sample_buf *b)
{
    size_t n = b->ids.n;
    size_t lim = (size_t)w->c->max_tokens;
    if (n > lim) {
        if (w->c->spec->data.overlong == SPEC_OVERLONG_DROP) {
            w->dropped++;
            return 0;
        }
        w->truncated++;
        n = lim;
    }
    size_t targets = 0;
    for (size_t i = 1; i < n; i++)
        targets += b->mask[i] != 0;
    if (targets == 0) {
        w->no_target++;
        return 0;
    }
    if (w->mask_n + n > w->mask_cap) {
        size_t cap = (w->mask_n + n) * 2;
        uint8_t *m = realloc(w->mask, cap);
        if (m == NULL)
            return acc_err_set(&w->err, ACC_ENOMEM, "", "out of memory");
        w->mask = m;
        w->mask_cap = cap;
    }
    if (w->nlens == w->lens_cap) {
        size_t cap = w->lens_cap ? w->lens_cap * 2 : 1024;
        uint64_t *l = realloc(w->lens, cap * sizeof *l);
        if (l == NULL)
            return acc_err_set(&w->err, ACC_ENOMEM, "", "out of memory");
        w->lens = l;
        w->lens_cap = cap;
    }
    for (size_t i = 0; i < n; i++)
        if (tok_ids_push(&w->ids, b->ids.v[i]) != 0)
            return acc_err_set(&w->err, ACC_ENOMEM, "", "out of memory");
    memcpy(w->mask + w->mask_n, b->mask, n);
    w->mask_n += n;
    w->lens[w->nlens++] = n;
    return 0;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    tok_encoder *enc = NULL;
    sample_buf sb;
    memset(&sb, 0, sizeof sb);
    w->rc = tok_encoder_new(w->c->tok, &enc, &w->err);
    size_t at = w->lo;
    for (uint64_t line = 1; w->rc == 0 && at < w->hi; line++) {
        if (w->o->cancel != NULL && atomic_load(w->o->cancel)) {
            w->rc = acc_err_set(&w->err, ACC_ECANCELLED, "", "cancelled");
            break;
        }
        const char *nl = memchr(w->data + at, '\n', w->hi - at);
        size_t end = nl ? (size_t)(nl - w->data) : w->hi;
        rec_record r;
        /* the place is filled in by the caller, who knows the line number */
        int pr = rec_parse(w->c->rfmt, w->data + at, end - at, "", w->o->field, &r, &w->err);
        if (pr == 0) {
            w->lines++;
            w->rc = encode_record(w->c, enc, &r, &sb, &w->err);
            if (w->rc == 0)
                w->rc = worker_keep(w, &sb);
            rec_clear(&r);
        } else if (pr != ACC_ENOTFOUND) {
            w->rc = pr;
        }
        if (w->rc != 0)
            w->err_line = line;
        at = end + 1;
        atomic_store(&w->done_bytes, (at > w->hi ? w->hi : at) - w->lo);
    }
    tok_ids_free(&sb.ids);
    free(sb.mask);
    tok_encoder_free(enc);
    atomic_store(&w->finished, 1);
    return NULL;
}

static void worker_free(worker *w)
{
    tok_ids_free(&w->ids);
    free(w->mask);
    free(w->lens);
}

/* Cut [0, len) into n ranges of whole lines. */
static void cut_ranges(const char *data, size_t len, worker *w, int n)
{
    size_t lo = 0;
    for (int i = 0; i < n; i++) {
        size_t hi = i == n - 1 ? len : len / (size_t)n * (size_t)(i + 1);
        if (hi < lo)
            hi = lo;
        if (hi < len && hi > 0) {
            const char *nl = memchr(data + hi - 1, '\n', len - (hi - 1));
            hi = nl ? (size_t)(nl - data) + 1 : len;
        }
        w[i].lo = lo;
        w[i].hi = hi;
        lo = hi;
    }
}

static uint64_t count_lines(const char *data, size_t upto)
{
    uint64_t n = 0;
    for (const char *p = data, *e = data + upto; (p = memchr(p, '\n', (size_t)(e - p))) != NULL; p++)
        n++;
    return n;
}

/* The failure of the first failing worker, with its file:line. */
static int worker_failure(const prep_opts *o, const char *name, uint64_t line0, const char *data, worker *w, int n,
                          acc_err *err)
{
    for (int i = 0; i < n; i++) {
        if (w[i].rc == 0)
            continue;
        uint64_t line = line0 + count_lines(data, w[i].lo) + w[i].err_line;
        char msg[sizeof w[i].err.msg];
        /* rec_parse wrote "<empty where>: ..."; other failures their message */
        const char *m = w[i].err.msg;
        if (m[0] == ':' && m[1] == ' ')
            m += 2;
        snprintf(msg, sizeof msg, "%s", m);
        if (w[i].rc == ACC_ECANCELLED || w[i].rc == ACC_ENOMEM)
            return acc_err_set(err, w[i].rc, "", "%s", msg);
        return acc_err_set(err, w[i].rc, o->field, "%s:%llu: %s", base_name(name), (unsigned long long)line, msg);
    }
    return 0;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {0, (long)ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* Concatenate the workers' samples in file order. */
static int gather(worker *w, int n, prep_samples *p, acc_err *err)
{
    uint64_t ns = 0, nt = 0;
    for (int i = 0; i < n; i++) {
        ns += w[i].nlens;
        nt += w[i].ids.n;
        p->lines += w[i].lines;
        p->truncated += w[i].truncated;
        p->dropped += w[i].dropped;
        p->no_target += w[i].no_target;
    }
    uint64_t *off = malloc((size_t)(ns + 1) * sizeof *off);
    int32_t *ids = malloc((size_t)(nt ? nt : 1) * sizeof *ids);
    uint8_t *mask = malloc((size_t)(nt ? nt : 1));
    if (!off || !ids || !mask) {
        free(off);
        free(ids);
        free(mask);
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory for %llu prepared tokens", (unsigned long long)nt);
    }
    uint64_t s = 0, t = 0;
    off[0] = 0;
    for (int i = 0; i < n; i++) {
        if (w[i].ids.n > 0) { /* an empty range has no arrays */
            memcpy(ids + t, w[i].ids.v, w[i].ids.n * sizeof *ids);
            memcpy(mask + t, w[i].mask, w[i].ids.n);
        }
        for (size_t k = 0; k < w[i].nlens; k++) {
            off[s + 1] = off[s] + w[i].lens[k];
            s++;
        }
        t += w[i].ids.n;
    }
    p->n = ns;
    p->ntokens = nt;
    p->off = off;
    p->ids = ids;
    p->mask = mask;
    p->heap[0] = off;
    p->heap[1] = ids;
    p->heap[2] = mask;
    return 0;
}

/* Progress over all files: this chunk's bytes stand for `span` of `total`
 * from `base` on. */
typedef struct prep_prog {
    uint64_t base, span, total;
} prep_prog;

static void report(const prep_opts *o, const prep_prog *g, uint64_t done, uint64_t len)
{
    if (o->progress)
        o->progress(o->ctx, "tokenize", g->base + (len ? (uint64_t)((double)g->span * ((double)done / (double)len)) : 0),
                    g->total);
}

/* One chunk of JSON lines ("name:line0+N" in messages) tokenized on all
 * threads into p. */
static int tokenize_all(const prep_ctx *c, const prep_opts *o, const char *name, uint64_t line0, const prep_prog *g,
                        const mapped *m, prep_samples *p, acc_err *err)
{
    int n = o->threads >= 1 ? o->threads : 1;
    if ((size_t)n > m->len)
        n = 1;
    worker *w = calloc((size_t)n, sizeof *w);
    if (w == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    cut_ranges(m->p, m->len, w, n);
    int rc = 0;
    report(o, g, 0, m->len);
    for (int i = 0; i < n; i++) {
        w[i].c = c;
        w[i].o = o;
        w[i].data = m->p;
        if (pthread_create(&w[i].th, NULL, worker_main, &w[i]) != 0) {
            rc = acc_err_set(err, ACC_ENOMEM, "", "cannot start a tokenizer thread");
            break;
        }
        w[i].started = 1;
    }
    /* report while the workers run (they stop on cancel or their first error) */
    for (int live = 1; live && rc == 0;) {
        sleep_ms(100);
        uint64_t done = 0;
        live = 0;
        for (int i = 0; i < n; i++) {
            done += atomic_load(&w[i].done_bytes);
            live |= w[i].started && !atomic_load(&w[i].finished);
        }
        if (live)
            report(o, g, done, m->len);
    }
    for (int i = 0; i < n; i++)
        if (w[i].started)
            pthread_join(w[i].th, NULL);
    if (rc == 0)
        rc = worker_failure(o, name, line0, m->p, w, n, err);
    if (rc == 0)
        rc = gather(w, n, p, err);
    for (int i = 0; i < n; i++)
        worker_free(&w[i]);
    free(w);
    if (rc == 0)
        report(o, g, m->len, m->len);
    return rc;
}

/* src's samples after dst's (dst's arrays grown; src's freed) */
static int samples_append(prep_samples *dst, prep_samples *src, acc_err *err)
{
    uint64_t n = dst->n + src->n, nt = dst->ntokens + src->ntokens;
    uint64_t *off = realloc(dst->heap[0], (size_t)(n + 1) * sizeof *off);
    if (off != NULL)
        dst->heap[0] = off;
    int32_t *ids = off ? realloc(dst->heap[1], (size_t)(nt ? nt : 1) * sizeof *ids) : NULL;
    if (ids != NULL)
        dst->heap[1] = ids;
    uint8_t *mask = ids ? realloc(dst->heap[2], (size_t)(nt ? nt : 1)) : NULL;
    if (mask != NULL)
        dst->heap[2] = mask;
    if (mask == NULL) {
        prep_free(src);
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory for %llu prepared tokens", (unsigned long long)nt);
    }
    if (dst->n == 0)
        off[0] = 0;
    for (uint64_t i = 0; i < src->n; i++)
        off[dst->n + i + 1] = dst->ntokens + src->off[i + 1];
    if (src->ntokens > 0) {
        memcpy(ids + dst->ntokens, src->ids, (size_t)src->ntokens * sizeof *ids);
        memcpy(mask + dst->ntokens, src->mask, (size_t)src->ntokens);
    }
    dst->off = off;
    dst->ids = ids;
    dst->mask = mask;
    dst->n = n;
    dst->ntokens = nt;
    dst->lines += src->lines;
    dst->truncated += src->truncated;
    dst->dropped += src->dropped;
    dst->no_target += src->no_target;
    prep_free(src);
    return 0;
}

/* the Parquet rows are tokenized in chunks of this many bytes of JSON */
#define PREP_PARQUET_CHUNK ((size_t)64 << 20)

static int tokenize_parquet(const prep_ctx *c, const prep_opts *o, const char *path, prep_prog g, uint64_t fsize,
                            prep_samples *out, acc_err *err)
{
    pq_reader *r;
    int rc = open_parquet(c->spec, path, o->field, &r, err);
    char *buf = NULL;
    size_t len = 0, cap = 0;
    bool end = false;
    uint64_t base = g.base;
    while (rc == 0 && !end) {
        int64_t before = pq_rows_read(r);
        if ((rc = parquet_lines(r, PREP_PARQUET_CHUNK, &buf, &len, &cap, &end, err)) != 0) {
            if (err != NULL && err->field[0] == '\0')
                snprintf(err->field, sizeof err->field, "%s", o->field);
            break;
        }
        if (len == 0)
            break;
        int64_t nrows = pq_num_rows(r) > 0 ? pq_num_rows(r) : 1;
        prep_prog cg = {base + fsize * (uint64_t)before / (uint64_t)nrows,
                        fsize * (uint64_t)(pq_rows_read(r) - before) / (uint64_t)nrows, g.total};
        mapped m = {buf, len};
        prep_samples part;
        memset(&part, 0, sizeof part);
        if ((rc = tokenize_all(c, o, path, (uint64_t)before, &cg, &m, &part, err)) == 0)
            rc = samples_append(out, &part, err);
    }
    free(buf);
    pq_close(r);
    return rc;
}

/* Every file of the list, in order, into out. */
static int tokenize_files(const prep_ctx *c, const prep_opts *o, const prep_files *f, prep_samples *out, acc_err *err)
{
    uint64_t total = 0, *size = calloc(f->n + 1, sizeof *size);
    if (size == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < f->n; i++) {
        int fd;
        struct stat st;
        if ((rc = open_data(o->spec, f->v[i], o->field, &fd, err)) == 0) {
            size[i] = fstat(fd, &st) == 0 ? (uint64_t)st.st_size : 0;
            total += size[i];
            close(fd);
        }
    }
    uint64_t base = 0;
    for (size_t i = 0; rc == 0 && i < f->n; base += size[i], i++) {
        prep_prog g = {base, size[i], total};
        if (is_parquet_file(o->spec, f->v[i], o->field)) {
            rc = tokenize_parquet(c, o, f->v[i], g, size[i], out, err);
            continue;
        }
        mapped m;
        prep_samples part;
        memset(&part, 0, sizeof part);
        if ((rc = map_data(o->spec, f->v[i], o->field, &m, err)) != 0)
            break;
        if ((rc = tokenize_all(c, o, f->v[i], 0, &g, &m, &part, err)) == 0)
            rc = samples_append(out, &part, err);
        unmap(&m);
    }
    free(size);
    return rc;
}

int prep_load(const prep_opts *o, prep_samples *out, acc_err *err)
{
    memset(out, 0, sizeof *out);
    prep_ctx c;
    prep_files f;
    int rc = ctx_open(o->spec, &c, err);
    if (rc != 0)
        return rc;
    if ((rc = expand_files(o->path, o->field, &f, err)) != 0) {
        ctx_free(&c);
        return rc;
    }
    if ((rc = cache_key(&c, &f, o->field, out->key, err)) == 0) {
        char dir[PATH_MAX], file[PATH_MAX + 16];
        if (o->spec->data.cache_dir[0] != '\0' &&
            cache_path(o->spec, out->key, dir, sizeof dir, file, sizeof file) == 0 && cache_read(file, out) == 0) {
            if (o->progress)
                o->progress(o->ctx, "cache", out->n, out->n);
        } else if ((rc = tokenize_files(&c, o, &f, out, err)) == 0) {
            cache_write(o->spec, out);
        }
    }
    if (rc == 0 && out->n == 0)
        rc = acc_err_set(err, ACC_EINVAL, o->field,
                         "%s: no sample is left (%llu records: %llu over seq_len+1 = %d tokens dropped, %llu "
                         "without a token that carries loss)",
                         f.n == 1 ? base_name(f.v[0]) : "the files", (unsigned long long)out->lines,
                         (unsigned long long)out->dropped, o->spec->model.seq_len + 1,
                         (unsigned long long)out->no_target);
    files_free(&f);
    ctx_free(&c);
    if (rc != 0)
        prep_free(out);
    return rc;
}

void prep_free(prep_samples *p)
{
    if (p->map != NULL)
        munmap(p->map, p->map_len);
    for (int i = 0; i < 3; i++)
        free(p->heap[i]);
    memset(p, 0, sizeof *p);
}
