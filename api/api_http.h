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
 * config requires it) or with one that no user has, and 413 for a
 * Content-Length over max_body. A NUL byte in any header is a 400, a
 * Transfer-Encoding other than chunked a 501 at once, a Content-Length past
 * 64 bits a JSON 413 with one status line (each closing the connection). The token says who asks (api_ident): with
 * a users file, the user it belongs to; token_file's token is the admin
 * "admin"; no token on an open loopback is "anonymous", an admin without a
 * users file (everyone could do everything before users existed) and a
 * plain user with one. It counts answers by status code for /metrics. A
 * connection must send its whole request header within header_timeout and
 * its whole request within request_timeout, counted from its start (or the
 * end of its previous request), however slowly it trickles; at most
 * max_pending_connections are still sending (past that the oldest is
 * closed), so a flood of slow clients never takes the slots of the others.
 * Long-lived event streams
 * (api_stream.c) are suspended MHD connections resumed by their job's event
 * ring: no thread and no polling per watcher; they are counted apart, per
 * user and in total (api_stream_admit), so the rest of the connection
 * slots always serve /healthz, submits, cancels and lists.
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

/* A query pair or a header as the client sent it (unescaped), with real
 * lengths: a NUL inside shows as a length longer than strlen(). */
typedef struct api_kv {
    const char *key, *value;     /* value NULL: a bare query key, no '=' */
    size_t key_len, value_len;
} api_kv;
/* Who sends a request (api_users.c): a user of the users file, the
 * admin of token_file, or "anonymous" on an open loopback. */
enum { API_ROLE_USER = 0, API_ROLE_ADMIN = 1 };
#define API_NAME_MAX 64
#define API_HASH_LEN 32          /* SHA-256 */
#define API_ANONYMOUS "anonymous"
#define API_TOKEN_ADMIN "admin"  /* the name of token_file's token */

typedef struct api_ident {
    char name[API_NAME_MAX];
    int role;                    /* API_ROLE_* */
} api_ident;

typedef struct api_user {
    char name[API_NAME_MAX];
    int role;
    unsigned char hash[API_HASH_LEN];
} api_user;

typedef struct api_users {
    api_user *u;
    size_t n, cap;
} api_users;

typedef struct api_audit {
    int fd;
    char path[4200];
} api_audit;

typedef struct api_request {
    const api_ident *who;        /* never NULL */
    const char *method;          /* "GET", "POST", ... */
    const char *path;            /* without the query string */
    size_t path_len;
    struct MHD_Connection *conn; /* for streams (NULL when fuzzing) */
    const api_kv *query;         /* query pairs, in order */
    size_t nquery;
    const api_kv *headers;
    size_t nheaders;
    const char *body;            /* NUL-terminated, body_len bytes */
    size_t body_len;
    bool body_too_big;
} api_request;

typedef struct api_deferred api_deferred;

typedef struct api_response {
    int status;
    const char *content_type;    /* default application/json */
    char *body;                  /* malloc'd, owned by the response */
    size_t body_len;
    char location[256];          /* Location header when non-empty */
    const char *allow;           /* Allow header (405) when non-NULL */
    const char *etag;            /* ETag header when non-NULL (api_ui.c) */
    const char *cache_control;   /* Cache-Control header when non-NULL */
    const char *csp;             /* Content-Security-Policy (and nosniff) when non-NULL */
    struct api_stream *stream;   /* an event stream instead of a body */
    bool close;                  /* Connection: close: the connection ends after this answer */
    struct MHD_Response *mhd;    /* a prepared response (a file download, api_files.c) instead of a body */
    api_deferred *deferred;      /* answered later (api_defer) instead of now */
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

/* Whether requests need the bearer token: require_token, or forced on
 * because the socket bound is not a loopback address. */
bool api_server_requires_token(const api_server *s);

/* Connections closed for missing header_timeout / request_timeout or to
 * keep the reserve (max_pending_connections), since start. */
uint64_t api_server_evicted(const api_server *s);

/* Run MHD soon (after a connection was resumed outside its callbacks). */
void api_server_kick(api_server *s);

/* The server's list of open streams (api_stream.c links itself in). */
api_stream **api_server_streams(api_server *s);

/* api_stream.c: stream a job's event ring from sequence `from` on,
 * as SSE or NDJSON, for `who`. The stream is freed with its MHD response. */
api_stream *api_stream_new(api_server *s, struct MHD_Connection *conn, struct evring *ring, uint64_t from,
                           bool ndjson, const api_ident *who);
/* Whether `who` may open one more event stream: open streams are counted
 * apart from requests, per user (user_max_streams: 429) and in total
 * (max_streams: 503); past a limit `resp` gets the error, naming it, with
 * Connection: close, so a refused client holds no connection either. */
bool api_stream_admit(api_server *s, const api_ident *who, api_response *resp);
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

/* api_users.c: the users file. SHA-256 of a token (0, or -1 on a
 * library failure), its hex form, and the lookup of a presented token. */
int api_token_hash(const char *token, unsigned char out[API_HASH_LEN]);
void api_hash_hex(const unsigned char h[API_HASH_LEN], char out[2 * API_HASH_LEN + 1]);
bool api_user_name_ok(const char *name);
int api_role_parse(const char *s); /* -1 when neither admin nor user */
const char *api_role_name(int role);
int api_users_load(const char *path, api_users *us, acc_err *err);
void api_users_free(api_users *us);
const api_user *api_users_find(const api_users *us, const char *token);
/* The bearer token of a request, or NULL. */
const char *api_auth_bearer(struct MHD_Connection *conn);

/* api_audit.c: state_dir/audit.log, append-only, fsynced, and the journal. */
int api_audit_open(api_audit *a, const char *state_dir, acc_err *err);
void api_audit_close(api_audit *a);
void api_audit_record(api_audit *a, const api_ident *who, const char *action, const char *job_id,
                      const char *result, const char *message);
/* Read users_file again (SIGHUP); on an error the old users stay. */
int api_server_reload_users(api_server *s, acc_err *err);
/* The server's audit log, for the routes. */
api_audit *api_server_audit(api_server *s);

/* api_metrics.c: the Prometheus text exposition of /metrics. */
char *api_metrics_text(api_server *s, size_t *len);

/* Deferred answers: a route whose work may block (opening user files,
 * scanning data) sets resp->deferred = api_defer(...) instead of a body.
 * The connection is suspended (MHD_suspend_connection: the loop goes on
 * serving everyone else), `work(ctx)` runs on libuv's thread pool
 * (uv_queue_work), then `done(ctx, resp, false)` on the loop thread fills
 * the response, the connection is resumed and the answer sent. When the
 * server stops first, the client gets a 503 at once and `done(ctx, NULL,
 * true)` is called once the work has finished: it must then only free.
 * At most API_MAX_DEFERRED wait at a time (503 past that). */
#define API_MAX_DEFERRED 64
typedef void (*api_work_fn)(void *ctx);
typedef void (*api_done_fn)(void *ctx, api_response *resp, bool orphaned);
/* NULL (and `done(ctx, NULL, true)` called) when over the limit or out of memory. */
api_deferred *api_defer(api_server *s, api_work_fn work, api_done_fn done, void *ctx);

/* A read-only JSON answer computed from the request body off the loop
 * thread (api_defer): compute(arg, body, len, &out, err) on the thread
 * pool (body NUL-terminated, `arg` borrowed: it must outlive the server),
 * then 200 with `out` dumped with jansson's `flags`, or the error's
 * status. An empty body is a 400 saying `empty`. */
typedef int (*api_json_fn)(const void *arg, const char *body, size_t len, json_t **out, acc_err *err);
void api_defer_json(api_server *s, const api_request *req, api_response *resp, api_json_fn compute,
                    const void *arg, size_t flags, const char *empty);

/* api_defer_json for work on untrusted input that may run up to its time
 * limit (POST /v1/tokenize): at most conf heavy_requests_max such requests
 * are worked on at once, heavy_requests_per_user per user; one over is a 429
 * at once naming the limit, so the thread pool always has room for submits
 * and plans. */
void api_defer_json_heavy(api_server *s, const api_request *req, api_response *resp, api_json_fn compute,
                          const void *arg, size_t flags, const char *empty);

/* api_submit.c: POST /v1/jobs, validated off the loop thread (api_defer). */
void api_submit(api_server *s, const api_request *req, api_response *resp, bool dry_run);
/* api_tokenize.c: POST /v1/tokenize. The compute part opens the tokenizer
 * directory and may take long (thread-pool safe); the route calls it. */
int api_tokenize_compute(const acc_conf *conf, const char *body, size_t len, json_t **out, acc_err *err);
void api_tokenize(api_server *s, const api_request *req, api_response *resp);

/* api_plan.c: POST /v1/plan. The compute part parses the spec (config.json
 * of model.from only) and the hardware and builds the planner's table
 * (thread-pool safe: reads the manager's immutable config and device
 * table); the route calls it through api_defer. */
struct jobs_mgr;
int api_plan_compute(const struct jobs_mgr *m, const char *body, size_t len, json_t **out, acc_err *err);
void api_plan(api_server *s, const api_request *req, api_response *resp);

/* api_files.c: GET /v1/jobs/{id}/files, the job's
 * output files with sizes and SHA-256, listed off the loop thread. */
struct job;
void api_files(api_server *s, const api_request *req, api_response *resp, struct job *j);
/* GET /v1/jobs/{id}/files/{path}: one file, streamed (Range: one byte
 * range, 206), its reads on libuv's thread pool. */
void api_file_get(api_server *s, const api_request *req, const char *path, api_response *resp, struct job *j);
uv_loop_t *api_server_loop(api_server *s);
/* File downloads in flight: ended (resumed, closed) when the server stops. */
struct api_fstream;
struct api_fstream **api_server_fstreams(api_server *s);
void api_fstream_end_all(api_server *s);

/* api_generate.c: POST /v1/generate, checked off the
 * loop thread, then queued for a device (genq.h) and answered as its
 * worker's events come; the keep-alive of waiting answers (every second,
 * it finds clients that left) and their end at the stop. */
void api_generate(api_server *s, const api_request *req, api_response *resp);
void api_generate_ping_all(api_server *s);
void api_generate_end_all(api_server *s);

/* Routing, implemented in api_routes.c: fill `resp` for `req`. */
void api_route(api_server *s, const api_request *req, api_response *resp);

/* Helpers for routes. */
void api_resp_json(api_response *resp, int status, const char *json_text);
/* `o` (taken: decref'd here) as the JSON body, dumped with jansson's
 * `flags` and a closing newline (for terminals after curl); a 500 when it
 * cannot be dumped (out of memory). */
void api_resp_json_obj(api_response *resp, int status, json_t *o, size_t flags);
void api_resp_error(api_response *resp, int status, const char *code, const char *field,
                    const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Map an acc_err to its HTTP status and fill the error body. */
void api_resp_from_err(api_response *resp, const acc_err *err);
int api_status_of(int acc_code);

#endif
