/* host_mem: see host_mem.h. */
#include "host_mem.h"

#include <stdlib.h>
#include <string.h>

#include "checked.h"

#define HOST_MEM_ALIGN 64

void host_mem_init(host_mem *h, uint64_t budget)
{
    pthread_mutex_init(&h->mu, NULL);
    h->budget = budget;
    h->in_use = 0;
    h->peak = 0;
    h->capped = false;
}

void host_mem_init_capped(host_mem *h, uint64_t budget)
{
    host_mem_init(h, budget);
    h->capped = true;
}

uint64_t host_mem_budget(const host_mem *h)
{
    return h->budget;
}

void host_mem_destroy(host_mem *h)
{
    pthread_mutex_destroy(&h->mu);
}

/* Counts `bytes` in when the budget has room; false otherwise. */
static int reserve(host_mem *h, uint64_t bytes)
{
    pthread_mutex_lock(&h->mu);
    uint64_t next;
    int ok = !acc_add_u64(h->in_use, bytes, &next) && ((h->budget == 0 && !h->capped) || next <= h->budget);
    if (ok) {
        h->in_use = next;
        if (next > h->peak)
            h->peak = next;
    }
    pthread_mutex_unlock(&h->mu);
    return ok;
}

static void release(host_mem *h, uint64_t bytes)
{
    pthread_mutex_lock(&h->mu);
    h->in_use -= bytes;
    pthread_mutex_unlock(&h->mu);
}

int host_mem_alloc(host_mem *h, size_t bytes, void **out, acc_err *err)
{
    *out = NULL;
    if (bytes == 0)
        return 0;
    if (!reserve(h, bytes))
        return acc_err_set(err, ACC_ENOMEM, "host memory",
                           "%zu more bytes would exceed the job's host memory (%llu of %llu bytes in use)",
                           bytes, (unsigned long long)host_mem_in_use(h), (unsigned long long)h->budget);
    size_t rounded = (bytes + HOST_MEM_ALIGN - 1) / HOST_MEM_ALIGN * HOST_MEM_ALIGN;
    void *p = rounded >= bytes ? aligned_alloc(HOST_MEM_ALIGN, rounded) : NULL;
    if (p == NULL) {
        release(h, bytes);
        return acc_err_set(err, ACC_ENOMEM, "host memory", "the system refused %zu bytes", bytes);
    }
    memset(p, 0, bytes);
    *out = p;
    return 0;
}

void host_mem_free(host_mem *h, void *p, size_t bytes)
{
    if (p == NULL)
        return;
    free(p);
    release(h, bytes);
}

uint64_t host_mem_in_use(host_mem *h)
{
    pthread_mutex_lock(&h->mu);
    uint64_t v = h->in_use;
    pthread_mutex_unlock(&h->mu);
    return v;
}

uint64_t host_mem_peak(host_mem *h)
{
    pthread_mutex_lock(&h->mu);
    uint64_t v = h->peak;
    pthread_mutex_unlock(&h->mu);
    return v;
}
