/* jinja_value: the values of a render with Python's semantics: buffers,
 * lists and dicts in the render's arena, UTF-8 helpers, printing as str()
 * and repr() do, JSON as transformers' tojson, truth, equality and order
 * (jinja_internal.h). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jinja_internal.h"

jj_val jj_mk_bool(int b)
{
    jj_val v = {.t = JV_BOOL};
    v.u.b = !!b;
    return v;
}
jj_val jj_mk_int(int64_t i)
{
    jj_val v = {.t = JV_INT};
    v.u.i = i;
    return v;
}
jj_val jj_mk_float(double f)
{
    jj_val v = {.t = JV_FLOAT};
    v.u.f = f;
    return v;
}
jj_val jj_mk_str(const char *s, size_t n)
{
    jj_val v = {.t = JV_STR};
    v.u.s.s = s;
    v.u.s.n = n;
    return v;
}

/* ---- buffers -------------------------------------------------------- */

void jj_buf_add(jj_render *r, jj_buf *b, const char *s, size_t n)
{
    if (b == r->out && (n > r->max_output || b->n > r->max_output - n))
        jj_fail(r->a, r->at ? r->at->line : 0, r->at ? r->at->col : 0,
                "output exceeds its bound of %zu bytes", r->max_output);
    jj_work(r->a, 1 + n / 1024); /* string building counts against the deadline */
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

void jj_buf_cstr(jj_render *r, jj_buf *b, const char *s) { jj_buf_add(r, b, s, strlen(s)); }

jj_val jj_buf_val(jj_buf *b) { return b->n ? jj_mk_str(b->s, b->n) : jj_mk_str("", 0); }

/* ---- lists and dicts ------------------------------------------------ */

jj_list *jj_list_new(jj_render *r, size_t cap)
{
    jj_list *l = jj_alloc(r->a, sizeof(*l));
    l->n = 0;
    l->cap = cap ? cap : 4;
    l->v = jj_alloc(r->a, l->cap * sizeof(jj_val));
    return l;
}

void jj_list_push(jj_render *r, jj_list *l, jj_val v)
{
    jj_tick(r->a);
    if (l->n == l->cap) {
        jj_val *nv = jj_alloc(r->a, l->cap * 2 * sizeof(jj_val));
        memcpy(nv, l->v, l->n * sizeof(jj_val));
        l->v = nv;
        l->cap *= 2;
    }
    l->v[l->n++] = v;
}

jj_val jj_mk_list(jj_list *l)
{
    jj_val v = {.t = JV_LIST};
    v.u.l = l;
    return v;
}

jj_dict *jj_dict_new(jj_render *r)
{
    jj_dict *d = jj_alloc(r->a, sizeof(*d));
    d->n = 0;
    d->cap = 4;
    d->k = jj_alloc(r->a, 4 * sizeof(jj_val));
    d->v = jj_alloc(r->a, 4 * sizeof(jj_val));
    return d;
}

jj_val *jj_dict_find(jj_dict *d, const jj_val *k)
{
    for (size_t i = 0; i < d->n; i++)
        if (jj_val_eq(&d->k[i], k))
            return &d->v[i];
    return NULL;
}

jj_val *jj_dict_find_s(jj_dict *d, const char *s)
{
    jj_val k = jj_mk_str(s, strlen(s));
    return jj_dict_find(d, &k);
}

void jj_dict_set(jj_render *r, jj_dict *d, jj_val k, jj_val v)
{
    jj_val *p = jj_dict_find(d, &k);
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

void jj_dict_set_s(jj_render *r, jj_dict *d, const char *k, jj_val v)
{
    jj_dict_set(r, d, jj_mk_str(k, strlen(k)), v);
}

jj_val jj_mk_dict(jj_dict *d)
{
    jj_val v = {.t = JV_DICT};
    v.u.d = d;
    return v;
}

/* ---- UTF-8 ---------------------------------------------------------- */

size_t jj_u8_next(const char *s, size_t n, size_t i, uint32_t *cp)
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

size_t jj_u8_count(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80)
            c++;
    return c;
}

/* Byte offset of each code point, plus the end (n + 1 entries). */
size_t *jj_u8_offsets(jj_render *r, const char *s, size_t n, size_t *count)
{
    size_t c = jj_u8_count(s, n);
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
int jj_py_space(uint32_t c)
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

static void repr(jj_render *r, jj_buf *b, const jj_val *v);

/* str(v) as Python prints it ({{ v }}) */
void jj_to_str(jj_render *r, jj_buf *b, const jj_val *v)
{
    char tmp[64];
    switch (v->t) {
    case JV_UNDEF: break;
    case JV_NONE: jj_buf_cstr(r, b, "None"); break;
    case JV_BOOL: jj_buf_cstr(r, b, v->u.b ? "True" : "False"); break;
    case JV_INT:
        snprintf(tmp, sizeof(tmp), "%lld", (long long)v->u.i);
        jj_buf_cstr(r, b, tmp);
        break;
    case JV_FLOAT:
        fmt_float(tmp, sizeof(tmp), v->u.f);
        jj_buf_cstr(r, b, tmp);
        break;
    case JV_STR: jj_buf_add(r, b, v->u.s.s, v->u.s.n); break;
    case JV_NS: jj_buf_cstr(r, b, "<Namespace>"); break;
    case JV_MACRO:
    case JV_FUNC:
    case JV_METHOD: FAIL(r, r->at, "printing a function is not supported");
    default: repr(r, b, v); break;
    }
}

static void repr_str(jj_render *r, jj_buf *b, const char *s, size_t n)
{
    int sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    jj_buf_add(r, b, &q, 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char tmp[8];
        if (c == '\\')
            jj_buf_cstr(r, b, "\\\\");
        else if (c == (unsigned char)q) {
            tmp[0] = '\\';
            tmp[1] = (char)q;
            jj_buf_add(r, b, tmp, 2);
        } else if (c == '\n')
            jj_buf_cstr(r, b, "\\n");
        else if (c == '\r')
            jj_buf_cstr(r, b, "\\r");
        else if (c == '\t')
            jj_buf_cstr(r, b, "\\t");
        else if (c < 0x20 || c == 0x7F) {
            snprintf(tmp, sizeof(tmp), "\\x%02x", c);
            jj_buf_cstr(r, b, tmp);
        } else
            jj_buf_add(r, b, (const char *)&c, 1);
    }
    jj_buf_add(r, b, &q, 1);
}

static void repr(jj_render *r, jj_buf *b, const jj_val *v)
{
    if (++r->depth > r->max_depth)
        FAIL(r, r->at, "value nested too deeply to print");
    switch (v->t) {
    case JV_STR: repr_str(r, b, v->u.s.s, v->u.s.n); break;
    case JV_LIST:
        jj_buf_cstr(r, b, v->tuple ? "(" : "[");
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i)
                jj_buf_cstr(r, b, ", ");
            repr(r, b, &v->u.l->v[i]);
        }
        if (v->tuple && v->u.l->n == 1)
            jj_buf_cstr(r, b, ",");
        jj_buf_cstr(r, b, v->tuple ? ")" : "]");
        break;
    case JV_DICT:
        jj_buf_cstr(r, b, "{");
        for (size_t i = 0; i < v->u.d->n; i++) {
            if (i)
                jj_buf_cstr(r, b, ", ");
            repr(r, b, &v->u.d->k[i]);
            jj_buf_cstr(r, b, ": ");
            repr(r, b, &v->u.d->v[i]);
        }
        jj_buf_cstr(r, b, "}");
        break;
    case JV_UNDEF: jj_buf_cstr(r, b, "Undefined"); break;
    default: jj_to_str(r, b, v); break;
    }
    r->depth--;
}

jj_val jj_str_of(jj_render *r, const jj_val *v)
{
    if (v->t == JV_STR)
        return *v;
    jj_buf b = {0};
    jj_to_str(r, &b, v);
    return jj_buf_val(&b);
}

/* ---- JSON as transformers' tojson (json.dumps, ensure_ascii=False) --- */

static void json_str(jj_render *r, jj_buf *b, const char *s, size_t n)
{
    jj_buf_cstr(r, b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char tmp[8];
        if (c == '"')
            jj_buf_cstr(r, b, "\\\"");
        else if (c == '\\')
            jj_buf_cstr(r, b, "\\\\");
        else if (c == '\n')
            jj_buf_cstr(r, b, "\\n");
        else if (c == '\r')
            jj_buf_cstr(r, b, "\\r");
        else if (c == '\t')
            jj_buf_cstr(r, b, "\\t");
        else if (c == '\b')
            jj_buf_cstr(r, b, "\\b");
        else if (c == '\f')
            jj_buf_cstr(r, b, "\\f");
        else if (c < 0x20) {
            snprintf(tmp, sizeof(tmp), "\\u%04x", c);
            jj_buf_cstr(r, b, tmp);
        } else
            jj_buf_add(r, b, (const char *)&c, 1);
    }
    jj_buf_cstr(r, b, "\"");
}

static void json_nl(jj_render *r, jj_buf *b, const json_opts *o, int level)
{
    jj_buf_cstr(r, b, "\n");
    for (int i = 0; i < level * o->indent; i++)
        jj_buf_cstr(r, b, " ");
}

void jj_to_json(jj_render *r, jj_buf *b, const jj_val *v, const json_opts *o, int level)
{
    char tmp[64];
    if (++r->depth > r->max_depth)
        FAIL(r, r->at, "value nested too deeply for tojson");
    switch (v->t) {
    case JV_NONE: jj_buf_cstr(r, b, "null"); break;
    case JV_BOOL: jj_buf_cstr(r, b, v->u.b ? "true" : "false"); break;
    case JV_INT:
        snprintf(tmp, sizeof(tmp), "%lld", (long long)v->u.i);
        jj_buf_cstr(r, b, tmp);
        break;
    case JV_FLOAT:
        if (isnan(v->u.f))
            jj_buf_cstr(r, b, "NaN");
        else if (isinf(v->u.f))
            jj_buf_cstr(r, b, v->u.f < 0 ? "-Infinity" : "Infinity");
        else {
            fmt_float(tmp, sizeof(tmp), v->u.f);
            jj_buf_cstr(r, b, tmp);
        }
        break;
    case JV_STR: json_str(r, b, v->u.s.s, v->u.s.n); break;
    case JV_LIST:
        if (!v->u.l->n) {
            jj_buf_cstr(r, b, "[]");
            break;
        }
        jj_buf_cstr(r, b, "[");
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i)
                jj_buf_cstr(r, b, o->item_sep);
            if (o->indent >= 0)
                json_nl(r, b, o, level + 1);
            jj_to_json(r, b, &v->u.l->v[i], o, level + 1);
        }
        if (o->indent >= 0)
            json_nl(r, b, o, level);
        jj_buf_cstr(r, b, "]");
        break;
    case JV_DICT: {
        jj_dict *d = v->u.d;
        if (!d->n) {
            jj_buf_cstr(r, b, "{}");
            break;
        }
        size_t *ord = jj_alloc(r->a, d->n * sizeof(size_t));
        for (size_t i = 0; i < d->n; i++) {
            ord[i] = i;
            if (d->k[i].t != JV_STR)
                FAIL(r, r->at, "tojson of a mapping with a key that is not a string is not supported");
        }
        if (o->sort_keys) /* insertion sort: stable, small dicts */
            for (size_t i = 1; i < d->n; i++)
                for (size_t j = i; j > 0 && jj_val_lt(r, &d->k[ord[j]], &d->k[ord[j - 1]]); j--) {
                    size_t t = ord[j];
                    ord[j] = ord[j - 1];
                    ord[j - 1] = t;
                }
        jj_buf_cstr(r, b, "{");
        for (size_t i = 0; i < d->n; i++) {
            if (i)
                jj_buf_cstr(r, b, o->item_sep);
            if (o->indent >= 0)
                json_nl(r, b, o, level + 1);
            jj_to_json(r, b, &d->k[ord[i]], o, level + 1);
            jj_buf_cstr(r, b, o->key_sep);
            jj_to_json(r, b, &d->v[ord[i]], o, level + 1);
        }
        if (o->indent >= 0)
            json_nl(r, b, o, level);
        jj_buf_cstr(r, b, "}");
        break;
    }
    case JV_UNDEF: FAIL(r, r->at, "tojson of an undefined value");
    default: FAIL(r, r->at, "tojson of a function or namespace is not supported");
    }
    r->depth--;
}

/* ---- truth, equality, order ----------------------------------------- */

int jj_truthy(const jj_val *v)
{
    switch (v->t) {
    case JV_UNDEF:
    case JV_NONE: return 0;
    case JV_BOOL: return v->u.b;
    case JV_INT: return v->u.i != 0;
    case JV_FLOAT: return v->u.f != 0;
    case JV_STR: return v->u.s.n != 0;
    case JV_LIST: return v->u.l->n != 0;
    case JV_DICT: return v->u.d->n != 0;
    default: return 1;
    }
}

int jj_is_num(const jj_val *v) { return v->t == JV_INT || v->t == JV_FLOAT || v->t == JV_BOOL; }
double jj_num(const jj_val *v)
{
    return v->t == JV_FLOAT ? v->u.f : v->t == JV_INT ? (double)v->u.i : v->u.b;
}
int64_t jj_inum(const jj_val *v) { return v->t == JV_INT ? v->u.i : v->u.b; }

int jj_val_eq(const jj_val *a, const jj_val *b)
{
    if (jj_is_num(a) && jj_is_num(b)) {
        if (a->t != JV_FLOAT && b->t != JV_FLOAT)
            return jj_inum(a) == jj_inum(b);
        return jj_num(a) == jj_num(b);
    }
    if (a->t != b->t)
        return 0;
    switch (a->t) {
    case JV_UNDEF:
    case JV_NONE: return 1;
    case JV_STR: return a->u.s.n == b->u.s.n && memcmp(a->u.s.s, b->u.s.s, a->u.s.n) == 0;
    case JV_LIST:
        if (a->u.l->n != b->u.l->n || a->tuple != b->tuple)
            return 0;
        for (size_t i = 0; i < a->u.l->n; i++)
            if (!jj_val_eq(&a->u.l->v[i], &b->u.l->v[i]))
                return 0;
        return 1;
    case JV_DICT:
        if (a->u.d->n != b->u.d->n)
            return 0;
        for (size_t i = 0; i < a->u.d->n; i++) {
            jj_val *o = jj_dict_find(b->u.d, &a->u.d->k[i]);
            if (!o || !jj_val_eq(o, &a->u.d->v[i]))
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
int jj_val_lt(jj_render *r, const jj_val *a, const jj_val *b)
{
    if (jj_is_num(a) && jj_is_num(b)) {
        if (a->t != JV_FLOAT && b->t != JV_FLOAT)
            return jj_inum(a) < jj_inum(b);
        return jj_num(a) < jj_num(b);
    }
    if (a->t == JV_STR && b->t == JV_STR)
        return cmp_str(a, b) < 0;
    if (a->t == JV_LIST && b->t == JV_LIST) {
        for (size_t i = 0; i < a->u.l->n && i < b->u.l->n; i++) {
            if (!jj_val_eq(&a->u.l->v[i], &b->u.l->v[i]))
                return jj_val_lt(r, &a->u.l->v[i], &b->u.l->v[i]);
        }
        return a->u.l->n < b->u.l->n;
    }
    FAIL(r, r->at, "'<' between these types is not supported");
}

const char *jj_type_name(const jj_val *v)
{
    static const char *const n[] = {"undefined", "None", "bool",      "int",   "float",    "str",
                                    "list",      "dict", "namespace", "macro", "function", "method"};
    return v->t == JV_LIST && v->tuple ? "tuple" : n[v->t];
}
