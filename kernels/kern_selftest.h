/* kern_selftest: does a device compute what the CPU reference computes?
 *
 * kern_selftest() runs every op of the device interface (copies, embedding,
 * LayerNorm, matmul with bias, attention, GELU, add, the fused softmax +
 * cross-entropy with its gradient, AdamW, sum of squares, and the LLaMA
 * family's embedding, RMSNorm, RoPE, SwiGLU and grouped-query attention,
 * and Qwen3's / Gemma 2's soft-capping, tanh-GELU gate, RMSNorm with an
 * offset and attention with options, where the device's backend has
 * them; matmul once more in bf16 mode, set_precision, on both devices,
 * also on an odd shape) on the same small
 * random inputs on `dev` and on `ref` (a CPU device), and compares the
 * results: the largest difference over the largest reference value must be
 * under `tol` (1e-4 is fp32's margin for a different summation order;
 * bf16 mode's products under KERN_SELFTEST_BF16_TOL, or `tol` if larger). It
 * touches nothing but the two devices' memory (a few hundred KiB, freed) and
 * takes milliseconds once the device is up.
 *
 * The daemon runs it on the first GPU at start: with devices = auto the
 * GPUs are used only when it passes, so a backend that computes wrong on
 * this machine (driver, toolkit, a bug never met elsewhere) falls back to
 * CPU devices with the reason logged instead of training garbage.
 *
 * Returns 0 when every op agrees; ACC_EDEVICE with the first disagreeing op
 * (its name, the error and the tolerance) or the device's own error in err.
 */
#ifndef ACC_KERN_SELFTEST_H
#define ACC_KERN_SELFTEST_H

#include "err.h"
#include "kern_device.h"

#define KERN_SELFTEST_TOL 1e-4
/* bf16 mode against the CPU's bf16: the GPU tests' bf16 tolerance
 * (tests/gpu). Loose enough for a library that rounds the operands its own
 * way (the CUDA backend's is cuBLAS's, docs/cuda.md), tight enough that a
 * wrong product (a transpose, a stride, garbage) fails: those differ by
 * order 1. */
#define KERN_SELFTEST_BF16_TOL 1e-2

int kern_selftest(kern_device *dev, kern_device *ref, double tol, acc_err *err);

/* Open `info` and a CPU reference device, run kern_selftest, close both. */
int kern_selftest_device(const kern_device_info *info, acc_err *err);

#endif
