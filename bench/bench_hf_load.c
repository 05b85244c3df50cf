/* bench_hf_load: loading time and peak host memory of a Hugging Face LLaMA
 * directory through the real loader (model_hf_load_dir: hf_open maps the
 * files, each tensor is converted to fp32 and uploaded on its own).
 *
 *   bench_hf_load gen DIR [--shard-mb N] [--dtype bfloat16]
 *       writes a LLaMA-shaped directory (8 layers, 2048 channels, 16 heads,
 *       SwiGLU 5504, vocab 32000, untied head: 536 M parameters, 1.07 GB in
 *       bf16) with model_hf_save, in shards of N MB (0: one file);
 *   bench_hf_load load DIR
 *       in a fresh process: creates the model on one CPU device (its fp32
 *       buffer is the destination, host memory on CPU), then loads DIR.
 *
 * Reported: seconds for hf_open + check + load, VmRSS and VmHWM
 * (/proc/self/status) before and after the load. The loader's own peak is
 * VmHWM after minus VmRSS before minus the fp32 parameters it fills.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "model.h"
#include "model_hf.h"

/* kB of a /proc/self/status line ("VmHWM:", "VmRSS:"); -1 if absent. */
static long status_kb(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    if (f == NULL)
        return -1;
    while (fgets(line, sizeof line, f) != NULL)
        if (!strncmp(line, key, strlen(key))) {
            v = strtol(line + strlen(key), NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

static int make_model(kern_device **d, model **m, acc_err *err)
{
    model_config cfg = {.family = model_family_by_arch("llama"), .n_layer = 8, .n_head = 16,
                        .n_kv_head = 16, .channels = 2048, .intermediate_size = 5504,
                        .vocab_size = 32000, .padded_vocab_size = 32000, .max_seq_len = 128,
                        .norm_eps = 1e-5, .rope_theta = 10000.0};
    snprintf(cfg.model_type, sizeof cfg.model_type, "llama");
    kern_device_info info = {.kind = KERN_DEV_CPU, .mem_total = 16ull << 30};
    snprintf(info.name, sizeof info.name, "cpu0");
    int rc = cfg.family == NULL ? acc_err_set(err, ACC_EINVAL, "", "no llama family")
                                : model_config_check(&cfg, err);
    if (rc == 0)
        rc = kern_device_open(&info, 1, d, err);
    if (rc == 0)
        rc = model_create(*d, &cfg, 0, cfg.max_seq_len, m, err);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 3 || (strcmp(argv[1], "gen") && strcmp(argv[1], "load"))) {
        fprintf(stderr, "usage: bench_hf_load gen|load DIR [--shard-mb N] [--dtype D]\n");
        return 2;
    }
    model_hf_save_opts o = {.dtype = ST_BF16};
    acc_err err = {0};
    for (int i = 3; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--shard-mb"))
            o.max_shard_bytes = strtoull(argv[i + 1], NULL, 10) << 20;
        else if (!strcmp(argv[i], "--dtype") && hf_dtype_of(argv[i + 1], "--dtype", &o.dtype, &err) == 0)
            continue;
        else {
            fprintf(stderr, "bench_hf_load: bad option %s\n", argv[i]);
            return 2;
        }
    }
    kern_device *d = NULL;
    model *m = NULL;
    int rc = make_model(&d, &m, &err);
    long rss0 = status_kb("VmRSS:"), hwm0 = status_kb("VmHWM:");
    double t0 = bench_now();
    if (rc == 0 && !strcmp(argv[1], "gen")) {
        if (o.max_shard_bytes == 0)
            o.max_shard_bytes = 1ull << 40; /* one file */
        rc = model_init_seed(m, 1, &err);
        if (rc == 0)
            rc = model_hf_save(m, argv[2], &o, &err);
    } else if (rc == 0) {
        rc = model_hf_load_dir(m, argv[2], &err);
    }
    double secs = bench_now() - t0;
    if (rc != 0) {
        fprintf(stderr, "bench_hf_load: %s\n", err.msg);
        return 1;
    }
    printf("%s %s: %zu params (fp32 buffer %.0f MiB), %.2f s; VmRSS %ld -> %ld MiB, VmHWM %ld -> %ld MiB\n",
           argv[1], argv[2], m->nparams, (double)m->nparams * 4 / 1048576, secs, rss0 / 1024,
           status_kb("VmRSS:") / 1024, hwm0 / 1024, status_kb("VmHWM:") / 1024);
    model_free(m);
    kern_device_close(d);
    return 0;
}
