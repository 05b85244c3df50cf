/* kern_comm_mpi: see kern_comm_mpi.h. */
#include "kern_comm_mpi.h"

#include <limits.h>
#include <stdio.h>
#include <mpi.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>


typedef struct comm_mpi {
    MPI_Comm comm;
    int rank, world;
    atomic_int aborted;
    uint64_t calls, buckets;
    int fail_code;          /* first MPI failure (ACC_EDEVICE) or 0 */
    char fail_msg[320];
    float *pack;            /* the spans' concatenation, [cap] */
    float *recv;            /* w copies of my chunk, [cap] */
    size_t cap;
    int *counts, *displs, *rcounts, *rdispls; /* [world] each */
} comm_mpi;

/* Check one MPI return; keep the first failure's text. */
static int mpi_check(comm_mpi *c, int mrc, const char *what)
{
    if (mrc == MPI_SUCCESS)
        return 0;
    if (c->fail_code == 0) {
        char s[MPI_MAX_ERROR_STRING];
        int len = 0;
        if (MPI_Error_string(mrc, s, &len) != MPI_SUCCESS)
            snprintf(s, sizeof s, "MPI error %d", mrc);
        snprintf(c->fail_msg, sizeof c->fail_msg, "%.40s failed on rank %d: %.200s", what, c->rank, s);
        c->fail_code = ACC_EDEVICE;
    }
    return ACC_EDEVICE;
}

static void chunk_of(size_t n, int w, int r, size_t *lo, size_t *hi)
{
    *lo = n * (size_t)r / (size_t)w;
    *hi = n * (size_t)(r + 1) / (size_t)w;
}

/* Room for `n` packed floats, and for what reduce_scatter receives: every
 * rank's copy of this rank's chunk, w x the largest chunk, which is more
 * than n when w does not divide it (n = 1 over 2 ranks: 2). */
static int reserve(comm_mpi *c, size_t n)
{
    size_t w = (size_t)c->world, need = w * ((n + w - 1) / w);
    if (need < n)
        need = n;
    if (need <= c->cap)
        return 0;
    float *p = realloc(c->pack, need * sizeof *p);
    if (p == NULL)
        return ACC_ENOMEM;
    c->pack = p;
    p = realloc(c->recv, need * sizeof *p);
    if (p == NULL)
        return ACC_ENOMEM;
    c->recv = p;
    c->cap = need;
    return 0;
}

/* Copy between the spans of `base` and their concatenation `flat`. */
static void pack_spans(float *flat, const float *base, const kern_span *sp, int ns)
{
    for (int k = 0; k < ns; k++) {
        memcpy(flat, base + sp[k].off, sp[k].n * sizeof *flat);
        flat += sp[k].n;
    }
}

static void unpack_spans(float *base, const float *flat, const kern_span *sp, int ns)
{
    for (int k = 0; k < ns; k++) {
        memcpy(base + sp[k].off, flat, sp[k].n * sizeof *flat);
        flat += sp[k].n;
    }
}

/* The reduce-scatter: my chunk of every rank, summed here in rank order
 * (the shared-memory communicator's order, so the same bits). */
static int reduce_scatter(comm_mpi *c, size_t total)
{
    int w = c->world;
    size_t lo, hi;
    chunk_of(total, w, c->rank, &lo, &hi);
    int mine = (int)(hi - lo);
    for (int q = 0; q < w; q++) {
        size_t a, b;
        chunk_of(total, w, q, &a, &b);
        c->counts[q] = (int)(b - a);
        c->displs[q] = (int)a;
        c->rcounts[q] = mine;
        c->rdispls[q] = q * mine;
    }
    int rc = mpi_check(c, MPI_Alltoallv(c->pack, c->counts, c->displs, MPI_FLOAT, c->recv,
                                        c->rcounts, c->rdispls, MPI_FLOAT, c->comm),
                       "MPI_Alltoallv");
    if (rc != 0)
        return rc;
    float *out = c->pack + lo;
    for (int i = 0; i < mine; i++) {
        float s = c->recv[i];
        for (int r = 1; r < w; r++)
            s += c->recv[(size_t)r * (size_t)mine + (size_t)i];
        out[i] = s;
    }
    return 0;
}

static int all_gather(comm_mpi *c)
{
    return mpi_check(c, MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, c->pack, c->counts, c->displs,
                                       MPI_FLOAT, c->comm),
                     "MPI_Allgatherv");
}

/* The spans of `base` summed over every rank, in the fixed order of
 * reduce_scatter + all_gather (packed, so one collective of each). */
static int allreduce_spans(comm_mpi *c, float *base, const kern_span *sp, int ns)
{
    size_t total = 0;
    for (int k = 0; k < ns; k++)
        total += sp[k].n;
    if (total == 0)
        return 0;
    if (total > (size_t)INT_MAX)
        return ACC_EINVAL; /* MPI counts are int: the trainer's buckets are far smaller */
    if (reserve(c, total) != 0)
        return ACC_ENOMEM;
    pack_spans(c->pack, base, sp, ns);
    int rc = reduce_scatter(c, total);
    if (rc == 0)
        rc = all_gather(c);
    if (rc == 0)
        unpack_spans(base, c->pack, sp, ns);
    return rc;
}

static int mpi_reduce_start(void *impl, int rank, float *base, const kern_span *sp, int ns)
{
    comm_mpi *c = impl;
    (void)rank;
    c->buckets++;
    if (atomic_load(&c->aborted))
        return ACC_ECANCELLED;
    if (c->fail_code != 0)
        return c->fail_code;
    if (c->world == 1)
        return 0;
    return allreduce_spans(c, base, sp, ns);
}

static int mpi_reduce_finish(void *impl, int rank)
{
    comm_mpi *c = impl;
    (void)rank;
    c->calls++;
    if (atomic_load(&c->aborted))
        return ACC_ECANCELLED;
    return c->fail_code;
}

static int mpi_allreduce(void *impl, int rank, float *buf, size_t n)
{
    kern_span all = {0, n};
    int rc = mpi_reduce_start(impl, rank, buf, &all, 1);
    int fin = mpi_reduce_finish(impl, rank);
    return rc != 0 ? rc : fin;
}

/* Rank q's parts of the spans (its shard of [0, n)) packed at `flat`,
 * owners in rank order; sizes in c->counts, offsets in c->displs. */
static size_t pack_owned(comm_mpi *c, float *flat, const float *base, const kern_span *sp, int ns,
                         size_t n)
{
    kern_span part[KERN_COMM_MAX_SPANS];
    size_t at = 0;
    for (int q = 0; q < c->world; q++) {
        int np = kern_span_clip(sp, ns, kern_shard_lo(n, q, c->world), kern_shard_lo(n, q + 1, c->world),
                                part);
        c->displs[q] = (int)at;
        for (int k = 0; k < np; k++) {
            if (flat != NULL)
                memcpy(flat + at, base + part[k].off, part[k].n * sizeof *flat);
            at += part[k].n;
        }
        c->counts[q] = (int)(at - (size_t)c->displs[q]);
    }
    return at;
}

/* The sums of my parts: every rank's copy of them arrives (MPI_Alltoallv)
 * and is summed here in rank order, as the shared-memory communicator
 * sums them, then written into my spans. */
static int scatter_owned(comm_mpi *c, float *base, const kern_span *sp, int ns, size_t n)
{
    size_t total = pack_owned(c, NULL, base, sp, ns, n); /* sizes first */
    size_t mine = (size_t)c->counts[c->rank];
    if (total > (size_t)INT_MAX || mine * (size_t)c->world > (size_t)INT_MAX)
        return ACC_EINVAL; /* MPI counts are int: the trainer's buckets are far smaller */
    if (reserve(c, total > mine * (size_t)c->world ? total : mine * (size_t)c->world) != 0)
        return ACC_ENOMEM;
    pack_owned(c, c->pack, base, sp, ns, n);
    for (int q = 0; q < c->world; q++) {
        c->rcounts[q] = (int)mine;
        c->rdispls[q] = q * (int)mine;
    }
    int rc = mpi_check(c, MPI_Alltoallv(c->pack, c->counts, c->displs, MPI_FLOAT, c->recv,
                                        c->rcounts, c->rdispls, MPI_FLOAT, c->comm),
                       "MPI_Alltoallv");
    if (rc != 0)
        return rc;
    float *out = c->pack; /* my sums, in my parts' order */
    for (size_t i = 0; i < mine; i++) {
        float sum = c->recv[i];
        for (int r = 1; r < c->world; r++)
            sum += c->recv[(size_t)r * mine + i];
        out[i] = sum;
    }
    kern_span part[KERN_COMM_MAX_SPANS];
    int np = kern_span_clip(sp, ns, kern_shard_lo(n, c->rank, c->world),
                            kern_shard_lo(n, c->rank + 1, c->world), part);
    unpack_spans(base, out, part, np);
    return 0;
}

/* The parts at offsets >= n (the trainer's slots): all-reduced. */
static int reduce_tail(comm_mpi *c, float *base, const kern_span *sp, int ns, size_t n)
{
    kern_span tail[KERN_COMM_MAX_SPANS];
    int nt = kern_span_clip(sp, ns, n, SIZE_MAX, tail);
    return allreduce_spans(c, base, tail, nt);
}

static int mpi_scatter_start(void *impl, int rank, float *base, const kern_span *sp, int ns, size_t n)
{
    comm_mpi *c = impl;
    (void)rank;
    c->buckets++;
    if (atomic_load(&c->aborted))
        return ACC_ECANCELLED;
    if (c->fail_code != 0)
        return c->fail_code;
    if (c->world == 1)
        return 0;
    int rc = scatter_owned(c, base, sp, ns, n);
    return rc != 0 ? rc : reduce_tail(c, base, sp, ns, n);
}

/* The all-gather of n elements of MPI type `type` (their shards). */
static int mpi_gather(comm_mpi *c, void *buf, size_t n, MPI_Datatype type)
{
    if (atomic_load(&c->aborted))
        return ACC_ECANCELLED;
    if (c->fail_code != 0)
        return c->fail_code;
    if (c->world == 1)
        return 0;
    if (n > (size_t)INT_MAX)
        return ACC_EINVAL;
    for (int q = 0; q < c->world; q++) {
        c->displs[q] = (int)kern_shard_lo(n, q, c->world);
        c->counts[q] = (int)kern_shard_lo(n, q + 1, c->world) - c->displs[q];
    }
    return mpi_check(c, MPI_Allgatherv(MPI_IN_PLACE, 0, type, buf, c->counts, c->displs, type, c->comm),
                     "MPI_Allgatherv");
}

static int mpi_allgather(void *impl, int rank, float *buf, size_t n)
{
    (void)rank;
    return mpi_gather(impl, buf, n, MPI_FLOAT);
}

static int mpi_allgather16(void *impl, int rank, uint16_t *buf, size_t n)
{
    (void)rank;
    return mpi_gather(impl, buf, n, MPI_UINT16_T);
}

static int mpi_barrier(void *impl)
{
    comm_mpi *c = impl;
    if (atomic_load(&c->aborted))
        return ACC_ECANCELLED;
    return mpi_check(c, MPI_Barrier(c->comm), "MPI_Barrier");
}

static void mpi_abort(void *impl)
{
    comm_mpi *c = impl;
    atomic_store(&c->aborted, 1);
}

static int mpi_aborted(void *impl)
{
    comm_mpi *c = impl;
    return atomic_load(&c->aborted);
}

static int mpi_error(void *impl, acc_err *err)
{
    comm_mpi *c = impl;
    if (c->fail_code == 0)
        return 0;
    return acc_err_set(err, c->fail_code, "", "%s", c->fail_msg);
}

static uint64_t mpi_calls(void *impl) { return ((comm_mpi *)impl)->calls; }
static uint64_t mpi_buckets(void *impl) { return ((comm_mpi *)impl)->buckets; }

static void mpi_destroy(void *impl)
{
    comm_mpi *c = impl;
    if (c == NULL)
        return;
    if (c->comm != MPI_COMM_NULL)
        MPI_Comm_free(&c->comm); /* a failure here leaves nothing to undo */
    free(c->pack);
    free(c->recv);
    free(c->counts);
    free(c->displs);
    free(c->rcounts);
    free(c->rdispls);
    free(c);
}

static const kern_comm_ops mpi_ops = {
    .name = "mpi",
    .destroy = mpi_destroy,
    .bind = NULL, /* CPU ranks: nothing to bind */
    .allreduce = mpi_allreduce,
    .reduce_start = mpi_reduce_start,
    .reduce_finish = mpi_reduce_finish,
    .scatter_start = mpi_scatter_start,
    .allgather = mpi_allgather,
    .allgather16 = mpi_allgather16,
    .barrier = mpi_barrier,
    .abort = mpi_abort,
    .aborted = mpi_aborted,
    .error = mpi_error,
    .allreduce_calls = mpi_calls,
    .bucket_calls = mpi_buckets,
};

static int open_world(comm_mpi *c, acc_err *err)
{
    if (mpi_check(c, MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN),
                  "MPI_Comm_set_errhandler") != 0 ||
        mpi_check(c, MPI_Comm_dup(MPI_COMM_WORLD, &c->comm), "MPI_Comm_dup") != 0 ||
        mpi_check(c, MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN),
                  "MPI_Comm_set_errhandler") != 0 ||
        mpi_check(c, MPI_Comm_rank(c->comm, &c->rank), "MPI_Comm_rank") != 0 ||
        mpi_check(c, MPI_Comm_size(c->comm, &c->world), "MPI_Comm_size") != 0)
        return acc_err_set(err, ACC_EDEVICE, "", "%s", c->fail_msg);
    size_t w = (size_t)c->world;
    c->counts = calloc(w, sizeof *c->counts);
    c->displs = calloc(w, sizeof *c->displs);
    c->rcounts = calloc(w, sizeof *c->rcounts);
    c->rdispls = calloc(w, sizeof *c->rdispls);
    if (!c->counts || !c->displs || !c->rcounts || !c->rdispls)
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory creating an MPI communicator");
    return 0;
}

/* An MPI communicator over a dup of MPI_COMM_WORLD (*out to mpi_destroy, also on failure). */
static int open_mpi(comm_mpi **out, acc_err *err)
{
    comm_mpi *c = calloc(1, sizeof *c);
    *out = c;
    if (c == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory creating an MPI communicator");
    c->comm = MPI_COMM_NULL;
    atomic_init(&c->aborted, 0);
    return open_world(c, err);
}

int kern_comm_mpi_open(kern_comm **out, int *rank, int *world, acc_err *err)
{
    *out = NULL;
    comm_mpi *c;
    int rc = open_mpi(&c, err);
    if (rc != 0) {
        mpi_destroy(c);
        return rc;
    }
    *rank = c->rank;
    *world = c->world;
    return kern_comm_wrap(&mpi_ops, c, out, err);
}

/* ---- GPUs: NCCL between processes, wired up over MPI */

#ifdef ACCUMD_HAVE_CUDA
/* Rank 0's NCCL id, broadcast over `m`; then this process's rank of
 * NCCL's world, with `m` as its host communicator (the barrier; taken). */
int kern_comm_mpi_open_nccl(int ordinal, kern_comm **out, int *rank, int *world, acc_err *err)
{
    *out = NULL;
    comm_mpi *m;
    int rc = open_mpi(&m, err);
    if (rc != 0) {
        mpi_destroy(m);
        return rc;
    }
    unsigned char id[KERN_COMM_NCCL_ID_BYTES] = {0};
    rc = m->rank == 0 ? kern_comm_nccl_unique_id(id, err) : 0;
    /* every rank reaches the broadcast; a failed id is sent as zeros and
     * the failing rank 0 ends the job (MPI_Abort) before anyone uses it */
    if (mpi_check(m, MPI_Bcast(id, KERN_COMM_NCCL_ID_BYTES, MPI_BYTE, 0, m->comm), "MPI_Bcast") != 0)
        rc = acc_err_set(err, ACC_EDEVICE, "devices", "%s", m->fail_msg);
    if (rc != 0) {
        mpi_destroy(m);
        return rc;
    }
    *rank = m->rank;
    *world = m->world;
    return kern_comm_nccl_open_rank(m->world, m->rank, ordinal, id, &mpi_ops, m, out, err);
}
#else
int kern_comm_mpi_open_nccl(int ordinal, kern_comm **out, int *rank, int *world, acc_err *err)
{
    (void)ordinal;
    (void)rank;
    (void)world;
    *out = NULL;
    return acc_err_set(err, ACC_EDEVICE, "devices", "this accumd-rank was built without CUDA");
}
#endif
