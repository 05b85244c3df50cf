/* gen_worker: the daemon's side of generate requests' worker processes
 * (gen_proto.h has the protocol), installed as the generate queue's runner
 * (core/jobs/genq.h). One process per started request (wproc.h: spawned,
 * its channel read only with libuv's non-blocking I/O on the loop thread,
 * heartbeats watched): "token", "done" and "error" lines go to the queue as
 * they come;
 * when the process exited and its channel closed the request ends
 * (genq_ended), with an "error" first when it sent neither "done" nor
 * "error" (a crash, a kill, no heartbeat for worker_heartbeat_timeout
 * seconds, a line that is not an event). Cancel is SIGKILL.
 */
#ifndef ACC_GEN_WORKER_H
#define ACC_GEN_WORKER_H

#include <limits.h>
#include <uv.h>

#include "conf.h"
#include "err.h"
#include "genq.h"

typedef struct gw_runner {
    uv_loop_t *loop;
    const acc_conf *conf;
    genq *q;
} gw_runner;

void gw_runner_install(gw_runner *r, uv_loop_t *loop, const acc_conf *conf, genq *q);

#endif
