/* parquet: a streaming reader of Apache Parquet files, the format the
 * Hugging Face hub serves datasets in, producing each row as a JSON object
 * (the same record form as a JSONL line: records.h).
 *
 * Contract:
 *   - pq_open() takes a descriptor opened by the caller (through
 *     safepath.h's sp_open_file, as every data file) and owns it from then
 *     on (pq_close closes it, also when pq_open fails). It reads the footer
 *     and the schema only.
 *   - Rows are read row group by row group, page by page, with pread: the
 *     memory held is, per column read, one page as stored, one page
 *     decompressed, its levels and values, and the column's dictionary of
 *     the current row group -- never the file, never a whole row group.
 *     Every size read from the file (footer, schema, page headers, page
 *     sizes, value counts, string lengths, dictionary indices, level runs)
 *     is checked against the bytes that hold it and against the bounds
 *     PQ_MAX_* below before it is used.
 *   - Supported: data pages v1 and v2; PLAIN, PLAIN_DICTIONARY /
 *     RLE_DICTIONARY and RLE (booleans) values; RLE / bit-packed hybrid
 *     levels; UNCOMPRESSED, SNAPPY, GZIP and ZSTD. Top-level columns of
 *     these shapes, in JSON: a primitive (BOOLEAN -> true/false, INT32 /
 *     INT64 -> integer, FLOAT / DOUBLE -> number (NaN and infinities ->
 *     null), BYTE_ARRAY -> string, which must be UTF-8); a struct of
 *     primitives -> object; a list (3-level LIST, legacy 2-level, or a bare
 *     repeated field) of primitives or of structs of primitives -> array
 *     (so `messages: list<struct<role, content>>` is
 *     [{"role":..,"content":..}, ...]). A null anywhere is JSON null; an
 *     empty list is []. Columns of other shapes (maps, nested lists,
 *     INT96, fixed-length bytes) are left out of the rows;
 *     pq_column_unsupported() says why for a named one.
 *   - A damaged or unsupported file is ACC_EINVAL with `field` and the
 *     message "<name>: row group <g>, column <path>: <what>" (or
 *     "<name>: <what>" for the footer), never quoting the file's bytes.
 */
#ifndef ACC_PARQUET_H
#define ACC_PARQUET_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "err.h"

#define PQ_MAX_FOOTER ((uint32_t)64 << 20)      /* the footer's Thrift bytes */
#define PQ_MAX_PAGE ((uint32_t)256 << 20)       /* one page, stored or decompressed */
#define PQ_MAX_PAGE_VALUES ((uint32_t)1 << 22)  /* levels / values in one page */
#define PQ_MAX_SCHEMA 10000                     /* schema elements */
#define PQ_MAX_NAME 256                         /* a column's dotted path */

typedef struct pq_reader pq_reader;

/* Open `fd` (owned from now on). `name` names the file in messages
 * (its base name); `field` is the spec field ("data.train"). */
int pq_open(int fd, const char *name, const char *field, pq_reader **out, acc_err *err);
/* 1 when the first and last four bytes of `fd` are Parquet's magic "PAR1". */
bool pq_fd_is_parquet(int fd);

int64_t pq_num_rows(const pq_reader *r);
/* Whether top-level column `name` is one the reader assembles. */
bool pq_has_column(const pq_reader *r, const char *name);
/* Why top-level column `name` is left out, or NULL (read, or absent). */
const char *pq_column_unsupported(const pq_reader *r, const char *name);

/* Read only these top-level columns (NULL-terminated; names the file does
 * not have are ignored). Call before the first pq_next. */
void pq_select(pq_reader *r, const char *const *names);

/* The next row as a new JSON object: 0, or ACC_ENOTFOUND after the last
 * row, or an error (the reader is then unusable). */
int pq_next(pq_reader *r, json_t **row, acc_err *err);
/* Rows handed out so far. */
int64_t pq_rows_read(const pq_reader *r);

void pq_close(pq_reader *r);

#endif
