/* SFT data: the JSONL formats prepared by data_prep and trained through the
 * trainer, on a byte-level tokenizer (one token per byte, so the bytes of
 * the rendered text are the tokens and every check is independent of the
 * code under test's arithmetic):
 *   - chat, train_on "assistant": every byte of each assistant content
 *     carries loss, no byte of a system or user content does, and padding
 *     never does; train_on "all": every token of the sample;
 *   - prompt_completion: the completion and EOS carry loss, the prompt not;
 *     text_jsonl: every token, BOS first, EOS last;
 *   - overlong samples: "truncate" cuts them to seq_len+1, "drop" leaves
 *     them out, both counted; a sample without a target is left out;
 *   - the cache: a second load reads it (same arrays, nothing tokenized: no
 *     "tokenize" progress), a changed file or option misses it, a truncated
 *     cache file is never used;
 *   - a bad line at submit (prep_validate) and past the submit-time scan
 *     (prep_load) is ACC_EINVAL naming data.train and file:line;
 *   - packing: a window holds whole records, positions restart at 0 at
 *     each, no target crosses a boundary; a packed window's logits equal
 *     each document's logits run alone (1e-5), and differ without the
 *     positions (the test can fail);
 *   - Parquet shards of an independent writer give the samples
 *     of the same records as JSONL, ShareGPT conversations those of the
 *     same messages; lists are read in order, globs in name order;
 *     text_lines; data.format read off the data; a damaged shard named;
 *   - split invariance on masked chat data whose micro-batches hold unequal
 *     numbers of targets, padded and packed: (m, a, w) = (8,1,1), (1,8,1),
 *     (2,2,2) give the same losses and final weights within 1e-5
 *     (invariant 1, docs/invariants.md). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data.h"
#include "data_prep.h"
#include "engine_fixture.h"
#include "fsutil.h"
#include "kern_device.h"
#include "mem_plan.h"
#include "model.h"
#include "model_llama.h"
#include "trainer_run.h"

static char root[64], tokdir[128], cache[128];

/* ids 0 <s>, 1 </s>, 2..257 the ByteLevel characters of bytes 0..255 */
static const char tok_head[] =
    "{\"version\":\"1.0\",\"added_tokens\":["
    "{\"id\":0,\"content\":\"<s>\",\"special\":true,\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false},"
    "{\"id\":1,\"content\":\"</s>\",\"special\":true,\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false}],"
    "\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true},"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],"
    "\"pair\":[{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[0],\"tokens\":[\"<s>\"]}}},"
    "\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true},"
    "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"continuing_subword_prefix\":null,"
    "\"end_of_word_suffix\":null,\"fuse_unk\":false,\"byte_fallback\":false,\"ignore_merges\":false,\"vocab\":{";

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void write_tokenizer(void)
{
    char path[256];
    snprintf(path, sizeof path, "%s/tokenizer.json", tokdir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(tok_head, f);
    for (int b = 0; b < 256; b++) {
        int cp = b; /* GPT-2's bytes_to_unicode */
        if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174)))
            cp = 256 + (b < 33 ? b : b <= 160 ? b - 127 + 33 : 33 + 34 + (b - 173));
        fputs(b ? ",\"" : "\"", f);
        if (cp == '"' || cp == '\\')
            fprintf(f, "\\%c", cp);
        else if (cp < 0x80)
            fputc(cp, f);
        else
            fprintf(f, "%c%c", 0xC0 | (cp >> 6), 0x80 | (cp & 0x3F));
        fprintf(f, "\":%d", b + 2);
    }
    fputs("},\"merges\":[]}}", f);
    fclose(f);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", tokdir);
    write_file(path, "{\"bos_token\":\"<s>\",\"eos_token\":\"</s>\",\"add_bos_token\":true}");
}

static int setup(void **state)
{
    (void)state;
    snprintf(root, sizeof root, "/tmp/accumd-sft-XXXXXX");
    if (mkdtemp(root) == NULL)
        return -1;
    snprintf(tokdir, sizeof tokdir, "%s/tok", root);
    snprintf(cache, sizeof cache, "%s/cache", root);
    if (fsu_mkdir_p(tokdir, 0750, NULL) != 0)
        return -1;
    write_tokenizer();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return fsu_rm_rf(root, NULL);
}

static void sft_spec(train_cfg *s, const char *file, spec_data_format fmt, int seq_len)
{
    fx_tiny_spec(s, file, 8, 8, 1, 1);
    s->data.format = fmt;
    s->model.seq_len = seq_len;
    s->model.vocab_size = 258;
    s->model.padded_vocab_size = 264;
    snprintf(s->data.tokenizer, sizeof s->data.tokenizer, "%s", tokdir);
    snprintf(s->data.chat_template, sizeof s->data.chat_template, "chatml");
    snprintf(s->data.cache_dir, sizeof s->data.cache_dir, "%s", cache);
}

typedef struct progress_log {
    int tokenize, cache;
    uint64_t last_done, last_total;
} progress_log;

static void on_progress(void *ctx, const char *stage, uint64_t done, uint64_t total)
{
    progress_log *p = ctx;
    p->tokenize += !strcmp(stage, "tokenize");
    p->cache += !strcmp(stage, "cache");
    p->last_done = done;
    p->last_total = total;
}

/* The data layer's part of a test's train_cfg (data_prep.h reads a data_cfg). */
static data_cfg *data_of(const train_cfg *s, data_cfg *d)
{
    train_cfg_data(s, d);
    return d;
}
#define DATA_OF(s) data_of((s), &(data_cfg){.data_roots = {0}})

static int load(const train_cfg *s, prep_samples *ps, progress_log *pl, acc_err *err)
{
    memset(pl, 0, sizeof *pl);
    prep_opts o = {.spec = DATA_OF(s), .path = s->data.train, .field = "data.train", .threads = 3,
                   .progress = on_progress, .ctx = pl};
    return prep_load(&o, ps, err);
}

static void load_ok(const train_cfg *s, prep_samples *ps, progress_log *pl)
{
    acc_err err = {0};
    int rc = load(s, ps, pl, &err);
    if (rc != 0)
        fail_msg("prep_load: %s", err.msg);
}

/* Byte b of a sample's text is token b + 2; true when the bytes of `needle`
 * are tokens [at, at + len) of the sample. */
static long find_bytes(const int32_t *ids, size_t n, const char *needle)
{
    size_t len = strlen(needle);
    for (size_t at = 0; at + len <= n; at++) {
        size_t k = 0;
        while (k < len && ids[at + k] == (unsigned char)needle[k] + 2)
            k++;
        if (k == len)
            return (long)at;
    }
    return -1;
}

static void expect_span(const prep_samples *ps, uint64_t i, const char *content, int want)
{
    const int32_t *ids = ps->ids + ps->off[i];
    size_t n = ps->off[i + 1] - ps->off[i];
    long at = find_bytes(ids, n, content);
    if (at < 0)
        fail_msg("sample %llu lacks '%s'", (unsigned long long)i, content);
    for (size_t k = 0; k < strlen(content); k++)
        if (ps->mask[ps->off[i] + (size_t)at + k] != want)
            fail_msg("sample %llu: byte %zu of '%s' has mask %d, want %d", (unsigned long long)i, k, content,
                     ps->mask[ps->off[i] + (size_t)at + k], want);
}

static const char chat_lines[] =
    "{\"messages\":[{\"role\":\"user\",\"content\":\"UUUU one\"},{\"role\":\"assistant\",\"content\":\"AAAA first\"}]}\n"
    "\n"
    "{\"id\":7,\"messages\":[{\"role\":\"system\",\"content\":\"SSSS be brief\"},{\"role\":\"user\",\"content\":\"UUUU two\"},"
    "{\"role\":\"assistant\",\"content\":\"AAAA second\"},{\"role\":\"user\",\"content\":\"UUUU more\"},"
    "{\"role\":\"assistant\",\"content\":\"AAAA more words here\"}],\"source\":\"t\"}\n"
    "{\"messages\":[{\"role\":\"user\",\"content\":\"UUUU three\"},{\"role\":\"assistant\",\"content\":\"AAAA x\"}]}";

static void test_chat_masks(void **state)
{
    (void)state;
    char file[256];
    snprintf(file, sizeof file, "%s/chat.jsonl", root);
    write_file(file, chat_lines);
    train_cfg s;
    sft_spec(&s, file, SPEC_DATA_CHAT, 256);
    s.data.cache_dir[0] = '\0';
    prep_samples ps;
    progress_log pl;
    load_ok(&s, &ps, &pl);
    assert_int_equal(ps.n, 3);
    assert_int_equal(ps.lines, 3);
    assert_true(pl.tokenize >= 2);
    assert_int_equal(pl.last_done, pl.last_total);
    static const char *const asst[] = {"AAAA first", "AAAA second", "AAAA more words here", "AAAA x"};
    static const char *const other[] = {"UUUU one", "SSSS be brief", "UUUU two", "UUUU more", "UUUU three"};
    static const int asst_of[] = {0, 1, 1, 2}, other_of[] = {0, 1, 1, 1, 2};
    for (int k = 0; k < 4; k++)
        expect_span(&ps, (uint64_t)asst_of[k], asst[k], 1);
    for (int k = 0; k < 5; k++)
        expect_span(&ps, (uint64_t)other_of[k], other[k], 0);
    /* the data source: target i is token i+1's mask; padding carries none */
    data_source *ds = NULL;
    acc_err err = {0};
    uint64_t n1 = ps.off[2] - ps.off[1];
    const uint8_t *m1 = ps.mask + ps.off[1];
    assert_int_equal(data_open_prepared(&ps, 256, 0, "data.train", &ds, &err), 0);
    int tokens[257];
    uint8_t tmask[256];
    data_sample_masked(ds, 1, tokens, tmask);
    uint64_t want = 0;
    for (int i = 0; i < 256; i++) {
        uint8_t w = (uint64_t)(i + 1) < n1 ? m1[i + 1] : 0;
        assert_int_equal(tmask[i], w);
        want += w;
        if ((uint64_t)(i + 1) >= n1)
            assert_int_equal(tokens[i + 1], 0); /* padding */
    }
    assert_int_equal(data_sample_targets(ds, 1), want);
    data_close(ds);

    s.data.train_on = SPEC_TRAIN_ALL;
    load_ok(&s, &ps, &pl);
    for (uint64_t k = 0; k < ps.ntokens; k++)
        assert_int_equal(ps.mask[k], 1);
    prep_free(&ps);
}

static void test_prompt_completion_and_text(void **state)
{
    (void)state;
    char file[256];
    snprintf(file, sizeof file, "%s/pc.jsonl", root);
    write_file(file, "{\"prompt\":\"PPPP ask\",\"completion\":\" CCCC answer\"}\n");
    train_cfg s;
    sft_spec(&s, file, SPEC_DATA_PROMPT_COMPLETION, 64);
    prep_samples ps;
    progress_log pl;
    load_ok(&s, &ps, &pl);
    assert_int_equal(ps.n, 1);
    /* <s> prompt completion </s> */
    assert_int_equal(ps.ntokens, 1 + strlen("PPPP ask") + strlen(" CCCC answer") + 1);
    assert_int_equal(ps.ids[0], 0);
    assert_int_equal(ps.ids[ps.ntokens - 1], 1);
    expect_span(&ps, 0, "PPPP ask", 0);
    expect_span(&ps, 0, " CCCC answer", 1);
    assert_int_equal(ps.mask[0], 0);
    assert_int_equal(ps.mask[ps.ntokens - 1], 1);
    prep_free(&ps);

    snprintf(file, sizeof file, "%s/t.jsonl", root);
    write_file(file, "{\"text\":\"hello\"}\n{\"text\":\"a\"}\n");
    sft_spec(&s, file, SPEC_DATA_TEXT_JSONL, 64);
    load_ok(&s, &ps, &pl);
    assert_int_equal(ps.n, 2);
    assert_int_equal(ps.ntokens, 7 + 3);
    assert_int_equal(ps.ids[0], 0);
    assert_int_equal(ps.ids[6], 1);
    expect_span(&ps, 0, "hello", 1);
    prep_free(&ps);
}

static void test_overlong(void **state)
{
    (void)state;
    char file[256];
    snprintf(file, sizeof file, "%s/long.jsonl", root);
    write_file(file,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"ok\"}]}\n"
               "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\""
               "a very long answer that does not fit in the window of this test at all\"}]}\n"
               "{\"messages\":[{\"role\":\"user\",\"content\":\"a very long question that leaves no room for the "
               "answer in the window of this test\"},{\"role\":\"assistant\",\"content\":\"ok\"}]}\n");
    train_cfg s;
    sft_spec(&s, file, SPEC_DATA_CHAT, 99);
    prep_samples ps;
    progress_log pl;
    load_ok(&s, &ps, &pl);
    /* truncate: the second cut to 100 tokens, the third cut before any target */
    assert_int_equal(ps.n, 2);
    assert_int_equal(ps.truncated, 2);
    assert_int_equal(ps.no_target, 1);
    assert_int_equal(ps.off[2] - ps.off[1], 100);
    prep_free(&ps);
    s.data.overlong = SPEC_OVERLONG_DROP;
    load_ok(&s, &ps, &pl);
    assert_int_equal(ps.n, 1);
    assert_int_equal(ps.dropped, 2);
    assert_int_equal(ps.truncated, 0);
    prep_free(&ps);
}

static void test_cache(void **state)
{
    (void)state;
    char file[256];
    snprintf(file, sizeof file, "%s/cached.jsonl", root);
    write_file(file, chat_lines);
    train_cfg s;
    sft_spec(&s, file, SPEC_DATA_CHAT, 128);
    prep_samples a, b;
    progress_log pa, pb;
    load_ok(&s, &a, &pa);
    assert_int_equal(a.from_cache, 0);
    assert_true(pa.tokenize >= 2);
    load_ok(&s, &b, &pb);
    assert_int_equal(b.from_cache, 1);
    assert_int_equal(pb.tokenize, 0); /* nothing tokenized */
    assert_int_equal(pb.cache, 1);
    assert_string_equal(a.key, b.key);
    assert_int_equal(a.n, b.n);
    assert_int_equal(a.ntokens, b.ntokens);
    assert_memory_equal(a.off, b.off, (a.n + 1) * sizeof *a.off);
    assert_memory_equal(a.ids, b.ids, a.ntokens * sizeof *a.ids);
    assert_memory_equal(a.mask, b.mask, a.ntokens);
    prep_free(&b);

    /* another option: another key */
    s.data.train_on = SPEC_TRAIN_ALL;
    load_ok(&s, &b, &pb);
    assert_int_equal(b.from_cache, 0);
    assert_string_not_equal(a.key, b.key);
    prep_free(&b);
    s.data.train_on = SPEC_TRAIN_ASSISTANT;

    /* a partial cache file is never used (and is replaced) */
    char cf[512];
    snprintf(cf, sizeof cf, "%s/%s/samples.bin", cache, a.key);
    assert_int_equal(truncate(cf, 100), 0);
    load_ok(&s, &b, &pb);
    assert_int_equal(b.from_cache, 0);
    assert_true(pb.tokenize >= 2);
    prep_free(&b);
    load_ok(&s, &b, &pb);
    assert_int_equal(b.from_cache, 1);
    prep_free(&b);

    /* a changed file: tokenized again */
    FILE *f = fopen(file, "a");
    fputs("\n{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"r\"}]}\n", f);
    fclose(f);
    load_ok(&s, &b, &pb);
    assert_int_equal(b.from_cache, 0);
    assert_int_equal(b.n, a.n + 1);
    prep_free(&b);
    prep_free(&a);
}

static void test_bad_lines(void **state)
{
    (void)state;
    char file[256];
    snprintf(file, sizeof file, "%s/bad.jsonl", root);
    write_file(file, "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"r\"}]}\n\n"
                     "{\"messages\":[{\"role\":\"user\"}]}\n");
    train_cfg s;
    sft_spec(&s, file, SPEC_DATA_CHAT, 64);
    acc_err err = {0};
    assert_int_equal(prep_validate(DATA_OF(&s), &err), ACC_EINVAL);
    assert_string_equal(err.field, "data.train");
    assert_non_null(strstr(err.msg, "bad.jsonl:3: messages[0].content"));
    /* past the bounded scan: found while preparing, with its line */
    snprintf(file, sizeof file, "%s/late.jsonl", root);
    FILE *f = fopen(file, "w");
    for (int i = 0; i < PREP_CHECK_LINES + 20; i++)
        fputs("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"r\"}]}\n", f);
    fputs("{\"messages\":[]}\n", f);
    fclose(f);
    sft_spec(&s, file, SPEC_DATA_CHAT, 64);
    memset(&err, 0, sizeof err);
    assert_int_equal(prep_validate(DATA_OF(&s), &err), 0);
    prep_samples ps;
    progress_log pl;
    assert_int_equal(load(&s, &ps, &pl, &err), ACC_EINVAL);
    assert_string_equal(err.field, "data.train");
    char want[64];
    snprintf(want, sizeof want, "late.jsonl:%d: messages: an empty conversation", PREP_CHECK_LINES + 21);
    if (strstr(err.msg, want) == NULL)
        fail_msg("message '%s' lacks '%s'", err.msg, want);
    /* the template name and the tokenizer are checked too */
    sft_spec(&s, file, SPEC_DATA_CHAT, 64);
    snprintf(s.data.chat_template, sizeof s.data.chat_template, "vicuna");
    assert_int_equal(prep_validate(DATA_OF(&s), &err), ACC_EINVAL);
    assert_string_equal(err.field, "data.chat_template");
    sft_spec(&s, file, SPEC_DATA_CHAT, 64);
    s.model.vocab_size = 100;
    assert_int_equal(prep_validate(DATA_OF(&s), &err), ACC_EINVAL);
    assert_string_equal(err.field, "data.tokenizer");
}

/* Issue 16, defects 2 and 3 for the JSONL formats: data.train is opened
 * through safepath.h. A FIFO is refused without blocking (before, open()
 * waited for a writer: the watchdog turns that hang into a failure), and a
 * symlink out of the data roots is refused without a byte of its target in
 * the message, at submit (prep_validate) and when preparing (prep_load). */
static void test_special_data_files(void **state)
{
    (void)state;
    char fifo[400], secret[256], link[400], data[256];
    snprintf(data, sizeof data, "%s/data", root);
    assert_int_equal(fsu_mkdir_p(data, 0750, NULL), 0);
    snprintf(fifo, sizeof fifo, "%s/pipe.jsonl", data);
    assert_int_equal(mkfifo(fifo, 0640), 0);
    snprintf(secret, sizeof secret, "%s/secret.txt", root);
    write_file(secret, "root:x:0:0:SECRET-CONTENT:/root:/bin/bash\n");
    snprintf(link, sizeof link, "%s/link.jsonl", data);
    assert_int_equal(symlink(secret, link), 0);
    alarm(60); /* a watchdog, not a timing: a blocked open never returns */
    for (int k = 0; k < 2; k++) {
        const char *file = k ? link : fifo;
        train_cfg s;
        sft_spec(&s, file, SPEC_DATA_CHAT, 64);
        snprintf(s.data_roots, sizeof s.data_roots, "%s:%s", data, root); /* the tokenizer is in root/tok */
        if (k) /* the secret lies in root: only data is a root here */
            snprintf(s.data_roots, sizeof s.data_roots, "%s:%s", data, tokdir);
        acc_err err = {0};
        assert_int_equal(prep_validate(DATA_OF(&s), &err), ACC_EINVAL);
        assert_string_equal(err.field, "data.train");
        assert_non_null(strstr(err.msg, k ? "outside the allowed roots" : "FIFO"));
        assert_null(strstr(err.msg, "root:"));
        prep_samples ps;
        progress_log pl;
        memset(&err, 0, sizeof err);
        assert_int_equal(load(&s, &ps, &pl, &err), ACC_EINVAL);
        assert_string_equal(err.field, "data.train");
        assert_non_null(strstr(err.msg, k ? "outside the allowed roots" : "FIFO"));
    }
    alarm(0);
    unlink(fifo);
    unlink(link);
}

static void test_packed_windows(void **state)
{
    (void)state;
    char file[256];
    snprintf(file, sizeof file, "%s/pack.jsonl", root);
    write_file(file, "{\"text\":\"abcdefghij\"}\n{\"text\":\"klmnopq\"}\n{\"text\":\"rstu\"}\n"
                     "{\"text\":\"vwxyz0123456789ABCDEF\"}\n");
    train_cfg s;
    sft_spec(&s, file, SPEC_DATA_TEXT_JSONL, 24); /* windows of 25 tokens */
    s.data.packing = true;
    prep_samples ps;
    progress_log pl;
    load_ok(&s, &ps, &pl);
    /* records of 12, 9, 6 and 23 tokens (<s> text </s>); windows of 25:
     * [12 + 9] (6 more would make 27), [6], [23] */
    assert_int_equal(ps.n, 4);
    uint64_t len[4];
    for (int i = 0; i < 4; i++)
        len[i] = ps.off[i + 1] - ps.off[i];
    assert_int_equal(len[0], 12);
    assert_int_equal(len[1], 9);
    assert_int_equal(len[2], 6);
    assert_int_equal(len[3], 23);
    data_source *ds = NULL;
    acc_err err = {0};
    assert_int_equal(data_open_prepared(&ps, 24, 1, "data.train", &ds, &err), 0);
    assert_true(data_is_packed(ds));
    assert_int_equal(data_num_samples(ds), 3); /* [0,1] [2] [3] */
    int tokens[25], pos[24];
    uint8_t tm[24];
    data_sample_masked(ds, 0, tokens, tm);
    data_sample_pos(ds, 0, pos);
    for (int i = 0; i < 24; i++) {
        int want_pos = i < 12 ? i : i < 21 ? i - 12 : i - 21;
        assert_int_equal(pos[i], want_pos);
        /* targets within record 0 (1..11) and record 1 (13..20); none at 11 (-> 12) */
        int want = (i < 11) || (i >= 12 && i < 20);
        if (tm[i] != want)
            fail_msg("window 0 target %d: mask %d, want %d", i, tm[i], want);
    }
    assert_int_equal(tokens[12], 0); /* record 1 starts with <s> */
    assert_int_equal(data_sample_targets(ds, 0), 11 + 8);
    assert_int_equal(data_sample_targets(ds, 2), 22);
    data_close(ds);
}

/* A window holding three documents: logits equal each document run alone. */
static void test_packed_logits(void **state)
{
    (void)state;
    enum { T = 20, D0 = 6, D1 = 9, D2 = 4 };
    train_cfg s;
    fx_tiny_spec(&s, "unused", 1, 1, 1, 1);
    snprintf(s.model.arch, sizeof s.model.arch, "llama");
    s.model.seq_len = T;
    s.model.n_kv_head = 1;
    s.model.intermediate_size = 48;
    model_config cfg;
    acc_err err = {0};
    assert_int_equal(plan_model_config(&s, &cfg, &err), 0);
    kern_device_info info;
    fx_devices(&info, 1, 1ull << 30);
    kern_device *d;
    model *m;
    assert_int_equal(kern_device_open(&info, 1, &d, &err), 0);
    assert_int_equal(model_create(d, &cfg, 1, T, &m, &err), 0);
    assert_int_equal(model_init_seed(m, 11, &err), 0);
    int tok[T], tgt[T], pos[T], len[3] = {D0, D1, D2};
    float w[T];
    for (int t = 0; t < T; t++) {
        tok[t] = (t * 37 + 5) % 256;
        tgt[t] = (t * 11 + 3) % 256;
        w[t] = 1.0f;
    }
    for (int t = 0, doc = 0, at = 0; t < T; t++) {
        if (doc < 3 && t - at == len[doc])
            at = t, doc++;
        pos[t] = t - at; /* the padding after D2 counts on as a document of its own */
    }
    size_t V = (size_t)cfg.padded_vocab_size;
    float *packed = malloc((size_t)T * V * sizeof(float)), *alone = malloc((size_t)T * V * sizeof(float));
    assert_non_null(packed);
    assert_non_null(alone);
    double loss;
    m->positions = pos;
    model_forward(m, tok, tgt, w, 1, 0, &loss);
    d->ops->download(d, packed, model_llama_logits(m), (size_t)T * V * sizeof(float));
    double worst = 0, unpacked_gap = 0;
    for (int doc = 0, at = 0; doc < 3; at += len[doc], doc++) {
        int one[T], ot[T];
        for (int t = 0; t < T; t++) {
            one[t] = t < len[doc] ? tok[at + t] : 0;
            ot[t] = t < len[doc] ? tgt[at + t] : 0;
        }
        m->positions = NULL;
        model_forward(m, one, ot, w, 1, 0, &loss);
        d->ops->download(d, alone, model_llama_logits(m), (size_t)T * V * sizeof(float));
        for (int t = 0; t < len[doc]; t++) {
            double rel = fx_rel_diff(alone + (size_t)t * V, packed + (size_t)(at + t) * V, V);
            if (rel > worst)
                worst = rel;
        }
    }
    /* without the positions, the later documents attend across */
    float *plain = malloc((size_t)T * V * sizeof(float));
    assert_non_null(plain);
    m->positions = NULL;
    model_forward(m, tok, tgt, w, 1, 0, &loss);
    d->ops->download(d, plain, model_llama_logits(m), (size_t)T * V * sizeof(float));
    unpacked_gap = fx_rel_diff(plain + (size_t)D0 * V, packed + (size_t)D0 * V, V);
    print_message("packed vs alone: %.3g; without positions: %.3g\n", worst, unpacked_gap);
    if (worst > 1e-5)
        fail_msg("a packed window's logits differ from the documents alone by %.3g", worst);
    assert_true(unpacked_gap > 1e-3);
    free(plain);
    free(packed);
    free(alone);
    model_free(m);
    kern_device_close(d);
}

/* Conversations of different lengths: micro-batches of unequal targets. */
static void write_conversations(const char *file, int n)
{
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    for (int i = 0; i < n; i++) {
        fprintf(f, "{\"messages\":[");
        if (i % 3 == 0)
            fprintf(f, "{\"role\":\"system\",\"content\":\"be %s\"},", i % 2 ? "kind" : "short");
        fprintf(f, "{\"role\":\"user\",\"content\":\"sum %d and %d\"},", i, i * 7 % 13);
        fprintf(f, "{\"role\":\"assistant\",\"content\":\"%.*s%d\"}]}\n", i % 11, "it is clear", i + i * 7 % 13);
    }
    fclose(f);
}

static void run_sft(const train_cfg *s, double *loss, float *params, size_t cap, train_hooks *h)
{
    kern_device_info devs[4];
    fx_devices(devs, s->devices, 1ull << 30);
    memset(h, 0, sizeof *h);
    h->steps_cap = 8;
    h->step_loss = loss;
    h->final_params = params;
    h->final_params_cap = cap;
    trainer_opts o = {.spec = s, .devices = devs, .threads_per_device = 1, .checkpoint_keep = 2};
    acc_err err = {0};
    int rc = trainer_run_sync(&o, h, &err);
    if (rc != 0)
        fail_msg("run failed: %s", err.msg);
    assert_int_equal(h->steps_done, s->max_steps);
}

static void split_invariance(const char *file, int packing);

static void test_split_invariance_masked(void **state)
{
    (void)state;
    char file[256];
    snprintf(file, sizeof file, "%s/conv.jsonl", root);
    write_conversations(file, 40);
    for (int packing = 0; packing <= 1; packing++)
        split_invariance(file, packing);
}

static void split_invariance(const char *file, int packing)
{
    static const int splits[3][3] = {{8, 1, 1}, {1, 8, 1}, {2, 2, 2}};
    size_t cap = 1 << 20;
    double loss[3][8];
    float *params[3];
    train_hooks h[3];
    for (int i = 0; i < 3; i++) {
        train_cfg s;
        /* packed: windows of two or three conversations */
        sft_spec(&s, file, SPEC_DATA_CHAT, packing ? 200 : 96);
        s.data.packing = packing;
        snprintf(s.model.arch, sizeof s.model.arch, "llama");
        s.model.n_kv_head = 1;
        s.model.intermediate_size = 48;
        s.micro_batch = splits[i][0];
        s.accum_steps = splits[i][1];
        s.devices = splits[i][2];
        s.max_steps = 3;
        s.optim.lr = 3e-3;
        params[i] = calloc(cap, sizeof(float));
        assert_non_null(params[i]);
        run_sft(&s, loss[i], params[i], cap, &h[i]);
    }
    for (int i = 1; i < 3; i++) {
        for (int k = 0; k < 3; k++) {
            double rel = fabs(loss[i][k] - loss[0][k]) / fabs(loss[0][k]);
            if (rel > 1e-5)
                fail_msg("split %d step %d: loss %.9g vs %.9g", i, k, loss[i][k], loss[0][k]);
        }
        double rel = fx_rel_diff(params[0], params[i], h[0].nparams);
        if (rel > 1e-5)
            fail_msg("split %d: final weights differ by %.3g", i, rel);
    }
    print_message("masked chat losses (%s) %.6f -> %.6f, every split alike\n", packing ? "packed" : "padded",
                  loss[0][0], loss[0][2]);
    assert_true(isfinite(loss[0][0]) && loss[0][2] < loss[0][0]);
    for (int i = 0; i < 3; i++)
        free(params[i]);
}

/* ---- h-parquet: Parquet files, globs and lists, the format read off the data ---- */

static void fixture(char *dst, size_t n, const char *name)
{
    const char *src = getenv("ACCUMD_SRC");
    snprintf(dst, n, "%s/tests/parquet/fixtures/%s", src ? src : ".", name);
}

/* the same samples (ids and masks, in order) */
static void expect_same_samples(const prep_samples *a, const prep_samples *b, const char *what)
{
    if (a->n != b->n || a->ntokens != b->ntokens)
        fail_msg("%s: %llu samples / %llu tokens vs %llu / %llu", what, (unsigned long long)a->n,
                 (unsigned long long)a->ntokens, (unsigned long long)b->n, (unsigned long long)b->ntokens);
    assert_memory_equal(a->off, b->off, (size_t)(a->n + 1) * sizeof *a->off);
    assert_memory_equal(a->ids, b->ids, (size_t)a->ntokens * sizeof *a->ids);
    assert_memory_equal(a->mask, b->mask, (size_t)a->ntokens);
}

static void load_path(const char *path, spec_data_format fmt, prep_samples *ps)
{
    train_cfg s;
    progress_log pl;
    sft_spec(&s, path, fmt, 512);
    load_ok(&s, ps, &pl);
    assert_true(pl.tokenize + pl.cache > 0);
}

/* Parquet shards written by an independent writer (parquet-wasm, snappy,
 * dictionary, 4 rows a row group) give the very samples of the same
 * records as JSONL; ShareGPT's conversations the samples of the same
 * messages; a list of files is read in its order, a glob in name order. */
static void test_parquet_like_jsonl(void **state)
{
    (void)state;
    char glob[512], jsonl[512], share[512], share_jsonl[512], s0[512], s1[512], list[1100];
    fixture(glob, sizeof glob, "chat-*-of-00002.parquet");
    fixture(jsonl, sizeof jsonl, "chat.jsonl");
    fixture(share, sizeof share, "sharegpt.parquet");
    fixture(share_jsonl, sizeof share_jsonl, "sharegpt.jsonl");
    fixture(s0, sizeof s0, "chat-00000-of-00002.parquet");
    fixture(s1, sizeof s1, "chat-00001-of-00002.parquet");
    prep_samples pq, js, sp, sj, rev;
    load_path(glob, SPEC_DATA_CHAT, &pq);
    load_path(jsonl, SPEC_DATA_CHAT, &js);
    assert_int_equal(js.n, 10);
    expect_same_samples(&pq, &js, "parquet shards vs JSONL");
    load_path(share, SPEC_DATA_CHAT, &sp);
    load_path(share_jsonl, SPEC_DATA_CHAT, &sj);
    assert_int_equal(sj.n, 5);
    expect_same_samples(&sp, &sj, "ShareGPT parquet vs messages JSONL");
    /* the list "shard 1, shard 0": shard 1's rows (records 6..9) come first */
    snprintf(list, sizeof list, "%s\n%s", s1, s0);
    load_path(list, SPEC_DATA_CHAT, &rev);
    assert_int_equal(rev.n, 10);
    for (uint64_t i = 0; i < 10; i++) {
        uint64_t j = i < 4 ? i + 6 : i - 4;
        size_t len = rev.off[i + 1] - rev.off[i];
        assert_int_equal(len, js.off[j + 1] - js.off[j]);
        assert_memory_equal(rev.ids + rev.off[i], js.ids + js.off[j], len * sizeof *rev.ids);
    }
    prep_free(&pq);
    prep_free(&js);
    prep_free(&sp);
    prep_free(&sj);
    prep_free(&rev);
}

/* A glob of JSONL shards: every match, sorted by name; text_lines: one
 * sample a line of plain text, BOS + bytes + EOS, all carrying loss. */
static void test_jsonl_glob_and_text_lines(void **state)
{
    (void)state;
    char a[256], b[256], c[256], pat[256], txt[256];
    snprintf(a, sizeof a, "%s/shard-b.jsonl", root);
    snprintf(b, sizeof b, "%s/shard-a.jsonl", root);
    snprintf(c, sizeof c, "%s/shard-c.jsonl", root);
    write_file(a, "{\"text\":\"BBBB second\"}\n");
    write_file(b, "{\"text\":\"AAAA first\"}\n{\"text\":\"AAAA again\"}\n");
    write_file(c, "{\"text\":\"CCCC third\"}\n");
    snprintf(pat, sizeof pat, "%s/shard-*.jsonl", root);
    prep_samples ps;
    load_path(pat, SPEC_DATA_TEXT_JSONL, &ps);
    assert_int_equal(ps.n, 4);
    const char *want[] = {"AAAA first", "AAAA again", "BBBB second", "CCCC third"};
    for (uint64_t i = 0; i < 4; i++)
        expect_span(&ps, i, want[i], 1);
    prep_free(&ps);

    snprintf(txt, sizeof txt, "%s/plain.txt", root);
    write_file(txt, "first line of text\n\nsecond line \xc3\xa9t\xc3\xa9\r\nthird\n");
    load_path(txt, SPEC_DATA_TEXT_LINES, &ps);
    assert_int_equal(ps.n, 3);
    expect_span(&ps, 1, "second line \xc3\xa9t\xc3\xa9", 1);
    assert_int_equal(ps.off[1] - ps.off[0], 1 + strlen("first line of text") + 1);
    assert_int_equal(ps.ids[0], 0);               /* BOS */
    assert_int_equal(ps.ids[ps.off[1] - 1], 1);   /* EOS */
    prep_free(&ps);
}

/* data.format absent: read off the first file. */
static void test_infer_format(void **state)
{
    (void)state;
    struct {
        const char *name, *text; /* a fixture when text is NULL */
        bool tokenizer;
        int want; /* -1: refused */
    } cases[] = {
        {"chat-00000-of-00002.parquet", NULL, true, SPEC_DATA_CHAT},
        {"sharegpt.parquet", NULL, true, SPEC_DATA_CHAT},
        {"chat.jsonl", NULL, true, SPEC_DATA_CHAT},
        {"pc.jsonl", "\n{\"prompt\":\"p\",\"completion\":\"c\"}\n", true, SPEC_DATA_PROMPT_COMPLETION},
        {"t.jsonl", "{\"text\":\"t\",\"meta\":1}\n", true, SPEC_DATA_TEXT_JSONL},
        {"sg.jsonl", "{\"conversations\":[{\"from\":\"human\",\"value\":\"x\"}]}\n", true, SPEC_DATA_CHAT},
        {"plain.txt", "just words\nmore words\n", true, SPEC_DATA_TEXT_LINES},
        {"plain2.txt", "just words\nmore words\n", false, SPEC_DATA_TEXT},
        {"other.jsonl", "{\"question\":\"q\",\"answer\":\"a\"}\n", true, -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[512];
        if (cases[i].text == NULL) {
            fixture(path, sizeof path, cases[i].name);
        } else {
            snprintf(path, sizeof path, "%s/%s", root, cases[i].name);
            write_file(path, cases[i].text);
        }
        spec_data_format f = SPEC_DATA_TOKENS;
        acc_err err = {0};
        int rc = prep_infer_format("", path, cases[i].tokenizer, &f, &err);
        if (cases[i].want < 0) {
            assert_int_equal(rc, ACC_EINVAL);
            assert_string_equal(err.field, "data.format");
            assert_non_null(strstr(err.msg, "other.jsonl"));
        } else if (rc != 0 || (int)f != cases[i].want) {
            fail_msg("%s: rc %d (%s), format %d, want %d", cases[i].name, rc, err.msg, (int)f, cases[i].want);
        }
    }
}

/* A damaged Parquet shard: 400-style ACC_EINVAL naming data.train and the
 * file, at submit (prep_validate reads the footer) and when preparing. */
static void test_parquet_damaged(void **state)
{
    (void)state;
    char src[512], bad[256];
    fixture(src, sizeof src, "chat-00000-of-00002.parquet");
    snprintf(bad, sizeof bad, "%s/bad.parquet", root);
    FILE *in = fopen(src, "rb"), *out = fopen(bad, "wb");
    assert_non_null(in);
    assert_non_null(out);
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf, in);
    assert_true(n > 1000);
    memset(buf + 4, 0xff, 900); /* the pages of the first columns: id's and messages' */
    fwrite(buf, 1, n, out);
    fclose(in);
    fclose(out);
    train_cfg s;
    sft_spec(&s, bad, SPEC_DATA_CHAT, 512);
    acc_err err = {0};
    assert_int_equal(prep_validate(DATA_OF(&s), &err), ACC_EINVAL);
    assert_string_equal(err.field, "data.train");
    assert_non_null(strstr(err.msg, "bad.parquet: row group 0, column "));
    /* a messages column of a shape the reader leaves out is named as such */
    fixture(src, sizeof src, "nested.parquet");
    sft_spec(&s, src, SPEC_DATA_CHAT, 512);
    assert_int_equal(prep_validate(DATA_OF(&s), &err), ACC_EINVAL);
    assert_string_equal(err.field, "data.train");
    assert_non_null(strstr(err.msg, "nested.parquet: column messages: a shape other than"));
}

/* Issue 25 (h-tmpl): data preparation renders each record under the time
 * budget. A template that is slow on one record -- line 11, past the 8 the
 * submit check renders -- fails the preparation within seconds, naming the
 * record's line and the limit, instead of hanging the job. */
static void test_slow_record(void **state)
{
    (void)state;
    char path[512], file[256];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", tokdir);
    write_file(path, "{\"bos_token\":\"<s>\",\"eos_token\":\"</s>\",\"add_bos_token\":true,\"chat_template\":"
                     "\"{% for m in messages %}{% if m.content == 'slow' %}{% set s = 'ab' * 1000000 %}"
                     "{% for i in range(1000000) %}{% if s.count('a') < 0 %}x{% endif %}{% endfor %}{% endif %}"
                     "<|{{ m.role }}|>{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}\"}");
    snprintf(file, sizeof file, "%s/slow.jsonl", root);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    for (int i = 1; i <= 12; i++)
        fprintf(f, "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"%s\"}]}\n",
                i == 11 ? "slow" : "r");
    fclose(f);
    train_cfg s;
    sft_spec(&s, file, SPEC_DATA_CHAT, 64);
    snprintf(s.data.chat_template, sizeof s.data.chat_template, "auto");
    acc_err err = {0};
    if (prep_validate(DATA_OF(&s), &err) != 0) /* the first 8 records are quick */
        fail_msg("prep_validate: %s", err.msg);
    prep_samples ps;
    progress_log pl;
    assert_int_equal(load(&s, &ps, &pl, &err), ACC_EINVAL);
    assert_string_equal(err.field, "data.train");
    if (strstr(err.msg, "slow.jsonl:11:") == NULL || strstr(err.msg, "time limit of 2000 ms") == NULL)
        fail_msg("message '%s' names neither the line nor the limit", err.msg);
    write_tokenizer(); /* the other tests' tokenizer_config.json */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_masks),     cmocka_unit_test(test_prompt_completion_and_text),
        cmocka_unit_test(test_overlong),       cmocka_unit_test(test_cache),
        cmocka_unit_test(test_bad_lines),      cmocka_unit_test(test_packed_windows),
        cmocka_unit_test(test_special_data_files),
        cmocka_unit_test(test_packed_logits),  cmocka_unit_test(test_split_invariance_masked),
        /* h-parquet */
        cmocka_unit_test(test_parquet_like_jsonl), cmocka_unit_test(test_jsonl_glob_and_text_lines),
        cmocka_unit_test(test_infer_format),       cmocka_unit_test(test_parquet_damaged),
        cmocka_unit_test(test_slow_record), /* h-tmpl */
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
