/* api_routes: the v1 routes, as one table (api_routes[] at the end: one
 * row per method and path, with its flags, parser and handler; matching in
 * api_parse.c, the row format in api_parse.h). In short:
 *
 *   GET  /healthz                    liveness (no token ever)
 *   (and HEAD wherever GET is)
 *   GET  /metrics                    Prometheus text
 *   GET  /v1/devices                 devices, memory, holder
 *   GET  /v1/jobs[?state=S&limit=N&after=ID]  list, newest first, by pages
 *   POST /v1/jobs[?dry_run=1]        submit (201 + Location) or plan (200)
 *   GET  /v1/jobs/{id}               one job, with its spec
 *   DELETE /v1/jobs/{id}             cancel (200 when final now, 202 when
 *                                    a running job was asked to stop)
 *   GET  /v1/jobs/{id}/events        SSE (or ?format=ndjson), resumable by
 *                                    Last-Event-ID or ?since=N
 *   GET  /v1/jobs/{id}/metrics       step history
 *   GET  /, /ui/...                  the dashboard's static files (api_ui.c)
 *   POST /v1/tokenize                ids, token strings, loss mask (api_tokenize.c)
 *   POST /v1/plan                    every way to run a spec on given hardware (api_plan.c)
 *   GET  /v1/jobs/{id}/files         a job's outputs: path, size, sha256; owner or admin (api_files.c)
 *   POST /v1/generate                the model answers, in a worker on a device (api_generate.c)
 *
 * HEAD is answered wherever GET is (the same headers, no body). The path,
 * the method and every query parameter and header a route reads are parsed
 * first, strictly, by api_parse_request() (api_parse.c); the handlers here
 * get an api_call. The app pointer of the server is the jobs manager.
 * Handlers run on the loop thread and never block.
 */
#include <jansson.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_http.h"
#include "api_parse.h"
#include "api_ui.h"
#include "jobs.h"
#include "genq.h"

static void resp_json_obj(api_response *resp, int status, json_t *o)
{
    api_resp_json_obj(resp, status, o, JSON_COMPACT | JSON_REAL_PRECISION(10));
}

/* A body made of pieces (cached views), with the closing newline. */
static void resp_pieces(api_response *resp, int status, const char *const *p, const size_t *len, int n)
{
    size_t total = 2;
    for (int i = 0; i < n; i++)
        total += len[i];
    char *body = malloc(total);
    if (body == NULL) {
        api_resp_error(resp, 500, "internal", NULL, "out of memory");
        return;
    }
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        memcpy(body + k, p[i], len[i]);
        k += len[i];
    }
    body[k++] = '\n';
    body[k] = '\0';
    free(resp->body);
    resp->status = status;
    resp->content_type = "application/json";
    resp->body = body;
    resp->body_len = k;
}

/* ---- /healthz, /metrics, /v1/devices --------------------------------------- */

/* {"status":"ok"}, or "degraded" with what the job store says: the daemon
 * lives and answers reads, but takes no jobs until the store writes. */
static void route_healthz(api_server *s, const api_request *req, const api_call *c, api_response *resp, job *j)
{
    const jobs_mgr *m = api_server_app(s);
    const store *st = &m->st;
    if (!st->degraded && !st->failing) {
        api_resp_json(resp, 200, "{\"status\":\"ok\"}\n");
        return;
    }
    resp_json_obj(resp, 200,
                  json_pack("{s:s, s:{s:b, s:b, s:s, s:I, s:I}}", "status", "degraded", "store", "read_only",
                            st->degraded, "writing", !st->degraded && !st->failing, "error", st->why,
                            "write_errors", (json_int_t)st->write_errors, "pending_state_changes",
                            (json_int_t)m->npending));
}

static void route_metrics(api_server *s, const api_request *req, const api_call *c, api_response *resp, job *j)
{
    size_t len = 0;
    char *text = api_metrics_text(s, &len);
    if (text == NULL) {
        api_resp_error(resp, 500, "internal", NULL, "out of memory");
        return;
    }
    free(resp->body);
    resp->status = 200;
    resp->content_type = "text/plain; version=0.0.4; charset=utf-8";
    resp->body = text;
    resp->body_len = len;
}

static void route_devices(api_server *s, const api_request *req, const api_call *c, api_response *resp, job *j)
{
    const jobs_mgr *m = api_server_app(s);
    json_t *a = json_array();
    for (int i = 0; a != NULL && i < m->ndev; i++) {
        const kern_device_info *d = &m->devs[i];
        const job *h = m->dev_holder[i];
        json_t *o = json_pack("{s:i, s:s, s:i, s:s, s:I, s:I, s:I, s:o}", "id", i, "kind",
                              kern_dev_kind_name(d->kind), "index", d->index, "name", d->name,
                              "memory_total_bytes", (json_int_t)d->mem_total, "memory_in_use_bytes",
                              (json_int_t)m->dev_mem_in_use[i], "memory_peak_bytes", (json_int_t)m->dev_mem_peak[i],
                              "job", h ? json_string(h->id) : json_null());
        if (o != NULL) {
            /* free: as the device's job last saw it (CUDA: cudaMemGetInfo,
             * other processes included); an idle CPU device has its whole
             * budget, an idle GPU's free memory is unknown (null) */
            uint64_t in_use = m->dev_mem_in_use[i], fr = m->dev_mem_free[i];
            if (fr == 0 && d->kind == KERN_DEV_CPU)
                fr = d->mem_total > in_use ? d->mem_total - in_use : 0;
            json_object_set_new(o, "memory_reserved_bytes",
                                json_integer((json_int_t)(m->dev_mem_reserved[i] ? m->dev_mem_reserved[i] : in_use)));
            json_object_set_new(o, "memory_optimizer_bytes", json_integer((json_int_t)m->dev_mem_optim[i]));
            json_object_set_new(o, "memory_gradient_bytes", json_integer((json_int_t)m->dev_mem_grads[i]));
            json_object_set_new(o, "memory_free_bytes", fr || d->kind == KERN_DEV_CPU
                                                             ? json_integer((json_int_t)fr)
                                                             : json_null());
        }
        if (o != NULL && m->gen != NULL) { /* lent to a generate request (genq.h) */
            const genq_req *g = genq_on_device(m->gen, i);
            json_object_set_new(o, "generate", g ? json_string(g->id) : json_null());
        }
        if (o != NULL && d->kind == KERN_DEV_CUDA) {
            char cc[16];
            snprintf(cc, sizeof cc, "%d.%d", d->cc_major, d->cc_minor);
            json_object_set_new(o, "compute_capability", json_string(cc));
        }
        json_array_append_new(a, o);
    }
    json_t *body = json_pack("{s:o}", "devices", a ? a : json_array());
    if (body != NULL && m->gpu_check >= 0) /* the start-up self-test's verdict */
        json_object_set_new(body, "gpu_selftest",
                            json_pack("{s:b, s:s}", "passed", m->gpu_check == 1, "message",
                                      m->gpu_check_msg));
    resp_json_obj(resp, 200, body);
}

/* ---- /v1/jobs --------------------------------------------------------------- */

/* {"jobs":[...],"next":"<id>"|null}: newest first, c->limit at most, older
 * than c->after (api_parse.c); `next` is the cursor of the following
 * (older) page, for ?after=. Views are cached per job (job_view). */
static void route_list(api_server *s, const api_request *req, const api_call *c, api_response *resp, job *j)
{
    jobs_mgr *m = api_server_app(s);
    int limit = c->limit;
    job **found = malloc((size_t)(limit + 1) * sizeof *found);
    const char **piece = malloc((size_t)(2 * limit + 3) * sizeof *piece);
    size_t *len = malloc((size_t)(2 * limit + 3) * sizeof *len);
    int n = 0, k = 0;
    bool more = false;
    acc_err err = {0};
    if (found == NULL || piece == NULL || len == NULL) {
        api_resp_error(resp, 500, "internal", NULL, "out of memory");
    } else if (jobs_list(m, c->state, c->after[0] ? c->after : NULL, limit, found, &n, &more, &err) != 0) {
        api_resp_from_err(resp, &err);
    } else {
        char tail[64];
        piece[k] = "{\"jobs\":[";
        len[k++] = 9;
        for (int i = 0; i < n; i++) {
            size_t vl = 0;
            const char *v = job_view(found[i], false, m->devs, &vl);
            if (v == NULL)
                continue;
            if (k > 1) {
                piece[k] = ",";
                len[k++] = 1;
            }
            piece[k] = v;
            len[k++] = vl;
        }
        int t = more && n > 0 ? snprintf(tail, sizeof tail, "],\"next\":\"%s\"}", found[n - 1]->id)
                              : snprintf(tail, sizeof tail, "],\"next\":null}");
        piece[k] = tail;
        len[k++] = (size_t)t;
        resp_pieces(resp, 200, piece, len, k);
    }
    free(found);
    free(piece);
    free(len);
}

static void route_submit(api_server *s, const api_request *req, const api_call *c, api_response *resp, job *j)
{
    bool dry = c->dry_run;
    if (req->body_len == 0) {
        api_resp_error(resp, 400, "invalid", NULL, "empty body: send the job spec as JSON");
        return;
    }
    /* validation opens user files: off the loop thread (api_submit.c) */
    api_submit(s, req, resp, dry);
}

static void route_events(api_server *s, const api_request *req, const api_call *c, api_response *resp, job *j)
{
    if (c->head) { /* the stream's headers, no stream */
        api_resp_json(resp, 200, "");
        resp->content_type = c->ndjson ? "application/x-ndjson" : "text/event-stream";
        return;
    }
    if (!api_stream_admit(s, req->who, resp)) /* streams have their own limits */
        return;
    acc_err err = {0};
    if (jobs_hydrate(api_server_app(s), j, &err) != 0) { /* the history, from the store */
        api_resp_from_err(resp, &err);
        return;
    }
    resp->stream = api_stream_new(s, req->conn, &j->ring, c->from, c->ndjson, req->who);
    if (resp->stream == NULL)
        api_resp_error(resp, 500, "internal", NULL, "out of memory");
}

/* The step history, read back from the store when the job is not in memory. */
static void route_job_metrics(api_server *s, const api_request *req, const api_call *c, api_response *resp, job *j)
{
    acc_err err = {0};
    if (jobs_hydrate(api_server_app(s), j, &err) != 0)
        api_resp_from_err(resp, &err);
    else
        resp_json_obj(resp, 200, job_metrics_json(j));
}

/* One job, from its cached view (job_view). */
static void route_job_get(api_server *s, const api_request *req, const api_call *c, api_response *resp, job *j)
{
    const jobs_mgr *m = api_server_app(s);
    size_t n = 0;
    const char *v = job_view(j, true, m->devs, &n);
    if (v == NULL)
        api_resp_error(resp, 500, "internal", NULL, "out of memory");
    else
        resp_pieces(resp, 200, &v, &n, 1);
}

static void route_job_files(api_server *s, const api_request *req, const api_call *c, api_response *resp, job *j)
{
    api_files(s, req, resp, j); /* off the loop thread (api_files.c) */
}

static void route_job_file(api_server *s, const api_request *req, const api_call *c, api_response *resp, job *j)
{
    api_file_get(s, req, c->file, resp, j); /* read off the loop thread */
}

static void route_tokenize(api_server *s, const api_request *req, const api_call *c, api_response *resp, job *j)
{
    api_tokenize(s, req, resp); /* off the loop thread (api_tokenize.c) */
}

static void route_generate(api_server *s, const api_request *req, const api_call *c, api_response *resp, job *j)
{
    api_generate(s, req, resp); /* queued for a device (api_generate.c) */
}

static void route_plan(api_server *s, const api_request *req, const api_call *c, api_response *resp, job *j)
{
    api_plan(s, req, resp); /* off the loop thread (api_plan.c) */
}

/* Only the owner or an admin may cancel; everyone may read. */
static void route_cancel(api_server *s, const api_request *req, const api_call *c, api_response *resp, job *j)
{
    jobs_mgr *m = api_server_app(s);
    api_audit *audit = api_server_audit(s);
    if (req->who->role != API_ROLE_ADMIN && strcmp(req->who->name, j->owner) != 0) {
        api_resp_error(resp, 403, "forbidden", NULL,
                       "only the job's owner or an admin may cancel it: job %s is %s's, you are %s (role %s)",
                       j->id, j->owner[0] ? j->owner : "nobody", req->who->name, api_role_name(req->who->role));
        api_audit_record(audit, req->who, "cancel", j->id, "forbidden", "not the owner, not an admin");
        return;
    }
    acc_err err = {0};
    if (jobs_cancel(m, j, &err) != 0) {
        api_audit_record(audit, req->who, "cancel", j->id, acc_err_name(err.code), err.msg);
        api_resp_from_err(resp, &err);
        return;
    }
    api_audit_record(audit, req->who, "cancel", j->id, "ok",
                     job_state_final(j->state) ? "cancelled while queued" : "stop requested");
    json_t *o = job_to_json(j, false, m->devs);
    if (o != NULL)
        json_object_set_new(o, "cancel_requested", json_true());
    resp_json_obj(resp, job_state_final(j->state) ? 200 : 202, o);
}

/* The routes: one row each (api_parse.h says what a row holds). Order
 * matters only for the Allow header's text of a path with several rows
 * (GET before POST before DELETE, as allow_text() writes them). */
const api_route_row api_routes[] = {
    {"GET", "/healthz", API_R_HEALTHZ, API_RF_PUBLIC, NULL, route_healthz},
    {"GET", "/metrics", API_R_METRICS, 0, NULL, route_metrics},
    {"GET", "/v1/devices", API_R_DEVICES, 0, NULL, route_devices},
    {"GET", "/v1/jobs", API_R_JOBS_LIST, API_RF_SLASH, api_parse_list, route_list},
    {"POST", "/v1/jobs", API_R_JOBS_SUBMIT, API_RF_SLASH, api_parse_submit, route_submit},
    {"POST", "/v1/tokenize", API_R_TOKENIZE, 0, NULL, route_tokenize},
    {"POST", "/v1/plan", API_R_PLAN, 0, NULL, route_plan},
    {"POST", "/v1/generate", API_R_GENERATE, 0, NULL, route_generate},
    {"GET", "/v1/jobs/{id}", API_R_JOB_GET, API_RF_JOB, NULL, route_job_get},
    {"DELETE", "/v1/jobs/{id}", API_R_JOB_CANCEL, API_RF_JOB, NULL, route_cancel},
    {"GET", "/v1/jobs/{id}/events", API_R_JOB_EVENTS, API_RF_JOB, api_parse_events, route_events},
    {"GET", "/v1/jobs/{id}/metrics", API_R_JOB_METRICS, API_RF_JOB, NULL, route_job_metrics},
    {"GET", "/v1/jobs/{id}/files", API_R_JOB_FILES, API_RF_JOB, NULL, route_job_files},
    {"GET", "/v1/jobs/{id}/files/{path}", API_R_JOB_FILE, API_RF_JOB, api_parse_file, route_job_file},
};
const size_t api_routes_len = sizeof api_routes / sizeof api_routes[0];

void api_route(api_server *s, const api_request *req, api_response *resp)
{
    if (ui_path(req->path)) { /* the dashboard's static files (api_ui.c) */
        ui_route(req, resp);
        return;
    }
    api_call c;
    if (api_parse_request(req, &c, resp) != 0)
        return;
    job *j = NULL;
    if (c.row->flags & API_RF_JOB) {
        j = jobs_find(api_server_app(s), c.id);
        if (j == NULL) {
            api_resp_error(resp, 404, "not_found", NULL, "no job '%s'", c.id);
            return;
        }
    }
    c.row->handler(s, req, &c, resp, j);
}
