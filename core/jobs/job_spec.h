/* job_spec: a training job as submitted, parsed and validated.
 *
 * The public form is the JSON job spec of docs/api.md (POST /v1/jobs), which also
 * accepts DeepSpeed's batch keys and a nested "deepspeed" object. job_spec_parse()
 * (job_spec.c) turns it into this struct, resolving the batch triple so that
 * train_batch_size == micro_batch * accum_steps * devices always holds, and
 * reporting every problem as ACC_EINVAL with `field` set to the key path
 * ("optimizer.lr", "model.n_head"). The trainer reads this struct only.
 */
#ifndef ACC_JOB_SPEC_H
#define ACC_JOB_SPEC_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#include "conf.h"
#include "err.h"

/* text: bytes; tokens: uint16 shards; the JSONL formats (records.h) are
 * tokenized once by data_prep.h with data.tokenizer. */
typedef enum spec_data_format {
    SPEC_DATA_TEXT = 0,
    SPEC_DATA_TOKENS = 1,
    SPEC_DATA_CHAT,
    SPEC_DATA_PROMPT_COMPLETION,
    SPEC_DATA_TEXT_JSONL,
    SPEC_DATA_TEXT_LINES, /* plain text, one sample a line, through the tokenizer (h-parquet) */
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
/* fp32: everything in fp32. bf16: the linear layers' products take bf16
 * operands with fp32 accumulation; weights, gradients, optimizer state and
 * every other kernel stay fp32 (kern_device.h set_precision). */
typedef enum spec_precision { SPEC_FP32 = 0, SPEC_BF16 = 1 } spec_precision;

/* "fp32" / "bf16", as the spec's "precision" spells it. */
static inline const char *spec_precision_name(spec_precision p)
{
    return p == SPEC_BF16 ? "bf16" : "fp32";
}

typedef enum spec_lr_type {
    SPEC_LR_CONSTANT = 0,
    SPEC_LR_COSINE,        /* linear warmup, cosine decay to min_lr at max_steps */
    SPEC_LR_WARMUP,        /* DeepSpeed WarmupLR: warmup_min_lr -> lr, then constant */
    SPEC_LR_WARMUP_DECAY,  /* DeepSpeed WarmupDecayLR: warmup, then linear decay to 0 at total_steps */
    SPEC_LR_WARMUP_COSINE, /* DeepSpeed WarmupCosineLR: warmup, then cosine to cos_min_ratio * lr */
} spec_lr_type;

/* save.dtype: the dtype of the saved weights (model.safetensors and shards). */
typedef enum spec_save_dtype {
    SPEC_SAVE_AUTO,        /* model.from's dtype (its tensors'); float32 from scratch */
    SPEC_SAVE_F32,
    SPEC_SAVE_BF16,
    SPEC_SAVE_F16,
} spec_save_dtype;

typedef struct spec_model {
    char arch[16];         /* "gpt2" */
    int n_layer, n_head, n_embd, seq_len;
    int vocab_size;        /* tokens of the data (256 for byte-level text) */
    int padded_vocab_size; /* rows of the embedding; >= vocab_size (default = vocab_size) */
    char init_from[PATH_MAX]; /* "" or an llm.c .bin / .safetensors file */
    int n_kv_head;         /* llama: key/value heads (0 = n_head) */
    int intermediate_size; /* llama: MLP width (0 = the family's default) */
    char from[PATH_MAX];   /* "" or a Hugging Face model directory (resolved); the
                            * sizes above are then config.json's */
    /* h-dsconf: model.from as written when it named a hub repository
     * ("meta-llama/Llama-2-7b-hf"; from is then its snapshot) */
    char hub_repo[128];
    bool seq_len_default;  /* seq_len was not given: config.json's max_position_embeddings, at most 4096 */
} spec_model;

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

typedef struct spec_optim {
    double lr, beta1, beta2, eps, weight_decay;
    double grad_clip;      /* global-norm clip; 0 = off */
} spec_optim;

typedef struct spec_lr {
    spec_lr_type type;
    int warmup_steps;
    double min_lr;         /* cosine floor (SPEC_LR_COSINE) */
    double warmup_min_lr;  /* DeepSpeed warmup start */
    double cos_min_ratio;  /* DeepSpeed WarmupCosineLR floor, fraction of lr */
    int total_steps;       /* DeepSpeed total_num_steps; default max_steps */
    double warmup_ratio;   /* h-dsconf: warmup_steps = ceil(ratio x total steps) when warmup_steps is 0
                            * (Hugging Face's rule); applied once the total is known */
} spec_lr;

/* "lora": PEFT's LoraConfig under its names. r = 0: no lora section (every
 * weight trains). Targets are module names as the model family calls its
 * projections (Hugging Face's, e.g. "q_proj"); they are checked against the
 * model at submission (model_lora.h), the spec checks only their form. */
#define SPEC_LORA_MAX_TARGETS 16
#define SPEC_LORA_NAME_MAX 32
#define SPEC_LORA_MAX_R 4096

typedef struct spec_lora {
    int r;                 /* rank; 0 = no LoRA */
    double alpha;          /* lora_alpha: the update is scaled by alpha / r (PEFT default 8) */
    double dropout;        /* lora_dropout on the adapter input (only 0 for now) */
    bool all_linear;       /* target_modules "all-linear": every linear layer but the head */
    int n_targets;         /* 0 and !all_linear: the family's default (PEFT's: q_proj, v_proj) */
    char targets[SPEC_LORA_MAX_TARGETS][SPEC_LORA_NAME_MAX];
} spec_lora;

#define SPEC_MAX_BATCH (1 << 24) /* train_batch_size at most */
#define SPEC_MAX_RESTARTS 100
#define SPEC_MAX_NODES 16
#define SPEC_MAX_WORLD 16 /* ranks of a job over its nodes (trainer.h TRAIN_MAX_RANKS) */

typedef struct job_spec {
    char name[128];
    spec_model model;
    spec_data data;
    /* the batch triple: B = micro_batch * accum_steps * devices, always */
    int train_batch_size;
    int micro_batch;       /* train_micro_batch_size_per_gpu */
    int accum_steps;       /* gradient_accumulation_steps */
    int devices;           /* devices per node (the world size of a one-node job) */
    int nodes;             /* servers the job spans (rank processes over MPI); world = devices * nodes */
    bool micro_auto;       /* micro batch was "auto": the planner picks it */
    /* (h-results, issue 23) the batch keys as written (0: absent or
     * "auto"): another world size (POST /v1/plan's hardware.devices)
     * resolves them through the same batch_split_resolve as submit */
    int given_batch, given_micro, given_accum;
    spec_precision precision;
    bool activation_checkpointing;
    int zero_stage;        /* zero_optimization.stage: 0 (replicas), 1 (AdamW moments
                            * sharded), 2 (and the reduced gradients: a reduce-scatter) */
    spec_optim optim;
    spec_lr lr;
    int max_steps;
    bool max_steps_given;  /* max_steps was in the spec */
    double num_train_epochs; /* 0 = not given; else max_steps = ceil(epochs x samples / B)
                              * once the data is prepared (when max_steps is not given) */
    int eval_interval;     /* 0 = no eval */
    int eval_batches;      /* at most this many batches of B samples per eval
                            * (0, the default: the whole validation set) */
    int checkpoint_interval; /* 0 = only at the end */
    uint64_t seed;
    int priority;          /* higher runs first */
    /* a worker that dies without reporting (a crash, a kill, a lost
     * heartbeat) requeues the job this many times (Determined's name);
     * never twice at the same step, never after a reported failure */
    int max_restarts;
    bool oom_adapt;        /* oom.adapt */
    /* (h-results, issue 23) checkpoint_on_cancel (default true): a cancel
     * of a running job writes a checkpoint at the next micro-step boundary
     * unless no optimizer step completed since the last one */
    bool checkpoint_on_cancel;
    /* (h-results, issue 23) outputs the user owns: "output_dir"
     * (Hugging Face's name; a relative name of [A-Za-z0-9._-] components)
     * places the final export under output_root/<owner>/; save_total_limit
     * keeps the newest N checkpoints (0: the config's checkpoint_keep) */
    char output_name[256];
    int save_total_limit;
    char export_dir[PATH_MAX]; /* set by the daemon: where the final export goes ("" = none) */
    char resume_from[PATH_MAX]; /* "" or a checkpoint directory */
    spec_save_dtype save_dtype; /* save.dtype (the fp32 master weights stay in state.safetensors) */
    spec_lora lora;             /* "lora" (r = 0: none) */
    bool merge_lora;            /* save.merge_lora: also the merged model (needs lora) */
    char output_dir[PATH_MAX];  /* set by the daemon: output_root/<job id> */
    /* set by job_spec_parse from the config: every file the spec names is
     * opened under these (safepath.h; empty = unrestricted, for tests) */
    char data_roots[4 * PATH_MAX];
    char output_root[PATH_MAX];
    /* set by the daemon: the job's unique id (32 hex digits, minted at
     * submission); its checkpoints carry it and it resumes only those.
     * "" = none (engine tests): any checkpoint in output_dir is its own.
     * adopt_unnamed: also resume checkpoints that carry no id (written
     * before ids existed; only for jobs submitted before then). */
    char job_uid[40];
    bool adopt_unnamed;
    /* set by job_spec_parse_plan: a spec read to be planned, not run.
     * model.from is read for config.json only (no weights needed) and
     * data may be absent; the planner (mem_plan.h) reads the same way. */
    bool plan_only;
    /* h-dsconf: what the spec names that means nothing here (DeepSpeed tuning
     * keys, Hugging Face logging names), ", "-separated, for the job's log
     * and the dry run; and the DeepSpeed file "deepspeed" named (resolved) */
    char ignored[2048];
    char deepspeed_file[PATH_MAX];
} job_spec;

/* Parse and validate a JSON document (text of `len` bytes) against the
 * daemon's config (paths must be under data_roots / output_root). */
int job_spec_parse(const char *text, size_t len, const acc_conf *conf, job_spec *out, acc_err *err);

/* The same for the planner (POST /v1/plan): every key and value checked
 * alike, paths resolved under the roots, but model.from's weights are
 * neither needed nor opened (config.json only, model_hf_config_only) and
 * `data` is optional. Sets plan_only. A spec accepted here may still be
 * refused by job_spec_parse (missing or bad weights, no data). */
int job_spec_parse_plan(const char *text, size_t len, const acc_conf *conf, job_spec *out, acc_err *err);

/* An input path as the spec's keys take one (relative to the first data
 * root; resolved; under data_roots; must exist) into `path` in place
 * (capacity n). ACC_EINVAL naming `field`. Opens nothing but resolves the
 * path: call it off the loop thread. */
int job_spec_resolve_input(char *path, size_t n, const acc_conf *conf, const char *field, acc_err *err);

#endif
