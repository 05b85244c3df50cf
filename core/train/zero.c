/* zero: see zero.h. */
#include "zero.h"

#include <stdlib.h>
#include <string.h>

#include "adamw.h"
#include "model_shard.h"

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

/* Stages 1 and 2: the rank's shard put in place in the gradient buffer
 * (free between steps), an all-gather completes it, copied out. */
static int state_allgather(kern_comm *c, int rank, model *m, const float *shard, size_t lo, size_t hi,
                           float *host)
{
    kern_device *d = m->dev;
    size_t n = m->ngrad;
    d->ops->upload(d, m->grads + lo, shard, (hi - lo) * sizeof(float));
    int rc = kern_comm_allgather(c, rank, m->grads, n);
    if (rc == 0 && host != NULL)
        d->ops->download(d, host, m->grads, n * sizeof(float));
    model_zero_grad(m);
    return rc;
}

/* Stage 0 keeps everything: its own copy. */
static int state_whole(kern_comm *c, int rank, model *m, const float *shard, size_t lo, size_t hi,
                       float *host)
{
    (void)c, (void)rank, (void)m, (void)lo;
    if (host != NULL)
        memcpy(host, shard, hi * sizeof(float));
    return 0;
}

/* Stage 3: the partition-ordered vector put on the device in the gradient
 * buffer's partition (free between steps), gathered group by group. */
static int state_partition(kern_comm *c, int rank, model *m, const float *shard, size_t lo, size_t hi,
                           float *host)
{
    (void)c, (void)rank;
    if (model_shard_grads_on_host(m)) /* no device partition to stage it: from the host vector itself */
        return model_shard_gather_host(m, shard, host);
    m->dev->ops->upload(m->dev, m->grads, shard, (hi - lo) * sizeof(float));
    int rc = model_shard_gather_host(m, m->grads, host);
    model_zero_grad(m);
    return rc;
}

static const zero_ops stages[ZERO_MAX_STAGE + 1] = {
    {.stage = 0, .note = "", .state_sharded = false, .grads_sharded = false, .keep = keep_all,
     .reduce_bucket = bucket_allreduce, .gather_params = params_whole, .state_to_host = state_whole},
    {.stage = 1, .note = "; ZeRO stage 1 (AdamW moments sharded)", .state_sharded = true,
     .grads_sharded = false, .keep = adamw_shard, .reduce_bucket = bucket_allreduce,
     .gather_params = params_allgather, .state_to_host = state_allgather},
    {.stage = 2, .note = "; ZeRO stage 2 (AdamW moments and reduced gradients sharded)",
     .state_sharded = true, .grads_sharded = true, .keep = adamw_shard, .reduce_bucket = bucket_scatter,
     .gather_params = params_allgather, .state_to_host = state_allgather},
    /* the partition is the whole of what a rank holds; the bucket is the
     * tail only (model_grad_spans), summed into every rank */
    {.stage = 3,
     .note = "; ZeRO stage 3 (parameters, gradients and AdamW moments partitioned, each block gathered "
             "for its forward and backward)",
     .state_sharded = true, .grads_sharded = true, .keep = keep_all, .reduce_bucket = bucket_allreduce,
     .gather_params = params_whole, .params_sharded = true, .state_to_host = state_partition},
};

const zero_ops *zero_ops_of(int stage)
{
    return stage >= 0 && stage <= ZERO_MAX_STAGE ? &stages[stage] : NULL;
}
