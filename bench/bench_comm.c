/* bench_comm: the gradient reduction's bandwidth, shared-memory threads vs
 * MPI rank processes (kern_comm.h's allreduce, the trainer's call).
 *
 *   bench_comm --threads W BYTES...          W rank threads, shared memory
 *   mpirun -np W bench_comm BYTES...         W processes, kern_comm_mpi
 *
 * Prints, per buffer size, the median time of one reduction over 7 runs
 * (after one warm-up) and the "bus bandwidth" of NCCL's tests:
 * bytes * 2 (W-1)/W / time, what each rank sends and receives. */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "conf.h"
#include "kern_comm.h"
#include "kern_comm_mpi.h"

#define RUNS 7

typedef struct th_arg {
    kern_comm *c;
    int rank;
    float *buf;
    size_t n;
    pthread_barrier_t *bar;
    double *times;
} th_arg;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void *thread_main(void *p)
{
    th_arg *a = p;
    for (int i = 0; i <= RUNS; i++) {
        pthread_barrier_wait(a->bar);
        double t0 = now_s();
        if (kern_comm_allreduce(a->c, a->rank, a->buf, a->n) != 0)
            fprintf(stderr, "allreduce failed\n");
        pthread_barrier_wait(a->bar);
        if (i > 0 && a->rank == 0)
            a->times[i - 1] = now_s() - t0;
    }
    return NULL;
}

static void report(const char *how, int w, size_t bytes, double *times)
{
    qsort(times, RUNS, sizeof *times, cmp_d);
    double t = times[RUNS / 2];
    double bus = (double)bytes * 2.0 * (w - 1) / w / t / 1e9;
    printf("%-8s w=%d %8.1f MB  %9.3f ms  bus %.2f GB/s\n", how, w, (double)bytes / 1e6, t * 1e3, bus);
}

static int run_threads(int w, size_t bytes)
{
    kern_comm *c;
    acc_err err = {0};
    if (kern_comm_create(w, &c, &err) != 0)
        return fprintf(stderr, "%s\n", err.msg), 1;
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)w);
    th_arg a[64];
    pthread_t th[64];
    double times[RUNS];
    for (int r = 0; r < w; r++) {
        a[r] = (th_arg){c, r, calloc(bytes / 4, 4), bytes / 4, &bar, times};
        pthread_create(&th[r], NULL, thread_main, &a[r]);
    }
    for (int r = 0; r < w; r++) {
        pthread_join(th[r], NULL);
        free(a[r].buf);
    }
    pthread_barrier_destroy(&bar);
    kern_comm_destroy(c);
    report("threads", w, bytes, times);
    return 0;
}

static int run_mpi(kern_comm *c, int rank, int w, size_t bytes)
{
    float *buf = calloc(bytes / 4, 4);
    double times[RUNS];
    if (buf == NULL)
        return 1;
    for (int i = 0; i <= RUNS; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now_s();
        if (kern_comm_allreduce(c, rank, buf, bytes / 4) != 0)
            fprintf(stderr, "allreduce failed\n");
        MPI_Barrier(MPI_COMM_WORLD);
        if (i > 0)
            times[i - 1] = now_s() - t0;
    }
    free(buf);
    if (rank == 0)
        report("mpi", w, bytes, times);
    return 0;
}

int main(int argc, char **argv)
{
    int threads = 0, first = 1;
    if (argc > 2 && !strcmp(argv[1], "--threads")) {
        threads = atoi(argv[2]);
        first = 3;
    }
    if (threads > 0) {
        for (int i = first; i < argc; i++) {
            uint64_t b;
            if (conf_parse_bytes(argv[i], &b) != 0 || run_threads(threads, (size_t)b) != 0)
                return 1;
        }
        return 0;
    }
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    kern_comm *c;
    int rank, w;
    acc_err err = {0};
    if (kern_comm_mpi_open(&c, &rank, &w, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (int i = first; i < argc; i++) {
        uint64_t b;
        if (conf_parse_bytes(argv[i], &b) != 0 || run_mpi(c, rank, w, (size_t)b) != 0)
            MPI_Abort(MPI_COMM_WORLD, 1);
    }
    kern_comm_destroy(c);
    MPI_Finalize();
    return 0;
}
