/*
 * hyperpar/run.h — the runtime: a model's forward pass across MPI ranks, executed as its plan says.
 *
 *   hp_runner_create(world, model, plan)   each rank loads only its slices of the weights
 *   hp_runner_forward(ids [B,S])           logits (gathered on rank 0, unless no_logits) and the loss (every rank)
 *
 * The mesh is the plan's: world = dp·cp·tp (rank = row-major over the mesh dims, tp fastest, as
 * `hyperpar shard` numbers its rank files). Every rank calls every function with the same arguments; a
 * failure on any rank fails all of them with its message (nothing hangs). Design: docs/run.md.
 */
#ifndef HYPERPAR_RUN_H
#define HYPERPAR_RUN_H

#include "hyperpar/comm.h"
#include "hyperpar/linalg.h"
#include "hyperpar/moe.h"
#include "hyperpar/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hp_runner hp_runner;


/* Called on rank 0 after a boundary's exit (validate mode): `what` is "<fqn>" or "<fqn>:in" (its input after
 * the entry redistribution); `t` is the whole tensor [B, S, X] of the batch, reassembled from every rank. */
typedef void (*hp_run_record_fn)(void *ctx, const char *what, const char *collective, const float *t, int64_t B,
                                 int64_t S, int64_t X);

typedef struct hp_run_opts {
    const char *command;     /* the hyperpar command running it, named in errors ("validate"); NULL: "run" */
    const char *shards;      /* a `hyperpar shard` folder of the same model and mesh, or NULL: slice the checkpoint */
    hp_linalg_mode compute;  /* HP_LINALG_EXACT (default) or HP_LINALG_BF16 */
    hp_run_record_fn record; /* validate: every boundary output, gathered (collective on every rank); NULL: none */
    void *record_ctx;
    bool keep_activations;   /* keep each layer's input (the residual stream, local block) for a backward pass */
    const char *test_nan_grad;     /* train's test: this parameter's gradient becomes NaN after its sums */
    const char *test_perturb_grad; /* validate --backward's test: this parameter's gradient is nudged after its
                                      sums on a run of more than one rank (a missed sum in miniature) */
    bool overlap;            /* MoE blocks hide the shared expert behind the token exchange (also when a block's
                                declared compute sets overlap_shared_expert); the numbers are the same */
    bool sync_collectives;   /* benchmarks: a barrier of the group before each collective, timed as wait_s, so
                                coll_s is the collective alone (no wait for a slower rank's compute) */
    bool balanced_router;    /* MoE blocks replace the routed experts by the balanced router of spec §10.4 (slot
                                s of a rank's tokens goes to expert (s mod Q)·L + (s div Q) mod L): benchmarks and
                                checks of hyperpar cost's exchange; the outputs are not the model's */
    const char *test_perturb_boundary; /* tests only, NULL otherwise: on a run of more than one rank, this boundary's
                                          (FQN) output is nudged, so validate must name it first (the CLI sets it
                                          from HP_TEST_PERTURB_BOUNDARY; the library reads no environment) */
    bool test_mlp_whole;     /* tests only: the dense MLP runs on all rows at once, as a training runner's does,
                                instead of in row chunks (docs/run.md "Long prefill"): the unchunked reference
                                (the CLI sets it from HP_TEST_MLP_WHOLE=1); the workspace is then not cost's */
    bool no_logits;          /* the caller does not read hp_run_output.logits (run without --output or --compare,
                                bench run): they stay NULL, are not gathered to rank 0, and lm_head and the loss
                                run one row chunk at a time (docs/run.md "Long prefill"), so the logits [T, V] are
                                never whole; the loss is the same to the bit. Ignored under keep_activations or
                                record (a backward and validate read the logits), which hand them on as before */
    const int32_t *moe_cap_block; /* [B·S] or NULL (validate's one-process reference): the MoE capacity limit
                                     applies within each block of the batch's rows (row b·S + s in block
                                     moe_cap_block[b·S + s]) separately, as the ranks of the distributed run each
                                     apply it to the rows they route; NULL: all rows one block */
    double moe_cap_factor;           /* with moe_cap_block: the capacity factor of every sparse block (the
                                        distributed plan's, which a one-process plan does not declare) */
    int64_t kv_cache;        /* generation: positions per row of a KV cache (hp_runner_forward_at); 0: none. Not with
                                keep_activations or record */
} hp_run_opts;

typedef struct hp_run_stats {
    double seconds;                      /* the last forward, wall time */
    double compute_s, comm_s;            /* its split (communication = time inside collectives) */
    uint64_t bytes[HP_RUN_COLL_COUNT];   /* bytes this rank sent into each kind, last forward */
    uint64_t calls[HP_RUN_COLL_COUNT];
    double coll_s[HP_RUN_COLL_COUNT];    /* time in each kind: the whole transition (packing, the MPI call,
                                            unpacking), what a bare MPI collective of the same bytes is compared to */
    double wait_s;                       /* sync_collectives: time in the barriers before them */
    uint64_t p2p_bytes, p2p_calls;       /* a pipeline's point-to-point transfers this rank sent or received: the
                                            stream between stages (and in training its gradient), not the logits'
                                            delivery to rank 0; last forward, or last training step */
    uint64_t workspace_bytes;            /* the forward's high-water mark of activation, scratch and
                                            communication buffers (weights excluded; docs/run.md); a training
                                            runner's: of every step so far, backward and optimizer included
                                            (docs/cost.md "A training step") */
    uint64_t window_bytes;               /* the shared-memory windows of the tp and cp groups at the forward's
                                            end (hp_comm_window_bytes: one node's collectives; not in
                                            workspace_bytes, and shared memory, not anonymous) */
    uint64_t resident_bytes;             /* weight bytes this rank holds */
    uint64_t share_bytes;                /* the plan's share of the checkpoint for this rank (its shard file) */
    int64_t tokens;                      /* B·S of the last forward (the whole batch) */
    double loss;                         /* the last forward's loss (hp_run_output.loss) */
    double moe_phase_s[6];               /* MoE, summed over the sparse layers of the last forward: route,
                                            dispatch, experts, return, combine, shared (hp_moe_ep_stats) */
    /* the last hp_runner_train_step (0 before one): its forward (= seconds), its backward (the layers'
     * recomputed forwards included) with the gradient sums, the backward's time inside collectives, and the
     * optimizer (AdamW, ZeRO's all-gathers, the linears made again) */
    double train_fwd_s, train_bwd_s, train_bwd_comm_s, train_opt_s;
    int64_t train_skipped; /* steps skipped for a non-finite gradient (hp_train_opts.skip_nonfinite) */
    /* the training state this rank holds (0 before the first step; hyperpar cost --mode train models each to the
     * byte, docs/cost.md): the parameters' f32 gradients; AdamW's f32 moments (ZeRO-1: this rank's blocks); the
     * f32 masters (every tensor stored as bf16: what the forward reads, or under BF16 compute the master of a
     * matrix's bf16 copy; the routers' f32 masters of their f64 copies); the kept activations (each layer's input and the
     * final norm's, the residual stream's local block) */
    uint64_t train_grad_bytes, train_optim_bytes, train_master_bytes, train_saved_bytes;
    /* The rows this rank's sparse blocks routed in the last forward (validate maps a capacity limit with them):
     * the first batch row (its dp replica's offset included) and count, the first sequence position and count;
     * moe_rows[1] 0 when it routed none; moe_rows_vary: the sparse layers routed different rows or applied
     * different capacity factors; moe_cap_factor: the capacity factor they applied (0: none) */
    int64_t moe_rows[4];
    bool moe_rows_vary;
    double moe_cap_factor;
    uint64_t kv_bytes;   /* generation's KV cache this rank holds (hp_run_opts.kv_cache; not in workspace_bytes) */
} hp_run_stats;

typedef struct hp_run_output {
    float *logits;  /* rank 0: [B, S, V] (malloc'd); NULL elsewhere and under hp_run_opts.no_logits */
    int64_t B, S, V;
    double loss;    /* every rank: mean next-token cross-entropy over B·(S−1) positions (those a mask marks) */
    /* MoE models, rank 0: the routed experts of every sparse layer, moe.<l>.topk_idx as in forward_io */
    int n_moe;
    int64_t K;
    int64_t *moe_layer;  /* [n_moe] layer indices */
    int32_t **topk_idx;  /* [n_moe] of [B·S, K], rows b·S + s, sorted ascending within a row */
} hp_run_output;

/* Frees what hp_runner_forward put in out (logits, the MoE routing). */
void hp_run_output_free(hp_run_output *out);
/* The same, but when out's logits are the buffer r's last forward handed on (one process: its output buffer, not
 * a copy), r keeps it for its next forward: a loop of forwards then does not fault in 4·B·S·V bytes of fresh
 * pages each time (~60 ms for [512, 32000] on the 2-core VM). Other outputs are freed. */
void hp_runner_recycle_output(hp_runner *r, hp_run_output *out);

/* The plan must be for m (hp_plan_derive or hp_shard_read_plan) with world = the size of `world`. */
hp_status hp_runner_create(hp_runner **out, const hp_comm *world, const hp_model *m, const hp_plan *p,
                           const hp_run_opts *o, hp_err *err);
void hp_runner_free(hp_runner *r);

/* ids [B, S] row-major, the same on every rank. Ids outside [0, V) are HP_ERR_INPUT naming row and position. */
hp_status hp_runner_forward(hp_runner *r, const int64_t *ids, int64_t B, int64_t S, hp_run_output *out, hp_err *err);
/* The same, the loss over the targets mask marks: mask [B, S] parallel to ids (the same on every rank), mask[b][s]
 * != 0 when token s of row b counts as the target of position s − 1; the others are left out of the loss as
 * transformers' label −100 is. out->loss is the mean over the marked targets of the whole batch (NaN when there
 * is none); NULL: every target, as hp_runner_forward. */
hp_status hp_runner_forward_masked(hp_runner *r, const int64_t *ids, const uint8_t *mask, int64_t B, int64_t S,
                                   hp_run_output *out, hp_err *err);
/* With hp_run_opts.kv_cache: ids [B, S] are positions [pos0, pos0 + S) of rows whose positions before pos0 the
 * runner's KV cache holds from the forwards before (pos0 = 0 starts a new batch; otherwise pos0 must be where the
 * last forward of the same B rows ended, and pos0 + S at most kv_cache). Each attention step appends this
 * forward's keys and values and attends over every cached position, so a decode step runs S = 1 token per row.
 * out: the logits of these S positions; its loss is over them alone. Without a cache: hp_runner_forward (pos0 0).
 * Collective. */
hp_status hp_runner_forward_at(hp_runner *r, const int64_t *ids, int64_t B, int64_t S, int64_t pos0,
                               hp_run_output *out, hp_err *err);

const hp_run_stats *hp_runner_stats(const hp_runner *r);
/* Turns hp_run_opts.sync_collectives on or off for the next forwards. */
void hp_runner_sync_collectives(hp_runner *r, bool on);

/* ---- generation (docs/generate.md) ---- */

typedef struct hp_generate_opts {
    int64_t max_new;    /* tokens to add to each row at most (default 32) */
    double temperature; /* 0 (default): greedy (the first largest logit); > 0: sampled */
    int64_t top_k;      /* sampled: keep the logits at least the k-th largest (0: all) */
    double top_p;       /* sampled: keep the smallest set of most likely tokens whose probability passes p (1: all) */
    uint64_t seed;      /* sampled: splitmix64's start; the same seed draws the same tokens on every mesh */
    int n_eos;          /* a row ends at the first of these ids it produces (included) */
    int64_t eos[8];
} hp_generate_opts;
/* max_new 32, greedy, top_k 0, top_p 1, seed 0, no eos (the caller sets the model's). */
void hp_generate_opts_default(hp_generate_opts *o);
/* o's end ids as transformers' generate takes them: generation_config.json's eos_token_id beside the model when
 * it has one, else config.json's. HP_ERR_INPUT for a generation_config.json that is not JSON or whose
 * eos_token_id is not an id or a list of at most 8. */
hp_status hp_generate_default_eos(const hp_model *m, hp_generate_opts *o, hp_err *err);
/* Called on rank 0 for each token as it is produced: row and id. */
typedef void (*hp_generate_token_fn)(void *ctx, int64_t row, int64_t token);
/* Generates from B prompts of S0 tokens each (the same on every rank): each step runs the rows forward under r's
 * plan, rank 0 picks each unfinished row's next token from its last position and every rank receives them; stops
 * when every row has produced an eos id or after max_new tokens. *out: [B, *out_len] ids (malloc'd, every rank),
 * each row's prompt, its tokens and, after its eos, that eos repeated. Collective. */
hp_status hp_generate(hp_runner *r, const int64_t *prompt, int64_t B, int64_t S0, const hp_generate_opts *o,
                      hp_generate_token_fn fn, void *ctx, int64_t **out, int64_t *out_len, hp_err *err);

/* ---- training (docs/train.md) ---- */

/* AdamW's hyperparameters, as torch.optim.AdamW takes them. */
typedef struct hp_train_opts {
    double lr, beta1, beta2, eps, weight_decay;
    int zero; /* 1: ZeRO-1, each rank holds AdamW's moments of its block of what it shares with the other dp ranks
                 (the expert-data-parallel group for routed experts); the same numbers as 0 */
    double clip; /* > 0: the gradients scaled by clip / (norm + 1e-6) when their global norm exceeds it
                    (torch.nn.utils.clip_grad_norm_); 0: off */
    bool skip_nonfinite; /* a step whose gradients are not all finite is skipped (no update, counted in
                            hp_run_stats.train_skipped) instead of failing with HP_ERR_VERIFY */
} hp_train_opts;
/* PyTorch's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2. */
void hp_train_opts_default(hp_train_opts *o);

/* One training step on ids [B, S] (the same on every rank): the forward, the backward of every step of the
 * plan's program in reverse (each transition by its dual), every parameter's gradient summed over the ranks
 * that saw other rows of it (dp always; cp; tp for what tp does not cut), then AdamW on each rank's slices.
 * The loss is the mean next-token cross-entropy over the B·(S−1) scored positions of the global batch; *loss
 * receives it (before the update). The runner must have been created with keep_activations. opts NULL: compute
 * the gradients only (hp_runner_gather_params(grads = true) reads them); the parameters are unchanged.
 * Collective. HP_ERR_INPUT for a model the training step cannot run yet (docs/train.md says which). */
hp_status hp_runner_train_step(hp_runner *r, const int64_t *ids, int64_t B, int64_t S, const hp_train_opts *opts,
                               double *loss, hp_err *err);

/* The same step in parts, for gradient accumulation: hp_runner_accumulate runs the forward and backward of one
 * micro-batch ids [B, S] and adds its gradients (the first call after an apply starts from zero); the loss the
 * gradients are of is the mean over n_scored positions (the whole step's: every micro-batch's B·(S−1) summed;
 * <= 0: this micro-batch's), and *loss receives this micro-batch's own mean. hp_runner_apply then sums the
 * gradients over the mesh, computes their global norm with every element counted once (*grad_norm, may be NULL),
 * clips (opts->clip) and takes the AdamW step (opts NULL: gradients only). hp_runner_train_step is one of each.
 * Under a pipeline hp_runner_accumulate is hp_runner_accumulate_pipe of one micro-batch by the plan's default
 * schedule (1f1b; with virtual stages interleaved, which refuses one micro-batch).
 * Collective. */
hp_status hp_runner_accumulate(hp_runner *r, const int64_t *ids, int64_t B, int64_t S, int64_t n_scored,
                               double *loss, hp_err *err);
/* hp_runner_accumulate with a loss mask (hp_runner_forward_masked): a target the mask leaves out contributes
 * nothing, to the loss or to any gradient, and n_scored counts the marked targets of the whole step (<= 0: this
 * micro-batch's), as transformers' ignore_index −100 with num_items_in_batch. mask NULL: every target. */
hp_status hp_runner_accumulate_masked(hp_runner *r, const int64_t *ids, const uint8_t *mask, int64_t B, int64_t S,
                                      int64_t n_scored, double *loss, hp_err *err);
hp_status hp_runner_apply(hp_runner *r, const hp_train_opts *opts, double *grad_norm, hp_err *err);
/* m micro-batches ids [m][B, S] (and their mask [m][B, S], or NULL) accumulated as m calls of
 * hp_runner_accumulate_masked would (n_scored over the step; <= 0: every target of the m micro-batches the mask
 * marks, all m·B·(S−1) without one), losses[j] micro-batch j's own mean on every rank. Under a pipeline (pp > 1)
 * every stage
 * walks schedule sched's list of its chunks' forwards and backwards (hp_pp_sched_ops; docs/pipeline.md), the
 * stream and its gradient point to point between stages; the gradients are those of one process, each chunk's
 * micro-batches summed in order. Collective over every rank. */
hp_status hp_runner_accumulate_pipe(hp_runner *r, const int64_t *ids, const uint8_t *mask, int64_t m, int64_t B,
                                    int64_t S, int64_t n_scored, hp_pp_sched sched, double *losses, hp_err *err);

/* The training state, for a resume that continues bit for bit: every trained slice's f32 values (the masters),
 * AdamW's moments (as ZeRO lays them out) and the step count, each rank into dir/rank-<r>.safetensors (written
 * atomically; dir must exist, visible to every rank). Save between steps (not mid-accumulation). Load checks that
 * the state is of this model, plan and world (every entry's name and size) and restores it; the next step is
 * then the one the saved run would have taken. Collective. */
hp_status hp_runner_save_train(hp_runner *r, const char *dir, hp_err *err);
/* The same, with n_meta more metadata pairs (meta[2i] the key, meta[2i + 1] its value; e.g. "run_id") in each
 * rank's file, beside "step", "zero", "world" and "rank" (the writing rank: load refuses another rank's file). */
hp_status hp_runner_save_train_meta(hp_runner *r, const char *dir, const char *const *meta, int n_meta, hp_err *err);
hp_status hp_runner_load_train(hp_runner *r, const char *dir, hp_err *err);
/* AdamW steps taken (restored by hp_runner_load_train). */
int64_t hp_runner_train_steps(const hp_runner *r);

/* Called on world rank 0 once per trainable parameter, in the program's order, with the whole tensor at the
 * checkpoint's name and shape (f32); a failure stops the walk (every rank then fails with it). */
typedef hp_status (*hp_param_fn)(void *ctx, const char *name, const float *data, const int64_t *shape, int n_dims,
                                 hp_err *err);
/* Gathers every trainable parameter (grads false: its current value; true: the gradient of the last
 * hp_runner_train_step) from the ranks' slices onto world rank 0 and hands it to fn there; with grads false also
 * each MoE router's e_score_correction_bias, which selects experts but is not trained (its value as held).
 * Collective. */
hp_status hp_runner_gather_params(hp_runner *r, bool grads, hp_param_fn fn, void *ctx, hp_err *err);

/* With keep_activations: the local block of layer l's input residual stream of the last forward (l = L: the
 * final norm's input), global dims g [B_dp, S_padded, H] and the block's offset lo and extent n per dim.
 * NULL without keep_activations or before a forward. */
const float *hp_runner_activation(const hp_runner *r, int64_t l, int64_t g[3], int64_t lo[3], int64_t n[3]);
/* "dp=1,cp=1,tp=2 rank 1 (dp 0, cp 0, tp 1)" */
const char *hp_runner_describe(const hp_runner *r, char *buf, size_t cap);

/* ---- one MoE layer under expert parallelism (hyperpar moe over MPI) ---- */
typedef struct hp_run_moe_opts {
    const char *model;        /* a checkpoint folder, or a `hyperpar shard` folder (each rank reads its file) */
    int64_t layer;
    const char *mesh;         /* a mesh spec, or NULL: dp = the world (TP-extend-EP over every rank) */
    int64_t ep;               /* EP group size; 0: the mesh's ep axis, else the world */
    const char *archetype;    /* the EP compute; NULL: the plan's local_compute_fn (overrides), or with one rank
                                 and no overrides the family's suggestion; with EP it is never chosen silently */
    const char *overrides;
    double capacity_factor;   /* 0: the plan's, else off */
    hp_moe_cap_policy policy;
    bool overlap;
    int64_t chunks;           /* dispatch chunks (0 or 1: one) */
    hp_linalg_mode compute;
} hp_run_moe_opts;

typedef struct hp_run_moe_result {
    float *y;                 /* rank 0: [T, H] in row order (malloc'd, hp_run_moe_result_free) */
    int32_t *topk_idx;        /* rank 0: [T, K] */
    float *topk_w;            /* rank 0: [T, K] */
    int64_t T, H, K;
    int64_t layer, n_experts, ep, n_local;
    hp_moe_archetype archetype;
    bool archetype_suggested; /* chosen as the family's suggestion (one rank, nothing declared) */
    double capacity_factor;   /* what ran (0: off) */
    bool cf_from_plan;
    double seconds;           /* the forward, slowest rank */
    double rows_computed, slots_dropped, bytes_exchanged; /* summed over ranks */
    bool agreed;              /* a failure is known to every rank (print it once); false: this rank's alone */
} hp_run_moe_result;

/* Splits the world into EP groups (hp_mesh_ep_index), loads each rank's experts of the layer, checks that every
 * rank runs the same command, input and weights, gives rank r the r-th contiguous block of x's T rows, runs the
 * EP forward and gathers y, topk_idx, topk_w on rank 0. x [T, H] is the whole input on every rank. Collective. */
hp_status hp_run_moe(const hp_comm *world, const hp_run_moe_opts *o, const float *x, int64_t T, int64_t H,
                     hp_run_moe_result *res, hp_err *err);
void hp_run_moe_result_free(hp_run_moe_result *res);

/* ---- validate mode: the distributed run against one process, boundary by boundary ---- */
typedef struct hp_validate_row {
    char what[128];      /* boundary FQN, or "model.layers.<l>" for a layer's residual stream */
    char coll[96];       /* the distributed run's exit collective for it */
    double max_diff, max_ref;
    bool ok;
} hp_validate_row;

typedef struct hp_validate_report {
    int n;
    hp_validate_row *rows; /* in execution order (rank 0; malloc'd, hp_validate_report_free) */
    int first_bad;         /* index of the first row over the tolerance, -1 when none */
    double loss, loss_ref;
    hp_run_stats stats;    /* the distributed run's */
} hp_validate_report;

/* Runs plan p across `world` and, on rank 0, the one-process plan p1 (a world-1 plan of the same model),
 * recording every boundary's output of both; rank 0 compares them with hp_tol_check at rtol. Collective. */
hp_status hp_validate(const hp_comm *world, const hp_model *m, const hp_plan *p, const hp_plan *p1,
                      const hp_run_opts *o, const int64_t *ids, int64_t B, int64_t S, double rtol,
                      hp_validate_report *rep, hp_err *err);
/* The same for one training step (no update): the forward's boundaries, then in the backward's order each
 * module's input gradient and the residual stream's ("<fqn> (gradient)"), then every trainable parameter's
 * gradient (coll "gradient"), all under plan p against the one-process plan p1, gathered whole on rank 0; a wrong
 * dual or a missed sum is named by the first row it reaches. Collective. */
hp_status hp_validate_backward(const hp_comm *world, const hp_model *m, const hp_plan *p, const hp_plan *p1,
                               const hp_run_opts *o, const int64_t *ids, int64_t B, int64_t S, double rtol,
                               hp_validate_report *rep, hp_err *err);
void hp_validate_report_free(hp_validate_report *rep);

/* ---- the one tolerance check (run --compare, validate, the tests) ---- */
typedef struct hp_tol {
    bool ok;
    double max_diff;  /* max |got − ref| (NaN/inf anywhere: infinity) */
    double max_ref;   /* max |ref| */
    double tol;       /* rtol · max|ref| */
    int64_t worst;    /* flat index of the largest difference */
    int n_dims;
    int64_t shape[HP_MAX_DIMS];
} hp_tol;

/* max|got − ref| ≤ rtol·max|ref| over n = prod(shape) values; worst coordinates in the result. */
bool hp_tol_check(const float *got, const float *ref, int n_dims, const int64_t *shape, double rtol, hp_tol *out);
/* "max diff 3.1e-07 at [1, 4, 17] (tolerance 1.2e-04 = 1e-04 x max|ref| 1.2): OK" */
const char *hp_tol_str(const hp_tol *t, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
