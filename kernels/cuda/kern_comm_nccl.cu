/* kern_comm_nccl: NCCL all-reduce between a job's GPU ranks.
 * Contract: kern_comm_nccl.h. Every CUDA and NCCL call is checked; the
 * first failure is kept (under the lock) and reported by kern_nccl_error. */
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kern_comm_nccl.h"

struct kern_nccl {
    int nranks;
    ncclComm_t *comms;      /* NULL once that rank aborted its own */
    cudaStream_t *streams;  /* bound per rank */
    int *ordinals;
    int aborted;            /* __atomic */
    uint64_t calls;         /* __atomic */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int waiting;
    unsigned long gen;
    int err_code;
    char err_msg[480];
};

static void nccl_fail(kern_nccl *c, const char *what, const char *why)
{
    pthread_mutex_lock(&c->mu);
    if (c->err_code == 0) {
        c->err_code = ACC_EDEVICE;
        snprintf(c->err_msg, sizeof c->err_msg, "nccl: %.200s failed: %.200s", what, why);
    }
    pthread_mutex_unlock(&c->mu);
}

#define NC_OK(c, call) nc_ok((c), (call), #call)
#define NCU_OK(c, call) ncu_ok((c), (call), #call)

static bool nc_ok(kern_nccl *c, ncclResult_t rc, const char *what)
{
    if (rc == ncclSuccess)
        return true;
    nccl_fail(c, what, ncclGetErrorString(rc));
    return false;
}

static bool ncu_ok(kern_nccl *c, cudaError_t rc, const char *what)
{
    if (rc == cudaSuccess)
        return true;
    nccl_fail(c, what, cudaGetErrorString(rc));
    return false;
}

extern "C" int kern_nccl_create(int nranks, const int *ordinals, kern_nccl **out, acc_err *err)
{
    *out = NULL;
    if (nranks < 1)
        return acc_err_set(err, ACC_EINVAL, "devices", "nccl: %d ranks", nranks);
    kern_nccl *c = (kern_nccl *)calloc(1, sizeof *c);
    if (c == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "nccl: out of host memory");
    c->nranks = nranks;
    c->comms = (ncclComm_t *)calloc((size_t)nranks, sizeof *c->comms);
    c->streams = (cudaStream_t *)calloc((size_t)nranks, sizeof *c->streams);
    c->ordinals = (int *)calloc((size_t)nranks, sizeof *c->ordinals);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    if (c->comms == NULL || c->streams == NULL || c->ordinals == NULL) {
        kern_nccl_destroy(c);
        return acc_err_set(err, ACC_ENOMEM, "", "nccl: out of host memory");
    }
    memcpy(c->ordinals, ordinals, (size_t)nranks * sizeof *ordinals);
    ncclResult_t rc = ncclCommInitAll(c->comms, nranks, c->ordinals);
    if (rc != ncclSuccess) {
        memset(c->comms, 0, (size_t)nranks * sizeof *c->comms);
        int code = acc_err_set(err, ACC_EDEVICE, "devices", "nccl: ncclCommInitAll(%d ranks): %s",
                               nranks, ncclGetErrorString(rc));
        kern_nccl_destroy(c);
        return code;
    }
    *out = c;
    return 0;
}

extern "C" void kern_nccl_destroy(kern_nccl *c)
{
    if (c == NULL)
        return;
    int ab = kern_nccl_aborted(c) || c->err_code != 0;
    for (int r = 0; c->comms != NULL && r < c->nranks; r++) {
        if (c->comms[r] == NULL)
            continue;
        /* errors are ignored here: nothing is left to report them to */
        if (ab)
            (void)ncclCommAbort(c->comms[r]);
        else
            (void)ncclCommDestroy(c->comms[r]);
    }
    free(c->comms);
    free(c->streams);
    free(c->ordinals);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

extern "C" int kern_nccl_bind(kern_nccl *c, int rank, void *stream, acc_err *err)
{
    if (rank < 0 || rank >= c->nranks)
        return acc_err_set(err, ACC_EINVAL, "", "nccl: rank %d of %d", rank, c->nranks);
    c->streams[rank] = (cudaStream_t)stream;
    return 0;
}

static void abort_own(kern_nccl *c, int rank)
{
    if (c->comms[rank] != NULL) {
        if (!NC_OK(c, ncclCommAbort(c->comms[rank])))
            return;
        c->comms[rank] = NULL;
    }
}

extern "C" int kern_nccl_allreduce(kern_nccl *c, int rank, float *buf, size_t n)
{
    if (kern_nccl_aborted(c))
        return ACC_ECANCELLED;
    if (rank < 0 || rank >= c->nranks || c->streams[rank] == NULL || c->comms[rank] == NULL)
        return ACC_ESTATE;
    if (rank == 0)
        __atomic_add_fetch(&c->calls, 1, __ATOMIC_SEQ_CST);
    cudaStream_t s = c->streams[rank];
    ncclComm_t comm = c->comms[rank];
    if (!NC_OK(c, ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, comm, s))) {
        kern_nccl_abort(c);
        abort_own(c, rank);
        return ACC_EDEVICE;
    }
    /* wait without blocking in the driver, so an abort is seen */
    for (;;) {
        cudaError_t q = cudaStreamQuery(s);
        if (q == cudaSuccess)
            return 0;
        if (q != cudaErrorNotReady) {
            NCU_OK(c, q);
            kern_nccl_abort(c);
            abort_own(c, rank);
            return ACC_EDEVICE;
        }
        ncclResult_t ae = ncclSuccess;
        if (!NC_OK(c, ncclCommGetAsyncError(comm, &ae)) ||
            (ae != ncclSuccess && ae != ncclInProgress)) {
            if (ae != ncclSuccess)
                nccl_fail(c, "all-reduce (async)", ncclGetErrorString(ae));
            kern_nccl_abort(c);
            abort_own(c, rank);
            return ACC_EDEVICE;
        }
        if (kern_nccl_aborted(c)) {
            abort_own(c, rank);
            return ACC_ECANCELLED;
        }
        struct timespec ts = {0, 20000}; /* 20 us */
        nanosleep(&ts, NULL);
    }
}

extern "C" int kern_nccl_barrier(kern_nccl *c)
{
    pthread_mutex_lock(&c->mu);
    if (kern_nccl_aborted(c)) {
        pthread_mutex_unlock(&c->mu);
        return ACC_ECANCELLED;
    }
    unsigned long g = c->gen;
    if (++c->waiting == c->nranks) {
        c->waiting = 0;
        c->gen++;
        pthread_cond_broadcast(&c->cv);
    } else {
        while (g == c->gen && !kern_nccl_aborted(c))
            pthread_cond_wait(&c->cv, &c->mu);
    }
    int rc = g == c->gen ? ACC_ECANCELLED : 0;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

extern "C" void kern_nccl_abort(kern_nccl *c)
{
    pthread_mutex_lock(&c->mu);
    __atomic_store_n(&c->aborted, 1, __ATOMIC_SEQ_CST);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

extern "C" int kern_nccl_aborted(kern_nccl *c)
{
    return __atomic_load_n(&c->aborted, __ATOMIC_SEQ_CST);
}

extern "C" uint64_t kern_nccl_allreduce_calls(kern_nccl *c)
{
    return __atomic_load_n(&c->calls, __ATOMIC_SEQ_CST);
}

extern "C" int kern_nccl_error(kern_nccl *c, acc_err *err)
{
    pthread_mutex_lock(&c->mu);
    int code = c->err_code;
    if (code != 0)
        acc_err_set(err, code, "devices", "%s", c->err_msg);
    pthread_mutex_unlock(&c->mu);
    return code;
}
