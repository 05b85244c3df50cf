/* bench_train: training throughput of the CPU engine against the BLAS ceiling.
 *
 * Trains GPT-2 (byte vocabulary) on W CPU devices (default 1; --threads is
 * per device, B = micro x W) and reports tokens/s and
 * achieved GFLOP/s, counting 6N + 6*L*C*T FLOP per token (N parameters,
 * forward + backward, attention included), next to the GFLOP/s cblas_sgemm
 * reaches on this machine with the same number of threads. Each figure is
 * the median over --runs runs; a run's figure is the median of its steps
 * after --warmup steps; the sgemm figure is measured (2048^3, OpenBLAS's own
 * threads set to --threads) just before each run, so both see the same
 * machine load. Not a test: nothing is asserted.
 *
 *   bench_train [--config small|medium] [--threads N] [--devices W] [--micro M]
 *               [--steps S] [--warmup W] [--runs R] [--data FILE] [--precision fp32|bf16]
 *
 *   --precision bf16: the job's "precision": "bf16" (bf16 matmul operands,
 *   fp32 accumulation; on CPU emulated by rounding operand panels before
 *   cblas_sgemm). FLOP/token is the same count either way.
 *
 *   small:  n_layer 4, n_head 4, n_embd 128, seq_len 64
 *   medium: n_layer 6, n_head 6, n_embd 384, seq_len 128
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "model_gpt2.h"
#include "trainer_run.h"
#include "bench_util.h"

typedef struct bench_args {
    const char *config;
    int threads, devices, micro, steps, warmup, runs;
    const char *data;
    int bf16;
} bench_args;

typedef struct step_log {
    int n, cap;
    double *tok_s;
} step_log;

/* The BLAS ceiling: one large square sgemm on OpenBLAS's own threads. */
static double sgemm_gflops(int threads, int size, int reps)
{
    size_t n = (size_t)size * size;
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *c = malloc(n * sizeof *c);
    if (!a || !b || !c) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        a[i] = (float)(i % 7) * 0.1f;
        b[i] = (float)(i % 5) * 0.1f;
    }
    openblas_set_num_threads(threads);
    double *g = malloc((size_t)reps * sizeof *g);
    for (int r = -1; r < reps; r++) {
        double t0 = bench_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, size, size, size, 1.0f, a, size, b,
                    size, 0.0f, c, size);
        double dt = bench_now() - t0;
        if (r >= 0)
            g[r] = 2.0 * size * (double)size * size / dt / 1e9;
    }
    double med = bench_median(g, reps);
    free(g);
    free(a);
    free(b);
    free(c);
    return med;
}

static void on_event(void *ctx, const train_event *ev)
{
    step_log *l = ctx;
    if (ev->kind == TEV_STEP && l->n < l->cap)
        l->tok_s[l->n++] = ev->tokens_per_s;
}

static void parse_args(int argc, char **argv, bench_args *a)
{
    *a = (bench_args){.config = "medium", .threads = 2, .devices = 1, .micro = 4, .steps = 12, .warmup = 2,
                      .runs = 5, .data = "/usr/share/common-licenses/GPL-3"};
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--config")) a->config = v;
        else if (!strcmp(k, "--threads")) a->threads = atoi(v);
        else if (!strcmp(k, "--devices")) a->devices = atoi(v);
        else if (!strcmp(k, "--micro")) a->micro = atoi(v);
        else if (!strcmp(k, "--steps")) a->steps = atoi(v);
        else if (!strcmp(k, "--warmup")) a->warmup = atoi(v);
        else if (!strcmp(k, "--runs")) a->runs = atoi(v);
        else if (!strcmp(k, "--data")) a->data = v;
        else if (!strcmp(k, "--precision") && (!strcmp(v, "bf16") || !strcmp(v, "fp32")))
            a->bf16 = !strcmp(v, "bf16");
        else {
            fprintf(stderr, "unknown option %s\n", k);
            exit(2);
        }
    }
    if (a->steps <= a->warmup || a->runs < 1 || a->threads < 1 || a->micro < 1 ||
        a->devices < 1 || a->devices > 8) {
        fprintf(stderr, "need steps > warmup, runs >= 1, threads >= 1, micro >= 1, devices 1..8\n");
        exit(2);
    }
}

static void make_spec(const bench_args *a, train_cfg *s)
{
    memset(s, 0, sizeof *s);
    snprintf(s->model.arch, sizeof s->model.arch, "gpt2");
    int small = !strcmp(a->config, "small");
    s->model.n_layer = small ? 4 : 6;
    s->model.n_head = small ? 4 : 6;
    s->model.n_embd = small ? 128 : 384;
    s->model.seq_len = small ? 64 : 128;
    s->model.vocab_size = 256;
    s->model.padded_vocab_size = 256;
    snprintf(s->data.train, sizeof s->data.train, "%s", a->data);
    s->data.format = SPEC_DATA_TEXT;
    s->train_batch_size = a->micro * a->devices;
    s->micro_batch = a->micro;
    s->accum_steps = 1;
    s->devices = a->devices;
    s->optim = (spec_optim){.lr = 3e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                            .weight_decay = 0.1, .grad_clip = 1.0};
    s->max_steps = a->steps;
    s->seed = 1337;
    s->precision = a->bf16 ? SPEC_BF16 : SPEC_FP32;
}

int main(int argc, char **argv)
{
    bench_args a;
    parse_args(argc, argv, &a);
    train_cfg s;
    make_spec(&a, &s);
    model_config cfg;
    acc_err err = {0};
    if (model_config_from_spec(&s.model, &cfg, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    double nparams = (double)model_num_params(&cfg);
    double flop_per_token = 6.0 * nparams + 6.0 * cfg.n_layer * cfg.channels * s.model.seq_len;


    kern_device_info devs[8];
    for (int i = 0; i < a.devices; i++) {
        devs[i] = (kern_device_info){.kind = KERN_DEV_CPU, .index = i, .mem_total = 8ull << 30};
        snprintf(devs[i].name, sizeof devs[i].name, "cpu%d", i);
    }
    double *run_tok = malloc((size_t)a.runs * sizeof *run_tok);
    double *run_ceiling = malloc((size_t)a.runs * sizeof *run_ceiling);
    step_log log = {.cap = a.steps, .tok_s = malloc((size_t)a.steps * sizeof(double))};
    if (!run_tok || !run_ceiling || !log.tok_s)
        return 1;
    for (int r = 0; r < a.runs; r++) {
        /* the ceiling is measured next to each run, under the same load */
        run_ceiling[r] = sgemm_gflops(a.threads * a.devices, 2048, 5);
        log.n = 0;
        trainer_opts o = {.spec = &s, .devices = devs, .threads_per_device = a.threads,
                          .on_event = on_event, .event_ctx = &log};
        train_hooks h = {0};
        if (trainer_run_sync(&o, &h, &err) != 0) {
            fprintf(stderr, "run failed: %s\n", err.msg);
            return 1;
        }
        run_tok[r] = bench_median(log.tok_s + a.warmup, log.n - a.warmup);
        fprintf(stderr, "run %d: %.0f tokens/s, sgemm %.1f GFLOP/s\n", r + 1, run_tok[r],
                run_ceiling[r]);
    }
    double tok = bench_median(run_tok, a.runs);
    double ceiling = bench_median(run_ceiling, a.runs);
    double gflops = tok * flop_per_token / 1e9;
    printf("config %s: n_layer %d n_head %d n_embd %d seq_len %d vocab 256, %.2fM params\n",
           a.config, cfg.n_layer, cfg.n_head, cfg.channels, s.model.seq_len, nparams / 1e6);
    const char *policy = getenv("OMP_WAIT_POLICY");
    printf("micro batch %d, %d device(s) x %d threads, %d runs x %d steps (%d warm-up), "
           "precision %s, OMP_WAIT_POLICY=%s\n",
           a.micro, a.devices, a.threads, a.runs, a.steps, a.warmup, a.bf16 ? "bf16" : "fp32",
           policy ? policy : "(unset)");
    printf("tokens/s          %.0f\n", tok);
    printf("achieved GFLOP/s  %.1f  (%.3g FLOP/token)\n", gflops, flop_per_token);
    printf("sgemm GFLOP/s     %.1f  (2048^3, %d threads)\n", ceiling, a.threads * a.devices);
    printf("fraction of sgemm %.1f%%\n", 100.0 * gflops / ceiling);
    free(run_tok);
    free(run_ceiling);
    free(log.tok_s);
    return 0;
}
