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
 * the stage number. Stage 3 shards the parameters too: the model's store
 * is partitioned (model_shard.h: each block gathered before its forward
 * and its backward, its gradients reduce-scattered into the rank's
 * partition as the backward finishes it), so its row keeps all of the
 * partition, reduces only the trainer's tail in the step's reduction and
 * has nothing to gather after the update.
 *
 * Shards are the collectives' (kern_shard_lo, adamw_shard), so a rank's
 * range is the one its reduce-scatter and all-gather use.
 */
#ifndef ACC_ZERO_H
#define ACC_ZERO_H

#include <stdbool.h>
#include <stddef.h>

#include "kern_comm.h"
#include "model.h"

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
    /* the parameters are partitioned (stage 3): the model is created
     * sharded over the job's ranks, and every rank must run the same
     * forwards and backwards (the blocks' gathers are collectives) */
    bool params_sharded;
    /* Every rank calls: the moment vector `shard` (host memory, the rank's
     * range [lo, hi) of the model's held floats, adamw_moment_get) made
     * whole in layout order into host[ngrad] on the ranks that pass one
     * (NULL: only helps). The model's gradient buffer serves as scratch
     * (zeroed after). */
    int (*state_to_host)(kern_comm *c, int rank, model *m, const float *shard, size_t lo, size_t hi,
                         float *host);
} zero_ops;

/* Highest stage with a row. */
#define ZERO_MAX_STAGE 3

/* The row of `stage`, or NULL when there is none. */
const zero_ops *zero_ops_of(int stage);

#endif
