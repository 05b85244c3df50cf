/* api_plan: POST /v1/plan, "does it fit on my card?".
 *
 *   {<a job spec>, "hardware": {"device_memory": "24GiB", "devices": 4,
 *                               "kind": "cuda"}}
 *
 * answers, for every way to run the spec on that hardware (plan_table.h:
 * full or LoRA, ZeRO stage, recomputation, every micro batch m dividing
 * B / w), the predicted bytes per device by part, whether they fit, why
 * not, each variant's largest fitting m, the LoRA settings the LoRA rows
 * were planned with (the spec's lora section, or r 16, alpha 32,
 * "all-linear" for a family that takes LoRA), and a summary: the row the
 * dry run would start with and, when it does not fit, the first variant
 * that does.
 *
 * hardware.host_memory (the same syntax): the host memory the job's ranks
 * may hold there (default the daemon's host_memory config key, this
 * machine's; 0 there: no limit); a row whose job host bytes (devices x its
 * host_bytes) exceed it does not fit ("limit": "host_memory").
 *
 * hardware (optional, each key too): device_memory (bytes, or a size with
 * the config's K/M/G/T suffixes, "24GiB", "80G"; at least 1 MiB), devices
 * (the job's world size w, 1..TRAIN_MAX_RANKS; default the spec's
 * `devices`), kind ("cuda" or "cpu"; default this machine's). Without
 * device_memory: this machine's smallest device of that kind (an error
 * when the machine has none). Unknown keys, wrong types and out-of-range
 * values are 400s naming "hardware.<key>".
 *
 * The spec is read by job_spec_parse_plan: every key checked as at submit,
 * paths resolved under data_roots (safepath), but model.from is read for
 * its config.json only, never the weights, and data may be absent. It
 * opens files: api_plan_compute runs on libuv's thread pool (api_defer)
 * and reads only the daemon's immutable parts (config, device table).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_http.h"
#include "job_train_cfg.h"
#include "jobs.h"
#include "plan_table.h"
#include "trainer.h"

static int hw_memory_named(const json_t *v, const char *f, uint64_t *out, acc_err *err)
{
    if (json_is_integer(v)) {
        json_int_t b = json_integer_value(v);
        if (b < (1 << 20))
            return acc_err_set(err, ACC_EINVAL, f, "%s must be at least 1 MiB, got %lld", f, (long long)b);
        *out = (uint64_t)b;
        return 0;
    }
    if (!json_is_string(v) || conf_parse_bytes(json_string_value(v), out) != 0 || *out < (1 << 20))
        return acc_err_set(err, ACC_EINVAL, f,
                           "%s must be a size of at least 1 MiB: bytes, or a number with a K/M/G/T suffix "
                           "such as \"24GiB\" or \"80G\"",
                           f);
    return 0;
}

static int hw_memory(const json_t *v, uint64_t *out, acc_err *err)
{
    return hw_memory_named(v, "hardware.device_memory", out, err);
}

/* hardware.host_memory: the same syntax; default the daemon's host_memory
 * (this machine's host memory for jobs; 0 there: no limit). */
static int hw_host_memory(const jobs_mgr *m, const json_t *h, plan_hw *hw, acc_err *err)
{
    json_t *v = json_object_get(h, "host_memory");
    hw->host_memory = m->conf != NULL ? m->conf->host_memory : 0;
    return v != NULL ? hw_memory_named(v, "hardware.host_memory", &hw->host_memory, err) : 0;
}

/* The hardware object into hw, defaults from the spec and this machine. */
static int parse_hardware(const jobs_mgr *m, const json_t *h, const train_cfg *spec, plan_hw *hw, acc_err *err)
{
    static const char *const keys[] = {"device_memory", "devices", "kind", "host_memory", NULL};
    kern_dev_kind here = m->ndev > 0 ? m->devs[0].kind : KERN_DEV_CPU; /* all of one kind */
    *hw = (plan_hw){.kind = here, .devices = spec->devices};
    if (h != NULL && !json_is_object(h))
        return acc_err_set(err, ACC_EINVAL, "hardware", "hardware must be an object");
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)h, key, v) {
        bool ok = false;
        for (int i = 0; keys[i] != NULL; i++)
            ok |= !strcmp(key, keys[i]);
        if (!ok)
            return acc_err_set(err, ACC_EINVAL, "hardware",
                               "hardware: unknown key '%s' (device_memory, devices, kind, host_memory)", key);
    }
    json_t *kind = json_object_get(h, "kind"), *devs = json_object_get(h, "devices"),
           *mem = json_object_get(h, "device_memory");
    if (kind != NULL) {
        const char *k = json_is_string(kind) ? json_string_value(kind) : "";
        if (strcmp(k, "cuda") != 0 && strcmp(k, "cpu") != 0)
            return acc_err_set(err, ACC_EINVAL, "hardware.kind", "hardware.kind must be \"cuda\" or \"cpu\"");
        hw->kind = !strcmp(k, "cuda") ? KERN_DEV_CUDA : KERN_DEV_CPU;
    }
    if (devs != NULL) {
        json_int_t d = json_is_integer(devs) ? json_integer_value(devs) : 0;
        if (d < 1 || d > TRAIN_MAX_RANKS)
            return acc_err_set(err, ACC_EINVAL, "hardware.devices",
                               "hardware.devices must be an integer in [1, %d] (the devices one job runs on)",
                               TRAIN_MAX_RANKS);
        hw->devices = (int)d;
    }
    if (devs == NULL && hw->devices > TRAIN_MAX_RANKS) /* the spec's own, as a job would be refused */
        return acc_err_set(err, ACC_EINVAL, "devices", "at most %d devices per job", TRAIN_MAX_RANKS);
    int rc = hw_host_memory(m, h, hw, err);
    if (rc != 0)
        return rc;
    if (mem != NULL)
        return hw_memory(mem, &hw->device_memory, err);
    for (int i = 0; i < m->ndev; i++) /* the smallest device of that kind here */
        if (m->devs[i].kind == hw->kind && (hw->device_memory == 0 || m->devs[i].mem_total < hw->device_memory))
            hw->device_memory = m->devs[i].mem_total;
    if (hw->device_memory == 0)
        return acc_err_set(err, ACC_EINVAL, "hardware.device_memory",
                           "hardware.device_memory is required: this machine has no %s device",
                           kern_dev_kind_name(hw->kind));
    return 0;
}

static json_t *row_json(const plan_table *t, int i)
{
    const plan_variant *v = NULL;
    for (int g = 0; g < t->ngroups; g++)
        if (i >= t->groups[g].first && i < t->groups[g].first + t->groups[g].n)
            v = &t->groups[g].v;
    return plan_row_json(&t->rows[i], v, &t->hw);
}

static json_t *group_json(const plan_table *t, const plan_group *g)
{
    char why[512] = "";
    if (g->best < 0 && g->n > 0) /* the smallest row says why none fits */
        plan_row_why(&t->rows[g->first], &t->hw, why, sizeof why);
    const plan_row *best = g->best >= 0 ? &t->rows[g->best] : NULL;
    return json_pack("{s:s, s:i, s:b, s:b, s:b, s:b, s:i, s:o, s:o, s:o, s:o, s:o}", "mode",
                     plan_mode_name(&g->v), "zero_stage", g->v.zero_stage, "recompute", g->v.recompute,
                     "act_offload", g->v.act_offload, "offload_optimizer", g->v.offload_optimizer,
                     "offload_param", g->v.offload_param, "rows", g->n,
                     "largest_fitting_micro_batch",
                     best ? json_integer(best->micro_batch) : json_null(), "accum_steps",
                     best ? json_integer(best->accum_steps) : json_null(), "device_bytes",
                     best ? json_integer(plan_bytes_json(best->device_bytes)) : json_null(), "host_bytes",
                     best ? json_integer(plan_bytes_json(best->host_bytes)) : json_null(), "why_not",
                     why[0] ? json_string(why) : json_null());
}

/* The suggestion's ZeRO stage in words (stage 0: none). */
static const char *const zero_words[4] = {"", " with ZeRO-1", " with ZeRO-2", " with ZeRO-3"};

static json_t *summary_json(const plan_table *t, bool spec_recompute)
{
    const plan_row *rec = t->recommended >= 0 ? &t->rows[t->recommended] : NULL;
    bool fits = rec != NULL && rec->fits;
    char msg[1024];
    const plan_group *rg = t->recommended_group >= 0 ? &t->groups[t->recommended_group] : NULL;
    if (fits && !t->given_fits && t->start_note[0]) /* started where it fits */
        snprintf(msg, sizeof msg, "%s", t->start_note);
    /* only where the start needs recomputation */
    else if (fits && rec->recompute && !spec_recompute && rg != NULL && rg->best >= 0 &&
             t->rows[rg->best].micro_batch > rec->micro_batch)
        /* "auto" fell back to m = 1 recomputing: recomputing from the start allows more */
        snprintf(msg, sizeof msg,
                 "the spec runs as given: micro batch %d x %d accumulation steps on %d device(s)%s; with "
                 "\"activation_checkpointing\": true, micro batch %d x %d fits",
                 rec->micro_batch, rec->accum_steps, t->hw.devices, rec->recompute ? " with recomputation" : "",
                 t->rows[rg->best].micro_batch, t->rows[rg->best].accum_steps);
    else if (fits)
        snprintf(msg, sizeof msg, "the spec runs as given: micro batch %d x %d accumulation steps on %d device(s)%s",
                 rec->micro_batch, rec->accum_steps, t->hw.devices, rec->recompute ? " with recomputation" : "");
    else if (t->suggested >= 0) {
        const plan_row *s = &t->rows[t->suggested];
        const plan_variant *v = &t->groups[t->suggested_group].v;
        snprintf(msg, sizeof msg,
                 "the spec as given does not fit; %s fine-tune%s%s%s%s with micro batch %d x %d accumulation steps "
                 "does",
                 v->qlora ? "a QLoRA" : v->lora ? "a LoRA" : "a full", zero_words[v->zero_stage & 3],
                 v->recompute ? " and recomputation" : "",
                 v->recompute && v->act_offload ? " from checkpoints in host memory" : "",
                 v->offload_param       ? " and the parameters and optimizer offloaded to host memory"
                 : v->offload_optimizer ? " and the optimizer offloaded to host memory"
                                        : "",
                 s->micro_batch,
                 s->accum_steps);
    } else if (t->hw.host_memory != 0)
        snprintf(msg, sizeof msg, "no way to run this spec fits %d device(s) of %.1f GiB with %.1f GiB of host memory",
                 t->hw.devices, (double)t->hw.device_memory / (1024.0 * 1024.0 * 1024.0),
                 (double)t->hw.host_memory / (1024.0 * 1024.0 * 1024.0));
    else
        snprintf(msg, sizeof msg, "no way to run this spec fits %d device(s) of %.1f GiB", t->hw.devices,
                 (double)t->hw.device_memory / (1024.0 * 1024.0 * 1024.0));
    return json_pack("{s:o, s:b, s:o, s:s, s:b}", "recommended", rec ? row_json(t, t->recommended) : json_null(),
                     "fits", fits, "suggested",
                     !fits && t->suggested >= 0 ? row_json(t, t->suggested) : json_null(), "message", msg,
                     "given_micro_batch_fits", t->given_fits);
}

/* The LoRA settings the table's LoRA rows were planned with (the spec's
 * section or the defaults), null when it has none. */
static json_t *lora_json(const train_cfg *spec, const plan_table *t)
{
    const plan_group *g = NULL;
    for (int i = 0; i < t->ngroups && g == NULL; i++)
        if (t->groups[i].v.lora)
            g = &t->groups[i];
    train_cfg *vs = g ? malloc(sizeof *vs) : NULL;
    model_config cfg;
    json_t *o = NULL;
    if (vs != NULL && plan_variant_spec(spec, &t->hw, &g->v, vs, NULL) == 0 && plan_model_config(vs, &cfg, NULL) == 0) {
        json_t *mods = json_array();
        for (int i = 0; mods && i < cfg.lora.n_targets; i++)
            json_array_append_new(mods, json_string(cfg.lora.targets[i]));
        o = json_pack("{s:i, s:f, s:o, s:b, s:I}", "r", cfg.lora.r, "alpha", cfg.lora.alpha, "target_modules",
                      mods ? mods : json_array(), "from_spec", spec->lora.r > 0, "trainable_params",
                      (json_int_t)model_num_trainable(&cfg));
    }
    free(vs);
    return o ? o : json_null();
}

static json_t *answer(const train_cfg *spec, const model_config *cfg, const plan_table *t, bool hw_given)
{
    json_t *rows = json_array(), *groups = json_array();
    for (int i = 0; rows && i < t->nrows; i++)
        json_array_append_new(rows, row_json(t, i));
    for (int g = 0; groups && g < t->ngroups; g++)
        json_array_append_new(groups, group_json(t, &t->groups[g]));
    return json_pack("{s:{s:s, s:s, s:I, s:i}, s:{s:s, s:I, s:i, s:b}, s:{s:i, s:i}, s:s, s:i, s:o, s:o, s:o, s:o}",
                     "model", "family", model_family_of(cfg)->name, "from", spec->model.from, "params",
                     (json_int_t)model_num_params(cfg), "seq_len", spec->model.seq_len, "hardware", "kind",
                     kern_dev_kind_name(t->hw.kind), "device_memory_bytes",
                     plan_bytes_json(t->hw.device_memory), "devices", t->hw.devices, "given", hw_given, "batch",
                     "train_batch_size", spec->train_batch_size, "per_device", spec->train_batch_size / t->hw.devices,
                     "precision", spec_precision_name(spec->precision), "margin_pct", PLAN_MARGIN_PCT, "summary",
                     summary_json(t, spec->activation_checkpointing), "lora", lora_json(spec, t), "groups", groups ? groups : json_array(), "rows", rows ? rows : json_array());
}

/* The host planned for, next to the devices: hardware.host_memory_bytes
 * (0: no limit). */
static void answer_host(json_t *o, const plan_table *t)
{
    json_t *hw = json_object_get(o, "hardware");
    if (hw != NULL)
        json_object_set_new(hw, "host_memory_bytes", json_integer(plan_bytes_json(t->hw.host_memory)));
}

int api_plan_compute(const jobs_mgr *m, const char *body, size_t len, json_t **out, acc_err *err)
{
    *out = NULL;
    json_error_t je;
    json_t *req = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(req)) {
        json_decref(req);
        return acc_err_set(err, ACC_EINVAL, "", "the plan request must be a JSON object (a job spec plus "
                                                "\"hardware\"): %s", req == NULL ? je.text : "not an object");
    }
    json_t *hw_in = json_incref(json_object_get(req, "hardware"));
    json_object_del(req, "hardware"); /* the rest is a job spec */
    char *spec_text = json_dumps(req, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(req);
    job_spec *js = malloc(sizeof *js);
    train_cfg *spec = malloc(sizeof *spec); /* the engine's part of js */
    plan_table t = {0};
    model_config cfg;
    plan_hw hw;
    int rc = spec_text == NULL || js == NULL || spec == NULL ? acc_err_set(err, ACC_ENOMEM, NULL, "out of memory") : 0;
    if (rc == 0)
        rc = job_spec_parse_plan(spec_text, strlen(spec_text), m->conf, js, err);
    if (rc == 0)
        job_spec_train_cfg(js, spec);
    if (rc == 0)
        rc = parse_hardware(m, hw_in, spec, &hw, err);
    /* another world than the spec's: its batch keys
     * resolved there as submit would (the same 400 for a bad triple) */
    if (rc == 0 && json_object_get(hw_in, "devices") != NULL && hw.devices != spec->devices * spec->nodes) {
        spec->nodes = 1;
        rc = plan_spec_at_world(spec, hw.devices, err);
    }
    if (rc == 0)
        rc = plan_model_config(spec, &cfg, err);
    if (rc == 0)
        rc = plan_table_build(spec, &hw, &t, err);
    if (rc == 0 && (*out = answer(spec, &cfg, &t, hw_in != NULL)) == NULL)
        rc = acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    if (rc == 0)
        answer_host(*out, &t);
    plan_table_free(&t);
    json_decref(hw_in);
    free(spec_text);
    free(spec);
    free(js);
    return rc;
}

/* ---- the route: computed on libuv's thread pool (api_defer_json) */

static int plan_compute(const void *m, const char *body, size_t len, json_t **out, acc_err *err)
{
    return api_plan_compute(m, body, len, out, err);
}

void api_plan(api_server *s, const api_request *req, api_response *resp)
{
    api_defer_json(s, req, resp, plan_compute, api_server_app(s), JSON_COMPACT | JSON_PRESERVE_ORDER,
                   "empty body: send a job spec, optionally with \"hardware\"");
}
