/* mem_plan: the memory planner. Predicts one device's peak bytes for a job
 * spec and a micro batch, and lists the splits a job could run with.
 *
 * The prediction is the model family's own byte functions (model.h:
 * parameters + gradients + the trainer's slots, model_state_bytes;
 * activations for micro_batch x seq_len tokens, model_act_bytes, all
 * layers stored or recomputed, in bf16 with precision bf16:
 * plan_model_config sets model_config.act_bf16) and the optimizer's
 * (adamw.h: two moments). No backend allocates a per-micro-batch workspace
 * (bf16 linear layers take no device memory on any backend, kern_device.h
 * set_precision), so a bf16 row never needs more than its fp32 twin.
 * Nothing else is allocated while a job trains, so on CPU devices
 * the prediction is the measured peak to the byte; it does not depend on
 * gradient_accumulation_steps.
 *
 * ZeRO (spec zero_optimization.stage, docs/engine.md): from stage 1 a rank
 * holds the AdamW moments of its shard of the parameters only (adamw_shard:
 * rank 0's is the largest, so it is the job's peak); the parameters and
 * the gradient buffer stay whole at stages 1 and 2 (stage 2 accumulates the
 * micro-steps in the full buffer, as the gradients cross devices once per
 * step), so stage 2's bytes are stage 1's. Stage 3 partitions them too:
 * a rank holds its partition of parameters, gradients and moments plus
 * the gather slots (model_shard.h; rank 0's partition is the largest).
 * The spec-taking functions below predict rank 0 under the spec's stage
 * and devices.
 *
 * Optimizer offload (zero_optimization.offload_optimizer, adamw.h): the
 * moments leave the device (parts.optimizer 0, optim_bytes 0) and the
 * row's host.optimizer holds them with the master copy and the gradients'
 * copy of the rank's range, to the byte of the job's host_mem.
 *
 * Every size is overflow-checked (checked.h): a byte count past 2^64 is
 * UINT64_MAX here (it fits no budget), and plan_check_sizes() turns it into
 * ACC_EINVAL naming the spec field, so such a spec is refused at submit.
 *
 * A candidate micro batch m divides B / w (so a = B / (m w) is whole); it
 * fits a budget when its device bytes (the peak, plus on CUDA devices the
 * allocator's rounding and the runtime's memory: plan_parts) are at most
 * budget minus PLAN_MARGIN_PCT percent. The planner picks the largest m that fits (fewer micro-steps
 * run faster); when none fits in stored mode and recomputation is allowed
 * (spec activation_checkpointing or oom.adapt), the fallback is m = 1 with
 * recomputation. Pure functions: no device is touched, no state kept.
 */
#ifndef ACC_MEM_PLAN_H
#define ACC_MEM_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "err.h"
#include "train_cfg.h"
#include "kern_discover.h"
#include "model.h"

#define PLAN_MARGIN_PCT 5   /* safety margin kept free of the budget */
#define PLAN_MAX_ROWS 256   /* enough for every divisor of B/w below 10^7 */

/* A row's bytes by what holds them. The first five are the backend's
 * accounted allocations (their sum is peak_bytes: on CPU devices the
 * measured peak to the byte); the last two are what a device of the kind
 * holds beyond that (CUDA: the caching allocator's rounding of those
 * allocations, kern_cuda_alloc_size, and the runtime's memory outside the
 * accounting, kern_cuda_runtime_bytes; 0 on CPU devices). */
typedef struct plan_parts {
    uint64_t weights;       /* the parameters (fp32) */
    uint64_t gradients;     /* their gradients + the trainer's slots */
    uint64_t optimizer;     /* AdamW's two moments */
    uint64_t activations;   /* model_act_bytes for m x seq_len */
    uint64_t rounding;      /* allocator rounding of the above (CUDA: 512 B / 2 MiB blocks) */
    uint64_t runtime;       /* outside the accounting (CUDA: context, cuBLASLt, NCCL) */
} plan_parts;

/* A row's host bytes by part, per rank: what a rank keeps in host memory
 * (host_mem.h) because its mode puts it there, and the trainer's batch
 * buffers. Their sum is plan_row.host_bytes. */
typedef struct plan_host_parts {
    uint64_t batch;         /* the trainer's host batch buffers (inputs, targets, weights) */
    uint64_t optimizer;     /* offload_optimizer: what the optimizer keeps on the host */
    uint64_t params;        /* offload_param: the parameter partition on the host */
    uint64_t activations;   /* activation checkpoints kept on the host */
} plan_host_parts;

typedef struct plan_row {
    int micro_batch;        /* m, divides train_batch_size / devices */
    int accum_steps;        /* a = B / (m w) */
    bool recompute;         /* activation recomputation on */
    uint64_t state_bytes;   /* parameters, gradients, AdamW moments (rank 0's shard;
                               none on the device when offloaded) */
    uint64_t optim_bytes;   /* of which the AdamW moments (0 when offloaded) */
    uint64_t act_bytes;     /* activations for m x seq_len */
    uint64_t peak_bytes;    /* predicted per-device peak: state + activations
                               (the accounted bytes the device's budget limits) */
    plan_parts parts;       /* the same by part: weights + gradients + optimizer
                               + activations == peak_bytes */
    uint64_t device_bytes;  /* what a device of the kind must hold: peak_bytes
                               + parts.rounding + parts.runtime (CPU: peak_bytes) */
    bool fits;              /* device_bytes <= budget * (100 - PLAN_MARGIN_PCT) / 100 */
    plan_host_parts host;   /* host bytes of one rank by part */
    uint64_t host_bytes;    /* their sum */
} plan_row;

/* ---- host memory (plan_row.host) ------------------------------------
 *
 * A row's host bytes are per rank: every rank (a thread of the job's
 * trainer, or a rank process) holds its own batch buffers and, in the
 * offload modes, its own part of the offloaded state. A job's host bytes
 * on one host are its ranks there times the row's host_bytes
 * (plan_job_host_bytes); the daemon reserves that much of its
 * host_memory for the job while it runs, and the job's host_mem budget
 * (host_mem.h) is what of it the batch buffers leave. */

/* The trainer's host batch buffers of one rank, as trainer.c allocates them
 * for the largest split it may move to (mmax = max(B / w, m) samples of
 * seq_len T): the sample (T + 1 ints), inputs and targets (mmax T ints
 * each), the loss weights (mmax T floats), the target mask (2 T bytes) and,
 * with data.packing, the packed positions (mmax T ints). The same for every
 * row of a spec (mmax does not depend on m). UINT64_MAX on overflow. */
uint64_t plan_host_batch_bytes(const train_cfg *spec);
/* batch + optimizer + params + activations (saturated). */
uint64_t plan_host_sum(const plan_host_parts *h);
/* The host bytes of a job whose `ranks_here` ranks share one host at row r
 * (ranks_here x r->host_bytes, saturated). */
uint64_t plan_row_job_host_bytes(const plan_row *r, int ranks_here);

/* The spec's model config (from the spec, from init_from's file, or from
 * model.from's directory: its config.json and the weights' headers, or
 * config.json alone for a spec read by job_spec_parse_plan, plan_only),
 * with the spec's lora section applied. */
int plan_model_config(const train_cfg *spec, model_config *cfg, acc_err *err);

/* A rank's state, independent of the micro batch: the model's parameters,
 * gradients and the trainer's slots (model_state_bytes with TRAIN_SLOTS)
 * plus the AdamW moments of the whole buffer. UINT64_MAX on overflow. */
uint64_t plan_state_bytes(const model_config *cfg);
/* The same for rank `rank` of `world` under ZeRO stage `zero` (0 to 3):
 * its AdamW moments are those of its shard from stage 1; at stage 3 its
 * parameters, gradients and moments those of its partition plus the
 * gather slots (model_shard_state_bytes). */
uint64_t plan_rank_state_bytes(const model_config *cfg, int zero, int world, int rank);
/* Of which the AdamW moments. UINT64_MAX on overflow. */
uint64_t plan_optim_bytes(const model_config *cfg, int zero, int world, int rank);
/* offload_optimizer (train_cfg): the rank's state on its device is
 * plan_rank_state_bytes less the moments (offload true), and its host
 * memory holds the moments, an fp32 master copy of its range and the
 * range's gradients' copy (adamw_host_bytes: 4 floats an element of its
 * range; 0 without offload). UINT64_MAX on overflow. */
uint64_t plan_rank_device_state_bytes(const model_config *cfg, int zero, bool offload, int world, int rank);
uint64_t plan_host_optim_bytes(const model_config *cfg, int zero, bool offload, int world, int rank);
/* The same with offload_param (train_cfg; stage 3 only, else no effect):
 * the device no longer holds the partition's parameters (pn floats) nor
 * its gradient partition (rank 0's pn0 floats, model_shard.h): it keeps
 * the gather slots and the trainer's slots. The host holds the parameter
 * and gradient partitions (pn floats each) and a staging buffer of the
 * rank's largest slice (the reduce-scatter's download, added there):
 * plan_host_params_bytes, (2 pn + slice) 4 bytes; with offload_optimizer,
 * AdamW's master and gradients' copies are those partitions, so
 * plan_host_optim_bytes_op is the two moments only. With the optimizer
 * offloaded and not the parameters (model_config.grads_host, stage 3):
 * the gradient partition alone leaves the device (rank 0's pn0 floats),
 * plan_host_params_bytes is (pn + slice) 4 bytes (that partition and the
 * staging) and plan_host_optim_bytes_op the moments and the master (3
 * floats an element; the gradients' copy is the partition). UINT64_MAX on
 * overflow. */
uint64_t plan_rank_device_state_bytes_op(const model_config *cfg, int zero, bool offload, bool offload_param,
                                         int world, int rank);
uint64_t plan_host_optim_bytes_op(const model_config *cfg, int zero, bool offload, bool offload_param, int world,
                                  int rank);
uint64_t plan_host_params_bytes(const model_config *cfg, int zero, bool offload_param, int world, int rank);
/* A job's host bytes over all its ranks, as its host_mem budget counts
 * them (host_mem.h): the offloaded optimizer state of every rank. 0
 * without offload. ACC_EINVAL naming the field on overflow. */
int plan_host_bytes(const train_cfg *spec, uint64_t *bytes, acc_err *err);
/* State + activations for micro batch m: the rank's whole accounted peak. UINT64_MAX on overflow. */
uint64_t plan_peak_bytes(const model_config *cfg, int micro_batch, int seq_len, bool recompute);

/* The sizes a job of this spec computes from user numbers, checked: the
 * rank's state, the activations of its starting split in both modes (m = 1
 * for "auto", whose larger candidates saturate and so never fit), the host
 * batch buffers. ACC_EINVAL naming the field when one overflows 64 bits
 * (or the host's size_t). trainer_check_spec (submit) calls it. */
int plan_check_sizes(const train_cfg *spec, acc_err *err);

/* The host bytes of a rank that depend on the model's activation mode:
 * out->activations = the activation checkpoints in host memory
 * (model_act_host_bytes: act_offload with recompute; what model_acts_alloc
 * takes from the job's host_mem); the other parts 0. */
void plan_host_of(const model_config *cfg, int micro_batch, int seq_len, bool recompute,
                  plan_host_parts *out);

/* Predicted per-device peak for (spec, micro_batch, recompute). */
int plan_device_bytes(const train_cfg *spec, int micro_batch, bool recompute, uint64_t *bytes,
                      acc_err *err);

/* Bytes a device allocates for micro_batch x seq_len beyond the state:
 * the activations (model_act_bytes), on every kind and in either
 * precision (no backend has a per-micro-batch workspace). The whole per-m
 * part of the peak. UINT64_MAX on overflow. */
uint64_t plan_act_bytes(const model_config *cfg, int micro_batch, int seq_len, bool recompute);

/* Bytes of a budget the planner lets a job use (0 = unlimited: UINT64_MAX). */
uint64_t plan_usable_bytes(uint64_t budget);

/* The largest divisor of per_rank smaller than m, or 0 when m is 1. */
int plan_next_smaller_micro(int per_rank, int m);

/* Candidates for the spec against a per-device budget (0 = unlimited):
 * one row per divisor m of B/w, ascending, in the spec's mode
 * (activation_checkpointing), then, when the spec does not already
 * recompute and oom.adapt allows it, one more row: m = 1 with recompute.
 * Writes at most `max` rows, sets *n to the rows written and *chosen to the
 * index of the pick (-1: nothing fits). ACC_EINVAL when B is not a multiple
 * of w or the model config is invalid. */
int plan_candidates(const train_cfg *spec, uint64_t budget, plan_row *rows, int max, int *n,
                    int *chosen, acc_err *err);
/* The same for devices of `kind` (plan_candidates: CPU devices). */
int plan_candidates_on(const train_cfg *spec, kern_dev_kind kind, uint64_t budget, plan_row *rows,
                       int max, int *n, int *chosen, acc_err *err);
/* The same with a host of `host_memory` bytes for the job (0: unlimited):
 * a row whose job host bytes (spec->devices ranks on the host,
 * plan_row_job_host_bytes) exceed it does not fit either. */
int plan_candidates_hw(const train_cfg *spec, kern_dev_kind kind, uint64_t budget, uint64_t host_memory,
                       plan_row *rows, int max, int *n, int *chosen, acc_err *err);

/* A job's host bytes where it starts (plan_start_row of its candidates on
 * devices of `kind` with `budget` bytes, host unlimited; the first row
 * when no row is the start): *per_rank = that row's host_bytes, *job =
 * ranks_here x *per_rank. The daemon reserves *job of its host_memory. */
int plan_job_host_bytes(const train_cfg *spec, kern_dev_kind kind, uint64_t budget, int ranks_here,
                        uint64_t *per_rank, uint64_t *job, acc_err *err);

/* The row of plan_candidates_on's rows a job of
 * this spec starts with: the planner's pick for "auto"; the given micro
 * batch's row when it fits or oom.adapt is off (it will run out of memory
 * and fail); with oom.adapt and a given micro batch that does not fit, the
 * pick (the largest micro batch that fits, else m = 1 recomputing),
 * unless nothing fits (the given row: its first step says by how much).
 * -1 when the given micro batch has no row. The dry run, POST /v1/plan's
 * recommended row and the daemon's trainer (start_where_fits) share it. */
int plan_start_row(const train_cfg *spec, const plan_row *rows, int n, int chosen);

/* What the dry run says of the given micro batch (buf, "" when it fits or
 * is "auto"): that it does not fit, by how much, and what the daemon will
 * do (start at the planner's micro batch, or run out of memory and fail). */
void plan_start_note(const train_cfg *spec, const plan_row *rows, int n, int chosen, uint64_t budget, char *buf,
                     size_t len);

#endif
