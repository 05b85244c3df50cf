/* gpu_fixture: the GPU tests' common start (header-only).
 *
 * gpu_list_or_skip() lists the GPUs; it returns 0 when there is at least
 * one, 77 (meson's "skipped") with a SKIP line when there is none, and 1
 * when the query itself failed. gpu_open_pair() opens the CPU reference
 * device and the first GPU. */
#ifndef ACC_GPU_FIXTURE_H
#define ACC_GPU_FIXTURE_H

#include <stdio.h>

#include "kern_discover.h"

static inline int gpu_list_or_skip(kern_device_info *g, int *n)
{
    acc_err err = {0};
    *n = 0;
    if (kern_cuda_query(g, KERN_MAX_DEVICES, n, &err) != 0) {
        fprintf(stderr, "kern_cuda_query failed: %s\n", err.msg);
        return 1;
    }
    if (*n == 0) {
        printf("SKIP: no CUDA GPU on this machine\n");
        return 77;
    }
    return 0;
}

/* A CPU reference device and the first GPU, side by side (kern_cuda.h must
 * be included before this header). Returns 0, or 1 with a message. */
#ifdef ACC_KERN_CUDA_H
#include "kern_cpu.h"
#include "kern_device.h"

static inline int gpu_open_pair(const kern_device_info *g, kern_device **cpu, kern_device **gpu)
{
    acc_err err = {0};
    kern_device_info ci = {.kind = KERN_DEV_CPU, .index = 0, .mem_total = 0};
    snprintf(ci.name, sizeof ci.name, "cpu0");
    if (kern_cpu_open(&ci, 1, cpu, &err) != 0 || kern_cuda_open(&g[0], 1, gpu, &err) != 0) {
        fprintf(stderr, "open: %s\n", err.msg);
        return 1;
    }
    return 0;
}
#endif

#endif
