/*
 * hyperpar/cost.h — what a plan costs each rank: weights (exact), communication per forward step (exact,
 * derived by the runtime's own lowering of the plan's contracts), activations, KV cache, training state, FLOPs
 * and a predicted step time (estimates, from the stated model of docs/cost.md).
 *
 *   hp_cost_compute(model, plan, opts)   every rank of the plan's mesh, in one process (no MPI)
 *
 * The communication is what `hyperpar run` counts (hp_run_stats.bytes and .calls per kind) for the same batch:
 * the dry executor walks the forward the runner executes, boundary by boundary, asking the runtime's
 * lowering (hp__lower_axis) what each transition runs, for each rank's coordinates. The MoE token exchange
 * depends on the routing: exact for a given routing (opts.routing) or for the balanced router
 * (hyperpar run --router balanced); the real router's exchange is estimated by the balanced one.
 */
#ifndef HYPERPAR_COST_H
#define HYPERPAR_COST_H

#include "hyperpar/plan.h"
#include "hyperpar/run.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The adjustable byte and time model (docs/cost.md states each figure). */
typedef struct hp_cost_model {
    int grad_bytes;        /* train: bytes per gradient element (4: f32 main grads) */
    int master_bytes;      /* train: bytes per master-weight element (4; 0 when the weights are f32) */
    int optim_bytes;       /* train: optimizer state per element (8: Adam's two f32 moments) */
    int zero;              /* train: 0 none; 1 optimizer state and master split over the data-parallel group
                            * (experts: the expert-data-parallel group); 2 gradients too */
    int kv_bytes;          /* KV cache bytes per element (2: bf16) */
    double gemm_flops;     /* per rank, FLOP/s */
    double bw_intra, bw_inter;   /* link bandwidth, bytes/s, inside a node and between nodes */
    double lat_intra, lat_inter; /* per message, seconds */
    int64_t ranks_per_node;      /* 0: every rank on one node */
} hp_cost_model;

void hp_cost_model_default(hp_cost_model *m);

typedef struct hp_cost_opts {
    int64_t B, S;               /* the batch of one forward step (all dp replicas together) */
    bool train;                 /* add training state and the backward's estimate */
    /* The MoE routing, or NULL: the balanced router. routing[l] is layer l's [B·S, K] expert indices (NULL for
     * a dense layer); K must be the model's top-k. Padded positions (CP) are routed as balanced (estimated). */
    const int32_t *const *routing;
    int64_t routing_layers;     /* entries in routing */
    hp_cost_model mdl;
    /* hyperpar advise: another mesh for the same plan's contracts (the plan's placements are read, its sizes
     * are not), a subset of the ranks, and the weight bytes known already (no shard layout is built). */
    const hp_mesh *mesh;        /* NULL: the plan's */
    int64_t n_ranks;            /* 0: every rank; else ranks[0..n_ranks) */
    const int64_t *ranks;
    bool weights_given;
    uint64_t weight_bytes;      /* every evaluated rank's, when weights_given */
    const struct hp_shard_layout *layout; /* p's shard layout when the caller has built it (NULL: built here) */
} hp_cost_opts;

void hp_cost_opts_default(hp_cost_opts *o);

/* One collective of one rank's forward step. */
typedef struct hp_cost_event {
    int32_t layer;        /* -1: before or after the decoder layers */
    const char *where;    /* the boundary (the plan's fqn) or "loss" / "logits" */
    const char *step;     /* "entry", "exit", "cp K/V", "residual", "EP dispatch+return", "loss", "gather" */
    hp_run_coll kind;
    const char *axis;     /* its group: "tp", "cp", "ep", "dp" or "all" (the world) */
    int32_t group;        /* ranks in its group */
    int32_t calls;
    uint64_t bytes;       /* this rank's bytes into it (as hp_run_stats counts them) */
    bool estimated;       /* the MoE exchange under the balanced model of a real router, or padded positions */
    double seconds;       /* predicted (estimate) */
} hp_cost_event;

typedef struct hp_cost_rank {
    int64_t rank, dp, cp, tp, ep; /* coordinates (ep: the EP group index) */
    uint64_t weight_bytes;        /* exact: its shard file's tensors */
    uint64_t bytes[HP_RUN_COLL_COUNT], calls[HP_RUN_COLL_COUNT]; /* exact communication of one forward */
    uint64_t net_bytes;           /* of those, in groups of more than one rank */
    uint64_t act_bytes;           /* estimate: the forward's working buffers (docs/cost.md) */
    uint64_t kv_bytes;            /* estimate: a KV cache of the batch's S positions */
    /* train estimates (0 for inference): Megatron's byte model (docs/cost.md). ZeRO-1 splits the optimizer state
     * and master weights, ZeRO-2 the gradients too, over the data-parallel group of each parameter: world / tp
     * for the dense ones, the expert-data-parallel group (the ranks holding the same experts) for the experts.
     * saved_bytes: the residual stream's local block at every layer's input and the final norm's. */
    uint64_t grad_bytes, optim_bytes, master_bytes, saved_bytes;
    uint64_t total_bytes;         /* weights + activations (+ training state) */
    double flops;                 /* forward (x3 with train), estimate */
    double t_compute, t_comm, t_step; /* predicted seconds */
    bool ep_estimated;            /* the exchange bytes are an estimate */
    hp_cost_event *ev;
    size_t n_ev;
} hp_cost_rank;

typedef struct hp_cost {
    int64_t world;
    int64_t n_ranks;              /* entries in ranks (world unless opts.n_ranks) */
    int64_t B, S, S_pad;
    bool train;
    hp_cost_model mdl;
    int64_t max_rank;             /* index into ranks of the one with the most total_bytes */
    char refused[2048];           /* non-empty: the runtime refuses the plan, and why; then only the weights are
                                     derived (everything else is 0) */
    char note[768];               /* non-empty: a warning about the plan's cost (MoE blocks that every tp rank runs
                                     whole, without sequence parallelism) */
    hp_cost_rank *ranks;
} hp_cost;

/* Every rank of p's mesh (or opts' ranks of opts' mesh). When the runtime would refuse the plan, the weights are
 * still there and c->refused gives the runtime's reason. HP_ERR_INPUT: a bad batch or rank list, ranks_per_node
 * that neither divides the world nor holds it all, or a batch past what 64 bits hold ("... is past what the cost
 * model can hold"): every figure is computed with checked arithmetic, and every byte figure, the sum a rank's
 * report prints (total_bytes + kv_bytes, the communication bytes over all kinds) included, fits a uint64_t. */
hp_status hp_cost_compute(hp_cost **out, const hp_model *m, const hp_plan *p, const hp_cost_opts *o, hp_err *err);

/* The same in two steps, for many meshes of one plan (advise): the plan's boundaries and the model's runtime
 * config are found once. m and p must outlive k. */
typedef struct hp_cost_plan hp_cost_plan;
hp_status hp_cost_plan_create(hp_cost_plan **out, const hp_model *m, const hp_plan *p, hp_err *err);
hp_status hp_cost_eval(hp_cost **out, const hp_cost_plan *k, const hp_cost_opts *o, hp_err *err);
void hp_cost_plan_free(hp_cost_plan *k);
void hp_cost_free(hp_cost *c);

#ifdef __cplusplus
}
#endif
#endif
