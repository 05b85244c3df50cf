/* bench_llama: training throughput of the LLaMA family on one CPU device,
 * next to the machine's cblas_sgemm rate.
 *
 * A LLaMA-shaped model (default 6 layers, 384 channels, 6 heads with 2
 * key/value heads, SwiGLU 1024, seq 128, vocab 32000, untied head), random
 * tokens, micro batch B: each step is forward + backward + AdamW, timed
 * after --warmup steps; tokens/s is the median step's. FLOP/token counts
 * the linear layers (6 x their parameters: the embedding lookup is not a
 * product) plus attention (6 x L x NH*hs x T, as bench_train counts it).
 * The sgemm ceiling: one 2048^3 product on OpenBLAS's own threads.
 *
 * Usage: bench_llama [--threads 2] [--batch 8] [--steps 6] [--warmup 2]
 *                    [--layers 6] [--channels 384] [--heads 6] [--kv-heads 2]
 *                    [--mlp 1024] [--seq 128] [--vocab 32000] [--bf16] [--recompute] [--lean]
 * bench/bench_llama.sh runs it and the same model in PyTorch (bench_llama.py).
 */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "model.h"
#include "rng.h"

typedef struct args {
    int threads, batch, steps, warmup, layers, channels, heads, kv, mlp, seq, vocab, bf16, recompute;
    int lean; /* --lean: lean activations (model_config.lean_acts) */
} args;

void openblas_set_num_threads(int n);

static double sgemm_gflops(int threads, int size, int reps)
{
    size_t n = (size_t)size * size;
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *c = malloc(n * sizeof *c);
    if (!a || !b || !c)
        exit(1);
    for (size_t i = 0; i < n; i++) {
        a[i] = (float)(i % 7) * 0.1f;
        b[i] = (float)(i % 5) * 0.1f;
    }
    openblas_set_num_threads(threads);
    double g[16];
    for (int r = -1; r < reps; r++) {
        double t0 = bench_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, size, size, size, 1.0f, a, size, b,
                    size, 0.0f, c, size);
        double dt = bench_now() - t0;
        if (r >= 0)
            g[r] = 2.0 * size * (double)size * size / dt / 1e9;
    }
    free(a);
    free(b);
    free(c);
    return bench_median(g, reps);
}

static int parse(int argc, char **argv, args *a)
{
    *a = (args){2, 8, 6, 2, 6, 384, 6, 2, 1024, 128, 32000, 0, 0, 0};
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        if (!strcmp(k, "--bf16")) {
            a->bf16 = 1;
            continue;
        }
        if (!strcmp(k, "--recompute")) {
            a->recompute = 1;
            continue;
        }
        if (!strcmp(k, "--lean")) {
            a->lean = 1;
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
        else return -1;
    }
    return a->steps >= 1 && a->steps <= 16 ? 0 : -1;
}

int main(int argc, char **argv)
{
    args a;
    if (parse(argc, argv, &a) != 0) {
        fprintf(stderr, "usage: see bench_llama.c\n");
        return 2;
    }
    acc_err err = {0};
    model_config cfg = {.family = model_family_by_arch("llama"), .n_layer = a.layers,
                        .n_head = a.heads, .n_kv_head = a.kv, .channels = a.channels,
                        .intermediate_size = a.mlp, .vocab_size = a.vocab,
                        .padded_vocab_size = (a.vocab + 63) / 64 * 64, .max_seq_len = a.seq,
                        .norm_eps = 1e-5, .rope_theta = 10000.0, .lean_acts = a.lean,
                        .act_bf16 = a.bf16}; /* --bf16: a bf16 job's (activations stored in bf16) */
    snprintf(cfg.model_type, sizeof cfg.model_type, "llama");
    if (cfg.family == NULL || model_config_check(&cfg, &err) != 0) {
        fprintf(stderr, "bench_llama: config: %s\n", err.msg);
        return 1;
    }
    omp_set_num_threads(a.threads);
    openblas_set_num_threads(a.threads);
    kern_device_info info = {.kind = KERN_DEV_CPU, .mem_total = 16ull << 30};
    snprintf(info.name, sizeof info.name, "cpu0");
    kern_device *d;
    model *m;
    if (kern_device_open(&info, a.threads, &d, &err) != 0 ||
        (a.bf16 && d->ops->set_precision(d, 1, &err) != 0) ||
        model_create(d, &cfg, 0, a.seq, &m, &err) != 0 ||
        model_acts_alloc(m, a.batch, a.recompute, &err) != 0 || model_init_seed(m, 1, &err) != 0) {
        fprintf(stderr, "bench_llama: %s\n", err.msg);
        return 1;
    }
    size_t N = (size_t)a.batch * a.seq, bytes = m->nparams * sizeof(float);
    int *tok = malloc(N * sizeof *tok), *tgt = malloc(N * sizeof *tgt);
    float *w = malloc(N * sizeof *w), *am, *av;
    rng r;
    rng_seed(&r, 7, 1);
    for (size_t i = 0; i < N; i++) {
        tok[i] = (int)rng_below(&r, (uint64_t)a.vocab);
        tgt[i] = (int)rng_below(&r, (uint64_t)a.vocab);
        w[i] = 1.0f / (float)N;
    }
    if (d->ops->alloc(d, bytes, (void **)&am, &err) != 0 || d->ops->alloc(d, bytes, (void **)&av, &err) != 0)
        return 1;
    d->ops->zero(d, am, bytes);
    d->ops->zero(d, av, bytes);
    double times[16], loss = 0;
    for (int s = -a.warmup; s < a.steps; s++) {
        double t0 = bench_now();
        model_zero_grad(m);
        model_forward(m, tok, tgt, w, a.batch, 1, &loss);
        model_backward(m, a.batch);
        for (int i = 0; i < m->layout.n; i++) {
            const model_tensor *t = &m->layout.t[i];
            d->ops->adamw(d, m->params + t->offset, m->grads + t->offset, am + t->offset,
                          av + t->offset, t->count, 1e-4f, 0.9f, 0.95f, 1e-8f,
                          t->decays ? 0.1f : 0.0f, 1.0f, s + a.warmup + 1);
        }
        if (s >= 0)
            times[s] = bench_now() - t0;
    }
    double step = bench_median(times, a.steps), tok_s = (double)N / step;
    double linear = 0; /* the products' weights: every matrix but the embedding (a lookup) */
    for (int i = 0; i < m->layout.n; i++)
        if (m->layout.t[i].ndim == 2 && strcmp(m->layout.t[i].name, "model.embed_tokens.weight") != 0)
            linear += (double)model_tensor_file_count(&m->layout.t[i]);
    double flop_tok = 6.0 * linear + 6.0 * a.layers * (a.heads * (a.channels / a.heads)) * a.seq;
    double ceiling = sgemm_gflops(a.threads, 2048, 5);
    double gflops = tok_s * flop_tok / 1e9;
    printf("config            %d layers, %d channels, %d heads / %d kv, mlp %d, seq %d, vocab %d, B %d%s%s%s\n",
           a.layers, a.channels, a.heads, a.kv, a.mlp, a.seq, a.vocab, a.batch,
           a.bf16 ? ", bf16" : "", a.recompute ? ", recompute" : "", a.lean ? ", lean" : "");
    printf("activations       %llu bytes\n", (unsigned long long)m->act_bytes);
    printf("parameters        %zu\n", m->nparams);
    printf("threads           %d\n", a.threads);
    printf("step (median)     %.4f s, loss %.4f\n", step, loss);
    printf("tokens/s          %.0f\n", tok_s);
    printf("achieved GFLOP/s  %.1f  (%.3g FLOP/token)\n", gflops, flop_tok);
    printf("sgemm GFLOP/s     %.1f  (2048^3, %d threads)\n", ceiling, a.threads);
    printf("fraction of sgemm %.1f%%\n", 100.0 * gflops / ceiling);
    model_free(m);
    kern_device_close(d);
    return 0;
}
