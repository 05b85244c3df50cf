/* trainer: runs one job's training loop on its placed devices.
 *
 * trainer_start() spawns one worker thread per device (rank) and returns at
 * once. Each optimizer step runs accum_steps micro-steps of micro_batch
 * samples per rank, accumulating gradients in place, then exactly one
 * reduction of the gradients (an all-reduce; a reduce-scatter under ZeRO
 * stage 2), clip, AdamW step (of the rank's shard under ZeRO stage 1 and
 * 2, followed by an all-gather of the parameters). Progress is reported through `on_event`,
 * called from worker threads: the callee must copy the event and return
 * quickly (the daemon queues it and wakes its loop with uv_async_send); it
 * must never call back into the trainer.
 *
 * Memory: with spec->micro_auto, trainer_start picks the micro batch with
 * the planner (mem_plan.h) against the smallest device budget. When a rank
 * runs out of device memory in a step and spec->oom_adapt is set, all ranks
 * drop the step, move to a smaller split with the same train_batch_size
 * (then activation recomputation at m = 1) and redo the step with the same
 * samples; TEV_OOM_ADJUST reports it and every later TEV_STEP carries the
 * split in use. Otherwise the run ends with ACC_EOOM, bytes needed and the
 * budget in the message.
 *
 * The last event of every run is TEV_DONE (status 0, ACC_ECANCELLED or the
 * failure's code with a message); after it the daemon calls
 * trainer_free(), which joins the threads.
 */
#ifndef ACC_TRAINER_H
#define ACC_TRAINER_H

#include <stdint.h>

#include "err.h"
#include "train_cfg.h"
#include "kern_discover.h"

#define TRAIN_MAX_RANKS 16
/* Floats of the trainer's span at the end of the gradient buffer (the
 * step's loss sum, the out-of-memory flag, the eval sum), which ride the
 * step's one reduction, and the ZeRO-2 norm partials (3 per rank); see
 * trainer.c. */
#define TRAIN_SLOTS 64
/* Gradient bucket size of the step's reduction (PyTorch DDP's default):
 * GPT-2 124M gets one bucket per block, a small model a single bucket. */
#define TRAIN_BUCKET_BYTES ((size_t)25 << 20)
/* A checkpoint that finds the output's file system full (ckpt.h's
 * ACC_ENOSPACE) pauses the run instead of failing it: rank 0 says so in a
 * TEV_LOG whose message starts with this prefix, waits until there is room
 * (or a cancel / shutdown), writes the checkpoint and says "resumed: ...".
 * The other ranks wait in the next step's reduction meanwhile. */
#define TRAIN_PAUSED_PREFIX "paused: "

typedef enum train_event_kind {
    TEV_STEP = 0,    /* an optimizer step completed */
    TEV_EVAL,        /* eval loss at a step */
    TEV_OOM_ADJUST,  /* the split changed after an out-of-memory */
    TEV_CHECKPOINT,  /* a checkpoint was written */
    TEV_LOG,         /* free-form message */
    TEV_SPLIT_UP,    /* "auto": the micro batch was raised at a checkpoint (from/to fields) */
    TEV_DONE,        /* the run ended; always the last event */
    TEV_CKPT_REJECTED, /* a checkpoint passed over at resume: path, msg = why */
    TEV_PROGRESS,    /* data preparation: stage (in path), done, total; max_steps once known */
    TEV_SAMPLE,      /* an eval_prompts answer: index, prompt, text */
} train_event_kind;

typedef struct train_event {
    train_event_kind kind;
    int step;              /* optimizer steps completed so far */
    /* TEV_STEP */
    double loss, lr, grad_norm, tokens_per_s;
    int micro_batch, accum_steps;
    int nranks;
    uint64_t mem_in_use[TRAIN_MAX_RANKS], mem_peak[TRAIN_MAX_RANKS];
    /* kern_device_mem_info per rank: bytes held from the device (CUDA's
     * cache included) and free on it */
    uint64_t mem_reserved[TRAIN_MAX_RANKS], mem_free[TRAIN_MAX_RANKS];
    /* per rank: bytes of its AdamW moments (its shard under ZeRO >= 1) and
     * of its gradient buffer (whole at every stage) */
    uint64_t mem_optim[TRAIN_MAX_RANKS], mem_grads[TRAIN_MAX_RANKS];
    /* TEV_STEP: the step's tokens over all ranks:
     * loss-carrying targets, real input tokens (padding excluded), input
     * positions (B x seq_len, padding included); its wall time; the
     * model's FLOPs a token (6 N + 12 L T C, model_flops_per_token) */
    uint64_t loss_tokens, input_tokens, input_positions;
    double step_seconds, flops_per_token;
    /* TEV_EVAL */
    double val_loss;
    uint64_t val_tokens;   /* loss-carrying tokens evaluated */
    uint64_t val_samples;  /* validation samples evaluated */
    /* TEV_OOM_ADJUST */
    int from_micro, from_accum, to_micro, to_accum;
    bool recompute;        /* activation recomputation switched on */
    uint64_t bytes_asked, bytes_free;
    /* TEV_PROGRESS: the stage ("tokenize", "cache") is in path */
    uint64_t done, total;
    int max_steps;         /* TEV_PROGRESS: > 0 when num_train_epochs set it */
    /* TEV_CHECKPOINT / TEV_CKPT_REJECTED: path; TEV_LOG / TEV_DONE /
     * TEV_CKPT_REJECTED: message */
    char path[PATH_MAX];
    int status;            /* TEV_DONE: 0, ACC_ECANCELLED or an error code */
    char msg[512];
    /* TEV_SAMPLE: eval_prompts[index], as written (a
     * conversation: its JSON), and the answer; both cut at a UTF-8
     * character boundary to fit */
    int index;
    char prompt[1024];
    char text[4096];
} train_event;

typedef void (*train_event_fn)(void *ctx, const train_event *ev);

typedef struct trainer_opts {
    const train_cfg *spec;          /* copied by trainer_start */
    const kern_device_info *devices; /* spec->devices entries, one per rank */
    int threads_per_device;        /* CPU devices: kernel threads per rank */
    int checkpoint_keep;           /* checkpoints kept in output_dir (0 = 2) */
    /* prepare on a thread of the trainer's own (find and verify the resume
     * checkpoint, read init_from, plan, open the communicator), so that
     * trainer_start returns at once without touching a file; a failure
     * there is the run's TEV_DONE. false: trainer_start returns it. */
    bool async_start;
    train_event_fn on_event;
    void *event_ctx;
    /* Rank processes (daemon/rank_main.c, docs/multinode.md): NULL = every
     * rank of the job is a thread of this process, over a communicator of
     * the trainer's own. Else this process runs the one rank `rank` of the
     * spec->devices ranks over `comm` (kept open, not freed), and the other
     * ranks are other processes; `devices` still has spec->devices entries. */
    struct kern_comm *comm;
    int rank;
    /* with spec->oom_adapt and a given micro batch
     * the planner predicts does not fit the smallest device: start at the
     * largest micro batch it says fits (a log event says so) instead of
     * running out of memory down to it. The daemon sets it; engine tests of
     * the out-of-memory path leave it off. */
    bool start_where_fits;
    /* bytes of host memory the job may keep by choice (host_mem.h: the
     * activation checkpoints of activation_checkpointing.offload); past it
     * the job fails with ACC_ENOMEM naming host memory. 0 = unlimited. */
    uint64_t host_memory;
} trainer_opts;

typedef struct trainer trainer;

/* Check what can be checked before queuing: data and init files exist
 * under the spec's roots (safepath.h), are regular files of the right
 * format, tokens < vocab_size, the model shape is consistent, resume_from
 * holds a usable checkpoint of this model not past max_steps. ACC_EINVAL
 * with the field ("data.train", "model.init_from", "resume_from"). Reads
 * files: never on the daemon's loop thread. */
int trainer_check_spec(const train_cfg *spec, acc_err *err);

int trainer_start(const trainer_opts *o, trainer **out, acc_err *err);

/* Ask the run to stop; it stops at the next micro-step and ends with
 * TEV_DONE(status = ACC_ECANCELLED). Safe from any thread, more than once. */
void trainer_cancel(trainer *t);

/* Stop for a daemon shutdown: like trainer_cancel, but rank 0 first writes
 * a checkpoint of the last completed step (when the job has an output_dir),
 * so the job resumes from there. Safe from any thread. */
void trainer_preempt(trainer *t);

/* Join the worker threads and free. Call after TEV_DONE was delivered. */
void trainer_free(trainer *t);

#endif
