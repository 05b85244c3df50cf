/* gen_dump: generate from a Hugging Face model directory on one CPU device
 * (generate.h) and print the result as JSON, for gen_check.py and bench.
 *
 * Usage: gen_dump DIR [options]
 *   --prompt I,J,K   prompt ids          --text STR   prompt text (--tok)
 *   --chat JSON      a conversation (--tok; --template NAME, default "auto")
 *   --tok DIR        tokenizer directory (text pieces, stop strings)
 *   --max N --temp X --top-k K --top-p X --rep X --seed S --threads N
 *   --stop STR (repeatable)  --eos ID (repeatable)  --eos-dir (DIR's eos ids)
 *   --no-cache       a full forward per token
 *   --positions P    cache positions (0: the model's)
 *   --lora R,ALPHA,MOD[+MOD]|all-linear --lora-seed S: adapters set to
 *                    seeded random values (B too, so they change the output),
 *                    applied unmerged; --save-merged DIR2 also writes the
 *                    merged model there
 *   --save-adapter DIR3  also writes the adapters as a PEFT directory there
 *   --adapter DIR3   a PEFT adapter directory applied unmerged (generate.h's
 *                    gen_lora_config + gen_lora_load), instead of --lora
 *   --stream         print each callback's piece as {"id":..,"piece":..} lines first
 * Output (stdout, last line): {"prompt": [...], "tokens": [...], "text": ...,
 * "reason": ..., "prefill_s": .., "decode_s": ..}. Exit 0, or 1 with the
 * error on stderr.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsutil.h"
#include "generate.h"
#include "kern_device.h"
#include "model.h"
#include "model_hf.h"
#include "model_lora.h"
#include "rng.h"

#define MAXN 16

typedef struct opts {
    const char *dir, *prompt, *text, *chat, *tok, *tmpl, *lora, *merged, *save_adapter, *adapter;
    const char *stop[MAXN];
    int32_t eos[MAXN];
    int n_stop, n_eos, eos_dir, threads, positions, stream;
    uint64_t lora_seed;
    gen_params p;
} opts;

static int die(const char *what, const acc_err *e)
{
    fprintf(stderr, "gen_dump: %s: %s (field %s)\n", what, e->msg, e->field);
    return 1;
}

static int parse(int argc, char **argv, opts *o)
{
    if (argc < 2)
        return -1;
    *o = (opts){.dir = argv[1], .threads = 1, .tmpl = "auto"};
    gen_params_default(&o->p);
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--no-cache"))
            o->p.no_cache = 1;
        else if (!strcmp(a, "--eos-dir"))
            o->eos_dir = 1;
        else if (!strcmp(a, "--stream"))
            o->stream = 1;
        else if (v == NULL)
            return -1;
        else if (i++, !strcmp(a, "--prompt"))
            o->prompt = v;
        else if (!strcmp(a, "--text"))
            o->text = v;
        else if (!strcmp(a, "--chat"))
            o->chat = v;
        else if (!strcmp(a, "--tok"))
            o->tok = v;
        else if (!strcmp(a, "--template"))
            o->tmpl = v;
        else if (!strcmp(a, "--max"))
            o->p.max_new_tokens = atoi(v);
        else if (!strcmp(a, "--temp"))
            o->p.temperature = (float)atof(v);
        else if (!strcmp(a, "--top-k"))
            o->p.top_k = atoi(v);
        else if (!strcmp(a, "--top-p"))
            o->p.top_p = (float)atof(v);
        else if (!strcmp(a, "--rep"))
            o->p.repetition_penalty = (float)atof(v);
        else if (!strcmp(a, "--seed"))
            o->p.seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--threads"))
            o->threads = atoi(v);
        else if (!strcmp(a, "--positions"))
            o->positions = atoi(v);
        else if (!strcmp(a, "--lora"))
            o->lora = v;
        else if (!strcmp(a, "--lora-seed"))
            o->lora_seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--save-merged"))
            o->merged = v;
        else if (!strcmp(a, "--save-adapter"))
            o->save_adapter = v;
        else if (!strcmp(a, "--adapter"))
            o->adapter = v;
        else if (!strcmp(a, "--stop") && o->n_stop < MAXN)
            o->stop[o->n_stop++] = v;
        else if (!strcmp(a, "--eos") && o->n_eos < MAXN)
            o->eos[o->n_eos++] = (int32_t)atoi(v);
        else
            return -1;
    }
    return 0;
}

/* "R,ALPHA,MOD+MOD" or "R,ALPHA,all-linear" through the spec's meaning. */
static int lora_opts(const char *s, model_config *cfg, acc_err *err)
{
    spec_lora sl = {0};
    char mods[256];
    if (sscanf(s, "%d,%lf,%255s", &sl.r, &sl.alpha, mods) != 3)
        return acc_err_set(err, ACC_EINVAL, "lora", "--lora R,ALPHA,MODULES");
    if (!strcmp(mods, "all-linear"))
        sl.all_linear = true;
    for (char *t = sl.all_linear ? NULL : strtok(mods, "+");
         t && sl.n_targets < SPEC_LORA_MAX_TARGETS; t = strtok(NULL, "+"))
        snprintf(sl.targets[sl.n_targets++], SPEC_LORA_NAME_MAX, "%s", t);
    return model_lora_apply(&sl, true, cfg, err);
}

/* Every adapter tensor N(0, 0.1) from the seed (B included: a trained one). */
static void lora_random(model *m, uint64_t seed)
{
    rng r;
    rng_seed(&r, seed, 0x10ca);
    for (int i = 0; i < m->layout.n; i++) {
        const model_tensor *t = &m->layout.t[i];
        if (!t->adapter)
            continue;
        float *h = malloc(t->count * sizeof *h);
        for (size_t j = 0; j < t->count; j++)
            h[j] = (float)(0.1 * rng_normal(&r));
        model_weights_upload(m, h, t->offset, t->count);
        free(h);
    }
}

static int save_merged(const model *m, const char *dir, const char *src, acc_err *err)
{
    float *host = malloc(m->nparams * sizeof *host);
    if (host == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    model_params_download(m, host);
    model_lora_merge_host(&m->layout, &m->cfg, host);
    model_hf_save_opts so = {.dtype = ST_F32, .src_dir = src, .host_params = host};
    int rc = model_hf_save(m, dir, &so, err);
    free(host);
    return rc;
}

static int save_adapter(const model *m, const char *dir, const char *base, acc_err *err)
{
    float *host = malloc(m->nparams * sizeof *host);
    if (host == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    model_params_download(m, host);
    int rc = fsu_mkdir_p(dir, 0750, err);
    if (rc == 0)
        rc = model_lora_save(&m->layout, &m->cfg, host, dir, base, err);
    free(host);
    return rc;
}

static int on_token(void *ctx, int32_t id, const char *piece, size_t len)
{
    (void)ctx;
    json_t *j = json_pack("{si s:s%}", "id", id, "piece", piece ? piece : "", piece ? len : 0);
    char *s = json_dumps(j, JSON_COMPACT);
    printf("%s\n", s);
    free(s);
    json_decref(j);
    return 0;
}

static int prompt_ids(const opts *o, const tok_tokenizer *tok, tok_ids *ids, acc_err *err)
{
    if (o->prompt != NULL) {
        for (const char *s = o->prompt; *s;) {
            char *end;
            long v = strtol(s, &end, 10);
            if (end == s)
                return acc_err_set(err, ACC_EINVAL, "prompt", "--prompt I,J,K");
            tok_ids_push(ids, (int32_t)v);
            s = *end == ',' ? end + 1 : end;
        }
        return 0;
    }
    if (tok == NULL)
        return acc_err_set(err, ACC_EINVAL, "prompt", "--text / --chat need --tok");
    if (o->text != NULL)
        return gen_encode_text(tok, o->text, strlen(o->text), ids, err);
    json_t *msgs = json_loads(o->chat ? o->chat : "", 0, NULL);
    if (msgs == NULL)
        return acc_err_set(err, ACC_EINVAL, "chat", "--chat must be a JSON array");
    int rc = gen_encode_chat(tok, o->tmpl, msgs, "chat_template", ids, err);
    json_decref(msgs);
    return rc;
}

int main(int argc, char **argv)
{
    opts o;
    if (parse(argc, argv, &o) != 0) {
        fprintf(stderr, "usage: gen_dump DIR [options] (see the source)\n");
        return 2;
    }
    acc_err err = {0};
    model_config cfg;
    if (model_hf_validate(o.dir, &cfg, &err) != 0)
        return die("validate", &err);
    if (o.lora != NULL && lora_opts(o.lora, &cfg, &err) != 0)
        return die("lora", &err);
    if (o.adapter != NULL && gen_lora_config(NULL, o.adapter, &cfg, &err) != 0)
        return die("adapter", &err);
    kern_device_info info = {.kind = KERN_DEV_CPU, .mem_total = 8ull << 30};
    snprintf(info.name, sizeof info.name, "cpu0");
    kern_device *d;
    if (kern_device_open(&info, o.threads, &d, &err) != 0)
        return die("device", &err);
    int P = o.positions > 0 && o.positions < cfg.max_seq_len ? o.positions : cfg.max_seq_len;
    model *m;
    if (model_create(d, &cfg, o.p.no_cache ? 1 : 0, P, &m, &err) != 0)
        return die("model", &err);
    if (model_hf_load_dir(m, o.dir, &err) != 0)
        return die("load", &err);
    if (o.lora != NULL)
        lora_random(m, o.lora_seed);
    if (o.adapter != NULL && gen_lora_load(m, NULL, o.adapter, &err) != 0)
        return die("adapter", &err);
    if (o.save_adapter != NULL && save_adapter(m, o.save_adapter, o.dir, &err) != 0)
        return die("save-adapter", &err);
    if (o.merged != NULL && save_merged(m, o.merged, o.dir, &err) != 0)
        return die("save-merged", &err);
    tok_tokenizer *tok = NULL;
    if (o.tok != NULL && tok_load_dir(o.tok, &tok, &err) != 0)
        return die("tokenizer", &err);
    tok_ids ids = {0};
    if (prompt_ids(&o, tok, &ids, &err) != 0)
        return die("prompt", &err);
    if (o.eos_dir) {
        int n = 0;
        if (gen_eos_from_dir(NULL, o.dir, o.eos + o.n_eos, MAXN - o.n_eos, &n, &err) != 0)
            return die("eos", &err);
        o.n_eos += n;
    }
    o.p.stop = o.stop;
    o.p.n_stop = o.n_stop;
    o.p.eos = o.eos;
    o.p.n_eos = o.n_eos;
    gen_ctx *g;
    if (gen_ctx_new(m, tok, P, &g, &err) != 0)
        return die("context", &err);
    gen_result r;
    if (gen_run(g, ids.v, (int)ids.n, &o.p, o.stream ? on_token : NULL, NULL, &r, &err) != 0)
        return die("generate", &err);
    json_t *pr = json_array(), *tk = json_array();
    for (size_t i = 0; i < ids.n; i++)
        json_array_append_new(pr, json_integer(ids.v[i]));
    for (int i = 0; i < r.n_tokens; i++)
        json_array_append_new(tk, json_integer(r.tokens[i]));
    json_t *j = json_pack("{so so ss ss% sf sf}", "prompt", pr, "tokens", tk, "reason",
                          gen_stop_name(r.reason), "text", r.text ? r.text : "",
                          r.text ? r.text_len : 0, "prefill_s", r.prefill_s, "decode_s",
                          r.decode_s);
    char *s = json_dumps(j, JSON_COMPACT);
    printf("%s\n", s);
    free(s);
    json_decref(j);
    gen_result_free(&r);
    gen_ctx_free(g);
    tok_ids_free(&ids);
    tok_free(tok);
    model_free(m);
    kern_device_close(d);
    return 0;
}
