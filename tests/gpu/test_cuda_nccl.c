/* GPU: the NCCL communicator over all GPUs of the machine (one rank thread
 * per GPU, each on its own kern_cuda device and stream): the all-reduce
 * leaves the exact sum in every rank's device buffer, twice in a row, and
 * counts one call per all-reduce; a bucketed reduction (two span lists on
 * the communication stream, then finish) sums exactly the spans and leaves
 * the rest alone, and a kernel launched right after the wait succeeds; barrier works; after kern_comm_abort()
 * the all-reduce and the barrier return ACC_ECANCELLED at once and destroy
 * does not hang. ZeRO: a reduce-scatter of the same buckets leaves each
 * rank the sums of its shard of [0, ZN) and of the span parts past ZN
 * (all-reduced), and an all-gather of the shards makes every buffer whole.
 * With one GPU this is a one-rank communicator (identity).
 * Exits 77 (skipped) with a message where no GPU is present. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern_comm.h"
#include "kern_cuda.h"
#include "kern_device.h"
#include "kern_discover.h"
#include "gpu_fixture.h"

#define NELEM 1000003
#define MAXR 8
#define ROUNDS 3 /* the last one bucketed */
#define ZN 950000 /* the ZeRO round's "parameters"; bucket_b's last span reaches past them */

static const kern_span bucket_a[2] = {{500000, 400000}, {7, 1000}};
static const kern_span bucket_b[2] = {{2000, 3}, {900001, 100002}};

static int in_buckets(int i)
{
    return (i >= 500000 && i < 900000) || (i >= 7 && i < 1007) || (i >= 2000 && i < 2003) ||
           i >= 900001;
}

typedef struct rank_arg {
    int rank, nranks;
    kern_comm *comm;
    const kern_device_info *info;
    int failures;
} rank_arg;

static void *rank_main(void *p)
{
    rank_arg *a = p;
    kern_device *d = NULL;
    acc_err err = {0};
    float *buf = NULL, *h = malloc(NELEM * sizeof *h);
    if (h == NULL || kern_cuda_open(a->info, 1, &d, &err) != 0 ||
        d->ops->alloc(d, NELEM * sizeof(float), (void **)&buf, &err) != 0 ||
        kern_comm_bind(a->comm, a->rank, d, &err) != 0) {
        fprintf(stderr, "rank %d: setup: %s\n", a->rank, err.msg);
        a->failures++;
        kern_comm_abort(a->comm);
        goto out;
    }
    for (int round = 0; round < ROUNDS; round++) {
        int bucketed = round == ROUNDS - 1;
        /* small integers: the fp32 sum is exact whatever the order */
        for (int i = 0; i < NELEM; i++)
            h[i] = (float)((i % 97) + a->rank * 3 + round);
        d->ops->upload(d, buf, h, NELEM * sizeof *h);
        int rc = bucketed ? kern_comm_reduce_start(a->comm, a->rank, buf, bucket_a, 2)
                          : kern_comm_allreduce(a->comm, a->rank, buf, NELEM);
        if (rc == 0 && bucketed)
            rc = kern_comm_reduce_start(a->comm, a->rank, buf, bucket_b, 2);
        if (rc == 0 && bucketed)
            rc = kern_comm_reduce_finish(a->comm, a->rank);
        /* a kernel right after the wait: the polled "not ready" must not be
         * left behind as a launch failure (kern_cuda_last_error below) */
        if (rc == 0 && bucketed)
            (void)d->ops->sumsq(d, buf, 16);
        if (rc != 0) {
            kern_comm_error(a->comm, &err);
            fprintf(stderr, "rank %d: allreduce rc %d %s\n", a->rank, rc, err.msg);
            a->failures++;
            goto out;
        }
        d->ops->download(d, h, buf, NELEM * sizeof *h);
        int bad = 0;
        for (int i = 0; i < NELEM && bad < 3; i++) {
            float want = 0;
            for (int r = 0; r < a->nranks; r++)
                want += (float)((i % 97) + r * 3 + round);
            if (bucketed && !in_buckets(i))
                want = (float)((i % 97) + a->rank * 3 + round);
            if (h[i] != want) {
                fprintf(stderr, "rank %d round %d [%d]: %g != %g\n", a->rank, round, i, h[i],
                        want);
                bad++;
            }
        }
        a->failures += bad;
        if (kern_comm_barrier(a->comm) != 0) {
            fprintf(stderr, "rank %d: barrier failed\n", a->rank);
            a->failures++;
        }
    }
    /* ZeRO: reduce-scatter, then all-gather */
    for (int i = 0; i < NELEM; i++)
        h[i] = (float)((i % 89) + a->rank * 5);
    d->ops->upload(d, buf, h, NELEM * sizeof *h);
    int rc = kern_comm_scatter_start(a->comm, a->rank, buf, bucket_a, 2, ZN);
    if (rc == 0)
        rc = kern_comm_scatter_start(a->comm, a->rank, buf, bucket_b, 2, ZN);
    if (rc == 0)
        rc = kern_comm_reduce_finish(a->comm, a->rank);
    size_t lo = kern_shard_lo(ZN, a->rank, a->nranks), hi = kern_shard_lo(ZN, a->rank + 1, a->nranks);
    if (rc == 0) {
        d->ops->download(d, h, buf, NELEM * sizeof *h);
        int bad = 0;
        for (int i = 0; i < NELEM && bad < 3; i++) {
            if (!in_buckets(i) || (i < ZN && ((size_t)i < lo || (size_t)i >= hi)))
                continue; /* not reduced here: undefined */
            float want = 0;
            for (int r = 0; r < a->nranks; r++)
                want += (float)((i % 89) + r * 5);
            if (h[i] != want) {
                fprintf(stderr, "rank %d reduce-scatter [%d]: %g != %g\n", a->rank, i, h[i], want);
                bad++;
            }
        }
        a->failures += bad;
        for (int i = 0; i < NELEM; i++)
            h[i] = (size_t)i >= lo && (size_t)i < hi ? (float)(i % 1013) : -1.0f;
        d->ops->upload(d, buf, h, NELEM * sizeof *h);
        rc = kern_comm_allgather(a->comm, a->rank, buf, ZN);
    }
    if (rc == 0) {
        d->ops->download(d, h, buf, NELEM * sizeof *h);
        int bad = 0;
        for (int i = 0; i < ZN && bad < 3; i++)
            if (h[i] != (float)(i % 1013)) {
                fprintf(stderr, "rank %d all-gather [%d]: %g\n", a->rank, i, h[i]);
                bad++;
            }
        a->failures += bad;
    }
    if (rc != 0) {
        kern_comm_error(a->comm, &err);
        fprintf(stderr, "rank %d: ZeRO collectives rc %d %s\n", a->rank, rc, err.msg);
        a->failures++;
    }
    if (kern_cuda_last_error(d, &err) != 0) {
        fprintf(stderr, "rank %d: %s\n", a->rank, err.msg);
        a->failures++;
    }
out:
    if (d != NULL) {
        d->ops->free(d, buf);
        kern_device_close(d);
    }
    free(h);
    return NULL;
}

int main(void)
{
    kern_device_info g[KERN_MAX_DEVICES];
    int n = 0;
    acc_err err = {0};
    int skip = gpu_list_or_skip(g, &n);
    if (skip != 0)
        return skip;
    int nr = n < MAXR ? n : MAXR, ord[MAXR];
    for (int r = 0; r < nr; r++)
        ord[r] = g[r].index;
    kern_comm *c = NULL;
    if (kern_comm_nccl_open(nr, ord, &c, &err) != 0) {
        fprintf(stderr, "FAIL: kern_comm_nccl_open: %s\n", err.msg);
        return 1;
    }
    pthread_t th[MAXR];
    rank_arg args[MAXR];
    for (int r = 0; r < nr; r++) {
        args[r] = (rank_arg){.rank = r, .nranks = nr, .comm = c, .info = &g[r]};
        pthread_create(&th[r], NULL, rank_main, &args[r]);
    }
    int failures = 0;
    for (int r = 0; r < nr; r++) {
        pthread_join(th[r], NULL);
        failures += args[r].failures;
    }
    printf("%d rank(s), %llu reductions, %llu buckets\n", nr,
           (unsigned long long)kern_comm_allreduce_calls(c),
           (unsigned long long)kern_comm_bucket_calls(c));
    /* the ZeRO round: one more reduction of two buckets; all-gathers are not counted */
    if (kern_comm_allreduce_calls(c) != ROUNDS + 1 || kern_comm_bucket_calls(c) != ROUNDS + 3) {
        fprintf(stderr, "FAIL: expected %d reductions and %d buckets\n", ROUNDS + 1, ROUNDS + 3);
        failures++;
    }
    /* abort: everything returns ACC_ECANCELLED without waiting for peers */
    kern_comm_abort(c);
    if (!kern_comm_aborted(c) || kern_comm_allreduce(c, 0, NULL, 0) != ACC_ECANCELLED ||
        kern_comm_barrier(c) != ACC_ECANCELLED) {
        fprintf(stderr, "FAIL: calls after abort must return ACC_ECANCELLED\n");
        failures++;
    }
    kern_comm_destroy(c);
    return gpu_verdict(failures, "NCCL all-reduce, reduce-scatter and all-gather ok");
}
