/* api_generate: POST /v1/generate, the model answers (issue 24).
 *
 *   {"model": DIR | "job:<id>", "prompt": "..." | "messages": [...],
 *    "chat_template": "auto", "max_new_tokens": N, "temperature": T,
 *    "top_k": K, "top_p": P, "repetition_penalty": R, "seed": S,
 *    "stop": "..." | [...], "stream": false}
 *
 * Steps:
 *  1. loop thread: the body parsed (JSON, bounded by max_body), "job:<id>"
 *     looked up (its owner or an admin only: it hands out the job's
 *     weights) and turned into the directories to try, newest first (the
 *     export, then the checkpoints). At most user_max_streams open generate
 *     requests per user and max_streams in all (429 / 503), as event
 *     streams are counted.
 *  2. thread pool (api_defer): every key checked (unknown keys and values
 *     out of range are a 400 naming the key), the model directory resolved
 *     under data_roots (a job's under output_root), its config.json read
 *     (the positions), its tokenizer loaded and the prompt encoded (a
 *     conversation through its chat template with the generation prompt), a
 *     prompt that leaves no position a 400 naming "prompt" (or
 *     "messages"), the eos ids of generation_config.json, the device bytes
 *     predicted (weights + the key/value cache + scratch: what the worker
 *     allocates, to the byte on a CPU device; the answer's
 *     device_planned_bytes next to the worker's device_peak_bytes), a
 *     request the largest device cannot hold a 400 naming max_new_tokens
 *     (with how many fit) or the prompt, with the numbers, and the
 *     worker's request written (daemon/gen_proto.h).
 *  3. loop thread: queued (core/jobs/genq.h) for a device and answered 200
 *     with a body written as the worker's lines come: a suspended MHD
 *     connection resumed by each event, no thread held while it waits.
 *     "stream": true is Server-Sent Events (queued {"position"}, started
 *     {"device"}, token {"id","text"}, done {...} or error {"error":{...}});
 *     otherwise one JSON object once the generation is done (spaces before
 *     it while it waits: JSON allows them, and each one written tells a
 *     client that went away from one that waits).
 *  A client that goes away cancels its request: dequeued, or its worker
 *  killed and the device given back.
 */
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api_http.h"
#include "genq.h"
#include "generate.h"
#include "job_spec.h"
#include "jobs.h"
#include "model_hf.h"
#include "tok.h"

#define GEN_MAX_DIRS (JOB_MAX_OUTPUTS + 1)

/* ---- step 2: the request checked and resolved (thread pool) ------------- */

typedef struct gen_check {
    /* in */
    const acc_conf *conf;
    json_t *body;                 /* parsed on the loop thread */
    int ndirs;                    /* job:<id>: the directories to try, newest first */
    char dirs[GEN_MAX_DIRS][PATH_MAX];
    char job_id[32];
    char base_dir[PATH_MAX];      /* a LoRA job's model.from (resolved): the base its adapters apply to */
    api_server *srv;
    struct MHD_Connection *conn;
    api_ident who;
    bool stream;
    /* out */
    int rc;
    acc_err err;
    char *request;                /* the worker's request */
    uint64_t mem_bytes;
    uint64_t largest_dev;         /* the largest device's memory (set on the loop thread) */
    char model_name[PATH_MAX];    /* as the answer names it */
    int n_prompt;
} gen_check;

static int check_keys(const json_t *b, acc_err *err)
{
    static const char *const keys[] = {"model", "prompt", "messages", "chat_template", "max_new_tokens",
                                       "temperature", "top_k", "top_p", "repetition_penalty", "seed",
                                       "stop", "stream", NULL};
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)b, key, v) {
        int ok = 0;
        for (int i = 0; keys[i] != NULL; i++)
            ok |= !strcmp(key, keys[i]);
        if (!ok)
            return acc_err_set(err, ACC_EINVAL, key, "unknown key '%s'", key);
    }
    if (!json_is_string(json_object_get(b, "model")))
        return acc_err_set(err, ACC_EINVAL, "model",
                           "model is required: a model directory under data_roots, or \"job:<id>\"");
    int has_p = json_object_get(b, "prompt") != NULL, has_m = json_object_get(b, "messages") != NULL;
    if (has_p == has_m)
        return acc_err_set(err, ACC_EINVAL, has_p ? "messages" : "prompt",
                           "give exactly one of \"prompt\" and \"messages\"");
    if (has_p && !json_is_string(json_object_get(b, "prompt")))
        return acc_err_set(err, ACC_EINVAL, "prompt", "prompt must be a string");
    if (has_m && !json_is_array(json_object_get(b, "messages")))
        return acc_err_set(err, ACC_EINVAL, "messages", "messages must be an array of {role, content}");
    json_t *ct = json_object_get(b, "chat_template");
    if (ct != NULL && (!json_is_string(ct) || has_p))
        return acc_err_set(err, ACC_EINVAL, "chat_template",
                           has_p ? "chat_template goes with \"messages\"" : "chat_template must be a string");
    json_t *st = json_object_get(b, "stream");
    if (st != NULL && !json_is_boolean(st))
        return acc_err_set(err, ACC_EINVAL, "stream", "stream must be true or false");
    return 0;
}

/* An integer key in [lo, hi]. */
static int int_key(const json_t *b, const char *key, json_int_t lo, json_int_t hi, json_int_t *out, acc_err *err)
{
    json_t *v = json_object_get(b, key);
    if (v == NULL)
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return acc_err_set(err, ACC_EINVAL, key, "%s must be an integer in [%lld, %lld]", key, (long long)lo,
                           (long long)hi);
    *out = json_integer_value(v);
    return 0;
}

/* A number key, finite. */
static int num_key(const json_t *b, const char *key, float *out, acc_err *err)
{
    json_t *v = json_object_get(b, key);
    if (v == NULL)
        return 0;
    if (!json_is_number(v) || !isfinite(json_number_value(v)))
        return acc_err_set(err, ACC_EINVAL, key, "%s must be a number", key);
    *out = (float)json_number_value(v);
    return 0;
}

static int stop_key(const json_t *b, json_t *stops, acc_err *err)
{
    json_t *v = json_object_get(b, "stop");
    if (v == NULL)
        return 0;
    if (json_is_string(v))
        return json_array_append(stops, v);
    if (!json_is_array(v) || json_array_size(v) > GEN_MAX_STOP)
        return acc_err_set(err, ACC_EINVAL, "stop", "stop must be a string or an array of at most %d strings",
                           GEN_MAX_STOP);
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        if (!json_is_string(s) || json_string_length(s) < 1 || json_string_length(s) > GEN_MAX_STOP_LEN)
            return acc_err_set(err, ACC_EINVAL, "stop", "stop[%zu] must be a string of 1 to %d bytes", i,
                               GEN_MAX_STOP_LEN);
        json_array_append(stops, s);
    }
    return 0;
}

/* The sampling keys into the worker's request `w`, range-checked by the
 * engine's own check (which names the key). */
static int sampling(const json_t *b, json_t *w, acc_err *err)
{
    gen_params p;
    gen_params_default(&p);
    json_int_t mnt = p.max_new_tokens, topk = p.top_k, seed = 0;
    int rc;
    if ((rc = int_key(b, "max_new_tokens", 1, GEN_MAX_NEW_TOKENS, &mnt, err)) ||
        (rc = int_key(b, "top_k", 0, INT_MAX, &topk, err)) || (rc = int_key(b, "seed", 0, INT64_MAX, &seed, err)) ||
        (rc = num_key(b, "temperature", &p.temperature, err)) || (rc = num_key(b, "top_p", &p.top_p, err)) ||
        (rc = num_key(b, "repetition_penalty", &p.repetition_penalty, err)))
        return rc;
    p.max_new_tokens = (int)mnt;
    p.top_k = (int)topk;
    p.seed = (uint64_t)seed;
    if ((rc = gen_params_check(&p, err)) != 0)
        return rc;
    json_t *stops = json_array();
    if (stops == NULL || stop_key(b, stops, err) != 0) {
        json_decref(stops);
        return err->code ? err->code : acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    }
    json_object_set_new(w, "stop", stops);
    json_object_set_new(w, "max_new_tokens", json_integer(p.max_new_tokens));
    json_object_set_new(w, "temperature", json_real(p.temperature));
    json_object_set_new(w, "top_k", json_integer(p.top_k));
    json_object_set_new(w, "top_p", json_real(p.top_p));
    json_object_set_new(w, "repetition_penalty", json_real(p.repetition_penalty));
    json_object_set_new(w, "seed", json_integer((json_int_t)p.seed));
    return 0;
}

/* The model directory and the roots it is read under. */
static int resolve_model(gen_check *c, char *dir, size_t n, const char **roots, acc_err *err)
{
    if (c->ndirs == 0) { /* a directory under data_roots */
        snprintf(dir, n, "%s", json_string_value(json_object_get(c->body, "model")));
        snprintf(c->model_name, sizeof c->model_name, "%s", dir);
        *roots = c->conf->data_roots;
        return job_spec_resolve_input(dir, n, c->conf, "model", err);
    }
    *roots = c->conf->output_root;
    for (int i = 0; i < c->ndirs; i++) { /* the newest model: a config.json, or a LoRA job's adapters */
        char cfg[PATH_MAX + 32], ad[PATH_MAX + 32];
        snprintf(cfg, sizeof cfg, "%s/config.json", c->dirs[i]);
        snprintf(ad, sizeof ad, "%s/adapter_config.json", c->dirs[i]);
        if (access(cfg, R_OK) == 0 || (c->base_dir[0] && access(ad, R_OK) == 0)) {
            snprintf(dir, n, "%s", c->dirs[i]);
            snprintf(c->model_name, sizeof c->model_name, "job:%s", c->job_id);
            return 0;
        }
    }
    return acc_err_set(err, ACC_EINVAL, "model", "job %s has no export and no checkpoint yet", c->job_id);
}

static int encode_prompt(const json_t *b, const tok_tokenizer *tok, tok_ids *ids, acc_err *err)
{
    json_t *msgs = json_object_get(b, "messages");
    if (msgs != NULL) {
        const char *tpl = json_string_value(json_object_get(b, "chat_template"));
        return gen_encode_chat(tok, tpl ? tpl : "auto", msgs, "messages", ids, err);
    }
    json_t *p = json_object_get(b, "prompt");
    int rc = gen_encode_text(tok, json_string_value(p), json_string_length(p), ids, err);
    if (rc != 0 && err->field[0] == '\0')
        snprintf(err->field, sizeof err->field, "prompt");
    return rc;
}

static int ids_json(const tok_ids *ids, json_t **out)
{
    json_t *a = json_array();
    for (size_t i = 0; a != NULL && i < ids->n; i++)
        if (json_array_append_new(a, json_integer(ids->v[i])) != 0) {
            json_decref(a);
            a = NULL;
        }
    *out = a;
    return a ? 0 : -1;
}

/* Weights + cache + scratch for P positions (saturated). */
static uint64_t bytes_for(const model_config *cfg, uint64_t state, int P)
{
    uint64_t rest = 0;
    if (gen_ctx_bytes(cfg, P, &rest, NULL) != 0 || state + rest < state)
        return UINT64_MAX;
    return state + rest;
}

/* The request's device bytes against the largest device: a 400 naming
 * what to change (max_new_tokens, and how many fit; the prompt; the
 * model), with the numbers. */
static int check_fit(const gen_check *c, const model_config *cfg, uint64_t state, int positions,
                     const char *field, acc_err *err)
{
    uint64_t dev = c->largest_dev, need = c->mem_bytes;
    if (need <= dev)
        return 0;
    if (state > dev)
        return acc_err_set(err, ACC_EINVAL, "model",
                           "the model's weights take %llu bytes, more than the largest device's %llu",
                           (unsigned long long)state, (unsigned long long)dev);
    uint64_t kv = gen_kv_bytes(cfg, positions);
    int n = c->n_prompt, lo = n, hi = positions; /* the most positions that fit: in [lo, hi) */
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        if (bytes_for(cfg, state, mid) <= dev)
            lo = mid;
        else
            hi = mid;
    }
    int hs = cfg->head_dim > 0 ? cfg->head_dim : cfg->channels / cfg->n_head;
    char why[400];
    snprintf(why, sizeof why,
             "the key/value cache for %d positions is %llu bytes (%d layers x 2 x %d key/value heads x head_dim %d "
             "x %d positions x %d bytes); with the weights' %llu bytes and %llu of scratch that is %llu bytes, more "
             "than the largest device's %llu", positions, (unsigned long long)kv, cfg->n_layer,
             cfg->n_kv_head > 0 ? cfg->n_kv_head : cfg->n_head, hs, positions, gen_kv_value_bytes(cfg),
             (unsigned long long)state, (unsigned long long)(need - state - kv), (unsigned long long)need,
             (unsigned long long)dev);
    if (lo > n && bytes_for(cfg, state, lo) <= dev)
        return acc_err_set(err, ACC_EINVAL, "max_new_tokens", "max_new_tokens %d with a prompt of %d tokens: %s; "
                           "at most %d new tokens fit", positions - n, n, why, lo - n);
    return acc_err_set(err, ACC_EINVAL, field, "the %s is %d tokens: %s", field, n, why);
}

/* The prompt's positions, the device bytes, the eos ids. */
static int size_request(gen_check *c, const model_config *cfg, const tok_ids *ids, const char *roots,
                        const char *dir, json_t *w, acc_err *err)
{
    const char *field = json_object_get(c->body, "messages") ? "messages" : "prompt";
    if (ids->n == 0)
        return acc_err_set(err, ACC_EINVAL, field, "the %s encodes to no token", field);
    if ((long long)ids->n >= cfg->max_seq_len)
        return acc_err_set(err, ACC_EINVAL, field,
                           "the %s is %zu tokens: the model has %d positions, and at least one must be left to "
                           "generate", field, ids->n, cfg->max_seq_len);
    long long want = (long long)ids->n + json_integer_value(json_object_get(w, "max_new_tokens"));
    int positions = want < cfg->max_seq_len ? (int)want : cfg->max_seq_len;
    uint64_t state = 0, cache = 0;
    int rc;
    if ((rc = model_state_bytes(cfg, 0, &state, err)) || (rc = gen_ctx_bytes(cfg, positions, &cache, err)))
        return rc;
    c->mem_bytes = state + cache < state ? UINT64_MAX : state + cache;
    c->n_prompt = (int)ids->n;
    if ((rc = check_fit(c, cfg, state, positions, field, err)) != 0)
        return rc;
    int32_t eos[GEN_MAX_EOS];
    int neos = 0;
    if ((rc = gen_eos_from_dir(roots, dir, eos, GEN_MAX_EOS, &neos, err)) != 0)
        return rc;
    json_t *ea = json_array(), *pa = NULL;
    for (int i = 0; ea != NULL && i < neos; i++)
        json_array_append_new(ea, json_integer(eos[i]));
    if (ea == NULL || ids_json(ids, &pa) != 0) {
        json_decref(ea);
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    }
    json_object_set_new(w, "eos", ea);
    json_object_set_new(w, "prompt_ids", pa);
    json_object_set_new(w, "max_positions", json_integer(positions));
    return 0;
}

static int check_request(gen_check *c, acc_err *err)
{
    char dir[PATH_MAX];
    const char *roots = NULL;
    model_config cfg;
    tok_tokenizer *tok = NULL;
    tok_ids ids = {0};
    json_t *w = json_object();
    int rc = w == NULL ? acc_err_set(err, ACC_ENOMEM, NULL, "out of memory") : check_keys(c->body, err);
    if (rc == 0)
        rc = sampling(c->body, w, err);
    if (rc == 0)
        rc = resolve_model(c, dir, sizeof dir, &roots, err);
    bool lora = false;
    if (rc == 0) { /* a LoRA job's adapters: the base's config with them (generate.h) */
        char ad[PATH_MAX + 32];
        snprintf(ad, sizeof ad, "%s/adapter_config.json", dir);
        lora = c->base_dir[0] != '\0' && access(ad, R_OK) == 0;
    }
    if (rc == 0) {
        if (lora)
            rc = model_hf_config_only(c->conf->data_roots, c->base_dir, &cfg, err);
        if (rc == 0)
            rc = lora ? gen_lora_config(roots, dir, &cfg, err) : model_hf_config_only(roots, dir, &cfg, err);
        if (rc != 0) /* the model's files: the request's "model" */
            snprintf(err->field, sizeof err->field, "model");
    }
    if (rc == 0 && tok_load_under(roots, dir, "model", &tok, err) != 0 &&
        (!lora || tok_load_under(c->conf->data_roots, c->base_dir, "model", &tok, err) != 0)) {
        rc = err->code;
        snprintf(err->field, sizeof err->field, "model");
    }
    if (rc == 0)
        rc = encode_prompt(c->body, tok, &ids, err);
    if (rc == 0)
        rc = size_request(c, &cfg, &ids, roots, dir, w, err);
    if (rc == 0) {
        json_object_set_new(w, "model_dir", json_string(dir));
        json_object_set_new(w, "roots", json_string(roots));
        if (lora) { /* the worker loads the base, then the adapters */
            json_object_set_new(w, "base_dir", json_string(c->base_dir));
            json_object_set_new(w, "base_roots", json_string(c->conf->data_roots));
        }
        if ((c->request = json_dumps(w, JSON_COMPACT)) == NULL)
            rc = acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    }
    free(ids.v);
    tok_free(tok);
    json_decref(w);
    return rc;
}

static void check_work(void *ctx)
{
    gen_check *c = ctx;
    c->rc = check_request(c, &c->err);
}

/* ---- step 3: the answer, written as the worker's events come ---------- */

typedef struct gen_call {
    api_server *srv;
    struct MHD_Connection *conn;
    genq *q;
    genq_req *req;            /* NULL once it ended (freed) */
    bool stream;
    bool suspended, ping, ending, http_gone, answered;
    char model[PATH_MAX];
    int n_prompt;
    uint64_t mem_bytes;       /* the device bytes reserved for it */
    double queued_at, started_at;
    char *out;                /* what is still to be sent */
    size_t len, off, cap;
} gen_call;

static int out_put(gen_call *g, const char *a, size_t n)
{
    if (g->len + n > g->cap) {
        size_t cap = g->cap ? g->cap : 1024;
        while (cap < g->len + n)
            cap *= 2;
        char *nb = realloc(g->out, cap);
        if (nb == NULL)
            return -1;
        g->out = nb;
        g->cap = cap;
    }
    memcpy(g->out + g->len, a, n);
    g->len += n;
    return 0;
}

static void sse(gen_call *g, const char *type, const char *json, size_t len)
{
    char head[64];
    int h = snprintf(head, sizeof head, "event: %s\ndata: ", type);
    out_put(g, head, (size_t)h);
    out_put(g, json, len);
    out_put(g, "\n\n", 2);
}

static void resume(gen_call *g)
{
    if (!g->suspended)
        return;
    g->suspended = false;
    MHD_resume_connection(g->conn);
    api_server_kick(g->srv);
}

/* done's fields, with the model, the prompt's size and the queue time. */
static char *done_json(gen_call *g, const char *json, size_t len)
{
    json_t *o = json_loadb(json, len, 0, NULL);
    if (o == NULL)
        return NULL;
    json_object_set_new(o, "model", json_string(g->model));
    json_object_set_new(o, "queue_s", json_real(g->started_at > 0 ? g->started_at - g->queued_at : 0));
    json_object_set_new(o, "device_planned_bytes", json_integer((json_int_t)g->mem_bytes));
    char *text = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return text;
}

/* An error of the worker as the API writes errors: {"error":{...}}. */
static char *error_json(const char *json, size_t len)
{
    json_t *e = json_loadb(json, len, 0, NULL);
    json_t *o = e ? json_pack("{s:o}", "error", e) : NULL;
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return text;
}

static void call_free(gen_call *g)
{
    free(g->out);
    free(g);
}

/* The queue's events (loop thread). */
static void on_gen_event(void *ctx, genq_req *r, const char *type, const char *json, size_t len)
{
    gen_call *g = ctx;
    if (!strcmp(type, "end")) {
        genq_req_free(r);
        g->req = NULL;
        if (g->http_gone) {
            call_free(g);
            return;
        }
        if (!g->answered) { /* the end came without done or error */
            const char *e = "{\"error\":{\"code\":\"internal\",\"message\":\"the generation ended without an answer\"}}";
            if (g->stream)
                sse(g, "error", e, strlen(e));
            else
                out_put(g, e, strlen(e));
        }
        resume(g);
        return;
    }
    if (!strcmp(type, "started"))
        g->started_at = r->started_at;
    if (g->http_gone)
        return;
    bool final = !strcmp(type, "done") || !strcmp(type, "error");
    char *text = !strcmp(type, "done") ? done_json(g, json, len) : !strcmp(type, "error") ? error_json(json, len)
                                                                                           : NULL;
    if (g->stream) {
        if (text != NULL)
            sse(g, type, text, strlen(text));
        else
            sse(g, type, json, len);
    } else if (final && text != NULL && !g->answered) {
        out_put(g, text, strlen(text));
        out_put(g, "\n", 1);
    }
    g->answered |= final && (text != NULL || g->stream);
    free(text);
    resume(g);
}

static ssize_t call_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    gen_call *g = cls;
    (void)pos;
    if (g->off == g->len) {
        g->off = g->len = 0;
        if (g->ping && g->req != NULL && !g->answered && !g->ending) /* a keep-alive: SSE comment, or a space before JSON */
            out_put(g, g->stream ? ":\n\n" : " ", g->stream ? 3 : 1);
        g->ping = false;
    }
    if (g->off < g->len) {
        size_t n = g->len - g->off < max ? g->len - g->off : max;
        memcpy(buf, g->out + g->off, n);
        g->off += n;
        return (ssize_t)n;
    }
    if (g->req == NULL || g->ending)
        return MHD_CONTENT_READER_END_OF_STREAM;
    g->suspended = true;
    MHD_suspend_connection(g->conn);
    return 0;
}

/* The connection is done with the answer: sent, or the client left. */
static void call_response_freed(void *cls)
{
    gen_call *g = cls;
    g->http_gone = true;
    g->suspended = false;
    if (g->req == NULL) {
        call_free(g);
        return;
    }
    genq_cancel(g->q, g->req); /* "end" now (queued) or once the worker is gone: frees g */
}

static void check_done(void *ctx, api_response *resp, bool orphaned)
{
    gen_check *c = ctx;
    gen_call *g = NULL;
    if (orphaned || resp == NULL)
        goto out;
    if (c->rc != 0) {
        api_resp_from_err(resp, &c->err);
        goto out;
    }
    jobs_mgr *m = api_server_app(c->srv);
    g = calloc(1, sizeof *g);
    if (g == NULL) {
        api_resp_error(resp, 500, "internal", NULL, "out of memory");
        goto out;
    }
    *g = (gen_call){.srv = c->srv, .conn = c->conn, .q = m->gen, .stream = c->stream, .n_prompt = c->n_prompt,
                     .mem_bytes = c->mem_bytes};
    snprintf(g->model, sizeof g->model, "%s", c->model_name);
    g->req = genq_req_new(m->gen, c->who.name, c->request, c->mem_bytes, on_gen_event, g);
    struct MHD_Response *mr = g->req ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, call_reader,
                                                                         g, call_response_freed)
                                     : NULL;
    if (mr == NULL) {
        genq_req_free(g->req);
        call_free(g);
        api_resp_error(resp, 500, "internal", NULL, "out of memory");
        goto out;
    }
    acc_err err = {0};
    g->queued_at = job_now();
    if (genq_submit(m->gen, g->req, &err) != 0) {
        /* the response was never queued: it frees g through call_response_freed */
        genq_req_free(g->req);
        g->req = NULL;
        MHD_destroy_response(mr);
        api_resp_from_err(resp, &err);
        goto out;
    }
    MHD_add_response_header(mr, MHD_HTTP_HEADER_CONTENT_TYPE, c->stream ? "text/event-stream" : "application/json");
    MHD_add_response_header(mr, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(mr, "X-Accel-Buffering", "no");
    resp->status = 200;
    resp->mhd = mr;
out:
    json_decref(c->body);
    free(c->request);
    free(c);
}

/* ---- step 1: the loop thread's part ------------------------------------ */

/* "job:<id>": the job's export, then its checkpoints newest first. */
static int job_dirs(api_server *s, const api_request *req, const char *id, gen_check *c, api_response *resp)
{
    jobs_mgr *m = api_server_app(s);
    job *j = jobs_find(m, id);
    if (j == NULL) {
        api_resp_error(resp, 400, "invalid", "model", "no job '%s'", id);
        return -1;
    }
    if (req->who->role != API_ROLE_ADMIN && strcmp(req->who->name, j->owner) != 0) {
        api_resp_error(resp, 403, "forbidden", "model", "only the job's owner or an admin may generate with job %s",
                       j->id);
        return -1;
    }
    snprintf(c->job_id, sizeof c->job_id, "%s", j->id);
    if (j->spec.lora.r > 0)
        snprintf(c->base_dir, sizeof c->base_dir, "%s", j->spec.model.from);
    job_export_dir(j, m->conf->output_root, c->dirs[c->ndirs++], PATH_MAX);
    for (int i = JOB_MAX_OUTPUTS - 1; i >= 0; i--)
        if (j->outputs[i] != NULL && c->ndirs < GEN_MAX_DIRS)
            snprintf(c->dirs[c->ndirs++], PATH_MAX, "%s", j->outputs[i]);
    return 0;
}

/* Open generate requests: of `who`, and in all. */
static void count_open(const genq *q, const char *who, int *all, int *mine)
{
    *all = *mine = 0;
    for (const genq_req *r = q->head; r != NULL; r = r->next) {
        (*all)++;
        *mine += !strcmp(r->owner, who);
    }
}

static bool admit(api_server *s, const api_request *req, const genq *q, api_response *resp)
{
    const acc_conf *conf = api_server_conf(s);
    int all, mine;
    count_open(q, req->who->name, &all, &mine);
    if (mine >= conf->user_max_streams)
        api_resp_error(resp, 429, "too_many_requests", NULL,
                       "user_max_streams %d reached: %s has %d generate requests open; wait for one to finish",
                       conf->user_max_streams, req->who->name, mine);
    else if (all >= conf->max_streams)
        api_resp_error(resp, 503, "unavailable", NULL,
                       "max_streams %d reached: %d generate requests are open; try again later", conf->max_streams,
                       all);
    else
        return true;
    resp->close = true;
    return false;
}

void api_generate(api_server *s, const api_request *req, api_response *resp)
{
    jobs_mgr *m = api_server_app(s);
    if (m->gen == NULL) {
        api_resp_error(resp, 503, "unavailable", NULL, "this daemon does not generate");
        return;
    }
    if (req->body_len == 0) {
        api_resp_error(resp, 400, "invalid", NULL,
                       "empty body: send {\"model\": DIR or \"job:<id>\", \"prompt\" or \"messages\"}");
        return;
    }
    if (!admit(s, req, m->gen, resp))
        return;
    json_error_t je;
    json_t *body = json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &je);
    if (body == NULL || !json_is_object(body)) {
        json_decref(body);
        api_resp_error(resp, 400, "invalid", NULL, body ? "the request must be a JSON object"
                                                        : "malformed JSON at line %d column %d", je.line, je.column);
        return;
    }
    gen_check *c = calloc(1, sizeof *c);
    if (c == NULL) {
        json_decref(body);
        api_resp_error(resp, 500, "internal", NULL, "out of memory");
        return;
    }
    *c = (gen_check){.conf = api_server_conf(s), .body = body, .srv = s, .conn = req->conn, .who = *req->who,
                     .stream = json_is_true(json_object_get(body, "stream"))};
    for (int i = 0; i < m->ndev; i++)
        if (m->devs[i].mem_total > c->largest_dev)
            c->largest_dev = m->devs[i].mem_total;
    const char *mname = json_string_value(json_object_get(body, "model"));
    if (mname != NULL && !strncmp(mname, "job:", 4) && job_dirs(s, req, mname + 4, c, resp) != 0) {
        json_decref(body);
        free(c);
        return;
    }
    resp->deferred = api_defer(s, check_work, check_done, c); /* check_done frees c, even when refused */
    if (resp->deferred == NULL)
        api_resp_error(resp, 503, "unavailable", NULL,
                       "too many requests being worked on (at most %d at a time); try again", API_MAX_DEFERRED);
}

/* Every second (the server's reap timer): each waiting answer writes a
 * keep-alive, which finds the clients that went away. */
void api_generate_ping_all(api_server *s)
{
    jobs_mgr *m = api_server_app(s);
    if (m == NULL || m->gen == NULL)
        return;
    for (genq_req *r = m->gen->head; r != NULL; r = r->next) {
        gen_call *g = r->sink_ctx;
        if (g != NULL && r->sink == on_gen_event && g->suspended) {
            g->ping = true;
            resume(g);
        }
    }
}

/* The server stops: every answer ends now (MHD stops with none suspended). */
void api_generate_end_all(api_server *s)
{
    jobs_mgr *m = api_server_app(s);
    if (m == NULL || m->gen == NULL)
        return;
    for (genq_req *r = m->gen->head; r != NULL; r = r->next) {
        gen_call *g = r->sink_ctx;
        if (g != NULL && r->sink == on_gen_event) {
            g->ending = true;
            resume(g);
        }
    }
}
