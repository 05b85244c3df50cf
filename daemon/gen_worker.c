/* gen_worker: generate requests' worker processes, the daemon's side (see
 * gen_worker.h). */
#include "gen_worker.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "gen_proto.h"
#include "log.h"

#define GW_EOF_WAIT_MS 2000 /* after the exit: the channel's end, at the latest */

typedef struct gw_proc {
    gw_runner *r;
    genq_req *req;
    char id[24];
    uv_process_t proc;
    uv_pipe_t pipe;
    uv_timer_t timer;
    int open_handles;
    bool proc_on, pipe_on, timer_on;
    bool exited, eof, ended;
    bool reported;             /* it sent "done" or "error" */
    bool killed;               /* by us: cancel, heartbeat, a bad line */
    char why[200];             /* why we killed it */
    int64_t exit_status;
    int term_signal;
    uint64_t last_heard, last_check, exit_at;
    char *buf;
    size_t len, cap;
    gw_init *init;             /* + the request, kept until written */
    uv_write_t init_req;
} gw_proc;

static uint64_t timeout_ms(const gw_proc *p) { return (uint64_t)p->r->conf->worker_heartbeat_timeout * 1000; }

static void maybe_free(gw_proc *p)
{
    if (p->open_handles > 0 || !p->ended)
        return;
    free(p->buf);
    free(p->init);
    free(p);
}

static void on_closed(uv_handle_t *h)
{
    gw_proc *p = h->data;
    p->open_handles--;
    maybe_free(p);
}

static void close_handles(gw_proc *p)
{
    uv_handle_t *hs[] = {(uv_handle_t *)&p->proc, (uv_handle_t *)&p->pipe, (uv_handle_t *)&p->timer};
    bool on[] = {p->proc_on, p->pipe_on, p->timer_on};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++)
        if (on[i] && !uv_is_closing(hs[i]))
            uv_close(hs[i], on_closed);
}

static void kill_worker(gw_proc *p, const char *why)
{
    if (p->exited || p->killed)
        return;
    p->killed = true;
    snprintf(p->why, sizeof p->why, "%s", why);
    int rc = uv_process_kill(&p->proc, SIGKILL);
    if (rc != 0 && rc != UV_ESRCH)
        acc_log(ACC_LOG_ERROR, "generate", "%s: kill %d: %s", p->id, p->proc.pid, uv_strerror(rc));
}

/* It ended without a report: the client is told why. */
static void report_loss(gw_proc *p)
{
    char what[300];
    if (p->killed)
        snprintf(what, sizeof what, "the generation's worker was stopped: %s", p->why);
    else if (p->term_signal != 0)
        snprintf(what, sizeof what, "the generation's worker was killed by signal %d (%s)", p->term_signal,
                 strsignal(p->term_signal));
    else
        snprintf(what, sizeof what, "the generation's worker exited with status %lld without an answer",
                 (long long)p->exit_status);
    if (!p->req->cancelled)
        acc_log(ACC_LOG_ERROR, "generate", "%s: %s", p->id, what);
    json_t *o = json_pack("{s:s, s:s}", "code", "internal", "message", what);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (text != NULL)
        genq_event(p->r->q, p->req, "error", text, strlen(text), 0);
    free(text);
}

static void maybe_end(gw_proc *p)
{
    if (!p->exited || !p->eof || p->ended)
        return;
    p->ended = true;
    uv_timer_stop(&p->timer);
    if (!p->reported)
        report_loss(p);
    genq_req *req = p->req;
    req->worker = NULL;
    close_handles(p);
    genq_ended(p->r->q, req); /* req may be gone after this */
}

static void on_exit_cb(uv_process_t *proc, int64_t status, int term_signal)
{
    gw_proc *p = proc->data;
    p->exited = true;
    p->exit_status = status;
    p->term_signal = term_signal;
    p->exit_at = uv_now(p->r->loop);
    maybe_end(p);
}

/* One line of the worker: hand on tokens and the end. */
static void on_line(gw_proc *p, const char *line, size_t n)
{
    json_error_t je;
    json_t *o = json_loadb(line, n, 0, &je);
    char kind[16] = "";
    const char *k = json_string_value(json_object_get(o, "event"));
    if (k != NULL)
        snprintf(kind, sizeof kind, "%s", k);
    if (kind[0] == '\0') {
        json_decref(o);
        kill_worker(p, "it wrote a line that is not an event");
        return;
    }
    if (!strcmp(kind, "heartbeat") || p->reported || p->killed) {
        json_decref(o);
        return;
    }
    if (strcmp(kind, "token") != 0 && strcmp(kind, "done") != 0 && strcmp(kind, "error") != 0) {
        json_decref(o);
        kill_worker(p, "it wrote an unknown event");
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

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    gw_proc *p = h->data;
    (void)hint;
    size_t want = 64 << 10;
    if (p->cap - p->len < want) {
        size_t cap = p->len + want;
        char *nb = cap <= GW_MAX_LINE + want ? realloc(p->buf, cap) : NULL;
        if (nb == NULL) {
            *buf = uv_buf_init(NULL, 0);
            return;
        }
        p->buf = nb;
        p->cap = cap;
    }
    *buf = uv_buf_init(p->buf + p->len, (unsigned)(p->cap - p->len));
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    gw_proc *p = s->data;
    (void)buf;
    if (nread < 0) {
        if (nread != UV_EOF)
            kill_worker(p, nread == UV_ENOBUFS ? "a line too long" : uv_strerror((int)nread));
        uv_read_stop(s);
        p->eof = true;
        maybe_end(p);
        return;
    }
    p->last_heard = uv_now(p->r->loop);
    p->len += (size_t)nread;
    size_t start = 0;
    for (size_t i = p->len - (size_t)nread; i < p->len; i++)
        if (p->buf[i] == '\n') {
            on_line(p, p->buf + start, i - start);
            start = i + 1;
        }
    memmove(p->buf, p->buf + start, p->len - start);
    p->len -= start;
}

static void on_timer(uv_timer_t *t)
{
    gw_proc *p = t->data;
    uint64_t now = uv_now(p->r->loop), limit = timeout_ms(p);
    if (p->exited) {
        if (!p->eof && now - p->exit_at >= GW_EOF_WAIT_MS) {
            uv_read_stop((uv_stream_t *)&p->pipe);
            p->eof = true;
            maybe_end(p);
        }
        return;
    }
    if (now - p->last_check > limit / 2 + (uint64_t)p->init->heartbeat_ms) /* the loop was away */
        p->last_heard = now;
    p->last_check = now;
    if (now - p->last_heard >= limit)
        kill_worker(p, "no heartbeat");
}

static void on_init_written(uv_write_t *req, int status)
{
    gw_proc *p = req->data;
    if (status != 0 && status != UV_ECANCELED && status != UV_EPIPE && !p->exited)
        kill_worker(p, "its start message could not be written");
}

static int spawn(gw_proc *p, acc_err *err)
{
    gw_runner *r = p->r;
    char dpid[24], exe[] = "/proc/self/exe";
    snprintf(dpid, sizeof dpid, "%d", (int)uv_os_getpid());
    char *args[] = {exe, "--generate", p->id, dpid, NULL};
    uv_stdio_container_t io[4] = {
        {.flags = UV_IGNORE},
        {.flags = UV_INHERIT_FD, .data.fd = 1},
        {.flags = UV_INHERIT_FD, .data.fd = 2},
        {.flags = UV_CREATE_PIPE | UV_READABLE_PIPE | UV_WRITABLE_PIPE, .data.stream = (uv_stream_t *)&p->pipe},
    };
    uv_process_options_t o = {.exit_cb = on_exit_cb, .file = exe, .args = args, .stdio = io, .stdio_count = 4,
                              .flags = UV_PROCESS_DETACHED};
    int rc = uv_spawn(r->loop, &p->proc, &o);
    p->proc_on = true;
    p->open_handles++;
    if (rc != 0)
        return acc_err_set(err, ACC_EINTERNAL, NULL, "cannot start a generate worker: %s", uv_strerror(rc));
    p->init_req.data = p;
    uv_buf_t b = uv_buf_init((char *)p->init, (unsigned)(sizeof *p->init + p->init->request_len));
    if ((rc = uv_write(&p->init_req, (uv_stream_t *)&p->pipe, &b, 1, on_init_written)) != 0 ||
        (rc = uv_read_start((uv_stream_t *)&p->pipe, on_alloc, on_read)) != 0) {
        p->eof = true;
        kill_worker(p, uv_strerror(rc));
    }
    return 0;
}

static gw_init *make_init(const gw_runner *r, const genq_req *req, const kern_device_info *dev)
{
    size_t n = strlen(req->request);
    if (n == 0 || n > GW_MAX_REQUEST)
        return NULL;
    gw_init *in = calloc(1, sizeof *in + n);
    if (in == NULL)
        return NULL;
    int hb = r->conf->worker_heartbeat_timeout * 1000 / 4;
    *in = (gw_init){.magic = GW_MAGIC, .size = sizeof *in, .device = *dev,
                    .threads = r->conf->cpu_threads_per_device, .heartbeat_ms = hb < 1000 ? hb : 1000,
                    .request_len = (uint32_t)n};
    memcpy(in + 1, req->request, n);
    return in;
}

static int start(void *ctx, genq_req *req, const kern_device_info *dev, acc_err *err)
{
    gw_runner *r = ctx;
    gw_proc *p = calloc(1, sizeof *p);
    if (p == NULL)
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory for a worker");
    p->r = r;
    p->req = req;
    snprintf(p->id, sizeof p->id, "%s", req->id);
    p->init = make_init(r, req, dev);
    p->proc.data = p;
    int rc = p->init == NULL ? acc_err_set(err, ACC_ENOMEM, NULL, "out of memory for a worker") : 0, uvrc = 0;
    if (rc == 0 && (uvrc = uv_pipe_init(r->loop, &p->pipe, 0)) == 0) {
        p->pipe_on = true;
        p->open_handles++;
        p->pipe.data = p;
    }
    if (rc == 0 && uvrc == 0 && (uvrc = uv_timer_init(r->loop, &p->timer)) == 0) {
        p->timer_on = true;
        p->open_handles++;
        p->timer.data = p;
    }
    if (rc == 0 && uvrc != 0)
        rc = acc_err_set(err, ACC_EINTERNAL, NULL, "worker handles: %s", uv_strerror(uvrc));
    if (rc == 0)
        rc = spawn(p, err);
    if (rc != 0) {
        p->ended = true;
        if (p->open_handles == 0)
            maybe_free(p);
        else
            close_handles(p);
        return rc;
    }
    p->last_heard = p->last_check = uv_now(r->loop);
    uint64_t every = (uint64_t)p->init->heartbeat_ms;
    uv_timer_start(&p->timer, on_timer, every, every);
    req->worker = p;
    acc_log(ACC_LOG_INFO, "generate", "%s: worker pid %d started on %s", req->id, p->proc.pid, dev->name);
    return 0;
}

static void cancel(void *ctx, genq_req *req)
{
    (void)ctx;
    gw_proc *p = req->worker;
    if (p != NULL && !p->ended)
        kill_worker(p, "cancelled (the client went away)");
}

void gw_runner_install(gw_runner *r, uv_loop_t *loop, const acc_conf *conf, genq *q)
{
    *r = (gw_runner){.loop = loop, .conf = conf, .q = q};
    genq_set_runner(q, &(genq_runner){.start = start, .cancel = cancel, .ctx = r});
}
