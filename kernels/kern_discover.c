#include "kern_discover.h"

#include <stdio.h>

const char *kern_dev_kind_name(kern_dev_kind kind)
{
    return kind == KERN_DEV_CUDA ? "cuda" : "cpu";
}

bool kern_cuda_built(void)
{
#ifdef ACCUMD_HAVE_CUDA
    return true;
#else
    return false;
#endif
}

static int list_cpu(int count, uint64_t mem, kern_device_info *out, int max, int *n, acc_err *err)
{
    if (count > max)
        return acc_err_set(err, ACC_EINVAL, "cpu_devices", "at most %d CPU devices, asked %d", max, count);
    for (int i = 0; i < count; i++) {
        out[i] = (kern_device_info){.kind = KERN_DEV_CPU, .index = i, .mem_total = mem};
        snprintf(out[i].name, sizeof out[i].name, "cpu%d", i);
    }
    *n = count;
    return 0;
}

int kern_discover(kern_want want, int cpu_devices, uint64_t cpu_device_memory,
                  kern_device_info *out, int max, int *n, acc_err *err)
{
    *n = 0;
    if (want != KERN_WANT_CPU) {
#ifdef ACCUMD_HAVE_CUDA
        int rc = kern_cuda_query(out, max, n, err);
        if (rc != 0)
            return rc;
        /* the daemon checks them (kern_selftest) before "auto" trusts them */
        if (*n > 0)
            return 0;
        *n = 0;
#endif
        if (want == KERN_WANT_CUDA)
            return acc_err_set(err, ACC_EDEVICE, "devices",
                               kern_cuda_built() ? "devices = cuda but no CUDA GPU was found"
                                                 : "devices = cuda but this accumd was built without CUDA");
    }
    return list_cpu(cpu_devices, cpu_device_memory, out, max, n, err);
}
