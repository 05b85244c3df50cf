#include "daemon.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "fsutil.h"
#include "kern_selftest.h"
#include "log.h"

/* Write "host:port" of the bound socket so tools and tests find a daemon
 * started with port 0. */
static int write_addr_file(acc_daemon *d, acc_err *err)
{
    char path[PATH_MAX + 16], line[320];
    snprintf(path, sizeof path, "%s/accumd.addr", d->conf.state_dir);
    int n = snprintf(line, sizeof line, strchr(d->conf.listen_host, ':') ? "[%s]:%d\n" : "%s:%d\n",
                     d->conf.listen_host, api_server_port(d->api));
    if (n < 0 || (size_t)n >= sizeof line)
        return acc_err_set(err, ACC_EINVAL, "listen", "listen address too long");
    return fsu_write_atomic(path, line, (size_t)n, err);
}

static void on_signal(uv_signal_t *h, int signum)
{
    acc_daemon *d = h->data;
    if (signum == SIGHUP) {
        acc_err e = {0};
        if (log_reopen() != 0)
            acc_log(ACC_LOG_WARN, "daemon", "SIGHUP: cannot reopen the log: %m");
        else
            acc_log(ACC_LOG_INFO, "daemon", "SIGHUP: log reopened");
        if (api_server_reload_users(d->api, &e) != 0)
            acc_log(ACC_LOG_ERROR, "auth", "SIGHUP: users_file not reloaded, the users of before stay: %s", e.msg);
        return;
    }
    daemon_stop(d, signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

static void on_watchdog(uv_timer_t *t)
{
    sd_notify(0, "WATCHDOG=1");
}

static int start_signals(acc_daemon *d, acc_err *err)
{
    static const int nums[] = {SIGTERM, SIGINT, SIGHUP};
    for (int i = 0; i < 3; i++) {
        int rc = uv_signal_init(&d->loop, &d->sigs[i]);
        if (rc != 0)
            return acc_err_set(err, ACC_EINTERNAL, NULL, "signal setup: %s", uv_strerror(rc));
        d->nsigs++;
        d->sigs[i].data = d;
        rc = uv_signal_start(&d->sigs[i], on_signal, nums[i]);
        if (rc != 0)
            return acc_err_set(err, ACC_EINTERNAL, NULL, "signal setup: %s", uv_strerror(rc));
    }
    return 0;
}

static void start_watchdog(acc_daemon *d)
{
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0)
        return;
    if (uv_timer_init(&d->loop, &d->watchdog) != 0)
        return;
    d->watchdog.data = d;
    d->watchdog_on = true;
    uint64_t every = usec / 2000; /* ms, twice per period */
    uv_timer_start(&d->watchdog, on_watchdog, every, every ? every : 1);
}

/* Before jobs train on the GPUs, the CUDA backend computes a set of inputs
 * on the first one and on the CPU and the results are compared (every op,
 * kern_selftest.h): a driver, toolkit or backend that computes wrong here
 * is found at start, not in a job's loss curve. With devices = auto a
 * failure means CPU devices (false); devices = cuda keeps the GPUs, loudly. */
static bool gpus_pass_selftest(acc_daemon *d, kern_want want)
{
    acc_err e = {0};
    const kern_device_info *g = &d->devices[0];
    d->gpu_check = kern_selftest_device(g, &e) == 0;
    if (d->gpu_check)
        snprintf(d->gpu_check_msg, sizeof d->gpu_check_msg,
                 "cuda:%d %.100s: self-test against the CPU passed", g->index, g->name);
    else
        snprintf(d->gpu_check_msg, sizeof d->gpu_check_msg, "cuda:%d %.100s: %.380s", g->index,
                 g->name, e.msg);
    if (d->gpu_check) {
        acc_log(ACC_LOG_INFO, "devices", "%s", d->gpu_check_msg);
        return true;
    }
    if (want == KERN_WANT_CUDA) {
        acc_log(ACC_LOG_ERROR, "devices", "devices = cuda: self-test failed, jobs may compute wrong "
                "results on the GPUs: %s", e.msg);
        return true;
    }
    acc_log(ACC_LOG_WARN, "devices", "devices = auto: the GPUs failed the self-test, using CPU "
            "devices: %s", e.msg);
    return false;
}

static int discover_devices(acc_daemon *d, acc_err *err)
{
    kern_want want = d->conf.devices == CONF_DEVICES_CUDA  ? KERN_WANT_CUDA
                     : d->conf.devices == CONF_DEVICES_CPU ? KERN_WANT_CPU
                                                           : KERN_WANT_AUTO;
    d->gpu_check = -1;
    int rc = kern_discover(want, d->conf.cpu_devices, d->conf.cpu_device_memory, d->devices,
                           KERN_MAX_DEVICES, &d->ndevices, err);
    if (rc != 0)
        return rc;
    if (d->ndevices > 0 && d->devices[0].kind == KERN_DEV_CUDA && !gpus_pass_selftest(d, want))
        rc = kern_discover(KERN_WANT_CPU, d->conf.cpu_devices, d->conf.cpu_device_memory,
                           d->devices, KERN_MAX_DEVICES, &d->ndevices, err);
    if (rc != 0)
        return rc;
    for (int i = 0; i < d->ndevices; i++) {
        const kern_device_info *k = &d->devices[i];
        if (k->kind == KERN_DEV_CUDA)
            acc_log(ACC_LOG_INFO, "devices", "cuda:%d %s sm_%d%d memory=%llu", k->index, k->name,
                    k->cc_major, k->cc_minor, (unsigned long long)k->mem_total);
        else
            acc_log(ACC_LOG_INFO, "devices", "%s memory_budget=%llu threads=%d", k->name,
                    (unsigned long long)k->mem_total, d->conf.cpu_threads_per_device);
    }
    return 0;
}

/* sd_notify STATUS with the job counts, when they changed. */
static void update_status(acc_daemon *d)
{
    if (!d->jobs_on)
        return;
    int c[JOB_NSTATES];
    char line[160];
    jobs_count_states(&d->jobs, c);
    snprintf(line, sizeof line, "%s%d queued, %d running, %d succeeded, %d failed, %d cancelled",
             d->stopping ? "stopping: " : "", c[JOB_QUEUED], c[JOB_RUNNING], c[JOB_SUCCEEDED], c[JOB_FAILED],
             c[JOB_CANCELLED]);
    if (!strcmp(line, d->last_status))
        return;
    memcpy(d->last_status, line, sizeof line);
    sd_notifyf(0, "STATUS=%s", line);
}

static void on_tick(uv_timer_t *t)
{
    acc_daemon *d = t->data;
    if (d->jobs_on)
        jobs_retry_store(&d->jobs); /* state changes the store could not write yet */
    if (d->jobs_on)
        jobs_enforce_cancels(&d->jobs); /* cancels not honoured within cancel_grace */
    update_status(d);
}

static void close_handle(uv_handle_t *h, bool *on)
{
    if (*on && !uv_is_closing(h))
        uv_close(h, NULL);
    *on = false;
}

/* The last step of a stop: every job is stopped (or the grace ran out). */
static void finish_stop(acc_daemon *d)
{
    if (d->stopped)
        return;
    d->stopped = true;
    api_server_stop(d->api);
    d->api = NULL;
    if (d->jobs_on)
        jobs_flush(&d->jobs);
    for (int i = 0; i < d->nsigs; i++)
        uv_close((uv_handle_t *)&d->sigs[i], NULL);
    d->nsigs = 0;
    close_handle((uv_handle_t *)&d->watchdog, &d->watchdog_on);
    close_handle((uv_handle_t *)&d->wake, &d->wake_on);
    close_handle((uv_handle_t *)&d->tick, &d->tick_on);
    close_handle((uv_handle_t *)&d->grace, &d->grace_on);
    acc_log(ACC_LOG_INFO, "daemon", "store flushed; stopped");
}

static void on_wake(uv_async_t *a)
{
    acc_daemon *d = a->data;
    jobs_drain_events(&d->jobs);
    update_status(d);
    if (d->stopping && jobs_count_running(&d->jobs) == 0)
        finish_stop(d);
}

static void on_grace(uv_timer_t *t)
{
    acc_daemon *d = t->data;
    int n = jobs_count_running(&d->jobs);
    acc_log(ACC_LOG_WARN, "daemon", "shutdown_grace of %d s over with %d job(s) still stopping; exiting",
            d->conf.shutdown_grace, n);
    jobs_drain_events(&d->jobs);
    jobs_flush(&d->jobs);
    sd_notify(0, "STATUS=exiting after shutdown_grace");
    /* the workers still hold their jobs: no orderly teardown is possible */
    _exit(0);
}

static void wake_loop(void *ctx)
{
    acc_daemon *d = ctx;
    uv_async_send(&d->wake); /* thread-safe; coalesces */
}

static int start_jobs(acc_daemon *d, acc_err *err)
{
    int rc = uv_async_init(&d->loop, &d->wake, on_wake);
    if (rc != 0)
        return acc_err_set(err, ACC_EINTERNAL, NULL, "uv_async_init: %s", uv_strerror(rc));
    d->wake.data = d;
    d->wake_on = true;
    if ((rc = uv_timer_init(&d->loop, &d->tick)) != 0)
        return acc_err_set(err, ACC_EINTERNAL, NULL, "uv_timer_init: %s", uv_strerror(rc));
    d->tick.data = d;
    d->tick_on = true;
    if ((rc = uv_timer_start(&d->tick, on_tick, 2000, 2000)) != 0)
        return acc_err_set(err, ACC_EINTERNAL, NULL, "uv_timer_start: %s", uv_strerror(rc));
    if ((rc = jobs_init(&d->jobs, &d->conf, d->devices, d->ndevices, wake_loop, d, err)) != 0)
        return rc;
    d->jobs_on = true;
    if (d->conf.worker_processes) {
        int killed = wk_kill_leftovers(d->conf.state_dir);
        if (killed > 0)
            acc_log(ACC_LOG_WARN, "worker", "killed %d worker(s) an earlier daemon left running", killed);
        if ((rc = wk_runner_init(&d->workers, &d->loop, &d->conf, &d->jobs, err)) != 0)
            return rc;
        wk_runner_install(&d->workers);
    }
    genq_init(&d->gen, &d->jobs); /* generation runs in worker processes only */
    if (d->conf.worker_processes)
        gw_runner_install(&d->gen_workers, &d->loop, &d->conf, &d->gen);
    d->jobs.gpu_check = d->gpu_check;
    snprintf(d->jobs.gpu_check_msg, sizeof d->jobs.gpu_check_msg, "%s", d->gpu_check_msg);
    return 0;
}

int daemon_init(acc_daemon *d, acc_err *err)
{
    int rc = uv_loop_init(&d->loop);
    if (rc != 0)
        return acc_err_set(err, ACC_EINTERNAL, NULL, "uv_loop_init: %s", uv_strerror(rc));
    d->loop_on = true;
    if ((rc = fsu_mkdir_p(d->conf.state_dir, 0750, err)) != 0 ||
        (rc = fsu_mkdir_p(d->conf.output_root, 0750, err)) != 0)
        return rc;
    if ((rc = discover_devices(d, err)) != 0)
        return rc;
    if ((rc = start_signals(d, err)) != 0)
        return rc;
    if ((rc = start_jobs(d, err)) != 0)
        return rc;
    if ((rc = api_server_start(&d->api, &d->loop, &d->conf, &d->jobs, err)) != 0)
        return rc;
    if ((rc = jobs_load(&d->jobs, err)) != 0)
        return rc;
    if ((rc = write_addr_file(d, err)) != 0) {
        acc_err_prefix(err, "state_dir %s: cannot write accumd.addr (disk full?)", d->conf.state_dir);
        return rc;
    }
    start_watchdog(d);
    /* only now, with every step of the start done, may trainers run: a
     * start that fails has started nothing that outlives it */
    jobs_schedule(&d->jobs);
    acc_log(ACC_LOG_INFO, "daemon", "accumd listening on %s port %d, state in %s%s", d->conf.listen_host,
            api_server_port(d->api), d->conf.state_dir, api_server_requires_token(d->api) ? ", token required" : "");
    sd_notifyf(0, "READY=1\nSTATUS=listening on %s port %d", d->conf.listen_host, api_server_port(d->api));
    update_status(d);
    return 0;
}

void daemon_stop(acc_daemon *d, const char *why)
{
    if (d->stopping)
        return;
    d->stopping = true;
    acc_log(ACC_LOG_INFO, "daemon", "%s: stopping", why);
    sd_notify(0, "STOPPING=1");
    api_server_quiesce(d->api);
    int running = d->jobs_on ? jobs_shutdown(&d->jobs) : 0;
    if (d->jobs_on)
        genq_shutdown(&d->gen); /* their workers are killed: a generation has nothing to save */
    update_status(d);
    if (running == 0 || !d->wake_on) {
        finish_stop(d);
        return;
    }
    acc_log(ACC_LOG_INFO, "daemon", "waiting up to %d s for %d running job(s) to stop", d->conf.shutdown_grace,
            running);
    if (uv_timer_init(&d->loop, &d->grace) == 0) {
        d->grace.data = d;
        d->grace_on = true;
        uv_timer_start(&d->grace, on_grace, (uint64_t)d->conf.shutdown_grace * 1000, 0);
    }
}

int daemon_run(acc_daemon *d)
{
    return uv_run(&d->loop, UV_RUN_DEFAULT);
}

void daemon_free(acc_daemon *d)
{
    if (!d->loop_on)
        return;
    if (!d->stopping)
        daemon_stop(d, "shutdown");
    /* every path out waits for the trainers: their events need the wake
     * handle, which finish_stop closes (on_wake stops once none runs) */
    if (!d->stopped && d->jobs_on && d->wake_on && jobs_count_running(&d->jobs) > 0)
        uv_run(&d->loop, UV_RUN_DEFAULT);
    if (!d->stopped) /* init failed half-way: nothing runs */
        finish_stop(d);
    uv_run(&d->loop, UV_RUN_DEFAULT); /* let close callbacks run */
    if (d->jobs_on)
        jobs_free(&d->jobs);
    d->jobs_on = false;
    if (uv_loop_close(&d->loop) != 0)
        acc_log(ACC_LOG_WARN, "daemon", "event loop closed with handles still open");
    acc_log(ACC_LOG_INFO, "daemon", "stopped");
}
