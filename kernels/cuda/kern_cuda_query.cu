/* CUDA device query: the GPUs the driver reports, with name, memory and
 * compute capability. No GPU or no driver is not an error: the daemon then
 * falls back to CPU devices. */
#include <cuda_runtime.h>
#include <stdio.h>

#include "kern_discover.h"

extern "C" int kern_cuda_query(kern_device_info *out, int max, int *n, acc_err *err)
{
    int count = 0;
    *n = 0;
    cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc == cudaErrorNoDevice || rc == cudaErrorInsufficientDriver) {
        (void)cudaGetLastError();
        return 0;
    }
    if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        /* a broken driver install should not keep CPU devices from working */
        return 0;
    }
    if (count > max)
        count = max;
    for (int i = 0; i < count; i++) {
        cudaDeviceProp prop;
        rc = cudaGetDeviceProperties(&prop, i);
        if (rc != cudaSuccess)
            return acc_err_set(err, ACC_EDEVICE, "devices", "cudaGetDeviceProperties(%d): %s", i,
                               cudaGetErrorString(rc));
        out[i].kind = KERN_DEV_CUDA;
        out[i].index = i;
        snprintf(out[i].name, sizeof out[i].name, "%.127s", prop.name);
        out[i].mem_total = (uint64_t)prop.totalGlobalMem;
        out[i].cc_major = prop.major;
        out[i].cc_minor = prop.minor;
    }
    *n = count;
    return 0;
}
