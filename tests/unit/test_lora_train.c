/* LoRA through the trainer (arch "llama", GQA; model_lora.h):
 *   - the spec's targets against the model: a module the model does not
 *     have names lora.target_modules[i]; the gpt2 family names lora;
 *   - the layout: adapters first (PEFT's names, [r, in] and [out, r]), the
 *     base frozen after them; state bytes are parameters + the adapters'
 *     gradients only, moments for the adapters only;
 *   - the planner predicts a rank's peak to the byte (stored / recompute,
 *     fp32 / bf16, two target sets, two micro batches);
 *   - training moves the adapters and leaves every frozen float bit-for-bit
 *     as it was; the split (m, a, w) does not change the losses;
 *   - checkpoints are PEFT adapter directories (+ merged/ with merge_lora),
 *     and resume is exact. */
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
#include "fsutil.h"
#include "mem_plan.h"
#include "model.h"
#include "model_hf.h"
#include "trainer_run.h"

#define BATCH 8

static char text_path[64];
static char root[64];

static int setup(void **state)
{
    (void)state;
    fx_write_text(text_path, sizeof text_path, 20000);
    snprintf(root, sizeof root, "/tmp/accumd-lora-XXXXXX");
    return mkdtemp(root) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    unlink(text_path);
    return fsu_rm_rf(root, NULL);
}

static void lora_spec(job_spec *s, int B, int m, int a, int w, bool all_linear)
{
    fx_tiny_spec(s, text_path, B, m, a, w);
    snprintf(s->model.arch, sizeof s->model.arch, "llama");
    s->model.n_kv_head = 1;
    s->model.intermediate_size = 48;
    s->max_steps = 4;
    s->optim.lr = 1e-2;
    s->lora = (spec_lora){.r = 4, .alpha = 8, .all_linear = all_linear};
    if (!all_linear) {
        s->lora.n_targets = 2;
        snprintf(s->lora.targets[0], SPEC_LORA_NAME_MAX, "q_proj");
        snprintf(s->lora.targets[1], SPEC_LORA_NAME_MAX, "down_proj");
    }
}

typedef struct run_out {
    double loss[8];
    float *params;
    train_hooks h;
} run_out;

static void run(const job_spec *s, run_out *r)
{
    kern_device_info devs[4];
    fx_devices(devs, s->devices, 1ull << 30);
    memset(r, 0, sizeof *r);
    size_t cap = 1 << 20;
    r->params = calloc(cap, sizeof(float));
    assert_non_null(r->params);
    r->h.steps_cap = 8;
    r->h.step_loss = r->loss;
    r->h.final_params = r->params;
    r->h.final_params_cap = cap;
    trainer_opts o = {.spec = s, .devices = devs, .threads_per_device = 1, .checkpoint_keep = 2};
    acc_err err = {0};
    int rc = trainer_run_sync(&o, &r->h, &err);
    if (rc != 0)
        fail_msg("run failed: %s (field %s)", err.msg, err.field);
    assert_int_equal(r->h.steps_done, s->max_steps);
}

static void test_targets(void **state)
{
    (void)state;
    job_spec s;
    model_config cfg;
    acc_err err = {0};
    lora_spec(&s, BATCH, 8, 1, 1, false);
    snprintf(s.lora.targets[1], SPEC_LORA_NAME_MAX, "c_attn");
    assert_int_equal(plan_model_config(&s, &cfg, &err), ACC_EINVAL);
    assert_string_equal(err.field, "lora.target_modules[1]");
    lora_spec(&s, BATCH, 8, 1, 1, true);
    snprintf(s.model.arch, sizeof s.model.arch, "gpt2");
    assert_int_equal(plan_model_config(&s, &cfg, &err), ACC_EINVAL);
    assert_string_equal(err.field, "lora");
    /* no list: PEFT's LLaMA default */
    lora_spec(&s, BATCH, 8, 1, 1, false);
    s.lora.n_targets = 0;
    assert_int_equal(plan_model_config(&s, &cfg, &err), 0);
    assert_int_equal(cfg.lora.n_targets, 2);
    assert_string_equal(cfg.lora.targets[0], "q_proj");
    assert_string_equal(cfg.lora.targets[1], "v_proj");
    /* all-linear: the seven projections */
    lora_spec(&s, BATCH, 8, 1, 1, true);
    assert_int_equal(plan_model_config(&s, &cfg, &err), 0);
    assert_int_equal(cfg.lora.n_targets, 7);
    model_layout l;
    assert_int_equal(model_layout_build(&cfg, &l, &err), 0);
    const model_tensor *a = model_layout_find(&l, "base_model.model.model.layers.1.mlp.down_proj.lora_A.weight");
    const model_tensor *b = model_layout_find(&l, "base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight");
    assert_non_null(a);
    assert_non_null(b);
    assert_true(a->shape[0] == 4 && a->shape[1] == 48 && a->trains && a->adapter);
    assert_true(b->shape[0] == 16 && b->shape[1] == 4); /* one KV head of 16 */
    size_t adapters = 0;
    for (int i = 0; i < l.n; i++) {
        const model_tensor *t = &l.t[i];
        assert_true(t->trains == t->adapter && t->trains == (t->offset < l.ntrain));
        adapters += t->adapter ? t->count : 0;
    }
    assert_int_equal(adapters, l.ntrain);
    /* 2 layers x (q, k, v, o, gate, up, down) x r (in + out) */
    assert_int_equal(l.ntrain, 2 * 4 * ((32 + 32) + (32 + 16) * 2 + (32 + 32) + (32 + 48) * 2 + (48 + 32)));
    uint64_t st;
    assert_int_equal(model_state_bytes(&cfg, 16, &st, &err), 0);
    assert_true(st == ((uint64_t)l.nparams + l.ntrain + 16) * sizeof(float));
    model_layout_free(&l);
}

static void test_planner_exact(void **state)
{
    (void)state;
    for (int mode = 0; mode < 8; mode++) {
        int rec = mode & 1, bf16 = (mode >> 1) & 1, all = (mode >> 2) & 1, m = 1 + rec + all;
        job_spec s, full;
        lora_spec(&s, m * 2, m, 2, 1, all);
        s.activation_checkpointing = rec;
        s.precision = bf16 ? SPEC_BF16 : SPEC_FP32;
        s.max_steps = 1;
        full = s;
        full.lora.r = 0;
        uint64_t pred = 0, pred_full = 0;
        acc_err err = {0};
        assert_int_equal(plan_device_bytes(&s, m, rec, &pred, &err), 0);
        assert_int_equal(plan_device_bytes(&full, m, rec, &pred_full, &err), 0);
        run_out r;
        run(&s, &r);
        print_message("%s m=%d recompute=%d %s: predicted %llu, peak %llu (full fine-tune %llu)\n",
                      all ? "all-linear" : "q+down", m, rec, bf16 ? "bf16" : "fp32",
                      (unsigned long long)pred, (unsigned long long)r.h.mem_peak[0],
                      (unsigned long long)pred_full);
        assert_true(pred == r.h.mem_peak[0]);
        assert_true(pred < pred_full);
        free(r.params);
    }
}

static void test_frozen_and_split(void **state)
{
    (void)state;
    job_spec s;
    run_out init, a, b;
    lora_spec(&s, BATCH, 8, 1, 1, true);
    s.max_steps = 0;
    run(&s, &init);
    s.max_steps = 4;
    run(&s, &a);
    lora_spec(&s, BATCH, 2, 2, 2, true);
    run(&s, &b);
    model_config cfg;
    acc_err err = {0};
    assert_int_equal(plan_model_config(&s, &cfg, &err), 0);
    size_t ntrain = model_num_trainable(&cfg), n = a.h.nparams;
    assert_true(ntrain > 0 && ntrain < n);
    /* every frozen float bit for bit; the adapters moved */
    assert_memory_equal(init.params + ntrain, a.params + ntrain, (n - ntrain) * sizeof(float));
    assert_memory_equal(init.params + ntrain, b.params + ntrain, (n - ntrain) * sizeof(float));
    assert_true(fx_rel_diff(init.params, a.params, ntrain) > 1e-3);
    for (int k = 0; k < 4; k++)
        assert_true(fabs(a.loss[k] - b.loss[k]) <= 1e-5 * fabs(a.loss[k]));
    assert_true(fx_rel_diff(b.params, a.params, n) <= 1e-5);
    assert_true(a.loss[3] < a.loss[0]);
    print_message("lora losses %.5f -> %.5f; %zu of %zu floats train\n", a.loss[0], a.loss[3],
                  ntrain, n);
    free(init.params);
    free(a.params);
    free(b.params);
}

static void test_resume_and_outputs(void **state)
{
    (void)state;
    char full[128], part[128], p[400];
    snprintf(full, sizeof full, "%s/full", root);
    snprintf(part, sizeof part, "%s/part", root);
    job_spec s;
    run_out ref, first, second;
    lora_spec(&s, BATCH, 2, 4, 1, false);
    s.merge_lora = true;
    s.max_steps = 6;
    s.checkpoint_interval = 100;
    snprintf(s.output_dir, sizeof s.output_dir, "%s", full);
    run(&s, &ref);
    s.max_steps = 3;
    snprintf(s.output_dir, sizeof s.output_dir, "%s", part);
    run(&s, &first);
    s.max_steps = 6;
    run(&s, &second); /* resumes from part/ckpt-00000003: adapters + their moments */
    for (int i = 3; i < 6; i++)
        assert_true(second.loss[i] == ref.loss[i]);
    assert_memory_equal(second.params, ref.params, ref.h.nparams * sizeof(float));
    const char *want[] = {"adapter_config.json", "adapter_model.safetensors", "state.safetensors",
                          "merged/config.json", "merged/model.safetensors"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        snprintf(p, sizeof p, "%s/ckpt-00000006/%s", part, want[i]);
        if (access(p, F_OK) != 0)
            fail_msg("missing %s", p);
    }
    snprintf(p, sizeof p, "%s/ckpt-00000006/model.safetensors", part);
    assert_int_not_equal(access(p, F_OK), 0); /* the adapter directory holds no base copy */
    model_config back, cfg;
    acc_err err = {0};
    /* the state keeps the adapters and their moments, not the frozen base */
    assert_int_equal(plan_model_config(&s, &cfg, &err), 0);
    snprintf(p, sizeof p, "%s/ckpt-00000006/state.safetensors", part);
    st_file *sf = NULL;
    st_tensor tp, tm;
    assert_int_equal(st_open(p, &sf, &err), 0);
    assert_int_equal(st_get(sf, "params", &tp, &err), 0);
    assert_int_equal(st_get(sf, "adam.m", &tm, &err), 0);
    assert_true(tp.shape[0] == (int64_t)model_num_trainable(&cfg) && tm.shape[0] == tp.shape[0]);
    st_close(sf);
    snprintf(p, sizeof p, "%s/ckpt-00000006/merged", part);
    assert_int_equal(model_hf_validate(p, &back, &err), 0);
    assert_int_equal(back.intermediate_size, 48);
    free(ref.params);
    free(first.params);
    free(second.params);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_targets),
        cmocka_unit_test(test_planner_exact),
        cmocka_unit_test(test_frozen_and_split),
        cmocka_unit_test(test_resume_and_outputs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
