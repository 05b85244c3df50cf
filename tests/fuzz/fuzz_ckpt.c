/* fuzz_ckpt: the checkpoint loader (core/train/ckpt.c) on any pair of
 * files. Input: a 4-byte little-endian length L, L bytes written as
 * ckpt-00000001/state.safetensors, the rest as model.safetensors. Then what
 * a resume does: ckpt_find_latest over the output directory, ckpt_peek
 * (metadata only), ckpt_load into a tiny model, and what init_from does:
 * model_gpt2_safetensors_shape and ckpt_load_weights on the model file. Seeds are
 * real checkpoints of that model (make_seeds.c). */
#include <limits.h>
#include <stdint.h>

#include "ckpt.h"
#include "model_gpt2.h"
#include "fuzz_ckpt_model.h"
#include "fuzz_io.h"

static model *fm;
static adamw *fopt;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fm = fuzz_ckpt_model(&fopt);
    char d[128];
    snprintf(d, sizeof d, "%s/out", fuzz_dir());
    mkdir(d, 0700);
    snprintf(d, sizeof d, "%s/out/ckpt-00000001", fuzz_dir());
    mkdir(d, 0700);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4)
        return 0;
    size_t l = (size_t)data[0] | (size_t)data[1] << 8 | (size_t)data[2] << 16 | (size_t)data[3] << 24;
    data += 4;
    size -= 4;
    if (l > size)
        l = size;
    char sp[160], mp[160], out[128], dir[128], found[PATH_MAX];
    fuzz_write("out/ckpt-00000001/state.safetensors", data, l, sp, sizeof sp);
    fuzz_write("out/ckpt-00000001/model.safetensors", data + l, size - l, mp, sizeof mp);
    snprintf(out, sizeof out, "%s/out", fuzz_dir());
    snprintf(dir, sizeof dir, "%s/out/ckpt-00000001", fuzz_dir());
    acc_err err = {0};
    ckpt_state st;
    (void)ckpt_find_latest(out, found, sizeof found, &err);
    (void)ckpt_resolve(out, found, sizeof found, &err);
    (void)ckpt_peek(dir, &st, &err);
    (void)ckpt_load(dir, fm, fopt, &st, &err);
    int nl, ch, voc, seq;
    (void)model_gpt2_safetensors_shape(mp, &nl, &ch, &voc, &seq, &err);
    (void)ckpt_load_weights(mp, fm, &err);
    return 0;
}
