/* bench_tok: tokenizer throughput. Loads a tokenizer directory, reads the
 * texts of a JSONL corpus ({"text": ...} a line; tests/tok/make_corpus.py
 * writes one), and encodes all of them `runs` times on `threads` threads
 * (each with its own tok_encoder, the texts dealt round robin), printing
 * the load time and MB/s in total and per thread (median of the runs).
 * Usage: bench_tok TOKENIZER_DIR CORPUS.jsonl [threads] [runs]
 */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tok.h"

typedef struct text {
    char *s;
    size_t n;
} text;

typedef struct worker {
    const tok_tokenizer *t;
    const text *texts;
    size_t ntexts;
    int id, nthreads;
    size_t tokens;
    int rc;
} worker;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *run(void *arg)
{
    worker *w = arg;
    tok_encoder *e;
    acc_err err = {0};
    tok_ids ids = {0};
    if (tok_encoder_new(w->t, &e, &err) != 0) {
        w->rc = 1;
        return NULL;
    }
    for (size_t i = (size_t)w->id; i < w->ntexts; i += (size_t)w->nthreads) {
        ids.n = 0;
        if (tok_encode(e, w->texts[i].s, w->texts[i].n, 0, &ids, &err) != 0) {
            fprintf(stderr, "bench_tok: %s\n", err.msg);
            w->rc = 1;
            break;
        }
        w->tokens += ids.n;
    }
    tok_ids_free(&ids);
    tok_encoder_free(e);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_tok TOKENIZER_DIR CORPUS.jsonl [threads] [runs]\n");
        return 2;
    }
    int threads = argc > 3 ? atoi(argv[3]) : 1, runs = argc > 4 ? atoi(argv[4]) : 5;
    if (threads < 1 || threads > 256 || runs < 1 || runs > 100)
        return 2;
    acc_err err = {0};
    tok_tokenizer *t;
    double t0 = now();
    if (tok_load_dir(argv[1], &t, &err) != 0) {
        fprintf(stderr, "bench_tok: %s\n", err.msg);
        return 1;
    }
    double load = now() - t0;
    FILE *f = fopen(argv[2], "r");
    if (f == NULL) {
        perror(argv[2]);
        return 1;
    }
    text *texts = NULL;
    size_t n = 0, bytes = 0, cap = 0;
    char *line = NULL;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) > 0) {
        json_t *j = json_loadb(line, (size_t)len, JSON_ALLOW_NUL, NULL);
        json_t *tx = json_object_get(j, "text");
        if (json_is_string(tx)) {
            texts = realloc(texts, (n + 1) * sizeof *texts);
            texts[n].n = json_string_length(tx);
            texts[n].s = malloc(texts[n].n + 1);
            memcpy(texts[n].s, json_string_value(tx), texts[n].n + 1);
            bytes += texts[n++].n;
        }
        json_decref(j);
    }
    free(line);
    fclose(f);
    double secs[100];
    size_t tokens = 0;
    for (int r = 0; r < runs; r++) {
        worker w[256];
        pthread_t th[256];
        double s0 = now();
        for (int i = 0; i < threads; i++) {
            w[i] = (worker){t, texts, n, i, threads, 0, 0};
            pthread_create(&th[i], NULL, run, &w[i]);
        }
        tokens = 0;
        for (int i = 0; i < threads; i++) {
            pthread_join(th[i], NULL);
            tokens += w[i].tokens;
            if (w[i].rc)
                return 1;
        }
        secs[r] = now() - s0;
    }
    qsort(secs, (size_t)runs, sizeof *secs, cmp_double);
    double med = secs[runs / 2], mbs = bytes / med / 1e6;
    printf("{\"tokenizer\":\"%s\",\"load_s\":%.3f,\"bytes\":%zu,\"tokens\":%zu,\"threads\":%d,"
           "\"seconds\":%.4f,\"mb_per_s\":%.2f,\"mb_per_s_per_thread\":%.2f}\n",
           argv[1], load, bytes, tokens, threads, med, mbs, mbs / threads);
    for (size_t i = 0; i < n; i++)
        free(texts[i].s);
    free(texts);
    tok_free(t);
    return 0;
}
