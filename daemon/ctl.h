/* ctl: accumctl, the command-line client of accumd (libcurl + jansson).
 *
 * accumctl.c parses the command line and finds the daemon; ctl_http.c
 * talks HTTP (one request, or a line stream); ctl_cmds.c has one function
 * per command; ctl_print.c turns answers and events into readable lines.
 *
 * Exit codes (a script can use them; docs/accumctl.1 lists them):
 *   0 ok (with --wait or logs -f: the job succeeded)
 *   1 the job failed (--wait, logs -f)
 *   2 the job was cancelled (--wait, logs -f)
 *   3 the daemon answered with an error (4xx/5xx; its message is printed)
 *   4 the daemon could not be reached (connection, transport)
 *  64 usage: a bad command line, or a file that cannot be read
 */
#ifndef ACC_CTL_H
#define ACC_CTL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum {
    CTL_OK = 0,
    CTL_JOB_FAILED = 1,
    CTL_NOTHING_FITS = 1,  /* plan: no way to run the spec fits */
    CTL_JOB_CANCELLED = 2,
    CTL_EHTTP = 3,
    CTL_ECONN = 4,
    CTL_EUSAGE = 64,
};

typedef struct ctl {
    char url[1024];          /* http://host:port, no trailing slash */
    char token[512];         /* "" = none */
    bool json;               /* --json: raw answers */
    bool quiet;              /* --quiet: submit --wait prints no events */
    void *curl;              /* CURL *, reused: one connection */
} ctl;

typedef struct ctl_resp {
    long status;             /* HTTP status, 0 when no answer */
    char *body;              /* NUL-terminated, malloc'd */
    size_t len;
} ctl_resp;

/* ctl_http.c */
int ctl_http_init(ctl *c);
void ctl_http_free(ctl *c);
/* One request. 0 with *r filled (any HTTP status), or CTL_ECONN (printed). */
int ctl_request(ctl *c, const char *method, const char *path, const char *body, size_t len, ctl_resp *r);
void ctl_resp_free(ctl_resp *r);
/* A long answer read line by line: `line` gets each (without the newline)
 * and returns 0 to go on, 1 to stop. 0 when the stream ended or was
 * stopped, CTL_ECONN when it broke, CTL_EHTTP (printed) on an error status. */
int ctl_stream(ctl *c, const char *path, int (*line)(void *ctx, const char *text), void *ctx);
/* The same for a POST of `body` (NULL: a GET, as ctl_stream). */
int ctl_stream_post(ctl *c, const char *path, const char *body, size_t len, int (*line)(void *ctx, const char *text),
                    void *ctx);
/* Print the daemon's error answer ("accumctl: HTTP 400 invalid (field): message"),
 * return CTL_EHTTP. */
int ctl_http_error(const ctl_resp *r);
/* GET `path` into `out` from byte `from` on (a
 * Range request when from > 0); *status the HTTP status. 0 or CTL_ECONN. */
int ctl_download(ctl *c, const char *path, uint64_t from, FILE *out, long *status);
/* GET a JSON object; 0, CTL_ECONN or CTL_EHTTP (printed). */
int ctl_get_json(ctl *c, const char *path, json_t **out);

/* ctl_print.c */
void ctl_fmt_bytes(double n, char *out, size_t size);
/* "3s", "5m", "2h", "4d" since an RFC 3339 time; "-" when null. */
void ctl_fmt_age(const char *rfc3339, char *out, size_t size);
/* One event of a job's stream as a readable line. */
void ctl_print_event(const json_t *ev);
/* Tables */
void ctl_print_jobs(const json_t *jobs);
void ctl_print_job(const json_t *job);
void ctl_print_devices(const json_t *answer);
void ctl_print_plan(const json_t *plan);
void ctl_print_metrics(const json_t *m, bool csv);
/* Pretty JSON on stdout. */
void ctl_print_json(const json_t *v);

/* ctl_cmds.c: argc/argv start after the command name, options parsed. */
typedef struct ctl_opts {
    bool dry_run, wait, follow, csv;
    const char *state;       /* ls --state */
    const char *device_memory; /* plan */
    int devices;             /* plan, 0 = the spec's */
    const char *kind;        /* plan: "cuda", "cpu", NULL = the daemon's */
    const char *role;        /* user add */
    const char *users_file;  /* user add: append the line there */
    /* generate: the sampling keys as given ("" = the daemon's default) */
    const char *max_new_tokens, *temperature, *top_k, *top_p, *seed;
    bool chat;
    const char *host_memory; /* plan: hardware.host_memory, NULL = the daemon's */
} ctl_opts;

int ctl_cmd_submit(ctl *c, const ctl_opts *o, const char *file);
/* Submit a spec's text (--dry-run, --wait as submit takes them). */
int ctl_submit_text(ctl *c, const ctl_opts *o, const char *text, size_t len);
/* ctl_launch.c: an accelerate launch / deepspeed / torchrun line
 * (argv after "launch") as an accumd spec: printed as JSON, or submitted
 * (--submit, with --dry-run / --wait / --quiet). */
int ctl_cmd_launch(ctl *c, int argc, char **argv);
int ctl_cmd_ls(ctl *c, const ctl_opts *o);
int ctl_cmd_show(ctl *c, const char *id);
int ctl_cmd_logs(ctl *c, const ctl_opts *o, const char *id);
int ctl_cmd_cancel(ctl *c, const char *id);
int ctl_cmd_devices(ctl *c);
int ctl_cmd_plan(ctl *c, const ctl_opts *o, const char *file);
int ctl_cmd_metrics(ctl *c, const ctl_opts *o, const char *id);
int ctl_cmd_pull(ctl *c, const char *id, const char *dir);
int ctl_cmd_user_add(const ctl *c, const ctl_opts *o, const char *name);
/* POST /v1/generate: the model (a directory under the
 * daemon's data_roots, or job:ID) answers `prompt` (or, with o->chat, the
 * prompt as one user message), its tokens printed as they come. */
int ctl_cmd_generate(ctl *c, const ctl_opts *o, const char *model, const char *prompt);

#endif
