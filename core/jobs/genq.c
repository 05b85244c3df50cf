/* genq: generate requests queued for devices (see genq.h). */
#include "genq.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "job.h"
#include "jobs.h"
#include "log.h"

#include <jansson.h>

void genq_init(genq *q, jobs_mgr *m)
{
    memset(q, 0, sizeof *q);
    q->m = m;
    q->next_id = 1;
    m->gen = q;
}

void genq_set_runner(genq *q, const genq_runner *r) { q->runner = *r; }

static void emit(genq_req *r, const char *type, const char *json)
{
    if (r->sink != NULL)
        r->sink(r->sink_ctx, r, type, json, json ? strlen(json) : 0);
}

genq_req *genq_req_new(genq *q, const char *owner, const char *request, uint64_t mem_bytes, genq_sink_fn sink,
                       void *sink_ctx)
{
    genq_req *r = calloc(1, sizeof *r);
    if (r == NULL || (r->request = strdup(request)) == NULL) {
        free(r);
        return NULL;
    }
    r->q = q;
    r->dev = -1;
    r->mem_bytes = mem_bytes;
    r->sink = sink;
    r->sink_ctx = sink_ctx;
    snprintf(r->owner, sizeof r->owner, "%s", owner ? owner : "");
    snprintf(r->id, sizeof r->id, "gen-%llu", (unsigned long long)q->next_id++);
    return r;
}

void genq_req_free(genq_req *r)
{
    if (r == NULL)
        return;
    free(r->request);
    free(r);
}

static void unlink_req(genq *q, genq_req *r)
{
    if (r->prev != NULL)
        r->prev->next = r->next;
    else if (q->head == r)
        q->head = r->next;
    if (r->next != NULL)
        r->next->prev = r->prev;
    else if (q->tail == r)
        q->tail = r->prev;
    r->prev = r->next = NULL;
}

/* A device that could ever hold it: any device with the memory (jobs
 * come and go; the request waits for one to be free). */
static bool can_ever_fit(const jobs_mgr *m, uint64_t bytes)
{
    for (int i = 0; i < m->ndev; i++)
        if (m->devs[i].mem_total >= bytes)
            return true;
    return false;
}

int genq_submit(genq *q, genq_req *r, acc_err *err)
{
    jobs_mgr *m = q->m;
    if (q->runner.start == NULL)
        return acc_err_set(err, ACC_EUNAVAIL, NULL,
                           "generation needs worker processes (worker_processes = true in the config)");
    if (m->draining)
        return acc_err_set(err, ACC_EUNAVAIL, NULL, "the daemon is shutting down");
    if (!can_ever_fit(m, r->mem_bytes))
        return acc_err_set(err, ACC_EINVAL, "model",
                           "the model needs %llu bytes to generate, more than any device has",
                           (unsigned long long)r->mem_bytes);
    r->state = GENQ_QUEUED;
    r->submitted_at = job_now();
    r->prev = q->tail;
    if (q->tail != NULL)
        q->tail->next = r;
    else
        q->head = r;
    q->tail = r;
    q->nqueued++;
    q->stats.requests++;
    jobs_schedule(m); /* jobs first, then this queue (genq_place) */
    return 0;
}

/* The free device with the least memory that still holds `bytes` (the
 * large ones stay free for the large models). */
static int free_device(const jobs_mgr *m, uint64_t bytes)
{
    int best = -1;
    for (int i = 0; i < m->ndev; i++) {
        if (m->dev_holder[i] != NULL || m->dev_lent[i] || m->devs[i].mem_total < bytes)
            continue;
        if (best < 0 || m->devs[i].mem_total < m->devs[best].mem_total)
            best = i;
    }
    return best;
}

static void end_request(genq *q, genq_req *r)
{
    r->state = GENQ_ENDED;
    r->ended_at = job_now();
    unlink_req(q, r);
    emit(r, "end", NULL);
}

static void finish_run(genq *q, genq_req *r);

static void start_request(genq *q, genq_req *r, int d)
{
    jobs_mgr *m = q->m;
    acc_err err = {0};
    q->nqueued--;
    q->nrunning++;
    r->state = GENQ_RUNNING;
    r->dev = d;
    r->started_at = job_now();
    m->dev_lent[d] = true;
    m->dev_mem_in_use[d] = r->mem_bytes;
    if (r->mem_bytes > m->dev_mem_peak[d])
        m->dev_mem_peak[d] = r->mem_bytes;
    char json[64];
    snprintf(json, sizeof json, "{\"device\":%d}", d);
    emit(r, "started", json);
    if (q->runner.start(q->runner.ctx, r, &m->devs[d], &err) == 0)
        return;
    acc_log(ACC_LOG_ERROR, "generate", "%s: cannot start its worker: %s", r->id, err.msg);
    json_t *o = json_pack("{s:s, s:s}", "code", acc_err_name(err.code), "message", err.msg);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    emit(r, "error", text ? text : "{\"code\":\"internal\",\"message\":\"cannot start a worker\"}");
    free(text);
    r->worker = NULL;
    finish_run(q, r); /* no scheduling from inside genq_place: the caller goes on */
}

/* Tell every queued request whose place changed where it stands. */
static void send_positions(genq *q)
{
    int pos = 0;
    for (genq_req *r = q->head; r != NULL; r = r->next) {
        if (r->state != GENQ_QUEUED)
            continue;
        pos++;
        if (r->position == pos)
            continue;
        r->position = pos;
        char json[64];
        snprintf(json, sizeof json, "{\"position\":%d}", pos);
        emit(r, "queued", json);
    }
}

void genq_place(genq *q)
{
    if (!q->m->draining && !q->m->st.degraded) {
        genq_req *next;
        for (genq_req *r = q->head; r != NULL; r = next) {
            next = r->next; /* a start that fails ends (unlinks) r */
            if (r->state != GENQ_QUEUED)
                continue;
            int d = free_device(q->m, r->mem_bytes);
            if (d >= 0)
                start_request(q, r, d);
        }
    }
    send_positions(q);
}

void genq_cancel(genq *q, genq_req *r)
{
    if (r->state == GENQ_ENDED || r->cancelled)
        return;
    r->cancelled = true;
    if (r->state == GENQ_QUEUED) {
        q->nqueued--;
        q->stats.cancelled++;
        end_request(q, r);
        send_positions(q);
        return;
    }
    if (q->runner.cancel != NULL && r->worker != NULL)
        q->runner.cancel(q->runner.ctx, r);
}

void genq_event(genq *q, genq_req *r, const char *type, const char *json, size_t len, uint64_t tokens)
{
    (void)q;
    if (r->state != GENQ_RUNNING)
        return;
    if (!strcmp(type, "done")) {
        r->ok = true;
        r->tokens = tokens;
    }
    if (r->sink != NULL)
        r->sink(r->sink_ctx, r, type, json, len);
}

/* The device back, the counters, "end" (after which r may be gone). */
static void finish_run(genq *q, genq_req *r)
{
    jobs_mgr *m = q->m;
    int d = r->dev;
    m->dev_lent[d] = false;
    m->dev_mem_in_use[d] = 0;
    m->dev_mem_reserved[d] = 0;
    q->nrunning--;
    double now = job_now();
    q->stats.queue_seconds += r->started_at - r->submitted_at;
    q->stats.run_seconds += now - r->started_at;
    if (r->ok) {
        q->stats.completed++;
        q->stats.tokens += r->tokens;
    } else if (r->cancelled) {
        q->stats.cancelled++;
    } else {
        q->stats.failed++;
    }
    r->worker = NULL;
    end_request(q, r);
}

void genq_ended(genq *q, genq_req *r)
{
    if (r->state != GENQ_RUNNING)
        return;
    finish_run(q, r);
    jobs_schedule(q->m); /* the device is free: jobs first, then the queue */
}

void genq_shutdown(genq *q)
{
    genq_req *next;
    for (genq_req *r = q->head; r != NULL; r = next) {
        next = r->next;
        genq_cancel(q, r);
    }
}

const genq_req *genq_on_device(const genq *q, int dev)
{
    for (const genq_req *r = q->head; r != NULL; r = r->next)
        if (r->state == GENQ_RUNNING && r->dev == dev)
            return r;
    return NULL;
}
