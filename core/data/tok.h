/* tok: Hugging Face tokenizers (tokenizer.json) in C.
 *
 * Contract: for the component types listed below, tok_encode() returns the
 * ids that Hugging Face's `tokenizers` library returns for the same
 * tokenizer.json and text (encode with add_special_tokens as `flags` says),
 * and tok_decode() its decode(). A tokenizer.json using any other component
 * type, or an option of a known type that is not implemented, is refused at
 * load with ACC_EINVAL naming the component ("pre_tokenizer.pretokenizers[1]
 * .type: Punctuation is not supported") -- never approximated.
 *
 * The pipeline, as Hugging Face runs it:
 *   1. added tokens (special or not) are cut out of the raw text first,
 *      leftmost-longest (lstrip / rstrip / single_word honoured);
 *   2. each remaining piece: normalizer (NFC, NFD, NFKC, NFKD, Lowercase,
 *      Prepend, Replace, Strip, Sequence), pre-tokenizer (Split with a
 *      PCRE2 regex or a string and every behaviour, ByteLevel, Metaspace,
 *      Digits, WhitespaceSplit, Sequence), then the BPE model per word
 *      (merges by rank with a heap, byte_fallback, unk + fuse_unk,
 *      ignore_merges);
 *   3. with TOK_ADD_SPECIAL, the post-processor (TemplateProcessing,
 *      ByteLevel, Sequence) adds its special tokens.
 * Decoders: ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip,
 * Sequence.
 *
 * tokenizer_config.json (optional) adds bos / eos / pad tokens,
 * add_bos_token / add_eos_token and the chat template (the Jinja source).
 *
 * Threads: a loaded tok_tokenizer is read-only; each thread encodes through
 * its own tok_encoder (regex match data, a word cache, buffers), so
 * tokenizing runs on all cores without locks.
 */
#ifndef ACC_TOK_H
#define ACC_TOK_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

typedef struct tok_tokenizer tok_tokenizer;
typedef struct tok_encoder tok_encoder;

/* A growable array of token ids. */
typedef struct tok_ids {
    int32_t *v;
    size_t n, cap;
} tok_ids;

enum { TOK_ADD_SPECIAL = 1 };

/* tokenizer.json and tokenizer_config.json as read from a directory. */
typedef struct tok_files {
    char *json;          /* tokenizer.json */
    size_t json_len;
    char *config;        /* tokenizer_config.json; NULL when the directory has none */
    size_t config_len;
} tok_files;
#define TOK_FILE_MAX ((size_t)256 << 20)

/* Read DIR/tokenizer.json and DIR/tokenizer_config.json: the directory is
 * opened under `roots` and each file in it through safepath.h (regular
 * files only, without blocking; a symlink only to a target under the
 * roots; "" = no roots), read through that descriptor. Errors are
 * ACC_EINVAL naming `field` and the file as DIR/NAME, never its bytes. */
int tok_files_read(const char *roots, const char *dir, const char *field, tok_files *out, acc_err *err);
void tok_files_free(tok_files *f);
/* A tokenizer from the files read; `dir` names them in messages. A file
 * that is not JSON is reported with its line and column only. Errors
 * name the JSON path of what is wrong or unsupported. */
int tok_load_files(const tok_files *f, const char *dir, tok_tokenizer **out, acc_err *err);
/* tok_files_read + tok_load_files: the tokenizer of a spec's directory. */
int tok_load_under(const char *roots, const char *dir, const char *field, tok_tokenizer **out,
                   acc_err *err);
/* The same from memory (config_json may be NULL). */
int tok_load_mem(const char *tokenizer_json, size_t len, const char *config_json,
                 size_t config_len, tok_tokenizer **out, acc_err *err);
/* tok_load_under without roots (tools and tests). */
int tok_load_dir(const char *dir, tok_tokenizer **out, acc_err *err);
void tok_free(tok_tokenizer *t);

/* Rows of the vocabulary (1 + the largest id, added tokens included). */
int tok_vocab_size(const tok_tokenizer *t);
/* The token string of `id` (NULL when out of range), its byte length in *len. */
const char *tok_id_to_token(const tok_tokenizer *t, int32_t id, size_t *len);
/* The id of a token string (vocabulary or added tokens), -1 when none. */
int32_t tok_token_to_id(const tok_tokenizer *t, const char *s, size_t len);
/* Whether `id` is a special added token. */
int tok_is_special(const tok_tokenizer *t, int32_t id);

/* tokenizer_config.json's view: ids -1 when not set; template NULL if none. */
typedef struct tok_config {
    int32_t bos_id, eos_id, pad_id, unk_id;
    int add_bos, add_eos;          /* add_bos_token / add_eos_token (0 when absent) */
    const char *chat_template;     /* the Jinja source ("default" one of a list) */
    const char *bos_token, *eos_token; /* their strings ("" when not set) */
} tok_config;
const tok_config *tok_get_config(const tok_tokenizer *t);

int tok_encoder_new(const tok_tokenizer *t, tok_encoder **out, acc_err *err);
void tok_encoder_free(tok_encoder *e);

/* Bounds of encoding untrusted text with an untrusted tokenizer
 * (docs/data.md "Limits on untrusted input"). An encoder starts with
 * tok_limits_default()'s. Past a bound tok_encode() stops with ACC_EINVAL
 * naming the field "tokenizer" and the limit -- never ACC_EINTERNAL:
 *   - time: one tok_encode() (or one chat_encode(), renders included)
 *     takes at most time_limit_ms, checked between regex matches,
 *     normalizer steps and words (0 = no time bound);
 *   - each PCRE2 match runs with match_limit and depth_limit (a pattern
 *     that backtracks without end hits them) and a 64 MiB heap limit;
 *   - the normalized text stays within out_factor x the input + out_slack
 *     bytes (a chain of Replace "a" -> "aa" stops there). */
typedef struct tok_limits {
    long time_limit_ms;   /* default 2000 */
    uint32_t match_limit; /* default 1,000,000 */
    uint32_t depth_limit; /* default 100,000 */
    size_t out_factor;    /* default 64 */
    size_t out_slack;     /* default 1 MiB */
} tok_limits;
void tok_limits_default(tok_limits *l);
void tok_encoder_set_limits(tok_encoder *e, const tok_limits *l);
/* The time bound of an encode spanning several calls (chat.h renders and
 * tokenizes under one): begin arms a deadline time_limit_ms from now unless
 * one is armed already and returns what end restores. */
int64_t tok_encoder_begin(tok_encoder *e);
void tok_encoder_end(tok_encoder *e, int64_t saved);
/* The deadline armed (CLOCK_MONOTONIC ns, 0 = none) and the limit it came from. */
int64_t tok_encoder_deadline(const tok_encoder *e);
long tok_encoder_time_limit_ms(const tok_encoder *e);

/* Append the ids of text[0..len) to *out. ACC_EINVAL for text that is not
 * UTF-8 (naming the byte offset), ACC_ENOMEM. */
int tok_encode(tok_encoder *e, const char *text, size_t len, int flags, tok_ids *out,
               acc_err *err);

/* The text of ids (malloc'd, NUL-terminated, length in *len). Invalid UTF-8
 * from byte-level pieces becomes U+FFFD, as Hugging Face does.
 * skip_special: leave special added tokens out. */
int tok_decode(const tok_tokenizer *t, const int32_t *ids, size_t n, int skip_special, char **out,
               size_t *len, acc_err *err);

int tok_ids_push(tok_ids *a, int32_t id);
void tok_ids_free(tok_ids *a);

#endif
