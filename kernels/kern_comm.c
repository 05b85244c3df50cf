/* kern_comm: see kern_comm.h. Opens the communicator of the job's kind of
 * devices and dispatches each call through its kern_comm_ops table. */
#include "kern_comm.h"

#include <stdlib.h>


struct kern_comm {
    const kern_comm_ops *ops;
    void *impl;
};

int kern_comm_wrap(const kern_comm_ops *ops, void *impl, kern_comm **out, acc_err *err)
{
    kern_comm *c = calloc(1, sizeof *c);
    if (c == NULL) {
        ops->destroy(impl);
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    }
    c->ops = ops;
    c->impl = impl;
    *out = c;
    return 0;
}

/* The NCCL communicator of n CUDA devices (CUDA builds only). */
static int open_nccl(const kern_device_info *devs, int n, kern_comm **out, acc_err *err)
{
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
    return kern_comm_nccl_open(n, ordinals, out, err);
#else
    (void)devs;
    (void)n;
    (void)out;
    return acc_err_set(err, ACC_EDEVICE, "devices", "this accumd was built without CUDA");
#endif
}

int kern_comm_open(const kern_device_info *devs, int n, kern_comm **out, acc_err *err)
{
    if (n < 1 || devs[0].kind != KERN_DEV_CUDA)
        return kern_comm_create(n, out, err);
    return open_nccl(devs, n, out, err);
}

void kern_comm_destroy(kern_comm *c)
{
    if (c == NULL)
        return;
    c->ops->destroy(c->impl);
    free(c);
}

int kern_comm_bind(kern_comm *c, int rank, kern_device *dev, acc_err *err)
{
    return c->ops->bind != NULL ? c->ops->bind(c->impl, rank, dev, err) : 0;
}

int kern_comm_allreduce(kern_comm *c, int rank, float *buf, size_t n)
{
    return c->ops->allreduce(c->impl, rank, buf, n);
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
    return c->ops->reduce_start(c->impl, rank, base, spans, nspans);
}

int kern_comm_reduce_finish(kern_comm *c, int rank)
{
    return c->ops->reduce_finish(c->impl, rank);
}

int kern_comm_scatter_start(kern_comm *c, int rank, float *base, const kern_span *spans,
                            int nspans, size_t n)
{
    if (check_spans(spans, nspans) != 0)
        return ACC_EINVAL;
    return c->ops->scatter_start(c->impl, rank, base, spans, nspans, n);
}

int kern_comm_allgather(kern_comm *c, int rank, float *buf, size_t n)
{
    return c->ops->allgather(c->impl, rank, buf, n);
}

int kern_comm_allgather16(kern_comm *c, int rank, uint16_t *buf, size_t n)
{
    return c->ops->allgather16(c->impl, rank, buf, n);
}

int kern_comm_barrier(kern_comm *c)
{
    return c->ops->barrier(c->impl);
}

void kern_comm_abort(kern_comm *c)
{
    c->ops->abort(c->impl);
}

int kern_comm_aborted(kern_comm *c)
{
    return c->ops->aborted(c->impl);
}

uint64_t kern_comm_allreduce_calls(kern_comm *c)
{
    return c->ops->allreduce_calls(c->impl);
}

uint64_t kern_comm_bucket_calls(kern_comm *c)
{
    return c->ops->bucket_calls(c->impl);
}

int kern_comm_error(kern_comm *c, acc_err *err)
{
    return c->ops->error != NULL ? c->ops->error(c->impl, err) : 0;
}
