/* safepath: open the files and directories a job spec names, only under the
 * configured roots, so that what was checked is what is read.
 *
 * Every path a spec reaches (each glob match of data.train / data.val,
 * model.init_from, resume_from, the model.from and data.tokenizer
 * directories and every file in them, the tokenizer of POST /v1/tokenize)
 * is opened here and read through the returned descriptor, never reopened
 * by name:
 *   1. the path is resolved (symlinks included, realpath) and the result
 *      must lie under one of `roots` (colon-separated; each root resolved
 *      too);
 *   2. the resolved path is then opened component by component from a
 *      descriptor of that root with openat(O_NOFOLLOW): a component swapped
 *      for a symlink after step 1 makes the open fail (ELOOP/ENOTDIR)
 *      instead of leading outside the root;
 *   3. the last component's type is checked before opening (fstatat without
 *      following) and again on the descriptor (fstat), and it is opened
 *      O_NONBLOCK: a FIFO, socket or device is refused with "not a regular
 *      file" and never blocks the caller.
 * Error messages name the field and the path as the user wrote it (and the
 * roots), never anything read from the file.
 *
 * Empty `roots` means no restriction (engine tests and tools that build a
 * job_spec by hand); job_spec_parse always fills the spec's roots from the
 * daemon's config.
 */
#ifndef ACC_SAFEPATH_H
#define ACC_SAFEPATH_H

#include <stddef.h>

#include "err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Resolve `path` (a relative one against the first root) to its real path
 * and require it under one of `roots`; it must exist. ACC_EINVAL naming
 * `field` otherwise. `real` gets the resolved path. No file is opened. */
int sp_resolve(const char *roots, const char *path, const char *field, char *real, size_t n,
               acc_err *err);

/* Open a regular file under the roots for reading (O_RDONLY | O_CLOEXEC).
 * *fd is the descriptor (caller closes); `real` (may be NULL) its resolved
 * path. */
int sp_open_file(const char *roots, const char *path, const char *field, int *fd, char *real,
                 size_t n, acc_err *err);

/* The same for a directory (O_RDONLY | O_DIRECTORY), e.g. a checkpoint or a
 * model directory; open its files with sp_openat(). */
int sp_open_dir(const char *roots, const char *path, const char *field, int *fd, char *real,
                size_t n, acc_err *err);

/* Open `name` (one component, no '/') inside the directory `dirfd` without
 * following a symlink: a regular file when !want_dir, a directory when
 * want_dir; refuses any other type without blocking. ACC_ENOTFOUND when it
 * does not exist, ACC_EINVAL (with `field`) for a wrong type or a symlink. */
int sp_openat(int dirfd, const char *name, int want_dir, const char *field, int *fd,
              acc_err *err);

/* Open the file `name` (one component) of the directory `dirfd`, which
 * was opened under `roots` as `dir` (sp_open_dir; `dir` also names the file
 * in messages, "dir/name"), for reading, e.g. a model or tokenizer
 * directory's config.json. A regular file there is opened without following
 * anything (sp_openat). A symlink is resolved like any path a spec names:
 * opened only when its target lies under `roots`, then as sp_open_file
 * opens it (Hugging Face's hub cache links every file of a snapshot into
 * ../../blobs). Any other type is refused without blocking. ACC_ENOTFOUND
 * when no entry of that name exists. */
int sp_open_in(const char *roots, int dirfd, const char *dir, const char *name, const char *field, int *fd,
               acc_err *err);

/* Create (when missing) and open the directory `name` (one component) in
 * the directory `dirfd`, never following a symlink: an existing symlink or
 * non-directory there is refused. `exclusive`: an existing entry of any
 * kind is ACC_ESTATE (the caller picks another name). *fd (may be NULL)
 * gets the open directory. */
int sp_mkdirat(int dirfd, const char *name, int exclusive, int *fd, acc_err *err);

#ifdef __cplusplus
}
#endif

#endif
