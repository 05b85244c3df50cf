/* worker: the daemon's side of the jobs' worker processes (worker_proto.h
 * has the protocol). Installed as the jobs manager's runner (jobs.h), it
 * starts one process per started job (wproc.h: spawned, a socketpair as
 * the channel, only ever read with libuv's non-blocking I/O on the loop
 * thread, heartbeats watched): event lines go to the jobs manager
 * as they come; the end (the process exited and its channel closed) goes
 * after them, with the run's "done" event or the reason there was none.
 *
 * Heartbeats: a worker that sends nothing for worker_heartbeat_timeout
 * seconds is killed (SIGKILL); a loop that was itself away that long
 * (a late timer) does not count against the worker. A worker writing what
 * is not an event is killed as well.
 *
 * Leftovers: each live worker's pid is in state_dir/workers/<job>.pid
 * while it runs; wk_kill_leftovers(), at start, kills the workers of an
 * earlier daemon that are still alive (their daemon died and they did not
 * follow it), after checking in /proc/PID/cmdline that the pid is really
 * "accumd --worker <job>": a reused pid is left alone.
 */
#ifndef ACC_WORKER_H
#define ACC_WORKER_H

#include <limits.h>
#include <uv.h>

#include "conf.h"
#include "err.h"
#include "jobs.h"

typedef struct wk_runner {
    uv_loop_t *loop;
    const acc_conf *conf;
    jobs_mgr *jobs;
    char exe[PATH_MAX];        /* this executable: the worker is its hidden mode */
    char dir[PATH_MAX];        /* state_dir/workers */
} wk_runner;

/* Ready to start workers (their pid directory made); install with
 * jobs_set_runner(jobs, &(jobs_runner){...}) through wk_runner_install. */
int wk_runner_init(wk_runner *r, uv_loop_t *loop, const acc_conf *conf, jobs_mgr *jobs, acc_err *err);
void wk_runner_install(wk_runner *r);

/* Kill the workers an earlier daemon on this state_dir left alive; returns
 * how many. At start only, before any job runs: it waits (up to 2 s each)
 * for them to go. */
int wk_kill_leftovers(const char *state_dir);

#endif
