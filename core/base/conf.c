#include "conf.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

const char *const conf_keys[] = {
    "listen", "state_dir", "data_roots", "output_root", "token_file",
    "require_token", "devices", "cpu_devices", "cpu_device_memory",
    "cpu_threads_per_device", "max_body", "max_connections",
    "max_connections_per_ip", "connection_timeout", "header_timeout",
    "request_timeout", "max_pending_connections", "shutdown_grace",
    "checkpoint_keep", "event_ring", "log_level", "log_file",
    "users_file", "user_max_running", "user_max_devices", "history_keep",
    "worker_processes", "worker_heartbeat_timeout", "rank_processes", "mpi_launcher", "hostfile",
    "mpi_args", "rank_program",
    /* h-tmpl: bounded work on untrusted templates and tokenizers */
    "render_time_limit_ms", "tokenizer_match_limit", "heavy_requests_max", "heavy_requests_per_user",
    /* h-jobs, issue 25 */
    "max_queued_jobs", "user_max_queued", "max_streams", "user_max_streams", "cancel_grace",
    "hf_hub_cache", /* h-dsconf */
    "rank_watchdog_factor", "rank_watchdog_min", "mpi_interface", /* h-engine, issue 25 */
    "device_peak_flops", /* h-results, issue 23 */
    NULL,
};

void conf_defaults(acc_conf *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->listen, sizeof c->listen, "127.0.0.1:8470");
    snprintf(c->listen_host, sizeof c->listen_host, "127.0.0.1");
    c->listen_port = 8470;
    snprintf(c->state_dir, sizeof c->state_dir, "/var/lib/accumd");
    c->devices = CONF_DEVICES_AUTO;
    c->cpu_devices = 1;
    c->cpu_device_memory = 2ULL << 30;
    c->max_body = 1 << 20;
    c->max_connections = 1024;
    c->max_connections_per_ip = 600;
    c->connection_timeout = 60;
    c->header_timeout = 10;
    c->request_timeout = 120;
    c->max_pending_connections = 0; /* finalize: max_connections_per_ip less an eighth */
    c->shutdown_grace = 30;
    c->checkpoint_keep = 2;
    c->event_ring = 4096;
    c->history_keep = 100000;
    c->worker_processes = true;
    c->worker_heartbeat_timeout = 10;
    snprintf(c->mpi_launcher, sizeof c->mpi_launcher, "mpirun");
    c->max_queued_jobs = 10000; /* h-jobs, issue 25 */
    c->user_max_queued = 1000;
    c->user_max_streams = 64;
    c->cancel_grace = 30;
    c->rank_watchdog_factor = 10; /* h-engine, issue 25 */
    c->rank_watchdog_min = 600;
    snprintf(c->log_level, sizeof c->log_level, "info");
    /* h-tmpl */
    c->render_time_limit_ms = 2000;
    c->tokenizer_match_limit = 1000000;
    c->heavy_requests_max = 2;
    c->heavy_requests_per_user = 1;
}

int conf_parse_bytes(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    if (s == NULL || !isdigit((unsigned char)*s))
        return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0)
        return -1;
    unsigned shift = 0;
    switch (toupper((unsigned char)*end)) {
    case '\0': break;
    case 'K': shift = 10; end++; break;
    case 'M': shift = 20; end++; break;
    case 'G': shift = 30; end++; break;
    case 'T': shift = 40; end++; break;
    default: return -1;
    }
    if (*end == 'B' || *end == 'b' || (*end == 'i' && end[1] == 'B' && end++))
        end++;
    if (*end != '\0' || (shift && v > (UINT64_MAX >> shift)))
        return -1;
    *out = (uint64_t)v << shift;
    return 0;
}

int conf_parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    if (s == NULL || *s == '\0')
        return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return -1; /* no sign, no space, no hex: what strtoull forgives */
        unsigned d = (unsigned)(*s - '0');
        if (v > (max - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

int conf_parse_bool(const char *s, bool *out)
{
    static const char *const yes[] = {"1", "true", "yes", "on"}, *const no[] = {"0", "false", "no", "off"};
    for (size_t i = 0; s != NULL && i < sizeof yes / sizeof yes[0]; i++) {
        if (!strcasecmp(s, yes[i])) {
            *out = true;
            return 0;
        }
        if (!strcasecmp(s, no[i])) {
            *out = false;
            return 0;
        }
    }
    return -1;
}

/* Every integer key is non-negative: lo >= 0. */
static int parse_int(const char *key, const char *v, long lo, long hi, int *out, acc_err *err)
{
    uint64_t n;
    if (conf_parse_u64(v, (uint64_t)hi, &n) != 0 || n < (uint64_t)lo)
        return acc_err_set(err, ACC_EINVAL, key, "%s must be an integer in [%ld, %ld], got '%s'",
                           key, lo, hi, v);
    *out = (int)n;
    return 0;
}

/* A string key: fits, no control characters (they reach an argv), and
 * not empty where `needed`. */
static int set_str(const char *key, const char *v, bool needed, char *out, size_t n, acc_err *err)
{
    if (strlen(v) >= n)
        return acc_err_set(err, ACC_EINVAL, key, "%s is too long (at most %zu bytes)", key, n - 1);
    if (needed && v[0] == '\0')
        return acc_err_set(err, ACC_EINVAL, key, "%s must not be empty", key);
    for (const char *p = v; *p; p++)
        if ((unsigned char)*p < 0x20 && *p != '\t')
            return acc_err_set(err, ACC_EINVAL, key, "%s holds a control character", key);
    snprintf(out, n, "%s", v);
    return 0;
}

static int parse_bool(const char *key, const char *v, bool *out, acc_err *err)
{
    if (conf_parse_bool(v, out) == 0)
        return 0;
    return acc_err_set(err, ACC_EINVAL, key, "%s must be true or false, got '%s'", key, v);
}

static int parse_path(const char *key, const char *v, char *dst, size_t n, acc_err *err)
{
    if (v[0] == '\0')
        return acc_err_set(err, ACC_EINVAL, key, "%s must not be empty", key);
    if (strlen(v) >= n)
        return acc_err_set(err, ACC_EINVAL, key, "%s is too long", key);
    snprintf(dst, n, "%s", v);
    return 0;
}

/* "host:port", "[v6]:port" or ":port" (all interfaces). */
static int parse_listen(acc_conf *c, const char *v, acc_err *err)
{
    const char *colon;
    char host[256];
    if (v[0] == '[') {
        const char *close = strchr(v, ']');
        if (close == NULL || close[1] != ':')
            return acc_err_set(err, ACC_EINVAL, "listen", "listen must be [address]:port, got '%s'", v);
        size_t hl = (size_t)(close - v - 1);
        if (hl == 0 || hl >= sizeof host)
            return acc_err_set(err, ACC_EINVAL, "listen", "listen has a bad address in '%s'", v);
        memcpy(host, v + 1, hl);
        host[hl] = '\0';
        colon = close + 1;
    } else {
        colon = strrchr(v, ':');
        if (colon == NULL)
            return acc_err_set(err, ACC_EINVAL, "listen", "listen must be address:port, got '%s'", v);
        size_t hl = (size_t)(colon - v);
        if (hl >= sizeof host)
            return acc_err_set(err, ACC_EINVAL, "listen", "listen has a bad address in '%s'", v);
        memcpy(host, v, hl);
        host[hl] = '\0';
        if (hl == 0)
            snprintf(host, sizeof host, "0.0.0.0");
    }
    int port = 0;
    if (parse_int("listen", colon + 1, 0, 65535, &port, err) != 0)
        return acc_err_set(err, ACC_EINVAL, "listen", "listen port must be in [0, 65535], got '%s'", colon + 1);
    snprintf(c->listen, sizeof c->listen, "%s", v);
    snprintf(c->listen_host, sizeof c->listen_host, "%s", host);
    c->listen_port = port;
    return 0;
}

/* h-jobs, issue 25: the queue caps, the stream limits, the cancel deadline. */
static int conf_set_limits(acc_conf *c, const char *key, const char *v, acc_err *err)
{
    if (!strcmp(key, "max_queued_jobs"))
        return parse_int(key, v, 0, 1 << 24, &c->max_queued_jobs, err);
    if (!strcmp(key, "user_max_queued"))
        return parse_int(key, v, 0, 1 << 24, &c->user_max_queued, err);
    if (!strcmp(key, "max_streams")) {
        c->set_streams = true;
        return parse_int(key, v, 1, 65536, &c->max_streams, err);
    }
    if (!strcmp(key, "user_max_streams"))
        return parse_int(key, v, 1, 65536, &c->user_max_streams, err);
    if (!strcmp(key, "cancel_grace"))
        return parse_int(key, v, 1, 86400, &c->cancel_grace, err);
    return acc_err_set(err, ACC_EINVAL, key, "unknown config key '%s'", key);
}

int conf_set(acc_conf *c, const char *key, const char *v, acc_err *err)
{
    uint64_t bytes;
    if (!strcmp(key, "listen"))
        return parse_listen(c, v, err);
    if (!strcmp(key, "state_dir"))
        return parse_path(key, v, c->state_dir, sizeof c->state_dir, err);
    if (!strcmp(key, "data_roots")) {
        c->set_data_roots = true;
        return parse_path(key, v, c->data_roots, sizeof c->data_roots, err);
    }
    if (!strcmp(key, "output_root")) {
        c->set_output_root = true;
        return parse_path(key, v, c->output_root, sizeof c->output_root, err);
    }
    if (!strcmp(key, "token_file")) {
        c->set_token_file = true;
        return parse_path(key, v, c->token_file, sizeof c->token_file, err);
    }
    if (!strcmp(key, "require_token"))
        return parse_bool(key, v, &c->require_token, err);
    if (!strcmp(key, "devices")) {
        if (!strcmp(v, "auto")) c->devices = CONF_DEVICES_AUTO;
        else if (!strcmp(v, "cuda")) c->devices = CONF_DEVICES_CUDA;
        else if (!strcmp(v, "cpu")) c->devices = CONF_DEVICES_CPU;
        else return acc_err_set(err, ACC_EINVAL, key, "devices must be auto, cuda or cpu, got '%s'", v);
        return 0;
    }
    if (!strcmp(key, "cpu_devices"))
        return parse_int(key, v, 1, 256, &c->cpu_devices, err);
    if (!strcmp(key, "cpu_device_memory")) {
        if (conf_parse_bytes(v, &bytes) != 0 || bytes < (1 << 20))
            return acc_err_set(err, ACC_EINVAL, key,
                               "cpu_device_memory must be a size of at least 1M (suffix K/M/G/T), got '%s'", v);
        c->cpu_device_memory = bytes;
        return 0;
    }
    if (!strcmp(key, "cpu_threads_per_device")) {
        c->set_threads = true;
        return parse_int(key, v, 1, 1024, &c->cpu_threads_per_device, err);
    }
    if (!strcmp(key, "max_body")) {
        if (conf_parse_bytes(v, &bytes) != 0 || bytes < 1024 || bytes > (1ULL << 30))
            return acc_err_set(err, ACC_EINVAL, key, "max_body must be a size in [1K, 1G], got '%s'", v);
        c->max_body = bytes;
        return 0;
    }
    if (!strcmp(key, "max_connections"))
        return parse_int(key, v, 1, 65536, &c->max_connections, err);
    if (!strcmp(key, "max_connections_per_ip"))
        return parse_int(key, v, 1, 65536, &c->max_connections_per_ip, err);
    if (!strcmp(key, "connection_timeout"))
        return parse_int(key, v, 1, 86400, &c->connection_timeout, err);
    if (!strcmp(key, "header_timeout"))
        return parse_int(key, v, 1, 86400, &c->header_timeout, err);
    if (!strcmp(key, "request_timeout"))
        return parse_int(key, v, 1, 86400, &c->request_timeout, err);
    if (!strcmp(key, "max_pending_connections")) {
        c->set_pending = true;
        return parse_int(key, v, 1, 65536, &c->max_pending_connections, err);
    }
    if (!strcmp(key, "shutdown_grace"))
        return parse_int(key, v, 0, 86400, &c->shutdown_grace, err);
    if (!strcmp(key, "checkpoint_keep"))
        return parse_int(key, v, 1, 1000, &c->checkpoint_keep, err);
    if (!strcmp(key, "device_peak_flops")) { /* h-results, issue 23 */
        char *end = NULL;
        double f = strtod(v, &end);
        if (end == v || *end != '\0' || !(f >= 0 && f <= 1e21))
            return acc_err_set(err, ACC_EINVAL, key,
                               "%s must be a number of FLOP/s in [0, 1e21] (e.g. 989e12), got '%s'", key, v);
        c->device_peak_flops = f;
        return 0;
    }
    if (!strcmp(key, "event_ring"))
        return parse_int(key, v, 16, 1 << 20, &c->event_ring, err);
    if (!strcmp(key, "history_keep"))
        return parse_int(key, v, 100, 100000000, &c->history_keep, err);
    if (!strcmp(key, "log_level")) {
        if (strcmp(v, "error") && strcmp(v, "warn") && strcmp(v, "info") && strcmp(v, "debug"))
            return acc_err_set(err, ACC_EINVAL, key, "log_level must be error, warn, info or debug, got '%s'", v);
        snprintf(c->log_level, sizeof c->log_level, "%s", v);
        return 0;
    }
    if (!strcmp(key, "log_file")) {
        if (strlen(v) >= sizeof c->log_file)
            return acc_err_set(err, ACC_EINVAL, key, "log_file is too long");
        snprintf(c->log_file, sizeof c->log_file, "%s", v);
        return 0;
    }
    if (!strcmp(key, "users_file")) {
        if (strlen(v) >= sizeof c->users_file)
            return acc_err_set(err, ACC_EINVAL, key, "users_file is too long");
        snprintf(c->users_file, sizeof c->users_file, "%s", v);
        return 0;
    }
    if (!strcmp(key, "user_max_running"))
        return parse_int(key, v, 0, 1 << 20, &c->user_max_running, err);
    if (!strcmp(key, "user_max_devices"))
        return parse_int(key, v, 0, 1 << 20, &c->user_max_devices, err);
    if (!strcmp(key, "worker_processes"))
        return parse_bool(key, v, &c->worker_processes, err);
    if (!strcmp(key, "worker_heartbeat_timeout"))
        return parse_int(key, v, 1, 3600, &c->worker_heartbeat_timeout, err);
    if (!strcmp(key, "rank_processes"))
        return parse_bool(key, v, &c->rank_processes, err);
    if (!strcmp(key, "mpi_launcher"))
        return set_str(key, v, true, c->mpi_launcher, sizeof c->mpi_launcher, err);
    if (!strcmp(key, "hostfile"))
        return set_str(key, v, false, c->hostfile, sizeof c->hostfile, err);
    if (!strcmp(key, "mpi_args"))
        return set_str(key, v, false, c->mpi_args, sizeof c->mpi_args, err);
    /* h-dsconf: the Hugging Face hub cache (HF_HUB_CACHE layout); "" = off */
    if (!strcmp(key, "hf_hub_cache")) {
        if (strlen(v) >= sizeof c->hf_hub_cache)
            return acc_err_set(err, ACC_EINVAL, key, "%s is too long", key);
        if (v[0] != '\0' && v[0] != '/')
            return acc_err_set(err, ACC_EINVAL, key, "%s must be an absolute path or empty, got '%s'", key, v);
        snprintf(c->hf_hub_cache, sizeof c->hf_hub_cache, "%s", v);
        return 0;
    }
    if (!strcmp(key, "rank_program"))
        return set_str(key, v, false, c->rank_program, sizeof c->rank_program, err);
    /* h-tmpl */
    if (!strcmp(key, "render_time_limit_ms"))
        return parse_int(key, v, 10, 600000, &c->render_time_limit_ms, err);
    if (!strcmp(key, "tokenizer_match_limit"))
        return parse_int(key, v, 1000, 1 << 30, &c->tokenizer_match_limit, err);
    if (!strcmp(key, "heavy_requests_max"))
        return parse_int(key, v, 1, 1 << 16, &c->heavy_requests_max, err);
    if (!strcmp(key, "heavy_requests_per_user"))
        return parse_int(key, v, 1, 1 << 16, &c->heavy_requests_per_user, err);
    if (!strcmp(key, "rank_watchdog_factor")) /* h-engine, issue 25 */
        return parse_int(key, v, 2, 1000, &c->rank_watchdog_factor, err);
    if (!strcmp(key, "rank_watchdog_min"))
        return parse_int(key, v, 1, 7 * 86400, &c->rank_watchdog_min, err);
    if (!strcmp(key, "mpi_interface"))
        return set_str(key, v, false, c->mpi_interface, sizeof c->mpi_interface, err);
    return conf_set_limits(c, key, v, err);
}

int conf_set_pair(acc_conf *c, const char *pair, acc_err *err)
{
    const char *eq = strchr(pair, '=');
    if (eq == NULL || eq == pair)
        return acc_err_set(err, ACC_EINVAL, "", "expected key=value, got '%s'", pair);
    char key[64];
    size_t kl = (size_t)(eq - pair);
    if (kl >= sizeof key)
        return acc_err_set(err, ACC_EINVAL, "", "config key too long in '%s'", pair);
    memcpy(key, pair, kl);
    key[kl] = '\0';
    return conf_set(c, key, eq + 1, err);
}

/* The HTTP limits must leave a reserve: connections still sending their
 * request are capped below the per-address and total limits, so clients
 * that have sent theirs (and /healthz) always find a slot. */
static int check_limits(acc_conf *c, acc_err *err)
{
    int cap = c->max_connections < c->max_connections_per_ip ? c->max_connections : c->max_connections_per_ip;
    if (!c->set_pending) /* default: all but an eighth of the slots */
        c->max_pending_connections = cap - (cap / 8 > 0 ? cap / 8 : 1);
    if (c->max_pending_connections < 1)
        c->max_pending_connections = 1;
    if (c->set_pending && c->max_pending_connections >= cap && cap > 1)
        return acc_err_set(err, ACC_EINVAL, "max_pending_connections",
                           "max_pending_connections %d must be below max_connections (%d) and "
                           "max_connections_per_ip (%d), to keep a reserve",
                           c->max_pending_connections, c->max_connections, c->max_connections_per_ip);
    /* event streams hold their connection: at most half the slots one
     * address may have, so requests always find one (h-jobs, issue 25) */
    if (!c->set_streams)
        c->max_streams = cap / 4 > 0 ? cap / 4 : 1;
    if (c->set_streams && c->max_streams > cap / 2)
        return acc_err_set(err, ACC_EINVAL, "max_streams",
                           "max_streams %d must be at most half of max_connections (%d) and max_connections_per_ip "
                           "(%d), to keep a reserve for requests",
                           c->max_streams, c->max_connections, c->max_connections_per_ip);
    if (c->header_timeout > c->request_timeout)
        return acc_err_set(err, ACC_EINVAL, "header_timeout", "header_timeout %d is above request_timeout %d",
                           c->header_timeout, c->request_timeout);
    return 0;
}

static int join_path(char *dst, size_t n, const char *dir, const char *leaf)
{
    int w = snprintf(dst, n, "%s/%s", dir, leaf);
    return (w < 0 || (size_t)w >= n) ? -1 : 0;
}

int conf_finalize(acc_conf *c, acc_err *err)
{
    if ((!c->set_data_roots && join_path(c->data_roots, sizeof c->data_roots, c->state_dir, "data")) ||
        (!c->set_output_root && join_path(c->output_root, sizeof c->output_root, c->state_dir, "out")) ||
        (!c->set_token_file && join_path(c->token_file, sizeof c->token_file, c->state_dir, "token")))
        return acc_err_set(err, ACC_EINVAL, "state_dir", "state_dir is too long");
    if (c->rank_processes && !c->worker_processes)
        return acc_err_set(err, ACC_EINVAL, "rank_processes",
                           "rank_processes = true needs worker_processes = true (a job's worker runs its ranks)");
    if (!c->set_threads) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        if (cores < 1)
            cores = 1;
        c->cpu_threads_per_device = (int)(cores / c->cpu_devices);
        if (c->cpu_threads_per_device < 1)
            c->cpu_threads_per_device = 1;
    }
    if (!conf_listen_is_loopback(c))
        c->require_token = true; /* never serve jobs to the network without auth */
    return check_limits(c, err);
}

bool conf_addr_is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family != AF_INET6)
        return false;
    const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
}

/* Resolved as the server will bind it (api_http.c checks the bound socket
 * again): a name that does not resolve, or resolves to any address that is
 * not loopback, is not loopback. */
bool conf_listen_is_loopback(const acc_conf *c)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *res = NULL;
    if (getaddrinfo(c->listen_host, NULL, &hints, &res) != 0 || res == NULL)
        return false;
    bool all = true;
    for (const struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next)
        all = all && conf_addr_is_loopback(ai->ai_addr);
    freeaddrinfo(res);
    return all;
}
