/* fuzz_parquet: the Parquet reader (core/data/parquet.c) on any file.
 * Oracle, beyond the sanitizers: every row is a JSON object; a refusal is
 * ACC_EINVAL (or ACC_ENOMEM) whose message starts with the file's name
 * ("f.parquet: "), never anything else; the rows handed out never exceed
 * the footer's count. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "parquet.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_err(int rc, const acc_err *err)
{
    if ((rc != ACC_EINVAL && rc != ACC_ENOMEM) || (rc == ACC_EINVAL && strncmp(err->msg, "f.parquet: ", 11) != 0))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd = memfd_create("f.parquet", MFD_CLOEXEC);
    if (fd < 0)
        return 0;
    if (size > 0 && write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    pq_reader *r;
    acc_err err = {0};
    int rc = pq_open(fd, "f.parquet", "data.train", &r, &err);
    if (rc != 0) {
        check_err(rc, &err);
        return 0;
    }
    /* half the inputs read every column, half the columns a record reads */
    static const char *const record_cols[] = {"messages", "conversations", "prompt", "completion", "text", NULL};
    (void)pq_column_unsupported(r, "messages");
    if (size % 2)
        pq_select(r, record_cols);
    json_t *row;
    for (int n = 0; n < 100000 && (rc = pq_next(r, &row, &err)) == 0; n++) {
        if (!json_is_object(row))
            abort();
        json_decref(row);
    }
    if (rc != 0 && rc != ACC_ENOTFOUND)
        check_err(rc, &err);
    if (pq_rows_read(r) > pq_num_rows(r))
        abort();
    pq_close(r);
    return 0;
}
