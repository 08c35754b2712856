/*
 * gguf.c — strict GGUF reader: maps a file (or takes a buffer) and validates all of it before any value or
 * tensor is handed out. Dequantization and the type table are in gguf_quant.c.
 *
 *   +--------+---------+--------------+----------+-----------------+----------------+---------+-------------+
 *   | "GGUF" | u32 ver | u64 n_tensor | u64 n_kv | n_kv key/values | n_tensor infos | padding | tensor data |
 *   +--------+---------+--------------+----------+-----------------+----------------+---------+-------------+
 *   0        4         8              16         24                                   data_offset = the end of
 *                                                                                     the infos rounded up to
 *                                                                                     the alignment
 *
 * Every field is read through one cursor (take) that checks the bytes it needs against the file size before it
 * copies them (a guarded copy out of the mapping, so a file truncated meanwhile is an error, not SIGBUS).
 * Counts are checked against the bytes left before anything is allocated for them: a key/value takes at least
 * 13 bytes, a tensor info at least 25, an array element at least 1 (a string 8), so a lying count fails at
 * once instead of allocating. The values, names and strings are copied into one arena; nothing points into the
 * mapping except tensor data, read with hp_gguf_read.
 *
 * Invariants once hp_gguf_open returns HP_OK (callers never re-check): version 2 or 3; keys unique, non-empty,
 * at most 65535 bytes; value, element and ggml types known; BOOL values 0 or 1; general.alignment, when given,
 * a UINT32 power of two; tensor names unique, 1..64 bytes, without NUL; 0..4 dims whose product and byte size
 * fit in int64; ne[0] a multiple of the type's block; offsets aligned; each tensor's bytes inside the data
 * section and no two tensors overlapping. Bytes between or after tensors (padding) are allowed, as llama.cpp
 * reads only the bytes its tensors name.
 */
#include "hyperpar/gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/mapped.h"

/* The spec's default when general.alignment is absent. */
#define DEFAULT_ALIGNMENT 32u
/* The spec's limit on a key's length. */
#define MAX_KEY 65535u
/* Smallest encodings, used to bound counts before allocating: a key/value is a non-empty key (8 + 1), a type
 * (4) and a value of at least 1 byte (a string value needs 8, a BOOL 1); a tensor info is a non-empty name
 * (8 + 1), n_dims (4), the type (4) and the offset (8). */
#define MIN_KV_BYTES 14u
#define MIN_TENSOR_BYTES 25u

struct hp_gguf_file {
    hp__mapped m; /* the bytes, the label (path or caller's label) and the arena of values, names and strings */
    uint32_t version;
    uint64_t alignment, data_offset;
    hp_gguf_kv *kvs; /* [n_kv], file order */
    size_t n_kv;
    hp_gguf_tensor *tensors; /* [n_tensors], file order */
    size_t n_tensors;
    const hp_gguf_kv **kv_sorted;         /* by key */
    const hp_gguf_tensor **tensor_sorted; /* by name */
};

static const char *const g_vtype_names[HP_GGUF_VTYPE_COUNT] = {
    "UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32", "BOOL", "STRING", "ARRAY", "UINT64", "INT64",
    "FLOAT64"};
/* Bytes of one value in the file (0: variable, STRING and ARRAY). */
static const uint8_t g_vtype_file_bytes[HP_GGUF_VTYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
/* Bytes of one array element as this reader stores it (hp_gguf_kv.arr). */
static const uint8_t g_vtype_mem_bytes[HP_GGUF_VTYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, sizeof(bool),
                                                               sizeof(hp_gguf_str), 0, 8, 8, 8};

const char *hp_gguf_vtype_name(hp_gguf_vtype t) { return (unsigned)t < HP_GGUF_VTYPE_COUNT ? g_vtype_names[t] : "?"; }

/* ---- the cursor ---- */

typedef struct cur {
    hp_gguf_file *f;
    uint64_t pos;
    hp_err *err;
} cur;

/* Copies the next n bytes into dst (NULL: skips them). where/field name the field for the message: "metadata
 * key 7 ('general.name')" and "its string length"; idx >= 0 is appended to field as an element index. */
static hp_status take(cur *c, void *dst, uint64_t n, const char *where, const char *field, int64_t idx)
{
    const uint64_t left = c->f->m.size - c->pos;
    if (n > left) {
        char ix[32] = "";
        if (idx >= 0) snprintf(ix, sizeof ix, " %lld", (long long)idx);
        return hp_err_set(c->err, HP_ERR_INPUT,
                          "%s: %s: %s%s needs %llu bytes at byte %llu but the file ends at byte %llu; the file is "
                          "truncated or the field before it is corrupt.", c->f->m.label, where, field, ix,
                          (unsigned long long)n, (unsigned long long)c->pos, (unsigned long long)c->f->m.size);
    }
    if (dst && n && !hp__mapped_copy(&c->f->m, c->pos, dst, (size_t)n)) return hp__mapped_changed(&c->f->m, where, c->err);
    c->pos += n;
    return HP_OK;
}

static uint64_t le64(const uint8_t *b)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}

static hp_status take_u32(cur *c, uint32_t *v, const char *where, const char *field)
{
    uint8_t b[4];
    hp_status st = take(c, b, 4, where, field, -1);
    *v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    return st;
}

static hp_status take_u64(cur *c, uint64_t *v, const char *where, const char *field, int64_t idx)
{
    uint8_t b[8];
    hp_status st = take(c, b, 8, where, field, idx);
    *v = le64(b);
    return st;
}

/* A string: u64 length, then the bytes, copied into the arena with a NUL after them. max: the largest length
 * allowed (0: any that fits the file). */
static hp_status take_str(cur *c, hp_gguf_str *out, uint64_t max, const char *where, const char *what, int64_t idx)
{
    uint64_t len;
    if (c->f->m.size - c->pos < 8) { /* the message's field name is built only when it is needed */
        char field[96];
        snprintf(field, sizeof field, "%s's length", what);
        return take(c, NULL, 8, where, field, idx);
    }
    hp_status st = take_u64(c, &len, where, what, idx);
    if (st) return st;
    if (max && len > max)
        return hp_err_set(c->err, HP_ERR_INPUT,
                          "%s: %s: %s is %llu bytes, more than the %llu the GGUF specification allows; the file is "
                          "corrupt.", c->f->m.label, where, what, (unsigned long long)len, (unsigned long long)max);
    if (len > c->f->m.size - c->pos) return take(c, NULL, len, where, what, idx);
    char *s = hp_arena_alloc(&c->f->m.arena, (size_t)len + 1);
    if (!s) return hp_err_set(c->err, HP_ERR_NOMEM, "%s: out of memory for a %llu-byte string.", c->f->m.label,
                              (unsigned long long)len);
    st = take(c, s, len, where, what, idx);
    out->s = s;
    out->len = len;
    return st;
}

/* ---- metadata ---- */

/* One scalar of type t from the file into the kv's union (or, for arrays, element i of the stored array). */
static hp_status take_scalar(cur *c, hp_gguf_vtype t, hp_gguf_kv *kv, void *arr, uint64_t i, const char *where)
{
    uint8_t b[8] = {0};
    const int64_t idx = arr ? (int64_t)i : -1;
    const char *field = arr ? "element" : "the value";
    hp_status st = t == HP_GGUF_STRING ? HP_OK : take(c, b, g_vtype_file_bytes[t], where, field, idx);
    if (st) return st;
    uint64_t u = le64(b);
    switch (t) {
    case HP_GGUF_U8: if (arr) ((uint8_t *)arr)[i] = (uint8_t)u; else kv->v.u = u; break;
    case HP_GGUF_I8: if (arr) ((int8_t *)arr)[i] = (int8_t)u; else kv->v.i = (int8_t)u; break;
    case HP_GGUF_U16: if (arr) ((uint16_t *)arr)[i] = (uint16_t)u; else kv->v.u = u; break;
    case HP_GGUF_I16: if (arr) ((int16_t *)arr)[i] = (int16_t)u; else kv->v.i = (int16_t)u; break;
    case HP_GGUF_U32: if (arr) ((uint32_t *)arr)[i] = (uint32_t)u; else kv->v.u = u; break;
    case HP_GGUF_I32: if (arr) ((int32_t *)arr)[i] = (int32_t)(uint32_t)u; else kv->v.i = (int32_t)(uint32_t)u; break;
    case HP_GGUF_U64: if (arr) ((uint64_t *)arr)[i] = u; else kv->v.u = u; break;
    case HP_GGUF_I64: if (arr) ((int64_t *)arr)[i] = (int64_t)u; else kv->v.i = (int64_t)u; break;
    case HP_GGUF_F32: {
        float f;
        uint32_t w = (uint32_t)u;
        memcpy(&f, &w, sizeof f);
        if (arr) ((float *)arr)[i] = f; else kv->v.f = f;
        break;
    }
    case HP_GGUF_F64: {
        double d;
        memcpy(&d, &u, sizeof d);
        if (arr) ((double *)arr)[i] = d; else kv->v.f = d;
        break;
    }
    case HP_GGUF_BOOL:
        if (u > 1) {
            char ix[48] = "";
            if (arr) snprintf(ix, sizeof ix, " (element %llu)", (unsigned long long)i);
            return hp_err_set(c->err, HP_ERR_INPUT,
                              "%s: %s: a BOOL%s holds the byte %llu; booleans must be 0 or 1. The file is corrupt.",
                              c->f->m.label, where, ix, (unsigned long long)u);
        }
        if (arr) ((bool *)arr)[i] = u == 1; else kv->v.b = u == 1;
        break;
    case HP_GGUF_STRING:
        return take_str(c, arr ? &((hp_gguf_str *)arr)[i] : &kv->v.s, 0, where, arr ? "string" : "the string",
                        idx);
    default: break; /* ARRAY never reaches here; the count is checked by the caller */
    }
    return HP_OK;
}

static hp_status unknown_vtype(cur *c, uint32_t t, const char *where, const char *what)
{
    return hp_err_set(c->err, HP_ERR_INPUT,
                      "%s: %s: unknown %s %u; GGUF value types are 0..12 (UINT8, INT8, UINT16, INT16, UINT32, INT32, "
                      "FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64). The file is corrupt or from a newer "
                      "GGUF version.", c->f->m.label, where, what, t);
}

static hp_status take_array(cur *c, hp_gguf_kv *kv, const char *where)
{
    uint32_t et;
    hp_status st = take_u32(c, &et, where, "the array's element type");
    if (st) return st;
    if (et >= HP_GGUF_VTYPE_COUNT) return unknown_vtype(c, et, where, "array element type");
    if (et == HP_GGUF_ARRAY)
        return hp_err_set(c->err, HP_ERR_INPUT,
                          "%s: %s: an array of arrays; nested arrays are not supported (llama.cpp does not read them "
                          "either).", c->f->m.label, where);
    kv->elem = (hp_gguf_vtype)et;
    st = take_u64(c, &kv->n, where, "the array's element count", -1);
    if (st) return st;
    const uint64_t min = et == HP_GGUF_STRING ? 8 : g_vtype_file_bytes[et], left = c->f->m.size - c->pos;
    if (kv->n > left / min)
        return hp_err_set(c->err, HP_ERR_INPUT,
                          "%s: %s: the array claims %llu elements of %s (at least %llu bytes each) but only %llu bytes "
                          "are left in the file; the count is corrupt or the file is truncated.", c->f->m.label, where,
                          (unsigned long long)kv->n, g_vtype_names[et], (unsigned long long)min,
                          (unsigned long long)left);
    void *arr = hp_arena_alloc(&c->f->m.arena, (size_t)(kv->n ? kv->n : 1) * g_vtype_mem_bytes[et]);
    if (!arr) return hp_err_set(c->err, HP_ERR_NOMEM, "%s: %s: out of memory for %llu array elements.", c->f->m.label,
                                where, (unsigned long long)kv->n);
    kv->arr = arr;
    for (uint64_t i = 0; i < kv->n; i++) {
        st = take_scalar(c, kv->elem, kv, arr, i, where);
        if (st) return st;
    }
    return HP_OK;
}

/* What take_name reads: a key/value's key or a tensor info's name. */
typedef struct name_rule {
    const char *entry;        /* the entry, as where names it before its name is known: "tensor info" 3 */
    const char *field, *noun; /* the name's field in take_str's messages; the subject of the refusal */
    const char *rule;         /* the refusal's end */
    uint64_t max;             /* the longest name allowed */
} name_rule;

static const name_rule KEY_NAME = {"metadata key/value", "the key", "the key",
                                   "keys must be non-empty text. The file is corrupt.", MAX_KEY};
static const name_rule TENSOR_NAME = {"tensor info", "the name", "the tensor name", "the file is corrupt.",
                                      HP_GGUF_MAX_NAME};

/* The name that begins entry i: a string of 1..r->max bytes without NUL, copied into the arena (*out). where[cap]
 * is set to "ENTRY I" for the messages; the caller renames it by the name once it has it. */
static hp_status take_name(cur *c, const name_rule *r, uint64_t i, char *where, size_t cap, const char **out)
{
    snprintf(where, cap, "%s %llu", r->entry, (unsigned long long)i);
    hp_gguf_str s;
    hp_status st = take_str(c, &s, r->max, where, r->field, -1);
    if (st) return st;
    if (s.len == 0 || strlen(s.s) != s.len)
        return hp_err_set(c->err, HP_ERR_INPUT, "%s: %s: %s is %s; %s", c->f->m.label, where, r->noun,
                          s.len ? "holds a NUL byte" : "empty", r->rule);
    *out = s.s;
    return HP_OK;
}

static hp_status take_kv(cur *c, hp_gguf_kv *kv, uint64_t i)
{
    char where[160], name[96];
    hp_status st = take_name(c, &KEY_NAME, i, where, sizeof where, &kv->key);
    if (st) return st;
    snprintf(where, sizeof where, "metadata key %llu ('%s')", (unsigned long long)i,
             hp_escape(kv->key, name, sizeof name));
    uint32_t t;
    st = take_u32(c, &t, where, "the value type");
    if (st) return st;
    if (t >= HP_GGUF_VTYPE_COUNT) return unknown_vtype(c, t, where, "value type");
    kv->type = kv->elem = (hp_gguf_vtype)t;
    kv->n = 1;
    return t == HP_GGUF_ARRAY ? take_array(c, kv, where) : take_scalar(c, kv->type, kv, NULL, 0, where);
}

/* ---- tensor infos ---- */

static hp_status take_tensor(cur *c, hp_gguf_tensor *t, uint64_t i)
{
    char where[160], name[96];
    hp_status st = take_name(c, &TENSOR_NAME, i, where, sizeof where, &t->name);
    if (st) return st;
    snprintf(where, sizeof where, "tensor '%s'", hp_escape(t->name, name, sizeof name));
    uint32_t nd;
    if ((st = take_u32(c, &nd, where, "n_dims"))) return st;
    if (nd > HP_GGUF_MAX_DIMS)
        return hp_err_set(c->err, HP_ERR_INPUT, "%s: %s: n_dims is %u, more than ggml's %d; the file is corrupt.",
                          c->f->m.label, where, nd, HP_GGUF_MAX_DIMS);
    t->n_dims = (int)nd;
    t->n_elems = 1;
    for (int d = 0; d < HP_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (int d = 0; d < (int)nd; d++) {
        uint64_t v;
        if ((st = take_u64(c, &v, where, "dimension", d))) return st;
        if (v > (uint64_t)INT64_MAX || !hp_mul_i64(t->n_elems, (int64_t)v, &t->n_elems))
            return hp_err_set(c->err, HP_ERR_INPUT,
                              "%s: %s: dimension %d is %llu; the element count overflows a 64-bit integer. The file "
                              "is corrupt.", c->f->m.label, where, d, (unsigned long long)v);
        t->ne[d] = (int64_t)v;
    }
    if ((st = take_u32(c, &t->type, where, "the type"))) return st;
    int64_t be, bb, nbytes;
    if (!hp_ggml_type_block(t->type, &be, &bb))
        return hp_err_set(c->err, HP_ERR_INPUT,
                          "%s: %s: unknown ggml type %u; the file is from a newer ggml or corrupt.", c->f->m.label,
                          where, t->type);
    if (t->ne[0] % be)
        return hp_err_set(c->err, HP_ERR_INPUT,
                          "%s: %s: the row length ne[0] = %lld is not a multiple of %s's block of %lld elements; the "
                          "file is corrupt.", c->f->m.label, where, (long long)t->ne[0], hp_ggml_type_name(t->type),
                          (long long)be);
    if (!hp_mul_i64(t->n_elems / be, bb, &nbytes))
        return hp_err_set(c->err, HP_ERR_INPUT, "%s: %s: the byte size of %lld %s elements overflows a 64-bit "
                          "integer; the file is corrupt.", c->f->m.label, where, (long long)t->n_elems,
                          hp_ggml_type_name(t->type));
    t->nbytes = (uint64_t)nbytes;
    if ((st = take_u64(c, &t->offset, where, "the offset", -1))) return st;
    if (t->offset % c->f->alignment)
        return hp_err_set(c->err, HP_ERR_INPUT,
                          "%s: %s: offset %llu is not a multiple of the alignment %llu; the file is corrupt.",
                          c->f->m.label, where, (unsigned long long)t->offset, (unsigned long long)c->f->alignment);
    return HP_OK;
}

/* ---- checks over the whole file ---- */

static int cmp_kv(const void *a, const void *b)
{
    return strcmp((*(const hp_gguf_kv *const *)a)->key, (*(const hp_gguf_kv *const *)b)->key);
}

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp((*(const hp_gguf_tensor *const *)a)->name, (*(const hp_gguf_tensor *const *)b)->name);
}

static int cmp_tensor_offset(const void *a, const void *b)
{
    const hp_gguf_tensor *x = *(const hp_gguf_tensor *const *)a, *y = *(const hp_gguf_tensor *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return x < y ? -1 : (x > y);
}

/* general.alignment: a UINT32 power of two; absent: 32. */
static hp_status read_alignment(hp_gguf_file *f, hp_err *err)
{
    f->alignment = DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < f->n_kv; i++) {
        const hp_gguf_kv *kv = &f->kvs[i];
        if (strcmp(kv->key, "general.alignment") != 0) continue;
        if (kv->type != HP_GGUF_U32)
            return hp_err_set(err, HP_ERR_INPUT, "%s: general.alignment is a %s; it must be a UINT32. The file is "
                              "corrupt.", f->m.label, g_vtype_names[kv->type]);
        if (kv->v.u == 0 || (kv->v.u & (kv->v.u - 1)))
            return hp_err_set(err, HP_ERR_INPUT, "%s: general.alignment is %llu; it must be a power of two. The "
                              "file is corrupt.", f->m.label, (unsigned long long)kv->v.u);
        f->alignment = kv->v.u;
    }
    return HP_OK;
}

static hp_status check_unique(hp_gguf_file *f, hp_err *err)
{
    char a[96];
    qsort(f->kv_sorted, f->n_kv, sizeof *f->kv_sorted, cmp_kv);
    for (size_t i = 1; i < f->n_kv; i++)
        if (strcmp(f->kv_sorted[i - 1]->key, f->kv_sorted[i]->key) == 0)
            return hp_err_set(err, HP_ERR_INPUT, "%s: metadata key '%s' appears twice; keys must be unique. The file "
                              "is corrupt.", f->m.label, hp_escape(f->kv_sorted[i]->key, a, sizeof a));
    qsort(f->tensor_sorted, f->n_tensors, sizeof *f->tensor_sorted, cmp_tensor_name);
    for (size_t i = 1; i < f->n_tensors; i++)
        if (strcmp(f->tensor_sorted[i - 1]->name, f->tensor_sorted[i]->name) == 0)
            return hp_err_set(err, HP_ERR_INPUT, "%s: tensor '%s' appears twice; names must be unique. The file is "
                              "corrupt.", f->m.label, hp_escape(f->tensor_sorted[i]->name, a, sizeof a));
    return HP_OK;
}

/* Each tensor's bytes inside the data section, and no two overlapping. */
static hp_status check_data(hp_gguf_file *f, hp_err *err)
{
    char a[96], b[96];
    const uint64_t data = f->data_offset <= f->m.size ? f->m.size - f->data_offset : 0;
    if (f->n_tensors && f->data_offset > f->m.size)
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: the data section begins at byte %llu (the end of the tensor infos aligned to %llu) "
                          "but the file ends at byte %zu; the file is truncated.", f->m.label,
                          (unsigned long long)f->data_offset, (unsigned long long)f->alignment, f->m.size);
    for (size_t i = 0; i < f->n_tensors; i++) {
        const hp_gguf_tensor *t = &f->tensors[i];
        if (t->offset > data || t->nbytes > data - t->offset)
            return hp_err_set(err, HP_ERR_INPUT,
                              "%s: tensor '%s': its %llu bytes at offset %llu run past the end of the %llu-byte data "
                              "section; the file is truncated or the offset is corrupt.", f->m.label,
                              hp_escape(t->name, a, sizeof a), (unsigned long long)t->nbytes,
                              (unsigned long long)t->offset, (unsigned long long)data);
    }
    const hp_gguf_tensor **s = hp_calloc(f->n_tensors, sizeof *s);
    if (!s) return hp_err_set(err, HP_ERR_NOMEM, "%s: out of memory sorting %zu tensors.", f->m.label, f->n_tensors);
    for (size_t i = 0; i < f->n_tensors; i++) s[i] = &f->tensors[i];
    qsort(s, f->n_tensors, sizeof *s, cmp_tensor_offset);
    hp_status st = HP_OK;
    for (size_t i = 1; i < f->n_tensors && !st; i++)
        if (s[i]->nbytes && s[i - 1]->offset + s[i - 1]->nbytes > s[i]->offset)
            st = hp_err_set(err, HP_ERR_INPUT,
                            "%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap in the data section; the "
                            "file is corrupt.", f->m.label, hp_escape(s[i - 1]->name, a, sizeof a),
                            (unsigned long long)s[i - 1]->offset, (unsigned long long)(s[i - 1]->offset + s[i - 1]->nbytes),
                            hp_escape(s[i]->name, b, sizeof b), (unsigned long long)s[i]->offset,
                            (unsigned long long)(s[i]->offset + s[i]->nbytes));
    free(s);
    return st;
}

/* The magic and the version. */
static hp_status check_head(cur *c)
{
    hp_gguf_file *f = c->f;
    uint8_t m[4] = {0};
    if (f->m.size < 4)
        return hp_err_set(c->err, HP_ERR_INPUT, "%s: the file is %zu bytes, too small to hold the GGUF magic; not a "
                          "GGUF file.", f->m.label, f->m.size);
    hp_status st = take(c, m, 4, "the header", "the magic", -1);
    if (st) return st;
    if (memcmp(m, "GGUF", 4) != 0)
        return hp_err_set(c->err, HP_ERR_INPUT, "%s: the file begins with the bytes %02x %02x %02x %02x, not the "
                          "GGUF magic 'GGUF'; not a GGUF file.", f->m.label, m[0], m[1], m[2], m[3]);
    if ((st = take_u32(c, &f->version, "the header", "the version"))) return st;
    if (f->version == 2 || f->version == 3) return HP_OK;
    if (f->version == 1)
        return hp_err_set(c->err, HP_ERR_INPUT, "%s: GGUF version 1 (32-bit counts) is not supported; versions 2 "
                          "and 3 are. Convert the file again with a current llama.cpp.", f->m.label);
    if (f->version == 0x02000000u || f->version == 0x03000000u)
        return hp_err_set(c->err, HP_ERR_INPUT, "%s: the version field reads %u when read little-endian: this is a "
                          "big-endian GGUF file, which is not supported.", f->m.label, f->version);
    return hp_err_set(c->err, HP_ERR_INPUT, "%s: unknown GGUF version %u; versions 2 and 3 are supported.", f->m.label,
                      f->version);
}

/* The counts, bounded by the bytes left before anything is allocated for them. */
static hp_status take_counts(cur *c, uint64_t *n_tensors, uint64_t *n_kv)
{
    hp_status st = take_u64(c, n_tensors, "the header", "tensor_count", -1);
    if (!st) st = take_u64(c, n_kv, "the header", "metadata_kv_count", -1);
    if (st) return st;
    const uint64_t left = c->f->m.size - c->pos;
    if (*n_kv > left / MIN_KV_BYTES || *n_tensors > left / MIN_TENSOR_BYTES ||
        *n_kv * MIN_KV_BYTES > left - *n_tensors * MIN_TENSOR_BYTES)
        return hp_err_set(c->err, HP_ERR_INPUT,
                          "%s: the header claims %llu tensors and %llu metadata key/values, which cannot fit in the "
                          "%llu bytes after it (each key/value takes at least %u bytes, each tensor info %u); the "
                          "counts are corrupt or the file is truncated.", c->f->m.label, (unsigned long long)*n_tensors,
                          (unsigned long long)*n_kv, (unsigned long long)left, MIN_KV_BYTES, MIN_TENSOR_BYTES);
    return HP_OK;
}

static hp_status parse(hp_gguf_file *f, hp_err *err)
{
    cur c = {.f = f, .pos = 0, .err = err};
    uint64_t n_tensors, n_kv;
    hp_status st = check_head(&c);
    if (!st) st = take_counts(&c, &n_tensors, &n_kv);
    if (st) return st;
    f->kvs = hp_calloc((size_t)n_kv, sizeof *f->kvs);
    f->kv_sorted = hp_calloc((size_t)n_kv, sizeof *f->kv_sorted);
    f->tensors = hp_calloc((size_t)n_tensors, sizeof *f->tensors);
    f->tensor_sorted = hp_calloc((size_t)n_tensors, sizeof *f->tensor_sorted);
    if (!f->kvs || !f->kv_sorted || !f->tensors || !f->tensor_sorted)
        return hp_err_set(err, HP_ERR_NOMEM, "%s: out of memory for %llu key/values and %llu tensors.", f->m.label,
                          (unsigned long long)n_kv, (unsigned long long)n_tensors);
    for (uint64_t i = 0; i < n_kv; i++, f->n_kv++) {
        if ((st = take_kv(&c, &f->kvs[i], i))) return st;
        f->kv_sorted[i] = &f->kvs[i];
    }
    if ((st = read_alignment(f, err))) return st;
    for (uint64_t i = 0; i < n_tensors; i++, f->n_tensors++) {
        if ((st = take_tensor(&c, &f->tensors[i], i))) return st;
        f->tensor_sorted[i] = &f->tensors[i];
    }
    /* The data section begins at the end of the infos rounded up to the alignment (c.pos <= size, so no
     * overflow: size and alignment are far below 2^63). */
    f->data_offset = (c.pos + f->alignment - 1) / f->alignment * f->alignment;
    if ((st = check_unique(f, err)) || (st = check_data(f, err))) return st;
    if (!hp__mapped_still_holds(&f->m, f->m.size)) return hp__mapped_changed(&f->m, "the header", err);
    return HP_OK;
}

/* ---- open / close ---- */

/* Parses f once its bytes are set (st: how setting them went), handing it out in *out or closing it. */
static hp_status finish_open(hp_gguf_file *f, hp_status st, hp_gguf_file **out, hp_err *err)
{
    if (st == HP_OK) st = parse(f, err);
    if (st) {
        hp_gguf_close(f);
        return st;
    }
    *out = f;
    return HP_OK;
}

hp_status hp_gguf_open_memory(hp_gguf_file **out, const void *buf, size_t len, const char *label, hp_err *err)
{
    *out = NULL;
    hp_gguf_file *f = hp_calloc(1, sizeof *f);
    if (!f) return hp__mapped_nomem(label, err);
    return finish_open(f, hp__mapped_open_memory(&f->m, buf, len, label, err), out, err);
}

hp_status hp_gguf_open(hp_gguf_file **out, const char *path, hp_err *err)
{
    *out = NULL;
    hp_gguf_file *f = hp_calloc(1, sizeof *f);
    if (!f) return hp__mapped_nomem(path, err);
    return finish_open(f, hp__mapped_open(&f->m, path, 1, err), out, err); /* an empty file is not mapped */
}

void hp_gguf_close(hp_gguf_file *f)
{
    if (!f) return;
    hp__mapped_close(&f->m);
    free(f->kvs);
    free(f->kv_sorted);
    free(f->tensors);
    free(f->tensor_sorted);
    free(f);
}

bool hp_gguf_is_gguf(const char *path)
{
    int fd = -1;
    hp_err err;
    if (hp_open_regular(path, &fd, &err) != HP_OK) return false;
    char m[4];
    bool yes = read(fd, m, 4) == 4 && memcmp(m, "GGUF", 4) == 0;
    close(fd);
    return yes;
}

const char *hp_gguf_path(const hp_gguf_file *f) { return f->m.label; }
uint32_t hp_gguf_version(const hp_gguf_file *f) { return f->version; }
uint64_t hp_gguf_file_size(const hp_gguf_file *f) { return f->m.size; }
uint64_t hp_gguf_alignment(const hp_gguf_file *f) { return f->alignment; }
uint64_t hp_gguf_data_offset(const hp_gguf_file *f) { return f->data_offset; }
size_t hp_gguf_kv_count(const hp_gguf_file *f) { return f->n_kv; }
size_t hp_gguf_tensor_count(const hp_gguf_file *f) { return f->n_tensors; }

const hp_gguf_kv *hp_gguf_kv_at(const hp_gguf_file *f, size_t i) { return i < f->n_kv ? &f->kvs[i] : NULL; }

const hp_gguf_tensor *hp_gguf_tensor_at(const hp_gguf_file *f, size_t i)
{
    return i < f->n_tensors ? &f->tensors[i] : NULL;
}

const hp_gguf_kv *hp_gguf_find_kv(const hp_gguf_file *f, const char *key)
{
    hp_gguf_kv probe = {.key = key};
    const hp_gguf_kv *p = &probe, **hit = bsearch(&p, f->kv_sorted, f->n_kv, sizeof *f->kv_sorted, cmp_kv);
    return hit ? *hit : NULL;
}

const hp_gguf_tensor *hp_gguf_find_tensor(const hp_gguf_file *f, const char *name)
{
    hp_gguf_tensor probe = {.name = name};
    const hp_gguf_tensor *p = &probe,
                         **hit = bsearch(&p, f->tensor_sorted, f->n_tensors, sizeof *f->tensor_sorted, cmp_tensor_name);
    return hit ? *hit : NULL;
}

/* ---- typed lookups ---- */

static hp_status wrong_type(const hp_gguf_file *f, const hp_gguf_kv *kv, const char *want, hp_err *err)
{
    char k[96];
    if (kv->type == HP_GGUF_ARRAY)
        return hp_err_set(err, HP_ERR_INPUT, "%s: metadata key '%s' is an ARRAY of %s; expected %s.", f->m.label,
                          hp_escape(kv->key, k, sizeof k), g_vtype_names[kv->elem], want);
    return hp_err_set(err, HP_ERR_INPUT, "%s: metadata key '%s' is a %s; expected %s.", f->m.label,
                      hp_escape(kv->key, k, sizeof k), g_vtype_names[kv->type], want);
}

hp_status hp_gguf_get_int(const hp_gguf_file *f, const char *key, int64_t *out, bool *found, hp_err *err)
{
    const hp_gguf_kv *kv = hp_gguf_find_kv(f, key);
    *found = kv != NULL;
    if (!kv) return HP_OK;
    switch (kv->type) {
    case HP_GGUF_U8: case HP_GGUF_U16: case HP_GGUF_U32: case HP_GGUF_U64:
        if (kv->v.u > (uint64_t)INT64_MAX) break;
        *out = (int64_t)kv->v.u;
        return HP_OK;
    case HP_GGUF_I8: case HP_GGUF_I16: case HP_GGUF_I32: case HP_GGUF_I64:
        *out = kv->v.i;
        return HP_OK;
    default: return wrong_type(f, kv, "an integer", err);
    }
    char k[96];
    return hp_err_set(err, HP_ERR_INPUT, "%s: metadata key '%s' is %llu, beyond a 64-bit signed integer.", f->m.label,
                      hp_escape(key, k, sizeof k), (unsigned long long)kv->v.u);
}

hp_status hp_gguf_get_float(const hp_gguf_file *f, const char *key, double *out, bool *found, hp_err *err)
{
    const hp_gguf_kv *kv = hp_gguf_find_kv(f, key);
    *found = kv != NULL;
    if (!kv) return HP_OK;
    if (kv->type != HP_GGUF_F32 && kv->type != HP_GGUF_F64) return wrong_type(f, kv, "a FLOAT32 or FLOAT64", err);
    *out = kv->v.f;
    return HP_OK;
}

hp_status hp_gguf_get_bool(const hp_gguf_file *f, const char *key, bool *out, bool *found, hp_err *err)
{
    const hp_gguf_kv *kv = hp_gguf_find_kv(f, key);
    *found = kv != NULL;
    if (!kv) return HP_OK;
    if (kv->type != HP_GGUF_BOOL) return wrong_type(f, kv, "a BOOL", err);
    *out = kv->v.b;
    return HP_OK;
}

hp_status hp_gguf_get_string(const hp_gguf_file *f, const char *key, const hp_gguf_str **out, hp_err *err)
{
    const hp_gguf_kv *kv = hp_gguf_find_kv(f, key);
    *out = NULL;
    if (!kv) return HP_OK;
    if (kv->type != HP_GGUF_STRING) return wrong_type(f, kv, "a STRING", err);
    *out = &kv->v.s;
    return HP_OK;
}

hp_status hp_gguf_get_array(const hp_gguf_file *f, const char *key, hp_gguf_vtype elem, const hp_gguf_kv **out,
                            hp_err *err)
{
    const hp_gguf_kv *kv = hp_gguf_find_kv(f, key);
    *out = NULL;
    if (!kv) return HP_OK;
    if (kv->type != HP_GGUF_ARRAY || kv->elem != elem) {
        char want[48];
        snprintf(want, sizeof want, "an ARRAY of %s", hp_gguf_vtype_name(elem));
        return wrong_type(f, kv, want, err);
    }
    *out = kv;
    return HP_OK;
}

/* ---- tensor data ---- */

hp_status hp_gguf_read(const hp_gguf_file *f, const hp_gguf_tensor *t, uint64_t off, void *dst, size_t n,
                       hp_err *err)
{
    char a[96];
    if (off > t->nbytes || n > t->nbytes - off)
        return hp_err_set(err, HP_ERR_INPUT, "%s: tensor '%s': bytes [%llu, %llu) asked for are outside its %llu "
                          "bytes.", f->m.label, hp_escape(t->name, a, sizeof a), (unsigned long long)off,
                          (unsigned long long)off + n, (unsigned long long)t->nbytes);
    if (n == 0) return HP_OK;
    const uint64_t at = f->data_offset + t->offset + off;
    if (hp__mapped_read(&f->m, at, dst, n)) return HP_OK;
    char what[160];
    snprintf(what, sizeof what, "tensor '%s'", hp_escape(t->name, a, sizeof a));
    return hp__mapped_changed(&f->m, what, err);
}

/* The raw bytes are read into the end of dst and dequantized forwards, block by block through a small copy:
 * every dequantizable type takes at most 4 bytes per element, so block b's output, which ends at 4 * (b + 1) *
 * block elements, never reaches a raw block after b. */
hp_status hp_gguf_read_f32(const hp_gguf_file *f, const hp_gguf_tensor *t, int64_t row, int64_t n_rows, float *dst,
                           hp_err *err)
{
    char a[96];
    int64_t be, bb;
    if (!hp_ggml_type_dequantizable(t->type))
        return hp_err_set(err, HP_ERR_INPUT, "%s: tensor '%s' is %s, which hyperpar cannot dequantize (it reads %s).",
                          f->m.label, hp_escape(t->name, a, sizeof a), hp_ggml_type_name(t->type),
                          hp_ggml_dequantizable_list());
    hp_ggml_type_block(t->type, &be, &bb);
    const int64_t cols = t->ne[0], rows = cols ? t->n_elems / cols : 0;
    if (row < 0 || n_rows < 0 || row > rows || n_rows > rows - row)
        return hp_err_set(err, HP_ERR_INPUT, "%s: tensor '%s': rows [%lld, %lld) asked for are outside its %lld rows.",
                          f->m.label, hp_escape(t->name, a, sizeof a), (long long)row, (long long)(row + n_rows),
                          (long long)rows);
    const uint64_t row_bytes = (uint64_t)(cols / be * bb), raw = row_bytes * (uint64_t)n_rows;
    const int64_t n = cols * n_rows;
    uint8_t *base = (uint8_t *)dst + (uint64_t)n * sizeof(float) - raw;
    hp_status st = hp_gguf_read(f, t, row_bytes * (uint64_t)row, base, (size_t)raw, err);
    if (st || t->type == HP_GGML_F32) return st;
    uint8_t blk[512];
    HP_ASSERT(bb <= (int64_t)sizeof blk);
    for (int64_t b = 0; b < n / be; b++) {
        memcpy(blk, base + b * bb, (size_t)bb);
        hp_gguf_dequantize(t->type, blk, dst + b * be, be);
    }
    return HP_OK;
}
