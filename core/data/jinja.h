/* jinja: the subset of Jinja2 that chat templates use, in C.
 *
 * Contract: jinja_render() of a template parsed by jinja_parse() gives the
 * bytes Python Jinja2 gives when set up as Hugging Face transformers sets it
 * up (ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
 * extensions=[loopcontrols]), keep_trailing_newline False, `raise_exception`,
 * transformers' `tojson`, `strftime_now`, `{% generation %}`). What is
 * supported is listed in docs/data.md; a construct outside it is ACC_EINVAL
 * at parse (or, for a filter/test/method name, at render) naming the
 * construct and its line:column -- never approximated.
 *
 * A template is user input: parse depth, render recursion, loop iterations,
 * the output size, all memory and the time of one render are bounded
 * (loops, filters and string operations check the deadline); every value
 * of a render lives in one arena freed at the end. Past the deadline the
 * render stops with ACC_EINVAL naming the field and the time limit.
 * Substring search (`in`, find, replace, split, count) is linear (a real
 * search) and `unique` hashes. `raise_exception(msg)` is
 * ACC_EINVAL with the template's message (the API answers 400).
 *
 * Threads: a parsed template is read-only; renders may run concurrently.
 */
#ifndef ACC_JINJA_H
#define ACC_JINJA_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"

typedef struct jinja_template jinja_template;

/* A byte range [start, end) of the output. */
typedef struct jinja_span {
    size_t start, end;
} jinja_span;

typedef struct jinja_output {
    char *text; /* malloc'd, NUL-terminated */
    size_t len;
    jinja_span *gen; /* what each {% generation %} block wrote, in order */
    size_t ngen;
} jinja_output;

/* Bounds of one render (0 fields take the defaults). */
typedef struct jinja_limits {
    size_t max_output; /* bytes of output (default 16 MiB) */
    size_t max_memory; /* bytes of the render arena (default 256 MiB) */
    long max_steps;    /* loop iterations + macro calls (default 10 M) */
    int max_depth;     /* macro call nesting (default 64) */
    int64_t deadline_ns; /* CLOCK_MONOTONIC (budget.h); 0 = no time bound */
    long time_limit_ms;  /* what the deadline allows, named in the error */
} jinja_limits;

/* Parse a template; `field` names it in errors ("data.chat_template"). */
int jinja_parse(const char *src, size_t len, const char *field, jinja_template **out,
                acc_err *err);
void jinja_free(jinja_template *t);
/* Whether the template has {% generation %} blocks. */
int jinja_has_generation(const jinja_template *t);

/* Render with the variables of the JSON object `vars` (messages,
 * bos_token, add_generation_prompt, ...). lim may be NULL. */
int jinja_render(const jinja_template *t, json_t *vars, const jinja_limits *lim,
                 jinja_output *out, acc_err *err);
void jinja_output_free(jinja_output *o);

#endif
