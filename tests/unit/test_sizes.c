/* Sizes computed from user numbers never wrap (issue 16, defect 1): the
 * checked arithmetic itself, the planner and the model's byte counts on a
 * spec needing more than 2^64 bytes (never a small "fitting" prediction),
 * and the submit-time check naming the field. Also the shard arithmetic of
 * the optimizer (adamw.h): ranks' ranges tile [0, n) for any n, w. The
 * reference for "how many bytes" is an independent long double count of
 * the same activations. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adamw.h"
#include "checked.h"
#include "engine_fixture.h"
#include "mem_plan.h"
#include "model.h"
#include "trainer.h"

static void test_checked_arithmetic(void **state)
{
    (void)state;
    uint64_t r;
    assert_int_equal(acc_mul_u64(1ull << 32, 1ull << 31, &r), 0);
    assert_true(r == 1ull << 63);
    assert_int_equal(acc_mul_u64(1ull << 32, 1ull << 32, &r), 1);
    assert_true(r == UINT64_MAX);
    assert_int_equal(acc_add_u64(UINT64_MAX - 1, 1, &r), 0);
    assert_true(r == UINT64_MAX);
    assert_int_equal(acc_add_u64(UINT64_MAX, 1, &r), 1);
    /* saturation is sticky along a chain */
    uint64_t x = acc_sat_mul_u64(1ull << 40, 1ull << 30);
    assert_true(x == UINT64_MAX);
    assert_true(acc_sat_add_u64(x, 5) == UINT64_MAX);
    assert_true(acc_sat_mul_u64(x, 3) == UINT64_MAX);
    assert_true(acc_sat_mul3_u64(1ull << 21, 1ull << 21, 1ull << 21) == 1ull << 63);
    assert_true(acc_sat_mul3_u64(1ull << 22, 1ull << 21, 1ull << 21) == UINT64_MAX);
    assert_true(acc_sat_round_up_u64(17, 16) == 32);
    assert_true(acc_sat_round_up_u64(32, 16) == 32);
    assert_true(acc_sat_round_up_u64(UINT64_MAX - 3, 16) == UINT64_MAX);
}

/* The largest shape the spec parser allows per key, at a micro batch that
 * makes the activations about 2^66 bytes (2^50 at micro batch 1). */
static void huge_spec(train_cfg *s, const char *train, int m)
{
    fx_tiny_spec(s, train, 65536, m, 65536 / m, 1);
    s->model.n_layer = 256;
    s->model.n_head = 256;
    s->model.n_embd = 65536;
    s->model.seq_len = 1 << 20;
    s->model.vocab_size = 256;
    s->model.padded_vocab_size = 0;
}

/* Bytes of GPT-2's activations for B x T in stored mode (the arrays of
 * model_gpt2.c's gpt2_acts), counted independently in long double, without
 * the engine's rounding of each of its 31 arrays up to 16 floats. */
#define ACT_ARRAYS 31
static long double ref_act_bytes(const model_config *c, long double B, long double T)
{
    long double BT = B * T, C = c->channels, L = c->n_layer, NH = c->n_head;
    long double Vp = c->padded_vocab_size;
    long double layer = 17 * BT * C + 4 * BT + NH * BT; /* ln1..fcproj, lse */
    long double resid3 = L * BT * C;
    long double rest = 2 * BT * C + 2 * BT + BT * Vp + BT  /* encoded, lnf(+stats), logits, losses */
                       + 3 * BT * C + 3 * BT * C + 8 * BT * C /* dresid, dln, datty, dqkv, dbig1/2 */
                       + 2 * NH * T * T + 3 * BT;             /* attention scratch, inputs */
    return 4.0L * (L * layer + resid3 + rest);
}

static void test_planner_huge_spec(void **state)
{
    (void)state;
    char train[64];
    fx_write_text(train, sizeof train, 4000);
    train_cfg s;
    huge_spec(&s, train, 65536);
    model_config cfg;
    acc_err err = {0};
    assert_int_equal(plan_model_config(&s, &cfg, &err), 0);
    /* the truth is far past 2^64 ... */
    assert_true(ref_act_bytes(&cfg, 65536, 1 << 20) > 18446744073709551616.0L);
    /* ... and so is every prediction: saturated, never wrapped small */
    assert_true(plan_act_bytes(&cfg, 65536, 1 << 20, false) == UINT64_MAX);
    assert_true(plan_peak_bytes(&cfg, 65536, 1 << 20, false) == UINT64_MAX);
    uint64_t b = 0;
    assert_int_equal(model_act_bytes(&cfg, 65536, 1 << 20, 0, &b, &err), ACC_EINVAL);
    assert_string_equal(err.field, "train_micro_batch_size_per_gpu");
    acc_err_clear(&err);
    assert_int_equal(plan_device_bytes(&s, 65536, false, &b, &err), ACC_EINVAL);
    assert_string_equal(err.field, "train_micro_batch_size_per_gpu");
    /* micro batch 1 is computable (about 2^50 bytes): the model's count
     * is the independent one plus at most 15 floats of rounding per array */
    acc_err_clear(&err);
    assert_int_equal(model_act_bytes(&cfg, 1, 1 << 20, 0, &b, &err), 0);
    long double want = ref_act_bytes(&cfg, 1, 1 << 20);
    assert_true((long double)b >= want && (long double)b <= want + ACT_ARRAYS * 15 * 4);
    assert_int_equal(plan_device_bytes(&s, 1, false, &b, &err), 0);
    assert_true(b != UINT64_MAX && (long double)b > want);

    /* the planner: a fixed micro batch past 2^64 is an error naming it */
    plan_row rows[PLAN_MAX_ROWS];
    int n = 0, chosen = 0;
    acc_err_clear(&err);
    assert_int_equal(plan_candidates(&s, 1ull << 40, rows, PLAN_MAX_ROWS, &n, &chosen, &err),
                     ACC_EINVAL);
    assert_string_equal(err.field, "train_micro_batch_size_per_gpu");
    /* "auto": every candidate is listed; those past 2^64 are saturated and
     * never fit, whatever the budget (even "unlimited" = 0 ... saturated is
     * UINT64_MAX, above every usable budget but the unlimited one) */
    s.micro_auto = true;
    s.micro_batch = 0;
    s.accum_steps = 0;
    acc_err_clear(&err);
    assert_int_equal(plan_candidates(&s, UINT64_MAX - 1, rows, PLAN_MAX_ROWS, &n, &chosen, &err), 0);
    assert_true(n >= 17);
    int saturated = 0;
    for (int i = 0; i < n; i++) {
        long double truth = ref_act_bytes(&cfg, rows[i].micro_batch, 1 << 20);
        if (rows[i].recompute)
            continue; /* the reference counts stored mode */
        if (truth > 18446744073709551616.0L) {
            saturated++;
            assert_true(rows[i].peak_bytes == UINT64_MAX);
            assert_false(rows[i].fits);
        } else {
            assert_true((long double)rows[i].peak_bytes > truth); /* + state */
        }
        if (i > 0 && rows[i].recompute == rows[i - 1].recompute)
            assert_true(rows[i].peak_bytes >= rows[i - 1].peak_bytes);
    }
    assert_true(saturated > 0);
    unlink(train);
}

/* At submit (trainer_check_spec, which jobs_check_submission calls): refused with
 * the field named, before any data is read. */
static void test_submit_check(void **state)
{
    (void)state;
    char train[64];
    fx_write_text(train, sizeof train, 4000);
    train_cfg s;
    huge_spec(&s, train, 65536);
    acc_err err = {0};
    assert_int_equal(trainer_check_spec(&s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "train_micro_batch_size_per_gpu");
    assert_non_null(strstr(err.msg, "overflow"));
    /* the same shape at micro batch 1 passes the size check (it may not fit
     * a device, which is the scheduler's and the planner's business) */
    huge_spec(&s, train, 1);
    acc_err_clear(&err);
    assert_int_equal(plan_check_sizes(&s, &err), 0);
    /* and a normal spec passes everything */
    fx_tiny_spec(&s, train, 8, 2, 4, 1);
    acc_err_clear(&err);
    assert_int_equal(trainer_check_spec(&s, &err), 0);
    unlink(train);
}

/* adamw_shard: ranges in order, disjoint, covering [0, n), sizes within 1 */
static void test_shards(void **state)
{
    (void)state;
    const size_t ns[] = {0, 1, 7, 100, 124439808, SIZE_MAX - 3, SIZE_MAX};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
        for (int w = 1; w <= 9; w++) {
            size_t n = ns[i], at = 0, small = n / (size_t)w;
            for (int r = 0; r < w; r++) {
                size_t lo, hi;
                adamw_shard(n, r, w, &lo, &hi);
                assert_true(lo == at && hi >= lo);
                assert_true(hi - lo == small || hi - lo == small + 1);
                at = hi;
            }
            assert_true(at == n);
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checked_arithmetic),
        cmocka_unit_test(test_planner_huge_spec),
        cmocka_unit_test(test_submit_check),
        cmocka_unit_test(test_shards),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
