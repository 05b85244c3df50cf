/* kern_device: opens a device of the kind kern_discover listed. */
#include "kern_device.h"

#include "kern_cpu.h"
#include "kern_cuda.h"

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
    if (d->ops->mem_info != NULL) {
        d->ops->mem_info(d, out);
        return;
    }
    out->reserved = d->in_use;
    out->free_bytes = d->budget > d->in_use ? d->budget - d->in_use : 0;
}

uint64_t kern_alloc_size(const kern_ops *ops, uint64_t bytes)
{
    return ops != NULL && ops->alloc_size != NULL ? ops->alloc_size(bytes) : bytes;
}

uint64_t kern_runtime_bytes(const kern_ops *ops)
{
    return ops != NULL && ops->runtime_bytes != NULL ? ops->runtime_bytes() : 0;
}

const kern_ops *kern_backend_ops(kern_dev_kind kind)
{
    switch (kind) {
    case KERN_DEV_CPU: return kern_cpu_ops();
    case KERN_DEV_CUDA: return &kern_cuda_plan_ops;
    default: return NULL;
    }
}

/* one op of a family's set: its name, and whether the table has it */
typedef struct op_present {
    const char *name;
    int present;
} op_present;

static int ops_missing(const kern_device *d, const op_present *ops, size_t n,
                       const char *family, acc_err *err)
{
    for (size_t i = 0; i < n; i++)
        if (!ops[i].present)
            return acc_err_set(err, ACC_EDEVICE, "devices",
                               "device %s (%s backend) lacks the %s op %s", d->info.name,
                               d->ops->backend, family, ops[i].name);
    return 0;
}

int kern_llama_ops_check(const kern_device *d, acc_err *err)
{
    const kern_ops *o = d->ops;
    const op_present ops[] = {
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
        {"gqa_attention_pos_fwd", o->gqa_attention_pos_fwd != NULL},
        {"gqa_attention_pos_bwd", o->gqa_attention_pos_bwd != NULL},
        {"scale", o->scale != NULL},
        {"widen16", o->widen16 != NULL},
    };
    return ops_missing(d, ops, sizeof ops / sizeof *ops, "LLaMA family's", err);
}

int kern_decoder_ops_check(const kern_device *d, acc_err *err)
{
    const kern_ops *o = d->ops;
    const op_present ops[] = {
        {"softcap_fwd", o->softcap_fwd != NULL},
        {"softcap_bwd", o->softcap_bwd != NULL},
        {"geglu_fwd", o->geglu_fwd != NULL},
        {"geglu_bwd", o->geglu_bwd != NULL},
        {"rmsnorm_ofs_fwd", o->rmsnorm_ofs_fwd != NULL},
        {"rmsnorm_ofs_bwd", o->rmsnorm_ofs_bwd != NULL},
        {"gqa_attention_opt_fwd", o->gqa_attention_opt_fwd != NULL},
        {"gqa_attention_opt_bwd", o->gqa_attention_opt_bwd != NULL},
    };
    return ops_missing(d, ops, sizeof ops / sizeof *ops, "Qwen3 / Gemma 2", err);
}
