/* store: see store.h. */
#include "store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fsutil.h"
#include "log.h"

#define STORE_MAX_FILE (256u << 20)

int store_init(store *st, const char *state_dir, acc_err *err)
{
    if (snprintf(st->jobs_dir, sizeof st->jobs_dir, "%s/jobs", state_dir) >= (int)sizeof st->jobs_dir)
        return acc_err_set(err, ACC_EINVAL, "state_dir", "state_dir is too long");
    return fsu_mkdir_p(st->jobs_dir, 0750, err);
}

static int job_path(const store *st, const char *id, const char *leaf, char *out, size_t n, acc_err *err)
{
    int w = leaf ? snprintf(out, n, "%s/%s/%s", st->jobs_dir, id, leaf) : snprintf(out, n, "%s/%s", st->jobs_dir, id);
    if (w < 0 || (size_t)w >= n)
        return acc_err_set(err, ACC_EINVAL, NULL, "job path too long");
    return 0;
}

int store_create_job(const store *st, const char *id, const char *spec, size_t spec_len, const char *status,
                     size_t status_len, acc_err *err)
{
    char dir[PATH_MAX], path[PATH_MAX];
    int rc;
    if ((rc = job_path(st, id, NULL, dir, sizeof dir, err)) || (rc = fsu_mkdir_p(dir, 0750, err)) ||
        (rc = fsu_fsync_parent(dir, err)) || (rc = job_path(st, id, "spec.json", path, sizeof path, err)) ||
        (rc = fsu_write_atomic(path, spec, spec_len, err)))
        return rc;
    return store_save_status(st, id, status, status_len, err);
}

int store_save_status(const store *st, const char *id, const char *status, size_t len, acc_err *err)
{
    char path[PATH_MAX];
    int rc = job_path(st, id, "status.json", path, sizeof path, err);
    return rc ? rc : fsu_write_atomic(path, status, len, err);
}

int store_open_events(const store *st, const char *id, int *fd, acc_err *err)
{
    char path[PATH_MAX];
    *fd = -1;
    int rc = job_path(st, id, "events.ndjson", path, sizeof path, err);
    if (rc != 0)
        return rc;
    *fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    if (*fd < 0)
        return acc_err_set(err, ACC_EIO, NULL, "open %s: %s", path, strerror(errno));
    return 0;
}

int store_append_event(int fd, const char *line, size_t len, bool sync, acc_err *err)
{
    if (fd < 0)
        return acc_err_set(err, ACC_EIO, NULL, "event log not open");
    char *buf = malloc(len + 1);
    if (buf == NULL)
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    memcpy(buf, line, len);
    buf[len] = '\n';
    int rc = fsu_write_all(fd, buf, len + 1, err); /* one write: lines stay whole */
    free(buf);
    if (rc == 0 && sync && fdatasync(fd) != 0)
        rc = acc_err_set(err, ACC_EIO, NULL, "fsync event log: %s", strerror(errno));
    return rc;
}

static bool valid_id(const char *name)
{
    if (name[0] == '\0' || name[0] == '.' || strlen(name) >= 64)
        return false;
    for (const char *p = name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-'))
            return false;
    return true;
}

static void load_one(const store *st, const char *id, void (*fn)(void *, const store_job_files *), void *ctx)
{
    char path[PATH_MAX];
    acc_err e = {0};
    store_job_files f = {.id = id};
    if (job_path(st, id, "spec.json", path, sizeof path, &e) ||
        fsu_read_all(path, &f.spec, &f.spec_len, STORE_MAX_FILE, &e)) {
        acc_log(ACC_LOG_WARN, "store", "job %s skipped: %s", id, e.msg);
        return;
    }
    if (job_path(st, id, "status.json", path, sizeof path, &e) == 0 &&
        fsu_read_all(path, &f.status, &f.status_len, STORE_MAX_FILE, &e) != 0 && e.code != ACC_ENOTFOUND)
        acc_log(ACC_LOG_WARN, "store", "job %s: status unreadable: %s", id, e.msg);
    if (job_path(st, id, "events.ndjson", path, sizeof path, &e) == 0 &&
        fsu_read_all(path, &f.events, &f.events_len, STORE_MAX_FILE, &e) != 0 && e.code != ACC_ENOTFOUND)
        acc_log(ACC_LOG_WARN, "store", "job %s: event log unreadable: %s", id, e.msg);
    fn(ctx, &f);
    free(f.spec);
    free(f.status);
    free(f.events);
}

int store_load_all(const store *st, void (*fn)(void *ctx, const store_job_files *f), void *ctx, acc_err *err)
{
    DIR *d = opendir(st->jobs_dir);
    if (d == NULL)
        return acc_err_set(err, ACC_EIO, "state_dir", "opendir %s: %s", st->jobs_dir, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (valid_id(e->d_name))
            load_one(st, e->d_name, fn, ctx);
    closedir(d);
    return 0;
}
