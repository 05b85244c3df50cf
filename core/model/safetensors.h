/* safetensors: read and write the safetensors format.
 *
 * Layout: an 8-byte little-endian header length N, N bytes of JSON
 * ({"__metadata__": {str: str}, name: {"dtype", "shape", "data_offsets"}}),
 * then the raw little-endian tensor bytes; offsets are relative to the end of
 * the header. st_write() is atomic and durable (temp file, fsync, rename,
 * fsync of the directory) and records a CRC-32 of the data in the metadata
 * ("accumd.crc32"), which st_open() verifies, so a torn or corrupted file is
 * an error, never silently loaded. st_open() also checks that every tensor's
 * byte range matches its dtype and shape and that the ranges tile the data.
 * Files are mapped read-only (mmap), never copied: a tensor's data points
 * into the mapping, and st_release() drops its pages from memory once read,
 * so a model loads one tensor at a time. Files from elsewhere (Hugging Face)
 * carry no checksum; there is then nothing to verify. st_open_header()
 * reads and validates the header alone (no data, no checksum): what a
 * submit-time check needs. st_write_fill() streams tensors through a
 * caller's fill function one at a time (any dtype, no whole-model buffer).
 */
#ifndef ACC_SAFETENSORS_H
#define ACC_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

#define ST_MAX_DIMS 8

/* ST_NF4: a storage dtype of the model's weight store
 * only (4-bit NormalFloat, nf4.h), never a file's; st_dtype_size is 0. */
typedef enum st_dtype { ST_F32 = 0, ST_BF16, ST_F16, ST_F64, ST_I32, ST_I64, ST_U8, ST_U16, ST_NF4 } st_dtype;

typedef struct st_tensor {
    const char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;   /* write: source; read: points into the open file
                         * (NULL when opened header only) */
    size_t nbytes;
    size_t offset;      /* read: byte offset from the start of the data */
} st_tensor;

typedef struct st_meta {
    const char *key, *value;
} st_meta;

/* Write `n` tensors and `nmeta` metadata pairs to `path`. */
int st_write(const char *path, const st_tensor *t, int n, const st_meta *meta, int nmeta,
             acc_err *err);

typedef struct st_file st_file;

/* Open and validate (header, ranges, checksum when present, and every
 * F32 / BF16 / F16 value finite: a NaN or Inf is ACC_EINVAL naming the
 * tensor and the element). The header-only opens read no data and check
 * neither. */
int st_open(const char *path, st_file **out, acc_err *err);
/* The same, reading the file behind `fd` (left open; e.g. one safepath.h
 * checked); `name` is what messages call it. */
int st_open_fd(int fd, const char *name, st_file **out, acc_err *err);
void st_close(st_file *f);

/* Header only: tensors have names, dtypes, shapes and offsets, data NULL. */
int st_open_header(const char *path, st_file **out, acc_err *err);
/* The same through `fd` (left open), like st_open_fd. */
int st_open_header_fd(int fd, const char *name, st_file **out, acc_err *err);

/* Look up a tensor by name; ACC_ENOTFOUND when absent. */
int st_get(const st_file *f, const char *name, st_tensor *out, acc_err *err);

/* Metadata value or NULL. */
const char *st_get_meta(const st_file *f, const char *key);

int st_count(const st_file *f);
/* i-th tensor in file order (by data offset). */
int st_at(const st_file *f, int i, st_tensor *out);

/* Convert a tensor (F32, BF16 or F16) to `count` floats; ACC_EINVAL naming
 * the tensor for another dtype or a count that is not its element count. */
int st_to_f32(const st_tensor *t, float *dst, size_t count, acc_err *err);
/* The inverse for writing: `count` floats as F32, BF16 (round to nearest
 * even) or F16 (round to nearest even, overflow to inf) into dst. */
int st_from_f32(st_dtype d, const float *src, size_t count, void *dst, acc_err *err);
/* Drop a read tensor's pages from memory (the file is still mapped). */
void st_release(const st_file *f, const st_tensor *t);

/* Write `n` tensors (data ignored: fill(ctx, i, buf, err) writes tensor
 * i's t[i].nbytes bytes into buf) with a CRC like st_write, atomically;
 * one tensor's staging buffer at a time. */
typedef int (*st_fill_fn)(void *ctx, int i, void *buf, acc_err *err);
int st_write_fill(const char *path, const st_tensor *t, int n, const st_meta *meta, int nmeta,
                  st_fill_fn fill, void *ctx, acc_err *err);

size_t st_dtype_size(st_dtype d);
const char *st_dtype_name(st_dtype d);

#endif
