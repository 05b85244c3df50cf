/* Parameter offload (zero_optimization.offload_param, ZeRO stage 3): the
 * planner's device and host bytes (mem_plan.h plan_host_params_bytes),
 * checked against the partition computed here from the layout alone, and
 * LLaMA-2-7B's figures on one 24 GiB CUDA card; then the engine through the
 * trainer on CPU devices: losses, norms and weights bit-identical to stage
 * 3 without it, measured device and host peaks equal to the prediction, a
 * host budget one byte short, a job past its one device's budget at stage
 * 0 run on it, and a resume from its checkpoint without it. */
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

#include "engine_fixture.h"
#include "hf_configs.h"
#include "host_mem.h"
#include "kern_comm.h"
#include "kern_device.h"
#include "mem_plan.h"
#include "model.h"
#include "model_shard.h"
#include "train_cfg.h"
#include "trainer_run.h"

static const char llama_tiny[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 64,"
    " \"intermediate_size\": 160, \"num_hidden_layers\": 3, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"vocab_size\": 301, \"max_position_embeddings\": 256,"
    " \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, \"tie_word_embeddings\": false,"
    " \"torch_dtype\": \"float32\", \"hidden_act\": \"silu\"}";


static void remove_config(const char *root, const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s/config.json", root, name);
    unlink(path);
    snprintf(path, sizeof path, "%s/%s", root, name);
    rmdir(path);
}

static train_cfg *plan_spec(const char *root, const char *dir, int T, int B, int w)
{
    train_cfg *s = calloc(1, sizeof *s);
    assert_non_null(s);
    fx_plan_spec(s, root, dir, T);
    s->train_batch_size = B;
    s->micro_batch = 1;
    s->accum_steps = B / w;
    s->devices = w;
    s->zero_stage = 3;
    s->offload_optimizer = true;
    return s;
}

static plan_row row_of(const train_cfg *s, kern_dev_kind kind, uint64_t budget)
{
    plan_row rows[PLAN_MAX_ROWS];
    int n = 0, chosen = -1;
    acc_err err = {0};
    if (plan_candidates_on(s, kind, budget, rows, PLAN_MAX_ROWS, &n, &chosen, &err) != 0)
        fail_msg("%s: %s", err.field, err.msg);
    assert_true(n >= 1);
    return rows[0];
}

/* Rank r's partition of world w from the layout alone: its slice of each
 * group (a block's tensors, or every tensor outside the blocks), the
 * slices' sum (pn) and the largest (slice); rank 0's sum in *pn0. */
static void partition_of(const model_config *cfg, int r, int w, uint64_t *pn, uint64_t *slice, uint64_t *pn0)
{
    model_layout l;
    acc_err err = {0};
    assert_int_equal(model_layout_build(cfg, &l, &err), 0);
    int L = cfg->n_layer;
    uint64_t *gn = calloc((size_t)L + 1, sizeof *gn);
    assert_non_null(gn);
    for (int i = 0; i < l.n; i++)
        gn[l.t[i].layer < 0 ? L : l.t[i].layer] += l.t[i].count;
    *pn = *slice = *pn0 = 0;
    for (int g = 0; g <= L; g++) {
        /* kern_shard_lo's cut: the first n % w ranks one more */
        uint64_t q = gn[g] / (uint64_t)w, rem = gn[g] % (uint64_t)w;
        uint64_t own = q + ((uint64_t)r < rem), own0 = q + (rem > 0);
        *pn += own;
        *pn0 += own0;
        if (own > *slice)
            *slice = own;
    }
    free(gn);
    model_layout_free(&l);
}

/* The largest block's floats and the ends' (the tensors outside the blocks). */
static void groups_of(const model_config *cfg, uint64_t *slot, uint64_t *ends)
{
    model_layout l;
    acc_err err = {0};
    assert_int_equal(model_layout_build(cfg, &l, &err), 0);
    uint64_t *gn = calloc((size_t)cfg->n_layer + 1, sizeof *gn);
    assert_non_null(gn);
    for (int i = 0; i < l.n; i++)
        gn[l.t[i].layer < 0 ? cfg->n_layer : l.t[i].layer] += l.t[i].count;
    *slot = 0;
    for (int g = 0; g < cfg->n_layer; g++)
        *slot = gn[g] > *slot ? gn[g] : *slot;
    *ends = gn[cfg->n_layer];
    free(gn);
    model_layout_free(&l);
}

/* Device parts drop by the partition's parameters (the gradient partition
 * left with the optimizer offloaded already: model_config.grads_host,
 * rank 0's pn0), the host holds 2 pn + slice floats and the moments only
 * (without offload_param: the gradients, the staging, moments and master). */
static void test_plan_bytes(void **state)
{
    (void)state;
    char root[] = "/tmp/accumd-offparam-XXXXXX";
    assert_non_null(mkdtemp(root));
    assert_int_equal(fx_write_config(root, "tiny", llama_tiny), 0);
    for (int w = 1; w <= 2; w++) {
        train_cfg *s = plan_spec(root, "tiny", 32, 4, w);
        plan_row base = row_of(s, KERN_DEV_CPU, 0);
        model_config cfg_b; /* the optimizer offloaded alone: the gradient partition on the host */
        acc_err err_b = {0};
        assert_int_equal(plan_model_config(s, &cfg_b, &err_b), 0);
        assert_true(cfg_b.grads_host);
        s->offload_param = true;
        plan_row op = row_of(s, KERN_DEV_CPU, 0);
        model_config cfg;
        acc_err err = {0};
        assert_int_equal(plan_model_config(s, &cfg, &err), 0);
        uint64_t pn, slice, pn0;
        partition_of(&cfg, 0, w, &pn, &slice, &pn0);
        assert_true(pn == pn0);
        assert_false(cfg.grads_host); /* offload_param holds the gradients itself */
        assert_true(op.parts.weights == base.parts.weights - 4 * pn);
        assert_true(op.parts.gradients == base.parts.gradients);
        assert_true(op.parts.optimizer == 0 && base.parts.optimizer == 0);
        assert_true(op.peak_bytes == base.peak_bytes - 4 * pn);
        assert_true(op.host.params == 4 * (2 * pn + slice) && base.host.params == 4 * (pn + slice));
        assert_true(op.host.optimizer == 8 * pn && base.host.optimizer == 12 * pn);
        assert_true(op.host_bytes == op.host.batch + op.host.optimizer + op.host.params + op.host.activations);
        /* every rank's host share, summed (plan_host_bytes) */
        uint64_t want = 0, hb = 0;
        for (int r = 0; r < w; r++) {
            uint64_t p, sl, p0;
            partition_of(&cfg, r, w, &p, &sl, &p0);
            want += 4 * (2 * p + sl) + 8 * p;
            assert_true(plan_host_params_bytes(&cfg, 3, true, w, r) == 4 * (2 * p + sl));
            assert_true(plan_rank_device_state_bytes_op(&cfg, 3, true, true, w, r) ==
                        plan_rank_device_state_bytes(&cfg, 3, true, w, r) - 4 * (p + p0));
            assert_true(plan_rank_device_state_bytes_op(&cfg_b, 3, true, false, w, r) ==
                        plan_rank_device_state_bytes(&cfg_b, 3, true, w, r) - 4 * p0);
            assert_true(plan_host_params_bytes(&cfg_b, 3, false, w, r) == 4 * (p + sl));
            assert_true(plan_host_optim_bytes_op(&cfg_b, 3, true, false, w, r) == 12 * p);
        }
        assert_int_equal(plan_host_bytes(s, &hb, &err), 0);
        assert_true(hb == want);
        /* no effect below stage 3 */
        assert_true(plan_host_params_bytes(&cfg, 2, true, w, 0) == 0);
        free(s);
    }
    remove_config(root, "tiny");
    rmdir(root);
}

/* LLaMA-2-7B, seq 4096, B 32, bf16, lean activations + recomputation, one
 * 24 GiB CUDA card, stage 3 + offload_param + offload_optimizer: the
 * figures (the report's), with and without host checkpoints. */
static void test_llama7b_figures(void **state)
{
    (void)state;
    char root[] = "/tmp/accumd-offparam-XXXXXX";
    assert_non_null(mkdtemp(root));
    assert_int_equal(fx_write_config(root, "Llama-2-7b-hf", fx_llama2_7b_config()), 0);
    const double gib = 1024.0 * 1024.0 * 1024.0;
    for (int ao = 0; ao <= 1; ao++) {
        train_cfg *s = plan_spec(root, "Llama-2-7b-hf", 4096, 32, 1);
        s->precision = SPEC_BF16;
        s->activation_checkpointing = true;
        s->lean_activations = true;
        s->activation_offload = ao;
        s->offload_param = true;
        plan_row r = row_of(s, KERN_DEV_CUDA, 24ull << 30);
        print_message("LLaMA-2-7B seq 4096 B 32 m %d a %d, stage 3 + offload_param + offload_optimizer%s, "
                      "CUDA 24 GiB: device %llu B = %.2f GiB (weights %.2f, gradients %.2f, optimizer %.2f, "
                      "activations %.2f, rounding %.2f, runtime %.2f), fits %d; host %llu B "
                      "= %.2f GiB (params %.2f, optimizer %.2f, activations %.2f, batch %.4f)\n",
                      r.micro_batch, r.accum_steps, ao ? " + host checkpoints" : "",
                      (unsigned long long)r.device_bytes, r.device_bytes / gib, r.parts.weights / gib,
                      r.parts.gradients / gib, r.parts.optimizer / gib, r.parts.activations / gib,
                      r.parts.rounding / gib, r.parts.runtime / gib, r.fits,
                      (unsigned long long)r.host_bytes, r.host_bytes / gib, r.host.params / gib,
                      r.host.optimizer / gib, r.host.activations / gib, r.host.batch / gib);
        /* 6.74e9 parameters: 4 + 4 bytes each for the host partitions, 8
         * for the moments; the device keeps the slots of one block */
        model_config cfg;
        acc_err err = {0};
        assert_int_equal(plan_model_config(s, &cfg, &err), 0);
        uint64_t pn, slice, pn0;
        partition_of(&cfg, 0, 1, &pn, &slice, &pn0);
        assert_true(pn > 6700000000ull && pn == pn0);
        assert_true(r.host.params == 4 * (2 * pn + slice) && r.host.optimizer == 8 * pn);
        /* the device: two block slots (bf16 at stage 3: the matrices in
         * 2 bytes, model_shard.h), the fetch scratch and the ends' slot
         * (parameters), one block slot, the ends' slot and the trainer's
         * slots (gradients) */
        uint64_t slot, ends;
        groups_of(&cfg, &slot, &ends);
        model_shard_sizes z;
        assert_int_equal(model_shard_sizes_of(&cfg, 0, 1, &z, &err), 0);
        assert_true(cfg.weights_bf16 && z.slot_f32 + z.slot_b16 == slot && z.fetch > 0);
        assert_true(r.parts.weights == 4 * (ends + z.fetch) + 2 * (4 * z.slot_f32 + 2 * z.slot_b16) &&
                    r.parts.optimizer == 0);
        assert_true(r.parts.gradients > 4 * (slot + ends) && r.parts.gradients < 4 * (slot + ends) + 4096);
        assert_true(r.fits);
        { /* every candidate m: the planner's pick is the largest that fits */
            plan_row rows[PLAN_MAX_ROWS];
            int n = 0, chosen = -1;
            acc_err e2 = {0};
            assert_int_equal(plan_candidates_on(s, KERN_DEV_CUDA, 24ull << 30, rows, PLAN_MAX_ROWS, &n, &chosen,
                                                &e2), 0);
            for (int i = 0; i < n; i++)
                print_message("  m %d%s: device %llu B = %.2f GiB, fits %d, host %llu B%s\n", rows[i].micro_batch,
                              rows[i].recompute ? " (recompute)" : "", (unsigned long long)rows[i].device_bytes,
                              rows[i].device_bytes / gib, rows[i].fits, (unsigned long long)rows[i].host_bytes,
                              i == chosen ? "  <- chosen" : "");
            assert_true(chosen >= 0 && rows[chosen].fits);
        }
        s->offload_param = false; /* the parameter partition on the device (bf16 matrices), the gradients on the host */
        plan_row d = row_of(s, KERN_DEV_CUDA, 24ull << 30);
        print_message("  without offload_param: m %d device %llu B = %.2f GiB (weights %.2f, gradients %.2f), fits %d\n",
                      d.micro_batch, (unsigned long long)d.device_bytes, d.device_bytes / gib, d.parts.weights / gib,
                      d.parts.gradients / gib, d.fits);
        /* the planner's row (a spec at stage 3 needs two devices without
         * offload_param): the gradients' device part is offload_param's,
         * the trainer's and the slots, and it is within the card */
        assert_true(d.fits && d.micro_batch == 1 && d.parts.gradients == r.parts.gradients);
        free(s);
    }
    remove_config(root, "Llama-2-7b-hf");
    rmdir(root);
}

/* ---- the engine, through the trainer on CPU devices */

static char text_path[64];
static char ck_root[64];

static int setup(void **state)
{
    (void)state;
    return fx_workdir_make(text_path, sizeof text_path, 20000, ck_root, sizeof ck_root, "offparam");
}

static int teardown(void **state)
{
    (void)state;
    fx_workdir_remove(text_path, ck_root);
    return 0;
}

/* A tiny job of w ranks (B 4w, m 2, a 2), every step clipped. */
static void job_of(train_cfg *s, const char *arch, int w, int zero, bool offopt, bool offparam)
{
    fx_clipped_spec(s, text_path, arch, 2, 2, w);
    s->zero_stage = zero;
    s->offload_optimizer = offopt;
    s->offload_param = offparam;
}

/* Runs s on CPU devices of `budget` bytes, the host state limited to
 * `host` bytes (0: unlimited) besides the batch buffers. */
static void run_budget(const train_cfg *s, uint64_t budget, uint64_t host, fx_run *r)
{
    fx_run_opts o = {.device_budget = budget, .host_budget = host, .threads = 3};
    fx_train(s, &o, r);
}

static void run(const train_cfg *s, fx_run *r)
{
    run_budget(s, 1ull << 30, 0, r);
    fx_assert_ran(r, s, "run");
}

/* Measured = predicted: each rank's device peak, the job's host peak. */
static void assert_memory(const train_cfg *s, const fx_run *r)
{
    model_config cfg;
    acc_err err = {0};
    assert_int_equal(plan_model_config(s, &cfg, &err), 0);
    int w = s->devices;
    uint64_t host = 0;
    for (int k = 0; k < w; k++) {
        uint64_t want = plan_rank_device_state_bytes_op(&cfg, 3, true, true, w, k) +
                        plan_act_bytes(&cfg, s->micro_batch, s->model.seq_len, 0);
        if (r->h.mem_peak[k] != want)
            print_error("rank %d: device peak %llu, predicted %llu\n", k, (unsigned long long)r->h.mem_peak[k],
                        (unsigned long long)want);
        assert_int_equal(r->h.mem_peak[k], want);
        host += plan_host_params_bytes(&cfg, 3, true, w, k) + plan_host_optim_bytes_op(&cfg, 3, true, true, w, k);
    }
    if (r->h.host_peak != host)
        print_error("host peak %llu, predicted %llu\n", (unsigned long long)r->h.host_peak,
                    (unsigned long long)host);
    assert_int_equal(r->h.host_peak, host);
    uint64_t job_host, dev0;
    assert_int_equal(plan_host_bytes(s, &job_host, &err), 0);
    assert_int_equal(job_host, host);
    assert_int_equal(plan_device_bytes(s, s->micro_batch, false, &dev0, &err), 0);
    assert_int_equal(dev0, r->h.mem_peak[0]);
}

static void check_bits(const char *arch, int w)
{
    train_cfg s;
    fx_run base, op;
    job_of(&s, arch, w, 3, true, false);
    run(&s, &base);
    job_of(&s, arch, w, 3, true, true);
    run(&s, &op);
    fx_assert_same_bits(&base, &op, 0, s.max_steps);
    assert_memory(&s, &op);
    print_message("%s w=%d stage 3 + offload_optimizer: offload_param bit-identical (losses %.6f .. %.6f); "
                  "device peak %llu -> %llu, host peak %llu -> %llu\n",
                  arch, w, base.loss[0], base.loss[s.max_steps - 1], (unsigned long long)base.h.mem_peak[0],
                  (unsigned long long)op.h.mem_peak[0], (unsigned long long)base.h.host_peak,
                  (unsigned long long)op.h.host_peak);
    free(base.params);
    free(op.params);
}

static void test_bits(void **state)
{
    (void)state;
    check_bits("gpt2", 1);
    check_bits("llama", 1);
    check_bits("gpt2", 2);
    check_bits("llama", 2);
}

/* At w = 1 against stage 0 (the optimizer offloaded in both): stage 3
 * adds each micro-step's block gradients into the partition, stage 0's
 * kernels accumulate into the whole buffer: the fp32 sums may differ in
 * order, so within 1e-6 (the same bits where they do not). */
static void test_stage0_one_rank(void **state)
{
    (void)state;
    train_cfg s;
    fx_run z0, op;
    job_of(&s, "llama", 1, 0, true, false);
    run(&s, &z0);
    job_of(&s, "llama", 1, 3, true, true);
    run(&s, &op);
    int same = memcmp(z0.params, op.params, z0.h.nparams * sizeof(float)) == 0;
    for (int k = 0; k < s.max_steps; k++)
        assert_true(fabs(op.loss[k] - z0.loss[k]) <= 1e-6 * fabs(z0.loss[k]));
    for (size_t i = 0; i < z0.h.nparams; i++)
        assert_true(fabsf(op.params[i] - z0.params[i]) <= 1e-6f * (1.0f + fabsf(z0.params[i])));
    print_message("llama w=1: stage 3 + offload_param vs stage 0: weights %s\n",
                  same ? "bit-identical" : "within 1e-6");
    free(z0.params);
    free(op.params);
}

/* A LLaMA-shaped job whose stage-0 state is past its one CPU device's
 * budget runs to the end on that device with stage 3 + offload_param +
 * offload_optimizer, its peaks the predictions; one byte less of host
 * memory is ACC_ENOMEM naming host memory. */
static void test_llama_one_device(void **state)
{
    (void)state;
    train_cfg s;
    job_of(&s, "llama", 1, 3, true, true);
    s.model.n_layer = 8;
    s.model.n_embd = 64;
    s.model.n_head = 4;
    s.model.n_kv_head = 2;
    s.model.intermediate_size = 172;
    uint64_t budget, host;
    model_config cfg;
    fx_plan_figures(&s, &budget, &host, &cfg);
    uint64_t state0 = plan_rank_state_bytes(&cfg, 0, 1, 0);
    assert_true(state0 > budget);
    fx_run yes, short_host, big;
    run_budget(&s, budget, host, &yes);
    fx_assert_ran(&yes, &s, "run");
    assert_int_equal(yes.h.mem_peak[0], budget);
    assert_int_equal(yes.h.host_peak, host);
    run_budget(&s, budget, host - 1, &short_host);
    assert_int_equal(short_host.status, ACC_ENOMEM);
    assert_non_null(strstr(short_host.err.msg, "host memory"));
    s.zero_stage = 0;
    s.offload_optimizer = s.offload_param = false;
    run(&s, &big);
    for (int k = 0; k < s.max_steps; k++)
        assert_true(fabs(yes.loss[k] - big.loss[k]) <= 1e-6 * fabs(big.loss[k]));
    print_message("llama one device: stage-0 state %llu > budget %llu; stage 3 + offload_param + "
                  "offload_optimizer runs (host %llu bytes); one byte less host: \"%s\"\n",
                  (unsigned long long)state0, (unsigned long long)budget, (unsigned long long)host,
                  short_host.err.msg);
    free(yes.params);
    free(short_host.params);
    free(big.params);
}

/* A checkpoint written with offload_param resumes without it (and the
 * reverse), continuing the uninterrupted run's losses bit for bit. */
static void ck_job(train_cfg *s, bool offparam, const char *from, const char *out, int steps)
{
    job_of(s, "gpt2", 2, 3, true, offparam);
    s->max_steps = steps;
    snprintf(s->resume_from, sizeof s->resume_from, "%s", from);
    snprintf(s->output_dir, sizeof s->output_dir, "%s/%s", ck_root, out);
}

static void test_resume(void **state)
{
    (void)state;
    train_cfg s;
    fx_run a, b, ra, rb, ref;
    char ck_a[256], ck_b[256];
    ck_job(&s, true, "", "op", 2);
    run(&s, &a);
    snprintf(ck_a, sizeof ck_a, "%s/op/ckpt-00000002", ck_root);
    ck_job(&s, false, "", "dev", 2);
    run(&s, &b);
    snprintf(ck_b, sizeof ck_b, "%s/dev/ckpt-00000002", ck_root);
    fx_assert_same_bits(&a, &b, 0, 2);
    ck_job(&s, false, ck_a, "op-dev", 4);
    run(&s, &ra);
    ck_job(&s, true, ck_b, "dev-op", 4);
    run(&s, &rb);
    ck_job(&s, false, "", "ref", 4);
    run(&s, &ref);
    fx_assert_same_bits(&ref, &ra, 2, 4);
    fx_assert_same_bits(&ref, &rb, 2, 4);
    print_message("w=2 stage 3: resumed across offload_param: losses %.9f %.9f\n", ref.loss[2], ref.loss[3]);
    fx_run *all[] = {&a, &b, &ra, &rb, &ref};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        free(all[i]->params);
}

/* pin_memory: a CPU device copy whose host_register is a test double
 * (fx_pin_dev: records, refuses the call numbered `refuse`, 1-based). */
static void test_pin_memory(void **state)
{
    (void)state;
    train_cfg s;
    job_of(&s, "gpt2", 1, 3, true, true);
    model_config cfg;
    acc_err err = {0};
    assert_int_equal(plan_model_config(&s, &cfg, &err), 0);
    kern_device_info info;
    fx_devices(&info, 1, 0);
    kern_device *d;
    assert_int_equal(kern_device_open(&info, 1, &d, &err), 0);
    kern_ops ops = fx_pin_ops(d);
    for (int refuse = 0; refuse <= 2; refuse++) {
        fx_pin_dev pd = {.dev = *d, .refuse = refuse};
        pd.dev.ops = &ops;
        kern_comm *c;
        assert_int_equal(kern_comm_create(1, &c, &err), 0);
        assert_int_equal(kern_comm_bind(c, 0, &pd.dev, &err), 0);
        host_mem hm;
        host_mem_init(&hm, 0);
        model_opts mo = {.T = s.model.seq_len, .grad_tail = 8, .comm = c, .rank = 0, .world = 1,
                         .host_params = &hm, .host_params_pin = true};
        model *m = NULL;
        int rc = model_create_ex(&pd.dev, &cfg, &mo, &m, &err);
        if (refuse == 0) { /* the parameters and the staging, undone at free */
            assert_int_equal(rc, 0);
            assert_int_equal(pd.nreg, 2);
            assert_true(pd.reg[0] == m->params);
            model_free(m);
            assert_int_equal(pd.nunreg, 2);
        } else { /* refused: what was registered undone, nothing left */
            assert_int_equal(rc, ACC_EDEVICE);
            assert_string_equal(err.field, "zero_optimization.offload_param.pin_memory");
            assert_non_null(strstr(err.msg, "refused by the test"));
            assert_int_equal(pd.nunreg, refuse - 1);
        }
        assert_int_equal(host_mem_in_use(&hm), 0);
        host_mem_destroy(&hm);
        kern_comm_destroy(c);
    }
    kern_device_close(d);
    /* a pinned job on CPU devices (nothing to pin): the same bits */
    fx_run a, b;
    job_of(&s, "gpt2", 2, 3, true, true);
    run(&s, &a);
    s.offload_param_pin = true;
    run(&s, &b);
    fx_assert_same_bits(&a, &b, 0, s.max_steps);
    free(a.params);
    free(b.params);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_bytes),
        cmocka_unit_test(test_llama7b_figures),
        cmocka_unit_test(test_bits),
        cmocka_unit_test(test_stage0_one_rank),
        cmocka_unit_test(test_llama_one_device),
        cmocka_unit_test(test_resume),
        cmocka_unit_test(test_pin_memory),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
