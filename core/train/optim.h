/* optim: learning-rate schedules and the gradient-clip factor.
 *
 * optim_lr() gives the learning rate of optimizer step `step` (0-based) for
 * the spec's schedule:
 *   constant       lr
 *   cosine         linear warmup from lr/warmup to lr over warmup_steps, then
 *                  cosine decay to min_lr at max_steps (min_lr after)
 *   warmup         DeepSpeed WarmupLR: log-shaped warmup from warmup_min_lr
 *                  to lr over warmup_steps, then lr
 *   warmup_decay   DeepSpeed WarmupDecayLR: the same warmup, then linear
 *                  decay to 0 at total_steps
 *   warmup_cosine  DeepSpeed WarmupCosineLR: warmup from warmup_min_lr, then
 *                  cosine from lr to cos_min_ratio*lr at total_steps
 * (DeepSpeed's warmup_type defaults to "log": lr grows with log(step+1) /
 * log(warmup_steps).) The AdamW update itself is a device kernel
 * (kern_ops.adamw); the model applies it per tensor with its decay flag.
 */
#ifndef ACC_OPTIM_H
#define ACC_OPTIM_H

#include "train_cfg.h"

double optim_lr(const train_cfg *spec, int step);

/* The schedule's lengths as a run resolved them: max_steps and
 * lr.warmup_steps, which num_train_epochs and lr.warmup_ratio give only
 * once the data is open (the trainer keeps them; the spec is not changed). */
typedef struct optim_steps {
    int max_steps, warmup_steps;
} optim_steps;

/* optim_lr with the run's lengths instead of the spec's. */
double optim_lr_run(const train_cfg *spec, const optim_steps *run, int step);

/* The factor gradients are multiplied by for global-norm clipping (1 when
 * clip is off or the norm is within it). */
double optim_clip_scale(double grad_norm, double clip);

#endif
