/* batch_split: the batch split of a job, with its one validator.
 *
 * A job's effective batch B (train_batch_size) is split over w ranks
 * (devices) and, on each rank, into a accumulation steps of m sequences
 * (the micro batch): B = m * a * w, always. That rule lives here only: the
 * spec parser, the trainer (its split now, which an out-of-memory lowers
 * and "auto" raises), the planner's candidates, a resumed checkpoint's
 * saved split and the rank program's split at its launcher's world
 * (batch_split_resolve) all build their split with batch_split_make or
 * move it with batch_split_with_micro, so nothing else re-checks the arithmetic. Pure
 * functions on a small value type.
 */
#ifndef ACC_BATCH_SPLIT_H
#define ACC_BATCH_SPLIT_H

#include "err.h"

typedef struct batch_split {
    int B;  /* train_batch_size: sequences per optimizer step, all ranks */
    int m;  /* train_micro_batch_size_per_gpu: sequences per micro-step per rank */
    int a;  /* gradient_accumulation_steps: micro-steps per optimizer step */
    int w;  /* world: ranks (devices) */
} batch_split;

/* The validator: B, m, a, w >= 1, w <= max_world (0: no limit) and
 * B = m * a * w exactly (computed without overflow). ACC_EINVAL naming
 * the field otherwise, with the spec's wording. */
int batch_split_make(int B, int m, int a, int w, int max_world, batch_split *out, acc_err *err);

/* The batch keys as a spec writes them (0: absent; m also 0 for "auto"). */
typedef struct batch_given {
    int B, m, a;
} batch_given;

/* The one resolver of a spec's batch keys at world size w (DeepSpeed's
 * rules: any two of B, m, a give the third; B alone means a = 1, m = B / w;
 * m alone, or m and a, give B). Submit, the dry run and POST /v1/plan (at
 * its hardware.devices) all resolve through it, so a bad triple is the
 * same 400 everywhere: ACC_EINVAL naming "train_batch_size" with the
 * arithmetic, e.g. "train_batch_size 32 != 2 * 16 * 4 (micro * accum *
 * world)", or when B is over max_batch. */
int batch_split_resolve(const batch_given *g, int w, int max_batch, batch_split *out, acc_err *err);

/* Sequences per rank per step: m * a = B / w. */
static inline int batch_split_per_rank(const batch_split *s)
{
    return s->B / s->w;
}

/* The same B and w with micro batch m (a = B / (m w)): 0, or -1 (out
 * unchanged) when m does not divide B / w. */
int batch_split_with_micro(const batch_split *s, int m, batch_split *out);

/* The largest micro batch below s->m that divides B / w (0: none, m = 1),
 * and the smallest above it (0: none, m = B / w). */
int batch_split_smaller_micro(const batch_split *s);
int batch_split_larger_micro(const batch_split *s);

#endif
