/* bench_nf4: NF4 throughput on one CPU device: the host
 * quantization at load (nf4_quantize + nf4_double_quant) and the device
 * op dequant_nf4 (double quantized, as a QLoRA base is fetched), next to
 * widen16 (a bf16 base's fetch) on the same count; LLaMA-2-7B's MLP
 * weight (11008 x 4096) by default. Median of --reps.
 *
 * Usage: bench_nf4 [--threads 2] [--rows 11008] [--cols 4096] [--reps 7]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "kern_device.h"
#include "nf4.h"

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    return t[n / 2];
}

static void *dev_copy(kern_device *d, const void *host, size_t bytes)
{
    void *p = NULL;
    acc_err err = {0};
    if (d->ops->alloc(d, bytes ? bytes : 1, &p, &err) != 0) {
        fprintf(stderr, "bench_nf4: %s\n", err.msg);
        exit(1);
    }
    d->ops->upload(d, p, host, bytes);
    return p;
}

int main(int argc, char **argv)
{
    int threads = 2, reps = 7;
    size_t rows = 11008, cols = 4096;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rows")) rows = (size_t)atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--cols")) cols = (size_t)atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
    }
    if (reps < 1 || reps > 64 || threads < 1)
        return fprintf(stderr, "usage: bench_nf4 [--threads N] [--rows R] [--cols C] [--reps K]\n"), 2;
    size_t n = rows * cols;
    nf4_sizes s = nf4_sizes_of(n);
    float *x = malloc(n * sizeof *x), *am = malloc(s.blocks * sizeof *am);
    float *nest = malloc(s.nested * sizeof *nest), map[NF4_DYN_MAP], off;
    uint8_t *packed = malloc(s.bytes), *q = malloc(s.blocks);
    uint16_t *h16 = malloc(n * sizeof *h16);
    if (!x || !am || !nest || !packed || !q || !h16)
        return fprintf(stderr, "bench_nf4: out of host memory\n"), 1;
    uint64_t r = 21;
    for (size_t i = 0; i < n; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(r >> 11) / 9007199254740992.0 - 0.5) * 0.05f;
        h16[i] = (uint16_t)(r >> 48) & 0x3fff;
    }
    nf4_dynamic_map(map);
    double tq[64], td[64], tw[64];
    for (int k = 0; k < reps; k++) {
        double t0 = bench_now();
        nf4_quantize(x, n, packed, am);
        nf4_double_quant(am, s.blocks, map, q, nest, &off);
        tq[k] = bench_now() - t0;
    }
    kern_device_info info = {.kind = KERN_DEV_CPU, .mem_total = 16ull << 30};
    snprintf(info.name, sizeof info.name, "cpu0");
    kern_device *d;
    acc_err err = {0};
    if (kern_device_open(&info, threads, &d, &err) != 0)
        return fprintf(stderr, "bench_nf4: %s\n", err.msg), 1;
    kern_nf4 kq = {dev_copy(d, packed, s.bytes), dev_copy(d, nf4_values, sizeof nf4_values), NULL,
                   dev_copy(d, q, s.blocks), dev_copy(d, nest, s.nested * sizeof(float)),
                   dev_copy(d, map, sizeof map), off};
    float *out = dev_copy(d, x, n * sizeof(float));
    uint16_t *w16 = dev_copy(d, h16, n * sizeof *h16);
    for (int k = 0; k < reps; k++) {
        double t0 = bench_now();
        d->ops->dequant_nf4(d, out, &kq, n);
        td[k] = bench_now() - t0;
        t0 = bench_now();
        d->ops->widen16(d, out, w16, n, 0);
        tw[k] = bench_now() - t0;
    }
    double mq = median(tq, reps), md = median(td, reps), mw = median(tw, reps);
    printf("%zu x %zu (%zu values), %d thread(s), median of %d\n", rows, cols, n, threads, reps);
    printf("quantize at load (host, 1 thread): %.3f s, %.1f Mvalues/s\n", mq, n / mq / 1e6);
    printf("dequant_nf4 (double quantized): %.4f s, %.1f Mvalues/s, %.2f GB/s of fp32 written "
           "(%.2f GB/s of 4-bit read)\n", md, n / md / 1e6, n * 4.0 / md / 1e9,
           (s.bytes + s.blocks) / md / 1e9);
    printf("widen16 (bf16, the 16-bit base's fetch): %.4f s, %.1f Mvalues/s\n", mw, n / mw / 1e6);
    kern_device_close(d);
    return 0;
}
