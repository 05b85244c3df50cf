/* store: a job written and read back (rows, events, metrics, lists by
 * page), kept across a reopen; the round-1 import (torn last line dropped,
 * a garbage seq refused, a damaged spec kept, bad directory names ignored,
 * files moved aside, done once); read-only mode on a corrupt database; a
 * write the database refuses is an error naming the operation and file,
 * and the store writes again once it can. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <fcntl.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store.h"

typedef struct seen {
    int n;
    char id[8][32], state[8][16], spec[8][256], status[8][256];
    uint64_t seq[8], last_seq[8];
} seen;

static void on_job(void *ctx, const store_job_row *r)
{
    seen *s = ctx;
    if (s->n >= 8)
        return;
    snprintf(s->id[s->n], sizeof s->id[0], "%s", r->id);
    snprintf(s->state[s->n], sizeof s->state[0], "%s", r->state);
    snprintf(s->spec[s->n], sizeof s->spec[0], "%s", r->spec);
    snprintf(s->status[s->n], sizeof s->status[0], "%s", r->status ? r->status : "(null)");
    s->seq[s->n] = r->submit_seq;
    s->last_seq[s->n] = r->last_seq;
    s->n++;
}

typedef struct evs {
    int n;
    uint64_t seq[16];
    char json[16][128];
} evs;

static void on_event(void *ctx, const store_event *e)
{
    evs *v = ctx;
    if (v->n >= 16)
        return;
    v->seq[v->n] = e->seq;
    snprintf(v->json[v->n], sizeof v->json[0], "%.*s", (int)e->len, e->json);
    v->n++;
}

typedef struct mets {
    int n;
    store_metric m[16];
} mets;

static void on_metric(void *ctx, const store_metric *m)
{
    mets *v = ctx;
    if (v->n < 16)
        v->m[v->n++] = *m;
}

typedef struct ids {
    int n;
    char id[8][32];
} ids;

static void on_id(void *ctx, const char *id)
{
    ids *v = ctx;
    if (v->n < 8)
        snprintf(v->id[v->n++], sizeof v->id[0], "%s", id);
}

static void tmpdir(char *dir)
{
    strcpy(dir, "/tmp/acc-store-XXXXXX");
    assert_non_null(mkdtemp(dir));
}

static void rm_rf(const char *dir)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static store_event ev(uint64_t seq, const char *type, const char *json)
{
    return (store_event){.seq = seq, .type = type, .time = 1.5, .json = json, .len = strlen(json)};
}

static void add_job(store *st, const char *id, uint64_t seq, const char *state)
{
    acc_err err = {0};
    store_job_row r = {.id = id, .submit_seq = seq, .state = state, .submitted_at = 100.0 + (double)seq,
                       .spec = "{\"a\":1}", .status = "{\"state\":\"queued\"}"};
    store_event e = ev(1, "state", "{\"seq\":1}");
    assert_int_equal(store_create_job(st, &r, &e, 1, &err), 0);
}

static void test_roundtrip(void **state)
{
    char dir[32];
    tmpdir(dir);
    store st;
    acc_err err = {0};
    assert_int_equal(store_init(&st, dir, 1000, &err), 0);
    assert_false(st.degraded);
    add_job(&st, "j000001", 1, "queued");
    store_event e2 = ev(2, "state", "{\"seq\":2}");
    assert_int_equal(store_save_status(&st, "j000001", "running", "{\"state\":\"running\"}", &e2, 1, &err), 0);
    store_metric m3 = {.step = 1, .time = 2.0, .loss = NAN, .lr = 0.1, .micro_batch = 2, .accum_steps = 4,
                       .mem_peak = 1234};
    store_event e3 = ev(3, "step", "{\"seq\":3}");
    assert_int_equal(store_append_events(&st, "j000001", &e3, 1, &m3, false, &err), 0);
    /* a resumed run redoes step 1: the new figures replace the old */
    m3.loss = 5.5;
    store_event e4 = ev(4, "step", "{\"seq\":4}");
    assert_int_equal(store_append_events(&st, "j000001", &e4, 1, &m3, true, &err), 0);
    add_job(&st, "j000002", 2, "queued");
    add_job(&st, "j000003", 3, "queued");
    assert_int_equal(store_save_status(&st, "j000003", "succeeded", "{}", NULL, 0, &err), 0);
    /* a state change of a job that is not there is an error, not a no-op */
    assert_int_not_equal(store_save_status(&st, "j000009", "failed", "{}", NULL, 0, &err), 0);
    assert_int_equal(err.code, ACC_EINTERNAL);
    assert_non_null(strstr(err.msg, "j000009"));
    store_close(&st);

    assert_int_equal(store_init(&st, dir, 1000, &err), 0);
    assert_false(st.degraded);
    assert_int_equal(st.next_submit, 4);
    seen s = {0};
    assert_int_equal(store_load_all(&st, on_job, &s, &err), 0);
    assert_int_equal(s.n, 3);
    assert_string_equal(s.id[0], "j000001");
    assert_string_equal(s.state[0], "running");
    assert_string_equal(s.spec[0], "{\"a\":1}");
    assert_string_equal(s.status[0], "{\"state\":\"running\"}");
    assert_int_equal(s.last_seq[0], 4);
    assert_string_equal(s.state[2], "succeeded");
    evs v = {0};
    assert_int_equal(store_load_events(&st, "j000001", 3, on_event, &v, &err), 0);
    assert_int_equal(v.n, 3); /* the last 3, oldest first */
    assert_int_equal(v.seq[0], 2);
    assert_int_equal(v.seq[2], 4);
    assert_string_equal(v.json[2], "{\"seq\":4}");
    mets mt = {0};
    assert_int_equal(store_load_metrics(&st, "j000001", on_metric, &mt, &err), 0);
    assert_int_equal(mt.n, 1);
    assert_true(mt.m[0].loss == 5.5);
    assert_int_equal(mt.m[0].mem_peak, 1234);
    assert_int_equal(mt.m[0].accum_steps, 4);
    /* newest first, by pages, by state */
    ids l = {0};
    assert_int_equal(store_list(&st, NULL, 0, 2, on_id, &l, &err), 0);
    assert_int_equal(l.n, 2);
    assert_string_equal(l.id[0], "j000003");
    assert_string_equal(l.id[1], "j000002");
    l.n = 0;
    assert_int_equal(store_list(&st, NULL, 2, 2, on_id, &l, &err), 0);
    assert_int_equal(l.n, 1);
    assert_string_equal(l.id[0], "j000001");
    l.n = 0;
    assert_int_equal(store_list(&st, "queued", 0, 10, on_id, &l, &err), 0);
    assert_int_equal(l.n, 1);
    assert_string_equal(l.id[0], "j000002");
    store_close(&st);
    rm_rf(dir);
}

static void write_file(const char *dir, const char *id, const char *leaf, const char *text)
{
    char path[256];
    snprintf(path, sizeof path, "%s/jobs/%s", dir, id);
    mkdir(path, 0750);
    snprintf(path, sizeof path, "%s/jobs/%s/%s", dir, id, leaf);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
}

static void test_import_round1(void **state)
{
    char dir[32], path[256];
    tmpdir(dir);
    snprintf(path, sizeof path, "%s/jobs", dir);
    assert_int_equal(mkdir(path, 0750), 0);
    write_file(dir, "j000001", "spec.json", "{\"name\":\"one\"}");
    write_file(dir, "j000001", "status.json",
               "{\"id\":\"j000001\",\"state\":\"succeeded\",\"submit_seq\":1,\"submitted_at\":1000.5}");
    write_file(dir, "j000001", "events.ndjson",
               "{\"seq\":1,\"type\":\"state\",\"time\":\"2026-12-02T12:00:00.250Z\",\"job\":\"j000001\"}\n"
               "{\"seq\":2,\"type\":\"step\",\"job\":\"j000001\",\"step\":1,\"loss\":4.5,\"lr\":0.1}\n"
               "{\"seq\":3,\"type\":\"done\",\"job\":\"j000001\"}\n"
               "{\"seq\":4,\"type\":\"sta"); /* torn: a crash mid-append */
    write_file(dir, "j000002", "spec.json", "{\"name\": broken");
    write_file(dir, "j000002", "status.json", "{\"state\":\"queued\",\"submit_seq\":2}");
    write_file(dir, "j000002", "events.ndjson",
               "{\"seq\":1,\"type\":\"state\",\"job\":\"j000002\"}\n"
               "{\"seq\":999999999999,\"type\":\"log\",\"job\":\"j000002\"}\n"
               "not json at all\n"
               "{\"seq\":2,\"type\":\"log\",\"job\":\"j000999\"}\n"
               "{\"seq\":2,\"type\":\"log\",\"job\":\"j000002\"}\n"
               "{\"seq\":3,\"type\":\"log\",\"job\":\"j000002\"}\n");
    snprintf(path, sizeof path, "mkdir -p %s/jobs/.hidden %s/jobs/BAD_NAME", dir, dir);
    assert_int_equal(system(path), 0);

    store st;
    acc_err err = {0};
    assert_int_equal(store_init(&st, dir, 1000, &err), 0);
    assert_false(st.degraded);
    assert_int_equal(st.imported, 2);
    assert_int_equal(st.next_submit, 3);
    seen s = {0};
    assert_int_equal(store_load_all(&st, on_job, &s, &err), 0);
    assert_int_equal(s.n, 2);
    assert_string_equal(s.state[0], "succeeded");
    assert_int_equal(s.last_seq[0], 3); /* the torn line is not an event */
    assert_string_equal(s.spec[1], "{\"name\": broken"); /* kept as it was: the loader fails the job */
    assert_string_equal(s.state[1], "queued");
    assert_int_equal(s.last_seq[1], 3); /* 999999999999 refused: numbering goes on at 2, 3 */
    evs v = {0};
    assert_int_equal(store_load_events(&st, "j000002", 100, on_event, &v, &err), 0);
    assert_int_equal(v.n, 3);
    assert_int_equal(v.seq[1], 2);
    assert_int_equal(v.seq[2], 3);
    mets mt = {0};
    assert_int_equal(store_load_metrics(&st, "j000001", on_metric, &mt, &err), 0);
    assert_int_equal(mt.n, 1);
    assert_true(mt.m[0].loss == 4.5);
    store_close(&st);
    /* moved aside, not deleted; a second start imports nothing */
    snprintf(path, sizeof path, "%s/jobs.imported/j000001/events.ndjson", dir);
    assert_int_equal(access(path, F_OK), 0);
    snprintf(path, sizeof path, "%s/jobs", dir);
    assert_int_not_equal(access(path, F_OK), 0);
    assert_int_equal(store_init(&st, dir, 1000, &err), 0);
    assert_int_equal(st.imported, 0);
    s.n = 0;
    assert_int_equal(store_load_all(&st, on_job, &s, &err), 0);
    assert_int_equal(s.n, 2);
    store_close(&st);
    rm_rf(dir);
}

/* Overwrite `len` bytes at `off` of the database with garbage. */
static void damage(const char *dir, off_t off, size_t len)
{
    char path[256], junk[8192];
    snprintf(path, sizeof path, "%s/accumd.db", dir);
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (char)(0x5a ^ (i * 31));
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, junk, len, off), (ssize_t)len);
    assert_int_equal(close(fd), 0);
}

static void make_db(const char *dir)
{
    store st;
    acc_err err = {0};
    assert_int_equal(store_init(&st, dir, 1000, &err), 0);
    for (int i = 1; i <= 50; i++) {
        char id[16];
        snprintf(id, sizeof id, "j%06d", i);
        add_job(&st, id, (uint64_t)i, "succeeded");
    }
    store_close(&st); /* the last close checkpoints the WAL into the file */
}

static void expect_read_only(const char *dir)
{
    store st;
    acc_err err = {0};
    assert_int_equal(store_init(&st, dir, 1000, &err), 0); /* not fatal */
    store_poll_check(&st, true); /* the whole-file check's verdict */
    assert_true(st.degraded);
    assert_non_null(strstr(st.why, "accumd.db"));
    store_job_row r = {.id = "j000099", .submit_seq = 99, .state = "queued", .spec = "{}"};
    assert_int_equal(store_create_job(&st, &r, NULL, 0, &err), ACC_EUNAVAIL);
    assert_non_null(strstr(err.msg, "read-only"));
    store_close(&st);
}

static void test_corrupt_read_only(void **state)
{
    char dir[32];
    tmpdir(dir);
    make_db(dir);
    damage(dir, 0, 100); /* the header */
    expect_read_only(dir);
    rm_rf(dir);
    tmpdir(dir);
    make_db(dir);
    damage(dir, 4096, 4096); /* a page in the middle */
    expect_read_only(dir);
    rm_rf(dir);
}

static void test_write_refused(void **state)
{
    char dir[32], path[256];
    tmpdir(dir);
    store st;
    acc_err err = {0};
    assert_int_equal(store_init(&st, dir, 1000, &err), 0);
    add_job(&st, "j000001", 1, "queued");
    /* another writer holds the database: our write fails, it does not wait */
    sqlite3 *other = NULL;
    snprintf(path, sizeof path, "%s/accumd.db", dir);
    assert_int_equal(sqlite3_open(path, &other), SQLITE_OK);
    assert_int_equal(sqlite3_exec(other, "BEGIN EXCLUSIVE", NULL, NULL, NULL), SQLITE_OK);
    store_event e = ev(2, "state", "{\"seq\":2}");
    assert_int_equal(store_save_status(&st, "j000001", "succeeded", "{}", &e, 1, &err), ACC_EINTERNAL);
    assert_non_null(strstr(err.msg, "save state of job j000001"));
    assert_non_null(strstr(err.msg, "accumd.db"));
    assert_true(st.failing);
    assert_int_equal(st.write_errors, 1);
    assert_int_not_equal(store_probe(&st, &err), 0);
    assert_int_equal(sqlite3_exec(other, "ROLLBACK", NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_close(other), SQLITE_OK);
    assert_int_equal(store_probe(&st, &err), 0);
    assert_false(st.failing);
    /* nothing of the refused change was written */
    seen s = {0};
    assert_int_equal(store_load_all(&st, on_job, &s, &err), 0);
    assert_string_equal(s.state[0], "queued");
    assert_int_equal(s.last_seq[0], 1);
    store_close(&st);
    rm_rf(dir);
}

static int count_events(void *ctx, int ncol, char **val, char **names)
{
    *(long *)ctx = val[0] ? atol(val[0]) : -1;
    return 0;
}

/* history_keep: a job's events and metrics rows are pruned to the newest. */
static void test_history_keep(void **state)
{
    char dir[32];
    tmpdir(dir);
    store st;
    acc_err err = {0};
    assert_int_equal(store_init(&st, dir, 100, &err), 0);
    add_job(&st, "j000001", 1, "running");
    for (int s = 2; s <= 1024; s++) {
        char json[64];
        snprintf(json, sizeof json, "{\"seq\":%d}", s);
        store_event e = ev((uint64_t)s, "step", json);
        store_metric m = {.step = s, .loss = 1.0, .lr = 0.1};
        assert_int_equal(store_append_events(&st, "j000001", &e, 1, &m, false, &err), 0);
    }
    long n = 0;
    assert_int_equal(sqlite3_exec(st.db, "SELECT count(*) FROM events", count_events, &n, NULL), SQLITE_OK);
    assert_int_equal(n, 100); /* pruned at seq 1024: 925..1024 are left */
    assert_int_equal(sqlite3_exec(st.db, "SELECT min(seq) FROM events", count_events, &n, NULL), SQLITE_OK);
    assert_int_equal(n, 925);
    assert_int_equal(sqlite3_exec(st.db, "SELECT count(*) FROM metrics", count_events, &n, NULL), SQLITE_OK);
    assert_int_equal(n, 100);
    store_close(&st);
    rm_rf(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_import_round1),
        cmocka_unit_test(test_corrupt_read_only),
        cmocka_unit_test(test_write_refused),
        cmocka_unit_test(test_history_keep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
