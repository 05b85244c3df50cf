/* A real run: 200 optimizer steps of a small GPT-2 on real English text
 * (the GPL-3 licence text Debian ships) with a held-out validation split.
 * The training loss must fall well below ln(256) (a uniform guess over
 * bytes) and the eval loss must follow it down. Skipped where the text is
 * not installed. Then bf16 against fp32 on the same run (at a lower lr).
 */
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

#include "engine_fixture.h"
#include "trainer_run.h"

#define CORPUS "/usr/share/common-licenses/GPL-3"
#define STEPS 200

/* Split the corpus: the first 90% to train, the rest held out. */
static int split_corpus(char *train, char *val, size_t cap)
{
    FILE *f = fopen(CORPUS, "rb");
    if (f == NULL)
        return -1;
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    size_t cut = n * 9 / 10;
    snprintf(train, cap, "/tmp/accumd-train-XXXXXX");
    snprintf(val, cap, "/tmp/accumd-val-XXXXXX");
    int a = mkstemp(train), b = mkstemp(val);
    if (a < 0 || b < 0)
        return -1;
    int ok = write(a, buf, cut) == (ssize_t)cut && write(b, buf + cut, n - cut) == (ssize_t)(n - cut);
    close(a);
    close(b);
    return ok ? 0 : -1;
}

/* One STEPS-step run of the text model in `precision` at peak learning
 * rate `lr`; losses out. */
static void text_run(spec_precision precision, double lr, double *loss, double *val_loss)
{
    char train[64], val[64];
    assert_int_equal(split_corpus(train, val, sizeof train), 0);
    train_cfg s;
    fx_tiny_spec(&s, train, 8, 4, 2, 1);
    snprintf(s.data.val, sizeof s.data.val, "%s", val);
    s.model.n_layer = 2;
    s.model.n_head = 4;
    s.model.n_embd = 64;
    s.model.seq_len = 64;
    s.model.padded_vocab_size = 256;
    s.optim.lr = lr;
    s.optim.weight_decay = 0.0;
    s.lr.type = SPEC_LR_COSINE;
    s.lr.warmup_steps = 10;
    s.lr.min_lr = lr / 10;
    s.max_steps = STEPS;
    s.eval_interval = 50;
    s.eval_batches = 2;
    s.precision = precision;
    kern_device_info dev;
    fx_devices(&dev, 1, 1ull << 30);
    for (int i = 0; i < STEPS; i++)
        val_loss[i] = NAN;
    train_hooks h = {.steps_cap = STEPS, .step_loss = loss, .step_val_loss = val_loss};
    trainer_opts o = {.spec = &s, .devices = &dev, .threads_per_device = 2};
    acc_err err = {0};
    int rc = trainer_run_sync(&o, &h, &err);
    unlink(train);
    unlink(val);
    if (rc != 0)
        print_error("run failed: %s\n", err.msg);
    assert_int_equal(rc, 0);
    print_message("%s run: %.2f s\n", spec_precision_name(precision), h.seconds);
}

static void test_text_run(void **state)
{
    if (access(CORPUS, R_OK) != 0)
        skip();
    double loss[STEPS], val_loss[STEPS];
    text_run(SPEC_FP32, 1e-2, loss, val_loss);

    double first = 0, last = 0;
    for (int i = 0; i < 10; i++) {
        first += loss[i] / 10;
        last += loss[STEPS - 10 + i] / 10;
    }
    print_message("train loss: first 10 steps %.3f, last 10 steps %.3f (ln 256 = %.3f)\n", first,
                  last, log(256.0));
    int evals = 0;
    double first_val = NAN, last_val = NAN;
    for (int i = 0; i < STEPS; i++)
        if (!isnan(val_loss[i])) {
            print_message("  eval after step %d: %.3f\n", i + 1, val_loss[i]);
            if (evals++ == 0)
                first_val = val_loss[i];
            last_val = val_loss[i];
        }
    assert_true(fabs(loss[0] - log(256.0)) < 0.3); /* starts near uniform */
    assert_true(last < 3.2);                       /* well below ln 256 = 5.55 */
    assert_int_equal(evals, STEPS / 50);
    assert_true(last_val < first_val);             /* eval follows */
    assert_true(last_val < 3.3);
    assert_true(fabs(last_val - last) < 0.6);      /* and stays near the train loss */
}

/* bf16 (bf16 matmul operands, fp32 accumulation) against fp32 on the same
 * run at lr 1e-3: the loss curve follows fp32's -- the final loss and the
 * mean of the last 20 within 2% -- and is not the fp32 curve (the rounding
 * happened). Not at test_text_run's lr 1e-2, nor at 3e-3: there the run has
 * loss spikes and is chaotic, so fp32 alone moves its final loss by 2-7%
 * when only the sgemm kernel changes (OpenBLAS's Haswell vs SkylakeX
 * kernels on one Sapphire Rapids machine: 3.0125 vs 2.8213 at 3e-3), which
 * would hide what bf16 does. At 1e-3 (and 2e-3) it trains smoothly, to a
 * lower loss than at 3e-3, and bf16 stays within 0.04% of fp32 on both
 * kernels (measured; bench/RESULTS.md, 2026-12-02). */
static void test_text_run_bf16(void **state)
{
    if (access(CORPUS, R_OK) != 0)
        skip();
    double l32[STEPS], l16[STEPS], val_loss[STEPS];
    text_run(SPEC_FP32, 1e-3, l32, val_loss);
    text_run(SPEC_BF16, 1e-3, l16, val_loss);
    double m32 = 0, m16 = 0, maxrel = 0;
    int differ = 0;
    for (int i = 0; i < STEPS; i++) {
        if (i >= STEPS - 20) {
            m32 += l32[i] / 20;
            m16 += l16[i] / 20;
        }
        differ += l16[i] != l32[i];
        maxrel = fmax(maxrel, fabs(l16[i] - l32[i]) / l32[i]);
    }
    double last32 = l32[STEPS - 1], last16 = l16[STEPS - 1];
    print_message("fp32 vs bf16: first loss %.6f / %.6f, final %.4f / %.4f (rel %.3g), "
                  "last-20 mean %.4f / %.4f (rel %.3g); %d of %d steps differ, largest "
                  "relative difference %.3g\n",
                  l32[0], l16[0], last32, last16, fabs(last16 - last32) / last32, m32, m16,
                  fabs(m16 - m32) / m32, differ, STEPS, maxrel);
    assert_true(fabs(last16 - last32) <= 0.02 * last32);
    assert_true(fabs(m16 - m32) <= 0.02 * m32);
    assert_true(differ > STEPS / 2);               /* not the fp32 run */
    assert_true(fabs(l16[0] - l32[0]) > 1e-7 * l32[0]); /* from the first forward on */
    assert_true(m16 < 0.6 * log(256.0));           /* and it learned as fp32 does */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_run),
        cmocka_unit_test(test_text_run_bf16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
