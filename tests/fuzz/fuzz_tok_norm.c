/* fuzz_tok_norm: random tokenizer normalizer chains (core/data/tok_text.c)
 * run on random text under the encoder's bounds (issue 25). The input is
 * read as a little program: each op byte picks a normalizer (Replace with a
 * string or a regex, Prepend, Strip, Lowercase, NFC / NFD / NFKC / NFKD)
 * whose strings are the next bytes; what is left is the text. The chain is
 * written as a tokenizer.json Sequence (so the loader's checks run too) in
 * front of a byte-level-free BPE with <unk>. Oracle, beyond the
 * sanitizers: encoding ends within a few times its time limit, with ids
 * or ACC_EINVAL naming "tokenizer" or "text" (a bound, never "internal");
 * an accepted encode's ids are inside the vocabulary. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "budget.h"
#include "tok.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { LIMIT_MS = 50, SLACK_MS = 2000, MAX_OPS = 48 };

/* The next length-prefixed string (length byte & 7) of the input. */
static json_t *next_str(const uint8_t **p, const uint8_t *end)
{
    size_t n = *p < end ? (size_t)(**p & 7) : 0;
    if (*p < end)
        (*p)++;
    if (n > (size_t)(end - *p))
        n = (size_t)(end - *p);
    json_t *s = json_stringn((const char *)*p, n); /* NULL when not UTF-8 */
    *p += n;
    return s != NULL ? s : json_string("a");
}

static json_t *normalizer(uint8_t op, const uint8_t **p, const uint8_t *end)
{
    static const char *const forms[] = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase"};
    switch (op % 6) {
    case 0: /* Replace String */
    case 1: { /* Replace Regex */
        json_t *pat = next_str(p, end);
        if (json_string_length(pat) == 0) {
            json_decref(pat);
            pat = json_string("a");
        }
        return json_pack("{s:s, s:{s:o}, s:o}", "type", "Replace", "pattern", op % 6 ? "Regex" : "String", pat,
                         "content", next_str(p, end));
    }
    case 2: return json_pack("{s:s, s:o}", "type", "Prepend", "prepend", next_str(p, end));
    case 3: return json_pack("{s:s, s:b, s:b}", "type", "Strip", "strip_left", op & 8, "strip_right", op & 16);
    default: return json_pack("{s:s}", "type", forms[(op >> 3) % 5]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *p = data, *end = data + size;
    size_t nops = size ? (size_t)(*p++ % MAX_OPS) : 0;
    json_t *chain = json_array();
    for (size_t i = 0; i < nops && p < end; i++) {
        uint8_t op = *p++;
        json_array_append_new(chain, normalizer(op, &p, end));
    }
    json_t *vocab = json_pack("{s:i, s:i, s:i, s:i, s:i}", "a", 0, "b", 1, "aa", 2, " ", 3, "<unk>", 4);
    json_t *tj = json_pack("{s:{s:s, s:o}, s:{s:s, s:o, s:[s], s:s, s:b}}", "normalizer", "type", "Sequence",
                           "normalizers", chain, "model", "type", "BPE", "vocab", vocab, "merges", "a a", "unk_token",
                           "<unk>", "fuse_unk", 1);
    char *js = tj != NULL ? json_dumps(tj, JSON_COMPACT) : NULL;
    json_decref(tj);
    if (js == NULL)
        return 0;
    acc_err err = {0};
    tok_tokenizer *t = NULL;
    if (tok_load_mem(js, strlen(js), NULL, 0, &t, &err) != 0) {
        free(js);
        if (err.code != ACC_EINVAL || err.msg[0] == '\0')
            abort(); /* a refused chain says why */
        return 0;
    }
    free(js);
    tok_encoder *e = NULL;
    if (tok_encoder_new(t, &e, &err) != 0)
        abort();
    tok_limits lim;
    tok_limits_default(&lim);
    lim.time_limit_ms = LIMIT_MS;
    lim.out_slack = 64u << 10;
    tok_encoder_set_limits(e, &lim);
    tok_ids ids = {0};
    int64_t t0 = budget_now_ns();
    int rc = tok_encode(e, (const char *)p, (size_t)(end - p), 0, &ids, &err);
    if ((budget_now_ns() - t0) / 1000000 > LIMIT_MS + SLACK_MS)
        abort(); /* the bounds did not stop it */
    if (rc == 0) {
        for (size_t i = 0; i < ids.n; i++)
            if (ids.v[i] < 0 || ids.v[i] >= tok_vocab_size(t))
                abort();
    } else if (rc != ACC_EINVAL || (strcmp(err.field, "tokenizer") != 0 && strcmp(err.field, "text") != 0)) {
        abort(); /* a bound is a 400 naming the tokenizer; bad UTF-8 names the text */
    }
    tok_ids_free(&ids);
    tok_encoder_free(e);
    tok_free(t);
    return 0;
}
