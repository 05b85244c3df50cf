#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "fsutil.h"

#define ST_MAX_HEADER (64u << 20)

struct st_file {
    uint8_t *buf;       /* the whole file, mapped read-only (NULL: header only) */
    size_t size;
    size_t data_start;  /* 8 + header length */
    const uint8_t *data; /* after the header (NULL: header only) */
    char *hdr;           /* the JSON header's bytes */
    size_t hdr_len;
    size_t data_len;
    json_t *header;
    int n;
    st_tensor *tensors; /* sorted by offset */
};

static const struct { const char *name; size_t size; } dtypes[] = {
    [ST_F32] = {"F32", 4}, [ST_BF16] = {"BF16", 2}, [ST_F16] = {"F16", 2}, [ST_F64] = {"F64", 8},
    [ST_I32] = {"I32", 4}, [ST_I64] = {"I64", 8},   [ST_U8] = {"U8", 1},   [ST_U16] = {"U16", 2},
};
#define NDTYPES ((int)(sizeof dtypes / sizeof dtypes[0]))

size_t st_dtype_size(st_dtype d) { return (int)d < NDTYPES ? dtypes[d].size : 0; }
const char *st_dtype_name(st_dtype d) { return (int)d < NDTYPES ? dtypes[d].name : "?"; }

static int dtype_of(const char *s, st_dtype *out)
{
    for (int i = 0; i < NDTYPES; i++)
        if (!strcmp(s, dtypes[i].name)) {
            *out = (st_dtype)i;
            return 0;
        }
    return -1;
}

static int numel_of(const st_tensor *t, uint64_t *out)
{
    uint64_t n = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0 || (t->shape[d] > 0 && n > UINT64_MAX / (uint64_t)t->shape[d]))
            return -1;
        n *= (uint64_t)t->shape[d];
    }
    *out = n;
    return 0;
}

/* ---- writing */

static json_t *build_header(const st_tensor *t, int n, const st_meta *meta, int nmeta,
                            uint32_t crc, uint64_t total, acc_err *err)
{
    json_t *h = json_object(), *md = json_object();
    if (h == NULL || md == NULL)
        goto oom;
    char buf[32];
    snprintf(buf, sizeof buf, "%08x", crc);
    if (json_object_set_new(md, "accumd.crc32", json_string(buf)) != 0)
        goto oom;
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)total);
    if (json_object_set_new(md, "accumd.data_bytes", json_string(buf)) != 0)
        goto oom;
    for (int i = 0; i < nmeta; i++)
        if (json_object_set_new(md, meta[i].key, json_string(meta[i].value)) != 0)
            goto oom;
    if (json_object_set_new(h, "__metadata__", md) != 0) {
        md = NULL;
        goto oom;
    }
    md = NULL;
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        json_t *shape = json_array();
        for (int d = 0; shape && d < t[i].ndim; d++)
            if (json_array_append_new(shape, json_integer(t[i].shape[d])) != 0) {
                json_decref(shape);
                shape = NULL;
            }
        json_t *e = shape ? json_pack("{s:s, s:o, s:[I,I]}", "dtype", st_dtype_name(t[i].dtype),
                                      "shape", shape, "data_offsets", (json_int_t)off,
                                      (json_int_t)(off + t[i].nbytes))
                          : NULL;
        if (e == NULL || json_object_set_new(h, t[i].name, e) != 0)
            goto oom;
        off += t[i].nbytes;
    }
    return h;
oom:
    json_decref(h);
    json_decref(md);
    acc_err_set(err, ACC_ENOMEM, NULL, "out of memory building the safetensors header");
    return NULL;
}

static int check_tensors(const st_tensor *t, int n, acc_err *err)
{
    for (int i = 0; i < n; i++) {
        uint64_t numel;
        if (t[i].name == NULL || t[i].name[0] == '\0' || !strcmp(t[i].name, "__metadata__"))
            return acc_err_set(err, ACC_EINVAL, NULL, "tensor %d has no valid name", i);
        if ((int)t[i].dtype >= NDTYPES || t[i].ndim < 0 || t[i].ndim > ST_MAX_DIMS ||
            numel_of(&t[i], &numel) != 0 || numel * st_dtype_size(t[i].dtype) != t[i].nbytes)
            return acc_err_set(err, ACC_EINVAL, NULL, "tensor %s: shape and size disagree", t[i].name);
        for (int j = 0; j < i; j++)
            if (!strcmp(t[i].name, t[j].name))
                return acc_err_set(err, ACC_EINVAL, NULL, "tensor %s given twice", t[i].name);
    }
    return 0;
}

int st_write(const char *path, const st_tensor *t, int n, const st_meta *meta, int nmeta,
             acc_err *err)
{
    int rc = check_tensors(t, n, err);
    if (rc != 0)
        return rc;
    uLong crc = crc32(0L, Z_NULL, 0);
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        const uint8_t *p = t[i].data;
        for (size_t left = t[i].nbytes; left > 0;) { /* crc32 takes uInt lengths */
            uInt chunk = left > (1u << 30) ? (1u << 30) : (uInt)left;
            crc = crc32(crc, p, chunk);
            p += chunk;
            left -= chunk;
        }
        total += t[i].nbytes;
    }
    json_t *h = build_header(t, n, meta, nmeta, (uint32_t)crc, total, err);
    if (h == NULL)
        return ACC_ENOMEM;
    char *text = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    if (text == NULL)
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory writing the safetensors header");
    size_t hl = strlen(text), padded = (hl + 7) & ~(size_t)7; /* 8-byte aligned data */
    char *hdr = malloc(8 + padded);
    if (hdr == NULL) {
        free(text);
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    }
    uint64_t le = padded;
    for (int b = 0; b < 8; b++)
        hdr[b] = (char)((le >> (8 * b)) & 0xff);
    memcpy(hdr + 8, text, hl);
    memset(hdr + 8 + hl, ' ', padded - hl);
    free(text);

    fsu_chunk *chunks = malloc(((size_t)n + 1) * sizeof *chunks);
    if (chunks == NULL) {
        free(hdr);
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    }
    chunks[0] = (fsu_chunk){hdr, 8 + padded};
    for (int i = 0; i < n; i++)
        chunks[i + 1] = (fsu_chunk){t[i].data, t[i].nbytes};
    rc = fsu_write_atomic_chunks(path, chunks, n + 1, err);
    free(chunks);
    free(hdr);
    if (rc != 0)
        acc_err_prefix(err, "writing %s", path);
    return rc;
}

/* ---- reading */

static int cmp_offset(const void *a, const void *b)
{
    const st_tensor *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int parse_entry(st_file *f, const char *name, json_t *e, st_tensor *t, acc_err *err)
{
    const char *dt = NULL;
    json_t *shape = NULL;
    json_int_t b = -1, en = -1;
    if (json_unpack(e, "{s:s, s:o, s:[II]}", "dtype", &dt, "shape", &shape, "data_offsets", &b, &en) != 0 ||
        !json_is_array(shape))
        return acc_err_set(err, ACC_EINVAL, name, "tensor %s: bad header entry", name);
    if (dtype_of(dt, &t->dtype) != 0)
        return acc_err_set(err, ACC_EINVAL, name, "tensor %s: unsupported dtype %s", name, dt);
    if (json_array_size(shape) > ST_MAX_DIMS)
        return acc_err_set(err, ACC_EINVAL, name, "tensor %s: too many dimensions", name);
    t->name = name;
    t->ndim = (int)json_array_size(shape);
    for (int d = 0; d < t->ndim; d++) {
        json_t *v = json_array_get(shape, (size_t)d);
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return acc_err_set(err, ACC_EINVAL, name, "tensor %s: bad shape", name);
        t->shape[d] = json_integer_value(v);
    }
    uint64_t numel;
    if (b < 0 || en < b || (uint64_t)en > f->data_len || numel_of(t, &numel) != 0 ||
        numel * st_dtype_size(t->dtype) != (uint64_t)(en - b))
        return acc_err_set(err, ACC_EINVAL, name, "tensor %s: byte range [%lld, %lld) does not match "
                           "its shape or the file", name, (long long)b, (long long)en);
    t->offset = (size_t)b;
    t->data = f->data != NULL ? f->data + b : NULL;
    t->nbytes = (size_t)(en - b);
    return 0;
}

static int parse_header(st_file *f, acc_err *err)
{
    size_t n = json_object_size(f->header);
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    if (f->tensors == NULL)
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    const char *key;
    json_t *val;
    json_object_foreach(f->header, key, val) {
        if (!strcmp(key, "__metadata__")) {
            const char *mk;
            json_t *mv;
            if (!json_is_object(val))
                return acc_err_set(err, ACC_EINVAL, NULL, "__metadata__ is not an object");
            json_object_foreach(val, mk, mv) if (!json_is_string(mv))
                return acc_err_set(err, ACC_EINVAL, NULL, "metadata %s is not a string", mk);
            continue;
        }
        int rc = parse_entry(f, key, val, &f->tensors[f->n], err);
        if (rc != 0)
            return rc;
        f->n++;
    }
    qsort(f->tensors, (size_t)f->n, sizeof *f->tensors, cmp_offset);
    size_t expect = 0;
    for (int i = 0; i < f->n; i++) { /* ranges must tile the data: no gaps, no overlap */
        if (f->tensors[i].offset != expect)
            return acc_err_set(err, ACC_EINVAL, f->tensors[i].name,
                               "tensor %s: byte ranges overlap or leave gaps", f->tensors[i].name);
        expect += f->tensors[i].nbytes;
    }
    if (expect != f->data_len)
        return acc_err_set(err, ACC_EINVAL, NULL, "file has %zu bytes after the last tensor",
                           f->data_len - expect);
    return 0;
}

static void drop_pages(const st_file *f, const void *data, size_t nbytes);

/* Hashes the mapping in 64 MiB pieces, dropping each piece's pages after
 * it: opening a file never makes all of it resident at once. */
static int verify_crc(st_file *f, acc_err *err)
{
    const char *want = st_get_meta(f, "accumd.crc32");
    if (want == NULL)
        return 0; /* written elsewhere: nothing to verify against */
    uLong crc = crc32(0L, Z_NULL, 0);
    const uint8_t *p = f->data;
    for (size_t left = f->data_len; left > 0;) {
        uInt chunk = left > (64u << 20) ? (64u << 20) : (uInt)left;
        crc = crc32(crc, p, chunk);
        drop_pages(f, p, chunk);
        p += chunk;
        left -= chunk;
    }
    char got[16];
    snprintf(got, sizeof got, "%08x", (uint32_t)crc);
    if (strcmp(got, want) != 0)
        return acc_err_set(err, ACC_EIO, NULL, "checksum mismatch (crc32 %s, header says %s)", got, want);
    return 0;
}

/* Element i's kind in a float tensor: 0 finite, 1 Inf, 2 NaN (by the
 * exponent and mantissa bits, little-endian: no float is formed). */
static int nonfinite_at(st_dtype d, const uint8_t *p, size_t i)
{
    if (d == ST_F32) {
        uint32_t u = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 | (uint32_t)p[4 * i + 2] << 16 |
                     (uint32_t)p[4 * i + 3] << 24;
        return (u & 0x7f800000u) != 0x7f800000u ? 0 : (u & 0x007fffffu) ? 2 : 1;
    }
    uint16_t h = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
    uint16_t exp = d == ST_BF16 ? 0x7f80u : 0x7c00u;
    return (h & exp) != exp ? 0 : (h & (uint16_t)~(exp | 0x8000u)) ? 2 : 1;
}

/* Every F32 / BF16 / F16 tensor holds finite values only: a NaN or Inf
 * weight (or moment) would poison every step of a job that loads it, so
 * the file is refused naming the tensor. One pass, page by page. */
static int check_finite(const st_file *f, acc_err *err)
{
    for (int k = 0; k < f->n; k++) {
        const st_tensor *t = &f->tensors[k];
        if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16)
            continue;
        size_t es = st_dtype_size(t->dtype), n = t->nbytes / es, piece = (64u << 20) / es;
        const uint8_t *p = t->data;
        for (size_t lo = 0; lo < n; lo += piece) {
            size_t hi = n - lo > piece ? lo + piece : n;
            for (size_t i = lo; i < hi; i++) {
                int bad = nonfinite_at(t->dtype, p, i);
                if (bad != 0)
                    return acc_err_set(err, ACC_EINVAL, NULL,
                                       "tensor %s holds a non-finite value (%s) at element %zu", t->name,
                                       bad == 2 ? "NaN" : "Inf", i);
            }
            drop_pages(f, p + lo * es, (hi - lo) * es);
        }
    }
    return 0;
}

/* Map the file (or, header only, read its first 8 + header bytes). */
/* Map the file behind `fd` (or, header only, read its first 8 + header
 * bytes); fd is not closed here. Messages never quote the file's bytes. */
static int open_fd_file(int fd, const char *path, st_file *f, int header_only, acc_err *err)
{
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        rc = acc_err_set(err, ACC_EIO, NULL, "%s is not a regular file", path);
    else if ((uint64_t)st.st_size < 8 || (uint64_t)st.st_size > SIZE_MAX)
        rc = acc_err_set(err, ACC_EINVAL, NULL, "%s: too short for safetensors", path);
    uint8_t len8[8];
    uint64_t hl = 0;
    if (rc == 0) {
        f->size = (size_t)st.st_size;
        if (pread(fd, len8, 8, 0) != 8)
            rc = acc_err_set(err, ACC_EIO, NULL, "%s: short read", path);
        for (int b = 0; rc == 0 && b < 8; b++)
            hl |= (uint64_t)len8[b] << (8 * b);
        if (rc == 0 && (hl > ST_MAX_HEADER || hl > f->size - 8))
            rc = acc_err_set(err, ACC_EINVAL, NULL,
                             "%s: not safetensors (its header length is larger than the file)", path);
    }
    if (rc == 0) {
        f->data_start = 8 + (size_t)hl;
        f->data_len = f->size - f->data_start;
        f->hdr = malloc((size_t)hl + 1);
        if (f->hdr == NULL)
            rc = acc_err_set(err, ACC_ENOMEM, NULL, "out of memory reading %s", path);
        else if (pread(fd, f->hdr, (size_t)hl, 8) != (ssize_t)hl)
            rc = acc_err_set(err, ACC_EIO, NULL, "%s: short read", path);
        else
            f->hdr_len = (size_t)hl;
    }
    if (rc == 0 && !header_only) {
        void *p = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED)
            rc = acc_err_set(err, errno == ENOMEM ? ACC_ENOMEM : ACC_EIO, NULL, "mmap %s: %s", path,
                             strerror(errno));
        else {
            f->buf = p;
            f->data = f->buf + f->data_start;
        }
    }
    return rc;
}

/* An open by name (tools, tests, accumd's own files): a regular file,
 * opened without blocking (a FIFO is refused, never waited on). */
static int open_file(const char *path, st_file *f, int header_only, acc_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return acc_err_set(err, errno == ENOENT ? ACC_ENOTFOUND : ACC_EIO, NULL, "open %s: %s",
                           path, strerror(errno));
    int rc = open_fd_file(fd, path, f, header_only, err);
    close(fd);
    return rc;
}

/* Header, entries and (whole files) checksum of an opened file. */
static int parse_opened(st_file *f, const char *path, int header_only, acc_err *err)
{
    json_error_t je;
    int rc = 0;
    f->header = json_loadb(f->hdr, f->hdr_len, 0, &je);
    if (!json_is_object(f->header)) /* not je.text: it quotes the file's bytes */
        rc = acc_err_set(err, ACC_EINVAL, NULL, "%s: header is not a JSON object (at byte %d)", path,
                         je.position);
    if (rc == 0)
        rc = parse_header(f, err);
    if (rc == 0 && !header_only)
        rc = verify_crc(f, err);
    if (rc == 0 && !header_only)
        rc = check_finite(f, err);
    if (rc != 0 && err != NULL && strstr(err->msg, path) == NULL)
        acc_err_prefix(err, "%s", path);
    return rc;
}

static int open_any(const char *path, st_file **out, int header_only, acc_err *err)
{
    st_file *f = calloc(1, sizeof *f);
    if (f == NULL)
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    int rc = open_file(path, f, header_only, err);
    if (rc == 0)
        rc = parse_opened(f, path, header_only, err);
    if (rc != 0) {
        st_close(f);
        return rc;
    }
    *out = f;
    return 0;
}

int st_open(const char *path, st_file **out, acc_err *err) { return open_any(path, out, 0, err); }

static int open_fd_any(int fd, const char *name, st_file **out, int header_only, acc_err *err)
{
    st_file *f = calloc(1, sizeof *f);
    if (f == NULL)
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory");
    int rc = open_fd_file(fd, name, f, header_only, err);
    if (rc == 0)
        rc = parse_opened(f, name, header_only, err);
    if (rc != 0) {
        st_close(f);
        return rc;
    }
    *out = f;
    return 0;
}

int st_open_fd(int fd, const char *name, st_file **out, acc_err *err)
{
    return open_fd_any(fd, name, out, 0, err);
}

int st_open_header_fd(int fd, const char *name, st_file **out, acc_err *err)
{
    return open_fd_any(fd, name, out, 1, err);
}

int st_open_header(const char *path, st_file **out, acc_err *err)
{
    return open_any(path, out, 1, err);
}

void st_close(st_file *f)
{
    if (f == NULL)
        return;
    json_decref(f->header);
    free(f->tensors);
    free(f->hdr);
    if (f->buf != NULL)
        munmap(f->buf, f->size);
    free(f);
}

int st_get(const st_file *f, const char *name, st_tensor *out, acc_err *err)
{
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->tensors[i].name, name)) {
            *out = f->tensors[i];
            return 0;
        }
    return acc_err_set(err, ACC_ENOTFOUND, name, "no tensor named %s", name);
}

const char *st_get_meta(const st_file *f, const char *key)
{
    json_t *md = json_object_get(f->header, "__metadata__");
    return json_string_value(json_object_get(md, key));
}

int st_count(const st_file *f) { return f->n; }

int st_at(const st_file *f, int i, st_tensor *out)
{
    if (i < 0 || i >= f->n)
        return ACC_ENOTFOUND;
    *out = f->tensors[i];
    return 0;
}

/* ---- dtype conversion */

static float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static uint16_t f32_to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
    if (e == 0x1f)
        u = sign | 0x7f800000u | (m << 13); /* inf, NaN */
    else if (e != 0)
        u = sign | ((e + 112) << 23) | (m << 13);
    else if (m == 0)
        u = sign;
    else { /* subnormal: normalise */
        e = 113;
        while (!(m & 0x400)) {
            m <<= 1;
            e--;
        }
        u = sign | (e << 23) | ((m & 0x3ff) << 13);
    }
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static uint16_t f32_to_f16(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) /* rounds past 65504: inf */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* below the smallest normal: subnormal or zero */
        float f;
        memcpy(&f, &a, sizeof f);
        /* units of 2^-24, rounded to nearest even by the FPU */
        float scaled = f * 16777216.0f;
        uint32_t m = (uint32_t)scaled;
        float rest = scaled - (float)m;
        if (rest > 0.5f || (rest == 0.5f && (m & 1u)))
            m++;
        return (uint16_t)(sign | m);
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - (112u << 23);
    return (uint16_t)(sign | (r >> 13));
}

int st_to_f32(const st_tensor *t, float *dst, size_t count, acc_err *err)
{
    size_t es = st_dtype_size(t->dtype);
    if (es == 0 || t->nbytes / es != count || t->nbytes % es != 0)
        return acc_err_set(err, ACC_EINVAL, t->name, "tensor %s: %zu bytes of %s are not %zu values",
                           t->name, t->nbytes, st_dtype_name(t->dtype), count);
    const uint8_t *p = t->data;
    switch (t->dtype) {
    case ST_F32:
        memcpy(dst, p, count * sizeof *dst);
        return 0;
    case ST_BF16:
        for (size_t i = 0; i < count; i++)
            dst[i] = bf16_to_f32((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
        return 0;
    case ST_F16:
        for (size_t i = 0; i < count; i++)
            dst[i] = f16_to_f32((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
        return 0;
    default:
        return acc_err_set(err, ACC_EINVAL, t->name, "tensor %s: dtype %s is not F32, BF16 or F16",
                           t->name, st_dtype_name(t->dtype));
    }
}

int st_from_f32(st_dtype d, const float *src, size_t count, void *dst, acc_err *err)
{
    uint8_t *p = dst;
    switch (d) {
    case ST_F32:
        memcpy(dst, src, count * sizeof *src);
        return 0;
    case ST_BF16:
    case ST_F16:
        for (size_t i = 0; i < count; i++) {
            uint16_t h = d == ST_BF16 ? f32_to_bf16(src[i]) : f32_to_f16(src[i]);
            p[2 * i] = (uint8_t)(h & 0xff);
            p[2 * i + 1] = (uint8_t)(h >> 8);
        }
        return 0;
    default:
        return acc_err_set(err, ACC_EINVAL, NULL, "cannot write dtype %s from floats",
                           st_dtype_name(d));
    }
}

void st_release(const st_file *f, const st_tensor *t)
{
    drop_pages(f, t->data, t->nbytes);
}

/* The whole pages of [data, data + nbytes) inside f's mapping, dropped
 * (they come back from the page cache if read again). */
static void drop_pages(const st_file *f, const void *data, size_t nbytes)
{
    if (f->buf == NULL || data == NULL || nbytes == 0)
        return;
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t base = (uintptr_t)f->buf, lo = (uintptr_t)data, hi = lo + nbytes;
    lo = base + ((lo - base) + (uintptr_t)pg - 1) / (uintptr_t)pg * (uintptr_t)pg; /* whole pages only */
    hi = base + (hi - base) / (uintptr_t)pg * (uintptr_t)pg;
    if (hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_DONTNEED); /* advice: failure only costs memory */
}

/* ---- streamed writing */

int st_write_fill(const char *path, const st_tensor *t, int n, const st_meta *meta, int nmeta,
                  st_fill_fn fill, void *ctx, acc_err *err)
{
    int rc = check_tensors(t, n, err);
    if (rc != 0)
        return rc;
    uint64_t total = 0;
    size_t biggest = 0;
    for (int i = 0; i < n; i++) {
        total += t[i].nbytes;
        biggest = t[i].nbytes > biggest ? t[i].nbytes : biggest;
    }
    /* The CRC is known only after the data: write a placeholder, patch it. */
    json_t *h = build_header(t, n, meta, nmeta, 0, total, err);
    if (h == NULL)
        return ACC_ENOMEM;
    char *text = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    const char *mark = text ? strstr(text, "\"accumd.crc32\":\"00000000\"") : NULL;
    if (mark == NULL) {
        free(text);
        return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory writing the safetensors header");
    }
    size_t hl = strlen(text), padded = (hl + 7) & ~(size_t)7;
    off_t crc_at = (off_t)(8 + (size_t)(mark - text) + strlen("\"accumd.crc32\":\""));
    uint8_t *hdr = malloc(8 + padded), *buf = malloc(biggest ? biggest : 1);
    fsu_atomic a = {.fd = -1};
    if (hdr == NULL || buf == NULL)
        rc = acc_err_set(err, ACC_ENOMEM, NULL, "out of memory writing %s", path);
    if (rc == 0) {
        for (int b = 0; b < 8; b++)
            hdr[b] = (uint8_t)(((uint64_t)padded >> (8 * b)) & 0xff);
        memcpy(hdr + 8, text, hl);
        memset(hdr + 8 + hl, ' ', padded - hl);
        rc = fsu_atomic_open(&a, path, err);
    }
    if (rc == 0)
        rc = fsu_write_all(a.fd, hdr, 8 + padded, err);
    uLong crc = crc32(0L, Z_NULL, 0);
    for (int i = 0; rc == 0 && i < n; i++) {
        rc = fill(ctx, i, buf, err);
        const uint8_t *p = buf;
        for (size_t left = t[i].nbytes; rc == 0 && left > 0;) {
            uInt chunk = left > (1u << 30) ? (1u << 30) : (uInt)left;
            crc = crc32(crc, p, chunk);
            p += chunk;
            left -= chunk;
        }
        if (rc == 0)
            rc = fsu_write_all(a.fd, buf, t[i].nbytes, err);
    }
    if (rc == 0) {
        char hex[16];
        snprintf(hex, sizeof hex, "%08x", (uint32_t)crc);
        if (pwrite(a.fd, hex, 8, crc_at) != 8)
            rc = acc_err_set(err, ACC_EIO, NULL, "write %s: %s", a.tmp, strerror(errno));
    }
    if (rc == 0)
        rc = fsu_atomic_commit(&a, err);
    fsu_atomic_abort(&a);
    free(text);
    free(hdr);
    free(buf);
    if (rc != 0 && err != NULL && strstr(err->msg, path) == NULL)
        acc_err_prefix(err, "writing %s", path);
    return rc;
}
