/* Optimizer offload (zero_optimization.offload_optimizer "cpu") through the
 * trainer, on CPU devices:
 *   - offloaded and not, the per-step losses, grad norms and final weights
 *     are the same bits (memcmp), at ZeRO stages 0, 1, 2, 3 over 1 and 2
 *     ranks (and stage 3 over 4), GPT-2 and LLaMA (and LLaMA LoRA at stage
 *     2), the host AdamW on several threads;
 *   - the device peak is the planner's prediction to the byte and lower by
 *     exactly the moments; each rank's host bytes and the job's host_mem
 *     peak are the planner's host.optimizer to the byte;
 *   - a LLaMA-shaped job whose stage-0 state exceeds its device budget fails
 *     without offload and runs to the end with it on the same budget; on
 *     four devices whose budget neither stage 0 nor its offload fits,
 *     ZeRO-3 + offload runs it to the end (stage 0's losses within 1e-6);
 *   - a host budget one byte short fails with ACC_ENOMEM naming host memory;
 *   - checkpoints: written with offload (stage 2, the moments gathered from
 *     the host copies) they are byte for byte those written without, and
 *     resumed either way they continue with the uninterrupted losses;
 *   - pin_memory: the two buffers that cross the bus are registered with
 *     the device and unregistered at free, a refusal is an error naming
 *     the key with nothing left registered or allocated (a device whose
 *     host_register is a test double); on CPU devices (no such op) a
 *     pinned job runs bit-identical;
 *   - bf16, recomputation, evals, a checkpoint mid-run and an injected
 *     out-of-memory on one rank under ZeRO 2 change nothing of that.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adamw.h"
#include "engine_fixture.h"
#include "host_mem.h"
#include "kern_device.h"
#include "mem_plan.h"
#include "trainer_run.h"

static char text_path[64];
static char root[64];

static int setup(void **state)
{
    (void)state;
    return fx_workdir_make(text_path, sizeof text_path, 20000, root, sizeof root, "offload");
}

static int teardown(void **state)
{
    (void)state;
    fx_workdir_remove(text_path, root);
    return 0;
}

/* every step clips: the scale reaches the host AdamW */
static void spec_of(train_cfg *s, const char *arch, int w, int zero, bool offload)
{
    fx_clipped_spec(s, text_path, arch, 2, 2, w);
    s->zero_stage = zero;
    s->offload_optimizer = offload;
}

/* Runs s on CPU devices of `budget` bytes with `host` bytes for the
 * offloaded state (0: unlimited) and an out-of-memory to inject (or NULL);
 * the status and message are kept (no assertion on them). */
static void run_budget(const train_cfg *s, uint64_t budget, uint64_t host, fx_oom_at *in, fx_run *r)
{
    fx_run_opts o = {.device_budget = budget, .host_budget = host,
                     .threads = 3,          /* the host AdamW's chunks: uneven, 4-aligned */
                     .bucket_bytes = 8192,  /* several buckets, spans across the shards */
                     .oom = in};
    fx_train(s, &o, r);
}

static void run_in(const train_cfg *s, fx_run *r, fx_oom_at *in)
{
    run_budget(s, 1ull << 30, 0, in, r);
    fx_assert_ran(r, s, "run");
}

static void run(const train_cfg *s, fx_run *r)
{
    run_in(s, r, NULL);
}

/* The offloaded run's memory: device peak = prediction, lower than the
 * run without by exactly its moments (at stage 3 and its gradient
 * partition: model_config.grads_host); host bytes = host.optimizer (+
 * host.params: stage 3's gradient partition and staging). */
static void assert_memory(const train_cfg *s, const fx_run *off, const fx_run *on)
{
    model_config cfg;
    acc_err err = {0};
    assert_int_equal(plan_model_config(s, &cfg, &err), 0);
    int w = s->devices;
    bool z3 = s->zero_stage >= 3;
    assert_true(cfg.grads_host == z3);
    model_shard_sizes z0 = {0};
    if (z3) /* rank 0's partition: where the device's gradient buffer put the tail on every rank */
        assert_int_equal(model_shard_sizes_of(&cfg, 0, w, &z0, &err), 0);
    uint64_t host_sum = 0;
    for (int k = 0; k < w; k++) {
        assert_int_equal(off->h.mem_optim[k], 0); /* no moments on the device */
        uint64_t want = plan_rank_device_state_bytes_op(&cfg, s->zero_stage, true, false, w, k) +
                        plan_act_bytes(&cfg, s->micro_batch, s->model.seq_len, 0);
        if (off->h.mem_peak[k] != want)
            print_error("rank %d: peak %llu, predicted %llu\n", k, (unsigned long long)off->h.mem_peak[k],
                        (unsigned long long)want);
        assert_int_equal(off->h.mem_peak[k], want);
        /* the gradient partition in host memory: its bytes below the device-gradient state */
        assert_int_equal(plan_rank_device_state_bytes(&cfg, s->zero_stage, true, w, k) - (want -
                         plan_act_bytes(&cfg, s->micro_batch, s->model.seq_len, 0)), 4 * (uint64_t)z0.pn);
        assert_true(on->h.mem_optim[k] > 0);
        assert_int_equal(on->h.mem_peak[k] - off->h.mem_peak[k], on->h.mem_optim[k] + 4 * (uint64_t)z0.pn);
        /* host: the moments (the device's bytes of them), master and
         * gradients' copy; at stage 3 that copy is the gradient partition,
         * counted with the staging of one slice as host.params */
        uint64_t host = plan_host_optim_bytes_op(&cfg, s->zero_stage, true, false, w, k);
        uint64_t hparams = plan_host_params_bytes(&cfg, s->zero_stage, false, w, k);
        assert_int_equal(off->h.host_optim[k], host);
        if (z3) {
            model_shard_sizes zk;
            assert_int_equal(model_shard_sizes_of(&cfg, k, w, &zk, &err), 0);
            assert_int_equal(2 * host, 3 * on->h.mem_optim[k]);
            assert_int_equal(hparams, 4 * ((uint64_t)zk.pn + zk.slice));
        } else {
            assert_int_equal(host, 2 * on->h.mem_optim[k]);
            assert_int_equal(hparams, 0);
        }
        host_sum += host + hparams;
    }
    assert_int_equal(off->h.host_peak, host_sum);
    assert_int_equal(on->h.host_peak, 0);
    uint64_t job_host, dev0;
    assert_int_equal(plan_host_bytes(s, &job_host, &err), 0);
    assert_int_equal(job_host, off->h.host_peak);
    assert_int_equal(plan_device_bytes(s, s->micro_batch, false, &dev0, &err), 0);
    assert_int_equal(dev0, off->h.mem_peak[0]); /* the planner's job figure */
    /* the planner's rows say the same */
    plan_row rows[PLAN_MAX_ROWS];
    int n, chosen;
    assert_int_equal(plan_candidates(s, 0, rows, PLAN_MAX_ROWS, &n, &chosen, &err), 0);
    for (int i = 0; i < n; i++)
        if (rows[i].micro_batch == s->micro_batch && !rows[i].recompute) {
            assert_int_equal(rows[i].peak_bytes, dev0);
            assert_int_equal(rows[i].parts.optimizer, 0);
            assert_int_equal(rows[i].optim_bytes, 0);
            assert_int_equal(rows[i].host.optimizer, plan_host_optim_bytes_op(&cfg, s->zero_stage, true, false, w, 0));
            assert_int_equal(rows[i].host.params, plan_host_params_bytes(&cfg, s->zero_stage, false, w, 0));
            assert_int_equal(rows[i].host_bytes, rows[i].host.batch + rows[i].host.optimizer +
                                                     rows[i].host.params + rows[i].host.activations);
        }
}

static void check(const char *arch, int w, int zero)
{
    train_cfg s;
    fx_run on, off;
    spec_of(&s, arch, w, zero, false);
    run(&s, &on);
    spec_of(&s, arch, w, zero, true);
    run(&s, &off);
    fx_assert_same_bits(&on, &off, 0, s.max_steps);
    assert_memory(&s, &off, &on);
    print_message("%s w=%d stage %d: offloaded bit-identical (losses %.6f .. %.6f); device peak %llu -> %llu, "
                  "host %llu\n",
                  arch, w, zero, on.loss[0], on.loss[s.max_steps - 1], (unsigned long long)on.h.mem_peak[0],
                  (unsigned long long)off.h.mem_peak[0], (unsigned long long)off.h.host_peak);
    free(on.params);
    free(off.params);
}

static void test_bits_one_rank(void **state)
{
    (void)state;
    check("gpt2", 1, 0);
    check("llama", 1, 0);
}

static void test_bits_two_ranks(void **state)
{
    (void)state;
    for (int z = 0; z <= 3; z++) { /* stage 3: the range is the rank's partition */
        check("gpt2", 2, z);
        check("llama", 2, z);
    }
    check("llama", 4, 3);
    check("llama-lora", 2, 2); /* the shards cut the adapters' range */
}

/* A LLaMA-shaped job whose stage-0 state (with the moments) is past its
 * CPU device budget: refused without offload (the state does not fit, no
 * split helps), run to the end with it on the same budget, with the
 * losses of the same job on a big device. */
static void llama_spec(train_cfg *s, bool offload)
{
    spec_of(s, "llama", 1, 0, offload);
    s->model.n_layer = 3;
    s->model.n_embd = 64;
    s->model.n_head = 4;
    s->model.n_kv_head = 2;
    s->model.intermediate_size = 172;
    s->oom_adapt = true;
}

static void test_llama_fits_with_offload(void **state)
{
    (void)state;
    train_cfg s;
    llama_spec(&s, true);
    uint64_t budget, host;
    model_config cfg;
    fx_plan_figures(&s, &budget, &host, &cfg);
    uint64_t state0 = plan_rank_state_bytes(&cfg, 0, 1, 0); /* stage 0, moments on the device */
    assert_true(state0 > budget);                          /* the state alone does not fit */
    fx_run no, yes, big;
    llama_spec(&s, false);
    run_budget(&s, budget, 0, NULL, &no);
    assert_int_equal(no.status, ACC_EOOM);
    assert_non_null(strstr(no.err.msg, "AdamW state"));
    assert_int_equal(no.h.steps_done, 0);
    llama_spec(&s, true);
    run_budget(&s, budget, host, NULL, &yes); /* the device and the host exactly as predicted */
    fx_assert_ran(&yes, &s, "offloaded run");
    assert_int_equal(yes.h.mem_peak[0], budget);
    assert_int_equal(yes.h.host_peak, host);
    llama_spec(&s, false);
    run(&s, &big);
    fx_assert_same_bits(&big, &yes, 0, s.max_steps);
    /* offloaded, a device one byte short of the parameters and gradients */
    fx_run tight;
    llama_spec(&s, true);
    uint64_t dev_state = plan_rank_device_state_bytes(&cfg, 0, true, 1, 0);
    assert_int_equal(dev_state, state0 - plan_optim_bytes(&cfg, 0, 1, 0));
    run_budget(&s, dev_state - 1, host, NULL, &tight);
    assert_int_equal(tight.status, ACC_EOOM);
    assert_non_null(strstr(tight.err.msg, "the optimizer is offloaded"));
    free(tight.params);
    print_message("llama: stage-0 state %llu > device budget %llu: without offload \"%s\"; offloaded it runs "
                  "(host %llu bytes), bit-identical to a big device\n",
                  (unsigned long long)state0, (unsigned long long)budget, no.err.msg, (unsigned long long)host);
    free(no.params);
    free(yes.params);
    free(big.params);
}

/* The same LLaMA-shaped job on four devices, each with a budget below
 * the stage-0 state (parameters, gradients and moments) even with the
 * moments offloaded: ZeRO-3 + optimizer offload runs it to the end on that
 * budget, its peak the prediction, its losses those of stage 0 on big
 * devices within 1e-6 (ZeRO-3 sums the ranks per micro-step). */
static void test_llama_fits_with_zero3_offload(void **state)
{
    (void)state;
    train_cfg s;
    llama_spec(&s, true);
    s.model.n_layer = 16; /* stage 3's gather slots are 3 blocks: a deeper model saves */
    s.devices = 4;
    s.train_batch_size = 16; /* m 2, a 2, w 4 */
    s.zero_stage = 3;
    uint64_t budget, host;
    model_config cfg;
    fx_plan_figures(&s, &budget, &host, &cfg);
    uint64_t state0 = plan_rank_state_bytes(&cfg, 0, 4, 0);
    uint64_t off0 = plan_rank_device_state_bytes(&cfg, 0, true, 4, 0);
    if (!(state0 > budget && off0 > budget))
        print_error("stage 0 %llu, offloaded %llu, ZeRO-3 + offload %llu\n", (unsigned long long)state0,
                    (unsigned long long)off0, (unsigned long long)budget);
    assert_true(state0 > budget && off0 > budget); /* neither stage 0 nor its offload fits */
    fx_run yes, big;
    run_budget(&s, budget, host, NULL, &yes);
    fx_assert_ran(&yes, &s, "ZeRO-3 offloaded run");
    assert_int_equal(yes.h.mem_peak[0], budget);
    assert_int_equal(yes.h.host_peak, host);
    s.zero_stage = 0;
    s.offload_optimizer = false;
    s.model.n_layer = 16;
    run(&s, &big);
    for (int k = 0; k < s.max_steps; k++)
        assert_true(fabs(yes.loss[k] - big.loss[k]) <= 1e-6 * fabs(big.loss[k]));
    for (size_t i = 0; i < big.h.nparams; i++)
        assert_true(fabsf(yes.params[i] - big.params[i]) <= 1e-6f * (1.0f + fabsf(big.params[i])));
    print_message("llama w=4: stage-0 state %llu (offloaded %llu) > device budget %llu; ZeRO-3 + offload "
                  "runs (host %llu bytes), stage 0's losses within 1e-6\n",
                  (unsigned long long)state0, (unsigned long long)off0, (unsigned long long)budget,
                  (unsigned long long)host);
    free(yes.params);
    free(big.params);
}

/* The job's host memory one byte short of the prediction: the run fails
 * with ACC_ENOMEM naming host memory; at the prediction it runs. */
static void test_host_budget(void **state)
{
    (void)state;
    train_cfg s;
    spec_of(&s, "gpt2", 2, 2, true);
    uint64_t host;
    acc_err err = {0};
    assert_int_equal(plan_host_bytes(&s, &host, &err), 0);
    assert_true(host > 0);
    fx_run r;
    run_budget(&s, 1ull << 30, host - 1, NULL, &r);
    assert_int_equal(r.status, ACC_ENOMEM);
    assert_non_null(strstr(r.err.msg, "host memory"));
    free(r.params);
    run_budget(&s, 1ull << 30, host, NULL, &r);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.h.host_peak, host);
    free(r.params);
}

static void ckpt_spec(train_cfg *s, int w, int zero, bool offload, const char *from, const char *out, int steps)
{
    spec_of(s, "gpt2", w, zero, offload);
    s->max_steps = steps;
    snprintf(s->resume_from, sizeof s->resume_from, "%s", from);
    snprintf(s->output_dir, sizeof s->output_dir, "%s/%s", root, out);
}

/* Checkpoints written with offload are those written without (byte for
 * byte: the moments gathered from the host copies), and a resume with or
 * without offload from either continues with the uninterrupted losses. */
static void check_resume(int w, int zero)
{
    train_cfg s;
    fx_run a, b, ra, rb, ref;
    char tag[32], ck_a[256], ck_b[256];
    snprintf(tag, sizeof tag, "w%dz%d", w, zero);
    char out[64];
    snprintf(out, sizeof out, "%s-off", tag);
    ckpt_spec(&s, w, zero, true, "", out, 2);
    run(&s, &a);
    snprintf(ck_a, sizeof ck_a, "%s/%s/ckpt-00000002", root, out);
    snprintf(out, sizeof out, "%s-on", tag);
    ckpt_spec(&s, w, zero, false, "", out, 2);
    run(&s, &b);
    snprintf(ck_b, sizeof ck_b, "%s/%s/ckpt-00000002", root, out);
    fx_assert_same_bits(&a, &b, 0, 2);
    fx_assert_same_checkpoint(ck_a, ck_b);
    /* written with offload, resumed without; written without, resumed with */
    snprintf(out, sizeof out, "%s-off-on", tag);
    ckpt_spec(&s, w, zero, false, ck_a, out, 4);
    run(&s, &ra);
    snprintf(out, sizeof out, "%s-on-off", tag);
    ckpt_spec(&s, w, zero, true, ck_b, out, 4);
    run(&s, &rb);
    snprintf(out, sizeof out, "%s-ref", tag);
    ckpt_spec(&s, w, zero, false, "", out, 4);
    run(&s, &ref);
    fx_assert_same_bits(&ref, &ra, 2, 4);
    fx_assert_same_bits(&ref, &rb, 2, 4);
    for (int k = 0; k < 2; k++)
        assert_true(isnan(ra.loss[k]) && isnan(rb.loss[k])); /* resumed at step 2 */
    print_message("w=%d stage %d: offloaded checkpoint = the device's; resumed across: losses %.9f %.9f\n", w, zero,
                  ref.loss[2], ref.loss[3]);
    fx_run *all[] = {&a, &b, &ra, &rb, &ref};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        free(all[i]->params);
}

static void test_resume_across(void **state)
{
    (void)state;
    check_resume(1, 0);
    check_resume(2, 2); /* the sharded moments gathered from the host copies */
}

static void test_pin_memory(void **state)
{
    (void)state;
    kern_device_info info;
    fx_devices(&info, 1, 0);
    kern_device *d;
    acc_err err = {0};
    assert_int_equal(kern_device_open(&info, 1, &d, &err), 0);
    assert_null(d->ops->host_register); /* CPU devices: nothing to pin */
    kern_ops ops = fx_pin_ops(d); /* host_register a test double (fx_pin_dev) */
    fx_pin_dev fd = {.dev = *d};
    fd.dev.ops = &ops;
    kern_device *pd = &fd.dev;
    host_mem hm;
    host_mem_init(&hm, 0);
    adamw *a;
    assert_int_equal(adamw_create_host(pd, &hm, 2, true, 10, 1010, &a, &err), 0);
    assert_int_equal(fd.nreg, 2);
    assert_true((fd.reg[0] == a->master && fd.reg[1] == a->g) || (fd.reg[0] == a->g && fd.reg[1] == a->master));
    adamw_free(a);
    assert_int_equal(fd.nunreg, 2);
    /* not asked: nothing registered */
    fd = (fx_pin_dev){.dev = fd.dev};
    assert_int_equal(adamw_create_host(pd, &hm, 2, false, 10, 1010, &a, &err), 0);
    adamw_free(a);
    assert_int_equal(fd.nreg, 0);
    /* the second refused: the first undone, nothing allocated, the key named */
    fd = (fx_pin_dev){.dev = fd.dev, .refuse = 2};
    assert_int_equal(adamw_create_host(pd, &hm, 2, true, 10, 1010, &a, &err), ACC_EDEVICE);
    assert_null(a);
    assert_string_equal(err.field, "zero_optimization.offload_optimizer.pin_memory");
    assert_non_null(strstr(err.msg, "refused by the test"));
    assert_int_equal(fd.nreg, 1);
    assert_int_equal(fd.nunreg, 1);
    assert_int_equal(host_mem_in_use(&hm), 0);
    host_mem_destroy(&hm);
    kern_device_close(d);
    /* a pinned job on CPU devices: the same bits */
    train_cfg s;
    fx_run on, off;
    spec_of(&s, "gpt2", 2, 2, false);
    run(&s, &on);
    spec_of(&s, "gpt2", 2, 2, true);
    s.offload_pin_memory = true;
    run(&s, &off);
    fx_assert_same_bits(&on, &off, 0, s.max_steps);
    free(on.params);
    free(off.params);
}

/* The other modes ride along: bf16 operands, recomputation, evals, a
 * checkpoint mid-run and an out-of-memory on one rank (every rank adapts)
 * under ZeRO 2: offloaded, the same bits as without. */
static void test_modes_and_oom(void **state)
{
    (void)state;
    fx_run r[2];
    fx_oom_at in[2] = {{.rank = 1, .step = 1, .m = 2}, {.rank = 1, .step = 1, .m = 2}};
    for (int off = 0; off <= 1; off++) {
        train_cfg s;
        spec_of(&s, "gpt2", 2, 2, off);
        s.precision = SPEC_BF16;
        s.activation_checkpointing = true;
        s.oom_adapt = true;
        snprintf(s.data.val, sizeof s.data.val, "%s", text_path);
        s.eval_interval = 2;
        s.checkpoint_interval = 2;
        snprintf(s.output_dir, sizeof s.output_dir, "%s/modes%d", root, off);
        run_in(&s, &r[off], &in[off]);
        assert_true(in[off].fired);
        assert_int_equal(r[off].h.oom_adjusts, 1);
        assert_int_equal(r[off].h.final_micro, 1);
        assert_true(isfinite(r[off].val[1]) && isfinite(r[off].val[3]));
        if (off)
            fx_assert_same_bits(&r[0], &r[1], 0, s.max_steps);
    }
    assert_memory_equal(r[0].val, r[1].val, sizeof r[0].val);
    free(r[0].params);
    free(r[1].params);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bits_one_rank),
        cmocka_unit_test(test_bits_two_ranks),
        cmocka_unit_test(test_llama_fits_with_offload),
        cmocka_unit_test(test_llama_fits_with_zero3_offload),
        cmocka_unit_test(test_host_budget),
        cmocka_unit_test(test_resume_across),
        cmocka_unit_test(test_pin_memory),
        cmocka_unit_test(test_modes_and_oom),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
