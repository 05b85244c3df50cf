/* hf_dump: load a Hugging Face model directory into accumd on one CPU
 * device and dump what the reference (llama_ref.py) computes, for the
 * comparison driver (llama_check.py).
 *
 * Usage: hf_dump DIR BATCH OUT [--steps N] [--lr X] [--wd X] [--beta1 X]
 *                [--beta2 X] [--eps X] [--recompute] [--bf16] [--micro M]
 *                [--save DIR2 [--dtype float32|bfloat16|float16] [--shard BYTES]]
 *                [--threads N]
 *   BATCH: safetensors with I32 "tokens" and "targets" [B, T].
 *   OUT (safetensors, F32): "logits" [B, T, V], "loss" [1], "grad.NAME"
 *   (file shape) of the mean loss at the loaded weights, "param.NAME" (the
 *   loaded weights, file shape), "losses" [N] before each of N AdamW steps
 *   (weight decay on the tensors the layout marks), and the same names for
 *   a second run split into micro batches of M sequences (--micro: the
 *   gradients accumulate over B / M micro-steps; "losses" is from that run).
 *   --save writes the weights after the steps as a Hugging Face directory.
 *   --lora R,ALPHA,MOD[+MOD...]|all-linear: LoRA adapters (model_lora.h),
 *   seed 7; "param."/"grad." then hold the trainable (adapter) tensors only,
 *   "frozen_changed" [1] counts the frozen floats the steps changed, and
 *   "final_loss" [1] is the loss after the steps; --adapter DIR2 writes the
 *   PEFT adapter directory after the steps and the merged model as DIR2/merged;
 *   --set-adapter DIR3 starts from DIR3's adapter_model.safetensors instead.
 *   --quantize: model.quantize "nf4" (QLoRA's 4-bit base, double
 *   quantized at load). With a 4-bit base (this or a 4-bit DIR), "base.NAME"
 *   holds every frozen tensor as the device holds it (dequantized), and
 *   "store_changed" [1] counts the weight store's bytes the steps changed.
 * Exit 0, or 1 with the error on stderr.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsutil.h"
#include "kern_device.h"
#include "model.h"
#include "model_hf.h"
#include "model_llama.h"
#include "model_lora.h"
#include "safetensors.h"

typedef struct opts {
    const char *dir, *batch, *out, *save, *lora, *adapter, *set_adapter;
    int steps, recompute, bf16, micro, threads, quantize;
    double lr, wd, beta1, beta2, eps;
    uint64_t shard;
    st_dtype dtype;
} opts;

static int die(const char *what, const acc_err *e)
{
    fprintf(stderr, "hf_dump: %s: %s (field %s)\n", what, e->msg, e->field);
    return 1;
}

static int parse(int argc, char **argv, opts *o)
{
    if (argc < 4)
        return -1;
    *o = (opts){.dir = argv[1], .batch = argv[2], .out = argv[3], .lr = 1e-3, .beta1 = 0.9,
                .beta2 = 0.999, .eps = 1e-8, .dtype = ST_F32, .threads = 1};
    for (int i = 4; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--recompute"))
            o->recompute = 1;
        else if (!strcmp(a, "--bf16"))
            o->bf16 = 1;
        else if (!strcmp(a, "--quantize"))
            o->quantize = 1;
        else if (v == NULL)
            return -1;
        else if (!strcmp(a, "--steps"))
            o->steps = atoi(v), i++;
        else if (!strcmp(a, "--micro"))
            o->micro = atoi(v), i++;
        else if (!strcmp(a, "--threads"))
            o->threads = atoi(v), i++;
        else if (!strcmp(a, "--lr"))
            o->lr = atof(v), i++;
        else if (!strcmp(a, "--wd"))
            o->wd = atof(v), i++;
        else if (!strcmp(a, "--beta1"))
            o->beta1 = atof(v), i++;
        else if (!strcmp(a, "--beta2"))
            o->beta2 = atof(v), i++;
        else if (!strcmp(a, "--eps"))
            o->eps = atof(v), i++;
        else if (!strcmp(a, "--save"))
            o->save = v, i++;
        else if (!strcmp(a, "--lora"))
            o->lora = v, i++;
        else if (!strcmp(a, "--adapter"))
            o->adapter = v, i++;
        else if (!strcmp(a, "--set-adapter"))
            o->set_adapter = v, i++;
        else if (!strcmp(a, "--shard"))
            o->shard = strtoull(v, NULL, 10), i++;
        else if (!strcmp(a, "--dtype")) {
            if (hf_dtype_of(v, "--dtype", &o->dtype, NULL) != 0)
                return -1;
            i++;
        } else
            return -1;
    }
    return 0;
}

/* The model's state for the steps: AdamW moments, walked by layout. */
typedef struct adam {
    float *m, *v;
    int t;
} adam;

static void adam_step(model *m, adam *a, const opts *o)
{
    kern_device *d = m->dev;
    a->t++;
    for (int i = 0; i < m->layout.n; i++) {
        const model_tensor *t = &m->layout.t[i];
        if (!t->trains)
            continue;
        d->ops->adamw(d, m->params + t->offset, m->grads + t->offset, a->m + t->offset,
                      a->v + t->offset, t->count, (float)o->lr, (float)o->beta1, (float)o->beta2,
                      (float)o->eps, t->decays ? (float)o->wd : 0.0f, 1.0f, a->t);
    }
}

/* One step's forward + backward over B sequences in micro batches of mb:
 * the mean loss over all B*T tokens (weights 1 / (B*T)). */
static double step_grads(model *m, const int *tok, const int *tgt, float *w, int B, int T, int mb)
{
    model_zero_grad(m);
    double total = 0;
    for (int s = 0; s < B; s += mb) {
        double ls = 0;
        model_forward(m, tok + (size_t)s * T, tgt + (size_t)s * T, w, mb, 1, &ls);
        model_backward(m, mb);
        total += ls;
    }
    return total;
}

typedef struct outbuf {
    st_tensor *t;
    int n, cap;
    char **names;
} outbuf;

static int out_add(outbuf *b, const char *name, const float *data, int ndim, const int64_t *shape)
{
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 64;
        b->t = realloc(b->t, (size_t)b->cap * sizeof *b->t);
        b->names = realloc(b->names, (size_t)b->cap * sizeof *b->names);
        if (b->t == NULL || b->names == NULL)
            return -1;
    }
    size_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= (size_t)shape[d];
    float *copy = malloc(n * sizeof *copy + 1);
    b->names[b->n] = strdup(name);
    if (copy == NULL || b->names[b->n] == NULL)
        return -1;
    memcpy(copy, data, n * sizeof *copy);
    st_tensor *t = &b->t[b->n++];
    *t = (st_tensor){.name = b->names[b->n - 1], .dtype = ST_F32, .ndim = ndim, .data = copy,
                     .nbytes = n * sizeof(float)};
    memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    return 0;
}

/* Every layout tensor of the device buffer `src` as "prefix.NAME". */
static int out_tensors(outbuf *b, const model *m, const float *src, const char *prefix)
{
    float *host = calloc(m->nparams, sizeof *host), *file = malloc(m->nparams * sizeof *file);
    if (host == NULL || file == NULL)
        return -1;
    m->dev->ops->download(m->dev, host, src, m->ngrad * sizeof *host);
    int rc = 0;
    for (int i = 0; rc == 0 && i < m->layout.n; i++) {
        const model_tensor *t = &m->layout.t[i];
        char name[MODEL_NAME_MAX + 16];
        if (t->offset >= m->ngrad) /* frozen (LoRA): no gradient, and params are the base */
            continue;
        snprintf(name, sizeof name, "%s.%s", prefix, t->name);
        model_tensor_to_file(t, host, file);
        rc = out_add(b, name, file, t->ndim, t->shape);
    }
    free(host);
    free(file);
    return rc;
}

static void out_free(outbuf *b)
{
    for (int i = 0; i < b->n; i++) {
        free((void *)b->t[i].data);
        free(b->names[i]);
    }
    free(b->t);
    free(b->names);
}

static int read_batch(const char *path, int **tok, int **tgt, int *B, int *T, acc_err *err)
{
    st_file *f = NULL;
    int rc = st_open(path, &f, err);
    st_tensor a, b;
    if (rc == 0 && (st_get(f, "tokens", &a, err) != 0 || st_get(f, "targets", &b, err) != 0 ||
                    a.dtype != ST_I32 || a.ndim != 2 || b.nbytes != a.nbytes))
        rc = acc_err_set(err, ACC_EINVAL, "", "%s: want I32 tokens and targets [B, T]", path);
    if (rc == 0) {
        *B = (int)a.shape[0];
        *T = (int)a.shape[1];
        *tok = malloc(a.nbytes);
        *tgt = malloc(b.nbytes);
        memcpy(*tok, a.data, a.nbytes);
        memcpy(*tgt, b.data, b.nbytes);
    }
    st_close(f);
    return rc;
}

/* "R,ALPHA,MOD+MOD" or "R,ALPHA,all-linear" through the spec's meaning. */
static int lora_opts(const char *s, model_config *cfg, acc_err *err)
{
    spec_lora sl = {0};
    char mods[256];
    if (sscanf(s, "%d,%lf,%255s", &sl.r, &sl.alpha, mods) != 3)
        return acc_err_set(err, ACC_EINVAL, "lora", "--lora R,ALPHA,MODULES");
    if (!strcmp(mods, "all-linear"))
        sl.all_linear = true;
    for (char *t = sl.all_linear ? NULL : strtok(mods, "+"); t && sl.n_targets < SPEC_LORA_MAX_TARGETS;
         t = strtok(NULL, "+"))
        snprintf(sl.targets[sl.n_targets++], SPEC_LORA_NAME_MAX, "%s", t);
    return model_lora_apply(&sl, true, cfg, err);
}

/* The adapters of a PEFT adapter directory's safetensors, by name, into m. */
static int set_adapter(model *m, const char *dir, acc_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    st_file *f = NULL;
    int rc = st_open(path, &f, err);
    for (int i = 0; rc == 0 && i < m->layout.n; i++) {
        const model_tensor *t = &m->layout.t[i];
        st_tensor s;
        if (!t->adapter)
            continue;
        if (st_get(f, t->name, &s, err) != 0 || s.dtype != ST_F32 || s.nbytes != t->count * sizeof(float))
            rc = acc_err_set(err, ACC_EINVAL, "", "%s: no F32 %s of its shape", path, t->name);
        else
            m->dev->ops->upload(m->dev, m->params + t->offset, s.data, s.nbytes);
    }
    st_close(f);
    return rc;
}

/* The adapter directory, and the merged model as dir/merged. */
static int save_adapter(const model *m, float *host, const char *dir, const char *src, acc_err *err)
{
    char sub[4096];
    snprintf(sub, sizeof sub, "%s/merged", dir);
    int rc = fsu_mkdir_p(sub, 0750, err);
    if (rc == 0)
        rc = model_lora_save(&m->layout, &m->cfg, host, dir, src, err);
    model_lora_merge_host(&m->layout, &m->cfg, host);
    model_hf_save_opts so = {.dtype = ST_F32, .src_dir = src, .host_params = host};
    if (rc == 0)
        rc = model_hf_save(m, sub, &so, err);
    return rc;
}

int main(int argc, char **argv)
{
    opts o;
    if (parse(argc, argv, &o) != 0) {
        fprintf(stderr, "usage: hf_dump DIR BATCH OUT [options] (see the source)\n");
        return 2;
    }
    acc_err err = {0};
    int *tok = NULL, *tgt = NULL, B = 0, T = 0;
    if (read_batch(o.batch, &tok, &tgt, &B, &T, &err) != 0)
        return die("batch", &err);
    model_config cfg;
    if (model_hf_validate(o.dir, &cfg, &err) != 0)
        return die("validate", &err);
    if (o.quantize) {
        cfg.quant = MODEL_QUANT_NF4;
        cfg.quant_nested = true;
    }
    cfg.act_bf16 = o.bf16; /* bf16: the activations stored in bf16 too, as a bf16 job's */
    if (o.lora != NULL && lora_opts(o.lora, &cfg, &err) != 0)
        return die("lora", &err);
    kern_device_info info = {.kind = KERN_DEV_CPU, .mem_total = 8ull << 30};
    snprintf(info.name, sizeof info.name, "cpu0");
    kern_device *d;
    if (kern_device_open(&info, o.threads, &d, &err) != 0)
        return die("device", &err);
    if (o.bf16 && d->ops->set_precision(d, 1, &err) != 0)
        return die("bf16", &err);
    int mb = o.micro > 0 ? o.micro : B;
    model *m;
    if (model_create(d, &cfg, 0, T, &m, &err) != 0 || model_acts_alloc(m, mb, o.recompute, &err) != 0)
        return die("model", &err);
    if (model_hf_load_dir(m, o.dir, &err) != 0 || model_lora_init(m, 7, &err) != 0)
        return die("load", &err);
    if (o.set_adapter != NULL && set_adapter(m, o.set_adapter, &err) != 0)
        return die("set-adapter", &err);
    float *base = malloc(m->nparams * sizeof *base); /* the frozen weights, to compare */
    model_params_download(m, base);
    uint8_t *store0 = NULL; /* a 4-bit base: the store's bytes, to compare */
    if (cfg.quant && m->wstore != NULL && (store0 = malloc(m->wstore_bytes)) != NULL)
        d->ops->download(d, store0, m->wstore, m->wstore_bytes);

    size_t BT = (size_t)B * T;
    float *w = malloc(BT * sizeof *w);
    for (size_t i = 0; i < BT; i++)
        w[i] = 1.0f / (float)BT;
    outbuf ob = {0};
    int V = cfg.vocab_size, Vp = cfg.padded_vocab_size;
    if (out_tensors(&ob, m, m->params, "param") != 0)
        return 1;
    /* logits of the first micro batch's worth at a time, trimmed to V */
    float *lg = malloc((size_t)mb * T * Vp * sizeof *lg), *logits = malloc(BT * V * sizeof *logits);
    for (int s = 0; s < B && model_logits(m) != NULL; s += mb) {
        double ls;
        model_forward(m, tok + (size_t)s * T, tgt + (size_t)s * T, w, mb, 0, &ls);
        d->ops->download(d, lg, model_logits(m), (size_t)mb * T * Vp * sizeof *lg);
        for (size_t r = 0; r < (size_t)mb * T; r++)
            memcpy(logits + ((size_t)s * T + r) * V, lg + r * Vp, (size_t)V * sizeof *lg);
    }
    int64_t lshape[3] = {B, T, V}, one[1] = {1};
    out_add(&ob, "logits", logits, 3, lshape);
    float half_base = m->wstore != NULL; /* LoRA on a 16-bit directory: the base kept in it */
    out_add(&ob, "base16", &half_base, 1, one);
    for (int i = 0; cfg.quant && i < m->layout.n; i++) { /* the base as the device holds it */
        const model_tensor *t = &m->layout.t[i];
        char name[MODEL_NAME_MAX + 16];
        float *file = malloc(model_tensor_file_count(t) * sizeof *file);
        if (t->offset < m->ngrad || file == NULL) {
            free(file);
            continue;
        }
        snprintf(name, sizeof name, "base.%s", t->name);
        model_tensor_to_file(t, base, file);
        out_add(&ob, name, file, t->ndim, t->shape);
        free(file);
    }
    float loss = (float)step_grads(m, tok, tgt, w, B, T, mb);
    out_add(&ob, "loss", &loss, 1, one);
    if (out_tensors(&ob, m, m->grads, "grad") != 0)
        return 1;
    if (o.steps > 0) {
        adam a = {0};
        size_t bytes = m->nparams * sizeof(float);
        if (d->ops->alloc(d, bytes, (void **)&a.m, &err) != 0 ||
            d->ops->alloc(d, bytes, (void **)&a.v, &err) != 0)
            return die("adam", &err);
        d->ops->zero(d, a.m, bytes);
        d->ops->zero(d, a.v, bytes);
        float *losses = malloc((size_t)o.steps * sizeof *losses);
        for (int s = 0; s < o.steps; s++) {
            losses[s] = (float)step_grads(m, tok, tgt, w, B, T, mb);
            adam_step(m, &a, &o);
        }
        int64_t n[1] = {o.steps};
        out_add(&ob, "losses", losses, 1, n);
        if (cfg.lora.r > 0) {
            double fl = 0;
            model_forward(m, tok, tgt, w, mb, 0, &fl);
            for (int s = mb; s < B; s += mb) {
                double ls = 0;
                model_forward(m, tok + (size_t)s * T, tgt + (size_t)s * T, w, mb, 0, &ls);
                fl += ls;
            }
            float after = (float)fl, changed = 0;
            float *now = malloc(m->nparams * sizeof *now);
            model_params_download(m, now);
            for (size_t i = m->ngrad; i < m->nparams; i++)
                changed += memcmp(&now[i], &base[i], sizeof *now) != 0;
            out_add(&ob, "final_loss", &after, 1, one);
            out_add(&ob, "frozen_changed", &changed, 1, one);
            if (store0 != NULL) {
                uint8_t *store1 = malloc(m->wstore_bytes);
                float sc = 0;
                d->ops->download(d, store1, m->wstore, m->wstore_bytes);
                for (size_t i = 0; i < m->wstore_bytes; i++)
                    sc += store1[i] != store0[i];
                out_add(&ob, "store_changed", &sc, 1, one);
                free(store1);
            }
            if (o.adapter != NULL && save_adapter(m, now, o.adapter, o.dir, &err) != 0)
                return die("adapter", &err);
            free(now);
        }
        free(losses);
        d->ops->free(d, a.m);
        d->ops->free(d, a.v);
    }
    if (st_write(o.out, ob.t, ob.n, NULL, 0, &err) != 0)
        return die("write", &err);
    if (o.save != NULL) {
        model_hf_save_opts so = {.dtype = o.dtype, .max_shard_bytes = o.shard, .src_dir = o.dir};
        if (model_hf_save(m, o.save, &so, &err) != 0)
            return die("save", &err);
    }
    printf("hf_dump: %s: loss %.9g, %zu parameters\n", o.dir, loss, m->nparams);
    out_free(&ob);
    free(lg);
    free(logits);
    free(w);
    free(tok);
    free(tgt);
    free(base);
    free(store0);
    model_free(m);
    kern_device_close(d);
    return 0;
}
