/* kern_comm_nccl: NCCL all-reduce between the GPU ranks of one job.
 *
 * The same call shape as kern_comm (kernels/kern_comm.h) so the trainer can
 * switch on the device kind: create for w ranks, allreduce(rank, buf, n)
 * leaves the elementwise fp32 sum of every rank's buffer in all of them,
 * barrier, abort. Differences: `buf` is a device pointer on the rank's GPU,
 * and each rank first binds its CUDA device's stream (kern_cuda_stream()) so
 * that the reduction is queued after that rank's backward without a
 * host-side synchronisation. kern_nccl_allreduce() returns when the sum is
 * in buf. Buckets (kern_nccl_reduce_start) travel on a second, high
 * priority stream per rank, created at bind, so they overlap the compute
 * stream's later kernels; kern_nccl_reduce_finish joins the two.
 *
 * One communicator per rank, made by ncclCommInitAll from the creating
 * thread over the job's GPU ordinals. Cancellation: kern_nccl_abort() (any
 * thread) sets a flag; a rank waiting for its all-reduce polls the stream,
 * the flag and ncclCommGetAsyncError, and on abort or a NCCL error calls
 * ncclCommAbort on its own communicator and returns ACC_ECANCELLED (abort)
 * or ACC_EDEVICE (error, which also aborts the others). So no rank hangs on
 * a peer that failed. kern_nccl_destroy() (after the rank threads ended)
 * aborts what is left of an aborted communicator, destroys a clean one.
 */
#ifndef ACC_KERN_COMM_NCCL_H
#define ACC_KERN_COMM_NCCL_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "kern_span.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kern_nccl kern_nccl;

/* Bytes of NCCL's unique id (ncclUniqueId). */
#define KERN_NCCL_ID_BYTES 128

/* One NCCL communicator per rank; rank r runs on CUDA device ordinals[r]. */
int kern_nccl_create(int nranks, const int *ordinals, kern_nccl **out, acc_err *err);
void kern_nccl_destroy(kern_nccl *c);

/* Rank processes (kernels/kern_comm_mpi.h): rank 0 makes the id, the caller
 * broadcasts it (MPI_Bcast), and every process creates its one rank of
 * `world` on CUDA device `ordinal` (ncclCommInitRank). Only `rank` may then
 * be passed to the per-rank calls, and kern_nccl_barrier (a barrier of this
 * process's threads) must not be used: the caller's MPI barrier stands in.
 * Counts are kept by the rank 0 process only. */
int kern_nccl_unique_id(unsigned char *id, acc_err *err);
int kern_nccl_create_rank(int world, int rank, int ordinal, const unsigned char *id,
                          kern_nccl **out, acc_err *err);

/* Rank `rank` queues its collectives on `stream` (a cudaStream_t of its GPU). */
int kern_nccl_bind(kern_nccl *c, int rank, void *stream, acc_err *err);

/* Sum n floats over all ranks into every rank's device buffer `buf`.
 * 0, ACC_ECANCELLED once aborted, ACC_EDEVICE on a CUDA/NCCL failure
 * (kern_nccl_error has the message), ACC_ESTATE when the rank is unbound.
 * = reduce_start over [0, n) + reduce_finish. */
int kern_nccl_allreduce(kern_nccl *c, int rank, float *buf, size_t n);

/* Queue the all-reduce of spans of `base` (one NCCL group) on the rank's
 * communication stream, after the work its compute stream queued so far;
 * returns without waiting. */
int kern_nccl_reduce_start(kern_nccl *c, int rank, float *base, const kern_span *spans,
                           int nspans);
/* Order the compute stream after every started bucket and wait (polling,
 * abortable) until they are done. Counts one reduction. */
int kern_nccl_reduce_finish(kern_nccl *c, int rank);

/* ZeRO (kern_comm.h): the reduce-scatter bucket of spans (ncclReduce to
 * each part's owner, ncclAllReduce for offsets >= n), ended by
 * kern_nccl_reduce_finish; and the all-gather of buf[0, n)'s shards
 * (ncclAllGather, or ncclBroadcast per owner for uneven shards), which
 * returns when done. */
int kern_nccl_scatter_start(kern_nccl *c, int rank, float *base, const kern_span *spans,
                            int nspans, size_t n);
int kern_nccl_allgather(kern_nccl *c, int rank, float *buf, size_t n);

/* All ranks wait for each other (host side). 0 or ACC_ECANCELLED. */
int kern_nccl_barrier(kern_nccl *c);

/* Make every current and later call return ACC_ECANCELLED. Any thread. */
void kern_nccl_abort(kern_nccl *c);
int kern_nccl_aborted(kern_nccl *c);

/* Reductions finished / bucket starts so far (counted on rank 0). */
uint64_t kern_nccl_allreduce_calls(kern_nccl *c);
uint64_t kern_nccl_bucket_calls(kern_nccl *c);

/* The first CUDA/NCCL failure, if any: 0 or its code, message in err. */
int kern_nccl_error(kern_nccl *c, acc_err *err);

#ifdef __cplusplus
}
#endif

#endif
