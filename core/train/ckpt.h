/* ckpt: training checkpoints, in safetensors.
 *
 * A checkpoint is a directory <output_dir>/ckpt-<step, 8 digits>/ holding
 *   model.safetensors  the weights under the family's Hugging Face names and
 *                      file shapes (the model's layout, model.h: GPT-2's
 *                      "wte.weight", "h.0.attn.c_attn.weight", ...; Conv1D
 *                      matrices stored [in, out] as transformers expects,
 *                      wte without the padded rows), F32 or the job's
 *                      save.dtype (ckpt_save_as);
 *   state.safetensors  what an exact continuation needs besides the weights:
 *                      the AdamW moments (adamw.h) in the model's own flat
 *                      layout, the fp32 weights ("params") when
 *                      model.safetensors holds them rounded, and
 *                      metadata: step, adam_t, the (micro, accum) split, the
 *                      seed, the model shape, the spec.
 * The directory is written as ckpt-<step>.partial, every file fsynced, then
 * renamed and the parent fsynced: a crash leaves the previous checkpoint and
 * at most a .partial directory, which ckpt_find_latest() removes. Both files
 * carry a CRC-32 (see safetensors.h) that loading verifies, so a torn or
 * corrupted checkpoint is never trusted; the newest good one is used.
 * The step of a checkpoint is the number of optimizer steps completed.
 */
#ifndef ACC_CKPT_H
#define ACC_CKPT_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "adamw.h"
#include "model.h"
#include "safetensors.h"

typedef struct ckpt_state {
    int step;            /* optimizer steps completed */
    int adam_t;          /* AdamW steps taken */
    int micro_batch;     /* the split in force (after any OOM adaptation) */
    int accum_steps;
    uint64_t seed;
    bool recompute;      /* activation recomputation in force */
} ckpt_state;

/* Write a checkpoint of model `m` (rank 0's replica), its optimizer `opt`
 * (the whole buffer's moments) and `st` under
 * `output_dir`, then keep only the newest `keep` checkpoints there.
 * `spec_json` (may be NULL) is stored for reference. The path of the new
 * checkpoint directory is written to path_out. */
int ckpt_save(const char *output_dir, const model *m, const adamw *opt, const ckpt_state *st,
              const char *spec_json, int keep, char *path_out, size_t path_n, acc_err *err);

/* ckpt_save, the checkpoint also a Hugging Face directory beside its
 * state.safetensors: config.json (from the family's config_to_hf, over
 * hf_src's config.json keys when hf_src is given) and hf_src's
 * generation_config.json and tokenizer files (hf_src: the job's
 * "model.from", or NULL). Weights over 5 GB go to shards with an index
 * (model_hf.h), read back by ckpt_load; smaller ones stay one file. */
int ckpt_save_hf(const char *output_dir, const model *m, const adamw *opt, const ckpt_state *st,
                 const char *spec_json, int keep, const char *hf_src, char *path_out,
                 size_t path_n, acc_err *err);

/* ckpt_save_hf with the weights on disk in `dtype` (ST_F32, ST_BF16,
 * ST_F16: job spec save.dtype). Below F32 they are written by
 * model_hf_save (rounded to nearest even; fp16 keeps Inf/NaN, overflows to
 * Inf) with config.json's torch_dtype saying so, and state.safetensors also
 * holds the fp32 master weights ("params", the model's flat layout), which
 * ckpt_load prefers: resuming stays exact whatever the saved dtype. */
int ckpt_save_as(const char *output_dir, const model *m, const adamw *opt, const ckpt_state *st,
                 const char *spec_json, int keep, const char *hf_src, st_dtype dtype,
                 char *path_out, size_t path_n, acc_err *err);

/* Load weights, moments and state from checkpoint directory `dir` into `m`
 * and `opt` (whose shapes must match; opt->t := the saved adam_t). */
int ckpt_load(const char *dir, model *m, adamw *opt, ckpt_state *st, acc_err *err);

/* The newest checkpoint under output_dir that opens and verifies; partial
 * ones are removed, unreadable ones skipped (and named in *skipped_msg when
 * given). ACC_ENOTFOUND when there is none. */
int ckpt_find_latest(const char *output_dir, char *path_out, size_t path_n, acc_err *err);

/* Read only the state metadata of checkpoint directory `dir` (after
 * verifying both files), e.g. to size the model for the saved split. */
int ckpt_peek(const char *dir, ckpt_state *st, acc_err *err);

/* Which checkpoint to resume from: `path` is either one checkpoint directory
 * (holding state.safetensors) or a directory of checkpoints (a job's output
 * directory), in which case the newest good one is chosen. */
int ckpt_resolve(const char *path, char *dir_out, size_t dir_n, acc_err *err);

/* Load only the weights from a model.safetensors written by accumd or by
 * Hugging Face tooling (for init_from), by the model's layout. Padding
 * (e.g. padded wte rows) is zeroed. */
int ckpt_load_weights(const char *path, model *m, acc_err *err);

#endif
