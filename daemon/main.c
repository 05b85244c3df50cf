/* accumd: the training-job daemon's entry point. Parses the command line,
 * builds the configuration (defaults, then --config FILE, then every --set or
 * per-key flag in order) and runs the daemon until SIGTERM/SIGINT. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "worker_proto.h"
#include "gen_proto.h"
#include "log.h"

#ifndef ACCUMD_VERSION
#define ACCUMD_VERSION "unknown"
#endif

static void usage(FILE *out)
{
    fprintf(out,
            "usage: accumd [--config FILE] [--set key=value]... [--KEY VALUE]...\n"
            "\n"
            "Training-job daemon: takes jobs as JSON over HTTP, trains them on the\n"
            "local GPUs (or CPU devices), streams progress back. See README.md.\n"
            "\n"
            "  -c, --config FILE     read 'key = value' settings from FILE\n"
            "  -s, --set KEY=VALUE   set one config key (repeatable, applied after FILE)\n"
            "      --KEY VALUE       the same, for any key below ('_' may be written '-')\n"
            "      --check-config    validate the configuration, print it, and exit\n"
            "      --hash-token      read a token on stdin, print its users_file hash\n"
            "  -h, --help            this text\n"
            "  -V, --version         print the version\n"
            "\nconfig keys:");
    for (size_t i = 0; i < conf_table_len; i++)
        fprintf(out, "%s%s", i % 6 ? " " : "\n  ", conf_table[i].name);
    fprintf(out, "\n");
}

/* "--cpu-devices" -> "cpu_devices" if that is a config key. */
static const char *flag_to_key(const char *flag, char *buf, size_t n)
{
    snprintf(buf, n, "%s", flag);
    for (char *p = buf; *p; p++)
        if (*p == '-')
            *p = '_';
    const conf_row *r = conf_key_find(buf);
    return r != NULL ? r->name : NULL;
}

enum { OPT_CHECK = 1000 };

/* --hash-token: the users_file form of a token read from stdin (one line),
 * so an admin can add a user whose token was made elsewhere. */
static int hash_token(void)
{
    char line[512];
    if (fgets(line, sizeof line, stdin) == NULL) {
        fprintf(stderr, "accumd: --hash-token: no token on stdin\n");
        return -1;
    }
    line[strcspn(line, "\r\n")] = '\0';
    if (strlen(line) < 16 || strpbrk(line, " \t") != NULL) {
        fprintf(stderr, "accumd: --hash-token: a token is 16 or more characters without blanks\n");
        return -1;
    }
    unsigned char h[API_HASH_LEN];
    char hex[2 * API_HASH_LEN + 1];
    if (api_token_hash(line, h) != 0) {
        fprintf(stderr, "accumd: --hash-token: SHA-256 failed\n");
        return -1;
    }
    api_hash_hex(h, hex);
    printf("sha256:%s\n", hex);
    return 1;
}

/* Two passes: the config file first wherever --config appears, then the
 * overrides in command-line order. Returns 0, 1 (exit 0 now) or -1 (exit 2). */
static int parse_args(int argc, char **argv, acc_conf *c, int *check_only)
{
    acc_err err = {0};
    const char *config = NULL;
    for (int i = 1; i < argc; i++) {
        if ((!strcmp(argv[i], "--config") || !strcmp(argv[i], "-c")) && i + 1 < argc)
            config = argv[++i];
        else if (!strncmp(argv[i], "--config=", 9))
            config = argv[i] + 9;
    }
    if (config != NULL && daemon_conf_load(c, config, &err) != 0) {
        fprintf(stderr, "accumd: %s\n", err.msg);
        return -1;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        char keybuf[128], pair[8192];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 1;
        }
        if (!strcmp(a, "-V") || !strcmp(a, "--version")) {
            printf("accumd %s (%s)\n", ACCUMD_VERSION, kern_cuda_built() ? "cuda" : "cpu-only");
            return 1;
        }
        if (!strcmp(a, "--hash-token"))
            return hash_token();
        if (!strcmp(a, "--check-config")) {
            *check_only = 1;
            continue;
        }
        if (!strcmp(a, "--config") || !strcmp(a, "-c")) {
            i++;
            continue;
        }
        if (!strncmp(a, "--config=", 9))
            continue;
        if (!strcmp(a, "--set") || !strcmp(a, "-s")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "accumd: --set needs key=value\n");
                return -1;
            }
            if (conf_set_pair(c, argv[++i], &err) != 0) {
                fprintf(stderr, "accumd: --set %s: %s\n", argv[i], err.msg);
                return -1;
            }
            continue;
        }
        if (!strncmp(a, "--set=", 6)) {
            if (conf_set_pair(c, a + 6, &err) != 0) {
                fprintf(stderr, "accumd: %s: %s\n", a, err.msg);
                return -1;
            }
            continue;
        }
        if (!strncmp(a, "--", 2)) {
            const char *eq = strchr(a, '=');
            char flag[128];
            snprintf(flag, sizeof flag, "%.*s", eq ? (int)(eq - a - 2) : (int)strlen(a + 2), a + 2);
            const char *key = flag_to_key(flag, keybuf, sizeof keybuf);
            const char *val = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
            if (key != NULL && val != NULL) {
                snprintf(pair, sizeof pair, "%s=%s", key, val);
                if (conf_set_pair(c, pair, &err) != 0) {
                    fprintf(stderr, "accumd: %s: %s\n", a, err.msg);
                    return -1;
                }
                continue;
            }
        }
        fprintf(stderr, "accumd: unknown or incomplete argument '%s' (see --help)\n", a);
        return -1;
    }
    if (conf_finalize(c, &err) != 0) {
        fprintf(stderr, "accumd: %s\n", err.msg);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    static acc_daemon d; /* the one context; static only for its size */
    int check_only = 0;
    /* a job's worker process (daemon/worker_main.c): the daemon starts it */
    if (argc >= 2 && !strcmp(argv[1], "--worker"))
        return worker_main(argc, argv);
    /* a generate request's worker process (daemon/gen_main.c) */
    if (argc >= 2 && !strcmp(argv[1], "--generate"))
        return gen_worker_main(argc, argv);
    conf_defaults(&d.conf);
    int rc = parse_args(argc, argv, &d.conf, &check_only);
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    if (check_only) {
        conf_dump(&d.conf, stdout);
        return 0;
    }
    /* a file size limit must fail the write (EFBIG), not kill the daemon */
    signal(SIGXFSZ, SIG_IGN);
    /* NCCL: make every connection when a job's communicator is created
     * (one thread, before the ranks start), not lazily in a rank's first
     * collective, where a peer that never arrives (cancelled, failed in
     * step 0) would block it beyond the reach of an abort. Set before any
     * thread exists; an operator's own setting wins. */
    setenv("NCCL_RUNTIME_CONNECT", "0", 0);
    if (log_init(d.conf.log_level, d.conf.log_file[0] ? d.conf.log_file : NULL) != 0) {
        fprintf(stderr, "accumd: cannot open log_file %s: %m\n", d.conf.log_file);
        return 1;
    }
    acc_err err = {0};
    if (daemon_init(&d, &err) != 0) {
        acc_log(ACC_LOG_ERROR, "daemon", "cannot start: %s", err.msg);
        daemon_free(&d);
        return 1;
    }
    daemon_run(&d);
    daemon_free(&d);
    return 0;
}
