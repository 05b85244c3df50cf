/* job_train_cfg: job_spec -> train_cfg (job_train_cfg.h). */
#include "job_train_cfg.h"

#include <string.h>

/* A char array copied whole; both sides must have the same size. */
#define COPY_ARRAY(dst, src)                                                                    \
    do {                                                                                        \
        _Static_assert(sizeof(dst) == sizeof(src), "job_spec and train_cfg disagree: " #dst);   \
        memcpy((dst), (src), sizeof(dst));                                                      \
    } while (0)

void job_spec_train_cfg(const job_spec *s, train_cfg *out)
{
    memset(out, 0, sizeof *out);
    COPY_ARRAY(out->name, s->name);
    out->model = s->model;
    out->data = s->data;
    out->train_batch_size = s->train_batch_size;
    out->micro_batch = s->micro_batch;
    out->accum_steps = s->accum_steps;
    out->devices = s->devices;
    out->nodes = s->nodes;
    out->micro_auto = s->micro_auto;
    out->given_batch = s->given_batch;
    out->given_micro = s->given_micro;
    out->given_accum = s->given_accum;
    out->precision = s->precision;
    out->activation_checkpointing = s->activation_checkpointing;
    out->lean_activations = s->lean_activations;
    out->activation_offload = s->activation_offload;
    out->zero_stage = s->zero_stage;
    out->optim = s->optim;
    out->lr = s->lr;
    out->max_steps = s->max_steps;
    out->max_steps_given = s->max_steps_given;
    out->num_train_epochs = s->num_train_epochs;
    out->eval_interval = s->eval_interval;
    out->eval_batches = s->eval_batches;
    out->checkpoint_interval = s->checkpoint_interval;
    out->seed = s->seed;
    out->oom_adapt = s->oom_adapt;
    out->checkpoint_on_cancel = s->checkpoint_on_cancel;
    out->save_total_limit = s->save_total_limit;
    COPY_ARRAY(out->export_dir, s->export_dir);
    COPY_ARRAY(out->resume_from, s->resume_from);
    COPY_ARRAY(out->eval_prompts, s->eval_prompts);
    out->save_dtype = s->save_dtype;
    out->lora = s->lora;
    out->merge_lora = s->merge_lora;
    COPY_ARRAY(out->output_dir, s->output_dir);
    COPY_ARRAY(out->data_roots, s->data_roots);
    COPY_ARRAY(out->output_root, s->output_root);
    COPY_ARRAY(out->job_uid, s->job_uid);
    out->adopt_unnamed = s->adopt_unnamed;
    out->plan_only = s->plan_only;
    out->offload_optimizer = s->offload_optimizer;
    out->offload_pin_memory = s->offload_pin_memory;
    out->offload_param = s->offload_param;
    out->offload_param_pin = s->offload_param_pin;
}
