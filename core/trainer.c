/* trainer: see trainer.h and trainer_run.h.
 *
 * One thread per rank. Each rank owns a device, a full model replica and a
 * cursor into the shared sample order. An optimizer step is:
 *   1. count the target tokens of the whole effective batch (all ranks, all
 *      micro-steps) -- every rank can, since the order is known in advance;
 *   2. accum_steps micro-steps: forward with per-token weights
 *      mask/N_total, backward summed into the grads buffer, no communication;
 *   3. the step's loss sum goes into the grads buffer's spare slots and the
 *      whole buffer is all-reduced once;
 *   4. global-norm clip, AdamW, zero grads -- identically on every rank, so
 *      the replicas stay bitwise equal without a broadcast.
 * Rank 0 publishes the events; the last rank to finish publishes TEV_DONE.
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

#include "data.h"
#include "kern_comm.h"
#include "kern_device.h"
#include "model_gpt2.h"
#include "optim.h"
#include "trainer_run.h"

typedef struct rank_ctx {
    struct trainer *t;
    int rank;
    pthread_t thread;
    int started;
} rank_ctx;

struct trainer {
    job_spec spec;
    kern_device_info devs[TRAIN_MAX_RANKS];
    int nranks, threads;
    train_event_fn on_event;
    void *event_ctx;
    train_hooks *hooks;

    model_config cfg;
    data_source *train, *val;  /* opened by rank 0 before the first barrier */
    kern_comm *comm;
    atomic_int cancel;
    atomic_int live;           /* ranks not yet finished */

    pthread_mutex_t mu;        /* guards status/msg */
    int status;
    char msg[512];

    /* each rank writes its own entry before the step's all-reduce; rank 0
     * reads them all after it, while others may already write the next */
    atomic_uint_least64_t mem_in_use[TRAIN_MAX_RANKS], mem_peak[TRAIN_MAX_RANKS];
    rank_ctx ranks[TRAIN_MAX_RANKS];
    int steps_done;            /* written by rank 0 */
    int joined;
};

/* Per-rank loop state. */
typedef struct rank_state {
    trainer *t;
    int rank;
    kern_device *dev;
    model_gpt2 *model;
    data_order order;
    int *sample;      /* [T+1] */
    int *inputs, *targets; /* [m*T] */
    float *weights;   /* [m*T] */
    uint8_t *mask;    /* [T] */
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

static int check_batch(const job_spec *s, acc_err *err)
{
    if (s->micro_batch < 1 || s->accum_steps < 1 || s->devices < 1)
        return acc_err_set(err, ACC_EINVAL, "train_micro_batch_size_per_gpu",
                           "micro batch, accumulation steps and devices must be >= 1");
    if (s->devices > TRAIN_MAX_RANKS)
        return acc_err_set(err, ACC_EINVAL, "devices", "at most %d devices per job",
                           TRAIN_MAX_RANKS);
    if ((long long)s->micro_batch * s->accum_steps * s->devices != s->train_batch_size)
        return acc_err_set(err, ACC_EINVAL, "train_batch_size",
                           "train_batch_size %d != %d * %d * %d (micro * accum * world)",
                           s->train_batch_size, s->micro_batch, s->accum_steps, s->devices);
    if (s->precision != SPEC_FP32)
        return acc_err_set(err, ACC_EINVAL, "precision",
                           "the CPU engine trains in fp32 only");
    if (s->max_steps < 0)
        return acc_err_set(err, ACC_EINVAL, "max_steps", "must be >= 0");
    return 0;
}

static int resolve_config(const job_spec *s, model_config *cfg, acc_err *err)
{
    if (s->model.init_from[0] != '\0')
        return model_config_from_file(s->model.init_from, &s->model, cfg, err);
    return model_config_from_spec(&s->model, cfg, err);
}

static int open_data(const job_spec *s, data_source **train, data_source **val, acc_err *err)
{
    *train = *val = NULL;
    int rc = data_open(s->data.train, s->data.format, s->model.seq_len, s->model.vocab_size,
                       "data.train", train, err);
    if (rc == 0 && s->data.val[0] != '\0')
        rc = data_open(s->data.val, s->data.format, s->model.seq_len, s->model.vocab_size,
                       "data.val", val, err);
    if (rc != 0) {
        data_close(*train);
        *train = NULL;
    }
    return rc;
}

int trainer_check_spec(const job_spec *spec, acc_err *err)
{
    model_config cfg;
    int rc = check_batch(spec, err);
    if (rc == 0)
        rc = resolve_config(spec, &cfg, err);
    data_source *tr = NULL, *va = NULL;
    if (rc == 0)
        rc = open_data(spec, &tr, &va, err);
    data_close(tr);
    data_close(va);
    return rc;
}

int trainer_device_bytes(const job_spec *spec, uint64_t *bytes, acc_err *err)
{
    model_config cfg;
    int rc = resolve_config(spec, &cfg, err);
    if (rc != 0)
        return rc;
    if (spec->micro_batch < 1)
        return acc_err_set(err, ACC_EINVAL, "train_micro_batch_size_per_gpu", "must be >= 1");
    *bytes = model_device_bytes(&cfg, spec->micro_batch, spec->model.seq_len);
    return 0;
}

/* ---- one rank */

static int rank_setup(rank_state *rs, acc_err *err)
{
    trainer *t = rs->t;
    const job_spec *s = &t->spec;
    int T = s->model.seq_len, m = s->micro_batch;
    omp_set_num_threads(t->threads);
    int rc = kern_device_open(&t->devs[rs->rank], t->threads, &rs->dev, err);
    if (rc == 0)
        rc = model_create(rs->dev, &t->cfg, m, T, &rs->model, err);
    if (rc == 0 && t->hooks != NULL)
        t->hooks->mem_model[rs->rank] = rs->dev->in_use;
    if (rc == 0)
        rc = s->model.init_from[0] != '\0' ? model_load_llmc(rs->model, s->model.init_from, err)
                                           : model_init_seed(rs->model, s->seed, err);
    if (rc != 0)
        return rc;
    rs->sample = malloc((size_t)(T + 1) * sizeof *rs->sample);
    rs->inputs = malloc((size_t)m * T * sizeof *rs->inputs);
    rs->targets = malloc((size_t)m * T * sizeof *rs->targets);
    rs->weights = malloc((size_t)m * T * sizeof *rs->weights);
    rs->mask = malloc((size_t)T);
    if (!rs->sample || !rs->inputs || !rs->targets || !rs->weights || !rs->mask)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory for batch buffers");
    return 0;
}

static void rank_teardown(rank_state *rs)
{
    free(rs->sample);
    free(rs->inputs);
    free(rs->targets);
    free(rs->weights);
    free(rs->mask);
    data_order_free(&rs->order);
    model_free(rs->model);
    kern_device_close(rs->dev);
}

static void fill_mask(rank_state *rs, uint64_t id)
{
    train_hooks *h = rs->t->hooks;
    int T = rs->t->spec.model.seq_len;
    if (h != NULL && h->target_mask != NULL)
        h->target_mask(h->mask_ctx, id, T, rs->mask);
    else
        memset(rs->mask, 1, (size_t)T);
}

/* Target tokens of the whole step, over every rank and micro-step. */
static double count_targets(rank_state *rs, int step)
{
    const job_spec *s = &rs->t->spec;
    int T = s->model.seq_len;
    train_hooks *h = rs->t->hooks;
    if (h == NULL || h->target_mask == NULL)
        return (double)s->train_batch_size * T;
    double n = 0;
    for (int j = 0; j < s->train_batch_size; j++) {
        uint64_t id = data_order_sample(&rs->order, (uint64_t)step * s->train_batch_size + j);
        fill_mask(rs, id);
        for (int i = 0; i < T; i++)
            n += rs->mask[i] != 0;
    }
    return n;
}

/* Load micro-step `micro` of step `step` into the host batch buffers. */
static void load_micro(rank_state *rs, int step, int micro, double n_total)
{
    const job_spec *s = &rs->t->spec;
    int T = s->model.seq_len, m = s->micro_batch;
    int per_rank = m * s->accum_steps;
    float w = n_total > 0 ? (float)(1.0 / n_total) : 0.0f;
    for (int pos = 0; pos < m; pos++) {
        uint64_t slot = data_slot((uint64_t)step, s->train_batch_size, per_rank, m, rs->rank,
                                  micro, pos);
        uint64_t id = data_order_sample(&rs->order, slot);
        train_hooks *h = rs->t->hooks;
        if (h != NULL && h->step_samples != NULL && step < h->steps_cap)
            h->step_samples[slot] = id;
        data_sample(rs->t->train, id, rs->sample);
        fill_mask(rs, id);
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
}

/* Eval loss over eval_batches x B validation samples, split over ranks. */
static int run_eval(rank_state *rs, double *val_loss, acc_err *err)
{
    trainer *t = rs->t;
    const job_spec *s = &t->spec;
    int T = s->model.seq_len, m = s->micro_batch;
    int nb = s->eval_batches > 0 ? s->eval_batches : 1;
    uint64_t total = (uint64_t)nb * (uint64_t)s->train_batch_size;
    uint64_t lo = total * (uint64_t)rs->rank / (uint64_t)t->nranks;
    uint64_t hi = total * (uint64_t)(rs->rank + 1) / (uint64_t)t->nranks;
    uint64_t nval = data_num_samples(t->val);
    double sum = 0.0;
    for (uint64_t j = lo; j < hi; j += (uint64_t)m) {
        int n = (int)(hi - j < (uint64_t)m ? hi - j : (uint64_t)m);
        for (int pos = 0; pos < n; pos++) {
            data_sample(t->val, (j + (uint64_t)pos) % nval, rs->sample);
            for (int i = 0; i < T; i++) {
                rs->inputs[pos * T + i] = rs->sample[i];
                rs->targets[pos * T + i] = rs->sample[i + 1];
                rs->weights[pos * T + i] = 1.0f;
            }
        }
        double part;
        model_forward(rs->model, rs->inputs, rs->targets, rs->weights, n, 0, &part);
        sum += part;
    }
    float buf[4] = {0};
    put_double(buf, sum);
    int rc = kern_comm_allreduce(t->comm, rs->rank, buf, 4);
    if (rc != 0)
        return acc_err_set(err, rc, "", "cancelled");
    *val_loss = get_double(buf) / ((double)total * T);
    return 0;
}

static void emit_step(rank_state *rs, int step, double loss, double lr, double norm,
                      double seconds)
{
    trainer *t = rs->t;
    const job_spec *s = &t->spec;
    train_event *ev = calloc(1, sizeof *ev);
    if (ev == NULL)
        return; /* an event lost to host OOM; the run itself goes on */
    ev->kind = TEV_STEP;
    ev->step = step + 1;
    ev->loss = loss;
    ev->lr = lr;
    ev->grad_norm = norm;
    ev->tokens_per_s = seconds > 0 ? (double)s->train_batch_size * s->model.seq_len / seconds : 0;
    ev->micro_batch = s->micro_batch;
    ev->accum_steps = s->accum_steps;
    ev->nranks = t->nranks;
    for (int r = 0; r < t->nranks; r++) {
        ev->mem_in_use[r] = atomic_load_explicit(&t->mem_in_use[r], memory_order_relaxed);
        ev->mem_peak[r] = atomic_load_explicit(&t->mem_peak[r], memory_order_relaxed);
    }
    emit(t, ev);
    free(ev);
}

static void emit_simple(trainer *t, train_event_kind kind, int step, double val_loss,
                        const char *path)
{
    train_event *ev = calloc(1, sizeof *ev);
    if (ev == NULL)
        return;
    ev->kind = kind;
    ev->step = step;
    ev->val_loss = val_loss;
    ev->nranks = t->nranks;
    if (path != NULL)
        snprintf(ev->path, sizeof ev->path, "%s", path);
    emit(t, ev);
    free(ev);
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

static int save_weights(rank_state *rs, int step, acc_err *err)
{
    const job_spec *s = &rs->t->spec;
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/model_%08d.bin", s->output_dir, step) >= (int)sizeof path)
        return acc_err_set(err, ACC_EINVAL, "output_dir", "path too long");
    int rc = model_save_llmc(rs->model, path, err);
    if (rc == 0)
        emit_simple(rs->t, TEV_CHECKPOINT, step, 0.0, path);
    return rc;
}

/* After the step's all-reduce: clip, update, zero, report. */
static void finish_step(rank_state *rs, int step, double t0)
{
    trainer *t = rs->t;
    const job_spec *s = &t->spec;
    model_gpt2 *m = rs->model;
    double loss = get_double(m->grads + m->nparams);
    double norm = sqrt(model_grad_sumsq(m));
    double lr = optim_lr(s, step);
    model_adamw(m, (float)lr, &s->optim, (float)optim_clip_scale(norm, s->optim.grad_clip));
    model_zero_grad(m);
    if (rs->rank != 0)
        return;
    train_hooks *h = t->hooks;
    if (h != NULL && step < h->steps_cap) {
        if (h->step_loss)
            h->step_loss[step] = loss;
        if (h->step_grad_norm)
            h->step_grad_norm[step] = norm;
    }
    emit_step(rs, step, loss, lr, norm, now_s() - t0);
}

static int train_step(rank_state *rs, int step, acc_err *err)
{
    trainer *t = rs->t;
    const job_spec *s = &t->spec;
    model_gpt2 *m = rs->model;
    double t0 = now_s();
    double n_total = count_targets(rs, step);
    double loss_sum = 0.0;
    for (int micro = 0; micro < s->accum_steps; micro++) {
        if (check_cancel(t) != 0)
            return acc_err_set(err, ACC_ECANCELLED, "", "cancelled");
        load_micro(rs, step, micro, n_total);
        double part;
        model_forward(m, rs->inputs, rs->targets, rs->weights, s->micro_batch, 1, &part);
        model_backward(m, s->micro_batch);
        loss_sum += part;
    }
    put_double(m->grads + m->nparams, loss_sum);
    publish_memory(rs);
    /* the one gradient all-reduce of this optimizer step */
    int rc = kern_comm_allreduce(t->comm, rs->rank, m->grads, m->nparams + MODEL_GRAD_EXTRA);
    if (rc != 0)
        return acc_err_set(err, rc, "", "cancelled");
    finish_step(rs, step, t0);
    return 0;
}

static int maybe_eval_and_save(rank_state *rs, int step, acc_err *err)
{
    trainer *t = rs->t;
    const job_spec *s = &t->spec;
    int done = step + 1;
    if (t->val != NULL && s->eval_interval > 0 &&
        (done % s->eval_interval == 0 || done == s->max_steps)) {
        double vl = 0.0;
        int rc = run_eval(rs, &vl, err);
        if (rc != 0)
            return rc;
        if (rs->rank == 0) {
            if (t->hooks && t->hooks->step_val_loss && step < t->hooks->steps_cap)
                t->hooks->step_val_loss[step] = vl;
            emit_simple(t, TEV_EVAL, done, vl, NULL);
        }
    }
    if (rs->rank == 0 && s->output_dir[0] != '\0' &&
        ((s->checkpoint_interval > 0 && done % s->checkpoint_interval == 0) ||
         done == s->max_steps))
        return save_weights(rs, done, err);
    return 0;
}

static int rank_run(rank_state *rs, acc_err *err)
{
    trainer *t = rs->t;
    const job_spec *s = &t->spec;
    int rc = rank_setup(rs, err);
    if (rc == 0 && rs->rank == 0)
        rc = open_data(s, &t->train, &t->val, err);
    if (rc != 0)
        return rc;
    if ((rc = kern_comm_barrier(t->comm)) != 0) /* data is open for everyone */
        return acc_err_set(err, rc, "", "cancelled");
    if ((rc = data_order_init(&rs->order, data_num_samples(t->train), s->seed, err)) != 0)
        return rc;
    if (rs->rank == 0)
        emit_log(t, 0,
                 "gpt2 %.2fM parameters, %llu training samples; micro batch %d x %d "
                 "accumulation steps x %d devices; %.1f MiB on each %s device, %d threads",
                 (double)rs->model->nparams / 1e6,
                 (unsigned long long)data_num_samples(t->train), s->micro_batch,
                 s->accum_steps, t->nranks, (double)rs->dev->in_use / (1024.0 * 1024.0),
                 rs->dev->ops->backend, t->threads);
    double t0 = now_s();
    for (int step = 0; step < s->max_steps; step++) {
        if ((rc = train_step(rs, step, err)) != 0)
            return rc;
        if ((rc = maybe_eval_and_save(rs, step, err)) != 0)
            return rc;
        if (rs->rank == 0) {
            t->steps_done = step + 1;
            if (t->hooks != NULL)
                t->hooks->steps_done = step + 1;
        }
    }
    train_hooks *h = t->hooks;
    if (rs->rank == 0 && h != NULL) {
        h->seconds = now_s() - t0;
        h->nparams = rs->model->nparams;
        if (h->final_params != NULL && h->final_params_cap >= rs->model->nparams)
            rs->dev->ops->download(rs->dev, h->final_params, rs->model->params,
                                   rs->model->nparams * sizeof(float));
    }
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
    if (t->hooks != NULL)
        t->hooks->allreduce_calls = kern_comm_allreduce_calls(t->comm);
    emit(t, ev);
    free(ev);
}

static void *rank_main(void *arg)
{
    rank_ctx *rc = arg;
    trainer *t = rc->t;
    rank_state rs;
    memset(&rs, 0, sizeof rs);
    rs.t = t;
    rs.rank = rc->rank;
    acc_err err = {0};
    if (rank_run(&rs, &err) != 0) {
        if (err.code == ACC_ECANCELLED && atomic_load(&t->cancel))
            snprintf(err.msg, sizeof err.msg, "cancelled");
        fail(t, &err);
    }
    if (t->hooks != NULL && rs.dev != NULL)
        t->hooks->mem_peak[rs.rank] = rs.dev->peak;
    rank_teardown(&rs);
    if (atomic_fetch_sub(&t->live, 1) == 1)
        finish_run(t);
    return NULL;
}

/* ---- lifecycle */

static void trainer_destroy(trainer *t)
{
    data_close(t->train);
    data_close(t->val);
    kern_comm_destroy(t->comm);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

int trainer_start_hooked(const trainer_opts *o, train_hooks *h, trainer **out, acc_err *err)
{
    *out = NULL;
    const job_spec *s = o->spec;
    model_config cfg;
    int rc = check_batch(s, err);
    if (rc == 0)
        rc = resolve_config(s, &cfg, err);
    if (rc != 0)
        return rc;
    trainer *t = calloc(1, sizeof *t);
    if (t == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory");
    t->spec = *s;
    t->cfg = cfg;
    t->nranks = s->devices;
    t->threads = o->threads_per_device > 0 ? o->threads_per_device : 1;
    t->on_event = o->on_event;
    t->event_ctx = o->event_ctx;
    t->hooks = h;
    memcpy(t->devs, o->devices, (size_t)t->nranks * sizeof *t->devs);
    atomic_init(&t->cancel, 0);
    atomic_init(&t->live, t->nranks);
    if (pthread_mutex_init(&t->mu, NULL) != 0) {
        free(t);
        return acc_err_set(err, ACC_ENOMEM, "", "pthread_mutex_init failed");
    }
    if ((rc = kern_comm_create(t->nranks, &t->comm, err)) != 0) {
        trainer_destroy(t);
        return rc;
    }
    for (int r = 0; r < t->nranks; r++) {
        t->ranks[r].t = t;
        t->ranks[r].rank = r;
        if (pthread_create(&t->ranks[r].thread, NULL, rank_main, &t->ranks[r]) != 0) {
            /* the started ranks stop at their first barrier; the last one
             * to finish reports TEV_DONE with this error */
            acc_err e = {0};
            acc_err_set(&e, ACC_EINTERNAL, "", "cannot start rank thread %d", r);
            fail(t, &e);
            if (atomic_fetch_sub(&t->live, t->nranks - r) == t->nranks - r)
                finish_run(t);
            break;
        }
        t->ranks[r].started = 1;
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
    atomic_store(&t->cancel, 1);
    kern_comm_abort(t->comm);
}

void trainer_wait(trainer *t)
{
    if (t->joined)
        return;
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
