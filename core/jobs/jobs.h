/* jobs: the job manager. Owns every job, the device table's holders, the
 * store and the hand-off of trainer events to the loop thread.
 *
 * Threads: everything here runs on the daemon's loop thread except
 * the trainer's on_event callback, which only copies the event into a
 * mutex-protected queue and calls `wake` (the daemon's uv_async_send);
 * jobs_drain_events(), on the loop thread, then applies the events to job
 * state, the job's event ring, the metrics history and the store.
 *
 * Durability: a job is acknowledged (jobs_submit_checked returns 0) only after its
 * row and first event are committed (store.h); every state change is one
 * transaction with its event. A state change the store cannot write is not
 * shown: the job keeps its previous state, the change is retried
 * (jobs_retry_store, on the daemon's tick), nothing new starts meanwhile and
 * submissions are refused (503) until the store writes again. At start,
 * jobs_load() brings back every job: queued ones stay queued, running ones
 * are requeued (they resume from their last checkpoint, and their event
 * stream says so) unless a cancel was requested (they end cancelled); a
 * damaged record is kept, failed, with the reason. A final job's record
 * (job.h) is never rewritten: its view is the one it ended with.
 * Final jobs' rings and metrics stay in the store until a client asks
 * (jobs_hydrate), so a start's cost does not grow with their history.
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

/* Why a job's worker process ended without reporting its run's end
 * (/metrics: accumd_worker_failures_total{cause}). */
typedef enum jobs_wfail {
    JOBS_WFAIL_SIGNAL = 0, /* killed by a signal: a crash, SIGKILL, the OOM killer */
    JOBS_WFAIL_EXIT,       /* exited with a non-zero status */
    JOBS_WFAIL_HEARTBEAT,  /* stopped sending heartbeats: the daemon killed it */
    JOBS_WFAIL_PROTOCOL,   /* wrote what is not an event: the daemon killed it */
    JOBS_WFAIL_START,      /* could not be started, or could not start the run */
    JOBS_WFAIL_N
} jobs_wfail;
extern const char *const jobs_wfail_names[JOBS_WFAIL_N];

/* How a worker process ended (jobs_worker_ended). */
typedef struct jobs_wend {
    bool reported;         /* it sent the run's end: `done` is the outcome */
    train_event done;
    jobs_wfail cause;      /* else: why not */
    char what[256];        /* "killed by signal 11 (Segmentation fault)" */
    bool deterministic;    /* it will fail the same way again: never restarted */
} jobs_wend;

/* Who runs a started job (the daemon's worker processes, daemon/worker.h).
 * Without one, a job's rank threads run in this process (trainer.h). All
 * on the loop thread. start: the job is placed on devs[0..ndev) and
 * "running"; 0 and j->worker set, or the error (nothing runs). control:
 * "cancel", "preempt" or "kill" (SIGKILL now: a cancel not honoured in
 * time). release: the job is done with j->worker, after
 * its end was applied. */
typedef struct jobs_runner {
    int (*start)(void *ctx, job *j, const kern_device_info *devs, int ndev, acc_err *err);
    void (*control)(void *ctx, job *j, const char *what);
    void (*release)(void *ctx, job *j);
    void *ctx;
} jobs_runner;

struct jobs_mgr {
    const acc_conf *conf;
    const kern_device_info *devs;
    int ndev;
    job *dev_holder[KERN_MAX_DEVICES];
    uint64_t dev_mem_in_use[KERN_MAX_DEVICES], dev_mem_peak[KERN_MAX_DEVICES];
    /* as the job on the device last reported (kern_device_mem_info):
     * bytes it holds from the device, bytes free on it (0: not seen yet) */
    uint64_t dev_mem_reserved[KERN_MAX_DEVICES], dev_mem_free[KERN_MAX_DEVICES];
    /* of the bytes in use: the job's AdamW moments and gradient buffer on
     * the device (ZeRO >= 1: the moments of the rank's shard) */
    uint64_t dev_mem_optim[KERN_MAX_DEVICES], dev_mem_grads[KERN_MAX_DEVICES];
    /* the start-up GPU self-test, for /v1/devices (set by the daemon):
     * -1 none ran (no GPU found or devices = cpu), 0 failed, 1 passed */
    int gpu_check;
    char gpu_check_msg[512];
    job **jobs;            /* in submission order */
    size_t njobs, cap;
    job **index;           /* open addressing by id, index_cap slots (a power of 2) */
    size_t index_cap;
    size_t npending;       /* jobs with a state change waiting for the store */
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
    uint64_t worker_failures[JOBS_WFAIL_N], worker_restarts_total;
    jobs_runner runner;    /* .start NULL: rank threads in this process */
    /* generate requests (genq.h, POST /v1/generate): the devices lent to
     * them (busy to the scheduler) and their queue, placed after each
     * jobs_schedule on the devices the jobs left; NULL: none */
    bool dev_lent[KERN_MAX_DEVICES];
    struct genq *gen;
};

int jobs_init(jobs_mgr *m, const acc_conf *conf, const kern_device_info *devs, int ndev,
              void (*wake)(void *), void *wake_ctx, acc_err *err);
/* Reload every job from the store. Starts nothing: the caller runs
 * jobs_schedule() once its own start-up has fully succeeded. */
int jobs_load(jobs_mgr *m, acc_err *err);
void jobs_free(jobs_mgr *m);

/* Submission: validate, persist, queue. With dry_run, nothing is stored:
 * *plan gets the resolved batch, the placement and a memory estimate.
 * It is done in two halves, so nothing that can block runs on the loop
 * thread: jobs_check_submission() does everything that reads files (parse,
 * paths under the roots, data and init files, the resume checkpoint, the
 * planner's fit against the largest device, the dry-run table); it reads
 * only m's immutable parts (conf, device table) and may run on any thread.
 * Its result (never NULL but for out of memory) is then completed on the
 * loop thread by jobs_submit_checked() (placement, id, uid, persist, queue). */
typedef struct jobs_checked {
    int rc;                /* 0 or the check's refusal, in err */
    acc_err err;
    bool dry_run;
    job_spec *spec;
    char *text;            /* the submitted text */
    size_t len;
    json_t *cands;         /* dry run: the planner's candidates */
    uint64_t peak;
    int micro;
    char owner[JOB_OWNER_MAX]; /* who submits ("" for none): set before jobs_submit_checked */
    /* host memory the job reserves while it runs: its ranks here x a rank's */
    uint64_t host_per_rank, host_job;
} jobs_checked;
jobs_checked *jobs_check_submission(const jobs_mgr *m, const char *text, size_t len, bool dry_run);
int jobs_submit_checked(jobs_mgr *m, jobs_checked *c, job **out, json_t **plan, acc_err *err);
void jobs_checked_free(jobs_checked *c);

job *jobs_find(jobs_mgr *m, const char *id);
/* Queued: cancelled now. Running: the request is stored (status and a
 * log event, one FULL commit) before the run is asked to stop, so a
 * restart ends the job cancelled instead of requeuing it; ACC_EUNAVAIL
 * when the store cannot write it. Final: ACC_ESTATE. */
int jobs_cancel(jobs_mgr *m, job *j, acc_err *err);

/* Start every queued job the scheduler places now: priority, then round
 * robin by owner, within the per-user limits of the config. */
void jobs_schedule(jobs_mgr *m);
/* Run jobs through `r` from now on (before the first jobs_schedule). */
void jobs_set_runner(jobs_mgr *m, const jobs_runner *r);
/* From the runner, on the loop thread: an event of j's run, and the end of
 * its worker (after every event of it). Both are queued behind the events
 * before them and applied by jobs_drain_events. A worker that ended
 * without reporting fails the job with `what` and the step it had reached,
 * or requeues it to resume from its last checkpoint while the spec's
 * max_restarts allow (never when deterministic, never twice at one step). */
void jobs_worker_event(jobs_mgr *m, job *j, const train_event *ev);
void jobs_worker_ended(jobs_mgr *m, job *j, const jobs_wend *e);
/* Whether j has rank threads or a worker (it holds its devices). */
bool jobs_job_active(const job *j);
/* Host memory the running jobs hold reserved (each its host_bytes), of
 * the config's host_memory. */
uint64_t jobs_host_reserved(const jobs_mgr *m);

/* Apply the trainer events queued since the last call (loop thread). */
void jobs_drain_events(jobs_mgr *m);

/* Shutdown: refuse new jobs, stop running ones (they stay "running" on
 * disk, so the next start requeues them). Returns how many still run. */
int jobs_shutdown(jobs_mgr *m);
int jobs_count_running(const jobs_mgr *m);
void jobs_count_states(const jobs_mgr *m, int counts[JOB_NSTATES]);
/* The daemon's tick: a cancelled job whose worker has not ended within
 * cancel_grace seconds of the request (stuck inside one record of data
 * preparation, say) has its worker killed; the job then ends cancelled.
 * Runs in this process (no worker) cannot be killed and are left alone. */
void jobs_enforce_cancels(jobs_mgr *m);
/* Shutdown: a last try at the state changes still waiting for the store. */
void jobs_flush(jobs_mgr *m);

/* The daemon's tick: retry what the store could not write; once it writes
 * again, schedule. Cheap when the store is fine. */
void jobs_retry_store(jobs_mgr *m);

/* Load a final job's event ring and metrics from the store (no-op when
 * already there). Bounded by event_ring and history_keep. */
int jobs_hydrate(jobs_mgr *m, job *j, acc_err *err);

/* Up to `limit` jobs newest first, older than the job `after` (NULL: from
 * the newest), of state `state` (-1: all). *more: there are older ones. An
 * unknown `after` is ACC_EINVAL on field "after". */
int jobs_list(jobs_mgr *m, int state, const char *after, int limit, job **out, int *n, bool *more, acc_err *err);

#endif
