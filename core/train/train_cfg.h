/* train_cfg: a training job's configuration as the engine owns it.
 *
 * The trainer, the planner, the optimizer and checkpoints read this struct;
 * none of them sees the service's job spec (job_spec.h), which the jobs
 * layer converts once into a train_cfg (job_spec_train_cfg,
 * core/jobs/job_train_cfg.h). The fields carry the spec's names, so a
 * message can name the key it is about: the batch triple always satisfies
 * train_batch_size == micro_batch * accum_steps * devices * nodes (the
 * world), as the spec resolved it (batch_split.h).
 *
 * The model and data layers see their parts only: model_cfg.h (spec_model,
 * spec_lora) and data_cfg.h (train_cfg_data).
 */
#ifndef ACC_TRAIN_CFG_H
#define ACC_TRAIN_CFG_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#include "data_cfg.h"
#include "model_cfg.h"

#define SPEC_EVAL_PROMPTS 16          /* eval_prompts: prompts at most */
#define SPEC_EVAL_PROMPTS_BYTES 16384 /* eval_prompts: bytes of their JSON text */

/* fp32: everything in fp32. bf16: the linear layers' products take bf16
 * operands with fp32 accumulation (kern_device.h set_precision) and the
 * activations are stored in bf16 between forward and backward
 * (model_config.act_bf16, blocks.h); at ZeRO stage 3 the gathered working
 * weights of the blocks' matrices are bf16 too (model_config.weights_bf16,
 * model_shard.h: the same bits); the master weights, gradients, optimizer
 * state and every other kernel stay fp32. */
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

#define SPEC_MAX_BATCH (1 << 24) /* train_batch_size at most */
#define SPEC_MAX_NODES 16
#define SPEC_MAX_WORLD 16 /* ranks of a job over its nodes (trainer.h TRAIN_MAX_RANKS) */

typedef struct train_cfg {
    char name[128];        /* the job's name, for messages */
    spec_model model;
    spec_data data;
    /* the batch triple: B = micro_batch * accum_steps * devices * nodes, always */
    int train_batch_size;
    int micro_batch;       /* train_micro_batch_size_per_gpu */
    int accum_steps;       /* gradient_accumulation_steps */
    int devices;           /* devices per node (the world size of a one-node job) */
    int nodes;             /* servers the job spans (rank processes over MPI); world = devices * nodes */
    bool micro_auto;       /* micro batch was "auto": the planner picks it */
    int given_batch, given_micro, given_accum; /* the batch keys as written (0: absent or "auto") */
    spec_precision precision;
    bool activation_checkpointing;
    bool lean_activations;      /* attention without T x T, chunked head + loss */
    bool activation_offload;    /* the recomputation's checkpoints (each block's input) in host
                                 * memory (host_mem.h); implies activation_checkpointing */
    int zero_stage;        /* 0 (replicas), 1 (AdamW moments sharded), 2 (and the reduced gradients),
                            * 3 (and the parameters: model_shard.h) */
    spec_optim optim;
    spec_lr lr;
    int max_steps;
    bool max_steps_given;  /* max_steps was in the spec */
    double num_train_epochs; /* 0 = not given; else max_steps = ceil(epochs x samples / B) */
    int eval_interval;     /* 0 = no eval */
    int eval_batches;      /* at most this many batches of B samples per eval (0: all) */
    int checkpoint_interval; /* 0 = only at the end */
    uint64_t seed;
    bool oom_adapt;        /* oom.adapt */
    bool checkpoint_on_cancel; /* a cancel writes a checkpoint at the next micro-step boundary */
    int save_total_limit;  /* keep the newest N checkpoints (0: the caller's checkpoint_keep) */
    char export_dir[PATH_MAX]; /* where the final export goes ("" = none) */
    char resume_from[PATH_MAX]; /* "" or a checkpoint directory */
    spec_save_dtype save_dtype; /* save.dtype (the fp32 master weights stay in state.safetensors) */
    spec_lora lora;             /* "lora" (r = 0: none) */
    bool merge_lora;            /* save.merge_lora: also the merged model */
    char output_dir[PATH_MAX];  /* the job's directory: checkpoints, logs */
    char data_roots[4 * PATH_MAX]; /* every input file is opened under these (safepath.h; "" = unrestricted) */
    char output_root[PATH_MAX];
    /* the job's unique id: its checkpoints carry it and it resumes only
     * those ("" = any checkpoint in output_dir is its own); adopt_unnamed:
     * also resume checkpoints that carry no id */
    char job_uid[40];
    bool adopt_unnamed;
    bool plan_only;        /* read to be planned, not run: model.from's config.json only, data optional */
    /* eval_prompts: their compact JSON array text ("" = none), answered at
     * each evaluation (train_samples.h) */
    char eval_prompts[SPEC_EVAL_PROMPTS_BYTES];
    /* zero_optimization.offload_optimizer "cpu": the AdamW moments, an
     * fp32 master copy of the rank's range and its reduced gradients in
     * host memory, AdamW on the host (adamw.h); offload_pin_memory:
     * page-locked where the device can (CUDA) */
    bool offload_optimizer;
    bool offload_pin_memory;
    /* zero_optimization.offload_param "cpu" (stage 3, with
     * offload_optimizer): the rank's parameter partition and gradient
     * partition in host memory, the device holding the gather slots only
     * (mem_plan.h plan_host_params_bytes); offload_param_pin: page-locked */
    bool offload_param;
    bool offload_param_pin;
} train_cfg;

/* The data layer's part of `c` (data_cfg.h), copied into `out`. */
void train_cfg_data(const train_cfg *c, data_cfg *out);

#endif
