/* wproc: one worker process of the daemon and its channel, the plumbing
 * the jobs' workers (worker.h) and the generate requests' workers
 * (gen_worker.h) share.
 *
 * The worker is this very program (/proc/self/exe, so an upgrade that
 * replaced the file does not change the start message's layout) in a
 * hidden mode, `accumd MODE ID DAEMON_PID`, in a session of its own (a
 * terminal's ^C is the daemon's to handle), stdin /dev/null, stdout and
 * stderr the daemon's, and one end of a socketpair as descriptor
 * WP_CHILD_FD: the channel.
 *
 * Started with posix_spawn, i.e. clone(CLONE_VM | CLONE_VFORK): the
 * daemon's page tables are not copied and the pages it writes afterwards
 * take no copy-on-write faults; and on libuv's thread pool, since
 * posix_spawn holds its caller until the child has exec'd. uv_spawn forked
 * on the loop thread and waited there for the exec: 13 to 90 ms of a
 * blocked loop per worker on the loaded development machine
 * (bench/RESULTS.md). The exit is watched through a pidfd polled by the
 * loop, the process reaped with waitid on it; SIGKILL goes through the
 * pidfd too (never to a reused pid). The parent-death signal the workers
 * ask for follows the spawning thread: the pool's threads live as long as
 * the daemon.
 *
 * On the loop thread only, with libuv's non-blocking I/O: the start
 * message is written once, then every line the worker writes up goes to
 * the owner's `line` hook as it comes (any data counts as heard); control
 * lines may be written down (wp_send). A worker silent for
 * heartbeat_timeout_s is killed (a loop that was itself away that long, a
 * late timer, does not count against it), as is one whose line passes
 * max_line or whose start message cannot be written. Once the process has
 * exited and its channel is closed (at most WP_EOF_WAIT_MS after the exit:
 * a descendant may hold it) the `ended` hook runs, once, with how it
 * ended. The handle is freed when both the owner has let it go
 * (wp_release) and its libuv handles are closed.
 */
#ifndef ACC_WPROC_H
#define ACC_WPROC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "err.h"

#define WP_CHILD_FD 3
#define WP_EOF_WAIT_MS 2000

typedef struct wp_proc wp_proc;

/* How a worker ended. */
typedef struct wp_end {
    int64_t exit_status;       /* when it exited */
    int term_signal;           /* when a signal ended it */
    bool killed;               /* by wp_kill, the owner's or one below */
    bool heartbeat_lost;       /* killed: silent for heartbeat_timeout_s */
    bool no_channel;           /* killed: its start message could not be written */
    bool line_too_long;        /* killed: a line past max_line */
    bool not_started;          /* the process could not be started or watched */
    char why[300];             /* the first reason it was killed */
} wp_end;

typedef struct wp_hooks {
    /* A whole line (without its '\n'), heartbeats included. */
    void (*line)(void *ctx, const char *line, size_t n);
    /* Optional: the process runs (its pid), soon after wp_start. */
    void (*spawned)(void *ctx, int pid);
    /* Exited and its channel closed (or never started: not_started); once. */
    void (*ended)(void *ctx, const wp_end *end);
    void *ctx;
} wp_hooks;

typedef struct wp_opts {
    const char *mode;          /* "--worker", "--generate" */
    const char *id;            /* the job or request id (argv, logs) */
    const char *log_tag;       /* the log's component: "worker", "generate" */
    const void *init;          /* the start message (copied) */
    size_t init_len;
    int heartbeat_ms;          /* how often the timer looks */
    int heartbeat_timeout_s;
    size_t max_line;
} wp_opts;

/* The heartbeat period a worker is given for a timeout of timeout_s: a
 * quarter of it, at most 1 s. */
int wp_heartbeat_ms(int timeout_s);

/* Start one: 0 with *out on its way (the process is spawned on libuv's
 * thread pool; its hooks will be called, `ended` even when it could not be
 * started), or the error (nothing runs, nothing to release). */
int wp_start(uv_loop_t *loop, const wp_opts *o, const wp_hooks *h, wp_proc **out, acc_err *err);
/* SIGKILL, once, `why` kept as the end's reason (a worker that has exited:
 * nothing). */
void wp_kill(wp_proc *p, const char *why);
/* A control line down the channel (text and its '\n'), copied. */
int wp_send(wp_proc *p, const char *text, acc_err *err);
/* Exited (the pid may be reaped). */
bool wp_exited(const wp_proc *p);
/* The owner lets it go (after `ended`, or at once: it is killed and ends
 * unseen); freed once its handles are closed. */
void wp_release(wp_proc *p);

/* ---- the worker's side (in the spawned process) */

/* The worker attaches to the daemon whose pid is `pid_arg`: it dies with
 * it (PR_SET_PDEATHSIG; a daemon already gone shows as a changed parent),
 * ignores SIGPIPE, SIGTERM, SIGINT, SIGHUP and SIGXFSZ (the daemon alone
 * tells it to stop; a full disk is an error, not a death), and keeps the
 * channel WP_CHILD_FD from whatever it starts (close-on-exec). ACC_EINVAL
 * with the reason otherwise. */
int wp_child_attach(const char *pid_arg, acc_err *err);

#endif
