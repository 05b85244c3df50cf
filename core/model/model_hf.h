/* model_hf: models from and to Hugging Face directories (hf_dir.h), through
 * the family's layout (model.h). Nothing here knows a family's tensors.
 *
 * The family comes from config.json ("architectures" / "model_type"), the
 * config from the family's config_from_hf, the expected tensors from its
 * layout (Hugging Face names and shapes; GPT-2 directories may prefix them
 * with "transformer.", and a tied lm_head.weight may be present). Buffers
 * some exporters save are ignored: ".rotary_emb.inv_freq", GPT-2's
 * ".attn.bias" / ".attn.masked_bias". Every error is ACC_EINVAL, field
 * "model.from", naming the directory's file and the key or tensor.
 *
 * Loading converts one tensor at a time from the mapped file (F32, BF16,
 * F16) to fp32, transposes it where the layout says (GPT-2's Conv1D), and
 * uploads it to its place in the device buffer: host memory holds one
 * tensor, never the model. Saving downloads one tensor at a time the same
 * way (hf_save streams them into the shards).
 */
#ifndef ACC_MODEL_HF_H
#define ACC_MODEL_HF_H

#include "hf_dir.h"
#include "model.h"

/* The config of an open directory. */
int model_hf_config(const hf_dir *h, model_config *cfg, acc_err *err);

/* The directory's tensors against cfg's layout (names, shapes, dtypes,
 * nothing missing, nothing extra). Works on a header-only open. */
int model_hf_check(const hf_dir *h, const model_config *cfg, acc_err *err);

/* Submit-time validation of `dir`: headers only, no tensor data read.
 * cfg (may be NULL) gets the config. */
int model_hf_validate(const char *dir, model_config *cfg, acc_err *err);
/* The same for a spec's model.from: the directory and its files under
 * `roots` (hf_open_under). */
int model_hf_validate_under(const char *roots, const char *dir, model_config *cfg, acc_err *err);

/* The planner's reading of `dir`: config.json alone (HF_OPEN_CONFIG), the
 * family's config and its layout built (so sizes are checked), no weights
 * file opened: a directory holding only config.json plans. The submit
 * path still uses model_hf_validate. */
int model_hf_config_only(const char *roots, const char *dir, model_config *cfg, acc_err *err);

/* Weights of the open, checked directory h into m (same config). */
int model_hf_load(model *m, const hf_dir *h, acc_err *err);

/* Open, check and load `dir` into m. */
int model_hf_load_dir(model *m, const char *dir, acc_err *err);
int model_hf_load_under(model *m, const char *roots, const char *dir, acc_err *err);

typedef struct model_hf_save_opts {
    st_dtype dtype;           /* on disk (ST_F32, ST_BF16, ST_F16) */
    uint64_t max_shard_bytes; /* 0: Hugging Face's 5 GB */
    const float *host_params; /* the weights from this host copy of the buffer (LoRA's
                               * merged model); NULL: from the device */
    const char *src_dir;      /* the input directory: its config.json's other keys are kept,
                               * its generation_config.json and tokenizer files copied (NULL: none) */
    const char *src_roots;    /* the roots src_dir is read under (safepath.h; NULL or "": none) */
} model_hf_save_opts;

/* Bytes of m's tensors on disk in dtype d (for the choice to shard). */
uint64_t model_hf_bytes(const model *m, st_dtype d);

/* Only config.json (o->src_dir's keys kept, the family's over them,
 * torch_dtype = o->dtype) and the side files, into the existing `dir`:
 * makes a directory holding model.safetensors a Hugging Face directory. */
int model_hf_save_config(const model *m, const char *dir, const model_hf_save_opts *o,
                         acc_err *err);

/* m's weights as the Hugging Face directory `dir` (created). */
int model_hf_save(const model *m, const char *dir, const model_hf_save_opts *o, acc_err *err);

#endif
