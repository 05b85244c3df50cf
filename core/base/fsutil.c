#include "fsutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int fsu_mkdir_p(const char *path, mode_t mode, acc_err *err)
{
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return acc_err_set(err, ACC_EINVAL, NULL, "path too long: %s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, mode) != 0 && errno != EEXIST)
            return acc_err_set(err, ACC_EIO, NULL, "mkdir %s: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, mode) != 0 && errno != EEXIST)
        return acc_err_set(err, ACC_EIO, NULL, "mkdir %s: %s", buf, strerror(errno));
    return 0;
}

int fsu_fsync_dir(const char *dir, acc_err *err)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return acc_err_set(err, ACC_EIO, NULL, "open %s: %s", dir, strerror(errno));
    int rc = fsync(fd);
    int saved = errno;
    close(fd);
    if (rc != 0)
        return acc_err_set(err, ACC_EIO, NULL, "fsync %s: %s", dir, strerror(saved));
    return 0;
}

int fsu_fsync_parent(const char *path, acc_err *err)
{
    char dir[PATH_MAX];
    if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir)
        return acc_err_set(err, ACC_EINVAL, NULL, "path too long: %s", path);
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        dir[--n] = '\0';
    char *slash = strrchr(dir, '/');
    if (slash == NULL)
        snprintf(dir, sizeof dir, ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    return fsu_fsync_dir(dir, err);
}

int fsu_write_all(int fd, const void *data, size_t len, acc_err *err)
{
    const char *p = data;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return acc_err_set(err, ACC_EIO, NULL, "write: %s", strerror(errno));
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

int fsu_read_exact(int fd, void *buf, size_t len, acc_err *err)
{
    char *p = buf;
    while (len > 0) {
        ssize_t r = read(fd, p, len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return acc_err_set(err, ACC_EIO, NULL, "read: %s", strerror(errno));
        if (r == 0)
            return acc_err_set(err, ACC_EIO, NULL, "read: the peer closed after %zu bytes short", len);
        p += r;
        len -= (size_t)r;
    }
    return 0;
}

int fsu_write_atomic_chunks(const char *path, const fsu_chunk *c, int n, acc_err *err)
{
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.partial", path) >= (int)sizeof tmp)
        return acc_err_set(err, ACC_EINVAL, NULL, "path too long: %s", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
    if (fd < 0)
        return acc_err_set(err, ACC_EIO, NULL, "create %s: %s", tmp, strerror(errno));
    int rc = 0;
    for (int i = 0; rc == 0 && i < n; i++)
        rc = fsu_write_all(fd, c[i].data, c[i].len, err);
    if (rc == 0 && fsync(fd) != 0)
        rc = acc_err_set(err, ACC_EIO, NULL, "fsync %s: %s", tmp, strerror(errno));
    if (close(fd) != 0 && rc == 0)
        rc = acc_err_set(err, ACC_EIO, NULL, "close %s: %s", tmp, strerror(errno));
    if (rc == 0 && rename(tmp, path) != 0)
        rc = acc_err_set(err, ACC_EIO, NULL, "rename %s: %s", path, strerror(errno));
    if (rc != 0) {
        unlink(tmp);
        return rc;
    }
    return fsu_fsync_parent(path, err);
}

int fsu_atomic_open(fsu_atomic *a, const char *path, acc_err *err)
{
    a->fd = -1;
    a->tmp[0] = '\0';
    if (snprintf(a->path, sizeof a->path, "%s", path) >= (int)sizeof a->path)
        return acc_err_set(err, ACC_EINVAL, NULL, "path too long: %s", path);
    snprintf(a->tmp, sizeof a->tmp, "%s.partial", path);
    a->fd = open(a->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
    if (a->fd < 0) {
        int rc = acc_err_set(err, ACC_EIO, NULL, "create %s: %s", a->tmp, strerror(errno));
        a->tmp[0] = '\0';
        return rc;
    }
    return 0;
}

int fsu_atomic_commit(fsu_atomic *a, acc_err *err)
{
    int rc = 0;
    if (fsync(a->fd) != 0)
        rc = acc_err_set(err, ACC_EIO, NULL, "fsync %s: %s", a->tmp, strerror(errno));
    if (close(a->fd) != 0 && rc == 0)
        rc = acc_err_set(err, ACC_EIO, NULL, "close %s: %s", a->tmp, strerror(errno));
    a->fd = -1;
    if (rc == 0 && rename(a->tmp, a->path) != 0)
        rc = acc_err_set(err, ACC_EIO, NULL, "rename %s: %s", a->path, strerror(errno));
    if (rc != 0) {
        unlink(a->tmp);
        return rc;
    }
    a->tmp[0] = '\0';
    return fsu_fsync_parent(a->path, err);
}

void fsu_atomic_abort(fsu_atomic *a)
{
    if (a->fd >= 0)
        close(a->fd);
    a->fd = -1;
    if (a->tmp[0] != '\0')
        unlink(a->tmp);
    a->tmp[0] = '\0';
}

int fsu_copy_fd(int in, const char *src, const char *dst, acc_err *err)
{
    fsu_atomic a;
    int rc = fsu_atomic_open(&a, dst, err);
    char buf[1 << 16];
    off_t at = 0;
    while (rc == 0) {
        ssize_t r = pread(in, buf, sizeof buf, at);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            rc = acc_err_set(err, ACC_EIO, NULL, "read %s: %s", src, strerror(errno));
        if (r <= 0)
            break;
        at += r;
        rc = fsu_write_all(a.fd, buf, (size_t)r, err);
    }
    if (rc == 0)
        rc = fsu_atomic_commit(&a, err);
    fsu_atomic_abort(&a);
    if (rc != 0)
        acc_err_prefix(err, "copying %s to %s", src, dst);
    return rc;
}

int fsu_write_atomic(const char *path, const void *data, size_t len, acc_err *err)
{
    fsu_chunk c = {data, len};
    return fsu_write_atomic_chunks(path, &c, 1, err);
}

int fsu_read_fd(int fd, const char *name, char **out, size_t *len, size_t max, acc_err *err)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return acc_err_set(err, ACC_EIO, NULL, "%s: %s", name, strerror(errno));
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > max)
        return acc_err_set(err, ACC_EINVAL, NULL, "%s: not a regular file of at most %zu bytes", name, max);
    size_t n = (size_t)st.st_size, got = 0;
    char *buf = malloc(n + 1);
    if (buf == NULL)
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory reading %s", name);
    while (got < n) {
        ssize_t r = pread(fd, buf + got, n - got, (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    if (got != n) {
        free(buf);
        return acc_err_set(err, ACC_EIO, NULL, "%s: short read", name);
    }
    buf[n] = '\0';
    *out = buf;
    if (len != NULL)
        *len = n;
    return 0;
}

int fsu_read_all(const char *path, char **out, size_t *len, size_t max, acc_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return acc_err_set(err, errno == ENOENT ? ACC_ENOTFOUND : ACC_EIO, NULL, "open %s: %s",
                           path, strerror(errno));
    int rc = fsu_read_fd(fd, path, out, len, max, err);
    close(fd);
    if (rc == ACC_EINVAL) /* the code callers knew */
        rc = acc_err_set(err, ACC_EIO, NULL, "%s: unreadable or larger than %zu bytes", path, max);
    return rc;
}

int fsu_rm_rf(const char *path, acc_err *err)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? 0 : acc_err_set(err, ACC_EIO, NULL, "stat %s: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (d == NULL)
            return acc_err_set(err, ACC_EIO, NULL, "opendir %s: %s", path, strerror(errno));
        struct dirent *e;
        int rc = 0;
        while (rc == 0 && (e = readdir(d)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            char child[PATH_MAX];
            if (snprintf(child, sizeof child, "%s/%s", path, e->d_name) >= (int)sizeof child)
                rc = acc_err_set(err, ACC_EINVAL, NULL, "path too long under %s", path);
            else
                rc = fsu_rm_rf(child, err);
        }
        closedir(d);
        if (rc != 0)
            return rc;
        if (rmdir(path) != 0)
            return acc_err_set(err, ACC_EIO, NULL, "rmdir %s: %s", path, strerror(errno));
        return 0;
    }
    if (unlink(path) != 0)
        return acc_err_set(err, ACC_EIO, NULL, "unlink %s: %s", path, strerror(errno));
    return 0;
}
