/* bench_offload: the step-time cost of optimizer offload
 * (zero_optimization.offload_optimizer "cpu") on CPU devices, through the
 * trainer, for the bench_llama shape (6 layers, 384 channels, 6 heads with
 * 2 key/value heads, SwiGLU 1024, seq 128, vocab 32000), w = 1, ZeRO 0.
 *
 * Runs alternate without and with offload (--rounds pairs), each --steps
 * optimizer steps at B = --batch, micro batch --batch (one micro-step);
 * the figure is the median TEV_STEP step_seconds over every step after the
 * first of each run. It also prints each run's device peak and host_mem
 * peak, and checks that the two runs' final weights are the same bits
 * (the offload's contract; a mismatch is printed, the exit status is 1).
 * Then the optimizer step alone over the same parameter count (one
 * decaying run and one not), on the device and offloaded (gradients' copy,
 * host AdamW on the same threads, parameters' copy back), median of 9.
 * Not a test: the times depend on the machine's load.
 *
 *   bench_offload [--threads N] [--steps S] [--batch B] [--rounds R] [--data FILE]
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adamw.h"
#include "bench_util.h"
#include "host_mem.h"
#include "kern_device.h"
#include "mem_plan.h"
#include "trainer_run.h"

#define MAX_TIMES 4096

typedef struct bench_args {
    int threads, steps, batch, rounds;
    const char *data;
} bench_args;

typedef struct times {
    double v[MAX_TIMES];
    int n, seen; /* steps kept, steps of this run seen */
} times;

static void parse_args(int argc, char **argv, bench_args *a)
{
    *a = (bench_args){.threads = 2, .steps = 4, .batch = 8, .rounds = 2, .data = "/usr/share/common-licenses/GPL-3"};
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--threads")) a->threads = atoi(v);
        else if (!strcmp(k, "--steps")) a->steps = atoi(v);
        else if (!strcmp(k, "--batch")) a->batch = atoi(v);
        else if (!strcmp(k, "--rounds")) a->rounds = atoi(v);
        else if (!strcmp(k, "--data")) a->data = v;
        else {
            fprintf(stderr, "unknown option %s\n", k);
            exit(2);
        }
    }
    if (a->threads < 1 || a->steps < 2 || a->batch < 1 || a->rounds < 1) {
        fprintf(stderr, "need threads >= 1, steps >= 2, batch >= 1, rounds >= 1\n");
        exit(2);
    }
}

static void make_spec(const bench_args *a, train_cfg *s, bool offload)
{
    memset(s, 0, sizeof *s);
    snprintf(s->model.arch, sizeof s->model.arch, "llama");
    s->model.n_layer = 6;
    s->model.n_head = 6;
    s->model.n_kv_head = 2;
    s->model.n_embd = 384;
    s->model.intermediate_size = 1024;
    s->model.seq_len = 128;
    s->model.vocab_size = 32000;
    s->model.padded_vocab_size = 32000;
    snprintf(s->data.train, sizeof s->data.train, "%s", a->data);
    s->data.format = SPEC_DATA_TEXT;
    s->train_batch_size = a->batch;
    s->micro_batch = a->batch;
    s->accum_steps = 1;
    s->devices = 1;
    s->optim = (spec_optim){.lr = 3e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1,
                            .grad_clip = 1.0};
    s->lr.type = SPEC_LR_CONSTANT;
    s->max_steps = a->steps;
    s->eval_batches = 1;
    s->seed = 1337;
    s->offload_optimizer = offload;
}

static void on_event(void *ctx, const train_event *ev)
{
    times *t = ctx;
    if (ev->kind != TEV_STEP)
        return;
    if (t->seen++ > 0 && t->n < MAX_TIMES) /* the first step of a run warms up */
        t->v[t->n++] = ev->step_seconds;
}

/* Median seconds of adamw_step over n floats, on the device or offloaded. */
static double optimizer_alone(size_t n, int threads, bool offload)
{
    kern_device_info info;
    memset(&info, 0, sizeof info);
    info.kind = KERN_DEV_CPU;
    snprintf(info.name, sizeof info.name, "cpu0");
    kern_device *d;
    acc_err err = {0};
    if (kern_device_open(&info, threads, &d, &err) != 0)
        return -1;
    float *p, *g;
    if (d->ops->alloc(d, n * sizeof(float), (void **)&p, &err) != 0 ||
        d->ops->alloc(d, n * sizeof(float), (void **)&g, &err) != 0)
        return -1;
    float *h = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        h[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    d->ops->upload(d, p, h, n * sizeof(float));
    d->ops->upload(d, g, h, n * sizeof(float));
    free(h);
    model_tensor t[2];
    memset(t, 0, sizeof t);
    t[0] = (model_tensor){.offset = 0, .count = n - n / 64, .decays = true, .trains = true};
    t[1] = (model_tensor){.offset = n - n / 64, .count = n / 64, .decays = false, .trains = true};
    model_layout l = {.t = t, .n = 2, .nparams = n, .ntrain = n};
    host_mem hm;
    host_mem_init(&hm, 0);
    adamw *a;
    int rc = offload ? adamw_create_host(d, &hm, threads, false, 0, n, &a, &err) : adamw_create(d, 0, n, &a, &err);
    if (rc != 0)
        return -1;
    adamw_load_master(a, p);
    spec_optim o = {.lr = 3e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    double v[9];
    for (int r = -1; r < 9; r++) {
        double t0 = bench_now();
        adamw_step(a, &l, p, g, 3e-4f, &o, 1.0f);
        if (r >= 0)
            v[r] = bench_now() - t0;
    }
    adamw_free(a);
    host_mem_destroy(&hm);
    d->ops->free(d, g);
    d->ops->free(d, p);
    kern_device_close(d);
    return bench_median(v, 9);
}

static double mib(uint64_t b)
{
    return (double)b / (1024.0 * 1024.0);
}

int main(int argc, char **argv)
{
    bench_args a;
    parse_args(argc, argv, &a);
    static times tm[2];
    uint64_t peak[2] = {0, 0}, host[2] = {0, 0};
    size_t cap = 64u << 20;
    float *params[2] = {malloc(cap * sizeof(float)), malloc(cap * sizeof(float))};
    size_t nparams = 0;
    if (params[0] == NULL || params[1] == NULL)
        return 1;
    int same = 1;
    for (int r = 0; r < a.rounds; r++) {
        for (int off = 0; off <= 1; off++) {
            train_cfg s;
            make_spec(&a, &s, off);
            kern_device_info dev;
            memset(&dev, 0, sizeof dev);
            dev.kind = KERN_DEV_CPU;
            snprintf(dev.name, sizeof dev.name, "cpu0");
            dev.mem_total = 16ull << 30;
            train_hooks h;
            memset(&h, 0, sizeof h);
            h.final_params = params[off];
            h.final_params_cap = cap;
            tm[off].seen = 0;
            trainer_opts o = {.spec = &s, .devices = &dev, .threads_per_device = a.threads, .on_event = on_event,
                              .event_ctx = &tm[off]};
            acc_err err = {0};
            if (trainer_run_sync(&o, &h, &err) != 0) {
                fprintf(stderr, "offload %d: %s\n", off, err.msg);
                return 1;
            }
            peak[off] = h.mem_peak[0];
            host[off] = h.host_peak;
            nparams = h.nparams;
        }
        if (memcmp(params[0], params[1], nparams * sizeof(float)) != 0)
            same = 0;
    }
    double med[2];
    int n[2] = {tm[0].n, tm[1].n};
    for (int off = 0; off <= 1; off++)
        med[off] = bench_median(tm[off].v, tm[off].n);
    printf("LLaMA-shaped (bench_llama's shape): 6 layers, C 384, 6 heads (2 KV), MLP 1024, seq 128, vocab 32000: "
           "%zu parameters; B = micro batch %d, %d threads, %d rounds x %d steps\n\n",
           nparams, a.batch, a.threads, a.rounds, a.steps);
    printf("| optimizer | median step (s) | steps timed | device peak (MiB) | host_mem peak (MiB) |\n");
    printf("|---|---|---|---|---|\n");
    printf("| on the device | %.3f | %d | %.1f | %.1f |\n", med[0], n[0], mib(peak[0]), mib(host[0]));
    printf("| offloaded | %.3f | %d | %.1f | %.1f |\n", med[1], n[1], mib(peak[1]), mib(host[1]));
    printf("\noffload costs %+.1f%% step time; final weights %s\n", 100.0 * (med[1] / med[0] - 1.0),
           same ? "bit-identical" : "DIFFER");
    double dev = optimizer_alone(nparams, a.threads, false), off = optimizer_alone(nparams, a.threads, true);
    printf("\nthe optimizer step alone over %zu floats (median of 9): on the device %.1f ms, offloaded %.1f ms "
           "(%.2fx)\n", nparams, 1e3 * dev, 1e3 * off, dev > 0 ? off / dev : 0);
    free(params[0]);
    free(params[1]);
    return same ? 0 : 1;
}
