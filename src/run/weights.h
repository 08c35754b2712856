/*
 * weights.h — internal to src/run: one rank's slices of the parameters (weights.c).
 */
#ifndef HP_RUN_WEIGHTS_H
#define HP_RUN_WEIGHTS_H

#include "hyperpar/shard.h"

/* Where the slices come from, and what was loaded. */
typedef struct hp__wsrc {
    const hp_model *m;            /* the checkpoint (or a shard folder's config.json) */
    const hp_shard_layout *layout;/* the plan's cut of every tensor */
    int64_t rank;
    const hp_shard_rank_file *rf; /* shard mode: the rank's file; NULL: slice m's checkpoint */
    uint64_t resident;            /* bytes held after loading */
    uint64_t share;               /* bytes of the rank's cut as stored (its shard file's tensor bytes) */
} hp__wsrc;

/* A loaded slice: the local block in its resident dtype (F32, or BF16 when kept). */
typedef struct hp__w {
    bool present;
    void *d;
    hp_dtype dt;
    int n_dims;
    int64_t shape[HP_MAX_DIMS];  /* local */
    int64_t global[HP_MAX_DIMS];
    int64_t lo[HP_MAX_DIMS];     /* global offset of the first element held, per dim */
    int64_t n;                   /* local elements */
    hp_nplace pl;                /* the plan's placement */
    int train_ix;                /* 1 + its entry in the training state (train.c), 0: none */
} hp__w;

/* Loads the rank's slice of parameter `name`. Not present and !required: out->present false, HP_OK.
 * keep_bf16: a BF16 tensor stays BF16 (else widened to f32, as every non-F32 dtype is). */
hp_status hp__w_load(hp__wsrc *s, const char *name, bool required, bool keep_bf16, hp__w *out, hp_err *err);
void hp__w_free(hp__w *w);
/* Rank `rank`'s cut of parameter `name` (its slices of the global shape). */
hp_status hp__w_cut(const hp__wsrc *s, const char *name, int64_t rank, hp_shard_tensor *t, hp_err *err);
/* Writes a rank's local block (f32, as hp__w_load lays it out) into the whole tensor at its cut t. */
void hp__w_place(const hp_shard_tensor *t, const float *local, float *whole);

#endif
