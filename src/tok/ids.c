/*
 * ids.c — the files of the `tokenize` command: a text to encode, and ids as a token file (the flat little-endian
 * uint16/uint32 stream `train --data` reads, docs/train.md "Data, batches and schedule") or as decimal text.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/json.h"
#include "tok/tok_int.h"

int hp_tok_id_bytes(const hp_tok *tok) { return tok->n_vocab <= 65536 ? 2 : 4; }

hp_status hp_tok_encode_file(hp_tok *tok, const char *path, bool add_special, int32_t **ids, int64_t *n,
                             uint64_t *bytes, hp_err *err)
{
    *ids = NULL;
    *n = 0;
    char *text;
    size_t len;
    hp_status st = hp__read_file(path, HP_TOK_MAX_TEXT, &text, &len, err);
    if (st != HP_OK) return st;
    if (bytes) *bytes = len;
    st = hp_tok_encode(tok, text, len, add_special, ids, n, err);
    free(text);
    if (st != HP_OK) hp_err_prefix(err, "%s", path);
    return st;
}

hp_status hp_tok_write_ids(const char *path, const int32_t *ids, int64_t n, int id_bytes, hp_err *err)
{
    if (id_bytes != 2 && id_bytes != 4) return hp_err_set(err, HP_ERR_INPUT, "%s: ids of %d bytes; 2 or 4", path,
                                                          id_bytes);
    size_t size;
    if (n < 0 || !hp_mul_size((size_t)n, (size_t)id_bytes, &size))
        return hp_err_set(err, HP_ERR_INPUT, "%s: %lld ids do not fit in memory", path, (long long)n);
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return hp_err_set(err, HP_ERR_NOMEM, "%s: out of memory for %zu bytes", path, size);
    for (int64_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)ids[i];
        if (ids[i] < 0 || (id_bytes == 2 && v > 0xFFFF)) {
            free(buf);
            return hp_err_set(err, HP_ERR_INPUT, "%s: id %d (position %lld) does not fit a uint%d token file; write "
                              "uint32", path, ids[i], (long long)i, 8 * id_bytes);
        }
        for (int k = 0; k < id_bytes; k++) buf[(size_t)i * (size_t)id_bytes + (size_t)k] = (uint8_t)(v >> (8 * k));
    }
    hp_status st = hp_file_write_atomic(path, buf, size, "the token file", err);
    free(buf);
    return st;
}

hp_status hp_tok_read_ids(const char *path, int id_bytes, int32_t **ids, int64_t *n, hp_err *err)
{
    *ids = NULL;
    *n = 0;
    if (id_bytes != 2 && id_bytes != 4) return hp_err_set(err, HP_ERR_INPUT, "%s: ids of %d bytes; 2 or 4", path,
                                                          id_bytes);
    char *buf;
    size_t len;
    hp_status st = hp__read_file(path, (size_t)1 << 33, &buf, &len, err);
    if (st != HP_OK) return st;
    if (len % (size_t)id_bytes) {
        free(buf);
        return hp_err_set(err, HP_ERR_INPUT, "%s: %zu bytes is not a whole number of uint%d ids; the file is cut "
                          "short, or it is not a token file of that dtype", path, len, 8 * id_bytes);
    }
    size_t count = len / (size_t)id_bytes;
    int32_t *out = malloc((count ? count : 1) * sizeof *out);
    if (!out) {
        free(buf);
        return hp_err_set(err, HP_ERR_NOMEM, "%s: out of memory for %zu ids", path, count);
    }
    const uint8_t *b = (const uint8_t *)buf;
    for (size_t i = 0; i < count; i++) {
        uint32_t v = 0;
        for (int k = 0; k < id_bytes; k++) v |= (uint32_t)b[i * (size_t)id_bytes + (size_t)k] << (8 * k);
        if (v > INT32_MAX) {
            free(out);
            free(buf);
            return hp_err_set(err, HP_ERR_INPUT, "%s: id %u at position %zu is past 2^31 - 1; not a token id", path,
                              v, i);
        }
        out[i] = (int32_t)v;
    }
    free(buf);
    *ids = out;
    *n = (int64_t)count;
    return HP_OK;
}

static bool is_sep(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ','; }

/* The ids of text [len] into out (count them when out is NULL); HP_ERR_INPUT at the first bad word. */
static hp_status parse_ids(const char *path, const char *s, size_t len, int32_t *out, size_t *count, hp_err *err)
{
    size_t k = 0, p = 0;
    while (p < len && is_sep(s[p])) p++;
    if (p < len && s[p] == '[') p++;
    for (;;) {
        while (p < len && is_sep(s[p])) p++;
        if (p == len || s[p] == ']') break;
        size_t q = p;
        uint64_t v = 0;
        while (q < len && s[q] >= '0' && s[q] <= '9' && v <= INT32_MAX) v = v * 10 + (uint64_t)(s[q++] - '0');
        if (q == p || v > INT32_MAX || (q < len && !is_sep(s[q]) && s[q] != ']')) {
            char word[40];
            size_t w = 0;
            while (p + w < len && w < 24 && !is_sep(s[p + w])) w++;
            snprintf(word, sizeof word, "%.*s", (int)w, s + p);
            char shown[96];
            return hp_err_set(err, HP_ERR_INPUT, "%s: '%s' (id %zu, byte %zu) is not an id in [0, 2^31); the file "
                              "holds decimal ids separated by spaces, commas or lines", path,
                              hp_escape(word, shown, sizeof shown), k, p);
        }
        if (out) out[k] = (int32_t)v;
        k++;
        p = q;
    }
    if (p < len) p++; /* the ']' */
    while (p < len && is_sep(s[p])) p++;
    if (p < len)
        return hp_err_set(err, HP_ERR_INPUT, "%s: text after the closing ']' at byte %zu; give one list of ids", path,
                          p);
    *count = k;
    return HP_OK;
}

hp_status hp_tok_read_ids_text(const char *path, int32_t **ids, int64_t *n, hp_err *err)
{
    *ids = NULL;
    *n = 0;
    char *buf;
    size_t len, count;
    hp_status st = hp__read_file(path, (size_t)1 << 33, &buf, &len, err);
    if (st == HP_OK) st = parse_ids(path, buf, len, NULL, &count, err);
    int32_t *out = st == HP_OK ? malloc((count ? count : 1) * sizeof *out) : NULL;
    if (st == HP_OK && !out) st = hp_err_set(err, HP_ERR_NOMEM, "%s: out of memory for %zu ids", path, count);
    if (st == HP_OK) st = parse_ids(path, buf, len, out, &count, err);
    free(buf);
    if (st != HP_OK) {
        free(out);
        return st;
    }
    *ids = out;
    *n = (int64_t)count;
    return HP_OK;
}
