/* job_spec: parse and validate a JSON job spec (see job_spec.h).
 *
 * Contract: job_spec_parse() either fills `out` completely, with the batch
 * triple resolved so that B = m * a * w, or returns ACC_EINVAL with
 * err->field set to the key path of the first problem ("optimizer.lr",
 * "deepspeed.zero_optimization"). Every object is checked for unknown keys
 * before its values are read, so typos never pass silently. Paths are
 * resolved (symlinks included) and must lie under one of conf->data_roots
 * (inputs) or conf->output_root (resume_from).
 */
#include "job_spec.h"

#include "safepath.h"

#include <ctype.h>
#include <stddef.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "batch_split.h"
#include "data_prep.h"
#include "hf_hub.h"
#include "model.h"
#include "model_hf.h"
#include "spec_keys.h"
#include "spec_rows.h"

#define SPEC_MAX_DEVICES 256

/* A batch-triple value as written: absent, "auto", or a positive integer. */
typedef struct batch_val {
    bool given; /* an integer was given */
    bool is_auto;
    int v;
} batch_val;

/* Where a value came from, to build field names: prefix + "." + key. */
static const char *field(char *buf, size_t n, const char *prefix, const char *key)
{
    if (prefix == NULL || prefix[0] == '\0')
        snprintf(buf, n, "%s", key);
    else
        snprintf(buf, n, "%s.%s", prefix, key);
    return buf;
}

static const char *json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

static bool key_allowed(const char *key, const char *const *allowed)
{
    for (int i = 0; allowed[i] != NULL; i++)
        if (!strcmp(key, allowed[i]))
            return true;
    return false;
}

/* "unknown key 'x' (did you mean 'y'?)": the closest accepted key or
 * alias at that path (spec_keys.h). */
static int unknown_key(const char *prefix, const char *key, const char *const *allowed, const char *what,
                       acc_err *err)
{
    char f[128];
    const char *near = spec_keys_suggest(prefix, key, allowed);
    field(f, sizeof f, prefix, key);
    if (near == NULL)
        return acc_err_set(err, ACC_EINVAL, f, "%s '%s'", what, f);
    return acc_err_set(err, ACC_EINVAL, f, "%s '%s' (did you mean '%s'?)", what, f, near);
}

/* Refuse the first key of `obj` that is not in `allowed`. */
static int check_keys(const json_t *obj, const char *prefix, const char *const *allowed, acc_err *err)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        if (!key_allowed(key, allowed))
            return unknown_key(prefix, key, allowed, "unknown key", err);
    }
    return 0;
}

/* A DeepSpeed value "auto": Hugging Face fills it from the training
 * arguments; here, from the spec's own keys (or their defaults). */
static bool is_auto(const json_t *v)
{
    return json_is_string(v) && !strcmp(json_string_value(v), "auto");
}

/* The member `key` of obj as an object (NULL when absent or null). */
static int get_object(const json_t *obj, const char *prefix, const char *key, json_t **out, acc_err *err)
{
    char f[128];
    json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (v == NULL || json_is_null(v))
        return 0;
    if (!json_is_object(v))
        return acc_err_set(err, ACC_EINVAL, field(f, sizeof f, prefix, key),
                           "%s must be an object, got %s", f, json_kind(v));
    *out = v;
    return 0;
}

static int get_int(const json_t *obj, const char *prefix, const char *key, long lo, long hi, int *out,
                   acc_err *err)
{
    char f[128];
    json_t *v = json_object_get(obj, key);
    if (v == NULL)
        return 0;
    field(f, sizeof f, prefix, key);
    json_int_t n;
    if (json_is_integer(v))
        n = json_integer_value(v);
    else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
             fabs(json_real_value(v)) < 1e15)
        n = (json_int_t)json_real_value(v);
    else
        return acc_err_set(err, ACC_EINVAL, f, "%s must be an integer, got %s", f, json_kind(v));
    if (n < lo || n > hi)
        return acc_err_set(err, ACC_EINVAL, f, "%s must be in [%ld, %ld], got %lld", f, lo, hi,
                           (long long)n);
    *out = (int)n;
    return 0;
}

static int get_u64(const json_t *obj, const char *prefix, const char *key, uint64_t *out, acc_err *err)
{
    char f[128];
    json_t *v = json_object_get(obj, key);
    if (v == NULL)
        return 0;
    field(f, sizeof f, prefix, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return acc_err_set(err, ACC_EINVAL, f, "%s must be a non-negative integer, got %s", f,
                           json_kind(v));
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

/* A number in [lo, hi]; open_lo excludes lo itself (for "must be > 0"). */
static int get_num(const json_t *obj, const char *prefix, const char *key, double lo, bool open_lo,
                   double hi, double *out, acc_err *err)
{
    char f[128];
    json_t *v = json_object_get(obj, key);
    if (v == NULL)
        return 0;
    field(f, sizeof f, prefix, key);
    if (!json_is_number(v))
        return acc_err_set(err, ACC_EINVAL, f, "%s must be a number, got %s", f, json_kind(v));
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || (open_lo && x == lo) || x > hi)
        return acc_err_set(err, ACC_EINVAL, f, "%s must be in %s%g, %g], got %g", f,
                           open_lo ? "(" : "[", lo, hi, x);
    *out = x;
    return 0;
}

static int get_bool(const json_t *obj, const char *prefix, const char *key, bool *out, acc_err *err)
{
    char f[128];
    json_t *v = json_object_get(obj, key);
    if (v == NULL)
        return 0;
    if (!json_is_boolean(v))
        return acc_err_set(err, ACC_EINVAL, field(f, sizeof f, prefix, key),
                           "%s must be true or false, got %s", f, json_kind(v));
    *out = json_is_true(v);
    return 0;
}

/* A string copied into dst; null leaves dst as it is when null_ok. */
static int get_str(const json_t *obj, const char *prefix, const char *key, bool null_ok, char *dst,
                   size_t n, bool *present, acc_err *err)
{
    char f[128];
    json_t *v = json_object_get(obj, key);
    if (present)
        *present = false;
    if (v == NULL || (null_ok && json_is_null(v)))
        return 0;
    field(f, sizeof f, prefix, key);
    if (!json_is_string(v))
        return acc_err_set(err, ACC_EINVAL, f, "%s must be a string, got %s", f, json_kind(v));
    if (json_string_length(v) >= n)
        return acc_err_set(err, ACC_EINVAL, f, "%s is too long (at most %zu bytes)", f, n - 1);
    if (strlen(json_string_value(v)) != json_string_length(v))
        return acc_err_set(err, ACC_EINVAL, f, "%s must not contain NUL bytes", f);
    snprintf(dst, n, "%s", json_string_value(v));
    if (present)
        *present = true;
    return 0;
}

/* One of `choices` (NULL-terminated); *out = its index. */
static int get_choice(const json_t *obj, const char *prefix, const char *key, const char *const *choices,
                      int *out, acc_err *err)
{
    char s[64], f[128];
    bool present;
    int rc = get_str(obj, prefix, key, false, s, sizeof s, &present, err);
    if (rc != 0 || !present)
        return rc;
    for (int i = 0; choices[i] != NULL; i++)
        if (!strcmp(s, choices[i])) {
            *out = i;
            return 0;
        }
    char list[256] = "";
    for (int i = 0; choices[i] != NULL; i++) {
        size_t l = strlen(list);
        snprintf(list + l, sizeof list - l, "%s%s", i ? ", " : "", choices[i]);
    }
    return acc_err_set(err, ACC_EINVAL, field(f, sizeof f, prefix, key), "%s must be one of %s, got '%s'",
                       f, list, s);
}

static int get_batch(const json_t *obj, const char *prefix, const char *key, batch_val *out, acc_err *err)
{
    char f[128];
    json_t *v = json_object_get(obj, key);
    if (v == NULL || json_is_null(v))
        return 0;
    field(f, sizeof f, prefix, key);
    if (json_is_string(v) && !strcmp(json_string_value(v), "auto")) {
        *out = (batch_val){.is_auto = true};
        return 0;
    }
    if (!json_is_integer(v))
        return acc_err_set(err, ACC_EINVAL, f, "%s must be a positive integer or \"auto\", got %s", f,
                           json_kind(v));
    json_int_t n = json_integer_value(v);
    if (n < 1 || n > SPEC_MAX_BATCH)
        return acc_err_set(err, ACC_EINVAL, f, "%s must be in [1, %d], got %lld", f, SPEC_MAX_BATCH,
                           (long long)n);
    *out = (batch_val){.given = true, .v = (int)n};
    return 0;
}

/* ---- sections as tables (spec_rows.h) ------------------------------------- */

enum { SEC_ROOT, SEC_MODEL, SEC_OPTIMIZER, SEC_LR_SCHEDULE, SEC_SAVE, SEC_LORA, SEC_OOM };
static const spec_section *section(int which); /* the tables, at the end of the sections' code */

static const char *sec_prefix(const spec_section *sec)
{
    return sec->prefix[0] != '\0' ? sec->prefix : NULL;
}

/* Unknown keys first: the rows are the section's accepted keys. */
static int check_rows(const json_t *obj, const spec_section *sec, acc_err *err)
{
    const char *names[64];
    size_t n = 0;
    for (; n < sec->n && n + 1 < sizeof names / sizeof names[0]; n++)
        names[n] = sec->rows[n].key;
    names[n] = NULL;
    return check_keys(obj, sec_prefix(sec), names, err);
}

static int apply_row(const json_t *obj, const spec_section *sec, const spec_row *r, void *base, acc_err *err)
{
    const char *p = sec_prefix(sec);
    void *at = (char *)base + r->off;
    switch (r->type) {
    case SPEC_T_INT: return get_int(obj, p, r->key, (long)r->lo, (long)r->hi, at, err);
    case SPEC_T_U64: return get_u64(obj, p, r->key, at, err);
    case SPEC_T_NUM: return get_num(obj, p, r->key, r->lo, r->open_lo, r->hi, at, err);
    case SPEC_T_BOOL: return get_bool(obj, p, r->key, at, err);
    case SPEC_T_STR: return get_str(obj, p, r->key, r->null_ok, at, r->size, NULL, err);
    case SPEC_T_CHOICE: {
        int scratch = 0;
        return get_choice(obj, p, r->key, r->choices, r->size != 0 ? (int *)at : &scratch, err);
    }
    case SPEC_T_CUSTOM: return r->set(obj, p, r, base, err);
    case SPEC_T_CODE: return 0;
    }
    return acc_err_set(err, ACC_EINVAL, r->key, "%s has no reader", r->key);
}

int spec_rows_apply(const json_t *obj, const spec_section *sec, void *base, acc_err *err)
{
    int rc = check_rows(obj, sec, err);
    for (size_t i = 0; rc == 0 && i < sec->n; i++)
        rc = apply_row(obj, sec, &sec->rows[i], base, err);
    return rc;
}

int spec_rows_defaults(const spec_section *sec, void *base, acc_err *err)
{
    for (size_t i = 0; i < sec->n; i++) {
        const spec_row *r = &sec->rows[i];
        if (r->def == NULL)
            continue;
        json_t *o = json_object();
        json_t *v = json_loads(r->def, JSON_DECODE_ANY, NULL);
        int rc = (o == NULL || v == NULL || json_object_set_new(o, r->key, v) != 0)
                     ? acc_err_set(err, ACC_EINVAL, r->key, "the default of %s is not JSON: %s", r->key, r->def)
                     : apply_row(o, sec, r, base, err);
        json_decref(o);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* ---- paths ---------------------------------------------------------------- */

/* Resolve `path` (relative ones against the first root) and require it under
 * one of `roots` (safepath.h). A glob (token shards) is checked through its
 * directory here; data_open checks every match again when it opens it. */
static int check_path(char *path, size_t n, const char *roots, const char *f, acc_err *err)
{
    char abs[PATH_MAX], real[PATH_MAX];
    if (path[0] == '\0')
        return acc_err_set(err, ACC_EINVAL, f, "%s must not be empty", f);
    if (path[0] != '/') {
        size_t l = strcspn(roots, ":");
        if (snprintf(abs, sizeof abs, "%.*s/%s", (int)l, roots, path) >= (int)sizeof abs)
            return acc_err_set(err, ACC_EINVAL, f, "%s is too long", f);
    } else {
        snprintf(abs, sizeof abs, "%s", path);
    }
    int rc;
    if (strpbrk(abs, "*?[") == NULL) {
        rc = sp_resolve(roots, abs, f, real, sizeof real, err);
    } else {
        /* the directory must resolve under a root; the leaf is a pattern */
        char *slash = strrchr(abs, '/');
        if (slash == abs)
            return acc_err_set(err, ACC_EINVAL, f, "%s: '%s' is not under an allowed root", f, path);
        *slash = '\0';
        const char *leaf = slash + 1;
        if (strpbrk(abs, "*?[") != NULL)
            return acc_err_set(err, ACC_EINVAL, f, "%s: wildcards are allowed in the file name only", f);
        if (!strcmp(leaf, "..") || !strcmp(leaf, ".") || leaf[0] == '\0')
            return acc_err_set(err, ACC_EINVAL, f, "%s: '%s' is not a file", f, path);
        rc = sp_resolve(roots, abs, f, real, sizeof real, err);
        size_t l = strlen(real);
        if (rc == 0 && snprintf(real + l, sizeof real - l, "/%s", leaf) >= (int)(sizeof real - l))
            rc = acc_err_set(err, ACC_EINVAL, f, "%s is too long", f);
    }
    if (rc != 0)
        return rc;
    if (strlen(real) >= n)
        return acc_err_set(err, ACC_EINVAL, f, "%s is too long", f);
    snprintf(path, n, "%s", real);
    return 0;
}

int job_spec_resolve_input(char *path, size_t n, const acc_conf *conf, const char *field, acc_err *err)
{
    return check_path(path, n, conf->data_roots, field, err);
}

/* ---- sections ------------------------------------------------------------- */

/* h-dsconf: a path key that names no path under data_roots but has the
 * form ORG/NAME is a hub repository, looked up in the hf_hub_cache. */
static bool names_hub_repo(const char *value, const char *roots)
{
    if (!hf_hub_is_org_repo_id(value))
        return false;
    char abs[PATH_MAX + 8], real[PATH_MAX];
    size_t l = strcspn(roots, ":");
    snprintf(abs, sizeof abs, "%.*s/%s", (int)l, roots, value);
    return realpath(abs, real) == NULL;
}

/* h-dsconf: a seq_len not given is the model's positions, at most 4096
 * (a 32k-position model would otherwise plan 32k-token activations). */
#define SPEC_SEQ_LEN_DEFAULT_MAX 4096

/* "model": {"from": DIR, "seq_len": T}: a Hugging Face directory under
 * data_roots (or a hub name in the hf_hub_cache); its headers are read now
 * (model_hf_validate), never its data, so a bad checkpoint is a 400 naming
 * the file and the key or tensor. */
static int parse_model_from(const json_t *m, const acc_conf *conf, const char *roots, bool plan_only,
                            spec_model *out, acc_err *err)
{
    static const char *const keys[] = {"from", "seq_len", "arch", "quantize", "load_in_4bit", NULL};
    static const char *const sizes[] = {"n_layer", "n_head", "n_embd", "vocab_size", "padded_vocab_size",
                                        "init_from", "n_kv_head", "intermediate_size", NULL};
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)m, key, v) {
        char f[128];
        if (key_allowed(key, sizes))
            return acc_err_set(err, ACC_EINVAL, field(f, sizeof f, "model", key),
                               "%s cannot be given with model.from (config.json has the model's sizes)", f);
        if (!key_allowed(key, keys)) /* h-dsconf: a misspelling gets its key */
            return unknown_key("model", key, keys, "unknown key", err);
    }
    char arch[sizeof out->arch] = "";
    bool present, seq = json_object_get(m, "seq_len") != NULL;
    int rc;
    if ((rc = get_str(m, "model", "from", false, out->from, sizeof out->from, &present, err)) ||
        (rc = get_str(m, "model", "arch", true, arch, sizeof arch, NULL, err)) ||
        (rc = get_int(m, "model", "seq_len", 2, 1 << 20, &out->seq_len, err)))
        return rc;
    static const char *const quants[] = {"none", "nf4", NULL}; /* QLoRA */
    int quant = 0;
    if ((rc = get_choice(m, "model", "quantize", quants, &quant, err)) ||
        (rc = get_bool(m, "model", "load_in_4bit", &out->quantize_nf4, err)))
        return rc;
    out->quantize_nf4 |= quant == 1;
    if (names_hub_repo(out->from, roots)) {
        if (strlen(out->from) >= sizeof out->hub_repo)
            return acc_err_set(err, ACC_EINVAL, "model.from", "model.from: '%s' is too long for a hub name", out->from);
        memcpy(out->hub_repo, out->from, strlen(out->from) + 1);
        rc = hf_hub_model_dir(conf->hf_hub_cache, out->hub_repo, "model.from", out->from, sizeof out->from, err);
    }
    if (rc != 0 || (rc = check_path(out->from, sizeof out->from, roots, "model.from", err)))
        return rc;
    model_config c; /* planning: config.json only, the weights may be elsewhere */
    if ((rc = plan_only ? model_hf_config_only(roots, out->from, &c, err)
                        : model_hf_validate_under(roots, out->from, &c, err)) != 0)
        return rc;
    const char *family = model_family_of(&c)->name;
    if (arch[0] != '\0' && strcmp(arch, family) != 0)
        return acc_err_set(err, ACC_EINVAL, "model.arch", "model.arch is %s, %s/config.json is a %s model",
                           arch, out->from, family);
    out->seq_len_default = !seq;
    if (!seq)
        out->seq_len = c.max_seq_len < SPEC_SEQ_LEN_DEFAULT_MAX ? c.max_seq_len : SPEC_SEQ_LEN_DEFAULT_MAX;
    if (out->seq_len > c.max_seq_len)
        return acc_err_set(err, ACC_EINVAL, "model.seq_len", "model.seq_len %d is over the model's %d positions",
                           out->seq_len, c.max_seq_len);
    snprintf(out->arch, sizeof out->arch, "%s", family);
    out->n_layer = c.n_layer;
    out->n_head = c.n_head;
    out->n_embd = c.channels;
    out->vocab_size = c.vocab_size;
    out->padded_vocab_size = c.padded_vocab_size;
    out->n_kv_head = c.n_kv_head;
    out->intermediate_size = c.intermediate_size;
    return 0;
}

/* model.arch: one of the model registry's families (model.h); absent in a
 * model section, the registry's first. */
static int set_arch(const json_t *obj, const char *prefix, const spec_row *r, void *base, acc_err *err)
{
    spec_model *out = base;
    const char *archs[16];
    int na = 0, arch = 0;
    for (const model_family *f; na < 15 && (f = model_family_at(na)) != NULL; na++)
        archs[na] = f->name;
    archs[na] = NULL;
    int rc = get_choice(obj, prefix, r->key, archs, &arch, err);
    if (rc == 0)
        snprintf(out->arch, sizeof out->arch, "%s", archs[arch]);
    return rc;
}

/* "model" as numbers (the rows); with "from", a Hugging Face directory
 * (parse_model_from, code). */
static int parse_model(const json_t *m, const acc_conf *conf, const char *roots, bool plan_only, spec_model *out,
                       acc_err *err)
{
    if (json_object_get(m, "from") != NULL)
        return parse_model_from(m, conf, roots, plan_only, out, err);
    int rc = spec_rows_apply(m, section(SEC_MODEL), out, err);
    if (rc != 0)
        return rc;
    if (out->n_embd % out->n_head != 0)
        return acc_err_set(err, ACC_EINVAL, "model.n_embd", "model.n_embd %d is not a multiple of model.n_head %d",
                           out->n_embd, out->n_head);
    if (out->padded_vocab_size != 0 && out->padded_vocab_size < out->vocab_size)
        return acc_err_set(err, ACC_EINVAL, "model.padded_vocab_size",
                           "model.padded_vocab_size %d is smaller than model.vocab_size %d",
                           out->padded_vocab_size, out->vocab_size);
    if (json_is_string(json_object_get(m, "init_from")))
        return check_path(out->init_from, sizeof out->init_from, roots, "model.init_from", err);
    return 0;
}

/* The JSONL formats' keys: the tokenizer directory (default model.from), the
 * chat template, where the loss goes, packing, what to do with overlong
 * samples. Names are checked here; the files at validation (data_prep.h). */
static int parse_data_jsonl(const json_t *d, const char *roots, const char *model_from,
                            spec_data *out, acc_err *err)
{
    static const char *const train_on[] = {"assistant", "all", NULL};
    static const char *const overlong[] = {"truncate", "drop", NULL};
    int rc, to = 0, ol = 0;
    bool tok;
    if ((rc = get_str(d, "data", "tokenizer", true, out->tokenizer, sizeof out->tokenizer, &tok, err)) ||
        (rc = get_str(d, "data", "chat_template", true, out->chat_template, sizeof out->chat_template, NULL,
                      err)) ||
        (rc = get_choice(d, "data", "train_on", train_on, &to, err)) ||
        (rc = get_bool(d, "data", "packing", &out->packing, err)) ||
        (rc = get_choice(d, "data", "overlong", overlong, &ol, err)))
        return rc;
    out->train_on = to == 1 ? SPEC_TRAIN_ALL : SPEC_TRAIN_ASSISTANT;
    out->overlong = ol == 1 ? SPEC_OVERLONG_DROP : SPEC_OVERLONG_TRUNCATE;
    if (!spec_data_is_jsonl(out->format)) {
        static const char *const only[] = {"tokenizer", "chat_template", "train_on", "packing", "overlong", NULL};
        for (int i = 0; only[i] != NULL; i++)
            if (json_object_get(d, only[i]) != NULL && !json_is_null(json_object_get(d, only[i]))) {
                char f[128];
                return acc_err_set(err, ACC_EINVAL, field(f, sizeof f, "data", only[i]),
                                   "%s applies to the JSONL formats (chat, prompt_completion, text_jsonl, text_lines) only", f);
            }
        return 0;
    }
    if (out->chat_template[0] == '\0')
        snprintf(out->chat_template, sizeof out->chat_template, "auto");
    if (!tok) {
        if (model_from[0] == '\0')
            return acc_err_set(err, ACC_EINVAL, "data.tokenizer",
                               "data.tokenizer is required for format %s without model.from",
                               out->format == SPEC_DATA_CHAT         ? "chat"
                               : out->format == SPEC_DATA_TEXT_JSONL ? "text_jsonl"
                               : out->format == SPEC_DATA_TEXT_LINES ? "text_lines"
                                                                     : "prompt_completion");
        snprintf(out->tokenizer, sizeof out->tokenizer, "%s", model_from);
        return 0;
    }
    return check_path(out->tokenizer, sizeof out->tokenizer, roots, "data.tokenizer", err);
}

/* data.train / data.val: a path (or glob), or a JSON list of them,
 * each resolved under the roots; a list is kept newline-separated
 * (data_prep.h reads it in order). */
static int get_paths(const json_t *d, const char *key, const char *roots, char *dst, size_t n, bool *present,
                     acc_err *err)
{
    char f[128];
    json_t *v = json_object_get(d, key);
    field(f, sizeof f, "data", key);
    if (!json_is_array(v)) {
        int rc = get_str(d, "data", key, true, dst, n, present, err);
        return rc == 0 && *present ? check_path(dst, n, roots, f, err) : rc;
    }
    *present = true;
    if (json_array_size(v) == 0)
        return acc_err_set(err, ACC_EINVAL, f, "%s must not be an empty list", f);
    size_t used = 0;
    dst[0] = '\0';
    for (size_t i = 0; i < json_array_size(v); i++) {
        char one[PATH_MAX];
        json_t *e = json_array_get(v, i);
        if (!json_is_string(e) || json_string_length(e) >= sizeof one ||
            strlen(json_string_value(e)) != json_string_length(e) || strchr(json_string_value(e), '\n'))
            return acc_err_set(err, ACC_EINVAL, f, "%s[%zu] must be a path (a string without NUL or newline)", f, i);
        snprintf(one, sizeof one, "%s", json_string_value(e));
        int rc = check_path(one, sizeof one, roots, f, err);
        if (rc != 0)
            return rc;
        size_t l = strlen(one);
        if (used + l + 2 > n)
            return acc_err_set(err, ACC_EINVAL, f, "%s: the list is too long (at most %zu bytes of paths)", f, n - 1);
        if (used > 0)
            dst[used++] = '\n';
        memcpy(dst + used, one, l + 1);
        used += l;
    }
    return 0;
}

/* h-dsconf: "data": {"dataset": "ORG/NAME", "subset": .., "split": "train",
 * "data_files": PATTERN}: the split's files in the hf_hub_cache become
 * data.train, one glob matching exactly them (hf_hub.h). */
static int parse_data_dataset(const json_t *d, const acc_conf *conf, spec_data *out, acc_err *err)
{
    char files[512] = "";
    bool given;
    int rc;
    if ((rc = get_str(d, "data", "dataset", false, out->dataset, sizeof out->dataset, &given, err)) ||
        (rc = get_str(d, "data", "subset", true, out->subset, sizeof out->subset, NULL, err)) ||
        (rc = get_str(d, "data", "split", true, out->split, sizeof out->split, NULL, err)) ||
        (rc = get_str(d, "data", "data_files", true, files, sizeof files, NULL, err)))
        return rc;
    if (!given) {
        static const char *const only[] = {"subset", "split", "data_files", NULL};
        for (int i = 0; only[i] != NULL; i++)
            if (json_object_get(d, only[i]) != NULL) {
                char f[64];
                return acc_err_set(err, ACC_EINVAL, field(f, sizeof f, "data", only[i]),
                                   "%s applies to data.dataset (a hub dataset) only", f);
            }
        return 0;
    }
    if (json_object_get(d, "train") != NULL)
        return acc_err_set(err, ACC_EINVAL, "data.dataset", "give data.dataset or data.train, not both");
    if (out->split[0] == '\0')
        snprintf(out->split, sizeof out->split, "train");
    hf_files hf;
    if ((rc = hf_hub_dataset_files(conf->hf_hub_cache, out->dataset, out->subset, out->split, files,
                                   "data.dataset", &hf, err)))
        return rc;
    out->dataset_files = hf.n;
    rc = hf_files_as_glob(&hf, "data.dataset", out->train, sizeof out->train, err);
    hf_files_free(&hf);
    return rc;
}

static int parse_data(const json_t *d, const acc_conf *conf, const char *roots, const char *model_from,
                      spec_data *out, acc_err *err)
{
    static const char *const keys[] = {"train", "val", "format", "tokenizer", "chat_template", "train_on",
                                       "packing", "overlong",
                                       "dataset", "subset", "split", "data_files", /* h-dsconf */
                                       NULL};
    static const char *const formats[] = {"text", "tokens", "chat", "prompt_completion", "text_jsonl",
                                          "text_lines", NULL};
    static const spec_data_format fmts[] = {SPEC_DATA_TEXT, SPEC_DATA_TOKENS, SPEC_DATA_CHAT,
                                            SPEC_DATA_PROMPT_COMPLETION, SPEC_DATA_TEXT_JSONL,
                                            SPEC_DATA_TEXT_LINES};
    int rc, fmt = 0;
    bool train, val;
    if ((rc = check_keys(d, "data", keys, err)) ||
        (rc = get_paths(d, "train", roots, out->train, sizeof out->train, &train, err)) ||
        (rc = get_paths(d, "val", roots, out->val, sizeof out->val, &val, err)) ||
        (rc = get_choice(d, "data", "format", formats, &fmt, err)))
        return rc;
    out->format = fmts[fmt];
    if ((rc = parse_data_dataset(d, conf, out, err)))
        return rc;
    if (!train && out->dataset[0] == '\0')
        return acc_err_set(err, ACC_EINVAL, "data.train", "data.train (or data.dataset) is required");
    if (out->dataset[0] != '\0') {
        /* checked the same way, but kept as the snapshot names it (not the
         * blob a single file links to): the name carries its extension */
        char copy[sizeof out->train];
        memcpy(copy, out->train, sizeof copy);
        if ((rc = check_path(copy, sizeof copy, roots, "data.dataset", err)))
            return rc;
    }
    json_t *fv = json_object_get(d, "format"), *tv = json_object_get(d, "tokenizer");
    if (fv == NULL || json_is_null(fv)) { /* read off the data: a tokenizer model never trains on bytes */
        out->format_inferred = true;
        bool tok = json_is_string(tv) || prep_has_tokenizer(roots, model_from);
        if ((rc = prep_infer_format(roots, out->train, tok, &out->format, err)))
            return rc;
    }
    if (!spec_data_is_jsonl(out->format) && (strchr(out->train, '\n') || strchr(out->val, '\n')))
        return acc_err_set(err, ACC_EINVAL, "data.train",
                           "a list of files applies to the record formats (chat, prompt_completion, text_jsonl, "
                           "text_lines); text and tokens take one path or glob");
    return parse_data_jsonl(d, roots, model_from, out, err);
}

static int parse_betas(const json_t *obj, const char *prefix, spec_optim *o, acc_err *err)
{
    char f[128];
    json_t *b = json_object_get(obj, "betas");
    if (b == NULL)
        return 0;
    field(f, sizeof f, prefix, "betas");
    /* null keeps that beta's default (adam_beta1 / adam_beta2 alone, spec_keys.h) */
    json_t *e0 = json_array_get(b, 0), *e1 = json_array_get(b, 1);
    if (!json_is_array(b) || json_array_size(b) != 2 || !(json_is_number(e0) || json_is_null(e0)) ||
        !(json_is_number(e1) || json_is_null(e1)))
        return acc_err_set(err, ACC_EINVAL, f, "%s must be an array of two numbers", f);
    double b1 = json_is_null(e0) ? o->beta1 : json_number_value(e0);
    double b2 = json_is_null(e1) ? o->beta2 : json_number_value(e1);
    if (!(b1 >= 0 && b1 < 1) || !(b2 >= 0 && b2 < 1))
        return acc_err_set(err, ACC_EINVAL, f, "%s must be in [0, 1), got [%g, %g]", f, b1, b2);
    o->beta1 = b1;
    o->beta2 = b2;
    return 0;
}

static int set_betas(const json_t *obj, const char *prefix, const spec_row *r, void *base, acc_err *err)
{
    return parse_betas(obj, prefix, base, err);
}

/* ---- the nested "deepspeed" object (h-dsconf: or a file) ------------------- */

/* DeepSpeed's configuration keys by what they mean here: the first group
 * takes effect; the rest are tuning and reporting keys with no meaning for
 * accumd, accepted and listed as ignored (job_spec.ignored). Any other key
 * is unknown (with a did-you-mean). */
static const char *const ds_keys[] = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "bf16", "fp16", "amp",
    "gradient_clipping", "optimizer", "scheduler", "zero_optimization", "activation_checkpointing",
    /* ignored from here (DS_FIRST_IGNORED) */
    "steps_per_print", "wall_clock_breakdown", "memory_breakdown", "dump_state", "prescale_gradients",
    "gradient_predivide_factor", "communication_data_type", "seq_parallel_communication_data_type",
    "sparse_gradients", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "flops_profiler",
    "tensorboard", "wandb", "csv_monitor", "comet", "comms_logger", "aio",
    "checkpoint", "data_types", "timers", "disable_allgather", NULL};
#define DS_FIRST_IGNORED 11

/* The index of key in a NULL-terminated list, -1 when absent. */
static int key_index(const char *key, const char *const *list)
{
    for (int i = 0; list[i] != NULL; i++)
        if (!strcmp(key, list[i]))
            return i;
    return -1;
}

static void note_ignored(job_spec *out, const char *prefix, const char *key)
{
    char f[160];
    spec_list_append(out->ignored, sizeof out->ignored, field(f, sizeof f, prefix, key));
}

/* Every key of `obj` known (index < first_ignored) or ignored (listed);
 * the first other one is unknown, with the closest known key. */
static int classify_keys(const json_t *obj, const char *prefix, const char *const *keys, int first_ignored,
                         const char *what, job_spec *out, acc_err *err)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        int i = key_index(key, keys);
        if (i < 0)
            return unknown_key(prefix, key, keys, what, err);
        if (i >= first_ignored)
            note_ignored(out, prefix, key);
    }
    return 0;
}

/* A number that may be "auto" (left as it is: the spec's own key or its
 * default fills it, as Hugging Face fills it from TrainingArguments). */
static int ds_num(const json_t *o, const char *prefix, const char *key, double lo, bool open_lo, double hi,
                  double *out, acc_err *err)
{
    return is_auto(json_object_get(o, key)) ? 0 : get_num(o, prefix, key, lo, open_lo, hi, out, err);
}

static int ds_int(const json_t *o, const char *prefix, const char *key, long lo, long hi, int *out, acc_err *err)
{
    return is_auto(json_object_get(o, key)) ? 0 : get_int(o, prefix, key, lo, hi, out, err);
}

/* A section's "enabled": true / false / "auto" (-1) / absent (0). */
static int ds_enabled(const json_t *sect, const char *prefix, int *on, acc_err *err)
{
    json_t *v = json_object_get(sect, "enabled");
    bool b = false;
    *on = 0;
    if (is_auto(v)) {
        *on = -1;
        return 0;
    }
    int rc = get_bool(sect, prefix, "enabled", &b, err);
    if (rc == 0 && b)
        *on = 1;
    return rc;
}

/* bf16 / fp16 / amp: bf16 sets the precision; fp16 and amp enabled are
 * not supported yet; their loss-scaling keys mean nothing without them. */
static int ds_precision(const json_t *ds, job_spec *out, acc_err *err)
{
    static const char *const bf_keys[] = {"enabled", "immediate_grad_update", "check_grad_overflow",
                                          "bf16_master_weights_and_grads", "bf16_optimizer_states", NULL};
    static const char *const fp_keys[] = {"enabled", "auto_cast", "loss_scale", "initial_scale_power",
                                          "loss_scale_window", "hysteresis", "consecutive_hysteresis",
                                          "min_loss_scale", "fp16_master_weights_and_grads", NULL};
    static const char *const amp_keys[] = {"enabled", "opt_level", NULL};
    json_t *bf = NULL, *fp = NULL, *amp = NULL;
    int rc, on;
    if ((rc = get_object(ds, "deepspeed", "bf16", &bf, err)) || (rc = get_object(ds, "deepspeed", "fp16", &fp, err)) ||
        (rc = get_object(ds, "deepspeed", "amp", &amp, err)))
        return rc;
    if (fp != NULL) {
        if ((rc = classify_keys(fp, "deepspeed.fp16", fp_keys, 1, "unknown key", out, err)) ||
            (rc = ds_enabled(fp, "deepspeed.fp16", &on, err)))
            return rc;
        if (on == 1)
            return acc_err_set(err, ACC_EINVAL, "deepspeed.fp16.enabled",
                               "deepspeed.fp16 is not supported yet; use bf16 (\"bf16\": {\"enabled\": true}) or fp32");
    }
    if (amp != NULL) {
        if ((rc = classify_keys(amp, "deepspeed.amp", amp_keys, 1, "unknown key", out, err)) ||
            (rc = ds_enabled(amp, "deepspeed.amp", &on, err)))
            return rc;
        if (on == 1)
            return acc_err_set(err, ACC_EINVAL, "deepspeed.amp.enabled", "deepspeed.amp (NVIDIA Apex) is not supported yet; use bf16");
    }
    if (bf == NULL)
        return 0;
    if ((rc = classify_keys(bf, "deepspeed.bf16", bf_keys, 1, "unknown key", out, err)) ||
        (rc = ds_enabled(bf, "deepspeed.bf16", &on, err)))
        return rc;
    if (on >= 0) /* "auto": the spec's precision */
        out->precision = on ? SPEC_BF16 : SPEC_FP32;
    return 0;
}

/* "optimizer": AdamW (or DeepSpeed's Adam in its default adam_w_mode). */
static int ds_optimizer(const json_t *ds, job_spec *out, acc_err *err)
{
    static const char *const keys[] = {"type", "params", NULL};
    static const char *const pkeys[] = {"lr", "betas", "eps", "weight_decay", "adam_w_mode", "bias_correction",
                                        "amsgrad", "torch_adam", NULL};
    static const char *const types[] = {"AdamW", "adamw", "Adam", "adam", NULL};
    json_t *o = NULL, *p = NULL;
    int rc, type = 0;
    if ((rc = get_object(ds, "deepspeed", "optimizer", &o, err)) || o == NULL)
        return rc;
    if ((rc = check_keys(o, "deepspeed.optimizer", keys, err)) ||
        (rc = get_choice(o, "deepspeed.optimizer", "type", types, &type, err)) ||
        (rc = get_object(o, "deepspeed.optimizer", "params", &p, err)) || p == NULL)
        return rc;
    const char *pf = "deepspeed.optimizer.params";
    bool adam_w = true, bias = true, ams = false;
    if ((rc = classify_keys(p, pf, pkeys, 7, "unknown key", out, err)) ||
        (rc = ds_num(p, pf, "lr", 0, true, 10, &out->optim.lr, err)) ||
        (!is_auto(json_object_get(p, "betas")) && (rc = parse_betas(p, pf, &out->optim, err))) ||
        (rc = ds_num(p, pf, "eps", 0, true, 1, &out->optim.eps, err)) ||
        (rc = ds_num(p, pf, "weight_decay", 0, false, 10, &out->optim.weight_decay, err)) ||
        (rc = get_bool(p, pf, "adam_w_mode", &adam_w, err)) || (rc = get_bool(p, pf, "bias_correction", &bias, err)) ||
        (rc = get_bool(p, pf, "amsgrad", &ams, err)))
        return rc;
    if (!adam_w && type >= 2)
        return acc_err_set(err, ACC_EINVAL, "deepspeed.optimizer.params.adam_w_mode",
                           "deepspeed.optimizer.params.adam_w_mode false (Adam with L2 regularization) is not "
                           "supported; accumd's optimizer is AdamW");
    if (!bias || ams)
        return acc_err_set(err, ACC_EINVAL, !bias ? "deepspeed.optimizer.params.bias_correction"
                                                  : "deepspeed.optimizer.params.amsgrad",
                           "%s is not supported (AdamW with bias correction, without amsgrad)",
                           !bias ? "bias_correction false" : "amsgrad true");
    return 0;
}

/* The lr_schedule.type a DeepSpeed scheduler type is. */
static const char *const ds_sched_types[] = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", NULL};
static const char *const ds_sched_as[] = {"warmup", "warmup_decay", "warmup_cosine"};

static int ds_scheduler(const json_t *ds, job_spec *out, acc_err *err)
{
    static const char *const keys[] = {"type", "params", NULL};
    static const char *const pkeys[] = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
                                        "total_num_steps", "warmup_min_ratio", "cos_min_ratio", NULL};
    static const char *const wtypes[] = {"linear", "log", NULL};
    json_t *s = NULL, *p = NULL;
    int rc, type = 0, wtype = 0;
    if ((rc = get_object(ds, "deepspeed", "scheduler", &s, err)) || s == NULL)
        return rc;
    if ((rc = check_keys(s, "deepspeed.scheduler", keys, err)) ||
        (rc = get_choice(s, "deepspeed.scheduler", "type", ds_sched_types, &type, err)) ||
        (rc = get_object(s, "deepspeed.scheduler", "params", &p, err)))
        return rc;
    out->lr.type = type == 0 ? SPEC_LR_WARMUP : type == 1 ? SPEC_LR_WARMUP_DECAY : SPEC_LR_WARMUP_COSINE;
    out->lr.warmup_steps = 1000; /* DeepSpeed's default warmup_num_steps */
    out->lr.warmup_min_lr = 0;
    if (p == NULL)
        return 0;
    const char *pf = "deepspeed.scheduler.params";
    /* "auto" as Hugging Face resolves it: warmup from the spec's warmup_steps
     * (or warmup_ratio), total from max_steps, peak from the lr, start 0 */
    if (is_auto(json_object_get(p, "warmup_num_steps")))
        out->lr.warmup_steps = 0;
    double ratio = -1;
    if ((rc = check_keys(p, pf, pkeys, err)) ||
        (rc = ds_num(p, pf, "warmup_min_lr", 0, false, 10, &out->lr.warmup_min_lr, err)) ||
        (rc = ds_num(p, pf, "warmup_max_lr", 0, true, 10, &out->optim.lr, err)) ||
        (rc = ds_int(p, pf, "warmup_num_steps", 0, INT_MAX, &out->lr.warmup_steps, err)) ||
        (rc = get_choice(p, pf, "warmup_type", wtypes, &wtype, err)) ||
        (rc = ds_int(p, pf, "total_num_steps", 1, INT_MAX, &out->lr.total_steps, err)) ||
        (rc = ds_num(p, pf, "warmup_min_ratio", 0, false, 1, &ratio, err)) ||
        (rc = ds_num(p, pf, "cos_min_ratio", 0, false, 1, &out->lr.cos_min_ratio, err)))
        return rc;
    if (ratio >= 0)
        out->lr.warmup_min_lr = ratio * out->optim.lr;
    return 0;
}

/* "zero_optimization": {"stage": 0|1|2|3}, at the top level or in
 * "deepspeed". Offloading to a device is refused as not supported yet
 * (naming the key); DeepSpeed's bucket, overlap and stage-3 tuning keys
 * mean nothing here and are listed as ignored (stage 3 partitions every
 * tensor, prefetches one block ahead, keeps at most two blocks and the
 * embeddings / head gathered, and always gathers checkpoints whole:
 * docs/engine.md "ZeRO"). */
static const char *const zero_keys[] = {
    "stage", "offload_optimizer", "offload_param", "cpu_offload", "cpu_offload_params", "zero_quantized_weights",
    "zero_quantized_gradients", "zero_quantized_nontrainable_weights", "zero_hpz_partition_size", "mics_shard_size",
    /* ignored from here (ZERO_FIRST_IGNORED) */
    "contiguous_gradients", "overlap_comm", "reduce_scatter", "reduce_bucket_size", "allgather_partitions",
    "allgather_bucket_size", "round_robin_gradients", "elastic_checkpoint", "load_from_fp32_weights",
    "sub_group_size", "stage3_max_live_parameters", "stage3_max_reuse_distance", "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold", "stage3_gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save", "stage3_model_persistence_threshold", "ignore_unused_parameters",
    "legacy_stage1", "memory_efficient_linear", "use_multi_rank_bucket_allreduce", "cpu_offload_use_pin_memory",
    "mics_hierarchical_params_gather", "pipeline_loading_checkpoint", "override_module_apply",
    "log_trace_cache_warnings", NULL};
#define ZERO_FIRST_IGNORED 10

static int zero_not_yet(const char *f, acc_err *err)
{
    return acc_err_set(err, ACC_EINVAL, f,
                       "%s is not supported yet (accumd runs ZeRO stages 0 to 3 on the job's devices, without "
                       "offload)", f);
}

/* offload_optimizer: {"device": "cpu" | "none" (DeepSpeed's default),
 * "pin_memory": bool}; DeepSpeed's other keys mean nothing here and are
 * listed as ignored, and so is the whole key with "none" (no effect);
 * "nvme" is refused as not supported yet. */
static const char *const offload_opt_keys[] = {
    "device", "pin_memory",
    /* ignored from here (OFFLOAD_FIRST_IGNORED) */
    "buffer_count", "fast_init", "ratio", "nvme_path", "pipeline", "pipeline_read", "pipeline_write", NULL};
#define OFFLOAD_FIRST_IGNORED 2

/* offload_param: {"device": "cpu" | "none", "pin_memory": bool}; DeepSpeed's
 * buffer and NVMe keys mean nothing here and are listed as ignored;
 * "nvme" is refused as not supported yet. Needs stage 3 and
 * offload_optimizer (check_offload_param). */
static const char *const offload_param_keys[] = {
    "device", "pin_memory",
    /* ignored from here (OFFLOAD_FIRST_IGNORED) */
    "buffer_count", "buffer_size", "max_in_cpu", "nvme_path", NULL};

/* One offload section of zero_optimization, `name` ("offload_optimizer",
 * "offload_param"): {"device": "cpu" | "none", "pin_memory": bool} with
 * the section's ignored keys from OFFLOAD_FIRST_IGNORED on; "nvme" is
 * refused as not supported yet, "none" (as without the section) is listed
 * as ignored. *on and *pin are set from it; absent: left as they are. */
static int zero_offload(const json_t *z, const char *prefix, const char *name, const char *const *keys, bool *on,
                        bool *pin, job_spec *out, acc_err *err)
{
    char f[160], fd[176];
    const json_t *o = json_object_get(z, name);
    if (o == NULL || json_is_null(o))
        return 0;
    field(f, sizeof f, prefix, name);
    if (!json_is_object(o))
        return acc_err_set(err, ACC_EINVAL, f, "%s must be an object, got %s", f, json_kind(o));
    char dev[16] = "none";
    bool pinned = false;
    int rc;
    if ((rc = classify_keys(o, f, keys, OFFLOAD_FIRST_IGNORED, "unknown key", out, err)) ||
        (rc = get_str(o, f, "device", true, dev, sizeof dev, NULL, err)) ||
        (rc = get_bool(o, f, "pin_memory", &pinned, err)))
        return rc;
    field(fd, sizeof fd, f, "device");
    if (!strcmp(dev, "nvme"))
        return acc_err_set(err, ACC_EINVAL, fd, "%s \"nvme\" is not supported yet (use \"cpu\" or \"none\")", fd);
    if (strcmp(dev, "cpu") != 0 && strcmp(dev, "none") != 0)
        return acc_err_set(err, ACC_EINVAL, fd, "%s must be \"cpu\" or \"none\", got \"%s\"", fd, dev);
    *on = !strcmp(dev, "cpu");
    *pin = *on && pinned;
    if (!*on) /* "none": as without the section */
        note_ignored(out, prefix, name);
    return 0;
}

static int zero_offload_param(const json_t *z, const char *prefix, job_spec *out, acc_err *err)
{
    return zero_offload(z, prefix, "offload_param", offload_param_keys, &out->offload_param,
                        &out->offload_param_pin, out, err);
}

static int zero_offload_optimizer(const json_t *z, const char *prefix, job_spec *out, acc_err *err)
{
    return zero_offload(z, prefix, "offload_optimizer", offload_opt_keys, &out->offload_optimizer,
                        &out->offload_pin_memory, out, err);
}

/* A switch or size whose non-default value asks for something not here. */
static int zero_default_only(const json_t *z, const char *prefix, const char *key, job_spec *out, acc_err *err)
{
    char f[160];
    const json_t *v = json_object_get(z, key);
    if (v == NULL)
        return 0;
    bool off = json_is_false(v) || json_is_null(v) ||
               (json_is_integer(v) && json_integer_value(v) <= 1 && strcmp(key, "mics_shard_size") != 0) ||
               (json_is_integer(v) && json_integer_value(v) < 0);
    if (!off)
        return zero_not_yet(field(f, sizeof f, prefix, key), err);
    note_ignored(out, prefix, key);
    return 0;
}

static int parse_zero(const json_t *z, const char *prefix, job_spec *out, int *stage, acc_err *err)
{
    int rc, st = 0;
    if ((rc = get_int(z, prefix, "stage", 0, 3, &st, err)))
        return rc;
    if ((rc = classify_keys(z, prefix, zero_keys, ZERO_FIRST_IGNORED, "unknown key", out, err)) ||
        (rc = zero_offload_optimizer(z, prefix, out, err)) ||
        (rc = zero_offload_param(z, prefix, out, err)))
        return rc;
    for (int i = 3; i < ZERO_FIRST_IGNORED; i++)
        if ((rc = zero_default_only(z, prefix, zero_keys[i], out, err)))
            return rc;
    *stage = st;
    return 0;
}

/* Where zero_optimization was given ("" = nowhere), for the error that
 * names it; the stage in *stage. Top level and deepspeed must agree. */
static int get_zero(const json_t *root, const json_t *ds, job_spec *out, char *where, size_t n, acc_err *err)
{
    json_t *top = NULL, *inner = NULL;
    int rc, st_top = -1, st_ds = -1;
    where[0] = '\0';
    if ((rc = get_object(root, NULL, "zero_optimization", &top, err)) ||
        (ds != NULL && (rc = get_object(ds, "deepspeed", "zero_optimization", &inner, err))))
        return rc;
    if (inner != NULL && (rc = parse_zero(inner, "deepspeed.zero_optimization", out, &st_ds, err)))
        return rc;
    if (top != NULL && (rc = parse_zero(top, "zero_optimization", out, &st_top, err)))
        return rc;
    if (top != NULL && inner != NULL && st_top != st_ds)
        return acc_err_set(err, ACC_EINVAL, "zero_optimization.stage",
                           "zero_optimization.stage %d differs from deepspeed.zero_optimization.stage %d", st_top,
                           st_ds);
    if (top != NULL || inner != NULL) {
        out->zero_stage = top != NULL ? st_top : st_ds;
        snprintf(where, n, "%s", top != NULL ? "zero_optimization.stage" : "deepspeed.zero_optimization.stage");
    }
    return 0;
}

/* A batch key set in "deepspeed" fills the top level's when that has none
 * (values that disagree were refused by ds_agrees). */
static void merge_batch(batch_val *top, const batch_val *ds)
{
    if ((ds->given || ds->is_auto) && !top->given && !top->is_auto)
        *top = *ds;
}

typedef struct batch_in {
    batch_val B, m, a;
} batch_in;

/* ---- the DeepSpeed config against the spec's own keys ----------------------- */

/* The value at a dotted path ("optimizer.params.lr"), NULL when absent. */
static const json_t *at_path(const json_t *o, const char *path)
{
    char part[64];
    while (o != NULL && *path) {
        size_t l = strcspn(path, ".");
        snprintf(part, sizeof part, "%.*s", (int)l, path);
        o = json_is_object(o) ? json_object_get(o, part) : NULL;
        path += l + (path[l] == '.');
    }
    return o;
}

static int ds_disagree(const job_spec *out, const json_t *origin, const char *dpath, const json_t *dv,
                       const char *tpath, const json_t *tv, acc_err *err)
{
    char f[128], d[64], t[64], top[160], where[PATH_MAX + 8] = "";
    char *ds = json_dumps(dv, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(10));
    char *ts = json_dumps(tv, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(10));
    snprintf(d, sizeof d, "%s", ds ? ds : "?");
    snprintf(t, sizeof t, "%s", ts ? ts : "?");
    free(ds);
    free(ts);
    if (out->deepspeed_file[0] != '\0')
        snprintf(where, sizeof where, " in %s", out->deepspeed_file);
    spec_alias_describe(origin, tpath, top, sizeof top);
    return acc_err_set(err, ACC_EINVAL, field(f, sizeof f, "deepspeed", dpath),
                       "%s is %s%s but %s is %s: give one of them, or \"auto\" in the DeepSpeed config", f, d, where,
                       top, t);
}

/* Equal numbers (2 and 2.0), or arrays of them where a null element
 * (a beta left to its default) agrees with anything. */
static bool agree(const json_t *a, const json_t *b)
{
    if (json_is_number(a) && json_is_number(b))
        return json_number_value(a) == json_number_value(b);
    if (json_is_array(a) && json_is_array(b) && json_array_size(a) == json_array_size(b)) {
        for (size_t i = 0; i < json_array_size(a); i++) {
            const json_t *x = json_array_get(a, i), *y = json_array_get(b, i);
            if (!json_is_null(x) && !json_is_null(y) && !agree(x, y))
                return false;
        }
        return true;
    }
    return json_equal((json_t *)a, (json_t *)b) != 0;
}

/* Hugging Face refuses a DeepSpeed value that is not "auto" and differs
 * from its training argument; so does accumd, showing both. */
static int ds_agrees(const json_t *root, const json_t *ds, const json_t *origin, const job_spec *out, acc_err *err)
{
    static const struct {
        const char *ds, *top;
    } pairs[] = {
        {"train_batch_size", "train_batch_size"},
        {"train_micro_batch_size_per_gpu", "train_micro_batch_size_per_gpu"},
        {"gradient_accumulation_steps", "gradient_accumulation_steps"},
        {"gradient_clipping", "optimizer.grad_clip"},
        {"optimizer.params.lr", "optimizer.lr"},
        {"optimizer.params.betas", "optimizer.betas"},
        {"optimizer.params.eps", "optimizer.eps"},
        {"optimizer.params.weight_decay", "optimizer.weight_decay"},
        {"scheduler.params.warmup_max_lr", "optimizer.lr"},
        {"scheduler.params.warmup_min_lr", "lr_schedule.warmup_min_lr"},
        {"scheduler.params.warmup_num_steps", "lr_schedule.warmup_steps"},
        {"scheduler.params.total_num_steps", "lr_schedule.total_steps"},
        {"scheduler.params.cos_min_ratio", "lr_schedule.cos_min_ratio"},
        {NULL, NULL},
    };
    for (int i = 0; pairs[i].ds != NULL; i++) {
        const json_t *dv = at_path(ds, pairs[i].ds), *tv = at_path(root, pairs[i].top);
        if (dv == NULL || tv == NULL || is_auto(dv) || is_auto(tv) || json_is_null(dv) || json_is_null(tv))
            continue;
        if (!agree(dv, tv))
            return ds_disagree(out, origin, pairs[i].ds, dv, pairs[i].top, tv, err);
    }
    /* the precision: bf16.enabled against precision (or bf16 / mixed_precision) */
    const json_t *bf = at_path(ds, "bf16.enabled"), *prec = json_object_get(root, "precision");
    if (json_is_boolean(bf) && json_is_string(prec) &&
        json_is_true(bf) != !strcmp(json_string_value(prec), "bf16"))
        return ds_disagree(out, origin, "bf16.enabled", bf, "precision", prec, err);
    /* the schedule: a DeepSpeed scheduler against lr_schedule.type */
    const json_t *st = at_path(ds, "scheduler.type"), *lt = at_path(root, "lr_schedule.type");
    int k = json_is_string(st) ? key_index(json_string_value(st), ds_sched_types) : -1;
    if (k >= 0 && json_is_string(lt) && strcmp(json_string_value(lt), ds_sched_as[k]) != 0)
        return ds_disagree(out, origin, "scheduler.type", st, "lr_schedule.type", lt, err);
    return 0;
}

/* DeepSpeed's "activation_checkpointing" section: cpu_checkpointing true
 * keeps the checkpoints in host memory (the spec's activation_checkpointing
 * {"offload": true}, recomputation on), unless the spec's own
 * activation_checkpointing says otherwise; its other keys tune DeepSpeed's
 * own checkpointing and are listed as ignored. */
static const char *const ds_act_keys[] = {"cpu_checkpointing", "partition_activations",
                                          "contiguous_memory_optimization", "number_checkpoints",
                                          "synchronize_checkpoint_boundary", "profile", NULL};

static int ds_act_ckpt(const json_t *ds, const json_t *root, job_spec *out, acc_err *err)
{
    json_t *sect;
    const char *p = "deepspeed.activation_checkpointing";
    int rc = get_object(ds, "deepspeed", "activation_checkpointing", &sect, err);
    if (rc != 0 || sect == NULL)
        return rc;
    if ((rc = classify_keys(sect, p, ds_act_keys, 1, "unknown DeepSpeed activation_checkpointing key", out, err)))
        return rc;
    bool cpu = false;
    if ((rc = get_bool(sect, p, "cpu_checkpointing", &cpu, err)) != 0)
        return rc;
    if (cpu && json_object_get(root, "activation_checkpointing") == NULL) {
        out->activation_checkpointing = true;
        out->activation_offload = true;
    }
    return 0;
}

static int parse_deepspeed(const json_t *ds, const json_t *root, const json_t *origin, job_spec *out, batch_in *b,
                           acc_err *err)
{
    int rc;
    batch_in d = {{0}, {0}, {0}};
    if ((rc = classify_keys(ds, "deepspeed", ds_keys, DS_FIRST_IGNORED, "unknown DeepSpeed key", out, err)) ||
        (rc = ds_agrees(root, ds, origin, out, err)) ||
        (rc = get_batch(ds, "deepspeed", "train_batch_size", &d.B, err)) ||
        (rc = get_batch(ds, "deepspeed", "train_micro_batch_size_per_gpu", &d.m, err)) ||
        (rc = get_batch(ds, "deepspeed", "gradient_accumulation_steps", &d.a, err)) ||
        (rc = ds_precision(ds, out, err)) || (rc = ds_optimizer(ds, out, err)) || (rc = ds_scheduler(ds, out, err)) ||
        (rc = ds_act_ckpt(ds, root, out, err)))
        return rc;
    merge_batch(&b->B, &d.B);
    merge_batch(&b->m, &d.m);
    merge_batch(&b->a, &d.a);
    /* ignored, but still of DeepSpeed's type */
    int steps_per_print = 0;
    bool wall_clock = false;
    if ((rc = get_int(ds, "deepspeed", "steps_per_print", 1, INT_MAX, &steps_per_print, err)) ||
        (rc = get_bool(ds, "deepspeed", "wall_clock_breakdown", &wall_clock, err)) ||
        (rc = ds_num(ds, "deepspeed", "gradient_clipping", 0, false, 1e9, &out->optim.grad_clip, err)))
        return rc;
    return 0;
}

/* "deepspeed": "FILE": a DeepSpeed JSON file under data_roots, opened
 * through safepath and put in the spec's place. */
#define SPEC_DS_FILE_MAX (1 << 20)

static int load_deepspeed_file(json_t *root, const char *roots, job_spec *out, acc_err *err)
{
    json_t *v = json_object_get(root, "deepspeed");
    if (!json_is_string(v))
        return 0;
    int rc = get_str(root, NULL, "deepspeed", false, out->deepspeed_file, sizeof out->deepspeed_file, NULL, err);
    if (rc != 0 || (rc = check_path(out->deepspeed_file, sizeof out->deepspeed_file, roots, "deepspeed", err)))
        return rc;
    int fd;
    if ((rc = sp_open_file(roots, out->deepspeed_file, "deepspeed", &fd, NULL, 0, err)))
        return rc;
    char *text = malloc(SPEC_DS_FILE_MAX + 1);
    ssize_t n = 0, got;
    while (text != NULL && n <= SPEC_DS_FILE_MAX && (got = read(fd, text + n, (size_t)(SPEC_DS_FILE_MAX + 1 - n))) > 0)
        n += got;
    close(fd);
    if (text == NULL)
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    if (n > SPEC_DS_FILE_MAX) {
        free(text);
        return acc_err_set(err, ACC_EINVAL, "deepspeed", "deepspeed: %s is over %d bytes", out->deepspeed_file,
                           SPEC_DS_FILE_MAX);
    }
    json_error_t je;
    json_t *obj = json_loadb(text, (size_t)(n > 0 ? n : 0), JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (obj == NULL)
        return acc_err_set(err, ACC_EINVAL, "deepspeed", "deepspeed: %s: malformed JSON at line %d column %d: %s",
                           out->deepspeed_file, je.line, je.column, je.text);
    if (!json_is_object(obj)) {
        json_decref(obj);
        return acc_err_set(err, ACC_EINVAL, "deepspeed", "deepspeed: %s must hold a JSON object", out->deepspeed_file);
    }
    return json_object_set_new(root, "deepspeed", obj) ? acc_err_set(err, ACC_ENOMEM, NULL, "out of memory") : 0;
}

/* ---- the batch triple ------------------------------------------------------- */

/* the given keys through the one resolver
 * (batch_split_resolve), kept for a planner at another world size */
static int resolve_batch(const batch_in *b, job_spec *out, acc_err *err)
{
    int w = out->devices * out->nodes; /* both small: checked in parse_scalars */
    batch_given g = {.B = b->B.given ? b->B.v : 0, .m = b->m.given ? b->m.v : 0, .a = b->a.given ? b->a.v : 0};
    out->micro_auto = b->m.is_auto;
    out->given_batch = g.B;
    out->given_micro = g.m;
    out->given_accum = g.a;
    batch_split bs;
    int rc = batch_split_resolve(&g, w, SPEC_MAX_BATCH, &bs, err);
    if (rc != 0)
        return rc;
    out->train_batch_size = bs.B;
    out->micro_batch = bs.m;
    out->accum_steps = bs.a;
    return 0;
}

/* ---- top level ------------------------------------------------------------ */

/* The defaults: every row's (spec_rows_defaults; a default its own row
 * refused would be a bug of the tables, which the test spec_rows rules
 * out, so the result is not checked here). Lora's apply when its section
 * is given. */
static void set_defaults(job_spec *s)
{
    memset(s, 0, sizeof *s);
    (void)spec_rows_defaults(section(SEC_ROOT), s, NULL);
    (void)spec_rows_defaults(section(SEC_MODEL), &s->model, NULL);
    (void)spec_rows_defaults(section(SEC_OPTIMIZER), &s->optim, NULL);
    (void)spec_rows_defaults(section(SEC_LR_SCHEDULE), &s->lr, NULL);
    (void)spec_rows_defaults(section(SEC_SAVE), s, NULL);
    (void)spec_rows_defaults(section(SEC_OOM), s, NULL);
}

/* "save": {"format": "hf", "merge_lora": false, "dtype": "auto"} (rows);
 * merge_lora needs a lora section (parse_sections). A save section
 * without merge_lora means false. */
static int parse_save(const json_t *sv, job_spec *out, acc_err *err)
{
    out->merge_lora = false;
    return spec_rows_apply(sv, section(SEC_SAVE), out, err);
}

/* A module name: what PEFT matches against a module's last name component
 * (letters, digits, '_'), so no path or pattern syntax slips through. */
static bool lora_name_ok(const char *s)
{
    if (*s == '\0')
        return false;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '_')
            return false;
    return true;
}

/* lora.target_modules: "all-linear" or a list of module names. */
static int parse_lora_targets(const json_t *v, spec_lora *lo, acc_err *err)
{
    char f[64];
    if (json_is_string(v)) {
        if (strcmp(json_string_value(v), "all-linear") != 0)
            return acc_err_set(err, ACC_EINVAL, "lora.target_modules",
                               "lora.target_modules must be \"all-linear\" or a list of module names");
        lo->all_linear = true;
        return 0;
    }
    if (!json_is_array(v) || json_array_size(v) < 1 || json_array_size(v) > SPEC_LORA_MAX_TARGETS)
        return acc_err_set(err, ACC_EINVAL, "lora.target_modules",
                           "lora.target_modules must be \"all-linear\" or a list of 1 to %d module names",
                           SPEC_LORA_MAX_TARGETS);
    size_t i;
    json_t *e;
    json_array_foreach((json_t *)v, i, e) {
        snprintf(f, sizeof f, "lora.target_modules[%zu]", i);
        const char *s = json_string_value(e);
        if (s == NULL || strlen(s) != json_string_length(e) || strlen(s) >= SPEC_LORA_NAME_MAX ||
            !lora_name_ok(s))
            return acc_err_set(err, ACC_EINVAL, f,
                               "%s must be a module name (letters, digits, _; under %d bytes)", f,
                               SPEC_LORA_NAME_MAX);
        for (int k = 0; k < lo->n_targets; k++)
            if (!strcmp(lo->targets[k], s))
                return acc_err_set(err, ACC_EINVAL, f, "%s: '%s' is listed twice", f, s);
        snprintf(lo->targets[lo->n_targets++], SPEC_LORA_NAME_MAX, "%s", s);
    }
    return 0;
}

/* "lora": {"r": 8, "alpha": 8, "dropout": 0.0, "target_modules": [...]}:
 * PEFT's LoraConfig (lora_alpha / lora_dropout accepted as PEFT spells them). */
static int parse_lora(const json_t *lv, spec_lora *lo, acc_err *err)
{
    int rc;
    /* the defaults hold once the section is given (r = 0 means no lora) */
    if ((rc = spec_rows_defaults(section(SEC_LORA), lo, err)) || (rc = spec_rows_apply(lv, section(SEC_LORA), lo, err)))
        return rc;
    if (lo->dropout != 0) {
        bool peft = json_object_get(lv, "dropout") == NULL;
        return acc_err_set(err, ACC_EINVAL, peft ? "lora.lora_dropout" : "lora.dropout",
                           "lora dropout %g is not supported yet (only 0.0)", lo->dropout);
    }
    const json_t *tm = json_object_get(lv, "target_modules");
    if (tm != NULL && !json_is_null(tm) && (rc = parse_lora_targets(tm, lo, err)))
        return rc;
    return 0;
}

static int parse_sections(const json_t *root, const acc_conf *conf, job_spec *out, acc_err *err)
{
    json_t *jmodel, *data, *optim, *lrs, *oom, *sv;
    int rc;
    json_t *lv;
    if ((rc = get_object(root, NULL, "save", &sv, err)) || (sv != NULL && (rc = parse_save(sv, out, err))))
        return rc;
    if ((rc = get_object(root, NULL, "lora", &lv, err)) || (lv != NULL && (rc = parse_lora(lv, &out->lora, err))))
        return rc;
    if (out->merge_lora && out->lora.r == 0)
        return acc_err_set(err, ACC_EINVAL, "save.merge_lora", "save.merge_lora needs a lora section");
    if ((rc = get_object(root, NULL, "model", &jmodel, err)) || (rc = get_object(root, NULL, "data", &data, err)) ||
        (rc = get_object(root, NULL, "optimizer", &optim, err)) ||
        (rc = get_object(root, NULL, "lr_schedule", &lrs, err)) || (rc = get_object(root, NULL, "oom", &oom, err)))
        return rc;
    if (jmodel != NULL && (rc = parse_model(jmodel, conf, out->data_roots, out->plan_only, &out->model, err)))
        return rc;
    if (data == NULL && !out->plan_only) /* the planner needs no data */
        return acc_err_set(err, ACC_EINVAL, "data", "data is required (at least data.train)");
    if (data != NULL && (rc = parse_data(data, conf, out->data_roots, out->model.from, &out->data, err)))
        return rc;
    if (optim != NULL && (rc = spec_rows_apply(optim, section(SEC_OPTIMIZER), &out->optim, err)))
        return rc;
    if (lrs != NULL && (rc = spec_rows_apply(lrs, section(SEC_LR_SCHEDULE), &out->lr, err)))
        return rc;
    if (oom != NULL && (rc = spec_rows_apply(oom, section(SEC_OOM), out, err)))
        return rc;
    return 0;
}

/* "output_dir": a name under the owner's output
 * area, one or more components of letters, digits, '.', '_', '-' (no
 * empty, "." or ".." component, no leading '/'), so it never leaves it. */
static int get_output_name(const json_t *root, job_spec *out, acc_err *err)
{
    bool present;
    int rc = get_str(root, NULL, "output_dir", true, out->output_name, sizeof out->output_name, &present, err);
    if (rc != 0 || !present)
        return rc;
    const char *s = out->output_name;
    bool ok = s[0] != '\0' && s[0] != '/';
    for (const char *c = s; ok && *c; c++)
        ok = isalnum((unsigned char)*c) || strchr("._-/", *c) != NULL;
    for (const char *c = s; ok && *c;) { /* each component */
        size_t n = strcspn(c, "/");
        ok = n > 0 && !(n == 1 && c[0] == '.') && !(n == 2 && c[0] == '.' && c[1] == '.');
        c += n + (c[n] == '/');
        ok = ok && !(c[-1] == '/' && *c == '\0'); /* no trailing '/' */
    }
    if (!ok)
        return acc_err_set(err, ACC_EINVAL, "output_dir",
                           "output_dir must be a relative name of letters, digits, '.', '_' and '-' components "
                           "(e.g. \"llama2-7b-tulu\"), without '..': it names a directory in your output area");
    return 0;
}

static int set_output_dir(const json_t *obj, const char *prefix, const spec_row *r, void *base, acc_err *err)
{
    return get_output_name(obj, base, err);
}

/* "activation_checkpointing": true / false (recompute each block in the
 * backward), or {"enabled": bool (default true), "offload": bool} where
 * offload (DeepSpeed's "cpu_checkpointing" as its alias) keeps the blocks'
 * inputs in host memory and implies the recomputation. */
static const char *const act_ckpt_keys[] = {"enabled", "offload", "cpu_checkpointing", NULL};

static int get_act_ckpt(const json_t *root, job_spec *out, acc_err *err)
{
    const char *f = "activation_checkpointing";
    json_t *v = json_object_get(root, f);
    if (v == NULL || json_is_boolean(v))
        return get_bool(root, NULL, f, &out->activation_checkpointing, err);
    if (!json_is_object(v))
        return acc_err_set(err, ACC_EINVAL, f, "%s must be true, false or an object, got %s", f, json_kind(v));
    const char *key;
    json_t *x;
    json_object_foreach(v, key, x) {
        if (key_index(key, act_ckpt_keys) < 0)
            return unknown_key(f, key, act_ckpt_keys, "unknown activation_checkpointing key", err);
    }
    bool on = true, offload = false, cpu = false;
    int rc;
    if ((rc = get_bool(v, f, "enabled", &on, err)) || (rc = get_bool(v, f, "offload", &offload, err)) ||
        (rc = get_bool(v, f, "cpu_checkpointing", &cpu, err)))
        return rc;
    offload = offload || cpu;
    if (offload && !on)
        return acc_err_set(err, ACC_EINVAL, "activation_checkpointing.offload",
                           "activation_checkpointing.offload keeps the checkpoints of the recomputation in "
                           "host memory: it needs enabled true");
    out->activation_checkpointing = on;
    out->activation_offload = offload;
    return 0;
}

/* The top level's rows (unknown keys first), then the rules across them. */
static int parse_scalars(const json_t *root, const acc_conf *conf, job_spec *out, acc_err *err)
{
    int rc = spec_rows_apply(root, section(SEC_ROOT), out, err);
    if (rc != 0)
        return rc;
    if (out->nodes > 1 && out->devices * out->nodes > SPEC_MAX_WORLD)
        return acc_err_set(err, ACC_EINVAL, "nodes", "nodes %d x devices %d is %d ranks, over %d", out->nodes,
                           out->devices, out->nodes * out->devices, SPEC_MAX_WORLD);
    out->max_steps_given = json_object_get(root, "max_steps") != NULL;
    if ((rc = get_act_ckpt(root, out, err)) != 0)
        return rc;
    if (json_is_string(json_object_get(root, "resume_from")))
        return check_path(out->resume_from, sizeof out->resume_from, conf->output_root, "resume_from", err);
    return 0;
}

/* ZeRO-3's partitioned store has no LoRA adapters or narrow frozen base
 * yet, and eval_prompts generate on rank 0 alone while every forward
 * needs all ranks' gathers. */
static int check_zero3(const job_spec *out, const char *zero_field, acc_err *err)
{
    if (out->zero_stage != 3)
        return 0;
    if (out->lora.r > 0)
        return acc_err_set(err, ACC_EINVAL, zero_field,
                           "%s 3 with LoRA (lora.r %d) is not supported yet; use stage 1 or 2", zero_field,
                           out->lora.r);
    if (out->eval_prompts[0] != '\0')
        return acc_err_set(err, ACC_EINVAL, "eval_prompts",
                           "eval_prompts with %s 3 is not supported yet (the samples are generated on one "
                           "device)", zero_field);
    return 0;
}

/* The offload_param key's field: where it was given (the deepspeed
 * section or its file first, as get_zero reads them). */
static const char *offload_param_field(const json_t *ds)
{
    const json_t *z = ds != NULL ? json_object_get(ds, "zero_optimization") : NULL;
    if (z != NULL && json_object_get(z, "offload_param") != NULL)
        return "deepspeed.zero_optimization.offload_param";
    return "zero_optimization.offload_param";
}

/* Parameter offload partitions the parameters (stage 3 only) and keeps
 * them on the host next to the optimizer state, which AdamW then updates
 * there in place (as DeepSpeed's ZeRO-Infinity configs pair them). */
static int check_offload_param(const job_spec *out, const char *f, acc_err *err)
{
    if (!out->offload_param)
        return 0;
    if (out->zero_stage != 3)
        return acc_err_set(err, ACC_EINVAL, f,
                           "%s needs zero_optimization.stage 3 (the parameters partitioned), got stage %d", f,
                           out->zero_stage);
    if (!out->offload_optimizer)
        return acc_err_set(err, ACC_EINVAL, f,
                           "%s needs offload_optimizer {\"device\": \"cpu\"} too (AdamW then updates the host "
                           "partition in place)", f);
    return 0;
}

static int check_cross(job_spec *out, acc_err *err)
{
    if (out->model.padded_vocab_size == 0)
        out->model.padded_vocab_size = out->model.vocab_size;
    /* with num_train_epochs alone, the trainer sets max_steps once it knows
     * the samples (and total_steps 0 follows it, optim.c) */
    bool from_epochs = out->num_train_epochs > 0 && !out->max_steps_given;
    if (out->lr.total_steps == 0 && !from_epochs)
        out->lr.total_steps = out->max_steps;
    if (out->lr.type == SPEC_LR_COSINE && out->lr.min_lr > out->optim.lr)
        return acc_err_set(err, ACC_EINVAL, "lr_schedule.min_lr", "lr_schedule.min_lr %g is above optimizer.lr %g",
                           out->lr.min_lr, out->optim.lr);
    /* h-dsconf: Hugging Face's warmup_ratio, when warmup_steps is 0: of the
     * total known now, else of max_steps once num_train_epochs sets it
     * (trainer.c) */
    if (out->lr.warmup_ratio > 0 && out->lr.warmup_steps == 0 && !from_epochs)
        out->lr.warmup_steps = (int)ceil(out->lr.warmup_ratio * (out->lr.total_steps > 0 ? out->lr.total_steps
                                                                                        : out->max_steps));
    if (out->lr.warmup_min_lr > out->optim.lr)
        return acc_err_set(err, ACC_EINVAL, "lr_schedule.warmup_min_lr",
                           "lr_schedule.warmup_min_lr %g is above optimizer.lr %g", out->lr.warmup_min_lr, out->optim.lr);
    return 0;
}

/* ---- the tables (spec_rows.h) ------------------------------------------------ */

/* The regular sections. Irregular ones stay code on purpose: model with
 * "from" (parse_model_from: keys depend on the directory), data (formats,
 * globs, datasets: parse_data), deepspeed and zero_optimization (DeepSpeed's
 * own keys, "auto", keys accepted and ignored: parse_deepspeed, get_zero). */

#define ROW(st, k, t, d, ...) {.key = #k, .type = t, .def = d, .off = offsetof(st, k), .size = sizeof(((st *)0)->k), __VA_ARGS__}
#define CODE(k) {.key = k, .type = SPEC_T_CODE}

static const char *const precisions[] = {"fp32", "bf16", NULL}; /* spec_precision's order */
static const char *const optim_types[] = {"adamw", NULL};
static const char *const lr_types[] = {"constant", "cosine", "warmup", "warmup_decay", "warmup_cosine", NULL};
static const char *const save_formats[] = {"hf", NULL};
static const char *const save_dtypes[] = {"auto", "float32", "bfloat16", "float16", NULL}; /* spec_save_dtype's */

/* The top level: its values in the order they are read, then the keys
 * code reads (sub-sections, the batch triple, DeepSpeed's). */
static const spec_row root_rows[] = {
    ROW(job_spec, name, SPEC_T_STR, "\"job\""),
    ROW(job_spec, devices, SPEC_T_INT, "1", .lo = 1, .hi = SPEC_MAX_DEVICES),
    ROW(job_spec, precision, SPEC_T_CHOICE, "\"fp32\"", .choices = precisions),
    CODE("activation_checkpointing"),
    ROW(job_spec, lean_activations, SPEC_T_BOOL, "false"),
    ROW(job_spec, max_steps, SPEC_T_INT, "100", .lo = 1, .hi = 100000000),
    ROW(job_spec, num_train_epochs, SPEC_T_NUM, NULL, .lo = 0, .open_lo = true, .hi = 1e6),
    ROW(job_spec, eval_interval, SPEC_T_INT, "0", .lo = 0, .hi = INT_MAX),
    ROW(job_spec, eval_batches, SPEC_T_INT, "0", .lo = 0, .hi = 1000000), /* 0: the whole validation set */
    ROW(job_spec, checkpoint_interval, SPEC_T_INT, "0", .lo = 0, .hi = INT_MAX),
    ROW(job_spec, seed, SPEC_T_U64, "1337"),
    ROW(job_spec, priority, SPEC_T_INT, "0", .lo = -1000000, .hi = 1000000),
    ROW(job_spec, max_restarts, SPEC_T_INT, "0", .lo = 0, .hi = SPEC_MAX_RESTARTS),
    ROW(job_spec, nodes, SPEC_T_INT, "1", .lo = 1, .hi = SPEC_MAX_NODES),
    ROW(job_spec, checkpoint_on_cancel, SPEC_T_BOOL, "true"),
    ROW(job_spec, save_total_limit, SPEC_T_INT, NULL, .lo = 1, .hi = 1000),
    {.key = "output_dir", .type = SPEC_T_CUSTOM, .set = set_output_dir},
    ROW(job_spec, resume_from, SPEC_T_STR, NULL, .null_ok = true),
    CODE("model"), CODE("data"), CODE("train_batch_size"), CODE("train_micro_batch_size_per_gpu"),
    CODE("gradient_accumulation_steps"), CODE("optimizer"), CODE("lr_schedule"), CODE("oom"), CODE("deepspeed"),
    CODE("save"), CODE("zero_optimization"), CODE("lora"), CODE("eval_prompts"),
};

/* "model" without "from" */
static const spec_row model_rows[] = {
    {.key = "arch", .type = SPEC_T_CUSTOM, .def = "\"gpt2\"", .set = set_arch},
    ROW(spec_model, n_layer, SPEC_T_INT, "4", .lo = 1, .hi = 256),
    ROW(spec_model, n_head, SPEC_T_INT, "4", .lo = 1, .hi = 256),
    ROW(spec_model, n_embd, SPEC_T_INT, "128", .lo = 1, .hi = 65536),
    ROW(spec_model, seq_len, SPEC_T_INT, "128", .lo = 2, .hi = 1 << 20),
    ROW(spec_model, vocab_size, SPEC_T_INT, "256", .lo = 2, .hi = 1 << 24),
    ROW(spec_model, padded_vocab_size, SPEC_T_INT, NULL, .lo = 0, .hi = 1 << 24), /* 0: vocab_size (check_cross) */
    ROW(spec_model, init_from, SPEC_T_STR, NULL, .null_ok = true),
    ROW(spec_model, n_kv_head, SPEC_T_INT, "0", .lo = 0, .hi = 256),
    ROW(spec_model, intermediate_size, SPEC_T_INT, "0", .lo = 0, .hi = 1 << 20),
    CODE("from"),
};

static const spec_row optimizer_rows[] = {
    {.key = "type", .type = SPEC_T_CHOICE, .def = "\"adamw\"", .choices = optim_types},
    ROW(spec_optim, lr, SPEC_T_NUM, "6e-4", .lo = 0, .open_lo = true, .hi = 10),
    {.key = "betas", .type = SPEC_T_CUSTOM, .def = "[0.9, 0.95]", .set = set_betas},
    ROW(spec_optim, eps, SPEC_T_NUM, "1e-8", .lo = 0, .open_lo = true, .hi = 1),
    ROW(spec_optim, weight_decay, SPEC_T_NUM, "0.1", .lo = 0, .hi = 10),
    ROW(spec_optim, grad_clip, SPEC_T_NUM, "1.0", .lo = 0, .hi = 1e9),
};

static const spec_row lr_rows[] = {
    ROW(spec_lr, type, SPEC_T_CHOICE, "\"constant\"", .choices = lr_types),
    ROW(spec_lr, warmup_steps, SPEC_T_INT, "0", .lo = 0, .hi = INT_MAX),
    ROW(spec_lr, min_lr, SPEC_T_NUM, "0", .lo = 0, .hi = 10),
    ROW(spec_lr, warmup_min_lr, SPEC_T_NUM, "0", .lo = 0, .hi = 10),
    ROW(spec_lr, cos_min_ratio, SPEC_T_NUM, "0.0001", .lo = 0, .hi = 1),
    ROW(spec_lr, total_steps, SPEC_T_INT, NULL, .lo = 1, .hi = INT_MAX), /* 0: max_steps (check_cross) */
    ROW(spec_lr, warmup_ratio, SPEC_T_NUM, "0", .lo = 0, .hi = 1),
};

static const spec_row save_rows[] = {
    {.key = "format", .type = SPEC_T_CHOICE, .def = "\"hf\"", .choices = save_formats},
    ROW(job_spec, merge_lora, SPEC_T_BOOL, "false"),
    {.key = "dtype", .type = SPEC_T_CHOICE, .def = "\"auto\"", .off = offsetof(job_spec, save_dtype),
     .size = sizeof(spec_save_dtype), .choices = save_dtypes},
};

/* PEFT's names read after ours where both are given, as before the table */
static const spec_row lora_rows[] = {
    ROW(spec_lora, r, SPEC_T_INT, "8", .lo = 1, .hi = SPEC_LORA_MAX_R),
    {.key = "lora_alpha", .type = SPEC_T_NUM, .off = offsetof(spec_lora, alpha), .size = sizeof(double),
     .lo = 0, .open_lo = true, .hi = 1e6},
    ROW(spec_lora, alpha, SPEC_T_NUM, "8", .lo = 0, .open_lo = true, .hi = 1e6),
    {.key = "lora_dropout", .type = SPEC_T_NUM, .off = offsetof(spec_lora, dropout), .size = sizeof(double),
     .lo = 0, .hi = 1},
    ROW(spec_lora, dropout, SPEC_T_NUM, "0", .lo = 0, .hi = 1),
    CODE("target_modules"), /* after the dropout rule (parse_lora) */
};

static const spec_row oom_rows[] = {
    {.key = "adapt", .type = SPEC_T_BOOL, .def = "true", .off = offsetof(job_spec, oom_adapt), .size = sizeof(bool)},
};

#define SECTION(p, rows) {p, rows, sizeof rows / sizeof rows[0]}
static const spec_section sections[] = {
    [SEC_ROOT] = SECTION("", root_rows),
    [SEC_MODEL] = SECTION("model", model_rows),
    [SEC_OPTIMIZER] = SECTION("optimizer", optimizer_rows),
    [SEC_LR_SCHEDULE] = SECTION("lr_schedule", lr_rows),
    [SEC_SAVE] = SECTION("save", save_rows),
    [SEC_LORA] = SECTION("lora", lora_rows),
    [SEC_OOM] = SECTION("oom", oom_rows),
    {NULL, NULL, 0},
};

static const spec_section *section(int which) { return &sections[which]; }

const spec_section *spec_sections(void) { return sections; }

/* eval_prompts: strings or conversations, kept as JSON text */
static int get_eval_prompts(const json_t *root, job_spec *out, acc_err *err)
{
    const json_t *a = json_object_get(root, "eval_prompts"), *p, *msg;
    size_t i, j;
    if (a == NULL || json_is_null(a))
        return 0;
    if (!json_is_array(a) || json_array_size(a) > SPEC_EVAL_PROMPTS)
        return acc_err_set(err, ACC_EINVAL, "eval_prompts", "eval_prompts must be an array of at most %d prompts",
                           SPEC_EVAL_PROMPTS);
    json_array_foreach(a, i, p) {
        bool ok = json_is_string(p) ? json_string_length(p) > 0 : json_is_array(p) && json_array_size(p) > 0;
        json_array_foreach(json_is_array(p) ? p : NULL, j, msg)
            ok = ok && json_is_string(json_object_get(msg, "role")) && json_is_string(json_object_get(msg, "content"));
        if (!ok)
            return acc_err_set(err, ACC_EINVAL, "eval_prompts", "eval_prompts[%zu] must be a non-empty string or a "
                               "non-empty array of {\"role\", \"content\"} messages", i);
    }
    if (out->data.tokenizer[0] == '\0' && out->model.from[0] == '\0')
        return acc_err_set(err, ACC_EINVAL, "eval_prompts", "eval_prompts need a tokenizer: data.tokenizer or model.from");
    char *txt = json_dumps(a, JSON_COMPACT);
    int rc = 0;
    if (txt == NULL)
        rc = acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    else if (strlen(txt) >= sizeof out->eval_prompts)
        rc = acc_err_set(err, ACC_EINVAL, "eval_prompts", "eval_prompts take %zu bytes as JSON, over %d", strlen(txt),
                         SPEC_EVAL_PROMPTS_BYTES - 1);
    else
        snprintf(out->eval_prompts, sizeof out->eval_prompts, "%s", txt);
    free(txt);
    return rc;
}

static int parse_root(const json_t *root, const json_t *origin, const acc_conf *conf, job_spec *out, acc_err *err)
{
    batch_in b = {{0}, {0}, {0}};
    json_t *ds;
    int rc;
    if (!json_is_object(root))
        return acc_err_set(err, ACC_EINVAL, "", "the job spec must be a JSON object, got %s", json_kind(root));
    if ((rc = parse_scalars(root, conf, out, err)) || /* the rows: unknown keys first */
        (rc = get_batch(root, NULL, "train_batch_size", &b.B, err)) ||
        (rc = get_batch(root, NULL, "train_micro_batch_size_per_gpu", &b.m, err)) ||
        (rc = get_batch(root, NULL, "gradient_accumulation_steps", &b.a, err)) ||
        (rc = get_object(root, NULL, "deepspeed", &ds, err)))
        return rc;
    /* deepspeed first, so the native keys (more specific) win where both set */
    if (ds != NULL && (rc = parse_deepspeed(ds, root, origin, out, &b, err)))
        return rc;
    char zero_field[64];
    if ((rc = get_zero(root, ds, out, zero_field, sizeof zero_field, err)))
        return rc;
    if ((rc = parse_sections(root, conf, out, err)) || (rc = resolve_batch(&b, out, err)) ||
        (rc = get_eval_prompts(root, out, err)))
        return rc;
    if ((rc = check_offload_param(out, offload_param_field(ds), err)))
        return rc;
    /* stage 3 with parameter offload runs on one device: the point of it */
    if (out->zero_stage >= 1 && out->devices < 2 && !(out->zero_stage == 3 && out->offload_param))
        return acc_err_set(err, ACC_EINVAL, zero_field,
                           "%s %d shards the optimizer state over the job's devices: it needs devices >= 2 "
                           "(devices is %d)", zero_field, out->zero_stage, out->devices);
    if ((rc = check_zero3(out, zero_field, err)))
        return rc;
    return check_cross(out, err);
}

/* ---- integers past 64 bits --------------------------------------------------- */

/* The key path of the first value equal to `v` in document order (jansson
 * keeps objects in insertion order); arrays add no component. */
static bool find_real(const json_t *j, double v, const char *prefix, char *path, size_t n)
{
    if (json_is_real(j)) {
        if (json_real_value(j) != v)
            return false;
        snprintf(path, n, "%s", prefix ? prefix : "");
        return true;
    }
    char f[128];
    if (json_is_array(j)) {
        size_t i;
        json_t *e;
        json_array_foreach((json_t *)j, i, e) {
            if (find_real(e, v, prefix, path, n))
                return true;
        }
    } else if (json_is_object(j)) {
        const char *k;
        json_t *e;
        json_object_foreach((json_t *)j, k, e) {
            if (find_real(e, v, field(f, sizeof f, prefix, k), path, n))
                return true;
        }
    }
    return false;
}

/* jansson refuses an integer beyond int64 as a parse error, naming no key:
 * read the text again with integers as reals, find the value the failing
 * token (which ends at je->position) has, and name its key path. */
static int big_integer_error(const char *text, size_t len, const json_error_t *je, acc_err *err)
{
    size_t end = (size_t)je->position, start = end;
    while (start > 0 && end <= len && strchr("0123456789-+.eE", text[start - 1]) != NULL)
        start--;
    char tok[64];
    int tl = (int)(end - start);
    snprintf(tok, sizeof tok, "%.*s%s", tl > 40 ? 40 : tl, text + start, tl > 40 ? "..." : "");
    char num[512];
    snprintf(num, sizeof num, "%.*s", tl, text + start);
    json_error_t je2;
    json_t *root = tl > 0 ? json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, &je2) : NULL;
    char path[128] = "";
    bool found = root != NULL && find_real(root, strtod(num, NULL), NULL, path, sizeof path);
    json_decref(root);
    if (!found)
        return acc_err_set(err, ACC_EINVAL, "", "malformed JSON at line %d column %d: %s", je->line, je->column,
                           je->text);
    return acc_err_set(err, ACC_EINVAL, path, "%s: the integer %s does not fit in 64 bits",
                       path[0] ? path : "the spec", tok);
}

/* The spec's roots: data_roots, and the hf_hub_cache when there is one
 * (its snapshots link into its blobs/: both inside it). */
static void set_roots(const acc_conf *conf, job_spec *out)
{
    int w = conf->hf_hub_cache[0] == '\0'
                ? snprintf(out->data_roots, sizeof out->data_roots, "%s", conf->data_roots)
                : snprintf(out->data_roots, sizeof out->data_roots, "%s:%s", conf->data_roots, conf->hf_hub_cache);
    if (w < 0 || (size_t)w >= sizeof out->data_roots) /* no cache rather than a cut root */
        snprintf(out->data_roots, sizeof out->data_roots, "%s", conf->data_roots);
}

static int parse_doc(const char *text, size_t len, const acc_conf *conf, bool plan_only, job_spec *out,
                     acc_err *err)
{
    json_error_t je;
    set_defaults(out);
    out->plan_only = plan_only;
    set_roots(conf, out);
    snprintf(out->output_root, sizeof out->output_root, "%s", conf->output_root);
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL && json_error_code(&je) == json_error_numeric_overflow)
        return big_integer_error(text, len, &je, err);
    if (root == NULL)
        return acc_err_set(err, ACC_EINVAL, "", "malformed JSON at line %d column %d: %s", je.line, je.column,
                           je.text);
    /* h-dsconf: Hugging Face's names become the spec's own, a DeepSpeed
     * file its object; errors about an alias's value name the alias */
    json_t *origin = json_object();
    int rc = origin == NULL ? acc_err_set(err, ACC_ENOMEM, NULL, "out of memory") : 0;
    if (rc == 0 && json_is_object(root))
        rc = spec_alias_apply(root, origin, out->ignored, sizeof out->ignored, err);
    if (rc == 0 && json_is_object(root))
        rc = load_deepspeed_file(root, out->data_roots, out, err);
    if (rc == 0)
        rc = parse_root(root, origin, conf, out, err);
    if (rc != 0 && origin != NULL)
        spec_alias_rename_error(origin, err);
    json_decref(origin);
    json_decref(root);
    return rc;
}

int job_spec_parse(const char *text, size_t len, const acc_conf *conf, job_spec *out, acc_err *err)
{
    return parse_doc(text, len, conf, false, out, err);
}

int job_spec_parse_plan(const char *text, size_t len, const acc_conf *conf, job_spec *out, acc_err *err)
{
    return parse_doc(text, len, conf, true, out, err);
}
