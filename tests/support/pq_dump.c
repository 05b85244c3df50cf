/* pq_dump FILE [COLUMN...]: every row of a Parquet file as one JSON line
 * (keys sorted, compact), read through core/data/parquet.h -- for
 * tests/parquet/test_parquet_ref.sh, which compares the lines with what the
 * independent writer was given. With COLUMNs, only those are read. On a
 * damaged file: the error on stderr, exit 1. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "parquet.h"

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: pq_dump FILE [COLUMN...]\n");
        return 2;
    }
    int fd = open(argv[1], O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        perror(argv[1]);
        return 1;
    }
    const char *slash = strrchr(argv[1], '/');
    pq_reader *r;
    acc_err err = {0};
    if (pq_open(fd, slash ? slash + 1 : argv[1], "data.train", &r, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    if (argc > 2)
        pq_select(r, (const char *const *)argv + 2);
    json_t *row;
    int rc;
    while ((rc = pq_next(r, &row, &err)) == 0) {
        char *s = json_dumps(row, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENSURE_ASCII | JSON_REAL_PRECISION(17));
        json_decref(row);
        if (s == NULL) {
            fprintf(stderr, "out of memory\n");
            pq_close(r);
            return 1;
        }
        puts(s);
        free(s);
    }
    int ok = rc == ACC_ENOTFOUND && pq_rows_read(r) == pq_num_rows(r);
    if (rc != ACC_ENOTFOUND)
        fprintf(stderr, "%s\n", err.msg);
    else if (!ok)
        fprintf(stderr, "%lld rows read, the footer says %lld\n", (long long)pq_rows_read(r),
                (long long)pq_num_rows(r));
    pq_close(r);
    return ok ? 0 : 1;
}
