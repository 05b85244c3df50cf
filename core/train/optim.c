/* optim: see optim.h. */
#include "optim.h"

#include <math.h>

#define PI 3.14159265358979323846

static int total_steps(const train_cfg *s, const optim_steps *run)
{
    return s->lr.total_steps > 0 ? s->lr.total_steps : run->max_steps;
}

/* DeepSpeed's log warmup: 0 at step 0 ... 1 at step warmup-1 */
static double log_warmup(int step, int warmup)
{
    if (warmup <= 1)
        return 1.0;
    double g = log((double)step + 1.0) / log((double)warmup);
    return g > 1.0 ? 1.0 : g;
}

static double cosine_lr(const train_cfg *s, const optim_steps *run, int step)
{
    double lr = s->optim.lr, min_lr = s->lr.min_lr;
    int w = run->warmup_steps, total = run->max_steps;
    if (step < w)
        return lr * (step + 1) / w;
    if (step >= total || total <= w)
        return min_lr;
    double ratio = (double)(step - w) / (double)(total - w);
    return min_lr + 0.5 * (1.0 + cos(PI * ratio)) * (lr - min_lr);
}

static double warmup_lr(const train_cfg *s, const optim_steps *run, int step)
{
    double lo = s->lr.warmup_min_lr, hi = s->optim.lr;
    return lo + (hi - lo) * log_warmup(step, run->warmup_steps);
}

static double warmup_decay_lr(const train_cfg *s, const optim_steps *run, int step)
{
    int w = run->warmup_steps, total = total_steps(s, run);
    if (step < w)
        return warmup_lr(s, run, step);
    if (total <= w)
        return 0.0;
    double f = (double)(total - step) / (double)(total - w);
    return s->optim.lr * (f > 0.0 ? f : 0.0);
}

static double warmup_cosine_lr(const train_cfg *s, const optim_steps *run, int step)
{
    int w = run->warmup_steps, total = total_steps(s, run);
    double lr = s->optim.lr;
    if (step < w) {
        double lo = lr > 0 ? s->lr.warmup_min_lr / lr : 0.0;
        return lr * (lo + (1.0 - lo) * log_warmup(step, w));
    }
    double floor_ratio = s->lr.cos_min_ratio;
    if (step >= total || total <= w)
        return lr * floor_ratio;
    double progress = (double)(step - w) / (double)(total - w);
    return lr * (floor_ratio + (1.0 - floor_ratio) * 0.5 * (1.0 + cos(PI * progress)));
}

double optim_lr(const train_cfg *s, int step)
{
    const optim_steps run = {.max_steps = s->max_steps, .warmup_steps = s->lr.warmup_steps};
    return optim_lr_run(s, &run, step);
}

double optim_lr_run(const train_cfg *s, const optim_steps *run, int step)
{
    switch (s->lr.type) {
    case SPEC_LR_COSINE: return cosine_lr(s, run, step);
    case SPEC_LR_WARMUP: return step < run->warmup_steps ? warmup_lr(s, run, step) : s->optim.lr;
    case SPEC_LR_WARMUP_DECAY: return warmup_decay_lr(s, run, step);
    case SPEC_LR_WARMUP_COSINE: return warmup_cosine_lr(s, run, step);
    case SPEC_LR_CONSTANT:
    default: return s->optim.lr;
    }
}

double optim_clip_scale(double grad_norm, double clip)
{
    if (clip <= 0.0 || !(grad_norm > clip))
        return 1.0;
    return clip / grad_norm;
}
