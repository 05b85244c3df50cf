/* Parameter offload (zero_optimization.offload_param, ZeRO stage 3): the
 * planner's device and host bytes (mem_plan.h plan_host_params_bytes),
 * checked against the partition computed here from the layout alone, and
 * LLaMA-2-7B's figures on one 24 GiB CUDA card. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kern_device.h"
#include "mem_plan.h"
#include "model.h"
#include "train_cfg.h"

static const char llama2_7b[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 4096,"
    " \"intermediate_size\": 11008, \"num_hidden_layers\": 32, \"num_attention_heads\": 32,"
    " \"num_key_value_heads\": 32, \"vocab_size\": 32000, \"max_position_embeddings\": 4096,"
    " \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, \"tie_word_embeddings\": false,"
    " \"torch_dtype\": \"float16\", \"hidden_act\": \"silu\"}";

static const char llama_tiny[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 64,"
    " \"intermediate_size\": 160, \"num_hidden_layers\": 3, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"vocab_size\": 301, \"max_position_embeddings\": 256,"
    " \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, \"tie_word_embeddings\": false,"
    " \"torch_dtype\": \"float32\", \"hidden_act\": \"silu\"}";

static void write_config(const char *root, const char *name, const char *json)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", root, name);
    assert_int_equal(mkdir(path, 0700), 0);
    snprintf(path, sizeof path, "%s/%s/config.json", root, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(json, f);
    assert_int_equal(fclose(f), 0);
}

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
    snprintf(s->model.from, sizeof s->model.from, "%s/%s", root, dir);
    snprintf(s->data_roots, sizeof s->data_roots, "%s", root);
    s->plan_only = true;
    s->model.seq_len = T;
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

/* Device parts drop by the partition's parameters and gradients (rank 0:
 * pn0 both), the host holds 2 pn + slice floats and the moments only. */
static void test_plan_bytes(void **state)
{
    (void)state;
    char root[] = "/tmp/accumd-offparam-XXXXXX";
    assert_non_null(mkdtemp(root));
    write_config(root, "tiny", llama_tiny);
    for (int w = 1; w <= 2; w++) {
        train_cfg *s = plan_spec(root, "tiny", 32, 4, w);
        plan_row base = row_of(s, KERN_DEV_CPU, 0);
        s->offload_param = true;
        plan_row op = row_of(s, KERN_DEV_CPU, 0);
        model_config cfg;
        acc_err err = {0};
        assert_int_equal(plan_model_config(s, &cfg, &err), 0);
        uint64_t pn, slice, pn0;
        partition_of(&cfg, 0, w, &pn, &slice, &pn0);
        assert_true(pn == pn0);
        assert_true(op.parts.weights == base.parts.weights - 4 * pn);
        assert_true(op.parts.gradients == base.parts.gradients - 4 * pn0);
        assert_true(op.parts.optimizer == 0 && base.parts.optimizer == 0);
        assert_true(op.peak_bytes == base.peak_bytes - 4 * (pn + pn0));
        assert_true(op.host.params == 4 * (2 * pn + slice));
        assert_true(op.host.optimizer == 8 * pn && base.host.optimizer == 16 * pn);
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
    write_config(root, "Llama-2-7b-hf", llama2_7b);
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
                      "activations %.2f, workspace %.2f, rounding %.2f, runtime %.2f), fits %d; host %llu B "
                      "= %.2f GiB (params %.2f, optimizer %.2f, activations %.2f, batch %.4f)\n",
                      r.micro_batch, r.accum_steps, ao ? " + host checkpoints" : "",
                      (unsigned long long)r.device_bytes, r.device_bytes / gib, r.parts.weights / gib,
                      r.parts.gradients / gib, r.parts.optimizer / gib, r.parts.activations / gib,
                      r.parts.workspace / gib, r.parts.rounding / gib, r.parts.runtime / gib, r.fits,
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
        /* the device: two block slots and the ends' slot (parameters), one
         * block slot, the ends' slot and the trainer's slots (gradients) */
        uint64_t slot, ends;
        groups_of(&cfg, &slot, &ends);
        assert_true(r.parts.weights == 4 * (2 * slot + ends) && r.parts.optimizer == 0);
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
        s->offload_param = false; /* the partition on the device: 27 GB alone */
        assert_false(row_of(s, KERN_DEV_CUDA, 24ull << 30).fits);
        free(s);
    }
    remove_config(root, "Llama-2-7b-hf");
    rmdir(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_bytes),
        cmocka_unit_test(test_llama7b_figures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
