/* kern_cpu: the CPU backend of kern_device (kernels/cpu/kern_cpu.c): its
 * open function and the constants of its bf16 emulation. Only code that
 * picks the CPU backend by name (kern_device.c, tests comparing backends)
 * includes this; everything else goes through kern_ops.
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

/* The CPU ops table, for pure queries (kern_backend_ops). */
const kern_ops *kern_cpu_ops(void);

#endif
