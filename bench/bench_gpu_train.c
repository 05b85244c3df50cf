/* bench_gpu_train: GPT-2 124M training throughput on one GPU with the CUDA
 * backend (model_gpt2 over a kern_cuda device: forward, backward, AdamW).
 *
 * Shapes: 12 layers, 12 heads, 768 channels, seq 1024, vocab 50257 padded
 * to 50304; random tokens. Starts at --micro m (default 16) and halves m on
 * ACC_EOOM, as the job OOM adaptation does. Each step is one micro-batch of
 * m x 1024 tokens (zero grad, forward, backward, AdamW); the figure is the
 * median over --steps steps after --warmup. FLOP per token: 6N + 6*L*C*T
 * (N = parameters incl. padded wte, forward + backward, attention
 * included); MFU is against 790e12 FLOP/s, the H200's measured dense bf16
 * matmul rate. Precision: bf16 (default: linear layers in bf16 with fp32
 * accumulation, everything else fp32, kern_cuda_set_bf16), tf32 or fp32.
 * Prints "RESULT key value" lines for bench/gpu-check.sh: tokens_per_s,
 * mfu_pct, peak_bytes, micro, precision (the main run), then
 * tf32_tokens_per_s, tf32_mfu_pct, fp32_tokens_per_s, fp32_mfu_pct from
 * shorter runs at the same m, and planned_bytes_m{1,2,4,8,16} (fp32 model,
 * plan_peak_bytes). Exits 0 with a message where no GPU is present.
 *
 * Then, unless --profile-steps is 0, a short profiled run (main precision,
 * same m): each op's GPU time per step from CUDA events around it
 * (kern_cuda_set_profile), as "RESULT prof_<op>_ms" lines with its share
 * of the step, to say where the time goes.
 *
 *   bench_gpu_train [--micro M] [--steps S] [--warmup W] [--precision bf16|tf32|fp32]
 *                   [--other-steps S]   (steps of the other precisions; 0 skips them)
 *                   [--profile-steps S] (default 3; 0 skips the profile)
 *                   [--flash]           (bf16: the EXPERIMENTAL tiled attention,
 *                                        kern_cuda_set_flash)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kern_cuda.h"
#include "kern_device.h"
#include "kern_discover.h"
#include "adamw.h"
#include "mem_plan.h"
#include "model_gpt2.h"
#include "bench_util.h"

#define PEAK_FLOPS 790e12

typedef struct run_out {
    double tok_s, mfu, loss0, loss_last;
    unsigned long long peak;
    int micro;
    int profile;                        /* in: record per-op times */
    int flash;                          /* in: tiled attention (bf16) */
    double prof_ms[KERN_CUDA_PROF_OPS]; /* out: summed over the timed steps */
    int prof_calls[KERN_CUDA_PROF_OPS];
    const char *prof_name[KERN_CUDA_PROF_OPS];
    double step_ms;                     /* out: median step */
} run_out;

enum { P_BF16, P_TF32, P_FP32 };
static const char *const prec_name[] = {"bf16", "tf32", "fp32"};

/* Add this step's per-op times to r (reading also waits for the stream). */
static int read_profile(kern_device *d, run_out *r)
{
    double ms[KERN_CUDA_PROF_OPS];
    int calls[KERN_CUDA_PROF_OPS];
    acc_err err = {0};
    if (kern_cuda_profile_read(d, ms, calls, r->prof_name, &err) != KERN_CUDA_PROF_OPS) {
        fprintf(stderr, "profile read: %s\n", err.msg);
        return 1;
    }
    for (int k = 0; k < KERN_CUDA_PROF_OPS; k++) {
        r->prof_ms[k] += ms[k];
        r->prof_calls[k] += calls[k];
    }
    return 0;
}

static int run(const kern_device_info *gi, const model_config *cfg, int micro, int steps,
               int warmup, int prec, run_out *r)
{
    acc_err err = {0};
    kern_device *d = NULL;
    model_gpt2 *m = NULL;
    int T = cfg->max_seq_len;
    if (kern_cuda_open(gi, 1, &d, &err) != 0) {
        fprintf(stderr, "kern_cuda_open: %s\n", err.msg);
        return 1;
    }
    if (kern_cuda_set_tf32(d, prec == P_TF32, &err) != 0 ||
        kern_cuda_set_bf16(d, prec == P_BF16, &err) != 0 ||
        kern_cuda_set_flash(d, r->flash, &err) != 0) {
        fprintf(stderr, "precision %s: %s\n", prec_name[prec], err.msg);
        kern_device_close(d);
        return 1;
    }
    for (;;) {
        acc_err_clear(&err);
        int rc = model_create(d, cfg, micro, T, &m, &err);
        if (rc == 0)
            break;
        if (rc != ACC_EOOM || micro == 1) {
            fprintf(stderr, "model_create(m=%d): %s\n", micro, err.msg);
            kern_device_close(d);
            return 1;
        }
        printf("m=%d: %s; halving m\n", micro, err.msg);
        micro /= 2;
    }
    adamw *opt = NULL;
    if (adamw_create(d, 0, m->nparams, &opt, &err) != 0 || model_init_seed(m, 1337, &err) != 0) {
        fprintf(stderr, "init: %s\n", err.msg);
        adamw_free(opt);
        model_free(m);
        kern_device_close(d);
        return 1;
    }
    size_t bt = (size_t)micro * T;
    int *tok = malloc(bt * sizeof *tok), *tgt = malloc(bt * sizeof *tgt);
    float *w = malloc(bt * sizeof *w);
    double *dt = malloc((size_t)steps * sizeof *dt);
    uint64_t s = 7;
    spec_optim o = {.lr = 3e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    double flops_tok = 6.0 * (double)model_num_params(cfg) +
                       6.0 * cfg->n_layer * cfg->channels * (double)T;
    int rc = 0;
    kern_device_reset_peak(d);
    for (int step = -warmup; step < steps; step++) {
        if (step == 0 && r->profile && kern_cuda_set_profile(d, 1, &err) != 0) {
            fprintf(stderr, "profile: %s\n", err.msg);
            rc = 1;
            break;
        }
        for (size_t i = 0; i < bt; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            tok[i] = (int)((s >> 33) % (uint64_t)cfg->vocab_size);
            w[i] = 1.0f / (float)bt;
        }
        for (size_t i = 0; i < bt; i++)
            tgt[i] = i + 1 < bt ? tok[i + 1] : tok[0];
        double t0 = bench_now(), loss = 0.0;
        model_zero_grad(m);
        model_forward(m, tok, tgt, w, micro, 1, &loss);
        model_backward(m, micro);
        adamw_step(opt, &m->layout, m->params, m->grads, 3e-4f, &o, 1.0f);
        if (kern_cuda_sync(d, &err) != 0) {
            fprintf(stderr, "step %d: %s\n", step, err.msg);
            rc = 1;
            break;
        }
        double el = bench_now() - t0;
        if (step >= 0 && r->profile && read_profile(d, r) != 0) {
            rc = 1;
            break;
        }
        if (step == -warmup)
            r->loss0 = loss;
        r->loss_last = loss;
        printf("%s m=%d step %3d loss %.4f  %.1f ms  %.0f tok/s\n", prec_name[prec],
               micro, step, loss, 1e3 * el, (double)bt / el);
        fflush(stdout);
        if (step >= 0)
            dt[step] = el;
    }
    if (rc == 0) {
        qsort(dt, (size_t)steps, sizeof *dt, bench_cmp_double);
        double med = steps % 2 ? dt[steps / 2] : 0.5 * (dt[steps / 2 - 1] + dt[steps / 2]);
        r->step_ms = 1e3 * med;
        r->tok_s = (double)bt / med;
        r->mfu = 100.0 * r->tok_s * flops_tok / PEAK_FLOPS;
        r->peak = (unsigned long long)d->peak;
        r->micro = micro;
    }
    free(tok), free(tgt), free(w), free(dt);
    adamw_free(opt);
    model_free(m);
    kern_device_close(d);
    return rc;
}

/* A short run with every op timed: per-step ms and share of the step. */
static int print_profile(const kern_device_info *gi, const model_config *cfg, int micro,
                         int steps, int prec, int flash)
{
    run_out p = {.profile = 1, .flash = flash};
    if (run(gi, cfg, micro, steps, 1, prec, &p) != 0) {
        /* the figures above stand; the profile is extra */
        printf("RESULT prof_failed see the output above\n");
        return 0;
    }
    double sum = 0.0;
    printf("profile (%s, m=%d, %d steps; median step %.1f ms):\n", prec_name[prec], p.micro,
           steps, p.step_ms);
    for (int k = 0; k < KERN_CUDA_PROF_OPS; k++) {
        if (p.prof_calls[k] == 0)
            continue;
        double per = p.prof_ms[k] / steps;
        sum += per;
        printf("RESULT prof_%s_ms %.2f (%.1f%%, %d calls/step)\n", p.prof_name[k], per,
               100.0 * per / p.step_ms, p.prof_calls[k] / steps);
    }
    printf("RESULT prof_ops_total_ms %.2f of %.2f (the rest: host gaps, launches)\n", sum,
           p.step_ms);
    return 0;
}

int main(int argc, char **argv)
{
    int micro = 16, steps = 10, warmup = 2, prec = P_BF16, other_steps = 4, prof_steps = 3;
    int flash = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--flash") == 0) {
            flash = 1;
            continue;
        }
        if (v == NULL) {
            fprintf(stderr, "%s needs a value\n", a);
            return 2;
        }
        if (strcmp(a, "--micro") == 0)
            micro = atoi(v);
        else if (strcmp(a, "--steps") == 0)
            steps = atoi(v);
        else if (strcmp(a, "--warmup") == 0)
            warmup = atoi(v);
        else if (strcmp(a, "--other-steps") == 0)
            other_steps = atoi(v);
        else if (strcmp(a, "--profile-steps") == 0)
            prof_steps = atoi(v);
        else if (strcmp(a, "--precision") == 0 && strcmp(v, "bf16") == 0)
            prec = P_BF16;
        else if (strcmp(a, "--precision") == 0 && strcmp(v, "tf32") == 0)
            prec = P_TF32;
        else if (strcmp(a, "--precision") == 0 && strcmp(v, "fp32") == 0)
            prec = P_FP32;
        else {
            fprintf(stderr, "unknown argument %s\n", a);
            return 2;
        }
        i++;
    }
    if (micro < 1 || steps < 1 || warmup < 0) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    kern_device_info g[KERN_MAX_DEVICES];
    int n = 0;
    acc_err err = {0};
    if (kern_cuda_query(g, KERN_MAX_DEVICES, &n, &err) != 0 || n == 0) {
        printf("SKIP: no CUDA GPU on this machine%s%s\n", err.msg[0] ? ": " : "", err.msg);
        return 0;
    }
    model_config cfg = {.max_seq_len = 1024, .vocab_size = 50257, .padded_vocab_size = 50304,
                        .n_layer = 12, .n_head = 12, .channels = 768};
    printf("GPU %s sm_%d%d, %llu bytes; GPT-2 124M (%zu parameters), T=1024\n", g[0].name,
           g[0].cc_major, g[0].cc_minor, (unsigned long long)g[0].mem_total,
           model_num_params(&cfg));
    for (int mm = 1; mm <= 16; mm *= 2)
        printf("RESULT planned_bytes_m%d %llu\n", mm,
               (unsigned long long)plan_peak_bytes(&cfg, mm, 1024, 0));
    run_out r = {.flash = flash};
    if (run(&g[0], &cfg, micro, steps, warmup, prec, &r) != 0)
        return 1;
    printf("RESULT precision %s%s\n", prec_name[prec], flash ? " (tiled attention)" : "");
    printf("RESULT micro %d\n", r.micro);
    printf("RESULT tokens_per_s %.0f\n", r.tok_s);
    printf("RESULT mfu_pct %.2f\n", r.mfu);
    printf("RESULT peak_bytes %llu\n", r.peak);
    printf("RESULT loss_first_last %.4f->%.4f\n", r.loss0, r.loss_last);
    for (int p = 0; p < 3 && other_steps > 0; p++) {
        if (p == prec)
            continue;
        run_out f = {.flash = flash};
        if (run(&g[0], &cfg, r.micro, other_steps, 1, p, &f) != 0)
            return 1;
        printf("RESULT %s_tokens_per_s %.0f\n", prec_name[p], f.tok_s);
        printf("RESULT %s_mfu_pct %.2f\n", prec_name[p], f.mfu);
        printf("RESULT %s_peak_bytes %llu\n", prec_name[p], f.peak);
    }
    if (prof_steps > 0)
        return print_profile(&g[0], &cfg, r.micro, prof_steps, prec, flash);
    return 0;
}
