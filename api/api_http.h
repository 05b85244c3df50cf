/* api_http: the HTTP server, libmicrohttpd driven from the daemon's libuv loop.
 *
 * MHD runs without threads of its own: its epoll fd is watched by a uv_poll_t
 * and its timeouts by a uv_timer_t, so every request handler runs on the loop
 * thread, the one thread that owns HTTP and job state. Request bodies are
 * collected up to the configured max_body (413 past it), then the whole
 * request is handed to api_route(). Errors are JSON:
 *   {"error":{"code":"invalid","message":"...","field":"optimizer.lr"}}
 */
#ifndef ACC_API_HTTP_H
#define ACC_API_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "conf.h"
#include "err.h"

struct MHD_Connection;
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
} api_response;

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
