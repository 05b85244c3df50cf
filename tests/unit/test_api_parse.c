/* api_parse: routing and strict query/header parsing without a server
 * (issue 16 defects 9, 10, 13, 14, 15), and the safe echo of request bytes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "api_parse.h"

/* Parse METHOD PATH with one query pair (key=value, value NULL = bare key)
 * and one header; returns the status (0 when routed). */
static int parse(const char *method, const char *path, size_t path_len, const char *qk, const char *qv,
                 const char *hk, const char *hv, api_call *c, char **msg)
{
    api_kv q = {.key = qk, .key_len = qk ? strlen(qk) : 0, .value = qv, .value_len = qv ? strlen(qv) : 0};
    api_kv h = {.key = hk, .key_len = hk ? strlen(hk) : 0, .value = hv, .value_len = hv ? strlen(hv) : 0};
    api_request in = {.method = method, .path = path, .path_len = path_len, .query = &q, .nquery = qk != NULL,
                      .headers = &h, .nheaders = hk != NULL, .body = ""};
    api_response r = {0};
    int rc = api_parse_request(&in, c, &r);
    int status = rc == 0 ? 0 : r.status;
    if (rc != 0) {
        json_error_t je;
        json_t *j = json_loads(r.body, 0, &je); /* every error body is valid JSON (UTF-8) */
        if (j == NULL)
            fail_msg("%s %s: error body is not JSON: %s", method, path, r.body);
        json_decref(j);
    }
    if (msg != NULL)
        *msg = r.body;
    else
        free(r.body);
    return status;
}

#define P(m, p, qk, qv, hk, hv, c) parse(m, p, strlen(p), qk, qv, hk, hv, c, NULL)

static void test_safe_text(void **state)
{
    char out[64];
    api_safe_text("ok \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 14, out, sizeof out);
    assert_string_equal(out, "ok \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
    api_safe_text("\xff\xc3\x28\n\x7f", 5, out, sizeof out);
    assert_string_equal(out, "\\xff\\xc3(\\x0a\\x7f");
    api_safe_text("\xed\xa0\x80\xc0\xaf\xf4\x90\x80\x80", 9, out, sizeof out); /* surrogate, overlong, > U+10FFFF */
    assert_string_equal(out, "\\xed\\xa0\\x80\\xc0\\xaf\\xf4\\x90\\x80\\x80");
    api_safe_text("a\0b", 3, out, sizeof out);
    assert_string_equal(out, "a\\x00b");
    api_safe_text("\xff\xff\xff", 3, out, 6); /* truncated between escapes */
    assert_string_equal(out, "\\xff");
}

static void test_routes_and_head(void **state)
{
    api_call c;
    assert_int_equal(P("GET", "/healthz", NULL, NULL, NULL, NULL, &c), 0);
    assert_int_equal(c.route, API_R_HEALTHZ);
    const char *gets[] = {"/healthz", "/metrics", "/v1/devices", "/v1/jobs", "/v1/jobs/j000001",
                          "/v1/jobs/j000001/events", "/v1/jobs/j000001/metrics"};
    for (size_t i = 0; i < sizeof gets / sizeof gets[0]; i++) {
        assert_int_equal(P("HEAD", gets[i], NULL, NULL, NULL, NULL, &c), 0);
        assert_true(c.head);
        assert_int_equal(P("PATCH", gets[i], NULL, NULL, NULL, NULL, &c), 405);
    }
    assert_int_equal(P("DELETE", "/v1/jobs/j000001", NULL, NULL, NULL, NULL, &c), 0);
    assert_int_equal(c.route, API_R_JOB_CANCEL);
    assert_string_equal(c.id, "j000001");
    assert_int_equal(P("GET", "/v1/jobs/j000001/", NULL, NULL, NULL, NULL, &c), 404);
    assert_int_equal(P("GET", "/v1/jobs/j000001/x", NULL, NULL, NULL, NULL, &c), 404);
    assert_int_equal(P("GET", "/nope", NULL, NULL, NULL, NULL, &c), 404);
}

static void test_ids(void **state)
{
    api_call c;
    const char *bad[] = {"/v1/jobs/j00001", "/v1/jobs/j000001%00", "/v1/jobs/J000001", "/v1/jobs/j00000a",
                         "/v1/jobs/\xff", "/v1/jobs/j0000011111111111111111111111111111111", "/v1/jobs//events",
                         "/v1/jobs/+j000001", "/v1/jobs/j-00001"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (P("DELETE", bad[i], NULL, NULL, NULL, NULL, &c) != 404)
            fail_msg("%s is not a 404", bad[i]);
    /* a NUL inside the path, by length */
    assert_int_equal(parse("DELETE", "/v1/jobs/j000001\0x", 18, NULL, NULL, NULL, NULL, &c, NULL), 400);
    char *msg = NULL;
    assert_int_equal(parse("GET", "/v1/jobs/\xff", 10, NULL, NULL, NULL, NULL, &c, &msg), 404);
    assert_non_null(strstr(msg, "\\\\xff")); /* JSON-escaped backslash */
    free(msg);
}

static void test_booleans(void **state)
{
    api_call c;
    const char *yes[] = {"1", "true", "TRUE", "yes", "on", ""};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
        assert_int_equal(P("POST", "/v1/jobs", "dry_run", yes[i], NULL, NULL, &c), 0);
        assert_true(c.dry_run);
    }
    assert_int_equal(P("POST", "/v1/jobs", "dry_run", NULL, NULL, NULL, &c), 0);
    assert_true(c.dry_run);
    assert_int_equal(P("POST", "/v1/jobs", "dry_run", "0", NULL, NULL, &c), 0);
    assert_false(c.dry_run);
    assert_int_equal(P("POST", "/v1/jobs", "dry_run", "false", NULL, NULL, &c), 0);
    assert_false(c.dry_run);
    const char *bad[] = {"maybe", "2", "-1", "\xff", " 1", "truee"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(P("POST", "/v1/jobs", "dry_run", bad[i], NULL, NULL, &c), 400);
}

static void test_sequence_numbers(void **state)
{
    api_call c;
    const char *ev = "/v1/jobs/j000001/events";
    assert_int_equal(P("GET", ev, "since", "5", NULL, NULL, &c), 0);
    assert_true(c.from == 6);
    assert_int_equal(P("GET", ev, NULL, NULL, "last-event-id", "7", &c), 0);
    assert_true(c.from == 8);
    assert_int_equal(P("GET", ev, "since", "1", "Last-Event-ID", "9", &c), 0);
    assert_true(c.from == 10);
    assert_int_equal(P("GET", ev, "since", "9223372036854775807", NULL, NULL, &c), 0);
    assert_true(c.from == 9223372036854775808ULL);
    const char *bad[] = {" -1", "-1", "+5", "18446744073709551615", "9223372036854775808", "", "1e3", "\xff", "0x1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(P("GET", ev, "since", bad[i], NULL, NULL, &c), 400);
        assert_int_equal(P("GET", ev, NULL, NULL, "Last-Event-ID", bad[i], &c), 400);
    }
    assert_int_equal(P("GET", ev, "since", NULL, NULL, NULL, &c), 400);
    assert_int_equal(P("GET", ev, "format", "xml", NULL, NULL, &c), 400);
    assert_int_equal(P("GET", ev, "format", "ndjson", NULL, NULL, &c), 0);
    assert_true(c.ndjson);
    assert_int_equal(P("GET", "/v1/jobs", "state", "\xff", NULL, NULL, &c), 400);
    assert_int_equal(P("GET", "/v1/jobs", "state", "running", NULL, NULL, &c), 0);
    assert_int_equal(c.state, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_safe_text),   cmocka_unit_test(test_routes_and_head),
        cmocka_unit_test(test_ids),         cmocka_unit_test(test_booleans),
        cmocka_unit_test(test_sequence_numbers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
