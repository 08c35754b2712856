/*
 * pretok.c — pre-tokenization: the pieces BPE merges within.
 *
 * No regex engine. The pre-tokenizer patterns tokenizer.json files use are recognized by their exact strings
 * (hp__regex_find) and each is a hand-written matcher with the semantics of the engine Hugging Face `tokenizers`
 * runs them with (Oniguruma): at a position, the alternatives are tried in order and the first that matches wins
 * (not the longest); a quantifier is greedy and gives back one character at a time when what follows fails.
 * Every one of the three patterns matches at any position (each character is a letter \p{L}, a number \p{N},
 * a space \s or none of these, and each class has an alternative), so a segment is cut into consecutive matches.
 *
 *   GPT-2   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   Llama-3 (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|
 *           \s+(?!\S)|\s+
 *   Qwen2   the same with \p{N} (one digit) for \p{N}{1,3}
 *
 * The traps, each tested (tests/test_tok.c, tests/python/test_tokenize.py):
 * - \s+(?!\S): a run of spaces followed by a non-space gives its last space back, so "a   b" is "a", "  ", " b";
 *   a single space before a non-space is left to \s+ (when no earlier alternative took it with the word).
 * - \s*[\r\n]+ (Llama-3, Qwen2): the match ends after the LAST \r or \n of the whitespace run.
 * - \s is Oniguruma's Unicode \s: U+0009..U+000D, U+0085 and Zs/Zl/Zp (U+00A0, U+3000, U+2028 ...).
 * - (?i:...) folds case the Unicode way: 'S, 'LL, and U+017F (long s) for s.
 * - [^\r\n\p{L}\p{N}]? is one character of any length in bytes (a tab, U+3000, an emoji's first code point).
 * Bytes that are not well-formed UTF-8 are characters of no class (Hugging Face never sees them: it takes str).
 */
#include <stdlib.h>
#include <string.h>

#include "tok/tok_int.h"

/* ---- UTF-8 and classes ---- */

size_t hp__utf8_next(const uint8_t *s, size_t n, uint32_t *cp)
{
    uint8_t b = s[0];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    size_t len;
    uint32_t c, min;
    if (b >= 0xC2 && b <= 0xDF) len = 2, c = b & 0x1Fu, min = 0x80;
    else if (b >= 0xE0 && b <= 0xEF) len = 3, c = b & 0x0Fu, min = 0x800;
    else if (b >= 0xF0 && b <= 0xF4) len = 4, c = b & 0x07u, min = 0x10000;
    else {
        *cp = HP__UTF8_BAD;
        return 1;
    }
    if (len > n) {
        *cp = HP__UTF8_BAD;
        return 1;
    }
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *cp = HP__UTF8_BAD;
            return 1;
        }
        c = (c << 6) | (s[i] & 0x3Fu);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) {
        *cp = HP__UTF8_BAD;
        return 1;
    }
    *cp = c;
    return len;
}

int hp__uc_class(uint32_t cp)
{
    if (cp < 0x80) {
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return HP__UC_L;
        if (cp >= '0' && cp <= '9') return HP__UC_N;
        if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return HP__UC_S;
        return HP__UC_NONE;
    }
    return hp__cp_range_value(hp__uc_ranges, hp__uc_n_ranges, cp); /* HP__UC_NONE (0) outside the table */
}

uint8_t hp__cp_range_value(const hp__cp_range *r, size_t n, uint32_t cp)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < r[mid].lo) hi = mid;
        else if (cp > r[mid].hi) lo = mid + 1;
        else return r[mid].v;
    }
    return 0;
}

/* One character: its code point, bytes and class. */
typedef struct uchar {
    uint32_t cp;
    size_t len;
    int cls;
} uchar;

static uchar char_at(const uint8_t *s, size_t n, size_t p)
{
    uchar c;
    c.len = hp__utf8_next(s + p, n - p, &c.cp);
    c.cls = hp__uc_class(c.cp);
    return c;
}

/* The end of the run of characters of class cls that starts at p. */
static size_t run_of(const uint8_t *s, size_t n, size_t p, int cls)
{
    while (p < n) {
        uchar c = char_at(s, n, p);
        if (c.cls != cls) break;
        p += c.len;
    }
    return p;
}

/* The end of the run of \r and \n at p. */
static size_t run_crlf(const uint8_t *s, size_t n, size_t p)
{
    while (p < n && (s[p] == '\r' || s[p] == '\n')) p++;
    return p;
}

/* 's|'t|'re|'ve|'m|'ll|'d at s (s[0] == '\''), in that order; fold: case-insensitive (ASCII case, and U+017F
 * for s, the one other character Unicode folds to one of these letters). The match's length, or 0. */
static size_t contraction(const uint8_t *s, size_t n, bool fold)
{
    static const char *const alts[] = {"s", "t", "re", "ve", "m", "ll", "d"};
    for (size_t a = 0; a < sizeof alts / sizeof *alts; a++) {
        size_t p = 1;
        const char *w = alts[a];
        for (; *w && p < n; w++) {
            if (s[p] == (uint8_t)*w || (fold && s[p] == (uint8_t)(*w - 'a' + 'A'))) p++;
            else if (fold && *w == 's' && p + 1 < n && s[p] == 0xC5 && s[p + 1] == 0xBF) p += 2; /* U+017F */
            else break;
        }
        if (!*w) return p;
    }
    return 0;
}

/* \s+(?!\S)|\s+ at a whitespace character: the run, less its last character when a non-space follows and the
 * run has more than one character. */
static size_t spaces(const uint8_t *s, size_t n)
{
    size_t e = run_of(s, n, 0, HP__UC_S), last = 0;
    if (e == n) return e;
    for (size_t p = 0; p < e;) { /* the start of the run's last character */
        last = p;
        p += char_at(s, n, p).len;
    }
    return last > 0 ? last : e;
}

static size_t match_gpt2(const uint8_t *s, size_t n)
{
    uchar c0 = char_at(s, n, 0);
    if (c0.cp == '\'') {
        size_t k = contraction(s, n, false);
        if (k) return k;
    }
    if (c0.cp == ' ' && n > 1) { /* ' ?' before a letter, number or other run */
        uchar c1 = char_at(s, n, 1);
        if (c1.cls != HP__UC_S) return run_of(s, n, 1, c1.cls);
    }
    if (c0.cls != HP__UC_S) return run_of(s, n, 0, c0.cls);
    return spaces(s, n);
}

static size_t match_llama3(const uint8_t *s, size_t n, size_t max_digits)
{
    uchar c0 = char_at(s, n, 0);
    if (c0.cp == '\'') {
        size_t k = contraction(s, n, true);
        if (k) return k;
    }
    if (c0.cls == HP__UC_L) return run_of(s, n, 0, HP__UC_L);
    if (c0.cp != '\r' && c0.cp != '\n' && c0.cls != HP__UC_N && c0.len < n) { /* [^\r\n\p{L}\p{N}]?\p{L}+ */
        uchar c1 = char_at(s, n, c0.len);
        if (c1.cls == HP__UC_L) return run_of(s, n, c0.len, HP__UC_L);
    }
    if (c0.cls == HP__UC_N) { /* \p{N}{1,3} or \p{N} */
        size_t p = 0;
        for (size_t k = 0; k < max_digits && p < n; k++) {
            uchar c = char_at(s, n, p);
            if (c.cls != HP__UC_N) break;
            p += c.len;
        }
        return p;
    }
    if (c0.cp == ' ' && n > 1 && char_at(s, n, 1).cls == HP__UC_NONE) /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
        return run_crlf(s, n, run_of(s, n, 1, HP__UC_NONE));
    if (c0.cls == HP__UC_NONE) return run_crlf(s, n, run_of(s, n, 0, HP__UC_NONE));
    /* c0 is a space: \s*[\r\n]+ ends after the run's last \r or \n */
    size_t e = run_of(s, n, 0, HP__UC_S), end = 0;
    for (size_t p = 0; p < e; p++)
        if (s[p] == '\r' || s[p] == '\n') end = p + 1;
    if (end) return end;
    return spaces(s, n);
}

size_t hp__regex_match(hp__regex r, const uint8_t *s, size_t n)
{
    switch (r) {
    case HP__RX_GPT2: return match_gpt2(s, n);
    case HP__RX_LLAMA3: return match_llama3(s, n, 3);
    case HP__RX_QWEN2: return match_llama3(s, n, 1);
    }
    return n;
}

static const struct {
    const char *name, *pattern;
} g_regex[] = {
    [HP__RX_GPT2] = {"gpt2", "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"},
    [HP__RX_LLAMA3] = {"llama3", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                                 "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
    [HP__RX_QWEN2] = {"qwen2", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                               "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
};

const char *hp__regex_pattern(hp__regex r) { return g_regex[r].pattern; }
const char *hp__regex_name(hp__regex r) { return g_regex[r].name; }

int hp__regex_find(const char *s)
{
    for (size_t i = 0; i < sizeof g_regex / sizeof *g_regex; i++)
        if (!strcmp(s, g_regex[i].pattern)) return (int)i;
    return -1;
}

/* ---- the steps ---- */

typedef struct walk_ctx {
    const hp__pre_step *steps;
    int n_steps;
    hp__scratch *scratch;
    hp__piece_fn fn;
    void *ctx;
    hp_err *err;
} walk_ctx;

static hp_status walk(walk_ctx *w, int k, const uint8_t *s, size_t n);

/* Digits: each number character alone (individual) or each run of them, the text between as pieces. */
static hp_status digits(walk_ctx *w, int k, const uint8_t *s, size_t n, bool individual)
{
    size_t p = 0;
    while (p < n) {
        uchar c = char_at(s, n, p);
        size_t e;
        if (c.cls == HP__UC_N) e = individual ? p + c.len : run_of(s, n, p, HP__UC_N);
        else {
            e = p + c.len;
            while (e < n) {
                uchar d = char_at(s, n, e);
                if (d.cls == HP__UC_N) break;
                e += d.len;
            }
        }
        hp_status st = walk(w, k + 1, s + p, e - p);
        if (st != HP_OK) return st;
        p = e;
    }
    return HP_OK;
}

static hp_status walk(walk_ctx *w, int k, const uint8_t *s, size_t n)
{
    if (n == 0) return HP_OK;
    if (k == w->n_steps) return w->fn(w->ctx, s, n);
    const hp__pre_step *st = &w->steps[k];
    hp__regex r = st->regex;
    if (st->kind == HP__PRE_DIGITS) return digits(w, k, s, n, st->individual_digits);
    if (st->kind == HP__PRE_BYTELEVEL) {
        if (st->add_prefix_space && s[0] != ' ') {
            hp__scratch *sc = &w->scratch[k];
            if (sc->cap < n + 1) {
                size_t cap = n + 1 > 2 * sc->cap ? n + 1 : 2 * sc->cap;
                uint8_t *p = realloc(sc->p, cap);
                if (!p) return hp_err_set(w->err, HP_ERR_NOMEM, "tokenizer: out of memory (%zu bytes)", cap);
                sc->p = p;
                sc->cap = cap;
            }
            sc->p[0] = ' ';
            memcpy(sc->p + 1, s, n);
            s = sc->p;
            n++;
        }
        if (!st->use_regex) return walk(w, k + 1, s, n);
        r = HP__RX_GPT2;
    }
    for (size_t p = 0; p < n;) {
        size_t m = hp__regex_match(r, s + p, n - p);
        hp_status rc = walk(w, k + 1, s + p, m);
        if (rc != HP_OK) return rc;
        p += m;
    }
    return HP_OK;
}

hp_status hp__pretokenize(const hp__pre_step *steps, int n_steps, hp__scratch *scratch, const uint8_t *s, size_t n,
                          hp__piece_fn fn, void *ctx, hp_err *err)
{
    walk_ctx w = {steps, n_steps, scratch, fn, ctx, err};
    return walk(&w, 0, s, n);
}
