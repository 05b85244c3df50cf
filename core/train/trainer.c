/* trainer: see trainer.h and trainer_run.h.
 *
 * One thread per rank. Each rank owns a device, a full model replica and a
 * cursor into the shared sample order. An optimizer step is:
 *   1. count the target tokens of the whole effective batch (all ranks, all
 *      micro-steps) -- every rank can, since the order is known in advance;
 *   2. accum_steps micro-steps: forward with per-token weights
 *      mask/N_total, backward summed into the grads buffer, no communication;
 *   3. the step's loss sum goes into the grads buffer's spare slots and the
 *      whole buffer is all-reduced once, in buckets that start during the
 *      last micro-step's backward as soon as their layers' gradients are
 *      complete (on GPUs they travel on their own stream while the earlier
 *      layers' backward runs; see grad_bucket below);
 *   4. global-norm clip, AdamW, zero grads -- identically on every rank, so
 *      the replicas stay bitwise equal without a broadcast.
 *
 * ZeRO (spec zero_stage; docs/engine.md; the stages are rows of zero.h,
 * which the trainer calls through). Stage 1: each rank's AdamW owns
 * the moments of its shard of the parameters only (adamw_shard); after the
 * all-reduce it updates that shard and an all-gather of the parameters
 * makes the replicas whole again. Stage 2: the step's reduction is a
 * reduce-scatter instead (the same buckets, overlapping the last backward
 * the same way; the tail slots are still summed into every rank), each
 * rank holds the sums of its shard only and updates it, then the same
 * all-gather. The gradient buffer stays whole (the micro-steps accumulate
 * into it; gradients cross devices once per step). The global norm is, at
 * every stage, the rank-order sum of the w shards' partial sums of squares
 * (exchanged exactly at stage 2, computed locally otherwise), so losses
 * and weights are bit-identical across stages on CPU devices.
 * Rank 0 publishes the events; the last rank to finish publishes TEV_DONE.
 *
 * Out of memory (invariant 4, docs/invariants.md; the agreement and the rule are oom.h's).
 * Activations are allocated per split, at the start of a step attempt,
 * apart from the state (weights, gradients, AdamW moments), which is
 * allocated once. A rank whose allocation fails with ACC_EOOM records it
 * and joins the step's one reduction with a flag in a spare slot of the
 * gradient buffer; when the reduced flag is set every rank drops the
 * step, takes the next split by oom_next_split and redoes the step with
 * the same samples. A post-agreement barrier keeps the ranks' OOM records
 * stable while rank 0 reports them.
 */
#include "trainer.h"

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt.h"
#include "data.h"
#include "data_prep.h"
#include "export.h"
#include "host_mem.h"
#include "kern_comm.h"
#include "kern_device.h"
#include "adamw.h"
#include "batch_split.h"
#include "checked.h"
#include "mem_plan.h"
#include "model_lora.h"
#include "model.h"
#include "model_shard.h"
#include "model_hf.h"
#include "oom.h"
#include "optim.h"
#include "safepath.h"
#include "trainer_run.h"
#include "zero.h"
#include "train_samples.h"

/* The trainer's span at the end of the gradient buffer (TRAIN_SLOTS
 * floats past the parameters' gradients, model_opts.grad_tail): what it
 * means is the trainer's alone; the model only zeroes and reduces it. */
enum { SLOT_LOSS = 0, SLOT_OOM = 2, SLOT_STOP = 3, SLOT_EVAL = 4, SLOT_NORM = 8 };
/* SLOT_NORM: 3 floats per rank, a shard's partial sum of squares (ZeRO 2) */
_Static_assert(SLOT_NORM + 3 * TRAIN_MAX_RANKS <= TRAIN_SLOTS, "the norm's slots fit the tail");

/* One bucket of the step's gradient reduction: started once the backward of
 * the last micro-step has finished layer `after_layer` (-1: everything,
 * the embeddings included; the final bucket also carries the spare slots).
 * The plan depends only on the model and the bucket size, so every rank
 * makes the same calls in the same order, which the collectives require. */
typedef struct grad_bucket {
    int after_layer;
    int nspans;
    kern_span spans[MODEL_MAX_GRAD_SPANS];
} grad_bucket;

typedef struct rank_ctx {
    struct trainer *t;
    int rank;
    pthread_t thread;
    int started;
} rank_ctx;

struct trainer {
    train_cfg spec;
    /* the job's host memory, shared by the ranks of this process
     * (trainer.h "Host memory"); rank_state.host points here */
    host_mem host;
    const zero_ops *zero;      /* the row of spec.zero_stage (zero.h) */
    /* what the start resolved, kept here (the spec is never written):
     * the starting split (the planner's pick for "auto", a resumed
     * checkpoint's, else the spec's) and the schedule's lengths
     * (num_train_epochs and lr.warmup_ratio resolved once the data is open) */
    int micro0, accum0;
    optim_steps steps;
    kern_device_info devs[TRAIN_MAX_RANKS];
    int nranks, threads;
    train_event_fn on_event;
    void *event_ctx;
    train_hooks *hooks;

    model_config cfg;
    data_source *train, *val;  /* opened by rank 0 before the first barrier */
    kern_comm *comm;
    int own_comm;              /* comm is the trainer's (threads), else the caller's */
    int first_rank, local_ranks; /* the ranks run here: all, or one rank process */
    kern_comm *ext_comm;       /* a rank process: the caller's comm (MPI), else NULL */
    atomic_int cancel;
    atomic_int preempt;        /* cancel for a shutdown: checkpoint first */
    /* ZeRO: a shutdown asks every rank to stop together after the step in
     * progress (the request rides its reduction, SLOT_STOP), so that the
     * sharded moments can still be gathered for the checkpoint */
    atomic_int stop_asked;
    atomic_int stepped;        /* a step of this run completed (rank 0) */
    /* a cancel with spec.checkpoint_on_cancel: the
     * run checkpoints its last completed step as a shutdown does, unless
     * that step is already saved (rank_state.last_saved) */
    atomic_int cancel_ckpt;
    int keep;                  /* checkpoints kept */
    char resume_dir[PATH_MAX]; /* checkpoint to start from, or "" */
    int resume_fd;             /* that checkpoint directory, open (safepath.h), or -1 */
    int start_step;            /* its step (0 without one) */
    int rejected;              /* checkpoints passed over at resume */
    atomic_int live;           /* ranks not yet finished */

    pthread_mutex_t mu;        /* guards status/msg */
    int status;
    char msg[512];

    /* each rank writes its own entry before the step's all-reduce; rank 0
     * reads them all after it, while others may already write the next */
    atomic_uint_least64_t mem_in_use[TRAIN_MAX_RANKS], mem_peak[TRAIN_MAX_RANKS];
    atomic_uint_least64_t mem_reserved[TRAIN_MAX_RANKS], mem_free[TRAIN_MAX_RANKS];
    rank_ctx ranks[TRAIN_MAX_RANKS];
    /* each rank's optimizer and gradient bytes, written once at setup */
    uint64_t mem_optim[TRAIN_MAX_RANKS], mem_grads[TRAIN_MAX_RANKS];
    oom_record oom[TRAIN_MAX_RANKS];
    int recompute0;            /* initial activation recomputation */
    int auto_split;            /* micro batch "auto": may move up at checkpoints */
    uint64_t min_budget;       /* smallest device budget of the job (0 = none) */
    char plan_note[512];       /* the planner's pick for "auto", or "" */
    int start_where_fits;      /* trainer_opts.start_where_fits */
    int steps_done;            /* written by rank 0 */
    int joined;
    pthread_t launcher;        /* async_start: prepares, then starts the ranks */
    int launcher_started;
    /* eval_prompts, encoded by rank 0 at its first
     * evaluation (samples_off: they could not be) */
    tsamp *samples;
    int samples_off;
};

/* Per-rank loop state. `host` is the job's host-memory budget (the
 * trainer's host_mem): what the rank keeps in host memory by choice is
 * allocated from it (host_mem_alloc), so it counts against the job's
 * reservation and the planner's host parts. */
typedef struct rank_state {
    trainer *t;
    host_mem *host;
    int rank;
    int last_saved;   /* step of this rank's latest checkpoint, or the one resumed from */
    kern_device *dev;
    model *model;
    adamw *opt;       /* the AdamW moments of [zlo, zhi) */
    size_t zlo, zhi;  /* the parameters this rank updates: all, or its ZeRO shard */
    data_order order;
    batch_split split; /* the split now (B = m a w; OOM lowers m, "auto" raises it) */
    int recompute;    /* activation recomputation now */
    int done;         /* optimizer steps applied to this rank's weights */
    int oom_ceiling;  /* smallest micro batch that ran out of memory (0 = none) */
    float extra[TRAIN_SLOTS]; /* host copy of the trainer's slots */
    grad_bucket *buckets; /* the reduction plan, [nbuckets], last one after_layer -1 */
    int nbuckets;
    int next_bucket;  /* first bucket not yet started this step */
    int bucket_rc;    /* first failed start this step (0 = none) */
    double step_loss_sum; /* this rank's loss sum of the step (for the slots) */
    /* the step's loss-carrying targets and real input tokens, all ranks
     * (count_targets) */
    double step_targets, step_inputs;
    int step_oom;     /* this rank ran out of memory in this step attempt */
    int stop;         /* ZeRO: every rank agreed to stop for a shutdown */
    int *sample;      /* [T+1] */
    int *inputs, *targets; /* [m*T] */
    float *weights;   /* [m*T] */
    uint8_t *mask;    /* [2T] */
    int *pos;         /* [m*T] packed documents' positions (model.positions), else NULL */
} rank_state;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* First failure wins; cancellations caused by it do not overwrite it. */
static void record_status(trainer *t, int code, const char *msg)
{
    pthread_mutex_lock(&t->mu);
    if (t->status == 0) {
        t->status = code;
        snprintf(t->msg, sizeof t->msg, "%s", msg);
    }
    pthread_mutex_unlock(&t->mu);
}

static void fail(trainer *t, const acc_err *e)
{
    record_status(t, e->code ? e->code : ACC_EINTERNAL, e->msg);
    kern_comm_abort(t->comm);
}

static void emit(trainer *t, train_event *ev)
{
    if (t->on_event != NULL)
        t->on_event(t->event_ctx, ev);
}

/* ---- the spec checks shared by trainer_check_spec and trainer_start */

static int check_split(const train_cfg *s, int micro, int accum, acc_err *err)
{
    /* first: "auto" below must not skip it (the rank tables have TRAIN_MAX_RANKS entries) */
    if (s->devices > TRAIN_MAX_RANKS)
        return acc_err_set(err, ACC_EINVAL, "devices", "at most %d devices per job",
                           TRAIN_MAX_RANKS);
    if (s->micro_auto && s->devices >= 1 && s->train_batch_size >= 1 &&
        s->train_batch_size % s->devices == 0 && micro < 1)
        return 0; /* the planner picks m at trainer_start */
    batch_split split;
    int rc = batch_split_make(s->train_batch_size, micro, accum, s->devices,
                              TRAIN_MAX_RANKS, &split, err);
    if (rc != 0)
        return rc;
    if (s->max_steps < 0)
        return acc_err_set(err, ACC_EINVAL, "max_steps", "must be >= 0");
    return 0;
}

/* The spec's own split. */
static int check_batch(const train_cfg *s, acc_err *err)
{
    return check_split(s, s->micro_batch, s->accum_steps, err);
}

static int resolve_config(const train_cfg *s, model_config *cfg, acc_err *err)
{
    return plan_model_config(s, cfg, err);
}

static void emit_log(trainer *t, int step, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void emit_progress(trainer *t, const char *stage, uint64_t done, uint64_t total, int max_steps)
{
    train_event *ev = calloc(1, sizeof *ev);
    if (ev == NULL)
        return;
    ev->kind = TEV_PROGRESS;
    ev->nranks = t != NULL ? t->nranks : 0;
    snprintf(ev->path, sizeof ev->path, "%s", stage);
    ev->done = done;
    ev->total = total;
    ev->max_steps = max_steps;
    if (t != NULL)
        emit(t, ev);
    free(ev);
}

static void on_prep_progress(void *ctx, const char *stage, uint64_t done, uint64_t total)
{
    emit_progress(ctx, stage, done, total, 0);
}

/* A JSONL file tokenized (or read from the cache) on every core. */
static int open_prepared(trainer *t, const train_cfg *s, const char *path, const char *field,
                         data_source **out, acc_err *err)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    data_cfg dc;
    train_cfg_data(s, &dc);
    prep_opts po = {.spec = &dc, .path = path, .field = field, .threads = cores > 0 ? (int)cores : 1,
                    .progress = t != NULL ? on_prep_progress : NULL, .ctx = t,
                    .cancel = t != NULL ? &t->cancel : NULL};
    prep_samples ps;
    int rc = prep_load(&po, &ps, err);
    if (rc != 0)
        return rc;
    if (t != NULL)
        emit_log(t, 0,
                 "%s: %llu samples from %llu records (%s): %llu truncated and %llu dropped over seq_len+1 = "
                 "%d tokens, %llu without a token that carries loss; %llu tokens",
                 field, (unsigned long long)ps.n, (unsigned long long)ps.lines,
                 ps.from_cache ? "prepared data from the cache" : "tokenized", (unsigned long long)ps.truncated,
                 (unsigned long long)ps.dropped, s->model.seq_len + 1, (unsigned long long)ps.no_target,
                 (unsigned long long)ps.ntokens);
    return data_open_prepared(&ps, s->model.seq_len, s->data.packing, field, out, err);
}

static int open_data(trainer *t, const train_cfg *s, data_source **train, data_source **val, acc_err *err)
{
    *train = *val = NULL;
    int rc;
    if (spec_data_is_jsonl(s->data.format)) {
        rc = open_prepared(t, s, s->data.train, "data.train", train, err);
        if (rc == 0 && s->data.val[0] != '\0')
            rc = open_prepared(t, s, s->data.val, "data.val", val, err);
    } else {
        rc = data_open_under(s->data_roots, s->data.train, s->data.format, s->model.seq_len,
                             s->model.vocab_size, "data.train", train, err);
        if (rc == 0 && s->data.val[0] != '\0')
            rc = data_open_under(s->data_roots, s->data.val, s->data.format, s->model.seq_len,
                                 s->model.vocab_size, "data.val", val, err);
    }
    if (rc != 0) {
        data_close(*train);
        *train = NULL;
    }
    return rc;
}

/* num_train_epochs without max_steps: max_steps = ceil(epochs x samples / B). */
static int steps_from_epochs(trainer *t, acc_err *err)
{
    const train_cfg *s = &t->spec;
    if (s->num_train_epochs <= 0 || s->max_steps_given)
        return 0;
    double steps = ceil(s->num_train_epochs * (double)data_num_samples(t->train) / s->train_batch_size);
    if (!(steps >= 1 && steps <= 100000000))
        return acc_err_set(err, ACC_EINVAL, "num_train_epochs",
                           "num_train_epochs %g over %llu samples is %g steps, outside [1, 100000000]",
                           s->num_train_epochs, (unsigned long long)data_num_samples(t->train), steps);
    t->steps.max_steps = (int)steps;
    /* h-dsconf: warmup_ratio (Hugging Face's) of the total now known */
    if (s->lr.warmup_ratio > 0 && s->lr.warmup_steps == 0)
        t->steps.warmup_steps =
            (int)ceil(s->lr.warmup_ratio * (s->lr.total_steps > 0 ? s->lr.total_steps : t->steps.max_steps));
    emit_progress(t, "ready", data_num_samples(t->train), data_num_samples(t->train), t->steps.max_steps);
    emit_log(t, 0, "max_steps %d from num_train_epochs %g x %llu samples / train_batch_size %d", t->steps.max_steps,
             s->num_train_epochs, (unsigned long long)data_num_samples(t->train), s->train_batch_size);
    return 0;
}

int trainer_check_spec(const train_cfg *spec, acc_err *err)
{
    model_config cfg;
    int rc = check_batch(spec, err);
    if (rc == 0)
        rc = resolve_config(spec, &cfg, err);
    if (rc == 0) /* every size from the spec's numbers fits 64 bits */
        rc = plan_check_sizes(spec, err);
    if (rc == 0)
        rc = ckpt_check_resume_from(spec->output_root, spec->resume_from, &cfg, spec->max_steps, err);
    data_source *tr = NULL, *va = NULL;
    if (rc == 0 && spec->data.packing && !model_family_of(&cfg)->packing)
        return acc_err_set(err, ACC_EINVAL, "data.packing",
                           "data.packing: the %s family cannot keep packed documents apart (use llama)",
                           model_family_of(&cfg)->name);
    if (rc == 0 && spec_data_is_jsonl(spec->data.format)) { /* bounded: the whole file is read later */
        data_cfg dc;
        train_cfg_data(spec, &dc);
        return prep_validate(&dc, err);
    }
    if (rc == 0)
        rc = open_data(NULL, spec, &tr, &va, err);
    data_close(tr);
    data_close(va);
    return rc;
}

int trainer_device_bytes(const train_cfg *spec, uint64_t *bytes, acc_err *err)
{
    return plan_device_bytes(spec, spec->micro_batch, spec->activation_checkpointing, bytes,
                             err);
}

/* ---- one rank */

/* The state bytes of the job's largest rank (rank 0's ZeRO shard is the
 * largest): the same number on every rank, so that decisions from it agree. */
static uint64_t job_state_bytes(const trainer *t)
{
    return plan_rank_device_state_bytes_op(&t->cfg, t->zero->stage, t->spec.offload_optimizer,
                                           t->spec.offload_param, t->nranks, 0);
}

/* The state alone does not fit: no split can help. */
static int state_oom(rank_state *rs, acc_err *err)
{
    uint64_t need = plan_rank_device_state_bytes_op(&rs->t->cfg, rs->t->zero->stage,
                                                    rs->t->spec.offload_optimizer, rs->t->spec.offload_param,
                                                    rs->t->nranks, rs->rank);
    return acc_err_set(err, ACC_EOOM, "",
                       "out of memory: %s need %llu bytes "
                       "per device, device %s has a budget of %llu bytes",
                       rs->t->spec.offload_optimizer ? "parameters and gradients (the optimizer is offloaded)"
                                                     : "parameters, gradients and AdamW state",
                       (unsigned long long)need,
                       rs->dev->info.name,
                       (unsigned long long)rs->dev->budget);
}

/* The weights a job starts from: model.from (a Hugging Face directory),
 * else init_from (the family's native file), else the seed; then LoRA's
 * adapters. */
static int init_base(rank_state *rs, acc_err *err)
{
    const train_cfg *s = &rs->t->spec;
    int rc;
    if (s->model.from[0] != '\0') { /* a Hugging Face directory, one tensor at a time */
        rc = model_hf_load_under(rs->model, s->data_roots, s->model.from, err);
    } else if (s->model.init_from[0] == '\0') {
        rc = model_init_seed(rs->model, s->seed, err);
    } else { /* under the data roots, read through the descriptor checked */
        int fd;
        rc = sp_open_file(s->data_roots, s->model.init_from, "model.init_from", &fd, NULL, 0, err);
        if (rc != 0)
            return rc;
        rc = model_load_fd(rs->model, fd, s->model.init_from, err);
        close(fd);
    }
    if (rc == 0) /* LoRA: the adapters, from the seed (B = 0) */
        rc = model_lora_init(rs->model, s->seed, err);
    return rc;
}

/* The starting weights: a checkpoint to resume (weights, moments, step),
 * else init_base's. A LoRA checkpoint holds the adapters only (ckpt.h):
 * the frozen base is loaded as at the start first. */
static int init_weights(rank_state *rs, acc_err *err)
{
    trainer *t = rs->t;
    if (t->resume_fd >= 0) {
        ckpt_state st;
        int rc = rs->model->cfg.lora.r > 0 ? init_base(rs, err) : 0;
        return rc != 0 ? rc : ckpt_load_at(t->resume_fd, t->resume_dir, rs->model, rs->opt, &st, err);
    }
    return init_base(rs, err);
}

/* Cut the gradient buffer into buckets of about `bytes` each, walking the
 * layers from the last (whose gradients are complete first) to the first;
 * the rest, with the embeddings, the final LayerNorm and the spare slots,
 * is the final bucket. */
static int plan_buckets(rank_state *rs, size_t bytes, acc_err *err)
{
    const model *m = rs->model;
    int L = m->cfg.n_layer;
    rs->buckets = calloc((size_t)L + 1, sizeof *rs->buckets);
    if (rs->buckets == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory for the bucket plan");
    int n = 0, hi = L;
    size_t acc = 0; /* bytes of layers [l, hi) */
    for (int l = L - 1; l >= 1; l--) {
        acc += model_layout_layer_train_floats(&m->layout, l) * sizeof(float);
        if (acc < bytes)
            continue;
        grad_bucket *b = &rs->buckets[n++];
        b->after_layer = l;
        b->nspans = model_grad_spans(m, l, hi, 0, b->spans);
        hi = l;
        acc = 0;
        if (b->nspans < 0)
            return acc_err_set(err, ACC_EINTERNAL, "", "a gradient bucket needs too many spans");
        if (b->nspans == 0) /* nothing of these layers' is reduced here (ZeRO-3) */
            n--;
    }
    grad_bucket *last = &rs->buckets[n++];
    last->after_layer = -1;
    last->nspans = model_grad_spans(m, 0, hi, 1, last->spans);
    rs->nbuckets = n;
    if (last->nspans < 0)
        return acc_err_set(err, ACC_EINTERNAL, "", "a gradient bucket needs too many spans");
    return 0;
}

/* Host bytes of this rank's offloaded optimizer (adamw_host_bytes; without
 * the gradients' copy where that is the model's host partition). */
static uint64_t host_optim_bytes(const rank_state *rs)
{
    uint64_t b = 0;
    if (model_shard_grads_on_host(rs->model))
        adamw_host_bytes_grads_on(rs->zlo, rs->zhi, &b, NULL);
    else
        adamw_host_bytes(rs->zlo, rs->zhi, &b, NULL);
    return b;
}

/* A bf16 partition (model_config.partition_bf16): the master range of a
 * host step back into the store, its matrices narrowed. */
static void store_master(void *ctx, const float *master, size_t lo, size_t hi, void *stage)
{
    model_shard_store_range(ctx, master, lo, hi, stage);
}

/* The AdamW of [zlo, zhi): its state on the device, or in the job's host
 * memory with offload_optimizer (adamw.h; AdamW then runs on the host on
 * the job's kernel threads). */
static int create_optimizer(rank_state *rs, acc_err *err)
{
    trainer *t = rs->t;
    if (!t->spec.offload_optimizer)
        return adamw_create(rs->dev, rs->zlo, rs->zhi, &rs->opt, err);
    model *m = rs->model;
    if (model_shard_params_on_host(m)) /* offload_param: AdamW on the host partitions themselves */
        return adamw_create_host_on(rs->dev, &t->host, t->threads, rs->zlo, rs->zhi, m->params + rs->zlo,
                                    model_shard_host_grads(m) + rs->zlo, &rs->opt, err);
    int rc = model_shard_grads_on_host(m) /* grads_host: from the host gradient partition itself */
                 ? adamw_create_host_grads_on(rs->dev, &t->host, t->threads, t->spec.offload_pin_memory, rs->zlo,
                                              rs->zhi, model_shard_host_grads(m) + rs->zlo, &rs->opt, err)
                 : adamw_create_host(rs->dev, &t->host, t->threads, t->spec.offload_pin_memory, rs->zlo, rs->zhi,
                                     &rs->opt, err);
    if (rc == 0 && model_shard_bf16_partition(m)) { /* the master is the store's fp32 values */
        if (rs->zlo != 0 || rs->zhi != m->nheld)
            return acc_err_set(err, ACC_EINTERNAL, "", "a bf16 partition needs the optimizer over all of it");
        model_shard_set_master(m, rs->opt->master);
        adamw_set_store(rs->opt, store_master, m);
    }
    if (rc == 0 && t->hooks != NULL)
        t->hooks->host_optim[rs->rank] = host_optim_bytes(rs);
    return rc;
}

static int rank_setup(rank_state *rs, acc_err *err)
{
    trainer *t = rs->t;
    const train_cfg *s = &t->spec;
    int T = s->model.seq_len, m = t->micro0;
    int rc = batch_split_make(s->train_batch_size, m, t->accum0, t->nranks, TRAIN_MAX_RANKS,
                              &rs->split, err);
    if (rc != 0)
        return rc;
    rs->recompute = t->recompute0;
    omp_set_num_threads(t->threads);
    rc = kern_device_open(&t->devs[rs->rank], t->threads, &rs->dev, err);
    if (rc == 0) /* bf16: the linear layers' products (kern_device.h) */
        rc = rs->dev->ops->set_precision(rs->dev, s->precision == SPEC_BF16, err);
    if (rc == 0)
        rc = kern_comm_bind(t->comm, rs->rank, rs->dev, err);
    model_opts mo = {.B = 0, .T = T, .grad_tail = TRAIN_SLOTS};
    if (t->zero->params_sharded) { /* ZeRO-3: each rank holds its partition */
        mo.comm = t->comm;
        mo.rank = rs->rank;
        mo.world = t->nranks;
        mo.host_params = s->offload_param ? &t->host : NULL; /* offload_param: the partition on the host */
        mo.host_params_pin = s->offload_param_pin;
        /* the optimizer offloaded, not the parameters: the gradient partition on the host */
        mo.host_grads = t->cfg.grads_host ? &t->host : NULL;
        mo.host_grads_pin = s->offload_pin_memory;
    }
    if (rc == 0 && (rc = model_create_ex(rs->dev, &t->cfg, &mo, &rs->model, err)) == ACC_EOOM)
        return state_oom(rs, err);
    if (rc == 0) {
        rs->model->host = &t->host; /* activation checkpoints in host memory */
        t->zero->keep(rs->model->nheld, rs->rank, t->nranks, &rs->zlo, &rs->zhi);
    }
    uint64_t before = rs->dev != NULL ? rs->dev->in_use : 0;
    if (rc == 0 && (rc = create_optimizer(rs, err)) == ACC_EOOM)
        return state_oom(rs, err);
    if (rc == 0) { /* measured, for the step events and the tests */
        t->mem_optim[rs->rank] = rs->dev->in_use - before;
        t->mem_grads[rs->rank] = ((size_t)(rs->model->gtail - rs->model->grads) + rs->model->grad_tail) * sizeof(float);
        if (t->hooks != NULL) {
            t->hooks->mem_optim[rs->rank] = t->mem_optim[rs->rank];
            t->hooks->mem_grads[rs->rank] = t->mem_grads[rs->rank];
        }
    }
    if (rc == 0)
        rc = init_weights(rs, err);
    /* offloaded: the host's master copy of the range starts as the weights
     * (a bf16 partition's uploads wrote it: the device has bf16 matrices) */
    if (rc == 0 && !model_shard_bf16_partition(rs->model))
        adamw_load_master(rs->opt, rs->model->params);
    if (rc == 0) {
        train_hooks *h = t->hooks;
        rc = plan_buckets(rs, h != NULL && h->bucket_bytes > 0 ? h->bucket_bytes : TRAIN_BUCKET_BYTES,
                          err);
    }
    if (rc != 0)
        return rc;
    rs->sample = malloc((size_t)(T + 1) * sizeof *rs->sample);
    /* host batch buffers for the largest split, so the micro batch can move up */
    int mmax = s->train_batch_size / t->nranks;
    if (mmax < m)
        mmax = m;
    uint64_t tokens;
    if (acc_mul_u64((uint64_t)mmax, (uint64_t)T, &tokens) || tokens > SIZE_MAX / sizeof(int))
        return acc_err_set(err, ACC_EINVAL, "model.seq_len",
                           "host batch buffers of %d x %d tokens overflow", mmax, T);
    rs->inputs = malloc((size_t)tokens * sizeof *rs->inputs);
    rs->targets = malloc((size_t)tokens * sizeof *rs->targets);
    rs->weights = malloc((size_t)tokens * sizeof *rs->weights);
    rs->mask = malloc(2 * (size_t)T); /* the data's mask, then the hook's */
    if (s->data.packing && (rs->pos = malloc((size_t)tokens * sizeof *rs->pos)) == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory for batch buffers");
    rs->model->positions = rs->pos; /* filled with each micro-batch */
    if (!rs->sample || !rs->inputs || !rs->targets || !rs->weights || !rs->mask)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory for batch buffers");
    if (t->hooks != NULL) /* as allocated: the planner's host.batch predicts it */
        t->hooks->host_batch[rs->rank] = (uint64_t)(T + 1) * sizeof *rs->sample +
                                         tokens * (sizeof *rs->inputs + sizeof *rs->targets + sizeof *rs->weights) +
                                         2 * (uint64_t)T + (rs->pos != NULL ? tokens * sizeof *rs->pos : 0);
    return 0;
}

static void rank_teardown(rank_state *rs)
{
    free(rs->sample);
    free(rs->inputs);
    free(rs->targets);
    free(rs->weights);
    free(rs->mask);
    free(rs->pos);
    free(rs->buckets);
    data_order_free(&rs->order);
    adamw_free(rs->opt);
    model_free(rs->model);
    kern_device_close(rs->dev);
}

/* The targets of sample `id` that carry loss: the data's mask (prepared
 * samples: train_on, padding), and the test hook's on top. rs->sample
 * holds the sample's tokens afterwards. */
static void fill_mask(rank_state *rs, uint64_t id)
{
    train_hooks *h = rs->t->hooks;
    int T = rs->t->spec.model.seq_len;
    data_sample_masked(rs->t->train, id, rs->sample, rs->mask);
    if (h != NULL && h->target_mask != NULL) {
        uint8_t *hm = rs->mask + T;
        h->target_mask(h->mask_ctx, id, T, hm);
        for (int i = 0; i < T; i++)
            rs->mask[i] = rs->mask[i] && hm[i];
    }
}

/* Target tokens of the whole step, over every rank and micro-step; its
 * real input tokens (padding excluded) in rs->step_inputs. */
static double count_targets(rank_state *rs, int step)
{
    const train_cfg *s = &rs->t->spec;
    int T = s->model.seq_len;
    train_hooks *h = rs->t->hooks;
    rs->step_inputs = (double)s->train_batch_size * T;
    if ((h == NULL || h->target_mask == NULL) && !spec_data_is_jsonl(s->data.format))
        return (double)s->train_batch_size * T;
    double n = 0, in = 0;
    for (int j = 0; j < s->train_batch_size; j++) {
        uint64_t id = data_order_sample(&rs->order, (uint64_t)step * s->train_batch_size + j);
        fill_mask(rs, id);
        in += (double)data_sample_inputs(rs->t->train, id);
        for (int i = 0; i < T; i++)
            n += rs->mask[i] != 0;
    }
    rs->step_inputs = in;
    return n;
}

/* Load micro-step `micro` of step `step` into the host batch buffers. */
static void load_micro(rank_state *rs, int step, int micro, double n_total)
{
    const train_cfg *s = &rs->t->spec;
    int T = s->model.seq_len, m = rs->split.m;
    int per_rank = batch_split_per_rank(&rs->split);
    float w = n_total > 0 ? (float)(1.0 / n_total) : 0.0f;
    for (int pos = 0; pos < m; pos++) {
        uint64_t slot = data_slot((uint64_t)step, s->train_batch_size, per_rank, m, rs->rank,
                                  micro, pos);
        uint64_t id = data_order_sample(&rs->order, slot);
        train_hooks *h = rs->t->hooks;
        if (h != NULL && h->step_samples != NULL && step < h->steps_cap)
            h->step_samples[slot] = id;
        fill_mask(rs, id);
        if (rs->pos != NULL)
            data_sample_pos(rs->t->train, id, rs->pos + (size_t)pos * T);
        for (int i = 0; i < T; i++) {
            rs->inputs[pos * T + i] = rs->sample[i];
            rs->targets[pos * T + i] = rs->sample[i + 1];
            rs->weights[pos * T + i] = rs->mask[i] ? w : 0.0f;
        }
    }
}

/* Split a double into two floats so it survives a float all-reduce. */
static void put_double(float *slot, double x)
{
    slot[0] = (float)x;
    slot[1] = (float)(x - (double)slot[0]);
}

static double get_double(const float *slot)
{
    return (double)slot[0] + (double)slot[1];
}

static int check_cancel(trainer *t)
{
    return atomic_load(&t->cancel) ? ACC_ECANCELLED : 0;
}

static void publish_memory(rank_state *rs)
{
    atomic_store_explicit(&rs->t->mem_in_use[rs->rank], rs->dev->in_use, memory_order_relaxed);
    atomic_store_explicit(&rs->t->mem_peak[rs->rank], rs->dev->peak, memory_order_relaxed);
    kern_mem_info mi;
    kern_device_mem_info(rs->dev, &mi);
    atomic_store_explicit(&rs->t->mem_reserved[rs->rank], mi.reserved, memory_order_relaxed);
    atomic_store_explicit(&rs->t->mem_free[rs->rank], mi.free_bytes, memory_order_relaxed);
}

/* ZeRO-3: every forward gathers, so every rank runs as many as the rank
 * with the most samples; a rank with fewer first runs forwards of one
 * sample that carries no loss (token 0, weight 0), their results dropped. */
static void eval_pad(rank_state *rs, uint64_t total, uint64_t mine)
{
    uint64_t m = (uint64_t)rs->split.m, w = (uint64_t)rs->t->nranks, T = (uint64_t)rs->t->spec.model.seq_len;
    uint64_t most = (total + w - 1) / w, calls = (most + m - 1) / m, own = (mine + m - 1) / m;
    if (own >= calls)
        return;
    memset(rs->inputs, 0, T * sizeof *rs->inputs);
    memset(rs->targets, 0, T * sizeof *rs->targets);
    memset(rs->weights, 0, T * sizeof *rs->weights);
    for (uint64_t i = 0; rs->pos != NULL && i < T; i++)
        rs->pos[i] = (int)i;
    for (uint64_t k = own; k < calls; k++) {
        double none;
        model_forward(rs->model, rs->inputs, rs->targets, rs->weights, 1, 0, &none);
    }
}

/* Eval loss over the whole validation set, or its first eval_batches x B
 * samples when eval_batches caps it, split over
 * ranks: the mean over every loss-carrying target token of those samples
 * (*ntok of them, in *nsamp samples). */
static int run_eval(rank_state *rs, double *val_loss, uint64_t *ntok, uint64_t *nsamp, acc_err *err)
{
    trainer *t = rs->t;
    const train_cfg *s = &t->spec;
    int T = s->model.seq_len, m = rs->split.m;
    uint64_t total = data_num_samples(t->val);
    if (s->eval_batches > 0 && (uint64_t)s->eval_batches * (uint64_t)s->train_batch_size < total)
        total = (uint64_t)s->eval_batches * (uint64_t)s->train_batch_size;
    uint64_t lo = total * (uint64_t)rs->rank / (uint64_t)t->nranks;
    uint64_t hi = total * (uint64_t)(rs->rank + 1) / (uint64_t)t->nranks;
    uint64_t nval = data_num_samples(t->val);
    double sum = 0.0;
    if (t->zero->params_sharded) /* as many forwards as the rank with the most */
        eval_pad(rs, total, hi - lo);
    for (uint64_t j = lo; j < hi; j += (uint64_t)m) {
        int n = (int)(hi - j < (uint64_t)m ? hi - j : (uint64_t)m);
        for (int pos = 0; pos < n; pos++) {
            data_sample_masked(t->val, (j + (uint64_t)pos) % nval, rs->sample, rs->mask);
            if (rs->pos != NULL)
                data_sample_pos(t->val, (j + (uint64_t)pos) % nval, rs->pos + (size_t)pos * T);
            for (int i = 0; i < T; i++) {
                rs->inputs[pos * T + i] = rs->sample[i];
                rs->targets[pos * T + i] = rs->sample[i + 1];
                rs->weights[pos * T + i] = rs->mask[i] ? 1.0f : 0.0f;
            }
        }
        double part;
        model_forward(rs->model, rs->inputs, rs->targets, rs->weights, n, 0, &part);
        sum += part;
    }
    /* reduced in device memory (a GPU collective needs it there): the
     * gradient buffer's spare slots, free between steps */
    model *md = rs->model;
    kern_device *dev = rs->dev;
    float *slots = md->gtail + SLOT_EVAL;
    float buf[2];
    put_double(buf, sum);
    dev->ops->upload(dev, slots, buf, sizeof buf);
    int rc = kern_comm_allreduce(t->comm, rs->rank, slots, 2);
    if (rc != 0)
        return acc_err_set(err, rc, "", "cancelled");
    dev->ops->download(dev, buf, slots, sizeof buf);
    dev->ops->zero(dev, slots, sizeof buf); /* the next step's sums start at 0 */
    /* the mean over the targets that carry loss, of every rank's samples */
    double ntarget = 0;
    for (uint64_t j = 0; j < total; j++)
        ntarget += (double)data_sample_targets(t->val, j % nval);
    *val_loss = ntarget > 0 ? get_double(buf) / ntarget : 0.0;
    *ntok = (uint64_t)ntarget;
    *nsamp = total;
    return 0;
}

/* Training FLOPs a token: 6 N (forward and backward of the weights) plus
 * the causal attention's 6 L C T (bench/bench_gpu_train.c's estimate). */
static double flops_per_token(const model_config *cfg, int seq_len)
{
    return 6.0 * (double)model_num_params(cfg) + 6.0 * cfg->n_layer * (double)cfg->channels * seq_len;
}

static void emit_step(rank_state *rs, int step, double loss, double lr, double norm,
                      double seconds)
{
    trainer *t = rs->t;
    const train_cfg *s = &t->spec;
    train_event *ev = calloc(1, sizeof *ev);
    if (ev == NULL)
        return; /* an event lost to host OOM; the run itself goes on */
    ev->kind = TEV_STEP;
    ev->step = step + 1;
    ev->loss = loss;
    ev->lr = lr;
    ev->grad_norm = norm;
    ev->tokens_per_s = seconds > 0 ? (double)s->train_batch_size * s->model.seq_len / seconds : 0;
    /* the tokens that count, and what they cost */
    ev->loss_tokens = (uint64_t)rs->step_targets;
    ev->input_tokens = (uint64_t)rs->step_inputs;
    ev->input_positions = (uint64_t)s->train_batch_size * (uint64_t)s->model.seq_len;
    ev->step_seconds = seconds;
    ev->flops_per_token = flops_per_token(&t->cfg, s->model.seq_len);
    ev->micro_batch = rs->split.m;
    ev->accum_steps = rs->split.a;
    ev->nranks = t->nranks;
    for (int r = 0; r < t->nranks; r++) {
        ev->mem_in_use[r] = atomic_load_explicit(&t->mem_in_use[r], memory_order_relaxed);
        ev->mem_peak[r] = atomic_load_explicit(&t->mem_peak[r], memory_order_relaxed);
        ev->mem_reserved[r] = atomic_load_explicit(&t->mem_reserved[r], memory_order_relaxed);
        ev->mem_free[r] = atomic_load_explicit(&t->mem_free[r], memory_order_relaxed);
        ev->mem_optim[r] = t->mem_optim[r];
        ev->mem_grads[r] = t->mem_grads[r];
    }
    ev->host_budget = host_mem_budget(&t->host);
    ev->host_in_use = host_mem_in_use(&t->host);
    ev->host_peak = host_mem_peak(&t->host);
    emit(t, ev);
    free(ev);
}

/* An event of `kind` at `step` (NULL on host OOM: the event is lost, the
 * run goes on); emit_free sends and frees it. */
static train_event *event_new(trainer *t, train_event_kind kind, int step)
{
    train_event *ev = calloc(1, sizeof *ev);
    if (ev == NULL)
        return NULL;
    ev->kind = kind;
    ev->step = step;
    ev->nranks = t->nranks;
    return ev;
}

static void emit_free(trainer *t, train_event *ev)
{
    emit(t, ev);
    free(ev);
}

static void emit_eval(trainer *t, int step, double val_loss, uint64_t ntok, uint64_t nsamp)
{
    train_event *ev = event_new(t, TEV_EVAL, step);
    if (ev == NULL)
        return;
    ev->val_loss = val_loss;
    ev->val_tokens = ntok;
    ev->val_samples = nsamp;
    emit_free(t, ev);
}

static void emit_simple(trainer *t, train_event_kind kind, int step, double val_loss,
                        const char *path)
{
    train_event *ev = event_new(t, kind, step);
    if (ev == NULL)
        return;
    ev->val_loss = val_loss;
    if (path != NULL)
        snprintf(ev->path, sizeof ev->path, "%s", path);
    emit_free(t, ev);
}

static void emit_log(trainer *t, int step, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void emit_log(trainer *t, int step, const char *fmt, ...)
{
    train_event *ev = calloc(1, sizeof *ev);
    if (ev == NULL)
        return;
    ev->kind = TEV_LOG;
    ev->step = step;
    ev->nranks = t->nranks;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ev->msg, sizeof ev->msg, fmt, ap);
    va_end(ap);
    emit(t, ev);
    free(ev);
}

/* save.dtype in force: "auto" is model.from's (its tensors' dtype, read
 * from the headers only), float32 from scratch. */
static int save_dtype(const train_cfg *s, st_dtype *d, acc_err *err)
{
    hf_dir *h = NULL;
    static const st_dtype fixed[] = {[SPEC_SAVE_F32] = ST_F32, [SPEC_SAVE_BF16] = ST_BF16,
                                     [SPEC_SAVE_F16] = ST_F16};
    *d = ST_F32;
    if (s->save_dtype != SPEC_SAVE_AUTO) {
        *d = fixed[s->save_dtype];
        return 0;
    }
    if (s->model.from[0] == '\0')
        return 0;
    int rc = hf_open_under(s->data_roots, s->model.from, 1, &h, err);
    if (rc == 0)
        *d = hf_dtype(h);
    hf_close(h);
    return rc;
}

/* ZeRO: the whole AdamW moments, gathered through the gradient buffer
 * (free between steps; zeroed again after): each rank puts its shard of
 * one moment in place, an all-gather completes it, rank 0 copies it out.
 * Every rank calls; rank 0 gets mom[0], mom[1] (ngrad floats each, to
 * free), the others NULLs. No device memory beyond the state's. */
static int gather_moments(rank_state *rs, float *mom[2], acc_err *err)
{
    trainer *t = rs->t;
    model *m = rs->model;
    size_t n = m->ngrad, k = rs->zhi - rs->zlo;
    mom[0] = mom[1] = NULL;
    /* the rank's moments on the host first: on the device, or already
     * there (offloaded), adamw_moment_get says which */
    float *shard = malloc(k > 0 ? k * sizeof(float) : 1);
    int rc = shard == NULL ? ACC_ENOMEM : 0;
    for (int i = 0; rc == 0 && i < 2; i++) {
        if (rs->rank == 0 && (mom[i] = malloc(n * sizeof(float))) == NULL) {
            rc = ACC_ENOMEM;
            break;
        }
        adamw_moment_get(rs->opt, i, shard);
        rc = t->zero->state_to_host(t->comm, rs->rank, m, shard, rs->zlo, rs->zhi, mom[i]);
    }
    free(shard);
    if (rc == 0)
        return 0;
    free(mom[0]);
    free(mom[1]);
    mom[0] = mom[1] = NULL;
    if (rc == ACC_ENOMEM)
        return acc_err_set(err, rc, "", "out of host memory gathering the optimizer state for a checkpoint");
    return acc_err_set(err, rc, "", "cancelled");
}

static int write_checkpoint(rank_state *rs, const ckpt_state *st, float *mom[2], st_dtype dtype, char *path,
                            size_t path_n, acc_err *err)
{
    trainer *t = rs->t;
    const train_cfg *s = &t->spec;
    const char *hf_src = s->model.from[0] ? s->model.from : NULL;
    if (mom[0] != NULL)
        return ckpt_save_gathered(s->output_dir, rs->model, mom[0], mom[1], st, NULL, t->keep, hf_src,
                                  s->data_roots, dtype, path, path_n, err);
    return ckpt_save_as(s->output_dir, rs->model, rs->opt, st, NULL, t->keep, hf_src, s->data_roots, dtype,
                        path, path_n, err);
}

/* A checkpoint found the output's file system full: wait until it has
 * room for one (checked every CKPT_ROOM_POLL_S; a quota statvfs cannot see
 * is tried every CKPT_RETRY_S anyway), or until the run is cancelled or
 * stopped for a shutdown (then it resumes from the previous checkpoint). */
#define CKPT_ROOM_POLL_S 2
#define CKPT_RETRY_S 60
static int wait_for_room(trainer *t, const model *m, acc_err *err)
{
    uint64_t need = ckpt_bytes_estimate(m);
    for (int waited = 0;; waited += CKPT_ROOM_POLL_S) {
        for (int i = 0; i < 4 * CKPT_ROOM_POLL_S; i++) {
            if (atomic_load(&t->preempt)) /* ZeRO's preempt raises no cancel */
                return acc_err_set(err, ACC_ECANCELLED, "", "stopped for shutdown while waiting for disk space");
            if (atomic_load(&t->cancel))
                return acc_err_set(err, ACC_ECANCELLED, "", "cancelled");
            struct timespec q = {0, 250 * 1000000L};
            nanosleep(&q, NULL);
        }
        if (ckpt_free_bytes(t->spec.output_dir) >= need || (waited > 0 && waited % CKPT_RETRY_S == 0))
            return 0;
    }
}

/* Rank 0: a checkpoint of `step` completed steps (weights, AdamW state,
 * the split in force). Under ZeRO every rank calls (the moments are
 * gathered first) and rank 0 writes. A failure is the job's error, never
 * a file trusted later (ckpt.h). */
static int save_checkpoint(rank_state *rs, int step, acc_err *err)
{
    trainer *t = rs->t;
    const train_cfg *s = &t->spec;
    float *mom[2] = {NULL, NULL};
    if (t->zero->state_sharded) {
        int grc = gather_moments(rs, mom, err);
        if (grc == 0 && (grc = model_params_gather(rs->model, rs->rank == 0)) != 0)
            grc = acc_err_set(err, grc, "", grc == ACC_ENOMEM ? "out of host memory gathering the weights "
                                                                "for a checkpoint" : "cancelled");
        if (grc != 0) {
            free(mom[0]);
            free(mom[1]);
        }
        if (grc == 0 && rs->rank != 0)
            rs->last_saved = step;
        if (grc != 0 || rs->rank != 0)
            return grc;
    }
    ckpt_state st = {.step = step, .adam_t = rs->opt->t, .micro_batch = rs->split.m,
                     .accum_steps = rs->split.a, .seed = s->seed, .recompute = rs->recompute != 0};
    snprintf(st.job_uid, sizeof st.job_uid, "%s", s->job_uid); /* whose checkpoint it is */
    char path[PATH_MAX];
    st_dtype dtype;
    int rc = save_dtype(s, &dtype, err);
    for (bool paused = false; rc == 0;) {
        rc = write_checkpoint(rs, &st, mom, dtype, path, sizeof path, err);
        if (rc == 0 && paused)
            emit_log(t, step, "resumed: the checkpoint of step %d is written; training goes on", step);
        if (rc != ACC_ENOSPACE)
            break;
        if (!paused)
            emit_log(t, step,
                     TRAIN_PAUSED_PREFIX "%s; nothing is lost (the previous checkpoint is kept, the partial one "
                     "removed): training waits and writes it again when %s has room",
                     err->msg, s->output_dir);
        paused = true;
        rc = wait_for_room(t, rs->model, err);
    }
    free(mom[0]);
    free(mom[1]);
    model_params_release(rs->model);
    if (rc == 0) {
        rs->last_saved = step;
        emit_simple(t, TEV_CHECKPOINT, step, 0.0, path);
    }
    return rc;
}

/* A double as three floats, exactly (each the rounding error of the one
 * before), so it crosses a float collective unchanged. */
static void put_exact(float *slot, double x)
{
    slot[0] = (float)x;
    double r = x - (double)slot[0];
    slot[1] = (float)r;
    slot[2] = (float)(r - (double)slot[1]);
}

static double get_exact(const float *slot)
{
    return (double)slot[0] + (double)slot[1] + (double)slot[2];
}

/* The sum of squares of the reduced gradients of shard r of w. */
static double shard_sumsq(rank_state *rs, int r)
{
    model *m = rs->model;
    size_t lo = rs->zlo, hi = rs->zhi; /* this rank's when it holds only its own */
    if (!rs->t->zero->grads_sharded)
        adamw_shard(m->ngrad, r, rs->t->nranks, &lo, &hi);
    if (hi > lo && model_shard_grads_on_host(m)) /* the partition's gradients on the host */
        return model_shard_host_sumsq(m, lo, hi);
    return hi > lo ? rs->dev->ops->sumsq(rs->dev, m->grads + lo, hi - lo) : 0.0;
}

/* The global gradient norm, the same bits at every ZeRO stage: the w
 * shards' partial sums of squares, added in rank order. Stage 2 ranks
 * hold only their own shard's sums: the partials are all-gathered through
 * the tail slots (exactly: put_exact); otherwise every rank has all. */
static int grad_norm(rank_state *rs, double *norm, acc_err *err)
{
    trainer *t = rs->t;
    model *m = rs->model;
    int w = t->nranks;
    float part[3 * TRAIN_MAX_RANKS];
    if (t->zero->grads_sharded) {
        float *slots = m->gtail + SLOT_NORM;
        put_exact(part + 3 * rs->rank, shard_sumsq(rs, rs->rank));
        rs->dev->ops->upload(rs->dev, slots + 3 * rs->rank, part + 3 * rs->rank, 3 * sizeof(float));
        int rc = kern_comm_allgather(t->comm, rs->rank, slots, 3 * (size_t)w);
        if (rc != 0)
            return acc_err_set(err, rc, "", "cancelled");
        rs->dev->ops->download(rs->dev, part, slots, 3 * (size_t)w * sizeof(float));
    } else {
        for (int r = 0; r < w; r++)
            put_exact(part + 3 * r, shard_sumsq(rs, r));
    }
    double sum = 0.0;
    for (int r = 0; r < w; r++)
        sum += get_exact(part + 3 * r);
    *norm = sqrt(sum);
    return 0;
}

/* After the step's reduction: clip, update (this rank's shard under
 * ZeRO, then the parameters' all-gather), zero, report. */
static int finish_step(rank_state *rs, int step, double t0, acc_err *err)
{
    trainer *t = rs->t;
    const train_cfg *s = &t->spec;
    model *m = rs->model;
    double loss = get_double(rs->extra + SLOT_LOSS);
    double norm = 0.0;
    int rc = grad_norm(rs, &norm, err);
    if (rc != 0)
        return rc;
    /* every rank has the same reduced loss and norm, so all stop here
     * together: no update, no checkpoint after a non-finite step */
    if (!isfinite(loss) || !isfinite(norm))
        return acc_err_set(err, ACC_EINVAL, "",
                           "step %d: the %s is %g (not finite); training stopped before the update, "
                           "the last checkpoint is of step %d or earlier",
                           step + 1, !isfinite(loss) ? "loss" : "gradient norm", !isfinite(loss) ? loss : norm,
                           step);
    double lr = optim_lr_run(s, &t->steps, step);
    adamw_step(rs->opt, model_held_layout(m), m->params, m->grads, (float)lr, &s->optim,
               (float)optim_clip_scale(norm, s->optim.grad_clip));
    if ((rc = t->zero->gather_params(t->comm, rs->rank, m->params, m->ngrad)) != 0)
        return acc_err_set(err, rc, "", "cancelled");
    model_zero_grad(m);
    rs->done = step + 1;
    if (rs->rank != 0)
        return 0;
    train_hooks *h = t->hooks;
    if (h != NULL && step < h->steps_cap) {
        if (h->step_loss)
            h->step_loss[step] = loss;
        if (h->step_grad_norm)
            h->step_grad_norm[step] = norm;
    }
    emit_step(rs, step, loss, lr, norm, now_s() - t0);
    return 0;
}

/* The test hook's simulated out-of-memory inside a step. */
static int injected_oom(rank_state *rs, int step, int micro)
{
    train_hooks *h = rs->t->hooks;
    return h != NULL && h->inject_oom != NULL &&
           h->inject_oom(h->oom_ctx, rs->rank, step, micro, rs->split.m);
}

/* The per-micro-batch part of this rank's device bytes at micro batch m:
 * the activations (mem_plan.h). */
static uint64_t rank_act_bytes(const rank_state *rs, int m)
{
    const trainer *t = rs->t;
    return plan_act_bytes(&t->cfg, m, t->spec.model.seq_len, rs->recompute);
}

/* Allocate the activations of the split now unless they are there. An
 * ACC_EOOM is not returned but recorded in `rec`, for the agreement. */
static int ensure_acts(rank_state *rs, oom_record *rec, acc_err *err)
{
    model *m = rs->model;
    kern_device *d = rs->dev;
    if (m->B == rs->split.m && m->recompute == rs->recompute)
        return 0;
    /* the old ones go first, so "free" below is measured without them */
    model_acts_free(m);
    acc_err e = {0};
    int rc = model_acts_alloc(m, rs->split.m, rs->recompute, &e);
    if (rc == ACC_EOOM) {
        oom_record_hit(rec, rs->dev, rank_act_bytes(rs, rs->split.m));
        return 0;
    }
    if (rc != 0 && err != NULL)
        *err = e;
    if (rc == 0 && rs->t->hooks != NULL)
        rs->t->hooks->mem_model[rs->rank] = d->in_use;
    return rc;
}

/* The trainer's slots (loss sum, out-of-memory flag) go to device memory
 * before the final bucket, which carries them. */
static void stage_slots(rank_state *rs)
{
    model *m = rs->model;
    memset(rs->extra, 0, sizeof rs->extra);
    put_double(rs->extra + SLOT_LOSS, rs->step_loss_sum);
    rs->extra[SLOT_OOM] = rs->step_oom ? 1.0f : 0.0f;
    rs->extra[SLOT_STOP] = atomic_load(&rs->t->stop_asked) ? 1.0f : 0.0f;
    rs->dev->ops->upload(rs->dev, m->gtail, rs->extra, sizeof rs->extra);
}

static void start_bucket(rank_state *rs, const grad_bucket *b)
{
    if (rs->bucket_rc != 0)
        return;
    if (b->after_layer < 0)
        stage_slots(rs);
    model *m = rs->model;
    rs->bucket_rc = rs->t->zero->reduce_bucket(rs->t->comm, rs->rank, m->grads, b->spans, b->nspans, m->ngrad);
}

/* model_backward_notify's callback on the last micro-step: start every
 * bucket whose layers are now complete. */
static void grads_done(void *ctx, int layer)
{
    rank_state *rs = ctx;
    while (rs->next_bucket < rs->nbuckets && rs->buckets[rs->next_bucket].after_layer >= layer)
        start_bucket(rs, &rs->buckets[rs->next_bucket++]);
}

/* Whether any rank ran out of memory (ZeRO-3, before each micro-step): a
 * one-float all-reduce through the out-of-memory slot, zero again after. */
static int any_rank_oom(rank_state *rs, int hit)
{
    float *slot = rs->model->gtail + SLOT_OOM, f = hit ? 1.0f : 0.0f;
    rs->dev->ops->upload(rs->dev, slot, &f, sizeof f);
    int rc = kern_comm_allreduce(rs->t->comm, rs->rank, slot, 1);
    rs->dev->ops->download(rs->dev, &f, slot, sizeof f);
    rs->dev->ops->zero(rs->dev, slot, sizeof f);
    return rc != 0 || f != 0.0f; /* cancelled: stop too, the reduction reports it */
}

/* The a micro-steps of this rank: forward, backward into grads (+=); the
 * last one's backward starts the buckets. An out-of-memory inside stops
 * them and is recorded in `rec`. */
static int run_micro_steps(rank_state *rs, int step, oom_record *rec, acc_err *err)
{
    model *m = rs->model;
    double n_total = count_targets(rs, step);
    rs->step_targets = n_total;
    for (int micro = 0; micro < rs->split.a; micro++) {
        if (check_cancel(rs->t) != 0)
            return acc_err_set(err, ACC_ECANCELLED, "", "cancelled");
        if (!rec->hit && injected_oom(rs, step, micro))
            oom_record_hit(rec, rs->dev, m->act_bytes);
        /* ZeRO-3: the forward's gathers need every rank, so all skip together */
        if (rs->t->zero->params_sharded ? any_rank_oom(rs, rec->hit) : rec->hit)
            return 0; /* the step's reduction tells every rank */
        load_micro(rs, step, micro, n_total);
        double part;
        model_forward(m, rs->inputs, rs->targets, rs->weights, rs->split.m, 1, &part);
        rs->step_loss_sum += part;
        if (micro == rs->split.a - 1)
            model_backward_notify(m, rs->split.m, grads_done, rs);
        else
            model_backward(m, rs->split.m);
    }
    return 0;
}

/* The step's one gradient reduction: the buckets the backward has not
 * started (all of them after an out-of-memory, so that every rank makes the
 * same calls), then the finish. It also carries the out-of-memory flag, so
 * every rank learns of it here. */
static int reduce_grads(rank_state *rs, acc_err *err)
{
    rs->step_oom = rs->t->oom[rs->rank].hit;
    while (rs->next_bucket < rs->nbuckets)
        start_bucket(rs, &rs->buckets[rs->next_bucket++]);
    int rc = rs->bucket_rc;
    int fin = kern_comm_reduce_finish(rs->t->comm, rs->rank);
    if (rc == 0)
        rc = fin;
    if (rc == 0 || rc == ACC_ECANCELLED)
        return rc == 0 ? 0 : acc_err_set(err, rc, "", "cancelled");
    /* say why: a kernel fault shows up as a failed wait, so the device's
     * own error first, then the communicator's */
    int why = rs->dev->ops->last_error(rs->dev, err);
    if (why == 0)
        why = kern_comm_error(rs->t->comm, err);
    return why != 0 ? why : acc_err_set(err, rc, "", "gradient all-reduce failed");
}

/* One attempt at optimizer step `step`. *oom is set when any rank ran out
 * of device memory; then nothing was applied and the caller adapts. */
static int attempt_step(rank_state *rs, int step, int *oom, acc_err *err)
{
    trainer *t = rs->t;
    model *m = rs->model;
    double t0 = now_s();
    oom_record rec = {0};
    rs->step_loss_sum = 0.0;
    rs->step_oom = 0;
    rs->next_bucket = 0;
    rs->bucket_rc = 0;
    int rc = ensure_acts(rs, &rec, err);
    if (rc == 0 && (!rec.hit || t->zero->params_sharded)) /* ZeRO-3: to agree on it */
        rc = run_micro_steps(rs, step, &rec, err);
    if (rc != 0)
        return rc;
    t->oom[rs->rank] = rec;
    publish_memory(rs);
    if ((rc = reduce_grads(rs, err)) != 0)
        return rc;
    kern_device *dev = rs->dev;
    if ((rc = dev->ops->last_error(dev, err)) != 0) /* a GPU kernel that failed this step */
        return rc;
    dev->ops->download(dev, rs->extra, m->gtail, sizeof rs->extra);
    *oom = rs->extra[SLOT_OOM] != 0.0f;
    return *oom ? 0 : finish_step(rs, step, t0, err);
}

static void emit_oom_adjust(rank_state *rs, int step, const batch_split *from, const oom_record *r)
{
    trainer *t = rs->t;
    train_event *ev = calloc(1, sizeof *ev);
    if (ev == NULL)
        return;
    ev->kind = TEV_OOM_ADJUST;
    ev->step = step;
    ev->nranks = t->nranks;
    ev->from_micro = from->m;
    ev->from_accum = from->a;
    ev->to_micro = rs->split.m;
    ev->to_accum = rs->split.a;
    ev->micro_batch = rs->split.m;
    ev->accum_steps = rs->split.a;
    ev->recompute = rs->recompute;
    ev->bytes_asked = r->asked;
    ev->bytes_free = r->free_bytes;
    oom_adjust_msg(ev->msg, sizeof ev->msg, r, step, from, &rs->split, rs->recompute);
    emit(t, ev);
    free(ev);
}

/* Every rank, after the agreement: drop the step's partial gradients,
 * free the activations and take the next split by the same rule (oom.h).
 * Rank processes first exchange their records through the gradient
 * buffer, whose contents are dropped anyway; threads share them. */
static int adapt_after_oom(rank_state *rs, int step, acc_err *err)
{
    trainer *t = rs->t;
    model *m = rs->model;
    model_zero_grad(m);
    model_acts_free(m);
    if (!t->own_comm) {
        size_t n = m->nheld; /* host gradients: the device's gradient slot instead */
        float *buf = model_shard_grads_on_host(m) ? model_shard_device_scratch(m, &n) : m->grads;
        int src = oom_share(t->comm, rs->rank, t->nranks, rs->dev, buf, n, t->oom);
        model_zero_grad(m);
        if (src == ACC_ENOMEM)
            return acc_err_set(err, src, "", "out of host memory");
        if (src != 0)
            return acc_err_set(err, src, "", "cancelled");
    }
    oom_record r = *oom_first(t->oom, t->nranks);
    batch_split from = rs->split;
    const char *why;
    int rc = oom_next_split(t->spec.oom_adapt, &rs->split, &rs->recompute, &rs->oom_ceiling, &why);
    if (rc != 0)
        rc = oom_fail(&r, rs->split.m, rs->recompute, job_state_bytes(t), rank_act_bytes(rs, rs->split.m), why,
                      err);
    /* nobody writes its next record before all have read this one */
    int brc = kern_comm_barrier(t->comm);
    if (rc != 0)
        return rc;
    if (brc != 0)
        return acc_err_set(err, brc, "", "cancelled");
    if (rs->rank == 0) {
        emit_oom_adjust(rs, step, &from, &r);
        if (t->hooks != NULL)
            t->hooks->oom_adjusts++;
    }
    return 0;
}

/* Optimizer step `step`, redone with a smaller split (same samples) as
 * long as a rank runs out of memory and a smaller split remains. */
static int train_step(rank_state *rs, int step, acc_err *err)
{
    for (;;) {
        int oom = 0;
        int rc = attempt_step(rs, step, &oom, err);
        if (rc == 0 && rs->extra[SLOT_STOP] != 0.0f) { /* the same on every rank */
            rs->stop = 1;
            return 0;
        }
        if (rc != 0 || !oom)
            return rc;
        if ((rc = adapt_after_oom(rs, step, err)) != 0)
            return rc;
    }
}

/* "auto" micro batch, at a checkpoint boundary: when the next larger micro
 * batch fits the smallest device budget of the job (the planner's
 * prediction, less its margin) and has not run out of memory before, take
 * it: fewer micro-steps, the same effective batch. Every rank decides alike
 * from the same numbers, so no agreement is needed; should the prediction be
 * wrong, the OOM path steps back down and records the ceiling. */
static void maybe_raise_micro(rank_state *rs, int done)
{
    trainer *t = rs->t;
    if (!t->auto_split)
        return;
    int up = batch_split_larger_micro(&rs->split);
    if (up == 0 || (rs->oom_ceiling != 0 && up >= rs->oom_ceiling))
        return;
    uint64_t need = acc_sat_add_u64(job_state_bytes(t), rank_act_bytes(rs, up));
    uint64_t usable = plan_usable_bytes(t->min_budget);
    if (need > usable)
        return;
    int from_m = rs->split.m, from_a = rs->split.a;
    model_acts_free(rs->model);
    batch_split_with_micro(&rs->split, up, &rs->split); /* up divides B / w */
    if (rs->rank != 0)
        return;
    train_event *ev = calloc(1, sizeof *ev);
    if (ev == NULL)
        return;
    ev->kind = TEV_SPLIT_UP;
    ev->step = done;
    ev->from_micro = from_m;
    ev->from_accum = from_a;
    ev->to_micro = rs->split.m;
    ev->to_accum = rs->split.a;
    ev->recompute = rs->recompute != 0;
    ev->bytes_asked = need;
    ev->bytes_free = usable;
    emit(t, ev);
    free(ev);
}

/* The final checkpoint of `step` as the job's
 * export (export.h): what loads anywhere, no optimizer state. */
static int export_run(rank_state *rs, int step, acc_err *err)
{
    const train_cfg *s = &rs->t->spec;
    char ckpt[PATH_MAX];
    if (snprintf(ckpt, sizeof ckpt, "%s/ckpt-%08d", s->output_dir, step) >= (int)sizeof ckpt)
        return acc_err_set(err, ACC_EINVAL, "", "output path too long");
    const char *tok = s->data.tokenizer[0] ? s->data.tokenizer : s->model.from[0] ? s->model.from : NULL;
    int rc = export_final(ckpt, s->export_dir, tok, s->data_roots, err);
    if (rc == 0)
        emit_log(rs->t, step, "exported the final model to %s (no optimizer state)", s->export_dir);
    return rc;
}

/* s[0..n) cut to fit dst[cap] at a UTF-8 character boundary. */
static void copy_utf8(char *dst, size_t cap, const char *s)
{
    size_t n = strlen(s);
    if (n >= cap) {
        n = cap - 1;
        while (n > 0 && ((unsigned char)s[n] & 0xc0) == 0x80)
            n--; /* s[n] continues a character: cut before the character */
    }
    memcpy(dst, s, n);
    dst[n] = '\0';
}

typedef struct sample_ctx {
    trainer *t;
    int step;
} sample_ctx;

static void emit_sample(void *ctx, int index, const char *prompt, const char *text)
{
    sample_ctx *c = ctx;
    train_event *ev = event_new(c->t, TEV_SAMPLE, c->step);
    if (ev == NULL)
        return;
    ev->index = index;
    copy_utf8(ev->prompt, sizeof ev->prompt, prompt);
    copy_utf8(ev->text, sizeof ev->text, text);
    emit_free(c->t, ev);
}

/* eval_prompts' answers with this step's weights as "sample" events; a
 * failure is the job's log, never the job's end */
static void run_samples(rank_state *rs, int step)
{
    trainer *t = rs->t;
    acc_err e = {0};
    if (t->samples_off)
        return;
    if (t->samples == NULL && tsamp_new(&t->spec, &t->cfg, &t->samples, &e) != 0) {
        t->samples_off = 1;
        emit_log(t, step, "eval_prompts: no samples in this run: %s", e.msg);
        return;
    }
    sample_ctx c = {t, step};
    if (t->samples != NULL && tsamp_run(t->samples, rs->model, emit_sample, &c, &e) != 0)
        emit_log(t, step, "eval_prompts: no samples at step %d: %s", step, e.msg);
}

static int maybe_eval_and_save(rank_state *rs, int step, acc_err *err)
{
    trainer *t = rs->t;
    const train_cfg *s = &t->spec;
    int done = step + 1;
    if (t->val != NULL && s->eval_interval > 0 &&
        (done % s->eval_interval == 0 || done == t->steps.max_steps)) {
        double vl = 0.0;
        uint64_t ntok = 0, nsamp = 0;
        int rc = run_eval(rs, &vl, &ntok, &nsamp, err);
        if (rc != 0)
            return rc;
        if (rs->rank == 0) {
            if (t->hooks && t->hooks->step_val_loss && step < t->hooks->steps_cap)
                t->hooks->step_val_loss[step] = vl;
            emit_eval(t, done, vl, ntok, nsamp);
        }
    }
    if (rs->rank == 0 && s->eval_prompts[0] != '\0' && s->eval_interval > 0 &&
        (done % s->eval_interval == 0 || done == s->max_steps))
        run_samples(rs, done);
    int rc = 0;
    if ((rs->rank == 0 || t->zero->state_sharded) && s->output_dir[0] != '\0' &&
        ((s->checkpoint_interval > 0 && done % s->checkpoint_interval == 0) ||
         done == t->steps.max_steps))
        rc = save_checkpoint(rs, done, err); /* ZeRO: every rank, for the gather */
    if (rc == 0 && rs->rank == 0 && done == t->steps.max_steps && s->output_dir[0] != '\0' && s->export_dir[0] != '\0')
        rc = export_run(rs, done, err);
    if (rc == 0 && s->checkpoint_interval > 0 && done % s->checkpoint_interval == 0 && done < t->steps.max_steps)
        maybe_raise_micro(rs, done);
    return rc;
}

/* ZeRO, a shutdown: every rank stopped after the same step; the moments
 * are gathered for the checkpoint of the steps done (all ranks call), then
 * the run ends as a preempted one does. */
static int stop_together(rank_state *rs, acc_err *err)
{
    trainer *t = rs->t;
    if (rs->rank == 0) {
        t->steps_done = rs->done;
        if (t->hooks != NULL)
            t->hooks->steps_done = rs->done;
    }
    if (t->spec.output_dir[0] != '\0' && rs->done > t->start_step && rs->done > rs->last_saved) {
        int rc = save_checkpoint(rs, rs->done, err);
        if (rc != 0)
            return rc;
    }
    return acc_err_set(err, ACC_ECANCELLED, "", atomic_load(&t->cancel_ckpt) ? "cancelled" : "stopped for shutdown");
}

static int rank_run(rank_state *rs, acc_err *err)
{
    trainer *t = rs->t;
    const train_cfg *s = &t->spec;
    int rc = rank_setup(rs, err);
    if (rc == 0 && rs->rank == t->first_rank) /* each rank process opens its own */
        rc = open_data(t, s, &t->train, &t->val, err);
    if (rc == 0 && rs->rank == t->first_rank)
        rc = steps_from_epochs(t, err);
    if (rc != 0)
        return rc;
    if ((rc = kern_comm_barrier(t->comm)) != 0) /* data is open for everyone */
        return acc_err_set(err, rc, "", "cancelled");
    if ((rc = data_order_init(&rs->order, data_num_samples(t->train), s->seed, err)) != 0)
        return rc;
    if (rs->rank == 0)
        emit_log(t, 0,
                 "%s %.2fM parameters, %llu training samples; micro batch %d x %d "
                 "accumulation steps x %d devices%s; %.1f MiB on each %s device "
                 "(%.1f state + %.1f activations), %d threads, %s%s%s%s%s",
                 rs->model->family->name, (double)rs->model->nparams / 1e6,
                 (unsigned long long)data_num_samples(t->train), rs->split.m, rs->split.a, t->nranks,
                 !rs->recompute ? ""
                 : model_act_offload(&t->cfg, rs->recompute)
                     ? ", activation recomputation from checkpoints in host memory"
                     : ", activation recomputation",
                 (double)(job_state_bytes(t) + rank_act_bytes(rs, rs->split.m)) /
                     (1024.0 * 1024.0),
                 rs->dev->ops->backend, (double)job_state_bytes(t) / (1024.0 * 1024.0),
                 (double)rank_act_bytes(rs, rs->split.m) / (1024.0 * 1024.0),
                 t->threads,
                 s->precision == SPEC_BF16 ? "precision bf16 (bf16 matmul operands, fp32 accumulation; activations stored in bf16)"
                                           : "precision fp32",
                 t->zero->note, s->offload_optimizer ? "; optimizer offloaded to host memory (AdamW on the host)" : "",
                 t->plan_note[0] ? "; " : "", t->plan_note);
    if (rs->rank == 0 && t->resume_dir[0] != '\0')
        emit_log(t, t->start_step, "resumed from %s at step %d (micro batch %d x %d accumulation steps%s)",
                 t->resume_dir, t->start_step, rs->split.m, rs->split.a,
                 rs->recompute ? ", activation recomputation" : "");
    double t0 = now_s();
    rs->done = t->start_step;
    rs->last_saved = t->start_step; /* resumed from it: already saved */
    if (rs->rank == 0) {
        t->steps_done = t->start_step;
        if (t->hooks != NULL)
            t->hooks->steps_done = t->start_step;
    }
    for (int step = t->start_step; step < t->steps.max_steps; step++) {
        if ((rc = train_step(rs, step, err)) != 0)
            return rc;
        if (rs->rank == 0 && rs->done > t->start_step)
            atomic_store(&t->stepped, 1);
        if (rs->stop)
            return stop_together(rs, err);
        if ((rc = maybe_eval_and_save(rs, step, err)) != 0)
            return rc;
        if (rs->rank == 0) {
            t->steps_done = step + 1;
            if (t->hooks != NULL)
                t->hooks->steps_done = step + 1;
        }
    }
    train_hooks *h = t->hooks;
    /* ZeRO-3: the weights gathered for rank 0's copy (every rank calls) */
    if (h != NULL && h->final_params != NULL && (rc = model_params_gather(rs->model, rs->rank == 0)) != 0)
        return acc_err_set(err, rc, "", "gathering the final weights failed");
    if (rs->rank == 0 && h != NULL) {
        h->final_micro = rs->split.m;
        h->final_accum = rs->split.a;
        h->final_recompute = rs->recompute;
        h->seconds = now_s() - t0;
        h->nparams = rs->model->nparams;
        if (h->final_params != NULL && h->final_params_cap >= rs->model->nparams)
            model_params_download(rs->model, h->final_params);
    }
    model_params_release(rs->model);
    return 0;
}

static void finish_run(trainer *t)
{
    train_event *ev = calloc(1, sizeof *ev);
    if (ev == NULL)
        return;
    pthread_mutex_lock(&t->mu);
    ev->status = t->status;
    snprintf(ev->msg, sizeof ev->msg, "%s", t->status == 0 ? "finished" : t->msg);
    pthread_mutex_unlock(&t->mu);
    ev->kind = TEV_DONE;
    ev->step = t->steps_done;
    ev->nranks = t->nranks;
    if (t->hooks != NULL && t->comm != NULL) {
        t->hooks->allreduce_calls = kern_comm_allreduce_calls(t->comm);
        t->hooks->bucket_calls = kern_comm_bucket_calls(t->comm);
    }
    emit(t, ev);
    free(ev);
}

/* A shutdown stopped the run: rank 0's weights and moments are those of the
 * last completed step (a step only changes them after its all-reduce), so
 * they are checkpointed as that step. Returns non-zero when the run should
 * still be reported as stopped (always: the daemon requeues it). */
static int checkpoint_on_preempt(rank_state *rs, acc_err *err)
{
    trainer *t = rs->t;
    /* ZeRO: checkpointed together in stop_together (or, stopped before a
     * step ended, there was nothing to save) */
    bool on_cancel = atomic_load(&t->cancel_ckpt) != 0;
    if (rs->rank != 0 || !(atomic_load(&t->preempt) || on_cancel) || rs->model == NULL || t->zero->state_sharded ||
        t->spec.output_dir[0] == '\0' || rs->done <= t->start_step || rs->done <= rs->last_saved)
        return 1;
    acc_err e = {0};
    if (save_checkpoint(rs, rs->done, &e) != 0 && on_cancel) /* still a cancel: the message says what was lost */
        acc_err_set(err, ACC_ECANCELLED, "", "cancelled; the checkpoint on cancel failed: %s", e.msg);
    else if (e.code != 0)
        acc_err_set(err, e.code, "", "stopped for shutdown; %s", e.msg);
    return 1;
}

static void *rank_main(void *arg)
{
    rank_ctx *rc = arg;
    trainer *t = rc->t;
    rank_state rs;
    memset(&rs, 0, sizeof rs);
    rs.t = t;
    rs.host = &t->host;
    rs.rank = rc->rank;
    acc_err err = {0};
    if (rank_run(&rs, &err) != 0 && checkpoint_on_preempt(&rs, &err) != 0) {
        if (err.code == ACC_ECANCELLED && atomic_load(&t->cancel) && !strstr(err.msg, "checkpoint on cancel"))
            snprintf(err.msg, sizeof err.msg, "cancelled");
        fail(t, &err);
    }
    if (t->hooks != NULL && rs.dev != NULL)
        t->hooks->mem_peak[rs.rank] = rs.dev->peak;
    rank_teardown(&rs);
    if (t->hooks != NULL) {
        t->hooks->host_budget = host_mem_budget(&t->host);
        t->hooks->host_peak = host_mem_peak(&t->host);
    }
    if (atomic_fetch_sub(&t->live, 1) == 1)
        finish_run(t);
    return NULL;
}

/* ---- lifecycle */

static void trainer_destroy(trainer *t)
{
    if (t->resume_fd >= 0)
        close(t->resume_fd);
    data_close(t->train);
    data_close(t->val);
    tsamp_free(t->samples);
    if (t->own_comm)
        kern_comm_destroy(t->comm);
    pthread_mutex_destroy(&t->mu);
    host_mem_destroy(&t->host);
    free(t);
}

/* train_micro_batch_size_per_gpu "auto": the planner's pick against the
 * smallest budget of the job's devices (the first step confirms it; the
 * OOM path corrects a wrong prediction). With start_where_fits (h-results,
 * issue 23) a given micro batch the planner says does not fit starts at
 * plan_start_row's instead (oom.adapt), without running out of memory down
 * to it. */
static int plan_start_split(trainer *t, const kern_device_info *devs, acc_err *err)
{
    const train_cfg *s = &t->spec;
    uint64_t budget = 0;
    for (int r = 0; r < s->devices && r < TRAIN_MAX_RANKS; r++)
        if (devs[r].mem_total != 0 && (budget == 0 || devs[r].mem_total < budget))
            budget = devs[r].mem_total;
    plan_row *rows = calloc(PLAN_MAX_ROWS, sizeof *rows);
    if (rows == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory");
    int n = 0, chosen = -1;
    int rc = plan_candidates_on(s, devs[0].kind, budget, rows, PLAN_MAX_ROWS, &n, &chosen, err);
    if (rc == 0 && n == 0)
        rc = acc_err_set(err, ACC_EINVAL, "train_batch_size", "no micro batch candidates");
    int start = rc == 0 ? plan_start_row(s, rows, n, chosen) : -1;
    if (rc == 0 && s->micro_auto) {
        /* nothing fits: start at the smallest split and let the first step
         * fail with the numbers (or succeed, if the margin was the problem) */
        const plan_row *r = &rows[start >= 0 ? start : 0];
        t->micro0 = r->micro_batch;
        t->accum0 = r->accum_steps;
        t->recompute0 = r->recompute;
        snprintf(t->plan_note, sizeof t->plan_note,
                 "micro batch \"auto\": %d%s, predicted peak %.1f MiB, budget %.1f MiB "
                 "less %d%%%s",
                 r->micro_batch, r->recompute ? " with recomputation" : "",
                 (double)r->peak_bytes / (1024.0 * 1024.0), (double)budget / (1024.0 * 1024.0),
                 PLAN_MARGIN_PCT, chosen >= 0 ? "" : " (nothing fits)");
    } else if (rc == 0 && start >= 0 && rows[start].micro_batch != s->micro_batch) {
        plan_start_note(s, rows, n, chosen, budget, t->plan_note, sizeof t->plan_note);
        t->micro0 = rows[start].micro_batch;
        t->accum0 = rows[start].accum_steps;
        t->recompute0 = rows[start].recompute;
    }
    free(rows);
    return rc;
}

/* A checkpoint passed over: the job's stream names it and says why. */
static void on_ckpt_rejected(void *ctx, const char *dir, const char *why)
{
    trainer *t = ctx;
    train_event *ev = calloc(1, sizeof *ev);
    if (ev == NULL)
        return;
    ev->kind = TEV_CKPT_REJECTED;
    ev->nranks = t->nranks;
    snprintf(ev->path, sizeof ev->path, "%s", dir);
    snprintf(ev->msg, sizeof ev->msg, "%s", why);
    emit(t, ev);
    free(ev);
    t->rejected++;
}

/* Resume from the checkpoint ckpt_discover finds (the job's own newest
 * good one, else spec.resume_from's), else start at step 0 (saying so
 * when checkpoints were passed over). The saved split (after OOM
 * adaptation) is kept when it still divides the batch. */
static int find_resume(trainer *t, acc_err *err)
{
    const train_cfg *s = &t->spec;
    char dir[PATH_MAX];
    ckpt_state st;
    int fd = -1;
    const ckpt_job where = {.output_root = s->output_root, .output_dir = s->output_dir, .job_uid = s->job_uid,
                            .adopt_unnamed = s->adopt_unnamed, .resume_from = s->resume_from, .keep = t->keep};
    int rc = ckpt_discover(&where, on_ckpt_rejected, t, &fd, dir, sizeof dir, &st, err);
    if (rc != 0)
        return rc;
    if (fd < 0) {
        if (t->rejected > 0)
            emit_log(t, 0, "no usable checkpoint of this job (%d passed over): starting from step 0",
                     t->rejected);
        return 0;
    }
    t->resume_fd = fd;
    /* with num_train_epochs alone, max_steps is known once the data is */
    if (st.step > t->steps.max_steps && (s->num_train_epochs <= 0 || s->max_steps_given))
        return acc_err_set(err, ACC_EINVAL, "resume_from", "checkpoint %s is at step %d, past max_steps %d",
                           dir, st.step, t->steps.max_steps);
    batch_split any, saved;
    if (s->devices >= 1 && s->train_batch_size % s->devices == 0 &&
        batch_split_make(s->train_batch_size, 1, s->train_batch_size / s->devices, s->devices, 0,
                         &any, NULL) == 0 &&
        batch_split_with_micro(&any, st.micro_batch, &saved) == 0) {
        t->micro0 = saved.m;
        t->accum0 = saved.a;
    }
    t->recompute0 = t->recompute0 || st.recompute;
    t->start_step = st.step;
    snprintf(t->resume_dir, sizeof t->resume_dir, "%s", dir);
    return 0;
}

static int prepare_spec(trainer *t, const kern_device_info *devs, acc_err *err)
{
    t->auto_split = t->spec.micro_auto;
    for (int r = 0; r < t->spec.devices && r < TRAIN_MAX_RANKS; r++)
        if (devs[r].mem_total != 0 && (t->min_budget == 0 || devs[r].mem_total < t->min_budget))
            t->min_budget = devs[r].mem_total;
    t->recompute0 = t->spec.activation_checkpointing;
    t->micro0 = t->spec.micro_batch;
    t->accum0 = t->spec.accum_steps;
    t->steps = (optim_steps){.max_steps = t->spec.max_steps, .warmup_steps = t->spec.lr.warmup_steps};
    int rc = check_batch(&t->spec, err);
    if (rc == 0 && (t->spec.micro_auto || (t->start_where_fits && t->spec.oom_adapt)))
        rc = plan_start_split(t, devs, err);
    if (rc == 0)
        rc = find_resume(t, err);
    if (rc == 0)
        rc = check_split(&t->spec, t->micro0, t->accum0, err);
    if (rc == 0)
        rc = resolve_config(&t->spec, &t->cfg, err);
    return rc;
}

/* One thread per rank this process runs (all of them, or the one rank of a
 * rank process: kern_comm_mpi.h); the comm is open. */
static void spawn_ranks(trainer *t)
{
    int end = t->first_rank + t->local_ranks;
    for (int r = t->first_rank; r < end; r++) {
        t->ranks[r].t = t;
        t->ranks[r].rank = r;
        if (pthread_create(&t->ranks[r].thread, NULL, rank_main, &t->ranks[r]) != 0) {
            /* the started ranks stop at their first barrier; the last one
             * to finish reports TEV_DONE with this error */
            acc_err e = {0};
            acc_err_set(&e, ACC_EINTERNAL, "", "cannot start rank thread %d", r);
            fail(t, &e);
            if (atomic_fetch_sub(&t->live, end - r) == end - r)
                finish_run(t);
            break;
        }
        t->ranks[r].started = 1;
    }
}

/* What a start reads from files (the resume checkpoints, init_from, the
 * planner's model config), the communicator, then the ranks. */
static int launch(trainer *t, acc_err *err)
{
    kern_comm *c = NULL;
    int rc = prepare_spec(t, t->devs, err);
    if (rc == 0 && atomic_load(&t->cancel)) /* stopped while it prepared */
        rc = acc_err_set(err, ACC_ECANCELLED, "", "cancelled");
    if (rc == 0 && t->own_comm)
        rc = kern_comm_open(t->devs, t->nranks, &c, err);
    else if (rc == 0)
        c = t->ext_comm; /* a rank process: the caller's (MPI) */
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&t->mu); /* trainer_cancel may abort it from now on */
    t->comm = c;
    pthread_mutex_unlock(&t->mu);
    spawn_ranks(t);
    return 0;
}

/* async_start: the launch off the caller's thread; a failure ends the run
 * with TEV_DONE carrying it, as any other failure does. */
static void *launcher_main(void *arg)
{
    trainer *t = arg;
    acc_err e = {0};
    int rc = atomic_load(&t->cancel) ? acc_err_set(&e, ACC_ECANCELLED, "", "cancelled") : launch(t, &e);
    if (rc != 0) {
        record_status(t, rc, e.msg);
        finish_run(t);
    }
    return NULL;
}

/* The job's host_mem: what the reservation for this process's ranks
 * leaves after their batch buffers (plan_host_batch_bytes each, allocated
 * outside it), exactly (a reservation they fill allows nothing more); no
 * reservation, no limit. */
static int init_host(trainer *t, uint64_t reserved, acc_err *err)
{
    if (reserved == 0) {
        host_mem_init(&t->host, 0);
        return 0;
    }
    uint64_t batch = acc_sat_mul_u64(plan_host_batch_bytes(&t->spec), (uint64_t)t->local_ranks);
    if (batch > reserved)
        return acc_err_set(err, ACC_ENOMEM, "host memory",
                           "the batch buffers of %d rank(s) need %llu bytes of host memory; %llu are reserved",
                           t->local_ranks, (unsigned long long)batch, (unsigned long long)reserved);
    host_mem_init_capped(&t->host, reserved - batch);
    return 0;
}

int trainer_start_hooked(const trainer_opts *o, train_hooks *h, trainer **out, acc_err *err)
{
    *out = NULL;
    const train_cfg *s = o->spec;
    int rc = check_batch(s, err); /* devices in [1, TRAIN_MAX_RANKS] before copying them */
    if (rc != 0)
        return rc;
    const zero_ops *zero = zero_ops_of(s->zero_stage);
    if (zero == NULL)
        return acc_err_set(err, ACC_EINVAL, "zero_stage", "zero_stage %d: stages 0 to %d exist", s->zero_stage,
                           ZERO_MAX_STAGE);
    trainer *t = calloc(1, sizeof *t);
    if (t == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory");
    t->spec = *s;
    t->zero = zero;
    t->resume_fd = -1;
    t->nranks = s->devices;
    /* the ranks this process runs: every rank as a thread over the job's own
     * comm, or the one rank of a rank process over the caller's (MPI) */
    if (o->comm != NULL && (o->rank < 0 || o->rank >= t->nranks)) {
        free(t);
        return acc_err_set(err, ACC_EINVAL, "devices", "rank %d of a job of %d devices", o->rank, s->devices);
    }
    t->ext_comm = o->comm;
    t->own_comm = o->comm == NULL;
    t->first_rank = o->comm != NULL ? o->rank : 0;
    t->local_ranks = o->comm != NULL ? 1 : t->nranks;
    t->on_event = o->on_event; /* prepare_spec reports passed-over checkpoints */
    t->event_ctx = o->event_ctx;
    t->keep = o->checkpoint_keep > 0 ? o->checkpoint_keep : 2;
    if (s->save_total_limit > 0) /* the job's own limit */
        t->keep = s->save_total_limit;
    t->threads = o->threads_per_device > 0 ? o->threads_per_device : 1;
    t->hooks = h;
    t->start_where_fits = o->start_where_fits;
    memcpy(t->devs, o->devices, (size_t)t->nranks * sizeof *t->devs);
    atomic_init(&t->cancel, 0);
    atomic_init(&t->preempt, 0);
    atomic_init(&t->stop_asked, 0);
    atomic_init(&t->stepped, 0);
    atomic_init(&t->cancel_ckpt, 0);
    atomic_init(&t->live, t->local_ranks);
    if (pthread_mutex_init(&t->mu, NULL) != 0) {
        free(t);
        return acc_err_set(err, ACC_ENOMEM, "", "pthread_mutex_init failed");
    }
    if ((rc = init_host(t, o->host_budget, err)) != 0) {
        pthread_mutex_destroy(&t->mu);
        free(t);
        return rc;
    }
    if (o->async_start) {
        if (pthread_create(&t->launcher, NULL, launcher_main, t) != 0) {
            trainer_destroy(t);
            return acc_err_set(err, ACC_EINTERNAL, "", "cannot start the trainer's launcher thread");
        }
        t->launcher_started = 1;
        *out = t;
        return 0;
    }
    if ((rc = launch(t, err)) != 0) {
        trainer_destroy(t);
        return rc;
    }
    *out = t;
    return 0;
}

int trainer_start(const trainer_opts *o, trainer **out, acc_err *err)
{
    return trainer_start_hooked(o, NULL, out, err);
}

void trainer_cancel(trainer *t)
{
    /* checkpoint_on_cancel: the work is kept as a
     * shutdown keeps it (ZeRO: the ranks stop together after the step in
     * progress, so the sharded moments can be gathered) */
    if (t->spec.checkpoint_on_cancel && !atomic_load(&t->preempt)) {
        atomic_store(&t->cancel_ckpt, 1);
        if (t->zero->state_sharded && atomic_load(&t->stepped)) {
            atomic_store(&t->stop_asked, 1);
            return;
        }
    }
    atomic_store(&t->cancel, 1);
    pthread_mutex_lock(&t->mu); /* the launcher may still be opening it */
    if (t->comm != NULL)
        kern_comm_abort(t->comm);
    pthread_mutex_unlock(&t->mu);
}

void trainer_preempt(trainer *t)
{
    atomic_store(&t->preempt, 1);
    /* ZeRO: the ranks' moments are shards, which an aborted communicator
     * could no longer gather: the ranks stop together after the step in
     * progress (stop_together). Before the first step there is nothing to
     * save, and a wait there (data preparation) may be long: cancel. */
    if (t->zero->state_sharded && atomic_load(&t->stepped)) {
        atomic_store(&t->stop_asked, 1);
        return;
    }
    trainer_cancel(t);
}

void trainer_wait(trainer *t)
{
    if (t->joined)
        return;
    if (t->launcher_started) /* it started the ranks (or failed first) */
        pthread_join(t->launcher, NULL);
    for (int r = 0; r < t->nranks; r++)
        if (t->ranks[r].started)
            pthread_join(t->ranks[r].thread, NULL);
    t->joined = 1;
}

void trainer_free(trainer *t)
{
    if (t == NULL)
        return;
    trainer_wait(t);
    trainer_destroy(t);
}

int trainer_run_sync(const trainer_opts *o, train_hooks *h, acc_err *err)
{
    trainer *t;
    int rc = trainer_start_hooked(o, h, &t, err);
    if (rc != 0)
        return rc;
    trainer_wait(t);
    rc = t->status;
    if (rc != 0)
        acc_err_set(err, rc, "", "%s", t->msg);
    trainer_free(t);
    return rc;
}
