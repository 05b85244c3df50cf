/* daemon: the process. Its one context struct holds all mutable state of the
 * daemon; nothing else in accumd keeps global mutable state.
 *
 * Life: daemon_init (config already parsed) -> daemon_run (libuv loop until a
 * stop signal and every handle is closed) -> daemon_free.
 */
#ifndef ACC_DAEMON_H
#define ACC_DAEMON_H

#include <stdbool.h>
#include <uv.h>

#include "api_http.h"
#include "conf.h"
#include "err.h"
#include "kern_discover.h"

typedef struct acc_daemon {
    acc_conf conf;
    uv_loop_t loop;
    uv_signal_t sigs[3];   /* SIGTERM, SIGINT, SIGHUP */
    int nsigs;             /* how many of sigs are initialised */
    bool loop_on;
    uv_timer_t watchdog;
    bool watchdog_on;
    api_server *api;
    kern_device_info devices[KERN_MAX_DEVICES];
    int ndevices;
    bool stopping;
} acc_daemon;

/* Load a key = value config file into `c` (keys as in conf.h). */
int daemon_conf_load(acc_conf *c, const char *path, acc_err *err);

int daemon_init(acc_daemon *d, acc_err *err);
int daemon_run(acc_daemon *d);
void daemon_free(acc_daemon *d);

/* Begin a graceful stop (as SIGTERM does). Safe to call more than once. */
void daemon_stop(acc_daemon *d, const char *why);

#endif
