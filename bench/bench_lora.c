/* bench_lora: one training step of a LLaMA-shaped model on one CPU device,
 * full fine-tune vs LoRA (model_lora.h) vs QLoRA (LoRA on a 4-bit NF4 base,
 * h-nf4), and each one's device peak.
 *
 * Each step is forward + backward + AdamW (core/train/adamw.c, the
 * trainer's optimizer: moments for the trainable elements only), random
 * tokens, micro batch B; the median of --steps steps after --warmup. The
 * variants run interleaved step by step (full, LoRA q/v, LoRA all-linear,
 * full, ...) so a loaded machine slows them alike. The peak is the device
 * accounting's (parameters, gradients, moments, activations).
 *
 * Usage: bench_lora [--threads 2] [--batch 4] [--steps 5] [--warmup 1]
 *                   [--layers 4] [--channels 256] [--heads 4] [--kv-heads 2]
 *                   [--mlp 688] [--seq 128] [--vocab 8000] [--r 16]
 *                   [--recompute]
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adamw.h"
#include "bench_util.h"
#include "model.h"
#include "model_lora.h"
#include "rng.h"

typedef struct args {
    int threads, batch, steps, warmup, layers, channels, heads, kv, mlp, seq, vocab, r, recompute;
} args;

void openblas_set_num_threads(int n);

static int parse(int argc, char **argv, args *a)
{
    *a = (args){2, 4, 5, 1, 4, 256, 4, 2, 688, 128, 8000, 16, 0};
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        if (!strcmp(k, "--recompute")) {
            a->recompute = 1;
            continue;
        }
        if (i + 1 >= argc)
            return -1;
        int v = atoi(argv[++i]);
        if (!strcmp(k, "--threads")) a->threads = v;
        else if (!strcmp(k, "--batch")) a->batch = v;
        else if (!strcmp(k, "--steps")) a->steps = v;
        else if (!strcmp(k, "--warmup")) a->warmup = v;
        else if (!strcmp(k, "--layers")) a->layers = v;
        else if (!strcmp(k, "--channels")) a->channels = v;
        else if (!strcmp(k, "--heads")) a->heads = v;
        else if (!strcmp(k, "--kv-heads")) a->kv = v;
        else if (!strcmp(k, "--mlp")) a->mlp = v;
        else if (!strcmp(k, "--seq")) a->seq = v;
        else if (!strcmp(k, "--vocab")) a->vocab = v;
        else if (!strcmp(k, "--r")) a->r = v;
        else return -1;
    }
    return a->steps >= 1 && a->steps <= 32 ? 0 : -1;
}

typedef struct variant {
    const char *name;
    kern_device *d;
    model *m;
    adamw *opt;
    double times[32];
} variant;

static int setup(variant *v, const args *a, const model_config *base, const spec_lora *sl,
                 acc_err *err)
{
    model_config cfg = *base;
    kern_device_info info = {.kind = KERN_DEV_CPU, .mem_total = 16ull << 30};
    snprintf(info.name, sizeof info.name, "cpu0");
    int rc = model_lora_apply(sl, false, &cfg, err);
    if (rc == 0)
        rc = kern_device_open(&info, a->threads, &v->d, err);
    if (rc == 0)
        rc = model_create(v->d, &cfg, 0, a->seq, &v->m, err);
    if (rc == 0)
        rc = model_acts_alloc(v->m, a->batch, a->recompute, err);
    if (rc == 0)
        rc = model_init_seed(v->m, 1, err);
    if (rc == 0)
        rc = model_lora_init(v->m, 1, err);
    if (rc == 0)
        rc = adamw_create(v->d, 0, v->m->ngrad, &v->opt, err);
    return rc;
}

int main(int argc, char **argv)
{
    args a;
    if (parse(argc, argv, &a) != 0) {
        fprintf(stderr, "usage: see bench_lora.c\n");
        return 2;
    }
    acc_err err = {0};
    model_config cfg = {.family = model_family_by_arch("llama"), .n_layer = a.layers,
                        .n_head = a.heads, .n_kv_head = a.kv, .channels = a.channels,
                        .intermediate_size = a.mlp, .vocab_size = a.vocab,
                        .padded_vocab_size = (a.vocab + 63) / 64 * 64, .max_seq_len = a.seq,
                        .norm_eps = 1e-5, .rope_theta = 10000.0};
    snprintf(cfg.model_type, sizeof cfg.model_type, "llama");
    omp_set_num_threads(a.threads);
    openblas_set_num_threads(a.threads);
    spec_lora none = {0}, qv = {.r = a.r, .alpha = 2.0 * a.r, .n_targets = 2},
              all = {.r = a.r, .alpha = 2.0 * a.r, .all_linear = true};
    snprintf(qv.targets[0], SPEC_LORA_NAME_MAX, "q_proj");
    snprintf(qv.targets[1], SPEC_LORA_NAME_MAX, "v_proj");
    variant v[4] = {{.name = "full fine-tune"}, {.name = "LoRA q_proj,v_proj"},
                    {.name = "LoRA all-linear"}, {.name = "QLoRA all-linear"}};
    const spec_lora *sl[4] = {&none, &qv, &all, &all};
    model_config cfgq = cfg; /* the base double quantized to NF4 */
    cfgq.quant = MODEL_QUANT_NF4;
    cfgq.quant_nested = true;
    const model_config *cf[4] = {&cfg, &cfg, &cfg, &cfgq};
    for (int i = 0; i < 4; i++)
        if (setup(&v[i], &a, cf[i], sl[i], &err) != 0) {
            fprintf(stderr, "bench_lora: %s: %s\n", v[i].name, err.msg);
            return 1;
        }
    size_t N = (size_t)a.batch * a.seq;
    int *tok = malloc(N * sizeof *tok), *tgt = malloc(N * sizeof *tgt);
    float *w = malloc(N * sizeof *w);
    rng r;
    rng_seed(&r, 7, 1);
    for (size_t i = 0; i < N; i++) {
        tok[i] = (int)rng_below(&r, (uint64_t)a.vocab);
        tgt[i] = (int)rng_below(&r, (uint64_t)a.vocab);
        w[i] = 1.0f / (float)N;
    }
    spec_optim o = {.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    double loss[4] = {0};
    for (int s = -a.warmup; s < a.steps; s++)
        for (int i = 0; i < 4; i++) {
            model *m = v[i].m;
            double t0 = bench_now();
            model_zero_grad(m);
            model_forward(m, tok, tgt, w, a.batch, 1, &loss[i]);
            model_backward(m, a.batch);
            adamw_step(v[i].opt, &m->layout, m->params, m->grads, (float)o.lr, &o, 1.0f);
            if (s >= 0)
                v[i].times[s] = bench_now() - t0;
        }
    printf("config  %d layers, %d channels, %d heads / %d kv, mlp %d, seq %d, vocab %d, B %d, r %d%s, "
           "%d threads\n", a.layers, a.channels, a.heads, a.kv, a.mlp, a.seq, a.vocab, a.batch, a.r,
           a.recompute ? ", recompute" : "", a.threads);
    double full = bench_median(v[0].times, a.steps);
    printf("%-20s %12s %12s %10s %8s %14s\n", "variant", "trainable", "parameters", "step s",
           "vs full", "device peak");
    for (int i = 0; i < 4; i++) {
        double t = bench_median(v[i].times, a.steps);
        printf("%-20s %12zu %12zu %10.4f %7.2fx %11.1f MiB\n", v[i].name, v[i].m->ngrad,
               v[i].m->nparams, t, t / full, (double)v[i].d->peak / (1 << 20));
        adamw_free(v[i].opt);
        model_free(v[i].m);
        kern_device_close(v[i].d);
    }
    free(tok);
    free(tgt);
    free(w);
    return 0;
}
