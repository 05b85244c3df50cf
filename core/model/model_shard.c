/* model_shard: see model_shard.h. */
#include "model_shard.h"

#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "host_mem.h"
#include "kern_span.h"

struct model_shard {
    kern_comm *comm;
    int rank, world;
    int ng;              /* groups: the L blocks, then the ends */
    size_t *gn;          /* [ng] floats of each group's vector */
    size_t *gpoff;       /* [ng] partition offset of the rank's slice of it */
    int *tgroup;         /* [layout.n] each tensor's group */
    size_t *tpos;        /* [layout.n] its position in the group's vector */
    size_t pn, slot_n;
    size_t pn0;          /* rank 0's partition, the largest: where the tail starts on every rank */
    float *pslot[2];     /* two blocks' parameters (the one in use, the prefetched) */
    int holds[2];        /* the block each holds, -1: none */
    float *gslot;        /* one block's gradients */
    float *eslot, *egslot; /* the ends' parameters and gradients */
    model_layout play;   /* the partition as a layout */
    float *snap;         /* the gathered parameters (host), or NULL */
    /* offload_param: m->params and hgrads (pn each) and the staging of one
     * slice (slice_n) in host memory through `host`; m->grads is then the
     * device tail alone */
    host_mem *host;
    float *hgrads, *hstage;
    size_t slice_n;
    int npinned;         /* of m->params, hstage: registered with the device, in that order */
    uint64_t gathers;
    int rc;
};

/* ---- the plan (pure, from a layout) */

static int group_of(const model_tensor *t, int L)
{
    return t->layer < 0 ? L : t->layer;
}

static size_t slice_lo(size_t n, int rank, int world)
{
    return kern_shard_lo(n, rank, world);
}

/* Floats of each group (gn[L + 1]) of layout l. */
static void group_sizes(const model_layout *l, int L, size_t *gn)
{
    memset(gn, 0, (size_t)(L + 1) * sizeof *gn);
    for (int i = 0; i < l->n; i++)
        gn[group_of(&l->t[i], L)] += l->t[i].count;
}

static void sizes_of_groups(const size_t *gn, int L, int rank, int world, model_shard_sizes *s)
{
    memset(s, 0, sizeof *s);
    for (int g = 0; g <= L; g++) {
        size_t own = slice_lo(gn[g], rank + 1, world) - slice_lo(gn[g], rank, world);
        s->pn += own;
        if (own > s->slice)
            s->slice = own;
        if (g < L && gn[g] > s->slot)
            s->slot = gn[g];
    }
    s->ends = gn[L];
}

int model_shard_sizes_of(const model_config *cfg, int rank, int world, model_shard_sizes *out,
                         acc_err *err)
{
    model_layout l;
    memset(out, 0, sizeof *out);
    int rc = model_layout_build(cfg, &l, err);
    if (rc != 0)
        return rc;
    int L = cfg->n_layer;
    size_t *gn = calloc((size_t)L + 1, sizeof *gn);
    if (gn == NULL) {
        model_layout_free(&l);
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory for the ZeRO-3 partition");
    }
    group_sizes(&l, L, gn);
    sizes_of_groups(gn, L, rank, world, out);
    free(gn);
    model_layout_free(&l);
    return 0;
}

int model_shard_state_bytes(const model_config *cfg, size_t grad_tail, int rank, int world,
                            uint64_t *weights, uint64_t *grads, acc_err *err)
{
    model_shard_sizes s;
    *weights = *grads = ACC_SIZE_OVERFLOW;
    int rc = model_shard_sizes_of(cfg, rank, world, &s, err);
    if (rc != 0)
        return rc;
    model_shard_sizes s0;
    if ((rc = model_shard_sizes_of(cfg, 0, world, &s0, err)) != 0)
        return rc;
    /* each term is at most the layout's nparams, whose 2 * 4 bytes fit */
    uint64_t w = (uint64_t)s.pn + 2 * (uint64_t)s.slot + s.ends;
    uint64_t g = (uint64_t)s0.pn + s.slot + s.ends;
    if (acc_mul_u64(w, sizeof(float), weights) || acc_add_u64(g, grad_tail, &g) ||
        acc_mul_u64(g, sizeof(float), grads))
        return acc_err_set(err, ACC_EINVAL, "model", "the model's state overflows 64-bit sizes");
    return 0;
}

/* The partition layout: every tensor's part inside the rank's slice of
 * its group, at its partition offset, group after group. */
static int build_play(model *m, model_shard *s, acc_err *err)
{
    const model_layout *l = &m->layout;
    int L = s->ng - 1, cap = 0;
    memset(&s->play, 0, sizeof s->play);
    for (int g = 0; g <= L; g++) {
        size_t lo = slice_lo(s->gn[g], s->rank, s->world), hi = slice_lo(s->gn[g], s->rank + 1, s->world);
        for (int i = 0; i < l->n; i++) {
            const model_tensor *t = &l->t[i];
            if (s->tgroup[i] != g)
                continue;
            size_t a = s->tpos[i] > lo ? s->tpos[i] : lo;
            size_t b = s->tpos[i] + t->count < hi ? s->tpos[i] + t->count : hi;
            if (a >= b)
                continue;
            if (s->play.n == cap) {
                int nc = cap ? 2 * cap : 32;
                model_tensor *p = realloc(s->play.t, (size_t)nc * sizeof *p);
                if (p == NULL)
                    return acc_err_set(err, ACC_ENOMEM, "", "out of host memory for the ZeRO-3 partition");
                s->play.t = p;
                cap = nc;
            }
            model_tensor *p = &s->play.t[s->play.n++];
            *p = *t;
            p->offset = s->gpoff[g] + (a - lo);
            p->count = b - a;
        }
    }
    s->play.nparams = s->play.ntrain = s->pn;
    return 0;
}

static int build_plan(model *m, model_shard *s, acc_err *err)
{
    const model_layout *l = &m->layout;
    int L = m->cfg.n_layer;
    s->ng = L + 1;
    s->gn = calloc((size_t)s->ng, sizeof *s->gn);
    s->gpoff = calloc((size_t)s->ng, sizeof *s->gpoff);
    s->tgroup = calloc((size_t)l->n + 1, sizeof *s->tgroup);
    s->tpos = calloc((size_t)l->n + 1, sizeof *s->tpos);
    if (!s->gn || !s->gpoff || !s->tgroup || !s->tpos)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory for the ZeRO-3 partition");
    for (int i = 0; i < l->n; i++) { /* positions: layout order inside each group */
        int g = group_of(&l->t[i], L);
        s->tgroup[i] = g;
        s->tpos[i] = s->gn[g];
        s->gn[g] += l->t[i].count;
    }
    size_t off = 0;
    for (int g = 0; g <= L; g++) {
        s->gpoff[g] = off;
        off += slice_lo(s->gn[g], s->rank + 1, s->world) - slice_lo(s->gn[g], s->rank, s->world);
    }
    model_shard_sizes z;
    sizes_of_groups(s->gn, L, s->rank, s->world, &z);
    s->pn = z.pn;
    s->slot_n = z.slot;
    s->slice_n = z.slice;
    sizes_of_groups(s->gn, L, 0, s->world, &z);
    s->pn0 = z.pn;
    return build_play(m, s, err);
}

/* ---- create / free */

static int alloc_zeroed(model *m, size_t floats, float **p, acc_err *err)
{
    size_t b = floats * sizeof(float);
    int rc = m->dev->ops->alloc(m->dev, b, (void **)p, err);
    if (rc == 0)
        m->dev->ops->zero(m->dev, *p, b);
    return rc;
}

static int alloc_host(model_shard *s, size_t floats, float **p, acc_err *err)
{
    return host_mem_alloc(s->host, floats * sizeof(float), (void **)p, err);
}

/* offload_param.pin_memory: the parameters (uploaded for each gather) and
 * the staging (downloaded into for each reduce-scatter), both or neither. */
static int pin_partition(model *m, model_shard *s, acc_err *err)
{
    const kern_ops *k = m->dev->ops;
    float *bufs[2] = {m->params, s->hstage};
    size_t n[2] = {s->pn, s->slice_n};
    if (k->host_register == NULL)
        return 0;
    for (int i = 0; i < 2; i++) {
        acc_err e = {0};
        if (n[i] == 0)
            break;
        int rc = k->host_register(m->dev, bufs[i], n[i] * sizeof(float), &e);
        if (rc != 0)
            return acc_err_set(err, rc, "zero_optimization.offload_param.pin_memory",
                               "pin_memory: the device cannot page-lock the parameter partition: %s", e.msg);
        s->npinned = i + 1;
    }
    return 0;
}

/* offload_param: the partition's parameters, gradients and the staging
 * in host memory; the device keeps the caller's tail, then the slots. */
static int alloc_partition(model *m, model_shard *s, acc_err *err)
{
    if (s->host == NULL) { /* the order model_shard_state_bytes counts: params, grads */
        int rc = alloc_zeroed(m, s->pn, &m->params, err);
        if (rc == 0)
            rc = alloc_zeroed(m, s->pn0 + m->grad_tail, &m->grads, err);
        if (rc == 0)
            m->gtail = m->grads + s->pn0;
        return rc;
    }
    int rc = alloc_host(s, s->pn, &m->params, err);
    if (rc == 0)
        rc = alloc_host(s, s->pn, &s->hgrads, err);
    if (rc == 0)
        rc = alloc_host(s, s->slice_n, &s->hstage, err);
    if (rc == 0 && m->shard_pin)
        rc = pin_partition(m, s, err);
    if (rc == 0)
        rc = alloc_zeroed(m, m->grad_tail, &m->grads, err);
    if (rc == 0)
        m->gtail = m->grads;
    return rc;
}

int model_shard_create_host(model *m, kern_comm *c, int rank, int world, host_mem *host, bool pin, acc_err *err)
{
    m->shard_host = host;
    m->shard_pin = pin;
    return model_shard_create(m, c, rank, world, err);
}

int model_shard_create(model *m, kern_comm *c, int rank, int world, acc_err *err)
{
    if (m->cfg.lora.r > 0 || m->layout.ntrain != m->layout.nparams)
        return acc_err_set(err, ACC_EINVAL, "zero_optimization.stage",
                           "ZeRO stage 3 with LoRA is not supported yet");
    model_shard *s = calloc(1, sizeof *s);
    if (s == NULL)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory");
    m->shard = s;
    s->comm = c;
    s->rank = rank;
    s->world = world;
    s->holds[0] = s->holds[1] = -1;
    s->host = m->shard_host;
    int rc = build_plan(m, s, err);
    size_t ends = s->gn[s->ng - 1];
    if (rc == 0)
        rc = alloc_partition(m, s, err);
    if (rc == 0)
        rc = alloc_zeroed(m, s->slot_n, &s->pslot[0], err);
    if (rc == 0)
        rc = alloc_zeroed(m, s->slot_n, &s->pslot[1], err);
    if (rc == 0)
        rc = alloc_zeroed(m, s->slot_n, &s->gslot, err);
    if (rc == 0)
        rc = alloc_zeroed(m, ends, &s->eslot, err);
    if (rc == 0)
        rc = alloc_zeroed(m, ends, &s->egslot, err);
    if (rc != 0)
        return rc; /* model_free frees what was made */
    m->nf32 = m->nparams;
    m->nheld = s->pn;
    return 0;
}

void model_shard_free(model *m)
{
    model_shard *s = m->shard;
    if (s == NULL)
        return;
    kern_device *d = m->dev;
    float *bufs[] = {s->pslot[0], s->pslot[1], s->gslot, s->eslot, s->egslot};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i] != NULL)
            d->ops->free(d, bufs[i]);
    free(s->gn);
    free(s->gpoff);
    free(s->tgroup);
    free(s->tpos);
    free(s->play.t);
    free(s->snap);
    float *pinned[2] = {m->params, s->hstage};
    for (int i = s->npinned - 1; i >= 0; i--)
        d->ops->host_unregister(d, pinned[i]);
    if (s->host != NULL) { /* m->params too: model_free leaves it to us */
        host_mem_free(s->host, m->params, s->pn * sizeof(float));
        host_mem_free(s->host, s->hgrads, s->pn * sizeof(float));
        host_mem_free(s->host, s->hstage, s->slice_n * sizeof(float));
        m->params = NULL;
    }
    free(s);
    m->shard = NULL;
}

/* ---- tensors */

/* Index of the tensor starting at layout offset off (a family's weight). */
static int tensor_at(const model *m, size_t off)
{
    const model_layout *l = &m->layout;
    int lo = 0, hi = l->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (l->t[mid].offset == off)
            return mid;
        if (l->t[mid].offset < off)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    abort(); /* not a tensor's start: a family bug */
}

/* The tensor's slot for parameters (grad = false) or gradients. */
static float *slot_of(model *m, size_t off, bool grad)
{
    model_shard *s = m->shard;
    int i = tensor_at(m, off), g = s->tgroup[i];
    if (g == s->ng - 1)
        return (grad ? s->egslot : s->eslot) + s->tpos[i];
    if (grad)
        return s->gslot + s->tpos[i];
    for (int k = 0; k < 2; k++)
        if (s->holds[k] == g)
            return s->pslot[k] + s->tpos[i];
    abort(); /* a block's weight outside its begin / end: a family bug */
}

const float *model_shard_weight(model *m, size_t off)
{
    return slot_of(m, off, false);
}

float *model_shard_grad(model *m, size_t off)
{
    return slot_of(m, off, true);
}

/* ---- collectives */

static void note_rc(model_shard *s, int rc)
{
    if (rc != 0 && s->rc == 0)
        s->rc = rc;
}

/* Group g's vector of the partition-ordered `part` into slot (whole). */
static int gather_group(model *m, const float *part, int g, float *slot)
{
    model_shard *s = m->shard;
    size_t n = s->gn[g], lo = slice_lo(n, s->rank, s->world), hi = slice_lo(n, s->rank + 1, s->world);
    if (hi > lo && s->host != NULL) /* offload_param: partitions are host vectors */
        m->dev->ops->upload(m->dev, slot + lo, part + s->gpoff[g], (hi - lo) * sizeof(float));
    else if (hi > lo)
        m->dev->ops->copy(m->dev, slot + lo, part + s->gpoff[g], (hi - lo) * sizeof(float));
    return n > 0 ? kern_comm_allgather(s->comm, s->rank, slot, n) : 0;
}

/* Group g's gradients in slot summed over the ranks; the rank's slice
 * added to its partition of the gradients. */
static int scatter_group(model *m, int g, float *slot)
{
    model_shard *s = m->shard;
    size_t n = s->gn[g], lo = slice_lo(n, s->rank, s->world), hi = slice_lo(n, s->rank + 1, s->world);
    if (n == 0)
        return 0;
    kern_span sp = {0, n};
    int rc = kern_comm_scatter_start(s->comm, s->rank, slot, &sp, 1, n);
    int fin = kern_comm_reduce_finish(s->comm, s->rank);
    if (rc == 0)
        rc = fin;
    if (rc == 0 && hi > lo && s->host != NULL) { /* down, then added in fp32 as the device adds */
        float *acc = s->hgrads + s->gpoff[g];
        m->dev->ops->download(m->dev, s->hstage, slot + lo, (hi - lo) * sizeof(float));
        for (size_t i = 0; i < hi - lo; i++)
            acc[i] = acc[i] + s->hstage[i];
    } else if (rc == 0 && hi > lo) {
        float *acc = m->grads + s->gpoff[g];
        m->dev->ops->add(m->dev, acc, acc, slot + lo, hi - lo);
    }
    return rc;
}

/* Block `layer` into a parameter slot unless one holds it; k: the slot
 * to use otherwise. */
static void ensure_block(model *m, int layer, int k)
{
    model_shard *s = m->shard;
    if (layer < 0 || layer >= s->ng - 1 || s->holds[0] == layer || s->holds[1] == layer)
        return;
    note_rc(s, gather_group(m, m->params, layer, s->pslot[k]));
    s->holds[k] = layer;
    s->gathers++;
}

void model_shard_layer_begin(model *m, int layer, bool backward)
{
    model_shard *s = m->shard;
    int here = s->holds[1] == layer ? 1 : 0;
    ensure_block(m, layer, here);
    /* the next block of this pass into the other slot: a prefetch */
    ensure_block(m, backward ? layer - 1 : layer + 1, 1 - here);
    if (backward)
        m->dev->ops->zero(m->dev, s->gslot, s->gn[layer] * sizeof(float));
}

void model_shard_layer_end(model *m, int layer, bool backward)
{
    model_shard *s = m->shard;
    if (backward)
        note_rc(s, scatter_group(m, layer, s->gslot));
    for (int k = 0; k < 2; k++) /* released: gathered again when next used */
        if (s->holds[k] == layer)
            s->holds[k] = -1;
}

void model_shard_pass_begin(model *m, bool want_grad)
{
    model_shard *s = m->shard;
    int e = s->ng - 1;
    note_rc(s, gather_group(m, m->params, e, s->eslot));
    if (want_grad)
        m->dev->ops->zero(m->dev, s->egslot, s->gn[e] * sizeof(float));
}

void model_shard_backward_done(model *m)
{
    model_shard *s = m->shard;
    note_rc(s, scatter_group(m, s->ng - 1, s->egslot));
}

/* ---- host copies */

/* For each piece of layout range [off, off + n) this rank holds: its
 * partition offset, its index into the range, its length. */
typedef void (*piece_fn)(model *m, size_t poff, size_t k0, size_t len, void *ctx);

static void each_piece(model *m, size_t off, size_t n, piece_fn fn, void *ctx)
{
    model_shard *s = m->shard;
    const model_layout *l = &m->layout;
    for (int i = 0; i < l->n; i++) {
        const model_tensor *t = &l->t[i];
        size_t a = off > t->offset ? off : t->offset;
        size_t b = off + n < t->offset + t->count ? off + n : t->offset + t->count;
        if (a >= b)
            continue;
        int g = s->tgroup[i];
        size_t glo = slice_lo(s->gn[g], s->rank, s->world), ghi = slice_lo(s->gn[g], s->rank + 1, s->world);
        size_t pa = s->tpos[i] + (a - t->offset), pb = s->tpos[i] + (b - t->offset);
        size_t ca = pa > glo ? pa : glo, cb = pb < ghi ? pb : ghi;
        if (ca < cb)
            fn(m, s->gpoff[g] + (ca - glo), a - off + (ca - pa), cb - ca, ctx);
    }
}

typedef struct copy_ctx {
    const float *host;
    float *part;
} copy_ctx;

static void upload_piece(model *m, size_t poff, size_t k0, size_t len, void *ctx)
{
    copy_ctx *c = ctx;
    if (m->shard->host != NULL) /* offload_param: the partition is in host memory */
        memcpy(c->part + poff, c->host + k0, len * sizeof(float));
    else
        m->dev->ops->upload(m->dev, c->part + poff, c->host + k0, len * sizeof(float));
}

void model_shard_copy(model *m, float *down, const float *up, size_t off, size_t n)
{
    model_shard *s = m->shard;
    if (up != NULL) {
        copy_ctx c = {up, m->params};
        each_piece(m, off, n, upload_piece, &c);
        return;
    }
    if (s->snap != NULL)
        memcpy(down, s->snap + off, n * sizeof *down);
    else
        memset(down, 0, n * sizeof *down);
}

void model_shard_scatter_host(model *m, const float *host, float *part)
{
    copy_ctx c = {host, part};
    each_piece(m, 0, m->nparams, upload_piece, &c);
}

int model_shard_gather_host(model *m, const float *part, float *host)
{
    model_shard *s = m->shard;
    const model_layout *l = &m->layout;
    int L = s->ng - 1, rc = 0;
    /* through the parameter slots, free between passes (blocks) and the
     * ends' slot: the next forward gathers the ends again */
    for (int g = 0; rc == 0 && g <= L; g++) {
        float *slot = g == L ? s->eslot : s->pslot[0];
        rc = gather_group(m, part, g, slot);
        for (int i = 0; rc == 0 && host != NULL && i < l->n; i++)
            if (s->tgroup[i] == g)
                m->dev->ops->download(m->dev, host + l->t[i].offset, slot + s->tpos[i],
                                      l->t[i].count * sizeof(float));
    }
    s->holds[0] = s->holds[1] = -1;
    note_rc(s, rc);
    return rc;
}

int model_shard_snapshot(model *m, bool keep)
{
    model_shard *s = m->shard;
    model_shard_release(m);
    float *h = keep ? malloc(m->nparams * sizeof *h) : NULL;
    int rc = keep && h == NULL ? ACC_ENOMEM : 0;
    /* every rank gathers even when one lacks host memory: the calls must match */
    int grc = model_shard_gather_host(m, m->params, h);
    if (rc == 0)
        rc = grc;
    if (rc != 0) {
        free(h);
        return rc;
    }
    s->snap = h;
    return 0;
}

void model_shard_release(model *m)
{
    if (m->shard != NULL) {
        free(m->shard->snap);
        m->shard->snap = NULL;
    }
}

const model_layout *model_shard_layout(const model *m)
{
    return &m->shard->play;
}

uint64_t model_shard_gathers(const model *m)
{
    return m->shard != NULL ? m->shard->gathers : 0;
}

int model_shard_error(const model *m)
{
    return m->shard != NULL ? m->shard->rc : 0;
}

bool model_shard_on_host(const model *m)
{
    return m->shard != NULL && m->shard->host != NULL;
}

float *model_shard_host_grads(model *m)
{
    return model_shard_on_host(m) ? m->shard->hgrads : NULL;
}

void model_shard_zero_host_grads(model *m)
{
    if (model_shard_on_host(m))
        memset(m->shard->hgrads, 0, m->shard->pn * sizeof(float));
}

/* The CPU kernel's sum (kern_cpu.c cpu_sumsq): 64 fixed chunks of double
 * sums, added in order; independent of threads, so the same bits. */
double model_shard_host_sumsq(const model *m, size_t lo, size_t hi)
{
    enum { CHUNKS = 64 };
    const float *x = m->shard->hgrads + lo;
    size_t n = hi - lo;
    double total = 0.0;
    for (size_t k = 0; k < CHUNKS; k++) {
        size_t a = n * k / CHUNKS, b = n * (k + 1) / CHUNKS;
        double part = 0.0;
        for (size_t i = a; i < b; i++)
            part += (double)x[i] * x[i];
        total += part;
    }
    return total;
}

float *model_shard_device_scratch(model *m, size_t *n)
{
    *n = m->shard->slot_n;
    return m->shard->gslot;
}
