/* safepath: see safepath.h. */
#include "safepath.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *kind_name(mode_t m)
{
    if (S_ISREG(m)) return "a regular file";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISLNK(m)) return "a symlink";
    return "a special file";
}

/* The n-th root (0-based) of a colon-separated list, resolved; -1 past the end,
 * 1 when it does not resolve (skipped). */
static int nth_root(const char *roots, int idx, char *real)
{
    const char *p = roots;
    for (int i = 0; i < idx; i++) {
        p = strchr(p, ':');
        if (p == NULL)
            return -1;
        p++;
    }
    size_t l = strcspn(p, ":");
    char raw[PATH_MAX];
    if (l == 0 || l >= sizeof raw)
        return 1;
    memcpy(raw, p, l);
    raw[l] = '\0';
    return realpath(raw, real) != NULL ? 0 : 1;
}

static int is_under(const char *real, const char *root)
{
    size_t n = strlen(root);
    if (n == 1 && root[0] == '/')
        return 1;
    return !strncmp(real, root, n) && (real[n] == '/' || real[n] == '\0');
}

/* The resolved root `real` lies under, in root_out; 0 when none. */
static int root_of(const char *roots, const char *real, char *root_out)
{
    char r[PATH_MAX];
    for (int i = 0;; i++) {
        int rc = nth_root(roots, i, r);
        if (rc < 0)
            return 0;
        if (rc == 0 && is_under(real, r)) {
            snprintf(root_out, PATH_MAX, "%s", r);
            return 1;
        }
    }
}

int sp_resolve(const char *roots, const char *path, const char *field, char *real, size_t n,
               acc_err *err)
{
    char abs[PATH_MAX], res[PATH_MAX], root[PATH_MAX];
    if (path == NULL || path[0] == '\0')
        return acc_err_set(err, ACC_EINVAL, field, "%s must not be empty", field);
    int unrestricted = roots == NULL || roots[0] == '\0';
    if (path[0] != '/' && !unrestricted) {
        size_t l = strcspn(roots, ":");
        if (snprintf(abs, sizeof abs, "%.*s/%s", (int)l, roots, path) >= (int)sizeof abs)
            return acc_err_set(err, ACC_EINVAL, field, "%s is too long", field);
    } else if (snprintf(abs, sizeof abs, "%s", path) >= (int)sizeof abs) {
        return acc_err_set(err, ACC_EINVAL, field, "%s is too long", field);
    }
    if (realpath(abs, res) == NULL)
        return acc_err_set(err, ACC_EINVAL, field, "%s: cannot resolve '%s': %s", field, path,
                           strerror(errno));
    if (!unrestricted && !root_of(roots, res, root))
        return acc_err_set(err, ACC_EINVAL, field, "%s: '%s' is outside the allowed roots (%s)", field,
                           path, roots);
    if (strlen(res) >= n)
        return acc_err_set(err, ACC_EINVAL, field, "%s is too long", field);
    snprintf(real, n, "%s", res);
    return 0;
}

static int open_under(const char *roots, const char *path, int want_dir, const char *field, int *fd,
                      char *real_out, size_t n, acc_err *err);

/* openat `name` in dirfd, no symlink, the wanted type; `shown` names it in messages. */
static int openat_checked(int dirfd, const char *name, const char *shown, int want_dir, const char *field,
                          int *fd, acc_err *err)
{
    struct stat st;
    *fd = -1;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return acc_err_set(err, errno == ENOENT ? ACC_ENOTFOUND : ACC_EINVAL, field, "%s: '%s': %s", field, shown,
                           strerror(errno));
    if (want_dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode))
        return acc_err_set(err, ACC_EINVAL, field, "%s: '%s' is %s, not %s", field, shown, kind_name(st.st_mode),
                           want_dir ? "a directory" : "a regular file");
    /* O_NONBLOCK: should it have been swapped for a FIFO since the stat,
     * the open still returns at once and the fstat below refuses it */
    int flags = O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY | (want_dir ? O_DIRECTORY : 0);
    int f = openat(dirfd, name, flags);
    if (f < 0)
        return acc_err_set(err, ACC_EINVAL, field, "%s: cannot open '%s': %s", field, shown,
                           errno == ELOOP ? "it became a symlink while being opened" : strerror(errno));
    if (fstat(f, &st) != 0 || (want_dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode))) {
        close(f);
        return acc_err_set(err, ACC_EINVAL, field, "%s: '%s' changed type while being opened", field, shown);
    }
    int fl = fcntl(f, F_GETFL);
    if (fl >= 0)
        fcntl(f, F_SETFL, fl & ~O_NONBLOCK);
    *fd = f;
    return 0;
}

int sp_openat(int dirfd, const char *name, int want_dir, const char *field, int *fd, acc_err *err)
{
    if (strchr(name, '/') != NULL)
        return acc_err_set(err, ACC_EINVAL, field, "%s: '%s' is not one path component", field, name);
    return openat_checked(dirfd, name, name, want_dir, field, fd, err);
}

int sp_open_in(const char *roots, int dirfd, const char *dir, const char *name, const char *field, int *fd,
               acc_err *err)
{
    char shown[PATH_MAX];
    struct stat st;
    *fd = -1;
    if (strchr(name, '/') != NULL || (size_t)snprintf(shown, sizeof shown, "%s/%s", dir, name) >= sizeof shown)
        return acc_err_set(err, ACC_EINVAL, field, "%s: '%s' is not one path component", field, name);
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return acc_err_set(err, errno == ENOENT ? ACC_ENOTFOUND : ACC_EINVAL, field, "%s: '%s': %s", field, shown,
                           strerror(errno));
    if (!S_ISLNK(st.st_mode)) /* checked and opened from the directory's descriptor, no name reopened */
        return openat_checked(dirfd, name, shown, 0, field, fd, err);
    /* a symlink: its target must lie under the roots, like any path a spec names */
    return open_under(roots, shown, 0, field, fd, NULL, 0, err);
}

/* Walk `rel` (a symlink-free relative path) from the directory `cur`
 * (consumed), every directory component with O_NOFOLLOW. */
static int walk(int cur, char *rel, int want_dir, const char *field, const char *path, int *fd,
                acc_err *err)
{
    char *save = NULL, *comp = strtok_r(rel, "/", &save);
    while (comp != NULL) {
        char *next = strtok_r(NULL, "/", &save);
        if (next == NULL) {
            int rc = openat_checked(cur, comp, path, want_dir, field, fd, err);
            close(cur);
            if (rc == ACC_ENOTFOUND) /* it resolved a moment ago */
                rc = acc_err_set(err, ACC_EINVAL, field, "%s: '%s' vanished while being opened", field, path);
            return rc;
        }
        int nfd = openat(cur, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int saved = errno;
        close(cur);
        if (nfd < 0)
            return acc_err_set(err, ACC_EINVAL, field, "%s: cannot open '%s': %s", field, path,
                               saved == ELOOP || saved == ENOTDIR ? "a directory on its way changed while being opened"
                                                                 : strerror(saved));
        cur = nfd;
        comp = next;
    }
    /* rel was empty: the root itself */
    if (!want_dir) {
        close(cur);
        return acc_err_set(err, ACC_EINVAL, field, "%s: '%s' is a directory, not a regular file", field, path);
    }
    *fd = openat(cur, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    close(cur);
    if (*fd < 0)
        return acc_err_set(err, ACC_EINVAL, field, "%s: cannot open '%s': %s", field, path, strerror(errno));
    return 0;
}

static int open_under(const char *roots, const char *path, int want_dir, const char *field, int *fd,
                      char *real_out, size_t n, acc_err *err)
{
    char real[PATH_MAX], root[PATH_MAX];
    *fd = -1;
    int rc = sp_resolve(roots, path, field, real, sizeof real, err);
    if (rc != 0)
        return rc;
    if (roots == NULL || roots[0] == '\0' || !root_of(roots, real, root))
        snprintf(root, sizeof root, "/");
    /* the type first, by name: a clear message for the common case */
    struct stat st;
    if (stat(real, &st) == 0 && (want_dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)))
        return acc_err_set(err, ACC_EINVAL, field, "%s: '%s' is %s, not %s", field, path, kind_name(st.st_mode),
                           want_dir ? "a directory" : "a regular file");
    int cur = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (cur < 0)
        return acc_err_set(err, ACC_EINVAL, field, "%s: cannot open the root %s: %s", field, root, strerror(errno));
    size_t rl = strlen(root);
    char rel[PATH_MAX];
    snprintf(rel, sizeof rel, "%s", rl == 1 ? real + 1 : real + rl + (real[rl] == '/'));
    if ((rc = walk(cur, rel, want_dir, field, path, fd, err)) != 0)
        return rc;
    if (real_out != NULL)
        snprintf(real_out, n, "%s", real);
    return 0;
}

int sp_open_file(const char *roots, const char *path, const char *field, int *fd, char *real, size_t n,
                 acc_err *err)
{
    return open_under(roots, path, 0, field, fd, real, n, err);
}

int sp_open_dir(const char *roots, const char *path, const char *field, int *fd, char *real, size_t n,
                acc_err *err)
{
    return open_under(roots, path, 1, field, fd, real, n, err);
}

int sp_mkdirat(int dirfd, const char *name, int exclusive, int *fd, acc_err *err)
{
    if (fd != NULL)
        *fd = -1;
    if (strchr(name, '/') != NULL || !strcmp(name, ".") || !strcmp(name, ".."))
        return acc_err_set(err, ACC_EINVAL, NULL, "'%s' is not a directory name", name);
    if (mkdirat(dirfd, name, 0750) != 0) {
        if (errno != EEXIST)
            return acc_err_set(err, ACC_EIO, NULL, "mkdir %s: %s", name, strerror(errno));
        if (exclusive)
            return acc_err_set(err, ACC_ESTATE, NULL, "%s exists already", name);
    }
    int f = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (f < 0)
        return acc_err_set(err, ACC_EIO, NULL, "%s: %s", name,
                           errno == ELOOP || errno == ENOTDIR ? "a symlink or not a directory: refused"
                                                               : strerror(errno));
    if (fd != NULL)
        *fd = f;
    else
        close(f);
    return 0;
}
