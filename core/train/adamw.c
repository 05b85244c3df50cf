/* adamw: see adamw.h. */
#include "adamw.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "host_mem.h"
#include "kern_cpu.h"

int adamw_state_bytes(size_t lo, size_t hi, uint64_t *bytes, acc_err *err)
{
    if (hi < lo || acc_mul_u64(hi - lo, 2 * sizeof(float), bytes))
        return acc_err_set(err, ACC_EINVAL, "model", "the optimizer state overflows 64-bit sizes");
    return 0;
}

/* `arrays` host arrays of (hi - lo) floats; overflow-checked. */
static int host_arrays_bytes(size_t lo, size_t hi, uint64_t arrays, uint64_t *bytes, acc_err *err)
{
    if (hi < lo || acc_mul_u64(hi - lo, arrays * sizeof(float), bytes))
        return acc_err_set(err, ACC_EINVAL, "model", "the offloaded optimizer state overflows 64-bit sizes");
    return 0;
}

int adamw_host_bytes(size_t lo, size_t hi, uint64_t *bytes, acc_err *err)
{
    return host_arrays_bytes(lo, hi, 4, bytes, err); /* moments, master, gradients' copy */
}

int adamw_host_bytes_grads_on(size_t lo, size_t hi, uint64_t *bytes, acc_err *err)
{
    return host_arrays_bytes(lo, hi, 3, bytes, err); /* moments, master */
}

/* A heap copy of `init` (every constructor's first step), or NULL. */
static adamw *adamw_new(adamw init)
{
    adamw *a = malloc(sizeof *a);
    if (a != NULL)
        *a = init;
    return a;
}

int adamw_create(kern_device *dev, size_t lo, size_t hi, adamw **out, acc_err *err)
{
    *out = NULL;
    uint64_t bytes;
    int rc = adamw_state_bytes(lo, hi, &bytes, err);
    if (rc != 0)
        return rc;
    adamw *a = adamw_new((adamw){.dev = dev, .lo = lo, .hi = hi});
    if (a == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory");
    size_t each = (hi - lo) * sizeof(float);
    const kern_ops *k = dev->ops;
    rc = k->alloc(dev, each, (void **)&a->m, err);
    if (rc == 0)
        rc = k->alloc(dev, each, (void **)&a->v, err);
    if (rc != 0) {
        adamw_free(a);
        return rc;
    }
    k->zero(dev, a->m, each);
    k->zero(dev, a->v, each);
    *out = a;
    return 0;
}

/* pin_memory: page-lock the buffers that cross the bus, both or neither. */
static int pin_buffers(adamw *a, acc_err *err)
{
    const kern_ops *k = a->dev->ops;
    size_t each = (a->hi - a->lo) * sizeof(float);
    if (k->host_register == NULL || each == 0)
        return 0;
    acc_err e = {0};
    int rc = k->host_register(a->dev, a->master, each, &e);
    if (rc == 0 && !a->g_aliased && (rc = k->host_register(a->dev, a->g, each, &e)) != 0)
        k->host_unregister(a->dev, a->master);
    if (rc != 0)
        return acc_err_set(err, rc, "zero_optimization.offload_optimizer.pin_memory",
                           "pin_memory: the device cannot page-lock the optimizer's host buffers: %s", e.msg);
    a->pinned = true;
    return 0;
}

/* adamw_create_host; with g_on its gradients' copy is the caller's grads_host. */
static int create_host(kern_device *dev, host_mem *host, int threads, bool pin, size_t lo, size_t hi, bool g_on,
                       float *grads_host, adamw **out, acc_err *err)
{
    *out = NULL;
    uint64_t bytes;
    int rc = g_on ? adamw_host_bytes_grads_on(lo, hi, &bytes, err) : adamw_host_bytes(lo, hi, &bytes, err);
    if (rc != 0)
        return rc;
    adamw *a = adamw_new((adamw){.dev = dev, .lo = lo, .hi = hi, .host = host, .threads = threads >= 1 ? threads : 1,
                                 .g = grads_host, .g_aliased = g_on});
    if (a == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory");
    size_t each = (hi - lo) * sizeof(float);
    float **bufs[] = {&a->m, &a->v, &a->master, &a->g}; /* host_mem zeroes them */
    for (size_t i = 0; rc == 0 && i < sizeof bufs / sizeof bufs[0] - (a->g_aliased ? 1 : 0); i++)
        rc = host_mem_alloc(host, each, (void **)bufs[i], err);
    if (rc == 0 && pin)
        rc = pin_buffers(a, err);
    if (rc != 0) {
        adamw_free(a);
        return rc;
    }
    *out = a;
    return 0;
}

int adamw_create_host(kern_device *dev, host_mem *host, int threads, bool pin, size_t lo, size_t hi,
                      adamw **out, acc_err *err)
{
    return create_host(dev, host, threads, pin, lo, hi, false, NULL, out, err);
}

int adamw_create_host_grads_on(kern_device *dev, host_mem *host, int threads, bool pin, size_t lo, size_t hi,
                               float *grads_host, adamw **out, acc_err *err)
{
    return create_host(dev, host, threads, pin, lo, hi, true, grads_host, out, err);
}

int adamw_create_host_on(kern_device *dev, host_mem *host, int threads, size_t lo, size_t hi, float *params_host,
                         float *grads_host, adamw **out, acc_err *err)
{
    *out = NULL;
    uint64_t bytes;
    int rc = adamw_state_bytes(lo, hi, &bytes, err);
    if (rc != 0)
        return rc;
    adamw *a = adamw_new((adamw){.dev = dev, .lo = lo, .hi = hi, .host = host, .threads = threads >= 1 ? threads : 1,
                                 .master = params_host, .g = grads_host, .master_aliased = true,
                                 .g_aliased = true});
    if (a == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory");
    size_t each = (hi - lo) * sizeof(float);
    if ((rc = host_mem_alloc(host, each, (void **)&a->m, err)) == 0)
        rc = host_mem_alloc(host, each, (void **)&a->v, err);
    if (rc != 0) {
        adamw_free(a);
        return rc;
    }
    *out = a;
    return 0;
}

void adamw_load_master(adamw *a, const float *params)
{
    if (a->master_aliased) /* the master copy is the parameters themselves */
        return;
    if (a->host != NULL && a->hi > a->lo)
        a->dev->ops->download(a->dev, a->master, params + a->lo, (a->hi - a->lo) * sizeof(float));
}

void adamw_set_store(adamw *a, adamw_store_fn fn, void *ctx)
{
    a->store = fn;
    a->store_ctx = ctx;
}

void adamw_moment_get(const adamw *a, int which, float *buf)
{
    const float *src = which == 0 ? a->m : a->v;
    size_t bytes = (a->hi - a->lo) * sizeof(float);
    if (bytes == 0)
        return;
    if (a->host != NULL)
        memcpy(buf, src, bytes);
    else
        a->dev->ops->download(a->dev, buf, src, bytes);
}

void adamw_moment_set(adamw *a, int which, const float *buf)
{
    float *dst = which == 0 ? a->m : a->v;
    size_t bytes = (a->hi - a->lo) * sizeof(float);
    if (bytes == 0)
        return;
    if (a->host != NULL)
        memcpy(dst, buf, bytes);
    else
        a->dev->ops->upload(a->dev, dst, buf, bytes);
}

void adamw_free(adamw *a)
{
    if (a == NULL)
        return;
    if (a->host != NULL) {
        size_t each = (a->hi - a->lo) * sizeof(float);
        if (a->pinned) {
            if (!a->g_aliased)
                a->dev->ops->host_unregister(a->dev, a->g);
            a->dev->ops->host_unregister(a->dev, a->master);
        }
        if (!a->g_aliased)
            host_mem_free(a->host, a->g, each);
        if (!a->master_aliased)
            host_mem_free(a->host, a->master, each);
        host_mem_free(a->host, a->v, each);
        host_mem_free(a->host, a->m, each);
        free(a);
        return;
    }
    if (a->v != NULL)
        a->dev->ops->free(a->dev, a->v);
    if (a->m != NULL)
        a->dev->ops->free(a->dev, a->m);
    free(a);
}

/* One run of the step: [lo, hi) (absolute, inside the range) with its decay. */
typedef void (*run_fn)(void *ctx, size_t lo, size_t hi, float wd);

/* Calls fn for each run of adjacent trainable tensors with the same
 * flags, clipped to the range, in layout order. */
static void for_each_run(const adamw *a, const model_layout *l, const spec_optim *o, run_fn fn, void *ctx)
{
    size_t off = 0, n = 0;
    int decays = 0;
    for (int i = 0; i <= l->n; i++) {
        const model_tensor *t = i < l->n ? &l->t[i] : NULL;
        if (t != NULL && !t->trains)
            continue;
        if (t != NULL && n > 0 && off + n == t->offset && decays == t->decays) {
            n += t->count;
            continue;
        }
        size_t lo = off > a->lo ? off : a->lo, hi = off + n < a->hi ? off + n : a->hi;
        if (n > 0 && lo < hi)
            fn(ctx, lo, hi, decays ? (float)o->weight_decay : 0.0f);
        if (t != NULL) {
            off = t->offset;
            n = t->count;
            decays = t->decays;
        }
    }
}

typedef struct step_args {
    adamw *a;
    float *params;
    const float *grads;
    float lr, grad_scale;
    const spec_optim *o;
    const model_layout *l;
    int id, nt;                /* host: this thread's chunk of each run, of nt */
} step_args;

/* The device kernel on one run. */
static void device_run(void *ctx, size_t lo, size_t hi, float wd)
{
    step_args *s = ctx;
    adamw *a = s->a;
    size_t k = lo - a->lo;
    a->dev->ops->adamw(a->dev, s->params + lo, s->grads + lo, a->m + k, a->v + k, hi - lo, s->lr,
                       (float)s->o->beta1, (float)s->o->beta2, (float)s->o->eps, wd, s->grad_scale, a->t);
}

/* Offloaded: this thread's chunk of one run on the host copies; chunks
 * start 4-aligned from the run's start, as the CPU kernel's threads and
 * lanes do (kern_cpu.h). */
static void host_run(void *ctx, size_t lo, size_t hi, float wd)
{
    step_args *s = ctx;
    adamw *a = s->a;
    size_t n = hi - lo, k = lo - a->lo, nt = (size_t)s->nt, id = (size_t)s->id;
    size_t clo = n * id / nt / 4 * 4, chi = id + 1 == nt ? n : n * (id + 1) / nt / 4 * 4;
    if (clo < chi)
        kern_cpu_adamw_span(a->master + k, a->g + k, a->m + k, a->v + k, clo, chi, s->lr, (float)s->o->beta1,
                            (float)s->o->beta2, (float)s->o->eps, wd, s->grad_scale, a->t);
}

static void *host_thread(void *arg)
{
    step_args *s = arg;
    /* layout read-only, chunks disjoint: no locking */
    for_each_run(s->a, s->l, s->o, host_run, s);
    return NULL;
}

#define HOST_MAX_THREADS 64 /* host AdamW threads at most (more are not started) */

/* Offloaded step: the range's gradients to the host, AdamW on `threads`
 * threads (the caller's is one of them; a thread that cannot be started
 * leaves its chunk to the caller), the master range back to the device. */
static void host_step(step_args *base)
{
    adamw *a = base->a;
    size_t bytes = (a->hi - a->lo) * sizeof(float);
    if (bytes == 0)
        return;
    if (!a->g_aliased) /* else the gradients were accumulated there */
        a->dev->ops->download(a->dev, a->g, base->grads + a->lo, bytes);
    int nt = a->threads;
    step_args args[HOST_MAX_THREADS];
    pthread_t th[HOST_MAX_THREADS];
    int started[HOST_MAX_THREADS] = {0};
    if (nt > HOST_MAX_THREADS)
        nt = HOST_MAX_THREADS;
    for (int i = 0; i < nt; i++) {
        args[i] = *base;
        args[i].id = i;
        args[i].nt = nt;
    }
    for (int i = 1; i < nt; i++)
        started[i] = pthread_create(&th[i], NULL, host_thread, &args[i]) == 0;
    host_thread(&args[0]);
    for (int i = 1; i < nt; i++) {
        if (started[i])
            pthread_join(th[i], NULL);
        else
            host_thread(&args[i]);
    }
    if (a->store != NULL) /* the gradients are spent now (zeroed before the next
                           * accumulation): the store's staging */
        a->store(a->store_ctx, a->master, a->lo, a->hi, a->g);
    else if (!a->master_aliased)
        a->dev->ops->upload(a->dev, base->params + a->lo, a->master, bytes);
}

void adamw_step(adamw *a, const model_layout *l, float *params, const float *grads, float lr,
                const spec_optim *o, float grad_scale)
{
    a->t++;
    step_args s = {.a = a, .params = params, .grads = grads, .lr = lr, .grad_scale = grad_scale, .o = o, .l = l,
                   .id = 0, .nt = 1};
    if (a->host != NULL)
        host_step(&s);
    else
        for_each_run(a, l, o, device_run, &s);
}
