/* worker_proto: what the daemon and a job's worker process say to each other.
 *
 * The worker is the daemon's own executable in a hidden mode,
 *
 *   accumd --worker JOB_ID DAEMON_PID
 *
 * started by the daemon (daemon/worker.c, daemon/wproc.h) with one end of a
 * socketpair as its descriptor WK_FD. Down that channel the daemon first
 * writes one wk_init (binary: both ends are the same build, which `size`
 * and `magic` check), then control lines: "cancel\n", "preempt\n". Up it,
 * the worker writes one JSON object per line: the trainer's events
 * (tev_json.h), a {"event":"heartbeat"} every heartbeat_ms, and last the
 * run's "done" event, after which it exits 0.
 *
 * A worker that exits without a "done" line crashed, was killed, or could
 * not start (exit status WK_EXIT_SETUP: deterministic, never restarted).
 *
 * Rank mode (a job with "nodes" > 1, or the config's rank_processes): the
 * worker runs no trainer itself but `mpi_launcher -np WORLD [--hostfile H]
 * MPI_ARGS... rank_program --events - --output DIR ... SPEC` (accumd-rank,
 * daemon/rank_main.c) on the job's spec with its paths resolved, relays
 * rank 0's event lines from the launcher's stdout, and turns cancel and
 * preempt into SIGTERM to the launcher (which forwards it to every rank).
 * A launcher that ends without rank 0's "done" (a rank killed, a host
 * lost) is exit status WK_EXIT_RANKS. A progress watchdog ends a run whose
 * rank 0 reports nothing (no step, no other event) for
 * max(watchdog_min_s, watchdog_factor x the mean step time so far) -- a
 * stopped or hung rank holds every other in a collective while the
 * worker's heartbeats go on -- by killing the launcher and every process
 * under it: exit status WK_EXIT_WATCHDOG. A run paused for disk space
 * (TRAIN_PAUSED_PREFIX) is not watched until its next event.
 * A single-node run (nodes <= 1) gets no hostfile; its launcher runs in a
 * network namespace of its own holding only a loopback (else, where one
 * cannot be made, on the host's with loopback-only MCA settings), so no
 * MPI port is reachable from outside the job; a multi-node one is given
 * mpi_interface as btl_tcp_if_include / oob_tcp_if_include.
 * The worker dies with the daemon (PR_SET_PDEATHSIG) and ignores SIGTERM
 * and SIGINT: the daemon alone tells it to stop.
 *
 * ACCUMD_TEST_FAULT (test-only fault hook, read by the worker only):
 * "NAME:KIND:STEP[:ATTEMPTS]" entries, comma-separated; the worker of a job
 * named NAME, on its first ATTEMPTS starts (all when omitted), when step
 * STEP completes and before reporting it: segv (killed by SIGSEGV), abort
 * (SIGABRT), exit (exits with status 7), hang (stops training and sending
 * heartbeats).
 */
#ifndef ACC_WORKER_PROTO_H
#define ACC_WORKER_PROTO_H

#include <stdint.h>

#include "job_spec.h"
#include "kern_discover.h"
#include "trainer.h"

#define WK_FD 3
#define WK_MAGIC 0x61636377u /* "accw" */
#define WK_EXIT_SETUP 3      /* the worker could not start: no restart */
#define WK_EXIT_FAULT 7      /* the test fault hook's "exit" */
#define WK_EXIT_RANKS 5      /* rank mode: the launcher ended without rank 0's report */
#define WK_EXIT_WATCHDOG 6   /* rank mode: no progress within the watchdog's bound; every rank killed */
#define WK_MAX_SPEC (1u << 20)
#define WK_MAX_LINE (1u << 20) /* an event line longer than this is a protocol error */

typedef struct wk_init {
    uint32_t magic;
    uint32_t size;           /* sizeof(wk_init) */
    int ndev;
    int threads_per_device;
    int checkpoint_keep;
    int heartbeat_ms;
    int attempt;             /* earlier workers of this job that died (the fault hook's count) */
    kern_device_info devices[TRAIN_MAX_RANKS];
    job_spec spec;
    /* rank processes (docs/multinode.md): world ranks under the launcher */
    bool rank_mode;
    int world;
    char mpi_launcher[PATH_MAX], hostfile[PATH_MAX], mpi_args[2048], rank_program[PATH_MAX];
    /* rank mode's watchdog and network (issue 25; docs/multinode.md) */
    int watchdog_factor, watchdog_min_s;
    char mpi_interface[256];
    uint32_t spec_json_len;  /* then this many bytes: the spec as submitted (rank mode) */
    /* host memory reserved for the job (its ranks here); rank mode: each
     * rank process gets host_per_rank (accumd-rank --host-memory); 0 = none */
    uint64_t host_budget, host_per_rank;
} wk_init;

/* The worker's main (daemon/worker_main.c); argv as above. */
int worker_main(int argc, char **argv);

#endif
