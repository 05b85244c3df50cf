/* generate: see generate.h. */
#include "generate.h"

#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "blocks.h"
#include "chat.h"
#include "checked.h"
#include "fsutil.h"
#include "model_lora.h"
#include "safetensors.h"
#include "safepath.h"

#define GEN_CHUNK_MAX 256                /* prefill rows per call */
#define GEN_SCORES_MAX ((size_t)1 << 24) /* attention scratch floats the chunk is cut to */
#define GEN_JSON_MAX ((size_t)1 << 20)   /* bytes of generation_config.json */

struct gen_ctx {
    model *m;
    const tok_tokenizer *tok;
    int P;            /* positions */
    blk_infer s;      /* cache and scratch */
    float *logits;    /* host [V] */
    int *order;       /* host [V]: candidate ids, sorted */
    float *prob;      /* host [V] */
    uint8_t *seen;    /* host [V]: in prompt or output (repetition penalty) */
};

const char *gen_stop_name(gen_stop s)
{
    switch (s) {
    case GEN_STOP_LENGTH: return "length";
    case GEN_STOP_EOS: return "eos";
    case GEN_STOP_STRING: return "stop";
    case GEN_STOP_CALLBACK: return "callback";
    case GEN_STOP_POSITIONS: return "positions";
    }
    return "unknown";
}

/* ---- context */

static int chunk_of(const model_config *c, int P)
{
    size_t per = (size_t)c->n_head * (size_t)P; /* scores per row */
    size_t ch = GEN_SCORES_MAX / (per > 0 ? per : 1);
    ch = ch > GEN_CHUNK_MAX ? GEN_CHUNK_MAX : ch < 1 ? 1 : ch;
    return (int)(ch > (size_t)P ? (size_t)P : ch);
}

static int positions_of(const model_config *c, int max_positions)
{
    return max_positions > 0 && max_positions < c->max_seq_len ? max_positions : c->max_seq_len;
}

int gen_ctx_bytes(const model_config *cfg, int positions, uint64_t *bytes, acc_err *err)
{
    int P = positions_of(cfg, positions);
    *bytes = blk_infer_bytes(cfg, chunk_of(cfg, P), P);
    if (*bytes == ACC_SIZE_OVERFLOW)
        return acc_err_set(err, ACC_EINVAL, "max_new_tokens",
                           "the key/value cache for %d positions overflows sizes", P);
    return 0;
}

int gen_kv_value_bytes(const model_config *cfg) { return blk_infer_cache16(cfg) ? 2 : 4; }

uint64_t gen_kv_bytes(const model_config *cfg, int positions)
{
    uint64_t hs = (uint64_t)(cfg->head_dim > 0 ? cfg->head_dim : cfg->channels / cfg->n_head);
    uint64_t kv = (uint64_t)(cfg->n_kv_head > 0 ? cfg->n_kv_head : cfg->n_head);
    uint64_t per = 2 * (uint64_t)cfg->n_layer * kv * hs * (uint64_t)gen_kv_value_bytes(cfg);
    return acc_sat_mul3_u64(per, (uint64_t)positions_of(cfg, positions), 1);
}

int gen_ctx_new(model *m, const tok_tokenizer *tok, int max_positions, gen_ctx **out,
                acc_err *err)
{
    *out = NULL;
    if (m->family->infer == NULL)
        return acc_err_set(err, ACC_EINVAL, "model", "the %s family cannot generate",
                           m->family->name);
    if (m->dev->ops->attention_cache_fwd == NULL)
        return acc_err_set(err, ACC_EDEVICE, "device",
                           "the %s backend has no attention_cache_fwd (generation)",
                           m->dev->ops->backend);
    gen_ctx *c = calloc(1, sizeof *c);
    size_t V = (size_t)m->cfg.vocab_size;
    if (c != NULL) {
        c->logits = malloc(V * sizeof *c->logits);
        c->prob = malloc(V * sizeof *c->prob);
        c->order = malloc(V * sizeof *c->order);
        c->seen = malloc(V);
    }
    if (c == NULL || !c->logits || !c->prob || !c->order || !c->seen) {
        gen_ctx_free(c);
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory for generation");
    }
    c->m = m;
    c->tok = tok;
    c->P = positions_of(&m->cfg, max_positions);
    int rc = blk_infer_alloc(m, chunk_of(&m->cfg, c->P), c->P, &c->s, err);
    if (rc != 0) {
        gen_ctx_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

void gen_ctx_free(gen_ctx *c)
{
    if (c == NULL)
        return;
    if (c->m != NULL)
        blk_infer_free(c->m, &c->s);
    free(c->logits);
    free(c->prob);
    free(c->order);
    free(c->seen);
    free(c);
}

int gen_ctx_positions(const gen_ctx *c)
{
    return c->P;
}

/* ---- parameters */

void gen_params_default(gen_params *p)
{
    *p = (gen_params){.max_new_tokens = 128, .top_p = 1.0f, .repetition_penalty = 1.0f};
}

int gen_params_check(const gen_params *p, acc_err *err)
{
    if (p->max_new_tokens < 1 || p->max_new_tokens > GEN_MAX_NEW_TOKENS)
        return acc_err_set(err, ACC_EINVAL, "max_new_tokens", "must be in [1, %d], got %d",
                           GEN_MAX_NEW_TOKENS, p->max_new_tokens);
    if (!(p->temperature >= 0.0f && p->temperature <= 100.0f))
        return acc_err_set(err, ACC_EINVAL, "temperature", "must be in [0, 100]");
    if (p->top_k < 0)
        return acc_err_set(err, ACC_EINVAL, "top_k", "must be >= 0, got %d", p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return acc_err_set(err, ACC_EINVAL, "top_p", "must be in (0, 1]");
    if (!(p->repetition_penalty > 0.0f && p->repetition_penalty <= 100.0f))
        return acc_err_set(err, ACC_EINVAL, "repetition_penalty", "must be in (0, 100]");
    if (p->n_stop < 0 || p->n_stop > GEN_MAX_STOP || (p->n_stop > 0 && p->stop == NULL))
        return acc_err_set(err, ACC_EINVAL, "stop", "at most %d stop strings", GEN_MAX_STOP);
    for (int i = 0; i < p->n_stop; i++) {
        size_t n = p->stop[i] != NULL ? strlen(p->stop[i]) : 0;
        if (n < 1 || n > GEN_MAX_STOP_LEN)
            return acc_err_set(err, ACC_EINVAL, "stop", "stop[%d] must have 1 to %d bytes", i,
                               GEN_MAX_STOP_LEN);
    }
    if (p->n_eos < 0 || p->n_eos > GEN_MAX_EOS || (p->n_eos > 0 && p->eos == NULL))
        return acc_err_set(err, ACC_EINVAL, "eos_token_id", "at most %d ids", GEN_MAX_EOS);
    return 0;
}

/* ---- choosing a token */

/* A 64-bit mix (the finaliser of a well-known hash family): every input
 * bit changes about half of the output bits. */
static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

/* The draw of step `step` under `seed`: uniform in [0, 1), a pure function
 * of both (counter-based: nothing carried between steps or threads). */
static double uniform_at(uint64_t seed, uint64_t step)
{
    uint64_t x = mix64(mix64(seed ^ 0x9e3779b97f4a7c15ULL) + step * 0x9e3779b97f4a7c15ULL);
    return (double)(x >> 11) * (1.0 / 9007199254740992.0);
}

static int by_logit(const void *a, const void *b, void *logits)
{
    const float *l = logits;
    float x = l[*(const int *)a], y = l[*(const int *)b];
    if (x != y)
        return x > y ? -1 : 1;
    return *(const int *)a - *(const int *)b; /* ties: the lower id first */
}

static int argmax(const float *l, int V)
{
    int best = 0;
    for (int i = 1; i < V; i++)
        if (l[i] > l[best])
            best = i;
    return best;
}

static void penalise(gen_ctx *c, float pen, int V)
{
    if (pen == 1.0f)
        return;
    for (int i = 0; i < V; i++)
        if (c->seen[i])
            c->logits[i] = c->logits[i] > 0 ? c->logits[i] / pen : c->logits[i] * pen;
}

/* Candidates by descending logit, cut by top_k and top_p, sampled with u. */
static int sample(gen_ctx *c, const gen_params *p, int V, double u)
{
    float *l = c->logits;
    for (int i = 0; i < V; i++)
        c->order[i] = i;
    qsort_r(c->order, (size_t)V, sizeof *c->order, by_logit, l);
    int n = p->top_k > 0 && p->top_k < V ? p->top_k : V;
    double mx = l[c->order[0]] / p->temperature, sum = 0;
    for (int i = 0; i < n; i++) {
        c->prob[i] = (float)exp(l[c->order[i]] / p->temperature - mx);
        sum += c->prob[i];
    }
    if (p->top_p < 1.0f) { /* the smallest head reaching top_p */
        double acc = 0;
        int keep = n;
        for (int i = 0; i < n; i++) {
            acc += c->prob[i] / sum;
            if (acc >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
        sum = 0;
        for (int i = 0; i < n; i++)
            sum += c->prob[i];
    }
    double target = u * sum, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += c->prob[i];
        if (target < acc)
            return c->order[i];
    }
    return c->order[n - 1];
}

/* ---- the text so far, streamed with stop strings */

typedef struct textbuf {
    char *text;      /* the decoded output */
    size_t len;
    size_t emitted;  /* bytes handed to the callback */
} textbuf;

/* Bytes at the end of t[0..n) that may still change: an incomplete UTF-8
 * character decodes as U+FFFD (EF BF BD) until its last byte comes. */
static size_t unstable_tail(const char *t, size_t n)
{
    return n >= 3 && memcmp(t + n - 3, "\xef\xbf\xbd", 3) == 0 ? 3 : 0;
}

/* The longest suffix of t[0..n) that is a proper prefix of a stop string. */
static size_t stop_prefix_tail(const char *t, size_t n, const gen_params *p)
{
    size_t best = 0;
    for (int i = 0; i < p->n_stop; i++) {
        size_t sl = strlen(p->stop[i]);
        for (size_t k = sl - 1 < n ? sl - 1 : n; k > best; k--)
            if (memcmp(t + n - k, p->stop[i], k) == 0) {
                best = k;
                break;
            }
    }
    return best;
}

/* The first stop string's position in t[from..n), or SIZE_MAX. */
static size_t find_stop(const char *t, size_t n, size_t from, const gen_params *p)
{
    size_t best = SIZE_MAX;
    for (int i = 0; i < p->n_stop; i++) {
        size_t sl = strlen(p->stop[i]);
        for (size_t j = from; j + sl <= n && j < best; j++)
            if (memcmp(t + j, p->stop[i], sl) == 0) {
                best = j;
                break;
            }
    }
    return best;
}

/* ---- the model */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The logits after seq[0..n) into c->logits, with the cache (rows p0..n
 * are new) or by a full forward over the model's activations. */
static int logits_after(gen_ctx *c, const int32_t *seq, int n, int p0, int no_cache,
                        acc_err *err)
{
    model *m = c->m;
    size_t V = (size_t)m->cfg.vocab_size;
    if (no_cache) {
        if (m->B < 1 || m->T < n)
            return acc_err_set(err, ACC_EINVAL, "no_cache",
                               "a full forward needs activations for %d positions (the model has "
                               "%d x %d)", n, m->B, m->T);
        int *tok = calloc((size_t)m->T * 2, sizeof *tok);
        float *w = calloc((size_t)m->T, sizeof *w);
        if (tok == NULL || w == NULL) {
            free(tok);
            free(w);
            return acc_err_set(err, ACC_ENOMEM, "", "out of host memory");
        }
        memcpy(tok, seq, (size_t)n * sizeof *tok); /* the rest pads (causal: unseen) */
        double loss;
        model_forward(m, tok, tok + m->T, w, 1, 0, &loss);
        free(tok);
        free(w);
        const float *lg = model_logits(m);
        if (lg == NULL)
            return acc_err_set(err, ACC_EINVAL, "no_cache", "the family exposes no logits");
        m->dev->ops->download(m->dev, c->logits,
                              lg + (size_t)(n - 1) * (size_t)m->cfg.padded_vocab_size,
                              V * sizeof(float));
    } else {
        for (int i = p0; i < n; i += c->s.chunk) {
            int k = n - i < c->s.chunk ? n - i : c->s.chunk;
            m->family->infer(m, &c->s, seq + i, k, i);
        }
        m->dev->ops->download(m->dev, c->logits, c->s.logits, V * sizeof(float));
    }
    return m->dev->ops->last_error != NULL ? m->dev->ops->last_error(m->dev, err) : 0;
}

static int is_eos(const gen_params *p, int32_t id)
{
    for (int i = 0; i < p->n_eos; i++)
        if (p->eos[i] == id)
            return 1;
    return 0;
}

/* The output's text again (whole: byte-level pieces join across tokens),
 * then what is new and stable goes to the callback. Returns 1 when a stop
 * string appeared (the text cut before it). */
static int text_update(gen_ctx *c, const gen_params *p, const int32_t *ids, int n, int32_t id,
                       textbuf *tb, gen_token_fn cb, void *cb_ctx, int *cb_stop, acc_err *err,
                       int *rc)
{
    char *t = NULL;
    size_t len = 0;
    *rc = tok_decode(c->tok, ids, (size_t)n, 1, &t, &len, err);
    if (*rc != 0)
        return 0;
    free(tb->text);
    tb->text = t;
    tb->len = len;
    size_t maxs = 0;
    for (int i = 0; i < p->n_stop; i++)
        maxs = strlen(p->stop[i]) > maxs ? strlen(p->stop[i]) : maxs;
    size_t from = tb->emitted > maxs ? tb->emitted - maxs : 0;
    size_t at = find_stop(t, len, from, p);
    size_t end = at != SIZE_MAX ? at : len - unstable_tail(t, len);
    if (at == SIZE_MAX) {
        size_t hold = stop_prefix_tail(t, end, p);
        end -= hold;
    }
    if (end < tb->emitted) /* a held-back byte changed: nothing new yet */
        end = tb->emitted;
    if (cb != NULL && cb(cb_ctx, id, t + tb->emitted, end - tb->emitted) != 0)
        *cb_stop = 1;
    tb->emitted = end;
    if (at != SIZE_MAX) {
        tb->len = at;
        tb->text[at] = '\0';
        return 1;
    }
    return 0;
}

int gen_run(gen_ctx *c, const int32_t *prompt, int n_prompt, const gen_params *p,
            gen_token_fn cb, void *cb_ctx, gen_result *out, acc_err *err)
{
    memset(out, 0, sizeof *out);
    int rc = gen_params_check(p, err);
    if (rc != 0)
        return rc;
    int V = c->m->cfg.vocab_size;
    if (n_prompt < 1 || n_prompt > c->P - 1)
        return acc_err_set(err, ACC_EINVAL, "prompt",
                           "the prompt has %d tokens; the model takes 1 to %d (positions %d)",
                           n_prompt, c->P - 1, c->P);
    memset(c->seen, 0, (size_t)V);
    for (int i = 0; i < n_prompt; i++) {
        if (prompt[i] < 0 || prompt[i] >= V)
            return acc_err_set(err, ACC_EINVAL, "prompt", "token %d (id %d) is not below the "
                               "vocabulary size %d", i, prompt[i], V);
        c->seen[prompt[i]] = 1;
    }
    int cap = n_prompt + p->max_new_tokens;
    int32_t *seq = malloc((size_t)cap * sizeof *seq);
    if (seq == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory");
    memcpy(seq, prompt, (size_t)n_prompt * sizeof *seq);
    textbuf tb = {0};
    int n = n_prompt, fed = 0, cb_stop = 0;
    gen_stop why = GEN_STOP_LENGTH;
    double t0 = now_s(), t1 = t0;
    while (rc == 0) {
        if ((rc = logits_after(c, seq, n, fed, p->no_cache, err)) != 0)
            break;
        fed = n;
        if (n == n_prompt)
            t1 = now_s();
        penalise(c, p->repetition_penalty, V);
        int32_t id = p->temperature == 0.0f
                         ? argmax(c->logits, V)
                         : sample(c, p, V, uniform_at(p->seed, (uint64_t)(n - n_prompt)));
        if (is_eos(p, id)) {
            why = GEN_STOP_EOS;
            break;
        }
        seq[n++] = id;
        c->seen[id] = 1;
        int hit = 0;
        if (c->tok != NULL)
            hit = text_update(c, p, seq + n_prompt, n - n_prompt, id, &tb, cb, cb_ctx, &cb_stop,
                              err, &rc);
        else if (cb != NULL)
            cb_stop = cb(cb_ctx, id, NULL, 0) != 0;
        if (rc != 0)
            break;
        if (hit) {
            why = GEN_STOP_STRING;
            break;
        }
        if (cb_stop) {
            why = GEN_STOP_CALLBACK;
            break;
        }
        if (n - n_prompt >= p->max_new_tokens)
            break;
        if (n >= c->P) {
            why = GEN_STOP_POSITIONS;
            break;
        }
    }
    if (rc == 0 && cb != NULL && c->tok != NULL && tb.emitted < tb.len && why != GEN_STOP_CALLBACK)
        cb(cb_ctx, -1, tb.text + tb.emitted, tb.len - tb.emitted); /* held back, no stop came */
    double t2 = now_s();
    if (rc != 0) {
        free(seq);
        free(tb.text);
        return rc;
    }
    out->n_prompt = n_prompt;
    out->n_tokens = n - n_prompt;
    out->tokens = malloc((size_t)(out->n_tokens > 0 ? out->n_tokens : 1) * sizeof *out->tokens);
    if (out->tokens == NULL) {
        free(seq);
        free(tb.text);
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory");
    }
    memcpy(out->tokens, seq + n_prompt, (size_t)out->n_tokens * sizeof *seq);
    free(seq);
    if (c->tok != NULL && tb.text == NULL)
        tb.text = calloc(1, 1);
    out->text = tb.text;
    out->text_len = tb.len;
    out->reason = why;
    out->prefill_s = t1 - t0;
    out->decode_s = t2 - t1;
    return 0;
}

void gen_result_free(gen_result *r)
{
    free(r->tokens);
    free(r->text);
    memset(r, 0, sizeof *r);
}

/* ---- prompts */

int gen_encode_text(const tok_tokenizer *tok, const char *text, size_t len, tok_ids *out,
                    acc_err *err)
{
    tok_encoder *e;
    int rc = tok_encoder_new(tok, &e, err);
    if (rc == 0) {
        rc = tok_encode(e, text, len, TOK_ADD_SPECIAL, out, err);
        tok_encoder_free(e);
    }
    return rc;
}

int gen_encode_chat(const tok_tokenizer *tok, const char *template_spec, json_t *messages,
                    const char *field, tok_ids *out, acc_err *err)
{
    jinja_template *tpl;
    int rc = chat_template_load(template_spec, tok, field, &tpl, err);
    if (rc != 0)
        return rc;
    json_t *vars = chat_vars(tok, messages, 1);
    tok_encoder *e = NULL;
    jinja_output o = {0};
    if (vars == NULL)
        rc = acc_err_set(err, ACC_ENOMEM, "", "out of host memory");
    if (rc == 0)
        rc = tok_encoder_new(tok, &e, err);
    if (rc == 0) {
        int64_t saved = tok_encoder_begin(e); /* one time bound for render + encode */
        jinja_limits lim = {.deadline_ns = tok_encoder_deadline(e),
                            .time_limit_ms = tok_encoder_time_limit_ms(e)};
        rc = jinja_render(tpl, vars, &lim, &o, err);
        if (rc == 0) /* the template wrote the special tokens itself */
            rc = tok_encode(e, o.text, o.len, 0, out, err);
        tok_encoder_end(e, saved);
        jinja_output_free(&o);
    }
    tok_encoder_free(e);
    json_decref(vars);
    jinja_free(tpl);
    return rc;
}

/* ---- eos ids */

/* eos_token_id of obj (an int or a list of ints) appended to ids. */
static int eos_of(const json_t *obj, int32_t *ids, int cap, int *n)
{
    const json_t *e = json_object_get(obj, "eos_token_id");
    if (json_is_integer(e)) {
        if (*n < cap && json_integer_value(e) >= 0 && json_integer_value(e) <= INT32_MAX)
            ids[(*n)++] = (int32_t)json_integer_value(e);
        return 1;
    }
    if (!json_is_array(e))
        return 0;
    size_t i;
    const json_t *v;
    json_array_foreach(e, i, v)
        if (json_is_integer(v) && *n < cap && json_integer_value(v) >= 0 &&
            json_integer_value(v) <= INT32_MAX)
            ids[(*n)++] = (int32_t)json_integer_value(v);
    return 1;
}

/* DIR/name parsed (NULL when absent or not JSON). */
static json_t *read_json_in(const char *roots, int dirfd, const char *dir, const char *name)
{
    int fd = -1;
    acc_err e = {0};
    if (sp_open_in(roots, dirfd, dir, name, "model", &fd, &e) != 0)
        return NULL;
    char *buf = NULL;
    size_t len = 0;
    json_t *j = NULL;
    if (fsu_read_fd(fd, name, &buf, &len, GEN_JSON_MAX, &e) == 0)
        j = json_loadb(buf, len, 0, NULL);
    free(buf);
    close(fd);
    return j;
}

int gen_eos_from_dir(const char *roots, const char *dir, int32_t *ids, int cap, int *n,
                     acc_err *err)
{
    *n = 0;
    int dfd;
    const char *r = roots != NULL ? roots : "";
    int rc = sp_open_dir(r, dir, "model", &dfd, NULL, 0, err);
    if (rc != 0)
        return rc;
    const char *names[] = {"generation_config.json", "config.json"};
    for (int i = 0; i < 2; i++) {
        json_t *j = read_json_in(r, dfd, dir, names[i]);
        int found = j != NULL && eos_of(j, ids, cap, n);
        json_decref(j);
        if (found)
            break;
    }
    close(dfd);
    return 0;
}

/* ---- LoRA adapter directories */

int gen_lora_config(const char *roots, const char *dir, model_config *cfg, acc_err *err)
{
    int dfd;
    const char *r = roots != NULL ? roots : "";
    int rc = sp_open_dir(r, dir, "model", &dfd, NULL, 0, err);
    if (rc != 0)
        return rc;
    json_t *j = read_json_in(r, dfd, dir, "adapter_config.json");
    close(dfd);
    const json_t *tm = json_object_get(j, "target_modules");
    spec_lora sl = {.r = (int)json_integer_value(json_object_get(j, "r")),
                    .alpha = json_number_value(json_object_get(j, "lora_alpha"))};
    if (j == NULL || sl.r < 1 || !(sl.alpha > 0) ||
        !(json_is_array(tm) || json_is_string(tm))) {
        json_decref(j);
        return acc_err_set(err, ACC_EINVAL, "model", "%s/adapter_config.json: want r >= 1, "
                           "lora_alpha > 0 and target_modules", dir);
    }
    if (json_is_string(tm))
        sl.all_linear = !strcmp(json_string_value(tm), "all-linear");
    size_t i;
    const json_t *v;
    json_array_foreach(json_is_array(tm) ? tm : NULL, i, v)
        if (json_is_string(v) && sl.n_targets < SPEC_LORA_MAX_TARGETS)
            snprintf(sl.targets[sl.n_targets++], SPEC_LORA_NAME_MAX, "%s", json_string_value(v));
    json_decref(j);
    return model_lora_apply(&sl, false, cfg, err);
}

int gen_lora_load(model *m, const char *roots, const char *dir, acc_err *err)
{
    int dfd, fd = -1;
    const char *r = roots != NULL ? roots : "";
    int rc = sp_open_dir(r, dir, "model", &dfd, NULL, 0, err);
    if (rc != 0)
        return rc;
    rc = sp_open_in(r, dfd, dir, "adapter_model.safetensors", "model", &fd, err);
    close(dfd);
    st_file *f = NULL;
    if (rc == 0)
        rc = st_open_fd(fd, "adapter_model.safetensors", &f, err);
    if (fd >= 0)
        close(fd);
    for (int i = 0; rc == 0 && i < m->layout.n; i++) {
        const model_tensor *t = &m->layout.t[i];
        st_tensor s;
        if (!t->adapter)
            continue;
        float *h = malloc(t->count * sizeof *h + 1);
        if (h == NULL)
            rc = acc_err_set(err, ACC_ENOMEM, "", "out of host memory");
        else if (st_get(f, t->name, &s, err) != 0 || s.ndim != t->ndim ||
                 s.shape[0] != t->shape[0] || (t->ndim > 1 && s.shape[1] != t->shape[1]))
            rc = acc_err_set(err, ACC_EINVAL, "model", "%s/adapter_model.safetensors: no %s of "
                             "shape [%lld, %lld]", dir, t->name, (long long)t->shape[0],
                             (long long)(t->ndim > 1 ? t->shape[1] : 1));
        else if ((rc = st_to_f32(&s, h, t->count, err)) == 0)
            model_weights_upload(m, h, t->offset, t->count);
        free(h);
    }
    st_close(f);
    return rc;
}
