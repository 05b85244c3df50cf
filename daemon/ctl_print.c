/* ctl_print: accumd's answers and events as lines a person reads.
 *
 * Tables are plain columns separated by two spaces (easy to read, easy to
 * cut); missing or null values print as "-". Nothing here talks HTTP.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctl.h"

void ctl_fmt_bytes(double n, char *out, size_t size)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (fabs(n) >= 1024 && u < 4) {
        n /= 1024;
        u++;
    }
    snprintf(out, size, u == 0 ? "%.0f %s" : "%.1f %s", n, units[u]);
}

static double num(const json_t *o, const char *key, double dflt)
{
    const json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : dflt;
}

static const char *str(const json_t *o, const char *key, const char *dflt)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : dflt;
}

void ctl_fmt_age(const char *t, char *out, size_t size)
{
    struct tm tm = {0};
    if (t == NULL || strptime(t, "%Y-%m-%dT%H:%M:%S", &tm) == NULL) {
        snprintf(out, size, "-");
        return;
    }
    double age = difftime(time(NULL), timegm(&tm));
    if (age < 0)
        age = 0;
    if (age < 120)
        snprintf(out, size, "%.0fs", age);
    else if (age < 7200)
        snprintf(out, size, "%.0fm", age / 60);
    else if (age < 172800)
        snprintf(out, size, "%.0fh", age / 3600);
    else
        snprintf(out, size, "%.0fd", age / 86400);
}

static double max_of(const json_t *a)
{
    double m = 0;
    size_t i;
    const json_t *v;
    json_array_foreach(a, i, v) if (json_number_value(v) > m) m = json_number_value(v);
    return m;
}

static void print_split_change(const char *type, const json_t *ev)
{
    const json_t *from = json_object_get(ev, "from"), *to = json_object_get(ev, "to");
    char a[32], b[32];
    bool oom = !strcmp(type, "oom_adjust");
    ctl_fmt_bytes(num(ev, oom ? "bytes_asked" : "predicted_peak_bytes", 0), a, sizeof a);
    ctl_fmt_bytes(num(ev, oom ? "bytes_free" : "usable_bytes", 0), b, sizeof b);
    printf("%-10s step %d: m=%d a=%d -> m=%d a=%d%s  (%s %s, %s %s)\n", type, (int)num(ev, "step", 0),
           (int)num(from, "micro_batch", 0), (int)num(from, "accum_steps", 0), (int)num(to, "micro_batch", 0),
           (int)num(to, "accum_steps", 0), json_is_true(json_object_get(ev, "recompute")) ? " recompute" : "",
           oom ? "asked" : "predicted peak", a, oom ? "free" : "usable", b);
}

void ctl_print_event(const json_t *ev)
{
    const char *type = str(ev, "type", "?");
    char peak[32];
    if (!strcmp(type, "step")) {
        ctl_fmt_bytes(max_of(json_object_get(ev, "mem_peak")), peak, sizeof peak);
        const json_t *loss = json_object_get(ev, "loss");
        char lbuf[32];
        if (json_is_number(loss))
            snprintf(lbuf, sizeof lbuf, "%.4f", json_number_value(loss));
        else
            snprintf(lbuf, sizeof lbuf, "-");
        printf("step %6d  loss %s  lr %.2e  |g| %.3f  %9.0f tok/s  m=%d a=%d  peak %s\n", (int)num(ev, "step", 0),
               lbuf, num(ev, "lr", 0), num(ev, "grad_norm", 0), num(ev, "tokens_per_s", 0),
               (int)num(ev, "micro_batch", 0), (int)num(ev, "accum_steps", 0), peak);
    } else if (!strcmp(type, "eval")) {
        printf("eval %6d  val_loss %.4f\n", (int)num(ev, "step", 0), num(ev, "val_loss", 0));
    } else if (!strcmp(type, "state")) {
        const char *from = str(ev, "from", NULL), *msg = str(ev, "message", NULL);
        printf("state      %s%s%s%s%s%s\n", str(ev, "state", "?"), from ? " (from " : "", from ? from : "",
               from ? ")" : "", msg ? ": " : "", msg ? msg : "");
    } else if (!strcmp(type, "log")) {
        if (json_is_number(json_object_get(ev, "step")))
            printf("log        [step %d] %s\n", (int)num(ev, "step", 0), str(ev, "message", ""));
        else
            printf("log        %s\n", str(ev, "message", ""));
    } else if (!strcmp(type, "checkpoint")) {
        printf("checkpoint step %d: %s\n", (int)num(ev, "step", 0), str(ev, "path", "?"));
    } else if (!strcmp(type, "oom_adjust") || !strcmp(type, "split_adjust")) {
        print_split_change(type, ev);
    } else if (!strcmp(type, "done")) {
        const char *msg = str(ev, "message", NULL);
        printf("done       %s at step %d%s%s\n", str(ev, "state", "?"), (int)num(ev, "step", 0), msg ? ": " : "",
               msg ? msg : "");
    } else if (!strcmp(type, "gap")) {
        printf("gap        missed %d events (%d..%d), they are in the job's events.ndjson\n",
               (int)num(ev, "missed", 0), (int)num(ev, "from", 0), (int)num(ev, "to", 0));
    } else {
        json_t *rest = json_deep_copy(ev);
        const char *drop[] = {"seq", "type", "time", "job"};
        for (size_t i = 0; rest != NULL && i < 4; i++)
            json_object_del(rest, drop[i]);
        char *text = rest ? json_dumps(rest, JSON_COMPACT) : NULL;
        printf("%-10s %s\n", type, text ? text : "");
        free(text);
        json_decref(rest);
    }
    fflush(stdout);
}

static void fmt_loss(const json_t *v, char *out, size_t n)
{
    if (json_is_number(v))
        snprintf(out, n, "%.4f", json_number_value(v));
    else
        snprintf(out, n, "-");
}

static void fmt_devices(const json_t *a, char *out, size_t n)
{
    size_t i, k = 0;
    const json_t *v;
    out[0] = '\0';
    json_array_foreach(a, i, v)
    {
        int w = snprintf(out + k, n - k, "%s%s", i ? "," : "", json_string_value(v) ? json_string_value(v) : "?");
        if (w < 0 || (size_t)w >= n - k)
            break;
        k += (size_t)w;
    }
    if (k == 0)
        snprintf(out, n, "-");
}

static void fmt_split(const json_t *b, char *out, size_t n)
{
    snprintf(out, n, "%dx%dx%d", (int)num(b, "micro_batch", 0), (int)num(b, "accum_steps", 0),
             (int)num(b, "world", 0));
}

void ctl_print_jobs(const json_t *jobs)
{
    printf("%-8s  %-16s  %-12s  %-9s  %-11s  %-8s  %-9s  %-12s  %s\n", "ID", "NAME", "OWNER", "STATE", "STEP",
           "LOSS", "M x A x W", "DEVICES", "AGE");
    size_t i;
    const json_t *j;
    json_array_foreach(jobs, i, j)
    {
        char step[32], loss[32], split[32], devs[128], age[16];
        snprintf(step, sizeof step, "%d/%d", (int)num(j, "step", 0), (int)num(j, "max_steps", 0));
        fmt_loss(json_object_get(j, "loss"), loss, sizeof loss);
        fmt_split(json_object_get(j, "batch"), split, sizeof split);
        fmt_devices(json_object_get(j, "devices"), devs, sizeof devs);
        ctl_fmt_age(str(j, "submitted_at", NULL), age, sizeof age);
        printf("%-8s  %-16s  %-12s  %-9s  %-11s  %-8s  %-9s  %-12s  %s\n", str(j, "id", "?"), str(j, "name", "-"),
               str(j, "owner", "-"), str(j, "state", "?"), step, loss, split, devs, age);
    }
}

void ctl_print_job(const json_t *j)
{
    char loss[32], split[32], devs[512];
    fmt_loss(json_object_get(j, "loss"), loss, sizeof loss);
    fmt_split(json_object_get(j, "batch"), split, sizeof split);
    fmt_devices(json_object_get(j, "devices"), devs, sizeof devs);
    const json_t *b = json_object_get(j, "batch");
    printf("id:         %s\nname:       %s\nowner:      %s\nstate:      %s\n", str(j, "id", "?"), str(j, "name", "-"),
           str(j, "owner", "-"), str(j, "state", "?"));
    printf("step:       %d of %d\nloss:       %s\n", (int)num(j, "step", 0), (int)num(j, "max_steps", 0), loss);
    printf("batch:      B=%d  m x a x w = %s%s\nprecision:  %s\ndevices:    %s\npriority:   %d\n",
           (int)num(b, "train_batch_size", 0), split,
           json_is_true(json_object_get(b, "micro_auto")) ? "  (micro batch auto)" : "", str(j, "precision", "-"),
           devs, (int)num(j, "priority", 0));
    printf("submitted:  %s\nstarted:    %s\nfinished:   %s\nrestarts:   %d\nlast event: %d\n",
           str(j, "submitted_at", "-"), str(j, "started_at", "-"), str(j, "finished_at", "-"),
           (int)num(j, "restarts", 0), (int)num(j, "last_event", 0));
    const json_t *h = json_object_get(j, "host_memory");
    if (json_is_object(h)) { /* needs, holds reserved, holds by choice; or why it waits */
        char need[32], res[32], use[32], peak[32];
        ctl_fmt_bytes(num(h, "needed_bytes", 0), need, sizeof need);
        ctl_fmt_bytes(num(h, "reserved_bytes", 0), res, sizeof res);
        ctl_fmt_bytes(num(h, "in_use_bytes", 0), use, sizeof use);
        ctl_fmt_bytes(num(h, "peak_bytes", 0), peak, sizeof peak);
        printf("host mem:   needs %s, reserved %s, offloaded %s (peak %s)%s%s\n", need, res, use, peak,
               json_is_true(json_object_get(h, "waiting")) ? "; " : "",
               json_is_true(json_object_get(h, "waiting")) ? str(h, "wait_reason", "") : "");
    }
    const json_t *e = json_object_get(j, "error");
    if (json_is_object(e))
        printf("error:      %s: %s\n", str(e, "code", "?"), str(e, "message", ""));
    const json_t *spec = json_object_get(j, "spec");
    if (spec != NULL && !json_is_null(spec)) {
        char *text = json_dumps(spec, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        printf("spec:\n%s\n", text ? text : "");
        free(text);
    }
}

void ctl_print_devices(const json_t *answer)
{
    printf("%-3s  %-8s  %-5s  %-10s  %-10s  %-10s  %-10s  %s\n", "ID", "NAME", "KIND", "MEMORY", "IN USE", "PEAK",
           "FREE", "JOB");
    size_t i;
    const json_t *d;
    json_array_foreach(json_object_get(answer, "devices"), i, d)
    {
        char tot[32], use[32], peak[32], fr[32];
        ctl_fmt_bytes(num(d, "memory_total_bytes", 0), tot, sizeof tot);
        ctl_fmt_bytes(num(d, "memory_in_use_bytes", 0), use, sizeof use);
        ctl_fmt_bytes(num(d, "memory_peak_bytes", 0), peak, sizeof peak);
        if (json_is_number(json_object_get(d, "memory_free_bytes")))
            ctl_fmt_bytes(num(d, "memory_free_bytes", 0), fr, sizeof fr);
        else
            snprintf(fr, sizeof fr, "-");
        printf("%-3d  %-8s  %-5s  %-10s  %-10s  %-10s  %-10s  %s\n", (int)num(d, "id", 0), str(d, "name", "?"),
               str(d, "kind", "?"), tot, use, peak, fr, str(d, "job", "-"));
    }
    const json_t *st = json_object_get(answer, "gpu_selftest");
    if (json_is_object(st))
        printf("gpu self-test: %s: %s\n", json_is_true(json_object_get(st, "passed")) ? "passed" : "FAILED",
               str(st, "message", ""));
}

/* A scalar as table text. */
static void cell(const json_t *v, char *out, size_t n)
{
    if (json_is_string(v))
        snprintf(out, n, "%s", json_string_value(v));
    else if (json_is_integer(v))
        snprintf(out, n, "%lld", (long long)json_integer_value(v));
    else if (json_is_real(v))
        snprintf(out, n, "%.6g", json_real_value(v));
    else if (json_is_boolean(v))
        snprintf(out, n, "%s", json_is_true(v) ? "yes" : "no");
    else if (v == NULL || json_is_null(v))
        snprintf(out, n, "-");
    else {
        char *t = json_dumps(v, JSON_COMPACT);
        snprintf(out, n, "%s", t ? t : "?");
        free(t);
    }
}

/* A cell of a table row: byte sizes (by their key's name) in binary units. */
static void row_cell(const json_t *row, const char *key, char *out, size_t n)
{
    const json_t *x = json_object_get(row, key);
    if (strstr(key, "bytes") != NULL && json_is_number(x))
        ctl_fmt_bytes(json_number_value(x), out, n);
    else
        cell(x, out, n);
}

/* An array of objects as a table, the columns from the first row's keys,
 * each as wide as its widest cell. */
/* cols: the columns (NULL-terminated); NULL: every key of the first row. */
static void print_rows(const json_t *rows, const char *const *cols)
{
    enum { MAXCOL = 32 };
    const json_t *first = json_array_get(rows, 0), *v, *row;
    const char *key, *keys[MAXCOL];
    int w[MAXCOL], nc = 0;
    size_t i;
    char c[64];
    for (int k = 0; cols != NULL && cols[k] != NULL && nc < MAXCOL; k++) {
        keys[nc] = cols[k];
        w[nc++] = (int)strlen(cols[k]);
    }
    if (cols == NULL)
        json_object_foreach((json_t *)first, key, v)
        {
            if (nc == MAXCOL)
                break;
            keys[nc] = key;
            w[nc++] = (int)strlen(key);
        }
    json_array_foreach(rows, i, row) for (int k = 0; k < nc; k++)
    {
        row_cell(row, keys[k], c, sizeof c);
        if ((int)strlen(c) > w[k])
            w[k] = (int)strlen(c);
    }
    for (int k = 0; k < nc; k++)
        printf("%-*s%s", k + 1 < nc ? w[k] : 0, keys[k], k + 1 < nc ? "  " : "\n");
    json_array_foreach(rows, i, row) for (int k = 0; k < nc; k++)
    {
        row_cell(row, keys[k], c, sizeof c);
        printf("%-*s%s", k + 1 < nc ? w[k] : 0, c, k + 1 < nc ? "  " : "\n");
    }
}

/* A count in K / M / B ("124.4 K", "6.74 B"). */
static void fmt_count(double n, char *out, size_t len)
{
    if (n >= 1e9)
        snprintf(out, len, "%.2f B", n / 1e9);
    else if (n >= 1e6)
        snprintf(out, len, "%.2f M", n / 1e6);
    else if (n >= 1e3)
        snprintf(out, len, "%.1f K", n / 1e3);
    else
        snprintf(out, len, "%.0f", n);
}

/* A plan row's or group's mode, "+opt-offload" added when its optimizer
 * state is in host memory (offload_optimizer), "+param-offload" when the
 * parameters are too (offload_param). */
static void fmt_mode(const json_t *v, char *out, size_t n)
{
    snprintf(out, n, "%s%s", str(v, "mode", "?"),
             json_is_true(json_object_get(v, "offload_param"))       ? "+param-offload"
             : json_is_true(json_object_get(v, "offload_optimizer")) ? "+opt-offload"
                                                                     : "");
}

static const char *recompute_word(const json_t *v);

/* One way to run it, in a line (the planner's row). */
static void fmt_way(const json_t *r, char *out, size_t n)
{
    char mode[48];
    fmt_mode(r, mode, sizeof mode);
    snprintf(out, n, "%s, ZeRO %d, recompute %s, micro batch %d x %d accumulation steps", mode,
             (int)num(r, "zero_stage", 0), recompute_word(r), (int)num(r, "micro_batch", 0),
             (int)num(r, "accum_steps", 0));
}

/* A row's host bytes per rank and by part ("-" from a daemon without
 * them), and "(host memory)" when the host is what it exceeds. */
static void fmt_host(const json_t *r, char *out, size_t n)
{
    if (!json_is_number(json_object_get(r, "host_bytes"))) {
        snprintf(out, n, "-");
        return;
    }
    char t[32], p[4][32];
    static const char *const parts[] = {"host_batch_bytes", "host_optimizer_bytes", "host_params_bytes",
                                        "host_activations_bytes"};
    ctl_fmt_bytes(num(r, "host_bytes", 0), t, sizeof t);
    for (int i = 0; i < 4; i++)
        ctl_fmt_bytes(num(r, parts[i], 0), p[i], sizeof p[i]);
    const char *limit = str(r, "limit", "");
    snprintf(out, n, "%s (%s+%s+%s+%s)%s", t, p[0], p[1], p[2], p[3],
             !strcmp(limit, "host_memory") ? " exceeds host memory" : "");
}

/* POST /v1/plan's answer: the hardware, the summary, each variant's
 * largest fitting micro batch, then every row with its parts. */
/* A plan row's or group's recomputation: off, on, or on from checkpoints in
 * host memory (act_offload). */
static const char *recompute_word(const json_t *v)
{
    if (!json_is_true(json_object_get(v, "recompute")))
        return "off";
    return json_is_true(json_object_get(v, "act_offload")) ? "on+host" : "on";
}

static void print_planner(const json_t *plan)
{
    const json_t *md = json_object_get(plan, "model"), *hw = json_object_get(plan, "hardware"),
                 *sm = json_object_get(plan, "summary"), *v;
    char a[32], b[32], c[32], d[32], e[32], f[32], way[160];
    ctl_fmt_bytes(num(hw, "device_memory_bytes", 0), a, sizeof a);
    char cnt[32];
    fmt_count(num(md, "params", 0), cnt, sizeof cnt);
    printf("model:      %s, %s parameters, seq_len %d\n", str(md, "family", "?"), cnt, (int)num(md, "seq_len", 0));
    printf("hardware:   %d x %s of %s (%d%% kept free)\n", (int)num(hw, "devices", 0), str(hw, "kind", "?"), a,
           (int)num(plan, "margin_pct", 0));
    if (json_is_number(json_object_get(hw, "host_memory_bytes"))) { /* the host the ranks share */
        ctl_fmt_bytes(num(hw, "host_memory_bytes", 0), b, sizeof b);
        printf("host:       %s of host memory for the job\n", num(hw, "host_memory_bytes", 0) > 0 ? b : "no limit");
    }
    printf("precision:  %s\n", str(plan, "precision", "-"));
    const json_t *lo = json_object_get(plan, "lora");
    if (json_is_object(lo)) {
        char mods[256] = "";
        size_t k;
        json_array_foreach(json_object_get(lo, "target_modules"), k, v)
        {
            size_t l = strlen(mods);
            snprintf(mods + l, sizeof mods - l, "%s%s", k ? " " : "", json_string_value(v));
        }
        fmt_count(num(lo, "trainable_params", 0), cnt, sizeof cnt);
        printf("lora rows:  r %d, alpha %g, %s: %s trainable parameters (%s)\n", (int)num(lo, "r", 0),
               num(lo, "alpha", 0), mods, cnt,
               json_is_true(json_object_get(lo, "from_spec")) ? "the spec's lora section" : "the planner's defaults");
    }
    printf("summary:    %s\n", str(sm, "message", "-"));
    const char *pk[] = {"recommended", "suggested"};
    for (int k = 0; k < 2; k++) {
        const json_t *r = json_object_get(sm, pk[k]);
        if (!json_is_object(r))
            continue;
        fmt_way(r, way, sizeof way);
        ctl_fmt_bytes(num(r, "device_bytes", 0), b, sizeof b);
        printf("%-11s %s: %s per device%s%s\n", k ? "suggested:" : "dry run:", way, b,
               json_is_true(json_object_get(r, "fits")) ? ", fits" : ", does not fit: ",
               json_is_true(json_object_get(r, "fits")) ? "" : str(r, "why_not", "?"));
    }
    printf("\n%-17s %-5s %-10s %-18s %-12s %-12s %s\n", "MODE", "ZERO", "RECOMPUTE", "LARGEST FITTING M",
           "PER DEVICE", "HOST/RANK", "WHY NOT");
    size_t i;
    json_array_foreach(json_object_get(plan, "groups"), i, v)
    {
        const json_t *m = json_object_get(v, "largest_fitting_micro_batch");
        char mm[32] = "none";
        if (json_is_integer(m))
            snprintf(mm, sizeof mm, "%d (a = %d)", (int)json_integer_value(m), (int)num(v, "accum_steps", 0));
        if (json_is_number(json_object_get(v, "device_bytes")))
            ctl_fmt_bytes(num(v, "device_bytes", 0), b, sizeof b);
        else
            snprintf(b, sizeof b, "-");
        char mode[48], hb[32] = "-";
        fmt_mode(v, mode, sizeof mode);
        if (json_is_number(json_object_get(v, "host_bytes"))) /* the largest fitting row's */
            ctl_fmt_bytes(num(v, "host_bytes", 0), hb, sizeof hb);
        printf("%-17s %-5d %-10s %-18s %-12s %-12s %s\n", mode, (int)num(v, "zero_stage", 0), recompute_word(v), mm,
               b, hb, str(v, "why_not", ""));
    }
    printf("\n%-17s %-5s %-10s %6s %6s %10s %10s %10s %10s %10s %10s %s %s\n", "MODE", "ZERO", "RECOMPUTE", "M",
           "A", "WEIGHTS", "GRADS", "OPTIMIZER", "ACTS", "PEAK", "DEVICE", "FITS",
           "HOST/RANK (batch+optimizer+params+acts)");
    json_array_foreach(json_object_get(plan, "rows"), i, v)
    {
        ctl_fmt_bytes(num(v, "weights_bytes", 0), a, sizeof a);
        ctl_fmt_bytes(num(v, "gradients_bytes", 0), b, sizeof b);
        ctl_fmt_bytes(num(v, "optimizer_bytes", 0), c, sizeof c);
        ctl_fmt_bytes(num(v, "activations_bytes", 0), d, sizeof d);
        ctl_fmt_bytes(num(v, "peak_bytes", 0), e, sizeof e);
        ctl_fmt_bytes(num(v, "device_bytes", 0), f, sizeof f);
        char host[256], mode[48];
        fmt_host(v, host, sizeof host);
        fmt_mode(v, mode, sizeof mode);
        printf("%-17s %-5d %-10s %6d %6d %10s %10s %10s %10s %10s %10s %-4s %s\n", mode,
               (int)num(v, "zero_stage", 0), recompute_word(v),
               (int)num(v, "micro_batch", 0), (int)num(v, "accum_steps", 0), a, b, c, d, e, f,
               json_is_true(json_object_get(v, "fits")) ? "yes" : "no", host);
    }
}

void ctl_print_plan(const json_t *plan)
{
    if (json_is_object(json_object_get(plan, "summary"))) { /* POST /v1/plan */
        print_planner(plan);
        return;
    }
    const json_t *b = json_object_get(plan, "batch"), *p = json_object_get(plan, "placement");
    if (json_is_object(b)) {
        char split[32];
        fmt_split(b, split, sizeof split);
        printf("batch:      B=%d  m x a x w = %s%s\n", (int)num(b, "train_batch_size", 0), split,
               json_is_true(json_object_get(b, "micro_auto")) ? "  (micro batch auto)" : "");
    }
    if (json_is_string(json_object_get(plan, "precision")))
        printf("precision:  %s\n", str(plan, "precision", "-"));
    if (json_is_object(p)) {
        char devs[256];
        fmt_devices(json_object_get(p, "devices"), devs, sizeof devs);
        printf("placement:  %s on %s (%s), %d queued job(s) before it%s\n",
               json_is_true(json_object_get(p, "starts_now")) ? "starts now" : "waits", devs, str(p, "kind", "?"),
               (int)num(p, "queued_before", 0),
               json_is_true(json_object_get(p, "over_user_limit")) ? "; waits for its owner's share (user_max_*)"
                                                                   : "");
    }
    if (json_is_number(json_object_get(plan, "device_memory_bytes"))) {
        char mem[32], peak[32];
        ctl_fmt_bytes(num(plan, "device_memory_bytes", 0), mem, sizeof mem);
        ctl_fmt_bytes(max_of(json_object_get(plan, "predicted_peak_memory_bytes")), peak, sizeof peak);
        printf("memory:     predicted peak %s per device, device budget %s\n", peak, mem);
    }
    const json_t *hm = json_object_get(plan, "host_memory");
    if (json_is_object(hm)) { /* what the job reserves of the daemon's host_memory */
        char job[32], lim[32];
        ctl_fmt_bytes(num(hm, "job_bytes", 0), job, sizeof job);
        ctl_fmt_bytes(num(hm, "host_memory_bytes", 0), lim, sizeof lim);
        printf("host:       reserves %s of host memory (%s)%s\n", job,
               num(hm, "host_memory_bytes", 0) > 0 ? lim : "no limit",
               json_is_true(json_object_get(hm, "fits")) ? "" : ": more than the host has for jobs");
    }
    /* every array of objects in the answer as a table; the dry run's
     * candidates by the trade-off they show (m against a: the peak and
     * whether it fits), their parts are accumctl plan's */
    static const char *const candidate_cols[] = {"micro_batch", "accum_steps", "recompute", "predicted_peak_bytes",
                                                 "fits", NULL};
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)plan, key, v)
    {
        if (json_is_array(v) && json_is_object(json_array_get(v, 0))) {
            printf("\n%s:\n", key);
            print_rows(v, strcmp(key, "micro_batch_candidates") == 0 ? candidate_cols : NULL);
        }
    }
}

void ctl_print_metrics(const json_t *m, bool csv)
{
    static const char *const cols[] = {"step", "time", "loss", "lr", "grad_norm", "tokens_per_s", "micro_batch",
                                       "accum_steps", "mem_peak_bytes"};
    enum { NCOL = sizeof cols / sizeof cols[0] };
    for (int k = 0; k < NCOL; k++)
        printf(csv ? "%s%s" : "%s%-14s", k && csv ? "," : "", cols[k]);
    printf("\n");
    size_t i;
    const json_t *row;
    json_array_foreach(json_object_get(m, "steps"), i, row)
    {
        for (int k = 0; k < NCOL; k++) {
            char c[64];
            const json_t *v = json_object_get(row, cols[k]);
            if (csv && json_is_real(v))
                snprintf(c, sizeof c, "%.9g", json_real_value(v));
            else if (csv && (v == NULL || json_is_null(v)))
                c[0] = '\0';
            else
                cell(v, c, sizeof c);
            printf(csv ? "%s%s" : "%s%-14s", k && csv ? "," : "", c);
        }
        printf("\n");
    }
}

void ctl_print_json(const json_t *v)
{
    char *text = json_dumps(v, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    printf("%s\n", text ? text : "null");
    free(text);
}
