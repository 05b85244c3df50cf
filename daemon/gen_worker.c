/* gen_worker: generate requests' worker processes, the daemon's side (see
 * gen_worker.h). */
#include "gen_worker.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "gen_proto.h"
#include "jobs.h"
#include "log.h"
#include "wproc.h"

_Static_assert(GW_FD == WP_CHILD_FD, "the generate worker reads its channel where wproc puts it");

typedef struct gw_proc {
    gw_runner *r;
    genq_req *req;
    wp_proc *proc;
    bool reported;             /* it sent "done" or "error" */
    bool stopped;              /* killed for a bad line: the rest is not its answer */
} gw_proc;

/* It ended without a report: the client is told why. */
static void report_loss(gw_proc *p, const wp_end *e)
{
    char what[400];
    if (e->not_started)
        snprintf(what, sizeof what, "the generation's worker could not start: %s", e->why);
    else if (e->killed)
        snprintf(what, sizeof what, "the generation's worker was stopped: %s", e->why);
    else if (e->term_signal != 0)
        snprintf(what, sizeof what, "the generation's worker was killed by signal %d (%s)", e->term_signal,
                 strsignal(e->term_signal));
    else
        snprintf(what, sizeof what, "the generation's worker exited with status %lld without an answer",
                 (long long)e->exit_status);
    if (!p->req->cancelled)
        acc_log(ACC_LOG_ERROR, "generate", "%s: %s", p->req->id, what);
    json_t *o = json_pack("{s:s, s:s}", "code", "internal", "message", what);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (text != NULL)
        genq_event(p->r->q, p->req, "error", text, strlen(text), 0);
    free(text);
}

static void on_spawned(void *ctx, int pid)
{
    gw_proc *p = ctx;
    acc_log(ACC_LOG_INFO, "generate", "%s: worker pid %d started on %s", p->req->id, pid,
            p->r->q->m->devs[p->req->dev].name);
}

static void on_ended(void *ctx, const wp_end *e)
{
    gw_proc *p = ctx;
    if (!p->reported)
        report_loss(p, e);
    genq_req *req = p->req;
    req->worker = NULL;
    wp_release(p->proc);
    free(p);
    genq_ended(req->q, req); /* req may be gone after this */
}

/* One line of the worker: hand on tokens and the end. */
static void on_line(void *ctx, const char *line, size_t n)
{
    gw_proc *p = ctx;
    json_error_t je;
    json_t *o = json_loadb(line, n, 0, &je);
    char kind[16] = "";
    const char *k = json_string_value(json_object_get(o, "event"));
    if (k != NULL)
        snprintf(kind, sizeof kind, "%s", k);
    if (kind[0] == '\0') {
        json_decref(o);
        p->stopped = true;
        wp_kill(p->proc, "it wrote a line that is not an event");
        return;
    }
    if (!strcmp(kind, "heartbeat") || p->reported || p->stopped) {
        json_decref(o);
        return;
    }
    if (strcmp(kind, "token") != 0 && strcmp(kind, "done") != 0 && strcmp(kind, "error") != 0) {
        json_decref(o);
        p->stopped = true;
        wp_kill(p->proc, "it wrote an unknown event");
        return;
    }
    p->reported = strcmp(kind, "token") != 0;
    json_object_del(o, "event");
    uint64_t tokens = (uint64_t)json_integer_value(json_object_get(o, "completion_tokens"));
    char *text = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (text != NULL)
        genq_event(p->r->q, p->req, kind, text, strlen(text), tokens);
    free(text);
}

static gw_init *make_init(const gw_runner *r, const genq_req *req, const kern_device_info *dev)
{
    size_t n = strlen(req->request);
    if (n == 0 || n > GW_MAX_REQUEST)
        return NULL;
    gw_init *in = calloc(1, sizeof *in + n);
    if (in == NULL)
        return NULL;
    int hb = wp_heartbeat_ms(r->conf->worker_heartbeat_timeout);
    *in = (gw_init){.magic = GW_MAGIC, .size = sizeof *in, .device = *dev,
                    .threads = conf_generate_threads(r->conf, sysconf(_SC_NPROCESSORS_ONLN)),
                    .nice = r->conf->generate_nice, .heartbeat_ms = hb,
                    .request_len = (uint32_t)n};
    memcpy(in + 1, req->request, n);
    return in;
}

static int start(void *ctx, genq_req *req, const kern_device_info *dev, acc_err *err)
{
    gw_runner *r = ctx;
    gw_proc *p = calloc(1, sizeof *p);
    gw_init *in = make_init(r, req, dev);
    if (p == NULL || in == NULL) {
        free(p);
        free(in);
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory for a worker");
    }
    *p = (gw_proc){.r = r, .req = req};
    wp_opts o = {.mode = "--generate", .id = req->id, .log_tag = "generate", .init = in,
                 .init_len = sizeof *in + in->request_len, .heartbeat_ms = in->heartbeat_ms,
                 .heartbeat_timeout_s = r->conf->worker_heartbeat_timeout, .max_line = GW_MAX_LINE};
    int rc = wp_start(r->loop, &o, &(wp_hooks){.line = on_line, .spawned = on_spawned, .ended = on_ended, .ctx = p}, &p->proc, err);
    free(in);
    if (rc != 0) {
        free(p);
        return rc;
    }
    req->worker = p;
    return 0;
}

static void cancel(void *ctx, genq_req *req)
{
    (void)ctx;
    gw_proc *p = req->worker;
    if (p != NULL)
        wp_kill(p->proc, "cancelled (the client went away)");
}

void gw_runner_install(gw_runner *r, uv_loop_t *loop, const acc_conf *conf, genq *q)
{
    *r = (gw_runner){.loop = loop, .conf = conf, .q = q};
    genq_set_runner(q, &(genq_runner){.start = start, .cancel = cancel, .ctx = r});
}
