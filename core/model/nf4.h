/* nf4: 4-bit NormalFloat weights in bitsandbytes' layout (QLoRA's frozen
 * base), quantized and dequantized on the host, byte for byte.
 *
 * Codes. A weight of n values is flattened row-major and cut into blocks
 * of NF4_BLOCK (64); the last block may be partial. Each block keeps its
 * absmax (largest |x|, fp32); each value is multiplied by the fp32
 * reciprocal of its block's absmax and coded as the number of the 15
 * midpoints of the 16 NF4 values (nf4_values, ascending) that lie strictly
 * below it: a value exactly on a midpoint takes the lower code; the
 * midpoints are the fp32 values nearest the exact ones. Two codes a byte,
 * the element at the even index in the high nibble; an odd n's last byte
 * codes a 0.0 in its low nibble (bitsandbytes pads a partial block with
 * zeros). An all-zero block scales its values to NaN (0 times the
 * reciprocal of 0), which no midpoint lies below: code 0, dequantized to
 * -1 x 0.
 *
 * Double quantization (bnb_4bit_use_double_quant). The absmax values minus
 * their mean (the offset: the sum in double, left to right, divided by
 * their count, rounded to fp32; the subtraction in fp32) are coded in
 * blocks of NF4_NESTED_BLOCK (256) on the signed 8-bit dynamic map
 * (nf4_dynamic_map) the same way, but to the NEAREST map value (ties to the
 * lower index; a NaN, from an all-zero nested block, to index 0), with an
 * fp32 absmax per nested block. Dequantized: absmax = map[code] x
 * nested_absmax + offset, weight = nf4[code] x absmax, each product and
 * sum one fp32 operation (what the device op dequant_nf4 computes).
 *
 * Sizes. nf4_sizes gives the element counts of each part for n values;
 * nf4_region lays them out in one byte range of the weight store (each
 * part 16-byte aligned), the same on every backend.
 */
#ifndef ACC_NF4_H
#define ACC_NF4_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define NF4_BLOCK 64
#define NF4_NESTED_BLOCK 256
#define NF4_MAP 16
#define NF4_DYN_MAP 256

/* The 16 NF4 values, ascending (bitsandbytes' quant_map). */
extern const float nf4_values[NF4_MAP];

/* The signed 8-bit dynamic map (256 values, ascending: 127 negative, 0,
 * 127 positive, 1): for exponents i = 0..6, 2^i + 1 boundaries linspace(0.1,
 * 1) (fp32 of the exact value), their 2^i fp32 midpoints, each times
 * 10^(i-6) (fp32 of the double product), both signs; plus 0 and 1. */
void nf4_dynamic_map(float out[NF4_DYN_MAP]);

/* The NF4 code of a scaled value v (the midpoints' rule above). */
uint8_t nf4_code(float v);
/* The index of map[nmap] (ascending or not) nearest v, ties to the lower
 * index; NaN: 0. */
uint8_t nf4_nearest(const float *map, int nmap, float v);

typedef struct nf4_sizes {
    size_t n;        /* values */
    size_t bytes;    /* packed codes: (n + 1) / 2 */
    size_t blocks;   /* absmax values: ceil(n / 64) */
    size_t nested;   /* nested absmax values: ceil(blocks / 256) */
} nf4_sizes;
nf4_sizes nf4_sizes_of(size_t n);

/* x[n] -> packed[(n+1)/2], absmax[blocks] (fp32). */
void nf4_quantize(const float *x, size_t n, uint8_t *packed, float *absmax);
/* absmax[nb] -> qabsmax[nb] codes on map[256], nested[ceil(nb/256)], *offset. */
void nf4_double_quant(const float *absmax, size_t nb, const float *map, uint8_t *qabsmax,
                      float *nested, float *offset);
/* The inverse of nf4_double_quant: absmax[nb]. */
void nf4_absmax_dequant(const uint8_t *qabsmax, size_t nb, const float *nested, const float *map,
                        float offset, float *absmax);
/* packed codes with absmax[blocks] on the 16-value map -> out[n]. */
void nf4_dequantize(const uint8_t *packed, const float *absmax, const float *map16, size_t n,
                    float *out);

/* One quantized tensor's parts in a byte range of the weight store
 * (offsets from its start). nested: double quantization (qabsmax codes,
 * nested absmax and map); else an fp32 absmax per block. */
typedef struct nf4_region {
    bool nested;
    size_t codes, map, absmax, qabsmax, nested_absmax, nested_map;
    size_t bytes; /* the whole region */
} nf4_region;
/* The region of n values; false when a size overflows. */
bool nf4_region_of(size_t n, bool nested, nf4_region *r);

#endif
