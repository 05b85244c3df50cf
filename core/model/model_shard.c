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
    /* Each group's vector is two parts, each cut into the ranks' slices
     * on its own: part 2g the group's bf16 matrices (weights_bf16 blocks
     * only; empty otherwise), part 2g + 1 the rest, fp32. An empty first
     * part leaves everything as a single fp32 vector. */
    bool w16;            /* cfg.weights_bf16 */
    /* cfg.partition_bf16 (on the device only): the bf16 parts' slices of
     * the partition held in hpart (pn_h values), the fp32 parts' in
     * m->params (pn - pn_h floats); the fp32 values are `master`'s */
    bool p16;
    uint16_t *hpart;
    size_t pn_h;
    float *master;       /* [pn] host, the caller's (model_shard_set_master), or NULL */
    size_t *gn;          /* [2 ng] elements of each part */
    size_t *gpoff;       /* [2 ng] partition offset of the rank's slice of it */
    size_t *soff;        /* [2 ng] where that slice is stored: in hpart (p16's bf16
                          * parts), else in m->params; gpoff without p16 */
    int *tpart;          /* [layout.n] each tensor's part */
    size_t *tpos;        /* [layout.n] its position in the part's vector */
    size_t pn, slot_n;   /* slot_n: a gradient slot (a whole block, fp32) */
    size_t slot_f, slot_h; /* a parameter slot: fp32 part, bf16 part */
    size_t fetch_n;      /* the widened matrix's scratch (largest block matrix) */
    size_t pn0;          /* rank 0's partition, the largest: where the tail starts on every rank */
    float *pslot[2];     /* two blocks' parameters (the one in use, the prefetched) */
    uint16_t *hslot[2];  /* their bf16 parts (in the same allocation, past slot_f floats) */
    int holds[2];        /* the block each holds, -1: none */
    float *gslot;        /* one block's gradients: part 2g, then 2g + 1 */
    float *eslot, *egslot; /* the ends' parameters and gradients */
    float *fetch;        /* a bf16 matrix widened for its op (w16), or NULL */
    model_layout play;   /* the partition as a layout */
    float *snap;         /* the gathered parameters (host), or NULL */
    /* In host memory through `host`: with hparams (offload_param) m->params
     * and hgrads, with hgrad alone (the optimizer offloaded, not the
     * parameters) hgrads; either way the staging of one slice (slice_n
     * floats; a bf16 slice's 2-byte values too) and m->grads is then the
     * device tail alone */
    host_mem *host;
    bool hparams, hgrad;
    float *hgrads, *hstage;
    size_t slice_n;
    float *pinned[2];    /* registered with the device, in this order */
    int npinned;
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

/* Gathered in bf16: a block's 2-D tensor (its linear layers' matrices,
 * matmul operands only in every family) with weights_bf16. */
static bool half_tensor(const model_config *cfg, const model_tensor *t)
{
    return cfg->weights_bf16 && t->layer >= 0 && t->ndim == 2;
}

/* Each tensor's part and position (tpart, tpos may be NULL), the parts'
 * sizes (gn[2 (L + 1)], zeroed here) and the largest bf16 tensor (*fetch). */
static void parts_of(const model_config *cfg, const model_layout *l, size_t *gn, int *tpart, size_t *tpos,
                     size_t *fetch)
{
    int L = cfg->n_layer;
    memset(gn, 0, 2 * (size_t)(L + 1) * sizeof *gn);
    *fetch = 0;
    for (int i = 0; i < l->n; i++) { /* positions: layout order inside each part */
        const model_tensor *t = &l->t[i];
        bool half = half_tensor(cfg, t);
        int q = 2 * group_of(t, L) + (half ? 0 : 1);
        if (tpart != NULL)
            tpart[i] = q;
        if (tpos != NULL)
            tpos[i] = gn[q];
        gn[q] += t->count;
        if (half && t->count > *fetch)
            *fetch = t->count;
    }
}

/* The device partition's bf16 parts in bf16 (cfg.partition_bf16, which
 * needs weights_bf16's parts). */
static bool partition_half(const model_config *cfg)
{
    return cfg->weights_bf16 && cfg->partition_bf16;
}

static size_t own_of(size_t n, int rank, int world)
{
    return slice_lo(n, rank + 1, world) - slice_lo(n, rank, world);
}

static void sizes_of_parts(const size_t *gn, int L, size_t fetch, bool p16, int rank, int world,
                           model_shard_sizes *s)
{
    memset(s, 0, sizeof *s);
    for (int q = 0; q < 2 * (L + 1); q++) {
        size_t own = own_of(gn[q], rank, world);
        s->pn += own;
        if (p16 && q % 2 == 0) /* a bf16 part (only blocks have one) */
            s->pn_b16 += own;
        if (own > s->slice)
            s->slice = own;
    }
    for (int g = 0; g < L; g++) {
        size_t h = gn[2 * g], f = gn[2 * g + 1];
        s->slot = h + f > s->slot ? h + f : s->slot;
        s->slot_b16 = h > s->slot_b16 ? h : s->slot_b16;
        s->slot_f32 = f > s->slot_f32 ? f : s->slot_f32;
    }
    s->ends = gn[2 * L] + gn[2 * L + 1];
    s->fetch = fetch;
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
    size_t *gn = calloc(2 * ((size_t)L + 1), sizeof *gn), fetch;
    if (gn == NULL) {
        model_layout_free(&l);
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory for the ZeRO-3 partition");
    }
    parts_of(cfg, &l, gn, NULL, NULL, &fetch);
    sizes_of_parts(gn, L, fetch, partition_half(cfg), rank, world, out);
    free(gn);
    model_layout_free(&l);
    return 0;
}

uint64_t model_shard_pslot_bytes(const model_shard_sizes *s)
{
    /* at most the layout's nparams floats: no overflow */
    return (uint64_t)s->slot_f32 * sizeof(float) + (uint64_t)s->slot_b16 * sizeof(uint16_t);
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
    /* each term is at most the layout's nparams, whose 2 * 4 bytes fit;
     * their sums checked */
    uint64_t w = (uint64_t)(s.pn - s.pn_b16) + s.ends, g = (uint64_t)s0.pn + s.slot + s.ends;
    uint64_t slots = 2 * model_shard_pslot_bytes(&s) + (uint64_t)s.pn_b16 * sizeof(uint16_t);
    if (acc_add_u64(w, s.fetch, &w) || acc_mul_u64(w, sizeof(float), &w) || acc_add_u64(w, slots, weights) ||
        acc_add_u64(g, grad_tail, &g) || acc_mul_u64(g, sizeof(float), grads)) {
        *weights = *grads = ACC_SIZE_OVERFLOW;
        return acc_err_set(err, ACC_EINVAL, "model", "the model's state overflows 64-bit sizes");
    }
    return 0;
}

/* The partition layout: every tensor's piece inside the rank's slice of
 * its part, at its partition offset, part after part. */
static int build_play(model *m, model_shard *s, acc_err *err)
{
    const model_layout *l = &m->layout;
    int cap = 0;
    memset(&s->play, 0, sizeof s->play);
    for (int q = 0; q < 2 * s->ng; q++) {
        size_t lo = slice_lo(s->gn[q], s->rank, s->world), hi = slice_lo(s->gn[q], s->rank + 1, s->world);
        for (int i = 0; i < l->n; i++) {
            const model_tensor *t = &l->t[i];
            if (s->tpart[i] != q)
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
            p->offset = s->gpoff[q] + (a - lo);
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
    s->w16 = m->cfg.weights_bf16;
    s->p16 = partition_half(&m->cfg) && !s->hparams; /* offload_param: the host partition is the master */
    s->gn = calloc(2 * (size_t)s->ng, sizeof *s->gn);
    s->gpoff = calloc(2 * (size_t)s->ng, sizeof *s->gpoff);
    s->soff = calloc(2 * (size_t)s->ng, sizeof *s->soff);
    s->tpart = calloc((size_t)l->n + 1, sizeof *s->tpart);
    s->tpos = calloc((size_t)l->n + 1, sizeof *s->tpos);
    if (!s->gn || !s->gpoff || !s->soff || !s->tpart || !s->tpos)
        return acc_err_set(err, ACC_ENOMEM, "", "out of host memory for the ZeRO-3 partition");
    size_t fetch;
    parts_of(&m->cfg, l, s->gn, s->tpart, s->tpos, &fetch);
    size_t off = 0, hoff = 0, foff = 0;
    for (int q = 0; q < 2 * s->ng; q++) {
        size_t own = own_of(s->gn[q], s->rank, s->world);
        bool half = s->p16 && q % 2 == 0;
        s->gpoff[q] = off;
        s->soff[q] = half ? hoff : s->p16 ? foff : off;
        off += own;
        *(half ? &hoff : &foff) += own;
    }
    model_shard_sizes z;
    sizes_of_parts(s->gn, L, fetch, s->p16, s->rank, s->world, &z);
    s->pn = z.pn;
    s->pn_h = z.pn_b16;
    s->slot_n = z.slot;
    s->slot_f = z.slot_f32;
    s->slot_h = z.slot_b16;
    s->fetch_n = z.fetch;
    s->slice_n = z.slice;
    sizes_of_parts(s->gn, L, fetch, s->p16, 0, s->world, &z);
    s->pn0 = z.pn;
    return build_play(m, s, err);
}

/* Floats of group g (both parts): its gradient slot's extent. */
static size_t group_n(const model_shard *s, int g)
{
    return s->gn[2 * g] + s->gn[2 * g + 1];
}

/* Where tensor i sits in its group's fp32 vector (a gradient slot, the
 * ends' slots): the bf16 part first, then the fp32 part. */
static size_t group_pos(const model_shard *s, int i)
{
    int q = s->tpart[i];
    return (q & 1 ? s->gn[q - 1] : 0) + s->tpos[i];
}

/* ---- create / free */

static int alloc_bytes(model *m, size_t b, void **p, acc_err *err)
{
    int rc = m->dev->ops->alloc(m->dev, b, p, err);
    if (rc == 0)
        m->dev->ops->zero(m->dev, *p, b);
    return rc;
}

static int alloc_zeroed(model *m, size_t floats, float **p, acc_err *err)
{
    return alloc_bytes(m, floats * sizeof(float), (void **)p, err);
}

static int alloc_host(model_shard *s, size_t floats, float **p, acc_err *err)
{
    return host_mem_alloc(s->host, floats * sizeof(float), (void **)p, err);
}

/* pin_memory: the buffers that cross the bus, all or none: the
 * parameters (offload_param: uploaded for each gather) and the staging
 * (downloaded into for each reduce-scatter). */
static int pin_partition(model *m, model_shard *s, acc_err *err)
{
    const kern_ops *k = m->dev->ops;
    float *bufs[2] = {s->hparams ? m->params : s->hstage, s->hparams ? s->hstage : NULL};
    size_t n[2] = {s->hparams ? s->pn : s->slice_n, s->hparams ? s->slice_n : 0};
    if (k->host_register == NULL)
        return 0;
    for (int i = 0; i < 2; i++) {
        acc_err e = {0};
        if (n[i] == 0)
            break;
        int rc = k->host_register(m->dev, bufs[i], n[i] * sizeof(float), &e);
        if (rc != 0)
            return acc_err_set(err, rc,
                               s->hparams ? "zero_optimization.offload_param.pin_memory"
                                          : "zero_optimization.offload_optimizer.pin_memory",
                               "pin_memory: the device cannot page-lock the %s partition: %s",
                               s->hparams ? "parameter" : "gradient", e.msg);
        s->pinned[s->npinned++] = bufs[i];
    }
    return 0;
}

/* The partition's parameters on the device (the order model_shard_state_bytes
 * counts: params, grads) or with offload_param in host memory; its
 * gradients on the device, or with either host mode in host memory with
 * the staging, the device keeping the caller's tail; then the slots. */
static int alloc_partition(model *m, model_shard *s, acc_err *err)
{
    int rc = 0;
    if (!s->hparams) {
        rc = s->pn_h > 0 ? alloc_bytes(m, s->pn_h * sizeof(uint16_t), (void **)&s->hpart, err) : 0;
        if (rc == 0) /* the fp32 parts (all of it without p16) */
            rc = alloc_zeroed(m, s->pn - s->pn_h, &m->params, err);
    }
    if (!s->hgrad) {
        if (rc == 0)
            rc = alloc_zeroed(m, s->pn0 + m->grad_tail, &m->grads, err);
        if (rc == 0)
            m->gtail = m->grads + s->pn0;
        return rc;
    }
    if (rc == 0 && s->hparams)
        rc = alloc_host(s, s->pn, &m->params, err);
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
    m->shard_grads_only = false;
    return model_shard_create(m, c, rank, world, err);
}

int model_shard_create_host_grads(model *m, kern_comm *c, int rank, int world, host_mem *host, bool pin,
                                  acc_err *err)
{
    m->shard_host = host;
    m->shard_pin = pin;
    m->shard_grads_only = true;
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
    s->hgrad = s->host != NULL;
    s->hparams = s->hgrad && !m->shard_grads_only;
    int rc = build_plan(m, s, err);
    const kern_ops *k = m->dev->ops;
    if (rc == 0 && s->w16 && (k->narrow_bf16 == NULL || k->widen16 == NULL))
        rc = acc_err_set(err, ACC_EINVAL, "precision",
                         "bf16 working weights at ZeRO stage 3 need narrow_bf16 and widen16, which the %s "
                         "backend of %s lacks",
                         k->backend, m->dev->info.name);
    size_t ends = rc == 0 ? group_n(s, s->ng - 1) : 0;
    if (rc == 0)
        rc = alloc_partition(m, s, err);
    /* a parameter slot: its fp32 part, then its bf16 part (2-byte aligned) */
    size_t pbytes = s->slot_f * sizeof(float) + s->slot_h * sizeof(uint16_t);
    for (int j = 0; rc == 0 && j < 2; j++) {
        rc = alloc_bytes(m, pbytes, (void **)&s->pslot[j], err);
        if (rc == 0)
            s->hslot[j] = (uint16_t *)(s->pslot[j] + s->slot_f);
    }
    if (rc == 0)
        rc = alloc_zeroed(m, s->slot_n, &s->gslot, err);
    if (rc == 0)
        rc = alloc_zeroed(m, ends, &s->eslot, err);
    if (rc == 0)
        rc = alloc_zeroed(m, ends, &s->egslot, err);
    if (rc == 0 && s->fetch_n > 0)
        rc = alloc_zeroed(m, s->fetch_n, &s->fetch, err);
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
    void *bufs[] = {s->pslot[0], s->pslot[1], s->gslot, s->eslot, s->egslot, s->fetch, s->hpart};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i] != NULL)
            d->ops->free(d, bufs[i]);
    free(s->gn);
    free(s->gpoff);
    free(s->soff);
    free(s->tpart);
    free(s->tpos);
    free(s->play.t);
    free(s->snap);
    for (int i = s->npinned - 1; i >= 0; i--)
        d->ops->host_unregister(d, s->pinned[i]);
    if (s->hparams) { /* model_free leaves the host m->params to us */
        host_mem_free(s->host, m->params, s->pn * sizeof(float));
        m->params = NULL;
    }
    if (s->hgrad) {
        host_mem_free(s->host, s->hgrads, s->pn * sizeof(float));
        host_mem_free(s->host, s->hstage, s->slice_n * sizeof(float));
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

/* The tensor's slot for parameters (grad = false) or gradients; a bf16
 * matrix widened into the fetch scratch (the families use one block matrix
 * at a time: blocks.h's linear layers fetch their weight for one op). */
static float *slot_of(model *m, size_t off, bool grad)
{
    model_shard *s = m->shard;
    int i = tensor_at(m, off), q = s->tpart[i], g = q / 2;
    if (g == s->ng - 1)
        return (grad ? s->egslot : s->eslot) + group_pos(s, i);
    if (grad)
        return s->gslot + group_pos(s, i);
    for (int k = 0; k < 2; k++) {
        if (s->holds[k] != g)
            continue;
        if (q & 1)
            return s->pslot[k] + s->tpos[i];
        m->dev->ops->widen16(m->dev, s->fetch, s->hslot[k] + s->tpos[i], m->layout.t[i].count, 0);
        return s->fetch;
    }
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

/* Part q's vector into `slot` (whole): the rank's slice `src` (fp32, in
 * host memory or on the device) put at its place, then the all-gather. */
static int gather_f32(model *m, const float *src, bool on_host, int q, float *slot)
{
    model_shard *s = m->shard;
    size_t n = s->gn[q], lo = slice_lo(n, s->rank, s->world), hi = slice_lo(n, s->rank + 1, s->world);
    if (hi > lo && on_host)
        m->dev->ops->upload(m->dev, slot + lo, src, (hi - lo) * sizeof(float));
    else if (hi > lo)
        m->dev->ops->copy(m->dev, slot + lo, src, (hi - lo) * sizeof(float));
    return n > 0 ? kern_comm_allgather(s->comm, s->rank, slot, n) : 0;
}

/* kern_bf16_round's bits of src[0, n) into dst: the device's narrow_bf16 on the host. */
static void narrow_host(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float r = kern_bf16_round(src[i]);
        uint32_t u;
        memcpy(&u, &r, sizeof u);
        dst[i] = (uint16_t)(u >> 16);
    }
}

/* The same for a bf16 part into its 16-bit slot: the rank's slice of the
 * partition's fp32 values narrowed (rounded to nearest even) where they
 * live -- on the device, or on the host with offload_param, so that half
 * the bytes cross the bus -- or, with a bf16 partition, already bf16. */
static int gather_b16(model *m, int q, uint16_t *slot)
{
    model_shard *s = m->shard;
    size_t n = s->gn[q], lo = slice_lo(n, s->rank, s->world), hi = slice_lo(n, s->rank + 1, s->world);
    if (hi > lo && s->p16) {
        m->dev->ops->copy(m->dev, slot + lo, s->hpart + s->soff[q], (hi - lo) * sizeof *slot);
    } else if (hi > lo && s->hparams) {
        uint16_t *h = (uint16_t *)s->hstage; /* slice_n floats: room for the slice's halves */
        narrow_host(h, m->params + s->soff[q], hi - lo);
        m->dev->ops->upload(m->dev, slot + lo, h, (hi - lo) * sizeof *h);
    } else if (hi > lo) {
        m->dev->ops->narrow_bf16(m->dev, slot + lo, m->params + s->soff[q], hi - lo);
    }
    return n > 0 ? kern_comm_allgather16(s->comm, s->rank, slot, n) : 0;
}

/* Group g of the parameters into a parameter slot: its bf16 part into h,
 * its fp32 part into f. */
static int gather_group(model *m, int g, float *f, uint16_t *h)
{
    model_shard *s = m->shard;
    int q = 2 * g + 1, rc = s->gn[2 * g] > 0 ? gather_b16(m, 2 * g, h) : 0;
    return rc == 0 ? gather_f32(m, m->params + s->soff[q], s->hparams, q, f) : rc;
}

/* Group g's gradients in slot (part by part) summed over the ranks; the
 * rank's slice of each part added to its partition of the gradients. */
static int scatter_group(model *m, int g, float *slot)
{
    model_shard *s = m->shard;
    int rc = 0, started = 0;
    for (int q = 2 * g; q <= 2 * g + 1; q++) { /* one reduction: a start per part */
        size_t n = s->gn[q];
        if (n == 0)
            continue;
        kern_span sp = {0, n};
        float *b = slot + (q & 1 ? s->gn[2 * g] : 0);
        if (rc == 0)
            rc = kern_comm_scatter_start(s->comm, s->rank, b, &sp, 1, n);
        started = 1;
    }
    if (!started)
        return 0;
    int fin = kern_comm_reduce_finish(s->comm, s->rank);
    if (rc == 0)
        rc = fin;
    for (int q = 2 * g; rc == 0 && q <= 2 * g + 1; q++) {
        size_t n = s->gn[q], lo = slice_lo(n, s->rank, s->world), hi = slice_lo(n, s->rank + 1, s->world);
        const float *b = slot + (q & 1 ? s->gn[2 * g] : 0) + lo;
        if (hi > lo && s->hgrad) { /* down, then added in fp32 as the device adds */
            float *acc = s->hgrads + s->gpoff[q];
            m->dev->ops->download(m->dev, s->hstage, b, (hi - lo) * sizeof(float));
            for (size_t i = 0; i < hi - lo; i++)
                acc[i] = acc[i] + s->hstage[i];
        } else if (hi > lo) {
            float *acc = m->grads + s->gpoff[q];
            m->dev->ops->add(m->dev, acc, acc, b, hi - lo);
        }
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
    note_rc(s, gather_group(m, layer, s->pslot[k], s->hslot[k]));
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
        m->dev->ops->zero(m->dev, s->gslot, group_n(s, layer) * sizeof(float));
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
    note_rc(s, gather_group(m, e, s->eslot, NULL)); /* the ends: fp32 only */
    if (want_grad)
        m->dev->ops->zero(m->dev, s->egslot, group_n(s, e) * sizeof(float));
}

void model_shard_backward_done(model *m)
{
    model_shard *s = m->shard;
    note_rc(s, scatter_group(m, s->ng - 1, s->egslot));
}

/* ---- host copies */

/* For each piece of layout range [off, off + n) this rank holds: its part,
 * its partition offset, its index into the range, its length. */
typedef void (*piece_fn)(model *m, int q, size_t poff, size_t k0, size_t len, void *ctx);

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
        int q = s->tpart[i];
        size_t glo = slice_lo(s->gn[q], s->rank, s->world), ghi = slice_lo(s->gn[q], s->rank + 1, s->world);
        size_t pa = s->tpos[i] + (a - t->offset), pb = s->tpos[i] + (b - t->offset);
        size_t ca = pa > glo ? pa : glo, cb = pb < ghi ? pb : ghi;
        if (ca < cb)
            fn(m, q, s->gpoff[q] + (ca - glo), a - off + (ca - pa), cb - ca, ctx);
    }
}

typedef struct copy_ctx {
    const float *host;
    float *part;
} copy_ctx;

/* A piece of a partition-ordered fp32 vector (the moments' scatter), in
 * host memory where the gradient partition is (model_shard_scatter_host). */
static void scatter_piece(model *m, int q, size_t poff, size_t k0, size_t len, void *ctx)
{
    (void)q;
    copy_ctx *c = ctx;
    if (m->shard->hgrad)
        memcpy(c->part + poff, c->host + k0, len * sizeof(float));
    else
        m->dev->ops->upload(m->dev, c->part + poff, c->host + k0, len * sizeof(float));
}

/* Host fp32 values src[0, n) into the stored parameters of part q from
 * partition offset poff (inside the rank's slice of q): a bf16 partition's
 * bf16 part narrowed -- on the host into `stage` (n values) so that 2
 * bytes a value cross the bus, or without one on the device through the
 * gradient slot (free between passes; a slice of a block's part fits) --
 * the rest as they are. */
static void store_piece(model *m, int q, size_t poff, const float *src, size_t n, uint16_t *stage)
{
    model_shard *s = m->shard;
    const kern_ops *k = m->dev->ops;
    size_t at = s->soff[q] + (poff - s->gpoff[q]);
    if (s->p16 && q % 2 == 0 && stage != NULL) {
        narrow_host(stage, src, n);
        k->upload(m->dev, s->hpart + at, stage, n * sizeof *stage);
    } else if (s->p16 && q % 2 == 0) {
        k->upload(m->dev, s->gslot, src, n * sizeof *src);
        k->narrow_bf16(m->dev, s->hpart + at, s->gslot, n);
    } else if (s->hparams) { /* offload_param: the partition is in host memory */
        memcpy(m->params + at, src, n * sizeof *src);
    } else {
        k->upload(m->dev, m->params + at, src, n * sizeof *src);
    }
}

/* A piece of the parameters: the fp32 values into the master (where the
 * caller keeps one), then into the store. */
static void upload_piece(model *m, int q, size_t poff, size_t k0, size_t len, void *ctx)
{
    copy_ctx *c = ctx;
    if (m->shard->master != NULL)
        memcpy(m->shard->master + poff, c->host + k0, len * sizeof(float));
    store_piece(m, q, poff, c->host + k0, len, NULL);
}

void model_shard_copy(model *m, float *down, const float *up, size_t off, size_t n)
{
    model_shard *s = m->shard;
    if (up != NULL) {
        copy_ctx c = {up, NULL};
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
    each_piece(m, 0, m->nparams, scatter_piece, &c);
}

void model_shard_set_master(model *m, float *master)
{
    m->shard->master = master;
}

bool model_shard_bf16_partition(const model *m)
{
    return m->shard != NULL && m->shard->p16;
}

void model_shard_store_range(model *m, const float *src, size_t lo, size_t hi, uint16_t *stage)
{
    model_shard *s = m->shard;
    for (int q = 0; q < 2 * s->ng; q++) { /* the parts' slices meeting [lo, hi) */
        size_t a = s->gpoff[q], b = a + own_of(s->gn[q], s->rank, s->world);
        a = a > lo ? a : lo;
        b = b < hi ? b : hi;
        if (a < b)
            store_piece(m, q, a, src + (a - lo), b - a, stage != NULL ? stage + (a - lo) : NULL);
    }
}

/* model_shard_gather_host from a partition-ordered vector in host memory
 * (on_host) or on the device. */
static int gather_host_from(model *m, const float *part, bool on_host, float *host)
{
    model_shard *s = m->shard;
    const model_layout *l = &m->layout;
    int L = s->ng - 1, rc = 0;
    /* in fp32 (the master's bits, the moments) through buffers free between
     * passes: a parameter slot, or with bf16 ones the gradient slot (a
     * whole block's floats), and the ends' slot: the next forward gathers
     * the ends again */
    for (int g = 0; rc == 0 && g <= L; g++) {
        float *slot = g == L ? s->eslot : s->w16 ? s->gslot : s->pslot[0];
        rc = gather_f32(m, part + s->gpoff[2 * g], on_host, 2 * g, slot);
        if (rc == 0)
            rc = gather_f32(m, part + s->gpoff[2 * g + 1], on_host, 2 * g + 1, slot + s->gn[2 * g]);
        for (int i = 0; rc == 0 && host != NULL && i < l->n; i++)
            if (s->tpart[i] / 2 == g)
                m->dev->ops->download(m->dev, host + l->t[i].offset, slot + group_pos(s, i),
                                      l->t[i].count * sizeof(float));
    }
    s->holds[0] = s->holds[1] = -1;
    note_rc(s, rc);
    return rc;
}

int model_shard_gather_host(model *m, const float *part, float *host)
{
    return gather_host_from(m, part, m->shard->hgrad, host);
}

int model_shard_snapshot(model *m, bool keep)
{
    model_shard *s = m->shard;
    model_shard_release(m);
    float *h = keep ? malloc(m->nparams * sizeof *h) : NULL;
    int rc = keep && h == NULL ? ACC_ENOMEM : 0;
    /* every rank gathers even when one lacks host memory: the calls must
     * match; a bf16 partition's fp32 values are the master's (every rank
     * has one, or none: the caller's bug, refused on every rank alike) */
    int grc = !s->p16 ? gather_host_from(m, m->params, s->hparams, h)
              : s->master != NULL ? gather_host_from(m, s->master, true, h)
                                  : ACC_EINTERNAL;
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

bool model_shard_params_on_host(const model *m)
{
    return m->shard != NULL && m->shard->hparams;
}

bool model_shard_grads_on_host(const model *m)
{
    return m->shard != NULL && m->shard->hgrad;
}

float *model_shard_host_grads(model *m)
{
    return model_shard_grads_on_host(m) ? m->shard->hgrads : NULL;
}

void model_shard_zero_host_grads(model *m)
{
    if (model_shard_grads_on_host(m))
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
