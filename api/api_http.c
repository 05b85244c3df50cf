#include "api_http.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"

#define API_PING_MS 15000 /* keep-alive comment on idle event streams */

struct api_server {
    struct MHD_Daemon *mhd;
    uv_loop_t *loop;
    uv_poll_t poll;
    uv_timer_t timer;
    uv_timer_t ping;
    const acc_conf *conf;
    void *app;
    int port;
    int open_handles;
    char token[128];
    uint64_t counts[600];  /* answers by HTTP status */
    api_stream *streams;
};

/* Per-request state kept by MHD between handler calls. */
typedef struct req_ctx {
    char *body;
    size_t len, cap;
    bool too_big;
    bool answered;   /* refused from the headers already */
} req_ctx;

static void arm_timer(api_server *s);
static void on_ping(uv_timer_t *t);

static void on_poll(uv_poll_t *h, int status, int events)
{
    api_server *s = h->data;
    if (status < 0)
        acc_log(ACC_LOG_WARN, "http", "poll error: %s", uv_strerror(status));
    MHD_run(s->mhd);
    arm_timer(s);
}

static void on_timer(uv_timer_t *t)
{
    api_server *s = t->data;
    MHD_run(s->mhd);
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

void api_resp_error(api_response *resp, int status, const char *code, const char *field,
                    const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    json_t *e = json_pack("{s:{s:s, s:s, s:s?}}", "error", "code", code, "message", msg,
                          "field", (field && *field) ? field : NULL);
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
    if (r->status == MHD_HTTP_UNAUTHORIZED)
        MHD_add_response_header(mr, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"accumd\"");
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

/* What can be refused before reading a body: a missing or wrong token
 * (everything but /healthz), a declared body over max_body. */
static bool refuse_early(api_server *s, struct MHD_Connection *conn, const char *url, api_response *r)
{
    if (s->conf->require_token && strcmp(url, "/healthz") != 0 && !api_auth_ok(conn, s->token)) {
        api_resp_error(r, MHD_HTTP_UNAUTHORIZED, "unauthorized", NULL,
                       "missing or wrong bearer token (Authorization: Bearer <token from token_file>)");
        return true;
    }
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl != NULL && strtoull(cl, NULL, 10) > s->conf->max_body) {
        api_resp_error(r, MHD_HTTP_CONTENT_TOO_LARGE, "too_large", NULL, "request body over max_body (%llu bytes)",
                       (unsigned long long)s->conf->max_body);
        return true;
    }
    return false;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_size, void **con_cls)
{
    api_server *s = cls;
    req_ctx *rc = *con_cls;
    if (rc == NULL) {
        rc = calloc(1, sizeof *rc);
        if (rc == NULL)
            return MHD_NO;
        *con_cls = rc;
        api_response early = {.status = 0};
        if (refuse_early(s, conn, url, &early)) {
            rc->answered = true;
            acc_log(ACC_LOG_DEBUG, "http", "%s %s -> %d", method, url, early.status);
            return queue(s, conn, &early);
        }
        return MHD_YES; /* headers only; the body (if any) comes next */
    }
    if (rc->answered) { /* refused from the headers: drop the body */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size > 0) {
        if (body_append(rc, upload_data, *upload_size, s->conf->max_body) != 0)
            return MHD_NO;
        *upload_size = 0; /* past max_body the rest is read and dropped; 413 at the end */
        return MHD_YES;
    }
    api_request req = {.method = method, .path = url, .conn = conn,
                       .body = rc->body ? rc->body : "", .body_len = rc->len,
                       .body_too_big = rc->too_big};
    api_response resp = {.status = 500};
    if (rc->too_big)
        api_resp_error(&resp, 413, "too_large", NULL, "request body over max_body (%llu bytes)",
                       (unsigned long long)s->conf->max_body);
    else
        api_route(s, &req, &resp);
    acc_log(ACC_LOG_DEBUG, "http", "%s %s -> %d", method, url, resp.stream ? 200 : resp.status);
    return queue(s, conn, &resp);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    req_ctx *rc = *con_cls;
    if (rc != NULL) {
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
    acc_log(ACC_LOG_WARN, "http", "%s", line);
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

static int bound_port(struct MHD_Daemon *mhd)
{
    const union MHD_DaemonInfo *fdi = MHD_get_daemon_info(mhd, MHD_DAEMON_INFO_LISTEN_FD);
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (fdi == NULL || getsockname(fdi->listen_fd, (struct sockaddr *)&ss, &len) != 0)
        return -1;
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
    if (api_auth_load(conf, s->token, sizeof s->token, err) != 0) {
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
                              MHD_OPTION_END);
    if (s->mhd == NULL) {
        free(s);
        return acc_err_set(err, ACC_EIO, "listen", "cannot listen on %s (address in use or not permitted)",
                           conf->listen);
    }
    s->port = bound_port(s->mhd);
    const union MHD_DaemonInfo *ep = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_EPOLL_FD);
    int rc = ep ? uv_poll_init(loop, &s->poll, ep->epoll_fd) : UV_EINVAL;
    if (rc == 0)
        rc = uv_timer_init(loop, &s->timer);
    if (rc == 0 && (rc = uv_timer_init(loop, &s->ping)) != 0)
        uv_close((uv_handle_t *)&s->timer, NULL);
    if (rc != 0) {
        MHD_stop_daemon(s->mhd);
        free(s);
        return acc_err_set(err, ACC_EIO, NULL, "cannot watch the HTTP server: %s", uv_strerror(rc));
    }
    s->poll.data = s;
    s->timer.data = s;
    s->ping.data = s;
    s->open_handles = 3;
    if ((rc = uv_poll_start(&s->poll, UV_READABLE, on_poll)) != 0 ||
        (rc = uv_timer_start(&s->ping, on_ping, API_PING_MS, API_PING_MS)) != 0)
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

api_stream **api_server_streams(api_server *s) { return &s->streams; }

void api_server_kick(api_server *s)
{
    if (s->mhd != NULL)
        uv_timer_start(&s->timer, on_timer, 0, 0);
}

void *api_server_app(const api_server *s) { return s->app; }

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

static void on_handle_closed(uv_handle_t *h)
{
    api_server *s = h->data;
    if (--s->open_handles == 0)
        free(s);
}

void api_server_stop(api_server *s)
{
    if (s == NULL)
        return;
    if (s->mhd != NULL) {
        /* MHD must not be stopped with suspended connections */
        api_stream_end_all(s);
        MHD_run(s->mhd);
        MHD_stop_daemon(s->mhd);
        s->mhd = NULL;
    }
    if (s->open_handles > 0) {
        uv_close((uv_handle_t *)&s->poll, on_handle_closed);
        uv_close((uv_handle_t *)&s->timer, on_handle_closed);
        uv_close((uv_handle_t *)&s->ping, on_handle_closed);
    } else {
        free(s);
    }
}
