/* http_load: a small closed-loop HTTP/1.1 load generator for loopback
 * benchmarks (a stand-in for wrk where it is not installed).
 *
 *   http_load HOST PORT CONNECTIONS SECONDS PATH [PATH...]
 *
 * Opens CONNECTIONS keep-alive connections to HOST:PORT (numeric IPv4), each
 * sending one GET at a time, the paths in turn; after SECONDS prints one
 * line: requests/s, p50, p99, max latency (ms), errors. Latency is from the
 * request's first byte written to the response's last byte read (the body
 * is framed by Content-Length). Bounded: at most 256 connections, 64 paths,
 * 300 seconds, 10 million latency samples.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONNS 256
#define MAX_PATHS 64
#define MAX_SAMPLES 10000000
#define RBUF (1 << 20)

typedef struct conn {
    int fd;
    double t0;
    char *buf;
    size_t len;
    int next_path;
} conn;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int open_conn(const struct sockaddr_in *sa)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0 ||
        connect(fd, (const struct sockaddr *)sa, sizeof *sa) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int send_req(conn *c, char *const *paths, int npaths, const char *host)
{
    char req[1024];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: keep-alive\r\n\r\n",
                     paths[c->next_path], host);
    c->next_path = (c->next_path + 1) % npaths;
    if (n < 0 || (size_t)n >= sizeof req)
        return -1;
    c->t0 = now_s();
    c->len = 0;
    for (int off = 0; off < n;) {
        ssize_t w = write(c->fd, req + off, (size_t)(n - off));
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        off += (int)w;
    }
    return 0;
}

/* 1: a whole response is in the buffer, 0: not yet, -1: malformed. */
static int response_done(const conn *c)
{
    const char *end = memmem(c->buf, c->len, "\r\n\r\n", 4);
    if (end == NULL)
        return c->len >= RBUF ? -1 : 0;
    size_t head = (size_t)(end - c->buf) + 4;
    const char *cl = NULL;
    for (const char *p = c->buf; p < end; p++)
        if ((p == c->buf || p[-1] == '\n') && !strncasecmp(p, "Content-Length:", 15)) {
            cl = p + 15;
            break;
        }
    if (cl == NULL)
        return -1;
    size_t body = strtoul(cl, NULL, 10);
    return c->len >= head + body ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: %s HOST PORT CONNECTIONS SECONDS PATH [PATH...]\n", argv[0]);
        return 2;
    }
    int nconn = atoi(argv[3]), secs = atoi(argv[4]), npaths = argc - 5;
    if (nconn < 1 || nconn > MAX_CONNS || secs < 1 || secs > 300 || npaths > MAX_PATHS) {
        fprintf(stderr, "http_load: 1..%d connections, 1..300 s, at most %d paths\n", MAX_CONNS, MAX_PATHS);
        return 2;
    }
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[2]))};
    if (inet_pton(AF_INET, argv[1], &sa.sin_addr) != 1) {
        fprintf(stderr, "http_load: HOST must be a numeric IPv4 address\n");
        return 2;
    }
    double *lat = malloc(MAX_SAMPLES * sizeof *lat);
    conn *cs = calloc((size_t)nconn, sizeof *cs);
    int ep = epoll_create1(0);
    if (lat == NULL || cs == NULL || ep < 0) {
        fprintf(stderr, "http_load: out of memory or epoll: %s\n", strerror(errno));
        return 1;
    }
    for (int i = 0; i < nconn; i++) {
        cs[i].buf = malloc(RBUF);
        cs[i].next_path = i % npaths;
        cs[i].fd = open_conn(&sa);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &cs[i]};
        if (cs[i].buf == NULL || cs[i].fd < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, cs[i].fd, &ev) != 0 ||
            send_req(&cs[i], argv + 5, npaths, argv[1]) != 0) {
            fprintf(stderr, "http_load: connection %d: %s\n", i, strerror(errno));
            return 1;
        }
    }
    size_t nlat = 0, errors = 0;
    double start = now_s(), stop = start + secs;
    struct epoll_event evs[MAX_CONNS];
    while (now_s() < stop) {
        int n = epoll_wait(ep, evs, MAX_CONNS, 100);
        if (n < 0 && errno != EINTR)
            break;
        for (int k = 0; k < n; k++) {
            conn *c = evs[k].data.ptr;
            ssize_t r = read(c->fd, c->buf + c->len, RBUF - c->len);
            if (r <= 0) {
                errors++;
                epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                close(c->fd);
                c->fd = open_conn(&sa);
                struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
                if (c->fd < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev) != 0 ||
                    send_req(c, argv + 5, npaths, argv[1]) != 0)
                    return 1;
                continue;
            }
            c->len += (size_t)r;
            int d = response_done(c);
            if (d == 0)
                continue;
            if (d < 0 || strncmp(c->buf, "HTTP/1.1 200", 12))
                errors++;
            else if (nlat < MAX_SAMPLES)
                lat[nlat++] = now_s() - c->t0;
            if (send_req(c, argv + 5, npaths, argv[1]) != 0)
                errors++;
        }
    }
    double wall = now_s() - start;
    qsort(lat, nlat, sizeof *lat, cmp_double);
    double p50 = nlat ? lat[nlat / 2] : 0, p99 = nlat ? lat[(size_t)((double)nlat * 0.99)] : 0;
    printf("requests/s %.0f p50_ms %.3f p99_ms %.3f max_ms %.3f requests %zu errors %zu\n", (double)nlat / wall,
           p50 * 1e3, p99 * 1e3, nlat ? lat[nlat - 1] * 1e3 : 0, nlat, errors);
    for (int i = 0; i < nconn; i++) {
        if (cs[i].fd >= 0)
            close(cs[i].fd);
        free(cs[i].buf);
    }
    free(cs);
    free(lat);
    close(ep);
    return 0;
}
