/* train_cfg: the one conversion job_spec -> train_cfg (job_train_cfg.h)
 * copies every field the engine reads and nothing of the service's own,
 * and train_cfg_data gives the data layer its part. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "job_train_cfg.h"

/* A spec with every engine field set to a value of its own (none zero). */
static void full_spec(job_spec *s)
{
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "run-7");
    snprintf(s->model.arch, sizeof s->model.arch, "llama");
    s->model.n_layer = 3;
    s->model.n_head = 5;
    s->model.n_embd = 40;
    s->model.seq_len = 33;
    s->model.vocab_size = 300;
    s->model.padded_vocab_size = 320;
    s->model.n_kv_head = 1;
    s->model.intermediate_size = 96;
    snprintf(s->model.from, sizeof s->model.from, "/models/x");
    snprintf(s->data.train, sizeof s->data.train, "/data/a.jsonl\n/data/b.jsonl");
    snprintf(s->data.val, sizeof s->data.val, "/data/v.jsonl");
    s->data.format = SPEC_DATA_CHAT;
    s->data.train_on = SPEC_TRAIN_ALL;
    s->data.packing = true;
    s->data.overlong = SPEC_OVERLONG_DROP;
    snprintf(s->data.cache_dir, sizeof s->data.cache_dir, "/state/cache");
    s->train_batch_size = 24;
    s->micro_batch = 2;
    s->accum_steps = 3;
    s->devices = 2;
    s->nodes = 2;
    s->micro_auto = true;
    s->given_batch = 24;
    s->given_micro = 2;
    s->given_accum = 3;
    s->precision = SPEC_BF16;
    s->activation_checkpointing = true;
    s->lean_activations = true;
    s->activation_offload = true;
    s->zero_stage = 2;
    s->optim = (spec_optim){.lr = 3e-4, .beta1 = 0.8, .beta2 = 0.9, .eps = 1e-7, .weight_decay = 0.05, .grad_clip = 2};
    s->lr = (spec_lr){.type = SPEC_LR_WARMUP_COSINE, .warmup_steps = 4, .min_lr = 1e-5, .warmup_min_lr = 1e-6,
                      .cos_min_ratio = 0.1, .total_steps = 90, .warmup_ratio = 0.2};
    s->max_steps = 90;
    s->max_steps_given = true;
    s->num_train_epochs = 1.5;
    s->eval_interval = 7;
    s->eval_batches = 2;
    s->checkpoint_interval = 11;
    s->seed = 0x1234567890ull;
    s->oom_adapt = true;
    s->checkpoint_on_cancel = true;
    s->save_total_limit = 3;
    snprintf(s->export_dir, sizeof s->export_dir, "/out/alice/final");
    snprintf(s->resume_from, sizeof s->resume_from, "/out/job/ckpt-10");
    snprintf(s->eval_prompts, sizeof s->eval_prompts, "[\"hi\"]");
    s->save_dtype = SPEC_SAVE_BF16;
    s->lora.r = 8;
    s->lora.alpha = 16;
    s->lora.all_linear = true;
    s->lora.n_targets = 1;
    snprintf(s->lora.targets[0], sizeof s->lora.targets[0], "q_proj");
    s->merge_lora = true;
    snprintf(s->output_dir, sizeof s->output_dir, "/out/job");
    snprintf(s->data_roots, sizeof s->data_roots, "/data\n/models");
    snprintf(s->output_root, sizeof s->output_root, "/out");
    snprintf(s->job_uid, sizeof s->job_uid, "0123456789abcdef0123456789abcdef");
    s->adopt_unnamed = true;
    s->plan_only = true;
    s->offload_optimizer = true;
    s->offload_pin_memory = false; /* apart from offload_optimizer: a swap shows */
    s->offload_param = true;
    s->offload_param_pin = false; /* apart from offload_param: a swap shows */
}

static void test_every_engine_field(void **state)
{
    (void)state;
    job_spec *s = malloc(sizeof *s);
    train_cfg *c = malloc(sizeof *c);
    assert_non_null(s);
    assert_non_null(c);
    full_spec(s);
    memset(c, 0x5a, sizeof *c); /* whatever was there before */
    job_spec_train_cfg(s, c);
    assert_string_equal(c->name, "run-7");
    assert_memory_equal(&c->model, &s->model, sizeof c->model);
    assert_memory_equal(&c->data, &s->data, sizeof c->data);
    assert_int_equal(c->train_batch_size, 24);
    assert_int_equal(c->micro_batch, 2);
    assert_int_equal(c->accum_steps, 3);
    assert_int_equal(c->devices, 2);
    assert_int_equal(c->nodes, 2);
    assert_true(c->micro_auto);
    assert_int_equal(c->given_batch, 24);
    assert_int_equal(c->given_micro, 2);
    assert_int_equal(c->given_accum, 3);
    assert_int_equal(c->precision, SPEC_BF16);
    assert_true(c->activation_checkpointing);
    assert_true(c->lean_activations);
    assert_true(c->activation_offload);
    assert_int_equal(c->zero_stage, 2);
    assert_memory_equal(&c->optim, &s->optim, sizeof c->optim);
    assert_memory_equal(&c->lr, &s->lr, sizeof c->lr);
    assert_int_equal(c->max_steps, 90);
    assert_true(c->max_steps_given);
    assert_true(c->num_train_epochs == 1.5);
    assert_int_equal(c->eval_interval, 7);
    assert_int_equal(c->eval_batches, 2);
    assert_int_equal(c->checkpoint_interval, 11);
    assert_true(c->seed == 0x1234567890ull);
    assert_true(c->oom_adapt);
    assert_true(c->checkpoint_on_cancel);
    assert_int_equal(c->save_total_limit, 3);
    assert_string_equal(c->export_dir, "/out/alice/final");
    assert_string_equal(c->resume_from, "/out/job/ckpt-10");
    assert_string_equal(c->eval_prompts, "[\"hi\"]");
    assert_int_equal(c->save_dtype, SPEC_SAVE_BF16);
    assert_memory_equal(&c->lora, &s->lora, sizeof c->lora);
    assert_true(c->merge_lora);
    assert_string_equal(c->output_dir, "/out/job");
    assert_string_equal(c->data_roots, "/data\n/models");
    assert_string_equal(c->output_root, "/out");
    assert_string_equal(c->job_uid, "0123456789abcdef0123456789abcdef");
    assert_true(c->adopt_unnamed);
    assert_true(c->plan_only);
    assert_true(c->offload_optimizer);
    assert_false(c->offload_pin_memory);
    s->offload_pin_memory = true;
    job_spec_train_cfg(s, c);
    assert_true(c->offload_optimizer && c->offload_pin_memory);
    assert_true(c->offload_param);
    assert_false(c->offload_param_pin);
    s->offload_param_pin = true;
    s->offload_param = false;
    job_spec_train_cfg(s, c);
    assert_true(!c->offload_param && c->offload_param_pin);
    free(s);
    free(c);
}

/* The service's own keys change nothing the engine sees, and every byte
 * of the result is set (two different previous contents, one result). */
static void test_service_fields_stay_out(void **state)
{
    (void)state;
    job_spec *s = malloc(sizeof *s), *t = malloc(sizeof *t);
    train_cfg *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    assert_true(s && t && a && b);
    full_spec(s);
    full_spec(t);
    t->priority = 9;
    t->max_restarts = 4;
    snprintf(t->output_name, sizeof t->output_name, "final");
    snprintf(t->ignored, sizeof t->ignored, "logging_steps");
    snprintf(t->deepspeed_file, sizeof t->deepspeed_file, "/data/ds.json");
    snprintf(t->model.hub_repo, sizeof t->model.hub_repo, "org/model"); /* part of spec_model: copied */
    memset(a, 0x00, sizeof *a);
    memset(b, 0xff, sizeof *b);
    job_spec_train_cfg(s, a);
    job_spec_train_cfg(s, b);
    assert_memory_equal(a, b, sizeof *a);
    job_spec_train_cfg(t, b);
    assert_string_equal(b->model.hub_repo, "org/model");
    memset(b->model.hub_repo, 0, sizeof b->model.hub_repo);
    assert_memory_equal(a, b, sizeof *a);
    free(s);
    free(t);
    free(a);
    free(b);
}

static void test_data_view(void **state)
{
    (void)state;
    job_spec *s = malloc(sizeof *s);
    train_cfg *c = malloc(sizeof *c);
    data_cfg *d = malloc(sizeof *d);
    assert_true(s && c && d);
    full_spec(s);
    job_spec_train_cfg(s, c);
    memset(d, 0x33, sizeof *d);
    train_cfg_data(c, d);
    assert_memory_equal(&d->data, &c->data, sizeof d->data);
    assert_memory_equal(&d->model, &c->model, sizeof d->model);
    assert_string_equal(d->data_roots, "/data\n/models");
    assert_int_equal(d->model.seq_len, 33);
    assert_int_equal(d->data.format, SPEC_DATA_CHAT);
    free(s);
    free(c);
    free(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_engine_field),
        cmocka_unit_test(test_service_fields_stay_out),
        cmocka_unit_test(test_data_view),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
