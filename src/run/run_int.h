/*
 * run_int.h — internal to src/run: activations with their layout, the axis groups and their collectives
 * (redist.c), the family semantics read from config.json (rcfg.c), local weights (weights.c), the module
 * computations (modules.c) and the executor (runner.c). Design: docs/run.md.
 */
#ifndef HP_RUN_INT_H
#define HP_RUN_INT_H

#include "hyperpar/run.h"
#include "hyperpar/shard.h"

#include "exec/layout.h"
#include "exec/rcfg.h"

/* A local block of a global [B, S, X] f32 tensor. */
typedef struct hp__act {
    float *d;
    size_t cap;    /* floats allocated */
    int64_t g[3];  /* global dims */
    hp__lay lay;
    int64_t lo[3], n[3]; /* the local block (hp__act_shape) */
} hp__act;

/* Statistics and timers shared by the collectives. */
typedef struct hp__comm_stats {
    double comm_s;
    uint64_t bytes[HP_RUN_COLL_COUNT];
    uint64_t calls[HP_RUN_COLL_COUNT];
    double coll_s[HP_RUN_COLL_COUNT];
    double wait_s;
    uint64_t p2p_bytes, p2p_calls; /* a pipeline's point-to-point transfers this rank sent or received */
} hp__comm_stats;

/* The forward's workspace, counted by the one allocation wrapper every activation, scratch and communication
 * buffer of the runner goes through (weights and index arrays excluded): the bytes held now and the most held
 * at once since the forward began (hp_run_stats.workspace_bytes; cost's workspace_bytes models it). */
typedef struct hp__wsmem {
    uint64_t cur, peak;
} hp__wsmem;

typedef struct hp__ctx {
    const hp_comm *world;
    const hp_mesh *mesh;
    hp_comm *axc[HP__NAX]; /* the axis groups: the ranks that differ only in that coordinate */
    hp__axes pos;          /* their sizes and this rank's index in each */
    hp_comm *dp_c;         /* the batch-split group: dp x an explicit ep axis (hp_mesh_batch_index) */
    int64_t dp, dp_r;      /* its size (the replicas) and this rank's replica */
    hp__comm_stats st;
    bool sync;          /* a barrier before each collective (hp_run_opts.sync_collectives) */
    const char *where; /* the boundary being executed, for messages */
    char coll_label[96]; /* hp__redistribute's "<tp part> (tp) + <cp part> (cp)", valid until its next call */
    /* buffers the transitions reuse across calls and forwards (no fresh pages per collective) */
    hp__act spare;             /* the other activation of a transition; swapped with the result */
    float *scratch[2];         /* packed send / receive blocks */
    size_t scratch_cap[2];     /* floats */
    /* the batch of the forward in progress */
    int64_t B_all, S_orig, S_pad;
    int64_t *dp_rows; /* [dp + 1]: replica i holds rows [dp_rows[i], dp_rows[i+1]) */
    hp__wsmem mem;    /* the workspace counter */
} hp__ctx;

/* The counting wrapper: a buffer of old_bytes becomes one of new_bytes (0: freed; a realloc counts new - old). */
void hp__mem_count(hp__ctx *x, size_t old_bytes, size_t new_bytes);
/* realloc(p, new_bytes), counted on success (p held old_bytes); NULL and nothing counted on failure. */
void *hp__mem_realloc(hp__ctx *x, void *p, size_t old_bytes, size_t new_bytes);
/* free(p) of a buffer of bytes, counted. */
void hp__mem_free(hp__ctx *x, void *p, size_t bytes);

/* Sets a->lo/n from a->g and a->lay for this rank (nested cp-major when both axes shard one dim). */
void hp__act_shape(const hp__ctx *x, hp__act *a);
int64_t hp__act_count(const hp__act *a);
/* Sizes a for global dims g and layout lay, (re)allocating its buffer; contents undefined. */
hp_status hp__act_alloc(hp__ctx *x, hp__act *a, int64_t B, int64_t S, int64_t X, hp__lay lay, hp_err *err);
void hp__act_free(hp__act *a);
/* hp__act_free of a buffer hp__act_alloc counted in x. */
void hp__act_release(hp__ctx *x, hp__act *a);
/* The context's reusable buffers (hp__ctx_free releases them). */
void hp__ctx_free(hp__ctx *x);
/* Converts a from its layout to `to`, by the lowering table of docs/run.md; `what` names the transition for
 * errors ("entry of model.layers.0.self_attn input hidden_states"). *coll receives the collective's label. */
hp_status hp__redistribute(hp__ctx *x, hp__act *a, const hp__lay *to, const char *what, const char **coll,
                           hp_err *err);

/* Timed, counted collectives on an axis group (or the world). */
hp_status hp__allreduce(hp__ctx *x, const hp_comm *c, float *buf, size_t n, hp_err *err);
hp_status hp__allreduce_max(hp__ctx *x, const hp_comm *c, float *buf, size_t n, hp_err *err);
/* Gathers an activation to rank 0 of the world as the whole [B_all, S, X] (B_all = sum over dp); rank 0 gets
 * *out (malloc'd, (B_all·S·X + 1) floats, counted in x->mem: the caller releases it with hp__mem_free or
 * hp__mem_count when it hands it on). Partial layouts are refused. Collective over the world. */
hp_status hp__gather_full(hp__ctx *x, const hp__act *a, int64_t B_all, const int64_t *dp_rows, float **out,
                          hp_err *err);
/* The forward's output: hp__gather_full, whose *out leaves x->mem (handed to the caller); in one process, when a
 * holds the whole tensor, a's own buffer is handed on instead of a copy (a is left empty: the next forward
 * allocates it again).
 * The same bytes and calls are counted either way. may_take false (a backward reads a again): always a copy.
 * Collective over the world. */
hp_status hp__gather_out(hp__ctx *x, hp__act *a, int64_t B_all, const int64_t *dp_rows, bool may_take, float **out,
                         hp_err *err);


#endif
