/* plan_table: every way to run a job spec on given hardware, for
 * POST /v1/plan (the planner's question "does it fit on my card?").
 *
 * A way to run it is a variant: full fine-tune or LoRA, ZeRO stage 0, 1
 * or 2, activation recomputation off or on, the optimizer on the device
 * or offloaded to host memory. Each variant is a modified
 * copy of the spec (plan_variant_spec: lora on or off, zero stage,
 * recompute, devices = the hardware's, micro batch "auto", no OOM
 * fallback row) handed to the planner's own entry point,
 * plan_candidates_on(): so whatever the planner counts for a spec (the
 * model family's bytes, LoRA's frozen weights, ZeRO's shards, the
 * backend's rounding and runtime) the table counts, with no formula of
 * its own. A variant group holds one row per micro batch m dividing
 * B / w, ascending, and names the largest m that fits.
 *
 * Groups are built in the order of least change to a full fine-tune:
 * full before LoRA, ZeRO 0, 1, 2, recomputation off before on; then the
 * same modes recomputing from checkpoints in host memory
 * (activation_checkpointing.offload: fewer device bytes, the rows' host
 * bytes), in that order after all of them; then ZeRO-3 (a full
 * fine-tune's parameters partitioned) recompute off, on, on with host
 * checkpoints. Then all of that again with the optimizer offloaded
 * (zero_optimization.offload_optimizer "cpu": the AdamW moments, the fp32
 * master copy and the gradients' copy in host memory, the rows' host
 * optimizer bytes; at ZeRO-3 the gradients' copy is the gradient partition,
 * the rows' host params bytes), the most change of all: a setting without offload is
 * always suggested before one with it. LoRA rows
 * use the spec's lora section; a spec without one gets LoRA rows with
 * PEFT-style settings {r 16, alpha 32, target_modules "all-linear"} when
 * its family takes LoRA (model_lora_apply accepts them), none otherwise.
 * A variant that cannot run is left out (plan_variant_available): ZeRO
 * 1/2 with one device.
 *
 * The recommended row is what the dry run (and the trainer) would start
 * with on that hardware: the spec's own variant, its micro batch when it
 * divides B / w, else the planner's pick (largest fitting m, else m = 1
 * with recomputation when oom.adapt allows it). The suggested row, when
 * the recommended one does not fit, is the first group's largest fitting
 * row in the order above. Pure: no device is touched.
 */
#ifndef ACC_PLAN_TABLE_H
#define ACC_PLAN_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "mem_plan.h"

/* The hardware planned for: one kind, `devices` devices of
 * `device_memory` bytes each (0: unlimited), on one host whose jobs may
 * keep `host_memory` bytes in host memory (0: unlimited): a row fits when
 * its device bytes fit a device and its job host bytes (devices x the
 * row's host_bytes) fit host_memory. */
typedef struct plan_hw {
    kern_dev_kind kind;
    uint64_t device_memory;
    int devices;
    uint64_t host_memory;
} plan_hw;

typedef struct plan_variant {
    bool lora;         /* LoRA adapters on a frozen base (false: every weight trains) */
    int zero_stage;    /* 0, 1 (AdamW moments sharded), 2 (and gradients), 3 (and parameters) */
    bool recompute;    /* activation recomputation */
    bool qlora;        /* LoRA on a 4-bit NF4 base (model.quantize "nf4";
                        * lora is then true too): mode "qlora" */
    bool act_offload;  /* with recompute: the checkpoints in host memory
                        * (activation_checkpointing.offload); the rows' host bytes */
    bool offload_optimizer; /* the optimizer state in host memory
                             * (zero_optimization.offload_optimizer "cpu"); the rows' host bytes */
    bool offload_param;     /* ZeRO-3's parameter and gradient partitions in host memory
                             * (zero_optimization.offload_param "cpu"; with offload_optimizer,
                             * and on one device too) */
} plan_variant;

typedef struct plan_group {
    plan_variant v;
    int first, n;      /* its rows: rows[first, first + n), ascending m */
    int best;          /* index (in rows) of the largest fitting m; -1: none fits */
} plan_group;

#define PLAN_MAX_GROUPS 63 /* 30 variants on the device, the same 30 with the optimizer offloaded, ZeRO-3 with
                            * the parameters offloaded too (recompute off / on / on+host) */

typedef struct plan_table {
    plan_hw hw;
    plan_row *rows;    /* every group's rows, group after group */
    int nrows;
    plan_group groups[PLAN_MAX_GROUPS];
    int ngroups;
    int recommended;   /* index in rows of the dry run's start; -1: not in the table */
    int recommended_group;
    int suggested;     /* first group's largest fitting row; -1: nothing fits */
    int suggested_group;
    /* the spec's given micro batch: whether it fits,
     * and plan_start_note's words when it does not ("" otherwise) */
    bool given_fits;
    char start_note[768];
} plan_table;

/* The spec as submitted with devices = w: its
 * batch keys as written (given_*) resolved again at world w through
 * batch_split_resolve, as submit would with "devices": w; the same 400
 * (ACC_EINVAL naming "train_batch_size") for a triple that does not hold
 * there. A spec without given keys (built in code) keeps its triple. */
int plan_spec_at_world(train_cfg *spec, int w, acc_err *err);

/* The limit row r exceeds on hw: NULL (it fits), "device_memory" or
 * "host_memory". */
const char *plan_row_limit(const plan_row *r, const plan_hw *hw);

/* Whether the planner can count variant v for this spec on hw. */
bool plan_variant_available(const train_cfg *spec, const plan_hw *hw, const plan_variant *v);

/* The spec as variant v runs on hw: *out = *spec with devices = hw's,
 * activation_checkpointing = v's, micro batch "auto", no OOM fallback,
 * LoRA, the ZeRO stage and offload_optimizer set as v says. ACC_EINVAL naming
 * "hardware.devices" when train_batch_size is not a multiple of it. */
int plan_variant_spec(const train_cfg *spec, const plan_hw *hw, const plan_variant *v, train_cfg *out,
                      acc_err *err);

/* The table (rows allocated; plan_table_free). Errors are the planner's
 * (ACC_EINVAL naming the field) or ACC_ENOMEM. */
int plan_table_build(const train_cfg *spec, const plan_hw *hw, plan_table *t, acc_err *err);
void plan_table_free(plan_table *t);

/* Why row r does not fit a device of hw.device_memory bytes ("" when it
 * fits), with the numbers: the model state alone, or the whole peak; or,
 * when the device holds it, the host: the job's host bytes by part against
 * hw.host_memory. */
void plan_row_why(const plan_row *r, const plan_hw *hw, char *buf, size_t n);

/* A byte count as a JSON integer (signed 64-bit): an overflowed
 * (saturated) size shows as the largest value, never a negative one. */
json_int_t plan_bytes_json(uint64_t b);

/* The mode a row's variant is listed under: "full", "lora" or "qlora" (NULL: "full");
 * whether the optimizer is offloaded is the rows' and groups' own field
 * (offload_optimizer), not part of the mode. */
const char *plan_mode_name(const plan_variant *v);

/* Row r of variant v (NULL: a full fine-tune, ZeRO 0) on hw, the one JSON
 * view of a row (POST /v1/plan's rows, the dry run's candidates): mode,
 * zero_stage, the split, the bytes by part, peak_bytes, device_bytes,
 * fits and why_not, act_offload and offload_optimizer (the variant's);
 * the host bytes of one rank by part (host_batch_bytes,
 * host_optimizer_bytes, host_params_bytes, host_activations_bytes) and
 * their sum host_bytes, job_host_bytes (hw.devices ranks), host_fits, and
 * limit: null when the row fits, else "device_memory" or "host_memory"
 * (the device's first when both are exceeded). NULL when out of memory. */
json_t *plan_row_json(const plan_row *r, const plan_variant *v, const plan_hw *hw);

#endif
