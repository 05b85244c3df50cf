/* scheduler (sched_): which queued jobs start now, and on which devices.
 *
 * Pure placement logic, no I/O and no job structs, so it is unit-tested on
 * its own. The queue is ordered by priority (higher first), then submission
 * order (earlier first). A job is placed as a gang: all of its `want`
 * devices at once, all free and all of one kind. The head of the queue
 * starts as soon as it fits. While it waits, a later job may start
 * (backfill) only when it can never delay the head: without run-time
 * estimates that means the devices of the head's kind left to the head,
 * after every job ordered behind the head took its share, still cover what
 * the head asks.
 *
 * Users (sched_plan_users): within one priority the queue is served round
 * robin by user, as a lab's fair share: a job's depth is how many jobs of
 * its owner wait before it at that priority; lower depth first, then the
 * owner whose last job started longest ago, then submission order. So
 * two users with a burst each alternate, and one user's long queue never
 * starves another's first job. Per-user limits (running jobs, devices at
 * once) hold a job back while its owner is at the limit; such a job waits
 * for its owner's share and does not block the queue of other users.
 * Backfill still judges which running jobs are "behind" the head by
 * (priority, submission): running jobs carry no fair-order key.
 *
 * Host memory (sched_limits.host_on): each job reserves its host_bytes of
 * the host memory free while it runs. A job whose bytes do not fit waits
 * (host_wait) like one whose devices are busy, and may be the head; a
 * later job backfills only when the host memory it takes leaves the
 * head's host_bytes free (so it can never delay the head for want of
 * host memory).
 */
#ifndef ACC_SCHEDULER_H
#define ACC_SCHEDULER_H

#include <stdbool.h>
#include <stdint.h>

#include "err.h"
#include "kern_discover.h"

#define SCHED_MAX_GANG 16

typedef struct sched_dev {
    kern_dev_kind kind;
    bool busy;
    /* the order key of the job holding it (when busy) */
    int holder_prio;
    uint64_t holder_submit;
} sched_dev;

typedef struct sched_req {
    int want;                 /* devices asked */
    int prio;
    uint64_t submit;          /* submission order, unique */
    void *job;                /* the caller's, untouched */
    int user;                 /* the owner: an index of the caller's, 0..nusers-1 */
    uint64_t user_last;       /* when the owner last had a job started (0 = never;
                                 any increasing key, smaller = longer ago) */
    /* out */
    bool start;
    int placed[SCHED_MAX_GANG];
    bool backfilled;
    bool over_share;          /* held back: its owner is at a per-user limit */
    int depth;                /* jobs of the same owner and priority before it */
    /* in: host memory the job reserves while it runs (sched_limits.host_on) */
    uint64_t host_bytes;
    /* out: it waits because the host memory free is too little for it */
    bool host_wait;
} sched_req;

/* Per-user limits and what each user holds now (updated as jobs start). */
typedef struct sched_limits {
    int max_running;          /* jobs running at once per user, 0 = no limit */
    int max_devices;          /* devices held at once per user, 0 = no limit */
    int nusers;
    int *running;             /* [nusers] */
    int *devices;             /* [nusers] */
    /* host memory (config host_memory): with host_on, a job starts only
     * when its host_bytes fit host_free (then taken from it), and a
     * backfill never takes host memory the waiting head would need */
    bool host_on;
    uint64_t host_free;
} sched_limits;

/* < 0 when a runs before b. */
int sched_order(int prio_a, uint64_t submit_a, int prio_b, uint64_t submit_b);

/* Can `want` devices of one kind ever be given (0), or never (ACC_EINVAL
 * naming "devices")? */
int sched_can_ever_fit(const sched_dev *devs, int ndev, int want, acc_err *err);

/* Sort `q` into run order and mark what starts now (start, placed[]).
 * devs[] is updated: placed devices become busy. Returns how many start. */
int sched_plan(sched_dev *devs, int ndev, sched_req *q, int nq);

/* The same with owners: round robin by user within a priority, and the
 * limits of `lim` (NULL: none; every q[i].user must be < lim->nusers). */
int sched_plan_users(sched_dev *devs, int ndev, sched_req *q, int nq, sched_limits *lim);

#endif
