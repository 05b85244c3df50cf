#include "conf.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <stddef.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

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

/* ---- the table: one row per key (nginx's command tables) ----
 *
 * A row names the key, how its value is stored and parsed (type, offset,
 * range, flags), its default in string form (applied through the same
 * parser as a user's value, so a default is always a valid value), an
 * optional setter for irregular keys, an optional validator for rules the
 * type does not carry, and the one line that docs/operations.md repeats
 * ("Every config key"; tests/unit/test_conf_table.c keeps the two equal). */

#define OFF(f) offsetof(acc_conf, f)
#define SZ(f) sizeof(((acc_conf *)0)->f)
#define NOFLAG ((size_t)-1)

/* A string key: fits, no control characters (they reach an argv) with
 * CONF_F_NOCTRL, and not empty with CONF_F_NONEMPTY. */
static int set_str(const conf_row *r, char *out, const char *v, acc_err *err)
{
    const char *key = r->name;
    if ((r->flags & CONF_F_NONEMPTY) && v[0] == '\0')
        return acc_err_set(err, ACC_EINVAL, key, "%s must not be empty", key);
    if (strlen(v) >= r->size)
        return acc_err_set(err, ACC_EINVAL, key, "%s is too long (at most %zu bytes)", key, r->size - 1);
    for (const char *p = v; (r->flags & CONF_F_NOCTRL) && *p; p++)
        if ((unsigned char)*p < 0x20 && *p != '\t')
            return acc_err_set(err, ACC_EINVAL, key, "%s holds a control character", key);
    snprintf(out, r->size, "%s", v);
    return 0;
}

/* Every integer key is non-negative: lo >= 0. */
static int parse_int(const char *key, const char *v, uint64_t lo, uint64_t hi, int *out, acc_err *err)
{
    uint64_t n;
    if (conf_parse_u64(v, hi, &n) != 0 || n < lo)
        return acc_err_set(err, ACC_EINVAL, key, "%s must be an integer in [%llu, %llu], got '%s'", key,
                           (unsigned long long)lo, (unsigned long long)hi, v);
    *out = (int)n;
    return 0;
}

/* A size as it would be written: the largest suffix that divides it. */
static void size_text(uint64_t b, char *out, size_t n)
{
    static const char suffix[] = "KMGT";
    int k = -1;
    while (k < 3 && b >= 1024 && b % 1024 == 0) {
        b /= 1024;
        k++;
    }
    snprintf(out, n, "%llu%s", (unsigned long long)b, k >= 0 ? (char[2]){suffix[k], '\0'} : "");
}

static int set_bytes(const conf_row *r, uint64_t *out, const char *v, acc_err *err)
{
    uint64_t bytes;
    if (conf_parse_bytes(v, &bytes) == 0 && bytes >= r->lo && bytes <= r->hi) {
        *out = bytes;
        return 0;
    }
    char lo[32], hi[32];
    size_text(r->lo, lo, sizeof lo);
    size_text(r->hi, hi, sizeof hi);
    if (r->hi == UINT64_MAX)
        return acc_err_set(err, ACC_EINVAL, r->name, "%s must be a size of at least %s (suffix K/M/G/T), got '%s'",
                           r->name, lo, v);
    return acc_err_set(err, ACC_EINVAL, r->name, "%s must be a size in [%s, %s] (suffix K/M/G/T), got '%s'", r->name,
                       lo, hi, v);
}

static int set_double(const conf_row *r, double *out, const char *v, acc_err *err)
{
    char *end = NULL;
    double f = strtod(v, &end);
    if (end == v || *end != '\0' || !(f >= 0 && f <= r->fmax))
        return acc_err_set(err, ACC_EINVAL, r->name, "%s must be a number in [0, %g], got '%s'", r->name,
                           r->fmax, v);
    *out = f;
    return 0;
}

static int set_enum(const conf_row *r, int *out, const char *v, acc_err *err)
{
    char list[128] = "";
    for (int i = 0; r->names[i] != NULL; i++) {
        if (!strcmp(v, r->names[i])) {
            *out = i;
            return 0;
        }
        size_t l = strlen(list);
        snprintf(list + l, sizeof list - l, "%s%s", i ? ", " : "", r->names[i]);
    }
    return acc_err_set(err, ACC_EINVAL, r->name, "%s must be one of %s, got '%s'", r->name, list, v);
}

/* "host:port", "[v6]:port" or ":port" (all interfaces). */
static int set_listen(acc_conf *c, const char *v, acc_err *err)
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
    if (strlen(v) >= sizeof c->listen)
        return acc_err_set(err, ACC_EINVAL, "listen", "listen is too long");
    if (parse_int("listen", colon + 1, 0, 65535, &port, err) != 0)
        return acc_err_set(err, ACC_EINVAL, "listen", "listen port must be in [0, 65535], got '%s'", colon + 1);
    snprintf(c->listen, sizeof c->listen, "%s", v);
    snprintf(c->listen_host, sizeof c->listen_host, "%s", host);
    c->listen_port = port;
    return 0;
}

static int valid_log_level(const char *key, const char *v, acc_err *err)
{
    if (strcmp(v, "error") && strcmp(v, "warn") && strcmp(v, "info") && strcmp(v, "debug"))
        return acc_err_set(err, ACC_EINVAL, key, "%s must be error, warn, info or debug, got '%s'", key, v);
    return 0;
}

static int valid_abs_or_empty(const char *key, const char *v, acc_err *err)
{
    if (v[0] != '\0' && v[0] != '/')
        return acc_err_set(err, ACC_EINVAL, key, "%s must be an absolute path or empty, got '%s'", key, v);
    return 0;
}

/* host_memory: "auto", 0 (no limit) or a size of at least 1 MiB. */
static int set_host_memory(acc_conf *c, const char *v, acc_err *err)
{
    uint64_t bytes;
    if (!strcmp(v, "auto")) {
        c->host_memory_auto = true;
        c->host_memory = 0;
        return 0;
    }
    if (conf_parse_bytes(v, &bytes) != 0 || (bytes != 0 && bytes < (1u << 20)))
        return acc_err_set(err, ACC_EINVAL, "host_memory",
                           "host_memory must be \"auto\", 0 (no limit) or a size of at least 1M (suffix K/M/G/T), "
                           "got '%s'",
                           v);
    c->host_memory_auto = false;
    c->host_memory = bytes;
    return 0;
}

uint64_t conf_host_memory_auto(uint64_t total)
{
    uint64_t reserve = total / 10 > (1ull << 30) ? total / 10 : (1ull << 30);
    if (reserve > total / 2)
        reserve = total / 2;
    return total - reserve;
}

/* MemTotal of /proc/meminfo in bytes, 0 when it cannot be read. */
static uint64_t meminfo_total(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (f == NULL)
        return 0;
    char line[256];
    unsigned long long kib = 0;
    while (fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, "MemTotal: %llu kB", &kib) == 1)
            break;
    fclose(f);
    return kib > UINT64_MAX / 1024 ? 0 : (uint64_t)kib * 1024;
}

static const char *const device_names[] = {"auto", "cuda", "cpu", NULL}; /* enum conf_devices' order */

#define INT(k, d, lo_, hi_, doc_) \
    {.name = #k, .type = CONF_INT, .def = d, .off = OFF(k), .size = SZ(k), .lo = lo_, .hi = hi_, \
     .set_flag = NOFLAG, .doc = doc_}
#define BOOL(k, d, doc_) {.name = #k, .type = CONF_BOOL, .def = d, .off = OFF(k), .size = SZ(k), .set_flag = NOFLAG, .doc = doc_}
#define BYTES(k, d, lo_, hi_, doc_) \
    {.name = #k, .type = CONF_BYTES, .def = d, .off = OFF(k), .size = SZ(k), .lo = lo_, .hi = hi_, \
     .set_flag = NOFLAG, .doc = doc_}
#define STR(k, d, fl, doc_) \
    {.name = #k, .type = CONF_STR, .def = d, .off = OFF(k), .size = SZ(k), .flags = fl, .set_flag = NOFLAG, .doc = doc_}

const conf_row conf_table[] = {
    {.name = "listen", .type = CONF_STR, .def = "127.0.0.1:8470", .off = OFF(listen), .size = SZ(listen),
     .set_flag = NOFLAG, .set = set_listen,
     .doc = "address:port, [v6]:port or :port (all interfaces) of the HTTP API; port 0 picks a free one"},
    STR(state_dir, "/var/lib/accumd", CONF_F_NONEMPTY, "the job store, the token and the default data and output roots"),
    {.name = "data_roots", .type = CONF_STR, .off = OFF(data_roots), .size = SZ(data_roots), .flags = CONF_F_NONEMPTY,
     .set_flag = OFF(set_data_roots), .doc = "colon-separated directories job specs may read from"},
    {.name = "output_root", .type = CONF_STR, .off = OFF(output_root), .size = SZ(output_root),
     .flags = CONF_F_NONEMPTY, .set_flag = OFF(set_output_root), .doc = "where each job's outputs are written"},
    {.name = "token_file", .type = CONF_STR, .off = OFF(token_file), .size = SZ(token_file),
     .flags = CONF_F_NONEMPTY, .set_flag = OFF(set_token_file),
     .doc = "the admin bearer token, created (mode 0600) on first start"},
    BOOL(require_token, "false", "require the token on loopback too (always required on other addresses)"),
    {.name = "devices", .type = CONF_ENUM, .def = "auto", .off = OFF(devices), .size = SZ(devices),
     .names = device_names, .set_flag = NOFLAG, .doc = "auto (CUDA when present, else CPU), cuda or cpu"},
    INT(cpu_devices, "1", 1, 256, "CPU devices offered to jobs"),
    BYTES(cpu_device_memory, "2G", 1 << 20, UINT64_MAX, "memory of one CPU device (suffix K/M/G/T)"),
    {.name = "cpu_threads_per_device", .type = CONF_INT, .off = OFF(cpu_threads_per_device),
     .size = SZ(cpu_threads_per_device), .lo = 1, .hi = 1024, .set_flag = OFF(set_threads),
     .doc = "threads of one CPU device"},
    BYTES(max_body, "1M", 1024, 1ULL << 30, "bytes of a request body before a 413"),
    INT(max_connections, "1024", 1, 65536, "open connections in all"),
    INT(max_connections_per_ip, "600", 1, 65536, "open connections from one address"),
    INT(connection_timeout, "60", 1, 86400, "seconds a connection may stay silent"),
    INT(header_timeout, "10", 1, 86400, "seconds to send a whole request header"),
    INT(request_timeout, "120", 1, 86400, "seconds to send a whole request, body included"),
    {.name = "max_pending_connections", .type = CONF_INT, .off = OFF(max_pending_connections),
     .size = SZ(max_pending_connections), .lo = 1, .hi = 65536, .set_flag = OFF(set_pending),
     .doc = "connections not yet past their request; a new one past it closes the oldest"},
    INT(shutdown_grace, "30", 0, 86400, "seconds SIGTERM waits for jobs to stop"),
    INT(checkpoint_keep, "2", 1, 1000, "checkpoints kept per job"),
    INT(event_ring, "4096", 16, 1 << 20, "events kept in memory per job"),
    {.name = "log_level", .type = CONF_STR, .def = "info", .off = OFF(log_level), .size = SZ(log_level),
     .set_flag = NOFLAG, .valid = valid_log_level, .doc = "error, warn, info or debug"},
    STR(log_file, "", 0, "log file, appended and reopened on SIGHUP; empty = stderr"),
    STR(users_file, "", 0, "users, roles and token hashes; empty = the token_file's token is the admin"),
    INT(user_max_running, "0", 0, 1 << 20, "jobs running at once per user, 0 = no limit"),
    INT(user_max_devices, "0", 0, 1 << 20, "devices held at once per user, 0 = no limit"),
    INT(history_keep, "100000", 100, 100000000, "events and step-metrics rows kept in the store per job"),
    BOOL(worker_processes, "true", "each job in a worker process (false: rank threads in the daemon)"),
    INT(worker_heartbeat_timeout, "10", 1, 3600, "seconds without a worker's heartbeat before it is killed"),
    BOOL(rank_processes, "false", "every job's ranks as MPI processes (needs worker_processes)"),
    STR(mpi_launcher, "mpirun", CONF_F_NONEMPTY | CONF_F_NOCTRL, "the MPI launcher of rank processes"),
    STR(hostfile, "", CONF_F_NOCTRL, "the launcher's --hostfile; empty = none"),
    STR(mpi_args, "", CONF_F_NOCTRL, "extra launcher arguments, split at blanks"),
    STR(rank_program, "", CONF_F_NOCTRL, "the rank program; empty = accumd-rank next to accumd"),
    INT(render_time_limit_ms, "2000", 10, 600000, "milliseconds one POST /v1/tokenize may render and tokenize"),
    INT(tokenizer_match_limit, "1000000", 1000, 1 << 30, "PCRE2 match limit of a tokenizer regex match"),
    INT(heavy_requests_max, "2", 1, 1 << 16, "POST /v1/tokenize requests worked on at once (429 past it)"),
    INT(heavy_requests_per_user, "1", 1, 1 << 16, "the same per user"),
    INT(max_queued_jobs, "10000", 0, 1 << 24, "queued jobs in total, 0 = no limit (429 past it)"),
    INT(user_max_queued, "1000", 0, 1 << 24, "queued jobs per user, 0 = no limit (429 past it)"),
    {.name = "max_streams", .type = CONF_INT, .off = OFF(max_streams), .size = SZ(max_streams), .lo = 1,
     .hi = 65536, .set_flag = OFF(set_streams), .doc = "open event streams in total (503 past it)"},
    INT(user_max_streams, "64", 1, 65536, "open event streams per user (429 past it)"),
    INT(cancel_grace, "30", 1, 86400, "seconds a cancelled job's worker has to stop before it is killed"),
    {.name = "hf_hub_cache", .type = CONF_STR, .def = "", .off = OFF(hf_hub_cache), .size = SZ(hf_hub_cache),
     .set_flag = NOFLAG, .valid = valid_abs_or_empty,
     .doc = "a Hugging Face hub cache where hub names are found, offline; empty = off"},
    INT(rank_watchdog_factor, "10", 2, 1000, "a rank-process job is ended after this many mean step times without a step"),
    INT(rank_watchdog_min, "600", 1, 7 * 86400, "and after at least this many seconds"),
    STR(mpi_interface, "", CONF_F_NOCTRL, "multi-node jobs' MPI network interface; empty = Open MPI's choice"),
    {.name = "device_peak_flops", .type = CONF_DOUBLE, .def = "0", .off = OFF(device_peak_flops),
     .size = SZ(device_peak_flops), .fmax = 1e21, .set_flag = NOFLAG,
     .doc = "one device's peak FLOP/s for the MFU estimate (e.g. 989e12); 0 = unknown"},
    {.name = "host_memory", .type = CONF_BYTES, .def = "auto", .off = OFF(host_memory), .size = SZ(host_memory),
     .lo = 0, .hi = UINT64_MAX, .set_flag = NOFLAG, .set = set_host_memory,
     .doc = "host memory jobs may hold at once, reserved per job; auto = MemTotal less 10% (1 GiB to half); 0 = no limit"},
    INT(generate_nice, "10", 0, 19, "how much lower generate requests' workers run than the daemon (nice increment; the loop keeps its core)"),
    INT(generate_threads, "0", 0, 1024, "threads of a generate worker on a CPU device; 0 = cpu_threads_per_device, less a core left to the daemon"),
};
const size_t conf_table_len = sizeof conf_table / sizeof conf_table[0];

int conf_generate_threads(const acc_conf *c, long cores)
{
    if (c->generate_threads > 0)
        return c->generate_threads;
    int t = c->cpu_threads_per_device;
    if (cores > 1 && t >= cores)
        t = (int)cores - 1;
    return t < 1 ? 1 : t;
}

const conf_row *conf_key_find(const char *key)
{
    for (size_t i = 0; i < conf_table_len; i++)
        if (!strcmp(conf_table[i].name, key))
            return &conf_table[i];
    return NULL;
}

/* Parse and store one value through its row: the setter of an irregular
 * key, else the type's parser after the row's validator. */
static int row_apply(const conf_row *r, acc_conf *c, const char *v, acc_err *err)
{
    if (r->valid != NULL && r->valid(r->name, v, err) != 0)
        return err ? err->code : ACC_EINVAL;
    if (r->set != NULL)
        return r->set(c, v, err);
    void *at = (char *)c + r->off;
    switch (r->type) {
    case CONF_INT: return parse_int(r->name, v, r->lo, r->hi, at, err);
    case CONF_BOOL:
        if (conf_parse_bool(v, at) == 0)
            return 0;
        return acc_err_set(err, ACC_EINVAL, r->name, "%s must be true or false, got '%s'", r->name, v);
    case CONF_BYTES: return set_bytes(r, at, v, err);
    case CONF_STR: return set_str(r, at, v, err);
    case CONF_DOUBLE: return set_double(r, at, v, err);
    case CONF_ENUM: return set_enum(r, at, v, err);
    }
    return acc_err_set(err, ACC_EINVAL, r->name, "%s has no parser", r->name);
}

void conf_defaults(acc_conf *c)
{
    memset(c, 0, sizeof *c);
    /* a default is a string the row's own parser accepts (test conf_table
     * checks each), so the result is not checked here; derived defaults
     * (def NULL) are left to conf_finalize */
    for (size_t i = 0; i < conf_table_len; i++)
        if (conf_table[i].def != NULL)
            (void)row_apply(&conf_table[i], c, conf_table[i].def, NULL);
}

int conf_set(acc_conf *c, const char *key, const char *v, acc_err *err)
{
    const conf_row *r = conf_key_find(key);
    if (r == NULL)
        return acc_err_set(err, ACC_EINVAL, key, "unknown config key '%s'", key);
    int rc = row_apply(r, c, v, err);
    if (rc == 0 && r->set_flag != NOFLAG)
        *(bool *)((char *)c + r->set_flag) = true;
    return rc;
}

void conf_dump(const acc_conf *c, FILE *out)
{
    for (size_t i = 0; i < conf_table_len; i++) {
        const conf_row *r = &conf_table[i];
        const void *at = (const char *)c + r->off;
        fprintf(out, "%s = ", r->name);
        switch (r->type) {
        case CONF_INT: fprintf(out, "%d\n", *(const int *)at); break;
        case CONF_BOOL: fprintf(out, "%s\n", *(const bool *)at ? "true" : "false"); break;
        case CONF_BYTES: fprintf(out, "%llu\n", (unsigned long long)*(const uint64_t *)at); break;
        case CONF_STR: fprintf(out, "%s\n", (const char *)at); break;
        case CONF_DOUBLE: fprintf(out, "%g\n", *(const double *)at); break;
        case CONF_ENUM: fprintf(out, "%s\n", r->names[*(const int *)at]); break;
        }
    }
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
     * address may have, so requests always find one */
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
    if (c->host_memory_auto) /* unreadable: 0, no limit */
        c->host_memory = conf_host_memory_auto(meminfo_total());
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
