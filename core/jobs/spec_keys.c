/* spec_keys: see spec_keys.h. */
#include "spec_keys.h"

#include <ctype.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One row per alias: the Hugging Face name, the key path it stands for,
 * how its value converts. Names that are already the spec's own
 * (gradient_accumulation_steps, num_train_epochs, max_steps, seed) need no
 * row. output_dir and save_total_limit are keys of their own. */
static const spec_alias aliases[] = {
    {"learning_rate", "optimizer.lr", SA_SAME, NULL},
    {"per_device_train_batch_size", "train_micro_batch_size_per_gpu", SA_SAME, NULL},
    {"warmup_steps", "lr_schedule.warmup_steps", SA_SAME, NULL},
    {"warmup_ratio", "lr_schedule.warmup_ratio", SA_SAME, NULL},
    {"lr_scheduler_type", "lr_schedule.type", SA_LR_SCHED, NULL},
    {"weight_decay", "optimizer.weight_decay", SA_SAME, NULL},
    {"max_grad_norm", "optimizer.grad_clip", SA_SAME, NULL},
    {"adam_beta1", "optimizer.betas", SA_BETA1, NULL},
    {"adam_beta2", "optimizer.betas", SA_BETA2, NULL},
    {"adam_epsilon", "optimizer.eps", SA_SAME, NULL},
    {"save_steps", "checkpoint_interval", SA_SAME, NULL},
    {"eval_steps", "eval_interval", SA_SAME, NULL},
    {"bf16", "precision", SA_BF16, NULL},
    {"fp16", "precision", SA_FP16, NULL},
    {"mixed_precision", "precision", SA_MIXED, NULL},
    {"gradient_checkpointing", "activation_checkpointing", SA_SAME, NULL},
    {"model_name_or_path", "model.from", SA_SAME, NULL},
    {"dataset_name", "data.dataset", SA_SAME, NULL},
    {"dataset_config_name", "data.subset", SA_SAME, NULL},
    {"max_seq_length", "model.seq_len", SA_SAME, NULL},
    {"logging_steps", "", SA_IGNORE, "every step is an event on the job's stream"},
    {"logging_first_step", "", SA_IGNORE, "every step is an event on the job's stream"},
    {"report_to", "", SA_IGNORE, "metrics are on the job's stream and /metrics"},
    {"do_train", "", SA_IGNORE, "a job trains"},
    {NULL, NULL, SA_SAME, NULL},
};

const spec_alias *spec_alias_table(void)
{
    return aliases;
}

void spec_list_append(char *buf, size_t n, const char *item)
{
    size_t l = strlen(buf);
    if (n < 8 || l >= n - 4)
        return;
    int w = snprintf(buf + l, n - l, "%s%s", l ? ", " : "", item);
    if (w < 0 || (size_t)w >= n - l)
        snprintf(buf + n - 4, 4, "...");
}

/* ---- values --------------------------------------------------------------- */

/* Equal as JSON values, numbers by value (5e-6 and 0.000005, 2 and 2.0). */
static bool same_value(const json_t *a, const json_t *b)
{
    if (json_is_number(a) && json_is_number(b))
        return json_number_value(a) == json_number_value(b);
    if (json_is_array(a) && json_is_array(b)) {
        if (json_array_size(a) != json_array_size(b))
            return false;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!same_value(json_array_get(a, i), json_array_get(b, i)))
                return false;
        return true;
    }
    return json_equal((json_t *)a, (json_t *)b) != 0;
}

static void show_value(const json_t *v, char *out, size_t n)
{
    char *s = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(10)) : NULL;
    snprintf(out, n, "%s", s ? s : "null");
    free(s);
}

/* The object holding a canonical path's leaf ("a.b": root.a, "b"; "b":
 * root, "b"), created when `create`. NULL when a component is not an
 * object. */
static json_t *parent_of(json_t *root, const char *path, bool create, const char **leaf)
{
    const char *dot = strchr(path, '.');
    if (dot == NULL) {
        *leaf = path;
        return root;
    }
    char sect[64];
    snprintf(sect, sizeof sect, "%.*s", (int)(dot - path), path);
    *leaf = dot + 1;
    json_t *o = json_object_get(root, sect);
    if (o == NULL && create) {
        o = json_object();
        if (o == NULL || json_object_set_new(root, sect, o) != 0)
            return NULL;
    }
    return json_is_object(o) ? o : NULL;
}

/* The alias's value as its canonical key's; NULL with *err set when it has
 * no equivalent; *drop when it sets nothing (fp16: false). */
static json_t *convert(const spec_alias *a, json_t *v, bool *drop, acc_err *err)
{
    *drop = false;
    const char *s = json_string_value(v);
    switch (a->conv) {
    case SA_BF16:
        if (!json_is_boolean(v))
            break;
        return json_string(json_is_true(v) ? "bf16" : "fp32");
    case SA_FP16:
        if (!json_is_boolean(v))
            break;
        if (json_is_true(v)) {
            acc_err_set(err, ACC_EINVAL, a->alias, "fp16 is not supported yet (precision is fp32 or bf16); use bf16");
            return NULL;
        }
        *drop = true;
        return NULL;
    case SA_MIXED:
        if (s == NULL)
            break;
        if (!strcmp(s, "no"))
            return json_string("fp32");
        if (!strcmp(s, "bf16"))
            return json_string("bf16");
        acc_err_set(err, ACC_EINVAL, a->alias, "mixed_precision '%s' is not supported%s (use \"bf16\" or \"no\")", s,
                    !strcmp(s, "fp16") || !strcmp(s, "fp8") ? " yet" : "");
        return NULL;
    case SA_LR_SCHED:
        if (s == NULL)
            break;
        if (!strcmp(s, "cosine") || !strcmp(s, "constant"))
            return json_string(s);
        acc_err_set(err, ACC_EINVAL, a->alias,
                    "lr_scheduler_type '%s' has no equivalent here (\"cosine\" and \"constant\" do; other schedules: "
                    "lr_schedule.type or the deepspeed scheduler)", s);
        return NULL;
    default:
        return json_incref(v);
    }
    acc_err_set(err, ACC_EINVAL, a->alias, "%s must be %s", a->alias,
                a->conv == SA_MIXED || a->conv == SA_LR_SCHED ? "a string" : "true or false");
    return NULL;
}

static int conflict(const json_t *origin, const spec_alias *a, const json_t *mine, const json_t *theirs,
                    acc_err *err)
{
    char m[64], t[64], other[160];
    show_value(mine, m, sizeof m);
    show_value(theirs, t, sizeof t);
    spec_alias_describe(origin, a->canonical, other, sizeof other);
    return acc_err_set(err, ACC_EINVAL, a->alias, "%s is %s but %s is %s (%s is Hugging Face's name for %s): give one",
                       a->alias, m, other, t, a->alias, a->canonical);
}

/* adam_beta1 / adam_beta2: one element of optimizer.betas; the other stays
 * null (the default) unless given. */
static int apply_beta(json_t *root, json_t *origin, const spec_alias *a, json_t *v, acc_err *err)
{
    size_t i = a->conv == SA_BETA1 ? 0 : 1;
    const char *leaf;
    json_t *opt = parent_of(root, a->canonical, true, &leaf);
    if (opt == NULL)
        return acc_err_set(err, ACC_EINVAL, a->alias, "%s: optimizer must be an object", a->alias);
    if (!json_is_number(v))
        return acc_err_set(err, ACC_EINVAL, a->alias, "%s must be a number", a->alias);
    json_t *betas = json_object_get(opt, leaf);
    if (betas == NULL) {
        betas = json_pack("[nn]");
        if (betas == NULL || json_object_set_new(opt, leaf, betas) != 0)
            return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
        json_object_set_new(origin, a->canonical, json_string("adam_beta1/adam_beta2"));
    }
    if (!json_is_array(betas) || json_array_size(betas) != 2)
        return 0; /* optimizer.betas reports its own shape */
    json_t *cur = json_array_get(betas, i);
    if (!json_is_null(cur) && !same_value(cur, v))
        return conflict(origin, a, v, cur, err);
    return json_array_set(betas, i, v) != 0 ? acc_err_set(err, ACC_ENOMEM, NULL, "out of memory") : 0;
}

static int apply_one(json_t *root, json_t *origin, const spec_alias *a, json_t *v, char *ignored, size_t n,
                     acc_err *err)
{
    if (a->conv == SA_IGNORE) {
        char item[160];
        snprintf(item, sizeof item, "%s (%s)", a->alias, a->why);
        spec_list_append(ignored, n, item);
        return 0;
    }
    if (a->conv == SA_BETA1 || a->conv == SA_BETA2)
        return apply_beta(root, origin, a, v, err);
    bool drop;
    json_t *val = convert(a, v, &drop, err);
    if (val == NULL)
        return drop ? 0 : err->code;
    const char *leaf;
    json_t *parent = parent_of(root, a->canonical, true, &leaf);
    int rc = 0;
    if (parent == NULL) {
        char sect[64];
        snprintf(sect, sizeof sect, "%.*s", (int)strcspn(a->canonical, "."), a->canonical);
        rc = acc_err_set(err, ACC_EINVAL, sect, "%s must be an object (%s sets %s)", sect, a->alias, a->canonical);
    } else {
        json_t *cur = json_object_get(parent, leaf);
        if (cur != NULL && !same_value(cur, val))
            rc = conflict(origin, a, v, cur, err);
        else if (cur == NULL && json_object_set(parent, leaf, val) != 0)
            rc = acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
        else if (cur == NULL)
            json_object_set_new(origin, a->canonical, json_string(a->alias));
    }
    json_decref(val);
    return rc;
}

int spec_alias_apply(json_t *root, json_t *origin, char *ignored, size_t n, acc_err *err)
{
    for (const spec_alias *a = aliases; a->alias != NULL; a++) {
        json_t *v = json_object_get(root, a->alias);
        if (v == NULL)
            continue;
        json_incref(v);
        json_object_del(root, a->alias);
        int rc = json_is_null(v) ? 0 : apply_one(root, origin, a, v, ignored, n, err);
        json_decref(v);
        if (rc != 0)
            return rc;
    }
    return 0;
}

void spec_alias_describe(const json_t *origin, const char *canonical, char *out, size_t n)
{
    const char *alias = json_string_value(json_object_get(origin, canonical));
    if (alias != NULL)
        snprintf(out, n, "%s (given as %s)", canonical, alias);
    else
        snprintf(out, n, "%s", canonical);
}

void spec_alias_rename_error(const json_t *origin, acc_err *err)
{
    if (err->field[0] == '\0')
        return;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)origin, key, v) {
        size_t kl = strlen(key);
        if (strncmp(err->field, key, kl) != 0 || (err->field[kl] != '\0' && err->field[kl] != '['))
            continue;
        const char *alias = json_string_value(v);
        if (alias == NULL || strchr(alias, '/') != NULL)
            return;
        char msg[sizeof err->msg];
        if (snprintf(msg, sizeof msg, "%s (Hugging Face's name for %s): %s", alias, key, err->msg) < 0)
            return;
        memcpy(err->msg, msg, sizeof err->msg);
        err->msg[sizeof err->msg - 1] = '\0';
        if (snprintf(err->field, sizeof err->field, "%s", alias) < 0)
            err->field[0] = '\0';
        return;
    }
}

/* ---- did you mean --------------------------------------------------------- */

/* Well-known names given where they do not belong: (path, name, key). */
static const struct misplaced {
    const char *prefix, *key, *suggest;
} misplaced[] = {
    {"", "lr", "optimizer.lr"},
    {"", "betas", "optimizer.betas"},
    {"", "eps", "optimizer.eps"},
    {"", "grad_clip", "optimizer.grad_clip"},
    {"", "gradient_clipping", "optimizer.grad_clip"},
    {"", "batch_size", "train_batch_size"},
    {"", "global_batch_size", "train_batch_size"},
    {"", "micro_batch_size", "train_micro_batch_size_per_gpu"},
    {"", "micro_batch", "train_micro_batch_size_per_gpu"},
    {"", "epochs", "num_train_epochs"},
    {"", "seq_len", "model.seq_len"},
    {"", "max_seq_len", "model.seq_len"},
    {"", "tokenizer", "data.tokenizer"},
    {"", "chat_template", "data.chat_template"},
    {"", "train_file", "data.train"},
    {"", "dataset", "data.dataset"},
    {"", "zero_stage", "zero_optimization.stage"},
    {"", "stage", "zero_optimization.stage"},
    {"", "deepspeed_config", "deepspeed"},
    {"", "deepspeed_config_file", "deepspeed"},
    {"", "ds_config", "deepspeed"},
    {"optimizer", "learning_rate", "lr"},
    {"optimizer", "beta1", "betas"},
    {"optimizer", "beta2", "betas"},
    {"optimizer", "max_grad_norm", "grad_clip"},
    {"data", "dataset_name", "dataset"},
    {"data", "train_file", "train"},
    {"data", "validation_file", "val"},
    {"data", "config_name", "subset"},
    {"model", "model_name_or_path", "from"},
    {"model", "max_position_embeddings", "seq_len"},
    {NULL, NULL, NULL},
};

/* Lower case, '-' as '_'. */
static void norm(const char *s, char *out, size_t n)
{
    size_t i = 0;
    for (; s[i] && i + 1 < n; i++)
        out[i] = s[i] == '-' ? '_' : (char)tolower((unsigned char)s[i]);
    out[i] = '\0';
}

static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), row[65];
    if (la > 64 || lb > 64)
        return 1000;
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            diag = up;
            row[j] = best;
        }
    }
    return row[lb];
}

/* Lower is closer: the edit distance, or less for a name contained in the
 * candidate ("epochs" in "num_train_epochs"). */
static double score(const char *key, const char *cand)
{
    char k[80], c[80];
    norm(key, k, sizeof k);
    norm(cand, c, sizeof c);
    double d = (double)edit_distance(k, c);
    size_t lk = strlen(k), lc = strlen(c);
    if (lk >= 3 && lc >= 3 && (strstr(c, k) != NULL || strstr(k, c) != NULL)) {
        /* a key with more than the candidate is less likely it than one with less */
        double sub = lk < lc ? 0.5 + 0.25 * (double)(lc - lk) : 0.5 + 0.5 * (double)(lk - lc);
        if (sub < d)
            d = sub;
    }
    return d;
}

const char *spec_keys_suggest(const char *prefix, const char *key, const char *const *allowed)
{
    const char *p = prefix ? prefix : "";
    char k[80];
    norm(key, k, sizeof k);
    for (int i = 0; misplaced[i].key != NULL; i++)
        if (!strcmp(misplaced[i].prefix, p) && !strcmp(misplaced[i].key, k))
            return misplaced[i].suggest;
    const char *best = NULL;
    double best_score = 1e9;
    for (int i = 0; allowed != NULL && allowed[i] != NULL; i++) {
        double s = score(key, allowed[i]);
        if (s < best_score)
            best = allowed[i], best_score = s;
    }
    if (p[0] == '\0')
        for (const spec_alias *a = aliases; a->alias != NULL; a++) {
            double s = score(key, a->alias);
            if (s < best_score)
                best = a->alias, best_score = s;
        }
    return best;
}
