/* jinja_eval: rendering a parsed template (jinja.h): values with Python's
 * semantics, scopes, filters, tests and the string / dict methods chat
 * templates call. Everything of one render lives in its arena.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jinja_internal.h"

typedef struct scope {
    struct scope *parent;
    const char **names;
    jj_val *vals;
    int n, cap;
} scope;

typedef struct buf {
    char *s;
    size_t n, cap;
} buf;

typedef struct render {
    jj_arena *a;
    buf *out;
    size_t max_output;
    long steps, max_steps;
    int depth, max_depth;
    int mdepth; /* macro calls */
    int ctl; /* 1 break, 2 continue */
    jinja_span *gen;
    size_t ngen, gencap;
    const jj_node *at; /* the node evaluated, for error positions */
} render;

#define FAIL(r, n, ...) jj_fail((r)->a, (n)->line, (n)->col, __VA_ARGS__)

static const jj_val UNDEF = {.t = JV_UNDEF};
static const jj_val NONE = {.t = JV_NONE};

static jj_val mk_bool(int b) { jj_val v = {.t = JV_BOOL}; v.u.b = !!b; return v; }
static jj_val mk_int(int64_t i) { jj_val v = {.t = JV_INT}; v.u.i = i; return v; }
static jj_val mk_float(double f) { jj_val v = {.t = JV_FLOAT}; v.u.f = f; return v; }
static jj_val mk_str(const char *s, size_t n) { jj_val v = {.t = JV_STR}; v.u.s.s = s; v.u.s.n = n; return v; }

/* ---- buffers -------------------------------------------------------- */

static void buf_add(render *r, buf *b, const char *s, size_t n)
{
    if (b == r->out && (n > r->max_output || b->n > r->max_output - n))
        jj_fail(r->a, r->at ? r->at->line : 0, r->at ? r->at->col : 0,
                "output exceeds its bound of %zu bytes", r->max_output);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *s2 = jj_alloc(r->a, cap);
        if (b->n)
            memcpy(s2, b->s, b->n);
        b->s = s2;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void buf_cstr(render *r, buf *b, const char *s) { buf_add(r, b, s, strlen(s)); }

static jj_val buf_val(buf *b) { return b->n ? mk_str(b->s, b->n) : mk_str("", 0); }

/* ---- lists and dicts ------------------------------------------------ */

static jj_list *list_new(render *r, size_t cap)
{
    jj_list *l = jj_alloc(r->a, sizeof(*l));
    l->n = 0;
    l->cap = cap ? cap : 4;
    l->v = jj_alloc(r->a, l->cap * sizeof(jj_val));
    return l;
}

static void list_push(render *r, jj_list *l, jj_val v)
{
    if (l->n == l->cap) {
        jj_val *nv = jj_alloc(r->a, l->cap * 2 * sizeof(jj_val));
        memcpy(nv, l->v, l->n * sizeof(jj_val));
        l->v = nv;
        l->cap *= 2;
    }
    l->v[l->n++] = v;
}

static jj_val mk_list(jj_list *l) { jj_val v = {.t = JV_LIST}; v.u.l = l; return v; }

static jj_dict *dict_new(render *r)
{
    jj_dict *d = jj_alloc(r->a, sizeof(*d));
    d->n = 0;
    d->cap = 4;
    d->k = jj_alloc(r->a, 4 * sizeof(jj_val));
    d->v = jj_alloc(r->a, 4 * sizeof(jj_val));
    return d;
}

static int val_eq(const jj_val *a, const jj_val *b);

static jj_val *dict_find(jj_dict *d, const jj_val *k)
{
    for (size_t i = 0; i < d->n; i++)
        if (val_eq(&d->k[i], k))
            return &d->v[i];
    return NULL;
}

static jj_val *dict_find_s(jj_dict *d, const char *s)
{
    jj_val k = mk_str(s, strlen(s));
    return dict_find(d, &k);
}

static void dict_set(render *r, jj_dict *d, jj_val k, jj_val v)
{
    jj_val *p = dict_find(d, &k);
    if (p) {
        *p = v;
        return;
    }
    if (d->n == d->cap) {
        jj_val *nk = jj_alloc(r->a, d->cap * 2 * sizeof(jj_val));
        jj_val *nv = jj_alloc(r->a, d->cap * 2 * sizeof(jj_val));
        memcpy(nk, d->k, d->n * sizeof(jj_val));
        memcpy(nv, d->v, d->n * sizeof(jj_val));
        d->k = nk;
        d->v = nv;
        d->cap *= 2;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
}

static void dict_set_s(render *r, jj_dict *d, const char *k, jj_val v)
{
    dict_set(r, d, mk_str(k, strlen(k)), v);
}

static jj_val mk_dict(jj_dict *d) { jj_val v = {.t = JV_DICT}; v.u.d = d; return v; }

/* ---- UTF-8 ---------------------------------------------------------- */

static size_t u8_next(const char *s, size_t n, size_t i, uint32_t *cp)
{
    unsigned char c = (unsigned char)s[i];
    size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (i + len > n)
        len = n - i;
    uint32_t v = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    for (size_t k = 1; k < len; k++)
        v = (v << 6) | ((unsigned char)s[i + k] & 0x3F);
    *cp = v;
    return len;
}

static size_t u8_count(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80)
            c++;
    return c;
}

/* Byte offset of each code point, plus the end (n + 1 entries). */
static size_t *u8_offsets(render *r, const char *s, size_t n, size_t *count)
{
    size_t c = u8_count(s, n);
    size_t *o = jj_alloc(r->a, (c + 1) * sizeof(size_t));
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80)
            o[k++] = i;
    o[c] = n;
    *count = c;
    return o;
}

/* Python's str.isspace() code points. */
static int py_space(uint32_t c)
{
    return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

/* ---- printing as Python does ---------------------------------------- */

static void fmt_float(char *o, size_t cap, double f)
{
    if (isnan(f)) {
        snprintf(o, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(o, cap, f < 0 ? "-inf" : "inf");
        return;
    }
    char e[64];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(e, sizeof(e), "%.*e", prec - 1, f);
        if (strtod(e, NULL) == f)
            break;
    }
    /* e = [-]d.ddde[+-]XX: digits and exponent, formatted as repr() does */
    char digits[32];
    int nd = 0, neg = e[0] == '-';
    const char *p = e + neg;
    for (; *p && *p != 'e'; p++)
        if (*p != '.')
            digits[nd++] = *p;
    digits[nd] = 0;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        digits[--nd] = 0;
    size_t k = 0;
    if (neg)
        o[k++] = '-';
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            k += (size_t)snprintf(o + k, cap - k, "0.");
            for (int i = 0; i < -exp - 1; i++)
                o[k++] = '0';
            k += (size_t)snprintf(o + k, cap - k, "%s", digits);
        } else {
            for (int i = 0; i <= exp || i < nd; i++) {
                if (i == exp + 1)
                    o[k++] = '.';
                o[k++] = i < nd ? digits[i] : '0';
            }
            if (nd <= exp + 1) {
                o[k++] = '.';
                o[k++] = '0';
            }
        }
        o[k] = 0;
    } else {
        o[k++] = digits[0];
        if (nd > 1) {
            o[k++] = '.';
            memcpy(o + k, digits + 1, (size_t)nd - 1);
            k += (size_t)nd - 1;
        }
        snprintf(o + k, cap - k, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
}

static void repr(render *r, buf *b, const jj_val *v);

/* str(v) as Python prints it ({{ v }}) */
static void to_str(render *r, buf *b, const jj_val *v)
{
    char tmp[64];
    switch (v->t) {
    case JV_UNDEF: break;
    case JV_NONE: buf_cstr(r, b, "None"); break;
    case JV_BOOL: buf_cstr(r, b, v->u.b ? "True" : "False"); break;
    case JV_INT: snprintf(tmp, sizeof(tmp), "%lld", (long long)v->u.i); buf_cstr(r, b, tmp); break;
    case JV_FLOAT: fmt_float(tmp, sizeof(tmp), v->u.f); buf_cstr(r, b, tmp); break;
    case JV_STR: buf_add(r, b, v->u.s.s, v->u.s.n); break;
    case JV_NS: buf_cstr(r, b, "<Namespace>"); break;
    case JV_MACRO: case JV_FUNC: case JV_METHOD:
        FAIL(r, r->at, "printing a function is not supported");
    default: repr(r, b, v); break;
    }
}

static void repr_str(render *r, buf *b, const char *s, size_t n)
{
    int sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    buf_add(r, b, &q, 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char tmp[8];
        if (c == '\\') buf_cstr(r, b, "\\\\");
        else if (c == (unsigned char)q) { tmp[0] = '\\'; tmp[1] = (char)q; buf_add(r, b, tmp, 2); }
        else if (c == '\n') buf_cstr(r, b, "\\n");
        else if (c == '\r') buf_cstr(r, b, "\\r");
        else if (c == '\t') buf_cstr(r, b, "\\t");
        else if (c < 0x20 || c == 0x7F) { snprintf(tmp, sizeof(tmp), "\\x%02x", c); buf_cstr(r, b, tmp); }
        else buf_add(r, b, (const char *)&c, 1);
    }
    buf_add(r, b, &q, 1);
}

static void repr(render *r, buf *b, const jj_val *v)
{
    if (++r->depth > r->max_depth)
        FAIL(r, r->at, "value nested too deeply to print");
    switch (v->t) {
    case JV_STR: repr_str(r, b, v->u.s.s, v->u.s.n); break;
    case JV_LIST:
        buf_cstr(r, b, v->tuple ? "(" : "[");
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i)
                buf_cstr(r, b, ", ");
            repr(r, b, &v->u.l->v[i]);
        }
        if (v->tuple && v->u.l->n == 1)
            buf_cstr(r, b, ",");
        buf_cstr(r, b, v->tuple ? ")" : "]");
        break;
    case JV_DICT:
        buf_cstr(r, b, "{");
        for (size_t i = 0; i < v->u.d->n; i++) {
            if (i)
                buf_cstr(r, b, ", ");
            repr(r, b, &v->u.d->k[i]);
            buf_cstr(r, b, ": ");
            repr(r, b, &v->u.d->v[i]);
        }
        buf_cstr(r, b, "}");
        break;
    case JV_UNDEF: buf_cstr(r, b, "Undefined"); break;
    default: to_str(r, b, v); break;
    }
    r->depth--;
}

static jj_val str_of(render *r, const jj_val *v)
{
    if (v->t == JV_STR)
        return *v;
    buf b = {0};
    to_str(r, &b, v);
    return buf_val(&b);
}

/* ---- JSON as transformers' tojson (json.dumps, ensure_ascii=False) --- */

typedef struct json_opts {
    int indent; /* -1: none */
    const char *item_sep, *key_sep;
    int sort_keys;
} json_opts;

static int val_lt(render *r, const jj_val *a, const jj_val *b);

static void json_str(render *r, buf *b, const char *s, size_t n)
{
    buf_cstr(r, b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char tmp[8];
        if (c == '"') buf_cstr(r, b, "\\\"");
        else if (c == '\\') buf_cstr(r, b, "\\\\");
        else if (c == '\n') buf_cstr(r, b, "\\n");
        else if (c == '\r') buf_cstr(r, b, "\\r");
        else if (c == '\t') buf_cstr(r, b, "\\t");
        else if (c == '\b') buf_cstr(r, b, "\\b");
        else if (c == '\f') buf_cstr(r, b, "\\f");
        else if (c < 0x20) { snprintf(tmp, sizeof(tmp), "\\u%04x", c); buf_cstr(r, b, tmp); }
        else buf_add(r, b, (const char *)&c, 1);
    }
    buf_cstr(r, b, "\"");
}

static void json_nl(render *r, buf *b, const json_opts *o, int level)
{
    buf_cstr(r, b, "\n");
    for (int i = 0; i < level * o->indent; i++)
        buf_cstr(r, b, " ");
}

static void to_json(render *r, buf *b, const jj_val *v, const json_opts *o, int level)
{
    char tmp[64];
    if (++r->depth > r->max_depth)
        FAIL(r, r->at, "value nested too deeply for tojson");
    switch (v->t) {
    case JV_NONE: buf_cstr(r, b, "null"); break;
    case JV_BOOL: buf_cstr(r, b, v->u.b ? "true" : "false"); break;
    case JV_INT: snprintf(tmp, sizeof(tmp), "%lld", (long long)v->u.i); buf_cstr(r, b, tmp); break;
    case JV_FLOAT:
        if (isnan(v->u.f)) buf_cstr(r, b, "NaN");
        else if (isinf(v->u.f)) buf_cstr(r, b, v->u.f < 0 ? "-Infinity" : "Infinity");
        else { fmt_float(tmp, sizeof(tmp), v->u.f); buf_cstr(r, b, tmp); }
        break;
    case JV_STR: json_str(r, b, v->u.s.s, v->u.s.n); break;
    case JV_LIST:
        if (!v->u.l->n) { buf_cstr(r, b, "[]"); break; }
        buf_cstr(r, b, "[");
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i)
                buf_cstr(r, b, o->item_sep);
            if (o->indent >= 0)
                json_nl(r, b, o, level + 1);
            to_json(r, b, &v->u.l->v[i], o, level + 1);
        }
        if (o->indent >= 0)
            json_nl(r, b, o, level);
        buf_cstr(r, b, "]");
        break;
    case JV_DICT: {
        jj_dict *d = v->u.d;
        if (!d->n) { buf_cstr(r, b, "{}"); break; }
        size_t *ord = jj_alloc(r->a, d->n * sizeof(size_t));
        for (size_t i = 0; i < d->n; i++) {
            ord[i] = i;
            if (d->k[i].t != JV_STR)
                FAIL(r, r->at, "tojson of a mapping with a key that is not a string is not supported");
        }
        if (o->sort_keys) /* insertion sort: stable, small dicts */
            for (size_t i = 1; i < d->n; i++)
                for (size_t j = i; j > 0 && val_lt(r, &d->k[ord[j]], &d->k[ord[j - 1]]); j--) {
                    size_t t = ord[j]; ord[j] = ord[j - 1]; ord[j - 1] = t;
                }
        buf_cstr(r, b, "{");
        for (size_t i = 0; i < d->n; i++) {
            if (i)
                buf_cstr(r, b, o->item_sep);
            if (o->indent >= 0)
                json_nl(r, b, o, level + 1);
            to_json(r, b, &d->k[ord[i]], o, level + 1);
            buf_cstr(r, b, o->key_sep);
            to_json(r, b, &d->v[ord[i]], o, level + 1);
        }
        if (o->indent >= 0)
            json_nl(r, b, o, level);
        buf_cstr(r, b, "}");
        break;
    }
    case JV_UNDEF: FAIL(r, r->at, "tojson of an undefined value");
    default: FAIL(r, r->at, "tojson of a function or namespace is not supported");
    }
    r->depth--;
}

/* ---- truth, equality, order ----------------------------------------- */

static int truthy(const jj_val *v)
{
    switch (v->t) {
    case JV_UNDEF: case JV_NONE: return 0;
    case JV_BOOL: return v->u.b;
    case JV_INT: return v->u.i != 0;
    case JV_FLOAT: return v->u.f != 0;
    case JV_STR: return v->u.s.n != 0;
    case JV_LIST: return v->u.l->n != 0;
    case JV_DICT: return v->u.d->n != 0;
    default: return 1;
    }
}

static int is_num(const jj_val *v) { return v->t == JV_INT || v->t == JV_FLOAT || v->t == JV_BOOL; }
static double num(const jj_val *v) { return v->t == JV_FLOAT ? v->u.f : v->t == JV_INT ? (double)v->u.i : v->u.b; }
static int64_t inum(const jj_val *v) { return v->t == JV_INT ? v->u.i : v->u.b; }

static int val_eq(const jj_val *a, const jj_val *b)
{
    if (is_num(a) && is_num(b)) {
        if (a->t != JV_FLOAT && b->t != JV_FLOAT)
            return inum(a) == inum(b);
        return num(a) == num(b);
    }
    if (a->t != b->t)
        return 0;
    switch (a->t) {
    case JV_UNDEF: case JV_NONE: return 1;
    case JV_STR: return a->u.s.n == b->u.s.n && memcmp(a->u.s.s, b->u.s.s, a->u.s.n) == 0;
    case JV_LIST:
        if (a->u.l->n != b->u.l->n || a->tuple != b->tuple)
            return 0;
        for (size_t i = 0; i < a->u.l->n; i++)
            if (!val_eq(&a->u.l->v[i], &b->u.l->v[i]))
                return 0;
        return 1;
    case JV_DICT:
        if (a->u.d->n != b->u.d->n)
            return 0;
        for (size_t i = 0; i < a->u.d->n; i++) {
            jj_val *o = dict_find(b->u.d, &a->u.d->k[i]);
            if (!o || !val_eq(o, &a->u.d->v[i]))
                return 0;
        }
        return 1;
    default: return a == b || memcmp(&a->u, &b->u, sizeof(a->u)) == 0;
    }
}

static int cmp_str(const jj_val *a, const jj_val *b)
{
    size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
    int c = memcmp(a->u.s.s, b->u.s.s, n);
    if (c)
        return c;
    return a->u.s.n < b->u.s.n ? -1 : a->u.s.n > b->u.s.n;
}

/* a < b with Python's rules (numbers, strings, lists); other types refused */
static int val_lt(render *r, const jj_val *a, const jj_val *b)
{
    if (is_num(a) && is_num(b)) {
        if (a->t != JV_FLOAT && b->t != JV_FLOAT)
            return inum(a) < inum(b);
        return num(a) < num(b);
    }
    if (a->t == JV_STR && b->t == JV_STR)
        return cmp_str(a, b) < 0;
    if (a->t == JV_LIST && b->t == JV_LIST) {
        for (size_t i = 0; i < a->u.l->n && i < b->u.l->n; i++) {
            if (!val_eq(&a->u.l->v[i], &b->u.l->v[i]))
                return val_lt(r, &a->u.l->v[i], &b->u.l->v[i]);
        }
        return a->u.l->n < b->u.l->n;
    }
    FAIL(r, r->at, "'<' between these types is not supported");
}

static const char *type_name(const jj_val *v)
{
    static const char *const n[] = {"undefined", "None", "bool", "int", "float", "str", "list",
                                    "dict", "namespace", "macro", "function", "method"};
    return v->t == JV_LIST && v->tuple ? "tuple" : n[v->t];
}

/* ---- scopes --------------------------------------------------------- */

static scope *scope_new(render *r, scope *parent)
{
    scope *s = jj_alloc(r->a, sizeof(*s));
    memset(s, 0, sizeof(*s));
    s->parent = parent;
    return s;
}

static void scope_set(render *r, scope *s, const char *name, jj_val v)
{
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->names[i], name)) {
            s->vals[i] = v;
            return;
        }
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 8;
        const char **nn = jj_alloc(r->a, (size_t)cap * sizeof(*nn));
        jj_val *nv = jj_alloc(r->a, (size_t)cap * sizeof(*nv));
        if (s->n) {
            memcpy(nn, s->names, (size_t)s->n * sizeof(*nn));
            memcpy(nv, s->vals, (size_t)s->n * sizeof(*nv));
        }
        s->names = nn;
        s->vals = nv;
        s->cap = cap;
    }
    s->names[s->n] = name;
    s->vals[s->n++] = v;
}

static const char *const builtin_funcs[] = {"namespace", "raise_exception", "strftime_now", "range",
                                            "dict", NULL};

static jj_val scope_get(scope *s, const char *name)
{
    for (; s; s = s->parent)
        for (int i = s->n - 1; i >= 0; i--)
            if (!strcmp(s->names[i], name))
                return s->vals[i];
    for (int i = 0; builtin_funcs[i]; i++)
        if (!strcmp(builtin_funcs[i], name)) {
            jj_val v = {.t = JV_FUNC};
            v.u.s.s = builtin_funcs[i];
            return v;
        }
    return UNDEF;
}

/* ---- evaluation ----------------------------------------------------- */

static jj_val eval(render *r, scope *s, const jj_node *n);
static void exec_body(render *r, scope *s, const jj_node *body, buf *b);

static void step(render *r, const jj_node *n)
{
    if (++r->steps > r->max_steps)
        FAIL(r, n, "template exceeds its bound of %ld loop iterations and calls", r->max_steps);
}

typedef struct args {
    jj_val *pos;
    int npos;
    const char **kwn;
    jj_val *kw;
    int nkw;
} args;

static args eval_args(render *r, scope *s, const jj_node *n)
{
    args a = {0};
    a.npos = n->nkids;
    a.nkw = n->nkids2;
    a.pos = jj_alloc(r->a, (size_t)(a.npos + 1) * sizeof(jj_val));
    a.kw = jj_alloc(r->a, (size_t)(a.nkw + 1) * sizeof(jj_val));
    a.kwn = n->names;
    for (int i = 0; i < a.npos; i++)
        a.pos[i] = eval(r, s, n->kids[i]);
    for (int i = 0; i < a.nkw; i++)
        a.kw[i] = eval(r, s, n->kids2[i]);
    return a;
}

/* Argument `i` by position or keyword `name`; NULL when absent. Every
 * keyword must be one of `allowed` (NULL-terminated). */
static const jj_val *arg(const args *a, int i, const char *name)
{
    if (i >= 0 && i < a->npos)
        return &a->pos[i];
    for (int k = 0; k < a->nkw; k++)
        if (name && !strcmp(a->kwn[k], name))
            return &a->kw[k];
    return NULL;
}

static void check_args(render *r, const jj_node *n, const args *a, int maxpos, const char *const *kw,
                       const char *what)
{
    if (a->npos > maxpos)
        FAIL(r, n, "%s takes at most %d positional arguments, got %d", what, maxpos, a->npos);
    for (int k = 0; k < a->nkw; k++) {
        int ok = 0;
        for (int j = 0; kw && kw[j]; j++)
            if (!strcmp(kw[j], a->kwn[k]))
                ok = 1;
        if (!ok)
            FAIL(r, n, "%s has no argument '%s'", what, a->kwn[k]);
    }
}

static const char *want_str(render *r, const jj_node *n, const jj_val *v, const char *what, size_t *len)
{
    if (v->t != JV_STR)
        FAIL(r, n, "%s needs a string, got %s", what, type_name(v));
    *len = v->u.s.n;
    return v->u.s.s;
}

static jj_val getitem(render *r, const jj_node *n, const jj_val *obj, const jj_val *key);
static jj_val method(render *r, const jj_node *n, const jj_val *self, const char *name);

/* obj.name: Python's getattr first (methods, namespace attributes), then
 * obj['name'], as Jinja2 does. */
static jj_val getattr_(render *r, const jj_node *n, const jj_val *obj, const char *name)
{
    if (obj->t == JV_UNDEF)
        FAIL(r, n, "'%s' of an undefined value", name);
    if (obj->t == JV_NS) {
        jj_val *p = dict_find_s(obj->u.d, name);
        return p ? *p : UNDEF;
    }
    jj_val m = method(r, n, obj, name);
    if (m.t != JV_UNDEF)
        return m;
    if (obj->t == JV_DICT) {
        jj_val *p = dict_find_s(obj->u.d, name);
        return p ? *p : UNDEF;
    }
    return UNDEF;
}

static int64_t norm_index(int64_t i, size_t n, int *ok)
{
    if (i < 0)
        i += (int64_t)n;
    *ok = i >= 0 && (uint64_t)i < n;
    return i;
}

static jj_val getitem(render *r, const jj_node *n, const jj_val *obj, const jj_val *key)
{
    int ok;
    switch (obj->t) {
    case JV_UNDEF: FAIL(r, n, "subscript of an undefined value");
    case JV_DICT: {
        jj_val *p = dict_find(obj->u.d, key);
        if (p)
            return *p;
        if (key->t == JV_STR) {
            char *k = jj_strndup(r->a, key->u.s.s, key->u.s.n);
            return getattr_(r, n, obj, k);
        }
        return UNDEF;
    }
    case JV_NS:
        if (key->t == JV_STR) {
            jj_val *p = dict_find(obj->u.d, key);
            return p ? *p : UNDEF;
        }
        return UNDEF;
    case JV_LIST:
        if (key->t == JV_INT || key->t == JV_BOOL) {
            int64_t i = norm_index(inum(key), obj->u.l->n, &ok);
            return ok ? obj->u.l->v[i] : UNDEF;
        }
        if (key->t == JV_STR)
            return getattr_(r, n, obj, jj_strndup(r->a, key->u.s.s, key->u.s.n));
        FAIL(r, n, "list indices must be integers, got %s", type_name(key));
    case JV_STR:
        if (key->t == JV_INT || key->t == JV_BOOL) {
            size_t c;
            size_t *off = u8_offsets(r, obj->u.s.s, obj->u.s.n, &c);
            int64_t i = norm_index(inum(key), c, &ok);
            return ok ? mk_str(obj->u.s.s + off[i], off[i + 1] - off[i]) : UNDEF;
        }
        if (key->t == JV_STR)
            return getattr_(r, n, obj, jj_strndup(r->a, key->u.s.s, key->u.s.n));
        FAIL(r, n, "string indices must be integers, got %s", type_name(key));
    default:
        return UNDEF;
    }
}

/* Python slice indices for length n (step != 0). */
static void slice_idx(int64_t n, const jj_val *a, const jj_val *b, int64_t step, int64_t *start, int64_t *stop)
{
    int64_t lo = step > 0 ? 0 : -1, hi = step > 0 ? n : n - 1;
    if (!a || a->t == JV_NONE) {
        *start = step > 0 ? lo : hi;
    } else {
        int64_t v = inum(a);
        if (v < 0) { v += n; if (v < lo) v = lo; }
        else if (v > hi) v = hi;
        *start = v;
    }
    if (!b || b->t == JV_NONE) {
        *stop = step > 0 ? hi : lo;
    } else {
        int64_t v = inum(b);
        if (v < 0) { v += n; if (v < lo) v = lo; }
        else if (v > hi) v = hi;
        *stop = v;
    }
}

static jj_val do_slice(render *r, const jj_node *n, const jj_val *obj, const jj_val *a, const jj_val *b,
                       const jj_val *c)
{
    const jj_val *chk[3] = {a, b, c};
    for (int i = 0; i < 3; i++)
        if (chk[i] && chk[i]->t != JV_NONE && chk[i]->t != JV_INT && chk[i]->t != JV_BOOL)
            FAIL(r, n, "slice indices must be integers or None");
    int64_t st = c && c->t != JV_NONE ? inum(c) : 1;
    if (st == 0)
        FAIL(r, n, "slice step cannot be zero");
    int64_t len;
    size_t *off = NULL;
    if (obj->t == JV_LIST) {
        len = (int64_t)obj->u.l->n;
    } else if (obj->t == JV_STR) {
        size_t cnt;
        off = u8_offsets(r, obj->u.s.s, obj->u.s.n, &cnt);
        len = (int64_t)cnt;
    } else {
        FAIL(r, n, "slicing a %s is not supported", type_name(obj));
    }
    int64_t start, stop;
    slice_idx(len, a, b, st, &start, &stop);
    jj_list *l = obj->t == JV_LIST ? list_new(r, 0) : NULL;
    buf sb = {0};
    for (int64_t i = start; st > 0 ? i < stop : i > stop; i += st) {
        if (l)
            list_push(r, l, obj->u.l->v[i]);
        else
            buf_add(r, &sb, obj->u.s.s + off[i], off[i + 1] - off[i]);
    }
    if (l) {
        jj_val v = mk_list(l);
        v.tuple = obj->tuple;
        return v;
    }
    return buf_val(&sb);
}

static int contains(render *r, const jj_node *n, const jj_val *item, const jj_val *coll)
{
    switch (coll->t) {
    case JV_STR:
        if (item->t != JV_STR)
            FAIL(r, n, "'in <string>' requires a string as left operand, not %s", type_name(item));
        if (item->u.s.n == 0)
            return 1;
        for (size_t i = 0; i + item->u.s.n <= coll->u.s.n; i++)
            if (memcmp(coll->u.s.s + i, item->u.s.s, item->u.s.n) == 0)
                return 1;
        return 0;
    case JV_LIST:
        for (size_t i = 0; i < coll->u.l->n; i++)
            if (val_eq(&coll->u.l->v[i], item))
                return 1;
        return 0;
    case JV_DICT: case JV_NS: return dict_find(coll->u.d, item) != NULL;
    case JV_UNDEF: FAIL(r, n, "'in' an undefined value");
    default: FAIL(r, n, "'in' a %s is not supported", type_name(coll));
    }
}

static jj_val arith(render *r, const jj_node *n, int op, const jj_val *a, const jj_val *b)
{
    if (op == '~') {
        buf sb = {0};
        to_str(r, &sb, a);
        to_str(r, &sb, b);
        return buf_val(&sb);
    }
    if (a->t == JV_UNDEF || b->t == JV_UNDEF)
        FAIL(r, n, "operator '%s' on an undefined value",
             op == 'F' ? "//" : op == 'P' ? "**" : (char[]){(char)op, 0});
    if (op == '+' && a->t == JV_STR && b->t == JV_STR) {
        buf sb = {0};
        buf_add(r, &sb, a->u.s.s, a->u.s.n);
        buf_add(r, &sb, b->u.s.s, b->u.s.n);
        return buf_val(&sb);
    }
    if (op == '+' && a->t == JV_LIST && b->t == JV_LIST) {
        jj_list *l = list_new(r, a->u.l->n + b->u.l->n);
        for (size_t i = 0; i < a->u.l->n; i++) list_push(r, l, a->u.l->v[i]);
        for (size_t i = 0; i < b->u.l->n; i++) list_push(r, l, b->u.l->v[i]);
        return mk_list(l);
    }
    if (op == '*' && ((a->t == JV_STR && (b->t == JV_INT || b->t == JV_BOOL)) ||
                      (b->t == JV_STR && (a->t == JV_INT || a->t == JV_BOOL)))) {
        const jj_val *s = a->t == JV_STR ? a : b;
        int64_t k = a->t == JV_STR ? inum(b) : inum(a);
        buf sb = {0};
        if (k > 0 && s->u.s.n && (uint64_t)k > r->max_output / s->u.s.n)
            FAIL(r, n, "string repetition exceeds the output bound");
        for (int64_t i = 0; i < k; i++)
            buf_add(r, &sb, s->u.s.s, s->u.s.n);
        return buf_val(&sb);
    }
    if (!is_num(a) || !is_num(b))
        FAIL(r, n, "unsupported operand types for '%s': %s and %s",
             op == 'F' ? "//" : op == 'P' ? "**" : (char[]){(char)op, 0}, type_name(a), type_name(b));
    int fl = a->t == JV_FLOAT || b->t == JV_FLOAT;
    if (op == '/') {
        if (num(b) == 0)
            FAIL(r, n, "division by zero");
        return mk_float(num(a) / num(b));
    }
    if (fl) {
        double x = num(a), y = num(b);
        switch (op) {
        case '+': return mk_float(x + y);
        case '-': return mk_float(x - y);
        case '*': return mk_float(x * y);
        case 'P': return mk_float(pow(x, y));
        case 'F': case '%':
            if (y == 0)
                FAIL(r, n, "division by zero");
            if (op == 'F')
                return mk_float(floor(x / y));
            {
                double m = fmod(x, y);
                if (m != 0 && ((m < 0) != (y < 0)))
                    m += y;
                return mk_float(m);
            }
        }
    }
    int64_t x = inum(a), y = inum(b), z;
    switch (op) {
    case '+': if (__builtin_add_overflow(x, y, &z)) goto ovf; return mk_int(z);
    case '-': if (__builtin_sub_overflow(x, y, &z)) goto ovf; return mk_int(z);
    case '*': if (__builtin_mul_overflow(x, y, &z)) goto ovf; return mk_int(z);
    case 'F': case '%': {
        if (y == 0)
            FAIL(r, n, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1)
            goto ovf;
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
            q--;
            m += y;
        }
        return mk_int(op == 'F' ? q : m);
    }
    case 'P': {
        if (y < 0)
            return mk_float(pow((double)x, (double)y));
        int64_t acc = 1;
        for (int64_t i = 0; i < y; i++)
            if (__builtin_mul_overflow(acc, x, &acc))
                goto ovf;
        return mk_int(acc);
    }
    }
ovf:
    FAIL(r, n, "integer overflow (beyond 64 bits is not supported)");
}

static jj_val to_list(render *r, const jj_node *n, const jj_val *v)
{
    switch (v->t) {
    case JV_LIST: return *v;
    case JV_DICT: {
        jj_list *l = list_new(r, v->u.d->n);
        for (size_t i = 0; i < v->u.d->n; i++)
            list_push(r, l, v->u.d->k[i]);
        return mk_list(l);
    }
    case JV_STR: {
        jj_list *l = list_new(r, 0);
        uint32_t cp;
        for (size_t i = 0; i < v->u.s.n;) {
            size_t k = u8_next(v->u.s.s, v->u.s.n, i, &cp);
            list_push(r, l, mk_str(v->u.s.s + i, k));
            i += k;
        }
        return mk_list(l);
    }
    case JV_UNDEF: return mk_list(list_new(r, 0));
    default: FAIL(r, n, "a %s is not iterable", type_name(v));
    }
}

/* ---- string helpers ------------------------------------------------- */

static int in_chars(uint32_t cp, const jj_val *chars)
{
    if (!chars || chars->t == JV_NONE)
        return py_space(cp);
    uint32_t c;
    for (size_t i = 0; i < chars->u.s.n;) {
        i += u8_next(chars->u.s.s, chars->u.s.n, i, &c);
        if (c == cp)
            return 1;
    }
    return 0;
}

static jj_val do_strip(render *r, const jj_node *n, const jj_val *s, const jj_val *chars, int left, int right)
{
    if (chars && chars->t != JV_NONE && chars->t != JV_STR)
        FAIL(r, n, "strip arg must be None or str");
    size_t b = 0, e = s->u.s.n;
    uint32_t cp;
    if (left)
        while (b < e) {
            size_t k = u8_next(s->u.s.s, e, b, &cp);
            if (!in_chars(cp, chars))
                break;
            b += k;
        }
    if (right)
        while (e > b) {
            size_t p = e - 1;
            while (p > b && ((unsigned char)s->u.s.s[p] & 0xC0) == 0x80)
                p--;
            u8_next(s->u.s.s, e, p, &cp);
            if (!in_chars(cp, chars))
                break;
            e = p;
        }
    return mk_str(s->u.s.s + b, e - b);
}

static int is_ws_c(unsigned char c) { return c == ' ' || (c >= 9 && c <= 13); }

static int ascii_alpha(unsigned char c) { return (c | 32) >= 'a' && (c | 32) <= 'z'; }

/* case: 'u' upper, 'l' lower, 'c' capitalize, 't' Python str.title,
 * 'j' Jinja2's title filter. Only ASCII letters change case (see docs). */
static jj_val do_case(render *r, const jj_val *s, int mode)
{
    char *o = jj_alloc(r->a, s->u.s.n + 1);
    int prev_cased = 0, at_word = 1;
    for (size_t i = 0; i < s->u.s.n; i++) {
        unsigned char c = (unsigned char)s->u.s.s[i];
        int up;
        switch (mode) {
        case 'u': up = 1; break;
        case 'l': up = 0; break;
        case 'c': up = i == 0; break;
        case 't': up = !prev_cased; break;
        default: up = at_word; break;
        }
        if (ascii_alpha(c))
            c = up ? (unsigned char)(c & ~32) : (unsigned char)(c | 32);
        o[i] = (char)c;
        prev_cased = ascii_alpha(c) || c >= 0x80;
        at_word = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_ws_c(c);
    }
    o[s->u.s.n] = 0;
    return mk_str(o, s->u.s.n);
}

static jj_val do_replace(render *r, const jj_node *n, const jj_val *s, const jj_val *old, const jj_val *new_,
                         const jj_val *count)
{
    size_t on, nn;
    const char *o = want_str(r, n, old, "replace", &on);
    const char *nw = want_str(r, n, new_, "replace", &nn);
    int64_t max = count && count->t != JV_NONE ? inum(count) : -1;
    buf b = {0};
    size_t i = 0;
    int64_t done = 0;
    if (on == 0) { /* Python inserts `new` between every character */
        uint32_t cp;
        while (i <= s->u.s.n) {
            if (max >= 0 && done >= max) {
                buf_add(r, &b, s->u.s.s + i, s->u.s.n - i);
                break;
            }
            buf_add(r, &b, nw, nn);
            done++;
            if (i == s->u.s.n)
                break;
            size_t k = u8_next(s->u.s.s, s->u.s.n, i, &cp);
            buf_add(r, &b, s->u.s.s + i, k);
            i += k;
        }
        return buf_val(&b);
    }
    while (i < s->u.s.n) {
        if ((max < 0 || done < max) && i + on <= s->u.s.n && memcmp(s->u.s.s + i, o, on) == 0) {
            buf_add(r, &b, nw, nn);
            i += on;
            done++;
        } else {
            buf_add(r, &b, s->u.s.s + i, 1);
            i++;
        }
    }
    return buf_val(&b);
}

static jj_val do_split(render *r, const jj_node *n, const jj_val *s, const jj_val *sep, const jj_val *maxv)
{
    int64_t max = maxv && maxv->t != JV_NONE ? inum(maxv) : -1;
    jj_list *l = list_new(r, 0);
    const char *p = s->u.s.s;
    size_t len = s->u.s.n;
    if (!sep || sep->t == JV_NONE) { /* runs of whitespace, ends dropped */
        size_t i = 0;
        uint32_t cp;
        int64_t done = 0;
        for (;;) {
            while (i < len) {
                size_t k = u8_next(p, len, i, &cp);
                if (!py_space(cp))
                    break;
                i += k;
            }
            if (i >= len)
                break;
            if (max >= 0 && done >= max) {
                size_t e = len;
                while (e > i) {
                    size_t q = e - 1;
                    while (q > i && ((unsigned char)p[q] & 0xC0) == 0x80)
                        q--;
                    u8_next(p, len, q, &cp);
                    if (!py_space(cp))
                        break;
                    e = q;
                }
                list_push(r, l, mk_str(p + i, e - i));
                break;
            }
            size_t b = i;
            while (i < len) {
                size_t k = u8_next(p, len, i, &cp);
                if (py_space(cp))
                    break;
                i += k;
            }
            list_push(r, l, mk_str(p + b, i - b));
            done++;
        }
        return mk_list(l);
    }
    size_t sn;
    const char *sp = want_str(r, n, sep, "split", &sn);
    if (sn == 0)
        FAIL(r, n, "split: empty separator");
    size_t b = 0;
    int64_t done = 0;
    for (size_t i = 0; i + sn <= len;) {
        if ((max < 0 || done < max) && memcmp(p + i, sp, sn) == 0) {
            list_push(r, l, mk_str(p + b, i - b));
            i += sn;
            b = i;
            done++;
        } else {
            i++;
        }
    }
    list_push(r, l, mk_str(p + b, len - b));
    return mk_list(l);
}

static int affix(const jj_val *s, const jj_val *x, int end)
{
    if (x->u.s.n > s->u.s.n)
        return 0;
    const char *p = end ? s->u.s.s + s->u.s.n - x->u.s.n : s->u.s.s;
    return memcmp(p, x->u.s.s, x->u.s.n) == 0;
}

/* ---- methods -------------------------------------------------------- */

static const char *const str_methods[] = {"strip", "lstrip", "rstrip", "startswith", "endswith", "split",
                                          "replace", "upper", "lower", "title", "capitalize", "find",
                                          "rfind", "join", "count", "isdigit", "isspace", NULL};
static const char *const dict_methods[] = {"items", "keys", "values", "get", NULL};

static jj_val method(render *r, const jj_node *n, const jj_val *self, const char *name)
{
    (void)n;
    const char *const *tab = self->t == JV_STR ? str_methods : self->t == JV_DICT ? dict_methods : NULL;
    for (int i = 0; tab && tab[i]; i++)
        if (!strcmp(tab[i], name)) {
            jj_method *m = jj_alloc(r->a, sizeof(*m));
            m->name = tab[i];
            m->self = *self;
            jj_val v = {.t = JV_METHOD};
            v.u.fn = m;
            return v;
        }
    return UNDEF;
}

static jj_val dict_items(render *r, jj_dict *d)
{
    jj_list *l = list_new(r, d->n);
    for (size_t i = 0; i < d->n; i++) {
        jj_list *t = list_new(r, 2);
        list_push(r, t, d->k[i]);
        list_push(r, t, d->v[i]);
        jj_val tv = mk_list(t);
        tv.tuple = 1;
        list_push(r, l, tv);
    }
    return mk_list(l);
}

static int64_t str_find(const jj_val *s, const jj_val *x, int rev)
{
    int64_t found = -1;
    for (size_t i = 0; i + x->u.s.n <= s->u.s.n; i++)
        if (memcmp(s->u.s.s + i, x->u.s.s, x->u.s.n) == 0) {
            found = (int64_t)i;
            if (!rev)
                break;
        }
    if (found < 0)
        return -1;
    return (int64_t)u8_count(s->u.s.s, (size_t)found);
}

static jj_val call_method(render *r, const jj_node *n, const jj_method *m, const args *a)
{
    const char *nm = m->name;
    const jj_val *self = &m->self;
    if (self->t == JV_DICT) {
        jj_dict *d = self->u.d;
        if (!strcmp(nm, "items")) { check_args(r, n, a, 0, NULL, "items()"); return dict_items(r, d); }
        if (!strcmp(nm, "keys") || !strcmp(nm, "values")) {
            check_args(r, n, a, 0, NULL, nm);
            jj_list *l = list_new(r, d->n);
            for (size_t i = 0; i < d->n; i++)
                list_push(r, l, nm[0] == 'k' ? d->k[i] : d->v[i]);
            return mk_list(l);
        }
        /* get */
        check_args(r, n, a, 2, NULL, "get()");
        if (a->npos < 1)
            FAIL(r, n, "get() needs a key");
        jj_val *p = dict_find(d, &a->pos[0]);
        return p ? *p : a->npos > 1 ? a->pos[1] : NONE;
    }
    static const char *const kw_split[] = {"sep", "maxsplit", NULL};
    if (!strcmp(nm, "strip") || !strcmp(nm, "lstrip") || !strcmp(nm, "rstrip")) {
        check_args(r, n, a, 1, NULL, nm);
        return do_strip(r, n, self, arg(a, 0, NULL), nm[0] != 'r', nm[0] != 'l');
    }
    if (!strcmp(nm, "startswith") || !strcmp(nm, "endswith")) {
        check_args(r, n, a, 1, NULL, nm);
        if (a->npos < 1)
            FAIL(r, n, "%s() needs an argument", nm);
        const jj_val *x = &a->pos[0];
        if (x->t == JV_LIST && x->tuple) {
            for (size_t i = 0; i < x->u.l->n; i++) {
                if (x->u.l->v[i].t != JV_STR)
                    FAIL(r, n, "%s() needs strings", nm);
                if (affix(self, &x->u.l->v[i], nm[0] == 'e'))
                    return mk_bool(1);
            }
            return mk_bool(0);
        }
        if (x->t != JV_STR)
            FAIL(r, n, "%s() needs a string or a tuple of strings, got %s", nm, type_name(x));
        return mk_bool(affix(self, x, nm[0] == 'e'));
    }
    if (!strcmp(nm, "split")) {
        check_args(r, n, a, 2, kw_split, "split()");
        return do_split(r, n, self, arg(a, 0, "sep"), arg(a, 1, "maxsplit"));
    }
    if (!strcmp(nm, "replace")) {
        check_args(r, n, a, 3, NULL, "replace()");
        if (a->npos < 2)
            FAIL(r, n, "replace() needs two arguments");
        return do_replace(r, n, self, &a->pos[0], &a->pos[1], arg(a, 2, NULL));
    }
    if (!strcmp(nm, "upper") || !strcmp(nm, "lower") || !strcmp(nm, "title") || !strcmp(nm, "capitalize")) {
        check_args(r, n, a, 0, NULL, nm);
        return do_case(r, self, nm[0] == 'u' ? 'u' : nm[0] == 'l' ? 'l' : nm[0] == 't' ? 't' : 'c');
    }
    if (!strcmp(nm, "find") || !strcmp(nm, "rfind") || !strcmp(nm, "count")) {
        check_args(r, n, a, 1, NULL, nm);
        if (a->npos < 1 || a->pos[0].t != JV_STR)
            FAIL(r, n, "%s() needs a string", nm);
        if (nm[0] == 'c') {
            int64_t c = 0;
            size_t k = a->pos[0].u.s.n;
            if (k == 0)
                return mk_int((int64_t)u8_count(self->u.s.s, self->u.s.n) + 1);
            for (size_t i = 0; i + k <= self->u.s.n;)
                if (memcmp(self->u.s.s + i, a->pos[0].u.s.s, k) == 0)
                    c++, i += k;
                else
                    i++;
            return mk_int(c);
        }
        return mk_int(str_find(self, &a->pos[0], nm[0] == 'r'));
    }
    if (!strcmp(nm, "isdigit") || !strcmp(nm, "isspace")) {
        check_args(r, n, a, 0, NULL, nm);
        if (!self->u.s.n)
            return mk_bool(0);
        uint32_t cp;
        for (size_t i = 0; i < self->u.s.n;) {
            i += u8_next(self->u.s.s, self->u.s.n, i, &cp);
            if (nm[2] == 'd' ? !(cp >= '0' && cp <= '9') : !py_space(cp))
                return mk_bool(0);
        }
        return mk_bool(1);
    }
    /* join */
    check_args(r, n, a, 1, NULL, "join()");
    if (a->npos < 1)
        FAIL(r, n, "join() needs an iterable");
    jj_val l = to_list(r, n, &a->pos[0]);
    buf b = {0};
    for (size_t i = 0; i < l.u.l->n; i++) {
        if (l.u.l->v[i].t != JV_STR)
            FAIL(r, n, "join(): item %zu is a %s, not a string", i, type_name(&l.u.l->v[i]));
        if (i)
            buf_add(r, &b, self->u.s.s, self->u.s.n);
        buf_add(r, &b, l.u.l->v[i].u.s.s, l.u.l->v[i].u.s.n);
    }
    return buf_val(&b);
}

/* ---- tests ---------------------------------------------------------- */

static int run_test(render *r, const jj_node *n, const char *name, const jj_val *v, const args *a)
{
    const jj_val *x = arg(a, 0, NULL);
#define NEEDX() do { if (!x) FAIL(r, n, "test '%s' needs an argument", name); } while (0)
    if (!strcmp(name, "defined")) return v->t != JV_UNDEF;
    if (!strcmp(name, "undefined")) return v->t == JV_UNDEF;
    if (!strcmp(name, "none")) return v->t == JV_NONE;
    if (!strcmp(name, "string")) return v->t == JV_STR;
    if (!strcmp(name, "number")) return is_num(v);
    if (!strcmp(name, "integer")) return v->t == JV_INT;
    if (!strcmp(name, "float")) return v->t == JV_FLOAT;
    if (!strcmp(name, "boolean")) return v->t == JV_BOOL;
    if (!strcmp(name, "true")) return v->t == JV_BOOL && v->u.b;
    if (!strcmp(name, "false")) return v->t == JV_BOOL && !v->u.b;
    if (!strcmp(name, "mapping")) return v->t == JV_DICT;
    if (!strcmp(name, "iterable")) return v->t == JV_STR || v->t == JV_LIST || v->t == JV_DICT;
    if (!strcmp(name, "sequence")) return v->t == JV_STR || v->t == JV_LIST || v->t == JV_DICT;
    if (!strcmp(name, "callable")) return v->t == JV_MACRO || v->t == JV_FUNC || v->t == JV_METHOD;
    if (!strcmp(name, "equalto") || !strcmp(name, "eq") || !strcmp(name, "==") || !strcmp(name, "sameas")) {
        NEEDX();
        return val_eq(v, x);
    }
    if (!strcmp(name, "ne") || !strcmp(name, "!=")) { NEEDX(); return !val_eq(v, x); }
    if (!strcmp(name, "lt") || !strcmp(name, "<")) { NEEDX(); return val_lt(r, v, x); }
    if (!strcmp(name, "gt") || !strcmp(name, ">")) { NEEDX(); return val_lt(r, x, v); }
    if (!strcmp(name, "le") || !strcmp(name, "<=")) { NEEDX(); return !val_lt(r, x, v); }
    if (!strcmp(name, "ge") || !strcmp(name, ">=")) { NEEDX(); return !val_lt(r, v, x); }
    if (!strcmp(name, "in")) { NEEDX(); return contains(r, n, v, x); }
    if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        if (v->t != JV_INT && v->t != JV_BOOL)
            FAIL(r, n, "test '%s' needs an integer, got %s", name, type_name(v));
        int64_t i = inum(v);
        if (name[0] == 'o') return (i % 2) != 0;
        if (name[0] == 'e') return i % 2 == 0;
        NEEDX();
        if ((x->t != JV_INT && x->t != JV_BOOL) || inum(x) == 0)
            FAIL(r, n, "divisibleby needs a non-zero integer");
        return i % inum(x) == 0;
    }
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        if (v->t != JV_STR)
            return 0;
        jj_val c = do_case(r, v, name[0]);
        return val_eq(&c, v);
    }
#undef NEEDX
    FAIL(r, n, "test '%s' is not supported", name);
}

/* ---- filters -------------------------------------------------------- */

static jj_val apply_filter(render *r, scope *s, const jj_node *n, const char *name, const jj_val *v,
                           const args *a);

static jj_val attr_path(render *r, const jj_node *n, const jj_val *v, const jj_val *attr)
{
    if (attr->t == JV_INT)
        return getitem(r, n, v, attr);
    size_t len;
    const char *p = want_str(r, n, attr, "attribute", &len);
    jj_val cur = *v;
    size_t b = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i == len || p[i] == '.') {
            jj_val k = mk_str(p + b, i - b);
            int digits = i > b;
            for (size_t q = b; q < i; q++)
                if (p[q] < '0' || p[q] > '9')
                    digits = 0;
            if (digits)
                k = mk_int(strtoll(p + b, NULL, 10));
            cur = cur.t == JV_UNDEF ? UNDEF : getitem(r, n, &cur, &k);
            b = i + 1;
        }
    }
    return cur;
}

/* sort key comparison: strings case-insensitively unless case_sensitive */
static int sort_lt(render *r, const jj_val *a, const jj_val *b, int cs)
{
    if (!cs && a->t == JV_STR && b->t == JV_STR) {
        jj_val la = do_case(r, a, 'l'), lb = do_case(r, b, 'l');
        return val_lt(r, &la, &lb);
    }
    return val_lt(r, a, b);
}

static void sort_vals(render *r, jj_val *items, jj_val *keys, size_t n, int cs, int rev)
{
    /* stable insertion sort on keys (chat template lists are short) */
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0; j--) {
            int lt = rev ? sort_lt(r, &keys[j - 1], &keys[j], cs) : sort_lt(r, &keys[j], &keys[j - 1], cs);
            if (!lt)
                break;
            jj_val t = keys[j]; keys[j] = keys[j - 1]; keys[j - 1] = t;
            t = items[j]; items[j] = items[j - 1]; items[j - 1] = t;
        }
}

static jj_val filter_select(render *r, scope *s, const jj_node *n, const char *name, const jj_val *v,
                            const args *a)
{
    int attr = !strcmp(name, "selectattr") || !strcmp(name, "rejectattr");
    int keep = name[0] == 's';
    jj_val l = to_list(r, n, v);
    jj_list *out = list_new(r, 0);
    int first_test = attr ? 1 : 0;
    if (attr && a->npos < 1)
        FAIL(r, n, "filter '%s' needs an attribute", name);
    const char *test = NULL;
    if (a->npos > first_test) {
        size_t len;
        test = jj_strndup(r->a, want_str(r, n, &a->pos[first_test], name, &len), a->pos[first_test].u.s.n);
    }
    args ta = {.pos = a->pos + first_test + 1, .npos = a->npos > first_test + 1 ? a->npos - first_test - 1 : 0};
    (void)s;
    for (size_t i = 0; i < l.u.l->n; i++) {
        jj_val item = l.u.l->v[i];
        jj_val x = attr ? attr_path(r, n, &item, &a->pos[0]) : item;
        int t = test ? run_test(r, n, test, &x, &ta) : truthy(&x);
        if (t == keep)
            list_push(r, out, item);
    }
    return mk_list(out);
}

static void want_args(render *r, const jj_node *n, const args *a, int maxpos, const char *const *kw,
                      const char *name)
{
    char what[80];
    snprintf(what, sizeof(what), "filter '%s'", name);
    check_args(r, n, a, maxpos, kw, what);
}

static jj_val do_indent(render *r, const jj_node *n, const jj_val *v, const args *a)
{
    const jj_val *w = arg(a, 0, "width"), *first = arg(a, 1, "first"), *blank = arg(a, 2, "blank");
    buf pad = {0};
    if (w && w->t == JV_STR) {
        buf_add(r, &pad, w->u.s.s, w->u.s.n);
    } else {
        int64_t k = w ? inum(w) : 4;
        if (k < 0 || k > 4096)
            FAIL(r, n, "indent width %lld is out of range", (long long)k);
        for (int64_t i = 0; i < k; i++)
            buf_cstr(r, &pad, " ");
    }
    jj_val sv = str_of(r, v);
    buf b = {0};
    if (first && truthy(first))
        buf_add(r, &b, pad.s, pad.n);
    /* Jinja2: lines after the first get the indent (blank ones only with blank=True) */
    const char *p = sv.u.s.s;
    size_t len = sv.u.s.n, i = 0;
    int line0 = 1;
    while (i <= len) {
        size_t e = i;
        while (e < len && p[e] != '\n')
            e++;
        if (!line0 && (e > i || (blank && truthy(blank))))
            buf_add(r, &b, pad.s, pad.n);
        buf_add(r, &b, p + i, e - i);
        if (e >= len)
            break;
        buf_cstr(r, &b, "\n");
        i = e + 1;
        line0 = 0;
    }
    return buf_val(&b);
}

static jj_val apply_filter(render *r, scope *s, const jj_node *n, const char *name, const jj_val *v,
                           const args *a)
{
    static const char *const kw_tojson[] = {"indent", "separators", "sort_keys", "ensure_ascii", NULL};
    static const char *const kw_sort[] = {"reverse", "case_sensitive", "attribute", NULL};
    static const char *const kw_default[] = {"default_value", "boolean", NULL};
    static const char *const kw_join[] = {"d", "attribute", NULL};
    static const char *const kw_map[] = {"attribute", "default", NULL};
    static const char *const kw_indent[] = {"width", "first", "blank", NULL};
    static const char *const kw_trim[] = {"chars", NULL};
    static const char *const kw_dictsort[] = {"case_sensitive", "by", "reverse", NULL};
    static const char *const kw_int[] = {"default", "base", NULL};
    if (!strcmp(name, "trim")) {
        want_args(r, n, a, 1, kw_trim, name);
        jj_val sv = str_of(r, v);
        return do_strip(r, n, &sv, arg(a, 0, "chars"), 1, 1);
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        want_args(r, n, a, 0, NULL, name);
        switch (v->t) {
        case JV_STR: return mk_int((int64_t)u8_count(v->u.s.s, v->u.s.n));
        case JV_LIST: return mk_int((int64_t)v->u.l->n);
        case JV_DICT: case JV_NS: return mk_int((int64_t)v->u.d->n);
        case JV_UNDEF: return mk_int(0);
        default: FAIL(r, n, "filter '%s' of a %s", name, type_name(v));
        }
    }
    if (!strcmp(name, "tojson")) {
        want_args(r, n, a, 1, kw_tojson, name);
        const jj_val *ind = arg(a, 0, "indent"), *sep = arg(a, -1, "separators"), *sk = arg(a, -1, "sort_keys");
        json_opts o = {.indent = -1, .item_sep = ", ", .key_sep = ": "};
        if (ind && ind->t != JV_NONE) {
            if (ind->t != JV_INT || ind->u.i < 0 || ind->u.i > 64)
                FAIL(r, n, "tojson indent must be an integer 0..64");
            o.indent = (int)ind->u.i;
            o.item_sep = ",";
        }
        if (sep && sep->t != JV_NONE) {
            if (sep->t != JV_LIST || sep->u.l->n != 2 || sep->u.l->v[0].t != JV_STR || sep->u.l->v[1].t != JV_STR)
                FAIL(r, n, "tojson separators must be a pair of strings");
            o.item_sep = jj_strndup(r->a, sep->u.l->v[0].u.s.s, sep->u.l->v[0].u.s.n);
            o.key_sep = jj_strndup(r->a, sep->u.l->v[1].u.s.s, sep->u.l->v[1].u.s.n);
        }
        o.sort_keys = sk && truthy(sk);
        const jj_val *ea = arg(a, -1, "ensure_ascii");
        if (ea && truthy(ea))
            FAIL(r, n, "tojson ensure_ascii=True is not supported");
        buf b = {0};
        to_json(r, &b, v, &o, 0);
        return buf_val(&b);
    }
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        want_args(r, n, a, 2, kw_default, name);
        const jj_val *dv = arg(a, 0, "default_value"), *bo = arg(a, 1, "boolean");
        int use = v->t == JV_UNDEF || (bo && truthy(bo) && !truthy(v));
        return use ? (dv ? *dv : mk_str("", 0)) : *v;
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        want_args(r, n, a, 0, NULL, name);
        jj_val l = to_list(r, n, v);
        if (!l.u.l->n)
            return UNDEF;
        return name[0] == 'f' ? l.u.l->v[0] : l.u.l->v[l.u.l->n - 1];
    }
    if (!strcmp(name, "join")) {
        want_args(r, n, a, 2, kw_join, name);
        const jj_val *d = arg(a, 0, "d"), *at = arg(a, 1, "attribute");
        jj_val l = to_list(r, n, v);
        buf b = {0};
        for (size_t i = 0; i < l.u.l->n; i++) {
            if (i && d)
                to_str(r, &b, d);
            jj_val x = at ? attr_path(r, n, &l.u.l->v[i], at) : l.u.l->v[i];
            to_str(r, &b, &x);
        }
        return buf_val(&b);
    }
    if (!strcmp(name, "lower") || !strcmp(name, "upper") || !strcmp(name, "capitalize") || !strcmp(name, "title")) {
        want_args(r, n, a, 0, NULL, name);
        jj_val sv = str_of(r, v);
        return do_case(r, &sv, name[0] == 'l' ? 'l' : name[0] == 'u' ? 'u' : name[0] == 'c' ? 'c' : 'j');
    }
    if (!strcmp(name, "replace")) {
        want_args(r, n, a, 3, NULL, name);
        if (a->npos < 2)
            FAIL(r, n, "filter 'replace' needs two arguments");
        jj_val sv = str_of(r, v);
        return do_replace(r, n, &sv, &a->pos[0], &a->pos[1], arg(a, 2, NULL));
    }
    if (!strcmp(name, "string")) {
        want_args(r, n, a, 0, NULL, name);
        return str_of(r, v);
    }
    if (!strcmp(name, "safe")) {
        want_args(r, n, a, 0, NULL, name);
        return *v;
    }
    if (!strcmp(name, "int")) {
        want_args(r, n, a, 1, kw_int, name);
        const jj_val *dv = arg(a, 0, "default");
        jj_val d = dv ? *dv : mk_int(0);
        if (v->t == JV_INT) return *v;
        if (v->t == JV_BOOL) return mk_int(v->u.b);
        if (v->t == JV_FLOAT) return isfinite(v->u.f) && fabs(v->u.f) < 9.2e18 ? mk_int((int64_t)v->u.f) : d;
        if (v->t == JV_STR) {
            char *t = jj_strndup(r->a, v->u.s.s, v->u.s.n), *e;
            errno = 0;
            long long x = strtoll(t, &e, 10);
            while (*e && is_ws_c((unsigned char)*e)) e++;
            if (!*e && e != t && !errno) return mk_int(x);
            double f = strtod(t, &e);
            while (*e && is_ws_c((unsigned char)*e)) e++;
            if (!*e && e != t && isfinite(f) && fabs(f) < 9.2e18) return mk_int((int64_t)f);
        }
        return d;
    }
    if (!strcmp(name, "float")) {
        want_args(r, n, a, 1, kw_int, name);
        const jj_val *dv = arg(a, 0, "default");
        if (is_num(v)) return mk_float(num(v));
        if (v->t == JV_STR) {
            char *t = jj_strndup(r->a, v->u.s.s, v->u.s.n), *e;
            double f = strtod(t, &e);
            while (*e && is_ws_c((unsigned char)*e)) e++;
            if (!*e && e != t) return mk_float(f);
        }
        return dv ? *dv : mk_float(0.0);
    }
    if (!strcmp(name, "list")) {
        want_args(r, n, a, 0, NULL, name);
        jj_val l = to_list(r, n, v);
        jj_list *c = list_new(r, l.u.l->n);
        for (size_t i = 0; i < l.u.l->n; i++)
            list_push(r, c, l.u.l->v[i]);
        return mk_list(c);
    }
    if (!strcmp(name, "map")) {
        jj_val l = to_list(r, n, v);
        jj_list *out = list_new(r, l.u.l->n);
        const jj_val *at = arg(a, -1, "attribute");
        if (at) {
            want_args(r, n, a, 0, kw_map, name);
            const jj_val *dv = arg(a, -1, "default");
            for (size_t i = 0; i < l.u.l->n; i++) {
                jj_val x = attr_path(r, n, &l.u.l->v[i], at);
                list_push(r, out, x.t == JV_UNDEF && dv ? *dv : x);
            }
            return mk_list(out);
        }
        if (a->npos < 1 || a->pos[0].t != JV_STR)
            FAIL(r, n, "filter 'map' needs a filter name or attribute=");
        const char *fname = jj_strndup(r->a, a->pos[0].u.s.s, a->pos[0].u.s.n);
        args fa = {.pos = a->pos + 1, .npos = a->npos - 1, .kwn = a->kwn, .kw = a->kw, .nkw = a->nkw};
        for (size_t i = 0; i < l.u.l->n; i++)
            list_push(r, out, apply_filter(r, s, n, fname, &l.u.l->v[i], &fa));
        return mk_list(out);
    }
    if (!strcmp(name, "select") || !strcmp(name, "reject") || !strcmp(name, "selectattr") ||
        !strcmp(name, "rejectattr")) {
        if (a->nkw)
            FAIL(r, n, "filter '%s' takes no keyword arguments", name);
        return filter_select(r, s, n, name, v, a);
    }
    if (!strcmp(name, "reverse")) {
        want_args(r, n, a, 0, NULL, name);
        if (v->t == JV_STR) {
            jj_val st = mk_int(-1);
            return do_slice(r, n, v, NULL, NULL, &st);
        }
        jj_val l = to_list(r, n, v);
        jj_list *out = list_new(r, l.u.l->n);
        for (size_t i = l.u.l->n; i-- > 0;)
            list_push(r, out, l.u.l->v[i]);
        return mk_list(out);
    }
    if (!strcmp(name, "sort")) {
        want_args(r, n, a, 2, kw_sort, name);
        const jj_val *rev = arg(a, 0, "reverse"), *cs = arg(a, 1, "case_sensitive"), *at = arg(a, -1, "attribute");
        jj_val l = to_list(r, n, v);
        jj_val *items = jj_alloc(r->a, (l.u.l->n + 1) * sizeof(jj_val));
        jj_val *keys = jj_alloc(r->a, (l.u.l->n + 1) * sizeof(jj_val));
        for (size_t i = 0; i < l.u.l->n; i++) {
            items[i] = l.u.l->v[i];
            keys[i] = at ? attr_path(r, n, &items[i], at) : items[i];
        }
        sort_vals(r, items, keys, l.u.l->n, cs && truthy(cs), rev && truthy(rev));
        jj_list *out = list_new(r, l.u.l->n);
        for (size_t i = 0; i < l.u.l->n; i++)
            list_push(r, out, items[i]);
        return mk_list(out);
    }
    if (!strcmp(name, "items")) {
        want_args(r, n, a, 0, NULL, name);
        if (v->t == JV_UNDEF)
            return mk_list(list_new(r, 0));
        if (v->t != JV_DICT)
            FAIL(r, n, "filter 'items' needs a mapping, got %s", type_name(v));
        return dict_items(r, v->u.d);
    }
    if (!strcmp(name, "dictsort")) {
        want_args(r, n, a, 3, kw_dictsort, name);
        if (v->t != JV_DICT)
            FAIL(r, n, "filter 'dictsort' needs a mapping, got %s", type_name(v));
        const jj_val *cs = arg(a, 0, "case_sensitive"), *by = arg(a, 1, "by"), *rev = arg(a, 2, "reverse");
        int byval = 0;
        if (by) {
            size_t len;
            const char *b = want_str(r, n, by, "dictsort by", &len);
            if (len == 5 && !memcmp(b, "value", 5)) byval = 1;
            else if (!(len == 3 && !memcmp(b, "key", 3)))
                FAIL(r, n, "dictsort: 'by' must be 'key' or 'value'");
        }
        jj_val l = dict_items(r, v->u.d);
        size_t cnt = l.u.l->n;
        jj_val *keys = jj_alloc(r->a, (cnt + 1) * sizeof(jj_val));
        for (size_t i = 0; i < cnt; i++)
            keys[i] = l.u.l->v[i].u.l->v[byval];
        sort_vals(r, l.u.l->v, keys, cnt, cs && truthy(cs), rev && truthy(rev));
        return l;
    }
    if (!strcmp(name, "indent")) {
        want_args(r, n, a, 3, kw_indent, name);
        return do_indent(r, n, v, a);
    }
    if (!strcmp(name, "abs")) {
        want_args(r, n, a, 0, NULL, name);
        if (v->t == JV_INT) {
            if (v->u.i == INT64_MIN) FAIL(r, n, "integer overflow");
            return mk_int(v->u.i < 0 ? -v->u.i : v->u.i);
        }
        if (v->t == JV_FLOAT) return mk_float(fabs(v->u.f));
        FAIL(r, n, "filter 'abs' of a %s", type_name(v));
    }
    if (!strcmp(name, "unique")) {
        want_args(r, n, a, 0, NULL, name);
        jj_val l = to_list(r, n, v);
        jj_list *out = list_new(r, 0);
        for (size_t i = 0; i < l.u.l->n; i++) {
            int seen = 0;
            for (size_t j = 0; j < out->n && !seen; j++) {
                jj_val x = l.u.l->v[i], y = out->v[j];
                if (x.t == JV_STR && y.t == JV_STR) { x = do_case(r, &x, 'l'); y = do_case(r, &y, 'l'); }
                seen = val_eq(&x, &y);
            }
            if (!seen)
                list_push(r, out, l.u.l->v[i]);
        }
        return mk_list(out);
    }
    FAIL(r, n, "filter '%s' is not supported", name);
}

/* ---- calls ---------------------------------------------------------- */

static jj_val call_macro(render *r, scope *s, const jj_node *n, const jj_node *m, const args *a);

static jj_val call_func(render *r, const jj_node *n, const char *name, const args *a)
{
    if (!strcmp(name, "raise_exception")) {
        jj_val msg = a->npos ? str_of(r, &a->pos[0]) : mk_str("", 0);
        jj_fail(r->a, n->line, n->col, "raise_exception: %.*s", (int)(msg.u.s.n > 300 ? 300 : msg.u.s.n),
                msg.u.s.s);
    }
    if (!strcmp(name, "namespace") || !strcmp(name, "dict")) {
        jj_dict *d = dict_new(r);
        if (a->npos) {
            if (a->npos > 1 || a->pos[0].t != JV_DICT)
                FAIL(r, n, "%s() takes one mapping and keyword arguments", name);
            for (size_t i = 0; i < a->pos[0].u.d->n; i++)
                dict_set(r, d, a->pos[0].u.d->k[i], a->pos[0].u.d->v[i]);
        }
        for (int i = 0; i < a->nkw; i++)
            dict_set_s(r, d, a->kwn[i], a->kw[i]);
        jj_val v = {.t = name[0] == 'n' ? JV_NS : JV_DICT};
        v.u.d = d;
        return v;
    }
    if (!strcmp(name, "strftime_now")) {
        check_args(r, n, a, 1, NULL, "strftime_now()");
        size_t len;
        if (a->npos < 1)
            FAIL(r, n, "strftime_now() needs a format");
        const char *f = jj_strndup(r->a, want_str(r, n, &a->pos[0], "strftime_now", &len), a->pos[0].u.s.n);
        time_t now = time(NULL);
        struct tm tm;
        if (!localtime_r(&now, &tm))
            FAIL(r, n, "strftime_now: no local time");
        char *o = jj_alloc(r->a, 512);
        size_t k = strftime(o, 512, f, &tm);
        return mk_str(o, k);
    }
    /* range */
    check_args(r, n, a, 3, NULL, "range()");
    for (int i = 0; i < a->npos; i++)
        if (a->pos[i].t != JV_INT && a->pos[i].t != JV_BOOL)
            FAIL(r, n, "range() needs integers");
    int64_t lo = 0, hi, st = 1;
    if (a->npos == 1) hi = inum(&a->pos[0]);
    else if (a->npos >= 2) { lo = inum(&a->pos[0]); hi = inum(&a->pos[1]); if (a->npos == 3) st = inum(&a->pos[2]); }
    else FAIL(r, n, "range() needs an argument");
    if (st == 0)
        FAIL(r, n, "range() step must not be zero");
    jj_list *l = list_new(r, 0);
    for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) {
        step(r, n);
        list_push(r, l, mk_int(i));
    }
    return mk_list(l);
}

static jj_val call(render *r, scope *s, const jj_node *n)
{
    jj_val fn = eval(r, s, n->a);
    args a = eval_args(r, s, n);
    r->at = n;
    switch (fn.t) {
    case JV_METHOD: return call_method(r, n, fn.u.fn, &a);
    case JV_FUNC: return call_func(r, n, fn.u.s.s, &a);
    case JV_MACRO: return call_macro(r, s, n, fn.u.m, &a);
    case JV_UNDEF:
        if (n->a->kind == E_NAME)
            FAIL(r, n, "'%s' is undefined (function not supported or not defined)", n->a->str);
        if (n->a->kind == E_ATTR)
            FAIL(r, n, "method '%s' is not supported on this value", n->a->str);
        FAIL(r, n, "calling an undefined value");
    default: FAIL(r, n, "a %s is not callable", type_name(&fn));
    }
}

/* ---- expressions ---------------------------------------------------- */

static int compare(render *r, const jj_node *n, const char *op, const jj_val *a, const jj_val *b)
{
    if (!strcmp(op, "==")) return val_eq(a, b);
    if (!strcmp(op, "!=")) return !val_eq(a, b);
    if (!strcmp(op, "in")) return contains(r, n, a, b);
    if (!strcmp(op, "notin")) return !contains(r, n, a, b);
    if (a->t == JV_UNDEF || b->t == JV_UNDEF)
        FAIL(r, n, "'%s' with an undefined value", op);
    if (!((is_num(a) && is_num(b)) || (a->t == JV_STR && b->t == JV_STR) || (a->t == JV_LIST && b->t == JV_LIST)))
        FAIL(r, n, "'%s' not supported between %s and %s", op, type_name(a), type_name(b));
    if (!strcmp(op, "<")) return val_lt(r, a, b);
    if (!strcmp(op, ">")) return val_lt(r, b, a);
    if (!strcmp(op, "<=")) return !val_lt(r, b, a);
    return !val_lt(r, a, b);
}

static jj_val eval(render *r, scope *s, const jj_node *n)
{
    if (++r->depth > r->max_depth * 4)
        FAIL(r, n, "expression nested too deeply");
    jj_val v;
    r->at = n;
    switch (n->kind) {
    case E_LIT: v = n->lit; break;
    case E_NAME: v = scope_get(s, n->str); break;
    case E_ATTR: {
        jj_val o = eval(r, s, n->a);
        r->at = n;
        v = getattr_(r, n, &o, n->str);
        break;
    }
    case E_ITEM: {
        jj_val o = eval(r, s, n->a), k = eval(r, s, n->b);
        r->at = n;
        v = getitem(r, n, &o, &k);
        break;
    }
    case E_SLICE: {
        jj_val o = eval(r, s, n->a);
        jj_val x = n->b ? eval(r, s, n->b) : NONE, y = n->c ? eval(r, s, n->c) : NONE;
        jj_val z = n->d ? eval(r, s, n->d) : NONE;
        if (o.t == JV_UNDEF)
            FAIL(r, n, "slicing an undefined value");
        v = do_slice(r, n, &o, &x, &y, &z);
        break;
    }
    case E_CALL: v = call(r, s, n); break;
    case E_FILTER: {
        jj_val o = eval(r, s, n->a);
        args a = eval_args(r, s, n);
        r->at = n;
        v = apply_filter(r, s, n, n->str, &o, &a);
        break;
    }
    case E_TEST: {
        jj_val o = eval(r, s, n->a);
        args a = eval_args(r, s, n);
        r->at = n;
        int t = run_test(r, n, n->str, &o, &a);
        v = mk_bool(n->negated ? !t : t);
        break;
    }
    case E_BIN: {
        jj_val a = eval(r, s, n->a), b = eval(r, s, n->b);
        r->at = n;
        v = arith(r, n, n->op, &a, &b);
        break;
    }
    case E_NEG: case E_POS: {
        jj_val a = eval(r, s, n->a);
        if (!is_num(&a))
            FAIL(r, n, "bad operand type for unary %c: %s", n->kind == E_NEG ? '-' : '+', type_name(&a));
        if (n->kind == E_POS)
            v = a.t == JV_BOOL ? mk_int(a.u.b) : a;
        else if (a.t == JV_FLOAT)
            v = mk_float(-a.u.f);
        else if (inum(&a) == INT64_MIN)
            FAIL(r, n, "integer overflow");
        else
            v = mk_int(-inum(&a));
        break;
    }
    case E_NOT: { jj_val a = eval(r, s, n->a); v = mk_bool(!truthy(&a)); break; }
    case E_AND: { v = eval(r, s, n->a); if (truthy(&v)) v = eval(r, s, n->b); break; }
    case E_OR: { v = eval(r, s, n->a); if (!truthy(&v)) v = eval(r, s, n->b); break; }
    case E_CMP: {
        jj_val a = eval(r, s, n->a);
        v = mk_bool(1);
        for (int i = 0; i < n->nkids; i++) {
            jj_val b = eval(r, s, n->kids[i]);
            r->at = n;
            if (!compare(r, n, n->names[i], &a, &b)) {
                v = mk_bool(0);
                break;
            }
            a = b;
        }
        break;
    }
    case E_COND: {
        jj_val c = eval(r, s, n->a);
        v = truthy(&c) ? eval(r, s, n->b) : n->c ? eval(r, s, n->c) : UNDEF;
        break;
    }
    case E_LIST: case E_TUPLE: {
        jj_list *l = list_new(r, (size_t)n->nkids);
        for (int i = 0; i < n->nkids; i++)
            list_push(r, l, eval(r, s, n->kids[i]));
        v = mk_list(l);
        v.tuple = n->kind == E_TUPLE;
        break;
    }
    case E_DICT: {
        jj_dict *d = dict_new(r);
        for (int i = 0; i < n->nkids; i++) {
            jj_val k = eval(r, s, n->kids[i]);
            if (k.t != JV_STR && k.t != JV_INT && k.t != JV_BOOL && k.t != JV_NONE && k.t != JV_FLOAT)
                FAIL(r, n->kids[i], "a %s as a dict key is not supported", type_name(&k));
            dict_set(r, d, k, eval(r, s, n->kids2[i]));
        }
        v = mk_dict(d);
        break;
    }
    default: FAIL(r, n, "internal: unknown expression");
    }
    r->depth--;
    return v;
}

/* ---- statements ----------------------------------------------------- */

static void assign_targets(render *r, scope *s, const jj_node *n, const jj_val *v)
{
    if (n->nnames == 1) {
        scope_set(r, s, n->names[0], *v);
        return;
    }
    jj_val l = *v;
    if (l.t != JV_LIST)
        FAIL(r, n, "cannot unpack a %s into %d names", type_name(v), n->nnames);
    if ((int)l.u.l->n != n->nnames)
        FAIL(r, n, "cannot unpack %zu values into %d names", l.u.l->n, n->nnames);
    for (int i = 0; i < n->nnames; i++)
        scope_set(r, s, n->names[i], l.u.l->v[i]);
}

static void exec_for(render *r, scope *s, const jj_node *n, buf *b)
{
    jj_val it = eval(r, s, n->a);
    r->at = n;
    jj_val l = to_list(r, n, &it);
    jj_list *items = l.u.l;
    if (n->d) { /* `for x in xs if cond`: filtered first, loop.* counts what is left */
        jj_list *f = list_new(r, items->n);
        for (size_t i = 0; i < items->n; i++) {
            scope *fs = scope_new(r, s);
            assign_targets(r, fs, n, &items->v[i]);
            jj_val c = eval(r, fs, n->d);
            if (truthy(&c))
                list_push(r, f, items->v[i]);
        }
        items = f;
    }
    if (!items->n) {
        if (n->c)
            exec_body(r, s, n->c, b);
        return;
    }
    jj_dict *loop = dict_new(r);
    int64_t len = (int64_t)items->n;
    for (size_t i = 0; i < items->n; i++) {
        step(r, n);
        scope *ls = scope_new(r, s);
        int64_t k = (int64_t)i;
        dict_set_s(r, loop, "index0", mk_int(k));
        dict_set_s(r, loop, "index", mk_int(k + 1));
        dict_set_s(r, loop, "revindex", mk_int(len - k));
        dict_set_s(r, loop, "revindex0", mk_int(len - k - 1));
        dict_set_s(r, loop, "first", mk_bool(k == 0));
        dict_set_s(r, loop, "last", mk_bool(k == len - 1));
        dict_set_s(r, loop, "length", mk_int(len));
        dict_set_s(r, loop, "depth", mk_int(1));
        dict_set_s(r, loop, "depth0", mk_int(0));
        dict_set_s(r, loop, "previtem", k > 0 ? items->v[i - 1] : UNDEF);
        dict_set_s(r, loop, "nextitem", k < len - 1 ? items->v[i + 1] : UNDEF);
        /* a fresh loop object per iteration: a template may keep one */
        jj_dict *snap = dict_new(r);
        for (size_t q = 0; q < loop->n; q++)
            dict_set(r, snap, loop->k[q], loop->v[q]);
        scope_set(r, ls, "loop", mk_dict(snap));
        assign_targets(r, ls, n, &items->v[i]);
        exec_body(r, ls, n->b, b);
        if (r->ctl == 1) {
            r->ctl = 0;
            break;
        }
        r->ctl = 0;
    }
}

static jj_val call_macro(render *r, scope *s, const jj_node *n, const jj_node *m, const args *a)
{
    (void)s;
    step(r, n);
    if (++r->mdepth > r->max_depth)
        FAIL(r, n, "macro calls nested deeper than %d", r->max_depth);
    if (a->npos > m->nnames)
        FAIL(r, n, "macro '%s' takes %d arguments, got %d", m->str, m->nnames, a->npos);
    scope *ms = scope_new(r, (scope *)m->a); /* the scope it was defined in */
    for (int i = 0; i < m->nnames; i++) {
        const jj_val *v = arg(a, i, m->names[i]);
        if (v)
            scope_set(r, ms, m->names[i], *v);
        else if (m->kids2[i])
            scope_set(r, ms, m->names[i], eval(r, ms, m->kids2[i]));
        else
            scope_set(r, ms, m->names[i], UNDEF);
    }
    for (int k = 0; k < a->nkw; k++) {
        int ok = 0;
        for (int i = 0; i < m->nnames; i++)
            if (!strcmp(a->kwn[k], m->names[i]))
                ok = 1;
        if (!ok)
            FAIL(r, n, "macro '%s' has no argument '%s'", m->str, a->kwn[k]);
    }
    buf mb = {0};
    int ctl = r->ctl;
    exec_body(r, ms, m->b, &mb);
    r->ctl = ctl;
    r->mdepth--;
    return buf_val(&mb);
}

static void exec_stmt(render *r, scope *s, const jj_node *n, buf *b)
{
    r->at = n;
    switch (n->kind) {
    case N_TEXT: buf_add(r, b, n->str, n->slen); break;
    case N_OUT: {
        jj_val v = eval(r, s, n->a);
        r->at = n;
        to_str(r, b, &v);
        break;
    }
    case N_IF: {
        jj_val c = eval(r, s, n->a);
        if (truthy(&c))
            exec_body(r, s, n->b, b);
        else if (n->c)
            n->c->kind == N_IF ? exec_stmt(r, s, n->c, b) : exec_body(r, s, n->c, b);
        break;
    }
    case N_FOR: exec_for(r, s, n, b); break;
    case N_SET: {
        jj_val v = eval(r, s, n->a);
        r->at = n;
        if (n->op == '.') {
            jj_val ns = scope_get(s, n->names[0]);
            if (ns.t != JV_NS)
                FAIL(r, n, "'set %s.%s': only namespace() objects take attributes", n->names[0], n->names[1]);
            dict_set_s(r, ns.u.d, n->names[1], v);
        } else {
            assign_targets(r, s, n, &v);
        }
        break;
    }
    case N_SETBLOCK: {
        buf sb = {0};
        exec_body(r, s, n->b, &sb);
        scope_set(r, s, n->names[0], buf_val(&sb));
        break;
    }
    case N_MACRO: {
        /* the node keeps no render state: a per-render copy holds the scope */
        jj_node *m = jj_alloc(r->a, sizeof(*m));
        *m = *n;
        m->a = (jj_node *)(void *)s;
        jj_val v = {.t = JV_MACRO};
        v.u.m = m;
        scope_set(r, s, n->str, v);
        break;
    }
    case N_BREAK: r->ctl = 1; break;
    case N_CONTINUE: r->ctl = 2; break;
    case N_GEN: {
        size_t start = b->n;
        exec_body(r, s, n->b, b);
        if (b == r->out) {
            if (r->ngen == r->gencap) {
                size_t cap = r->gencap ? r->gencap * 2 : 16;
                jinja_span *g = jj_alloc(r->a, cap * sizeof(*g));
                if (r->ngen)
                    memcpy(g, r->gen, r->ngen * sizeof(*g));
                r->gen = g;
                r->gencap = cap;
            }
            r->gen[r->ngen].start = start;
            r->gen[r->ngen++].end = b->n;
        }
        break;
    }
    case N_FILTERBLOCK: {
        buf fb = {0};
        exec_body(r, s, n->b, &fb);
        args a = eval_args(r, s, n);
        jj_val v = buf_val(&fb);
        jj_val o = apply_filter(r, s, n, n->str, &v, &a);
        to_str(r, b, &o);
        break;
    }
    default: FAIL(r, n, "internal: unknown statement");
    }
}

static void exec_body(render *r, scope *s, const jj_node *body, buf *b)
{
    for (int i = 0; i < body->nkids && !r->ctl; i++)
        exec_stmt(r, s, body->kids[i], b);
}

/* ---- JSON in -------------------------------------------------------- */

static jj_val from_json(render *r, json_t *j, int depth)
{
    if (depth > 64)
        jj_fail(r->a, 0, 0, "template variables nested deeper than 64");
    switch (json_typeof(j)) {
    case JSON_NULL: return NONE;
    case JSON_TRUE: return mk_bool(1);
    case JSON_FALSE: return mk_bool(0);
    case JSON_INTEGER: return mk_int((int64_t)json_integer_value(j));
    case JSON_REAL: return mk_float(json_real_value(j));
    case JSON_STRING: return mk_str(json_string_value(j), json_string_length(j));
    case JSON_ARRAY: {
        jj_list *l = list_new(r, json_array_size(j));
        size_t i;
        json_t *x;
        json_array_foreach(j, i, x) list_push(r, l, from_json(r, x, depth + 1));
        return mk_list(l);
    }
    case JSON_OBJECT: {
        jj_dict *d = dict_new(r);
        const char *k;
        json_t *x;
        json_object_foreach(j, k, x) dict_set_s(r, d, k, from_json(r, x, depth + 1));
        return mk_dict(d);
    }
    }
    return NONE;
}

int jinja_render(const jinja_template *t, json_t *vars, const jinja_limits *lim, jinja_output *out,
                 acc_err *err)
{
    memset(out, 0, sizeof(*out));
    jj_arena arena = {0};
    jmp_buf jb;
    arena.fail = &jb;
    arena.err = err;
    arena.field = t->field;
    arena.limit = lim && lim->max_memory ? lim->max_memory : 256u << 20;
    buf ob = {0};
    render r = {.a = &arena, .out = &ob};
    r.max_output = lim && lim->max_output ? lim->max_output : 16u << 20;
    r.max_steps = lim && lim->max_steps ? lim->max_steps : 10000000;
    r.max_depth = lim && lim->max_depth ? lim->max_depth : 64;
    if (setjmp(jb)) {
        jj_arena_free(&arena);
        return err ? err->code : ACC_EINVAL;
    }
    scope *g = scope_new(&r, NULL);
    if (vars) {
        if (!json_is_object(vars))
            jj_fail(&arena, 0, 0, "template variables must be an object");
        const char *k;
        json_t *x;
        json_object_foreach(vars, k, x) scope_set(&r, g, k, from_json(&r, x, 0));
    }
    exec_body(&r, g, t->root, &ob);
    out->text = malloc(ob.n + 1);
    out->gen = malloc((r.ngen ? r.ngen : 1) * sizeof(jinja_span));
    if (!out->text || !out->gen) {
        free(out->text);
        free(out->gen);
        memset(out, 0, sizeof(*out));
        jj_arena_free(&arena);
        return acc_err_set(err, ACC_ENOMEM, t->field, "out of memory");
    }
    if (ob.n)
        memcpy(out->text, ob.s, ob.n);
    out->text[ob.n] = 0;
    out->len = ob.n;
    if (r.ngen)
        memcpy(out->gen, r.gen, r.ngen * sizeof(jinja_span));
    out->ngen = r.ngen;
    jj_arena_free(&arena);
    return 0;
}

void jinja_output_free(jinja_output *o)
{
    free(o->text);
    free(o->gen);
    memset(o, 0, sizeof(*o));
}
