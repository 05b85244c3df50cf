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
 * corrupted checkpoint is never trusted; the newest good one is used, and
 * each one passed over is reported (ckpt_reject_fn) so the job can say so.
 * The state names the job that wrote it (job_uid): a job resumes only its
 * own checkpoints (ckpt_find_at), never a stranger's left in a reused
 * output directory.
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

/* LoRA (model_lora.h): a checkpoint directory is a PEFT adapter directory
 * (adapter_config.json, adapter_model.safetensors; state.safetensors keeps
 * the adapters in fp32 (its "params" is the trainable prefix of the buffer)
 * and their moments, so resume is exact once the caller has loaded the
 * frozen base as the job started: ckpt_load_at uploads the prefix only) and,
 * with save.merge_lora, holds the merged model as the Hugging Face
 * directory <ckpt>/merged. */
#define CKPT_MERGED_DIR "merged"

typedef struct ckpt_state {
    int step;            /* optimizer steps completed */
    int adam_t;          /* AdamW steps taken */
    int micro_batch;     /* the split in force (after any OOM adaptation) */
    int accum_steps;
    uint64_t seed;
    bool recompute;      /* activation recomputation in force */
    char job_uid[40];    /* the job that wrote it ("" = none named); stored as
                            the state's "job_uid" metadata */
} ckpt_state;

/* Told about each checkpoint a search passes over: its directory and why
 * (corrupt, incomplete, another job's). */
typedef void (*ckpt_reject_fn)(void *ctx, const char *dir, const char *why);

/* Write a checkpoint of model `m` (rank 0's replica), its optimizer `opt`
 * (the whole trainable range's moments; a ZeRO shard is refused: ckpt_save_gathered)
 * and `st` under
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
 * ckpt_load prefers: resuming stays exact whatever the saved dtype.
 * hf_src's files are read under `hf_roots` (the spec's data_roots;
 * safepath.h; NULL: none). */
int ckpt_save_as(const char *output_dir, const model *m, const adamw *opt, const ckpt_state *st,
                 const char *spec_json, int keep, const char *hf_src, const char *hf_roots, st_dtype dtype,
                 char *path_out, size_t path_n, acc_err *err);

/* ckpt_save_as for ZeRO ranks: the moments of the whole trainable range
 * given in host memory (mom1, mom2: m->ngrad floats each), gathered from
 * the ranks' shards by the caller, so the checkpoint is the same file a
 * replica writes and resumes on any number of devices and any stage. */
int ckpt_save_gathered(const char *output_dir, const model *m, const float *mom1, const float *mom2,
                       const ckpt_state *st, const char *spec_json, int keep, const char *hf_src,
                       const char *hf_roots, st_dtype dtype, char *path_out, size_t path_n, acc_err *err);

/* A save that fails for want of room (ENOSPC, EDQUOT, or no block left on
 * output_dir's file system) is ACC_ENOSPACE: the partial directory is
 * removed, the previous checkpoints are untouched, and the caller may wait
 * for room and save again (the trainer does, trainer.h). */
/* Bytes a checkpoint of `m` may take (weights, an fp32 copy, two moments),
 * and the bytes free to us under output_dir (UINT64_MAX: unknown). */
uint64_t ckpt_bytes_estimate(const model *m);
uint64_t ckpt_free_bytes(const char *output_dir);

/* Load weights, moments and state from checkpoint directory `dir` into `m`
 * and `opt` (the model's shapes must match; opt->t := the saved adam_t).
 * The file holds the whole buffer's moments; `opt` takes its range
 * [lo, hi) of them: all for a replica, a ZeRO shard of any world size. */
int ckpt_load(const char *dir, model *m, adamw *opt, ckpt_state *st, acc_err *err);

/* The newest checkpoint under output_dir that opens and verifies; partial
 * ones are removed, unreadable ones skipped (and named in *skipped_msg when
 * given). ACC_ENOTFOUND when there is none. */
int ckpt_find_latest(const char *output_dir, char *path_out, size_t path_n, acc_err *err);

/* Read only the state metadata of checkpoint directory `dir` (after
 * verifying both files), e.g. to size the model for the saved split. */
int ckpt_peek(const char *dir, ckpt_state *st, acc_err *err);

/* The descriptor forms: the checkpoint directory is an open `dfd` (e.g. from
 * safepath.h), named `dir` in messages; its files are opened inside it
 * without following symlinks and read through those descriptors. */
int ckpt_load_at(int dfd, const char *dir, model *m, adamw *opt, ckpt_state *st, acc_err *err);
/* The checkpoint's model shape is `cfg`'s (ACC_EINVAL, field resume_from). */
int ckpt_check_model_at(int dfd, const char *dir, const model_config *cfg, acc_err *err);

/* The newest checkpoint in the open directory `outfd` (named output_dir)
 * that verifies and, when `uid` is non-empty, carries that job uid (or none
 * at all, when adopt_unnamed). Every checkpoint passed over is reported to
 * `reject` (may be NULL) with the reason. On success *ckpt_fd (may be NULL)
 * is the chosen checkpoint directory, open; path_out its path; *st (may be
 * NULL) its state. ACC_ENOTFOUND when none qualifies. */
int ckpt_find_at(int outfd, const char *output_dir, const char *uid, bool adopt_unnamed,
                 ckpt_reject_fn reject, void *ctx, int *ckpt_fd, char *path_out, size_t path_n,
                 ckpt_state *st, acc_err *err);

/* ckpt_resolve on an open directory `fd` (named `path`): a checkpoint
 * directory, or a directory of checkpoints (newest good one, passed-over
 * ones reported). Verified; *ckpt_fd gets the chosen directory, open. */
int ckpt_resolve_at(int fd, const char *path, ckpt_reject_fn reject, void *ctx, int *ckpt_fd,
                    char *dir_out, size_t dir_n, ckpt_state *st, acc_err *err);

/* Where a job's checkpoints are, for ckpt_discover: the job's own fields. */
typedef struct ckpt_job {
    const char *output_root;  /* output_dir and resume_from lie under it (safepath.h) */
    const char *output_dir;   /* the job's own checkpoints ("" = none) */
    const char *job_uid;      /* its own carry this uid (or none, with adopt_unnamed) */
    bool adopt_unnamed;
    const char *resume_from;  /* "" = none */
    int keep;                 /* checkpoints kept in output_dir */
} ckpt_job;

/* The checkpoint a job starts from: its own newest good one in output_dir
 * (a job requeued after a restart), else resume_from's (a checkpoint
 * directory or a job's output directory, opened through safepath and
 * verified: its failure is returned), else none: 0 with *ckpt_fd = -1.
 * Prunes output_dir to `keep` first (never the checkpoint chosen from
 * it), so a crash never leaves more behind. Every checkpoint passed over
 * is reported to `reject`. With one: *ckpt_fd its directory, open;
 * dir_out its path; *st its state. */
int ckpt_discover(const ckpt_job *j, ckpt_reject_fn reject, void *ctx, int *ckpt_fd, char *dir_out,
                  size_t dir_n, ckpt_state *st, acc_err *err);

/* resume_from at submit: a usable checkpoint of model `cfg` under
 * output_root, not past max_steps (the output root itself, or a directory
 * without checkpoints, is refused now rather than failing at start).
 * 0 when resume_from is "". ACC_EINVAL naming resume_from otherwise. */
int ckpt_check_resume_from(const char *output_root, const char *resume_from, const model_config *cfg,
                           int max_steps, acc_err *err);

/* Keep only the newest `keep` checkpoints under output_dir (and never the
 * one at `protect_step`, -1 for none); partial ones are removed. */
void ckpt_prune(const char *output_dir, int keep, int protect_step);

/* Which checkpoint to resume from: `path` is either one checkpoint directory
 * (holding state.safetensors) or a directory of checkpoints (a job's output
 * directory), in which case the newest good one is chosen. */
int ckpt_resolve(const char *path, char *dir_out, size_t dir_n, acc_err *err);

/* Load only the weights from a model.safetensors written by accumd or by
 * Hugging Face tooling (for init_from), by the model's layout. Padding
 * (e.g. padded wte rows) is zeroed. The _fd form reads an open file (named
 * `path` in messages), e.g. one safepath.h checked. */
int ckpt_load_weights(const char *path, model *m, acc_err *err);
int ckpt_load_weights_fd(int fd, const char *path, model *m, acc_err *err);

#endif
