/* evring: one job's bounded ring of events, shared by all of its watchers.
 *
 * Events are JSON texts with a sequence number that grows by one per event,
 * across daemon restarts too (the store reloads the last one). The ring keeps
 * the newest `cap` events; a watcher that falls behind finds its next
 * sequence number gone (evring_get returns NULL, seq < evring_first) and
 * skips ahead: it is the watcher's job to tell its client with a `gap` event.
 * Pushing never waits for a watcher. Watchers register a notify callback,
 * called on the pushing thread (the daemon's loop thread) after each push
 * and when the ring closes (the job reached a final state).
 *
 * Not thread-safe: the loop thread owns every ring.
 */
#ifndef ACC_EVRING_H
#define ACC_EVRING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"

typedef struct evring_entry {
    uint64_t seq;      /* 0 = empty slot */
    char type[16];     /* "state", "step", ... */
    char *json;        /* the event object, one line, no newline */
    size_t len;
} evring_entry;

typedef struct evring_watcher evring_watcher;
struct evring_watcher {
    evring_watcher *prev, *next;
    void (*notify)(evring_watcher *w);
    void *data;
};

typedef struct evring {
    evring_entry *slots;
    int cap;           /* the most events it keeps (event_ring) */
    int nslots;        /* slots allocated now: grows by doubling up to cap */
    uint64_t next_seq; /* the sequence number the next push gets; first is 1 */
    bool closed;       /* no more events until reopened */
    char job[32];      /* the job's id, for the gap event (evring_gap_json) */
    evring_watcher *watchers;
} evring;

/* A ring keeping up to `cap` events. Its slots start few
 * (EVRING_FIRST_SLOTS) and double as events come, up to `cap`: a queued
 * job with its one event costs a few hundred bytes, not `cap` slots. */
#define EVRING_FIRST_SLOTS 8
int evring_init(evring *r, int cap, acc_err *err);
void evring_free(evring *r);

/* Append an event; `json` is copied. Sets *seq_out (may be NULL).
 * ACC_ENOMEM (nothing pushed) when the slots cannot grow. */
int evring_push(evring *r, const char *type, const char *json, size_t len, uint64_t *seq_out, acc_err *err);

/* Before any push: continue numbering at `next_seq` (reload after restart). */
void evring_start_at(evring *r, uint64_t next_seq);

/* Oldest sequence number still held (== next_seq when empty). */
uint64_t evring_first(const evring *r);

/* The event with sequence `seq`, or NULL when not (or no longer) held. */
const evring_entry *evring_get(const evring *r, uint64_t seq);

/* Mark the stream finished (watchers end after the last event). */
void evring_close(evring *r);

/* The `gap` event a watcher that missed [from, to] gets instead, as one
 * JSON line like the job's own events: seq (= to, so a resume with
 * Last-Event-ID goes on after the gap), type, time (now), job, from, to,
 * missed. Returns its length; 0 when `n` is too small. */
size_t evring_gap_json(const evring *r, uint64_t from, uint64_t to, char *out, size_t n);

void evring_watch(evring *r, evring_watcher *w);
void evring_unwatch(evring *r, evring_watcher *w);

#endif
