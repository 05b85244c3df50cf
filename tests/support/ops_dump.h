/* ops_dump.h: the tensor writer shared by the ops dumpers
 * (llama_ops_dump.c, qwen3_gemma2_ops_dump.c): each tensor a raw
 * little-endian file DIR/NAME.f32 or NAME.i32 and a line "name dtype
 * dim..." in DIR/manifest.txt, read back by the PyTorch checks; plus the
 * seeded inputs. A dumper defines OPS_DUMP_PROG (its name, for messages)
 * before including this, sets `dir`, opens `manifest` and seeds `r`. */
#ifndef ACCUMD_OPS_DUMP_H
#define ACCUMD_OPS_DUMP_H

#include <stdio.h>
#include <stdlib.h>

#include "rng.h"

static FILE *manifest;
static const char *dir;
static rng r;

static void die(const char *what)
{
    fprintf(stderr, OPS_DUMP_PROG ": %s\n", what);
    exit(1);
}

/* name, element type, data, dims (0-terminated) */
static void dump(const char *name, const char *dtype, const void *data, const int *dims)
{
    size_t n = 1;
    fprintf(manifest, "%s %s", name, dtype);
    for (int i = 0; dims[i] != 0; i++) {
        n *= (size_t)dims[i];
        fprintf(manifest, " %d", dims[i]);
    }
    fprintf(manifest, "\n");
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.%s", dir, name, dtype);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(data, 4, n, f) != n || fclose(f) != 0)
        die(path);
}

#define DUMP(name, x, ...) dump(name, "f32", x, (const int[]){__VA_ARGS__, 0})
#define DUMPI(name, x, ...) dump(name, "i32", x, (const int[]){__VA_ARGS__, 0})

static float *randn(size_t n, double scale)
{
    float *x = malloc(n * sizeof *x);
    if (x == NULL)
        die("out of memory");
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(scale * rng_normal(&r));
    return x;
}

static float *zeros(size_t n)
{
    float *x = calloc(n, sizeof *x);
    if (x == NULL)
        die("out of memory");
    return x;
}

#endif
