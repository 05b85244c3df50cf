/* llama_ops_dump DIR: runs the LLaMA-family ops of the CPU backend on fixed
 * random inputs and writes every input and result to DIR, one raw
 * little-endian file per tensor (NAME.f32 / NAME.i32) plus DIR/manifest.txt
 * ("name dtype dim..." per line), for llama_ops_torch.py, which recomputes
 * them with PyTorch (float64, autograd) and compares. Backwards run into
 * zeroed gradients. Exits 1 on any failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern_device.h"
#include "kern_rope.h"
#include "rng.h"

#define OPS_DUMP_PROG "llama_ops_dump"
#include "ops_dump.h"

enum { B = 2, T = 9, NH = 4, NKV = 2, HS = 16, C = 32, I = 48, V = 13, P = 40 };
#define N (B * T)
#define QN ((size_t)N * NH * HS)
#define KN ((size_t)N * NKV * HS)
#define EPS 1e-6f

static void norm_mlp(kern_device *d)
{
    int tok[N];
    for (int n = 0; n < N; n++)
        tok[n] = (int)rng_below(&r, V);
    float *wte = randn((size_t)V * C, 1), *e = zeros((size_t)N * C), *dwte = zeros((size_t)V * C);
    float *ge = randn((size_t)N * C, 1);
    d->ops->embed_fwd(d, e, tok, wte, N, C);
    d->ops->embed_bwd(d, dwte, ge, tok, N, C);
    DUMPI("tok", tok, N);
    DUMP("wte", wte, V, C);
    DUMP("embed_out", e, N, C);
    DUMP("embed_g", ge, N, C);
    DUMP("embed_dwte", dwte, V, C);
    float *x = randn((size_t)N * C, 2), *w = randn(C, 1), *out = zeros((size_t)N * C);
    float *rstd = zeros(N), *g = randn((size_t)N * C, 1), *dx = zeros((size_t)N * C);
    float *dw = zeros(C);
    d->ops->rmsnorm_fwd(d, out, rstd, x, w, EPS, N, C);
    d->ops->rmsnorm_bwd(d, dx, dw, g, x, w, rstd, N, C);
    DUMP("rms_x", x, N, C);
    DUMP("rms_w", w, C);
    DUMP("rms_out", out, N, C);
    DUMP("rms_rstd", rstd, N);
    DUMP("rms_g", g, N, C);
    DUMP("rms_dx", dx, N, C);
    DUMP("rms_dw", dw, C);
    size_t n = (size_t)N * I;
    float *gate = randn(n, 3), *up = randn(n, 1), *h = zeros(n), *gh = randn(n, 1);
    float *dgate = zeros(n), *dup = zeros(n);
    d->ops->swiglu_fwd(d, h, gate, up, n);
    d->ops->swiglu_bwd(d, dgate, dup, gh, gate, up, n);
    DUMP("sw_gate", gate, N, I);
    DUMP("sw_up", up, N, I);
    DUMP("sw_out", h, N, I);
    DUMP("sw_g", gh, N, I);
    DUMP("sw_dgate", dgate, N, I);
    DUMP("sw_dup", dup, N, I);
    float *all[] = {wte, e, dwte, ge, x, w, out, rstd, g, dx, dw, gate, up, h, gh, dgate, dup};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        free(all[i]);
}

/* q, k rotated (positions restarting in sequence 0), GQA attention, and the
 * whole backward: attention, then RoPE's transpose in place on dq, dk */
static void attention(kern_device *d)
{
    kern_rope_cfg cfg = {.theta = 500000.0, .type = KERN_ROPE_LLAMA3, .factor = 8.0,
                         .low_freq_factor = 1.0, .high_freq_factor = 4.0,
                         .original_max_pos = 64};
    float ct[P * HS / 2], st[P * HS / 2];
    acc_err err = {0};
    if (kern_rope_table(&cfg, P, HS, ct, st, &err) != 0)
        die(err.msg);
    int pos[N];
    for (int t = 0; t < T; t++) {
        pos[t] = t < 4 ? t : t - 4; /* a second document in sequence 0 */
        pos[T + t] = 20 + t;        /* a later window in sequence 1 */
    }
    float *q = randn(QN, 1), *k = randn(KN, 1), *v = randn(KN, 1);
    float *qr = zeros(QN), *kr = zeros(KN), *out = zeros(QN), *lse = zeros((size_t)B * NH * T);
    float *scr = zeros(KERN_ATT_SCRATCH(T, NH)), *g = randn(QN, 1);
    float *dq = zeros(QN), *dk = zeros(KN), *dv = zeros(KN);
    d->ops->rope_fwd(d, qr, q, ct, st, pos, B, T, NH, HS);
    d->ops->rope_fwd(d, kr, k, ct, st, pos, B, T, NKV, HS);
    d->ops->gqa_attention_fwd(d, out, lse, scr, qr, kr, v, B, T, NH, NKV, HS);
    d->ops->gqa_attention_bwd(d, dq, dk, dv, scr, g, qr, kr, v, lse, out, B, T, NH, NKV, HS);
    DUMP("att_q_rot", qr, B, T, NH, HS);
    DUMP("att_k_rot", kr, B, T, NKV, HS);
    DUMP("att_out", out, B, T, NH, HS);
    DUMP("att_lse", lse, B, NH, T);
    DUMP("att_dq_rot", dq, B, T, NH, HS);
    DUMP("att_dk_rot", dk, B, T, NKV, HS);
    { /* lean activations (issue 20): the tiled op on the same rotated inputs */
        float *lo = zeros(QN), *ll = zeros((size_t)B * NH * T), *ls = zeros(KERN_ATT_LEAN_SCRATCH(T, NH));
        float *lq = zeros(QN), *lk = zeros(KN), *lv = zeros(KN);
        d->ops->attention_lean_fwd(d, lo, ll, ls, qr, kr, v, NH * HS, NKV * HS, NULL, NULL, B, T, NH, NKV, HS);
        d->ops->attention_lean_bwd(d, lq, lk, lv, ls, g, qr, kr, v, ll, lo, NH * HS, NKV * HS, NULL, NULL, B, T,
                                   NH, NKV, HS);
        DUMP("lean_out", lo, B, T, NH, HS);
        DUMP("lean_lse", ll, B, NH, T);
        DUMP("lean_dq_rot", lq, B, T, NH, HS);
        DUMP("lean_dk_rot", lk, B, T, NKV, HS);
        DUMP("lean_dv", lv, B, T, NKV, HS);
        float *lall[] = {lo, ll, ls, lq, lk, lv};
        for (size_t i = 0; i < sizeof lall / sizeof *lall; i++)
            free(lall[i]);
    }
    d->ops->rope_bwd(d, dq, dq, ct, st, pos, B, T, NH, HS);
    d->ops->rope_bwd(d, dk, dk, ct, st, pos, B, T, NKV, HS);
    DUMPI("att_pos", pos, B, T);
    DUMP("att_q", q, B, T, NH, HS);
    DUMP("att_k", k, B, T, NKV, HS);
    DUMP("att_v", v, B, T, NKV, HS);
    DUMP("att_g", g, B, T, NH, HS);
    DUMP("att_dq", dq, B, T, NH, HS);
    DUMP("att_dk", dk, B, T, NKV, HS);
    DUMP("att_dv", dv, B, T, NKV, HS);
    float *all[] = {q, k, v, qr, kr, out, lse, scr, g, dq, dk, dv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        free(all[i]);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: llama_ops_dump DIR\n");
        return 2;
    }
    dir = argv[1];
    char path[4096];
    snprintf(path, sizeof path, "%s/manifest.txt", dir);
    if ((manifest = fopen(path, "w")) == NULL)
        die(path);
    fprintf(manifest, "eps %.9g\nrope 500000 llama3 8 1 4 64\n", (double)EPS);
    kern_device_info info = {.kind = KERN_DEV_CPU, .index = 0, .name = "cpu0", .mem_total = 0};
    kern_device *d = NULL;
    acc_err err = {0};
    if (kern_device_open(&info, 2, &d, &err) != 0)
        die(err.msg);
    rng_seed(&r, 2026, 15);
    norm_mlp(d);
    attention(d);
    kern_device_close(d);
    if (fclose(manifest) != 0)
        die("manifest");
    return 0;
}
