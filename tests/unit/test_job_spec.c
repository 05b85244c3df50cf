/* job_spec: the batch triple, the deepspeed object, every class of error
 * naming its field, paths under the configured roots. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "job_spec.h"

typedef struct fixture {
    char dir[256];
    acc_conf conf;
    char data_file[512];
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/acc-spec-XXXXXX");
    if (f == NULL || mkdtemp(f->dir) == NULL)
        return -1;
    acc_err err = {0};
    conf_defaults(&f->conf);
    conf_set(&f->conf, "state_dir", f->dir, &err);
    conf_finalize(&f->conf, &err);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "mkdir -p %s/data %s/out/job1 && echo hello world >%s/data/a.txt", f->dir, f->dir,
             f->dir);
    if (system(cmd) != 0)
        return -1;
    snprintf(f->data_file, sizeof f->data_file, "%s/data/a.txt", f->dir);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
    if (system(cmd) != 0)
        return -1;
    free(f);
    return 0;
}

/* Parse `extra` keys appended to a minimal valid spec. */
static int parse_with(fixture *f, const char *extra, job_spec *s, acc_err *err)
{
    char text[4096];
    snprintf(text, sizeof text, "{\"data\":{\"train\":\"%s\"}%s%s}", f->data_file, extra[0] ? "," : "", extra);
    return job_spec_parse(text, strlen(text), &f->conf, s, err);
}

static void expect_field(fixture *f, const char *extra, const char *want_field)
{
    job_spec s;
    acc_err err = {0};
    int rc = parse_with(f, extra, &s, &err);
    if (rc != ACC_EINVAL || strcmp(err.field, want_field) != 0)
        fail_msg("spec {%s}: rc %d field '%s' msg '%s', want field '%s'", extra, rc, err.field, err.msg, want_field);
}

static void test_minimal_and_defaults(void **state)
{
    fixture *f = *state;
    job_spec s;
    acc_err err = {0};
    assert_int_equal(parse_with(f, "\"train_batch_size\":8", &s, &err), 0);
    assert_int_equal(s.train_batch_size, 8);
    assert_int_equal(s.micro_batch, 8);
    assert_int_equal(s.accum_steps, 1);
    assert_int_equal(s.devices, 1);
    assert_string_equal(s.model.arch, "gpt2");
    assert_int_equal(s.model.padded_vocab_size, 256);
    assert_int_equal(s.lr.total_steps, s.max_steps);
    assert_true(s.oom_adapt);
    assert_string_equal(s.data.train, f->data_file);
}

static void test_full_design_spec(void **state)
{
    fixture *f = *state;
    job_spec s;
    acc_err err = {0};
    const char *extra =
        "\"name\":\"tiny-gpt\",\"model\":{\"arch\":\"gpt2\",\"n_layer\":4,\"n_head\":4,\"n_embd\":128,"
        "\"seq_len\":128,\"vocab_size\":256,\"init_from\":null},"
        "\"train_batch_size\":32,\"train_micro_batch_size_per_gpu\":2,\"gradient_accumulation_steps\":\"auto\","
        "\"devices\":2,\"precision\":\"fp32\",\"activation_checkpointing\":false,"
        "\"optimizer\":{\"type\":\"adamw\",\"lr\":6e-4,\"betas\":[0.9,0.95],\"eps\":1e-8,\"weight_decay\":0.1,"
        "\"grad_clip\":1.0},\"lr_schedule\":{\"type\":\"cosine\",\"warmup_steps\":10,\"min_lr\":6e-5},"
        "\"max_steps\":200,\"eval_interval\":50,\"checkpoint_interval\":100,\"seed\":1337,\"priority\":0,"
        "\"oom\":{\"adapt\":true}";
    assert_int_equal(parse_with(f, extra, &s, &err), 0);
    assert_string_equal(s.name, "tiny-gpt");
    assert_int_equal(s.accum_steps, 8);
    assert_int_equal(s.micro_batch, 2);
    assert_false(s.micro_auto);
    assert_int_equal(s.lr.type, SPEC_LR_COSINE);
    assert_int_equal(s.lr.warmup_steps, 10);
    assert_true(s.optim.beta2 == 0.95);
    assert_int_equal(s.max_steps, 200);
}

static void test_batch_triple(void **state)
{
    fixture *f = *state;
    job_spec s;
    acc_err err = {0};
    assert_int_equal(parse_with(f, "\"train_batch_size\":32,\"gradient_accumulation_steps\":4,\"devices\":2", &s, &err), 0);
    assert_int_equal(s.micro_batch, 4);
    assert_int_equal(parse_with(f, "\"train_micro_batch_size_per_gpu\":3,\"gradient_accumulation_steps\":5", &s, &err), 0);
    assert_int_equal(s.train_batch_size, 15);
    assert_int_equal(parse_with(f, "\"train_batch_size\":16,\"train_micro_batch_size_per_gpu\":\"auto\"", &s, &err), 0);
    assert_true(s.micro_auto);
    assert_int_equal(s.micro_batch * s.accum_steps * s.devices, 16);

    assert_int_equal(parse_with(f, "\"train_batch_size\":32,\"train_micro_batch_size_per_gpu\":2,"
                                   "\"gradient_accumulation_steps\":16,\"devices\":4", &s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "train_batch_size");
    assert_string_equal(err.msg, "train_batch_size 32 != 2 * 16 * 4 (micro * accum * world)");
    expect_field(f, "\"train_batch_size\":30,\"train_micro_batch_size_per_gpu\":4", "train_batch_size");
    expect_field(f, "", "train_batch_size");
    expect_field(f, "\"train_batch_size\":0", "train_batch_size");
    expect_field(f, "\"train_batch_size\":\"big\"", "train_batch_size");
    expect_field(f, "\"gradient_accumulation_steps\":1.5,\"train_batch_size\":2", "gradient_accumulation_steps");
}

static void test_errors_name_the_field(void **state)
{
    fixture *f = *state;
    expect_field(f, "\"train_batch_size\":8,\"bogus\":1", "bogus");
    expect_field(f, "\"train_batch_size\":8,\"optimizer\":{\"lr\":-1}", "optimizer.lr");
    expect_field(f, "\"train_batch_size\":8,\"optimizer\":{\"lr\":\"fast\"}", "optimizer.lr");
    expect_field(f, "\"train_batch_size\":8,\"optimizer\":{\"betas\":[0.9]}", "optimizer.betas");
    expect_field(f, "\"train_batch_size\":8,\"optimizer\":{\"type\":\"sgd\"}", "optimizer.type");
    expect_field(f, "\"train_batch_size\":8,\"optimizer\":{\"momentum\":0.9}", "optimizer.momentum");
    expect_field(f, "\"train_batch_size\":8,\"model\":{\"n_head\":3,\"n_embd\":64}", "model.n_embd");
    expect_field(f, "\"train_batch_size\":8,\"model\":{\"n_layer\":0}", "model.n_layer");
    expect_field(f, "\"train_batch_size\":8,\"model\":{\"arch\":\"falcon\"}", "model.arch");
    expect_field(f, "\"train_batch_size\":8,\"model\":[1]", "model");
    expect_field(f, "\"train_batch_size\":8,\"devices\":0", "devices");
    expect_field(f, "\"train_batch_size\":8,\"devices\":true", "devices");
    expect_field(f, "\"train_batch_size\":8,\"precision\":\"fp8\"", "precision");
    expect_field(f, "\"train_batch_size\":8,\"name\":5", "name");
    expect_field(f, "\"train_batch_size\":8,\"max_steps\":0", "max_steps");
    expect_field(f, "\"train_batch_size\":8,\"oom\":{\"adapt\":\"yes\"}", "oom.adapt");
    expect_field(f, "\"train_batch_size\":8,\"lr_schedule\":{\"type\":\"cosine\",\"min_lr\":1}", "lr_schedule.min_lr");
    expect_field(f, "\"train_batch_size\":8,\"lr_schedule\":{\"type\":\"step\"}", "lr_schedule.type");

    job_spec s;
    acc_err err = {0};
    assert_int_equal(job_spec_parse("{\"data\":", 8, &f->conf, &s, &err), ACC_EINVAL);
    assert_non_null(strstr(err.msg, "malformed JSON"));
    assert_int_equal(job_spec_parse("[1,2]", 5, &f->conf, &s, &err), ACC_EINVAL);
    assert_int_equal(job_spec_parse("{\"train_batch_size\":8}", 22, &f->conf, &s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "data");
    const char *dup = "{\"devices\":1,\"devices\":2}";
    assert_int_equal(job_spec_parse(dup, strlen(dup), &f->conf, &s, &err), ACC_EINVAL);
}

/* max_restarts (worker deaths) and nodes (world = devices x nodes) */
static void test_restarts_and_nodes(void **state)
{
    fixture *f = *state;
    job_spec s;
    acc_err err = {0};
    assert_int_equal(parse_with(f, "\"train_batch_size\":8", &s, &err), 0);
    assert_int_equal(s.max_restarts, 0);
    assert_int_equal(s.nodes, 1);
    assert_int_equal(parse_with(f, "\"train_batch_size\":16,\"train_micro_batch_size_per_gpu\":2,\"devices\":2,"
                                   "\"nodes\":2,\"max_restarts\":3", &s, &err), 0);
    assert_int_equal(s.max_restarts, 3);
    assert_int_equal(s.nodes, 2);
    assert_int_equal(s.accum_steps, 2); /* 16 = 2 x 2 x (2 x 2) */
    assert_int_equal(parse_with(f, "\"train_batch_size\":16,\"train_micro_batch_size_per_gpu\":2,"
                                   "\"gradient_accumulation_steps\":2,\"devices\":2,\"nodes\":3", &s, &err), ACC_EINVAL);
    assert_string_equal(err.msg, "train_batch_size 16 != 2 * 2 * 6 (micro * accum * world)");
    expect_field(f, "\"train_batch_size\":8,\"max_restarts\":-1", "max_restarts");
    expect_field(f, "\"train_batch_size\":8,\"max_restarts\":101", "max_restarts");
    expect_field(f, "\"train_batch_size\":8,\"max_restarts\":true", "max_restarts");
    expect_field(f, "\"train_batch_size\":8,\"nodes\":0", "nodes");
    expect_field(f, "\"train_batch_size\":32,\"devices\":4,\"nodes\":8", "nodes");
}

/* save: the saved weights' dtype, "auto" by default; bad values name save.dtype */
static void test_save(void **state)
{
    fixture *f = *state;
    job_spec s;
    acc_err err = {0};
    const char *names[] = {"auto", "float32", "bfloat16", "float16"};
    const spec_save_dtype want[] = {SPEC_SAVE_AUTO, SPEC_SAVE_F32, SPEC_SAVE_BF16, SPEC_SAVE_F16};
    assert_int_equal(parse_with(f, "\"train_batch_size\":8", &s, &err), 0);
    assert_int_equal(s.save_dtype, SPEC_SAVE_AUTO);
    for (int i = 0; i < 4; i++) {
        char extra[160];
        snprintf(extra, sizeof extra,
                 "\"train_batch_size\":8,\"save\":{\"format\":\"hf\",\"merge_lora\":false,\"dtype\":\"%s\"}",
                 names[i]);
        assert_int_equal(parse_with(f, extra, &s, &err), 0);
        assert_int_equal(s.save_dtype, want[i]);
    }
    expect_field(f, "\"train_batch_size\":8,\"save\":{\"dtype\":\"fp8\"}", "save.dtype");
    expect_field(f, "\"train_batch_size\":8,\"save\":{\"dtype\":16}", "save.dtype");
    expect_field(f, "\"train_batch_size\":8,\"save\":{\"dtyp\":\"float16\"}", "save.dtyp");
    expect_field(f, "\"train_batch_size\":8,\"save\":{\"format\":\"gguf\"}", "save.format");
    expect_field(f, "\"train_batch_size\":8,\"save\":{\"merge_lora\":true}", "save.merge_lora");
    expect_field(f, "\"train_batch_size\":8,\"save\":\"hf\"", "save");
}

/* lora: PEFT's keys and defaults; each bad value names its key path */
static void test_lora(void **state)
{
    fixture *f = *state;
    job_spec s;
    acc_err err = {0};
    assert_int_equal(parse_with(f, "\"train_batch_size\":8", &s, &err), 0);
    assert_int_equal(s.lora.r, 0);
    assert_false(s.merge_lora);
    assert_int_equal(parse_with(f, "\"train_batch_size\":8,\"lora\":{}", &s, &err), 0);
    assert_int_equal(s.lora.r, 8); /* PEFT's defaults */
    assert_true(s.lora.alpha == 8 && s.lora.dropout == 0 && s.lora.n_targets == 0 && !s.lora.all_linear);
    assert_int_equal(parse_with(f, "\"train_batch_size\":8,\"lora\":{\"r\":16,\"alpha\":32,"
                                   "\"dropout\":0.0,\"target_modules\":[\"q_proj\",\"v_proj\"]},"
                                   "\"save\":{\"merge_lora\":true}", &s, &err), 0);
    assert_true(s.lora.r == 16 && s.lora.alpha == 32 && s.lora.n_targets == 2 && s.merge_lora);
    assert_string_equal(s.lora.targets[1], "v_proj");
    assert_int_equal(parse_with(f, "\"train_batch_size\":8,\"lora\":{\"lora_alpha\":4,"
                                   "\"target_modules\":\"all-linear\"}", &s, &err), 0);
    assert_true(s.lora.all_linear && s.lora.alpha == 4);
    expect_field(f, "\"train_batch_size\":8,\"lora\":{\"r\":0}", "lora.r");
    expect_field(f, "\"train_batch_size\":8,\"lora\":{\"r\":-4}", "lora.r");
    expect_field(f, "\"train_batch_size\":8,\"lora\":{\"r\":100000}", "lora.r");
    expect_field(f, "\"train_batch_size\":8,\"lora\":{\"r\":\"8\"}", "lora.r");
    expect_field(f, "\"train_batch_size\":8,\"lora\":{\"alpha\":0}", "lora.alpha");
    expect_field(f, "\"train_batch_size\":8,\"lora\":{\"dropout\":1.5}", "lora.dropout");
    expect_field(f, "\"train_batch_size\":8,\"lora\":{\"dropout\":0.1}", "lora.dropout");
    expect_field(f, "\"train_batch_size\":8,\"lora\":{\"rank\":8}", "lora.rank");
    expect_field(f, "\"train_batch_size\":8,\"lora\":{\"target_modules\":\"all\"}", "lora.target_modules");
    expect_field(f, "\"train_batch_size\":8,\"lora\":{\"target_modules\":[]}", "lora.target_modules");
    expect_field(f, "\"train_batch_size\":8,\"lora\":{\"target_modules\":[\"q_proj\",7]}",
                 "lora.target_modules[1]");
    expect_field(f, "\"train_batch_size\":8,\"lora\":{\"target_modules\":[\"a.b\"]}",
                 "lora.target_modules[0]");
    expect_field(f, "\"train_batch_size\":8,\"lora\":{\"target_modules\":[\"q_proj\",\"q_proj\"]}",
                 "lora.target_modules[1]");
    expect_field(f, "\"train_batch_size\":8,\"lora\":[8]", "lora");
}

static void test_paths(void **state)
{
    fixture *f = *state;
    job_spec s;
    acc_err err = {0};
    char text[2048];
    snprintf(text, sizeof text, "{\"data\":{\"train\":\"/etc/passwd\"},\"train_batch_size\":8}");
    assert_int_equal(job_spec_parse(text, strlen(text), &f->conf, &s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "data.train");
    snprintf(text, sizeof text, "{\"data\":{\"train\":\"%s/data/../../x\"},\"train_batch_size\":8}", f->dir);
    assert_int_equal(job_spec_parse(text, strlen(text), &f->conf, &s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "data.train");
    snprintf(text, sizeof text, "{\"data\":{\"train\":\"%s/data/missing.txt\"},\"train_batch_size\":8}", f->dir);
    assert_int_equal(job_spec_parse(text, strlen(text), &f->conf, &s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "data.train");
    /* relative paths are under the first data root */
    snprintf(text, sizeof text, "{\"data\":{\"train\":\"a.txt\",\"val\":\"a.txt\"},\"train_batch_size\":8}");
    assert_int_equal(job_spec_parse(text, strlen(text), &f->conf, &s, &err), 0);
    assert_string_equal(s.data.val, f->data_file);
    /* a symlink pointing out of the root is refused */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "ln -sf /etc/passwd %s/data/link.txt", f->dir);
    assert_int_equal(system(cmd), 0);
    snprintf(text, sizeof text, "{\"data\":{\"train\":\"link.txt\"},\"train_batch_size\":8}");
    assert_int_equal(job_spec_parse(text, strlen(text), &f->conf, &s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "data.train");
    /* token shard globs, wildcard in the file name only */
    snprintf(text, sizeof text, "{\"data\":{\"train\":\"shard_*.bin\",\"format\":\"tokens\"},\"train_batch_size\":8}");
    assert_int_equal(job_spec_parse(text, strlen(text), &f->conf, &s, &err), 0);
    assert_int_equal(s.data.format, SPEC_DATA_TOKENS);
    snprintf(text, sizeof text, "{\"data\":{\"train\":\"%s\"},\"resume_from\":\"/tmp\",\"train_batch_size\":8}",
             f->data_file);
    assert_int_equal(job_spec_parse(text, strlen(text), &f->conf, &s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "resume_from");
    snprintf(text, sizeof text, "{\"data\":{\"train\":\"%s\"},\"resume_from\":\"%s/out/job1\",\"train_batch_size\":8}",
             f->data_file, f->dir);
    assert_int_equal(job_spec_parse(text, strlen(text), &f->conf, &s, &err), 0);
}

/* Issue 16 defect 16: the DeepSpeed keys accepted without effect keep
 * their type, and integers past 64 bits name their key. */
static void test_ignored_keys_and_big_integers(void **state)
{
    fixture *f = *state;
    job_spec s;
    acc_err err = {0};
    const char *ok[] = {"\"deepspeed\":{\"train_batch_size\":8,\"steps_per_print\":10,\"wall_clock_breakdown\":false}",
                        "\"deepspeed\":{\"train_batch_size\":8,\"steps_per_print\":2000,\"wall_clock_breakdown\":true}"};
    for (size_t i = 0; i < 2; i++)
        assert_int_equal(parse_with(f, ok[i], &s, &err), 0);
    expect_field(f, "\"deepspeed\":{\"steps_per_print\":\"x\"}", "deepspeed.steps_per_print");
    expect_field(f, "\"deepspeed\":{\"steps_per_print\":[1]}", "deepspeed.steps_per_print");
    expect_field(f, "\"deepspeed\":{\"steps_per_print\":0}", "deepspeed.steps_per_print");
    expect_field(f, "\"deepspeed\":{\"steps_per_print\":true}", "deepspeed.steps_per_print");
    expect_field(f, "\"deepspeed\":{\"wall_clock_breakdown\":1}", "deepspeed.wall_clock_breakdown");
    expect_field(f, "\"deepspeed\":{\"wall_clock_breakdown\":\"no\"}", "deepspeed.wall_clock_breakdown");
    expect_field(f, "\"deepspeed\":{\"wall_clock_breakdown\":{}}", "deepspeed.wall_clock_breakdown");
    expect_field(f, "\"seed\":18446744073709551616", "seed");
    expect_field(f, "\"seed\":9223372036854775808", "seed");
    expect_field(f, "\"max_steps\":-9223372036854775809", "max_steps");
    expect_field(f, "\"optimizer\":{\"lr\":1e19,\"betas\":[0.9,99999999999999999999]}", "optimizer.betas");
    expect_field(f, "\"deepspeed\":{\"steps_per_print\":123456789012345678901234567890}",
                 "deepspeed.steps_per_print");
    assert_int_equal(parse_with(f, "\"seed\":9223372036854775808", &s, &err), ACC_EINVAL);
    assert_null(strstr(err.msg, "malformed"));
    assert_non_null(strstr(err.msg, "9223372036854775808"));
    /* a real malformation is still reported as one */
    assert_int_equal(job_spec_parse("{\"seed\":1", 10, &f->conf, &s, &err), ACC_EINVAL);
    assert_non_null(strstr(err.msg, "malformed JSON"));
}

static void test_deepspeed(void **state)
{
    fixture *f = *state;
    job_spec s;
    acc_err err = {0};
    const char *ds =
        "\"devices\":2,\"deepspeed\":{\"train_batch_size\":64,\"train_micro_batch_size_per_gpu\":4,"
        "\"gradient_accumulation_steps\":\"auto\",\"bf16\":{\"enabled\":true},\"gradient_clipping\":0.5,"
        "\"steps_per_print\":10,"
        "\"optimizer\":{\"type\":\"AdamW\",\"params\":{\"lr\":3e-4,\"betas\":[0.8,0.99],\"eps\":1e-6,"
        "\"weight_decay\":0.01}},"
        "\"scheduler\":{\"type\":\"WarmupDecayLR\",\"params\":{\"warmup_min_lr\":0,\"warmup_max_lr\":3e-4,"
        "\"warmup_num_steps\":20,\"total_num_steps\":500}}}";
    assert_int_equal(parse_with(f, ds, &s, &err), 0);
    assert_int_equal(s.train_batch_size, 64);
    assert_int_equal(s.accum_steps, 8);
    assert_int_equal(s.precision, SPEC_BF16);
    assert_true(s.optim.grad_clip == 0.5);
    assert_true(s.optim.beta1 == 0.8);
    assert_true(s.optim.weight_decay == 0.01);
    assert_int_equal(s.lr.type, SPEC_LR_WARMUP_DECAY);
    assert_int_equal(s.lr.warmup_steps, 20);
    assert_int_equal(s.lr.total_steps, 500);

    assert_int_equal(parse_with(f, "\"deepspeed\":{\"train_batch_size\":8,\"scheduler\":{\"type\":\"WarmupCosineLR\","
                                   "\"params\":{\"total_num_steps\":100,\"cos_min_ratio\":0.1,\"warmup_num_steps\":5}}}",
                                &s, &err), 0);
    assert_int_equal(s.lr.type, SPEC_LR_WARMUP_COSINE);
    assert_true(s.lr.cos_min_ratio == 0.1);

    /* DeepSpeed's own activation_checkpointing tuning means nothing here
     * (cpu_checkpointing does: test_activation_offload); amp enabled is not
     * supported; a misspelt key gets its suggestion */
    assert_int_equal(parse_with(f, "\"deepspeed\":{\"train_batch_size\":8,\"activation_checkpointing\":"
                                   "{\"partition_activations\":true},\"amp\":{\"enabled\":false}}", &s, &err), 0);
    assert_non_null(strstr(s.ignored, "deepspeed.activation_checkpointing.partition_activations"));
    expect_field(f, "\"deepspeed\":{\"train_batch_size\":8,\"amp\":{\"enabled\":true}}", "deepspeed.amp.enabled");
    assert_int_equal(parse_with(f, "\"deepspeed\":{\"train_batch_size\":8,\"zero_optimisation\":{}}", &s, &err),
                     ACC_EINVAL);
    assert_string_equal(err.field, "deepspeed.zero_optimisation");
    assert_non_null(strstr(err.msg, "did you mean 'zero_optimization'?"));
    expect_field(f, "\"deepspeed\":{\"train_batch_size\":8,\"fp16\":{\"enabled\":true}}", "deepspeed.fp16.enabled");
    expect_field(f, "\"deepspeed\":{\"train_batch_size\":8,\"optimizer\":{\"type\":\"Lamb\"}}", "deepspeed.optimizer.type");
    expect_field(f, "\"deepspeed\":{\"train_batch_size\":8,\"optimizer\":{\"type\":\"AdamW\",\"params\":{\"lr\":-1}}}",
                 "deepspeed.optimizer.params.lr");
    expect_field(f, "\"deepspeed\":{\"train_batch_size\":8,\"scheduler\":{\"type\":\"OneCycle\"}}", "deepspeed.scheduler.type");
    expect_field(f, "\"deepspeed\":{\"train_batch_size\":8,\"bf16\":{\"enabled\":1}}", "deepspeed.bf16.enabled");
    expect_field(f, "\"train_batch_size\":16,\"deepspeed\":{\"train_batch_size\":8}", "deepspeed.train_batch_size");
    expect_field(f, "\"deepspeed\":{\"train_batch_size\":32,\"train_micro_batch_size_per_gpu\":2,"
                    "\"gradient_accumulation_steps\":16},\"devices\":4", "train_batch_size");
}

/* zero_optimization: top level or in deepspeed, stages 0..3; offload and
 * other DeepSpeed ZeRO keys "not supported yet"; sharding
 * needs two devices. Each error names its key path. */
/* zero_optimization.offload_optimizer: "cpu" at stages 0, 1, 2 (top level
 * or in deepspeed), "none" or absent is off, pin_memory read; DeepSpeed's
 * other keys accepted and listed as ignored; "nvme", other devices, a
 * non-object, a non-boolean pin_memory and unknown keys each a 400 naming
 * the key path. */
static void test_offload_optimizer(void **state)
{
    fixture *f = *state;
    job_spec s;
    acc_err err = {0};
    assert_int_equal(parse_with(f, "\"train_batch_size\":8", &s, &err), 0);
    assert_false(s.offload_optimizer);
    assert_int_equal(parse_with(f, "\"train_batch_size\":8,\"zero_optimization\":{\"offload_optimizer\":"
                                   "{\"device\":\"cpu\"}}", &s, &err), 0);
    assert_true(s.offload_optimizer);
    assert_false(s.offload_pin_memory);
    assert_null(strstr(s.ignored, "offload_optimizer")); /* honoured */
    assert_int_equal(s.zero_stage, 0);
    for (int z = 1; z <= 2; z++) {
        char extra[256];
        snprintf(extra, sizeof extra, "\"train_batch_size\":8,\"devices\":2,\"zero_optimization\":{\"stage\":%d,"
                 "\"offload_optimizer\":{\"device\":\"cpu\",\"pin_memory\":true,\"ratio\":1}}", z);
        assert_int_equal(parse_with(f, extra, &s, &err), 0);
        assert_true(s.offload_optimizer && s.offload_pin_memory);
        assert_int_equal(s.zero_stage, z);
        assert_non_null(strstr(s.ignored, "zero_optimization.offload_optimizer.ratio"));
    }
    assert_int_equal(parse_with(f, "\"devices\":2,\"deepspeed\":{\"train_batch_size\":8,\"zero_optimization\":{"
                                   "\"stage\":1,\"offload_optimizer\":{\"device\":\"cpu\"}}}", &s, &err), 0);
    assert_true(s.offload_optimizer);
    assert_int_equal(parse_with(f, "\"train_batch_size\":8,\"zero_optimization\":{\"offload_optimizer\":"
                                   "{\"device\":\"none\",\"pin_memory\":true}}", &s, &err), 0);
    assert_false(s.offload_optimizer || s.offload_pin_memory);
    assert_non_null(strstr(s.ignored, "zero_optimization.offload_optimizer")); /* no effect */
    assert_int_equal(parse_with(f, "\"train_batch_size\":8,\"zero_optimization\":{\"offload_optimizer\":{}}", &s,
                                &err), 0);
    assert_false(s.offload_optimizer);
    assert_int_equal(parse_with(f, "\"train_batch_size\":8,\"zero_optimization\":{\"offload_optimizer\":"
                                   "{\"device\":\"nvme\"}}", &s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "zero_optimization.offload_optimizer.device");
    assert_non_null(strstr(err.msg, "not supported yet"));
    expect_field(f, "\"train_batch_size\":8,\"zero_optimization\":{\"offload_optimizer\":{\"device\":\"gpu\"}}",
                 "zero_optimization.offload_optimizer.device");
    expect_field(f, "\"train_batch_size\":8,\"zero_optimization\":{\"offload_optimizer\":{\"device\":7}}",
                 "zero_optimization.offload_optimizer.device");
    expect_field(f, "\"train_batch_size\":8,\"zero_optimization\":{\"offload_optimizer\":\"cpu\"}",
                 "zero_optimization.offload_optimizer");
    expect_field(f, "\"train_batch_size\":8,\"zero_optimization\":{\"offload_optimizer\":"
                    "{\"device\":\"cpu\",\"pin_memory\":1}}", "zero_optimization.offload_optimizer.pin_memory");
    expect_field(f, "\"train_batch_size\":8,\"zero_optimization\":{\"offload_optimizer\":"
                    "{\"device\":\"cpu\",\"pin_memroy\":true}}", "zero_optimization.offload_optimizer.pin_memroy");
}

/* Hugging Face's gradient_checkpointing: an alias of activation_checkpointing. */
static void test_gradient_checkpointing_alias(void **state)
{
    fixture *f = *state;
    job_spec s;
    acc_err err = {0};
    assert_int_equal(parse_with(f, "\"train_batch_size\":8,\"gradient_checkpointing\":true", &s, &err), 0);
    assert_true(s.activation_checkpointing);
    assert_int_equal(parse_with(f, "\"train_batch_size\":8,\"gradient_checkpointing\":false", &s, &err), 0);
    assert_false(s.activation_checkpointing);
    assert_int_equal(parse_with(f, "\"train_batch_size\":8,\"gradient_checkpointing\":true,"
                                   "\"activation_checkpointing\":true", &s, &err), 0);
    assert_true(s.activation_checkpointing);
    expect_field(f, "\"train_batch_size\":8,\"gradient_checkpointing\":true,\"activation_checkpointing\":false",
                 "gradient_checkpointing");
    expect_field(f, "\"train_batch_size\":8,\"gradient_checkpointing\":1", "gradient_checkpointing");
}

/* lean_activations: a boolean, off by default */
static void test_lean_activations(void **state)
{
    fixture *f = *state;
    job_spec s;
    acc_err err = {0};
    assert_int_equal(parse_with(f, "\"train_batch_size\":8", &s, &err), 0);
    assert_false(s.lean_activations);
    assert_int_equal(parse_with(f, "\"train_batch_size\":8,\"lean_activations\":true", &s, &err), 0);
    assert_true(s.lean_activations);
    expect_field(f, "\"train_batch_size\":8,\"lean_activations\":\"yes\"", "lean_activations");
}

/* activation_checkpointing: a boolean as before, or an object whose
 * offload (cpu_checkpointing its alias) implies the recomputation; a
 * DeepSpeed section's cpu_checkpointing when the spec has none of its own */
static void write_file(const char *path, const char *text);

static void test_activation_offload(void **state)
{
    fixture *f = *state;
    job_spec s;
    acc_err err = {0};
    struct { const char *extra; bool rec, off; } ok[] = {
        {"\"activation_checkpointing\":true", true, false},
        {"\"activation_checkpointing\":false", false, false},
        {"\"activation_checkpointing\":{}", true, false},
        {"\"activation_checkpointing\":{\"enabled\":false}", false, false},
        {"\"activation_checkpointing\":{\"offload\":true}", true, true},
        {"\"activation_checkpointing\":{\"enabled\":true,\"offload\":false}", true, false},
        {"\"activation_checkpointing\":{\"cpu_checkpointing\":true}", true, true},
        {"\"deepspeed\":{\"activation_checkpointing\":{\"cpu_checkpointing\":true,\"number_checkpoints\":4}}", true, true},
        {"\"deepspeed\":{\"activation_checkpointing\":{\"partition_activations\":true}}", false, false},
        {"\"activation_checkpointing\":false,\"deepspeed\":{\"activation_checkpointing\":{\"cpu_checkpointing\":true}}",
         false, false},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        char extra[512];
        snprintf(extra, sizeof extra, "\"train_batch_size\":8,%s", ok[i].extra);
        if (parse_with(f, extra, &s, &err) != 0)
            fail_msg("{%s}: %s: %s", ok[i].extra, err.field, err.msg);
        if (s.activation_checkpointing != ok[i].rec || s.activation_offload != ok[i].off)
            fail_msg("{%s}: recompute %d offload %d", ok[i].extra, s.activation_checkpointing, s.activation_offload);
    }
    assert_int_equal(parse_with(f, "\"train_batch_size\":8", &s, &err), 0);
    assert_false(s.activation_checkpointing || s.activation_offload);
    expect_field(f, "\"train_batch_size\":8,\"activation_checkpointing\":{\"enabled\":false,\"offload\":true}",
                 "activation_checkpointing.offload");
    expect_field(f, "\"train_batch_size\":8,\"activation_checkpointing\":{\"offload\":1}",
                 "activation_checkpointing.offload");
    expect_field(f, "\"train_batch_size\":8,\"activation_checkpointing\":{\"ofload\":true}",
                 "activation_checkpointing.ofload");
    expect_field(f, "\"train_batch_size\":8,\"activation_checkpointing\":\"yes\"", "activation_checkpointing");
    expect_field(f, "\"train_batch_size\":8,\"deepspeed\":{\"activation_checkpointing\":{\"cpu_checkpointing\":1}}",
                 "deepspeed.activation_checkpointing.cpu_checkpointing");
    expect_field(f, "\"train_batch_size\":8,\"deepspeed\":{\"activation_checkpointing\":{\"bogus\":1}}",
                 "deepspeed.activation_checkpointing.bogus");
    /* a DeepSpeed config file's section likewise */
    char path[600];
    snprintf(path, sizeof path, "%s/data/ds_ckpt.json", f->dir);
    write_file(path, "{\"train_batch_size\": 8, \"activation_checkpointing\": {\"partition_activations\": false,"
                     " \"cpu_checkpointing\": true, \"contiguous_memory_optimization\": false}}");
    assert_int_equal(parse_with(f, "\"deepspeed\":\"ds_ckpt.json\"", &s, &err), 0);
    assert_true(s.activation_checkpointing && s.activation_offload);
    assert_non_null(strstr(s.ignored, "deepspeed.activation_checkpointing.contiguous_memory_optimization"));
}

static void test_zero(void **state)
{
    fixture *f = *state;
    job_spec s;
    acc_err err = {0};
    assert_int_equal(parse_with(f, "\"train_batch_size\":8", &s, &err), 0);
    assert_int_equal(s.zero_stage, 0);
    assert_int_equal(parse_with(f, "\"train_batch_size\":8,\"devices\":2,\"zero_optimization\":{\"stage\":2}", &s,
                                &err), 0);
    assert_int_equal(s.zero_stage, 2);
    assert_int_equal(parse_with(f, "\"devices\":4,\"deepspeed\":{\"train_batch_size\":8,"
                                   "\"zero_optimization\":{\"stage\":1}}", &s, &err), 0);
    assert_int_equal(s.zero_stage, 1);
    assert_int_equal(parse_with(f, "\"devices\":2,\"zero_optimization\":{\"stage\":1},\"deepspeed\":{"
                                   "\"train_batch_size\":8,\"zero_optimization\":{\"stage\":1}}", &s, &err), 0);
    assert_int_equal(s.zero_stage, 1);
    /* stage 0 on one device is plain data parallelism over one replica */
    assert_int_equal(parse_with(f, "\"train_batch_size\":8,\"zero_optimization\":{\"stage\":0}", &s, &err), 0);
    assert_int_equal(parse_with(f, "\"train_batch_size\":8,\"zero_optimization\":{}", &s, &err), 0);
    assert_int_equal(s.zero_stage, 0);

    /* stage 3: at the top level, in deepspeed, and the native zero_stage;
     * DeepSpeed's stage3_* tuning keys accepted and listed as ignored */
    assert_int_equal(parse_with(f, "\"train_batch_size\":8,\"devices\":2,\"zero_optimization\":{\"stage\":3}",
                                &s, &err), 0);
    assert_int_equal(s.zero_stage, 3);
    assert_int_equal(parse_with(f, "\"devices\":4,\"deepspeed\":{\"train_batch_size\":8,"
                                   "\"zero_optimization\":{\"stage\":3,\"stage3_prefetch_bucket_size\":\"auto\","
                                   "\"stage3_param_persistence_threshold\":100000,"
                                   "\"stage3_max_live_parameters\":1000000000,\"stage3_max_reuse_distance\":1000000000,"
                                   "\"stage3_gather_16bit_weights_on_model_save\":true,"
                                   "\"stage3_gather_fp16_weights_on_model_save\":false}}", &s, &err), 0);
    assert_int_equal(s.zero_stage, 3);
    assert_string_equal(s.ignored, "deepspeed.zero_optimization.stage3_prefetch_bucket_size, "
                                   "deepspeed.zero_optimization.stage3_param_persistence_threshold, "
                                   "deepspeed.zero_optimization.stage3_max_live_parameters, "
                                   "deepspeed.zero_optimization.stage3_max_reuse_distance, "
                                   "deepspeed.zero_optimization.stage3_gather_16bit_weights_on_model_save, "
                                   "deepspeed.zero_optimization.stage3_gather_fp16_weights_on_model_save");
    /* stage 3 on one device, with LoRA, with eval_prompts: 400s naming the key */
    assert_int_equal(parse_with(f, "\"train_batch_size\":8,\"zero_optimization\":{\"stage\":3}", &s, &err),
                     ACC_EINVAL);
    assert_string_equal(err.field, "zero_optimization.stage");
    assert_non_null(strstr(err.msg, "devices >= 2"));
    assert_int_equal(parse_with(f, "\"train_batch_size\":8,\"devices\":2,\"zero_optimization\":{\"stage\":3},"
                                   "\"lora\":{\"r\":4}", &s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "zero_optimization.stage");
    assert_non_null(strstr(err.msg, "LoRA"));
    assert_int_equal(parse_with(f, "\"train_batch_size\":8,\"devices\":2,\"zero_optimization\":{\"stage\":3},"
                                   "\"eval_prompts\":[\"hi\"]", &s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "eval_prompts");
    expect_field(f, "\"train_batch_size\":8,\"devices\":2,\"zero_optimization\":{\"stage\":4}",
                 "zero_optimization.stage");
    assert_int_equal(parse_with(f, "\"train_batch_size\":8,\"devices\":2,\"zero_optimization\":{\"stage\":2,"
                                   "\"offload_optimizer\":{\"device\":\"nvme\"}}", &s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "zero_optimization.offload_optimizer.device");
    assert_non_null(strstr(err.msg, "not supported yet"));
    assert_int_equal(parse_with(f, "\"devices\":2,\"deepspeed\":{\"train_batch_size\":8,\"zero_optimization\":{"
                                   "\"stage\":1,\"offload_param\":{\"device\":\"nvme\"}}}", &s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "deepspeed.zero_optimization.offload_param.device");
    assert_non_null(strstr(err.msg, "not supported yet"));
    /* offload_param "cpu": stage 3 only, with offload_optimizer; then taken,
     * on one device too */
    assert_int_equal(parse_with(f, "\"train_batch_size\":8,\"devices\":2,\"zero_optimization\":{\"stage\":2,"
                                   "\"offload_optimizer\":{\"device\":\"cpu\"},\"offload_param\":{\"device\":\"cpu\"}}",
                                &s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "zero_optimization.offload_param");
    assert_non_null(strstr(err.msg, "stage 3"));
    assert_int_equal(parse_with(f, "\"train_batch_size\":8,\"devices\":2,\"zero_optimization\":{\"stage\":3,"
                                   "\"offload_param\":{\"device\":\"cpu\"}}", &s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "zero_optimization.offload_param");
    assert_non_null(strstr(err.msg, "offload_optimizer"));
    assert_int_equal(parse_with(f, "\"train_batch_size\":8,\"deepspeed\":{\"zero_optimization\":{\"stage\":3,"
                                   "\"offload_optimizer\":{\"device\":\"cpu\"},\"offload_param\":{\"device\":\"cpu\","
                                   "\"pin_memory\":true,\"buffer_count\":5,\"buffer_size\":1e8,\"max_in_cpu\":1e9}}}",
                                &s, &err), 0);
    assert_true(s.offload_param && s.offload_param_pin && s.zero_stage == 3 && s.devices == 1);
    assert_non_null(strstr(s.ignored, "deepspeed.zero_optimization.offload_param.max_in_cpu"));
    /* stage 3 on one device without it: still the 400 */
    assert_int_equal(parse_with(f, "\"train_batch_size\":8,\"zero_optimization\":{\"stage\":3,"
                                   "\"offload_optimizer\":{\"device\":\"cpu\"}}", &s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "zero_optimization.stage");
    expect_field(f, "\"train_batch_size\":8,\"devices\":2,\"zero_optimization\":{\"stage\":3,"
                    "\"offload_param\":{\"device\":\"gpu\"}}", "zero_optimization.offload_param.device");
    expect_field(f, "\"train_batch_size\":8,\"devices\":2,\"zero_optimization\":{\"stage\":3,"
                    "\"offload_param\":{\"device\":\"cpu\",\"bufer_count\":2}}",
                 "zero_optimization.offload_param.bufer_count");
    expect_field(f, "\"train_batch_size\":8,\"devices\":2,\"zero_optimization\":{\"stage\":3,"
                    "\"offload_param\":\"cpu\"}", "zero_optimization.offload_param");
    /* "none": no effect, listed as ignored with DeepSpeed's tuning keys */
    assert_int_equal(parse_with(f, "\"train_batch_size\":8,\"devices\":2,\"zero_optimization\":{\"stage\":2,"
                                   "\"offload_param\":{\"device\":\"none\",\"buffer_size\":1000}}", &s, &err), 0);
    assert_false(s.offload_param);
    assert_non_null(strstr(s.ignored, "zero_optimization.offload_param.buffer_size"));
    assert_non_null(strstr(s.ignored, "zero_optimization.offload_param"));
    /* tuning keys: accepted, listed as ignored */
    assert_int_equal(parse_with(f, "\"train_batch_size\":8,\"devices\":2,\"zero_optimization\":{\"stage\":2,"
                                   "\"overlap_comm\":true,\"reduce_bucket_size\":\"auto\"}", &s, &err), 0);
    assert_string_equal(s.ignored, "zero_optimization.overlap_comm, zero_optimization.reduce_bucket_size");
    expect_field(f, "\"train_batch_size\":8,\"devices\":2,\"zero_optimization\":{\"stag\":2}",
                 "zero_optimization.stag");
    expect_field(f, "\"train_batch_size\":8,\"devices\":2,\"zero_optimization\":{\"stage\":\"2\"}",
                 "zero_optimization.stage");
    expect_field(f, "\"train_batch_size\":8,\"devices\":2,\"zero_optimization\":{\"stage\":-1}",
                 "zero_optimization.stage");
    expect_field(f, "\"train_batch_size\":8,\"devices\":2,\"zero_optimization\":2", "zero_optimization");
    expect_field(f, "\"devices\":2,\"zero_optimization\":{\"stage\":1},\"deepspeed\":{\"train_batch_size\":8,"
                    "\"zero_optimization\":{\"stage\":2}}", "zero_optimization.stage");
    /* sharding over one device */
    assert_int_equal(parse_with(f, "\"train_batch_size\":8,\"zero_optimization\":{\"stage\":1}", &s, &err),
                     ACC_EINVAL);
    assert_string_equal(err.field, "zero_optimization.stage");
    assert_non_null(strstr(err.msg, "devices >= 2"));
    expect_field(f, "\"deepspeed\":{\"train_batch_size\":8,\"zero_optimization\":{\"stage\":2}}",
                 "deepspeed.zero_optimization.stage");
}

/* ---- h-dsconf: Hugging Face names, did-you-mean, DeepSpeed files, hub names ---- */

static void write_file(const char *path, const char *text)
{
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(text, fp);
    assert_int_equal(fclose(fp), 0);
}

/* TrainingArguments names set the spec's own keys; with those keys given
 * too, equal values pass and different ones are a 400 naming both. */
static void test_hf_aliases(void **state)
{
    fixture *f = *state;
    job_spec s;
    acc_err err = {0};
    assert_int_equal(parse_with(f, "\"learning_rate\":5e-6,\"per_device_train_batch_size\":2,"
                                   "\"gradient_accumulation_steps\":16,\"devices\":4,\"bf16\":true,"
                                   "\"num_train_epochs\":3,\"weight_decay\":0.0,\"max_grad_norm\":0.5,"
                                   "\"adam_beta2\":0.999,\"adam_epsilon\":1e-6,\"warmup_steps\":7,"
                                   "\"lr_scheduler_type\":\"cosine\",\"save_steps\":50,\"eval_steps\":25,"
                                   "\"seed\":42,\"gradient_checkpointing\":true,\"logging_steps\":10",
                                &s, &err), 0);
    assert_true(s.optim.lr == 5e-6);
    assert_int_equal(s.micro_batch, 2);
    assert_int_equal(s.accum_steps, 16);
    assert_int_equal(s.train_batch_size, 128);
    assert_int_equal(s.precision, SPEC_BF16);
    assert_true(s.num_train_epochs == 3);
    assert_true(s.optim.weight_decay == 0.0);
    assert_true(s.optim.grad_clip == 0.5);
    assert_true(s.optim.beta1 == 0.9 && s.optim.beta2 == 0.999); /* beta1 keeps its default */
    assert_true(s.optim.eps == 1e-6);
    assert_int_equal(s.lr.warmup_steps, 7);
    assert_int_equal(s.lr.type, SPEC_LR_COSINE);
    assert_int_equal(s.checkpoint_interval, 50);
    assert_int_equal(s.eval_interval, 25);
    assert_true(s.activation_checkpointing);
    assert_non_null(strstr(s.ignored, "logging_steps"));
    /* mixed_precision (accelerate's) and fp16 false */
    assert_int_equal(parse_with(f, "\"train_batch_size\":8,\"mixed_precision\":\"bf16\",\"fp16\":false", &s, &err), 0);
    assert_int_equal(s.precision, SPEC_BF16);
    assert_int_equal(parse_with(f, "\"train_batch_size\":8,\"mixed_precision\":\"no\"", &s, &err), 0);
    assert_int_equal(s.precision, SPEC_FP32);
    /* warmup_ratio of max_steps, rounded up as Hugging Face does */
    assert_int_equal(parse_with(f, "\"train_batch_size\":8,\"max_steps\":100,\"warmup_ratio\":0.031", &s, &err), 0);
    assert_int_equal(s.lr.warmup_steps, 4);
    /* the same value twice is fine */
    assert_int_equal(parse_with(f, "\"train_batch_size\":8,\"learning_rate\":0.001,\"optimizer\":{\"lr\":1e-3}", &s,
                                &err), 0);
    /* conflicts name both */
    assert_int_equal(parse_with(f, "\"train_batch_size\":8,\"learning_rate\":5e-6,\"optimizer\":{\"lr\":3e-4}", &s,
                                &err), ACC_EINVAL);
    assert_string_equal(err.field, "learning_rate");
    assert_non_null(strstr(err.msg, "optimizer.lr"));
    if (strstr(err.msg, "5e-6") == NULL)
        fail_msg("%s", err.msg);
    assert_non_null(strstr(err.msg, "0.0003"));
    expect_field(f, "\"train_batch_size\":8,\"bf16\":true,\"precision\":\"fp32\"", "bf16");
    expect_field(f, "\"train_batch_size\":8,\"bf16\":true,\"mixed_precision\":\"no\"", "mixed_precision");
    expect_field(f, "\"per_device_train_batch_size\":2,\"train_micro_batch_size_per_gpu\":4", "per_device_train_batch_size");
    expect_field(f, "\"train_batch_size\":8,\"adam_beta1\":0.8,\"optimizer\":{\"betas\":[0.9,0.95]}", "adam_beta1");
    expect_field(f, "\"train_batch_size\":8,\"gradient_checkpointing\":true,\"activation_checkpointing\":false",
                 "gradient_checkpointing");
    /* values with no equivalent, wrong types: the alias named */
    expect_field(f, "\"train_batch_size\":8,\"fp16\":true", "fp16");
    expect_field(f, "\"train_batch_size\":8,\"lr_scheduler_type\":\"polynomial\"", "lr_scheduler_type");
    expect_field(f, "\"train_batch_size\":8,\"learning_rate\":\"fast\"", "learning_rate");
    expect_field(f, "\"train_batch_size\":8,\"gradient_checkpointing\":1", "gradient_checkpointing");
    expect_field(f, "\"train_batch_size\":8,\"warmup_ratio\":2", "warmup_ratio");
}

/* Common misspellings, each with the key it meant. */
static void test_did_you_mean(void **state)
{
    fixture *f = *state;
    static const struct {
        const char *extra, *field, *suggest;
    } cases[] = {
        {"\"learning_rte\":1e-4", "learning_rte", "learning_rate"},
        {"\"lerning_rate\":1e-4", "lerning_rate", "learning_rate"},
        {"\"Learning-Rate\":1e-4", "Learning-Rate", "learning_rate"},
        {"\"lr\":1e-4", "lr", "optimizer.lr"},
        {"\"train_batchsize\":8", "train_batchsize", "train_batch_size"},
        {"\"batch_size\":8", "batch_size", "train_batch_size"},
        {"\"micro_batch_size\":2", "micro_batch_size", "train_micro_batch_size_per_gpu"},
        {"\"per_device_batch_size\":2", "per_device_batch_size", "per_device_train_batch_size"},
        {"\"gradient_accumulation_step\":2", "gradient_accumulation_step", "gradient_accumulation_steps"},
        {"\"gradient_acumulation_steps\":2", "gradient_acumulation_steps", "gradient_accumulation_steps"},
        {"\"num_epochs\":2", "num_epochs", "num_train_epochs"},
        {"\"epochs\":2", "epochs", "num_train_epochs"},
        {"\"max_step\":2", "max_step", "max_steps"},
        {"\"warmup_ration\":0.1", "warmup_ration", "warmup_ratio"},
        {"\"precison\":\"bf16\"", "precison", "precision"},
        {"\"mixed_precison\":\"bf16\"", "mixed_precison", "mixed_precision"},
        {"\"zero_stage\":2", "zero_stage", "zero_optimization.stage"},
        {"\"deepspeed_config\":\"x.json\"", "deepspeed_config", "deepspeed"},
        {"\"model_name\":\"x\"", "model_name", "model_name_or_path"},
        {"\"seeds\":1", "seeds", "seed"},
        {"\"gradient_checkpoint\":true", "gradient_checkpoint", "gradient_checkpointing"},
        {"\"optimizer\":{\"learning_rate\":1e-4}", "optimizer.learning_rate", "lr"},
        {"\"optimizer\":{\"weight_decy\":0.1}", "optimizer.weight_decy", "weight_decay"},
        {"\"model\":{\"n_layers\":2}", "model.n_layers", "n_layer"},
        {"\"model\":{\"seq_length\":64}", "model.seq_length", "seq_len"},
        {"\"lr_schedule\":{\"warmup\":5}", "lr_schedule.warmup", "warmup_steps"},
        {"\"zero_optimization\":{\"stages\":1}", "zero_optimization.stages", "stage"},
        {"\"zero_optimization\":{\"overlap_com\":true}", "zero_optimization.overlap_com", "overlap_comm"},
        {"\"deepspeed\":{\"gradient_clip\":1.0}", "deepspeed.gradient_clip", "gradient_clipping"},
        {"\"deepspeed\":{\"train_micro_batch_size\":2}", "deepspeed.train_micro_batch_size",
         "train_micro_batch_size_per_gpu"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        job_spec s;
        acc_err err = {0};
        char extra[256], want[128];
        snprintf(extra, sizeof extra, "\"train_batch_size\":8,%s", cases[i].extra);
        snprintf(want, sizeof want, "(did you mean '%s'?)", cases[i].suggest);
        if (parse_with(f, extra, &s, &err) != ACC_EINVAL || strcmp(err.field, cases[i].field) != 0 ||
            strstr(err.msg, want) == NULL)
            fail_msg("{%s}: field '%s' msg '%s', want field '%s' and %s", cases[i].extra, err.field, err.msg,
                     cases[i].field, want);
    }
    /* data keys: the test's data file is fixed, so through a full spec */
    job_spec s;
    acc_err err = {0};
    char text[1024];
    snprintf(text, sizeof text, "{\"data\":{\"train\":\"%s\",\"chat_templte\":\"tulu\"},\"train_batch_size\":8}",
             f->data_file);
    assert_int_equal(job_spec_parse(text, strlen(text), &f->conf, &s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "data.chat_templte");
    assert_non_null(strstr(err.msg, "did you mean 'chat_template'?"));
}

/* A ZeRO-2 DeepSpeed file in the shape projects publish for the Hugging
 * Face Trainer ("auto" everywhere), given by path: the auto values take
 * the spec's, the tuning keys are listed as ignored; the same file with a
 * number that differs from the spec's is a 400 showing both. */
static const char zero2_auto[] =
    "{\n"
    "  \"fp16\": {\"enabled\": \"auto\", \"loss_scale\": 0, \"loss_scale_window\": 1000,\n"
    "           \"initial_scale_power\": 16, \"hysteresis\": 2, \"min_loss_scale\": 1},\n"
    "  \"bf16\": {\"enabled\": \"auto\"},\n"
    "  \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": \"auto\", \"betas\": \"auto\", \"eps\": \"auto\",\n"
    "                \"weight_decay\": \"auto\"}},\n"
    "  \"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"warmup_min_lr\": \"auto\", \"warmup_max_lr\": \"auto\",\n"
    "                \"warmup_num_steps\": \"auto\", \"total_num_steps\": \"auto\"}},\n"
    "  \"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"none\", \"pin_memory\": true},\n"
    "                        \"allgather_partitions\": true, \"allgather_bucket_size\": 2e8, \"overlap_comm\": true,\n"
    "                        \"reduce_scatter\": true, \"reduce_bucket_size\": \"auto\", \"contiguous_gradients\": true,\n"
    "                        \"round_robin_gradients\": true},\n"
    "  \"gradient_accumulation_steps\": \"auto\", \"gradient_clipping\": \"auto\", \"steps_per_print\": 2000,\n"
    "  \"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\": \"auto\", \"wall_clock_breakdown\": false\n"
    "}\n";

static void test_deepspeed_file(void **state)
{
    fixture *f = *state;
    job_spec s;
    acc_err err = {0};
    char path[600];
    snprintf(path, sizeof path, "%s/data/ds_zero2.json", f->dir);
    write_file(path, zero2_auto);
    assert_int_equal(parse_with(f, "\"deepspeed\":\"ds_zero2.json\",\"learning_rate\":5e-6,"
                                   "\"per_device_train_batch_size\":2,\"gradient_accumulation_steps\":4,\"devices\":2,"
                                   "\"bf16\":true,\"max_steps\":200,\"warmup_ratio\":0.05,\"weight_decay\":0.01,"
                                   "\"max_grad_norm\":0.7",
                                &s, &err), 0);
    assert_string_equal(s.deepspeed_file, path);
    assert_int_equal(s.train_batch_size, 16);
    assert_int_equal(s.micro_batch, 2);
    assert_int_equal(s.accum_steps, 4);
    assert_int_equal(s.zero_stage, 2);
    assert_int_equal(s.precision, SPEC_BF16);
    assert_true(s.optim.lr == 5e-6);
    assert_true(s.optim.weight_decay == 0.01);
    assert_true(s.optim.grad_clip == 0.7);
    assert_true(s.optim.beta1 == 0.9 && s.optim.beta2 == 0.95);
    assert_int_equal(s.lr.type, SPEC_LR_WARMUP_DECAY);
    assert_true(s.lr.warmup_min_lr == 0);
    assert_int_equal(s.lr.warmup_steps, 10); /* ceil(0.05 x 200) */
    assert_int_equal(s.lr.total_steps, 200);
    const char *ignored[] = {"deepspeed.fp16.loss_scale", "deepspeed.fp16.initial_scale_power",
                             "deepspeed.zero_optimization.offload_optimizer", "deepspeed.zero_optimization.overlap_comm",
                             "deepspeed.zero_optimization.allgather_bucket_size",
                             "deepspeed.zero_optimization.reduce_bucket_size",
                             "deepspeed.zero_optimization.contiguous_gradients",
                             "deepspeed.zero_optimization.round_robin_gradients", "deepspeed.steps_per_print",
                             "deepspeed.wall_clock_breakdown"};
    for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++)
        if (strstr(s.ignored, ignored[i]) == NULL)
            fail_msg("%s not listed as ignored: %s", ignored[i], s.ignored);
    assert_null(strstr(s.ignored, "zero_optimization.stage"));

    /* numbers in the file: they take effect, and must agree with the spec's */
    char *fixed = strdup(zero2_auto);
    char *lr = strstr(fixed, "\"lr\": \"auto\"");
    memcpy(lr, "\"lr\": 0.0003", 12);
    write_file(path, fixed);
    free(fixed);
    if (parse_with(f, "\"deepspeed\":\"ds_zero2.json\",\"train_batch_size\":8,\"devices\":2", &s, &err) != 0)
        fail_msg("%s: %s", err.field, err.msg);
    assert_true(s.optim.lr == 3e-4);
    assert_int_equal(parse_with(f, "\"deepspeed\":\"ds_zero2.json\",\"train_batch_size\":8,\"devices\":2,\"learning_rate\":5e-6",
                                &s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "deepspeed.optimizer.params.lr");
    assert_non_null(strstr(err.msg, "0.0003"));
    assert_non_null(strstr(err.msg, "5e-6"));
    assert_non_null(strstr(err.msg, "ds_zero2.json"));
    assert_non_null(strstr(err.msg, "learning_rate"));
    /* bf16 in the file against the spec's precision; a batch key */
    write_file(path, "{\"bf16\":{\"enabled\":true},\"train_batch_size\":16}");
    expect_field(f, "\"deepspeed\":\"ds_zero2.json\",\"precision\":\"fp32\"", "deepspeed.bf16.enabled");
    expect_field(f, "\"deepspeed\":\"ds_zero2.json\",\"train_batch_size\":8", "deepspeed.train_batch_size");
    /* ZeRO-3 from a file: its stage taken, its tuning keys ignored; with
     * parameter and optimizer offload: both taken */
    write_file(path, "{\"train_batch_size\":8,\"zero_optimization\":{\"stage\":3,"
                     "\"stage3_prefetch_bucket_size\":\"auto\",\"stage3_gather_16bit_weights_on_model_save\":true}}");
    if (parse_with(f, "\"deepspeed\":\"ds_zero2.json\",\"devices\":2", &s, &err) != 0)
        fail_msg("%s: %s", err.field, err.msg);
    assert_int_equal(s.zero_stage, 3);
    assert_non_null(strstr(s.ignored, "deepspeed.zero_optimization.stage3_prefetch_bucket_size"));
    write_file(path, "{\"train_batch_size\":8,\"zero_optimization\":{\"stage\":3,\"offload_optimizer\":"
                     "{\"device\":\"cpu\"},\"offload_param\":{\"device\":\"cpu\"},\"stage3_prefetch_bucket_size\":\"auto\"}}");
    if (parse_with(f, "\"deepspeed\":\"ds_zero2.json\",\"devices\":2", &s, &err) != 0)
        fail_msg("%s: %s", err.field, err.msg);
    assert_true(s.zero_stage == 3 && s.offload_optimizer && s.offload_param);
    write_file(path, "{\"train_batch_size\":8,\"zero_optimization\":{\"stage\":3,\"offload_optimizer\":"
                     "{\"device\":\"cpu\"},\"stage3_prefetch_bucket_size\":\"auto\"}}");
    if (parse_with(f, "\"deepspeed\":\"ds_zero2.json\",\"devices\":2", &s, &err) != 0)
        fail_msg("%s: %s", err.field, err.msg);
    assert_true(s.zero_stage == 3 && s.offload_optimizer);
    write_file(path, "{\"train_batch_size\":8,\"zero_optimization\":{\"stage\":2,\"offload_optimizer\":"
                     "{\"device\":\"nvme\",\"nvme_path\":\"/local_nvme\"}}}");
    expect_field(f, "\"deepspeed\":\"ds_zero2.json\",\"devices\":2",
                 "deepspeed.zero_optimization.offload_optimizer.device");
    /* DeepSpeed's ZeRO-Offload file: taken, its tuning keys listed as having no effect */
    write_file(path, "{\"train_batch_size\":8,\"zero_optimization\":{\"stage\":2,\"offload_optimizer\":"
                     "{\"device\":\"cpu\",\"pin_memory\":true,\"buffer_count\":4,\"fast_init\":false}}}");
    assert_int_equal(parse_with(f, "\"deepspeed\":\"ds_zero2.json\",\"devices\":2", &s, &err), 0);
    assert_true(s.offload_optimizer && s.offload_pin_memory);
    assert_int_equal(s.zero_stage, 2);
    assert_non_null(strstr(s.ignored, "deepspeed.zero_optimization.offload_optimizer.buffer_count"));
    assert_non_null(strstr(s.ignored, "deepspeed.zero_optimization.offload_optimizer.fast_init"));
    assert_null(strstr(s.ignored, "offload_optimizer.device"));
    /* a bad file: not JSON, not an object, missing, outside the roots */
    write_file(path, "{\"train_batch_size\": 8,");
    expect_field(f, "\"deepspeed\":\"ds_zero2.json\"", "deepspeed");
    write_file(path, "[1]");
    expect_field(f, "\"deepspeed\":\"ds_zero2.json\"", "deepspeed");
    expect_field(f, "\"deepspeed\":\"no-such.json\"", "deepspeed");
    expect_field(f, "\"deepspeed\":\"/etc/hostname\"", "deepspeed");
    expect_field(f, "\"deepspeed\":7", "deepspeed");
}

/* Hub names in a cache layout the test makes: model.from and data.dataset
 * resolve to the snapshot refs/main names (read for config.json only, as
 * the planner reads); seq_len defaults to the positions, at most 4096. */
static void test_hub_names(void **state)
{
    fixture *f = *state;
    char cmd[2048];
    const char *c = "0123456789abcdef0123456789abcdef01234567";
    snprintf(cmd, sizeof cmd,
             "set -e; h=%s/hub; m=$h/models--meta-llama--Llama-2-7b-hf; d=$h/datasets--allenai--tulu-3-sft-mixture;"
             "mkdir -p $m/refs $m/blobs $m/snapshots/%s $d/refs $d/blobs $d/snapshots/%s/data;"
             "printf %s > $m/refs/main; printf %s > $d/refs/main;"
             "for i in 0 1; do echo '{\"messages\":[]}' > $d/blobs/b$i; "
             "ln -s ../../../blobs/b$i $d/snapshots/%s/data/train-0000$i-of-00002.jsonl; done",
             f->dir, c, c, c, c, c);
    assert_int_equal(system(cmd), 0);
    char cfg[1024];
    snprintf(cfg, sizeof cfg, "%s/hub/models--meta-llama--Llama-2-7b-hf/blobs/cfg", f->dir);
    write_file(cfg, "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 4096,"
                    " \"intermediate_size\": 11008, \"num_hidden_layers\": 32, \"num_attention_heads\": 32,"
                    " \"num_key_value_heads\": 32, \"vocab_size\": 32000, \"max_position_embeddings\": 8192,"
                    " \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, \"tie_word_embeddings\": false,"
                    " \"torch_dtype\": \"float16\", \"hidden_act\": \"silu\"}");
    snprintf(cmd, sizeof cmd, "ln -s ../../blobs/cfg %s/hub/models--meta-llama--Llama-2-7b-hf/snapshots/%s/config.json",
             f->dir, c);
    assert_int_equal(system(cmd), 0);
    acc_conf conf = f->conf;
    acc_err err = {0};
    char hub[512];
    snprintf(hub, sizeof hub, "%s/hub", f->dir);
    assert_int_equal(conf_set(&conf, "hf_hub_cache", hub, &err), 0);
    const char *spec = "{\"model_name_or_path\":\"meta-llama/Llama-2-7b-hf\",\"dataset_name\":\"allenai/tulu-3-sft-mixture\","
                       "\"train_batch_size\":8}";
    job_spec s;
    assert_int_equal(job_spec_parse_plan(spec, strlen(spec), &conf, &s, &err), 0);
    assert_string_equal(s.model.hub_repo, "meta-llama/Llama-2-7b-hf");
    assert_non_null(strstr(s.model.from, "/hub/models--meta-llama--Llama-2-7b-hf/snapshots/"));
    assert_non_null(strstr(s.model.from, c));
    assert_int_equal(s.model.seq_len, 4096);
    assert_true(s.model.seq_len_default);
    assert_int_equal(s.model.n_layer, 32);
    assert_int_equal(s.data.dataset_files, 2);
    assert_non_null(strstr(s.data.train, "/data/train-0000*-of-00002.jsonl"));
    assert_string_equal(s.data.split, "train");
    assert_non_null(strstr(s.data_roots, hub));
    const char *typo = "{\"model\":{\"from\":\"meta-llama/Llama-2-7b-hf\",\"seq_lenght\":512},\"train_batch_size\":8}";
    assert_int_equal(job_spec_parse_plan(typo, strlen(typo), &conf, &s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "model.seq_lenght");
    assert_non_null(strstr(err.msg, "did you mean 'seq_len'?"));
    /* seq_len given stays */
    const char *given = "{\"model\":{\"from\":\"meta-llama/Llama-2-7b-hf\",\"seq_len\":512},\"train_batch_size\":8}";
    assert_int_equal(job_spec_parse_plan(given, strlen(given), &conf, &s, &err), 0);
    assert_int_equal(s.model.seq_len, 512);
    assert_false(s.model.seq_len_default);
    /* a name not cached: where it looked, how to fetch it */
    const char *missing = "{\"model\":{\"from\":\"mistralai/Mistral-7B-v0.1\"},\"train_batch_size\":8}";
    assert_int_equal(job_spec_parse_plan(missing, strlen(missing), &conf, &s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "model.from");
    assert_non_null(strstr(err.msg, "huggingface-cli download mistralai/Mistral-7B-v0.1"));
    const char *nosplit = "{\"data\":{\"dataset\":\"allenai/tulu-3-sft-mixture\",\"split\":\"test\"},\"train_batch_size\":8}";
    assert_int_equal(job_spec_parse(nosplit, strlen(nosplit), &conf, &s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "data.dataset");
    assert_non_null(strstr(err.msg, "split 'test'"));
    const char *both = "{\"data\":{\"dataset\":\"allenai/tulu-3-sft-mixture\",\"train\":\"a.txt\"},\"train_batch_size\":8}";
    assert_int_equal(job_spec_parse(both, strlen(both), &conf, &s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "data.dataset");
    /* without hf_hub_cache, a hub name is a 400 saying so */
    assert_int_equal(job_spec_parse_plan(spec, strlen(spec), &f->conf, &s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "model_name_or_path");
    assert_non_null(strstr(err.msg, "hf_hub_cache"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_minimal_and_defaults),
        cmocka_unit_test(test_full_design_spec),
        cmocka_unit_test(test_batch_triple),
        cmocka_unit_test(test_errors_name_the_field),
        cmocka_unit_test(test_paths),
        cmocka_unit_test(test_restarts_and_nodes),
        cmocka_unit_test(test_save),
        cmocka_unit_test(test_lora),
        cmocka_unit_test(test_deepspeed),
        cmocka_unit_test(test_zero),
        cmocka_unit_test(test_gradient_checkpointing_alias),
        cmocka_unit_test(test_ignored_keys_and_big_integers),
        cmocka_unit_test(test_hf_aliases),
        cmocka_unit_test(test_did_you_mean),
        cmocka_unit_test(test_deepspeed_file),
        cmocka_unit_test(test_hub_names),
        cmocka_unit_test(test_lean_activations),
        cmocka_unit_test(test_offload_optimizer),
        cmocka_unit_test(test_activation_offload),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
