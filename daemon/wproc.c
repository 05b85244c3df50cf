/* wproc: a worker process and its channel (see wproc.h). */
#include "wproc.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/pidfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "log.h"

extern char **environ;

struct wp_proc {
    uv_loop_t *loop;
    wp_hooks h;
    char id[64], mode[16], tag[16];
    int pid, pidfd;
    uv_poll_t exit_poll;       /* the pidfd: readable once it exited */
    uv_pipe_t pipe;
    uv_timer_t timer;
    int open_handles;
    bool poll_on, pipe_on, timer_on;
    bool exited, eof, ended, released;
    wp_end end;
    int heartbeat_ms;
    uint64_t timeout_ms, last_heard, last_check, exit_at; /* uv_now, ms */
    size_t max_line;
    char *buf;                 /* what came in, not yet a whole line */
    size_t len, cap;
    char *init;                /* the start message, kept until written */
    size_t init_len;
    uv_write_t init_req;
    uv_work_t spawn_req;       /* posix_spawn on libuv's thread pool */
    int child_fd;              /* the child's end of the channel, until spawned */
    int spawn_errno;           /* the spawn's or pidfd_open's error */
    bool spawning;
};

typedef struct wp_ctl {
    uv_write_t req;
    char text[];
} wp_ctl;

/* ---- the end */

static void maybe_free(wp_proc *p)
{
    if (p->open_handles > 0 || !p->released || !p->ended || p->spawning)
        return;
    if (p->pidfd >= 0)
        close(p->pidfd);
    free(p->buf);
    free(p->init);
    free(p);
}

static void on_closed(uv_handle_t *h)
{
    wp_proc *p = h->data;
    p->open_handles--;
    maybe_free(p);
}

static void close_handles(wp_proc *p)
{
    uv_handle_t *hs[] = {(uv_handle_t *)&p->exit_poll, (uv_handle_t *)&p->pipe, (uv_handle_t *)&p->timer};
    bool on[] = {p->poll_on, p->pipe_on, p->timer_on};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++)
        if (on[i] && !uv_is_closing(hs[i]))
            uv_close(hs[i], on_closed);
}

void wp_kill(wp_proc *p, const char *why)
{
    if (p->exited || p->end.killed)
        return;
    p->end.killed = true;
    snprintf(p->end.why, sizeof p->end.why, "%s", why);
    if (p->spawning) /* no process yet: spawn_done kills it */
        return;
    if (pidfd_send_signal(p->pidfd, SIGKILL, NULL, 0) != 0 && errno != ESRCH)
        acc_log(ACC_LOG_ERROR, p->tag, "%s: kill %d: %s", p->id, p->pid, strerror(errno));
}

/* Killed for a reason of its own making: said in the log. */
static void kill_for(wp_proc *p, const char *why)
{
    if (!p->exited && !p->end.killed) /* the pid is the spawning thread's until spawn_done */
        acc_log(ACC_LOG_ERROR, p->tag, "%s: killing worker %d: %s", p->id, p->spawning ? -1 : p->pid, why);
    wp_kill(p, why);
}

/* Both the process and its channel are gone: tell the owner, close. */
static void maybe_end(wp_proc *p)
{
    if (!p->exited || !p->eof || p->ended || p->spawning)
        return;
    p->ended = true;
    uv_timer_stop(&p->timer);
    close_handles(p);
    if (!p->released && p->h.ended != NULL)
        p->h.ended(p->h.ctx, &p->end); /* may release p: freed once the handles are closed */
    maybe_free(p);
}

static void on_exit_ready(uv_poll_t *h, int status, int events)
{
    wp_proc *p = h->data;
    (void)status, (void)events;
    siginfo_t si;
    memset(&si, 0, sizeof si);
    if (waitid(P_PIDFD, (id_t)p->pidfd, &si, WEXITED | WNOHANG) != 0) {
        if (errno == EINTR || errno == EAGAIN)
            return;
        acc_log(ACC_LOG_ERROR, p->tag, "%s: waiting for worker %d: %s", p->id, p->pid, strerror(errno));
        si.si_code = CLD_KILLED, si.si_status = SIGKILL; /* not ours to wait for any more: gone */
    } else if (si.si_pid == 0) {
        return; /* not yet */
    }
    uv_poll_stop(h);
    p->exited = true;
    if (si.si_code == CLD_EXITED)
        p->end.exit_status = si.si_status;
    else
        p->end.term_signal = si.si_status;
    p->exit_at = uv_now(p->loop);
    maybe_end(p);
}

/* ---- the channel */

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    wp_proc *p = h->data;
    (void)hint;
    size_t want = 64 << 10;
    if (p->cap - p->len < want) {
        size_t cap = p->len + want;
        char *nb = cap <= p->max_line + want ? realloc(p->buf, cap) : NULL;
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
    wp_proc *p = s->data;
    (void)buf;
    if (nread < 0) {
        if (nread != UV_EOF) {
            char why[200];
            snprintf(why, sizeof why, "reading its channel: %s", uv_strerror((int)nread));
            p->end.line_too_long |= nread == UV_ENOBUFS && !p->end.killed;
            kill_for(p, why);
        }
        uv_read_stop(s);
        p->eof = true;
        maybe_end(p);
        return;
    }
    p->last_heard = uv_now(p->loop);
    p->len += (size_t)nread;
    size_t start = 0;
    for (size_t i = p->len - (size_t)nread; i < p->len && !p->released; i++)
        if (p->buf[i] == '\n') {
            p->h.line(p->h.ctx, p->buf + start, i - start);
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

int wp_send(wp_proc *p, const char *text, acc_err *err)
{
    if (p->exited || p->eof)
        return acc_err_set(err, ACC_EUNAVAIL, NULL, "the worker is gone");
    size_t n = strlen(text);
    wp_ctl *c = malloc(sizeof *c + n + 1);
    if (c == NULL)
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    memcpy(c->text, text, n + 1);
    c->req.data = c;
    uv_buf_t b = uv_buf_init(c->text, (unsigned)n);
    int rc = uv_write(&c->req, (uv_stream_t *)&p->pipe, &b, 1, on_ctl_written);
    if (rc != 0) {
        free(c);
        return acc_err_set(err, ACC_EUNAVAIL, NULL, "%s", uv_strerror(rc));
    }
    return 0;
}

static void on_init_written(uv_write_t *req, int status)
{
    wp_proc *p = req->data;
    free(p->init);
    p->init = NULL;
    /* EPIPE: it is gone already, its exit says why */
    if (status != 0 && status != UV_ECANCELED && status != UV_EPIPE && !p->exited) {
        p->end.no_channel = !p->end.killed;
        kill_for(p, "its start message could not be written");
    }
}

/* ---- heartbeats */

static void on_timer(uv_timer_t *t)
{
    wp_proc *p = t->data;
    uint64_t now = uv_now(p->loop);
    if (p->exited) {
        if (!p->eof && now - p->exit_at >= WP_EOF_WAIT_MS) { /* a descendant holds the channel */
            uv_read_stop((uv_stream_t *)&p->pipe);
            p->eof = true;
            maybe_end(p);
        }
        return;
    }
    /* the loop itself was away (a late timer): the worker had no chance to be heard */
    if (now - p->last_check > p->timeout_ms / 2 + (uint64_t)p->heartbeat_ms)
        p->last_heard = now;
    p->last_check = now;
    if (!p->end.killed && now - p->last_heard >= p->timeout_ms) {
        p->end.heartbeat_lost = true;
        kill_for(p, "no heartbeat");
    }
}

/* ---- start */

/* The process, its end of the channel as WP_CHILD_FD, in its own session
 * with the default signal dispositions and none blocked; its pidfd. On the
 * thread pool: posix_spawn holds its caller until the child has exec'd. */
static void spawn_work(uv_work_t *w)
{
    wp_proc *p = w->data;
    /* argv[0] the executable's path, as ps and wk_kill_leftovers see it */
    char exe[] = "/proc/self/exe", dpid[24], path[PATH_MAX];
    size_t plen = sizeof path;
    if (uv_exepath(path, &plen) != 0)
        snprintf(path, sizeof path, "%s", exe);
    snprintf(dpid, sizeof dpid, "%d", (int)getpid());
    char *argv[] = {path, p->mode, p->id, dpid, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    int rc = posix_spawn_file_actions_init(&fa);
    if (rc != 0) {
        p->spawn_errno = rc;
        return;
    }
    if ((rc = posix_spawnattr_init(&at)) != 0) {
        posix_spawn_file_actions_destroy(&fa);
        p->spawn_errno = rc;
        return;
    }
    if ((rc = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0)) == 0 &&
        (rc = posix_spawn_file_actions_adddup2(&fa, p->child_fd, WP_CHILD_FD)) == 0 &&
        (rc = posix_spawnattr_setsigmask(&at, &none)) == 0 && (rc = posix_spawnattr_setsigdefault(&at, &all)) == 0 &&
        (rc = posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF)) == 0) {
        pid_t pid;
        rc = posix_spawn(&pid, exe, &fa, &at, argv, environ);
        if (rc == 0)
            p->pid = (int)pid;
    }
    posix_spawnattr_destroy(&at);
    posix_spawn_file_actions_destroy(&fa);
    p->spawn_errno = rc;
    if (rc == 0 && (p->pidfd = pidfd_open(p->pid, 0)) < 0)
        p->spawn_errno = errno;
}

/* A spawned process that could not be watched: killed and reaped now. */
static void reap_unwatched(int pid)
{
    kill(pid, SIGKILL);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
}

/* It never ran (or was ended unwatched): the end, as for any worker. */
static void not_started(wp_proc *p, const char *what, const char *detail)
{
    p->end.not_started = true;
    snprintf(p->end.why, sizeof p->end.why, "%s: %s", what, detail);
    acc_log(ACC_LOG_ERROR, p->tag, "%s: %s", p->id, p->end.why);
    p->exited = p->eof = true;
    uv_read_stop((uv_stream_t *)&p->pipe);
    maybe_end(p);
}

/* Back on the loop: watch its exit, or end. */
static void spawn_done(uv_work_t *w, int status)
{
    wp_proc *p = w->data;
    p->spawning = false;
    close(p->child_fd);
    p->child_fd = -1;
    if (status != 0 || p->spawn_errno != 0) {
        if (p->pid > 0)
            reap_unwatched(p->pid);
        not_started(p, "cannot start a worker process",
                    status != 0 ? uv_strerror(status) : strerror(p->spawn_errno));
        return;
    }
    int rc = uv_poll_init(p->loop, &p->exit_poll, p->pidfd);
    if (rc == 0) {
        p->poll_on = true, p->open_handles++, p->exit_poll.data = p;
        rc = uv_poll_start(&p->exit_poll, UV_READABLE, on_exit_ready);
    }
    if (rc != 0) { /* it cannot be seen to end: it must not run */
        reap_unwatched(p->pid);
        not_started(p, "cannot watch a worker process", uv_strerror(rc));
        return;
    }
    if (p->h.spawned != NULL && !p->released)
        p->h.spawned(p->h.ctx, p->pid);
    if (p->end.killed || p->released) /* killed or let go while it was being started */
        pidfd_send_signal(p->pidfd, SIGKILL, NULL, 0);
}

/* The channel (parent_fd: the pipe's from here, closed here when it cannot
 * be) and the timer. */
static int init_handles(wp_proc *p, int parent_fd, acc_err *err)
{
    int rc;
    if ((rc = uv_pipe_init(p->loop, &p->pipe, 0)) != 0) {
        close(parent_fd);
        return acc_err_set(err, ACC_EINTERNAL, NULL, "worker handles: %s", uv_strerror(rc));
    }
    p->pipe_on = true, p->open_handles++, p->pipe.data = p;
    if ((rc = uv_pipe_open(&p->pipe, parent_fd)) != 0) {
        close(parent_fd);
        return acc_err_set(err, ACC_EINTERNAL, NULL, "worker channel: %s", uv_strerror(rc));
    }
    if ((rc = uv_timer_init(p->loop, &p->timer)) != 0)
        return acc_err_set(err, ACC_EINTERNAL, NULL, "worker handles: %s", uv_strerror(rc));
    p->timer_on = true, p->open_handles++, p->timer.data = p;
    return 0;
}

/* The start message down (the socket holds it until the worker reads it,
 * ahead of any control line), the lines up, the heartbeats watched. */
static void go(wp_proc *p)
{
    p->last_heard = p->last_check = uv_now(p->loop);
    uv_timer_start(&p->timer, on_timer, (uint64_t)p->heartbeat_ms, (uint64_t)p->heartbeat_ms);
    p->init_req.data = p;
    uv_buf_t b = uv_buf_init(p->init, (unsigned)p->init_len);
    int rc;
    if ((rc = uv_write(&p->init_req, (uv_stream_t *)&p->pipe, &b, 1, on_init_written)) != 0 ||
        (rc = uv_read_start((uv_stream_t *)&p->pipe, on_alloc, on_read)) != 0) {
        /* it runs: it ends as any worker does (reaped, reported), killed now */
        p->end.no_channel = true;
        p->eof = true;
        kill_for(p, uv_strerror(rc));
    }
}

int wp_start(uv_loop_t *loop, const wp_opts *o, const wp_hooks *h, wp_proc **out, acc_err *err)
{
    *out = NULL;
    wp_proc *p = calloc(1, sizeof *p);
    char *init = malloc(o->init_len);
    if (p == NULL || init == NULL) {
        free(p);
        free(init);
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory for a worker");
    }
    *p = (wp_proc){.loop = loop, .h = *h, .pid = -1, .pidfd = -1, .child_fd = -1, .heartbeat_ms = o->heartbeat_ms,
                   .timeout_ms = (uint64_t)o->heartbeat_timeout_s * 1000, .max_line = o->max_line,
                   .init = init, .init_len = o->init_len};
    memcpy(p->init, o->init, o->init_len);
    snprintf(p->id, sizeof p->id, "%s", o->id);
    snprintf(p->mode, sizeof p->mode, "%s", o->mode);
    snprintf(p->tag, sizeof p->tag, "%s", o->log_tag);
    int fds[2] = {-1, -1}, rc = 0;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0)
        rc = acc_err_set(err, ACC_EINTERNAL, NULL, "worker channel: %s", strerror(errno));
    else if ((rc = init_handles(p, fds[0], err)) == 0) {
        p->child_fd = fds[1];
        p->spawn_req.data = p;
        int uvrc = uv_queue_work(loop, &p->spawn_req, spawn_work, spawn_done);
        if (uvrc != 0)
            rc = acc_err_set(err, ACC_EINTERNAL, NULL, "cannot start a worker: %s", uv_strerror(uvrc));
    }
    if (rc != 0) { /* nothing runs: freed once the handles made so far are closed */
        if (fds[1] >= 0)
            close(fds[1]);
        p->ended = p->released = true;
        if (p->open_handles == 0)
            maybe_free(p);
        else
            close_handles(p);
        return rc;
    }
    p->spawning = true;
    go(p);
    *out = p;
    return 0;
}

int wp_heartbeat_ms(int timeout_s)
{
    int hb = timeout_s * 1000 / 4;
    return hb < 1000 ? hb : 1000;
}

bool wp_exited(const wp_proc *p) { return p->exited; }

void wp_release(wp_proc *p)
{
    if (p == NULL)
        return;
    p->released = true;
    if (!p->ended)
        wp_kill(p, "let go by its owner");
    maybe_free(p);
}

/* ---- the worker's side */

int wp_child_attach(const char *pid_arg, acc_err *err)
{
    char *end;
    long dpid = strtol(pid_arg, &end, 10);
    if (*end != '\0' || dpid <= 1 || prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != (pid_t)dpid)
        return acc_err_set(err, ACC_EINVAL, NULL, "not started by a live accumd");
    int ignored[] = {SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGXFSZ};
    for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++)
        signal(ignored[i], SIG_IGN);
    if (fcntl(WP_CHILD_FD, F_SETFD, FD_CLOEXEC) != 0)
        return acc_err_set(err, ACC_EINVAL, NULL, "no channel on descriptor %d: %s", WP_CHILD_FD, strerror(errno));
    return 0;
}
