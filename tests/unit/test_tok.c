/* The tokenizer's own cases, on small tokenizer.json files written here
 * (the real tokenizers are compared with Hugging Face's library in
 * tests/tok/test_tok_ref.sh): BPE merge order, merges as strings and as
 * pairs, byte fallback and fused unknowns, added tokens before the model,
 * the post-processor, decoders; and every refusal naming the component. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tok.h"

/* a byte-level-free BPE over a tiny alphabet: a b c, merges a b -> ab (rank
 * 0), ab c -> abc (1), b c -> bc (2) */
#define VOCAB "\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"ab\":3,\"abc\":4,\"bc\":5,\"<unk>\":6," \
              "\"<0x41>\":7,\"_\":8}"

static tok_tokenizer *load(const char *json, acc_err *err)
{
    tok_tokenizer *t = NULL;
    int rc = tok_load_mem(json, strlen(json), NULL, 0, &t, err);
    return rc == 0 ? t : NULL;
}

static void encode(tok_tokenizer *t, const char *s, int flags, tok_ids *ids)
{
    tok_encoder *e;
    acc_err err = {0};
    assert_int_equal(tok_encoder_new(t, &e, &err), 0);
    ids->n = 0;
    assert_int_equal(tok_encode(e, s, strlen(s), flags, ids, &err), 0);
    tok_encoder_free(e);
}

static void assert_ids(const tok_ids *ids, const int32_t *want, size_t n)
{
    assert_int_equal(ids->n, n);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(ids->v[i], want[i]);
}

static void test_merge_order(void **state)
{
    acc_err err = {0};
    /* merges given both ways: a string and a pair */
    tok_tokenizer *t = load("{\"model\":{\"type\":\"BPE\"," VOCAB ",\"merges\":[\"a b\",[\"ab\",\"c\"],\"b c\"],"
                            "\"unk_token\":\"<unk>\",\"fuse_unk\":true}}", &err);
    assert_non_null(t);
    tok_ids ids = {0};
    encode(t, "abc", 0, &ids); /* a b first (rank 0), then ab c */
    assert_ids(&ids, (int32_t[]){4}, 1);
    encode(t, "bcab", 0, &ids);
    assert_ids(&ids, (int32_t[]){5, 3}, 2);
    encode(t, "axyzb", 0, &ids); /* unknowns fused into one <unk> */
    assert_ids(&ids, (int32_t[]){0, 6, 1}, 3);
    char *s;
    size_t n;
    assert_int_equal(tok_decode(t, ids.v, ids.n, 0, &s, &n, &err), 0);
    assert_string_equal(s, "a <unk> b"); /* no decoder: tokens joined by spaces */
    free(s);
    tok_ids_free(&ids);
    tok_free(t);
}

static void test_byte_fallback_and_added(void **state)
{
    acc_err err = {0};
    tok_tokenizer *t = load(
        "{\"added_tokens\":[{\"id\":9,\"content\":\"<s>\",\"special\":true},"
        "{\"id\":10,\"content\":\"<ss>\",\"special\":true,\"rstrip\":true}],"
        "\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"_\"},"
        "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
        "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[9],\"tokens\":[\"<s>\"]}}},"
        "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"_\"},\"content\":\" \"},"
        "{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"}]},"
        "\"model\":{\"type\":\"BPE\"," VOCAB ",\"merges\":[\"a b\"],\"byte_fallback\":true,\"unk_token\":\"<unk>\"}}",
        &err);
    assert_non_null(t);
    tok_ids ids = {0};
    /* "A" is not in the vocabulary: its byte token; <ss> is the longest
     * match and swallows the spaces after it; <s> from the template */
    encode(t, "ab A<ss>  a<s>", TOK_ADD_SPECIAL, &ids);
    assert_ids(&ids, (int32_t[]){9, 3, 8, 7, 10, 0, 9}, 7);
    char *s;
    size_t n;
    assert_int_equal(tok_decode(t, ids.v, ids.n, 1, &s, &n, &err), 0);
    assert_string_equal(s, "ab Aa"); /* specials skipped */
    free(s);
    assert_int_equal(tok_is_special(t, 10), 1);
    assert_int_equal(tok_token_to_id(t, "<ss>", 4), 10);
    tok_ids_free(&ids);
    tok_free(t);
}

/* Each refusal names where the unsupported or bad thing is. */
static void expect_refused(const char *json, const char *needle)
{
    acc_err err = {0};
    tok_tokenizer *t = load(json, &err);
    assert_null(t);
    assert_int_equal(err.code, ACC_EINVAL);
    if (strstr(err.msg, needle) == NULL)
        fail_msg("message '%s' does not name '%s'", err.msg, needle);
}

static void test_refusals(void **state)
{
    expect_refused("{\"model\":{\"type\":\"WordPiece\"," VOCAB "}}", "model.type: model type WordPiece");
    expect_refused("{\"model\":{\"type\":\"BPE\"," VOCAB ",\"merges\":[\"a z\"]}}", "model.merges[0]");
    expect_refused("{\"model\":{\"type\":\"BPE\"," VOCAB ",\"merges\":[\"a b c\"]}}", "model.merges[0]");
    expect_refused("{\"model\":{\"type\":\"BPE\"," VOCAB ",\"merges\":[],\"dropout\":0.1}}", "BPE dropout");
    expect_refused("{\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},{\"type\":\"BertNormalizer\"}]},"
                   "\"model\":{\"type\":\"BPE\"," VOCAB ",\"merges\":[]}}",
                   "normalizer.normalizers[1].type: normalizer type BertNormalizer");
    expect_refused("{\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Punctuation\"}]},"
                   "\"model\":{\"type\":\"BPE\"," VOCAB ",\"merges\":[]}}",
                   "pre_tokenizer.pretokenizers[0].type: pre-tokenizer type Punctuation");
    expect_refused("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(a\"},\"behavior\":\"Isolated\"},"
                   "\"model\":{\"type\":\"BPE\"," VOCAB ",\"merges\":[]}}", "pre_tokenizer.pattern: regex error");
    expect_refused("{\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"frobnicate\":true},"
                   "\"model\":{\"type\":\"BPE\"," VOCAB ",\"merges\":[]}}", "option \"frobnicate\"");
    expect_refused("{\"decoder\":{\"type\":\"WordPiece\"},\"model\":{\"type\":\"BPE\"," VOCAB ",\"merges\":[]}}",
                   "decoder.type: decoder type WordPiece");
    expect_refused("{\"post_processor\":{\"type\":\"BertProcessing\"},\"model\":{\"type\":\"BPE\"," VOCAB ",\"merges\":[]}}",
                   "post_processor.type: post-processor type BertProcessing");
    expect_refused("{\"added_tokens\":[{\"id\":9,\"content\":\"x\",\"single_word\":true}],"
                   "\"model\":{\"type\":\"BPE\"," VOCAB ",\"merges\":[]}}", "added_tokens[0]: single_word");
    /* a post-processor id past the vocabulary (fuzz_tok found it): the
     * encoder would emit an id the model has no embedding row for */
    expect_refused("{\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
                   "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[99],\"tokens\":[\"<s>\"]}}},"
                   "\"model\":{\"type\":\"BPE\"," VOCAB ",\"merges\":[]}}",
                   "post_processor.single[0]: ids must be ids of the vocabulary");
    expect_refused("{\"model\":", "tokenizer.json");
}

static void test_invalid_utf8(void **state)
{
    acc_err err = {0};
    tok_tokenizer *t = load("{\"model\":{\"type\":\"BPE\"," VOCAB ",\"merges\":[]}}", &err);
    assert_non_null(t);
    tok_encoder *e;
    assert_int_equal(tok_encoder_new(t, &e, &err), 0);
    tok_ids ids = {0};
    assert_int_equal(tok_encode(e, "ab\xff", 3, 0, &ids, &err), ACC_EINVAL);
    assert_non_null(strstr(err.msg, "byte 2"));
    char *s;
    size_t n;
    assert_int_equal(tok_decode(t, (int32_t[]){99}, 1, 0, &s, &n, &err), ACC_EINVAL);
    tok_encoder_free(e);
    tok_free(t);
}

/* Encoders on several threads share the tokenizer and agree. */
typedef struct th_arg {
    tok_tokenizer *t;
    tok_ids ids;
} th_arg;

static void *th_main(void *p)
{
    th_arg *a = p;
    char text[4096];
    for (size_t i = 0; i + 1 < sizeof text; i++)
        text[i] = "abcab c"[i % 7];
    text[sizeof text - 1] = 0;
    tok_encoder *e;
    acc_err err = {0};
    if (tok_encoder_new(a->t, &e, &err) == 0) {
        for (int r = 0; r < 20; r++) {
            a->ids.n = 0;
            tok_encode(e, text, strlen(text), 0, &a->ids, &err);
        }
        tok_encoder_free(e);
    }
    return NULL;
}

static void test_threads(void **state)
{
    acc_err err = {0};
    tok_tokenizer *t = load("{\"pre_tokenizer\":{\"type\":\"WhitespaceSplit\"},\"model\":{\"type\":\"BPE\"," VOCAB
                            ",\"merges\":[\"a b\",\"ab c\",\"b c\"]}}", &err);
    assert_non_null(t);
    th_arg a[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (th_arg){t, {0}};
        pthread_create(&th[i], NULL, th_main, &a[i]);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    assert_true(a[0].ids.n > 0);
    for (int i = 1; i < 4; i++) {
        assert_int_equal(a[i].ids.n, a[0].ids.n);
        assert_memory_equal(a[i].ids.v, a[0].ids.v, a[0].ids.n * sizeof(int32_t));
    }
    for (int i = 0; i < 4; i++)
        tok_ids_free(&a[i].ids);
    tok_free(t);
}

/* A tokenizer directory (issue 16, defects 2 and 3): a file that is not
 * JSON is reported by line and column, never by its bytes; a symlink out of
 * the roots and a FIFO are refused (without blocking). */
static void put_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void expect_dir_refused(const char *roots, const char *dir, const char *want)
{
    tok_tokenizer *t = NULL;
    acc_err err = {0};
    assert_int_equal(roots ? tok_load_under(roots, dir, "data.tokenizer", &t, &err) : tok_load_dir(dir, &t, &err),
                     ACC_EINVAL);
    assert_null(t);
    if (strstr(err.msg, want) == NULL)
        fail_msg("error \"%s\" does not say \"%s\"", err.msg, want);
    if (strstr(err.msg, "root:") != NULL || strstr(err.msg, "SECRET") != NULL)
        fail_msg("error \"%s\" quotes the file", err.msg);
}

static void test_dir_files(void **state)
{
    char top[64] = "/tmp/accumd-tok-XXXXXX", data[128], dir[160], path[256], secret[160];
    assert_non_null(mkdtemp(top));
    snprintf(data, sizeof data, "%s/data", top);
    snprintf(dir, sizeof dir, "%s/tok", data);
    snprintf(secret, sizeof secret, "%s/passwd", top);
    assert_int_equal(mkdir(data, 0750), 0);
    assert_int_equal(mkdir(dir, 0750), 0);
    put_file(secret, "root:x:0:0:SECRET-CONTENT:/root:/bin/bash\n");
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    put_file(path, "root:x:0:0:SECRET-CONTENT:/root:/bin/bash\n");
    expect_dir_refused(NULL, dir, "tok/tokenizer.json: not valid JSON (line 1, column");
    put_file(path, "{\"model\":{\"type\":\"BPE\"," VOCAB ",\"merges\":[]}}");
    char cfg[256];
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    put_file(cfg, "root:x:0:0:SECRET-CONTENT:/root:/bin/bash\n");
    expect_dir_refused(NULL, dir, "tok/tokenizer_config.json: not valid JSON (line 1, column");
    unlink(cfg);
    tok_tokenizer *t = NULL;
    acc_err err = {0};
    assert_int_equal(tok_load_under(data, dir, "data.tokenizer", &t, &err), 0);
    tok_free(t);
    /* symlinks out of the root, either file */
    assert_int_equal(symlink(secret, cfg), 0);
    expect_dir_refused(data, dir, "outside the allowed roots");
    unlink(cfg);
    unlink(path);
    assert_int_equal(symlink(secret, path), 0);
    expect_dir_refused(data, dir, "outside the allowed roots");
    unlink(path);
    /* a FIFO: refused, never waited on */
    assert_int_equal(mkfifo(path, 0640), 0);
    expect_dir_refused(NULL, dir, "FIFO");
    unlink(path);
    expect_dir_refused(NULL, dir, "tokenizer.json is missing");
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", top);
    assert_int_equal(system(cmd), 0);
}

/* Issue 25: an untrusted tokenizer's work is bounded. Each bound stops the
 * encode with ACC_EINVAL naming "tokenizer" and the limit. */
#define AB_MODEL "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"aa\":2},\"merges\":[\"a a\"]}"

static int encode_err(tok_tokenizer *t, const char *s, size_t n, const tok_limits *lim, acc_err *err)
{
    tok_encoder *e;
    assert_int_equal(tok_encoder_new(t, &e, err), 0);
    if (lim != NULL)
        tok_encoder_set_limits(e, lim);
    tok_ids ids = {0};
    int rc = tok_encode(e, s, n, 0, &ids, err);
    tok_ids_free(&ids);
    tok_encoder_free(e);
    return rc;
}

static void expect_bounded(const char *json, const char *text, size_t n, const tok_limits *lim, const char *what)
{
    acc_err err = {0};
    tok_tokenizer *t = load(json, &err);
    if (t == NULL)
        fail_msg("load: %s", err.msg);
    int rc = encode_err(t, text, n, lim, &err);
    tok_free(t);
    if (rc == 0)
        fail_msg("encoded; expected a refusal with \"%s\"", what);
    assert_int_equal(rc, ACC_EINVAL);
    assert_string_equal(err.field, "tokenizer");
    if (strstr(err.msg, what) == NULL)
        fail_msg("error \"%s\" lacks \"%s\"", err.msg, what);
}

static void test_budget(void **state)
{
    (void)state;
    /* 40 x Replace "a" -> "aa": 2^40 bytes asked; stops at 64 x the input + 1 MiB */
    char json[8192];
    size_t k = (size_t)snprintf(json, sizeof json, "{\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[");
    for (int i = 0; i < 40; i++)
        k += (size_t)snprintf(json + k, sizeof json - k, "%s{\"type\":\"Replace\",\"pattern\":{\"String\":\"a\"},"
                              "\"content\":\"aa\"}", i ? "," : "");
    snprintf(json + k, sizeof json - k, "]}," AB_MODEL "}");
    expect_bounded(json, "a", 1, NULL, "output exceeds its bound of 1048640 bytes");
    /* a regex that backtracks without end: PCRE2's match limit, never "internal" */
    const char *star = "{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(a*)*b|a\"},"
                       "\"behavior\":\"Isolated\"}," AB_MODEL "}";
    char as[20001];
    memset(as, 'a', 20000);
    as[20000] = 0;
    expect_bounded(star, as, 40, NULL, "match limit");
    /* defect 2's regex: each match is bounded, 20,000 of them are not: the time limit */
    const char *alt = "{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?:a|aa){1,18}b|a\"},"
                      "\"behavior\":\"Isolated\"}," AB_MODEL "}";
    tok_limits lim;
    tok_limits_default(&lim);
    lim.time_limit_ms = 200;
    expect_bounded(alt, as, 20000, &lim, "limit");
    /* the bounds leave ordinary work alone: 64 x is room for a real normalizer */
    acc_err err = {0};
    tok_tokenizer *t = load(json, &err);
    assert_non_null(t);
    assert_int_equal(encode_err(t, "bbbb", 4, NULL, &err), 0);
    tok_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merge_order),
        cmocka_unit_test(test_byte_fallback_and_added),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_dir_files),
        cmocka_unit_test(test_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
