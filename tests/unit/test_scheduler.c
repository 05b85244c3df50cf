/* scheduler: order by priority then submission, gang placement on one kind,
 * never-fits refused, backfill only when it cannot delay the head. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "scheduler.h"

static void cpus(sched_dev *d, int n)
{
    for (int i = 0; i < n; i++)
        d[i] = (sched_dev){.kind = KERN_DEV_CPU};
}

static void test_never_fits(void **state)
{
    sched_dev d[2];
    acc_err err = {0};
    cpus(d, 2);
    assert_int_equal(sched_can_ever_fit(d, 2, 2, &err), 0);
    assert_int_equal(sched_can_ever_fit(d, 2, 8, &err), ACC_EINVAL);
    assert_string_equal(err.field, "devices");
    assert_non_null(strstr(err.msg, "has 2 devices"));
}

static void test_order_and_gang(void **state)
{
    sched_dev d[4];
    cpus(d, 4);
    sched_req q[3] = {
        {.want = 2, .prio = 0, .submit = 1},
        {.want = 2, .prio = 5, .submit = 3},
        {.want = 2, .prio = 0, .submit = 2},
    };
    assert_int_equal(sched_plan(d, 4, q, 3), 2);
    /* sorted: prio 5 first, then submit 1, then submit 2 */
    assert_true(q[0].submit == 3 && q[0].start);
    assert_true(q[1].submit == 1 && q[1].start);
    assert_true(q[2].submit == 2 && !q[2].start);
    assert_int_equal(q[0].placed[0], 0);
    assert_int_equal(q[0].placed[1], 1);
    assert_int_equal(q[1].placed[0], 2);
    for (int i = 0; i < 4; i++)
        assert_true(d[i].busy);
}

static void test_backfill(void **state)
{
    sched_dev d[4];
    cpus(d, 4);
    /* two devices held by an earlier job (submit 1); the head wants 4 */
    d[0].busy = d[1].busy = true;
    d[0].holder_submit = d[1].holder_submit = 1;
    sched_req q[2] = {{.want = 4, .submit = 2}, {.want = 1, .submit = 3}};
    /* 4 total - 0 behind - 1 taken = 3 < 4: a backfill would delay the head */
    assert_int_equal(sched_plan(d, 4, q, 2), 0);

    /* head wants 3 of 4; one backfill of 1 leaves 3: allowed, a second not */
    cpus(d, 4);
    d[0].busy = d[1].busy = true;
    d[0].holder_submit = d[1].holder_submit = 1;
    sched_req q2[3] = {{.want = 3, .submit = 2}, {.want = 1, .submit = 3}, {.want = 1, .submit = 4}};
    assert_int_equal(sched_plan(d, 4, q2, 3), 1);
    assert_false(q2[0].start);
    assert_true(q2[1].start && q2[1].backfilled);
    assert_false(q2[2].start);
    /* next round: the backfilled job (submit 3) still runs: no more backfill */
    sched_req q3[2] = {{.want = 3, .submit = 2}, {.want = 1, .submit = 4}};
    assert_int_equal(sched_plan(d, 4, q3, 2), 0);
}

static void test_prefers_cuda(void **state)
{
    sched_dev d[3] = {{.kind = KERN_DEV_CPU}, {.kind = KERN_DEV_CUDA}, {.kind = KERN_DEV_CUDA}};
    sched_req q[1] = {{.want = 2, .submit = 1}};
    assert_int_equal(sched_plan(d, 3, q, 1), 1);
    assert_int_equal(q[0].placed[0], 1);
    assert_int_equal(q[0].placed[1], 2);
}

/* Round robin by user within a priority: alice's burst of three, then
 * bob's of three, on one device: one job starts per round, and the users
 * alternate (the one served longest ago first at equal depth). */
static void test_fair_order_alternates(void **state)
{
    enum { ALICE = 0, BOB = 1 };
    sched_req all[6];
    for (int i = 0; i < 6; i++)
        all[i] = (sched_req){.want = 1, .submit = (uint64_t)i + 1, .user = i < 3 ? ALICE : BOB};
    uint64_t last[2] = {0, 0}, clock = 0;
    bool done[6] = {false};
    int order[6];
    for (int round = 0; round < 6; round++) {
        sched_dev d[1];
        cpus(d, 1);
        sched_req q[6];
        int nq = 0;
        for (int i = 0; i < 6; i++)
            if (!done[i]) {
                q[nq] = all[i];
                q[nq].user_last = last[all[i].user];
                nq++;
            }
        assert_int_equal(sched_plan_users(d, 1, q, nq, NULL), 1);
        assert_true(q[0].start);
        for (int k = 1; k < nq; k++)
            assert_false(q[k].start);
        int idx = (int)q[0].submit - 1;
        done[idx] = true;
        order[round] = idx;
        last[all[idx].user] = ++clock;
    }
    /* a1 b1 a2 b2 a3 b3 */
    const int want[6] = {0, 3, 1, 4, 2, 5};
    for (int i = 0; i < 6; i++)
        assert_int_equal(order[i], want[i]);
    /* priority still comes first: a later, higher-priority job of alice's
     * goes before bob's first */
    sched_dev d[1];
    cpus(d, 1);
    sched_req q[2] = {{.want = 1, .submit = 1, .user = BOB}, {.want = 1, .prio = 1, .submit = 2, .user = ALICE,
                                                             .user_last = 5}};
    assert_int_equal(sched_plan_users(d, 1, q, 2, NULL), 1);
    assert_true(q[0].submit == 2 && q[0].start);
}

/* Per-user limits: alice at her running limit waits for her share, and
 * does not block bob's jobs; devices at once are a limit of their own. */
static void test_user_limits(void **state)
{
    enum { ALICE = 0, BOB = 1 };
    sched_dev d[4];
    cpus(d, 4);
    int running[2] = {1, 0}, devices[2] = {1, 0};
    d[0].busy = true; /* alice's running job */
    d[0].holder_submit = 1;
    sched_limits lim = {.max_running = 1, .nusers = 2, .running = running, .devices = devices};
    sched_req q[3] = {{.want = 1, .submit = 2, .user = ALICE},
                      {.want = 1, .submit = 3, .user = BOB},
                      {.want = 1, .submit = 4, .user = BOB}};
    assert_int_equal(sched_plan_users(d, 4, q, 3, &lim), 1);
    for (int i = 0; i < 3; i++) {
        if (q[i].submit == 2)
            assert_true(!q[i].start && q[i].over_share);
        if (q[i].submit == 3)
            assert_true(q[i].start && !q[i].over_share);
        if (q[i].submit == 4) /* bob is at his limit now */
            assert_true(!q[i].start && q[i].over_share);
    }
    assert_int_equal(running[BOB], 1);
    assert_int_equal(devices[BOB], 1);

    /* devices at once: 3 allowed per user; alice holds 2 */
    cpus(d, 4);
    d[0].busy = d[1].busy = true;
    int run2[2] = {1, 0}, dev2[2] = {2, 0};
    sched_limits lim2 = {.max_devices = 3, .nusers = 2, .running = run2, .devices = dev2};
    sched_req q2[2] = {{.want = 2, .submit = 2, .user = ALICE}, {.want = 1, .submit = 3, .user = ALICE}};
    assert_int_equal(sched_plan_users(d, 4, q2, 2, &lim2), 1);
    assert_true(q2[0].over_share && !q2[0].start);
    assert_true(q2[1].submit == 3 && q2[1].start);
    assert_int_equal(dev2[ALICE], 3);
}

/* Host memory: a job starts only when its host bytes fit what is free
 * (then taken), one that does not waits (host_wait), and a backfill never
 * takes host memory the waiting head needs. */
static void test_host_memory(void **state)
{
    (void)state;
    sched_dev d[4];
    cpus(d, 4);
    /* 100 bytes free: 60 starts, the next 60 waits for host memory, 30 fits
     * what is left but would leave the waiting head's 60 short: no backfill */
    sched_limits lim = {.host_on = true, .host_free = 100};
    sched_req q[3] = {{.want = 1, .submit = 1, .host_bytes = 60},
                      {.want = 1, .submit = 2, .host_bytes = 60},
                      {.want = 1, .submit = 3, .host_bytes = 30}};
    assert_int_equal(sched_plan_users(d, 4, q, 3, &lim), 1);
    assert_true(q[0].start && !q[0].host_wait);
    assert_true(!q[1].start && q[1].host_wait);
    assert_true(!q[2].start && !q[2].host_wait);
    assert_true(lim.host_free == 40);
    /* the first ended: 100 free again, the second and the third both start */
    cpus(d, 4);
    lim.host_free = 100;
    sched_req q2[2] = {{.want = 1, .submit = 2, .host_bytes = 60}, {.want = 1, .submit = 3, .host_bytes = 30}};
    assert_int_equal(sched_plan_users(d, 4, q2, 2, &lim), 2);
    assert_true(lim.host_free == 10);
    /* a head waiting for devices (3 of 4, two held by earlier jobs) keeps
     * its host bytes: a backfill may take only what it leaves */
    cpus(d, 4);
    d[0].busy = d[1].busy = true;
    d[0].holder_submit = d[1].holder_submit = 1;
    lim.host_free = 100;
    sched_req q3[3] = {{.want = 3, .submit = 2, .host_bytes = 70},
                       {.want = 1, .submit = 3, .host_bytes = 40},
                       {.want = 1, .submit = 4, .host_bytes = 30}};
    assert_int_equal(sched_plan_users(d, 4, q3, 3, &lim), 1);
    assert_true(!q3[0].start && !q3[0].host_wait); /* it waits for devices */
    assert_true(!q3[1].start);                      /* 100 - 40 < 70 */
    assert_true(q3[2].start && q3[2].backfilled);   /* 100 - 30 = 70 */
    assert_true(lim.host_free == 70);
    /* without a host limit the devices alone decide: the first backfills */
    cpus(d, 4);
    d[0].busy = d[1].busy = true;
    d[0].holder_submit = d[1].holder_submit = 1;
    sched_limits off = {.host_on = false};
    sched_req q4[3] = {{.want = 3, .submit = 2, .host_bytes = 70},
                       {.want = 1, .submit = 3, .host_bytes = 40},
                       {.want = 1, .submit = 4, .host_bytes = 30}};
    assert_int_equal(sched_plan_users(d, 4, q4, 3, &off), 1);
    assert_true(q4[1].start && !q4[2].start);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_never_fits),
        cmocka_unit_test(test_order_and_gang),
        cmocka_unit_test(test_backfill),
        cmocka_unit_test(test_prefers_cuda),
        cmocka_unit_test(test_fair_order_alternates),
        cmocka_unit_test(test_user_limits),
        cmocka_unit_test(test_host_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
