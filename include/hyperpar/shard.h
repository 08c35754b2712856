/*
 * hyperpar/shard.h — per-rank safetensors files from a plan, and the exact merge back.
 *
 *   checkpoint ──hp_shard_write(model, plan)──▶ DIR/rank-00000.safetensors ... rank-<world-1>.safetensors
 *        ▲                                       DIR/manifest.json   (docs/shard-format.md)
 *        └────────────hp_shard_merge(DIR)─────── DIR/config.json     (copied from the source, when present)
 *
 * Ranks: rank r <-> mesh coordinates row-major over the mesh dims in mesh order (last axis fastest);
 * world = product of all mesh sizes, dp included. Per axis a rank's index is its tp / cp coordinate; for
 * ep, the ep coordinate when the mesh has an explicit ep axis, else (TP-extend-EP, spec §10.1) its position
 * in its EP group of ep consecutive ranks of the dense region: rank % ep.
 *
 * Placement -> local slice, per axis of size n with index i: S(d) keeps [i·L/n, (i+1)·L/n) of dim d;
 * S(d)x2 keeps that block of each half of dim d, first half's block first; R or absent keeps the whole
 * dim. Axes compose (tp and ep on one stacked expert tensor). A stacked expert parameter (ep_stack) is
 * written as one [n_local_experts, ...] tensor under the stacked name; merge restores the per-expert names.
 *
 * dp replicas (ranks with identical content) are one file plus hard links (a copy where link() fails).
 *
 * Output folders (docs/shard-format.md §6, hyperpar/outdir.h): written as "<DIR>.tmp.<pid>" (marked with
 * HP_SHARD_MARKER) and renamed when complete, never over a folder that appeared meanwhile. DIR may not be, contain or lie inside
 * an input. force replaces only an earlier hyperpar output (marker, nothing but hyperpar's file names).
 * A shard folder has an identity (source + plan) in its manifest and in every rank file; merge and
 * hp_shard_rank_open refuse rank files of another folder, edited manifests and slices that do not tile.
 */
#ifndef HYPERPAR_SHARD_H
#define HYPERPAR_SHARD_H

#include "hyperpar/outdir.h"
#include "hyperpar/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The file hyperpar writes into every output folder to recognise it later (hyperpar/outdir.h). */
#define HP_SHARD_MARKER HP_OUTDIR_MARKER

/* A rank-file name needs five digits; larger meshes are refused. */
#define HP_SHARD_MAX_WORLD 65536
/* Slices of one tensor: at most two per dim (a packed S(d)x2 dim has two). */
#define HP_SHARD_MAX_SLICES (2 * HP_MAX_DIMS)

/* A contiguous block [offset, offset + length) of the global tensor along dim. */
typedef struct hp_shard_slice {
    int dim;
    int64_t offset, length;
} hp_shard_slice;

/* One tensor of a rank file. */
typedef struct hp_shard_tensor {
    const char *name;           /* name in the rank file: the parameter, or boundary fqn + "." + stacked name */
    int n_globals;              /* 1, or the experts of a stack */
    const char *const *globals; /* global names: the parameter, or the per-expert names in expert order */
    const int *params;          /* [n_globals] indices into the model's params */
    bool stacked;               /* an ep_stack: global shape is [n_globals, per-expert shape...] */
    hp_dtype dtype;
    int n_dims;
    int64_t global_shape[HP_MAX_DIMS];
    int64_t local_shape[HP_MAX_DIMS];
    int n_slices; /* only the dims the rank does not hold whole, in dim order */
    hp_shard_slice slices[HP_SHARD_MAX_SLICES];
    int64_t expert_first, expert_count; /* experts held (stacked or ep-sliced); count 0 otherwise */
    uint64_t nbytes;                    /* local bytes */
    hp_nplace pl; /* the plan's placement (all absent when the plan leaves the tensor uncovered) */
    int ep_size;  /* the ep group size that applies to this tensor (1 when none) */
    int n_stages; /* the pipeline stages holding it (hp_pipeline_param_stages; 0: every rank, no pipeline) */
    int64_t stages[2];
    bool absent;  /* hp_shard_rank_tensor: this rank's stage does not hold it (nothing else set; nbytes 0) */
} hp_shard_tensor;

typedef struct hp_shard_rank {
    int64_t rank;
    int64_t coords[HP_MESH_MAX_DIMS]; /* in mesh order */
    int64_t file_rank;                /* lowest rank with identical content: its file is linked (itself when unique) */
    uint64_t nbytes;                  /* tensor bytes of the rank file */
} hp_shard_rank;

/* Which tensors every rank holds. tensors[] describes the global side (local_shape = global, no slices);
 * hp_shard_rank_tensor gives one rank's view of tensor i. */
typedef struct hp_shard_layout {
    hp_mesh mesh;
    int64_t world;
    int64_t tp, cp, ep; /* sizes (1 when inactive); ep is the explicit axis or the D-10 group size */
    size_t n_tensors;   /* model parameter order; a stack sits at its first member's position */
    hp_shard_tensor *tensors;
    size_t n_uncovered;   /* parameters the plan does not cover: written whole to every rank */
    hp_shard_rank *ranks; /* [world] */
    hp_arena arena;
} hp_shard_layout;

hp_status hp_shard_layout_build(hp_shard_layout **out, const hp_model *m, const hp_plan *p, hp_err *err);
void hp_shard_layout_free(hp_shard_layout *l);
/* Rank r's slice of tensor i (slices, local shape, experts, bytes). */
hp_status hp_shard_rank_tensor(const hp_shard_layout *l, int64_t rank, size_t i, hp_shard_tensor *out, hp_err *err);
/* "dp=1,tp=0" into buf. */
const char *hp_shard_coords_str(const hp_shard_layout *l, int64_t rank, char *buf, size_t cap);

/* Reads a plan written by `hyperpar plan` ("hyperpar-plan", version 1) for model m. A plan for other
 * tensors or shapes is HP_ERR_INPUT listing the first differences (up to 10). text_out (may be NULL)
 * receives the file text (malloc'd) for fingerprinting. */
hp_status hp_shard_read_plan(hp_plan **out, const hp_model *m, const char *path, char **text_out, hp_err *err);

typedef struct hp_shard_stats {
    uint64_t bytes_written; /* tensor bytes written to distinct files */
    uint64_t files;         /* distinct files written (rank files or merged shards) */
    uint64_t links;         /* rank files that are hard links (or copies) of a replica */
    double seconds;
} hp_shard_stats;

typedef struct hp_shard_opts {
    int threads;           /* worker threads: over rank files, or over the tensors of each file when there are
                            * fewer files than threads; <= 0 means 1 */
    bool force;            /* replace a non-empty output folder */
    bool progress;         /* a progress line on stderr */
    const char *plan_file; /* the plan's file name for the manifest, or NULL when derived */
    const char *plan_text; /* its JSON text (fingerprinted); NULL: the plan is serialised */
    const char *const *inputs; /* further files the output must not be, contain or lie in (--plan,
                                * --overrides); the checkpoint's own files are added by hp_shard_write */
    int n_inputs;
} hp_shard_opts;

/* Writes every rank file, manifest.json and config.json (when the source folder has one) into out_dir,
 * atomically. stats may be NULL. A source that changes while it is read (SIGBUS on its mapping, or a new
 * size, mtime or inode at the end) is HP_ERR_IO "the source changed while reading"; nothing is left behind. */
hp_status hp_shard_write(const hp_model *m, const hp_plan *p, const char *out_dir, const hp_shard_opts *o,
                         hp_shard_stats *stats, hp_err *err);

typedef struct hp_merge_opts {
    uint64_t max_shard_size; /* bytes per output file; 0 = 5 GB (transformers' default) */
    bool force;
    bool progress;
    bool verify; /* also check every rank file's XXH64 checksum against the manifest (one more read of each) */
} hp_merge_opts;

/* Validates dir (manifest, every rank file), rebuilds the original tensors and writes out_dir/model.safetensors
 * or model-0000i-of-0000n.safetensors + model.safetensors.index.json, plus config.json. Atomic. */
hp_status hp_shard_merge(const char *dir, const char *out_dir, const hp_merge_opts *o, hp_shard_stats *stats,
                         hp_err *err);

/* Stops a running hp_shard_write / hp_shard_merge at its next piece (at most 4 MiB of copying): it removes
 * its temporary folder and fails with HP_ERR_IO "interrupted". Async-signal-safe: call it from a SIGINT /
 * SIGTERM handler, then re-raise the signal once the call returned. 0 clears the request. */
void hp_shard_interrupt(int sig);
/* The signal recorded by hp_shard_interrupt, 0 when none. */
int hp_shard_interrupted(void);

/* ---- one rank's file, for readers (the MoE runtime loads a layer's local experts from it) ---- */

/* A rank file of a shard folder, mapped and checked against manifest.json: its __metadata__ names this rank
 * of the manifest's world, and every tensor has the dtype and the local shape its manifest entry gives. */
typedef struct hp_shard_rank_file {
    const char *dir;          /* the folder as given */
    int64_t rank, world;
    const char *path;         /* dir + "/rank-XXXXX.safetensors" */
    int64_t file_rank;        /* the rank whose file this is (itself, or the first of its dp replicas) */
    const char *mesh;         /* the file's hyperpar_mesh, "dp=2,cp=1,tp=2" */
    const char *coords;       /* this rank's entry of its hyperpar_coords, "dp=0,cp=0,tp=1" */
    hp_st_file *file;         /* the mapped file (hp_st_data reads straight from it) */
    size_t n_tensors;         /* manifest order */
    hp_shard_tensor *tensors; /* the manifest's entry per tensor: name, globals, stacked, dtype, global and local
                                 shape, slices, experts [expert_first, +expert_count), nbytes; params NULL,
                                 pl absent, ep_size 0 */
    void *internal;
} hp_shard_rank_file;

/* Opens rank `rank`'s file of the shard folder dir. HP_ERR_INPUT: manifest.json missing or malformed, a rank
 * outside the manifest's world, the rank file missing, corrupt, misnamed (another rank's file), from another
 * folder (identity), of another size, or unlike the manifest (tensors, or the layout digest of its slices). */
hp_status hp_shard_rank_open(hp_shard_rank_file **out, const char *dir, int64_t rank, hp_err *err);
/* What shard folder dir records of its plan: its mesh (manifest.json) into *mesh (may be NULL), and the plan it
 * was written with (dir/plan.json, checked against the manifest's fingerprint) read for m into *plan, or *plan
 * NULL for a folder written before plans were stored there (the mesh is then all it records). HP_ERR_INPUT: the
 * manifest malformed, plan.json missing, edited after sharding, or not a plan for m. */
hp_status hp_shard_folder_plan(hp_plan **plan, hp_mesh *mesh, const hp_model *m, const char *dir, hp_err *err);
/* Whether path is a folder written by `hyperpar shard`: a folder holding anything named manifest.json that is
 * not a folder (a FIFO or a dangling link counts too, so that reading it names what it is). */
bool hp_shard_is_folder(const char *path);
/* dir/config.json against the checksum manifest.json recorded when the folder was written. HP_ERR_INPUT: the
 * manifest missing or malformed (a FIFO or a folder named for what it is), or config.json changed after sharding
 * (said in those words). A folder whose manifest records no checksum passes. */
hp_status hp_shard_check_config(const char *dir, hp_err *err);
void hp_shard_rank_close(hp_shard_rank_file *f);
/* The tensor holding global parameter `name`: the tensor of that name, or the stack that lists it (then
 * *expert, when not NULL, gets its expert index in the stack; -1 otherwise). NULL when neither is there. */
const hp_shard_tensor *hp_shard_rank_find(const hp_shard_rank_file *f, const char *name, int64_t *expert);

/* Parses "5GB", "500MB", "2GiB", "123" (bytes) into *out; false when malformed or zero. */
bool hp_shard_parse_size(const char *s, uint64_t *out);

#ifdef __cplusplus
}
#endif
#endif
