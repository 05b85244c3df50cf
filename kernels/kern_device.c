/* kern_device: opens a device of the kind kern_discover listed. */
#include "kern_device.h"

int kern_device_open(const kern_device_info *info, int threads, kern_device **out,
                     acc_err *err)
{
    *out = NULL;
    switch (info->kind) {
    case KERN_DEV_CPU:
        return kern_cpu_open(info, threads, out, err);
    case KERN_DEV_CUDA:
    default:
        return acc_err_set(err, ACC_EDEVICE, "devices",
                           "device %s: no training backend for this kind of device yet",
                           info->name);
    }
}

void kern_device_close(kern_device *d)
{
    if (d != NULL)
        d->ops->close(d);
}

void kern_device_reset_peak(kern_device *d)
{
    d->peak = d->in_use;
}
