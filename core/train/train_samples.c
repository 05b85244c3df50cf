/* train_samples: see train_samples.h. */
#include "train_samples.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "generate.h"
#include "tok.h"

typedef struct tsamp_prompt {
    char *shown;   /* the prompt as the event shows it */
    tok_ids ids;
} tsamp_prompt;

struct tsamp {
    tok_tokenizer *tok;
    tsamp_prompt p[SPEC_EVAL_PROMPTS];
    int n, longest;
    int32_t eos[GEN_MAX_EOS];
    int n_eos;
};

void tsamp_free(tsamp *ts)
{
    if (ts == NULL)
        return;
    for (int i = 0; i < ts->n; i++) {
        free(ts->p[i].shown);
        tok_ids_free(&ts->p[i].ids);
    }
    tok_free(ts->tok);
    free(ts);
}

static int encode_one(tsamp *ts, const train_cfg *s, const json_t *v, tsamp_prompt *p, acc_err *err)
{
    if (json_is_string(v)) {
        p->shown = strdup(json_string_value(v));
        if (p->shown == NULL)
            return acc_err_set(err, ACC_ENOMEM, "", "out of host memory");
        return gen_encode_text(ts->tok, json_string_value(v), json_string_length(v), &p->ids, err);
    }
    p->shown = json_dumps(v, JSON_COMPACT);
    if (p->shown == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory");
    const char *tpl = s->data.chat_template[0] ? s->data.chat_template : "auto";
    return gen_encode_chat(ts->tok, tpl, (json_t *)v, "data.chat_template", &p->ids, err);
}

/* The eos ids: model.from's generation_config.json, else the tokenizer's. */
static void find_eos(tsamp *ts, const train_cfg *s)
{
    acc_err e = {0};
    if (s->model.from[0] != '\0')
        gen_eos_from_dir(s->data_roots, s->model.from, ts->eos, GEN_MAX_EOS, &ts->n_eos, &e);
    const tok_config *tc = tok_get_config(ts->tok);
    if (ts->n_eos == 0 && tc != NULL && tc->eos_id >= 0)
        ts->eos[ts->n_eos++] = tc->eos_id;
}

int tsamp_new(const train_cfg *s, const model_config *cfg, tsamp **out, acc_err *err)
{
    *out = NULL;
    if (s->eval_prompts[0] == '\0')
        return 0;
    json_t *a = json_loads(s->eval_prompts, 0, NULL);
    tsamp *ts = calloc(1, sizeof *ts);
    if (a == NULL || ts == NULL) {
        json_decref(a);
        free(ts);
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory");
    }
    const char *dir = s->data.tokenizer[0] ? s->data.tokenizer : s->model.from;
    int rc = tok_load_under(s->data_roots, dir, "eval_prompts", &ts->tok, err);
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v) {
        if (rc != 0 || ts->n >= SPEC_EVAL_PROMPTS)
            break;
        tsamp_prompt *p = &ts->p[ts->n++];
        rc = encode_one(ts, s, v, p, err);
        if (rc == 0 && (p->ids.n < 1 || p->ids.n + 1 >= (size_t)cfg->max_seq_len))
            rc = acc_err_set(err, ACC_EINVAL, "eval_prompts", "eval_prompts[%zu] has %zu tokens; the model "
                             "takes 1 to %d", i, p->ids.n, cfg->max_seq_len - 2);
        if (rc == 0 && (int)p->ids.n > ts->longest)
            ts->longest = (int)p->ids.n;
    }
    json_decref(a);
    if (rc != 0) {
        tsamp_free(ts);
        return rc;
    }
    find_eos(ts, s);
    *out = ts;
    return 0;
}

int tsamp_run(tsamp *ts, model *m, tsamp_fn fn, void *ctx, acc_err *err)
{
    gen_ctx *g;
    int rc = gen_ctx_new(m, ts->tok, ts->longest + TSAMP_MAX_NEW + 1, &g, err);
    if (rc != 0)
        return rc;
    gen_params p;
    gen_params_default(&p);
    p.max_new_tokens = TSAMP_MAX_NEW;
    p.temperature = TSAMP_TEMPERATURE;
    p.top_p = TSAMP_TOP_P;
    p.eos = ts->eos;
    p.n_eos = ts->n_eos;
    for (int i = 0; rc == 0 && i < ts->n; i++) {
        gen_result r;
        p.seed = (uint64_t)i; /* fixed: the answers change with the weights only */
        rc = gen_run(g, ts->p[i].ids.v, (int)ts->p[i].ids.n, &p, NULL, NULL, &r, err);
        if (rc == 0) {
            fn(ctx, i, ts->p[i].shown, r.text != NULL ? r.text : "");
            gen_result_free(&r);
        }
    }
    gen_ctx_free(g);
    return rc;
}
