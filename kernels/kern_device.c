/* kern_device: opens a device of the kind kern_discover listed. */
#include "kern_device.h"

#ifdef ACCUMD_HAVE_CUDA
#include "kern_cuda.h"
#endif

int kern_device_open(const kern_device_info *info, int threads, kern_device **out,
                     acc_err *err)
{
    *out = NULL;
    switch (info->kind) {
    case KERN_DEV_CPU:
        return kern_cpu_open(info, threads, out, err);
    case KERN_DEV_CUDA:
#ifdef ACCUMD_HAVE_CUDA
        return kern_cuda_open(info, threads, out, err);
#else
        return acc_err_set(err, ACC_EDEVICE, "devices",
                           "device %s: this accumd was built without CUDA", info->name);
#endif
    default:
        return acc_err_set(err, ACC_EDEVICE, "devices", "device %s: unknown kind %d",
                           info->name, (int)info->kind);
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

void kern_device_mem_info(kern_device *d, kern_mem_info *out)
{
#ifdef ACCUMD_HAVE_CUDA
    if (d->info.kind == KERN_DEV_CUDA) {
        out->reserved = kern_cuda_reserved(d);
        out->free_bytes = kern_cuda_free_bytes(d);
        return;
    }
#endif
    out->reserved = d->in_use;
    out->free_bytes = d->budget > d->in_use ? d->budget - d->in_use : 0;
}

int kern_device_bf16_scratch(kern_device *d, uint64_t a_bytes, uint64_t b_bytes, acc_err *err)
{
#ifdef ACCUMD_HAVE_CUDA
    if (d->info.kind == KERN_DEV_CUDA)
        return kern_cuda_bf16_reserve(d, (size_t)a_bytes, (size_t)b_bytes, err);
#endif
    (void)a_bytes;
    (void)b_bytes;
    (void)err;
    return 0;
}

int kern_llama_ops_check(const kern_device *d, acc_err *err)
{
    const kern_ops *o = d->ops;
    const struct {
        const char *name;
        int present;
    } ops[] = {
        {"embed_fwd", o->embed_fwd != NULL},
        {"embed_bwd", o->embed_bwd != NULL},
        {"rmsnorm_fwd", o->rmsnorm_fwd != NULL},
        {"rmsnorm_bwd", o->rmsnorm_bwd != NULL},
        {"rope_fwd", o->rope_fwd != NULL},
        {"rope_bwd", o->rope_bwd != NULL},
        {"swiglu_fwd", o->swiglu_fwd != NULL},
        {"swiglu_bwd", o->swiglu_bwd != NULL},
        {"gqa_attention_fwd", o->gqa_attention_fwd != NULL},
        {"gqa_attention_bwd", o->gqa_attention_bwd != NULL},
    };
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++)
        if (!ops[i].present)
            return acc_err_set(err, ACC_EDEVICE, "devices",
                               "device %s (%s backend) lacks the LLaMA family's op %s",
                               d->info.name, o->backend, ops[i].name);
    return 0;
}
