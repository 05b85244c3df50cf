/* ZeRO stages 1, 2 and 3 through the trainer, on CPU devices:
 *   - stage 1 and 2 over 2, 3 and 4 ranks give bit-identical losses, grad
 *     norms and final weights to stage 0 (gradient clipping active, small
 *     buckets so spans cross the shards), GPT-2 and LLaMA;
 *   - each rank's measured AdamW bytes are its shard's (1/w of stage 0's,
 *     summing to them), its gradient buffer stays whole, and its peak is
 *     the planner's prediction to the byte;
 *   - an out-of-memory on one rank under ZeRO-2 adapts every rank, with
 *     the losses of the same adaptation at stage 0;
 *   - bf16, recomputation, evals and a checkpoint mid-run change nothing;
 *   - with lean activations too (issue 20): bit-identical stages, exact peaks;
 *   - checkpoints hold the whole state: a stage-2 checkpoint at w = 4 is
 *     byte for byte stage 0's, and resumed at w = 2 it continues with the
 *     losses of an uninterrupted w = 2 run (and of stage 0) from it;
 *   - a shutdown checkpoints a ZeRO job too (the ranks stop together);
 *   - stage 3 (model_shard.h): the store alone gives the whole model's loss
 *     and gradients and gathers each block once per pass; through the
 *     trainer at w = 2, 3, 4 it is stage 0 bit for bit at a = 1 without
 *     clipping (GPT-2, LLaMA, lean; bf16, recomputation, evals over uneven
 *     ranks, checkpoints), within 1e-6 otherwise; each rank's peak is the
 *     planner's to the byte and holds no whole-model buffer; its
 *     checkpoints are stage 0's files and resume at w = 4 and w = 1; an
 *     out-of-memory on one rank adapts all.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdatomic.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adamw.h"
#include "engine_fixture.h"
#include "mem_plan.h"
#include "model_shard.h"
#include "trainer_run.h"
#include "zero.h"

#define BATCH 8

static char text_path[64];
static char root[64];

static int setup(void **state)
{
    (void)state;
    return fx_workdir_make(text_path, sizeof text_path, 20000, root, sizeof root, "zero");
}

static int teardown(void **state)
{
    (void)state;
    fx_workdir_remove(text_path, root);
    return 0;
}

/* A spec of the tiny GPT-2 (or LLaMA, or LLaMA LoRA) with clipping that bites. */
static void spec_of(train_cfg *s, const char *arch, int m, int a, int w, int zero)
{
    fx_clipped_spec(s, text_path, arch, m, a, w);
    s->zero_stage = zero;
    s->oom_adapt = true;
}

/* One thread per device, devices of 1 GiB; `bucket_bytes`: 0 for the
 * trainer's default. */
static fx_run_opts opts_of(size_t bucket_bytes, fx_oom_at *in)
{
    return (fx_run_opts){.device_budget = 1ull << 30, .threads = 1, .bucket_bytes = bucket_bytes, .oom = in};
}

static void run(const train_cfg *s, fx_run *r, fx_oom_at *in)
{
    fx_run_opts o = opts_of(8192, in); /* several buckets, spans across the shards */
    fx_train(s, &o, r);
    fx_assert_ran(r, s, "run");
}

/* Rank r's measured bytes: its AdamW moments are those of its shard, as
 * the planner says; the gradient buffer is stage 0's; the peak is the
 * prediction to the byte. */
static void assert_memory(const train_cfg *s, const fx_run *r, const fx_run *r0)
{
    model_config cfg;
    acc_err err = {0};
    assert_int_equal(plan_model_config(s, &cfg, &err), 0);
    size_t n = model_num_trainable(&cfg); /* AdamW's range: every parameter, or LoRA's adapters */
    int w = s->devices;
    uint64_t sum = 0;
    for (int k = 0; k < w; k++) {
        size_t lo = 0, hi = n;
        if (s->zero_stage >= 1)
            adamw_shard(n, k, w, &lo, &hi);
        assert_int_equal(r->h.mem_optim[k], (hi - lo) * 2 * sizeof(float));
        assert_int_equal(r->h.mem_optim[k], plan_optim_bytes(&cfg, s->zero_stage, w, k));
        if (s->zero_stage >= 1) { /* 1/w of stage 0's: floor or ceil */
            uint64_t whole = r0->h.mem_optim[k];
            assert_true(r->h.mem_optim[k] * (uint64_t)w >= whole - (uint64_t)w * 8);
            assert_true(r->h.mem_optim[k] * (uint64_t)w <= whole + (uint64_t)w * 8);
        }
        sum += r->h.mem_optim[k];
        assert_int_equal(r->h.mem_grads[k], r0->h.mem_grads[k]);
        uint64_t want = plan_rank_state_bytes(&cfg, s->zero_stage, w, k) +
                        plan_act_bytes(&cfg, s->micro_batch, s->model.seq_len, 0);
        if (r->h.mem_peak[k] != want)
            print_error("rank %d: peak %llu, predicted %llu\n", k, (unsigned long long)r->h.mem_peak[k],
                        (unsigned long long)want);
        assert_int_equal(r->h.mem_peak[k], want);
        /* and the saving is exactly the moments not held */
        assert_int_equal(r0->h.mem_peak[k] - r->h.mem_peak[k], r0->h.mem_optim[k] - r->h.mem_optim[k]);
    }
    assert_int_equal(sum, s->zero_stage >= 1 ? r0->h.mem_optim[0] : r0->h.mem_optim[0] * (uint64_t)w);
    uint64_t dev0;
    assert_int_equal(plan_device_bytes(s, s->micro_batch, false, &dev0, &err), 0);
    assert_int_equal(r->h.mem_peak[0], dev0); /* the planner's job figure: rank 0, the largest */
}

static void check_stages_lean(const char *arch, int w, int m, int a, bool lean)
{
    train_cfg s;
    fx_run r0, r1, r2;
    spec_of(&s, arch, m, a, w, 0);
    s.lean_activations = lean;
    run(&s, &r0, NULL);
    assert_memory(&s, &r0, &r0);
    spec_of(&s, arch, m, a, w, 1);
    s.lean_activations = lean;
    run(&s, &r1, NULL);
    fx_assert_same_bits(&r0, &r1, 0, s.max_steps);
    assert_memory(&s, &r1, &r0);
    spec_of(&s, arch, m, a, w, 2);
    s.lean_activations = lean;
    run(&s, &r2, NULL);
    fx_assert_same_bits(&r0, &r2, 0, s.max_steps);
    assert_memory(&s, &r2, &r0);
    /* stage 2: still one reduction of the gradients per step (the
     * reduce-scatter), in several buckets */
    assert_int_equal(r2.h.allreduce_calls, r0.h.allreduce_calls);
    assert_int_equal(r2.h.bucket_calls, r0.h.bucket_calls);
    if (strcmp(arch, "llama-lora") != 0) /* the adapters' few floats fit one bucket */
        assert_true(r2.h.bucket_calls > r2.h.allreduce_calls);
    print_message("%s w=%d m=%d a=%d: losses %.6f .. %.6f, stage 1/2 bit-identical; AdamW bytes per rank "
                  "%llu (stage 0) -> %llu\n",
                  arch, w, m, a, r0.loss[0], r0.loss[s.max_steps - 1], (unsigned long long)r0.h.mem_optim[0],
                  (unsigned long long)r2.h.mem_optim[0]);
    free(r0.params);
    free(r1.params);
    free(r2.params);
}

/* max |a - b| over max |a| of n floats (0 when both are 0) */
static double rel_diff_f(const float *a, const float *b, size_t n)
{
    double big = 0, d = 0;
    for (size_t i = 0; i < n; i++) {
        big = fabs((double)a[i]) > big ? fabs((double)a[i]) : big;
        d = fabs((double)a[i] - (double)b[i]) > d ? fabs((double)a[i] - (double)b[i]) : d;
    }
    return big > 0 ? d / big : d;
}

static double rel_diff(double a, double b)
{
    return fabs(a - b) / (fabs(a) > 0 ? fabs(a) : 1.0);
}

/* ZeRO-3's measured bytes: AdamW moments of its partition, gradients of
 * its partition (+ the slots' tail), the peak the planner's to the byte,
 * and below stage 0's. */
static void assert_memory3(const train_cfg *s, const fx_run *r, const fx_run *r0)
{
    model_config cfg;
    acc_err err = {0};
    assert_int_equal(plan_model_config(s, &cfg, &err), 0);
    int w = s->devices;
    uint64_t sum = 0;
    for (int k = 0; k < w; k++) {
        model_shard_sizes z;
        assert_int_equal(model_shard_sizes_of(&cfg, k, w, &z, &err), 0);
        assert_int_equal(r->h.mem_optim[k], z.pn * 2 * sizeof(float));
        assert_int_equal(r->h.mem_optim[k], plan_optim_bytes(&cfg, 3, w, k));
        model_shard_sizes z0; /* the tail sits past rank 0's partition on every rank */
        assert_int_equal(model_shard_sizes_of(&cfg, 0, w, &z0, &err), 0);
        assert_int_equal(r->h.mem_grads[k], (z0.pn + TRAIN_SLOTS) * sizeof(float));
        sum += z.pn;
        uint64_t want = plan_rank_state_bytes(&cfg, 3, w, k) +
                        plan_act_bytes(&cfg, s->micro_batch, s->model.seq_len,
                                       s->activation_checkpointing);
        if (r->h.mem_peak[k] != want)
            print_error("rank %d: peak %llu, predicted %llu\n", k, (unsigned long long)r->h.mem_peak[k],
                        (unsigned long long)want);
        assert_int_equal(r->h.mem_peak[k], want);
        assert_true(r->h.mem_peak[k] < r0->h.mem_peak[k]);
    }
    assert_int_equal(sum, model_num_params(&cfg)); /* the partitions cover the model once */
    uint64_t dev0;
    assert_int_equal(plan_device_bytes(s, s->micro_batch, s->activation_checkpointing, &dev0, &err), 0);
    assert_int_equal(r->h.mem_peak[0], dev0);
}

/* ZeRO-3 against stage 0 on the same split. exact: one micro-step per rank
 * and no clipping, so the same bits: the blocks' reduce-scatter sums in
 * rank order as stage 0's all-reduce does, into a zeroed partition, and
 * AdamW is elementwise; only the norm's partial sums are over other
 * pieces (reported, not used: within 1e-12). Otherwise within 1e-6
 * relative: with a > 1 the ranks' sums are added per micro-step (stage 0
 * adds a rank's micro-steps first), and the clip scale comes from that
 * norm summed in another order. */
static void check_stage3(const char *arch, int w, int m, int a, bool exact, bool lean)
{
    train_cfg s;
    fx_run r0, r3;
    spec_of(&s, arch, m, a, w, 0);
    s.lean_activations = lean;
    if (exact)
        s.optim.grad_clip = 0;
    run(&s, &r0, NULL);
    spec_of(&s, arch, m, a, w, 3);
    s.lean_activations = lean;
    if (exact)
        s.optim.grad_clip = 0;
    run(&s, &r3, NULL);
    double worst = 0;
    for (int k = 0; k < s.max_steps; k++) {
        assert_true(isfinite(r3.loss[k]));
        if (exact)
            assert_memory_equal(&r0.loss[k], &r3.loss[k], sizeof(double));
        worst = rel_diff(r0.loss[k], r3.loss[k]) > worst ? rel_diff(r0.loss[k], r3.loss[k]) : worst;
        assert_true(rel_diff(r0.norm[k], r3.norm[k]) <= (exact ? 1e-12 : 1e-6));
    }
    assert_true(worst <= 1e-6);
    assert_int_equal(r0.h.nparams, r3.h.nparams);
    double pd = rel_diff_f(r0.params, r3.params, r0.h.nparams);
    if (exact)
        assert_memory_equal(r0.params, r3.params, r0.h.nparams * sizeof(float));
    assert_true(pd <= 1e-6);
    assert_memory3(&s, &r3, &r0);
    print_message("%s ZeRO-3 w=%d m=%d a=%d%s: losses %.6f .. %.6f, %s (loss rel %.2g, weights rel %.2g); "
                  "peak per rank %llu (stage 0: %llu)\n",
                  arch, w, m, a, lean ? " lean" : "", r0.loss[0], r0.loss[s.max_steps - 1],
                  exact ? "bit-identical" : "within 1e-6", worst, pd, (unsigned long long)r3.h.mem_peak[0],
                  (unsigned long long)r0.h.mem_peak[0]);
    free(r0.params);
    free(r3.params);
}

/* ZeRO-3 over 2 and 4 ranks: bit-identical to stage 0 at a = 1 without
 * clipping; within 1e-6 with accumulation and clipping; GPT-2's
 * tensor-major layout (a block's tensors apart) and LLaMA's. */
static void test_stage3(void **state)
{
    (void)state;
    check_stage3("gpt2", 2, 4, 1, true, false);
    check_stage3("gpt2", 4, 2, 1, true, false);
    check_stage3("llama", 2, 4, 1, true, false);
    check_stage3("llama", 4, 2, 1, true, true);
    check_stage3("gpt2", 2, 2, 2, false, false);
    check_stage3("llama", 4, 1, 2, false, false);
    check_stage3("gpt2", 3, 1, 2, false, true); /* uneven slices */
}

static void check_stages(const char *arch, int w, int m, int a)
{
    check_stages_lean(arch, w, m, a, false);
}

/* lean activations: the head's gradient is accumulated in
 * the forward; stages 1 and 2 stay bit-identical to 0, peaks exact */
static void test_lean_stages(void **state)
{
    (void)state;
    check_stages_lean("gpt2", 2, 2, 2, true);
    check_stages_lean("llama", 2, 2, 2, true);
}

static void test_gpt2_stages(void **state)
{
    (void)state;
    check_stages("gpt2", 2, 2, 2);
    check_stages("gpt2", 3, 1, 2); /* uneven shards */
}

static void test_gpt2_four(void **state)
{
    (void)state;
    check_stages("gpt2", 4, 1, 2);
}

static void test_llama_stages(void **state)
{
    (void)state;
    check_stages("llama", 2, 2, 2);
    check_stages("llama-lora", 2, 2, 2); /* the shards cut the adapters' range */
    check_stages("llama-lora", 3, 1, 2);
}

/* The same out-of-memory (rank 1, step 1, at m 4) in a w = 2, m = 4, a = 1
 * job at stage 0 (r0) and at stage `zero` (rz): both fire, and stage
 * `zero` adapts every rank once, to m 2 a 2. */
static void run_oom_pair(int zero, train_cfg *s, fx_run *r0, fx_run *rz)
{
    fx_oom_at in0 = {.rank = 1, .step = 1, .m = 4}, inz = in0;
    spec_of(s, "gpt2", 4, 1, 2, 0);
    run(s, r0, &in0);
    spec_of(s, "gpt2", 4, 1, 2, zero);
    run(s, rz, &inz);
    assert_true(in0.fired && inz.fired);
    assert_int_equal(rz->h.oom_adjusts, 1);
    assert_int_equal(rz->h.final_micro, 2); /* rank 0 reports it: it adapted too */
    assert_int_equal(rz->h.final_accum, 2);
}

/* One rank runs out of memory under ZeRO-2: every rank moves to the
 * smaller split, and the run matches stage 0 with the same fault. */
static void test_oom_adapts_all_ranks(void **state)
{
    (void)state;
    train_cfg s;
    fx_run r0, r2;
    run_oom_pair(2, &s, &r0, &r2);
    fx_assert_same_bits(&r0, &r2, 0, s.max_steps);
    free(r0.params);
    free(r2.params);
}

/* The other modes ride along: bf16 operands, activation recomputation,
 * evals (their all-reduce in the slots) and a checkpoint mid-run (the
 * moments gathered through the gradient buffer, which must be zero again
 * for the next step): stage 2 and 1 still give stage 0's bits. */
static void test_modes(void **state)
{
    (void)state;
    train_cfg s;
    fx_run r[3];
    for (int z = 0; z <= 2; z++) {
        spec_of(&s, "gpt2", 2, 2, 2, z);
        s.precision = SPEC_BF16;
        s.activation_checkpointing = true;
        snprintf(s.data.val, sizeof s.data.val, "%s", text_path);
        s.eval_interval = 2;
        s.checkpoint_interval = 2;
        snprintf(s.output_dir, sizeof s.output_dir, "%s/modes%d", root, z);
        fx_run_opts o = opts_of(8192, NULL);
        fx_train(&s, &o, &r[z]);
        assert_int_equal(r[z].status, 0);
        assert_true(r[z].h.final_recompute);
    }
    for (int z = 1; z <= 2; z++) {
        fx_assert_same_bits(&r[0], &r[z], 0, s.max_steps);
        assert_true(isfinite(r[0].val[1]) && isfinite(r[0].val[3]));
        assert_memory_equal(r[0].val, r[z].val, sizeof r[0].val);
    }
    for (int z = 0; z <= 2; z++)
        free(r[z].params);
}

static void resume_spec(train_cfg *s, int w, int zero, const char *from, const char *out, int steps)
{
    spec_of(s, "gpt2", 2, BATCH / (2 * w), w, zero); /* B = 8 at every w */
    s->max_steps = steps;
    snprintf(s->resume_from, sizeof s->resume_from, "%s", from);
    snprintf(s->output_dir, sizeof s->output_dir, "%s/%s", root, out);
}

static void test_checkpoint_across_worlds(void **state)
{
    (void)state;
    train_cfg s;
    fx_run a4, b4, full, part, rest, base;
    char ck[256], ck0[256], f1[320];
    /* a stage-2 checkpoint at w = 4, and stage 0's */
    resume_spec(&s, 4, 2, "", "w4z2", 2);
    run(&s, &a4, NULL);
    resume_spec(&s, 4, 0, "", "w4z0", 2);
    run(&s, &b4, NULL);
    fx_assert_same_bits(&a4, &b4, 0, 2);
    snprintf(ck, sizeof ck, "%s/w4z2/ckpt-00000002", root);
    snprintf(ck0, sizeof ck0, "%s/w4z0/ckpt-00000002", root);
    /* the gathered state is the whole state: the same files */
    fx_assert_same_checkpoint(ck, ck0);
    /* resumed at w = 2, stage 2, uninterrupted to step 6 */
    resume_spec(&s, 2, 2, ck, "full", 6);
    run(&s, &full, NULL);
    /* the same, interrupted by a checkpoint at step 4 */
    resume_spec(&s, 2, 2, ck, "part", 4);
    run(&s, &part, NULL);
    snprintf(f1, sizeof f1, "%s/part/ckpt-00000004", root);
    resume_spec(&s, 2, 2, f1, "rest", 6);
    run(&s, &rest, NULL);
    /* and stage 0 at w = 2 from the same checkpoint */
    resume_spec(&s, 2, 0, ck, "base", 6);
    run(&s, &base, NULL);
    for (int k = 2; k < 4; k++) {
        assert_memory_equal(&full.loss[k], &part.loss[k], sizeof(double));
        assert_true(isnan(rest.loss[k])); /* not run there */
    }
    for (int k = 4; k < 6; k++)
        assert_memory_equal(&full.loss[k], &rest.loss[k], sizeof(double));
    assert_memory_equal(full.params, rest.params, full.h.nparams * sizeof(float));
    fx_assert_same_bits(&full, &base, 2, 6);
    print_message("stage-2 checkpoint at w=4 resumed at w=2: losses %.9f %.9f %.9f %.9f (steps 3-6)\n",
                  full.loss[2], full.loss[3], full.loss[4], full.loss[5]);
    fx_run *all[] = {&a4, &b4, &full, &part, &rest, &base};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        free(all[i]->params);
}

/* Stage 3 against stage 0 at a = 1 without clipping: the losses and the
 * weights bit for bit; the norm (reported only) within 1e-12, its
 * partial sums being over other pieces. */
static void assert_bits_z3(const fx_run *a, const fx_run *b, int from, int to)
{
    for (int k = from; k < to; k++)
        assert_true(rel_diff(a->norm[k], b->norm[k]) <= 1e-12);
    fx_assert_same_losses(a, b, from, to);
}

/* ZeRO-3 with the other modes: bf16 operands, recomputation, evals (every
 * rank runs as many forwards: w = 3 leaves the validation samples uneven)
 * and checkpoints mid-run; at a = 1 without clipping the losses, the
 * validation losses and the weights are stage 0's bits. */
static void test_modes_zero3(void **state)
{
    (void)state;
    for (int w = 2; w <= 3; w++) {
        train_cfg s;
        fx_run r[2];
        for (int i = 0; i < 2; i++) {
            spec_of(&s, "gpt2", 2, 1, w, i == 0 ? 0 : 3);
            s.optim.grad_clip = 0;
            s.precision = SPEC_BF16;
            s.activation_checkpointing = true;
            snprintf(s.data.val, sizeof s.data.val, "%s", text_path);
            s.eval_interval = 2;
            s.eval_batches = 3; /* 3 x B samples: 18 over w = 3 is 6 each, 24 over 2 */
            if (w == 3)
                s.eval_batches = 0; /* the whole set: uneven over 3 ranks */
            s.checkpoint_interval = 2;
            snprintf(s.output_dir, sizeof s.output_dir, "%s/modes3-%d-%d", root, w, i);
            fx_run_opts o = opts_of(0, NULL);
            fx_train(&s, &o, &r[i]);
            if (r[i].status != 0)
                fail_msg("w=%d stage %d: %s", w, i ? 3 : 0, r[i].err.msg);
        }
        assert_bits_z3(&r[0], &r[1], 0, s.max_steps);
        assert_true(isfinite(r[0].val[1]) && isfinite(r[0].val[3]));
        assert_memory_equal(r[0].val, r[1].val, sizeof r[0].val);
        print_message("ZeRO-3 w=%d bf16 + recompute + evals + checkpoints: val loss %.9f at step 4, stage 0's bits\n",
                      w, r[1].val[3]);
        free(r[0].params);
        free(r[1].params);
    }
}

/* One rank runs out of memory under ZeRO-3: the ranks agree before each
 * micro-step (the forward's gathers need them all), every rank moves to
 * the smaller split, and the run matches stage 0 with the same fault
 * within 1e-6 (a = 2 after the adaptation: other fp32 sum order). */
static void test_oom_adapts_zero3(void **state)
{
    (void)state;
    train_cfg s;
    fx_run r0, r3;
    run_oom_pair(3, &s, &r0, &r3);
    for (int k = 0; k < s.max_steps; k++)
        assert_true(rel_diff(r0.loss[k], r3.loss[k]) <= 1e-6);
    assert_true(rel_diff_f(r0.params, r3.params, r0.h.nparams) <= 1e-6);
    free(r0.params);
    free(r3.params);
}

/* The store itself (model_shard.h) on one rank (w = 1: a gather is a
 * copy): GPT-2's tensor-major layout packed per block gives the whole
 * model's loss and gradients bit for bit; each block is gathered once per
 * pass (the forward's L, then the backward's L again, prefetch included);
 * the partition is the whole model here and the weights come back whole. */
static void test_shard_store(void **state)
{
    (void)state;
    train_cfg s;
    acc_err err = {0};
    fx_tiny_spec(&s, text_path, 2, 2, 1, 1);
    model_config cfg;
    assert_int_equal(plan_model_config(&s, &cfg, &err), 0);
    fx_store_pair p;
    fx_store_open(&cfg, 2, s.model.seq_len, false, &p);
    assert_int_equal(p.b->nheld, p.b->nparams);
    (void)fx_assert_store_pass(&p, NULL);
    fx_store_close(&p);
}

/* B = 8 as m = 8 / w, a = 1, no clipping: stage 3 is stage 0's bits. */
static void z3_spec(train_cfg *s, int w, int zero, const char *from, const char *out, int steps)
{
    spec_of(s, "gpt2", BATCH / w, 1, w, zero);
    s->optim.grad_clip = 0;
    s->max_steps = steps;
    s->checkpoint_interval = 2;
    snprintf(s->resume_from, sizeof s->resume_from, "%s", from);
    snprintf(s->output_dir, sizeof s->output_dir, "%s/%s", root, out);
}

/* ZeRO-3 checkpoints are gathered whole: at w = 2 its files are stage
 * 0's byte for byte; resumed at w = 4 (stage 3: the moments scattered into
 * other partitions) and at w = 1 (stage 0) they continue as stage 0's
 * checkpoint does; and a stage-3 run interrupted at step 2 and resumed
 * ends with the uninterrupted run's bits. */
static void test_checkpoint_zero3_worlds(void **state)
{
    (void)state;
    train_cfg s;
    fx_run z3, z0, r4, b4, r1, b1, full;
    char ck3[256], ck0[256];
    z3_spec(&s, 2, 3, "", "z3w2", 2);
    run(&s, &z3, NULL);
    z3_spec(&s, 2, 0, "", "z0w2", 2);
    run(&s, &z0, NULL);
    assert_bits_z3(&z3, &z0, 0, 2);
    snprintf(ck3, sizeof ck3, "%s/z3w2/ckpt-00000002", root);
    snprintf(ck0, sizeof ck0, "%s/z0w2/ckpt-00000002", root);
    fx_assert_same_checkpoint(ck3, ck0);
    z3_spec(&s, 4, 3, ck3, "z3r4", 5);
    run(&s, &r4, NULL);
    z3_spec(&s, 4, 0, ck0, "z0r4", 5);
    run(&s, &b4, NULL);
    assert_bits_z3(&r4, &b4, 2, 5);
    z3_spec(&s, 1, 0, ck3, "z3r1", 5);
    run(&s, &r1, NULL);
    z3_spec(&s, 1, 0, ck0, "z0r1", 5);
    run(&s, &b1, NULL);
    fx_assert_same_bits(&r1, &b1, 2, 5);
    /* invariant 5 within stage 3: 2 steps + resumed = 5 uninterrupted */
    z3_spec(&s, 2, 3, "", "z3full", 5);
    run(&s, &full, NULL);
    fx_run rest;
    z3_spec(&s, 2, 3, ck3, "z3rest", 5);
    run(&s, &rest, NULL);
    fx_assert_same_bits(&full, &rest, 2, 5);
    assert_true(isnan(rest.loss[0]));
    print_message("ZeRO-3 checkpoint at w=2 = stage 0's files; resumed at w=4: %.9f .. %.9f, at w=1: %.9f .. %.9f\n",
                  r4.loss[2], r4.loss[4], r1.loss[2], r1.loss[4]);
    fx_run *all[] = {&z3, &z0, &r4, &b4, &r1, &b1, &full, &rest};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        free(all[i]->params);
}

/* A shutdown (trainer_preempt) of a ZeRO-2 job: the ranks stop together
 * after the step in progress and checkpoint it (the moments gathered), so
 * resuming from it continues with the losses of an uninterrupted run. */
typedef struct stop_watch {
    atomic_int steps, done, status, done_step;
    char msg[512];
} stop_watch;

static void on_stop_event(void *ctx, const train_event *ev)
{
    stop_watch *w = ctx;
    if (ev->kind == TEV_STEP)
        atomic_fetch_add(&w->steps, 1);
    if (ev->kind == TEV_DONE) {
        snprintf(w->msg, sizeof w->msg, "%s", ev->msg);
        atomic_store(&w->status, ev->status);
        atomic_store(&w->done_step, ev->step);
        atomic_store(&w->done, 1);
    }
}

/* Run s on two devices, stop it (preempt: a shutdown; else a cancel) once
 * two steps are done; it ends ACC_ECANCELLED. Returns the steps done. */
static int stop_after_two(train_cfg *s, bool preempt, stop_watch *w)
{
    kern_device_info devs[2];
    fx_devices(devs, 2, 1ull << 30);
    memset(w, 0, sizeof *w);
    trainer_opts o = {.spec = s, .devices = devs, .threads_per_device = 1, .on_event = on_stop_event, .event_ctx = w};
    trainer *t;
    acc_err err = {0};
    assert_int_equal(trainer_start(&o, &t, &err), 0);
    while (atomic_load(&w->steps) < 2 && !atomic_load(&w->done))
        usleep(1000);
    if (preempt)
        trainer_preempt(t);
    else
        trainer_cancel(t);
    trainer_free(t);
    assert_true(atomic_load(&w->done));
    assert_int_equal(atomic_load(&w->status), ACC_ECANCELLED);
    return atomic_load(&w->done_step);
}

static void test_shutdown_checkpoint(void **state)
{
    (void)state;
    train_cfg s;
    spec_of(&s, "gpt2", 2, 2, 2, 2);
    s.max_steps = 200;
    snprintf(s.output_dir, sizeof s.output_dir, "%s/stop", root);
    stop_watch w;
    int k = stop_after_two(&s, true, &w);
    assert_string_equal(w.msg, "stopped for shutdown");
    assert_true(k >= 2 && k < 200 - 2);
    char ck[300];
    snprintf(ck, sizeof ck, "%s/stop/ckpt-%08d", root, k);
    assert_int_equal(access(ck, F_OK), 0);
    /* resumed (stage 0, to show the state is whole) vs never stopped */
    fx_run resumed, ref;
    resume_spec(&s, 2, 0, ck, "stop-resumed", k + 2);
    run(&s, &resumed, NULL);
    spec_of(&s, "gpt2", 2, 2, 2, 0);
    s.max_steps = k + 2;
    run(&s, &ref, NULL);
    fx_assert_same_bits(&ref, &resumed, k, k + 2);
    print_message("shutdown after step %d: checkpointed together, resumed with the uninterrupted losses\n", k);
    free(resumed.params);
    free(ref.params);
}

/* checkpoint_on_cancel under ZeRO 2: a cancel stops
 * the ranks together after the step in progress, gathers the sharded
 * moments for a checkpoint of that step and ends "cancelled"; resumed, it
 * gives the uninterrupted losses. Without it nothing is saved. */
static void test_cancel_checkpoint(void **state)
{
    (void)state;
    for (int keep = 0; keep < 2; keep++) {
        train_cfg s;
        spec_of(&s, "gpt2", 2, 2, 2, 2);
        s.max_steps = 200;
        s.checkpoint_on_cancel = keep;
        snprintf(s.output_dir, sizeof s.output_dir, "%s/cancel%d", root, keep);
        stop_watch w;
        int k = stop_after_two(&s, false, &w);
        assert_string_equal(w.msg, "cancelled");
        char ck[300];
        snprintf(ck, sizeof ck, "%s/cancel%d/ckpt-%08d", root, keep, k);
        if (!keep) {
            assert_int_not_equal(access(ck, F_OK), 0);
            continue;
        }
        assert_true(k >= 2 && k < 200 - 2);
        assert_int_equal(access(ck, F_OK), 0);
        fx_run resumed, ref;
        resume_spec(&s, 2, 0, ck, "cancel-resumed", k + 2);
        run(&s, &resumed, NULL);
        spec_of(&s, "gpt2", 2, 2, 2, 0);
        s.max_steps = k + 2;
        run(&s, &ref, NULL);
        fx_assert_same_bits(&ref, &resumed, k, k + 2);
        print_message("cancelled after step %d: checkpointed together, resumed with the uninterrupted losses\n", k);
        free(resumed.params);
        free(ref.params);
    }
}

/* The stages' table (zero.h): one row per stage, nothing past the last;
 * what a rank keeps is everything at stage 0, else the ranks' ranges are
 * in rank order, disjoint, cover [0, n) and differ in size by at most one
 * (checked here from the ranges alone). */
static void test_table(void **state)
{
    (void)state;
    assert_null(zero_ops_of(-1));
    assert_null(zero_ops_of(ZERO_MAX_STAGE + 1));
    static const size_t ns[] = {0, 1, 7, 1000003};
    for (int stage = 0; stage <= ZERO_MAX_STAGE; stage++) {
        const zero_ops *z = zero_ops_of(stage);
        assert_non_null(z);
        assert_int_equal(z->stage, stage);
        assert_int_equal(z->state_sharded, stage >= 1);
        assert_int_equal(z->grads_sharded, stage >= 2);
        assert_int_equal(z->params_sharded, stage == 3);
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
            for (int w = 1; w <= 5; w++) {
                size_t next = 0, small = (size_t)-1, big = 0;
                for (int r = 0; r < w; r++) {
                    size_t lo, hi;
                    z->keep(ns[i], r, w, &lo, &hi);
                    if (stage == 0 || stage == 3) { /* stage 3: all of its partition */
                        assert_true(lo == 0 && hi == ns[i]);
                        continue;
                    }
                    assert_true(lo == next && hi >= lo);
                    next = hi;
                    small = hi - lo < small ? hi - lo : small;
                    big = hi - lo > big ? hi - lo : big;
                }
                if (stage == 1 || stage == 2)
                    assert_true(next == ns[i] && big - small <= 1);
            }
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_gpt2_stages),
        cmocka_unit_test(test_gpt2_four),
        cmocka_unit_test(test_llama_stages),
        cmocka_unit_test(test_oom_adapts_all_ranks),
        cmocka_unit_test(test_modes),
        cmocka_unit_test(test_checkpoint_across_worlds),
        cmocka_unit_test(test_shutdown_checkpoint),
        cmocka_unit_test(test_cancel_checkpoint),
        cmocka_unit_test(test_lean_stages),
        cmocka_unit_test(test_shard_store),
        cmocka_unit_test(test_stage3),
        cmocka_unit_test(test_checkpoint_zero3_worlds),
        cmocka_unit_test(test_modes_zero3),
        cmocka_unit_test(test_oom_adapts_zero3),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
