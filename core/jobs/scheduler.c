/* scheduler: see scheduler.h. */
#include "scheduler.h"

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
    int started = 0;
    const sched_req *head = NULL;
    kern_dev_kind hk = KERN_DEV_CPU;
    qsort(q, (size_t)nq, sizeof *q, cmp_req);
    for (int i = 0; i < nq; i++) {
        sched_req *r = &q[i];
        r->start = false;
        r->backfilled = false;
        if (r->want < 1 || r->want > SCHED_MAX_GANG)
            continue;
        int kind = kind_with_room(devs, ndev, r->want);
        if (head == NULL) {
            if (kind >= 0) {
                place(devs, ndev, r, (kern_dev_kind)kind);
                started++;
                continue;
            }
            head = r;
            hk = head_kind(devs, ndev);
            continue;
        }
        if (kind < 0)
            continue;
        /* backfill: the head must still find its gang among the devices
         * that jobs behind it do not hold */
        int take = kind == (int)hk ? r->want : 0;
        int total = count_kind(devs, ndev, hk, false);
        if (total - held_behind(devs, ndev, hk, head) - take < head->want)
            continue;
        place(devs, ndev, r, (kern_dev_kind)kind);
        r->backfilled = true;
        started++;
    }
    return started;
}
