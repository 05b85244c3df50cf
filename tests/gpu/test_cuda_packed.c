/* GPU test: packed documents' attention (data.packing) on CUDA against the
 * CPU reference: gqa_attention_pos_fwd / _bwd with positions that restart
 * at each document (lengths 1, 7, 13, 30 and the rest, different in each
 * sequence), GQA 4 query heads over 2 key/value heads. Also checks that the
 * positions matter: the packed output differs from the unpacked one.
 * Skips (77) without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern_cuda.h"
#include "kern_device.h"
#include "kern_discover.h"
#include "gpu_fixture.h"

enum { B = 2, T = 64, NH = 4, NKV = 2, HS = 16 };
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

static int alloc_pair(pair *p, size_t bytes, const void *host)
{
    acc_err err = {0};
    p->bytes = bytes;
    if (cpu->ops->alloc(cpu, bytes, &p->c, &err) != 0 || gpu->ops->alloc(gpu, bytes, &p->g, &err) != 0) {
        fprintf(stderr, "alloc: %s\n", err.msg);
        return 1;
    }
    if (host != NULL) {
        cpu->ops->upload(cpu, p->c, host, bytes);
        gpu->ops->upload(gpu, p->g, host, bytes);
    } else {
        cpu->ops->zero(cpu, p->c, bytes);
        gpu->ops->zero(gpu, p->g, bytes);
    }
    return 0;
}

static double compare(const char *what, const pair *p)
{
    size_t n = p->bytes / sizeof(float);
    float *a = malloc(p->bytes), *b = malloc(p->bytes);
    if (a == NULL || b == NULL) {
        free(a);
        free(b);
        return INFINITY;
    }
    cpu->ops->download(cpu, a, p->c, p->bytes);
    gpu->ops->download(gpu, b, p->g, p->bytes);
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)a[i] * a[i];
    }
    free(a);
    free(b);
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    printf("%-28s rel %.3g\n", what, rel);
    return rel;
}

int main(void)
{
    kern_device_info g[KERN_MAX_DEVICES];
    int ng, rc = gpu_list_or_skip(g, &ng);
    if (rc != 0)
        return rc;
    if (gpu_open_pair(g, &cpu, &gpu) != 0)
        return 1;
    size_t nq = (size_t)B * T * NH * HS, nk = (size_t)B * T * NKV * HS;
    float *hq = malloc(nq * 4), *hk = malloc(nk * 4), *hv = malloc(nk * 4), *hg = malloc(nq * 4);
    int pos[B * T];
    static const int docs[B][5] = {{1, 7, 13, 30, 13}, {20, 20, 3, 1, 20}};
    for (int b = 0; b < B; b++)
        for (int d = 0, t = 0; d < 5; d++)
            for (int i = 0; i < docs[b][d] && t < T; i++, t++)
                pos[b * T + t] = i;
    for (size_t i = 0; i < nq; i++)
        hq[i] = urand(), hg[i] = urand();
    for (size_t i = 0; i < nk; i++)
        hk[i] = urand(), hv[i] = urand();
    pair q, k, v, dout, out, lse, scr, dq, dk, dv, ps, plain;
    size_t scr_bytes = KERN_ATT_SCRATCH(T, NH) * sizeof(float);
    if (alloc_pair(&q, nq * 4, hq) || alloc_pair(&k, nk * 4, hk) || alloc_pair(&v, nk * 4, hv) ||
        alloc_pair(&dout, nq * 4, hg) || alloc_pair(&out, nq * 4, NULL) ||
        alloc_pair(&lse, (size_t)B * NH * T * 4, NULL) || alloc_pair(&scr, scr_bytes, NULL) ||
        alloc_pair(&dq, nq * 4, NULL) || alloc_pair(&dk, nk * 4, NULL) || alloc_pair(&dv, nk * 4, NULL) ||
        alloc_pair(&ps, sizeof pos, pos) || alloc_pair(&plain, nq * 4, NULL))
        return 1;
    cpu->ops->gqa_attention_pos_fwd(cpu, out.c, lse.c, scr.c, q.c, k.c, v.c, ps.c, B, T, NH, NKV, HS);
    gpu->ops->gqa_attention_pos_fwd(gpu, out.g, lse.g, scr.g, q.g, k.g, v.g, ps.g, B, T, NH, NKV, HS);
    cpu->ops->gqa_attention_pos_bwd(cpu, dq.c, dk.c, dv.c, scr.c, dout.c, q.c, k.c, v.c, lse.c, out.c, ps.c, B,
                                    T, NH, NKV, HS);
    gpu->ops->gqa_attention_pos_bwd(gpu, dq.g, dk.g, dv.g, scr.g, dout.g, q.g, k.g, v.g, lse.g, out.g, ps.g, B,
                                    T, NH, NKV, HS);
    acc_err err = {0};
    if (gpu->ops->last_error(gpu, &err) != 0) {
        fprintf(stderr, "CUDA: %s\n", err.msg);
        return 1;
    }
    int fail = 0;
    fail |= compare("pos_fwd out", &out) > TOL;
    fail |= compare("pos_fwd lse", &lse) > TOL;
    fail |= compare("pos_bwd dq", &dq) > TOL;
    fail |= compare("pos_bwd dk", &dk) > TOL;
    fail |= compare("pos_bwd dv", &dv) > TOL;
    /* the positions matter: unpacked attention gives another output */
    gpu->ops->gqa_attention_fwd(gpu, plain.g, lse.g, scr.g, q.g, k.g, v.g, B, T, NH, NKV, HS);
    float *a = malloc(nq * 4), *b2 = malloc(nq * 4);
    gpu->ops->download(gpu, a, plain.g, nq * 4);
    gpu->ops->download(gpu, b2, out.g, nq * 4);
    double gap = 0;
    for (size_t i = 0; i < nq; i++)
        gap = fmax(gap, fabs((double)a[i] - b2[i]));
    printf("packed vs unpacked max diff %.3g\n", gap);
    fail |= !(gap > 1e-3);
    free(a);
    free(b2);
    free(hq);
    free(hk);
    free(hv);
    free(hg);
    printf("%s\n", fail ? "FAIL" : "OK");
    return fail;
}
