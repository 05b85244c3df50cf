/* worker_main: a job's worker process (worker_proto.h). Reads its wk_init,
 * runs the job's rank threads (trainer.h) and reports their events up the
 * channel; a reader thread takes the daemon's control lines, a heartbeat
 * thread says it is alive. The main thread waits for the run's end, joins
 * the trainer, writes the "done" line and exits 0. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "tev_json.h"
#include "worker_proto.h"

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

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

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
    int rc = write_all(WK_FD, text, n);
    if (rc == 0)
        rc = write_all(WK_FD, "\n", 1);
    pthread_mutex_unlock(&w->wmu);
    free(text);
    if (rc != 0) {
        say(w, "the daemon's channel is gone (%s); exiting", strerror(errno));
        _exit(WK_EXIT_SETUP);
    }
}

static int read_all(int fd, void *buf, size_t n)
{
    char *p = buf;
    while (n > 0) {
        ssize_t k = read(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
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
             set_path(root, NULL, "resume_from", s->resume_from);
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

/* launcher -np W [--hostfile H] mpi_args... rank_program options spec; the
 * strings live in `store` and `num`, the caller's */
static int rank_argv(worker *w, const char *spec, char *store, size_t n, char num[3][32], char **argv)
{
    const wk_init *in = w->init;
    int c = 0;
    snprintf(num[0], 32, "%d", in->world);
    snprintf(num[1], 32, "%d", in->threads_per_device);
    snprintf(num[2], 32, "%llu", (unsigned long long)in->devices[0].mem_total);
    argv[c++] = (char *)in->mpi_launcher;
    argv[c++] = "-np";
    argv[c++] = num[0];
    if (in->hostfile[0] != '\0') {
        argv[c++] = "--hostfile";
        argv[c++] = (char *)in->hostfile;
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
                          "--device-memory", num[2], spec};
    for (size_t i = 0; i < sizeof tail / sizeof tail[0]; i++)
        argv[c++] = (char *)tail[i];
    argv[c] = NULL;
    return 0;
}

static pid_t start_launcher(worker *w, char **argv, int out_fd)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    /* the child: dies with this worker, gets the signals back we ignore */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int sigs[] = {SIGTERM, SIGINT, SIGHUP, SIGPIPE, SIGXFSZ};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        signal(sigs[i], SIG_DFL);
    if (dup2(out_fd, 1) < 0)
        _exit(127);
    execvp(argv[0], argv);
    _exit(127);
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
            send_json(w, tev_to_json(ev));
        }
        free(ev);
        json_decref(o);
    }
    free(line);
}

static int run_ranks(worker *w)
{
    char spec[PATH_MAX + 32], store[sizeof w->init->mpi_args], num[3][32];
    char *argv[MAX_ARGS];
    int fds[2];
    if (write_rank_spec(w, spec, sizeof spec) != 0 || rank_argv(w, spec, store, sizeof store, num, argv) != 0 ||
        pipe2(fds, O_CLOEXEC) != 0) {
        say(w, "cannot prepare the rank processes' spec and command%s", "");
        return -1;
    }
    pthread_mutex_lock(&w->mu);
    pid_t pid = w->cancel_pending || w->preempt_pending ? -1 : start_launcher(w, argv, fds[1]);
    w->ranks = pid;
    pthread_mutex_unlock(&w->mu);
    close(fds[1]);
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
    w->ranks = 0;
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
    if (done) {
        send_json(w, tev_to_json(w->done_ev));
        return 0;
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

/* Dies with the daemon; a daemon already gone before that was set is
 * seen as a changed parent. */
static int tie_to_daemon(const char *pid_arg)
{
    char *end;
    long dpid = strtol(pid_arg, &end, 10);
    if (*end != '\0' || dpid <= 1)
        return -1;
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
        return -1;
    return getppid() == (pid_t)dpid ? 0 : -1;
}

static int run(worker *w)
{
    pthread_t th;
    if (pthread_create(&th, NULL, heartbeat_thread, w) != 0 || pthread_detach(th) != 0 ||
        pthread_create(&th, NULL, reader_thread, w) != 0 || pthread_detach(th) != 0)
        return -1;
    if (w->init->rank_mode)
        return run_ranks(w);
    trainer_opts o = {.spec = &w->init->spec, .devices = w->init->devices,
                      .threads_per_device = w->init->threads_per_device,
                      .checkpoint_keep = w->init->checkpoint_keep, .async_start = true,
                      .on_event = on_event, .event_ctx = w,
                      /* h-results, issue 23; the test-only ACCUMD_TEST_OOM_AT_GIVEN keeps
                       * the given micro batch, so e2e tests still drive the OOM path */
                      .start_where_fits = getenv("ACCUMD_TEST_OOM_AT_GIVEN") == NULL};
    acc_err err = {0};
    trainer *tr = NULL;
    if (trainer_start(&o, &tr, &err) != 0) {
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
    if (argc != 4 || tie_to_daemon(argv[3]) != 0) {
        say(&w, "not started by a live accumd (usage: accumd --worker JOB_ID DAEMON_PID)%s", "");
        return WK_EXIT_SETUP;
    }
    signal(SIGPIPE, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN);
    /* kept from anything a trainer might start */
    if (fcntl(WK_FD, F_SETFD, FD_CLOEXEC) != 0) {
        say(&w, "no channel on descriptor 3: %s", strerror(errno));
        return WK_EXIT_SETUP;
    }
    w.init = malloc(sizeof *w.init);
    w.done_ev = calloc(1, sizeof *w.done_ev);
    if (w.init == NULL || w.done_ev == NULL || read_all(WK_FD, w.init, sizeof *w.init) != 0 ||
        check_init(w.init) != 0) {
        say(&w, "no valid start message from the daemon%s", "");
        return WK_EXIT_SETUP;
    }
    w.spec_json = w.init->rank_mode ? malloc(w.init->spec_json_len + 1) : NULL;
    if (w.init->rank_mode && (w.spec_json == NULL || read_all(WK_FD, w.spec_json, w.init->spec_json_len) != 0)) {
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
