/* oom: see oom.h. */
#include "oom.h"

#include <stdio.h>
#include <stdlib.h>

void oom_record_hit(oom_record *rec, const kern_device *dev, uint64_t asked)
{
    rec->hit = 1;
    rec->asked = asked;
    rec->budget = dev->budget;
    rec->free_bytes = dev->budget > dev->in_use ? dev->budget - dev->in_use : 0;
    snprintf(rec->device, sizeof rec->device, "%s", dev->info.name);
}

const oom_record *oom_first(const oom_record *recs, int w)
{
    for (int r = 0; r < w; r++)
        if (recs[r].hit)
            return &recs[r];
    return &recs[0];
}

int oom_share(kern_comm *c, int rank, int w, kern_device *dev, float *buf, size_t buf_n, oom_record *recs)
{
    enum { PIECES = (sizeof(oom_record) + 1) / 2 };
    size_t n = (size_t)w * PIECES;
    if (n > buf_n)
        return 0;
    float *host = calloc(n, sizeof *host);
    if (host == NULL)
        return ACC_ENOMEM;
    const uint8_t *mine = (const uint8_t *)&recs[rank];
    float *part = host + (size_t)rank * PIECES;
    for (size_t i = 0; i < sizeof(oom_record); i++)
        part[i / 2] += (float)((unsigned)mine[i] << (8 * (i % 2)));
    dev->ops->upload(dev, buf, host, n * sizeof *host);
    int rc = kern_comm_allreduce(c, rank, buf, n);
    dev->ops->download(dev, host, buf, n * sizeof *host);
    for (int r = 0; rc == 0 && r < w; r++) {
        uint8_t *rec = (uint8_t *)&recs[r];
        for (size_t i = 0; i < sizeof(oom_record); i++)
            rec[i] = (uint8_t)(((unsigned)host[(size_t)r * PIECES + i / 2] >> (8 * (i % 2))) & 0xffu);
    }
    free(host);
    return rc;
}

int oom_next_split(bool adapt, batch_split *split, int *recompute, int *ceiling, const char **why)
{
    int next = batch_split_smaller_micro(split);
    if (*ceiling == 0 || split->m < *ceiling)
        *ceiling = split->m; /* never move back up to a size that failed */
    *why = NULL;
    if (!adapt)
        *why = "oom.adapt is off";
    else if (next > 0)
        batch_split_with_micro(split, next, split); /* next divides B / w */
    else if (!*recompute)
        *recompute = 1;
    else
        *why = "no smaller split remains";
    return *why != NULL ? ACC_EOOM : 0;
}

int oom_fail(const oom_record *r, int m, int recompute, uint64_t state, uint64_t acts, const char *why,
             acc_err *err)
{
    return acc_err_set(err, ACC_EOOM, "",
                       "out of memory at micro batch %d%s: a device needs %llu bytes "
                       "(%llu of weights, gradients and AdamW state + %llu of activations), "
                       "device %s has a budget of %llu bytes (%llu free when %llu were asked); %s",
                       m, recompute ? " with activation recomputation" : "",
                       (unsigned long long)(state + acts), (unsigned long long)state,
                       (unsigned long long)acts, r->device, (unsigned long long)r->budget,
                       (unsigned long long)r->free_bytes, (unsigned long long)r->asked, why);
}

void oom_adjust_msg(char *buf, size_t n, const oom_record *r, int step, const batch_split *from,
                    const batch_split *to, int recompute)
{
    snprintf(buf, n,
             "device %s out of memory in step %d (%llu bytes asked, %llu free of %llu): "
             "micro batch %d x %d accumulation steps -> %d x %d%s; redoing the step",
             r->device, step + 1, (unsigned long long)r->asked, (unsigned long long)r->free_bytes,
             (unsigned long long)r->budget, from->m, from->a, to->m, to->a,
             recompute ? " with activation recomputation" : "");
}
