/* fsutil: durable file operations.
 *
 * Everything accumd writes that must survive a crash goes through here:
 * fsu_write_atomic() writes a temp file beside the target, fsyncs it, renames
 * it over the target and fsyncs the directory, so a reader sees the old file
 * or the new one, never a mix, and after return the new one is on disk.
 */
#ifndef ACC_FSUTIL_H
#define ACC_FSUTIL_H

#include <stddef.h>
#include <sys/types.h>

#include "err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* mkdir -p with `mode` for every directory created. */
int fsu_mkdir_p(const char *path, mode_t mode, acc_err *err);

/* fsync the directory holding `path` (a file path or a directory path). */
int fsu_fsync_parent(const char *path, acc_err *err);
int fsu_fsync_dir(const char *dir, acc_err *err);

/* Write `len` bytes atomically and durably to `path` (mode 0640). */
int fsu_write_atomic(const char *path, const void *data, size_t len, acc_err *err);

/* The same for `n` chunks written one after the other (no copy into one
 * buffer); the temp file is `path` + ".partial". */
typedef struct fsu_chunk {
    const void *data;
    size_t len;
} fsu_chunk;
int fsu_write_atomic_chunks(const char *path, const fsu_chunk *c, int n, acc_err *err);

/* A file written in pieces, atomically: fsu_atomic_open creates `path` +
 * ".partial" (mode 0640), the caller writes a.fd (fsu_write_all, pwrite),
 * fsu_atomic_commit fsyncs, renames over `path` and fsyncs the directory;
 * fsu_atomic_abort (also after a failed commit: a no-op then) removes the
 * temp file. */
typedef struct fsu_atomic {
    int fd;
    char path[4096], tmp[4096 + 16];
} fsu_atomic;
int fsu_atomic_open(fsu_atomic *a, const char *path, acc_err *err);
int fsu_atomic_commit(fsu_atomic *a, acc_err *err);
void fsu_atomic_abort(fsu_atomic *a);

/* The same from the open file `in` (left open; `src` names it in messages). */
int fsu_copy_fd(int in, const char *src, const char *dst, acc_err *err);

/* Write all of `len` bytes to fd, retrying short writes and EINTR. */
int fsu_write_all(int fd, const void *data, size_t len, acc_err *err);

/* Read exactly `len` bytes from fd (a pipe or socket), retrying short
 * reads and EINTR; the peer closing first is ACC_EIO. */
int fsu_read_exact(int fd, void *buf, size_t len, acc_err *err);

/* Read a whole file into a malloc'd, NUL-terminated buffer. */
int fsu_read_all(const char *path, char **out, size_t *len, size_t max, acc_err *err);
/* The same from the start of the open regular file `fd` (left open; e.g.
 * one safepath.h checked); `name` is what messages call it. More than
 * `max` bytes: ACC_EINVAL. */
int fsu_read_fd(int fd, const char *name, char **out, size_t *len, size_t max, acc_err *err);

/* Remove a directory tree (used for discarding partial checkpoints). */
int fsu_rm_rf(const char *path, acc_err *err);

#ifdef __cplusplus
}
#endif

#endif
