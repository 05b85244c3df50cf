/* hf_hub: Hugging Face hub names resolved offline in a local hub cache.
 *
 * The cache is the directory `huggingface-cli download` fills (HF_HUB_CACHE,
 * by default ~/.cache/huggingface/hub):
 *   models--ORG--NAME/refs/main            the commit "main" names (one line)
 *   models--ORG--NAME/snapshots/COMMIT/    the files, mostly symlinks into ../../blobs
 *   datasets--ORG--NAME/...                the same for a dataset repository
 * Nothing is ever downloaded. A name that is not in the cache is ACC_EINVAL
 * naming the field, the directory looked in and the `huggingface-cli download`
 * command that would fetch it.
 *
 * Paths returned are resolved (realpath) and lie under the cache; the files
 * themselves are opened later through safepath.h with the cache as a root,
 * so a snapshot's symlinks into blobs/ are followed only inside the cache.
 */
#ifndef ACC_HF_HUB_H
#define ACC_HF_HUB_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>

#include "err.h"

#define HF_HUB_MAX_FILES 4096

/* "ORG/NAME" (or a bare "NAME"): letters, digits, '-', '_', '.', at most one
 * '/', no "..", no leading '.', '-' or '/'. */
bool hf_hub_is_repo_id(const char *s);

/* Like hf_hub_is_repo_id, but only the "ORG/NAME" form: what a spec's path
 * keys take as a hub name when no such path exists under data_roots. */
bool hf_hub_is_org_repo_id(const char *s);

/* The snapshot directory of the model repository `repo` (the commit
 * refs/main names; without refs/main, the only snapshot when there is
 * exactly one) into `out`. `field` names the spec key in errors. */
int hf_hub_model_dir(const char *cache, const char *repo, const char *field, char *out, size_t n,
                     acc_err *err);

/* The data files of one split of a dataset repository, sorted by path. */
typedef struct hf_files {
    int n;
    char (*path)[PATH_MAX]; /* n resolved paths under the cache (malloc'd) */
    char snapshot[PATH_MAX]; /* the snapshot directory they were found in */
} hf_files;

/* Which files a split is: with `data_files` (a pattern relative to the
 * snapshot, '*' '?' '[' in its last component only), those; else the
 * conventional layouts of the hub, first match wins, each for .parquet,
 * .jsonl and .json:
 *   [SUBSET/]data/SPLIT-*   [SUBSET/]data/SPLIT.*   [SUBSET/]SPLIT-*   [SUBSET/]SPLIT.*
 *   [SUBSET/]data/SPLIT/ *  [SUBSET/]SPLIT/ *       data/SUBSET/SPLIT-*
 * `subset` may be NULL or "" (the default configuration). `field` names the
 * spec key in errors. hf_files_free releases out. */
int hf_hub_dataset_files(const char *cache, const char *repo, const char *subset, const char *split,
                         const char *data_files, const char *field, hf_files *out, acc_err *err);
void hf_files_free(hf_files *f);

/* One glob (wildcards in the file name only) whose matches are exactly the
 * files of `f`, into `out`: the single file itself, or DIR/PREFIX*SUFFIX
 * with the longest common prefix and suffix of their names. ACC_EINVAL
 * naming `field` when no such glob exists (files in several directories,
 * or other files matching). */
int hf_files_as_glob(const hf_files *f, const char *field, char *out, size_t n, acc_err *err);

#endif
