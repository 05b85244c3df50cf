/* bench_llama_ops: the LLaMA family's CPU ops, forward + backward, on one
 * layer of the benchmark shape (C 384, 6 heads of 64 with 2
 * key/value heads, SwiGLU 1024, seq 128, B 4 sequences), next to the same
 * layer's linear products (q, k, v, o, gate, up, down: matmul_fwd + bwd)
 * and the GPT-2 ops they replace, so the share of a layer's time outside
 * the products is visible. Median of REPS runs per op.
 *
 * Usage: bench_llama_ops [threads] [B]   (defaults 2, 4)
 * Prints one "RESULT name ms" line per op and a summary.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "kern_device.h"
#include "kern_rope.h"

enum { T = 128, C = 384, NH = 6, NKV = 2, HS = 64, I = 1024, REPS = 21 };

static kern_device *d;
static float *bufs[64]; /* every buffer, freed at the end */
static int nbufs;

static float *buf(size_t n)
{
    float *p = NULL;
    acc_err err = {0};
    if (d->ops->alloc(d, n * sizeof *p, (void **)&p, &err) != 0) {
        fprintf(stderr, "bench_llama_ops: %s\n", err.msg);
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        p[i] = (float)((double)((i * 2654435761u) % 1000) / 1000.0 - 0.5);
    if (nbufs == (int)(sizeof bufs / sizeof *bufs)) {
        fprintf(stderr, "bench_llama_ops: too many buffers\n");
        exit(1);
    }
    return bufs[nbufs++] = p;
}

#define TIME(name, stmt)                                         \
    do {                                                         \
        double v_[REPS];                                         \
        for (int r_ = 0; r_ < REPS; r_++) {                      \
            double t0_ = bench_now();                            \
            stmt;                                                \
            v_[r_] = bench_now() - t0_;                          \
        }                                                        \
        last = 1e3 * bench_median(v_, REPS);                     \
        printf("RESULT %-28s %8.3f ms\n", name, last);           \
    } while (0)

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 2, B = argc > 2 ? atoi(argv[2]) : 4;
    kern_device_info info = {.kind = KERN_DEV_CPU, .index = 0, .name = "cpu0", .mem_total = 0};
    acc_err err = {0};
    if (threads < 1 || B < 1 || kern_device_open(&info, threads, &d, &err) != 0) {
        fprintf(stderr, "bench_llama_ops: bad arguments or %s\n", err.msg);
        return 1;
    }
    int N = B * T;
    size_t nc = (size_t)N * C, nq = (size_t)N * NH * HS, nk = (size_t)N * NKV * HS;
    size_t ni = (size_t)N * I;
    float *x = buf(nc), *y = buf(nc), *dx = buf(nc), *w = buf(C), *dw = buf(C), *rstd = buf(N);
    float *q = buf(nq), *k = buf(nk), *v = buf(nk), *o = buf(nq), *lse = buf((size_t)B * NH * T);
    float *dq = buf(nq), *dk = buf(nk), *dv = buf(nk), *go = buf(nq);
    float *scr = buf(KERN_ATT_SCRATCH(T, NH));
    float *gate = buf(ni), *up = buf(ni), *h = buf(ni), *dh = buf(ni), *dg = buf(ni);
    float *du = buf(ni);
    float *wq = buf((size_t)C * C), *dwq = buf((size_t)C * C), *wi = buf((size_t)I * C);
    float *dwi = buf((size_t)I * C), *wkv = buf((size_t)NKV * HS * C);
    float *dwkv = buf((size_t)NKV * HS * C);
    float *ct = buf((size_t)T * HS / 2), *st = buf((size_t)T * HS / 2);
    kern_rope_cfg rc = {.theta = 500000.0, .type = KERN_ROPE_NONE};
    if (kern_rope_table(&rc, T, HS, ct, st, &err) != 0) {
        fprintf(stderr, "bench_llama_ops: %s\n", err.msg);
        return 1;
    }
    /* q k^T scaled: keep the scores in a sane range */
    for (size_t i = 0; i < nq; i++)
        q[i] *= 0.1f;
    printf("bench_llama_ops: B=%d T=%d C=%d NH=%d NKV=%d hs=%d I=%d, %d threads, median of %d\n",
           B, T, C, NH, NKV, HS, I, threads, REPS);
    double last = 0, ops = 0, mm = 0, gpt2 = 0; /* ms per layer */
    const kern_ops *K = d->ops;
    TIME("rmsnorm_fwd", K->rmsnorm_fwd(d, y, rstd, x, w, 1e-5f, N, C));
    ops += 2 * last; /* two norms per layer */
    TIME("rmsnorm_bwd", K->rmsnorm_bwd(d, dx, dw, y, x, w, rstd, N, C));
    ops += 2 * last;
    TIME("rope_fwd q+k", (K->rope_fwd(d, q, q, ct, st, NULL, B, T, NH, HS),
                          K->rope_fwd(d, k, k, ct, st, NULL, B, T, NKV, HS)));
    ops += last;
    TIME("rope_bwd q+k", (K->rope_bwd(d, q, q, ct, st, NULL, B, T, NH, HS),
                          K->rope_bwd(d, k, k, ct, st, NULL, B, T, NKV, HS)));
    ops += last;
    TIME("gqa_attention_fwd", K->gqa_attention_fwd(d, o, lse, scr, q, k, v, B, T, NH, NKV, HS));
    ops += last;
    TIME("gqa_attention_bwd",
         K->gqa_attention_bwd(d, dq, dk, dv, scr, go, q, k, v, lse, o, B, T, NH, NKV, HS));
    ops += last;
    /* lean activations (issue 20): the tiled attention, for comparison (not summed) */
    TIME("attention_lean_fwd", K->attention_lean_fwd(d, o, lse, scr, q, k, v, NH * HS, NKV * HS,
                                                     NULL, NULL, B, T, NH, NKV, HS));
    TIME("attention_lean_bwd",
         K->attention_lean_bwd(d, dq, dk, dv, scr, go, q, k, v, lse, o, NH * HS, NKV * HS, NULL,
                               NULL, B, T, NH, NKV, HS));
    TIME("swiglu_fwd", K->swiglu_fwd(d, h, gate, up, ni));
    ops += last;
    TIME("swiglu_bwd", K->swiglu_bwd(d, dg, du, dh, gate, up, ni));
    ops += last;
    /* the layer's products: q, o (C x C), k, v (C -> NKV*HS), gate, up, down */
    TIME("matmul q/o fwd+bwd", (K->matmul_fwd(d, q, x, wq, NULL, N, C, C),
                                K->matmul_bwd(d, dx, dwq, NULL, q, x, wq, N, C, C)));
    mm += 2 * last;
    TIME("matmul k/v fwd+bwd", (K->matmul_fwd(d, k, x, wkv, NULL, N, C, NKV * HS),
                                K->matmul_bwd(d, dx, dwkv, NULL, k, x, wkv, N, C, NKV * HS)));
    mm += 2 * last;
    TIME("matmul gate/up fwd+bwd", (K->matmul_fwd(d, gate, x, wi, NULL, N, C, I),
                                    K->matmul_bwd(d, dx, dwi, NULL, gate, x, wi, N, C, I)));
    mm += 3 * last; /* down is the same product transposed */
    /* the GPT-2 ops they stand in for */
    TIME("gpt2 layernorm fwd+bwd", (K->layernorm_fwd(d, y, rstd, rstd, x, w, w, N, C),
                                    K->layernorm_bwd(d, dx, dw, dw, y, x, w, rstd, rstd, N, C)));
    gpt2 += 2 * last; /* two norms per layer */
    TIME("gpt2 gelu fwd+bwd (I)", (K->gelu_fwd(d, h, gate, ni), K->gelu_bwd(d, dh, gate, h, ni)));
    gpt2 += last;
    float *qkv = buf((size_t)N * 3 * C), *dqkv = buf((size_t)N * 3 * C);
    for (size_t i = 0; i < (size_t)N * 3 * C; i++)
        qkv[i] *= 0.1f;
    TIME("gpt2 attention_fwd (MHA 6)", K->attention_fwd(d, o, lse, scr, qkv, B, T, C, NH));
    TIME("gpt2 attention_bwd (MHA 6)",
         K->attention_bwd(d, dqkv, scr, go, qkv, lse, o, B, T, C, NH));
    printf("RESULT %-28s %8.3f ms\n", "llama_ops_per_layer", ops);
    printf("RESULT %-28s %8.3f ms\n", "matmuls_per_layer", mm);
    printf("RESULT %-28s %8.1f %%\n", "llama_ops_share", 100.0 * ops / (ops + mm));
    printf("RESULT %-28s %8.3f ms\n", "gpt2_norm_gelu_per_layer", gpt2);
    for (int i = 0; i < nbufs; i++)
        d->ops->free(d, bufs[i]);
    kern_device_close(d);
    return 0;
}
