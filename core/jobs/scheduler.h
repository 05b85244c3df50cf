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
    /* out */
    bool start;
    int placed[SCHED_MAX_GANG];
    bool backfilled;
} sched_req;

/* < 0 when a runs before b. */
int sched_order(int prio_a, uint64_t submit_a, int prio_b, uint64_t submit_b);

/* Can `want` devices of one kind ever be given (0), or never (ACC_EINVAL
 * naming "devices")? */
int sched_can_ever_fit(const sched_dev *devs, int ndev, int want, acc_err *err);

/* Sort `q` into run order and mark what starts now (start, placed[]).
 * devs[] is updated: placed devices become busy. Returns how many start. */
int sched_plan(sched_dev *devs, int ndev, sched_req *q, int nq);

#endif
