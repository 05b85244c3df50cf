/* tev_json: every kind of trainer event survives the trip through one JSON
 * line bit for bit (doubles included, a NaN loss as null), and decoding
 * refuses what is not an event, naming the field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tev_json.h"

/* through text, as on the worker's channel */
static void trip(const train_event *in, train_event *out)
{
    json_t *o = tev_to_json(in);
    assert_non_null(o);
    char *text = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(17));
    json_decref(o);
    assert_non_null(text);
    assert_null(strchr(text, '\n')); /* one line */
    json_t *back = json_loads(text, 0, NULL);
    free(text);
    acc_err err = {0};
    assert_int_equal(tev_from_json(back, out, &err), 0);
    json_decref(back);
}

static void test_step_exact(void **state)
{
    train_event in = {.kind = TEV_STEP, .step = 120, .loss = 5.532248724112233, .lr = 6e-4,
                      .grad_norm = 1.0 / 3.0, .tokens_per_s = 2334.689, .micro_batch = 2, .accum_steps = 4,
                      .nranks = 2, .mem_in_use = {715328, 1}, .mem_peak = {UINT64_C(1) << 40, 3},
                      .mem_reserved = {5, 6}, .mem_free = {7, 8}, .mem_optim = {9, 10},
                      .mem_grads = {11, 12}, .host_budget = 13, .host_in_use = 14, .host_peak = 15};
    train_event out;
    trip(&in, &out);
    assert_int_equal(out.kind, TEV_STEP);
    assert_int_equal(out.step, 120);
    assert_memory_equal(&out.loss, &in.loss, sizeof in.loss); /* the same bits */
    assert_memory_equal(&out.grad_norm, &in.grad_norm, sizeof in.grad_norm);
    assert_true(out.lr == in.lr && out.tokens_per_s == in.tokens_per_s);
    assert_int_equal(out.micro_batch, 2);
    assert_int_equal(out.accum_steps, 4);
    assert_int_equal(out.nranks, 2);
    assert_memory_equal(out.mem_peak, in.mem_peak, sizeof in.mem_peak);
    assert_memory_equal(out.mem_free, in.mem_free, sizeof in.mem_free);
    /* ZeRO's per-rank optimizer and gradient bytes cross the worker's pipe too */
    assert_memory_equal(out.mem_optim, in.mem_optim, sizeof in.mem_optim);
    assert_memory_equal(out.mem_grads, in.mem_grads, sizeof in.mem_grads);
    /* the trainer's host_mem too */
    assert_true(out.host_budget == 13 && out.host_in_use == 14 && out.host_peak == 15);
}

static void test_nan_loss(void **state)
{
    train_event in = {.kind = TEV_STEP, .step = 3, .loss = NAN, .grad_norm = INFINITY, .nranks = 0};
    train_event out;
    trip(&in, &out);
    assert_true(isnan(out.loss) && isnan(out.grad_norm));
}

static void test_every_kind(void **state)
{
    train_event out;
    train_event oom = {.kind = TEV_OOM_ADJUST, .step = 4, .from_micro = 4, .from_accum = 1, .to_micro = 2,
                       .to_accum = 2, .recompute = true, .bytes_asked = 99, .bytes_free = 7};
    snprintf(oom.msg, sizeof oom.msg, "out of memory on cpu1");
    trip(&oom, &out);
    assert_int_equal(out.kind, TEV_OOM_ADJUST);
    assert_true(out.to_micro == 2 && out.to_accum == 2 && out.recompute && out.bytes_asked == 99 &&
                out.bytes_free == 7);
    assert_string_equal(out.msg, oom.msg);

    train_event ck = {.kind = TEV_CHECKPOINT, .step = 8};
    snprintf(ck.path, sizeof ck.path, "/out/j000001/ckpt-00000008");
    trip(&ck, &out);
    assert_string_equal(out.path, ck.path);

    train_event done = {.kind = TEV_DONE, .step = 9, .status = ACC_EOOM};
    snprintf(done.msg, sizeof done.msg, "needs \"1 GB\"\n and more");
    trip(&done, &out);
    assert_int_equal(out.kind, TEV_DONE);
    assert_int_equal(out.status, ACC_EOOM);
    assert_string_equal(out.msg, done.msg);

    train_event pr = {.kind = TEV_PROGRESS, .done = 5, .total = 10, .max_steps = 40};
    snprintf(pr.path, sizeof pr.path, "tokenize");
    trip(&pr, &out);
    assert_true(out.done == 5 && out.total == 10 && out.max_steps == 40);
    assert_string_equal(out.path, "tokenize");

    train_event ev = {.kind = TEV_EVAL, .step = 2, .val_loss = 4.25};
    trip(&ev, &out);
    assert_true(out.val_loss == 4.25);

    train_event rej = {.kind = TEV_CKPT_REJECTED};
    snprintf(rej.path, sizeof rej.path, "/o/ckpt-2");
    snprintf(rej.msg, sizeof rej.msg, "another job's");
    trip(&rej, &out);
    assert_string_equal(out.msg, "another job's");

    train_event up = {.kind = TEV_SPLIT_UP, .from_micro = 1, .to_micro = 2};
    trip(&up, &out);
    assert_int_equal(out.kind, TEV_SPLIT_UP);
}

static int decode(const char *text, acc_err *err)
{
    train_event ev;
    json_t *o = json_loads(text, 0, NULL);
    int rc = tev_from_json(o, &ev, err);
    json_decref(o);
    return rc;
}

static void test_refused(void **state)
{
    acc_err err = {0};
    assert_int_equal(decode("[1]", &err), ACC_EINVAL);
    assert_int_equal(decode("{\"event\":\"nope\",\"step\":1}", &err), ACC_EINVAL);
    assert_string_equal(err.field, "event");
    assert_int_equal(decode("{\"event\":\"log\",\"step\":1}", &err), ACC_EINVAL);
    assert_string_equal(err.field, "message");
    assert_int_equal(decode("{\"event\":\"eval\",\"step\":\"1\",\"val_loss\":1}", &err), ACC_EINVAL);
    assert_string_equal(err.field, "step");
    assert_int_equal(decode("{\"event\":\"step\",\"step\":1,\"loss\":1,\"lr\":1,\"grad_norm\":1,\"tokens_per_s\":1,"
                            "\"micro_batch\":1,\"accum_steps\":1,\"nranks\":99}", &err), ACC_EINVAL);
    assert_string_equal(err.field, "nranks");
    assert_int_equal(decode("{\"event\":\"step\",\"step\":1,\"loss\":1,\"lr\":1,\"grad_norm\":1,\"tokens_per_s\":1,"
                            "\"micro_batch\":1,\"accum_steps\":1,\"nranks\":1,\"mem_in_use\":[1,2],"
                            "\"mem_peak\":[1],\"mem_reserved\":[1],\"mem_free\":[1]}", &err), ACC_EINVAL);
    assert_string_equal(err.field, "mem_in_use");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_step_exact),
        cmocka_unit_test(test_nan_loss),
        cmocka_unit_test(test_every_kind),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
