/* engine_fixture: shared helpers of the engine tests (header-only, static).
 *
 * A tiny GPT-2 job spec over a generated text file (and its LLaMA and LoRA
 * variants), CPU device lists, a test group's work directory, trainer runs
 * on CPU devices that record what tests compare (per-step losses, final
 * weights, peaks), and relative comparisons of float vectors. Included
 * after <cmocka.h>, it also gives the assertions over such runs and a
 * one-rank ZeRO-3 store checked against the whole model.
 */
#ifndef ACC_ENGINE_FIXTURE_H
#define ACC_ENGINE_FIXTURE_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fsutil.h"
#include "kern_comm.h"
#include "kern_device.h"
#include "kern_discover.h"
#include "mem_plan.h"
#include "model.h"
#include "model_shard.h"
#include "train_cfg.h"
#include "trainer_run.h"

/* Write `n` bytes of English-like text (deterministic) to a temp file. */
static inline void fx_write_text(char *path, size_t cap, size_t n)
{
    static const char *words[] = {"the", "model", "learns", "to", "predict", "next",
                                  "byte", "of", "text", "and", "accumulates", "gradients",
                                  "in", "place", "across", "micro", "steps", "while"};
    snprintf(path, cap, "/tmp/accumd-fx-XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0)
        abort();
    FILE *f = fdopen(fd, "w");
    unsigned x = 12345;
    size_t w = 0;
    while (w < n) {
        x = x * 1103515245u + 12345u;
        const char *s = words[(x >> 16) % (sizeof words / sizeof *words)];
        w += (size_t)fprintf(f, "%s%s", s, (x >> 8) % 7 == 0 ? ".\n" : " ");
    }
    fclose(f);
}

static inline void fx_tiny_spec(train_cfg *s, const char *train, int B, int m, int a, int w)
{
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "fixture");
    snprintf(s->model.arch, sizeof s->model.arch, "gpt2");
    s->model.n_layer = 2;
    s->model.n_head = 2;
    s->model.n_embd = 32;
    s->model.seq_len = 16;
    s->model.vocab_size = 256;
    s->model.padded_vocab_size = 264; /* exercises the padded rows */
    snprintf(s->data.train, sizeof s->data.train, "%s", train);
    s->data.format = SPEC_DATA_TEXT;
    s->train_batch_size = B;
    s->micro_batch = m;
    s->accum_steps = a;
    s->devices = w;
    s->optim.lr = 1e-3;
    s->optim.beta1 = 0.9;
    s->optim.beta2 = 0.95;
    s->optim.eps = 1e-8;
    s->optim.weight_decay = 0.1;
    s->optim.grad_clip = 1.0;
    s->lr.type = SPEC_LR_CONSTANT;
    s->max_steps = 4;
    s->eval_batches = 1;
    s->seed = 1337;
}

static inline void fx_devices(kern_device_info *d, int n, uint64_t budget)
{
    memset(d, 0, sizeof *d * (size_t)n);
    for (int i = 0; i < n; i++) {
        d[i].kind = KERN_DEV_CPU;
        d[i].index = i;
        snprintf(d[i].name, sizeof d[i].name, "cpu%d", i);
        d[i].mem_total = budget;
    }
}

/* The tiny job (B = m a w) as `arch`: "gpt2"; "llama" (one key/value
 * head, MLP of 48); "llama-lora" (that LLaMA with LoRA r 4 on every
 * projection: AdamW's range is the adapters). Clipping at 0.05: the tiny
 * model's norms are ~1, so every step clips. */
static inline void fx_clipped_spec(train_cfg *s, const char *train, const char *arch, int m, int a, int w)
{
    fx_tiny_spec(s, train, m * a * w, m, a, w);
    if (!strcmp(arch, "llama-lora")) {
        arch = "llama";
        s->lora = (spec_lora){.r = 4, .alpha = 8, .all_linear = true};
    }
    if (!strcmp(arch, "llama")) {
        snprintf(s->model.arch, sizeof s->model.arch, "llama");
        s->model.n_kv_head = 1;
        s->model.intermediate_size = 48;
    }
    s->optim.grad_clip = 0.05;
}

/* A test group's inputs: `n` bytes of text (fx_write_text) and an empty
 * directory /tmp/accumd-<tag>-XXXXXX for its checkpoints. 0, or -1 when
 * the directory cannot be made (a group setup's failure). */
static inline int fx_workdir_make(char *text, size_t text_cap, size_t n, char *dir, size_t dir_cap, const char *tag)
{
    fx_write_text(text, text_cap, n);
    snprintf(dir, dir_cap, "/tmp/accumd-%s-XXXXXX", tag);
    return mkdtemp(dir) == NULL ? -1 : 0;
}

static inline void fx_workdir_remove(const char *text, const char *dir)
{
    unlink(text);
    fsu_rm_rf(dir, NULL);
}

/* ---- trainer runs on CPU devices */

enum { FX_STEPS_CAP = 256, FX_PARAMS_CAP = 1 << 20 };

/* What a run leaves for the comparisons: each step's loss, gradient norm
 * and validation loss (NAN where the step did not run or no eval did),
 * rank 0's final weights, the hooks' measured bytes, and the status with
 * its message (kept, not asserted: some runs are meant to fail). */
typedef struct fx_run {
    double loss[FX_STEPS_CAP], norm[FX_STEPS_CAP], val[FX_STEPS_CAP];
    float *params; /* [FX_PARAMS_CAP]: the caller frees it */
    train_hooks h;
    int status;
    acc_err err;
} fx_run;

/* An out-of-memory the run is told of once: on `rank`, at `step`'s first
 * micro-step, while the micro batch is `m` (the split before adapting). */
typedef struct fx_oom_at {
    int rank, step, m;
    int fired;
} fx_oom_at;

static inline int fx_inject_oom(void *ctx, int rank, int step, int micro, int m)
{
    fx_oom_at *at = ctx;
    if (at->fired || rank != at->rank || step != at->step || micro != 0 || m != at->m)
        return 0;
    at->fired = 1;
    return 1;
}

/* A run's setting besides its spec. */
typedef struct fx_run_opts {
    uint64_t device_budget; /* each CPU device's bytes */
    uint64_t host_budget;   /* the offloaded state's host bytes; 0: unlimited */
    int threads;            /* per device */
    size_t bucket_bytes;    /* 0: the trainer's default */
    fx_oom_at *oom;         /* NULL: none */
} fx_run_opts;

/* Runs s on s->devices CPU devices (at most TRAIN_MAX_RANKS); how it
 * ended is in r->status and r->err. */
static inline void fx_train(const train_cfg *s, const fx_run_opts *o, fx_run *r)
{
    kern_device_info devs[TRAIN_MAX_RANKS];
    if (s->devices < 1 || s->devices > TRAIN_MAX_RANKS)
        abort(); /* a test's own mistake */
    fx_devices(devs, s->devices, o->device_budget);
    memset(r, 0, sizeof *r);
    r->params = calloc(FX_PARAMS_CAP, sizeof(float));
    if (r->params == NULL)
        abort();
    for (int k = 0; k < FX_STEPS_CAP; k++)
        r->loss[k] = r->norm[k] = r->val[k] = NAN;
    r->h.steps_cap = FX_STEPS_CAP;
    r->h.step_loss = r->loss;
    r->h.step_grad_norm = r->norm;
    r->h.step_val_loss = r->val;
    r->h.final_params = r->params;
    r->h.final_params_cap = FX_PARAMS_CAP;
    r->h.bucket_bytes = o->bucket_bytes;
    if (o->oom != NULL) {
        r->h.inject_oom = fx_inject_oom;
        r->h.oom_ctx = o->oom;
    }
    /* the reservation also holds every rank's batch buffers (trainer.h, init_host) */
    uint64_t reserved =
        o->host_budget == 0 ? 0 : o->host_budget + (uint64_t)s->devices * plan_host_batch_bytes(s);
    trainer_opts to = {.spec = s, .devices = devs, .threads_per_device = o->threads, .host_budget = reserved};
    r->status = trainer_run_sync(&to, &r->h, &r->err);
}

#ifdef cmocka_unit_test /* the unit tests; the GPU tests include this header without cmocka */

/* r ran to its end; else `what` and its message on stderr. */
static inline void fx_assert_ran(const fx_run *r, const train_cfg *s, const char *what)
{
    if (r->status != 0)
        print_error("%s failed: %s\n", what, r->err.msg);
    assert_int_equal(r->status, 0);
    assert_int_equal(r->h.steps_done, s->max_steps);
}

/* The planner's figures of s: a rank's device bytes at s's micro batch
 * (no recomputation), the job's host bytes, and the model. */
static inline void fx_plan_figures(const train_cfg *s, uint64_t *device, uint64_t *host, model_config *cfg)
{
    acc_err err = {0};
    assert_int_equal(plan_device_bytes(s, s->micro_batch, false, device, &err), 0);
    assert_int_equal(plan_host_bytes(s, host, &err), 0);
    assert_int_equal(plan_model_config(s, cfg, &err), 0);
}

/* Steps [from, to)'s losses and the final weights: the same bits. Not the
 * norms: a ZeRO-3 run sums its partial norms over other pieces than stage
 * 0 does. */
static inline void fx_assert_same_losses(const fx_run *a, const fx_run *b, int from, int to)
{
    for (int k = from; k < to; k++) {
        if (memcmp(&a->loss[k], &b->loss[k], sizeof(double)) != 0)
            print_error("step %d: loss %.17g vs %.17g\n", k, a->loss[k], b->loss[k]);
        assert_true(isfinite(a->loss[k]));
        assert_memory_equal(&a->loss[k], &b->loss[k], sizeof(double));
    }
    assert_true(a->h.nparams > 0 && a->h.nparams == b->h.nparams);
    assert_memory_equal(a->params, b->params, a->h.nparams * sizeof(float));
}

/* Steps [from, to) (losses and norms) and the final weights: the same bits. */
static inline void fx_assert_same_bits(const fx_run *a, const fx_run *b, int from, int to)
{
    for (int k = from; k < to; k++) {
        if (memcmp(&a->norm[k], &b->norm[k], sizeof(double)) != 0)
            print_error("step %d: norm %.17g vs %.17g\n", k, a->norm[k], b->norm[k]);
        assert_memory_equal(&a->norm[k], &b->norm[k], sizeof(double));
    }
    fx_assert_same_losses(a, b, from, to);
}

/* ---- the ZeRO-3 store (model_shard.h) against the whole model */

/* One CPU device with a whole model `a` and the same model sharded over
 * a world of one `b` (a gather is a copy), both from seed 7, for a micro
 * batch of B x T. */
typedef struct fx_store_pair {
    kern_device *dev;
    kern_comm *comm;
    model *a, *b;
    int B, T;
} fx_store_pair;

/* bf16: the device in bf16 mode (cfg's weights_bf16 is the caller's). */
static inline void fx_store_open(const model_config *cfg, int B, int T, bool bf16, fx_store_pair *p)
{
    acc_err err = {0};
    kern_device_info di[1];
    fx_devices(di, 1, 1ull << 30);
    memset(p, 0, sizeof *p);
    p->B = B;
    p->T = T;
    assert_int_equal(kern_device_open(&di[0], 1, &p->dev, &err), 0);
    if (bf16)
        assert_int_equal(p->dev->ops->set_precision(p->dev, 1, &err), 0);
    assert_int_equal(kern_comm_create(1, &p->comm, &err), 0);
    model_opts oa = {.B = B, .T = T, .grad_tail = 4}, ob = oa;
    ob.comm = p->comm;
    ob.world = 1;
    assert_int_equal(model_create_ex(p->dev, cfg, &oa, &p->a, &err), 0);
    assert_int_equal(model_create_ex(p->dev, cfg, &ob, &p->b, &err), 0);
    assert_int_equal(model_init_seed(p->a, 7, &err), 0);
    assert_int_equal(model_init_seed(p->b, 7, &err), 0);
}

static inline void fx_store_close(fx_store_pair *p)
{
    model_free(p->a);
    model_free(p->b);
    kern_comm_destroy(p->comm);
    kern_device_close(p->dev);
}

/* A forward and a backward of one fixed batch through both: the same
 * loss and gradients bit for bit, each of b's L blocks gathered once a
 * pass (prefetch included), b's gathered parameters a's. Returns the loss;
 * a's parameters in `master` (nparams floats) unless NULL. */
static inline double fx_assert_store_pass(fx_store_pair *p, float *master)
{
    int B = p->B, T = p->T, V = p->a->cfg.vocab_size;
    uint64_t L = (uint64_t)p->a->cfg.n_layer;
    int *tok = malloc((size_t)(B * T) * sizeof *tok), *tgt = malloc((size_t)(B * T) * sizeof *tgt);
    float *w = malloc((size_t)(B * T) * sizeof *w);
    assert_true(tok != NULL && tgt != NULL && w != NULL);
    for (int i = 0; i < B * T; i++) {
        tok[i] = (i * 37 + 11) % V;
        tgt[i] = (i * 53 + 5) % V;
        w[i] = 1.0f / (float)(B * T);
    }
    double la, lb;
    model_forward(p->a, tok, tgt, w, B, 1, &la);
    model_backward(p->a, B);
    uint64_t g0 = model_shard_gathers(p->b);
    model_forward(p->b, tok, tgt, w, B, 1, &lb);
    assert_int_equal(model_shard_gathers(p->b) - g0, L);
    model_backward(p->b, B);
    assert_int_equal(model_shard_gathers(p->b) - g0, 2 * L);
    assert_int_equal(model_shard_error(p->b), 0);
    assert_memory_equal(&la, &lb, sizeof la);
    size_t n = p->a->nparams;
    float *ga = malloc(n * sizeof *ga), *gb = malloc(n * sizeof *gb);
    assert_true(ga != NULL && gb != NULL);
    p->dev->ops->download(p->dev, ga, p->a->grads, n * sizeof *ga);
    assert_int_equal(model_shard_gather_host(p->b, p->b->grads, gb), 0);
    assert_memory_equal(ga, gb, n * sizeof *ga);
    model_params_download(p->a, ga);
    assert_int_equal(model_params_gather(p->b, true), 0);
    model_params_download(p->b, gb);
    model_params_release(p->b);
    assert_memory_equal(ga, gb, n * sizeof *ga);
    if (master != NULL)
        memcpy(master, ga, n * sizeof *ga);
    free(ga);
    free(gb);
    free(tok);
    free(tgt);
    free(w);
    return lb;
}

/* pin_memory's test double: a copy of a CPU device (same backend state)
 * under fx_pin_ops, whose host_register records what it registers and
 * refuses the call numbered `refuse` (1-based; 0: none), and whose
 * host_unregister checks it was registered. */
typedef struct fx_pin_dev {
    kern_device dev; /* first: the ops get &dev */
    void *reg[8];
    int nreg, nunreg, refuse;
} fx_pin_dev;

static inline int fx_pin_register(kern_device *d, void *p, size_t bytes, acc_err *err)
{
    fx_pin_dev *pd = (fx_pin_dev *)d;
    assert_true(bytes > 0);
    if (pd->nreg + 1 == pd->refuse)
        return acc_err_set(err, ACC_EDEVICE, "devices", "refused by the test");
    assert_true(pd->nreg < (int)(sizeof pd->reg / sizeof *pd->reg));
    pd->reg[pd->nreg++] = p;
    return 0;
}

static inline void fx_pin_unregister(kern_device *d, void *p)
{
    fx_pin_dev *pd = (fx_pin_dev *)d;
    bool known = false;
    for (int i = 0; i < pd->nreg; i++)
        known = known || pd->reg[i] == p;
    assert_true(known);
    pd->nunreg++;
}

/* d's ops with the double's host_register and host_unregister. */
static inline kern_ops fx_pin_ops(const kern_device *d)
{
    kern_ops ops = *d->ops;
    ops.host_register = fx_pin_register;
    ops.host_unregister = fx_pin_unregister;
    return ops;
}

static inline void fx_read_file(const char *path, char **data, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    *data = malloc(*n);
    assert_non_null(*data);
    assert_int_equal(fread(*data, 1, *n, f), *n);
    fclose(f);
}

/* Two files, byte for byte (checkpoints written two ways). */
static inline void fx_assert_same_file(const char *a, const char *b)
{
    char *da, *db;
    size_t na, nb;
    fx_read_file(a, &da, &na);
    fx_read_file(b, &db, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(da, db, na);
    free(da);
    free(db);
}

/* Two checkpoint directories hold the same state and model files, byte
 * for byte. */
static inline void fx_assert_same_checkpoint(const char *dir_a, const char *dir_b)
{
    static const char *files[] = {"state.safetensors", "model.safetensors"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char a[512], b[512];
        snprintf(a, sizeof a, "%s/%s", dir_a, files[i]);
        snprintf(b, sizeof b, "%s/%s", dir_b, files[i]);
        fx_assert_same_file(a, b);
    }
}

#endif

/* ||a - b|| / ||a|| in double */
static inline double fx_rel_diff(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)a[i] * a[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#endif
