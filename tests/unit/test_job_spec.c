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

    /* unsupported keys are reported, all of them */
    assert_int_equal(parse_with(f, "\"deepspeed\":{\"train_batch_size\":8,\"zero_optimization\":{\"stage\":2},"
                                   "\"amp\":{}}", &s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "deepspeed.zero_optimization");
    assert_non_null(strstr(err.msg, "deepspeed.amp"));
    expect_field(f, "\"deepspeed\":{\"train_batch_size\":8,\"fp16\":{\"enabled\":true}}", "deepspeed.fp16.enabled");
    expect_field(f, "\"deepspeed\":{\"train_batch_size\":8,\"optimizer\":{\"type\":\"Lamb\"}}", "deepspeed.optimizer.type");
    expect_field(f, "\"deepspeed\":{\"train_batch_size\":8,\"optimizer\":{\"type\":\"AdamW\",\"params\":{\"lr\":-1}}}",
                 "deepspeed.optimizer.params.lr");
    expect_field(f, "\"deepspeed\":{\"train_batch_size\":8,\"scheduler\":{\"type\":\"OneCycle\"}}", "deepspeed.scheduler.type");
    expect_field(f, "\"deepspeed\":{\"train_batch_size\":8,\"bf16\":{\"enabled\":1}}", "deepspeed.bf16.enabled");
    expect_field(f, "\"train_batch_size\":16,\"deepspeed\":{\"train_batch_size\":8}", "train_batch_size");
    expect_field(f, "\"deepspeed\":{\"train_batch_size\":32,\"train_micro_batch_size_per_gpu\":2,"
                    "\"gradient_accumulation_steps\":16},\"devices\":4", "train_batch_size");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_minimal_and_defaults),
        cmocka_unit_test(test_full_design_spec),
        cmocka_unit_test(test_batch_triple),
        cmocka_unit_test(test_errors_name_the_field),
        cmocka_unit_test(test_paths),
        cmocka_unit_test(test_save),
        cmocka_unit_test(test_lora),
        cmocka_unit_test(test_deepspeed),
        cmocka_unit_test(test_ignored_keys_and_big_integers),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
