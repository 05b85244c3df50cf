/* conf: the daemon's configuration, its defaults and the validation of each key.
 *
 * One struct holds every key of docs/operations.md's "Configure" table plus the
 * operational limits accumd adds. Values arrive as strings, from the config
 * file or from `--set key=value`, through conf_set(), which validates and
 * converts; later calls override earlier ones. conf_finalize() then fills
 * the defaults that depend on other keys (paths under state_dir, threads per
 * device) and checks the whole. The struct is read-only after that.
 */
#ifndef ACC_CONF_H
#define ACC_CONF_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "err.h"

enum conf_devices { CONF_DEVICES_AUTO, CONF_DEVICES_CUDA, CONF_DEVICES_CPU };

typedef struct acc_conf {
    char listen[300];            /* as given: "host:port" or "[v6]:port" */
    char listen_host[256];       /* parsed host part */
    int listen_port;             /* parsed port part, 0 = pick a free one */
    char state_dir[PATH_MAX];
    char data_roots[4 * PATH_MAX]; /* colon-separated */
    char output_root[PATH_MAX];
    char token_file[PATH_MAX];
    bool require_token;          /* also on loopback; forced on for other addresses */
    enum conf_devices devices;
    int cpu_devices;
    uint64_t cpu_device_memory;  /* bytes */
    int cpu_threads_per_device;  /* 0 until finalized = cores / cpu_devices */
    uint64_t max_body;           /* bytes of a request body before 413 */
    int max_connections;
    int max_connections_per_ip;
    int connection_timeout;      /* seconds an idle connection is kept */
    int header_timeout;          /* seconds to send a whole request header */
    int request_timeout;         /* seconds to send a whole request, body included */
    int max_pending_connections; /* connections not yet past their request; the oldest goes */
    int shutdown_grace;          /* seconds SIGTERM waits for jobs to stop */
    int checkpoint_keep;         /* checkpoints kept per job */
    /* one device's peak FLOP/s in the jobs' precision,
     * for the step events' MFU estimate; 0 = unknown (no MFU) */
    double device_peak_flops;
    int event_ring;              /* events kept in memory per job */
    int history_keep;            /* events and step-metrics rows kept in the store per job */
    char log_level[16];          /* error | warn | info | debug */
    char log_file[PATH_MAX];     /* "" = stderr (journald); else appended, reopened on SIGHUP */
    char users_file[PATH_MAX];   /* "" = no users: the token_file's token is the admin */
    int user_max_running;        /* jobs running at once per user, 0 = no limit */
    int user_max_devices;        /* devices held at once per user, 0 = no limit */
    bool worker_processes;       /* each job in a worker process (false: rank threads in the daemon) */
    int worker_heartbeat_timeout; /* seconds without a worker's heartbeat before it is killed */
    /* rank processes (docs/multinode.md): jobs with "nodes" > 1, and every
     * job when rank_processes, run as `mpi_launcher -np W [--hostfile H]
     * mpi_args... rank_program ...` from their worker */
    bool rank_processes;
    char mpi_launcher[PATH_MAX];
    char hostfile[PATH_MAX];
    char mpi_args[2048];         /* split at blanks, no quoting */
    char rank_program[PATH_MAX]; /* "" = accumd-rank next to accumd */
    /* h-tmpl: bounded work on untrusted input (docs/data.md) */
    int render_time_limit_ms;    /* one template render + tokenization (a request, a record) */
    int tokenizer_match_limit;   /* PCRE2 match limit of a tokenizer regex match */
    int heavy_requests_max;      /* POST /v1/tokenize being worked on at once (429 past it) */
    int heavy_requests_per_user; /* the same per user */
    /* queue caps, event-stream limits, the cancel deadline */
    int max_queued_jobs;         /* queued jobs in total, 0 = no limit (429 past it) */
    int user_max_queued;         /* queued jobs per user, 0 = no limit (429 past it) */
    int max_streams;             /* open event streams in total (0 until finalized: a quarter of the connections) */
    int user_max_streams;        /* open event streams per user */
    int cancel_grace;            /* seconds a cancelled job's worker has to stop before it is killed */
    bool set_streams;
    /* h-dsconf: the Hugging Face hub cache (models--org--name/, datasets--org--name/;
     * HF_HUB_CACHE's layout) where model.from and data.dataset find hub names,
     * offline. "" = off. Read as an extra data root (safepath.h). */
    char hf_hub_cache[PATH_MAX];
    /* a rank-process job with no step for
     * max(rank_watchdog_min s, rank_watchdog_factor x its mean step time)
     * is ended, every rank killed; mpi_interface: multi-node jobs' MPI
     * network (btl_tcp_if_include / oob_tcp_if_include; "" = Open MPI's
     * choice). docs/multinode.md */
    int rank_watchdog_factor;
    int rank_watchdog_min;
    char mpi_interface[256];
    /* bytes of host memory the jobs may hold at once (their batch buffers
     * and whatever they keep in host memory by choice: offloaded state);
     * the scheduler reserves each running job's share. "auto" (the default,
     * host_memory_auto): MemTotal of /proc/meminfo less a reserve of 10%
     * (at least 1 GiB, at most half), set by conf_finalize; 0 = no limit */
    uint64_t host_memory;
    bool host_memory_auto;
    /* generate requests' workers (POST /v1/generate): how many nice steps
     * below the daemon they run (the loop thread keeps its core) and kernel threads on a
     * CPU device (0: cpu_threads_per_device, less one core kept for the
     * daemon when that is every core; see conf_generate_threads) */
    int generate_nice;
    int generate_threads;
    /* which keys were set explicitly, so derived defaults don't override them */
    bool set_data_roots, set_output_root, set_token_file, set_threads, set_pending;
} acc_conf;

/* The keys as one table (nginx's command tables): one row per key says
 * how its value is stored and parsed, its default, and its one-line doc.
 * Adding a key = a field in acc_conf + one row in conf.c's conf_table
 * (at the end) + its line in docs/operations.md, "Every config key"
 * (test conf_table fails without it). */
enum conf_type { CONF_INT, CONF_BOOL, CONF_BYTES, CONF_STR, CONF_DOUBLE, CONF_ENUM };
enum { CONF_F_NONEMPTY = 1, CONF_F_NOCTRL = 2 }; /* CONF_STR: refuse ""; refuse control characters */

typedef struct conf_row {
    const char *name;
    enum conf_type type;
    const char *def;            /* the default in string form; NULL = derived by conf_finalize */
    size_t off, size;           /* the value in acc_conf */
    uint64_t lo, hi;            /* CONF_INT, CONF_BYTES: the inclusive range */
    double fmax;                /* CONF_DOUBLE: the range is [0, fmax] */
    unsigned flags;             /* CONF_F_* */
    const char *const *names;   /* CONF_ENUM: the values, NULL-terminated, in the enum's order */
    size_t set_flag;            /* offset of the bool "set explicitly" (derived defaults), or (size_t)-1 */
    int (*set)(acc_conf *c, const char *v, acc_err *err);         /* irregular keys: replaces the type's parser */
    int (*valid)(const char *key, const char *v, acc_err *err); /* a rule beyond the type's, before it */
    const char *doc;            /* one line, as in docs/operations.md */
} conf_row;

extern const conf_row conf_table[];
extern const size_t conf_table_len;

/* The row of `key`, or NULL. */
const conf_row *conf_key_find(const char *key);

/* Print every key as "key = value", one a line, in the table's order. */
void conf_dump(const acc_conf *c, FILE *out);

/* Fill every key with its default (the table's, parsed as a user's value). */
void conf_defaults(acc_conf *c);

/* Set one key from its string form. ACC_EINVAL names the key on bad values,
 * unknown keys included. */
int conf_set(acc_conf *c, const char *key, const char *value, acc_err *err);

/* Parse "key=value" (as given to --set) and apply it. */
int conf_set_pair(acc_conf *c, const char *pair, acc_err *err);

/* Derive the dependent defaults and check cross-key rules. */
int conf_finalize(acc_conf *c, acc_err *err);

/* host_memory "auto" for a host of `total` bytes: total less 10% (at
 * least 1 GiB, at most half of it). */
uint64_t conf_host_memory_auto(uint64_t total);
/* The kernel threads of a generate request's worker on a CPU device:
 * generate_threads when set, else cpu_threads_per_device, one fewer when
 * those are all of the machine's `cores` (at least 1). */
int conf_generate_threads(const acc_conf *c, long cores);

/* Parse a byte size with an optional K/M/G/T suffix (powers of 1024). */
int conf_parse_bytes(const char *s, uint64_t *out);

/* The strict scalar parsers every string-to-value path uses (config keys,
 * query parameters, headers): 0 and *out, or -1 on anything else.
 * u64: decimal digits only (no sign, no space), at most `max`.
 * bool: 1 true yes on / 0 false no off, in any case. */
int conf_parse_u64(const char *s, uint64_t max, uint64_t *out);
int conf_parse_bool(const char *s, bool *out);

/* True when the listen host resolves to loopback addresses only
 * (127.0.0.0/8, ::1, ::ffff:127.0.0.0/104): decided on the resolved
 * addresses, never on the spelling of the name. */
bool conf_listen_is_loopback(const acc_conf *c);

/* True when `sa` is a loopback address (as above). */
struct sockaddr;
bool conf_addr_is_loopback(const struct sockaddr *sa);

#endif
