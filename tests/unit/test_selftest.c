/* kern_selftest: a device that computes what the CPU computes passes; one
 * that gets a single op wrong (a forward off by 0.1%, a backward that
 * forgets an output, a product wrong in bf16 mode only) fails, naming that
 * op; a device fault wins over the numbers. The same check the daemon runs on a GPU before `devices = auto`
 * uses it, here with CPU devices and a deliberately broken copy of the CPU
 * ops table. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "kern_device.h"
#include "kern_selftest.h"

static const kern_ops *cpu_ops; /* the real table, for the broken wrappers */

static kern_device *open_cpu(int threads)
{
    kern_device_info info = {.kind = KERN_DEV_CPU, .index = 0, .mem_total = 0};
    strcpy(info.name, "cpu0");
    kern_device *d = NULL;
    acc_err err = {0};
    assert_int_equal(kern_device_open(&info, threads, &d, &err), 0);
    cpu_ops = d->ops;
    return d;
}

static void gelu_off_by_a_little(kern_device *d, float *out, const float *inp, size_t n)
{
    cpu_ops->gelu_fwd(d, out, inp, n);
    for (size_t i = 0; i < n; i++) /* CPU device memory is host memory */
        out[i] *= 1.001f;
}

static void matmul_bwd_without_dbias(kern_device *d, float *dinp, float *dw, float *dbias,
                                     const float *dout, const float *inp, const float *w, int N,
                                     int C, int OC)
{
    cpu_ops->matmul_bwd(d, dinp, dw, NULL, dout, inp, w, N, C, OC);
}

/* GQA's backward that forgets dk (writes it to a scratch buffer) */
static void gqa_bwd_without_dk(kern_device *d, float *dq, float *dk, float *dv, float *scratch,
                               const float *dout, const float *q, const float *k,
                               const float *v, const float *lse, const float *out, int B, int T,
                               int NH, int NKV, int hs)
{
    float *junk = NULL;
    acc_err err = {0};
    size_t bytes = (size_t)B * T * NKV * hs * sizeof(float);
    assert_int_equal(d->ops->alloc(d, bytes, (void **)&junk, &err), 0);
    cpu_ops->gqa_attention_bwd(d, dq, junk, dv, scratch, dout, q, k, v, lse, out, B, T, NH, NKV,
                               hs);
    d->ops->free(d, junk);
}

/* attention with options that forgets the window */
static void gqa_opt_fwd_without_window(kern_device *d, float *out, float *lse, float *scratch,
                                       const float *q, const float *k, const float *v,
                                       const int *pos, const kern_att_opts *opts, int B, int T,
                                       int NH, int NKV, int hs)
{
    kern_att_opts o = *opts;
    o.window = 0;
    cpu_ops->gqa_attention_opt_fwd(d, out, lse, scratch, q, k, v, pos, &o, B, T, NH, NKV, hs);
}

/* NF4 dequantization that forgets the double
 * quantization's offset */
static void dequant_nf4_without_offset(kern_device *d, float *out, const kern_nf4 *q, size_t n)
{
    kern_nf4 o = *q;
    o.offset = 0.0f;
    cpu_ops->dequant_nf4(d, out, &o, n);
}

/* bf16 mode that gets matmul_fwd 5% wrong (past the bf16 tolerance):
 * set_precision swaps the device between two copies of the CPU table,
 * bf16_side's matmul_fwd scaled */
static kern_ops fp32_side, bf16_side;

static void matmul_fwd_off_by_5pct(kern_device *d, float *out, const float *inp, const float *w,
                                   const float *bias, int N, int C, int OC)
{
    cpu_ops->matmul_fwd(d, out, inp, w, bias, N, C, OC);
    for (size_t i = 0; i < (size_t)N * OC; i++) /* CPU device memory is host memory */
        out[i] *= 1.05f;
}

static int precision_swaps_table(kern_device *d, int bf16, acc_err *err)
{
    int rc = cpu_ops->set_precision(d, bf16, err);
    d->ops = bf16 ? &bf16_side : &fp32_side;
    return rc;
}

static int always_faulted(kern_device *d, acc_err *err)
{
    return acc_err_set(err, ACC_EDEVICE, "devices", "device %s: an illegal address (simulated)",
                       d->info.name);
}

static void test_cpu_passes(void **state)
{
    kern_device *a = open_cpu(2), *b = open_cpu(1); /* other thread counts: other sums */
    acc_err err = {0};
    assert_int_equal(kern_selftest(a, b, KERN_SELFTEST_TOL, &err), 0);
    assert_int_equal(a->in_use, 0); /* everything it allocated is freed */
    assert_int_equal(b->in_use, 0);
    kern_device_close(a);
    kern_device_close(b);
    kern_device_info info = {.kind = KERN_DEV_CPU, .index = 1, .mem_total = 0};
    strcpy(info.name, "cpu1");
    assert_int_equal(kern_selftest_device(&info, &err), 0);
}

/* run the self-test with one op of `dev` replaced; return the message */
static int run_broken(kern_ops *broken, acc_err *err)
{
    kern_device *dev = open_cpu(1), *ref = open_cpu(1);
    const kern_ops *real = dev->ops;
    dev->ops = broken;
    int rc = kern_selftest(dev, ref, KERN_SELFTEST_TOL, err);
    dev->ops = real;
    kern_device_close(dev);
    kern_device_close(ref);
    return rc;
}

/* a copy of the CPU ops table, to break one op of */
static kern_ops cpu_table(void)
{
    kern_device *d = open_cpu(1);
    kern_ops t = *d->ops;
    kern_device_close(d);
    return t;
}

static void test_wrong_forward_fails(void **state)
{
    kern_ops broken = cpu_table();
    broken.gelu_fwd = gelu_off_by_a_little;
    acc_err err = {0};
    assert_int_equal(run_broken(&broken, &err), ACC_EDEVICE);
    print_message("%s\n", err.msg);
    assert_non_null(strstr(err.msg, "gelu_fwd differs"));
    assert_string_equal(err.field, "devices");
}

static void test_wrong_backward_fails(void **state)
{
    kern_ops broken = cpu_table();
    broken.matmul_bwd = matmul_bwd_without_dbias;
    acc_err err = {0};
    assert_int_equal(run_broken(&broken, &err), ACC_EDEVICE);
    print_message("%s\n", err.msg);
    assert_non_null(strstr(err.msg, "matmul_bwd dbias"));
}

static void test_wrong_decoder_op_fails(void **state)
{
    kern_ops broken = cpu_table();
    broken.gqa_attention_opt_fwd = gqa_opt_fwd_without_window;
    acc_err err = {0};
    assert_int_equal(run_broken(&broken, &err), ACC_EDEVICE);
    print_message("%s\n", err.msg);
    assert_non_null(strstr(err.msg, "gqa_attention_opt_fwd differs"));
}

static void test_fault_wins(void **state)
{
    kern_ops broken = cpu_table();
    broken.last_error = always_faulted;
    acc_err err = {0};
    assert_int_equal(run_broken(&broken, &err), ACC_EDEVICE);
    assert_non_null(strstr(err.msg, "illegal address"));
}

static void test_wrong_llama_op_fails(void **state)
{
    kern_ops broken = cpu_table();
    broken.gqa_attention_bwd = gqa_bwd_without_dk;
    acc_err err = {0};
    assert_int_equal(run_broken(&broken, &err), ACC_EDEVICE);
    print_message("%s\n", err.msg);
    assert_non_null(strstr(err.msg, "gqa_attention_bwd dk"));
}

/* a backend without the LLaMA family's ops still passes its GPT-2 ops; the
 * caller that needs them hears it from kern_llama_ops_check */
static void test_without_llama_ops_passes(void **state)
{
    kern_ops lacking = cpu_table();
    lacking.rmsnorm_fwd = NULL;
    lacking.gqa_attention_bwd = NULL;
    acc_err err = {0};
    assert_int_equal(run_broken(&lacking, &err), 0);
    kern_device *d = open_cpu(1);
    const kern_ops *real = d->ops;
    d->ops = &lacking;
    assert_int_equal(kern_llama_ops_check(d, &err), ACC_EDEVICE);
    assert_non_null(strstr(err.msg, "rmsnorm_fwd"));
    d->ops = real;
    kern_device_close(d);
}

/* the same product right in fp32 and wrong in bf16 mode: found in the
 * bf16 pass, named as such */
static void test_wrong_bf16_matmul_fails(void **state)
{
    fp32_side = cpu_table();
    fp32_side.set_precision = precision_swaps_table;
    bf16_side = fp32_side;
    bf16_side.matmul_fwd = matmul_fwd_off_by_5pct;
    acc_err err = {0};
    assert_int_equal(run_broken(&fp32_side, &err), ACC_EDEVICE);
    print_message("%s\n", err.msg);
    assert_non_null(strstr(err.msg, "matmul_fwd (bf16) differs"));
}

static void test_wrong_nf4_op_fails(void **state)
{
    kern_ops broken = cpu_table();
    broken.dequant_nf4 = dequant_nf4_without_offset;
    acc_err err = {0};
    assert_int_equal(run_broken(&broken, &err), ACC_EDEVICE);
    print_message("%s\n", err.msg);
    assert_non_null(strstr(err.msg, "dequant_nf4 (double quantization) differs"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_passes),
        cmocka_unit_test(test_wrong_forward_fails),
        cmocka_unit_test(test_wrong_backward_fails),
        cmocka_unit_test(test_fault_wins),
        cmocka_unit_test(test_wrong_decoder_op_fails),
        cmocka_unit_test(test_wrong_llama_op_fails),
        cmocka_unit_test(test_without_llama_ops_passes),
        cmocka_unit_test(test_wrong_nf4_op_fails),
        cmocka_unit_test(test_wrong_bf16_matmul_fails),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
