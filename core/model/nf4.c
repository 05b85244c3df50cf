/* nf4: see nf4.h. */
#include "nf4.h"

#include <math.h>
#include <string.h>

#include "checked.h"

const float nf4_values[NF4_MAP] = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};

/* The fp32 value nearest the exact midpoint of a and b (their sum is
 * exact in double). */
static float midpoint(float a, float b)
{
    return (float)(((double)a + (double)b) / 2.0);
}

uint8_t nf4_code(float v)
{
    uint8_t c = 0;
    for (int i = 0; i < NF4_MAP - 1; i++)
        c += midpoint(nf4_values[i], nf4_values[i + 1]) < v; /* NaN: never */
    return c;
}

uint8_t nf4_nearest(const float *map, int nmap, float v)
{
    int best = 0;
    double bd = fabs((double)v - (double)map[0]);
    for (int k = 1; k < nmap; k++) {
        double d = fabs((double)v - (double)map[k]);
        if (d < bd) { /* strictly: ties keep the lower index, NaN keeps 0 */
            bd = d;
            best = k;
        }
    }
    return (uint8_t)best;
}

void nf4_dynamic_map(float out[NF4_DYN_MAP])
{
    static const double scale[7] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
    float neg[127], pos[127];
    int n = 0;
    for (int i = 0; i < 7; i++) {
        int k = (1 << i) + 1; /* boundaries */
        for (int j = 0; j + 1 < k; j++) {
            float b0 = (float)(0.1 + 0.9 * (double)j / (double)(k - 1));
            float b1 = (float)(0.1 + 0.9 * (double)(j + 1) / (double)(k - 1));
            float v = (float)(scale[i] * (double)midpoint(b0, b1));
            pos[n] = v;
            neg[n] = -v;
            n++;
        }
    }
    /* ascending: the negatives from the largest magnitude, 0, the
     * positives from the smallest, 1 (each exponent's values are already
     * ascending and every exponent's lie above the previous one's) */
    int at = 0;
    for (int i = n - 1; i >= 0; i--)
        out[at++] = neg[i];
    out[at++] = 0.0f;
    for (int i = 0; i < n; i++)
        out[at++] = pos[i];
    out[at] = 1.0f;
}

nf4_sizes nf4_sizes_of(size_t n)
{
    nf4_sizes s = {.n = n};
    s.bytes = n / 2 + (n & 1);
    s.blocks = n / NF4_BLOCK + (n % NF4_BLOCK != 0);
    s.nested = s.blocks / NF4_NESTED_BLOCK + (s.blocks % NF4_NESTED_BLOCK != 0);
    return s;
}

void nf4_quantize(const float *x, size_t n, uint8_t *packed, float *absmax)
{
    nf4_sizes s = nf4_sizes_of(n);
    memset(packed, 0, s.bytes);
    for (size_t b = 0; b < s.blocks; b++) {
        size_t lo = b * NF4_BLOCK, hi = lo + NF4_BLOCK < n ? lo + NF4_BLOCK : n;
        float am = 0.0f;
        for (size_t i = lo; i < hi; i++)
            am = fabsf(x[i]) > am ? fabsf(x[i]) : am;
        absmax[b] = am;
        float r = 1.0f / am;
        /* a partial block is padded with zeros: an odd n's last low nibble */
        size_t end = hi + (hi & 1);
        for (size_t i = lo; i < end; i++) {
            float v = (i < n ? x[i] : 0.0f) * r;
            uint8_t c = nf4_code(v);
            packed[i / 2] |= (uint8_t)(i % 2 == 0 ? c << 4 : c);
        }
    }
}

void nf4_double_quant(const float *absmax, size_t nb, const float *map, uint8_t *qabsmax,
                      float *nested, float *offset)
{
    double sum = 0.0;
    for (size_t i = 0; i < nb; i++)
        sum += (double)absmax[i];
    float off = nb ? (float)(sum / (double)nb) : 0.0f;
    *offset = off;
    for (size_t b = 0; b * NF4_NESTED_BLOCK < nb; b++) {
        size_t lo = b * NF4_NESTED_BLOCK;
        size_t hi = lo + NF4_NESTED_BLOCK < nb ? lo + NF4_NESTED_BLOCK : nb;
        float am = 0.0f;
        for (size_t i = lo; i < hi; i++) {
            float v = absmax[i] - off;
            am = fabsf(v) > am ? fabsf(v) : am;
        }
        nested[b] = am;
        float r = 1.0f / am;
        for (size_t i = lo; i < hi; i++)
            qabsmax[i] = nf4_nearest(map, NF4_DYN_MAP, (absmax[i] - off) * r);
    }
}

void nf4_absmax_dequant(const uint8_t *qabsmax, size_t nb, const float *nested, const float *map,
                        float offset, float *absmax)
{
    for (size_t i = 0; i < nb; i++) {
        float v = map[qabsmax[i]] * nested[i / NF4_NESTED_BLOCK];
        absmax[i] = v + offset;
    }
}

void nf4_dequantize(const uint8_t *packed, const float *absmax, const float *map16, size_t n,
                    float *out)
{
    for (size_t i = 0; i < n; i++) {
        uint8_t c = i % 2 == 0 ? packed[i / 2] >> 4 : packed[i / 2] & 15;
        out[i] = map16[c] * absmax[i / NF4_BLOCK];
    }
}

/* at rounded up to 16 bytes, then `len` more; false on overflow. */
static bool place(size_t *at, size_t len, size_t *where)
{
    uint64_t a;
    if (acc_add_u64(*at, 15, &a))
        return false;
    a &= ~(uint64_t)15;
    *where = (size_t)a;
    if (acc_add_u64(a, len, &a) || a > SIZE_MAX)
        return false;
    *at = (size_t)a;
    return true;
}

bool nf4_region_of(size_t n, bool nested, nf4_region *r)
{
    nf4_sizes s = nf4_sizes_of(n);
    size_t at = 0;
    memset(r, 0, sizeof *r);
    r->nested = nested;
    bool ok = place(&at, s.bytes, &r->codes) && place(&at, NF4_MAP * sizeof(float), &r->map);
    if (ok && !nested) {
        uint64_t ab;
        ok = !acc_mul_u64(s.blocks, sizeof(float), &ab) && place(&at, (size_t)ab, &r->absmax);
    } else if (ok) {
        ok = place(&at, s.blocks, &r->qabsmax) &&
             place(&at, s.nested * sizeof(float), &r->nested_absmax) &&
             place(&at, NF4_DYN_MAP * sizeof(float), &r->nested_map);
    }
    uint64_t end;
    if (ok && (acc_add_u64(at, 15, &end) || end > SIZE_MAX))
        ok = false;
    r->bytes = ok ? (size_t)(end & ~(uint64_t)15) : 0;
    return ok;
}
