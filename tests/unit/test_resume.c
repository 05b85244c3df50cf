/* Exact resume: a run stopped after k steps (its checkpoint written at the
 * end) and started again to N steps, resuming from that checkpoint, gives the
 * same per-step losses after k and the same final weights as an uninterrupted
 * N-step run; on two ranks too; and an OOM-adapted split would be restored
 * from the checkpoint. Also init_from a safetensors file. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "engine_fixture.h"
#include "fsutil.h"
#include "mem_plan.h"
#include "trainer_run.h"

#define N_STEPS 6
#define K_STEPS 3
#define BATCH 8

static char text_path[256];
static char out_root[256];

typedef struct run_out {
    double loss[N_STEPS];
    float *params;
    size_t nparams;
    int status;
    char last_log[512];
    int split_ups, final_micro;
} run_out;

static void on_event(void *ctx, const train_event *ev)
{
    run_out *r = ctx;
    if (ev->kind == TEV_LOG && strstr(ev->msg, "resumed from") != NULL)
        snprintf(r->last_log, sizeof r->last_log, "%s", ev->msg);
    if (ev->kind == TEV_SPLIT_UP)
        r->split_ups++;
}

static void run_budget(train_cfg *s, int ranks, uint64_t budget, run_out *r)
{
    memset(r, 0, sizeof *r);
    kern_device_info devs[2];
    fx_devices(devs, ranks, budget);
    r->params = calloc(1 << 20, sizeof(float));
    assert_non_null(r->params);
    for (int i = 0; i < N_STEPS; i++)
        r->loss[i] = NAN;
    train_hooks h = {.steps_cap = N_STEPS, .step_loss = r->loss, .final_params = r->params,
                     .final_params_cap = 1 << 20};
    trainer_opts o = {.spec = s, .devices = devs, .threads_per_device = 1, .checkpoint_keep = 2,
                      .on_event = on_event, .event_ctx = r};
    acc_err err = {0};
    r->status = trainer_run_sync(&o, &h, &err);
    if (r->status != 0)
        fail_msg("run failed: %s", err.msg);
    r->nparams = h.nparams;
    r->final_micro = h.final_micro;
}

static void run(train_cfg *s, int ranks, run_out *r) { run_budget(s, ranks, 0, r); }

static void spec_for(train_cfg *s, int ranks, const char *outdir, int max_steps)
{
    fx_tiny_spec(s, text_path, BATCH, BATCH / (2 * ranks), 2, ranks);
    s->max_steps = max_steps;
    /* the schedule depends on the step (resume must restore it) and on
     * total_steps, the same for the stopped and the full run */
    s->lr.type = SPEC_LR_WARMUP_DECAY;
    s->lr.warmup_steps = 2;
    s->lr.total_steps = N_STEPS;
    s->checkpoint_interval = 100;
    snprintf(s->output_dir, sizeof s->output_dir, "%s", outdir);
}

static void check_resume(int ranks)
{
    char full[300], part[300];
    snprintf(full, sizeof full, "%s/full%d", out_root, ranks);
    snprintf(part, sizeof part, "%s/part%d", out_root, ranks);
    train_cfg s;
    run_out ref, first, second;

    spec_for(&s, ranks, full, N_STEPS);
    run(&s, ranks, &ref);

    /* stop after K steps: the end-of-run checkpoint is ckpt-K */
    spec_for(&s, ranks, part, K_STEPS);
    run(&s, ranks, &first);
    for (int i = 0; i < K_STEPS; i++)
        assert_true(first.loss[i] == ref.loss[i]);

    /* start again to N: resumes at K */
    spec_for(&s, ranks, part, N_STEPS);
    run(&s, ranks, &second);
    assert_non_null(strstr(second.last_log, "ckpt-00000003"));
    for (int i = K_STEPS; i < N_STEPS; i++) {
        double rel = fabs(second.loss[i] - ref.loss[i]) / fabs(ref.loss[i]);
        if (!(rel <= 1e-6))
            fail_msg("%d ranks, step %d: resumed loss %.9g, uninterrupted %.9g", ranks, i,
                     second.loss[i], ref.loss[i]);
    }
    assert_int_equal(second.nparams, ref.nparams);
    double d = fx_rel_diff(ref.params, second.params, ref.nparams);
    if (d > 1e-6)
        fail_msg("%d ranks: final weights differ by %g after resume", ranks, d);
    /* and training did move them after the resume point */
    assert_true(fx_rel_diff(first.params, second.params, ref.nparams) > 1e-5);
    free(ref.params);
    free(first.params);
    free(second.params);
}

static void test_resume_one_rank(void **state) { check_resume(1); }
static void test_resume_two_ranks(void **state) { check_resume(2); }

static void test_resume_from_explicit_path(void **state)
{
    char full[300], from[300];
    snprintf(full, sizeof full, "%s/full1", out_root); /* written by test_resume_one_rank */
    snprintf(from, sizeof from, "%s/explicit", out_root);
    train_cfg s;
    spec_for(&s, 1, from, N_STEPS);
    snprintf(s.resume_from, sizeof s.resume_from, "%s/ckpt-%08d", full, N_STEPS);
    run_out r;
    run(&s, 1, &r);
    assert_non_null(strstr(r.last_log, "resumed from"));
    for (int i = 0; i < N_STEPS; i++) /* nothing left to do: no step ran */
        assert_true(isnan(r.loss[i]));
    free(r.params);
}

static void test_init_from_safetensors(void **state)
{
    char full[300], init[300];
    snprintf(full, sizeof full, "%s/full1/ckpt-%08d/model.safetensors", out_root, N_STEPS);
    snprintf(init, sizeof init, "%s/init", out_root);
    train_cfg s;
    spec_for(&s, 1, init, 0);
    snprintf(s.model.init_from, sizeof s.model.init_from, "%s", full);
    run_out a;
    run(&s, 1, &a);
    /* the weights are the file's: compare with the checkpoint's own load */
    char dir[300];
    snprintf(dir, sizeof dir, "%s/full1", out_root);
    train_cfg s2;
    spec_for(&s2, 1, dir, N_STEPS);
    run_out b;
    run(&s2, 1, &b); /* resumes at N and runs nothing: its weights are the checkpoint's */
    assert_true(fx_rel_diff(b.params, a.params, b.nparams) == 0.0);
    free(a.params);
    free(b.params);
}

/* micro batch "auto": a job planned at m=2 on a small budget, resumed on a
 * device with room, moves up at its next checkpoint boundary (same effective
 * batch, same training to float rounding), never above what fits. */
static void test_auto_moves_up_after_resume(void **state)
{
    char dir[300], ref_dir[300];
    snprintf(dir, sizeof dir, "%s/up", out_root);
    snprintf(ref_dir, sizeof ref_dir, "%s/upref", out_root);
    train_cfg s;
    spec_for(&s, 1, dir, 4);
    s.micro_auto = true;
    s.micro_batch = 0;
    s.accum_steps = 0;
    s.checkpoint_interval = 2;
    s.lr.total_steps = 8;
    uint64_t need2, need4;
    acc_err err = {0};
    assert_int_equal(plan_device_bytes(&s, 2, false, &need2, &err), 0);
    assert_int_equal(plan_device_bytes(&s, 4, false, &need4, &err), 0);
    uint64_t budget = need2 * 100 / (100 - PLAN_MARGIN_PCT) + 4096;
    if (need4 <= plan_usable_bytes(budget))
        fail_msg("fixture: m=4 (%llu bytes) would fit the m=2 budget", (unsigned long long)need4);

    run_out a, b, ref;
    run_budget(&s, 1, budget, &a); /* steps 1-4 at m=2: nothing larger fits */
    assert_int_equal(a.final_micro, 2);
    assert_int_equal(a.split_ups, 0);

    s.max_steps = 8;
    run_budget(&s, 1, 0, &b); /* resumes at 4 with m=2, room now: up at step 6 */
    assert_non_null(strstr(b.last_log, "ckpt-00000004"));
    assert_int_equal(b.split_ups, 1);
    assert_int_equal(b.final_micro, 4);

    train_cfg r;
    spec_for(&r, 1, ref_dir, 8);
    r.lr.total_steps = 8;
    r.checkpoint_interval = 2;
    run(&r, 1, &ref);
    for (int i = 4; i < N_STEPS; i++)
        assert_true(fabs(b.loss[i] - ref.loss[i]) <= 1e-5 * fabs(ref.loss[i]));
    double d = fx_rel_diff(ref.params, b.params, ref.nparams);
    if (d > 1e-5)
        fail_msg("after moving up: weights differ by %g from a fixed-split run", d);
    free(a.params);
    free(b.params);
    free(ref.params);
}

static int setup(void **state)
{
    fx_write_text(text_path, sizeof text_path, 60000);
    snprintf(out_root, sizeof out_root, "/tmp/accumd-resume-XXXXXX");
    return mkdtemp(out_root) ? 0 : -1;
}

static int teardown(void **state)
{
    unlink(text_path);
    return fsu_rm_rf(out_root, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resume_one_rank),
        cmocka_unit_test(test_resume_two_ranks),
        cmocka_unit_test(test_resume_from_explicit_path),
        cmocka_unit_test(test_init_from_safetensors),
        cmocka_unit_test(test_auto_moves_up_after_resume),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
