/* store: see store.h. */
#include "store.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fsutil.h"
#include "log.h"

#define STORE_SCHEMA_VERSION 1
#define STORE_BUSY_MS 20            /* the loop thread waits no longer for a lock */
#define STORE_PRUNE_EVERY 256       /* history pruned every this many rows */
#define STORE_CKPT_MS 1000          /* the maintenance thread checkpoints the WAL this often */
#define ROUND1_MAX_FILE (256u << 20)
#define ROUND1_MAX_SEQ_STEP 1024    /* a round-1 line may skip this many torn ones */

static const char *const schema =
    "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS jobs("
    " id TEXT PRIMARY KEY,"
    " submit_seq INTEGER NOT NULL UNIQUE,"
    " uid TEXT,"                      /* per-job unique id minted at submission */
    " owner TEXT,"                    /* NULL or '': the admin */
    " state TEXT NOT NULL,"
    " submitted_at REAL NOT NULL,"
    " spec TEXT NOT NULL,"
    " status TEXT,"
    " last_seq INTEGER NOT NULL DEFAULT 0);"
    "CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs(state, submit_seq);"
    "CREATE INDEX IF NOT EXISTS jobs_by_owner ON jobs(owner, submit_seq);"
    "CREATE TABLE IF NOT EXISTS events("
    " job TEXT NOT NULL, seq INTEGER NOT NULL, type TEXT NOT NULL, time REAL NOT NULL, json TEXT NOT NULL,"
    " PRIMARY KEY(job, seq)) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS metrics("
    " job TEXT NOT NULL, step INTEGER NOT NULL, time REAL, loss REAL, lr REAL, grad_norm REAL,"
    " tokens_per_s REAL, micro_batch INTEGER, accum_steps INTEGER, mem_peak INTEGER,"
    " PRIMARY KEY(job, step)) WITHOUT ROWID;";

static const char *const stmt_sql[STS_N] = {
    [STS_BEGIN] = "BEGIN IMMEDIATE",
    [STS_COMMIT] = "COMMIT",
    [STS_ROLLBACK] = "ROLLBACK",
    [STS_SYNC_FULL] = "PRAGMA synchronous=FULL",
    [STS_SYNC_NORMAL] = "PRAGMA synchronous=NORMAL",
    [STS_JOB_INSERT] = "INSERT INTO jobs(id, submit_seq, uid, owner, state, submitted_at, spec, status, last_seq)"
                       " VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?)",
    [STS_COUNTER_SET] = "INSERT INTO meta(key, value) VALUES('next_submit', ?)"
                        " ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)",
    [STS_STATUS_SET] = "UPDATE jobs SET state = ?, status = ? WHERE id = ?",
    [STS_LASTSEQ_SET] = "UPDATE jobs SET last_seq = max(last_seq, ?) WHERE id = ?",
    [STS_EVENT_INSERT] = "INSERT OR REPLACE INTO events(job, seq, type, time, json) VALUES(?, ?, ?, ?, ?)",
    [STS_EVENT_PRUNE] = "DELETE FROM events WHERE job = ? AND seq <= ?",
    [STS_METRIC_CUT] = "DELETE FROM metrics WHERE job = ? AND step >= ?",
    [STS_METRIC_INSERT] = "INSERT INTO metrics(job, step, time, loss, lr, grad_norm, tokens_per_s, micro_batch,"
                          " accum_steps, mem_peak) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    [STS_METRIC_PRUNE] = "DELETE FROM metrics WHERE job = ? AND step <= ?",
    [STS_LIST_ALL] = "SELECT id FROM jobs WHERE submit_seq < ? ORDER BY submit_seq DESC LIMIT ?",
    [STS_LIST_STATE] = "SELECT id FROM jobs WHERE state = ? AND submit_seq < ? ORDER BY submit_seq DESC LIMIT ?",
    [STS_EVENTS_TAIL] = "SELECT seq, type, time, json FROM"
                        " (SELECT seq, type, time, json FROM events WHERE job = ? ORDER BY seq DESC LIMIT ?)"
                        " ORDER BY seq",
    [STS_METRICS_ALL] = "SELECT step, time, loss, lr, grad_norm, tokens_per_s, micro_batch, accum_steps, mem_peak"
                        " FROM metrics WHERE job = ? ORDER BY step",
    [STS_PROBE] = "INSERT INTO meta(key, value) VALUES('opened_at', ?)"
                  " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
};

/* ---- errors ------------------------------------------------------------------ */

/* A failed SQLite call: the operation, the file and SQLite's words. Writes
 * mark the store failing (cleared by the next commit that succeeds). */
static int db_err(store *st, bool write, const char *op, acc_err *err)
{
    const char *why = st->db ? sqlite3_errmsg(st->db) : "database not open";
    if (write) {
        st->failing = true;
        st->write_errors++;
        snprintf(st->why, sizeof st->why, "%.100s on %.250s: %.150s", op, st->path, why);
    }
    return acc_err_set(err, ACC_EINTERNAL, NULL, "job store: %s on %s: %s", op, st->path, why);
}

static int read_only_err(const store *st, acc_err *err)
{
    return acc_err_set(err, ACC_EUNAVAIL, NULL, "job store is read-only (%s)", st->why);
}

/* ---- statements ---------------------------------------------------------------- */

/* Bind by a format: t text (NULL: SQL NULL), T text + size_t length,
 * i int64, u uint64, d double (NaN: NULL). */
static int bind(sqlite3_stmt *s, const char *fmt, va_list ap)
{
    int rc = SQLITE_OK;
    for (int i = 1; rc == SQLITE_OK && *fmt; fmt++, i++) {
        switch (*fmt) {
        case 't': {
            const char *v = va_arg(ap, const char *);
            rc = v ? sqlite3_bind_text(s, i, v, -1, SQLITE_STATIC) : sqlite3_bind_null(s, i);
            break;
        }
        case 'T': {
            const char *v = va_arg(ap, const char *);
            size_t n = va_arg(ap, size_t);
            rc = n > INT_MAX ? SQLITE_TOOBIG : sqlite3_bind_text(s, i, v, (int)n, SQLITE_STATIC);
            break;
        }
        case 'i':
            rc = sqlite3_bind_int64(s, i, va_arg(ap, int64_t));
            break;
        case 'u': {
            uint64_t v = va_arg(ap, uint64_t);
            rc = v > INT64_MAX ? SQLITE_RANGE : sqlite3_bind_int64(s, i, (sqlite3_int64)v);
            break;
        }
        case 'd': {
            double v = va_arg(ap, double);
            rc = isfinite(v) ? sqlite3_bind_double(s, i, v) : sqlite3_bind_null(s, i);
            break;
        }
        default:
            rc = SQLITE_MISUSE;
        }
    }
    return rc;
}

static void stmt_done(sqlite3_stmt *s)
{
    sqlite3_reset(s); /* its code repeats the step's, already handled */
    sqlite3_clear_bindings(s);
}

/* Run a statement that returns no rows. */
static int run(store *st, int id, const char *op, acc_err *err, const char *fmt, ...)
{
    sqlite3_stmt *s = st->stmt[id];
    va_list ap;
    va_start(ap, fmt);
    int rc = bind(s, fmt, ap);
    va_end(ap);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(s);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) {
        int e = db_err(st, id != STS_ROLLBACK, op, err);
        stmt_done(s);
        return e;
    }
    stmt_done(s);
    return 0;
}

/* Start a write transaction with the given durability. */
static int tx_begin(store *st, bool full, const char *op, acc_err *err)
{
    if (st->degraded || st->db == NULL)
        return read_only_err(st, err);
    int rc = run(st, full ? STS_SYNC_FULL : STS_SYNC_NORMAL, op, err, "");
    return rc ? rc : run(st, STS_BEGIN, op, err, "");
}

/* The test-only kill of ACCUMD_TEST_KILL_IN_TX (store.h), before a COMMIT. */
static void test_kill_before_commit(store *st, const char *op)
{
    if (st->kill_countdown > 0 && strncmp(op, st->kill_op, strlen(st->kill_op)) == 0 &&
        --st->kill_countdown == 0)
        raise(SIGKILL);
}

static void test_kill_hook_init(store *st)
{
    const char *v = getenv("ACCUMD_TEST_KILL_IN_TX");
    const char *colon = v != NULL ? strrchr(v, ':') : NULL;
    if (colon == NULL || colon == v || (size_t)(colon - v) >= sizeof st->kill_op)
        return;
    memcpy(st->kill_op, v, (size_t)(colon - v));
    st->kill_op[colon - v] = '\0';
    st->kill_countdown = atoi(colon + 1);
}

/* Commit when rc is 0, else roll back; a commit that succeeds ends `failing`. */
static int tx_end(store *st, int rc, const char *op, acc_err *err)
{
    if (rc == 0)
        test_kill_before_commit(st, op);
    if (rc == 0 && (rc = run(st, STS_COMMIT, op, err, "")) == 0) {
        st->failing = false;
        return 0;
    }
    if (!sqlite3_get_autocommit(st->db))
        run(st, STS_ROLLBACK, op, NULL, "");
    return rc;
}

/* An UPDATE that must touch exactly one row. */
static int run_one(store *st, int id, const char *op, acc_err *err, const char *fmt, ...)
{
    sqlite3_stmt *s = st->stmt[id];
    va_list ap;
    va_start(ap, fmt);
    int rc = bind(s, fmt, ap);
    va_end(ap);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(s);
    stmt_done(s);
    if (rc != SQLITE_DONE)
        return db_err(st, true, op, err);
    if (sqlite3_changes(st->db) != 1) {
        st->failing = true;
        st->write_errors++;
        snprintf(st->why, sizeof st->why, "%.100s on %.250s: no such job row", op, st->path);
        return acc_err_set(err, ACC_EINTERNAL, NULL, "job store: %s on %s: no such job row", op, st->path);
    }
    return 0;
}

/* ---- open ------------------------------------------------------------------------ */

static int exec_sql(store *st, const char *sql, const char *op, acc_err *err)
{
    char *msg = NULL;
    if (sqlite3_exec(st->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        int rc = acc_err_set(err, ACC_EINTERNAL, NULL, "job store: %s on %s: %s", op, st->path,
                             msg ? msg : sqlite3_errmsg(st->db));
        sqlite3_free(msg);
        return rc;
    }
    return 0;
}

/* PRAGMA quick_check[(table)] on `db`: "ok", or the first problem found. */
static int check_integrity(sqlite3 *db, const char *path, const char *sql, char *msg, size_t n)
{
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK) {
        snprintf(msg, n, "job store: integrity check on %.300s: %.150s", path, sqlite3_errmsg(db));
        return ACC_EINTERNAL;
    }
    int rc = sqlite3_step(s);
    const char *res = rc == SQLITE_ROW ? (const char *)sqlite3_column_text(s, 0) : NULL;
    int out = 0;
    if (rc != SQLITE_ROW) {
        snprintf(msg, n, "job store: integrity check on %.300s: %.150s", path, sqlite3_errmsg(db));
        out = ACC_EINTERNAL;
    } else if (res == NULL || strcmp(res, "ok")) {
        snprintf(msg, n, "job store: %.300s is damaged: %.150s", path, res ? res : "(no answer)");
        out = ACC_EINTERNAL;
    }
    sqlite3_finalize(s);
    return out;
}

static int check_tables(store *st, acc_err *err)
{
    static const char *const sql[] = {"PRAGMA quick_check(1)", "PRAGMA quick_check(jobs)", "PRAGMA quick_check(meta)"};
    char msg[512];
    /* a new database has no tables yet: the schema check covers it */
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(st->db, "SELECT count(*) FROM sqlite_schema WHERE name IN ('jobs', 'meta')", -1, &s,
                                NULL);
    int have = rc == SQLITE_OK && sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int(s, 0) : -1;
    sqlite3_finalize(s);
    if (have < 0)
        return acc_err_set(err, ACC_EINTERNAL, NULL, "job store: reading the schema of %s: %s", st->path,
                           sqlite3_errmsg(st->db));
    for (int i = have == 2 ? 1 : 0; i < (have == 2 ? 3 : 1); i++)
        if (check_integrity(st->db, st->path, sql[i], msg, sizeof msg) != 0)
            return acc_err_set(err, ACC_EINTERNAL, NULL, "%s", msg);
    return 0;
}

/* SQLite calls this every N virtual-machine steps of the check. */
static int check_progress(void *arg) { return atomic_load(&((store *)arg)->check_stop); }

/* Sleep up to `ms`, awake early when the store closes. */
static void nap(store *st, int ms)
{
    struct timespec ts = {0, 50 * 1000 * 1000};
    for (int t = 0; t < ms && !atomic_load(&st->check_stop); t += 50)
        nanosleep(&ts, NULL);
}

/* The maintenance thread, with a connection of its own: the whole-file
 * check, then a PASSIVE checkpoint of the WAL every STORE_CKPT_MS (it never
 * blocks the writer), so the loop thread's commits never copy the WAL into
 * the database and fsync it themselves. */
static void *check_main(void *arg)
{
    store *st = arg;
    sqlite3 *db = NULL;
    int verdict = -1;
    if (sqlite3_open_v2(st->path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK ||
        sqlite3_busy_timeout(db, STORE_BUSY_MS) != SQLITE_OK) {
        snprintf(st->check_msg, sizeof st->check_msg, "job store: integrity check: open %.300s: %.150s", st->path,
                 db ? sqlite3_errmsg(db) : "out of memory");
        atomic_store(&st->check_state, verdict);
        sqlite3_close(db);
        return NULL;
    }
    sqlite3_progress_handler(db, 10000, check_progress, st);
    if (check_integrity(db, st->path, "PRAGMA quick_check(1)", st->check_msg, sizeof st->check_msg) == 0 ||
        atomic_load(&st->check_stop)) /* interrupted at shutdown: no verdict */
        verdict = 1;
    atomic_store(&st->check_state, verdict);
    sqlite3_progress_handler(db, 0, NULL, NULL);
    bool warned = false;
    while (verdict > 0 && !atomic_load(&st->check_stop)) {
        nap(st, STORE_CKPT_MS);
        int rc = sqlite3_wal_checkpoint_v2(db, NULL, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
        if (rc != SQLITE_OK && rc != SQLITE_BUSY && !warned) /* busy: the next round */
            acc_log(ACC_LOG_WARN, "store", "WAL checkpoint of %s: %s", st->path, sqlite3_errmsg(db));
        warned = rc != SQLITE_OK && rc != SQLITE_BUSY;
    }
    if (sqlite3_close(db) != SQLITE_OK)
        acc_log(ACC_LOG_WARN, "store", "closing the maintenance connection to %s: %s", st->path,
                sqlite3_errmsg(db));
    return NULL;
}

static void start_check(store *st)
{
    atomic_store(&st->check_state, 0);
    int rc = pthread_create(&st->check_thr, NULL, check_main, st);
    if (rc != 0) {
        acc_log(ACC_LOG_WARN, "store", "no maintenance thread (whole-file check, WAL checkpoints): %s",
                strerror(rc));
        return;
    }
    st->check_on = true;
    /* the thread checkpoints now; commits on the loop thread need not */
    if (sqlite3_wal_autocheckpoint(st->db, 0) != SQLITE_OK)
        acc_log(ACC_LOG_WARN, "store", "wal_autocheckpoint on %s: %s", st->path, sqlite3_errmsg(st->db));
}

void store_poll_check(store *st, bool wait)
{
    if (!st->check_on || st->check_seen)
        return;
    while (wait && atomic_load(&st->check_state) == 0)
        nap(st, 50);
    int verdict = atomic_load(&st->check_state);
    if (verdict == 0)
        return;
    st->check_seen = true;
    if (verdict < 0 && !st->degraded) {
        st->degraded = true;
        snprintf(st->why, sizeof st->why, "%s", st->check_msg);
        acc_log(ACC_LOG_ERROR, "store", "read-only mode: %s", st->check_msg);
    }
}

static int read_meta_u64(store *st, const char *key, uint64_t *out, acc_err *err)
{
    sqlite3_stmt *s = NULL;
    *out = 0;
    if (sqlite3_prepare_v2(st->db, "SELECT value FROM meta WHERE key = ?", -1, &s, NULL) != SQLITE_OK ||
        sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC) != SQLITE_OK) {
        sqlite3_finalize(s);
        return db_err(st, false, "reading meta", err);
    }
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW && sqlite3_column_int64(s, 0) > 0)
        *out = (uint64_t)sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : db_err(st, false, "reading meta", err);
}

static int open_db(store *st, acc_err *err)
{
    int rc = sqlite3_open_v2(st->path, &st->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                             NULL);
    if (rc != SQLITE_OK)
        return acc_err_set(err, ACC_EINTERNAL, NULL, "job store: open %s: %s", st->path,
                           st->db ? sqlite3_errmsg(st->db) : sqlite3_errstr(rc));
    if (sqlite3_busy_timeout(st->db, STORE_BUSY_MS) != SQLITE_OK ||
        sqlite3_extended_result_codes(st->db, 1) != SQLITE_OK)
        return db_err(st, false, "configure", err);
    if ((rc = check_tables(st, err)) != 0)
        return rc;
    if ((rc = exec_sql(st, "PRAGMA journal_mode=WAL", "journal_mode=WAL", err)) != 0 ||
        (rc = exec_sql(st, "PRAGMA synchronous=FULL", "synchronous=FULL", err)) != 0 ||
        (rc = exec_sql(st, "BEGIN IMMEDIATE", "create schema", err)) != 0)
        return rc;
    if ((rc = exec_sql(st, schema, "create schema", err)) != 0 ||
        (rc = exec_sql(st, "INSERT OR IGNORE INTO meta(key, value) VALUES('schema_version', 1)", "create schema",
                       err)) != 0 ||
        (rc = exec_sql(st, "COMMIT", "create schema", err)) != 0) {
        if (!sqlite3_get_autocommit(st->db))
            exec_sql(st, "ROLLBACK", "create schema", NULL);
        return rc;
    }
    uint64_t version = 0;
    if ((rc = read_meta_u64(st, "schema_version", &version, err)) != 0)
        return rc;
    if (version != STORE_SCHEMA_VERSION)
        return acc_err_set(err, ACC_EINTERNAL, NULL, "job store: %s has schema version %llu, this accumd knows %d",
                           st->path, (unsigned long long)version, STORE_SCHEMA_VERSION);
    for (int i = 0; i < STS_N; i++)
        if (sqlite3_prepare_v3(st->db, stmt_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &st->stmt[i], NULL) != SQLITE_OK)
            return db_err(st, false, "prepare statements", err);
    return read_meta_u64(st, "next_submit", &st->next_submit, err);
}

int store_init(store *st, const char *state_dir, int history_keep, acc_err *err)
{
    memset(st, 0, sizeof *st);
    test_kill_hook_init(st);
    st->history_keep = history_keep > 0 ? history_keep : 100000;
    if (snprintf(st->state_dir, sizeof st->state_dir, "%s", state_dir) >= (int)sizeof st->state_dir ||
        snprintf(st->path, sizeof st->path, "%s/accumd.db", state_dir) >= (int)sizeof st->path)
        return acc_err_set(err, ACC_EINVAL, "state_dir", "state_dir is too long");
    acc_err e = {0};
    int rc = open_db(st, &e);
    if (rc == 0)
        rc = store_import_round1(st, &e);
    if (rc == 0)
        rc = store_probe(st, &e); /* a full disk shows here, not at the first submission */
    if (rc != 0) {
        st->degraded = true;
        snprintf(st->why, sizeof st->why, "%s", e.msg);
        acc_log(ACC_LOG_ERROR, "store", "read-only mode: %s", e.msg);
    } else {
        start_check(st);
    }
    return 0;
}

void store_close(store *st)
{
    atomic_store(&st->check_stop, true); /* a check in progress ends at its next steps */
    if (st->check_on) {
        store_poll_check(st, true);
        pthread_join(st->check_thr, NULL);
        st->check_on = false;
    }
    for (int i = 0; i < STS_N; i++)
        sqlite3_finalize(st->stmt[i]);
    memset(st->stmt, 0, sizeof st->stmt);
    if (st->db != NULL && sqlite3_close(st->db) != SQLITE_OK)
        acc_log(ACC_LOG_WARN, "store", "closing %s: %s", st->path, sqlite3_errmsg(st->db));
    st->db = NULL;
}

/* ---- writes ------------------------------------------------------------------------- */

static int put_events(store *st, const char *id, const store_event *evs, int nev, acc_err *err)
{
    int rc = 0;
    uint64_t last = 0;
    for (int i = 0; rc == 0 && i < nev; i++) {
        const store_event *e = &evs[i];
        rc = run(st, STS_EVENT_INSERT, "insert event", err, "tutdT", id, e->seq, e->type, e->time, e->json, e->len);
        last = e->seq > last ? e->seq : last;
        if (rc == 0 && e->seq % STORE_PRUNE_EVERY == 0 && e->seq > (uint64_t)st->history_keep)
            rc = run(st, STS_EVENT_PRUNE, "prune events", err, "tu", id, e->seq - (uint64_t)st->history_keep);
    }
    if (rc == 0 && nev > 0)
        rc = run_one(st, STS_LASTSEQ_SET, "update last_seq", err, "ut", last, id);
    return rc;
}

static int put_metric(store *st, const char *id, const store_metric *m, acc_err *err)
{
    /* a resumed run redoes steps: their new figures replace the old */
    int rc = run(st, STS_METRIC_CUT, "insert metrics", err, "ti", id, (int64_t)m->step);
    if (rc == 0)
        rc = run(st, STS_METRIC_INSERT, "insert metrics", err, "tidddddiiu", id, (int64_t)m->step, m->time,
                 m->loss, m->lr, m->grad_norm, m->tokens_per_s, (int64_t)m->micro_batch, (int64_t)m->accum_steps,
                 m->mem_peak);
    if (rc == 0 && m->step % STORE_PRUNE_EVERY == 0 && m->step > st->history_keep)
        rc = run(st, STS_METRIC_PRUNE, "prune metrics", err, "ti", id, (int64_t)(m->step - st->history_keep));
    return rc;
}

static int insert_job(store *st, const store_job_row *r, acc_err *err)
{
    int rc = run(st, STS_JOB_INSERT, "insert job", err, "tutttdttu", r->id, r->submit_seq, r->uid, r->owner,
                 r->state, r->submitted_at, r->spec, r->status, r->last_seq);
    if (rc == 0)
        rc = run(st, STS_COUNTER_SET, "update the id counter", err, "u", r->submit_seq + 1);
    if (rc == 0 && r->submit_seq + 1 > st->next_submit)
        st->next_submit = r->submit_seq + 1;
    return rc;
}

int store_create_job(store *st, const store_job_row *row, const store_event *evs, int nev, acc_err *err)
{
    char op[96];
    snprintf(op, sizeof op, "create job %s", row->id);
    int rc = tx_begin(st, true, op, err);
    if (rc != 0)
        return rc;
    rc = insert_job(st, row, err);
    if (rc == 0)
        rc = put_events(st, row->id, evs, nev, err);
    return tx_end(st, rc, op, err);
}

int store_save_status(store *st, const char *id, const char *state, const char *status, const store_event *evs,
                      int nev, acc_err *err)
{
    char op[96];
    snprintf(op, sizeof op, "save state of job %s", id);
    int rc = tx_begin(st, true, op, err);
    if (rc != 0)
        return rc;
    rc = run_one(st, STS_STATUS_SET, op, err, "ttt", state, status, id);
    if (rc == 0)
        rc = put_events(st, id, evs, nev, err);
    return tx_end(st, rc, op, err);
}

int store_append_events(store *st, const char *id, const store_event *evs, int nev, const store_metric *metric,
                        bool sync, acc_err *err)
{
    char op[96];
    snprintf(op, sizeof op, "append events of job %s", id);
    int rc = tx_begin(st, sync, op, err);
    if (rc != 0)
        return rc;
    rc = put_events(st, id, evs, nev, err);
    if (rc == 0 && metric != NULL)
        rc = put_metric(st, id, metric, err);
    return tx_end(st, rc, op, err);
}

int store_probe(store *st, acc_err *err)
{
    int rc = tx_begin(st, true, "probe write", err);
    if (rc != 0)
        return rc;
    rc = run(st, STS_PROBE, "probe write", err, "d", (double)time(NULL));
    return tx_end(st, rc, "probe write", err);
}

/* ---- reads ----------------------------------------------------------------------------- */

static const char *col_text(sqlite3_stmt *s, int i) { return (const char *)sqlite3_column_text(s, i); }

static int read_rows(store *st, sqlite3_stmt *s, const char *op, acc_err *err, void (*row)(void *, sqlite3_stmt *),
                     void *ctx)
{
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW)
        row(ctx, s);
    int out = rc == SQLITE_DONE ? 0 : db_err(st, false, op, err);
    stmt_done(s);
    return out;
}

static int prepare_read(store *st, int id, const char *op, acc_err *err, const char *fmt, ...)
{
    if (st->stmt[id] == NULL)
        return acc_err_set(err, ACC_EUNAVAIL, NULL, "job store: %s: %s is not open (%s)", op, st->path, st->why);
    va_list ap;
    va_start(ap, fmt);
    int rc = bind(st->stmt[id], fmt, ap);
    va_end(ap);
    if (rc != SQLITE_OK) {
        stmt_done(st->stmt[id]);
        return db_err(st, false, op, err);
    }
    return 0;
}

typedef struct load_ctx {
    void (*fn)(void *, const store_job_row *);
    void *ctx;
} load_ctx;

static void load_row(void *ctx, sqlite3_stmt *s)
{
    load_ctx *l = ctx;
    store_job_row r = {.id = col_text(s, 0), .submit_seq = (uint64_t)sqlite3_column_int64(s, 1),
                       .uid = col_text(s, 2), .owner = col_text(s, 3), .state = col_text(s, 4),
                       .submitted_at = sqlite3_column_double(s, 5), .spec = col_text(s, 6),
                       .status = col_text(s, 7), .last_seq = (uint64_t)sqlite3_column_int64(s, 8)};
    if (r.id == NULL)
        return;
    if (r.spec == NULL)
        r.spec = "";
    if (r.state == NULL)
        r.state = "";
    l->fn(l->ctx, &r);
}

int store_load_all(store *st, void (*fn)(void *ctx, const store_job_row *r), void *ctx, acc_err *err)
{
    if (st->db == NULL)
        return acc_err_set(err, ACC_EUNAVAIL, NULL, "job store: %s is not open (%s)", st->path, st->why);
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(st->db,
                           "SELECT id, submit_seq, uid, owner, state, submitted_at, spec, status, last_seq"
                           " FROM jobs ORDER BY submit_seq",
                           -1, &s, NULL) != SQLITE_OK)
        return db_err(st, false, "load jobs", err);
    load_ctx l = {fn, ctx};
    int rc = read_rows(st, s, "load jobs", err, load_row, &l);
    sqlite3_finalize(s);
    return rc;
}

typedef struct list_ctx {
    void (*fn)(void *, const char *);
    void *ctx;
} list_ctx;

static void list_row(void *ctx, sqlite3_stmt *s)
{
    list_ctx *l = ctx;
    if (col_text(s, 0) != NULL)
        l->fn(l->ctx, col_text(s, 0));
}

int store_list(store *st, const char *state, uint64_t before, int limit, void (*fn)(void *ctx, const char *id),
               void *ctx, acc_err *err)
{
    if (before == 0 || before > INT64_MAX)
        before = INT64_MAX;
    int id = state ? STS_LIST_STATE : STS_LIST_ALL;
    int rc = state ? prepare_read(st, id, "list jobs", err, "tui", state, before, (int64_t)limit)
                   : prepare_read(st, id, "list jobs", err, "ui", before, (int64_t)limit);
    if (rc != 0)
        return rc;
    list_ctx l = {fn, ctx};
    return read_rows(st, st->stmt[id], "list jobs", err, list_row, &l);
}

typedef struct ev_ctx {
    void (*fn)(void *, const store_event *);
    void *ctx;
} ev_ctx;

static void event_row(void *ctx, sqlite3_stmt *s)
{
    ev_ctx *l = ctx;
    store_event e = {.seq = (uint64_t)sqlite3_column_int64(s, 0), .type = col_text(s, 1),
                     .time = sqlite3_column_double(s, 2), .json = col_text(s, 3)};
    if (e.type == NULL || e.json == NULL)
        return;
    e.len = (size_t)sqlite3_column_bytes(s, 3);
    l->fn(l->ctx, &e);
}

int store_load_events(store *st, const char *id, int limit, void (*fn)(void *ctx, const store_event *e), void *ctx,
                      acc_err *err)
{
    int rc = prepare_read(st, STS_EVENTS_TAIL, "load events", err, "ti", id, (int64_t)limit);
    if (rc != 0)
        return rc;
    ev_ctx l = {fn, ctx};
    return read_rows(st, st->stmt[STS_EVENTS_TAIL], "load events", err, event_row, &l);
}

typedef struct metric_ctx {
    void (*fn)(void *, const store_metric *);
    void *ctx;
} metric_ctx;

static double col_real(sqlite3_stmt *s, int i)
{
    return sqlite3_column_type(s, i) == SQLITE_NULL ? NAN : sqlite3_column_double(s, i);
}

static void metric_row(void *ctx, sqlite3_stmt *s)
{
    metric_ctx *l = ctx;
    store_metric m = {.step = sqlite3_column_int(s, 0), .time = col_real(s, 1), .loss = col_real(s, 2),
                      .lr = col_real(s, 3), .grad_norm = col_real(s, 4), .tokens_per_s = col_real(s, 5),
                      .micro_batch = sqlite3_column_int(s, 6), .accum_steps = sqlite3_column_int(s, 7),
                      .mem_peak = (uint64_t)sqlite3_column_int64(s, 8)};
    l->fn(l->ctx, &m);
}

int store_load_metrics(store *st, const char *id, void (*fn)(void *ctx, const store_metric *m), void *ctx,
                       acc_err *err)
{
    int rc = prepare_read(st, STS_METRICS_ALL, "load metrics", err, "t", id);
    if (rc != 0)
        return rc;
    metric_ctx l = {fn, ctx};
    return read_rows(st, st->stmt[STS_METRICS_ALL], "load metrics", err, metric_row, &l);
}

/* ---- round-1 import ------------------------------------------------------------------------ */

static bool valid_id(const char *name)
{
    if (name[0] == '\0' || name[0] == '.' || strlen(name) >= 32)
        return false;
    for (const char *p = name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-'))
            return false;
    return true;
}

static bool valid_type(const char *t)
{
    size_t n = t ? strlen(t) : 0;
    if (n == 0 || n >= 16)
        return false;
    for (; *t; t++)
        if (!((*t >= 'a' && *t <= 'z') || *t == '_'))
            return false;
    return true;
}

/* RFC 3339 UTC as job_time_json writes it; 0 when it is not. */
static double parse_time(const char *s)
{
    struct tm tm = {0};
    const char *p = s ? strptime(s, "%Y-%m-%dT%H:%M:%S", &tm) : NULL;
    if (p == NULL)
        return 0;
    double frac = 0;
    if (*p == '.')
        frac = strtod(p, NULL);
    return (double)timegm(&tm) + (frac > 0 && frac < 1 ? frac : 0);
}

static bool known_state(const char *s)
{
    static const char *const names[] = {"queued", "running", "succeeded", "failed", "cancelled"};
    for (size_t i = 0; s && i < sizeof names / sizeof *names; i++)
        if (!strcmp(s, names[i]))
            return true;
    return false;
}

typedef struct r1_job {
    const char *id;
    char *spec, *status, *events;
    size_t spec_len, status_len, events_len;
    uint64_t last_seq;
    int torn, refused;
} r1_job;

/* One round-1 event line: refused unless it is an object of this job whose
 * seq follows the previous accepted one by at most ROUND1_MAX_SEQ_STEP. */
static int import_line(store *st, r1_job *j, const char *line, size_t len, acc_err *err)
{
    json_t *ev = json_loadb(line, len, JSON_REJECT_DUPLICATES, NULL);
    json_t *seqv = json_object_get(ev, "seq");
    const char *type = json_string_value(json_object_get(ev, "type"));
    const char *job = json_string_value(json_object_get(ev, "job"));
    json_int_t seq = json_is_integer(seqv) ? json_integer_value(seqv) : -1;
    if (!json_is_object(ev) || seq <= (json_int_t)j->last_seq ||
        (uint64_t)seq > j->last_seq + ROUND1_MAX_SEQ_STEP || !valid_type(type) || job == NULL ||
        strcmp(job, j->id)) {
        json_decref(ev);
        j->refused++;
        return 0;
    }
    store_event e = {.seq = (uint64_t)seq, .type = type,
                     .time = parse_time(json_string_value(json_object_get(ev, "time"))), .json = line, .len = len};
    int rc = put_events(st, j->id, &e, 1, err);
    json_t *stepv = json_object_get(ev, "step");
    if (rc == 0 && !strcmp(type, "step") && json_is_integer(stepv) && json_integer_value(stepv) >= 0 &&
        json_integer_value(stepv) <= INT_MAX) {
        json_t *v;
        store_metric m = {.step = (int)json_integer_value(stepv), .time = e.time,
                          .loss = (v = json_object_get(ev, "loss")) && json_is_number(v) ? json_number_value(v) : NAN,
                          .lr = json_number_value(json_object_get(ev, "lr")),
                          .grad_norm = json_number_value(json_object_get(ev, "grad_norm")),
                          .tokens_per_s = json_number_value(json_object_get(ev, "tokens_per_s")),
                          .micro_batch = (int)json_integer_value(json_object_get(ev, "micro_batch")),
                          .accum_steps = (int)json_integer_value(json_object_get(ev, "accum_steps"))};
        rc = put_metric(st, j->id, &m, err);
    }
    if (rc == 0)
        j->last_seq = (uint64_t)seq;
    json_decref(ev);
    return rc;
}

static int import_events(store *st, r1_job *j, acc_err *err)
{
    char *p = j->events, *end = j->events + j->events_len;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        if (nl == NULL) { /* no newline: a crash cut this append short */
            j->torn++;
            break;
        }
        int rc = nl > p ? import_line(st, j, p, (size_t)(nl - p), err) : 0;
        if (rc != 0)
            return rc;
        p = nl + 1;
    }
    return 0;
}

static int read_r1_file(const char *dir, const char *id, const char *leaf, char **out, size_t *len)
{
    char path[PATH_MAX];
    acc_err e = {0};
    *out = NULL;
    *len = 0;
    if (snprintf(path, sizeof path, "%s/%s/%s", dir, id, leaf) >= (int)sizeof path)
        return -1;
    int rc = fsu_read_all(path, out, len, ROUND1_MAX_FILE, &e);
    if (rc != 0 && e.code != ACC_ENOTFOUND)
        acc_log(ACC_LOG_WARN, "store", "import: job %s: %s", id, e.msg);
    return rc;
}

static int import_job(store *st, const char *dir, const char *id, uint64_t *n, acc_err *err)
{
    r1_job j = {.id = id};
    read_r1_file(dir, id, "spec.json", &j.spec, &j.spec_len);
    read_r1_file(dir, id, "status.json", &j.status, &j.status_len);
    read_r1_file(dir, id, "events.ndjson", &j.events, &j.events_len);
    json_t *status = j.status ? json_loadb(j.status, j.status_len, 0, NULL) : NULL;
    const char *state = json_string_value(json_object_get(status, "state"));
    json_int_t seq = json_integer_value(json_object_get(status, "submit_seq"));
    if (seq <= 0) /* round 1 ids are j<seq> */
        seq = (json_int_t)strtoull(id[0] == 'j' ? id + 1 : id, NULL, 10);
    /* a damaged spec is kept as it is: the loader fails the job, saying why */
    store_job_row r = {.id = id, .submit_seq = (uint64_t)seq, .state = known_state(state) ? state : "queued",
                       .submitted_at = json_number_value(json_object_get(status, "submitted_at")),
                       .spec = j.spec ? j.spec : "", .status = json_is_object(status) ? j.status : NULL};
    int rc = 0;
    if (seq <= 0) {
        acc_log(ACC_LOG_WARN, "store", "import: job %s skipped: no submission number", id);
    } else if ((rc = insert_job(st, &r, err)) == 0 && j.events != NULL && (rc = import_events(st, &j, err)) == 0) {
        if (j.torn || j.refused)
            acc_log(ACC_LOG_WARN, "store", "import: job %s: %d torn and %d refused event line(s) dropped", id,
                    j.torn, j.refused);
    }
    if (rc == 0 && seq > 0)
        (*n)++;
    json_decref(status);
    free(j.spec);
    free(j.status);
    free(j.events);
    return rc;
}

/* jobs/ -> jobs.imported (or .1, .2 ... when taken), durably. */
static int move_aside(store *st, const char *dir, acc_err *err)
{
    char to[PATH_MAX + 32];
    struct stat sb;
    snprintf(to, sizeof to, "%s/jobs.imported", st->state_dir);
    for (int i = 1; lstat(to, &sb) == 0 && i < 1000; i++)
        snprintf(to, sizeof to, "%s/jobs.imported.%d", st->state_dir, i);
    if (rename(dir, to) != 0)
        return acc_err_set(err, ACC_EIO, NULL, "import: moving %s to %s: %s", dir, to, strerror(errno));
    acc_log(ACC_LOG_INFO, "store", "round-1 job files kept in %s", to);
    return fsu_fsync_dir(st->state_dir, err);
}

int store_import_round1(store *st, acc_err *err)
{
    char dir[PATH_MAX + 8];
    snprintf(dir, sizeof dir, "%s/jobs", st->state_dir);
    struct stat sb;
    if (lstat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return 0;
    uint64_t done = 0;
    int rc = read_meta_u64(st, "imported_round1", &done, err);
    if (rc != 0)
        return rc;
    if (done > 0) /* imported, but the move aside did not happen (crash) */
        return move_aside(st, dir, err);
    DIR *d = opendir(dir);
    if (d == NULL)
        return acc_err_set(err, ACC_EIO, NULL, "import: opendir %s: %s", dir, strerror(errno));
    uint64_t n = 0;
    if ((rc = tx_begin(st, true, "import round-1 jobs", err)) != 0) {
        closedir(d);
        return rc;
    }
    struct dirent *e;
    while (rc == 0 && (e = readdir(d)) != NULL)
        if (valid_id(e->d_name))
            rc = import_job(st, dir, e->d_name, &n, err);
    closedir(d);
    if (rc == 0)
        rc = exec_sql(st, "INSERT OR REPLACE INTO meta(key, value) VALUES('imported_round1', 1)",
                      "import round-1 jobs", err);
    if ((rc = tx_end(st, rc, "import round-1 jobs", err)) != 0)
        return rc;
    st->imported = (int)n;
    acc_log(ACC_LOG_INFO, "store", "imported %llu round-1 job(s) from %s into %s", (unsigned long long)n, dir,
            st->path);
    return move_aside(st, dir, err);
}
