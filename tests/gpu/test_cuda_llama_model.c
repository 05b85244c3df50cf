/* GPU: a small LLaMA (GQA: 4 heads, 2 key/value heads; SwiGLU; RoPE with
 * llama3 scaling; untied head) trained on the CUDA backend matches the same
 * training on the CPU backend (fp32): per-step losses and gradient norms
 * within 1e-4 relative, the weights after the run within 1e-4 of the
 * largest weight; the same in recompute mode; the device accounting peaks
 * at the same byte on both; with bf16 linear layers the GPU's losses stay
 * within 1e-2 of the CPU backend's bf16 run; LoRA (all-linear, r 4: frozen
 * base, adapters from matmul ops and the scale op) matches alike, stored
 * and recompute. Exits 77 (skipped) with a message where no GPU is present. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern_cpu.h"
#include "kern_cuda.h"
#include "kern_device.h"
#include "kern_discover.h"
#include "gpu_fixture.h"
#include "adamw.h"
#include "model.h"
#include "model_lora.h"

enum { L = 2, NH = 4, NKV = 2, C = 64, I = 96, V = 101, VP = 128, MAXT = 64, T = 32, B = 4, STEPS = 10 };

static int failures;

static void fail(const char *what, double a, double b)
{
    fprintf(stderr, "FAIL: %s (cpu %.10g gpu %.10g)\n", what, a, b);
    failures++;
}

static model_config config(void)
{
    model_config c = {.family = model_family_by_arch("llama"), .n_layer = L, .n_head = NH,
                      .n_kv_head = NKV, .channels = C, .intermediate_size = I, .vocab_size = V,
                      .padded_vocab_size = VP, .max_seq_len = MAXT, .norm_eps = 1e-5,
                      .rope_theta = 500000.0, .rope_scaling = MODEL_ROPE_LLAMA3, .rope_factor = 8.0,
                      .rope_low_freq_factor = 1.0, .rope_high_freq_factor = 4.0,
                      .rope_original_max_pos = 16};
    snprintf(c.model_type, sizeof c.model_type, "llama");
    return c;
}

typedef struct run {
    double loss[STEPS], gnorm[STEPS];
    float *params;
    size_t n;
    uint64_t peak;
} run;

/* STEPS steps of two micro-steps each (accumulation) */
static int train(kern_device *d, int recompute, int lora, run *r)
{
    model_config cfg = config();
    spec_lora sl = {.r = lora ? 4 : 0, .alpha = 8, .all_linear = true};
    model *m = NULL;
    adamw *opt = NULL;
    acc_err err = {0};
    kern_device_reset_peak(d);
    if (model_lora_apply(&sl, false, &cfg, &err) != 0 || model_create(d, &cfg, 0, T, &m, &err) != 0 ||
        model_acts_alloc(m, B, recompute, &err) != 0 ||
        adamw_create(d, 0, m->ngrad, &opt, &err) != 0 || model_init_seed(m, 99, &err) != 0 ||
        model_lora_init(m, 99, &err) != 0) {
        fprintf(stderr, "FAIL: llama model on %s: %s\n", d->ops->backend, err.msg);
        failures++;
        return -1;
    }
    int rc = gpu_train_steps(m, opt, B, T, 2, STEPS, 7, 5, 1, r->loss, r->gnorm);
    if (rc == 0) {
        r->n = m->nparams;
        r->params = malloc(m->nparams * sizeof(float));
        d->ops->download(d, r->params, m->params, m->nparams * sizeof(float));
        r->peak = d->peak;
    }
    failures += (rc != 0) + gpu_cuda_failed(d);
    adamw_free(opt);
    model_free(m);
    return rc;
}

static void compare(kern_device *cpu, kern_device *gpu, int recompute, int bf16, int lora)
{
    run c = {0}, g = {0};
    acc_err err = {0};
    double tol = bf16 ? 1e-2 : 1e-4;
    if (bf16 && (cpu->ops->set_precision(cpu, 1, &err) != 0 || gpu->ops->set_precision(gpu, 1, &err) != 0)) {
        fprintf(stderr, "FAIL: bf16: %s\n", err.msg);
        failures++;
        return;
    }
    if (train(cpu, recompute, lora, &c) || train(gpu, recompute, lora, &g))
        return;
    for (int i = 0; i < STEPS; i++) {
        printf("lora %d recompute %d bf16 %d step %2d loss cpu %.8f gpu %.8f  |g| cpu %.8f gpu %.8f\n",
               lora, recompute, bf16, i, c.loss[i], g.loss[i], c.gnorm[i], g.gnorm[i]);
        if (!(fabs(c.loss[i] - g.loss[i]) <= tol * fabs(c.loss[i])))
            fail("loss", c.loss[i], g.loss[i]);
        if (!(fabs(c.gnorm[i] - g.gnorm[i]) <= tol * fabs(c.gnorm[i])))
            fail("grad norm", c.gnorm[i], g.gnorm[i]);
    }
    if (!bf16) {
        double md = 0, mr = 0;
        for (size_t i = 0; i < c.n && c.n == g.n; i++) {
            md = fmax(md, fabs((double)c.params[i] - g.params[i]));
            mr = fmax(mr, fabs((double)c.params[i]));
        }
        printf("weights after %d steps: max diff %.3e, max |w| %.3e; peak cpu %llu gpu %llu\n",
               STEPS, md, mr, (unsigned long long)c.peak, (unsigned long long)g.peak);
        if (c.n != g.n || !(md <= 1e-4 * mr))
            fail("weights after training", mr, md);
        if (c.peak != g.peak)
            fail("the same accounted peak", (double)c.peak, (double)g.peak);
    }
    if (bf16) {
        cpu->ops->set_precision(cpu, 0, &err);
        gpu->ops->set_precision(gpu, 0, &err);
    }
    free(c.params);
    free(g.params);
}

int main(void)
{
    kern_device_info g[KERN_MAX_DEVICES];
    kern_device *cpu = NULL, *gpu = NULL;
    int rc = gpu_start_pair(g, &cpu, &gpu);
    if (rc != 0)
        return rc;
    acc_err err = {0};
    if (kern_llama_ops_check(gpu, &err) != 0) {
        fprintf(stderr, "FAIL: %s\n", err.msg);
        return 1;
    }
    compare(cpu, gpu, 0, 0, 0);
    compare(cpu, gpu, 1, 0, 0);
    compare(cpu, gpu, 0, 1, 0);
    compare(cpu, gpu, 0, 0, 1);
    compare(cpu, gpu, 1, 0, 1);
    compare(cpu, gpu, 0, 1, 1);
    kern_device_close(gpu);
    kern_device_close(cpu);
    return gpu_verdict(failures, "GPU LLaMA training matches the CPU backend");
}
