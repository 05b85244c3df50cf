/* kern_comm: collectives between the ranks (worker threads) of one job.
 *
 * The CPU communicator is shared memory: every rank passes its own buffer,
 * and kern_comm_allreduce() leaves the elementwise sum in all of them. It is
 * a reduce-scatter followed by an all-gather: rank r sums chunk r of all
 * buffers in rank order 0..w-1 (so the result is bitwise reproducible and
 * identical on every rank), then each rank copies the other chunks. Ranks
 * meet at barriers; kern_comm_abort() wakes every waiter and makes every
 * later call return ACC_ECANCELLED at once, so a rank that fails or is
 * cancelled never leaves the others hanging. The all-reduce counts its
 * calls (one per call, not per rank).
 */
#ifndef ACC_KERN_COMM_H
#define ACC_KERN_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

typedef struct kern_comm kern_comm;

int kern_comm_create(int nranks, kern_comm **out, acc_err *err);
void kern_comm_destroy(kern_comm *c);

/* Sum `n` floats over all ranks into every rank's `buf`. Returns 0, or
 * ACC_ECANCELLED when the communicator was aborted. */
int kern_comm_allreduce(kern_comm *c, int rank, float *buf, size_t n);

/* All ranks wait for each other. 0 or ACC_ECANCELLED. */
int kern_comm_barrier(kern_comm *c);

/* Make every current and later call return ACC_ECANCELLED. Any thread. */
void kern_comm_abort(kern_comm *c);
int kern_comm_aborted(kern_comm *c);

/* All-reduce calls completed or begun so far. */
uint64_t kern_comm_allreduce_calls(kern_comm *c);

#endif
