/* worker_main: a job's worker process (worker_proto.h). Reads its wk_init,
 * runs the job's rank threads (trainer.h) and reports their events up the
 * channel; a reader thread takes the daemon's control lines, a heartbeat
 * thread says it is alive. The main thread waits for the run's end, joins
 * the trainer, writes the "done" line and exits 0. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "fsutil.h"
#include "tev_json.h"
#include "job_train_cfg.h"
#include "worker_proto.h"
#include "wproc.h"

enum wk_fault_kind { FAULT_NONE, FAULT_SEGV, FAULT_ABORT, FAULT_EXIT, FAULT_HANG };

typedef struct worker {
    const char *job_id;
    wk_init *init;
    pthread_mutex_t wmu;       /* one line at a time on the channel */
    pthread_mutex_t mu;        /* tr, pending, done */
    pthread_cond_t cv;
    trainer *tr;
    pid_t ranks;               /* rank mode: the MPI launcher, while it runs */
    char *spec_json;           /* rank mode: the spec as submitted */
    bool cancel_pending, preempt_pending; /* asked before the trainer existed */
    bool done;
    train_event *done_ev;
    atomic_bool hung;          /* the fault hook's hang: no more heartbeats */
    /* rank mode's watchdog (under mu): when rank 0 last reported anything,
     * its step events' times, a pause for disk space, the watchdog's verdict */
    double last_heard, first_step_at, last_step_at;
    int steps_seen, last_step;
    bool paused, watchdog_fired;
    char watchdog_msg[256];
    enum wk_fault_kind fault;
    int fault_step;
} worker;

static void say(const worker *w, const char *fmt, const char *detail)
{
    fprintf(stderr, "accumd worker %s[%d]: ", w->job_id, (int)getpid());
    fprintf(stderr, fmt, detail);
    fputc('\n', stderr);
}

/* ---- the channel */

/* One object as a line; a channel that is gone means the daemon is: stop. */
static void send_json(worker *w, json_t *o)
{
    char *text = o != NULL ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(o);
    if (text == NULL) {
        say(w, "out of memory for an event%s", "");
        return;
    }
    size_t n = strlen(text);
    pthread_mutex_lock(&w->wmu);
    int rc = fsu_write_all(WK_FD, text, n, NULL);
    if (rc == 0)
        rc = fsu_write_all(WK_FD, "\n", 1, NULL);
    pthread_mutex_unlock(&w->wmu);
    free(text);
    if (rc != 0) {
        say(w, "the daemon's channel is gone (%s); exiting", strerror(errno));
        _exit(WK_EXIT_SETUP);
    }
}

/* ---- the test-only fault hook (worker_proto.h) */

static void parse_fault(worker *w)
{
    const char *env = getenv("ACCUMD_TEST_FAULT");
    if (env == NULL)
        return;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", env);
    char *save = NULL;
    for (char *e = strtok_r(buf, ",", &save); e != NULL; e = strtok_r(NULL, ",", &save)) {
        char name[128] = "", kind[16] = "";
        int step = 0, attempts = -1;
        int n = sscanf(e, "%127[^:]:%15[^:]:%d:%d", name, kind, &step, &attempts);
        if (n < 3 || strcmp(name, w->init->spec.name) != 0 || (attempts >= 0 && w->init->attempt >= attempts))
            continue;
        w->fault = !strcmp(kind, "segv")    ? FAULT_SEGV
                   : !strcmp(kind, "abort") ? FAULT_ABORT
                   : !strcmp(kind, "exit")  ? FAULT_EXIT
                   : !strcmp(kind, "hang")  ? FAULT_HANG
                                            : FAULT_NONE;
        w->fault_step = step;
        return;
    }
}

static void fault_now(worker *w)
{
    say(w, "ACCUMD_TEST_FAULT: injecting the fault%s", "");
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    switch (w->fault) {
    case FAULT_SEGV:
        /* the default action, as a wild pointer gets it: a sanitizer's
         * handler would turn it into an abort */
        signal(SIGSEGV, SIG_DFL);
        raise(SIGSEGV);
        break;
    case FAULT_ABORT:
        abort();
    case FAULT_EXIT:
        _exit(WK_EXIT_FAULT);
    case FAULT_HANG:
        atomic_store(&w->hung, true);
        for (;;)
            pause();
    case FAULT_NONE:
        break;
    }
}

/* ---- the trainer's events */

static void on_event(void *ctx, const train_event *ev)
{
    worker *w = ctx;
    if (ev->kind == TEV_STEP && w->fault != FAULT_NONE && ev->step == w->fault_step)
        fault_now(w);
    if (ev->kind != TEV_DONE) {
        send_json(w, tev_to_json(ev));
        return;
    }
    /* written by the main thread once the trainer is joined */
    pthread_mutex_lock(&w->mu);
    *w->done_ev = *ev;
    w->done = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void *heartbeat_thread(void *arg)
{
    worker *w = arg;
    struct timespec ts = {w->init->heartbeat_ms / 1000, (long)(w->init->heartbeat_ms % 1000) * 1000000L};
    for (;;) {
        if (!atomic_load(&w->hung))
            send_json(w, json_pack("{s:s}", "event", "heartbeat"));
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* Control lines from the daemon; its end of the channel closing means it
 * is going: the run is cancelled (PR_SET_PDEATHSIG ends us anyway). */
static void *reader_thread(void *arg)
{
    worker *w = arg;
    char line[64];
    size_t n = 0;
    for (;;) {
        char c;
        ssize_t k = read(WK_FD, &c, 1);
        if (k < 0 && errno == EINTR)
            continue;
        bool eof = k <= 0;
        if (!eof && c != '\n') {
            if (n < sizeof line - 1)
                line[n++] = c;
            continue;
        }
        line[n] = '\0';
        n = 0;
        bool cancel = eof || !strcmp(line, "cancel"), preempt = !eof && !strcmp(line, "preempt");
        pthread_mutex_lock(&w->mu);
        if (w->tr != NULL && cancel)
            trainer_cancel(w->tr);
        else if (w->tr != NULL && preempt)
            trainer_preempt(w->tr);
        else if (w->ranks > 0 && (cancel || preempt)) /* forwarded to every rank: each stops */
            kill(w->ranks, SIGTERM);
        w->cancel_pending |= cancel;
        w->preempt_pending |= preempt;
        pthread_mutex_unlock(&w->mu);
        if (eof)
            return NULL;
    }
}

/* ---- rank mode: the ranks are processes under the MPI launcher */

/* Set obj[key] to a resolved path when the spec has one. */
static int set_path(json_t *root, const char *section, const char *key, const char *path)
{
    if (path[0] == '\0')
        return 0;
    json_t *obj = section ? json_object_get(root, section) : root;
    if (obj == NULL && section != NULL) {
        obj = json_object();
        if (obj == NULL || json_object_set_new(root, section, obj) != 0)
            return -1;
    }
    return json_object_set_new(obj, key, json_string(path));
}

/* The spec as submitted, its paths replaced by the daemon's resolved ones
 * (accumd-rank opens them as given, on every host), in output_dir. */
static int write_rank_spec(worker *w, char *path, size_t n)
{
    const job_spec *s = &w->init->spec;
    json_t *root = json_loadb(w->spec_json, w->init->spec_json_len, 0, NULL);
    int rc = root == NULL || !json_is_object(root) ? -1 : 0;
    if (rc == 0)
        rc = set_path(root, "data", "train", s->data.train) | set_path(root, "data", "val", s->data.val) |
             set_path(root, "model", "init_from", s->model.init_from) | set_path(root, "model", "from", s->model.from) |
             set_path(root, NULL, "resume_from", s->resume_from) |
             set_path(root, NULL, "deepspeed", s->deepspeed_file); /* h-dsconf: the file as resolved */
    if (rc == 0 && s->data.dataset[0] != '\0') { /* h-dsconf: the hub split as the files it resolved to */
        json_t *d = json_object_get(root, "data");
        static const char *const hub[] = {"dataset", "subset", "split", "data_files", NULL};
        for (int i = 0; d != NULL && hub[i] != NULL; i++)
            json_object_del(d, hub[i]);
        json_object_del(root, "dataset_name");
        json_object_del(root, "dataset_config_name");
    }
    if (rc == 0 && s->model.from[0] != '\0')
        json_object_del(root, "model_name_or_path"); /* h-dsconf: model.from holds it resolved */
    if (rc == 0 && s->data.tokenizer[0] != '\0' && json_object_get(json_object_get(root, "data"), "tokenizer"))
        rc = set_path(root, "data", "tokenizer", s->data.tokenizer);
    int k = snprintf(path, n, "%s/rank-spec.json", s->output_dir);
    if (rc == 0 && (k < 0 || (size_t)k >= n))
        rc = -1;
    if (rc == 0)
        rc = json_dump_file(root, path, JSON_COMPACT);
    json_decref(root);
    return rc;
}

enum { MAX_ARGS = 96 };

static bool single_node(const wk_init *in) { return in->spec.nodes <= 1; }

/* Does the blank-separated `args` set MCA parameter `key` (--mca / -mca
 * / --gmca KEY VALUE)? */
static bool names_mca(const char *args, const char *key)
{
    char buf[sizeof ((wk_init *)0)->mpi_args];
    snprintf(buf, sizeof buf, "%s", args);
    bool after_flag = false;
    for (char *save = NULL, *t = strtok_r(buf, " \t", &save); t != NULL; t = strtok_r(NULL, " \t", &save)) {
        if (after_flag && !strcmp(t, key))
            return true;
        after_flag = !strcmp(t, "--mca") || !strcmp(t, "-mca") || !strcmp(t, "--gmca") || !strcmp(t, "-gmca");
    }
    return false;
}

static int write_text(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = write(fd, text, strlen(text));
    close(fd);
    return n == (ssize_t)strlen(text) ? 0 : -1;
}

/* The calling process into a network namespace of its own whose only
 * interface is its loopback, brought up: with CAP_SYS_ADMIN directly,
 * else inside a user namespace mapping only our own uid and gid (the
 * capabilities it grants end at exec). 0, or -1 with errno. */
static int private_network(void)
{
    uid_t uid = getuid();
    gid_t gid = getgid();
    if (unshare(CLONE_NEWNET) != 0) {
        char map[64];
        if (unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0)
            return -1;
        snprintf(map, sizeof map, "%u %u 1\n", (unsigned)uid, (unsigned)uid);
        if (write_text("/proc/self/uid_map", map) != 0 || write_text("/proc/self/setgroups", "deny") != 0)
            return -1;
        snprintf(map, sizeof map, "%u %u 1\n", (unsigned)gid, (unsigned)gid);
        if (write_text("/proc/self/gid_map", map) != 0)
            return -1;
    }
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
    int rc = s >= 0 && ioctl(s, SIOCGIFFLAGS, &ifr) == 0 ? 0 : -1;
    if (rc == 0) {
        ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
        rc = ioctl(s, SIOCSIFFLAGS, &ifr);
    }
    int e = errno;
    if (s >= 0)
        close(s);
    errno = e;
    return rc;
}

/* launcher -np W [--hostfile H] mpi_args... rank_program options spec; the
 * strings live in `store` and `num`, the caller's */
static int rank_argv(worker *w, const char *spec, char *store, size_t n, char num[4][32], char **argv)
{
    const wk_init *in = w->init;
    int c = 0;
    snprintf(num[0], 32, "%d", in->world);
    snprintf(num[1], 32, "%d", in->threads_per_device);
    snprintf(num[2], 32, "%llu", (unsigned long long)in->devices[0].mem_total);
    snprintf(num[3], 32, "%llu", (unsigned long long)in->host_per_rank); /* each rank process's reservation */
    argv[c++] = (char *)in->mpi_launcher;
    argv[c++] = "-np";
    argv[c++] = num[0];
    bool single = single_node(in);
    if (in->hostfile[0] != '\0' && !single) { /* a single-node job's ranks are all here */
        argv[c++] = "--hostfile";
        argv[c++] = (char *)in->hostfile;
    }
    /* the network: loopback on one node, mpi_interface across nodes;
     * mpi_args naming a parameter keeps its value (Open MPI refuses a
     * parameter given twice) */
    const char *iface = single ? "lo" : in->mpi_interface;
    const char *net[][2] = {{"btl", single ? "self,vader" : ""},
                            {"btl_tcp_if_include", iface},
                            {"oob_tcp_if_include", iface}};
    for (size_t i = 0; i < sizeof net / sizeof net[0]; i++)
        if (net[i][1][0] != '\0' && !names_mca(in->mpi_args, net[i][0])) {
            argv[c++] = "--mca";
            argv[c++] = (char *)net[i][0];
            argv[c++] = (char *)net[i][1];
        }
    snprintf(store, n, "%s", in->mpi_args);
    for (char *save = NULL, *t = strtok_r(store, " \t", &save); t != NULL; t = strtok_r(NULL, " \t", &save)) {
        if (c >= MAX_ARGS - 16)
            return -1;
        argv[c++] = t;
    }
    argv[c++] = (char *)in->rank_program;
    if (in->devices[0].kind == KERN_DEV_CUDA)
        argv[c++] = "--cuda";
    const char *tail[] = {"--events", "-", "--output", in->spec.output_dir, "--kernel-threads", num[1],
                          "--device-memory", num[2], "--host-memory", num[3], spec};
    for (size_t i = 0; i < sizeof tail / sizeof tail[0]; i++)
        argv[c++] = (char *)tail[i];
    argv[c] = NULL;
    return 0;
}

/* The launcher, forked; a single-node one in a network namespace of its
 * own. *isolated (set before the launcher runs): 1 it is, 0 it could not
 * be (errno in *why), -1 not asked (multi-node). */
static pid_t start_launcher(worker *w, char **argv, int out_fd, int *isolated, int *why)
{
    int st[2];
    *isolated = -1;
    *why = 0;
    if (pipe2(st, O_CLOEXEC) != 0)
        return -1;
    pid_t pid = fork();
    if (pid != 0) {
        close(st[1]);
        int res[2] = {-1, 0};
        if (pid > 0 && single_node(w->init)) { /* its verdict, written before its exec */
            ssize_t k;
            while ((k = read(st[0], res, sizeof res)) < 0 && errno == EINTR)
                ;
            *isolated = k == (ssize_t)sizeof res ? res[0] : 0;
            *why = res[1];
        }
        close(st[0]);
        return pid;
    }
    /* the child: dies with this worker, gets the signals back we ignore */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int sigs[] = {SIGTERM, SIGINT, SIGHUP, SIGPIPE, SIGXFSZ};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        signal(sigs[i], SIG_DFL);
    if (single_node(w->init)) {
        int res[2] = {private_network() == 0, 0};
        res[1] = res[0] ? 0 : errno;
        if (write(st[1], res, sizeof res) != (ssize_t)sizeof res)
            _exit(127);
    }
    if (dup2(out_fd, 1) < 0)
        _exit(127);
    execvp(argv[0], argv);
    _exit(127);
}

/* ---- rank mode's progress watchdog */

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A line of rank 0: progress. Steps time the expected step; a pause for
 * disk space holds the watchdog until the next line. */
static void heard(worker *w, const train_event *ev)
{
    double now = mono_s();
    pthread_mutex_lock(&w->mu);
    w->last_heard = now;
    w->paused = ev != NULL && ev->kind == TEV_LOG && !strncmp(ev->msg, TRAIN_PAUSED_PREFIX, strlen(TRAIN_PAUSED_PREFIX));
    if (ev != NULL && ev->kind == TEV_STEP) {
        if (w->steps_seen++ == 0)
            w->first_step_at = now;
        w->last_step_at = now;
        w->last_step = ev->step;
    }
    pthread_mutex_unlock(&w->mu);
}

/* Seconds of silence allowed now (under mu). */
static double watchdog_bound(const worker *w)
{
    double bound = (double)w->init->watchdog_min_s;
    if (w->steps_seen >= 2) {
        double mean = (w->last_step_at - w->first_step_at) / (w->steps_seen - 1);
        if (w->init->watchdog_factor * mean > bound)
            bound = w->init->watchdog_factor * mean;
    }
    return bound;
}

/* SIGKILL to `root` and every process under it (its children's children
 * too: Open MPI puts each rank in a process group of its own), found
 * through /proc; a process stopped with SIGSTOP dies all the same. */
static void kill_tree(pid_t root)
{
    enum { MAXP = 4096 };
    static pid_t pids[MAXP], ppids[MAXP];
    int n = 0;
    DIR *d = opendir("/proc");
    for (struct dirent *e; d != NULL && n < MAXP && (e = readdir(d)) != NULL;) {
        char path[300], st[512];
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        ssize_t k = fd >= 0 ? read(fd, st, sizeof st - 1) : -1;
        if (fd >= 0)
            close(fd);
        if (k <= 0)
            continue;
        st[k] = '\0';
        const char *rp = strrchr(st, ')');
        int ppid;
        if (rp != NULL && sscanf(rp + 1, " %*c %d", &ppid) == 1) {
            pids[n] = (pid_t)atoi(e->d_name);
            ppids[n++] = (pid_t)ppid;
        }
    }
    if (d != NULL)
        closedir(d);
    /* breadth first from root; `mark` as ppids[i] = 0 once taken */
    pid_t todo[MAXP];
    int head = 0, tail = 0;
    todo[tail++] = root;
    while (head < tail) {
        pid_t p = todo[head++];
        kill(p, SIGKILL);
        for (int i = 0; i < n && tail < MAXP; i++)
            if (ppids[i] == p) {
                ppids[i] = 0;
                todo[tail++] = pids[i];
            }
    }
}

static void *watchdog_thread(void *arg)
{
    worker *w = arg;
    for (;;) {
        struct timespec ts = {1, 0};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&w->mu);
        double silent = mono_s() - w->last_heard, bound = watchdog_bound(w);
        bool fire = w->ranks > 0 && !w->paused && !w->cancel_pending && !w->preempt_pending && silent > bound;
        pid_t ranks = w->ranks;
        if (ranks <= 0 || w->done) {
            pthread_mutex_unlock(&w->mu);
            return NULL;
        }
        if (fire) {
            w->watchdog_fired = true;
            snprintf(w->watchdog_msg, sizeof w->watchdog_msg,
                     "rank watchdog: rank 0 reported nothing for %.0f s after step %d (bound %.0f s: "
                     "max(rank_watchdog_min %d s, rank_watchdog_factor %d x mean step time)); every rank "
                     "process killed",
                     silent, w->last_step, bound, w->init->watchdog_min_s,
                     w->init->watchdog_factor);
            kill_tree(ranks); /* under mu: w->ranks is still that launcher, not yet reaped */
        }
        pthread_mutex_unlock(&w->mu);
        if (fire) {
            say(w, "%s", w->watchdog_msg);
            return NULL;
        }
    }
}

/* Rank 0's lines from the launcher's stdout: events up, the done kept. */
static void relay(worker *w, FILE *in)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, in)) > 0) {
        json_t *o = json_loadb(line, (size_t)n, 0, NULL);
        const char *kind = json_string_value(json_object_get(o, "event"));
        train_event *ev = malloc(sizeof *ev);
        acc_err err = {0};
        if (kind == NULL || ev == NULL || tev_from_json(o, ev, &err) != 0) {
            fprintf(stderr, "accumd worker %s: rank output: %.*s", w->job_id, (int)n, line);
        } else if (ev->kind == TEV_DONE) {
            pthread_mutex_lock(&w->mu);
            *w->done_ev = *ev;
            w->done = true;
            pthread_mutex_unlock(&w->mu);
        } else {
            heard(w, ev);
            send_json(w, tev_to_json(ev));
        }
        free(ev);
        json_decref(o);
    }
    free(line);
}

static int run_ranks(worker *w)
{
    char spec[PATH_MAX + 32], store[sizeof w->init->mpi_args], num[4][32];
    char *argv[MAX_ARGS];
    int fds[2];
    if (write_rank_spec(w, spec, sizeof spec) != 0 || rank_argv(w, spec, store, sizeof store, num, argv) != 0 ||
        pipe2(fds, O_CLOEXEC) != 0) {
        say(w, "cannot prepare the rank processes' spec and command%s", "");
        return -1;
    }
    int isolated = -1, why = 0;
    pthread_mutex_lock(&w->mu);
    pid_t pid = w->cancel_pending || w->preempt_pending ? -1 : start_launcher(w, argv, fds[1], &isolated, &why);
    w->ranks = pid;
    w->last_heard = mono_s();
    pthread_mutex_unlock(&w->mu);
    close(fds[1]);
    if (pid > 0 && isolated == 0) {
        char msg[400];
        snprintf(msg, sizeof msg, "the rank processes could not get a network namespace of their own (%s): they "
                 "run on the host's, MPI's transports limited to loopback, but Open MPI's launcher listens on "
                 "every interface", strerror(why));
        say(w, "%s", msg);
        send_json(w, json_pack("{s:s, s:i, s:s}", "event", "log", "step", 0, "message", msg));
    }
    pthread_t wd;
    bool wd_on = pid > 0 && pthread_create(&wd, NULL, watchdog_thread, w) == 0;
    if (pid > 0 && !wd_on)
        say(w, "cannot start the rank watchdog%s", "");
    if (pid < 0) { /* cancelled before it started, or fork failed */
        close(fds[0]);
        *w->done_ev = (train_event){.kind = TEV_DONE, .status = w->cancel_pending ? ACC_ECANCELLED : ACC_EINTERNAL};
        snprintf(w->done_ev->msg, sizeof w->done_ev->msg, "%s",
                 w->cancel_pending ? "cancelled before the ranks started" : "cannot start the MPI launcher");
        send_json(w, tev_to_json(w->done_ev));
        return 0;
    }
    FILE *in = fdopen(fds[0], "r");
    if (in != NULL)
        relay(w, in);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    pthread_mutex_lock(&w->mu);
    w->ranks = 0; /* the watchdog's sign to end (within its 1 s tick): joined before w->init goes */
    pthread_mutex_unlock(&w->mu);
    if (wd_on)
        pthread_join(wd, NULL);
    pthread_mutex_lock(&w->mu);
    bool fired = w->watchdog_fired;
    /* rank 0 "cancelled" without our asking: mpirun stopped it because
     * another rank died; that is a lost rank, not a cancel */
    bool asked = w->cancel_pending || w->preempt_pending;
    bool done = w->done && (w->done_ev->status != ACC_ECANCELLED || asked);
    pthread_mutex_unlock(&w->mu);
    if (in != NULL)
        fclose(in);
    else
        close(fds[0]);
    if (!done && asked) { /* we stopped them: mpirun may end them before rank 0 says so */
        *w->done_ev = (train_event){.kind = TEV_DONE, .step = w->done_ev->step, .status = ACC_ECANCELLED};
        snprintf(w->done_ev->msg, sizeof w->done_ev->msg, "the rank processes were stopped");
        done = true;
    }
    if (done && !fired) {
        send_json(w, tev_to_json(w->done_ev));
        return 0;
    }
    if (fired) { /* the daemon fails or requeues the job (max_restarts) */
        send_json(w, json_pack("{s:s, s:i, s:s}", "event", "log", "step", w->last_step, "message", w->watchdog_msg));
        exit(WK_EXIT_WATCHDOG);
    }
    char msg[160];
    snprintf(msg, sizeof msg, "%s ended (%s %d) without rank 0's report of the run's end", argv[0],
             WIFSIGNALED(st) ? "signal" : "status", WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    say(w, "%s", msg);
    send_json(w, json_pack("{s:s, s:i, s:s}", "event", "log", "step", 0, "message", msg));
    exit(WK_EXIT_RANKS);
}

/* ---- start */

_Static_assert(SPEC_MAX_WORLD <= TRAIN_MAX_RANKS, "a job's world fits the trainer's ranks");

static int check_init(const wk_init *in)
{
    return in->magic == WK_MAGIC && in->size == sizeof *in && in->ndev >= 1 && in->ndev <= TRAIN_MAX_RANKS &&
                   in->spec.devices == in->ndev && in->threads_per_device >= 1 && in->heartbeat_ms >= 10 &&
                   in->spec_json_len <= WK_MAX_SPEC && in->world >= 1 && in->world <= SPEC_MAX_WORLD &&
                   (!in->rank_mode || in->spec_json_len > 0)
               ? 0
               : -1;
}

static int run(worker *w)
{
    pthread_t th;
    if (pthread_create(&th, NULL, heartbeat_thread, w) != 0 || pthread_detach(th) != 0 ||
        pthread_create(&th, NULL, reader_thread, w) != 0 || pthread_detach(th) != 0)
        return -1;
    if (w->init->rank_mode)
        return run_ranks(w);
    train_cfg *cfg = malloc(sizeof *cfg); /* trainer_start copies it */
    if (cfg == NULL)
        return -1;
    job_spec_train_cfg(&w->init->spec, cfg);
    trainer_opts o = {.spec = cfg, .devices = w->init->devices,
                      .threads_per_device = w->init->threads_per_device,
                      .checkpoint_keep = w->init->checkpoint_keep, .async_start = true,
                      .on_event = on_event, .event_ctx = w,
                      /* the test-only ACCUMD_TEST_OOM_AT_GIVEN keeps
                       * the given micro batch, so e2e tests still drive the OOM path */
                      .start_where_fits = getenv("ACCUMD_TEST_OOM_AT_GIVEN") == NULL,
                      .host_budget = w->init->host_budget};
    acc_err err = {0};
    trainer *tr = NULL;
    int rc = trainer_start(&o, &tr, &err);
    free(cfg);
    if (rc != 0) {
        *w->done_ev = (train_event){.kind = TEV_DONE, .status = err.code};
        snprintf(w->done_ev->msg, sizeof w->done_ev->msg, "%s", err.msg);
        send_json(w, tev_to_json(w->done_ev));
        return 0;
    }
    pthread_mutex_lock(&w->mu);
    w->tr = tr;
    if (w->cancel_pending)
        trainer_cancel(tr);
    else if (w->preempt_pending)
        trainer_preempt(tr);
    while (!w->done)
        pthread_cond_wait(&w->cv, &w->mu);
    w->tr = NULL;
    pthread_mutex_unlock(&w->mu);
    trainer_free(tr);
    send_json(w, tev_to_json(w->done_ev));
    return 0;
}

int worker_main(int argc, char **argv)
{
    static worker w; /* the process's one: its detached threads outlive this frame at exit */
    w.job_id = argc >= 3 ? argv[2] : "?";
    acc_err aerr = {0};
    if (argc != 4 || wp_child_attach(argv[3], &aerr) != 0) { /* the channel kept from anything a trainer starts */
        say(&w, "%s", argc != 4 ? "usage: accumd --worker JOB_ID DAEMON_PID" : aerr.msg);
        return WK_EXIT_SETUP;
    }
    w.init = malloc(sizeof *w.init);
    w.done_ev = calloc(1, sizeof *w.done_ev);
    if (w.init == NULL || w.done_ev == NULL || fsu_read_exact(WK_FD, w.init, sizeof *w.init, NULL) != 0 ||
        check_init(w.init) != 0) {
        say(&w, "no valid start message from the daemon%s", "");
        return WK_EXIT_SETUP;
    }
    w.spec_json = w.init->rank_mode ? malloc(w.init->spec_json_len + 1) : NULL;
    if (w.init->rank_mode && (w.spec_json == NULL || fsu_read_exact(WK_FD, w.spec_json, w.init->spec_json_len, NULL) != 0)) {
        say(&w, "no job spec from the daemon%s", "");
        return WK_EXIT_SETUP;
    }
    pthread_mutex_init(&w.wmu, NULL);
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    parse_fault(&w);
    int rc = run(&w);
    if (rc != 0)
        say(&w, "cannot start its threads or its ranks%s", "");
    free(w.spec_json);
    free(w.done_ev);
    free(w.init);
    return rc == 0 ? 0 : WK_EXIT_SETUP;
}
