/* mem_plan: see mem_plan.h. */
#include "mem_plan.h"

#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "safepath.h"

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* init_from a safetensors GPT-2: the spec's shape, checked against the file;
 * wpe keeps the file's rows. */
static int config_from_safetensors(const job_spec *spec, int fd, model_config *cfg, acc_err *err)
{
    const char *path = spec->model.init_from;
    int layers, channels, vocab, max_seq;
    int rc = model_config_from_spec(&spec->model, cfg, err);
    if (rc == 0)
        rc = ckpt_weights_shape_fd(fd, path, &layers, &channels, &vocab, &max_seq, err);
    if (rc != 0)
        return rc;
    if (layers != cfg->n_layer || channels != cfg->channels || vocab != cfg->vocab_size ||
        max_seq < spec->model.seq_len)
        return acc_err_set(err, ACC_EINVAL, "model.init_from",
                           "%s has n_layer %d, n_embd %d, vocab %d, %d positions; the spec asks for "
                           "%d, %d, %d, seq_len %d", path, layers, channels, vocab, max_seq,
                           cfg->n_layer, cfg->channels, cfg->vocab_size, spec->model.seq_len);
    cfg->max_seq_len = max_seq;
    return 0;
}

int plan_model_config(const job_spec *spec, model_config *cfg, acc_err *err)
{
    if (spec->model.init_from[0] == '\0')
        return model_config_from_spec(&spec->model, cfg, err);
    /* under the data roots, read through the descriptor checked (safepath.h) */
    int fd;
    int rc = sp_open_file(spec->data_roots, spec->model.init_from, "model.init_from", &fd, NULL, 0, err);
    if (rc != 0)
        return rc;
    rc = ends_with(spec->model.init_from, ".safetensors")
             ? config_from_safetensors(spec, fd, cfg, err)
             : model_config_from_fd(fd, spec->model.init_from, &spec->model, cfg, err);
    close(fd);
    return rc;
}

int plan_device_bytes(const job_spec *spec, int micro_batch, bool recompute, uint64_t *bytes,
                      acc_err *err)
{
    model_config cfg;
    int rc = plan_model_config(spec, &cfg, err);
    if (rc != 0)
        return rc;
    if (micro_batch < 1)
        return acc_err_set(err, ACC_EINVAL, "train_micro_batch_size_per_gpu", "must be >= 1");
    *bytes = model_device_bytes(&cfg, micro_batch, spec->model.seq_len, recompute);
    return 0;
}

void plan_cuda_bf16_split(const model_config *cfg, int micro_batch, int seq_len, uint64_t *a,
                          uint64_t *b)
{
    uint64_t n = (uint64_t)micro_batch * (uint64_t)seq_len;
    uint64_t c = (uint64_t)cfg->channels, vp = (uint64_t)cfg->padded_vocab_size;
    uint64_t wide = 4 * c > vp ? 4 * c : vp;
    uint64_t bb = vp * c;
    if (4 * c * c > bb)
        bb = 4 * c * c;
    if (n * 4 * c > bb)
        bb = n * 4 * c;
    *a = 2 * n * wide;
    *b = 2 * bb;
}

uint64_t plan_cuda_bf16_bytes(const model_config *cfg, int micro_batch, int seq_len)
{
    uint64_t a, b;
    plan_cuda_bf16_split(cfg, micro_batch, seq_len, &a, &b);
    return a + b;
}

uint64_t plan_act_bytes(const model_config *cfg, kern_dev_kind kind, spec_precision precision,
                        int micro_batch, int seq_len, bool recompute)
{
    uint64_t acts = model_act_bytes(cfg, micro_batch, seq_len, recompute);
    if (kind == KERN_DEV_CUDA && precision == SPEC_BF16)
        acts += plan_cuda_bf16_bytes(cfg, micro_batch, seq_len);
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
    for (int d = m - 1; d >= 1; d--)
        if (per_rank % d == 0)
            return d;
    return 0;
}

int plan_next_larger_micro(int per_rank, int m)
{
    for (int d = m + 1; d <= per_rank; d++)
        if (per_rank % d == 0)
            return d;
    return 0;
}

static plan_row make_row(const model_config *cfg, const job_spec *spec, int per_rank, int m,
                         bool recompute, uint64_t usable, kern_dev_kind kind)
{
    plan_row r = {.micro_batch = m, .accum_steps = per_rank / m, .recompute = recompute};
    r.state_bytes = model_state_bytes(cfg);
    r.act_bytes = plan_act_bytes(cfg, kind, spec->precision, m, spec->model.seq_len, recompute);
    r.peak_bytes = r.state_bytes + r.act_bytes;
    r.fits = r.peak_bytes <= usable;
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

int plan_candidates(const job_spec *spec, uint64_t budget, plan_row *rows, int max, int *n,
                    int *chosen, acc_err *err)
{
    return plan_candidates_on(spec, KERN_DEV_CPU, budget, rows, max, n, chosen, err);
}

int plan_candidates_on(const job_spec *spec, kern_dev_kind kind, uint64_t budget, plan_row *rows,
                       int max, int *n, int *chosen, acc_err *err)
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
    if (rc != 0)
        return rc;
    int per_rank = spec->train_batch_size / spec->devices;
    uint64_t usable = plan_usable_bytes(budget);
    bool rec = spec->activation_checkpointing;
    for (int m = 1; m <= per_rank && *n < max; m++)
        if (per_rank % m == 0)
            rows[(*n)++] = make_row(&cfg, spec, per_rank, m, rec, usable, kind);
    int nmain = *n;
    if (!rec && spec->oom_adapt && *n < max)
        rows[(*n)++] = make_row(&cfg, spec, per_rank, 1, true, usable, kind);
    *chosen = pick(rows, nmain, *n);
    return 0;
}
