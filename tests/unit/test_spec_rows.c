/* spec_rows (issue 19): the job spec's sections as tables. Every row is
 * checked (keys unique per section, a default its own row accepts, a value
 * of the wrong kind refused naming the key path, unknown keys refused
 * first), the defaults are the values job specs had before the tables (an
 * independent copy of the old hand-written defaults), and docs/api.md's
 * "Every job-spec key" lists exactly the rows, in order, with their
 * defaults: a key added without its doc line fails. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "job_spec.h"
#include "spec_rows.h"

static void path_of(const spec_section *sec, const spec_row *r, char *out, size_t n)
{
    snprintf(out, n, "%s%s%s", sec->prefix, sec->prefix[0] ? "." : "", r->key);
}

/* A scratch the size of a whole spec: every section's struct lies in one. */
static job_spec scratch;

static void test_rows(void **state)
{
    (void)state;
    size_t total = 0;
    for (const spec_section *sec = spec_sections(); sec->prefix != NULL; sec++) {
        acc_err err = {0};
        memset(&scratch, 0, sizeof scratch);
        if (spec_rows_defaults(sec, &scratch, &err) != 0) /* each default through its own row */
            fail_msg("a default of section '%s' is refused: %s", sec->prefix, err.msg);
        for (size_t i = 0; i < sec->n; i++, total++) {
            const spec_row *r = &sec->rows[i];
            char path[128];
            path_of(sec, r, path, sizeof path);
            for (size_t j = 0; j < i; j++)
                if (!strcmp(sec->rows[j].key, r->key))
                    fail_msg("%s has two rows", path);
            assert_true(r->off + r->size <= sizeof(job_spec));
            if (r->type == SPEC_T_CHOICE)
                assert_non_null(r->choices);
            if (r->type == SPEC_T_CUSTOM)
                assert_non_null(r->set);
            if (r->type == SPEC_T_CODE)
                continue;
            /* a value of the wrong kind (an object) is refused, naming the key path */
            json_t *o = json_pack("{s:{}}", r->key);
            acc_err_clear(&err);
            if (spec_rows_apply(o, sec, &scratch, &err) != ACC_EINVAL)
                fail_msg("%s took an object", path);
            assert_string_equal(err.field, path);
            json_decref(o);
            if (r->type == SPEC_T_INT) { /* one past each end of the range */
                o = json_pack("{s:I}", r->key, (json_int_t)r->hi + 1);
                assert_int_equal(spec_rows_apply(o, sec, &scratch, &err), ACC_EINVAL);
                assert_string_equal(err.field, path);
                json_decref(o);
                o = json_pack("{s:I}", r->key, (json_int_t)r->lo - 1);
                assert_int_equal(spec_rows_apply(o, sec, &scratch, &err), ACC_EINVAL);
                json_decref(o);
                o = json_pack("{s:I}", r->key, (json_int_t)r->lo);
                assert_int_equal(spec_rows_apply(o, sec, &scratch, &err), 0);
                assert_int_equal(*(int *)((char *)&scratch + r->off), (int)r->lo);
                json_decref(o);
            }
        }
        /* unknown keys are refused before any value is read */
        json_t *o = json_pack("{s:s, s:i}", sec->n ? sec->rows[0].key : "x", "not a value", "no_such_key_zz", 1);
        acc_err_clear(&err);
        assert_int_equal(spec_rows_apply(o, sec, &scratch, &err), ACC_EINVAL);
        char want[128];
        snprintf(want, sizeof want, "%s%sno_such_key_zz", sec->prefix, sec->prefix[0] ? "." : "");
        assert_string_equal(err.field, want);
        assert_non_null(strstr(err.msg, "unknown key"));
        json_decref(o);
    }
    assert_true(total >= 50);
}

/* The defaults as job_spec.c's set_defaults wrote them by hand before the
 * tables (lora's: r 8, alpha 8 once the section is given). */
static void old_defaults(job_spec *s)
{
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "job");
    snprintf(s->model.arch, sizeof s->model.arch, "gpt2");
    s->model.n_layer = 4;
    s->model.n_head = 4;
    s->model.n_embd = 128;
    s->model.seq_len = 128;
    s->model.vocab_size = 256;
    s->devices = 1;
    s->nodes = 1;
    s->precision = SPEC_FP32;
    s->optim = (spec_optim){.lr = 6e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1,
                            .grad_clip = 1.0};
    s->lr = (spec_lr){.type = SPEC_LR_CONSTANT, .cos_min_ratio = 0.0001};
    s->max_steps = 100;
    s->seed = 1337;
    s->oom_adapt = true;
    s->checkpoint_on_cancel = true;
}

static void test_defaults_unchanged(void **state)
{
    (void)state;
    acc_conf conf;
    acc_err err = {0};
    conf_defaults(&conf);
    assert_int_equal(conf_finalize(&conf, &err), 0);
    job_spec *now = calloc(1, sizeof *now), *was = calloc(1, sizeof *was);
    assert_true(now != NULL && was != NULL);
    const char *spec = "{\"lora\": {}, \"train_batch_size\": 8}";
    if (job_spec_parse_plan(spec, strlen(spec), &conf, now, &err) != 0)
        fail_msg("%s: %s", err.field, err.msg);
    old_defaults(was);
    assert_string_equal(now->name, was->name);
    assert_string_equal(now->model.arch, was->model.arch);
    assert_int_equal(now->model.n_layer, was->model.n_layer);
    assert_int_equal(now->model.n_head, was->model.n_head);
    assert_int_equal(now->model.n_embd, was->model.n_embd);
    assert_int_equal(now->model.seq_len, was->model.seq_len);
    assert_int_equal(now->model.vocab_size, was->model.vocab_size);
    assert_int_equal(now->model.padded_vocab_size, was->model.vocab_size); /* derived */
    assert_int_equal(now->model.n_kv_head, 0);
    assert_int_equal(now->model.intermediate_size, 0);
    assert_string_equal(now->model.init_from, "");
    assert_int_equal(now->devices, was->devices);
    assert_int_equal(now->nodes, was->nodes);
    assert_int_equal(now->precision, was->precision);
    assert_memory_equal(&now->optim, &was->optim, sizeof was->optim); /* bit for bit */
    assert_int_equal(now->lr.type, was->lr.type);
    assert_int_equal(now->lr.warmup_steps, 0);
    assert_true(now->lr.min_lr == 0 && now->lr.warmup_min_lr == 0 && now->lr.warmup_ratio == 0);
    assert_true(now->lr.cos_min_ratio == was->lr.cos_min_ratio);
    assert_int_equal(now->lr.total_steps, was->max_steps); /* derived */
    assert_int_equal(now->max_steps, was->max_steps);
    assert_true(now->num_train_epochs == 0);
    assert_int_equal(now->eval_interval, 0);
    assert_int_equal(now->eval_batches, 0);
    assert_int_equal(now->checkpoint_interval, 0);
    assert_true(now->seed == was->seed);
    assert_int_equal(now->priority, 0);
    assert_int_equal(now->max_restarts, 0);
    assert_int_equal(now->save_total_limit, 0);
    assert_true(now->oom_adapt && now->checkpoint_on_cancel && !now->activation_checkpointing);
    assert_false(now->merge_lora);
    assert_int_equal(now->save_dtype, SPEC_SAVE_AUTO);
    assert_string_equal(now->output_name, "");
    assert_string_equal(now->resume_from, "");
    assert_int_equal(now->lora.r, 8);
    assert_true(now->lora.alpha == 8 && now->lora.dropout == 0);
    free(now);
    free(was);
}

/* The rows of docs/api.md's "### Every job-spec key" table:
 * "| `path` | `default` or — | ... |". */
static void test_docs_list_every_key(void **state)
{
    (void)state;
    const char *src = getenv("ACCUMD_SRC");
    assert_non_null(src);
    char file[4096], line[2048];
    snprintf(file, sizeof file, "%s/docs/api.md", src);
    FILE *f = fopen(file, "r");
    assert_non_null(f);
    const spec_section *sec = spec_sections();
    size_t i = 0;
    int in = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        if (line[0] == '#') {
            in = !strncmp(line, "### Every job-spec key", 22);
            continue;
        }
        if (!in || strncmp(line, "| `", 3) != 0)
            continue;
        char *key = line + 3, *end = strchr(key, '`');
        assert_non_null(end);
        *end = '\0';
        while (sec->prefix != NULL && i == sec->n) {
            sec++;
            i = 0;
        }
        if (sec->prefix == NULL)
            fail_msg("docs/api.md documents '%s', which no spec row holds", key);
        char path[128];
        path_of(sec, &sec->rows[i], path, sizeof path);
        if (strcmp(key, path) != 0)
            fail_msg("docs/api.md lists '%s' where the tables have '%s' (same keys, same order)", key, path);
        const char *col = end + 1;
        col += strspn(col, " |");
        const char *def = sec->rows[i].def;
        char want[128];
        snprintf(want, sizeof want, def ? "`%s` |" : "— |", def);
        if (strncmp(col, want, strlen(want)) != 0)
            fail_msg("docs: the default of '%s' must read %s", key, want);
        i++;
    }
    fclose(f);
    while (sec->prefix != NULL && i == sec->n) {
        sec++;
        i = 0;
    }
    if (sec->prefix != NULL)
        fail_msg("docs/api.md's 'Every job-spec key' lacks '%s%s%s'", sec->prefix, sec->prefix[0] ? "." : "",
                 sec->rows[i].key);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows),
        cmocka_unit_test(test_defaults_unchanged),
        cmocka_unit_test(test_docs_list_every_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
