/* adamw: the AdamW optimizer over a model's parameter layout.
 *
 * An adamw owns the two moments and the step count for the element range
 * [lo, hi) of a flat parameter buffer: the whole buffer for a replica, or
 * one rank's ZeRO shard (adamw_shard: the collectives' kern_shard_lo, so
 * the shard a rank updates is the one its reduce-scatter sums and its
 * all-gather sends). A step walks the layout's
 * tensors that meet the range, skips those that do not train, and applies
 * decoupled weight decay only where the layout says `decays`; adjacent
 * tensors with the same flags go to the kernel as one run (the update is
 * elementwise, so the runs' cut does not change a bit). The model knows
 * nothing of it: it only holds params and grads.
 *
 * Memory: 2 * (hi - lo) floats on the device, through its budget.
 *
 * Offloaded (adamw_create_host, DeepSpeed's offload_optimizer "cpu"): the
 * moments, an fp32 master copy of params[lo, hi) and a host copy of the
 * range's reduced gradients live in host memory instead (host_mem.h: 4 *
 * (hi - lo) floats, adamw_host_bytes), the device holds none of it. A step
 * copies grads[lo, hi) to the host, runs the CPU backend's AdamW
 * arithmetic (kern_cpu_adamw_span) over the master copy on `threads`
 * pthreads, each over 4-aligned chunks of every run, and copies the
 * master range back into params[lo, hi) (at ZeRO stage 3 the gradients'
 * copy is the model's host gradient partition itself, accumulated there
 * as the backward produces each block's slice: adamw_create_host_grads_on,
 * nothing to download). On CPU devices that is what the
 * device step computes, bit for bit; the master copy stays equal to the
 * device's range because nothing else writes it (adamw_load_master after
 * the weights are loaded). Where the device keeps the range in another
 * form (a ZeRO-3 bf16 partition) the caller writes the master and a store
 * hook replaces the copy-back (adamw_set_store).
 */
#ifndef ACC_ADAMW_H
#define ACC_ADAMW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "train_cfg.h"
#include "kern_device.h"
#include "kern_span.h"
#include "model.h"

typedef struct host_mem host_mem;

/* Offloaded: where the master range goes after a host step when the
 * device keeps it otherwise than as fp32 params[lo, hi) (a ZeRO-3 bf16
 * partition): called with the master (hi - lo floats, of range [lo, hi))
 * and `stage`, the gradients' host copy, free once the step is done
 * (hi - lo floats of scratch). */
typedef void (*adamw_store_fn)(void *ctx, const float *master, size_t lo, size_t hi, void *stage);

typedef struct adamw {
    kern_device *dev;
    size_t lo, hi;      /* elements [lo, hi) of the parameter buffer */
    float *m, *v;       /* [hi - lo] first and second moments: device, or host when offloaded */
    int t;              /* steps taken */
    /* offloaded: the host budget they came from (NULL: on the device), the
     * master copy of params[lo, hi) and the gradients' host copy, and the
     * threads of a host step */
    host_mem *host;
    float *master, *g;
    int threads;
    bool pinned;        /* master and (unless aliased) g are registered with the device (host_register) */
    bool master_aliased; /* adamw_create_host_on: the master is the caller's (not freed) */
    bool g_aliased;     /* adamw_create_host_on, _grads_on: g is the caller's (not freed) */
    adamw_store_fn store; /* offloaded: the copy-back, or NULL: uploaded into params[lo, hi) */
    void *store_ctx;
} adamw;

/* ---- shard arithmetic (pure)
 *
 * Rank r of w owns [adamw_shard_lo(n, r, w), adamw_shard_lo(n, r + 1, w)).
 * Invariant: for w >= 1 the ranges of ranks 0..w-1 are in order, disjoint
 * and cover [0, n) exactly (lo(0) = 0, lo(w) = n); each holds floor(n/w)
 * or ceil(n/w) elements, the first n % w ranks one more. No overflow for
 * any n (no n * r product). */
static inline size_t adamw_shard_lo(size_t n, int rank, int world)
{
    return kern_shard_lo(n, rank, world); /* the collectives' shards (kern_span.h) */
}

static inline void adamw_shard(size_t n, int rank, int world, size_t *lo, size_t *hi)
{
    *lo = adamw_shard_lo(n, rank, world);
    *hi = adamw_shard_lo(n, rank + 1, world);
}

/* Device bytes of the moments for (hi - lo) elements; overflow-checked
 * (ACC_EINVAL, field "model"). */
int adamw_state_bytes(size_t lo, size_t hi, uint64_t *bytes, acc_err *err);

/* Host bytes of an offloaded optimizer for (hi - lo) elements: moments,
 * master copy, gradients' copy (4 floats each); overflow-checked
 * (ACC_EINVAL, field "model"). */
int adamw_host_bytes(size_t lo, size_t hi, uint64_t *bytes, acc_err *err);
/* The same without the gradients' copy (adamw_create_host_grads_on): 3
 * floats each. */
int adamw_host_bytes_grads_on(size_t lo, size_t hi, uint64_t *bytes, acc_err *err);

/* Moments (zeroed) for [lo, hi) on dev; t = 0. ACC_EOOM from the device. */
int adamw_create(kern_device *dev, size_t lo, size_t hi, adamw **out, acc_err *err);
/* Offloaded: moments (zeroed), master and gradients' copy in `host`
 * (ACC_ENOMEM naming "host memory" past its budget); steps on `threads`
 * host threads (>= 1). With `pin`, the two buffers that cross the bus
 * (master and gradients' copy) are page-locked through the device's
 * host_register where it has one (CUDA; CPU devices: nothing to do); a
 * refusal is ACC_EDEVICE naming zero_optimization.offload_optimizer.pin_memory.
 * The master copy is zero until adamw_load_master. */
/* offload_param: the parameters and gradients of [lo, hi) already in host
 * memory (params_host, grads_host: [hi - lo] each, the model's host
 * partition): only the moments are allocated in `host`; the step updates
 * params_host in place from grads_host, nothing crosses the bus. */
int adamw_create_host_on(kern_device *dev, host_mem *host, int threads, size_t lo, size_t hi, float *params_host,
                         float *grads_host, adamw **out, acc_err *err);
int adamw_create_host(kern_device *dev, host_mem *host, int threads, bool pin, size_t lo, size_t hi,
                      adamw **out, acc_err *err);
/* ZeRO-3 with the gradient partition in host memory (model_config.grads_host):
 * adamw_create_host whose gradients' copy is grads_host [hi - lo], the
 * partition the reduce-scatters accumulate into: nothing is downloaded
 * before a step; moments and master are allocated (the master stays
 * separate from the device's parameters), `pin` page-locks the master. */
int adamw_create_host_grads_on(kern_device *dev, host_mem *host, int threads, bool pin, size_t lo, size_t hi,
                               float *grads_host, adamw **out, acc_err *err);
void adamw_free(adamw *a);

/* Offloaded: the master copy := params[lo, hi) (device); else nothing. */
void adamw_load_master(adamw *a, const float *params);
/* Offloaded: the copy-back after each step through fn (adamw_store_fn)
 * instead of the upload. The caller then writes the master itself
 * (adamw_load_master would read the device's params). */
void adamw_set_store(adamw *a, adamw_store_fn fn, void *ctx);

/* Moment `which` (0: first, 1: second) of the range, (hi - lo) floats,
 * copied to / from host memory `buf`, wherever the moments live. */
void adamw_moment_get(const adamw *a, int which, float *buf);
void adamw_moment_set(adamw *a, int which, const float *buf);

/* One step: t += 1, then for each trainable run of the layout inside
 * [lo, hi): p -= lr * (adam(g * grad_scale) + wd * p), wd = the spec's
 * weight_decay where the tensor decays, else 0. params and grads are the
 * model's device buffers (indexed by absolute element). */
void adamw_step(adamw *a, const model_layout *l, float *params, const float *grads, float lr,
                const spec_optim *o, float grad_scale);

#endif
