/*
 * nfc.c — Unicode NFC normalization (UAX #15), the normalizer of Qwen2's tokenizer.json.
 *
 * A text whose every code point is NFC_QC=Yes with combining class 0 is NFC as it is (hp__nfc_quick: ASCII, Latin,
 * CJK, most emoji); the encoder then takes it unchanged. Otherwise hp__nfc runs the three steps on the code points:
 *
 *   1. decompose each one fully (the generated table; Hangul syllables LV/LVT into their jamo by arithmetic)
 *   2. put each run of non-starters (class != 0) in canonical order: a stable sort by class
 *   3. compose: each code point c joins the last starter S when c is not blocked from S (nothing between them,
 *      or everything between has a class below c's) and (S, c) is a primary composite (the generated pairs;
 *      Hangul L+V and LV+T by arithmetic)
 *
 * Bytes that are not well-formed UTF-8 are kept as markers (0x110000 + the byte): class 0, no decomposition, no
 * composition, written back as the byte.
 */
#include <stdlib.h>
#include <string.h>

#include "tok/nfc.h"
#include "tok/tok_int.h"

#define BAD_BASE 0x110000u
#define SBASE 0xAC00u
#define LBASE 0x1100u
#define VBASE 0x1161u
#define TBASE 0x11A7u
#define LCOUNT 19u
#define VCOUNT 21u
#define TCOUNT 28u
#define NCOUNT (VCOUNT * TCOUNT)
#define SCOUNT (LCOUNT * NCOUNT)

static int ccc(uint32_t cp)
{
    return cp < 0x300 || cp >= BAD_BASE ? 0 : hp__cp_range_value(hp__nfc_ccc, hp__nfc_n_ccc, cp);
}

bool hp__nfc_quick(const uint8_t *s, size_t n)
{
    for (size_t p = 0; p < n;) {
        if (s[p] < 0x80) {
            p++;
            continue;
        }
        uint32_t cp;
        p += hp__utf8_next(s + p, n - p, &cp);
        if (cp != HP__UTF8_BAD && cp >= 0x300 && hp__cp_range_value(hp__nfc_unsafe, hp__nfc_n_unsafe, cp)) return false;
    }
    return true;
}

static const hp__nfc_decomp_entry *decomp(uint32_t cp)
{
    if (cp < 0xC0 || cp >= BAD_BASE) return NULL;
    size_t lo = 0, hi = hp__nfc_n_decomp;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < hp__nfc_decomp[mid].cp) hi = mid;
        else if (cp > hp__nfc_decomp[mid].cp) lo = mid + 1;
        else return &hp__nfc_decomp[mid];
    }
    return NULL;
}

/* The primary composite of a then b, or 0. */
static uint32_t compose(uint32_t a, uint32_t b)
{
    if (b < 0x300 || a >= BAD_BASE || b >= BAD_BASE) return 0;
    if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
        return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
    if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE && b < TBASE + TCOUNT)
        return a + (b - TBASE);
    size_t lo = 0, hi = hp__nfc_n_comp;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const hp__nfc_pair *p = &hp__nfc_comp[mid];
        if (a < p->a || (a == p->a && b < p->b)) hi = mid;
        else if (a > p->a || b > p->b) lo = mid + 1;
        else return p->c;
    }
    return 0;
}

/* Step 1: the full decomposition of s [n] into cps, room for 3 per byte: a code point that decomposes has at
 * least 2 bytes and gives at most 4 code points. */
static size_t decompose(const uint8_t *s, size_t n, uint32_t *cps)
{
    size_t k = 0;
    for (size_t p = 0; p < n;) {
        uint32_t cp;
        size_t len = hp__utf8_next(s + p, n - p, &cp);
        if (cp == HP__UTF8_BAD) cp = BAD_BASE + s[p];
        p += len;
        if (cp >= SBASE && cp < SBASE + SCOUNT) {
            uint32_t i = cp - SBASE;
            cps[k++] = LBASE + i / NCOUNT;
            cps[k++] = VBASE + (i % NCOUNT) / TCOUNT;
            if (i % TCOUNT) cps[k++] = TBASE + i % TCOUNT;
            continue;
        }
        const hp__nfc_decomp_entry *d = decomp(cp);
        if (!d) {
            cps[k++] = cp;
            continue;
        }
        for (int j = 0; j < d->n; j++) cps[k++] = d->d[j];
    }
    return k;
}

/* Steps 2 and 3 in place; returns the new length. */
static size_t order_and_compose(uint32_t *c, size_t n)
{
    for (size_t i = 1; i < n; i++) { /* insertion sort of each run of non-starters, stable */
        int ci = ccc(c[i]);
        if (!ci) continue;
        uint32_t x = c[i];
        size_t j = i;
        while (j > 0 && ccc(c[j - 1]) > ci) {
            c[j] = c[j - 1];
            j--;
        }
        c[j] = x;
    }
    size_t k = 0;
    long starter = -1;
    int last = 0; /* the class of the last code point kept after the starter */
    for (size_t i = 0; i < n; i++) {
        uint32_t x = c[i];
        int cx = ccc(x);
        bool adjacent = starter >= 0 && (size_t)starter == k - 1;
        if (starter >= 0 && (adjacent || last < cx)) {
            uint32_t y = compose(c[starter], x);
            if (y) {
                c[starter] = y;
                continue;
            }
        }
        if (cx == 0) starter = (long)k;
        last = cx;
        c[k++] = x;
    }
    return k;
}

static void put_utf8(hp_buf *out, uint32_t cp)
{
    uint8_t b[4];
    size_t n;
    if (cp >= BAD_BASE) b[0] = (uint8_t)(cp - BAD_BASE), n = 1;
    else if (cp < 0x80) b[0] = (uint8_t)cp, n = 1;
    else if (cp < 0x800) b[0] = (uint8_t)(0xC0 | cp >> 6), b[1] = (uint8_t)(0x80 | (cp & 0x3F)), n = 2;
    else if (cp < 0x10000)
        b[0] = (uint8_t)(0xE0 | cp >> 12), b[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F)),
        b[2] = (uint8_t)(0x80 | (cp & 0x3F)), n = 3;
    else
        b[0] = (uint8_t)(0xF0 | cp >> 18), b[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F)),
        b[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F)), b[3] = (uint8_t)(0x80 | (cp & 0x3F)), n = 4;
    hp_buf_append(out, b, n);
}

void hp__nfc(const uint8_t *s, size_t n, hp_buf *out)
{
    size_t cap;
    if (!hp_mul_size(n, 3 * sizeof(uint32_t), &cap)) {
        out->oom = true;
        return;
    }
    uint32_t *cps = malloc(cap ? cap : 1);
    if (!cps) {
        out->oom = true;
        return;
    }
    size_t k = order_and_compose(cps, decompose(s, n, cps));
    for (size_t i = 0; i < k; i++) put_utf8(out, cps[i]);
    free(cps);
}
