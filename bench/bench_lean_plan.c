/* bench_lean_plan: the planner's activation bytes for LLaMA-2-7B (config.json's
 * sizes written here) at seq 4096, with and without lean activations
 * (issue 20), stored and recomputed, micro batch 1 and 2, fp32 on a CPU
 * device (no backend workspace) -- model_act_bytes, what the planner counts
 * and the trainer allocates. Also the two parts lean activations shrink:
 * the attention scratch and the logits. The last two columns: the same in
 * bf16 (precision "bf16": activations stored in bf16, blocks.h), default
 * and lean.
 *
 * Usage: bench_lean_plan [seq_len]   (default 4096)
 */
#include <stdio.h>
#include <stdlib.h>

#include "blocks.h"
#include "kern_device.h"
#include "model.h"

static double gib(uint64_t b)
{
    return (double)b / (double)(1ull << 30);
}

int main(int argc, char **argv)
{
    int T = argc > 1 ? atoi(argv[1]) : 4096;
    acc_err err = {0};
    model_config cfg = {.family = model_family_by_arch("llama"), .n_layer = 32, .n_head = 32,
                        .n_kv_head = 32, .channels = 4096, .intermediate_size = 11008,
                        .vocab_size = 32000, .padded_vocab_size = 32000, .max_seq_len = T,
                        .norm_eps = 1e-5, .rope_theta = 10000.0};
    snprintf(cfg.model_type, sizeof cfg.model_type, "llama");
    if (T < 1 || cfg.family == NULL || model_config_check(&cfg, &err) != 0) {
        fprintf(stderr, "bench_lean_plan: %s\n", err.msg);
        return 1;
    }
    printf("LLaMA-2-7B, seq %d, activations (model_act_bytes: fp32; bf16 in the last two columns)\n", T);
    printf("| m | recompute | default | lean | saved | attention scratch (default -> lean) | "
           "logits (default -> lean) | bf16 default | bf16 lean |\n"
           "|---|---|---|---|---|---|---|---|---|\n");
    for (int m = 1; m <= 2; m++)
        for (int rec = 0; rec <= 1; rec++) {
            uint64_t a0, a1, b0, b1;
            model_config c0 = cfg, c1 = cfg, h0 = cfg, h1 = cfg;
            c1.lean_acts = h1.lean_acts = true;
            h0.act_bf16 = h1.act_bf16 = true;
            if (model_act_bytes(&c0, m, T, rec, &a0, &err) != 0 ||
                model_act_bytes(&c1, m, T, rec, &a1, &err) != 0 ||
                model_act_bytes(&h0, m, T, rec, &b0, &err) != 0 ||
                model_act_bytes(&h1, m, T, rec, &b1, &err) != 0) {
                fprintf(stderr, "bench_lean_plan: %s\n", err.msg);
                return 1;
            }
            uint64_t bt = (uint64_t)m * (uint64_t)T;
            uint64_t s0 = KERN_ATT_SCRATCH(T, cfg.n_head) * 4, s1 = KERN_ATT_LEAN_SCRATCH(T, cfg.n_head) * 4;
            uint64_t l0 = bt * 32000 * 4, l1 = blk_head_rows(bt, &c1) * 32000 * 4;
            printf("| %d | %s | %.2f GiB (%llu) | %.2f GiB (%llu) | %.2f GiB | %.2f GiB -> %.2f MiB | "
                   "%.2f GiB -> %.2f GiB | %.2f GiB (%llu) | %.2f GiB (%llu) |\n",
                   m, rec ? "on" : "off", gib(a0), (unsigned long long)a0, gib(a1),
                   (unsigned long long)a1, gib(a0 - a1), gib(s0), (double)s1 / (1 << 20), gib(l0),
                   gib(l1), gib(b0), (unsigned long long)b0, gib(b1), (unsigned long long)b1);
        }
    return 0;
}
