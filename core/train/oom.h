/* oom: agreeing across ranks that a step attempt ran out of device memory,
 * and the adaptation every rank then applies alike (docs/engine.md,
 * "Memory").
 *
 * Agreement. A rank whose allocation in a step attempt fails with ACC_EOOM
 * does not bail out: it fills its oom_record (oom_record_hit), skips its
 * micro-steps and joins the step's one reduction with a flag in the
 * trainer's tail slots, so the agreement costs no extra communication and
 * no rank waits for one that left. When the reduced flag is set, every
 * rank has the records of all (threads share memory; rank processes call
 * oom_share, which moves them once, on this path only) and reports the
 * first rank's (oom_first).
 *
 * Adaptation (oom_next_split): the same rule on every rank, from the same
 * numbers, so no further agreement is needed: m := the largest divisor of
 * B / w below m, a := B / (m w); at m = 1, activation recomputation; after
 * that nothing is left and the run ends with ACC_EOOM and the numbers
 * (oom_fail). The smallest micro batch that failed is remembered (the
 * ceiling), so "auto" never moves back up to it. The step is redone with
 * the same samples (slots depend on (seed, B, k) only).
 */
#ifndef ACC_OOM_H
#define ACC_OOM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "batch_split.h"
#include "err.h"
#include "kern_comm.h"
#include "kern_device.h"

/* What one rank saw in a step attempt; written by the rank before the
 * step's reduction, read by the others after it (out-of-memory path only). */
typedef struct oom_record {
    int hit;                   /* this rank ran out of device memory */
    uint64_t asked, free_bytes, budget;
    char device[128];
} oom_record;

/* `dev` could not give `asked` bytes: fill `rec` with it. */
void oom_record_hit(oom_record *rec, const kern_device *dev, uint64_t asked);

/* The record of the first rank of recs[0..w) that ran out (rank 0's when none did). */
const oom_record *oom_first(const oom_record *recs, int w);

/* Rank processes: every rank's record to every rank, through the device
 * buffer buf[0..buf_n) (its contents are overwritten; the caller zeroes
 * it after): each rank writes its record recs[rank] as 16-bit pieces,
 * exact in a float sum with zeros, into its own part, and one all-reduce
 * gives every rank all of recs[0..w). Nothing is moved when the records
 * do not fit buf_n. 0, or the communicator's code. */
int oom_share(kern_comm *c, int rank, int w, kern_device *dev, float *buf, size_t buf_n, oom_record *recs);

/* The split after an agreed out-of-memory: a smaller micro batch, else
 * recomputation (*recompute set), else none left. *ceiling (0 = none)
 * becomes the smallest micro batch that failed. 0 when the split moved;
 * ACC_EOOM with *why set when it cannot (adapt false, or nothing left). */
int oom_next_split(bool adapt, batch_split *split, int *recompute, int *ceiling, const char **why);

/* The run's end after an out-of-memory it cannot adapt to: ACC_EOOM in
 * err with the numbers (a device needs state + acts bytes at micro batch
 * m, its budget, what was asked and free) and `why`. */
int oom_fail(const oom_record *r, int m, int recompute, uint64_t state, uint64_t acts, const char *why,
             acc_err *err);

/* The adaptation's message for the job's events: which device, in which
 * step (0-based), the split before and after. */
void oom_adjust_msg(char *buf, size_t n, const oom_record *r, int step, const batch_split *from,
                    const batch_split *to, int recompute);

#endif
