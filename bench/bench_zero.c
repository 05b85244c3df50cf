/* bench_zero: peak device memory per rank under ZeRO stages 0 to 3,
 * over w = 1, 2 and 4 CPU devices, measured next to the planner's
 * prediction, for a LLaMA-shaped model (GQA, SwiGLU, RMSNorm, RoPE).
 *
 * Each cell trains --steps optimizer steps at B = 8, micro batch 2 (so the
 * activations per rank are the same in every cell) and prints, for rank 0
 * (the largest shard, the job's peak) and the smallest rank: the device
 * accounting's peak, the planner's prediction (plan_rank_state_bytes +
 * plan_act_bytes), and the AdamW and gradient bytes measured at creation,
 * and the seconds per optimizer step (stage 3: the per-block gathers and
 * reduce-scatters against stage 0). Not a test: nothing is asserted.
 * --precision bf16: the same in bf16 (at stage 3 the gathered blocks'
 * matrices are bf16 working weights, docs/engine.md "bf16 at stage 3").
 * --offload 1: every cell with offload_optimizer "cpu" (in bf16 at stage 3
 * the device partition's matrices are then bf16 too); the prediction and
 * the AdamW column are the device's, the host peak is printed too.
 *
 *   bench_zero [--threads N] [--steps S] [--layers L] [--embd C] [--data FILE] [--precision fp32|bf16]
 *              [--offload 0|1]
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mem_plan.h"
#include "trainer_run.h"

typedef struct bench_args {
    int threads, steps, layers, embd;
    bool bf16, offload;
    const char *data;
} bench_args;

static void parse_args(int argc, char **argv, bench_args *a)
{
    *a = (bench_args){.threads = 1, .steps = 1, .layers = 6, .embd = 384,
                      .data = "/usr/share/common-licenses/GPL-3"};
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--threads")) a->threads = atoi(v);
        else if (!strcmp(k, "--steps")) a->steps = atoi(v);
        else if (!strcmp(k, "--layers")) a->layers = atoi(v);
        else if (!strcmp(k, "--embd")) a->embd = atoi(v);
        else if (!strcmp(k, "--data")) a->data = v;
        else if (!strcmp(k, "--offload") && (!strcmp(v, "0") || !strcmp(v, "1")))
            a->offload = !strcmp(v, "1");
        else if (!strcmp(k, "--precision") && (!strcmp(v, "fp32") || !strcmp(v, "bf16")))
            a->bf16 = !strcmp(v, "bf16");
        else {
            fprintf(stderr, "unknown option %s\n", k);
            exit(2);
        }
    }
    if (a->threads < 1 || a->steps < 1 || a->layers < 1 || a->embd < 64 || a->embd % 64 != 0) {
        fprintf(stderr, "need threads >= 1, steps >= 1, layers >= 1, embd a multiple of 64\n");
        exit(2);
    }
}

static void make_spec(const bench_args *a, train_cfg *s, int w, int zero)
{
    memset(s, 0, sizeof *s);
    snprintf(s->model.arch, sizeof s->model.arch, "llama");
    s->model.n_layer = a->layers;
    s->model.n_head = a->embd / 64;        /* head size 64 */
    s->model.n_kv_head = a->embd / 192 > 0 ? a->embd / 192 : 1; /* GQA */
    if (s->model.n_head % s->model.n_kv_head != 0)
        s->model.n_kv_head = 1;
    s->model.n_embd = a->embd;
    s->model.intermediate_size = a->embd * 8 / 3 / 64 * 64; /* LLaMA's ~8/3 C */
    s->model.seq_len = 128;
    s->model.vocab_size = 256;
    s->model.padded_vocab_size = 256;
    snprintf(s->data.train, sizeof s->data.train, "%s", a->data);
    s->data.format = SPEC_DATA_TEXT;
    s->train_batch_size = 8;
    s->micro_batch = 2;
    s->accum_steps = 8 / (2 * w);
    s->devices = w;
    s->zero_stage = zero;
    s->optim = (spec_optim){.lr = 3e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1,
                            .grad_clip = 1.0};
    s->lr.type = SPEC_LR_CONSTANT;
    s->max_steps = a->steps;
    s->eval_batches = 1;
    s->seed = 1337;
    s->precision = a->bf16 ? SPEC_BF16 : SPEC_FP32;
    s->offload_optimizer = a->offload;
}

static double mib(uint64_t b)
{
    return (double)b / (1024.0 * 1024.0);
}

int main(int argc, char **argv)
{
    bench_args a;
    parse_args(argc, argv, &a);
    static const int worlds[] = {1, 2, 4};
    int printed = 0;
    for (size_t wi = 0; wi < sizeof worlds / sizeof *worlds; wi++) {
        int w = worlds[wi];
        for (int zero = 0; zero <= 3; zero++) {
            if (w == 1 && zero > 0)
                continue; /* ZeRO needs devices >= 2 */
            train_cfg s;
            make_spec(&a, &s, w, zero);
            model_config cfg;
            acc_err err = {0};
            if (plan_model_config(&s, &cfg, &err) != 0) {
                fprintf(stderr, "config: %s\n", err.msg);
                return 1;
            }
            kern_device_info devs[4];
            memset(devs, 0, sizeof devs);
            for (int r = 0; r < w; r++) {
                devs[r].kind = KERN_DEV_CPU;
                devs[r].index = r;
                snprintf(devs[r].name, sizeof devs[r].name, "cpu%d", r);
                devs[r].mem_total = 8ull << 30;
            }
            train_hooks h;
            memset(&h, 0, sizeof h);
            trainer_opts o = {.spec = &s, .devices = devs, .threads_per_device = a.threads};
            if (trainer_run_sync(&o, &h, &err) != 0) {
                fprintf(stderr, "w=%d stage %d: %s\n", w, zero, err.msg);
                return 1;
            }
            if (!printed++) {
                printf("LLaMA-shaped: %d layers, C = %d, %d heads (%d KV), MLP %d, seq 128, vocab 256: "
                       "%zu parameters; B = 8, micro batch 2; %s%s\n\n",
                       s.model.n_layer, s.model.n_embd, s.model.n_head, s.model.n_kv_head,
                       s.model.intermediate_size, h.nparams, a.bf16 ? "bf16" : "fp32",
                       a.offload ? ", optimizer offloaded" : "");
                printf("| w | ZeRO | rank 0 peak (MiB) | predicted (MiB) | equal | AdamW rank 0 / rank w-1 (MiB) "
                       "| gradients (MiB) | peak rank w-1 (MiB) | host peak (MiB) | s / step |\n");
                printf("|---|---|---|---|---|---|---|---|---|---|\n");
            }
            uint64_t acts = plan_act_bytes(&cfg, s.micro_batch, s.model.seq_len, 0);
            uint64_t pred0 = plan_rank_device_state_bytes_op(&cfg, zero, a.offload, false, w, 0) + acts;
            uint64_t predl = plan_rank_device_state_bytes_op(&cfg, zero, a.offload, false, w, w - 1) + acts;
            printf("| %d | %d | %.3f | %.3f | %s | %.3f / %.3f | %.3f | %.3f%s | %.3f | %.3f |\n", w, zero, mib(h.mem_peak[0]),
                   mib(pred0), h.mem_peak[0] == pred0 && h.mem_peak[w - 1] == predl ? "yes" : "NO",
                   mib(h.mem_optim[0]), mib(h.mem_optim[w - 1]), mib(h.mem_grads[0]), mib(h.mem_peak[w - 1]),
                   h.mem_peak[w - 1] == predl ? "" : " (differs from the prediction)", mib(h.host_peak),
                   h.seconds / a.steps);
            fflush(stdout);
        }
    }
    return 0;
}
