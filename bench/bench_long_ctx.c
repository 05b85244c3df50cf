/* bench_long_ctx: the planner's QLoRA figures with activation checkpoints in
 * host memory and token-chunked recomputed blocks (issues 20 and 21):
 *
 *   1. LLaMA-2-7B QLoRA (the base quantized at load to NF4, LoRA r 16
 *      all-linear), seq 4096, m 1, recomputation, bf16, one 24 GiB CUDA
 *      card: device bytes by part, today's mode (recompute) next to lean
 *      activations and lean + host checkpoints;
 *   2. LLaMA-3.1-8B QLoRA likewise: the longest seq_len that fits one
 *      24 GiB card with lean activations and host checkpoints (bisected to
 *      64 tokens), with its breakdown, and the same without the host
 *      checkpoints.
 *
 * The config.json files are written here from the published values (in
 * tests/unit/hf_configs.h, the ones test_act_offload.c checks); the
 * planner reads them as POST /v1/plan does (plan_only: config.json alone)
 * and answers through plan_candidates_on, the dry run's own entry point.
 *
 * Usage: bench_long_ctx
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mem_plan.h"
#include "../tests/unit/hf_configs.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

typedef struct mode {
    const char *name;
    bool lean, offload;
} mode;

/* The m = 1 recompute row of a QLoRA spec at seq T on one 24 GiB card. */
static int row_at(const char *root, const char *dir, int T, const mode *md, plan_row *out)
{
    train_cfg *s = calloc(1, sizeof *s);
    if (s == NULL)
        return -1;
    fx_qlora_plan_spec(s, root, dir, T);
    snprintf(s->name, sizeof s->name, "bench");
    s->lean_activations = md->lean;
    s->activation_offload = md->offload;
    plan_row rows[4];
    int n = 0, chosen = -1;
    acc_err err = {0};
    int rc = plan_candidates_on(s, KERN_DEV_CUDA, 24ull << 30, rows, 4, &n, &chosen, &err);
    free(s);
    if (rc != 0 || n < 1) {
        fprintf(stderr, "bench_long_ctx: %s: %s\n", err.field, err.msg);
        return -1;
    }
    *out = rows[0];
    return 0;
}

static void print_row(const char *what, int T, const plan_row *r)
{
    const plan_parts *p = &r->parts;
    printf("| %s | %d | %.2f GiB | %.2f GiB | %.2f GiB | %.2f GiB | %.2f GiB | %.2f GiB | "
           "**%.2f GiB** (%llu) | %.2f GiB | %s |\n",
           what, T, p->weights / GIB, p->gradients / GIB, p->optimizer / GIB, p->activations / GIB,
           (p->runtime + p->rounding) / GIB, r->peak_bytes / GIB, r->device_bytes / GIB,
           (unsigned long long)r->device_bytes, r->host.activations / GIB, r->fits ? "yes" : "no");
}

/* The longest T (a multiple of 64, <= max) whose row fits. */
static int longest(const char *root, const char *dir, const mode *md, int max, plan_row *best)
{
    int lo = 0, hi = max / 64; /* in units of 64 tokens: lo fits (or 0), hi + 1 does not */
    plan_row r;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (row_at(root, dir, mid * 64, md, &r) != 0)
            return -1;
        if (r.fits)
            lo = mid;
        else
            hi = mid - 1;
    }
    if (lo > 0 && row_at(root, dir, lo * 64, md, best) != 0)
        return -1;
    return lo * 64;
}

int main(void)
{
    char root[] = "/tmp/accumd-longctx-XXXXXX";
    if (mkdtemp(root) == NULL || fx_write_config(root, "Llama-2-7b-hf", fx_llama2_7b_config()) != 0 ||
        fx_write_config(root, "Llama-3.1-8B", fx_llama31_8b_config()) != 0) {
        perror("bench_long_ctx");
        return 1;
    }
    static const mode modes[] = {{"recompute", false, false},
                                 {"recompute + lean", true, false},
                                 {"recompute + lean + host checkpoints", true, true}};
    printf("QLoRA (NF4 base, LoRA r 16 all-linear), m 1, bf16, one 24 GiB CUDA card (22.8 GiB usable)\n\n");
    printf("| model, mode | seq_len | weights | gradients | optimizer | activations | runtime + "
           "rounding | peak (accounted) | device bytes | host checkpoints | fits |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|\n");
    int rc = 0;
    for (size_t i = 0; i < sizeof modes / sizeof *modes && rc == 0; i++) {
        plan_row r;
        char what[128];
        snprintf(what, sizeof what, "LLaMA-2-7B, %s", modes[i].name);
        if ((rc = row_at(root, "Llama-2-7b-hf", 4096, &modes[i], &r)) == 0)
            print_row(what, 4096, &r);
    }
    for (size_t i = 0; i < sizeof modes / sizeof *modes && rc == 0; i++) {
        plan_row r;
        char what[128];
        snprintf(what, sizeof what, "LLaMA-3.1-8B longest, %s", modes[i].name);
        int T = longest(root, "Llama-3.1-8B", &modes[i], 131072, &r);
        if (T < 0)
            rc = -1;
        else if (T > 0)
            print_row(what, T, &r);
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd) != 0)
        rc = -1;
    return rc == 0 ? 0 : 1;
}
