/* adamw: see adamw.h. */
#include "adamw.h"

#include <stdlib.h>

#include "checked.h"

int adamw_state_bytes(size_t lo, size_t hi, uint64_t *bytes, acc_err *err)
{
    if (hi < lo || acc_mul_u64(hi - lo, 2 * sizeof(float), bytes))
        return acc_err_set(err, ACC_EINVAL, "model", "the optimizer state overflows 64-bit sizes");
    return 0;
}

int adamw_create(kern_device *dev, size_t lo, size_t hi, adamw **out, acc_err *err)
{
    *out = NULL;
    uint64_t bytes;
    int rc = adamw_state_bytes(lo, hi, &bytes, err);
    if (rc != 0)
        return rc;
    adamw *a = calloc(1, sizeof *a);
    if (a == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory");
    a->dev = dev;
    a->lo = lo;
    a->hi = hi;
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

void adamw_free(adamw *a)
{
    if (a == NULL)
        return;
    if (a->v != NULL)
        a->dev->ops->free(a->dev, a->v);
    if (a->m != NULL)
        a->dev->ops->free(a->dev, a->m);
    free(a);
}

/* The kernel on [off, off + n) (absolute), clipped to the range. */
static void run(adamw *a, float *params, const float *grads, size_t off, size_t n, float lr,
                const spec_optim *o, float wd, float grad_scale)
{
    size_t lo = off > a->lo ? off : a->lo, hi = off + n < a->hi ? off + n : a->hi;
    if (lo >= hi)
        return;
    size_t s = lo - a->lo;
    a->dev->ops->adamw(a->dev, params + lo, grads + lo, a->m + s, a->v + s, hi - lo, lr,
                       (float)o->beta1, (float)o->beta2, (float)o->eps, wd, grad_scale, a->t);
}

void adamw_step(adamw *a, const model_layout *l, float *params, const float *grads, float lr,
                const spec_optim *o, float grad_scale)
{
    a->t++;
    size_t off = 0, n = 0;
    int decays = 0;
    for (int i = 0; i < l->n; i++) {
        const model_tensor *t = &l->t[i];
        if (!t->trains)
            continue;
        if (n > 0 && off + n == t->offset && decays == t->decays) {
            n += t->count;
            continue;
        }
        if (n > 0)
            run(a, params, grads, off, n, lr, o, decays ? (float)o->weight_decay : 0.0f,
                grad_scale);
        off = t->offset;
        n = t->count;
        decays = t->decays;
    }
    if (n > 0)
        run(a, params, grads, off, n, lr, o, decays ? (float)o->weight_decay : 0.0f, grad_scale);
}
