/* job_spec: a training job as submitted, parsed and validated.
 *
 * The public form is the JSON job spec of docs/api.md, which also
 * accepts DeepSpeed's batch keys and a nested "deepspeed" object. job_spec_parse()
 * (job_spec.c) turns it into this struct, resolving the batch triple so that
 * train_batch_size == micro_batch * accum_steps * devices always holds, and
 * reporting every problem as ACC_EINVAL with `field` set to the key path
 * ("optimizer.lr", "model.n_head"). The engine never reads this struct: the
 * jobs layer converts it once into a train_cfg (job_train_cfg.h), whose
 * sections (spec_model, spec_data, spec_optim, ...) it shares.
 */
#ifndef ACC_JOB_SPEC_H
#define ACC_JOB_SPEC_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#include "conf.h"
#include "err.h"
#include "train_cfg.h" /* the sections the engine reads: model_cfg.h, data_cfg.h, train_cfg.h */

#define SPEC_MAX_RESTARTS 100 /* max_restarts at most */

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
    /* the batch keys as written (0: absent or
     * "auto"): another world size (POST /v1/plan's hardware.devices)
     * resolves them through the same batch_split_resolve as submit */
    int given_batch, given_micro, given_accum;
    spec_precision precision;
    bool activation_checkpointing;
    int zero_stage;        /* zero_optimization.stage: 0 (replicas), 1 (AdamW moments
                            * sharded), 2 (and the reduced gradients: a reduce-scatter),
                            * 3 (and the parameters, gathered per block) */
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
    /* checkpoint_on_cancel (default true): a cancel
     * of a running job writes a checkpoint at the next micro-step boundary
     * unless no optimizer step completed since the last one */
    bool checkpoint_on_cancel;
    /* outputs the user owns: "output_dir"
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
    /* "lean_activations": attention without a T x T
     * buffer and the LM head + loss in chunks (model_config.lean_acts) */
    bool lean_activations;
    /* "activation_checkpointing": {"offload": true} (or DeepSpeed's
     * cpu_checkpointing): the recomputation's checkpoints in host memory
     * (activation_checkpointing is then true) */
    bool activation_offload;
    /* "eval_prompts": at most SPEC_EVAL_PROMPTS prompts (a
     * string) or conversations (an array of {"role", "content"}) answered at
     * each evaluation (train_samples.h); kept as their compact JSON array
     * text ("" = none), at most SPEC_EVAL_PROMPTS_BYTES bytes */
    char eval_prompts[SPEC_EVAL_PROMPTS_BYTES];
    /* zero_optimization.offload_optimizer: {"device": "cpu"} keeps the
     * AdamW moments and an fp32 master copy of each rank's range in host
     * memory and runs AdamW there (adamw.h); pin_memory page-locks them on
     * CUDA devices */
    bool offload_optimizer;
    bool offload_pin_memory;
    /* zero_optimization.offload_param: {"device": "cpu"} (stage 3 with
     * offload_optimizer only) keeps each rank's parameter partition and
     * its gradient partition in host memory (mem_plan.h
     * plan_host_params_bytes); pin_memory as offload_optimizer's */
    bool offload_param;
    bool offload_param_pin;
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
