/*
 * hyperpar/cost.h — what a plan costs each rank: weights (exact), communication per forward step (exact,
 * derived by the runtime's own lowering of the plan's contracts), activations, KV cache, training state, FLOPs
 * and a predicted step time (estimates, from the stated model of docs/cost.md).
 *
 *   hp_cost_compute(model, plan, opts)   every rank of the plan's mesh, in one process (no MPI)
 *
 * The communication is what `hyperpar run` counts (hp_run_stats.bytes and .calls per kind) for the same batch
 * (inference: the run that takes no logits, hp_run_opts.no_logits; docs/cost.md "Which run"):
 * the dry executor walks the program the runner executes (its step list), asking the runtime's own lowering what
 * each transition runs, for each rank's coordinates (docs/cost.md). The MoE token exchange
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
/* Whose training state --mode train counts (docs/cost.md, "Training state"). */
typedef enum hp_cost_state {
    HP_COST_STATE_RUNTIME = 0, /* hyperpar train's own, to the byte (zero 0 or 1; the *_bytes below unused) */
    HP_COST_STATE_MEGATRON     /* Megatron-LM's byte model with the *_bytes and zero below */
} hp_cost_state;

/* The machine a rank runs on (docs/cost.md, "Hardware profiles"). "cpu" is hyperpar's own f32 runtime on this
 * project's CPUs (the default, the figures the rest of this header calls exact); a GPU profile describes another
 * engine: weights and activations bf16, activations as Megatron-LM accounts them (Korthikanti et al. 2022, with
 * recomputation), the training state Megatron's byte model, and every figure is an estimate for that engine. */
typedef struct hp_cost_hardware {
    const char *name;          /* "cpu", "H100", "H200", "A100", "MI300X" */
    const char *desc;          /* the part, as its vendor names it */
    bool gpu;                  /* false: hyperpar's runtime */
    uint64_t mem_bytes;        /* memory per device; 0 (cpu): not stated */
    double flops;              /* FLOP/s per device: bf16 dense, no sparsity (cpu: the default GEMM rate) */
    double hbm_bw;             /* device memory bandwidth, bytes/s (0: not stated) */
    double bw_intra, bw_inter; /* link bandwidth per device and direction, bytes/s, inside and between nodes */
    double lat_intra, lat_inter; /* per message, seconds */
    int64_t ranks_per_node;    /* 0: every rank on one node */
    const char *source;        /* where the figures come from */
    double gemm_eff;           /* the fraction of flops that a training step's large GEMMs sustain (cpu: 1, its rate
                                * is measured, not a datasheet's) */
    double link_eff;           /* the fraction of the link bandwidths that collectives reach (NCCL's bus bandwidth
                                * over the nominal one; cpu: 1) */
    const char *eff_source;    /* where the two efficiencies come from, or that they are assumptions */
} hp_cost_hardware;

/* The profile called name (case-insensitive; "H100-80G", "A100-80G" and "H200-141G" spellings too), or NULL. */
const hp_cost_hardware *hp_cost_hardware_find(const char *name);
/* Every profile, cpu first; their count into *n. */
const hp_cost_hardware *hp_cost_hardware_list(size_t *n);

/* What --mode train keeps of the forward for the backward under a GPU profile (Megatron's --recompute-*). */
typedef enum hp_cost_recompute {
    HP_COST_RECOMPUTE_NONE = 0, /* every activation the backward reads is kept (the only one under cpu) */
    HP_COST_RECOMPUTE_SELECTIVE, /* the attention scores are recomputed (Megatron's default; the GPU default) */
    HP_COST_RECOMPUTE_FULL       /* only each layer's input is kept; the backward reruns the layer's forward */
} hp_cost_recompute;

typedef struct hp_cost_model {
    const hp_cost_hardware *hw; /* NULL or cpu: hyperpar's runtime; a GPU: another engine (estimates) */
    hp_cost_recompute recompute; /* train, GPU profiles: what the backward recomputes */
    hp_cost_state state;   /* train: the runtime's exact state (default) or Megatron's byte model */
    int grad_bytes;        /* train: bytes per gradient element (4: f32 main grads) */
    int master_bytes;      /* train: bytes per master-weight element (4; 0 when the weights are f32) */
    int optim_bytes;       /* train: optimizer state per element (8: Adam's two f32 moments) */
    int zero;              /* train: 0 none; 1 optimizer state and master split over the data-parallel group
                            * (experts: the expert-data-parallel group); 2 gradients too; 3 (FSDP) the weights
                            * too, plus the largest layer's gathered weights while it runs */
    int kv_bytes;          /* KV cache bytes per element (2: bf16) */
    double gemm_flops;     /* per rank, FLOP/s: the peak (a GPU: the datasheet's dense bf16 rate) */
    double gemm_eff;       /* of gemm_flops, the fraction the step's FLOPs run at (--gemm-eff; the profile's) */
    double link_eff;       /* of bw_intra and bw_inter, the fraction collectives reach (--link-eff; the profile's) */
    double mem_bw;         /* decode: a rank's memory bandwidth, bytes/s (the bound of a step that reads every
                            * weight and the KV cache once); a hardware profile sets it with gemm_flops */
    double bw_intra, bw_inter;   /* link bandwidth, bytes/s, inside a node and between nodes */
    double lat_intra, lat_inter; /* per message, seconds */
    int64_t ranks_per_node;      /* 0: every rank on one node */
    uint64_t mem_reserve;        /* bytes of each device kept for the runtime and fragmentation (CUDA context,
                                  * library workspaces, NCCL's buffers, the caching allocator's unused blocks):
                                  * what the figures must fit is a budget less this (hp_cost_usable). A GPU
                                  * profile: a tenth of its memory (docs/cost.md "Memory reserve"); cpu: 0 */
} hp_cost_model;

void hp_cost_model_default(hp_cost_model *m);
/* Sets hw and the rates, bandwidths, latencies and ranks per node it states (a GPU: recompute selective, Megatron's
 * training state); the caller then applies the flags given explicitly over them. */
void hp_cost_model_hardware(hp_cost_model *m, const hp_cost_hardware *hw);
/* What a budget of mem_per_rank bytes leaves the figures: mem_per_rank less m's reserve, 0 when the reserve takes it
 * all (then nothing fits; a budget of 0 is "no budget" for the callers, which test mem_per_rank for that). */
uint64_t hp_cost_usable(const hp_cost_model *m, uint64_t mem_per_rank);
/* Whether m describes a GPU engine rather than hyperpar's runtime. */
bool hp_cost_model_gpu(const hp_cost_model *m);
const char *hp_cost_recompute_name(hp_cost_recompute r);

typedef struct hp_cost_opts {
    int64_t B, S;               /* the batch of one step (all dp replicas together: the global batch); decode: B
                                   sequences of S = 1 new token each */
    int64_t micro_batch;        /* train: rows per dp replica in one micro-batch; B / (micro_batch · dp) micro-batches
                                   (gradient accumulation) make the step and must be whole. 0: the default, one
                                   row per replica (Megatron's usual), B / dp micro-batches; when dp does not
                                   divide B, one micro-batch of each replica's rows (hp_cost_default_micro_batch) */
    bool train;                 /* add training state and the backward's estimate */
    bool decode;                /* serving: one new token per sequence (S must be 1) against a KV cache of context
                                   positions per sequence (docs/cost.md "Decode"); not with train */
    int64_t context;            /* decode: the KV cache's positions per sequence (C >= 1) */
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
    uint64_t weight_bytes;      /* every evaluated rank's as stored, when weights_given */
    uint64_t held_weight_bytes; /* those weights as hyperpar's runtime holds them (0: as stored) */
    const struct hp_shard_layout *layout; /* p's shard layout when the caller has built it (NULL: built here) */
    /* A pipeline (a pp axis in the mesh; docs/cost.md "Pipeline parallelism"). */
    hp_pp_sched pp_sched;       /* train: the schedule, when pp_sched_given; else hp_pp_sched_default */
    bool pp_sched_given;
    const hp_pipeline *pipe;    /* advise: the stages' layers for opts.mesh's pp (NULL: the plan's) */
    const uint64_t *stage_weight_bytes; /* advise, with weights_given and pp > 1: [pp] each stage's weights as
                                           stored (weight_bytes is then unused) */
    const uint64_t *stage_held_bytes;   /* the same as hyperpar's runtime holds them (held_weight_bytes's) */
} hp_cost_opts;

void hp_cost_opts_default(hp_cost_opts *o);
/* The micro-batch o means on dp replicas (its rows per replica): o->micro_batch when given; in training by default 1
 * row (Megatron's --micro-batch-size default), or, when dp does not divide o->B, 0: one micro-batch of each
 * replica's rows; 0 outside training. cost and advise both take this one definition. */
int64_t hp_cost_default_micro_batch(const hp_cost_opts *o, int64_t dp);

/* One collective of one rank's forward step. */
typedef struct hp_cost_event {
    int32_t layer;        /* -1: before or after the decoder layers */
    const char *where;    /* the boundary (the plan's fqn) or "loss" */
    const char *step;     /* "entry", "exit", "cp K/V", "residual", "EP dispatch+return", "loss", "gather" */
    hp_run_coll kind;
    const char *axis;     /* its group: "tp", "cp", "ep", "dp" or "all" (the world) */
    int32_t group;        /* ranks in its group */
    int64_t calls;
    uint64_t bytes;       /* this rank's bytes into it (as hp_run_stats counts them) */
    bool estimated;       /* the MoE exchange under the balanced model of a real router, or padded positions */
    double seconds;       /* predicted (estimate) */
    uint64_t wire_bytes;  /* the bytes this rank sends over links for it under the ring algorithms (docs/cost.md
                             "Wire bytes"): all-gather (n-1)·bytes, reduce-scatter (n-1)/n·bytes, all-reduce
                             2(n-1)/n·bytes, all-to-all (n-1)/n·bytes, gather bytes (0 on the root); 0 when n = 1 */
    int32_t chunk;        /* the pipeline chunk whose forward or backward runs it (0 without a pipeline); -1: after
                             the micro-batches (the gradients' data-parallel reduction) */
} hp_cost_event;

typedef struct hp_cost_rank {
    int64_t rank, dp, cp, tp, ep; /* coordinates (dp: its batch block, hp_mesh_batch_index; ep: the EP index) */
    uint64_t weight_bytes;        /* exact: its weights as the runtime holds them (`run --stats-json`'s
                                     resident_bytes; docs/cost.md "Weights per rank"); bf16 under a GPU profile,
                                     as stored under Megatron-LM's byte model (--train-state megatron) */
    uint64_t stored_bytes;        /* exact: its weights as stored, the tensor bytes of its shard file */
    uint64_t bytes[HP_RUN_COLL_COUNT], calls[HP_RUN_COLL_COUNT]; /* exact communication of one forward */
    uint64_t sent_bytes;          /* of those, the bytes put into groups of more than one rank (not wire traffic:
                                     a reduce-scatter counts its whole input; formerly net_bytes) */
    uint64_t wire_bytes;          /* the bytes it sends over links (Σ of its events' wire_bytes; docs/cost.md) */
    uint64_t act_bytes;           /* estimate: the forward's working buffers (docs/cost.md) */
    uint64_t workspace_bytes;     /* exact: the high-water mark of the runner's activation, scratch and
                                     communication buffers in `hyperpar run`'s one forward (docs/cost.md);
                                     UINT64_MAX: past 64 bits (run refuses such a batch) */
    uint64_t window_bytes;        /* exact: the shared-memory windows of its tp and cp groups that lie on one node
                                     (hp_comm_window_size of each group's largest call; run --stats-json's
                                     window_bytes); not in workspace_bytes, in act_bytes */
    uint64_t kv_bytes;            /* estimate: a KV cache of the batch's S positions (decode: of its B_r sequences'
                                     context positions) */
    uint64_t kv_seq_bytes;        /* estimate: the KV cache of one sequence on this rank (S positions, decode: C),
                                     sliding-window layers capped at their window */
    /* train estimates (0 for inference): Megatron's byte model (docs/cost.md). ZeRO-1 splits the optimizer state
     * and master weights, ZeRO-2 the gradients too, over the data-parallel group of each parameter: world / tp
     * for the dense ones, the expert-data-parallel group (the ranks holding the same experts) for the experts.
     * saved_bytes: the residual stream's local block at every layer's input and the final norm's. */
    uint64_t grad_bytes, optim_bytes, master_bytes, saved_bytes;
    uint64_t gather_bytes;        /* --zero 3: the largest layer's weights gathered while it runs (transient) */
    uint64_t total_bytes;         /* what counts against a budget: weights + activations + the KV cache of the
                                     batch (inference) or the training state (train); docs/cost.md "Total" */
    double flops;                 /* forward (train: x3, plus recompute_flops), estimate: what the rank computes */
    double attn_flops;            /* of one forward's flops, the attention core (the scores Q·Kᵀ and P·V), which
                                     selective recompute repeats */
    double recompute_flops;       /* train: the forward FLOPs the backward repeats (full: the whole forward;
                                     selective: attn_flops; none, and cpu: 0) */
    double t_compute, t_comm, t_step; /* predicted seconds: t_compute = flops / (gemm_flops · gemm_eff), t_comm every
                                     collective's time, t_step = t_compute + t_exposed + t_bubble (decode:
                                     max(t_compute, t_memory) + t_comm) */
    double t_overlap;             /* train, GPU: the data-parallel gradient reduction's seconds, which run beside the
                                     backward's compute (docs/cost.md "Overlap") */
    double t_exposed;             /* of t_comm, what the step waits for: t_comm - t_overlap + max(0, t_overlap -
                                     the backward's compute seconds); t_comm when nothing overlaps */
    double t_bubble;              /* the pipeline bubble: the step's makespan under the schedule's simulation less
                                     this rank's stage's own busy seconds (hp_pp_sched_simulate; docs/cost.md
                                     "Pipeline parallelism"); 0 without a pipeline */
    int64_t stage;                /* its pipeline stage (0 without a pipeline) */
    uint64_t p2p_bytes, p2p_calls; /* exact: the residual stream's blocks it sends and receives between pipeline
                                     stages in one step (run --stats-json's p2p_bytes and p2p_calls; train: the
                                     backward's gradients too); bf16 (half) under a GPU profile */
    int64_t in_flight;            /* train with a pipeline: the most micro-batches its stage holds activations of
                                     (hp_pp_sched_in_flight); 1 otherwise */
    double t_busy;                /* with a pipeline: its stage's own seconds (forwards, backwards and their tp, cp
                                     and ep collectives over every micro-batch) */
    double mfu;                   /* train: the step's model FLOPs (hp_cost.model_flops) / world over t_step times
                                     gemm_flops; 0 otherwise */
    uint64_t read_bytes;          /* decode: bytes a step reads from memory: the weights (less the embedding table
                                     and the routed experts no token reaches) and the batch's KV cache */
    double t_memory;              /* decode: read_bytes / mem_bw (0 otherwise) */
    bool ep_estimated;            /* the exchange bytes are an estimate */
    hp_cost_event *ev;
    size_t n_ev;
} hp_cost_rank;

/* One pipeline stage: the worst of its evaluated ranks (evaluated false: none of its ranks was; advise). */
typedef struct hp_cost_stage {
    int64_t stage, rank_lo, rank_hi;      /* its ranks [rank_lo, rank_hi) */
    int64_t n_chunks, first_layer, n_layers; /* its chunks; the first chunk's first layer; its layers in all */
    bool embedding, head;                 /* it holds the embedding, the head (and the loss) */
    bool evaluated;
    int64_t max_rank;                     /* index into hp_cost.ranks of its most-loaded evaluated rank */
    uint64_t weight_bytes, act_bytes, saved_bytes, total_bytes, p2p_bytes; /* of that rank */
    int64_t in_flight;
    double t_busy;
} hp_cost_stage;

typedef struct hp_cost {
    int64_t world;
    int64_t n_ranks;              /* entries in ranks (world unless opts.n_ranks) */
    int64_t B, S, S_pad;
    int64_t micro_batch, n_micro; /* train: rows per replica per micro-batch, and micro-batches per step */
    bool train;
    bool decode;                  /* B sequences of one new token, each with a KV cache of context positions */
    int64_t context;
    int64_t dp;                   /* the data-parallel replicas: dp x an explicit ep axis (hp_mesh_batch_split) */
    hp_cost_model mdl;
    int64_t max_rank;             /* index into ranks of the one with the most total_bytes */
    double model_flops;           /* train: the step's model FLOPs (hp_cost_train_flops + hp_cost_attn_train_flops
                                     over the global batch), no recompute; 0 otherwise */
    double mfu;                   /* train: model_flops / (the slowest rank's t_step · world · gemm_flops) */
    int64_t pp, pp_virtual;       /* the pipeline: stages and virtual stages per stage (1, 1: none) */
    hp_pp_sched pp_sched;         /* train with pp > 1: the schedule simulated */
    double t_makespan;            /* with pp > 1: the step's pipeline timeline (the slowest rank position's) */
    struct hp_cost_stage *stages; /* [pp] with pp > 1, else NULL */
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
/* ---- the settings of a cost or advise request, by name (src/cost/cost_settings.c) ----
 * Names are the CLI's long options without "--" (batch, global-batch, micro-batch, seq, mode, context, hardware,
 * recompute, mem-per-rank, mem-reserve, mem-bw, gemm-gflops, gemm-eff, link-eff, intra-bw, inter-bw,
 * intra-latency-us, inter-latency-us, ranks-per-node, train-state, grad-bytes, master-bytes, optim-bytes, zero,
 * kv-bytes, measure-gemm); values as typed there. The CLI and the JSON-in interface both read them here. */
typedef struct hp_cost_settings {
    hp_cost_opts co;
    bool batch_given, seq_given;
    uint64_t budget;            /* mem-per-rank, 0 when not given (a GPU --hardware: its memory) */
    bool measure;               /* measure-gemm */
    const char *megatron_by;    /* the first setting that chose Megatron's byte model, NULL: none */
    bool runtime_given;         /* train-state runtime */
    const hp_cost_hardware *hw; /* hardware (NULL: cpu) */
    unsigned given;             /* the model settings given explicitly: they override the hardware's */
    bool recompute_given, global_given, micro_given, reserve_given;
    int64_t global_batch;       /* global-batch */
    bool context_given;         /* context */
    const char *train_only;     /* the first setting given that only a training step takes, NULL: none */
} hp_cost_settings;

void hp_cost_settings_init(hp_cost_settings *s);
/* Reads one setting; *taken is false when name is not one of them (nothing changed, HP_OK). A bad value is
 * HP_ERR_INPUT naming it as the CLI's flag ("--batch expects ..."). */
hp_status hp_cost_setting(hp_cost_settings *s, const char *name, const char *value, bool *taken, hp_err *err);
/* After the settings: applies the hardware under the settings given explicitly, its memory as the default budget,
 * and checks what they say together (recompute under cpu, micro-batch outside training, ...); decode: no
 * training setting, the context is context, else the seq given, else 4096, and the step one new token (S = 1). */
hp_status hp_cost_settings_done(hp_cost_settings *s, hp_err *err);
/* "80GB" (1000s), "80GiB" or "80G" (1024s), "4096B" bytes: a unit is required (a bare "80" is refused, not taken
 * as 80 bytes). opt names the value in the message. */
hp_status hp_parse_size(const char *opt, const char *s, uint64_t *out, hp_err *err);
/* cost's default batch on mesh when none was given: a row per replica (dp x an ep axis). */
void hp_cost_settings_batch(hp_cost_settings *s, const hp_mesh *mesh);
/* What advise needs of its settings for world ranks: a budget, ranks per node that tile the world, --prefer
 * headroom only in decode. */
hp_status hp_advise_settings_check(const hp_cost_settings *s, int64_t world, bool prefer_headroom, hp_err *err);

hp_status hp_cost_compute(hp_cost **out, const hp_model *m, const hp_plan *p, const hp_cost_opts *o, hp_err *err);

/* Decode: the sequences that fit beside rank r's weights and step activations in mem_per_rank bytes,
 * floor((mem_per_rank - weights - activations) / kv_seq_bytes) (the activations hold the runtime's constant
 * scratch), 0 when those alone pass it; -1 when mem_per_rank is 0 (no budget). */
int64_t hp_cost_rank_seqs(const hp_cost_rank *r, uint64_t mem_per_rank);
/* Decode: the concurrent sequences the mesh serves in mem_per_rank less c's reserve (hp_cost_usable; 0 when the
 * reserve takes it all): dp (replicas) times the fewest any evaluated rank fits (every replica alike); -1 without a
 * budget or when the figures are not derived. */
int64_t hp_cost_seqs(const hp_cost *c, uint64_t mem_per_rank);

/* The same in two steps, for many meshes of one plan (advise): the plan's boundaries and the model's runtime
 * config are found once. m and p must outlive k. */
typedef struct hp_cost_plan hp_cost_plan;
hp_status hp_cost_plan_create(hp_cost_plan **out, const hp_model *m, const hp_plan *p, hp_err *err);
hp_status hp_cost_eval(hp_cost **out, const hp_cost_plan *k, const hp_cost_opts *o, hp_err *err);
void hp_cost_plan_free(hp_cost_plan *k);
void hp_cost_free(hp_cost *c);

/* The largest item of r's total (binding constraint): "weights", "activations", "KV cache", "gradients",
 * "optimizer state", "master weights", "saved activations" or "gathered weights"; its bytes into *bytes. */
const char *hp_cost_rank_binding(const hp_cost_rank *r, bool train, uint64_t *bytes);

/* ---- when a rank does not fit: the nearest change that does (src/cost/fit.c; docs/cost.md "When nothing fits") */

/* One change of the request, a flag and its value, and what the most-loaded rank then needs. */
typedef struct hp_fit_change {
    char flag[24];              /* "--zero", "--recompute", "--micro-batch", "--batch", "--seq" or "--world" */
    char value[32];
    char flag2[24], value2[32]; /* "": one change; else a second one made with it (a higher "--zero" when no
                                   single change fits) */
    uint64_t bytes;             /* the most-loaded rank's total with the change */
    char mesh[128];             /* advise: the first-ranked mesh that then fits; cost: "" */
} hp_fit_change;

#define HP_FIT_MAX 6
typedef struct hp_fit {
    const char *binding;        /* the largest item of the most-loaded rank (hp_cost_rank_binding) */
    uint64_t binding_bytes, total_bytes, budget;
    uint64_t reserve;           /* of budget, kept for the runtime (hp_cost_model.mem_reserve): the changes fit in
                                   budget - reserve */
    char tried[256];            /* the kinds of change tried, as their flags ("--zero, --seq, ...") */
    int n;                      /* changes found, each the nearest of its kind, in the order tried: */
    hp_fit_change ch[HP_FIT_MAX]; /* a higher ZeRO, recompute, a smaller micro-batch (infer: batch), a shorter
                                     sequence, more ranks (advise) */
} hp_fit;

/* The binding constraint of c's most-loaded rank (c from hp_cost_compute(m, p, o)) and, when its total is above
 * what budget leaves after o's reserve (hp_cost_usable), the nearest change of o that fits, each kind tried on ranks 0, the most-loaded and the last. */
hp_status hp_cost_fit(hp_fit *f, const hp_model *m, const hp_plan *p, const hp_cost_opts *o, const hp_cost *c,
                      uint64_t budget, hp_err *err);

/* `hyperpar cost`'s one flow for plan p (the CLI's and the JSON interface's): p's shard layout (built once, for
 * the weights and the coordinates shown), the default batch on p's mesh (hp_cost_settings_batch), the evaluation
 * (hp_cost_compute) and, with fit, the nearest changes that fit s->budget (hp_cost_fit). *r is zeroed first;
 * free it with hp_cost_result_free, on failure too. */
typedef struct hp_cost_result {
    struct hp_shard_layout *layout;
    hp_cost *cost;
    hp_fit fit;
} hp_cost_result;
hp_status hp_cost_evaluate(hp_cost_result *r, const hp_model *m, const hp_plan *p, hp_cost_settings *s, bool fit,
                           hp_err *err);
void hp_cost_result_free(hp_cost_result *r);

/* ---- what a training step is measured against (src/cost/mfu.c; docs/train.md, "What the user sees") ----
 *
 * MFU = hp_cost_train_flops / step seconds / hp_gemm_limit.sum_gflops (FLOP/s). */

/* W: the weights one token goes through in the forward's GEMMs — per decoder layer the attention projections
 * (MLA's five), a dense layer's gate, up and down, a sparse layer's router, its top-k routed experts and its
 * shared expert (only the active experts: routing taken as balanced); then lm_head. 0 without a hidden size. */
double hp_cost_gemm_weights(const hp_model *m);
/* Model FLOPs of one training step over `tokens` tokens (every position the forward runs): 6·W·tokens, 2 per
 * weight in the forward and 4 in the backward. Not counted: the attention scores, norms, rope, the embedding
 * lookup, AdamW and the backward's recomputation of the forward. */
double hp_cost_train_flops(const hp_model *m, int64_t tokens);
/* The attention scores' model FLOPs of a training step over B rows of S positions: 3 x (Q·Kᵀ and P·V of every
 * query over every key of its row, 4·S²·heads·head_dim per row and layer; MLA: 2·S²·heads·(qk + v head dims)),
 * causal masking not subtracted, as cost counts them and as PaLM's MFU (6N + 12·L·H·S per token) does. */
double hp_cost_attn_train_flops(const hp_model *m, int64_t B, int64_t S);

/* The same-run GEMM limit: every rank of w at once (after a barrier) runs an n×n×n product through the GEMM layer
 * in mode, the compute the step runs in (hp_moe_ref_gemm_gflops, best of reps after a warm-up): f32, or bf16
 * operands with f32 sums, so that an MFU compares a step with the products of its own numerics. */
typedef struct hp_gemm_limit {
    int64_t n;
    hp_linalg_mode mode;
    int reps;
    double rank_gflops;  /* this rank's GFLOP/s */
    double min_gflops;   /* the slowest rank's */
    double sum_gflops;   /* over all ranks: the limit */
    double seconds;      /* the slowest rank's time for the whole measurement (allocation, warm-up, reps) */
    double peak_gflops;  /* the arithmetic peak in mode summed over the ranks (hp_linalg_peak_gflops, every rank at
                            once after the product): the bound the limit itself sits under */
    const char *peak_name; /* hp_linalg_peak_name(mode) */
    char impl[128];        /* what ran this rank's product (hp_moe_ref_gemm_run), e.g. "oneDNN brg:avx512_core_bf16" */
} hp_gemm_limit;
/* Collective; every failure agreed: HP_ERR_INPUT for n or reps < 1, HP_ERR_NOMEM when a rank cannot run it. */
hp_status hp_cost_gemm_limit(const hp_comm *w, int64_t n, hp_linalg_mode mode, int reps, hp_gemm_limit *out,
                             hp_err *err);

/* ---- hyperpar advise: which mesh of N ranks to pick (src/cost/advise.c, docs/cost.md "hyperpar advise") ----
 *
 *   hp_advise(&a, model, opts)   every dp x cp x tp (x ep) mesh of opts.world ranks, each accepted or rejected
 *                                with its reason, the accepted ranked best first
 *
 * A plan is derived on a template mesh where every axis the model can use is active: tp, cp, and EP over the
 * dense region; for a MoE model also one without EP (experts cut over tp) and one with an explicit ep axis
 * (experts split over ep and cut over tp), for the candidates that place their experts so. Contracts and
 * placements do not depend on the axis sizes, so each candidate is its template's cost at the candidate's sizes: hp_cost_eval with the candidate's mesh for ranks 0 and N-1 (communication,
 * activations, FLOPs, time), and the weight bytes from the template's shard layout, tensor by tensor divided by
 * the sizes of the axes that shard it. */

typedef struct hp_advise_opts {
    int64_t world;              /* N, the ranks in all (>= 1) */
    uint64_t mem_per_rank;      /* the budget of the most-loaded rank; 0: none */
    hp_cost_opts cost;          /* the batch, the mode, the byte and time model, the routing (its mesh, ranks,
                                   weight and layout fields are advise's own and ignored); cost.B 0 (the
                                   default): a row per rank, world rows, the same batch for every candidate */
    hp_plan_opts plan;          /* the planner's options (SP, loss-parallel, overrides; the mesh is advise's) */
    bool prefer_headroom;       /* decode: rank by concurrent sequences that fit (most first; needs mem_per_rank),
                                   then by step time; false: by step time */
    /* Training, when no mesh fits: hp_advise tries smaller micro-batches (powers of two below cost.micro_batch that
     * divide it, when it is above 1) and, on a GPU profile, stronger recompute (selective, then full) before it
     * gives up; what it chose is hp_advice.chosen. A setting the caller fixed (the CLI: given explicitly) is kept. */
    bool fixed_micro_batch, fixed_recompute;
    int64_t max_pp;             /* the most pipeline stages a candidate has (0: any divisor of world; 1: none) */
} hp_advise_opts;

void hp_advise_opts_default(hp_advise_opts *o);

/* Why a mesh was rejected, in the order the rules are tried (HP_ADVISE_OK: accepted). */
typedef enum hp_advise_why {
    HP_ADVISE_OK = 0,
    HP_ADVISE_COMPAT,      /* the planner's hp_plan_check_compat: tp vs heads (and moe_I with EP), S vs 2·cp, ep vs E */
    HP_ADVISE_PLAN,        /* the planner refuses the template that cuts the experts over tp (tp > 1 without EP, or
                              with an ep axis), e.g. a fused gate/up without packed_fused: its reason */
    HP_ADVISE_DP_ROWS,     /* dp (dp x ep on an explicit ep axis) above the batch rows */
    HP_ADVISE_TP_NODE,     /* tp does not fit inside a node (cost.mdl.ranks_per_node) */
    HP_ADVISE_SPLIT,       /* a tensor dim the template's placements cannot split */
    HP_ADVISE_EVAL,        /* the cost model refused it: the runtime refuses the plan, or the batch is past 64 bits */
    HP_ADVISE_MEMORY,      /* the most-loaded rank needs more than mem_per_rank */
    HP_ADVISE_PIPE,        /* the pipeline cannot be cut or scheduled: more chunks than units (layers + embedding +
                              loss), or a schedule the micro-batches do not fit (hp_pp_sched_check) */
    HP_ADVISE_BUBBLE,      /* train: the pipeline's bubble is longer than its stages' own work (it idles more than it
                              computes: more micro-batches or fewer stages) */
} hp_advise_why;

/* One mesh advise considered. Figures are set once the mesh was evaluated (accepted, or HP_ADVISE_MEMORY);
 * else they are 0. Every figure is the worst of ranks 0 and N-1. */
typedef struct hp_advise_cand {
    int64_t dp, cp, tp, ep;     /* ep: 1 when there is no expert parallelism */
    int64_t pp, pp_virtual;     /* pipeline stages (the outermost axis) and virtual stages per stage; 1, 1: none */
    bool ep_axis;               /* ep is its own mesh axis (else TP-extend-EP over dp x tp, or none) */
    bool ok;                    /* accepted; else why and reason say why not */
    hp_advise_why why;
    char mesh[128];             /* "dp=2,cp=1,tp=4 ep=8 (TP-extend)" */
    char reason[512];
    uint64_t max_bytes;         /* the most-loaded rank's total (hp_cost_rank.total_bytes): weights + activations
                                   + training state, or + KV cache in inference (serving keeps the batch's cache) */
    uint64_t weight_bytes, act_bytes, state_bytes; /* of that rank; state: KV cache (infer) or training state */
    uint64_t sent_bytes;        /* bytes per step into collectives of more than one rank (hp_cost_rank.sent_bytes) */
    uint64_t wire_bytes;        /* bytes per step sent over links, ring algorithms (hp_cost_rank.wire_bytes) */
    double t_step, t_compute, t_comm; /* predicted seconds per step (estimates) */
    double t_bubble, t_busy;    /* with pp > 1: of the slowest rank, its bubble and its stage's own seconds */
    const char *binding;        /* evaluated: the largest item of max_bytes (hp_cost_rank_binding), else NULL */
    uint64_t binding_bytes;
    double t_memory;            /* decode: the memory-bandwidth bound of that rank's step */
    uint64_t kv_seq_bytes;      /* decode: one sequence's KV cache on that rank */
    int64_t seqs;               /* decode: concurrent sequences that fit (hp_cost_seqs), -1 without a budget */
    int64_t micro_batch;        /* train, evaluated: rows per replica per micro-batch (hp_cost.micro_batch) */
    int64_t n_micro;            /* train, evaluated: micro-batches per step */
} hp_advise_cand;

typedef struct hp_advice {
    int64_t world;
    uint64_t mem_per_rank;
    int64_t B, S;
    bool train;
    hp_cost_model mdl;          /* the byte and time model the figures use (hardware, recompute, ZeRO) */
    int64_t micro_batch;        /* train: the micro-batch evaluated (hp_cost_default_micro_batch of the options: 1 by
                                   default; 0: one micro-batch of each replica's rows, dp not dividing B) */
    bool relaxed;               /* train: nothing fitted as asked, and advise changed the micro-batch or the
                                   recompute (mdl, micro_batch: what it used) */
    char chosen[640];           /* train: which micro-batch and recompute the figures use, and why */
    bool decode, prefer_headroom;
    int64_t context;            /* decode: the KV cache's positions per sequence */
    int n_cands, n_ok;          /* cands[0..n_ok) accepted, the rest rejected */
    /* Best first: accepted by predicted step time as printed (hp_seconds_as_printed: 3 significant digits;
     * prefer_headroom: by seqs, most first, then so);
     * times that print the same tie, and fewer wire_bytes, then less max_bytes decide. Then the rejected: the evaluated (nearest misses, least max_bytes first), then the
     * rest in enumeration order (tp, then cp, then ep ascending). */
    hp_advise_cand *cands;
    hp_err batch_err;           /* HP_OK, or the first refusal of the batch itself by the cost model */
    double plan_seconds;        /* the template's derivation, with its shard layout */
    double search_seconds;      /* the enumeration and every evaluation */
    struct hp__advise_tmpls *tmpls; /* internal: the template plans, kept for hp_advise_fit (hp_advice_free frees) */
} hp_advice;

/* Every mesh of o->world ranks for m. HP_ERR_INPUT: world < 1 or past HP_MESH_MAX_SIZE^2, or a template plan the
 * planner refuses (its message). A mesh the model, the runtime or the budget cannot take is not an error: it is
 * rejected in the advice, with its reason. */
hp_status hp_advise(hp_advice **out, const hp_model *m, const hp_advise_opts *o, hp_err *err);
/* HP_OK when some mesh was accepted; else HP_ERR_INPUT with the cause into err: the batch's refusal when no mesh
 * got figures because of it, or "no mesh of N ranks fits in SIZE per rank (all K rejected; the nearest: ...)". */
hp_status hp_advice_verdict(const hp_advice *a, hp_err *err);
/* When nothing in a fits: the binding constraint of the nearest miss and the nearest change of o under which some
 * mesh fits (the same kinds as hp_cost_fit, and more ranks: 2N, 4N), each found by running hp_advise again.
 * f->n is 0 when a has an accepted mesh or no change was found. */
hp_status hp_advise_fit(hp_fit *f, const hp_model *m, const hp_advise_opts *o, const hp_advice *a, hp_err *err);
void hp_advice_free(hp_advice *a);

#ifdef __cplusplus
}
#endif
/* ---- whether a run fits this node (memfit.c) ---- */

/* The memory this machine can still give (MemAvailable of /proc/meminfo) in bytes; 0 where unknown. */
uint64_t hp_mem_available(void);
/* Refuses (HP_ERR_INPUT, naming what, the bytes and remedy) a run whose ranks on this node would need more than
 * hp_mem_available(): need bytes per rank times ranks. need is a double, so that the callers' sums of byte counts
 * cannot wrap: from 2^64 on it is named "more than 16 EiB". HP_OK where unknown (or need is NaN). */
hp_status hp_memory_fits(const char *what, double need, int ranks, const char *remedy, hp_err *err);
/* Refuses (through hp_memory_fits) a forward of [B, S] this node cannot hold, before any of it is allocated: each
 * rank's weights (unless weights_held: loaded already, so no longer available) and workspace as `hyperpar cost`
 * counts them (exact for the logits-free forward; train: cost's figure with the training state when larger; rank 0:
 * root_extra more, such as the gathered logits), the largest rank's times local_ranks, against MemAvailable. A lower
 * bound of what the run holds, so a run that fits is never refused. Collective over w; the verdict is agreed. */
struct hp_comm;
hp_status hp_cost_forward_fits(const struct hp_comm *w, const hp_model *m, const hp_plan *p, int64_t B, int64_t S,
                               bool train, bool weights_held, double root_extra, int local_ranks, const char *what,
                               const char *remedy, hp_err *err);

#endif
