/*
 * hyperpar/safetensors.h — strict safetensors reader (mmap, validated before use), atomic writer, and the
 * multi-file checkpoint view (model.safetensors or model.safetensors.index.json + shards).
 *
 * File layout (spec/hf_reference.md §5.1):
 *
 *   +---------+---------------------------+----------------------------------------+
 *   | u64 LE N| N bytes UTF-8 JSON header  | data section: tensors back to back     |
 *   +---------+---------------------------+----------------------------------------+
 *   0         8                           8+N                                      file size
 *
 * Invariants after hp_st_open succeeds: every tensor has a known dtype, a shape of non-negative dims whose
 * element count and byte size fit in int64, end - begin == byte size, the tensors sorted by begin tile the
 * data section exactly (no holes, no overlap) and 8 + N + data size == file size, and names are unique.
 */
#ifndef HYPERPAR_SAFETENSORS_H
#define HYPERPAR_SAFETENSORS_H

#include "hyperpar/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* In safetensors' increasing-alignment order. */
typedef enum hp_dtype {
    HP_DT_BOOL,
    HP_DT_F4,
    HP_DT_F6_E2M3,
    HP_DT_F6_E3M2,
    HP_DT_U8,
    HP_DT_I8,
    HP_DT_F8_E5M2,
    HP_DT_F8_E4M3,
    HP_DT_F8_E8M0,
    HP_DT_F8_E4M3FNUZ,
    HP_DT_F8_E5M2FNUZ,
    HP_DT_I16,
    HP_DT_U16,
    HP_DT_F16,
    HP_DT_BF16,
    HP_DT_I32,
    HP_DT_U32,
    HP_DT_F32,
    HP_DT_C64,
    HP_DT_F64,
    HP_DT_I64,
    HP_DT_U64,
    HP_DT_COUNT
} hp_dtype;

const char *hp_dtype_name(hp_dtype dt);   /* "BF16" */
int hp_dtype_bits(hp_dtype dt);           /* 4, 6, 8, 16, 32, 64 */
bool hp_dtype_parse(const char *s, hp_dtype *out);
/* Byte size of n elements; false when not a whole number of bytes or on overflow. */
bool hp_dtype_nbytes(hp_dtype dt, int64_t n_elems, int64_t *out);
/* Widens n elements of BF16 / F16 / F32 / F64 to f32. Other dtypes: HP_ERR_INPUT. */
hp_status hp_dtype_to_f32(hp_dtype dt, const void *src, float *dst, int64_t n, hp_err *err);
/* Narrows f32 to BF16 (round to nearest even) / F16 / F32. */
hp_status hp_dtype_from_f32(hp_dtype dt, const float *src, void *dst, int64_t n, hp_err *err);

/* Upper bound on tensor rank: generous; a header claiming more is refused. */
#define HP_MAX_DIMS 8
/* safetensors' own limit on the JSON header (MAX_HEADER_SIZE). */
#define HP_ST_MAX_HEADER 100000000ull

typedef struct hp_st_tensor {
    const char *name;
    hp_dtype dtype;
    int n_dims;
    int64_t shape[HP_MAX_DIMS];
    int64_t n_elems;
    uint64_t begin, end; /* relative to the data section */
} hp_st_tensor;

typedef struct hp_st_file hp_st_file;

/* Maps and fully validates path. On failure *out is NULL and err names the file, tensor and numbers. */
hp_status hp_st_open(hp_st_file **out, const char *path, hp_err *err);
/* Same validation over a caller-owned buffer (label names it in messages); buf must outlive the file. */
hp_status hp_st_open_memory(hp_st_file **out, const void *buf, size_t len, const char *label, hp_err *err);
void hp_st_close(hp_st_file *f);

const char *hp_st_path(const hp_st_file *f);
uint64_t hp_st_file_size(const hp_st_file *f);
uint64_t hp_st_data_offset(const hp_st_file *f); /* 8 + N */
/* Tensors in header order (as the JSON lists them). */
size_t hp_st_count(const hp_st_file *f);
const hp_st_tensor *hp_st_tensor_at(const hp_st_file *f, size_t i);
const hp_st_tensor *hp_st_find(const hp_st_file *f, const char *name);
/* Copies n bytes of tensor t (of f) starting at byte off of the tensor into dst. The way to read a mapped
 * file: when another process truncated it since hp_st_open, the copy faults and this returns HP_ERR_IO
 * "FILE changed while reading (truncated or rewritten by another process): reading tensor 'T' faulted ..."
 * instead of the process dying of SIGBUS. [off, off + n) outside the tensor: HP_ERR_INPUT. Thread-safe. */
hp_status hp_st_read(const hp_st_file *f, const hp_st_tensor *t, uint64_t off, void *dst, size_t n, hp_err *err);
/* Zero-copy pointer to a tensor's bytes inside the mapping. Reading through it is not guarded: a file
 * truncated meanwhile ends the process (exit 1, the file named on stderr: the last resort of the SIGBUS
 * guard, which is installed while any mapped file is open). Copy with hp_st_read instead wherever an error
 * can be returned; keep the pointer only for zero-copy compute. */
const void *hp_st_data(const hp_st_file *f, const hp_st_tensor *t);
/* __metadata__ entries (string -> string). */
size_t hp_st_metadata_count(const hp_st_file *f);
void hp_st_metadata_at(const hp_st_file *f, size_t i, const char **key, const char **value);
const char *hp_st_metadata_get(const hp_st_file *f, const char *key);

/* ---- writer: header padded to 8 bytes, tensors in the order added, written atomically ---- */

/* Fills dst with the next nbytes of the tensor's data; return HP_OK or an error. hp_st_writer_write calls it
 * repeatedly with successive pieces of at most 4 MiB (each a whole number of elements), in order, until the
 * tensor is complete. */
typedef hp_status (*hp_st_fill_fn)(void *ctx, void *dst, size_t nbytes, hp_err *err);

typedef struct hp_st_writer hp_st_writer;

hp_st_writer *hp_st_writer_create(void);
void hp_st_writer_destroy(hp_st_writer *w);
hp_status hp_st_writer_set_metadata(hp_st_writer *w, const char *key, const char *value, hp_err *err);
/* data is borrowed until hp_st_writer_write returns. Duplicate names, bad shapes: HP_ERR_INPUT. */
hp_status hp_st_writer_add(hp_st_writer *w, const char *name, hp_dtype dt, int n_dims,
                           const int64_t *shape, const void *data, hp_err *err);
/* Like add, but the bytes are produced by fill(ctx, ...) while writing (streaming). */
hp_status hp_st_writer_add_fill(hp_st_writer *w, const char *name, hp_dtype dt, int n_dims,
                                const int64_t *shape, hp_st_fill_fn fill, void *ctx, hp_err *err);
/* Tensors are produced by n threads in parallel (each at its own offset of the file), 1 by default.
 * Fill callbacks of different tensors must then be safe to run concurrently. */
void hp_st_writer_set_threads(hp_st_writer *w, int n);
/* Writes to "<path>.tmp.<pid>" then renames to path; on failure removes the temporary. */
hp_status hp_st_writer_write(hp_st_writer *w, const char *path, hp_err *err);

/* ---- checkpoint: one or more safetensors files seen as one tensor list ---- */

typedef struct hp_ckpt_tensor {
    const hp_st_tensor *t;
    const hp_st_file *file;
    int file_index;
} hp_ckpt_tensor;

typedef struct hp_ckpt hp_ckpt;

/* path: a folder holding model.safetensors or model.safetensors.index.json (or exactly one *.safetensors),
 * an index .json file, or one .safetensors file. As in transformers, a folder holding both model.safetensors
 * and an index loads model.safetensors (a warning is logged and hp_ckpt_ignored names the index). A tensor in
 * the index but missing from its shard, in a shard but absent from the index, or an empty weight_map is
 * HP_ERR_INPUT. Inputs that are not regular files (a FIFO, a device) are refused without blocking. */
hp_status hp_ckpt_open(hp_ckpt **out, const char *path, hp_err *err);
void hp_ckpt_close(hp_ckpt *c);
const char *hp_ckpt_dir(const hp_ckpt *c); /* folder holding the files (for config.json) */
const char *hp_ckpt_source(const hp_ckpt *c);  /* the file read: the index or the single .safetensors */
const char *hp_ckpt_ignored(const hp_ckpt *c); /* an index the folder also holds, not used; NULL when none */
size_t hp_ckpt_count(const hp_ckpt *c);
const hp_ckpt_tensor *hp_ckpt_at(const hp_ckpt *c, size_t i);
const hp_ckpt_tensor *hp_ckpt_find(const hp_ckpt *c, const char *name);
size_t hp_ckpt_file_count(const hp_ckpt *c);
const hp_st_file *hp_ckpt_file(const hp_ckpt *c, size_t i);

#ifdef __cplusplus
}
#endif
#endif
