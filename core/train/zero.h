/* zero: the ZeRO stages as one table of operations (docs/engine.md).
 *
 * A row says, for one stage, the three things the stages differ in:
 *  - what a rank keeps: the parameter range whose AdamW moments it holds
 *    (all of them at stage 0, its shard from stage 1 on), and whether the
 *    reduced gradients it holds after the step's reduction are all of them
 *    or its shard's only (stage 2);
 *  - how one bucket of the step's gradient reduction is started: an
 *    all-reduce, or a reduce-scatter (stage 2);
 *  - how the parameters are made whole after the rank updated its range:
 *    nothing (stage 0), an all-gather (stages 1 and 2).
 * The trainer calls through the row of its job's stage and never asks for
 * the stage number. A later stage is a new row: stage 3 (parameters
 * sharded too) adds the per-layer gather and release of the parameters.
 *
 * Shards are the collectives' (kern_shard_lo, adamw_shard), so a rank's
 * range is the one its reduce-scatter and all-gather use.
 */
#ifndef ACC_ZERO_H
#define ACC_ZERO_H

#include <stdbool.h>
#include <stddef.h>

#include "kern_comm.h"

typedef struct zero_ops {
    int stage;
    /* the start log's words about the stage ("" at stage 0) */
    const char *note;
    /* the moments are a shard per rank: a checkpoint gathers them first,
     * and a shutdown stops every rank together so that it still can */
    bool state_sharded;
    /* after the step's reduction a rank holds the sums of its own range
     * only (else of every gradient) */
    bool grads_sharded;
    /* the parameters of the n a rank updates (and keeps moments of): [*lo, *hi) */
    void (*keep)(size_t n, int rank, int world, size_t *lo, size_t *hi);
    /* start one bucket of the step's reduction, spans[0..nspans) of grads;
     * [0, n) are the parameters' gradients, spans past n the trainer's
     * tail, summed into every rank at every stage. Ended by
     * kern_comm_reduce_finish. */
    int (*reduce_bucket)(kern_comm *c, int rank, float *grads, const kern_span *spans, int nspans,
                         size_t n);
    /* after each rank updated its range of params[0, n): every rank's
     * params whole again */
    int (*gather_params)(kern_comm *c, int rank, float *params, size_t n);
} zero_ops;

/* Highest stage with a row. */
#define ZERO_MAX_STAGE 2

/* The row of `stage`, or NULL when there is none. */
const zero_ops *zero_ops_of(int stage);

#endif
