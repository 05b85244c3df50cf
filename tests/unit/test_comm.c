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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sum_in_rank_order),
        cmocka_unit_test(test_abort_releases_waiters),
        cmocka_unit_test(test_abort_mid_reduction),
        cmocka_unit_test(test_single_rank),
        cmocka_unit_test(test_open_by_kind),
        cmocka_unit_test(test_bucketed_spans),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
