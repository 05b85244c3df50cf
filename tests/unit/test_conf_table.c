/* conf_table (issue 19): the config keys' one table. Every row is checked
 * (names unique, a default that its own parser accepts, a bad value refused
 * naming the key), the defaults are the values accumd had before the table
 * (an independent copy of the old hand-written defaults), and
 * docs/operations.md's "Every config key" lists exactly the table's keys,
 * in its order, with its defaults: a key added without its doc line fails. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"

/* The defaults as conf_defaults wrote them by hand before the table. */
static void old_defaults(acc_conf *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->listen, sizeof c->listen, "127.0.0.1:8470");
    snprintf(c->listen_host, sizeof c->listen_host, "127.0.0.1");
    c->listen_port = 8470;
    snprintf(c->state_dir, sizeof c->state_dir, "/var/lib/accumd");
    c->devices = CONF_DEVICES_AUTO;
    c->cpu_devices = 1;
    c->cpu_device_memory = 2ULL << 30;
    c->max_body = 1 << 20;
    c->max_connections = 1024;
    c->max_connections_per_ip = 600;
    c->connection_timeout = 60;
    c->header_timeout = 10;
    c->request_timeout = 120;
    c->max_pending_connections = 0;
    c->shutdown_grace = 30;
    c->checkpoint_keep = 2;
    c->event_ring = 4096;
    c->history_keep = 100000;
    c->worker_processes = true;
    c->worker_heartbeat_timeout = 10;
    snprintf(c->mpi_launcher, sizeof c->mpi_launcher, "mpirun");
    c->max_queued_jobs = 10000;
    c->user_max_queued = 1000;
    c->user_max_streams = 64;
    c->cancel_grace = 30;
    c->rank_watchdog_factor = 10;
    c->rank_watchdog_min = 600;
    snprintf(c->log_level, sizeof c->log_level, "info");
    c->render_time_limit_ms = 2000;
    c->tokenizer_match_limit = 1000000;
    c->heavy_requests_max = 2;
    c->heavy_requests_per_user = 1;
    c->generate_nice = 10; /* keys added since: their defaults */
}

static char *dump(const acc_conf *c)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    assert_non_null(f);
    conf_dump(c, f);
    fclose(f);
    return buf;
}

static void test_defaults_unchanged(void **state)
{
    (void)state;
    acc_conf now, before;
    conf_defaults(&now);
    old_defaults(&before);
    char *a = dump(&now), *b = dump(&before);
    assert_string_equal(a, b);
    free(a);
    free(b);
    /* and the fields conf_dump does not print (the parsed listen, the flags) */
    assert_string_equal(now.listen_host, before.listen_host);
    assert_int_equal(now.listen_port, before.listen_port);
    assert_false(now.set_data_roots || now.set_output_root || now.set_token_file || now.set_threads ||
                 now.set_pending || now.set_streams);
}

static void test_rows(void **state)
{
    (void)state;
    assert_true(conf_table_len > 40);
    for (size_t i = 0; i < conf_table_len; i++) {
        const conf_row *r = &conf_table[i];
        assert_non_null(r->name);
        assert_true(r->doc != NULL && r->doc[0] != '\0' && strchr(r->doc, '\n') == NULL && strchr(r->doc, '|') == NULL);
        for (size_t j = 0; j < i; j++)
            if (!strcmp(conf_table[j].name, r->name))
                fail_msg("config key '%s' has two rows", r->name);
        assert_ptr_equal(conf_key_find(r->name), r);
        assert_true(r->off + r->size <= sizeof(acc_conf));
        if (r->type == CONF_ENUM)
            assert_non_null(r->names);
        if (r->type == CONF_INT || r->type == CONF_BYTES)
            assert_true(r->lo <= r->hi);
        /* a derived default needs the flag that tells finalize it was set */
        if (r->def == NULL && r->set_flag == (size_t)-1)
            fail_msg("config key '%s' has no default and no set flag", r->name);
        acc_conf c;
        acc_err err = {0};
        conf_defaults(&c);
        char *before = dump(&c);
        if (r->def != NULL) { /* the default goes through the key's own parser and validator */
            if (conf_set(&c, r->name, r->def, &err) != 0)
                fail_msg("default '%s' of '%s' refused: %s", r->def, r->name, err.msg);
            char *after = dump(&c);
            assert_string_equal(before, after); /* and it is the value conf_defaults gave */
            free(after);
        }
        free(before);
        /* a value of the wrong kind is refused, naming the key */
        const char *bad = r->type == CONF_STR ? NULL : "not-a-value";
        if (r->flags & CONF_F_NONEMPTY)
            bad = "";
        if (bad != NULL) {
            acc_err_clear(&err);
            assert_int_equal(conf_set(&c, r->name, bad, &err), ACC_EINVAL);
            assert_string_equal(err.field, r->name);
            assert_non_null(strstr(err.msg, r->name));
        }
        if (r->type == CONF_INT && r->hi < UINT64_MAX) { /* one past the range */
            char v[32];
            snprintf(v, sizeof v, "%llu", (unsigned long long)r->hi + 1);
            assert_int_equal(conf_set(&c, r->name, v, &err), ACC_EINVAL);
            snprintf(v, sizeof v, "%llu", (unsigned long long)r->hi);
            assert_int_equal(conf_set(&c, r->name, v, &err), 0);
        }
    }
    assert_null(conf_key_find("no_such_key"));
    assert_null(conf_key_find(""));
}

/* The rows of docs/operations.md's "## Every config key" table:
 * "| `key` | `default` or derived ... | what |". */
static void test_docs_list_every_key(void **state)
{
    (void)state;
    const char *src = getenv("ACCUMD_SRC");
    assert_non_null(src);
    char path[4096];
    snprintf(path, sizeof path, "%s/docs/operations.md", src);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[2048];
    int in = 0;
    size_t n = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        if (!strncmp(line, "## ", 3)) {
            in = !strncmp(line, "## Every config key", 19);
            continue;
        }
        if (!in || strncmp(line, "| `", 3) != 0)
            continue;
        char *key = line + 3, *end = strchr(key, '`');
        assert_non_null(end);
        *end = '\0';
        if (n >= conf_table_len)
            fail_msg("docs/operations.md documents '%s', which is not a config key", key);
        if (strcmp(key, conf_table[n].name) != 0)
            fail_msg("docs/operations.md row %zu is '%s', the table's is '%s' (same keys, same order)", n + 1, key,
                     conf_table[n].name);
        /* the default column: the table's default in backquotes, or "derived" */
        char *col = strstr(end + 1, "| ");
        assert_non_null(col);
        col += 2;
        const conf_row *r = &conf_table[n];
        if (r->def == NULL) {
            if (strncmp(col, "derived", 7) != 0)
                fail_msg("docs: default of '%s' must read 'derived ...'", key);
        } else {
            char want[256];
            snprintf(want, sizeof want, "`%s` |", r->def[0] ? r->def : "\"\"");
            if (strncmp(col, want, strlen(want)) != 0)
                fail_msg("docs: default of '%s' must be %s", key, want);
        }
        n++;
    }
    fclose(f);
    if (n != conf_table_len)
        fail_msg("docs/operations.md lists %zu config keys, the table has %zu (first missing: '%s')", n, conf_table_len,
                 conf_table[n].name);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_unchanged),
        cmocka_unit_test(test_rows),
        cmocka_unit_test(test_docs_list_every_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
