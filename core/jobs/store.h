/* store: the job store, one SQLite database, state_dir/accumd.db, in WAL mode.
 *
 *   meta     key/value: schema version, the id counter (next_submit), import marker
 *   jobs     one row per acknowledged job: id, submit_seq, uid, owner, state,
 *            submitted_at, spec (as submitted), status (job_status_json), last_seq
 *   events   (job, seq) -> type, time, the event's JSON line
 *   metrics  (job, step) -> the step's figures (the /metrics history)
 * Indexes: jobs by state and by owner, each in submission order; submit_seq
 * is unique, so listing, filtering and pagination are indexed queries.
 *
 * Durability: every write is one transaction. State changes and job creation
 * commit with synchronous=FULL (the WAL is fsynced before the call returns:
 * acknowledged means on disk); step events commit with NORMAL (a crash may
 * lose the last few, which a resume from the checkpoint redoes). A kill -9
 * mid-transaction leaves the previous commit: no torn record can exist.
 *
 * Failure: every SQLite call is checked. A write that fails returns
 * ACC_EINTERNAL naming the operation and the database file, and marks the
 * store `failing` until a later write succeeds (store_probe); the caller
 * keeps the previous state visible and retries. At start the database is
 * checked (PRAGMA quick_check): the tables a start reads (jobs, meta) before
 * loading, the whole file (the history grows with time) on a maintenance
 * thread with its own connection, its verdict picked up by store_poll_check
 * on the loop thread; that thread then checkpoints the WAL into the
 * database (PASSIVE, every second), so commits on the loop thread only
 * append to the WAL. A database that cannot be opened, is
 * corrupt or cannot be written puts the store in read-only `degraded` mode:
 * reads answer what can be read, writes fail with ACC_EUNAVAIL. Neither is
 * fatal.
 *
 * Round 1: on first start an existing state_dir/jobs/<id>/{spec.json,
 * status.json,events.ndjson} layout is imported in one transaction, then
 * moved aside to state_dir/jobs.imported/ (never deleted). Nothing read back
 * is trusted: a torn last line is dropped, a line whose seq does not follow
 * the previous one (e.g. 999999999999) is refused, a damaged spec.json keeps
 * the job, failed, with the reason.
 *
 * Not thread-safe: the loop thread owns the store.
 */
#ifndef ACC_STORE_H
#define ACC_STORE_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"

typedef struct sqlite3 sqlite3;
typedef struct sqlite3_stmt sqlite3_stmt;

enum store_stmt_id {
    STS_BEGIN, STS_COMMIT, STS_ROLLBACK, STS_SYNC_FULL, STS_SYNC_NORMAL,
    STS_JOB_INSERT, STS_COUNTER_SET, STS_STATUS_SET, STS_LASTSEQ_SET,
    STS_EVENT_INSERT, STS_EVENT_PRUNE, STS_METRIC_CUT, STS_METRIC_INSERT, STS_METRIC_PRUNE,
    STS_LIST_ALL, STS_LIST_STATE, STS_EVENTS_TAIL, STS_METRICS_ALL, STS_PROBE,
    STS_N
};

typedef struct store {
    sqlite3 *db;
    char path[PATH_MAX];      /* state_dir/accumd.db */
    char state_dir[PATH_MAX];
    int history_keep;         /* events / metrics rows kept per job */
    bool degraded;            /* read-only since start */
    bool failing;             /* the last write failed */
    char why[512];            /* degraded or failing: the reason */
    uint64_t write_errors;    /* failed writes since start */
    uint64_t next_submit;     /* the id counter as stored */
    int imported;             /* round-1 jobs imported at this start */
    sqlite3_stmt *stmt[STS_N];
    /* the maintenance thread: the whole-file check (0 running, 1 passed,
     * -1 failed: check_msg), then WAL checkpoints until store_close */
    pthread_t check_thr;
    bool check_on, check_seen;
    _Atomic int check_state;
    atomic_bool check_stop;  /* store_close: end the check early */
    char check_msg[512];
    /* ACCUMD_TEST_KILL_IN_TX="PREFIX:N" (test-only, read at store_init):
     * the N-th write transaction whose operation starts with PREFIX ("create
     * job", "save state of job", "append events of job") SIGKILLs the
     * process after its statements ran and before COMMIT, so the tests see
     * a kill -9 mid-transaction at a chosen place */
    char kill_op[64];
    int kill_countdown;       /* 0: no hook */
} store;

/* Open (create) the database, import round 1, check it. Returns non-zero
 * only for what no mode can run with (a state_dir path too long); a bad
 * database leaves st->degraded set, with the reason in st->why. */
int store_init(store *st, const char *state_dir, int history_keep, acc_err *err);
void store_close(store *st);

/* A job as stored. uid and owner may be NULL (owner NULL/"": the admin). */
typedef struct store_job_row {
    const char *id;
    uint64_t submit_seq;
    const char *uid, *owner;
    const char *state;
    double submitted_at;
    const char *spec;         /* NUL-terminated JSON (may be damaged on load) */
    const char *status;       /* NUL-terminated JSON, NULL when missing */
    uint64_t last_seq;        /* the last event's seq (0: none) */
} store_job_row;

typedef struct store_event {
    uint64_t seq;
    const char *type;
    double time;
    const char *json;         /* the event object, one line */
    size_t len;
} store_event;

typedef struct store_metric {
    int step;
    double time, loss, lr, grad_norm, tokens_per_s; /* NaN is stored as NULL */
    int micro_batch, accum_steps;
    uint64_t mem_peak;
} store_metric;

/* A new job and its first events, the id counter past it: one FULL commit. */
int store_create_job(store *st, const store_job_row *row, const store_event *evs, int nev, acc_err *err);

/* One state change: the job's state, status and events in one FULL commit. */
int store_save_status(store *st, const char *id, const char *state, const char *status, const store_event *evs,
                      int nev, acc_err *err);

/* Events (and a step's metric row, when `metric` is not NULL) without a
 * status change; FULL when `sync`, else NORMAL. */
int store_append_events(store *st, const char *id, const store_event *evs, int nev, const store_metric *metric,
                        bool sync, acc_err *err);

/* The whole-file check's verdict, when it is in: a damaged file makes the
 * store read-only from here on. `wait`: block until the check ends (tests). */
void store_poll_check(store *st, bool wait);

/* A tiny write, to learn whether a failing store works again. */
int store_probe(store *st, acc_err *err);

/* Every job, in submission order. A row the callback cannot use is its to
 * report; the store never drops one. */
int store_load_all(store *st, void (*fn)(void *ctx, const store_job_row *r), void *ctx, acc_err *err);

/* Ids newest first: submit_seq < before (0: from the newest), state NULL for
 * all; at most `limit`. fn gets each id. */
int store_list(store *st, const char *state, uint64_t before, int limit, void (*fn)(void *ctx, const char *id),
               void *ctx, acc_err *err);

/* The job's last `limit` events, oldest first. */
int store_load_events(store *st, const char *id, int limit, void (*fn)(void *ctx, const store_event *e), void *ctx,
                      acc_err *err);
/* The job's metrics history, by step. */
int store_load_metrics(store *st, const char *id, void (*fn)(void *ctx, const store_metric *m), void *ctx,
                       acc_err *err);

/* Round 1 -> database (store_init calls it; public for the unit test). */
int store_import_round1(store *st, acc_err *err);

#endif
