/* ctl_http: accumctl's HTTP, through libcurl's easy interface.
 *
 * One handle for the whole run (curl keeps the connection between
 * requests). Every request carries "Authorization: Bearer <token>" when a
 * token is known. Answers are collected whole, except streams, which are
 * cut into lines as they arrive and handed to a callback that may stop
 * them (the write callback then answers short and curl ends the transfer).
 */
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"

typedef struct buf {
    char *p;
    size_t len, cap;
    bool failed;
} buf;

static bool buf_add(buf *b, const char *data, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *np = realloc(b->p, cap);
        if (np == NULL) {
            b->failed = true;
            return false;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = '\0';
    return true;
}

static size_t on_body(char *data, size_t size, size_t n, void *ctx)
{
    return buf_add(ctx, data, size * n) ? size * n : 0;
}

int ctl_http_init(ctl *c)
{
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK || (c->curl = curl_easy_init()) == NULL) {
        fprintf(stderr, "accumctl: cannot initialise libcurl\n");
        return CTL_ECONN;
    }
    return 0;
}

void ctl_http_free(ctl *c)
{
    if (c->curl != NULL)
        curl_easy_cleanup(c->curl);
    c->curl = NULL;
    curl_global_cleanup();
}

void ctl_resp_free(ctl_resp *r)
{
    free(r->body);
    r->body = NULL;
    r->len = 0;
}

/* Method, URL, headers; the caller adds the body and the write callback. */
static struct curl_slist *prepare(ctl *c, const char *method, const char *path, char *url, size_t n)
{
    CURL *h = c->curl;
    curl_easy_reset(h);
    snprintf(url, n, "%s%s", c->url, path);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "accumctl/" ACCUMD_VERSION);
    struct curl_slist *hdr = curl_slist_append(NULL, "Accept: application/json");
    if (c->token[0] != '\0') {
        char auth[600];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", c->token);
        struct curl_slist *t = curl_slist_append(hdr, auth);
        hdr = t ? t : hdr;
    }
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    return hdr;
}

static int transport_error(const ctl *c, CURLcode rc, const char *errbuf)
{
    fprintf(stderr, "accumctl: cannot reach accumd at %s: %s\n", c->url, errbuf[0] ? errbuf : curl_easy_strerror(rc));
    return CTL_ECONN;
}

static size_t on_file(char *p, size_t size, size_t n, void *ud)
{
    return fwrite(p, size, n, ud) * size;
}

int ctl_download(ctl *c, const char *path, uint64_t from, FILE *out, long *status)
{
    char url[2048], errbuf[CURL_ERROR_SIZE] = "", range[32];
    struct curl_slist *hdr = prepare(c, "GET", path, url, sizeof url);
    CURL *h = c->curl;
    if (from > 0) {
        snprintf(range, sizeof range, "%llu-", (unsigned long long)from);
        curl_easy_setopt(h, CURLOPT_RANGE, range);
    }
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_file);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, out);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    CURLcode rc = curl_easy_perform(h);
    curl_slist_free_all(hdr);
    *status = 0;
    if (rc != CURLE_OK)
        return transport_error(c, rc, errbuf);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
    return 0;
}

int ctl_request(ctl *c, const char *method, const char *path, const char *body, size_t len, ctl_resp *r)
{
    char url[2048], errbuf[CURL_ERROR_SIZE] = "";
    buf b = {0};
    memset(r, 0, sizeof *r);
    struct curl_slist *hdr = prepare(c, method, path, url, sizeof url);
    CURL *h = c->curl;
    if (body != NULL) {
        struct curl_slist *t = curl_slist_append(hdr, "Content-Type: application/json");
        hdr = t ? t : hdr;
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    }
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 300L);
    CURLcode rc = curl_easy_perform(h);
    curl_slist_free_all(hdr);
    if (rc != CURLE_OK || b.failed) {
        free(b.p);
        return b.failed ? (fprintf(stderr, "accumctl: out of memory\n"), CTL_ECONN) : transport_error(c, rc, errbuf);
    }
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
    r->body = b.p ? b.p : strdup("");
    r->len = b.len;
    return r->body ? 0 : CTL_ECONN;
}

typedef struct stream_ctx {
    buf line;
    buf err;                 /* the body of an error answer */
    long status;
    CURL *h;
    int (*cb)(void *, const char *);
    void *ctx;
    bool stopped;
} stream_ctx;

static size_t on_stream(char *data, size_t size, size_t n, void *p)
{
    stream_ctx *s = p;
    size_t total = size * n;
    if (s->status == 0)
        curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &s->status);
    if (s->status >= 300)
        return buf_add(&s->err, data, total) ? total : 0;
    for (size_t i = 0; i < total; i++) {
        if (data[i] != '\n') {
            if (!buf_add(&s->line, data + i, 1))
                return 0;
            continue;
        }
        const char *text = s->line.p ? s->line.p : "";
        int stop = s->cb(s->ctx, text);
        s->line.len = 0;
        if (s->line.p)
            s->line.p[0] = '\0';
        if (stop) {
            s->stopped = true;
            return 0; /* short write: curl ends the transfer */
        }
    }
    return total;
}

int ctl_stream(ctl *c, const char *path, int (*line)(void *ctx, const char *text), void *ctx)
{
    return ctl_stream_post(c, path, NULL, 0, line, ctx);
}

int ctl_stream_post(ctl *c, const char *path, const char *body, size_t len, int (*line)(void *ctx, const char *text),
                    void *ctx)
{
    char url[2048], errbuf[CURL_ERROR_SIZE] = "";
    struct curl_slist *hdr = prepare(c, body ? "POST" : "GET", path, url, sizeof url);
    if (body != NULL) { /* POST /v1/generate's stream */
        struct curl_slist *t = curl_slist_append(hdr, "Content-Type: application/json");
        hdr = t ? t : hdr;
        curl_easy_setopt(c->curl, CURLOPT_HTTPHEADER, hdr);
        curl_easy_setopt(c->curl, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c->curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    }
    stream_ctx s = {.h = c->curl, .cb = line, .ctx = ctx};
    curl_easy_setopt(c->curl, CURLOPT_WRITEFUNCTION, on_stream);
    curl_easy_setopt(c->curl, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(c->curl, CURLOPT_ERRORBUFFER, errbuf);
    CURLcode rc = curl_easy_perform(c->curl);
    curl_slist_free_all(hdr);
    int ret = 0;
    if (s.status >= 300 || (rc == CURLE_OK && s.status == 0 &&
                            curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, &s.status) == CURLE_OK &&
                            s.status >= 300)) {
        ctl_resp r = {.status = s.status, .body = s.err.p, .len = s.err.len};
        ret = ctl_http_error(&r);
    } else if (rc != CURLE_OK && !s.stopped) {
        ret = transport_error(c, rc, errbuf);
    } else if (s.line.len > 0 && !s.stopped) { /* a last line without a newline */
        line(ctx, s.line.p);
    }
    free(s.line.p);
    free(s.err.p);
    return ret;
}

int ctl_http_error(const ctl_resp *r)
{
    json_t *o = r->body ? json_loads(r->body, 0, NULL) : NULL;
    json_t *e = json_object_get(o, "error");
    const char *code = json_string_value(json_object_get(e, "code"));
    const char *msg = json_string_value(json_object_get(e, "message"));
    const char *field = json_string_value(json_object_get(e, "field"));
    if (msg != NULL)
        fprintf(stderr, "accumctl: HTTP %ld %s%s%s%s: %s\n", r->status, code ? code : "error", field ? " (" : "",
                field ? field : "", field ? ")" : "", msg);
    else
        fprintf(stderr, "accumctl: HTTP %ld: %.300s\n", r->status, r->body ? r->body : "");
    json_decref(o);
    return CTL_EHTTP;
}

int ctl_get_json(ctl *c, const char *path, json_t **out)
{
    ctl_resp r;
    *out = NULL;
    int rc = ctl_request(c, "GET", path, NULL, 0, &r);
    if (rc != 0)
        return rc;
    if (r.status != 200) {
        rc = ctl_http_error(&r);
        ctl_resp_free(&r);
        return rc;
    }
    json_error_t je;
    *out = json_loads(r.body, 0, &je);
    ctl_resp_free(&r);
    if (*out == NULL) {
        fprintf(stderr, "accumctl: GET %s: the answer is not JSON: %s\n", path, je.text);
        return CTL_EHTTP;
    }
    return 0;
}
