/* The planner's table (plan_table.h) and POST /v1/plan's compute part:
 *   - every way to run a small LLaMA spec: one group per variant, one row
 *     per micro batch m dividing B / w (ascending, a = B / (m w)), the
 *     largest fitting m per group against a budget set between two rows;
 *   - the breakdown: weights + gradients + optimizer + activations == the
 *     peak (every row; a CUDA bf16 row's activations are the model's own,
 *     no operand buffers), on CPU devices nothing beyond it, on CUDA
 *     devices the allocator's rounding (checked against a by-hand list of
 *     the five allocations) and the runtime's 512 MiB;
 *   - predicted == measured: every row of the full fine-tune and of LoRA
 *     (recompute off and on, every m) is run by the trainer on a CPU
 *     device and its measured peak equals the row's peak to the byte;
 *   - LoRA rows: a LLaMA spec without a lora section gets them with r 16,
 *     alpha 32, "all-linear" (its trainable count checked against the
 *     adapters' shapes by hand), a spec with one gets its own settings, a
 *     GPT-2 spec (no LoRA for that family yet) gets none;
 *   - config.json only: a directory holding LLaMA-2-7B's config.json (the
 *     published values) and no weights plans (6,738,415,616 parameters,
 *     16 bytes each + the trainer's slots before activations), while a
 *     submit of the same spec is refused naming model.from; on one 24 GiB
 *     CUDA device no full fine-tune fits and the reason names the model
 *     state; on 141 GiB one does;
 *   - bf16 (activations stored in bf16, no operand buffers): for the
 *     LLaMA configs here (the small one and LLaMA-2-7B at seq 4096), plain
 *     and lean, on CPU and CUDA devices, every row's bf16 peak is below its
 *     fp32 peak and its device bytes at most fp32's;
 *   - the request: bad hardware values are ACC_EINVAL naming
 *     hardware.device_memory / hardware.devices / hardware.kind, unknown
 *     keys refused, the spec's own errors still name their field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api_http.h"
#include "job_train_cfg.h"
#include "engine_fixture.h"
#include "fsutil.h"
#include "jobs.h"
#include "kern_cuda.h"
#include "model.h"
#include "plan_table.h"
#include "model_shard.h"
#include "trainer.h"
#include "trainer_run.h"

#define LLAMA2_7B_PARAMS 6738415616ull /* Llama-2-7b-hf's parameter count */

static char text_path[64];
static char root[64];
static acc_conf conf;

static int setup(void **state)
{
    (void)state;
    fx_write_text(text_path, sizeof text_path, 20000);
    snprintf(root, sizeof root, "/tmp/accumd-plan-XXXXXX");
    if (mkdtemp(root) == NULL)
        return -1;
    acc_err err = {0};
    conf_defaults(&conf);
    if (conf_set(&conf, "state_dir", root, &err) != 0 || conf_finalize(&conf, &err) != 0)
        return -1;
    char dir[128], cfg[160];
    snprintf(dir, sizeof dir, "%s/data/llama2-7b", root);
    if (fsu_mkdir_p(dir, 0755, &err) != 0)
        return -1;
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    FILE *f = fopen(cfg, "w");
    if (f == NULL)
        return -1;
    fputs("{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 4096,"
          " \"intermediate_size\": 11008, \"num_hidden_layers\": 32, \"num_attention_heads\": 32,"
          " \"num_key_value_heads\": 32, \"vocab_size\": 32000, \"max_position_embeddings\": 4096,"
          " \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, \"tie_word_embeddings\": false,"
          " \"torch_dtype\": \"float16\", \"hidden_act\": \"silu\"}\n",
          f);
    return fclose(f) == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    unlink(text_path);
    return fsu_rm_rf(root, NULL);
}

static void llama_spec(train_cfg *s, int B, int m, int a, int w)
{
    fx_tiny_spec(s, text_path, B, m, a, w);
    snprintf(s->model.arch, sizeof s->model.arch, "llama");
    s->model.n_kv_head = 1;
    s->model.intermediate_size = 48;
    s->max_steps = 1;
}

static uint64_t parts_sum(const plan_parts *p)
{
    return p->weights + p->gradients + p->optimizer + p->activations;
}

static void test_enumeration(void **state)
{
    (void)state;
    train_cfg s;
    llama_spec(&s, 12, 0, 0, 1);
    s.micro_auto = true;
    model_config cfg;
    acc_err err = {0};
    assert_int_equal(plan_model_config(&s, &cfg, &err), 0);
    /* a budget between m = 2 and m = 3 stored (margin included) */
    uint64_t p2 = plan_peak_bytes(&cfg, 2, s.model.seq_len, false), p3 = plan_peak_bytes(&cfg, 3, s.model.seq_len, false);
    assert_true(p2 < p3);
    uint64_t budget = (p2 + p3) / 2 * 100 / (100 - PLAN_MARGIN_PCT);
    plan_hw hw = {.kind = KERN_DEV_CPU, .device_memory = budget, .devices = 2};
    plan_table t;
    assert_int_equal(plan_table_build(&s, &hw, &t, &err), 0);
    /* per device 6: m = 1, 2, 3, 6; full and LoRA, ZeRO 0, 1, 2 (two
     * devices), recompute off and on: least change first */
    static const int ms[4] = {1, 2, 3, 6};
    assert_int_equal(t.ngroups, 63); /* and QLoRA; the 9 with host checkpoints; then ZeRO-3; all again with the
                                      * optimizer offloaded; then ZeRO-3 with the parameters offloaded too */
    for (int g = 60; g < 63; g++)
        assert_true(t.groups[g].v.offload_param && t.groups[g].v.offload_optimizer && t.groups[g].v.zero_stage == 3);
    for (int g = 27; g < 30; g++) { /* full fine-tune, parameters partitioned (model_shard.h) */
        assert_int_equal(t.groups[g].v.zero_stage, 3);
        assert_false(t.groups[g].v.lora);
        assert_int_equal(t.groups[g].v.recompute, g > 27);
        assert_int_equal(t.groups[g].v.act_offload, g == 29);
        const plan_row *z3 = &t.rows[t.groups[g].first];
        uint64_t wb, gb;
        model_shard_sizes z;
        assert_int_equal(model_shard_state_bytes(&cfg, TRAIN_SLOTS, 0, 2, &wb, &gb, &err), 0);
        assert_int_equal(model_shard_sizes_of(&cfg, 0, 2, &z, &err), 0);
        assert_int_equal(z3->parts.weights, wb);
        assert_int_equal(z3->parts.gradients, gb);
        assert_int_equal(z3->parts.optimizer, z.pn * 2 * sizeof(float));
        assert_true(2 * z.pn >= model_num_params(&cfg) && 2 * z.pn <= model_num_params(&cfg) + 2 * 8);
    }
    /* the optimizer offloaded: the same 30 variants in the same order after
     * all of those; the moments leave the device (their bytes exactly),
     * the host holds 4 floats an element of the rank's AdamW range: twice
     * the device moments it replaces (adamw.h). At stage 3 the gradient
     * partition (rank 0's pn floats) leaves the device too: the host holds
     * it and one slice's staging (host.params) and 3 floats an element
     * (moments, master: 1.5 times the moments; model_config.grads_host) */
    model_shard_sizes z2;
    assert_int_equal(model_shard_sizes_of(&cfg, 0, 2, &z2, &err), 0);
    for (int g = 30; g < 60; g++) {
        plan_variant v = t.groups[g].v, on_dev = t.groups[g - 30].v;
        assert_true(v.offload_optimizer && !on_dev.offload_optimizer);
        assert_true(v.lora == on_dev.lora && v.qlora == on_dev.qlora && v.zero_stage == on_dev.zero_stage &&
                    v.recompute == on_dev.recompute && v.act_offload == on_dev.act_offload);
        assert_int_equal(t.groups[g].n, t.groups[g - 30].n);
        for (int i = 0; i < t.groups[g].n; i++) {
            const plan_row *off = &t.rows[t.groups[g].first + i], *dev = &t.rows[t.groups[g - 30].first + i];
            uint64_t hg = v.zero_stage == 3 ? 4 * (uint64_t)z2.pn : 0; /* the gradient partition */
            assert_int_equal(off->parts.optimizer, 0);
            assert_true(dev->parts.optimizer > 0);
            assert_int_equal(off->peak_bytes, dev->peak_bytes - dev->parts.optimizer - hg);
            assert_true(off->parts.weights == dev->parts.weights && off->parts.gradients == dev->parts.gradients - hg &&
                        off->parts.activations == dev->parts.activations);
            assert_int_equal(off->host.optimizer, (v.zero_stage == 3 ? 3 : 4) * dev->parts.optimizer / 2);
            assert_int_equal(dev->host.optimizer, 0);
            assert_int_equal(off->host.params, v.zero_stage == 3 ? hg + 4 * (uint64_t)z2.slice : 0);
            assert_int_equal(off->host_bytes, dev->host_bytes + off->host.optimizer + off->host.params);
        }
        json_t *j = plan_row_json(&t.rows[t.groups[g].first], &t.groups[g].v, &hw);
        assert_true(json_is_true(json_object_get(j, "offload_optimizer")));
        assert_int_equal(json_integer_value(json_object_get(j, "host_optimizer_bytes")),
                         t.rows[t.groups[g].first].host.optimizer);
        json_decref(j);
        j = plan_row_json(&t.rows[t.groups[g - 30].first], &t.groups[g - 30].v, &hw);
        assert_true(json_is_false(json_object_get(j, "offload_optimizer")));
        json_decref(j);
    }
    for (int g = 0; g < 18; g++) {
        assert_int_equal(t.groups[g].v.lora, g >= 6);
        assert_int_equal(t.groups[g].v.qlora, g >= 12);
        assert_int_equal(t.groups[g].v.zero_stage, g / 2 % 3);
        assert_int_equal(t.groups[g].v.recompute, g % 2);
        assert_false(t.groups[g].v.act_offload);
    }
    for (int g = 18; g < 27; g++) {
        const plan_variant *v = &t.groups[g].v;
        assert_true(v->recompute && v->act_offload);
        assert_int_equal(v->lora, g >= 21);
        assert_int_equal(v->qlora, g >= 24);
        assert_int_equal(v->zero_stage, (g - 18) % 3);
        /* against the same mode on device checkpoints: fewer device bytes, the rest on the host */
        const plan_row *on = &t.rows[t.groups[g].first], *dev = &t.rows[t.groups[(g - 18) * 2 + 1].first];
        assert_true(on->peak_bytes < dev->peak_bytes && on->host.activations > 0 && dev->host.activations == 0);
        assert_true(on->host_bytes == on->host.batch + on->host.activations);
    }
    /* ZeRO: each rank's moments a shard of stage 0's (rank 0: the ceiling
     * half), gradients and weights whole (docs/engine.md "ZeRO") */
    for (int g = 2; g < 6; g++) {
        const plan_row *z0 = &t.rows[t.groups[g % 2].first], *z = &t.rows[t.groups[g].first];
        assert_true(z->parts.optimizer * 2 >= z0->parts.optimizer && z->parts.optimizer * 2 <= z0->parts.optimizer + 16);
        assert_true(z->parts.gradients == z0->parts.gradients && z->parts.weights == z0->parts.weights);
        assert_true(z->peak_bytes < z0->peak_bytes);
    }
    for (int g = 0; g < t.ngroups; g++) {
        const plan_group *pg = &t.groups[g];
        assert_int_equal(pg->n, 4);
        for (int i = 0; i < 4; i++) {
            const plan_row *r = &t.rows[pg->first + i];
            assert_int_equal(r->micro_batch, ms[i]);
            assert_int_equal(r->accum_steps, 6 / ms[i]);
            assert_int_equal(r->recompute, pg->v.recompute);
            assert_true(parts_sum(&r->parts) == r->peak_bytes);
            assert_true(r->device_bytes == r->peak_bytes); /* CPU: nothing beyond */
            assert_true(r->parts.rounding == 0 && r->parts.runtime == 0);
            assert_true(r->fits == (r->peak_bytes <= plan_usable_bytes(budget)));
        }
        for (int i = pg->first; i < pg->first + pg->n; i++) /* best: the largest fitting m */
            if (t.rows[i].fits)
                assert_true(pg->best >= i);
    }
    /* the first group is the full fine-tune, stored: m = 2 is its largest fit */
    assert_false(t.groups[0].v.lora);
    assert_false(t.groups[0].v.recompute);
    assert_int_equal(t.rows[t.groups[0].best].micro_batch, 2);
    assert_true(t.groups[1].v.recompute);
    assert_true(t.rows[t.groups[1].best].micro_batch >= 2);
    /* ZeRO 1 stored holds less per rank: its largest fit is at least stage 0's */
    assert_true(t.rows[t.groups[2].best].micro_batch >= 2);
    /* "auto": the dry run starts at the largest fitting m of its own mode */
    assert_int_equal(t.recommended, t.groups[0].best);
    assert_int_equal(t.suggested, t.groups[0].best);
    char why[512];
    plan_row_why(&t.rows[t.groups[0].first + 2], &hw, why, sizeof why);
    assert_non_null(strstr(why, "exceeds"));
    plan_row_why(&t.rows[t.groups[0].first], &hw, why, sizeof why);
    assert_string_equal(why, "");
    plan_table_free(&t);

    /* a fixed micro batch is what the dry run starts with, fitting or not */
    s.micro_auto = false;
    s.micro_batch = 3;
    s.accum_steps = 2;
    assert_int_equal(plan_table_build(&s, &hw, &t, &err), 0);
    assert_int_equal(t.rows[t.recommended].micro_batch, 3);
    assert_false(t.rows[t.recommended].fits);
    assert_int_equal(t.rows[t.suggested].micro_batch, 2);
    assert_false(t.given_fits);
    assert_non_null(strstr(t.start_note, "oom.adapt is off"));
    plan_table_free(&t);

    /* with oom.adapt, a given micro batch that does
     * not fit starts at the largest that does, and the note says so */
    s.oom_adapt = true;
    assert_int_equal(plan_table_build(&s, &hw, &t, &err), 0);
    assert_int_equal(t.rows[t.recommended].micro_batch, 2);
    assert_true(t.rows[t.recommended].fits);
    assert_false(t.rows[t.recommended].recompute);
    assert_false(t.given_fits);
    assert_non_null(strstr(t.start_note, "train_micro_batch_size_per_gpu 3 does not fit"));
    assert_non_null(strstr(t.start_note, "starts at micro batch 2 x 3 accumulation steps"));
    plan_table_free(&t);
    s.oom_adapt = false;

    /* the batch keys as written, resolved again at
     * another world: the same rule and words as submit's */
    train_cfg w = s;
    w.given_batch = 12;
    w.given_micro = 3;
    w.given_accum = 2;
    assert_int_equal(plan_spec_at_world(&w, 2, &err), 0);
    assert_int_equal(w.micro_batch * w.accum_steps * w.devices, 12);
    assert_int_equal(plan_spec_at_world(&w, 4, &err), ACC_EINVAL);
    assert_string_equal(err.field, "train_batch_size");
    assert_string_equal(err.msg, "train_batch_size 12 != 3 * 2 * 4 (micro * accum * world)");
    w.given_accum = 0; /* B and m: a follows, when w divides */
    assert_int_equal(plan_spec_at_world(&w, 4, &err), 0); /* 12 = 3 x 1 x 4 */
    assert_int_equal(w.accum_steps, 1);
    assert_int_equal(plan_spec_at_world(&w, 3, &err), ACC_EINVAL);
    assert_string_equal(err.msg, "train_batch_size 12 is not divisible by 3 * 3 (micro * world)");

    /* B not a multiple of the hardware's devices: the field is hardware.devices */
    hw.devices = 5;
    assert_int_equal(plan_table_build(&s, &hw, &t, &err), ACC_EINVAL);
    assert_string_equal(err.field, "hardware.devices");
}

/* CUDA: the five allocations rounded as kern_cuda.cu's allocator does. */
static void test_cuda_parts(void **state)
{
    (void)state;
    assert_true(kern_cuda_alloc_size(0) == 512);
    assert_true(kern_cuda_alloc_size(1) == 512);
    assert_true(kern_cuda_alloc_size(513) == 1024);
    assert_true(kern_cuda_alloc_size((1 << 20) - 1) == 1 << 20);
    assert_true(kern_cuda_alloc_size(1 << 20) == 2 << 20);
    assert_true(kern_cuda_alloc_size((2 << 20) + 1) == 4 << 20);
    assert_true(kern_cuda_alloc_size(UINT64_MAX - 5) == UINT64_MAX);
    train_cfg s;
    llama_spec(&s, 4, 0, 0, 1);
    s.micro_auto = true;
    s.precision = SPEC_BF16;
    model_config cfg;
    acc_err err = {0};
    assert_int_equal(plan_model_config(&s, &cfg, &err), 0);
    plan_hw hw = {.kind = KERN_DEV_CUDA, .device_memory = 24ull << 30, .devices = 1};
    plan_table t;
    assert_int_equal(plan_table_build(&s, &hw, &t, &err), 0);
    for (int g = 0; g < t.ngroups; g++)
    for (int i = t.groups[g].first; i < t.groups[g].first + t.groups[g].n; i++) {
        const plan_row *r = &t.rows[i];
        const plan_parts *p = &r->parts;
        assert_true(parts_sum(p) == r->peak_bytes);
        if (t.groups[g].v.offload_param) /* slots, not the whole model (test_offload_param measures them) */
            continue;
        /* bf16 on CUDA: the activations and nothing for the linear layers'
         * operands (the full fine-tune's groups, whose model is cfg) */
        const plan_variant *v = &t.groups[g].v;
        if (!v->lora && !v->act_offload) {
            uint64_t acts = 0;
            assert_int_equal(model_act_bytes(&cfg, r->micro_batch, s.model.seq_len, r->recompute, &acts, &err), 0);
            assert_true(p->activations == acts && acts > 0);
        }
        uint64_t n = model_num_params(&cfg);
        if (!t.groups[g].v.lora) /* offloaded: the moments on the host */
            assert_true(p->weights == 4 * n && p->optimizer == (t.groups[g].v.offload_optimizer ? 0 : 8 * n));
        const uint64_t allocs[5] = {p->weights, p->gradients, p->optimizer / 2, p->optimizer / 2, p->activations};
        uint64_t round = 0;
        for (int k = 0; k < 5; k++) /* all small here: 512-byte blocks */
            round += (allocs[k] + 511) / 512 * 512 - allocs[k];
        assert_true(p->rounding == round);
        assert_true(p->runtime == 512ull << 20);
        assert_true(r->device_bytes == r->peak_bytes + round + (512ull << 20));
    }
    plan_table_free(&t);
}

/* Every row of the full fine-tune, run: measured peak == predicted. */
static void test_measured(void **state)
{
    (void)state;
    train_cfg s;
    llama_spec(&s, 4, 0, 0, 1);
    s.micro_auto = true;
    plan_hw hw = {.kind = KERN_DEV_CPU, .device_memory = 1ull << 30, .devices = 1};
    plan_table t;
    acc_err err = {0};
    assert_int_equal(plan_table_build(&s, &hw, &t, &err), 0);
    int checked = 0;
    for (int g = 0; g < t.ngroups; g++) {
        if (t.groups[g].v.zero_stage != 0)
            continue;
        for (int i = t.groups[g].first; i < t.groups[g].first + t.groups[g].n; i++) {
            const plan_row *r = &t.rows[i];
            train_cfg run;
            llama_spec(&run, 4, r->micro_batch, r->accum_steps, 1);
            run.activation_checkpointing = r->recompute;
            run.activation_offload = t.groups[g].v.act_offload;
            if (t.groups[g].v.lora) /* the table's default LoRA, as a spec section */
                run.lora = (spec_lora){.r = 16, .alpha = 32, .all_linear = true};
            run.model.quantize_nf4 = t.groups[g].v.qlora; /* the 4-bit base */
            run.offload_optimizer = t.groups[g].v.offload_optimizer; /* AdamW on the host */
            kern_device_info devs[1];
            fx_devices(devs, 1, hw.device_memory);
            train_hooks h = {0};
            trainer_opts o = {.spec = &run, .devices = devs, .threads_per_device = 1, .checkpoint_keep = 1};
            assert_int_equal(trainer_run_sync(&o, &h, &err), 0);
            print_message("%s m=%d recompute=%d: predicted %llu, measured %llu\n",
                          t.groups[g].v.qlora ? "qlora" : t.groups[g].v.lora ? "lora" : "full",
                          r->micro_batch, r->recompute,
                          (unsigned long long)r->peak_bytes, (unsigned long long)h.mem_peak[0]);
            assert_true(h.mem_peak[0] == r->peak_bytes);
            assert_true(parts_sum(&r->parts) == h.mem_peak[0]);
            /* the checkpoints and the offloaded optimizer in host memory */
            assert_true(h.host_peak == r->host.activations + r->host.optimizer);
            assert_true(h.host_optim[0] == r->host.optimizer);
            checked++;
        }
    }
    /* full, LoRA and QLoRA, m = 1, 2, 4, recompute off, on, on offloaded; optimizer offloaded or not */
    assert_int_equal(checked, 54);
    plan_table_free(&t);
}

/* LoRA rows: the default settings, the spec's own, GPT-2's. */
static void test_lora_rows(void **state)
{
    (void)state;
    train_cfg s;
    llama_spec(&s, 4, 0, 0, 1);
    s.micro_auto = true;
    plan_hw hw = {.kind = KERN_DEV_CPU, .device_memory = 1ull << 30, .devices = 1};
    plan_table t;
    acc_err err = {0};
    assert_int_equal(plan_table_build(&s, &hw, &t, &err), 0);
    /* all-linear on C 32, 2 heads of 16, 1 KV head, I 48: q 32+32, k 32+16,
     * v 32+16, o 32+32, gate 32+48, up 32+48, down 48+32 = 464 per rank-1
     * pair of A, B; x r 16 x 2 layers */
    const uint64_t trainable = 464 * 16 * 2;
    int lora_groups = 0;
    for (int g = 0; g < t.ngroups; g++) {
        if (!t.groups[g].v.lora)
            continue;
        lora_groups++;
        for (int i = t.groups[g].first; i < t.groups[g].first + t.groups[g].n; i++) {
            const plan_parts *p = &t.rows[i].parts;
            /* the adapters' moments, on the device or (offloaded) twice that on the host */
            assert_true(p->optimizer == (t.groups[g].v.offload_optimizer ? 0 : 8 * trainable));
            assert_true(t.rows[i].host.optimizer == (t.groups[g].v.offload_optimizer ? 16 * trainable : 0));
            assert_true(p->gradients >= 4 * trainable && p->gradients < 4 * trainable + 4096); /* + slots */
            assert_true(p->weights > 4 * trainable); /* the frozen base is there */
            assert_true(parts_sum(p) == t.rows[i].peak_bytes);
        }
    }
    assert_int_equal(lora_groups, 12); /* LoRA and QLoRA, recompute off, on, on offloaded; x optimizer offload */
    plan_table_free(&t);

    /* the spec's own section: its r; and its full rows drop it */
    s.lora = (spec_lora){.r = 4, .alpha = 8, .n_targets = 1};
    snprintf(s.lora.targets[0], sizeof s.lora.targets[0], "q_proj");
    assert_int_equal(plan_table_build(&s, &hw, &t, &err), 0);
    for (int g = 0; g < t.ngroups; g++) {
        if (t.groups[g].v.offload_param) /* the parameters on the host too: test_offload_param */
            continue;
        uint64_t opt = t.rows[t.groups[g].first].parts.optimizer;
        if (t.groups[g].v.offload_optimizer) /* on the host, twice the moments (adamw.h) */
            opt = t.rows[t.groups[g].first].host.optimizer / 2;
        if (t.groups[g].v.lora)
            assert_true(opt == 8ull * 4 * (32 + 32) * 2); /* q_proj only, r 4 */
        else
            assert_true(opt == 8 * t.rows[t.groups[g].first].parts.weights / 4); /* everything trains */
    }
    /* a LoRA spec's dry run starts in a LoRA group */
    assert_true(t.recommended >= 0 && t.groups[t.recommended_group].v.lora);
    plan_table_free(&t);

    /* GPT-2's Conv1D layers take adapters too: all-linear on C 32 is c_attn
     * 32+96, attn.c_proj 32+32, c_fc 32+128, mlp.c_proj 128+32 = 512 per
     * rank-1 pair; x r 16 x 2 layers */
    fx_tiny_spec(&s, text_path, 4, 0, 0, 1);
    s.micro_auto = true;
    assert_int_equal(plan_table_build(&s, &hw, &t, &err), 0);
    lora_groups = 0;
    for (int g = 0; g < t.ngroups; g++) {
        if (!t.groups[g].v.lora)
            continue;
        lora_groups++;
        const plan_row *r0 = &t.rows[t.groups[g].first];
        assert_true((t.groups[g].v.offload_optimizer ? r0->host.optimizer / 2 : r0->parts.optimizer) ==
                    8ull * 512 * 16 * 2);
    }
    assert_int_equal(lora_groups, 6);
    assert_int_equal(t.ngroups, 15); /* and the full fine-tune's three with the parameters offloaded */
    plan_table_free(&t);
}

/* A jobs manager as api_plan_compute reads it: config and devices. */
static void mgr(jobs_mgr *m, kern_device_info *devs, int n)
{
    memset(m, 0, sizeof *m);
    fx_devices(devs, n, 2ull << 30);
    m->conf = &conf;
    m->devs = devs;
    m->ndev = n;
}

static int plan(const char *body, json_t **out, acc_err *err)
{
    jobs_mgr m;
    kern_device_info devs[2];
    mgr(&m, devs, 2);
    memset(err, 0, sizeof *err);
    return api_plan_compute(&m, body, strlen(body), out, err);
}

#define SPEC7B "\"model\": {\"from\": \"llama2-7b\", \"seq_len\": 4096}, \"train_batch_size\": 8, " \
               "\"train_micro_batch_size_per_gpu\": \"auto\""

static void test_config_only(void **state)
{
    (void)state;
    /* the submit path needs the weights: refused, naming model.from */
    const char *spec = "{" SPEC7B ", \"data\": {\"train\": \"x\"}}";
    job_spec *js = malloc(sizeof *js);
    train_cfg *s = malloc(sizeof *s);
    acc_err err = {0};
    assert_int_equal(job_spec_parse(spec, strlen(spec), &conf, js, &err), ACC_EINVAL);
    assert_string_equal(err.field, "model.from");
    assert_non_null(strstr(err.msg, "safetensors"));
    /* the planner reads config.json only, and needs no data */
    const char *pspec = "{" SPEC7B "}";
    memset(&err, 0, sizeof err);
    assert_int_equal(job_spec_parse_plan(pspec, strlen(pspec), &conf, js, &err), 0);
    job_spec_train_cfg(js, s);
    free(js);
    model_config cfg;
    assert_int_equal(plan_model_config(s, &cfg, &err), 0);
    assert_true(model_num_params(&cfg) == LLAMA2_7B_PARAMS);
    assert_int_equal(s->model.seq_len, 4096);
    free(s);

    json_t *out = NULL;
    assert_int_equal(plan("{" SPEC7B ", \"hardware\": {\"device_memory\": \"24GiB\", \"devices\": 1, "
                          "\"kind\": \"cuda\"}}",
                          &out, &err),
                     0);
    json_t *sum = json_object_get(out, "summary");
    assert_false(json_is_true(json_object_get(sum, "fits")));
    /* no full fine-tune fits (16 bytes a parameter); LoRA keeps the frozen
     * base in the checkpoint's 16-bit dtype (2 bytes a parameter), so with
     * recomputation one 4096-token sequence fits: the suggestion */
    json_t *sug = json_object_get(sum, "suggested");
    assert_true(json_is_object(sug));
    assert_string_equal(json_string_value(json_object_get(sug, "mode")), "lora");
    assert_true(json_is_true(json_object_get(sug, "recompute")));
    assert_int_equal(json_integer_value(json_object_get(sug, "micro_batch")), 1);
    assert_true(json_is_true(json_object_get(sug, "fits")));
    json_t *lora = json_object_get(out, "lora");
    assert_int_equal(json_integer_value(json_object_get(lora, "r")), 16);
    assert_int_equal(json_array_size(json_object_get(lora, "target_modules")), 7);
    /* 7 modules x 32 layers x r 16 x (in + out) */
    assert_true(json_integer_value(json_object_get(lora, "trainable_params")) ==
                32 * 16 * ((4096 + 4096) * 4 + (4096 + 11008) * 3));
    size_t i;
    json_t *g;
    json_array_foreach(json_object_get(out, "groups"), i, g) {
        if (strcmp(json_string_value(json_object_get(g, "mode")), "full") != 0 ||
            json_is_true(json_object_get(g, "offload_param"))) /* the slots alone on the card */
            continue;
        assert_true(json_is_null(json_object_get(g, "largest_fitting_micro_batch")));
        const char *why = json_string_value(json_object_get(g, "why_not"));
        assert_non_null(why);
        /* the optimizer offloaded: the fp32 weights and gradients stay, 8 bytes a parameter */
        assert_non_null(strstr(why, json_is_true(json_object_get(g, "offload_optimizer"))
                                        ? "model state 50.2 GiB alone (weights 25.1 + gradients 25.1 + optimizer 0.0)"
                                        : "model state 100.4 GiB alone"));
    }
    json_t *r0 = json_array_get(json_object_get(out, "rows"), 0);
    /* 16 bytes a parameter before activations: fp32 weights, gradients, two moments */
    assert_true((uint64_t)json_integer_value(json_object_get(r0, "weights_bytes")) == 4 * LLAMA2_7B_PARAMS);
    assert_true((uint64_t)json_integer_value(json_object_get(r0, "optimizer_bytes")) == 8 * LLAMA2_7B_PARAMS);
    assert_true((uint64_t)json_integer_value(json_object_get(r0, "gradients_bytes")) >= 4 * LLAMA2_7B_PARAMS);
    json_decref(out);

    /* 141 GiB: the full fine-tune fits (micro batch 1 with recomputation at least) */
    assert_int_equal(plan("{" SPEC7B ", \"hardware\": {\"device_memory\": \"141GiB\", \"devices\": 1, "
                          "\"kind\": \"cuda\"}}",
                          &out, &err),
                     0);
    sum = json_object_get(out, "summary");
    json_t *pick = json_is_true(json_object_get(sum, "fits")) ? json_object_get(sum, "recommended")
                                                              : json_object_get(sum, "suggested");
    assert_true(json_is_object(pick));
    assert_string_equal(json_string_value(json_object_get(pick, "mode")), "full");
    assert_true(json_is_true(json_object_get(pick, "fits")));
    json_decref(out);
}

/* One spec's table in fp32 and in bf16 on devices of `kind`: row for row
 * (the same variants and micro batches) bf16's activations and its whole
 * accounted peak are below fp32's; its device bytes are at most fp32's
 * (the state's allocations are the same in both, and the allocator's
 * rounding never takes a smaller allocation past a larger one's block, so
 * two rows may round to the same bytes: <=, not <), and so is every row
 * that fits in fp32 fits in bf16. */
static int bf16_below_fp32(const train_cfg *spec, kern_dev_kind kind)
{
    train_cfg s32 = *spec, s16 = *spec;
    s32.precision = SPEC_FP32;
    s16.precision = SPEC_BF16;
    plan_hw hw = {.kind = kind, .device_memory = 24ull << 30, .devices = 1};
    plan_table t32, t16;
    acc_err err = {0};
    assert_int_equal(plan_table_build(&s32, &hw, &t32, &err), 0);
    assert_int_equal(plan_table_build(&s16, &hw, &t16, &err), 0);
    assert_int_equal(t32.nrows, t16.nrows);
    for (int i = 0; i < t32.nrows; i++) {
        const plan_row *a = &t32.rows[i], *b = &t16.rows[i];
        assert_int_equal(a->micro_batch, b->micro_batch);
        assert_int_equal(a->recompute, b->recompute);
        /* host checkpoints (on+host rows): bf16 keeps them in bf16 but the
         * embedding's output (docs/engine.md), below fp32's for L >= 2 */
        if (!(b->host.activations <= a->host.activations) ||
            (a->host.activations > 0 && !(b->host.activations < a->host.activations)))
            fail_msg("row %d (m %d): bf16 host checkpoints %llu, fp32 %llu", i, a->micro_batch,
                     (unsigned long long)b->host.activations, (unsigned long long)a->host.activations);
        /* every row, on+host ones included (there bf16 saves half a row of
         * N x C on the device: one fp32 row + its bf16 staging vs two fp32
         * slots); CUDA's bf16 linear layers add nothing (no operand buffers) */
        if (!(b->parts.activations < a->parts.activations) || !(b->peak_bytes < a->peak_bytes) ||
            !(b->device_bytes <= a->device_bytes) || (a->fits && !b->fits))
            fail_msg("row %d (m %d, recompute %d, host checkpoints %llu): bf16 activations %llu, peak %llu, "
                     "device %llu; fp32 %llu, %llu, %llu",
                     i, a->micro_batch, a->recompute, (unsigned long long)a->host.activations,
                     (unsigned long long)b->parts.activations, (unsigned long long)b->peak_bytes,
                     (unsigned long long)b->device_bytes, (unsigned long long)a->parts.activations,
                     (unsigned long long)a->peak_bytes, (unsigned long long)a->device_bytes);
    }
    int n = t32.nrows;
    plan_table_free(&t32);
    plan_table_free(&t16);
    return n;
}

/* bf16 stores activations in bf16 (blocks.h) and its linear layers take
 * no device memory on any backend (kern_device.h set_precision): for
 * every LLaMA config of these tests, every row of the table (full, LoRA,
 * QLoRA; ZeRO; stored, recompute and recompute with host checkpoints;
 * every m), plain and lean, on CPU and on CUDA devices alike, bf16's whole
 * peak is below fp32's, its device bytes at most fp32's, and its host
 * checkpoints below fp32's. */
static void test_bf16_below_fp32(void **state)
{
    (void)state;
    train_cfg tiny;
    llama_spec(&tiny, 12, 0, 0, 1);
    tiny.micro_auto = true;
    const char *pspec = "{" SPEC7B "}";
    job_spec *js = malloc(sizeof *js);
    train_cfg *big = malloc(sizeof *big);
    acc_err err = {0};
    assert_int_equal(job_spec_parse_plan(pspec, strlen(pspec), &conf, js, &err), 0);
    job_spec_train_cfg(js, big);
    free(js);
    int rows = 0;
    for (int lean = 0; lean <= 1; lean++) {
        tiny.lean_activations = big->lean_activations = lean;
        rows += bf16_below_fp32(&tiny, KERN_DEV_CPU);
        rows += bf16_below_fp32(&tiny, KERN_DEV_CUDA);
        rows += bf16_below_fp32(big, KERN_DEV_CPU);
        rows += bf16_below_fp32(big, KERN_DEV_CUDA);
    }
    print_message("bf16 below fp32 in %d rows\n", rows);
    assert_true(rows > 100);
    free(big);
}

static void expect_field(const char *body, const char *field)
{
    json_t *out = NULL;
    acc_err err;
    int rc = plan(body, &out, &err);
    if (rc != ACC_EINVAL || strcmp(err.field, field) != 0)
        fail_msg("%s: rc %d field '%s' (%s), wanted %s", body, rc, err.field, err.msg, field);
    json_decref(out);
}

static void test_bad_input(void **state)
{
    (void)state;
    expect_field("{" SPEC7B ", \"hardware\": {\"device_memory\": \"24XB\"}}", "hardware.device_memory");
    expect_field("{" SPEC7B ", \"hardware\": {\"device_memory\": \"12\"}}", "hardware.device_memory");
    expect_field("{" SPEC7B ", \"hardware\": {\"device_memory\": -5}}", "hardware.device_memory");
    expect_field("{" SPEC7B ", \"hardware\": {\"device_memory\": true}}", "hardware.device_memory");
    expect_field("{" SPEC7B ", \"hardware\": {\"devices\": 0}}", "hardware.devices");
    expect_field("{" SPEC7B ", \"hardware\": {\"devices\": \"4\"}}", "hardware.devices");
    expect_field("{" SPEC7B ", \"hardware\": {\"devices\": 1000}}", "hardware.devices");
    /* 8 % 3: the batch keys resolved at hardware.devices as submit would (issue 23) */
    expect_field("{" SPEC7B ", \"hardware\": {\"devices\": 3}}", "train_batch_size");
    expect_field("{" SPEC7B ", \"hardware\": {\"kind\": \"tpu\"}}", "hardware.kind");
    expect_field("{" SPEC7B ", \"hardware\": {\"memory\": \"24G\"}}", "hardware");
    expect_field("{" SPEC7B ", \"hardware\": [1]}", "hardware");
    /* the spec's devices stand for hardware.devices, within a job's limit */
    expect_field("{\"model\": {\"from\": \"llama2-7b\"}, \"train_batch_size\": 64, \"devices\": 32}", "devices");
    /* no CUDA device here and no size given */
    expect_field("{" SPEC7B ", \"hardware\": {\"kind\": \"cuda\"}}", "hardware.device_memory");
    /* the spec's own errors keep their fields */
    expect_field("{" SPEC7B ", \"bogus\": 1}", "bogus");
    expect_field("{\"model\": {\"from\": \"nowhere\"}, \"train_batch_size\": 8}", "model.from");
    expect_field("{\"model\": {\"from\": \"llama2-7b\", \"seq_len\": 8192}, \"train_batch_size\": 8}",
                 "model.seq_len");
    /* without hardware: this machine's devices (two CPU devices of 2 GiB), the spec's w */
    json_t *out = NULL;
    acc_err err;
    assert_int_equal(plan("{" SPEC7B "}", &out, &err), 0);
    json_t *hw = json_object_get(out, "hardware");
    assert_string_equal(json_string_value(json_object_get(hw, "kind")), "cpu");
    assert_true(json_integer_value(json_object_get(hw, "device_memory_bytes")) == (json_int_t)(2ull << 30));
    assert_int_equal(json_integer_value(json_object_get(hw, "devices")), 1);
    json_decref(out);
}

/* LLaMA-2-7B's config.json at seq 4096, batch B, bf16: the table on
 * `devices` CUDA cards of 24 GiB (host memory unlimited: each row states
 * its own). */
static void plan_7b_batch(bool lean, int devices, int B, const char *extra, plan_table *t)
{
    char spec[768];
    snprintf(spec, sizeof spec,
             "{\"model\": {\"from\": \"llama2-7b\", \"seq_len\": 4096}, \"train_batch_size\": %d, "
             "\"train_micro_batch_size_per_gpu\": \"auto\", \"precision\": \"bf16\", \"lean_activations\": %s%s}",
             B, lean ? "true" : "false", extra);
    job_spec *js = malloc(sizeof *js);
    train_cfg *s = malloc(sizeof *s);
    acc_err err = {0};
    if (job_spec_parse_plan(spec, strlen(spec), &conf, js, &err) != 0)
        fail_msg("%s: %s (%s)", spec, err.msg, err.field);
    job_spec_train_cfg(js, s);
    assert_true(s->precision == SPEC_BF16 && s->lean_activations == lean && s->train_batch_size == B);
    plan_hw hw = {.kind = KERN_DEV_CUDA, .device_memory = 24ull << 30, .devices = devices};
    assert_int_equal(plan_table_build(s, &hw, t, &err), 0);
    free(js);
    free(s);
}

/* LLaMA-2-7B's model config for the planner at ZeRO-3 with the optimizer
 * offloaded, bf16, on `devices` ranks. */
static void cfg_7b(int devices, model_config *cfg)
{
    char spec[512];
    snprintf(spec, sizeof spec,
             "{\"model\": {\"from\": \"llama2-7b\", \"seq_len\": 4096}, \"train_batch_size\": 16, "
             "\"precision\": \"bf16\", \"devices\": %d, \"zero_optimization\": {\"stage\": 3, "
             "\"offload_optimizer\": {\"device\": \"cpu\"}}}",
             devices);
    job_spec *js = malloc(sizeof *js);
    train_cfg *s = malloc(sizeof *s);
    acc_err err = {0};
    assert_true(js != NULL && s != NULL);
    if (job_spec_parse_plan(spec, strlen(spec), &conf, js, &err) != 0)
        fail_msg("%s: %s (%s)", spec, err.msg, err.field);
    job_spec_train_cfg(js, s);
    assert_int_equal(plan_model_config(s, cfg, &err), 0);
    free(js);
    free(s);
}

/* The same at B 32, as issue 20 asks the planner. */
static void plan_7b(bool lean, int devices, const char *extra, plan_table *t)
{
    plan_7b_batch(lean, devices, 32, extra, t);
}

/* The group of variant v in t (-1: none). */
static int group_of(const plan_table *t, plan_variant v)
{
    for (int g = 0; g < t->ngroups; g++) {
        const plan_variant *w = &t->groups[g].v;
        if (w->lora == v.lora && w->qlora == v.qlora && w->zero_stage == v.zero_stage &&
            w->recompute == v.recompute && w->act_offload == v.act_offload &&
            w->offload_optimizer == v.offload_optimizer && w->offload_param == v.offload_param)
            return g;
    }
    return -1;
}

static double gib_of(uint64_t b) { return (double)b / (double)(1ull << 30); }

#define GIB(x) ((uint64_t)((x) * (double)(1ull << 30)))

/* Issue 20's planner acceptance, the figures the planner now answers:
 *   (a) one 24 GiB card: LoRA fits at m 1 without optimizer offload in at
 *       most 17 GiB (lean activations, recomputation from checkpoints in
 *       host memory);
 *   (b) one 24 GiB card, full fine-tune with the optimizer offloaded: the
 *       fp32 weights and gradients stay on the card (no ZeRO-3 on one
 *       device, no parameter offload yet), so it does not fit;
 *   (c) four 24 GiB cards: a full fine-tune fits with ZeRO-3 and the
 *       optimizer offloaded, and the suggestion is the first such row in
 *       the order of least change;
 *   (d) the README's spec (B 16, not lean) on four 24 GiB cards: the full
 *       fine-tune with ZeRO-3 and the optimizer offloaded fits at m 1 with
 *       recomputation, the partition's matrices being bf16 on the device
 *       (model_config.partition_bf16).
 * Each bound is compared with the planner's computed bytes. */
static void test_llama2_7b_24gib(void **state)
{
    (void)state;
    const uint64_t usable = plan_usable_bytes(24ull << 30);
    plan_table t;

    /* (a) LoRA, m 1, no optimizer offload, lean activations */
    plan_7b(true, 1, "", &t);
    static const struct { bool rec, host; } modes[] = {{false, false}, {true, false}, {true, true}};
    uint64_t best = UINT64_MAX;
    for (size_t k = 0; k < sizeof modes / sizeof modes[0]; k++) {
        int g = group_of(&t, (plan_variant){.lora = true, .recompute = modes[k].rec, .act_offload = modes[k].host});
        assert_true(g >= 0);
        const plan_row *r = &t.rows[t.groups[g].first];
        assert_int_equal(r->micro_batch, 1);
        assert_int_equal(r->accum_steps, 32);
        print_message("(a) lora m 1 recompute %s: device %.2f GiB (%llu), fits %d, host %.2f GiB\n",
                      modes[k].host ? "on+host" : modes[k].rec ? "on" : "off", gib_of(r->device_bytes),
                      (unsigned long long)r->device_bytes, r->fits, gib_of(r->host_bytes));
        if (r->fits && r->device_bytes < best)
            best = r->device_bytes;
    }
    /* recomputing with the checkpoints on the card: no offload of any kind */
    int gon = group_of(&t, (plan_variant){.lora = true, .recompute = true});
    const plan_row *a = &t.rows[t.groups[gon].first];
    assert_true(a->fits && a->device_bytes <= GIB(17)); /* the bound */
    assert_true(a->host.activations == 0 && a->host.optimizer == 0);
    /* from checkpoints in host memory: the leanest way, under the bound too */
    int ga = group_of(&t, (plan_variant){.lora = true, .recompute = true, .act_offload = true});
    const plan_row *ah = &t.rows[t.groups[ga].first];
    assert_true(ah->fits && ah->device_bytes < a->device_bytes && ah->device_bytes == best);
    assert_true(ah->host.activations > 0 && ah->host.optimizer == 0);
    /* stored activations (no recomputation) at m 1: over the card */
    int goff = group_of(&t, (plan_variant){.lora = true});
    assert_false(t.rows[t.groups[goff].first].fits);

    /* (b) one card, full fine-tune, the optimizer offloaded: the smallest
     * row (m 1, recompute from host checkpoints) still does not fit */
    int gb = group_of(&t, (plan_variant){.recompute = true, .act_offload = true, .offload_optimizer = true});
    assert_true(gb >= 0);
    const plan_row *b = &t.rows[t.groups[gb].first];
    assert_int_equal(b->micro_batch, 1);
    for (int g = 0; g < t.ngroups; g++) /* no full fine-tune fits short of offloading the parameters */
        if (!t.groups[g].v.lora && !t.groups[g].v.offload_param)
            assert_int_equal(t.groups[g].best, -1);
    assert_false(b->fits);
    assert_true(b->device_bytes > GIB(20) && b->device_bytes > usable);
    assert_int_equal(b->parts.optimizer, 0);
    assert_true(b->parts.weights == 4 * LLAMA2_7B_PARAMS); /* the fp32 parameters stay */
    assert_true(b->host.optimizer == 16 * LLAMA2_7B_PARAMS); /* moments, master copy, gradients' copy */
    print_message("(b) full+offload 1 card m 1 on+host: device %.2f GiB (%llu), %.2f GiB over the 20 GiB target, "
                  "%.2f GiB over the %.2f GiB usable; host %.2f GiB\n",
                  gib_of(b->device_bytes), (unsigned long long)b->device_bytes, gib_of(b->device_bytes - GIB(20)),
                  gib_of(b->device_bytes - usable), gib_of(usable), gib_of(b->host_bytes));
    /* the suggestion stays the least change: LoRA recomputing on the card */
    assert_true(t.suggested_group == gon);
    /* (b') one card, full fine-tune: ZeRO-3 with the parameters and the
     * optimizer in host memory fits, within the 20 GiB target */
    int gp = group_of(&t, (plan_variant){.zero_stage = 3, .recompute = true, .offload_optimizer = true,
                                         .offload_param = true});
    assert_true(gp >= 0 && t.groups[gp].best >= 0);
    const plan_row *bp = &t.rows[t.groups[gp].best], *bp1 = &t.rows[t.groups[gp].first];
    assert_true(bp->fits && bp->device_bytes <= GIB(20) && bp1->device_bytes <= GIB(8));
    assert_true(bp->host.params >= 8 * LLAMA2_7B_PARAMS); /* the fp32 parameter and gradient partitions */
    print_message("(b') full ZeRO-3 + parameter and optimizer offload, 1 card, recompute: m 1 %.2f GiB (%llu); "
                  "largest fitting m %d x a %d: %.2f GiB (%llu); host %.2f GiB (params %.2f, optimizer %.2f)\n",
                  gib_of(bp1->device_bytes), (unsigned long long)bp1->device_bytes, bp->micro_batch, bp->accum_steps,
                  gib_of(bp->device_bytes), (unsigned long long)bp->device_bytes, gib_of(bp->host_bytes),
                  gib_of(bp->host.params), gib_of(bp->host.optimizer));
    plan_table_free(&t);

    /* (c) four cards: ZeRO-3 with the optimizer offloaded fits a full fine-tune */
    plan_7b(true, 4, "", &t);
    int first_full = -1;
    for (int g = 0; g < t.ngroups && first_full < 0; g++)
        if (!t.groups[g].v.lora && t.groups[g].best >= 0)
            first_full = g;
    assert_true(first_full >= 0);
    const plan_variant *v = &t.groups[first_full].v;
    assert_true(v->zero_stage == 3 && v->offload_optimizer);
    for (int g = 0; g < t.ngroups; g++) /* and nothing short of it does */
        if (!t.groups[g].v.lora && !(t.groups[g].v.zero_stage == 3 && t.groups[g].v.offload_optimizer))
            assert_int_equal(t.groups[g].best, -1);
    assert_false(v->offload_param); /* four cards need not offload the parameters */
    const plan_row *c = &t.rows[t.groups[first_full].best];
    assert_true(c->fits && c->device_bytes <= usable);
    /* per rank: a quarter of the moments and master copy; the gradients'
     * copy is the host gradient partition (host.params, with its staging) */
    assert_true(c->host.optimizer * 4 >= 12 * LLAMA2_7B_PARAMS && c->host.optimizer * 4 <= 12 * LLAMA2_7B_PARAMS + 256);
    assert_true(c->host.params * 3 >= c->host.optimizer && c->host.params * 3 <= c->host.optimizer + 3 * (1ull << 30));
    print_message("(c) 4 cards full ZeRO-3+offload recompute %s: m %d x a %d, device %.2f GiB (%llu); host per rank "
                  "%.2f GiB (optimizer %.2f, activations %.2f, batch %llu B), job %.2f GiB\n",
                  v->act_offload ? "on+host" : v->recompute ? "on" : "off", c->micro_batch, c->accum_steps,
                  gib_of(c->device_bytes), (unsigned long long)c->device_bytes, gib_of(c->host_bytes),
                  gib_of(c->host.optimizer), gib_of(c->host.activations), (unsigned long long)c->host.batch,
                  gib_of(plan_row_job_host_bytes(c, 4)));
    uint64_t c_device = c->device_bytes;
    int c_group = first_full;
    plan_table_free(&t);

    /* the spec asking for it: the dry run starts in that group, where it fits */
    plan_7b(true, 4,
            ", \"devices\": 4, \"activation_checkpointing\": true, \"zero_optimization\": {\"stage\": 3, "
            "\"offload_optimizer\": {\"device\": \"cpu\"}}",
            &t);
    assert_int_equal(t.recommended_group, c_group);
    assert_true(t.rows[t.recommended].fits && t.rows[t.recommended].device_bytes == c_device);
    plan_table_free(&t);

    /* (d) B 16, not lean, four cards: ZeRO-3 + offload_optimizer recomputing on the card */
    plan_7b_batch(false, 4, 16, "", &t);
    int gd = group_of(&t, (plan_variant){.zero_stage = 3, .recompute = true, .offload_optimizer = true});
    int gn = group_of(&t, (plan_variant){.zero_stage = 3, .recompute = true});
    assert_true(gd >= 0 && gn >= 0 && t.groups[gd].best >= 0);
    const plan_row *d = &t.rows[t.groups[gd].first], *dn = &t.rows[t.groups[gn].first];
    assert_true(d->micro_batch == 1 && dn->micro_batch == 1);
    assert_true(d->fits && d->device_bytes <= usable);
    /* the partition's weights: rank 0's quarter of the 32 blocks' 202,375,168
     * matrix values at 2 bytes instead of the fp32 partition's 4 (the
     * optimizer on the card keeps it fp32); the gradient partition (rank
     * 0's pn floats) in host memory with the optimizer */
    model_config c7;
    model_shard_sizes z7;
    cfg_7b(4, &c7);
    assert_int_equal(model_shard_sizes_of(&c7, 0, 4, &z7, NULL), 0);
    assert_true(c7.grads_host && c7.partition_bf16);
    assert_true(dn->parts.weights - d->parts.weights == 2ull * 32 * 202375168 / 4);
    assert_true(dn->parts.gradients - d->parts.gradients == 4 * (uint64_t)z7.pn && d->parts.optimizer == 0);
    assert_true(d->host.params == 4 * ((uint64_t)z7.pn + z7.slice));
    /* storing the activations (no recomputation) still does not fit */
    int gs = group_of(&t, (plan_variant){.zero_stage = 3, .offload_optimizer = true});
    assert_true(gs >= 0 && t.groups[gs].best == -1);
    const plan_row *db = &t.rows[t.groups[gd].best];
    /* without the 8 GiB gradient partition: m 1 at 14.87 GiB (21.15 with it
     * on the card), and m 2 fits too (m 4 does not) */
    assert_true(d->device_bytes < GIB(15));
    assert_true(db->micro_batch == 2 && db->accum_steps == 2 && db->fits);    print_message("(d) B 16 not lean, 4 cards, full ZeRO-3+offload recompute on: m 1 device %.2f GiB (%llu), "
                  "weights %.2f GiB (the fp32 partition's: %.2f GiB), gradients %.2f GiB (on the device: %.2f GiB); "
                  "largest fitting m %d x a %d: device %.2f GiB (%llu); host per rank %.2f GiB\n",
                  gib_of(d->device_bytes), (unsigned long long)d->device_bytes, gib_of(d->parts.weights),
                  gib_of(dn->parts.weights), gib_of(d->parts.gradients), gib_of(dn->parts.gradients),
                  db->micro_batch, db->accum_steps, gib_of(db->device_bytes), (unsigned long long)db->device_bytes,
                  gib_of(db->host_bytes));
    plan_table_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_enumeration), cmocka_unit_test(test_cuda_parts), cmocka_unit_test(test_measured),
        cmocka_unit_test(test_lora_rows),
        cmocka_unit_test(test_config_only), cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_bf16_below_fp32), cmocka_unit_test(test_llama2_7b_24gib),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
