/* jinja_eval: rendering a parsed template (jinja.h): scopes, expressions,
 * statements and the entry point. Values are jinja_value.c; methods,
 * filters and tests jinja_builtins.c. Everything of one render lives in its
 * arena. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jinja_internal.h"

/* ---- scopes --------------------------------------------------------- */

static jj_scope *scope_new(jj_render *r, jj_scope *parent)
{
    jj_scope *s = jj_alloc(r->a, sizeof(*s));
    memset(s, 0, sizeof(*s));
    s->parent = parent;
    return s;
}

static void scope_set(jj_render *r, jj_scope *s, const char *name, jj_val v)
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

static const char *const builtin_funcs[] = {"namespace", "raise_exception", "strftime_now", "range", "dict",
                                            NULL};

static jj_val scope_get(jj_scope *s, const char *name)
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
    return JJ_UNDEF;
}

/* ---- evaluation ----------------------------------------------------- */

static jj_val eval(jj_render *r, jj_scope *s, const jj_node *n);
static void exec_body(jj_render *r, jj_scope *s, const jj_node *body, jj_buf *b);

void jj_step(jj_render *r, const jj_node *n)
{
    if (++r->steps > r->max_steps)
        FAIL(r, n, "template exceeds its bound of %ld loop iterations and calls", r->max_steps);
}

static jj_args eval_args(jj_render *r, jj_scope *s, const jj_node *n)
{
    jj_args a = {0};
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
const jj_val *jj_arg(const jj_args *a, int i, const char *name)
{
    if (i >= 0 && i < a->npos)
        return &a->pos[i];
    for (int k = 0; k < a->nkw; k++)
        if (name && !strcmp(a->kwn[k], name))
            return &a->kw[k];
    return NULL;
}

void jj_check_args(jj_render *r, const jj_node *n, const jj_args *a, int maxpos, const char *const *kw,
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

const char *jj_want_str(jj_render *r, const jj_node *n, const jj_val *v, const char *what, size_t *len)
{
    if (v->t != JV_STR)
        FAIL(r, n, "%s needs a string, got %s", what, jj_type_name(v));
    *len = v->u.s.n;
    return v->u.s.s;
}

/* obj.name: Python's getattr first (methods, namespace attributes), then
 * obj['name'], as Jinja2 does. */
static jj_val getattr_(jj_render *r, const jj_node *n, const jj_val *obj, const char *name)
{
    if (obj->t == JV_UNDEF)
        FAIL(r, n, "'%s' of an undefined value", name);
    if (obj->t == JV_NS) {
        jj_val *p = jj_dict_find_s(obj->u.d, name);
        return p ? *p : JJ_UNDEF;
    }
    jj_val m = jj_method_get(r, n, obj, name);
    if (m.t != JV_UNDEF)
        return m;
    if (obj->t == JV_DICT) {
        jj_val *p = jj_dict_find_s(obj->u.d, name);
        return p ? *p : JJ_UNDEF;
    }
    return JJ_UNDEF;
}

static int64_t norm_index(int64_t i, size_t n, int *ok)
{
    if (i < 0)
        i += (int64_t)n;
    *ok = i >= 0 && (uint64_t)i < n;
    return i;
}

jj_val jj_getitem(jj_render *r, const jj_node *n, const jj_val *obj, const jj_val *key)
{
    int ok;
    switch (obj->t) {
    case JV_UNDEF: FAIL(r, n, "subscript of an undefined value");
    case JV_DICT: {
        jj_val *p = jj_dict_find(obj->u.d, key);
        if (p)
            return *p;
        if (key->t == JV_STR) {
            char *k = jj_strndup(r->a, key->u.s.s, key->u.s.n);
            return getattr_(r, n, obj, k);
        }
        return JJ_UNDEF;
    }
    case JV_NS:
        if (key->t == JV_STR) {
            jj_val *p = jj_dict_find(obj->u.d, key);
            return p ? *p : JJ_UNDEF;
        }
        return JJ_UNDEF;
    case JV_LIST:
        if (key->t == JV_INT || key->t == JV_BOOL) {
            int64_t i = norm_index(jj_inum(key), obj->u.l->n, &ok);
            return ok ? obj->u.l->v[i] : JJ_UNDEF;
        }
        if (key->t == JV_STR)
            return getattr_(r, n, obj, jj_strndup(r->a, key->u.s.s, key->u.s.n));
        FAIL(r, n, "list indices must be integers, got %s", jj_type_name(key));
    case JV_STR:
        if (key->t == JV_INT || key->t == JV_BOOL) {
            size_t c;
            size_t *off = jj_u8_offsets(r, obj->u.s.s, obj->u.s.n, &c);
            int64_t i = norm_index(jj_inum(key), c, &ok);
            return ok ? jj_mk_str(obj->u.s.s + off[i], off[i + 1] - off[i]) : JJ_UNDEF;
        }
        if (key->t == JV_STR)
            return getattr_(r, n, obj, jj_strndup(r->a, key->u.s.s, key->u.s.n));
        FAIL(r, n, "string indices must be integers, got %s", jj_type_name(key));
    default: return JJ_UNDEF;
    }
}

/* Python slice indices for length n (step != 0). */
static void slice_idx(int64_t n, const jj_val *a, const jj_val *b, int64_t step, int64_t *start,
                      int64_t *stop)
{
    int64_t lo = step > 0 ? 0 : -1, hi = step > 0 ? n : n - 1;
    if (!a || a->t == JV_NONE) {
        *start = step > 0 ? lo : hi;
    } else {
        int64_t v = jj_inum(a);
        if (v < 0) {
            v += n;
            if (v < lo)
                v = lo;
        } else if (v > hi)
            v = hi;
        *start = v;
    }
    if (!b || b->t == JV_NONE) {
        *stop = step > 0 ? hi : lo;
    } else {
        int64_t v = jj_inum(b);
        if (v < 0) {
            v += n;
            if (v < lo)
                v = lo;
        } else if (v > hi)
            v = hi;
        *stop = v;
    }
}

jj_val jj_do_slice(jj_render *r, const jj_node *n, const jj_val *obj, const jj_val *a, const jj_val *b,
                   const jj_val *c)
{
    const jj_val *chk[3] = {a, b, c};
    for (int i = 0; i < 3; i++)
        if (chk[i] && chk[i]->t != JV_NONE && chk[i]->t != JV_INT && chk[i]->t != JV_BOOL)
            FAIL(r, n, "slice indices must be integers or None");
    int64_t st = c && c->t != JV_NONE ? jj_inum(c) : 1;
    if (st == 0)
        FAIL(r, n, "slice step cannot be zero");
    int64_t len;
    size_t *off = NULL;
    if (obj->t == JV_LIST) {
        len = (int64_t)obj->u.l->n;
    } else if (obj->t == JV_STR) {
        size_t cnt;
        off = jj_u8_offsets(r, obj->u.s.s, obj->u.s.n, &cnt);
        len = (int64_t)cnt;
    } else {
        FAIL(r, n, "slicing a %s is not supported", jj_type_name(obj));
    }
    int64_t start, stop;
    slice_idx(len, a, b, st, &start, &stop);
    jj_list *l = obj->t == JV_LIST ? jj_list_new(r, 0) : NULL;
    jj_buf sb = {0};
    for (int64_t i = start; st > 0 ? i < stop : i > stop; i += st) {
        if (l)
            jj_list_push(r, l, obj->u.l->v[i]);
        else
            jj_buf_add(r, &sb, obj->u.s.s + off[i], off[i + 1] - off[i]);
    }
    if (l) {
        jj_val v = jj_mk_list(l);
        v.tuple = obj->tuple;
        return v;
    }
    return jj_buf_val(&sb);
}

int jj_contains(jj_render *r, const jj_node *n, const jj_val *item, const jj_val *coll)
{
    switch (coll->t) {
    case JV_STR:
        if (item->t != JV_STR)
            FAIL(r, n, "'in <string>' requires a string as left operand, not %s", jj_type_name(item));
        if (item->u.s.n == 0)
            return 1;
        return jj_find(r->a, coll->u.s.s, coll->u.s.n, 0, item->u.s.s, item->u.s.n) >= 0;
    case JV_LIST:
        jj_work(r->a, 1 + coll->u.l->n / 64);
        for (size_t i = 0; i < coll->u.l->n; i++)
            if (jj_val_eq(&coll->u.l->v[i], item))
                return 1;
        return 0;
    case JV_DICT:
    case JV_NS: return jj_dict_find(coll->u.d, item) != NULL;
    case JV_UNDEF: FAIL(r, n, "'in' an undefined value");
    default: FAIL(r, n, "'in' a %s is not supported", jj_type_name(coll));
    }
}

static jj_val arith(jj_render *r, const jj_node *n, int op, const jj_val *a, const jj_val *b)
{
    if (op == '~') {
        jj_buf sb = {0};
        jj_to_str(r, &sb, a);
        jj_to_str(r, &sb, b);
        return jj_buf_val(&sb);
    }
    if (a->t == JV_UNDEF || b->t == JV_UNDEF)
        FAIL(r, n, "operator '%s' on an undefined value",
             op == 'F'   ? "//"
             : op == 'P' ? "**"
                         : (char[]){(char)op, 0});
    if (op == '+' && a->t == JV_STR && b->t == JV_STR) {
        jj_buf sb = {0};
        jj_buf_add(r, &sb, a->u.s.s, a->u.s.n);
        jj_buf_add(r, &sb, b->u.s.s, b->u.s.n);
        return jj_buf_val(&sb);
    }
    if (op == '+' && a->t == JV_LIST && b->t == JV_LIST) {
        jj_list *l = jj_list_new(r, a->u.l->n + b->u.l->n);
        for (size_t i = 0; i < a->u.l->n; i++)
            jj_list_push(r, l, a->u.l->v[i]);
        for (size_t i = 0; i < b->u.l->n; i++)
            jj_list_push(r, l, b->u.l->v[i]);
        return jj_mk_list(l);
    }
    if (op == '*' && ((a->t == JV_STR && (b->t == JV_INT || b->t == JV_BOOL)) ||
                      (b->t == JV_STR && (a->t == JV_INT || a->t == JV_BOOL)))) {
        const jj_val *s = a->t == JV_STR ? a : b;
        int64_t k = a->t == JV_STR ? jj_inum(b) : jj_inum(a);
        jj_buf sb = {0};
        if (s->u.s.n == 0 || k <= 0)
            return jj_mk_str("", 0);
        if ((uint64_t)k > r->max_output / s->u.s.n)
            FAIL(r, n, "string repetition exceeds the output bound");
        /* by doubling: log k copies, not k */
        jj_buf_add(r, &sb, s->u.s.s, s->u.s.n);
        size_t want = (size_t)k * s->u.s.n;
        while (sb.n < want) {
            size_t more = sb.n < want - sb.n ? sb.n : want - sb.n;
            jj_buf_add(r, &sb, sb.s, more);
        }
        return jj_buf_val(&sb);
    }
    if (!jj_is_num(a) || !jj_is_num(b))
        FAIL(r, n, "unsupported operand types for '%s': %s and %s",
             op == 'F'   ? "//"
             : op == 'P' ? "**"
                         : (char[]){(char)op, 0},
             jj_type_name(a), jj_type_name(b));
    int fl = a->t == JV_FLOAT || b->t == JV_FLOAT;
    if (op == '/') {
        if (jj_num(b) == 0)
            FAIL(r, n, "division by zero");
        return jj_mk_float(jj_num(a) / jj_num(b));
    }
    if (fl) {
        double x = jj_num(a), y = jj_num(b);
        switch (op) {
        case '+': return jj_mk_float(x + y);
        case '-': return jj_mk_float(x - y);
        case '*': return jj_mk_float(x * y);
        case 'P': return jj_mk_float(pow(x, y));
        case 'F':
        case '%':
            if (y == 0)
                FAIL(r, n, "division by zero");
            if (op == 'F')
                return jj_mk_float(floor(x / y));
            {
                double m = fmod(x, y);
                if (m != 0 && ((m < 0) != (y < 0)))
                    m += y;
                return jj_mk_float(m);
            }
        }
    }
    int64_t x = jj_inum(a), y = jj_inum(b), z;
    switch (op) {
    case '+':
        if (__builtin_add_overflow(x, y, &z))
            goto ovf;
        return jj_mk_int(z);
    case '-':
        if (__builtin_sub_overflow(x, y, &z))
            goto ovf;
        return jj_mk_int(z);
    case '*':
        if (__builtin_mul_overflow(x, y, &z))
            goto ovf;
        return jj_mk_int(z);
    case 'F':
    case '%': {
        if (y == 0)
            FAIL(r, n, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1)
            goto ovf;
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
            q--;
            m += y;
        }
        return jj_mk_int(op == 'F' ? q : m);
    }
    case 'P': {
        if (y < 0)
            return jj_mk_float(pow((double)x, (double)y));
        if (x == 0 || x == 1)
            return jj_mk_int(y == 0 ? 1 : x);
        if (x == -1)
            return jj_mk_int(y % 2 ? -1 : 1);
        int64_t acc = 1;
        for (int64_t i = 0; i < y; i++) /* |x| >= 2 overflows within 64 rounds */
            if (__builtin_mul_overflow(acc, x, &acc))
                goto ovf;
        return jj_mk_int(acc);
    }
    }
ovf:
    FAIL(r, n, "integer overflow (beyond 64 bits is not supported)");
}

jj_val jj_to_list(jj_render *r, const jj_node *n, const jj_val *v)
{
    switch (v->t) {
    case JV_LIST: return *v;
    case JV_DICT: {
        jj_list *l = jj_list_new(r, v->u.d->n);
        for (size_t i = 0; i < v->u.d->n; i++)
            jj_list_push(r, l, v->u.d->k[i]);
        return jj_mk_list(l);
    }
    case JV_STR: {
        jj_list *l = jj_list_new(r, 0);
        uint32_t cp;
        for (size_t i = 0; i < v->u.s.n;) {
            size_t k = jj_u8_next(v->u.s.s, v->u.s.n, i, &cp);
            jj_list_push(r, l, jj_mk_str(v->u.s.s + i, k));
            i += k;
        }
        return jj_mk_list(l);
    }
    case JV_UNDEF: return jj_mk_list(jj_list_new(r, 0));
    default: FAIL(r, n, "a %s is not iterable", jj_type_name(v));
    }
}

/* ---- calls ---------------------------------------------------------- */

static jj_val call_macro(jj_render *r, jj_scope *s, const jj_node *n, const jj_node *m, const jj_args *a);

static jj_val call(jj_render *r, jj_scope *s, const jj_node *n)
{
    jj_val fn = eval(r, s, n->a);
    jj_args a = eval_args(r, s, n);
    r->at = n;
    switch (fn.t) {
    case JV_METHOD: return jj_call_method(r, n, fn.u.fn, &a);
    case JV_FUNC: return jj_call_func(r, n, fn.u.s.s, &a);
    case JV_MACRO: return call_macro(r, s, n, fn.u.m, &a);
    case JV_UNDEF:
        if (n->a->kind == E_NAME)
            FAIL(r, n, "'%s' is undefined (function not supported or not defined)", n->a->str);
        if (n->a->kind == E_ATTR)
            FAIL(r, n, "method '%s' is not supported on this value", n->a->str);
        FAIL(r, n, "calling an undefined value");
    default: FAIL(r, n, "a %s is not callable", jj_type_name(&fn));
    }
}

/* ---- expressions ---------------------------------------------------- */

static int compare(jj_render *r, const jj_node *n, const char *op, const jj_val *a, const jj_val *b)
{
    if (!strcmp(op, "=="))
        return jj_val_eq(a, b);
    if (!strcmp(op, "!="))
        return !jj_val_eq(a, b);
    if (!strcmp(op, "in"))
        return jj_contains(r, n, a, b);
    if (!strcmp(op, "notin"))
        return !jj_contains(r, n, a, b);
    if (a->t == JV_UNDEF || b->t == JV_UNDEF)
        FAIL(r, n, "'%s' with an undefined value", op);
    if (!((jj_is_num(a) && jj_is_num(b)) || (a->t == JV_STR && b->t == JV_STR) ||
          (a->t == JV_LIST && b->t == JV_LIST)))
        FAIL(r, n, "'%s' not supported between %s and %s", op, jj_type_name(a), jj_type_name(b));
    if (!strcmp(op, "<"))
        return jj_val_lt(r, a, b);
    if (!strcmp(op, ">"))
        return jj_val_lt(r, b, a);
    if (!strcmp(op, "<="))
        return !jj_val_lt(r, b, a);
    return !jj_val_lt(r, a, b);
}

static jj_val eval(jj_render *r, jj_scope *s, const jj_node *n)
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
        v = jj_getitem(r, n, &o, &k);
        break;
    }
    case E_SLICE: {
        jj_val o = eval(r, s, n->a);
        jj_val x = n->b ? eval(r, s, n->b) : JJ_NONE, y = n->c ? eval(r, s, n->c) : JJ_NONE;
        jj_val z = n->d ? eval(r, s, n->d) : JJ_NONE;
        if (o.t == JV_UNDEF)
            FAIL(r, n, "slicing an undefined value");
        v = jj_do_slice(r, n, &o, &x, &y, &z);
        break;
    }
    case E_CALL: v = call(r, s, n); break;
    case E_FILTER: {
        jj_val o = eval(r, s, n->a);
        jj_args a = eval_args(r, s, n);
        r->at = n;
        v = jj_apply_filter(r, s, n, n->str, &o, &a);
        break;
    }
    case E_TEST: {
        jj_val o = eval(r, s, n->a);
        jj_args a = eval_args(r, s, n);
        r->at = n;
        int t = jj_run_test(r, n, n->str, &o, &a);
        v = jj_mk_bool(n->negated ? !t : t);
        break;
    }
    case E_BIN: {
        jj_val a = eval(r, s, n->a), b = eval(r, s, n->b);
        r->at = n;
        v = arith(r, n, n->op, &a, &b);
        break;
    }
    case E_NEG:
    case E_POS: {
        jj_val a = eval(r, s, n->a);
        if (!jj_is_num(&a))
            FAIL(r, n, "bad operand type for unary %c: %s", n->kind == E_NEG ? '-' : '+', jj_type_name(&a));
        if (n->kind == E_POS)
            v = a.t == JV_BOOL ? jj_mk_int(a.u.b) : a;
        else if (a.t == JV_FLOAT)
            v = jj_mk_float(-a.u.f);
        else if (jj_inum(&a) == INT64_MIN)
            FAIL(r, n, "integer overflow");
        else
            v = jj_mk_int(-jj_inum(&a));
        break;
    }
    case E_NOT: {
        jj_val a = eval(r, s, n->a);
        v = jj_mk_bool(!jj_truthy(&a));
        break;
    }
    case E_AND: {
        v = eval(r, s, n->a);
        if (jj_truthy(&v))
            v = eval(r, s, n->b);
        break;
    }
    case E_OR: {
        v = eval(r, s, n->a);
        if (!jj_truthy(&v))
            v = eval(r, s, n->b);
        break;
    }
    case E_CMP: {
        jj_val a = eval(r, s, n->a);
        v = jj_mk_bool(1);
        for (int i = 0; i < n->nkids; i++) {
            jj_val b = eval(r, s, n->kids[i]);
            r->at = n;
            if (!compare(r, n, n->names[i], &a, &b)) {
                v = jj_mk_bool(0);
                break;
            }
            a = b;
        }
        break;
    }
    case E_COND: {
        jj_val c = eval(r, s, n->a);
        v = jj_truthy(&c) ? eval(r, s, n->b) : n->c ? eval(r, s, n->c) : JJ_UNDEF;
        break;
    }
    case E_LIST:
    case E_TUPLE: {
        jj_list *l = jj_list_new(r, (size_t)n->nkids);
        for (int i = 0; i < n->nkids; i++)
            jj_list_push(r, l, eval(r, s, n->kids[i]));
        v = jj_mk_list(l);
        v.tuple = n->kind == E_TUPLE;
        break;
    }
    case E_DICT: {
        jj_dict *d = jj_dict_new(r);
        for (int i = 0; i < n->nkids; i++) {
            jj_val k = eval(r, s, n->kids[i]);
            if (k.t != JV_STR && k.t != JV_INT && k.t != JV_BOOL && k.t != JV_NONE && k.t != JV_FLOAT)
                FAIL(r, n->kids[i], "a %s as a dict key is not supported", jj_type_name(&k));
            jj_dict_set(r, d, k, eval(r, s, n->kids2[i]));
        }
        v = jj_mk_dict(d);
        break;
    }
    default: FAIL(r, n, "internal: unknown expression");
    }
    r->depth--;
    return v;
}

/* ---- statements ----------------------------------------------------- */

static void assign_targets(jj_render *r, jj_scope *s, const jj_node *n, const jj_val *v)
{
    if (n->nnames == 1) {
        scope_set(r, s, n->names[0], *v);
        return;
    }
    jj_val l = *v;
    if (l.t != JV_LIST)
        FAIL(r, n, "cannot unpack a %s into %d names", jj_type_name(v), n->nnames);
    if ((int)l.u.l->n != n->nnames)
        FAIL(r, n, "cannot unpack %zu values into %d names", l.u.l->n, n->nnames);
    for (int i = 0; i < n->nnames; i++)
        scope_set(r, s, n->names[i], l.u.l->v[i]);
}

static void exec_for(jj_render *r, jj_scope *s, const jj_node *n, jj_buf *b)
{
    jj_val it = eval(r, s, n->a);
    r->at = n;
    jj_val l = jj_to_list(r, n, &it);
    jj_list *items = l.u.l;
    if (n->d) { /* `for x in xs if cond`: filtered first, loop.* counts what is left */
        jj_list *f = jj_list_new(r, items->n);
        for (size_t i = 0; i < items->n; i++) {
            jj_scope *fs = scope_new(r, s);
            assign_targets(r, fs, n, &items->v[i]);
            jj_val c = eval(r, fs, n->d);
            if (jj_truthy(&c))
                jj_list_push(r, f, items->v[i]);
        }
        items = f;
    }
    if (!items->n) {
        if (n->c)
            exec_body(r, s, n->c, b);
        return;
    }
    jj_dict *loop = jj_dict_new(r);
    int64_t len = (int64_t)items->n;
    for (size_t i = 0; i < items->n; i++) {
        jj_step(r, n);
        jj_scope *ls = scope_new(r, s);
        int64_t k = (int64_t)i;
        jj_dict_set_s(r, loop, "index0", jj_mk_int(k));
        jj_dict_set_s(r, loop, "index", jj_mk_int(k + 1));
        jj_dict_set_s(r, loop, "revindex", jj_mk_int(len - k));
        jj_dict_set_s(r, loop, "revindex0", jj_mk_int(len - k - 1));
        jj_dict_set_s(r, loop, "first", jj_mk_bool(k == 0));
        jj_dict_set_s(r, loop, "last", jj_mk_bool(k == len - 1));
        jj_dict_set_s(r, loop, "length", jj_mk_int(len));
        jj_dict_set_s(r, loop, "depth", jj_mk_int(1));
        jj_dict_set_s(r, loop, "depth0", jj_mk_int(0));
        jj_dict_set_s(r, loop, "previtem", k > 0 ? items->v[i - 1] : JJ_UNDEF);
        jj_dict_set_s(r, loop, "nextitem", k < len - 1 ? items->v[i + 1] : JJ_UNDEF);
        /* a fresh loop object per iteration: a template may keep one */
        jj_dict *snap = jj_dict_new(r);
        for (size_t q = 0; q < loop->n; q++)
            jj_dict_set(r, snap, loop->k[q], loop->v[q]);
        scope_set(r, ls, "loop", jj_mk_dict(snap));
        assign_targets(r, ls, n, &items->v[i]);
        exec_body(r, ls, n->b, b);
        if (r->ctl == 1) {
            r->ctl = 0;
            break;
        }
        r->ctl = 0;
    }
}

static jj_val call_macro(jj_render *r, jj_scope *s, const jj_node *n, const jj_node *m, const jj_args *a)
{
    (void)s;
    jj_step(r, n);
    if (++r->mdepth > r->max_depth)
        FAIL(r, n, "macro calls nested deeper than %d", r->max_depth);
    if (a->npos > m->nnames)
        FAIL(r, n, "macro '%s' takes %d arguments, got %d", m->str, m->nnames, a->npos);
    jj_scope *ms = scope_new(r, (jj_scope *)m->a); /* the jj_scope it was defined in */
    for (int i = 0; i < m->nnames; i++) {
        const jj_val *v = jj_arg(a, i, m->names[i]);
        if (v)
            scope_set(r, ms, m->names[i], *v);
        else if (m->kids2[i])
            scope_set(r, ms, m->names[i], eval(r, ms, m->kids2[i]));
        else
            scope_set(r, ms, m->names[i], JJ_UNDEF);
    }
    for (int k = 0; k < a->nkw; k++) {
        int ok = 0;
        for (int i = 0; i < m->nnames; i++)
            if (!strcmp(a->kwn[k], m->names[i]))
                ok = 1;
        if (!ok)
            FAIL(r, n, "macro '%s' has no argument '%s'", m->str, a->kwn[k]);
    }
    jj_buf mb = {0};
    int ctl = r->ctl;
    exec_body(r, ms, m->b, &mb);
    r->ctl = ctl;
    r->mdepth--;
    return jj_buf_val(&mb);
}

static void exec_stmt(jj_render *r, jj_scope *s, const jj_node *n, jj_buf *b)
{
    r->at = n;
    switch (n->kind) {
    case N_TEXT: jj_buf_add(r, b, n->str, n->slen); break;
    case N_OUT: {
        jj_val v = eval(r, s, n->a);
        r->at = n;
        jj_to_str(r, b, &v);
        break;
    }
    case N_IF: {
        jj_val c = eval(r, s, n->a);
        if (jj_truthy(&c))
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
            jj_dict_set_s(r, ns.u.d, n->names[1], v);
        } else {
            assign_targets(r, s, n, &v);
        }
        break;
    }
    case N_SETBLOCK: {
        jj_buf sb = {0};
        exec_body(r, s, n->b, &sb);
        scope_set(r, s, n->names[0], jj_buf_val(&sb));
        break;
    }
    case N_MACRO: {
        /* the node keeps no jj_render state: a per-jj_render copy holds the jj_scope */
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
        jj_buf fb = {0};
        exec_body(r, s, n->b, &fb);
        jj_args a = eval_args(r, s, n);
        jj_val v = jj_buf_val(&fb);
        jj_val o = jj_apply_filter(r, s, n, n->str, &v, &a);
        jj_to_str(r, b, &o);
        break;
    }
    default: FAIL(r, n, "internal: unknown statement");
    }
}

static void exec_body(jj_render *r, jj_scope *s, const jj_node *body, jj_buf *b)
{
    for (int i = 0; i < body->nkids && !r->ctl; i++)
        exec_stmt(r, s, body->kids[i], b);
}

/* ---- JSON in -------------------------------------------------------- */

static jj_val from_json(jj_render *r, json_t *j, int depth)
{
    if (depth > 64)
        jj_fail(r->a, 0, 0, "template variables nested deeper than 64");
    switch (json_typeof(j)) {
    case JSON_NULL: return JJ_NONE;
    case JSON_TRUE: return jj_mk_bool(1);
    case JSON_FALSE: return jj_mk_bool(0);
    case JSON_INTEGER: return jj_mk_int((int64_t)json_integer_value(j));
    case JSON_REAL: return jj_mk_float(json_real_value(j));
    case JSON_STRING: return jj_mk_str(json_string_value(j), json_string_length(j));
    case JSON_ARRAY: {
        jj_list *l = jj_list_new(r, json_array_size(j));
        size_t i;
        json_t *x;
        json_array_foreach(j, i, x) jj_list_push(r, l, from_json(r, x, depth + 1));
        return jj_mk_list(l);
    }
    case JSON_OBJECT: {
        jj_dict *d = jj_dict_new(r);
        const char *k;
        json_t *x;
        json_object_foreach(j, k, x) jj_dict_set_s(r, d, k, from_json(r, x, depth + 1));
        return jj_mk_dict(d);
    }
    }
    return JJ_NONE;
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
    arena.deadline_ns = lim ? lim->deadline_ns : 0;
    arena.time_limit_ms = lim ? lim->time_limit_ms : 0;
    jj_buf ob = {0};
    jj_render r = {.a = &arena, .out = &ob};
    r.max_output = lim && lim->max_output ? lim->max_output : 16u << 20;
    r.max_steps = lim && lim->max_steps ? lim->max_steps : 10000000;
    r.max_depth = lim && lim->max_depth ? lim->max_depth : 64;
    if (setjmp(jb)) {
        jj_arena_free(&arena);
        return err ? err->code : ACC_EINVAL;
    }
    jj_scope *g = scope_new(&r, NULL);
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
