/* ctl_cmds: one function per accumctl command (see accumctl.c for the
 * command line and docs/accumctl.1 for what each prints).
 *
 * Every command returns its exit code (ctl.h). With --json the daemon's
 * answer is printed as it came (streams: one event a line, NDJSON).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <openssl/evp.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api_http.h"
#include "conf.h"
#include "ctl.h"
#include "fsutil.h"

#define CTL_MAX_SPEC (64u << 20)

/* A job spec from a file, or stdin for "-". */
static int read_spec(const char *file, char **text, size_t *len)
{
    *text = NULL;
    *len = 0;
    if (strcmp(file, "-") != 0) {
        acc_err err = {0};
        if (fsu_read_all(file, text, len, CTL_MAX_SPEC, &err) != 0) {
            fprintf(stderr, "accumctl: %s\n", err.msg);
            return CTL_EUSAGE;
        }
        return 0;
    }
    size_t cap = 0;
    for (;;) {
        if (*len + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            char *np = cap <= CTL_MAX_SPEC ? realloc(*text, cap) : NULL;
            if (np == NULL) {
                free(*text);
                fprintf(stderr, "accumctl: the spec on stdin is too large\n");
                return CTL_EUSAGE;
            }
            *text = np;
        }
        size_t n = fread(*text + *len, 1, 4096, stdin);
        *len += n;
        (*text)[*len] = '\0';
        if (n == 0)
            break;
    }
    if (ferror(stdin)) {
        free(*text);
        fprintf(stderr, "accumctl: reading the spec on stdin: %s\n", strerror(errno));
        return CTL_EUSAGE;
    }
    return 0;
}

/* Job ids go into URLs: letters, digits, '-' and '_' only. */
static int check_id(const char *id)
{
    if (id == NULL || id[0] == '\0' || strlen(id) > 64 || strspn(id, "abcdefghijklmnopqrstuvwxyz"
                                                                     "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") !=
                                                             strlen(id)) {
        fprintf(stderr, "accumctl: '%s' is not a job id (e.g. j000001)\n", id ? id : "");
        return CTL_EUSAGE;
    }
    return 0;
}

static int code_of_state(const char *state)
{
    if (state == NULL)
        return CTL_EHTTP;
    if (!strcmp(state, "succeeded"))
        return CTL_OK;
    if (!strcmp(state, "cancelled"))
        return CTL_JOB_CANCELLED;
    return CTL_JOB_FAILED;
}

/* ---- following a job's stream ---------------------------------------------- */

typedef struct follow_ctx {
    ctl *c;
    bool print, raw;
    long long last_seq, until; /* until: stop at this seq (logs without -f), -1 none */
    char final[32];            /* the state of the done event, "" until then */
} follow_ctx;

static int on_event_line(void *p, const char *line)
{
    follow_ctx *f = p;
    if (line[0] == '\0')
        return 0;
    json_t *ev = json_loads(line, 0, NULL);
    if (ev == NULL) { /* not ours to judge: show it */
        if (f->print)
            printf("%s\n", line);
        return 0;
    }
    json_int_t seq = json_integer_value(json_object_get(ev, "seq"));
    if (seq > f->last_seq)
        f->last_seq = seq;
    if (f->print) {
        if (f->raw)
            printf("%s\n", line), fflush(stdout);
        else
            ctl_print_event(ev);
    }
    const char *type = json_string_value(json_object_get(ev, "type"));
    int stop = 0;
    if (type != NULL && !strcmp(type, "done")) {
        snprintf(f->final, sizeof f->final, "%s", json_string_value(json_object_get(ev, "state")) ?: "");
        stop = 1;
    }
    if (f->until >= 0 && seq >= f->until)
        stop = 1;
    json_decref(ev);
    return stop;
}

/* The state of a job now; NULL (printed) when it cannot be had. */
static int job_state_now(ctl *c, const char *id, char *state, size_t n)
{
    char path[128];
    json_t *j;
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    int rc = ctl_get_json(c, path, &j);
    if (rc != 0)
        return rc;
    snprintf(state, n, "%s", json_string_value(json_object_get(j, "state")) ?: "");
    json_decref(j);
    return 0;
}

/* Stream the job's events from after `since` until its done event; across
 * a daemon restart the stream is picked up where it broke. The exit code
 * follows the job's final state. */
static int follow(ctl *c, const char *id, long long since, bool print)
{
    follow_ctx f = {.c = c, .print = print, .raw = c->json, .last_seq = since, .until = -1};
    int conn_failures = 0;
    for (;;) {
        char path[160];
        snprintf(path, sizeof path, "/v1/jobs/%s/events?format=ndjson&since=%lld", id, f.last_seq);
        int rc = ctl_stream(c, path, on_event_line, &f);
        if (f.final[0])
            return code_of_state(f.final);
        if (rc == CTL_EHTTP)
            return rc;
        char state[32] = "";
        if (rc == 0)
            rc = job_state_now(c, id, state, sizeof state);
        if (rc == CTL_EHTTP)
            return rc;
        if (rc == 0 && (!strcmp(state, "succeeded") || !strcmp(state, "failed") || !strcmp(state, "cancelled")))
            return code_of_state(state);
        if (rc == CTL_ECONN && ++conn_failures > 30)
            return rc;
        if (rc == 0)
            conn_failures = 0;
        sleep(1); /* the daemon restarts, or the stream was cut: go on from last_seq */
    }
}

/* ---- commands --------------------------------------------------------------- */

static int print_answer(ctl *c, const ctl_resp *r, int want1, int want2, json_t **out)
{
    if (r->status != want1 && r->status != want2)
        return ctl_http_error(r);
    json_error_t je;
    *out = json_loads(r->body, 0, &je);
    if (*out == NULL) {
        fprintf(stderr, "accumctl: the answer is not JSON: %s\n", je.text);
        return CTL_EHTTP;
    }
    if (c->json)
        fputs(r->body, stdout);
    return 0;
}

/* One request and its JSON answer (*ans, printed as is with --json), the
 * status one of want1, want2; *status (may be NULL) is the HTTP status. */
static int ask(ctl *c, const char *method, const char *path, const char *body, size_t len, int want1, int want2,
               json_t **ans, long *status)
{
    ctl_resp r;
    *ans = NULL;
    int rc = ctl_request(c, method, path, body, len, &r);
    if (rc != 0)
        return rc;
    if (status != NULL)
        *status = r.status;
    rc = print_answer(c, &r, want1, want2, ans);
    ctl_resp_free(&r);
    return rc;
}

int ctl_cmd_submit(ctl *c, const ctl_opts *o, const char *file)
{
    char *text;
    size_t len;
    int rc = read_spec(file, &text, &len);
    if (rc != 0)
        return rc;
    rc = ctl_submit_text(c, o, text, len);
    free(text);
    return rc;
}

int ctl_submit_text(ctl *c, const ctl_opts *o, const char *text, size_t len)
{
    json_t *ans;
    int rc = ask(c, "POST", o->dry_run ? "/v1/jobs?dry_run=1" : "/v1/jobs", text, len, o->dry_run ? 200 : 201, -1,
                 &ans, NULL);
    if (rc != 0)
        return rc;
    if (o->dry_run) {
        if (!c->json)
            ctl_print_plan(ans);
        json_decref(ans);
        return 0;
    }
    char id[64];
    snprintf(id, sizeof id, "%s", json_string_value(json_object_get(ans, "id")) ?: "");
    if (!c->json) {
        char devs[256] = "";
        size_t i;
        const json_t *v;
        json_array_foreach(json_object_get(ans, "devices"), i, v)
        {
            size_t k = strlen(devs);
            snprintf(devs + k, sizeof devs - k, "%s%s", i ? "," : " on ", json_string_value(v) ?: "?");
        }
        printf("%s %s%s (owner %s)\n", id, json_string_value(json_object_get(ans, "state")) ?: "?", devs,
               json_string_value(json_object_get(ans, "owner")) ?: "-");
        fflush(stdout);
    }
    json_decref(ans);
    if (!o->wait)
        return 0;
    if (check_id(id) != 0)
        return CTL_EHTTP;
    return follow(c, id, 0, !c->quiet);
}

int ctl_cmd_ls(ctl *c, const ctl_opts *o)
{
    char path[128] = "/v1/jobs";
    if (o->state != NULL) {
        if (strspn(o->state, "abcdefghijklmnopqrstuvwxyz") != strlen(o->state) || strlen(o->state) > 32) {
            fprintf(stderr, "accumctl: --state must be queued, running, succeeded, failed or cancelled\n");
            return CTL_EUSAGE;
        }
        snprintf(path, sizeof path, "/v1/jobs?state=%s", o->state);
    }
    json_t *ans;
    int rc = ask(c, "GET", path, NULL, 0, 200, -1, &ans, NULL);
    if (rc == 0 && !c->json)
        ctl_print_jobs(json_object_get(ans, "jobs"));
    json_decref(ans);
    return rc;
}

static int get_and_print(ctl *c, const char *path, void (*pr)(const json_t *))
{
    json_t *ans;
    int rc = ask(c, "GET", path, NULL, 0, 200, -1, &ans, NULL);
    if (rc == 0 && !c->json)
        pr(ans);
    json_decref(ans);
    return rc;
}

int ctl_cmd_show(ctl *c, const char *id)
{
    char path[128];
    if (check_id(id) != 0)
        return CTL_EUSAGE;
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    return get_and_print(c, path, ctl_print_job);
}

int ctl_cmd_devices(ctl *c) { return get_and_print(c, "/v1/devices", ctl_print_devices); }

int ctl_cmd_logs(ctl *c, const ctl_opts *o, const char *id)
{
    if (check_id(id) != 0)
        return CTL_EUSAGE;
    if (o->follow)
        return follow(c, id, 0, true);
    /* the events so far: up to the job's last one now */
    char path[160];
    json_t *j;
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    int rc = ctl_get_json(c, path, &j);
    if (rc != 0)
        return rc;
    long long last = (long long)json_integer_value(json_object_get(j, "last_event"));
    json_decref(j);
    if (last <= 0)
        return 0;
    follow_ctx f = {.c = c, .print = true, .raw = c->json, .last_seq = 0, .until = last};
    snprintf(path, sizeof path, "/v1/jobs/%s/events?format=ndjson&since=0", id);
    return ctl_stream(c, path, on_event_line, &f);
}

int ctl_cmd_cancel(ctl *c, const char *id)
{
    char path[128];
    if (check_id(id) != 0)
        return CTL_EUSAGE;
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    json_t *ans;
    long status = 0;
    int rc = ask(c, "DELETE", path, NULL, 0, 200, 202, &ans, &status);
    if (rc == 0 && !c->json) {
        if (status == 200)
            printf("%s cancelled\n", id);
        else
            printf("%s cancel requested: it stops at its next micro-step (state %s)\n", id,
                   json_string_value(json_object_get(ans, "state")) ?: "?");
    }
    json_decref(ans);
    return rc;
}

int ctl_cmd_metrics(ctl *c, const ctl_opts *o, const char *id)
{
    char path[128];
    if (check_id(id) != 0)
        return CTL_EUSAGE;
    snprintf(path, sizeof path, "/v1/jobs/%s/metrics", id);
    json_t *ans;
    int rc = ask(c, "GET", path, NULL, 0, 200, -1, &ans, NULL);
    if (rc == 0 && !c->json)
        ctl_print_metrics(ans, o->csv);
    json_decref(ans);
    return rc;
}

/* No way to run the spec fits: POST /v1/plan's
 * summary neither fits nor suggests a row (a dry run's answer, from a
 * daemon without POST /v1/plan: no candidate fits). */
static bool plan_nothing_fits(const json_t *ans)
{
    const json_t *sum = json_object_get(ans, "summary");
    if (json_is_object(sum))
        return !json_is_true(json_object_get(sum, "fits")) && json_is_null(json_object_get(sum, "suggested"));
    const json_t *c;
    size_t i;
    json_array_foreach(json_object_get(ans, "micro_batch_candidates"), i, c) {
        if (json_is_true(json_object_get(c, "fits")))
            return false;
    }
    return json_is_array(json_object_get(ans, "micro_batch_candidates"));
}

/* The planner (POST /v1/plan, docs/api.md): the spec plus "hardware". A
 * daemon without it (404/405) gets the dry run of POST /v1/jobs, which
 * plans for its own devices, and the user is told so. */
int ctl_cmd_plan(ctl *c, const ctl_opts *o, const char *file)
{
    uint64_t bytes;
    if (o->device_memory != NULL && conf_parse_bytes(o->device_memory, &bytes) != 0) {
        fprintf(stderr, "accumctl: --device-memory must be a size such as 24GiB or 80G, got '%s'\n",
                o->device_memory);
        return CTL_EUSAGE;
    }
    if (o->host_memory != NULL && conf_parse_bytes(o->host_memory, &bytes) != 0) {
        fprintf(stderr, "accumctl: --host-memory must be a size such as 64GiB or 512G, got '%s'\n", o->host_memory);
        return CTL_EUSAGE;
    }
    char *text;
    size_t len;
    int rc = read_spec(file, &text, &len);
    if (rc != 0)
        return rc;
    json_error_t je;
    json_t *spec = json_loadb(text, len, 0, &je);
    if (!json_is_object(spec)) {
        fprintf(stderr, "accumctl: %s: not a JSON object (line %d: %s)\n", file, je.line, je.text);
        json_decref(spec);
        free(text);
        return CTL_EUSAGE;
    }
    if (o->device_memory != NULL || o->devices > 0 || o->kind != NULL || o->host_memory != NULL) {
        json_t *hw = json_object();
        if (o->kind != NULL)
            json_object_set_new(hw, "kind", json_string(o->kind));
        if (o->device_memory != NULL)
            json_object_set_new(hw, "device_memory", json_string(o->device_memory));
        if (o->devices > 0)
            json_object_set_new(hw, "devices", json_integer(o->devices));
        if (o->host_memory != NULL)
            json_object_set_new(hw, "host_memory", json_string(o->host_memory));
        json_object_set_new(spec, "hardware", hw);
    }
    char *body = json_dumps(spec, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(spec);
    ctl_resp r;
    rc = body ? ctl_request(c, "POST", "/v1/plan", body, strlen(body), &r) : CTL_EUSAGE;
    free(body);
    if (rc == 0 && (r.status == 404 || r.status == 405)) {
        ctl_resp_free(&r);
        fprintf(stderr, "accumctl: this accumd has no POST /v1/plan yet; showing its dry run "
                        "(POST /v1/jobs?dry_run=1) instead, which plans for the daemon's own devices%s\n",
                o->device_memory || o->devices || o->kind || o->host_memory
                    ? ", not for --device-memory/--devices/--kind/--host-memory"
                    : "");
        rc = ctl_request(c, "POST", "/v1/jobs?dry_run=1", text, len, &r);
    }
    free(text);
    if (rc != 0)
        return rc;
    json_t *ans = NULL;
    rc = print_answer(c, &r, 200, -1, &ans);
    ctl_resp_free(&r);
    if (rc == 0 && !c->json)
        ctl_print_plan(ans);
    if (rc == 0 && plan_nothing_fits(ans))
        rc = CTL_NOTHING_FITS;
    json_decref(ans);
    return rc;
}

/* ---- user add: a token and its users_file line (no daemon involved) ------- */

static int append_line(const char *path, const char *name, const char *line)
{
    char *text = NULL;
    size_t len = 0;
    acc_err err = {0};
    if (fsu_read_all(path, &text, &len, 4u << 20, &err) == 0) {
        size_t nl = strlen(name);
        for (char *p = text; p != NULL && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
            p += strspn(p, " \t");
            if (!strncmp(p, name, nl) && (p[nl] == ' ' || p[nl] == '\t')) {
                free(text);
                fprintf(stderr, "accumctl: %s already lists user '%s'\n", path, name);
                return CTL_EUSAGE;
            }
        }
        free(text);
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0) {
        fprintf(stderr, "accumctl: cannot open %s: %s\n", path, strerror(errno));
        return CTL_EUSAGE;
    }
    char buf[512];
    int n = snprintf(buf, sizeof buf, "%s\n", line);
    int rc = fsu_write_all(fd, buf, (size_t)n, &err) == 0 && fsync(fd) == 0 ? 0 : -1;
    close(fd);
    if (rc != 0) {
        fprintf(stderr, "accumctl: writing %s: %s\n", path, err.msg[0] ? err.msg : strerror(errno));
        return CTL_EUSAGE;
    }
    return 0;
}

int ctl_cmd_user_add(const ctl *c, const ctl_opts *o, const char *name)
{
    const char *role = o->role ? o->role : "user";
    if (!api_user_name_ok(name) || !strcmp(name, API_ANONYMOUS)) {
        fprintf(stderr, "accumctl: a user name is 1..63 of A-Z a-z 0-9 . _ - ('%s' is reserved)\n", API_ANONYMOUS);
        return CTL_EUSAGE;
    }
    if (api_role_parse(role) < 0) {
        fprintf(stderr, "accumctl: --role must be admin or user, got '%s'\n", role);
        return CTL_EUSAGE;
    }
    unsigned char raw[32], h[API_HASH_LEN];
    char token[2 * sizeof raw + 1], hex[2 * API_HASH_LEN + 1], line[256];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw) {
        fprintf(stderr, "accumctl: getrandom: %s\n", strerror(errno));
        return CTL_EUSAGE;
    }
    for (size_t i = 0; i < sizeof raw; i++)
        snprintf(token + 2 * i, 3, "%02x", raw[i]);
    if (api_token_hash(token, h) != 0) {
        fprintf(stderr, "accumctl: SHA-256 failed\n");
        return CTL_EUSAGE;
    }
    api_hash_hex(h, hex);
    snprintf(line, sizeof line, "%s %s sha256:%s", name, role, hex);
    if (o->users_file != NULL) {
        int rc = append_line(o->users_file, name, line);
        if (rc != 0)
            return rc;
    }
    if (c->json) {
        json_t *j = json_pack("{s:s, s:s, s:s, s:s}", "name", name, "role", role, "token", token, "line", line);
        ctl_print_json(j);
        json_decref(j);
        return 0;
    }
    printf("%s\n%s\n", token, line);
    fprintf(stderr,
            "accumctl: line 1 is %s's token (give it to them: ACCUMD_TOKEN or --token); line 2 %s; "
            "accumd reads the users file at start and on SIGHUP (systemctl reload accumd)\n",
            name, o->users_file ? "was appended to the users file" : "goes into the users file (users_file)");
    return 0;
}

/* ---- pull: a job's files, resumable, checked -------- */

/* The SHA-256 of the file at `path` as hex; -1 when it cannot be read. */
static int file_sha256(const char *path, char hex[65])
{
    FILE *f = fopen(path, "rb");
    EVP_MD_CTX *c = f ? EVP_MD_CTX_new() : NULL;
    unsigned char buf[1 << 16], md[32];
    unsigned int n = 0;
    int rc = c != NULL && EVP_DigestInit_ex(c, EVP_sha256(), NULL) == 1 ? 0 : -1;
    size_t r;
    while (rc == 0 && (r = fread(buf, 1, sizeof buf, f)) > 0)
        rc = EVP_DigestUpdate(c, buf, r) == 1 ? 0 : -1;
    if (rc == 0 && (ferror(f) || EVP_DigestFinal_ex(c, md, &n) != 1 || n != sizeof md))
        rc = -1;
    EVP_MD_CTX_free(c);
    if (f != NULL)
        fclose(f);
    for (int i = 0; rc == 0 && i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
    return rc;
}

/* mkdir -p of the directories above `path`. */
static int make_parents(const char *path)
{
    char d[PATH_MAX];
    snprintf(d, sizeof d, "%s", path);
    for (char *p = d + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            if (mkdir(d, 0755) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    return 0;
}

/* One file into `local`: skipped when it is there with the right SHA-256,
 * else fetched into local.part from where an earlier pull stopped (a
 * Range request), checked, and renamed into place. */
static int pull_one(ctl *c, const char *id, const json_t *f, const char *local, int *resumed)
{
    const char *path = json_string_value(json_object_get(f, "path")), *want = json_string_value(json_object_get(f, "sha256"));
    json_int_t size = json_integer_value(json_object_get(f, "size"));
    char hex[65], part[PATH_MAX + 8], url[1200];
    if (path == NULL || want == NULL || size < 0)
        return fprintf(stderr, "accumctl: a file entry without path, size or sha256\n"), CTL_EHTTP;
    if (file_sha256(local, hex) == 0 && !strcmp(hex, want))
        return 0; /* up to date */
    snprintf(part, sizeof part, "%s.part", local);
    snprintf(url, sizeof url, "/v1/jobs/%s/files/%s", id, path);
    if (make_parents(local) != 0)
        return fprintf(stderr, "accumctl: cannot create the directories of %s: %s\n", local, strerror(errno)), CTL_EUSAGE;
    for (int attempt = 0; attempt < 2; attempt++) {
        struct stat st;
        uint64_t have = stat(part, &st) == 0 && st.st_size <= size ? (uint64_t)st.st_size : 0;
        FILE *out = fopen(part, have > 0 ? "ab" : "wb");
        if (out == NULL)
            return fprintf(stderr, "accumctl: %s: %s\n", part, strerror(errno)), CTL_EUSAGE;
        long status = 0;
        int rc = have < (uint64_t)size ? ctl_download(c, url, have, out, &status) : 0;
        if (fclose(out) != 0 && rc == 0)
            rc = CTL_ECONN;
        if (rc != 0)
            return rc; /* local.part stays: the next pull goes on from there */
        if (have < (uint64_t)size && status != (have > 0 ? 206 : 200))
            return fprintf(stderr, "accumctl: %s: HTTP %ld\n", path, status), CTL_EHTTP;
        if (file_sha256(part, hex) == 0 && !strcmp(hex, want)) {
            *resumed += have > 0 && status == 206; /* went on from a Range */
            return rename(part, local) == 0 ? 0 : (fprintf(stderr, "accumctl: rename %s: %s\n", part, strerror(errno)), CTL_EUSAGE);
        }
        unlink(part); /* a wrong part: once more from the start */
    }
    fprintf(stderr, "accumctl: %s: SHA-256 %s, want %s\n", path, hex, want);
    return CTL_JOB_FAILED;
}

int ctl_cmd_pull(ctl *c, const char *id, const char *dir)
{
    char path[300];
    snprintf(path, sizeof path, "/v1/jobs/%s/files", id);
    json_t *ans = NULL;
    int rc = ctl_get_json(c, path, &ans);
    if (rc != 0)
        return rc;
    const char *base = dir != NULL ? dir : id;
    size_t i, n = 0;
    int resumed = 0;
    json_int_t bytes = 0;
    const json_t *f;
    json_array_foreach(json_object_get(ans, "files"), i, f) {
        const char *p = json_string_value(json_object_get(f, "path"));
        char local[PATH_MAX];
        /* the daemon's paths are plain components (api_files.c); refuse any other */
        if (p == NULL || p[0] == '/' || strstr(p, "..") != NULL ||
            snprintf(local, sizeof local, "%s/%s", base, p) >= (int)sizeof local) {
            fprintf(stderr, "accumctl: refusing the file path '%s'\n", p ? p : "(none)");
            rc = CTL_EHTTP;
            break;
        }
        if ((rc = pull_one(c, id, f, local, &resumed)) != 0)
            break;
        n++;
        bytes += json_integer_value(json_object_get(f, "size"));
    }
    json_decref(ans);
    if (rc == 0)
        printf("%zu files, %lld bytes in %s (sha256 checked; %d resumed)\n", n, (long long)bytes, base, resumed);
    return rc;
}

/* ---- generate ------------------------------------------ */

typedef struct gen_follow {
    bool raw;
    char event[32];           /* the SSE event the next data line belongs to */
    int rc;
    bool done;
} gen_follow;

/* One line of POST /v1/generate's event stream. */
static int on_gen_line(void *ctx, const char *text)
{
    gen_follow *f = ctx;
    if (f->raw && text[0] != '\0' && text[0] != ':')
        printf("%s\n", text);
    if (!strncmp(text, "event: ", 7)) {
        snprintf(f->event, sizeof f->event, "%s", text + 7);
        return 0;
    }
    if (strncmp(text, "data: ", 6) != 0 || f->raw) {
        if (f->raw && (!strcmp(f->event, "done") || !strcmp(f->event, "error")))
            f->done = true;
        fflush(stdout);
        return 0;
    }
    json_t *o = json_loads(text + 6, 0, NULL);
    if (!strcmp(f->event, "queued")) {
        fprintf(stderr, "accumctl: queued, position %lld\n",
                (long long)json_integer_value(json_object_get(o, "position")));
    } else if (!strcmp(f->event, "token")) {
        const char *t = json_string_value(json_object_get(o, "text"));
        fputs(t ? t : "", stdout);
        fflush(stdout);
    } else if (!strcmp(f->event, "done")) {
        printf("\n");
        fprintf(stderr, "accumctl: %lld tokens (%s)\n",
                (long long)json_integer_value(json_object_get(o, "completion_tokens")),
                json_string_value(json_object_get(o, "finish_reason")) ?: "?");
        f->done = true;
    } else if (!strcmp(f->event, "error")) {
        json_t *e = json_object_get(o, "error");
        fprintf(stderr, "accumctl: the generation failed: %s\n",
                json_string_value(json_object_get(e, "message")) ?: "?");
        f->rc = CTL_EHTTP;
        f->done = true;
    }
    json_decref(o);
    return 0;
}

/* A number option as JSON (the daemon checks its range). */
static int gen_number(json_t *req, const char *key, const char *opt, const char *arg)
{
    if (arg == NULL)
        return 0;
    json_t *v = json_loads(arg, JSON_DECODE_ANY, NULL);
    if (!json_is_number(v)) {
        json_decref(v);
        fprintf(stderr, "accumctl: --%s must be a number, got '%s'\n", opt, arg);
        return CTL_EUSAGE;
    }
    json_object_set_new(req, key, v);
    return 0;
}

int ctl_cmd_generate(ctl *c, const ctl_opts *o, const char *model, const char *prompt)
{
    json_t *req = json_pack("{s:s, s:b}", "model", model, "stream", 1);
    if (req == NULL)
        return CTL_EUSAGE;
    if (o->chat)
        json_object_set_new(req, "messages", json_pack("[{s:s, s:s}]", "role", "user", "content", prompt));
    else
        json_object_set_new(req, "prompt", json_string(prompt));
    int rc = gen_number(req, "max_new_tokens", "max-new-tokens", o->max_new_tokens);
    if (rc == 0)
        rc = gen_number(req, "temperature", "temperature", o->temperature);
    if (rc == 0)
        rc = gen_number(req, "top_k", "top-k", o->top_k);
    if (rc == 0)
        rc = gen_number(req, "top_p", "top-p", o->top_p);
    if (rc == 0)
        rc = gen_number(req, "seed", "seed", o->seed);
    char *body = rc == 0 ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    if (body == NULL)
        return rc ? rc : CTL_EUSAGE;
    gen_follow f = {.raw = c->json};
    rc = ctl_stream_post(c, "/v1/generate", body, strlen(body), on_gen_line, &f);
    free(body);
    if (rc != 0)
        return rc;
    if (!f.done) {
        fprintf(stderr, "accumctl: the answer ended before it was complete\n");
        return CTL_ECONN;
    }
    return f.rc;
}
