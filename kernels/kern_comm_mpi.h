/* kern_comm_mpi: opening the communicator of ranks that are processes (one
 * per device, started by mpirun), over MPI_COMM_WORLD. Only the rank
 * program (daemon/rank_main.c) links it.
 *
 * kern_comm_mpi.c implements the declared set kern_comm_ops (kern_comm.h)
 * for CPU ranks with the same arithmetic as the shared-memory communicator
 * (kernels/cpu/kern_comm_cpu.c), so a job
 * run as w rank processes gets the bits of the same job run as w threads:
 * the spans' concatenation is cut into the same w chunks, rank r receives
 * chunk r of every rank (MPI_Alltoallv) and sums it in rank order 0..w-1
 * itself, starting from rank 0's value, exactly as the threads do; then
 * every rank gathers the summed chunks (MPI_Allgatherv). MPI_Allreduce is
 * not used: its summation order is the library's (it varies with the
 * algorithm Open MPI picks by size and world), so it does not give these
 * bits. The ZeRO reduce-scatter is the same scheme with the shards as the
 * chunks (rank q receives every rank's parts of its shard of [0, n),
 * MPI_Alltoallv, and sums them in rank order); the all-gather is
 * MPI_Allgatherv in place (a copy: no arithmetic).
 *
 * Errors: the communicator is a dup of MPI_COMM_WORLD with
 * MPI_ERRORS_RETURN; every MPI call is checked, the first failure is kept
 * (MPI_Error_string) for kern_comm_error() and returned as ACC_EDEVICE.
 * kern_comm_abort() only raises the flag (every later call returns
 * ACC_ECANCELLED); ending the other processes is the rank program's job
 * (MPI_Abort once its trainer has reported), see daemon/rank_main.c, since
 * MPI_Abort from inside the trainer would end this process before rank 0's
 * last event is written.
 *
 * One rank per process: `rank` arguments must be this process's rank.
 * The caller has called MPI_Init_thread with at least MPI_THREAD_SERIALIZED
 * (the trainer calls from its rank thread, the program from its main one,
 * never at once).
 */
#ifndef ACC_KERN_COMM_MPI_H
#define ACC_KERN_COMM_MPI_H

#include "err.h"
#include "kern_comm.h"

/* A communicator over MPI_COMM_WORLD; *rank and *world are this process's
 * rank and the number of processes. */
int kern_comm_mpi_open(kern_comm **out, int *rank, int *world, acc_err *err);

/* CUDA builds: the GPU variant. This process's rank of MPI_COMM_WORLD runs
 * on CUDA device `ordinal`; rank 0's NCCL unique id is broadcast over MPI
 * (MPI_Bcast) and every process joins with ncclCommInitRank. The
 * reductions are NCCL's (kern_comm_nccl_open_rank: device buffers, the rank's
 * stream, ncclCommAbort on abort or error), the barrier MPI's. Without
 * CUDA: ACC_EDEVICE. */
int kern_comm_mpi_open_nccl(int ordinal, kern_comm **out, int *rank, int *world, acc_err *err);

#endif
