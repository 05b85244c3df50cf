/* kern_discover: which devices this machine has.
 *
 * Lists CUDA GPUs (when the build has CUDA and a driver answers) or, when
 * there are none or the config says cpu, `cpu_devices` CPU devices: slices
 * of the host, each with its own memory budget. The daemon then checks GPUs
 * against the CPU (kern_selftest.h) before `devices = auto` uses them.
 */
#ifndef ACC_KERN_DISCOVER_H
#define ACC_KERN_DISCOVER_H

#include <stdbool.h>
#include <stdint.h>

#include "err.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KERN_MAX_DEVICES 256

typedef enum kern_dev_kind { KERN_DEV_CPU = 0, KERN_DEV_CUDA = 1 } kern_dev_kind;

/* "cpu" or "cuda": the kind's name in the API, metrics and plans. */
const char *kern_dev_kind_name(kern_dev_kind kind);

typedef struct kern_device_info {
    kern_dev_kind kind;
    int index;            /* CUDA ordinal, or CPU device number */
    char name[128];
    uint64_t mem_total;   /* bytes: the card's memory, or the CPU device budget */
    int cc_major, cc_minor; /* compute capability, 0 for CPU devices */
} kern_device_info;

typedef enum kern_want { KERN_WANT_AUTO, KERN_WANT_CUDA, KERN_WANT_CPU } kern_want;

/* Fill out[0..*n) with the devices to use. `want` CUDA with no GPU is an
 * ACC_EDEVICE error; AUTO falls back to CPU devices. */
int kern_discover(kern_want want, int cpu_devices, uint64_t cpu_device_memory,
                  kern_device_info *out, int max, int *n, acc_err *err);

/* True when this binary was built with the CUDA backend. */
bool kern_cuda_built(void);

/* CUDA backend: list GPUs. Returns 0 with *n = 0 when no driver or GPU is
 * present (that is not an error); only defined in CUDA builds. */
int kern_cuda_query(kern_device_info *out, int max, int *n, acc_err *err);

#ifdef __cplusplus
}
#endif

#endif
