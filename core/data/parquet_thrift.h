/* parquet_thrift: a reader of Thrift's compact protocol, the encoding of a
 * Parquet file's footer (FileMetaData) and of its page headers.
 *
 * Contract:
 *   - A cursor reads from one bounded buffer and never past its end. Every
 *     failure (a value past the end, a varint over 10 bytes, a list longer
 *     than the bytes left could hold, nesting deeper than TC_MAX_DEPTH, an
 *     unknown wire type) sets the cursor's sticky `bad` flag and returns
 *     zeros from then on; callers check tc_ok() once a structure is read.
 *   - `short_read` is set (with `bad`) when the failure was running out of
 *     bytes: a page header read from a window of the file may need a
 *     larger window.
 *   - Field ids come as the protocol spells them (delta or explicit);
 *     unknown fields are skipped with tc_skip, so newer writers' additions
 *     are read past.
 */
#ifndef ACC_PARQUET_THRIFT_H
#define ACC_PARQUET_THRIFT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TC_MAX_DEPTH 32

enum tc_type {
    TC_STOP = 0,
    TC_TRUE = 1,
    TC_FALSE = 2,
    TC_BYTE = 3,
    TC_I16 = 4,
    TC_I32 = 5,
    TC_I64 = 6,
    TC_DOUBLE = 7,
    TC_BINARY = 8,
    TC_LIST = 9,
    TC_SET = 10,
    TC_MAP = 11,
    TC_STRUCT = 12,
};

typedef struct tc_cursor {
    const uint8_t *p, *end;
    int depth;
    bool bad, short_read;
} tc_cursor;

/* The field ids of one struct being read: pass one per nesting level. */
typedef struct tc_struct {
    int16_t last_id;
} tc_struct;

void tc_init(tc_cursor *c, const void *buf, size_t len);
static inline bool tc_ok(const tc_cursor *c)
{
    return !c->bad;
}
/* bytes consumed since `start` */
static inline size_t tc_used(const tc_cursor *c, const void *start)
{
    return (size_t)(c->p - (const uint8_t *)start);
}

/* Enter / leave a struct (depth-checked). */
void tc_struct_begin(tc_cursor *c, tc_struct *s);
void tc_struct_end(tc_cursor *c);
/* The next field: 1 with its id and wire type, 0 at the struct's end (or
 * on failure). */
int tc_field(tc_cursor *c, tc_struct *s, int16_t *id, int *type);

int32_t tc_i32(tc_cursor *c, int type);
int64_t tc_i64(tc_cursor *c, int type);
/* A field's boolean value: encoded in its type. */
bool tc_bool(tc_cursor *c, int type);
/* A binary / string: a pointer into the buffer and its length. */
const uint8_t *tc_binary(tc_cursor *c, int type, uint32_t *len);
/* A list header: its element type and count (bounded by the bytes left). */
uint32_t tc_list(tc_cursor *c, int type, int *elem_type);

/* Skip a value of wire type `type` (structs, lists and maps recursively). */
void tc_skip(tc_cursor *c, int type);

#endif
