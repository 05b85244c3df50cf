/* hf_hub: hub names resolved in a Hugging Face cache layout the test makes
 * (refs/main, snapshots/COMMIT/ with symlinks into ../../blobs), offline:
 * the model snapshot refs/main names, a dataset split's files by the hub's
 * conventions and by data_files, one exact glob for them, and every miss a
 * message naming where it looked and the download command. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hf_hub.h"

typedef struct fixture {
    char dir[256];
    char cache[300];
} fixture;

static void sh(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (system(cmd) != 0)
        fail_msg("command failed: %s", cmd);
}

/* A blob and the snapshot's link to it, as huggingface-cli download leaves
 * them (blob named after the commit and the path: distinct contents). */
static void blob(const fixture *f, const char *repo_dir, const char *commit, const char *rel, const char *text)
{
    sh("cd %s/%s && mkdir -p blobs snapshots/%s/$(dirname %s) && b=%.8s_$(echo %s | tr / _) && "
       "printf '%%s' '%s' > blobs/$b && "
       "ln -s $(echo %s | sed 's|[^/]*/|../|g; s|[^/]*$||')../../blobs/$b snapshots/%s/%s",
       f->cache, repo_dir, commit, rel, commit, rel, text, rel, commit, rel);
}

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/acc-hub-XXXXXX");
    if (f == NULL || mkdtemp(f->dir) == NULL)
        return -1;
    snprintf(f->cache, sizeof f->cache, "%s/hub", f->dir);
    const char *m = "models--meta-llama--Llama-2-7b-hf", *d = "datasets--allenai--tulu-3-sft-mixture";
    sh("mkdir -p %s/%s/refs %s/%s/refs", f->cache, m, f->cache, d);
    /* two snapshots: refs/main names the second */
    blob(f, m, "1111111111111111111111111111111111111111", "config.json", "{\"old\":1}");
    blob(f, m, "2222222222222222222222222222222222222222", "config.json", "{\"new\":1}");
    sh("printf 2222222222222222222222222222222222222222 > %s/%s/refs/main", f->cache, m);
    const char *c = "abcdef0123456789abcdef0123456789abcdef01";
    for (int i = 0; i < 3; i++) {
        char rel[64];
        snprintf(rel, sizeof rel, "data/train-0000%d-of-00003.parquet", i);
        blob(f, d, c, rel, "PAR1");
    }
    blob(f, d, c, "data/test-00000-of-00001.parquet", "PAR1");
    blob(f, d, c, "README.md", "# card");
    blob(f, d, c, "sft/train.jsonl", "{}");
    blob(f, d, c, "sft/validation.jsonl", "{}");
    sh("printf '%s\\n' > %s/%s/refs/main", c, f->cache, d);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    sh("rm -rf %s", f->dir);
    free(f);
    return 0;
}

static void test_repo_ids(void **state)
{
    (void)state;
    assert_true(hf_hub_is_repo_id("meta-llama/Llama-2-7b-hf"));
    assert_true(hf_hub_is_repo_id("gpt2"));
    assert_true(hf_hub_is_org_repo_id("allenai/tulu-3-sft-mixture"));
    assert_false(hf_hub_is_org_repo_id("gpt2"));
    const char *bad[] = {"", "/abs/path", "a/b/c", "../x", "a/..", "a/.hidden", "a b/c", "a/-x", "org/", "/x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (hf_hub_is_repo_id(bad[i]))
            fail_msg("'%s' taken as a repo id", bad[i]);
}

static void test_model_snapshot(void **state)
{
    fixture *f = *state;
    char dir[PATH_MAX], want[PATH_MAX], real[PATH_MAX];
    acc_err err = {0};
    assert_int_equal(hf_hub_model_dir(f->cache, "meta-llama/Llama-2-7b-hf", "model.from", dir, sizeof dir, &err), 0);
    snprintf(want, sizeof want, "%s/models--meta-llama--Llama-2-7b-hf/snapshots/2222222222222222222222222222222222222222",
             f->cache);
    assert_non_null(realpath(want, real));
    assert_string_equal(dir, real);
    /* its files are links into blobs/, inside the cache */
    char cfg[PATH_MAX + 16];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    FILE *fp = fopen(cfg, "r");
    assert_non_null(fp);
    char text[32] = "";
    assert_non_null(fgets(text, sizeof text, fp));
    fclose(fp);
    assert_string_equal(text, "{\"new\":1}");
    struct stat st;
    assert_int_equal(lstat(cfg, &st), 0);
    assert_true(S_ISLNK(st.st_mode));

    /* not in the cache: where it looked, the command that fetches it */
    assert_int_equal(hf_hub_model_dir(f->cache, "mistralai/Mistral-7B-v0.1", "model.from", dir, sizeof dir, &err),
                     ACC_EINVAL);
    assert_string_equal(err.field, "model.from");
    assert_non_null(strstr(err.msg, "models--mistralai--Mistral-7B-v0.1"));
    assert_non_null(strstr(err.msg, "huggingface-cli download mistralai/Mistral-7B-v0.1 --cache-dir"));
    /* no cache configured */
    assert_int_equal(hf_hub_model_dir("", "meta-llama/Llama-2-7b-hf", "model.from", dir, sizeof dir, &err), ACC_EINVAL);
    assert_non_null(strstr(err.msg, "hf_hub_cache"));
    /* refs/main names a snapshot that is missing (an interrupted download) */
    sh("printf 3333333333333333333333333333333333333333 > %s/models--meta-llama--Llama-2-7b-hf/refs/main", f->cache);
    assert_int_equal(hf_hub_model_dir(f->cache, "meta-llama/Llama-2-7b-hf", "model.from", dir, sizeof dir, &err),
                     ACC_EINVAL);
    assert_non_null(strstr(err.msg, "snapshots/3333333333333333333333333333333333333333"));
    /* refs/main not a commit */
    sh("printf '../../etc' > %s/models--meta-llama--Llama-2-7b-hf/refs/main", f->cache);
    assert_int_equal(hf_hub_model_dir(f->cache, "meta-llama/Llama-2-7b-hf", "model.from", dir, sizeof dir, &err),
                     ACC_EINVAL);
    /* no refs/main: two snapshots are ambiguous, one is the one */
    sh("rm %s/models--meta-llama--Llama-2-7b-hf/refs/main", f->cache);
    assert_int_equal(hf_hub_model_dir(f->cache, "meta-llama/Llama-2-7b-hf", "model.from", dir, sizeof dir, &err),
                     ACC_EINVAL);
    sh("rm -r %s/models--meta-llama--Llama-2-7b-hf/snapshots/2222222222222222222222222222222222222222", f->cache);
    assert_int_equal(hf_hub_model_dir(f->cache, "meta-llama/Llama-2-7b-hf", "model.from", dir, sizeof dir, &err), 0);
    assert_non_null(strstr(dir, "snapshots/1111111111111111111111111111111111111111"));
}

static void test_dataset_split(void **state)
{
    fixture *f = *state;
    hf_files hf;
    acc_err err = {0};
    assert_int_equal(hf_hub_dataset_files(f->cache, "allenai/tulu-3-sft-mixture", NULL, "train", NULL, "data.dataset",
                                          &hf, &err), 0);
    assert_int_equal(hf.n, 3);
    for (int i = 0; i < 3; i++) { /* in name order */
        char tail[64];
        snprintf(tail, sizeof tail, "/data/train-0000%d-of-00003.parquet", i);
        assert_non_null(strstr(hf.path[i], tail));
        assert_non_null(strstr(hf.path[i], "/snapshots/abcdef0123456789abcdef0123456789abcdef01/"));
    }
    char glob[PATH_MAX];
    assert_int_equal(hf_files_as_glob(&hf, "data.dataset", glob, sizeof glob, &err), 0);
    char want[PATH_MAX + 64];
    snprintf(want, sizeof want, "%s/data/train-0000*-of-00003.parquet", hf.snapshot);
    assert_string_equal(glob, want);
    hf_files_free(&hf);

    /* the test split: one file, itself */
    assert_int_equal(hf_hub_dataset_files(f->cache, "allenai/tulu-3-sft-mixture", "", "test", NULL, "data.dataset",
                                          &hf, &err), 0);
    assert_int_equal(hf.n, 1);
    assert_int_equal(hf_files_as_glob(&hf, "data.dataset", glob, sizeof glob, &err), 0);
    assert_string_equal(glob, hf.path[0]);
    hf_files_free(&hf);

    /* a subset directory of JSONL files */
    assert_int_equal(hf_hub_dataset_files(f->cache, "allenai/tulu-3-sft-mixture", "sft", "validation", NULL,
                                          "data.dataset", &hf, &err), 0);
    assert_int_equal(hf.n, 1);
    assert_non_null(strstr(hf.path[0], "/sft/validation.jsonl"));
    hf_files_free(&hf);

    /* data_files: a pattern of its own */
    assert_int_equal(hf_hub_dataset_files(f->cache, "allenai/tulu-3-sft-mixture", NULL, "train",
                                          "data/train-0000[01]-*.parquet", "data.dataset", &hf, &err), 0);
    assert_int_equal(hf.n, 2);
    assert_non_null(strstr(hf.path[1], "/data/train-00001-of-00003.parquet"));
    hf_files_free(&hf);

    /* misses: a split that is not there, a dataset not cached, bad names */
    assert_int_equal(hf_hub_dataset_files(f->cache, "allenai/tulu-3-sft-mixture", NULL, "validation", NULL,
                                          "data.dataset", &hf, &err), ACC_EINVAL);
    assert_string_equal(err.field, "data.dataset");
    assert_non_null(strstr(err.msg, "split 'validation'"));
    assert_non_null(strstr(err.msg, "data/validation-*"));
    assert_int_equal(hf_hub_dataset_files(f->cache, "HuggingFaceH4/ultrachat_200k", NULL, "train", NULL, "data.dataset",
                                          &hf, &err), ACC_EINVAL);
    assert_non_null(strstr(err.msg, "datasets--HuggingFaceH4--ultrachat_200k"));
    assert_non_null(strstr(err.msg, "huggingface-cli download --repo-type dataset HuggingFaceH4/ultrachat_200k"));
    assert_int_equal(hf_hub_dataset_files(f->cache, "allenai/tulu-3-sft-mixture", "../x", "train", NULL,
                                          "data.dataset", &hf, &err), ACC_EINVAL);
    assert_int_equal(hf_hub_dataset_files(f->cache, "allenai/tulu-3-sft-mixture", NULL, "train", "../../x/*",
                                          "data.dataset", &hf, &err), ACC_EINVAL);
    assert_int_equal(hf_hub_dataset_files(f->cache, "allenai/tulu-3-sft-mixture", NULL, "train", "da*a/x.parquet",
                                          "data.dataset", &hf, &err), ACC_EINVAL);
}

/* Two files whose common glob also matches a third: no exact glob. */
static void test_glob_not_exact(void **state)
{
    fixture *f = *state;
    hf_files hf;
    acc_err err = {0};
    assert_int_equal(hf_hub_dataset_files(f->cache, "allenai/tulu-3-sft-mixture", NULL, "train",
                                          "data/train-0000[12]-of-00003.parquet", "data.dataset", &hf, &err), 0);
    assert_int_equal(hf.n, 2);
    char glob[PATH_MAX];
    assert_int_equal(hf_files_as_glob(&hf, "data.dataset", glob, sizeof glob, &err), ACC_EINVAL);
    assert_non_null(strstr(err.msg, "matches 3 files"));
    hf_files_free(&hf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_repo_ids),
        cmocka_unit_test_setup_teardown(test_model_snapshot, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dataset_split, setup, teardown),
        cmocka_unit_test_setup_teardown(test_glob_not_exact, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
