/* export: a job's final model as a directory that loads anywhere, apart
 * from its resumable checkpoints.
 *
 * export_final() makes `export_dir` hold the final checkpoint's files but
 * the optimizer state: a full fine-tune's Hugging Face directory
 * (config.json, generation_config.json, model.safetensors or its shards,
 * in the save.dtype the checkpoint was written in, and the tokenizer
 * files of model.from), or LoRA's PEFT adapter directory
 * (adapter_config.json, adapter_model.safetensors, the tokenizer files)
 * with the merged model in merged/ when save.merge_lora asked for it.
 * state.safetensors (AdamW moments, fp32 master weights) never goes
 * there. The files are hard links to the checkpoint's (a copy across
 * file systems), so an export costs no space and outlives the pruning of
 * the checkpoint. It is built as export_dir.partial and renamed into
 * place (a crash leaves the previous export or none), parents created.
 */
#ifndef ACC_EXPORT_H
#define ACC_EXPORT_H

#include "err.h"

/* The file of a checkpoint that holds what only resuming needs. */
#define EXPORT_STATE_FILE "state.safetensors"

/* tok_src (may be NULL): the directory of the tokenizer the job used
 * (data.tokenizer, else model.from), whose generation_config.json,
 * tokenizer.json, tokenizer_config.json (the chat template) ... are copied
 * in, read under `roots` (the spec's data_roots). */
int export_final(const char *ckpt_dir, const char *export_dir, const char *tok_src, const char *roots,
                 acc_err *err);

#endif
