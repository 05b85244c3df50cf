/* mem_plan: see mem_plan.h. */
#include "mem_plan.h"
#include "model_shard.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adamw.h"
#include "batch_split.h"
#include "checked.h"
#include "model_hf.h"
#include "model_lora.h"
#include "safepath.h"
#include "trainer.h"

static int base_config(const train_cfg *spec, model_config *cfg, acc_err *err)
{
    if (spec->model.from[0] != '\0' && spec->plan_only) /* planning: config.json only */
        return model_hf_config_only(spec->data_roots, spec->model.from, cfg, err);
    if (spec->model.from[0] != '\0') /* a Hugging Face directory: its headers only */
        return model_hf_validate_under(spec->data_roots, spec->model.from, cfg, err);
    if (spec->model.init_from[0] == '\0')
        return model_config_from_spec(&spec->model, cfg, err);
    /* under the data roots, read through the descriptor checked (safepath.h) */
    int fd;
    int rc = sp_open_file(spec->data_roots, spec->model.init_from, "model.init_from", &fd, NULL, 0, err);
    if (rc != 0)
        return rc;
    rc = model_config_from_fd(fd, spec->model.init_from, &spec->model, cfg, err);
    close(fd);
    return rc;
}

/* model.quantize "nf4": the decoder's linear weights
 * quantized at load, with double quantization (QLoRA's recipe). */
static int quantize_config(const train_cfg *spec, model_config *cfg, acc_err *err)
{
    if (!spec->model.quantize_nf4 || cfg->quant_in_files) /* a 4-bit directory is already */
        return 0;
    cfg->quant = MODEL_QUANT_NF4;
    cfg->quant_nested = true;
    if (model_nf4_count(cfg) == 0) {
        cfg->quant = MODEL_QUANT_NONE;
        return acc_err_set(err, ACC_EINVAL, "model.quantize",
                           "model.quantize: the %s model has no linear layer NF4 can hold (its "
                           "blocks' weights are not nn.Linear ones)", model_family_of(cfg)->name);
    }
    return 0;
}

int plan_model_config(const train_cfg *spec, model_config *cfg, acc_err *err)
{
    int rc = base_config(spec, cfg, err);
    if (rc == 0)
        rc = quantize_config(spec, cfg, err);
    if (rc == 0) {
        cfg->lean_acts = spec->lean_activations;
        cfg->act_bf16 = spec->precision == SPEC_BF16; /* bf16: the activations stored in bf16 too (blocks.h) */
        /* bf16 at stage 3: the gathered working weights in bf16 too (model_shard.h) */
        cfg->weights_bf16 = spec->precision == SPEC_BF16 && spec->zero_stage >= 3;
        /* and, with the fp32 master in the optimizer's host memory, the
         * device partition's matrices (offload_param keeps it there itself) */
        cfg->partition_bf16 = cfg->weights_bf16 && spec->offload_optimizer && !spec->offload_param;
        /* stage 3 with the optimizer offloaded, not the parameters: the
         * gradient partition in host memory (offload_param has it there
         * already; stages 0-2 keep their gradient buffer whole on the device) */
        cfg->grads_host = spec->zero_stage >= 3 && spec->offload_optimizer && !spec->offload_param;
        cfg->lean_tokens = spec->lean_activations; /* in recompute mode: model.h */
        cfg->act_offload = spec->activation_offload;
    }
    if (rc == 0) /* the lora section against the model's modules */
        rc = model_lora_apply(&spec->lora, spec->merge_lora, cfg, err);
    return rc;
}

/* The AdamW range of rank `rank` of `world` under ZeRO stage `zero`: the
 * whole trainable range at stage 0, the rank's shard of it from stage 1
 * (adamw_shard, as the trainer creates it). */
static void optim_range(const model_config *cfg, int zero, int world, int rank, size_t *lo, size_t *hi)
{
    size_t n = model_num_trainable(cfg); /* AdamW covers the trainable prefix (LoRA: the adapters) */
    *lo = 0;
    *hi = n;
    model_shard_sizes z;
    if (zero >= 3) /* the rank's partition (model_shard.h), whole in its order */
        *hi = model_shard_sizes_of(cfg, rank, world, &z, NULL) == 0 ? z.pn : n;
    else if (zero >= 1 && world > 1)
        adamw_shard(n, rank, world, lo, hi);
}

uint64_t plan_optim_bytes(const model_config *cfg, int zero, int world, int rank)
{
    size_t lo, hi;
    uint64_t b;
    optim_range(cfg, zero, world, rank, &lo, &hi);
    return adamw_state_bytes(lo, hi, &b, NULL) == 0 ? b : ACC_SIZE_OVERFLOW;
}

/* ZeRO-3's state by part: the partition's weights and the parameter
 * slots, its gradients with the trainer's slots and the gradient slots,
 * its moments. */
static int state_parts_z3(const model_config *cfg, int world, int rank, size_t lo, size_t hi,
                          plan_parts *p, acc_err *err)
{
    int rc = model_shard_state_bytes(cfg, TRAIN_SLOTS, rank, world, &p->weights, &p->gradients, err);
    if (rc == 0)
        rc = adamw_state_bytes(lo, hi, &p->optimizer, err);
    return rc;
}

/* Rank `rank`'s state by part, as the allocations are made (model.c:
 * parameters, then gradients + the trainer's slots; adamw.c: the moments of
 * its range under ZeRO stage `zero`), or an error naming the field. */
static int state_parts(const model_config *cfg, int zero, int world, int rank, plan_parts *p,
                       acc_err *err)
{
    uint64_t model_b;
    size_t lo, hi;
    memset(p, 0, sizeof *p);
    optim_range(cfg, zero, world, rank, &lo, &hi);
    if (zero >= 3) /* the partition and the gather slots (model_shard.h) */
        return state_parts_z3(cfg, world, rank, lo, hi, p, err);
    int rc = model_state_bytes(cfg, TRAIN_SLOTS, &model_b, err);
    if (rc == 0)
        rc = adamw_state_bytes(lo, hi, &p->optimizer, err);
    if (rc != 0)
        return rc;
    p->weights = acc_sat_mul_u64(model_num_params(cfg), sizeof(float));
    p->weights = p->weights <= model_b ? p->weights : model_b;
    p->gradients = model_b - p->weights;
    size_t ntrain = model_num_trainable(cfg);
    if (ntrain < model_num_params(cfg)) {
        /* LoRA: the gradient buffer covers the
         * adapters (and the trainer's slots) only, and a 16-bit frozen base
         * holds less than 4 bytes a parameter: the rest is weights */
        uint64_t g = acc_sat_mul_u64(acc_sat_add_u64(ntrain, TRAIN_SLOTS), sizeof(float));
        p->gradients = g <= model_b ? g : model_b;
        p->weights = model_b - p->gradients;
    }
    return 0;
}

/* The state's bytes of rank `rank` (rank 0: the largest shard, the job's
 * peak), or an error naming the field. */
static int state_bytes_z(const model_config *cfg, int zero, int world, int rank, uint64_t *bytes,
                         acc_err *err)
{
    plan_parts p;
    int rc = state_parts(cfg, zero, world, rank, &p, err);
    if (rc == 0 && (acc_add_u64(p.weights, p.gradients, bytes) || acc_add_u64(*bytes, p.optimizer, bytes)))
        rc = acc_err_set(err, ACC_EINVAL, "model", "the model's state overflows 64-bit sizes");
    if (rc != 0)
        *bytes = ACC_SIZE_OVERFLOW;
    return rc;
}

/* Rank `rank`'s state on its device: state_parts without the moments when
 * the optimizer is offloaded (they live in host memory: host_optim). */
static int device_state_parts(const model_config *cfg, int zero, bool offload, int world, int rank, plan_parts *p,
                              acc_err *err)
{
    int rc = state_parts(cfg, zero, world, rank, p, err);
    if (rc == 0 && offload)
        p->optimizer = 0;
    return rc;
}

/* offload_param (stage 3): the partition's parameters (pn floats) and
 * gradients (rank 0's pn0, where the trainer's slots start) leave the
 * device; the gather slots and the trainer's slots stay. What leaves, in
 * bytes, by part. */
static int offload_param_moved(const model_config *cfg, int world, int rank, uint64_t *weights, uint64_t *grads)
{
    model_shard_sizes z, z0;
    if (model_shard_sizes_of(cfg, rank, world, &z, NULL) != 0 || model_shard_sizes_of(cfg, 0, world, &z0, NULL) != 0)
        return ACC_EINVAL;
    *weights = (uint64_t)z.pn * sizeof(float); /* at most nparams: 4 bytes each fit */
    *grads = (uint64_t)z0.pn * sizeof(float);
    return 0;
}

/* What leaves the device at stage 3 (bytes by part): offload_param's
 * parameters and gradients, or with cfg.grads_host the gradient partition
 * alone (the same pn0 floats: the trainer's slots stay); 0 otherwise. */
static int host_moved(const model_config *cfg, int zero, bool offload_param, int world, int rank,
                      uint64_t *weights, uint64_t *grads)
{
    *weights = *grads = 0;
    if (zero < 3 || (!offload_param && !cfg->grads_host))
        return 0;
    int rc = offload_param_moved(cfg, world, rank, weights, grads);
    if (!offload_param)
        *weights = 0;
    return rc;
}

/* device_state_parts less what stays in host memory (host_moved). */
static void host_moved_parts(const model_config *cfg, int zero, bool offload_param, int world, int rank,
                             plan_parts *p)
{
    uint64_t w, g;
    if (host_moved(cfg, zero, offload_param, world, rank, &w, &g) != 0)
        return;
    p->weights = p->weights >= w ? p->weights - w : 0;
    p->gradients = p->gradients >= g ? p->gradients - g : 0;
}

static int state_bytes(const train_cfg *spec, const model_config *cfg, uint64_t *bytes, acc_err *err)
{
    int rc = state_bytes_z(cfg, spec->zero_stage, spec->devices, 0, bytes, err);
    if (rc == 0 && spec->offload_optimizer)
        *bytes -= plan_optim_bytes(cfg, spec->zero_stage, spec->devices, 0);
    uint64_t w, g;
    if (rc == 0 && host_moved(cfg, spec->zero_stage, spec->offload_param, spec->devices, 0, &w, &g) == 0)
        *bytes -= w + g;
    return rc;
}

uint64_t plan_rank_device_state_bytes(const model_config *cfg, int zero, bool offload, int world, int rank)
{
    uint64_t b = plan_rank_state_bytes(cfg, zero, world, rank);
    return offload && b != ACC_SIZE_OVERFLOW ? b - plan_optim_bytes(cfg, zero, world, rank) : b;
}

uint64_t plan_rank_device_state_bytes_op(const model_config *cfg, int zero, bool offload, bool offload_param,
                                         int world, int rank)
{
    uint64_t b = plan_rank_device_state_bytes(cfg, zero, offload, world, rank), w, g;
    if (b == ACC_SIZE_OVERFLOW)
        return b;
    if (host_moved(cfg, zero, offload_param, world, rank, &w, &g) != 0)
        return ACC_SIZE_OVERFLOW;
    return b - w - g;
}

uint64_t plan_host_optim_bytes(const model_config *cfg, int zero, bool offload, int world, int rank)
{
    size_t lo, hi;
    uint64_t b;
    if (!offload)
        return 0;
    optim_range(cfg, zero, world, rank, &lo, &hi);
    return adamw_host_bytes(lo, hi, &b, NULL) == 0 ? b : ACC_SIZE_OVERFLOW;
}

uint64_t plan_host_optim_bytes_op(const model_config *cfg, int zero, bool offload, bool offload_param, int world,
                                  int rank)
{
    size_t lo, hi;
    uint64_t b;
    if (!offload || zero < 3 || (!offload_param && !cfg->grads_host))
        return plan_host_optim_bytes(cfg, zero, offload, world, rank);
    optim_range(cfg, zero, world, rank, &lo, &hi);
    if (!offload_param) /* grads_host: the gradients' copy is the host gradient partition */
        return adamw_host_bytes_grads_on(lo, hi, &b, NULL) == 0 ? b : ACC_SIZE_OVERFLOW;
    /* the master copy and the gradients' copy are the host partitions */
    return adamw_state_bytes(lo, hi, &b, NULL) == 0 ? b : ACC_SIZE_OVERFLOW;
}

uint64_t plan_host_params_bytes(const model_config *cfg, int zero, bool offload_param, int world, int rank)
{
    model_shard_sizes z;
    if (zero < 3 || (!offload_param && !cfg->grads_host))
        return 0;
    if (model_shard_sizes_of(cfg, rank, world, &z, NULL) != 0)
        return ACC_SIZE_OVERFLOW;
    /* parameters (offload_param), gradients, the staging of one slice (each
     * at most nparams floats) */
    return ((uint64_t)z.pn * (offload_param ? 2 : 1) + z.slice) * sizeof(float);
}

/* plan_host_bytes for the spec's resolved config. */
static int host_bytes(const train_cfg *spec, const model_config *cfg, uint64_t *bytes, acc_err *err)
{
    int w = spec->devices > 0 ? spec->devices : 1;
    *bytes = 0;
    for (int r = 0; r < w; r++)
        *bytes = acc_sat_add_u64(acc_sat_add_u64(*bytes, plan_host_optim_bytes_op(cfg, spec->zero_stage,
                                                                                spec->offload_optimizer,
                                                                                spec->offload_param, w, r)),
                                 plan_host_params_bytes(cfg, spec->zero_stage, spec->offload_param, w, r));
    if (*bytes == ACC_SIZE_OVERFLOW)
        return acc_err_set(err, ACC_EINVAL, "zero_optimization.offload_optimizer",
                           "the offloaded optimizer state overflows 64-bit sizes");
    return 0;
}

int plan_host_bytes(const train_cfg *spec, uint64_t *bytes, acc_err *err)
{
    model_config cfg;
    *bytes = 0;
    int rc = plan_model_config(spec, &cfg, err);
    return rc != 0 ? rc : host_bytes(spec, &cfg, bytes, err);
}

uint64_t plan_state_bytes(const model_config *cfg)
{
    return plan_rank_state_bytes(cfg, 0, 1, 0);
}

uint64_t plan_rank_state_bytes(const model_config *cfg, int zero, int world, int rank)
{
    uint64_t b;
    state_bytes_z(cfg, zero, world, rank, &b, NULL);
    return b;
}

uint64_t plan_peak_bytes(const model_config *cfg, int micro_batch, int seq_len, bool recompute)
{
    return acc_sat_add_u64(plan_state_bytes(cfg), plan_act_bytes(cfg, micro_batch, seq_len, recompute));
}

int plan_device_bytes(const train_cfg *spec, int micro_batch, bool recompute, uint64_t *bytes,
                      acc_err *err)
{
    model_config cfg;
    int rc = plan_model_config(spec, &cfg, err);
    if (rc != 0)
        return rc;
    if (micro_batch < 1)
        return acc_err_set(err, ACC_EINVAL, "train_micro_batch_size_per_gpu", "must be >= 1");
    uint64_t state, acts;
    if ((rc = state_bytes(spec, &cfg, &state, err)) != 0 ||
        (rc = model_act_bytes(&cfg, micro_batch, spec->model.seq_len, recompute, &acts, err)) != 0)
        return rc;
    if (acc_add_u64(state, acts, bytes))
        return acc_err_set(err, ACC_EINVAL, "train_micro_batch_size_per_gpu",
                           "a device's bytes overflow 64-bit sizes");
    return 0;
}

int plan_check_sizes(const train_cfg *spec, acc_err *err)
{
    model_config cfg;
    int rc = plan_model_config(spec, &cfg, err);
    if (rc != 0)
        return rc;
    int T = spec->model.seq_len, w = spec->devices > 0 ? spec->devices : 1;
    /* the starting split ("auto": the planner picks among rows whose
     * saturated sizes cannot fit, so m = 1 is what must be computable) */
    int m0 = spec->micro_batch > 0 ? spec->micro_batch : 1;
    int mmax = spec->train_batch_size / w > m0 ? spec->train_batch_size / w : m0;
    uint64_t state, acts = 0, host;
    if ((rc = state_bytes(spec, &cfg, &state, err)) != 0 || (rc = host_bytes(spec, &cfg, &host, err)) != 0)
        return rc;
    /* both modes: an out-of-memory may switch recomputation on */
    for (int rec = 1; rc == 0 && rec >= 0; rec--) /* stored (rec = 0) last: the larger */
        rc = model_act_bytes(&cfg, m0, T, rec, &acts, err);
    if (rc != 0)
        return rc;
    if (acc_add_u64(state, acts, &state))
        return acc_err_set(err, ACC_EINVAL, "train_micro_batch_size_per_gpu",
                           "a device's bytes overflow 64-bit sizes");
    /* the checkpoints in host memory of the largest split */
    uint64_t ck = model_act_host_bytes(&cfg, mmax, T, 1);
    if (ck == ACC_SIZE_OVERFLOW || ck > SIZE_MAX)
        return acc_err_set(err, ACC_EINVAL, "activation_checkpointing.offload",
                           "the activation checkpoints of %d x %d tokens overflow host sizes", mmax, T);
    /* the trainer's host batch buffers of the largest split (mmax x T) */
    host = plan_host_batch_bytes(spec);
    if (host == ACC_SIZE_OVERFLOW || host > SIZE_MAX)
        return acc_err_set(err, ACC_EINVAL, "train_batch_size",
                           "the host batch buffers of %d x %d tokens overflow", mmax, T);
    return 0;
}

uint64_t plan_act_bytes(const model_config *cfg, int micro_batch, int seq_len, bool recompute)
{
    uint64_t acts;
    if (model_act_bytes(cfg, micro_batch, seq_len, recompute, &acts, NULL) != 0)
        return ACC_SIZE_OVERFLOW;
    return acts;
}

uint64_t plan_usable_bytes(uint64_t budget)
{
    if (budget == 0)
        return UINT64_MAX;
    return budget / 100 * (100 - PLAN_MARGIN_PCT) + budget % 100 * (100 - PLAN_MARGIN_PCT) / 100;
}

int plan_next_smaller_micro(int per_rank, int m)
{
    batch_split s = {.B = per_rank, .m = m, .a = 1, .w = 1};
    return batch_split_smaller_micro(&s);
}

/* ZeRO-3's state as model_shard_create allocates it, into allocs[0, 1]
 * (the partition's fp32 parameters, its gradients + the trainer's slots)
 * and allocs[5..11] (two parameter slots, the gradient slot, the ends'
 * two, the bf16 working weights' fetch scratch, a bf16 partition's
 * matrices). */
static void z3_allocs(const model_config *cfg, int world, bool offload_param, uint64_t *allocs)
{
    model_shard_sizes z; /* rank 0's: the planner's row is rank 0's */
    if (model_shard_sizes_of(cfg, 0, world, &z, NULL) != 0)
        return;
    uint64_t f = sizeof(float);
    allocs[0] = (z.pn - z.pn_b16) * f;
    allocs[1] = (z.pn + TRAIN_SLOTS) * f;
    allocs[11] = z.pn_b16 * sizeof(uint16_t);
    if (offload_param) /* the parameters on the host */
        allocs[0] = 0;
    if (offload_param || cfg->grads_host) /* the gradients on the host: the device keeps the trainer's slots */
        allocs[1] = TRAIN_SLOTS * f;
    allocs[5] = allocs[6] = model_shard_pslot_bytes(&z);
    allocs[7] = z.slot * f;
    allocs[8] = allocs[9] = z.ends * f;
    allocs[10] = z.fetch * f;
}

/* The row's peak by part: the state's parts (state_parts), the
 * activations (plan_act_bytes); then what the backend holds beyond: its
 * allocator's rounding of each allocation (parameters, gradients, each
 * moment, the activations) and its runtime's memory. */
static void row_parts(const model_config *cfg, const train_cfg *spec, const kern_ops *ops, plan_row *r)
{
    plan_parts *p = &r->parts;
    if (device_state_parts(cfg, spec->zero_stage, spec->offload_optimizer, spec->devices, 0, p, NULL) != 0)
        memset(p, 0, sizeof *p);
    else
        host_moved_parts(cfg, spec->zero_stage, spec->offload_param, spec->devices, 0, p);
    p->activations = r->act_bytes;
    uint64_t allocs[] = {p->weights, p->gradients, p->optimizer / 2, p->optimizer - p->optimizer / 2,
                         p->activations, 0, 0, 0, 0, 0, 0, 0};
    if (spec->zero_stage >= 3) /* the partition's buffers and the slots, one allocation each */
        z3_allocs(cfg, spec->devices, spec->offload_param, allocs);
    p->rounding = 0;
    for (size_t i = 0; i < sizeof allocs / sizeof allocs[0]; i++)
        if (allocs[i] != 0 && allocs[i] != ACC_SIZE_OVERFLOW) {
            uint64_t rounded = kern_alloc_size(ops, allocs[i]); /* saturated near 2^64: no rounding then */
            if (rounded > allocs[i])
                p->rounding = acc_sat_add_u64(p->rounding, rounded - allocs[i]);
        }
    p->runtime = kern_runtime_bytes(ops);
    r->device_bytes = acc_sat_add_u64(r->peak_bytes, acc_sat_add_u64(p->rounding, p->runtime));
}

/* ---- host memory ----------------------------------------------------- */

uint64_t plan_host_batch_bytes(const train_cfg *spec)
{
    int w = spec->devices > 0 ? spec->devices : 1;
    uint64_t T = spec->model.seq_len > 0 ? (uint64_t)spec->model.seq_len : 0;
    uint64_t mmax = (uint64_t)(spec->train_batch_size / w);
    if (spec->micro_batch > 0 && (uint64_t)spec->micro_batch > mmax)
        mmax = (uint64_t)spec->micro_batch;
    uint64_t tokens = acc_sat_mul_u64(mmax, T);
    /* trainer.c rank_setup: sample, inputs, targets, weights, mask, pos */
    uint64_t b = acc_sat_mul_u64(T + 1, sizeof(int));
    b = acc_sat_add_u64(b, acc_sat_mul_u64(tokens, 2 * sizeof(int) + sizeof(float)));
    b = acc_sat_add_u64(b, acc_sat_mul_u64(T, 2));
    if (spec->data.packing)
        b = acc_sat_add_u64(b, acc_sat_mul_u64(tokens, sizeof(int)));
    return b;
}

uint64_t plan_host_sum(const plan_host_parts *h)
{
    return acc_sat_add_u64(acc_sat_add_u64(h->batch, h->optimizer), acc_sat_add_u64(h->params, h->activations));
}

uint64_t plan_row_job_host_bytes(const plan_row *r, int ranks_here)
{
    return acc_sat_mul_u64(r->host_bytes, (uint64_t)(ranks_here > 0 ? ranks_here : 1));
}

/* The row's host parts this file knows (the batch buffers, the host
 * activation checkpoints; the optimizer's and the parameters' parts are
 * set by their modes' own row functions before it), then
 * host_bytes, the sum: call it last. */
static void row_host(const model_config *cfg, const train_cfg *spec, plan_row *r)
{
    r->host.batch = plan_host_batch_bytes(spec);
    r->host.activations = model_act_host_bytes(cfg, r->micro_batch, spec->model.seq_len, r->recompute);
    r->host_bytes = plan_host_sum(&r->host);
}

void plan_host_of(const model_config *cfg, int micro_batch, int seq_len, bool recompute,
                  plan_host_parts *out)
{
    memset(out, 0, sizeof *out);
    out->activations = model_act_host_bytes(cfg, micro_batch, seq_len, recompute);
}

static plan_row make_row(const model_config *cfg, const train_cfg *spec, const batch_split *split,
                         bool recompute, uint64_t usable, kern_dev_kind kind)
{
    int m = split->m;
    plan_row r = {.micro_batch = m, .accum_steps = split->a, .recompute = recompute};
    bool off = spec->offload_optimizer, offp = spec->offload_param;
    r.state_bytes = plan_rank_device_state_bytes_op(cfg, spec->zero_stage, off, offp, spec->devices, 0);
    r.optim_bytes = off ? 0 : plan_optim_bytes(cfg, spec->zero_stage, spec->devices, 0);
    r.act_bytes = plan_act_bytes(cfg, m, spec->model.seq_len, recompute);
    r.peak_bytes = acc_sat_add_u64(r.state_bytes, r.act_bytes); /* UINT64_MAX never fits */
    row_parts(cfg, spec, kern_backend_ops(kind), &r);
    row_host(cfg, spec, &r);
    r.fits = r.device_bytes <= usable;
    /* offload_optimizer: moments, master copy and gradients' copy of rank 0's range */
    r.host.optimizer = plan_host_optim_bytes_op(cfg, spec->zero_stage, off, offp, spec->devices, 0);
    /* stage 3 host partitions: offload_param's parameters and gradients, or
     * grads_host's gradients; one slice's staging */
    r.host.params = plan_host_params_bytes(cfg, spec->zero_stage, offp, spec->devices, 0);
    r.host_bytes = acc_sat_add_u64(acc_sat_add_u64(r.host.batch, r.host.optimizer),
                                   acc_sat_add_u64(r.host.params, r.host.activations));
    return r;
}

/* The pick: the largest fitting row of the spec's own mode (the first
 * `nmain` rows, ascending in m), else the recompute fallback if it fits. */
static int pick(const plan_row *rows, int nmain, int n)
{
    for (int i = nmain - 1; i >= 0; i--)
        if (rows[i].fits)
            return i;
    return n > nmain && rows[nmain].fits ? nmain : -1;
}

int plan_candidates(const train_cfg *spec, uint64_t budget, plan_row *rows, int max, int *n,
                    int *chosen, acc_err *err)
{
    return plan_candidates_on(spec, KERN_DEV_CPU, budget, rows, max, n, chosen, err);
}

int plan_candidates_on(const train_cfg *spec, kern_dev_kind kind, uint64_t budget, plan_row *rows,
                       int max, int *n, int *chosen, acc_err *err)
{
    return plan_candidates_hw(spec, kind, budget, 0, rows, max, n, chosen, err);
}

/* Rows whose job host bytes exceed host_memory (0: unlimited) do not fit. */
static void host_limit(const train_cfg *spec, uint64_t host_memory, plan_row *rows, int n)
{
    for (int i = 0; host_memory != 0 && i < n; i++)
        if (plan_row_job_host_bytes(&rows[i], spec->devices) > host_memory)
            rows[i].fits = false;
}

int plan_candidates_hw(const train_cfg *spec, kern_dev_kind kind, uint64_t budget, uint64_t host_memory,
                       plan_row *rows, int max, int *n, int *chosen, acc_err *err)
{
    *n = 0;
    *chosen = -1;
    if (spec->devices < 1 || spec->train_batch_size < 1 ||
        spec->train_batch_size % spec->devices != 0)
        return acc_err_set(err, ACC_EINVAL, "train_batch_size",
                           "train_batch_size %d is not divisible by %d (world)",
                           spec->train_batch_size, spec->devices);
    model_config cfg;
    int rc = plan_model_config(spec, &cfg, err);
    if (rc == 0)
        rc = plan_check_sizes(spec, err);
    if (rc != 0)
        return rc;
    int per_rank = spec->train_batch_size / spec->devices;
    batch_split one, split;
    if ((rc = batch_split_make(spec->train_batch_size, 1, per_rank, spec->devices, 0, &one, err)) != 0)
        return rc;
    uint64_t usable = plan_usable_bytes(budget);
    bool rec = spec->activation_checkpointing;
    for (int m = 1; m <= per_rank && *n < max; m++)
        if (batch_split_with_micro(&one, m, &split) == 0)
            rows[(*n)++] = make_row(&cfg, spec, &split, rec, usable, kind);
    int nmain = *n;
    if (!rec && spec->oom_adapt && *n < max)
        rows[(*n)++] = make_row(&cfg, spec, &one, true, usable, kind);
    host_limit(spec, host_memory, rows, *n);
    *chosen = pick(rows, nmain, *n);
    return 0;
}

int plan_job_host_bytes(const train_cfg *spec, kern_dev_kind kind, uint64_t budget, int ranks_here,
                        uint64_t *per_rank, uint64_t *job, acc_err *err)
{
    *per_rank = *job = 0;
    plan_row *rows = calloc(PLAN_MAX_ROWS, sizeof *rows);
    if (rows == NULL)
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    int n = 0, chosen = -1;
    int rc = plan_candidates_on(spec, kind, budget, rows, PLAN_MAX_ROWS, &n, &chosen, err);
    if (rc == 0 && n > 0) {
        int s = plan_start_row(spec, rows, n, chosen);
        const plan_row *r = &rows[s >= 0 ? s : 0];
        *per_rank = r->host_bytes;
        *job = plan_row_job_host_bytes(r, ranks_here);
    }
    free(rows);
    return rc;
}

/* ---- where a job starts ---------------------------- */

static int given_row(const train_cfg *spec, const plan_row *rows, int n)
{
    for (int i = 0; i < n; i++)
        if (rows[i].micro_batch == spec->micro_batch && rows[i].recompute == spec->activation_checkpointing)
            return i;
    return -1;
}

int plan_start_row(const train_cfg *spec, const plan_row *rows, int n, int chosen)
{
    if (spec->micro_auto)
        return chosen;
    int g = given_row(spec, rows, n);
    if (g < 0 || rows[g].fits || !spec->oom_adapt || chosen < 0)
        return g;
    return chosen;
}

static double mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

void plan_start_note(const train_cfg *spec, const plan_row *rows, int n, int chosen, uint64_t budget, char *buf,
                     size_t len)
{
    buf[0] = '\0';
    int g = spec->micro_auto ? -1 : given_row(spec, rows, n);
    if (g < 0 || rows[g].fits)
        return;
    int s = plan_start_row(spec, rows, n, chosen);
    char what[256];
    if (s >= 0 && s != g)
        snprintf(what, sizeof what,
                 "with oom.adapt the job starts at micro batch %d x %d accumulation steps%s, the largest the "
                 "planner says fits (predicted peak %.1f MiB)",
                 rows[s].micro_batch, rows[s].accum_steps, rows[s].recompute ? " with recomputation" : "",
                 mib(rows[s].device_bytes));
    else if (spec->oom_adapt)
        snprintf(what, sizeof what,
                 "no micro batch fits: the job starts at it and its first step runs out of memory with the numbers");
    else
        snprintf(what, sizeof what,
                 "oom.adapt is off: the job will run out of memory in its first step and fail");
    snprintf(buf, len,
             "train_micro_batch_size_per_gpu %d does not fit: predicted peak %.1f MiB per device, %.1f MiB "
             "usable of the %.1f MiB device (%d%% kept free); %s",
             rows[g].micro_batch, mib(rows[g].device_bytes), mib(plan_usable_bytes(budget)), mib(budget),
             PLAN_MARGIN_PCT, what);
}
