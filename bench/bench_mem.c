/* bench_mem: what the split costs and what it buys, on CPU devices.
 *
 * Part 1, throughput over m at a fixed B: trains GPT-2 "small" (4 layers,
 * 4 heads, 128 channels, seq 64, byte vocabulary) with B = --batch on one
 * device for every m dividing B (a = B/m), and prints tokens/s (median of
 * the steps after the warm-up), the planner's predicted peak and whether it
 * fits --budget-mib, marking the planner's pick. Part 2, peak memory over
 * (m, a): one optimizer step per cell, the device accounting's peak, for
 * m in 1, 2, 4, 8 and a in 1, 4, 32, stored and with recomputation. Part 3,
 * what recomputation costs: tokens/s and peak, stored vs recomputed, at the
 * same (m, a). Not a test: nothing is asserted.
 *
 *   bench_mem [--batch B] [--threads N] [--steps S] [--warmup W] [--runs R]
 *             [--budget-mib M] [--data FILE]
 *
 * Throughput figures are the median over R runs of each run's median step.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mem_plan.h"
#include "trainer_run.h"
#include "bench_util.h"

typedef struct bench_args {
    int batch, threads, steps, warmup, runs;
    double budget_mib;
    const char *data;
} bench_args;

typedef struct step_log {
    int n, cap;
    double *tok_s;
} step_log;

static void on_event(void *ctx, const train_event *ev)
{
    step_log *l = ctx;
    if (ev->kind == TEV_STEP && l->n < l->cap)
        l->tok_s[l->n++] = ev->tokens_per_s;
}

static void parse_args(int argc, char **argv, bench_args *a)
{
    *a = (bench_args){.batch = 32, .threads = 2, .steps = 8, .warmup = 2, .runs = 3, .budget_mib = 64,
                      .data = "/usr/share/common-licenses/GPL-3"};
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--batch")) a->batch = atoi(v);
        else if (!strcmp(k, "--threads")) a->threads = atoi(v);
        else if (!strcmp(k, "--steps")) a->steps = atoi(v);
        else if (!strcmp(k, "--warmup")) a->warmup = atoi(v);
        else if (!strcmp(k, "--runs")) a->runs = atoi(v);
        else if (!strcmp(k, "--budget-mib")) a->budget_mib = atof(v);
        else if (!strcmp(k, "--data")) a->data = v;
        else {
            fprintf(stderr, "unknown option %s\n", k);
            exit(2);
        }
    }
    if (a->batch < 1 || a->steps <= a->warmup || a->threads < 1 || a->runs < 1 || a->runs > 15) {
        fprintf(stderr, "need batch >= 1, steps > warmup, threads >= 1, runs 1..15\n");
        exit(2);
    }
}

static void make_spec(const bench_args *a, train_cfg *s, int B, int m, int steps)
{
    memset(s, 0, sizeof *s);
    snprintf(s->model.arch, sizeof s->model.arch, "gpt2");
    s->model.n_layer = 4;
    s->model.n_head = 4;
    s->model.n_embd = 128;
    s->model.seq_len = 64;
    s->model.vocab_size = 256;
    s->model.padded_vocab_size = 256;
    snprintf(s->data.train, sizeof s->data.train, "%s", a->data);
    s->data.format = SPEC_DATA_TEXT;
    s->train_batch_size = B;
    s->micro_batch = m;
    s->accum_steps = B / m;
    s->devices = 1;
    s->optim = (spec_optim){.lr = 3e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                            .weight_decay = 0.1, .grad_clip = 1.0};
    s->max_steps = steps;
    s->seed = 1337;
    s->oom_adapt = true;
}

/* One run; returns the median tokens/s after warm-up, and the peak. */
static int run(const bench_args *a, const train_cfg *s, double *tok_s, uint64_t *peak)
{
    kern_device_info dev = {.kind = KERN_DEV_CPU, .index = 0, .mem_total = 8ull << 30};
    snprintf(dev.name, sizeof dev.name, "cpu0");
    step_log log = {.cap = s->max_steps, .tok_s = calloc((size_t)s->max_steps, sizeof(double))};
    if (log.tok_s == NULL)
        return 1;
    trainer_opts o = {.spec = s, .devices = &dev, .threads_per_device = a->threads,
                      .on_event = on_event, .event_ctx = &log};
    train_hooks h = {0};
    acc_err err = {0};
    int rc = trainer_run_sync(&o, &h, &err);
    if (rc != 0)
        fprintf(stderr, "run failed: %s\n", err.msg);
    int skip = log.n > a->warmup ? a->warmup : 0;
    *tok_s = bench_median(log.tok_s + skip, log.n - skip);
    *peak = h.mem_peak[0];
    free(log.tok_s);
    return rc;
}

/* Median tokens/s over a->runs runs of the same spec. */
static int run_median(const bench_args *a, const train_cfg *s, double *tok_s, uint64_t *peak)
{
    double tok[16];
    for (int r = 0; r < a->runs; r++)
        if (run(a, s, &tok[r], peak) != 0)
            return 1;
    *tok_s = bench_median(tok, a->runs);
    return 0;
}

static int throughput_over_m(const bench_args *a)
{
    train_cfg s;
    make_spec(a, &s, a->batch, 1, a->steps);
    uint64_t budget = (uint64_t)(a->budget_mib * 1024 * 1024);
    plan_row rows[PLAN_MAX_ROWS];
    int n = 0, chosen = -1;
    acc_err err = {0};
    if (plan_candidates(&s, budget, rows, PLAN_MAX_ROWS, &n, &chosen, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    printf("B = %d, one device, %d threads, budget %.0f MiB (planner keeps %d%% free)\n\n",
           a->batch, a->threads, a->budget_mib, PLAN_MARGIN_PCT);
    printf("| m | a | tokens/s | predicted peak MiB | measured peak MiB | fits | planner |\n");
    printf("|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < n; i++) {
        const plan_row *r = &rows[i];
        make_spec(a, &s, a->batch, r->micro_batch, a->steps);
        s.activation_checkpointing = r->recompute;
        double tok = 0;
        uint64_t peak = 0;
        if (run_median(a, &s, &tok, &peak) != 0)
            return 1;
        printf("| %d%s | %d | %.0f | %.2f | %.2f | %s | %s |\n", r->micro_batch,
               r->recompute ? " (recompute)" : "", r->accum_steps, tok,
               (double)r->peak_bytes / 1048576.0, (double)peak / 1048576.0,
               r->fits ? "yes" : "no", i == chosen ? "**pick**" : "");
        fflush(stdout);
    }
    return 0;
}

static int peak_over_m_a(const bench_args *a)
{
    static const int ms[] = {1, 2, 4, 8}, as[] = {1, 4, 32};
    printf("\nPeak device bytes, one optimizer step, GPT-2 small, seq 64\n\n");
    printf("| m | mode | a = 1 | a = 4 | a = 32 | a=32 vs a=1 |\n|---|---|---|---|---|---|\n");
    for (int rec = 0; rec < 2; rec++)
        for (size_t i = 0; i < sizeof ms / sizeof *ms; i++) {
            uint64_t peak[3] = {0};
            for (size_t j = 0; j < sizeof as / sizeof *as; j++) {
                train_cfg s;
                make_spec(a, &s, ms[i] * as[j], ms[i], 1);
                s.activation_checkpointing = rec;
                double tok;
                if (run(a, &s, &tok, &peak[j]) != 0)
                    return 1;
            }
            printf("| %d | %s | %llu | %llu | %llu | %+.2f%% |\n", ms[i],
                   rec ? "recompute" : "stored", (unsigned long long)peak[0],
                   (unsigned long long)peak[1], (unsigned long long)peak[2],
                   100.0 * ((double)peak[2] - (double)peak[0]) / (double)peak[0]);
            fflush(stdout);
        }
    return 0;
}

static int recompute_cost(const bench_args *a)
{
    static const int ms[] = {1, 4, 8, 32};
    printf("\nActivation recomputation at the same split, B = %d\n\n", a->batch);
    printf("| m | a | tokens/s stored | tokens/s recompute | time cost | peak MiB stored | "
           "peak MiB recompute | peak saved |\n|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof ms / sizeof *ms; i++) {
        if (a->batch % ms[i] != 0)
            continue;
        double tok[2];
        uint64_t peak[2];
        for (int rec = 0; rec < 2; rec++) {
            train_cfg s;
            make_spec(a, &s, a->batch, ms[i], a->steps);
            s.activation_checkpointing = rec;
            if (run_median(a, &s, &tok[rec], &peak[rec]) != 0)
                return 1;
        }
        printf("| %d | %d | %.0f | %.0f | %+.0f%% | %.2f | %.2f | %.0f%% |\n", ms[i],
               a->batch / ms[i], tok[0], tok[1], 100.0 * (tok[0] / tok[1] - 1.0),
               (double)peak[0] / 1048576.0, (double)peak[1] / 1048576.0,
               100.0 * (1.0 - (double)peak[1] / (double)peak[0]));
        fflush(stdout);
    }
    return 0;
}

int main(int argc, char **argv)
{
    bench_args a;
    parse_args(argc, argv, &a);
    if (throughput_over_m(&a) != 0 || recompute_cost(&a) != 0)
        return 1;
    return peak_over_m_a(&a);
}
