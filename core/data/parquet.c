/* parquet: footer, schema and rows (parquet.h); pages in parquet_page.c. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checked.h"
#include "parquet_internal.h"
#include "parquet_thrift.h"

#define UNSUPPORTED_SHAPE "a shape other than a value, a struct of values or a list of those"

enum { REP_REQUIRED = 0, REP_OPTIONAL = 1, REP_REPEATED = 2 };
enum { CONV_LIST = 3 };
/* the shapes of a top-level column that become JSON */
enum { COL_PRIM, COL_STRUCT, COL_LIST_PRIM, COL_LIST_STRUCT };

typedef struct pq_node {
    char name[PQ_MAX_NAME];
    int type;           /* physical type; -1 for a group */
    int repetition, nchildren, converted;
    bool logical_list;
    int first_child, next_sibling; /* -1: none */
    int leaf;           /* its index in r->leaves; -1 for a group */
    int def, rep;       /* levels at this node (counting it) */
} pq_node;

typedef struct pq_column {
    char name[PQ_MAX_NAME];
    int kind;
    int d_col, d_rep, d_elem; /* def at which: the column is not null, a list has an
                                 element, the element is not null */
    int first_leaf, nleaves;  /* in r->leaves */
    bool selected;
} pq_column;

struct pq_reader {
    pq_file f;
    char name[PQ_MAX_NAME], field[64];
    int64_t size, footer_at;
    int64_t nrows, rows_read;
    pq_node *nodes;
    int nnodes;
    pq_leaf *leaves;   /* every primitive column, in file (chunk) order */
    int nleaves;
    pq_column *cols;
    int ncols;
    /* row groups: rows, and the chunk of each leaf */
    int nrg;
    int64_t *rg_rows;
    pq_chunk *chunks;  /* [nrg * nleaves] */
    int rg;            /* the row group being read; -1 before the first */
    int64_t rg_left;   /* its rows not yet read */
};

static int fail(const pq_reader *r, acc_err *err, const char *what)
{
    return acc_err_set(err, ACC_EINVAL, r->f.field, "%s: %s", r->f.name, what);
}

/* ---- the footer: FileMetaData ------------------------------------------------ */

static void copy_name(char *dst, const uint8_t *s, uint32_t n)
{
    size_t k = n < PQ_MAX_NAME - 1 ? n : PQ_MAX_NAME - 1;
    memcpy(dst, s, k);
    dst[k] = '\0';
}

static void read_schema_element(tc_cursor *c, pq_node *n)
{
    tc_struct s;
    int16_t id;
    int t;
    memset(n, 0, sizeof *n);
    n->type = -1;
    n->converted = -1;
    tc_struct_begin(c, &s);
    while (tc_field(c, &s, &id, &t)) {
        if (id == 1) {
            n->type = tc_i32(c, t);
        } else if (id == 3) {
            n->repetition = tc_i32(c, t);
        } else if (id == 4) {
            uint32_t len;
            const uint8_t *p = tc_binary(c, t, &len);
            if (p != NULL)
                copy_name(n->name, p, len);
        } else if (id == 5) {
            n->nchildren = tc_i32(c, t);
        } else if (id == 6) {
            n->converted = tc_i32(c, t);
        } else if (id == 10 && t == TC_STRUCT) { /* LogicalType: a union; field 3 is LIST */
            tc_struct u;
            int16_t uid;
            int ut;
            tc_struct_begin(c, &u);
            while (tc_field(c, &u, &uid, &ut)) {
                n->logical_list |= uid == 3;
                tc_skip(c, ut);
            }
            tc_struct_end(c);
        } else {
            tc_skip(c, t);
        }
    }
    tc_struct_end(c);
}

typedef struct col_meta {
    int type, codec;
    int64_t data_off, dict_off, csize;
    bool has_meta, external;
} col_meta;

static void read_column_meta(tc_cursor *c, col_meta *m)
{
    tc_struct s;
    int16_t id;
    int t;
    tc_struct_begin(c, &s);
    while (tc_field(c, &s, &id, &t)) {
        if (id == 1)
            m->type = tc_i32(c, t);
        else if (id == 4)
            m->codec = tc_i32(c, t);
        else if (id == 7)
            m->csize = tc_i64(c, t);
        else if (id == 9)
            m->data_off = tc_i64(c, t);
        else if (id == 11)
            m->dict_off = tc_i64(c, t);
        else
            tc_skip(c, t);
    }
    tc_struct_end(c);
    m->has_meta = true;
}

static void read_column_chunk(tc_cursor *c, col_meta *m)
{
    tc_struct s;
    int16_t id;
    int t;
    memset(m, 0, sizeof *m);
    tc_struct_begin(c, &s);
    while (tc_field(c, &s, &id, &t)) {
        if (id == 1)
            m->external = true, tc_skip(c, t);
        else if (id == 3 && t == TC_STRUCT)
            read_column_meta(c, m);
        else
            tc_skip(c, t);
    }
    tc_struct_end(c);
}

/* A row group's chunk of leaf k: checked to lie inside the file's data. */
static int place_chunk(pq_reader *r, int g, int k, const col_meta *m, acc_err *err)
{
    pq_leaf *l = &r->leaves[k];
    if (!m->has_meta || m->external)
        return acc_err_set(err, ACC_EINVAL, r->f.field, "%s: row group %d, column %s: %s", r->f.name, g, l->path,
                           m->external ? "its data is in another file" : "no column metadata");
    int64_t start = m->dict_off > 0 && m->dict_off < m->data_off ? m->dict_off : m->data_off, end;
    if (m->type != l->type || start < 4 || m->csize < 0 || __builtin_add_overflow(start, m->csize, &end) ||
        end > r->footer_at)
        return acc_err_set(err, ACC_EINVAL, r->f.field, "%s: row group %d, column %s: %s", r->f.name, g, l->path,
                           m->type != l->type ? "its type differs from the schema's"
                                              : "its bytes lie outside the file's data");
    r->chunks[(size_t)g * (size_t)r->nleaves + (size_t)k] = (pq_chunk){start, m->csize, m->codec};
    return 0;
}

static int read_row_group(pq_reader *r, tc_cursor *c, int g, acc_err *err)
{
    tc_struct s;
    int16_t id;
    int t, ncc = -1;
    tc_struct_begin(c, &s);
    while (tc_field(c, &s, &id, &t)) {
        if (id == 1 && t == TC_LIST) {
            int et;
            uint32_t n = tc_list(c, t, &et);
            if (!tc_ok(c) || et != TC_STRUCT || n != (uint32_t)r->nleaves) {
                char what[128];
                snprintf(what, sizeof what, "row group %d has %u column chunks, the schema %d columns", g, n,
                         r->nleaves);
                return fail(r, err, tc_ok(c) ? what : "a damaged footer");
            }
            for (uint32_t k = 0; k < n && tc_ok(c); k++) {
                col_meta m;
                read_column_chunk(c, &m);
                if (tc_ok(c) && place_chunk(r, g, (int)k, &m, err) != 0)
                    return ACC_EINVAL;
            }
            ncc = (int)n;
        } else if (id == 3) {
            r->rg_rows[g] = tc_i64(c, t);
        } else {
            tc_skip(c, t);
        }
    }
    tc_struct_end(c);
    if (!tc_ok(c))
        return fail(r, err, "a damaged footer (row groups)");
    if (ncc < 0 || r->rg_rows[g] < 0)
        return fail(r, err, "a row group without its columns or row count");
    return 0;
}

static int read_schema(pq_reader *r, tc_cursor *c, int t, acc_err *err)
{
    int et;
    uint32_t n = tc_list(c, t, &et);
    if (!tc_ok(c) || et != TC_STRUCT || n < 1 || n > PQ_MAX_SCHEMA)
        return fail(r, err, "a damaged footer (schema)");
    r->nodes = calloc(n, sizeof *r->nodes);
    if (r->nodes == NULL)
        return acc_err_set(err, ACC_ENOMEM, r->f.field, "out of memory");
    r->nnodes = (int)n;
    for (uint32_t k = 0; k < n && tc_ok(c); k++)
        read_schema_element(c, &r->nodes[k]);
    return tc_ok(c) ? 0 : fail(r, err, "a damaged footer (schema)");
}

/* ---- the schema tree ----------------------------------------------------------- */

/* Give each node its children and levels, depth first as the footer lists
 * them (pre-order); number the leaves in that order (the chunks' order). */
static int link_node(pq_reader *r, int *cur, int def, int rep, int depth, acc_err *err)
{
    int idx = (*cur)++;
    if (idx >= r->nnodes || depth > 64)
        return fail(r, err, "a damaged schema (more children than elements)");
    pq_node *n = &r->nodes[idx];
    if (n->nchildren < 0 || n->nchildren > r->nnodes)
        return fail(r, err, "a damaged schema (children)");
    if (idx > 0) {
        if (n->repetition < REP_REQUIRED || n->repetition > REP_REPEATED)
            return fail(r, err, "a damaged schema (repetition)");
        def += n->repetition != REP_REQUIRED;
        rep += n->repetition == REP_REPEATED;
    }
    n->def = def;
    n->rep = rep;
    n->first_child = n->next_sibling = n->leaf = -1;
    if (n->nchildren == 0) {
        if (idx == 0 || n->type < PQ_BOOLEAN || n->type > PQ_FIXED)
            return fail(r, err, "a damaged schema (a column without a type)");
        n->leaf = r->nleaves++;
        return 0;
    }
    int prev = -1;
    for (int k = 0; k < n->nchildren; k++) {
        int c = *cur;
        int rc = link_node(r, cur, def, rep, depth + 1, err);
        if (rc != 0)
            return rc;
        if (prev < 0)
            r->nodes[idx].first_child = c;
        else
            r->nodes[prev].next_sibling = c;
        prev = c;
    }
    return 0;
}

static bool leaf_type_ok(int type)
{
    return type != PQ_INT96 && type != PQ_FIXED;
}

/* a group whose children are all primitive, not repeated, of types we read */
static bool flat_struct(const pq_reader *r, const pq_node *g)
{
    if (g->nchildren == 0)
        return false;
    for (int c = g->first_child; c >= 0; c = r->nodes[c].next_sibling) {
        const pq_node *n = &r->nodes[c];
        if (n->nchildren != 0 || n->repetition == REP_REPEATED || !leaf_type_ok(n->type))
            return false;
    }
    return true;
}

/* a list's element node e (primitive or flat struct) */
static bool list_of(pq_reader *r, pq_column *col, const pq_node *e)
{
    col->d_elem = e->def;
    if (e->nchildren == 0) {
        col->kind = COL_LIST_PRIM;
        return leaf_type_ok(e->type);
    }
    col->kind = COL_LIST_STRUCT;
    return flat_struct(r, e);
}

/* The JSON shape of top-level node t (the names of Parquet's list rules:
 * a LIST group holds one repeated node; a repeated group of one child named
 * other than "array" / "<list>_tuple" holds the element (3 levels), else
 * is the element (2 levels)). */
static bool classify(pq_reader *r, const pq_node *t, pq_column *col)
{
    col->d_col = t->def;
    if (t->nchildren == 0 && t->repetition == REP_REPEATED) { /* a bare repeated primitive */
        col->d_col = t->def - 1;
        col->d_rep = t->def;
        return list_of(r, col, t);
    }
    if (t->nchildren == 0) {
        col->kind = COL_PRIM;
        return leaf_type_ok(t->type);
    }
    if (t->repetition == REP_REPEATED) { /* a bare repeated group: a list of it */
        col->d_col = t->def - 1;
        col->d_rep = t->def;
        return list_of(r, col, t);
    }
    if (t->converted == CONV_LIST || t->logical_list) {
        if (t->nchildren != 1)
            return false;
        const pq_node *rp = &r->nodes[t->first_child];
        if (rp->repetition != REP_REPEATED)
            return false;
        col->d_rep = rp->def;
        if (rp->nchildren == 1 && strcmp(rp->name, "array") != 0) {
            char tuple[PQ_MAX_NAME + 8];
            snprintf(tuple, sizeof tuple, "%s_tuple", t->name);
            if (strcmp(rp->name, tuple) != 0)
                return list_of(r, col, &r->nodes[rp->first_child]);
        }
        return list_of(r, col, rp);
    }
    col->kind = COL_STRUCT;
    return flat_struct(r, t);
}

/* the leaves under node i, in order */
static void leaf_range(const pq_reader *r, int i, int *first, int *count)
{
    const pq_node *n = &r->nodes[i];
    if (n->nchildren == 0) {
        if (*first < 0)
            *first = n->leaf;
        (*count)++;
        return;
    }
    for (int c = n->first_child; c >= 0; c = r->nodes[c].next_sibling)
        leaf_range(r, c, first, count);
}

static void leaf_path(const pq_reader *r, int i, const char *prefix, pq_leaf *leaves)
{
    const pq_node *n = &r->nodes[i];
    char p[PQ_MAX_NAME];
    size_t a = strlen(prefix), b = strlen(n->name);
    if (a + 1 + b >= sizeof p) /* a path too long for messages: cut */
        b = a + 1 >= sizeof p ? 0 : sizeof p - 2 - a;
    if (a >= sizeof p - 1)
        a = sizeof p - 2;
    memcpy(p, prefix, a);
    p[a] = '.';
    memcpy(p + (a ? a + 1 : 0), n->name, b);
    p[(a ? a + 1 : 0) + b] = '\0';
    if (n->nchildren == 0) {
        pq_leaf *l = &leaves[n->leaf];
        snprintf(l->path, sizeof l->path, "%s", p);
        l->field_name = n->name;
        l->type = n->type;
        l->max_def = n->def;
        l->max_rep = n->rep;
        return;
    }
    for (int c = n->first_child; c >= 0; c = r->nodes[c].next_sibling)
        leaf_path(r, c, p, leaves);
}

static int build_columns(pq_reader *r, acc_err *err)
{
    int cur = 0;
    int rc = link_node(r, &cur, 0, 0, 0, err);
    if (rc != 0)
        return rc;
    if (cur != r->nnodes)
        return fail(r, err, "a damaged schema (elements left over)");
    const pq_node *root = &r->nodes[0];
    r->leaves = calloc((size_t)r->nleaves + 1, sizeof *r->leaves);
    r->cols = calloc((size_t)root->nchildren + 1, sizeof *r->cols);
    if (r->leaves == NULL || r->cols == NULL)
        return acc_err_set(err, ACC_ENOMEM, r->f.field, "out of memory");
    for (int c = root->first_child; c >= 0; c = r->nodes[c].next_sibling) {
        leaf_path(r, c, "", r->leaves);
        pq_column *col = &r->cols[r->ncols];
        memset(col, 0, sizeof *col);
        if (!classify(r, &r->nodes[c], col))
            continue; /* left out; pq_column_unsupported says why */
        snprintf(col->name, sizeof col->name, "%s", r->nodes[c].name);
        col->first_leaf = -1;
        leaf_range(r, c, &col->first_leaf, &col->nleaves);
        col->selected = true;
        r->ncols++;
    }
    return 0;
}

/* ---- opening ------------------------------------------------------------------- */

static int read_footer(pq_reader *r, const uint8_t *buf, uint32_t len, acc_err *err)
{
    tc_cursor c;
    tc_struct s;
    int16_t id;
    int t, rc;
    bool schema = false;
    tc_init(&c, buf, len);
    tc_struct_begin(&c, &s);
    while (tc_field(&c, &s, &id, &t)) {
        if (id == 2 && t == TC_LIST && !schema) {
            if ((rc = read_schema(r, &c, t, err)) != 0 || (rc = build_columns(r, err)) != 0)
                return rc;
            schema = true;
        } else if (id == 3) {
            r->nrows = tc_i64(&c, t);
        } else if (id == 4 && t == TC_LIST && schema && r->rg_rows == NULL) {
            int et;
            uint32_t n = tc_list(&c, t, &et);
            if (!tc_ok(&c) || et != TC_STRUCT || n > (uint32_t)INT32_MAX)
                return fail(r, err, "a damaged footer (row groups)");
            uint64_t cells;
            if (acc_mul_u64(n, (uint64_t)r->nleaves, &cells) || cells > len) /* each chunk takes bytes */
                return fail(r, err, "a damaged footer (row groups)");
            r->nrg = (int)n;
            r->rg_rows = calloc((size_t)n + 1, sizeof *r->rg_rows);
            r->chunks = calloc((size_t)cells + 1, sizeof *r->chunks);
            if (r->rg_rows == NULL || r->chunks == NULL)
                return acc_err_set(err, ACC_ENOMEM, r->f.field, "out of memory");
            for (uint32_t g = 0; g < n; g++)
                if ((rc = read_row_group(r, &c, (int)g, err)) != 0)
                    return rc;
        } else {
            tc_skip(&c, t);
        }
    }
    tc_struct_end(&c);
    if (!tc_ok(&c) || !schema)
        return fail(r, err, "a damaged footer");
    int64_t sum = 0;
    for (int g = 0; g < r->nrg; g++)
        if (__builtin_add_overflow(sum, r->rg_rows[g], &sum))
            return fail(r, err, "a damaged footer (row counts)");
    if (sum != r->nrows || r->nrows < 0)
        return fail(r, err, "a damaged footer (the row groups' rows do not add up to the file's)");
    return 0;
}

bool pq_fd_is_parquet(int fd)
{
    struct stat st;
    uint8_t a[4], b[4];
    return fstat(fd, &st) == 0 && st.st_size >= 12 && pread(fd, a, 4, 0) == 4 &&
           pread(fd, b, 4, st.st_size - 4) == 4 && memcmp(a, "PAR1", 4) == 0 && memcmp(b, "PAR1", 4) == 0;
}

int pq_open(int fd, const char *name, const char *field, pq_reader **out, acc_err *err)
{
    *out = NULL;
    pq_reader *r = calloc(1, sizeof *r);
    if (r == NULL) {
        close(fd);
        return acc_err_set(err, ACC_ENOMEM, field, "out of memory");
    }
    snprintf(r->name, sizeof r->name, "%s", name);
    snprintf(r->field, sizeof r->field, "%s", field);
    r->f = (pq_file){fd, r->name, r->field};
    r->rg = -1;
    struct stat st;
    uint8_t tail[8], head[4];
    int rc;
    if (fstat(fd, &st) != 0 || st.st_size < 12 || pread(fd, head, 4, 0) != 4 ||
        pread(fd, tail, 8, st.st_size - 8) != 8 || memcmp(head, "PAR1", 4) != 0 || memcmp(tail + 4, "PAR1", 4) != 0) {
        rc = fail(r, err, "not a Parquet file (no PAR1 at its start and end)");
        goto out;
    }
    r->size = st.st_size;
    uint32_t flen = (uint32_t)tail[0] | (uint32_t)tail[1] << 8 | (uint32_t)tail[2] << 16 | (uint32_t)tail[3] << 24;
    if (flen == 0 || flen > PQ_MAX_FOOTER || (int64_t)flen > r->size - 12) {
        rc = fail(r, err, "a footer length out of range");
        goto out;
    }
    r->footer_at = r->size - 8 - flen;
    uint8_t *buf = malloc(flen);
    if (buf == NULL) {
        rc = acc_err_set(err, ACC_ENOMEM, field, "out of memory");
        goto out;
    }
    if (pread(fd, buf, flen, r->footer_at) != (ssize_t)flen)
        rc = fail(r, err, "cannot read the footer");
    else
        rc = read_footer(r, buf, flen, err);
    free(buf);
out:
    if (rc != 0) {
        pq_close(r);
        return rc;
    }
    *out = r;
    return 0;
}

void pq_close(pq_reader *r)
{
    if (r == NULL)
        return;
    if (r->f.fd >= 0)
        close(r->f.fd);
    for (int k = 0; r->leaves != NULL && k < r->nleaves; k++)
        pq_leaf_free(&r->leaves[k]);
    free(r->leaves);
    free(r->cols);
    free(r->nodes);
    free(r->rg_rows);
    free(r->chunks);
    free(r);
}

int64_t pq_num_rows(const pq_reader *r)
{
    return r->nrows;
}

int64_t pq_rows_read(const pq_reader *r)
{
    return r->rows_read;
}

bool pq_has_column(const pq_reader *r, const char *name)
{
    for (int i = 0; i < r->ncols; i++)
        if (strcmp(r->cols[i].name, name) == 0)
            return true;
    return false;
}

const char *pq_column_unsupported(const pq_reader *r, const char *name)
{
    for (int c = r->nodes[0].first_child; c >= 0; c = r->nodes[c].next_sibling) {
        pq_column tmp;
        memset(&tmp, 0, sizeof tmp);
        if (strcmp(r->nodes[c].name, name) == 0 && !classify((pq_reader *)r, &r->nodes[c], &tmp))
            return UNSUPPORTED_SHAPE;
    }
    return NULL;
}

void pq_select(pq_reader *r, const char *const *names)
{
    for (int i = 0; i < r->ncols; i++) {
        r->cols[i].selected = false;
        for (int k = 0; names != NULL && names[k] != NULL; k++)
            r->cols[i].selected |= strcmp(r->cols[i].name, names[k]) == 0;
    }
}

/* ---- rows ------------------------------------------------------------------------ */

static int start_row_group(pq_reader *r, acc_err *err)
{
    (void)err;
    r->rg++;
    r->rg_left = r->rg_rows[r->rg];
    for (int k = 0; k < r->nleaves; k++) {
        pq_leaf *l = &r->leaves[k];
        pq_leaf_reset(l);
        const pq_chunk *c = &r->chunks[(size_t)r->rg * (size_t)r->nleaves + (size_t)k];
        l->rg = r->rg;
        l->pos = c->start;
        l->end = c->start + c->len;
        l->codec = c->codec;
    }
    return 0;
}

/* an entry ready in the leaf's page: 0, 1 at the chunk's end, or an error */
static int leaf_ready(pq_reader *r, pq_leaf *l, acc_err *err)
{
    while (l->i >= l->n) {
        int rc = pq_page_next(&r->f, l, err);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* The next entry: its levels and, at the maximum definition, its value. */
static int leaf_next(pq_reader *r, pq_leaf *l, uint32_t *rep, uint32_t *def, pq_value *v, acc_err *err)
{
    int rc = leaf_ready(r, l, err);
    if (rc == 1)
        return pq_leaf_fail(&r->f, l, err, "the column ends before the row group's %lld rows",
                            (long long)r->rg_rows[r->rg]);
    if (rc != 0)
        return rc;
    *rep = l->rep[l->i];
    *def = l->def[l->i];
    l->i++;
    if (*def == (uint32_t)l->max_def) {
        if (l->vi >= l->nn)
            return pq_leaf_fail(&r->f, l, err, "fewer values than the levels say");
        *v = l->vals[l->vi++];
    }
    return 0;
}

static json_t *value_json(const pq_leaf *l, const pq_value *v)
{
    switch (l->type) {
    case PQ_BOOLEAN:
        return json_boolean(v->i);
    case PQ_INT32:
    case PQ_INT64:
        return json_integer((json_int_t)v->i);
    case PQ_FLOAT:
    case PQ_DOUBLE:
        return isfinite(v->d) ? json_real(v->d) : json_null();
    default:
        return json_stringn((const char *)v->s.p, v->s.n); /* NULL when not UTF-8 */
    }
}

/* the JSON of one entry of a leaf: its value or null */
static int entry_json(pq_reader *r, pq_leaf *l, uint32_t def, const pq_value *v, json_t **out, acc_err *err)
{
    *out = def == (uint32_t)l->max_def ? value_json(l, v) : json_null();
    if (*out == NULL)
        return l->type == PQ_BYTE_ARRAY ? pq_leaf_fail(&r->f, l, err, "a string that is not UTF-8")
                                        : acc_err_set(err, ACC_ENOMEM, r->f.field, "out of memory");
    return 0;
}

/* One entry of every leaf of a column (a struct's fields, or one field):
 * the levels of the first, checked equal in the others up to the element;
 * `obj` (a struct, or NULL) gets the fields. */
static int entry_all(pq_reader *r, const pq_column *col, uint32_t *rep, uint32_t *def, json_t **one, json_t *obj,
                     acc_err *err)
{
    for (int k = 0; k < col->nleaves; k++) {
        pq_leaf *l = &r->leaves[col->first_leaf + k];
        uint32_t rp = 0, d = 0;
        pq_value v = {.i = 0};
        int rc = leaf_next(r, l, &rp, &d, &v, err);
        if (rc != 0)
            return rc;
        uint32_t cap = (uint32_t)col->d_elem;
        if (k == 0) {
            *rep = rp;
            *def = d;
        } else if (rp != *rep || (d < cap ? d : cap) != (*def < cap ? *def : cap)) {
            return pq_leaf_fail(&r->f, l, err, "its levels disagree with column %s's",
                                r->leaves[col->first_leaf].path);
        }
        json_t *j;
        if ((rc = entry_json(r, l, d, &v, &j, err)) != 0)
            return rc;
        if (obj != NULL)
            json_object_set_new(obj, l->field_name, j);
        else
            *one = j;
    }
    return 0;
}

/* one list element (its entries read): null, a value, or a struct */
static int list_element(pq_reader *r, const pq_column *col, uint32_t *rep, uint32_t *def, json_t **el, acc_err *err)
{
    json_t *obj = col->kind == COL_LIST_STRUCT ? json_object() : NULL;
    if (col->kind == COL_LIST_STRUCT && obj == NULL)
        return acc_err_set(err, ACC_ENOMEM, r->f.field, "out of memory");
    *el = NULL;
    int rc = entry_all(r, col, rep, def, el, obj, err);
    if (rc != 0) {
        json_decref(obj);
        json_decref(*el);
        *el = NULL;
        return rc;
    }
    if (obj != NULL) {
        if (*def < (uint32_t)col->d_elem) { /* a null struct */
            json_decref(obj);
            obj = json_null();
        }
        *el = obj;
    }
    return 0;
}

static int column_list(pq_reader *r, const pq_column *col, json_t **out, acc_err *err)
{
    uint32_t rep = 0, def = 0;
    json_t *el, *arr = json_array();
    if (arr == NULL)
        return acc_err_set(err, ACC_ENOMEM, r->f.field, "out of memory");
    int rc = list_element(r, col, &rep, &def, &el, err);
    if (rc == 0 && rep != 0)
        rc = pq_leaf_fail(&r->f, &r->leaves[col->first_leaf], err, "a row that does not start at level 0");
    if (rc == 0 && def < (uint32_t)col->d_rep) { /* null or empty: one entry for the row */
        json_decref(el);
        json_decref(arr);
        *out = def < (uint32_t)col->d_col ? json_null() : json_array();
        return 0;
    }
    while (rc == 0) {
        json_array_append_new(arr, el);
        pq_leaf *l = &r->leaves[col->first_leaf];
        int more = leaf_ready(r, l, err);
        if (more < 0 || more > 1) {
            rc = more;
            break;
        }
        if (more == 1 || l->rep[l->i] == 0) /* the chunk ends, or the next row starts */
            break;
        rc = list_element(r, col, &rep, &def, &el, err);
        if (rc == 0 && def < (uint32_t)col->d_rep) {
            json_decref(el);
            rc = pq_leaf_fail(&r->f, l, err, "an empty list inside a list");
        }
    }
    if (rc != 0) {
        json_decref(arr);
        return rc;
    }
    *out = arr;
    return 0;
}

static int column_json(pq_reader *r, const pq_column *col, json_t **out, acc_err *err)
{
    uint32_t rep = 0, def = 0;
    if (col->kind == COL_LIST_PRIM || col->kind == COL_LIST_STRUCT)
        return column_list(r, col, out, err);
    json_t *obj = col->kind == COL_STRUCT ? json_object() : NULL;
    if (col->kind == COL_STRUCT && obj == NULL)
        return acc_err_set(err, ACC_ENOMEM, r->f.field, "out of memory");
    *out = NULL;
    int rc = entry_all(r, col, &rep, &def, out, obj, err);
    if (rc != 0) {
        json_decref(obj);
        return rc;
    }
    if (obj != NULL) {
        if (def < (uint32_t)col->d_col) {
            json_decref(obj);
            obj = json_null();
        }
        *out = obj;
    }
    return 0;
}

int pq_next(pq_reader *r, json_t **row, acc_err *err)
{
    *row = NULL;
    while (r->rg < 0 || r->rg_left == 0) {
        if (r->rg + 1 >= r->nrg)
            return ACC_ENOTFOUND;
        int rc = start_row_group(r, err);
        if (rc != 0)
            return rc;
    }
    json_t *o = json_object();
    if (o == NULL)
        return acc_err_set(err, ACC_ENOMEM, r->f.field, "out of memory");
    for (int i = 0; i < r->ncols; i++) {
        if (!r->cols[i].selected)
            continue;
        json_t *v = NULL;
        int rc = column_json(r, &r->cols[i], &v, err);
        if (rc != 0) {
            json_decref(o);
            return rc;
        }
        json_object_set_new(o, r->cols[i].name, v);
    }
    r->rg_left--;
    r->rows_read++;
    *row = o;
    return 0;
}
