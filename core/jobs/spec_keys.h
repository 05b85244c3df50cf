/* spec_keys: the names a job spec accepts besides its own.
 *
 * 1. Hugging Face TrainingArguments (and accelerate / TRL) names accepted
 *    as aliases where the meaning is the same: one table, one row per alias
 *    (alias, canonical key path, converter). spec_alias_apply() rewrites a
 *    parsed spec in place before it is read: each alias present becomes its
 *    canonical key; an alias and its canonical key both given with
 *    different values is ACC_EINVAL naming both. Aliases whose meaning is
 *    "nothing to do here" (logging_steps) are dropped and listed as ignored.
 * 2. "Did you mean": the closest accepted key (or alias) at a path for an
 *    unknown key, by edit distance over normalized names (case, '-'), with
 *    a few well-known names that live elsewhere ("lr" -> "optimizer.lr").
 */
#ifndef ACC_SPEC_KEYS_H
#define ACC_SPEC_KEYS_H

#include <jansson.h>
#include <stddef.h>

#include "err.h"

/* How an alias's value becomes its canonical key's value. */
typedef enum spec_alias_conv {
    SA_SAME,        /* the value as it is */
    SA_BF16,        /* true -> precision "bf16", false -> "fp32" */
    SA_FP16,        /* true -> not supported; false -> nothing */
    SA_MIXED,       /* accelerate's "no" / "bf16" / "fp16" -> precision */
    SA_LR_SCHED,    /* lr_scheduler_type: "cosine", "constant" (the same schedules) */
    SA_BETA1,       /* adam_beta1 -> optimizer.betas[0] */
    SA_BETA2,       /* adam_beta2 -> optimizer.betas[1] */
    SA_IGNORE,      /* accepted, no meaning here: listed as ignored */
} spec_alias_conv;

typedef struct spec_alias {
    const char *alias;     /* a top-level key of the spec */
    const char *canonical; /* the key path it stands for ("" for SA_IGNORE) */
    spec_alias_conv conv;
    const char *why;       /* SA_IGNORE: why it means nothing here */
} spec_alias;

/* The table (NULL-alias terminated). */
const spec_alias *spec_alias_table(void);

/* Rewrite `root` (a spec object) in place: aliases become canonical keys.
 * `origin` (an empty object) gets canonical path -> alias for each one
 * rewritten (for spec_alias_rename_error). Ignored aliases are appended to
 * `ignored` (", "-separated, capacity n). ACC_EINVAL naming the alias on a
 * conflict or a value with no equivalent. */
int spec_alias_apply(json_t *root, json_t *origin, char *ignored, size_t n, acc_err *err);

/* An error about a canonical key that came from an alias names the alias
 * (the key the user wrote) instead. */
void spec_alias_rename_error(const json_t *origin, acc_err *err);

/* "path.key" of a top-level canonical path for messages: "optimizer.lr
 * (learning_rate)" when it came from an alias. */
void spec_alias_describe(const json_t *origin, const char *canonical, char *out, size_t n);

/* The closest of `allowed` (NULL-terminated), of the aliases (top level
 * only: prefix NULL or "") and of the well-known misplaced names at
 * `prefix`, to `key`; NULL when there is nothing to suggest. */
const char *spec_keys_suggest(const char *prefix, const char *key, const char *const *allowed);

/* Append `item` to a ", "-separated list in buf (capacity n); a full
 * buffer ends in "...". */
void spec_list_append(char *buf, size_t n, const char *item);

#endif
