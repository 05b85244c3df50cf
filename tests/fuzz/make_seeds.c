/* make_seeds: write the seed inputs of fuzz_ckpt (a real checkpoint of the
 * fuzz model, in the target's input format) and of fuzz_safetensors (its
 * two files) into the corpus directories given. Run by hand when the
 * checkpoint format changes:
 *   build/fuzz/tests/fuzz/make_seeds tests/fuzz/corpus/ckpt tests/fuzz/corpus/safetensors */
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "ckpt.h"
#include "fsutil.h"
#include "fuzz_ckpt_model.h"
#include "fuzz_io.h"

static char *slurp(const char *path, size_t *n)
{
    char *text = NULL;
    acc_err err = {0};
    if (fsu_read_all(path, &text, n, 1 << 26, &err) != 0)
        abort();
    return text;
}

static void put(const char *dir, const char *name, const void *a, size_t na, const void *b, size_t nb)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(a, 1, na, f) != na || (nb && fwrite(b, 1, nb, f) != nb) || fclose(f) != 0)
        abort();
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: make_seeds CKPT_CORPUS_DIR SAFETENSORS_CORPUS_DIR\n");
        return 2;
    }
    adamw *opt = NULL;
    model *m = fuzz_ckpt_model(&opt);
    ckpt_state st = {.step = 1, .adam_t = 1, .micro_batch = 1, .accum_steps = 2, .seed = 7};
    char out[128], path[PATH_MAX], p[PATH_MAX + 32];
    acc_err err = {0};
    snprintf(out, sizeof out, "%s/out", fuzz_dir());
    if (ckpt_save(out, m, opt, &st, "{\"name\":\"seed\"}", 1, path, sizeof path, &err) != 0) {
        fprintf(stderr, "make_seeds: %s\n", err.msg);
        return 1;
    }
    size_t ns, nm;
    snprintf(p, sizeof p, "%s/state.safetensors", path);
    char *s = slurp(p, &ns);
    snprintf(p, sizeof p, "%s/model.safetensors", path);
    char *w = slurp(p, &nm);
    uint8_t len[4] = {(uint8_t)ns, (uint8_t)(ns >> 8), (uint8_t)(ns >> 16), (uint8_t)(ns >> 24)};
    char *both = malloc(ns + nm);
    memcpy(both, s, ns);
    memcpy(both + ns, w, nm);
    put(argv[1], "seed-checkpoint", len, 4, both, ns + nm);
    put(argv[2], "seed-state", s, ns, NULL, 0);
    put(argv[2], "seed-model", w, nm, NULL, 0);
    printf("make_seeds: state %zu bytes, model %zu bytes\n", ns, nm);
    free(both);
    free(s);
    free(w);
    kern_device *dev = m->dev;
    adamw_free(opt);
    model_free(m);
    kern_device_close(dev);
    return 0;
}
