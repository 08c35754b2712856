/*
 * run_int.h — internal to src/run: activations with their layout, the axis groups and their collectives
 * (redist.c), the family semantics read from config.json (rcfg.c), local weights (weights.c), the module
 * computations (modules.c) and the executor (runner.c). Design: docs/run.md.
 */
#ifndef HP_RUN_INT_H
#define HP_RUN_INT_H

#include "hyperpar/run.h"
#include "hyperpar/shard.h"

/* The mesh axes an activation can be laid out over (dp splits the batch before anything runs). */
enum { HP__TP = 0, HP__CP = 1, HP__NAX = 2 };

/* An activation's layout: a placement per axis (R, P or S(d) with d in 0..2 of [B, S, X]). */
typedef struct hp__lay {
    hp_placement ax[HP__NAX];
} hp__lay;

/* A boundary's single-input, single-output contract as layouts (has_in / has_out: it declares them). */
typedef struct hp__contract {
    const char *fqn;
    bool has_in, has_out;
    hp__lay in_src, in_dst, out_src, out_dst;
} hp__contract;

hp__contract hp__contract_of(const hp_boundary *b);
/* l must be c's in_src (in) or out_src (!in); else HP_ERR_INPUT naming the boundary and both layouts. */
hp_status hp__contract_check(const hp__contract *c, const hp__lay *l, bool in, hp_err *err);

/* One axis group: the ranks that differ only in that coordinate. */
typedef struct hp__grp {
    hp_comm *c;
    int64_t n, r; /* size and this rank's index */
} hp__grp;

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
    hp__grp ax[HP__NAX];
    hp_comm *dp_c;
    int64_t dp, dp_r;
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

/* Block i of n of a length L: [i·L/n, (i+1)·L/n) (as the shard layout cuts weights). */
static inline int64_t hp__blk_lo(int64_t L, int64_t n, int64_t i)
{
    return (int64_t)((__int128)L * i / n);
}

const char *hp__lay_str(const hp__lay *l, char *buf, size_t cap); /* "{tp: S(1), cp: S(1)}" */
bool hp__lay_eq(const hp__lay *a, const hp__lay *b);
/* The layout a plan's NamedPlacement gives (absent axes are R; S(-1) becomes S(2)). */
hp__lay hp__lay_from(const hp_nplace *pl);

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
/* Global range [lo, lo+n) of dim d held by (tp index, cp index) under layout lay. */
void hp__lay_range(const hp__ctx *x, const hp__lay *lay, const int64_t g[3], int d, int64_t tp_i, int64_t cp_i,
                   int64_t *lo, int64_t *n);

/* The lowering of one axis's transition (docs/run.md's table), decided without moving data: what
 * hp__redistribute runs for it and the bytes this rank sends into it (what the statistics count).
 * The dry executor (cost.c) asks the same question for any rank of the mesh. */
typedef enum hp__low_kind {
    HP__LOW_NONE,           /* the placements are equal */
    HP__LOW_ALL_GATHER,     /* S(d) -> R */
    HP__LOW_ALL_REDUCE,     /* P -> R */
    HP__LOW_REDUCE_SCATTER, /* P -> S(d), even blocks */
    HP__LOW_RS_UNEVEN,      /* P -> S(d), uneven: all-reduce + slice (counted as the all-reduce) */
    HP__LOW_SLICE,          /* R -> S(d): local */
    HP__LOW_REFUSE          /* not lowered; why says so */
} hp__low_kind;

typedef struct hp__low {
    hp__low_kind kind;
    int d;          /* the dim, or -1 */
    uint64_t bytes; /* this rank's bytes into the collective (UINT64_MAX: past what 64 bits hold) */
    const char *why;
} hp__low;

/* x supplies the group sizes and this rank's index on each axis (x->ax[].n, .r); nothing else is read. */
hp__low hp__lower_axis(const hp__ctx *x, const hp__lay *from, const int64_t g[3], int ax, hp_placement dst);
/* The error for a transition the lowering refuses on axis ax (`what` names it, `why` is hp__low.why). */
hp_status hp__refuse(const hp__lay *from, const hp__lay *to, int ax, const char *what, const char *why, hp_err *err);
/* The statistics kind of a lowering (HP_RUN_COLL_COUNT: no collective). */
hp_run_coll hp__low_coll(hp__low_kind k);

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

/* HP_OK when the runtime runs this model's family (the family table's `runs`: the ten decoder families of
 * docs/run.md); else HP_ERR_INPUT naming the model, its family and the families that run. */
hp_status hp__run_family_check(const hp_model *m, hp_err *err);

/* ---- the family's forward semantics from config.json (rcfg.c) ---- */
typedef enum { HP__ROPE_DEFAULT, HP__ROPE_LINEAR, HP__ROPE_LLAMA3, HP__ROPE_YARN } hp__rope_type;

typedef struct hp__rcfg {
    int64_t H, L, nh, nkv, hd, V, I;
    double eps;
    hp__rope_type rope;
    double theta, factor, low, high, partial, attn_scale;
    double beta_fast, beta_slow; /* yarn */
    double mscale_all_dim;       /* yarn: DeepSeek's softmax scale factor m² (0: none) */
    bool interleave;             /* rope on adjacent pairs (DeepSeek rope_interleave, default true there) */
    bool truncate;               /* yarn: floor/ceil the correction range (default true) */
    int64_t orig_max;
    int64_t rot;     /* rotary channels per head (hd · partial_rotary_factor, even) */
    int64_t *window; /* [L]: sliding window W (keys j > q - W), 0 = none */
} hp__rcfg;

/* From the model's one parse of config.json (m->cfg.fwd) and its family's facts (family table); label names
 * the config.json in messages (NULL: the model's path). HP_ERR_INPUT for what the runtime cannot run. */
hp_status hp__rcfg_read(const hp_model *m, const char *label, hp__rcfg *c, hp_err *err);
void hp__rcfg_free(hp__rcfg *c);
/* cos/sin [n, rot/2] for positions pos0..pos0+n-1 (f32 as transformers computes them, times attn_scale). */
hp_status hp__rope_table(const hp__rcfg *c, int64_t pos0, int64_t n, float **cos_out, float **sin_out, hp_err *err);

#endif
