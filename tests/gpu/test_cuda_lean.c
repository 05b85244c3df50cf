/* GPU test: lean activations' attention (issue 20) on CUDA against the CPU:
 * attention_lean_fwd / _bwd (no T x T buffer) on a LLaMA shape (GQA 8 query
 * heads over 2, head size 128, T 300: several key chunks, T not a multiple
 * of a tile) with packed documents, then with a query scale, soft-capped
 * scores and a sliding window, and on GPT-2's fused qkv (12 heads of 64);
 * also the CUDA lean op against the CUDA T x T op (gqa_attention_opt_*).
 * Relative 2-norm error <= 2e-5 (fp32, summation order). Skips (77)
 * without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern_cuda.h"
#include "kern_device.h"
#include "kern_discover.h"
#include "gpu_fixture.h"

#define TOL 2e-5

static kern_device *cpu, *gpu;
static unsigned long long rs = 0x9e3779b97f4a7c15ull;

static float urand(void)
{
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rs >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
}

typedef struct pair {
    void *c, *g;
    size_t bytes;
} pair;

/* n floats, random (rnd) or zero, on both devices */
static int mk(pair *p, size_t n, int rnd)
{
    acc_err err = {0};
    p->bytes = n * sizeof(float);
    if (cpu->ops->alloc(cpu, p->bytes, &p->c, &err) != 0 ||
        gpu->ops->alloc(gpu, p->bytes, &p->g, &err) != 0) {
        fprintf(stderr, "alloc: %s\n", err.msg);
        return 1;
    }
    float *h = calloc(n + 1, sizeof *h);
    if (h == NULL)
        return 1;
    for (size_t i = 0; rnd && i < n; i++)
        h[i] = urand();
    cpu->ops->upload(cpu, p->c, h, p->bytes);
    gpu->ops->upload(gpu, p->g, h, p->bytes);
    free(h);
    return 0;
}

static void rm(pair *p)
{
    cpu->ops->free(cpu, p->c);
    gpu->ops->free(gpu, p->g);
}

/* relative 2-norm error of the GPU's copy (side g, or the second pair's g)
 * against a reference (the CPU's side c, or ref's g) */
static double rel_of(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static int check(const char *what, const pair *p)
{
    size_t n = p->bytes / sizeof(float);
    float *a = malloc(p->bytes), *b = malloc(p->bytes);
    if (a == NULL || b == NULL)
        return 1;
    gpu->ops->download(gpu, a, p->g, p->bytes);
    cpu->ops->download(cpu, b, p->c, p->bytes);
    double r = rel_of(a, b, n);
    printf("%-36s rel %.3g\n", what, r);
    free(a);
    free(b);
    return !(r <= TOL);
}

static int gqa_case(const char *name, int B, int T, int NH, int NKV, int hs,
                    const kern_att_opts *o, int packed)
{
    size_t nq = (size_t)B * T * NH * hs, nk = (size_t)B * T * NKV * hs;
    pair q, k, v, g, out, lse, scr, dq, dk, dv, pos, full, fo, fl, fdq, fdk, fdv;
    if (mk(&q, nq, 1) || mk(&k, nk, 1) || mk(&v, nk, 1) || mk(&g, nq, 1) || mk(&out, nq, 0) ||
        mk(&lse, (size_t)B * NH * T, 0) || mk(&scr, KERN_ATT_LEAN_SCRATCH(T, NH), 0) ||
        mk(&dq, nq, 0) || mk(&dk, nk, 0) || mk(&dv, nk, 0) || mk(&pos, (size_t)B * T, 0) ||
        mk(&full, KERN_ATT_SCRATCH(T, NH), 0) || mk(&fo, nq, 0) ||
        mk(&fl, (size_t)B * NH * T, 0) || mk(&fdq, nq, 0) || mk(&fdk, nk, 0) || mk(&fdv, nk, 0))
        return 1;
    int *hp = malloc((size_t)B * T * sizeof *hp);
    if (hp == NULL)
        return 1;
    for (int b = 0; b < B; b++) /* documents of 17, 101, 60, ... tokens */
        for (int t = 0, d = 0, i = 0; t < T; t++, i++) {
            int len = 17 + 84 * (d % 3) - 41 * (d % 2 == 0 && d > 0);
            if (i >= len)
                i = 0, d++;
            hp[b * T + t] = i;
        }
    cpu->ops->upload(cpu, pos.c, hp, (size_t)B * T * sizeof *hp);
    gpu->ops->upload(gpu, pos.g, hp, (size_t)B * T * sizeof *hp);
    free(hp);
    const int *pc = packed ? pos.c : NULL, *pg = packed ? pos.g : NULL;
    int lq = NH * hs, lk = NKV * hs;
    cpu->ops->attention_lean_fwd(cpu, out.c, lse.c, scr.c, q.c, k.c, v.c, lq, lk, pc, o, B, T,
                                 NH, NKV, hs);
    gpu->ops->attention_lean_fwd(gpu, out.g, lse.g, scr.g, q.g, k.g, v.g, lq, lk, pg, o, B, T,
                                 NH, NKV, hs);
    cpu->ops->attention_lean_bwd(cpu, dq.c, dk.c, dv.c, scr.c, g.c, q.c, k.c, v.c, lse.c, out.c,
                                 lq, lk, pc, o, B, T, NH, NKV, hs);
    gpu->ops->attention_lean_bwd(gpu, dq.g, dk.g, dv.g, scr.g, g.g, q.g, k.g, v.g, lse.g, out.g,
                                 lq, lk, pg, o, B, T, NH, NKV, hs);
    /* the CUDA T x T op on the same inputs: the lean op must match it too */
    gpu->ops->gqa_attention_opt_fwd(gpu, fo.g, fl.g, full.g, q.g, k.g, v.g, pg, o, B, T, NH, NKV,
                                    hs);
    gpu->ops->gqa_attention_opt_bwd(gpu, fdq.g, fdk.g, fdv.g, full.g, g.g, q.g, k.g, v.g, fl.g,
                                    fo.g, pg, o, B, T, NH, NKV, hs);
    acc_err err = {0};
    if (gpu->ops->last_error(gpu, &err) != 0) {
        fprintf(stderr, "CUDA: %s\n", err.msg);
        return 1;
    }
    char w[96];
    int fail = 0;
    const char *names[] = {"out", "lse", "dq", "dk", "dv"};
    pair *ps[] = {&out, &lse, &dq, &dk, &dv}, *fs[] = {&fo, &fl, &fdq, &fdk, &fdv};
    for (int i = 0; i < 5; i++) {
        snprintf(w, sizeof w, "%s %s", name, names[i]);
        fail |= check(w, ps[i]);
        /* lean vs T x T, both on the GPU */
        size_t n = ps[i]->bytes / sizeof(float);
        float *a = malloc(ps[i]->bytes), *b = malloc(ps[i]->bytes);
        if (a == NULL || b == NULL)
            return 1;
        gpu->ops->download(gpu, a, ps[i]->g, ps[i]->bytes);
        gpu->ops->download(gpu, b, fs[i]->g, ps[i]->bytes);
        double r = rel_of(a, b, n);
        printf("%-36s rel %.3g (cuda lean vs cuda T x T)\n", w, r);
        fail |= !(r <= TOL);
        free(a);
        free(b);
    }
    pair *all[] = {&q, &k, &v, &g, &out, &lse, &scr, &dq, &dk, &dv, &pos,
                   &full, &fo, &fl, &fdq, &fdk, &fdv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        rm(all[i]);
    return fail;
}

static int gpt2_case(int B, int T, int NH, int C)
{
    size_t n = (size_t)B * T * C;
    pair qkv, g, out, lse, scr, dqkv;
    if (mk(&qkv, 3 * n, 1) || mk(&g, n, 1) || mk(&out, n, 0) || mk(&lse, (size_t)B * NH * T, 0) ||
        mk(&scr, KERN_ATT_LEAN_SCRATCH(T, NH), 0) || mk(&dqkv, 3 * n, 0))
        return 1;
    float *qc = qkv.c, *qg = qkv.g, *dc = dqkv.c, *dg = dqkv.g;
    cpu->ops->attention_lean_fwd(cpu, out.c, lse.c, scr.c, qc, qc + C, qc + 2 * C, 3 * C, 3 * C,
                                 NULL, NULL, B, T, NH, NH, C / NH);
    gpu->ops->attention_lean_fwd(gpu, out.g, lse.g, scr.g, qg, qg + C, qg + 2 * C, 3 * C, 3 * C,
                                 NULL, NULL, B, T, NH, NH, C / NH);
    cpu->ops->attention_lean_bwd(cpu, dc, dc + C, dc + 2 * C, scr.c, g.c, qc, qc + C, qc + 2 * C,
                                 lse.c, out.c, 3 * C, 3 * C, NULL, NULL, B, T, NH, NH, C / NH);
    gpu->ops->attention_lean_bwd(gpu, dg, dg + C, dg + 2 * C, scr.g, g.g, qg, qg + C, qg + 2 * C,
                                 lse.g, out.g, 3 * C, 3 * C, NULL, NULL, B, T, NH, NH, C / NH);
    int fail = check("gpt2 out", &out) | check("gpt2 lse", &lse) | check("gpt2 dqkv", &dqkv);
    pair *all[] = {&qkv, &g, &out, &lse, &scr, &dqkv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        rm(all[i]);
    return fail;
}

int main(void)
{
    kern_device_info gi[KERN_MAX_DEVICES];
    int ng, rc = gpu_list_or_skip(gi, &ng);
    if (rc != 0)
        return rc;
    if (gpu_open_pair(gi, &cpu, &gpu) != 0)
        return 1;
    const kern_att_opts plain = {0, 0, 0}, gemma = {0.0625f, 50.0f, 96};
    int fail = 0;
    fail |= gqa_case("llama gqa packed", 2, 300, 8, 2, 128, &plain, 1);
    fail |= gqa_case("cap+scale+window", 2, 257, 4, 2, 64, &gemma, 0);
    fail |= gpt2_case(2, 199, 12, 768);
    printf("%s\n", fail ? "FAIL" : "OK");
    return fail;
}
