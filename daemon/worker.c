/* worker: jobs' worker processes, the daemon's side (see worker.h). */
#include "worker.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "fsutil.h"
#include "log.h"
#include "tev_json.h"
#include "worker_proto.h"

#define WK_EOF_WAIT_MS 2000 /* after the exit: the channel's end, at the latest */

typedef struct wk_proc {
    wk_runner *r;
    job *j;
    char job_id[32];
    uv_process_t proc;
    uv_pipe_t pipe;
    uv_timer_t timer;
    int open_handles;
    bool proc_on, pipe_on, timer_on; /* initialised: to be closed */
    bool exited, eof, ended, released;
    bool heartbeat_lost, bad_line, no_channel;
    int64_t exit_status;
    int term_signal;
    uint64_t last_heard, last_check, exit_at; /* uv_now, ms */
    char *buf;                 /* what came in, not yet a whole line */
    size_t len, cap;
    wk_init *init;             /* the start message, kept until freed */
    uv_write_t init_req;
    jobs_wend end;
} wk_proc;

typedef struct wk_ctl {
    uv_write_t req;
    char text[16];
} wk_ctl;

static uint64_t timeout_ms(const wk_proc *p) { return (uint64_t)p->r->conf->worker_heartbeat_timeout * 1000; }

/* ---- pid files */

static void pid_path(const wk_runner *r, const char *id, char *out, size_t n)
{
    snprintf(out, n, "%s/%s.pid", r->dir, id);
}

static void pid_write(const wk_proc *p)
{
    char path[PATH_MAX + 64], line[32];
    pid_path(p->r, p->job_id, path, sizeof path);
    int n = snprintf(line, sizeof line, "%d\n", p->proc.pid);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    /* no fsync: after a power loss no worker is left to find */
    if (fd < 0 || write(fd, line, (size_t)n) != n)
        acc_log(ACC_LOG_WARN, "worker", "job %s: cannot record the worker's pid in %s: %s", p->job_id, path,
                strerror(errno));
    if (fd >= 0)
        close(fd);
}

static void pid_remove(const wk_proc *p)
{
    char path[PATH_MAX + 64];
    pid_path(p->r, p->job_id, path, sizeof path);
    if (unlink(path) != 0 && errno != ENOENT)
        acc_log(ACC_LOG_WARN, "worker", "job %s: %s: %s", p->job_id, path, strerror(errno));
}

/* ---- the end */

static void maybe_free(wk_proc *p)
{
    if (p->open_handles > 0 || !p->released)
        return;
    free(p->buf);
    free(p->init);
    free(p);
}

static void on_closed(uv_handle_t *h)
{
    wk_proc *p = h->data;
    p->open_handles--;
    maybe_free(p);
}

static void close_handles(wk_proc *p)
{
    uv_handle_t *hs[] = {(uv_handle_t *)&p->proc, (uv_handle_t *)&p->pipe, (uv_handle_t *)&p->timer};
    bool on[] = {p->proc_on, p->pipe_on, p->timer_on};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++)
        if (on[i] && !uv_is_closing(hs[i]))
            uv_close(hs[i], on_closed);
}

static void kill_worker(wk_proc *p, const char *why)
{
    if (p->exited)
        return;
    acc_log(ACC_LOG_ERROR, "worker", "job %s: killing worker %d: %s", p->job_id, p->proc.pid, why);
    int rc = uv_process_kill(&p->proc, SIGKILL);
    if (rc != 0 && rc != UV_ESRCH)
        acc_log(ACC_LOG_ERROR, "worker", "job %s: kill %d: %s", p->job_id, p->proc.pid, uv_strerror(rc));
}

/* Why it ended without a report: the cause and its words. */
static void describe_loss(wk_proc *p)
{
    jobs_wend *e = &p->end;
    if (p->no_channel) {
        e->cause = JOBS_WFAIL_START;
        e->deterministic = true;
        snprintf(e->what, sizeof e->what, "could not be given its job (its channel failed) and was killed");
    } else if (p->bad_line) {
        e->cause = JOBS_WFAIL_PROTOCOL;
        snprintf(e->what, sizeof e->what, "wrote a line that is not an event and was killed");
    } else if (p->heartbeat_lost) {
        e->cause = JOBS_WFAIL_HEARTBEAT;
        snprintf(e->what, sizeof e->what, "sent no heartbeat for %d s and was killed",
                 p->r->conf->worker_heartbeat_timeout);
    } else if (p->term_signal != 0) {
        e->cause = JOBS_WFAIL_SIGNAL;
        snprintf(e->what, sizeof e->what, "killed by signal %d (%s)", p->term_signal, strsignal(p->term_signal));
    } else if (p->exit_status == WK_EXIT_WATCHDOG) {
        e->cause = JOBS_WFAIL_EXIT;
        snprintf(e->what, sizeof e->what, "ended its rank processes: rank 0 reported no progress within the "
                 "watchdog's bound (a rank stopped or hung; rank_watchdog_min / rank_watchdog_factor)");
    } else if (p->exit_status == WK_EXIT_RANKS) {
        e->cause = JOBS_WFAIL_EXIT;
        snprintf(e->what, sizeof e->what, "lost its rank processes (the MPI launcher ended without rank 0's report)");
    } else if (p->exit_status == WK_EXIT_SETUP) {
        e->cause = JOBS_WFAIL_START;
        e->deterministic = true;
        snprintf(e->what, sizeof e->what, "could not start (exit status %d)", WK_EXIT_SETUP);
    } else {
        e->cause = JOBS_WFAIL_EXIT;
        snprintf(e->what, sizeof e->what, "exited with status %lld without reporting", (long long)p->exit_status);
    }
}

/* Both the process and its channel are gone: report, then let go. */
static void maybe_end(wk_proc *p)
{
    if (!p->exited || !p->eof || p->ended)
        return;
    p->ended = true;
    uv_timer_stop(&p->timer);
    if (p->end.reported && (p->term_signal != 0 || p->exit_status != 0))
        acc_log(ACC_LOG_WARN, "worker", "job %s: worker %d ended abnormally (status %lld, signal %d) after "
                "reporting its run's end", p->job_id, p->proc.pid, (long long)p->exit_status, p->term_signal);
    if (!p->end.reported)
        describe_loss(p);
    pid_remove(p);
    jobs_worker_ended(p->r->jobs, p->j, &p->end);
    close_handles(p);
}

static void on_exit_cb(uv_process_t *proc, int64_t status, int term_signal)
{
    wk_proc *p = proc->data;
    p->exited = true;
    p->exit_status = status;
    p->term_signal = term_signal;
    p->exit_at = uv_now(p->r->loop);
    maybe_end(p);
}

/* ---- the channel */

static void on_line(wk_proc *p, const char *line, size_t n)
{
    json_error_t je;
    json_t *o = json_loadb(line, n, 0, &je);
    const char *kind = json_string_value(json_object_get(o, "event"));
    if (kind != NULL && !strcmp(kind, "heartbeat")) {
        json_decref(o);
        return;
    }
    train_event *ev = malloc(sizeof *ev);
    acc_err err = {0};
    int rc = ev == NULL ? acc_err_set(&err, ACC_ENOMEM, NULL, "out of memory")
             : o == NULL ? acc_err_set(&err, ACC_EINVAL, NULL, "not JSON: %s", je.text)
                         : tev_from_json(o, ev, &err);
    json_decref(o);
    if (rc != 0) {
        if (!p->bad_line) {
            char why[400];
            snprintf(why, sizeof why, "a bad event line: %.300s", err.msg);
            p->bad_line = true;
            kill_worker(p, why);
        }
    } else if (ev->kind == TEV_DONE) {
        p->end.reported = true;
        p->end.done = *ev;
    } else if (!p->end.reported && !p->bad_line) {
        jobs_worker_event(p->r->jobs, p->j, ev);
    }
    free(ev);
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    wk_proc *p = h->data;
    (void)hint;
    size_t want = 64 << 10;
    if (p->cap - p->len < want) {
        size_t cap = p->len + want;
        char *nb = cap <= WK_MAX_LINE + want ? realloc(p->buf, cap) : NULL;
        if (nb == NULL) { /* libuv reports UV_ENOBUFS */
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
    wk_proc *p = s->data;
    (void)buf;
    if (nread < 0) {
        if (nread != UV_EOF && !p->bad_line) {
            char why[200];
            snprintf(why, sizeof why, "reading its channel: %s", uv_strerror((int)nread));
            p->bad_line = nread == UV_ENOBUFS; /* a line past WK_MAX_LINE */
            kill_worker(p, why);
        }
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

static void on_ctl_written(uv_write_t *req, int status)
{
    (void)status; /* a worker that is gone is seen through its exit */
    free(req->data);
}

static void control(void *ctx, job *j, const char *what)
{
    wk_proc *p = j->worker;
    (void)ctx;
    if (p == NULL || p->ended || p->exited)
        return;
    if (!strcmp(what, "kill")) { /* a cancel not honoured in time (jobs_enforce_cancels) */
        kill_worker(p, "cancelled, and not stopped within cancel_grace");
        return;
    }
    wk_ctl *c = malloc(sizeof *c);
    if (c == NULL) {
        acc_log(ACC_LOG_ERROR, "worker", "job %s: out of memory sending %s", p->job_id, what);
        return;
    }
    int n = snprintf(c->text, sizeof c->text, "%s\n", what);
    c->req.data = c;
    uv_buf_t b = uv_buf_init(c->text, (unsigned)n);
    int rc = uv_write(&c->req, (uv_stream_t *)&p->pipe, &b, 1, on_ctl_written);
    if (rc != 0) {
        acc_log(ACC_LOG_WARN, "worker", "job %s: cannot send %s: %s", p->job_id, what, uv_strerror(rc));
        free(c);
    }
}

static void on_init_written(uv_write_t *req, int status)
{
    wk_proc *p = req->data;
    /* EPIPE: it is gone already, its exit says why */
    if (status != 0 && status != UV_ECANCELED && status != UV_EPIPE && !p->exited) {
        p->no_channel = true;
        kill_worker(p, "its start message could not be written");
    }
}

/* ---- heartbeats */

static void on_timer(uv_timer_t *t)
{
    wk_proc *p = t->data;
    uint64_t now = uv_now(p->r->loop), limit = timeout_ms(p);
    if (p->exited) {
        if (!p->eof && now - p->exit_at >= WK_EOF_WAIT_MS) { /* a descendant holds the channel */
            uv_read_stop((uv_stream_t *)&p->pipe);
            p->eof = true;
            maybe_end(p);
        }
        return;
    }
    /* the loop itself was away (a late timer): the worker had no chance to be heard */
    if (now - p->last_check > limit / 2 + (uint64_t)p->init->heartbeat_ms)
        p->last_heard = now;
    p->last_check = now;
    if (!p->heartbeat_lost && now - p->last_heard >= limit) {
        p->heartbeat_lost = true;
        kill_worker(p, "no heartbeat");
    }
}

/* ---- start */

/* accumd-rank next to this executable, unless the config names one */
static void rank_program(const wk_runner *r, char *out, size_t n)
{
    if (r->conf->rank_program[0] != '\0') {
        snprintf(out, n, "%s", r->conf->rank_program);
        return;
    }
    const char *slash = strrchr(r->exe, '/');
    int dir = slash ? (int)(slash - r->exe) : 0;
    snprintf(out, n, "%.*s%saccumd-rank", dir, r->exe, slash ? "/" : "");
}

/* The start message, with the spec's text after it in rank mode. */
static wk_init *make_init(const wk_runner *r, const job *j, const kern_device_info *devs, int ndev)
{
    bool ranks = r->conf->rank_processes || j->spec.nodes > 1;
    size_t text = ranks && j->spec_json ? strlen(j->spec_json) : 0;
    if (text > WK_MAX_SPEC)
        return NULL;
    wk_init *in = calloc(1, sizeof *in + text);
    if (in == NULL)
        return NULL;
    int hb = r->conf->worker_heartbeat_timeout * 1000 / 4;
    *in = (wk_init){.magic = WK_MAGIC, .size = sizeof *in, .ndev = ndev,
                    .threads_per_device = r->conf->cpu_threads_per_device,
                    .checkpoint_keep = r->conf->checkpoint_keep, .heartbeat_ms = hb < 1000 ? hb : 1000,
                    .attempt = j->worker_restarts, .spec = j->spec, .rank_mode = ranks,
                    .world = j->spec.devices * j->spec.nodes, .spec_json_len = (uint32_t)text,
                    .watchdog_factor = r->conf->rank_watchdog_factor, .watchdog_min_s = r->conf->rank_watchdog_min};
    in->host_budget = j->host_bytes;
    in->host_per_rank = j->host_per_rank;
    snprintf(in->mpi_interface, sizeof in->mpi_interface, "%s", r->conf->mpi_interface);
    memcpy(in->devices, devs, (size_t)ndev * sizeof *devs);
    snprintf(in->mpi_launcher, sizeof in->mpi_launcher, "%s", r->conf->mpi_launcher);
    snprintf(in->hostfile, sizeof in->hostfile, "%s", r->conf->hostfile);
    snprintf(in->mpi_args, sizeof in->mpi_args, "%s", r->conf->mpi_args);
    rank_program(r, in->rank_program, sizeof in->rank_program);
    memcpy(in + 1, j->spec_json, text);
    return in;
}

static int spawn(wk_proc *p, acc_err *err)
{
    wk_runner *r = p->r;
    char dpid[24];
    snprintf(dpid, sizeof dpid, "%d", (int)uv_os_getpid());
    char *args[] = {r->exe, "--worker", p->job_id, dpid, NULL};
    uv_stdio_container_t io[4] = {
        {.flags = UV_IGNORE},
        {.flags = UV_INHERIT_FD, .data.fd = 1},
        {.flags = UV_INHERIT_FD, .data.fd = 2},
        {.flags = UV_CREATE_PIPE | UV_READABLE_PIPE | UV_WRITABLE_PIPE, .data.stream = (uv_stream_t *)&p->pipe},
    };
    /* this very program, even when its file was replaced since (an upgrade):
     * the start message's layout is this build's; its own session: a
     * terminal's ^C is the daemon's to handle */
    uv_process_options_t o = {.exit_cb = on_exit_cb, .file = "/proc/self/exe", .args = args, .stdio = io, .stdio_count = 4,
                              .flags = UV_PROCESS_DETACHED};
    int rc = uv_spawn(r->loop, &p->proc, &o);
    p->proc_on = true; /* initialised even when it failed */
    p->open_handles++;
    if (rc != 0)
        return acc_err_set(err, ACC_EINTERNAL, NULL, "cannot start a worker process (%s): %s", r->exe,
                           uv_strerror(rc));
    p->init_req.data = p;
    uv_buf_t b = uv_buf_init((char *)p->init, (unsigned)(sizeof *p->init + p->init->spec_json_len));
    if ((rc = uv_write(&p->init_req, (uv_stream_t *)&p->pipe, &b, 1, on_init_written)) != 0 ||
        (rc = uv_read_start((uv_stream_t *)&p->pipe, on_alloc, on_read)) != 0) {
        /* it runs: it ends as any worker does (reaped, reported), killed now */
        p->no_channel = true;
        p->eof = true;
        kill_worker(p, uv_strerror(rc));
    }
    return 0;
}

static int start(void *ctx, job *j, const kern_device_info *devs, int ndev, acc_err *err)
{
    wk_runner *r = ctx;
    wk_proc *p = calloc(1, sizeof *p);
    if (p == NULL)
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory for a worker");
    p->r = r;
    p->j = j;
    snprintf(p->job_id, sizeof p->job_id, "%s", j->id);
    p->init = make_init(r, j, devs, ndev);
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
        p->released = true;
        p->ended = true;
        if (p->open_handles == 0)
            maybe_free(p);
        else
            close_handles(p);
        return rc;
    }
    uint64_t now = uv_now(r->loop);
    p->last_heard = p->last_check = now;
    uint64_t every = (uint64_t)p->init->heartbeat_ms;
    uv_timer_start(&p->timer, on_timer, every, every);
    pid_write(p);
    j->worker = p;
    acc_log(ACC_LOG_INFO, "worker", "job %s: worker pid %d started", j->id, p->proc.pid);
    return 0;
}

static void release(void *ctx, job *j)
{
    wk_proc *p = j->worker;
    (void)ctx;
    p->released = true;
    maybe_free(p);
}

int wk_runner_init(wk_runner *r, uv_loop_t *loop, const acc_conf *conf, jobs_mgr *jobs, acc_err *err)
{
    memset(r, 0, sizeof *r);
    r->loop = loop;
    r->conf = conf;
    r->jobs = jobs;
    size_t n = sizeof r->exe;
    int rc = uv_exepath(r->exe, &n);
    if (rc != 0)
        return acc_err_set(err, ACC_EINTERNAL, NULL, "cannot find this executable for the workers: %s",
                           uv_strerror(rc));
    int w = snprintf(r->dir, sizeof r->dir, "%s/workers", conf->state_dir);
    if (w < 0 || (size_t)w >= sizeof r->dir)
        return acc_err_set(err, ACC_EINVAL, "state_dir", "state_dir is too long");
    return fsu_mkdir_p(r->dir, 0700, err);
}

void wk_runner_install(wk_runner *r)
{
    jobs_set_runner(r->jobs, &(jobs_runner){.start = start, .control = control, .release = release, .ctx = r});
}

/* ---- leftovers of an earlier daemon */

/* Is pid "accumd --worker <id> ..." (argv[0]'s last component accumd)? */
static bool is_worker_of(pid_t pid, const char *id)
{
    char path[64], cmd[4096];
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, cmd, sizeof cmd - 1);
    close(fd);
    if (n <= 0)
        return false;
    cmd[n] = '\0';
    const char *argv[3] = {cmd, NULL, NULL};
    size_t at = strlen(cmd) + 1;
    for (int i = 1; i < 3 && at < (size_t)n; i++) {
        argv[i] = cmd + at;
        at += strlen(cmd + at) + 1;
    }
    const char *base = strrchr(argv[0], '/');
    base = base ? base + 1 : argv[0];
    return !strcmp(base, "accumd") && argv[1] != NULL && !strcmp(argv[1], "--worker") && argv[2] != NULL &&
           !strcmp(argv[2], id);
}

/* Gone, or a zombie (its reaper is not us). */
static bool is_gone(pid_t pid)
{
    char path[64], st[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return true;
    ssize_t n = read(fd, st, sizeof st - 1);
    close(fd);
    if (n <= 0)
        return true;
    st[n] = '\0';
    const char *rp = strrchr(st, ')');
    return rp != NULL && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X');
}

static bool kill_one(const char *dir, const char *name)
{
    char path[PATH_MAX + 300], id[32], buf[32] = "";
    size_t len = strlen(name);
    if (len < 5 || len - 4 >= sizeof id || strcmp(name + len - 4, ".pid"))
        return false;
    memcpy(id, name, len - 4);
    id[len - 4] = '\0';
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0)
        close(fd);
    unlink(path);
    long pid = n > 0 ? strtol(buf, NULL, 10) : 0;
    if (pid <= 1 || !job_id_valid(id, strlen(id)) || !is_worker_of((pid_t)pid, id))
        return false;
    acc_log(ACC_LOG_WARN, "worker", "job %s: worker %ld of an earlier daemon still runs; killing it", id, pid);
    if (kill((pid_t)pid, SIGKILL) != 0)
        return false;
    for (int i = 0; i < 200 && !is_gone((pid_t)pid); i++) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return true;
}

int wk_kill_leftovers(const char *state_dir)
{
    char dir[PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/workers", state_dir);
    DIR *d = opendir(dir);
    if (d == NULL)
        return 0;
    int killed = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (e->d_name[0] != '.')
            killed += kill_one(dir, e->d_name);
    closedir(d);
    return killed;
}
