/* conf: defaults, parsing of each kind of value, errors that name the key,
 * derived defaults. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "conf.h"

static void test_defaults(void **state)
{
    acc_conf c;
    acc_err err = {0};
    conf_defaults(&c);
    assert_int_equal(conf_finalize(&c, &err), 0);
    assert_string_equal(c.listen_host, "127.0.0.1");
    assert_int_equal(c.listen_port, 8470);
    assert_string_equal(c.state_dir, "/var/lib/accumd");
    assert_string_equal(c.data_roots, "/var/lib/accumd/data");
    assert_string_equal(c.output_root, "/var/lib/accumd/out");
    assert_string_equal(c.token_file, "/var/lib/accumd/token");
    assert_int_equal(c.cpu_devices, 1);
    assert_true(c.cpu_device_memory == (2ULL << 30));
    assert_true(c.cpu_threads_per_device >= 1);
    assert_false(c.require_token);
}

static void test_bytes(void **state)
{
    uint64_t v;
    assert_int_equal(conf_parse_bytes("512", &v), 0);
    assert_true(v == 512);
    assert_int_equal(conf_parse_bytes("4K", &v), 0);
    assert_true(v == 4096);
    assert_int_equal(conf_parse_bytes("3M", &v), 0);
    assert_true(v == 3ULL << 20);
    assert_int_equal(conf_parse_bytes("2GiB", &v), 0);
    assert_true(v == 2ULL << 30);
    assert_int_equal(conf_parse_bytes("1T", &v), 0);
    assert_true(v == 1ULL << 40);
    assert_int_not_equal(conf_parse_bytes("", &v), 0);
    assert_int_not_equal(conf_parse_bytes("-1G", &v), 0);
    assert_int_not_equal(conf_parse_bytes("2X", &v), 0);
    assert_int_not_equal(conf_parse_bytes("99999999999999T", &v), 0);
}

static void test_listen(void **state)
{
    acc_conf c;
    acc_err err = {0};
    conf_defaults(&c);
    assert_int_equal(conf_set(&c, "listen", "[::1]:9000", &err), 0);
    assert_string_equal(c.listen_host, "::1");
    assert_int_equal(c.listen_port, 9000);
    assert_true(conf_listen_is_loopback(&c));
    assert_int_equal(conf_set(&c, "listen", ":8000", &err), 0);
    assert_string_equal(c.listen_host, "0.0.0.0");
    assert_false(conf_listen_is_loopback(&c));
    assert_int_equal(conf_finalize(&c, &err), 0);
    assert_true(c.require_token);
    assert_int_equal(conf_set(&c, "listen", "localhost", &err), ACC_EINVAL);
    assert_string_equal(err.field, "listen");
    assert_int_equal(conf_set(&c, "listen", "127.0.0.1:70000", &err), ACC_EINVAL);
    assert_string_equal(err.field, "listen");
}

/* Issue 16 defect 17: loopback is decided on the resolved address. */
static void test_loopback_is_resolved(void **state)
{
    acc_conf c;
    acc_err err = {0};
    const char *loop[] = {"127.0.0.1:1", "127.9.8.7:1", "[::1]:1", "localhost:1", "[::ffff:127.0.0.1]:1"};
    const char *net[] = {"127.example.com:1", "127.0.0.1.example.invalid:1", "127.:1", "0.0.0.0:1",
                         "[::ffff:10.0.0.1]:1", "[::]:1", "10.1.2.3:1", "128.0.0.1:1"};
    for (size_t i = 0; i < sizeof loop / sizeof loop[0]; i++) {
        conf_defaults(&c);
        assert_int_equal(conf_set(&c, "listen", loop[i], &err), 0);
        assert_int_equal(conf_finalize(&c, &err), 0);
        if (c.require_token)
            fail_msg("%s: token forced on", loop[i]);
    }
    for (size_t i = 0; i < sizeof net / sizeof net[0]; i++) {
        conf_defaults(&c);
        assert_int_equal(conf_set(&c, "listen", net[i], &err), 0);
        assert_int_equal(conf_finalize(&c, &err), 0);
        if (!c.require_token)
            fail_msg("%s counts as loopback", net[i]);
    }
}

/* Issue 16 defects 13, 14: one strict integer and boolean parser. */
static void test_strict_scalars(void **state)
{
    uint64_t v = 0;
    bool b = false;
    assert_int_equal(conf_parse_u64("0", 10, &v), 0);
    assert_true(v == 0);
    assert_int_equal(conf_parse_u64("18446744073709551615", UINT64_MAX, &v), 0);
    assert_true(v == UINT64_MAX);
    assert_int_not_equal(conf_parse_u64("18446744073709551616", UINT64_MAX, &v), 0);
    assert_int_not_equal(conf_parse_u64("9223372036854775808", INT64_MAX, &v), 0);
    assert_int_equal(conf_parse_u64("9223372036854775807", INT64_MAX, &v), 0);
    const char *bad[] = {"", " 1", "1 ", "+5", "-1", " -1", "0x10", "1e3", "1.0", "٣"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (conf_parse_u64(bad[i], UINT64_MAX, &v) == 0)
            fail_msg("'%s' parsed as %llu", bad[i], (unsigned long long)v);
    const char *yes[] = {"1", "true", "TRUE", "True", "yes", "on", "ON"}, *no[] = {"0", "false", "FALSE", "no", "off"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
        assert_int_equal(conf_parse_bool(yes[i], &b), 0);
        assert_true(b);
    }
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
        assert_int_equal(conf_parse_bool(no[i], &b), 0);
        assert_false(b);
    }
    const char *nb[] = {"", "maybe", "2", "tru", "true ", " yes", "y", "-1"};
    for (size_t i = 0; i < sizeof nb / sizeof nb[0]; i++)
        if (conf_parse_bool(nb[i], &b) == 0)
            fail_msg("'%s' parsed as a boolean", nb[i]);
    /* and the config keys use them */
    acc_conf c;
    acc_err err = {0};
    conf_defaults(&c);
    assert_int_equal(conf_set(&c, "cpu_devices", " 2", &err), ACC_EINVAL);
    assert_int_equal(conf_set(&c, "cpu_devices", "+2", &err), ACC_EINVAL);
    assert_int_equal(conf_set(&c, "max_connections", "18446744073709551617", &err), ACC_EINVAL);
    assert_int_equal(conf_set(&c, "require_token", "TRUE", &err), 0);
    assert_true(c.require_token);
}

/* Issue 16 defect 11: the connection limits keep a reserve. */
static void test_connection_limits(void **state)
{
    acc_conf c;
    acc_err err = {0};
    conf_defaults(&c);
    assert_int_equal(conf_finalize(&c, &err), 0);
    assert_true(c.max_pending_connections > 0 && c.max_pending_connections < c.max_connections_per_ip);
    conf_defaults(&c);
    assert_int_equal(conf_set(&c, "max_connections_per_ip", "50", &err), 0);
    assert_int_equal(conf_set(&c, "max_pending_connections", "50", &err), 0);
    assert_int_equal(conf_finalize(&c, &err), ACC_EINVAL);
    assert_string_equal(err.field, "max_pending_connections");
    conf_defaults(&c);
    assert_int_equal(conf_set(&c, "header_timeout", "30", &err), 0);
    assert_int_equal(conf_set(&c, "request_timeout", "20", &err), 0);
    assert_int_equal(conf_finalize(&c, &err), ACC_EINVAL);
    assert_string_equal(err.field, "header_timeout");
}

static void test_errors_name_the_key(void **state)
{
    acc_conf c;
    acc_err err = {0};
    conf_defaults(&c);
    const char *bad[][2] = {
        {"cpu_devices", "0"},          {"cpu_devices", "two"},
        {"cpu_device_memory", "12"},   {"devices", "tpu"},
        {"require_token", "maybe"},    {"max_body", "10G"},
        {"log_level", "loud"},         {"state_dir", ""},
        {"shutdown_grace", "-1"},      {"cpu_threads_per_device", "1.5"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        acc_err_clear(&err);
        assert_int_equal(conf_set(&c, bad[i][0], bad[i][1], &err), ACC_EINVAL);
        assert_string_equal(err.field, bad[i][0]);
        assert_non_null(strstr(err.msg, bad[i][0]));
    }
    assert_int_equal(conf_set(&c, "nope", "1", &err), ACC_EINVAL);
    assert_non_null(strstr(err.msg, "unknown config key"));
    assert_int_equal(conf_set_pair(&c, "=1", &err), ACC_EINVAL);
    assert_int_equal(conf_set_pair(&c, "cpu_devices", &err), ACC_EINVAL);
}

static void test_overrides_and_derived(void **state)
{
    acc_conf c;
    acc_err err = {0};
    conf_defaults(&c);
    assert_int_equal(conf_set_pair(&c, "state_dir=/srv/acc", &err), 0);
    assert_int_equal(conf_set_pair(&c, "output_root=/big/out", &err), 0);
    assert_int_equal(conf_set_pair(&c, "cpu_devices=4", &err), 0);
    assert_int_equal(conf_set_pair(&c, "cpu_devices=2", &err), 0);
    assert_int_equal(conf_set_pair(&c, "cpu_threads_per_device=3", &err), 0);
    assert_int_equal(conf_set_pair(&c, "devices=cpu", &err), 0);
    assert_int_equal(conf_finalize(&c, &err), 0);
    assert_int_equal(c.cpu_devices, 2);
    assert_int_equal(c.cpu_threads_per_device, 3);
    assert_int_equal(c.devices, CONF_DEVICES_CPU);
    assert_string_equal(c.data_roots, "/srv/acc/data");
    assert_string_equal(c.output_root, "/big/out");
}

/* A generate worker's threads leave a core to the daemon unless set. */
static void test_generate_threads(void **state)
{
    (void)state;
    acc_conf c;
    acc_err err = {0};
    conf_defaults(&c);
    assert_int_equal(c.generate_threads, 0);
    c.cpu_threads_per_device = 2;
    assert_int_equal(conf_generate_threads(&c, 2), 1);  /* every core: one left */
    assert_int_equal(conf_generate_threads(&c, 8), 2);  /* cores to spare: the device's */
    c.cpu_threads_per_device = 1;
    assert_int_equal(conf_generate_threads(&c, 1), 1);  /* one core: still one thread */
    c.cpu_threads_per_device = 16;
    assert_int_equal(conf_generate_threads(&c, 4), 3);
    assert_int_equal(conf_set_pair(&c, "generate_threads=5", &err), 0);
    assert_int_equal(conf_generate_threads(&c, 4), 5);  /* set: as given */
    assert_int_not_equal(conf_set_pair(&c, "generate_nice=20", &err), 0);
    assert_string_equal(err.field, "generate_nice");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generate_threads),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_bytes),
        cmocka_unit_test(test_listen),
        cmocka_unit_test(test_errors_name_the_key),
        cmocka_unit_test(test_loopback_is_resolved),
        cmocka_unit_test(test_strict_scalars),
        cmocka_unit_test(test_connection_limits),
        cmocka_unit_test(test_overrides_and_derived),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
