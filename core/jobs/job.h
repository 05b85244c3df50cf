/* job: one submitted job, its state, progress, metrics history and event
 * ring, and its JSON forms (API answers, cached, and the store's status).
 *
 * States: queued -> running -> succeeded | failed | cancelled, and
 * running -> queued when the daemon restarts under a running job. A job is
 * owned by the jobs manager (jobs.h) and only touched on the loop thread.
 */
#ifndef ACC_JOB_H
#define ACC_JOB_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "evring.h"
#include "job_spec.h"
#include "kern_discover.h"
#include "trainer.h"

typedef enum job_state { JOB_QUEUED = 0, JOB_RUNNING, JOB_SUCCEEDED, JOB_FAILED, JOB_CANCELLED, JOB_NSTATES } job_state;

typedef struct job_metric {
    int step;
    double time, loss, lr, grad_norm, tokens_per_s;
    int micro_batch, accum_steps;
    uint64_t mem_peak;     /* the largest per-rank peak at this step */
} job_metric;

typedef struct jobs_mgr jobs_mgr;

/* Checkpoint paths a job lists under "outputs" (the newest ones, as many as
 * the daemon keeps, at most this many). */
#define JOB_MAX_OUTPUTS 16
#define JOB_OWNER_MAX 64 /* user names: 1..63 characters */

typedef struct job {
    char id[32];
    char owner[JOB_OWNER_MAX]; /* who submitted it ("" for jobs from before users) */
    uint64_t submit_seq;
    double submitted_at, started_at, finished_at; /* unix seconds, 0 = not yet */
    job_spec spec;
    char *spec_json;       /* the spec as submitted (compact JSON) */
    job_state state;
    int step;
    double last_loss;
    bool have_loss;
    int cur_micro, cur_accum; /* the split now (changes on OOM) */
    int ndev;
    int dev_idx[TRAIN_MAX_RANKS]; /* indexes into the daemon's device table */
    char err_code[32];
    char err_msg[512];
    int restarts;
    uint64_t tokens;       /* tokens trained this run */
    evring ring;
    job_metric *metrics;
    size_t nmetrics, cap_metrics;
    trainer *tr;           /* its rank threads, in this process */
    void *worker;          /* or its worker process (jobs_runner's) */
    /* workers that died without reporting, and the step the last one had
     * reached (-1: none): a second death at that step is not restarted */
    int worker_restarts;
    int crash_step;
    bool cancel_requested;
    /* when the cancel was asked for (unix seconds, 0 = never): stored with
     * the status before the answer, so a restart ends the job cancelled */
    double cancel_requested_at;
    bool cancel_killed;    /* its worker was killed after cancel_grace */
    /* the last progress event (stage, done, total): one is stored only
     * when these change */
    char progress_stage[16];
    uint64_t progress_done, progress_total;
    /* a finished job's device names as it ran ("[...]" JSON text), kept
     * from its stored record: a restart never rewrites them */
    char *record_devices;
    bool stop_for_shutdown; /* cancelled by SIGTERM: stays "running" on disk */
    char *outputs[JOB_MAX_OUTPUTS]; /* checkpoint directories written, oldest first */
    int noutputs;
    jobs_mgr *mgr;
    size_t table_idx;      /* position in the manager's table (submission order) */
    /* a final job's ring and metrics stay in the store until asked for */
    bool hydrated;
    /* a state change the store could not write, retried until it can
     * (the job shows its previous state meanwhile) */
    struct {
        bool on, done;     /* done: a final state with its done event */
        job_state to;
        char code[32], msg[512];
    } pending;
    /* the API views (summary, full), built on demand, dropped on change */
    char *view[2];
    size_t view_len[2];
    /* host memory (config host_memory): what the job needs where it
     * starts (its ranks here x a rank's host bytes, plan_job_host_bytes),
     * reserved while it runs; its trainer's host_mem as the last step
     * reported it; queued for want of host memory (host_wait_msg says why) */
    uint64_t host_bytes, host_per_rank;
    uint64_t host_budget, host_in_use, host_peak;
    bool host_waiting;
    char host_wait_msg[256];
} job;

const char *job_state_name(job_state s);
/* -1 when the name is unknown. */
int job_state_parse(const char *name);
bool job_state_final(job_state s);
/* The job id grammar: 'j' and 6 to 30 digits ("j000001"), nothing else
 * (no NUL, no slash): every route and the store check ids with it. */
bool job_id_valid(const char *s, size_t len);

/* Append a step to the history (grows; ACC_ENOMEM on failure). */
int job_add_metric(job *j, const job_metric *m, acc_err *err);

/* A checkpoint directory was written: list it, keeping the newest `keep`
 * (at most JOB_MAX_OUTPUTS). ACC_ENOMEM leaves the list as it was. */
int job_add_output(job *j, const char *path, int keep, acc_err *err);
void job_free_outputs(job *j);
/* The job's export directory under output_root:
 * output_root/<owner>/<spec output_dir>, else output_root/<id>/export
 * (jobs.c sets it at start; the job view names it). */
void job_export_dir(const job *j, const char *output_root, char *buf, size_t n);

/* The API form: summary (list) or full (with the spec and "outputs": the
 * final model's directory, once the job succeeded, and the checkpoints',
 * each a Hugging Face directory). `devs` names devices. */
json_t *job_to_json(const job *j, bool full, const kern_device_info *devs);
/* The API view as compact JSON text, cached until job_view_invalidate(). */
const char *job_view(job *j, bool full, const kern_device_info *devs, size_t *len);
void job_view_invalidate(job *j);
/* The stored status form (store.h "status"), and back (for reload).
 * The status carries the job's "record" (its name, priority, batch,
 * precision, max_steps as run, devices by name): a final job's view is
 * rebuilt from it at a restart, never from the spec read again (which may
 * give other values: num_train_epochs's max_steps, files gone). */
json_t *job_status_json(const job *j);
void job_status_apply(job *j, const json_t *status);
/* The job's unique id (job_spec.job_uid): 128 random bits as 32 lowercase
 * hex digits, minted at submission, persisted with the status ("uid") and
 * written into each of its checkpoints. */
#define JOB_UID_HEX 32
int job_uid_mint(char *out, size_t n, acc_err *err);
bool job_uid_valid(const char *uid);

/* The metrics history as a JSON object. */
json_t *job_metrics_json(const job *j);

/* RFC 3339 UTC ("2026-12-02T12:00:00.123Z"), or JSON null for 0. */
json_t *job_time_json(double t);
double job_now(void);

#endif
