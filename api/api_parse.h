/* api_parse: an HTTP request turned into a route call, without MHD.
 *
 * Contract: api_parse_request() takes what the server read (method, the
 * unescaped path with its real length, the query pairs and the headers,
 * each with its real length) and either fills an api_call (which route,
 * the job id, every query parameter and header the route reads, parsed and
 * range-checked) and returns 0, or fills `resp` with the 4xx the request
 * deserves and returns -1. It touches no job and no connection, so it can
 * be fuzzed on its own (tests/fuzz/fuzz_http.c).
 *
 * One parser per kind of value, shared by every route:
 *   booleans (?dry_run): 1 true yes on / 0 false no off, any case; a bare
 *     `?dry_run` or `?dry_run=` is true; anything else is 400;
 *   sequence numbers (?since, Last-Event-ID): decimal digits only (no sign,
 *     no space), at most API_SEQ_MAX;
 *   job ids: the grammar of job_id_valid() (job.h); anything else is 404
 *     (in the path) or 400 naming the parameter (?after);
 *   page sizes (?limit): decimal digits only, 1..API_LIST_MAX_LIMIT;
 * a NUL byte anywhere (in the path, a query pair, a header) is 400. A known
 * query parameter given twice is 400; unknown parameters are ignored.
 * Text from the request that goes into an answer or a log line passes
 * through api_safe_text(), which keeps valid UTF-8 and writes every other
 * byte, and every control character, as \xNN.
 */
#ifndef ACC_API_PARSE_H
#define ACC_API_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api_http.h"

#define API_SEQ_MAX INT64_MAX /* largest event sequence number a client may name */
#define API_ID_MAX 32         /* bytes of a job id, NUL included */
#define API_LIST_LIMIT 100    /* GET /v1/jobs page size when ?limit= is absent */
#define API_LIST_MAX_LIMIT 1000

typedef enum api_route_id {
    API_R_HEALTHZ,
    API_R_METRICS,
    API_R_DEVICES,
    API_R_JOBS_LIST,
    API_R_JOBS_SUBMIT,
    API_R_TOKENIZE,   /* POST /v1/tokenize (before the job routes: they carry an id) */
    API_R_PLAN,       /* POST /v1/plan */
    API_R_JOB_GET,
    API_R_JOB_CANCEL,
    API_R_JOB_EVENTS,
    API_R_JOB_METRICS,
    API_R_JOB_FILES,  /* GET /v1/jobs/{id}/files */
    API_R_JOB_FILE,   /* GET /v1/jobs/{id}/files/{path} */
    API_R_GENERATE,   /* POST /v1/generate */
} api_route_id;

struct api_route_row;

typedef struct api_call {
    api_route_id route;
    const struct api_route_row *row; /* the table's row of the route */
    const char *tail;      /* what the pattern's "{path}" matched (in the request's path), not NUL-terminated */
    size_t tail_len;
    bool head;             /* HEAD: the GET answer's headers, no body */
    char id[API_ID_MAX];   /* job routes */
    int state;             /* list filter (job_state), -1 = every state */
    bool dry_run;          /* submit */
    uint64_t from;         /* events: the first sequence number to send */
    bool ndjson;           /* events: NDJSON instead of SSE */
    int limit;             /* list: page size, 1..API_LIST_MAX_LIMIT (default API_LIST_LIMIT) */
    char file[512];        /* files/{path}: the relative path (checked: [A-Za-z0-9._-] components) */
    char after[API_ID_MAX];/* list: the page starts after this job id ("" = newest); the
                            * previous page's `next`; grammar of job_id_valid (a well-formed
                            * id of no known job is the route's 400) */
} api_call;

/* ---- the routes as one table (api_routes.c) ----
 *
 * One row per method and path pattern. A pattern is literal text with
 * "{id}" (one path segment: a job id) and, last, "{path}" (the non-empty
 * rest). A GET row answers HEAD too. Matching is in table order; a path
 * some rows match but not with the request's method is a 405 listing their
 * methods (Allow); a path no row matches is a 404. Adding a route = one row
 * at the end of api_routes[] + its handler + its "## METHOD /path" section
 * in docs/api.md (test api_routes fails without it). The dashboard's static
 * files (GET /, /ui/...) are served before the table (api_ui.c). */
enum {
    API_RF_PUBLIC = 1, /* answered without a token (refused early otherwise: api_http.c) */
    API_RF_JOB = 2,    /* "{id}" names a job: its id is checked first (404 "no job"), the job is found
                        * (404) before the handler, which gets it */
    API_RF_SLASH = 4,  /* a trailing '/' names the same route */
};

struct api_server;
struct job;
typedef struct api_route_row {
    const char *method;  /* GET (and HEAD), POST, DELETE */
    const char *pattern;
    api_route_id id;
    unsigned flags;      /* API_RF_* */
    /* the query parameters and headers the route reads (api_parse.c), NULL = none */
    int (*parse)(const api_request *in, api_call *out, api_response *resp);
    /* on the loop thread; j is the job of API_RF_JOB routes, else NULL */
    void (*handler)(struct api_server *s, const api_request *req, const api_call *c, api_response *resp,
                    struct job *j);
} api_route_row;

extern const api_route_row api_routes[];
extern const size_t api_routes_len;

/* The rows' parsers (see above). */
int api_parse_list(const api_request *in, api_call *out, api_response *resp);
int api_parse_submit(const api_request *in, api_call *out, api_response *resp);
int api_parse_events(const api_request *in, api_call *out, api_response *resp);
int api_parse_file(const api_request *in, api_call *out, api_response *resp);

/* True when an API_RF_PUBLIC row's pattern matches `path` (any method). */
bool api_route_public(const char *path);

/* Fill `out` from `in`, or `resp` with the error (see above). */
int api_parse_request(const api_request *in, api_call *out, api_response *resp);

/* The value of query parameter `key`: 1 and *v (NULL for a bare key, else
 * NUL-terminated) when given once, 0 when absent, -1 (and a 400 in resp)
 * when given twice. */
int api_query_get(const api_request *in, const char *key, const char **v, api_response *resp);

/* The strict parsers of the query parameters: 0 when absent or valid
 * (*out set only when present), -1 with a 400 naming `key` in resp. */
int api_query_bool(const api_request *in, const char *key, bool *out, api_response *resp);
int api_query_u64(const api_request *in, const char *key, uint64_t max, uint64_t *out, bool *present,
                  api_response *resp);

/* A request header's value (case-insensitive name), NULL when absent. */
const char *api_header(const api_request *in, const char *name);

/* Percent-decode `s` in place (%HH), except %00, which stays as it is: the
 * server hands the path on as a C string, and a decoded NUL would cut it
 * short (j000001%00 would name j000001). Returns the new length. */
size_t api_unescape(char *s);

/* `in` (len bytes) as printable text: valid UTF-8 kept, control characters
 * and bytes that are not UTF-8 as \xNN; truncated to fit `n` (always
 * NUL-terminated, never inside an escape or a character). */
void api_safe_text(const char *in, size_t len, char *out, size_t n);

#endif
