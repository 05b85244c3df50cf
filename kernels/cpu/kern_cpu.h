/* kern_cpu: the CPU backend of kern_device (kernels/cpu/kern_cpu.c): its
 * open function, the constants of its bf16 emulation and its AdamW
 * arithmetic on host memory. Only code that picks the CPU backend by name
 * (kern_device.c, tests comparing backends) and the optimizer offload
 * (core/train/adamw.c, which runs the CPU AdamW on the host whatever the
 * device) include this; everything else goes through kern_ops.
 */
#ifndef ACC_KERN_CPU_H
#define ACC_KERN_CPU_H

#include "kern_device.h"

/* Open a CPU device (a slice of the host with a memory budget). */
int kern_cpu_open(const kern_device_info *info, int threads, kern_device **out, acc_err *err);

/* The CPU backend's bf16 products are tiled: KERN_CPU_BF16_TILE x
 * KERN_CPU_BF16_TILE blocks of the output, KERN_CPU_BF16_DEPTH-deep slices
 * of the inner dimension. Its scratch per kernel thread holds the rounded
 * copies of one slice of each operand: two TILE x DEPTH float panels,
 * KERN_CPU_BF16_SCRATCH bytes (1 MiB). Allocated by set_precision(bf16 = 1),
 * host memory outside the budget. */
#define KERN_CPU_BF16_TILE 512
#define KERN_CPU_BF16_DEPTH 256
#define KERN_CPU_BF16_SCRATCH (2u * KERN_CPU_BF16_TILE * KERN_CPU_BF16_DEPTH * sizeof(float))

/* The CPU backend's AdamW (its adamw op) on elements [lo, hi) of host
 * arrays, on the calling thread: bit for bit what the op computes for the
 * elements of a run of n >= hi elements given in one call, as long as lo is
 * a multiple of 4 past the run's start or hi is the run's end (the op's
 * four-lane groups start at the run's first element; each lane computes
 * what the scalar tail computes, but this keeps the two alike even where a
 * compiler contracts the scalar form). The optimizer offload
 * (core/train/adamw.c) runs it over host memory. */
void kern_cpu_adamw_span(float *p, const float *g, float *m, float *v, size_t lo, size_t hi, float lr,
                         float beta1, float beta2, float eps, float weight_decay, float grad_scale, int t);

/* The CPU ops table, for pure queries (kern_backend_ops). */
const kern_ops *kern_cpu_ops(void);

#endif
