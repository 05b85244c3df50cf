/* scheduler: see scheduler.h. */
#include "scheduler.h"

#include <stdbool.h>
#include <stdlib.h>

int sched_order(int prio_a, uint64_t submit_a, int prio_b, uint64_t submit_b)
{
    if (prio_a != prio_b)
        return prio_a > prio_b ? -1 : 1;
    return submit_a < submit_b ? -1 : submit_a > submit_b ? 1 : 0;
}

static int cmp_req(const void *a, const void *b)
{
    const sched_req *x = a, *y = b;
    return sched_order(x->prio, x->submit, y->prio, y->submit);
}

/* Round robin by user within a priority (see scheduler.h). */
static int cmp_fair(const void *a, const void *b)
{
    const sched_req *x = a, *y = b;
    if (x->prio != y->prio)
        return x->prio > y->prio ? -1 : 1;
    if (x->depth != y->depth)
        return x->depth < y->depth ? -1 : 1;
    if (x->user != y->user && x->user_last != y->user_last)
        return x->user_last < y->user_last ? -1 : 1;
    return sched_order(x->prio, x->submit, y->prio, y->submit);
}

/* q sorted by (priority, submission): each job's depth among its owner's
 * jobs of the same priority, then the fair order. */
static void fair_sort(sched_req *q, int nq)
{
    int nusers = 0;
    for (int i = 0; i < nq; i++)
        if (q[i].user >= nusers)
            nusers = q[i].user + 1;
    int *seen = nusers > 0 ? calloc((size_t)nusers, sizeof *seen) : NULL;
    if (seen == NULL) /* out of memory: submission order, still correct */
        return;
    for (int i = 0, g = 0; i < nq; i++) {
        if (q[i].prio != q[g].prio) { /* a new priority group: reset its counts */
            for (int k = g; k < i; k++)
                seen[q[k].user < 0 ? 0 : q[k].user] = 0;
            g = i;
        }
        q[i].depth = q[i].user < 0 ? 0 : seen[q[i].user]++;
    }
    free(seen);
    qsort(q, (size_t)nq, sizeof *q, cmp_fair);
}

static bool over_share(const sched_limits *lim, const sched_req *r)
{
    if (lim == NULL || r->user < 0 || r->user >= lim->nusers)
        return false;
    return (lim->max_running > 0 && lim->running[r->user] + 1 > lim->max_running) ||
           (lim->max_devices > 0 && lim->devices[r->user] + r->want > lim->max_devices);
}

/* The host memory free has room for r. */
static bool host_fits(const sched_limits *lim, const sched_req *r)
{
    return lim == NULL || !lim->host_on || r->host_bytes <= lim->host_free;
}

/* A backfill of r leaves the waiting head's host bytes free. */
static bool host_leaves_head(const sched_limits *lim, const sched_req *r, const sched_req *head)
{
    if (lim == NULL || !lim->host_on || r->host_bytes == 0)
        return true;
    return r->host_bytes <= lim->host_free && lim->host_free - r->host_bytes >= head->host_bytes;
}

static void charge(sched_limits *lim, const sched_req *r)
{
    if (lim != NULL && lim->host_on)
        lim->host_free -= r->host_bytes; /* host_fits checked it */
    if (lim == NULL || r->user < 0 || r->user >= lim->nusers)
        return;
    lim->running[r->user]++;
    lim->devices[r->user] += r->want;
}

static int count_kind(const sched_dev *devs, int ndev, kern_dev_kind kind, bool free_only)
{
    int n = 0;
    for (int i = 0; i < ndev; i++)
        if (devs[i].kind == kind && (!free_only || !devs[i].busy))
            n++;
    return n;
}

int sched_can_ever_fit(const sched_dev *devs, int ndev, int want, acc_err *err)
{
    int cuda = count_kind(devs, ndev, KERN_DEV_CUDA, false), cpu = count_kind(devs, ndev, KERN_DEV_CPU, false);
    int most = cuda > cpu ? cuda : cpu;
    if (want > SCHED_MAX_GANG)
        return acc_err_set(err, ACC_EINVAL, "devices", "devices %d is over the limit of %d per job", want,
                           SCHED_MAX_GANG);
    if (want > most)
        return acc_err_set(err, ACC_EINVAL, "devices",
                           "devices %d can never be placed: this machine has %d device%s of one kind", want, most,
                           most == 1 ? "" : "s");
    return 0;
}

/* The kind a job of `want` devices can start on now, or -1. CUDA first. */
static int kind_with_room(const sched_dev *devs, int ndev, int want)
{
    if (count_kind(devs, ndev, KERN_DEV_CUDA, true) >= want)
        return KERN_DEV_CUDA;
    if (count_kind(devs, ndev, KERN_DEV_CPU, true) >= want)
        return KERN_DEV_CPU;
    return -1;
}

static void place(sched_dev *devs, int ndev, sched_req *r, kern_dev_kind kind)
{
    int k = 0;
    for (int i = 0; i < ndev && k < r->want; i++) {
        if (devs[i].kind != kind || devs[i].busy)
            continue;
        devs[i].busy = true;
        devs[i].holder_prio = r->prio;
        devs[i].holder_submit = r->submit;
        r->placed[k++] = i;
    }
    r->start = true;
}

/* The kind the blocked head will run on: the one with the most devices. */
static kern_dev_kind head_kind(const sched_dev *devs, int ndev)
{
    return count_kind(devs, ndev, KERN_DEV_CUDA, false) >= count_kind(devs, ndev, KERN_DEV_CPU, false)
               ? KERN_DEV_CUDA
               : KERN_DEV_CPU;
}

/* Devices of `kind` held by jobs ordered behind the head. */
static int held_behind(const sched_dev *devs, int ndev, kern_dev_kind kind, const sched_req *head)
{
    int n = 0;
    for (int i = 0; i < ndev; i++)
        if (devs[i].kind == kind && devs[i].busy &&
            sched_order(devs[i].holder_prio, devs[i].holder_submit, head->prio, head->submit) > 0)
            n++;
    return n;
}

int sched_plan(sched_dev *devs, int ndev, sched_req *q, int nq)
{
    return sched_plan_users(devs, ndev, q, nq, NULL);
}

int sched_plan_users(sched_dev *devs, int ndev, sched_req *q, int nq, sched_limits *lim)
{
    int started = 0;
    const sched_req *head = NULL;
    kern_dev_kind hk = KERN_DEV_CPU;
    qsort(q, (size_t)nq, sizeof *q, cmp_req);
    fair_sort(q, nq);
    for (int i = 0; i < nq; i++) {
        sched_req *r = &q[i];
        r->start = false;
        r->backfilled = false;
        r->over_share = over_share(lim, r);
        r->host_wait = false;
        if (r->want < 1 || r->want > SCHED_MAX_GANG || r->over_share)
            continue;
        int kind = kind_with_room(devs, ndev, r->want);
        r->host_wait = !host_fits(lim, r);
        if (head == NULL) {
            if (kind >= 0 && !r->host_wait) {
                place(devs, ndev, r, (kern_dev_kind)kind);
                charge(lim, r);
                started++;
                continue;
            }
            head = r;
            hk = head_kind(devs, ndev);
            continue;
        }
        if (kind < 0 || r->host_wait || !host_leaves_head(lim, r, head))
            continue;
        /* backfill: the head must still find its gang among the devices
         * that jobs behind it do not hold */
        int take = kind == (int)hk ? r->want : 0;
        int total = count_kind(devs, ndev, hk, false);
        if (total - held_behind(devs, ndev, hk, head) - take < head->want)
            continue;
        place(devs, ndev, r, (kern_dev_kind)kind);
        charge(lim, r);
        r->backfilled = true;
        started++;
    }
    return started;
}
