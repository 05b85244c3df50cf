/* api_files: GET /v1/jobs/{id}/files, a job's outputs as a list
 * (h-results, issue 23).
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
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api_http.h"
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
    if (req->who->role != API_ROLE_ADMIN && strcmp(req->who->name, j->owner) != 0) {
        api_resp_error(resp, 403, "forbidden", NULL,
                       "only the job's owner or an admin may read its files: job %s is %s's, you are %s (role %s)",
                       j->id, j->owner[0] ? j->owner : "nobody", req->who->name, api_role_name(req->who->role));
        return;
    }
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
    resp->deferred = api_defer(s, files_work, files_done, c);
    if (resp->deferred == NULL)
        api_resp_error(resp, 503, "unavailable", NULL,
                       "too many requests being worked on (at most %d at a time); try again", API_MAX_DEFERRED);
}
