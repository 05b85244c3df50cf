/* daemon: the process. Its one context struct holds all mutable state of the
 * daemon; nothing else in accumd keeps global mutable state.
 *
 * Life: daemon_init (config already parsed) -> daemon_run (libuv loop until a
 * stop signal and every handle is closed) -> daemon_free.
 *
 * Threads: the loop thread owns HTTP and all job state. Trainer worker
 * threads only enqueue events in the jobs manager and wake the loop through
 * `wake` (uv_async_send); the loop applies them (jobs_drain_events).
 *
 * Stop (SIGTERM/SIGINT): stop accepting connections and jobs, cancel the
 * running jobs (they stay "running" on disk, so the next start requeues
 * them), wait for their workers up to shutdown_grace seconds, flush the
 * store, close every handle; the process exits 0. Past the grace period the
 * store is flushed and the process exits 0 without joining the workers.
 */
#ifndef ACC_DAEMON_H
#define ACC_DAEMON_H

#include <stdbool.h>
#include <uv.h>

#include "api_http.h"
#include "conf.h"
#include "err.h"
#include "jobs.h"
#include "kern_discover.h"
#include "worker.h"
#include "gen_worker.h"
#include "genq.h"

typedef struct acc_daemon {
    acc_conf conf;
    uv_loop_t loop;
    uv_signal_t sigs[3];   /* SIGTERM, SIGINT, SIGHUP */
    int nsigs;             /* how many of sigs are initialised */
    bool loop_on;
    uv_timer_t watchdog;
    bool watchdog_on;
    api_server *api;
    kern_device_info devices[KERN_MAX_DEVICES];
    int ndevices;
    int gpu_check;            /* the start-up self-test: -1 none, 0 failed, 1 passed */
    char gpu_check_msg[512];  /* its verdict, as /v1/devices shows it */
    jobs_mgr jobs;
    bool jobs_on;
    wk_runner workers;     /* each job in a worker process (worker_processes) */
    genq gen;              /* POST /v1/generate's requests (core/jobs/genq.h) */
    gw_runner gen_workers; /* each in a worker process (daemon/gen_worker.h) */
    uv_async_t wake;       /* trainer events are queued */
    bool wake_on;
    uv_timer_t tick;       /* sd_notify STATUS refresh */
    bool tick_on;
    uv_timer_t grace;      /* shutdown_grace */
    bool grace_on;
    char last_status[160];
    bool stopping;
    bool stopped;          /* every handle closed or closing */
} acc_daemon;

/* Load a key = value config file into `c` (keys as in conf.h). */
int daemon_conf_load(acc_conf *c, const char *path, acc_err *err);

int daemon_init(acc_daemon *d, acc_err *err);
int daemon_run(acc_daemon *d);
void daemon_free(acc_daemon *d);

/* Begin a graceful stop (as SIGTERM does). Safe to call more than once. */
void daemon_stop(acc_daemon *d, const char *why);

#endif
