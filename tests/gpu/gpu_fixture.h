/* gpu_fixture: the GPU tests' common start (header-only).
 *
 * gpu_list_or_skip() lists the GPUs; it returns 0 when there is at least
 * one, 77 (meson's "skipped") with a SKIP line when there is none, and 1
 * when the query itself failed. */
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

#endif
