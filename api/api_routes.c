/* api_routes: the v1 routing table (DESIGN.md "HTTP API v1").
 *
 *   GET  /healthz                    liveness (no token ever)
 *   GET  /metrics                    Prometheus text
 *   GET  /v1/devices                 devices, memory, holder
 *   GET  /v1/jobs[?state=S]          list
 *   POST /v1/jobs[?dry_run=1]        submit (201 + Location) or plan (200)
 *   GET  /v1/jobs/{id}               one job, with its spec
 *   DELETE /v1/jobs/{id}             cancel (200 when final now, 202 when
 *                                    a running job was asked to stop)
 *   GET  /v1/jobs/{id}/events        SSE (or ?format=ndjson), resumable by
 *                                    Last-Event-ID or ?since=N
 *   GET  /v1/jobs/{id}/metrics       step history
 *   POST /v1/tokenize                ids, token strings, loss mask (api_tokenize.c)
 *
 * The app pointer of the server is the jobs manager. Handlers run on the
 * loop thread and never block.
 */
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_http.h"
#include "jobs.h"

static void resp_json_obj(api_response *resp, int status, json_t *o)
{
    char *text = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(10)) : NULL;
    json_decref(o);
    if (text == NULL) {
        api_resp_error(resp, 500, "internal", NULL, "out of memory");
        return;
    }
    size_t n = strlen(text);
    char *nl = realloc(text, n + 2); /* a newline, for terminals after curl */
    if (nl != NULL) {
        text = nl;
        text[n++] = '\n';
        text[n] = '\0';
    }
    free(resp->body);
    resp->status = status;
    resp->content_type = "application/json";
    resp->body = text;
    resp->body_len = n;
}

static const char *query(const api_request *req, const char *key)
{
    return MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, key);
}

static bool is_method(const api_request *req, const char *m) { return !strcmp(req->method, m); }

static void method_not_allowed(const api_request *req, api_response *resp, const char *allow)
{
    api_resp_error(resp, 405, "method_not_allowed", NULL, "%s %s: allowed: %s", req->method, req->path, allow);
    resp->allow = allow;
}

static bool flag_on(const char *v)
{
    return v != NULL && (!strcmp(v, "1") || !strcmp(v, "true") || !strcmp(v, "yes") || v[0] == '\0');
}

/* ---- /healthz, /metrics, /v1/devices --------------------------------------- */

static void route_metrics(api_server *s, const api_request *req, api_response *resp)
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

static void route_devices(api_server *s, const api_request *req, api_response *resp)
{
    const jobs_mgr *m = api_server_app(s);
    json_t *a = json_array();
    for (int i = 0; a != NULL && i < m->ndev; i++) {
        const kern_device_info *d = &m->devs[i];
        const job *h = m->dev_holder[i];
        json_t *o = json_pack("{s:i, s:s, s:i, s:s, s:I, s:I, s:I, s:o}", "id", i, "kind",
                              d->kind == KERN_DEV_CUDA ? "cuda" : "cpu", "index", d->index, "name", d->name,
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
            json_object_set_new(o, "memory_free_bytes", fr || d->kind == KERN_DEV_CPU
                                                             ? json_integer((json_int_t)fr)
                                                             : json_null());
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

static void route_list(api_server *s, const api_request *req, api_response *resp)
{
    jobs_mgr *m = api_server_app(s);
    const char *state = query(req, "state");
    int want = -1;
    if (state != NULL && (want = job_state_parse(state)) < 0) {
        api_resp_error(resp, 400, "invalid", "state",
                       "state must be queued, running, succeeded, failed or cancelled, got '%s'", state);
        return;
    }
    json_t *a = json_array();
    for (size_t i = 0; a != NULL && i < m->njobs; i++)
        if (want < 0 || (int)m->jobs[i]->state == want)
            json_array_append_new(a, job_to_json(m->jobs[i], false, m->devs));
    resp_json_obj(resp, 200, json_pack("{s:o}", "jobs", a ? a : json_array()));
}

static void route_submit(api_server *s, const api_request *req, api_response *resp)
{
    jobs_mgr *m = api_server_app(s);
    bool dry = flag_on(query(req, "dry_run"));
    acc_err err = {0};
    job *j = NULL;
    json_t *plan = NULL;
    if (req->body_len == 0) {
        api_resp_error(resp, 400, "invalid", NULL, "empty body: send the job spec as JSON");
        return;
    }
    if (jobs_submit(m, req->body, req->body_len, dry, &j, &plan, &err) != 0) {
        api_resp_from_err(resp, &err);
        return;
    }
    if (dry) {
        resp_json_obj(resp, 200, plan);
        return;
    }
    snprintf(resp->location, sizeof resp->location, "/v1/jobs/%s", j->id);
    resp_json_obj(resp, 201, job_to_json(j, true, m->devs));
}

/* "/v1/jobs/{id}[/tail]": the job and the tail ("", "events", "metrics"). */
static job *job_of_path(jobs_mgr *m, const char *rest, char *tail, size_t n)
{
    char id[32];
    const char *slash = strchr(rest, '/');
    size_t il = slash ? (size_t)(slash - rest) : strlen(rest);
    if (il == 0 || il >= sizeof id)
        return NULL;
    memcpy(id, rest, il);
    id[il] = '\0';
    snprintf(tail, n, "%s", slash ? slash + 1 : "");
    return jobs_find(m, id);
}

/* Where a stream starts: Last-Event-ID (last seen) or ?since=N (last seen),
 * else the oldest event held. */
static int stream_start(const api_request *req, uint64_t *from, api_response *resp)
{
    const char *last = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, "Last-Event-ID");
    const char *since = query(req, "since");
    const char *v = last ? last : since;
    *from = 1;
    if (v == NULL)
        return 0;
    char *end;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || v[0] == '-') {
        api_resp_error(resp, 400, "invalid", last ? "Last-Event-ID" : "since",
                       "%s must be a non-negative event sequence number, got '%s'", last ? "Last-Event-ID" : "since",
                       v);
        return -1;
    }
    *from = (uint64_t)n + 1;
    return 0;
}

static void route_events(api_server *s, const api_request *req, api_response *resp, job *j)
{
    const char *format = query(req, "format");
    if (format != NULL && strcmp(format, "sse") && strcmp(format, "ndjson")) {
        api_resp_error(resp, 400, "invalid", "format", "format must be sse or ndjson, got '%s'", format);
        return;
    }
    uint64_t from;
    if (stream_start(req, &from, resp) != 0)
        return;
    resp->stream = api_stream_new(s, req->conn, &j->ring, from, format && !strcmp(format, "ndjson"));
    if (resp->stream == NULL)
        api_resp_error(resp, 500, "internal", NULL, "out of memory");
}

static void route_job(api_server *s, const api_request *req, api_response *resp, const char *rest)
{
    jobs_mgr *m = api_server_app(s);
    char tail[64];
    job *j = job_of_path(m, rest, tail, sizeof tail);
    if (j == NULL) {
        api_resp_error(resp, 404, "not_found", NULL, "no job '%.*s'", (int)strcspn(rest, "/"), rest);
        return;
    }
    if (!strcmp(tail, "events") || !strcmp(tail, "metrics")) {
        if (!is_method(req, "GET")) {
            method_not_allowed(req, resp, "GET");
            return;
        }
        if (tail[0] == 'e')
            route_events(s, req, resp, j);
        else
            resp_json_obj(resp, 200, job_metrics_json(j));
        return;
    }
    if (tail[0] != '\0') {
        api_resp_error(resp, 404, "not_found", NULL, "no route for %s %s", req->method, req->path);
        return;
    }
    if (is_method(req, "GET")) {
        resp_json_obj(resp, 200, job_to_json(j, true, m->devs));
        return;
    }
    if (!is_method(req, "DELETE")) {
        method_not_allowed(req, resp, "GET, DELETE");
        return;
    }
    acc_err err = {0};
    if (jobs_cancel(m, j, &err) != 0) {
        api_resp_from_err(resp, &err);
        return;
    }
    json_t *o = job_to_json(j, false, m->devs);
    if (o != NULL)
        json_object_set_new(o, "cancel_requested", json_true());
    resp_json_obj(resp, job_state_final(j->state) ? 200 : 202, o);
}

void api_route(api_server *s, const api_request *req, api_response *resp)
{
    const char *p = req->path;
    bool get = is_method(req, "GET") || is_method(req, "HEAD");
    if (!strcmp(p, "/healthz")) {
        if (get)
            api_resp_json(resp, 200, "{\"status\":\"ok\"}\n");
        else
            method_not_allowed(req, resp, "GET, HEAD");
    } else if (!strcmp(p, "/metrics")) {
        if (get)
            route_metrics(s, req, resp);
        else
            method_not_allowed(req, resp, "GET");
    } else if (!strcmp(p, "/v1/devices")) {
        if (get)
            route_devices(s, req, resp);
        else
            method_not_allowed(req, resp, "GET");
    } else if (!strcmp(p, "/v1/jobs") || !strcmp(p, "/v1/jobs/")) {
        if (get)
            route_list(s, req, resp);
        else if (is_method(req, "POST"))
            route_submit(s, req, resp);
        else
            method_not_allowed(req, resp, "GET, POST");
    } else if (!strncmp(p, "/v1/jobs/", 9)) {
        route_job(s, req, resp, p + 9);
    } else if (!strcmp(p, "/v1/tokenize")) {
        if (is_method(req, "POST"))
            api_tokenize(s, req, resp);
        else
            method_not_allowed(req, resp, "POST");
    } else {
        api_resp_error(resp, 404, "not_found", NULL, "no route for %s %s", req->method, req->path);
    }
}
