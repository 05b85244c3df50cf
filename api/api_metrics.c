/* api_metrics: GET /metrics, the Prometheus text exposition format 0.0.4.
 *
 * Names carry the accumd_ prefix and base units (bytes, seconds); counters
 * end in _total. Job labels are escaped as the format asks (\\, \", \n).
 */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_http.h"
#include "jobs.h"
#include "genq.h"

typedef struct mbuf {
    char *p;
    size_t len, cap;
    bool failed;
} mbuf;

static void put(mbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void put(mbuf *b, const char *fmt, ...)
{
    if (b->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = true;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)n;
        char *np = realloc(b->p, cap);
        if (np == NULL) {
            b->failed = true;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
}

static void head(mbuf *b, const char *name, const char *type, const char *help)
{
    put(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value with \, " and newlines escaped. */
static void escape_label(const char *in, char *out, size_t n)
{
    size_t k = 0;
    for (; *in && k + 3 < n; in++) {
        if (*in == '\\' || *in == '"') {
            out[k++] = '\\';
            out[k++] = *in;
        } else if (*in == '\n') {
            out[k++] = '\\';
            out[k++] = 'n';
        } else {
            out[k++] = *in;
        }
    }
    out[k] = '\0';
}

static void jobs_section(mbuf *b, const jobs_mgr *m)
{
    int counts[JOB_NSTATES];
    jobs_count_states(m, counts);
    head(b, "accumd_jobs", "gauge", "Jobs known to the daemon, by state.");
    for (int s = 0; s < JOB_NSTATES; s++)
        put(b, "accumd_jobs{state=\"%s\"} %d\n", job_state_name((job_state)s), counts[s]);
    head(b, "accumd_jobs_submitted_total", "counter", "Jobs accepted since the daemon started.");
    put(b, "accumd_jobs_submitted_total %llu\n", (unsigned long long)m->submitted_total);
    head(b, "accumd_steps_total", "counter", "Optimizer steps completed since the daemon started.");
    put(b, "accumd_steps_total %llu\n", (unsigned long long)m->steps_total);
    head(b, "accumd_tokens_total", "counter", "Training tokens processed since the daemon started.");
    put(b, "accumd_tokens_total %llu\n", (unsigned long long)m->tokens_total);
    head(b, "accumd_oom_adjustments_total", "counter", "Micro-batch splits changed after an out-of-memory.");
    put(b, "accumd_oom_adjustments_total %llu\n", (unsigned long long)m->oom_adjust_total);
    head(b, "accumd_worker_failures_total", "counter",
         "Job worker processes that ended without reporting, by cause (signal, exit, heartbeat, protocol, start).");
    for (int c = 0; c < JOBS_WFAIL_N; c++)
        put(b, "accumd_worker_failures_total{cause=\"%s\"} %llu\n", jobs_wfail_names[c],
            (unsigned long long)m->worker_failures[c]);
    head(b, "accumd_worker_restarts_total", "counter", "Jobs requeued after their worker died (max_restarts).");
    put(b, "accumd_worker_restarts_total %llu\n", (unsigned long long)m->worker_restarts_total);
    head(b, "accumd_job_loss", "gauge", "Last training loss of each running job.");
    for (size_t i = 0; i < m->njobs; i++) {
        const job *j = m->jobs[i];
        char name[300];
        if (j->state != JOB_RUNNING || !j->have_loss || !isfinite(j->last_loss))
            continue;
        escape_label(j->spec.name, name, sizeof name);
        put(b, "accumd_job_loss{job=\"%s\",name=\"%s\"} %.9g\n", j->id, name, j->last_loss);
    }
    head(b, "accumd_job_step", "gauge", "Optimizer steps completed by each running job.");
    for (size_t i = 0; i < m->njobs; i++)
        if (m->jobs[i]->state == JOB_RUNNING)
            put(b, "accumd_job_step{job=\"%s\"} %d\n", m->jobs[i]->id, m->jobs[i]->step);
}

/* Jobs by user and state, and the devices each user holds: one series per
 * owner that has jobs (jobs from before users have no owner: not shown). */
static void users_section(mbuf *b, const jobs_mgr *m)
{
    size_t n = m->njobs, nu = 0;
    const char **names = calloc(n ? n : 1, sizeof *names);
    int *counts = calloc(n ? n : 1, (JOB_NSTATES + 1) * sizeof *counts); /* calloc checks n * size */
    if (names == NULL || counts == NULL) {
        free(names);
        free(counts);
        b->failed = true;
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const job *j = m->jobs[i];
        if (j->owner[0] == '\0')
            continue;
        size_t u = 0;
        while (u < nu && strcmp(names[u], j->owner) != 0)
            u++;
        if (u == nu)
            names[nu++] = j->owner;
        counts[u * (JOB_NSTATES + 1) + j->state]++;
        if (jobs_job_active(j))
            counts[u * (JOB_NSTATES + 1) + JOB_NSTATES] += j->ndev;
    }
    char name[200];
    head(b, "accumd_user_jobs", "gauge", "Jobs known to the daemon, by owner and state.");
    for (size_t u = 0; u < nu; u++) {
        escape_label(names[u], name, sizeof name);
        for (int s = 0; s < JOB_NSTATES; s++)
            put(b, "accumd_user_jobs{user=\"%s\",state=\"%s\"} %d\n", name, job_state_name((job_state)s),
                counts[u * (JOB_NSTATES + 1) + s]);
    }
    head(b, "accumd_user_devices", "gauge", "Devices held by each owner's running jobs.");
    for (size_t u = 0; u < nu; u++) {
        escape_label(names[u], name, sizeof name);
        put(b, "accumd_user_devices{user=\"%s\"} %d\n", name, counts[u * (JOB_NSTATES + 1) + JOB_NSTATES]);
    }
    free(names);
    free(counts);
}

static void store_section(mbuf *b, const jobs_mgr *m)
{
    head(b, "accumd_store_up", "gauge", "1 when the job store writes, 0 when it is read-only or failing.");
    put(b, "accumd_store_up %d\n", !m->st.degraded && !m->st.failing);
    head(b, "accumd_store_read_only", "gauge", "1 when the job store opened read-only (damaged or unwritable).");
    put(b, "accumd_store_read_only %d\n", m->st.degraded);
    head(b, "accumd_store_write_errors_total", "counter", "Job store writes that failed since the daemon started.");
    put(b, "accumd_store_write_errors_total %llu\n", (unsigned long long)m->st.write_errors);
    head(b, "accumd_store_pending_state_changes", "gauge", "Job state changes waiting for the store to write.");
    put(b, "accumd_store_pending_state_changes %zu\n", m->npending);
}

static void devices_section(mbuf *b, const jobs_mgr *m)
{
    static const char *const names[3] = {"accumd_device_memory_total_bytes", "accumd_device_memory_in_use_bytes",
                                         "accumd_device_memory_peak_bytes"};
    static const char *const helps[3] = {"Memory of the device (GPU memory or CPU device budget).",
                                         "Device memory in use by the job on it.",
                                         "Largest device memory in use seen since the daemon started."};
    for (int k = 0; k < 3; k++) {
        head(b, names[k], "gauge", helps[k]);
        for (int i = 0; i < m->ndev; i++) {
            uint64_t v = k == 0 ? m->devs[i].mem_total : k == 1 ? m->dev_mem_in_use[i] : m->dev_mem_peak[i];
            put(b, "%s{device=\"%s\",kind=\"%s\"} %llu\n", names[k], m->devs[i].name,
                kern_dev_kind_name(m->devs[i].kind), (unsigned long long)v);
        }
    }
}

/* Host memory (config host_memory): the limit, what the running jobs hold
 * reserved, and each running job's reservation and host_mem in use / peak. */
static void host_section(mbuf *b, const jobs_mgr *m)
{
    head(b, "accumd_host_memory_bytes", "gauge", "Host memory jobs may hold at once (host_memory; 0 = no limit).");
    put(b, "accumd_host_memory_bytes %llu\n", (unsigned long long)m->conf->host_memory);
    head(b, "accumd_host_memory_reserved_bytes", "gauge", "Host memory reserved by the running jobs.");
    put(b, "accumd_host_memory_reserved_bytes %llu\n", (unsigned long long)jobs_host_reserved(m));
    static const char *const names[3] = {"accumd_job_host_memory_reserved_bytes", "accumd_job_host_memory_in_use_bytes",
                                         "accumd_job_host_memory_peak_bytes"};
    static const char *const helps[3] = {"Host memory reserved by each running job.",
                                         "Host memory each running job holds by choice (offloaded state), last step.",
                                         "Most host memory each running job held by choice, last step."};
    for (int k = 0; k < 3; k++) {
        head(b, names[k], "gauge", helps[k]);
        for (size_t i = 0; i < m->njobs; i++) {
            const job *j = m->jobs[i];
            if (!jobs_job_active(j))
                continue;
            uint64_t v = k == 0 ? j->host_bytes : k == 1 ? j->host_in_use : j->host_peak;
            put(b, "%s{job=\"%s\"} %llu\n", names[k], j->id, (unsigned long long)v);
        }
    }
}

static void http_section(mbuf *b, const api_server *s)
{
    head(b, "accumd_http_requests_total", "counter", "HTTP requests answered, by status code.");
    for (int code = 100; code < 600; code++) {
        uint64_t n = api_server_count(s, code);
        if (n > 0)
            put(b, "accumd_http_requests_total{code=\"%d\"} %llu\n", code, (unsigned long long)n);
    }
    head(b, "accumd_http_connections_closed_total", "counter",
         "Connections closed for sending their request too slowly (header_timeout, request_timeout) "
         "or to keep a reserve (max_pending_connections).");
    put(b, "accumd_http_connections_closed_total %llu\n", (unsigned long long)api_server_evicted(s));
}

/* POST /v1/generate's requests (genq.h). */
static void generate_section(mbuf *b, const jobs_mgr *m)
{
    const genq *q = m->gen;
    if (q == NULL)
        return;
    const genq_stats *st = &q->stats;
    head(b, "accumd_generate_requests_total", "counter", "Generate requests queued, by how they ended.");
    put(b, "accumd_generate_requests_total{result=\"completed\"} %llu\n", (unsigned long long)st->completed);
    put(b, "accumd_generate_requests_total{result=\"failed\"} %llu\n", (unsigned long long)st->failed);
    put(b, "accumd_generate_requests_total{result=\"cancelled\"} %llu\n", (unsigned long long)st->cancelled);
    head(b, "accumd_generate_queued", "gauge", "Generate requests waiting for a device.");
    put(b, "accumd_generate_queued %d\n", q->nqueued);
    head(b, "accumd_generate_running", "gauge", "Generate requests running on a device.");
    put(b, "accumd_generate_running %d\n", q->nrunning);
    head(b, "accumd_generate_tokens_total", "counter", "Tokens generated by completed generate requests.");
    put(b, "accumd_generate_tokens_total %llu\n", (unsigned long long)st->tokens);
    head(b, "accumd_generate_queue_seconds_total", "counter",
         "Seconds generate requests waited for a device, summed over the ended ones.");
    put(b, "accumd_generate_queue_seconds_total %.6f\n", st->queue_seconds);
    head(b, "accumd_generate_run_seconds_total", "counter",
         "Seconds generate requests ran on a device, summed over the ended ones.");
    put(b, "accumd_generate_run_seconds_total %.6f\n", st->run_seconds);
}

char *api_metrics_text(api_server *s, size_t *len)
{
    const jobs_mgr *m = api_server_app(s);
    mbuf b = {.p = malloc(8192), .cap = 8192};
    if (b.p == NULL)
        return NULL;
    b.p[0] = '\0';
    jobs_section(&b, m);
    users_section(&b, m);
    store_section(&b, m);
    devices_section(&b, m);
    host_section(&b, m);
    http_section(&b, s);
    generate_section(&b, m);
    if (b.failed) {
        free(b.p);
        return NULL;
    }
    *len = b.len;
    return b.p;
}
