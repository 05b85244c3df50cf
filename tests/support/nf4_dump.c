/* nf4_dump: accumd's NF4 quantization of a raw fp32 file, for the
 * independent reference in nf4_check.py.
 *
 * Usage: nf4_dump IN OUT
 * IN: n little-endian fp32 values. OUT: the concatenation of
 *   u64 n, packed codes [(n+1)/2], fp32 absmax [blocks],
 *   u8 qabsmax [blocks], fp32 nested absmax [nested], fp32 offset,
 *   fp32 dynamic map [256], fp32 dequantized values [n] (from the double
 *   quantized absmax), fp32 dequantized values [n] (from the fp32 absmax).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "nf4.h"

static int put(FILE *f, const void *p, size_t size, size_t n)
{
    return n == 0 || fwrite(p, size, n, f) == n ? 0 : -1;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: nf4_dump IN OUT\n");
        return 2;
    }
    FILE *in = fopen(argv[1], "rb");
    if (in == NULL || fseek(in, 0, SEEK_END) != 0)
        return perror(argv[1]), 1;
    long len = ftell(in);
    rewind(in);
    size_t n = (size_t)len / sizeof(float);
    nf4_sizes s = nf4_sizes_of(n);
    float *x = malloc((n + 1) * sizeof *x), *am = malloc((s.blocks + 1) * sizeof *am);
    float *am2 = malloc((s.blocks + 1) * sizeof *am2), *nest = malloc((s.nested + 1) * sizeof *nest);
    float *dq = malloc((n + 1) * sizeof *dq), *dq32 = malloc((n + 1) * sizeof *dq32);
    uint8_t *packed = malloc(s.bytes + 1), *qam = malloc(s.blocks + 1);
    float map[NF4_DYN_MAP], off;
    if (!x || !am || !am2 || !nest || !dq || !dq32 || !packed || !qam ||
        fread(x, sizeof *x, n, in) != n)
        return fprintf(stderr, "nf4_dump: cannot read %s\n", argv[1]), 1;
    fclose(in);
    nf4_dynamic_map(map);
    nf4_quantize(x, n, packed, am);
    nf4_double_quant(am, s.blocks, map, qam, nest, &off);
    nf4_absmax_dequant(qam, s.blocks, nest, map, off, am2);
    nf4_dequantize(packed, am2, nf4_values, n, dq);
    nf4_dequantize(packed, am, nf4_values, n, dq32);
    FILE *out = fopen(argv[2], "wb");
    uint64_t n64 = n;
    if (out == NULL || put(out, &n64, 8, 1) || put(out, packed, 1, s.bytes) ||
        put(out, am, 4, s.blocks) || put(out, qam, 1, s.blocks) || put(out, nest, 4, s.nested) ||
        put(out, &off, 4, 1) || put(out, map, 4, NF4_DYN_MAP) || put(out, dq, 4, n) ||
        put(out, dq32, 4, n) || fclose(out) != 0)
        return fprintf(stderr, "nf4_dump: cannot write %s\n", argv[2]), 1;
    free(x), free(am), free(am2), free(nest), free(dq), free(dq32), free(packed), free(qam);
    return 0;
}
