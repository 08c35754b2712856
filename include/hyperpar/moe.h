/*
 * hyperpar/moe.h — the MoE layer runtime: routers of every archetype, capacity factor, expert-major
 * dispatch, grouped-GEMM experts (SwiGLU or gpt-oss's clamped variant), weighted combine, shared experts.
 *
 * One sparse layer runs as a pipeline of stages. Each stage is a public function so that the MPI runtime
 * can put the all-to-all exchanges between them without changing any of them:
 *
 *   x [T, H] ──route──▶ topk_idx [T, K], topk_w [T, K]      (per row sorted by expert id ascending)
 *            ──capacity (optional)──▶ keep [T*K]
 *            ──dispatch_prepare──▶ counts [n_local], row_slot [N], slot_row [T*K]   (expert-major, stable)
 *            ──gather──▶ rows [N, H] ──experts_forward──▶ out [N, H]
 *            ──combine──▶ y [T, H] = Σ_k w[t,k]·out[row(t,k)]   (k ascending, f32)
 *            ──shared_forward──▶ y += (σ(x·w_sg)) · shared(x)
 *
 * hp_moe_forward composes the stages for one process. All scratch memory lives in an hp_moe_ws created
 * for a maximum token count; no stage allocates. Expert weights are held in one canonical layout whatever
 * the checkpoint stores, in the checkpoint's own dtype when it is bf16 (else f32; see hp_moe_layer), and every
 * expert and shared-expert product runs through the GEMM layer (hyperpar/linalg.h); routing is computed in f64
 * (the golden reference sums in f64, and top-k must not depend on how many rows a call has).
 * Semantics: spec/hyper_parallel.md §10.2–§10.10, spec/hf_reference.md §3, golden/README.md.
 */
#ifndef HYPERPAR_MOE_H
#define HYPERPAR_MOE_H

#include "hyperpar/core.h"
#include "hyperpar/comm.h"
#include "hyperpar/linalg.h"
#include "hyperpar/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- archetypes (spec §10.2): which router, which shared expert, which activation ---- */

typedef enum hp_moe_archetype {
    HP_MOE_ROUTED_ONLY_SOFTMAX_TOPK = 0, /* softmax top-k, renormalised unless norm_topk_prob is false */
    HP_MOE_MIXTRAL_TOPK_ROUTER,          /* softmax top-k, always renormalised */
    HP_MOE_QWEN2MOE_SHARED_EXPERT_GATE,  /* softmax top-k (+norm_topk_prob), σ-gated shared expert */
    HP_MOE_DEEPSEEKV3_SIGMOID_GROUP_SHARED, /* sigmoid, group-limited, routed scaling, shared experts */
    HP_MOE_QWEN3MOE_TOPK_ROUTER,         /* softmax top-k (+norm_topk_prob), no shared expert */
    HP_MOE_GPTOSS_TOPK_ROUTER,           /* router bias, top-k on logits, softmax over k, clamped GLU */
    HP_MOE_ARCHETYPE_COUNT
} hp_moe_archetype;

typedef enum hp_moe_router_kind {
    HP_MOE_ROUTER_SOFTMAX_TOPK = 0, /* p = softmax(x·Wᵀ); top-k of p; optional renormalisation */
    HP_MOE_ROUTER_SIGMOID_GROUP,    /* DeepSeek-V3 / GLM4-MoE */
    HP_MOE_ROUTER_TOPK_SOFTMAX,     /* gpt-oss: top-k of x·Wᵀ + b, softmax over the k */
} hp_moe_router_kind;

typedef enum hp_moe_shared_kind {
    HP_MOE_SHARED_NONE = 0,
    HP_MOE_SHARED_GATED, /* Qwen2-MoE: shared_expert + shared_expert_gate [1, H] */
    HP_MOE_SHARED_PLAIN, /* DeepSeek-V3 / GLM4-MoE: shared_experts, added as is */
} hp_moe_shared_kind;

typedef enum hp_moe_act {
    HP_MOE_ACT_SWIGLU = 0, /* silu(g) ⊙ u */
    HP_MOE_ACT_GPTOSS,     /* g'=min(g,lim), u'=clamp(u,±lim), (u'+1) ⊙ g'·σ(1.702·g') */
} hp_moe_act;

const char *hp_moe_archetype_name(hp_moe_archetype a); /* "qwen3moe_topk_router" */
bool hp_moe_archetype_parse(const char *name, hp_moe_archetype *out);
const char *hp_moe_archetype_list(void); /* comma-separated names, for messages */
hp_moe_router_kind hp_moe_archetype_router(hp_moe_archetype a);
hp_moe_shared_kind hp_moe_archetype_shared(hp_moe_archetype a);
hp_moe_act hp_moe_archetype_act(hp_moe_archetype a);

/* ---- one sparse layer, loaded ---- */

typedef struct hp_moe_layer {
    hp_moe_archetype archetype;
    hp_moe_router_kind router;
    hp_moe_shared_kind shared;
    hp_moe_act act;
    int64_t layer;          /* decoder layer index L (-1 for a layer built in memory) */
    int64_t n_hidden;       /* H */
    int64_t n_experts;      /* E, routed experts of the whole layer */
    int64_t top_k;          /* K */
    int64_t d_expert;       /* I, width of one routed expert */
    int64_t d_shared;       /* sI, width of the shared expert (0: none) */
    int64_t first_expert;   /* this layer object holds experts [first_expert, first_expert + n_local) */
    int64_t n_local;
    /* Router settings (from config.json, defaults per transformers). */
    bool norm_topk_prob;        /* renormalise the k weights */
    double routed_scaling_factor; /* sigmoid router: weights × this */
    int64_t n_group, topk_group;  /* sigmoid router: group-limited selection (1, 1: off) */
    float swiglu_limit;           /* gpt-oss clamp (7.0) */
    float swiglu_alpha;           /* gpt-oss σ slope (1.702, hard-coded in transformers) */
    /* Router: widened to f64 so that selection matches the f64 reference exactly. */
    double *w_router;      /* [n_experts, n_hidden] */
    double *b_router;      /* [n_experts] or NULL (gpt-oss router.bias) */
    double *b_correction;  /* [n_experts] or NULL (gate.e_score_correction_bias, selection only) */
    /* Local routed experts, canonical layout: row j < I of gate_up is gate row j, row I + j is up row j.
     * The elements are w_dtype: HP_DT_BF16 (uint16_t, the checkpoint's bytes) or HP_DT_F32 (float). */
    hp_dtype w_dtype;
    const void *w_gate_up;  /* [n_local, 2*d_expert, n_hidden] */
    const float *b_gate_up; /* [n_local, 2*d_expert] or NULL (gpt-oss) */
    const void *w_down;     /* [n_local, n_hidden, d_expert] */
    const float *b_down;    /* [n_local, n_hidden] or NULL (gpt-oss) */
    /* Shared expert(s), same canonical layout. */
    float *ws_gate_up;      /* [2*d_shared, n_hidden] or NULL */
    float *ws_down;         /* [n_hidden, d_shared] or NULL */
    float *ws_gate;         /* [n_hidden] or NULL (Qwen2-MoE shared_expert_gate) */
    /* The columns [shared_lo, shared_lo + shared_n) of the shared expert's width that ws_gate_up / ws_down
     * hold; the rest are zeros until hp_moe_layer_gather_shared (hp_moe_load_opts.shared_tp_slice). Whole:
     * [0, d_shared). */
    int64_t shared_lo, shared_n;
    /* Where the weights came from, for messages and statistics. */
    char prefix[96];        /* "model.layers.1.mlp." */
    const char *storage;    /* "per-expert", "batched", "batched gpt-oss", "memory" */
    hp_dtype dtype;         /* storage dtype of the expert weights in the checkpoint */
    bool zero_copy;         /* expert weights point into the checkpoint mapping (f32 or bf16, aligned) */
    hp_linalg_mode compute; /* GEMM numerics of workspaces created for this layer (default exact) */
    void *owned;            /* internal: allocations to free */
} hp_moe_layer;

typedef struct hp_moe_load_opts {
    int archetype;          /* an hp_moe_archetype, or -1: the family's suggested archetype */
    int64_t first_expert;   /* local expert range; n_local 0 means all experts */
    int64_t n_local;
    bool no_zero_copy;      /* always copy, even when the mapping could be used directly */
    bool widen_f32;         /* hold bf16 expert weights widened to f32 (2x the memory; off by default) */
    hp_linalg_mode compute; /* the layer's GEMM numerics (HP_LINALG_EXACT by default) */
    /* Tensor-parallel cut (the plan's experts over tp: gate/up column-parallel, down row-parallel): with
     * tp_size > 1 the layer holds block tp_rank of tp_size of the width of every local routed expert, columns
     * [r·I/n, (r+1)·I/n) as hyperpar shard cuts them, and likewise of the shared expert's width, so d_expert
     * and d_shared are the local widths and every output of the layer is a partial sum over the tp group (the
     * caller reduces it). gpt-oss's interleaved gate/up columns are cut as the layout cuts 2I (a cut that splits
     * a gate/up pair is refused), and its down_proj_bias is held by tp rank 0 only (zeros elsewhere), so the
     * reduction adds it once. The router, its biases and Qwen2-MoE's shared_expert_gate stay whole. Read from a
     * checkpoint, or from a shard folder whose rank file holds exactly that cut (the same plan). 0: whole. */
    int64_t tp_size, tp_rank;
    /* Shard folder, whole experts (tp_size 0): the rank file may hold the shared expert as a slice of its
     * width, as hyperpar shard cuts it over tp for TP-extend-EP (gate/up S(0), down S(1), one contiguous block
     * for all three). The load then reads the held columns into whole zeroed buffers (d_shared the whole
     * width, shared_lo / shared_n the held block) and the caller must call hp_moe_layer_gather_shared over the
     * ranks that hold the other blocks before the layer runs. Off: a sliced shared expert is refused. */
    bool shared_tp_slice;
} hp_moe_load_opts;

void hp_moe_load_opts_default(hp_moe_load_opts *o);

/* Loads sparse layer `layer` of a checkpoint model. Reads only the local experts' bytes; bf16 expert weights
 * stay bf16 (unless opts->widen_f32), f16 / f64 are widened to f32. When the checkpoint stores f32 or bf16 in
 * the canonical batched layout the expert weights point into the mapping (the model must then stay open until hp_moe_layer_free). Errors (HP_ERR_INPUT): a meta
 * model, a layer out of range or dense, a tensor the archetype needs that is missing (the message lists
 * what the layer has), shapes that disagree with config.json, an unsupported dtype. */
hp_status hp_moe_layer_load(hp_moe_layer **out, const hp_model *m, int64_t layer, const hp_moe_load_opts *opts,
                            hp_err *err);

/* Loads sparse layer `layer` from rank `rank`'s file of a shard folder written by `hyperpar shard`
 * (docs/shard-format.md, docs/moe.md): dir/rank-XXXXX.safetensors through dir/manifest.json, the
 * hyperparameters from dir/config.json (cfg: that file opened by hp_moe_shard_config_open, or NULL to open it
 * here). The router and shared expert must be whole in the rank file; the experts come from the stacked
 * per-expert tensors (<block>.experts.gate_proj [n_local, I, H]) or the batched tensors cut on dim 0, and the
 * experts the file holds must be exactly opts' range [first_expert, first_expert + n_local) (n_local 0: all).
 * Reads straight from the mapped rank file, widening bf16 / f16 as hp_moe_layer_load does; the weights are
 * bitwise those hp_moe_layer_load gives for the same range of the source checkpoint. Errors (HP_ERR_INPUT)
 * besides hp_moe_layer_load's: a missing or foreign manifest, config.json or rank file; a TP-sliced router or
 * shared expert (the message names the tensor and its slice); an expert range other than the one needed
 * (both ranges named). */
hp_status hp_moe_layer_load_shard(hp_moe_layer **out, const char *dir, const hp_model *cfg, int64_t rank,
                                  int64_t layer, const hp_moe_load_opts *opts, hp_err *err);
/* Completes a shared expert loaded as a slice (hp_moe_load_opts.shared_tp_slice) over group c: the ranks
 * exchange their held blocks [shared_lo, shared_lo + shared_n), every column goes to the lowest rank holding
 * it, and a sum over c leaves every rank the whole shared expert, bitwise the checkpoint's (a column plus
 * zeros). A collective: every rank of c calls it for the same layer, after agreeing that its load succeeded.
 * A width that no rank of c holds is HP_ERR_INPUT on every rank, naming the columns (the folder was cut for
 * another mesh). Layers without a shared expert, or already whole on every rank, return HP_OK at the cost of
 * one small all-gather. */
hp_status hp_moe_layer_gather_shared(hp_moe_layer *l, const hp_comm *c, hp_err *err);
/* dir/config.json of a shard folder as a config-only (meta) model; a clear error when it is missing. */
hp_status hp_moe_shard_config_open(hp_model **out, const char *dir, hp_err *err);

/* A 64-bit digest of what every rank of an EP group running layer l must hold identically: the layer's
 * settings, its replicated weights as loaded (router, biases, shared expert), and the source's identity —
 * for a checkpoint m (shard_dir NULL) its tensor table and the layer's routed-expert bytes (all of them up to
 * 64 MiB, else 64 bytes at the start of every expert), for a shard folder its manifest.json. Ranks compare it
 * before any exchange (hyperpar moe under mpirun) so that ranks started on different checkpoints are
 * refused. Cost: the replicated weights plus at most 64 MiB read; see src/moe/identity.c. */
hp_status hp_moe_layer_identity(const hp_moe_layer *l, const hp_model *m, const char *shard_dir, uint64_t *out,
                                hp_err *err);

/* Dimensions of a layer built in memory (benchmarks, tests). */
typedef struct hp_moe_dims {
    int64_t n_hidden, n_experts, top_k, d_expert, d_shared;
    int64_t first_expert, n_local; /* n_local 0: all */
    int64_t n_group, topk_group;   /* 0 → 1 */
    double routed_scaling_factor;  /* 0 → 1 */
    bool norm_topk_prob;
    bool bf16_weights;             /* expert weights held as bf16 (uint16_t) instead of f32 */
} hp_moe_dims;

/* Allocates a layer with zeroed weights (f32, or bf16 expert weights with dims->bf16_weights; the biases and
 * shared tensors the archetype needs) for the caller to fill through the (cast away const) weight pointers
 * before it creates a workspace (a workspace may pack the weights). */
hp_status hp_moe_layer_create(hp_moe_layer **out, hp_moe_archetype a, const hp_moe_dims *dims, hp_err *err);
void hp_moe_layer_free(hp_moe_layer *l);

/* Bytes of local routed-expert weights the layer holds (resident, in w_dtype). */
uint64_t hp_moe_layer_expert_bytes(const hp_moe_layer *l);
/* Bytes of every weight array the layer holds, each in its resident dtype: the router and its biases (f64), the
 * local routed experts (w_dtype, whether owned or mapped) and their biases (f32), and the shared expert and its
 * gate (f32) at the width the layer holds (the whole width while a sliced shared expert awaits
 * hp_moe_layer_gather_shared). */
uint64_t hp_moe_layer_resident_bytes(const hp_moe_layer *l);

/* ---- workspace and run options ---- */

typedef enum hp_moe_cap_policy {
    HP_MOE_CAP_SCORE = 0, /* an over-capacity expert keeps its heaviest slots (ties: lower slot first) */
    HP_MOE_CAP_FIRST,     /* it keeps its first slots in token order */
} hp_moe_cap_policy;

bool hp_moe_cap_policy_parse(const char *s, hp_moe_cap_policy *out);

typedef struct hp_moe_run_opts {
    double capacity_factor;    /* <= 0: off */
    hp_moe_cap_policy policy;
    bool balanced_router;      /* §10.4: replace the indices so every expert gets T*K/E slots (bench only) */
    int64_t row_base;          /* index of this call's first token in error messages (a rank's block: its
                                  first row in the whole input); 0 by default */
    bool caller_checks_finite; /* skip the finiteness checks of x, the expert rows and y: the caller scans what
                                  it gets (the decoder's runner names the first non-finite boundary itself) */
    const int32_t *cap_block;  /* [T] or NULL: the capacity limit applies within each block of rows separately
                                  (row t in block cap_block[t] >= 0, each block's rows in their order), as the ranks
                                  of a distributed run each apply it to their own rows (validate's reference) */
} hp_moe_run_opts;

typedef struct hp_moe_stats {
    int64_t n_tokens;          /* T of the last forward */
    int64_t n_slots;           /* T*K */
    int64_t n_dropped;         /* slots dropped by the capacity limit */
    int64_t capacity;          /* per-expert capacity (0: off) */
    int64_t n_rows;            /* rows computed by the local experts */
    int64_t n_active;          /* local experts that received at least one row */
} hp_moe_stats;

/* Scratch for one layer and at most max_tokens tokens per call. Every array is owned. An EP runtime's workspace
 * has no rows (the runtime holds its own), and one bounded by dispatch chunks (hp_moe_ep_create_bounded) holds
 * the experts' activations and the shared expert's scratch for one chunk of row_tokens tokens. */
typedef struct hp_moe_ws {
    int64_t max_tokens;        /* Tmax */
    int64_t row_tokens;        /* Tr: tokens the per-row scratch holds (Tmax unless bounded) */
    int64_t n_hidden, n_experts, top_k, n_local, d_expert, d_shared;
    double *x64;               /* [Tmax, H]  input widened for the router */
    double *logits;            /* [Tmax, E]  router logits, then scores */
    double *sel;               /* [2*E]      one row's selection scores, then its group scores */
    int32_t *topk_idx;         /* [Tmax, K]  routing result of the last forward */
    float *topk_w;             /* [Tmax, K] */
    uint8_t *keep;             /* [Tmax*K]   capacity mask */
    int32_t *cap_scratch;      /* [hp_moe_capacity_scratch_count(Tmax, K, E)] */
    int64_t *counts;           /* [n_local]  rows per local expert of the last forward */
    int64_t *offsets;          /* [n_local + 1] prefix sums of counts */
    int32_t *row_slot;         /* [Tmax*K]   flat slot t*K+k of each dispatched row */
    int32_t *slot_row;         /* [Tmax*K]   dispatched row of each slot, -1 when not dispatched */
    float *rows;               /* [Tmax*K, H] gathered inputs, overwritten by the expert outputs (NULL in an EP
                                  runtime's workspace) */
    int64_t act_rows;          /* Tr*K: rows one grouped expert pass holds */
    float *act;                /* [act_rows, 2*I] gate/up of a pass's rows */
    float *shared_act;         /* [Tr, 2*sI] or NULL (the shared expert runs in pieces of at most Tr rows) */
    float *shared_out;         /* [Tr, H] or NULL */
    float *shared_g;           /* [Tr] shared-expert gate logits, or NULL */
    /* The GEMM layer: one context per workspace (one thread at a time uses a workspace), the experts as
     * stacked linears, the shared expert and its gate as single ones; groups [n_local] for grouped calls. */
    hp_linalg *la;
    hp_linear *lin_gate_up, *lin_down, *lin_sh_gate_up, *lin_sh_down, *lin_sh_gate;
    hp_linear_group *groups;   /* [n_local] */
    int64_t *pass_row0;        /* [n_local] first row (in rows) of each group of a pass */
    hp_moe_stats stats;
    size_t bytes;              /* the bytes of the arrays above (the GEMM layer's objects not included) */
    /* What the backward needs of the last forward: how many tokens it routed, whether it applied the capacity
     * mask in keep, and whether the balanced router replaced the indices (the backward then refuses). */
    int64_t fwd_tokens;        /* -1 before any forward */
    bool fwd_keep, fwd_balanced;
    struct hp__moe_bwd *bwd;   /* internal: the backward's scratch, allocated by the first backward */
    /* internal: the workspace whose arrays (and GEMM context) this one borrows (hp_moe_ep_create_shared), or
     * NULL when it owns them; on an owner, which workspace's forward its arrays hold now. */
    struct hp_moe_ws *share;
    const struct hp_moe_ws *last_fwd;
} hp_moe_ws;

hp_status hp_moe_ws_create(hp_moe_ws **out, const hp_moe_layer *l, int64_t max_tokens, hp_err *err);
void hp_moe_ws_destroy(hp_moe_ws *ws);

/* ---- stages ---- */

/* Fails with the row and column of the first NaN or Inf in x [T, H] (name labels the tensor). */
hp_status hp_moe_check_finite(const float *x, int64_t n_tokens, int64_t n_hidden, const char *name, hp_err *err);

/* Router of the layer's kind: topk_idx [T, K] and topk_w [T, K], each row sorted by expert id ascending.
 * Ties in every top-k: the lower index first. T <= ws->max_tokens. */
hp_status hp_moe_route(const hp_moe_layer *l, hp_moe_ws *ws, const float *x, int64_t n_tokens,
                       int32_t *topk_idx, float *topk_w, hp_err *err);

/* §10.4 balanced router: slot s = t*K + k goes to expert (s mod Q)·L + ((s div Q) mod L), Q = E / L,
 * keeping the weights of the real router; rows are re-sorted by expert id. E % L != 0: HP_ERR_INPUT. */
hp_status hp_moe_route_balance(int32_t *topk_idx, float *topk_w, int64_t n_tokens, int64_t top_k,
                               int64_t n_experts, int64_t n_local, hp_err *err);

/* Int32 elements of scratch hp_moe_capacity needs (INT64_MAX when that count passes 64 bits). */
int64_t hp_moe_capacity_scratch_count(int64_t n_tokens, int64_t top_k, int64_t n_experts);

/* Capacity limit (§10.10, golden README): capacity = ceil(factor·T·K / E); an expert routed more slots keeps
 * `capacity` of them by policy. keep [T*K] gets 1/0; *dropped the number of dropped slots; *capacity_out
 * (may be NULL) the capacity. factor <= 0 keeps everything. topk_w may be NULL (then policy first). */
hp_status hp_moe_capacity(const int32_t *topk_idx, const float *topk_w, int64_t n_tokens, int64_t top_k,
                          int64_t n_experts, double factor, hp_moe_cap_policy policy, uint8_t *keep,
                          int32_t *scratch, int64_t *dropped, int64_t *capacity_out, hp_err *err);

/* Expert-major permutation of the kept slots whose expert lies in [first, first + n_local): counts
 * [n_local], offsets [n_local + 1], row_slot [N] (flat slot of each row; ties in slot order: stable),
 * slot_row [T*K] (row of each slot or -1). keep may be NULL. Returns N. */
int64_t hp_moe_dispatch_prepare(const int32_t *topk_idx, const uint8_t *keep, int64_t n_tokens, int64_t top_k,
                                int64_t first, int64_t n_local, int64_t *counts, int64_t *offsets,
                                int32_t *row_slot, int32_t *slot_row);

/* rows[i] = x[row_slot[i] / K] for i < n_rows; x [T, H], rows [n_rows, H]. */
void hp_moe_gather(const float *x, int64_t n_hidden, int64_t top_k, const int32_t *row_slot, int64_t n_rows,
                   float *rows);

/* Local experts on expert-major rows [N, H] with counts [n_local]: per non-empty expert one sgemm for
 * gate/up ([c,H]·[2I,H]ᵀ), the activation, one sgemm for down ([c,I]·[H,I]ᵀ), in chunks of at most
 * ws->max_tokens rows. out [N, H] may be rows itself. */
hp_status hp_moe_experts_forward(const hp_moe_layer *l, hp_moe_ws *ws, const float *rows, const int64_t *counts,
                                 float *out, hp_err *err);

/* y[t] = Σ_{k ascending} topk_w[t,k] · out[slot_row[t*K+k]] (slots with row -1 contribute nothing). */
void hp_moe_combine(const float *out, const int32_t *slot_row, const float *topk_w, int64_t n_tokens,
                    int64_t top_k, int64_t n_hidden, float *y);

/* y [T, H] += shared part of the archetype (nothing for routed-only archetypes). */
hp_status hp_moe_shared_forward(const hp_moe_layer *l, hp_moe_ws *ws, const float *x, int64_t n_tokens,
                                float *y, hp_err *err);

/* The one-process layer: checks x (width n_hidden must equal H, values finite), routes, applies the
 * capacity limit, dispatches, runs the experts, combines, adds the shared part. Needs every expert local
 * (first_expert 0, n_local E). topk_idx / topk_w of the call stay in ws; statistics in ws->stats.
 * opts may be NULL. A non-finite value in y is never returned as a result: HP_ERR_INPUT names the first bad
 * row and its likely cause (non-finite routing weights, e.g. from routed_scaling_factor; a non-finite expert
 * or shared-expert weight, named by expert, row and column; else the input's magnitude overflowing f32). */
hp_status hp_moe_forward(const hp_moe_layer *l, hp_moe_ws *ws, const float *x, int64_t n_tokens,
                         int64_t n_hidden, float *y, const hp_moe_run_opts *opts, hp_err *err);

/* ---- backward (issue 22, spec/training.md) ----
 *
 * The gradient of one sparse layer for the routing of its last forward (topk_idx, topk_w, keep stay as the
 * forward chose them: the selection and the capacity mask are constants of the step). With dy = ∂L/∂y:
 *
 *   routed   y[t] = Σ_k w[t,k]·E_{e(t,k)}(x[t]) over kept slots:
 *              dOut row (t,k) = w[t,k]·dy[t]            → the expert's backward → dW, db, d(row)
 *              dx[t] += d(row (t,k))                   dw[t,k] = dy[t]·E_{e(t,k)}(x[t])
 *   router   dw → d logits per router kind (see src/moe/backward.c), logits = x·W_rᵀ (+ b_r):
 *              dW_r += dlogitsᵀ·x,  db_r += Σ_t dlogits,  dx += dlogits·W_r
 *   shared   y[t] += g_t·S(x[t]), g_t = σ(x[t]·w_sg) (Qwen2-MoE) or 1: the SwiGLU MLP's backward with
 *              dS = g_t·dy[t], and dg_t = dy[t]·S(x[t]) → d w_sg += dg_t·g_t(1−g_t)·x[t], dx += … ·w_sg
 *
 * Under the tensor-parallel cut (hp_moe_load_opts.tp_size > 1) every output of the forward is a partial sum
 * over the tp group, and so is the backward's: dx, d_w_router, d_b_router and d_ws_gate are this rank's
 * partials (the caller sums them over the tp group, as it sums y), the expert and shared-expert weight
 * gradients are of this rank's columns; d_b_down is the whole gradient on every rank (it is Σ dOut), to be
 * applied on the rank that holds the bias. */

/* f32 gradient buffers of one layer object's parameters at its local shapes, in its canonical layout. Every
 * buffer accumulates (+=), so that micro-batches add up; hp_moe_grads_zero clears them. */
typedef struct hp_moe_grads {
    int64_t n_hidden, n_experts, n_local, d_expert, d_shared;
    float *d_gate_up;   /* [n_local, 2*d_expert, n_hidden] */
    float *d_down;      /* [n_local, n_hidden, d_expert] */
    float *d_b_gate_up; /* [n_local, 2*d_expert] or NULL (gpt-oss biases) */
    float *d_b_down;    /* [n_local, n_hidden] or NULL */
    float *d_w_router;  /* [n_experts, n_hidden] */
    float *d_b_router;  /* [n_experts] or NULL (gpt-oss router.bias) */
    float *d_ws_gate_up; /* [2*d_shared, n_hidden] or NULL */
    float *d_ws_down;   /* [n_hidden, d_shared] or NULL */
    float *d_ws_gate;   /* [n_hidden] or NULL (Qwen2-MoE shared_expert_gate) */
} hp_moe_grads;

/* Zeroed gradient buffers for the parameters layer l holds (a buffer for every non-NULL parameter). */
hp_status hp_moe_grads_create(hp_moe_grads **out, const hp_moe_layer *l, hp_err *err);
void hp_moe_grads_zero(hp_moe_grads *g);
void hp_moe_grads_free(hp_moe_grads *g);

/* The backward of the last hp_moe_forward(l, ws, x, T, …) on the same x: dy [T, H] the gradient of its y;
 * dx [T, H] receives (=) the gradient of x; g accumulates the parameter gradients. Recomputes the router's
 * logits and the experts' activations from x (nothing but the routing is kept from the forward). Its scratch
 * is allocated by the first call on ws and kept. Errors (HP_ERR_INPUT): no forward on ws, or one of another
 * token count, or one with the balanced router (its indices are not the router's); g of another shape. */
hp_status hp_moe_backward(const hp_moe_layer *l, hp_moe_ws *ws, const float *x, int64_t n_tokens, const float *dy,
                          float *dx, hp_moe_grads *g, hp_err *err);

/* ---- export: canonical arrays back to the checkpoint's names and layouts (issue 22) ---- */

/* Receives one tensor of hp_moe_layer_export: name the full FQN ("model.layers.1.mlp.experts.0.gate_proj.weight"),
 * data [shape] f32 row-major, valid only during the call. A non-zero return stops the export and is returned. */
typedef hp_status (*hp_moe_tensor_fn)(void *ctx, const char *name, const float *data, const int64_t *shape,
                                      int n_dims, hp_err *err);

/* The inverse of the loader's layout mapping: calls fn once per trainable checkpoint tensor of layer l's block,
 * with that tensor's part of `whole` at the checkpoint's own name and shape, so that gradients (or updated
 * parameters) are written as transformers stores them. Every tensor under l->prefix in m is emitted except
 * gate.e_score_correction_bias (no gradient, not an optimizer parameter), in this order: router weight
 * ("gate" or "router", [E, H]) and gpt-oss's router bias [E]; the experts, per expert e ascending
 * <e>.{gate_proj, up_proj, down_proj} (Mixtral w1, w3, w2) [I, H], [I, H], [H, I], or batched
 * experts.gate_up_proj [E, 2I, H] and experts.down_proj [E, H, I], or gpt-oss's experts.gate_up_proj [E, H, 2I]
 * (even columns gate, odd up), gate_up_proj_bias [E, 2I] (interleaved likewise), down_proj [E, I, H],
 * down_proj_bias [E, H]; then the shared expert's gate_proj, up_proj [sI, H], down_proj [H, sI] and Qwen2-MoE's
 * shared_expert_gate.weight at its stored shape ([1, H]).
 *
 * whole holds the WHOLE layer in the canonical layout of hp_moe_grads: n_local == n_experts == l->n_experts (the
 * caller gathers EP ranks first), d_expert the full width I and d_shared the full sI (the caller gathers tp
 * blocks first), n_hidden == l->n_hidden. l is any rank's layer object of that layer, used only for its
 * archetype (which arrays must be present), prefix and E, H: its own n_local, d_expert and d_shared may be
 * those of a slice. m (a checkpoint or a meta model) decides the names (per-expert vs batched, w1 vs gate_proj,
 * gate vs router) and every emitted shape is checked against m's parameter of that name. Only gpt-oss's
 * interleaved tensors are copied (one scratch buffer of the largest, freed before returning); the rest are
 * passed as pointers into whole. Errors (HP_ERR_INPUT): whole of another shape than l and m say, an array
 * the archetype needs that is NULL, a name m lacks or holds at another shape, a tensor of the block that the
 * export does not know (named). */
hp_status hp_moe_layer_export(const hp_moe_layer *l, const hp_model *m, const hp_moe_grads *whole,
                              hp_moe_tensor_fn fn, void *ctx, hp_err *err);

/* ---- expert parallelism over a communicator (spec §10.5-§10.11) ----
 *
 * Each rank of an EP group of P ranks holds experts [r·E/P, (r+1)·E/P) and its own tokens. A forward:
 *
 *   route local tokens ─▶ capacity (own slots) ─▶ expert-major order = grouped by destination rank
 *   ─▶ alltoall per-expert counts ─▶ alltoallv rows ─▶ local experts (expert-major over all sources)
 *   ─▶ alltoallv back ─▶ weighted combine in token order ─▶ + shared expert
 *
 * With overlap the row exchange is non-blocking and the shared expert runs while it is in flight; the
 * numbers are identical either way. All buffers are sized at creation for max_tokens local tokens (the
 * receive side for the worst case, every peer routing every slot here): a forward allocates nothing.
 *
 * Dispatch chunks (hp_moe_ep_forward_chunks, C > 1): routing and capacity run once over all local tokens,
 * then the tokens cross the exchange in C contiguous chunks, chunk c+1's rows in flight (on a second
 * communicator) while chunk c's experts compute. Each row's expert result does not depend on C except
 * through the BLAS call it is computed in (see docs/moe.md for how close the outputs are).
 */
typedef struct hp_moe_ep hp_moe_ep;

typedef struct hp_moe_ep_stats {
    int64_t n_tokens, n_slots, n_dropped;
    int64_t rows_sent, rows_recv;      /* rows of the forward exchange (the return moves the same) */
    int64_t bytes_exchanged;           /* bytes this rank sent in both exchanges */
    double t_route, t_dispatch, t_experts, t_return, t_combine, t_shared, t_wait; /* seconds */
} hp_moe_ep_stats;

/* l holds the rank's experts (first_expert = rank·L, n_local = L = E / size of comm); comm is the EP group,
 * borrowed. Collective over comm. */
hp_status hp_moe_ep_create(hp_moe_ep **out, const hp_moe_layer *l, hp_comm *comm, int64_t max_tokens, hp_err *err);
void hp_moe_ep_destroy(hp_moe_ep *ep);
/* Collective over the EP group. x [T, H] are this rank's tokens (T may differ between ranks and may be 0);
 * y [T, H]; topk_idx / topk_w of the call are in hp_moe_ep_ws(ep). */
hp_status hp_moe_ep_forward(hp_moe_ep *ep, const float *x, int64_t n_tokens, float *y, const hp_moe_run_opts *opts,
                            bool overlap, hp_err *err);

/* hp_moe_ep_create that also readies forwards of up to max_chunks dispatch chunks (max_chunks <= 1: exactly
 * hp_moe_ep_create). Chunk buffers hold ceil((max_tokens + 1) / 2) tokens per stage, so every peer may hold
 * up to max_tokens + 1 local tokens (more is refused by the forward, on every rank). With max_chunks > 1 it
 * is a collective over comm: every rank must call it; the ranks agree on the local checks before splitting
 * off the second communicator, so one rank's failure fails them all. */
hp_status hp_moe_ep_create_chunked(hp_moe_ep **out, const hp_moe_layer *l, hp_comm *comm, int64_t max_tokens,
                                   int max_chunks, hp_err *err);
/* hp_moe_ep_create_chunked whose buffers hold one dispatch chunk instead of all max_tokens tokens (long prefill):
 * the exchange two stages of Th = ceil(max_tokens / chunks) tokens (send [2·Th·K, H], receive [2·P·Th·K, H]),
 * the experts' rows one chunk ([P·Th·K, H]), their activations and the shared expert's scratch Th·K and Th rows;
 * the workspace keeps no one-process rows. What still holds every token: the routing (x widened to f64
 * [max_tokens, H], the logits [max_tokens, E], the slot arrays), and, with a shared expert, its output under
 * overlap [max_tokens, H]. Forwards through hp_moe_ep_forward_chunks with at least `chunks` chunks (fewer
 * would not fit: refused on every rank, as for a peer's too large chunks); a plain forward or a backward of more
 * than 2·Th tokens is refused (HP_ERR_INPUT). chunks <= 1: hp_moe_ep_create. A collective over comm when
 * chunks > 1, as hp_moe_ep_create_chunked. */
hp_status hp_moe_ep_create_bounded(hp_moe_ep **out, const hp_moe_layer *l, hp_comm *comm, int64_t max_tokens,
                                   int chunks, hp_err *err);
/* hp_moe_ep_forward in `chunks` dispatch chunks (chunks <= 1: exactly hp_moe_ep_forward). Every rank of the
 * group must pass the same chunks (checked: HP_ERR_INPUT on every rank otherwise), at most the max_chunks of
 * creation (a bounded runtime: at least its chunks); a rank's chunk boundaries come from its own token count,
 * and a rank with an empty chunk still takes part in its exchanges. Statistics sum over the chunks. */
hp_status hp_moe_ep_forward_chunks(hp_moe_ep *ep, const float *x, int64_t n_tokens, float *y,
                                   const hp_moe_run_opts *opts, bool overlap, int chunks, hp_err *err);
/* The backward of the last hp_moe_ep_forward (or _chunks) on the same x, collective over the EP group (every
 * rank calls it; T may differ and be 0). dy [T, H]: the gradient of this rank's y; dx [T, H] receives (=) the
 * gradient of this rank's x; g accumulates the gradients of this rank's parameters (its local experts; the
 * router and shared expert as computed from its own tokens: the caller sums the replicated ones over the
 * group, as data parallelism would). The exchanges mirror the forward's: the dOut rows go to the experts'
 * ranks as the rows did (dispatch), and d(rows) and the experts' outputs come back as the outputs did
 * (return). Equal to hp_moe_backward on the same tokens up to summation order. Errors as hp_moe_backward's,
 * agreed over the group. Its scratch is allocated by the first call and kept. */
hp_status hp_moe_ep_backward(hp_moe_ep *ep, const float *x, int64_t n_tokens, const float *dy, float *dx,
                             hp_moe_grads *g, hp_err *err);
/* A runtime for layer l that borrows every buffer of `owner` (a runtime made by any hp_moe_ep_create*): its
 * workspace's arrays and GEMM context, the EP buffers, the communicators and the chunk setting. It makes only
 * the GEMM layer's objects for l's weights and allocates no buffer, so the sparse layers of a model, which run
 * one after another, need one runtime's memory instead of one each (the runner's inference). l must have the
 * owner's shapes: H, E, K, the expert and shared-expert widths, the local experts and the shared-expert gate
 * (else HP_ERR_INPUT naming the first difference, and nothing is made). Not a collective. The runtimes that
 * share buffers must run one at a time, and every one of them must be destroyed before the owner. A forward
 * of one overwrites what the others' last forwards left (the routing in hp_moe_ep_ws); hp_moe_ep_backward
 * refuses a runtime whose buffers hold another runtime's forward. hp_moe_ep_workspace_bytes is 0 for it. */
hp_status hp_moe_ep_create_shared(hp_moe_ep **out, const hp_moe_layer *l, hp_moe_ep *owner, hp_err *err);
const hp_moe_ws *hp_moe_ep_ws(const hp_moe_ep *ep);
/* (Every runtime's workspace keeps no one-process rows; the overlap buffer [max_tokens, H] exists only for a layer
 * with a shared expert: without one, overlap has nothing to hide and a forward runs as without it.)
 * The bytes of the EP buffers and of its workspace's arrays, as allocated (the GEMM layer's objects and the
 * communicators not included): what the runner counts as the block's workspace. 0 for a runtime that borrows
 * its buffers (hp_moe_ep_create_shared). */
size_t hp_moe_ep_workspace_bytes(const hp_moe_ep *ep);
/* The bytes of the backward's scratch its workspace holds (hp_moe_bwd_layout): 0 before its first backward. */
size_t hp_moe_ep_backward_bytes(const hp_moe_ep *ep);
const hp_moe_ep_stats *hp_moe_ep_get_stats(const hp_moe_ep *ep);

/* ---- the runtime's arrays, described once ----
 *
 * One table lists every array an MoE runtime allocates, from the shapes alone: hp_moe_ws_create's workspace,
 * and an EP runtime (hp_moe_ep_create, _chunked, _bounded): its workspace's arrays, then its own. The runtime
 * allocates by walking the table, in its order, and its bytes (hp_moe_ws.bytes, hp_moe_ep_workspace_bytes) are
 * the table's sum; `hyperpar cost` sums the same table for the workspace it predicts, with no runtime made. */

/* The arrays, in the order they are allocated: the workspace's (hp_moe_ws's fields of the same names), then an
 * EP runtime's own (src/moe/ep.c), from HP_MOE_ARR_EP_FIRST on. */
typedef enum hp_moe_arr_id {
    HP_MOE_ARR_X64 = 0,      /* f64 [T, H] */
    HP_MOE_ARR_LOGITS,       /* f64 [T, E] */
    HP_MOE_ARR_SEL,          /* f64 [2·E] */
    HP_MOE_ARR_TOPK_IDX,     /* i32 [T·K] */
    HP_MOE_ARR_TOPK_W,       /* f32 [T·K] */
    HP_MOE_ARR_KEEP,         /* u8  [T·K] */
    HP_MOE_ARR_CAP_SCRATCH,  /* i32 [hp_moe_capacity_scratch_count(T, K, E)] */
    HP_MOE_ARR_COUNTS,       /* i64 [L] */
    HP_MOE_ARR_OFFSETS,      /* i64 [L + 1] */
    HP_MOE_ARR_ROW_SLOT,     /* i32 [T·K] */
    HP_MOE_ARR_SLOT_ROW,     /* i32 [T·K] */
    HP_MOE_ARR_ROWS,         /* f32 [T·K, H]     one process only */
    HP_MOE_ARR_ACT,          /* f32 [Tr·K, 2·I] */
    HP_MOE_ARR_GROUPS,       /* hp_linear_group [L] */
    HP_MOE_ARR_PASS_ROW0,    /* i64 [L] */
    HP_MOE_ARR_SHARED_ACT,   /* f32 [Tr, 2·sI]   with a shared expert */
    HP_MOE_ARR_SHARED_OUT,   /* f32 [Tr, H]      with a shared expert */
    HP_MOE_ARR_SHARED_G,     /* f32 [Tr]         with a shared expert and its gate */
    HP_MOE_ARR_STAGE_CNT,    /* i64 [4·P·L]      chunked: two stages' cnt_send, cnt_recv */
    HP_MOE_ARR_STAGE_SZ,     /* size_t [8·P]     chunked: two stages' sc, sd, rc, rd */
    HP_MOE_ARR_COUNTS_ALL,   /* i64 [E] */
    HP_MOE_ARR_OFFSETS_ALL,  /* i64 [E + 1] */
    HP_MOE_ARR_CNT_SEND,     /* i64 [P·L] */
    HP_MOE_ARR_CNT_RECV,     /* i64 [P·L] */
    HP_MOE_ARR_CNT_LOCAL,    /* i64 [L] */
    HP_MOE_ARR_SC,           /* size_t [4·P]     sc, then the views sd, rc, rd */
    HP_MOE_ARR_SEND,         /* f32 [Tb·K, H] */
    HP_MOE_ARR_RECV,         /* f32 [P·Tb·K, H] */
    HP_MOE_ARR_XROWS,        /* f32 [P·Tb·K, H]  bounded: [P·Th·K, H] */
    HP_MOE_ARR_Y_SHARED,     /* f32 [T, H]       with a shared expert */
    /* the backward's scratch (hp_moe_bwd_layout), made by a workspace's first backward: R the rows it receives
     * (one process: T·K; an EP runtime: xrows'), C its chunk of rows (256), w = max(I, sI) */
    HP_MOE_ARR_BWD_DROWS,    /* f32 [R, H] */
    HP_MOE_ARR_BWD_DW,       /* f64 [T·K] */
    HP_MOE_ARR_BWD_DLOG,     /* f64 [T, E] */
    HP_MOE_ARR_BWD_G,        /* f32 [C, 2·w] */
    HP_MOE_ARR_BWD_DG,       /* f32 [C, 2·w] */
    HP_MOE_ARR_BWD_A,        /* f32 [C, w] */
    HP_MOE_ARR_BWD_DA,       /* f32 [C, w] */
    HP_MOE_ARR_BWD_O,        /* f32 [C, H] */
    HP_MOE_ARR_BWD_DXC,      /* f32 [C, H] */
    HP_MOE_ARR_BWD_SDO,      /* f32 [C, H] */
    HP_MOE_ARR_BWD_WGU,      /* f32 [2·I, H]     bf16 experts: one expert's gate|up widened */
    HP_MOE_ARR_BWD_WD,       /* f32 [H, I]       bf16 experts: its down widened */
    HP_MOE_ARR_COUNT,
    HP_MOE_ARR_EP_FIRST = HP_MOE_ARR_STAGE_CNT,
    HP_MOE_ARR_BWD_FIRST = HP_MOE_ARR_BWD_DROWS
} hp_moe_arr_id;

/* One array: hp__moe_alloc gives it n·elem_size zeroed bytes, at least 1. */
typedef struct hp_moe_ep_array {
    hp_moe_arr_id id;
    const char *name;          /* the field's name: "x64", "send" */
    int64_t n;                 /* elements; INT64_MAX when the count passes 64 bits (no allocation holds it) */
    size_t elem_size;          /* bytes per element */
} hp_moe_ep_array;

/* What the arrays depend on: the layer's shapes, the tokens, the EP group and the dispatch chunks. */
typedef struct hp_moe_ep_shape {
    int64_t max_tokens;        /* T: local tokens (an EP runtime: the most any rank of the group holds) */
    int64_t n_hidden, n_experts, top_k; /* H, E, K */
    int64_t n_local;           /* L: local experts (an EP runtime: E / P) */
    int64_t d_expert, d_shared; /* I, sI: the rank's expert widths (sI 0: no shared expert) */
    bool shared_gate;          /* the shared expert has a gate (HP_MOE_SHARED_GATED) */
    bool one_process;          /* hp_moe_ws_create's workspace: its rows, no EP buffer (the fields below unused) */
    int64_t ep_size;           /* P: ranks of the EP group */
    int64_t chunks;            /* dispatch chunks it is made for: hp_moe_ep_create_chunked's max_chunks,
                                  _bounded's chunks; <= 1: hp_moe_ep_create */
    bool bounded;              /* hp_moe_ep_create_bounded (with chunks > 1) */
    bool bf16_experts;         /* the experts are held in bf16 (the backward widens one at a time) */
} hp_moe_ep_shape;

/* The arrays the runtime of shape s allocates, in its order, into a; returns how many (at most HP_MOE_ARR_COUNT).
 * Pure: no allocation, no check of the shapes beyond counting past 64 bits (the runtime refuses what it cannot
 * run). With Tb the tokens the exchange holds (T; chunked: two stages of Th, Tb = 2·Th, Th = ceil((T + 1) / 2),
 * bounded Th = ceil(T / chunks)) and Tr the tokens the per-row scratch holds (T; bounded: Th). */
int hp_moe_ep_layout(const hp_moe_ep_shape *s, hp_moe_ep_array a[HP_MOE_ARR_COUNT]);
/* The bytes a[0..n) take as allocated (each n·elem_size, at least 1) into *bytes: what hp_moe_ep_workspace_bytes
 * (hp_moe_ws.bytes for hp_moe_ws_create) of that runtime is. false, and *bytes UINT64_MAX, when a count or the sum
 * passes 64 bits. */
bool hp_moe_ep_layout_bytes(const hp_moe_ep_array *a, int n, uint64_t *bytes);
/* The arrays of the backward's scratch of a runtime of shape s (from HP_MOE_ARR_BWD_FIRST on), in the order
 * the first backward allocates them; returns how many. hp_moe_ep_backward_bytes of that runtime after a backward
 * is their hp_moe_ep_layout_bytes. */
int hp_moe_bwd_layout(const hp_moe_ep_shape *s, hp_moe_ep_array a[HP_MOE_ARR_COUNT]);

/* ---- threads and machine reference figures (benchmarks) ---- */

/* Sets OpenMP and BLAS threads (n <= 0: leave as is); returns the BLAS thread count in effect. */
int hp_moe_set_threads(int n);
/* The kernels that run: hp_linalg_describe's oneDNN version, CPU, ISA, bf16 kernel and threads, then
 * "; router: " and hp_linalg_blas_describe's OpenBLAS core (with its warning on a generic fallback kernel). */
const char *hp_moe_blas_info(char *buf, size_t cap);
/* Same-run references: one big n×n×n product through the GEMM layer in mode (EXACT: f32; BF16: both operands
 * bf16, f32 sums) (best of reps), GFLOP/s; memcpy of nbytes, GB/s (best of reps). Both allocate: call them outside
 * timed regions. Return < 0 when out of memory. */
double hp_moe_ref_gemm_gflops(int64_t n, hp_linalg_mode mode, int reps);
/* The same, and the path that ran it into impl (cap bytes; may be NULL): oneDNN's implementation of the product,
 * e.g. "oneDNN brg:avx512_core_bf16", which names the instruction set the limit came from. */
double hp_moe_ref_gemm_run(int64_t n, hp_linalg_mode mode, int reps, char *impl, size_t cap);
double hp_moe_ref_memcpy_gbps(size_t nbytes, int reps);
/* The same-run dense limit of a layer's experts: m rows through one gate/up product [m, H]·[2I, H]ᵀ and one
 * down product [m, I]·[H, I]ᵀ (the down input read at row stride 2I, as the layer reads it), 6·m·H·I flops,
 * through the GEMM layer with weights of dtype (HP_DT_F32 or HP_DT_BF16) in mode, packed as the layer's are:
 * the layer's backend, kernels and numerics without the split into experts. Best of reps after a warm-up,
 * GFLOP/s. path (may be NULL) gets the gate/up product's path for m rows (hp_linear_info's small_path or
 * large_path). Allocates about 4·m·(2H + 2I) bytes plus the two weights: call it outside timed regions.
 * Returns < 0 when m, H or I < 1, dtype is another, or memory or the GEMM layer fails. */
double hp_moe_ref_dense_gflops(int64_t m, int64_t n_hidden, int64_t d_inner, hp_dtype dtype, hp_linalg_mode mode,
                               int reps, char *path, size_t cap);
/* Read-only bandwidth over nbytes (larger than the caches to measure memory): every OpenMP thread sums its
 * share, best of reps after a warm-up, GB/s. The limit for reading weights (memcpy moves each byte twice).
 * Allocates nbytes; < 0 when nbytes < 4 or out of memory. */
double hp_moe_ref_read_gbps(size_t nbytes, int reps);

#ifdef __cplusplus
}
#endif
#endif
