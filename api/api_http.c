#include "api_http.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "api_parse.h"
#include "api_ui.h"
#include "log.h"

#define API_PING_MS 15000 /* keep-alive comment on idle event streams */

#define API_REAP_MS 1000  /* how often request deadlines are checked */

/* One open connection (MHD's socket context). While it has not sent a
 * whole request (from its start, or from the end of its previous request)
 * it is "pending": linked, oldest first, into the server's pending list,
 * and held to header_timeout / request_timeout as a whole, however slowly
 * the bytes trickle in. */
typedef struct conn_rec {
    struct conn_rec *prev, *next;
    struct MHD_Connection *conn;
    uint64_t since;        /* ms, start of the request being received */
    bool pending, headers_done, evicted;
    bool peeked;           /* its header block was looked at (peek_length) */
} conn_rec;

struct api_server {
    struct MHD_Daemon *mhd;
    uv_loop_t *loop;
    uv_poll_t poll;
    uv_timer_t timer;
    uv_timer_t ping;
    uv_timer_t reap;
    const acc_conf *conf;
    void *app;
    int port;
    int open_handles;
    bool require_token;    /* conf's, or forced: the bound address is not loopback */
    char token[128];
    api_users users;       /* from users_file; empty without one */
    bool have_users;
    api_audit audit;
    uint64_t counts[600];  /* answers by HTTP status */
    api_stream *streams;
    struct api_fstream *fstreams; /* file downloads in flight (api_files.c) */
    conn_rec *pend_head, *pend_tail;
    int npending;
    uint64_t evicted_total;
    api_deferred *deferred; /* waiting for their work (api_defer) */
    int ndeferred;
};

struct api_deferred {
    api_deferred *prev, *next; /* the server's list, while it waits */
    api_server *srv;           /* NULL once orphaned */
    struct MHD_Connection *conn;
    struct req_ctx *rc;        /* the request it answers; NULL once that is gone */
    uv_work_t work_req;
    api_work_fn work;
    api_done_fn done;
    void *ctx;
    bool finished;             /* done() ran: resp is the answer */
    bool orphaned;             /* the server stopped first: resp is a 503 */
    bool work_done;            /* the thread pool is through with it */
    bool heavy;                /* api_defer_json_heavy: counted against heavy_requests_* */
    char user[API_NAME_MAX];   /* whose, when heavy */
    api_response resp;
};

/* Per-request state kept by MHD between handler calls. */
typedef struct req_ctx {
    char *body;
    size_t len, cap;
    bool too_big;
    bool answered;   /* refused from the headers already */
    bool started;    /* the headers were seen */
    const char *raw_uri; /* the request target as read (on_uri), and its strlen then */
    size_t raw_len;
    api_ident who;
    api_deferred *deferred; /* suspended until it is finished (or orphaned) */
} req_ctx;

/* The query pairs or headers of a request, with their real lengths. */
typedef struct kv_list {
    api_kv *v;
    size_t n, cap;
    bool failed;
} kv_list;

static void arm_timer(api_server *s);
static void on_ping(uv_timer_t *t);


static void arm_timer(api_server *s);

static void peek_pending(api_server *s);

/* Every MHD run: first the look at new header blocks (peek_length). */
static void run_mhd(api_server *s)
{
    peek_pending(s);
    MHD_run(s->mhd);
}

static void on_poll(uv_poll_t *h, int status, int events)
{
    api_server *s = h->data;
    if (status < 0)
        acc_log(ACC_LOG_WARN, "http", "poll error: %s", uv_strerror(status));
    run_mhd(s);
    arm_timer(s);
}

static void on_timer(uv_timer_t *t)
{
    api_server *s = t->data;
    run_mhd(s);
    arm_timer(s);
}

static void arm_timer(api_server *s)
{
    MHD_UNSIGNED_LONG_LONG ms;
    if (s->mhd != NULL && MHD_get_timeout(s->mhd, &ms) == MHD_YES)
        uv_timer_start(&s->timer, on_timer, ms, 0);
    else
        uv_timer_stop(&s->timer);
}

int api_status_of(int code)
{
    switch (code) {
    case ACC_OK: return 200;
    case ACC_EINVAL: return 400;
    case ACC_ENOTFOUND: return 404;
    case ACC_ESTATE: return 409;
    case ACC_ETOOBIG: return 413;
    case ACC_EOOM: return 507;
    case ACC_EDEVICE: return 503;
    case ACC_EUNAVAIL: return 503;
    case ACC_ELIMIT: return 429;
    default: return 500;
    }
}

void api_resp_json(api_response *resp, int status, const char *json_text)
{
    resp->status = status;
    resp->content_type = "application/json";
    free(resp->body);
    resp->body = strdup(json_text);
    resp->body_len = resp->body ? strlen(resp->body) : 0;
}

void api_resp_json_obj(api_response *resp, int status, json_t *o, size_t flags)
{
    char *text = o ? json_dumps(o, flags) : NULL;
    json_decref(o);
    if (text == NULL) {
        api_resp_error(resp, 500, "internal", NULL, "out of memory");
        return;
    }
    size_t n = strlen(text);
    char *nl = realloc(text, n + 2);
    if (nl != NULL) {
        text = nl;
        text[n++] = '\n';
        text[n] = '\0';
    }
    free(resp->body);
    resp->status = status;
    resp->content_type = "application/json";
    resp->body = text;
    resp->body_len = n;
}

void api_resp_error(api_response *resp, int status, const char *code, const char *field,
                    const char *fmt, ...)
{
    char raw[1024], msg[1024], fsafe[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    /* the one way request bytes reach an answer: always valid UTF-8 */
    api_safe_text(raw, strlen(raw), msg, sizeof msg);
    if (field != NULL)
        api_safe_text(field, strlen(field), fsafe, sizeof fsafe);
    json_t *e = json_pack("{s:{s:s, s:s, s:s?}}", "error", "code", code, "message", msg,
                          "field", (field && *field) ? fsafe : NULL);
    char *text = e ? json_dumps(e, JSON_COMPACT) : NULL;
    json_decref(e);
    resp->status = status;
    resp->content_type = "application/json";
    free(resp->body);
    resp->body = text;
    resp->body_len = text ? strlen(text) : 0;
    if (resp->body != NULL) {
        /* one line, easier to read in a terminal after curl */
        char *nl = realloc(resp->body, resp->body_len + 2);
        if (nl != NULL) {
            resp->body = nl;
            resp->body[resp->body_len++] = '\n';
            resp->body[resp->body_len] = '\0';
        }
    }
}

void api_resp_from_err(api_response *resp, const acc_err *err)
{
    api_resp_error(resp, api_status_of(err->code), acc_err_name(err->code), err->field, "%s",
                   err->msg);
}

static void count(api_server *s, int status)
{
    if (status >= 100 && status < 600)
        s->counts[status]++;
}

static enum MHD_Result queue_stream(api_server *s, struct MHD_Connection *conn, api_response *r)
{
    struct MHD_Response *mr = api_stream_response(r->stream);
    r->stream = NULL; /* freed with the MHD response from here on */
    if (mr == NULL)
        return MHD_NO;
    enum MHD_Result ok = MHD_queue_response(conn, MHD_HTTP_OK, mr);
    MHD_destroy_response(mr);
    count(s, MHD_HTTP_OK);
    return ok;
}

static enum MHD_Result queue(api_server *s, struct MHD_Connection *conn, api_response *r)
{
    if (r->stream != NULL)
        return queue_stream(s, conn, r);
    if (r->mhd != NULL) { /* prepared (api_files.c) */
        enum MHD_Result ok = MHD_queue_response(conn, (unsigned)r->status, r->mhd);
        MHD_destroy_response(r->mhd);
        r->mhd = NULL;
        count(s, r->status);
        return ok;
    }
    if (r->body == NULL)
        api_resp_error(r, 500, "internal", NULL, "no response body (out of memory?)");
    if (r->body == NULL)
        return MHD_NO;
    struct MHD_Response *mr =
        MHD_create_response_from_buffer(r->body_len, r->body, MHD_RESPMEM_MUST_FREE);
    if (mr == NULL) {
        free(r->body);
        return MHD_NO;
    }
    r->body = NULL; /* owned by MHD now */
    MHD_add_response_header(mr, MHD_HTTP_HEADER_CONTENT_TYPE,
                            r->content_type ? r->content_type : "application/json");
    if (r->location[0])
        MHD_add_response_header(mr, MHD_HTTP_HEADER_LOCATION, r->location);
    if (r->allow != NULL)
        MHD_add_response_header(mr, MHD_HTTP_HEADER_ALLOW, r->allow);
    if (r->etag != NULL)
        MHD_add_response_header(mr, MHD_HTTP_HEADER_ETAG, r->etag);
    if (r->cache_control != NULL)
        MHD_add_response_header(mr, MHD_HTTP_HEADER_CACHE_CONTROL, r->cache_control);
    if (r->csp != NULL) {
        MHD_add_response_header(mr, "Content-Security-Policy", r->csp);
        MHD_add_response_header(mr, "X-Content-Type-Options", "nosniff");
    }
    if (r->status == MHD_HTTP_UNAUTHORIZED)
        MHD_add_response_header(mr, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"accumd\"");
    if (r->close)
        MHD_add_response_header(mr, MHD_HTTP_HEADER_CONNECTION, "close");
    count(s, r->status);
    enum MHD_Result ok = MHD_queue_response(conn, (unsigned)r->status, mr);
    MHD_destroy_response(mr);
    return ok;
}

static int body_append(req_ctx *rc, const char *data, size_t n, uint64_t max)
{
    if (rc->too_big || rc->len + n > max) {
        rc->too_big = true;
        return 0;
    }
    if (rc->len + n + 1 > rc->cap) {
        size_t cap = rc->cap ? rc->cap : 4096;
        while (cap < rc->len + n + 1)
            cap *= 2;
        char *nb = realloc(rc->body, cap);
        if (nb == NULL)
            return -1;
        rc->body = nb;
        rc->cap = cap;
    }
    memcpy(rc->body + rc->len, data, n);
    rc->len += n;
    rc->body[rc->len] = '\0';
    return 0;
}

static void set_ident(api_ident *who, const char *name, int role)
{
    snprintf(who->name, sizeof who->name, "%s", name);
    who->role = role;
}

/* Who asks (see api_http.h); false when the token is missing but required,
 * or given and nobody's. Without a users file a wrong token on an open
 * loopback is ignored, as before users existed. */
static bool identify(api_server *s, struct MHD_Connection *conn, api_ident *who)
{
    const char *tok = api_auth_bearer(conn);
    if (tok != NULL && api_auth_ok(conn, s->token)) {
        set_ident(who, API_TOKEN_ADMIN, API_ROLE_ADMIN);
        return true;
    }
    const api_user *u = tok != NULL && s->have_users ? api_users_find(&s->users, tok) : NULL;
    if (u != NULL) {
        set_ident(who, u->name, u->role);
        return true;
    }
    if (s->require_token || (tok != NULL && s->have_users))
        return false;
    set_ident(who, API_ANONYMOUS, s->have_users ? API_ROLE_USER : API_ROLE_ADMIN);
    return true;
}

/* What can be refused before reading a body: a missing or wrong token
 * (everything but /healthz and the dashboard's static files, which hold no
 * data: api_ui.h), a declared body over max_body. */
static bool refuse_early(api_server *s, struct MHD_Connection *conn, const char *url, api_response *r,
                         api_ident *who)
{
    if (api_route_public(url) || ui_path(url)) {
        set_ident(who, API_ANONYMOUS, API_ROLE_USER);
    } else if (!identify(s, conn, who)) {
        api_resp_error(r, MHD_HTTP_UNAUTHORIZED, "unauthorized", NULL,
                       s->have_users ? "missing or wrong bearer token (Authorization: Bearer <your token, as "
                                       "listed hashed in users_file>)"
                                     : "missing or wrong bearer token (Authorization: Bearer <token from token_file>)");
        return true;
    }
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    uint64_t clen = 0;
    if (cl != NULL && conf_parse_u64(cl, UINT64_MAX, &clen) != 0) {
        char safe[64];
        api_safe_text(cl, strlen(cl), safe, sizeof safe);
        api_resp_error(r, MHD_HTTP_BAD_REQUEST, "invalid", "Content-Length",
                       "Content-Length must be a decimal byte count, got '%s'", safe);
        return true;
    }
    if (clen > s->conf->max_body) {
        api_resp_error(r, MHD_HTTP_CONTENT_TOO_LARGE, "too_large", NULL, "request body over max_body (%llu bytes)",
                       (unsigned long long)s->conf->max_body);
        return true;
    }
    return false;
}

/* A transfer coding other than "chunked" (the one HTTP/1.1 requires and
 * MHD decodes): the body's length is unknowable, so the answer is a 501 at
 * once and the connection closes (MHD would wait for the body forever). */
static bool refuse_coding(struct MHD_Connection *conn, api_response *r)
{
    const char *te = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    if (te == NULL || strcasecmp(te, "chunked") == 0)
        return false;
    char safe[64];
    api_safe_text(te, strlen(te), safe, sizeof safe);
    api_resp_error(r, MHD_HTTP_NOT_IMPLEMENTED, "not_implemented", "Transfer-Encoding",
                   "Transfer-Encoding '%s' is not supported (only chunked)", safe);
    r->close = true;
    return true;
}

/* ---- pending connections: deadlines and the reserve --------------------------- */

static uint64_t now_ms(api_server *s) { return uv_now(s->loop); }

static void pend_unlink(api_server *s, conn_rec *c)
{
    if (!c->pending)
        return;
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        s->pend_head = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    else
        s->pend_tail = c->prev;
    c->prev = c->next = NULL;
    c->pending = false;
    s->npending--;
}

/* Close a connection from outside MHD: shut its socket down, MHD sees the
 * end of it at its next run and cleans up as after any client close. */
static void evict(api_server *s, conn_rec *c, const char *why)
{
    pend_unlink(s, c);
    if (c->evicted)
        return;
    c->evicted = true;
    s->evicted_total++;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci != NULL)
        shutdown(ci->connect_fd, SHUT_RDWR);
    acc_log(ACC_LOG_DEBUG, "http", "closed a connection: %s", why);
    api_server_kick(s);
}

static void pend_start(api_server *s, conn_rec *c)
{
    if (c->evicted)
        return;
    pend_unlink(s, c);
    c->since = now_ms(s);
    c->headers_done = false;
    c->peeked = false;
    c->pending = true;
    c->prev = s->pend_tail;
    if (s->pend_tail != NULL)
        s->pend_tail->next = c;
    else
        s->pend_head = c;
    s->pend_tail = c;
    s->npending++;
    /* the reserve: past the cap, the oldest pending connection makes room */
    while (s->npending > s->conf->max_pending_connections && s->pend_head != c)
        evict(s, s->pend_head, "too many connections still sending their request");
}

static conn_rec *rec_of(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci != NULL ? ci->socket_context : NULL;
}

static void on_reap(uv_timer_t *t)
{
    api_server *s = t->data;
    uint64_t now = now_ms(s);
    uint64_t hdr = (uint64_t)s->conf->header_timeout * 1000, req = (uint64_t)s->conf->request_timeout * 1000;
    uint64_t before = s->evicted_total;
    api_generate_ping_all(s); /* waiting generate answers: a keep-alive finds clients that left */
    for (conn_rec *c = s->pend_head, *next; c != NULL; c = next) {
        next = c->next;
        uint64_t age = now - c->since;
        if (!c->headers_done && age > hdr)
            evict(s, c, "request header not complete within header_timeout");
        else if (age > req)
            evict(s, c, "request not complete within request_timeout");
    }
    if (s->evicted_total != before && s->mhd != NULL) {
        /* reap them now: until MHD has, they count against the limits */
        run_mhd(s);
        arm_timer(s);
    }
}

/* ---- Content-Length past 64 bits ---------------------------------------------
 * MHD 0.9.75 refuses such a request itself, before any callback sees its
 * headers, with an HTML 413 whose status line and headers it sends twice.
 * So the header block is looked at first, in the socket (MSG_PEEK: MHD
 * still reads every byte): a Content-Length whose digits overflow 64 bits
 * gets the API's JSON 413 (one status line, Connection: close) and the
 * connection is closed before MHD parses it. */
#define PEEK_MAX 8192
#define PEEK_PER_RUN 64    /* connections looked at per MHD run, newest first */

/* Whether the header block in buf[0, n) has a Content-Length whose value
 * overflows 64 bits (and is a number: MHD's "too large" case). */
static bool length_overflows(const char *buf, size_t n)
{
    static const char name[] = "content-length:";
    for (size_t i = 0; i + sizeof name < n; i++) {
        if ((i > 0 && buf[i - 1] != '\n') || strncasecmp(buf + i, name, sizeof name - 1) != 0)
            continue;
        size_t k = i + sizeof name - 1, d = 0;
        while (k < n && (buf[k] == ' ' || buf[k] == '\t'))
            k++;
        uint64_t v = 0;
        bool over = false;
        for (; k < n && buf[k] >= '0' && buf[k] <= '9'; k++, d++) {
            unsigned dig = (unsigned)(buf[k] - '0');
            over |= v > (UINT64_MAX - dig) / 10;
            v = v * 10 + dig;
        }
        return d > 0 && over;
    }
    return false;
}

static uint64_t now_ms(api_server *s);
static void evict(api_server *s, conn_rec *c, const char *why);

static void send_length_413(api_server *s, int fd)
{
    api_response r = {0};
    api_resp_error(&r, MHD_HTTP_CONTENT_TOO_LARGE, "too_large", "Content-Length",
                   "Content-Length is past 64 bits; request bodies are at most max_body (%llu bytes)",
                   (unsigned long long)s->conf->max_body);
    char head[256];
    int hl = snprintf(head, sizeof head,
                      "HTTP/1.1 413 Content Too Large\r\nContent-Type: application/json\r\nConnection: close\r\n"
                      "Content-Length: %zu\r\n\r\n",
                      r.body_len);
    /* a few hundred bytes into an empty socket buffer: one non-blocking try */
    if (hl > 0 && send(fd, head, (size_t)hl, MSG_NOSIGNAL | MSG_DONTWAIT) == hl && r.body != NULL)
        (void)send(fd, r.body, r.body_len, MSG_NOSIGNAL | MSG_DONTWAIT);
    free(r.body);
    s->counts[413]++;
}

/* Look at what a connection still sending its header has sent so far. */
static void peek_length(api_server *s, conn_rec *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci == NULL)
        return;
    char buf[PEEK_MAX];
    ssize_t n = recv(ci->connect_fd, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT);
    if (n <= 0)
        return;
    /* the header block only: a body may say anything */
    const char *blank = memmem(buf, (size_t)n, "\r\n\r\n", 4), *lf = memmem(buf, (size_t)n, "\n\n", 2);
    if (blank == NULL || (lf != NULL && lf < blank))
        blank = lf;
    if (length_overflows(buf, blank != NULL ? (size_t)(blank - buf) + 1 : (size_t)n)) {
        send_length_413(s, ci->connect_fd);
        c->peeked = true;
        evict(s, c, "Content-Length past 64 bits");
        return;
    }
    /* the whole header block seen (or as much as is looked at): done */
    c->peeked = blank != NULL || (size_t)n == sizeof buf;
}

static void peek_pending(api_server *s)
{
    int k = 0;
    for (conn_rec *c = s->pend_tail, *prev; c != NULL && k < PEEK_PER_RUN; c = prev) {
        prev = c->prev;
        if (c->headers_done || c->peeked || c->evicted)
            continue;
        k++;
        peek_length(s, c);
    }
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    api_server *s = cls;
    conn_rec *c = *socket_context;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        c = calloc(1, sizeof *c);
        if (c == NULL)
            return; /* untracked: MHD's idle timeout still applies */
        c->conn = conn;
        *socket_context = c;
        pend_start(s, c);
        peek_length(s, c); /* MHD reads what has come in this same run */
    } else if (c != NULL) {
        pend_unlink(s, c);
        free(c);
        *socket_context = NULL;
    }
}

/* ---- requests ----------------------------------------------------------------- */

static enum MHD_Result kv_add(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                              const char *value, size_t value_size)
{
    kv_list *l = cls;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        api_kv *nv = realloc(l->v, cap * sizeof *nv);
        if (nv == NULL) {
            l->failed = true;
            return MHD_NO;
        }
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = (api_kv){.key = key ? key : "", .key_len = key ? key_size : 0, .value = value,
                            .value_len = value ? value_size : 0};
    return MHD_YES;
}

/* MHD's unescaping of the path and the query pairs: api_unescape(). */
static size_t unescape(void *cls, struct MHD_Connection *conn, char *s) { return api_unescape(s); }

static void route(api_server *s, struct MHD_Connection *conn, const char *url, const char *method,
                  req_ctx *rc, api_response *resp)
{
    kv_list q = {0}, h = {0};
    MHD_get_connection_values_n(conn, MHD_GET_ARGUMENT_KIND, kv_add, &q);
    MHD_get_connection_values_n(conn, MHD_HEADER_KIND, kv_add, &h);
    api_request req = {.who = &rc->who, .method = method, .path = url, .path_len = strlen(url), .conn = conn,
                       .query = q.v, .nquery = q.n, .headers = h.v, .nheaders = h.n,
                       .body = rc->body ? rc->body : "", .body_len = rc->len, .body_too_big = rc->too_big};
    if (q.failed || h.failed)
        api_resp_error(resp, 500, "internal", NULL, "out of memory");
    else if (rc->too_big)
        api_resp_error(resp, 413, "too_large", NULL, "request body over max_body (%llu bytes)",
                       (unsigned long long)s->conf->max_body);
    else
        api_route(s, &req, resp);
    free(q.v);
    free(h.v);
}

static void log_request(const char *method, const char *url, int status)
{
    char m[32], u[256];
    api_safe_text(method, strlen(method), m, sizeof m);
    api_safe_text(url, strlen(url), u, sizeof u);
    acc_log(ACC_LOG_DEBUG, "http", "%s %s -> %d", m, u, status);
}

/* MHD's first look at a request: remember where its target starts and how
 * long it looks as a C string (raw_nul below). */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *conn)
{
    req_ctx *rc = calloc(1, sizeof *rc);
    if (rc != NULL) {
        rc->raw_uri = uri;
        rc->raw_len = strlen(uri);
    }
    return rc;
}

/* A raw NUL byte inside the request target: MHD hands the target on as a
 * C string, cut at the NUL ("j000001\0x" would name j000001). MHD 0.9.x
 * parses the request line in place, so the version follows the target's
 * terminator; when it starts further on, the target held a NUL. (Where the
 * version lies elsewhere the layout is not the known one: no verdict.) */
static bool raw_nul(const req_ctx *rc, const char *version, api_response *r)
{
    if (rc->raw_uri == NULL || version <= rc->raw_uri + rc->raw_len + 1 || version - rc->raw_uri > 65536)
        return false;
    api_resp_error(r, MHD_HTTP_BAD_REQUEST, "invalid", NULL, "the request target contains a NUL byte");
    return true;
}

/* A NUL byte inside a header. MHD 0.9 gives header values as C strings,
 * cut at a NUL ("Bearer <token>\0junk" would pass as the token). It parses
 * the header block in place: each line's end ("\r\n" or "\n") turned into
 * NULs, the next header's name right after it. So after a value come one
 * or two line-end bytes and then the next name (or, after the last, the
 * blank line): anything else there is the rest of a value cut at a NUL. */
typedef struct hdr_scan {
    const char *prev_end;  /* the end of the previous value */
    bool nul;
} hdr_scan;

static bool line_end_byte(char c) { return c == '\0' || c == '\r' || c == '\n'; }

static enum MHD_Result hdr_scan_one(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                                    const char *value, size_t value_size)
{
    hdr_scan *h = cls;
    if (h->prev_end != NULL && key > h->prev_end) { /* in place, in order: the bytes between are known */
        size_t gap = (size_t)(key - h->prev_end);
        for (size_t i = 0; i < gap && !h->nul; i++)
            h->nul = gap > 2 || !line_end_byte(h->prev_end[i]);
    }
    h->prev_end = value != NULL ? value + value_size : NULL;
    return h->nul ? MHD_NO : MHD_YES;
}

/* The header block starts with the method (in place too, just before the
 * target): after the last value, up to its end, only its line end and
 * the blank line (at most 4 bytes). Elsewhere: no verdict on it. */
static bool last_value_nul(struct MHD_Connection *conn, const req_ctx *rc, const char *method, const char *end_value)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
    if (ci == NULL || rc->raw_uri == NULL || method >= rc->raw_uri || rc->raw_uri - method > 64)
        return !line_end_byte(end_value[0]) || !line_end_byte(end_value[1]);
    const char *end = method + ci->header_size;
    if (end < end_value || end - end_value > 4)
        return end >= end_value;
    for (const char *p = end_value; p < end; p++)
        if (!line_end_byte(*p))
            return true;
    return false;
}

static bool header_nul(struct MHD_Connection *conn, const req_ctx *rc, const char *method, api_response *r)
{
    hdr_scan h = {0};
    MHD_get_connection_values_n(conn, MHD_HEADER_KIND, hdr_scan_one, &h);
    if (!h.nul && h.prev_end != NULL)
        h.nul = last_value_nul(conn, rc, method, h.prev_end);
    if (h.nul)
        api_resp_error(r, MHD_HTTP_BAD_REQUEST, "invalid", NULL, "a header contains a NUL byte");
    return h.nul;
}

/* ---- deferred answers (api_defer) ------------------------------------------ */

static void deferred_unlink(api_deferred *d)
{
    api_server *s = d->srv;
    if (s == NULL)
        return;
    if (d->prev != NULL)
        d->prev->next = d->next;
    else if (s->deferred == d)
        s->deferred = d->next;
    if (d->next != NULL)
        d->next->prev = d->prev;
    d->prev = d->next = NULL;
    s->ndeferred--;
}

static void deferred_free(api_deferred *d)
{
    free(d->resp.body);
    free(d);
}

api_deferred *api_defer(api_server *s, api_work_fn work, api_done_fn done, void *ctx)
{
    api_deferred *d = s->ndeferred < API_MAX_DEFERRED ? calloc(1, sizeof *d) : NULL;
    if (d == NULL) {
        done(ctx, NULL, true);
        return NULL;
    }
    d->srv = s;
    d->work = work;
    d->done = done;
    d->ctx = ctx;
    d->work_req.data = d;
    d->next = s->deferred;
    if (s->deferred != NULL)
        s->deferred->prev = d;
    s->deferred = d;
    s->ndeferred++;
    return d;
}

/* ---- api_defer_json: a JSON computation of the body on the thread pool */
typedef struct json_job {
    api_json_fn compute;
    const void *arg;
    size_t flags;
    char *body;
    size_t len;
    int rc;
    acc_err err;
    json_t *out;
} json_job;

static void json_job_work(void *ctx)
{
    json_job *c = ctx;
    c->rc = c->compute(c->arg, c->body, c->len, &c->out, &c->err);
}

static void json_job_done(void *ctx, api_response *resp, bool orphaned)
{
    json_job *c = ctx;
    if (!orphaned && resp != NULL) {
        if (c->rc != 0) {
            api_resp_from_err(resp, &c->err);
        } else {
            api_resp_json_obj(resp, 200, c->out, c->flags);
            c->out = NULL; /* taken */
        }
    }
    json_decref(c->out);
    free(c->body);
    free(c);
}

void api_defer_json(api_server *s, const api_request *req, api_response *resp, api_json_fn compute,
                    const void *arg, size_t flags, const char *empty)
{
    if (req->body_len == 0) {
        api_resp_error(resp, 400, "invalid", NULL, "%s", empty);
        return;
    }
    json_job *c = calloc(1, sizeof *c);
    char *body = malloc(req->body_len + 1);
    if (c == NULL || body == NULL) {
        free(c);
        free(body);
        api_resp_error(resp, 500, "internal", NULL, "out of memory");
        return;
    }
    memcpy(body, req->body, req->body_len);
    body[req->body_len] = '\0';
    *c = (json_job){.compute = compute, .arg = arg, .flags = flags, .body = body, .len = req->body_len};
    resp->deferred = api_defer(s, json_job_work, json_job_done, c);
    if (resp->deferred == NULL)
        api_resp_error(resp, 503, "unavailable", NULL,
                       "too many requests being worked on (at most %d at a time); try again", API_MAX_DEFERRED);
}

/* Heavy requests waiting or worked on: in all, and of `user`. */
static void count_heavy(const api_server *s, const char *user, int *all, int *mine)
{
    *all = *mine = 0;
    for (const api_deferred *d = s->deferred; d != NULL; d = d->next)
        if (d->heavy) {
            (*all)++;
            *mine += !strcmp(d->user, user);
        }
}

void api_defer_json_heavy(api_server *s, const api_request *req, api_response *resp, api_json_fn compute,
                          const void *arg, size_t flags, const char *empty)
{
    int all, mine;
    count_heavy(s, req->who->name, &all, &mine);
    if (req->body_len > 0 && mine >= s->conf->heavy_requests_per_user) {
        api_resp_error(resp, 429, "too_many_requests", NULL,
                       "%d request(s) of yours like this are being worked on (heavy_requests_per_user %d); "
                       "try again when they are answered", mine, s->conf->heavy_requests_per_user);
        return;
    }
    if (req->body_len > 0 && all >= s->conf->heavy_requests_max) {
        api_resp_error(resp, 429, "too_many_requests", NULL,
                       "%d requests like this are being worked on (heavy_requests_max %d); try again shortly", all,
                       s->conf->heavy_requests_max);
        return;
    }
    api_defer_json(s, req, resp, compute, arg, flags, empty);
    if (resp->deferred != NULL) {
        resp->deferred->heavy = true;
        snprintf(resp->deferred->user, sizeof resp->deferred->user, "%s", req->who->name);
    }
}

static void on_deferred_work(uv_work_t *w)
{
    api_deferred *d = w->data;
    d->work(d->ctx);
}

static void on_deferred_done(uv_work_t *w, int status)
{
    api_deferred *d = w->data;
    d->work_done = true;
    if (d->orphaned) { /* answered 503 at the stop; the server may be gone */
        d->done(d->ctx, NULL, true);
        if (d->rc == NULL) /* else its request frees it */
            deferred_free(d);
        return;
    }
    d->resp.status = 500;
    d->done(d->ctx, &d->resp, false);
    if (status != 0 && d->resp.body == NULL)
        api_resp_error(&d->resp, 500, "internal", NULL, "the request's work did not run: %s", uv_strerror(status));
    d->finished = true;
    api_server *s = d->srv;
    deferred_unlink(d);
    MHD_resume_connection(d->conn);
    api_server_kick(s);
}

/* Suspend the connection and start the work; false when it cannot start. */
static bool deferred_start(api_server *s, struct MHD_Connection *conn, req_ctx *rc, api_deferred *d)
{
    d->conn = conn;
    /* its completion runs on this (the loop) thread, so not before we return */
    int e = uv_queue_work(s->loop, &d->work_req, on_deferred_work, on_deferred_done);
    if (e == 0) {
        d->rc = rc;
        rc->deferred = d;
        MHD_suspend_connection(conn);
        return true;
    }
    deferred_unlink(d);
    d->done(d->ctx, NULL, true);
    deferred_free(d);
    acc_log(ACC_LOG_ERROR, "http", "cannot queue a request's work: %s", uv_strerror(e));
    return false;
}

/* Shutdown: every waiting request gets a 503 now; its work finishes alone. */
static void deferred_orphan_all(api_server *s)
{
    while (s->deferred != NULL) {
        api_deferred *d = s->deferred;
        deferred_unlink(d);
        d->srv = NULL;
        d->orphaned = true;
        api_resp_error(&d->resp, 503, "unavailable", NULL, "the daemon is shutting down; request not done");
        MHD_resume_connection(d->conn);
    }
}

/* The answer of a deferred request, once resumed. */
static enum MHD_Result deferred_answer(api_server *s, struct MHD_Connection *conn, req_ctx *rc)
{
    api_deferred *d = rc->deferred;
    enum MHD_Result ok = queue(s, conn, &d->resp);
    rc->deferred = NULL;
    if (d->work_done)
        deferred_free(d);
    else
        d->rc = NULL; /* orphaned: freed when its work completes */
    return ok;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_size, void **con_cls)
{
    api_server *s = cls;
    req_ctx *rc = *con_cls;
    if (rc == NULL && (rc = *con_cls = calloc(1, sizeof *rc)) == NULL)
        return MHD_NO;
    if (!rc->started) { /* the headers are in */
        rc->started = true;
        conn_rec *cr = rec_of(conn);
        if (cr != NULL)
            cr->headers_done = true;
        api_response early = {.status = 0};
        if (raw_nul(rc, version, &early) || header_nul(conn, rc, method, &early) || refuse_coding(conn, &early) ||
            refuse_early(s, conn, url, &early, &rc->who)) {
            rc->answered = true; /* still pending: a body may follow, under request_timeout */
            log_request(method, url, early.status);
            return queue(s, conn, &early);
        }
        return MHD_YES; /* headers only; the body (if any) comes next */
    }
    if (rc->answered) { /* refused from the headers: drop the body */
        conn_rec *cr = rec_of(conn);
        if (*upload_size == 0 && cr != NULL)
            pend_unlink(s, cr);
        *upload_size = 0;
        return MHD_YES;
    }
    if (rc->deferred != NULL) { /* resumed: finished, or a 503 at the stop */
        if (!rc->deferred->finished && !rc->deferred->orphaned)
            return MHD_YES; /* cannot happen: suspended until then */
        return deferred_answer(s, conn, rc);
    }
    if (*upload_size > 0) {
        if (body_append(rc, upload_data, *upload_size, s->conf->max_body) != 0)
            return MHD_NO;
        *upload_size = 0; /* past max_body the rest is read and dropped; 413 at the end */
        return MHD_YES;
    }
    conn_rec *cr = rec_of(conn);
    if (cr != NULL)
        pend_unlink(s, cr); /* the whole request is in: no deadline while it is answered */
    api_response resp = {.status = 500};
    route(s, conn, url, method, rc, &resp);
    if (resp.deferred != NULL) {
        free(resp.body);
        if (deferred_start(s, conn, rc, resp.deferred))
            return MHD_YES; /* answered when its work is done */
        api_resp_error(&resp, 503, "unavailable", NULL, "cannot start the request's work; try again");
    }
    log_request(method, url, resp.stream ? 200 : resp.status);
    return queue(s, conn, &resp);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    api_server *s = cls;
    conn_rec *cr = rec_of(conn);
    if (cr != NULL && toe == MHD_REQUEST_TERMINATED_COMPLETED_OK)
        pend_start(s, cr); /* keep-alive: the next request's clock starts now */
    req_ctx *rc = *con_cls;
    if (rc != NULL) {
        api_deferred *d = rc->deferred;
        if (d != NULL && !d->work_done)
            d->rc = NULL; /* orphaned, its work still runs: that frees d */
        else if (d != NULL)
            deferred_free(d); /* the answer was never sent */
        free(rc->body);
        free(rc);
        *con_cls = NULL;
    }
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n > 0 && line[n - 1] == '\n')
        line[--n] = '\0';
    /* a client that went away (or that we closed) is no news */
    acc_log(strstr(line, "connection closure") ? ACC_LOG_DEBUG : ACC_LOG_WARN, "http", "%s", line);
}

static int resolve(const acc_conf *conf, struct sockaddr_storage *ss, socklen_t *len, acc_err *err)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", conf->listen_port);
    int rc = getaddrinfo(conf->listen_host, port, &hints, &res);
    if (rc != 0 || res == NULL)
        return acc_err_set(err, ACC_EINVAL, "listen", "cannot resolve listen address '%s': %s",
                           conf->listen_host, gai_strerror(rc));
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

/* The port of the bound socket, and whether its address calls for the
 * token: the decision is made on the address bound, not on the name. */
static int bound_port(struct MHD_Daemon *mhd, bool *needs_token)
{
    const union MHD_DaemonInfo *fdi = MHD_get_daemon_info(mhd, MHD_DAEMON_INFO_LISTEN_FD);
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    *needs_token = true;
    if (fdi == NULL || getsockname(fdi->listen_fd, (struct sockaddr *)&ss, &len) != 0)
        return -1;
    *needs_token = !conf_addr_is_loopback((struct sockaddr *)&ss);
    if (ss.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

int api_server_start(api_server **out, uv_loop_t *loop, const acc_conf *conf, void *app, acc_err *err)
{
    struct sockaddr_storage ss;
    socklen_t sslen;
    if (resolve(conf, &ss, &sslen, err) != 0)
        return err ? err->code : ACC_EINVAL;
    api_server *s = calloc(1, sizeof *s);
    if (s == NULL)
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    s->loop = loop;
    s->conf = conf;
    s->app = app;
    s->audit.fd = -1;
    if (api_auth_load(conf, s->token, sizeof s->token, err) != 0) {
        free(s);
        return err ? err->code : ACC_EIO;
    }
    if (conf->users_file[0] != '\0') {
        if (api_users_load(conf->users_file, &s->users, err) != 0) {
            free(s);
            return err ? err->code : ACC_EINVAL;
        }
        s->have_users = true;
    }
    if (api_audit_open(&s->audit, conf->state_dir, err) != 0) {
        api_users_free(&s->users);
        free(s);
        return err ? err->code : ACC_EIO;
    }
    unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (ss.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    s->mhd = MHD_start_daemon(flags, (uint16_t)conf->listen_port, NULL, NULL, on_request, s,
                              MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, s,
                              MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned)conf->max_connections,
                              MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)conf->max_connections_per_ip,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)conf->connection_timeout,
                              MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                              MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                              MHD_OPTION_UNESCAPE_CALLBACK, unescape, s,
                              MHD_OPTION_URI_LOG_CALLBACK, on_uri, s,
                              MHD_OPTION_END);
    if (s->mhd == NULL) {
        api_users_free(&s->users);
        api_audit_close(&s->audit);
        free(s);
        return acc_err_set(err, ACC_EIO, "listen", "cannot listen on %s (address in use or not permitted)",
                           conf->listen);
    }
    s->port = bound_port(s->mhd, &s->require_token);
    s->require_token = s->require_token || conf->require_token;
    const union MHD_DaemonInfo *ep = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_EPOLL_FD);
    int rc = ep ? uv_poll_init(loop, &s->poll, ep->epoll_fd) : UV_EINVAL;
    if (rc == 0)
        rc = uv_timer_init(loop, &s->timer);
    if (rc == 0 && (rc = uv_timer_init(loop, &s->ping)) != 0)
        uv_close((uv_handle_t *)&s->timer, NULL);
    if (rc == 0 && (rc = uv_timer_init(loop, &s->reap)) != 0) {
        uv_close((uv_handle_t *)&s->timer, NULL);
        uv_close((uv_handle_t *)&s->ping, NULL);
    }
    if (rc != 0) {
        MHD_stop_daemon(s->mhd);
        api_users_free(&s->users);
        api_audit_close(&s->audit);
        free(s);
        return acc_err_set(err, ACC_EIO, NULL, "cannot watch the HTTP server: %s", uv_strerror(rc));
    }
    s->poll.data = s;
    s->timer.data = s;
    s->ping.data = s;
    s->reap.data = s;
    s->open_handles = 4;
    if ((rc = uv_poll_start(&s->poll, UV_READABLE, on_poll)) != 0 ||
        (rc = uv_timer_start(&s->ping, on_ping, API_PING_MS, API_PING_MS)) != 0 ||
        (rc = uv_timer_start(&s->reap, on_reap, API_REAP_MS, API_REAP_MS)) != 0)
        acc_log(ACC_LOG_ERROR, "http", "cannot watch the HTTP server: %s", uv_strerror(rc));
    arm_timer(s);
    *out = s;
    return 0;
}

static void on_ping(uv_timer_t *t)
{
    api_server *s = t->data;
    api_stream_ping_all(s);
}

int api_server_port(const api_server *s) { return s->port; }

uint64_t api_server_count(const api_server *s, int code)
{
    return code >= 100 && code < 600 ? s->counts[code] : 0;
}

const acc_conf *api_server_conf(const api_server *s) { return s->conf; }

bool api_server_requires_token(const api_server *s) { return s->require_token; }

uint64_t api_server_evicted(const api_server *s) { return s->evicted_total; }

api_stream **api_server_streams(api_server *s) { return &s->streams; }
struct api_fstream **api_server_fstreams(api_server *s) { return &s->fstreams; }
uv_loop_t *api_server_loop(api_server *s) { return s->loop; }

void api_server_kick(api_server *s)
{
    if (s->mhd != NULL)
        uv_timer_start(&s->timer, on_timer, 0, 0);
}

void *api_server_app(const api_server *s) { return s->app; }

api_audit *api_server_audit(api_server *s) { return &s->audit; }

int api_server_reload_users(api_server *s, acc_err *err)
{
    if (s == NULL || s->conf->users_file[0] == '\0')
        return 0;
    api_users fresh;
    int rc = api_users_load(s->conf->users_file, &fresh, err);
    if (rc != 0)
        return rc; /* the users of before stay */
    api_users_free(&s->users);
    s->users = fresh;
    s->have_users = true;
    return 0;
}

void api_server_quiesce(api_server *s)
{
    if (s == NULL || s->mhd == NULL)
        return;
    /* external polling: the listen socket is ours to close, so new
     * clients are refused at once instead of waiting in the backlog */
    MHD_socket fd = MHD_quiesce_daemon(s->mhd);
    if (fd != MHD_INVALID_SOCKET)
        close(fd);
}

static void server_free(api_server *s)
{
    api_users_free(&s->users);
    api_audit_close(&s->audit);
    free(s);
}

static void on_handle_closed(uv_handle_t *h)
{
    api_server *s = h->data;
    if (--s->open_handles == 0)
        server_free(s);
}

void api_server_stop(api_server *s)
{
    if (s == NULL)
        return;
    if (s->mhd != NULL) {
        /* MHD must not be stopped with suspended connections */
        api_stream_end_all(s);
        api_fstream_end_all(s);
        api_generate_end_all(s);
        deferred_orphan_all(s);
        MHD_run(s->mhd);
        MHD_stop_daemon(s->mhd);
        s->mhd = NULL;
    }
    if (s->open_handles > 0) {
        uv_close((uv_handle_t *)&s->poll, on_handle_closed);
        uv_close((uv_handle_t *)&s->timer, on_handle_closed);
        uv_close((uv_handle_t *)&s->ping, on_handle_closed);
        uv_close((uv_handle_t *)&s->reap, on_handle_closed);
    } else {
        server_free(s);
    }
}
