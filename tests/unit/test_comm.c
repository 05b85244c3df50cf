/* kern_comm_cpu: the all-reduce sums exactly in rank order, leaves the same
 * bits on every rank, counts calls, and an abort releases waiting ranks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kern_comm.h"

enum { R = 3, LEN = 1001, ROUNDS = 5 };

typedef struct rank_arg {
    kern_comm *comm;
    int rank;
    float *buf;
    int rc;
    int stop_after; /* abort instead of joining this round (-1 never) */
} rank_arg;

static float value(int rank, int round, size_t i)
{
    return (float)(rank + 1) * 0.1f + (float)round * 1e-3f + (float)i * 1e-7f;
}

static void *rank_main(void *p)
{
    rank_arg *a = p;
    for (int round = 0; round < ROUNDS; round++) {
        if (round == a->stop_after) {
            kern_comm_abort(a->comm);
            a->rc = ACC_ECANCELLED;
            return NULL;
        }
        for (size_t i = 0; i < LEN; i++)
            a->buf[(size_t)round * LEN + i] = value(a->rank, round, i);
        a->rc = kern_comm_allreduce(a->comm, a->rank, a->buf + (size_t)round * LEN, LEN);
        if (a->rc != 0)
            return NULL;
    }
    return NULL;
}

static void run(int stop_rank, int stop_round, rank_arg *args, kern_comm **comm)
{
    acc_err err = {0};
    assert_int_equal(kern_comm_create(R, comm, &err), 0);
    pthread_t th[R];
    for (int r = 0; r < R; r++) {
        args[r] = (rank_arg){.comm = *comm, .rank = r, .stop_after = r == stop_rank ? stop_round : -1};
        args[r].buf = calloc((size_t)ROUNDS * LEN, sizeof(float));
        assert_non_null(args[r].buf);
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &args[r]), 0);
    }
    for (int r = 0; r < R; r++)
        pthread_join(th[r], NULL);
}

static void test_sum_in_rank_order(void **state)
{
    rank_arg a[R];
    kern_comm *c;
    run(-1, -1, a, &c);
    for (int r = 0; r < R; r++)
        assert_int_equal(a[r].rc, 0);
    for (int round = 0; round < ROUNDS; round++)
        for (size_t i = 0; i < LEN; i++) {
            float want = value(0, round, i);
            for (int r = 1; r < R; r++)
                want += value(r, round, i);
            for (int r = 0; r < R; r++)
                assert_true(a[r].buf[(size_t)round * LEN + i] == want);
        }
    assert_int_equal(kern_comm_allreduce_calls(c), ROUNDS);
    for (int r = 0; r < R; r++)
        free(a[r].buf);
    kern_comm_destroy(c);
}

static void test_abort_releases_waiters(void **state)
{
    rank_arg a[R];
    kern_comm *c;
    run(1, 2, a, &c); /* rank 1 gives up in round 2; 0 and 2 are waiting */
    for (int r = 0; r < R; r++)
        assert_int_equal(a[r].rc, ACC_ECANCELLED);
    assert_true(kern_comm_aborted(c));
    assert_int_equal(kern_comm_barrier(c), ACC_ECANCELLED);
    for (int r = 0; r < R; r++)
        free(a[r].buf);
    kern_comm_destroy(c);
}

/* An abort from outside while ranks are mid-reduction: every rank frees its
 * buffer as soon as its call returns, so a rank still reading a peer's
 * buffer after that would be a use-after-free (ASan catches it). */
typedef struct big_arg {
    kern_comm *comm;
    int rank;
    int rc;
} big_arg;

static void *big_rank(void *p)
{
    big_arg *a = p;
    enum { BIG = 1 << 20 };
    for (int round = 0; round < 1000; round++) {
        float *buf = calloc(BIG, sizeof *buf);
        assert_non_null(buf);
        a->rc = kern_comm_allreduce(a->comm, a->rank, buf, BIG);
        free(buf);
        if (a->rc != 0)
            return NULL;
    }
    return NULL;
}

static void test_abort_mid_reduction(void **state)
{
    for (int trial = 0; trial < 10; trial++) {
        kern_comm *c;
        acc_err err = {0};
        assert_int_equal(kern_comm_create(R, &c, &err), 0);
        pthread_t th[R];
        big_arg a[R];
        for (int r = 0; r < R; r++) {
            a[r] = (big_arg){.comm = c, .rank = r};
            assert_int_equal(pthread_create(&th[r], NULL, big_rank, &a[r]), 0);
        }
        usleep(1000 * (useconds_t)(trial + 1));
        kern_comm_abort(c);
        for (int r = 0; r < R; r++) {
            pthread_join(th[r], NULL);
            assert_int_equal(a[r].rc, ACC_ECANCELLED);
        }
        kern_comm_destroy(c);
    }
}

static void test_single_rank(void **state)
{
    kern_comm *c;
    acc_err err = {0};
    assert_int_equal(kern_comm_create(1, &c, &err), 0);
    float x[3] = {1, 2, 3};
    assert_int_equal(kern_comm_allreduce(c, 0, x, 3), 0);
    assert_true(x[0] == 1 && x[1] == 2 && x[2] == 3);
    assert_int_equal(kern_comm_allreduce_calls(c), 1);
    kern_comm_destroy(c);
    assert_int_equal(kern_comm_create(0, &c, &err), ACC_EINVAL);
}

/* kern_comm_open picks the implementation by the devices' kind: CPU
 * devices get the shared-memory one (a working all-reduce), and a job mixing
 * kinds, or GPUs in a build without CUDA, is refused. */
static void test_open_by_kind(void **state)
{
    kern_device_info d[2];
    memset(d, 0, sizeof d);
    for (int i = 0; i < 2; i++) {
        d[i].kind = KERN_DEV_CPU;
        d[i].index = i;
    }
    kern_comm *c = NULL;
    acc_err err = {0};
    assert_int_equal(kern_comm_open(d, 1, &c, &err), 0);
    float x[3] = {1, 2, 3};
    assert_int_equal(kern_comm_bind(c, 0, NULL, &err), 0);
    assert_int_equal(kern_comm_allreduce(c, 0, x, 3), 0); /* one rank: the sum is itself */
    assert_true(x[0] == 1 && x[1] == 2 && x[2] == 3);
    assert_int_equal(kern_comm_allreduce_calls(c), 1);
    kern_comm_destroy(c);

    d[0].kind = KERN_DEV_CUDA;
    c = NULL;
    int rc = kern_comm_open(d, 2, &c, &err);
    assert_int_not_equal(rc, 0); /* mixed kinds, or no CUDA in this build */
    assert_null(c);
}

/* Bucketed reduction: several span lists per reduction, each summed in
 * rank order on every rank; floats outside the spans untouched; starts and
 * finishes counted apart; a bad span list refused. */
enum { SPAN_LEN = 500 };
static const kern_span bucket_a[2] = {{400, 50}, {10, 90}}; /* any order */
static const kern_span bucket_b[3] = {{100, 1}, {480, 20}, {200, 0}};

typedef struct span_arg {
    kern_comm *comm;
    int rank;
    float buf[SPAN_LEN];
    int rc[3];
} span_arg;

static void *span_rank(void *p)
{
    span_arg *a = p;
    for (size_t i = 0; i < SPAN_LEN; i++)
        a->buf[i] = value(a->rank, 0, i);
    a->rc[0] = kern_comm_reduce_start(a->comm, a->rank, a->buf, bucket_a, 2);
    a->rc[1] = kern_comm_reduce_start(a->comm, a->rank, a->buf, bucket_b, 3);
    a->rc[2] = kern_comm_reduce_finish(a->comm, a->rank);
    return NULL;
}

static int in_spans(size_t i)
{
    return (i >= 400 && i < 450) || (i >= 10 && i < 100) || i == 100 || i >= 480;
}

static void test_bucketed_spans(void **state)
{
    kern_comm *c;
    acc_err err = {0};
    assert_int_equal(kern_comm_create(R, &c, &err), 0);
    pthread_t th[R];
    span_arg *a = calloc(R, sizeof *a);
    assert_non_null(a);
    for (int r = 0; r < R; r++) {
        a[r].comm = c;
        a[r].rank = r;
        assert_int_equal(pthread_create(&th[r], NULL, span_rank, &a[r]), 0);
    }
    for (int r = 0; r < R; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < R; r++)
        for (int k = 0; k < 3; k++)
            assert_int_equal(a[r].rc[k], 0);
    for (size_t i = 0; i < SPAN_LEN; i++) {
        float sum = value(0, 0, i);
        for (int r = 1; r < R; r++)
            sum += value(r, 0, i);
        for (int r = 0; r < R; r++)
            assert_true(a[r].buf[i] == (in_spans(i) ? sum : value(r, 0, i)));
    }
    assert_int_equal(kern_comm_allreduce_calls(c), 1);
    assert_int_equal(kern_comm_bucket_calls(c), 2);
    /* a plain all-reduce is one bucket and one reduction */
    kern_span none[1];
    assert_int_equal(kern_comm_reduce_start(c, 0, a[0].buf, none, 0), ACC_EINVAL);
    assert_int_equal(kern_comm_reduce_start(c, 0, a[0].buf, NULL, 1), ACC_EINVAL);
    assert_int_equal(kern_comm_reduce_start(c, 0, a[0].buf, bucket_a, KERN_COMM_MAX_SPANS + 1),
                     ACC_EINVAL);
    assert_int_equal(kern_comm_bucket_calls(c), 2);
    free(a);
    kern_comm_destroy(c);
}

/* ---- ZeRO: reduce-scatter and all-gather */

enum { ZN = 503, ZTAIL = 7 }; /* a buffer of ZN "parameters" + a tail of ZTAIL slots */

/* Spans like the trainer's buckets: out of order, a span crossing shard
 * boundaries, one reaching into the tail, an empty one. */
static const kern_span zb1[3] = {{300, 203}, {120, 60}, {0, 0}};
static const kern_span zb2[3] = {{0, 120}, {180, 120}, {ZN, ZTAIL}};

typedef struct zero_arg {
    kern_comm *comm;
    int rank, world;
    float *red, *sc, *ag; /* all-reduced, reduce-scattered, all-gathered */
    int rc;
} zero_arg;

static float zval(int rank, size_t i)
{
    return (float)(rank + 1) * 0.37f + (float)i * 1.3e-3f + 1.0f / (float)(i + 3);
}

static void *zero_rank(void *p)
{
    zero_arg *a = p;
    for (size_t i = 0; i < ZN + ZTAIL; i++)
        a->red[i] = a->sc[i] = zval(a->rank, i);
    int rc = kern_comm_reduce_start(a->comm, a->rank, a->red, zb1, 3);
    if (rc == 0)
        rc = kern_comm_reduce_start(a->comm, a->rank, a->red, zb2, 3);
    if (rc == 0)
        rc = kern_comm_reduce_finish(a->comm, a->rank);
    if (rc == 0)
        rc = kern_comm_scatter_start(a->comm, a->rank, a->sc, zb1, 3, ZN);
    if (rc == 0)
        rc = kern_comm_scatter_start(a->comm, a->rank, a->sc, zb2, 3, ZN);
    if (rc == 0)
        rc = kern_comm_reduce_finish(a->comm, a->rank);
    /* all-gather: my shard holds my values, the rest garbage */
    size_t lo = kern_shard_lo(ZN, a->rank, a->world), hi = kern_shard_lo(ZN, a->rank + 1, a->world);
    for (size_t i = 0; i < ZN; i++)
        a->ag[i] = i >= lo && i < hi ? zval(7, i) : -1.0f;
    if (rc == 0)
        rc = kern_comm_allgather(a->comm, a->rank, a->ag, ZN);
    a->rc = rc;
    return NULL;
}

static void test_scatter_gather(void **state)
{
    (void)state;
    for (int w = 1; w <= 4; w++) {
        kern_comm *c;
        acc_err err = {0};
        assert_int_equal(kern_comm_create(w, &c, &err), 0);
        zero_arg a[4];
        pthread_t th[4];
        for (int r = 0; r < w; r++) {
            a[r] = (zero_arg){.comm = c, .rank = r, .world = w};
            a[r].red = calloc(ZN + ZTAIL, sizeof(float));
            a[r].sc = calloc(ZN + ZTAIL, sizeof(float));
            a[r].ag = calloc(ZN, sizeof(float));
            assert_non_null(a[r].red && a[r].sc && a[r].ag);
            assert_int_equal(pthread_create(&th[r], NULL, zero_rank, &a[r]), 0);
        }
        for (int r = 0; r < w; r++)
            pthread_join(th[r], NULL);
        for (int r = 0; r < w; r++) {
            assert_int_equal(a[r].rc, 0);
            size_t lo = kern_shard_lo(ZN, r, w), hi = kern_shard_lo(ZN, r + 1, w);
            for (size_t i = 0; i < ZN + ZTAIL; i++) {
                float want = zval(0, i); /* rank order, by hand */
                for (int q = 1; q < w; q++)
                    want += zval(q, i);
                /* every span element is reduced (zb1 and zb2 cover it all) */
                assert_true(a[r].red[i] == want);
                /* owned elements and the tail: the all-reduce's bits */
                if ((i >= lo && i < hi) || i >= ZN)
                    assert_true(memcmp(&a[r].sc[i], &a[r].red[i], sizeof(float)) == 0);
            }
            for (size_t i = 0; i < ZN; i++)
                assert_true(a[r].ag[i] == zval(7, i));
        }
        /* two reductions, four buckets; the all-gather is not counted */
        assert_int_equal(kern_comm_allreduce_calls(c), 2);
        assert_int_equal(kern_comm_bucket_calls(c), 4);
        kern_comm_destroy(c);
        for (int r = 0; r < w; r++) {
            free(a[r].red);
            free(a[r].sc);
            free(a[r].ag);
        }
    }
}

/* ---- the 16-bit all-gather (bf16 working weights at ZeRO-3) */

enum { HN = 1001 }; /* odd: the shards are uneven for w = 2, 3, 4 */

typedef struct half_arg {
    kern_comm *comm;
    int rank, world;
    uint16_t *buf;
    int rc;
} half_arg;

/* Bit patterns of every kind, rank and index in them (NaN and Inf ones too:
 * the gather copies bits, no value is interpreted). */
static uint16_t hval(int rank, size_t i)
{
    return (uint16_t)(0x7f80u + (unsigned)rank * 0x1111u + (unsigned)i * 37u);
}

static void *half_rank(void *p)
{
    half_arg *a = p;
    size_t lo = kern_shard_lo(HN, a->rank, a->world), hi = kern_shard_lo(HN, a->rank + 1, a->world);
    for (size_t i = 0; i < HN + 1; i++) /* one past n: must stay untouched */
        a->buf[i] = i >= lo && i < hi ? hval(a->rank, i) : 0xdeadu;
    a->rc = kern_comm_allgather16(a->comm, a->rank, a->buf, HN);
    return NULL;
}

static void test_allgather16(void **state)
{
    (void)state;
    for (int w = 1; w <= 4; w++) {
        kern_comm *c;
        acc_err err = {0};
        assert_int_equal(kern_comm_create(w, &c, &err), 0);
        half_arg a[4];
        pthread_t th[4];
        for (int r = 0; r < w; r++) {
            a[r] = (half_arg){.comm = c, .rank = r, .world = w};
            a[r].buf = calloc(HN + 1, sizeof(uint16_t));
            assert_non_null(a[r].buf);
            assert_int_equal(pthread_create(&th[r], NULL, half_rank, &a[r]), 0);
        }
        for (int r = 0; r < w; r++)
            pthread_join(th[r], NULL);
        for (int r = 0; r < w; r++) {
            assert_int_equal(a[r].rc, 0);
            /* every rank's slice landed in every rank's buffer, nothing past n */
            for (int q = 0; q < w; q++)
                for (size_t i = kern_shard_lo(HN, q, w); i < kern_shard_lo(HN, q + 1, w); i++)
                    assert_int_equal(a[r].buf[i], hval(q, i));
            assert_int_equal(a[r].buf[HN], 0xdead);
        }
        assert_int_equal(kern_comm_allreduce_calls(c), 0); /* not a reduction */
        kern_comm_destroy(c);
        for (int r = 0; r < w; r++)
            free(a[r].buf);
    }
}

/* The shard invariant of kern_shard_lo / kern_span_clip. */
static void test_shards(void **state)
{
    (void)state;
    const size_t ns[] = {0, 1, 5, 16, 17, 1000003, SIZE_MAX - 3};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
        for (int w = 1; w <= 16; w++) {
            size_t n = ns[k];
            assert_true(kern_shard_lo(n, 0, w) == 0 && kern_shard_lo(n, w, w) == n);
            for (int r = 0; r < w; r++) {
                size_t len = kern_shard_lo(n, r + 1, w) - kern_shard_lo(n, r, w);
                assert_true(len == n / (size_t)w + ((size_t)r < n % (size_t)w));
            }
        }
    kern_span out[3];
    const kern_span sp[3] = {{10, 10}, {0, 5}, {40, 100}};
    assert_int_equal(kern_span_clip(sp, 3, 3, 15, out), 2);
    assert_true(out[0].off == 10 && out[0].n == 5 && out[1].off == 3 && out[1].n == 2);
    assert_int_equal(kern_span_clip(sp, 3, 50, SIZE_MAX, out), 1);
    assert_true(out[0].off == 50 && out[0].n == 90);
    assert_int_equal(kern_span_clip(sp, 3, 20, 40, out), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sum_in_rank_order),
        cmocka_unit_test(test_abort_releases_waiters),
        cmocka_unit_test(test_abort_mid_reduction),
        cmocka_unit_test(test_single_rank),
        cmocka_unit_test(test_open_by_kind),
        cmocka_unit_test(test_bucketed_spans),
        cmocka_unit_test(test_scatter_gather),
        cmocka_unit_test(test_allgather16),
        cmocka_unit_test(test_shards),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
