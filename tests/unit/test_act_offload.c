/* Activation checkpoints in host memory and token-chunked recomputed blocks
 * (model_config.act_offload, .lean_tokens; docs/engine.md "Activations:
 * what is kept where"):
 *
 *   - offload gives the bits of the same run without it (recomputing on the
 *     device): losses and gradients compared byte for byte, two micro-steps
 *     accumulated, LLaMA (GQA, LoRA), GPT-2, with and without token chunks;
 *   - the same with bf16 activation storage (act_bf16): offload gives the
 *     bits of bf16 recompute without it, the host holding the embedding's
 *     output in fp32 and the L - 1 rounded block outputs in bf16;
 *   - the token-chunked blocks agree with the unchunked lean path within
 *     1e-6 relative (bf16: 1e-5, a rounding may flip) (loss, per-token
 *     losses, gradients) on LLaMA, Qwen3
 *     (q/k norms), Gemma 2 (sandwich norms) and LoRA shapes: the same ops
 *     on fewer rows (the CPU products' row blocking may round a row's sums
 *     differently) and the weight gradients summed chunk by chunk;
 *   - the device bytes the activations take and the host bytes of the
 *     checkpoints equal model_act_bytes / model_act_host_bytes (and the
 *     planner's plan_host_of) to the byte, and nothing else is allocated
 *     while a step runs;
 *   - a host budget too small is ACC_ENOMEM naming host memory;
 *   - through the trainer: 1 and 2 ranks, offload vs not, bit-identical
 *     per-step losses and final weights; split invariance with offload;
 *     the rank's measured device peak and host peak equal the planner's row.
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

#include "engine_fixture.h"
#include "hf_configs.h"
#include "host_mem.h"
#include "kern_device.h"
#include "mem_plan.h"
#include "model.h"
#include "model_lora.h"
#include "rng.h"
#include "trainer.h"
#include "trainer_run.h"

#define TOL 1e-6

static char text_path[256];

static int setup(void **state)
{
    (void)state;
    fx_write_text(text_path, sizeof text_path, 200000);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    unlink(text_path);
    return 0;
}

/* ---- model level */

typedef struct mcase {
    const char *name, *arch;
    int B, T, L, NH, NKV, C, I, V;
    int lora_r;     /* 0: every weight trains */
} mcase;

typedef struct mode {
    int recompute;
    bool offload, lean, tok;
    int chunk;      /* lean_chunk: token chunk rows */
    bool bf16;      /* act_bf16: bf16 activation storage (blocks.h) */
} mode;

typedef struct run_out {
    double loss;
    float *grads, *losses;
    size_t ngrad, N;
    uint64_t dev_acts;   /* device bytes model_acts_alloc took */
    uint64_t dev_extra;  /* device peak past the allocations during the steps */
    uint64_t host_peak;  /* the host budget's peak */
} run_out;

static kern_device *open_cpu(int threads)
{
    kern_device_info info = {.kind = KERN_DEV_CPU, .index = 0, .name = "cpu0", .mem_total = 0};
    kern_device *d = NULL;
    acc_err err = {0};
    assert_int_equal(kern_device_open(&info, threads, &d, &err), 0);
    return d;
}

static model_config case_cfg(const mcase *c, const mode *md)
{
    spec_model sm;
    memset(&sm, 0, sizeof sm);
    snprintf(sm.arch, sizeof sm.arch, "%s", c->arch);
    sm.n_layer = c->L;
    sm.n_head = c->NH;
    sm.n_kv_head = c->NKV;
    sm.n_embd = c->C;
    sm.intermediate_size = c->I;
    sm.seq_len = c->T;
    sm.vocab_size = c->V;
    sm.padded_vocab_size = (c->V + 7) / 8 * 8;
    model_config cfg;
    acc_err err = {0};
    if (model_config_from_spec(&sm, &cfg, &err) != 0)
        fail_msg("%s: %s", c->name, err.msg);
    if (c->lora_r > 0) {
        spec_lora sl = {.r = c->lora_r, .alpha = 2.0 * c->lora_r, .all_linear = true};
        if (model_lora_apply(&sl, false, &cfg, &err) != 0)
            fail_msg("%s: lora: %s", c->name, err.msg);
    }
    cfg.lean_acts = md->lean;
    cfg.lean_tokens = md->tok;
    cfg.act_offload = md->offload;
    cfg.lean_chunk = md->chunk;
    cfg.act_bf16 = md->bf16;
    return cfg;
}

/* Two micro-steps (forward + backward each, gradients accumulated) of a
 * seeded model in mode md; the host checkpoints from a fresh budget. */
static void run_model(const mcase *c, const mode *md, run_out *o)
{
    kern_device *d = open_cpu(1);
    model_config cfg = case_cfg(c, md);
    acc_err err = {0};
    model *m = NULL;
    model_opts mo = {.B = 0, .T = c->T, .grad_tail = MODEL_GRAD_EXTRA};
    if (model_create_ex(d, &cfg, &mo, &m, &err) != 0)
        fail_msg("%s: %s", c->name, err.msg);
    host_mem h;
    host_mem_init(&h, 0);
    m->host = &h;
    assert_int_equal(model_init_seed(m, 7, &err), 0);
    if (c->lora_r > 0) { /* B = 0 would leave the adapters' gradients 0 */
        size_t n = model_num_trainable(&cfg);
        float *p = malloc(n * sizeof *p);
        rng r;
        rng_seed(&r, 5, 1);
        for (size_t i = 0; i < n; i++)
            p[i] = (float)(0.05 * rng_normal(&r));
        d->ops->upload(d, m->params, p, n * sizeof *p);
        free(p);
    }
    uint64_t before = d->in_use;
    if (model_acts_alloc(m, c->B, md->recompute, &err) != 0)
        fail_msg("%s: acts: %s", c->name, err.msg);
    o->dev_acts = d->in_use - before;
    uint64_t held = d->in_use;
    size_t N = (size_t)c->B * c->T;
    int *tok = malloc(N * sizeof *tok), *tgt = malloc(N * sizeof *tgt);
    float *w = malloc(N * sizeof *w);
    assert_true(tok && tgt && w);
    rng r;
    rng_seed(&r, 20, 3);
    o->loss = 0;
    o->N = N;
    o->losses = malloc(N * sizeof *o->losses);
    for (int step = 0; step < 2; step++) {
        for (size_t i = 0; i < N; i++) {
            tok[i] = (int)rng_below(&r, (uint64_t)c->V);
            tgt[i] = (int)rng_below(&r, (uint64_t)c->V);
            w[i] = i % 5 == 3 ? 0.0f : 1.0f / (float)N;
        }
        double loss = 0;
        model_forward(m, tok, tgt, w, c->B, 1, &loss);
        o->loss += loss;
        if (step == 1)
            d->ops->download(d, o->losses, model_token_losses(m), N * sizeof *o->losses);
        model_backward(m, c->B);
    }
    o->dev_extra = d->peak - held;
    o->host_peak = host_mem_peak(&h);
    o->ngrad = m->ngrad;
    o->grads = malloc(m->ngrad * sizeof *o->grads);
    assert_non_null(o->grads);
    d->ops->download(d, o->grads, m->grads, m->ngrad * sizeof *o->grads);
    free(tok);
    free(tgt);
    free(w);
    model_free(m);
    assert_int_equal(host_mem_in_use(&h), 0); /* the checkpoints went back */
    host_mem_destroy(&h);
    kern_device_close(d);
}

static void out_free(run_out *o)
{
    free(o->grads);
    free(o->losses);
}

/* ||a - b|| / ||b|| */
static double rel(const float *a, const float *b, size_t n)
{
    return fx_rel_diff(b, a, n);
}

static const mcase llama_gqa = {"llama gqa", "llama", 3, 70, 3, 4, 2, 32, 48, 300, 0};
static const mcase llama_lora = {"llama lora", "llama", 2, 61, 2, 4, 1, 32, 40, 200, 4};
static const mcase gpt2_case = {"gpt2", "gpt2", 2, 40, 3, 4, 0, 32, 0, 260, 0};
static const mcase qwen3_case = {"qwen3 qk-norm", "qwen3", 2, 53, 2, 4, 2, 32, 40, 150, 0};
static const mcase gemma2_case = {"gemma2 sandwich", "gemma2", 2, 45, 2, 2, 1, 32, 40, 150, 0};

/* offload: the same bits as recomputing from device checkpoints */
static void test_offload_bit_identical(void **state)
{
    (void)state;
    const mcase *cases[] = {&llama_gqa, &llama_lora, &gpt2_case, &qwen3_case};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        for (int lb = 0; lb < 4; lb++) {
            const mcase *c = cases[i];
            int lean = lb & 1, bf16 = lb >> 1;
            mode dev = {.recompute = 1, .lean = lean, .tok = lean, .chunk = 32, .bf16 = bf16};
            mode off = dev;
            off.offload = true;
            run_out a, b;
            run_model(c, &dev, &a);
            run_model(c, &off, &b);
            if (memcmp(&a.loss, &b.loss, sizeof a.loss) != 0)
                fail_msg("%s lean %d bf16 %d: loss %.17g offloaded vs %.17g", c->name, lean, bf16, b.loss, a.loss);
            assert_int_equal(a.ngrad, b.ngrad);
            if (memcmp(a.grads, b.grads, a.ngrad * sizeof *a.grads) != 0)
                fail_msg("%s lean %d bf16 %d: gradients differ with offload (rel %.3g)", c->name, lean, bf16,
                         rel(b.grads, a.grads, a.ngrad));
            assert_memory_equal(a.losses, b.losses, a.N * sizeof *a.losses);
            /* L - 2 fewer [B T, C] arrays on the device (one less when no embedding slot) */
            assert_true(b.dev_acts < a.dev_acts || (bf16 && c->L <= 3));
            assert_int_equal(a.host_peak, 0);
            /* bf16: the embedding's output in fp32, the L - 1 rounded block outputs in bf16 */
            uint64_t btc = (uint64_t)c->B * c->T * c->C;
            assert_int_equal(b.host_peak, bf16 ? btc * (4 + 2 * (uint64_t)(c->L - 1)) : c->L * btc * 4);
            print_message("%-16s lean %d bf16 %d: bit-identical; device acts %llu -> %llu, host %llu bytes\n",
                          c->name, lean, bf16, (unsigned long long)a.dev_acts, (unsigned long long)b.dev_acts,
                          (unsigned long long)b.host_peak);
            out_free(&a);
            out_free(&b);
        }
}

/* token chunks vs the unchunked lean path: within summation order */
static void test_tok_chunks_close(void **state)
{
    (void)state;
    const mcase *cases[] = {&llama_gqa, &llama_lora, &qwen3_case, &gemma2_case};
    for (size_t k = 0; k < 2 * sizeof cases / sizeof *cases; k++) {
        const mcase *c = cases[k / 2];
        bool bf16 = k % 2;
        mode whole = {.recompute = 1, .lean = true, .tok = false, .chunk = 37, .bf16 = bf16}; /* a partial last chunk */
        mode tok = whole;
        tok.tok = true;
        run_out a, b;
        run_model(c, &whole, &a);
        run_model(c, &tok, &b);
        double lr = fabs(b.loss - a.loss) / fabs(a.loss);
        double tr = rel(b.losses, a.losses, a.N), gr = rel(b.grads, a.grads, a.ngrad);
        /* bf16: a block output one fp32 ulp apart may round to the
         * neighbouring bf16 value (2^-8 relative) */
        double tol = bf16 ? 1e-5 : TOL;
        if (!(lr <= tol && tr <= tol && gr <= tol))
            fail_msg("%s bf16 %d: chunked vs whole: loss rel %.3g, token losses %.3g, gradients %.3g", c->name,
                     bf16, lr, tr, gr);
        assert_true(b.dev_acts < a.dev_acts);
        print_message("%-16s bf16 %d chunked: loss rel %.2g, grads rel %.2g, acts %llu -> %llu bytes\n",
                      c->name, bf16, lr, gr, (unsigned long long)a.dev_acts, (unsigned long long)b.dev_acts);
        out_free(&a);
        out_free(&b);
    }
}

/* the device and host bytes of every mode, to the byte; nothing allocated
 * past them while the steps run */
static void test_bytes_exact(void **state)
{
    (void)state;
    const mcase *cases[] = {&llama_gqa, &llama_lora, &gpt2_case, &gemma2_case};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        for (int bits = 0; bits < 16; bits++) {
            const mcase *c = cases[i];
            mode md = {.recompute = 1, .offload = bits & 1, .lean = (bits & 2) != 0, .tok = (bits & 4) != 0,
                       .chunk = 29, .bf16 = (bits & 8) != 0};
            if (md.tok && !md.lean)
                continue;
            model_config cfg = case_cfg(c, &md);
            uint64_t acts, hb = model_act_host_bytes(&cfg, c->B, c->T, 1);
            acc_err err = {0};
            assert_int_equal(model_act_bytes(&cfg, c->B, c->T, 1, &acts, &err), 0);
            plan_host_parts hp;
            plan_host_of(&cfg, c->B, c->T, true, &hp);
            run_out o;
            run_model(c, &md, &o);
            if (o.dev_acts != acts || o.host_peak != hb || hp.activations != hb || o.dev_extra != 0)
                fail_msg("%s offload %d lean %d tok %d bf16 %d: device %llu measured vs %llu predicted, host %llu "
                         "vs %llu (planner %llu), %llu bytes past the allocations",
                         c->name, md.offload, md.lean, md.tok, md.bf16, (unsigned long long)o.dev_acts,
                         (unsigned long long)acts, (unsigned long long)o.host_peak, (unsigned long long)hb,
                         (unsigned long long)hp.activations, (unsigned long long)o.dev_extra);
            out_free(&o);
        }
}

/* a host budget too small for the checkpoints: ACC_ENOMEM naming host memory */
static void test_host_budget_too_small(void **state)
{
    (void)state;
    const mcase *c = &llama_gqa;
    mode md = {.recompute = 1, .offload = true, .chunk = 32};
    model_config cfg = case_cfg(c, &md);
    kern_device *d = open_cpu(1);
    acc_err err = {0};
    model *m = NULL;
    model_opts mo = {.B = 0, .T = c->T, .grad_tail = MODEL_GRAD_EXTRA};
    assert_int_equal(model_create_ex(d, &cfg, &mo, &m, &err), 0);
    uint64_t need = model_act_host_bytes(&cfg, c->B, c->T, 1);
    host_mem h;
    host_mem_init(&h, need - 1);
    m->host = &h;
    uint64_t before = d->in_use;
    assert_int_equal(model_acts_alloc(m, c->B, 1, &err), ACC_ENOMEM);
    assert_string_equal(err.field, "host memory");
    assert_non_null(strstr(err.msg, "activation checkpoints"));
    assert_int_equal(d->in_use, before); /* nothing left behind */
    assert_int_equal(host_mem_in_use(&h), 0);
    assert_int_equal(m->B, 0);
    /* without recomputation nothing goes to the host: the same budget is enough */
    acc_err_clear(&err);
    assert_int_equal(model_acts_alloc(m, c->B, 0, &err), 0);
    assert_int_equal(host_mem_in_use(&h), 0);
    model_free(m);
    host_mem_destroy(&h);
    /* and a budget of exactly the checkpoints is */
    host_mem_init(&h, need);
    assert_int_equal(model_create_ex(d, &cfg, &mo, &m, &err), 0);
    m->host = &h;
    assert_int_equal(model_acts_alloc(m, c->B, 1, &err), 0);
    assert_int_equal(host_mem_peak(&h), need);
    model_free(m);
    host_mem_destroy(&h);
    kern_device_close(d);
}

/* ---- through the trainer */

static void llama_spec(train_cfg *s, int B, int m, int a, int w)
{
    fx_tiny_spec(s, text_path, B, m, a, w);
    snprintf(s->model.arch, sizeof s->model.arch, "llama");
    s->model.n_layer = 3;
    s->model.n_kv_head = 1;
    s->model.intermediate_size = 48;
    s->model.seq_len = 24;
    s->max_steps = 3;
    s->activation_checkpointing = true;
}

typedef struct job_out {
    double loss[3];
    float *params;
    size_t n;
    uint64_t dev_peak, host_peak;
} job_out;

static void run_job(train_cfg *s, uint64_t host_budget, job_out *o)
{
    kern_device_info devs[4];
    fx_devices(devs, s->devices, 1ull << 30);
    o->n = 1u << 20;
    o->params = malloc(o->n * sizeof *o->params);
    train_hooks h = {.steps_cap = 3, .step_loss = o->loss, .final_params = o->params,
                     .final_params_cap = o->n};
    trainer_opts to = {.spec = s, .devices = devs, .threads_per_device = 1, .checkpoint_keep = 1,
                       .host_budget = host_budget};
    acc_err err = {0};
    if (trainer_run_sync(&to, &h, &err) != 0)
        fail_msg("job: %s: %s", err.field, err.msg);
    o->n = h.nparams;
    o->dev_peak = h.mem_peak[0];
    o->host_peak = h.host_peak;
}

static void expect_same_job(const char *what, const job_out *a, const job_out *b)
{
    assert_int_equal(a->n, b->n);
    for (int i = 0; i < 3; i++)
        if (memcmp(&a->loss[i], &b->loss[i], sizeof a->loss[i]) != 0)
            fail_msg("%s: step %d loss %.17g vs %.17g", what, i + 1, b->loss[i], a->loss[i]);
    if (memcmp(a->params, b->params, a->n * sizeof *a->params) != 0)
        fail_msg("%s: final weights differ (rel %.3g)", what, rel(b->params, a->params, a->n));
}

/* 1 and 2 ranks, each with and without offload, lean + token chunks too */
static void test_trainer_offload(void **state)
{
    (void)state;
    for (int w = 1; w <= 2; w++)
        for (int lb = 0; lb < 4; lb++) {
            int lean = lb & 1, bf16 = lb >> 1;
            train_cfg s;
            llama_spec(&s, 4, 2, 2 / w, w);
            s.lean_activations = lean;
            s.precision = bf16 ? SPEC_BF16 : SPEC_FP32; /* bf16: bf16 host checkpoints too */
            job_out a, b;
            run_job(&s, 0, &a);
            s.activation_offload = true;
            run_job(&s, 0, &b);
            char what[64];
            snprintf(what, sizeof what, "%d rank(s), lean %d, %s, offload vs not", w, lean, bf16 ? "bf16" : "fp32");
            expect_same_job(what, &a, &b);
            /* the planner's row: device peak and host bytes, measured */
            model_config cfg;
            acc_err err = {0};
            assert_int_equal(plan_model_config(&s, &cfg, &err), 0);
            plan_row rows[8];
            int n, chosen;
            assert_int_equal(plan_candidates(&s, 0, rows, 8, &n, &chosen, &err), 0);
            const plan_row *r = NULL;
            for (int i = 0; i < n; i++)
                if (rows[i].micro_batch == 2 && rows[i].recompute)
                    r = &rows[i];
            assert_non_null(r);
            /* the job's host budget holds its ranks' checkpoints together */
            if (r->peak_bytes != b.dev_peak || r->host.activations * (uint64_t)w != b.host_peak ||
                r->host_bytes < r->host.activations)
                fail_msg("%s: device peak %llu predicted vs %llu measured; host %llu vs %llu", what,
                         (unsigned long long)r->peak_bytes, (unsigned long long)b.dev_peak,
                         (unsigned long long)r->host.activations, (unsigned long long)b.host_peak);
            assert_true(b.dev_peak < a.dev_peak);
            assert_int_equal(a.host_peak, 0);
            assert_int_equal(r->host.activations, model_act_host_bytes(&cfg, 2, s.model.seq_len, 1));
            print_message("%s: bit-identical; device peak %llu -> %llu, host %llu bytes\n", what,
                          (unsigned long long)a.dev_peak, (unsigned long long)b.dev_peak,
                          (unsigned long long)b.host_peak);
            free(a.params);
            free(b.params);
        }
}

/* split invariance with offload: (8,1,1), (1,8,1), (2,2,2) give one run */
static void test_split_invariance_offload(void **state)
{
    (void)state;
    static const int splits[3][3] = {{8, 1, 1}, {1, 8, 1}, {2, 2, 2}};
    job_out ref = {0};
    for (int i = 0; i < 3; i++) {
        train_cfg s;
        llama_spec(&s, 8, splits[i][0], splits[i][1], splits[i][2]);
        s.activation_offload = true;
        job_out o;
        run_job(&s, 0, &o);
        if (i == 0) {
            ref = o;
            continue;
        }
        assert_int_equal(o.n, ref.n);
        for (int k = 0; k < 3; k++)
            if (!(fabs(o.loss[k] - ref.loss[k]) <= 1e-6 * fabs(ref.loss[k])))
                fail_msg("split (%d,%d,%d): step %d loss %.9g vs %.9g", splits[i][0], splits[i][1],
                         splits[i][2], k + 1, o.loss[k], ref.loss[k]);
        double pr = rel(o.params, ref.params, o.n);
        if (!(pr <= 1e-6))
            fail_msg("split (%d,%d,%d): weights rel %.3g", splits[i][0], splits[i][1], splits[i][2], pr);
        free(o.params);
    }
    free(ref.params);
}

/* the job's host budget below its checkpoints: the run fails naming host memory */
static void test_trainer_host_budget(void **state)
{
    (void)state;
    train_cfg s;
    llama_spec(&s, 2, 2, 1, 1);
    s.activation_offload = true;
    model_config cfg;
    acc_err err = {0};
    assert_int_equal(plan_model_config(&s, &cfg, &err), 0);
    uint64_t need = model_act_host_bytes(&cfg, 2, s.model.seq_len, 1);
    kern_device_info devs[1];
    fx_devices(devs, 1, 1ull << 30);
    train_hooks h = {0};
    trainer_opts to = {.spec = &s, .devices = devs, .threads_per_device = 1, .checkpoint_keep = 1,
                       .host_budget = need / 2};
    s.oom_adapt = false;
    int rc = trainer_run_sync(&to, &h, &err);
    assert_int_equal(rc, ACC_ENOMEM);
    if (strstr(err.msg, "host memory") == NULL && strcmp(err.field, "host memory") != 0)
        fail_msg("the failure does not name host memory: %s: %s", err.field, err.msg);
}

/* checkpoints whose host size overflows: refused at submit, naming the key */
static void test_host_sizes_checked(void **state)
{
    (void)state;
    train_cfg s;
    llama_spec(&s, 1 << 24, 1, 1 << 24, 1);
    s.model.n_layer = 256;
    s.model.n_embd = 4096;
    s.model.n_head = 32;
    s.model.seq_len = 1 << 20;
    acc_err err = {0};
    assert_int_equal(plan_check_sizes(&s, &err), 0); /* on the device: fine (it fits nothing) */
    s.activation_offload = true;
    assert_int_equal(plan_check_sizes(&s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "activation_checkpointing.offload");
}

/* ---- the planner's targets (issues 20 and 21), from the configs */

/* QLoRA (quantized at load, LoRA r 16 all-linear), bf16, m 1 with
 * recomputation, lean activations and host checkpoints, on one 24 GiB CUDA
 * card: the planner's m = 1 row at seq T (POST /v1/plan's reading:
 * config.json alone). */
static plan_row qlora_row(const char *root, const char *dir, int T, bool offload)
{
    train_cfg *s = calloc(1, sizeof *s);
    assert_non_null(s);
    fx_qlora_plan_spec(s, root, dir, T);
    s->lean_activations = true;
    s->activation_offload = offload;
    plan_row rows[2];
    int n = 0, chosen = -1;
    acc_err err = {0};
    if (plan_candidates_on(s, KERN_DEV_CUDA, 24ull << 30, rows, 2, &n, &chosen, &err) != 0)
        fail_msg("%s: %s: %s", dir, err.field, err.msg);
    assert_int_equal(n, 1);
    free(s);
    return rows[0];
}

static void test_planner_targets(void **state)
{
    (void)state;
    char root[] = "/tmp/accumd-targets-XXXXXX";
    assert_non_null(mkdtemp(root));
    assert_int_equal(fx_write_config(root, "Llama-2-7b-hf", fx_llama2_7b_config()), 0);
    assert_int_equal(fx_write_config(root, "Llama-3.1-8B", fx_llama31_8b_config()), 0);
    const double gib = 1024.0 * 1024.0 * 1024.0;
    /* LLaMA-2-7B at seq 4096: <= 8 GiB on the device */
    plan_row r = qlora_row(root, "Llama-2-7b-hf", 4096, true);
    print_message("LLaMA-2-7B QLoRA seq 4096 m 1: device %.2f GiB (weights %.2f, activations %.2f), "
                  "host checkpoints %.2f GiB\n",
                  r.device_bytes / gib, r.parts.weights / gib, r.parts.activations / gib,
                  r.host.activations / gib);
    assert_true(r.fits);
    assert_true(r.device_bytes <= 8ull << 30);
    /* bf16: the embedding's output in fp32, the 31 rounded block outputs in bf16 */
    assert_true(r.host.activations == 4096ull * 4096 * (4 + 2 * 31) && r.host_bytes >= r.host.activations);
    /* LLaMA-3.1-8B: 80,000 tokens fit one 24 GiB card, and not without the
     * host checkpoints */
    r = qlora_row(root, "Llama-3.1-8B", 80000, true);
    print_message("LLaMA-3.1-8B QLoRA seq 80000 m 1: device %.2f GiB (weights %.2f, activations %.2f), "
                  "host checkpoints %.2f GiB\n",
                  r.device_bytes / gib, r.parts.weights / gib, r.parts.activations / gib,
                  r.host.activations / gib);
    assert_true(r.fits);
    assert_false(qlora_row(root, "Llama-3.1-8B", 80000, false).fits);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_offload_bit_identical),
        cmocka_unit_test(test_tok_chunks_close),
        cmocka_unit_test(test_bytes_exact),
        cmocka_unit_test(test_host_budget_too_small),
        cmocka_unit_test(test_trainer_offload),
        cmocka_unit_test(test_split_invariance_offload),
        cmocka_unit_test(test_trainer_host_budget),
        cmocka_unit_test(test_planner_targets),
        cmocka_unit_test(test_host_sizes_checked),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
