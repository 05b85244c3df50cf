/* hf_dir: Hugging Face model directories, in and out.
 *
 * A directory holds config.json and the weights: model.safetensors, or
 * shards named by model.safetensors.index.json ({"weight_map": {tensor:
 * file}}). hf_open() parses config.json and opens every weights file:
 * mapped (safetensors.h: one tensor at a time is converted to fp32 and its
 * pages dropped, never a second copy of the model in host memory), or
 * header only for a submit-time check that reads no tensor data.
 *
 * The module knows the file formats, not the models: which family a
 * config.json names and what its keys mean is the family registry's
 * (model.h: model_family_of_hf, model_hf_int, ...); the caller lists the
 * tensors its layout expects (hf_tensor: the Hugging Face name and the
 * shape as stored), and hf_check() compares the two. Every error is ACC_EINVAL with field
 * "model.from" and a message naming the file and the key or tensor:
 * unknown architectures / model_type, a missing, extra or misshapen tensor,
 * a dtype other than F32 / BF16 / F16, a config value of the wrong type, a
 * shard that the index names but the directory lacks, a tensor in a shard
 * the index does not place there. Buffers that some exporters save beside
 * the parameters (names ending in one of the `ignore` suffixes, e.g.
 * ".rotary_emb.inv_freq", GPT-2's ".attn.bias") are not "extra".
 *
 * hf_save() writes a directory: config.json (the given object, with
 * torch_dtype set to the saved dtype), the weights in one file or, above
 * max_shard_bytes of tensor data (Hugging Face's default 5 GB, 5e9 bytes),
 * in shards model-0000i-of-0000n.safetensors plus the index, and
 * generation_config.json and the tokenizer files copied from a source
 * directory when it has them. Every file is written atomically (fsutil.h);
 * tensors are produced by the caller one at a time in fp32.
 */
#ifndef ACC_HF_DIR_H
#define ACC_HF_DIR_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "safetensors.h"

#define HF_NAME_LEN 128
#define HF_FIELD "model.from"
#define HF_SHARD_DEFAULT 5000000000ull /* transformers' max_shard_size "5GB" */

typedef struct hf_dir hf_dir;

/* One tensor of a layout: its Hugging Face name and shape as stored. */
typedef struct hf_tensor {
    char name[HF_NAME_LEN];
    int ndim;
    int64_t shape[2];
    int optional; /* hf_check: one the layout ties away (a tied lm_head):
                   * absent, or refused naming it; hf_save writes every entry */
    int quant4;   /* hf_check: a 4-bit weight, packed as transformers saves it:
                   * U8 of `shape` (its own, not the model's), torch_dtype not applied */
} hf_tensor;

/* Open `dir` (config.json and the weights' headers; mapped unless
 * header_only) under `roots` (a spec's model.from: data_roots): the
 * directory and every file in it (config.json, the index, each shard, and
 * the side files hf_save would copy) through safepath.h, so each is a
 * regular file, opened without blocking, a symlink only to a target under
 * the roots, read through the descriptor checked. A file that is not JSON
 * is reported by line and column, never by its bytes. header_only =
 * HF_OPEN_CONFIG: config.json alone, no weights file looked at (the
 * planner: a model planned without its weights present); such a directory
 * has no tensors. */
#define HF_OPEN_CONFIG 2
int hf_open_under(const char *roots, const char *dir, int header_only, hf_dir **out, acc_err *err);
/* The directory open as `dfd` (left open; `dir` its path): accumd's own
 * checkpoints, where a symlink may not lead out of the directory itself. */
int hf_open_at(int dfd, const char *dir, int header_only, hf_dir **out, acc_err *err);
/* hf_open_under without roots (tools, tests). */
int hf_open(const char *dir, int header_only, hf_dir **out, acc_err *err);
void hf_close(hf_dir *h);

const char *hf_path(const hf_dir *h);
/* config.json, owned by h (borrowed). */
json_t *hf_config(const hf_dir *h);

/* Whether the weights hold a tensor of that name. */
int hf_has(const hf_dir *h, const char *name);

/* Every non-optional tensor of `want` is present, every present one has
 * its shape and a float dtype, and the files hold nothing else (but names
 * ending in an `ignore` suffix; `ignore` NULL-terminated, may be NULL). */
int hf_check(const hf_dir *h, const hf_tensor *want, int n, const char *const *ignore,
             acc_err *err);

/* Tensor `name` as `count` floats into dst (from the mapping; its pages
 * are dropped afterwards). ACC_ESTATE when opened header only. */
int hf_read(const hf_dir *h, const char *name, float *dst, size_t count, acc_err *err);

/* Tensor `name`'s dtype and shape (data NULL when opened header
 * only); ACC_ENOTFOUND when absent. */
int hf_tensor_info(const hf_dir *h, const char *name, st_tensor *out);
/* Tensor `name`'s raw bytes into dst[nbytes] (exactly its size),
 * pages dropped afterwards; ACC_ESTATE when opened header only. */
int hf_read_bytes(const hf_dir *h, const char *name, void *dst, size_t nbytes, acc_err *err);

/* The dtype most of the weights' bytes are stored in (torch_dtype); for
 * a directory opened HF_OPEN_CONFIG, config.json's torch_dtype (F32 when
 * absent or another name). */
st_dtype hf_dtype(const hf_dir *h);
/* torch_dtype's spelling of a dtype ("float32", "bfloat16", "float16"). */
const char *hf_torch_dtype(st_dtype d);
/* The inverse; ACC_EINVAL naming `field` for another name. */
int hf_dtype_of(const char *torch_dtype, const char *field, st_dtype *out, acc_err *err);

/* ---- writing */

/* Produce tensor i's values, want[i] shaped, in fp32 into buf. */
typedef int (*hf_fill_fn)(void *ctx, int i, float *buf, acc_err *err);

typedef struct hf_save_opts {
    st_dtype dtype;           /* on disk: ST_F32, ST_BF16 or ST_F16 */
    uint64_t max_shard_bytes; /* 0: HF_SHARD_DEFAULT */
    const json_t *config;     /* config.json to write (copied; torch_dtype set) */
    const char *src_dir;      /* copy generation_config.json and tokenizer files from it (may be NULL) */
    const char *src_roots;    /* the roots src_dir is read under (safepath.h; NULL or "": none) */
} hf_save_opts;

/* Only the directory's side files: config.json (o->config with torch_dtype
 * = o->dtype) and the files copied from o->src_dir; `dir` must exist. */
int hf_save_side(const char *dir, const hf_save_opts *o, acc_err *err);

/* Only src's generation_config.json and tokenizer
 * files (those it has), read under `roots` (safepath.h), copied into the
 * existing `dir` atomically: an export's tokenizer. */
int hf_copy_tokenizer(const char *src, const char *roots, const char *dir, acc_err *err);

/* Write the directory `dir` (created when absent). */
int hf_save(const char *dir, const hf_tensor *t, int n, hf_fill_fn fill, void *ctx,
            const hf_save_opts *o, acc_err *err);

#endif
