/*
 * nfc.h — internal: Unicode NFC normalization (nfc.c) and its generated tables (unicode_nfc.c,
 * scripts/gen_unicode.py), for tokenizer.json files whose normalizer is NFC (Qwen2's).
 */
#ifndef HP_TOK_NFC_H
#define HP_TOK_NFC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hyperpar/core.h"
#include "tok/tok_int.h"

typedef struct hp__nfc_decomp_entry {
    uint32_t cp;
    uint8_t n;       /* 1..4 */
    uint32_t d[4];   /* the full canonical decomposition, in canonical order */
} hp__nfc_decomp_entry;
typedef struct hp__nfc_pair {
    uint32_t a, b, c; /* a followed by b composes to c */
} hp__nfc_pair;

extern const hp__cp_range hp__nfc_ccc[], hp__nfc_unsafe[]; /* the combining class; 1 (tok_int.h's runs) */
extern const size_t hp__nfc_n_ccc, hp__nfc_n_unsafe;
extern const hp__nfc_decomp_entry hp__nfc_decomp[];
extern const size_t hp__nfc_n_decomp;
extern const hp__nfc_pair hp__nfc_comp[];
extern const size_t hp__nfc_n_comp;

/* Whether s [n] is NFC by the quick check alone: every code point NFC_QC=Yes with combining class 0. False may
 * still be NFC (hp__nfc then gives the same bytes). */
bool hp__nfc_quick(const uint8_t *s, size_t n);
/* The NFC of s [n] appended to out (decomposition, canonical order, composition; Hangul by its algorithm). Bytes
 * that are not well-formed UTF-8 pass through as they are and block composition across them. out->oom on failure. */
void hp__nfc(const uint8_t *s, size_t n, hp_buf *out);

#endif
