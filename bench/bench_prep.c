/* bench_prep: data preparation of a chat JSONL file (data_prep.h): parse,
 * render the chat template, tokenize and mask every conversation on N
 * threads, then the same load again from the cache. Prints one JSON line.
 * Usage: bench_prep TOKENIZER_DIR FILE.jsonl THREADS SEQ_LEN TEMPLATE CACHE_DIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>

#include "data_prep.h"

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec +
           1e-6 * (double)ru.ru_stime.tv_usec;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: bench_prep TOKENIZER_DIR FILE.jsonl THREADS SEQ_LEN TEMPLATE CACHE_DIR\n");
        return 2;
    }
    static data_cfg s;
    memset(&s, 0, sizeof s);
    s.data.format = SPEC_DATA_CHAT;
    s.model.seq_len = atoi(argv[4]);
    s.model.vocab_size = 1 << 24;
    snprintf(s.data.train, sizeof s.data.train, "%s", argv[2]);
    snprintf(s.data.tokenizer, sizeof s.data.tokenizer, "%s", argv[1]);
    snprintf(s.data.chat_template, sizeof s.data.chat_template, "%s", argv[5]);
    snprintf(s.data.cache_dir, sizeof s.data.cache_dir, "%s", argv[6]);
    struct stat st;
    if (stat(argv[2], &st) != 0)
        return 1;
    prep_opts o = {.spec = &s, .path = s.data.train, .field = "data.train", .threads = atoi(argv[3])};
    prep_samples ps;
    acc_err err = {0};
    double t0 = now_s(), c0 = cpu_s();
    if (prep_load(&o, &ps, &err) != 0) {
        fprintf(stderr, "prep_load: %s\n", err.msg);
        return 1;
    }
    double cold = now_s() - t0, cpu = cpu_s() - c0;
    uint64_t n = ps.n, ntok = ps.ntokens, trunc = ps.truncated;
    int hit0 = ps.from_cache;
    prep_free(&ps);
    t0 = now_s();
    if (prep_load(&o, &ps, &err) != 0) {
        fprintf(stderr, "prep_load (cache): %s\n", err.msg);
        return 1;
    }
    double warm = now_s() - t0;
    int hit1 = ps.from_cache;
    prep_free(&ps);
    printf("{\"bench\":\"prep\",\"bytes\":%lld,\"threads\":%s,\"samples\":%llu,\"tokens\":%llu,"
           "\"truncated\":%llu,\"tokenize_s\":%.3f,\"MB_per_s\":%.2f,\"cpu_s\":%.3f,\"MB_per_cpu_s\":%.2f,\"first_from_cache\":%d,"
           "\"cached_load_s\":%.3f,\"second_from_cache\":%d}\n",
           (long long)st.st_size, argv[3], (unsigned long long)n, (unsigned long long)ntok,
           (unsigned long long)trunc, cold, (double)st.st_size / 1e6 / cold, cpu, (double)st.st_size / 1e6 / cpu, hit0, warm, hit1);
    return 0;
}
