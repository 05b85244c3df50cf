/* kern_comm_nccl: kern_comm.h's declared set for CUDA ranks, over NCCL.
 *
 * `buf` is a device pointer on the rank's GPU, and each rank first binds
 * (nc_bind) its CUDA device's stream (kern_cuda_stream()) so that the
 * reduction is queued after that rank's backward without a host-side
 * synchronisation. nc_allreduce() returns when the sum is in buf. Buckets
 * (nc_reduce_start) travel on a second, high priority stream per rank,
 * created at bind, so they overlap the compute stream's later kernels;
 * nc_reduce_finish joins the two. The ZeRO reduce-scatter bucket is
 * ncclReduce to each part's owner (ncclAllReduce for offsets >= n); the
 * all-gather is ncclAllGather, or ncclBroadcast per owner for uneven shards.
 *
 * Ranks as threads (kern_comm_nccl_open): one communicator per rank, made
 * by ncclCommInitAll from the creating thread over the job's GPU ordinals. Cancellation: nc_abort() (any
 * thread) sets a flag; a rank waiting for its all-reduce polls the stream,
 * the flag and ncclCommGetAsyncError, and on abort or a NCCL error calls
 * ncclCommAbort on its own communicator and returns ACC_ECANCELLED (abort)
 * or ACC_EDEVICE (error, which also aborts the others). So no rank hangs on
 * a peer that failed. nc_destroy() (after the rank threads ended)
 * aborts what is left of an aborted communicator, destroys a clean one.
 *
 * Ranks as processes (kern_comm_nccl_open_rank, from kernels/kern_comm_mpi.c):
 * each process creates its one rank (ncclCommInitRank); the host
 * communicator it is given stands in for the barrier (the one here is of
 * this process's threads), hears of aborts and reports its own failures.
 * Counts are kept by the rank 0 process only.
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern "C" {
#include "kern_comm.h" /* the declared set this file implements */
}
#include "kern_cuda.h"

typedef struct kern_nccl {
    int nranks;
    ncclComm_t *comms;      /* NULL once that rank aborted its own */
    cudaStream_t *streams;  /* bound per rank: its compute stream */
    cudaStream_t *cstreams; /* per rank: its communication stream (ours) */
    cudaEvent_t *ev_ready;  /* compute stream -> bucket start */
    cudaEvent_t *ev_done;   /* communication stream -> finish */
    int *ordinals;
    int aborted;            /* __atomic */
    uint64_t calls;         /* __atomic: reductions finished (rank 0) */
    uint64_t buckets;       /* __atomic: bucket starts (rank 0) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int waiting;
    unsigned long gen;
    int err_code;
    char err_msg[480];
    /* rank processes: the host communicator (MPI's) that stands in for the
     * barrier, hears of aborts, reports its own failures; freed with this */
    const kern_comm_ops *host;
    void *host_impl;
} kern_nccl;

/* the declared set (kern_comm.h), implemented below */
static int nc_bind(void *impl, int rank, kern_device *dev, acc_err *err);
static void nc_destroy(void *impl);
static int nc_reduce_start(void *impl, int rank, float *base, const kern_span *spans, int nspans);
static int nc_scatter_start(void *impl, int rank, float *base, const kern_span *spans, int nspans, size_t n);
static int nc_allgather(void *impl, int rank, float *buf, size_t n);
static int nc_allgather16(void *impl, int rank, uint16_t *buf, size_t n);
static int nc_reduce_finish(void *impl, int rank);
static int nc_allreduce(void *impl, int rank, float *buf, size_t n);
static int nc_barrier(void *impl);
static void nc_abort(void *impl);
static int nc_aborted(void *impl);
static uint64_t nc_allreduce_calls(void *impl);
static uint64_t nc_bucket_calls(void *impl);
static int nc_error(void *impl, acc_err *err);

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

/* The communicator's state for `nranks` ranks, no NCCL communicator yet. */
static kern_nccl *nccl_alloc(int nranks)
{
    kern_nccl *c = (kern_nccl *)calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    c->nranks = nranks;
    c->comms = (ncclComm_t *)calloc((size_t)nranks, sizeof *c->comms);
    c->streams = (cudaStream_t *)calloc((size_t)nranks, sizeof *c->streams);
    c->cstreams = (cudaStream_t *)calloc((size_t)nranks, sizeof *c->cstreams);
    c->ev_ready = (cudaEvent_t *)calloc((size_t)nranks, sizeof *c->ev_ready);
    c->ev_done = (cudaEvent_t *)calloc((size_t)nranks, sizeof *c->ev_done);
    c->ordinals = (int *)calloc((size_t)nranks, sizeof *c->ordinals);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    if (c->comms == NULL || c->streams == NULL || c->ordinals == NULL || c->cstreams == NULL ||
        c->ev_ready == NULL || c->ev_done == NULL) {
        nc_destroy(c);
        return NULL;
    }
    return c;
}

static int nccl_create(int nranks, const int *ordinals, kern_nccl **out, acc_err *err)
{
    *out = NULL;
    if (nranks < 1)
        return acc_err_set(err, ACC_EINVAL, "devices", "nccl: %d ranks", nranks);
    kern_nccl *c = nccl_alloc(nranks);
    if (c == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "nccl: out of host memory");
    memcpy(c->ordinals, ordinals, (size_t)nranks * sizeof *ordinals);
    ncclResult_t rc = ncclCommInitAll(c->comms, nranks, c->ordinals);
    if (rc != ncclSuccess) {
        memset(c->comms, 0, (size_t)nranks * sizeof *c->comms);
        int code = acc_err_set(err, ACC_EDEVICE, "devices", "nccl: ncclCommInitAll(%d ranks): %s",
                               nranks, ncclGetErrorString(rc));
        nc_destroy(c);
        return code;
    }
    *out = c;
    return 0;
}

static_assert(sizeof(ncclUniqueId) == KERN_COMM_NCCL_ID_BYTES, "KERN_COMM_NCCL_ID_BYTES is NCCL's id size");

extern "C" int kern_comm_nccl_unique_id(unsigned char *id, acc_err *err)
{
    ncclUniqueId u;
    ncclResult_t rc = ncclGetUniqueId(&u);
    if (rc != ncclSuccess)
        return acc_err_set(err, ACC_EDEVICE, "devices", "nccl: ncclGetUniqueId: %s",
                           ncclGetErrorString(rc));
    memcpy(id, &u, sizeof u);
    return 0;
}

static int nccl_create_rank(int world, int rank, int ordinal, const unsigned char *id, kern_nccl **out,
                            acc_err *err)
{
    *out = NULL;
    if (world < 1 || rank < 0 || rank >= world)
        return acc_err_set(err, ACC_EINVAL, "devices", "nccl: rank %d of %d", rank, world);
    kern_nccl *c = nccl_alloc(world);
    if (c == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "nccl: out of host memory");
    c->ordinals[rank] = ordinal; /* the other ranks' entries stay unused */
    cudaError_t e = cudaSetDevice(ordinal);
    if (e != cudaSuccess) {
        nc_destroy(c);
        return acc_err_set(err, ACC_EDEVICE, "devices", "nccl: cudaSetDevice(%d): %s", ordinal,
                           cudaGetErrorString(e));
    }
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclResult_t rc = ncclCommInitRank(&c->comms[rank], world, u, rank);
    if (rc != ncclSuccess) {
        c->comms[rank] = NULL;
        int code = acc_err_set(err, ACC_EDEVICE, "devices", "nccl: ncclCommInitRank(rank %d of %d): %s",
                               rank, world, ncclGetErrorString(rc));
        nc_destroy(c);
        return code;
    }
    *out = c;
    return 0;
}

/* The per-rank communication streams and events (errors ignored: nothing
 * is left to report them to). */
static void release_streams(kern_nccl *c)
{
    for (int r = 0; c->cstreams != NULL && c->ev_ready != NULL && c->ev_done != NULL &&
                    c->ordinals != NULL && r < c->nranks;
         r++) {
        if (c->cstreams[r] == NULL && c->ev_ready[r] == NULL && c->ev_done[r] == NULL)
            continue;
        (void)cudaSetDevice(c->ordinals[r]);
        if (c->ev_ready[r] != NULL)
            (void)cudaEventDestroy(c->ev_ready[r]);
        if (c->ev_done[r] != NULL)
            (void)cudaEventDestroy(c->ev_done[r]);
        if (c->cstreams[r] != NULL)
            (void)cudaStreamDestroy(c->cstreams[r]);
    }
}

static void nc_destroy(void *impl)
{
    kern_nccl *c = (kern_nccl *)impl;
    if (c == NULL)
        return;
    const kern_comm_ops *host = c->host;
    void *host_impl = c->host_impl;
    int ab = nc_aborted(c) || c->err_code != 0;
    for (int r = 0; c->comms != NULL && r < c->nranks; r++) {
        if (c->comms[r] == NULL)
            continue;
        /* errors are ignored here: nothing is left to report them to */
        if (ab)
            (void)ncclCommAbort(c->comms[r]);
        else
            (void)ncclCommDestroy(c->comms[r]);
    }
    release_streams(c);
    free(c->comms);
    free(c->streams);
    free(c->cstreams);
    free(c->ev_ready);
    free(c->ev_done);
    free(c->ordinals);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
    if (host != NULL)
        host->destroy(host_impl);
}

static int nc_bind(void *impl, int rank, kern_device *dev, acc_err *err)
{
    kern_nccl *c = (kern_nccl *)impl;
    void *stream = kern_cuda_stream(dev);
    if (rank < 0 || rank >= c->nranks)
        return acc_err_set(err, ACC_EINVAL, "", "nccl: rank %d of %d", rank, c->nranks);
    if (c->cstreams[rank] != NULL)
        return acc_err_set(err, ACC_ESTATE, "", "nccl: rank %d bound twice", rank);
    /* the bucket collectives get the device's highest stream priority, so
     * they are scheduled ahead of the backward kernels they overlap */
    int least = 0, greatest = 0;
    cudaError_t e = cudaSetDevice(c->ordinals[rank]);
    if (e == cudaSuccess)
        e = cudaDeviceGetStreamPriorityRange(&least, &greatest);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&c->ev_ready[rank], cudaEventDisableTiming);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&c->ev_done[rank], cudaEventDisableTiming);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithPriority(&c->cstreams[rank], cudaStreamNonBlocking, greatest);
    if (e != cudaSuccess)
        return acc_err_set(err, ACC_EDEVICE, "devices", "nccl: rank %d stream/event setup: %s",
                           rank, cudaGetErrorString(e));
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

/* A failed call on rank `rank`: abort everyone, and our own communicator. */
static int fail_rank(kern_nccl *c, int rank)
{
    nc_abort(c);
    abort_own(c, rank);
    return ACC_EDEVICE;
}

static bool rank_ready(kern_nccl *c, int rank)
{
    return rank >= 0 && rank < c->nranks && c->streams[rank] != NULL &&
           c->cstreams[rank] != NULL && c->comms[rank] != NULL;
}

/* Once aborted, a rank that returns must not leave its own collectives
 * (an earlier bucket waiting for a peer that left) running on the GPU:
 * its teardown would wait for them forever. */
static int cancelled(kern_nccl *c, int rank)
{
    if (rank >= 0 && rank < c->nranks)
        abort_own(c, rank);
    return ACC_ECANCELLED;
}

/* A bucket's start (reduce_start, scatter_start): counted once, its
 * communication stream made to wait for what the compute stream queued so
 * far (the backward that produced these gradients; the compute stream does
 * not wait for the bucket), then an NCCL group opened, which the caller
 * always ends. 0, or the rank's failure. */
static int bucket_begin(kern_nccl *c, int rank)
{
    if (nc_aborted(c))
        return cancelled(c, rank);
    if (!rank_ready(c, rank))
        return ACC_ESTATE;
    if (rank == 0)
        __atomic_add_fetch(&c->buckets, 1, __ATOMIC_SEQ_CST);
    if (!NCU_OK(c, cudaEventRecord(c->ev_ready[rank], c->streams[rank])) ||
        !NCU_OK(c, cudaStreamWaitEvent(c->cstreams[rank], c->ev_ready[rank], 0)))
        return fail_rank(c, rank);
    if (!NC_OK(c, ncclGroupStart()))
        return fail_rank(c, rank);
    return 0;
}

static int nc_reduce_start(void *impl, int rank, float *base, const kern_span *spans, int nspans)
{
    kern_nccl *c = (kern_nccl *)impl;
    int rc = bucket_begin(c, rank);
    if (rc != 0)
        return rc;
    cudaStream_t cs = c->cstreams[rank];
    ncclComm_t comm = c->comms[rank];
    bool ok = true;
    for (int k = 0; k < nspans && ok; k++)
        if (spans[k].n > 0)
            ok = NC_OK(c, ncclAllReduce(base + spans[k].off, base + spans[k].off, spans[k].n,
                                        ncclFloat, ncclSum, comm, cs));
    /* a group once started is always ended, even after a failed call */
    if (!NC_OK(c, ncclGroupEnd()) || !ok)
        return fail_rank(c, rank);
    return 0;
}

/* The ZeRO reduce-scatter of a bucket: each span's part in rank q's shard
 * of [0, n) is summed into rank q only (ncclReduce with root q: the shards
 * are uneven in general, and a bucket's parts are more so, which
 * ncclReduceScatter's equal counts cannot express), the part at offsets
 * >= n (the trainer's slots) into every rank; one NCCL group on the
 * communication stream, as reduce_start. */
static int nc_scatter_start(void *impl, int rank, float *base, const kern_span *spans, int nspans, size_t n)
{
    kern_nccl *c = (kern_nccl *)impl;
    int rc = bucket_begin(c, rank);
    if (rc != 0)
        return rc;
    cudaStream_t cs = c->cstreams[rank];
    ncclComm_t comm = c->comms[rank];
    bool ok = true;
    kern_span part[KERN_COMM_MAX_SPANS];
    for (int q = 0; q < c->nranks && ok; q++) {
        int np = kern_span_clip(spans, nspans, kern_shard_lo(n, q, c->nranks),
                                kern_shard_lo(n, q + 1, c->nranks), part);
        for (int k = 0; k < np && ok; k++)
            ok = NC_OK(c, ncclReduce(base + part[k].off, base + part[k].off, part[k].n, ncclFloat,
                                     ncclSum, q, comm, cs));
    }
    int nt = kern_span_clip(spans, nspans, n, SIZE_MAX, part);
    for (int k = 0; k < nt && ok; k++)
        ok = NC_OK(c, ncclAllReduce(base + part[k].off, base + part[k].off, part[k].n, ncclFloat,
                                    ncclSum, comm, cs));
    if (!NC_OK(c, ncclGroupEnd()) || !ok)
        return fail_rank(c, rank);
    return 0;
}

static int wait_event(kern_nccl *c, int rank, cudaEvent_t ev);

/* The all-gather of the shards of buf[0, n) (elements of `size` bytes,
 * `mult` NCCL elements of `type` each): ncclAllGather in place when
 * the shards are equal (n a multiple of w), else one ncclBroadcast per
 * owner in a group. Queued on the communication stream after the compute
 * stream's work, then the compute stream waits for it; not a reduction,
 * so not counted. */
static int nc_gather(kern_nccl *c, int rank, char *buf, size_t n, size_t size, ncclDataType_t type, size_t mult)
{
    if (nc_aborted(c))
        return cancelled(c, rank);
    if (!rank_ready(c, rank))
        return ACC_ESTATE;
    cudaStream_t cs = c->cstreams[rank];
    ncclComm_t comm = c->comms[rank];
    int w = c->nranks;
    if (!NCU_OK(c, cudaEventRecord(c->ev_ready[rank], c->streams[rank])) ||
        !NCU_OK(c, cudaStreamWaitEvent(cs, c->ev_ready[rank], 0)))
        return fail_rank(c, rank);
    bool ok = true;
    if (n % (size_t)w == 0) {
        size_t each = n / (size_t)w;
        if (each > 0)
            ok = NC_OK(c, ncclAllGather(buf + (size_t)rank * each * size, buf, each * mult, type, comm, cs));
    } else {
        if (!NC_OK(c, ncclGroupStart()))
            return fail_rank(c, rank);
        for (int q = 0; q < w && ok; q++) {
            size_t lo = kern_shard_lo(n, q, w), hi = kern_shard_lo(n, q + 1, w);
            if (hi > lo)
                ok = NC_OK(c, ncclBroadcast(buf + lo * size, buf + lo * size, (hi - lo) * mult, type, q, comm,
                                            cs));
        }
        if (!NC_OK(c, ncclGroupEnd()))
            ok = false;
    }
    if (!ok)
        return fail_rank(c, rank);
    cudaEvent_t ev = c->ev_done[rank];
    if (!NCU_OK(c, cudaEventRecord(ev, cs)) || !NCU_OK(c, cudaStreamWaitEvent(c->streams[rank], ev, 0)))
        return fail_rank(c, rank);
    return wait_event(c, rank, ev);
}

static int nc_allgather(void *impl, int rank, float *buf, size_t n)
{
    return nc_gather((kern_nccl *)impl, rank, (char *)buf, n, sizeof *buf, ncclFloat, 1);
}

/* bf16 values as pairs of bytes: a copy needs no arithmetic type */
static int nc_allgather16(void *impl, int rank, uint16_t *buf, size_t n)
{
    return nc_gather((kern_nccl *)impl, rank, (char *)buf, n, sizeof *buf, ncclUint8, sizeof *buf);
}

/* Wait for `ev` without blocking in the driver, so that an abort or a
 * peer's NCCL failure is seen. */
static int wait_event(kern_nccl *c, int rank, cudaEvent_t ev)
{
    ncclComm_t comm = c->comms[rank];
    for (;;) {
        cudaError_t q = cudaEventQuery(ev);
        if (q == cudaSuccess)
            return 0;
        if (q != cudaErrorNotReady) {
            NCU_OK(c, q);
            return fail_rank(c, rank);
        }
        /* "not ready" is recorded as the thread's last error: clear it, or
         * the device's next kernel-launch check would report it */
        (void)cudaGetLastError();
        ncclResult_t ae = ncclSuccess;
        if (!NC_OK(c, ncclCommGetAsyncError(comm, &ae)) ||
            (ae != ncclSuccess && ae != ncclInProgress)) {
            if (ae != ncclSuccess)
                nccl_fail(c, "all-reduce (async)", ncclGetErrorString(ae));
            return fail_rank(c, rank);
        }
        if (nc_aborted(c)) {
            abort_own(c, rank);
            return ACC_ECANCELLED;
        }
        struct timespec ts = {0, 20000}; /* 20 us */
        nanosleep(&ts, NULL);
    }
}

static int nc_reduce_finish(void *impl, int rank)
{
    kern_nccl *c = (kern_nccl *)impl;
    if (nc_aborted(c))
        return cancelled(c, rank);
    if (!rank_ready(c, rank))
        return ACC_ESTATE;
    if (rank == 0)
        __atomic_add_fetch(&c->calls, 1, __ATOMIC_SEQ_CST);
    cudaEvent_t ev = c->ev_done[rank];
    /* the compute stream (optimizer, next step) runs after the buckets */
    if (!NCU_OK(c, cudaEventRecord(ev, c->cstreams[rank])) ||
        !NCU_OK(c, cudaStreamWaitEvent(c->streams[rank], ev, 0)))
        return fail_rank(c, rank);
    return wait_event(c, rank, ev);
}

static int nc_allreduce(void *impl, int rank, float *buf, size_t n)
{
    kern_nccl *c = (kern_nccl *)impl;
    kern_span all = {0, n};
    int rc = nc_reduce_start(c, rank, buf, &all, 1);
    return rc != 0 ? rc : nc_reduce_finish(c, rank);
}

static int nc_barrier(void *impl)
{
    kern_nccl *c = (kern_nccl *)impl;
    if (c->host != NULL) /* ranks in other processes: the host's barrier */
        return nc_aborted(c) ? ACC_ECANCELLED : c->host->barrier(c->host_impl);
    pthread_mutex_lock(&c->mu);
    if (nc_aborted(c)) {
        pthread_mutex_unlock(&c->mu);
        return ACC_ECANCELLED;
    }
    unsigned long g = c->gen;
    if (++c->waiting == c->nranks) {
        c->waiting = 0;
        c->gen++;
        pthread_cond_broadcast(&c->cv);
    } else {
        while (g == c->gen && !nc_aborted(c))
            pthread_cond_wait(&c->cv, &c->mu);
    }
    int rc = g == c->gen ? ACC_ECANCELLED : 0;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static void nc_abort(void *impl)
{
    kern_nccl *c = (kern_nccl *)impl;
    pthread_mutex_lock(&c->mu);
    __atomic_store_n(&c->aborted, 1, __ATOMIC_SEQ_CST);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (c->host != NULL)
        c->host->abort(c->host_impl);
}

static int nc_aborted(void *impl)
{
    kern_nccl *c = (kern_nccl *)impl;
    return __atomic_load_n(&c->aborted, __ATOMIC_SEQ_CST);
}

static uint64_t nc_allreduce_calls(void *impl)
{
    kern_nccl *c = (kern_nccl *)impl;
    return __atomic_load_n(&c->calls, __ATOMIC_SEQ_CST);
}

static uint64_t nc_bucket_calls(void *impl)
{
    kern_nccl *c = (kern_nccl *)impl;
    return __atomic_load_n(&c->buckets, __ATOMIC_SEQ_CST);
}

static int nc_error(void *impl, acc_err *err)
{
    kern_nccl *c = (kern_nccl *)impl;
    pthread_mutex_lock(&c->mu);
    int code = c->err_code;
    if (code != 0)
        acc_err_set(err, code, "devices", "%s", c->err_msg);
    pthread_mutex_unlock(&c->mu);
    return code != 0 || c->host == NULL || c->host->error == NULL ? code : c->host->error(c->host_impl, err);
}

/* ---- the declared set (kern_comm.h) */

static const kern_comm_ops nccl_ops = {
    /* .name = */ "nccl",
    /* .destroy = */ nc_destroy,
    /* .bind = */ nc_bind,
    /* .allreduce = */ nc_allreduce,
    /* .reduce_start = */ nc_reduce_start,
    /* .reduce_finish = */ nc_reduce_finish,
    /* .scatter_start = */ nc_scatter_start,
    /* .allgather = */ nc_allgather,
    /* .allgather16 = */ nc_allgather16,
    /* .barrier = */ nc_barrier,
    /* .abort = */ nc_abort,
    /* .aborted = */ nc_aborted,
    /* .error = */ nc_error,
    /* .allreduce_calls = */ nc_allreduce_calls,
    /* .bucket_calls = */ nc_bucket_calls,
};

extern "C" int kern_comm_nccl_open(int nranks, const int *ordinals, kern_comm **out, acc_err *err)
{
    kern_nccl *c;
    int rc = nccl_create(nranks, ordinals, &c, err);
    return rc != 0 ? rc : kern_comm_wrap(&nccl_ops, c, out, err);
}

extern "C" int kern_comm_nccl_open_rank(int world, int rank, int ordinal, const unsigned char *id,
                                        const kern_comm_ops *host, void *host_impl, kern_comm **out,
                                        acc_err *err)
{
    kern_nccl *c;
    *out = NULL;
    int rc = nccl_create_rank(world, rank, ordinal, id, &c, err);
    if (rc != 0) {
        host->destroy(host_impl);
        return rc;
    }
    c->host = host;
    c->host_impl = host_impl;
    return kern_comm_wrap(&nccl_ops, c, out, err);
}
