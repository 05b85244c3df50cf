/* kern_discover: CPU devices when asked or when there is no GPU; asking for
 * CUDA where there is none is an error naming `devices`. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "kern_discover.h"

static void test_cpu_devices(void **state)
{
    kern_device_info d[8];
    int n = -1;
    acc_err err = {0};
    assert_int_equal(kern_discover(KERN_WANT_CPU, 3, 1 << 20, d, 8, &n, &err), 0);
    assert_int_equal(n, 3);
    for (int i = 0; i < n; i++) {
        assert_int_equal(d[i].kind, KERN_DEV_CPU);
        assert_int_equal(d[i].index, i);
        assert_true(d[i].mem_total == (1 << 20));
    }
    assert_string_equal(d[2].name, "cpu2");
    assert_int_equal(kern_discover(KERN_WANT_CPU, 9, 1 << 20, d, 8, &n, &err), ACC_EINVAL);
    assert_string_equal(err.field, "cpu_devices");
}

static void test_auto_falls_back(void **state)
{
    kern_device_info d[8];
    int n = -1;
    acc_err err = {0};
    assert_int_equal(kern_discover(KERN_WANT_AUTO, 2, 1 << 20, d, 8, &n, &err), 0);
    assert_true(n >= 1);
    if (d[0].kind == KERN_DEV_CPU)
        assert_int_equal(n, 2);
    if (d[0].kind == KERN_DEV_CPU) {
        /* no GPU here: asking for CUDA must fail and say why */
        assert_int_equal(kern_discover(KERN_WANT_CUDA, 2, 1 << 20, d, 8, &n, &err), ACC_EDEVICE);
        assert_string_equal(err.field, "devices");
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_devices),
        cmocka_unit_test(test_auto_falls_back),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
