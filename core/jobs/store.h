/* store: each job's files under state_dir/jobs/<id>/, durable across crashes.
 *
 *   spec.json      the spec as submitted (written once, atomically)
 *   status.json    state, step, timestamps, error (rewritten atomically)
 *   events.ndjson  the event log, one JSON object a line, appended; fsynced
 *                  whenever the caller says so (state changes, done)
 *
 * Atomic means temp file + fsync + rename + fsync of the directory
 * (fsutil), so after a crash each file is the old or the new version, and a
 * job whose submission was acknowledged has both spec.json and status.json.
 * A torn last line of events.ndjson is the reader's to skip.
 */
#ifndef ACC_STORE_H
#define ACC_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <limits.h>

#include "err.h"

typedef struct store {
    char jobs_dir[PATH_MAX];
} store;

int store_init(store *st, const char *state_dir, acc_err *err);

/* Create the job's directory and write spec.json and status.json. */
int store_create_job(const store *st, const char *id, const char *spec, size_t spec_len, const char *status,
                     size_t status_len, acc_err *err);
int store_save_status(const store *st, const char *id, const char *status, size_t len, acc_err *err);

/* Open the event log for appending; *fd is -1 on failure. */
int store_open_events(const store *st, const char *id, int *fd, acc_err *err);
/* Append one line (a newline is added); fsync when `sync`. */
int store_append_event(int fd, const char *line, size_t len, bool sync, acc_err *err);

typedef struct store_job_files {
    const char *id;
    char *spec, *status, *events; /* NUL-terminated; status/events may be NULL */
    size_t spec_len, status_len, events_len;
} store_job_files;

/* Call `fn` for every job directory found, in no particular order. A job
 * whose files cannot be read is logged and skipped, never fatal. */
int store_load_all(const store *st, void (*fn)(void *ctx, const store_job_files *f), void *ctx, acc_err *err);

#endif
