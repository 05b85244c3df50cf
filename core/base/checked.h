/* checked: overflow-checked size arithmetic on uint64_t.
 *
 * Every size computed from user numbers (a spec's shape, batch and sequence
 * length; a config.json's widths) goes through these, so that a product
 * past 2^64 is seen instead of wrapping to a small number that "fits".
 *   acc_mul_u64 / acc_add_u64: 0 and *out = the exact result, or 1 (*out
 *     then holds UINT64_MAX) when it does not fit in 64 bits;
 *   acc_sat_mul_u64 / acc_sat_add_u64: the result, saturated at UINT64_MAX.
 * Saturation is sticky (UINT64_MAX * x and UINT64_MAX + x stay UINT64_MAX
 * for x != 0), so a chain of saturating steps ends at UINT64_MAX exactly
 * when some step overflowed -- or the true value is UINT64_MAX, which no
 * budget can hold either. Callers that must name a field test the result
 * against ACC_SIZE_OVERFLOW.
 */
#ifndef ACC_CHECKED_H
#define ACC_CHECKED_H

#include <stdint.h>

#define ACC_SIZE_OVERFLOW UINT64_MAX

static inline int acc_mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    if (__builtin_mul_overflow(a, b, out)) {
        *out = UINT64_MAX;
        return 1;
    }
    return 0;
}

static inline int acc_add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    if (__builtin_add_overflow(a, b, out)) {
        *out = UINT64_MAX;
        return 1;
    }
    return 0;
}

static inline uint64_t acc_sat_mul_u64(uint64_t a, uint64_t b)
{
    uint64_t r;
    return acc_mul_u64(a, b, &r) ? UINT64_MAX : r;
}

static inline uint64_t acc_sat_add_u64(uint64_t a, uint64_t b)
{
    uint64_t r;
    return acc_add_u64(a, b, &r) ? UINT64_MAX : r;
}

/* a * b * c, saturated */
static inline uint64_t acc_sat_mul3_u64(uint64_t a, uint64_t b, uint64_t c)
{
    return acc_sat_mul_u64(acc_sat_mul_u64(a, b), c);
}

/* x rounded up to a multiple of `to` (> 0), saturated */
static inline uint64_t acc_sat_round_up_u64(uint64_t x, uint64_t to)
{
    uint64_t r = x % to;
    return r == 0 ? x : acc_sat_add_u64(x, to - r);
}

#endif
