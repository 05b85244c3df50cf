/* tok_bpe: the BPE model: vocabulary and merge maps, and the merge of one
 * word.
 *
 * The merge follows Hugging Face's definition exactly: the word starts as
 * its characters (vocabulary ids; characters missing from the vocabulary
 * become "<0xXX>" byte tokens with byte_fallback, else the unknown token,
 * consecutive ones fused with fuse_unk); then, repeatedly, the adjacent pair
 * with the lowest merge rank (leftmost on ties) is merged. A binary heap of
 * candidate pairs keeps that O(n log n) per word; an entry whose pair no
 * longer exists is dropped when it surfaces. Merged words are cached per
 * encoder (the same words recur), so no state is shared between threads.
 */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

#define CACHE_MAX_WORD 256          /* longer words are not cached */
#define CACHE_SLOTS (1u << 15)

uint64_t tok_hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

/* ---- string -> id */
int tok_strmap_init(tok_strmap *m, size_t n)
{
    size_t cap = pow2_at_least(n * 2 + 1);
    m->slot = malloc(cap * sizeof *m->slot);
    if (m->slot == NULL)
        return ACC_ENOMEM;
    memset(m->slot, 0xff, cap * sizeof *m->slot);
    m->mask = cap - 1;
    return 0;
}

void tok_strmap_put(tok_strmap *m, const tok_tokenizer *t, int32_t id)
{
    size_t i = tok_hash(t->tok[id], t->tok_len[id]) & m->mask;
    while (m->slot[i] >= 0) {
        int32_t o = m->slot[i];
        if (t->tok_len[o] == t->tok_len[id] && memcmp(t->tok[o], t->tok[id], t->tok_len[id]) == 0) {
            m->slot[i] = id; /* a later duplicate wins, as in a JSON object */
            return;
        }
        i = (i + 1) & m->mask;
    }
    m->slot[i] = id;
}

int32_t tok_strmap_get(const tok_strmap *m, const tok_tokenizer *t, const char *s, size_t n)
{
    size_t i = tok_hash(s, n) & m->mask;
    for (;;) {
        int32_t o = m->slot[i];
        if (o < 0)
            return -1;
        if (t->tok_len[o] == n && memcmp(t->tok[o], s, n) == 0)
            return o;
        i = (i + 1) & m->mask;
    }
}

void tok_strmap_free(tok_strmap *m)
{
    free(m->slot);
    m->slot = NULL;
}

/* ---- (a, b) -> (rank, merged) */
static uint64_t pair_key(int32_t a, int32_t b)
{
    return (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
}

static size_t pair_slot(uint64_t k, size_t mask)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (size_t)k & mask;
}

int tok_pairmap_init(tok_pairmap *m, size_t n)
{
    size_t cap = pow2_at_least(n * 2 + 1);
    m->slot = calloc(cap, sizeof *m->slot);
    m->mask = cap - 1;
    m->n = 0;
    return m->slot == NULL ? ACC_ENOMEM : 0;
}

void tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, uint32_t rank, int32_t merged)
{
    uint64_t k = pair_key(a, b);
    size_t i = pair_slot(k, m->mask);
    while (m->slot[i].key != 0 && m->slot[i].key != k)
        i = (i + 1) & m->mask;
    if (m->slot[i].key == 0)
        m->n++;
    /* a later duplicate overwrites, as Hugging Face's map does */
    m->slot[i] = (tok_pair_slot){k, rank, merged};
}

int tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b, uint32_t *rank, int32_t *merged)
{
    uint64_t k = pair_key(a, b);
    size_t i = pair_slot(k, m->mask);
    for (const tok_pair_slot *s; (s = &m->slot[i])->key != 0; i = (i + 1) & m->mask)
        if (s->key == k) {
            *rank = s->rank;
            *merged = s->merged;
            return 1;
        }
    return 0;
}

void tok_pairmap_free(tok_pairmap *m)
{
    free(m->slot);
    m->slot = NULL;
}

/* ---- the merge heap: lowest rank first, then lowest position */
typedef struct tok_heap_item {
    uint32_t rank;
    int32_t pos, merged;
} tok_heap_item;

static bool heap_less(const tok_heap_item *a, const tok_heap_item *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(tok_heap_item *h, size_t *n, tok_heap_item it)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&it, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = it;
}

static tok_heap_item heap_pop(tok_heap_item *h, size_t *n)
{
    tok_heap_item top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && heap_less(&h[c + 1], &h[c]))
            c++;
        if (!heap_less(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0)
        h[i] = last;
    return top;
}

static int grow_work(tok_encoder *e, size_t n)
{
    if (n <= e->sym_cap)
        return 0;
    size_t cap = pow2_at_least(n);
    int32_t *id = realloc(e->sym_id, cap * sizeof *id);
    if (id == NULL)
        return ACC_ENOMEM;
    e->sym_id = id;
    int32_t *pv = realloc(e->sym_prev, cap * sizeof *pv);
    if (pv == NULL)
        return ACC_ENOMEM;
    e->sym_prev = pv;
    int32_t *nx = realloc(e->sym_next, cap * sizeof *nx);
    if (nx == NULL)
        return ACC_ENOMEM;
    e->sym_next = nx;
    /* each merge pushes at most two candidates: 3n bounds the heap */
    tok_heap_item *h = realloc(e->heap, 3 * cap * sizeof *h);
    if (h == NULL)
        return ACC_ENOMEM;
    e->heap = h;
    e->heap_cap = 3 * cap;
    e->sym_cap = cap;
    return 0;
}

/* The word's initial symbols, Hugging Face's merge_word: characters, byte
 * fallback, unknown tokens. Returns the count, or -1 out of memory. */
static long initial_symbols(tok_encoder *e, const char *w, size_t n)
{
    const tok_tokenizer *t = e->t;
    if (grow_work(e, 4 * n + 4) != 0) /* byte fallback: up to 4 symbols a char */
        return -1;
    long ns = 0;
    int32_t unk = -1; /* pending unknown token (fuse_unk) */
    char tmp[CACHE_MAX_WORD + 64];
    for (size_t i = 0; i < n;) {
        size_t cl = tok_utf8_len((const unsigned char *)w, i, n), end = i + cl;
        const char *s = w + i;
        size_t sl = cl;
        bool decorated = (t->cont_prefix_len && i > 0) || (t->eow_suffix_len && end == n);
        if (decorated) {
            size_t k = 0;
            if (t->cont_prefix_len && i > 0) {
                memcpy(tmp, t->cont_prefix, t->cont_prefix_len);
                k = t->cont_prefix_len;
            }
            memcpy(tmp + k, s, cl);
            k += cl;
            if (t->eow_suffix_len && end == n) {
                memcpy(tmp + k, t->eow_suffix, t->eow_suffix_len);
                k += t->eow_suffix_len;
            }
            s = tmp;
            sl = k;
        }
        uint32_t cp;
        size_t adv;
        int32_t id = !decorated && t->char_id != NULL &&
                             (cp = tok_utf8_decode((const unsigned char *)s, sl, &adv)) < TOK_CHAR_IDS
                         ? t->char_id[cp]
                         : tok_strmap_get(&t->vocab, t, s, sl);
        if (id >= 0) {
            if (unk >= 0) {
                e->sym_id[ns++] = unk;
                unk = -1;
            }
            e->sym_id[ns++] = id;
        } else {
            bool done = false;
            if (t->byte_fallback) {
                bool all = true;
                for (size_t k = 0; k < sl; k++)
                    all = all && t->byte_id[(unsigned char)s[k]] >= 0;
                if (all) { /* (a pending unknown is not flushed first: as Hugging Face) */
                    for (size_t k = 0; k < sl; k++)
                        e->sym_id[ns++] = t->byte_id[(unsigned char)s[k]];
                    done = true;
                }
            }
            if (!done && t->unk_id >= 0) {
                if (unk >= 0 && !t->fuse_unk)
                    e->sym_id[ns++] = unk;
                unk = t->unk_id;
            }
        }
        i = end;
    }
    if (unk >= 0)
        e->sym_id[ns++] = unk;
    return ns;
}

static int merge_symbols(tok_encoder *e, long ns)
{
    const tok_tokenizer *t = e->t;
    int32_t *id = e->sym_id, *prev = e->sym_prev, *next = e->sym_next;
    size_t hn = 0;
    for (long i = 0; i < ns; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < ns ? (int32_t)i + 1 : -1;
    }
    for (long i = 0; i + 1 < ns; i++) {
        uint32_t r;
        int32_t m;
        if (tok_pairmap_get(&t->merges, id[i], id[i + 1], &r, &m))
            heap_push(e->heap, &hn, (tok_heap_item){r, (int32_t)i, m});
    }
    while (hn > 0) {
        tok_heap_item top = heap_pop(e->heap, &hn);
        int32_t p = top.pos;
        if (id[p] < 0 || next[p] < 0)
            continue; /* merged away, or now last */
        int32_t q = next[p];
        uint32_t r;
        int32_t m;
        if (!tok_pairmap_get(&t->merges, id[p], id[q], &r, &m) || m != top.merged)
            continue; /* stale: the pair changed since it was queued */
        id[p] = m;
        id[q] = -1;
        next[p] = next[q];
        if (next[q] >= 0)
            prev[next[q]] = p;
        int32_t mm;
        if (prev[p] >= 0 && tok_pairmap_get(&t->merges, id[prev[p]], id[p], &r, &mm) &&
            hn < e->heap_cap)
            heap_push(e->heap, &hn, (tok_heap_item){r, prev[p], mm});
        if (next[p] >= 0 && tok_pairmap_get(&t->merges, id[p], id[next[p]], &r, &mm) &&
            hn < e->heap_cap)
            heap_push(e->heap, &hn, (tok_heap_item){r, p, mm});
    }
    return 0;
}

/* ---- the per-encoder word cache */
static int cache_init(tok_encoder *e)
{
    e->cache_mask = CACHE_SLOTS - 1;
    e->cache_hash = calloc(CACHE_SLOTS, sizeof *e->cache_hash);
    e->cache_off = malloc(CACHE_SLOTS * sizeof *e->cache_off);
    e->cache_n = malloc(CACHE_SLOTS * sizeof *e->cache_n);
    e->cache_key_off = malloc(CACHE_SLOTS * sizeof *e->cache_key_off);
    e->cache_key_len = malloc(CACHE_SLOTS * sizeof *e->cache_key_len);
    if (!e->cache_hash || !e->cache_off || !e->cache_n || !e->cache_key_off || !e->cache_key_len)
        return ACC_ENOMEM;
    return 0;
}

static void cache_clear(tok_encoder *e)
{
    memset(e->cache_hash, 0, CACHE_SLOTS * sizeof *e->cache_hash);
    e->cache_used = 0;
    e->cache_keys.n = 0;
    e->cache_ids.n = 0;
}

/* slot of word w: found (1) or the empty slot to fill (0) */
static int cache_find(tok_encoder *e, const char *w, size_t n, uint64_t h, size_t *slot)
{
    size_t i = h & e->cache_mask;
    while (e->cache_hash[i] != 0) {
        if (e->cache_hash[i] == h && e->cache_key_len[i] == n &&
            memcmp(e->cache_keys.s + e->cache_key_off[i], w, n) == 0) {
            *slot = i;
            return 1;
        }
        i = (i + 1) & e->cache_mask;
    }
    *slot = i;
    return 0;
}

int tok_bpe_word(tok_encoder *e, const char *w, size_t n, tok_ids *out)
{
    const tok_tokenizer *t = e->t;
    if (n == 0)
        return 0;
    bool cacheable = n <= CACHE_MAX_WORD;
    uint64_t h = 0;
    size_t slot = 0;
    if (cacheable) {
        if (e->cache_hash == NULL && cache_init(e) != 0)
            return ACC_ENOMEM;
        h = tok_hash(w, n) | 1;
        if (cache_find(e, w, n, h, &slot)) {
            for (uint32_t k = 0; k < e->cache_n[slot]; k++)
                if (tok_ids_push(out, e->cache_ids.v[e->cache_off[slot] + k]) != 0)
                    return ACC_ENOMEM;
            return 0;
        }
    }
    size_t first = out->n;
    int32_t whole = t->ignore_merges ? tok_strmap_get(&t->vocab, t, w, n) : -1;
    if (whole >= 0) { /* ignore_merges: a word in the vocabulary is its token */
        if (tok_ids_push(out, whole) != 0)
            return ACC_ENOMEM;
    } else {
        long ns = initial_symbols(e, w, n);
        if (ns < 0)
            return ACC_ENOMEM;
        merge_symbols(e, ns);
        for (long i = 0; i < ns; i++)
            if (e->sym_id[i] >= 0 && tok_ids_push(out, e->sym_id[i]) != 0)
                return ACC_ENOMEM;
    }
    if (cacheable) {
        if (e->cache_used * 2 >= CACHE_SLOTS) {
            cache_clear(e);
            cache_find(e, w, n, h, &slot);
        }
        size_t cnt = out->n - first;
        e->cache_key_off[slot] = (uint32_t)e->cache_keys.n;
        e->cache_key_len[slot] = (uint32_t)n;
        e->cache_off[slot] = (uint32_t)e->cache_ids.n;
        e->cache_n[slot] = (uint32_t)cnt;
        if (tok_buf_put(&e->cache_keys, w, n) != 0)
            return ACC_ENOMEM;
        for (size_t k = 0; k < cnt; k++)
            if (tok_ids_push(&e->cache_ids, out->v[first + k]) != 0)
                return ACC_ENOMEM;
        e->cache_hash[slot] = h;
        e->cache_used++;
    }
    return 0;
}

void tok_bpe_encoder_free(tok_encoder *e)
{
    free(e->sym_id);
    free(e->sym_prev);
    free(e->sym_next);
    free(e->heap);
    free(e->cache_hash);
    free(e->cache_off);
    free(e->cache_n);
    free(e->cache_key_off);
    free(e->cache_key_len);
    tok_buf_free(&e->cache_keys);
    tok_ids_free(&e->cache_ids);
}
