/*
 * exec/prog.h — the forward pass of a plan as a program: the steps every rank executes, in order, each with
 * the layouts its activation arrives in, runs on, is computed in and leaves in, the module's local dims and
 * its MoE settings. Built once from (model, plan, mesh) by hp__prog_build; the runner executes it
 * (src/run/runner.c), cost walks it for any rank (src/cost/cost.c), and the backward pass walks it in reverse.
 * The layouts are the same on every rank (a rank's block and bytes follow from them by exec/layout.h).
 * A plan the runtime cannot execute is refused here, once, with the reason (docs/design.md, "The program").
 * Pure: no MPI, no data, no linalg.
 */
#ifndef HP_EXEC_PROG_H
#define HP_EXEC_PROG_H

#include "exec/layout.h"
#include "exec/rcfg.h"

typedef enum hp__op {
    HP__OP_EMBED,    /* ids -> h: the embedding (vocab-parallel when split: a partial sum over tp) */
    HP__OP_NORM,     /* h -> t: RMSNorm, through its boundary when the plan has one */
    HP__OP_ATTN,     /* t -> a: attention with GQA, rope, masks, sinks */
    HP__OP_MLA,      /* t -> a: DeepSeek-V3's multi-head latent attention */
    HP__OP_MLP,      /* t -> a: the SwiGLU MLP */
    HP__OP_MOE,      /* t -> a: the sparse block (router, routed experts, shared expert) */
    HP__OP_RESIDUAL, /* h += a, a first brought to h's layout */
    HP__OP_HEAD,     /* t -> z: lm_head (tied: the embedding's slice under the column-parallel contract) */
    HP__OP_LOSS,     /* z -> the mean next-token cross-entropy (vocab-parallel when z is split over tp) */
    HP__OP_COUNT
} hp__op;

typedef struct hp__step {
    hp__op op;
    int32_t layer;      /* the decoder layer, -1 outside them */
    bool keep;          /* NORM: h here is a layer's input (the final norm's: layer L), what a backward keeps */
    bool ends_layer;    /* RESIDUAL: the stream after it is the layer's output */
    hp__contract c;     /* c.fqn: the module (a residual: the branch it adds), a string of the plan, the model or
                           a constant (it outlives the program); has_in/has_out as the boundary declares */
    hp__lay in;         /* the layout the input arrives in */
    hp__lay run;        /* the layout the computation runs on: c.in_dst when declared, else in */
    hp__lay out;        /* the layout the computation gives, from its weights' placements (= c.out_src) */
    hp__lay leave;      /* after the exit: c.out_dst when declared, else out; RESIDUAL: the stream's layout */
    int64_t X;          /* the output's global width */
    bool split;         /* tp cuts the module: heads, intermediate, vocabulary, or the experts' columns */
    int64_t nh, nkv;    /* attention: local query / kv heads */
    int64_t kw, vw;     /* attention: local K and V widths per token */
    int64_t I;          /* MLP: the local intermediate width */
    bool fused;         /* MLP: one gate_up_proj */
    bool qk_norm;       /* ATTN: a q_norm or k_norm (Qwen3's), whose backward recomputes its input */
    bool bias_deferred; /* o_proj / down_proj bias added after the exit (D-08) */
    int archetype;      /* MoE: the boundary's hp_moe_archetype, -1: the family's own */
    double cf;          /* MoE: the capacity factor (0: off) */
    bool overlap;       /* MoE: the plan hides the shared expert behind the exchange */
    int32_t chunk;      /* the pipeline chunk it runs in (hp_plan.pipe): the embedding 0, a layer's its layer's,
                           the final norm, head and loss the last; 0 without a pipeline */
} hp__step;

/* DeepSeek-V3's latent attention dims (config.json; 0 for the other families). */
typedef struct hp__mla {
    int64_t nope, rope, vd; /* per head: q/k channels without and with rope, v channels */
    int64_t ql, kvl;        /* q_lora_rank (0: q_proj), kv_lora_rank */
} hp__mla;

typedef struct hp__prog {
    hp__rcfg cfg;
    hp__mla mla;
    int64_t tp, cp, dp, ep; /* the mesh's tp and cp sizes, the batch blocks (hp_mesh_batch_split), the EP size */
    bool embed_split;       /* the embedding's rows (vocabulary) are cut over tp */
    bool tied;              /* no lm_head.weight: the head is the embedding's slice */
    bool head_split;        /* the head's rows (vocabulary) are cut over tp */
    bool head_chunks;       /* the head runs on rows whole over tp and its exit moves the vocabulary's tp placement
                               only: lm_head and the loss can run one row chunk at a time (hp__mlp_chunk_end) when
                               the logits are not handed on (hp_run_opts.no_logits; cost's inference) */
    hp__lay stream;         /* the residual stream's layout (the embedding's exit) */
    hp__step *steps;
    size_t n_steps;
    const char *moe_whole;  /* the first sparse block whose input is whole on tp > 1 (every tp rank runs every
                               token's experts: Megatron's warning), else NULL */
} hp__prog;

/* The program of (m, p) on mesh (NULL: the plan's own). Another mesh (advise) evaluates the plan's contracts
 * there: an axis of size 1 places nothing, and the plan's TP-local attributes are not compared. label names
 * config.json in messages (NULL: the model's path). HP_ERR_INPUT with the reason for a model or plan the runtime
 * cannot execute; g is then empty. */
hp_status hp__prog_build(hp__prog *g, const hp_model *m, const hp_plan *p, const hp_mesh *mesh, const char *label,
                         hp_err *err);
void hp__prog_free(hp__prog *g);

/* Whether step s runs on rows split over the axis whose placement is p (SP's sequence, CP's blocks). */
bool hp__rows_split(hp_placement p);
/* Whether the gradient of a parameter of step s is summed over tp after the backward (hyperpar train does it; cost
 * counts it): tp > 1, the parameter not cut over tp, and s runs on rows split over tp (SP), or tp_partial (tp cuts
 * the module but not the parameter: each rank's heads give a part of the q/k norms' gradients). */
bool hp__grad_sum_tp(const hp__step *s, int64_t tp, bool cut, bool tp_partial);
/* ---- each op's parameters: one table (prog.c) that the runner's load, training's registration and cost read ----
 *
 * An op's entries in the order training registers them (its optimizer state's order). A slot names the runtime's
 * tensor of the op (the runner maps it to its field); flags say when the entry applies and how it trains. */
enum {
    HP__P_OPT = 1,        /* optional: a checkpoint may lack it */
    HP__P_VEC = 2,        /* a vector of hp__pdef.len values (else a matrix, or the embedding's table) */
    HP__P_TP_PARTIAL = 4, /* whole on every tp rank while tp cuts the module (hp__step.split): it feeds only the
                             rank's heads, so its gradient is a partial sum over tp (q/k norms, MLA's latents) */
    HP__P_QLORA = 8,      /* MLA with q_lora_rank > 0 only */
    HP__P_NO_QLORA = 16,  /* MLA without q_lora_rank only */
    HP__P_FUSED = 32,     /* an MLP with one gate_up_proj only */
    HP__P_UNFUSED = 64    /* an MLP with gate_proj and up_proj only */
};
typedef enum hp__plen {
    HP__LEN_NONE, /* a matrix */
    HP__LEN_H,    /* hidden_size */
    HP__LEN_Q,    /* the local query heads x head_dim */
    HP__LEN_KV,   /* the local kv heads x head_dim */
    HP__LEN_HD,   /* head_dim */
    HP__LEN_HEADS,/* the local query heads */
    HP__LEN_QL,   /* q_lora_rank */
    HP__LEN_KVL,  /* kv_lora_rank */
    HP__LEN_I,    /* the local intermediate width */
    HP__LEN_2I    /* twice it (a fused gate|up bias) */
} hp__plen;
typedef enum hp__pslot {
    HP__PS_W,                                       /* NORM, EMBED, HEAD: the weight (table) */
    HP__PS_Q, HP__PS_K, HP__PS_V, HP__PS_O,         /* attention's projections (MLA: q is q_b_proj or q_proj) */
    HP__PS_BQ, HP__PS_BK, HP__PS_BV, HP__PS_BO,     /* their biases */
    HP__PS_QN, HP__PS_KN, HP__PS_SINKS,             /* q/k norms, gpt-oss's sinks */
    HP__PS_QA, HP__PS_QAN, HP__PS_KVA, HP__PS_KVAN, HP__PS_KVB, /* MLA's latent path */
    HP__PS_GU, HP__PS_BGU, HP__PS_G, HP__PS_BG, HP__PS_U, HP__PS_BU, HP__PS_D, HP__PS_BD /* the MLP */
} hp__pslot;
typedef struct hp__pdef {
    const char *rel; /* the name relative to the module */
    hp__pslot slot;
    unsigned flags;
    hp__plen len;
} hp__pdef;
/* op's entries (n of them; MOE and RESIDUAL, LOSS: none — an MoE block's tensors are the moe module's). */
const hp__pdef *hp__op_params(hp__op op, size_t *n);
/* Whether entry d applies to step s of g (q_lora, fused). */
bool hp__pdef_on(const hp__pdef *d, const hp__prog *g, const hp__step *s);

/* The sequence as the ranks hold it: padded to a multiple of 2·cp (the load-balanced halves) when cp > 1; false
 * past 64 bits. */
bool hp__seq_pad(int64_t S, int64_t cp, int64_t *S_pad);
/* rows[0..dp]: replica i holds batch rows [rows[i], rows[i+1]) of B. */
void hp__dp_rows(int64_t B, int64_t dp, int64_t *rows);
/* The module buffers a step's computation sizes (attention's q and output, MLA's latent block, the MLP's gate/up
 * and hidden), in floats per local token row, for the rank at tp index ti: the runner allocates them so and cost
 * counts them so. 0: the step does not use that buffer. */
enum { HP__NBUF = 4 };
void hp__step_row_widths(const hp__prog *g, const hp__step *s, int64_t ti, int64_t w[HP__NBUF]);
/* A module between boundaries: attention (GQA, MLA), the MLP, the sparse block. */
bool hp__op_is_module(hp__op op);
/* The backward's recompute of a layer runs steps [i, e) forward again: whether a step of (i, e) overwrites what
 * step i's backward reads (src/run/bwd.c): the stream (op RESIDUAL, buf -1), a module's input (op NORM, buf -1),
 * or module buffer buf of step i (a later module that sizes it; ti the rank's tp index). What it overwrites, the
 * recompute saves: the backward allocates those copies and cost counts them by this one rule. */
bool hp__recompute_overwrites(const hp__prog *g, size_t i, size_t e, hp__op op, int buf, int64_t ti);
/* The backward's scratch blocks a module step takes (src/run/bwd.c reserves them at its backward's start, cost
 * counts them so), in floats per local token row, for the rank at tp index ti; 0: not used. Attention: the output's
 * and q's gradients, the q/k norms' input, a projection's dx; MLA: the output's and q's gradients, the latent
 * block's gradients, kv_b's input gradient then a projection's dx, -, the latent norms' input; the MLP: the
 * hidden's and gate|up's gradients, -, up's dx (unfused). */
enum { HP__NBWD = 6 };
void hp__step_bwd_widths(const hp__prog *g, const hp__step *s, int64_t ti, int64_t w[HP__NBWD]);
/* An MLP step's intermediate width on the rank at tp index ti: the shard layout's block when tp cuts it. */
int64_t hp__step_local_I(const hp__prog *g, const hp__step *s, int64_t ti);
/* The dense MLP's row chunks (a long prefill): the forward runs gate|up -> silu·mul -> down on one chunk of rows
 * at a time, so its buffers (hp__step_row_widths' 2 and 3) hold a chunk, not the sequence. The chunks start at
 * row 0 and every HP__MLP_CHUNK_ROWS rows after; the last one takes the rest when fewer than HP__MLP_CHUNK_ROWS +
 * HP__MLP_CHUNK_MIN rows remain (no chunk is shorter than HP__MLP_CHUNK_MIN unless the rows are). whole (a
 * training runner: its backward reads the recomputed intermediates of every row) makes one chunk of all rows.
 * hp__mlp_chunk_end is the end of the chunk that starts at r0; hp__mlp_chunk_rows the longest chunk, the rows the
 * buffers are sized for. The runner and cost both use them. */
enum { HP__MLP_CHUNK_ROWS = 1024, HP__MLP_CHUNK_MIN = 256 };
int64_t hp__mlp_chunk_end(int64_t rows, int64_t r0, bool whole);
int64_t hp__mlp_chunk_rows(int64_t rows, bool whole);
/* The number of chunks of rows (0 when there are none), in O(1). */
int64_t hp__mlp_chunk_count(int64_t rows, bool whole);

/* "embed", "norm", ... (traces and tests). */
const char *hp__op_name(hp__op op);

#endif
