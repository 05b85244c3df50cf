/* host_mem: one job's host-memory budget, shared by its ranks.
 *
 * What a job keeps in host memory because it chose to (the offloaded
 * optimizer state, parameter partitions, activation checkpoints) is
 * allocated here, so that its bytes are counted against the host memory
 * the daemon reserved for the job (host_memory) and its peak can be
 * compared with the planner's host prediction to the byte. A request past
 * the budget is ACC_ENOMEM naming "host memory" (never a kernel OOM kill
 * later): the caller fails the job with it, or refuses the job up front.
 * Blocks are 64-byte aligned and zeroed. Thread-safe.
 *
 * The trainer's own small buffers (a micro batch's token ids) are not
 * allocated here; the planner counts them separately (plan host parts).
 */
#ifndef ACC_HOST_MEM_H
#define ACC_HOST_MEM_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"

typedef struct host_mem {
    pthread_mutex_t mu;
    uint64_t budget;  /* bytes allowed; 0 = unlimited */
    uint64_t in_use;  /* bytes allocated now */
    uint64_t peak;    /* most bytes allocated at once */
    bool capped;      /* host_mem_init_capped: budget 0 allows nothing */
} host_mem;

/* A budget of `budget` bytes (0: unlimited), nothing allocated. */
void host_mem_init(host_mem *h, uint64_t budget);
void host_mem_destroy(host_mem *h);
/* A budget of exactly `budget` bytes, 0 included (nothing may be
 * allocated): a job whose reservation its batch buffers fill. */
void host_mem_init_capped(host_mem *h, uint64_t budget);
/* Bytes allowed (0: unlimited unless capped). */
uint64_t host_mem_budget(const host_mem *h);

/* *out = `bytes` zeroed bytes (64-byte aligned) counted against the
 * budget; *out = NULL for 0 bytes. ACC_ENOMEM naming "host memory" when
 * the budget would be exceeded or the system refuses; nothing changes then. */
int host_mem_alloc(host_mem *h, size_t bytes, void **out, acc_err *err);
/* Frees what host_mem_alloc(h, bytes, ...) returned (NULL is a no-op). */
void host_mem_free(host_mem *h, void *p, size_t bytes);

/* Bytes allocated now / at most since init. */
uint64_t host_mem_in_use(host_mem *h);
uint64_t host_mem_peak(host_mem *h);

#endif
