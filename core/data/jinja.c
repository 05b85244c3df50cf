/* jinja: the arena, the parser and the entry point jinja_parse() (jinja.h).
 * The source's newlines become "\n" and one trailing newline is dropped
 * (Jinja2's keep_trailing_newline False); jinja_lex.c makes the tokens;
 * the parser builds the tree jinja_eval.c renders, with Jinja2's grammar
 * and operator precedence.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "budget.h"
#include "memfind.h"
#include "jinja_internal.h"

#define JJ_BLOCK 65536
#define JJ_MAX_PARSE_DEPTH 200
#define JJ_TICKS_PER_CHECK 256u

struct jj_block {
    jj_block *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

void *jj_alloc(jj_arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    jj_tick(a);
    if (a->limit && (n > a->limit || a->used > a->limit - n))
        jj_fail(a, 0, 0, "template render exceeds its memory bound of %zu bytes", a->limit);
    jj_block *b = a->head;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > JJ_BLOCK ? n : JJ_BLOCK;
        b = malloc(sizeof(*b) + cap);
        if (!b) {
            acc_err_set(a->err, ACC_ENOMEM, a->field, "out of memory in template");
            longjmp(*a->fail, 1);
        }
        b->cap = cap;
        b->used = 0;
        b->next = a->head;
        a->head = b;
    }
    void *p = b->data + b->used;
    b->used += n;
    a->used += n;
    return p;
}

void jj_arena_free(jj_arena *a)
{
    jj_block *b = a->head;
    while (b) {
        jj_block *n = b->next;
        free(b);
        b = n;
    }
    a->head = NULL;
    a->used = 0;
}

char *jj_strndup(jj_arena *a, const char *s, size_t n)
{
    char *p = jj_alloc(a, n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

void jj_work(jj_arena *a, size_t units)
{
    if (a->deadline_ns == 0)
        return;
    unsigned before = a->ticks;
    a->ticks += units > JJ_TICKS_PER_CHECK ? JJ_TICKS_PER_CHECK : (unsigned)units;
    if (a->ticks / JJ_TICKS_PER_CHECK == before / JJ_TICKS_PER_CHECK || !budget_expired(a->deadline_ns))
        return;
    acc_err_set(a->err, ACC_EINVAL, a->field,
                "template rendering exceeds its time limit of %ld ms (render_time_limit_ms)", a->time_limit_ms);
    longjmp(*a->fail, 1);
}

void jj_tick(jj_arena *a)
{
    jj_work(a, 1);
}

int64_t jj_find(jj_arena *a, const char *hay, size_t hn, size_t from, const char *needle, size_t nn)
{
    int64_t at = memfind(hay, hn, from, needle, nn);
    jj_work(a, 1 + ((at < 0 ? hn : (size_t)at) - (from < hn ? from : hn)) / 1024);
    return at;
}

void jj_fail(jj_arena *a, int line, int col, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (line > 0)
        acc_err_set(a->err, ACC_EINVAL, a->field, "template line %d:%d: %s", line, col, msg);
    else
        acc_err_set(a->err, ACC_EINVAL, a->field, "template: %s", msg);
    longjmp(*a->fail, 1);
}

/* ---- parser --------------------------------------------------------- */

typedef struct parser {
    jj_arena *a;
    jj_token *t;
    size_t i, nt;
    int depth;
    int in_loop;
    int has_generation;
} parser;

static jj_token *cur(parser *p)
{
    return &p->t[p->i];
}

static _Noreturn void perr(parser *p, const char *fmt, const char *what)
{
    jj_token *t = cur(p);
    jj_fail(p->a, t->line, t->col, fmt, what);
}

static int is_op(parser *p, const char *op)
{
    jj_token *t = cur(p);
    return t->kind == T_OP && strcmp(t->s, op) == 0;
}

static int is_name(parser *p, const char *name)
{
    jj_token *t = cur(p);
    return t->kind == T_NAME && strcmp(t->s, name) == 0;
}

static const char *tok_desc(jj_token *t)
{
    switch (t->kind) {
    case T_EOF: return "end of template";
    case T_VEND: return "'}}'";
    case T_BEND: return "'%}'";
    case T_NAME: case T_OP: return t->s;
    case T_STR: return "a string";
    case T_INT: case T_FLOAT: return "a number";
    default: return "text";
    }
}

static void expect_op(parser *p, const char *op)
{
    if (!is_op(p, op)) {
        jj_token *t = cur(p);
        jj_fail(p->a, t->line, t->col, "expected '%s', found %s", op, tok_desc(t));
    }
    p->i++;
}

static const char *expect_name(parser *p)
{
    jj_token *t = cur(p);
    if (t->kind != T_NAME)
        jj_fail(p->a, t->line, t->col, "expected a name, found %s", tok_desc(t));
    p->i++;
    return t->s;
}

static jj_node *node(parser *p, int kind)
{
    jj_node *n = jj_alloc(p->a, sizeof(*n));
    memset(n, 0, sizeof(*n));
    n->kind = kind;
    n->line = cur(p)->line;
    n->col = cur(p)->col;
    return n;
}

/* A growable node array while parsing. */
typedef struct nvec {
    jj_node **v;
    int n, cap;
} nvec;

static void nvec_push(parser *p, nvec *v, jj_node *x)
{
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 8;
        jj_node **nv = jj_alloc(p->a, (size_t)cap * sizeof(*nv));
        if (v->n)
            memcpy(nv, v->v, (size_t)v->n * sizeof(*nv));
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

typedef struct svec {
    const char **v;
    int n, cap;
} svec;

static void svec_push(parser *p, svec *v, const char *x)
{
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 8;
        const char **nv = jj_alloc(p->a, (size_t)cap * sizeof(*nv));
        if (v->n)
            memcpy(nv, v->v, (size_t)v->n * sizeof(*nv));
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

static jj_node *parse_expr(parser *p);
static jj_node *parse_or(parser *p);
static jj_node *parse_unary(parser *p, int with_filter);

static void enter(parser *p)
{
    if (++p->depth > JJ_MAX_PARSE_DEPTH)
        perr(p, "%s", "expression nested too deeply");
}

/* Call arguments after '(' : positional then keyword ones. */
static void parse_args(parser *p, jj_node *n)
{
    nvec args = {0}, kw = {0};
    svec names = {0};
    expect_op(p, "(");
    while (!is_op(p, ")")) {
        if (args.n + kw.n)
            expect_op(p, ",");
        if (is_op(p, ")"))
            break;
        if (cur(p)->kind == T_NAME && p->t[p->i + 1].kind == T_OP && strcmp(p->t[p->i + 1].s, "=") == 0) {
            svec_push(p, &names, cur(p)->s);
            p->i += 2;
            nvec_push(p, &kw, parse_expr(p));
        } else {
            if (kw.n)
                perr(p, "%s", "a positional argument after keyword arguments");
            if (is_op(p, "*") || is_op(p, "**"))
                perr(p, "%s", "*args / **kwargs in calls are not supported");
            nvec_push(p, &args, parse_expr(p));
        }
    }
    p->i++;
    n->kids = args.v;
    n->nkids = args.n;
    n->kids2 = kw.v;
    n->nkids2 = kw.n;
    n->names = names.v;
    n->nnames = names.n;
}

static jj_node *parse_tuple_or_expr(parser *p, int allow_empty_paren);

static jj_node *parse_primary(parser *p)
{
    jj_token *t = cur(p);
    jj_node *n;
    enter(p);
    switch (t->kind) {
    case T_NAME:
        n = node(p, E_LIT);
        p->i++;
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True")) {
            n->lit.t = JV_BOOL, n->lit.u.b = 1;
        } else if (!strcmp(t->s, "false") || !strcmp(t->s, "False")) {
            n->lit.t = JV_BOOL, n->lit.u.b = 0;
        } else if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) {
            n->lit.t = JV_NONE;
        } else {
            n->kind = E_NAME;
            n->str = t->s;
        }
        break;
    case T_STR: {
        n = node(p, E_LIT);
        size_t len = 0, k = p->i;
        while (p->t[k].kind == T_STR)
            len += p->t[k++].n;
        char *s = jj_alloc(p->a, len + 1);
        size_t o = 0;
        while (cur(p)->kind == T_STR) {
            memcpy(s + o, cur(p)->s, cur(p)->n);
            o += cur(p)->n;
            p->i++;
        }
        s[o] = 0;
        n->lit.t = JV_STR;
        n->lit.u.s.s = s;
        n->lit.u.s.n = o;
        break;
    }
    case T_INT:
        n = node(p, E_LIT);
        n->lit.t = JV_INT;
        n->lit.u.i = t->i;
        p->i++;
        break;
    case T_FLOAT:
        n = node(p, E_LIT);
        n->lit.t = JV_FLOAT;
        n->lit.u.f = t->f;
        p->i++;
        break;
    case T_OP:
        if (is_op(p, "(")) {
            p->i++;
            n = parse_tuple_or_expr(p, 1);
            expect_op(p, ")");
            break;
        }
        if (is_op(p, "[")) {
            n = node(p, E_LIST);
            p->i++;
            nvec items = {0};
            while (!is_op(p, "]")) {
                if (items.n)
                    expect_op(p, ",");
                if (is_op(p, "]"))
                    break;
                nvec_push(p, &items, parse_expr(p));
            }
            p->i++;
            n->kids = items.v;
            n->nkids = items.n;
            break;
        }
        if (is_op(p, "{")) {
            n = node(p, E_DICT);
            p->i++;
            nvec ks = {0}, vs = {0};
            while (!is_op(p, "}")) {
                if (ks.n)
                    expect_op(p, ",");
                if (is_op(p, "}"))
                    break;
                nvec_push(p, &ks, parse_expr(p));
                expect_op(p, ":");
                nvec_push(p, &vs, parse_expr(p));
            }
            p->i++;
            n->kids = ks.v;
            n->nkids = ks.n;
            n->kids2 = vs.v;
            n->nkids2 = vs.n;
            break;
        }
        /* fallthrough */
    default:
        jj_fail(p->a, t->line, t->col, "unexpected %s in an expression", tok_desc(t));
    }
    p->depth--;
    return n;
}

static jj_node *parse_postfix(parser *p, jj_node *n)
{
    for (;;) {
        if (is_op(p, ".")) {
            jj_node *m = node(p, E_ATTR);
            p->i++;
            jj_token *t = cur(p);
            if (t->kind == T_NAME) {
                m->str = t->s;
            } else if (t->kind == T_INT) {
                m->kind = E_ITEM;
                m->b = node(p, E_LIT);
                m->b->lit.t = JV_INT;
                m->b->lit.u.i = t->i;
            } else {
                jj_fail(p->a, t->line, t->col, "expected an attribute name, found %s", tok_desc(t));
            }
            p->i++;
            m->a = n;
            n = m;
        } else if (is_op(p, "[")) {
            jj_node *m = node(p, E_ITEM);
            p->i++;
            jj_node *parts[3] = {NULL, NULL, NULL};
            int colons = 0;
            while (!is_op(p, "]")) {
                if (is_op(p, ":")) {
                    if (++colons > 2)
                        perr(p, "%s", "a slice with more than two ':'");
                    p->i++;
                    continue;
                }
                if (parts[colons])
                    perr(p, "%s", "expected ']' or ':' in a subscript");
                parts[colons] = parse_expr(p);
                if (is_op(p, ","))
                    perr(p, "%s", "tuple subscripts are not supported");
            }
            p->i++;
            if (colons) {
                m->kind = E_SLICE;
                m->b = parts[0];
                m->c = parts[1];
                m->d = parts[2];
            } else {
                if (!parts[0])
                    perr(p, "%s", "an empty subscript");
                m->b = parts[0];
            }
            m->a = n;
            n = m;
        } else if (is_op(p, "(")) {
            jj_node *m = node(p, E_CALL);
            parse_args(p, m);
            m->a = n;
            n = m;
        } else {
            return n;
        }
    }
}

static jj_node *parse_filter_expr(parser *p, jj_node *n)
{
    for (;;) {
        if (is_op(p, "|")) {
            p->i++;
            jj_node *m = node(p, E_FILTER);
            m->str = expect_name(p);
            while (is_op(p, ".")) {
                p->i++;
                expect_name(p);
                perr(p, "%s", "dotted filter names are not supported");
            }
            if (is_op(p, "("))
                parse_args(p, m);
            m->a = n;
            n = m;
        } else if (is_name(p, "is")) {
            p->i++;
            jj_node *m = node(p, E_TEST);
            if (is_name(p, "not")) {
                m->negated = 1;
                p->i++;
            }
            m->str = expect_name(p);
            jj_token *t = cur(p);
            if (is_op(p, "(")) {
                parse_args(p, m);
            } else if ((t->kind == T_NAME || t->kind == T_STR || t->kind == T_INT || t->kind == T_FLOAT ||
                        is_op(p, "[") || is_op(p, "{")) &&
                       !is_name(p, "else") && !is_name(p, "or") && !is_name(p, "and")) {
                jj_node *arg = parse_postfix(p, parse_primary(p));
                m->kids = jj_alloc(p->a, sizeof(jj_node *));
                m->kids[0] = arg;
                m->nkids = 1;
            }
            m->a = n;
            n = m;
        } else if (is_op(p, "(")) {
            jj_node *m = node(p, E_CALL);
            parse_args(p, m);
            m->a = n;
            n = m;
        } else {
            return n;
        }
    }
}

static jj_node *parse_unary(parser *p, int with_filter)
{
    jj_node *n;
    enter(p);
    if (is_op(p, "-") || is_op(p, "+")) {
        n = node(p, is_op(p, "-") ? E_NEG : E_POS);
        p->i++;
        n->a = parse_unary(p, 0);
    } else {
        n = parse_postfix(p, parse_primary(p));
    }
    if (with_filter)
        n = parse_filter_expr(p, n);
    p->depth--;
    return n;
}

static jj_node *bin(parser *p, int op, jj_node *a, jj_node *b, int line, int col)
{
    jj_node *n = node(p, E_BIN);
    n->op = op;
    n->a = a;
    n->b = b;
    n->line = line;
    n->col = col;
    return n;
}

static jj_node *parse_pow(parser *p)
{
    jj_node *n = parse_unary(p, 1);
    while (is_op(p, "**")) {
        jj_token *t = cur(p);
        p->i++;
        n = bin(p, 'P', n, parse_unary(p, 1), t->line, t->col);
    }
    return n;
}

static jj_node *parse_math2(parser *p)
{
    jj_node *n = parse_pow(p);
    for (;;) {
        jj_token *t = cur(p);
        int op = is_op(p, "*") ? '*' : is_op(p, "/") ? '/' : is_op(p, "//") ? 'F' : is_op(p, "%") ? '%' : 0;
        if (!op)
            return n;
        p->i++;
        n = bin(p, op, n, parse_pow(p), t->line, t->col);
    }
}

static jj_node *parse_concat(parser *p)
{
    jj_node *n = parse_math2(p);
    while (is_op(p, "~")) {
        jj_token *t = cur(p);
        p->i++;
        n = bin(p, '~', n, parse_math2(p), t->line, t->col);
    }
    return n;
}

static jj_node *parse_math1(parser *p)
{
    jj_node *n = parse_concat(p);
    for (;;) {
        jj_token *t = cur(p);
        int op = is_op(p, "+") ? '+' : is_op(p, "-") ? '-' : 0;
        if (!op)
            return n;
        p->i++;
        n = bin(p, op, n, parse_concat(p), t->line, t->col);
    }
}

static jj_node *parse_compare(parser *p)
{
    jj_node *first = parse_math1(p);
    nvec rhs = {0};
    svec ops = {0};
    jj_node *n = node(p, E_CMP);
    for (;;) {
        const char *op = NULL;
        if (is_op(p, "==") || is_op(p, "!=") || is_op(p, "<") || is_op(p, ">") || is_op(p, "<=") ||
            is_op(p, ">=")) {
            op = cur(p)->s;
            p->i++;
        } else if (is_name(p, "in")) {
            op = "in";
            p->i++;
        } else if (is_name(p, "not") && p->t[p->i + 1].kind == T_NAME && !strcmp(p->t[p->i + 1].s, "in")) {
            op = "notin";
            p->i += 2;
        } else {
            break;
        }
        svec_push(p, &ops, op);
        nvec_push(p, &rhs, parse_math1(p));
    }
    if (!ops.n)
        return first;
    n->a = first;
    n->kids = rhs.v;
    n->nkids = rhs.n;
    n->names = ops.v;
    n->nnames = ops.n;
    return n;
}

static jj_node *parse_not(parser *p)
{
    if (is_name(p, "not")) {
        jj_node *n = node(p, E_NOT);
        p->i++;
        enter(p);
        n->a = parse_not(p);
        p->depth--;
        return n;
    }
    return parse_compare(p);
}

static jj_node *parse_and(parser *p)
{
    jj_node *n = parse_not(p);
    while (is_name(p, "and")) {
        jj_node *m = node(p, E_AND);
        p->i++;
        m->a = n;
        m->b = parse_not(p);
        n = m;
    }
    return n;
}

static jj_node *parse_or(parser *p)
{
    jj_node *n = parse_and(p);
    while (is_name(p, "or")) {
        jj_node *m = node(p, E_OR);
        p->i++;
        m->a = n;
        m->b = parse_and(p);
        n = m;
    }
    return n;
}

static jj_node *parse_expr(parser *p)
{
    enter(p);
    jj_node *n = parse_or(p);
    while (is_name(p, "if")) {
        jj_node *m = node(p, E_COND);
        p->i++;
        m->a = parse_or(p);
        m->b = n;
        if (is_name(p, "else")) {
            p->i++;
            m->c = parse_expr(p);
        }
        n = m;
    }
    p->depth--;
    return n;
}

/* `a, b` as a tuple, or one expression. */
static jj_node *parse_tuple_or_expr(parser *p, int allow_empty_paren)
{
    jj_node *t = node(p, E_TUPLE);
    if (allow_empty_paren && is_op(p, ")"))
        return t;
    jj_node *first = parse_expr(p);
    if (!is_op(p, ","))
        return first;
    nvec items = {0};
    nvec_push(p, &items, first);
    while (is_op(p, ",")) {
        p->i++;
        if (is_op(p, ")") || cur(p)->kind == T_VEND || cur(p)->kind == T_BEND)
            break;
        nvec_push(p, &items, parse_expr(p));
    }
    t->kids = items.v;
    t->nkids = items.n;
    return t;
}

/* ---- statements ----------------------------------------------------- */

static jj_node *parse_body(parser *p, const char *const *ends);

static void expect_bend(parser *p)
{
    if (cur(p)->kind != T_BEND) {
        jj_token *t = cur(p);
        jj_fail(p->a, t->line, t->col, "expected '%%}', found %s", tok_desc(t));
    }
    p->i++;
}

static const char *const if_ends[] = {"elif", "else", "endif", NULL};
static const char *const for_ends[] = {"else", "endfor", NULL};
static const char *const endfor[] = {"endfor", NULL};

static jj_node *parse_if(parser *p)
{
    jj_node *n = node(p, N_IF);
    n->a = parse_tuple_or_expr(p, 0);
    expect_bend(p);
    n->b = parse_body(p, if_ends);
    /* cur is the name jj_token after {% */
    if (is_name(p, "elif")) {
        p->i++;
        n->c = parse_if(p);
        return n;
    }
    if (is_name(p, "else")) {
        p->i++;
        expect_bend(p);
        static const char *const e[] = {"endif", NULL};
        n->c = parse_body(p, e);
    }
    p->i++; /* endif */
    expect_bend(p);
    return n;
}

static jj_node *parse_for(parser *p)
{
    jj_node *n = node(p, N_FOR);
    svec names = {0};
    int paren = is_op(p, "(");
    if (paren)
        p->i++;
    do {
        if (names.n)
            p->i++;
        svec_push(p, &names, expect_name(p));
    } while (is_op(p, ","));
    if (paren)
        expect_op(p, ")");
    n->names = names.v;
    n->nnames = names.n;
    if (!is_name(p, "in"))
        perr(p, "expected 'in' in a for statement, found %s", tok_desc(cur(p)));
    p->i++;
    /* the iterable stops before a filtering `if` (Jinja2: parse_tuple(with_condexpr=False)) */
    n->a = parse_or(p);
    if (is_op(p, ",")) {
        jj_node *t = node(p, E_TUPLE);
        nvec items = {0};
        nvec_push(p, &items, n->a);
        while (is_op(p, ",")) {
            p->i++;
            nvec_push(p, &items, parse_or(p));
        }
        t->kids = items.v;
        t->nkids = items.n;
        n->a = t;
    }
    if (is_name(p, "if")) {
        p->i++;
        n->d = parse_expr(p);
    }
    if (is_name(p, "recursive"))
        perr(p, "%s", "recursive for loops are not supported");
    expect_bend(p);
    p->in_loop++;
    n->b = parse_body(p, for_ends);
    p->in_loop--;
    if (is_name(p, "else")) {
        p->i++;
        expect_bend(p);
        n->c = parse_body(p, endfor);
    }
    p->i++;
    expect_bend(p);
    return n;
}

static jj_node *parse_set(parser *p)
{
    jj_node *n = node(p, N_SET);
    svec names = {0};
    svec_push(p, &names, expect_name(p));
    if (is_op(p, ".")) {
        p->i++;
        svec_push(p, &names, expect_name(p)); /* ns.attr */
        n->op = '.';
    } else if (is_op(p, ",")) {
        while (is_op(p, ",")) {
            p->i++;
            svec_push(p, &names, expect_name(p));
        }
        n->op = ',';
    }
    n->names = names.v;
    n->nnames = names.n;
    if (cur(p)->kind == T_BEND || is_op(p, "|")) {
        if (n->op)
            perr(p, "%s", "a block set of an attribute or a tuple is not supported");
        n->kind = N_SETBLOCK;
        if (is_op(p, "|"))
            perr(p, "%s", "filters on a block set are not supported");
        p->i++;
        static const char *const e[] = {"endset", NULL};
        n->b = parse_body(p, e);
        p->i++;
        expect_bend(p);
        return n;
    }
    expect_op(p, "=");
    n->a = parse_tuple_or_expr(p, 0);
    expect_bend(p);
    return n;
}

static jj_node *parse_macro(parser *p)
{
    jj_node *n = node(p, N_MACRO);
    n->str = expect_name(p);
    svec names = {0};
    nvec defs = {0};
    expect_op(p, "(");
    while (!is_op(p, ")")) {
        if (names.n)
            expect_op(p, ",");
        svec_push(p, &names, expect_name(p));
        if (is_op(p, "=")) {
            p->i++;
            nvec_push(p, &defs, parse_expr(p));
        } else {
            if (defs.n)
                perr(p, "%s", "a macro parameter without a default after one with a default");
            nvec_push(p, &defs, NULL);
        }
    }
    p->i++;
    expect_bend(p);
    n->names = names.v;
    n->nnames = names.n;
    n->kids2 = defs.v;
    n->nkids2 = defs.n;
    int saved = p->in_loop;
    p->in_loop = 0;
    static const char *const e[] = {"endmacro", NULL};
    n->b = parse_body(p, e);
    p->in_loop = saved;
    p->i++;
    if (cur(p)->kind == T_NAME)
        p->i++; /* {% endmacro name %} */
    expect_bend(p);
    return n;
}

static jj_node *parse_statement(parser *p)
{
    jj_token *t = cur(p);
    if (t->kind != T_NAME)
        jj_fail(p->a, t->line, t->col, "expected a statement name, found %s", tok_desc(t));
    p->i++;
    const char *s = t->s;
    if (!strcmp(s, "if"))
        return parse_if(p);
    if (!strcmp(s, "for"))
        return parse_for(p);
    if (!strcmp(s, "set"))
        return parse_set(p);
    if (!strcmp(s, "macro"))
        return parse_macro(p);
    if (!strcmp(s, "break") || !strcmp(s, "continue")) {
        if (!p->in_loop)
            jj_fail(p->a, t->line, t->col, "'%s' outside of a for loop", s);
        jj_node *n = node(p, s[0] == 'b' ? N_BREAK : N_CONTINUE);
        n->line = t->line, n->col = t->col;
        expect_bend(p);
        return n;
    }
    if (!strcmp(s, "generation")) {
        jj_node *n = node(p, N_GEN);
        expect_bend(p);
        static const char *const e[] = {"endgeneration", NULL};
        n->b = parse_body(p, e);
        p->i++;
        expect_bend(p);
        p->has_generation = 1;
        return n;
    }
    if (!strcmp(s, "filter")) {
        jj_node *n = node(p, N_FILTERBLOCK);
        n->str = expect_name(p);
        if (is_op(p, "("))
            parse_args(p, n);
        expect_bend(p);
        static const char *const e[] = {"endfilter", NULL};
        n->b = parse_body(p, e);
        p->i++;
        expect_bend(p);
        return n;
    }
    jj_fail(p->a, t->line, t->col, "statement '%s' is not supported", s);
}

/* Statements until one of `ends` (left at that name jj_token) or EOF when
 * ends is NULL. */
static jj_node *parse_body(parser *p, const char *const *ends)
{
    jj_node *body = node(p, N_BODY);
    nvec kids = {0};
    enter(p);
    for (;;) {
        jj_token *t = cur(p);
        if (t->kind == T_EOF) {
            if (ends) {
                int last = 0;
                while (ends[last + 1])
                    last++;
                jj_fail(p->a, t->line, t->col, "end of template: expected '{%% %s %%}'", ends[last]);
            }
            break;
        }
        if (t->kind == T_TEXT) {
            jj_node *n = node(p, N_TEXT);
            n->str = t->s;
            n->slen = t->n;
            nvec_push(p, &kids, n);
            p->i++;
        } else if (t->kind == T_VBEGIN) {
            p->i++;
            jj_node *n = node(p, N_OUT);
            n->a = parse_tuple_or_expr(p, 0);
            if (cur(p)->kind != T_VEND)
                jj_fail(p->a, cur(p)->line, cur(p)->col, "expected '}}', found %s", tok_desc(cur(p)));
            p->i++;
            nvec_push(p, &kids, n);
        } else if (t->kind == T_BBEGIN) {
            jj_token *nt = &p->t[p->i + 1];
            if (nt->kind == T_NAME && ends) {
                for (int k = 0; ends[k]; k++)
                    if (!strcmp(nt->s, ends[k])) {
                        p->i++;
                        goto done;
                    }
            }
            if (nt->kind == T_NAME && (!strncmp(nt->s, "end", 3) || !strcmp(nt->s, "elif") ||
                                       !strcmp(nt->s, "else")))
                jj_fail(p->a, nt->line, nt->col, "unexpected '%s'", nt->s);
            p->i++;
            nvec_push(p, &kids, parse_statement(p));
        } else {
            jj_fail(p->a, t->line, t->col, "unexpected %s", tok_desc(t));
        }
    }
done:
    p->depth--;
    body->kids = kids.v;
    body->nkids = kids.n;
    return body;
}

int jinja_parse(const char *src, size_t len, const char *field, jinja_template **out, acc_err *err)
{
    *out = NULL;
    jinja_template *t = calloc(1, sizeof(*t));
    if (!t)
        return acc_err_set(err, ACC_ENOMEM, field ? field : "", "out of memory");
    jmp_buf jb;
    t->arena.fail = &jb;
    t->arena.err = err;
    snprintf(t->field, sizeof(t->field), "%s", field ? field : "");
    t->arena.field = t->field;
    t->arena.limit = 64u << 20;
    if (setjmp(jb)) {
        jj_arena_free(&t->arena);
        free(t);
        return err ? err->code : ACC_EINVAL;
    }
    /* newlines to "\n", one trailing newline dropped, as Jinja2 does */
    char *s = jj_alloc(&t->arena, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n')
        n--;
    s[n] = 0;
    jj_token *toks;
    size_t ntoks;
    jj_lex(&t->arena, s, n, &toks, &ntoks);
    parser p = {.a = &t->arena, .t = toks, .nt = ntoks};
    t->root = parse_body(&p, NULL);
    t->has_generation = p.has_generation;
    t->arena.fail = NULL;
    t->arena.err = NULL;
    *out = t;
    return 0;
}

void jinja_free(jinja_template *t)
{
    if (!t)
        return;
    jj_arena_free(&t->arena);
    free(t);
}

int jinja_has_generation(const jinja_template *t)
{
    return t->has_generation;
}

