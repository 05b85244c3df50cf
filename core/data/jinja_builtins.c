/* jinja_builtins: the string and dict methods, tests, filters and global
 * functions (raise_exception, namespace, strftime_now, range, dict) chat
 * templates call; a name outside them is refused naming it and its
 * position (jinja_internal.h). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jinja_internal.h"

/* ---- string helpers ------------------------------------------------- */

static int in_chars(uint32_t cp, const jj_val *chars)
{
    if (!chars || chars->t == JV_NONE)
        return jj_py_space(cp);
    uint32_t c;
    for (size_t i = 0; i < chars->u.s.n;) {
        i += jj_u8_next(chars->u.s.s, chars->u.s.n, i, &c);
        if (c == cp)
            return 1;
    }
    return 0;
}

static jj_val do_strip(jj_render *r, const jj_node *n, const jj_val *s, const jj_val *chars, int left,
                       int right)
{
    if (chars && chars->t != JV_NONE && chars->t != JV_STR)
        FAIL(r, n, "strip arg must be None or str");
    size_t b = 0, e = s->u.s.n;
    uint32_t cp;
    if (left)
        while (b < e) {
            size_t k = jj_u8_next(s->u.s.s, e, b, &cp);
            if (!in_chars(cp, chars))
                break;
            b += k;
        }
    if (right)
        while (e > b) {
            size_t p = e - 1;
            while (p > b && ((unsigned char)s->u.s.s[p] & 0xC0) == 0x80)
                p--;
            jj_u8_next(s->u.s.s, e, p, &cp);
            if (!in_chars(cp, chars))
                break;
            e = p;
        }
    return jj_mk_str(s->u.s.s + b, e - b);
}

int jj_is_ws_c(unsigned char c) { return c == ' ' || (c >= 9 && c <= 13); }

static int ascii_alpha(unsigned char c) { return (c | 32) >= 'a' && (c | 32) <= 'z'; }

/* case: 'u' upper, 'l' lower, 'c' capitalize, 't' Python str.title,
 * 'j' Jinja2's title filter. Only ASCII letters change case (see docs). */
jj_val jj_do_case(jj_render *r, const jj_val *s, int mode)
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
        at_word = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || jj_is_ws_c(c);
    }
    o[s->u.s.n] = 0;
    return jj_mk_str(o, s->u.s.n);
}

static jj_val do_replace(jj_render *r, const jj_node *n, const jj_val *s, const jj_val *old,
                         const jj_val *new_, const jj_val *count)
{
    size_t on, nn;
    const char *o = jj_want_str(r, n, old, "replace", &on);
    const char *nw = jj_want_str(r, n, new_, "replace", &nn);
    int64_t max = count && count->t != JV_NONE ? jj_inum(count) : -1;
    jj_buf b = {0};
    size_t i = 0;
    int64_t done = 0;
    if (on == 0) { /* Python inserts `new` between every character */
        uint32_t cp;
        while (i <= s->u.s.n) {
            if (max >= 0 && done >= max) {
                jj_buf_add(r, &b, s->u.s.s + i, s->u.s.n - i);
                break;
            }
            jj_buf_add(r, &b, nw, nn);
            done++;
            if (i == s->u.s.n)
                break;
            size_t k = jj_u8_next(s->u.s.s, s->u.s.n, i, &cp);
            jj_buf_add(r, &b, s->u.s.s + i, k);
            i += k;
        }
        return jj_buf_val(&b);
    }
    while (i < s->u.s.n) {
        int64_t at = max < 0 || done < max ? jj_find(r->a, s->u.s.s, s->u.s.n, i, o, on) : -1;
        if (at < 0)
            break;
        jj_buf_add(r, &b, s->u.s.s + i, (size_t)at - i);
        jj_buf_add(r, &b, nw, nn);
        i = (size_t)at + on;
        done++;
    }
    jj_buf_add(r, &b, s->u.s.s + i, s->u.s.n - i);
    return jj_buf_val(&b);
}

static jj_val do_split(jj_render *r, const jj_node *n, const jj_val *s, const jj_val *sep, const jj_val *maxv)
{
    int64_t max = maxv && maxv->t != JV_NONE ? jj_inum(maxv) : -1;
    jj_list *l = jj_list_new(r, 0);
    const char *p = s->u.s.s;
    size_t len = s->u.s.n;
    if (!sep || sep->t == JV_NONE) { /* runs of whitespace, ends dropped */
        size_t i = 0;
        uint32_t cp;
        int64_t done = 0;
        for (;;) {
            while (i < len) {
                size_t k = jj_u8_next(p, len, i, &cp);
                if (!jj_py_space(cp))
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
                    jj_u8_next(p, len, q, &cp);
                    if (!jj_py_space(cp))
                        break;
                    e = q;
                }
                jj_list_push(r, l, jj_mk_str(p + i, e - i));
                break;
            }
            size_t b = i;
            while (i < len) {
                size_t k = jj_u8_next(p, len, i, &cp);
                if (jj_py_space(cp))
                    break;
                i += k;
            }
            jj_list_push(r, l, jj_mk_str(p + b, i - b));
            done++;
        }
        return jj_mk_list(l);
    }
    size_t sn;
    const char *sp = jj_want_str(r, n, sep, "split", &sn);
    if (sn == 0)
        FAIL(r, n, "split: empty separator");
    size_t b = 0;
    int64_t done = 0;
    while (max < 0 || done < max) {
        int64_t at = jj_find(r->a, p, len, b, sp, sn);
        if (at < 0)
            break;
        jj_list_push(r, l, jj_mk_str(p + b, (size_t)at - b));
        b = (size_t)at + sn;
        done++;
    }
    jj_list_push(r, l, jj_mk_str(p + b, len - b));
    return jj_mk_list(l);
}

static int affix(const jj_val *s, const jj_val *x, int end)
{
    if (x->u.s.n > s->u.s.n)
        return 0;
    const char *p = end ? s->u.s.s + s->u.s.n - x->u.s.n : s->u.s.s;
    return memcmp(p, x->u.s.s, x->u.s.n) == 0;
}

/* ---- methods -------------------------------------------------------- */

static const char *const str_methods[] = {"strip",   "lstrip", "rstrip", "startswith", "endswith",   "split",
                                          "replace", "upper",  "lower",  "title",      "capitalize", "find",
                                          "rfind",   "join",   "count",  "isdigit",    "isspace",    NULL};
static const char *const dict_methods[] = {"items", "keys", "values", "get", NULL};

jj_val jj_method_get(jj_render *r, const jj_node *n, const jj_val *self, const char *name)
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
    return JJ_UNDEF;
}

jj_val jj_dict_items(jj_render *r, jj_dict *d)
{
    jj_list *l = jj_list_new(r, d->n);
    for (size_t i = 0; i < d->n; i++) {
        jj_list *t = jj_list_new(r, 2);
        jj_list_push(r, t, d->k[i]);
        jj_list_push(r, t, d->v[i]);
        jj_val tv = jj_mk_list(t);
        tv.tuple = 1;
        jj_list_push(r, l, tv);
    }
    return jj_mk_list(l);
}

static int64_t str_find(jj_render *r, const jj_val *s, const jj_val *x, int rev)
{
    int64_t found = x->u.s.n == 0 ? (rev ? (int64_t)s->u.s.n : 0) : -1;
    for (int64_t at = 0; x->u.s.n > 0 && at >= 0;) {
        at = jj_find(r->a, s->u.s.s, s->u.s.n, found < 0 ? 0 : (size_t)found + 1, x->u.s.s, x->u.s.n);
        if (at >= 0)
            found = at;
        if (!rev)
            break;
    }
    if (found < 0)
        return -1;
    return (int64_t)jj_u8_count(s->u.s.s, (size_t)found);
}

jj_val jj_call_method(jj_render *r, const jj_node *n, const jj_method *m, const jj_args *a)
{
    const char *nm = m->name;
    const jj_val *self = &m->self;
    if (self->t == JV_DICT) {
        jj_dict *d = self->u.d;
        if (!strcmp(nm, "items")) {
            jj_check_args(r, n, a, 0, NULL, "items()");
            return jj_dict_items(r, d);
        }
        if (!strcmp(nm, "keys") || !strcmp(nm, "values")) {
            jj_check_args(r, n, a, 0, NULL, nm);
            jj_list *l = jj_list_new(r, d->n);
            for (size_t i = 0; i < d->n; i++)
                jj_list_push(r, l, nm[0] == 'k' ? d->k[i] : d->v[i]);
            return jj_mk_list(l);
        }
        /* get */
        jj_check_args(r, n, a, 2, NULL, "get()");
        if (a->npos < 1)
            FAIL(r, n, "get() needs a key");
        jj_val *p = jj_dict_find(d, &a->pos[0]);
        return p ? *p : a->npos > 1 ? a->pos[1] : JJ_NONE;
    }
    static const char *const kw_split[] = {"sep", "maxsplit", NULL};
    if (!strcmp(nm, "strip") || !strcmp(nm, "lstrip") || !strcmp(nm, "rstrip")) {
        jj_check_args(r, n, a, 1, NULL, nm);
        return do_strip(r, n, self, jj_arg(a, 0, NULL), nm[0] != 'r', nm[0] != 'l');
    }
    if (!strcmp(nm, "startswith") || !strcmp(nm, "endswith")) {
        jj_check_args(r, n, a, 1, NULL, nm);
        if (a->npos < 1)
            FAIL(r, n, "%s() needs an argument", nm);
        const jj_val *x = &a->pos[0];
        if (x->t == JV_LIST && x->tuple) {
            for (size_t i = 0; i < x->u.l->n; i++) {
                if (x->u.l->v[i].t != JV_STR)
                    FAIL(r, n, "%s() needs strings", nm);
                if (affix(self, &x->u.l->v[i], nm[0] == 'e'))
                    return jj_mk_bool(1);
            }
            return jj_mk_bool(0);
        }
        if (x->t != JV_STR)
            FAIL(r, n, "%s() needs a string or a tuple of strings, got %s", nm, jj_type_name(x));
        return jj_mk_bool(affix(self, x, nm[0] == 'e'));
    }
    if (!strcmp(nm, "split")) {
        jj_check_args(r, n, a, 2, kw_split, "split()");
        return do_split(r, n, self, jj_arg(a, 0, "sep"), jj_arg(a, 1, "maxsplit"));
    }
    if (!strcmp(nm, "replace")) {
        jj_check_args(r, n, a, 3, NULL, "replace()");
        if (a->npos < 2)
            FAIL(r, n, "replace() needs two arguments");
        return do_replace(r, n, self, &a->pos[0], &a->pos[1], jj_arg(a, 2, NULL));
    }
    if (!strcmp(nm, "upper") || !strcmp(nm, "lower") || !strcmp(nm, "title") || !strcmp(nm, "capitalize")) {
        jj_check_args(r, n, a, 0, NULL, nm);
        return jj_do_case(r, self, nm[0] == 'u' ? 'u' : nm[0] == 'l' ? 'l' : nm[0] == 't' ? 't' : 'c');
    }
    if (!strcmp(nm, "find") || !strcmp(nm, "rfind") || !strcmp(nm, "count")) {
        jj_check_args(r, n, a, 1, NULL, nm);
        if (a->npos < 1 || a->pos[0].t != JV_STR)
            FAIL(r, n, "%s() needs a string", nm);
        if (nm[0] == 'c') {
            int64_t c = 0;
            size_t k = a->pos[0].u.s.n;
            if (k == 0)
                return jj_mk_int((int64_t)jj_u8_count(self->u.s.s, self->u.s.n) + 1);
            for (int64_t at = 0; (at = jj_find(r->a, self->u.s.s, self->u.s.n, (size_t)at, a->pos[0].u.s.s, k)) >= 0;
                 at += (int64_t)k)
                c++;
            return jj_mk_int(c);
        }
        return jj_mk_int(str_find(r, self, &a->pos[0], nm[0] == 'r'));
    }
    if (!strcmp(nm, "isdigit") || !strcmp(nm, "isspace")) {
        jj_check_args(r, n, a, 0, NULL, nm);
        if (!self->u.s.n)
            return jj_mk_bool(0);
        uint32_t cp;
        for (size_t i = 0; i < self->u.s.n;) {
            i += jj_u8_next(self->u.s.s, self->u.s.n, i, &cp);
            if (nm[2] == 'd' ? !(cp >= '0' && cp <= '9') : !jj_py_space(cp))
                return jj_mk_bool(0);
        }
        return jj_mk_bool(1);
    }
    /* join */
    jj_check_args(r, n, a, 1, NULL, "join()");
    if (a->npos < 1)
        FAIL(r, n, "join() needs an iterable");
    jj_val l = jj_to_list(r, n, &a->pos[0]);
    jj_buf b = {0};
    for (size_t i = 0; i < l.u.l->n; i++) {
        if (l.u.l->v[i].t != JV_STR)
            FAIL(r, n, "join(): item %zu is a %s, not a string", i, jj_type_name(&l.u.l->v[i]));
        if (i)
            jj_buf_add(r, &b, self->u.s.s, self->u.s.n);
        jj_buf_add(r, &b, l.u.l->v[i].u.s.s, l.u.l->v[i].u.s.n);
    }
    return jj_buf_val(&b);
}

/* ---- tests ---------------------------------------------------------- */

int jj_run_test(jj_render *r, const jj_node *n, const char *name, const jj_val *v, const jj_args *a)
{
    const jj_val *x = jj_arg(a, 0, NULL);
#define NEEDX()                                                                                              \
    do {                                                                                                     \
        if (!x)                                                                                              \
            FAIL(r, n, "test '%s' needs an argument", name);                                                 \
    } while (0)
    if (!strcmp(name, "defined"))
        return v->t != JV_UNDEF;
    if (!strcmp(name, "undefined"))
        return v->t == JV_UNDEF;
    if (!strcmp(name, "none"))
        return v->t == JV_NONE;
    if (!strcmp(name, "string"))
        return v->t == JV_STR;
    if (!strcmp(name, "number"))
        return jj_is_num(v);
    if (!strcmp(name, "integer"))
        return v->t == JV_INT;
    if (!strcmp(name, "float"))
        return v->t == JV_FLOAT;
    if (!strcmp(name, "boolean"))
        return v->t == JV_BOOL;
    if (!strcmp(name, "true"))
        return v->t == JV_BOOL && v->u.b;
    if (!strcmp(name, "false"))
        return v->t == JV_BOOL && !v->u.b;
    if (!strcmp(name, "mapping"))
        return v->t == JV_DICT;
    if (!strcmp(name, "iterable"))
        return v->t == JV_STR || v->t == JV_LIST || v->t == JV_DICT;
    if (!strcmp(name, "sequence"))
        return v->t == JV_STR || v->t == JV_LIST || v->t == JV_DICT;
    if (!strcmp(name, "callable"))
        return v->t == JV_MACRO || v->t == JV_FUNC || v->t == JV_METHOD;
    if (!strcmp(name, "equalto") || !strcmp(name, "eq") || !strcmp(name, "==") || !strcmp(name, "sameas")) {
        NEEDX();
        return jj_val_eq(v, x);
    }
    if (!strcmp(name, "ne") || !strcmp(name, "!=")) {
        NEEDX();
        return !jj_val_eq(v, x);
    }
    if (!strcmp(name, "lt") || !strcmp(name, "<")) {
        NEEDX();
        return jj_val_lt(r, v, x);
    }
    if (!strcmp(name, "gt") || !strcmp(name, ">")) {
        NEEDX();
        return jj_val_lt(r, x, v);
    }
    if (!strcmp(name, "le") || !strcmp(name, "<=")) {
        NEEDX();
        return !jj_val_lt(r, x, v);
    }
    if (!strcmp(name, "ge") || !strcmp(name, ">=")) {
        NEEDX();
        return !jj_val_lt(r, v, x);
    }
    if (!strcmp(name, "in")) {
        NEEDX();
        return jj_contains(r, n, v, x);
    }
    if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        if (v->t != JV_INT && v->t != JV_BOOL)
            FAIL(r, n, "test '%s' needs an integer, got %s", name, jj_type_name(v));
        int64_t i = jj_inum(v);
        if (name[0] == 'o')
            return (i % 2) != 0;
        if (name[0] == 'e')
            return i % 2 == 0;
        NEEDX();
        if ((x->t != JV_INT && x->t != JV_BOOL) || jj_inum(x) == 0)
            FAIL(r, n, "divisibleby needs a non-zero integer");
        return i % jj_inum(x) == 0;
    }
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        if (v->t != JV_STR)
            return 0;
        jj_val c = jj_do_case(r, v, name[0]);
        return jj_val_eq(&c, v);
    }
#undef NEEDX
    FAIL(r, n, "test '%s' is not supported", name);
}

/* The hash of what jj_val_eq compares (strings already lowered): equal
 * values hash alike (numbers by their double value: 1 == 1.0 == true). */
static uint64_t val_hash(const jj_val *v)
{
    uint64_t h = 1469598103934665603u;
    if (jj_is_num(v)) {
        double d = jj_num(v);
        if (d == 0)
            d = 0; /* -0.0 == 0.0 */
        unsigned char b[sizeof d];
        memcpy(b, &d, sizeof d);
        for (size_t i = 0; i < sizeof b; i++)
            h = (h ^ b[i]) * 1099511628211u;
        return h;
    }
    h = (h ^ (uint64_t)v->t) * 1099511628211u;
    if (v->t == JV_STR)
        for (size_t i = 0; i < v->u.s.n; i++)
            h = (h ^ (unsigned char)v->u.s.s[i]) * 1099511628211u;
    else if (v->t == JV_LIST)
        h = (h ^ v->u.l->n) * 1099511628211u;
    return h;
}

/* Jinja2's unique (case-insensitive for strings, first one kept), with a
 * hash table: linear in the list. */
static jj_val do_unique(jj_render *r, const jj_list *in)
{
    jj_list *out = jj_list_new(r, 0);
    size_t cap = 16;
    while (cap < 2 * in->n)
        cap *= 2;
    jj_val *keys = jj_alloc(r->a, in->n ? in->n * sizeof(*keys) : 1); /* the compared form of out[i] */
    size_t *slot = jj_alloc(r->a, cap * sizeof(*slot));                /* index + 1 into out, 0 = free */
    memset(slot, 0, cap * sizeof(*slot));
    for (size_t i = 0; i < in->n; i++) {
        jj_tick(r->a);
        jj_val x = in->v[i];
        if (x.t == JV_STR)
            x = jj_do_case(r, &x, 'l');
        size_t k = (size_t)val_hash(&x) & (cap - 1);
        int seen = 0;
        for (; slot[k] != 0 && !seen; k = (k + 1) & (cap - 1))
            seen = jj_val_eq(&keys[slot[k] - 1], &x);
        if (seen)
            continue;
        keys[out->n] = x;
        slot[k] = out->n + 1;
        jj_list_push(r, out, in->v[i]);
    }
    return jj_mk_list(out);
}

/* ---- filters -------------------------------------------------------- */

static jj_val attr_path(jj_render *r, const jj_node *n, const jj_val *v, const jj_val *attr)
{
    if (attr->t == JV_INT)
        return jj_getitem(r, n, v, attr);
    size_t len;
    const char *p = jj_want_str(r, n, attr, "attribute", &len);
    jj_val cur = *v;
    size_t b = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i == len || p[i] == '.') {
            jj_val k = jj_mk_str(p + b, i - b);
            int digits = i > b;
            for (size_t q = b; q < i; q++)
                if (p[q] < '0' || p[q] > '9')
                    digits = 0;
            if (digits)
                k = jj_mk_int(strtoll(p + b, NULL, 10));
            cur = cur.t == JV_UNDEF ? JJ_UNDEF : jj_getitem(r, n, &cur, &k);
            b = i + 1;
        }
    }
    return cur;
}

/* sort key comparison: strings case-insensitively unless case_sensitive */
static int sort_lt(jj_render *r, const jj_val *a, const jj_val *b, int cs)
{
    if (!cs && a->t == JV_STR && b->t == JV_STR) {
        jj_val la = jj_do_case(r, a, 'l'), lb = jj_do_case(r, b, 'l');
        return jj_val_lt(r, &la, &lb);
    }
    return jj_val_lt(r, a, b);
}

static void sort_vals(jj_render *r, jj_val *items, jj_val *keys, size_t n, int cs, int rev)
{
    /* stable insertion sort on keys (chat template lists are short) */
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0; j--) {
            jj_tick(r->a);
            int lt = rev ? sort_lt(r, &keys[j - 1], &keys[j], cs) : sort_lt(r, &keys[j], &keys[j - 1], cs);
            if (!lt)
                break;
            jj_val t = keys[j];
            keys[j] = keys[j - 1];
            keys[j - 1] = t;
            t = items[j];
            items[j] = items[j - 1];
            items[j - 1] = t;
        }
}

static jj_val filter_select(jj_render *r, jj_scope *s, const jj_node *n, const char *name, const jj_val *v,
                            const jj_args *a)
{
    int attr = !strcmp(name, "selectattr") || !strcmp(name, "rejectattr");
    int keep = name[0] == 's';
    jj_val l = jj_to_list(r, n, v);
    jj_list *out = jj_list_new(r, 0);
    int first_test = attr ? 1 : 0;
    if (attr && a->npos < 1)
        FAIL(r, n, "filter '%s' needs an attribute", name);
    const char *test = NULL;
    if (a->npos > first_test) {
        size_t len;
        test = jj_strndup(r->a, jj_want_str(r, n, &a->pos[first_test], name, &len), a->pos[first_test].u.s.n);
    }
    jj_args ta = {.pos = a->pos + first_test + 1,
                  .npos = a->npos > first_test + 1 ? a->npos - first_test - 1 : 0};
    (void)s;
    for (size_t i = 0; i < l.u.l->n; i++) {
        jj_val item = l.u.l->v[i];
        jj_val x = attr ? attr_path(r, n, &item, &a->pos[0]) : item;
        int t = test ? jj_run_test(r, n, test, &x, &ta) : jj_truthy(&x);
        if (t == keep)
            jj_list_push(r, out, item);
    }
    return jj_mk_list(out);
}

static void want_args(jj_render *r, const jj_node *n, const jj_args *a, int maxpos, const char *const *kw,
                      const char *name)
{
    char what[80];
    snprintf(what, sizeof(what), "filter '%s'", name);
    jj_check_args(r, n, a, maxpos, kw, what);
}

static jj_val do_indent(jj_render *r, const jj_node *n, const jj_val *v, const jj_args *a)
{
    const jj_val *w = jj_arg(a, 0, "width"), *first = jj_arg(a, 1, "first"), *blank = jj_arg(a, 2, "blank");
    jj_buf pad = {0};
    if (w && w->t == JV_STR) {
        jj_buf_add(r, &pad, w->u.s.s, w->u.s.n);
    } else {
        int64_t k = w ? jj_inum(w) : 4;
        if (k < 0 || k > 4096)
            FAIL(r, n, "indent width %lld is out of range", (long long)k);
        for (int64_t i = 0; i < k; i++)
            jj_buf_cstr(r, &pad, " ");
    }
    jj_val sv = jj_str_of(r, v);
    jj_buf b = {0};
    if (first && jj_truthy(first))
        jj_buf_add(r, &b, pad.s, pad.n);
    /* Jinja2: lines after the first get the indent (blank ones only with blank=True) */
    const char *p = sv.u.s.s;
    size_t len = sv.u.s.n, i = 0;
    int line0 = 1;
    while (i <= len) {
        size_t e = i;
        while (e < len && p[e] != '\n')
            e++;
        if (!line0 && (e > i || (blank && jj_truthy(blank))))
            jj_buf_add(r, &b, pad.s, pad.n);
        jj_buf_add(r, &b, p + i, e - i);
        if (e >= len)
            break;
        jj_buf_cstr(r, &b, "\n");
        i = e + 1;
        line0 = 0;
    }
    return jj_buf_val(&b);
}

jj_val jj_apply_filter(jj_render *r, jj_scope *s, const jj_node *n, const char *name, const jj_val *v,
                       const jj_args *a)
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
        jj_val sv = jj_str_of(r, v);
        return do_strip(r, n, &sv, jj_arg(a, 0, "chars"), 1, 1);
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        want_args(r, n, a, 0, NULL, name);
        switch (v->t) {
        case JV_STR: return jj_mk_int((int64_t)jj_u8_count(v->u.s.s, v->u.s.n));
        case JV_LIST: return jj_mk_int((int64_t)v->u.l->n);
        case JV_DICT:
        case JV_NS: return jj_mk_int((int64_t)v->u.d->n);
        case JV_UNDEF: return jj_mk_int(0);
        default: FAIL(r, n, "filter '%s' of a %s", name, jj_type_name(v));
        }
    }
    if (!strcmp(name, "tojson")) {
        want_args(r, n, a, 1, kw_tojson, name);
        const jj_val *ind = jj_arg(a, 0, "indent"), *sep = jj_arg(a, -1, "separators"),
                     *sk = jj_arg(a, -1, "sort_keys");
        json_opts o = {.indent = -1, .item_sep = ", ", .key_sep = ": "};
        if (ind && ind->t != JV_NONE) {
            if (ind->t != JV_INT || ind->u.i < 0 || ind->u.i > 64)
                FAIL(r, n, "tojson indent must be an integer 0..64");
            o.indent = (int)ind->u.i;
            o.item_sep = ",";
        }
        if (sep && sep->t != JV_NONE) {
            if (sep->t != JV_LIST || sep->u.l->n != 2 || sep->u.l->v[0].t != JV_STR ||
                sep->u.l->v[1].t != JV_STR)
                FAIL(r, n, "tojson separators must be a pair of strings");
            o.item_sep = jj_strndup(r->a, sep->u.l->v[0].u.s.s, sep->u.l->v[0].u.s.n);
            o.key_sep = jj_strndup(r->a, sep->u.l->v[1].u.s.s, sep->u.l->v[1].u.s.n);
        }
        o.sort_keys = sk && jj_truthy(sk);
        const jj_val *ea = jj_arg(a, -1, "ensure_ascii");
        if (ea && jj_truthy(ea))
            FAIL(r, n, "tojson ensure_ascii=True is not supported");
        jj_buf b = {0};
        jj_to_json(r, &b, v, &o, 0);
        return jj_buf_val(&b);
    }
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        want_args(r, n, a, 2, kw_default, name);
        const jj_val *dv = jj_arg(a, 0, "default_value"), *bo = jj_arg(a, 1, "boolean");
        int use = v->t == JV_UNDEF || (bo && jj_truthy(bo) && !jj_truthy(v));
        return use ? (dv ? *dv : jj_mk_str("", 0)) : *v;
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        want_args(r, n, a, 0, NULL, name);
        jj_val l = jj_to_list(r, n, v);
        if (!l.u.l->n)
            return JJ_UNDEF;
        return name[0] == 'f' ? l.u.l->v[0] : l.u.l->v[l.u.l->n - 1];
    }
    if (!strcmp(name, "join")) {
        want_args(r, n, a, 2, kw_join, name);
        const jj_val *d = jj_arg(a, 0, "d"), *at = jj_arg(a, 1, "attribute");
        jj_val l = jj_to_list(r, n, v);
        jj_buf b = {0};
        for (size_t i = 0; i < l.u.l->n; i++) {
            if (i && d)
                jj_to_str(r, &b, d);
            jj_val x = at ? attr_path(r, n, &l.u.l->v[i], at) : l.u.l->v[i];
            jj_to_str(r, &b, &x);
        }
        return jj_buf_val(&b);
    }
    if (!strcmp(name, "lower") || !strcmp(name, "upper") || !strcmp(name, "capitalize") ||
        !strcmp(name, "title")) {
        want_args(r, n, a, 0, NULL, name);
        jj_val sv = jj_str_of(r, v);
        return jj_do_case(r, &sv, name[0] == 'l' ? 'l' : name[0] == 'u' ? 'u' : name[0] == 'c' ? 'c' : 'j');
    }
    if (!strcmp(name, "replace")) {
        want_args(r, n, a, 3, NULL, name);
        if (a->npos < 2)
            FAIL(r, n, "filter 'replace' needs two arguments");
        jj_val sv = jj_str_of(r, v);
        return do_replace(r, n, &sv, &a->pos[0], &a->pos[1], jj_arg(a, 2, NULL));
    }
    if (!strcmp(name, "string")) {
        want_args(r, n, a, 0, NULL, name);
        return jj_str_of(r, v);
    }
    if (!strcmp(name, "safe")) {
        want_args(r, n, a, 0, NULL, name);
        return *v;
    }
    if (!strcmp(name, "int")) {
        want_args(r, n, a, 1, kw_int, name);
        const jj_val *dv = jj_arg(a, 0, "default");
        jj_val d = dv ? *dv : jj_mk_int(0);
        if (v->t == JV_INT)
            return *v;
        if (v->t == JV_BOOL)
            return jj_mk_int(v->u.b);
        if (v->t == JV_FLOAT)
            return isfinite(v->u.f) && fabs(v->u.f) < 9.2e18 ? jj_mk_int((int64_t)v->u.f) : d;
        if (v->t == JV_STR) {
            char *t = jj_strndup(r->a, v->u.s.s, v->u.s.n), *e;
            errno = 0;
            long long x = strtoll(t, &e, 10);
            while (*e && jj_is_ws_c((unsigned char)*e))
                e++;
            if (!*e && e != t && !errno)
                return jj_mk_int(x);
            double f = strtod(t, &e);
            while (*e && jj_is_ws_c((unsigned char)*e))
                e++;
            if (!*e && e != t && isfinite(f) && fabs(f) < 9.2e18)
                return jj_mk_int((int64_t)f);
        }
        return d;
    }
    if (!strcmp(name, "float")) {
        want_args(r, n, a, 1, kw_int, name);
        const jj_val *dv = jj_arg(a, 0, "default");
        if (jj_is_num(v))
            return jj_mk_float(jj_num(v));
        if (v->t == JV_STR) {
            char *t = jj_strndup(r->a, v->u.s.s, v->u.s.n), *e;
            double f = strtod(t, &e);
            while (*e && jj_is_ws_c((unsigned char)*e))
                e++;
            if (!*e && e != t)
                return jj_mk_float(f);
        }
        return dv ? *dv : jj_mk_float(0.0);
    }
    if (!strcmp(name, "list")) {
        want_args(r, n, a, 0, NULL, name);
        jj_val l = jj_to_list(r, n, v);
        jj_list *c = jj_list_new(r, l.u.l->n);
        for (size_t i = 0; i < l.u.l->n; i++)
            jj_list_push(r, c, l.u.l->v[i]);
        return jj_mk_list(c);
    }
    if (!strcmp(name, "map")) {
        jj_val l = jj_to_list(r, n, v);
        jj_list *out = jj_list_new(r, l.u.l->n);
        const jj_val *at = jj_arg(a, -1, "attribute");
        if (at) {
            want_args(r, n, a, 0, kw_map, name);
            const jj_val *dv = jj_arg(a, -1, "default");
            for (size_t i = 0; i < l.u.l->n; i++) {
                jj_val x = attr_path(r, n, &l.u.l->v[i], at);
                jj_list_push(r, out, x.t == JV_UNDEF && dv ? *dv : x);
            }
            return jj_mk_list(out);
        }
        if (a->npos < 1 || a->pos[0].t != JV_STR)
            FAIL(r, n, "filter 'map' needs a filter name or attribute=");
        const char *fname = jj_strndup(r->a, a->pos[0].u.s.s, a->pos[0].u.s.n);
        jj_args fa = {.pos = a->pos + 1, .npos = a->npos - 1, .kwn = a->kwn, .kw = a->kw, .nkw = a->nkw};
        for (size_t i = 0; i < l.u.l->n; i++)
            jj_list_push(r, out, jj_apply_filter(r, s, n, fname, &l.u.l->v[i], &fa));
        return jj_mk_list(out);
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
            jj_val st = jj_mk_int(-1);
            return jj_do_slice(r, n, v, NULL, NULL, &st);
        }
        jj_val l = jj_to_list(r, n, v);
        jj_list *out = jj_list_new(r, l.u.l->n);
        for (size_t i = l.u.l->n; i-- > 0;)
            jj_list_push(r, out, l.u.l->v[i]);
        return jj_mk_list(out);
    }
    if (!strcmp(name, "sort")) {
        want_args(r, n, a, 2, kw_sort, name);
        const jj_val *rev = jj_arg(a, 0, "reverse"), *cs = jj_arg(a, 1, "case_sensitive"),
                     *at = jj_arg(a, -1, "attribute");
        jj_val l = jj_to_list(r, n, v);
        jj_val *items = jj_alloc(r->a, (l.u.l->n + 1) * sizeof(jj_val));
        jj_val *keys = jj_alloc(r->a, (l.u.l->n + 1) * sizeof(jj_val));
        for (size_t i = 0; i < l.u.l->n; i++) {
            items[i] = l.u.l->v[i];
            keys[i] = at ? attr_path(r, n, &items[i], at) : items[i];
        }
        sort_vals(r, items, keys, l.u.l->n, cs && jj_truthy(cs), rev && jj_truthy(rev));
        jj_list *out = jj_list_new(r, l.u.l->n);
        for (size_t i = 0; i < l.u.l->n; i++)
            jj_list_push(r, out, items[i]);
        return jj_mk_list(out);
    }
    if (!strcmp(name, "items")) {
        want_args(r, n, a, 0, NULL, name);
        if (v->t == JV_UNDEF)
            return jj_mk_list(jj_list_new(r, 0));
        if (v->t != JV_DICT)
            FAIL(r, n, "filter 'items' needs a mapping, got %s", jj_type_name(v));
        return jj_dict_items(r, v->u.d);
    }
    if (!strcmp(name, "dictsort")) {
        want_args(r, n, a, 3, kw_dictsort, name);
        if (v->t != JV_DICT)
            FAIL(r, n, "filter 'dictsort' needs a mapping, got %s", jj_type_name(v));
        const jj_val *cs = jj_arg(a, 0, "case_sensitive"), *by = jj_arg(a, 1, "by"),
                     *rev = jj_arg(a, 2, "reverse");
        int byval = 0;
        if (by) {
            size_t len;
            const char *b = jj_want_str(r, n, by, "dictsort by", &len);
            if (len == 5 && !memcmp(b, "value", 5))
                byval = 1;
            else if (!(len == 3 && !memcmp(b, "key", 3)))
                FAIL(r, n, "dictsort: 'by' must be 'key' or 'value'");
        }
        jj_val l = jj_dict_items(r, v->u.d);
        size_t cnt = l.u.l->n;
        jj_val *keys = jj_alloc(r->a, (cnt + 1) * sizeof(jj_val));
        for (size_t i = 0; i < cnt; i++)
            keys[i] = l.u.l->v[i].u.l->v[byval];
        sort_vals(r, l.u.l->v, keys, cnt, cs && jj_truthy(cs), rev && jj_truthy(rev));
        return l;
    }
    if (!strcmp(name, "indent")) {
        want_args(r, n, a, 3, kw_indent, name);
        return do_indent(r, n, v, a);
    }
    if (!strcmp(name, "abs")) {
        want_args(r, n, a, 0, NULL, name);
        if (v->t == JV_INT) {
            if (v->u.i == INT64_MIN)
                FAIL(r, n, "integer overflow");
            return jj_mk_int(v->u.i < 0 ? -v->u.i : v->u.i);
        }
        if (v->t == JV_FLOAT)
            return jj_mk_float(fabs(v->u.f));
        FAIL(r, n, "filter 'abs' of a %s", jj_type_name(v));
    }
    if (!strcmp(name, "unique")) {
        want_args(r, n, a, 0, NULL, name);
        return do_unique(r, jj_to_list(r, n, v).u.l);
    }
    FAIL(r, n, "filter '%s' is not supported", name);
}

/* ---- global functions ----------------------------------------------- */

jj_val jj_call_func(jj_render *r, const jj_node *n, const char *name, const jj_args *a)
{
    if (!strcmp(name, "raise_exception")) {
        jj_val msg = a->npos ? jj_str_of(r, &a->pos[0]) : jj_mk_str("", 0);
        jj_fail(r->a, n->line, n->col, "raise_exception: %.*s", (int)(msg.u.s.n > 300 ? 300 : msg.u.s.n),
                msg.u.s.s);
    }
    if (!strcmp(name, "namespace") || !strcmp(name, "dict")) {
        jj_dict *d = jj_dict_new(r);
        if (a->npos) {
            if (a->npos > 1 || a->pos[0].t != JV_DICT)
                FAIL(r, n, "%s() takes one mapping and keyword arguments", name);
            for (size_t i = 0; i < a->pos[0].u.d->n; i++)
                jj_dict_set(r, d, a->pos[0].u.d->k[i], a->pos[0].u.d->v[i]);
        }
        for (int i = 0; i < a->nkw; i++)
            jj_dict_set_s(r, d, a->kwn[i], a->kw[i]);
        jj_val v = {.t = name[0] == 'n' ? JV_NS : JV_DICT};
        v.u.d = d;
        return v;
    }
    if (!strcmp(name, "strftime_now")) {
        jj_check_args(r, n, a, 1, NULL, "strftime_now()");
        size_t len;
        if (a->npos < 1)
            FAIL(r, n, "strftime_now() needs a format");
        const char *f =
            jj_strndup(r->a, jj_want_str(r, n, &a->pos[0], "strftime_now", &len), a->pos[0].u.s.n);
        time_t now = time(NULL);
        struct tm tm;
        if (!localtime_r(&now, &tm))
            FAIL(r, n, "strftime_now: no local time");
        char *o = jj_alloc(r->a, 512);
        size_t k = strftime(o, 512, f, &tm);
        return jj_mk_str(o, k);
    }
    /* range */
    jj_check_args(r, n, a, 3, NULL, "range()");
    for (int i = 0; i < a->npos; i++)
        if (a->pos[i].t != JV_INT && a->pos[i].t != JV_BOOL)
            FAIL(r, n, "range() needs integers");
    int64_t lo = 0, hi, st = 1;
    if (a->npos == 1)
        hi = jj_inum(&a->pos[0]);
    else if (a->npos >= 2) {
        lo = jj_inum(&a->pos[0]);
        hi = jj_inum(&a->pos[1]);
        if (a->npos == 3)
            st = jj_inum(&a->pos[2]);
    } else
        FAIL(r, n, "range() needs an argument");
    if (st == 0)
        FAIL(r, n, "range() step must not be zero");
    jj_list *l = jj_list_new(r, 0);
    for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) {
        jj_step(r, n);
        jj_list_push(r, l, jj_mk_int(i));
    }
    return jj_mk_list(l);
}
