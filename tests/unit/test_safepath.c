/* safepath: every file a spec reaches is checked against the roots after
 * resolution (globs after expansion), opened without following a symlink
 * swapped in later, refused without blocking when it is not a regular file;
 * messages never quote the file. And data_open_under, the data loader's use
 * of it (issue 16, defects 2 and 3). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data.h"
#include "safepath.h"

static char dir[64], root[128], outside[128];

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int setup(void **state)
{
    snprintf(dir, sizeof dir, "/tmp/accumd-safepath-XXXXXX");
    if (mkdtemp(dir) == NULL)
        return -1;
    snprintf(root, sizeof root, "%s/root", dir);
    snprintf(outside, sizeof outside, "%s/secret.txt", dir);
    mkdir(root, 0750);
    return 0;
}

static int teardown(void **state)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* The review's exploit: a symlink to a file outside the root, reached by
 * its name (refused before) and by a glob (accepted before). */
static void test_glob_cannot_escape(void **state)
{
    char link[256], pat[256];
    put(outside, "root:x:0:0:SECRET-CONTENT-1234567890-abcdefghijklmnopqrstuvwxyz\n");
    snprintf(link, sizeof link, "%s/passwd-link", root);
    assert_int_equal(symlink(outside, link), 0);
    data_source *ds = NULL;
    acc_err err = {0};
    assert_int_equal(data_open_under(root, link, SPEC_DATA_TEXT, 4, 256, "data.train", &ds, &err),
                     ACC_EINVAL);
    assert_string_equal(err.field, "data.train");
    assert_non_null(strstr(err.msg, "outside the allowed roots"));
    snprintf(pat, sizeof pat, "%s/passwd-l?nk", root);
    for (int fmt = 0; fmt < 2; fmt++) {
        memset(&err, 0, sizeof err);
        assert_int_equal(data_open_under(root, pat, fmt ? SPEC_DATA_TOKENS : SPEC_DATA_TEXT, 4, 256,
                                         "data.train", &ds, &err),
                         ACC_EINVAL);
        assert_null(ds);
        assert_string_equal(err.field, "data.train");
        assert_non_null(strstr(err.msg, "outside the allowed roots"));
        assert_null(strstr(err.msg, "SECRET")); /* never the target's bytes */
        assert_null(strstr(err.msg, "root:"));
    }
    /* a symlink that stays inside the root is fine */
    char in[256], inlink[256];
    snprintf(in, sizeof in, "%s/corpus.txt", root);
    put(in, "hello, this is a small corpus inside the root");
    snprintf(inlink, sizeof inlink, "%s/corpus-link", root);
    assert_int_equal(symlink(in, inlink), 0);
    assert_int_equal(data_open_under(root, inlink, SPEC_DATA_TEXT, 4, 256, "data.train", &ds, &err), 0);
    data_close(ds);
    unlink(link);
    unlink(inlink);
}

/* A FIFO (and a directory) is refused at once, by its name or a glob. */
static void test_special_files_refused(void **state)
{
    char fifo[256], pat[256];
    snprintf(fifo, sizeof fifo, "%s/pipe.bin", root);
    assert_int_equal(mkfifo(fifo, 0640), 0);
    data_source *ds = NULL;
    acc_err err = {0};
    assert_int_equal(data_open_under(root, fifo, SPEC_DATA_TEXT, 4, 256, "data.val", &ds, &err), ACC_EINVAL);
    assert_string_equal(err.field, "data.val");
    assert_non_null(strstr(err.msg, "FIFO"));
    snprintf(pat, sizeof pat, "%s/pipe.b?n", root);
    assert_int_equal(data_open_under(root, pat, SPEC_DATA_TOKENS, 4, 256, "data.train", &ds, &err), ACC_EINVAL);
    assert_non_null(strstr(err.msg, "FIFO"));
    int fd;
    assert_int_equal(sp_open_file(root, root, "model.init_from", &fd, NULL, 0, &err), ACC_EINVAL);
    assert_non_null(strstr(err.msg, "directory"));
    unlink(fifo);
}

/* sp_openat and sp_mkdirat never follow a symlink. */
static void test_no_symlink_follow(void **state)
{
    char sub[256], link[256];
    int rfd = open(root, O_RDONLY | O_DIRECTORY);
    assert_true(rfd >= 0);
    snprintf(sub, sizeof sub, "%s/elsewhere", dir);
    mkdir(sub, 0750);
    snprintf(link, sizeof link, "%s/j000002", root);
    assert_int_equal(symlink(sub, link), 0);
    acc_err err = {0};
    int fd = -1;
    assert_int_not_equal(sp_mkdirat(rfd, "j000002", 0, &fd, &err), 0); /* planted: refused */
    assert_int_equal(fd, -1);
    assert_int_equal(sp_mkdirat(rfd, "j000002", 1, NULL, &err), ACC_ESTATE); /* taken: skip it */
    assert_int_equal(sp_mkdirat(rfd, "j000003", 1, &fd, &err), 0);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(sp_mkdirat(rfd, "j000003", 1, NULL, &err), ACC_ESTATE);
    assert_int_equal(sp_mkdirat(rfd, "j000003", 0, NULL, &err), 0);
    assert_int_not_equal(sp_openat(rfd, "j000002", 1, "resume_from", &fd, &err), 0);
    assert_int_equal(sp_openat(rfd, "missing", 0, "resume_from", &fd, &err), ACC_ENOTFOUND);
    /* directories: under the roots after resolution */
    assert_int_equal(sp_open_dir(root, link, "resume_from", &fd, NULL, 0, &err), ACC_EINVAL);
    assert_non_null(strstr(err.msg, "outside the allowed roots"));
    char real[4096];
    assert_int_equal(sp_open_dir(root, "j000003", "resume_from", &fd, real, sizeof real, &err), 0);
    assert_non_null(strstr(real, "/root/j000003"));
    close(fd);
    close(rfd);
}

/* sp_open_in: a directory's file, opened from the directory's descriptor
 * when it is a regular file; a symlink only to a target under the roots;
 * anything else refused without blocking. */
static void test_open_in(void **state)
{
    char sub[160], path[256], link[256];
    snprintf(sub, sizeof sub, "%s/model", root);
    mkdir(sub, 0750);
    put(outside, "root:x:0:0:SECRET-CONTENT\n");
    snprintf(path, sizeof path, "%s/config.json", sub);
    put(path, "{}");
    int dfd, fd = -1;
    acc_err err = {0};
    assert_int_equal(sp_open_dir(root, sub, "model.from", &dfd, NULL, 0, &err), 0);
    assert_int_equal(sp_open_in(root, dfd, sub, "config.json", "model.from", &fd, &err), 0);
    char buf[8] = "";
    assert_int_equal(read(fd, buf, sizeof buf), 2);
    assert_memory_equal(buf, "{}", 2);
    close(fd);
    assert_int_equal(sp_open_in(root, dfd, sub, "absent.json", "model.from", &fd, &err), ACC_ENOTFOUND);
    /* out of the root: refused, the message names the file, never its bytes */
    snprintf(link, sizeof link, "%s/tokenizer.json", sub);
    assert_int_equal(symlink(outside, link), 0);
    memset(&err, 0, sizeof err);
    assert_int_equal(sp_open_in(root, dfd, sub, "tokenizer.json", "data.tokenizer", &fd, &err), ACC_EINVAL);
    assert_int_equal(fd, -1);
    assert_string_equal(err.field, "data.tokenizer");
    assert_non_null(strstr(err.msg, "outside the allowed roots"));
    assert_non_null(strstr(err.msg, "model/tokenizer.json"));
    assert_null(strstr(err.msg, "SECRET"));
    /* without roots (tools, tests) the symlink is followed */
    assert_int_equal(sp_open_in("", dfd, sub, "tokenizer.json", "data.tokenizer", &fd, &err), 0);
    close(fd);
    /* a symlink to a file in the root: fine (the hub cache's layout) */
    snprintf(link, sizeof link, "%s/vocab.json", sub);
    assert_int_equal(symlink("config.json", link), 0);
    assert_int_equal(sp_open_in(root, dfd, sub, "vocab.json", "model.from", &fd, &err), 0);
    close(fd);
    /* a FIFO, a directory: refused at once */
    snprintf(path, sizeof path, "%s/merges.txt", sub);
    assert_int_equal(mkfifo(path, 0640), 0);
    assert_int_equal(sp_open_in(root, dfd, sub, "merges.txt", "model.from", &fd, &err), ACC_EINVAL);
    assert_non_null(strstr(err.msg, "FIFO"));
    snprintf(link, sizeof link, "%s/pipe-link", sub);
    assert_int_equal(symlink("merges.txt", link), 0);
    assert_int_equal(sp_open_in(root, dfd, sub, "pipe-link", "model.from", &fd, &err), ACC_EINVAL);
    assert_non_null(strstr(err.msg, "FIFO"));
    snprintf(path, sizeof path, "%s/sub", sub);
    mkdir(path, 0750);
    assert_int_equal(sp_open_in(root, dfd, sub, "sub", "model.from", &fd, &err), ACC_EINVAL);
    assert_int_equal(sp_open_in(root, dfd, sub, "../model/config.json", "model.from", &fd, &err), ACC_EINVAL);
    close(dfd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_glob_cannot_escape),
        cmocka_unit_test(test_special_files_refused),
        cmocka_unit_test(test_no_symlink_follow),
        cmocka_unit_test(test_open_in),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
