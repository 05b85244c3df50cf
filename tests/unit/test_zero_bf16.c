/* bf16 working weights at ZeRO stage 3 (model_config.weights_bf16,
 * model_shard.h "bf16 working weights"):
 *   - the partition sizes: each block's matrices are a bf16 part, the rest
 *     fp32, every part cut into the ranks' slices on its own; the device
 *     bytes (model_shard_state_bytes) are the fp32 partition + two slots
 *     of 4-byte 1-D tensors and 2-byte matrices + the ends' slot + one
 *     fp32 fetch scratch of the largest block matrix, counted here from
 *     the layout alone, and below the fp32 store's for LLaMA-2-7B's shape
 *     and the tiny test models; fp32 configs keep the old figures;
 *   - the store on one rank in bf16 mode: the whole model's loss and
 *     gradients bit for bit, a block matrix seen by the ops as the bf16
 *     rounding of its fp32 master, the rest as the master itself;
 *   - through the trainer on CPU devices, bf16 at stage 3 over 2 and 4
 *     ranks with one micro-step per rank gives the losses and the final
 *     weights of bf16 at stage 0 bit for bit (the products round the
 *     weights to bf16 anyway: round(widen(narrow(w))) == round(w)), GPT-2
 *     and LLaMA, with and without offload_param (+ offload_optimizer);
 *     each rank's device peak is the planner's to the byte and below the
 *     same job's fp32 stage-3 peak; with offload_param the host peak too;
 *   - the bf16 partition (model_config.partition_bf16: offload_optimizer
 *     without offload_param): the sizes (the blocks' matrix slices at 2
 *     bytes), the flag only where it applies, stage 0's bits through the
 *     trainer with the device peak the planner's and exactly 2 bytes per
 *     bf16 value below the fp32 partition's; its checkpoints are stage
 *     0's files, resume at w = 4 (stage 3) and w = 1 (stage 0) as stage
 *     0's do, and an interrupted run ends with the uninterrupted one's bits.
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

#include "engine_fixture.h"
#include "kern_device.h"
#include "mem_plan.h"
#include "model.h"
#include "model_shard.h"
#include "train_cfg.h"
#include "trainer_run.h"

static char text_path[64], root[64];

static int setup(void **state)
{
    (void)state;
    return fx_workdir_make(text_path, sizeof text_path, 20000, root, sizeof root, "zbf16");
}

static int teardown(void **state)
{
    (void)state;
    fx_workdir_remove(text_path, root);
    return 0;
}

/* What a job offloads: nothing, the parameters with the optimizer (stage
 * 3's offload_param requires it), the optimizer alone (the bf16 partition). */
enum { OFF_NONE, OFF_PARAM, OFF_OPTIM };

/* A tiny job of w ranks (gpt2 or llama), one micro-step per rank (m = 4,
 * a = 1), no clipping. */
static void job_of(train_cfg *s, const char *arch, int w, int zero, spec_precision p, int off)
{
    fx_clipped_spec(s, text_path, arch, 4, 1, w);
    s->optim.grad_clip = 0;
    s->zero_stage = zero;
    s->precision = p;
    s->offload_optimizer = off != OFF_NONE;
    s->offload_param = off == OFF_PARAM;
}

/* ---- sizes, from the layout alone */

/* What the bf16 store should hold for rank r of w: every part's slice
 * (kern_shard_lo's cut: the first n % w ranks one more), a parameter
 * slot's fp32 floats and bf16 values, the fetch scratch. */
typedef struct want_sizes {
    uint64_t pn, pn0, slot, ends, slot_f, slot_h, fetch;
    uint64_t pn_h; /* partition_bf16: the rank's slices of the blocks' matrices */
} want_sizes;

static uint64_t own(uint64_t n, int r, int w)
{
    return n / (uint64_t)w + ((uint64_t)r < n % (uint64_t)w);
}

static void want_of(const model_config *cfg, int r, int w, want_sizes *o)
{
    model_layout l;
    acc_err err = {0};
    if (model_layout_build(cfg, &l, &err) != 0)
        fail_msg("%s: %s", err.field, err.msg);
    int L = cfg->n_layer;
    uint64_t *mat = calloc((size_t)L + 1, sizeof *mat), *vec = calloc((size_t)L + 1, sizeof *vec);
    assert_non_null(mat);
    assert_non_null(vec);
    memset(o, 0, sizeof *o);
    for (int i = 0; i < l.n; i++) {
        const model_tensor *t = &l.t[i];
        bool m = cfg->weights_bf16 && t->layer >= 0 && t->ndim == 2;
        (m ? mat : vec)[t->layer < 0 ? L : t->layer] += t->count;
        if (m && t->count > o->fetch)
            o->fetch = t->count;
    }
    for (int g = 0; g <= L; g++) {
        o->pn += own(mat[g], r, w) + own(vec[g], r, w);
        o->pn0 += own(mat[g], 0, w) + own(vec[g], 0, w);
        o->pn_h += cfg->weights_bf16 && cfg->partition_bf16 ? own(mat[g], r, w) : 0;
        if (g == L)
            continue;
        o->slot = mat[g] + vec[g] > o->slot ? mat[g] + vec[g] : o->slot;
        o->slot_h = mat[g] > o->slot_h ? mat[g] : o->slot_h;
        o->slot_f = vec[g] > o->slot_f ? vec[g] : o->slot_f;
    }
    o->ends = mat[L] + vec[L];
    assert_true(mat[L] == 0); /* the ends stay fp32 */
    free(mat);
    free(vec);
    model_layout_free(&l);
}

/* model_shard_sizes_of and model_shard_state_bytes against want_of, for
 * cfg with and without weights_bf16, then with partition_bf16 too; returns
 * the bf16 store's weights bytes and, in *f32, the fp32 store's, in *p16
 * the bf16 partition's. */
static uint64_t check_sizes3(model_config cfg, int r, int w, uint64_t *f32, uint64_t *p16)
{
    acc_err err = {0};
    uint64_t wb[3], gb[3];
    for (int b = 0; b <= 2; b++) {
        cfg.weights_bf16 = b >= 1;
        cfg.partition_bf16 = b == 2 || (b == 0 && r % 2 == 1); /* ignored without weights_bf16 */
        want_sizes ws;
        want_of(&cfg, r, w, &ws);
        model_shard_sizes z;
        assert_int_equal(model_shard_sizes_of(&cfg, r, w, &z, &err), 0);
        assert_true(z.pn == ws.pn && z.slot == ws.slot && z.ends == ws.ends);
        assert_true(z.slot_f32 == ws.slot_f && z.slot_b16 == ws.slot_h && z.fetch == ws.fetch);
        if (!b) /* fp32: one fp32 vector a group, no fetch: the old figures */
            assert_true(z.slot_f32 == z.slot && z.slot_b16 == 0 && z.fetch == 0);
        else
            assert_true(z.slot_b16 > 0 && z.fetch > 0 && z.slot_f32 + z.slot_b16 == z.slot);
        assert_true(z.pn_b16 == ws.pn_h && (b == 2) == (z.pn_b16 > 0));
        assert_int_equal(model_shard_state_bytes(&cfg, 16, r, w, &wb[b], &gb[b], &err), 0);
        assert_true(wb[b] == 4 * (ws.pn - ws.pn_h + ws.ends + ws.fetch) + 2 * ws.pn_h +
                                2 * (4 * ws.slot_f + 2 * ws.slot_h));
        assert_true(gb[b] == 4 * (ws.pn0 + 16 + ws.slot + ws.ends));
        if (b == 2) /* 2 bytes less per bf16 value of the partition */
            assert_true(wb[1] - wb[2] == 2 * ws.pn_h);
    }
    assert_true(gb[0] == gb[1] && gb[1] == gb[2]); /* the gradients stay fp32, whole blocks */
    assert_true(wb[2] < wb[1] && wb[1] < wb[0]);
    *f32 = wb[0];
    *p16 = wb[2];
    return wb[1];
}

static uint64_t check_sizes(model_config cfg, int r, int w, uint64_t *f32)
{
    uint64_t p16;
    return check_sizes3(cfg, r, w, f32, &p16);
}

static void llama_cfg(model_config *c, int L, int C, int H, int KV, int I, int V, int P)
{
    memset(c, 0, sizeof *c);
    c->family = model_family_by_arch("llama");
    assert_non_null(c->family);
    c->n_layer = L;
    c->channels = C;
    c->n_head = H;
    c->n_kv_head = KV;
    c->intermediate_size = I;
    c->vocab_size = c->padded_vocab_size = V;
    c->max_seq_len = P;
    c->norm_eps = 1e-5;
    c->rope_theta = 10000.0;
}

/* The tiny test models (this file's jobs) and LLaMA-2-7B's shape. */
static void test_sizes(void **state)
{
    (void)state;
    model_config c;
    uint64_t f32, b16, p16;
    llama_cfg(&c, 32, 4096, 32, 32, 11008, 32000, 4096);
    for (int w = 1; w <= 8; w *= 2) {
        b16 = check_sizes3(c, 0, w, &f32, &p16);
        /* two slots of a block's 202,375,168 matrix values at 2 bytes
         * instead of 4, less the fetch of the 4096 x 11008 MLP matrix */
        assert_true(f32 - b16 == 2ull * 2 * 202375168 - 4ull * 4096 * 11008);
        /* the bf16 partition: rank 0's slices of 32 blocks' matrices at 2
         * bytes (w divides 202,375,168) */
        assert_true(b16 - p16 == 2ull * 32 * 202375168 / (uint64_t)w);
        print_message("LLaMA-2-7B ZeRO-3 w=%d: parameters' device bytes %llu (fp32) -> %llu (bf16) -> %llu (bf16 "
                      "partition)\n",
                      w, (unsigned long long)f32, (unsigned long long)b16, (unsigned long long)p16);
        for (int r = 1; r < w; r++)
            (void)check_sizes(c, r, w, &f32);
    }
    const char *arch[] = {"gpt2", "llama"};
    for (int a = 0; a < 2; a++) {
        train_cfg s;
        job_of(&s, arch[a], 2, 3, SPEC_BF16, OFF_NONE);
        model_config cfg;
        acc_err err = {0};
        assert_int_equal(plan_model_config(&s, &cfg, &err), 0);
        assert_true(cfg.weights_bf16 && cfg.act_bf16 && !cfg.partition_bf16);
        for (int w = 1; w <= 4; w++)
            for (int r = 0; r < w; r++)
                (void)check_sizes(cfg, r, w, &f32);
        /* the bf16 partition with offload_optimizer, not with offload_param */
        s.offload_optimizer = true;
        assert_int_equal(plan_model_config(&s, &cfg, &err), 0);
        assert_true(cfg.weights_bf16 && cfg.partition_bf16);
        s.offload_param = true;
        assert_int_equal(plan_model_config(&s, &cfg, &err), 0);
        assert_true(cfg.weights_bf16 && !cfg.partition_bf16);
        s.offload_param = false;
        /* the flags only where they apply: stage 3 and bf16 */
        s.zero_stage = 2;
        assert_int_equal(plan_model_config(&s, &cfg, &err), 0);
        assert_false(cfg.weights_bf16 || cfg.partition_bf16);
        s.zero_stage = 3;
        s.precision = SPEC_FP32;
        assert_int_equal(plan_model_config(&s, &cfg, &err), 0);
        assert_false(cfg.weights_bf16 || cfg.partition_bf16);
    }
}

/* ---- the store itself, one rank (a gather is a copy) */

/* A whole bf16 model against the sharded one with bf16 working weights,
 * on one CPU device in bf16 mode: the loss and the gradients bit for bit,
 * each block gathered once a pass; a block matrix resolves to the bf16
 * rounding of the master (widened), a 1-D tensor and the ends' matrices to
 * the master itself; the gathered parameters are the fp32 master. */
static void check_store(const char *arch)
{
    train_cfg s;
    acc_err err = {0};
    job_of(&s, arch, 1, 3, SPEC_BF16, OFF_NONE);
    model_config cfg;
    assert_int_equal(plan_model_config(&s, &cfg, &err), 0);
    assert_true(cfg.weights_bf16);
    fx_store_pair p;
    fx_store_open(&cfg, 2, s.model.seq_len, true, &p);
    model *b = p.b;
    size_t n = b->nparams;
    float *ha = malloc(n * sizeof *ha), *t = malloc(n * sizeof *t);
    assert_true(ha != NULL && t != NULL);
    double lb = fx_assert_store_pass(&p, ha); /* ha: the master, unrounded */
    /* what the ops see: block 0's tensors, and the ends' */
    model_layer_begin(b, 0, false);
    int rounded = 0, matrices = 0;
    for (int i = 0; i < b->layout.n; i++) {
        const model_tensor *mt = &b->layout.t[i];
        if (mt->layer > 0)
            continue;
        p.dev->ops->download(p.dev, t, model_weight(b, mt->offset, 0), mt->count * sizeof *t);
        bool half = mt->layer == 0 && mt->ndim == 2;
        matrices += half;
        for (size_t k = 0; k < mt->count; k++) {
            float want = half ? kern_bf16_round(ha[mt->offset + k]) : ha[mt->offset + k];
            assert_memory_equal(&t[k], &want, sizeof want);
            rounded += want != ha[mt->offset + k];
        }
    }
    model_layer_end(b, 0, false);
    assert_true(matrices >= 4 && rounded > 0); /* the test sees a rounding */
    print_message("%s: the sharded bf16 store gives the whole model's loss %.9f and gradients; block 0's %d "
                  "matrices resolve to their bf16 rounding (%d values moved)\n",
                  arch, lb, matrices, rounded);
    free(ha);
    free(t);
    fx_store_close(&p);
}

static void test_store(void **state)
{
    (void)state;
    check_store("gpt2");
    check_store("llama");
}

/* ---- through the trainer */

/* One thread per device, devices of 1 GiB, the trainer's buckets. */
static void run(const train_cfg *s, fx_run *r)
{
    fx_run_opts o = {.device_budget = 1ull << 30, .threads = 1};
    fx_train(s, &o, r);
    fx_assert_ran(r, s, s->output_dir[0] ? s->output_dir : "run");
}

/* Measured = predicted: each rank's device peak and, with offload_param,
 * the job's host peak; below the fp32 run's peaks. */
static void assert_memory(const train_cfg *s, const fx_run *r, const fx_run *f32)
{
    model_config cfg;
    acc_err err = {0};
    assert_int_equal(plan_model_config(s, &cfg, &err), 0);
    assert_true(cfg.weights_bf16);
    /* the bf16 partition where the optimizer alone is offloaded */
    assert_true(cfg.partition_bf16 == (s->offload_optimizer && !s->offload_param));
    int w = s->devices;
    uint64_t host = 0;
    for (int k = 0; k < w; k++) {
        uint64_t want = plan_rank_device_state_bytes_op(&cfg, 3, s->offload_optimizer, s->offload_param, w, k) +
                        plan_act_bytes(&cfg, s->micro_batch, s->model.seq_len, false);
        if (r->h.mem_peak[k] != want)
            print_error("rank %d: device peak %llu, predicted %llu\n", k, (unsigned long long)r->h.mem_peak[k],
                        (unsigned long long)want);
        assert_int_equal(r->h.mem_peak[k], want);
        assert_true(r->h.mem_peak[k] < f32->h.mem_peak[k]);
        if (cfg.partition_bf16) { /* exactly 2 bytes per bf16 value below the fp32 partition's */
            model_config f = cfg;
            model_shard_sizes z;
            f.partition_bf16 = false;
            assert_int_equal(model_shard_sizes_of(&cfg, k, w, &z, &err), 0);
            uint64_t fp = plan_rank_device_state_bytes_op(&f, 3, true, false, w, k) +
                          plan_act_bytes(&f, s->micro_batch, s->model.seq_len, false);
            assert_true(z.pn_b16 > 0 && fp - r->h.mem_peak[k] == 2 * (uint64_t)z.pn_b16);
            /* and the gradient partition in host memory (grads_host): rank 0's
             * pn floats below the device-gradient state */
            model_config g = cfg;
            model_shard_sizes z0;
            g.grads_host = false;
            assert_true(cfg.grads_host);
            assert_int_equal(model_shard_sizes_of(&cfg, 0, w, &z0, &err), 0);
            uint64_t gd = plan_rank_device_state_bytes_op(&g, 3, true, false, w, k) +
                          plan_act_bytes(&g, s->micro_batch, s->model.seq_len, false);
            assert_int_equal(gd - r->h.mem_peak[k], 4 * (uint64_t)z0.pn);
        }
        host += plan_host_params_bytes(&cfg, 3, s->offload_param, w, k) +
                plan_host_optim_bytes_op(&cfg, 3, s->offload_optimizer, s->offload_param, w, k);
    }
    uint64_t dev0;
    assert_int_equal(plan_device_bytes(s, s->micro_batch, false, &dev0, &err), 0);
    assert_int_equal(dev0, r->h.mem_peak[0]);
    if (r->h.host_peak != host)
        print_error("host peak %llu, predicted %llu\n", (unsigned long long)r->h.host_peak,
                    (unsigned long long)host);
    assert_int_equal(r->h.host_peak, host);
    assert_true(r->h.host_peak <= f32->h.host_peak);
}

static void check_bits(const char *arch, int w)
{
    train_cfg s;
    fx_run z0;
    job_of(&s, arch, w, 0, SPEC_BF16, OFF_NONE);
    run(&s, &z0);
    for (int op = OFF_NONE; op <= OFF_OPTIM; op++) {
        fx_run f3, b3;
        job_of(&s, arch, w, 3, SPEC_FP32, op);
        run(&s, &f3);
        job_of(&s, arch, w, 3, SPEC_BF16, op);
        run(&s, &b3);
        fx_assert_same_losses(&z0, &b3, 0, s.max_steps);
        assert_memory(&s, &b3, &f3);
        /* fp32 is another function: the products are not rounded */
        assert_true(memcmp(f3.params, b3.params, b3.h.nparams * sizeof(float)) != 0);
        print_message("%s w=%d bf16 ZeRO-3%s: stage 0's bits (losses %.6f .. %.6f); device peak per rank "
                      "%llu (fp32 ZeRO-3: %llu), host peak %llu (fp32: %llu)\n",
                      arch, w, op == OFF_PARAM ? " + offload_param + offload_optimizer"
                               : op == OFF_OPTIM ? " + offload_optimizer (bf16 partition)" : "", b3.loss[0],
                      b3.loss[s.max_steps - 1], (unsigned long long)b3.h.mem_peak[0],
                      (unsigned long long)f3.h.mem_peak[0], (unsigned long long)b3.h.host_peak,
                      (unsigned long long)f3.h.host_peak);
        free(f3.params);
        free(b3.params);
    }
    free(z0.params);
}

static void test_bits_gpt2(void **state)
{
    (void)state;
    check_bits("gpt2", 2);
    check_bits("gpt2", 4);
}

static void test_bits_llama(void **state)
{
    (void)state;
    check_bits("llama", 2);
    check_bits("llama", 4);
}

/* ---- checkpoints of the bf16 partition */

/* B = 8 as m = 8 / w, a = 1, no clipping, bf16; stage 3 with the
 * optimizer offloaded is the bf16 partition. */
static void ck_spec(train_cfg *s, const char *arch, int w, int zero, const char *from, const char *out, int steps)
{
    job_of(s, arch, w, zero, SPEC_BF16, zero == 3 ? OFF_OPTIM : OFF_NONE);
    s->train_batch_size = 8;
    s->micro_batch = 8 / w;
    s->max_steps = steps;
    s->checkpoint_interval = 2;
    snprintf(s->resume_from, sizeof s->resume_from, "%s", from);
    snprintf(s->output_dir, sizeof s->output_dir, "%s/%s-%s", root, arch, out);
}

/* A checkpoint written with the bf16 partition (w = 2) holds stage 0's
 * files byte for byte (the fp32 weights are the master's); resumed at
 * w = 4 (stage 3, the bf16 partition again: the master loaded from the
 * file) and at w = 1 (stage 0) it continues as stage 0's checkpoint does;
 * resumed at w = 2 it ends with the uninterrupted run's bits. */
static void check_checkpoint(const char *arch)
{
    train_cfg s;
    fx_run p2, z2, p4, z4, r1, b1, full, rest;
    char ckp[256], ckz[256];
    ck_spec(&s, arch, 2, 3, "", "p2", 2);
    run(&s, &p2);
    ck_spec(&s, arch, 2, 0, "", "z2", 2);
    run(&s, &z2);
    fx_assert_same_losses(&p2, &z2, 0, 2);
    snprintf(ckp, sizeof ckp, "%s/%s-p2/ckpt-00000002", root, arch);
    snprintf(ckz, sizeof ckz, "%s/%s-z2/ckpt-00000002", root, arch);
    fx_assert_same_checkpoint(ckp, ckz);
    ck_spec(&s, arch, 4, 3, ckp, "p4", 5);
    run(&s, &p4);
    ck_spec(&s, arch, 4, 0, ckz, "z4", 5);
    run(&s, &z4);
    fx_assert_same_losses(&p4, &z4, 2, 5);
    ck_spec(&s, arch, 1, 0, ckp, "r1", 5);
    run(&s, &r1);
    ck_spec(&s, arch, 1, 0, ckz, "b1", 5);
    run(&s, &b1);
    fx_assert_same_bits(&r1, &b1, 2, 5);
    ck_spec(&s, arch, 2, 3, "", "full", 5);
    run(&s, &full);
    ck_spec(&s, arch, 2, 3, ckp, "rest", 5);
    run(&s, &rest);
    fx_assert_same_bits(&full, &rest, 2, 5);
    assert_true(isnan(rest.loss[0]) && isnan(p4.loss[1]));
    print_message("%s bf16 partition: checkpoint at w=2 = stage 0's files; resumed at w=4: %.9f .. %.9f, at "
                  "w=1 (stage 0): %.9f .. %.9f\n",
                  arch, p4.loss[2], p4.loss[4], r1.loss[2], r1.loss[4]);
    fx_run *all[] = {&p2, &z2, &p4, &z4, &r1, &b1, &full, &rest};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        free(all[i]->params);
}

static void test_checkpoint(void **state)
{
    (void)state;
    check_checkpoint("gpt2");
    check_checkpoint("llama");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_store),
        cmocka_unit_test(test_bits_gpt2),
        cmocka_unit_test(test_bits_llama),
        cmocka_unit_test(test_checkpoint),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
