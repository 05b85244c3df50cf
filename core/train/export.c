/* export: see export.h. */
#include "export.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"
#include "hf_dir.h"

/* One file of the checkpoint into the export: a hard link, else a copy. */
static int put_file(const char *from, const char *to, acc_err *err)
{
    if (link(from, to) == 0)
        return 0;
    if (errno != EXDEV && errno != EPERM && errno != EMLINK)
        return acc_err_set(err, ACC_EIO, "", "export: link %s: %s", to, strerror(errno));
    int fd = open(from, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return acc_err_set(err, ACC_EIO, "", "export: open %s: %s", from, strerror(errno));
    int rc = fsu_copy_fd(fd, from, to, err);
    close(fd);
    return rc;
}

/* The regular files of `src` (and, one level down, of its merged/ model)
 * but the optimizer state into `dst`, which exists. */
static int put_dir(const char *src, const char *dst, int depth, acc_err *err)
{
    DIR *d = opendir(src);
    if (d == NULL)
        return acc_err_set(err, ACC_EIO, "", "export: %s: %s", src, strerror(errno));
    int rc = 0;
    struct dirent *e;
    char from[PATH_MAX], to[PATH_MAX];
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, EXPORT_STATE_FILE))
            continue;
        if (snprintf(from, sizeof from, "%s/%s", src, e->d_name) >= (int)sizeof from ||
            snprintf(to, sizeof to, "%s/%s", dst, e->d_name) >= (int)sizeof to) {
            rc = acc_err_set(err, ACC_EINVAL, "", "export: path too long under %s", dst);
            break;
        }
        struct stat st;
        if (lstat(from, &st) != 0)
            rc = acc_err_set(err, ACC_EIO, "", "export: %s: %s", from, strerror(errno));
        else if (S_ISREG(st.st_mode))
            rc = put_file(from, to, err);
        else if (S_ISDIR(st.st_mode) && depth == 0) { /* LoRA's merged/ model */
            if (mkdir(to, 0750) != 0)
                rc = acc_err_set(err, ACC_EIO, "", "export: mkdir %s: %s", to, strerror(errno));
            else if ((rc = put_dir(from, to, 1, err)) == 0)
                rc = fsu_fsync_dir(to, err);
        } /* anything else is not part of a checkpoint: left out */
    }
    closedir(d);
    return rc;
}

/* The parent directory of `path` into buf. */
static void parent_of(const char *path, char *buf, size_t n)
{
    snprintf(buf, n, "%s", path);
    char *slash = strrchr(buf, '/');
    if (slash == NULL)
        snprintf(buf, n, ".");
    else if (slash == buf)
        buf[1] = '\0';
    else
        *slash = '\0';
}

int export_final(const char *ckpt_dir, const char *export_dir, const char *tok_src, const char *roots,
                 acc_err *err)
{
    char partial[PATH_MAX], parent[PATH_MAX];
    if (snprintf(partial, sizeof partial, "%s.partial", export_dir) >= (int)sizeof partial)
        return acc_err_set(err, ACC_EINVAL, "", "export: path too long: %s", export_dir);
    parent_of(export_dir, parent, sizeof parent);
    int rc = fsu_mkdir_p(parent, 0750, err);
    if (rc != 0)
        return rc;
    fsu_rm_rf(partial, NULL);
    if (mkdir(partial, 0750) != 0)
        return acc_err_set(err, ACC_EIO, "", "export: mkdir %s: %s", partial, strerror(errno));
    rc = put_dir(ckpt_dir, partial, 0, err);
    if (rc == 0 && tok_src != NULL) /* replaces a linked copy by rename, never through the link */
        rc = hf_copy_tokenizer(tok_src, roots, partial, err);
    if (rc == 0)
        rc = fsu_fsync_dir(partial, err);
    if (rc == 0) {
        fsu_rm_rf(export_dir, NULL); /* the previous export of this name */
        if (rename(partial, export_dir) != 0)
            rc = acc_err_set(err, ACC_EIO, "", "export: rename %s: %s", partial, strerror(errno));
        else
            rc = fsu_fsync_dir(parent, err);
    }
    if (rc != 0)
        fsu_rm_rf(partial, NULL);
    return rc;
}
