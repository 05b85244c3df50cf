/* mem: memory accounting, out-of-memory adaptation and the planner.
 *   - a job over budget at its initial m adapts in its first step and ends
 *     exactly like the same job started at the adapted m (same samples);
 *   - two ranks, only one over budget: both adapt together, no hang
 *     (a watchdog alarm fails the test instead);
 *   - out of memory injected mid-step, after partial gradients: dropped on
 *     every rank, the step redone, the run unchanged;
 *   - m = 1 over budget: recomputation; below even that: a clear failure;
 *   - activation_checkpointing on its own: same math, less memory;
 *   - planner: predicted peak vs measured for 6 configs x 3 m, candidates,
 *     "auto"; peak independent of the accumulation steps.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>

#include "engine_fixture.h"
#include "mem_plan.h"
#include "model_gpt2.h"
#include "trainer_run.h"

#define STEPS 3
#define WATCHDOG_S 120 /* a hang kills the test binary: the suite fails */

static char text_path[64];

static int setup(void **state)
{
    fx_write_text(text_path, sizeof text_path, 20000);
    return 0;
}

static int teardown(void **state)
{
    unlink(text_path);
    return 0;
}

typedef struct ev_rec {
    pthread_mutex_t mu;
    int steps, adjusts, bad_split_steps;
    int want_m, want_a;          /* every TEV_STEP must report this split */
    train_event first_adjust, last_adjust;
    char log[512];
} ev_rec;

static void on_event(void *ctx, const train_event *ev)
{
    ev_rec *r = ctx;
    pthread_mutex_lock(&r->mu);
    if (ev->kind == TEV_STEP) {
        r->steps++;
        if (ev->micro_batch != r->want_m || ev->accum_steps != r->want_a)
            r->bad_split_steps++;
    }
    if (ev->kind == TEV_OOM_ADJUST) {
        if (r->adjusts++ == 0)
            r->first_adjust = *ev;
        r->last_adjust = *ev;
    }
    if (ev->kind == TEV_LOG && r->log[0] == '\0')
        snprintf(r->log, sizeof r->log, "%s", ev->msg);
    pthread_mutex_unlock(&r->mu);
}

typedef struct run_out {
    double loss[STEPS];
    uint64_t *samples;
    float *params;
    train_hooks h;
    ev_rec ev;
    int status;
    acc_err err;
} run_out;

typedef struct inject {
    int rank, step, micro, m; /* fail there, once */
    int fired;
} inject;

/* Gradient bucket size of the runs below (0: the trainer's default). */
static size_t run_bucket_bytes;

static int inject_oom(void *ctx, int rank, int step, int micro, int m)
{
    inject *in = ctx;
    if (in->fired || rank != in->rank || step != in->step || micro != in->micro || m != in->m)
        return 0;
    in->fired = 1;
    return 1;
}

/* Run `s` on CPU devices with the given budgets (one per rank), with an
 * optional injected out-of-memory. */
static void run_job_inject(const train_cfg *s, const uint64_t *budgets, run_out *r, int want_m,
                           int want_a, inject *in)
{
    kern_device_info devs[4];
    fx_devices(devs, s->devices, 0);
    for (int i = 0; i < s->devices; i++)
        devs[i].mem_total = budgets[i];
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->ev.mu, NULL);
    r->ev.want_m = want_m;
    r->ev.want_a = want_a;
    size_t cap = 1 << 20;
    r->params = calloc(cap, sizeof(float));
    r->samples = calloc((size_t)STEPS * (size_t)s->train_batch_size, sizeof *r->samples);
    assert_non_null(r->params);
    assert_non_null(r->samples);
    r->h.steps_cap = STEPS;
    r->h.step_loss = r->loss;
    r->h.step_samples = r->samples;
    r->h.final_params = r->params;
    r->h.final_params_cap = cap;
    r->h.bucket_bytes = run_bucket_bytes;
    if (in != NULL) {
        r->h.inject_oom = inject_oom;
        r->h.oom_ctx = in;
    }
    trainer_opts o = {.spec = s, .devices = devs, .threads_per_device = 1,
                      .on_event = on_event, .event_ctx = &r->ev};
    alarm(WATCHDOG_S);
    r->status = trainer_run_sync(&o, &r->h, &r->err);
    alarm(0);
    pthread_mutex_destroy(&r->ev.mu);
}

static void run_job(const train_cfg *s, const uint64_t *budgets, run_out *r, int want_m,
                    int want_a)
{
    run_job_inject(s, budgets, r, want_m, want_a, NULL);
}

static void run_free(run_out *r)
{
    free(r->params);
    free(r->samples);
}

static void assert_ok(const run_out *r, const train_cfg *s)
{
    if (r->status != 0)
        print_error("run failed: %s\n", r->err.msg);
    assert_int_equal(r->status, 0);
    assert_int_equal(r->h.steps_done, s->max_steps);
}

/* Same losses, same final weights (1e-5 relative), same samples per slot,
 * and no sample twice within a step. */
static void assert_same_run(const run_out *a, const run_out *b, int B)
{
    for (int k = 0; k < STEPS; k++) {
        double rel = fabs(a->loss[k] - b->loss[k]) / fabs(b->loss[k]);
        print_message("step %d: loss %.9f vs %.9f (rel %.2g)\n", k, a->loss[k], b->loss[k], rel);
        assert_true(rel <= 1e-5);
    }
    assert_int_equal(a->h.nparams, b->h.nparams);
    double rel = fx_rel_diff(b->params, a->params, a->h.nparams);
    print_message("final weights: relative difference %.3g\n", rel);
    assert_true(rel <= 1e-5);
    assert_memory_equal(a->samples, b->samples, (size_t)STEPS * B * sizeof *a->samples);
    for (int k = 0; k < STEPS; k++)
        for (int i = 0; i < B; i++)
            for (int j = 0; j < i; j++)
                assert_true(a->samples[k * B + i] != a->samples[k * B + j]);
}

static model_config config_of(const train_cfg *s)
{
    model_config cfg;
    acc_err err = {0};
    assert_int_equal(plan_model_config(s, &cfg, &err), 0);
    return cfg;
}

/* A budget that holds the state and m x T activations (+ a little), not more. */
static uint64_t budget_for(const train_cfg *s, int m, int recompute)
{
    model_config cfg = config_of(s);
    return plan_peak_bytes(&cfg, m, s->model.seq_len, recompute) + 256;
}

static void test_oom_adapts_in_first_step(void **state)
{
    enum { B = 8 };
    train_cfg s, ref;
    fx_tiny_spec(&s, text_path, B, 8, 1, 1);
    s.max_steps = STEPS;
    s.oom_adapt = true;
    ref = s;
    ref.micro_batch = 2;
    ref.accum_steps = 4;
    /* room for m = 2, not for 4 or 8: two adjustments, 8 -> 4 -> 2 */
    uint64_t budget = budget_for(&s, 2, 0);
    uint64_t big = 1ull << 30;
    run_out r, want;
    run_job(&s, &budget, &r, 2, 4);
    assert_ok(&r, &s);
    run_job(&ref, &big, &want, 2, 4);
    assert_ok(&want, &ref);
    assert_int_equal(r.h.final_micro, 2);
    assert_int_equal(r.h.final_accum, 4);
    assert_int_equal(r.h.oom_adjusts, 2);
    assert_int_equal(r.ev.adjusts, 2);
    const train_event *e = &r.ev.first_adjust;
    assert_int_equal(e->step, 0);
    assert_int_equal(e->from_micro, 8);
    assert_int_equal(e->from_accum, 1);
    assert_int_equal(e->to_micro, 4);
    assert_int_equal(e->to_accum, 2);
    assert_false(e->recompute);
    model_config cfg = config_of(&s);
    assert_int_equal(e->bytes_asked, plan_act_bytes(&cfg, 8, s.model.seq_len, 0));
    assert_int_equal(e->bytes_free, budget - plan_state_bytes(&cfg));
    assert_int_equal(r.ev.last_adjust.to_micro, 2);
    print_message("%s\n", r.ev.last_adjust.msg);
    /* every step reports the adapted split */
    assert_int_equal(r.ev.steps, STEPS);
    assert_int_equal(r.ev.bad_split_steps, 0);
    assert_same_run(&r, &want, B);
    run_free(&r);
    run_free(&want);
}

static void test_oom_one_rank_of_two(void **state)
{
    enum { B = 16 };
    train_cfg s, ref;
    fx_tiny_spec(&s, text_path, B, 4, 2, 2);
    s.max_steps = STEPS;
    s.oom_adapt = true;
    ref = s;
    ref.micro_batch = 2;
    ref.accum_steps = 4;
    /* rank 0 fits m = 4 and accumulates two micro-steps of gradients
     * before it learns that rank 1 did not fit: those must be dropped */
    uint64_t budgets[2] = {1ull << 30, budget_for(&s, 2, 0)};
    uint64_t big[2] = {1ull << 30, 1ull << 30};
    run_out r, want;
    run_job(&s, budgets, &r, 2, 4);
    assert_ok(&r, &s);
    run_job(&ref, big, &want, 2, 4);
    assert_ok(&want, &ref);
    assert_int_equal(r.h.oom_adjusts, 1);
    assert_int_equal(r.h.final_micro, 2);
    assert_int_equal(r.ev.first_adjust.from_micro, 4);
    assert_int_equal(r.ev.first_adjust.to_accum, 4);
    assert_int_equal(r.ev.bad_split_steps, 0);
    assert_same_run(&r, &want, B);
    /* rank 0 held m = 4 activations before it adapted; rank 1 never did */
    assert_true(r.h.mem_peak[0] > r.h.mem_peak[1]);
    assert_true(r.h.mem_peak[1] <= budgets[1]);
    /* one all-reduce per attempt: 3 steps + the failed attempt */
    assert_int_equal(r.h.allreduce_calls, STEPS + 1);
    run_free(&r);
    run_free(&want);
}

/* Out of memory in the middle of a step (as a GPU allocation inside the
 * backward would), after micro-steps already added gradients: the rank's
 * own partial gradients and the other rank's are dropped, the step is
 * redone at m = 2 and the run matches one at m = 4 throughout. */
static void test_oom_mid_step(void **state)
{
    enum { B = 16 };
    /* pass 3: w = 2 again, 4 blocks, one bucket per block, so the rank that
     * fits has started buckets in its last backward before the one that
     * ran out joins with all of its buckets at once */
    for (int pass = 1; pass <= 3; pass++) {
        int w = pass == 3 ? 2 : pass;
        train_cfg s;
        fx_tiny_spec(&s, text_path, B, 4, B / (4 * w), w);
        s.max_steps = STEPS;
        s.oom_adapt = true;
        if (pass == 3)
            s.model.n_layer = 4;
        uint64_t big[2] = {1ull << 30, 1ull << 30};
        inject in = {.rank = w - 1, .step = 1, .micro = B / (4 * w) - 1, .m = 4};
        run_out r, want;
        run_bucket_bytes = pass == 3 ? 1 : 0;
        run_job_inject(&s, big, &r, -1, -1, &in);
        run_bucket_bytes = 0;
        assert_ok(&r, &s);
        run_job(&s, big, &want, 4, B / (4 * w));
        assert_ok(&want, &s);
        assert_int_equal(in.fired, 1);
        assert_int_equal(r.h.oom_adjusts, 1);
        assert_int_equal(r.ev.first_adjust.step, 1);
        assert_int_equal(r.h.final_micro, 2);
        assert_int_equal(r.h.final_accum, B / (2 * w));
        assert_same_run(&r, &want, B);
        /* one reduction per attempt; buckets: 4 per attempt when cut */
        assert_int_equal(r.h.allreduce_calls, STEPS + 1);
        assert_int_equal(r.h.bucket_calls, pass == 3 ? 4 * (STEPS + 1) : STEPS + 1);
        run_free(&r);
        run_free(&want);
    }
}

static void test_oom_at_m1_recomputes(void **state)
{
    enum { B = 4 };
    train_cfg s, ref;
    fx_tiny_spec(&s, text_path, B, 1, 4, 1);
    s.max_steps = STEPS;
    s.oom_adapt = true;
    ref = s;
    uint64_t budget = budget_for(&s, 1, 1); /* recompute fits, stored does not */
    model_config cfg = config_of(&s);
    assert_true(budget < plan_peak_bytes(&cfg, 1, s.model.seq_len, 0));
    uint64_t big = 1ull << 30;
    run_out r, want;
    run_job(&s, &budget, &r, 1, 4);
    assert_ok(&r, &s);
    run_job(&ref, &big, &want, 1, 4);
    assert_ok(&want, &ref);
    assert_int_equal(r.h.oom_adjusts, 1);
    assert_true(r.h.final_recompute);
    assert_true(r.ev.first_adjust.recompute);
    assert_int_equal(r.ev.first_adjust.to_micro, 1);
    assert_true(r.h.mem_peak[0] <= budget);
    /* recomputation changes no bits of the math */
    assert_same_run(&r, &want, B);
    run_free(&r);
    run_free(&want);
}

static void test_oom_fails_with_numbers(void **state)
{
    train_cfg s;
    fx_tiny_spec(&s, text_path, 4, 2, 2, 1);
    s.max_steps = STEPS;
    s.oom_adapt = true;
    model_config cfg = config_of(&s);
    uint64_t need = plan_peak_bytes(&cfg, 1, s.model.seq_len, 1);
    uint64_t budget = need - 1000;
    run_out r;
    run_job(&s, &budget, &r, 1, 4);
    print_message("%s\n", r.err.msg);
    assert_int_equal(r.status, ACC_EOOM);
    assert_int_equal(r.h.steps_done, 0);
    assert_int_equal(r.h.oom_adjusts, 2); /* 2 -> 1, then recomputation */
    char num[32];
    snprintf(num, sizeof num, "%" PRIu64 " bytes", need);
    assert_non_null(strstr(r.err.msg, num));
    snprintf(num, sizeof num, "budget of %" PRIu64 " bytes", budget);
    assert_non_null(strstr(r.err.msg, num));
    assert_non_null(strstr(r.err.msg, "out of memory"));
    run_free(&r);

    /* oom.adapt off: the first out-of-memory is the end, with the numbers */
    s.oom_adapt = false;
    budget = budget_for(&s, 1, 0);
    run_job(&s, &budget, &r, 2, 2);
    print_message("%s\n", r.err.msg);
    assert_int_equal(r.status, ACC_EOOM);
    assert_int_equal(r.h.oom_adjusts, 0);
    assert_non_null(strstr(r.err.msg, "oom.adapt is off"));
    snprintf(num, sizeof num, "%" PRIu64 " bytes",
             plan_peak_bytes(&cfg, 2, s.model.seq_len, 0));
    assert_non_null(strstr(r.err.msg, num));
    run_free(&r);

    /* the weights themselves do not fit: no split helps */
    s.oom_adapt = true;
    budget = plan_state_bytes(&cfg) - 1;
    run_job(&s, &budget, &r, 2, 2);
    print_message("%s\n", r.err.msg);
    assert_int_equal(r.status, ACC_EOOM);
    snprintf(num, sizeof num, "%" PRIu64 " bytes", plan_state_bytes(&cfg));
    assert_non_null(strstr(r.err.msg, num));
    run_free(&r);
}

static void test_activation_checkpointing(void **state)
{
    enum { B = 8 };
    train_cfg s, rc;
    fx_tiny_spec(&s, text_path, B, 4, 2, 1);
    s.model.n_layer = 4;
    s.max_steps = STEPS;
    rc = s;
    rc.activation_checkpointing = true;
    uint64_t big = 1ull << 30;
    run_out stored, recomp;
    run_job(&s, &big, &stored, 4, 2);
    assert_ok(&stored, &s);
    run_job(&rc, &big, &recomp, 4, 2);
    assert_ok(&recomp, &rc);
    assert_same_run(&recomp, &stored, B);
    model_config cfg = config_of(&s);
    uint64_t state_b = plan_state_bytes(&cfg);
    double act_s = (double)(stored.h.mem_peak[0] - state_b);
    double act_r = (double)(recomp.h.mem_peak[0] - state_b);
    print_message("n_layer 4, m 4, T 16: activations %.0f KiB stored, %.0f KiB recomputed "
                  "(%.0f%% saved); peak %.0f -> %.0f KiB\n",
                  act_s / 1024, act_r / 1024, 100.0 * (1 - act_r / act_s),
                  (double)stored.h.mem_peak[0] / 1024, (double)recomp.h.mem_peak[0] / 1024);
    assert_true(act_r < 0.6 * act_s);
    uint64_t pred = 0;
    acc_err err = {0};
    assert_int_equal(trainer_device_bytes(&rc, &pred, &err), 0);
    assert_true(pred == recomp.h.mem_peak[0]);
    run_free(&stored);
    run_free(&recomp);
}

typedef struct plan_cfg {
    int L, NH, C, T, V, w;
    bool recompute;
} plan_cfg;

static void test_planner_accuracy(void **state)
{
    static const plan_cfg cfgs[] = {
        {2, 2, 32, 16, 256, 1, false}, {1, 1, 16, 8, 256, 1, false},
        {3, 4, 64, 32, 256, 1, false}, {2, 2, 32, 16, 256, 2, false},
        {4, 2, 32, 32, 256, 1, true},  {2, 4, 48, 24, 300, 1, true},
    };
    static const int ms[] = {1, 2, 4};
    print_message("%-28s %3s %12s %12s %8s\n", "config (L/NH/C/T/V, w, mode)", "m",
                  "predicted", "measured", "error");
    double worst = 0;
    for (size_t c = 0; c < sizeof cfgs / sizeof *cfgs; c++) {
        const plan_cfg *p = &cfgs[c];
        for (size_t i = 0; i < sizeof ms / sizeof *ms; i++) {
            train_cfg s;
            fx_tiny_spec(&s, text_path, ms[i] * p->w, ms[i], 1, p->w);
            s.model.n_layer = p->L;
            s.model.n_head = p->NH;
            s.model.n_embd = p->C;
            s.model.seq_len = p->T;
            s.model.vocab_size = 256;
            s.model.padded_vocab_size = p->V;
            s.activation_checkpointing = p->recompute;
            s.max_steps = 1;
            uint64_t pred = 0;
            acc_err err = {0};
            assert_int_equal(plan_device_bytes(&s, ms[i], p->recompute, &pred, &err), 0);
            uint64_t big[2] = {1ull << 30, 1ull << 30};
            run_out r;
            run_job(&s, big, &r, ms[i], 1);
            assert_ok(&r, &s);
            double meas = (double)r.h.mem_peak[0];
            double e = fabs((double)pred - meas) / meas;
            worst = e > worst ? e : worst;
            char name[64];
            snprintf(name, sizeof name, "%d/%d/%d/%d/%d, w%d, %s", p->L, p->NH, p->C, p->T, p->V,
                     p->w, p->recompute ? "recompute" : "stored");
            print_message("%-28s %3d %12" PRIu64 " %12.0f %7.3f%%\n", name, ms[i], pred, meas,
                          100 * e);
            assert_true(e <= 0.05);
            run_free(&r);
        }
    }
    print_message("worst error %.3f%%\n", 100 * worst);
}

static void test_planner_candidates(void **state)
{
    train_cfg s;
    fx_tiny_spec(&s, text_path, 16, 1, 8, 2); /* B/w = 8: m in 1, 2, 4, 8 */
    s.oom_adapt = true;
    model_config cfg = config_of(&s);
    int T = s.model.seq_len;
    uint64_t peak4 = plan_peak_bytes(&cfg, 4, T, 0);
    plan_row rows[PLAN_MAX_ROWS];
    int n = 0, chosen = -1;
    acc_err err = {0};
    /* m = 4 fits with the 5% margin, m = 8 does not */
    uint64_t budget = peak4 * 100 / 95 + 100;
    assert_true(plan_peak_bytes(&cfg, 8, T, 0) > plan_usable_bytes(budget));
    assert_int_equal(plan_candidates(&s, budget, rows, PLAN_MAX_ROWS, &n, &chosen, &err), 0);
    assert_int_equal(n, 5);
    static const int want_m[] = {1, 2, 4, 8, 1};
    for (int i = 0; i < n; i++) {
        assert_int_equal(rows[i].micro_batch, want_m[i]);
        assert_int_equal(rows[i].micro_batch * rows[i].accum_steps * 2, 16);
        assert_int_equal(rows[i].peak_bytes, rows[i].state_bytes + rows[i].act_bytes);
        print_message("m %d a %d%s: %" PRIu64 " bytes, %s\n", rows[i].micro_batch,
                      rows[i].accum_steps, rows[i].recompute ? " (recompute)" : "",
                      rows[i].peak_bytes, rows[i].fits ? "fits" : "does not fit");
    }
    assert_true(rows[4].recompute);
    assert_true(rows[4].peak_bytes < rows[0].peak_bytes);
    assert_int_equal(rows[chosen].micro_batch, 4);
    /* exactly the peak is not enough: the margin */
    assert_int_equal(plan_candidates(&s, peak4, rows, PLAN_MAX_ROWS, &n, &chosen, &err), 0);
    assert_int_equal(rows[chosen].micro_batch, 2);
    /* only recomputation fits */
    budget = plan_peak_bytes(&cfg, 1, T, 1) * 100 / 95 + 100;
    assert_int_equal(plan_candidates(&s, budget, rows, PLAN_MAX_ROWS, &n, &chosen, &err), 0);
    assert_int_equal(chosen, 4);
    assert_true(rows[chosen].recompute);
    /* nothing fits */
    assert_int_equal(plan_candidates(&s, 1000, rows, PLAN_MAX_ROWS, &n, &chosen, &err), 0);
    assert_int_equal(chosen, -1);
    /* unlimited: the largest */
    assert_int_equal(plan_candidates(&s, 0, rows, PLAN_MAX_ROWS, &n, &chosen, &err), 0);
    assert_int_equal(rows[chosen].micro_batch, 8);
    /* B not a multiple of w */
    s.train_batch_size = 15;
    assert_int_equal(plan_candidates(&s, 0, rows, PLAN_MAX_ROWS, &n, &chosen, &err), ACC_EINVAL);
    assert_int_equal(plan_next_smaller_micro(12, 12), 6);
    assert_int_equal(plan_next_smaller_micro(12, 4), 3);
    assert_int_equal(plan_next_smaller_micro(7, 7), 1);
    assert_int_equal(plan_next_smaller_micro(7, 1), 0);
}

static void test_micro_auto(void **state)
{
    train_cfg s;
    fx_tiny_spec(&s, text_path, 16, 0, 0, 2);
    s.micro_auto = true;
    s.oom_adapt = true;
    s.max_steps = 2;
    acc_err err = {0};
    assert_int_equal(trainer_check_spec(&s, &err), 0);
    model_config cfg = config_of(&s);
    uint64_t b = plan_peak_bytes(&cfg, 4, s.model.seq_len, 0) * 100 / 95 + 100;
    uint64_t budgets[2] = {1ull << 30, b}; /* the smallest budget decides */
    run_out r;
    run_job(&s, budgets, &r, 4, 2);
    assert_ok(&r, &s);
    print_message("%s\n", r.ev.log);
    assert_int_equal(r.h.final_micro, 4);
    assert_int_equal(r.h.final_accum, 2);
    assert_int_equal(r.h.oom_adjusts, 0);
    assert_int_equal(r.ev.bad_split_steps, 0);
    assert_non_null(strstr(r.ev.log, "\"auto\""));
    run_free(&r);
}

/* Invariant 2 (docs/invariants.md): the peak depends on m, not on a (stored and recompute). */
static void test_peak_flat_in_accum(void **state)
{
    for (int rec = 0; rec < 2; rec++) {
        train_cfg s1, s32;
        fx_tiny_spec(&s1, text_path, 2, 2, 1, 1);
        fx_tiny_spec(&s32, text_path, 64, 2, 32, 1);
        s1.max_steps = s32.max_steps = 1;
        s1.activation_checkpointing = s32.activation_checkpointing = rec;
        uint64_t big = 1ull << 30;
        run_out r1, r32;
        run_job(&s1, &big, &r1, 2, 1);
        assert_ok(&r1, &s1);
        run_job(&s32, &big, &r32, 2, 32);
        assert_ok(&r32, &s32);
        double p1 = (double)r1.h.mem_peak[0], p32 = (double)r32.h.mem_peak[0];
        print_message("%s: peak a=1 %.0f, a=32 %.0f bytes\n", rec ? "recompute" : "stored", p1,
                      p32);
        assert_true(p1 > 0);
        assert_true(fabs(p32 - p1) / p1 <= 0.02);
        run_free(&r1);
        run_free(&r32);
    }
}

/* bf16 on CPU devices: the rounding scratch is outside the budget, so the
 * planner's prediction is still the measured peak to the byte, in stored
 * and recompute modes, and the OOM adaptation works as in fp32. On CUDA
 * devices bf16 adds no operand buffers: a CUDA row's accounted peak is
 * that same measured peak, below the fp32 row's. */
static void test_planner_bf16(void **state)
{
    for (int rec = 0; rec < 2; rec++) {
        train_cfg s;
        fx_tiny_spec(&s, text_path, 4, 2, 1, 2);
        s.max_steps = 2;
        s.activation_checkpointing = rec;
        s.precision = SPEC_BF16;
        uint64_t pred = 0;
        acc_err err = {0};
        assert_int_equal(plan_device_bytes(&s, 2, rec, &pred, &err), 0);
        uint64_t big[2] = {1ull << 30, 1ull << 30};
        run_out r;
        run_job(&s, big, &r, 2, 1);
        assert_ok(&r, &s);
        print_message("bf16 %s: predicted %" PRIu64 ", measured %" PRIu64 " %" PRIu64 "\n",
                      rec ? "recompute" : "stored", pred, r.h.mem_peak[0], r.h.mem_peak[1]);
        assert_true(r.h.mem_peak[0] == pred && r.h.mem_peak[1] == pred);
        /* the same spec planned for CUDA devices, in bf16 and in fp32 */
        plan_row rows[2][16];
        int n[2], chosen;
        for (int p = 0; p < 2; p++) {
            train_cfg c = s;
            c.precision = p ? SPEC_FP32 : SPEC_BF16;
            assert_int_equal(plan_candidates_on(&c, KERN_DEV_CUDA, 0, rows[p], 16, &n[p], &chosen, &err), 0);
        }
        int found = 0;
        for (int i = 0; i < n[0]; i++)
            if (rows[0][i].micro_batch == 2 && rows[0][i].recompute == (rec != 0)) {
                assert_true(rows[0][i].peak_bytes == r.h.mem_peak[0]);
                assert_true(rows[0][i].peak_bytes < rows[1][i].peak_bytes);
                found++;
            }
        assert_int_equal(found, 1);
        run_free(&r);
    }
    /* out of memory at m = 4 in bf16: down to 2, same losses as m = 2 */
    train_cfg s, ref;
    fx_tiny_spec(&s, text_path, 4, 4, 1, 1);
    s.max_steps = STEPS;
    s.oom_adapt = true;
    s.precision = SPEC_BF16;
    ref = s;
    ref.micro_batch = 2;
    ref.accum_steps = 2;
    uint64_t budget = budget_for(&s, 2, 0), big = 1ull << 30;
    run_out r, want;
    run_job(&s, &budget, &r, 2, 2);
    assert_ok(&r, &s);
    run_job(&ref, &big, &want, 2, 2);
    assert_ok(&want, &ref);
    assert_int_equal(r.h.final_micro, 2);
    assert_int_equal(r.h.oom_adjusts, 1);
    for (int k = 0; k < STEPS; k++)
        assert_true(fabs(r.loss[k] - want.loss[k]) <= 1e-5 * fabs(want.loss[k]));
    run_free(&r);
    run_free(&want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_oom_adapts_in_first_step),
        cmocka_unit_test(test_oom_one_rank_of_two),
        cmocka_unit_test(test_oom_mid_step),
        cmocka_unit_test(test_oom_at_m1_recomputes),
        cmocka_unit_test(test_oom_fails_with_numbers),
        cmocka_unit_test(test_activation_checkpointing),
        cmocka_unit_test(test_planner_accuracy),
        cmocka_unit_test(test_planner_candidates),
        cmocka_unit_test(test_micro_auto),
        cmocka_unit_test(test_peak_flat_in_accum),
        cmocka_unit_test(test_planner_bf16),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
