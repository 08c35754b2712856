/*
 * hyperpar/plan.h — the sharding planner: roles, boundaries, placements, the mesh, and the plan.
 *
 * Reproduces hyper_parallel's planner (spec/hyper_parallel.md §1-§8): every parameter gets a role
 * (Phase 1), parameters are grouped into boundaries (Phase 2), each boundary gets a type (Phase 3) and a
 * template-derived contract (Phase 4), MoE boundaries are EP-marked (§6.8), then finalisation and lints
 * (§7.3-§8) run.
 *
 *   hp_plan
 *    ├─ mesh, dims[]            the mesh; dims = its tp/cp/ep axes of size > 1, in mesh order (never dp)
 *    ├─ boundaries[]            forward (module registration) order
 *    │    ├─ params[]           relative path -> {axis: placement}
 *    │    ├─ in_src/in_dst      input name -> {axis: placement}
 *    │    ├─ out_src/out_dst    output name -> {axis: placement}, or null (no exit communication)
 *    │    └─ ep_size, ep_stack, deferred biases, TP-local attributes, local_compute_fn, ...
 *    ├─ roles[]                 one per model parameter
 *    ├─ special handlers, tied pairs, warnings
 *    └─ arena                   owns everything
 */
#ifndef HYPERPAR_PLAN_H
#define HYPERPAR_PLAN_H

#include "hyperpar/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- roles (§3.2) ---- */
typedef enum hp_role {
    HP_ROLE_COLWISE,
    HP_ROLE_ROWWISE,
    HP_ROLE_NORM,
    HP_ROLE_EMBED,
    HP_ROLE_LM_HEAD,
    HP_ROLE_MOE_GATE,
    HP_ROLE_MOE_EXPERT,
    HP_ROLE_SHARED_EXPERT,
    HP_ROLE_FUSED_QKV,
    HP_ROLE_FUSED_GATE_UP,
    HP_ROLE_BIAS,
    HP_ROLE_REPLICATED,
    HP_ROLE_SPECIAL,
    HP_ROLE_SKIP,
    HP_ROLE_COUNT
} hp_role;

const char *hp_role_name(hp_role r); /* "COLWISE", ... as in §3.2 */

/* ---- boundary types (§5, §6.2) ---- */
typedef enum hp_btype {
    HP_BT_ATTENTION,
    HP_BT_LINEAR_ATTENTION,
    HP_BT_MLP,
    HP_BT_NORM,
    HP_BT_EMBED,
    HP_BT_LM_HEAD,
    HP_BT_MOE_GATE,
    HP_BT_MOE_MLP,
    HP_BT_UNKNOWN,
    HP_BT_CUSTOM, /* inserted by an override: the contract is the user's */
    HP_BT_COUNT
} hp_btype;

const char *hp_btype_name(hp_btype t); /* "attention", ... */

/* ---- placements (§1.1) ---- */
typedef enum hp_pl_kind {
    HP_PL_ABSENT = 0, /* the axis key is not in the map */
    HP_PL_R,          /* Replicate */
    HP_PL_P,          /* Partial (sum) */
    HP_PL_S,          /* Shard(dim); dim may be negative (-1 = last) */
    HP_PL_S2,         /* packed Shard(dim) of a fused [gate; up] weight: "S(d)x2" (--packed-fused) */
} hp_pl_kind;

typedef struct hp_placement {
    int8_t kind; /* hp_pl_kind */
    int8_t dim;  /* for HP_PL_S / HP_PL_S2 */
} hp_placement;

/* The axes a plan's placements use. dp never appears (§1.2). */
typedef enum hp_axis { HP_AXIS_TP = 0, HP_AXIS_CP, HP_AXIS_EP, HP_AXIS_COUNT } hp_axis;
const char *hp_axis_name(hp_axis a); /* "tp", "cp", "ep" */

/* A NamedPlacement: {axis name -> placement}; absent axes have kind HP_PL_ABSENT. */
typedef struct hp_nplace {
    hp_placement ax[HP_AXIS_COUNT];
} hp_nplace;

hp_placement hp_pl_r(void);
hp_placement hp_pl_p(void);
hp_placement hp_pl_s(int dim);
bool hp_placement_eq(hp_placement a, hp_placement b);
/* "R", "P", "S(0)", "S(-1)", "S(0)x2"; buf of at least 12 bytes. */
const char *hp_placement_str(hp_placement p, char *buf, size_t cap);

/* An I/O contract: input or output name -> NamedPlacement. is_null: the field is None (out_* only). */
#define HP_MAX_IO 4
typedef struct hp_io_entry {
    char name[32];
    hp_nplace pl;
} hp_io_entry;
typedef struct hp_io_map {
    bool is_null;
    int n;
    hp_io_entry e[HP_MAX_IO];
} hp_io_map;

/* Options of an EP compute archetype (overrides' local_compute_fn). */
typedef struct hp_compute_opts {   /* all zero: nothing set */
    bool has_use_grouped_gemm, use_grouped_gemm;
    bool has_overlap_shared_expert, overlap_shared_expert;
    bool has_fix_router, fix_router;
    double capacity_factor;       /* 0 = unset */
} hp_compute_opts;

/* ---- boundaries (§1.3) ---- */
typedef struct hp_param_spec {
    const char *rel; /* path relative to the boundary ("q_proj.weight"), or stacked name ("experts.gate_proj") */
    hp_nplace pl;
    int param1;      /* 1 + the model parameter's index when the planner knows it; 0: look rel up by name */
} hp_param_spec;

typedef struct hp_ep_stack {
    const char *name;     /* stacked name relative to the boundary: "experts.gate_proj" */
    int n_src;
    const char **src;     /* per-expert relative sources in expert order: "experts.0.gate_proj.weight" */
    int *src_param1;      /* [n_src] 1 + each source's model parameter index, or NULL: look them up by name */
} hp_ep_stack;

typedef struct hp_tp_attr {
    const char *name;     /* "num_attention_heads" */
    int64_t global, local;
    bool user;            /* declared via tp_divide_attrs (overrides) rather than auto (D-17) */
} hp_tp_attr;

typedef struct hp_boundary {
    const char *fqn;          /* module FQN; "" = root */
    hp_btype type;
    int module;               /* index into the model's modules, -1 when not a module */
    bool is_boundary;         /* false: parameter-only spec (no I/O wrapping) */
    bool terminal;            /* Phase 5: last boundary in registration order */
    bool needs_cp_attn;       /* attention templates */
    int n_params;
    hp_param_spec *params;
    hp_io_map in_src, in_dst, out_src, out_dst;
    int ep_size;              /* D-10: extended EP group size; > 0 => expert params on the expert mesh */
    int n_ep_stack;
    hp_ep_stack *ep_stack;
    int n_deferred;
    const char **deferred_biases; /* D-22: relative bias paths added once after the exit reduction */
    int n_tp_attrs;
    hp_tp_attr *tp_attrs;     /* D-17: TP-local attribute plan */
    int n_user_attrs;
    const char **user_attrs;  /* tp_divide_attrs declared by overrides (validated in finalisation) */
    int n_out_names;
    const char **out_names;   /* tuple order of a multi-output module (overrides), or none */
    const char *local_compute_fn; /* EP archetype key (overrides), or NULL */
    hp_compute_opts compute;  /* the archetype's options (with local_compute_fn) */
    int8_t region_dispatch;   /* -1 None, 0 false, 1 true */
    bool injected;            /* set by overrides */
} hp_boundary;

/* ---- mesh ---- */
#define HP_MESH_MAX_DIMS 8
#define HP_MESH_MAX_SIZE (1 << 20)  /* the largest size of one axis */
#define HP_MESH_MAX_WORLD (1 << 30) /* the largest product of the sizes (--world accepts up to this) */
typedef struct hp_mesh {
    int n_dims;
    char names[HP_MESH_MAX_DIMS][16]; /* in mesh order, e.g. dp, cp, tp */
    int64_t sizes[HP_MESH_MAX_DIMS];
    int64_t ep;      /* requested EP size: the ep axis (old style) or the virtual D-10 group size */
    bool ep_axis;    /* an explicit ep axis is in the mesh (old-style EP) */
} hp_mesh;

/* "dp=2,cp=1,tp=4" (names in order; product = world). Strict: known axis names, each once; sizes plain
 * digits in [1, HP_MESH_MAX_SIZE]; product <= HP_MESH_MAX_WORLD; no spaces, no empty items. */
hp_status hp_mesh_parse(const char *spec, hp_mesh *out, hp_err *err);
/* Prepends a pp axis of size pp (the outermost, as Megatron orders it); HP_ERR_INPUT when m has one already or
 * the world would pass HP_MESH_MAX_WORLD. */
hp_status hp_mesh_add_pp(hp_mesh *m, int64_t pp, hp_err *err);
/* Builds (dp, cp, tp) [+ ep when ep_axis] from sizes; sizes of 1 are kept. */
void hp_mesh_from_sizes(hp_mesh *out, int64_t dp, int64_t cp, int64_t tp, int64_t ep, bool ep_axis);
int64_t hp_mesh_size(const hp_mesh *m, const char *name); /* 1 when absent */
int64_t hp_mesh_world(const hp_mesh *m); /* saturates at INT64_MAX */
/* Rank's coordinate on the named axis (row-major over the mesh dims, last fastest); 0 when absent. */
int64_t hp_mesh_coord(const hp_mesh *m, int64_t rank, const char *axis);
/* Rank's EP group and its index in it: with an explicit ep axis its ep coordinate (the group: the ranks sharing
 * every other coordinate), else TP-extend-EP's flat blocks of `ep` consecutive ranks (spec §10.1). The one
 * place that says which EP slot a rank is (the shard layout, the MoE runtime and the CLI ask here). */
void hp_mesh_ep_index(const hp_mesh *m, int64_t ep, int64_t rank, int64_t *group, int64_t *index);
/* Rank's share of the batch: the rows are split into n blocks and the rank computes block index. With an
 * explicit ep axis the ep axis is data parallelism outside the MoE blocks (as Megatron and torchtitan carve EP
 * out of DP): n = dp x ep, index = dp coordinate x ep + ep coordinate; else n = dp, index = the dp coordinate.
 * *group (may be NULL) names the rank's batch-split group, the n ranks sharing its cp and tp coordinates (the
 * lowest of them: a communicator split's colour), over which the dense gradients are summed. The one statement
 * of the rule: the runtime, the gathers, cost and advise ask here. */
void hp_mesh_batch_index(const hp_mesh *m, int64_t rank, int64_t *n, int64_t *index, int64_t *group);
/* n of hp_mesh_batch_index: the blocks the batch is split into (every rank the same). */
int64_t hp_mesh_batch_split(const hp_mesh *m);
/* The experts EP slot `index` of `ep` holds: [first, first + count), block index of n_experts. */
void hp_ep_local_experts(int64_t n_experts, int64_t ep, int64_t index, int64_t *first, int64_t *count);
/* HP_ERR_INPUT unless 1..HP_MESH_MAX_DIMS axes with sizes in [1, HP_MESH_MAX_SIZE], product <= HP_MESH_MAX_WORLD,
 * and ep in [0 (unset), HP_MESH_MAX_SIZE] (what hp_mesh_parse guarantees; for meshes built with hp_mesh_from_sizes). */
hp_status hp_mesh_check(const hp_mesh *m, hp_err *err);
/* Why a TP-extend-EP mesh (--ep N without an ep axis) is not `world` ranks, when world is a multiple of it: the
 * ep groups ride on the dp/cp/tp ranks and add none, and the sizes that were meant ("; --ep 2 adds no ranks: ...
 * --dp 2 --tp 2 --ep 2 was meant ..."), to append to a world-size error; "" otherwise. */
const char *hp_mesh_world_hint(const hp_mesh *m, int64_t world, char *buf, size_t cap);
/* "dp=2,tp=4 (world 8), ep=4 (TP-extend-EP)" */
const char *hp_mesh_str(const hp_mesh *m, char *buf, size_t cap);
/* The EP group size the mesh asks for: the ep axis's size with an explicit ep axis, else the TP-extend-EP
 * size m->ep (1 when unset). The one statement of the rule; plans ask hp_plan_ep_size. */
int64_t hp_mesh_ep_size(const hp_mesh *m);
/* The rank of rank's group along axis (the ranks that differ from rank only in their coordinate on axis) whose
 * coordinate on axis is coord. coord 0 gives the group's base, the same for every member: it names the group
 * (a communicator split's colour). rank itself when the mesh has no such axis (a group of one). */
int64_t hp_mesh_group_rank(const hp_mesh *m, int64_t rank, const char *axis, int64_t coord);
/* HP_ERR_INPUT when the mesh has a pp axis of size > 1 and `what` (a command: "moe") does not execute a
 * pipeline yet: the one refusal of pp. Every other command takes a pp axis (docs/pipeline.md). */
hp_status hp_mesh_check_pp(const hp_mesh *m, const char *what, hp_err *err);

/* ---- pipeline parallelism (docs/pipeline.md) ----
 *
 * The pp axis cuts the decoder into contiguous layer ranges. With V virtual stages (interleaved) the layers are
 * cut into pp·V chunks, chunk c on stage c mod pp (Megatron's round robin). The embedding lives with chunk 0 and
 * the final norm, lm_head and the loss with the last chunk (stage pp − 1); a tied lm_head reads the embedding, so
 * both the first and the last stage hold it. */
struct hp_plan;
typedef struct hp_pipeline {
    int64_t pp;              /* stages: the pp axis's size (1: no pipeline) */
    int64_t virt;            /* virtual stages per stage (1: none) */
    int64_t n_chunks;        /* pp · virt */
    int64_t *first, *count;  /* [n_chunks]: chunk c holds decoder layers [first[c], first[c] + count[c]) */
    bool given;              /* the counts were given (--pp-layers), not split evenly */
} hp_pipeline;

/* The split of L decoder layers into pp · virt chunks (arrays in arena a). counts (n of them, NULL: none): the
 * layers of each chunk as given (--pp-layers: n = pp · virt, each >= 0, summing to L). Else even: the embedding
 * and the loss count as one layer each (Megatron's account_for_embedding_in_pipeline_split and
 * account_for_loss_in_pipeline_split), the L + 2 units are cut into chunks that differ by at most one (the later
 * chunks take the extra), and chunk 0 and the last chunk give their unit to the embedding and the loss; fewer
 * units than chunks is refused. HP_ERR_INPUT with the reason. */
hp_status hp_pipeline_split(hp_pipeline *out, int64_t L, int64_t pp, int64_t virt, const int64_t *counts, int n,
                            hp_arena *a, hp_err *err);
/* The chunk holding decoder layer l (0 <= l < L), and its stage (chunk mod pp). */
int64_t hp_pipeline_chunk_of(const hp_pipeline *q, int64_t l);
int64_t hp_pipeline_stage_of(const hp_pipeline *q, int64_t l);
/* The stages holding parameter `name` of p's model into st (1 or 2 of them; returns how many): a decoder layer's
 * its chunk's stage; the embedding stage 0 (and pp − 1 when lm_head is tied to it); everything else (the final
 * norm, lm_head, layers past the decoder such as multi-token prediction) the last stage. */
int hp_pipeline_param_stages(const struct hp_plan *p, const char *name, int64_t st[2]);

/* ---- pipeline schedules (src/plan/schedule.c; docs/pipeline.md) ----
 *
 * A training step runs m micro-batches through the chunks. Each stage executes its own list of operations, a
 * forward or a backward of one chunk on one micro-batch, in the order its schedule gives:
 *   - gpipe: every forward (micro-batch order), then every backward (micro-batch order);
 *   - 1f1b (PipeDream-flush, Megatron's default): min(pp − s − 1, m) warm-up forwards on stage s, then one
 *     forward and one backward in turn, then the remaining backwards;
 *   - interleaved (Megatron's interleaved 1F1B, virt >= 2 and m a multiple of pp): groups of pp micro-batches go
 *     through the stage's chunks in turn; (pp − s − 1)·2 + (virt − 1)·pp warm-up forwards (all of them when
 *     m == pp), then one forward and one backward in turn.
 * Every schedule runs each chunk's backwards in micro-batch order, so the gradients sum the micro-batches in the
 * order one process sums them. The runtime walks these lists (src/run/pipe_train.c), cost simulates them. */
typedef enum { HP_PP_1F1B, HP_PP_GPIPE, HP_PP_INTERLEAVED } hp_pp_sched;
const char *hp_pp_sched_name(hp_pp_sched k);
/* "1f1b", "gpipe", "interleaved": true and *k; else false. */
bool hp_pp_sched_parse(const char *s, hp_pp_sched *k);
/* The schedule a pipeline runs when none is given: interleaved with virtual stages, else 1f1b. */
hp_pp_sched hp_pp_sched_default(const hp_pipeline *q);
typedef struct hp_pp_op {
    bool bwd;      /* a backward (else a forward) */
    int64_t chunk; /* the chunk (global index: stage chunk mod pp) */
    int64_t mb;    /* the micro-batch */
    bool joined;   /* the backward of a steady-state pair: it runs with the forward before it as one unit, their
                      sends and the next unit's receives exchanged together (Megatron's
                      send_forward_backward_recv_forward_backward), which keeps the interleaved schedule free of
                      deadlock under rendezvous sends */
} hp_pp_op;
/* The most operations a step's lists hold over all stages (2 · virt · m · pp). */
#define HP_PP_MAX_OPS ((int64_t)1 << 22)
/* Whether schedule k runs m micro-batches on pipeline q: HP_ERR_INPUT naming why not (1f1b and gpipe run one
 * chunk per stage; interleaved needs virtual stages and m a multiple of pp; 1 <= m, 2·virt·m·pp <= HP_PP_MAX_OPS). */
hp_status hp_pp_sched_check(const hp_pipeline *q, hp_pp_sched k, int64_t m, hp_err *err);
/* Stage s's operations in the order it runs them: 2 · virt · m of them into ops (the check passed). */
void hp_pp_sched_ops(const hp_pipeline *q, hp_pp_sched k, int64_t m, int64_t s, hp_pp_op *ops);
/* The most of bytes[chunk] summed over the (chunk, micro-batch) pairs of stage s whose forward ran and whose
 * backward has not yet (bytes NULL: 1 each, the most forwards in flight): the activations a stage keeps. */
double hp_pp_sched_in_flight(const hp_pipeline *q, hp_pp_sched k, int64_t m, int64_t s, const double *bytes);
/* The step's time on the pipeline: every stage runs its list, an operation starting when the stage is free and
 * its input has arrived (the previous chunk's forward, or the next chunk's backward, t_p2p after it ended);
 * tf[c] and tb[c] each chunk's forward and backward time per micro-batch. *makespan: when the last operation
 * ends; *busy (may be NULL): the largest sum of a stage's own operation times, so the bubble is
 * makespan − busy. HP_ERR_INPUT (internal) if the lists cannot finish. */
hp_status hp_pp_sched_simulate(const hp_pipeline *q, hp_pp_sched k, int64_t m, const double *tf, const double *tb,
                               double t_p2p, double *makespan, double *busy, hp_err *err);

/* ---- planning ---- */
typedef struct hp_plan_opts {
    hp_mesh mesh;
    bool sequence_parallel;   /* default true */
    bool loss_parallel;       /* default false */
    bool allow_uncovered;     /* F4b warns instead of failing */
    bool packed_fused;        /* fused gate/up weights get "S(d)x2" instead of an error */
    bool derive;              /* default true; false = the plan holds only overrides (issue 4) */
    int64_t seq_len;          /* for compatibility checks (cp); 0 = not given */
    const struct hp_overrides *overrides; /* plan overrides (hyperpar/overrides.h), or NULL */
    int64_t pp_virtual;       /* virtual stages per pipeline stage (0 or 1: none) */
    const int64_t *pp_layers; /* the decoder layers of each pipeline chunk (--pp-layers), n_pp_layers of them;
                                 NULL: an even split (hp_pipeline_split) */
    int n_pp_layers;
    const char *ep_compute;   /* the EP compute of every EP-marked boundary the overrides leave without one: an
                               * archetype key (or factory path), or "suggested" (the family's); NULL: none. As
                               * the YAML {match, when: ep, region_dispatch: false, local_compute_fn: {_target_}}
                               * for each; refused for a dense model and where an override declares another */
} hp_plan_opts;

void hp_plan_opts_default(hp_plan_opts *o);

typedef struct hp_special {
    const char *param;   /* full FQN */
    const char *handler; /* "gated_delta_tp_shard" or "default" */
} hp_special;

typedef struct hp_plan {
    const hp_model *model;
    hp_mesh mesh;
    int n_dims;
    hp_axis dims[HP_AXIS_COUNT]; /* mesh_dim_names: tp/cp/ep axes of size > 1 in mesh order */
    int64_t tp, cp, ep;          /* sizes (1 when inactive) */
    bool sequence_parallel, loss_parallel;
    bool allow_uncovered;        /* trainable parameters may lack a boundary (replicated, unsharded) */
    size_t n_boundaries;
    hp_boundary *boundaries;     /* forward order */
    hp_role *roles;              /* [model->n_params] */
    int n_special;
    hp_special *special;
    int n_tied;
    const char *tied[1][2];      /* (embed, lm_head) */
    int n_warnings;
    const char **warnings;
    hp_pipeline pipe;            /* the pipeline stages' layers (pipe.pp 1: none) */
    hp_arena arena;
} hp_plan;

hp_status hp_plan_derive(hp_plan **out, const hp_model *m, const hp_plan_opts *o, hp_err *err);
void hp_plan_free(hp_plan *p);
/* The plan's EP group size: its ep axis's size (explicit ep axis), else p->ep (TP-extend-EP), else 1. */
int64_t hp_plan_ep_size(const hp_plan *p);

/* Boundary by FQN, or NULL. */
const hp_boundary *hp_plan_find(const hp_plan *p, const char *fqn);
/* The boundary declaring the parameter (full FQN) and its placement; NULL when uncovered. */
const hp_boundary *hp_plan_param_placement(const hp_plan *p, const char *param_fqn, hp_nplace *out);

/* Outputs (plan_json.c, explain.c, hf.c); out is appended to. */
hp_status hp_plan_to_json(const hp_plan *p, hp_buf *out, hp_err *err);
hp_status hp_plan_explain(const hp_plan *p, const char *fqn, hp_buf *out, hp_err *err);
/* The transformers plan export (docs/plan-format.md, "Transformers plan export") for the style names and plan
 * rules of transformers release hf_version: "MAJOR.MINOR" or "MAJOR.MINOR.PATCH" in plain digits, 5.0 or later
 * (NULL: HP_HF_DEFAULT_VERSION). A version that does not parse, or is older than 5.0, is HP_ERR_INPUT. A shard
 * that no style of the target expresses is listed under "unmapped", never written with a name the target
 * refuses. hp_plan_to_hf is hp_plan_to_hf_target(p, NULL, ...). */
#define HP_HF_DEFAULT_VERSION "5.25"
hp_status hp_plan_to_hf_target(const hp_plan *p, const char *hf_version, hp_buf *out, hp_err *err);
hp_status hp_plan_to_hf(const hp_plan *p, hp_buf *out, hp_err *err);
/* Only the version check of hp_plan_to_hf_target (a CLI checks its flags before loading the model). */
hp_status hp_plan_hf_version_check(const char *hf_version, hp_err *err);

/* §8.9: heads, kv heads, expert width, experts, sequence length against the mesh. */
hp_status hp_plan_check_compat(const hp_model *m, int64_t tp, int64_t cp, int64_t ep, int64_t seq_len,
                               hp_err *err);

#ifdef __cplusplus
}
#endif
#endif
