/* jinja_internal: what the parser (jinja.c) and the evaluator
 * (jinja_eval.c) share: the arena, values and the syntax tree.
 *
 * Inside the module a failure longjmps to the entry point (jinja_parse /
 * jinja_render) with the error already filled; everything allocated since
 * lives in the arena the entry point frees, so nothing leaks. The public
 * functions return int + acc_err like every other module.
 */
#ifndef ACC_JINJA_INTERNAL_H
#define ACC_JINJA_INTERNAL_H

#include <setjmp.h>
#include <stdint.h>

#include "jinja.h"

typedef struct jj_block jj_block;
typedef struct jj_arena {
    jj_block *head;
    size_t used, limit;
    jmp_buf *fail;
    acc_err *err;
    const char *field;
} jj_arena;

void *jj_alloc(jj_arena *a, size_t n);
void jj_arena_free(jj_arena *a);
_Noreturn void jj_fail(jj_arena *a, int line, int col, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
char *jj_strndup(jj_arena *a, const char *s, size_t n);

typedef enum jj_vtype {
    JV_UNDEF = 0, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT,
    JV_NS, JV_MACRO, JV_FUNC, JV_METHOD,
} jj_vtype;

typedef struct jj_list jj_list;
typedef struct jj_dict jj_dict;
typedef struct jj_node jj_node;

typedef struct jj_val {
    jj_vtype t;
    int tuple; /* JV_LIST: a tuple (printed with parentheses) */
    union {
        int b;
        int64_t i;
        double f;
        struct { const char *s; size_t n; } s;
        jj_list *l;
        jj_dict *d;         /* JV_DICT, JV_NS */
        const jj_node *m;   /* JV_MACRO */
        struct jj_method *fn; /* JV_METHOD; JV_FUNC uses s (the name) */
    } u;
} jj_val;

struct jj_list { jj_val *v; size_t n, cap; };
struct jj_dict { jj_val *k, *v; size_t n, cap; };
typedef struct jj_method { const char *name; jj_val self; } jj_method;

enum jj_nkind {
    /* statements */
    N_BODY, N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_BREAK, N_CONTINUE,
    N_GEN, N_FILTERBLOCK,
    /* expressions */
    E_LIT, E_NAME, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST, E_BIN, E_NEG, E_POS,
    E_NOT, E_AND, E_OR, E_CMP, E_COND, E_LIST, E_TUPLE, E_DICT,
};

/* One node of the tree; the fields used depend on the kind. */
struct jj_node {
    int kind, op, line, col;
    jj_node *a, *b, *c, *d;  /* operands, bodies (if: a cond, b then, c else) */
    jj_node **kids;          /* body statements, list items, call args, dict keys */
    jj_node **kids2;         /* dict values, keyword arg values, macro defaults */
    int nkids, nkids2;
    const char **names;      /* for targets, macro params, kwarg names, cmp ops */
    int nnames;
    const char *str;         /* text, name, attribute, filter/test name */
    size_t slen;
    jj_val lit;
    int negated;             /* `is not` */
};

struct jinja_template {
    jj_arena arena;
    char field[128]; /* named in errors */
    jj_node *root;
    int has_generation;
};

#endif
