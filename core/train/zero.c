/* zero: see zero.h. */
#include "zero.h"

#include "adamw.h"

static void keep_all(size_t n, int rank, int world, size_t *lo, size_t *hi)
{
    (void)rank;
    (void)world;
    *lo = 0;
    *hi = n;
}

static int bucket_allreduce(kern_comm *c, int rank, float *grads, const kern_span *spans, int nspans,
                            size_t n)
{
    (void)n;
    return kern_comm_reduce_start(c, rank, grads, spans, nspans);
}

static int bucket_scatter(kern_comm *c, int rank, float *grads, const kern_span *spans, int nspans, size_t n)
{
    return kern_comm_scatter_start(c, rank, grads, spans, nspans, n);
}

static int params_whole(kern_comm *c, int rank, float *params, size_t n)
{
    (void)c;
    (void)rank;
    (void)params;
    (void)n;
    return 0;
}

static int params_allgather(kern_comm *c, int rank, float *params, size_t n)
{
    return kern_comm_allgather(c, rank, params, n);
}

static const zero_ops stages[ZERO_MAX_STAGE + 1] = {
    {.stage = 0, .note = "", .state_sharded = false, .grads_sharded = false, .keep = keep_all,
     .reduce_bucket = bucket_allreduce, .gather_params = params_whole},
    {.stage = 1, .note = "; ZeRO stage 1 (AdamW moments sharded)", .state_sharded = true,
     .grads_sharded = false, .keep = adamw_shard, .reduce_bucket = bucket_allreduce,
     .gather_params = params_allgather},
    {.stage = 2, .note = "; ZeRO stage 2 (AdamW moments and reduced gradients sharded)",
     .state_sharded = true, .grads_sharded = true, .keep = adamw_shard, .reduce_bucket = bucket_scatter,
     .gather_params = params_allgather},
};

const zero_ops *zero_ops_of(int stage)
{
    return stage >= 0 && stage <= ZERO_MAX_STAGE ? &stages[stage] : NULL;
}
