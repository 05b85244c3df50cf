/* kern_comm_cpu: the shared-memory communicator (see kern_comm_cpu.h). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kern_comm_cpu.h"

#include "kern_comm.h"

#define COMM_MAX_RANKS 64

struct kern_comm_cpu {
    int nranks;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;            /* ranks at the current barrier */
    int inside;             /* ranks inside kern_comm_cpu_allreduce */
    uint64_t generation;    /* barriers completed */
    atomic_int aborted;
    atomic_uint_least64_t calls;   /* reductions finished (rank 0) */
    atomic_uint_least64_t buckets; /* span lists reduced (rank 0) */
    float *bufs[COMM_MAX_RANKS]; /* published by each rank for one all-reduce */
};

int kern_comm_cpu_create(int nranks, kern_comm_cpu **out, acc_err *err)
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
    *out = c;
    return 0;
}

void kern_comm_cpu_destroy(kern_comm_cpu *c)
{
    if (c == NULL)
        return;
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

int kern_comm_cpu_barrier(kern_comm_cpu *c)
{
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

void kern_comm_cpu_abort(kern_comm_cpu *c)
{
    pthread_mutex_lock(&c->mu);
    atomic_store(&c->aborted, 1);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

int kern_comm_cpu_aborted(kern_comm_cpu *c)
{
    return atomic_load(&c->aborted);
}

uint64_t kern_comm_cpu_allreduce_calls(kern_comm_cpu *c)
{
    return atomic_load(&c->calls);
}

uint64_t kern_comm_cpu_bucket_calls(kern_comm_cpu *c)
{
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
    int rc = kern_comm_cpu_barrier(c);
    if (rc != 0)
        return rc;
    /* reduce-scatter: my chunk of every buffer, summed in rank order; only
     * I read chunk `rank` of the others, so writing it in mine is safe */
    size_t lo, hi;
    chunk_of(total, c->nranks, rank, &lo, &hi);
    spans_op(c, rank, rank, sp, ns, lo, hi);
    rc = kern_comm_cpu_barrier(c);
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
    return kern_comm_cpu_barrier(c);
}

int kern_comm_cpu_reduce_spans(kern_comm_cpu *c, int rank, float *base, const kern_span *spans,
                               int nspans)
{
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

int kern_comm_cpu_reduce_finish(kern_comm_cpu *c, int rank)
{
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
    int rc = kern_comm_cpu_barrier(c);
    if (rc != 0)
        return rc;
    for (int k = 0; k < no; k++)
        run_op(c, rank, rank, own[k].off, own[k].n);
    size_t lo, hi;
    chunk_of(total, c->nranks, rank, &lo, &hi);
    spans_op(c, rank, rank, tail, nt, lo, hi);
    rc = kern_comm_cpu_barrier(c);
    if (rc != 0 || nt == 0)
        return rc;
    for (int r = 0; r < c->nranks; r++) {
        if (r == rank)
            continue;
        chunk_of(total, c->nranks, r, &lo, &hi);
        spans_op(c, rank, r, tail, nt, lo, hi);
    }
    return kern_comm_cpu_barrier(c);
}

int kern_comm_cpu_scatter_spans(kern_comm_cpu *c, int rank, float *base, const kern_span *spans,
                                int nspans, size_t n)
{
    if (rank == 0)
        atomic_fetch_add(&c->buckets, 1);
    if (c->nranks == 1)
        return atomic_load(&c->aborted) ? ACC_ECANCELLED : 0;
    enter(c);
    return leave(c, scatter_phases(c, rank, base, spans, nspans, n));
}

/* Each rank copies the other ranks' shards from their buffers; a rank
 * writes only outside its own shard, the only part the others read. */
static int gather_phases(kern_comm_cpu *c, int rank, float *buf, size_t n)
{
    c->bufs[rank] = buf;
    int rc = kern_comm_cpu_barrier(c);
    if (rc != 0)
        return rc;
    for (int r = 0; r < c->nranks; r++) {
        size_t lo = kern_shard_lo(n, r, c->nranks), hi = kern_shard_lo(n, r + 1, c->nranks);
        if (r != rank && hi > lo)
            run_op(c, rank, r, lo, hi - lo);
    }
    return kern_comm_cpu_barrier(c);
}

int kern_comm_cpu_allgather(kern_comm_cpu *c, int rank, float *buf, size_t n)
{
    if (c->nranks == 1)
        return atomic_load(&c->aborted) ? ACC_ECANCELLED : 0;
    enter(c);
    return leave(c, gather_phases(c, rank, buf, n));
}

int kern_comm_cpu_allreduce(kern_comm_cpu *c, int rank, float *buf, size_t n)
{
    kern_span all = {0, n};
    int rc = kern_comm_cpu_reduce_spans(c, rank, buf, &all, 1);
    int fin = kern_comm_cpu_reduce_finish(c, rank);
    return rc != 0 ? rc : fin;
}

/* ---- the declared set (kern_comm.h) */

static void shm_destroy(void *c) { kern_comm_cpu_destroy(c); }
static int shm_allreduce(void *c, int rank, float *buf, size_t n)
{
    return kern_comm_cpu_allreduce(c, rank, buf, n);
}
static int shm_reduce_start(void *c, int rank, float *base, const kern_span *spans, int nspans)
{
    return kern_comm_cpu_reduce_spans(c, rank, base, spans, nspans);
}
static int shm_reduce_finish(void *c, int rank) { return kern_comm_cpu_reduce_finish(c, rank); }
static int shm_scatter_start(void *c, int rank, float *base, const kern_span *spans, int nspans,
                             size_t n)
{
    return kern_comm_cpu_scatter_spans(c, rank, base, spans, nspans, n);
}
static int shm_allgather(void *c, int rank, float *buf, size_t n)
{
    return kern_comm_cpu_allgather(c, rank, buf, n);
}
static int shm_barrier(void *c) { return kern_comm_cpu_barrier(c); }
static void shm_abort(void *c) { kern_comm_cpu_abort(c); }
static int shm_aborted(void *c) { return kern_comm_cpu_aborted(c); }
static uint64_t shm_allreduce_calls(void *c) { return kern_comm_cpu_allreduce_calls(c); }
static uint64_t shm_bucket_calls(void *c) { return kern_comm_cpu_bucket_calls(c); }

const kern_comm_ops kern_comm_cpu_ops = {
    .name = "shm",
    .destroy = shm_destroy,
    .bind = NULL, /* CPU ranks share the host's memory: nothing to bind */
    .allreduce = shm_allreduce,
    .reduce_start = shm_reduce_start,
    .reduce_finish = shm_reduce_finish,
    .scatter_start = shm_scatter_start,
    .allgather = shm_allgather,
    .barrier = shm_barrier,
    .abort = shm_abort,
    .aborted = shm_aborted,
    .error = NULL, /* shared memory never fails this way */
    .allreduce_calls = shm_allreduce_calls,
    .bucket_calls = shm_bucket_calls,
};
