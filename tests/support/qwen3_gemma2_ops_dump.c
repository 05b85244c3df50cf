/* qwen3_gemma2_ops_dump DIR: runs Qwen3's and Gemma 2's ops of the CPU
 * backend on fixed random inputs and writes every input and result to DIR
 * (one raw little-endian file per tensor, NAME.f32 / NAME.i32, and
 * DIR/manifest.txt: "name dtype dim..." per line, and the options), for
 * qwen3_gemma2_ops_torch.py, which recomputes them with PyTorch (float64,
 * autograd). The ops, composed as the two families use them:
 *   - soft-capping of logits past the cap, forward and backward;
 *   - the tanh-GELU gate, forward and backward;
 *   - RMSNorm with Gemma's offset 1;
 *   - Qwen3's attention input: per-head RMSNorm of q and k (rmsnorm over
 *     the N * H rows of hs), RoPE, then attention with a query scale,
 *     capped scores and a sliding window, over packed documents; the whole
 *     backward (attention, RoPE's transpose, the per-head norms).
 * Backwards run into zeroed gradients. Exits 1 on any failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern_device.h"
#include "kern_rope.h"
#include "rng.h"

#define OPS_DUMP_PROG "qwen3_gemma2_ops_dump"
#include "ops_dump.h"

enum { B = 2, T = 11, NH = 4, NKV = 2, HS = 16, C = 32, I = 48, V = 40, P = 40, WIN = 4 };
#define N (B * T)
#define QN ((size_t)N * NH * HS)
#define KN ((size_t)N * NKV * HS)
#define EPS 1e-6f
#define CAP_LOGITS 30.0f
#define CAP_ATT 5.0f
#define SCALE 0.125f

static void pointwise(kern_device *d)
{
    size_t nl = (size_t)N * V, ni = (size_t)N * I;
    float *lg = randn(nl, 25), *lc = zeros(nl), *lgg = randn(nl, 1), *ldx = zeros(nl);
    d->ops->softcap_fwd(d, lc, lg, CAP_LOGITS, nl);
    memcpy(ldx, lgg, nl * sizeof *ldx);
    d->ops->softcap_bwd(d, ldx, ldx, lg, CAP_LOGITS, nl); /* in place, as the model runs it */
    DUMP("cap_x", lg, N, V);
    DUMP("cap_out", lc, N, V);
    DUMP("cap_g", lgg, N, V);
    DUMP("cap_dx", ldx, N, V);
    float *gate = randn(ni, 3), *up = randn(ni, 1), *h = zeros(ni), *gh = randn(ni, 1);
    float *dgate = zeros(ni), *dup = zeros(ni);
    d->ops->geglu_fwd(d, h, gate, up, ni);
    d->ops->geglu_bwd(d, dgate, dup, gh, gate, up, ni);
    DUMP("gg_gate", gate, N, I);
    DUMP("gg_up", up, N, I);
    DUMP("gg_out", h, N, I);
    DUMP("gg_g", gh, N, I);
    DUMP("gg_dgate", dgate, N, I);
    DUMP("gg_dup", dup, N, I);
    float *x = randn((size_t)N * C, 2), *w = randn(C, 0.3), *out = zeros((size_t)N * C);
    float *rstd = zeros(N), *g = randn((size_t)N * C, 1), *dx = zeros((size_t)N * C);
    float *dw = zeros(C);
    d->ops->rmsnorm_ofs_fwd(d, out, rstd, x, w, 1.0f, EPS, N, C);
    d->ops->rmsnorm_ofs_bwd(d, dx, dw, g, x, w, 1.0f, rstd, N, C);
    DUMP("rms1_x", x, N, C);
    DUMP("rms1_w", w, C);
    DUMP("rms1_out", out, N, C);
    DUMP("rms1_g", g, N, C);
    DUMP("rms1_dx", dx, N, C);
    DUMP("rms1_dw", dw, C);
    float *all[] = {lg, lc, lgg, ldx, gate, up, h, gh, dgate, dup, x, w, out, rstd, g, dx, dw};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        free(all[i]);
}

/* one per-head RMSNorm's buffers */
typedef struct head_norm {
    float *w, *out, *rstd, *dw;
} head_norm;

static head_norm head_norm_new(size_t n, int rows)
{
    head_norm h = {randn(HS, 0.3), zeros(n), zeros((size_t)rows), zeros(HS)};
    for (int i = 0; i < HS; i++)
        h.w[i] += 1.0f;
    return h;
}

static void attention(kern_device *d)
{
    kern_rope_cfg cfg = {.theta = 10000.0, .type = KERN_ROPE_NONE};
    float ct[P * HS / 2], st[P * HS / 2];
    acc_err err = {0};
    if (kern_rope_table(&cfg, P, HS, ct, st, &err) != 0)
        die(err.msg);
    int pos[N];
    for (int t = 0; t < T; t++) {
        pos[t] = t < 6 ? t : t - 6; /* a second document in sequence 0 */
        pos[T + t] = t;
    }
    float *q = randn(QN, 1), *k = randn(KN, 1), *v = randn(KN, 1), *g = randn(QN, 1);
    head_norm qn = head_norm_new(QN, N * NH), kn = head_norm_new(KN, N * NKV);
    float *out = zeros(QN), *lse = zeros((size_t)B * NH * T);
    float *scr = zeros(KERN_ATT_SCRATCH(T, NH));
    float *dqn = zeros(QN), *dkn = zeros(KN), *dv = zeros(KN), *dq = zeros(QN), *dk = zeros(KN);
    kern_att_opts o = {.scale = SCALE, .softcap = CAP_ATT, .window = WIN};
    /* per-head norm, then RoPE in place, then attention */
    d->ops->rmsnorm_fwd(d, qn.out, qn.rstd, q, qn.w, EPS, N * NH, HS);
    d->ops->rmsnorm_fwd(d, kn.out, kn.rstd, k, kn.w, EPS, N * NKV, HS);
    float *qr = zeros(QN), *kr = zeros(KN);
    d->ops->rope_fwd(d, qr, qn.out, ct, st, pos, B, T, NH, HS);
    d->ops->rope_fwd(d, kr, kn.out, ct, st, pos, B, T, NKV, HS);
    d->ops->gqa_attention_opt_fwd(d, out, lse, scr, qr, kr, v, pos, &o, B, T, NH, NKV, HS);
    d->ops->gqa_attention_opt_bwd(d, dqn, dkn, dv, scr, g, qr, kr, v, lse, out, pos, &o, B, T, NH,
                                  NKV, HS);
    d->ops->rope_bwd(d, dqn, dqn, ct, st, pos, B, T, NH, HS);
    d->ops->rope_bwd(d, dkn, dkn, ct, st, pos, B, T, NKV, HS);
    d->ops->rmsnorm_bwd(d, dq, qn.dw, dqn, q, qn.w, qn.rstd, N * NH, HS);
    d->ops->rmsnorm_bwd(d, dk, kn.dw, dkn, k, kn.w, kn.rstd, N * NKV, HS);
    DUMPI("att_pos", pos, B, T);
    DUMP("att_q", q, B, T, NH, HS);
    DUMP("att_k", k, B, T, NKV, HS);
    DUMP("att_v", v, B, T, NKV, HS);
    DUMP("att_qw", qn.w, HS);
    DUMP("att_kw", kn.w, HS);
    DUMP("att_g", g, B, T, NH, HS);
    DUMP("att_qn", qn.out, B, T, NH, HS);
    DUMP("att_out", out, B, T, NH, HS);
    DUMP("att_lse", lse, B, NH, T);
    DUMP("att_dq", dq, B, T, NH, HS);
    DUMP("att_dk", dk, B, T, NKV, HS);
    DUMP("att_dv", dv, B, T, NKV, HS);
    DUMP("att_dqw", qn.dw, HS);
    DUMP("att_dkw", kn.dw, HS);
    float *all[] = {q, k, v, g, out, lse, scr, dqn, dkn, dv, dq, dk, qr, kr, qn.w, qn.out,
                    qn.rstd, qn.dw, kn.w, kn.out, kn.rstd, kn.dw};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        free(all[i]);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: qwen3_gemma2_ops_dump DIR\n");
        return 2;
    }
    dir = argv[1];
    char path[4096];
    snprintf(path, sizeof path, "%s/manifest.txt", dir);
    if ((manifest = fopen(path, "w")) == NULL)
        die(path);
    fprintf(manifest, "eps %.9g\nrope 10000\ncaps %.9g %.9g\nscale %.9g\nwindow %d\n",
            (double)EPS, (double)CAP_LOGITS, (double)CAP_ATT, (double)SCALE, WIN);
    kern_device_info info = {.kind = KERN_DEV_CPU, .index = 0, .name = "cpu0", .mem_total = 0};
    kern_device *d = NULL;
    acc_err err = {0};
    if (kern_device_open(&info, 2, &d, &err) != 0)
        die(err.msg);
    rng_seed(&r, 2026, 19);
    pointwise(d);
    attention(d);
    kern_device_close(d);
    if (fclose(manifest) != 0)
        die("manifest");
    return 0;
}
