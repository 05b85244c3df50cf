/* fuzz_records: the JSONL sample reader (core/data/records.c) on any line,
 * in each format. Oracle, beyond the sanitizers: a refusal is ACC_EINVAL
 * whose message starts with the place ("f.jsonl:7: "); an accepted record
 * has messages with valid roles and contents inside its JSON. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "records.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    for (int f = REC_CHAT; f <= REC_TEXT_LINES; f++) {
        rec_record r;
        acc_err err = {0};
        int rc = rec_parse((rec_format)f, (const char *)data, size, "f.jsonl:7", "data.train", &r, &err);
        if (rc == 0) {
            if (r.root == NULL || r.nmsg < 1)
                abort();
            for (int i = 0; i < r.nmsg; i++)
                if ((int)r.msg[i].role < REC_SYSTEM || (int)r.msg[i].role > REC_ASSISTANT || r.msg[i].content == NULL)
                    abort();
            rec_clear(&r);
        } else if (rc != ACC_ENOTFOUND && (rc != ACC_EINVAL || strncmp(err.msg, "f.jsonl:7: ", 11) != 0)) {
            abort();
        }
    }
    return 0;
}
