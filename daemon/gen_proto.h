/* gen_proto: what the daemon and a generate request's worker process say
 * to each other (POST /v1/generate; core/jobs/genq.h queues the requests).
 *
 * The worker is the daemon's own executable in a hidden mode,
 *
 *   accumd --generate REQUEST_ID DAEMON_PID
 *
 * started by the daemon (daemon/gen_worker.c, daemon/wproc.h) with one end
 * of a socketpair as descriptor GW_FD. Down it the daemon writes one
 * gw_init (binary: both ends are the same build; `magic` and `size` check
 * it) followed by `request_len` bytes: the request as the API resolved it,
 * one JSON object:
 *
 *   {"model_dir": DIR, "roots": ROOTS, "prompt_ids": [..],
 *    "max_positions": N, "eos": [..], "max_new_tokens": N,
 *    "temperature": T, "top_k": K, "top_p": P, "repetition_penalty": R,
 *    "seed": S, "stop": [..]}
 *
 * Up it, the worker writes one JSON object per line:
 *   {"event":"heartbeat"}                      every heartbeat_ms
 *   {"event":"token","id":N,"text":"..."}      per generated token
 *   {"event":"done","text":..,"finish_reason":..,"prompt_tokens":N,
 *    "completion_tokens":N,"prefill_s":..,"decode_s":..}
 *   {"event":"error","code":..,"message":..,"field":..}
 * and exits 0 after "done" or "error". A worker that ends without either
 * crashed or was killed (the daemon says so to the client). Nothing goes
 * down after the request: a cancel (the client went away) is SIGKILL,
 * since a generation has nothing to save. The worker dies with the daemon
 * (PR_SET_PDEATHSIG). It lowers its own priority by `nice` (the config's
 * generate_nice; nice 19 at most) below the daemon's before anything
 * else, so the daemon's loop thread keeps its core while generations run.
 */
#ifndef ACC_GEN_PROTO_H
#define ACC_GEN_PROTO_H

#include <stdint.h>

#include "kern_discover.h"

#define GW_FD 3
#define GW_MAGIC 0x61636767u /* "accg" */
#define GW_EXIT_SETUP 3       /* no valid start message */
#define GW_MAX_REQUEST (4u << 20)
#define GW_MAX_LINE (4u << 20) /* an event line longer than this is a protocol error */

typedef struct gw_init {
    uint32_t magic;
    uint32_t size;            /* sizeof(gw_init) */
    kern_device_info device;
    int threads;              /* kernel threads (CPU devices) */
    int nice;                 /* added to the worker's nice value before it starts a thread */
    int heartbeat_ms;
    uint32_t request_len;     /* then this many bytes: the request JSON */
} gw_init;

/* The worker's main (daemon/gen_main.c); argv as above. */
int gen_worker_main(int argc, char **argv);

#endif
