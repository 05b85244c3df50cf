/* kern_comm: collectives between the ranks (worker threads) of one job.
 *
 * One interface over its implementations, chosen by the kind of the job's
 * devices (and, for rank processes, by the rank program), so the trainer
 * never knows which it runs on:
 *  - CPU devices, ranks as threads: shared memory (kernels/cpu/kern_comm_cpu.c):
 *    a reduce-scatter + all-gather in fixed rank order, bitwise
 *    reproducible and identical on every rank;
 *  - CUDA GPUs: NCCL (kernels/cuda/kern_comm_nccl.cu), buffers in device
 *    memory, each rank's collectives queued on its device's stream;
 *  - CPU devices, ranks as processes: MPI (kernels/kern_comm_mpi.c), the
 *    shared-memory arithmetic over messages.
 * kern_comm_allreduce() leaves the elementwise sum of every rank's `buf` in
 * all of them. kern_comm_abort() (any thread) makes every current and later
 * call return ACC_ECANCELLED, so a rank that fails or is cancelled never
 * leaves the others hanging.
 *
 * Bucketed reduction (invariant 3 of docs/invariants.md: the gradients cross devices once a step,
 * in buckets that overlap the last micro-step's backward): one reduction is
 * any number of kern_comm_reduce_start() calls, each summing a list of spans
 * of one buffer, ended by one kern_comm_reduce_finish(). On GPUs a start
 * queues its collectives on a communication stream of the rank, behind
 * everything the rank's compute stream queued so far, and returns at once,
 * so the backward goes on while the bucket travels; finish makes the
 * compute stream wait for them. On CPU devices a start reduces at once (the
 * kernel threads already use every core; there is nothing to overlap with).
 * Every rank must make the same sequence of calls with the same spans.
 * kern_comm_allreduce() is one start over [0, n) plus a finish.
 *
 * Shards: kern_comm_scatter_start() is the bucket of a reduce-scatter: the
 * same spans, but each rank is left with the sums of the elements it owns
 * only (kern_shard_lo over the buffer's first n floats); elements at
 * offsets >= n belong to no shard and are summed into every rank, as an
 * all-reduce would. It is ended by the same kern_comm_reduce_finish().
 * kern_comm_allgather() copies every rank's shard of a buffer to all
 * (kern_comm_allgather16: of 16-bit elements, the same shards of n).
 * (What the shards are and what rides past n is the caller's: the ZeRO
 * stages, core/train/zero.h.)
 * Every sum is in rank order 0..w-1 on CPU devices (shared memory and MPI
 * alike), so a rank's shard of a reduce-scatter has the bits an
 * all-reduce gives it.
 *
 * Counting: kern_comm_allreduce_calls() counts reductions (finishes),
 * kern_comm_bucket_calls() counts starts (all-reduce and reduce-scatter
 * buckets), each once per call, not per rank. All-gathers are not counted.
 *
 * Implementations: one declared set, kern_comm_ops below (libuv's
 * src/unix/internal.h style: one list of operations, one file per
 * variant), implemented once in each backend file -- kernels/cpu/
 * kern_comm_cpu.c, kernels/cuda/kern_comm_nccl.cu (CUDA builds),
 * kernels/kern_comm_mpi.c (the rank program) -- as static functions in a
 * static table; a backend exports only how to open one (below). No backend
 * has a public header of its own. kern_comm.c dispatches every kern_comm_*
 * call through the table of the communicator; nothing else picks one.
 */
#ifndef ACC_KERN_COMM_H
#define ACC_KERN_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "kern_device.h"
#include "kern_span.h"

typedef struct kern_comm kern_comm;

/* A communicator for the job's `n` devices (all of one kind). */
int kern_comm_open(const kern_device_info *devs, int n, kern_comm **out, acc_err *err);
/* A shared-memory communicator for `nranks` CPU ranks (kern_comm_cpu.c). */
int kern_comm_create(int nranks, kern_comm **out, acc_err *err);
void kern_comm_destroy(kern_comm *c);

/* Each rank, from its own thread, once its device is open (on GPUs: binds
 * the device's stream). A no-op on CPU devices. */
int kern_comm_bind(kern_comm *c, int rank, kern_device *dev, acc_err *err);

/* Sum `n` floats over all ranks into every rank's `buf` (device memory).
 * 0, ACC_ECANCELLED when aborted, ACC_EDEVICE on a GPU collective failure. */
int kern_comm_allreduce(kern_comm *c, int rank, float *buf, size_t n);

/* Start summing spans[0..nspans) of `base` (device memory) over all ranks
 * (1 <= nspans <= KERN_COMM_MAX_SPANS, spans disjoint). The spans must not
 * be written again until kern_comm_reduce_finish(). Same returns as
 * kern_comm_allreduce; ACC_EINVAL for a bad span list. */
int kern_comm_reduce_start(kern_comm *c, int rank, float *base, const kern_span *spans,
                           int nspans);
/* Wait until every span started since the last finish holds its sum; on
 * GPUs the rank's compute stream is ordered after them. */
int kern_comm_reduce_finish(kern_comm *c, int rank);

/* Start the reduce-scatter of spans[0..nspans) of `base` (rules of
 * kern_comm_reduce_start): once kern_comm_reduce_finish() returned, rank
 * r's elements in [kern_shard_lo(n, r, w), kern_shard_lo(n, r + 1, w))
 * and those at offsets >= n hold the sums over all ranks; its other
 * span elements are undefined. Every rank passes the same spans and n. */
int kern_comm_scatter_start(kern_comm *c, int rank, float *base, const kern_span *spans,
                            int nspans, size_t n);

/* All-gather: rank r's shard [kern_shard_lo(n, r, w), kern_shard_lo(n, r + 1, w))
 * of `buf` (device memory) is copied into every rank's `buf`; returns when
 * done (on GPUs the compute stream is ordered after it). Same returns as
 * kern_comm_allreduce. */
int kern_comm_allgather(kern_comm *c, int rank, float *buf, size_t n);
/* The same over n 16-bit elements (bf16 values, copied as bits: the
 * ZeRO-3 store's bf16 working weights, model_shard.h). */
int kern_comm_allgather16(kern_comm *c, int rank, uint16_t *buf, size_t n);

/* All ranks wait for each other. 0 or ACC_ECANCELLED. */
int kern_comm_barrier(kern_comm *c);

/* Make every current and later call return ACC_ECANCELLED. Any thread. */
void kern_comm_abort(kern_comm *c);
int kern_comm_aborted(kern_comm *c);

/* The communicator's first failure (NCCL's message): 0, or its code with
 * the message in err. Shared memory never fails this way. */
int kern_comm_error(kern_comm *c, acc_err *err);

/* Reductions (kern_comm_allreduce or reduce_finish calls) so far. */
uint64_t kern_comm_allreduce_calls(kern_comm *c);
/* Bucket starts (kern_comm_reduce_start, one per allreduce) so far. */
uint64_t kern_comm_bucket_calls(kern_comm *c);

/* ---- the declared set of a communicator implementation
 *
 * Each entry has the contract of the kern_comm_* call of the same name
 * above, on the implementation's own state `impl`. Spans are checked by
 * kern_comm.c before reduce_start. All entries are required except those
 * marked OPTIONAL. */
typedef struct kern_comm_ops {
    const char *name;    /* "shm", "nccl" */
    void (*destroy)(void *impl);
    /* OPTIONAL: NULL = nothing to bind (0) */
    int (*bind)(void *impl, int rank, kern_device *dev, acc_err *err);
    int (*allreduce)(void *impl, int rank, float *buf, size_t n);
    int (*reduce_start)(void *impl, int rank, float *base, const kern_span *spans, int nspans);
    int (*reduce_finish)(void *impl, int rank);
    int (*scatter_start)(void *impl, int rank, float *base, const kern_span *spans, int nspans,
                         size_t n);
    int (*allgather)(void *impl, int rank, float *buf, size_t n);
    int (*allgather16)(void *impl, int rank, uint16_t *buf, size_t n);
    int (*barrier)(void *impl);
    void (*abort)(void *impl);
    int (*aborted)(void *impl);
    /* OPTIONAL: NULL = never fails this way (0) */
    int (*error)(void *impl, acc_err *err);
    uint64_t (*allreduce_calls)(void *impl);
    uint64_t (*bucket_calls)(void *impl);
} kern_comm_ops;

/* A communicator over a backend's state `impl` (for the backend files):
 * takes `impl`, which ops->destroy frees, also when this fails. */
int kern_comm_wrap(const kern_comm_ops *ops, void *impl, kern_comm **out, acc_err *err);

/* ---- opening a backend (besides kern_comm_create)
 *
 * NCCL (kernels/cuda/kern_comm_nccl.cu; CUDA builds only). Ranks as
 * threads: rank r runs on CUDA device ordinals[r]. Ranks as processes
 * (kernels/kern_comm_mpi.h): rank 0 makes the id, the caller broadcasts
 * it, every process opens its one rank of `world` on CUDA device
 * `ordinal`; `host` / `host_impl` is the processes' own communicator
 * (taken, freed with this one, also when this fails), whose barrier,
 * abort and error stand in for those of threads. */
int kern_comm_nccl_open(int nranks, const int *ordinals, kern_comm **out, acc_err *err);
#define KERN_COMM_NCCL_ID_BYTES 128 /* NCCL's unique id (ncclUniqueId) */
int kern_comm_nccl_unique_id(unsigned char *id, acc_err *err);
int kern_comm_nccl_open_rank(int world, int rank, int ordinal, const unsigned char *id, const kern_comm_ops *host,
                             void *host_impl, kern_comm **out, acc_err *err);

#endif
