/* parquet_thrift: Thrift compact protocol reader (parquet_thrift.h). */
#include "parquet_thrift.h"

#include <string.h>

static void fail(tc_cursor *c, bool out_of_bytes)
{
    c->bad = true;
    c->short_read |= out_of_bytes;
    c->p = c->end;
}

void tc_init(tc_cursor *c, const void *buf, size_t len)
{
    c->p = buf;
    c->end = c->p + len;
    c->depth = 0;
    c->bad = c->short_read = false;
}

static uint8_t byte(tc_cursor *c)
{
    if (c->bad || c->p >= c->end) {
        if (!c->bad)
            fail(c, true);
        return 0;
    }
    return *c->p++;
}

static uint64_t varint(tc_cursor *c)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        uint8_t b = byte(c);
        if (c->bad)
            return 0;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return v;
    }
    fail(c, false); /* more than 10 bytes */
    return 0;
}

static int64_t zigzag(uint64_t v)
{
    return (int64_t)(v >> 1) ^ -(int64_t)(v & 1);
}

void tc_struct_begin(tc_cursor *c, tc_struct *s)
{
    s->last_id = 0;
    if (++c->depth > TC_MAX_DEPTH)
        fail(c, false);
}

void tc_struct_end(tc_cursor *c)
{
    c->depth--;
}

int tc_field(tc_cursor *c, tc_struct *s, int16_t *id, int *type)
{
    uint8_t h = byte(c);
    if (c->bad || h == TC_STOP)
        return 0;
    *type = h & 0x0f;
    int delta = h >> 4;
    if (delta != 0) {
        *id = (int16_t)(s->last_id + delta);
    } else {
        int64_t v = zigzag(varint(c));
        if (v < INT16_MIN || v > INT16_MAX)
            fail(c, false);
        *id = (int16_t)v;
    }
    if (*type > TC_STRUCT)
        fail(c, false);
    s->last_id = *id;
    return c->bad ? 0 : 1;
}

int32_t tc_i32(tc_cursor *c, int type)
{
    if (type != TC_I32 && type != TC_I16 && type != TC_BYTE) {
        fail(c, false);
        return 0;
    }
    if (type == TC_BYTE)
        return (int8_t)byte(c);
    int64_t v = zigzag(varint(c));
    if (v < INT32_MIN || v > INT32_MAX) {
        fail(c, false);
        return 0;
    }
    return (int32_t)v;
}

int64_t tc_i64(tc_cursor *c, int type)
{
    if (type != TC_I64 && type != TC_I32 && type != TC_I16) {
        fail(c, false);
        return 0;
    }
    return zigzag(varint(c));
}

bool tc_bool(tc_cursor *c, int type)
{
    if (type == TC_TRUE || type == TC_FALSE)
        return type == TC_TRUE;
    fail(c, false);
    return false;
}

const uint8_t *tc_binary(tc_cursor *c, int type, uint32_t *len)
{
    *len = 0;
    if (type != TC_BINARY) {
        fail(c, false);
        return NULL;
    }
    uint64_t n = varint(c);
    if (c->bad)
        return NULL;
    if (n > (uint64_t)(c->end - c->p)) {
        fail(c, true);
        return NULL;
    }
    const uint8_t *s = c->p;
    c->p += n;
    *len = (uint32_t)n;
    return s;
}

uint32_t tc_list(tc_cursor *c, int type, int *elem_type)
{
    *elem_type = TC_STOP;
    if (type != TC_LIST && type != TC_SET) {
        fail(c, false);
        return 0;
    }
    uint8_t h = byte(c);
    uint64_t n = h >> 4;
    if (n == 15)
        n = varint(c);
    *elem_type = h & 0x0f;
    /* every element takes at least one byte */
    if (!c->bad && n > (uint64_t)(c->end - c->p))
        fail(c, true);
    if (!c->bad && (*elem_type == TC_STOP || *elem_type > TC_STRUCT))
        fail(c, false);
    return c->bad ? 0 : (uint32_t)n;
}

static void skip_bytes(tc_cursor *c, size_t n)
{
    if (c->bad)
        return;
    if (n > (size_t)(c->end - c->p))
        fail(c, true);
    else
        c->p += n;
}

/* a list element of type bool is one byte, unlike a field's */
static void skip_elem(tc_cursor *c, int type)
{
    if (type == TC_TRUE || type == TC_FALSE)
        skip_bytes(c, 1);
    else
        tc_skip(c, type);
}

void tc_skip(tc_cursor *c, int type)
{
    if (c->bad)
        return;
    if (++c->depth > TC_MAX_DEPTH) {
        fail(c, false);
        return;
    }
    switch (type) {
    case TC_TRUE:
    case TC_FALSE:
        break;
    case TC_BYTE:
        skip_bytes(c, 1);
        break;
    case TC_I16:
    case TC_I32:
    case TC_I64:
        (void)varint(c);
        break;
    case TC_DOUBLE:
        skip_bytes(c, 8);
        break;
    case TC_BINARY: {
        uint32_t n;
        (void)tc_binary(c, type, &n);
        break;
    }
    case TC_LIST:
    case TC_SET: {
        int et;
        uint32_t n = tc_list(c, type, &et);
        for (uint32_t i = 0; i < n && !c->bad; i++)
            skip_elem(c, et);
        break;
    }
    case TC_MAP: {
        uint64_t n = varint(c);
        if (n == 0)
            break;
        uint8_t kv = byte(c);
        if (!c->bad && n > (uint64_t)(c->end - c->p))
            fail(c, true);
        for (uint64_t i = 0; i < n && !c->bad; i++) {
            skip_elem(c, kv >> 4);
            skip_elem(c, kv & 0x0f);
        }
        break;
    }
    case TC_STRUCT: {
        tc_struct s;
        int16_t id;
        int t;
        s.last_id = 0;
        while (tc_field(c, &s, &id, &t))
            tc_skip(c, t);
        break;
    }
    default:
        fail(c, false);
    }
    c->depth--;
}
