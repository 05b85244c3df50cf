/* accumd-rank: one rank process of a job whose ranks are processes
 * (docs/multinode.md). Run under mpirun, one process per device:
 *
 *   mpirun -np W [--hostfile H] accumd-rank [options] SPEC.json
 *
 * Every process parses the same spec (paths resolved on its own host), sets
 * the job's world to W (the accumulation steps follow: a = B / (m W)),
 * checks that it can read the data (every rank's verdict is gathered, so
 * rank 0 reports the first host that cannot, by name), then runs its one
 * rank of the trainer over kern_comm_mpi. Rank 0 writes the events, one
 * JSON object per line, to --events (the launcher's end of the report) and
 * the checkpoints to --output, which must be the same directory on every
 * host (a shared filesystem: every rank resumes from it).
 *
 * Ending: a run that succeeds ends with MPI_Finalize and exit 0; any other
 * end (a failure, an out-of-memory that cannot adapt, SIGTERM / SIGINT =
 * cancel) writes rank 0's "done" line when this is rank 0, then
 * MPI_Abort, which ends every other rank at once: no rank is left waiting
 * in a collective for one that left. A rank killed outright (SIGKILL, a
 * crash) is seen by mpirun, which ends the others.
 *
 * --local N runs the same job as N rank threads in this one process over
 * shared memory, without MPI (the reference the tests compare against).
 * --inject-oom R:S:M is a test-only fault: rank R runs out of device memory
 * in step S while its micro batch is M.
 */
#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "batch_split.h"
#include "conf.h"
#include "err.h"
#include "job_train_cfg.h"
#include "kern_comm.h"
#include "kern_comm_mpi.h"
#include "kern_discover.h"
#include "tev_json.h"
#include "trainer.h"
#include "trainer_run.h"

typedef struct rank_args {
    const char *spec_path, *events_path, *output_dir;
    int local;            /* > 0: --local N, threads, no MPI */
    int cuda;             /* --cuda: one GPU per rank (CUDA builds), else CPU devices */
    int kernel_threads;
    uint64_t device_memory;
    int oom_rank, oom_step, oom_micro; /* --inject-oom, oom_rank < 0 = none */
    uint64_t bucket_bytes; /* --bucket-bytes: gradient bucket size (0 = the trainer's) */
    uint64_t host_memory;  /* --host-memory: host memory reserved for this process's ranks (0 = no limit) */
} rank_args;

typedef struct rank_prog {
    rank_args a;
    int rank, world;
    int ordinal;           /* --cuda: this process's GPU on its host */
    FILE *events;          /* rank 0 only, else NULL */
    pthread_mutex_t mu;    /* events lines (local mode: several threads) */
    int status;            /* TEV_DONE's */
    char msg[512];
    pthread_mutex_t run_mu; /* guards running: the signal thread vs trainer_free */
    trainer *running;
} rank_prog;

static void usage(void)
{
    fprintf(stderr, "usage: accumd-rank [--local N] [--cuda] [--events PATH] [--output DIR] "
                    "[--kernel-threads K] [--device-memory BYTES] [--bucket-bytes BYTES] [--inject-oom R:S:M] "
                    "[--host-memory BYTES] "
                    "SPEC.json\n");
}

static int parse_args(int argc, char **argv, rank_args *a)
{
    *a = (rank_args){.kernel_threads = 1, .oom_rank = -1};
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (k[0] != '-') {
            a->spec_path = k;
            continue;
        }
        if (v == NULL && strcmp(k, "--cuda"))
            return -1;
        i++;
        if (!strcmp(k, "--cuda")) {
            a->cuda = 1;
            i--; /* a flag: no value */
        } else if (!strcmp(k, "--local"))
            a->local = atoi(v);
        else if (!strcmp(k, "--events"))
            a->events_path = v;
        else if (!strcmp(k, "--output"))
            a->output_dir = v;
        else if (!strcmp(k, "--kernel-threads"))
            a->kernel_threads = atoi(v);
        else if (!strcmp(k, "--device-memory") && conf_parse_bytes(v, &a->device_memory) == 0)
            ;
        else if (!strcmp(k, "--bucket-bytes") && conf_parse_bytes(v, &a->bucket_bytes) == 0)
            ;
        else if (!strcmp(k, "--host-memory") && conf_parse_bytes(v, &a->host_memory) == 0)
            ;
        else if (!strcmp(k, "--inject-oom") &&
                 sscanf(v, "%d:%d:%d", &a->oom_rank, &a->oom_step, &a->oom_micro) == 3)
            ;
        else
            return -1;
    }
    return a->spec_path == NULL || a->kernel_threads < 1 ? -1 : 0;
}

static int inject_oom(void *ctx, int rank, int step, int micro, int m)
{
    const rank_args *a = ctx;
    (void)micro;
    return rank == a->oom_rank && step == a->oom_step && m == a->oom_micro;
}

/* ---- the events, rank 0 */

static void write_event(rank_prog *p, json_t *o)
{
    if (o == NULL)
        return;
    if (p->events != NULL) {
        char *line = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(17));
        pthread_mutex_lock(&p->mu);
        if (line != NULL && (fprintf(p->events, "%s\n", line) < 0 || fflush(p->events) != 0))
            fprintf(stderr, "accumd-rank: writing an event: %s\n", strerror(errno));
        pthread_mutex_unlock(&p->mu);
        free(line);
    }
    json_decref(o);
}

static void on_event(void *ctx, const train_event *ev)
{
    rank_prog *p = ctx;
    if (ev->kind == TEV_DONE) { /* the exit line is written once the run is joined */
        p->status = ev->status;
        snprintf(p->msg, sizeof p->msg, "%s", ev->msg);
        return;
    }
    write_event(p, tev_to_json(ev)); /* as a job's worker writes them (tev_json.h) */
}

static void write_done(rank_prog *p, const train_hooks *h)
{
    /* a trainer event's "done" (tev_json.h) with the run's counts */
    write_event(p, json_pack("{s:s,s:i,s:i,s:s,s:i,s:i,s:I,s:I}", "event", "done", "step", h->steps_done,
                             "status", p->status, "message", p->msg, "world", p->world, "steps",
                             h->steps_done, "allreduce_calls", (json_int_t)h->allreduce_calls,
                             "bucket_calls", (json_int_t)h->bucket_calls));
}

/* ---- the spec, the same on every rank */

static int load_spec(const rank_prog *p, train_cfg *s, acc_err *err)
{
    acc_conf conf;
    conf_defaults(&conf);
    /* the launcher (daemon or user) already applied its path policy */
    if (conf_set(&conf, "data_roots", "/", err) != 0 || conf_set(&conf, "output_root", "/", err) != 0 ||
        conf_finalize(&conf, err) != 0)
        return err->code;
    FILE *f = fopen(p->a.spec_path, "rb");
    if (f == NULL)
        return acc_err_set(err, ACC_EIO, "spec", "%s: %s", p->a.spec_path, strerror(errno));
    char *text = malloc(1 << 20);
    size_t n = text != NULL ? fread(text, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    if (text == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    job_spec *js = malloc(sizeof *js);
    int rc = js != NULL ? job_spec_parse(text, n, &conf, js, err) : acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    free(text);
    if (rc == 0)
        job_spec_train_cfg(js, s);
    free(js);
    if (rc != 0)
        return rc;
    if (p->a.output_dir != NULL)
        snprintf(s->output_dir, sizeof s->output_dir, "%s", p->a.output_dir);
    /* the world is the launcher's: the same effective batch and micro
     * batch, the accumulation steps by batch_split's rule (a split that
     * does not exist at this world is left for trainer_check_spec to refuse) */
    s->devices = p->world;
    batch_split split;
    const batch_given given = {.B = s->train_batch_size, .m = s->micro_batch};
    if (!s->micro_auto && s->micro_batch > 0 && batch_split_resolve(&given, p->world, INT_MAX, &split, NULL) == 0)
        s->accum_steps = split.a;
    return 0;
}

/* Every rank checks what it must read on its own host (`rc` is how its
 * spec went); rank 0 learns the first rank that cannot and fails the job
 * with its host and message; every rank learns the verdict, so all stop
 * or none. Every rank makes the same two calls, whatever failed before. */
static int check_everywhere(rank_prog *p, const train_cfg *s, int rc, acc_err *err)
{
    enum { MSG = 768 };
    char mine[MSG] = "";
    if (rc != 0 || trainer_check_spec(s, err) != 0) {
        char host[128] = "?";
        gethostname(host, sizeof host - 1);
        snprintf(mine, sizeof mine, "rank %d on %s: %.600s", p->rank, host, err->msg);
    }
    char *all = p->rank == 0 ? calloc((size_t)p->world, MSG) : NULL;
    int bad = mine[0] != '\0' || (p->rank == 0 && all == NULL), any = 0;
    int mrc = MPI_Gather(mine, MSG, MPI_CHAR, all, MSG, MPI_CHAR, 0, MPI_COMM_WORLD);
    int arc = MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    const char *first = NULL;
    for (int r = 0; all != NULL && mrc == MPI_SUCCESS && r < p->world && first == NULL; r++)
        if (all[(size_t)r * MSG] != '\0')
            first = all + (size_t)r * MSG;
    if (mrc != MPI_SUCCESS || arc != MPI_SUCCESS)
        rc = acc_err_set(err, ACC_EDEVICE, "", "the start-up checks' collectives failed");
    else if (any)
        rc = acc_err_set(err, ACC_EINVAL, "data", "%.700s",
                         first != NULL ? first : mine[0] ? mine : "another rank failed its start-up check");
    else
        rc = 0;
    free(all);
    return rc;
}

/* ---- cancel: SIGTERM / SIGINT (mpirun forwards them to every rank) */

static void *signal_thread(void *arg)
{
    rank_prog *p = arg;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    for (;;) {
        int sig;
        if (sigwait(&set, &sig) != 0)
            continue;
        pthread_mutex_lock(&p->run_mu);
        if (p->running == NULL)
            _exit(128 + sig); /* not training: nothing to stop cleanly */
        trainer_cancel(p->running);
        pthread_mutex_unlock(&p->run_mu);
    }
    return NULL;
}

/* The job's devices as the trainer sees them: CPU slices, or (--cuda) GPU
 * `first + r` for rank r of this process (a rank process: its one GPU in
 * every entry, which is all the trainer reads of the others'). */
static int job_devices(const rank_prog *p, int first, int one, kern_device_info *devs, acc_err *err)
{
    for (int r = 0; r < p->world; r++) {
        devs[r] = (kern_device_info){.kind = KERN_DEV_CPU, .index = r, .mem_total = p->a.device_memory};
        snprintf(devs[r].name, sizeof devs[r].name, "cpu%d", r);
    }
    if (!p->a.cuda)
        return 0;
#ifdef ACCUMD_HAVE_CUDA
    kern_device_info gpus[KERN_MAX_DEVICES];
    int n = 0;
    int rc = kern_cuda_query(gpus, KERN_MAX_DEVICES, &n, err);
    if (rc != 0)
        return rc;
    for (int r = 0; r < p->world; r++) {
        int g = one ? first : first + r;
        if (g >= n)
            return acc_err_set(err, ACC_EDEVICE, "devices", "rank %d wants GPU %d, this host has %d",
                               one ? p->rank : r, g, n);
        devs[r] = gpus[g];
    }
    return 0;
#else
    (void)first;
    (void)one;
    return acc_err_set(err, ACC_EDEVICE, "devices", "--cuda: this accumd-rank was built without CUDA");
#endif
}

/* --cuda: this process's GPU is its rank among the ranks of its host. */
static int local_rank(acc_err *err, int *out)
{
    MPI_Comm host;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host) != MPI_SUCCESS)
        return acc_err_set(err, ACC_EDEVICE, "", "MPI_Comm_split_type failed");
    int rc = MPI_Comm_rank(host, out);
    MPI_Comm_free(&host);
    return rc == MPI_SUCCESS ? 0 : acc_err_set(err, ACC_EDEVICE, "", "MPI_Comm_rank failed");
}

static int run_job(rank_prog *p, kern_comm *comm, const train_cfg *s, train_hooks *h, acc_err *err)
{
    kern_device_info devs[TRAIN_MAX_RANKS];
    int rc = job_devices(p, p->ordinal, 1, devs, err);
    if (rc != 0)
        return rc;
    trainer_opts o = {.spec = s, .devices = devs, .threads_per_device = p->a.kernel_threads,
                      .on_event = on_event, .event_ctx = p, .comm = comm, .rank = p->rank,
                      .host_budget = p->a.host_memory};
    trainer *t;
    rc = trainer_start_hooked(&o, h, &t, err);
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&p->run_mu);
    p->running = t;
    pthread_mutex_unlock(&p->run_mu);
    trainer_wait(t);
    pthread_mutex_lock(&p->run_mu);
    p->running = NULL;
    pthread_mutex_unlock(&p->run_mu);
    trainer_free(t);
    if (p->status != 0)
        return acc_err_set(err, p->status, "", "%s", p->msg);
    return 0;
}

static int open_events(rank_prog *p, acc_err *err)
{
    if (p->rank != 0 || p->a.events_path == NULL)
        return 0;
    p->events = strcmp(p->a.events_path, "-") ? fopen(p->a.events_path, "w") : stdout;
    if (p->events == NULL)
        return acc_err_set(err, ACC_EIO, "events", "%s: %s", p->a.events_path, strerror(errno));
    return 0;
}

/* The job in this process: world, spec, check, run. */
static int rank_program(rank_prog *p, kern_comm *comm, acc_err *err)
{
    train_cfg *s = calloc(1, sizeof *s);
    if (s == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of memory");
    train_hooks h = {.inject_oom = p->a.oom_rank >= 0 ? inject_oom : NULL, .oom_ctx = &p->a,
                     .bucket_bytes = (size_t)p->a.bucket_bytes};
    int rc = open_events(p, err);
    if (rc == 0 && p->world > TRAIN_MAX_RANKS)
        rc = acc_err_set(err, ACC_EINVAL, "devices", "%d ranks (at most %d)", p->world, TRAIN_MAX_RANKS);
    if (rc == 0)
        rc = load_spec(p, s, err);
    if (comm != NULL) /* all ranks reach the check, whatever their spec said */
        rc = check_everywhere(p, s, rc, err);
    if (rc == 0)
        rc = comm != NULL ? run_job(p, comm, s, &h, err) : 0;
    if (rc == 0 && comm == NULL) { /* --local: the threads over shared memory */
        kern_device_info devs[TRAIN_MAX_RANKS];
        rc = job_devices(p, 0, 0, devs, err);
        trainer_opts o = {.spec = s, .devices = devs, .threads_per_device = p->a.kernel_threads,
                          .on_event = on_event, .event_ctx = p, .host_budget = p->a.host_memory};
        if (rc == 0)
            rc = trainer_run_sync(&o, &h, err);
    }
    if (rc != 0) {
        p->status = rc;
        snprintf(p->msg, sizeof p->msg, "%.100s%s%.380s", err->field, err->field[0] ? ": " : "", err->msg);
    }
    write_done(p, &h);
    free(s);
    return rc;
}

int main(int argc, char **argv)
{
    rank_prog p = {0};
    if (parse_args(argc, argv, &p.a) != 0) {
        usage();
        return 2;
    }
    pthread_mutex_init(&p.mu, NULL);
    pthread_mutex_init(&p.run_mu, NULL);
    acc_err err = {0};
    int rc;
    if (p.a.local > 0) {
        p.world = p.a.local;
        rc = rank_program(&p, NULL, &err);
        if (rc != 0)
            fprintf(stderr, "accumd-rank: %s\n", p.msg);
        return rc == 0 ? 0 : 1;
    }
    /* blocked here, before MPI starts its threads, so the signal thread alone takes them */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    int provided = 0;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "accumd-rank: MPI_Init_thread failed\n");
        return 1;
    }
    pthread_t sig;
    if (pthread_create(&sig, NULL, signal_thread, &p) == 0)
        pthread_detach(sig);
    kern_comm *comm = NULL;
    rc = provided < MPI_THREAD_SERIALIZED
             ? acc_err_set(&err, ACC_EDEVICE, "", "this MPI gives no MPI_THREAD_SERIALIZED")
             : !p.a.cuda ? kern_comm_mpi_open(&comm, &p.rank, &p.world, &err)
             : local_rank(&err, &p.ordinal) != 0 ? err.code
             : kern_comm_mpi_open_nccl(p.ordinal, &comm, &p.rank, &p.world, &err);
    if (rc == 0)
        rc = rank_program(&p, comm, &err);
    else
        fprintf(stderr, "accumd-rank: %s\n", err.msg);
    if (rc != 0) {
        if (p.msg[0] != '\0')
            fprintf(stderr, "accumd-rank: rank %d: %s\n", p.rank, p.msg);
        if (p.events != NULL && p.events != stdout)
            fclose(p.events);
        MPI_Abort(MPI_COMM_WORLD, 1); /* ends every other rank now */
        return 1;
    }
    kern_comm_destroy(comm);
    if (p.events != NULL && p.events != stdout)
        fclose(p.events);
    MPI_Finalize();
    return 0;
}
