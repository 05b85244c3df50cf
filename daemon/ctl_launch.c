/* ctl_launch: `accumctl launch LINE`, the accumd job spec an `accelerate
 * launch ...`, `deepspeed ...` or `torchrun ...` line of a Hugging Face
 * training script means.
 *
 * The launcher's own flags give the devices (processes per node), the
 * nodes, the precision and the DeepSpeed config file; the script's flags
 * are Hugging Face TrainingArguments (and the example scripts' data and
 * model arguments), turned into the spec's keys by the daemon's own alias
 * table (spec_keys.h), so the two read them alike. Flags with no meaning
 * here (rendezvous addresses, ranks, logging) are left out and named on
 * stderr. Paths stay as written: the daemon reads them under its
 * data_roots (a relative one from the first root).
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "spec_keys.h"

/* What a launcher flag sets. */
typedef enum lf_what {
    LF_NONE,          /* no meaning here: listed */
    LF_PROCS_TOTAL,   /* accelerate --num_processes: over all machines */
    LF_PROCS_NODE,    /* torchrun --nproc_per_node, deepspeed --num_gpus */
    LF_NODES,         /* --num_machines, --nnodes, --num_nodes */
    LF_MIXED,         /* --mixed_precision */
    LF_DS_FILE,       /* --deepspeed_config_file */
    LF_ZERO_STAGE,    /* accelerate --zero_stage */
    LF_ACCUM,         /* accelerate --gradient_accumulation_steps */
    LF_CLIP,          /* accelerate --gradient_clipping */
    LF_OFFLOAD_OPT,   /* accelerate --offload_optimizer_device */
    LF_OFFLOAD_PARAM, /* accelerate --offload_param_device */
} lf_what;

typedef struct launch_flag {
    const char *name;
    bool value; /* takes a value */
    lf_what what;
} launch_flag;

static const launch_flag accelerate_flags[] = {
    {"num_processes", true, LF_PROCS_TOTAL}, {"num_machines", true, LF_NODES},
    {"mixed_precision", true, LF_MIXED}, {"deepspeed_config_file", true, LF_DS_FILE},
    {"zero_stage", true, LF_ZERO_STAGE}, {"gradient_accumulation_steps", true, LF_ACCUM},
    {"gradient_clipping", true, LF_CLIP}, {"offload_optimizer_device", true, LF_OFFLOAD_OPT},
    {"offload_param_device", true, LF_OFFLOAD_PARAM},
    {"use_deepspeed", false, LF_NONE}, {"multi_gpu", false, LF_NONE}, {"cpu", false, LF_NONE},
    {"machine_rank", true, LF_NONE}, {"main_process_ip", true, LF_NONE}, {"main_process_port", true, LF_NONE},
    {"config_file", true, LF_NONE}, {"gpu_ids", true, LF_NONE}, {"same_network", false, LF_NONE},
    {"rdzv_backend", true, LF_NONE}, {"num_cpu_threads_per_process", true, LF_NONE},
    {"dynamo_backend", true, LF_NONE}, {"deepspeed_multinode_launcher", true, LF_NONE},
    {"deepspeed_hostfile", true, LF_NONE}, {"main_training_function", true, LF_NONE},
    {"module", false, LF_NONE}, {"no_python", false, LF_NONE}, {"quiet", false, LF_NONE},
    {"debug", false, LF_NONE}, {"zero3_init_flag", true, LF_NONE}, {"zero3_save_16bit_model", true, LF_NONE},
    {NULL, false, LF_NONE},
};

static const launch_flag torchrun_flags[] = {
    {"nproc_per_node", true, LF_PROCS_NODE}, {"nnodes", true, LF_NODES}, {"node_rank", true, LF_NONE},
    {"master_addr", true, LF_NONE}, {"master_port", true, LF_NONE}, {"standalone", false, LF_NONE},
    {"rdzv_backend", true, LF_NONE}, {"rdzv_endpoint", true, LF_NONE}, {"rdzv_id", true, LF_NONE},
    {"rdzv_conf", true, LF_NONE}, {"max_restarts", true, LF_NONE}, {"monitor_interval", true, LF_NONE},
    {"role", true, LF_NONE}, {"log_dir", true, LF_NONE}, {"redirects", true, LF_NONE}, {"tee", true, LF_NONE},
    {"module", false, LF_NONE}, {"no_python", false, LF_NONE}, {"run_path", false, LF_NONE},
    {NULL, false, LF_NONE},
};

static const launch_flag deepspeed_flags[] = {
    {"num_gpus", true, LF_PROCS_NODE}, {"num_nodes", true, LF_NODES}, {"include", true, LF_NONE},
    {"exclude", true, LF_NONE}, {"hostfile", true, LF_NONE}, {"master_addr", true, LF_NONE},
    {"master_port", true, LF_NONE}, {"launcher", true, LF_NONE}, {"launcher_args", true, LF_NONE},
    {"force_multi", false, LF_NONE}, {"no_local_rank", false, LF_NONE}, {"no_python", false, LF_NONE},
    {"module", false, LF_NONE}, {"autotuning", true, LF_NONE}, {"elastic_training", false, LF_NONE},
    {"bind_cores_to_rank", false, LF_NONE}, {"ssh_port", true, LF_NONE},
    {NULL, false, LF_NONE},
};

/* The script's flags that are the spec's own keys (names it shares with
 * Hugging Face). The other names the spec takes are the alias table's. */
static const char *const native_keys[] = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "num_train_epochs",
    "max_steps", "seed", "output_dir", "save_total_limit", NULL};

/* The example scripts' data and model arguments: (flag, section, key). */
static const struct {
    const char *flag, *section, *key;
} script_paths[] = {
    {"train_file", "data", "train"},
    {"validation_file", "data", "val"},
    {"tokenizer_name", "data", "tokenizer"},
    {"chat_template", "data", "chat_template"},
    {NULL, NULL, NULL},
};

typedef struct launch {
    json_t *raw;            /* the spec being built, Hugging Face names and all */
    char left_out[4096];    /* the flags with no meaning here */
    long procs_total, procs_node, nodes;
    const char *ds_file;
    bool submit;
    ctl_opts o;
} launch;

/* "--Name-X=v" -> name "name_x", value "v" (NULL when none given inline). */
static void flag_name(const char *tok, char *name, size_t n, const char **inline_val)
{
    while (*tok == '-')
        tok++;
    size_t i = 0;
    for (; tok[i] && tok[i] != '=' && i + 1 < n; i++)
        name[i] = tok[i] == '-' ? '_' : (char)tolower((unsigned char)tok[i]);
    name[i] = '\0';
    *inline_val = tok[i] == '=' ? tok + i + 1 : NULL;
}

/* A command-line word as JSON: true/false, a number, or a string. */
static json_t *typed(const char *v)
{
    if (v == NULL || !strcmp(v, "True") || !strcmp(v, "true"))
        return json_true();
    if (!strcmp(v, "False") || !strcmp(v, "false"))
        return json_false();
    char *end;
    errno = 0;
    if (v[0] != '\0' && (isdigit((unsigned char)v[0]) || v[0] == '-' || v[0] == '.')) {
        long long i = strtoll(v, &end, 10);
        if (*end == '\0' && errno == 0)
            return json_integer(i);
        double d = strtod(v, &end);
        if (*end == '\0' && errno == 0)
            return json_real(d);
    }
    return json_string(v);
}

static void leave_out(launch *l, const char *flag, const char *value)
{
    char item[600];
    snprintf(item, sizeof item, "--%s%s%s", flag, value ? " " : "", value ? value : "");
    spec_list_append(l->left_out, sizeof l->left_out, item);
}

static int positive(const char *flag, const char *v, long *out)
{
    char *end;
    long n = strtol(v, &end, 10);
    if (*end != '\0' || n < 1 || n > 4096) {
        fprintf(stderr, "accumctl: launch: --%s must be a positive number, got '%s'\n", flag, v);
        return CTL_EUSAGE;
    }
    *out = n;
    return 0;
}

/* Set section.key (section NULL: the top level) of the spec. */
static int set_key(json_t *raw, const char *section, const char *key, json_t *v)
{
    json_t *o = raw;
    if (section != NULL) {
        o = json_object_get(raw, section);
        if (o == NULL)
            json_object_set_new(raw, section, o = json_object());
    }
    return json_object_set_new(o, key, v);
}

static int take_launcher_flag(launch *l, const launch_flag *f, const char *v)
{
    switch (f->what) {
    case LF_PROCS_TOTAL: return positive(f->name, v, &l->procs_total);
    case LF_PROCS_NODE: return positive(f->name, v, &l->procs_node);
    case LF_NODES: return positive(f->name, v, &l->nodes);
    case LF_MIXED: return set_key(l->raw, NULL, "mixed_precision", json_string(v));
    case LF_DS_FILE: l->ds_file = v; return 0;
    case LF_ZERO_STAGE: return set_key(l->raw, "zero_optimization", "stage", typed(v));
    case LF_ACCUM: return set_key(l->raw, NULL, "gradient_accumulation_steps", typed(v));
    case LF_CLIP: return set_key(l->raw, NULL, "max_grad_norm", typed(v));
    case LF_OFFLOAD_OPT:
    case LF_OFFLOAD_PARAM:
        if (!strcmp(v, "none"))
            return 0;
        return set_key(l->raw, "zero_optimization", f->what == LF_OFFLOAD_OPT ? "offload_optimizer" : "offload_param",
                       json_pack("{s:s}", "device", v));
    default: leave_out(l, f->name, f->value ? v : NULL); return 0;
    }
}

static const launch_flag *find_flag(const launch_flag *table, const char *name)
{
    for (int i = 0; table[i].name != NULL; i++)
        if (!strcmp(table[i].name, name))
            return &table[i];
    return NULL;
}

static bool in_list(const char *s, const char *const *list)
{
    for (int i = 0; list[i] != NULL; i++)
        if (!strcmp(s, list[i]))
            return true;
    return false;
}

static bool is_alias(const char *name)
{
    for (const spec_alias *a = spec_alias_table(); a->alias != NULL; a++)
        if (!strcmp(a->alias, name))
            return true;
    return false;
}

/* One script flag and its value (NULL: a bare switch). */
static int take_script_flag(launch *l, const char *name, const char *v)
{
    if (!strcmp(name, "deepspeed")) {
        if (l->ds_file != NULL && v != NULL && strcmp(l->ds_file, v) != 0) {
            fprintf(stderr, "accumctl: launch: --deepspeed_config_file %s and the script's --deepspeed %s differ\n",
                    l->ds_file, v);
            return CTL_EUSAGE;
        }
        l->ds_file = v;
        return 0;
    }
    if (is_alias(name) || in_list(name, native_keys)) {
        json_t *val = typed(v), *cur = json_object_get(l->raw, name);
        if (cur != NULL && !json_equal(cur, val)) { /* e.g. accelerate's and the script's accumulation */
            fprintf(stderr, "accumctl: launch: --%s is given twice with different values\n", name);
            json_decref(val);
            return CTL_EUSAGE;
        }
        return set_key(l->raw, NULL, name, val);
    }
    for (int i = 0; script_paths[i].flag != NULL; i++)
        if (!strcmp(script_paths[i].flag, name) && v != NULL)
            return set_key(l->raw, script_paths[i].section, script_paths[i].key, json_string(v));
    leave_out(l, name, v);
    return 0;
}

/* The script's arguments: --name value, --name=value, or --switch. */
static int script_args(launch *l, int argc, char **argv, int i)
{
    for (; i < argc; i++) {
        if (strncmp(argv[i], "-", 1) != 0 || argv[i][1] == '\0') {
            char item[300];
            snprintf(item, sizeof item, "'%s' (a positional argument)", argv[i]);
            spec_list_append(l->left_out, sizeof l->left_out, item);
            continue;
        }
        char name[128];
        const char *v;
        flag_name(argv[i], name, sizeof name, &v);
        if (v == NULL && i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0)
            v = argv[++i];
        int rc = take_script_flag(l, name, v);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* The launcher's flags, then the script (optional for accelerate, whose
 * flags the script's may follow directly) and its arguments. */
static int parse_line(launch *l, int argc, char **argv)
{
    const launch_flag *table;
    int i = 0;
    if (argc >= 2 && !strcmp(argv[0], "accelerate") && !strcmp(argv[1], "launch"))
        table = accelerate_flags, i = 2;
    else if (argc >= 1 && !strcmp(argv[0], "torchrun"))
        table = torchrun_flags, i = 1;
    else if (argc >= 1 && !strcmp(argv[0], "deepspeed"))
        table = deepspeed_flags, i = 1;
    else {
        fprintf(stderr, "accumctl: launch: give an `accelerate launch ...`, `deepspeed ...` or `torchrun ...` line\n");
        return CTL_EUSAGE;
    }
    for (; i < argc && argv[i][0] == '-'; i++) {
        char name[128];
        const char *v;
        flag_name(argv[i], name, sizeof name, &v);
        const launch_flag *f = find_flag(table, name);
        if (f == NULL)
            break; /* the script's flags from here */
        if (f->value && v == NULL) {
            if (i + 1 >= argc) {
                fprintf(stderr, "accumctl: launch: --%s needs a value\n", name);
                return CTL_EUSAGE;
            }
            v = argv[++i];
        }
        int rc = take_launcher_flag(l, f, v);
        if (rc != 0)
            return rc;
    }
    if (i < argc && argv[i][0] != '-')
        i++; /* the script itself: its meaning is the spec's */
    return script_args(l, argc, argv, i);
}

/* devices per node and nodes from the launcher's counts. */
static int world(launch *l)
{
    long nodes = l->nodes > 0 ? l->nodes : 1, per = l->procs_node;
    if (l->procs_total > 0) {
        if (l->procs_total % nodes != 0) {
            fprintf(stderr, "accumctl: launch: --num_processes %ld is not a multiple of --num_machines %ld\n",
                    l->procs_total, nodes);
            return CTL_EUSAGE;
        }
        per = l->procs_total / nodes;
    }
    if (per > 0)
        set_key(l->raw, NULL, "devices", json_integer(per));
    if (nodes > 1)
        set_key(l->raw, NULL, "nodes", json_integer(nodes));
    if (l->ds_file != NULL)
        set_key(l->raw, NULL, "deepspeed", json_string(l->ds_file));
    return 0;
}

/* B = m x a x w or the daemon refuses it: say so now, with the arithmetic. */
static void check_triple(const json_t *spec)
{
    const json_t *B = json_object_get(spec, "train_batch_size"), *m = json_object_get(spec, "train_micro_batch_size_per_gpu"),
                 *a = json_object_get(spec, "gradient_accumulation_steps");
    if (!json_is_integer(B) || !json_is_integer(m) || !json_is_integer(a))
        return;
    json_int_t w = json_integer_value(json_object_get(spec, "devices"));
    json_int_t nodes = json_integer_value(json_object_get(spec, "nodes"));
    w = (w > 0 ? w : 1) * (nodes > 0 ? nodes : 1);
    if (json_integer_value(B) != json_integer_value(m) * json_integer_value(a) * w)
        fprintf(stderr,
                "accumctl: launch: train_batch_size %lld != %lld * %lld * %lld (micro * accum * world): accumd "
                "refuses this; drop one of the three\n",
                (long long)json_integer_value(B), (long long)json_integer_value(m), (long long)json_integer_value(a),
                (long long)w);
}

/* A name for the job: the output directory's last part, else the model's. */
static void name_it(json_t *spec)
{
    const char *src = json_string_value(json_object_get(spec, "output_dir"));
    if (src == NULL)
        src = json_string_value(json_object_get(json_object_get(spec, "model"), "from"));
    if (src == NULL || json_object_get(spec, "name") != NULL)
        return;
    char buf[128];
    snprintf(buf, sizeof buf, "%s", src);
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/')
        buf[--n] = '\0';
    const char *base = strrchr(buf, '/');
    json_object_set_new(spec, "name", json_string(base ? base + 1 : buf));
}

static int launch_options(launch *l, int argc, char **argv, int *i)
{
    for (*i = 0; *i < argc && argv[*i][0] == '-'; (*i)++) {
        const char *a = argv[*i];
        if (!strcmp(a, "--submit"))
            l->submit = true;
        else if (!strcmp(a, "--dry-run"))
            l->o.dry_run = true;
        else if (!strcmp(a, "--wait"))
            l->o.wait = true;
        else if (!strcmp(a, "--"))
            return (*i)++, 0;
        else {
            fprintf(stderr, "accumctl: launch: unknown option %s (before the launcher: --submit, --dry-run, --wait)\n", a);
            return CTL_EUSAGE;
        }
    }
    if ((l->o.dry_run || l->o.wait) && !l->submit) {
        fprintf(stderr, "accumctl: launch: --dry-run and --wait go with --submit\n");
        return CTL_EUSAGE;
    }
    return 0;
}

int ctl_cmd_launch(ctl *c, int argc, char **argv)
{
    launch l = {.raw = json_object()};
    json_t *origin = json_object();
    int i, rc = l.raw && origin ? launch_options(&l, argc, argv, &i) : CTL_EUSAGE;
    if (rc == 0)
        rc = parse_line(&l, argc - i, argv + i);
    if (rc == 0)
        rc = world(&l);
    char ignored[1024] = "";
    acc_err err = {0};
    if (rc == 0 && spec_alias_apply(l.raw, origin, ignored, sizeof ignored, &err) != 0) {
        fprintf(stderr, "accumctl: launch: %s\n", err.msg);
        rc = CTL_EUSAGE;
    }
    if (rc == 0) {
        name_it(l.raw);
        if (ignored[0] != '\0')
            spec_list_append(l.left_out, sizeof l.left_out, ignored);
        if (l.left_out[0] != '\0')
            fprintf(stderr, "accumctl: launch: no meaning in accumd, left out: %s\n", l.left_out);
        check_triple(l.raw);
        char *text = json_dumps(l.raw, JSON_INDENT(2) | JSON_REAL_PRECISION(10));
        if (text == NULL)
            rc = CTL_EUSAGE;
        else if (!l.submit)
            printf("%s\n", text);
        else
            rc = ctl_submit_text(c, &l.o, text, strlen(text));
        free(text);
    }
    json_decref(origin);
    json_decref(l.raw);
    return rc;
}
