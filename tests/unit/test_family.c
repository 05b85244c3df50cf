/* The model-family seam (model.h): the registry, the layout contract every
 * family must keep (ascending, contiguous, unique names, the buffer's
 * floats), config from a Hugging Face config.json and back, weights by
 * layout through safetensors, and the batch split's one validator
 * (batch_split.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "batch_split.h"
#include "model.h"

static void test_registry(void **state)
{
    (void)state;
    const model_family *g = model_family_by_arch("gpt2");
    assert_non_null(g);
    assert_ptr_equal(model_family_by_arch(""), g); /* the default */
    assert_ptr_equal(model_family_by_arch(NULL), g);
    assert_ptr_equal(model_family_default(), g);
    assert_null(model_family_by_arch("gpt3"));
    assert_ptr_equal(model_family_by_hf_type("gpt2"), g);
    assert_null(model_family_by_hf_type("t5"));
    char names[256];
    assert_non_null(strstr(model_family_names(names, sizeof names), "gpt2"));
    int n = 0;
    while (model_family_at(n) != NULL) {
        const model_family *f = model_family_at(n);
        /* every required entry is there */
        assert_true(f->name && f->config_from_spec && f->config_check && f->layout &&
                    f->act_bytes && f->acts_alloc && f->acts_free &&
                    f->forward && f->backward && f->init_host);
        assert_ptr_equal(model_family_by_arch(f->name), f);
        n++;
    }
    assert_true(n >= 1);
    spec_model sm = {.n_layer = 1, .n_head = 1, .n_embd = 8, .seq_len = 4, .vocab_size = 10};
    snprintf(sm.arch, sizeof sm.arch, "nope");
    model_config cfg;
    acc_err err = {0};
    assert_int_equal(model_config_from_spec(&sm, &cfg, &err), ACC_EINVAL);
    assert_string_equal(err.field, "model.arch");
}

/* Every family's layout: ascending, contiguous, names unique, counts >=
 * prod(shape), sum = nparams; block layers in [0, L). */
static void check_layout(const model_config *cfg)
{
    model_layout l;
    acc_err err = {0};
    assert_int_equal(model_layout_build(cfg, &l, &err), 0);
    size_t at = 0;
    for (int i = 0; i < l.n; i++) {
        const model_tensor *t = &l.t[i];
        assert_true(t->offset == at);
        assert_true(t->count >= model_tensor_file_count(t));
        assert_true(t->layer >= -1 && t->layer < cfg->n_layer);
        for (int j = 0; j < i; j++)
            assert_string_not_equal(l.t[j].name, t->name);
        at += t->count;
    }
    assert_true(at == l.nparams);
    assert_true(l.nparams == model_num_params(cfg));
    size_t blocks = 0;
    for (int k = 0; k < cfg->n_layer; k++)
        blocks += model_layout_layer_floats(&l, k);
    assert_true(blocks == model_block_params(cfg) * (size_t)cfg->n_layer);
    model_layout_free(&l);
}

static void test_gpt2_layout_and_hf_config(void **state)
{
    (void)state;
    json_t *hf = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i}", "model_type", "gpt2", "n_layer", 3,
                           "n_head", 4, "n_embd", 32, "vocab_size", 50, "n_positions", 16);
    model_config cfg;
    acc_err err = {0};
    assert_int_equal(model_config_from_hf(hf, &cfg, &err), 0);
    assert_ptr_equal(cfg.family, model_family_by_arch("gpt2"));
    assert_true(cfg.n_layer == 3 && cfg.n_head == 4 && cfg.channels == 32 &&
                cfg.vocab_size == 50 && cfg.max_seq_len == 16 && cfg.tie_word_embeddings);
    check_layout(&cfg);
    model_layout l;
    assert_int_equal(model_layout_build(&cfg, &l, &err), 0);
    const model_tensor *t = model_layout_find(&l, "h.2.attn.c_attn.weight");
    assert_non_null(t);
    assert_true(t->transposed && t->decays && t->trains && t->layer == 2);
    assert_true(t->shape[0] == 32 && t->shape[1] == 96);
    t = model_layout_find(&l, "ln_f.bias");
    assert_true(t != NULL && !t->decays && t->layer == -1);
    model_layout_free(&l);
    /* written back, it reads the same */
    json_t *out = json_object();
    assert_int_equal(cfg.family->config_to_hf(&cfg, out, &err), 0);
    model_config again;
    assert_int_equal(model_config_from_hf(out, &again, &err), 0);
    assert_true(again.n_layer == 3 && again.channels == 32 && again.vocab_size == 50 &&
                again.max_seq_len == 16);
    json_decref(out);
    /* an unknown model_type and a bad width name the directory's field */
    json_object_set_new(hf, "model_type", json_string("bert"));
    assert_int_equal(model_config_from_hf(hf, &cfg, &err), ACC_EINVAL);
    assert_string_equal(err.field, "model.from");
    json_object_set_new(hf, "model_type", json_string("gpt2"));
    json_object_set_new(hf, "n_embd", json_string("wide"));
    assert_int_equal(model_config_from_hf(hf, &cfg, &err), ACC_EINVAL);
    assert_string_equal(err.field, "model.from");
    json_decref(hf);
}

/* Weights by layout: written, read back identical; padding stays zero;
 * a missing tensor names itself. */
static void test_safetensors_by_layout(void **state)
{
    (void)state;
    model_config cfg = {.max_seq_len = 8, .vocab_size = 20, .padded_vocab_size = 24,
                        .n_layer = 2, .n_head = 2, .channels = 8};
    model_layout l;
    acc_err err = {0};
    assert_int_equal(model_layout_build(&cfg, &l, &err), 0);
    float *a = calloc(l.nparams, sizeof *a), *b = calloc(l.nparams, sizeof *b);
    assert_true(a && b);
    for (size_t i = 0; i < l.nparams; i++)
        a[i] = (float)((i * 2654435761u) % 1000) / 1000.0f;
    const model_tensor *wte = model_layout_find(&l, "wte.weight");
    memset(a + wte->offset + 20 * 8, 0, 4 * 8 * sizeof *a); /* padded rows are zero */
    char path[] = "/tmp/accumd-family-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    st_meta md[] = {{"format", "pt"}};
    assert_int_equal(model_safetensors_write(&l, a, path, md, 1, &err), 0);
    st_file *f;
    assert_int_equal(st_open(path, &f, &err), 0);
    assert_int_equal(st_count(f), l.n);
    assert_int_equal(model_safetensors_read(&l, f, path, "model.init_from", b, &err), 0);
    assert_memory_equal(a, b, l.nparams * sizeof *a);
    st_close(f);
    /* a layout with one more layer misses h.2.*: named */
    model_config big = cfg;
    big.n_layer = 3;
    model_layout l3;
    assert_int_equal(model_layout_build(&big, &l3, &err), 0);
    float *c = calloc(l3.nparams, sizeof *c);
    assert_int_equal(st_open(path, &f, &err), 0);
    assert_int_equal(model_safetensors_read(&l3, f, path, "model.init_from", c, &err), ACC_EINVAL);
    assert_string_equal(err.field, "model.init_from");
    assert_non_null(strstr(err.msg, "h.2."));
    st_close(f);
    model_layout_free(&l3);
    model_layout_free(&l);
    free(a), free(b), free(c);
    unlink(path);
}

/* Gradient spans of a layer-major layout (a LLaMA-style family: all of
 * block l, then block l + 1): one span per bucket, the ends and the tail
 * merged where they touch; any cut covers the buffer exactly once. */
static void test_spans_layer_major(void **state)
{
    (void)state;
    model_layout l = {0};
    int cap = 0;
    acc_err err = {0};
    int64_t v[1] = {8}, w[2] = {8, 8};
    assert_int_equal(model_layout_add(&l, &cap, "embed", -1, 2, w, 0, true, true, false, "m", &err), 0);
    char name[32];
    for (int k = 0; k < 4; k++)
        for (int j = 0; j < 3; j++) {
            snprintf(name, sizeof name, "layers.%d.t%d", k, j);
            assert_int_equal(model_layout_add(&l, &cap, name, k, j ? 2 : 1, j ? w : v, 0, j != 0,
                                              true, false, "m", &err), 0);
        }
    assert_int_equal(model_layout_add(&l, &cap, "norm", -1, 1, v, 0, false, true, false, "m", &err), 0);
    model m = {.layout = l, .nparams = l.nparams, .ngrad = l.nparams, .grad_tail = 4};
    kern_span sp[MODEL_MAX_GRAD_SPANS];
    assert_int_equal(model_grad_spans(&m, 1, 3, 0, sp), 1); /* blocks 1, 2: one span */
    assert_true(sp[0].off == 64 + 136 && sp[0].n == 2 * 136);
    int n = model_grad_spans(&m, 0, 0, 1, sp); /* embed; norm + tail */
    assert_int_equal(n, 2);
    assert_true(sp[0].off == 0 && sp[0].n == 64);
    assert_true(sp[1].off == 64 + 4 * 136 && sp[1].n == 8 + 4);
    /* everything: embed and the blocks, then norm + tail (the layer goes
     * down from block 3 to -1, which starts a span) */
    n = model_grad_spans(&m, 0, 4, 1, sp);
    assert_int_equal(n, 2);
    assert_true(sp[0].off == 0 && sp[0].n == 64 + 4 * 136);
    assert_true(sp[1].off + sp[1].n == l.nparams + 4);
    model_layout_free(&l);
}

static void test_batch_split(void **state)
{
    (void)state;
    batch_split s;
    acc_err err = {0};
    assert_int_equal(batch_split_make(32, 2, 8, 2, 16, &s, &err), 0);
    assert_true(s.B == 32 && s.m == 2 && s.a == 8 && s.w == 2 && batch_split_per_rank(&s) == 16);
    assert_int_equal(batch_split_make(32, 2, 16, 2, 16, &s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "train_batch_size");
    assert_string_equal(err.msg, "train_batch_size 32 != 2 * 16 * 2 (micro * accum * world)");
    assert_int_equal(batch_split_make(32, 0, 16, 2, 16, &s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "train_micro_batch_size_per_gpu");
    assert_int_equal(batch_split_make(32, 1, 1, 32, 16, &s, &err), ACC_EINVAL);
    assert_string_equal(err.field, "devices");
    /* the products of large factors do not wrap */
    assert_int_equal(batch_split_make(1 << 24, 1 << 24, 1 << 24, 256, 0, &s, &err), ACC_EINVAL);
    assert_int_equal(batch_split_make(24, 2, 6, 2, 0, &s, &err), 0);
    batch_split t;
    assert_int_equal(batch_split_with_micro(&s, 4, &t), 0);
    assert_true(t.m == 4 && t.a == 3 && t.B == 24 && t.w == 2);
    assert_int_equal(batch_split_with_micro(&s, 5, &t), -1);
    assert_int_equal(batch_split_smaller_micro(&s), 1);
    assert_int_equal(batch_split_larger_micro(&s), 3);
    assert_int_equal(batch_split_with_micro(&s, 12, &t), 0);
    assert_int_equal(batch_split_larger_micro(&t), 0);
    assert_int_equal(batch_split_smaller_micro(&t), 6);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_gpt2_layout_and_hf_config),
        cmocka_unit_test(test_safetensors_by_layout),
        cmocka_unit_test(test_spans_layer_major),
        cmocka_unit_test(test_batch_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
