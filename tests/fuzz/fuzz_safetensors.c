/* fuzz_safetensors: the safetensors reader (core/model/safetensors.c) on
 * any file: st_open validates the header, the tensor ranges and the
 * checksum; whatever it accepts is walked (every tensor, lookups by name
 * and metadata) and each tensor's bytes are read, so a range that passed
 * validation but lies outside the file shows under ASan. */
#include <stdint.h>

#include "fuzz_io.h"
#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[128];
    fuzz_write("in.safetensors", data, size, path, sizeof path);
    st_file *f = NULL;
    acc_err err = {0};
    if (st_open(path, &f, &err) != 0)
        return 0;
    volatile uint8_t sink = 0;
    int n = st_count(f);
    for (int i = 0; i < n; i++) {
        st_tensor t, u;
        if (st_at(f, i, &t) != 0)
            abort();
        if (st_dtype_size(t.dtype) == 0 || st_dtype_name(t.dtype) == NULL)
            abort();
        if (st_get(f, t.name, &u, &err) != 0 || u.data != t.data || u.nbytes != t.nbytes)
            abort(); /* a name st_at lists must be found by st_get, the same */
        const uint8_t *b = t.data;
        for (size_t k = 0; k < t.nbytes; k += 61)
            sink ^= b[k];
        if (t.nbytes > 0)
            sink ^= b[t.nbytes - 1];
    }
    st_tensor none;
    (void)st_get(f, "no.such.tensor", &none, &err);
    (void)st_get_meta(f, "format");
    (void)st_get_meta(f, "accumd.crc32");
    st_close(f);
    (void)sink;
    return 0;
}
