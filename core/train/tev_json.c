/* tev_json: trainer events as JSON objects (see tev_json.h). */
#include "tev_json.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *const kind_names[] = {
    [TEV_STEP] = "step",
    [TEV_EVAL] = "eval",
    [TEV_OOM_ADJUST] = "oom_adjust",
    [TEV_CHECKPOINT] = "checkpoint",
    [TEV_LOG] = "log",
    [TEV_SPLIT_UP] = "split_adjust",
    [TEV_DONE] = "done",
    [TEV_CKPT_REJECTED] = "checkpoint_rejected",
    [TEV_PROGRESS] = "progress",
    [TEV_SAMPLE] = "sample",
};
#define NKINDS ((int)(sizeof kind_names / sizeof kind_names[0]))

const char *tev_kind_name(train_event_kind k)
{
    return (int)k >= 0 && (int)k < NKINDS ? kind_names[k] : NULL;
}

/* ---- encode */

static int set_new(json_t *o, const char *key, json_t *v)
{
    return v == NULL ? -1 : json_object_set_new(o, key, v);
}

static int put_real(json_t *o, const char *key, double v)
{
    return set_new(o, key, isfinite(v) ? json_real(v) : json_null());
}

static int put_int(json_t *o, const char *key, long long v) { return set_new(o, key, json_integer(v)); }

/* uint64 counts: saturated into JSON's signed 64 bits */
static int put_u64(json_t *o, const char *key, uint64_t v)
{
    return put_int(o, key, v > (uint64_t)INT64_MAX ? INT64_MAX : (long long)v);
}

static int put_u64s(json_t *o, const char *key, const uint64_t *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; a != NULL && i < n; i++)
        if (json_array_append_new(a, json_integer(v[i] > (uint64_t)INT64_MAX ? INT64_MAX : (json_int_t)v[i])) != 0) {
            json_decref(a);
            a = NULL;
        }
    return set_new(o, key, a);
}

static int put_str(json_t *o, const char *key, const char *s) { return set_new(o, key, json_string(s)); }

static int encode_step(json_t *o, const train_event *ev)
{
    int n = ev->nranks < 0 ? 0 : ev->nranks > TRAIN_MAX_RANKS ? TRAIN_MAX_RANKS : ev->nranks;
    return put_real(o, "loss", ev->loss) | put_real(o, "lr", ev->lr) | put_real(o, "grad_norm", ev->grad_norm) |
           put_real(o, "tokens_per_s", ev->tokens_per_s) | put_int(o, "micro_batch", ev->micro_batch) |
           put_int(o, "accum_steps", ev->accum_steps) | put_int(o, "nranks", n) |
           put_u64s(o, "mem_in_use", ev->mem_in_use, n) | put_u64s(o, "mem_peak", ev->mem_peak, n) |
           put_u64s(o, "mem_reserved", ev->mem_reserved, n) | put_u64s(o, "mem_free", ev->mem_free, n) |
           put_u64s(o, "mem_optimizer", ev->mem_optim, n) | put_u64s(o, "mem_gradients", ev->mem_grads, n) |
           put_u64(o, "loss_tokens", ev->loss_tokens) | put_u64(o, "input_tokens", ev->input_tokens) |
           put_u64(o, "input_positions", ev->input_positions) | put_real(o, "step_seconds", ev->step_seconds) |
           put_real(o, "flops_per_token", ev->flops_per_token) | put_u64(o, "host_budget", ev->host_budget) |
           put_u64(o, "host_in_use", ev->host_in_use) | put_u64(o, "host_peak", ev->host_peak);
}

static int encode_split(json_t *o, const train_event *ev)
{
    return put_int(o, "from_micro", ev->from_micro) | put_int(o, "from_accum", ev->from_accum) |
           put_int(o, "to_micro", ev->to_micro) | put_int(o, "to_accum", ev->to_accum) |
           set_new(o, "recompute", json_boolean(ev->recompute)) | put_u64(o, "bytes_asked", ev->bytes_asked) |
           put_u64(o, "bytes_free", ev->bytes_free) | put_str(o, "message", ev->msg);
}

json_t *tev_to_json(const train_event *ev)
{
    const char *name = tev_kind_name(ev->kind);
    json_t *o = name != NULL ? json_object() : NULL;
    if (o == NULL)
        return NULL;
    int bad = put_str(o, "event", name) | put_int(o, "step", ev->step);
    switch (ev->kind) {
    case TEV_STEP:
        bad |= encode_step(o, ev);
        break;
    case TEV_EVAL:
        bad |= put_real(o, "val_loss", ev->val_loss) | put_u64(o, "val_tokens", ev->val_tokens) |
               put_u64(o, "val_samples", ev->val_samples);
        break;
    case TEV_OOM_ADJUST:
    case TEV_SPLIT_UP:
        bad |= encode_split(o, ev);
        break;
    case TEV_CHECKPOINT:
        bad |= put_str(o, "path", ev->path);
        break;
    case TEV_CKPT_REJECTED:
        bad |= put_str(o, "path", ev->path) | put_str(o, "message", ev->msg);
        break;
    case TEV_LOG:
        bad |= put_str(o, "message", ev->msg);
        break;
    case TEV_DONE:
        bad |= put_int(o, "status", ev->status) | put_str(o, "message", ev->msg);
        break;
    case TEV_PROGRESS:
        bad |= put_str(o, "stage", ev->path) | put_u64(o, "done", ev->done) | put_u64(o, "total", ev->total) |
               put_int(o, "max_steps", ev->max_steps);
        break;
    case TEV_SAMPLE:
        bad |= put_int(o, "index", ev->index) | put_str(o, "prompt", ev->prompt) | put_str(o, "text", ev->text);
        break;
    }
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* ---- decode */

static int field_of(const json_t *o, const char *key, json_t **v, acc_err *err)
{
    *v = json_object_get(o, key);
    return *v != NULL ? 0 : acc_err_set(err, ACC_EINVAL, key, "event: no '%s'", key);
}

static int get_real(const json_t *o, const char *key, double *out, acc_err *err)
{
    json_t *v;
    int rc = field_of(o, key, &v, err);
    if (rc != 0)
        return rc;
    if (json_is_null(v))
        *out = NAN;
    else if (json_is_number(v))
        *out = json_number_value(v);
    else
        return acc_err_set(err, ACC_EINVAL, key, "event: '%s' is not a number", key);
    return 0;
}

static int get_ll(const json_t *o, const char *key, long long lo, long long hi, long long *out, acc_err *err)
{
    json_t *v;
    int rc = field_of(o, key, &v, err);
    if (rc != 0)
        return rc;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return acc_err_set(err, ACC_EINVAL, key, "event: '%s' is not an integer in [%lld, %lld]", key, lo, hi);
    *out = json_integer_value(v);
    return 0;
}

static int get_i(const json_t *o, const char *key, int *out, acc_err *err)
{
    long long v = 0;
    int rc = get_ll(o, key, INT32_MIN, INT32_MAX, &v, err);
    *out = (int)v;
    return rc;
}

static int get_u(const json_t *o, const char *key, uint64_t *out, acc_err *err)
{
    long long v = 0;
    int rc = get_ll(o, key, 0, INT64_MAX, &v, err);
    *out = (uint64_t)v;
    return rc;
}

static int get_s(const json_t *o, const char *key, char *out, size_t n, acc_err *err)
{
    json_t *v;
    int rc = field_of(o, key, &v, err);
    if (rc != 0)
        return rc;
    if (!json_is_string(v) || json_string_length(v) >= n)
        return acc_err_set(err, ACC_EINVAL, key, "event: '%s' is not a string under %zu bytes", key, n);
    memcpy(out, json_string_value(v), json_string_length(v) + 1);
    return 0;
}

static int get_u64s(const json_t *o, const char *key, uint64_t *out, int n, acc_err *err)
{
    json_t *a, *v;
    int rc = field_of(o, key, &a, err);
    if (rc != 0)
        return rc;
    if (!json_is_array(a) || json_array_size(a) != (size_t)n)
        return acc_err_set(err, ACC_EINVAL, key, "event: '%s' is not an array of %d", key, n);
    size_t i;
    json_array_foreach(a, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return acc_err_set(err, ACC_EINVAL, key, "event: '%s'[%zu] is not a byte count", key, i);
        out[i] = (uint64_t)json_integer_value(v);
    }
    return 0;
}

static int decode_step(const json_t *o, train_event *ev, acc_err *err)
{
    int rc;
    if ((rc = get_real(o, "loss", &ev->loss, err)) || (rc = get_real(o, "lr", &ev->lr, err)) ||
        (rc = get_real(o, "grad_norm", &ev->grad_norm, err)) ||
        (rc = get_real(o, "tokens_per_s", &ev->tokens_per_s, err)) ||
        (rc = get_i(o, "micro_batch", &ev->micro_batch, err)) || (rc = get_i(o, "accum_steps", &ev->accum_steps, err)) ||
        (rc = get_i(o, "nranks", &ev->nranks, err)))
        return rc;
    if (ev->nranks < 0 || ev->nranks > TRAIN_MAX_RANKS)
        return acc_err_set(err, ACC_EINVAL, "nranks", "event: nranks %d out of [0, %d]", ev->nranks, TRAIN_MAX_RANKS);
    int n = ev->nranks;
    if ((rc = get_u64s(o, "mem_in_use", ev->mem_in_use, n, err)) || (rc = get_u64s(o, "mem_peak", ev->mem_peak, n, err)) ||
        (rc = get_u64s(o, "mem_reserved", ev->mem_reserved, n, err)) ||
        (rc = get_u64s(o, "mem_free", ev->mem_free, n, err)) ||
        (rc = get_u64s(o, "mem_optimizer", ev->mem_optim, n, err)) ||
        (rc = get_u64s(o, "mem_gradients", ev->mem_grads, n, err)))
        return rc;
    if ((rc = get_u(o, "loss_tokens", &ev->loss_tokens, err)) || (rc = get_u(o, "input_tokens", &ev->input_tokens, err)) ||
        (rc = get_u(o, "input_positions", &ev->input_positions, err)) ||
        (rc = get_real(o, "step_seconds", &ev->step_seconds, err)) ||
        (rc = get_real(o, "flops_per_token", &ev->flops_per_token, err)))
        return rc;
    /* the trainer's host_mem; absent from an older worker's events: 0 */
    const char *host[] = {"host_budget", "host_in_use", "host_peak"};
    uint64_t *to[] = {&ev->host_budget, &ev->host_in_use, &ev->host_peak};
    for (int i = 0; i < 3; i++)
        if (json_object_get(o, host[i]) != NULL && (rc = get_u(o, host[i], to[i], err)) != 0)
            return rc;
    return 0;
}

static int decode_split(const json_t *o, train_event *ev, acc_err *err)
{
    int rc;
    json_t *r;
    if ((rc = get_i(o, "from_micro", &ev->from_micro, err)) || (rc = get_i(o, "from_accum", &ev->from_accum, err)) ||
        (rc = get_i(o, "to_micro", &ev->to_micro, err)) || (rc = get_i(o, "to_accum", &ev->to_accum, err)) ||
        (rc = get_u(o, "bytes_asked", &ev->bytes_asked, err)) || (rc = get_u(o, "bytes_free", &ev->bytes_free, err)) ||
        (rc = get_s(o, "message", ev->msg, sizeof ev->msg, err)) || (rc = field_of(o, "recompute", &r, err)))
        return rc;
    if (!json_is_boolean(r))
        return acc_err_set(err, ACC_EINVAL, "recompute", "event: 'recompute' is not a boolean");
    ev->recompute = json_is_true(r);
    return 0;
}

static int kind_of(const json_t *o, train_event_kind *k, acc_err *err)
{
    const char *name = json_string_value(json_object_get(o, "event"));
    for (int i = 0; name != NULL && i < NKINDS; i++)
        if (kind_names[i] != NULL && !strcmp(kind_names[i], name)) {
            *k = (train_event_kind)i;
            return 0;
        }
    return acc_err_set(err, ACC_EINVAL, "event", "event: unknown kind '%.40s'", name ? name : "(none)");
}

int tev_from_json(const json_t *o, train_event *ev, acc_err *err)
{
    memset(ev, 0, sizeof *ev);
    if (!json_is_object(o))
        return acc_err_set(err, ACC_EINVAL, "", "event: not a JSON object");
    int rc;
    if ((rc = kind_of(o, &ev->kind, err)) != 0 || (rc = get_i(o, "step", &ev->step, err)) != 0)
        return rc;
    switch (ev->kind) {
    case TEV_STEP:
        return decode_step(o, ev, err);
    case TEV_EVAL: /* val_tokens, val_samples */
        return (rc = get_real(o, "val_loss", &ev->val_loss, err)) || (rc = get_u(o, "val_tokens", &ev->val_tokens, err))
                   ? rc
                   : get_u(o, "val_samples", &ev->val_samples, err);
    case TEV_OOM_ADJUST:
    case TEV_SPLIT_UP:
        return decode_split(o, ev, err);
    case TEV_CHECKPOINT:
        return get_s(o, "path", ev->path, sizeof ev->path, err);
    case TEV_CKPT_REJECTED:
        return (rc = get_s(o, "path", ev->path, sizeof ev->path, err)) != 0 ? rc
                                                                             : get_s(o, "message", ev->msg, sizeof ev->msg, err);
    case TEV_LOG:
        return get_s(o, "message", ev->msg, sizeof ev->msg, err);
    case TEV_DONE:
        return (rc = get_i(o, "status", &ev->status, err)) != 0 ? rc : get_s(o, "message", ev->msg, sizeof ev->msg, err);
    case TEV_PROGRESS:
        if ((rc = get_s(o, "stage", ev->path, sizeof ev->path, err)) || (rc = get_u(o, "done", &ev->done, err)) ||
            (rc = get_u(o, "total", &ev->total, err)))
            return rc;
        return get_i(o, "max_steps", &ev->max_steps, err);
    case TEV_SAMPLE:
        if ((rc = get_i(o, "index", &ev->index, err)) || (rc = get_s(o, "prompt", ev->prompt, sizeof ev->prompt, err)))
            return rc;
        return get_s(o, "text", ev->text, sizeof ev->text, err);
    }
    return 0;
}
