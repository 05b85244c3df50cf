/* jobs: the job manager. Owns every job, the device table's holders, the
 * store and the hand-off of trainer events to the loop thread.
 *
 * Threads: everything here runs on the daemon's loop thread except
 * the trainer's on_event callback, which only copies the event into a
 * mutex-protected queue and calls `wake` (the daemon's uv_async_send);
 * jobs_drain_events(), on the loop thread, then applies the events to job
 * state, the job's event ring, the metrics history and the store.
 *
 * Durability: a job is acknowledged (jobs_submit returns 0) only after its
 * spec.json and status.json are on disk; every state change rewrites
 * status.json and fsyncs the event log. At start, jobs_load() brings back
 * every job: queued ones stay queued, running ones are requeued (they
 * restart from step 0 until resume from checkpoints exists, and their event
 * stream says so).
 */
#ifndef ACC_JOBS_H
#define ACC_JOBS_H

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "conf.h"
#include "job.h"
#include "kern_discover.h"
#include "store.h"

typedef struct jobs_tev jobs_tev; /* a queued trainer event */

struct jobs_mgr {
    const acc_conf *conf;
    const kern_device_info *devs;
    int ndev;
    job *dev_holder[KERN_MAX_DEVICES];
    uint64_t dev_mem_in_use[KERN_MAX_DEVICES], dev_mem_peak[KERN_MAX_DEVICES];
    /* as the job on the device last reported (kern_device_mem_info):
     * bytes it holds from the device, bytes free on it (0: not seen yet) */
    uint64_t dev_mem_reserved[KERN_MAX_DEVICES], dev_mem_free[KERN_MAX_DEVICES];
    /* the start-up GPU self-test, for /v1/devices (set by the daemon):
     * -1 none ran (no GPU found or devices = cpu), 0 failed, 1 passed */
    int gpu_check;
    char gpu_check_msg[512];
    job **jobs;            /* in submission order */
    size_t njobs, cap;
    uint64_t next_submit;
    store st;
    pthread_mutex_t qmu;
    bool qmu_on;
    jobs_tev *qhead, *qtail;
    void (*wake)(void *ctx);
    void *wake_ctx;
    bool draining;         /* shutting down: no new jobs, nothing starts */
    /* counters since start (Prometheus) */
    uint64_t steps_total, tokens_total, oom_adjust_total, submitted_total;
};

int jobs_init(jobs_mgr *m, const acc_conf *conf, const kern_device_info *devs, int ndev,
              void (*wake)(void *), void *wake_ctx, acc_err *err);
/* Reload every job from the store, then start what fits. */
int jobs_load(jobs_mgr *m, acc_err *err);
void jobs_free(jobs_mgr *m);

/* Validate, persist, queue. With dry_run, nothing is stored: *plan gets
 * the resolved batch, the placement and a memory estimate. */
int jobs_submit(jobs_mgr *m, const char *text, size_t len, bool dry_run, job **out, json_t **plan, acc_err *err);
/* The same for a named owner (a user name; NULL or "" for none). */
int jobs_submit_as(jobs_mgr *m, const char *owner, const char *text, size_t len, bool dry_run, job **out,
                   json_t **plan, acc_err *err);
job *jobs_find(jobs_mgr *m, const char *id);
/* Queued: cancelled now. Running: asked to stop (final state follows).
 * Final: ACC_ESTATE. */
int jobs_cancel(jobs_mgr *m, job *j, acc_err *err);

/* Start every queued job the scheduler places now: priority, then round
 * robin by owner, within the per-user limits of the config. */
void jobs_schedule(jobs_mgr *m);
/* Apply the trainer events queued since the last call (loop thread). */
void jobs_drain_events(jobs_mgr *m);

/* Shutdown: refuse new jobs, stop running ones (they stay "running" on
 * disk, so the next start requeues them). Returns how many still run. */
int jobs_shutdown(jobs_mgr *m);
int jobs_count_running(const jobs_mgr *m);
void jobs_count_states(const jobs_mgr *m, int counts[JOB_NSTATES]);
/* fsync every open event log. */
void jobs_flush(jobs_mgr *m);

#endif
