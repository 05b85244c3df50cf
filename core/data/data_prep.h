/* data_prep: the JSONL data formats (chat, prompt_completion, text_jsonl)
 * tokenized once into samples of token ids and a loss mask, cached.
 *
 * Contract:
 *   - data.train / data.val name a file, a glob (wildcard in the file
 *     name) or a list of them (newline-separated in the spec, a JSON list
 *     as submitted): the files in the list's order, each glob's matches
 *     sorted by name (strcmp). Each is JSONL, plain text lines
 *     (text_lines) or Parquet (by its PAR1 magic, whatever its name): a
 *     Parquet file's rows are the records (parquet.h; only the columns a
 *     record reads), streamed and tokenized PREP_PARQUET_CHUNK bytes of
 *     JSON at a time; messages name "file:row".
 *   - prep_validate() is the submit-time check, cheap and bounded: it loads
 *     the tokenizer (data.tokenizer), the chat template (data.chat_template),
 *     and parses the first PREP_CHECK_LINES lines (at most PREP_CHECK_BYTES)
 *     of data.train and data.val with records.h, rendering the first few.
 *     Every problem is ACC_EINVAL naming the field and, for the data,
 *     "file:line". It opens user paths: call it off the loop thread.
 *   - Every file is opened under spec->data_roots through safepath.h and
 *     read through that descriptor: data.train / data.val (sp_open_file)
 *     and the tokenizer directory's files (tok_files_read); a FIFO or
 *     other special file is refused without blocking, a symlink out of the
 *     roots refused, and no message quotes a file's bytes.
 *   - prep_load() tokenizes the whole file on `threads` threads (one
 *     tok_encoder each), in file order. A sample is one line: chat through
 *     the template (chat.h; train_on "assistant": only the assistant turns
 *     and their end-of-turn tokens carry loss), prompt_completion as
 *     encode(prompt) / encode(prompt + completion) + EOS (loss on the
 *     completion), text_jsonl as encode(text) + EOS (all tokens). A sample
 *     of more than seq_len+1 tokens is cut to seq_len+1 (overlong
 *     "truncate") or left out ("drop"); a sample without one target that
 *     carries loss is left out; the counts are in prep_samples. A problem
 *     found here fails with "file:line".
 *   - The result is cached under spec->data.cache_dir/<key>/samples.bin,
 *     key = SHA-256 of (the file's content, tokenizer.json and
 *     tokenizer_config.json's content as read and parsed, the template's name and source,
 *     format, seq_len, packing, train_on, overlong, PREP_VERSION). The file
 *     is written to a temporary name and renamed, and checked for its size
 *     on load, so a partial cache is never used. A cache hit tokenizes
 *     nothing.
 *   - `progress` is called from the calling thread: stage "tokenize" with
 *     done / total bytes of the file while tokenizing (first 0, then every
 *     100 ms, last total), or stage "cache" with done = total = records on
 *     a hit.
 */
#ifndef ACC_DATA_PREP_H
#define ACC_DATA_PREP_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "data_cfg.h"

#define PREP_VERSION 1
#define PREP_CHECK_LINES 1000
#define PREP_CHECK_BYTES ((size_t)4 << 20)
#define PREP_CHECK_RENDERS 8

typedef struct prep_samples {
    uint64_t n;            /* samples kept */
    uint64_t ntokens;
    const uint64_t *off;   /* [n+1]: sample i is ids[off[i] .. off[i+1]) */
    const int32_t *ids;
    const uint8_t *mask;   /* per token: 1 = it carries loss as a target */
    uint64_t lines;        /* non-blank lines read */
    uint64_t truncated, dropped, no_target;
    int from_cache;        /* 1 = read from the cache, nothing tokenized */
    char key[65];          /* the cache key (hex) */
    /* owned storage: a mapping of the cache file, or heap arrays */
    void *map;
    size_t map_len;
    void *heap[3];
} prep_samples;

typedef void (*prep_progress_fn)(void *ctx, const char *stage, uint64_t done, uint64_t total);

typedef struct prep_opts {
    const data_cfg *spec;
    const char *path;      /* data.train or data.val (resolved) */
    const char *field;     /* "data.train" / "data.val" */
    int threads;           /* tokenizer threads (>= 1) */
    prep_progress_fn progress; /* may be NULL */
    void *ctx;
    atomic_int *cancel;    /* may be NULL; set: stop with ACC_ECANCELLED */
} prep_opts;

int prep_validate(const data_cfg *s, acc_err *err);

/* data.format when the spec does not give it, read off the first file of
 * `train` (under `roots`): a Parquet file by its columns, a JSONL file by
 * its first record's keys -- messages or conversations (ShareGPT) -> chat,
 * prompt and completion -> prompt_completion, text -> text_jsonl -- and a
 * file that is not JSON lines -> text_lines when the model has a tokenizer
 * (`tokenizer`), text (bytes) when it has none. Neither: ACC_EINVAL naming
 * data.format. Opens user paths: off the loop thread. */
int prep_infer_format(const char *roots, const char *train, bool tokenizer, spec_data_format *out, acc_err *err);
/* Whether `dir` (a resolved model.from) holds a tokenizer.json under `roots`. */
bool prep_has_tokenizer(const char *roots, const char *dir);
int prep_load(const prep_opts *o, prep_samples *out, acc_err *err);
void prep_free(prep_samples *p);

#endif
