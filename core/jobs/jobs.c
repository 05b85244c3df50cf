/* jobs: the job manager (see jobs.h). */
#include "jobs.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fsutil.h"
#include "log.h"
#include "mem_plan.h"
#include "scheduler.h"

struct jobs_tev {
    jobs_tev *next;
    job *j;
    train_event ev;
};

/* ---- events: ring + log ---------------------------------------------------- */

/* Stamp `ev` with seq/type/time/job, push it into the ring and append it to
 * the event log (fsynced when `sync`). Takes ownership of `ev`. */
static void emit(job *j, const char *type, json_t *ev, bool sync)
{
    if (ev == NULL) {
        acc_log(ACC_LOG_ERROR, "jobs", "job %s: out of memory building a %s event", j->id, type);
        return;
    }
    json_t *o = json_pack("{s:I, s:s, s:o, s:s}", "seq", (json_int_t)j->ring.next_seq, "type", type, "time",
                          job_time_json(job_now()), "job", j->id);
    char *text = NULL;
    if (o != NULL && json_object_update(o, ev) == 0)
        text = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(10));
    json_decref(o);
    json_decref(ev);
    if (text == NULL) {
        acc_log(ACC_LOG_ERROR, "jobs", "job %s: cannot encode a %s event", j->id, type);
        return;
    }
    acc_err err = {0};
    size_t len = strlen(text);
    if (store_append_event(j->ev_fd, text, len, sync, &err) != 0)
        acc_log(ACC_LOG_ERROR, "store", "job %s: event log: %s", j->id, err.msg);
    if (evring_push(&j->ring, type, text, len, NULL, &err) != 0)
        acc_log(ACC_LOG_ERROR, "jobs", "job %s: %s", j->id, err.msg);
    free(text);
}

static void save_status(job *j)
{
    acc_err err = {0};
    json_t *st = job_status_json(j);
    char *text = st ? json_dumps(st, JSON_COMPACT) : NULL;
    json_decref(st);
    if (text == NULL || store_save_status(&j->mgr->st, j->id, text, strlen(text), &err) != 0)
        acc_log(ACC_LOG_ERROR, "store", "job %s: status not saved: %s", j->id, text ? err.msg : "out of memory");
    free(text);
}

static void close_log(job *j)
{
    if (j->ev_fd >= 0 && close(j->ev_fd) != 0)
        acc_log(ACC_LOG_WARN, "store", "job %s: closing the event log: %s", j->id, strerror(errno));
    j->ev_fd = -1;
}

static void set_state(job *j, job_state to, const char *msg)
{
    job_state from = j->state;
    j->state = to;
    if (job_state_final(to))
        j->finished_at = job_now();
    save_status(j);
    emit(j, "state", json_pack("{s:s, s:s, s:s?}", "state", job_state_name(to), "from", job_state_name(from),
                               "message", msg), true);
    acc_log(ACC_LOG_INFO, "jobs", "job %s: %s -> %s%s%s", j->id, job_state_name(from), job_state_name(to),
            msg ? ": " : "", msg ? msg : "");
}

/* The end of a run: state event, done event, watchers finish. */
static void finish(job *j, job_state to, const char *code, const char *msg)
{
    if (code != NULL) {
        snprintf(j->err_code, sizeof j->err_code, "%s", code);
        snprintf(j->err_msg, sizeof j->err_msg, "%s", msg ? msg : "");
    }
    set_state(j, to, msg);
    emit(j, "done", json_pack("{s:s, s:i, s:s?}", "state", job_state_name(to), "step", j->step, "message", msg),
         true);
    evring_close(&j->ring);
    close_log(j); /* a final job writes no more: keep fds for live ones */
}

/* ---- the table ------------------------------------------------------------ */

static job *job_new(jobs_mgr *m, acc_err *err)
{
    job *j = calloc(1, sizeof *j);
    if (j == NULL) {
        acc_err_set(err, ACC_ENOMEM, NULL, "out of memory for a job");
        return NULL;
    }
    j->ev_fd = -1;
    j->mgr = m;
    if (evring_init(&j->ring, m->conf->event_ring, err) != 0) {
        free(j);
        return NULL;
    }
    return j;
}

static void job_delete(job *j)
{
    if (j->ev_fd >= 0)
        close(j->ev_fd);
    evring_free(&j->ring);
    free(j->metrics);
    job_free_outputs(j);
    free(j->spec_json);
    free(j);
}

static int table_add(jobs_mgr *m, job *j, acc_err *err)
{
    if (m->njobs == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 64;
        job **nj = realloc(m->jobs, cap * sizeof *nj);
        if (nj == NULL)
            return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory for the job table");
        m->jobs = nj;
        m->cap = cap;
    }
    m->jobs[m->njobs++] = j;
    return 0;
}

job *jobs_find(jobs_mgr *m, const char *id)
{
    for (size_t i = 0; i < m->njobs; i++)
        if (!strcmp(m->jobs[i]->id, id))
            return m->jobs[i];
    return NULL;
}

int jobs_init(jobs_mgr *m, const acc_conf *conf, const kern_device_info *devs, int ndev,
              void (*wake)(void *), void *wake_ctx, acc_err *err)
{
    memset(m, 0, sizeof *m);
    m->gpu_check = -1; /* no GPU self-test until the daemon says so */
    m->conf = conf;
    m->devs = devs;
    m->ndev = ndev;
    m->wake = wake;
    m->wake_ctx = wake_ctx;
    m->next_submit = 1;
    int rc = store_init(&m->st, conf->state_dir, err);
    if (rc != 0)
        return rc;
    if ((rc = pthread_mutex_init(&m->qmu, NULL)) != 0)
        return acc_err_set(err, ACC_EINTERNAL, NULL, "mutex: %s", strerror(rc));
    m->qmu_on = true;
    return 0;
}

void jobs_free(jobs_mgr *m)
{
    for (size_t i = 0; i < m->njobs; i++) {
        job *j = m->jobs[i];
        if (j->tr != NULL) /* its threads may still touch it: leave it */
            continue;
        job_delete(j);
    }
    free(m->jobs);
    m->jobs = NULL;
    m->njobs = 0;
    if (m->qmu_on) {
        pthread_mutex_lock(&m->qmu);
        for (jobs_tev *t = m->qhead, *n; t != NULL; t = n) {
            n = t->next;
            free(t);
        }
        m->qhead = m->qtail = NULL;
        pthread_mutex_unlock(&m->qmu);
        pthread_mutex_destroy(&m->qmu);
        m->qmu_on = false;
    }
}

/* ---- submit ----------------------------------------------------------------- */

static void sched_devs(const jobs_mgr *m, sched_dev *sd)
{
    for (int i = 0; i < m->ndev; i++) {
        const job *h = m->dev_holder[i];
        sd[i] = (sched_dev){.kind = m->devs[i].kind, .busy = h != NULL, .holder_prio = h ? h->spec.priority : 0,
                            .holder_submit = h ? h->submit_seq : 0};
    }
}

/* A byte count for JSON (signed 64-bit): an overflowed (saturated) size
 * shows as the largest value, never as a negative or wrapped one. */
static json_int_t bytes_json(uint64_t b)
{
    return b > (uint64_t)INT64_MAX ? (json_int_t)INT64_MAX : (json_int_t)b;
}

/* The planner's table for a dry run: each candidate micro batch with its
 * predicted peak per device and whether it fits the smallest budget of the
 * devices of that kind (less the planner's margin). */
static json_t *plan_json(const job_spec *s, kern_dev_kind kind, uint64_t budget,
                         uint64_t *peak_out, int *micro_out)
{
    plan_row *rows = calloc(PLAN_MAX_ROWS, sizeof *rows);
    json_t *arr = json_array();
    int n = 0, chosen = -1;
    acc_err err = {0};
    *peak_out = 0;
    *micro_out = s->micro_batch;
    if (rows == NULL || arr == NULL || plan_candidates_on(s, kind, budget, rows, PLAN_MAX_ROWS, &n, &chosen, &err) != 0) {
        free(rows);
        json_decref(arr);
        return json_null();
    }
    for (int i = 0; i < n; i++) {
        const plan_row *r = &rows[i];
        json_array_append_new(arr, json_pack("{s:i, s:i, s:b, s:I, s:b}", "micro_batch", r->micro_batch,
                                             "accum_steps", r->accum_steps, "recompute", r->recompute,
                                             "predicted_peak_bytes", bytes_json(r->peak_bytes), "fits", r->fits));
        /* the split this job would start with: its own m, or the planner's pick for "auto" */
        bool mine = s->micro_auto ? i == chosen
                                  : (r->micro_batch == s->micro_batch && r->recompute == s->activation_checkpointing);
        if (mine) {
            *peak_out = r->peak_bytes;
            *micro_out = r->micro_batch;
        }
    }
    free(rows);
    return arr;
}

/* The owners of the jobs as small indexes for the scheduler: what each
 * runs and holds now, and when each last had a job start. */
typedef struct owner_tab {
    const char **name;
    int *running, *devices;
    uint64_t *last;          /* microseconds of the latest started_at */
    int n;
} owner_tab;

static int owner_tab_build(const jobs_mgr *m, owner_tab *t);
static int owner_index(owner_tab *t, const char *name);
static void owner_tab_free(owner_tab *t);
static void owner_limits(const jobs_mgr *m, owner_tab *t, sched_limits *lim);

static size_t queue_fill(jobs_mgr *m, owner_tab *ot, sched_req *q);

/* Would a job of `owner` with spec `s` start now? The scheduler's own
 * answer: every queued job and this one planned on the devices as they
 * are, with the owners' shares. *before: the queued jobs ahead of it in
 * run order that are not held back by their owner's limits. */
static int plan_with_queue(jobs_mgr *m, const job_spec *s, const char *owner, sched_req *out, int *before)
{
    size_t nq = 0;
    for (size_t i = 0; i < m->njobs; i++)
        nq += m->jobs[i]->state == JOB_QUEUED;
    sched_req *q = calloc(nq + 1, sizeof *q);
    owner_tab ot;
    if (q == NULL || owner_tab_build(m, &ot) != 0) {
        free(q);
        return -1;
    }
    size_t k = queue_fill(m, &ot, q);
    int u = owner_index(&ot, owner ? owner : "");
    q[k] = (sched_req){.want = s->devices, .prio = s->priority, .submit = m->next_submit, .user = u,
                       .user_last = ot.last[u]};
    sched_dev sd[KERN_MAX_DEVICES];
    sched_devs(m, sd);
    sched_limits lim;
    owner_limits(m, &ot, &lim);
    sched_plan_users(sd, m->ndev, q, (int)k + 1, &lim);
    *before = 0;
    for (size_t i = 0; i <= k; i++) {
        if (q[i].job == NULL) { /* this one */
            *out = q[i];
            break;
        }
        *before += !q[i].over_share;
    }
    owner_tab_free(&ot);
    free(q);
    return 0;
}

static json_t *dry_run_plan(jobs_mgr *m, const job_spec *s, const char *owner)
{
    sched_req r;
    int queued_before;
    if (plan_with_queue(m, s, owner, &r, &queued_before) != 0)
        return NULL;
    uint64_t budget = 0;
    for (int i = 0; i < m->ndev; i++)
        if (budget == 0 || m->devs[i].mem_total < budget)
            budget = m->devs[i].mem_total;
    uint64_t peak;
    int micro;
    kern_dev_kind kind = m->ndev > 0 ? m->devs[0].kind : KERN_DEV_CPU; /* all of one kind */
    json_t *cands = plan_json(s, kind, budget, &peak, &micro);
    json_t *devs = json_array(), *mem = json_array();
    for (int i = 0; i < s->devices; i++) {
        if (r.start)
            json_array_append_new(devs, json_string(m->devs[r.placed[i]].name));
        json_array_append_new(mem, json_integer(bytes_json(peak)));
    }
    int per_rank = s->train_batch_size / (s->devices > 0 ? s->devices : 1);
    json_t *plan = json_pack("{s:b, s:{s:i, s:i, s:i, s:i, s:b}, s:s, s:{s:b, s:o, s:s, s:i}, s:o, s:I, s:o}", "dry_run", 1,
                     "batch", "train_batch_size", s->train_batch_size, "micro_batch", micro, "accum_steps",
                     micro > 0 ? per_rank / micro : 0, "world", s->devices, "micro_auto", s->micro_auto,
                     "precision", spec_precision_name(s->precision), "placement", "starts_now", r.start, "devices", devs, "kind",
                     m->ndev > 0 && m->devs[0].kind == KERN_DEV_CUDA ? "cuda" : "cpu", "queued_before",
                     queued_before, "predicted_peak_memory_bytes", mem, "device_memory_bytes", (json_int_t)budget,
                     "micro_batch_candidates", cands);
    json_t *pl = json_object_get(plan, "placement");
    if (pl != NULL) /* it would wait for its owner's share (user_max_*) */
        json_object_set_new(pl, "over_user_limit", json_boolean(r.over_share));
    return plan;
}

/* Everything that can be refused before a job exists: spec, fit, data. */
static int validate(jobs_mgr *m, const char *text, size_t len, job_spec *s, acc_err *err)
{
    int rc = job_spec_parse(text, len, m->conf, s, err);
    if (rc != 0)
        return rc;
    sched_dev sd[KERN_MAX_DEVICES];
    sched_devs(m, sd);
    if ((rc = sched_can_ever_fit(sd, m->ndev, s->devices, err)) != 0)
        return rc;
    if (m->conf->user_max_devices > 0 && s->devices > m->conf->user_max_devices)
        return acc_err_set(err, ACC_EINVAL, "devices",
                           "devices %d can never be placed: over user_max_devices %d (devices one user may hold at once)",
                           s->devices, m->conf->user_max_devices);
    return trainer_check_spec(s, err);
}

/* output_root/<id>; conf keeps output_root well under PATH_MAX. */
static void set_output_dir(const jobs_mgr *m, job *j)
{
    int w = snprintf(j->spec.output_dir, sizeof j->spec.output_dir, "%s/%s", m->conf->output_root, j->id);
    if (w < 0 || (size_t)w >= sizeof j->spec.output_dir)
        acc_log(ACC_LOG_WARN, "jobs", "job %s: output_root too long, output dir truncated", j->id);
}

/* The submitted text, re-encoded compactly (it parsed, so it loads). */
static char *compact_spec(const char *text, size_t len)
{
    json_t *o = json_loadb(text, len, 0, NULL);
    char *out = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(10)) : NULL;
    json_decref(o);
    return out;
}

static int persist_new(jobs_mgr *m, job *j, acc_err *err)
{
    json_t *st = job_status_json(j);
    char *status = st ? json_dumps(st, JSON_COMPACT) : NULL;
    json_decref(st);
    if (status == NULL)
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    int rc = store_create_job(&m->st, j->id, j->spec_json, strlen(j->spec_json), status, strlen(status), err);
    free(status);
    if (rc == 0)
        rc = store_open_events(&m->st, j->id, &j->ev_fd, err);
    return rc;
}

int jobs_submit(jobs_mgr *m, const char *text, size_t len, bool dry_run, job **out, json_t **plan, acc_err *err)
{
    return jobs_submit_as(m, NULL, text, len, dry_run, out, plan, err);
}

int jobs_submit_as(jobs_mgr *m, const char *owner, const char *text, size_t len, bool dry_run, job **out,
                   json_t **plan, acc_err *err)
{
    job_spec *s = malloc(sizeof *s);
    if (s == NULL)
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    int rc = validate(m, text, len, s, err);
    if (rc == 0 && dry_run) {
        *plan = dry_run_plan(m, s, owner);
        rc = *plan ? 0 : acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    }
    if (rc != 0 || dry_run) {
        free(s);
        return rc;
    }
    if (m->draining) {
        free(s);
        return acc_err_set(err, ACC_ESTATE, NULL, "the daemon is shutting down; not accepting jobs");
    }
    job *j = job_new(m, err);
    if (j == NULL) {
        free(s);
        return err ? err->code : ACC_ENOMEM;
    }
    j->spec = *s;
    free(s);
    j->submit_seq = m->next_submit;
    snprintf(j->id, sizeof j->id, "j%06llu", (unsigned long long)j->submit_seq);
    snprintf(j->owner, sizeof j->owner, "%s", owner ? owner : "");
    set_output_dir(m, j);
    j->submitted_at = job_now();
    j->cur_micro = j->spec.micro_batch;
    j->cur_accum = j->spec.accum_steps;
    j->spec_json = compact_spec(text, len);
    if (j->spec_json == NULL)
        rc = acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    if (rc == 0)
        rc = persist_new(m, j, err);
    if (rc == 0)
        rc = table_add(m, j, err);
    if (rc != 0) {
        acc_log(ACC_LOG_ERROR, "jobs", "job %s not stored: %s", j->id, err ? err->msg : "");
        job_delete(j);
        return rc;
    }
    m->next_submit++;
    m->submitted_total++;
    emit(j, "state", json_pack("{s:s}", "state", "queued"), true);
    acc_log(ACC_LOG_INFO, "jobs", "job %s queued: %s, %d device(s), B=%d m=%d a=%d", j->id, j->spec.name,
            j->spec.devices, j->spec.train_batch_size, j->spec.micro_batch, j->spec.accum_steps);
    *out = j;
    jobs_schedule(m);
    return 0;
}

/* ---- running ---------------------------------------------------------------- */

static void on_trainer_event(void *ctx, const train_event *ev)
{
    job *j = ctx;
    jobs_mgr *m = j->mgr;
    jobs_tev *t = malloc(sizeof *t);
    if (t == NULL) { /* cannot drop TEV_DONE: spin until memory returns */
        while ((t = malloc(sizeof *t)) == NULL && ev->kind == TEV_DONE)
            usleep(1000);
        if (t == NULL)
            return;
    }
    t->next = NULL;
    t->j = j;
    t->ev = *ev;
    pthread_mutex_lock(&m->qmu);
    if (m->qtail != NULL)
        m->qtail->next = t;
    else
        m->qhead = t;
    m->qtail = t;
    pthread_mutex_unlock(&m->qmu);
    m->wake(m->wake_ctx);
}

static void release_devices(jobs_mgr *m, job *j)
{
    for (int i = 0; i < j->ndev; i++) {
        int d = j->dev_idx[i];
        if (m->dev_holder[d] == j) {
            m->dev_holder[d] = NULL;
            m->dev_mem_in_use[d] = 0;
            m->dev_mem_reserved[d] = 0;
            m->dev_mem_free[d] = 0; /* unknown until the next job reports */
        }
    }
}

static void start_job(jobs_mgr *m, job *j, const sched_req *r)
{
    kern_device_info devinfo[TRAIN_MAX_RANKS];
    acc_err err = {0};
    j->ndev = r->want;
    for (int i = 0; i < r->want; i++) {
        j->dev_idx[i] = r->placed[i];
        devinfo[i] = m->devs[r->placed[i]];
        m->dev_holder[r->placed[i]] = j;
    }
    j->started_at = job_now();
    j->tokens = 0;
    /* step, loss and history stay: a requeued job resumes from its last
     * checkpoint, and the steps it redoes replace their old entries */
    j->cur_micro = j->spec.micro_batch;
    j->cur_accum = j->spec.accum_steps;
    j->cancel_requested = false;
    if (fsu_mkdir_p(j->spec.output_dir, 0750, &err) != 0) {
        release_devices(m, j);
        finish(j, JOB_FAILED, acc_err_name(err.code), err.msg);
        return;
    }
    trainer_opts o = {.spec = &j->spec, .devices = devinfo, .threads_per_device = m->conf->cpu_threads_per_device,
                      .checkpoint_keep = m->conf->checkpoint_keep,
                      .on_event = on_trainer_event, .event_ctx = j};
    if (trainer_start(&o, &j->tr, &err) != 0) {
        j->tr = NULL;
        release_devices(m, j);
        acc_log(ACC_LOG_ERROR, "jobs", "job %s: cannot start: %s", j->id, err.msg);
        finish(j, JOB_FAILED, acc_err_name(err.code), err.msg);
        return;
    }
    char msg[256];
    snprintf(msg, sizeof msg, "placed on %d device(s)%s", r->want, r->backfilled ? " (backfill)" : "");
    set_state(j, JOB_RUNNING, msg);
}


static int owner_index(owner_tab *t, const char *name)
{
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->name[i], name))
            return i;
    t->name[t->n] = name;
    t->running[t->n] = t->devices[t->n] = 0;
    t->last[t->n] = 0;
    return t->n++;
}

static void owner_tab_free(owner_tab *t)
{
    free(t->name);
    free(t->running);
    free(t->devices);
    free(t->last);
}

static int owner_tab_build(const jobs_mgr *m, owner_tab *t)
{
    size_t n = m->njobs, cap = n + 1; /* + one owner with no job yet (a dry run's) */
    *t = (owner_tab){.name = calloc(cap, sizeof *t->name), .running = calloc(cap, sizeof *t->running),
                     .devices = calloc(cap, sizeof *t->devices), .last = calloc(cap, sizeof *t->last)};
    if (t->name == NULL || t->running == NULL || t->devices == NULL || t->last == NULL) {
        owner_tab_free(t);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        const job *j = m->jobs[i];
        int u = owner_index(t, j->owner);
        uint64_t started = j->started_at > 0 ? (uint64_t)(j->started_at * 1e6) : 0;
        if (started > t->last[u])
            t->last[u] = started;
        if (j->tr != NULL) { /* holds its devices until its workers end */
            t->running[u]++;
            t->devices[u] += j->ndev;
        }
    }
    return 0;
}

/* The queued jobs as scheduler requests, with their owners; how many. */
static size_t queue_fill(jobs_mgr *m, owner_tab *ot, sched_req *q)
{
    size_t k = 0;
    for (size_t i = 0; i < m->njobs; i++) {
        job *j = m->jobs[i];
        if (j->state != JOB_QUEUED)
            continue;
        int u = owner_index(ot, j->owner);
        q[k++] = (sched_req){.want = j->spec.devices, .prio = j->spec.priority, .submit = j->submit_seq,
                             .job = j, .user = u, .user_last = ot->last[u]};
    }
    return k;
}

static void owner_limits(const jobs_mgr *m, owner_tab *t, sched_limits *lim)
{
    *lim = (sched_limits){.max_running = m->conf->user_max_running, .max_devices = m->conf->user_max_devices,
                          .nusers = t->n, .running = t->running, .devices = t->devices};
}

void jobs_schedule(jobs_mgr *m)
{
    if (m->draining)
        return;
    size_t nq = 0;
    for (size_t i = 0; i < m->njobs; i++)
        nq += m->jobs[i]->state == JOB_QUEUED;
    if (nq == 0)
        return;
    sched_req *q = calloc(nq, sizeof *q);
    owner_tab ot;
    if (q == NULL || owner_tab_build(m, &ot) != 0) {
        free(q);
        acc_log(ACC_LOG_ERROR, "sched", "out of memory planning %zu jobs", nq);
        return;
    }
    queue_fill(m, &ot, q);
    sched_dev sd[KERN_MAX_DEVICES];
    sched_devs(m, sd);
    sched_limits lim;
    owner_limits(m, &ot, &lim);
    sched_plan_users(sd, m->ndev, q, (int)nq, &lim);
    for (size_t i = 0; i < nq; i++)
        if (q[i].start)
            start_job(m, q[i].job, &q[i]);
    owner_tab_free(&ot);
    free(q);
}

int jobs_cancel(jobs_mgr *m, job *j, acc_err *err)
{
    if (job_state_final(j->state))
        return acc_err_set(err, ACC_ESTATE, NULL, "job %s is already %s", j->id, job_state_name(j->state));
    if (j->state == JOB_QUEUED) {
        finish(j, JOB_CANCELLED, NULL, "cancelled while queued");
        jobs_schedule(m); /* a backfill may have been waiting on it */
        return 0;
    }
    if (!j->cancel_requested) {
        j->cancel_requested = true;
        emit(j, "log", json_pack("{s:s}", "message", "cancel requested; stopping at the next micro-step"), false);
        trainer_cancel(j->tr);
    }
    return 0;
}

static json_t *mem_array(const uint64_t *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; a != NULL && i < n; i++)
        json_array_append_new(a, json_integer((json_int_t)v[i]));
    return a;
}

static void apply_step(jobs_mgr *m, job *j, const train_event *ev)
{
    uint64_t tokens = (uint64_t)j->spec.train_batch_size * (uint64_t)j->spec.model.seq_len;
    job_metric mt = {.step = ev->step, .time = job_now(), .loss = ev->loss, .lr = ev->lr, .grad_norm = ev->grad_norm,
                     .tokens_per_s = ev->tokens_per_s, .micro_batch = ev->micro_batch,
                     .accum_steps = ev->accum_steps};
    int nr = ev->nranks < j->ndev ? ev->nranks : j->ndev;
    for (int r = 0; r < nr; r++) {
        int d = j->dev_idx[r];
        m->dev_mem_in_use[d] = ev->mem_in_use[r];
        m->dev_mem_reserved[d] = ev->mem_reserved[r];
        m->dev_mem_free[d] = ev->mem_free[r];
        if (ev->mem_peak[r] > m->dev_mem_peak[d])
            m->dev_mem_peak[d] = ev->mem_peak[r];
        if (ev->mem_peak[r] > mt.mem_peak)
            mt.mem_peak = ev->mem_peak[r];
    }
    j->step = ev->step;
    j->last_loss = ev->loss;
    j->have_loss = true;
    if (ev->micro_batch > 0) {
        j->cur_micro = ev->micro_batch;
        j->cur_accum = ev->accum_steps;
    }
    j->tokens += tokens;
    m->tokens_total += tokens;
    m->steps_total++;
    acc_err err = {0};
    if (job_add_metric(j, &mt, &err) != 0)
        acc_log(ACC_LOG_WARN, "jobs", "job %s: %s", j->id, err.msg);
    json_t *loss = isfinite(ev->loss) ? json_real(ev->loss) : json_null();
    emit(j, "step",
         json_pack("{s:i, s:o, s:f, s:f, s:f, s:i, s:i, s:o, s:o, s:o, s:o}", "step", ev->step, "loss", loss,
                   "lr", ev->lr, "grad_norm", isfinite(ev->grad_norm) ? ev->grad_norm : -1.0, "tokens_per_s",
                   ev->tokens_per_s, "micro_batch", ev->micro_batch, "accum_steps", ev->accum_steps,
                   "mem_in_use", mem_array(ev->mem_in_use, nr), "mem_peak", mem_array(ev->mem_peak, nr),
                   "mem_reserved", mem_array(ev->mem_reserved, nr), "mem_free", mem_array(ev->mem_free, nr)),
         false);
}

/* The trainer changed the job's (micro, accum) split: after an OOM, or
 * upward under "auto". The new split is persisted with the status. */
static void apply_split_change(job *j, const train_event *ev, const char *type, const char *bytes_key,
                               const char *room_key)
{
    j->cur_micro = ev->to_micro;
    j->cur_accum = ev->to_accum;
    emit(j, type,
         json_pack("{s:i, s:{s:i, s:i}, s:{s:i, s:i}, s:b, s:I, s:I}", "step", ev->step, "from", "micro_batch",
                   ev->from_micro, "accum_steps", ev->from_accum, "to", "micro_batch", ev->to_micro, "accum_steps",
                   ev->to_accum, "recompute", ev->recompute, bytes_key, (json_int_t)ev->bytes_asked, room_key,
                   (json_int_t)ev->bytes_free),
         true);
    save_status(j);
}

static void apply_done(jobs_mgr *m, job *j, const train_event *ev)
{
    trainer_free(j->tr);
    j->tr = NULL;
    release_devices(m, j);
    if (j->stop_for_shutdown) {
        /* stays "running" on disk: the next start requeues it */
        emit(j, "log", json_pack("{s:s}", "message", "stopped by daemon shutdown after a checkpoint; resumes at the next start"), true);
        return;
    }
    if (ev->status == 0)
        finish(j, JOB_SUCCEEDED, NULL, ev->msg[0] ? ev->msg : NULL);
    else if (ev->status == ACC_ECANCELLED)
        finish(j, JOB_CANCELLED, NULL, j->cancel_requested ? "cancelled while running" : ev->msg);
    else
        finish(j, JOB_FAILED, acc_err_name(ev->status), ev->msg[0] ? ev->msg : acc_err_name(ev->status));
}

static void apply_event(jobs_mgr *m, job *j, const train_event *ev)
{
    switch (ev->kind) {
    case TEV_STEP:
        apply_step(m, j, ev);
        break;
    case TEV_EVAL:
        emit(j, "eval", json_pack("{s:i, s:f}", "step", ev->step, "val_loss", ev->val_loss), false);
        break;
    case TEV_OOM_ADJUST:
        m->oom_adjust_total++;
        apply_split_change(j, ev, "oom_adjust", "bytes_asked", "bytes_free");
        break;
    case TEV_SPLIT_UP:
        apply_split_change(j, ev, "split_adjust", "predicted_peak_bytes", "usable_bytes");
        break;
    case TEV_CHECKPOINT:
        emit(j, "checkpoint", json_pack("{s:i, s:s}", "step", ev->step, "path", ev->path), true);
        job_add_output(j, ev->path, m->conf->checkpoint_keep, NULL); /* the job view's outputs */
        break;
    case TEV_LOG:
        if (!strncmp(ev->msg, "resumed from", 12))
            j->step = ev->step; /* the checkpoint's step: the run goes on from there */
        emit(j, "log", json_pack("{s:i, s:s}", "step", ev->step, "message", ev->msg), false);
        break;
    case TEV_DONE:
        apply_done(m, j, ev);
        break;
    }
}

void jobs_drain_events(jobs_mgr *m)
{
    pthread_mutex_lock(&m->qmu);
    jobs_tev *t = m->qhead;
    m->qhead = m->qtail = NULL;
    pthread_mutex_unlock(&m->qmu);
    bool ended = false;
    for (jobs_tev *n; t != NULL; t = n) {
        n = t->next;
        apply_event(m, t->j, &t->ev);
        ended |= t->ev.kind == TEV_DONE;
        free(t);
    }
    if (ended)
        jobs_schedule(m);
}

/* ---- counts, shutdown -------------------------------------------------------- */

int jobs_count_running(const jobs_mgr *m)
{
    int n = 0;
    for (size_t i = 0; i < m->njobs; i++)
        n += m->jobs[i]->tr != NULL;
    return n;
}

void jobs_count_states(const jobs_mgr *m, int counts[JOB_NSTATES])
{
    memset(counts, 0, sizeof(int) * JOB_NSTATES);
    for (size_t i = 0; i < m->njobs; i++)
        counts[m->jobs[i]->state]++;
}

int jobs_shutdown(jobs_mgr *m)
{
    m->draining = true;
    for (size_t i = 0; i < m->njobs; i++) {
        job *j = m->jobs[i];
        if (j->tr == NULL)
            continue;
        j->stop_for_shutdown = true;
        trainer_preempt(j->tr); /* checkpoint, then stop */
    }
    return jobs_count_running(m);
}

void jobs_flush(jobs_mgr *m)
{
    for (size_t i = 0; i < m->njobs; i++)
        if (m->jobs[i]->ev_fd >= 0 && fdatasync(m->jobs[i]->ev_fd) != 0)
            acc_log(ACC_LOG_WARN, "store", "job %s: fsync event log: %s", m->jobs[i]->id, strerror(errno));
}

/* ---- reload ------------------------------------------------------------------ */

/* Rebuild the ring and the metrics history from the event log. A torn last
 * line (crash mid-append) does not parse and is skipped. */
static void replay_events(job *j, char *text)
{
    bool first = true;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
        json_t *ev = json_loads(line, 0, NULL);
        json_int_t seq = json_integer_value(json_object_get(ev, "seq"));
        const char *type = json_string_value(json_object_get(ev, "type"));
        if (ev == NULL || seq < (json_int_t)j->ring.next_seq || type == NULL) {
            json_decref(ev);
            continue;
        }
        if (first)
            evring_start_at(&j->ring, (uint64_t)seq);
        first = false;
        if (!strcmp(type, "step")) {
            job_metric mt = {.step = (int)json_integer_value(json_object_get(ev, "step")),
                             .loss = json_number_value(json_object_get(ev, "loss")),
                             .lr = json_number_value(json_object_get(ev, "lr")),
                             .grad_norm = json_number_value(json_object_get(ev, "grad_norm")),
                             .tokens_per_s = json_number_value(json_object_get(ev, "tokens_per_s")),
                             .micro_batch = (int)json_integer_value(json_object_get(ev, "micro_batch")),
                             .accum_steps = (int)json_integer_value(json_object_get(ev, "accum_steps"))};
            if (!strcmp(json_string_value(json_object_get(ev, "job")) ?: "", j->id))
                job_add_metric(j, &mt, NULL);
        }
        /* keep the ring's numbering exact even across skipped lines */
        j->ring.next_seq = (uint64_t)seq;
        evring_push(&j->ring, type, line, strlen(line), NULL, NULL);
        json_decref(ev);
    }
}

/* The config may have changed between runs (fewer devices): a job that
 * can never fit now fails instead of waiting forever. */
static int still_fits(const jobs_mgr *m, const job *j, acc_err *err)
{
    sched_dev sd[KERN_MAX_DEVICES];
    sched_devs(m, sd);
    return sched_can_ever_fit(sd, m->ndev, j->spec.devices, err);
}

static void reload_one(void *ctx, const store_job_files *f)
{
    jobs_mgr *m = ctx;
    acc_err err = {0};
    job *j = job_new(m, &err);
    json_t *st = f->status ? json_loads(f->status, 0, NULL) : NULL;
    if (j == NULL) {
        json_decref(st);
        acc_log(ACC_LOG_ERROR, "store", "job %s not reloaded: %s", f->id, err.msg);
        return;
    }
    snprintf(j->id, sizeof j->id, "%s", f->id);
    j->spec_json = compact_spec(f->spec, f->spec_len);
    int spec_rc = job_spec_parse(f->spec, f->spec_len, m->conf, &j->spec, &err);
    set_output_dir(m, j);
    j->cur_micro = j->spec.micro_batch;
    j->cur_accum = j->spec.accum_steps;
    if (st != NULL)
        job_status_apply(j, st);
    json_decref(st);
    if (j->submit_seq == 0)
        j->submit_seq = strtoull(f->id + 1, NULL, 10);
    if (f->events != NULL)
        replay_events(j, f->events);
    if (j->spec_json == NULL || table_add(m, j, &err) != 0 ||
        store_open_events(&m->st, j->id, &j->ev_fd, &err) != 0)
        acc_log(ACC_LOG_ERROR, "store", "job %s: %s", j->id, err.msg);
    if (j->submit_seq >= m->next_submit)
        m->next_submit = j->submit_seq + 1;
    if (!job_state_final(j->state) && spec_rc == 0)
        spec_rc = still_fits(m, j, &err);
    if (!job_state_final(j->state) && spec_rc != 0) {
        char msg[700];
        snprintf(msg, sizeof msg, "spec no longer valid at restart: %s: %s", err.field, err.msg);
        finish(j, JOB_FAILED, acc_err_name(spec_rc), msg);
    }
}

static int cmp_submit(const void *a, const void *b)
{
    const job *x = *(job *const *)a, *y = *(job *const *)b;
    return x->submit_seq < y->submit_seq ? -1 : x->submit_seq > y->submit_seq;
}

static void requeue_after_restart(job *j)
{
    j->restarts++;
    /* the last progress the event log knows; a resume reports its step */
    if (j->nmetrics > 0) {
        j->step = j->metrics[j->nmetrics - 1].step;
        j->last_loss = j->metrics[j->nmetrics - 1].loss;
        j->have_loss = true;
    }
    j->ndev = 0;
    j->started_at = 0;
    set_state(j, JOB_QUEUED,
              "daemon restarted while the job ran; requeued, it resumes from its last checkpoint (step 0 if it has none)");
}

int jobs_load(jobs_mgr *m, acc_err *err)
{
    int rc = store_load_all(&m->st, reload_one, m, err);
    if (rc != 0)
        return rc;
    if (m->njobs > 1)
        qsort(m->jobs, m->njobs, sizeof *m->jobs, cmp_submit);
    int counts[JOB_NSTATES] = {0};
    for (size_t i = 0; i < m->njobs; i++) {
        job *j = m->jobs[i];
        if (j->state == JOB_RUNNING)
            requeue_after_restart(j);
        if (job_state_final(j->state)) {
            evring_close(&j->ring);
            close_log(j);
        }
        counts[j->state]++;
    }
    if (m->njobs > 0)
        acc_log(ACC_LOG_INFO, "jobs", "reloaded %zu job(s): %d queued, %d succeeded, %d failed, %d cancelled",
                m->njobs, counts[JOB_QUEUED], counts[JOB_SUCCEEDED], counts[JOB_FAILED], counts[JOB_CANCELLED]);
    jobs_schedule(m);
    return 0;
}
