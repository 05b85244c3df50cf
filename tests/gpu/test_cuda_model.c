/* GPU: a small GPT-2 trained on the CUDA backend matches the same training
 * on the CPU backend (fp32): per-step losses within 1e-4 relative, the
 * gradient norm within 1e-4, the weights after the run within 1e-4 of the
 * largest weight; the same with activation recomputation; and the memory
 * accounting is identical, so an out-of-memory under a budget cap happens
 * at exactly the same byte on both (the OOM adaptation path then behaves
 * the same); with bf16 linear layers (set_precision) the losses stay within
 * 2% of fp32 and within 1e-2 of the CPU backend's bf16 run, and the peak
 * is the fp32 prediction to the byte (no operand buffers). Exits 77 (skipped) with a message
 * where no GPU is present. */
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
#include "mem_plan.h"
#include "model_gpt2.h"

enum { L = 2, NH = 4, C = 64, V = 101, VP = 128, MAXT = 32, T = 32, B = 4, STEPS = 12 };

static int failures;

static void fail(const char *what, double a, double b)
{
    fprintf(stderr, "FAIL: %s (cpu %.10g gpu %.10g)\n", what, a, b);
    failures++;
}

static model_config config(void)
{
    model_config cfg = {.max_seq_len = MAXT, .vocab_size = V, .padded_vocab_size = VP,
                        .n_layer = L, .n_head = NH, .channels = C};
    return cfg;
}

/* train STEPS steps, two micro-steps each (accumulation), losses out */
static int train(kern_device *d, int recompute, double *losses, double *gnorm, float **params,
                 size_t *np)
{
    model_config cfg = config();
    model_gpt2 *m = NULL;
    adamw *opt = NULL;
    acc_err err = {0};
    if (model_create(d, &cfg, recompute ? 0 : B, T, &m, &err) != 0 ||
        adamw_create(d, 0, m->nparams, &opt, &err) != 0 ||
        (recompute && model_acts_alloc(m, B, 1, &err) != 0) || model_init_seed(m, 1234, &err)) {
        fprintf(stderr, "FAIL: model on %s: %s\n", d->ops->backend, err.msg);
        failures++;
        return -1;
    }
    int rc = gpu_train_steps(m, opt, B, T, 2, STEPS, 42, 7, 3, losses, gnorm);
    if (rc == 0) {
        *np = m->nparams;
        *params = malloc(m->nparams * sizeof(float));
        d->ops->download(d, *params, m->params, m->nparams * sizeof(float));
    }
    failures += (rc != 0) + gpu_cuda_failed(d);
    adamw_free(opt);
    model_free(m);
    return rc;
}

static void compare_runs(kern_device *cpu, kern_device *gpu, int recompute)
{
    double lc[STEPS], lg[STEPS], gc[STEPS], gg[STEPS];
    float *pc = NULL, *pg = NULL;
    size_t nc = 0, ng = 0;
    if (train(cpu, recompute, lc, gc, &pc, &nc) || train(gpu, recompute, lg, gg, &pg, &ng))
        return;
    for (int i = 0; i < STEPS; i++) {
        printf("recompute %d step %2d loss cpu %.8f gpu %.8f  |g| cpu %.8f gpu %.8f\n", recompute,
               i, lc[i], lg[i], gc[i], gg[i]);
        if (!(fabs(lc[i] - lg[i]) <= 1e-4 * fabs(lc[i])))
            fail("loss", lc[i], lg[i]);
        if (!(fabs(gc[i] - gg[i]) <= 1e-4 * fabs(gc[i])))
            fail("grad norm", gc[i], gg[i]);
    }
    double md = 0, mr = 0;
    for (size_t i = 0; i < nc && nc == ng; i++) {
        md = fmax(md, fabs((double)pc[i] - pg[i]));
        mr = fmax(mr, fabs((double)pc[i]));
    }
    printf("weights after %d steps: max diff %.3e, max |w| %.3e\n", STEPS, md, mr);
    if (nc != ng || !(md <= 1e-4 * mr))
        fail("weights after training", mr, md);
    free(pc);
    free(pg);
}

/* the same budget cap: model_create fails (ACC_EOOM) at exactly the same byte */
static void compare_oom(const kern_device_info *gi)
{
    model_config cfg = config();
    uint64_t need = plan_peak_bytes(&cfg, B, T, 0);
    for (int k = 0; k < 2; k++) {
        uint64_t cap = need - (uint64_t)k; /* fits, then one byte short */
        int rc[2];
        for (int g = 0; g < 2; g++) {
            kern_device_info info = *gi;
            if (g == 0) {
                info.kind = KERN_DEV_CPU;
                snprintf(info.name, sizeof info.name, "cpu0");
            }
            info.mem_total = cap;
            kern_device *d = NULL;
            acc_err err = {0};
            int orc = g ? kern_cuda_open(&info, 1, &d, &err) : kern_cpu_open(&info, 1, &d, &err);
            if (orc != 0) {
                fprintf(stderr, "FAIL: open: %s\n", err.msg);
                failures++;
                return;
            }
            model_gpt2 *m = NULL;
            adamw *opt = NULL;
            rc[g] = model_create(d, &cfg, B, T, &m, &err);
            if (rc[g] == 0)
                rc[g] = adamw_create(d, 0, m->nparams, &opt, &err);
            printf("cap %llu on %s: rc %d %s (peak %llu)\n", (unsigned long long)cap,
                   d->ops->backend, rc[g], rc[g] ? err.msg : "",
                   (unsigned long long)d->peak);
            adamw_free(opt);
            if (m != NULL)
                model_free(m);
            kern_device_close(d);
        }
        if (rc[0] != rc[1])
            fail("same OOM decision on CPU and GPU", rc[0], rc[1]);
        if (rc[0] != (k == 0 ? 0 : ACC_EOOM))
            fail("OOM exactly below the predicted bytes", (double)k, rc[0]);
    }
}

/* bf16 linear layers (kern_ops.set_precision, as a job's "precision":
 * "bf16" sets them): the GPU's loss curve stays within 2% of its fp32 one,
 * and within 1e-2 of the CPU backend's bf16 run (the reference: the same
 * rounding, fp32 accumulation); the GPU's peak is plan_peak_bytes, as in
 * fp32: cuBLAS rounds the operands itself, no bf16 copies are allocated. */
static void compare_bf16(kern_device *cpu, kern_device *gpu)
{
    double lf[STEPS], lb[STEPS], lc[STEPS], gf[STEPS], gb[STEPS], gc[STEPS];
    float *pf = NULL, *pb = NULL, *pc = NULL;
    size_t nf = 0, nb = 0, nc = 0;
    acc_err err = {0};
    if (train(gpu, 0, lf, gf, &pf, &nf))
        return;
    kern_device_reset_peak(gpu);
    if (gpu->ops->set_precision(gpu, 1, &err) != 0 || train(gpu, 0, lb, gb, &pb, &nb)) {
        fprintf(stderr, "FAIL: bf16 run: %s\n", err.msg);
        failures++;
        free(pf);
        return;
    }
    model_config cfg = config();
    uint64_t want = plan_peak_bytes(&cfg, B, T, 0);
    printf("bf16 GPU peak %llu, predicted %llu (no operand buffers)\n",
           (unsigned long long)gpu->peak, (unsigned long long)want);
    if (gpu->peak != want)
        fail("bf16 peak = plan_peak_bytes (no operand buffers)", (double)want, (double)gpu->peak);
    gpu->ops->set_precision(gpu, 0, &err);
    if (cpu->ops->set_precision(cpu, 1, &err) != 0 || train(cpu, 0, lc, gc, &pc, &nc)) {
        fprintf(stderr, "FAIL: CPU bf16 run: %s\n", err.msg);
        failures++;
        free(pf);
        free(pb);
        return;
    }
    cpu->ops->set_precision(cpu, 0, &err);
    int same = 0;
    for (int i = 0; i < STEPS; i++) {
        printf("bf16 step %2d loss gpu fp32 %.6f gpu bf16 %.6f cpu bf16 %.6f  |g| gpu %.6f cpu "
               "%.6f\n", i, lf[i], lb[i], lc[i], gb[i], gc[i]);
        if (!(fabs(lf[i] - lb[i]) <= 0.02 * fabs(lf[i])))
            fail("bf16 loss within 2% of fp32", lf[i], lb[i]);
        if (!(fabs(lc[i] - lb[i]) <= 1e-2 * fabs(lc[i])))
            fail("GPU bf16 loss within 1e-2 of the CPU bf16 loss", lc[i], lb[i]);
        if (!(fabs(gc[i] - gb[i]) <= 1e-2 * fabs(gc[i])))
            fail("GPU bf16 grad norm within 1e-2 of the CPU's", gc[i], gb[i]);
        same += lf[i] == lb[i];
    }
    if (same == STEPS)
        fail("bf16 changed the GPU losses", 0, same);
    free(pf);
    free(pb);
    free(pc);
}

int main(void)
{
    kern_device_info g[KERN_MAX_DEVICES];
    kern_device *cpu = NULL, *gpu = NULL;
    int rc = gpu_start_pair(g, &cpu, &gpu);
    if (rc != 0)
        return rc;
    compare_runs(cpu, gpu, 0);
    compare_runs(cpu, gpu, 1);
    compare_bf16(cpu, gpu);
    kern_device_close(gpu);
    kern_device_close(cpu);
    compare_oom(&g[0]);
    return gpu_verdict(failures, "GPU training matches the CPU backend");
}
