/* data: training samples from text files or token shards, in a fixed order.
 *
 * A data_source is opened once per job and then only read, so the ranks
 * share it. Formats: SPEC_DATA_TEXT, any file read as bytes (token = byte,
 * vocabulary 256); SPEC_DATA_TOKENS, one shard or a glob of shards, each a
 * 256 x int32 header (magic 20240520, version 1, token count) followed by
 * uint16 tokens. Files are mapped, not copied.
 *
 * A sample is seq_len+1 consecutive tokens (inputs and next-token targets);
 * sample i of a file starts at token i*seq_len, and samples never cross
 * files. The order of samples is a permutation of all samples drawn from
 * (seed, epoch). Optimizer step k consumes the global slots
 * [k*B, (k+1)*B) of that order (slot s lies in epoch s / nsamples); the
 * trainer deals a step's slots to (rank, micro-step, position) with
 * data_slot(). So the samples of step k depend on (seed, B, k) only.
 *
 * Every problem (missing, short, wrong magic or version, token >= vocab,
 * outside the roots, not a regular file) is ACC_EINVAL with the field the
 * caller names ("data.train"); messages never quote the file's bytes.
 */
#ifndef ACC_DATA_H
#define ACC_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "data_cfg.h"

#define DATA_SHARD_MAGIC 20240520
#define DATA_SHARD_VERSION 1
#define DATA_HEADER_INTS 256

typedef struct data_source data_source;

int data_open(const char *path, spec_data_format fmt, int seq_len, int vocab_size,
              const char *field, data_source **out, acc_err *err);
/* The same, every file (each glob match) opened under `roots` (safepath.h:
 * resolved and checked after expansion, a regular file, read through the
 * descriptor that was checked); data_open has no roots. */
int data_open_under(const char *roots, const char *path, spec_data_format fmt, int seq_len,
                    int vocab_size, const char *field, data_source **out, acc_err *err);
void data_close(data_source *ds);

uint64_t data_num_samples(const data_source *ds);
uint64_t data_num_tokens(const data_source *ds);

/* Write the seq_len+1 tokens of sample `id` (< data_num_samples). */
void data_sample(const data_source *ds, uint64_t id, int *tokens);

/* The JSONL formats: samples prepared by data_prep.h (the source takes
 * them over, freeing them at data_close, also on failure). Unpacked,
 * sample i is one record: its tokens, then padding (token 0, no loss) up
 * to seq_len+1. Packed, sample i is a window of seq_len+1 tokens holding
 * consecutive records (in file order, as many as fit whole), then padding;
 * its positions restart at 0 at each record, and a target never crosses
 * from one record into the next. */
struct prep_samples;
int data_open_prepared(struct prep_samples *ps, int seq_len, int packing, const char *field,
                       data_source **out, acc_err *err);
/* Whether samples are packed windows (then data_sample_pos gives positions). */
int data_is_packed(const data_source *ds);
/* The seq_len input positions of sample `id` (packed: per record, from 0;
 * padding counts on from 0 as a document of its own; else 0..seq_len-1). */
void data_sample_pos(const data_source *ds, uint64_t id, int *pos);

/* data_sample plus the target mask: tmask[i] (i < seq_len) is 1 when target
 * i (token i+1) carries loss. Text and shards: every target; prepared
 * samples: the sample's mask, padding 0. */
void data_sample_masked(const data_source *ds, uint64_t id, int *tokens, uint8_t *tmask);
/* Targets that carry loss in sample `id`. */
uint64_t data_sample_targets(const data_source *ds, uint64_t id);
/* Input positions of sample `id` that hold a real
 * token (seq_len but for a prepared window shorter than it: the rest is
 * padding). */
uint64_t data_sample_inputs(const data_source *ds, uint64_t id);

/* The per-epoch order, cached one epoch at a time (one per rank). */
typedef struct data_order {
    uint64_t seed;
    uint64_t n;          /* samples per epoch */
    uint64_t epoch;      /* epoch held in perm, UINT64_MAX when none */
    uint64_t *perm;
} data_order;

int data_order_init(data_order *o, uint64_t nsamples, uint64_t seed, acc_err *err);
void data_order_free(data_order *o);
/* The sample id in global slot `slot`. */
uint64_t data_order_sample(data_order *o, uint64_t slot);

/* The global slot that rank `rank`, micro-step `micro`, position `pos` of
 * optimizer step `step` trains on, with `per_rank` = micro * accum samples. */
static inline uint64_t data_slot(uint64_t step, int batch, int per_rank, int micro_batch,
                                 int rank, int micro, int pos)
{
    return step * (uint64_t)batch + (uint64_t)rank * (uint64_t)per_rank +
           (uint64_t)micro * (uint64_t)micro_batch + (uint64_t)pos;
}

#endif
