/* tok: loading tokenizer.json / tokenizer_config.json, the encode pipeline
 * (added tokens, normalizer, pre-tokenizer, BPE, post-processor) and
 * decoding. The contract is in tok.h.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "budget.h"
#include "checked.h"
#include "fsutil.h"
#include "safepath.h"
#include "tok_internal.h"

#define GPT2_PATTERN                                                                      \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

/* ---- ids */
int tok_ids_push(tok_ids *a, int32_t id)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 256;
        int32_t *v = realloc(a->v, cap * sizeof *v);
        if (v == NULL)
            return ACC_ENOMEM;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = id;
    return 0;
}

void tok_ids_free(tok_ids *a)
{
    free(a->v);
    memset(a, 0, sizeof *a);
}

/* ---- JSON helpers: every error names the JSON path */
static int unsupported(acc_err *err, const char *path, const char *what)
{
    return acc_err_set(err, ACC_EINVAL, "tokenizer", "tokenizer.json %s: %s is not supported",
                       path, what);
}

static int bad(acc_err *err, const char *path, const char *what)
{
    return acc_err_set(err, ACC_EINVAL, "tokenizer", "tokenizer.json %s: %s", path, what);
}

/* Refuse keys outside `known` (NULL-terminated), so an option we do not
 * implement is never ignored silently. */
static int check_keys(json_t *o, const char *path, const char *const *known, acc_err *err)
{
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        bool ok = false;
        for (int i = 0; known[i] && !ok; i++)
            ok = strcmp(k, known[i]) == 0;
        if (!ok) {
            char what[192];
            snprintf(what, sizeof what, "option \"%s\"", k);
            return unsupported(err, path, what);
        }
    }
    return 0;
}

/* *out is set on every path (dflt on an error), so callers need no
 * initialiser of their own. */
static int get_bool(json_t *o, const char *key, bool dflt, bool *out, const char *path,
                    acc_err *err)
{
    json_t *v = json_object_get(o, key);
    *out = dflt;
    if (v == NULL || json_is_null(v))
        return 0;
    if (!json_is_boolean(v)) {
        char what[160];
        snprintf(what, sizeof what, "\"%s\" must be a boolean", key);
        return bad(err, path, what);
    }
    *out = json_is_true(v);
    return 0;
}

static int dup_str(json_t *v, char **s, size_t *n)
{
    *n = json_string_length(v);
    *s = malloc(*n + 1);
    if (*s == NULL)
        return ACC_ENOMEM;
    memcpy(*s, json_string_value(v), *n);
    (*s)[*n] = 0;
    return 0;
}

static int get_str(json_t *o, const char *key, char **s, size_t *n, const char *path, acc_err *err)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v)) {
        char what[160];
        snprintf(what, sizeof what, "\"%s\" must be a string", key);
        return bad(err, path, what);
    }
    return dup_str(v, s, n) == 0 ? 0 : acc_err_set(err, ACC_ENOMEM, "", "out of memory");
}

static int compile_re(const char *pat, size_t n, pcre2_code **out, const char *path, acc_err *err)
{
    int code;
    PCRE2_SIZE off;
    *out = pcre2_compile((PCRE2_SPTR)pat, n, PCRE2_UTF | PCRE2_UCP, &code, &off, NULL);
    if (*out == NULL) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        char what[256];
        snprintf(what, sizeof what, "regex error at offset %zu: %s", (size_t)off, (char *)msg);
        return bad(err, path, what);
    }
    pcre2_jit_compile(*out, PCRE2_JIT_COMPLETE); /* optional: plain matching when it fails */
    return 0;
}

/* {"String": s} or {"Regex": r}; regex_ok: whether a regex is accepted */
static int get_pattern(json_t *o, const char *path, bool regex_ok, char **s, size_t *n,
                       pcre2_code **re, acc_err *err)
{
    char p[160];
    snprintf(p, sizeof p, "%s.pattern", path);
    json_t *pat = json_object_get(o, "pattern");
    json_t *str = json_object_get(pat, "String"), *rx = json_object_get(pat, "Regex");
    *re = NULL;
    *s = NULL;
    if (json_is_string(str)) {
        if (json_string_length(str) == 0)
            return bad(err, p, "an empty String pattern");
        return dup_str(str, s, n) == 0 ? 0 : acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    }
    if (json_is_string(rx)) {
        if (!regex_ok)
            return unsupported(err, p, "a Regex pattern here");
        return compile_re(json_string_value(rx), json_string_length(rx), re, p, err);
    }
    return bad(err, p, "must be {\"String\": ...} or {\"Regex\": ...}");
}

/* A Sequence component {"type": "Sequence", KEY: [...]}: no other keys, its
 * list, and zeroed room for its elements (*n set only once it exists, so a
 * free of the half-parsed component stays safe). */
static int sequence_of(json_t *o, const char *path, const char *key, size_t size, json_t **list,
                       void **elems, int *n, acc_err *err)
{
    const char *const k[] = {"type", key, NULL};
    *list = json_object_get(o, key);
    int rc = check_keys(o, path, k, err);
    if (rc != 0)
        return rc;
    if (!json_is_array(*list)) {
        char what[96];
        snprintf(what, sizeof what, "\"%s\" must be a list", key);
        return bad(err, path, what);
    }
    size_t count = json_array_size(*list);
    if (count > 1024)
        return bad(err, path, "a sequence of more than 1024 components");
    *elems = calloc(count ? count : 1, size);
    if (*elems == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    *n = (int)count;
    return 0;
}

/* "<path>.<key>[i]": where element i of a sequence is, for messages. */
static const char *elem_path(char *buf, size_t n, const char *path, const char *key, int i)
{
    snprintf(buf, n, "%s.%s[%d]", path, key, i);
    return buf;
}

/* ---- normalizers */
static int parse_norm(json_t *o, const char *path, tok_norm *nm, acc_err *err)
{
    memset(nm, 0, sizeof *nm);
    const char *type = json_string_value(json_object_get(o, "type"));
    char tp[192];
    snprintf(tp, sizeof tp, "%s.type", path);
    if (type == NULL)
        return bad(err, tp, "missing");
    static const char *const k_type[] = {"type", NULL};
    if (strcmp(type, "Sequence") == 0) {
        json_t *a;
        nm->kind = TN_SEQUENCE;
        int rc = sequence_of(o, path, "normalizers", sizeof *nm->sub, &a, (void **)&nm->sub, &nm->nsub, err);
        for (int i = 0; rc == 0 && i < nm->nsub; i++) {
            char sp[192];
            rc = parse_norm(json_array_get(a, (size_t)i), elem_path(sp, sizeof sp, path, "normalizers", i), &nm->sub[i], err);
        }
        return rc;
    }
    static const struct { const char *name; int kind; } simple[] = {
        {"NFC", TN_NFC}, {"NFD", TN_NFD}, {"NFKC", TN_NFKC}, {"NFKD", TN_NFKD},
        {"Lowercase", TN_LOWERCASE},
    };
    for (size_t i = 0; i < sizeof simple / sizeof *simple; i++)
        if (strcmp(type, simple[i].name) == 0) {
            nm->kind = simple[i].kind;
            return check_keys(o, path, k_type, err);
        }
    if (strcmp(type, "Prepend") == 0) {
        static const char *const k[] = {"type", "prepend", NULL};
        nm->kind = TN_PREPEND;
        return check_keys(o, path, k, err) ? err->code
                                           : get_str(o, "prepend", &nm->a, &nm->alen, path, err);
    }
    if (strcmp(type, "Replace") == 0) {
        static const char *const k[] = {"type", "pattern", "content", NULL};
        nm->kind = TN_REPLACE;
        if (check_keys(o, path, k, err) ||
            get_pattern(o, path, true, &nm->a, &nm->alen, &nm->re, err))
            return err->code;
        return get_str(o, "content", &nm->b, &nm->blen, path, err);
    }
    if (strcmp(type, "Strip") == 0) {
        static const char *const k[] = {"type", "strip_left", "strip_right", NULL};
        nm->kind = TN_STRIP;
        if (check_keys(o, path, k, err) ||
            get_bool(o, "strip_left", false, &nm->left, path, err) ||
            get_bool(o, "strip_right", false, &nm->right, path, err))
            return err->code;
        return 0;
    }
    char what[160];
    snprintf(what, sizeof what, "normalizer type %s", type);
    return unsupported(err, tp, what);
}

static void free_norm(tok_norm *nm)
{
    for (int i = 0; i < nm->nsub; i++)
        free_norm(&nm->sub[i]);
    free(nm->sub);
    free(nm->a);
    free(nm->b);
    pcre2_code_free(nm->re);
}

/* ---- pre-tokenizers */
static int parse_behavior(json_t *o, const char *path, int *out, acc_err *err)
{
    static const struct { const char *name; int b; } tb[] = {
        {"Removed", TS_REMOVED}, {"Isolated", TS_ISOLATED},
        {"MergedWithPrevious", TS_MERGED_PREV}, {"MergedWithNext", TS_MERGED_NEXT},
        {"Contiguous", TS_CONTIGUOUS},
    };
    const char *s = json_string_value(json_object_get(o, "behavior"));
    for (size_t i = 0; s && i < sizeof tb / sizeof *tb; i++)
        if (strcmp(s, tb[i].name) == 0) {
            *out = tb[i].b;
            return 0;
        }
    return bad(err, path, "\"behavior\" must be Removed, Isolated, MergedWithPrevious, "
                          "MergedWithNext or Contiguous");
}

static int parse_prepend_scheme(json_t *o, const char *path, int *out, acc_err *err)
{
    json_t *ps = json_object_get(o, "prepend_scheme");
    if (ps == NULL) { /* older files: add_prefix_space */
        bool aps;
        if (get_bool(o, "add_prefix_space", true, &aps, path, err))
            return err->code;
        *out = aps ? TPS_ALWAYS : TPS_NEVER;
        return 0;
    }
    const char *s = json_string_value(ps);
    if (s && strcmp(s, "always") == 0)
        *out = TPS_ALWAYS;
    else if (s && strcmp(s, "first") == 0)
        *out = TPS_FIRST;
    else if (s && strcmp(s, "never") == 0)
        *out = TPS_NEVER;
    else
        return bad(err, path, "\"prepend_scheme\" must be always, first or never");
    return 0;
}

static int get_replacement(json_t *o, const char *path, char *out, size_t *len, acc_err *err)
{
    json_t *r = json_object_get(o, "replacement");
    const char *s = json_string_value(r);
    size_t n = s ? json_string_length(r) : 0, adv = 0;
    if (s == NULL || n == 0 || n > 4 ||
        (tok_utf8_decode((const unsigned char *)s, n, &adv), adv != n))
        return bad(err, path, "\"replacement\" must be one character");
    memcpy(out, s, n);
    *len = n;
    return 0;
}

static int parse_pre(tok_tokenizer *t, json_t *o, const char *path, tok_pre *p, acc_err *err)
{
    memset(p, 0, sizeof *p);
    const char *type = json_string_value(json_object_get(o, "type"));
    char tp[192];
    snprintf(tp, sizeof tp, "%s.type", path);
    if (type == NULL)
        return bad(err, tp, "missing");
    if (strcmp(type, "Sequence") == 0) {
        json_t *a;
        p->kind = TP_SEQUENCE;
        int rc = sequence_of(o, path, "pretokenizers", sizeof *p->sub, &a, (void **)&p->sub, &p->nsub, err);
        for (int i = 0; rc == 0 && i < p->nsub; i++) {
            char sp[192];
            rc = parse_pre(t, json_array_get(a, (size_t)i), elem_path(sp, sizeof sp, path, "pretokenizers", i), &p->sub[i], err);
        }
        return rc;
    }
    if (strcmp(type, "Split") == 0) {
        static const char *const k[] = {"type", "pattern", "behavior", "invert", NULL};
        p->kind = TP_SPLIT;
        if (check_keys(o, path, k, err) ||
            get_pattern(o, path, true, &p->str, &p->slen, &p->re, err) ||
            parse_behavior(o, path, &p->behavior, err) ||
            get_bool(o, "invert", false, &p->invert, path, err))
            return err->code;
        return 0;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        static const char *const k[] = {"type", "add_prefix_space", "trim_offsets", "use_regex",
                                        NULL};
        bool trim;
        p->kind = TP_BYTELEVEL;
        if (check_keys(o, path, k, err) ||
            get_bool(o, "add_prefix_space", true, &p->add_prefix_space, path, err) ||
            get_bool(o, "trim_offsets", true, &trim, path, err) || /* offsets only */
            get_bool(o, "use_regex", true, &p->use_regex, path, err))
            return err->code;
        if (p->use_regex && t->gpt2_re == NULL &&
            compile_re(GPT2_PATTERN, strlen(GPT2_PATTERN), &t->gpt2_re, path, err))
            return err->code;
        return 0;
    }
    if (strcmp(type, "Metaspace") == 0) {
        static const char *const k[] = {"type", "replacement", "prepend_scheme", "split",
                                        "add_prefix_space", "str_rep", NULL};
        p->kind = TP_METASPACE;
        if (check_keys(o, path, k, err) ||
            get_replacement(o, path, p->repl, &p->repl_len, err) ||
            parse_prepend_scheme(o, path, &p->prepend_scheme, err) ||
            get_bool(o, "split", true, &p->split, path, err))
            return err->code;
        return 0;
    }
    if (strcmp(type, "Digits") == 0) {
        static const char *const k[] = {"type", "individual_digits", NULL};
        p->kind = TP_DIGITS;
        if (check_keys(o, path, k, err) ||
            get_bool(o, "individual_digits", false, &p->individual_digits, path, err))
            return err->code;
        p->behavior = p->individual_digits ? TS_ISOLATED : TS_CONTIGUOUS;
        return compile_re("\\p{N}", 5, &p->re, path, err);
    }
    if (strcmp(type, "WhitespaceSplit") == 0) {
        static const char *const k[] = {"type", NULL};
        p->kind = TP_WSSPLIT;
        p->behavior = TS_REMOVED;
        return check_keys(o, path, k, err) ? err->code : compile_re("\\s", 2, &p->re, path, err);
    }
    char what[160];
    snprintf(what, sizeof what, "pre-tokenizer type %s", type);
    return unsupported(err, tp, what);
}

static void free_pre(tok_pre *p)
{
    for (int i = 0; i < p->nsub; i++)
        free_pre(&p->sub[i]);
    free(p->sub);
    free(p->str);
    pcre2_code_free(p->re);
}

/* ---- decoders */
static int parse_dec(json_t *o, const char *path, tok_dec *d, acc_err *err)
{
    memset(d, 0, sizeof *d);
    const char *type = json_string_value(json_object_get(o, "type"));
    char tp[192];
    snprintf(tp, sizeof tp, "%s.type", path);
    if (type == NULL)
        return bad(err, tp, "missing");
    if (strcmp(type, "Sequence") == 0) {
        json_t *a;
        d->kind = TD_SEQUENCE;
        int rc = sequence_of(o, path, "decoders", sizeof *d->sub, &a, (void **)&d->sub, &d->nsub, err);
        for (int i = 0; rc == 0 && i < d->nsub; i++) {
            char sp[192];
            rc = parse_dec(json_array_get(a, (size_t)i), elem_path(sp, sizeof sp, path, "decoders", i), &d->sub[i], err);
        }
        return rc;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        static const char *const k[] = {"type", "add_prefix_space", "trim_offsets", "use_regex",
                                        NULL};
        d->kind = TD_BYTELEVEL;
        return check_keys(o, path, k, err);
    }
    if (strcmp(type, "Metaspace") == 0) {
        static const char *const k[] = {"type", "replacement", "prepend_scheme", "split",
                                        "add_prefix_space", "str_rep", NULL};
        char r[8];
        size_t rl;
        d->kind = TD_METASPACE;
        if (check_keys(o, path, k, err) || get_replacement(o, path, r, &rl, err) ||
            parse_prepend_scheme(o, path, &d->prepend_scheme, err))
            return err->code;
        d->a = malloc(rl + 1);
        if (d->a == NULL)
            return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
        memcpy(d->a, r, rl);
        d->a[rl] = 0;
        d->alen = rl;
        return 0;
    }
    if (strcmp(type, "Replace") == 0) {
        static const char *const k[] = {"type", "pattern", "content", NULL};
        pcre2_code *re = NULL;
        d->kind = TD_REPLACE;
        if (check_keys(o, path, k, err) || get_pattern(o, path, false, &d->a, &d->alen, &re, err))
            return err->code;
        return get_str(o, "content", &d->b, &d->blen, path, err);
    }
    if (strcmp(type, "ByteFallback") == 0 || strcmp(type, "Fuse") == 0) {
        static const char *const k[] = {"type", NULL};
        d->kind = type[0] == 'B' ? TD_BYTEFALLBACK : TD_FUSE;
        return check_keys(o, path, k, err);
    }
    if (strcmp(type, "Strip") == 0) {
        static const char *const k[] = {"type", "content", "start", "stop", NULL};
        json_t *st = json_object_get(o, "start"), *sp = json_object_get(o, "stop");
        d->kind = TD_STRIP;
        if (check_keys(o, path, k, err) || get_str(o, "content", &d->a, &d->alen, path, err))
            return err->code;
        if (!json_is_integer(st) || !json_is_integer(sp) || json_integer_value(st) < 0 ||
            json_integer_value(sp) < 0 || json_integer_value(st) > 1 << 20 ||
            json_integer_value(sp) > 1 << 20)
            return bad(err, path, "\"start\" and \"stop\" must be counts");
        d->start = (int)json_integer_value(st);
        d->stop = (int)json_integer_value(sp);
        return 0;
    }
    char what[160];
    snprintf(what, sizeof what, "decoder type %s", type);
    return unsupported(err, tp, what);
}

static void free_dec(tok_dec *d)
{
    for (int i = 0; i < d->nsub; i++)
        free_dec(&d->sub[i]);
    free(d->sub);
    free(d->a);
    free(d->b);
}

/* ---- the vocabulary, merges and added tokens */
/* The post-processor's special-token ids: each must name a token of the
 * vocabulary already loaded (an id past it would index past the model's
 * embedding rows). */
static int add_ids(const tok_tokenizer *t, int32_t **v, size_t *n, json_t *ids, const char *path,
                   acc_err *err)
{
    size_t k;
    json_t *x;
    if (!json_is_array(ids))
        return bad(err, path, "\"ids\" must be a list");
    json_array_foreach(ids, k, x) {
        if (!json_is_integer(x) || json_integer_value(x) < 0 ||
            json_integer_value(x) >= t->ntok || t->tok[json_integer_value(x)] == NULL)
            return bad(err, path, "ids must be ids of the vocabulary");
        int32_t *nv = realloc(*v, (*n + 1) * sizeof *nv);
        if (nv == NULL)
            return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
        *v = nv;
        (*v)[(*n)++] = (int32_t)json_integer_value(x);
    }
    return 0;
}

/* TemplateProcessing's "single": the special tokens before and after $A */
static int parse_template(const tok_tokenizer *t, json_t *o, const char *path, tok_post *pp,
                          acc_err *err)
{
    static const char *const k[] = {"type", "single", "pair", "special_tokens", NULL};
    if (check_keys(o, path, k, err))
        return err->code;
    json_t *single = json_object_get(o, "single"), *sp = json_object_get(o, "special_tokens");
    if (!json_is_array(single))
        return bad(err, path, "\"single\" must be a list");
    bool seen_a = false;
    size_t i;
    json_t *it;
    json_array_foreach(single, i, it) {
        json_t *st = json_object_get(it, "SpecialToken"), *seq = json_object_get(it, "Sequence");
        char p[224];
        snprintf(p, sizeof p, "%s.single[%zu]", path, i);
        if (seq != NULL) {
            const char *id = json_string_value(json_object_get(seq, "id"));
            if (id == NULL || strcmp(id, "A") != 0 || seen_a)
                return unsupported(err, p, "a sequence other than one $A");
            seen_a = true;
        } else if (st != NULL) {
            const char *name = json_string_value(json_object_get(st, "id"));
            json_t *def = name ? json_object_get(sp, name) : NULL;
            if (def == NULL)
                return bad(err, p, "names a special token missing from \"special_tokens\"");
            if (seen_a ? add_ids(t, &pp->post, &pp->npost, json_object_get(def, "ids"), p, err)
                       : add_ids(t, &pp->pre, &pp->npre, json_object_get(def, "ids"), p, err))
                return err->code;
        } else {
            return bad(err, p, "must be {\"SpecialToken\": ...} or {\"Sequence\": ...}");
        }
    }
    pp->present = true;
    return 0;
}

static int parse_post(const tok_tokenizer *t, json_t *o, const char *path, tok_post *pp,
                      acc_err *err)
{
    const char *type = json_string_value(json_object_get(o, "type"));
    char tp[192];
    snprintf(tp, sizeof tp, "%s.type", path);
    if (type == NULL)
        return bad(err, tp, "missing");
    if (strcmp(type, "ByteLevel") == 0)
        return 0; /* offsets only: no ids */
    if (strcmp(type, "TemplateProcessing") == 0) {
        if (pp->present)
            return unsupported(err, path, "a second TemplateProcessing");
        return parse_template(t, o, path, pp, err);
    }
    if (strcmp(type, "Sequence") == 0) {
        json_t *a = json_object_get(o, "processors");
        if (!json_is_array(a))
            return bad(err, path, "\"processors\" must be a list");
        for (size_t i = 0; i < json_array_size(a); i++) {
            char p[192];
            snprintf(p, sizeof p, "%s.processors[%zu]", path, i);
            int rc = parse_post(t, json_array_get(a, i), p, pp, err);
            if (rc != 0)
                return rc;
        }
        return 0;
    }
    char what[160];
    snprintf(what, sizeof what, "post-processor type %s", type);
    return unsupported(err, tp, what);
}

static int set_token(tok_tokenizer *t, int32_t id, const char *s, size_t n)
{
    free(t->tok[id]);
    t->tok[id] = malloc(n + 1);
    if (t->tok[id] == NULL)
        return ACC_ENOMEM;
    memcpy(t->tok[id], s, n);
    t->tok[id][n] = 0;
    t->tok_len[id] = (uint32_t)n;
    return 0;
}

/* The id of string s in the model's vocabulary, or an error naming path. */
static int vocab_id(tok_tokenizer *t, const char *s, size_t n, const char *path, int32_t *id,
                    acc_err *err)
{
    *id = tok_strmap_get(&t->vocab, t, s, n);
    if (*id >= 0)
        return 0;
    char what[160];
    snprintf(what, sizeof what, "token \"%.*s\" is not in the vocabulary", (int)(n > 64 ? 64 : n),
             s);
    return bad(err, path, what);
}

static int parse_merges(tok_tokenizer *t, json_t *merges, acc_err *err)
{
    if (!json_is_array(merges))
        return bad(err, "model.merges", "must be a list");
    size_t nm = json_array_size(merges);
    if (tok_pairmap_init(&t->merges, nm) != 0)
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    char *cat = NULL;
    size_t catcap = 0;
    int rc = 0;
    for (size_t i = 0; i < nm && rc == 0; i++) {
        json_t *m = json_array_get(merges, i);
        const char *a, *b;
        size_t al, bl;
        char path[64];
        snprintf(path, sizeof path, "model.merges[%zu]", i);
        if (json_is_string(m)) { /* "a b" */
            const char *s = json_string_value(m);
            size_t n = json_string_length(m);
            const char *sp = memchr(s, ' ', n);
            if (sp == NULL || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - s)) != NULL) {
                rc = bad(err, path, "must be \"a b\" (two tokens, one space)");
                break;
            }
            a = s;
            al = (size_t)(sp - s);
            b = sp + 1;
            bl = n - al - 1;
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            al = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            bl = json_string_length(json_array_get(m, 1));
        } else {
            rc = bad(err, path, "must be \"a b\" or [\"a\", \"b\"]");
            break;
        }
        int32_t ia, ib, im;
        if (al + bl > catcap) {
            catcap = 2 * (al + bl) + 16;
            char *nc = realloc(cat, catcap);
            if (nc == NULL) {
                rc = acc_err_set(err, ACC_ENOMEM, "", "out of memory");
                break;
            }
            cat = nc;
        }
        memcpy(cat, a, al);
        memcpy(cat + al, b, bl);
        if ((rc = vocab_id(t, a, al, path, &ia, err)) || (rc = vocab_id(t, b, bl, path, &ib, err)) ||
            (rc = vocab_id(t, cat, al + bl, path, &im, err)))
            break;
        tok_pairmap_put(&t->merges, ia, ib, (uint32_t)i, im);
    }
    free(cat);
    return rc;
}

static int parse_model(tok_tokenizer *t, json_t *m, json_t *added, acc_err *err)
{
    static const char *const k[] = {"type", "dropout", "unk_token", "continuing_subword_prefix",
                                    "end_of_word_suffix", "fuse_unk", "byte_fallback",
                                    "ignore_merges", "vocab", "merges", NULL};
    const char *type = json_string_value(json_object_get(m, "type"));
    if (!json_is_object(m))
        return bad(err, "model", "missing");
    if (type == NULL || strcmp(type, "BPE") != 0) {
        char what[160];
        snprintf(what, sizeof what, "model type %s", type ? type : "(none)");
        return unsupported(err, "model.type", what);
    }
    if (check_keys(m, "model", k, err))
        return err->code;
    json_t *dropout = json_object_get(m, "dropout");
    if (dropout && !json_is_null(dropout) && !(json_is_number(dropout) && json_number_value(dropout) == 0))
        return unsupported(err, "model.dropout", "BPE dropout");
    if (get_bool(m, "fuse_unk", false, &t->fuse_unk, "model", err) ||
        get_bool(m, "byte_fallback", false, &t->byte_fallback, "model", err) ||
        get_bool(m, "ignore_merges", false, &t->ignore_merges, "model", err))
        return err->code;
    json_t *cp = json_object_get(m, "continuing_subword_prefix"),
           *eow = json_object_get(m, "end_of_word_suffix");
    if (json_is_string(cp) && dup_str(cp, &t->cont_prefix, &t->cont_prefix_len))
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    if (json_is_string(eow) && dup_str(eow, &t->eow_suffix, &t->eow_suffix_len))
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory");

    json_t *vocab = json_object_get(m, "vocab");
    if (!json_is_object(vocab))
        return bad(err, "model.vocab", "must be an object of token: id");
    int64_t maxid = -1;
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= (1 << 24))
            return bad(err, "model.vocab", "ids must be integers in [0, 2^24)");
        if (json_integer_value(v) > maxid)
            maxid = json_integer_value(v);
    }
    size_t i;
    json_array_foreach(added, i, v) {
        json_t *id = json_object_get(v, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= (1 << 24))
            return bad(err, "added_tokens", "ids must be integers in [0, 2^24)");
        if (json_integer_value(id) > maxid)
            maxid = json_integer_value(id);
    }
    t->ntok = (int)(maxid + 1);
    t->tok = calloc((size_t)t->ntok + 1, sizeof *t->tok);
    t->tok_len = calloc((size_t)t->ntok + 1, sizeof *t->tok_len);
    t->in_model = calloc((size_t)t->ntok + 1, sizeof *t->in_model);
    t->special = calloc((size_t)t->ntok + 1, sizeof *t->special);
    if (!t->tok || !t->tok_len || !t->in_model || !t->special ||
        tok_strmap_init(&t->vocab, json_object_size(vocab)) != 0)
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    json_object_foreach(vocab, key, v) {
        int32_t id = (int32_t)json_integer_value(v);
        /* the key's length: jansson keys are NUL-terminated; a token with a NUL
         * would need json_object_key_len (jansson >= 2.14) */
        if (set_token(t, id, key, strlen(key)) != 0)
            return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
        t->in_model[id] = true;
        tok_strmap_put(&t->vocab, t, id);
    }
    const char *unk = json_string_value(json_object_get(m, "unk_token"));
    t->unk_id = -1;
    if (unk != NULL && vocab_id(t, unk, strlen(unk), "model.unk_token", &t->unk_id, err))
        return err->code;
    /* single characters (every word's first split) by table, not by hash */
    t->char_id = malloc(TOK_CHAR_IDS * sizeof *t->char_id);
    if (t->char_id == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    for (uint32_t c = 0; c < TOK_CHAR_IDS; c++) {
        char u[4];
        size_t ul = c < 0x80 ? (u[0] = (char)c, 1)
                  : c < 0x800 ? (u[0] = (char)(0xc0 | c >> 6), u[1] = (char)(0x80 | (c & 0x3f)), 2)
                  : (u[0] = (char)(0xe0 | c >> 12), u[1] = (char)(0x80 | ((c >> 6) & 0x3f)),
                     u[2] = (char)(0x80 | (c & 0x3f)), 3);
        t->char_id[c] = c >= 0xd800 && c < 0xe000 ? -1 : tok_strmap_get(&t->vocab, t, u, ul);
    }
    for (int b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", b);
        t->byte_id[b] = tok_strmap_get(&t->vocab, t, s, 6);
    }
    return parse_merges(t, json_object_get(m, "merges"), err);
}

static int parse_added(tok_tokenizer *t, json_t *added, acc_err *err)
{
    if (added == NULL || json_is_null(added))
        return 0;
    if (!json_is_array(added))
        return bad(err, "added_tokens", "must be a list");
    t->nadded = (int)json_array_size(added);
    t->added = calloc((size_t)t->nadded + 1, sizeof *t->added);
    if (t->added == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    static const char *const k[] = {"id", "content", "single_word", "lstrip", "rstrip",
                                    "normalized", "special", NULL};
    for (int i = 0; i < t->nadded; i++) {
        json_t *a = json_array_get(added, (size_t)i);
        tok_added *ad = &t->added[i];
        char path[64];
        snprintf(path, sizeof path, "added_tokens[%d]", i);
        bool single;
        if (check_keys(a, path, k, err) ||
            get_str(a, "content", &ad->s, &ad->len, path, err) ||
            get_bool(a, "single_word", false, &single, path, err) ||
            get_bool(a, "lstrip", false, &ad->lstrip, path, err) ||
            get_bool(a, "rstrip", false, &ad->rstrip, path, err) ||
            get_bool(a, "normalized", false, &ad->normalized, path, err) ||
            get_bool(a, "special", false, &ad->special, path, err))
            return err->code;
        if (single)
            return unsupported(err, path, "single_word added tokens");
        if (ad->len == 0)
            return bad(err, path, "empty content");
        ad->id = (int32_t)json_integer_value(json_object_get(a, "id"));
        t->special[ad->id] = ad->special;
        if (ad->normalized)
            t->nadded_normalized = true;
        else
            t->added_first[(unsigned char)ad->s[0]] = true;
        /* ids outside the model's vocabulary get the added string as their
         * token; for ids inside it, added_at[] points decoding at the added
         * string (the vocabulary map is keyed by tok[] and must keep it) */
        if (!t->in_model[ad->id] && set_token(t, ad->id, ad->s, ad->len) != 0)
            return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    }
    t->added_at = malloc(((size_t)t->ntok + 1) * sizeof *t->added_at);
    if (t->added_at == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    /* longest first, so the first hit at a position is the longest one */
    for (int i = 1; i < t->nadded; i++)
        for (int j = i; j > 0 && t->added[j].len > t->added[j - 1].len; j--) {
            tok_added x = t->added[j];
            t->added[j] = t->added[j - 1];
            t->added[j - 1] = x;
        }
    for (int i = 0; i < t->ntok; i++)
        t->added_at[i] = -1;
    for (int i = 0; i < t->nadded; i++)
        t->added_at[t->added[i].id] = i;
    return 0;
}

/* ---- tokenizer_config.json */
static const char *config_token(json_t *v)
{
    if (json_is_string(v))
        return json_string_value(v);
    if (json_is_object(v) && json_is_string(json_object_get(v, "content")))
        return json_string_value(json_object_get(v, "content"));
    return NULL;
}

static int parse_config(tok_tokenizer *t, json_t *c, acc_err *err)
{
    tok_config *cf = &t->cfg;
    cf->bos_id = cf->eos_id = cf->pad_id = cf->unk_id = -1;
    cf->bos_token = cf->eos_token = "";
    if (c == NULL)
        return 0;
    if (!json_is_object(c))
        return acc_err_set(err, ACC_EINVAL, "tokenizer", "tokenizer_config.json: not an object");
    json_t *ab = json_object_get(c, "add_bos_token"), *ae = json_object_get(c, "add_eos_token");
    cf->add_bos = json_is_true(ab);
    cf->add_eos = json_is_true(ae);
    const char *names[4] = {config_token(json_object_get(c, "bos_token")),
                            config_token(json_object_get(c, "eos_token")),
                            config_token(json_object_get(c, "pad_token")),
                            config_token(json_object_get(c, "unk_token"))};
    int32_t *ids[4] = {&cf->bos_id, &cf->eos_id, &cf->pad_id, &cf->unk_id};
    json_t *tmpl = json_object_get(c, "chat_template");
    const char *tsrc = NULL;
    if (json_is_string(tmpl)) {
        tsrc = json_string_value(tmpl);
    } else if (json_is_array(tmpl)) { /* [{"name": "default", "template": ...}, ...] */
        size_t i;
        json_t *it;
        json_array_foreach(tmpl, i, it) {
            const char *n = json_string_value(json_object_get(it, "name"));
            if (n && strcmp(n, "default") == 0)
                tsrc = json_string_value(json_object_get(it, "template"));
        }
    }
    size_t need = (tsrc ? strlen(tsrc) : 0) + (names[0] ? strlen(names[0]) : 0) +
                  (names[1] ? strlen(names[1]) : 0) + 3;
    t->cfg_strings = malloc(need);
    if (t->cfg_strings == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    char *w = t->cfg_strings;
    if (tsrc) {
        cf->chat_template = w;
        w = stpcpy(w, tsrc) + 1;
    }
    cf->bos_token = w;
    w = stpcpy(w, names[0] ? names[0] : "") + 1;
    cf->eos_token = w;
    stpcpy(w, names[1] ? names[1] : "");
    for (int i = 0; i < 4; i++)
        if (names[i] != NULL)
            *ids[i] = tok_token_to_id(t, names[i], strlen(names[i]));
    return 0;
}

static int load_json(tok_tokenizer *t, json_t *j, json_t *cfg, acc_err *err)
{
    static const char *const k[] = {"version", "truncation", "padding", "added_tokens",
                                    "normalizer", "pre_tokenizer", "post_processor", "decoder",
                                    "model", NULL};
    if (!json_is_object(j))
        return bad(err, "(top level)", "not an object");
    if (check_keys(j, "(top level)", k, err))
        return err->code;
    tok_byte_table_init(&t->bytes);
    json_t *added = json_object_get(j, "added_tokens");
    if (added != NULL && !json_is_array(added))
        return bad(err, "added_tokens", "must be a list");
    if (parse_model(t, json_object_get(j, "model"), added, err) || parse_added(t, added, err))
        return err->code;
    json_t *x;
    if ((x = json_object_get(j, "normalizer")) && !json_is_null(x)) {
        t->norm = calloc(1, sizeof *t->norm);
        if (t->norm == NULL || parse_norm(x, "normalizer", t->norm, err))
            return t->norm ? err->code : acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    }
    if ((x = json_object_get(j, "pre_tokenizer")) && !json_is_null(x)) {
        t->pre = calloc(1, sizeof *t->pre);
        if (t->pre == NULL || parse_pre(t, x, "pre_tokenizer", t->pre, err))
            return t->pre ? err->code : acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    }
    if ((x = json_object_get(j, "decoder")) && !json_is_null(x)) {
        t->dec = calloc(1, sizeof *t->dec);
        if (t->dec == NULL || parse_dec(x, "decoder", t->dec, err))
            return t->dec ? err->code : acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    }
    if ((x = json_object_get(j, "post_processor")) && !json_is_null(x) &&
        parse_post(t, x, "post_processor", &t->post, err))
        return err->code;
    return parse_config(t, cfg, err);
}

static int load_parsed(json_t *j, json_t *cfg, tok_tokenizer **out, acc_err *err)
{
    tok_tokenizer *t = calloc(1, sizeof *t);
    if (t == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    int rc = load_json(t, j, cfg, err);
    if (rc != 0) {
        tok_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

/* Parse both files; `tname` / `cname` name them in messages: a file that
 * is not JSON is reported by line and column, never by jansson's text,
 * which quotes the file's bytes. */
static int load_named(const char *tj, size_t len, const char *tname, const char *cj, size_t clen,
                      const char *cname, tok_tokenizer **out, acc_err *err)
{
    json_error_t je;
    *out = NULL;
    json_t *j = json_loadb(tj, len, JSON_REJECT_DUPLICATES, &je);
    if (j == NULL)
        return acc_err_set(err, ACC_EINVAL, "tokenizer", "%s: not valid JSON (line %d, column %d)", tname,
                           je.line, je.column);
    json_t *c = NULL;
    if (cj != NULL && (c = json_loadb(cj, clen, JSON_DECODE_INT_AS_REAL, &je)) == NULL) {
        json_decref(j);
        return acc_err_set(err, ACC_EINVAL, "tokenizer", "%s: not valid JSON (line %d, column %d)", cname,
                           je.line, je.column);
    }
    int rc = load_parsed(j, c, out, err);
    json_decref(j);
    json_decref(c);
    return rc;
}

int tok_load_mem(const char *tj, size_t len, const char *cj, size_t clen, tok_tokenizer **out,
                 acc_err *err)
{
    return load_named(tj, len, "tokenizer.json", cj, clen, "tokenizer_config.json", out, err);
}

/* DIR/NAME, opened in the directory `dfd` under the roots and read whole;
 * ACC_ENOTFOUND (nothing set) when absent and `optional`. */
static int read_member(const char *roots, int dfd, const char *dir, const char *name, const char *field,
                       int optional, char **text, size_t *len, acc_err *err)
{
    char shown[4096 + 64];
    int fd;
    acc_err e = {0};
    snprintf(shown, sizeof shown, "%s/%s", dir, name);
    int rc = sp_open_in(roots, dfd, dir, name, field, &fd, &e);
    if (rc == ACC_ENOTFOUND && optional)
        return rc;
    if (rc == ACC_ENOTFOUND)
        return acc_err_set(err, ACC_EINVAL, field, "%s: %s is missing (a tokenizer directory holds tokenizer.json)",
                           field, shown);
    if (rc != 0)
        return acc_err_set(err, rc, field, "%s", e.msg);
    rc = fsu_read_fd(fd, shown, text, len, TOK_FILE_MAX, &e);
    close(fd);
    if (rc != 0)
        return acc_err_set(err, rc == ACC_ENOMEM ? rc : ACC_EINVAL, field, "%s: %s", field, e.msg);
    return 0;
}

int tok_files_read(const char *roots, const char *dir, const char *field, tok_files *out, acc_err *err)
{
    memset(out, 0, sizeof *out);
    int dfd;
    int rc = sp_open_dir(roots, dir, field, &dfd, NULL, 0, err);
    if (rc != 0)
        return rc;
    rc = read_member(roots, dfd, dir, "tokenizer.json", field, 0, &out->json, &out->json_len, err);
    if (rc == 0) {
        rc = read_member(roots, dfd, dir, "tokenizer_config.json", field, 1, &out->config, &out->config_len, err);
        if (rc == ACC_ENOTFOUND)
            rc = 0;
    }
    close(dfd);
    if (rc != 0)
        tok_files_free(out);
    return rc;
}

void tok_files_free(tok_files *f)
{
    free(f->json);
    free(f->config);
    memset(f, 0, sizeof *f);
}

int tok_load_files(const tok_files *f, const char *dir, tok_tokenizer **out, acc_err *err)
{
    char a[4096 + 32], b[4096 + 32];
    snprintf(a, sizeof a, "%s/tokenizer.json", dir);
    snprintf(b, sizeof b, "%s/tokenizer_config.json", dir);
    return load_named(f->json, f->json_len, a, f->config, f->config_len, b, out, err);
}

int tok_load_under(const char *roots, const char *dir, const char *field, tok_tokenizer **out, acc_err *err)
{
    tok_files f;
    *out = NULL;
    int rc = tok_files_read(roots, dir, field, &f, err);
    if (rc == 0)
        rc = tok_load_files(&f, dir, out, err);
    tok_files_free(&f);
    return rc;
}

int tok_load_dir(const char *dir, tok_tokenizer **out, acc_err *err)
{
    return tok_load_under("", dir, "tokenizer", out, err);
}

void tok_free(tok_tokenizer *t)
{
    if (t == NULL)
        return;
    for (int i = 0; i < t->ntok; i++)
        free(t->tok[i]);
    free(t->tok);
    free(t->tok_len);
    free(t->in_model);
    free(t->special);
    free(t->added_at);
    free(t->char_id);
    tok_strmap_free(&t->vocab);
    tok_pairmap_free(&t->merges);
    free(t->cont_prefix);
    free(t->eow_suffix);
    if (t->norm) {
        free_norm(t->norm);
        free(t->norm);
    }
    if (t->pre) {
        free_pre(t->pre);
        free(t->pre);
    }
    if (t->dec) {
        free_dec(t->dec);
        free(t->dec);
    }
    free(t->post.pre);
    free(t->post.post);
    for (int i = 0; i < t->nadded; i++)
        free(t->added[i].s);
    free(t->added);
    pcre2_code_free(t->gpt2_re);
    free(t->cfg_strings);
    free(t);
}

/* ---- accessors */
int tok_vocab_size(const tok_tokenizer *t)
{
    return t->ntok;
}

const char *tok_id_to_token(const tok_tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->ntok)
        return NULL;
    if (t->added_at && t->added_at[id] >= 0) {
        *len = t->added[t->added_at[id]].len;
        return t->added[t->added_at[id]].s;
    }
    if (t->tok[id] == NULL)
        return NULL;
    *len = t->tok_len[id];
    return t->tok[id];
}

int32_t tok_token_to_id(const tok_tokenizer *t, const char *s, size_t len)
{
    for (int i = 0; i < t->nadded; i++)
        if (t->added[i].len == len && memcmp(t->added[i].s, s, len) == 0)
            return t->added[i].id;
    return tok_strmap_get(&t->vocab, t, s, len);
}

int tok_is_special(const tok_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->ntok && t->special[id];
}

const tok_config *tok_get_config(const tok_tokenizer *t)
{
    return &t->cfg;
}

/* ---- encoding */
void tok_limits_default(tok_limits *l)
{
    *l = (tok_limits){.time_limit_ms = 2000, .match_limit = 1000000, .depth_limit = 100000, .out_factor = 64,
                      .out_slack = (size_t)1 << 20};
}

void tok_encoder_set_limits(tok_encoder *e, const tok_limits *l)
{
    e->lim = *l;
    pcre2_set_match_limit(e->mctx, l->match_limit ? l->match_limit : UINT32_MAX);
    pcre2_set_depth_limit(e->mctx, l->depth_limit ? l->depth_limit : UINT32_MAX);
    pcre2_set_heap_limit(e->mctx, 64u << 10); /* KiB */
}

int64_t tok_encoder_begin(tok_encoder *e)
{
    int64_t saved = e->deadline_ns;
    if (saved == 0)
        e->deadline_ns = budget_after_ms(e->lim.time_limit_ms);
    return saved;
}

void tok_encoder_end(tok_encoder *e, int64_t saved)
{
    e->deadline_ns = saved;
}

int64_t tok_encoder_deadline(const tok_encoder *e)
{
    return e->deadline_ns;
}

long tok_encoder_time_limit_ms(const tok_encoder *e)
{
    return e->lim.time_limit_ms;
}

int tok_over_time(tok_encoder *e)
{
    if (e->deadline_ns == 0 || ++e->ticks % 64 != 0 || !budget_expired(e->deadline_ns))
        return 0;
    e->stop = TOK_STOP_TIME;
    return ACC_EINVAL;
}

int tok_match(tok_encoder *e, const pcre2_code *re, const char *s, size_t n, size_t at, const char *where)
{
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK, e->md, e->mctx);
    if (rc >= 0)
        return 1;
    if (rc == PCRE2_ERROR_NOMATCH)
        return 0;
    e->stop = TOK_STOP_REGEX;
    e->stop_pcre = rc;
    e->stop_where = where;
    return ACC_EINVAL;
}

int tok_over_output(tok_encoder *e, size_t n)
{
    if (n <= e->out_bound)
        return 0;
    e->stop = TOK_STOP_OUTPUT;
    return ACC_EINVAL;
}

int tok_encoder_new(const tok_tokenizer *t, tok_encoder **out, acc_err *err)
{
    tok_encoder *e = calloc(1, sizeof *e);
    if (e == NULL || (e->md = pcre2_match_data_create(32, NULL)) == NULL ||
        (e->mctx = pcre2_match_context_create(NULL)) == NULL) {
        if (e != NULL)
            pcre2_match_data_free(e->md);
        free(e);
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    }
    e->t = t;
    tok_limits l;
    tok_limits_default(&l);
    tok_encoder_set_limits(e, &l);
    *out = e;
    return 0;
}

void tok_encoder_free(tok_encoder *e)
{
    if (e == NULL)
        return;
    pcre2_match_data_free(e->md);
    pcre2_match_context_free(e->mctx);
    tok_buf_free(&e->nbuf);
    tok_buf_free(&e->tmp);
    tok_pieces_free(&e->pa);
    tok_pieces_free(&e->pb);
    tok_bpe_encoder_free(e);
    free(e);
}

static bool is_ws(const char *s, size_t n, size_t i, size_t *l)
{
    size_t adv;
    uint32_t c = tok_utf8_decode((const unsigned char *)s + i, n - i, &adv);
    *l = adv;
    return c == ' ' || (c >= 9 && c <= 13) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
           c == 0x205f || c == 0x3000;
}

/* The longest added token (of the given normalized class) at s[i], or -1. */
static int added_at_pos(const tok_tokenizer *t, const char *s, size_t n, size_t i, bool normalized)
{
    if (!normalized && !t->added_first[(unsigned char)s[i]])
        return -1;
    for (int k = 0; k < t->nadded; k++) {
        const tok_added *a = &t->added[k];
        if (a->normalized == normalized && a->len <= n - i && a->s[0] == s[i] &&
            memcmp(a->s, s + i, a->len) == 0)
            return k;
    }
    return -1;
}

static int encode_words(tok_encoder *e, const char *s, size_t n, bool at_start, tok_ids *out);

/* Cut s at the added tokens of one class (leftmost-longest, lstrip and
 * rstrip honoured); the added ids go to out, the text between them to
 * encode_words (normalized class) or to encode_segment (raw class). */
static int encode_segment(tok_encoder *e, const char *s, size_t n, bool at_start, tok_ids *out);

static int split_added(tok_encoder *e, const char *s, size_t n, bool at_start, bool normalized,
                       tok_ids *out)
{
    const tok_tokenizer *t = e->t;
    size_t from = 0;
    for (size_t i = 0; i < n;) {
        int k = added_at_pos(t, s, n, i, normalized);
        if (k < 0) {
            if ((i & 4095) == 0 && tok_over_time(e) != 0)
                return ACC_EINVAL;
            i++;
            continue;
        }
        const tok_added *a = &t->added[k];
        size_t start = i, stop = i + a->len, l;
        if (a->lstrip) { /* swallow whitespace before it, back to the previous cut */
            size_t j = start;
            while (j > from) {
                size_t b = j - 1;
                while (b > from && ((unsigned char)s[b] & 0xc0) == 0x80)
                    b--;
                if (!is_ws(s, n, b, &l))
                    break;
                j = b;
            }
            start = j;
        }
        if (a->rstrip)
            while (stop < n && is_ws(s, n, stop, &l))
                stop += l;
        if (start > from) {
            int rc = normalized ? encode_words(e, s + from, start - from, at_start && from == 0, out)
                                : encode_segment(e, s + from, start - from, at_start && from == 0, out);
            if (rc != 0)
                return rc;
        }
        if (tok_ids_push(out, a->id) != 0)
            return ACC_ENOMEM;
        from = i = stop;
    }
    if (from < n)
        return normalized ? encode_words(e, s + from, n - from, at_start && from == 0, out)
                          : encode_segment(e, s + from, n - from, at_start && from == 0, out);
    return 0;
}

/* Pre-tokenize and run the model on normalized text. */
static int encode_words(tok_encoder *e, const char *s, size_t n, bool at_start, tok_ids *out)
{
    const tok_tokenizer *t = e->t;
    tok_pieces *in = &e->pa, *res = &e->pa;
    in->n = 0;
    in->buf.n = 0;
    int rc = tok_pieces_add(in, s, n, at_start);
    if (rc != 0)
        return rc;
    if (t->pre != NULL) {
        if ((rc = tok_pretokenize(e, t->pre, &e->pa, &e->pb)) != 0)
            return rc;
        res = &e->pb;
    }
    for (size_t i = 0; i < res->n; i++)
        if ((rc = tok_over_time(e)) != 0 ||
            (rc = tok_bpe_word(e, res->buf.s + res->p[i].off, res->p[i].len, out)) != 0)
            return rc;
    return 0;
}

/* One piece of raw text between added tokens: normalize, then cut at the
 * normalized added tokens, then words. */
static int encode_segment(tok_encoder *e, const char *s, size_t n, bool at_start, tok_ids *out)
{
    const tok_tokenizer *t = e->t;
    if (t->norm == NULL && !t->nadded_normalized)
        return encode_words(e, s, n, at_start, out);
    tok_buf nb = {0};
    int rc = tok_buf_put(&nb, s, n);
    if (rc == 0 && t->norm != NULL)
        rc = tok_normalize(e, t->norm, &nb);
    if (rc == 0)
        rc = t->nadded_normalized ? split_added(e, nb.s, nb.n, at_start, true, out)
                                  : encode_words(e, nb.s, nb.n, at_start, out);
    tok_buf_free(&nb);
    return rc;
}

/* The error of an encode that stopped (rc): the bound it ran into. */
static int stop_error(const tok_encoder *e, int rc, acc_err *err)
{
    switch (e->stop) {
    case TOK_STOP_TIME:
        return acc_err_set(err, ACC_EINVAL, "tokenizer",
                           "encoding the text exceeds its time limit of %ld ms (render_time_limit_ms)",
                           e->lim.time_limit_ms);
    case TOK_STOP_REGEX: {
        PCRE2_UCHAR msg[160];
        if (pcre2_get_error_message(e->stop_pcre, msg, sizeof msg) < 0)
            snprintf((char *)msg, sizeof msg, "PCRE2 error %d", e->stop_pcre);
        return acc_err_set(err, ACC_EINVAL, "tokenizer",
                           "a %s regex of the tokenizer failed on this text: %s (match limit %u, depth limit %u, "
                           "tokenizer_match_limit)",
                           e->stop_where ? e->stop_where : "", (const char *)msg, e->lim.match_limit,
                           e->lim.depth_limit);
    }
    case TOK_STOP_OUTPUT:
        return acc_err_set(err, ACC_EINVAL, "tokenizer",
                           "the normalizer's output exceeds its bound of %zu bytes (%zu x the input + %zu)",
                           e->out_bound, e->lim.out_factor, e->lim.out_slack);
    default:
        return acc_err_set(err, rc, "", rc == ACC_ENOMEM ? "out of memory" : "tokenizing failed");
    }
}

int tok_encode(tok_encoder *e, const char *text, size_t len, int flags, tok_ids *out,
               acc_err *err)
{
    const tok_tokenizer *t = e->t;
    size_t bad_at = tok_utf8_invalid((const unsigned char *)text, len);
    if (bad_at != len)
        return acc_err_set(err, ACC_EINVAL, "text", "not UTF-8 at byte %zu", bad_at);
    bool post = (flags & TOK_ADD_SPECIAL) && t->post.present;
    for (size_t i = 0; post && i < t->post.npre; i++)
        if (tok_ids_push(out, t->post.pre[i]) != 0)
            return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    e->stop = TOK_STOP_NONE;
    uint64_t bound = acc_sat_add_u64(acc_sat_mul_u64(len, e->lim.out_factor), e->lim.out_slack);
    e->out_bound = e->lim.out_factor == 0 || bound > SIZE_MAX ? SIZE_MAX : (size_t)bound;
    int64_t saved = tok_encoder_begin(e);
    int rc = len ? split_added(e, text, len, true, false, out) : 0;
    tok_encoder_end(e, saved);
    if (rc != 0)
        return stop_error(e, rc, err);
    for (size_t i = 0; post && i < t->post.npost; i++)
        if (tok_ids_push(out, t->post.post[i]) != 0)
            return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    return 0;
}

/* ---- decoding: each decoder maps a list of token strings to another */
static int tokens_add(tok_pieces *l, const char *s, size_t n)
{
    return tok_pieces_add(l, s, n, false);
}

static const char *pc(const tok_pieces *l, size_t i)
{
    return l->buf.s + l->p[i].off;
}

static int is_byte_token(const char *s, size_t n)
{
    static const char hex[] = "0123456789ABCDEF";
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return -1;
    const char *h = memchr(hex, s[3], 16), *l = memchr(hex, s[4], 16);
    return h && l ? (int)((h - hex) * 16 + (l - hex)) : -1;
}

static int dec_one(const tok_tokenizer *t, const tok_dec *d, tok_pieces *in, tok_pieces *out)
{
    int rc = 0;
    tok_buf b = {0};
    switch (d->kind) {
    case TD_BYTELEVEL: /* all tokens to bytes, then one lossy UTF-8 string */
        for (size_t i = 0; i < in->n && rc == 0; i++) {
            const char *s = pc(in, i);
            size_t n = in->p[i].len, adv, k;
            bool all = true;
            for (k = 0; k < n && all; k += adv) {
                uint32_t cp = tok_utf8_decode((const unsigned char *)s + k, n - k, &adv);
                all = cp < 324 && t->bytes.back[cp] >= 0;
            }
            if (!all) {
                rc = tok_buf_put(&b, s, n);
                continue;
            }
            for (k = 0; k < n && rc == 0; k += adv) {
                char c = (char)t->bytes.back[tok_utf8_decode((const unsigned char *)s + k, n - k, &adv)];
                rc = tok_buf_put(&b, &c, 1);
            }
        }
        if (rc == 0) {
            tok_buf u = {0};
            rc = tok_utf8_lossy(&u, (const unsigned char *)b.s, b.n);
            if (rc == 0)
                rc = tokens_add(out, u.s, u.n);
            tok_buf_free(&u);
        }
        break;
    case TD_FUSE:
        for (size_t i = 0; i < in->n && rc == 0; i++)
            rc = tok_buf_put(&b, pc(in, i), in->p[i].len);
        if (rc == 0)
            rc = tokens_add(out, b.s, b.n);
        break;
    case TD_REPLACE:
    case TD_METASPACE:
        for (size_t i = 0; i < in->n && rc == 0; i++) {
            const char *s = pc(in, i);
            size_t n = in->p[i].len;
            b.n = 0;
            rc = tok_buf_put(&b, "", 0);
            for (size_t k = 0; k < n && rc == 0;) {
                if (d->alen <= n - k && memcmp(s + k, d->a, d->alen) == 0) {
                    if (d->kind == TD_REPLACE)
                        rc = tok_buf_put(&b, d->b, d->blen);
                    else if (!(i == 0 && d->prepend_scheme != TPS_NEVER))
                        rc = tok_buf_put(&b, " ", 1); /* the first token loses them all */
                    k += d->alen;
                } else {
                    rc = tok_buf_put(&b, s + k, 1);
                    k++;
                }
            }
            if (rc == 0)
                rc = tokens_add(out, b.s, b.n);
        }
        break;
    case TD_BYTEFALLBACK: {
        /* runs of <0xXX> tokens become their UTF-8 string, or one U+FFFD per
         * byte when they are not valid UTF-8 */
        size_t i = 0;
        while (i < in->n && rc == 0) {
            if (is_byte_token(pc(in, i), in->p[i].len) < 0) {
                rc = tokens_add(out, pc(in, i), in->p[i].len);
                i++;
                continue;
            }
            b.n = 0;
            size_t j = i;
            for (; j < in->n; j++) {
                int v = is_byte_token(pc(in, j), in->p[j].len);
                if (v < 0)
                    break;
                char c = (char)v;
                if ((rc = tok_buf_put(&b, &c, 1)) != 0)
                    break;
            }
            if (rc == 0 && tok_utf8_invalid((const unsigned char *)b.s, b.n) == b.n)
                rc = tokens_add(out, b.s, b.n);
            else
                for (size_t k = i; k < j && rc == 0; k++)
                    rc = tokens_add(out, "\xef\xbf\xbd", 3);
            i = j;
        }
        break;
    }
    case TD_STRIP:
        for (size_t i = 0; i < in->n && rc == 0; i++) {
            const char *s = pc(in, i);
            size_t a = 0, z = in->p[i].len;
            for (int k = 0; k < d->start && z - a >= d->alen && memcmp(s + a, d->a, d->alen) == 0; k++)
                a += d->alen;
            for (int k = 0; k < d->stop && z - a >= d->alen && memcmp(s + z - d->alen, d->a, d->alen) == 0; k++)
                z -= d->alen;
            rc = tokens_add(out, s + a, z - a);
        }
        break;
    case TD_SEQUENCE:
        break;
    }
    tok_buf_free(&b);
    return rc;
}

static int decode_chain(const tok_tokenizer *t, const tok_dec *d, tok_pieces *a, tok_pieces *b)
{
    if (d->kind != TD_SEQUENCE) {
        b->n = 0;
        b->buf.n = 0;
        int rc = dec_one(t, d, a, b);
        tok_pieces x = *a;
        *a = *b;
        *b = x;
        return rc;
    }
    for (int i = 0; i < d->nsub; i++) {
        int rc = decode_chain(t, &d->sub[i], a, b);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int tok_decode(const tok_tokenizer *t, const int32_t *ids, size_t n, int skip_special, char **out,
               size_t *len, acc_err *err)
{
    tok_pieces a = {0}, b = {0};
    tok_buf r = {0};
    int rc = tok_buf_put(&r, "", 0);
    for (size_t i = 0; i < n && rc == 0; i++) {
        size_t l;
        const char *s = tok_id_to_token(t, ids[i], &l);
        if (s == NULL) {
            rc = acc_err_set(err, ACC_EINVAL, "ids", "token id %d is not in the vocabulary",
                             (int)ids[i]);
            goto done;
        }
        if (skip_special && t->special[ids[i]])
            continue;
        rc = tokens_add(&a, s, l);
    }
    if (rc == 0 && t->dec != NULL)
        rc = decode_chain(t, t->dec, &a, &b);
    for (size_t i = 0; i < a.n && rc == 0; i++) {
        if (t->dec == NULL && i > 0)
            rc = tok_buf_put(&r, " ", 1);
        if (rc == 0)
            rc = tok_buf_put(&r, pc(&a, i), a.p[i].len);
    }
    if (rc != 0) {
        rc = acc_err_set(err, ACC_ENOMEM, "", "out of memory");
        goto done;
    }
    *out = r.s;
    *len = r.n;
    r.s = NULL;
done:
    tok_pieces_free(&a);
    tok_pieces_free(&b);
    tok_buf_free(&r);
    return rc;
}
