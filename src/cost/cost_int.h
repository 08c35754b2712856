/*
 * cost_int.h — internal to src/cost: the dry walk's state (cost.c walks a rank's steps; cost_eval.c turns the walk
 * into the rank's memory, training state, events and time, and holds the entry points).
 */
#ifndef HP_COST_COST_INT_H
#define HP_COST_COST_INT_H

#include "cost/held.h"
#include "exec/prog.h"

#include "hyperpar/cost.h"
#include "hyperpar/shard.h"

#include <string.h>

/* An activation as the walk follows it: its global dims, its layout, and the runner's buffer's floats. */
typedef struct dact {
    int64_t g[3];
    hp__lay lay;
    int64_t cap; /* floats of the runner's buffer that holds it */
} dact;

/* ---- what the walk needs of the plan, the same for every rank ---- */

enum { HP__COST_EP_SHAPES = 64 };

typedef struct walk {
    const hp_cost_plan *k;
    const hp_model *m;
    const hp_plan *p;
    const hp_cost_opts *o;
    const hp__prog *g; /* the program the walk follows (exec/prog.h) */
    int64_t tp, cp, dp, ep, E, K, mI, sI;
    int64_t *owner;    /* [E]: the EP index holding expert e */
    int64_t *ecnt;     /* [E]: scratch, slots per expert */
    const hp_mesh *mesh; /* the plan's, or opts.mesh */
    const hp_shard_layout *lay; /* the plan's cut of every tensor, or NULL (advise: the weights are given) */
    int64_t *dp_rows;  /* [dp + 1] */
    hp__axes pos;      /* the walked rank's position on tp and cp */
    int64_t B_all, S_orig, S_pad; /* the batch, its sequence, and that padded for cp (hp__seq_pad) */
    hp_cost_rank *cr;  /* the rank being walked */
    size_t ev_cap;
    hp_err *err;
    /* the rank's working-set model (floats) */
    int64_t w_hidden, w_wide, w_spare, w_kv, w_q, w_o, w_gu, w_h, w_s0, w_s1, w_moe;
    int64_t w_saved;   /* train: the residual stream's local blocks the backward keeps (L layer inputs + final) */
    double touched;    /* decode: Σ over sparse layers of the share of the rank's local experts some slot reaches */
    int64_t n_sparse;  /* decode: sparse layers walked */
    const char *ovf;   /* the first figure of the rank past 64 bits (NULL: none); hp_cost_eval refuses the batch */
    /* The runner's workspace, buffer by buffer as the forward sizes it (capacities in floats, kept across the
     * steps as the runner keeps them), and the counter its allocation wrapper keeps (hp__mem_*, bytes). */
    int64_t c_spare, c_s0, c_s1, c_k, c_v, c_buf[4];
    int64_t rope_pos0, rope_n;
    uint64_t rope_b, m_cur, m_peak;
    bool ws_ovf; /* a workspace figure passed 64 bits: workspace_bytes is UINT64_MAX */
    /* The tp and cp groups' shared windows (hp_comm_window_size): whether a collective went through one, and the
     * largest call's bytes per rank */
    bool win_used[HP__NAX];
    uint64_t win_max[HP__NAX];
    int64_t ev_times;  /* trans counts each collective this many times (a row chunk standing for several); 0: none */
    uint64_t w_full;   /* the rank's weights as stored (bf16 under a GPU profile), before --zero 3 shards them */
    const hp__cost_held *held; /* [lay->n_tensors]: how hyperpar's runtime holds each (held.c); NULL: as stored */
    /* Inference: the shapes (I, sI, shared-expert gate) of the EP runtimes counted so far; a sparse layer of one
     * of them borrows that runtime's buffers (the runner's moe_runtime). */
    int64_t ep_shape[HP__COST_EP_SHAPES][3];
    int n_ep_shape;
    /* Training: the backward's walk (cost.c) reads what the forward's left. recompute: the backward's recompute of a
     * layer is walking its forward again (nothing is created twice, nothing counted twice); kept: [L + 1] the layer
     * inputs the forward keeps (dims and layout); fk, fv: the last attention's K and V as it left them; loss_cap:
     * the rows the kept loss statistics hold. */
    bool recompute;
    dact *kept;
    dact fk, fv;
    int64_t loss_cap;
    uint64_t zero_tmp; /* the optimizer step's largest ZeRO-1 all-gather buffers (train.c's zero_step), bytes */
    /* A pipeline (pipe.c; docs/cost.md "Pipeline parallelism"). The walk runs on the stage's own mesh (mesh: the
     * plan's less its pp axis, so every group lies inside a stage) and walks the rank's stage's chunks only. */
    const hp_pipeline *pipe; /* the stages' layers (pipe->pp 1: none) */
    int64_t pp, per, stage, lrank; /* stages, ranks per stage, the walked rank's stage and its rank in it */
    int32_t cur_chunk;       /* the chunk being walked: the events' */
    double *ch_flops, *ch_attn; /* [n_chunks]: one micro-batch's forward FLOPs of each chunk, and their attention core */
    int64_t *ch_saved;       /* [n_chunks]: floats the backward keeps of each chunk per micro-batch (cpu) */
    uint64_t *ch_gpu_saved;  /* [n_chunks]: bytes the same under a GPU profile (gpu_memory) */
    double *ch_by;           /* [n_chunks]: scratch */
    int64_t p2p_block;       /* floats of the largest stream block the rank sends or receives */
    hp_pp_sched sched;       /* train: the schedule */
    int64_t n_micro;         /* the micro-batches of the step */
    struct hp__cost_tab *tab;         /* pipe.c's chunk times by stage-local rank */
} walk;

/* ---- checked size math ----
 *
 * Every product and sum of the batch's sizes (B, S and the widths they multiply) goes through these: a figure
 * that 64 bits cannot hold saturates and marks the walk with what it was, and hp_cost_eval refuses the batch
 * instead of printing a wrapped number. Estimates in FLOPs and seconds are doubles and need no check. */

/* A figure past 64 bits: the workspace (a model of run's buffers, which run itself would refuse to size) saturates
 * and says so in its own figure; any other refuses the batch. */
static inline void mark(walk *w, const char *what)
{
    if (!strcmp(what, "workspace") || !strcmp(what, "MoE workspace")) w->ws_ovf = true;
    else if (!w->ovf) w->ovf = what;
}

static inline int64_t ck_mul(walk *w, const char *what, int64_t a, int64_t b)
{
    int64_t r;
    if (hp_mul_i64(a, b, &r)) return r;
    mark(w, what);
    return INT64_MAX;
}

static inline int64_t ck_mul3(walk *w, const char *what, int64_t a, int64_t b, int64_t c)
{
    return ck_mul(w, what, ck_mul(w, what, a, b), c);
}

static inline int64_t ck_add(walk *w, const char *what, int64_t a, int64_t b)
{
    int64_t r;
    if (hp_add_i64(a, b, &r)) return r;
    mark(w, what);
    return INT64_MAX;
}

/* Elements n as bytes of esize each, or UINT64_MAX (marked) past 64 bits. */
static inline uint64_t ck_bytes(walk *w, const char *what, int64_t n, uint64_t esize)
{
    uint64_t r;
    if (n >= 0 && !__builtin_mul_overflow((uint64_t)n, esize, &r)) return r;
    mark(w, what);
    return UINT64_MAX;
}

static inline uint64_t ck_addu(walk *w, const char *what, uint64_t a, uint64_t b)
{
    uint64_t r;
    if (!__builtin_add_overflow(a, b, &r)) return r;
    mark(w, what);
    return UINT64_MAX;
}

/* The mask of the mesh axes that shard a tensor (experts_scan): bits of tp, cp and ep. */
enum { M_TP = 1, M_CP = 2, M_EP = 4, M_COUNT = 8 };

struct hp_cost_plan {
    const hp_model *m;
    const hp_plan *p;
    /* The routed experts' tensors (an ep_stack, an ep placement or the MOE_EXPERT role): their global bytes by
     * the mask of the axes that shard them. A rank holds bytes / (the product of those axes' sizes) of each,
     * and the ranks holding the same slice, world / that product, are the expert-data-parallel group that
     * reduces its gradients and shares its ZeRO state. */
    uint64_t expert_bytes[M_COUNT];
    /* Of every parameter, and of the routed experts' (a part of it), the frozen ones (--freeze: not trainable):
     * global bytes by the same masks. A frozen tensor gets no gradient, no optimizer state and no master in the
     * byte model, as in hyperpar train (runtime_state). */
    uint64_t frozen_bytes[M_COUNT], frozen_expert_bytes[M_COUNT];
    /* Every parameter's global bytes by decoder layer (index L: outside the layers) and the mask of the axes that
     * shard it: --zero 3 gathers one layer's weights at a time, the largest of which is its transient. */
    uint64_t (*layer_bytes)[M_COUNT];
    int64_t n_layers;
    /* The embedding table (untied), by the same masks: a decode step reads only its B rows of it. */
    uint64_t embed_bytes[M_COUNT];
};

/* The walk's steps shared by the two files (cost.c). */
hp_status hp__cost_add_event(walk *w, int32_t layer, const char *where, const char *step, hp_run_coll kind,
                           const char *axis, int64_t group, int64_t calls, uint64_t bytes, bool est);
bool hp__cost_axis_spans_nodes(const walk *w, int64_t rank, const char *axis);
int64_t hp__cost_cache_positions(const walk *w, int32_t l, int64_t n);
int64_t hp__cost_ep_member(const hp_mesh *m, int64_t P, int64_t rank, int64_t i);
bool hp__cost_experts_scan(hp_cost_plan *k);
hp_status hp__cost_owners(walk *w);
hp_status hp__cost_topk_gathers(walk *w, const hp__step *s);
hp_status hp__cost_walk_rank(walk *w);

/* The pipeline (pipe.c). */
void hp__cost_stage_mesh(const hp_mesh *m, hp_mesh *out);
/* The activations rank r's stage keeps: bytes[c] per micro-batch of each of its chunks c, times the micro-batches
 * the schedule keeps in flight (hp_pp_sched_in_flight); r->in_flight set. */
uint64_t hp__cost_in_flight(walk *w, hp_cost_rank *r, const double *bytes);
/* Each evaluated rank's bubble and step (every stage's chunk times at its position in the stage, walking ranks of
 * the other stages with eval where none was evaluated), and c's stages. */
typedef hp_status (*hp__cost_eval_fn)(walk *w, hp_cost_rank *r, int64_t rk, int64_t n_micro, hp_status wst);
/* After rank r's evaluation (the walk still holds its chunk figures): its chunks' seconds and its t_busy. */
hp_status hp__cost_pipe_record(walk *w, hp_cost_rank *r);
hp_status hp__cost_pipe_finish(walk *w, hp_cost *c, hp__cost_eval_fn eval);
void hp__cost_pipe_free(walk *w);

#endif
