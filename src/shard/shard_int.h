/*
 * shard_int.h — internal pieces of the shard module shared by its files.
 *
 *   layout.c     ranks, coordinates, which slice of which tensor each rank holds
 *   plan_read.c  the plan JSON reader (hyperpar-plan v1) and the plan-vs-checkpoint check
 *   copy.c       strided block copy between a global tensor and a rank's slice (both directions)
 *   write.c      hp_shard_write: rank files, hard links, manifest, atomic folder
 *   manifest.c   manifest.json writer and strict reader
 *   merge.c      hp_shard_merge
 *   fsutil.c     folder helpers: temporary folder, install by rename, recursive removal, file copy, progress
 */
#ifndef HP_SHARD_INT_H
#define HP_SHARD_INT_H

#include <stdatomic.h>

#include "hyperpar/shard.h"

/* Segments held along each dim: global blocks [off, off + len) in local order. A whole dim is one
 * segment {0, G[d]}. */
#define HP__SEG_MAX 4
typedef struct hp__segs {
    int n_dims;
    int64_t shape[HP_MAX_DIMS]; /* global (virtual) shape */
    int n[HP_MAX_DIMS];
    int64_t off[HP_MAX_DIMS][HP__SEG_MAX], len[HP_MAX_DIMS][HP__SEG_MAX];
} hp__segs;

/* Segments from a tensor's slices (dims without slices are whole). HP_ERR_INPUT on bad slices. */
hp_status hp__segs_from_tensor(const hp_shard_tensor *t, hp__segs *s, hp_err *err);

/* Byte geometry of a tensor for copying: elements of esize bytes over shape. Sub-byte dtypes (F4, F6) are
 * copied as bytes, which works when only dim 0 is sliced; anything else is HP_ERR_INPUT. */
typedef struct hp__geom {
    int n_dims;
    int64_t shape[HP_MAX_DIMS];
    int64_t esize;
    hp__segs segs;
} hp__geom;
hp_status hp__geom_make(const char *name, hp_dtype dt, const hp__segs *s, hp__geom *g, hp_err *err);

/* Progress shared by worker threads: bytes done of total; prints on stderr at most 4 times a second. */
typedef struct hp__progress {
    bool enabled;
    const char *verb; /* "sharding", "merging" */
    uint64_t total;
    _Atomic uint64_t done;
    _Atomic int64_t last_ns;
    int64_t start_ns;
} hp__progress;
void hp__progress_init(hp__progress *p, bool enabled, const char *verb, uint64_t total);
void hp__progress_add(hp__progress *p, uint64_t n);
void hp__progress_end(hp__progress *p);
int64_t hp__now_ns(void);

/* Copy state: the slice of a global tensor a rank holds, walked as contiguous runs in local order.
 * Gather (shard): src = the global tensor (one buffer, or one buffer per expert when stacked).
 * The fill callback of the safetensors writer copies successive runs into its pieces. */
typedef struct hp__gather {
    hp__geom g;
    const uint8_t *base;           /* global tensor bytes (not stacked) */
    const uint8_t *const *experts; /* per-expert bytes (stacked) */
    int k;                         /* the run dim: last sliced dim (0 when none) */
    int64_t inner;                 /* bytes of one index step along k (whole dims after k) */
    int64_t stride[HP_MAX_DIMS];   /* global byte strides (per expert for stacked dims >= 1) */
    int64_t lidx[HP_MAX_DIMS];     /* odometer over local indices of dims < k */
    int seg;
    int64_t pos; /* position within segment seg of dim k */
    bool done;
    const uint8_t *run; /* current run and bytes left in it */
    int64_t run_left;
    hp__progress *progress;
} hp__gather;
void hp__gather_init(hp__gather *c, const hp__geom *g, const uint8_t *base, const uint8_t *const *experts,
                     hp__progress *progress);
hp_status hp__gather_fill(void *ctx, void *dst, size_t nbytes, hp_err *err);

/* FNV-1a 64 of bytes, as 16 hex digits into buf (17 bytes). */
const char *hp__fnv1a_hex(const void *data, size_t n, char *buf);

/* ---- folders ---- */
/* "<dir>.tmp.<pid>", freshly created (an old one of the same name is removed first). */
hp_status hp__tmpdir_create(const char *dir, char *tmp, size_t cap, hp_err *err);
/* Refuses an existing non-empty dir (or a non-folder) unless force; label names the option. */
hp_status hp__check_out_dir(const char *dir, bool force, hp_err *err);
/* Moves tmp to dir: an existing dir (empty, or any with force) is replaced only after tmp is complete. */
hp_status hp__install_dir(const char *tmp, const char *dir, hp_err *err);
/* Removes a folder tree (no symlinks followed); silent. */
void hp__rm_tree(const char *dir);
hp_status hp__copy_file(const char *src, const char *dst, hp_err *err);
hp_status hp__write_text(const char *path, const char *text, size_t len, hp_err *err);
bool hp__file_exists(const char *path);

/* ---- manifest (manifest.c) ---- */
hp_status hp__manifest_write(const hp_shard_layout *l, const hp_model *m, const char *plan_file, const char *plan_fp,
                             const char *path, hp_err *err);

typedef struct hp__mtensor {
    const char *name;
    int n_globals;
    const char **globals;
    bool stacked;
    hp_dtype dtype;
    int n_dims;
    int64_t global_shape[HP_MAX_DIMS];
    int n_slices;
    hp_shard_slice slices[HP_SHARD_MAX_SLICES];
    int64_t expert_first, expert_count; /* the optional "experts" key; count 0 when absent */
} hp__mtensor;

typedef struct hp__mrank {
    int64_t rank;
    const char *file;
    size_t n_tensors;
    hp__mtensor *tensors;
} hp__mrank;

typedef struct hp__mglobal {
    const char *name;
    hp_dtype dtype;
    int n_dims;
    int64_t shape[HP_MAX_DIMS];
} hp__mglobal;

typedef struct hp__manifest {
    int64_t world;
    size_t n_globals;
    hp__mglobal *globals; /* model parameter order */
    size_t n_ranks;
    hp__mrank *ranks;
    hp_arena arena;
} hp__manifest;

/* Parses manifest text (len bytes; label names it in messages): HP_ERR_INPUT naming the JSON path on anything
 * malformed, and then *out is NULL. hp__manifest_read reads the file and parses it. */
hp_status hp__manifest_parse(const char *text, size_t len, const char *label, hp__manifest **out, hp_err *err);
hp_status hp__manifest_read(const char *path, hp__manifest **out, hp_err *err);
void hp__manifest_free(hp__manifest *m);
/* A rank-file tensor from its manifest entry: local shape and bytes from the slices (params NULL, pl absent,
 * ep_size 0). HP_ERR_INPUT when the slices do not fit the global shape or the size overflows. */
hp_status hp__manifest_tensor(const hp__mtensor *mt, hp_shard_tensor *out, hp_err *err);

/* ---- plan JSON (plan_read.c) ---- */
/* hp_shard_read_plan on text already in memory (len bytes; label names it in messages). */
hp_status hp__shard_plan_parse(hp_plan **out, const hp_model *m, const char *text, size_t len, const char *label,
                               hp_err *err);

#endif
