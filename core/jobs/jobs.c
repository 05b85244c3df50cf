/* jobs: the job manager (see jobs.h). */
#include "jobs.h"
#include "genq.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checked.h"
#include "fsutil.h"
#include "job_train_cfg.h"
#include "log.h"
#include "mem_plan.h"
#include "plan_table.h"
#include "safepath.h"
#include "scheduler.h"

struct jobs_tev {
    jobs_tev *next;
    job *j;
    train_event ev;
    bool worker_end;       /* the end of j's worker, in `end` (ev unused) */
    jobs_wend end;
};

const char *const jobs_wfail_names[JOBS_WFAIL_N] = {
    [JOBS_WFAIL_SIGNAL] = "signal", [JOBS_WFAIL_EXIT] = "exit", [JOBS_WFAIL_HEARTBEAT] = "heartbeat",
    [JOBS_WFAIL_PROTOCOL] = "protocol", [JOBS_WFAIL_START] = "start",
};

bool jobs_job_active(const job *j) { return j->tr != NULL || j->worker != NULL; }

/* ---- events: ring + store ----------------------------------------------------- */

/* The ring is allocated with the first event (a final job loaded at start
 * has none in memory until jobs_hydrate). */
static int ring_ready(job *j, acc_err *err)
{
    if (j->ring.slots != NULL)
        return 0;
    uint64_t next = j->ring.next_seq;
    bool closed = j->ring.closed;
    int rc = evring_init(&j->ring, j->mgr->conf->event_ring, err);
    snprintf(j->ring.job, sizeof j->ring.job, "%s", j->id);
    if (rc == 0 && next > 1)
        evring_start_at(&j->ring, next);
    j->ring.closed = closed;
    return rc;
}

/* Stamp `ev` with seq/type/time/job: one compact JSON line. Takes `ev`. */
static char *event_text(job *j, const char *type, json_t *ev, uint64_t seq, double now)
{
    if (ev == NULL)
        return NULL;
    json_t *o = json_pack("{s:I, s:s, s:o, s:s}", "seq", (json_int_t)seq, "type", type, "time", job_time_json(now),
                          "job", j->id);
    char *text = NULL;
    if (o != NULL && json_object_update(o, ev) == 0)
        text = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(10));
    json_decref(o);
    json_decref(ev);
    return text;
}

typedef struct ev_batch {
    int n;
    const char *type[2];
    char *text[2];
    store_event se[2];
} ev_batch;

/* Add an event to a batch of at most 2, numbered after the ring. */
static int batch_add(job *j, ev_batch *b, const char *type, json_t *ev, double now)
{
    uint64_t seq = j->ring.next_seq + (uint64_t)b->n;
    char *text = event_text(j, type, ev, seq, now);
    if (text == NULL) {
        acc_log(ACC_LOG_ERROR, "jobs", "job %s: out of memory building a %s event", j->id, type);
        return ACC_ENOMEM;
    }
    b->type[b->n] = type;
    b->text[b->n] = text;
    b->se[b->n] = (store_event){.seq = seq, .type = type, .time = now, .json = text, .len = strlen(text)};
    b->n++;
    return 0;
}

/* Into the ring (the stored events or, for those the store missed, the
 * watchers still see them), and the views are stale. */
static void batch_push(job *j, ev_batch *b)
{
    acc_err err = {0};
    job_view_invalidate(j);
    for (int i = 0; i < b->n; i++)
        if (ring_ready(j, &err) != 0 || evring_push(&j->ring, b->type[i], b->text[i], b->se[i].len, NULL, &err) != 0)
            acc_log(ACC_LOG_ERROR, "jobs", "job %s: %s", j->id, err.msg);
}

static void batch_free(ev_batch *b)
{
    for (int i = 0; i < b->n; i++)
        free(b->text[i]);
    b->n = 0;
}

static void log_store_error(const job *j, const char *what, const acc_err *err)
{
    acc_log(ACC_LOG_ERROR, "store", "job %s: %s not stored: %s", j->id, what, err->msg);
}

/* An event that is not a state change: stored (with the step's metrics row
 * when given), then shown. While the store is failing, step events are not
 * tried (the next checkpoint makes them replayable); others are. */
static void emit_metric(job *j, const char *type, json_t *ev, bool sync, const store_metric *metric)
{
    ev_batch b = {0};
    if (batch_add(j, &b, type, ev, job_now()) != 0)
        return;
    store *st = &j->mgr->st;
    acc_err err = {0};
    if (!(st->failing && !sync) && !st->degraded &&
        store_append_events(st, j->id, b.se, 1, metric, sync, &err) != 0)
        log_store_error(j, type, &err);
    batch_push(j, &b);
    batch_free(&b);
}

static void emit(job *j, const char *type, json_t *ev, bool sync) { emit_metric(j, type, ev, sync, NULL); }

/* The status with its events in one transaction. On failure nothing is
 * shown and the caller restores what it changed. */
static int commit_status(job *j, ev_batch *b, acc_err *err)
{
    json_t *st = job_status_json(j);
    char *status = st ? json_dumps(st, JSON_COMPACT) : NULL;
    json_decref(st);
    int rc = status ? store_save_status(&j->mgr->st, j->id, job_state_name(j->state), status, b->se, b->n, err)
                    : acc_err_set(err, ACC_ENOMEM, NULL, "out of memory for the status of job %s", j->id);
    free(status);
    if (rc == 0)
        batch_push(j, b);
    job_view_invalidate(j);
    return rc;
}

/* A state change, with a done event when `done` (a final state): persisted,
 * then shown. Returns non-zero, the job unchanged, when the store cannot. */
static int set_state_done(job *j, job_state to, const char *msg, bool done)
{
    job_state from = j->state;
    double finished = j->finished_at;
    double now = job_now();
    j->state = to;
    if (job_state_final(to))
        j->finished_at = now;
    ev_batch b = {0};
    acc_err err = {0};
    int rc = batch_add(j, &b, "state",
                       json_pack("{s:s, s:s, s:s?}", "state", job_state_name(to), "from", job_state_name(from),
                                 "message", msg),
                       now);
    if (rc == 0 && done)
        rc = batch_add(j, &b, "done", json_pack("{s:s, s:i, s:s?}", "state", job_state_name(to), "step", j->step,
                                                "message", msg),
                       now);
    if (rc == 0)
        rc = commit_status(j, &b, &err);
    else
        acc_err_set(&err, rc, NULL, "out of memory");
    batch_free(&b);
    if (rc != 0) {
        j->state = from;
        j->finished_at = finished;
        job_view_invalidate(j);
        acc_log(ACC_LOG_ERROR, "store", "job %s: %s -> %s not stored, the job stays %s: %s", j->id,
                job_state_name(from), job_state_name(to), job_state_name(from), err.msg);
        return rc;
    }
    acc_log(ACC_LOG_INFO, "jobs", "job %s: %s -> %s%s%s", j->id, job_state_name(from), job_state_name(to),
            msg ? ": " : "", msg ? msg : "");
    return 0;
}

static int set_state(job *j, job_state to, const char *msg) { return set_state_done(j, to, msg, false); }

/* The end of a run: state and done events in one commit, watchers finish.
 * Non-zero (nothing changed) when the store cannot write it. */
static int finish(job *j, job_state to, const char *code, const char *msg)
{
    char old_code[sizeof j->err_code], old_msg[sizeof j->err_msg];
    memcpy(old_code, j->err_code, sizeof old_code);
    memcpy(old_msg, j->err_msg, sizeof old_msg);
    if (code != NULL) {
        snprintf(j->err_code, sizeof j->err_code, "%s", code);
        snprintf(j->err_msg, sizeof j->err_msg, "%s", msg ? msg : "");
    }
    int rc = set_state_done(j, to, msg, true);
    if (rc != 0) {
        memcpy(j->err_code, old_code, sizeof old_code);
        memcpy(j->err_msg, old_msg, sizeof old_msg);
        return rc;
    }
    evring_close(&j->ring);
    return 0;
}

/* A change the daemon must not lose (the trainer's outcome, a requeue):
 * when the store cannot write it now, it waits for jobs_retry_store. */
static void keep_pending(job *j, job_state to, const char *code, const char *msg, bool done)
{
    if (!j->pending.on)
        j->mgr->npending++;
    j->pending.on = true;
    j->pending.done = done;
    j->pending.to = to;
    snprintf(j->pending.code, sizeof j->pending.code, "%s", code ? code : "");
    snprintf(j->pending.msg, sizeof j->pending.msg, "%.500s", msg ? msg : "");
}

static void finish_or_retry(job *j, job_state to, const char *code, const char *msg)
{
    if (finish(j, to, code, msg) != 0)
        keep_pending(j, to, code, msg, true);
}

/* Retry one waiting change; true when it is stored now. */
static bool retry_pending(job *j)
{
    const char *code = j->pending.code[0] ? j->pending.code : NULL;
    const char *msg = j->pending.msg[0] ? j->pending.msg : NULL;
    int rc = j->pending.done ? finish(j, j->pending.to, code, msg) : set_state(j, j->pending.to, msg);
    if (rc != 0)
        return false;
    j->pending.on = false;
    j->mgr->npending--;
    return true;
}

/* ---- the table ------------------------------------------------------------ */

static job *job_new(jobs_mgr *m, acc_err *err)
{
    job *j = calloc(1, sizeof *j);
    if (j == NULL) {
        acc_err_set(err, ACC_ENOMEM, NULL, "out of memory for a job");
        return NULL;
    }
    j->mgr = m;
    j->crash_step = -1;
    j->ring.next_seq = 1; /* the slots come with the first event (ring_ready) */
    return j;
}

static void job_delete(job *j)
{
    evring_free(&j->ring);
    free(j->record_devices);
    job_view_invalidate(j);
    free(j->metrics);
    job_free_outputs(j);
    free(j->spec_json);
    free(j);
}

static size_t id_hash(const char *id)
{
    size_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *id; id++)
        h = (h ^ (unsigned char)*id) * 1099511628211ull;
    return h;
}

static void index_put(job **index, size_t cap, job *j)
{
    size_t i = id_hash(j->id) & (cap - 1);
    while (index[i] != NULL)
        i = (i + 1) & (cap - 1);
    index[i] = j;
}

/* Room for one more job in the table and in the index (kept under half full). */
static int table_reserve(jobs_mgr *m, acc_err *err)
{
    if (m->njobs == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 64;
        job **nj = realloc(m->jobs, cap * sizeof *nj);
        if (nj == NULL)
            return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory for the job table");
        m->jobs = nj;
        m->cap = cap;
    }
    if ((m->njobs + 1) * 2 > m->index_cap) {
        size_t cap = m->index_cap ? m->index_cap * 2 : 128;
        job **ix = calloc(cap, sizeof *ix);
        if (ix == NULL)
            return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory for the job index");
        for (size_t i = 0; i < m->njobs; i++)
            index_put(ix, cap, m->jobs[i]);
        free(m->index);
        m->index = ix;
        m->index_cap = cap;
    }
    return 0;
}

static int table_add(jobs_mgr *m, job *j, acc_err *err)
{
    int rc = table_reserve(m, err);
    if (rc != 0)
        return rc;
    j->table_idx = m->njobs;
    m->jobs[m->njobs++] = j;
    index_put(m->index, m->index_cap, j);
    return 0;
}

job *jobs_find(jobs_mgr *m, const char *id)
{
    if (m->index_cap == 0)
        return NULL;
    for (size_t i = id_hash(id) & (m->index_cap - 1); m->index[i] != NULL; i = (i + 1) & (m->index_cap - 1))
        if (!strcmp(m->index[i]->id, id))
            return m->index[i];
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
    int rc = store_init(&m->st, conf->state_dir, conf->history_keep, err);
    if (rc != 0)
        return rc;
    if ((rc = pthread_mutex_init(&m->qmu, NULL)) != 0) {
        store_close(&m->st);
        return acc_err_set(err, ACC_EINTERNAL, NULL, "mutex: %s", strerror(rc));
    }
    m->qmu_on = true;
    return 0;
}

void jobs_free(jobs_mgr *m)
{
    for (size_t i = 0; i < m->njobs; i++) {
        job *j = m->jobs[i];
        if (jobs_job_active(j)) /* its threads or worker may still touch it: leave it */
            continue;
        job_delete(j);
    }
    free(m->jobs);
    free(m->index);
    m->jobs = m->index = NULL;
    m->njobs = m->index_cap = 0;
    store_close(&m->st);
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
        /* a device lent to a generate request (genq.h) is busy until its worker ended */
        sd[i] = (sched_dev){.kind = m->devs[i].kind, .busy = h != NULL || m->dev_lent[i], .holder_prio = h ? h->spec.priority : 0,
                            .holder_submit = h ? h->submit_seq : 0};
    }
}

/* The smallest device budget (the planner's fit for a dry run). */
static uint64_t min_budget(const jobs_mgr *m)
{
    uint64_t budget = 0;
    for (int i = 0; i < m->ndev; i++)
        if (budget == 0 || m->devs[i].mem_total < budget)
            budget = m->devs[i].mem_total;
    return budget;
}

/* The planner's table for a dry run: each candidate micro batch with its
 * predicted peak per device and whether it fits the smallest budget of the
 * devices of that kind (less the planner's margin). */
static json_t *plan_json(const train_cfg *s, kern_dev_kind kind, uint64_t budget, uint64_t host_memory,
                         uint64_t *peak_out, int *micro_out)
{
    plan_row *rows = calloc(PLAN_MAX_ROWS, sizeof *rows);
    json_t *arr = json_array();
    int n = 0, chosen = -1;
    acc_err err = {0};
    *peak_out = 0;
    *micro_out = s->micro_batch;
    if (rows == NULL || arr == NULL ||
        plan_candidates_hw(s, kind, budget, host_memory, rows, PLAN_MAX_ROWS, &n, &chosen, &err) != 0) {
        free(rows);
        json_decref(arr);
        return json_null();
    }
    /* the split this job would start with (one rule,
     * plan_start_row, as the trainer's start_where_fits) */
    int start = plan_start_row(s, rows, n, chosen);
    plan_hw hw = {.kind = kind, .device_memory = budget, .devices = s->devices, .host_memory = host_memory};
    for (int i = 0; i < n; i++) {
        const plan_row *r = &rows[i];
        /* the plan's row view, and its peak under the dry run's older name */
        plan_variant v = {.lora = s->lora.r > 0, .zero_stage = s->zero_stage, .recompute = r->recompute,
                          .act_offload = r->recompute && s->activation_offload,
                          .offload_optimizer = s->offload_optimizer, .offload_param = s->offload_param};
        json_t *row = plan_row_json(r, &v, &hw);
        if (row != NULL)
            json_object_set_new(row, "predicted_peak_bytes", json_integer(plan_bytes_json(r->peak_bytes)));
        json_array_append_new(arr, row);
        if (i == start) {
            *peak_out = r->peak_bytes;
            *micro_out = r->micro_batch;
        }
    }
    char note[768];
    plan_start_note(s, rows, n, chosen, budget, note, sizeof note);
    free(rows);
    /* the candidates and what the dry run says of the given micro batch */
    return json_pack("{s:o, s:o}", "candidates", arr, "note", note[0] ? json_string(note) : json_null());
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
static void host_limits(const jobs_mgr *m, sched_limits *lim);
static uint64_t host_reserved(const jobs_mgr *m);

/* Would a job of `owner` with spec `s` start now? The scheduler's own
 * answer: every queued job and this one planned on the devices as they
 * are, with the owners' shares. *before: the queued jobs ahead of it in
 * run order that are not held back by their owner's limits. */
static int plan_with_queue(jobs_mgr *m, const job_spec *s, const char *owner, uint64_t host_bytes, sched_req *out,
                           int *before)
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
                       .user_last = ot.last[u], .host_bytes = host_bytes};
    sched_dev sd[KERN_MAX_DEVICES];
    sched_devs(m, sd);
    sched_limits lim;
    owner_limits(m, &ot, &lim);
    host_limits(m, &lim);
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

/* The dry run's answer: the planner's table (computed off the loop thread
 * by jobs_check_submission) and where the job would go now. */
/* h-dsconf: the spec's names as resolved (hub names, the DeepSpeed file,
 * the default seq_len) and the keys it gives that mean nothing here. */
static json_t *resolved_json(const job_spec *s)
{
    json_t *ign = json_array(), *o;
    char buf[sizeof s->ignored];
    snprintf(buf, sizeof buf, "%s", s->ignored);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); ign && t; t = strtok_r(NULL, ",", &save))
        json_array_append_new(ign, json_string(t + (t[0] == ' ')));
    o = json_pack("{s:s, s:s?, s:i, s:b, s:s, s:s?, s:s?, s:i, s:s?, s:o}", "model_from", s->model.from,
                  "hub_model", s->model.hub_repo[0] ? s->model.hub_repo : NULL, "seq_len", s->model.seq_len,
                  "seq_len_default", s->model.seq_len_default, "data_train", s->data.train, "dataset",
                  s->data.dataset[0] ? s->data.dataset : NULL, "split", s->data.dataset[0] ? s->data.split : NULL,
                  "dataset_files", s->data.dataset_files, "deepspeed_file",
                  s->deepspeed_file[0] ? s->deepspeed_file : NULL, "ignored_keys", ign ? ign : json_array());
    return o ? o : json_object();
}

static json_t *dry_run_plan(jobs_mgr *m, const job_spec *s, const char *owner, json_t *cands, uint64_t peak,
                            int micro, uint64_t host_per_rank, uint64_t host_job)
{
    sched_req r = {0};
    int queued_before;
    if (plan_with_queue(m, s, owner, host_job, &r, &queued_before) != 0) {
        json_decref(cands);
        return NULL;
    }
    uint64_t budget = min_budget(m);
    json_t *devs = json_array(), *mem = json_array();
    for (int i = 0; i < s->devices; i++) {
        if (r.start)
            json_array_append_new(devs, json_string(m->devs[r.placed[i]].name));
        json_array_append_new(mem, json_integer(plan_bytes_json(peak)));
    }
    int per_rank = s->train_batch_size / (s->devices > 0 ? s->devices : 1);
    json_t *note = json_incref(json_object_get(cands, "note")); /* plan_json's pair */
    json_t *list = json_incref(json_object_get(cands, "candidates"));
    json_decref(cands);
    cands = list ? list : json_null();
    json_t *plan = json_pack("{s:b, s:{s:i, s:i, s:i, s:i, s:b}, s:s, s:{s:b, s:o, s:s, s:i}, s:o, s:I, s:o}", "dry_run", 1,
                     "batch", "train_batch_size", s->train_batch_size, "micro_batch", micro, "accum_steps",
                     micro > 0 ? per_rank / micro : 0, "world", s->devices, "micro_auto", s->micro_auto,
                     "precision", spec_precision_name(s->precision), "placement", "starts_now", r.start, "devices", devs, "kind",
                     kern_dev_kind_name(m->ndev > 0 ? m->devs[0].kind : KERN_DEV_CPU), "queued_before",
                     queued_before, "predicted_peak_memory_bytes", mem, "device_memory_bytes", (json_int_t)budget,
                     "micro_batch_candidates", cands);
    /* h-parquet: the data format, and whether it was read off the data */
    static const char *const fmt_names[] = {"text", "tokens", "chat", "prompt_completion", "text_jsonl", "text_lines"};
    if (plan != NULL && (unsigned)s->data.format < sizeof fmt_names / sizeof fmt_names[0])
        json_object_set_new(plan, "data", json_pack("{s:s, s:b}", "format", fmt_names[s->data.format], "format_inferred",
                                                     s->data.format_inferred));
    json_t *pl = json_object_get(plan, "placement");
    if (pl != NULL) /* it would wait for its owner's share (user_max_*) */
        json_object_set_new(pl, "over_user_limit", json_boolean(r.over_share));
    if (pl != NULL) /* or for host memory */
        json_object_set_new(pl, "waits_for_host_memory", json_boolean(r.host_wait));
    if (plan != NULL) { /* what it reserves of the host memory jobs may hold */
        uint64_t limit = m->conf->host_memory, held = host_reserved(m);
        json_object_set_new(plan, "host_memory",
                            json_pack("{s:I, s:I, s:i, s:I, s:I, s:b}", "per_rank_bytes", (json_int_t)host_per_rank,
                                      "job_bytes", (json_int_t)host_job, "ranks", s->devices, "host_memory_bytes",
                                      (json_int_t)limit, "free_bytes", (json_int_t)(held < limit ? limit - held : 0),
                                      "fits", limit == 0 || host_job <= limit));
    }
    if (plan != NULL) /* h-dsconf: what the spec resolved to, what it ignores */
        json_object_set_new(plan, "resolved", resolved_json(s));
    if (plan != NULL) /* the given micro batch does not fit: what the daemon does */
        json_object_set_new(plan, "micro_batch_note", note ? note : json_null());
    else
        json_decref(note);
    return plan;
}

/* A spec that no device of this machine can ever hold is refused at
 * submit (docs/api.md): the planner's smallest peak over the splits the
 * job may run with (the given micro batch only, without oom.adapt) against
 * the largest device. Reads only the immutable device table. */
static int check_fits_a_device(const jobs_mgr *m, const train_cfg *s, acc_err *err)
{
    uint64_t budget = 0;
    for (int i = 0; i < m->ndev; i++)
        if (m->devs[i].mem_total > budget)
            budget = m->devs[i].mem_total;
    if (m->ndev == 0 || budget == 0)
        return 0;
    plan_row *rows = calloc(PLAN_MAX_ROWS, sizeof *rows);
    if (rows == NULL)
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    int n = 0, chosen = -1;
    int rc = plan_candidates_on(s, m->devs[0].kind, budget, rows, PLAN_MAX_ROWS, &n, &chosen, err);
    uint64_t least = UINT64_MAX, state = 0;
    for (int i = 0; rc == 0 && i < n; i++) {
        bool allowed = s->micro_auto || s->oom_adapt ||
                       (rows[i].micro_batch == s->micro_batch && rows[i].recompute == s->activation_checkpointing);
        state = rows[i].state_bytes;
        if (allowed && rows[i].peak_bytes < least)
            least = rows[i].peak_bytes;
    }
    free(rows);
    if (rc != 0 || n == 0 || least <= budget)
        return rc;
    if (state > budget)
        return acc_err_set(err, ACC_EINVAL, "model",
                           "the model's parameters, gradients and AdamW state need %llu bytes per device; the "
                           "largest device here has %llu bytes: this job can never run",
                           (unsigned long long)state, (unsigned long long)budget);
    return acc_err_set(err, ACC_EINVAL, "train_micro_batch_size_per_gpu",
                       "the smallest split this job may run with needs %llu bytes per device; the largest device "
                       "here has %llu bytes: this job can never run%s",
                       (unsigned long long)least, (unsigned long long)budget,
                       s->oom_adapt ? "" : " (oom.adapt is off)");
}

/* ---- host memory (config host_memory) -------------------------------------- */

/* The job's host bytes where it starts: its ranks on this host (the spec's
 * devices) x a rank's (plan_job_host_bytes; `ranks` is the spec as each
 * rank sees it), and the refusal of a job that alone needs more than
 * host_memory (it could never run). Reads the model's config: off the
 * loop thread, or at start-up. */
static int host_need(const jobs_mgr *m, const job_spec *s, const train_cfg *ranks, uint64_t *per_rank,
                     uint64_t *need, acc_err *err)
{
    kern_dev_kind kind = m->ndev > 0 ? m->devs[0].kind : KERN_DEV_CPU;
    int rc = plan_job_host_bytes(ranks, kind, min_budget(m), s->devices, per_rank, need, err);
    if (rc != 0)
        return rc;
    uint64_t limit = m->conf->host_memory;
    if (limit != 0 && *need > limit)
        return acc_err_set(err, ACC_EINVAL, "host_memory",
                           "the job needs %llu bytes of host memory (%d rank(s) x %llu bytes: its batch buffers of "
                           "%d x %d tokens and any offloaded state), more than the %llu bytes of host memory this "
                           "daemon gives jobs (host_memory): this job can never run",
                           (unsigned long long)*need, s->devices, (unsigned long long)*per_rank,
                           ranks->train_batch_size / (ranks->devices > 0 ? ranks->devices : 1), ranks->model.seq_len,
                           (unsigned long long)limit);
    return 0;
}

/* The host memory held by the jobs running now (their reservations). */
static uint64_t host_reserved(const jobs_mgr *m)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < m->njobs; i++)
        if (jobs_job_active(m->jobs[i]))
            sum = acc_sat_add_u64(sum, m->jobs[i]->host_bytes);
    return sum;
}

uint64_t jobs_host_reserved(const jobs_mgr *m) { return host_reserved(m); }

/* The scheduler's host-memory limit: host_memory less what runs. */
static void host_limits(const jobs_mgr *m, sched_limits *lim)
{
    uint64_t limit = m->conf->host_memory, held = host_reserved(m);
    lim->host_on = limit != 0;
    lim->host_free = held < limit ? limit - held : 0;
}

/* A queued job that waits for host memory says so once, in its view and a
 * log event; the flag drops when it no longer waits for it. */
static void note_host_wait(jobs_mgr *m, job *j, bool waiting)
{
    if (!waiting) {
        if (j->host_waiting) {
            j->host_waiting = false;
            job_view_invalidate(j);
        }
        return;
    }
    if (j->host_waiting)
        return;
    uint64_t limit = m->conf->host_memory, held = host_reserved(m);
    j->host_waiting = true;
    snprintf(j->host_wait_msg, sizeof j->host_wait_msg,
             "waiting for host memory: needs %llu bytes, %llu of host_memory %llu bytes are free",
             (unsigned long long)j->host_bytes, (unsigned long long)(held < limit ? limit - held : 0),
             (unsigned long long)limit);
    job_view_invalidate(j);
    emit(j, "log", json_pack("{s:i, s:s}", "step", j->step, "message", j->host_wait_msg), false);
}

/* A job over several servers runs as rank processes from a worker. */
static int check_nodes(const jobs_mgr *m, const job_spec *s, acc_err *err)
{
    if (s->nodes > 1 && !m->conf->worker_processes)
        return acc_err_set(err, ACC_EINVAL, "nodes", "nodes %d: jobs over several servers need worker_processes = true",
                           s->nodes);
    return 0;
}

/* A job asking for more devices than one user may hold can never start. */
static int check_user_devices(const jobs_mgr *m, const job_spec *s, acc_err *err)
{
    if (m->conf->user_max_devices > 0 && s->devices > m->conf->user_max_devices)
        return acc_err_set(err, ACC_EINVAL, "devices",
                           "devices %d can never be placed: over user_max_devices %d (devices one user may hold at once)",
                           s->devices, m->conf->user_max_devices);
    return 0;
}

jobs_checked *jobs_check_submission(const jobs_mgr *m, const char *text, size_t len, bool dry_run)
{
    jobs_checked *c = calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    c->dry_run = dry_run;
    c->spec = malloc(sizeof *c->spec);
    c->text = malloc(len + 1);
    if (c->spec == NULL || c->text == NULL) {
        c->rc = acc_err_set(&c->err, ACC_ENOMEM, NULL, "out of memory");
        return c;
    }
    memcpy(c->text, text, len);
    c->text[len] = '\0';
    c->len = len;
    job_spec *s = c->spec;
    /* parse, paths under the roots, data and init files, resume checkpoint,
     * fit: everything that can be refused before a job exists */
    if ((c->rc = job_spec_parse(text, len, m->conf, s, &c->err)) == 0 &&
        (c->rc = check_user_devices(m, s, &c->err)) == 0)
        c->rc = check_nodes(m, s, &c->err);
    /* the trainer and the planner see the job as each rank does: all its
     * ranks over its nodes (accumd-rank sets the same world) */
    train_cfg *ranks = c->rc == 0 ? malloc(sizeof *ranks) : NULL;
    if (c->rc == 0 && ranks == NULL)
        c->rc = acc_err_set(&c->err, ACC_ENOMEM, NULL, "out of memory");
    if (c->rc == 0) {
        job_spec_train_cfg(s, ranks);
        ranks->devices = s->devices * s->nodes;
        ranks->nodes = 1;
    }
    if (c->rc == 0 && (c->rc = trainer_check_spec(ranks, &c->err)) == 0)
        c->rc = check_fits_a_device(m, ranks, &c->err);
    if (c->rc == 0)
        c->rc = host_need(m, s, ranks, &c->host_per_rank, &c->host_job, &c->err);
    if (c->rc == 0 && dry_run) {
        kern_dev_kind kind = m->ndev > 0 ? m->devs[0].kind : KERN_DEV_CPU; /* all of one kind */
        c->cands = plan_json(ranks, kind, min_budget(m), m->conf->host_memory, &c->peak, &c->micro);
    }
    free(ranks);
    return c;
}

void jobs_checked_free(jobs_checked *c)
{
    if (c == NULL)
        return;
    json_decref(c->cands);
    free(c->spec);
    free(c->text);
    free(c);
}

/* output_root/<id>; conf keeps output_root well under PATH_MAX. */
static void set_output_dir(const jobs_mgr *m, job *j)
{
    int w = snprintf(j->spec.output_dir, sizeof j->spec.output_dir, "%s/%s", m->conf->output_root, j->id);
    if (w < 0 || (size_t)w >= sizeof j->spec.output_dir)
        acc_log(ACC_LOG_WARN, "jobs", "job %s: output_root too long, output dir truncated", j->id);
    /* prepared JSONL data, shared by jobs (data_prep.h); "" = no cache */
    w = snprintf(j->spec.data.cache_dir, sizeof j->spec.data.cache_dir, "%s/cache", m->conf->state_dir);
    if (w < 0 || (size_t)w >= sizeof j->spec.data.cache_dir)
        j->spec.data.cache_dir[0] = '\0';
}

/* Where the final export goes: the spec's
 * output_dir in its owner's area, output_root/<owner>/<output_dir> (an
 * owner name that is no plain path component, or none: "_"), else
 * output_root/<id>/export. */
static void set_export_dir(const jobs_mgr *m, job *j)
{
    job_export_dir(j, m->conf->output_root, j->spec.export_dir, sizeof j->spec.export_dir);
}

/* The submitted text, re-encoded compactly (it parsed, so it loads). */
static char *compact_spec(const char *text, size_t len)
{
    json_t *o = json_loadb(text, len, 0, NULL);
    char *out = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(10)) : NULL;
    json_decref(o);
    return out;
}

/* The job's row and its first event ("queued") in one FULL commit: the
 * acknowledgement. Shown only once stored. */
static int persist_new(jobs_mgr *m, job *j, acc_err *err)
{
    json_t *st = job_status_json(j);
    char *status = st ? json_dumps(st, JSON_COMPACT) : NULL;
    json_decref(st);
    ev_batch b = {0};
    if (status == NULL || batch_add(j, &b, "state", json_pack("{s:s}", "state", "queued"), j->submitted_at) != 0) {
        free(status);
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    }
    /* h-dsconf: the keys the spec gives that mean nothing here, in the job's log */
    if (j->spec.ignored[0] != '\0' &&
        batch_add(j, &b, "log", json_pack("{s:i, s:s+}", "step", 0, "message", "ignored (no meaning in accumd): ",
                                          j->spec.ignored), j->submitted_at) != 0) {
        batch_free(&b);
        free(status);
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    }
    store_job_row row = {.id = j->id, .submit_seq = j->submit_seq, .uid = j->spec.job_uid, .owner = j->owner,
                         .state = job_state_name(j->state), .submitted_at = j->submitted_at,
                         .spec = j->spec_json, .status = status};
    int rc = store_create_job(&m->st, &row, b.se, b.n, err);
    if (rc == 0)
        batch_push(j, &b);
    batch_free(&b);
    free(status);
    return rc;
}

/* Submissions wait for a store that writes. */
static int store_writable(const jobs_mgr *m, acc_err *err)
{
    if (m->st.degraded)
        return acc_err_set(err, ACC_EUNAVAIL, NULL, "the job store is read-only, not accepting jobs: %s", m->st.why);
    if (m->st.failing)
        return acc_err_set(err, ACC_EUNAVAIL, NULL, "the job store cannot write, not accepting jobs: %s", m->st.why);
    return 0;
}

/* Claim the next id whose output_root/<id> does not exist, by creating
 * that directory (mkdirat, never through a symlink): ids never repeat over
 * the life of an output root, even with a fresh state_dir, and a planted
 * symlink is an id skipped, never a redirect. */
static int claim_id(jobs_mgr *m, job *j, acc_err *err)
{
    int rfd = open(m->conf->output_root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (rfd < 0)
        return acc_err_set(err, ACC_EIO, "output_root", "output_root %s: %s", m->conf->output_root, strerror(errno));
    int rc = ACC_EIO;
    if (m->st.next_submit > m->next_submit) /* the stored counter: ids never repeat */
        m->next_submit = m->st.next_submit;
    for (int tries = 0; tries < 1000000; tries++, m->next_submit++) {
        j->submit_seq = m->next_submit;
        snprintf(j->id, sizeof j->id, "j%06llu", (unsigned long long)j->submit_seq);
        if (jobs_find(m, j->id) != NULL)
            continue;
        acc_err e = {0};
        rc = sp_mkdirat(rfd, j->id, 1, NULL, &e);
        if (rc == 0)
            break;
        if (rc != ACC_ESTATE) {
            acc_err_set(err, ACC_EIO, NULL, "output_root %s: %s", m->conf->output_root, e.msg);
            break;
        }
        acc_log(ACC_LOG_WARN, "jobs", "id %s skipped: %s/%s exists already (an earlier job's output, or planted)",
                j->id, m->conf->output_root, j->id);
    }
    if (rc == 0 && fsu_fsync_dir(m->conf->output_root, err) != 0)
        rc = ACC_EIO;
    close(rfd);
    return rc;
}

/* The queue caps (max_queued_jobs, user_max_queued): a full queue is a
 * 429 naming the limit, so queued jobs cannot grow without bound. */
static int check_queue_caps(const jobs_mgr *m, const char *owner, acc_err *err)
{
    int total = 0, mine = 0;
    for (size_t i = 0; i < m->njobs; i++) {
        const job *j = m->jobs[i];
        if (j->state != JOB_QUEUED)
            continue;
        total++;
        mine += !strcmp(j->owner, owner);
    }
    const acc_conf *cf = m->conf;
    if (cf->user_max_queued > 0 && mine >= cf->user_max_queued)
        return acc_err_set(err, ACC_ELIMIT, NULL,
                           "user_max_queued %d reached: %s has %d queued jobs; wait until some start, or cancel some",
                           cf->user_max_queued, owner[0] ? owner : "the admin", mine);
    if (cf->max_queued_jobs > 0 && total >= cf->max_queued_jobs)
        return acc_err_set(err, ACC_ELIMIT, NULL,
                           "max_queued_jobs %d reached: %d jobs are queued; wait until some start", cf->max_queued_jobs,
                           total);
    return 0;
}

int jobs_submit_checked(jobs_mgr *m, jobs_checked *c, job **out, json_t **plan, acc_err *err)
{
    if (c->rc != 0) {
        if (err != NULL)
            *err = c->err;
        return c->rc;
    }
    sched_dev sd[KERN_MAX_DEVICES];
    sched_devs(m, sd);
    int rc = sched_can_ever_fit(sd, m->ndev, c->spec->devices, err);
    if (rc != 0)
        return rc;
    if (c->dry_run) {
        *plan = dry_run_plan(m, c->spec, c->owner, c->cands ? c->cands : json_null(), c->peak, c->micro,
                             c->host_per_rank, c->host_job);
        c->cands = NULL;
        return *plan ? 0 : acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    }
    if (m->draining)
        return acc_err_set(err, ACC_ESTATE, NULL, "the daemon is shutting down; not accepting jobs");
    if ((rc = check_queue_caps(m, c->owner, err)) != 0)
        return rc;
    /* checked here, on the loop thread, after the off-loop validation: the
     * store may have turned read-only meanwhile (503) */
    if ((rc = store_writable(m, err)) != 0 || (rc = table_reserve(m, err)) != 0)
        return rc;
    job *j = job_new(m, err);
    if (j == NULL)
        return err ? err->code : ACC_ENOMEM;
    j->spec = *c->spec;
    j->host_bytes = c->host_job;
    j->host_per_rank = c->host_per_rank;
    const char *text = c->text;
    size_t len = c->len;
    if ((rc = job_uid_mint(j->spec.job_uid, sizeof j->spec.job_uid, err)) != 0 ||
        (rc = claim_id(m, j, err)) != 0) {
        job_delete(j);
        return rc;
    }
    snprintf(j->owner, sizeof j->owner, "%s", c->owner);
    set_output_dir(m, j);
    j->submitted_at = job_now();
    j->cur_micro = j->spec.micro_batch;
    j->cur_accum = j->spec.accum_steps;
    j->spec_json = compact_spec(text, len);
    j->hydrated = true; /* its whole history is in memory from the start */
    if (j->spec_json == NULL)
        rc = acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    if (rc == 0)
        rc = persist_new(m, j, err);
    if (rc == 0)
        rc = table_add(m, j, err);
    if (rc != 0) {
        acc_log(ACC_LOG_ERROR, "jobs", "job %s not stored: %s", j->id, err ? err->msg : "");
        rmdir(j->spec.output_dir); /* claimed just now, still empty */
        job_delete(j);
        return rc;
    }
    m->next_submit++;
    m->submitted_total++;
    acc_log(ACC_LOG_INFO, "jobs", "job %s queued: %s, %d device(s), B=%d m=%d a=%d", j->id, j->spec.name,
            j->spec.devices, j->spec.train_batch_size, j->spec.micro_batch, j->spec.accum_steps);
    *out = j;
    jobs_schedule(m);
    return 0;
}

/* ---- running ---------------------------------------------------------------- */

/* Queue an event (or a worker's end) for the loop thread. An end, or a
 * run's TEV_DONE, cannot be dropped: wait until memory returns. */
static void enqueue(jobs_mgr *m, job *j, const train_event *ev, const jobs_wend *end)
{
    bool must = end != NULL || ev->kind == TEV_DONE;
    jobs_tev *t;
    while ((t = malloc(sizeof *t)) == NULL && must)
        usleep(1000);
    if (t == NULL)
        return;
    t->next = NULL;
    t->j = j;
    t->worker_end = end != NULL;
    if (end != NULL)
        t->end = *end;
    else
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

static void on_trainer_event(void *ctx, const train_event *ev)
{
    job *j = ctx;
    enqueue(j->mgr, j, ev, NULL);
}

void jobs_worker_event(jobs_mgr *m, job *j, const train_event *ev) { enqueue(m, j, ev, NULL); }

void jobs_worker_ended(jobs_mgr *m, job *j, const jobs_wend *e) { enqueue(m, j, NULL, e); }

void jobs_set_runner(jobs_mgr *m, const jobs_runner *r) { m->runner = *r; }

static void release_devices(jobs_mgr *m, job *j)
{
    for (int i = 0; i < j->ndev; i++) {
        int d = j->dev_idx[i];
        if (m->dev_holder[d] == j) {
            m->dev_holder[d] = NULL;
            m->dev_mem_in_use[d] = 0;
            m->dev_mem_reserved[d] = 0;
            m->dev_mem_free[d] = 0; /* unknown until the next job reports */
            m->dev_mem_optim[d] = 0;
            m->dev_mem_grads[d] = 0;
        }
    }
}

/* output_root/<id> as a real directory (created when a job from before
 * ids were claimed lacks it); a symlink planted there is refused, never
 * followed. */
static int open_output_dir(jobs_mgr *m, job *j, acc_err *err)
{
    int rfd = open(m->conf->output_root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (rfd < 0)
        return acc_err_set(err, ACC_EIO, NULL, "output_root %s: %s", m->conf->output_root, strerror(errno));
    acc_err e = {0};
    int rc = sp_mkdirat(rfd, j->id, 0, NULL, &e);
    close(rfd);
    if (rc != 0)
        return acc_err_set(err, rc, NULL, "output directory %s/%s: %s", m->conf->output_root, j->id, e.msg);
    return 0;
}

/* The names of the devices a job runs on, kept in its record (job.h). */
static void set_record_devices(job *j, const kern_device_info *devs, int n)
{
    json_t *a = json_array();
    for (int i = 0; a != NULL && i < n; i++)
        json_array_append_new(a, json_string(devs[i].name));
    char *text = a ? json_dumps(a, JSON_COMPACT) : NULL;
    json_decref(a);
    if (text == NULL)
        return; /* out of memory: the record keeps the previous names */
    free(j->record_devices);
    j->record_devices = text;
}

/* The job is "running" on disk before its trainer starts: a start the
 * store cannot record does not happen (the job stays queued). */
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
    double started = j->started_at;
    int micro = j->cur_micro, accum = j->cur_accum;
    set_record_devices(j, devinfo, r->want);
    j->started_at = job_now();
    /* step, loss and history stay: a requeued job resumes from its last
     * checkpoint, and the steps it redoes replace their old entries */
    j->cur_micro = j->spec.micro_batch;
    j->cur_accum = j->spec.accum_steps;
    char msg[256];
    snprintf(msg, sizeof msg, "placed on %d device(s)%s", r->want, r->backfilled ? " (backfill)" : "");
    if (set_state(j, JOB_RUNNING, msg) != 0) {
        release_devices(m, j);
        j->ndev = 0;
        j->started_at = started;
        j->cur_micro = micro;
        j->cur_accum = accum;
        return;
    }
    j->tokens = 0;
    j->cancel_requested = false;
    j->cancel_requested_at = 0;
    j->cancel_killed = false;
    set_export_dir(m, j);
    if (open_output_dir(m, j, &err) != 0) {
        release_devices(m, j);
        finish_or_retry(j, JOB_FAILED, acc_err_name(err.code), err.msg);
        return;
    }
    if (m->runner.start != NULL) {
        if (m->runner.start(m->runner.ctx, j, devinfo, r->want, &err) != 0) {
            j->worker = NULL;
            release_devices(m, j);
            m->worker_failures[JOBS_WFAIL_START]++;
            acc_log(ACC_LOG_ERROR, "jobs", "job %s: cannot start its worker: %s", j->id, err.msg);
            finish_or_retry(j, JOB_FAILED, acc_err_name(err.code), err.msg);
        }
        return;
    }
    train_cfg *cfg = malloc(sizeof *cfg); /* trainer_start copies it */
    if (cfg == NULL) {
        release_devices(m, j);
        finish_or_retry(j, JOB_FAILED, acc_err_name(ACC_ENOMEM), "out of memory");
        return;
    }
    job_spec_train_cfg(&j->spec, cfg);
    trainer_opts o = {.spec = cfg, .devices = devinfo, .threads_per_device = m->conf->cpu_threads_per_device,
                      .checkpoint_keep = m->conf->checkpoint_keep, .async_start = true,
                      .on_event = on_trainer_event, .event_ctx = j,
                      /* the test-only ACCUMD_TEST_OOM_AT_GIVEN keeps
                       * the given micro batch, so e2e tests still drive the OOM path */
                      .start_where_fits = getenv("ACCUMD_TEST_OOM_AT_GIVEN") == NULL,
                      .host_budget = j->host_bytes}; /* its reservation: all its ranks run here */
    int rc = trainer_start(&o, &j->tr, &err);
    free(cfg);
    if (rc != 0) {
        j->tr = NULL;
        release_devices(m, j);
        acc_log(ACC_LOG_ERROR, "jobs", "job %s: cannot start: %s", j->id, err.msg);
        finish_or_retry(j, JOB_FAILED, acc_err_name(err.code), err.msg);
    }
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
        if (jobs_job_active(j)) { /* holds its devices until its workers end */
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
                             .job = j, .user = u, .user_last = ot->last[u], .host_bytes = j->host_bytes};
    }
    return k;
}

static void owner_limits(const jobs_mgr *m, owner_tab *t, sched_limits *lim)
{
    *lim = (sched_limits){.max_running = m->conf->user_max_running, .max_devices = m->conf->user_max_devices,
                          .nusers = t->n, .running = t->running, .devices = t->devices};
}

static void schedule_jobs(jobs_mgr *m);

/* Jobs first, then generate requests on the devices left (genq.h). */
void jobs_schedule(jobs_mgr *m)
{
    schedule_jobs(m);
    if (m->gen != NULL)
        genq_place(m->gen);
}

static void schedule_jobs(jobs_mgr *m)
{
    /* nothing starts that the store could not record */
    if (m->draining || m->st.degraded || m->st.failing)
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
    host_limits(m, &lim);
    sched_plan_users(sd, m->ndev, q, (int)nq, &lim);
    for (size_t i = 0; i < nq && !m->st.failing; i++) {
        note_host_wait(m, q[i].job, !q[i].start && q[i].host_wait);
        if (q[i].start)
            start_job(m, q[i].job, &q[i]);
    }
    owner_tab_free(&ot);
    free(q);
}

/* A running job's cancel, stored with its status and event in one FULL
 * commit before anyone is told: a restart ends the job cancelled. When
 * the store cannot write it, nothing changed (503). */
static int record_cancel(job *j, acc_err *err)
{
    double now = job_now();
    j->cancel_requested = true;
    j->cancel_requested_at = now;
    ev_batch b = {0};
    acc_err e = {0};
    int rc = batch_add(j, &b, "log",
                       json_pack("{s:s}", "message", "cancel requested; stopping at the next micro-step"), now);
    if (rc == 0)
        rc = commit_status(j, &b, &e);
    batch_free(&b);
    if (rc == 0)
        return 0;
    j->cancel_requested = false;
    j->cancel_requested_at = 0;
    job_view_invalidate(j);
    return acc_err_set(err, ACC_EUNAVAIL, NULL, "job %s not cancelled: the job store cannot write: %s", j->id,
                       rc == ACC_ENOMEM ? "out of memory" : j->mgr->st.why);
}

int jobs_cancel(jobs_mgr *m, job *j, acc_err *err)
{
    if (job_state_final(j->state))
        return acc_err_set(err, ACC_ESTATE, NULL, "job %s is already %s", j->id, job_state_name(j->state));
    if (j->pending.on || (j->state == JOB_RUNNING && !jobs_job_active(j)))
        return acc_err_set(err, ACC_EUNAVAIL, NULL, "job %s: its last state change is not stored yet (%s); retry later",
                           j->id, j->mgr->st.why);
    if (j->state == JOB_QUEUED) {
        int rc = finish(j, JOB_CANCELLED, NULL, "cancelled while queued");
        if (rc != 0)
            return acc_err_set(err, ACC_EUNAVAIL, NULL, "job %s not cancelled: the job store cannot write: %s",
                               j->id, m->st.why);
        jobs_schedule(m); /* a backfill may have been waiting on it */
        return 0;
    }
    if (!j->cancel_requested) {
        int rc = record_cancel(j, err);
        if (rc != 0)
            return rc;
        if (j->worker != NULL)
            m->runner.control(m->runner.ctx, j, "cancel");
        else
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

/* Throughput that counts tokens: the step's
 * loss-carrying and real input tokens (padding excluded), each per second
 * of the step, the padding fraction of the input positions, the model's
 * FLOPs a token and, where device_peak_flops is configured, the MFU over
 * the job's devices. */
static void add_token_rates(const jobs_mgr *m, json_t *o, const train_event *ev)
{
    if (o == NULL)
        return;
    double t = ev->step_seconds;
    double achieved = t > 0 ? ev->flops_per_token * (double)ev->input_tokens / t : 0;
    double peak = m->conf->device_peak_flops * (ev->nranks > 0 ? ev->nranks : 1);
    json_object_set_new(o, "loss_tokens", json_integer((json_int_t)ev->loss_tokens));
    json_object_set_new(o, "input_tokens", json_integer((json_int_t)ev->input_tokens));
    json_object_set_new(o, "step_time_s", json_real(t));
    json_object_set_new(o, "loss_tokens_per_s", t > 0 ? json_real((double)ev->loss_tokens / t) : json_null());
    json_object_set_new(o, "input_tokens_per_s", t > 0 ? json_real((double)ev->input_tokens / t) : json_null());
    json_object_set_new(o, "padding_fraction",
                        ev->input_positions > 0
                            ? json_real(1.0 - (double)ev->input_tokens / (double)ev->input_positions)
                            : json_null());
    json_object_set_new(o, "flops_per_token", json_real(ev->flops_per_token));
    json_object_set_new(o, "mfu", peak > 0 && t > 0 ? json_real(achieved / peak) : json_null());
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
        m->dev_mem_optim[d] = ev->mem_optim[r];
        m->dev_mem_grads[d] = ev->mem_grads[r];
        if (ev->mem_peak[r] > m->dev_mem_peak[d])
            m->dev_mem_peak[d] = ev->mem_peak[r];
        if (ev->mem_peak[r] > mt.mem_peak)
            mt.mem_peak = ev->mem_peak[r];
    }
    j->step = ev->step;
    j->last_loss = ev->loss;
    j->have_loss = true;
    j->host_budget = ev->host_budget;
    j->host_in_use = ev->host_in_use;
    j->host_peak = ev->host_peak;
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
    store_metric sm = {.step = mt.step, .time = mt.time, .loss = mt.loss, .lr = mt.lr, .grad_norm = mt.grad_norm,
                       .tokens_per_s = mt.tokens_per_s, .micro_batch = mt.micro_batch,
                       .accum_steps = mt.accum_steps, .mem_peak = mt.mem_peak};
    json_t *loss = isfinite(ev->loss) ? json_real(ev->loss) : json_null();
    json_t *o =
         json_pack("{s:i, s:o, s:f, s:f, s:f, s:i, s:i, s:o, s:o, s:o, s:o, s:o, s:o}", "step", ev->step, "loss", loss,
                   "lr", ev->lr, "grad_norm", isfinite(ev->grad_norm) ? ev->grad_norm : -1.0, "tokens_per_s",
                   ev->tokens_per_s, "micro_batch", ev->micro_batch, "accum_steps", ev->accum_steps,
                   "mem_in_use", mem_array(ev->mem_in_use, nr), "mem_peak", mem_array(ev->mem_peak, nr),
                   "mem_reserved", mem_array(ev->mem_reserved, nr), "mem_free", mem_array(ev->mem_free, nr),
                   "mem_optimizer", mem_array(ev->mem_optim, nr), "mem_gradients", mem_array(ev->mem_grads, nr));
    add_token_rates(m, o, ev);
    if (o != NULL) { /* host memory next to the device figures: reserved, the trainer's host_mem */
        json_object_set_new(o, "host_reserved", json_integer((json_int_t)j->host_bytes));
        json_object_set_new(o, "host_budget", json_integer((json_int_t)ev->host_budget));
        json_object_set_new(o, "host_in_use", json_integer((json_int_t)ev->host_in_use));
        json_object_set_new(o, "host_peak", json_integer((json_int_t)ev->host_peak));
    }
    emit_metric(j, "step", o, false, &sm);
}

/* The trainer changed the job's (micro, accum) split: after an OOM, or
 * upward under "auto". The new split is persisted with the status. */
/* The trainer changed the job's (micro, accum) split: after an OOM, or
 * upward under "auto". The new split is stored with the status, in the
 * event's transaction. */
static void apply_split_change(job *j, const train_event *ev, const char *type, const char *bytes_key,
                               const char *room_key)
{
    j->cur_micro = ev->to_micro;
    j->cur_accum = ev->to_accum;
    ev_batch b = {0};
    acc_err err = {0};
    if (batch_add(j, &b, type,
                  json_pack("{s:i, s:{s:i, s:i}, s:{s:i, s:i}, s:b, s:I, s:I}", "step", ev->step, "from",
                            "micro_batch", ev->from_micro, "accum_steps", ev->from_accum, "to", "micro_batch",
                            ev->to_micro, "accum_steps", ev->to_accum, "recompute", ev->recompute, bytes_key,
                            (json_int_t)ev->bytes_asked, room_key, (json_int_t)ev->bytes_free),
                  job_now()) != 0)
        return;
    if (commit_status(j, &b, &err) != 0) {
        log_store_error(j, type, &err);
        batch_push(j, &b); /* the split did change: watchers see it */
    }
    batch_free(&b);
}

/* The run is over (its threads joined, or its worker gone): the devices
 * are free again, once. */
static void end_run(jobs_mgr *m, job *j)
{
    if (j->tr != NULL)
        trainer_free(j->tr);
    j->tr = NULL;
    if (j->worker != NULL)
        m->runner.release(m->runner.ctx, j);
    j->worker = NULL;
    release_devices(m, j);
}

static void apply_done(jobs_mgr *m, job *j, const train_event *ev)
{
    end_run(m, j);
    if (j->stop_for_shutdown && !j->cancel_requested) {
        /* stays "running" on disk: the next start requeues it */
        emit(j, "log", json_pack("{s:s}", "message", "stopped by daemon shutdown after a checkpoint; resumes at the next start"), true);
        return;
    }
    if (ev->status == 0)
        finish_or_retry(j, JOB_SUCCEEDED, NULL, ev->msg[0] ? ev->msg : NULL);
    else if (ev->status == ACC_ECANCELLED)
        finish_or_retry(j, JOB_CANCELLED, NULL, j->cancel_requested ? "cancelled while running" : ev->msg);
    else if (j->cancel_requested) { /* it was asked to stop: it ends as asked */
        char why[700];
        snprintf(why, sizeof why, "cancelled while running (it stopped with: %s)",
                 ev->msg[0] ? ev->msg : acc_err_name(ev->status));
        finish_or_retry(j, JOB_CANCELLED, NULL, why);
    } else
        finish_or_retry(j, JOB_FAILED, acc_err_name(ev->status), ev->msg[0] ? ev->msg : acc_err_name(ev->status));
}

/* A worker that died without reporting: failed with the cause, or queued
 * again to resume from its last checkpoint (max_restarts). */
static void apply_worker_lost(jobs_mgr *m, job *j, const jobs_wend *e)
{
    m->worker_failures[e->cause]++;
    char msg[512];
    snprintf(msg, sizeof msg, "worker %.300s at step %d", e->what, j->step);
    acc_log(ACC_LOG_ERROR, "jobs", "job %s: %s", j->id, msg);
    if (j->stop_for_shutdown) /* stays "running" on disk: the next start requeues it */
        return;
    if (j->cancel_requested) { /* it was to stop anyway: never restarted */
        char why[600];
        snprintf(why, sizeof why, "cancelled while running (%s)", msg);
        finish_or_retry(j, JOB_CANCELLED, NULL, why);
        return;
    }
    bool same_step = j->crash_step == j->step;
    if (e->deterministic || same_step || j->worker_restarts >= j->spec.max_restarts) {
        char why[700];
        snprintf(why, sizeof why, "%s%s", msg,
                 e->deterministic ? "" : same_step ? " (the second time at this step: not restarted)"
                                 : j->spec.max_restarts > 0 ? " (max_restarts reached)" : "");
        finish_or_retry(j, JOB_FAILED, acc_err_name(ACC_EINTERNAL), why);
        return;
    }
    j->worker_restarts++;
    j->crash_step = j->step;
    m->worker_restarts_total++;
    j->started_at = 0;
    j->ndev = 0;
    char req[700];
    snprintf(req, sizeof req, "%s; requeued (restart %d of %d), it resumes from its last checkpoint", msg,
             j->worker_restarts, j->spec.max_restarts);
    if (set_state(j, JOB_QUEUED, req) != 0)
        keep_pending(j, JOB_QUEUED, NULL, req, false);
}

static void apply_worker_end(jobs_mgr *m, job *j, const jobs_wend *e)
{
    if (e->reported) {
        apply_done(m, j, &e->done);
        return;
    }
    end_run(m, j);
    apply_worker_lost(m, j, e);
}

/* A progress event is stored and shown only when it says something new:
 * a stage stuck on one record reports the same figures every 100 ms. */
static void apply_progress(job *j, const train_event *ev)
{
    bool news = ev->max_steps > 0 || strncmp(j->progress_stage, ev->path, sizeof j->progress_stage - 1) != 0 ||
                j->progress_done != ev->done || j->progress_total != ev->total;
    if (ev->max_steps > 0) /* num_train_epochs, now that the samples are known */
        j->spec.max_steps = ev->max_steps;
    if (!news)
        return;
    snprintf(j->progress_stage, sizeof j->progress_stage, "%.15s", ev->path);
    j->progress_done = ev->done;
    j->progress_total = ev->total;
    emit(j, "progress", json_pack("{s:s, s:I, s:I}", "stage", ev->path, "done", (json_int_t)ev->done, "total",
                                  (json_int_t)ev->total), false);
}

static void apply_event(jobs_mgr *m, job *j, const train_event *ev)
{
    switch (ev->kind) {
    case TEV_STEP:
        apply_step(m, j, ev);
        break;
    case TEV_EVAL:
        /* the whole set's tokens and perplexity */
        emit(j, "eval",
             json_pack("{s:i, s:f, s:o, s:I, s:I}", "step", ev->step, "val_loss", ev->val_loss, "perplexity",
                       isfinite(exp(ev->val_loss)) ? json_real(exp(ev->val_loss)) : json_null(), "val_tokens",
                       (json_int_t)ev->val_tokens, "val_samples", (json_int_t)ev->val_samples),
             false);
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
        job_add_output(j, ev->path, j->spec.save_total_limit > 0 ? j->spec.save_total_limit : m->conf->checkpoint_keep,
                       NULL); /* the job view's outputs */
        break;
    case TEV_LOG:
        if (!strncmp(ev->msg, "resumed from", 12))
            j->step = ev->step; /* the checkpoint's step: the run goes on from there */
        emit(j, "log", json_pack("{s:i, s:s}", "step", ev->step, "message", ev->msg), false);
        break;
    case TEV_PROGRESS:
        apply_progress(j, ev);
        break;
    case TEV_DONE:
        apply_done(m, j, ev);
        break;
    case TEV_SAMPLE: /* an eval_prompts answer */
        emit(j, "sample",
             json_pack("{s:i, s:i, s:s, s:s}", "step", ev->step, "index", ev->index, "prompt", ev->prompt, "text",
                       ev->text),
             false);
        break;
    case TEV_CKPT_REJECTED:
        acc_log(ACC_LOG_WARN, "jobs", "job %s: checkpoint %s not used: %s", j->id, ev->path, ev->msg);
        emit(j, "checkpoint_rejected", json_pack("{s:s, s:s}", "path", ev->path, "reason", ev->msg), true);
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
        if (t->worker_end)
            apply_worker_end(m, t->j, &t->end);
        else
            apply_event(m, t->j, &t->ev);
        ended |= t->worker_end || t->ev.kind == TEV_DONE;
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
        n += jobs_job_active(m->jobs[i]);
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
        if (!jobs_job_active(j))
            continue;
        j->stop_for_shutdown = true;
        if (j->worker != NULL) /* checkpoint, then stop */
            m->runner.control(m->runner.ctx, j, "preempt");
        else
            trainer_preempt(j->tr);
    }
    return jobs_count_running(m);
}

void jobs_enforce_cancels(jobs_mgr *m)
{
    double now = job_now();
    for (size_t i = 0; i < m->njobs; i++) {
        job *j = m->jobs[i];
        if (j->worker == NULL || !j->cancel_requested || j->cancel_killed ||
            now - j->cancel_requested_at < m->conf->cancel_grace)
            continue;
        j->cancel_killed = true;
        char msg[200];
        snprintf(msg, sizeof msg, "the run did not stop within cancel_grace (%d s) of the cancel: its worker is killed",
                 m->conf->cancel_grace);
        acc_log(ACC_LOG_WARN, "jobs", "job %s: %s", j->id, msg);
        emit(j, "log", json_pack("{s:s}", "message", msg), false);
        m->runner.control(m->runner.ctx, j, "kill");
    }
}

void jobs_flush(jobs_mgr *m)
{
    jobs_retry_store(m);
    if (m->npending > 0)
        acc_log(ACC_LOG_ERROR, "store", "%zu job state change(s) could not be stored; those jobs resume or rerun "
                "at the next start: %s", m->npending, m->st.why);
}

void jobs_retry_store(jobs_mgr *m)
{
    store_poll_check(&m->st, false);
    if (m->st.degraded || (!m->st.failing && m->npending == 0))
        return;
    acc_err err = {0};
    if (m->npending == 0 && store_probe(&m->st, &err) != 0)
        return;
    for (size_t i = 0; i < m->njobs && m->npending > 0; i++)
        if (m->jobs[i]->pending.on && !retry_pending(m->jobs[i]))
            return; /* still failing: the next tick tries again */
    if (!m->st.failing) {
        acc_log(ACC_LOG_INFO, "store", "the job store writes again");
        jobs_schedule(m);
    }
}

/* ---- lists, hydration --------------------------------------------------------- */

typedef struct list_acc {
    jobs_mgr *m;
    job **out;
    int n, cap;
} list_acc;

static void list_one(void *ctx, const char *id)
{
    list_acc *a = ctx;
    job *j = jobs_find(a->m, id);
    if (j != NULL && a->n < a->cap)
        a->out[a->n++] = j;
}

/* The same from the table in memory (a read-only store may not read). */
static void list_memory(jobs_mgr *m, int state, uint64_t before, list_acc *a)
{
    size_t i = m->njobs;
    while (i > 0 && m->jobs[i - 1]->submit_seq >= before)
        i--; /* before the cursor; ids are in submission order */
    for (; i > 0 && a->n < a->cap; i--)
        if (state < 0 || (int)m->jobs[i - 1]->state == state)
            a->out[a->n++] = m->jobs[i - 1];
}

int jobs_list(jobs_mgr *m, int state, const char *after, int limit, job **out, int *n, bool *more, acc_err *err)
{
    uint64_t before = UINT64_MAX;
    if (after != NULL) {
        const job *c = jobs_find(m, after);
        if (c == NULL)
            return acc_err_set(err, ACC_EINVAL, "after", "after must name a job (the `next` of the previous page)");
        before = c->submit_seq;
    }
    /* one more than asked: whether a next page exists */
    list_acc a = {.m = m, .out = out, .cap = limit + 1};
    acc_err e = {0};
    if (m->st.degraded ||
        store_list(&m->st, state >= 0 ? job_state_name((job_state)state) : NULL,
                   before == UINT64_MAX ? 0 : before, limit + 1, list_one, &a, &e) != 0) {
        a.n = 0;
        list_memory(m, state, before, &a);
    }
    *more = a.n > limit;
    *n = a.n > limit ? limit : a.n;
    return 0;
}

typedef struct hydrate_ctx {
    job *j;
    uint64_t last;
} hydrate_ctx;

static void hydrate_event(void *ctx, const store_event *e)
{
    hydrate_ctx *h = ctx;
    if (e->seq <= h->last || !e->seq) /* nothing read back is trusted blindly */
        return;
    h->j->ring.next_seq = e->seq;
    h->last = e->seq;
    evring_push(&h->j->ring, e->type, e->json, e->len, NULL, NULL);
}

static void hydrate_metric(void *ctx, const store_metric *sm)
{
    job_metric mt = {.step = sm->step, .time = sm->time, .loss = sm->loss, .lr = sm->lr, .grad_norm = sm->grad_norm,
                     .tokens_per_s = sm->tokens_per_s, .micro_batch = sm->micro_batch,
                     .accum_steps = sm->accum_steps, .mem_peak = sm->mem_peak};
    job_add_metric(ctx, &mt, NULL);
}

int jobs_hydrate(jobs_mgr *m, job *j, acc_err *err)
{
    if (j->hydrated)
        return 0;
    uint64_t next = j->ring.next_seq;
    bool closed = j->ring.closed;
    evring_free(&j->ring);
    int rc = evring_init(&j->ring, m->conf->event_ring, err);
    if (rc != 0) {
        j->ring.next_seq = next;
        j->ring.closed = closed;
        return rc;
    }
    snprintf(j->ring.job, sizeof j->ring.job, "%s", j->id);
    hydrate_ctx h = {.j = j};
    j->nmetrics = 0;
    acc_err e = {0};
    if (store_load_events(&m->st, j->id, m->conf->event_ring, hydrate_event, &h, &e) != 0 ||
        store_load_metrics(&m->st, j->id, hydrate_metric, j, &e) != 0)
        acc_log(ACC_LOG_WARN, "store", "job %s: history not loaded: %s", j->id, e.msg);
    if (j->ring.next_seq < next) /* the stored count is the truth, even past lost rows */
        j->ring.next_seq = next;
    j->ring.closed = closed;
    j->hydrated = true;
    job_view_invalidate(j);
    return 0;
}

/* ---- reload ------------------------------------------------------------------ */

/* The config may have changed between runs (fewer devices): a job that
 * can never fit now fails instead of waiting forever. */
static int still_fits(const jobs_mgr *m, const job *j, acc_err *err)
{
    sched_dev sd[KERN_MAX_DEVICES];
    sched_devs(m, sd);
    int rc = sched_can_ever_fit(sd, m->ndev, j->spec.devices, err);
    if (rc != 0)
        return rc;
    train_cfg *cfg = malloc(sizeof *cfg);
    if (cfg == NULL)
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    job_spec_train_cfg(&j->spec, cfg);
    rc = check_fits_a_device(m, cfg, err); /* smaller devices now */
    free(cfg);
    return rc;
}

/* A reloaded job's host bytes, from its spec as at submit (a smaller
 * host_memory now refuses it as submit would). */
static int host_need_reload(const jobs_mgr *m, job *j, acc_err *err)
{
    train_cfg *cfg = malloc(sizeof *cfg);
    if (cfg == NULL)
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    job_spec_train_cfg(&j->spec, cfg);
    cfg->devices = j->spec.devices * j->spec.nodes;
    cfg->nodes = 1;
    int rc = host_need(m, &j->spec, cfg, &j->host_per_rank, &j->host_bytes, err);
    free(cfg);
    return rc;
}

/* What is wrong with a stored record, if anything; "" when it is sound. */
static void check_record(const store_job_row *r, const json_t *status, char *why, size_t n)
{
    json_error_t je;
    json_t *spec = json_loads(r->spec, JSON_REJECT_DUPLICATES, &je);
    why[0] = '\0';
    if (!json_is_object(spec))
        snprintf(why, n, "the stored spec is %s%s", spec ? "not a JSON object" : "not valid JSON: ",
                 spec ? "" : je.text);
    else if (job_state_parse(r->state) < 0)
        snprintf(why, n, "the stored state '%.40s' is unknown", r->state);
    else if (r->status != NULL && !json_is_object(status))
        snprintf(why, n, "the stored status is not a JSON object");
    json_decref(spec);
}

static void reload_one(void *ctx, const store_job_row *r)
{
    jobs_mgr *m = ctx;
    acc_err err = {0};
    job *j = job_new(m, &err);
    if (j != NULL)
        snprintf(j->id, sizeof j->id, "%s", r->id);
    if (j == NULL || table_add(m, j, &err) != 0) {
        acc_log(ACC_LOG_ERROR, "store", "job %s not reloaded: %s", r->id, err.msg);
        free(j);
        return;
    }
    json_t *st = r->status ? json_loads(r->status, 0, NULL) : NULL;
    char damaged[300];
    check_record(r, st, damaged, sizeof damaged);
    j->spec_json = strdup(damaged[0] ? "null" : r->spec); /* stored compact at submission */
    int spec_rc = damaged[0] ? ACC_EINVAL : job_spec_parse(r->spec, strlen(r->spec), m->conf, &j->spec, &err);
    set_output_dir(m, j);
    j->cur_micro = j->spec.micro_batch;
    j->cur_accum = j->spec.accum_steps;
    if (json_is_object(st))
        job_status_apply(j, st);
    json_decref(st);
    /* the columns are the truth: the status text is only the details */
    int s = job_state_parse(r->state);
    j->state = s >= 0 ? (job_state)s : JOB_QUEUED;
    j->submit_seq = r->submit_seq;
    if (r->submitted_at > 0)
        j->submitted_at = r->submitted_at;
    if (r->owner != NULL)
        snprintf(j->owner, sizeof j->owner, "%s", r->owner);
    if (r->uid != NULL && r->uid[0] != '\0' && job_uid_valid(r->uid) && strcmp(r->uid, j->spec.job_uid) != 0) {
        snprintf(j->spec.job_uid, sizeof j->spec.job_uid, "%s", r->uid);
        j->spec.adopt_unnamed = false; /* the status said otherwise: the column wins */
    }
    if (j->spec.job_uid[0] == '\0' && job_uid_mint(j->spec.job_uid, sizeof j->spec.job_uid, NULL) == 0)
        j->spec.adopt_unnamed = true; /* from before uids: its checkpoints name none */
    evring_start_at(&j->ring, r->last_seq + 1);
    if (j->submit_seq >= m->next_submit)
        m->next_submit = j->submit_seq + 1;
    if (!job_state_final(j->state) && jobs_hydrate(m, j, &err) != 0)
        acc_log(ACC_LOG_ERROR, "store", "job %s: %s", j->id, err.msg);
    if (damaged[0]) {
        char msg[400];
        snprintf(msg, sizeof msg, "job record damaged: %s", damaged);
        acc_log(ACC_LOG_ERROR, "store", "job %s: %s; kept as failed", j->id, msg);
        if (j->state != JOB_FAILED || strcmp(j->err_msg, msg)) {
            finish_or_retry(j, JOB_FAILED, acc_err_name(ACC_EINTERNAL), msg);
            if (j->pending.on) { /* a read-only store: shown failed all the same */
                j->state = JOB_FAILED;
                snprintf(j->err_code, sizeof j->err_code, "%s", acc_err_name(ACC_EINTERNAL));
                snprintf(j->err_msg, sizeof j->err_msg, "%s", msg);
            }
        }
        return;
    }
    if (!job_state_final(j->state) && spec_rc == 0)
        spec_rc = still_fits(m, j, &err);
    if (!job_state_final(j->state) && spec_rc == 0)
        spec_rc = host_need_reload(m, j, &err);
    else if (job_state_final(j->state)) { /* shown as before the restart; nothing to refuse */
        acc_err ignored = {0};
        (void)host_need_reload(m, j, &ignored);
    }
    if (!job_state_final(j->state) && spec_rc != 0) {
        char msg[700];
        snprintf(msg, sizeof msg, "spec no longer valid at restart: %s: %s", err.field, err.msg);
        finish_or_retry(j, JOB_FAILED, acc_err_name(spec_rc), msg);
    }
}

static void requeue_after_restart(job *j)
{
    j->restarts++;
    /* the last progress the history knows; a resume reports its step */
    if (j->nmetrics > 0) {
        j->step = j->metrics[j->nmetrics - 1].step;
        j->last_loss = j->metrics[j->nmetrics - 1].loss;
        j->have_loss = true;
    }
    j->ndev = 0;
    j->started_at = 0;
    if (set_state(j, JOB_QUEUED,
                  "daemon restarted while the job ran; requeued, it resumes from its last checkpoint (step 0 if it has none)") != 0) {
        j->restarts--;
        keep_pending(j, JOB_QUEUED, NULL,
                     "daemon restarted while the job ran; requeued, it resumes from its last checkpoint (step 0 if it has none)",
                     false);
    }
}

int jobs_load(jobs_mgr *m, acc_err *err)
{
    acc_err e = {0};
    if (store_load_all(&m->st, reload_one, m, &e) != 0)
        acc_log(ACC_LOG_ERROR, "store", "jobs not (all) loaded: %s", e.msg);
    int counts[JOB_NSTATES] = {0};
    for (size_t i = 0; i < m->njobs; i++) {
        job *j = m->jobs[i];
        if (!job_state_final(j->state) && j->cancel_requested && !j->pending.on && !m->st.degraded)
            finish_or_retry(j, JOB_CANCELLED, NULL,
                            "cancelled: the cancel was requested before the daemon restarted; not requeued");
        else if (j->state == JOB_RUNNING && !j->pending.on && !m->st.degraded)
            requeue_after_restart(j);
        if (job_state_final(j->state))
            j->ring.closed = true;
        counts[j->state]++;
    }
    if (m->njobs > 0)
        acc_log(ACC_LOG_INFO, "jobs", "reloaded %zu job(s): %d queued, %d succeeded, %d failed, %d cancelled",
                m->njobs, counts[JOB_QUEUED], counts[JOB_SUCCEEDED], counts[JOB_FAILED], counts[JOB_CANCELLED]);
    /* nothing starts here: the daemon calls jobs_schedule() once its
     * start-up has fully succeeded */
    return 0;
}
