/* hf_hub: see hf_hub.h. */
#include "hf_hub.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static bool name_char(char c)
{
    return isalnum((unsigned char)c) || c == '-' || c == '_' || c == '.';
}

/* One component of a repo id, subset or split name. */
static bool component_ok(const char *s, size_t len)
{
    if (len == 0 || len > 96 || s[0] == '.' || s[0] == '-')
        return false;
    for (size_t i = 0; i < len; i++)
        if (!name_char(s[i]) || (s[i] == '.' && i + 1 < len && s[i + 1] == '.'))
            return false;
    return true;
}

bool hf_hub_is_repo_id(const char *s)
{
    const char *slash = strchr(s, '/');
    if (slash == NULL)
        return component_ok(s, strlen(s));
    return strchr(slash + 1, '/') == NULL && component_ok(s, (size_t)(slash - s)) &&
           component_ok(slash + 1, strlen(slash + 1));
}

bool hf_hub_is_org_repo_id(const char *s)
{
    return strchr(s, '/') != NULL && hf_hub_is_repo_id(s);
}

/* cache/KIND--ORG--NAME ('/' of the id becomes "--", as the hub cache spells it). */
static int repo_dir(const char *cache, const char *kind, const char *repo, char *out, size_t n)
{
    char flat[256];
    size_t k = 0;
    for (const char *p = repo; *p && k + 3 < sizeof flat; p++) {
        if (*p == '/') {
            flat[k++] = '-';
            flat[k++] = '-';
        } else {
            flat[k++] = *p;
        }
    }
    flat[k] = '\0';
    int w = snprintf(out, n, "%s/%s--%s", cache, kind, flat);
    return w < 0 || (size_t)w >= n ? -1 : 0;
}

static int not_cached(const char *field, const char *what, const char *repo, const char *looked, const char *cache,
                      bool dataset, acc_err *err)
{
    return acc_err_set(err, ACC_EINVAL, field,
                       "%s: %s '%s' is not in the Hugging Face cache (looked for %s); accumd never downloads: "
                       "fetch it with `huggingface-cli download%s %s --cache-dir %s`",
                       field, what, repo, looked, dataset ? " --repo-type dataset" : "", repo, cache);
}

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The commit refs/main names ("" when there is no refs/main). */
static int read_ref(const char *dir, char *commit, size_t n)
{
    char p[PATH_MAX + 16];
    commit[0] = '\0';
    snprintf(p, sizeof p, "%s/refs/main", dir);
    FILE *f = fopen(p, "re");
    if (f == NULL)
        return errno == ENOENT ? 0 : -1;
    char line[128] = "";
    bool got = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    line[strcspn(line, "\r\n \t")] = '\0';
    if (!got || line[0] == '\0' || strlen(line) > 64 || strspn(line, "0123456789abcdef") != strlen(line))
        return -1;
    snprintf(commit, n, "%s", line);
    return 0;
}

/* The only entry of snapshots/ (none or several: ""). */
static void only_snapshot(const char *dir, char *commit, size_t n)
{
    char p[PATH_MAX + 16];
    snprintf(p, sizeof p, "%s/snapshots", dir);
    commit[0] = '\0';
    DIR *d = opendir(p);
    if (d == NULL)
        return;
    int count = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.')
            continue;
        if (count++ == 0 && strlen(e->d_name) < n)
            snprintf(commit, n, "%s", e->d_name);
    }
    closedir(d);
    if (count != 1)
        commit[0] = '\0';
}

/* The snapshot of `repo` (of `kind` "models" or "datasets"), resolved and
 * required under the resolved cache. */
static int find_snapshot(const char *cache, const char *kind, const char *repo, const char *field, char *out,
                         size_t n, acc_err *err)
{
    bool dataset = !strcmp(kind, "datasets");
    const char *what = dataset ? "dataset" : "model";
    char dir[PATH_MAX], commit[96], snap[PATH_MAX + 128], real[PATH_MAX], rcache[PATH_MAX];
    if (!hf_hub_is_repo_id(repo))
        return acc_err_set(err, ACC_EINVAL, field, "%s: '%s' is not a hub repository id (ORG/NAME)", field, repo);
    if (cache == NULL || cache[0] == '\0')
        return acc_err_set(err, ACC_EINVAL, field,
                           "%s: '%s' is a hub name, but the daemon has no hf_hub_cache configured (docs/operations.md); "
                           "download it with `huggingface-cli download%s %s` and set hf_hub_cache, or give a path "
                           "under data_roots", field, repo, dataset ? " --repo-type dataset" : "", repo);
    if (realpath(cache, rcache) == NULL)
        return acc_err_set(err, ACC_EINVAL, field, "%s: the hf_hub_cache %s cannot be read: %s", field, cache,
                           strerror(errno));
    if (repo_dir(rcache, kind, repo, dir, sizeof dir) != 0)
        return acc_err_set(err, ACC_EINVAL, field, "%s: '%s' is too long", field, repo);
    if (!is_dir(dir))
        return not_cached(field, what, repo, dir, cache, dataset, err);
    if (read_ref(dir, commit, sizeof commit) != 0)
        return acc_err_set(err, ACC_EINVAL, field, "%s: %s/refs/main does not name a commit", field, dir);
    if (commit[0] == '\0')
        only_snapshot(dir, commit, sizeof commit);
    if (commit[0] == '\0') {
        snprintf(snap, sizeof snap, "%s/refs/main (or a single snapshot)", dir);
        return not_cached(field, what, repo, snap, cache, dataset, err);
    }
    snprintf(snap, sizeof snap, "%s/snapshots/%s", dir, commit);
    if (!is_dir(snap))
        return not_cached(field, what, repo, snap, cache, dataset, err);
    size_t cl = strlen(rcache);
    if (realpath(snap, real) == NULL || strncmp(real, rcache, cl) != 0 || real[cl] != '/')
        return acc_err_set(err, ACC_EINVAL, field, "%s: %s does not lie inside the hf_hub_cache %s", field, snap,
                           cache);
    if (strlen(real) >= n)
        return acc_err_set(err, ACC_EINVAL, field, "%s: %s is too long", field, real);
    snprintf(out, n, "%s", real);
    return 0;
}

int hf_hub_model_dir(const char *cache, const char *repo, const char *field, char *out, size_t n, acc_err *err)
{
    return find_snapshot(cache, "models", repo, field, out, n, err);
}

/* ---- a dataset's files ---------------------------------------------------- */

static int cmp_path(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

/* Append every regular file (symlinks followed: the snapshot's links into
 * blobs/) of snapshot/reldir whose name matches `pattern`. */
static int add_matches(hf_files *f, const char *reldir, const char *pattern, acc_err *err)
{
    char dirp[PATH_MAX * 2];
    snprintf(dirp, sizeof dirp, "%s%s%s", f->snapshot, reldir[0] ? "/" : "", reldir);
    DIR *d = opendir(dirp);
    if (d == NULL)
        return 0;
    int rc = 0;
    for (struct dirent *e; rc == 0 && (e = readdir(d)) != NULL;) {
        struct stat st;
        if (e->d_name[0] == '.' || fnmatch(pattern, e->d_name, FNM_PERIOD) != 0)
            continue;
        if (fstatat(dirfd(d), e->d_name, &st, 0) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (f->n >= HF_HUB_MAX_FILES) {
            rc = acc_err_set(err, ACC_EINVAL, NULL, "more than %d data files", HF_HUB_MAX_FILES);
            break;
        }
        if (f->path == NULL && (f->path = malloc(sizeof *f->path * HF_HUB_MAX_FILES)) == NULL) {
            rc = acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
            break;
        }
        int w = snprintf(f->path[f->n], PATH_MAX, "%s/%s", dirp, e->d_name);
        if (w < 0 || w >= PATH_MAX)
            continue;
        f->n++;
    }
    closedir(d);
    return rc;
}

/* A relative pattern: no "..", no leading '/', wildcards in its last
 * component only. */
static bool data_files_ok(const char *s)
{
    if (s[0] == '\0' || s[0] == '/' || strlen(s) >= 512)
        return false;
    const char *slash = strrchr(s, '/');
    if (slash != NULL && strpbrk(s, "*?[") != NULL && strpbrk(s, "*?[") < slash)
        return false;
    for (const char *p = s; *p; p++)
        if (p[0] == '.' && p[1] == '.' && (p == s || p[-1] == '/'))
            return false;
    return true;
}

/* data_files given: the matches of that pattern in the snapshot. */
static int explicit_files(hf_files *f, const char *data_files, const char *field, acc_err *err)
{
    if (!data_files_ok(data_files))
        return acc_err_set(err, ACC_EINVAL, field,
                           "%s: data_files '%s' must be a relative path or pattern (wildcards in the file name only)",
                           field, data_files);
    char dir[512] = "";
    const char *leaf = data_files, *slash = strrchr(data_files, '/');
    if (slash != NULL) {
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - data_files), data_files);
        leaf = slash + 1;
    }
    return add_matches(f, dir, leaf, err);
}

/* The hub's conventional layouts, first match wins: (directory, name
 * pattern) pairs under the snapshot, each tried with every extension. */
static int conventional_files(hf_files *f, const char *subset, const char *split, char *tried, size_t tn,
                              acc_err *err)
{
    static const char *const exts[] = {"parquet", "jsonl", "json"};
    char sub[128], dirs[7][300], pats[7][160];
    snprintf(sub, sizeof sub, "%s%s", subset, subset[0] ? "/" : "");
    snprintf(dirs[0], sizeof dirs[0], "%sdata", sub);
    snprintf(pats[0], sizeof pats[0], "%s-*", split);
    snprintf(dirs[1], sizeof dirs[1], "%sdata", sub);
    snprintf(pats[1], sizeof pats[1], "%s", split);
    snprintf(dirs[2], sizeof dirs[2], "%s", subset);
    snprintf(pats[2], sizeof pats[2], "%s-*", split);
    snprintf(dirs[3], sizeof dirs[3], "%s", subset);
    snprintf(pats[3], sizeof pats[3], "%s", split);
    snprintf(dirs[4], sizeof dirs[4], "%sdata/%s", sub, split);
    snprintf(pats[4], sizeof pats[4], "*");
    snprintf(dirs[5], sizeof dirs[5], "%s%s", sub, split);
    snprintf(pats[5], sizeof pats[5], "*");
    int nl = 6;
    if (subset[0] != '\0') {
        snprintf(dirs[6], sizeof dirs[6], "data/%s", subset);
        snprintf(pats[6], sizeof pats[6], "%s-*", split);
        nl = 7;
    }
    size_t k = 0;
    tried[0] = '\0';
    for (int l = 0; l < nl; l++) {
        for (int e = 0; e < 3; e++) {
            char pat[200];
            int w = snprintf(pat, sizeof pat, "%s.%s", pats[l], exts[e]);
            if (w < 0 || (size_t)w >= sizeof pat)
                continue;
            int rc = add_matches(f, dirs[l], pat, err);
            if (rc != 0 || f->n > 0)
                return rc;
        }
        if (k < tn)
            k += (size_t)snprintf(tried + k, tn - k, "%s%s%s%s.*", k ? ", " : "", dirs[l], dirs[l][0] ? "/" : "",
                                  pats[l]);
    }
    if (k < tn)
        snprintf(tried + k, tn - k, " (.parquet, .jsonl, .json)");
    return 0;
}

int hf_hub_dataset_files(const char *cache, const char *repo, const char *subset, const char *split,
                         const char *data_files, const char *field, hf_files *out, acc_err *err)
{
    memset(out, 0, sizeof *out);
    if (subset == NULL)
        subset = "";
    if (split == NULL || split[0] == '\0')
        split = "train";
    if ((subset[0] != '\0' && !component_ok(subset, strlen(subset))) || !component_ok(split, strlen(split)))
        return acc_err_set(err, ACC_EINVAL, field,
                           "%s: subset and split must be names (letters, digits, '-', '_', '.'), got '%s' / '%s'",
                           field, subset, split);
    int rc = find_snapshot(cache, "datasets", repo, field, out->snapshot, sizeof out->snapshot, err);
    if (rc != 0)
        return rc;
    char tried[1024];
    if (data_files != NULL && data_files[0] != '\0') {
        rc = explicit_files(out, data_files, field, err);
        snprintf(tried, sizeof tried, "%s", data_files);
    } else {
        rc = conventional_files(out, subset, split, tried, sizeof tried, err);
    }
    if (rc == 0 && out->n == 0)
        rc = acc_err_set(err, ACC_EINVAL, field, "%s: no data files for split '%s'%s%s of '%s' in %s (looked for %s)",
                         field, split, subset[0] ? " of subset " : "", subset, repo, out->snapshot, tried);
    if (rc != 0) {
        if (err->field[0] == '\0')
            snprintf(err->field, sizeof err->field, "%s", field);
        hf_files_free(out);
        return rc;
    }
    qsort(out->path, (size_t)out->n, sizeof *out->path, cmp_path);
    return 0;
}

void hf_files_free(hf_files *f)
{
    free(f->path);
    f->path = NULL;
    f->n = 0;
}

/* ---- one glob for a list ----------------------------------------------------- */

static size_t dir_len(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? (size_t)(s - p) : 0;
}

/* Count the regular files of `dir` matching `pattern`. */
static int count_matches(const char *dir, const char *pattern)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        struct stat st;
        if (e->d_name[0] != '.' && fnmatch(pattern, e->d_name, FNM_PERIOD) == 0 &&
            fstatat(dirfd(d), e->d_name, &st, 0) == 0 && S_ISREG(st.st_mode))
            n++;
    }
    closedir(d);
    return n;
}

int hf_files_as_glob(const hf_files *f, const char *field, char *out, size_t n, acc_err *err)
{
    if (f->n < 1)
        return acc_err_set(err, ACC_EINVAL, field, "%s: no files", field);
    const char *first = f->path[0];
    size_t dl = dir_len(first);
    if (f->n == 1) {
        if (strlen(first) >= n)
            return acc_err_set(err, ACC_EINVAL, field, "%s: %s is too long", field, first);
        snprintf(out, n, "%s", first);
        return 0;
    }
    const char *name0 = first + dl + 1;
    size_t pre = strlen(name0), suf = strlen(name0), min = strlen(name0);
    for (int i = 1; i < f->n; i++) {
        const char *p = f->path[i];
        if (dir_len(p) != dl || strncmp(p, first, dl) != 0)
            return acc_err_set(err, ACC_EINVAL, field, "%s: the files are in several directories (%.*s, %.*s)",
                               field, (int)dl, first, (int)dir_len(p), p);
        const char *name = p + dl + 1;
        size_t len = strlen(name), k = 0;
        while (k < pre && name[k] == name0[k])
            k++;
        pre = k;
        k = 0;
        while (k < suf && k < len && name[len - 1 - k] == name0[strlen(name0) - 1 - k])
            k++;
        suf = k;
        if (len < min)
            min = len;
    }
    if (pre + suf > min)
        suf = min - pre;
    char pattern[PATH_MAX];
    size_t l0 = strlen(name0);
    bool fits = pre + 1 + suf < sizeof pattern;
    if (fits) { /* PREFIX*SUFFIX */
        memcpy(pattern, name0, pre);
        pattern[pre] = '*';
        memcpy(pattern + pre + 1, name0 + l0 - suf, suf);
        pattern[pre + 1 + suf] = '\0';
    }
    if (!fits || strpbrk(name0, "*?[\\") != NULL)
        return acc_err_set(err, ACC_EINVAL, field, "%s: the file names of %.*s have no common pattern", field,
                           (int)dl, first);
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%.*s", (int)dl, first);
    int matched = count_matches(dir, pattern);
    if (matched != f->n)
        return acc_err_set(err, ACC_EINVAL, field,
                           "%s: %s/%s matches %d files, not just the %d of the split; give data_files", field, dir,
                           pattern, matched, f->n);
    if ((size_t)snprintf(out, n, "%s/%s", dir, pattern) >= n)
        return acc_err_set(err, ACC_EINVAL, field, "%s: the pattern is too long", field);
    return 0;
}
