/* trainer_run: the trainer with hooks, for tests, benchmarks and tools.
 *
 * trainer_start_hooked() is trainer_start() plus a train_hooks the run
 * fills in as it goes (and an optional per-token target mask). Everything
 * in the hooks is written by the rank threads and may be read once the run
 * has ended (after trainer_wait or trainer_free, or in trainer_run_sync's
 * return). trainer_run_sync() runs a job to its end on the calling thread's
 * behalf and returns the TEV_DONE status, filling `err` with its message.
 */
#ifndef ACC_TRAINER_RUN_H
#define ACC_TRAINER_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "trainer.h"

/* Fill mask[0..seq_len) for sample `sample`: 1 where the target token counts
 * in the loss, 0 where it does not (padding, a short final sample). */
typedef void (*train_mask_fn)(void *ctx, uint64_t sample, int seq_len, uint8_t *mask);

/* Fault injection: return nonzero to make rank `rank` run out of device
 * memory before micro-step `micro` of an attempt at optimizer step `step`
 * with micro batch `m`, as an allocation inside the step would on a GPU. */
typedef int (*train_oom_fn)(void *ctx, int rank, int step, int micro, int m);

typedef struct train_hooks {
    /* in */
    train_mask_fn target_mask;   /* NULL: every target counts */
    void *mask_ctx;
    train_oom_fn inject_oom;     /* NULL: none */
    void *oom_ctx;
    int steps_cap;               /* entries in the per-step arrays below */
    double *step_loss;           /* [steps_cap] or NULL */
    double *step_grad_norm;      /* [steps_cap] or NULL */
    uint64_t *step_samples;      /* [steps_cap * train_batch_size] sample ids, slot order */
    double *step_val_loss;       /* [steps_cap], NAN where no eval ran */
    float *final_params;         /* rank 0's weights at the end, [final_params_cap] */
    size_t final_params_cap;
    size_t bucket_bytes;         /* gradient bucket size; 0: TRAIN_BUCKET_BYTES */
    /* out */
    size_t nparams;
    uint64_t allreduce_calls;    /* reductions of the job's communicator */
    uint64_t bucket_calls;       /* bucket starts (each reduction has >= 1) */
    uint64_t mem_peak[TRAIN_MAX_RANKS];
    uint64_t mem_model[TRAIN_MAX_RANKS]; /* bytes the model allocated per rank (last split) */
    uint64_t mem_optim[TRAIN_MAX_RANKS]; /* the rank's AdamW moments, measured at creation */
    uint64_t mem_grads[TRAIN_MAX_RANKS]; /* the rank's gradient buffer (with the tail) */
    int steps_done;
    double seconds;              /* wall time of the training loop (rank 0) */
    /* the split at the end (after any out-of-memory adaptation) */
    int final_micro, final_accum;
    bool final_recompute;
    int oom_adjusts;             /* TEV_OOM_ADJUST events emitted */
    uint64_t host_peak;          /* the job's host_mem peak (trainer_opts.host_memory's budget) */
} train_hooks;

/* Device bytes one rank of this job allocates (parameters, gradients, AdamW
 * moments, activations for micro_batch x seq_len, in recompute mode when
 * spec->activation_checkpointing): the per-device peak the run will report
 * when no out-of-memory adaptation happens. For dry runs; mem_plan.h has
 * the planner (candidates over m). */
int trainer_device_bytes(const train_cfg *spec, uint64_t *bytes, acc_err *err);

int trainer_start_hooked(const trainer_opts *o, train_hooks *h, trainer **out, acc_err *err);

/* Join the rank threads (the run must be ending: TEV_DONE, or cancel). */
void trainer_wait(trainer *t);

/* Start, wait, free. Returns the run's final status (0, ACC_ECANCELLED or
 * the failure's code) and its message in err. */
int trainer_run_sync(const trainer_opts *o, train_hooks *h, acc_err *err);

#endif
