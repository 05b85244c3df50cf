/* data and optim: samples from text and token shards, the errors a user
 * gets for bad files, the order of samples, the dealing of a step's slots,
 * and the learning-rate schedules. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data.h"
#include "engine_fixture.h"
#include "optim.h"
#include "trainer.h"

static char dir[64];

static int setup(void **state)
{
    snprintf(dir, sizeof dir, "/tmp/accumd-data-XXXXXX");
    return mkdtemp(dir) == NULL ? -1 : 0;
}

static int teardown(void **state)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void write_shard(const char *name, int32_t magic, int32_t version, int32_t count,
                        const uint16_t *tok, size_t n, char *path, size_t cap)
{
    snprintf(path, cap, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    int32_t h[256] = {magic, version, count};
    assert_int_equal(fwrite(h, sizeof h, 1, f), 1);
    if (n)
        assert_int_equal(fwrite(tok, sizeof *tok, n, f), n);
    fclose(f);
}

static void test_text_samples(void **state)
{
    char path[128];
    snprintf(path, sizeof path, "%s/text.txt", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    const char *txt = "hello, accumulated world!";
    fputs(txt, f);
    fclose(f);
    data_source *ds;
    acc_err err = {0};
    assert_int_equal(data_open(path, SPEC_DATA_TEXT, 4, 256, "data.train", &ds, &err), 0);
    size_t n = strlen(txt);
    assert_int_equal(data_num_samples(ds), (n - 1) / 4);
    int s[5];
    data_sample(ds, 2, s);
    for (int i = 0; i < 5; i++)
        assert_int_equal(s[i], (unsigned char)txt[8 + i]);
    data_close(ds);
    /* text needs a byte vocabulary */
    assert_int_equal(data_open(path, SPEC_DATA_TEXT, 4, 100, "data.train", &ds, &err), ACC_EINVAL);
    assert_string_equal(err.field, "model.vocab_size");
    /* too short for one sample */
    assert_int_equal(data_open(path, SPEC_DATA_TEXT, 64, 256, "data.train", &ds, &err),
                     ACC_EINVAL);
    assert_string_equal(err.field, "data.train");
    assert_non_null(strstr(err.msg, "too short"));
}

static void test_shards(void **state)
{
    uint16_t a[41], b[23];
    for (int i = 0; i < 41; i++)
        a[i] = (uint16_t)(1000 + i);
    for (int i = 0; i < 23; i++)
        b[i] = (uint16_t)(2000 + i);
    char p[128];
    write_shard("tok_000.bin", DATA_SHARD_MAGIC, 1, 41, a, 41, p, sizeof p);
    write_shard("tok_001.bin", DATA_SHARD_MAGIC, 1, 23, b, 23, p, sizeof p);
    char glob[128];
    snprintf(glob, sizeof glob, "%s/tok_*.bin", dir);
    data_source *ds;
    acc_err err = {0};
    assert_int_equal(data_open(glob, SPEC_DATA_TOKENS, 8, 50257, "data.train", &ds, &err), 0);
    /* (41-1)/8 = 5 and (23-1)/8 = 2 samples; none crosses a file */
    assert_int_equal(data_num_samples(ds), 7);
    assert_int_equal(data_num_tokens(ds), 64);
    int s[9];
    data_sample(ds, 4, s);
    for (int i = 0; i < 9; i++)
        assert_int_equal(s[i], 1032 + i);
    data_sample(ds, 5, s);
    for (int i = 0; i < 9; i++)
        assert_int_equal(s[i], 2000 + i);
    data_close(ds);

    /* a token beyond the vocabulary is refused, naming it */
    assert_int_equal(data_open(glob, SPEC_DATA_TOKENS, 8, 2010, "data.val", &ds, &err), ACC_EINVAL);
    assert_string_equal(err.field, "data.val");
    assert_non_null(strstr(err.msg, ">= vocab_size 2010"));
}

static void test_bad_shards(void **state)
{
    uint16_t t[100] = {0};
    char p[128];
    data_source *ds;
    acc_err err = {0};
    write_shard("bad_magic.bin", 20240326, 1, 100, t, 100, p, sizeof p);
    assert_int_equal(data_open(p, SPEC_DATA_TOKENS, 8, 256, "data.train", &ds, &err), ACC_EINVAL);
    assert_non_null(strstr(err.msg, "magic"));
    write_shard("bad_version.bin", DATA_SHARD_MAGIC, 2, 100, t, 100, p, sizeof p);
    assert_int_equal(data_open(p, SPEC_DATA_TOKENS, 8, 256, "data.train", &ds, &err), ACC_EINVAL);
    assert_non_null(strstr(err.msg, "version"));
    write_shard("truncated.bin", DATA_SHARD_MAGIC, 1, 100, t, 50, p, sizeof p);
    assert_int_equal(data_open(p, SPEC_DATA_TOKENS, 8, 256, "data.train", &ds, &err), ACC_EINVAL);
    assert_non_null(strstr(err.msg, "token count does not match"));
    assert_null(strstr(err.msg, "100")); /* nothing read from the file is echoed */
    write_shard("short.bin", DATA_SHARD_MAGIC, 1, 5, t, 5, p, sizeof p);
    assert_int_equal(data_open(p, SPEC_DATA_TOKENS, 8, 256, "data.train", &ds, &err), ACC_EINVAL);
    assert_non_null(strstr(err.msg, "too short"));
    snprintf(p, sizeof p, "%s/none_*.bin", dir);
    assert_int_equal(data_open(p, SPEC_DATA_TOKENS, 8, 256, "data.train", &ds, &err), ACC_EINVAL);
    assert_non_null(strstr(err.msg, "no file matches"));
    assert_int_equal(data_open("/nonexistent/file.txt", SPEC_DATA_TEXT, 8, 256, "data.train",
                               &ds, &err),
                     ACC_EINVAL);
    assert_string_equal(err.field, "data.train");
    assert_non_null(strstr(err.msg, "cannot resolve"));
}

static void test_order(void **state)
{
    enum { NS = 37 };
    data_order a, b, c;
    acc_err err = {0};
    assert_int_equal(data_order_init(&a, NS, 42, &err), 0);
    assert_int_equal(data_order_init(&b, NS, 42, &err), 0);
    assert_int_equal(data_order_init(&c, NS, 43, &err), 0);
    int seen[3][NS] = {{0}};
    int same_as_next_epoch = 0, same_other_seed = 0, identity = 0;
    for (uint64_t s = 0; s < NS; s++) {
        uint64_t x = data_order_sample(&a, s);
        assert_true(x < NS);
        seen[0][x]++;
        identity += x == s;
        same_other_seed += x == data_order_sample(&c, s);
    }
    for (uint64_t s = 0; s < NS; s++) {
        uint64_t x = data_order_sample(&a, NS + s);
        seen[1][x]++;
        same_as_next_epoch += x == data_order_sample(&b, s);
    }
    /* b asked epochs out of order; still the same function of (seed, slot) */
    for (uint64_t s = 0; s < 3 * NS; s++) {
        uint64_t x = data_order_sample(&b, s);
        assert_true(x == data_order_sample(&a, s));
    }
    for (int i = 0; i < NS; i++)
        assert_true(seen[0][i] == 1 && seen[1][i] == 1);
    assert_true(identity < NS / 2);
    assert_true(same_as_next_epoch < NS / 2);
    assert_true(same_other_seed < NS / 2);
    data_order_free(&a);
    data_order_free(&b);
    data_order_free(&c);
}

/* Every split of B deals exactly the slots [kB, (k+1)B) of step k. */
static void test_slots_independent_of_split(void **state)
{
    enum { BATCH = 12 };
    static const int splits[][3] = {{12, 1, 1}, {1, 12, 1}, {2, 3, 2}, {1, 4, 3}, {3, 1, 4}};
    for (size_t i = 0; i < sizeof splits / sizeof *splits; i++) {
        int m = splits[i][0], a = splits[i][1], w = splits[i][2];
        assert_int_equal(m * a * w, BATCH);
        for (uint64_t step = 0; step < 3; step++) {
            int hit[BATCH] = {0};
            for (int r = 0; r < w; r++)
                for (int mi = 0; mi < a; mi++)
                    for (int pos = 0; pos < m; pos++) {
                        uint64_t s = data_slot(step, BATCH, m * a, m, r, mi, pos);
                        assert_true(s >= step * BATCH && s < (step + 1) * BATCH);
                        hit[s - step * BATCH]++;
                    }
            for (int j = 0; j < BATCH; j++)
                assert_int_equal(hit[j], 1);
        }
    }
}

static void test_check_spec_fields(void **state)
{
    char text[64];
    fx_write_text(text, sizeof text, 4000);
    train_cfg s;
    fx_tiny_spec(&s, text, 8, 2, 4, 1);
    acc_err err = {0};
    assert_int_equal(trainer_check_spec(&s, &err), 0);
    snprintf(s.data.val, sizeof s.data.val, "%s/missing.txt", dir);
    assert_int_equal(trainer_check_spec(&s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "data.val");
    s.data.val[0] = '\0';
    s.model.n_head = 3;
    assert_int_equal(trainer_check_spec(&s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "model.n_head");
    fx_tiny_spec(&s, text, 8, 2, 4, 1);
    s.precision = SPEC_BF16; /* bf16 trains on every device kind */
    assert_int_equal(trainer_check_spec(&s, &err), 0);
    fx_tiny_spec(&s, text, 8, 2, 4, 1);
    snprintf(s.model.init_from, sizeof s.model.init_from, "%s", text);
    assert_int_equal(trainer_check_spec(&s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "model.init_from");
    /* more ranks than a trainer has, with micro batch "auto" too */
    fx_tiny_spec(&s, text, 32, 1, 1, 32);
    s.micro_auto = true;
    s.micro_batch = 0;
    assert_int_equal(trainer_check_spec(&s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "devices");
    unlink(text);
}

/* ---- learning-rate schedules */

static void lr_spec(train_cfg *s, spec_lr_type type)
{
    memset(s, 0, sizeof *s);
    s->optim.lr = 1.0;
    s->lr.type = type;
    s->lr.warmup_steps = 10;
    s->lr.min_lr = 0.1;
    s->lr.warmup_min_lr = 0.0;
    s->lr.cos_min_ratio = 0.2;
    s->max_steps = 110;
}

#define NEAR(a, b) assert_true(fabs((a) - (b)) < 1e-9)

static void test_lr_schedules(void **state)
{
    train_cfg s;
    lr_spec(&s, SPEC_LR_CONSTANT);
    NEAR(optim_lr(&s, 0), 1.0);
    NEAR(optim_lr(&s, 100), 1.0);

    lr_spec(&s, SPEC_LR_COSINE);
    NEAR(optim_lr(&s, 0), 0.1);            /* (0+1)/10 */
    NEAR(optim_lr(&s, 9), 1.0);
    NEAR(optim_lr(&s, 10), 1.0);           /* decay starts at the top */
    NEAR(optim_lr(&s, 60), 0.1 + 0.45);    /* halfway: mid point */
    NEAR(optim_lr(&s, 110), 0.1);
    NEAR(optim_lr(&s, 500), 0.1);

    lr_spec(&s, SPEC_LR_WARMUP);
    NEAR(optim_lr(&s, 0), 0.0);            /* log(1)/log(10) */
    NEAR(optim_lr(&s, 4), log(5.0) / log(10.0));
    NEAR(optim_lr(&s, 9), 1.0);
    NEAR(optim_lr(&s, 50), 1.0);

    lr_spec(&s, SPEC_LR_WARMUP_DECAY);
    s.lr.total_steps = 60;
    NEAR(optim_lr(&s, 4), log(5.0) / log(10.0));
    NEAR(optim_lr(&s, 10), 1.0);
    NEAR(optim_lr(&s, 35), 0.5);
    NEAR(optim_lr(&s, 60), 0.0);
    NEAR(optim_lr(&s, 70), 0.0);

    lr_spec(&s, SPEC_LR_WARMUP_COSINE);
    s.lr.total_steps = 60;
    NEAR(optim_lr(&s, 10), 1.0);
    NEAR(optim_lr(&s, 35), 0.2 + 0.8 * 0.5);
    NEAR(optim_lr(&s, 60), 0.2);

    NEAR(optim_clip_scale(2.0, 1.0), 0.5);
    NEAR(optim_clip_scale(0.5, 1.0), 1.0);
    NEAR(optim_clip_scale(5.0, 0.0), 1.0);
}

/* The run's lengths (num_train_epochs, warmup_ratio resolved by the
 * trainer) stand in for the spec's, which stays as written: the cosine
 * schedule of max_steps 110 / warmup 10 given as a run over a spec that
 * says 5 / 0 has the hand-computed values of test_lr_schedules. */
static void test_lr_run_lengths(void **state)
{
    (void)state;
    train_cfg s;
    lr_spec(&s, SPEC_LR_COSINE);
    s.max_steps = 5;
    s.lr.warmup_steps = 0;
    const optim_steps run = {.max_steps = 110, .warmup_steps = 10};
    NEAR(optim_lr_run(&s, &run, 0), 0.1);
    NEAR(optim_lr_run(&s, &run, 60), 0.1 + 0.45);
    NEAR(optim_lr_run(&s, &run, 110), 0.1);
    NEAR(optim_lr(&s, 0), 1.0); /* the spec's own: no warmup, decay to 5 */
    assert_int_equal(s.max_steps, 5);
    assert_int_equal(s.lr.warmup_steps, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_samples),
        cmocka_unit_test(test_shards),
        cmocka_unit_test(test_bad_shards),
        cmocka_unit_test(test_order),
        cmocka_unit_test(test_slots_independent_of_split),
        cmocka_unit_test(test_check_spec_fields),
        cmocka_unit_test(test_lr_schedules),
        cmocka_unit_test(test_lr_run_lengths),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
