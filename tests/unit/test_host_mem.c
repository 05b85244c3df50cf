/* host_mem: the budget counts every block, refuses past it without
 * changing anything, and the peak is the most held at once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "host_mem.h"

static void test_budget(void **state)
{
    (void)state;
    host_mem h;
    host_mem_init(&h, 1000);
    acc_err err = {0};
    void *a, *b, *c;
    assert_int_equal(host_mem_alloc(&h, 600, &a, &err), 0);
    assert_non_null(a);
    assert_int_equal((uintptr_t)a % 64, 0);
    for (int i = 0; i < 600; i++)
        assert_int_equal(((unsigned char *)a)[i], 0);
    assert_int_equal(host_mem_alloc(&h, 401, &b, &err), ACC_ENOMEM);
    assert_null(b);
    assert_string_equal(err.field, "host memory");
    assert_int_equal(host_mem_in_use(&h), 600);
    assert_int_equal(host_mem_alloc(&h, 400, &b, &err), 0);
    assert_int_equal(host_mem_in_use(&h), 1000);
    host_mem_free(&h, a, 600);
    assert_int_equal(host_mem_alloc(&h, 0, &c, &err), 0);
    assert_null(c);
    assert_int_equal(host_mem_in_use(&h), 400);
    assert_int_equal(host_mem_peak(&h), 1000);
    host_mem_free(&h, b, 400);
    host_mem_free(&h, NULL, 0);
    assert_int_equal(host_mem_in_use(&h), 0);
    host_mem_destroy(&h);
}

static void test_unlimited(void **state)
{
    (void)state;
    host_mem h;
    host_mem_init(&h, 0);
    acc_err err = {0};
    void *a, *b;
    assert_int_equal(host_mem_alloc(&h, 1 << 20, &a, &err), 0);
    assert_int_equal(host_mem_peak(&h), 1 << 20);
    assert_int_equal(host_mem_alloc(&h, SIZE_MAX, &b, &err), ACC_ENOMEM);
    assert_null(b);
    host_mem_free(&h, a, 1 << 20);
    assert_int_equal(host_mem_in_use(&h), 0);
    host_mem_destroy(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_unlimited),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
