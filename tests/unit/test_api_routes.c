/* api_routes (issue 19): the routes' one table. Every row is documented
 * ("## METHOD /path" in docs/api.md, and every such heading is a row, the
 * dashboard's files aside), unique, and routed by api_parse_request: its
 * own method and path reach its route id, another method is a 405 whose
 * Allow names the row's method, and only API_RF_PUBLIC paths skip the token. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_parse.h"
#include "api_ui.h"

/* The row's pattern with its captures filled: a job id, a file path. */
static void instantiate(const char *pat, char *out, size_t n)
{
    size_t k = 0;
    while (*pat && k + 16 < n) {
        if (!strncmp(pat, "{id}", 4)) {
            k += (size_t)snprintf(out + k, n - k, "j0000042");
            pat += 4;
        } else if (!strcmp(pat, "{path}")) {
            k += (size_t)snprintf(out + k, n - k, "final/model.safetensors");
            pat += 6;
        } else {
            out[k++] = *pat++;
        }
    }
    out[k] = '\0';
}

static int route(const char *method, const char *path, api_call *c, api_response *r)
{
    api_request in = {.method = method, .path = path, .path_len = strlen(path), .body = ""};
    memset(r, 0, sizeof *r);
    return api_parse_request(&in, c, r);
}

static void test_rows_route(void **state)
{
    (void)state;
    assert_true(api_routes_len >= 13);
    for (size_t i = 0; i < api_routes_len; i++) {
        const api_route_row *row = &api_routes[i];
        assert_non_null(row->handler);
        assert_true(row->pattern[0] == '/');
        assert_true(!strcmp(row->method, "GET") || !strcmp(row->method, "POST") || !strcmp(row->method, "DELETE"));
        assert_int_equal(!!(row->flags & API_RF_JOB), strstr(row->pattern, "{id}") != NULL);
        for (size_t j = 0; j < i; j++) {
            if (!strcmp(api_routes[j].method, row->method) && !strcmp(api_routes[j].pattern, row->pattern))
                fail_msg("%s %s has two rows", row->method, row->pattern);
            if (api_routes[j].id == row->id)
                fail_msg("%s %s and %s %s share a route id", row->method, row->pattern, api_routes[j].method,
                         api_routes[j].pattern);
        }
        char path[256];
        api_call c;
        api_response r;
        instantiate(row->pattern, path, sizeof path);
        if (route(row->method, path, &c, &r) != 0)
            fail_msg("%s %s: %d %s", row->method, path, r.status, r.body);
        assert_int_equal(c.route, row->id);
        assert_ptr_equal(c.row, row);
        if (row->flags & API_RF_JOB)
            assert_string_equal(c.id, "j0000042");
        if (!strcmp(row->method, "GET")) { /* HEAD wherever GET is */
            assert_int_equal(route("HEAD", path, &c, &r), 0);
            assert_int_equal(c.route, row->id);
            assert_true(c.head);
        }
        if (row->flags & API_RF_SLASH) {
            strcat(path, "/");
            assert_int_equal(route(row->method, path, &c, &r), 0);
            assert_int_equal(c.route, row->id);
        }
        /* a method no row of this path has: 405, the Allow naming this row's */
        instantiate(row->pattern, path, sizeof path);
        assert_int_equal(route("PUT", path, &c, &r), -1);
        assert_int_equal(r.status, 405);
        assert_non_null(r.allow);
        assert_non_null(strstr(r.allow, row->method));
        free(r.body);
        /* the token is skipped only where the row says so */
        assert_int_equal(api_route_public(path), !!(row->flags & API_RF_PUBLIC));
    }
    api_call c;
    api_response r;
    assert_int_equal(route("GET", "/v1/nothing", &c, &r), -1);
    assert_int_equal(r.status, 404);
    free(r.body);
    assert_int_equal(route("GET", "/v1/jobs/x1/events", &c, &r), -1); /* a bad id is named first */
    assert_int_equal(r.status, 404);
    assert_non_null(strstr(r.body, "no job 'x1'"));
    free(r.body);
}

/* "## METHOD /path" or "### METHOD /path" (then the end of the line, a
 * blank or '?'): the heading of a route in docs/api.md. */
static int heading_of(const char *line, char *method, size_t mn, char *path, size_t pn)
{
    const char *p = line;
    while (*p == '#')
        p++;
    if (p - line < 2 || *p != ' ')
        return 0;
    p++;
    size_t ml = strspn(p, "ABCDEFGHIJKLMNOPQRSTUVWXYZ");
    if (ml == 0 || ml >= mn || p[ml] != ' ' || p[ml + 1] != '/')
        return 0;
    memcpy(method, p, ml);
    method[ml] = '\0';
    p += ml + 1;
    size_t pl = strcspn(p, " ?\n[");
    if (pl >= pn)
        return 0;
    memcpy(path, p, pl);
    path[pl] = '\0';
    return 1;
}

static void test_docs_name_every_route(void **state)
{
    (void)state;
    const char *src = getenv("ACCUMD_SRC");
    assert_non_null(src);
    char file[4096], line[1024], method[16], path[256];
    snprintf(file, sizeof file, "%s/docs/api.md", src);
    FILE *f = fopen(file, "r");
    assert_non_null(f);
    bool *documented = calloc(api_routes_len, sizeof *documented);
    assert_non_null(documented);
    while (fgets(line, sizeof line, f) != NULL) {
        if (!heading_of(line, method, sizeof method, path, sizeof path))
            continue;
        bool row = false;
        for (size_t i = 0; i < api_routes_len; i++)
            if (!strcmp(api_routes[i].method, method) && !strcmp(api_routes[i].pattern, path))
                documented[i] = row = true;
        if (!row && !(!strcmp(method, "GET") && ui_path(path)))
            fail_msg("docs/api.md has a section for %s %s, which no row of api_routes[] serves", method, path);
    }
    fclose(f);
    for (size_t i = 0; i < api_routes_len; i++)
        if (!documented[i])
            fail_msg("route %s %s has no '## %s %s' section in docs/api.md", api_routes[i].method,
                     api_routes[i].pattern, api_routes[i].method, api_routes[i].pattern);
    free(documented);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows_route),
        cmocka_unit_test(test_docs_name_every_route),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
