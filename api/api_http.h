/* api_http: the HTTP server, libmicrohttpd driven from the daemon's libuv loop.
 *
 * MHD runs without threads of its own: its epoll fd is watched by a uv_poll_t
 * and its timeouts by a uv_timer_t, so every request handler runs on the loop
 * thread, the one thread that owns HTTP and job state. Request bodies are
 * collected up to the configured max_body (413 past it), then the whole
 * request is handed to api_route(). Errors are JSON:
 *   {"error":{"code":"invalid","message":"...","field":"optimizer.lr"}}
 *
 * Before any body is read, the server refuses what it can from the headers
 * alone: 401 without the bearer token (every path but /healthz, when the
 * config requires it) and 413 for a Content-Length over max_body. It counts
 * answers by status code for /metrics. Long-lived event streams
 * (api_stream.c) are suspended MHD connections resumed by their job's event
 * ring: no thread and no polling per watcher.
 */
#ifndef ACC_API_HTTP_H
#define ACC_API_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include <uv.h>

#include "conf.h"
#include "err.h"

struct MHD_Connection;
struct MHD_Response;
struct evring;
typedef struct api_server api_server;

typedef struct api_request {
    const char *method;          /* "GET", "POST", ... */
    const char *path;            /* without the query string */
    struct MHD_Connection *conn; /* for query arguments and headers */
    const char *body;            /* NUL-terminated, body_len bytes */
    size_t body_len;
    bool body_too_big;
} api_request;

typedef struct api_response {
    int status;
    const char *content_type;    /* default application/json */
    char *body;                  /* malloc'd, owned by the response */
    size_t body_len;
    char location[256];          /* Location header when non-empty */
    const char *allow;           /* Allow header (405) when non-NULL */
    struct api_stream *stream;   /* an event stream instead of a body */
} api_response;

typedef struct api_stream api_stream;

/* Start serving on conf->listen. `app` is handed to the routes unchanged. */
int api_server_start(api_server **out, uv_loop_t *loop, const acc_conf *conf, void *app, acc_err *err);

/* The port actually bound (differs from the config when it asked for 0). */
int api_server_port(const api_server *s);

/* Stop accepting new connections; requests in flight complete. */
void api_server_quiesce(api_server *s);

/* Close everything. The uv handles close asynchronously; run the loop after. */
void api_server_stop(api_server *s);

/* The opaque pointer given to api_server_start. */
void *api_server_app(const api_server *s);

/* Answers sent with HTTP status `code` since start (100..599). */
uint64_t api_server_count(const api_server *s, int code);
const acc_conf *api_server_conf(const api_server *s);

/* Run MHD soon (after a connection was resumed outside its callbacks). */
void api_server_kick(api_server *s);

/* The server's list of open streams (api_stream.c links itself in). */
api_stream **api_server_streams(api_server *s);

/* api_stream.c: stream a job's event ring from sequence `from` on,
 * as SSE or NDJSON. The stream is freed with its MHD response. */
api_stream *api_stream_new(api_server *s, struct MHD_Connection *conn, struct evring *ring, uint64_t from,
                           bool ndjson);
struct MHD_Response *api_stream_response(api_stream *st);
/* Shutdown: let every stream end and resume the suspended ones. */
void api_stream_end_all(api_server *s);
/* Keep-alive: wake suspended SSE streams so they send a comment (and
 * notice clients that left). */
void api_stream_ping_all(api_server *s);

/* api_auth.c: the bearer token. Read token_file, or create it (0600) with
 * a fresh random token when missing. */
int api_auth_load(const acc_conf *conf, char *token, size_t n, acc_err *err);
/* True when the request carries "Authorization: Bearer <token>". */
bool api_auth_ok(struct MHD_Connection *conn, const char *token);

/* api_metrics.c: the Prometheus text exposition of /metrics. */
char *api_metrics_text(api_server *s, size_t *len);

/* api_tokenize.c: POST /v1/tokenize. The compute part opens the tokenizer
 * directory and may take long (thread-pool safe); the route calls it. */
int api_tokenize_compute(const acc_conf *conf, const char *body, size_t len, json_t **out, acc_err *err);
void api_tokenize(api_server *s, const api_request *req, api_response *resp);

/* Routing, implemented in api_routes.c: fill `resp` for `req`. */
void api_route(api_server *s, const api_request *req, api_response *resp);

/* Helpers for routes. */
void api_resp_json(api_response *resp, int status, const char *json_text);
void api_resp_error(api_response *resp, int status, const char *code, const char *field,
                    const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Map an acc_err to its HTTP status and fill the error body. */
void api_resp_from_err(api_response *resp, const acc_err *err);
int api_status_of(int acc_code);

#endif
