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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_never_fits),
        cmocka_unit_test(test_order_and_gang),
        cmocka_unit_test(test_backfill),
        cmocka_unit_test(test_prefers_cuda),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
