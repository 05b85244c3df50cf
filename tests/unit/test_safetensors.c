/* safetensors: round trip, validation of every header field, checksum, and
 * that a failed write (file size limit, unwritable directory) leaves the old
 * file intact and no partial file behind. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"
#include "safetensors.h"

static char dir[256];

static int setup(void **state)
{
    snprintf(dir, sizeof dir, "/tmp/accumd-st-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    return fsu_rm_rf(dir, NULL);
}

static void write_sample(const char *path, float scale)
{
    float w[6];
    int32_t ids[3] = {7, -1, 1 << 30};
    for (int i = 0; i < 6; i++)
        w[i] = scale * (float)(i + 1) / 3.0f;
    st_tensor t[2] = {
        {.name = "h.0.attn.c_attn.weight", .dtype = ST_F32, .ndim = 2, .shape = {2, 3}, .data = w, .nbytes = sizeof w},
        {.name = "ids", .dtype = ST_I32, .ndim = 1, .shape = {3}, .data = ids, .nbytes = sizeof ids},
    };
    st_meta md[] = {{"format", "pt"}, {"step", "42"}};
    acc_err err = {0};
    assert_int_equal(st_write(path, t, 2, md, 2, &err), 0);
}

static void test_round_trip(void **state)
{
    char path[300];
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    write_sample(path, 1.0f);
    st_file *f = NULL;
    acc_err err = {0};
    assert_int_equal(st_open(path, &f, &err), 0);
    assert_int_equal(st_count(f), 2);
    st_tensor t;
    assert_int_equal(st_get(f, "h.0.attn.c_attn.weight", &t, &err), 0);
    assert_int_equal(t.dtype, ST_F32);
    assert_int_equal(t.ndim, 2);
    assert_true(t.shape[0] == 2 && t.shape[1] == 3);
    const float *w = t.data;
    for (int i = 0; i < 6; i++)
        assert_true(w[i] == (float)(i + 1) / 3.0f);
    assert_int_equal(st_get(f, "ids", &t, &err), 0);
    assert_int_equal(((const int32_t *)t.data)[2], 1 << 30);
    assert_string_equal(st_get_meta(f, "step"), "42");
    assert_string_equal(st_get_meta(f, "format"), "pt");
    assert_null(st_get_meta(f, "nope"));
    assert_int_equal(st_get(f, "nope", &t, &err), ACC_ENOTFOUND);
    st_close(f);
    /* data starts 8-byte aligned */
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal((sb.st_size - 24 - 12) % 8, 0);
}

/* Rewrite the file with `edit` applied to its bytes, then expect st_open to fail. */
static void expect_rejected(const char *path, void (*edit)(char *buf, size_t *len), const char *why)
{
    char *buf;
    size_t len;
    acc_err err = {0};
    assert_int_equal(fsu_read_all(path, &buf, &len, 1 << 20, &err), 0);
    edit(buf, &len);
    char bad[320];
    snprintf(bad, sizeof bad, "%s.bad", path);
    assert_int_equal(fsu_write_atomic(bad, buf, len, &err), 0);
    free(buf);
    st_file *f = NULL;
    acc_err_clear(&err);
    int rc = st_open(bad, &f, &err);
    if (rc == 0)
        fail_msg("accepted a file with %s", why);
    assert_null(f);
    assert_true(err.msg[0] != '\0');
}

static void flip_data_byte(char *b, size_t *len) { b[*len - 3] ^= 0x40; }
static void truncate_data(char *b, size_t *len) { *len -= 4; }
static void huge_header_len(char *b, size_t *len) { b[5] = 0x7f; }
static void short_file(char *b, size_t *len) { *len = 5; }
static void break_json(char *b, size_t *len) { b[8] = '['; }
static void shift_offsets(char *b, size_t *len)
{
    char *p = strstr(b + 8, "\"data_offsets\":[0,24]");
    assert_non_null(p);
    memcpy(p, "\"data_offsets\":[4,28]", 21);
}
static void bad_dtype(char *b, size_t *len)
{
    char *p = strstr(b + 8, "\"F32\"");
    assert_non_null(p);
    memcpy(p, "\"Q32\"", 5);
}

static void test_rejects_corruption(void **state)
{
    char path[300];
    snprintf(path, sizeof path, "%s/b.safetensors", dir);
    write_sample(path, 1.0f);
    expect_rejected(path, flip_data_byte, "a flipped data byte");
    expect_rejected(path, truncate_data, "truncated data");
    expect_rejected(path, huge_header_len, "a header length past the end");
    expect_rejected(path, short_file, "5 bytes");
    expect_rejected(path, break_json, "a broken JSON header");
    expect_rejected(path, shift_offsets, "overlapping offsets");
    expect_rejected(path, bad_dtype, "an unknown dtype");
}

static void test_rejects_bad_tensors_on_write(void **state)
{
    char path[300];
    snprintf(path, sizeof path, "%s/c.safetensors", dir);
    float w[4] = {0};
    acc_err err = {0};
    st_tensor wrong = {.name = "w", .dtype = ST_F32, .ndim = 2, .shape = {3, 3}, .data = w, .nbytes = sizeof w};
    assert_int_equal(st_write(path, &wrong, 1, NULL, 0, &err), ACC_EINVAL);
    st_tensor dup[2] = {
        {.name = "w", .dtype = ST_F32, .ndim = 1, .shape = {4}, .data = w, .nbytes = sizeof w},
        {.name = "w", .dtype = ST_F32, .ndim = 1, .shape = {4}, .data = w, .nbytes = sizeof w},
    };
    assert_int_equal(st_write(path, dup, 2, NULL, 0, &err), ACC_EINVAL);
    assert_int_equal(access(path, F_OK), -1);
}

static void test_failed_write_keeps_old_file(void **state)
{
    char path[300], partial[320];
    snprintf(path, sizeof path, "%s/d.safetensors", dir);
    snprintf(partial, sizeof partial, "%s.partial", path);
    write_sample(path, 1.0f);

    /* a big tensor over a 64 KiB file size limit: the write fails with EFBIG */
    size_t n = 1 << 16;
    float *big = calloc(n, sizeof *big);
    assert_non_null(big);
    st_tensor t = {.name = "big", .dtype = ST_F32, .ndim = 1, .shape = {(int64_t)n}, .data = big,
                   .nbytes = n * sizeof *big};
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    lim = old;
    lim.rlim_cur = 64 << 10;
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    acc_err err = {0};
    int rc = st_write(path, &t, 1, NULL, 0, &err);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, prev);
    free(big);
    assert_int_equal(rc, ACC_EIO);
    assert_non_null(strstr(err.msg, path));
    assert_int_equal(access(partial, F_OK), -1);

    st_file *f = NULL;
    assert_int_equal(st_open(path, &f, &err), 0); /* the old one, intact */
    assert_int_equal(st_count(f), 2);
    st_close(f);

    /* an unwritable directory */
    char ro[300];
    snprintf(ro, sizeof ro, "%s/ro", dir);
    assert_int_equal(mkdir(ro, 0500), 0);
    if (geteuid() != 0) { /* root ignores directory permissions */
        char p2[320];
        snprintf(p2, sizeof p2, "%s/x.safetensors", ro);
        float w = 1;
        st_tensor one = {.name = "w", .dtype = ST_F32, .ndim = 1, .shape = {1}, .data = &w, .nbytes = 4};
        assert_int_equal(st_write(p2, &one, 1, NULL, 0, &err), ACC_EIO);
    }
}

/* Issue 25 defect 11: a NaN or Inf in any float dtype is refused at open,
 * naming the tensor, the kind and the element; the header-only open (a
 * submit's check) reads no data; finite values, the largest included, open. */
static void test_rejects_non_finite(void **state)
{
    (void)state;
    const struct {
        st_dtype dtype;
        uint16_t bits16;
        uint32_t bits32;
        const char *kind;
    } cases[] = {
        {ST_F32, 0, 0x7fc00000u, "NaN"}, {ST_F32, 0, 0xff800000u, "Inf"}, {ST_BF16, 0x7fc0u, 0, "NaN"},
        {ST_BF16, 0x7f80u, 0, "Inf"},    {ST_F16, 0x7e00u, 0, "NaN"},     {ST_F16, 0xfc00u, 0, "Inf"},
        {ST_F32, 0, 0x7f7fffffu, NULL},  {ST_F16, 0x7bffu, 0, NULL},      {ST_BF16, 0xff7fu, 0, NULL},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        uint32_t w32[4] = {0x3f800000u, 0, 0, 0x3f800000u};
        uint16_t w16[4] = {0x3c00u, 0, 0, 0x3c00u};
        w32[2] = cases[k].bits32;
        w16[2] = cases[k].bits16;
        bool f32 = cases[k].dtype == ST_F32;
        st_tensor t[2] = {
            {.name = "ok", .dtype = ST_F32, .ndim = 1, .shape = {1}, .data = w32, .nbytes = 4},
            {.name = "model.layers.0.mlp.up_proj.weight", .dtype = cases[k].dtype, .ndim = 2, .shape = {2, 2},
             .data = f32 ? (const void *)w32 : (const void *)w16, .nbytes = f32 ? 16 : 8},
        };
        char path[300];
        snprintf(path, sizeof path, "%s/nf%zu.safetensors", dir, k);
        acc_err err = {0};
        assert_int_equal(st_write(path, t, 2, NULL, 0, &err), 0);
        st_file *f = NULL;
        int rc = st_open(path, &f, &err);
        if (cases[k].kind == NULL) {
            assert_int_equal(rc, 0);
            st_close(f);
            continue;
        }
        assert_int_equal(rc, ACC_EINVAL);
        assert_non_null(strstr(err.msg, "model.layers.0.mlp.up_proj.weight"));
        assert_non_null(strstr(err.msg, cases[k].kind));
        assert_non_null(strstr(err.msg, "element 2"));
        assert_int_equal(st_open_header(path, &f, &err), 0);
        st_close(f);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_rejects_corruption),
        cmocka_unit_test(test_rejects_bad_tensors_on_write),
        cmocka_unit_test(test_failed_write_keeps_old_file),
        cmocka_unit_test(test_rejects_non_finite),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
