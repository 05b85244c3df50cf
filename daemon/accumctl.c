/* accumctl: the command-line client of accumd.
 *
 *   accumctl [--url URL] [--token T] [--state-dir DIR] [--json] COMMAND [ARGS]
 *
 * The daemon's address: --url, else $ACCUMD_URL, else the state
 * directory's accumd.addr (--state-dir, else $ACCUMD_STATE_DIR, else
 * /var/lib/accumd), else http://127.0.0.1:8470. The token: --token, else
 * $ACCUMD_TOKEN, else the state directory's token file when it is readable.
 * Global options may come before or after the command. Exit codes: ctl.h.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "fsutil.h"

#ifndef ACCUMD_VERSION
#define ACCUMD_VERSION "unknown"
#endif

typedef struct ctl_command {
    const char *name;
    const char *args;        /* the synopsis after "accumctl NAME" */
    const char *what;
    const char *opts;        /* option lines of its --help */
    int nargs;               /* positional arguments it needs */
    unsigned allowed;        /* the OPT_* bits it takes */
} ctl_command;

enum {
    OPT_DRY_RUN = 1 << 0,
    OPT_WAIT = 1 << 1,
    OPT_STATE = 1 << 2,
    OPT_FOLLOW = 1 << 3,
    OPT_DEVMEM = 1 << 4,
    OPT_DEVICES = 1 << 5,
    OPT_CSV = 1 << 6,
    OPT_ROLE = 1 << 7,
    OPT_USERS_FILE = 1 << 8,
    OPT_QUIET = 1 << 9,
    OPT_KIND = 1 << 10,
    OPT_GEN = 1 << 11,        /* generate's sampling keys and --chat */
    OPT_HOSTMEM = 1 << 12,
};

static const ctl_command commands[] = {
    {"submit", "[--dry-run] [--wait [--quiet]] FILE|-", "submit a job spec (JSON) from FILE or stdin",
     "  --dry-run   plan it (batch split, placement, memory) without queuing it\n"
     "  --wait      follow its events until it ends; exit 0 succeeded, 1 failed, 2 cancelled\n"
     "  --quiet     with --wait: print no events, only the exit code tells\n",
     1, OPT_DRY_RUN | OPT_WAIT | OPT_QUIET},
    {"ls", "[--state STATE]", "list the jobs (id, name, owner, state, step, loss, split, devices, age)",
     "  --state S   only jobs in state S: queued, running, succeeded, failed or cancelled\n", 0, OPT_STATE},
    {"show", "ID", "one job: state, progress, batch split, devices, times, error, its spec", "", 1, 0},
    {"logs", "[-f] ID", "a job's events as readable lines",
     "  -f, --follow  keep following until the job ends; exit 0 succeeded, 1 failed, 2 cancelled\n", 1,
     OPT_FOLLOW},
    {"cancel", "ID", "cancel a queued job (now) or a running one (at its next micro-step)", "", 1, 0},
    {"devices", "", "the devices: kind, memory total / in use / peak / free, the job holding each", "", 0, 0},
    {"plan", "FILE|- [--device-memory SIZE] [--devices N] [--kind cuda|cpu] [--host-memory SIZE]",
     "the planner's table for a spec: each way to run it, its predicted peak per device, whether it fits",
     "  --device-memory SIZE  memory of one device to plan for (24GiB, 80G, ...)\n"
     "  --devices N           devices to plan for (default: the spec's \"devices\")\n"
     "  --kind cuda|cpu       kind of device to plan for (default: the daemon's)\n"
     "  --host-memory SIZE    host memory the job's ranks may hold (default: the daemon's host_memory)\n"
     "  Sent as POST /v1/plan with \"hardware\"; without POST /v1/plan on the daemon, its dry run\n"
     "  is shown instead (said on stderr).\n",
     1, OPT_DEVMEM | OPT_DEVICES | OPT_KIND | OPT_HOSTMEM},
    {"metrics", "[--csv] ID", "a job's step history (loss, lr, grad norm, tokens/s, split, peak memory)",
     "  --csv       comma-separated, with a header line\n", 1, OPT_CSV},
    {"launch", "[--submit [--dry-run] [--wait]] accelerate launch|deepspeed|torchrun ARGS...",
     "the accumd spec an accelerate/deepspeed/torchrun line of a Hugging Face script means (JSON)",
     "  --submit    submit it (as submit does) instead of printing it\n"
     "  --dry-run   with --submit: plan it without queuing it\n"
     "  --wait      with --submit: follow its events until it ends\n"
     "  Global options go before \"launch\"; everything after it is the line. Flags with no\n"
     "  meaning in accumd are named on stderr and left out.\n",
     -1, 0},
    {"pull", "ID DIR", "download a job's files into DIR (resumable: an interrupted pull goes on; SHA-256 checked)",
     "", 2, 0},
    {"user add", "NAME [--role admin|user] [--users-file FILE]",
     "make a user's token and its users_file line (prints the token, then the line)",
     "  --role R          admin or user (default user)\n"
     "  --users-file FILE append the line to FILE (created 0600)\n",
     1, OPT_ROLE | OPT_USERS_FILE},
    {"generate", "MODEL PROMPT [--chat] [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S]",
     "the model answers PROMPT, its tokens printed as they come (MODEL: a directory under the daemon's "
     "data_roots, or job:ID)",
     "  --chat               PROMPT as one user message, through the model's chat template\n"
     "  --max-new-tokens N   at most N new tokens (default 128)\n"
     "  --temperature T      0 (the default) is greedy; higher samples\n"
     "  --top-k K, --top-p P sampling from the K most likely / the smallest set of probability P\n"
     "  --seed S             the same seed gives the same tokens\n"
     "  With --json the server-sent events are printed as they come.\n",
     2, OPT_GEN},
};
enum { NCOMMANDS = sizeof commands / sizeof commands[0] };

static const char global_help[] =
    "global options (before or after the command):\n"
    "  --url URL         the daemon (default: $ACCUMD_URL, then STATE_DIR/accumd.addr, then http://127.0.0.1:8470)\n"
    "  --token TOKEN     the bearer token (default: $ACCUMD_TOKEN, then STATE_DIR/token if readable)\n"
    "  --state-dir DIR   the daemon's state directory (default: $ACCUMD_STATE_DIR, then /var/lib/accumd)\n"
    "  --json            print the daemon's answers as they come (JSON; streams as NDJSON)\n"
    "  -h, --help        help (of a command: accumctl COMMAND --help)\n"
    "  -V, --version     print the version\n"
    "exit codes: 0 ok or succeeded, 1 job failed, 2 job cancelled, 3 HTTP error answer,\n"
    "            4 daemon not reachable, 64 usage\n";

static void usage_all(FILE *out)
{
    fprintf(out, "usage: accumctl [global options] COMMAND [ARGS]\n\ncommands:\n");
    for (int i = 0; i < NCOMMANDS; i++)
        fprintf(out, "  %-9s %s\n", commands[i].name, commands[i].what);
    fprintf(out, "\n%s", global_help);
}

static void usage_cmd(FILE *out, const ctl_command *cmd)
{
    fprintf(out, "usage: accumctl %s%s%s\n%s\n", cmd->name, cmd->args[0] ? " " : "", cmd->args, cmd->what);
    if (cmd->opts[0])
        fprintf(out, "\n%s", cmd->opts);
    fprintf(out, "\n%s", global_help);
}

static const ctl_command *find_command(const char *name, const char *sub)
{
    char full[64];
    snprintf(full, sizeof full, "%s%s%s", name, sub ? " " : "", sub ? sub : "");
    for (int i = 0; i < NCOMMANDS; i++)
        if (!strcmp(commands[i].name, full))
            return &commands[i];
    return NULL;
}

/* ---- where the daemon is -------------------------------------------------- */

static void trim(char *s)
{
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ' || s[n - 1] == '/'))
        s[--n] = '\0';
}

/* A small file of the state directory, trimmed; false when unreadable. */
static bool read_small(const char *dir, const char *leaf, char *out, size_t n)
{
    char path[4200];
    char *text = NULL;
    size_t len = 0;
    acc_err err = {0};
    snprintf(path, sizeof path, "%s/%s", dir, leaf);
    if (fsu_read_all(path, &text, &len, 4096, &err) != 0)
        return false;
    snprintf(out, n, "%s", text);
    free(text);
    trim(out);
    return out[0] != '\0';
}

static void resolve(ctl *c, const char *url, const char *token, const char *state_dir)
{
    char addr[1024] = "";
    const char *dir = state_dir ? state_dir : getenv("ACCUMD_STATE_DIR") ? getenv("ACCUMD_STATE_DIR")
                                                                          : "/var/lib/accumd";
    if (url == NULL)
        url = getenv("ACCUMD_URL");
    if (url == NULL && read_small(dir, "accumd.addr", addr, sizeof addr))
        url = addr;
    if (url == NULL || url[0] == '\0')
        url = "127.0.0.1:8470";
    snprintf(c->url, sizeof c->url, "%s%s", strstr(url, "://") ? "" : "http://", url);
    trim(c->url);
    if (token == NULL)
        token = getenv("ACCUMD_TOKEN");
    if (token != NULL)
        snprintf(c->token, sizeof c->token, "%s", token);
    else if (!read_small(dir, "token", c->token, sizeof c->token))
        c->token[0] = '\0';
}

/* ---- the command line ----------------------------------------------------- */

enum { L_URL = 1000, L_TOKEN, L_STATE_DIR, L_JSON, L_DRY_RUN, L_WAIT, L_STATE, L_DEVMEM, L_DEVICES, L_CSV,
       L_ROLE, L_USERS_FILE, L_QUIET, L_KIND, L_CHAT, L_MAX_NEW, L_TEMP, L_TOPK, L_TOPP, L_SEED, L_HOSTMEM };

static const struct option long_opts[] = {
    {"url", required_argument, NULL, L_URL},
    {"token", required_argument, NULL, L_TOKEN},
    {"state-dir", required_argument, NULL, L_STATE_DIR},
    {"json", no_argument, NULL, L_JSON},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
    {"dry-run", no_argument, NULL, L_DRY_RUN},
    {"wait", no_argument, NULL, L_WAIT},
    {"quiet", no_argument, NULL, L_QUIET},
    {"state", required_argument, NULL, L_STATE},
    {"follow", no_argument, NULL, 'f'},
    {"device-memory", required_argument, NULL, L_DEVMEM},
    {"devices", required_argument, NULL, L_DEVICES},
    {"kind", required_argument, NULL, L_KIND},
    {"csv", no_argument, NULL, L_CSV},
    {"role", required_argument, NULL, L_ROLE},
    {"users-file", required_argument, NULL, L_USERS_FILE},
    {"chat", no_argument, NULL, L_CHAT},
    {"max-new-tokens", required_argument, NULL, L_MAX_NEW},
    {"temperature", required_argument, NULL, L_TEMP},
    {"top-k", required_argument, NULL, L_TOPK},
    {"top-p", required_argument, NULL, L_TOPP},
    {"seed", required_argument, NULL, L_SEED},
    {"host-memory", required_argument, NULL, L_HOSTMEM},
    {NULL, 0, NULL, 0},
};

typedef struct cmdline {
    const char *url, *token, *state_dir;
    bool json, help, version;
    unsigned given;          /* OPT_* bits seen */
    ctl_opts o;
} cmdline;

/* One option; -1 on a bad one (printed). */
static int take_opt(int opt, const char *arg, cmdline *cl)
{
    char *end;
    switch (opt) {
    case L_URL: cl->url = arg; return 0;
    case L_TOKEN: cl->token = arg; return 0;
    case L_STATE_DIR: cl->state_dir = arg; return 0;
    case L_JSON: cl->json = true; return 0;
    case 'h': cl->help = true; return 0;
    case 'V': cl->version = true; return 0;
    case L_DRY_RUN: cl->o.dry_run = true; cl->given |= OPT_DRY_RUN; return 0;
    case L_WAIT: cl->o.wait = true; cl->given |= OPT_WAIT; return 0;
    case L_QUIET: cl->given |= OPT_QUIET; return 0;
    case L_STATE: cl->o.state = arg; cl->given |= OPT_STATE; return 0;
    case 'f': cl->o.follow = true; cl->given |= OPT_FOLLOW; return 0;
    case L_DEVMEM: cl->o.device_memory = arg; cl->given |= OPT_DEVMEM; return 0;
    case L_HOSTMEM: cl->o.host_memory = arg; cl->given |= OPT_HOSTMEM; return 0;
    case L_KIND:
        cl->o.kind = arg;
        cl->given |= OPT_KIND;
        if (strcmp(arg, "cuda") != 0 && strcmp(arg, "cpu") != 0) {
            fprintf(stderr, "accumctl: --kind must be cuda or cpu, got '%s'\n", arg);
            return -1;
        }
        return 0;
    case L_DEVICES:
        cl->o.devices = (int)strtol(arg, &end, 10);
        cl->given |= OPT_DEVICES;
        if (*end != '\0' || cl->o.devices < 1 || cl->o.devices > 4096) {
            fprintf(stderr, "accumctl: --devices must be a number of devices (1..4096), got '%s'\n", arg);
            return -1;
        }
        return 0;
    case L_CSV: cl->o.csv = true; cl->given |= OPT_CSV; return 0;
    case L_ROLE: cl->o.role = arg; cl->given |= OPT_ROLE; return 0;
    case L_USERS_FILE: cl->o.users_file = arg; cl->given |= OPT_USERS_FILE; return 0;
    /* generate: the daemon checks the values (a 400 naming the key) */
    case L_CHAT: cl->o.chat = true; cl->given |= OPT_GEN; return 0;
    case L_MAX_NEW: cl->o.max_new_tokens = arg; cl->given |= OPT_GEN; return 0;
    case L_TEMP: cl->o.temperature = arg; cl->given |= OPT_GEN; return 0;
    case L_TOPK: cl->o.top_k = arg; cl->given |= OPT_GEN; return 0;
    case L_TOPP: cl->o.top_p = arg; cl->given |= OPT_GEN; return 0;
    case L_SEED: cl->o.seed = arg; cl->given |= OPT_GEN; return 0;
    default: return -1; /* getopt printed it */
    }
}

/* Parse options anywhere, collecting the positional words in pos[]. */
static int parse(int argc, char **argv, cmdline *cl, char **pos, int *npos)
{
    opterr = 1;
    optind = 1;
    int opt;
    *npos = 0;
    /* "-" leading optstring: non-options come back as 1, in order */
    while ((opt = getopt_long(argc, argv, "-hVf", long_opts, NULL)) != -1) {
        if (opt == 1) {
            if (*npos < 8)
                pos[(*npos)++] = optarg;
            else
                return fprintf(stderr, "accumctl: too many arguments\n"), -1;
            continue;
        }
        if (take_opt(opt, optarg, cl) != 0)
            return -1;
    }
    for (; optind < argc; optind++) /* after "--" */
        if (*npos < 8)
            pos[(*npos)++] = argv[optind];
    return 0;
}

static int run(ctl *c, const ctl_command *cmd, const ctl_opts *o, char **args)
{
    const char *n = cmd->name;
    if (!strcmp(n, "submit")) return ctl_cmd_submit(c, o, args[0]);
    if (!strcmp(n, "ls")) return ctl_cmd_ls(c, o);
    if (!strcmp(n, "show")) return ctl_cmd_show(c, args[0]);
    if (!strcmp(n, "logs")) return ctl_cmd_logs(c, o, args[0]);
    if (!strcmp(n, "cancel")) return ctl_cmd_cancel(c, args[0]);
    if (!strcmp(n, "devices")) return ctl_cmd_devices(c);
    if (!strcmp(n, "plan")) return ctl_cmd_plan(c, o, args[0]);
    if (!strcmp(n, "metrics")) return ctl_cmd_metrics(c, o, args[0]);
    if (!strcmp(n, "pull")) return ctl_cmd_pull(c, args[0], args[1]);
    if (!strcmp(n, "generate")) return ctl_cmd_generate(c, o, args[0], args[1]);
    return CTL_EUSAGE;
}

/* h-dsconf: where "launch" stands after the global options (0: not
 * there): what follows it is a launcher's line, not accumctl's options. */
static int launch_at(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--url") || !strcmp(a, "--token") || !strcmp(a, "--state-dir"))
            i++;
        else if (strncmp(a, "--url=", 6) && strncmp(a, "--token=", 8) && strncmp(a, "--state-dir=", 12) &&
                 strcmp(a, "--json"))
            return !strcmp(a, "launch") ? i : 0;
    }
    return 0;
}

static int run_launch(int argc, char **argv, int at)
{
    cmdline cl = {0};
    char *pos[8];
    int npos;
    if (parse(at, argv, &cl, pos, &npos) != 0 || npos != 0)
        return CTL_EUSAGE;
    if (at + 1 < argc && (!strcmp(argv[at + 1], "--help") || !strcmp(argv[at + 1], "-h"))) {
        usage_cmd(stdout, find_command("launch", NULL));
        return 0;
    }
    ctl c = {.json = cl.json};
    resolve(&c, cl.url, cl.token, cl.state_dir);
    int rc = ctl_http_init(&c);
    if (rc == 0)
        rc = ctl_cmd_launch(&c, argc - at - 1, argv + at + 1);
    ctl_http_free(&c);
    return rc;
}

int main(int argc, char **argv)
{
    cmdline cl = {0};
    char *pos[8];
    int npos;
    int at = launch_at(argc, argv);
    if (at > 0)
        return run_launch(argc, argv, at);
    if (parse(argc, argv, &cl, pos, &npos) != 0) {
        fprintf(stderr, "accumctl: see accumctl --help\n");
        return CTL_EUSAGE;
    }
    if (cl.version) {
        printf("accumctl %s\n", ACCUMD_VERSION);
        return 0;
    }
    /* "help CMD" is "CMD --help" */
    if (npos > 0 && !strcmp(pos[0], "help")) {
        cl.help = true;
        memmove(pos, pos + 1, (size_t)--npos * sizeof *pos);
    }
    if (npos == 0) {
        usage_all(cl.help ? stdout : stderr);
        return cl.help ? 0 : CTL_EUSAGE;
    }
    bool two = !strcmp(pos[0], "user");
    const ctl_command *cmd = find_command(pos[0], two && npos > 1 ? pos[1] : NULL);
    if (cmd == NULL) {
        fprintf(stderr, "accumctl: unknown command '%s%s%s' (see accumctl --help)\n", pos[0], two && npos > 1 ? " " : "",
                two && npos > 1 ? pos[1] : "");
        return CTL_EUSAGE;
    }
    char **args = pos + (two ? 2 : 1);
    int nargs = npos - (two ? 2 : 1);
    if (cl.help) {
        usage_cmd(stdout, cmd);
        return 0;
    }
    if (cl.given & ~cmd->allowed) {
        fprintf(stderr, "accumctl: %s takes none of the options given\n", cmd->name);
        usage_cmd(stderr, cmd);
        return CTL_EUSAGE;
    }
    if (nargs != cmd->nargs) {
        usage_cmd(stderr, cmd);
        return CTL_EUSAGE;
    }
    if ((cl.given & OPT_QUIET) && !cl.o.wait) {
        fprintf(stderr, "accumctl: --quiet goes with --wait\n");
        return CTL_EUSAGE;
    }
    ctl c = {.json = cl.json, .quiet = (cl.given & OPT_QUIET) != 0};
    if (two)
        return ctl_cmd_user_add(&c, &cl.o, args[0]);
    resolve(&c, cl.url, cl.token, cl.state_dir);
    int rc = ctl_http_init(&c);
    if (rc == 0)
        rc = run(&c, cmd, &cl.o, args);
    ctl_http_free(&c);
    return rc;
}
