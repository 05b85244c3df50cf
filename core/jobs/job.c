/* job: see job.h. */
#include "job.h"

#include "ckpt.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

static const char *const state_names[JOB_NSTATES] = {"queued", "running", "succeeded", "failed", "cancelled"};

const char *job_state_name(job_state s) { return s < JOB_NSTATES ? state_names[s] : "unknown"; }

int job_state_parse(const char *name)
{
    for (int i = 0; i < JOB_NSTATES; i++)
        if (!strcmp(name, state_names[i]))
            return i;
    return -1;
}

bool job_id_valid(const char *s, size_t len)
{
    if (len < 7 || len >= 32 || s[0] != 'j')
        return false;
    for (size_t i = 1; i < len; i++)
        if (s[i] < '0' || s[i] > '9')
            return false;
    return true;
}

bool job_state_final(job_state s) { return s == JOB_SUCCEEDED || s == JOB_FAILED || s == JOB_CANCELLED; }

double job_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

json_t *job_time_json(double t)
{
    if (t <= 0)
        return json_null();
    time_t s = (time_t)t;
    struct tm tm;
    char buf[64];
    gmtime_r(&s, &tm);
    size_t n = strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, sizeof buf - n, ".%03dZ", (int)((t - (double)s) * 1000) % 1000);
    return json_string(buf);
}

int job_add_metric(job *j, const job_metric *m, acc_err *err)
{
    /* a run that resumed (or restarted) redoes steps: their new figures
     * replace the old ones, so the history stays one entry per step */
    while (j->nmetrics > 0 && j->metrics[j->nmetrics - 1].step >= m->step)
        j->nmetrics--;
    if (j->nmetrics == j->cap_metrics) {
        size_t cap = j->cap_metrics ? j->cap_metrics * 2 : 64;
        job_metric *nm = realloc(j->metrics, cap * sizeof *nm);
        if (nm == NULL)
            return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory for metrics");
        j->metrics = nm;
        j->cap_metrics = cap;
    }
    j->metrics[j->nmetrics++] = *m;
    return 0;
}

int job_add_output(job *j, const char *path, int keep, acc_err *err)
{
    if (keep < 1 || keep > JOB_MAX_OUTPUTS)
        keep = JOB_MAX_OUTPUTS;
    char *dup = strdup(path);
    if (dup == NULL)
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    for (int i = 0; i < j->noutputs; i++) /* a step redone after a resume: the same path */
        if (!strcmp(j->outputs[i], path)) {
            free(j->outputs[i]);
            memmove(&j->outputs[i], &j->outputs[i + 1], (size_t)(j->noutputs - i - 1) * sizeof *j->outputs);
            j->noutputs--;
            break;
        }
    while (j->noutputs >= keep) { /* pruned by the trainer too */
        free(j->outputs[0]);
        memmove(&j->outputs[0], &j->outputs[1], (size_t)(j->noutputs - 1) * sizeof *j->outputs);
        j->noutputs--;
    }
    j->outputs[j->noutputs++] = dup;
    return 0;
}

void job_free_outputs(job *j)
{
    for (int i = 0; i < j->noutputs; i++)
        free(j->outputs[i]);
    j->noutputs = 0;
}

static json_t *outputs_array(const job *j)
{
    json_t *a = json_array();
    for (int i = 0; a != NULL && i < j->noutputs; i++)
        json_array_append_new(a, json_string(j->outputs[i]));
    return a;
}

void job_export_dir(const job *j, const char *output_root, char *buf, size_t n)
{
    if (j->spec.output_name[0] == '\0') {
        snprintf(buf, n, "%s/%s/export", output_root, j->id);
        return;
    }
    const char *o = j->owner;
    bool plain = o[0] != '\0' && o[0] != '.';
    for (const char *c = o; plain && *c; c++)
        plain = isalnum((unsigned char)*c) || strchr("._-", *c) != NULL;
    if (snprintf(buf, n, "%s/%s/%s", output_root, plain ? o : "_", j->spec.output_name) >= (int)n)
        buf[0] = '\0'; /* too long: no export (the spec's 255 bytes and a sane root fit) */
}

/* The final model is the checkpoint of the last step (written at the end).
 * LoRA: that directory is the PEFT adapter ("adapter"), and with
 * save.merge_lora its "merged" subdirectory the merged model (ckpt.h). */
static json_t *outputs_json(const job *j)
{
    bool final = j->state == JOB_SUCCEEDED && j->noutputs > 0;
    const char *dir = final ? j->outputs[j->noutputs - 1] : NULL;
    json_t *o = json_pack("{s:o, s:o}", "model", dir ? json_string(dir) : json_null(), "checkpoints",
                          outputs_array(j));
    char ex[PATH_MAX]; /* written with the final checkpoint */
    job_export_dir(j, j->spec.output_root, ex, sizeof ex);
    if (o != NULL)
        json_object_set_new(o, "export", final && ex[0] ? json_string(ex) : json_null());
    if (o == NULL || j->spec.lora.r == 0)
        return o;
    json_t *merged = json_null();
    if (dir != NULL && j->spec.merge_lora) {
        char *p = NULL;
        if (asprintf(&p, "%s/" CKPT_MERGED_DIR, dir) >= 0) {
            merged = json_string(p);
            free(p);
        }
    }
    json_object_set_new(o, "adapter", dir ? json_string(dir) : json_null());
    json_object_set_new(o, "merged", merged ? merged : json_null());
    return o;
}

/* JSON has no NaN: a diverged loss is reported as null. */
static json_t *num_or_null(double x) { return isfinite(x) ? json_real(x) : json_null(); }

static json_t *batch_json(const job *j)
{
    return json_pack("{s:i, s:i, s:i, s:i, s:b}", "train_batch_size", j->spec.train_batch_size, "micro_batch",
                     j->cur_micro, "accum_steps", j->cur_accum, "world", j->spec.devices, "micro_auto",
                     j->spec.micro_auto);
}

static json_t *devices_json(const job *j, const kern_device_info *devs)
{
    if (j->ndev == 0 && j->record_devices != NULL && job_state_final(j->state)) {
        json_t *rec = json_loads(j->record_devices, 0, NULL); /* as it ran, before a restart */
        if (json_is_array(rec))
            return rec;
        json_decref(rec);
    }
    json_t *a = json_array();
    for (int i = 0; a != NULL && i < j->ndev; i++)
        json_array_append_new(a, json_string(devs[j->dev_idx[i]].name));
    return a;
}

/* The job's host memory next to its device figures: what it needs and
 * holds reserved while it runs, its trainer's host_mem (budget, in use,
 * peak: the last step's), and whether it waits for host memory. */
static json_t *host_json(const job *j)
{
    bool active = j->tr != NULL || j->worker != NULL;
    return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:b, s:o}", "needed_bytes", (json_int_t)j->host_bytes,
                     "per_rank_bytes", (json_int_t)j->host_per_rank, "reserved_bytes",
                     (json_int_t)(active ? j->host_bytes : 0), "budget_bytes", (json_int_t)j->host_budget,
                     "in_use_bytes", (json_int_t)j->host_in_use, "peak_bytes", (json_int_t)j->host_peak, "waiting",
                     j->host_waiting, "wait_reason", j->host_waiting ? json_string(j->host_wait_msg) : json_null());
}

json_t *job_to_json(const job *j, bool full, const kern_device_info *devs)
{
    json_t *o = json_pack("{s:s, s:s, s:s, s:i, s:o, s:o, s:o, s:i, s:i, s:o, s:o, s:s, s:o, s:i, s:I}", "id",
                          j->id, "name", j->spec.name, "state", job_state_name(j->state), "priority", j->spec.priority,
                          "submitted_at", job_time_json(j->submitted_at), "started_at", job_time_json(j->started_at),
                          "finished_at", job_time_json(j->finished_at), "step", j->step, "max_steps",
                          j->spec.max_steps, "loss", j->have_loss ? num_or_null(j->last_loss) : json_null(),
                          "batch", batch_json(j), "precision", spec_precision_name(j->spec.precision),
                          "devices", devices_json(j, devs), "restarts", j->restarts + j->worker_restarts,
                          "last_event", (json_int_t)(j->ring.next_seq - 1));
    if (o == NULL)
        return NULL;
    json_object_set_new(o, "owner", j->owner[0] ? json_string(j->owner) : json_null());
    json_object_set_new(o, "worker_restarts", json_integer(j->worker_restarts));
    /* a running job's cancel, as stored (jobs_cancel) */
    json_object_set_new(o, "cancel_requested", json_boolean(j->cancel_requested));
    json_object_set_new(o, "cancel_requested_at", job_time_json(j->cancel_requested_at));
    if (j->err_msg[0])
        json_object_set_new(o, "error", json_pack("{s:s, s:s}", "code", j->err_code, "message", j->err_msg));
    else
        json_object_set_new(o, "error", json_null());
    json_object_set_new(o, "host_memory", host_json(j));
    if (full) {
        json_t *spec = json_loads(j->spec_json, 0, NULL);
        json_object_set_new(o, "spec", spec ? spec : json_null());
        json_object_set_new(o, "outputs", outputs_json(j));
    }
    return o;
}

const char *job_view(job *j, bool full, const kern_device_info *devs, size_t *len)
{
    int k = full ? 1 : 0;
    if (j->view[k] == NULL) {
        json_t *o = job_to_json(j, full, devs);
        j->view[k] = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(10)) : NULL;
        json_decref(o);
        j->view_len[k] = j->view[k] ? strlen(j->view[k]) : 0;
    }
    *len = j->view_len[k];
    return j->view[k];
}

void job_view_invalidate(job *j)
{
    for (int k = 0; k < 2; k++) {
        free(j->view[k]);
        j->view[k] = NULL;
        j->view_len[k] = 0;
    }
}

/* What a final job's view shows from its spec, as it ran (job.h). */
static json_t *record_json(const job *j)
{
    json_t *devs = j->record_devices ? json_loads(j->record_devices, 0, NULL) : NULL;
    return json_pack("{s:s, s:i, s:i, s:s, s:i, s:b, s:i, s:b, s:i, s:o}", "name", j->spec.name, "priority",
                     j->spec.priority, "max_steps", j->spec.max_steps, "precision",
                     spec_precision_name(j->spec.precision), "train_batch_size", j->spec.train_batch_size,
                     "micro_auto", j->spec.micro_auto, "world", j->spec.devices, "merge_lora", j->spec.merge_lora,
                     "lora_r", j->spec.lora.r, "devices", json_is_array(devs) ? devs : json_array());
}

/* A final job's record back over what the spec, read again, said. */
static void record_apply(job *j, const json_t *rec)
{
    const char *name = json_string_value(json_object_get(rec, "name"));
    const char *prec = json_string_value(json_object_get(rec, "precision"));
    if (name != NULL)
        snprintf(j->spec.name, sizeof j->spec.name, "%s", name);
    for (int p = SPEC_FP32; prec != NULL && p <= SPEC_BF16; p++)
        if (!strcmp(prec, spec_precision_name((spec_precision)p)))
            j->spec.precision = (spec_precision)p;
    const struct { const char *key; int *to; } ints[] = {
        {"priority", &j->spec.priority}, {"max_steps", &j->spec.max_steps},
        {"train_batch_size", &j->spec.train_batch_size}, {"world", &j->spec.devices}, {"lora_r", &j->spec.lora.r}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        json_t *v = json_object_get(rec, ints[i].key);
        if (json_is_integer(v))
            *ints[i].to = (int)json_integer_value(v);
    }
    json_t *b = json_object_get(rec, "micro_auto");
    if (json_is_boolean(b))
        j->spec.micro_auto = json_is_true(b);
    if (json_is_boolean(b = json_object_get(rec, "merge_lora")))
        j->spec.merge_lora = json_is_true(b);
    json_t *devs = json_object_get(rec, "devices");
    free(j->record_devices);
    j->record_devices = json_is_array(devs) ? json_dumps(devs, JSON_COMPACT) : NULL;
}

json_t *job_status_json(const job *j)
{
    json_t *o = json_pack("{s:s, s:s, s:I, s:f, s:f, s:f, s:i, s:o, s:i, s:i, s:s, s:s, s:i, s:o}", "id", j->id, "state",
                     job_state_name(j->state), "submit_seq", (json_int_t)j->submit_seq, "submitted_at",
                     j->submitted_at, "started_at", j->started_at, "finished_at", j->finished_at, "step", j->step,
                     "loss", j->have_loss ? num_or_null(j->last_loss) : json_null(), "micro_batch", j->cur_micro,
                     "accum_steps", j->cur_accum, "error_code", j->err_code, "error", j->err_msg, "restarts",
                     j->restarts, "outputs", outputs_array(j));
    if (o != NULL && j->owner[0])
        json_object_set_new(o, "owner", json_string(j->owner));
    if (o != NULL && (j->worker_restarts > 0 || j->crash_step >= 0)) {
        json_object_set_new(o, "worker_restarts", json_integer(j->worker_restarts));
        json_object_set_new(o, "crash_step", json_integer(j->crash_step));
    }
    if (o != NULL && j->cancel_requested_at > 0)
        json_object_set_new(o, "cancel_requested_at", json_real(j->cancel_requested_at));
    if (o != NULL)
        json_object_set_new(o, "record", record_json(j));
    /* the job's unique id: its checkpoints carry it (ckpt.h) */
    if (o != NULL && j->spec.job_uid[0] != '\0') {
        json_object_set_new(o, "uid", json_string(j->spec.job_uid));
        if (j->spec.adopt_unnamed)
            json_object_set_new(o, "uid_adopts_unnamed", json_true());
    }
    return o;
}

void job_status_apply(job *j, const json_t *st)
{
    const char *state = json_string_value(json_object_get(st, "state"));
    int s = state ? job_state_parse(state) : -1;
    j->state = s >= 0 ? (job_state)s : JOB_QUEUED;
    j->submit_seq = (uint64_t)json_integer_value(json_object_get(st, "submit_seq"));
    j->submitted_at = json_number_value(json_object_get(st, "submitted_at"));
    j->started_at = json_number_value(json_object_get(st, "started_at"));
    j->finished_at = json_number_value(json_object_get(st, "finished_at"));
    j->step = (int)json_integer_value(json_object_get(st, "step"));
    json_t *loss = json_object_get(st, "loss");
    j->have_loss = json_is_number(loss);
    j->last_loss = json_number_value(loss);
    int m = (int)json_integer_value(json_object_get(st, "micro_batch"));
    int a = (int)json_integer_value(json_object_get(st, "accum_steps"));
    if (m > 0 && a > 0) {
        j->cur_micro = m;
        j->cur_accum = a;
    }
    snprintf(j->err_code, sizeof j->err_code, "%s", json_string_value(json_object_get(st, "error_code")) ?: "");
    snprintf(j->err_msg, sizeof j->err_msg, "%s", json_string_value(json_object_get(st, "error")) ?: "");
    j->restarts = (int)json_integer_value(json_object_get(st, "restarts"));
    j->worker_restarts = (int)json_integer_value(json_object_get(st, "worker_restarts"));
    json_t *cs = json_object_get(st, "crash_step");
    j->crash_step = json_is_integer(cs) ? (int)json_integer_value(cs) : -1;
    json_t *outs = json_object_get(st, "outputs"), *o;
    size_t i;
    job_free_outputs(j);
    json_array_foreach(outs, i, o) if (json_is_string(o))
        job_add_output(j, json_string_value(o), JOB_MAX_OUTPUTS, NULL);
    snprintf(j->owner, sizeof j->owner, "%s", json_string_value(json_object_get(st, "owner")) ?: "");
    json_t *cr = json_object_get(st, "cancel_requested_at");
    j->cancel_requested_at = json_is_number(cr) ? json_number_value(cr) : 0;
    j->cancel_requested = j->cancel_requested_at > 0;
    json_t *rec = json_object_get(st, "record");
    if (json_is_object(rec) && job_state_final(j->state))
        record_apply(j, rec);
    const char *uid = json_string_value(json_object_get(st, "uid"));
    if (uid != NULL && job_uid_valid(uid)) {
        snprintf(j->spec.job_uid, sizeof j->spec.job_uid, "%s", uid);
        j->spec.adopt_unnamed = json_is_true(json_object_get(st, "uid_adopts_unnamed"));
    }
}

bool job_uid_valid(const char *uid)
{
    size_t n = strlen(uid);
    if (n != JOB_UID_HEX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((uid[i] >= '0' && uid[i] <= '9') || (uid[i] >= 'a' && uid[i] <= 'f')))
            return false;
    return true;
}

int job_uid_mint(char *out, size_t n, acc_err *err)
{
    uint8_t b[JOB_UID_HEX / 2];
    size_t got = 0;
    while (got < sizeof b) {
        ssize_t r = getrandom(b + got, sizeof b - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return acc_err_set(err, ACC_EINTERNAL, NULL, "getrandom: %s", strerror(errno));
        got += (size_t)r;
    }
    if (n < JOB_UID_HEX + 1)
        return acc_err_set(err, ACC_EINTERNAL, NULL, "uid buffer too small");
    for (size_t i = 0; i < sizeof b; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
    return 0;
}

json_t *job_metrics_json(const job *j)
{
    json_t *steps = json_array();
    for (size_t i = 0; steps != NULL && i < j->nmetrics; i++) {
        const job_metric *m = &j->metrics[i];
        json_array_append_new(steps, json_pack("{s:i, s:o, s:o, s:o, s:o, s:o, s:i, s:i, s:I}", "step", m->step,
                                               "time", job_time_json(m->time), "loss", num_or_null(m->loss), "lr",
                                               num_or_null(m->lr), "grad_norm", num_or_null(m->grad_norm),
                                               "tokens_per_s", num_or_null(m->tokens_per_s), "micro_batch",
                                               m->micro_batch, "accum_steps", m->accum_steps, "mem_peak_bytes",
                                               (json_int_t)m->mem_peak));
    }
    return json_pack("{s:s, s:s, s:i, s:o}", "id", j->id, "state", job_state_name(j->state), "step", j->step,
                     "steps", steps ? steps : json_array());
}
