/* plan_table: see plan_table.h. */
#include "plan_table.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch_split.h"
#include "checked.h"

/* LoRA rows of a spec without a lora section: PEFT-style settings that
 * adapt every linear layer of the blocks (plan_table.h). */
static const spec_lora default_lora = {.r = 16, .alpha = 32, .dropout = 0, .all_linear = true};

/* The spec's own variant: how it would run as submitted. */
static plan_variant own_variant(const train_cfg *spec)
{
    return (plan_variant){.lora = spec->lora.r > 0, .zero_stage = spec->zero_stage,
                          .recompute = spec->activation_checkpointing,
                          .qlora = spec->lora.r > 0 && spec->model.quantize_nf4,
                          .act_offload = spec->activation_checkpointing && spec->activation_offload,
                          .offload_optimizer = spec->offload_optimizer,
                          .offload_param = spec->offload_param};
}

int plan_spec_at_world(train_cfg *spec, int w, acc_err *err)
{
    batch_given g = {.B = spec->given_batch, .m = spec->given_micro, .a = spec->given_accum};
    if (g.B == 0 && g.m == 0 && g.a == 0)
        return 0;
    batch_split bs;
    int rc = batch_split_resolve(&g, w, SPEC_MAX_BATCH, &bs, err);
    if (rc != 0)
        return rc;
    spec->devices = w;
    spec->train_batch_size = bs.B;
    spec->micro_batch = bs.m;
    spec->accum_steps = bs.a;
    return 0;
}

bool plan_variant_available(const train_cfg *spec, const plan_hw *hw, const plan_variant *v)
{
    (void)spec;
    /* ZeRO shards over the ranks: none with one device (a 400 at submit);
     * stage 3 partitions a full fine-tune's parameters (no LoRA yet) */
    /* parameter offload is ZeRO-3's, with the optimizer offloaded, and
     * runs on one device too */
    if (v->offload_param)
        return v->zero_stage == 3 && v->offload_optimizer && !v->lora;
    return v->zero_stage >= 0 && v->zero_stage <= 3 && (v->zero_stage == 0 || hw->devices >= 2) &&
           !(v->zero_stage == 3 && v->lora);
}

int plan_variant_spec(const train_cfg *spec, const plan_hw *hw, const plan_variant *v, train_cfg *out,
                      acc_err *err)
{
    if (hw->devices < 1 || spec->train_batch_size % hw->devices != 0)
        return acc_err_set(err, ACC_EINVAL, "hardware.devices",
                           "train_batch_size %d is not divisible by hardware.devices %d",
                           spec->train_batch_size, hw->devices);
    *out = *spec;
    out->devices = hw->devices;
    out->activation_checkpointing = v->recompute;
    out->activation_offload = v->recompute && v->act_offload;
    out->micro_auto = true; /* every m is a row */
    out->micro_batch = 0;
    out->accum_steps = 0;
    out->oom_adapt = false; /* no fallback row: recompute is its own variant */
    out->zero_stage = v->zero_stage;
    if (!v->lora) { /* every weight trains */
        memset(&out->lora, 0, sizeof out->lora);
        out->merge_lora = false;
    } else if (spec->lora.r == 0) {
        out->lora = default_lora;
    }
    out->model.quantize_nf4 = v->qlora;
    out->offload_optimizer = v->offload_optimizer || v->offload_param;
    out->offload_pin_memory = out->offload_optimizer && spec->offload_pin_memory;
    out->offload_param = v->offload_param;
    out->offload_param_pin = v->offload_param && spec->offload_param_pin;
    return 0;
}

static int same_variant(const plan_variant *a, const plan_variant *b)
{
    return a->lora == b->lora && a->zero_stage == b->zero_stage && a->recompute == b->recompute &&
           a->qlora == b->qlora && a->act_offload == b->act_offload && a->offload_optimizer == b->offload_optimizer &&
           a->offload_param == b->offload_param;
}

/* The row of variant v with micro batch m, or -1. */
static int find_row(const plan_table *t, const plan_variant *v, int m, int *group)
{
    for (int g = 0; g < t->ngroups; g++) {
        const plan_group *pg = &t->groups[g];
        if (!same_variant(&pg->v, v))
            continue;
        for (int i = pg->first; i < pg->first + pg->n; i++)
            if (t->rows[i].micro_batch == m) {
                *group = g;
                return i;
            }
    }
    return -1;
}

/* One group: the variant's spec through the planner. */
static int add_group(const train_cfg *spec, plan_table *t, const plan_variant *v, acc_err *err)
{
    train_cfg *vs = malloc(sizeof *vs);
    if (vs == NULL)
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    int n = 0, chosen = -1;
    int rc = plan_variant_spec(spec, &t->hw, v, vs, err);
    model_config cfg;
    plan_variant own = own_variant(spec);
    if (rc == 0 && ((v->lora && spec->lora.r == 0) || !same_variant(v, &own)) &&
        plan_model_config(vs, &cfg, NULL) != 0) {
        free(vs); /* the default LoRA on a family that takes none, a 4-bit base on one
                   * with nothing to quantize, a 4-bit directory without adapters: no such rows */
        return 0;
    }
    /* a group's rows go at t->rows + nrows, up to PLAN_MAX_ROWS of them:
     * never past the PLAN_MAX_GROUPS x PLAN_MAX_ROWS the table holds */
    if (rc == 0 && (t->ngroups >= PLAN_MAX_GROUPS || t->nrows > (PLAN_MAX_GROUPS - 1) * PLAN_MAX_ROWS))
        rc = acc_err_set(err, ACC_EINTERNAL, NULL, "the plan table is full");
    if (rc == 0)
        rc = plan_candidates_hw(vs, t->hw.kind, t->hw.device_memory, t->hw.host_memory, t->rows + t->nrows,
                                PLAN_MAX_ROWS, &n, &chosen, err);
    free(vs);
    if (rc != 0)
        return rc;
    plan_group *g = &t->groups[t->ngroups++];
    *g = (plan_group){.v = *v, .first = t->nrows, .n = n, .best = chosen >= 0 ? t->nrows + chosen : -1};
    t->nrows += n;
    return 0;
}

/* What the dry run would start with: the spec's own variant on hw, the
 * row plan_start_row gives (its micro batch, or the planner's pick for
 * "auto" and, under oom.adapt, for a given micro batch that does not fit). */
static int recommend(const train_cfg *spec, plan_table *t, acc_err *err)
{
    t->recommended = t->recommended_group = -1;
    t->given_fits = true;
    plan_variant v = own_variant(spec);
    int per_rank = spec->train_batch_size / t->hw.devices;
    bool given = !spec->micro_auto && spec->micro_batch >= 1 && per_rank % spec->micro_batch == 0;
    train_cfg *own = malloc(sizeof *own);
    plan_row *rows = calloc(PLAN_MAX_ROWS, sizeof *rows);
    int n = 0, chosen = -1, rc = 0;
    if (own == NULL || rows == NULL)
        rc = acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    if (rc == 0) {
        *own = *spec;
        own->devices = t->hw.devices;
        own->micro_auto = !given;
        rc = plan_candidates_hw(own, t->hw.kind, t->hw.device_memory, t->hw.host_memory, rows, PLAN_MAX_ROWS, &n,
                                &chosen, err);
    }
    int start = rc == 0 ? plan_start_row(own, rows, n, chosen) : -1;
    if (rc == 0 && given) {
        for (int i = 0; i < n; i++)
            if (rows[i].micro_batch == own->micro_batch && rows[i].recompute == own->activation_checkpointing)
                t->given_fits = rows[i].fits;
        plan_start_note(own, rows, n, chosen, t->hw.device_memory, t->start_note, sizeof t->start_note);
    }
    if (start >= 0) {
        v.recompute = rows[start].recompute;
        v.act_offload = v.recompute && spec->activation_offload;
        t->recommended = find_row(t, &v, rows[start].micro_batch, &t->recommended_group);
    }
    free(own);
    free(rows);
    return rc;
}

/* Every variant with the optimizer offloaded (off) or on the device (!off),
 * least change first: full,
 * LoRA, QLoRA; ZeRO 0..2, recompute off then on; then each recomputing
 * mode with its checkpoints in host memory; then ZeRO-3 (a full
 * fine-tune's parameters partitioned). */
static int add_groups(const train_cfg *spec, const plan_hw *hw, plan_table *t, bool off, acc_err *err)
{
    int rc = 0;
    for (int lora = 0; rc == 0 && lora < 3; lora++)
        for (int z = 0; rc == 0 && z < 3; z++)
            for (int rec = 0; rc == 0 && rec < 2; rec++) {
                plan_variant v = {.lora = lora > 0, .zero_stage = z, .recompute = rec, .qlora = lora == 2,
                                  .offload_optimizer = off};
                if (plan_variant_available(spec, hw, &v))
                    rc = add_group(spec, t, &v, err);
            }
    for (int lora = 0; rc == 0 && lora < 3; lora++)
        for (int z = 0; rc == 0 && z < 3; z++) {
            plan_variant v = {.lora = lora > 0, .zero_stage = z, .recompute = true, .qlora = lora == 2,
                              .act_offload = true, .offload_optimizer = off};
            if (plan_variant_available(spec, hw, &v))
                rc = add_group(spec, t, &v, err);
        }
    for (int rec = 0; rc == 0 && rec < 3; rec++) {
        plan_variant v = {.zero_stage = 3, .recompute = rec > 0, .act_offload = rec == 2, .offload_optimizer = off};
        if (plan_variant_available(spec, hw, &v))
            rc = add_group(spec, t, &v, err);
    }
    return rc;
}

int plan_table_build(const train_cfg *spec, const plan_hw *hw, plan_table *t, acc_err *err)
{
    memset(t, 0, sizeof *t);
    t->hw = *hw;
    t->recommended = t->recommended_group = t->suggested = t->suggested_group = -1;
    t->rows = calloc((size_t)PLAN_MAX_GROUPS * PLAN_MAX_ROWS, sizeof *t->rows);
    if (t->rows == NULL)
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    int rc = 0;
    /* least change first: every mode with the optimizer on the device,
     * then the same modes with it offloaded to host memory */
    for (int off = 0; rc == 0 && off < 2; off++)
        rc = add_groups(spec, hw, t, off, err);
    /* then ZeRO-3 with the parameters offloaded too: the most change */
    for (int rec = 0; rc == 0 && rec < 3; rec++) {
        plan_variant v = {.zero_stage = 3, .recompute = rec > 0, .act_offload = rec == 2, .offload_optimizer = true,
                          .offload_param = true};
        if (plan_variant_available(spec, hw, &v))
            rc = add_group(spec, t, &v, err);
    }
    if (rc == 0)
        rc = recommend(spec, t, err);
    for (int g = 0; rc == 0 && g < t->ngroups && t->suggested < 0; g++)
        if (t->groups[g].best >= 0) {
            t->suggested = t->groups[g].best;
            t->suggested_group = g;
        }
    if (rc != 0)
        plan_table_free(t);
    return rc;
}

void plan_table_free(plan_table *t)
{
    free(t->rows);
    t->rows = NULL;
    t->nrows = t->ngroups = 0;
}

static double gib(uint64_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }

const char *plan_row_limit(const plan_row *r, const plan_hw *hw)
{
    if (r->fits)
        return NULL;
    if (hw->host_memory != 0 && r->device_bytes <= plan_usable_bytes(hw->device_memory) &&
        plan_row_job_host_bytes(r, hw->devices) > hw->host_memory)
        return "host_memory";
    return "device_memory";
}

/* The host's part of plan_row_why. */
static void host_why(const plan_row *r, const plan_hw *hw, char *buf, size_t n)
{
    const plan_host_parts *h = &r->host;
    snprintf(buf, n,
             "host memory: %d rank(s) x %.1f MiB (batch %.1f + optimizer %.1f + params %.1f + activations %.1f) = "
             "%llu bytes exceeds the host's %llu bytes for jobs",
             hw->devices, (double)r->host_bytes / (1024.0 * 1024.0), (double)h->batch / (1024.0 * 1024.0),
             (double)h->optimizer / (1024.0 * 1024.0), (double)h->params / (1024.0 * 1024.0),
             (double)h->activations / (1024.0 * 1024.0),
             (unsigned long long)plan_row_job_host_bytes(r, hw->devices), (unsigned long long)hw->host_memory);
}

void plan_row_why(const plan_row *r, const plan_hw *hw, char *buf, size_t n)
{
    buf[0] = '\0';
    if (r->fits)
        return;
    const char *limit = plan_row_limit(r, hw);
    if (limit != NULL && !strcmp(limit, "host_memory")) {
        host_why(r, hw, buf, n);
        return;
    }
    uint64_t usable = plan_usable_bytes(hw->device_memory);
    const plan_parts *p = &r->parts;
    uint64_t state = r->state_bytes;
    char extra[96] = "";
    if (p->runtime != 0 || p->rounding != 0) /* CUDA: the context and libraries, the 2 MiB blocks */
        snprintf(extra, sizeof extra, " + runtime %.2f GiB + allocator rounding %.1f MiB", gib(p->runtime),
                 (double)p->rounding / (1024.0 * 1024.0));
    if (acc_sat_add_u64(state, p->runtime) > usable) {
        snprintf(buf, n,
                 "model state %.1f GiB alone (weights %.1f + gradients %.1f + optimizer %.1f)%s exceeds the "
                 "%.1f GiB device (%.1f GiB usable, %d%% kept free)",
                 gib(state), gib(p->weights), gib(p->gradients), gib(p->optimizer), extra,
                 gib(hw->device_memory), gib(usable), PLAN_MARGIN_PCT);
        return;
    }
    snprintf(buf, n,
             "peak %.1f GiB (model state %.1f + activations %.1f%s) exceeds the %.1f GiB device "
             "(%.1f GiB usable, %d%% kept free)",
             gib(r->device_bytes), gib(state), gib(p->activations), extra,
             gib(hw->device_memory), gib(usable), PLAN_MARGIN_PCT);
}

json_int_t plan_bytes_json(uint64_t b)
{
    return b > (uint64_t)INT64_MAX ? (json_int_t)INT64_MAX : (json_int_t)b;
}

const char *plan_mode_name(const plan_variant *v)
{
    return v == NULL ? "full" : v->qlora ? "qlora" : v->lora ? "lora" : "full"; /* qlora: a 4-bit base */
}

/* The row's host bytes by part, the job's on the host, and which limit a
 * row that does not fit exceeds. */
static json_t *row_host_json(const plan_row *r, const plan_hw *hw)
{
    const plan_host_parts *h = &r->host;
    const char *limit = plan_row_limit(r, hw);
    bool host_fits = hw->host_memory == 0 || plan_row_job_host_bytes(r, hw->devices) <= hw->host_memory;
    return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:b, s:o}", "host_batch_bytes", plan_bytes_json(h->batch),
                     "host_optimizer_bytes", plan_bytes_json(h->optimizer), "host_params_bytes",
                     plan_bytes_json(h->params), "host_activations_bytes", plan_bytes_json(h->activations),
                     "host_bytes", plan_bytes_json(r->host_bytes), "job_host_bytes",
                     plan_bytes_json(plan_row_job_host_bytes(r, hw->devices)), "host_fits", host_fits, "limit",
                     limit ? json_string(limit) : json_null());
}

json_t *plan_row_json(const plan_row *r, const plan_variant *v, const plan_hw *hw)
{
    char why[512];
    plan_row_why(r, hw, why, sizeof why);
    const plan_parts *p = &r->parts;
    /* workspace_bytes: 0 on every backend since bf16 copies no operands;
     * kept in the answer so that clients reading it go on working */
    json_t *o = json_pack("{s:s, s:i, s:b, s:i, s:i, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:b, s:o, s:b}",
                          "mode",
                          plan_mode_name(v), "zero_stage", v != NULL ? v->zero_stage : 0,
                          "recompute", r->recompute, "micro_batch", r->micro_batch, "accum_steps", r->accum_steps,
                          "weights_bytes", plan_bytes_json(p->weights), "gradients_bytes", plan_bytes_json(p->gradients),
                          "optimizer_bytes", plan_bytes_json(p->optimizer), "activations_bytes",
                          plan_bytes_json(p->activations), "workspace_bytes", (json_int_t)0,
                          "rounding_bytes", plan_bytes_json(p->rounding), "runtime_bytes", plan_bytes_json(p->runtime),
                          "peak_bytes", plan_bytes_json(r->peak_bytes), "device_bytes", plan_bytes_json(r->device_bytes),
                          "fits", r->fits, "why_not", why[0] ? json_string(why) : json_null(), "act_offload",
                          v != NULL && v->act_offload && r->recompute);
    if (o != NULL) /* the optimizer state in host memory (the row's host_optimizer_bytes) */
        json_object_set_new(o, "offload_optimizer", json_boolean(v != NULL && v->offload_optimizer));
    if (o != NULL) /* the parameter partitions in host memory (host_params_bytes: with it, or the
                    * gradient partition alone at stage 3 with offload_optimizer) */
        json_object_set_new(o, "offload_param", json_boolean(v != NULL && v->offload_param));
    json_t *host = row_host_json(r, hw);
    if (o != NULL && host != NULL)
        json_object_update(o, host);
    json_decref(host);
    return o;
}
