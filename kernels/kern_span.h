/* kern_span: a run of floats inside one buffer, the unit of a bucketed
 * all-reduce (kern_comm.h), and the shard arithmetic of the ZeRO
 * collectives (reduce-scatter, all-gather). Plain data and pure functions,
 * shared by the communicators and the optimizer (adamw_shard_lo). */
#ifndef ACC_KERN_SPAN_H
#define ACC_KERN_SPAN_H

#include <stddef.h>

/* `n` floats at offset `off` (in floats) of a buffer. */
typedef struct kern_span {
    size_t off, n;
} kern_span;

/* Most spans in one kern_comm_reduce_start (one NCCL group). */
#define KERN_COMM_MAX_SPANS 64

/* Rank r of w owns the elements [kern_shard_lo(n, r, w), kern_shard_lo(n, r + 1, w))
 * of a buffer's first n floats. Invariant: for w >= 1 the ranges of ranks
 * 0..w-1 are in order, disjoint and cover [0, n) exactly (lo(0) = 0,
 * lo(w) = n); each holds floor(n/w) or ceil(n/w) elements, the first n % w
 * ranks one more. No overflow for any n (no n * r product). */
static inline size_t kern_shard_lo(size_t n, int rank, int world)
{
    size_t w = (size_t)world, r = (size_t)rank;
    return r * (n / w) + (r < n % w ? r : n % w);
}

/* The parts of spans[0..ns) inside the element range [lo, hi), in span
 * order, empty parts left out, into out[0..ns): returns how many. */
static inline int kern_span_clip(const kern_span *sp, int ns, size_t lo, size_t hi, kern_span *out)
{
    int k = 0;
    for (int i = 0; i < ns; i++) {
        size_t a = sp[i].off > lo ? sp[i].off : lo;
        size_t b = sp[i].n > hi - sp[i].off || sp[i].off > hi ? hi : sp[i].off + sp[i].n;
        if (a < b)
            out[k++] = (kern_span){a, b - a};
    }
    return k;
}

#endif
