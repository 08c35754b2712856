/*
 * tok_int.h — internal: the tokenizer's data (src/tok), shared by its files:
 *
 *   tok.c        the object: tokens, added tokens, building (from arrays and for tok_json.c), lookups, encode's
 *                driver (added tokens, post-processor) and decode
 *   tok_json.c   tokenizer.json -> the builder calls below
 *   pretok.c     the pre-tokenizer steps: the GPT-2, Llama-3 and Qwen2 patterns as hand-written matchers, Digits,
 *                ByteLevel; UTF-8 decoding, the character classes and the lookup of a code point in the
 *                generated runs (hp__cp_range_value, nfc.c's too)
 *   bpe.c        the hash maps, the merges by rank over a linked list of symbols, the cache of pieces
 *   nfc.c        the NFC normalizer (its tables in unicode_nfc.c)
 *
 * BPE works in bytes: a byte-level token string ("Ġthe") is kept with the bytes it stands for (" the"), every
 * initial symbol is one byte of the piece, and a merge joins two ids into one. A token whose string has a
 * character outside the byte-level alphabet (an added token's "\n\n") cannot come out of merges and decodes to
 * its string's own UTF-8, as Hugging Face's ByteLevel decoder does.
 */
#ifndef HP_TOK_INT_H
#define HP_TOK_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hyperpar/core.h"
#include "hyperpar/tokenizer.h"

/* ---- Unicode (pretok.c, unicode_table.c; nfc.c's tables in unicode_nfc.c) ---- */
/* A run of code points [lo, hi] that share one small value. The generated tables (scripts/gen_unicode.py) are
 * sorted, disjoint runs, and every code point outside them has the value 0. */
typedef struct hp__cp_range {
    uint32_t lo, hi; /* inclusive */
    uint8_t v;       /* hp__uc_ranges: the class; hp__nfc_ccc: the combining class; hp__nfc_unsafe: 1 */
} hp__cp_range;
/* The value of the run of r [n] that holds cp, or 0 when none does (a binary search). */
uint8_t hp__cp_range_value(const hp__cp_range *r, size_t n, uint32_t cp);
enum { HP__UC_NONE = 0, HP__UC_L = 1, HP__UC_N = 2, HP__UC_S = 3 };
extern const hp__cp_range hp__uc_ranges[]; /* the classes HP__UC_L, HP__UC_N, HP__UC_S */
extern const size_t hp__uc_n_ranges;
/* The class of a code point (HP__UC_NONE for one outside the table, and for HP__UTF8_BAD). */
int hp__uc_class(uint32_t cp);
#define HP__UTF8_BAD 0xFFFFFFFFu
/* The code point at s[0..n) (n >= 1) into *cp, returning its length: 1..4 for well-formed UTF-8; 1 and
 * HP__UTF8_BAD for a byte that does not start one (overlong, surrogate, past U+10FFFF, cut short). */
size_t hp__utf8_next(const uint8_t *s, size_t n, uint32_t *cp);

/* ---- pre-tokenizer steps (pretok.c) ---- */
typedef enum hp__pre_kind { HP__PRE_BYTELEVEL, HP__PRE_SPLIT, HP__PRE_DIGITS } hp__pre_kind;
typedef enum hp__regex { HP__RX_GPT2, HP__RX_LLAMA3, HP__RX_QWEN2 } hp__regex;
typedef struct hp__pre_step {
    hp__pre_kind kind;
    hp__regex regex;        /* SPLIT, and BYTELEVEL with use_regex (always GPT-2) */
    bool use_regex;         /* BYTELEVEL */
    bool add_prefix_space;  /* BYTELEVEL: a piece not starting with ' ' gets one */
    bool individual_digits; /* DIGITS */
} hp__pre_step;
#define HP__PRE_MAX 8
/* The pattern string recognized as r, exactly as tokenizer.json writes it; NULL for none. */
const char *hp__regex_pattern(hp__regex r);
/* The regex whose pattern is s, or -1. */
int hp__regex_find(const char *s);
const char *hp__regex_name(hp__regex r); /* "gpt2", "llama3", "qwen2" */

/* Called for each final piece; a status other than HP_OK stops the walk and is returned. */
typedef hp_status (*hp__piece_fn)(void *ctx, const uint8_t *s, size_t n);
/* Cuts s [n] by steps [0, n_steps) in order, each step cutting every piece of the one before, and calls fn on each
 * final piece, in text order (n_steps 0: s itself). scratch: HP__PRE_MAX buffers the prefix space is written into. */
typedef struct hp__scratch {
    uint8_t *p;
    size_t cap;
} hp__scratch;
hp_status hp__pretokenize(const hp__pre_step *steps, int n_steps, hp__scratch *scratch, const uint8_t *s, size_t n,
                          hp__piece_fn fn, void *ctx, hp_err *err);
/* The length of the match of regex r at s [n] (n >= 1): every pattern matches at any position, at least one
 * character. */
size_t hp__regex_match(hp__regex r, const uint8_t *s, size_t n);

/* ---- hash maps (bpe.c) ---- */
/* Byte strings -> ids: open addressing over ids; the keys are the tokens' own strings (key_of). */
typedef struct hp__idmap {
    int32_t *slot; /* [cap] an id, or -1: empty */
    size_t cap, n; /* cap a power of two, n < cap / 2 */
} hp__idmap;
/* A merge's pair (a, b) -> its rank and the id it makes. */
typedef struct hp__mergemap {
    uint64_t *key;   /* [cap] (a << 32 | b) + 1; 0: empty */
    int32_t *rank;   /* [cap] */
    int32_t *made;   /* [cap] */
    size_t cap, n;
} hp__mergemap;

/* One BPE symbol of the piece being merged: a doubly linked list in place (symbol i starts at byte i). */
typedef struct hp__sym {
    int32_t id;
    int32_t prev, next; /* -1: none */
    int32_t len;        /* bytes; 0: merged into the symbol before it */
} hp__sym;
typedef struct hp__heap_item {
    int32_t rank, pos, made;
} hp__heap_item;

/* A cached piece: the piece's bytes then its ids, in one allocation. */
typedef struct hp__cache_entry {
    uint64_t hash; /* 0: empty */
    uint8_t *key;  /* [klen] bytes, then [n_ids] int32 ids (aligned) */
    uint32_t klen, n_ids;
} hp__cache_entry;
#define HP__CACHE_SLOTS 65536u    /* a power of two; cleared whole when half full */
#define HP__CACHE_MAX_PIECE 256u  /* longer pieces are merged every time */

/* An added token, matched in the text before pre-tokenization. */
typedef struct hp__added {
    const uint8_t *text; /* its content (raw text, not byte-level) */
    size_t len;
    int32_t id;
    bool special, normalized, lstrip, rstrip;
} hp__added;

/* A token of the vocabulary (ids are indices; a gap has str NULL). */
typedef struct hp__token {
    char *str;       /* as written in tokenizer.json */
    uint8_t *bytes;  /* what it decodes to */
    uint32_t n_bytes;
    uint8_t kind;    /* hp_tok_kind */
    bool in_alphabet; /* every character of str is of the byte-level alphabet: bytes is what BPE makes */
} hp__token;

struct hp_tok {
    hp_arena arena;          /* strings, added tokens, everything built once */
    hp__token *tok;          /* [n_vocab] */
    int64_t n_vocab, cap_vocab;
    int64_t n_merges;
    hp__idmap by_str;        /* token string -> id */
    hp__idmap by_bytes;      /* bytes -> id, tokens in the alphabet only (the piece lookup of ignore_merges) */
    hp__mergemap merges;
    int32_t byte_id[256];    /* the token of each single byte, -1: none */
    int32_t unk_id;          /* -1: none (a byte without a token is then left out, as Hugging Face does) */
    bool fuse_unk;           /* consecutive unknown bytes make one unk */
    bool ignore_merges;
    bool nfc;                /* the normalizer: NFC (nfc.c), else none */
    hp__pre_step pre[HP__PRE_MAX];
    int n_pre;
    hp__added *added;        /* [n_added] */
    int n_added;
    int32_t *added_first[256]; /* per first byte: indices into added, longest first, -1 ended; NULL: none */
    int32_t *prefix_ids, *suffix_ids; /* the post-processor's single template around the sequence */
    int n_prefix, n_suffix;
    int32_t bos_id, eos_id;
    char *chat_template; /* tokenizer_config.json's chat_template (malloc'd), or NULL */
    /* workspaces, grown as needed (encode is one thread at a time) */
    hp__sym *sym;
    hp__heap_item *heap;
    size_t cap_sym;
    hp__cache_entry *cache;  /* [HP__CACHE_SLOTS] or NULL */
    size_t cache_n;
    hp__scratch scratch[HP__PRE_MAX];
    int32_t *out;            /* encode's ids */
    size_t n_out, cap_out;
    bool out_oom;
    int64_t n_dropped;       /* bytes the last encode left out (no token, no unk_token) */
    int first_dropped;       /* the first of them */
};

/* ---- building (tok.c), for hp_tok_create and tok_json.c ---- */
hp_tok *hp__tok_new(void);
/* Sets token id's string and kind; a second string for one id, or a string at two ids, is HP_ERR_INPUT. where
 * names the source in messages ("tokenizer.json: model.vocab"). */
hp_status hp__tok_set(hp_tok *t, int64_t id, const char *str, size_t len, hp_tok_kind kind, const char *where,
                      hp_err *err);
/* Adds an added token (after every vocabulary token is set): its id's string must be its content, or the id is
 * new. */
hp_status hp__tok_add(hp_tok *t, int64_t id, const char *content, size_t len, bool special, bool normalized,
                      bool lstrip, bool rstrip, const char *where, hp_err *err);
/* Adds the merge of tokens a and b (strings, lengths) with the next rank; index names it in messages. */
hp_status hp__tok_merge(hp_tok *t, const char *a, size_t na, const char *b, size_t nb, int64_t index,
                        const char *where, hp_err *err);
/* After every token, added token and merge: the byte map, the added-token index, checks (bos, eos in range). */
hp_status hp__tok_finish(hp_tok *t, const char *where, hp_err *err);

/* ---- BPE (bpe.c) ---- */
hp_status hp__idmap_reserve(hp__idmap *m, size_t n);
void hp__idmap_free(hp__idmap *m);
/* id of key [n] among t's tokens (by string: by_str; by bytes: by_bytes), or -1. */
int32_t hp__idmap_find(const hp__idmap *m, const hp_tok *t, bool bytes, const void *key, size_t n);
/* Inserts id (its key is its token's string or bytes); false when out of memory. */
bool hp__idmap_put(hp__idmap *m, const hp_tok *t, bool bytes, int32_t id);
bool hp__merge_put(hp__mergemap *m, int32_t a, int32_t b, int32_t rank, int32_t made);
bool hp__merge_get(const hp__mergemap *m, int32_t a, int32_t b, int32_t *rank, int32_t *made);
void hp__merge_free(hp__mergemap *m);
/* Appends the ids of one piece (after pre-tokenization) to t->out. */
hp_status hp__bpe_piece(hp_tok *t, const uint8_t *s, size_t n, hp_err *err);
void hp__bpe_free(hp_tok *t);
/* Appends id to t->out (t->out_oom on failure). */
void hp__out_push(hp_tok *t, int32_t id);

/* ---- the byte-level alphabet (tok.c) ---- */
/* The code point that stands for byte b in byte-level token strings (GPT-2's bytes_to_unicode). */
uint32_t hp__byte_char(uint8_t b);
/* The byte a code point stands for, or -1 when it is not of the alphabet. */
int hp__char_byte(uint32_t cp);

#endif
