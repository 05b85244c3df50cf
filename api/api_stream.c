/* api_stream: a job's events as a live HTTP stream, SSE or NDJSON.
 *
 * Contract: the stream sends every event of the job's ring from a start
 * sequence on, then waits, suspended (MHD_suspend_connection: no thread, no
 * polling), until the ring's notify resumes it; it ends after the last event
 * once the ring is closed (the job is final). A watcher that fell more than
 * the ring's capacity behind gets one `gap` event naming the missed range
 * and goes on from the oldest event still held; it never slows the job.
 * SSE: "id: <seq>\nevent: <type>\ndata: <json>\n\n"; NDJSON: "<json>\n".
 * Only the loop thread touches streams.
 *
 * Streams hold their connection for as long as the client stays, reading
 * or not: they are counted apart from ordinary requests, per user and in
 * total (api_stream_admit), below the connection limits, so a crowd of
 * idle watchers never takes the slots /healthz, submits, cancels and
 * lists need (conf.h: max_streams, user_max_streams).
 */
#include <inttypes.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_http.h"
#include "evring.h"
#include "log.h"

#define STREAM_BATCH (64 * 1024) /* bytes formatted per refill */

struct api_stream {
    api_stream *prev, *next; /* the server's list */
    api_server *srv;
    struct MHD_Connection *conn;
    evring *ring;
    evring_watcher w;
    uint64_t next_seq;
    char user[API_NAME_MAX]; /* who watches: the per-user count */
    bool ndjson, suspended, ending, ping;
    char *buf;
    size_t len, off, cap;
};

static int buf_reserve(api_stream *st, size_t more)
{
    if (st->len + more <= st->cap)
        return 0;
    size_t cap = st->cap ? st->cap : 4096;
    while (cap < st->len + more)
        cap *= 2;
    char *nb = realloc(st->buf, cap);
    if (nb == NULL)
        return -1;
    st->buf = nb;
    st->cap = cap;
    return 0;
}

static int put_event(api_stream *st, uint64_t seq, const char *type, const char *json, size_t jlen)
{
    char head[96];
    int hl = st->ndjson ? 0 : snprintf(head, sizeof head, "id: %" PRIu64 "\nevent: %s\ndata: ", seq, type);
    size_t tail = st->ndjson ? 1 : 2;
    if (hl < 0 || buf_reserve(st, (size_t)hl + jlen + tail) != 0)
        return -1;
    memcpy(st->buf + st->len, head, (size_t)hl);
    memcpy(st->buf + st->len + hl, json, jlen);
    memcpy(st->buf + st->len + hl + jlen, "\n\n", tail);
    st->len += (size_t)hl + jlen + tail;
    return 0;
}

/* The watcher missed [from, to]: say so, with the id of the last missed
 * event so a reconnect with Last-Event-ID resumes after the gap. */
static int put_gap(api_stream *st, uint64_t from, uint64_t to)
{
    char json[256];
    size_t n = evring_gap_json(st->ring, from, to, json, sizeof json);
    return n > 0 ? put_event(st, to, "gap", json, n) : -1;
}

/* Format what the ring holds past next_seq, up to STREAM_BATCH bytes. */
static int refill(api_stream *st)
{
    st->len = st->off = 0;
    const evring *r = st->ring;
    while (st->len < STREAM_BATCH && st->next_seq < r->next_seq) {
        uint64_t first = evring_first(r);
        if (st->next_seq < first) {
            if (put_gap(st, st->next_seq, first - 1) != 0)
                return -1;
            st->next_seq = first;
            continue;
        }
        const evring_entry *e = evring_get(r, st->next_seq);
        st->next_seq++;
        if (e != NULL && put_event(st, e->seq, e->type, e->json, e->len) != 0)
            return -1;
    }
    if (st->len == 0 && st->ping && !st->ndjson) {
        if (buf_reserve(st, 3) != 0)
            return -1;
        memcpy(st->buf, ":\n\n", 3); /* SSE comment: keeps proxies and clients awake */
        st->len = 3;
    }
    st->ping = false;
    return 0;
}

static ssize_t reader(void *cls, uint64_t pos, char *out, size_t max)
{
    api_stream *st = cls;
    if (st->off == st->len && !st->ending && refill(st) != 0)
        return MHD_CONTENT_READER_END_WITH_ERROR;
    if (st->off < st->len) {
        size_t n = st->len - st->off < max ? st->len - st->off : max;
        memcpy(out, st->buf + st->off, n);
        st->off += n;
        return (ssize_t)n;
    }
    if (st->ending || st->ring->closed)
        return MHD_CONTENT_READER_END_OF_STREAM;
    st->suspended = true; /* until the ring has news */
    MHD_suspend_connection(st->conn);
    return 0;
}

static void resume(api_stream *st)
{
    if (!st->suspended)
        return;
    st->suspended = false;
    MHD_resume_connection(st->conn);
    api_server_kick(st->srv);
}

static void on_ring(evring_watcher *w) { resume(w->data); }

static void unlink_stream(api_stream *st)
{
    api_stream **head = api_server_streams(st->srv);
    if (st->prev != NULL)
        st->prev->next = st->next;
    else if (*head == st)
        *head = st->next;
    if (st->next != NULL)
        st->next->prev = st->prev;
    st->prev = st->next = NULL;
}

static void free_stream(void *cls)
{
    api_stream *st = cls;
    evring_unwatch(st->ring, &st->w);
    unlink_stream(st);
    free(st->buf);
    free(st);
}

bool api_stream_admit(api_server *s, const api_ident *who, api_response *resp)
{
    const acc_conf *c = api_server_conf(s);
    int total = 0, mine = 0;
    for (api_stream *st = *api_server_streams(s); st != NULL; st = st->next) {
        total++;
        mine += !strcmp(st->user, who->name);
    }
    if (mine >= c->user_max_streams)
        api_resp_error(resp, 429, "too_many_requests", NULL,
                       "user_max_streams %d reached: %s has %d open event streams; close one first",
                       c->user_max_streams, who->name, mine);
    else if (total >= c->max_streams)
        api_resp_error(resp, 503, "unavailable", NULL,
                       "max_streams %d reached: %d event streams are open; try again later", c->max_streams, total);
    else
        return true;
    resp->close = true;
    return false;
}

api_stream *api_stream_new(api_server *s, struct MHD_Connection *conn, struct evring *ring, uint64_t from,
                           bool ndjson, const api_ident *who)
{
    api_stream *st = calloc(1, sizeof *st);
    if (st == NULL)
        return NULL;
    snprintf(st->user, sizeof st->user, "%s", who->name);
    st->srv = s;
    st->conn = conn;
    st->ring = ring;
    st->next_seq = from < 1 ? 1 : from;
    st->ndjson = ndjson;
    st->w.notify = on_ring;
    st->w.data = st;
    return st;
}

struct MHD_Response *api_stream_response(api_stream *st)
{
    struct MHD_Response *mr = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, reader, st, free_stream);
    if (mr == NULL) {
        free(st);
        return NULL;
    }
    /* linked only now: from here the response owns the stream */
    evring_watch(st->ring, &st->w);
    api_stream **head = api_server_streams(st->srv);
    st->next = *head;
    if (*head != NULL)
        (*head)->prev = st;
    *head = st;
    MHD_add_response_header(mr, MHD_HTTP_HEADER_CONTENT_TYPE,
                            st->ndjson ? "application/x-ndjson" : "text/event-stream");
    MHD_add_response_header(mr, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(mr, "X-Accel-Buffering", "no");
    return mr;
}

void api_stream_end_all(api_server *s)
{
    for (api_stream *st = *api_server_streams(s); st != NULL; st = st->next) {
        st->ending = true;
        resume(st);
    }
}

void api_stream_ping_all(api_server *s)
{
    for (api_stream *st = *api_server_streams(s); st != NULL; st = st->next) {
        if (!st->suspended || st->ndjson)
            continue;
        st->ping = true;
        resume(st);
    }
}
