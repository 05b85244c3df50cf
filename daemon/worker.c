/* worker: jobs' worker processes, the daemon's side (see worker.h). */
#include "worker.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "fsutil.h"
#include "log.h"
#include "tev_json.h"
#include "worker_proto.h"
#include "wproc.h"

_Static_assert(WK_FD == WP_CHILD_FD, "the job worker reads its channel where wproc puts it");

typedef struct wk_proc {
    wk_runner *r;
    job *j;
    char job_id[32];
    int pid;
    wp_proc *proc;
    bool bad_line;             /* killed for a line that is not an event */
    jobs_wend end;
} wk_proc;

/* ---- pid files */

static void pid_path(const wk_runner *r, const char *id, char *out, size_t n)
{
    snprintf(out, n, "%s/%s.pid", r->dir, id);
}

static void pid_write(const wk_proc *p)
{
    char path[PATH_MAX + 64], line[32];
    pid_path(p->r, p->job_id, path, sizeof path);
    int n = snprintf(line, sizeof line, "%d\n", p->pid);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    /* no fsync: after a power loss no worker is left to find */
    if (fd < 0 || write(fd, line, (size_t)n) != n)
        acc_log(ACC_LOG_WARN, "worker", "job %s: cannot record the worker's pid in %s: %s", p->job_id, path,
                strerror(errno));
    if (fd >= 0)
        close(fd);
}

static void pid_remove(const wk_proc *p)
{
    char path[PATH_MAX + 64];
    pid_path(p->r, p->job_id, path, sizeof path);
    if (unlink(path) != 0 && errno != ENOENT)
        acc_log(ACC_LOG_WARN, "worker", "job %s: %s: %s", p->job_id, path, strerror(errno));
}

/* ---- the end */

static void kill_worker(wk_proc *p, const char *why)
{
    if (wp_exited(p->proc))
        return;
    acc_log(ACC_LOG_ERROR, "worker", "job %s: killing worker %d: %s", p->job_id, p->pid, why);
    wp_kill(p->proc, why);
}

/* Why it ended without a report: the cause and its words. */
static void describe_loss(wk_proc *p, const wp_end *w)
{
    jobs_wend *e = &p->end;
    if (w->not_started) {
        e->cause = JOBS_WFAIL_START;
        e->deterministic = true;
        snprintf(e->what, sizeof e->what, "could not be started (%.200s)", w->why);
    } else if (w->no_channel) {
        e->cause = JOBS_WFAIL_START;
        e->deterministic = true;
        snprintf(e->what, sizeof e->what, "could not be given its job (its channel failed) and was killed");
    } else if (p->bad_line || w->line_too_long) {
        e->cause = JOBS_WFAIL_PROTOCOL;
        snprintf(e->what, sizeof e->what, "wrote a line that is not an event and was killed");
    } else if (w->heartbeat_lost) {
        e->cause = JOBS_WFAIL_HEARTBEAT;
        snprintf(e->what, sizeof e->what, "sent no heartbeat for %d s and was killed",
                 p->r->conf->worker_heartbeat_timeout);
    } else if (w->term_signal != 0) {
        e->cause = JOBS_WFAIL_SIGNAL;
        snprintf(e->what, sizeof e->what, "killed by signal %d (%s)", w->term_signal, strsignal(w->term_signal));
    } else if (w->exit_status == WK_EXIT_WATCHDOG) {
        e->cause = JOBS_WFAIL_EXIT;
        snprintf(e->what, sizeof e->what, "ended its rank processes: rank 0 reported no progress within the "
                 "watchdog's bound (a rank stopped or hung; rank_watchdog_min / rank_watchdog_factor)");
    } else if (w->exit_status == WK_EXIT_RANKS) {
        e->cause = JOBS_WFAIL_EXIT;
        snprintf(e->what, sizeof e->what, "lost its rank processes (the MPI launcher ended without rank 0's report)");
    } else if (w->exit_status == WK_EXIT_SETUP) {
        e->cause = JOBS_WFAIL_START;
        e->deterministic = true;
        snprintf(e->what, sizeof e->what, "could not start (exit status %d)", WK_EXIT_SETUP);
    } else {
        e->cause = JOBS_WFAIL_EXIT;
        snprintf(e->what, sizeof e->what, "exited with status %lld without reporting", (long long)w->exit_status);
    }
}

static void on_spawned(void *ctx, int pid)
{
    wk_proc *p = ctx;
    p->pid = pid;
    pid_write(p);
    acc_log(ACC_LOG_INFO, "worker", "job %s: worker pid %d started", p->job_id, pid);
}

/* Both the process and its channel are gone: report; the jobs manager
 * lets go of it later (release). */
static void on_ended(void *ctx, const wp_end *w)
{
    wk_proc *p = ctx;
    if (p->end.reported && (w->term_signal != 0 || w->exit_status != 0))
        acc_log(ACC_LOG_WARN, "worker", "job %s: worker %d ended abnormally (status %lld, signal %d) after "
                "reporting its run's end", p->job_id, p->pid, (long long)w->exit_status, w->term_signal);
    if (!p->end.reported)
        describe_loss(p, w);
    if (p->pid > 0)
        pid_remove(p);
    jobs_worker_ended(p->r->jobs, p->j, &p->end);
}

/* ---- the channel */

static void on_line(void *ctx, const char *line, size_t n)
{
    wk_proc *p = ctx;
    json_error_t je;
    json_t *o = json_loadb(line, n, 0, &je);
    const char *kind = json_string_value(json_object_get(o, "event"));
    if (kind != NULL && !strcmp(kind, "heartbeat")) {
        json_decref(o);
        return;
    }
    train_event *ev = malloc(sizeof *ev);
    acc_err err = {0};
    int rc = ev == NULL ? acc_err_set(&err, ACC_ENOMEM, NULL, "out of memory")
             : o == NULL ? acc_err_set(&err, ACC_EINVAL, NULL, "not JSON: %s", je.text)
                         : tev_from_json(o, ev, &err);
    json_decref(o);
    if (rc != 0) {
        if (!p->bad_line) {
            char why[400];
            snprintf(why, sizeof why, "a bad event line: %.300s", err.msg);
            p->bad_line = true;
            kill_worker(p, why);
        }
    } else if (ev->kind == TEV_DONE) {
        p->end.reported = true;
        p->end.done = *ev;
    } else if (!p->end.reported && !p->bad_line) {
        jobs_worker_event(p->r->jobs, p->j, ev);
    }
    free(ev);
}

static void control(void *ctx, job *j, const char *what)
{
    wk_proc *p = j->worker;
    (void)ctx;
    if (p == NULL || wp_exited(p->proc))
        return;
    if (!strcmp(what, "kill")) { /* a cancel not honoured in time (jobs_enforce_cancels) */
        kill_worker(p, "cancelled, and not stopped within cancel_grace");
        return;
    }
    char line[32];
    snprintf(line, sizeof line, "%s\n", what);
    acc_err err = {0};
    if (wp_send(p->proc, line, &err) != 0)
        acc_log(ACC_LOG_WARN, "worker", "job %s: cannot send %s: %s", p->job_id, what, err.msg);
}

/* ---- start */

/* accumd-rank next to this executable, unless the config names one */
static void rank_program(const wk_runner *r, char *out, size_t n)
{
    if (r->conf->rank_program[0] != '\0') {
        snprintf(out, n, "%s", r->conf->rank_program);
        return;
    }
    const char *slash = strrchr(r->exe, '/');
    int dir = slash ? (int)(slash - r->exe) : 0;
    snprintf(out, n, "%.*s%saccumd-rank", dir, r->exe, slash ? "/" : "");
}

/* The start message, with the spec's text after it in rank mode. */
static wk_init *make_init(const wk_runner *r, const job *j, const kern_device_info *devs, int ndev)
{
    bool ranks = r->conf->rank_processes || j->spec.nodes > 1;
    size_t text = ranks && j->spec_json ? strlen(j->spec_json) : 0;
    if (text > WK_MAX_SPEC)
        return NULL;
    wk_init *in = calloc(1, sizeof *in + text);
    if (in == NULL)
        return NULL;
    int hb = wp_heartbeat_ms(r->conf->worker_heartbeat_timeout);
    *in = (wk_init){.magic = WK_MAGIC, .size = sizeof *in, .ndev = ndev,
                    .threads_per_device = r->conf->cpu_threads_per_device,
                    .checkpoint_keep = r->conf->checkpoint_keep, .heartbeat_ms = hb,
                    .attempt = j->worker_restarts, .spec = j->spec, .rank_mode = ranks,
                    .world = j->spec.devices * j->spec.nodes, .spec_json_len = (uint32_t)text,
                    .watchdog_factor = r->conf->rank_watchdog_factor, .watchdog_min_s = r->conf->rank_watchdog_min};
    in->host_budget = j->host_bytes;
    in->host_per_rank = j->host_per_rank;
    snprintf(in->mpi_interface, sizeof in->mpi_interface, "%s", r->conf->mpi_interface);
    memcpy(in->devices, devs, (size_t)ndev * sizeof *devs);
    snprintf(in->mpi_launcher, sizeof in->mpi_launcher, "%s", r->conf->mpi_launcher);
    snprintf(in->hostfile, sizeof in->hostfile, "%s", r->conf->hostfile);
    snprintf(in->mpi_args, sizeof in->mpi_args, "%s", r->conf->mpi_args);
    rank_program(r, in->rank_program, sizeof in->rank_program);
    memcpy(in + 1, j->spec_json, text);
    return in;
}

static int start(void *ctx, job *j, const kern_device_info *devs, int ndev, acc_err *err)
{
    wk_runner *r = ctx;
    wk_proc *p = calloc(1, sizeof *p);
    wk_init *in = make_init(r, j, devs, ndev);
    if (p == NULL || in == NULL) {
        free(p);
        free(in);
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory for a worker");
    }
    *p = (wk_proc){.r = r, .j = j, .pid = -1};
    snprintf(p->job_id, sizeof p->job_id, "%s", j->id);
    wp_opts o = {.mode = "--worker", .id = j->id, .log_tag = "worker", .init = in,
                 .init_len = sizeof *in + in->spec_json_len, .heartbeat_ms = in->heartbeat_ms,
                 .heartbeat_timeout_s = r->conf->worker_heartbeat_timeout, .max_line = WK_MAX_LINE};
    int rc = wp_start(r->loop, &o, &(wp_hooks){.line = on_line, .spawned = on_spawned, .ended = on_ended, .ctx = p}, &p->proc, err);
    free(in);
    if (rc != 0) {
        free(p);
        return rc;
    }
    j->worker = p;
    return 0;
}

static void release(void *ctx, job *j)
{
    wk_proc *p = j->worker;
    (void)ctx;
    wp_release(p->proc);
    free(p);
}

int wk_runner_init(wk_runner *r, uv_loop_t *loop, const acc_conf *conf, jobs_mgr *jobs, acc_err *err)
{
    memset(r, 0, sizeof *r);
    r->loop = loop;
    r->conf = conf;
    r->jobs = jobs;
    size_t n = sizeof r->exe;
    int rc = uv_exepath(r->exe, &n);
    if (rc != 0)
        return acc_err_set(err, ACC_EINTERNAL, NULL, "cannot find this executable for the workers: %s",
                           uv_strerror(rc));
    int w = snprintf(r->dir, sizeof r->dir, "%s/workers", conf->state_dir);
    if (w < 0 || (size_t)w >= sizeof r->dir)
        return acc_err_set(err, ACC_EINVAL, "state_dir", "state_dir is too long");
    return fsu_mkdir_p(r->dir, 0700, err);
}

void wk_runner_install(wk_runner *r)
{
    jobs_set_runner(r->jobs, &(jobs_runner){.start = start, .control = control, .release = release, .ctx = r});
}

/* ---- leftovers of an earlier daemon */

/* Is pid "accumd --worker <id> ..." (argv[0]'s last component accumd)? */
static bool is_worker_of(pid_t pid, const char *id)
{
    char path[64], cmd[4096];
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, cmd, sizeof cmd - 1);
    close(fd);
    if (n <= 0)
        return false;
    cmd[n] = '\0';
    const char *argv[3] = {cmd, NULL, NULL};
    size_t at = strlen(cmd) + 1;
    for (int i = 1; i < 3 && at < (size_t)n; i++) {
        argv[i] = cmd + at;
        at += strlen(cmd + at) + 1;
    }
    const char *base = strrchr(argv[0], '/');
    base = base ? base + 1 : argv[0];
    return !strcmp(base, "accumd") && argv[1] != NULL && !strcmp(argv[1], "--worker") && argv[2] != NULL &&
           !strcmp(argv[2], id);
}

/* Gone, or a zombie (its reaper is not us). */
static bool is_gone(pid_t pid)
{
    char path[64], st[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return true;
    ssize_t n = read(fd, st, sizeof st - 1);
    close(fd);
    if (n <= 0)
        return true;
    st[n] = '\0';
    const char *rp = strrchr(st, ')');
    return rp != NULL && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X');
}

static bool kill_one(const char *dir, const char *name)
{
    char path[PATH_MAX + 300], id[32], buf[32] = "";
    size_t len = strlen(name);
    if (len < 5 || len - 4 >= sizeof id || strcmp(name + len - 4, ".pid"))
        return false;
    memcpy(id, name, len - 4);
    id[len - 4] = '\0';
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0)
        close(fd);
    unlink(path);
    long pid = n > 0 ? strtol(buf, NULL, 10) : 0;
    if (pid <= 1 || !job_id_valid(id, strlen(id)) || !is_worker_of((pid_t)pid, id))
        return false;
    acc_log(ACC_LOG_WARN, "worker", "job %s: worker %ld of an earlier daemon still runs; killing it", id, pid);
    if (kill((pid_t)pid, SIGKILL) != 0)
        return false;
    for (int i = 0; i < 200 && !is_gone((pid_t)pid); i++) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return true;
}

int wk_kill_leftovers(const char *state_dir)
{
    char dir[PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/workers", state_dir);
    DIR *d = opendir(dir);
    if (d == NULL)
        return 0;
    int killed = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (e->d_name[0] != '.')
            killed += kill_one(dir, e->d_name);
    closedir(d);
    return killed;
}
