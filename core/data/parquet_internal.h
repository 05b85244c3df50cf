/* parquet_internal: what parquet.c (footer, schema, rows) and
 * parquet_page.c (pages: decompression, levels, values) share. */
#ifndef ACC_PARQUET_INTERNAL_H
#define ACC_PARQUET_INTERNAL_H

#include <stdint.h>
#include <stdio.h>

#include "parquet.h"

/* Parquet's physical types and codecs, as the format numbers them */
enum { PQ_BOOLEAN = 0, PQ_INT32, PQ_INT64, PQ_INT96, PQ_FLOAT, PQ_DOUBLE, PQ_BYTE_ARRAY, PQ_FIXED };
enum { PQ_UNCOMPRESSED = 0, PQ_SNAPPY = 1, PQ_GZIP = 2, PQ_ZSTD = 6 };

/* one value of a page: a number or bytes pointing into a page buffer */
typedef struct pq_value {
    union {
        int64_t i;
        double d;
        struct {
            const uint8_t *p;
            uint32_t n;
        } s;
    };
} pq_value;

/* where one column chunk lies in the file (per row group and leaf) */
typedef struct pq_chunk {
    int64_t start, len;
    int codec;
} pq_chunk;

/* A primitive column and its reading state in the current row group. */
typedef struct pq_leaf {
    char path[PQ_MAX_NAME];  /* dotted, for messages */
    const char *field_name;  /* the struct field it fills (schema node's name) */
    int type, max_def, max_rep;
    int rg;                  /* row group being read (for messages) */
    /* the chunk: pages from pos to end */
    int64_t pos, end;
    int codec;
    /* the dictionary of this chunk */
    uint8_t *dict_buf;
    pq_value *dict;
    uint32_t ndict;
    /* the current data page */
    uint8_t *raw, *page, *hdr;
    size_t raw_cap, page_cap, hdr_cap;
    uint32_t *rep, *def;     /* levels of the page's n entries */
    pq_value *vals;          /* its non-null values */
    size_t lev_cap, vals_cap;
    uint32_t n, i;           /* entries in the page; the next entry */
    uint32_t nn, vi;         /* values in the page; the next value */
} pq_leaf;

/* The reader's file and names, for pages' reads and messages. */
typedef struct pq_file {
    int fd;
    const char *name, *field;
} pq_file;

/* ACC_EINVAL "<name>: row group <g>, column <path>: <what>" */
int pq_leaf_fail(const pq_file *f, const pq_leaf *l, acc_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Load the leaf's next data page (reading a dictionary page first where
 * one comes): 0, 1 when the chunk has no more pages, or an error. */
int pq_page_next(const pq_file *f, pq_leaf *l, acc_err *err);
/* Free the leaf's buffers. */
void pq_leaf_free(pq_leaf *l);
/* Drop the dictionary and page (a new chunk starts). */
void pq_leaf_reset(pq_leaf *l);

/* RLE / bit-packed hybrid: n values of `bw` bits from [p, p+len); -1 when
 * the data ends first or bw > 32. */
int pq_rle_decode(const uint8_t *p, size_t len, int bw, uint32_t *out, uint32_t n);

#endif
