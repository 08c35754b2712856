/*
 * safetensors.c — strict safetensors reader: maps a file (or takes a buffer) and validates all of it
 * before any tensor is handed out. The writer is in safetensors_write.c.
 *
 *   +----------+----------------------------+---------------------------------------------+
 *   | u64 LE N | N bytes UTF-8 JSON header  | data section: tensors back to back, no gaps |
 *   +----------+----------------------------+---------------------------------------------+
 *   0          8                            8+N (data_offset)                   file size
 *
 * The header is {"__metadata__": {str: str}, "<name>": {"dtype": "F32", "shape": [..], "data_offsets":
 * [begin, end]}, ...} with offsets relative to the data section (spec/hf_reference.md §5.1).
 *
 * Invariants once hp_st_open returns HP_OK (all checked here, so callers never re-check):
 *   - every tensor has a known dtype, rank <= HP_MAX_DIMS, non-negative dims, and n_elems and its byte size
 *     fit in int64;
 *   - end - begin == byte size, and the tensors sorted by begin tile [0, data size) with no hole or overlap;
 *   - 8 + N + data size == file size, so hp_st_data never points outside the buffer;
 *   - names are non-empty, unique, valid UTF-8 (jansson checks UTF-8 and rejects duplicates and NUL).
 *
 * Names and metadata strings live in one arena; tensors are kept in header order plus an index sorted by
 * name for O(log n) lookup.
 */
#include "hyperpar/safetensors.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/guard.h"
#include "io/mapped.h"

struct hp_st_file {
    hp__mapped m; /* the bytes, the label (path or caller's label, for messages and hp_st_path) and the arena */
    uint64_t data_offset;
    hp_st_tensor *tensors; /* [n_tensors], header order */
    size_t n_tensors;
    const hp_st_tensor **by_name; /* [n_tensors], sorted by strcmp on name */
    const char **meta_keys, **meta_values; /* [n_meta], header order */
    size_t n_meta;
};

/* ---- reader ---- */

/* A zip file or a pickle is the usual mistake (a PyTorch .bin handed to a safetensors reader): say so. */
static const char *magic_hint(const unsigned char *b, size_t n)
{
    if (n >= 4 && memcmp(b, "PK\x03\x04", 4) == 0)
        return " The file looks like a zip/PyTorch .bin archive, not safetensors; convert it with "
               "safetensors.torch.save_file(torch.load(path)) or the safetensors convert tool.";
    if (n >= 2 && b[0] == 0x80 && b[1] >= 2 && b[1] <= 5)
        return " The file looks like a pickle/PyTorch .bin file, not safetensors; convert it with "
               "safetensors.torch.save_file(torch.load(path)) or the safetensors convert tool.";
    return "";
}

static const char *json_kind(const json_t *j)
{
    switch (json_typeof(j)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "real number";
    case JSON_TRUE:
    case JSON_FALSE: return "boolean";
    case JSON_NULL: return "null";
    }
    return "value";
}

/* jansson reports a duplicate key at the byte just past the key's closing quote; walk back to the opening
 * quote and decode the key so the message can name the tensor. Falls back to jansson's own text. */
static void duplicate_key_name(const char *hdr, size_t pos, char *out, size_t cap, const char *fallback)
{
    snprintf(out, cap, "%s", fallback);
    if (pos < 2 || hdr[pos - 1] != '"') return;
    for (size_t i = pos - 1; i-- > 0;) {
        if (hdr[i] != '"') continue;
        size_t bs = 0;
        while (i > bs && hdr[i - 1 - bs] == '\\') bs++;
        if (bs % 2) continue;
        json_t *s = json_loadb(hdr + i, pos - i, JSON_DECODE_ANY, NULL);
        if (s && json_is_string(s)) snprintf(out, cap, "%s", json_string_value(s));
        json_decref(s);
        return;
    }
}

static void shape_str(const hp_st_tensor *t, char *out, size_t cap)
{
    size_t len = (size_t)snprintf(out, cap, "[");
    for (int d = 0; d < t->n_dims && len < cap; d++)
        len += (size_t)snprintf(out + len, cap - len, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (len < cap) snprintf(out + len, cap - len, "]");
}

/* Reads a JSON integer >= 0 into *out; false for anything else. */
static bool get_nonneg(const json_t *j, int64_t *out)
{
    if (!json_is_integer(j)) return false;
    json_int_t v = json_integer_value(j);
    if (v < 0) return false;
    *out = (int64_t)v;
    return true;
}

static const char *known_dtypes(void)
{
    return "BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ, I16, "
           "U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64";
}

/* Validates one tensor entry and fills t (name set by the caller). Names and strings from the file are quoted
 * escaped (hp_escape). */
static hp_status parse_tensor(const char *lab, const char *raw_name, const json_t *v, hp_st_tensor *t,
                              hp_err *err)
{
    char name[256], dt[96];
    hp_escape(raw_name, name, sizeof name);
    if (!json_is_object(v))
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: tensor '%s': the header entry is a JSON %s, not an object with dtype, shape and "
                          "data_offsets; the file is corrupt.", lab, name, json_kind(v));
    const json_t *jd = json_object_get(v, "dtype");
    if (!json_is_string(jd))
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: tensor '%s': \"dtype\" is %s, expected a string such as \"BF16\"; the file is "
                          "corrupt.", lab, name, jd ? json_kind(jd) : "missing");
    if (!hp_dtype_parse(json_string_value(jd), &t->dtype))
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: tensor '%s': unknown dtype '%s'; known dtypes are %s. The file was written by "
                          "a newer or different tool.", lab, name, hp_escape(json_string_value(jd), dt, sizeof dt),
                          known_dtypes());

    const json_t *js = json_object_get(v, "shape");
    if (!json_is_array(js))
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: tensor '%s': \"shape\" is %s, expected an array of non-negative integers; the "
                          "file is corrupt.", lab, name, js ? json_kind(js) : "missing");
    size_t rank = json_array_size(js);
    if (rank > HP_MAX_DIMS)
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: tensor '%s': shape has %zu dimensions, more than the %d this reader supports "
                          "(HP_MAX_DIMS); the file is corrupt or unsupported.", lab, name, rank, HP_MAX_DIMS);
    t->n_dims = (int)rank;
    t->n_elems = 1;
    for (size_t d = 0; d < rank; d++) {
        const json_t *e = json_array_get(js, d);
        if (!get_nonneg(e, &t->shape[d])) {
            if (json_is_integer(e))
                return hp_err_set(err, HP_ERR_INPUT,
                                  "%s: tensor '%s': shape dimension %zu is %lld; dimensions must be non-negative "
                                  "integers. The file is corrupt.", lab, name, d,
                                  (long long)json_integer_value(e));
            return hp_err_set(err, HP_ERR_INPUT,
                              "%s: tensor '%s': shape dimension %zu is a JSON %s; dimensions must be non-negative "
                              "integers. The file is corrupt.", lab, name, d, json_kind(e));
        }
        if (!hp_mul_i64(t->n_elems, t->shape[d], &t->n_elems)) {
            char sh[256];
            t->n_dims = (int)d + 1;
            shape_str(t, sh, sizeof sh);
            return hp_err_set(err, HP_ERR_INPUT,
                              "%s: tensor '%s': the element count of shape %s... overflows a 64-bit integer; the "
                              "file is corrupt.", lab, name, sh);
        }
    }
    char sh[256];
    shape_str(t, sh, sizeof sh);
    int64_t nbytes;
    if (!hp_dtype_nbytes(t->dtype, t->n_elems, &nbytes)) {
        int bits = hp_dtype_bits(t->dtype);
        if (bits % 8 != 0)
            return hp_err_set(err, HP_ERR_INPUT,
                              "%s: tensor '%s': %lld elements of %s (%d bits each) are not a whole number of "
                              "bytes; sub-byte tensors must end on a byte boundary. The file is corrupt.",
                              lab, name, (long long)t->n_elems, hp_dtype_name(t->dtype), bits);
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: tensor '%s': the byte size of %s shape %s overflows a 64-bit integer; the file is "
                          "corrupt.", lab, name, hp_dtype_name(t->dtype), sh);
    }

    const json_t *jo = json_object_get(v, "data_offsets");
    int64_t b = 0, e = 0;
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !get_nonneg(json_array_get(jo, 0), &b) ||
        !get_nonneg(json_array_get(jo, 1), &e)) {
        char what[64];
        if (!jo)
            snprintf(what, sizeof what, "missing");
        else if (!json_is_array(jo))
            snprintf(what, sizeof what, "a JSON %s", json_kind(jo));
        else if (json_array_size(jo) != 2)
            snprintf(what, sizeof what, "an array of %zu values", json_array_size(jo));
        else
            snprintf(what, sizeof what, "not two non-negative integers");
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: tensor '%s': \"data_offsets\" is %s, expected [begin, end] with two non-negative "
                          "integers; the file is corrupt.", lab, name, what);
    }
    if (b > e)
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: tensor '%s': data_offsets [%lld, %lld] end before they begin; the file is "
                          "corrupt.", lab, name, (long long)b, (long long)e);
    if (e - b != nbytes)
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: tensor '%s': data_offsets [%lld, %lld] span %lld bytes but %s shape %s needs %lld "
                          "bytes; the header is inconsistent and the file is corrupt.", lab, name, (long long)b,
                          (long long)e, (long long)(e - b), hp_dtype_name(t->dtype), sh, (long long)nbytes);
    t->begin = (uint64_t)b;
    t->end = (uint64_t)e;
    return HP_OK;
}

static int cmp_by_begin(const void *a, const void *b)
{
    const hp_st_tensor *x = *(const hp_st_tensor *const *)a, *y = *(const hp_st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x < y ? -1 : (x > y); /* header order: keeps qsort deterministic */
}

static int cmp_by_name(const void *a, const void *b)
{
    return strcmp((*(const hp_st_tensor *const *)a)->name, (*(const hp_st_tensor *const *)b)->name);
}

/* Checks that the tensors, sorted by begin, tile [0, data_size) exactly. */
static hp_status check_layout(hp_st_file *f, uint64_t data_size, hp_err *err)
{
    const char *lab = f->m.label;
    size_t n = f->n_tensors;
    const hp_st_tensor **s = hp_calloc(n, sizeof *s);
    if (!s) return hp_err_set(err, HP_ERR_NOMEM, "%s: out of memory sorting %zu tensors.", lab, n);
    for (size_t i = 0; i < n; i++) s[i] = &f->tensors[i];
    qsort(s, n, sizeof *s, cmp_by_begin);
    hp_status st = HP_OK;
    uint64_t at = 0;
    char a[256], b[256]; /* the names, escaped */
    for (size_t i = 0; i < n && st == HP_OK; i++) {
        const hp_st_tensor *t = s[i];
        hp_escape(t->name, b, sizeof b);
        hp_escape(i ? s[i - 1]->name : "", a, sizeof a);
        if (t->begin > at && i == 0)
            st = hp_err_set(err, HP_ERR_INPUT,
                            "%s: tensor '%s' begins at byte %llu but the first tensor must begin at 0; bytes [0, "
                            "%llu) of the data section belong to no tensor. The file is corrupt.", lab, b,
                            (unsigned long long)t->begin, (unsigned long long)t->begin);
        else if (t->begin > at)
            st = hp_err_set(err, HP_ERR_INPUT,
                            "%s: bytes [%llu, %llu) of the data section, between tensor '%s' (ends at %llu) and "
                            "tensor '%s' (begins at %llu), belong to no tensor; the data section must have no "
                            "holes. The file is corrupt.", lab, (unsigned long long)at,
                            (unsigned long long)t->begin, a, (unsigned long long)at, b,
                            (unsigned long long)t->begin);
        else if (t->begin < at)
            st = hp_err_set(err, HP_ERR_INPUT,
                            "%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap in the data section; the "
                            "file is corrupt.", lab, a, (unsigned long long)s[i - 1]->begin,
                            (unsigned long long)s[i - 1]->end, b, (unsigned long long)t->begin,
                            (unsigned long long)t->end);
        at = t->end;
    }
    if (st == HP_OK && at > data_size)
        st = hp_err_set(err, HP_ERR_INPUT,
                        "%s: tensor '%s': data_offsets end %llu is past the data section (%llu bytes); the file "
                        "looks truncated.", lab, hp_escape(s[n - 1]->name, b, sizeof b), (unsigned long long)at,
                        (unsigned long long)data_size);
    if (st == HP_OK && at < data_size) {
        if (n == 0)
            st = hp_err_set(err, HP_ERR_INPUT,
                            "%s: the header lists no tensors but %llu trailing bytes follow it; the file is "
                            "corrupt.", lab, (unsigned long long)data_size);
        else
            st = hp_err_set(err, HP_ERR_INPUT,
                            "%s: %llu trailing bytes follow the last tensor '%s' (which ends at %llu of a %llu-byte "
                            "data section); the file is corrupt or was appended to.", lab,
                            (unsigned long long)(data_size - at), hp_escape(s[n - 1]->name, b, sizeof b),
                            (unsigned long long)at,
                            (unsigned long long)data_size);
    }
    free(s);
    return st;
}

static hp_status parse_metadata(hp_st_file *f, const json_t *m, hp_err *err)
{
    if (!json_is_object(m))
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: __metadata__ is a JSON %s, but it must be an object of string values; the file is "
                          "corrupt.", f->m.label, json_kind(m));
    size_t n = json_object_size(m);
    f->meta_keys = hp_arena_alloc(&f->m.arena, (n ? n : 1) * sizeof *f->meta_keys);
    f->meta_values = hp_arena_alloc(&f->m.arena, (n ? n : 1) * sizeof *f->meta_values);
    if (!f->meta_keys || !f->meta_values)
        return hp_err_set(err, HP_ERR_NOMEM, "%s: out of memory reading __metadata__.", f->m.label);
    const char *k;
    json_t *v;
    char mk[256];
    json_object_foreach((json_t *)m, k, v) {
        if (!json_is_string(v))
            return hp_err_set(err, HP_ERR_INPUT,
                              "%s: __metadata__ key '%s' holds a JSON %s, but metadata values must be strings; "
                              "the file is corrupt.", f->m.label, hp_escape(k, mk, sizeof mk), json_kind(v));
        const char *ks = hp_arena_strdup(&f->m.arena, k);
        const char *vs = hp_arena_strdup(&f->m.arena, json_string_value(v));
        if (!ks || !vs)
            return hp_err_set(err, HP_ERR_NOMEM, "%s: out of memory reading __metadata__.", f->m.label);
        f->meta_keys[f->n_meta] = ks;
        f->meta_values[f->n_meta++] = vs;
    }
    return HP_OK;
}

/* Parses and validates the file f->m.buf[0, f->m.size). The length and the JSON header are copied out of the
 * mapping first (guarded), so a file truncated between open and parse is an error, not SIGBUS. */
static hp_status parse(hp_st_file *f, hp_err *err)
{
    const char *lab = f->m.label;
    if (f->m.size < 8)
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: the file is %zu bytes, smaller than the 8-byte header length; not a safetensors "
                          "file.", lab, f->m.size);
    unsigned char b[9] = {0}; /* the length field and the header's first byte */
    const size_t nb = f->m.size < sizeof b ? f->m.size : sizeof b;
    if (!hp__mapped_read(&f->m, 0, b, nb)) return hp__mapped_changed(&f->m, "the header length", err);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | b[i];
    if (n > HP_ST_MAX_HEADER)
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: header length %llu is larger than the %llu-byte limit; the file is corrupt or not a "
                          "safetensors file.%s", lab, (unsigned long long)n, HP_ST_MAX_HEADER,
                          magic_hint(b, nb));
    if (n > f->m.size - 8)
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: header length %llu runs past the end of the file (%zu bytes, %zu after the length "
                          "field); the file looks truncated.%s", lab, (unsigned long long)n, f->m.size, f->m.size - 8,
                          magic_hint(b, nb));
    if (n == 0 || b[8] != '{') /* n > 0: the file has at least 9 bytes, so b[8] was read */
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: the JSON header must begin with '{' but %s; not a safetensors file.%s", lab,
                          n == 0 ? "it is empty" : "it does not", magic_hint(b, nb));
    f->data_offset = 8 + n;
    char *copy = NULL;
    const char *hdr = (const char *)f->m.buf + 8;
    if (f->m.map) {
        copy = malloc((size_t)n);
        if (!copy) return hp_err_set(err, HP_ERR_NOMEM, "%s: out of memory for the %llu-byte header.", lab,
                                     (unsigned long long)n);
        if (!hp__mapped_read(&f->m, 8, copy, (size_t)n)) {
            free(copy);
            return hp__mapped_changed(&f->m, "the JSON header", err);
        }
        hdr = copy;
    }

    json_error_t je;
    json_t *root = json_loadb(hdr, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    hp_status st = HP_OK;
    if (!root) {
        if (json_error_code(&je) == json_error_duplicate_key) {
            char raw[512], name[512];
            duplicate_key_name(hdr, (size_t)je.position, raw, sizeof raw, je.text);
            hp_escape(raw, name, sizeof name);
            st = hp_err_set(err, HP_ERR_INPUT,
                            "%s: tensor '%s' appears twice in the header (line %d, column %d); names must be "
                            "unique. The file is corrupt.", lab, name, je.line, je.column);
        } else {
            st = hp_err_set(err, HP_ERR_INPUT,
                            "%s: the header is not valid JSON: %s (line %d, column %d); the file is corrupt or not "
                            "a safetensors file.", lab, je.text, je.line, je.column);
        }
        free(copy);
        return st;
    }
    free(copy); /* jansson keeps its own copies of names and strings */
    if (!json_is_object(root)) {
        st = hp_err_set(err, HP_ERR_INPUT,
                        "%s: the header is a JSON %s, not an object of tensors; not a safetensors file.", lab,
                        json_kind(root));
        goto done;
    }
    size_t cap = json_object_size(root);
    f->tensors = hp_calloc(cap, sizeof *f->tensors);
    f->by_name = hp_calloc(cap, sizeof *f->by_name);
    if (!f->tensors || !f->by_name) {
        st = hp_err_set(err, HP_ERR_NOMEM, "%s: out of memory for %zu tensors.", lab, cap);
        goto done;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            st = parse_metadata(f, v, err);
            if (st) goto done;
            continue;
        }
        if (key[0] == '\0') {
            st = hp_err_set(err, HP_ERR_INPUT, "%s: a tensor has an empty name; the file is corrupt.", lab);
            goto done;
        }
        hp_st_tensor *t = &f->tensors[f->n_tensors];
        st = parse_tensor(lab, key, v, t, err);
        if (st) goto done;
        t->name = hp_arena_strdup(&f->m.arena, key);
        if (!t->name) {
            st = hp_err_set(err, HP_ERR_NOMEM, "%s: out of memory for tensor names.", lab);
            goto done;
        }
        f->by_name[f->n_tensors] = t;
        f->n_tensors++;
    }
    st = check_layout(f, f->m.size - f->data_offset, err);
    if (st) goto done;
    qsort(f->by_name, f->n_tensors, sizeof *f->by_name, cmp_by_name);
    for (size_t i = 1; i < f->n_tensors; i++) {
        if (strcmp(f->by_name[i - 1]->name, f->by_name[i]->name) == 0) { /* jansson should have caught it */
            char dup[256];
            st = hp_err_set(err, HP_ERR_INPUT, "%s: tensor '%s' appears twice in the header; names must be "
                            "unique. The file is corrupt.", lab, hp_escape(f->by_name[i]->name, dup, sizeof dup));
            goto done;
        }
    }
done:
    json_decref(root);
    return st;
}

/* Parses f once its bytes are set (st: how setting them went), handing it out in *out or closing it. */
static hp_status finish_open(hp_st_file *f, hp_status st, hp_st_file **out, hp_err *err)
{
    if (st == HP_OK) st = parse(f, err);
    if (st) {
        hp_st_close(f);
        return st;
    }
    *out = f;
    return HP_OK;
}

hp_status hp_st_open_memory(hp_st_file **out, const void *buf, size_t len, const char *label, hp_err *err)
{
    *out = NULL;
    hp_st_file *f = hp_calloc(1, sizeof *f);
    if (!f) return hp__mapped_nomem(label, err);
    return finish_open(f, hp__mapped_open_memory(&f->m, buf, len, label, err), out, err);
}

hp_status hp_st_open(hp_st_file **out, const char *path, hp_err *err)
{
    *out = NULL;
    hp_st_file *f = hp_calloc(1, sizeof *f);
    if (!f) return hp__mapped_nomem(path, err);
    /* Files under 8 bytes are not mapped: parse refuses them by their size without reading them. */
    return finish_open(f, hp__mapped_open(&f->m, path, 8, err), out, err);
}

void hp_st_close(hp_st_file *f)
{
    if (!f) return;
    hp__mapped_close(&f->m);
    free(f->tensors);
    free(f->by_name);
    free(f);
}

const char *hp_st_path(const hp_st_file *f) { return f->m.label; }
uint64_t hp_st_file_size(const hp_st_file *f) { return f->m.size; }
uint64_t hp_st_data_offset(const hp_st_file *f) { return f->data_offset; }
size_t hp_st_count(const hp_st_file *f) { return f->n_tensors; }

const hp_st_tensor *hp_st_tensor_at(const hp_st_file *f, size_t i)
{
    return i < f->n_tensors ? &f->tensors[i] : NULL;
}

const hp_st_tensor *hp_st_find(const hp_st_file *f, const char *name)
{
    size_t lo = 0, hi = f->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->by_name[mid]->name, name);
        if (c == 0) return f->by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const void *hp_st_data(const hp_st_file *f, const hp_st_tensor *t) { return f->m.buf + f->data_offset + t->begin; }

hp_status hp_st_read(const hp_st_file *f, const hp_st_tensor *t, uint64_t off, void *dst, size_t n, hp_err *err)
{
    const uint64_t bytes = t->end - t->begin;
    if (off > bytes || n > bytes - off)
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: tensor '%s': bytes [%llu, %llu) asked for are outside its %llu bytes.", f->m.label,
                          t->name, (unsigned long long)off, (unsigned long long)off + n, (unsigned long long)bytes);
    if (n == 0) return HP_OK;
    /* Test hook (hp_test_hooks.pause_before_read = P): pauses the first read of a mapped file (P.ready, then
     * P.go), so a test truncates the file at exactly this point; with pause_read_of = NAME only a file whose
     * path holds NAME counts (the input ids are read before a shard folder's rank file is opened). */
    const hp_test_hooks *hk = hp__test_hooks();
    if (hk->pause_before_read && f->m.map && (!hk->pause_read_of || strstr(hp_st_path(f), hk->pause_read_of)))
        hp__test_pause(hk->pause_before_read, true);
    if (hp__mapped_read(&f->m, f->data_offset + t->begin + off, dst, n)) return HP_OK;
    char what[600];
    snprintf(what, sizeof what, "tensor '%s'", t->name);
    return hp__mapped_changed(&f->m, what, err);
}

size_t hp_st_metadata_count(const hp_st_file *f) { return f->n_meta; }

void hp_st_metadata_at(const hp_st_file *f, size_t i, const char **key, const char **value)
{
    bool ok = i < f->n_meta;
    if (key) *key = ok ? f->meta_keys[i] : NULL;
    if (value) *value = ok ? f->meta_values[i] : NULL;
}

const char *hp_st_metadata_get(const hp_st_file *f, const char *key)
{
    for (size_t i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
    return NULL;
}
