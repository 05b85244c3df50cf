/* evring: see evring.h. The slot of sequence s is (s - 1) % nslots. */
#include "evring.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int evring_init(evring *r, int cap, acc_err *err)
{
    memset(r, 0, sizeof *r);
    if (cap < 1)
        return acc_err_set(err, ACC_EINVAL, "event_ring", "event ring capacity must be >= 1");
    int n = cap < EVRING_FIRST_SLOTS ? cap : EVRING_FIRST_SLOTS;
    r->slots = calloc((size_t)n, sizeof *r->slots);
    if (r->slots == NULL)
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory for an event ring");
    r->cap = cap;
    r->nslots = n;
    r->next_seq = 1;
    return 0;
}

void evring_free(evring *r)
{
    if (r->slots != NULL)
        for (int i = 0; i < r->nslots; i++)
            free(r->slots[i].json);
    free(r->slots);
    r->slots = NULL;
    r->watchers = NULL;
}

static void notify_all(evring *r)
{
    evring_watcher *w = r->watchers, *next;
    for (; w != NULL; w = next) {
        next = w->next; /* the callback may unwatch itself */
        w->notify(w);
    }
}

/* Twice the slots (at most cap), every held event moved to its new slot:
 * they are consecutive and fewer than the new count, so none collide. */
static int grow(evring *r, acc_err *err)
{
    int n = r->nslots > r->cap / 2 ? r->cap : r->nslots * 2;
    evring_entry *ns = calloc((size_t)n, sizeof *ns);
    if (ns == NULL)
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory for an event ring of %d", n);
    for (int i = 0; i < r->nslots; i++)
        if (r->slots[i].seq != 0)
            ns[(r->slots[i].seq - 1) % (uint64_t)n] = r->slots[i];
    free(r->slots);
    r->slots = ns;
    r->nslots = n;
    return 0;
}

int evring_push(evring *r, const char *type, const char *json, size_t len, uint64_t *seq_out, acc_err *err)
{
    uint64_t seq = r->next_seq;
    /* the slot is taken by an older event: grow while below cap, else overwrite */
    if (r->slots[(seq - 1) % (uint64_t)r->nslots].seq != 0 && r->nslots < r->cap && grow(r, err) != 0)
        return ACC_ENOMEM;
    char *copy = malloc(len + 1);
    if (copy == NULL)
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory for an event");
    memcpy(copy, json, len);
    copy[len] = '\0';
    r->next_seq++;
    evring_entry *e = &r->slots[(seq - 1) % (uint64_t)r->nslots];
    free(e->json);
    e->seq = seq;
    snprintf(e->type, sizeof e->type, "%s", type);
    e->json = copy;
    e->len = len;
    if (seq_out != NULL)
        *seq_out = seq;
    notify_all(r);
    return 0;
}

void evring_start_at(evring *r, uint64_t next_seq)
{
    if (r->next_seq == 1 && next_seq > 1)
        r->next_seq = next_seq;
}

uint64_t evring_first(const evring *r)
{
    uint64_t n = (uint64_t)r->nslots;
    uint64_t oldest = r->next_seq > n ? r->next_seq - n : 1;
    /* after evring_start_at, slots below the first pushed event are empty */
    while (oldest < r->next_seq && r->slots[(oldest - 1) % n].seq != oldest)
        oldest++;
    return oldest;
}

const evring_entry *evring_get(const evring *r, uint64_t seq)
{
    if (seq < evring_first(r) || seq >= r->next_seq)
        return NULL;
    const evring_entry *e = &r->slots[(seq - 1) % (uint64_t)r->nslots];
    return e->seq == seq ? e : NULL;
}

void evring_close(evring *r)
{
    r->closed = true;
    notify_all(r);
}

size_t evring_gap_json(const evring *r, uint64_t from, uint64_t to, char *out, size_t n)
{
    struct timespec ts;
    struct tm tm;
    char when[40];
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t k = strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(when + k, sizeof when - k, ".%03dZ", (int)(ts.tv_nsec / 1000000));
    /* the id is the job grammar ([a-z0-9-]): nothing to escape */
    int w = snprintf(out, n,
                     "{\"seq\":%" PRIu64 ",\"type\":\"gap\",\"time\":\"%s\",\"job\":\"%s\",\"from\":%" PRIu64
                     ",\"to\":%" PRIu64 ",\"missed\":%" PRIu64 "}",
                     to, when, r->job, from, to, to >= from ? to - from + 1 : 0);
    return w < 0 || (size_t)w >= n ? 0 : (size_t)w;
}

void evring_watch(evring *r, evring_watcher *w)
{
    w->prev = NULL;
    w->next = r->watchers;
    if (r->watchers != NULL)
        r->watchers->prev = w;
    r->watchers = w;
}

void evring_unwatch(evring *r, evring_watcher *w)
{
    if (w->prev != NULL)
        w->prev->next = w->next;
    else if (r->watchers == w)
        r->watchers = w->next;
    if (w->next != NULL)
        w->next->prev = w->prev;
    w->prev = w->next = NULL;
}
