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

static int reserve(comm_mpi *c, size_t n)
{
    if (n <= c->cap)
        return 0;
    float *p = realloc(c->pack, n * sizeof *p);
    if (p == NULL)
        return ACC_ENOMEM;
    c->pack = p;
    p = realloc(c->recv, n * sizeof *p);
    if (p == NULL)
        return ACC_ENOMEM;
    c->recv = p;
    c->cap = n;
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
    size_t total = 0;
    for (int k = 0; k < ns; k++)
        total += sp[k].n;
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

const kern_comm_ops kern_comm_mpi_ops = {
    .name = "mpi",
    .destroy = mpi_destroy,
    .bind = NULL, /* CPU ranks: nothing to bind */
    .allreduce = mpi_allreduce,
    .reduce_start = mpi_reduce_start,
    .reduce_finish = mpi_reduce_finish,
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

int kern_comm_mpi_open(kern_comm **out, int *rank, int *world, acc_err *err)
{
    *out = NULL;
    comm_mpi *c = calloc(1, sizeof *c);
    if (c == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory creating an MPI communicator");
    c->comm = MPI_COMM_NULL;
    atomic_init(&c->aborted, 0);
    int rc = open_world(c, err);
    if (rc != 0) {
        mpi_destroy(c);
        return rc;
    }
    *rank = c->rank;
    *world = c->world;
    return kern_comm_wrap(&kern_comm_mpi_ops, c, out, err);
}
