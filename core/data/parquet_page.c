/* parquet_page: one column chunk's pages -- header, decompression,
 * levels, values (parquet_internal.h). */
#include <errno.h>
#include <limits.h>
#include <snappy-c.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include "parquet_internal.h"
#include "parquet_thrift.h"

enum { PAGE_DATA = 0, PAGE_INDEX = 1, PAGE_DICT = 2, PAGE_DATA_V2 = 3 };
enum { ENC_PLAIN = 0, ENC_PLAIN_DICT = 2, ENC_RLE = 3, ENC_BIT_PACKED = 4, ENC_RLE_DICT = 8 };

typedef struct page_hdr {
    int type;
    int32_t usize, csize;
    int32_t nvals, enc, def_enc, rep_enc;          /* v1, dictionary (nvals, enc) */
    int32_t def_len, rep_len;                      /* v2 */
    bool compressed;                               /* v2 */
    bool has_body;
} page_hdr;

int pq_leaf_fail(const pq_file *f, const pq_leaf *l, acc_err *err, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return acc_err_set(err, ACC_EINVAL, f->field, "%s: row group %d, column %s: %s", f->name, l->rg, l->path,
                       what);
}

static int grow(void *pp, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap && *(void **)pp != NULL)
        return 0;
    size_t n = need < 64 ? 64 : need;
    void *q = realloc(*(void **)pp, n * elem); /* n * elem: n <= PQ_MAX_PAGE, elem <= 16 */
    if (q == NULL)
        return -1;
    *(void **)pp = q;
    *cap = n;
    return 0;
}

void pq_leaf_reset(pq_leaf *l)
{
    free(l->dict_buf);
    free(l->dict);
    l->dict_buf = NULL;
    l->dict = NULL;
    l->ndict = 0;
    l->n = l->i = l->nn = l->vi = 0;
}

void pq_leaf_free(pq_leaf *l)
{
    pq_leaf_reset(l);
    free(l->raw);
    free(l->page);
    free(l->hdr);
    free(l->rep);
    free(l->def);
    free(l->vals);
}

/* ---- the header ------------------------------------------------------------ */

static void read_data_v1(tc_cursor *c, page_hdr *h)
{
    tc_struct s;
    int16_t id;
    int t;
    tc_struct_begin(c, &s);
    while (tc_field(c, &s, &id, &t)) {
        if (id == 1)
            h->nvals = tc_i32(c, t);
        else if (id == 2)
            h->enc = tc_i32(c, t);
        else if (id == 3)
            h->def_enc = tc_i32(c, t);
        else if (id == 4)
            h->rep_enc = tc_i32(c, t);
        else
            tc_skip(c, t);
    }
    tc_struct_end(c);
    h->has_body = true;
}

static void read_data_v2(tc_cursor *c, page_hdr *h)
{
    tc_struct s;
    int16_t id;
    int t;
    h->compressed = true; /* the format's default */
    tc_struct_begin(c, &s);
    while (tc_field(c, &s, &id, &t)) {
        if (id == 1)
            h->nvals = tc_i32(c, t);
        else if (id == 4)
            h->enc = tc_i32(c, t);
        else if (id == 5)
            h->def_len = tc_i32(c, t);
        else if (id == 6)
            h->rep_len = tc_i32(c, t);
        else if (id == 7)
            h->compressed = tc_bool(c, t);
        else
            tc_skip(c, t);
    }
    tc_struct_end(c);
    h->has_body = true;
}

static void read_dict(tc_cursor *c, page_hdr *h)
{
    tc_struct s;
    int16_t id;
    int t;
    tc_struct_begin(c, &s);
    while (tc_field(c, &s, &id, &t)) {
        if (id == 1)
            h->nvals = tc_i32(c, t);
        else if (id == 2)
            h->enc = tc_i32(c, t);
        else
            tc_skip(c, t);
    }
    tc_struct_end(c);
    h->has_body = true;
}

static void read_page_header(tc_cursor *c, page_hdr *h)
{
    tc_struct s;
    int16_t id;
    int t;
    memset(h, 0, sizeof *h);
    h->type = -1;
    tc_struct_begin(c, &s);
    while (tc_field(c, &s, &id, &t)) {
        if (id == 1)
            h->type = tc_i32(c, t);
        else if (id == 2)
            h->usize = tc_i32(c, t);
        else if (id == 3)
            h->csize = tc_i32(c, t);
        else if (id == 5 && t == TC_STRUCT && h->type == PAGE_DATA)
            read_data_v1(c, h);
        else if (id == 7 && t == TC_STRUCT && h->type == PAGE_DICT)
            read_dict(c, h);
        else if (id == 8 && t == TC_STRUCT && h->type == PAGE_DATA_V2)
            read_data_v2(c, h);
        else
            tc_skip(c, t);
    }
    tc_struct_end(c);
}

static int pread_all(int fd, void *buf, size_t n, int64_t off)
{
    size_t got = 0;
    while (got < n) {
        ssize_t k = pread(fd, (char *)buf + got, n - got, (off_t)(off + (int64_t)got));
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        got += (size_t)k;
    }
    return 0;
}

/* The header at l->pos, read through a window that grows while the
 * header does not fit (statistics can be long); l->pos moves past it. */
static int next_header(const pq_file *f, pq_leaf *l, page_hdr *h, acc_err *err)
{
    int64_t left = l->end - l->pos;
    for (size_t win = 256;; win *= 8) {
        size_t n = (int64_t)win < left ? win : (size_t)left;
        if (grow(&l->hdr, &l->hdr_cap, n, 1) != 0)
            return acc_err_set(err, ACC_ENOMEM, f->field, "out of memory");
        if (pread_all(f->fd, l->hdr, n, l->pos) != 0)
            return pq_leaf_fail(f, l, err, "cannot read a page header at byte %lld", (long long)l->pos);
        tc_cursor c;
        tc_init(&c, l->hdr, n);
        read_page_header(&c, h);
        if (tc_ok(&c)) {
            l->pos += (int64_t)tc_used(&c, l->hdr);
            break;
        }
        if (!c.short_read || (int64_t)n >= left || win >= PQ_MAX_PAGE)
            return pq_leaf_fail(f, l, err, "a damaged page header at byte %lld", (long long)l->pos);
    }
    if (h->csize < 0 || h->usize < 0 || (uint32_t)h->csize > PQ_MAX_PAGE || (uint32_t)h->usize > PQ_MAX_PAGE)
        return pq_leaf_fail(f, l, err, "a page size out of range (stored %d, decompressed %d, at most %u)",
                            h->csize, h->usize, PQ_MAX_PAGE);
    if (h->csize > l->end - l->pos)
        return pq_leaf_fail(f, l, err, "a page of %d bytes runs past the column chunk", h->csize);
    if (h->nvals < 0 || (uint32_t)h->nvals > PQ_MAX_PAGE_VALUES)
        return pq_leaf_fail(f, l, err, "a page of %d values (at most %u)", h->nvals, PQ_MAX_PAGE_VALUES);
    return 0;
}

/* ---- decompression ------------------------------------------------------- */

static int inflate_gzip(const uint8_t *src, size_t sn, uint8_t *dst, size_t dn)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, 15 + 32) != Z_OK) /* gzip or zlib header */
        return -1;
    z.next_in = (Bytef *)src;
    z.avail_in = (uInt)sn;
    z.next_out = dst;
    z.avail_out = (uInt)dn;
    int rc = inflate(&z, Z_FINISH);
    size_t out = z.total_out;
    inflateEnd(&z);
    return rc == Z_STREAM_END && out == dn ? 0 : -1;
}

static const char *codec_name(int codec)
{
    static const char *const names[] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "LZO", "BROTLI", "LZ4", "ZSTD", "LZ4_RAW"};
    return codec >= 0 && codec < 8 ? names[codec] : "unknown";
}

/* [src, src+sn) decompressed into exactly dn bytes at dst */
static int decompress(const pq_file *f, const pq_leaf *l, const uint8_t *src, size_t sn, uint8_t *dst, size_t dn,
                      acc_err *err)
{
    int ok = -1;
    switch (l->codec) {
    case PQ_UNCOMPRESSED:
        if (sn == dn) {
            memcpy(dst, src, dn);
            ok = 0;
        }
        break;
    case PQ_SNAPPY: {
        size_t n;
        if (snappy_uncompressed_length((const char *)src, sn, &n) == SNAPPY_OK && n == dn &&
            snappy_uncompress((const char *)src, sn, (char *)dst, &n) == SNAPPY_OK && n == dn)
            ok = 0;
        break;
    }
    case PQ_GZIP:
        ok = inflate_gzip(src, sn, dst, dn);
        break;
    case PQ_ZSTD: {
        size_t n = ZSTD_decompress(dst, dn, src, sn);
        ok = !ZSTD_isError(n) && n == dn ? 0 : -1;
        break;
    }
    default:
        return pq_leaf_fail(f, l, err, "compression %s (%d) is not supported (only snappy, gzip, zstd, none)",
                            codec_name(l->codec), l->codec);
    }
    if (ok != 0)
        return pq_leaf_fail(f, l, err, "a page does not decompress (%s) to its %zu bytes", codec_name(l->codec), dn);
    return 0;
}

/* ---- RLE / bit-packed hybrid ------------------------------------------------ */

static int uvarint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (*p >= end)
            return -1;
        uint8_t b = *(*p)++;
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return 0;
    }
    return -1;
}

int pq_rle_decode(const uint8_t *p, size_t len, int bw, uint32_t *out, uint32_t n)
{
    const uint8_t *end = p + len;
    if (bw < 0 || bw > 32)
        return -1;
    uint32_t got = 0;
    while (got < n) {
        uint64_t h;
        if (uvarint(&p, end, &h) != 0)
            return -1;
        if (h & 1) { /* bit-packed: (h >> 1) groups of 8 values */
            uint64_t groups = h >> 1;
            if (groups > n) /* more than we need: only n values are read */
                groups = n;
            uint64_t vals = groups * 8, want = n - got < vals ? n - got : vals;
            uint64_t bytes = groups * (uint64_t)bw;
            uint64_t bit = 0;
            for (uint64_t k = 0; k < want; k++) {
                uint32_t v = 0;
                for (int b = 0; b < bw; b++, bit++) {
                    if (bit / 8 >= (uint64_t)(end - p))
                        return -1;
                    v |= (uint32_t)((p[bit / 8] >> (bit % 8)) & 1) << b;
                }
                out[got++] = v;
            }
            /* the run's bytes, or what is left of them (a last run may be cut) */
            p += bytes < (uint64_t)(end - p) ? bytes : (uint64_t)(end - p);
        } else { /* a run of one value in ceil(bw/8) bytes */
            uint64_t count = h >> 1;
            int nb = (bw + 7) / 8;
            if (count == 0 || (int64_t)nb > end - p)
                return -1;
            uint32_t v = 0;
            for (int b = 0; b < nb; b++)
                v |= (uint32_t)p[b] << (8 * b);
            p += nb;
            if (bw < 32 && (v >> bw) != 0)
                return -1;
            for (uint64_t k = 0; k < count && got < n; k++)
                out[got++] = v;
        }
    }
    return 0;
}

static int bit_width(uint32_t max)
{
    return max == 0 ? 0 : 32 - __builtin_clz(max);
}

/* levels of one page; `prefixed`: v1's 4-byte length before the runs */
static int read_levels(const pq_file *f, const pq_leaf *l, const char *what, int max, bool prefixed,
                       const uint8_t **p, const uint8_t *end, uint32_t *out, uint32_t n, acc_err *err)
{
    if (max == 0) {
        memset(out, 0, (size_t)n * sizeof *out);
        return 0;
    }
    size_t len = (size_t)(end - *p);
    if (prefixed) {
        if (len < 4)
            return pq_leaf_fail(f, l, err, "%s levels cut short", what);
        uint32_t k = (uint32_t)(*p)[0] | (uint32_t)(*p)[1] << 8 | (uint32_t)(*p)[2] << 16 | (uint32_t)(*p)[3] << 24;
        *p += 4;
        if (k > len - 4)
            return pq_leaf_fail(f, l, err, "%s levels of %u bytes run past the page", what, k);
        len = k;
    }
    if (pq_rle_decode(*p, len, bit_width((uint32_t)max), out, n) != 0)
        return pq_leaf_fail(f, l, err, "damaged %s levels", what);
    for (uint32_t k = 0; k < n; k++)
        if (out[k] > (uint32_t)max)
            return pq_leaf_fail(f, l, err, "a %s level %u over the column's %d", what, out[k], max);
    *p += len;
    return 0;
}

/* ---- values ------------------------------------------------------------------ */

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* n PLAIN values of the leaf's type from [p, end) */
static int plain_values(const pq_file *f, const pq_leaf *l, const uint8_t *p, const uint8_t *end, pq_value *out,
                        uint32_t n, acc_err *err)
{
    size_t left = (size_t)(end - p);
    int w = l->type == PQ_INT32 || l->type == PQ_FLOAT ? 4 : 8;
    if (l->type == PQ_BOOLEAN) {
        if ((size_t)n > left * 8)
            return pq_leaf_fail(f, l, err, "%u booleans in %zu bytes", n, left);
        for (uint32_t k = 0; k < n; k++)
            out[k].i = (p[k / 8] >> (k % 8)) & 1;
        return 0;
    }
    if (l->type != PQ_BYTE_ARRAY) {
        if ((size_t)n * (size_t)w > left) /* n <= 2^22 */
            return pq_leaf_fail(f, l, err, "%u values in %zu bytes", n, left);
        for (uint32_t k = 0; k < n; k++, p += w) {
            uint64_t v = le(p, w);
            if (l->type == PQ_INT32)
                out[k].i = (int32_t)(uint32_t)v;
            else if (l->type == PQ_INT64)
                out[k].i = (int64_t)v;
            else if (l->type == PQ_FLOAT) {
                float x;
                uint32_t u = (uint32_t)v;
                memcpy(&x, &u, 4);
                out[k].d = x;
            } else {
                memcpy(&out[k].d, &v, 8);
            }
        }
        return 0;
    }
    for (uint32_t k = 0; k < n; k++) {
        if (end - p < 4)
            return pq_leaf_fail(f, l, err, "a string's length runs past the page");
        uint32_t len = (uint32_t)le(p, 4);
        p += 4;
        if (len > (size_t)(end - p))
            return pq_leaf_fail(f, l, err, "a string of %u bytes runs past the page", len);
        out[k].s.p = p;
        out[k].s.n = len;
        p += len;
    }
    return 0;
}

static int dict_values(const pq_file *f, const pq_leaf *l, const uint8_t *p, const uint8_t *end, pq_value *out,
                       uint32_t n, acc_err *err)
{
    if (l->dict == NULL && n > 0)
        return pq_leaf_fail(f, l, err, "dictionary-encoded values without a dictionary page");
    if (n == 0)
        return 0;
    if (p >= end)
        return pq_leaf_fail(f, l, err, "dictionary indices missing");
    int bw = *p++;
    uint32_t *idx = malloc((size_t)n * sizeof *idx);
    if (idx == NULL)
        return acc_err_set(err, ACC_ENOMEM, f->field, "out of memory");
    int rc = 0;
    if (pq_rle_decode(p, (size_t)(end - p), bw, idx, n) != 0)
        rc = pq_leaf_fail(f, l, err, "damaged dictionary indices");
    for (uint32_t k = 0; rc == 0 && k < n; k++) {
        if (idx[k] >= l->ndict)
            rc = pq_leaf_fail(f, l, err, "dictionary index %u past the dictionary's %u values", idx[k], l->ndict);
        else
            out[k] = l->dict[idx[k]];
    }
    free(idx);
    return rc;
}

/* RLE-encoded booleans (data page v2's choice): a 4-byte length, runs of 1 bit */
static int rle_bools(const pq_file *f, const pq_leaf *l, const uint8_t *p, const uint8_t *end, pq_value *out,
                     uint32_t n, acc_err *err)
{
    if (l->type != PQ_BOOLEAN)
        return pq_leaf_fail(f, l, err, "RLE values of a non-boolean column");
    uint32_t *bits = malloc(((size_t)n + 1) * sizeof *bits);
    if (bits == NULL)
        return acc_err_set(err, ACC_ENOMEM, f->field, "out of memory");
    int rc = 0;
    size_t len = (size_t)(end - p);
    uint32_t k4 = len >= 4 ? (uint32_t)le(p, 4) : UINT32_MAX;
    if (k4 > len - 4 || pq_rle_decode(p + 4, k4, 1, bits, n) != 0)
        rc = pq_leaf_fail(f, l, err, "damaged RLE booleans");
    for (uint32_t k = 0; rc == 0 && k < n; k++)
        out[k].i = bits[k];
    free(bits);
    return rc;
}

static int decode_values(const pq_file *f, pq_leaf *l, int enc, const uint8_t *p, const uint8_t *end, uint32_t n,
                         acc_err *err)
{
    if (grow(&l->vals, &l->vals_cap, n, sizeof *l->vals) != 0)
        return acc_err_set(err, ACC_ENOMEM, f->field, "out of memory");
    l->nn = n;
    l->vi = 0;
    if (enc == ENC_PLAIN)
        return plain_values(f, l, p, end, l->vals, n, err);
    if (enc == ENC_PLAIN_DICT || enc == ENC_RLE_DICT)
        return dict_values(f, l, p, end, l->vals, n, err);
    if (enc == ENC_RLE)
        return rle_bools(f, l, p, end, l->vals, n, err);
    return pq_leaf_fail(f, l, err, "value encoding %d is not supported (PLAIN, dictionary and RLE are)", enc);
}

/* ---- pages ------------------------------------------------------------------- */

static int read_body(const pq_file *f, pq_leaf *l, const page_hdr *h, acc_err *err)
{
    if (grow(&l->raw, &l->raw_cap, (size_t)h->csize, 1) != 0)
        return acc_err_set(err, ACC_ENOMEM, f->field, "out of memory");
    if (pread_all(f->fd, l->raw, (size_t)h->csize, l->pos) != 0)
        return pq_leaf_fail(f, l, err, "cannot read a page of %d bytes at byte %lld", h->csize, (long long)l->pos);
    l->pos += h->csize;
    return 0;
}

static int load_dictionary(const pq_file *f, pq_leaf *l, const page_hdr *h, acc_err *err)
{
    if (l->dict != NULL)
        return pq_leaf_fail(f, l, err, "a second dictionary page");
    if (h->enc != ENC_PLAIN && h->enc != ENC_PLAIN_DICT)
        return pq_leaf_fail(f, l, err, "a dictionary page of encoding %d", h->enc);
    int rc = read_body(f, l, h, err);
    if (rc != 0)
        return rc;
    l->dict_buf = malloc((size_t)h->usize + 1);
    l->dict = malloc(((size_t)h->nvals + 1) * sizeof *l->dict);
    if (l->dict_buf == NULL || l->dict == NULL)
        return acc_err_set(err, ACC_ENOMEM, f->field, "out of memory");
    if ((rc = decompress(f, l, l->raw, (size_t)h->csize, l->dict_buf, (size_t)h->usize, err)) != 0)
        return rc;
    l->ndict = (uint32_t)h->nvals;
    return plain_values(f, l, l->dict_buf, l->dict_buf + h->usize, l->dict, l->ndict, err);
}

/* entries with a value: definition level at the maximum */
static uint32_t count_values(const pq_leaf *l)
{
    uint32_t nn = 0;
    for (uint32_t k = 0; k < l->n; k++)
        nn += l->def[k] == (uint32_t)l->max_def;
    return nn;
}

static int load_levels_room(const pq_file *f, pq_leaf *l, uint32_t n, acc_err *err)
{
    size_t cap = l->lev_cap;
    if (grow(&l->rep, &cap, n, sizeof *l->rep) != 0 || grow(&l->def, &l->lev_cap, n, sizeof *l->def) != 0)
        return acc_err_set(err, ACC_ENOMEM, f->field, "out of memory");
    if (cap < l->lev_cap) { /* keep both arrays the same size */
        uint32_t *r = realloc(l->rep, l->lev_cap * sizeof *r);
        if (r == NULL)
            return acc_err_set(err, ACC_ENOMEM, f->field, "out of memory");
        l->rep = r;
    }
    l->n = n;
    l->i = 0;
    return 0;
}

static int load_v1(const pq_file *f, pq_leaf *l, const page_hdr *h, acc_err *err)
{
    int rc = read_body(f, l, h, err);
    if (rc == 0 && grow(&l->page, &l->page_cap, (size_t)h->usize + 1, 1) != 0)
        rc = acc_err_set(err, ACC_ENOMEM, f->field, "out of memory");
    if (rc == 0)
        rc = decompress(f, l, l->raw, (size_t)h->csize, l->page, (size_t)h->usize, err);
    if (rc == 0)
        rc = load_levels_room(f, l, (uint32_t)h->nvals, err);
    if (rc != 0)
        return rc;
    if ((l->max_rep > 0 && h->rep_enc != ENC_RLE) || (l->max_def > 0 && h->def_enc != ENC_RLE))
        return pq_leaf_fail(f, l, err, "level encoding %d is not supported (RLE is)",
                            l->max_rep > 0 && h->rep_enc != ENC_RLE ? h->rep_enc : h->def_enc);
    const uint8_t *p = l->page, *end = l->page + h->usize;
    if ((rc = read_levels(f, l, "repetition", l->max_rep, true, &p, end, l->rep, l->n, err)) != 0 ||
        (rc = read_levels(f, l, "definition", l->max_def, true, &p, end, l->def, l->n, err)) != 0)
        return rc;
    return decode_values(f, l, h->enc, p, end, count_values(l), err);
}

static int load_v2(const pq_file *f, pq_leaf *l, const page_hdr *h, acc_err *err)
{
    int rc = read_body(f, l, h, err);
    if (rc != 0)
        return rc;
    if (h->rep_len < 0 || h->def_len < 0 || (int64_t)h->rep_len + h->def_len > h->csize ||
        (int64_t)h->rep_len + h->def_len > h->usize)
        return pq_leaf_fail(f, l, err, "level lengths (%d, %d) past the page of %d bytes", h->rep_len, h->def_len,
                            h->csize);
    if ((rc = load_levels_room(f, l, (uint32_t)h->nvals, err)) != 0)
        return rc;
    const uint8_t *p = l->raw, *lend = l->raw + h->rep_len;
    if ((rc = read_levels(f, l, "repetition", l->max_rep, false, &p, lend, l->rep, l->n, err)) != 0)
        return rc;
    p = lend;
    lend = p + h->def_len;
    if ((rc = read_levels(f, l, "definition", l->max_def, false, &p, lend, l->def, l->n, err)) != 0)
        return rc;
    size_t lv = (size_t)h->rep_len + (size_t)h->def_len, sn = (size_t)h->csize - lv, dn = (size_t)h->usize - lv;
    const uint8_t *vals = l->raw + lv;
    if (h->compressed && l->codec != PQ_UNCOMPRESSED) {
        if (grow(&l->page, &l->page_cap, dn + 1, 1) != 0)
            return acc_err_set(err, ACC_ENOMEM, f->field, "out of memory");
        if ((rc = decompress(f, l, vals, sn, l->page, dn, err)) != 0)
            return rc;
        vals = l->page;
    } else if (sn != dn) {
        return pq_leaf_fail(f, l, err, "an uncompressed page of %zu bytes said to be %zu", sn, dn);
    }
    return decode_values(f, l, h->enc, vals, vals + dn, count_values(l), err);
}

int pq_page_next(const pq_file *f, pq_leaf *l, acc_err *err)
{
    while (l->pos < l->end) {
        page_hdr h;
        int rc = next_header(f, l, &h, err);
        if (rc != 0)
            return rc;
        if (h.type == PAGE_DICT && h.has_body)
            rc = load_dictionary(f, l, &h, err);
        else if (h.type == PAGE_DATA && h.has_body)
            return load_v1(f, l, &h, err);
        else if (h.type == PAGE_DATA_V2 && h.has_body)
            return load_v2(f, l, &h, err);
        else if (h.type == PAGE_INDEX || h.type > PAGE_DATA_V2) /* read past what we do not use */
            l->pos += h.csize;
        else
            return pq_leaf_fail(f, l, err, "a page of type %d without its header", h.type);
        if (rc != 0)
            return rc;
    }
    return 1;
}
