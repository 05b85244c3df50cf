/* gen_main: a generate request's worker process (gen_proto.h): the model
 * loaded on the lent device, the engine (core/model/generate.h) run on the
 * request, each token written up as it comes. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "fsutil.h"
#include "gen_proto.h"
#include "generate.h"
#include "kern_device.h"
#include "model.h"
#include "model_hf.h"
#include "tok.h"
#include "wproc.h"

typedef struct gworker {
    pthread_mutex_t wmu;    /* one line at a time on the channel */
    int heartbeat_ms;
} gworker;

/* `o` (taken) as one line up the channel. */
static void send_json(gworker *w, json_t *o)
{
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (text == NULL)
        return;
    size_t n = strlen(text);
    text[n] = '\0';
    pthread_mutex_lock(&w->wmu);
    int rc = fsu_write_all(GW_FD, text, n, NULL);
    if (rc == 0)
        rc = fsu_write_all(GW_FD, "\n", 1, NULL);
    pthread_mutex_unlock(&w->wmu);
    free(text);
    if (rc != 0) /* the daemon is gone: nobody wants the rest */
        _exit(0);
}

static void *heartbeat_thread(void *arg)
{
    gworker *w = arg;
    struct timespec ts = {w->heartbeat_ms / 1000, (long)(w->heartbeat_ms % 1000) * 1000000L};
    for (;;) {
        send_json(w, json_pack("{s:s}", "event", "heartbeat"));
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void send_error(gworker *w, const acc_err *err)
{
    send_json(w, json_pack("{s:s, s:s, s:s, s:s}", "event", "error", "code", acc_err_name(err->code), "message",
                           err->msg, "field", err->field));
}

/* A token and its text; id < 0 is the engine's last piece of text held
 * back (an incomplete character at the end): sent without an id. */
static int token_cb(void *ctx, int32_t id, const char *piece, size_t len)
{
    json_t *o = json_pack("{s:s, s:s%}", "event", "token", "text", piece ? piece : "", piece ? len : 0);
    if (o != NULL && id >= 0)
        json_object_set_new(o, "id", json_integer(id));
    send_json(ctx, o);
    return 0;
}

/* The request's sampling keys (checked by the API; checked again by
 * gen_params_check). */
static int read_params(json_t *req, gen_params *p, const char **stop, int32_t *eos, acc_err *err)
{
    gen_params_default(p);
    json_t *v;
    if ((v = json_object_get(req, "max_new_tokens")) != NULL)
        p->max_new_tokens = (int)json_integer_value(v);
    if ((v = json_object_get(req, "temperature")) != NULL)
        p->temperature = (float)json_number_value(v);
    if ((v = json_object_get(req, "top_k")) != NULL)
        p->top_k = (int)json_integer_value(v);
    if ((v = json_object_get(req, "top_p")) != NULL)
        p->top_p = (float)json_number_value(v);
    if ((v = json_object_get(req, "repetition_penalty")) != NULL)
        p->repetition_penalty = (float)json_number_value(v);
    if ((v = json_object_get(req, "seed")) != NULL)
        p->seed = (uint64_t)json_integer_value(v);
    json_t *a = json_object_get(req, "stop");
    for (size_t i = 0; i < json_array_size(a) && i < GEN_MAX_STOP; i++)
        stop[p->n_stop++] = json_string_value(json_array_get(a, i));
    p->stop = stop;
    a = json_object_get(req, "eos");
    int n = 0;
    for (size_t i = 0; i < json_array_size(a) && i < GEN_MAX_EOS; i++)
        eos[n++] = (int32_t)json_integer_value(json_array_get(a, i));
    p->eos = eos;
    p->n_eos = n;
    return gen_params_check(p, err);
}

static int read_prompt(json_t *req, tok_ids *ids, acc_err *err)
{
    json_t *a = json_object_get(req, "prompt_ids");
    size_t n = json_array_size(a);
    if (n == 0)
        return acc_err_set(err, ACC_EINVAL, "prompt", "an empty prompt");
    ids->v = malloc(n * sizeof *ids->v);
    if (ids->v == NULL)
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    for (size_t i = 0; i < n; i++)
        ids->v[i] = (int32_t)json_integer_value(json_array_get(a, i));
    ids->n = ids->cap = n;
    return 0;
}

static json_t *ids_array(const int32_t *v, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a != NULL && i < n; i++)
        json_array_append_new(a, json_integer(v[i]));
    return a;
}

/* The answer: its text and ids, why it stopped, the prompt's ids, the
 * device bytes it held at most (the daemon's reservation is predicted to
 * equal them on a CPU device). */
static void send_done(gworker *w, const gen_result *res, const tok_ids *prompt, uint64_t device_peak)
{
    send_json(w, json_pack("{s:s, s:s%, s:o*, s:o*, s:s, s:i, s:i, s:f, s:f, s:I}", "event", "done", "text",
                           res->text ? res->text : "", res->text ? res->text_len : 0, "tokens",
                           ids_array(res->tokens, (size_t)res->n_tokens), "prompt_ids",
                           ids_array(prompt->v, prompt->n), "finish_reason", gen_stop_name(res->reason),
                           "prompt_tokens", res->n_prompt, "completion_tokens", res->n_tokens, "prefill_s",
                           res->prefill_s, "decode_s", res->decode_s, "device_peak_bytes",
                           (json_int_t)device_peak));
}

/* Load, generate, report. Every failure is an "error" line. */
static int generate(gworker *w, const gw_init *in, json_t *req, acc_err *err)
{
    const char *dir = json_string_value(json_object_get(req, "model_dir"));
    const char *roots = json_string_value(json_object_get(req, "roots"));
    /* a LoRA job's adapters in dir: the base model here (gen_lora_config) */
    const char *base = json_string_value(json_object_get(req, "base_dir"));
    const char *base_roots = json_string_value(json_object_get(req, "base_roots"));
    int max_positions = (int)json_integer_value(json_object_get(req, "max_positions"));
    if (max_positions < 1)
        return acc_err_set(err, ACC_EINVAL, "model", "no positions to generate in");
    const char *stop[GEN_MAX_STOP];
    int32_t eos[GEN_MAX_EOS];
    gen_params p;
    tok_ids prompt = {0};
    model_config cfg;
    kern_device *dev = NULL;
    model *m = NULL;
    tok_tokenizer *tok = NULL;
    gen_ctx *c = NULL;
    gen_result res;
    memset(&res, 0, sizeof res);
    int rc = dir == NULL ? acc_err_set(err, ACC_EINVAL, "model", "no model directory") : 0;
    if (rc == 0)
        rc = read_params(req, &p, stop, eos, err);
    if (rc == 0)
        rc = read_prompt(req, &prompt, err);
    if (rc == 0)
        rc = model_hf_config_only(base ? base_roots : roots, base ? base : dir, &cfg, err);
    if (rc == 0 && base != NULL)
        rc = gen_lora_config(roots, dir, &cfg, err);
    if (rc == 0)
        rc = kern_device_open(&in->device, in->threads, &dev, err);
    if (rc == 0)
        rc = model_create_ex(dev, &cfg, &(model_opts){.T = max_positions}, &m, err); /* no activations */
    if (rc == 0)
        rc = model_hf_load_under(m, base ? base_roots : roots, base ? base : dir, err);
    if (rc == 0 && base != NULL)
        rc = gen_lora_load(m, roots, dir, err);
    if (rc == 0 && tok_load_under(roots, dir, "model", &tok, err) != 0)
        rc = base ? tok_load_under(base_roots, base, "model", &tok, err) : err->code;
    if (rc == 0)
        rc = gen_ctx_new(m, tok, max_positions, &c, err);
    if (rc == 0)
        rc = gen_run(c, prompt.v, (int)prompt.n, &p, token_cb, w, &res, err);
    if (rc == 0)
        send_done(w, &res, &prompt, dev->peak); /* all it held on the device: weights, cache, scratch */
    gen_result_free(&res);
    gen_ctx_free(c);
    tok_free(tok);
    model_free(m);
    if (dev != NULL)
        kern_device_close(dev);
    free(prompt.v);
    return rc;
}

static int check_init(const gw_init *in)
{
    return in->magic == GW_MAGIC && in->size == sizeof *in && in->threads >= 1 && in->nice >= 0 && in->nice <= 19 &&
                   in->heartbeat_ms >= 10 &&
                   in->request_len > 0 && in->request_len <= GW_MAX_REQUEST
               ? 0
               : -1;
}

/* `by` below the daemon's priority (inherited). Nice is per thread on
 * Linux: every thread there is now (a library's made at load, e.g. a BLAS
 * pool) is lowered, and the ones made after inherit it from this one. */
static void lower_priority(const char *id, int by)
{
    errno = 0;
    int now = getpriority(PRIO_PROCESS, 0);
    int want = errno == 0 && now + by < 19 ? now + by : 19;
    DIR *d = by > 0 ? opendir("/proc/self/task") : NULL;
    if (by > 0 && d == NULL)
        fprintf(stderr, "accumd --generate %s: /proc/self/task: %s\n", id, strerror(errno));
    for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;) {
        char *end;
        long tid = strtol(e->d_name, &end, 10);
        if (e->d_name[0] != '.' && *end == '\0' && setpriority(PRIO_PROCESS, (id_t)tid, want) != 0 && errno != ESRCH)
            fprintf(stderr, "accumd --generate %s: cannot set thread %ld's nice to %d: %s\n", id, tid, want,
                    strerror(errno));
    }
    if (d != NULL)
        closedir(d);
}

int gen_worker_main(int argc, char **argv)
{
    static gworker w; /* its detached heartbeat thread outlives this frame */
    acc_err aerr = {0};
    if (argc != 4 || wp_child_attach(argv[3], &aerr) != 0) {
        fprintf(stderr, "accumd --generate: %s\n", argc != 4 ? "usage: accumd --generate ID DAEMON_PID" : aerr.msg);
        return GW_EXIT_SETUP;
    }
    gw_init in;
    char *text = NULL;
    if (fsu_read_exact(GW_FD, &in, sizeof in, NULL) != 0 ||
        check_init(&in) != 0 || (text = malloc(in.request_len)) == NULL || fsu_read_exact(GW_FD, text, in.request_len, NULL) != 0) {
        fprintf(stderr, "accumd --generate %s: no valid start message from the daemon\n", argv[2]);
        free(text);
        return GW_EXIT_SETUP;
    }
    lower_priority(argv[2], in.nice);
    pthread_mutex_init(&w.wmu, NULL);
    w.heartbeat_ms = in.heartbeat_ms;
    pthread_t th;
    if (pthread_create(&th, NULL, heartbeat_thread, &w) != 0 || pthread_detach(th) != 0)
        return GW_EXIT_SETUP;
    json_error_t je;
    json_t *req = json_loadb(text, in.request_len, 0, &je);
    free(text);
    acc_err err = {0};
    if (req == NULL)
        acc_err_set(&err, ACC_EINVAL, NULL, "the request is not JSON: %s", je.text);
    if (req == NULL || generate(&w, &in, req, &err) != 0)
        send_error(&w, &err);
    json_decref(req);
    /* the lines are out; the heartbeat thread ends with the process */
    pthread_mutex_lock(&w.wmu);
    return 0;
}
