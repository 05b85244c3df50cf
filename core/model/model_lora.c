/* model_lora: see model_lora.h. */
#include "model_lora.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "fsutil.h"
#include "rng.h"
#include "safetensors.h"

#define A_SUFFIX ".lora_A.weight"
#define PEFT_PREFIX "base_model.model."

/* The module name of a linear weight inside a block ("q_proj" of
 * "model.layers.0.self_attn.q_proj.weight") into out[n]; false when t is
 * not one (a norm, a bias, an embedding, the head). */
static bool linear_module(const model_tensor *t, char *out, size_t n)
{
    size_t len = strlen(t->name), w = strlen(".weight");
    if (t->adapter || t->layer < 0 || t->ndim != 2 || len <= w ||
        strcmp(t->name + len - w, ".weight") != 0)
        return false;
    size_t end = len - w, start = end;
    while (start > 0 && t->name[start - 1] != '.')
        start--;
    if (end - start >= n)
        return false;
    memcpy(out, t->name + start, end - start);
    out[end - start] = '\0';
    return true;
}

static bool targeted(const model_config *cfg, const model_tensor *t)
{
    char mod[MODEL_LORA_NAME_MAX];
    if (!linear_module(t, mod, sizeof mod))
        return false;
    for (int i = 0; i < cfg->lora.n_targets; i++)
        if (!strcmp(cfg->lora.targets[i], mod))
            return true;
    return false;
}

/* The distinct module names of l's block linear layers, in layout order. */
static int modules_of(const model_layout *l, char (*mods)[MODEL_LORA_NAME_MAX], int max)
{
    int n = 0;
    for (int i = 0; i < l->n; i++) {
        char m[MODEL_LORA_NAME_MAX];
        if (!linear_module(&l->t[i], m, sizeof m))
            continue;
        int seen = 0;
        for (int k = 0; k < n && !seen; k++)
            seen = !strcmp(mods[k], m);
        if (!seen && n < max)
            snprintf(mods[n++], MODEL_LORA_NAME_MAX, "%s", m);
    }
    return n;
}

static bool has_module(char (*mods)[MODEL_LORA_NAME_MAX], int n, const char *name)
{
    for (int k = 0; k < n; k++)
        if (!strcmp(mods[k], name))
            return true;
    return false;
}

int model_lora_apply(const spec_lora *sl, bool merge, model_config *cfg, acc_err *err)
{
    memset(&cfg->lora, 0, sizeof cfg->lora);
    if (sl->r == 0 && cfg->quant != MODEL_QUANT_NONE)
        return acc_err_set(err, ACC_EINVAL, "lora.r",
                           "lora.r: a 4-bit (NF4) base trains only through LoRA adapters "
                           "(QLoRA): set lora.r");
    if (sl->r == 0)
        return 0;
    model_layout l;
    int rc = model_layout_build(cfg, &l, err);
    if (rc != 0)
        return rc;
    char mods[MODEL_LORA_MAX_TARGETS][MODEL_LORA_NAME_MAX], list[512] = "";
    int nm = modules_of(&l, mods, MODEL_LORA_MAX_TARGETS);
    model_layout_free(&l);
    const model_family *family = model_family_of(cfg);
    const char *fam = family->name;
    const char *const *def = family->lora_default_targets;
    if (nm == 0)
        return acc_err_set(err, ACC_EINVAL, "lora", "the %s model has no linear layers to adapt",
                           fam);
    for (int k = 0; k < nm; k++) {
        size_t len = strlen(list);
        snprintf(list + len, sizeof list - len, "%s%s", k ? ", " : "", mods[k]);
    }
    model_lora_cfg *lc = &cfg->lora;
    if (sl->all_linear) {
        memcpy(lc->targets, mods, sizeof mods);
        lc->n_targets = nm;
    } else if (sl->n_targets == 0) { /* PEFT's default for the family */
        int n = 0;
        for (; def != NULL && def[n] != NULL && n < MODEL_LORA_MAX_TARGETS; n++)
            if (!has_module(mods, nm, def[n]))
                break;
        if (def == NULL || n == 0 || def[n] != NULL)
            return acc_err_set(err, ACC_EINVAL, "lora.target_modules",
                               "lora.target_modules is required for this model (its linear "
                               "layers: %s)", list);
        for (int i = 0; i < n; i++)
            snprintf(lc->targets[i], MODEL_LORA_NAME_MAX, "%s", def[i]);
        lc->n_targets = n;
    } else {
        for (int i = 0; i < sl->n_targets; i++) {
            char f[48];
            snprintf(f, sizeof f, "lora.target_modules[%d]", i);
            if (!has_module(mods, nm, sl->targets[i]))
                return acc_err_set(err, ACC_EINVAL, f,
                                   "%s: the %s model has no module '%s' (its linear layers: %s, "
                                   "or \"all-linear\")", f, fam, sl->targets[i], list);
            snprintf(lc->targets[i], MODEL_LORA_NAME_MAX, "%s", sl->targets[i]);
        }
        lc->n_targets = sl->n_targets;
    }
    lc->r = sl->r;
    lc->alpha = sl->alpha;
    lc->merge = merge;
    return 0;
}

/* PEFT's name of an adapter of `base` ("....weight"): "base_model.model."
 * + the module path + ".lora_A.weight" (ab "A") or ".lora_B.weight". */
static void peft_name(const char *base, const char *ab, char *out, size_t n)
{
    char mod[MODEL_NAME_MAX];
    size_t len = strlen(base), w = strlen(".weight");
    snprintf(mod, sizeof mod, "%s", base);
    if (len > w && len - w < sizeof mod)
        mod[len - w] = '\0';
    int k = snprintf(out, n, "%s%s.lora_%s.weight", PEFT_PREFIX, mod, ab);
    if (k < 0 || (size_t)k >= n) /* past MODEL_NAME_MAX: matches nothing */
        out[0] = '\0';
}

int model_lora_layout(const model_config *cfg, model_layout *l, acc_err *err)
{
    model_layout out = {0};
    int cap = 0, rc = 0;
    int64_t r = cfg->lora.r;
    for (int i = 0; rc == 0 && i < l->n; i++) {
        const model_tensor *t = &l->t[i];
        if (!targeted(cfg, t))
            continue;
        char n[MODEL_NAME_MAX];
        /* W [out, in] in the buffer; a Conv1D one is [in, out] in files */
        int64_t in = t->shape[t->transposed ? 0 : 1], out_ = t->shape[t->transposed ? 1 : 0];
        int64_t sa[2] = {r, in}, sb[2] = {out_, r};
        peft_name(t->name, "A", n, sizeof n);
        rc = model_layout_add(&out, &cap, n, t->layer, 2, sa, 0, true, true, false, "lora.r", err);
        if (rc == 0) {
            peft_name(t->name, "B", n, sizeof n);
            rc = model_layout_add(&out, &cap, n, t->layer, 2, sb, 0, true, true, false, "lora.r",
                                  err);
        }
    }
    uint64_t total;
    if (rc == 0 && acc_add_u64(out.nparams, l->nparams, &total))
        rc = acc_err_set(err, ACC_EINVAL, "lora.r", "the adapters overflow 64-bit sizes");
    for (int i = 0; rc == 0 && i < out.n; i++)
        out.t[i].adapter = true;
    size_t na = out.nparams;
    for (int i = 0; rc == 0 && i < l->n; i++) { /* the base, after them, frozen */
        model_tensor t = l->t[i];
        rc = model_layout_add(&out, &cap, t.name, t.layer, t.ndim, t.shape, t.count, t.decays,
                              false, t.transposed, "lora.r", err);
    }
    if (rc != 0) {
        model_layout_free(&out);
        return rc;
    }
    model_layout_free(l);
    *l = out;
    l->ntrain = na;
    return 0;
}

float model_lora_scale(const model_config *cfg)
{
    return cfg->lora.r > 0 ? (float)(cfg->lora.alpha / cfg->lora.r) : 0.0f;
}

void model_lora_find(const model *m, const char *base, size_t *a, size_t *b)
{
    char n[MODEL_NAME_MAX];
    *a = *b = SIZE_MAX;
    if (m->cfg.lora.r == 0)
        return;
    const model_tensor *t;
    peft_name(base, "A", n, sizeof n);
    if ((t = model_layout_find(&m->layout, n)) != NULL)
        *a = t->offset;
    peft_name(base, "B", n, sizeof n);
    if ((t = model_layout_find(&m->layout, n)) != NULL)
        *b = t->offset;
}

int model_lora_init(model *m, uint64_t seed, acc_err *err)
{
    const model_layout *l = &m->layout;
    if (m->cfg.lora.r == 0 || l->ntrain == 0)
        return 0;
    float *host = calloc(l->ntrain, sizeof *host);
    if (host == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory for the LoRA adapters");
    rng r;
    rng_seed(&r, seed, 0x10a7ULL);
    for (int i = 0; i < l->n; i++) {
        const model_tensor *t = &l->t[i];
        size_t len = strlen(t->name), sl = strlen(A_SUFFIX);
        if (!t->adapter || len < sl || strcmp(t->name + len - sl, A_SUFFIX) != 0)
            continue; /* B stays 0 */
        double bound = 1.0 / sqrt((double)t->shape[1]);
        for (size_t j = 0; j < t->count; j++)
            host[t->offset + j] = (float)((2.0 * rng_uniform(&r) - 1.0) * bound);
    }
    m->dev->ops->upload(m->dev, m->params, host, l->ntrain * sizeof *host);
    free(host);
    return 0;
}

void model_lora_merge_host(const model_layout *l, const model_config *cfg, float *params)
{
    float s = model_lora_scale(cfg);
    for (int i = 0; i + 1 < l->n; i++) {
        const model_tensor *ta = &l->t[i], *tb = &l->t[i + 1];
        size_t len = strlen(ta->name), sl = strlen(A_SUFFIX);
        if (!ta->adapter || len < sl || strcmp(ta->name + len - sl, A_SUFFIX) != 0)
            continue;
        char base[MODEL_NAME_MAX];
        size_t pl = strlen(PEFT_PREFIX);
        snprintf(base, sizeof base, "%.*s.weight", (int)(len - sl - pl), ta->name + pl);
        const model_tensor *w = model_layout_find(l, base);
        if (w == NULL)
            continue;
        int64_t R = ta->shape[0], in = ta->shape[1], out = tb->shape[0];
        const float *A = params + ta->offset, *B = params + tb->offset;
        float *W = params + w->offset;
        for (int64_t o = 0; o < out; o++)
            for (int64_t k = 0; k < R; k++) {
                float bk = s * B[o * R + k];
                for (int64_t c = 0; c < in; c++)
                    W[o * in + c] += bk * A[k * in + c];
            }
    }
}

static int write_adapter_config(const model_config *cfg, bool fan_in_fan_out, const char *dir,
                                const char *base_model, acc_err *err)
{
    json_t *tm = json_array();
    for (int i = 0; tm != NULL && i < cfg->lora.n_targets; i++)
        json_array_append_new(tm, json_string(cfg->lora.targets[i]));
    json_t *c = json_pack("{s:s, s:s, s:s, s:i, s:f, s:f, s:o, s:s, s:b, s:b, s:n, s:b}",
                          "peft_type", "LORA", "task_type", "CAUSAL_LM", "bias", "none",
                          "r", cfg->lora.r, "lora_alpha", cfg->lora.alpha, "lora_dropout", 0.0,
                          "target_modules", tm, "base_model_name_or_path",
                          base_model ? base_model : "", "fan_in_fan_out", fan_in_fan_out, "inference_mode", 1,
                          "modules_to_save", "use_rslora", 0);
    char *text = c ? json_dumps(c, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    json_decref(c);
    if (text == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory for adapter_config.json");
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    int rc = fsu_write_atomic(path, text, strlen(text), err);
    free(text);
    return rc;
}

int model_lora_save(const model_layout *l, const model_config *cfg, const float *params,
                    const char *dir, const char *base_model, acc_err *err)
{
    int n = 0;
    bool conv1d = false; /* PEFT's fan_in_fan_out: the targets are stored [in, out] */
    for (int i = 0; i < l->n; i++) {
        n += l->t[i].adapter;
        conv1d |= l->t[i].transposed && targeted(cfg, &l->t[i]);
    }
    st_tensor *t = calloc((size_t)n + 1, sizeof *t);
    if (t == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory for the adapter");
    int k = 0;
    for (int i = 0; i < l->n; i++) {
        const model_tensor *mt = &l->t[i];
        if (!mt->adapter)
            continue;
        t[k] = (st_tensor){.name = mt->name, .dtype = ST_F32, .ndim = 2, .data = params + mt->offset,
                           .nbytes = mt->count * sizeof(float)};
        t[k].shape[0] = mt->shape[0];
        t[k].shape[1] = mt->shape[1];
        k++;
    }
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    st_meta md[] = {{"format", "pt"}, {"producer", "accumd"}};
    int rc = st_write(path, t, k, md, 2, err);
    free(t);
    if (rc == 0)
        rc = write_adapter_config(cfg, conv1d, dir, base_model, err);
    return rc;
}
