/* store: files of a job written and read back, torn event log tolerated
 * by the reader, bad directory names ignored. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store.h"

typedef struct seen {
    int n;
    char id[64], spec[256], status[256], events[512];
} seen;

static void on_job(void *ctx, const store_job_files *f)
{
    seen *s = ctx;
    s->n++;
    snprintf(s->id, sizeof s->id, "%s", f->id);
    snprintf(s->spec, sizeof s->spec, "%s", f->spec);
    snprintf(s->status, sizeof s->status, "%s", f->status ? f->status : "");
    snprintf(s->events, sizeof s->events, "%s", f->events ? f->events : "");
}

static void test_roundtrip(void **state)
{
    char dir[] = "/tmp/acc-store-XXXXXX";
    assert_non_null(mkdtemp(dir));
    store st;
    acc_err err = {0};
    assert_int_equal(store_init(&st, dir, &err), 0);
    assert_int_equal(store_create_job(&st, "j000001", "{\"a\":1}", 7, "{\"state\":\"queued\"}", 18, &err), 0);
    assert_int_equal(store_save_status(&st, "j000001", "{\"state\":\"running\"}", 19, &err), 0);
    int fd;
    assert_int_equal(store_open_events(&st, "j000001", &fd, &err), 0);
    assert_int_equal(store_append_event(fd, "{\"seq\":1}", 9, true, &err), 0);
    assert_int_equal(store_append_event(fd, "{\"seq\":2}", 9, false, &err), 0);
    assert_int_equal(write(fd, "{\"seq\":3", 8), 8); /* a torn line */
    close(fd);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "mkdir -p %s/jobs/.hidden %s/jobs/BAD_NAME", dir, dir);
    assert_int_equal(system(cmd), 0);
    seen s = {0};
    assert_int_equal(store_load_all(&st, on_job, &s, &err), 0);
    assert_int_equal(s.n, 1);
    assert_string_equal(s.id, "j000001");
    assert_string_equal(s.spec, "{\"a\":1}");
    assert_string_equal(s.status, "{\"state\":\"running\"}");
    assert_string_equal(s.events, "{\"seq\":1}\n{\"seq\":2}\n{\"seq\":3");
    snprintf(cmd, sizeof cmd, "test ! -e %s/jobs/j000001/status.json.tmp* && rm -rf %s", dir, dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
