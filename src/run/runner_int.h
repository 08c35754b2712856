/*
 * runner_int.h — internal to src/run: the runner's state (runner.c) and the steps it executes, shared with the
 * training step (train.c), which recomputes a layer's forward through the same functions before its backward.
 */
#ifndef HP_RUN_RUNNER_INT_H
#define HP_RUN_RUNNER_INT_H

#include "exec/prog.h"
#include "kernels/modules.h"
#include "run/finite.h"
#include "run/run_int.h"
#include "run/weights.h"

struct hp__train; /* the training state (train.c), NULL when the runner only runs forwards; the runner frees it
                     through train_free, so it calls nothing of train.c */

typedef struct attn_w {
    const hp__step *s;
    hp__w wq, wk, wv, wo, bq, bk, bv, bo, qn, kn, sinks;
    hp_linear *q, *k, *v, *o;
    /* MLA (DeepSeek-V3): q = q_b(q_a_norm(q_a(x))) or q_proj(x) in wq/q; kv_a -> latent | k_rot; kv_b -> k_nope | v */
    bool mla;
    hp__w wqa, qan, wkva, kvan, wkvb;
    hp_linear *qa, *kva, *kvb;
    int64_t nope, rope, vd, ql, kvl;
    int64_t nh, nkv; /* local heads */
    bool split;      /* tp shards the heads */
    bool bo_deferred;
} attn_w;

typedef struct mlp_w {
    const hp__step *s;
    hp__w wg, wu, wgu, wd, bg, bu, bgu, bd;
    hp_linear *gate, *up, *gate_up, *down;
    int64_t I; /* local width */
    bool split;
    bool bd_deferred;
} mlp_w;

typedef struct norm_w {
    const hp__step *s;
    hp__w w;
} norm_w;

/* A sparse (MoE) block: its EP compute runs the existing EP runtime on the rank's local rows (issue 13). */
typedef struct moe_w {
    const hp__step *s;
    hp_moe_layer *l;
    hp_moe_ep *ep;      /* created at the first forward, for max_tokens local rows; in inference it borrows
                           the buffers of an earlier sparse layer's of the same shapes (shared) */
    int64_t max_tokens;
    int chunks;         /* the dispatch chunks it was made for (its buffers hold one chunk when > 1) */
    bool shared;
    double cf;          /* the boundary's capacity factor (0: off) */
    bool overlap;       /* hide the shared expert behind the exchange */
    hp__act topk;       /* [B, S_pad, K] of the last forward, the routed experts as floats, laid out like x */
    bool tp_cut;        /* experts (and the shared expert) cut over tp: the output is a partial sum (P) */
} moe_w;

/* The weights of one step of the program (hp__prog.steps[i]), by its op: runner_weights.sw[i]. */
typedef struct step_w {
    norm_w norm; /* NORM */
    attn_w at;   /* ATTN, MLA */
    mlp_w mlp;   /* MLP */
    moe_w moe;   /* MOE */
    hp__w table; /* EMBED: the embedding; HEAD: lm_head (not present when tied: the head is the embedding) */
} step_w;

/* The rank's weights: where they come from and what the steps compute with. */
typedef struct runner_weights {
    hp_linalg *la;
    hp_shard_layout *layout;
    hp_shard_rank_file *rf;
    hp__wsrc ws;
    step_w *sw;     /* [n_steps]: each step's weights */
    hp__w *embed;   /* the EMBED step's table */
    hp__w *head_w;  /* the head's matrix: lm_head's table, or (tied) the embedding */
    hp_linear *head;
    hp__wreg wreg; /* the rank's weights with their names (a non-finite activation's cause) */
} runner_weights;

/* The forward's buffers, kept across forwards (warm pages); each counted in x.mem. */
typedef struct runner_scratch {
    float *rope_cos, *rope_sin; /* the last rotary table and its positions */
    size_t rope_bytes;          /* of each table */
    int64_t rope_pos0, rope_n;
    hp__act *kept;              /* keep_activations: [L + 1] layer inputs of the last forward */
    float *loss_mx;             /* keep_activations: the loss's per-row max and Σexp over the whole vocabulary of */
    double *loss_se;            /* the last forward (after their all-reduces), what the backward's softmax reads */
    int64_t loss_rows, loss_cap;
    hp__act h, t, a, k, v;      /* the residual stream, a module's input and output, K and V */
    float *buf[HP__NBUF];       /* the steps' module buffers (hp__step_row_widths) */
    size_t buf_cap[HP__NBUF];
    int64_t moe_rows;           /* the most rows any rank holds in the forward in progress (the EP buffers') */
    float *handed;              /* the last forward's output buffer (a's), handed to the caller as its logits */
    size_t handed_cap;          /* its floats (what a held) */
} runner_scratch;

/* What a forward reports: its statistics, validate's trace and the non-finite watch. */
typedef struct runner_trace {
    hp_run_stats stats;
    char exit_coll[96];  /* the last boundary's exit collective, for validate's table */
    hp__nf nf;           /* the first non-finite boundary output of the forward in progress */
    const char *perturb; /* hp_run_opts.test_perturb_boundary: that boundary's output is nudged (validate's test) */
    bool quiet;          /* the training step's recompute: its boundaries are not recorded again */
    char desc[160];
} runner_trace;

/* The rank's pipeline stage (docs/pipeline.md). Inside a stage the runner is a runner of the stage's ranks: x.world
 * is the stage's communicator (pp is the outermost axis, so a stage-local rank has the mesh coordinates of its
 * world rank on every other axis); the stream goes point to point between stages over `all`. */
typedef struct runner_pipe {
    const hp_comm *all;  /* every rank (the caller's world) */
    hp_comm *stage_c;    /* the stage's ranks (NULL without a pipeline: x.world is all) */
    int64_t pp, stage, per; /* stages, this rank's, ranks per stage */
} runner_pipe;

/* Generation's KV cache (hp_run_opts.kv_cache; kv.c, docs/generate.md): per attention step, the keys and values
 * of every position of this rank's rows so far, [rows, cap, width] (the rank's heads; whole over cp). */
typedef struct runner_kv {
    int64_t cap;      /* positions per row it holds (kv_cache + the cp padding's slack); 0: none made yet */
    int64_t rows, B;  /* this rank's rows, the batch's (what the cache was made for) */
    int64_t len;      /* positions filled by the forwards so far */
    float **k, **v;   /* [n_steps]: an attention step's, NULL for the others */
    uint64_t bytes;
} runner_kv;

struct hp_runner {
    const hp_model *m;
    const hp_plan *p;
    hp_run_opts o;
    hp__prog g;         /* the program this runner executes (exec/prog.h) */
    hp__ctx x;          /* communication: the axis groups, the collectives' buffers and counters */
    runner_pipe pipe;
    hp_comm *ep_grp;    /* the rank's EP group (hp_mesh_ep_index); a group of one without EP */
    int64_t ep, ep_index;
    runner_weights w;
    runner_scratch sc;
    runner_trace tr;
    runner_kv kv;       /* the cache only: hp__kv_free resets all of it */
    int64_t pos0;       /* the forward in progress: the position of its first token (hp_runner_forward_at; 0
                           without a cache). Outside kv, as it belongs to the forward, not to the cache. */
    struct hp__train *train;
    void (*train_free)(struct hp__train *t);
};

/* ---- the steps (runner.c) ---- */

/* Whether this rank holds step s's weights: every step without a pipeline; a stage its chunks' steps, and the
 * last stage a tied head's embedding too. */
bool hp__r_step_loaded(const hp_runner *r, const hp__step *s);

/* The activation arrives as the program says; the entry moves it to the layout the computation runs on. */
hp_status hp__r_enter(hp_runner *r, const hp__step *s, hp__act *a, hp_err *err);
/* The computation's output, as the program says, moved to the layout it leaves in. */
hp_status hp__r_leave(hp_runner *r, const hp__step *s, hp__act *a, hp_err *err);
hp_status hp__r_act_copy(hp_runner *r, hp__act *dst, const hp__act *src, hp_err *err);
/* Runner buffer i of at least n floats (contents undefined), kept across calls. */
float *hp__r_buf(hp_runner *r, int i, int64_t n, hp_err *err);
hp_status hp__r_linear(hp_runner *r, hp__w *w, const hp__w *bias, hp_linear **out, hp_err *err);
/* The rotary tables of positions [pos0, pos0 + n) in r->sc.rope_cos / rope_sin. */
hp_status hp__r_rope(hp_runner *r, int64_t pos0, int64_t n, hp_err *err);
void hp__mla_rope(hp_runner *r, bool interleave, float *kr, int64_t kstride, float *q, int64_t nh, int64_t qk,
                  int64_t nope, int64_t rope, int64_t Bl, int64_t sq, bool backward);
/* hp__attention with its block scratch counted (runner.c). */
hp_status hp__r_attention(hp_runner *r, const hp__attn_args *aa, hp_err *err);
/* Attention of step s on aa's queries (aa without keys: q, out, B, sq, heads, q_pos0, window, ...) over k and v,
 * this forward's keys and values (whole over cp): directly, or with a KV cache appended to it and over every cached
 * position (kv.c). */
hp_status hp__kv_attend(hp_runner *r, const hp__step *s, hp__attn_args *aa, const hp__act *k, const hp__act *v,
                        hp_err *err);
/* Frees the KV cache and resets r->kv to "none made" (r->pos0 is the forward's, never touched here). */
void hp__kv_free(hp_runner *r);
/* The modules: in is the step's input as it arrives; t (attention, MLP) is moved to the step's run layout in
 * place; after the call the runner's buffers hold the step's intermediates (attention: q after rope in buf 0,
 * its output in buf 1, K and V in sc.k / sc.v; MLP: gate|up in buf 2, the hidden in buf 3, of every row in a
 * training runner (keep_activations), else of the last row chunk only: hp__mlp_chunk_end). */
hp_status hp__r_norm(hp_runner *r, norm_w *n, const hp__act *in, hp__act *out, hp_err *err);
hp_status hp__r_attn(hp_runner *r, int64_t layer, attn_w *a, hp__act *t, hp__act *out, hp_err *err);
hp_status hp__r_mlp(hp_runner *r, mlp_w *m, hp__act *t, hp__act *out, hp_err *err);
/* Where the MLP's gate and up of `rows` rows sit in its 2I floats per row (buffer 2), and their gradients in the
 * backward: row stride *ld, up at offset *up from gate. Fused (one gate_up weight): rows [rows, 2I], *ld = 2I,
 * *up = I. Separate weights: two dense blocks [rows, I], *ld = I, *up = rows·I. */
void hp__gu_layout(bool fused, int64_t rows, int64_t I, int64_t *ld, int64_t *up);
hp_status hp__r_moe(hp_runner *r, moe_w *m, hp__act *t, hp__act *out, int64_t max_rows, hp_err *err);
/* Destroys every sparse layer's EP runtime (those that borrow buffers first), uncounting their bytes. */
void hp__r_moe_release(hp_runner *r);
/* Frees every buffer of the forward counted in r->x.mem (activations, kept inputs, module buffers, rotary tables,
 * the loss's statistics, the transitions' spare and scratch, the EP runtimes): a training micro-batch starts from
 * none, so each one allocates what the first did (the figure cost --mode train gives). */
void hp__r_release(hp_runner *r);
/* A boundary's output (or, in the backward, a gradient) for validate's tape: gathered whole onto rank 0 and handed
 * to hp_run_opts.record (collective; partial sums are skipped), and watched for non-finite values. */
hp_status hp__r_record(hp_runner *r, const char *what, const char *coll, hp__act *a, hp_err *err);
hp_status hp__r_residual(hp_runner *r, const hp__step *s, hp__act *h, hp__act *br, hp_err *err);
/* A forward's set-up for batches of B rows of S tokens (n_batches of them at ids, each one's ids checked): the
 * statistics reset, the sequence's padding, the buffers' bound, the dp rows; *max_rows the most rows any rank
 * holds (the EP buffers'). */
hp_status hp__r_begin(hp_runner *r, const int64_t *ids, int64_t n_batches, int64_t B, int64_t S, int64_t *max_rows,
                      hp_err *err);
/* Steps [lo, hi) of the program through their forward entries. */
struct hp__fio;
hp_status hp__r_steps(hp_runner *r, struct hp__fio *io, size_t lo, size_t hi, hp_err *err);

/* ---- the loss (loss.c) ---- */

/* The mean next-token cross-entropy of ids over the logits z (ls: the loss step) into *loss, every rank of x.world
 * the same; a training runner keeps the rows' max and Σexp for its backward. */
hp_status hp__r_loss(hp_runner *r, const hp__step *ls, const hp__act *z, const int64_t *ids, const uint8_t *mask,
                     int64_t S, double *loss, hp_err *err);
/* The targets the loss scores in ids [B, S]: B·(S − 1), or with a mask those whose token it marks. */
int64_t hp__r_scored(const uint8_t *mask, int64_t B, int64_t S);
/* lm_head (step s, on t) and the loss (step ls) one row chunk at a time, the logits of one chunk in a. */
hp_status hp__r_head_loss_chunks(hp_runner *r, const hp__step *s, const hp__step *ls, hp__act *t, hp__act *a,
                                 const int64_t *ids, const uint8_t *mask, int64_t S, double *loss, hp_err *err);

/* ---- the pipeline (pipe.c; docs/pipeline.md) ---- */

/* The world rank at this rank's position (its rank in the stage's communicator) in stage `stage`: the peer of
 * every point-to-point transfer between stages (pp is the outermost axis: stage s holds ranks [s·per, (s+1)·per)). */
int hp__pipe_peer(const hp_runner *r, int64_t stage);
/* The world rank of stage `stage`'s first rank (its stage-local rank 0: where the stage's gathers land). */
int hp__pipe_first(const hp_runner *r, int64_t stage);

/* One message of an exchange between stages: a status word under tag, then `bytes` of payload under tag + 1, to
 * or from world rank peer. */
typedef struct hp__pipe_msg {
    bool live;   /* part of the next exchange */
    bool send;
    int peer, tag;
    float *d;    /* the payload (a receive into NULL drops it) */
    size_t bytes;
    size_t cap;  /* the bytes d holds, where the message owns its buffer (training's) */
    int32_t ok;  /* sent: this stage's status; received: the peer's */
} hp__pipe_msg;
#define HP__PIPE_MSGS 4 /* the most messages of one exchange: training's stream and gradient, each both ways */

/* Posts every live message of m[0, n) (sends carrying st's verdict) in one hp_comm_exchange and waits for them all;
 * counts the payloads (hp_run_stats.p2p_bytes, p2p_calls: what cost predicts) and the wait (comm_s). Returns st,
 * else the exchange's failure, else a failure naming the stage that sent a bad status. The messages are no longer
 * live afterwards. */
hp_status hp__pipe_exchange(hp_runner *r, hp__pipe_msg *const *m, int n, hp_status st, hp_err *err);
/* The stream's local block in floats (the rank's rows of its replica, [B_r, S_pad, H] in the stream's layout):
 * every payload's size. */
int64_t hp__pipe_block(const hp_runner *r);
/* An int32 array [rows, *cols] from stage `stage`'s first rank (*v, malloc'd there: freed once sent) to world rank 0
 * (*v malloc'd, *cols set), behind the sender's status st: run's routing, gathered on its stage (pipe.c). Only those
 * two ranks take part; stage 0's first rank is world rank 0 (nothing moves). Returns st, else the transfer's or
 * the sender's failure (on rank 0). */
hp_status hp__pipe_relay_i32(hp_runner *r, int64_t stage, hp_status st, int32_t **v, int64_t *cols, int64_t rows,
                             hp_err *err);
/* The rank's chunks of the program in chunk order, the stream received before and sent after each. */
hp_status hp__pipe_steps(hp_runner *r, struct hp__fio *io, hp_err *err);
/* After the steps: every rank agrees on st, gets the loss from the last stage, and rank 0 the logits (when
 * logits is not NULL: *logits malloc'd [B, S_pad, V] + 1 floats on rank 0). */
hp_status hp__pipe_finish(hp_runner *r, hp_status st, int64_t B, float **logits, double *loss, hp_err *err);

/* ---- the ops: one record per op of the program (exec/prog.h), in ops.c ---- */

/* What a step's forward reads and writes besides its weights: the batch, the residual stream h, a module's input t
 * and output a (the runner's own, or the backward's recompute's), and the loss. */
typedef struct hp__fio {
    const int64_t *ids;
    const uint8_t *mask;  /* [B, S] parallel to ids, or NULL: the tokens that count as targets (forward_masked) */
    int64_t S;
    hp__act *h, *t, *a;
    int64_t max_rows;     /* the most rows any rank holds (the EP buffers') */
    bool chunks;          /* lm_head and the loss in row chunks (hp__prog.head_chunks, no logits taken) */
    bool recompute;       /* the backward's recompute of a layer: its input is kept already */
    const hp__step *next; /* the step after this one (HEAD: its loss, when chunks) */
    double *loss;
} hp__fio;

struct hp__bio; /* what a step's backward reads: train_int.h */

/* An op's entries; NULL where the op has nothing to do (a residual loads no weights). load reads the step's
 * weights for this rank and checks their local shapes against the step's dims; fwd executes it (runner.c); reg
 * registers its trainable tensors, bwd runs its backward (bwd.c: the gradient of its output to its input's and
 * its parameters'). The dry walk of the same op is cost's (src/cost/cost.c), above the runtime. */
typedef struct hp__op_rt {
    hp_status (*load)(hp_runner *r, const hp__step *s, step_w *w, hp_err *err);
    hp_status (*fwd)(hp_runner *r, const hp__step *s, step_w *w, hp__fio *io, hp_err *err);
    hp_status (*reg)(hp_runner *r, const hp__step *s, step_w *w, hp_err *err);
    hp_status (*bwd)(hp_runner *r, const hp__step *s, step_w *w, struct hp__bio *b, hp_err *err);
} hp__op_rt;
extern const hp__op_rt hp__op_rt_table[HP__OP_COUNT];

hp_status hp__load_embed(hp_runner *r, const hp__step *s, step_w *w, hp_err *err);
hp_status hp__load_norm(hp_runner *r, const hp__step *s, step_w *w, hp_err *err);
hp_status hp__load_attn(hp_runner *r, const hp__step *s, step_w *w, hp_err *err);
hp_status hp__load_mlp(hp_runner *r, const hp__step *s, step_w *w, hp_err *err);
hp_status hp__load_moe(hp_runner *r, const hp__step *s, step_w *w, hp_err *err);
hp_status hp__load_head(hp_runner *r, const hp__step *s, step_w *w, hp_err *err);
void hp__free_step_w(step_w *w);
/* The runtime's tensor of a parameter table slot (exec/prog.h) in step weights w of op. */
hp__w *hp__slot_w(step_w *w, hp__op op, hp__pslot slot);

hp_status hp__fwd_embed(hp_runner *r, const hp__step *s, step_w *w, hp__fio *io, hp_err *err);
hp_status hp__fwd_norm(hp_runner *r, const hp__step *s, step_w *w, hp__fio *io, hp_err *err);
hp_status hp__fwd_attn(hp_runner *r, const hp__step *s, step_w *w, hp__fio *io, hp_err *err);
hp_status hp__fwd_mlp(hp_runner *r, const hp__step *s, step_w *w, hp__fio *io, hp_err *err);
hp_status hp__fwd_moe(hp_runner *r, const hp__step *s, step_w *w, hp__fio *io, hp_err *err);
hp_status hp__fwd_residual(hp_runner *r, const hp__step *s, step_w *w, hp__fio *io, hp_err *err);
hp_status hp__fwd_head(hp_runner *r, const hp__step *s, step_w *w, hp__fio *io, hp_err *err);
hp_status hp__fwd_loss(hp_runner *r, const hp__step *s, step_w *w, hp__fio *io, hp_err *err);

hp_status hp__reg_table(hp_runner *r, const hp__step *s, step_w *w, hp_err *err);
hp_status hp__reg_params(hp_runner *r, const hp__step *s, step_w *w, hp_err *err);
hp_status hp__reg_moe(hp_runner *r, const hp__step *s, step_w *w, hp_err *err);

hp_status hp__bwd_embed(hp_runner *r, const hp__step *s, step_w *w, struct hp__bio *b, hp_err *err);
hp_status hp__bwd_norm(hp_runner *r, const hp__step *s, step_w *w, struct hp__bio *b, hp_err *err);
hp_status hp__bwd_attn(hp_runner *r, const hp__step *s, step_w *w, struct hp__bio *b, hp_err *err);
hp_status hp__bwd_mlp(hp_runner *r, const hp__step *s, step_w *w, struct hp__bio *b, hp_err *err);
hp_status hp__bwd_moe(hp_runner *r, const hp__step *s, step_w *w, struct hp__bio *b, hp_err *err);
hp_status hp__bwd_residual(hp_runner *r, const hp__step *s, step_w *w, struct hp__bio *b, hp_err *err);
hp_status hp__bwd_head(hp_runner *r, const hp__step *s, step_w *w, struct hp__bio *b, hp_err *err);
hp_status hp__bwd_loss(hp_runner *r, const hp__step *s, step_w *w, struct hp__bio *b, hp_err *err);

#endif
