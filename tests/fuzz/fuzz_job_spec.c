/* fuzz_job_spec: the job spec parser (core/jobs/job_spec.c) on any bytes.
 * The data root holds one file, a.txt, so that specs naming it get past
 * the path checks into the rest of the validation. Oracle, beyond the
 * sanitizers: a refusal is ACC_EINVAL with a message; an accepted spec
 * keeps B = micro * accum * devices. */
#include <stdint.h>
#include "fuzz_io.h"
#include "job_spec.h"

static acc_conf conf;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *dir = fuzz_dir();
    char path[128];
    acc_err err = {0};
    conf_defaults(&conf);
    if (conf_set(&conf, "state_dir", dir, &err) != 0 || conf_set(&conf, "listen", "127.0.0.1:0", &err) != 0 ||
        conf_finalize(&conf, &err) != 0)
        abort();
    snprintf(path, sizeof path, "%s/data", dir);
    mkdir(path, 0700);
    snprintf(path, sizeof path, "%s/data/a.txt", dir);
    FILE *f = fopen(path, "w");
    if (f == NULL)
        abort();
    fputs("hello fuzzing world, a few bytes of text to train on\n", f);
    fclose(f);
    snprintf(path, sizeof path, "%s/out", dir);
    mkdir(path, 0700);
    snprintf(path, sizeof path, "%s/out/j000001", dir);
    mkdir(path, 0700);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    job_spec s;
    acc_err err = {0};
    int rc = job_spec_parse((const char *)data, size, &conf, &s, &err);
    if (rc != 0 && (rc != ACC_EINVAL || err.msg[0] == '\0'))
        abort();
    if (rc == 0 && (long)s.train_batch_size != (long)s.micro_batch * s.accum_steps * s.devices)
        abort();
    return 0;
}
