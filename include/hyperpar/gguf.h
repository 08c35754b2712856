/*
 * hyperpar/gguf.h — strict GGUF reader (llama.cpp's model format, versions 2 and 3, little-endian) and the
 * dequantization of its common tensor types to f32.
 *
 * File layout (ggml's docs/gguf.md):
 *
 *   +--------+---------+--------------+----------+-----------------+---------------+---------+-------------+
 *   | "GGUF" | u32 ver | u64 n_tensor | u64 n_kv | n_kv key/values | n_tensor infos| padding | tensor data |
 *   +--------+---------+--------------+----------+-----------------+---------------+---------+-------------+
 *   0        4         8              16         24                                  data_offset (aligned)
 *
 *   key/value:   string key, u32 value type, value (a string is u64 length + bytes; an array is u32 element
 *                type + u64 count + the elements)
 *   tensor info: string name, u32 n_dims, u64 dims[n_dims] (ggml order: dims[0] is the row length), u32 ggml
 *                type, u64 offset (relative to the data section, a multiple of the alignment)
 *
 * The alignment is general.alignment (a u32 power of two) or 32. Invariants after hp_gguf_open succeeds: every
 * count, length and offset lay inside the file; keys and tensor names are unique; every value type, ggml type
 * and array element type is known (arrays of arrays are refused); every tensor's row length is a whole number
 * of its type's blocks, its element count and byte size fit in int64, its offset is aligned and its bytes lie
 * inside the data section, and no two tensors' bytes overlap. So hp_gguf_read never reads outside the file.
 */
#ifndef HYPERPAR_GGUF_H
#define HYPERPAR_GGUF_H

#include "hyperpar/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Metadata value types, with the numbers the file uses. */
typedef enum hp_gguf_vtype {
    HP_GGUF_U8 = 0,
    HP_GGUF_I8 = 1,
    HP_GGUF_U16 = 2,
    HP_GGUF_I16 = 3,
    HP_GGUF_U32 = 4,
    HP_GGUF_I32 = 5,
    HP_GGUF_F32 = 6,
    HP_GGUF_BOOL = 7,
    HP_GGUF_STRING = 8,
    HP_GGUF_ARRAY = 9,
    HP_GGUF_U64 = 10,
    HP_GGUF_I64 = 11,
    HP_GGUF_F64 = 12,
    HP_GGUF_VTYPE_COUNT
} hp_gguf_vtype;

/* "UINT32", "STRING", ...: the names gguf's own documentation uses. */
const char *hp_gguf_vtype_name(hp_gguf_vtype t);

/* ggml tensor types, with the numbers the file uses (gaps are types ggml removed). */
typedef enum hp_ggml_type {
    HP_GGML_F32 = 0,
    HP_GGML_F16 = 1,
    HP_GGML_Q4_0 = 2,
    HP_GGML_Q4_1 = 3,
    HP_GGML_Q5_0 = 6,
    HP_GGML_Q5_1 = 7,
    HP_GGML_Q8_0 = 8,
    HP_GGML_Q8_1 = 9,
    HP_GGML_Q2_K = 10,
    HP_GGML_Q3_K = 11,
    HP_GGML_Q4_K = 12,
    HP_GGML_Q5_K = 13,
    HP_GGML_Q6_K = 14,
    HP_GGML_Q8_K = 15,
    HP_GGML_IQ2_XXS = 16,
    HP_GGML_IQ2_XS = 17,
    HP_GGML_IQ3_XXS = 18,
    HP_GGML_IQ1_S = 19,
    HP_GGML_IQ4_NL = 20,
    HP_GGML_IQ3_S = 21,
    HP_GGML_IQ2_S = 22,
    HP_GGML_IQ4_XS = 23,
    HP_GGML_I8 = 24,
    HP_GGML_I16 = 25,
    HP_GGML_I32 = 26,
    HP_GGML_I64 = 27,
    HP_GGML_F64 = 28,
    HP_GGML_IQ1_M = 29,
    HP_GGML_BF16 = 30,
    HP_GGML_TQ1_0 = 34,
    HP_GGML_TQ2_0 = 35,
    HP_GGML_MXFP4 = 39,
    HP_GGML_NVFP4 = 40,
    HP_GGML_Q1_0 = 41,
    HP_GGML_TYPE_END
} hp_ggml_type;

/* Whether t is a ggml type this reader knows (its block size and bytes per block). */
bool hp_ggml_type_known(uint32_t t);
/* "Q4_K"; "?" for an unknown number. */
const char *hp_ggml_type_name(uint32_t t);
/* Elements per block and bytes per block (Q4_K: 256 and 144; F32: 1 and 4); false for an unknown type. */
bool hp_ggml_type_block(uint32_t t, int64_t *block_elems, int64_t *block_bytes);
/* Whether hp_gguf_dequantize converts t: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K. */
bool hp_ggml_type_dequantizable(uint32_t t);
/* The dequantizable types' names, comma-separated, for messages. */
const char *hp_ggml_dequantizable_list(void);

/* A string as the file holds it: len bytes (which may include NUL bytes), followed by a NUL terminator. */
typedef struct hp_gguf_str {
    const char *s;
    uint64_t len;
} hp_gguf_str;

typedef struct hp_gguf_kv {
    const char *key;
    hp_gguf_vtype type;
    hp_gguf_vtype elem; /* HP_GGUF_ARRAY: the element type (never ARRAY); else equal to type */
    uint64_t n;         /* HP_GGUF_ARRAY: the element count; else 1 */
    /* Scalars: integers widened into u (unsigned types) or i (signed types), F32 and F64 into f, BOOL into b. */
    union {
        uint64_t u;
        int64_t i;
        double f;
        bool b;
        hp_gguf_str s;
    } v;
    /* Arrays: n elements as C values: uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool,
     * hp_gguf_str, uint64_t, int64_t or double by elem. */
    const void *arr;
} hp_gguf_kv;

/* At most four dimensions, as ggml has. */
#define HP_GGUF_MAX_DIMS 4
/* A tensor name is at most 64 bytes (the spec's limit). */
#define HP_GGUF_MAX_NAME 64

typedef struct hp_gguf_tensor {
    const char *name;
    int n_dims;
    int64_t ne[HP_GGUF_MAX_DIMS]; /* ggml order: ne[0] is the row length; unused dims are 1 */
    uint32_t type;                /* hp_ggml_type */
    int64_t n_elems;
    uint64_t offset;              /* relative to the data section */
    uint64_t nbytes;
} hp_gguf_tensor;

typedef struct hp_gguf_file hp_gguf_file;

/* Maps and fully validates path. On failure *out is NULL and err names the file, the field and the numbers
 * (HP_ERR_INPUT for a bad file; HP_ERR_IO when it cannot be read). */
hp_status hp_gguf_open(hp_gguf_file **out, const char *path, hp_err *err);
/* The same over a caller-owned buffer (label names it in messages); buf must outlive the file. */
hp_status hp_gguf_open_memory(hp_gguf_file **out, const void *buf, size_t len, const char *label, hp_err *err);
void hp_gguf_close(hp_gguf_file *f);
/* Whether the first four bytes of the file at path are "GGUF" (false when it cannot be read). Never blocks. */
bool hp_gguf_is_gguf(const char *path);

const char *hp_gguf_path(const hp_gguf_file *f);
uint32_t hp_gguf_version(const hp_gguf_file *f);
uint64_t hp_gguf_file_size(const hp_gguf_file *f);
uint64_t hp_gguf_alignment(const hp_gguf_file *f);
uint64_t hp_gguf_data_offset(const hp_gguf_file *f); /* where the data section begins */

/* Key/value pairs in file order. */
size_t hp_gguf_kv_count(const hp_gguf_file *f);
const hp_gguf_kv *hp_gguf_kv_at(const hp_gguf_file *f, size_t i);
const hp_gguf_kv *hp_gguf_find_kv(const hp_gguf_file *f, const char *key);
/* Tensors in file order. */
size_t hp_gguf_tensor_count(const hp_gguf_file *f);
const hp_gguf_tensor *hp_gguf_tensor_at(const hp_gguf_file *f, size_t i);
const hp_gguf_tensor *hp_gguf_find_tensor(const hp_gguf_file *f, const char *name);

/* Typed metadata lookups. *found says whether the key is there; a key of another type is HP_ERR_INPUT naming
 * the key, its type and the one expected. hp_gguf_get_int takes any integer type (a UINT64 above INT64_MAX is
 * refused); hp_gguf_get_float takes FLOAT32 and FLOAT64; hp_gguf_get_array checks the element type too. */
hp_status hp_gguf_get_int(const hp_gguf_file *f, const char *key, int64_t *out, bool *found, hp_err *err);
hp_status hp_gguf_get_float(const hp_gguf_file *f, const char *key, double *out, bool *found, hp_err *err);
hp_status hp_gguf_get_bool(const hp_gguf_file *f, const char *key, bool *out, bool *found, hp_err *err);
hp_status hp_gguf_get_string(const hp_gguf_file *f, const char *key, const hp_gguf_str **out, hp_err *err);
hp_status hp_gguf_get_array(const hp_gguf_file *f, const char *key, hp_gguf_vtype elem, const hp_gguf_kv **out,
                            hp_err *err);

/* Copies n bytes of tensor t starting at byte off of the tensor into dst. A file truncated by another process
 * since it was opened is HP_ERR_IO ("changed while reading"), not SIGBUS; a range outside the tensor is
 * HP_ERR_INPUT. Thread-safe. */
hp_status hp_gguf_read(const hp_gguf_file *f, const hp_gguf_tensor *t, uint64_t off, void *dst, size_t n,
                       hp_err *err);
/* Rows [row, row + n_rows) of tensor t (a row is ne[0] elements; the tensor has n_elems / ne[0] rows) as f32,
 * into dst of n_rows * ne[0] floats. Types hp_ggml_type_dequantizable refuses are HP_ERR_INPUT naming the
 * tensor and its type. */
hp_status hp_gguf_read_f32(const hp_gguf_file *f, const hp_gguf_tensor *t, int64_t row, int64_t n_rows, float *dst,
                           hp_err *err);

/* Dequantizes n elements (a whole number of blocks of type t) from src to f32, bit for bit as the gguf Python
 * package's gguf.quants.dequantize: each block's scales are widened from f16 and every product and sum is one
 * f32 operation in the package's order (no fused multiply-add). false for a type it does not convert. */
bool hp_gguf_dequantize(uint32_t t, const void *src, float *dst, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
