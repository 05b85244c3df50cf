/* model: see model.h. The generic half: the registry, layout walking, the
 * handle's buffers, byte counts, weights by layout. Nothing here knows a
 * family's tensors. */
#include "model.h"
#include "model_lora.h"
#include "model_shard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blocks.h"
#include "checked.h"
#include "host_mem.h"
#include "nf4.h"
#include "safepath.h"

/* ---- registry: one line per family */

extern const model_family model_family_gpt2;
extern const model_family model_family_llama;
extern const model_family model_family_qwen3;
extern const model_family model_family_gemma2;

static const model_family *const families[] = {
    &model_family_gpt2,
    &model_family_llama,
    &model_family_qwen3,
    &model_family_gemma2,
    NULL,
};

const model_family *model_family_at(int i)
{
    int n = (int)(sizeof families / sizeof families[0]) - 1;
    return i >= 0 && i < n ? families[i] : NULL;
}

const model_family *model_family_default(void)
{
    return families[0];
}

const model_family *model_family_by_arch(const char *arch)
{
    if (arch == NULL || arch[0] == '\0')
        return model_family_default();
    for (int i = 0; families[i] != NULL; i++)
        if (strcmp(families[i]->name, arch) == 0)
            return families[i];
    return NULL;
}

/* The registry row whose `key` (0: architecture, 1: model_type) is s,
 * and its family. */
static const model_hf_name *hf_row(const char *s, int key, const model_family **fam)
{
    for (int i = 0; s != NULL && families[i] != NULL; i++)
        for (const model_hf_name *r = families[i]->hf_names; r != NULL && r->model_type; r++)
            if (!strcmp(key ? r->model_type : r->architecture, s)) {
                if (fam != NULL)
                    *fam = families[i];
                return r;
            }
    return NULL;
}

const model_family *model_family_by_hf_type(const char *type)
{
    const model_family *f = NULL;
    return hf_row(type, 1, &f) ? f : NULL;
}

const model_hf_name *model_hf_name_of(const char *type)
{
    return hf_row(type, 1, NULL);
}

/* The registered architectures (key 0) or model types (1), for messages. */
static const char *hf_known(int key, char *buf, size_t n)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; families[i] != NULL; i++)
        for (const model_hf_name *r = families[i]->hf_names; r != NULL && r->model_type; r++) {
            int w = snprintf(buf + at, n - at, "%s%s", at ? ", " : "",
                             key ? r->model_type : r->architecture);
            at += w > 0 && (size_t)w < n - at ? (size_t)w : 0;
        }
    return buf;
}

int model_family_of_hf(const json_t *c, const char *file, const model_family **out,
                       acc_err *err)
{
    const model_family *by_arch = NULL, *by_type = NULL;
    const char *arch = NULL, *type = NULL;
    char known[512];
    json_t *a = json_object_get(c, "architectures"), *mt = json_object_get(c, "model_type");
    if (a != NULL && !json_is_null(a)) {
        if (!json_is_array(a) || json_array_size(a) == 0 || !json_is_string(json_array_get(a, 0)))
            return acc_err_set(err, ACC_EINVAL, "model.from",
                               "%s: architectures must be a list of class names", file);
        arch = json_string_value(json_array_get(a, 0));
        if (hf_row(arch, 0, &by_arch) == NULL)
            return acc_err_set(err, ACC_EINVAL, "model.from",
                               "%s: architectures: unknown architecture %s (known: %s)", file,
                               arch, hf_known(0, known, sizeof known));
    }
    if (mt != NULL && !json_is_null(mt)) {
        if (!json_is_string(mt))
            return acc_err_set(err, ACC_EINVAL, "model.from", "%s: model_type must be a string",
                               file);
        type = json_string_value(mt);
        if (hf_row(type, 1, &by_type) == NULL)
            return acc_err_set(err, ACC_EINVAL, "model.from",
                               "%s: model_type: unknown model type %s (known: %s)", file, type,
                               hf_known(1, known, sizeof known));
    }
    if (by_arch == NULL && by_type == NULL)
        return acc_err_set(err, ACC_EINVAL, "model.from",
                           "%s names no architectures and no model_type", file);
    if (by_arch != NULL && by_type != NULL && by_arch != by_type)
        return acc_err_set(err, ACC_EINVAL, "model.from",
                           "%s: architectures %s and model_type %s disagree", file, arch, type);
    *out = by_arch ? by_arch : by_type;
    return 0;
}

const model_family *model_family_of(const model_config *cfg)
{
    return cfg->family != NULL ? cfg->family : model_family_default();
}

const char *model_family_names(char *buf, size_t n)
{
    size_t at = 0;
    if (n > 0)
        buf[0] = '\0';
    for (int i = 0; families[i] != NULL && at < n; i++) {
        int w = snprintf(buf + at, n - at, "%s%s", i ? ", " : "", families[i]->name);
        at += w > 0 ? (size_t)w : 0;
    }
    return buf;
}

/* ---- config */

static void set_family(model_config *cfg, const model_family *f)
{
    cfg->family = f;
    if (cfg->model_type[0] == '\0')
        snprintf(cfg->model_type, sizeof cfg->model_type, "%s", f->name);
}

int model_config_from_spec(const spec_model *sm, model_config *cfg, acc_err *err)
{
    char names[256];
    const model_family *f = model_family_by_arch(sm->arch);
    memset(cfg, 0, sizeof *cfg);
    if (f == NULL)
        return acc_err_set(err, ACC_EINVAL, "model.arch", "unknown arch \"%s\" (%s)", sm->arch,
                           model_family_names(names, sizeof names));
    int rc = f->config_from_spec(sm, cfg, err);
    if (rc == 0)
        set_family(cfg, f);
    return rc;
}

int model_config_from_fd(int fd, const char *path, const spec_model *sm, model_config *cfg,
                         acc_err *err)
{
    char names[256];
    const model_family *f = model_family_by_arch(sm->arch);
    memset(cfg, 0, sizeof *cfg);
    if (f == NULL)
        return acc_err_set(err, ACC_EINVAL, "model.arch", "unknown arch \"%s\" (%s)", sm->arch,
                           model_family_names(names, sizeof names));
    if (f->config_from_fd == NULL)
        return acc_err_set(err, ACC_EINVAL, "model.init_from",
                           "arch %s cannot start from a checkpoint file", f->name);
    int rc = f->config_from_fd(fd, path, sm, cfg, err);
    if (rc == 0)
        set_family(cfg, f);
    return rc;
}

int model_config_from_file(const char *path, const spec_model *sm, model_config *cfg,
                           acc_err *err)
{
    int fd;
    memset(cfg, 0, sizeof *cfg);
    /* no roots: a tool's own path, but still a regular file, non-blocking */
    int rc = sp_open_file("", path, "model.init_from", &fd, NULL, 0, err);
    if (rc != 0)
        return rc;
    rc = model_config_from_fd(fd, path, sm, cfg, err);
    close(fd);
    return rc;
}

/* config.json's quantization_config as transformers
 * writes it for bitsandbytes: 4-bit NF4 (double quantization or not) is
 * read; 8-bit, FP4 and other methods are refused, naming the key. */
static int quant_from_hf(const json_t *hf, model_config *cfg, acc_err *err)
{
    const json_t *qc = json_object_get(hf, "quantization_config");
    if (qc == NULL || json_is_null(qc))
        return 0;
    if (!json_is_object(qc))
        return acc_err_set(err, ACC_EINVAL, "model.from",
                           "config.json: quantization_config must be an object");
    const char *method = json_string_value(json_object_get(qc, "quant_method"));
    if (method == NULL || strcmp(method, "bitsandbytes") != 0)
        return acc_err_set(err, ACC_EINVAL, "model.from",
                           "config.json: quantization_config.quant_method %s is not supported "
                           "yet (bitsandbytes 4-bit NF4 only)", method ? method : "(absent)");
    bool in8, in4, dq;
    int rc = model_hf_bool(qc, "load_in_8bit", false, &in8, err);
    if (rc == 0)
        rc = model_hf_bool(qc, "load_in_4bit", false, &in4, err);
    if (rc == 0)
        rc = model_hf_bool(qc, "bnb_4bit_use_double_quant", false, &dq, err);
    if (rc != 0)
        return rc;
    if (in8 || !in4)
        return acc_err_set(err, ACC_EINVAL, "model.from",
                           "config.json: quantization_config: %s is not supported yet "
                           "(load_in_4bit with bnb_4bit_quant_type nf4 only)",
                           in8 ? "load_in_8bit" : "a bitsandbytes scheme without load_in_4bit");
    const json_t *qt = json_object_get(qc, "bnb_4bit_quant_type");
    const char *type = json_string_value(qt); /* transformers' default is fp4 */
    if (type == NULL || strcmp(type, "nf4") != 0)
        return acc_err_set(err, ACC_EINVAL, "model.from",
                           "config.json: quantization_config.bnb_4bit_quant_type %s is not "
                           "supported yet (nf4 only)", type ? type : "(absent: fp4)");
    cfg->quant = MODEL_QUANT_NF4;
    cfg->quant_nested = dq;
    cfg->quant_in_files = true;
    return 0;
}

int model_config_from_hf(const json_t *hf, model_config *cfg, acc_err *err)
{
    char names[256];
    memset(cfg, 0, sizeof *cfg);
    const char *type = json_string_value(json_object_get(hf, "model_type"));
    if (type == NULL)
        return acc_err_set(err, ACC_EINVAL, "model.from", "config.json has no \"model_type\"");
    const model_family *f = model_family_by_hf_type(type);
    if (f == NULL || f->config_from_hf == NULL)
        return acc_err_set(err, ACC_EINVAL, "model.from",
                           "config.json: unsupported model_type \"%s\" (families: %s)", type,
                           model_family_names(names, sizeof names));
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", type);
    /* the dtype the weights are loaded in (hf_dir checks every tensor has it) */
    const char *td = json_string_value(json_object_get(hf, "torch_dtype"));
    cfg->weights_dtype = td == NULL                ? ST_F32
                         : !strcmp(td, "bfloat16") ? ST_BF16
                         : !strcmp(td, "float16")  ? ST_F16
                                                   : ST_F32;
    int rc = f->config_from_hf(hf, cfg, err);
    if (rc == 0)
        rc = quant_from_hf(hf, cfg, err);
    if (rc == 0)
        set_family(cfg, f);
    if (rc == 0 && (rc = model_config_check(cfg, err)) != 0 && err != NULL)
        snprintf(err->field, sizeof err->field, "model.from"); /* config.json's, like its other errors */
    return rc;
}

/* Caps on every size a config may carry, checked before any layout is
 * built (issue 25: a config.json's 10^9 layers grew the layout until the
 * host ran out). Each names the spec key and the config.json key(s). */
typedef struct size_cap {
    const char *spec_key, *hf_keys;
    int limit;
    int (*get)(const model_config *c);
} size_cap;

static int cap_layers(const model_config *c) { return c->n_layer; }
static int cap_hidden(const model_config *c) { return c->channels; }
static int cap_heads(const model_config *c) { return c->n_head; }
static int cap_kv_heads(const model_config *c) { return c->n_kv_head; }
static int cap_head_dim(const model_config *c) { return c->head_dim; }
static int cap_inter(const model_config *c) { return c->intermediate_size; }
static int cap_vocab(const model_config *c) { return c->vocab_size; }
static int cap_padded(const model_config *c) { return c->padded_vocab_size; }
static int cap_positions(const model_config *c) { return c->max_seq_len; }

static const size_cap size_caps[] = {
    {"n_layer", "num_hidden_layers / n_layer", MODEL_MAX_LAYERS, cap_layers},
    {"n_embd", "hidden_size / n_embd", MODEL_MAX_HIDDEN, cap_hidden},
    {"n_head", "num_attention_heads / n_head", MODEL_MAX_HEADS, cap_heads},
    {"n_kv_head", "num_key_value_heads", MODEL_MAX_HEADS, cap_kv_heads},
    {"head_dim", "head_dim", MODEL_MAX_HEAD_DIM, cap_head_dim},
    {"intermediate_size", "intermediate_size / n_inner", MODEL_MAX_INTERMEDIATE, cap_inter},
    {"vocab_size", "vocab_size", MODEL_MAX_VOCAB, cap_vocab},
    {"padded_vocab_size", "vocab_size", MODEL_MAX_VOCAB, cap_padded},
    {"seq_len", "max_position_embeddings / n_positions", MODEL_MAX_POSITIONS, cap_positions},
};

static int check_size_caps(const model_config *cfg, acc_err *err)
{
    for (size_t i = 0; i < sizeof size_caps / sizeof size_caps[0]; i++) {
        const size_cap *k = &size_caps[i];
        int v = k->get(cfg);
        if (v > k->limit) {
            char field[64];
            snprintf(field, sizeof field, "model.%s", k->spec_key);
            return acc_err_set(err, ACC_EINVAL, field,
                               "%s (config.json: %s) is %d, over accumd's limit of %d", k->spec_key,
                               k->hf_keys, v, k->limit);
        }
    }
    return 0;
}

int model_config_check(const model_config *cfg, acc_err *err)
{
    int rc = check_size_caps(cfg, err);
    return rc != 0 ? rc : model_family_of(cfg)->config_check(cfg, err);
}

/* ---- the config.json reader */

int model_hf_int(const json_t *obj, const char *key, int def, int *out, acc_err *err)
{
    const json_t *v = json_object_get(obj, key);
    if ((v == NULL || json_is_null(v)) && def >= 0) {
        *out = def;
        return 0;
    }
    if (v == NULL || json_is_null(v))
        return acc_err_set(err, ACC_EINVAL, "model.from", "config.json has no %s", key);
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > INT32_MAX)
        return acc_err_set(err, ACC_EINVAL, "model.from",
                           "config.json: %s must be an integer in [1, 2^31)", key);
    *out = (int)json_integer_value(v);
    return 0;
}

int model_hf_num(const json_t *obj, const char *key, double def, double *out, acc_err *err)
{
    const json_t *v = json_object_get(obj, key);
    if (v == NULL || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_number(v))
        return acc_err_set(err, ACC_EINVAL, "model.from", "config.json: %s must be a number", key);
    *out = json_number_value(v);
    return 0;
}

int model_hf_bool(const json_t *obj, const char *key, bool def, bool *out, acc_err *err)
{
    const json_t *v = json_object_get(obj, key);
    if (v == NULL || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v))
        return acc_err_set(err, ACC_EINVAL, "model.from",
                           "config.json: %s must be true or false", key);
    *out = json_is_true(v);
    return 0;
}

/* ---- the weight store's dtypes */

st_dtype model_base_dtype(const model_config *cfg)
{
    bool half = cfg->weights_dtype == ST_BF16 || cfg->weights_dtype == ST_F16;
    return cfg->lora.r > 0 && half ? cfg->weights_dtype : ST_F32;
}

/* Whether the frozen base lives in the store (a 16-bit or a 4-bit one). */
static bool store_on(const model_config *cfg)
{
    return cfg->lora.r > 0 && (model_base_dtype(cfg) != ST_F32 || cfg->quant == MODEL_QUANT_NF4);
}

bool model_tensor_nf4(const model_config *cfg, const model_tensor *t)
{
    size_t len = strlen(t->name), w = strlen(".weight");
    return cfg->quant == MODEL_QUANT_NF4 && !t->adapter && t->layer >= 0 && t->ndim == 2 &&
           !t->transposed && len > w && strcmp(t->name + len - w, ".weight") == 0;
}

/* Bytes of a stored tensor in the store (nf4_region_of cannot overflow
 * for a count the layout checked: it is under 4 bytes a value). */
static size_t store_bytes(const model_config *cfg, const model_tensor *t)
{
    nf4_region r;
    if (t->dtype == ST_NF4 && nf4_region_of(t->count, cfg->quant_nested, &r))
        return r.bytes;
    return t->count * (t->dtype == ST_F32 ? sizeof(float) : st_dtype_size(t->dtype));
}

/* ---- layout */

int model_layout_add(model_layout *l, int *cap, const char *name, int layer, int ndim,
                     const int64_t *shape, size_t count, bool decays, bool trains,
                     bool transposed, const char *field, acc_err *err)
{
    if (ndim < 1 || ndim > MODEL_MAX_DIMS)
        return acc_err_set(err, ACC_EINTERNAL, field, "tensor %s: %d dims", name, ndim);
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 1 || acc_mul_u64(n, (uint64_t)shape[i], &n))
            return acc_err_set(err, ACC_EINVAL, field, "tensor %s: size out of range", name);
    }
    if (count == 0)
        count = (size_t)n;
    uint64_t end, bytes;
    if (count < n || acc_add_u64(l->nparams, count, &end) || acc_mul_u64(end, 2 * sizeof(float), &bytes))
        return acc_err_set(err, ACC_EINVAL, field,
                           "the model's parameters overflow 64-bit sizes at tensor %s", name);
    if (l->n == *cap) {
        int nc = *cap ? 2 * *cap : 32;
        model_tensor *t = realloc(l->t, (size_t)nc * sizeof *t);
        if (t == NULL)
            return acc_err_set(err, ACC_ENOMEM, "", "out of host memory for the layout");
        l->t = t;
        *cap = nc;
    }
    model_tensor *t = &l->t[l->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    t->offset = l->nparams;
    t->count = count;
    t->layer = layer;
    t->decays = decays;
    t->trains = trains;
    t->transposed = transposed && ndim == 2;
    l->nparams = (size_t)end;
    return 0;
}

int model_layout_build(const model_config *cfg, model_layout *out, acc_err *err)
{
    memset(out, 0, sizeof *out);
    const model_family *f = model_family_of(cfg);
    int rc = model_config_check(cfg, err);
    if (rc == 0)
        rc = f->layout(cfg, out, err);
    out->ntrain = out->nparams;
    if (rc == 0 && cfg->lora.r > 0) /* adapters first, the base frozen after them */
        rc = model_lora_layout(cfg, out, err);
    if (rc != 0) {
        model_layout_free(out);
        return rc;
    }
    /* storage dtypes: the frozen suffix in the base's dtype (a 4-bit
     * base: its linear weights NF4, the rest in the base's dtype), packed
     * in layout order in the store; everything else fp32 */
    st_dtype base = model_base_dtype(cfg);
    bool store = store_on(cfg);
    size_t soff = 0, align = cfg->quant ? 16 : 1;
    for (int i = 0; i < out->n; i++) {
        model_tensor *t = &out->t[i];
        t->stored = store && t->offset >= out->ntrain;
        t->dtype = !t->stored ? ST_F32 : model_tensor_nf4(cfg, t) ? ST_NF4 : base;
        if (t->stored) {
            soff = (soff + align - 1) / align * align;
            t->soff = soff;
            soff += store_bytes(cfg, t); /* <= 4 bytes a float: checked */
        }
    }
    return 0;
}

model_layout model_layout_base(const model_layout *l)
{
    int na = 0;
    while (na < l->n && l->t[na].adapter)
        na++;
    return (model_layout){.t = l->t + na, .n = l->n - na, .nparams = l->nparams,
                          .ntrain = l->ntrain};
}

void model_layout_free(model_layout *l)
{
    free(l->t);
    memset(l, 0, sizeof *l);
}

const model_tensor *model_layout_find(const model_layout *l, const char *name)
{
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->t[i].name, name) == 0)
            return &l->t[i];
    return NULL;
}

size_t model_layout_layer_floats(const model_layout *l, int layer)
{
    size_t n = 0;
    for (int i = 0; i < l->n; i++)
        if (l->t[i].layer == layer)
            n += l->t[i].count;
    return n;
}

size_t model_layout_layer_train_floats(const model_layout *l, int layer)
{
    size_t n = 0;
    for (int i = 0; i < l->n; i++)
        if (l->t[i].layer == layer && l->t[i].trains)
            n += l->t[i].count;
    return n;
}

size_t model_num_params(const model_config *cfg)
{
    model_layout l;
    if (model_layout_build(cfg, &l, NULL) != 0)
        return 0;
    size_t n = l.nparams;
    model_layout_free(&l);
    return n;
}

size_t model_num_trainable(const model_config *cfg)
{
    model_layout l;
    if (model_layout_build(cfg, &l, NULL) != 0)
        return 0;
    size_t n = l.ntrain;
    model_layout_free(&l);
    return n;
}

size_t model_block_params(const model_config *cfg)
{
    model_layout l;
    if (model_layout_build(cfg, &l, NULL) != 0)
        return 0;
    size_t n = model_layout_layer_floats(&l, 0);
    model_layout_free(&l);
    return n;
}


/* The fetch scratch's two slots (floats): the largest narrow tensor, the
 * largest narrow 1-D one; *store: the bytes of the narrow tensors. */
static void fetch_slots(const model_config *cfg, const model_layout *l, size_t *big, size_t *vec,
                        uint64_t *store)
{
    *big = *vec = 0;
    *store = 0;
    for (int i = 0; i < l->n; i++) {
        const model_tensor *t = &l->t[i];
        if (!t->stored)
            continue;
        uint64_t end = (uint64_t)t->soff + store_bytes(cfg, t);
        *store = end > *store ? end : *store;
        if (t->dtype == ST_F32) /* used in place: no fetch */
            continue;
        *big = t->count > *big ? t->count : *big;
        if (t->ndim == 1)
            *vec = t->count > *vec ? t->count : *vec;
    }
}

/* Device bytes of a layout with narrow tensors: the fp32 prefix (the
 * adapters) and its gradients, the store, the fetch scratch. */
static int narrow_bytes(const model_config *cfg, const model_layout *l, uint64_t *pg, acc_err *err)
{
    size_t big, vec;
    uint64_t base;
    fetch_slots(cfg, l, &big, &vec, &base);
    uint64_t train = (uint64_t)l->ntrain * 2 * sizeof(float); /* model_layout_add: no overflow */
    uint64_t fetch = ((uint64_t)big + vec) * sizeof(float);
    if (acc_add_u64(train, base, pg) || acc_add_u64(*pg, fetch, pg))
        return acc_err_set(err, ACC_EINVAL, "model", "the model's state overflows 64-bit sizes");
    return 0;
}

/* ---- bytes */

int model_state_bytes(const model_config *cfg, size_t grad_tail, uint64_t *bytes, acc_err *err)
{
    const model_family *f = model_family_of(cfg);
    *bytes = ACC_SIZE_OVERFLOW;
    uint64_t pg;
    int rc = model_config_check(cfg, err);
    if (rc != 0)
        return rc;
    if (f->param_bytes != NULL && cfg->lora.r == 0) {
        rc = f->param_bytes(cfg, &pg, err);
    } else {
        model_layout l;
        if ((rc = model_layout_build(cfg, &l, err)) != 0)
            return rc;
        /* parameters + gradients of the trainable ones (ntrain <= nparams;
         * model_layout_add checked 2 * nparams * 4) */
        pg = ((uint64_t)l.nparams + l.ntrain) * sizeof(float);
        if (store_on(cfg))
            rc = narrow_bytes(cfg, &l, &pg, err);
        model_layout_free(&l);
    }
    if (rc != 0)
        return rc;
    uint64_t tail;
    if (acc_mul_u64(grad_tail, sizeof(float), &tail) || acc_add_u64(pg, tail, bytes))
        return acc_err_set(err, ACC_EINVAL, "model", "the model's state overflows 64-bit sizes");
    return 0;
}

int model_act_bytes(const model_config *cfg, int B, int T, int recompute, uint64_t *bytes,
                    acc_err *err)
{
    *bytes = 0;
    if (B <= 0)
        return 0;
    if (T < 1)
        return acc_err_set(err, ACC_EINVAL, "model.seq_len", "seq_len %d must be >= 1", T);
    const model_family *f = model_family_of(cfg);
    int rc = model_config_check(cfg, err);
    if (rc == 0)
        rc = f->act_bytes(cfg, B, T, recompute, bytes, err);
    if (rc != 0)
        *bytes = ACC_SIZE_OVERFLOW;
    return rc;
}

bool model_act_offload(const model_config *cfg, int recompute)
{
    return cfg->act_offload && recompute;
}

uint64_t model_act_host_bytes(const model_config *cfg, int B, int T, int recompute)
{
    if (!model_act_offload(cfg, recompute) || B <= 0 || T <= 0)
        return 0;
    uint64_t btc = acc_sat_mul3_u64((uint64_t)B, (uint64_t)T, (uint64_t)cfg->channels);
    uint64_t L = (uint64_t)cfg->n_layer;
    if (cfg->act_bf16) /* checkpoint 0 in fp32, 1 .. L-1 in bf16 (blocks.c) */
        return acc_sat_mul_u64(btc, acc_sat_add_u64(sizeof(float), acc_sat_mul_u64(L - 1, sizeof(uint16_t))));
    return acc_sat_mul3_u64(L, btc, sizeof(float));
}

uint64_t model_linear_rows(const model_config *cfg, uint64_t n_tokens, int recompute)
{
    uint64_t ch = (uint64_t)blk_head_chunk(cfg);
    bool chunked = model_family_of(cfg)->token_chunks && cfg->lean_acts && cfg->lean_tokens && recompute;
    return chunked && n_tokens > ch ? ch : n_tokens;
}

/* ---- the handle */

/* The host checkpoints of an offloading mode, from the caller's budget. */
static int ck_host_alloc(model *m, acc_err *err)
{
    uint64_t bytes = model_act_host_bytes(&m->cfg, m->B, m->T, m->recompute);
    if (bytes == 0)
        return 0;
    if (m->host == NULL)
        return acc_err_set(err, ACC_EINVAL, "activation_checkpointing.offload",
                           "activation checkpoints in host memory need the job's host-memory budget");
    if (bytes > SIZE_MAX)
        return acc_err_set(err, ACC_ENOMEM, "host memory",
                           "the activation checkpoints (%llu bytes) exceed host memory",
                           (unsigned long long)bytes);
    int rc = host_mem_alloc(m->host, (size_t)bytes, (void **)&m->ck_host, err);
    if (rc == 0)
        m->ck_host_bytes = (size_t)bytes;
    else
        acc_err_prefix(err, "activation checkpoints in host memory");
    return rc;
}

static void ck_host_free(model *m)
{
    if (m->ck_host != NULL)
        host_mem_free(m->host, m->ck_host, m->ck_host_bytes);
    m->ck_host = NULL;
    m->ck_host_bytes = 0;
}

int model_acts_alloc(model *m, int B, int recompute, acc_err *err)
{
    model_acts_free(m);
    if (B < 1)
        return acc_err_set(err, ACC_EINVAL, "train_micro_batch_size_per_gpu",
                           "micro batch %d must be >= 1", B);
    const kern_ops *k = m->dev->ops;
    if (m->cfg.lean_acts && (k->attention_lean_fwd == NULL || k->attention_lean_bwd == NULL))
        return acc_err_set(err, ACC_EINVAL, "lean_activations",
                           "lean activations need the tiled attention, which the %s backend "
                           "of %s lacks",
                           k->backend, m->dev->info.name);
    if (m->cfg.act_bf16 && (k->narrow_bf16 == NULL || k->widen16 == NULL))
        return acc_err_set(err, ACC_EINVAL, "precision",
                           "bf16 activations need narrow_bf16 and widen16, which the %s backend "
                           "of %s lacks",
                           k->backend, m->dev->info.name);
    uint64_t bytes;
    int rc = model_act_bytes(&m->cfg, B, m->T, recompute, &bytes, err);
    if (rc != 0)
        return rc;
    m->B = B;
    m->recompute = recompute;
    m->act_bytes = bytes;
    rc = ck_host_alloc(m, err);
    if (rc == 0 && (rc = m->family->acts_alloc(m, err)) != 0)
        ck_host_free(m);
    if (rc != 0) {
        m->B = 0;
        m->act_bytes = 0;
    }
    return rc;
}

void model_acts_free(model *m)
{
    ck_host_free(m);
    m->family->acts_free(m);
    m->B = 0;
    m->act_bytes = 0;
}

static int alloc_buffers(model *m, acc_err *err)
{
    kern_device *dev = m->dev;
    const kern_ops *k = dev->ops;
    /* model_state_bytes checked these sizes */
    size_t big, vec;
    uint64_t hb;
    fetch_slots(&m->cfg, &m->layout, &big, &vec, &hb);
    m->nf32 = hb > 0 ? m->ngrad : m->nparams; /* narrow tensors: the frozen suffix */
    size_t pb = m->nf32 * sizeof(float);
    size_t gb = (m->ngrad + m->grad_tail) * sizeof(float);
    int rc = k->alloc(dev, pb, (void **)&m->params, err);
    if (rc == 0)
        rc = k->alloc(dev, gb, (void **)&m->grads, err);
    if (rc == 0 && hb > 0) {
        m->wfetch_big = big;
        m->wstore_bytes = (size_t)hb;
        rc = k->alloc(dev, (size_t)hb, &m->wstore, err);
        if (rc == 0)
            rc = k->alloc(dev, (big + vec) * sizeof(float), (void **)&m->wfetch, err);
        if (rc == 0)
            k->zero(dev, m->wstore, (size_t)hb);
    }
    if (rc != 0)
        return rc;
    k->zero(dev, m->params, pb);
    k->zero(dev, m->grads, gb);
    m->nheld = m->ngrad;
    m->gtail = m->grads + m->ngrad;
    return 0;
}

int model_create_ex(kern_device *dev, const model_config *cfg, const model_opts *o, model **out,
                    acc_err *err)
{
    *out = NULL;
    if (o->T > cfg->max_seq_len || o->B < 0 || o->T < 1)
        return acc_err_set(err, ACC_EINVAL, "model.seq_len", "seq_len %d with max_seq_len %d",
                           o->T, cfg->max_seq_len);
    uint64_t state;
    int rc = model_state_bytes(cfg, o->grad_tail, &state, err);
    if (rc != 0)
        return rc;
    model *m = calloc(1, sizeof *m);
    if (m == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory");
    m->family = model_family_of(cfg);
    m->dev = dev;
    m->cfg = *cfg;
    m->cfg.family = m->family;
    m->T = o->T;
    m->grad_tail = o->grad_tail;
    rc = model_layout_build(cfg, &m->layout, err);
    if (rc == 0 && cfg->quant != MODEL_QUANT_NONE && dev->ops->dequant_nf4 == NULL)
        rc = acc_err_set(err, ACC_EDEVICE, "devices", "device %s (%s backend) lacks the op "
                         "dequant_nf4 a 4-bit base needs", dev->info.name, dev->ops->backend);
    if (rc == 0) {
        m->nparams = m->layout.nparams;
        m->ngrad = m->layout.ntrain;
        bool hg = o->comm != NULL && o->host_params == NULL && cfg->grads_host;
        if (hg && o->host_grads == NULL) /* the planner counts the partition in host memory */
            rc = acc_err_set(err, ACC_EINTERNAL, "", "a host gradient partition needs host memory");
        else
            rc = o->comm == NULL         ? alloc_buffers(m, err)
                 : o->host_params != NULL ? model_shard_create_host(m, o->comm, o->rank, o->world, o->host_params,
                                                                    o->host_params_pin, err)
                 : hg ? model_shard_create_host_grads(m, o->comm, o->rank, o->world, o->host_grads,
                                                      o->host_grads_pin, err)
                      : model_shard_create(m, o->comm, o->rank, o->world, err);
    }
    if (rc == 0 && m->family->create != NULL)
        rc = m->family->create(m, err);
    if (rc == 0 && o->B > 0)
        rc = model_acts_alloc(m, o->B, 0, err);
    if (rc != 0) {
        model_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

int model_create(kern_device *dev, const model_config *cfg, int B, int T, model **out,
                 acc_err *err)
{
    model_opts o = {.B = B, .T = T, .grad_tail = MODEL_GRAD_EXTRA};
    return model_create_ex(dev, cfg, &o, out, err);
}

void model_free(model *m)
{
    if (m == NULL)
        return;
    const kern_ops *k = m->dev->ops;
    model_acts_free(m);
    if (m->family->destroy != NULL)
        m->family->destroy(m);
    model_shard_free(m);
    if (m->grads != NULL)
        k->free(m->dev, m->grads);
    if (m->params != NULL)
        k->free(m->dev, m->params);
    if (m->wstore != NULL)
        k->free(m->dev, m->wstore);
    if (m->wfetch != NULL)
        k->free(m->dev, m->wfetch);
    model_layout_free(&m->layout);
    free(m);
}

int model_init_seed(model *m, uint64_t seed, acc_err *err)
{
    float *host = calloc(m->nparams, sizeof *host);
    if (host == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory for init");
    int rc = m->family->init_host(m, seed, host, err);
    if (rc == 0)
        model_params_upload(m, host);
    free(host);
    return rc;
}

int model_load_fd(model *m, int fd, const char *path, acc_err *err)
{
    if (m->family->load_fd_host == NULL)
        return acc_err_set(err, ACC_EINVAL, "model.init_from",
                           "arch %s cannot start from a checkpoint file", m->family->name);
    float *host = calloc(m->nparams, sizeof *host);
    if (host == NULL)
        return acc_err_set(err, ACC_ENOMEM, "model.init_from", "out of host memory loading %s",
                           path);
    int rc = m->family->load_fd_host(m, fd, path, host, err);
    if (rc == 0)
        model_params_upload(m, host);
    free(host);
    return rc;
}

void model_forward(model *m, const int *tokens, const int *targets, const float *weights,
                   int nseq, int want_grad, double *loss_sum)
{
    if (m->shard != NULL)
        model_shard_pass_begin(m, want_grad != 0);
    m->family->forward(m, tokens, targets, weights, nseq, want_grad, loss_sum);
}

/* ZeRO-3: the caller's done, after the ends' gradients are reduced. */
typedef struct shard_done_ctx {
    model *m;
    model_grads_done_fn done;
    void *ctx;
} shard_done_ctx;

static void shard_done(void *ctx, int layer)
{
    shard_done_ctx *c = ctx;
    if (layer < 0)
        model_shard_backward_done(c->m);
    if (c->done != NULL)
        c->done(c->ctx, layer);
}

void model_backward(model *m, int nseq)
{
    model_backward_notify(m, nseq, NULL, NULL);
}

void model_backward_notify(model *m, int nseq, model_grads_done_fn done, void *ctx)
{
    if (m->shard == NULL) {
        m->family->backward(m, nseq, done, ctx);
        return;
    }
    shard_done_ctx c = {m, done, ctx};
    m->family->backward(m, nseq, shard_done, &c);
}

/* Append span [off, off + len) to out, merged into the last one when
 * `merge` and they touch; -1 once out is full. */
static int push_span(kern_span *out, int n, size_t off, size_t len, int merge)
{
    if (n < 0 || len == 0)
        return n;
    if (merge && n > 0 && out[n - 1].off + out[n - 1].n == off) {
        out[n - 1].n += len;
        return n;
    }
    if (n >= MODEL_MAX_GRAD_SPANS)
        return -1;
    out[n] = (kern_span){off, len};
    return n + 1;
}

int model_grad_spans(const model *m, int lo, int hi, int ends, kern_span *out)
{
    /* Walk the layout (ascending offsets) and merge neighbours in memory,
     * but only while the layer does not go down: a layer-major layout
     * (all of block l, then block l + 1) gives one span per bucket, a
     * tensor-major one (llm.c's: one tensor of every block, then the next
     * tensor) one span per block tensor. */
    int n = 0, prev = -2;
    const model_layout *l = &m->layout;
    if (m->shard != NULL) /* ZeRO-3: the blocks' were reduced in the backward */
        return ends ? push_span(out, 0, (size_t)(m->gtail - m->grads), m->grad_tail, 1) : 0;
    for (int i = 0; i < l->n; i++) {
        const model_tensor *t = &l->t[i];
        int in = t->layer < 0 ? ends : (t->layer >= lo && t->layer < hi);
        if (!in || t->offset >= m->ngrad) /* frozen: no gradient */
            continue;
        n = push_span(out, n, t->offset, t->count, t->layer >= prev);
        prev = t->layer;
    }
    if (ends)
        n = push_span(out, n, m->ngrad, m->grad_tail, 1);
    return n;
}

void model_zero_grad(model *m)
{
    m->dev->ops->zero(m->dev, m->grads, ((size_t)(m->gtail - m->grads) + m->grad_tail) * sizeof(float));
    model_shard_zero_host_grads(m); /* the partition's gradients on the host (offload_param, grads_host) */
}

double model_grad_sumsq(model *m)
{
    if (model_shard_grads_on_host(m))
        return model_shard_host_sumsq(m, 0, m->nheld);
    return m->dev->ops->sumsq(m->dev, m->grads, m->nheld);
}

float *model_grad(model *m, size_t off)
{
    if (m->shard != NULL)
        return model_shard_grad(m, off);
    return off >= m->ngrad ? NULL : m->grads + off;
}

const model_layout *model_held_layout(const model *m)
{
    return m->shard != NULL ? model_shard_layout(m) : &m->layout;
}

int model_params_gather(model *m, bool keep)
{
    return m->shard != NULL ? model_shard_snapshot(m, keep) : 0;
}

void model_params_release(model *m)
{
    model_shard_release(m);
}

const model_tensor *model_find_tensor(const model *m, const char *name)
{
    return model_layout_find(&m->layout, name);
}

const float *model_logits(const model *m)
{
    return m->family->logits != NULL && m->B > 0 && !m->cfg.lean_acts ? m->family->logits(m)
                                                                       : NULL;
}

const float *model_token_losses(const model *m)
{
    return m->family->token_losses != NULL && m->B > 0 ? m->family->token_losses(m) : NULL;
}

/* ---- weights by layout */

size_t model_tensor_file_count(const model_tensor *t)
{
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= (size_t)t->shape[i]; /* checked by model_layout_add */
    return n;
}

void model_tensor_to_file(const model_tensor *t, const float *params, float *out)
{
    const float *src = params + t->offset;
    if (!t->transposed) {
        memcpy(out, src, model_tensor_file_count(t) * sizeof *out);
        return;
    }
    /* buffer [shape[1], shape[0]] -> file [shape[0], shape[1]] */
    size_t rows = (size_t)t->shape[1], cols = (size_t)t->shape[0];
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++)
            out[c * rows + r] = src[r * cols + c];
}

void model_tensor_from_file(const model_tensor *t, const float *in, float *params)
{
    float *dst = params + t->offset;
    if (!t->transposed) {
        memcpy(dst, in, model_tensor_file_count(t) * sizeof *dst);
        return;
    }
    /* file [shape[0], shape[1]] -> buffer [shape[1], shape[0]] */
    size_t rows = (size_t)t->shape[0], cols = (size_t)t->shape[1];
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++)
            dst[c * rows + r] = in[r * cols + c];
}

#define HALF_CHUNK ((size_t)1 << 20)

/* A host staging buffer for 16-bit copies: *cap elements (a small stack
 * fallback, `small`, when the heap has none). */
static uint16_t *half_stage(uint16_t *small, size_t nsmall, size_t n, size_t *cap)
{
    *cap = n < HALF_CHUNK ? n : HALF_CHUNK;
    uint16_t *p = *cap > nsmall ? malloc(*cap * sizeof *p) : NULL;
    if (p == NULL) {
        *cap = *cap < nsmall ? *cap : nsmall;
        p = small;
    }
    return p;
}

/* The tensor holding layout float `off` (ascending offsets), or NULL. */
static const model_tensor *tensor_holding(const model_layout *l, size_t off)
{
    int lo = 0, hi = l->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        const model_tensor *t = &l->t[mid];
        if (off >= t->offset && off - t->offset < t->count)
            return t;
        if (t->offset < off)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

/* Device address of layout float `off` of the narrow tensor t. */
static uint16_t *narrow_at(const model *m, const model_tensor *t, size_t off)
{
    return (uint16_t *)((char *)m->wstore + t->soff) + (off - t->offset);
}

/* ---- NF4 tensors in the store */

/* The store's bytes of tensor t. */
static void *store_at(const model *m, const model_tensor *t)
{
    return (char *)m->wstore + t->soff;
}

/* NF4 tensor t's region as host bytes `h` -> its values (dequantized on
 * the host exactly as dequant_nf4 does on the device). */
static void nf4_host_values(const model *m, const model_tensor *t, const uint8_t *h, float *out)
{
    nf4_region r;
    nf4_sizes s = nf4_sizes_of(t->count);
    (void)nf4_region_of(t->count, m->cfg.quant_nested, &r); /* sized by the layout */
    const float *absmax = (const float *)(h + r.absmax);
    float *am = NULL;
    if (r.nested) {
        if ((am = malloc((s.blocks ? s.blocks : 1) * sizeof *am)) == NULL)
            return;
        nf4_absmax_dequant(h + r.qabsmax, s.blocks, (const float *)(h + r.nested_absmax),
                           (const float *)(h + r.nested_map), t->nf4_offset, am);
        absmax = am;
    }
    nf4_dequantize(h + r.codes, absmax, (const float *)(h + r.map), t->count, out);
    free(am);
}

/* Values x[count] of NF4 tensor t -> its region as host bytes h (zeroed
 * first: the alignment padding is 0), quantized with double quantization
 * when the config says so; sets t's offset. */
static int nf4_host_quantize(const model *m, model_tensor *t, const float *x, uint8_t *h)
{
    nf4_region r;
    nf4_sizes s = nf4_sizes_of(t->count);
    (void)nf4_region_of(t->count, m->cfg.quant_nested, &r);
    memset(h, 0, r.bytes);
    memcpy(h + r.map, nf4_values, sizeof nf4_values);
    float *am = r.nested ? malloc((s.blocks ? s.blocks : 1) * sizeof *am) : (float *)(h + r.absmax);
    if (am == NULL)
        return -1;
    nf4_quantize(x, t->count, h + r.codes, am);
    t->nf4_offset = 0.0f;
    if (r.nested) {
        float *map = (float *)(h + r.nested_map);
        nf4_dynamic_map(map);
        nf4_double_quant(am, s.blocks, map, h + r.qabsmax, (float *)(h + r.nested_absmax),
                         &t->nf4_offset);
        free(am);
    }
    return 0;
}

/* Floats [k0, k0 + k) of NF4 tensor t between the host's fp32 and the
 * store: downloaded (dequantized) into `down`, or uploaded from `up`
 * (the whole tensor requantized: a part is merged into its current
 * values first). Host memory: the tensor's values and its region. */
static void nf4_copy(const model *m, const model_tensor *t, float *down, const float *up,
                     size_t k0, size_t k)
{
    kern_device *d = m->dev;
    nf4_region r;
    (void)nf4_region_of(t->count, m->cfg.quant_nested, &r);
    uint8_t *h = malloc(r.bytes);
    float *x = malloc(t->count * sizeof *x);
    if (h == NULL || x == NULL) { /* void API: the weights stay as they are */
        fprintf(stderr, "accumd: out of host memory copying NF4 tensor %s\n", t->name);
        free(h), free(x);
        return;
    }
    bool whole = up != NULL && k0 == 0 && k == t->count;
    if (!whole) {
        d->ops->download(d, h, store_at(m, t), r.bytes);
        nf4_host_values(m, t, h, x);
    }
    if (up == NULL) {
        memcpy(down, x + k0, k * sizeof *x);
    } else {
        memcpy(x + k0, up, k * sizeof *x);
        /* the model owns its layout: the offset is part of the stored bytes */
        if (nf4_host_quantize(m, (model_tensor *)t, x, h) == 0)
            d->ops->upload(d, store_at(m, t), h, r.bytes);
    }
    free(h);
    free(x);
}

int model_nf4_store(model *m, const model_tensor *t, const model_nf4_parts *p, acc_err *err)
{
    nf4_region r;
    nf4_sizes s = nf4_sizes_of(t->count);
    if (t->dtype != ST_NF4 || !nf4_region_of(t->count, m->cfg.quant_nested, &r) ||
        (p->qabsmax != NULL) != r.nested)
        return acc_err_set(err, ACC_EINVAL, "model.from", "tensor %s is not stored in NF4%s",
                           t->name, r.nested ? " with double quantization" : "");
    uint8_t *h = calloc(1, r.bytes);
    if (h == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory storing %s", t->name);
    memcpy(h + r.codes, p->codes, s.bytes);
    memcpy(h + r.map, p->map, NF4_MAP * sizeof(float));
    if (r.nested) {
        memcpy(h + r.qabsmax, p->qabsmax, s.blocks);
        memcpy(h + r.nested_absmax, p->nested_absmax, s.nested * sizeof(float));
        memcpy(h + r.nested_map, p->nested_map, NF4_DYN_MAP * sizeof(float));
    } else {
        memcpy(h + r.absmax, p->absmax, s.blocks * sizeof(float));
    }
    ((model_tensor *)t)->nf4_offset = r.nested ? p->offset : 0.0f;
    m->dev->ops->upload(m->dev, store_at(m, t), h, r.bytes);
    free(h);
    return 0;
}

int model_nf4_count(const model_config *cfg)
{
    model_layout l;
    model_config c = *cfg;
    c.lora.r = 0; /* the base's tensors, whatever the adapters */
    if (model_layout_build(&c, &l, NULL) != 0)
        return 0;
    int n = 0;
    for (int i = 0; i < l.n; i++)
        n += model_tensor_nf4(cfg, &l.t[i]);
    model_layout_free(&l);
    return n;
}

/* Floats [off, off + n) of the stored tensors (from nf32 on) between the
 * host's fp32 and their storage, a chunk at a time: uploaded from
 * `up` when it is not NULL, else downloaded into `down`. */
static void narrow_copy(const model *m, float *down, const float *up, size_t off, size_t n)
{
    kern_device *d = m->dev;
    uint16_t small[2048], *stage;
    size_t cap;
    if (n == 0 || (stage = half_stage(small, 2048, n, &cap)) == NULL)
        return;
    for (size_t done = 0; done < n;) {
        const model_tensor *t = tensor_holding(&m->layout, off + done);
        if (t == NULL || !t->stored) /* the store covers the suffix: a caller bug */
            abort();
        size_t left = t->offset + t->count - (off + done), k = n - done;
        k = k < left ? k : left;
        if (t->dtype == ST_NF4) {
            nf4_copy(m, t, down ? down + done : NULL, up ? up + done : NULL, off + done - t->offset, k);
            done += k;
            continue;
        }
        if (t->dtype == ST_F32) {
            float *dev = (float *)store_at(m, t) + (off + done - t->offset);
            if (up)
                d->ops->upload(d, dev, up + done, k * sizeof(float));
            else
                d->ops->download(d, down + done, dev, k * sizeof(float));
            done += k;
            continue;
        }
        k = k < cap ? k : cap;
        uint16_t *dev = narrow_at(m, t, off + done);
        if (up) { /* little-endian 16-bit values, as the host holds them; cannot fail */
            (void)st_from_f32(t->dtype, up + done, k, stage, NULL);
            d->ops->upload(d, dev, stage, k * sizeof *stage);
        } else {
            d->ops->download(d, stage, dev, k * sizeof *stage);
            for (size_t i = 0; i < k; i++)
                down[done + i] = t->dtype == ST_F16 ? kern_f16_to_f32(stage[i])
                                                    : kern_bf16_to_f32(stage[i]);
        }
        done += k;
    }
    if (stage != small)
        free(stage);
}

void model_weights_download(const model *m, float *host, size_t off, size_t n)
{
    kern_device *d = m->dev;
    if (m->shard != NULL) { /* from model_params_gather's copy */
        model_shard_copy((model *)m, host, NULL, off, n);
        return;
    }
    if (off < m->nf32) {
        size_t k = n < m->nf32 - off ? n : m->nf32 - off;
        d->ops->download(d, host, m->params + off, k * sizeof *host);
        host += k, off += k, n -= k;
    }
    narrow_copy(m, host, NULL, off, n);
}

void model_weights_upload(model *m, const float *host, size_t off, size_t n)
{
    kern_device *d = m->dev;
    if (m->shard != NULL) { /* this rank's pieces of the range */
        model_shard_copy(m, NULL, host, off, n);
        return;
    }
    if (off < m->nf32) {
        size_t k = n < m->nf32 - off ? n : m->nf32 - off;
        d->ops->upload(d, m->params + off, host, k * sizeof *host);
        host += k, off += k, n -= k;
    }
    narrow_copy(m, NULL, host, off, n);
}

void model_params_download(const model *m, float *host)
{
    model_weights_download(m, host, 0, m->nparams);
}

void model_params_upload(model *m, const float *host)
{
    model_weights_upload(m, host, 0, m->nparams);
}

const float *model_weight(model *m, size_t off, int slot)
{
    if (m->shard != NULL)
        return model_shard_weight(m, off);
    if (off < m->nf32)
        return m->params + off;
    const model_tensor *t = tensor_holding(&m->layout, off);
    if (t == NULL || t->offset != off) /* not a tensor's start: a family bug */
        abort();
    if (t->dtype == ST_F32) /* a 4-bit base's fp32 norms: used in place */
        return (const float *)store_at(m, t);
    float *dst = m->wfetch + (slot ? m->wfetch_big : 0);
    if (t->dtype == ST_NF4) {
        nf4_region r;
        (void)nf4_region_of(t->count, m->cfg.quant_nested, &r); /* sized by the layout */
        const uint8_t *b = store_at(m, t);
        kern_nf4 q = {.codes = b + r.codes, .map = (const float *)(b + r.map),
                      .absmax = r.nested ? NULL : (const float *)(b + r.absmax),
                      .qabsmax = b + r.qabsmax, .nested_absmax = (const float *)(b + r.nested_absmax),
                      .nested_map = (const float *)(b + r.nested_map), .offset = t->nf4_offset};
        m->dev->ops->dequant_nf4(m->dev, dst, &q, t->count);
        return dst;
    }
    m->dev->ops->widen16(m->dev, dst, narrow_at(m, t, off), t->count, t->dtype == ST_F16);
    return dst;
}

void model_layer_begin(model *m, int layer, bool backward)
{
    if (m->shard != NULL) /* ZeRO-3: gathered (and the next one prefetched) */
        model_shard_layer_begin(m, layer, backward);
}

void model_layer_end(model *m, int layer, bool backward)
{
    if (m->shard != NULL) /* released; in the backward its gradients reduce-scattered */
        model_shard_layer_end(m, layer, backward);
}

int model_safetensors_read(const model_layout *l, const st_file *f, const char *path,
                           const char *field, float *params, acc_err *err)
{
    memset(params, 0, l->nparams * sizeof *params); /* padding stays 0 */
    for (int i = 0; i < l->n; i++) {
        const model_tensor *mt = &l->t[i];
        st_tensor t;
        if (mt->adapter) /* not in a base model's file (model_lora.h) */
            continue;
        if (st_get(f, mt->name, &t, NULL) != 0)
            return acc_err_set(err, ACC_EINVAL, field, "%s has no tensor %s", path, mt->name);
        int same = t.dtype == ST_F32 && t.ndim == mt->ndim;
        for (int d = 0; same && d < t.ndim; d++)
            same = t.shape[d] == mt->shape[d];
        if (!same)
            return acc_err_set(err, ACC_EINVAL, field,
                               "%s: tensor %s has the wrong dtype or shape for this model", path,
                               mt->name);
        model_tensor_from_file(mt, t.data, params);
    }
    return 0;
}

int model_safetensors_write(const model_layout *l, const float *params, const char *path,
                            const st_meta *md, int nmd, acc_err *err)
{
    st_tensor *t = calloc((size_t)l->n, sizeof *t);
    float *file = malloc(l->nparams * sizeof *file); /* file-order copies */
    int rc = 0;
    if (t == NULL || file == NULL)
        rc = acc_err_set(err, ACC_ENOMEM, "", "out of host memory writing %s", path);
    int k = 0;
    for (int i = 0; rc == 0 && i < l->n; i++) {
        const model_tensor *mt = &l->t[i];
        float *dst = file + mt->offset;
        if (mt->adapter) /* the base model's file (adapters: model_lora_save) */
            continue;
        model_tensor_to_file(mt, params, dst);
        t[k] = (st_tensor){.name = mt->name, .dtype = ST_F32, .ndim = mt->ndim, .data = dst,
                           .nbytes = model_tensor_file_count(mt) * sizeof(float)};
        for (int d = 0; d < mt->ndim; d++)
            t[k].shape[d] = mt->shape[d];
        k++;
    }
    if (rc == 0)
        rc = st_write(path, t, k, md, nmd, err);
    free(file);
    free(t);
    return rc;
}
