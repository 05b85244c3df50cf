/* kern_comm: see kern_comm.h. Forwards each call to the shared-memory or
 * the NCCL communicator. */
#include "kern_comm.h"

#include <stdlib.h>

#include "kern_comm_cpu.h"
#ifdef ACCUMD_HAVE_CUDA
#include "kern_comm_nccl.h"
#include "kern_cuda.h"
#endif

struct kern_comm {
    kern_comm_cpu *cpu;
#ifdef ACCUMD_HAVE_CUDA
    kern_nccl *nccl;
#endif
};

#ifdef ACCUMD_HAVE_CUDA
#define NCCL_OR_CPU(c, nccl_call, cpu_call) ((c)->nccl != NULL ? (nccl_call) : (cpu_call))
#else
#define NCCL_OR_CPU(c, nccl_call, cpu_call) (cpu_call)
#endif

int kern_comm_create(int nranks, kern_comm **out, acc_err *err)
{
    kern_comm *c = calloc(1, sizeof *c);
    if (c == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    int rc = kern_comm_cpu_create(nranks, &c->cpu, err);
    if (rc != 0) {
        free(c);
        return rc;
    }
    *out = c;
    return 0;
}

int kern_comm_open(const kern_device_info *devs, int n, kern_comm **out, acc_err *err)
{
    if (n < 1 || devs[0].kind != KERN_DEV_CUDA)
        return kern_comm_create(n, out, err);
#ifdef ACCUMD_HAVE_CUDA
    int ordinals[KERN_MAX_DEVICES];
    if (n > KERN_MAX_DEVICES)
        return acc_err_set(err, ACC_EINVAL, "devices", "at most %d devices per communicator",
                           KERN_MAX_DEVICES);
    for (int i = 0; i < n; i++) {
        if (devs[i].kind != KERN_DEV_CUDA)
            return acc_err_set(err, ACC_EINVAL, "devices", "a job's devices must all be of one kind");
        ordinals[i] = devs[i].index;
    }
    kern_comm *c = calloc(1, sizeof *c);
    if (c == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    int rc = kern_nccl_create(n, ordinals, &c->nccl, err);
    if (rc != 0) {
        free(c);
        return rc;
    }
    *out = c;
    return 0;
#else
    return acc_err_set(err, ACC_EDEVICE, "devices", "this accumd was built without CUDA");
#endif
}

void kern_comm_destroy(kern_comm *c)
{
    if (c == NULL)
        return;
#ifdef ACCUMD_HAVE_CUDA
    if (c->nccl != NULL)
        kern_nccl_destroy(c->nccl);
#endif
    if (c->cpu != NULL)
        kern_comm_cpu_destroy(c->cpu);
    free(c);
}

int kern_comm_bind(kern_comm *c, int rank, kern_device *dev, acc_err *err)
{
#ifdef ACCUMD_HAVE_CUDA
    if (c->nccl != NULL)
        return kern_nccl_bind(c->nccl, rank, kern_cuda_stream(dev), err);
#endif
    return 0;
}

int kern_comm_allreduce(kern_comm *c, int rank, float *buf, size_t n)
{
    return NCCL_OR_CPU(c, kern_nccl_allreduce(c->nccl, rank, buf, n),
                       kern_comm_cpu_allreduce(c->cpu, rank, buf, n));
}

static int check_spans(const kern_span *spans, int nspans)
{
    if (spans == NULL || nspans < 1 || nspans > KERN_COMM_MAX_SPANS)
        return ACC_EINVAL;
    return 0;
}

int kern_comm_reduce_start(kern_comm *c, int rank, float *base, const kern_span *spans,
                           int nspans)
{
    if (check_spans(spans, nspans) != 0)
        return ACC_EINVAL;
    return NCCL_OR_CPU(c, kern_nccl_reduce_start(c->nccl, rank, base, spans, nspans),
                       kern_comm_cpu_reduce_spans(c->cpu, rank, base, spans, nspans));
}

int kern_comm_reduce_finish(kern_comm *c, int rank)
{
    return NCCL_OR_CPU(c, kern_nccl_reduce_finish(c->nccl, rank),
                       kern_comm_cpu_reduce_finish(c->cpu, rank));
}

int kern_comm_barrier(kern_comm *c)
{
    return NCCL_OR_CPU(c, kern_nccl_barrier(c->nccl), kern_comm_cpu_barrier(c->cpu));
}

void kern_comm_abort(kern_comm *c)
{
#ifdef ACCUMD_HAVE_CUDA
    if (c->nccl != NULL) {
        kern_nccl_abort(c->nccl);
        return;
    }
#endif
    kern_comm_cpu_abort(c->cpu);
}

int kern_comm_aborted(kern_comm *c)
{
    return NCCL_OR_CPU(c, kern_nccl_aborted(c->nccl), kern_comm_cpu_aborted(c->cpu));
}

uint64_t kern_comm_allreduce_calls(kern_comm *c)
{
    return NCCL_OR_CPU(c, kern_nccl_allreduce_calls(c->nccl), kern_comm_cpu_allreduce_calls(c->cpu));
}

uint64_t kern_comm_bucket_calls(kern_comm *c)
{
    return NCCL_OR_CPU(c, kern_nccl_bucket_calls(c->nccl), kern_comm_cpu_bucket_calls(c->cpu));
}

int kern_comm_error(kern_comm *c, acc_err *err)
{
#ifdef ACCUMD_HAVE_CUDA
    if (c->nccl != NULL)
        return kern_nccl_error(c->nccl, err);
#endif
    (void)c;
    (void)err;
    return 0;
}
