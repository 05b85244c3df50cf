/* batch_split: see batch_split.h. */
#include "batch_split.h"

int batch_split_make(int B, int m, int a, int w, int max_world, batch_split *out, acc_err *err)
{
    if (m < 1 || a < 1 || w < 1)
        return acc_err_set(err, ACC_EINVAL, "train_micro_batch_size_per_gpu",
                           "micro batch, accumulation steps and devices must be >= 1");
    if (max_world > 0 && w > max_world)
        return acc_err_set(err, ACC_EINVAL, "devices", "at most %d devices per job", max_world);
    long long prod = (long long)m * a * w; /* ints: no overflow in 64 bits */
    if (B < 1 || prod != B)
        return acc_err_set(err, ACC_EINVAL, "train_batch_size",
                           "train_batch_size %d != %d * %d * %d (micro * accum * world)", B, m, a,
                           w);
    *out = (batch_split){.B = B, .m = m, .a = a, .w = w};
    return 0;
}

int batch_split_with_micro(const batch_split *s, int m, batch_split *out)
{
    int per = batch_split_per_rank(s);
    if (m < 1 || per % m != 0)
        return -1;
    *out = (batch_split){.B = s->B, .m = m, .a = per / m, .w = s->w};
    return 0;
}

int batch_split_smaller_micro(const batch_split *s)
{
    int per = batch_split_per_rank(s);
    for (int d = s->m - 1; d >= 1; d--)
        if (per % d == 0)
            return d;
    return 0;
}

int batch_split_larger_micro(const batch_split *s)
{
    int per = batch_split_per_rank(s);
    for (int d = s->m + 1; d <= per; d++)
        if (per % d == 0)
            return d;
    return 0;
}

int batch_split_resolve(const batch_given *g, int w, int max_batch, batch_split *out, acc_err *err)
{
    long long B = g->B, m = g->m, a = g->a; /* ints: products fit in 64 bits */
    if (w < 1)
        return acc_err_set(err, ACC_EINVAL, "devices", "devices must be >= 1");
    if (B && m && a) {
        /* all three given: batch_split_make below checks B = m a w */
    } else if (B && m) {
        if (B % (m * w) != 0)
            return acc_err_set(err, ACC_EINVAL, "train_batch_size",
                               "train_batch_size %lld is not divisible by %lld * %d (micro * world)", B, m, w);
        a = B / (m * w);
    } else if (B && a) {
        if (B % (a * w) != 0)
            return acc_err_set(err, ACC_EINVAL, "train_batch_size",
                               "train_batch_size %lld is not divisible by %lld * %d (accum * world)", B, a, w);
        m = B / (a * w);
    } else if (B) {
        if (B % w != 0)
            return acc_err_set(err, ACC_EINVAL, "train_batch_size",
                               "train_batch_size %lld is not divisible by %d (world)", B, w);
        m = B / w;
        a = 1;
    } else if (m) {
        a = a ? a : 1;
        B = m * a * w;
    } else {
        return acc_err_set(err, ACC_EINVAL, "train_batch_size",
                           "give train_batch_size or train_micro_batch_size_per_gpu (any two of "
                           "train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps)");
    }
    if (B > max_batch)
        return acc_err_set(err, ACC_EINVAL, "train_batch_size", "train_batch_size %lld is over %d", B, max_batch);
    return batch_split_make((int)B, (int)m, (int)a, w, 0, out, err);
}
