/* kern_comm_cpu: the shared-memory communicator of a job's CPU-device ranks,
 * kern_comm.h's declared set for CPU ranks that are threads of one process
 * (kern_comm_create).
 *
 * Shared memory: every rank passes its own buffer, * and shm_allreduce() leaves the elementwise sum in all of them. It is
 * a reduce-scatter followed by an all-gather: rank r sums chunk r of all
 * buffers in rank order 0..w-1 (so the result is bitwise reproducible and
 * identical on every rank), then each rank copies the other chunks. Ranks
 * meet at barriers; shm_abort() wakes every waiter and makes every
 * later call return ACC_ECANCELLED at once, so a rank that fails or is
 * cancelled never leaves the others hanging.
 *
 * shm_reduce_start() is the same collective over a list of spans
 * of each rank's buffer (their concatenation is split into the w chunks), * done when it returns; shm_reduce_finish() only ends and counts
 * one reduction, for the bucketed call shape of kern_comm.h. Counts: one
 * per call, not per rank (reductions and span lists separately).
 *
 * ZeRO: shm_scatter_start() is the reduce-scatter of a span list:
 * each rank sums the span elements of its own shard of [0, n)
 * (kern_shard_lo) in rank order 0..w-1 -- the same sum, element for
 * element, as the all-reduce's -- and the elements at offsets >= n are
 * all-reduced; done when it returns, ended by reduce_finish.
 * shm_allgather() copies each rank's shard of [0, n) to the
 * others (shm_allgather16: of 16-bit elements).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kern_comm.h"

#define COMM_MAX_RANKS 64

typedef struct kern_comm_cpu {
    int nranks;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;            /* ranks at the current barrier */
    int inside;             /* ranks inside shm_allreduce */
    uint64_t generation;    /* barriers completed */
    atomic_int aborted;
    atomic_uint_least64_t calls;   /* reductions finished (rank 0) */
    atomic_uint_least64_t buckets; /* span lists reduced (rank 0) */
    float *bufs[COMM_MAX_RANKS]; /* published by each rank for one all-reduce */
    unsigned char *gbufs[COMM_MAX_RANKS]; /* and for one all-gather, any element size */
} kern_comm_cpu;

/* the declared set (kern_comm.h), implemented below */
static void shm_destroy(void *impl);
static int shm_barrier(void *impl);
static void shm_abort(void *impl);
static int shm_aborted(void *impl);
static uint64_t shm_allreduce_calls(void *impl);
static uint64_t shm_bucket_calls(void *impl);
static int shm_reduce_start(void *impl, int rank, float *base, const kern_span *spans, int nspans);
static int shm_reduce_finish(void *impl, int rank);
static int shm_scatter_start(void *impl, int rank, float *base, const kern_span *spans, int nspans, size_t n);
static int shm_allgather(void *impl, int rank, float *buf, size_t n);
static int shm_allgather16(void *impl, int rank, uint16_t *buf, size_t n);
static int shm_allreduce(void *impl, int rank, float *buf, size_t n);

static const kern_comm_ops shm_ops = {
    .name = "shm",
    .destroy = shm_destroy,
    .bind = NULL, /* CPU ranks share the host's memory: nothing to bind */
    .allreduce = shm_allreduce,
    .reduce_start = shm_reduce_start,
    .reduce_finish = shm_reduce_finish,
    .scatter_start = shm_scatter_start,
    .allgather = shm_allgather,
    .allgather16 = shm_allgather16,
    .barrier = shm_barrier,
    .abort = shm_abort,
    .aborted = shm_aborted,
    .error = NULL, /* shared memory never fails this way */
    .allreduce_calls = shm_allreduce_calls,
    .bucket_calls = shm_bucket_calls,
};

int kern_comm_create(int nranks, kern_comm **out, acc_err *err)
{
    *out = NULL;
    if (nranks < 1 || nranks > COMM_MAX_RANKS)
        return acc_err_set(err, ACC_EINVAL, "devices", "communicator of %d ranks (1..%d)",
                           nranks, COMM_MAX_RANKS);
    kern_comm_cpu *c = calloc(1, sizeof *c);
    if (c == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory creating a communicator");
    c->nranks = nranks;
    if (pthread_mutex_init(&c->mu, NULL) != 0) {
        free(c);
        return acc_err_set(err, ACC_ENOMEM, "", "pthread_mutex_init failed");
    }
    if (pthread_cond_init(&c->cv, NULL) != 0) {
        pthread_mutex_destroy(&c->mu);
        free(c);
        return acc_err_set(err, ACC_ENOMEM, "", "pthread_cond_init failed");
    }
    atomic_init(&c->aborted, 0);
    atomic_init(&c->calls, 0);
    atomic_init(&c->buckets, 0);
    return kern_comm_wrap(&shm_ops, c, out, err);
}

static void shm_destroy(void *impl)
{
    kern_comm_cpu *c = impl;
    if (c == NULL)
        return;
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static int shm_barrier(void *impl)
{
    kern_comm_cpu *c = impl;
    pthread_mutex_lock(&c->mu);
    if (atomic_load(&c->aborted)) {
        pthread_mutex_unlock(&c->mu);
        return ACC_ECANCELLED;
    }
    uint64_t gen = c->generation;
    if (++c->arrived == c->nranks) {
        c->arrived = 0;
        c->generation++;
        pthread_cond_broadcast(&c->cv);
    } else {
        while (gen == c->generation && !atomic_load(&c->aborted))
            pthread_cond_wait(&c->cv, &c->mu);
    }
    int rc = gen == c->generation ? ACC_ECANCELLED : 0;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static void shm_abort(void *impl)
{
    kern_comm_cpu *c = impl;
    pthread_mutex_lock(&c->mu);
    atomic_store(&c->aborted, 1);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static int shm_aborted(void *impl)
{
    kern_comm_cpu *c = impl;
    return atomic_load(&c->aborted);
}

static uint64_t shm_allreduce_calls(void *impl)
{
    kern_comm_cpu *c = impl;
    return atomic_load(&c->calls);
}

static uint64_t shm_bucket_calls(void *impl)
{
    kern_comm_cpu *c = impl;
    return atomic_load(&c->buckets);
}

static void chunk_of(size_t n, int nranks, int r, size_t *lo, size_t *hi)
{
    *lo = n * (size_t)r / (size_t)nranks;
    *hi = n * (size_t)(r + 1) / (size_t)nranks;
}

static void enter(kern_comm_cpu *c)
{
    pthread_mutex_lock(&c->mu);
    c->inside++;
    pthread_mutex_unlock(&c->mu);
}

/* A rank leaving on an abort may not return (and free its buffer) while
 * another rank may still be reading that buffer: it waits until every rank
 * has left. On success the last barrier already guarantees it. */
static int leave(kern_comm_cpu *c, int rc)
{
    pthread_mutex_lock(&c->mu);
    c->inside--;
    pthread_cond_broadcast(&c->cv);
    if (rc != 0)
        while (c->inside > 0)
            pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* Sum (owner == rank) or copy from `owner` the floats [off, off+n) of my
 * buffer; summing is in rank order 0..w-1, so every rank gets the same bits. */
static void run_op(kern_comm_cpu *c, int rank, int owner, size_t off, size_t n)
{
    float *buf = c->bufs[rank] + off;
    if (owner != rank) {
        memcpy(buf, c->bufs[owner] + off, n * sizeof *buf);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        float s = c->bufs[0][off + i];
        for (int r = 1; r < c->nranks; r++)
            s += c->bufs[r][off + i];
        buf[i] = s;
    }
}

/* Apply run_op to the part [lo, hi) of the spans' concatenation. */
static void spans_op(kern_comm_cpu *c, int rank, int owner, const kern_span *sp, int ns,
                     size_t lo, size_t hi)
{
    size_t v = 0; /* where span k starts in the concatenation */
    for (int k = 0; k < ns && v < hi; v += sp[k].n, k++) {
        if (v + sp[k].n <= lo)
            continue;
        size_t a = lo > v ? lo - v : 0;
        size_t b = hi - v < sp[k].n ? hi - v : sp[k].n;
        run_op(c, rank, owner, sp[k].off + a, b - a);
    }
}

static int reduce_phases(kern_comm_cpu *c, int rank, float *base, const kern_span *sp, int ns,
                         size_t total)
{
    c->bufs[rank] = base;
    int rc = shm_barrier(c);
    if (rc != 0)
        return rc;
    /* reduce-scatter: my chunk of every buffer, summed in rank order; only
     * I read chunk `rank` of the others, so writing it in mine is safe */
    size_t lo, hi;
    chunk_of(total, c->nranks, rank, &lo, &hi);
    spans_op(c, rank, rank, sp, ns, lo, hi);
    rc = shm_barrier(c);
    if (rc != 0)
        return rc;
    /* all-gather: every other chunk from its owner */
    for (int r = 0; r < c->nranks; r++) {
        if (r == rank)
            continue;
        chunk_of(total, c->nranks, r, &lo, &hi);
        spans_op(c, rank, r, sp, ns, lo, hi);
    }
    /* nobody may touch its buffer again until all have copied */
    return shm_barrier(c);
}

static int shm_reduce_start(void *impl, int rank, float *base, const kern_span *spans,
                               int nspans)
{
    kern_comm_cpu *c = impl;
    if (rank == 0)
        atomic_fetch_add(&c->buckets, 1);
    if (c->nranks == 1)
        return atomic_load(&c->aborted) ? ACC_ECANCELLED : 0;
    size_t total = 0;
    for (int k = 0; k < nspans; k++)
        total += spans[k].n;
    enter(c);
    return leave(c, reduce_phases(c, rank, base, spans, nspans, total));
}

static int shm_reduce_finish(void *impl, int rank)
{
    kern_comm_cpu *c = impl;
    if (rank == 0)
        atomic_fetch_add(&c->calls, 1);
    return atomic_load(&c->aborted) ? ACC_ECANCELLED : 0;
}

/* The reduce-scatter: each rank sums, in rank order, the span elements of
 * its own shard of [0, n) into its buffer (only it reads that part of the
 * others); the spans' part at offsets >= n is all-reduced as
 * reduce_phases does, chunk by chunk. The last barrier: nobody writes its
 * buffer again while another still reads it. */
static int scatter_phases(kern_comm_cpu *c, int rank, float *base, const kern_span *sp, int ns,
                          size_t n)
{
    kern_span own[KERN_COMM_MAX_SPANS], tail[KERN_COMM_MAX_SPANS];
    int no = kern_span_clip(sp, ns, kern_shard_lo(n, rank, c->nranks),
                            kern_shard_lo(n, rank + 1, c->nranks), own);
    int nt = kern_span_clip(sp, ns, n, SIZE_MAX, tail);
    size_t total = 0;
    for (int k = 0; k < nt; k++)
        total += tail[k].n;
    c->bufs[rank] = base;
    int rc = shm_barrier(c);
    if (rc != 0)
        return rc;
    for (int k = 0; k < no; k++)
        run_op(c, rank, rank, own[k].off, own[k].n);
    size_t lo, hi;
    chunk_of(total, c->nranks, rank, &lo, &hi);
    spans_op(c, rank, rank, tail, nt, lo, hi);
    rc = shm_barrier(c);
    if (rc != 0 || nt == 0)
        return rc;
    for (int r = 0; r < c->nranks; r++) {
        if (r == rank)
            continue;
        chunk_of(total, c->nranks, r, &lo, &hi);
        spans_op(c, rank, r, tail, nt, lo, hi);
    }
    return shm_barrier(c);
}

static int shm_scatter_start(void *impl, int rank, float *base, const kern_span *spans,
                                int nspans, size_t n)
{
    kern_comm_cpu *c = impl;
    if (rank == 0)
        atomic_fetch_add(&c->buckets, 1);
    if (c->nranks == 1)
        return atomic_load(&c->aborted) ? ACC_ECANCELLED : 0;
    enter(c);
    return leave(c, scatter_phases(c, rank, base, spans, nspans, n));
}

/* Each rank copies the other ranks' shards (elements of `size` bytes)
 * from their buffers; a rank writes only outside its own shard, the only
 * part the others read. */
static int gather_phases(kern_comm_cpu *c, int rank, void *buf, size_t n, size_t size)
{
    c->gbufs[rank] = buf;
    int rc = shm_barrier(c);
    if (rc != 0)
        return rc;
    for (int r = 0; r < c->nranks; r++) {
        size_t lo = kern_shard_lo(n, r, c->nranks), hi = kern_shard_lo(n, r + 1, c->nranks);
        if (r != rank && hi > lo)
            memcpy(c->gbufs[rank] + lo * size, c->gbufs[r] + lo * size, (hi - lo) * size);
    }
    return shm_barrier(c);
}

static int shm_gather(kern_comm_cpu *c, int rank, void *buf, size_t n, size_t size)
{
    if (c->nranks == 1)
        return atomic_load(&c->aborted) ? ACC_ECANCELLED : 0;
    enter(c);
    return leave(c, gather_phases(c, rank, buf, n, size));
}

static int shm_allgather(void *impl, int rank, float *buf, size_t n)
{
    return shm_gather(impl, rank, buf, n, sizeof *buf);
}

static int shm_allgather16(void *impl, int rank, uint16_t *buf, size_t n)
{
    return shm_gather(impl, rank, buf, n, sizeof *buf);
}

static int shm_allreduce(void *impl, int rank, float *buf, size_t n)
{
    kern_comm_cpu *c = impl;
    kern_span all = {0, n};
    int rc = shm_reduce_start(c, rank, buf, &all, 1);
    int fin = shm_reduce_finish(c, rank);
    return rc != 0 ? rc : fin;
}

