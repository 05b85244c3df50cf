/* tok_text: the text side of the tokenizer: UTF-8, GPT-2's byte-level
 * mapping, normalizers (Unicode forms through libunistring) and
 * pre-tokenizers (regexes through PCRE2, in UTF mode with Unicode
 * properties, as Hugging Face's Oniguruma patterns expect).
 */
#include <stdlib.h>
#include <string.h>
#include <unicase.h>
#include <uninorm.h>

#include "memfind.h"
#include "tok_internal.h"

/* ---- buffers */
int tok_buf_put(tok_buf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *ns = realloc(b->s, cap);
        if (ns == NULL)
            return ACC_ENOMEM;
        b->s = ns;
        b->cap = cap;
    }
    if (n)
        memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
    return 0;
}

void tok_buf_free(tok_buf *b)
{
    free(b->s);
    memset(b, 0, sizeof *b);
}

int tok_pieces_add(tok_pieces *l, const char *s, size_t n, bool at_start)
{
    if (n == 0)
        return 0;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        tok_piece *p = realloc(l->p, cap * sizeof *p);
        if (p == NULL)
            return ACC_ENOMEM;
        l->p = p;
        l->cap = cap;
    }
    l->p[l->n++] = (tok_piece){l->buf.n, n, at_start};
    return tok_buf_put(&l->buf, s, n);
}

void tok_pieces_free(tok_pieces *l)
{
    tok_buf_free(&l->buf);
    free(l->p);
    memset(l, 0, sizeof *l);
}

/* ---- UTF-8 */
size_t tok_utf8_len(const unsigned char *s, size_t i, size_t n)
{
    unsigned c = s[i];
    size_t l = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    return i + l <= n ? l : 1;
}

uint32_t tok_utf8_decode(const unsigned char *s, size_t n, size_t *adv)
{
    size_t l = tok_utf8_len(s, 0, n);
    *adv = l;
    switch (l) {
    case 1: return s[0];
    case 2: return (uint32_t)(s[0] & 0x1f) << 6 | (s[1] & 0x3f);
    case 3: return (uint32_t)(s[0] & 0x0f) << 12 | (uint32_t)(s[1] & 0x3f) << 6 | (s[2] & 0x3f);
    default:
        return (uint32_t)(s[0] & 0x07) << 18 | (uint32_t)(s[1] & 0x3f) << 12 |
               (uint32_t)(s[2] & 0x3f) << 6 | (s[3] & 0x3f);
    }
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 with *bad = the
 * length of the maximal invalid prefix (Unicode's "maximal subpart"). */
static size_t utf8_valid_at(const unsigned char *s, size_t n, size_t *bad)
{
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    size_t need;
    unsigned lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf)
        need = 1;
    else if (c >= 0xe0 && c <= 0xef) {
        need = 2;
        if (c == 0xe0)
            lo = 0xa0;
        if (c == 0xed)
            hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 3;
        if (c == 0xf0)
            lo = 0x90;
        if (c == 0xf4)
            hi = 0x8f;
    } else {
        *bad = 1;
        return 0;
    }
    for (size_t k = 1; k <= need; k++) {
        unsigned b = k < n ? s[k] : 0x100;
        unsigned l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xbf;
        if (b < l || b > h) {
            *bad = k;
            return 0;
        }
    }
    return need + 1;
}

size_t tok_utf8_invalid(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t bad, l = utf8_valid_at(s + i, n - i, &bad);
        if (l == 0)
            return i;
        i += l;
    }
    return n;
}

int tok_utf8_lossy(tok_buf *out, const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t bad, l = utf8_valid_at(s + i, n - i, &bad);
        if (l > 0) {
            if (tok_buf_put(out, (const char *)s + i, l) != 0)
                return ACC_ENOMEM;
            i += l;
        } else {
            if (tok_buf_put(out, "\xef\xbf\xbd", 3) != 0)
                return ACC_ENOMEM;
            i += bad;
        }
    }
    return 0;
}

/* ---- GPT-2 byte-level mapping: printable bytes stand for themselves,
 * the other 68 bytes map to U+0100.. in byte order */
static bool byte_printable(unsigned b)
{
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
}

static uint32_t byte_cp(unsigned b)
{
    if (byte_printable(b))
        return b;
    uint32_t k = 0;
    for (unsigned x = 0; x < b; x++)
        k += !byte_printable(x);
    return 256 + k;
}

void tok_byte_table_init(tok_byte_table *tb)
{
    for (int i = 0; i < 324; i++)
        tb->back[i] = -1;
    for (unsigned b = 0; b < 256; b++) {
        uint32_t cp = byte_cp(b);
        if (cp < 0x80) {
            tb->s[b][0] = (char)cp;
            tb->len[b] = 1;
        } else {
            tb->s[b][0] = (char)(0xc0 | (cp >> 6));
            tb->s[b][1] = (char)(0x80 | (cp & 0x3f));
            tb->len[b] = 2;
        }
        tb->back[cp] = (int16_t)b;
    }
}

/* ---- normalizers */
/* s with every pat replaced by rep, into dst. With an encoder `e` (a
 * normalizer) the result stays within its output bound. */
static int replace_all(tok_encoder *e, tok_buf *dst, const char *s, size_t n, const char *pat, size_t plen,
                       const char *rep, size_t rlen)
{
    dst->n = 0;
    if (tok_buf_put(dst, "", 0) != 0)
        return ACC_ENOMEM;
    size_t i = 0;
    while (i < n) {
        int64_t found = memfind(s, n, i, pat, plen);
        if (found < 0)
            break;
        size_t at = (size_t)found;
        if (e != NULL && (tok_over_output(e, dst->n + (at - i) + rlen) != 0 || tok_over_time(e) != 0))
            return ACC_EINVAL;
        if (tok_buf_put(dst, s + i, at - i) != 0 || tok_buf_put(dst, rep, rlen) != 0)
            return ACC_ENOMEM;
        i = at + plen;
    }
    if (e != NULL && tok_over_output(e, dst->n + (n - i)) != 0)
        return ACC_EINVAL;
    return tok_buf_put(dst, s + i, n - i);
}

static int regex_replace_all(tok_encoder *e, tok_buf *dst, const char *s, size_t n,
                             const pcre2_code *re, const char *rep, size_t rlen)
{
    dst->n = 0;
    if (tok_buf_put(dst, "", 0) != 0)
        return ACC_ENOMEM;
    size_t i = 0, last = 0;
    while (i <= n) {
        int rc = tok_match(e, re, s, n, i, "normalizer");
        if (rc < 0)
            return rc;
        if (rc == 0)
            break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        if (tok_over_output(e, dst->n + (ov[0] - last) + rlen) != 0 || tok_over_time(e) != 0)
            return ACC_EINVAL;
        if (tok_buf_put(dst, s + last, ov[0] - last) != 0 || tok_buf_put(dst, rep, rlen) != 0)
            return ACC_ENOMEM;
        last = ov[1];
        i = ov[1] > ov[0] ? ov[1] : ov[1] + (ov[1] < n ? tok_utf8_len((const unsigned char *)s, ov[1], n) : 1);
    }
    if (tok_over_output(e, dst->n + (n - last)) != 0)
        return ACC_EINVAL;
    return tok_buf_put(dst, s + last, n - last);
}

static bool is_space_at(const char *s, size_t n, size_t i, size_t *l)
{
    size_t adv;
    uint32_t c = tok_utf8_decode((const unsigned char *)s + i, n - i, &adv);
    *l = adv;
    return c == ' ' || (c >= 9 && c <= 13) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
           c == 0x205f || c == 0x3000;
}

static int unicode_form(tok_buf *s, tok_buf *tmp, int kind)
{
    uninorm_t nf = kind == TN_NFC ? UNINORM_NFC : kind == TN_NFD ? UNINORM_NFD
                 : kind == TN_NFKC ? UNINORM_NFKC : UNINORM_NFKD;
    size_t len = 0;
    uint8_t *r = kind == TN_LOWERCASE
                     ? u8_tolower((const uint8_t *)s->s, s->n, NULL, NULL, NULL, &len)
                     : u8_normalize(nf, (const uint8_t *)s->s, s->n, NULL, &len);
    if (r == NULL)
        return ACC_ENOMEM;
    tmp->n = 0;
    int rc = tok_buf_put(tmp, (const char *)r, len);
    free(r);
    if (rc != 0)
        return rc;
    tok_buf t = *s;
    *s = *tmp;
    *tmp = t;
    return 0;
}

int tok_normalize(tok_encoder *e, const tok_norm *nm, tok_buf *s)
{
    int rc = 0;
    tok_buf t;
    switch (nm->kind) {
    case TN_NFC: case TN_NFD: case TN_NFKC: case TN_NFKD: case TN_LOWERCASE:
        if ((rc = tok_over_time(e)) != 0 || (rc = s->n ? unicode_form(s, &e->tmp, nm->kind) : 0) != 0)
            return rc;
        return tok_over_output(e, s->n);
    case TN_PREPEND:
        if (s->n == 0)
            return 0;
        if (tok_over_output(e, s->n + nm->alen) != 0)
            return ACC_EINVAL;
        e->tmp.n = 0;
        if (tok_buf_put(&e->tmp, nm->a, nm->alen) != 0 || tok_buf_put(&e->tmp, s->s, s->n) != 0)
            return ACC_ENOMEM;
        break;
    case TN_REPLACE:
        rc = nm->re ? regex_replace_all(e, &e->tmp, s->s, s->n, nm->re, nm->b, nm->blen)
                    : replace_all(e, &e->tmp, s->s, s->n, nm->a, nm->alen, nm->b, nm->blen);
        if (rc != 0)
            return rc;
        break;
    case TN_STRIP: {
        size_t a = 0, b = s->n, l;
        while (nm->left && a < b && is_space_at(s->s, s->n, a, &l))
            a += l;
        while (nm->right && b > a) {
            size_t k = b - 1;
            while (k > a && ((unsigned char)s->s[k] & 0xc0) == 0x80)
                k--;
            if (!is_space_at(s->s, s->n, k, &l))
                break;
            b = k;
        }
        e->tmp.n = 0;
        if (tok_buf_put(&e->tmp, s->s + a, b - a) != 0)
            return ACC_ENOMEM;
        break;
    }
    case TN_SEQUENCE:
        for (int i = 0; i < nm->nsub; i++)
            if ((rc = tok_over_time(e)) != 0 || (rc = tok_normalize(e, &nm->sub[i], s)) != 0)
                return rc;
        return 0;
    }
    t = *s;
    *s = e->tmp;
    e->tmp = t;
    return 0;
}

/* ---- pre-tokenizers */
typedef struct tok_span {
    size_t a, b;
    bool match;
} tok_span;

typedef struct tok_spans {
    tok_span *v;
    size_t n, cap;
} tok_spans;

static int spans_add(tok_spans *s, size_t a, size_t b, bool match)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 32;
        tok_span *v = realloc(s->v, cap * sizeof *v);
        if (v == NULL)
            return ACC_ENOMEM;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = (tok_span){a, b, match};
    return 0;
}

/* Hugging Face's find_matches: the string cut into matches and the gaps
 * between them, in order, covering all of it. */
static int find_matches(tok_encoder *e, const tok_pre *p, const pcre2_code *re, const char *s,
                        size_t n, tok_spans *out)
{
    out->n = 0;
    if (n == 0)
        return spans_add(out, 0, 0, false);
    size_t prev = 0, i = 0;
    while (i <= n) {
        size_t a, b;
        if (tok_over_time(e) != 0)
            return ACC_EINVAL;
        if (re != NULL) {
            int rc = tok_match(e, re, s, n, i, "pre_tokenizer");
            if (rc < 0)
                return rc;
            if (rc == 0)
                break;
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
            a = ov[0];
            b = ov[1];
        } else {
            int64_t found = memfind(s, n, i, p->str, p->slen);
            if (found < 0)
                break;
            a = (size_t)found;
            b = a + p->slen;
        }
        if (prev != a && spans_add(out, prev, a, false) != 0)
            return ACC_ENOMEM;
        if (spans_add(out, a, b, true) != 0)
            return ACC_ENOMEM;
        prev = b;
        i = b > a ? b : b + (b < n ? tok_utf8_len((const unsigned char *)s, b, n) : 1);
    }
    if (prev != n && spans_add(out, prev, n, false) != 0)
        return ACC_ENOMEM;
    return 0;
}

/* The spans regrouped by `behavior` (in place). Removed drops matches. */
static void apply_behavior(tok_spans *sp, int behavior, bool invert)
{
    if (invert)
        for (size_t i = 0; i < sp->n; i++)
            sp->v[i].match = !sp->v[i].match;
    size_t k = 0;
    bool prevm = false;
    switch (behavior) {
    case TS_ISOLATED:
        for (size_t i = 0; i < sp->n; i++)
            sp->v[i].match = false;
        return;
    case TS_REMOVED:
        for (size_t i = 0; i < sp->n; i++)
            if (!sp->v[i].match)
                sp->v[k++] = sp->v[i];
        sp->n = k;
        return;
    case TS_CONTIGUOUS:
        for (size_t i = 0; i < sp->n; i++) {
            bool m = sp->v[i].match;
            if (m == prevm && k > 0)
                sp->v[k - 1].b = sp->v[i].b;
            else
                sp->v[k++] = (tok_span){sp->v[i].a, sp->v[i].b, false};
            prevm = m;
        }
        sp->n = k;
        return;
    case TS_MERGED_PREV:
        for (size_t i = 0; i < sp->n; i++) {
            bool m = sp->v[i].match;
            if (m && !prevm && k > 0)
                sp->v[k - 1].b = sp->v[i].b;
            else
                sp->v[k++] = (tok_span){sp->v[i].a, sp->v[i].b, false};
            prevm = m;
        }
        sp->n = k;
        return;
    case TS_MERGED_NEXT: {
        /* walk backwards, merging a match into the span after it */
        size_t w = sp->n;
        for (size_t i = sp->n; i-- > 0;) {
            bool m = sp->v[i].match;
            if (m && !prevm && w < sp->n)
                sp->v[w].a = sp->v[i].a;
            else
                sp->v[--w] = (tok_span){sp->v[i].a, sp->v[i].b, false};
            prevm = m;
        }
        memmove(sp->v, sp->v + w, (sp->n - w) * sizeof *sp->v);
        sp->n -= w;
        return;
    }
    }
}

static int split_piece(tok_encoder *e, const tok_pre *p, const pcre2_code *re, int behavior,
                       bool invert, const char *s, size_t n, bool at_start, tok_pieces *out)
{
    tok_spans sp = {0};
    int rc = find_matches(e, p, re, s, n, &sp);
    if (rc == 0) {
        apply_behavior(&sp, behavior, invert);
        for (size_t i = 0; i < sp.n && rc == 0; i++)
            rc = tok_pieces_add(out, s + sp.v[i].a, sp.v[i].b - sp.v[i].a,
                                at_start && sp.v[i].a == 0);
    }
    free(sp.v);
    return rc;
}

static int bytelevel_map(const tok_tokenizer *t, const char *s, size_t n, bool at_start,
                         tok_pieces *out)
{
    size_t off = out->buf.n;
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        if (tok_buf_put(&out->buf, t->bytes.s[b], t->bytes.len[b]) != 0)
            return ACC_ENOMEM;
    }
    if (out->n == out->cap) {
        size_t cap = out->cap ? 2 * out->cap : 64;
        tok_piece *np = realloc(out->p, cap * sizeof *np);
        if (np == NULL)
            return ACC_ENOMEM;
        out->p = np;
        out->cap = cap;
    }
    if (out->buf.n > off)
        out->p[out->n++] = (tok_piece){off, out->buf.n - off, at_start};
    return 0;
}

static int pre_one(tok_encoder *e, const tok_pre *p, const char *s, size_t n, bool at_start,
                   tok_pieces *out)
{
    const tok_tokenizer *t = e->t;
    int rc = 0;
    switch (p->kind) {
    case TP_SPLIT:
        return split_piece(e, p, p->re, p->behavior, p->invert, s, n, at_start, out);
    case TP_DIGITS:
    case TP_WSSPLIT:
        return split_piece(e, p, p->re, p->behavior, false, s, n, at_start, out);
    case TP_BYTELEVEL: {
        tok_buf pre = {0};
        if (p->add_prefix_space && (n == 0 || s[0] != ' ')) {
            if (tok_buf_put(&pre, " ", 1) != 0 || tok_buf_put(&pre, s, n) != 0) {
                tok_buf_free(&pre);
                return ACC_ENOMEM;
            }
            s = pre.s;
            n = pre.n;
        }
        if (p->use_regex) {
            tok_pieces tmp = {0};
            rc = split_piece(e, p, t->gpt2_re, TS_ISOLATED, false, s, n, at_start, &tmp);
            for (size_t i = 0; i < tmp.n && rc == 0; i++)
                rc = bytelevel_map(t, tmp.buf.s + tmp.p[i].off, tmp.p[i].len, tmp.p[i].at_start,
                                   out);
            tok_pieces_free(&tmp);
        } else {
            rc = bytelevel_map(t, s, n, at_start, out);
        }
        tok_buf_free(&pre);
        return rc;
    }
    case TP_METASPACE: {
        tok_buf r = {0};
        if ((rc = replace_all(NULL, &r, s, n, " ", 1, p->repl, p->repl_len)) != 0)
            goto ms_out;
        bool starts = r.n >= p->repl_len && memcmp(r.s, p->repl, p->repl_len) == 0;
        bool prepend = !starts && (p->prepend_scheme == TPS_ALWAYS ||
                                   (p->prepend_scheme == TPS_FIRST && at_start));
        if (prepend) {
            tok_buf q = {0};
            if (tok_buf_put(&q, p->repl, p->repl_len) != 0 || tok_buf_put(&q, r.s, r.n) != 0) {
                tok_buf_free(&q);
                rc = ACC_ENOMEM;
                goto ms_out;
            }
            tok_buf_free(&r);
            r = q;
        }
        if (p->split) {
            tok_pre sp = {.kind = TP_SPLIT, .str = (char *)p->repl, .slen = p->repl_len};
            rc = split_piece(e, &sp, NULL, TS_MERGED_NEXT, false, r.s, r.n, at_start, out);
        } else {
            rc = tok_pieces_add(out, r.s, r.n, at_start);
        }
    ms_out:
        tok_buf_free(&r);
        return rc;
    }
    }
    return ACC_EINTERNAL;
}

int tok_pretokenize(tok_encoder *e, const tok_pre *p, tok_pieces *in, tok_pieces *out)
{
    if (p->kind == TP_SEQUENCE) {
        /* ping-pong: the result of step k is the input of step k + 1 */
        tok_pieces *a = in, *b = out;
        for (int k = 0; k < p->nsub; k++) {
            b->n = 0;
            b->buf.n = 0;
            int rc = tok_pretokenize(e, &p->sub[k], a, b);
            if (rc != 0)
                return rc;
            tok_pieces *x = a;
            a = b;
            b = x;
        }
        if (a != out) { /* the result is in `in`: swap the lists' contents */
            tok_pieces x = *in;
            *in = *out;
            *out = x;
        }
        return 0;
    }
    out->n = 0;
    out->buf.n = 0;
    for (size_t i = 0; i < in->n; i++) {
        int rc = pre_one(e, p, in->buf.s + in->p[i].off, in->p[i].len, in->p[i].at_start, out);
        if (rc != 0)
            return rc;
    }
    return 0;
}
