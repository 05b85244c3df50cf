/* hf_dir / model_hf: Hugging Face directories. A tiny LLaMA directory is
 * written here by hand (config.json + safetensors, names and shapes listed
 * below, not taken from accumd's layout); then every defect the submit-time
 * check must catch is planted and its error must be ACC_EINVAL on field
 * "model.from" naming the file and the key or tensor. Also: shards and the
 * index, F32 / BF16 / F16 conversion, header-only opening that reads no
 * data, a sharded save read back, GPT-2 directories (Conv1D transposed, the
 * "transformer." prefix, the attention-mask buffers ignored). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"
#include "hf_dir.h"
#include "model.h"
#include "model_hf.h"
#include "safetensors.h"

static char root[256];

static int setup(void **state)
{
    (void)state;
    snprintf(root, sizeof root, "/tmp/accumd-hf-XXXXXX");
    return mkdtemp(root) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    return fsu_rm_rf(root, NULL);
}

/* LLaMA, 1 layer, C 8, 2 heads of 4, 1 KV head, MLP 12, vocab 10. */
typedef struct tdef {
    char name[96];
    int64_t r, c; /* c = 0: a vector */
    st_dtype dtype;
} tdef;

static int base_tensors(tdef *t)
{
    const tdef d[] = {
        {"model.embed_tokens.weight", 10, 8, ST_F32},
        {"model.layers.0.input_layernorm.weight", 8, 0, ST_F32},
        {"model.layers.0.self_attn.q_proj.weight", 8, 8, ST_F32},
        {"model.layers.0.self_attn.k_proj.weight", 4, 8, ST_F32},
        {"model.layers.0.self_attn.v_proj.weight", 4, 8, ST_F32},
        {"model.layers.0.self_attn.o_proj.weight", 8, 8, ST_F32},
        {"model.layers.0.post_attention_layernorm.weight", 8, 0, ST_F32},
        {"model.layers.0.mlp.gate_proj.weight", 12, 8, ST_F32},
        {"model.layers.0.mlp.up_proj.weight", 12, 8, ST_F32},
        {"model.layers.0.mlp.down_proj.weight", 8, 12, ST_F32},
        {"model.norm.weight", 8, 0, ST_F32},
        {"lm_head.weight", 10, 8, ST_F32},
    };
    int n = (int)(sizeof d / sizeof d[0]);
    memcpy(t, d, sizeof d);
    return n;
}

static json_t *base_config(void)
{
    return json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:n, s:b, s:s}",
                     "architectures", "LlamaForCausalLM", "model_type", "llama", "vocab_size", 10,
                     "hidden_size", 8, "intermediate_size", 12, "num_hidden_layers", 1,
                     "num_attention_heads", 2, "num_key_value_heads", 1,
                     "max_position_embeddings", 32, "rms_norm_eps", 1e-5, "rope_theta", 10000.0,
                     "rope_scaling", "tie_word_embeddings", 0, "torch_dtype", "float32");
}

/* Values v = (i % 7 - 3) / 8, exact in every dtype. */
static void write_file(const char *path, const tdef *t, int n)
{
    st_tensor *st = calloc((size_t)n, sizeof *st);
    void **bufs = calloc((size_t)n, sizeof *bufs);
    for (int i = 0; i < n; i++) {
        size_t cnt = (size_t)t[i].r * (size_t)(t[i].c ? t[i].c : 1);
        float *f = malloc(cnt * sizeof *f);
        for (size_t k = 0; k < cnt; k++)
            f[k] = (float)((int)(k % 7) - 3) / 8.0f;
        bufs[i] = malloc(cnt * 4);
        if (t[i].dtype == ST_I32)
            memset(bufs[i], 0, cnt * 4);
        else
            assert_int_equal(st_from_f32(t[i].dtype, f, cnt, bufs[i], NULL), 0);
        free(f);
        st[i] = (st_tensor){.name = t[i].name, .dtype = t[i].dtype, .ndim = t[i].c ? 2 : 1,
                            .shape = {t[i].r, t[i].c}, .data = bufs[i],
                            .nbytes = cnt * st_dtype_size(t[i].dtype)};
    }
    st_meta md[] = {{"format", "pt"}};
    acc_err e = {0};
    assert_int_equal(st_write(path, st, n, md, 1, &e), 0);
    for (int i = 0; i < n; i++)
        free(bufs[i]);
    free(bufs);
    free(st);
}

static void write_config(const char *dir, json_t *cfg)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(json_dump_file(cfg, path, 0), 0);
    json_decref(cfg);
}

/* A directory `name` under root: config + tensors, in `shards` files. */
static const char *make_dir(const char *name, json_t *cfg, const tdef *t, int n, int shards)
{
    static char dir[512];
    char path[1024];
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    assert_int_equal(fsu_mkdir_p(dir, 0750, NULL), 0);
    write_config(dir, cfg);
    if (shards <= 1) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        write_file(path, t, n);
        return dir;
    }
    json_t *map = json_object();
    int per = (n + shards - 1) / shards;
    for (int s = 0; s < shards; s++) {
        char fn[64];
        snprintf(fn, sizeof fn, "model-%05d-of-%05d.safetensors", s + 1, shards);
        int lo = s * per, hi = lo + per > n ? n : lo + per;
        for (int i = lo; i < hi; i++)
            json_object_set_new(map, t[i].name, json_string(fn));
        snprintf(path, sizeof path, "%s/%s", dir, fn);
        write_file(path, t + lo, hi - lo);
    }
    json_t *idx = json_pack("{s:{s:i}, s:o}", "metadata", "total_size", 0, "weight_map", map);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    assert_int_equal(json_dump_file(idx, path, 0), 0);
    json_decref(idx);
    return dir;
}

/* validate must fail with every one of the NULL-ended substrings. */
static void expect_error(const char *dir, ...)
{
    acc_err e = {0};
    int rc = model_hf_validate(dir, NULL, &e);
    if (rc == 0)
        fail_msg("%s: accepted", dir);
    assert_int_equal(rc, ACC_EINVAL);
    assert_string_equal(e.field, "model.from");
    va_list ap;
    va_start(ap, dir);
    for (const char *s; (s = va_arg(ap, const char *)) != NULL;)
        if (strstr(e.msg, s) == NULL)
            fail_msg("error \"%s\" does not name \"%s\"", e.msg, s);
    va_end(ap);
    print_message("  %s\n", e.msg);
}

static void test_valid_single_and_sharded(void **state)
{
    (void)state;
    tdef t[16];
    int n = base_tensors(t);
    acc_err e = {0};
    model_config c;
    const char *d = make_dir("ok1", base_config(), t, n, 1);
    assert_int_equal(model_hf_validate(d, &c, &e), 0);
    assert_string_equal(model_family_of(&c)->name, "llama");
    assert_int_equal(c.n_kv_head, 1);
    assert_int_equal(c.intermediate_size, 12);
    d = make_dir("ok3", base_config(), t, n, 3);
    assert_int_equal(model_hf_validate(d, &c, &e), 0);
    /* a tied model has no lm_head.weight (the last of base_tensors); an
     * old export may carry rotary buffers */
    json_t *cfg = base_config();
    json_object_set_new(cfg, "tie_word_embeddings", json_true());
    snprintf(t[n - 1].name, sizeof t[n - 1].name, "model.layers.0.self_attn.rotary_emb.inv_freq");
    t[n - 1].r = 2, t[n - 1].c = 0, t[n - 1].dtype = ST_F32;
    d = make_dir("oktied", cfg, t, n, 1);
    assert_int_equal(model_hf_validate(d, &c, &e), 0);
    assert_true(c.tie_word_embeddings);
}

/* issue 25 defect 11: tie_word_embeddings plus an lm_head.weight tensor is
 * refused (the tensor would be silently ignored), naming both. */
static void test_tied_with_lm_head(void **state)
{
    (void)state;
    tdef t[16];
    int n = base_tensors(t);
    json_t *cfg = base_config();
    json_object_set_new(cfg, "tie_word_embeddings", json_true());
    expect_error(make_dir("tiedhead", cfg, t, n, 1), "tiedhead", "lm_head.weight", "tie_word_embeddings",
                 NULL);
}

static void test_bad_checkpoints(void **state)
{
    (void)state;
    tdef t[16];
    int n = base_tensors(t);
    json_t *c;

    c = base_config();
    json_object_set_new(c, "architectures", json_pack("[s]", "FalconForCausalLM"));
    expect_error(make_dir("arch", c, t, n, 1), "arch/config.json", "architectures",
                 "FalconForCausalLM", NULL);

    c = base_config();
    json_object_del(c, "architectures");
    json_object_set_new(c, "model_type", json_string("falcon"));
    expect_error(make_dir("mtype", c, t, n, 1), "mtype/config.json", "model_type", "falcon", NULL);

    c = base_config();
    json_object_del(c, "num_hidden_layers");
    expect_error(make_dir("nokey", c, t, n, 1), "nokey", "config.json", "num_hidden_layers", NULL);

    c = base_config();
    json_object_set_new(c, "rope_scaling", json_pack("{s:s, s:f}", "rope_type", "yarn", "factor", 4.0));
    expect_error(make_dir("rope", c, t, n, 1), "rope", "config.json", "rope_scaling", "yarn", NULL);

    tdef m[16];
    memcpy(m, t, sizeof m);
    m[8] = m[n - 1]; /* drop up_proj */
    expect_error(make_dir("missing", base_config(), m, n - 1, 1), "missing/model.safetensors",
                 "model.layers.0.mlp.up_proj.weight", NULL);
    expect_error(make_dir("missing3", base_config(), m, n - 1, 3),
                 "missing3/model.safetensors.index.json", "model.layers.0.mlp.up_proj.weight", NULL);

    memcpy(m, t, sizeof m);
    snprintf(m[n].name, sizeof m[n].name, "model.layers.0.self_attn.extra.weight");
    m[n].r = 4, m[n].c = 0, m[n].dtype = ST_F32;
    expect_error(make_dir("extra", base_config(), m, n + 1, 1), "extra/model.safetensors",
                 "model.layers.0.self_attn.extra.weight", NULL);

    memcpy(m, t, sizeof m);
    m[3].r = 8; /* k_proj as if MHA */
    expect_error(make_dir("shape", base_config(), m, n, 2), "shape/model-00001-of-00002.safetensors",
                 "model.layers.0.self_attn.k_proj.weight", "[8, 8]", "[4, 8]", NULL);

    memcpy(m, t, sizeof m);
    m[10].dtype = ST_I32;
    expect_error(make_dir("dtype", base_config(), m, n, 1), "dtype/model.safetensors",
                 "model.norm.weight", "I32", NULL);

    c = base_config();
    json_object_set_new(c, "torch_dtype", json_string("bfloat16")); /* the tensors are F32 */
    expect_error(make_dir("cfgdtype", c, t, n, 1), "cfgdtype/model.safetensors", "torch_dtype",
                 "model.embed_tokens.weight", NULL);

    const char *d = make_dir("shard", base_config(), t, n, 3);
    char path[1024];
    snprintf(path, sizeof path, "%s/model-00002-of-00003.safetensors", d);
    assert_int_equal(unlink(path), 0);
    expect_error(d, "shard/model.safetensors.index.json", "model-00002-of-00003.safetensors",
                 "missing", NULL);

    d = make_dir("noconfig", base_config(), t, n, 1);
    snprintf(path, sizeof path, "%s/config.json", d);
    assert_int_equal(unlink(path), 0);
    expect_error(d, "noconfig", "config.json", NULL);

    d = make_dir("noweights", base_config(), t, n, 1);
    snprintf(path, sizeof path, "%s/model.safetensors", d);
    assert_int_equal(unlink(path), 0);
    expect_error(d, "noweights", "model.safetensors", NULL);

    /* the index names a shard outside the directory */
    d = make_dir("escape", base_config(), t, n, 1);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", d);
    FILE *f = fopen(path, "w");
    fprintf(f, "{\"weight_map\": {\"model.norm.weight\": \"../ok1/model.safetensors\"}}");
    fclose(f);
    expect_error(d, "escape/model.safetensors.index.json", "../ok1/model.safetensors", NULL);
}

/* The header-only open never touches the data: a file whose checksum
 * disagrees with its data opens header-only, fails a full open. */
static void test_header_only(void **state)
{
    (void)state;
    tdef t[16];
    int n = base_tensors(t);
    const char *d = make_dir("hdr", base_config(), t, n, 1);
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", d);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, -3, SEEK_END), 0);
    fputc(0x55, f);
    fclose(f);
    acc_err e = {0};
    st_file *sf = NULL;
    assert_int_not_equal(st_open(path, &sf, &e), 0);
    assert_int_equal(st_open_header(path, &sf, &e), 0);
    st_close(sf);
    assert_int_equal(model_hf_validate(d, NULL, &e), 0);
    hf_dir *h;
    assert_int_equal(hf_open(d, 1, &h, &e), 0);
    float buf[8];
    assert_int_equal(hf_read(h, "model.norm.weight", buf, 8, &e), ACC_ESTATE);
    hf_close(h);
}

static void test_dtypes(void **state)
{
    (void)state;
    const st_dtype ds[3] = {ST_F32, ST_BF16, ST_F16};
    float in[6] = {1.0f, -2.5f, 0.15625f, 65504.0f, -0.0f, 3.0e-5f}, out[6];
    for (int k = 0; k < 3; k++) {
        uint8_t raw[24];
        assert_int_equal(st_from_f32(ds[k], in, 6, raw, NULL), 0);
        st_tensor t = {.name = "x", .dtype = ds[k], .ndim = 1, .shape = {6}, .data = raw,
                       .nbytes = 6 * st_dtype_size(ds[k])};
        assert_int_equal(st_to_f32(&t, out, 6, NULL), 0);
        for (int i = 0; i < 5; i++)
            assert_true(out[i] == in[i] || ds[k] == ST_BF16); /* bf16: 65504 rounds */
        if (ds[k] == ST_F16) /* a subnormal half: within half an ulp (2^-25) */
            assert_true(fabsf(out[5] - in[5]) <= 3.0e-8f);
    }
    /* known bit patterns: bf16 0x3fc0 = 1.5, f16 0x3e00 = 1.5, f16 0x0001 = 2^-24 */
    uint8_t b[2] = {0xc0, 0x3f}, h[2] = {0x00, 0x3e}, s[2] = {0x01, 0x00};
    st_tensor tb = {.name = "b", .dtype = ST_BF16, .ndim = 1, .shape = {1}, .data = b, .nbytes = 2};
    st_tensor th = {.name = "h", .dtype = ST_F16, .ndim = 1, .shape = {1}, .data = h, .nbytes = 2};
    st_tensor ts = {.name = "s", .dtype = ST_F16, .ndim = 1, .shape = {1}, .data = s, .nbytes = 2};
    assert_int_equal(st_to_f32(&tb, out, 1, NULL), 0);
    assert_true(out[0] == 1.5f);
    assert_int_equal(st_to_f32(&th, out, 1, NULL), 0);
    assert_true(out[0] == 1.5f);
    assert_int_equal(st_to_f32(&ts, out, 1, NULL), 0);
    assert_true(out[0] == ldexpf(1.0f, -24));
}

/* hf_save shards at the threshold, writes the index, keeps config keys,
 * copies tokenizer files; hf_open reads it back value for value. */
typedef struct src {
    const tdef *t;
} src;

static int fill(void *ctx, int i, float *buf, acc_err *err)
{
    (void)err;
    const tdef *t = ((src *)ctx)->t;
    size_t cnt = (size_t)t[i].r * (size_t)(t[i].c ? t[i].c : 1);
    for (size_t k = 0; k < cnt; k++)
        buf[k] = (float)i + (float)(k % 8) / 8.0f;
    return 0;
}

static void test_save_sharded(void **state)
{
    (void)state;
    tdef t[16];
    int n = base_tensors(t);
    hf_tensor ht[16];
    for (int i = 0; i < n; i++) {
        memset(&ht[i], 0, sizeof ht[i]);
        snprintf(ht[i].name, sizeof ht[i].name, "%.95s", t[i].name);
        ht[i].ndim = t[i].c ? 2 : 1;
        ht[i].shape[0] = t[i].r;
        ht[i].shape[1] = t[i].c;
    }
    const char *srcdir = make_dir("src", base_config(), t, n, 1);
    char path[1024], out[512];
    snprintf(path, sizeof path, "%s/tokenizer.json", srcdir);
    assert_int_equal(fsu_write_atomic(path, "{\"x\":1}", 7, NULL), 0);
    snprintf(out, sizeof out, "%s/saved", root);
    json_t *cfg = base_config();
    json_object_set_new(cfg, "custom_key", json_string("kept"));
    src s = {t};
    hf_save_opts o = {.dtype = ST_BF16, .max_shard_bytes = 300, .config = cfg, .src_dir = srcdir};
    acc_err e = {0};
    assert_int_equal(hf_save(out, ht, n, fill, &s, &o, &e), 0);
    json_decref(cfg);
    hf_dir *h;
    assert_int_equal(hf_open(out, 0, &h, &e), 0);
    assert_int_equal(hf_check(h, ht, n, NULL, &e), 0);
    assert_int_equal(hf_dtype(h), ST_BF16);
    assert_string_equal(json_string_value(json_object_get(hf_config(h), "torch_dtype")), "bfloat16");
    assert_string_equal(json_string_value(json_object_get(hf_config(h), "custom_key")), "kept");
    float buf[128], want[128];
    for (int i = 0; i < n; i++) {
        size_t cnt = (size_t)t[i].r * (size_t)(t[i].c ? t[i].c : 1);
        assert_int_equal(hf_read(h, t[i].name, buf, cnt, &e), 0);
        fill(&s, i, want, NULL);
        for (size_t k = 0; k < cnt; k++) /* exact in bf16: 8 significant bits suffice */
            assert_true(buf[k] == want[k]);
    }
    hf_close(h);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", out);
    assert_int_equal(access(path, F_OK), 0);
    snprintf(path, sizeof path, "%s/model-00002-of-00007.safetensors", out);
    assert_int_equal(access(path, F_OK), 0);
    snprintf(path, sizeof path, "%s/tokenizer.json", out);
    assert_int_equal(access(path, F_OK), 0);
}

/* Issue 16, defects 2 and 3 in model directories: every file of the
 * directory is reached through safepath.h under the roots, and no message
 * quotes a file's bytes. `root` stands for the data root; "outside" is a
 * sibling directory of it. */
static void put_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void expect_refused_under(const char *roots, const char *dir, const char *want)
{
    acc_err e = {0};
    int rc = model_hf_validate_under(roots, dir, NULL, &e);
    if (rc == 0)
        fail_msg("%s: accepted", dir);
    assert_int_equal(rc, ACC_EINVAL);
    assert_string_equal(e.field, "model.from");
    if (strstr(e.msg, want) == NULL)
        fail_msg("error \"%s\" does not say \"%s\"", e.msg, want);
    if (strstr(e.msg, "root:") != NULL || strstr(e.msg, "SECRET") != NULL)
        fail_msg("error \"%s\" quotes the file", e.msg);
    print_message("  %s\n", e.msg);
}

static void test_dir_files_under_roots(void **state)
{
    (void)state;
    tdef t[16];
    int n = base_tensors(t);
    char data[600], outside[600], secret[700], path[1024], link[1024];
    snprintf(data, sizeof data, "%s/data", root);
    snprintf(outside, sizeof outside, "%s/outside", root);
    assert_int_equal(fsu_mkdir_p(data, 0750, NULL), 0);
    assert_int_equal(fsu_mkdir_p(outside, 0750, NULL), 0);
    snprintf(secret, sizeof secret, "%s/passwd", outside);
    put_text(secret, "root:x:0:0:SECRET-CONTENT:/root:/bin/bash\n");

    /* a file that is not JSON: line and column, never jansson's text ("'[' or
     * '{' expected near 'root'") */
    const char *d = make_dir("data/notjson", base_config(), t, n, 1);
    snprintf(path, sizeof path, "%s/config.json", d);
    put_text(path, "root:x:0:0:SECRET-CONTENT:/root:/bin/bash\n");
    expect_refused_under("", d, "config.json: not valid JSON (line 1, column");
    d = make_dir("data/notjson3", base_config(), t, n, 3);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", d);
    put_text(path, "root:x:0:0:SECRET-CONTENT:/root:/bin/bash\n");
    expect_refused_under("", d, "model.safetensors.index.json: not valid JSON (line 1, column");

    /* config.json, a shard, the index, a side file hf_save would copy: a
     * symlink out of the roots is refused, whatever the file */
    static const char *const names[] = {"config.json", "model.safetensors", "tokenizer.json",
                                        "generation_config.json"};
    for (int k = 0; k < 4; k++) {
        char name[64];
        snprintf(name, sizeof name, "data/link%d", k);
        d = make_dir(name, base_config(), t, n, 1);
        snprintf(link, sizeof link, "%s/%s", d, names[k]);
        unlink(link);
        assert_int_equal(symlink(secret, link), 0);
        expect_refused_under(data, d, "outside the allowed roots");
    }
    /* a FIFO among the files: refused, without blocking */
    d = make_dir("data/fifo", base_config(), t, n, 1);
    snprintf(path, sizeof path, "%s/merges.txt", d);
    assert_int_equal(mkfifo(path, 0640), 0);
    expect_refused_under(data, d, "FIFO");

    /* the hub cache's layout: every file a symlink into ../../blobs, all of
     * it under the root: accepted */
    d = make_dir("data/hub/blobs", base_config(), t, n, 1);
    char snap[700];
    snprintf(snap, sizeof snap, "%s/hub/snapshots/abc", data);
    assert_int_equal(fsu_mkdir_p(snap, 0750, NULL), 0);
    for (int k = 0; k < 2; k++) {
        snprintf(link, sizeof link, "%s/%s", snap, names[k]);
        snprintf(path, sizeof path, "../../blobs/%s", names[k]);
        assert_int_equal(symlink(path, link), 0);
    }
    acc_err e = {0};
    model_config c;
    if (model_hf_validate_under(data, snap, &c, &e) != 0)
        fail_msg("hub layout refused: %s", e.msg);
    /* ... and hf_save copies a side file only through the same check */
    snprintf(link, sizeof link, "%s/tokenizer.json", snap);
    assert_int_equal(symlink(secret, link), 0);
    tdef t2[16];
    int n2 = base_tensors(t2);
    hf_tensor ht[16];
    for (int i = 0; i < n2; i++) {
        memset(&ht[i], 0, sizeof ht[i]);
        snprintf(ht[i].name, sizeof ht[i].name, "%.95s", t2[i].name);
        ht[i].ndim = t2[i].c ? 2 : 1;
        ht[i].shape[0] = t2[i].r;
        ht[i].shape[1] = t2[i].c;
    }
    char out[700];
    snprintf(out, sizeof out, "%s/saved-from-hub", root);
    src sv = {t2};
    hf_save_opts o = {.dtype = ST_F32, .config = NULL, .src_dir = snap, .src_roots = data};
    memset(&e, 0, sizeof e);
    assert_int_equal(hf_save(out, ht, n2, fill, &sv, &o, &e), ACC_EINVAL);
    assert_non_null(strstr(e.msg, "outside the allowed roots"));
    snprintf(path, sizeof path, "%s/tokenizer.json", out);
    assert_int_not_equal(access(path, F_OK), 0); /* nothing of it copied */
}

/* A GPT-2 directory as transformers writes GPT2LMHeadModel: names under
 * "transformer.", Conv1D weights [in, out], the causal-mask buffers. */
static void test_gpt2_dir(void **state)
{
    (void)state;
    int C = 8, V = 12, P = 16;
    tdef t[24];
    int n = 0;
#define T(nm, r_, c_) (snprintf(t[n].name, sizeof t[n].name, "transformer." nm), t[n].r = (r_), t[n].c = (c_), t[n++].dtype = ST_F32)
    T("wte.weight", V, C);
    T("wpe.weight", P, C);
    T("h.0.ln_1.weight", C, 0);
    T("h.0.ln_1.bias", C, 0);
    T("h.0.attn.c_attn.weight", C, 3 * C);
    T("h.0.attn.c_attn.bias", 3 * C, 0);
    T("h.0.attn.c_proj.weight", C, C);
    T("h.0.attn.c_proj.bias", C, 0);
    T("h.0.attn.bias", P, P);
    T("h.0.ln_2.weight", C, 0);
    T("h.0.ln_2.bias", C, 0);
    T("h.0.mlp.c_fc.weight", C, 4 * C);
    T("h.0.mlp.c_fc.bias", 4 * C, 0);
    T("h.0.mlp.c_proj.weight", 4 * C, C);
    T("h.0.mlp.c_proj.bias", C, 0);
    T("ln_f.weight", C, 0);
    T("ln_f.bias", C, 0);
#undef T
    json_t *cfg = json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i}", "architectures", "GPT2LMHeadModel",
                            "model_type", "gpt2", "n_layer", 1, "n_head", 2, "n_embd", C,
                            "vocab_size", V, "n_positions", P);
    const char *d = make_dir("gpt2", cfg, t, n, 1);
    acc_err e = {0};
    model_config c;
    assert_int_equal(model_hf_validate(d, &c, &e), 0);
    assert_string_equal(model_family_of(&c)->name, "gpt2");
    kern_device_info info = {.kind = KERN_DEV_CPU, .mem_total = 64u << 20};
    kern_device *dev;
    assert_int_equal(kern_device_open(&info, 1, &dev, &e), 0);
    model *m;
    assert_int_equal(model_create(dev, &c, 1, 4, &m, &e), 0);
    assert_int_equal(model_hf_load_dir(m, d, &e), 0);
    /* c_attn.weight file [C, 3C] row r col k = ((r*3C + k) % 7 - 3) / 8;
     * the model's buffer is [3C, C]: element [k][r] */
    const model_tensor *mt = model_find_tensor(m, "h.0.attn.c_attn.weight");
    assert_non_null(mt);
    assert_true(mt->transposed);
    float *w = malloc(3 * (size_t)C * C * sizeof *w);
    dev->ops->download(dev, w, m->params + mt->offset, 3 * (size_t)C * C * sizeof *w);
    for (int r = 0; r < C; r++)
        for (int k = 0; k < 3 * C; k++)
            assert_true(w[(size_t)k * C + r] == (float)((r * 3 * C + k) % 7 - 3) / 8.0f);
    free(w);
    /* and saved back in the file orientation */
    char out[600];
    snprintf(out, sizeof out, "%s/gpt2-out", root);
    model_hf_save_opts so = {.dtype = ST_F32, .src_dir = d};
    assert_int_equal(model_hf_save(m, out, &so, &e), 0);
    hf_dir *h;
    assert_int_equal(hf_open(out, 0, &h, &e), 0);
    float row[24];
    float *all = malloc(3 * (size_t)C * C * sizeof *all);
    assert_int_equal(hf_read(h, "h.0.attn.c_attn.weight", all, 3 * (size_t)C * C, &e), 0);
    memcpy(row, all, sizeof row);
    for (int k = 0; k < 3 * C; k++)
        assert_true(row[k] == (float)(k % 7 - 3) / 8.0f);
    free(all);
    hf_close(h);
    model_free(m);
    kern_device_close(dev);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_single_and_sharded),
        cmocka_unit_test(test_tied_with_lm_head),
        cmocka_unit_test(test_bad_checkpoints),
        cmocka_unit_test(test_header_only),
        cmocka_unit_test(test_dtypes),
        cmocka_unit_test(test_save_sharded),
        cmocka_unit_test(test_gpt2_dir),
        cmocka_unit_test(test_dir_files_under_roots),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
