/* api_parse: routing and the strict parsing of query parameters and headers
 * (see api_parse.h). Pure: no MHD, no jobs. */
#include "api_parse.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "conf.h"
#include "job.h"

/* ---- safe echo --------------------------------------------------------------- */

/* Bytes of the valid UTF-8 sequence at s (RFC 3629: no overlongs, no
 * surrogates, nothing past U+10FFFF), 0 when there is none. */
static size_t utf8_seq(const unsigned char *s, size_t len)
{
    unsigned char c = s[0];
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else
        return 0;
    if (len < n || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    return n;
}

void api_safe_text(const char *in, size_t len, char *out, size_t n)
{
    const unsigned char *s = (const unsigned char *)in;
    size_t k = 0;
    if (n == 0)
        return;
    for (size_t i = 0; i < len;) {
        size_t q = utf8_seq(s + i, len - i);
        if (q == 1 && (s[i] < 0x20 || s[i] == 0x7F))
            q = 0; /* a control character: escaped like a stray byte */
        if (q == 0) {
            if (k + 4 >= n)
                break;
            snprintf(out + k, 5, "\\x%02x", s[i]);
            k += 4;
            i++;
            continue;
        }
        if (k + q >= n)
            break;
        memcpy(out + k, s + i, q);
        k += q;
        i += q;
    }
    out[k] = '\0';
}

/* ---- unescaping ----------------------------------------------------------------- */

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

size_t api_unescape(char *s)
{
    char *w = s;
    for (const char *r = s; *r; r++) {
        int hi, lo;
        if (r[0] == '%' && (hi = hexval(r[1])) >= 0 && (lo = hexval(r[2])) >= 0 && (hi | lo) != 0) {
            *w++ = (char)(hi * 16 + lo);
            r += 2;
        } else {
            *w++ = *r;
        }
    }
    *w = '\0';
    return (size_t)(w - s);
}

/* ---- query parameters and headers -------------------------------------------- */

int api_query_get(const api_request *in, const char *key, const char **v, api_response *resp)
{
    int found = 0;
    *v = NULL;
    for (size_t i = 0; i < in->nquery; i++) {
        if (strcmp(in->query[i].key, key) != 0)
            continue;
        if (found++) {
            api_resp_error(resp, 400, "invalid", key, "query parameter %s is given more than once", key);
            return -1;
        }
        *v = in->query[i].value;
    }
    return found;
}

int api_query_bool(const api_request *in, const char *key, bool *out, api_response *resp)
{
    const char *v;
    int rc = api_query_get(in, key, &v, resp);
    if (rc <= 0)
        return rc;
    if (v == NULL || v[0] == '\0') { /* a bare ?dry_run means yes */
        *out = true;
        return 0;
    }
    if (conf_parse_bool(v, out) == 0)
        return 0;
    char safe[64];
    api_safe_text(v, strlen(v), safe, sizeof safe);
    api_resp_error(resp, 400, "invalid", key, "%s must be 1, true, yes, on, 0, false, no or off, got '%s'", key,
                   safe);
    return -1;
}

static int parse_seq(const char *what, const char *v, uint64_t max, uint64_t *out, api_response *resp)
{
    if (v != NULL && conf_parse_u64(v, max, out) == 0)
        return 0;
    char safe[64];
    api_safe_text(v ? v : "", v ? strlen(v) : 0, safe, sizeof safe);
    api_resp_error(resp, 400, "invalid", what, "%s must be a decimal integer in [0, %llu], got '%s'", what,
                   (unsigned long long)max, safe);
    return -1;
}

int api_query_u64(const api_request *in, const char *key, uint64_t max, uint64_t *out, bool *present,
                  api_response *resp)
{
    const char *v;
    int rc = api_query_get(in, key, &v, resp);
    if (present != NULL)
        *present = rc > 0;
    if (rc <= 0)
        return rc;
    return parse_seq(key, v, max, out, resp);
}

const char *api_header(const api_request *in, const char *name)
{
    for (size_t i = 0; i < in->nheaders; i++)
        if (!strcasecmp(in->headers[i].key, name))
            return in->headers[i].value;
    return NULL;
}

/* A NUL inside a path, query pair or header is refused outright: C code
 * past this point would see a shorter string than the client sent. */
static int refuse_nul(const api_request *in, api_response *resp)
{
    const char *what = NULL;
    if (strlen(in->path) != in->path_len)
        what = "the path";
    for (size_t i = 0; what == NULL && i < in->nquery; i++) {
        const api_kv *q = &in->query[i];
        if (strlen(q->key) != q->key_len || (q->value != NULL && strlen(q->value) != q->value_len))
            what = "a query parameter";
    }
    for (size_t i = 0; what == NULL && i < in->nheaders; i++) {
        const api_kv *h = &in->headers[i];
        if (strlen(h->key) != h->key_len || (h->value != NULL && strlen(h->value) != h->value_len))
            what = "a header";
    }
    if (what == NULL)
        return 0;
    api_resp_error(resp, 400, "invalid", NULL, "%s contains a NUL byte", what);
    return -1;
}

/* ---- routes -------------------------------------------------------------------- */

static int not_allowed(const api_request *in, api_response *resp, const char *allow)
{
    char m[64], p[256];
    api_safe_text(in->method, strlen(in->method), m, sizeof m);
    api_safe_text(in->path, in->path_len, p, sizeof p);
    api_resp_error(resp, 405, "method_not_allowed", NULL, "%s %s: allowed: %s", m, p, allow);
    resp->allow = allow;
    return -1;
}

static int no_route(const api_request *in, api_response *resp)
{
    char m[64], p[256];
    api_safe_text(in->method, strlen(in->method), m, sizeof m);
    api_safe_text(in->path, in->path_len, p, sizeof p);
    api_resp_error(resp, 404, "not_found", NULL, "no route for %s %s", m, p);
    return -1;
}

/* Pagination of the list: ?limit= (1..API_LIST_MAX_LIMIT) and ?after=<job id>. */
static int parse_page(const api_request *in, api_call *out, api_response *resp)
{
    uint64_t limit = API_LIST_LIMIT;
    bool have = false;
    const char *after;
    out->limit = API_LIST_LIMIT;
    if (api_query_u64(in, "limit", UINT64_MAX, &limit, &have, resp) != 0 || (have && (limit < 1 || limit > API_LIST_MAX_LIMIT))) {
        api_resp_error(resp, 400, "invalid", "limit", "limit must be an integer from 1 to %d", API_LIST_MAX_LIMIT);
        return -1;
    }
    out->limit = (int)limit;
    int rc = api_query_get(in, "after", &after, resp);
    if (rc < 0)
        return -1;
    if (rc > 0) {
        size_t n = after != NULL ? strlen(after) : 0;
        if (n == 0 || n >= sizeof out->after || !job_id_valid(after, n)) {
            char safe[128];
            api_safe_text(after ? after : "", n, safe, sizeof safe);
            api_resp_error(resp, 400, "invalid", "after",
                           "after must name a job (the `next` of the previous page), got '%s'", safe);
            return -1;
        }
        memcpy(out->after, after, n + 1);
    }
    return 0;
}

int api_parse_list(const api_request *in, api_call *out, api_response *resp)
{
    const char *state;
    out->state = -1;
    int rc = api_query_get(in, "state", &state, resp);
    if (rc < 0)
        return -1;
    if (rc > 0 && (state == NULL || (out->state = job_state_parse(state)) < 0)) {
        char safe[64];
        api_safe_text(state ? state : "", state ? strlen(state) : 0, safe, sizeof safe);
        api_resp_error(resp, 400, "invalid", "state",
                       "state must be queued, running, succeeded, failed or cancelled, got '%s'", safe);
        return -1;
    }
    return parse_page(in, out, resp);
}

int api_parse_submit(const api_request *in, api_call *out, api_response *resp)
{
    return api_query_bool(in, "dry_run", &out->dry_run, resp);
}

/* Where a stream starts: after Last-Event-ID (the last event seen) or after
 * ?since=N, else at the oldest event held. Both are checked when both come. */
int api_parse_events(const api_request *in, api_call *out, api_response *resp)
{
    const char *format;
    int rc = api_query_get(in, "format", &format, resp);
    if (rc < 0)
        return -1;
    if (rc > 0 && (format == NULL || (strcmp(format, "sse") && strcmp(format, "ndjson")))) {
        char safe[64];
        api_safe_text(format ? format : "", format ? strlen(format) : 0, safe, sizeof safe);
        api_resp_error(resp, 400, "invalid", "format", "format must be sse or ndjson, got '%s'", safe);
        return -1;
    }
    out->ndjson = rc > 0 && !strcmp(format, "ndjson");
    uint64_t since = 0, last = 0;
    bool have_since = false;
    if (api_query_u64(in, "since", API_SEQ_MAX, &since, &have_since, resp) != 0)
        return -1;
    const char *lh = api_header(in, "Last-Event-ID");
    if (lh != NULL && parse_seq("Last-Event-ID", lh, API_SEQ_MAX, &last, resp) != 0)
        return -1;
    out->from = lh != NULL ? last + 1 : have_since ? since + 1 : 1;
    return 0;
}

/* A relative file path: components of [A-Za-z0-9._-],
 * none empty, "." or "..". */
static bool file_path_ok(const char *p, size_t n)
{
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i == n || p[i] == '/') {
            size_t l = i - start;
            if (l == 0 || (l == 1 && p[start] == '.') || (l == 2 && p[start] == '.' && p[start + 1] == '.'))
                return false;
            start = i + 1;
            continue;
        }
        char c = p[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-'))
            return false;
    }
    return true;
}

/* GET /v1/jobs/{id}/files/{path}: the {path} the pattern captured. */
int api_parse_file(const api_request *in, api_call *out, api_response *resp)
{
    (void)in;
    if (!file_path_ok(out->tail, out->tail_len) || out->tail_len >= sizeof out->file) {
        api_resp_error(resp, 400, "invalid", "path",
                       "a file path is components of letters, digits, '.', '_' and '-' (no '..'), as "
                       "GET /v1/jobs/{id}/files lists them");
        return -1;
    }
    memcpy(out->file, out->tail, out->tail_len);
    out->file[out->tail_len] = '\0';
    return 0;
}

/* A row's pattern against the path: literal bytes, "{id}" one non-empty
 * segment, "{path}" the non-empty rest; API_RF_SLASH also takes one
 * trailing '/'. The captures go to out->id (checked by the caller) and
 * out->tail. */
static bool pattern_match(const api_route_row *r, const char *path, size_t n, api_call *out)
{
    const char *pat = r->pattern;
    size_t k = 0;
    while (*pat != '\0') {
        if (!strncmp(pat, "{id}", 4)) {
            size_t st = k;
            while (k < n && path[k] != '/')
                k++;
            if (k == st || k - st >= sizeof out->id)
                return false;
            memcpy(out->id, path + st, k - st);
            out->id[k - st] = '\0';
            pat += 4;
        } else if (!strcmp(pat, "{path}")) {
            if (k == n)
                return false;
            out->tail = path + k;
            out->tail_len = n - k;
            return true;
        } else {
            if (k == n || path[k] != *pat)
                return false;
            k++;
            pat++;
        }
    }
    return k == n || ((r->flags & API_RF_SLASH) && k + 1 == n && path[k] == '/');
}

/* Job routes name a job first: a path under a job route's prefix (the
 * pattern before "{id}") whose id segment is not a job id is a 404 saying
 * so, whatever follows it. */
static int check_job_id(const char *path, size_t n, api_response *resp)
{
    for (size_t i = 0; i < api_routes_len; i++) {
        const char *id = strstr(api_routes[i].pattern, "{id}");
        if (!(api_routes[i].flags & API_RF_JOB) || id == NULL)
            continue;
        size_t pl = (size_t)(id - api_routes[i].pattern);
        if (n <= pl || strncmp(path, api_routes[i].pattern, pl) != 0)
            continue;
        const char *seg = path + pl, *slash = memchr(seg, '/', n - pl);
        size_t il = slash ? (size_t)(slash - seg) : n - pl;
        if (job_id_valid(seg, il))
            return 0;
        char safe[128];
        api_safe_text(seg, il, safe, sizeof safe);
        api_resp_error(resp, 404, "not_found", NULL, "no job '%s' (job ids are 'j' and digits)", safe);
        return -1;
    }
    return 0;
}

/* GET rows answer HEAD too. */
static bool method_ok(const api_route_row *r, const char *m)
{
    return !strcmp(r->method, m) || (!strcmp(r->method, "GET") && !strcmp(m, "HEAD"));
}

/* The Allow header of a path: its rows' methods (a GET row adds HEAD), in
 * one fixed order, so the text is a constant. */
static const char *allow_text(unsigned bits)
{
    static const char *const text[8] = {"",       "GET, HEAD",         "POST",         "GET, HEAD, POST",
                                        "DELETE", "GET, HEAD, DELETE", "POST, DELETE", "GET, HEAD, POST, DELETE"};
    return text[bits & 7];
}

static unsigned method_bit(const char *m)
{
    return !strcmp(m, "GET") ? 1 : !strcmp(m, "POST") ? 2 : !strcmp(m, "DELETE") ? 4 : 0;
}

bool api_route_public(const char *path)
{
    api_call scratch;
    for (size_t i = 0; i < api_routes_len; i++)
        if ((api_routes[i].flags & API_RF_PUBLIC) && pattern_match(&api_routes[i], path, strlen(path), &scratch))
            return true;
    return false;
}

int api_parse_request(const api_request *in, api_call *out, api_response *resp)
{
    memset(out, 0, sizeof *out);
    out->state = -1;
    out->from = 1;
    out->head = !strcmp(in->method, "HEAD");
    if (refuse_nul(in, resp) != 0 || check_job_id(in->path, in->path_len, resp) != 0)
        return -1;
    unsigned allow = 0;
    for (size_t i = 0; i < api_routes_len; i++) {
        const api_route_row *r = &api_routes[i];
        if (!pattern_match(r, in->path, in->path_len, out))
            continue;
        if (!method_ok(r, in->method)) {
            allow |= method_bit(r->method);
            continue;
        }
        out->route = r->id;
        out->row = r;
        return r->parse != NULL ? r->parse(in, out, resp) : 0;
    }
    return allow != 0 ? not_allowed(in, resp, allow_text(allow)) : no_route(in, resp);
}
