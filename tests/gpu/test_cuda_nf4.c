/* GPU: dequant_nf4 on the GPU gives nf4_dequantize's
 * bits (host, core/model/nf4.c) on a weight quantized by nf4_quantize,
 * with an fp32 absmax and double quantized; and its throughput (GB/s of
 * fp32 written). Exits 77 (skipped) where no GPU is present. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kern_cuda.h"
#include "gpu_fixture.h"
#include "nf4.h"

static void *dev_copy(kern_device *d, const void *host, size_t bytes)
{
    void *p = NULL;
    acc_err err = {0};
    if (d->ops->alloc(d, bytes ? bytes : 1, &p, &err) != 0) {
        fprintf(stderr, "alloc: %s\n", err.msg);
        exit(1);
    }
    d->ops->upload(d, p, host, bytes);
    return p;
}

int main(void)
{
    kern_device_info g[KERN_MAX_DEVICES];
    kern_device *cpu = NULL, *gpu = NULL;
    int n = 0, failures = 0;
    int skip = gpu_list_or_skip(g, &n);
    if (skip != 0)
        return skip;
    if (gpu_open_pair(g, &cpu, &gpu) != 0)
        return 1;
    size_t cnt = (size_t)4096 * 4096 + 37;
    nf4_sizes s = nf4_sizes_of(cnt);
    float *x = malloc(cnt * sizeof *x), *want = malloc(cnt * sizeof *want);
    float *got = malloc(cnt * sizeof *got), *am = malloc(s.blocks * sizeof *am);
    float *am2 = malloc(s.blocks * sizeof *am2), *nest = malloc(s.nested * sizeof *nest);
    uint8_t *packed = malloc(s.bytes), *q = malloc(s.blocks);
    float map[NF4_DYN_MAP], off;
    if (!x || !want || !got || !am || !am2 || !nest || !packed || !q)
        return fprintf(stderr, "out of host memory\n"), 1;
    uint64_t r = 21;
    for (size_t i = 0; i < cnt; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(r >> 11) / 9007199254740992.0 - 0.5) * (1.0f + (float)(i % 977));
    }
    nf4_dynamic_map(map);
    nf4_quantize(x, cnt, packed, am);
    nf4_double_quant(am, s.blocks, map, q, nest, &off);
    nf4_absmax_dequant(q, s.blocks, nest, map, off, am2);
    kern_nf4 k = {dev_copy(gpu, packed, s.bytes), dev_copy(gpu, nf4_values, sizeof nf4_values),
                  NULL, dev_copy(gpu, q, s.blocks), dev_copy(gpu, nest, s.nested * sizeof(float)),
                  dev_copy(gpu, map, sizeof map), off};
    float *fam = dev_copy(gpu, am, s.blocks * sizeof(float));
    float *out = dev_copy(gpu, x, cnt * sizeof(float));
    for (int nested = 0; nested <= 1; nested++) {
        k.absmax = nested ? NULL : fam;
        nf4_dequantize(packed, nested ? am2 : am, nf4_values, cnt, want);
        gpu->ops->dequant_nf4(gpu, out, &k, cnt);
        gpu->ops->download(gpu, got, out, cnt * sizeof(float));
        int same = memcmp(got, want, cnt * sizeof(float)) == 0;
        printf("%s dequant_nf4%s: the host's bits\n", same ? "ok  " : "FAIL",
               nested ? " (double quantization)" : "");
        failures += !same;
    }
    struct timespec t0, t1;
    int reps = 50;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < reps; i++)
        gpu->ops->dequant_nf4(gpu, out, &k, cnt);
    gpu->ops->download(gpu, got, out, sizeof(float)); /* waits for the stream */
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double sec = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("dequant_nf4 (double quantization) on %s: %.1f Gvalues/s (%zu values x %d)\n",
           g[0].name, (double)cnt * reps / sec / 1e9, cnt, reps);
    acc_err err = {0};
    if (gpu->ops->last_error(gpu, &err) != 0) {
        fprintf(stderr, "FAIL: %s\n", err.msg);
        failures++;
    }
    kern_device_close(gpu);
    kern_device_close(cpu);
    return failures ? 1 : 0;
}
