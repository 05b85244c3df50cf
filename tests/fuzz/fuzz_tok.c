/* fuzz_tok: the tokenizer.json reader (core/data/tok.c) on any bytes, and
 * what an accepted tokenizer does with text: encode a few fixed strings
 * (with and without special tokens) and decode the ids back. Oracle,
 * beyond the sanitizers: a refusal is ACC_EINVAL with a message; every id
 * an accepted tokenizer produces is inside its vocabulary. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const texts[] = {
    "", "hello world", "  two  spaces\tand\ttabs\r\n", "<s>special</s><|im_start|>", "日本語 🙂 e\xcc\x81",
    "12345 it's", "\xef\xbb\xbf" "bom",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    acc_err err = {0};
    tok_tokenizer *t = NULL;
    if (tok_load_mem((const char *)data, size, NULL, 0, &t, &err) != 0) {
        if (err.code == 0 || err.msg[0] == '\0')
            abort(); /* a refusal says why */
        return 0;
    }
    tok_encoder *e = NULL;
    if (tok_encoder_new(t, &e, &err) == 0) {
        for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
            for (int flags = 0; flags <= TOK_ADD_SPECIAL; flags += TOK_ADD_SPECIAL) {
                tok_ids ids = {0};
                if (tok_encode(e, texts[i], strlen(texts[i]), flags, &ids, &err) == 0) {
                    for (size_t k = 0; k < ids.n; k++)
                        if (ids.v[k] < 0 || ids.v[k] >= tok_vocab_size(t))
                            abort();
                    char *s = NULL;
                    size_t n = 0;
                    if (tok_decode(t, ids.v, ids.n, 0, &s, &n, &err) == 0)
                        free(s);
                }
                tok_ids_free(&ids);
            }
        }
        tok_encoder_free(e);
    }
    tok_free(t);
    return 0;
}
