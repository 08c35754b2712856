/*
 * source.h — internal to src/moe: where a layer's tensors come from (source.c), for the loader (load.c).
 *
 * A source is a checkpoint (hp_model + its hp_ckpt) or one rank file of a shard folder
 * (hp_shard_rank_file + the folder's config.json as a meta model). Tensors are reached through a view that
 * gives the global name and shape and maps global element indices to the stored ones; see source.c.
 */
#ifndef HP_MOE_SOURCE_H
#define HP_MOE_SOURCE_H

#include "moe/moe_internal.h"

#include "hyperpar/shard.h"

/* One load in progress: the source, the layer being filled and the caller's error. */
typedef struct hp__moe_src {
    const hp_model *m;            /* the checkpoint, or a shard folder's config.json (meta model) */
    const hp_shard_rank_file *rf; /* shard mode: the rank file the tensors come from; NULL: m->ckpt */
    hp_moe_layer *l;
    char block[80]; /* "model.layers.1.mlp" */
    bool widen;     /* hold bf16 expert weights as f32 (hp_moe_load_opts.widen_f32) */
    hp_err *err;
} hp__moe_src;

/* A tensor as the loader sees it (see source.c's file comment). */
typedef struct hp__moe_tview {
    const char *name;             /* global name, for messages */
    const hp_st_file *file;       /* where the bytes are */
    const hp_st_tensor *t;        /* the stored tensor */
    hp_dtype dtype;
    int n_dims;
    int64_t shape[HP_MAX_DIMS];   /* global shape (one expert's, for a member of a stack) */
    int64_t lo, hi;               /* global elements held */
    int64_t shift;                /* stored element index = global element index + shift */
    const hp_shard_tensor *sh;    /* shard mode: the rank file's manifest entry; NULL for a checkpoint */
    /* The held part as a box, for hp__moe_src_read_box: per global dim its held segments (a checkpoint holds
     * one, whole; a rank file one per slice, two for a packed S(d)x2 cut), stored row-major from `base`. */
    bool absent;                  /* a stack member of another rank: nothing held */
    int nseg[HP_MAX_DIMS];
    int64_t seg_lo[HP_MAX_DIMS][2], seg_n[HP_MAX_DIMS][2];
    int64_t lshape[HP_MAX_DIMS];  /* stored extent per dim (the sum of its segments) */
    int64_t base;                 /* stored element index of the held box's first element */
} hp__moe_tview;

#define HP__MOE_MAX_CHILDREN 32

/* The view of `<block>.<suffix>`; false when the source has no such tensor. */
bool hp__moe_src_find(hp__moe_src *s, const char *suffix, hp__moe_tview *v);
bool hp__moe_src_has(hp__moe_src *s, const char *suffix);
/* The tensor `<block>.<suffix>` with exactly the given shape; errors name it and what was expected. */
hp_status hp__moe_src_need(hp__moe_src *s, const char *suffix, int n_dims, const int64_t *shape, hp__moe_tview *out);
/* Widens n elements starting at global element elem_off of v into dst (f32); elements not held are an error. */
hp_status hp__moe_src_read_f32(hp__moe_src *s, const hp__moe_tview *v, int64_t elem_off, int64_t n, float *dst);
/* The first n elements of v widened to a new f64 array (*out owned by the caller, also on failure). */
hp_status hp__moe_src_read_f64(hp__moe_src *s, const hp__moe_tview *v, int64_t n, double **out);
/* A pointer into the mapping when the n elements from elem_off are held, stored as wdt (F32 or BF16) and
 * aligned (zero copy), else NULL. */
const void *hp__moe_src_mapped(const hp__moe_tview *v, hp_dtype wdt, int64_t elem_off, int64_t n, bool allowed);
/* n elements into dst as wdt: F32 widens like hp__moe_src_read_f32, BF16 copies a BF16 tensor's bytes. */
hp_status hp__moe_src_read_w(hp__moe_src *s, const hp__moe_tview *v, hp_dtype wdt, int64_t elem_off, int64_t n,
                             void *dst);
/* The resident dtype of expert weights stored as dt: BF16 stays BF16 unless s->widen, the rest is F32. */
static inline hp_dtype hp__moe_src_wdtype(const hp__moe_src *s, hp_dtype dt)
{
    return dt == HP_DT_BF16 && !s->widen ? HP_DT_BF16 : HP_DT_F32;
}
/* The global box [lo[d], lo[d] + n[d]) of v, row-major, into dst as wdt (as hp__moe_src_read_w converts).
 * Every element must be held; the last dim's run must lie in one held segment. The error names the tensor,
 * the slice it holds and the box needed (a shard folder made for another plan). */
hp_status hp__moe_src_read_box(hp__moe_src *s, const hp__moe_tview *v, hp_dtype wdt, const int64_t *lo,
                               const int64_t *n, void *dst);
/* Leaf names of the block's child modules (at most HP__MOE_MAX_CHILDREN of 48 bytes); returns the count. */
int hp__moe_src_children(hp__moe_src *s, char leaf[][48]);
/* Whether the source has a module of that name (a checkpoint) or tensors under it (a rank file). */
bool hp__moe_src_has_module(hp__moe_src *s, const char *name);
/* Shard mode: the experts the rank file holds must be exactly the layer's local range. */
hp_status hp__moe_src_check_experts(hp__moe_src *s);

#endif
