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
    int64_t deadline_ns; /* 0 = none (budget.h) */
    long time_limit_ms;
    unsigned ticks;      /* the clock is read every JJ_TICKS_PER_CHECK */
} jj_arena;

void *jj_alloc(jj_arena *a, size_t n);
void jj_arena_free(jj_arena *a);
_Noreturn void jj_fail(jj_arena *a, int line, int col, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
char *jj_strndup(jj_arena *a, const char *s, size_t n);
/* One unit of work: past the arena's deadline the render fails (the clock
 * is read every few hundred ticks). */
void jj_tick(jj_arena *a);
/* `units` ticks at once (a scan of `units` KiB counts as that many). */
void jj_work(jj_arena *a, size_t units);
/* The first occurrence of needle[0..nn) in hay[from..hn), or -1 (a linear
 * search; nn > 0). */
int64_t jj_find(jj_arena *a, const char *hay, size_t hn, size_t from, const char *needle, size_t nn);

/* ---- tokens (jinja_lex.c) ---- */

enum tk {
    T_EOF, T_TEXT, T_VBEGIN, T_VEND, T_BBEGIN, T_BEND, T_NAME, T_STR, T_INT, T_FLOAT, T_OP,
};

typedef struct jj_token {
    int kind, line, col;
    const char *s; /* text / name / op / decoded string */
    size_t n;
    int64_t i;
    double f;
} jj_token;

/* The tokens of src[0..n) (newlines already "\n"), ending with T_EOF. */
void jj_lex(jj_arena *a, const char *src, size_t n, jj_token **tokens, size_t *ntokens);

typedef enum jj_vtype {
    JV_UNDEF = 0,
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,
    JV_DICT,
    JV_NS,
    JV_MACRO,
    JV_FUNC,
    JV_METHOD,
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
        struct {
            const char *s;
            size_t n;
        } s;
        jj_list *l;
        jj_dict *d;           /* JV_DICT, JV_NS */
        const jj_node *m;     /* JV_MACRO */
        struct jj_method *fn; /* JV_METHOD; JV_FUNC uses s (the name) */
    } u;
} jj_val;

struct jj_list {
    jj_val *v;
    size_t n, cap;
};
struct jj_dict {
    jj_val *k, *v;
    size_t n, cap;
};
typedef struct jj_method {
    const char *name;
    jj_val self;
} jj_method;

enum jj_nkind {
    /* statements */
    N_BODY,
    N_TEXT,
    N_OUT,
    N_IF,
    N_FOR,
    N_SET,
    N_SETBLOCK,
    N_MACRO,
    N_BREAK,
    N_CONTINUE,
    N_GEN,
    N_FILTERBLOCK,
    /* expressions */
    E_LIT,
    E_NAME,
    E_ATTR,
    E_ITEM,
    E_SLICE,
    E_CALL,
    E_FILTER,
    E_TEST,
    E_BIN,
    E_NEG,
    E_POS,
    E_NOT,
    E_AND,
    E_OR,
    E_CMP,
    E_COND,
    E_LIST,
    E_TUPLE,
    E_DICT,
};

/* One node of the tree; the fields used depend on the kind. */
struct jj_node {
    int kind, op, line, col;
    jj_node *a, *b, *c, *d; /* operands, bodies (if: a cond, b then, c else) */
    jj_node **kids;         /* body statements, list items, call args, dict keys */
    jj_node **kids2;        /* dict values, keyword arg values, macro defaults */
    int nkids, nkids2;
    const char **names; /* for targets, macro params, kwarg names, cmp ops */
    int nnames;
    const char *str; /* text, name, attribute, filter/test name */
    size_t slen;
    jj_val lit;
    int negated; /* `is not` */
};

struct jinja_template {
    jj_arena arena;
    char field[128]; /* named in errors */
    jj_node *root;
    int has_generation;
};

/* ---- the evaluator's state and helpers, shared by jinja_value.c,
 * jinja_builtins.c and jinja_eval.c ---- */

typedef struct jj_scope {
    struct jj_scope *parent;
    const char **names;
    jj_val *vals;
    int n, cap;
} jj_scope;

typedef struct jj_buf {
    char *s;
    size_t n, cap;
} jj_buf;

typedef struct jj_render {
    jj_arena *a;
    jj_buf *out;
    size_t max_output;
    long steps, max_steps;
    int depth, max_depth;
    int mdepth; /* macro calls */
    int ctl;    /* 1 break, 2 continue */
    jinja_span *gen;
    size_t ngen, gencap;
    const jj_node *at; /* the node evaluated, for error positions */
} jj_render;

#define FAIL(r, n, ...) jj_fail((r)->a, (n)->line, (n)->col, __VA_ARGS__)

typedef struct jj_args {
    jj_val *pos;
    int npos;
    const char **kwn;
    jj_val *kw;
    int nkw;
} jj_args;

#define JJ_UNDEF ((jj_val){.t = JV_UNDEF})
#define JJ_NONE ((jj_val){.t = JV_NONE})

typedef struct json_opts {
    int indent; /* -1: none */
    const char *item_sep, *key_sep;
    int sort_keys;
} json_opts;

jj_val jj_mk_bool(int b);
jj_val jj_mk_int(int64_t i);
jj_val jj_mk_float(double f);
jj_val jj_mk_str(const char *s, size_t n);
void jj_buf_add(jj_render *r, jj_buf *b, const char *s, size_t n);
void jj_buf_cstr(jj_render *r, jj_buf *b, const char *s);
jj_val jj_buf_val(jj_buf *b);
jj_list *jj_list_new(jj_render *r, size_t cap);
void jj_list_push(jj_render *r, jj_list *l, jj_val v);
jj_val jj_mk_list(jj_list *l);
jj_dict *jj_dict_new(jj_render *r);
jj_val *jj_dict_find(jj_dict *d, const jj_val *k);
jj_val *jj_dict_find_s(jj_dict *d, const char *s);
void jj_dict_set(jj_render *r, jj_dict *d, jj_val k, jj_val v);
void jj_dict_set_s(jj_render *r, jj_dict *d, const char *k, jj_val v);
jj_val jj_mk_dict(jj_dict *d);
size_t jj_u8_next(const char *s, size_t n, size_t i, uint32_t *cp);
size_t jj_u8_count(const char *s, size_t n);
size_t *jj_u8_offsets(jj_render *r, const char *s, size_t n, size_t *count);
int jj_py_space(uint32_t c);
void jj_to_str(jj_render *r, jj_buf *b, const jj_val *v);
jj_val jj_str_of(jj_render *r, const jj_val *v);
void jj_to_json(jj_render *r, jj_buf *b, const jj_val *v, const json_opts *o, int level);
int jj_truthy(const jj_val *v);
int jj_is_num(const jj_val *v);
double jj_num(const jj_val *v);
int64_t jj_inum(const jj_val *v);
int jj_val_eq(const jj_val *a, const jj_val *b);
int jj_val_lt(jj_render *r, const jj_val *a, const jj_val *b);
const char *jj_type_name(const jj_val *v);
void jj_step(jj_render *r, const jj_node *n);
const jj_val *jj_arg(const jj_args *a, int i, const char *name);
void jj_check_args(jj_render *r, const jj_node *n, const jj_args *a, int maxpos, const char *const *kw,
                   const char *what);
const char *jj_want_str(jj_render *r, const jj_node *n, const jj_val *v, const char *what, size_t *len);
jj_val jj_getitem(jj_render *r, const jj_node *n, const jj_val *obj, const jj_val *key);
jj_val jj_do_slice(jj_render *r, const jj_node *n, const jj_val *obj, const jj_val *a, const jj_val *b,
                   const jj_val *c);
int jj_contains(jj_render *r, const jj_node *n, const jj_val *item, const jj_val *coll);
jj_val jj_to_list(jj_render *r, const jj_node *n, const jj_val *v);
int jj_is_ws_c(unsigned char c);
jj_val jj_do_case(jj_render *r, const jj_val *s, int mode);
jj_val jj_method_get(jj_render *r, const jj_node *n, const jj_val *self, const char *name);
jj_val jj_dict_items(jj_render *r, jj_dict *d);
jj_val jj_call_method(jj_render *r, const jj_node *n, const jj_method *m, const jj_args *a);
int jj_run_test(jj_render *r, const jj_node *n, const char *name, const jj_val *v, const jj_args *a);
jj_val jj_apply_filter(jj_render *r, jj_scope *s, const jj_node *n, const char *name, const jj_val *v,
                       const jj_args *a);
jj_val jj_call_func(jj_render *r, const jj_node *n, const char *name, const jj_args *a);

#endif
