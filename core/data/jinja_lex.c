/* jinja_lex: the template's tokens, as Jinja2's lexer makes them
 * (jinja_internal.h): text between tags with whitespace control, `{{ }}`
 * and `{% %}` tags with their expression tokens, comments dropped.
 * `{%-`/`{{-`/`{#-` strip the whitespace before the tag, `-%}`/`-}}`/`-#}`
 * the whitespace after it; lstrip_blocks strips spaces and tabs between a
 * line's start and a block or comment tag (not `{{`, not `{%+`);
 * trim_blocks drops the first newline after a block or comment tag (not
 * `}}`, not `+%}`). String literals are decoded with Python's escapes.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_internal.h"

typedef struct lexer {
    jj_arena *a;
    const char *src;
    size_t n, pos;
    jj_token *t;
    size_t nt, cap;
    size_t wpos; /* where(): the last position resolved, so lexing stays linear */
    int wline, wcol;
} lexer;

static void where(lexer *lx, size_t pos, int *line, int *col)
{
    int l = 1, c = 1;
    size_t i = 0;
    if (lx->wline && pos >= lx->wpos) {
        i = lx->wpos;
        l = lx->wline;
        c = lx->wcol;
    }
    for (; i < pos && i < lx->n; i++) {
        if (lx->src[i] == '\n') {
            l++;
            c = 1;
        } else {
            c++;
        }
    }
    lx->wpos = i;
    lx->wline = l;
    lx->wcol = c;
    *line = l;
    *col = c;
}

static jj_token *push(lexer *lx, int kind, size_t pos)
{
    if (lx->nt == lx->cap) {
        size_t cap = lx->cap ? lx->cap * 2 : 256;
        jj_token *t = jj_alloc(lx->a, cap * sizeof(*t));
        if (lx->nt)
            memcpy(t, lx->t, lx->nt * sizeof(*t));
        lx->t = t;
        lx->cap = cap;
    }
    jj_token *t = &lx->t[lx->nt++];
    memset(t, 0, sizeof(*t));
    t->kind = kind;
    where(lx, pos, &t->line, &t->col);
    return t;
}

static int is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static void put_utf8(char *o, size_t *k, uint32_t cp)
{
    if (cp < 0x80) {
        o[(*k)++] = (char)cp;
    } else if (cp < 0x800) {
        o[(*k)++] = (char)(0xC0 | (cp >> 6));
        o[(*k)++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        o[(*k)++] = (char)(0xE0 | (cp >> 12));
        o[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[(*k)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        o[(*k)++] = (char)(0xF0 | (cp >> 18));
        o[(*k)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        o[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[(*k)++] = (char)(0x80 | (cp & 0x3F));
    }
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* A string literal: Python's unicode-escape decoding of its body. */
static void lex_string(lexer *lx, size_t start)
{
    char q = lx->src[lx->pos++];
    size_t b = lx->pos;
    while (lx->pos < lx->n && lx->src[lx->pos] != q) {
        if (lx->src[lx->pos] == '\\')
            lx->pos++;
        lx->pos++;
    }
    if (lx->pos >= lx->n) {
        int l, c;
        where(lx, start, &l, &c);
        jj_fail(lx->a, l, c, "unterminated string literal");
    }
    size_t e = lx->pos++;
    char *o = jj_alloc(lx->a, e - b + 1);
    size_t k = 0;
    for (size_t i = b; i < e; i++) {
        char c = lx->src[i];
        if (c != '\\' || i + 1 >= e) {
            o[k++] = c;
            continue;
        }
        char x = lx->src[++i];
        int digits = 0;
        switch (x) {
        case 'n': o[k++] = '\n'; break;
        case 't': o[k++] = '\t'; break;
        case 'r': o[k++] = '\r'; break;
        case '\\': o[k++] = '\\'; break;
        case '\'': o[k++] = '\''; break;
        case '"': o[k++] = '"'; break;
        case 'a': o[k++] = '\a'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'v': o[k++] = '\v'; break;
        case '\n': break; /* line continuation */
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default:
            if (x >= '0' && x <= '7') {
                uint32_t v = 0;
                int m = 0;
                while (m < 3 && i < e && lx->src[i] >= '0' && lx->src[i] <= '7')
                    v = v * 8 + (uint32_t)(lx->src[i++] - '0'), m++;
                i--;
                put_utf8(o, &k, v);
            } else {
                o[k++] = '\\';
                o[k++] = x;
            }
        }
        if (digits) {
            uint32_t v = 0;
            for (int d = 0; d < digits; d++) {
                int h = i + 1 + (size_t)d < e ? hexval(lx->src[i + 1 + d]) : -1;
                if (h < 0) {
                    int l, cc;
                    where(lx, i, &l, &cc);
                    jj_fail(lx->a, l, cc, "truncated \\%c escape in string literal", x);
                }
                v = v * 16 + (uint32_t)h;
            }
            i += (size_t)digits;
            if (v > 0x10FFFF || (v >= 0xD800 && v < 0xE000)) {
                int l, cc;
                where(lx, i, &l, &cc);
                jj_fail(lx->a, l, cc, "escape \\%c%x in string literal is not a Unicode scalar", x, v);
            }
            put_utf8(o, &k, v);
        }
    }
    o[k] = 0;
    jj_token *t = push(lx, T_STR, start);
    t->s = o;
    t->n = k;
}

static const char *const ops2[] = {"==", "!=", "<=", ">=", "//", "**", NULL};
static const char ops1[] = "+-*/%~<>=.,:|()[]{}";

/* Tokens of one tag up to its end; the end token keeps its whitespace sign in i. */
static void lex_tag(lexer *lx, int vtag)
{
    int depth = 0;
    for (;;) {
        while (lx->pos < lx->n && is_ws(lx->src[lx->pos]))
            lx->pos++;
        size_t p = lx->pos;
        if (p >= lx->n) {
            int l, c;
            where(lx, p, &l, &c);
            jj_fail(lx->a, l, c, "unexpected end of template inside a %s tag", vtag ? "{{ }}" : "{% %}");
        }
        const char *s = lx->src + p;
        size_t left = lx->n - p;
        char close = vtag ? '}' : '%';
        if (depth == 0) {
            int sign = 0;
            size_t q = 0;
            if ((s[0] == '-' || s[0] == '+') && left >= 3 && s[1] == close && s[2] == '}')
                sign = s[0], q = 1;
            if (left >= q + 2 && s[q] == close && s[q + 1] == '}') {
                jj_token *t = push(lx, vtag ? T_VEND : T_BEND, p);
                t->i = sign;
                lx->pos = p + q + 2;
                return;
            }
        }
        char c = s[0];
        if (c == '\'' || c == '"') {
            lex_string(lx, p);
            continue;
        }
        if ((c >= '0' && c <= '9')) {
            size_t q = 0;
            int isf = 0;
            while (q < left && ((s[q] >= '0' && s[q] <= '9') || s[q] == '_'))
                q++;
            if (q + 1 < left && s[q] == '.' && s[q + 1] >= '0' && s[q + 1] <= '9') {
                isf = 1;
                q++;
                while (q < left && ((s[q] >= '0' && s[q] <= '9') || s[q] == '_'))
                    q++;
            }
            if (q < left && (s[q] == 'e' || s[q] == 'E')) {
                size_t r = q + 1;
                if (r < left && (s[r] == '+' || s[r] == '-'))
                    r++;
                if (r < left && s[r] >= '0' && s[r] <= '9') {
                    isf = 1;
                    q = r;
                    while (q < left && s[q] >= '0' && s[q] <= '9')
                        q++;
                }
            }
            char buf[64];
            size_t k = 0;
            for (size_t i = 0; i < q && k < sizeof(buf) - 1; i++)
                if (s[i] != '_')
                    buf[k++] = s[i];
            buf[k] = 0;
            jj_token *t = push(lx, isf ? T_FLOAT : T_INT, p);
            if (isf) {
                t->f = strtod(buf, NULL);
            } else {
                errno = 0;
                t->i = strtoll(buf, NULL, 10);
                if (errno)
                    jj_fail(lx->a, t->line, t->col, "integer literal %s is out of range", buf);
            }
            lx->pos = p + q;
            continue;
        }
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
            size_t q = 0;
            while (q < left && ((s[q] >= 'a' && s[q] <= 'z') || (s[q] >= 'A' && s[q] <= 'Z') ||
                                (s[q] >= '0' && s[q] <= '9') || s[q] == '_'))
                q++;
            jj_token *t = push(lx, T_NAME, p);
            t->s = jj_strndup(lx->a, s, q);
            t->n = q;
            lx->pos = p + q;
            continue;
        }
        int done = 0;
        for (int i = 0; ops2[i]; i++)
            if (left >= 2 && memcmp(s, ops2[i], 2) == 0) {
                jj_token *t = push(lx, T_OP, p);
                t->s = ops2[i];
                t->n = 2;
                lx->pos = p + 2;
                done = 1;
                break;
            }
        if (done)
            continue;
        const char *o = strchr(ops1, c);
        if (c && o) {
            jj_token *t = push(lx, T_OP, p);
            t->s = jj_strndup(lx->a, s, 1);
            t->n = 1;
            lx->pos = p + 1;
            if (c == '(' || c == '[' || c == '{')
                depth++;
            else if ((c == ')' || c == ']' || c == '}') && depth > 0)
                depth--;
            continue;
        }
        int l, cc;
        where(lx, p, &l, &cc);
        jj_fail(lx->a, l, cc, "unexpected character '%c' in a tag", c);
    }
}

static void push_text(lexer *lx, size_t start, const char *s, size_t n)
{
    if (n == 0)
        return;
    jj_token *t = push(lx, T_TEXT, start);
    t->s = s;
    t->n = n;
}

static void lex_all(lexer *lx)
{
    int line_starting = 1;
    int strip_next = 0; /* the previous tag ended with '-' */
    while (lx->pos < lx->n) {
        size_t b = lx->pos, k = b;
        while (k + 1 < lx->n && !(lx->src[k] == '{' &&
                                  (lx->src[k + 1] == '{' || lx->src[k + 1] == '%' || lx->src[k + 1] == '#')))
            k++;
        if (k + 1 >= lx->n)
            k = lx->n;
        const char *text = lx->src + b;
        size_t tn = k - b;
        if (strip_next) {
            while (tn && is_ws(*text))
                text++, tn--, b++;
            strip_next = 0;
        }
        if (k >= lx->n) {
            push_text(lx, b, text, tn);
            break;
        }
        char kind = lx->src[k + 1];
        char sign = k + 2 < lx->n ? lx->src[k + 2] : 0;
        if (sign != '-' && sign != '+')
            sign = 0;
        if (sign == '-') {
            while (tn && is_ws(text[tn - 1]))
                tn--;
        } else if (sign != '+' && kind != '{') {
            size_t lp = tn;
            while (lp && text[lp - 1] != '\n')
                lp--;
            if (lp > 0 || line_starting) {
                size_t q = lp;
                while (q < tn && is_ws(text[q]))
                    q++;
                if (q == tn)
                    tn = lp;
            }
        }
        push_text(lx, b, text, tn);
        lx->pos = k + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            size_t q = lx->pos;
            while (q + 1 < lx->n && !(lx->src[q] == '#' && lx->src[q + 1] == '}'))
                q++;
            if (q + 1 >= lx->n) {
                int l, c;
                where(lx, k, &l, &c);
                jj_fail(lx->a, l, c, "unterminated comment");
            }
            int minus = q > lx->pos && lx->src[q - 1] == '-';
            lx->pos = q + 2;
            if (minus)
                strip_next = 1;
            else if (lx->pos < lx->n && lx->src[lx->pos] == '\n')
                lx->pos++;
        } else {
            int vtag = kind == '{';
            /* {% raw %} is refused by the parser as an unknown statement */
            push(lx, vtag ? T_VBEGIN : T_BBEGIN, k);
            lex_tag(lx, vtag);
            int esign = (int)lx->t[lx->nt - 1].i;
            if (esign == '-')
                strip_next = 1;
            else if (!vtag && esign != '+' && lx->pos < lx->n && lx->src[lx->pos] == '\n')
                lx->pos++;
        }
        line_starting = lx->pos > 0 && lx->src[lx->pos - 1] == '\n';
        if (strip_next) {
            /* Jinja2's `-%}\s*` consumes the whitespace, so the line starts there */
            size_t q = lx->pos;
            while (q < lx->n && is_ws(lx->src[q]))
                q++;
            line_starting = q > 0 && lx->src[q - 1] == '\n';
        }
    }
    push(lx, T_EOF, lx->n);
}


void jj_lex(jj_arena *a, const char *src, size_t n, jj_token **tokens, size_t *ntokens)
{
    lexer lx = {.a = a, .src = src, .n = n};
    lex_all(&lx);
    *tokens = lx.t;
    *ntokens = lx.nt;
}

