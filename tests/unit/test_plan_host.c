/* Host memory in the planner and the trainer (mem_plan.h "host memory",
 * plan_table.h's hardware.host_memory, trainer.h "Host memory"):
 *   - to the byte: for tiny specs (one and two ranks, every micro batch,
 *     with and without data packing) each row's host.batch equals the bytes
 *     the trainer's ranks allocated for their batch buffers (measured by
 *     the run), and host_bytes is the sum of the four parts;
 *   - the job's host bytes are ranks x a rank's (plan_job_host_bytes);
 *   - the trainer's host_mem budget is the reservation less its ranks'
 *     batch buffers; a reservation below them fails the start with
 *     ACC_ENOMEM naming host memory, and one that they fill exactly allows
 *     no allocation at all (host_mem_init_capped);
 *   - rows past hardware.host_memory do not fit: with host_memory one byte
 *     below the job's host bytes no row fits and each says "host_memory"
 *     (its JSON: fits false, limit "host_memory", host_fits false, why_not
 *     naming host memory), at exactly the job's host bytes every row fits
 *     again; a device that is too small is still the named limit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine_fixture.h"
#include "host_mem.h"
#include "plan_table.h"
#include "trainer_run.h"

static char text_path[64];

static int setup(void **state)
{
    (void)state;
    fx_write_text(text_path, sizeof text_path, 20000);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    unlink(text_path);
    return 0;
}

static uint64_t parts_sum(const plan_host_parts *h)
{
    return h->batch + h->optimizer + h->params + h->activations;
}

/* Every row of the spec's candidates against the trainer's measured batch
 * buffers, run at that row's split. */
static int check_rows(int B, int w, bool packing)
{
    train_cfg s;
    fx_tiny_spec(&s, text_path, B, 0, 0, w);
    s.micro_auto = true;
    s.max_steps = 1;
    s.data.packing = packing;
    plan_row rows[PLAN_MAX_ROWS];
    int n = 0, chosen = -1, checked = 0;
    acc_err err = {0};
    assert_int_equal(plan_candidates_on(&s, KERN_DEV_CPU, 0, rows, PLAN_MAX_ROWS, &n, &chosen, &err), 0);
    for (int i = 0; i < n; i++) {
        train_cfg run;
        fx_tiny_spec(&run, text_path, B, rows[i].micro_batch, rows[i].accum_steps, w);
        run.max_steps = 1;
        run.data.packing = packing;
        run.activation_checkpointing = rows[i].recompute;
        kern_device_info devs[2];
        fx_devices(devs, w, 1ull << 30);
        train_hooks h = {0};
        trainer_opts o = {.spec = &run, .devices = devs, .threads_per_device = 1, .checkpoint_keep = 1};
        assert_int_equal(trainer_run_sync(&o, &h, &err), 0);
        for (int r = 0; r < w; r++) {
            print_message("B %d w %d packing %d m %d rank %d: host.batch predicted %llu, allocated %llu\n", B, w,
                          packing, rows[i].micro_batch, r, (unsigned long long)rows[i].host.batch,
                          (unsigned long long)h.host_batch[r]);
            assert_true(h.host_batch[r] > 0);
            assert_true(rows[i].host.batch == h.host_batch[r]);
        }
        assert_true(rows[i].host_bytes == parts_sum(&rows[i].host));
        assert_true(plan_row_job_host_bytes(&rows[i], w) == (uint64_t)w * rows[i].host_bytes);
        checked++;
    }
    return checked;
}

static void test_batch_to_the_byte(void **state)
{
    (void)state;
    assert_int_equal(check_rows(4, 1, false), 3); /* m = 1, 2, 4 */
    assert_int_equal(check_rows(4, 2, false), 2); /* m = 1, 2 per rank */
    assert_int_equal(check_rows(4, 1, true), 3);  /* the packed positions too */
}

static void test_job_host_bytes(void **state)
{
    (void)state;
    train_cfg s;
    fx_tiny_spec(&s, text_path, 8, 2, 2, 2);
    uint64_t per_rank = 0, job = 0;
    acc_err err = {0};
    assert_int_equal(plan_job_host_bytes(&s, KERN_DEV_CPU, 1ull << 30, 2, &per_rank, &job, &err), 0);
    assert_true(per_rank == plan_host_batch_bytes(&s));
    assert_true(job == 2 * per_rank);
    /* the seq_len x micro batch grows it: 4 x 16 tokens per rank, 12 bytes each + sample + mask */
    uint64_t T = 16, mmax = 4;
    assert_true(per_rank == (T + 1) * 4 + mmax * T * 12 + 2 * T);
}

/* The trainer's host_mem: the reservation less the batch buffers, exactly. */
static void test_trainer_budget(void **state)
{
    (void)state;
    train_cfg s;
    fx_tiny_spec(&s, text_path, 4, 2, 1, 2);
    s.max_steps = 1;
    kern_device_info devs[2];
    fx_devices(devs, 2, 1ull << 30);
    uint64_t batch = plan_host_batch_bytes(&s);
    acc_err err = {0};
    train_hooks h = {0};
    trainer_opts o = {.spec = &s, .devices = devs, .threads_per_device = 1, .checkpoint_keep = 1,
                      .host_budget = 2 * batch + 4096};
    assert_int_equal(trainer_run_sync(&o, &h, &err), 0);
    assert_true(h.host_budget == 4096);
    assert_true(h.host_peak == 0); /* nothing of this job lives in host memory by choice */
    assert_true(h.host_batch[0] == batch && h.host_batch[1] == batch);
    /* below the batch buffers: refused at start, naming host memory */
    o.host_budget = 2 * batch - 1;
    memset(&h, 0, sizeof h);
    assert_int_equal(trainer_run_sync(&o, &h, &err), ACC_ENOMEM);
    assert_string_equal(err.field, "host memory");
    assert_non_null(strstr(err.msg, "host memory"));
    /* a budget the batch buffers fill allows nothing more */
    host_mem hm;
    host_mem_init_capped(&hm, 0);
    void *p = NULL;
    assert_int_equal(host_mem_alloc(&hm, 1, &p, &err), ACC_ENOMEM);
    assert_null(p);
    host_mem_destroy(&hm);
}

static const plan_row *first_row(const plan_table *t)
{
    assert_true(t->nrows > 0);
    return &t->rows[0];
}

static void test_rows_past_host_memory(void **state)
{
    (void)state;
    train_cfg s;
    fx_tiny_spec(&s, text_path, 8, 0, 0, 2);
    s.micro_auto = true;
    /* a large seq_len x micro batch: host bytes worth planning */
    s.model.seq_len = 1024;
    plan_hw hw = {.kind = KERN_DEV_CPU, .device_memory = 1ull << 30, .devices = 2};
    plan_table t;
    acc_err err = {0};
    assert_int_equal(plan_table_build(&s, &hw, &t, &err), 0);
    uint64_t job = plan_row_job_host_bytes(first_row(&t), 2);
    assert_true(job == 2 * plan_host_batch_bytes(&s));
    /* the batch part does not depend on m; host checkpoints and the offloaded optimizer add */
    for (int i = 0; i < t.nrows; i++)
        assert_true(plan_row_job_host_bytes(&t.rows[i], 2) ==
                    job + 2 * (t.rows[i].host.activations + t.rows[i].host.optimizer + t.rows[i].host.params));
    assert_true(t.suggested >= 0);
    plan_table_free(&t);

    hw.host_memory = job - 1;
    assert_int_equal(plan_table_build(&s, &hw, &t, &err), 0);
    assert_int_equal(t.suggested, -1);
    for (int i = 0; i < t.nrows; i++) {
        assert_false(t.rows[i].fits);
        assert_string_equal(plan_row_limit(&t.rows[i], &hw), "host_memory");
    }
    json_t *o = plan_row_json(first_row(&t), NULL, &hw);
    assert_non_null(o);
    assert_false(json_is_true(json_object_get(o, "fits")));
    assert_false(json_is_true(json_object_get(o, "host_fits")));
    assert_string_equal(json_string_value(json_object_get(o, "limit")), "host_memory");
    assert_true((uint64_t)json_integer_value(json_object_get(o, "job_host_bytes")) == job);
    assert_true((uint64_t)json_integer_value(json_object_get(o, "host_batch_bytes")) == plan_host_batch_bytes(&s));
    assert_int_equal(json_integer_value(json_object_get(o, "host_optimizer_bytes")), 0);
    assert_non_null(strstr(json_string_value(json_object_get(o, "why_not")), "host memory"));
    json_decref(o);
    plan_table_free(&t);

    hw.host_memory = job; /* exactly enough */
    assert_int_equal(plan_table_build(&s, &hw, &t, &err), 0);
    assert_true(t.suggested >= 0);
    o = plan_row_json(&t.rows[t.suggested], NULL, &hw);
    assert_true(json_is_true(json_object_get(o, "fits")));
    assert_true(json_is_true(json_object_get(o, "host_fits")));
    assert_true(json_is_null(json_object_get(o, "limit")));
    json_decref(o);
    plan_table_free(&t);

    /* a device too small is named first, whatever the host */
    hw.device_memory = 1 << 20;
    hw.host_memory = job - 1;
    assert_int_equal(plan_table_build(&s, &hw, &t, &err), 0);
    assert_string_equal(plan_row_limit(first_row(&t), &hw), "device_memory");
    plan_table_free(&t);

    /* the candidates alone: nothing is picked past the host */
    plan_row rows[PLAN_MAX_ROWS];
    int n = 0, chosen = -1;
    s.devices = 2;
    assert_int_equal(plan_candidates_hw(&s, KERN_DEV_CPU, 1ull << 30, job - 1, rows, PLAN_MAX_ROWS, &n, &chosen, &err),
                     0);
    assert_int_equal(chosen, -1);
    assert_int_equal(plan_candidates_hw(&s, KERN_DEV_CPU, 1ull << 30, job, rows, PLAN_MAX_ROWS, &n, &chosen, &err),
                     0);
    assert_true(chosen >= 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_to_the_byte), cmocka_unit_test(test_job_host_bytes),
        cmocka_unit_test(test_trainer_budget), cmocka_unit_test(test_rows_past_host_memory),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
