/*
 * shard_int.h — internal pieces of the shard module shared by its files.
 *
 *   layout.c     ranks, coordinates, which slice of which tensor each rank holds
 *   plan_read.c  the plan JSON reader (hyperpar-plan v1) and the plan-vs-checkpoint check
 *   copy.c       strided block copy between a global tensor and a rank's slice (both directions)
 *   write.c      hp_shard_write: rank files, hard links, manifest, atomic folder
 *   manifest.c   manifest.json writer and strict reader
 *   merge.c      hp_shard_merge
 *   fsutil.c     file helpers: recursive removal, file copy, text files
 *   outdir.c     the output folder's life: --out checks (never an input, --force only over our own output),
 *                the temporary folder and its marker, stale temporaries, the race-free install
 *   guard.c      input snapshots, fault and interrupt errors (the SIGBUS guard itself: core/guard.c)
 *   identity.c   folder identity, per-rank layout digests, rank-file checks, slice tiling, --verify
 */
#ifndef HP_SHARD_INT_H
#define HP_SHARD_INT_H

#include <stdatomic.h>

#include "core/guard.h"
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
    int failed; /* HP__FAIL_*: why the last fill failed, so that the caller can word the error */
} hp__gather;
#define HP__FAIL_FAULT 1     /* the mapping faulted: the file shrank */
#define HP__FAIL_INTERRUPT 2 /* hp_shard_interrupt was called */
void hp__gather_init(hp__gather *c, const hp__geom *g, const uint8_t *base, const uint8_t *const *experts,
                     hp__progress *progress);
hp_status hp__gather_fill(void *ctx, void *dst, size_t nbytes, hp_err *err);

/* FNV-1a 64 of bytes, as 16 hex digits into buf (17 bytes). */
const char *hp__fnv1a_hex(const void *data, size_t n, char *buf);

/* 16 lower-case hex digits into buf (17 bytes). */
const char *hp__hex64(uint64_t v, char *buf);

/* ---- the output folder (outdir.c) ---- */
#define HP__PATH_MAX 4096
/* hp_outdir (hyperpar/outdir.h); shard and merge use it through the hp__out_* calls below. */
struct hp_outdir {
    const char *cmd;          /* "shard", "merge", "train": for messages and the marker */
    const char *out;          /* --out as given */
    const char *const *names; /* fnmatch patterns of the file names cmd writes (the marker besides) */
    const char *example;      /* "e.g. --out NAME" in messages */
    char canon[HP__PATH_MAX]; /* its absolute form: realpath of the existing part + the rest */
    char tmp[HP__PATH_MAX];   /* "<canon>.tmp.<pid>", named at prepare */
    bool force, parents;
    int state;                /* at the start: 0 absent, 1 an empty folder, 2 our earlier output (force) */
    uint64_t dev, ino;        /* of OUT at the start when it existed */
    bool tmp_made, installed;
    int n_created;            /* parent folders created for OUT, deepest last */
    char created[8][HP__PATH_MAX];
};
typedef struct hp_outdir hp__outdir;

/* hp_outdir_open's checks into *o (no allocation). */
hp_status hp__out_prepare_spec(hp__outdir *o, const hp_outdir_spec *spec, hp_err *err);
/* hp__out_prepare_spec for shard and merge (their file names; missing parents are created). Checks --out before
 * anything is touched: a usable name (not "", ".", "..", "/", a mount point, nor below a
 * file), not an input, not inside one and holding none (inputs: paths that must not be written; missing ones
 * are skipped), and either absent, an empty folder, or with force a folder hyperpar wrote (HP_SHARD_MARKER or
 * a hyperpar manifest, and only file names hyperpar writes). HP_ERR_INPUT naming the conflict otherwise. */
hp_status hp__out_prepare(hp__outdir *o, const char *cmd, const char *out, bool force, const char *const *inputs,
                          size_t n_inputs, hp_err *err);
/* Removes stale "<out>.tmp.<pid>" / "<out>.old.<pid>" folders of processes that no longer run (only those
 * holding our marker; each named on stderr), creates missing parents and "<out>.tmp.<pid>" with the marker. */
hp_status hp__out_begin(hp__outdir *o, hp_err *err);
/* Installs the temporary folder as OUT without ever replacing something that appeared or changed meanwhile:
 * renameat2(RENAME_NOREPLACE) onto an absent OUT, RENAME_EXCHANGE with a re-verified earlier output under
 * force. HP_ERR_INPUT when OUT changed while the command ran (nothing replaced). */
hp_status hp__out_commit(hp__outdir *o, hp_err *err);
/* After a failure: removes the temporary folder and the parents created for it. Idempotent. */
void hp__out_abort(hp__outdir *o);
/* Rewrites a message that names the temporary folder (or a writer's "<file>.tmp.<pid>") to name OUT. */
void hp__out_fix_msg(const hp__outdir *o, hp_err *err);

/* ---- guarded reads of mapped files, input snapshots, interruption (guard.c) ---- */
/* hp__guard_enter / hp__guard_leave / hp__guarded_copy: core/guard.h (shard and merge enter around their
 * copy loops). */
/* The signal recorded by hp_shard_interrupt, 0 when none. */
int hp__interrupted(void);
/* size / mtime / inode of the files read, taken at the start and compared at the end. */
typedef struct hp__snap {
    size_t n;
    const char **paths;
    uint64_t *sig; /* [n][4]: dev, ino, size, mtime ns */
} hp__snap;
/* The end of a run that wrote into o->tmp with status st: a fault or interrupt (why, HP__FAIL_*) becomes its
 * error, the inputs (snap: `what` names them, "source" or "rank file") must be unchanged, then the install; on
 * any failure the message names --out (never the temporary) and the temporary folder goes. */
hp_status hp__out_finish(hp__outdir *o, const hp__snap *snap, const char *what, int why, hp_status st, hp_err *err);
/* sizes (may be NULL): each file's size when it was mapped, so that a change before the snapshot counts. */
hp_status hp__snap_take(hp__snap *s, const char *const *paths, const uint64_t *sizes, size_t n, hp_err *err);
/* HP_ERR_IO "the source changed while reading" naming the first file that differs (what is "source" or
 * "rank file"); HP_OK when none does. */
hp_status hp__snap_check(const hp__snap *s, const char *what, hp_err *err);
void hp__snap_free(hp__snap *s);
/* The error for a faulted guarded copy: names the changed file when the snapshot finds it. */
hp_status hp__fault_error(const hp__snap *s, const char *what, hp_err *err);

/* Removes a folder tree (no symlinks followed); silent. Only for folders hyperpar created. */
void hp__rm_tree(const char *dir);
hp_status hp__copy_file(const char *src, const char *dst, hp_err *err);
hp_status hp__write_text(const char *path, const char *text, size_t len, hp_err *err);
bool hp__file_exists(const char *path);

/* ---- manifest (manifest.c) ---- */
/* The manifest version this hyperpar writes and reads (1: before identities and checksums, refused). */
#define HP__MANIFEST_VERSION 2
/* The plan a shard folder was written with, beside its rank files (manifest "plan.stored"). */
#define HP__SHARD_PLAN_FILE "plan.json"
/* bytes / sums: per rank, the size and XXH64 of its file (replicas repeat their file_rank's values). */
/* plan_stored: the plan's JSON text is written beside it as plan.json (manifest "plan.stored"). */
hp_status hp__manifest_write(const hp_shard_layout *l, const hp_model *m, const char *plan_file, const char *plan_fp,
                             bool plan_stored, const char *identity, const uint64_t *bytes, const uint64_t *sums, const char *path,
                             hp_err *err);

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
    int64_t file_rank; /* the rank whose file this is (itself, or the first of its dp replicas) */
    uint64_t bytes;    /* file size */
    uint64_t checksum; /* XXH64 of the whole file */
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
    const char *identity; /* 32 hex digits: the folder's identity, also in every rank file's __metadata__ */
    bool has_config_checksum;
    uint64_t config_checksum; /* source.config_checksum: XXH64 of the config.json written beside the rank files */
    int64_t world;
    bool has_mesh;        /* mesh.dims was given (every manifest hyperpar writes has it) */
    hp_mesh mesh;         /* mesh.dims with mesh.ep (the TP-extend-EP group size when there is no ep axis) */
    char plan_fp[17];     /* plan.fingerprint: FNV-1a 64 of the plan JSON text, 16 hex digits ("" when absent) */
    bool plan_stored;     /* plan.stored: the folder holds that text as plan.json (absent in older folders) */
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

/* ---- identity, layout digests, checks (identity.c) ---- */
/* The shard folder's identity (out: 33 bytes): 32 hex digits (two XXH64 lanes) over the mesh, every rank's
 * layout digest, and every source tensor's name, dtype, shape and a content sample (first, middle and last
 * 4 KiB). */
hp_status hp__identity(const hp_model *m, const hp_shard_layout *l, char *out, hp_err *err);
/* Digest of the global tensor list (names, dtypes, shapes in order): the start of every rank's layout digest. */
uint64_t hp__globals_digest_model(const hp_model *m);
uint64_t hp__globals_digest_manifest(const hp__manifest *man);
/* Layout digest of one rank: what its manifest entry says it holds (names, globals, shapes, slices, experts). */
uint64_t hp__rank_layout(uint64_t globals, const hp__mtensor *ts, size_t n);
/* A manifest tensor entry from a layout tensor (borrowing its strings). */
void hp__mtensor_from(const hp_shard_tensor *t, hp__mtensor *mt);
/* Checks an opened rank file against the manifest: identity, rank and world (a rank file of this folder under
 * another rank's name is "misnamed"), size, tensors (dtype and local shape), layout digest. */
hp_status hp__rank_file_check(const hp__manifest *man, uint64_t globals, int64_t r, const hp_st_file *f,
                              const char *path, hp_err *err);
/* The error for a missing rank file, naming *.safetensors files of dir that are not rank-NNNNN names. */
hp_status hp__rank_file_missing(const char *dir, int64_t r, const char *path, hp_err *err);
/* XXH64 of a whole file by read(2), with its size. */
hp_status hp__file_checksum(const char *path, uint64_t *sum, uint64_t *size, hp_err *err);
/* The distinct blocks held of one tensor (segs[i], held by ranks[i]) tile its global shape exactly once:
 * HP_ERR_INPUT naming the tensor, the ranks and the overlap or the part no rank holds. */
hp_status hp__check_tiling(const char *name, const int64_t *shape, int n_dims, int n, const hp__segs *const *segs,
                           const int64_t *ranks, hp_err *err);

/* ---- plan JSON (plan_read.c) ---- */
/* hp_shard_read_plan on text already in memory (len bytes; label names it in messages). */
hp_status hp__shard_plan_parse(hp_plan **out, const hp_model *m, const char *text, size_t len, const char *label,
                               hp_err *err);

#endif
