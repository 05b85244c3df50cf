/* api_files: GET /v1/jobs/{id}/files, a job's outputs as a list.
 *
 *   {"job": ID, "files": [{"path": "ckpt-00000004/model.safetensors",
 *                          "size": BYTES, "sha256": HEX}, ...]}
 *
 * Only the job's owner or an admin (403 otherwise, as cancel). The files
 * are the regular files under the job's output directory
 * (output_root/<id>: checkpoints and, without output_dir, export/) and,
 * when the spec names an output_dir, those of its export in the owner's
 * area, listed under "export/". Everything is opened through safepath.h
 * from output_root, component by component without following a symlink
 * (a symlink or special file planted there is left out); the walk and the
 * SHA-256 of every file run on libuv's thread pool (api_defer), never on
 * the loop thread. Paths are relative, in directory order, at most
 * FILES_MAX_DEPTH directories deep.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <microhttpd.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api_http.h"
#include "api_parse.h"
#include "jobs.h"
#include "safepath.h"

#define FILES_MAX_DEPTH 4

typedef struct files_job {
    char root[PATH_MAX];       /* output_root */
    char dir[PATH_MAX];        /* the job's output directory */
    char export_dir[PATH_MAX]; /* its export when outside dir, else "" */
    char id[32];
    json_t *out;
    acc_err err;
    int rc;
} files_job;

/* The SHA-256 of the open file fd as hex. */
static int sha256_fd(int fd, char hex[65], acc_err *err)
{
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    unsigned char buf[1 << 16], md[32];
    unsigned int n = 0;
    int rc = c != NULL && EVP_DigestInit_ex(c, EVP_sha256(), NULL) == 1 ? 0 : -1;
    off_t at = 0;
    while (rc == 0) {
        ssize_t r = pread(fd, buf, sizeof buf, at);
        if (r <= 0) {
            rc = r < 0 ? -1 : 0;
            break;
        }
        at += r;
        rc = EVP_DigestUpdate(c, buf, (size_t)r) == 1 ? 0 : -1;
    }
    if (rc == 0 && (EVP_DigestFinal_ex(c, md, &n) != 1 || n != sizeof md))
        rc = -1;
    EVP_MD_CTX_free(c);
    if (rc != 0)
        return acc_err_set(err, ACC_EIO, NULL, "cannot hash an output file");
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
    return 0;
}

/* The regular files of the directory dfd (a descriptor of it, consumed)
 * under the relative prefix `rel` into the array. */
static int walk(int dfd, const char *rel, int depth, json_t *arr, acc_err *err)
{
    DIR *d = fdopendir(dfd);
    if (d == NULL) {
        close(dfd);
        return acc_err_set(err, ACC_EIO, NULL, "cannot read an output directory");
    }
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || strstr(e->d_name, ".partial") != NULL) /* dot files, unfinished saves */
            continue;
        char path[PATH_MAX];
        if (snprintf(path, sizeof path, "%s%s%s", rel, rel[0] ? "/" : "", e->d_name) >= (int)sizeof path)
            continue;
        int fd;
        acc_err e2 = {0};
        if (depth < FILES_MAX_DEPTH && sp_openat(dirfd(d), e->d_name, 1, "files", &fd, &e2) == 0) {
            rc = walk(fd, path, depth + 1, arr, err);
            continue;
        }
        if (sp_openat(dirfd(d), e->d_name, 0, "files", &fd, &e2) != 0)
            continue; /* a symlink, a special file, gone meanwhile: not an output */
        struct stat st;
        char hex[65];
        if (fstat(fd, &st) == 0 && (rc = sha256_fd(fd, hex, err)) == 0)
            rc = json_array_append_new(arr, json_pack("{s:s, s:I, s:s}", "path", path, "size",
                                                      (json_int_t)st.st_size, "sha256", hex)) == 0
                     ? 0
                     : acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
        close(fd);
    }
    closedir(d);
    return rc;
}

/* One directory under output_root, listed under `rel` ("" or "export"). */
static int list_dir(const files_job *c, const char *dir, const char *rel, json_t *arr, acc_err *err)
{
    int fd;
    acc_err e = {0};
    int rc = sp_open_dir(c->root, dir, "files", &fd, NULL, 0, &e);
    if (rc == ACC_ENOTFOUND)
        return 0; /* nothing written yet */
    if (rc != 0)
        return acc_err_set(err, ACC_EIO, NULL, "job %s: its outputs cannot be read", c->id);
    return walk(fd, rel, 0, arr, err);
}

/* Only the job's owner or an admin reads its files (403 otherwise, as cancel). */
static bool may_read(const api_request *req, const job *j, api_response *resp)
{
    if (req->who->role == API_ROLE_ADMIN || !strcmp(req->who->name, j->owner))
        return true;
    api_resp_error(resp, 403, "forbidden", NULL,
                   "only the job's owner or an admin may read its files: job %s is %s's, you are %s (role %s)",
                   j->id, j->owner[0] ? j->owner : "nobody", req->who->name, api_role_name(req->who->role));
    return false;
}

/* The work on the thread pool, the answer later (api_defer; ctx freed by done). */
static void defer_or_503(api_server *s, api_response *resp, api_work_fn work, api_done_fn done, void *ctx)
{
    resp->deferred = api_defer(s, work, done, ctx);
    if (resp->deferred == NULL)
        api_resp_error(resp, 503, "unavailable", NULL,
                       "too many requests being worked on (at most %d at a time); try again", API_MAX_DEFERRED);
}

static void files_work(void *ctx)
{
    files_job *c = ctx;
    json_t *arr = json_array();
    c->rc = arr == NULL ? acc_err_set(&c->err, ACC_ENOMEM, NULL, "out of memory") : 0;
    if (c->rc == 0)
        c->rc = list_dir(c, c->dir, "", arr, &c->err);
    if (c->rc == 0 && c->export_dir[0] != '\0')
        c->rc = list_dir(c, c->export_dir, "export", arr, &c->err);
    if (c->rc == 0 && (c->out = json_pack("{s:s, s:o}", "job", c->id, "files", arr)) == NULL)
        c->rc = acc_err_set(&c->err, ACC_ENOMEM, NULL, "out of memory");
    else if (c->rc != 0)
        json_decref(arr);
}

static void files_done(void *ctx, api_response *resp, bool orphaned)
{
    files_job *c = ctx;
    if (!orphaned && resp != NULL) {
        if (c->rc != 0)
            api_resp_from_err(resp, &c->err);
        else
            api_resp_json_obj(resp, 200, c->out, JSON_COMPACT);
        c->out = NULL; /* taken (or NULL) */
    }
    json_decref(c->out);
    free(c);
}

void api_files(api_server *s, const api_request *req, api_response *resp, job *j)
{
    jobs_mgr *m = api_server_app(s);
    if (!may_read(req, j, resp))
        return;
    files_job *c = calloc(1, sizeof *c);
    if (c == NULL) {
        api_resp_error(resp, 500, "internal", NULL, "out of memory");
        return;
    }
    snprintf(c->root, sizeof c->root, "%s", m->conf->output_root);
    snprintf(c->id, sizeof c->id, "%s", j->id);
    if (snprintf(c->dir, sizeof c->dir, "%s/%s", m->conf->output_root, j->id) >= (int)sizeof c->dir) {
        free(c);
        api_resp_error(resp, 500, "internal", NULL, "job %s: output path too long", j->id);
        return;
    }
    char ex[PATH_MAX];
    job_export_dir(j, m->conf->output_root, ex, sizeof ex);
    if (j->spec.output_name[0] != '\0') /* else it is dir/export, listed with dir */
        snprintf(c->export_dir, sizeof c->export_dir, "%s", ex);
    defer_or_503(s, resp, files_work, files_done, c);
}

/* ---- GET /v1/jobs/{id}/files/{path}: one file, streamed ------------------------ */

/* A download: MHD's reader (loop thread) serves the front buffer; when it
 * is spent, the next chunk is read into the back buffer on libuv's thread
 * pool while the connection is suspended, then the buffers swap and the
 * connection resumes. The loop thread never reads the file. */
#define FILE_CHUNK (1u << 20)

typedef struct api_fstream {
    api_server *srv;
    struct MHD_Connection *conn;
    int fd;
    uint64_t next;             /* file offset of the next chunk to read */
    uint64_t end;              /* one past the last byte served */
    uint64_t front_at;         /* response position of front[0] */
    size_t front_len, back_len;
    char *front, *back;
    int read_err;
    bool busy, suspended, mhd_gone, ending;
    uv_work_t work;
    struct api_fstream *prev, *next_fs;
} api_fstream;

static void fs_free(api_fstream *f)
{
    if (f->fd >= 0)
        close(f->fd);
    free(f->front);
    free(f->back);
    free(f);
}

static void fs_unlink(api_fstream *f)
{
    api_fstream **head = api_server_fstreams(f->srv);
    if (f->prev != NULL)
        f->prev->next_fs = f->next_fs;
    else if (*head == f)
        *head = f->next_fs;
    if (f->next_fs != NULL)
        f->next_fs->prev = f->prev;
    f->prev = f->next_fs = NULL;
}

static void fs_read_work(uv_work_t *w)
{
    api_fstream *f = w->data;
    uint64_t want = f->end - f->next < FILE_CHUNK ? f->end - f->next : FILE_CHUNK;
    size_t got = 0;
    while (got < want) {
        ssize_t r = pread(f->fd, f->back + got, (size_t)(want - got), (off_t)(f->next + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) { /* an error, or the file shrank under us */
            f->read_err = 1;
            break;
        }
        got += (size_t)r;
    }
    f->back_len = got;
}

static void fs_resume(api_fstream *f)
{
    if (!f->suspended)
        return;
    f->suspended = false;
    MHD_resume_connection(f->conn);
    api_server_kick(f->srv);
}

static void fs_read_done(uv_work_t *w, int status)
{
    api_fstream *f = w->data;
    f->busy = false;
    if (f->mhd_gone) { /* the response was freed meanwhile */
        fs_free(f);
        return;
    }
    if (status == 0 && !f->read_err) {
        char *t = f->front;
        f->front = f->back;
        f->back = t;
        f->front_at += f->front_len;
        f->front_len = f->back_len;
        f->next += f->back_len;
    } else {
        f->read_err = 1;
    }
    fs_resume(f);
}

static ssize_t fs_reader(void *cls, uint64_t pos, char *out, size_t max)
{
    api_fstream *f = cls;
    if (f->ending || f->read_err)
        return MHD_CONTENT_READER_END_WITH_ERROR;
    if (pos >= f->front_at && pos < f->front_at + f->front_len) {
        size_t off = (size_t)(pos - f->front_at), n = f->front_len - off;
        n = n < max ? n : max;
        memcpy(out, f->front + off, n);
        return (ssize_t)n;
    }
    if (!f->busy) {
        f->busy = true;
        f->work.data = f;
        if (uv_queue_work(api_server_loop(f->srv), &f->work, fs_read_work, fs_read_done) != 0) {
            f->busy = false;
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
    f->suspended = true; /* until the chunk is read */
    MHD_suspend_connection(f->conn);
    return 0;
}

static void fs_mhd_free(void *cls)
{
    api_fstream *f = cls;
    fs_unlink(f);
    f->mhd_gone = true;
    if (!f->busy)
        fs_free(f);
}

void api_fstream_end_all(api_server *s)
{
    for (api_fstream *f = *api_server_fstreams(s); f != NULL; f = f->next_fs) {
        f->ending = true;
        fs_resume(f);
    }
}

/* The Range header: none (whole file), or one "bytes=A-B", "bytes=A-",
 * "bytes=-N". 0 with [*a, *b] inclusive; 1 when absent; -1 malformed;
 * -2 unsatisfiable for a file of `size` bytes. */
static int parse_range(const char *h, uint64_t size, uint64_t *a, uint64_t *b)
{
    if (h == NULL)
        return 1;
    if (strncmp(h, "bytes=", 6) != 0 || strchr(h, ',') != NULL)
        return -1;
    const char *p = h + 6, *dash = strchr(p, '-');
    if (dash == NULL)
        return -1;
    char *e;
    if (dash == p) { /* the last N bytes */
        if (!isdigit((unsigned char)dash[1]))
            return -1;
        unsigned long long n = strtoull(dash + 1, &e, 10);
        if (*e != '\0')
            return -1;
        if (n == 0 || size == 0)
            return -2;
        *a = n >= size ? 0 : size - n;
        *b = size - 1;
        return 0;
    }
    if (!isdigit((unsigned char)*p))
        return -1;
    unsigned long long x = strtoull(p, &e, 10), y = size ? size - 1 : 0;
    if (e != dash)
        return -1;
    if (dash[1] != '\0') {
        if (!isdigit((unsigned char)dash[1]))
            return -1;
        y = strtoull(dash + 1, &e, 10);
        if (*e != '\0' || y < x)
            return -1;
    }
    if (x >= size)
        return -2;
    *a = x;
    *b = y < size ? y : size - 1;
    return 0;
}

typedef struct file_job {
    char root[PATH_MAX], dir[PATH_MAX], path[512], id[32];
    char range[128];
    bool has_range;
    struct MHD_Connection *conn;
    api_server *srv;
    int fd;
    uint64_t size;
    acc_err err;
    int rc;
} file_job;

/* Open `path` (checked components) under `dir`, itself under `root`,
 * component by component without following a symlink. */
static int open_output(const file_job *c, const char *dir, const char *path, int *out, acc_err *err)
{
    int dfd;
    acc_err e = {0};
    if (sp_open_dir(c->root, dir, "path", &dfd, NULL, 0, &e) != 0)
        return acc_err_set(err, ACC_ENOTFOUND, "path", "job %s has no file '%s'", c->id, c->path);
    char comp[512];
    const char *p = path;
    int rc = 0;
    while (rc == 0) {
        size_t n = strcspn(p, "/");
        snprintf(comp, sizeof comp, "%.*s", (int)n, p);
        int fd;
        bool last = p[n] == '\0';
        if (sp_openat(dfd, comp, !last, "path", &fd, &e) != 0)
            rc = acc_err_set(err, ACC_ENOTFOUND, "path", "job %s has no file '%s'", c->id, c->path);
        close(dfd);
        dfd = -1;
        if (rc != 0)
            break;
        if (last) {
            *out = fd;
            return 0;
        }
        dfd = fd;
        p += n + 1;
    }
    return rc;
}

static void file_work(void *ctx)
{
    file_job *c = ctx;
    struct stat st;
    c->rc = open_output(c, c->dir, c->path, &c->fd, &c->err);
    if (c->rc == 0 && fstat(c->fd, &st) != 0)
        c->rc = acc_err_set(&c->err, ACC_EIO, "path", "job %s: cannot read '%s'", c->id, c->path);
    if (c->rc == 0)
        c->size = (uint64_t)st.st_size;
}

static void file_answer(file_job *c, api_response *resp)
{
    uint64_t a = 0, b = c->size ? c->size - 1 : 0;
    int r = parse_range(c->has_range ? c->range : NULL, c->size, &a, &b);
    if (r == -1) {
        api_resp_error(resp, 400, "invalid", "Range", "Range must be one range: bytes=A-B, bytes=A- or bytes=-N");
        return;
    }
    if (r == -2) {
        api_resp_error(resp, 416, "range_not_satisfiable", "Range", "the file has %llu bytes",
                       (unsigned long long)c->size);
        return;
    }
    api_fstream *f = calloc(1, sizeof *f);
    uint64_t len = c->size == 0 ? 0 : b - a + 1;
    if (f != NULL) {
        f->front = malloc(FILE_CHUNK);
        f->back = malloc(FILE_CHUNK);
    }
    if (f == NULL || f->front == NULL || f->back == NULL) {
        if (f != NULL) {
            f->fd = -1;
            fs_free(f);
        }
        api_resp_error(resp, 500, "internal", NULL, "out of memory");
        return;
    }
    *f = (api_fstream){.srv = c->srv, .conn = c->conn, .fd = c->fd, .next = a, .end = a + len, .front = f->front,
                       .back = f->back};
    c->fd = -1; /* the stream's now */
    struct MHD_Response *mr = MHD_create_response_from_callback(len, 64 * 1024, fs_reader, f, fs_mhd_free);
    if (mr == NULL) {
        fs_free(f);
        api_resp_error(resp, 500, "internal", NULL, "out of memory");
        return;
    }
    api_fstream **head = api_server_fstreams(c->srv);
    f->next_fs = *head;
    if (*head != NULL)
        (*head)->prev = f;
    *head = f;
    char cr[128];
    MHD_add_response_header(mr, MHD_HTTP_HEADER_CONTENT_TYPE, "application/octet-stream");
    MHD_add_response_header(mr, MHD_HTTP_HEADER_ACCEPT_RANGES, "bytes");
    if (r == 0) {
        snprintf(cr, sizeof cr, "bytes %llu-%llu/%llu", (unsigned long long)a, (unsigned long long)b,
                 (unsigned long long)c->size);
        MHD_add_response_header(mr, MHD_HTTP_HEADER_CONTENT_RANGE, cr);
    }
    resp->mhd = mr;
    resp->status = r == 0 ? 206 : 200;
}

static void file_done(void *ctx, api_response *resp, bool orphaned)
{
    file_job *c = ctx;
    if (!orphaned && resp != NULL) {
        if (c->rc != 0)
            api_resp_from_err(resp, &c->err);
        else
            file_answer(c, resp);
    }
    if (c->fd >= 0)
        close(c->fd);
    free(c);
}

void api_file_get(api_server *s, const api_request *req, const char *path, api_response *resp, job *j)
{
    jobs_mgr *m = api_server_app(s);
    if (!may_read(req, j, resp))
        return;
    file_job *c = calloc(1, sizeof *c);
    if (c == NULL) {
        api_resp_error(resp, 500, "internal", NULL, "out of memory");
        return;
    }
    c->fd = -1;
    c->srv = s;
    c->conn = req->conn;
    snprintf(c->root, sizeof c->root, "%s", m->conf->output_root);
    snprintf(c->id, sizeof c->id, "%s", j->id);
    snprintf(c->path, sizeof c->path, "%s", path);
    const char *rh = api_header(req, "Range");
    if (rh != NULL && strlen(rh) < sizeof c->range) {
        snprintf(c->range, sizeof c->range, "%s", rh);
        c->has_range = true;
    } else if (rh != NULL) {
        free(c);
        api_resp_error(resp, 400, "invalid", "Range", "Range must be one range: bytes=A-B, bytes=A- or bytes=-N");
        return;
    }
    /* "export/..." names the export in the owner's area when the spec has an output_dir */
    bool in_export = j->spec.output_name[0] != '\0' && !strncmp(path, "export/", 7);
    int w = in_export ? 0 : snprintf(c->dir, sizeof c->dir, "%s/%s", m->conf->output_root, j->id);
    if (in_export) {
        job_export_dir(j, m->conf->output_root, c->dir, sizeof c->dir);
        memmove(c->path, c->path + 7, strlen(c->path + 7) + 1);
    }
    if (w >= (int)sizeof c->dir || c->dir[0] == '\0') {
        free(c);
        api_resp_error(resp, 500, "internal", NULL, "job %s: output path too long", j->id);
        return;
    }
    defer_or_503(s, resp, file_work, file_done, c);
}
