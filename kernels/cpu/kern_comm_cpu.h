/* kern_comm_cpu: the shared-memory communicator of a job's CPU-device ranks.
 *
 * Shared memory: every rank passes its own buffer,
 * and kern_comm_cpu_allreduce() leaves the elementwise sum in all of them. It is
 * a reduce-scatter followed by an all-gather: rank r sums chunk r of all
 * buffers in rank order 0..w-1 (so the result is bitwise reproducible and
 * identical on every rank), then each rank copies the other chunks. Ranks
 * meet at barriers; kern_comm_cpu_abort() wakes every waiter and makes every
 * later call return ACC_ECANCELLED at once, so a rank that fails or is
 * cancelled never leaves the others hanging.
 *
 * kern_comm_cpu_reduce_spans() is the same collective over a list of spans
 * of each rank's buffer (their concatenation is split into the w chunks),
 * done when it returns; kern_comm_cpu_reduce_finish() only ends and counts
 * one reduction, for the bucketed call shape of kern_comm.h. Counts: one
 * per call, not per rank (reductions and span lists separately).
 *
 * ZeRO: kern_comm_cpu_scatter_spans() is the reduce-scatter of a span list:
 * each rank sums the span elements of its own shard of [0, n)
 * (kern_shard_lo) in rank order 0..w-1 -- the same sum, element for
 * element, as the all-reduce's -- and the elements at offsets >= n are
 * all-reduced; done when it returns, ended by reduce_finish.
 * kern_comm_cpu_allgather() copies each rank's shard of [0, n) to the
 * others.
 */
#ifndef ACC_KERN_COMM_CPU_H
#define ACC_KERN_COMM_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "kern_span.h"

typedef struct kern_comm_cpu kern_comm_cpu;

int kern_comm_cpu_create(int nranks, kern_comm_cpu **out, acc_err *err);
void kern_comm_cpu_destroy(kern_comm_cpu *c);
int kern_comm_cpu_allreduce(kern_comm_cpu *c, int rank, float *buf, size_t n);
int kern_comm_cpu_reduce_spans(kern_comm_cpu *c, int rank, float *base, const kern_span *spans,
                               int nspans);
int kern_comm_cpu_reduce_finish(kern_comm_cpu *c, int rank);
int kern_comm_cpu_scatter_spans(kern_comm_cpu *c, int rank, float *base, const kern_span *spans,
                                int nspans, size_t n);
int kern_comm_cpu_allgather(kern_comm_cpu *c, int rank, float *buf, size_t n);
int kern_comm_cpu_barrier(kern_comm_cpu *c);
void kern_comm_cpu_abort(kern_comm_cpu *c);
int kern_comm_cpu_aborted(kern_comm_cpu *c);
uint64_t kern_comm_cpu_allreduce_calls(kern_comm_cpu *c);
uint64_t kern_comm_cpu_bucket_calls(kern_comm_cpu *c);

#endif
