/* data_cfg: what the data layer reads of a training job's configuration.
 *
 * The spec's "data" section (spec_data), the model's shape the samples are
 * cut to and its directory (the default tokenizer), and the roots every
 * file is opened under (safepath.h). Built from a train_cfg by
 * train_cfg_data (train_cfg.h); the data layer never sees a job spec.
 */
#ifndef ACC_DATA_CFG_H
#define ACC_DATA_CFG_H

#include <limits.h>
#include <stdbool.h>

#include "model_cfg.h"

/* text: bytes; tokens: uint16 shards; the JSONL formats (records.h) are
 * tokenized once by data_prep.h with data.tokenizer. */
typedef enum spec_data_format {
    SPEC_DATA_TEXT = 0,
    SPEC_DATA_TOKENS = 1,
    SPEC_DATA_CHAT,
    SPEC_DATA_PROMPT_COMPLETION,
    SPEC_DATA_TEXT_JSONL,
    SPEC_DATA_TEXT_LINES, /* plain text, one sample a line, through the tokenizer */
} spec_data_format;

/* A JSONL format: tokenized by data_prep. */
static inline bool spec_data_is_jsonl(spec_data_format f)
{
    return f == SPEC_DATA_CHAT || f == SPEC_DATA_PROMPT_COMPLETION || f == SPEC_DATA_TEXT_JSONL ||
           f == SPEC_DATA_TEXT_LINES;
}

typedef enum spec_train_on { SPEC_TRAIN_ASSISTANT = 0, SPEC_TRAIN_ALL } spec_train_on;
/* A sample longer than seq_len: cut to seq_len tokens, or left out. */
typedef enum spec_overlong { SPEC_OVERLONG_TRUNCATE = 0, SPEC_OVERLONG_DROP } spec_overlong;

typedef struct spec_data {
    char train[PATH_MAX];  /* file, or glob; several separated by newlines (a JSON list) */
    char val[PATH_MAX];    /* "" when none */
    spec_data_format format;
    bool format_inferred;  /* data.format was not given: read off data.train's first file */
    /* the JSONL formats (chat, prompt_completion, text_jsonl) */
    char tokenizer[PATH_MAX];   /* directory with tokenizer.json (default: model.from) */
    char chat_template[64];     /* "auto" (tokenizer_config.json's) or a shipped name */
    spec_train_on train_on;
    bool packing;
    spec_overlong overlong;
    char cache_dir[PATH_MAX];   /* set by the daemon: state_dir/cache ("" = no cache) */
    /* h-dsconf: data.dataset, a hub dataset in the daemon's hf_hub_cache; its
     * split's files (data.subset, data.split, data.data_files choose them)
     * are then data.train, as one glob matching exactly those files */
    char dataset[128];
    char subset[64];
    char split[64];
    int dataset_files;          /* how many files the split has */
} spec_data;

typedef struct data_cfg {
    spec_data data;
    spec_model model;          /* seq_len, vocab_size; from: the default tokenizer */
    char data_roots[4 * PATH_MAX]; /* files are opened under these ("" = unrestricted, tests) */
} data_cfg;

#endif
