/* tok_internal: the parts of the tokenizer shared by tok.c (loading, the
 * pipeline, decoding), tok_bpe.c (the BPE model and its hash maps) and
 * tok_text.c (UTF-8, byte-level mapping, normalizers, pre-tokenizers).
 * Not a public interface: tok.h is.
 */
#ifndef ACC_TOK_INTERNAL_H
#define ACC_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tok.h"

/* ---- byte strings */
typedef struct tok_buf {
    char *s;
    size_t n, cap;
} tok_buf;
int tok_buf_put(tok_buf *b, const char *s, size_t n);
void tok_buf_free(tok_buf *b);

#define TOK_CHAR_IDS 0x10000   /* single characters looked up by table */

/* ---- UTF-8 */
/* Length of the UTF-8 sequence starting at s[i] (1..4; 1 for a stray byte). */
size_t tok_utf8_len(const unsigned char *s, size_t i, size_t n);
/* Offset of the first invalid byte, or n when s is valid UTF-8. */
size_t tok_utf8_invalid(const unsigned char *s, size_t n);
/* Append s, replacing each maximal invalid subsequence with U+FFFD (Rust's
 * String::from_utf8_lossy). */
int tok_utf8_lossy(tok_buf *out, const unsigned char *s, size_t n);

/* ---- GPT-2's byte-level alphabet: byte -> code point (as UTF-8), back */
typedef struct tok_byte_table {
    char s[256][2];
    uint8_t len[256];
    int16_t back[324];          /* code point -> byte, -1 when not one */
} tok_byte_table;
void tok_byte_table_init(tok_byte_table *tb);

/* ---- string -> id map (open addressing; keys are the id's token string) */
typedef struct tok_strmap {
    int32_t *slot;              /* id, or -1 */
    size_t mask;
} tok_strmap;

/* ---- pair -> (rank, merged id) map for BPE merges */
typedef struct tok_pair_slot {
    uint64_t key;               /* (a << 32 | b) + 1; 0 = empty */
    uint32_t rank;
    int32_t merged;
} tok_pair_slot;                /* one probe, one cache line */
typedef struct tok_pairmap {
    tok_pair_slot *slot;
    size_t mask, n;
} tok_pairmap;
int tok_pairmap_init(tok_pairmap *m, size_t n);
void tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, uint32_t rank, int32_t merged);
/* 1 and (*rank, *merged) when the pair merges, else 0. */
int tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b, uint32_t *rank, int32_t *merged);
void tok_pairmap_free(tok_pairmap *m);

/* ---- components */
enum tok_norm_kind {
    TN_NFC, TN_NFD, TN_NFKC, TN_NFKD, TN_LOWERCASE, TN_PREPEND, TN_REPLACE, TN_STRIP, TN_SEQUENCE
};
typedef struct tok_norm {
    int kind;
    char *a; size_t alen;       /* Prepend: prefix; Replace: string pattern */
    char *b; size_t blen;       /* Replace: content */
    pcre2_code *re;             /* Replace with a Regex pattern */
    bool left, right;           /* Strip */
    struct tok_norm *sub; int nsub;
} tok_norm;

enum tok_split_behavior {
    TS_REMOVED, TS_ISOLATED, TS_MERGED_PREV, TS_MERGED_NEXT, TS_CONTIGUOUS
};
enum tok_pre_kind { TP_SPLIT, TP_BYTELEVEL, TP_METASPACE, TP_DIGITS, TP_WSSPLIT, TP_SEQUENCE };
enum tok_prepend { TPS_ALWAYS, TPS_FIRST, TPS_NEVER };
typedef struct tok_pre {
    int kind;
    pcre2_code *re;             /* Split (regex), ByteLevel use_regex, WhitespaceSplit */
    char *str; size_t slen;     /* Split with a String pattern */
    int behavior;
    bool invert;
    bool add_prefix_space, use_regex; /* ByteLevel */
    char repl[8]; size_t repl_len; /* Metaspace replacement */
    int prepend_scheme;         /* Metaspace */
    bool split;                 /* Metaspace */
    bool individual_digits;     /* Digits */
    struct tok_pre *sub; int nsub;
} tok_pre;

enum tok_dec_kind { TD_BYTELEVEL, TD_METASPACE, TD_REPLACE, TD_BYTEFALLBACK, TD_FUSE, TD_STRIP, TD_SEQUENCE };
typedef struct tok_dec {
    int kind;
    char *a; size_t alen;       /* Replace pattern; Strip content; Metaspace replacement */
    char *b; size_t blen;       /* Replace content */
    int start, stop;            /* Strip */
    int prepend_scheme;         /* Metaspace */
    struct tok_dec *sub; int nsub;
} tok_dec;

typedef struct tok_added {
    int32_t id;
    char *s; size_t len;
    bool special, lstrip, rstrip, normalized;
} tok_added;

/* post-processor: the ids TemplateProcessing's "single" adds before and
 * after the sequence (ByteLevel adds none) */
typedef struct tok_post {
    bool present;
    int32_t *pre; size_t npre;
    int32_t *post; size_t npost;
} tok_post;

struct tok_tokenizer {
    /* vocabulary: id -> token string (model vocabulary and added tokens) */
    char **tok; uint32_t *tok_len; int ntok;
    bool *in_model;             /* id is in the model's vocabulary */
    bool *special;
    tok_strmap vocab;           /* model vocabulary only */
    tok_pairmap merges;
    /* BPE options */
    int32_t unk_id;             /* model.unk_token, -1 = none */
    bool fuse_unk, byte_fallback, ignore_merges;
    char *cont_prefix; size_t cont_prefix_len;
    char *eow_suffix; size_t eow_suffix_len;
    int32_t byte_id[256];       /* "<0xXX>" ids for byte_fallback, -1 = none */
    int32_t *char_id;           /* code point < TOK_CHAR_IDS -> its vocabulary id, -1 */
    /* pipeline */
    tok_norm *norm;             /* NULL = none */
    tok_pre *pre;
    tok_dec *dec;
    tok_post post;
    tok_added *added; int nadded; /* longest first */
    int32_t *added_at;          /* id -> index in added[], -1 when none */
    bool added_first[256];      /* a raw added token starts with this byte */
    bool nadded_normalized;     /* some added token has normalized = true */
    pcre2_code *gpt2_re;        /* ByteLevel's use_regex pattern */
    tok_byte_table bytes;
    tok_config cfg;
    char *cfg_strings;          /* storage behind cfg's strings */
};

/* a list of pieces of text during pre-tokenization */
typedef struct tok_piece {
    size_t off, len;            /* in the list's buffer */
    bool at_start;              /* starts at offset 0 of the input */
} tok_piece;
typedef struct tok_pieces {
    tok_buf buf;
    tok_piece *p;
    size_t n, cap;
} tok_pieces;
int tok_pieces_add(tok_pieces *l, const char *s, size_t n, bool at_start);
void tok_pieces_free(tok_pieces *l);

/* why an encode stopped past a bound (tok_limits) */
enum tok_stop { TOK_STOP_NONE, TOK_STOP_TIME, TOK_STOP_REGEX, TOK_STOP_OUTPUT };

struct tok_encoder {
    const tok_tokenizer *t;
    pcre2_match_data *md;
    pcre2_match_context *mctx;  /* the match / depth / heap limits */
    tok_limits lim;
    int64_t deadline_ns;        /* armed by tok_encoder_begin; 0 = none */
    unsigned ticks;
    size_t out_bound;           /* bytes the normalized text may have */
    int stop;                   /* enum tok_stop: why the last encode stopped */
    int stop_pcre;              /* TOK_STOP_REGEX: PCRE2's error code */
    const char *stop_where;     /* TOK_STOP_REGEX: "normalizer" / "pre_tokenizer" */
    tok_buf nbuf, tmp;          /* normalizer scratch */
    tok_pieces pa, pb;          /* pre-tokenizer ping-pong */
    /* BPE work arrays */
    int32_t *sym_id; int32_t *sym_prev, *sym_next; size_t sym_cap;
    struct tok_heap_item *heap; size_t heap_cap;
    /* word cache */
    uint64_t *cache_hash; uint32_t *cache_off, *cache_n, *cache_key_off, *cache_key_len;
    size_t cache_mask, cache_used;
    tok_buf cache_keys;
    tok_ids cache_ids;
};

/* tok_bpe.c */
int tok_strmap_init(tok_strmap *m, size_t n);
void tok_strmap_put(tok_strmap *m, const tok_tokenizer *t, int32_t id);
int32_t tok_strmap_get(const tok_strmap *m, const tok_tokenizer *t, const char *s, size_t n);
void tok_strmap_free(tok_strmap *m);
uint64_t tok_hash(const char *s, size_t n);
/* The ids of one pre-tokenized word, appended to out. */
int tok_bpe_word(tok_encoder *e, const char *w, size_t n, tok_ids *out);
void tok_bpe_encoder_free(tok_encoder *e);

/* tok.c: the bounds. tok_over_time: ACC_EINVAL (and e->stop) past the
 * deadline, read every few calls; tok_match: pcre2_match under the limits,
 * 1 on a match (ovector in e->md), 0 on none, ACC_EINVAL with e->stop set
 * on any failure (`where` names the component kind). */
int tok_over_time(tok_encoder *e);
int tok_match(tok_encoder *e, const pcre2_code *re, const char *s, size_t n, size_t at, const char *where);
/* ACC_EINVAL (and e->stop) when `n` bytes of normalized text exceed the bound. */
int tok_over_output(tok_encoder *e, size_t n);

/* tok_text.c */
int tok_normalize(tok_encoder *e, const tok_norm *nm, tok_buf *s);
int tok_pretokenize(tok_encoder *e, const tok_pre *p, tok_pieces *in, tok_pieces *out);
uint32_t tok_utf8_decode(const unsigned char *s, size_t n, size_t *adv);

#endif
