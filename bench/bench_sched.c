/* bench_sched: the scheduler's cost per plan with a deep queue of many
 * users (round robin by user and per-user limits included), as the loop
 * thread pays it at every submission and every job end.
 *
 *   build/bench/bench_sched [QUEUED=1000] [USERS=20] [ITERS=2000]
 *
 * One device, held: nothing starts, so every queued job is ordered and
 * looked at, the worst case of a plan. Prints microseconds per plan.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "scheduler.h"

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

int main(int argc, char **argv)
{
    int nq = argc > 1 ? atoi(argv[1]) : 1000, nu = argc > 2 ? atoi(argv[2]) : 20;
    int iters = argc > 3 ? atoi(argv[3]) : 2000;
    if (nq < 1 || nu < 1 || iters < 1)
        return fprintf(stderr, "usage: bench_sched [QUEUED] [USERS] [ITERS]\n"), 2;
    sched_req *q = calloc((size_t)nq, sizeof *q);
    int *running = calloc((size_t)nu, sizeof *running), *devices = calloc((size_t)nu, sizeof *devices);
    if (q == NULL || running == NULL || devices == NULL)
        return fprintf(stderr, "bench_sched: out of memory\n"), 1;
    double t0 = now_us();
    for (int it = 0; it < iters; it++) {
        sched_dev d[1] = {{.kind = KERN_DEV_CPU, .busy = true}};
        for (int i = 0; i < nq; i++)
            q[i] = (sched_req){.want = 1, .submit = (uint64_t)i + 2, .user = i % nu, .user_last = (uint64_t)(i % nu)};
        sched_limits lim = {.max_running = 2, .nusers = nu, .running = running, .devices = devices};
        sched_plan_users(d, 1, q, nq, &lim);
    }
    printf("%d queued, %d users: %.1f us per plan (%d plans)\n", nq, nu, (now_us() - t0) / iters, iters);
    free(q);
    free(running);
    free(devices);
    return 0;
}
