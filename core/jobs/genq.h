/* genq: the queue of generate requests (POST /v1/generate) and the devices
 * they are lent.
 *
 * A generate request runs in a worker process on one device, as a job
 * does, but is no job: it is not stored, has no id in GET /v1/jobs and
 * lives as long as its HTTP answer. The queue takes requests in order and
 * lends each a free device (one no job holds and no other request has)
 * whose memory covers the request's predicted bytes; those bytes are
 * counted as the device's memory in use (GET /v1/devices) while it runs.
 * Jobs come first: genq_place runs after every jobs_schedule (the jobs
 * manager's after_schedule hook), on the devices the queued jobs left.
 * A lent device is busy to the scheduler until the request's worker ended.
 *
 * Events to the request's owner (its sink, on the loop thread):
 *   "queued"  {"position": N}  (N >= 1: requests before it, itself counted;
 *             sent when it is queued and whenever its position changes)
 *   "started" {"device": D}
 *   whatever the runner hands on (genq_event: "token", "done", "error")
 *   "end" (no data) once the worker ended and the device is free again;
 *   the request is then the owner's to free (genq_req_free).
 * A request cancelled while queued ends at once ("end"); one cancelled
 * while running has its worker killed (the runner's cancel) and ends when
 * the worker is gone, so the device is free by the time "end" is sent.
 *
 * Not thread-safe: the loop thread owns the queue.
 */
#ifndef ACC_GENQ_H
#define ACC_GENQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "kern_discover.h"

struct jobs_mgr;
typedef struct genq genq;
typedef struct genq_req genq_req;

typedef enum genq_state { GENQ_QUEUED = 0, GENQ_RUNNING, GENQ_ENDED } genq_state;

typedef void (*genq_sink_fn)(void *ctx, genq_req *r, const char *type, const char *json, size_t len);

struct genq_req {
    genq_req *prev, *next;     /* the queue's list (queued and running) */
    genq *q;
    char id[24];               /* "gen-<n>": logs, the worker's name */
    char owner[64];
    char *request;             /* the worker's request (JSON text), owned */
    uint64_t mem_bytes;        /* predicted peak on the device */
    genq_state state;
    int dev;                   /* the lent device, -1 while queued */
    int position;              /* last position sent (queued) */
    bool cancelled;
    bool ok;                   /* the runner reported a finished generation */
    double submitted_at, started_at, ended_at;
    uint64_t tokens;           /* tokens the runner reported */
    void *worker;              /* the runner's */
    genq_sink_fn sink;
    void *sink_ctx;
};

/* Who runs a request: start on devs[dev] (0, or the error: the request
 * ends with an "error" event), cancel (kill it now; it ends through
 * genq_ended as any). On the loop thread. */
typedef struct genq_runner {
    int (*start)(void *ctx, genq_req *r, const kern_device_info *dev, acc_err *err);
    void (*cancel)(void *ctx, genq_req *r);
    void *ctx;
} genq_runner;

/* Counters since start (/metrics). */
typedef struct genq_stats {
    uint64_t requests, completed, failed, cancelled, tokens;
    double queue_seconds, run_seconds;     /* summed over ended requests */
} genq_stats;

struct genq {
    struct jobs_mgr *m;
    genq_req *head, *tail;
    int nqueued, nrunning;
    uint64_t next_id;
    genq_runner runner;
    genq_stats stats;
};

/* Ready, attached to `m` (m->gen and its after_schedule hook). */
void genq_init(genq *q, struct jobs_mgr *m);
/* Every request cancelled (shutdown). */
void genq_shutdown(genq *q);
void genq_set_runner(genq *q, const genq_runner *r);

/* A new request (owner, its worker request text copied, its bytes), not
 * yet queued. NULL when out of memory. */
genq_req *genq_req_new(genq *q, const char *owner, const char *request, uint64_t mem_bytes, genq_sink_fn sink,
                       void *sink_ctx);
/* Queue it; the device may be lent at once (a "started" event before this
 * returns). ACC_EINVAL naming "model" when no device could ever hold it,
 * ACC_EUNAVAIL when no runner is installed or the daemon is stopping. */
int genq_submit(genq *q, genq_req *r, acc_err *err);
/* The owner no longer wants it (the client went away). */
void genq_cancel(genq *q, genq_req *r);
/* After "end" (or a failed genq_submit): free it. */
void genq_req_free(genq_req *r);

/* Lend free devices to queued requests, in order (the jobs manager's
 * after_schedule hook calls it). */
void genq_place(genq *q);

/* From the runner: an event of the request's worker, handed to its sink;
 * "done" marks it finished well (`tokens` from its count). */
void genq_event(genq *q, genq_req *r, const char *type, const char *json, size_t len, uint64_t tokens);
/* From the runner: the worker is gone; the device is given back, the
 * request ends ("end") and the queue moves. */
void genq_ended(genq *q, genq_req *r);

/* The device lent to a request (-1: none). */
const genq_req *genq_on_device(const genq *q, int dev);

#endif
