/* spec_rows: the job spec's regular sections as tables (issue 19), one row
 * per key, in the style of nginx's command tables.
 *
 * A row names the key, the kind of value (its type and range or choices:
 * the validator), its default as JSON text (applied through the same row,
 * so a default is always a value the key accepts), and where the value
 * goes (an offset in the section's struct, or a setter for irregular
 * keys). A section's rows are also its accepted keys: an object is checked
 * against them for unknown keys before any value is read (errors name the
 * key path, with a did-you-mean). Rows of type SPEC_T_CODE are keys the
 * section accepts whose value code reads (sub-sections, the batch triple,
 * cross-key rules).
 *
 * Irregular sections stay code in job_spec.c: model with "from" (a Hugging
 * Face directory), data (formats, globs, datasets), deepspeed and
 * zero_optimization (DeepSpeed's own keys, "auto", ignored keys).
 *
 * Adding a spec key = a field + one row (at the end of its section's table
 * in job_spec.c) + its line in docs/api.md, "Every job-spec key" (test
 * spec_rows fails without it).
 */
#ifndef ACC_SPEC_ROWS_H
#define ACC_SPEC_ROWS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "err.h"

typedef enum spec_type {
    SPEC_T_INT,    /* an integer in [lo, hi], into an int */
    SPEC_T_U64,    /* a non-negative integer, into a uint64_t */
    SPEC_T_NUM,    /* a finite number in [lo, hi] ((lo, hi] with open_lo), into a double */
    SPEC_T_BOOL,   /* true or false, into a bool */
    SPEC_T_STR,    /* a string shorter than size (null = absent with null_ok), into a char[size] */
    SPEC_T_CHOICE, /* one of choices, its index into an int-sized enum (size 0: checked only) */
    SPEC_T_CUSTOM, /* the row's setter reads it */
    SPEC_T_CODE,   /* accepted here, read by code (see above) */
} spec_type;

struct spec_row;
typedef int (*spec_setter)(const json_t *obj, const char *prefix, const struct spec_row *r, void *base,
                           acc_err *err);

typedef struct spec_row {
    const char *key;
    spec_type type;
    const char *def;             /* the default as JSON text; NULL = none (zero, empty, or derived) */
    size_t off, size;            /* the value in the section's struct */
    double lo, hi;               /* SPEC_T_INT, SPEC_T_NUM */
    bool open_lo;                /* SPEC_T_NUM: lo itself excluded ("must be > 0") */
    bool null_ok;                /* SPEC_T_STR: null is as if absent */
    const char *const *choices;  /* SPEC_T_CHOICE, NULL-terminated */
    spec_setter set;             /* SPEC_T_CUSTOM */
} spec_row;

typedef struct spec_section {
    const char *prefix;          /* "" for the top level, else the section's key */
    const spec_row *rows;
    size_t n;
} spec_section;

/* The sections with tables, NULL-prefix terminated. */
const spec_section *spec_sections(void);

/* Apply a section's rows to `obj` (absent keys keep their value), into `base`. */
int spec_rows_apply(const json_t *obj, const spec_section *sec, void *base, acc_err *err);

/* Apply the rows' defaults into `base`: 0, or the first row whose default
 * its own row refuses (a bug the test spec_rows catches). */
int spec_rows_defaults(const spec_section *sec, void *base, acc_err *err);

#endif
