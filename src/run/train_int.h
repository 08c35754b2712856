/*
 * train_int.h — internal to src/run: the training state of a runner (train.c: parameters, gradients, AdamW) and
 * what the backward of each op reads (bwd.c).
 */
#ifndef HP_RUN_TRAIN_INT_H
#define HP_RUN_TRAIN_INT_H

#include "run/runner_int.h"

/* What a step's backward reads besides its weights and the gradients in the training state: the batch, and the
 * step's forward values, either the forward's own (outside the layers) or the recompute's (src/run/bwd.c). */
typedef struct hp__bio {
    const int64_t *ids;
    const uint8_t *mask;        /* the loss's targets (hp__fio.mask), or NULL: all */
    int64_t S;
    const hp__act *hin;         /* NORM: its input, the stream as it arrived */
    const hp__act *tin;         /* a module, HEAD: its input on the layout it ran on */
    const float *buf[HP__NBUF]; /* a module: its intermediates (hp__step_row_widths) */
} hp__bio;

/* The kinds of an MoE block's arrays: how their gradients are summed over the mesh (reduce_grads). */
typedef enum {
    K_DENSE,  /* a dense slice */
    K_EXPERT, /* routed experts: summed over the expert-data-parallel group */
    K_BDOWN,  /* gpt-oss's expert down bias: the same, but held by tp rank 0 alone when tp cuts the experts */
    K_ROUTER, /* the router, its bias, Qwen2-MoE's shared gate: whole on every rank */
    K_SHARED  /* the shared expert: whole, or cut over tp with the experts */
} tkind;

/* One trainable parameter slice of the rank: its values (what AdamW updates), its gradient and AdamW's moments,
 * and how its gradient is summed over the ranks. A dense slice is summed over each mesh axis whose ranks
 * computed it from other rows, once; an MoE block's routed experts over the ranks that hold the same experts
 * (the expert-data-parallel group), scaled by how often those ranks saw each row. */
typedef struct tparam {
    hp__w *w;        /* a dense slice, or NULL: an array of an MoE layer object */
    float *data;     /* what AdamW updates: w->d, the layer's f32 array, or the router's f32 master */
    double *wide;    /* the router's f64 copy the forward reads (rewritten after each update), or NULL */
    bool b16;        /* stored as bf16: data is its f32 master (what trains; what the forward reads, or in BF16
                        compute the bf16 copy w->d the products would round it to anyway) */
    bool own;        /* data is this entry's own array (the router's master, a bf16 slice's master) */
    int64_t n;
    int moe;         /* 1 + the index of its MoE block in t->moe; 0: dense */
    int slot;        /* an MoE array: which of the block's (add_moe's table: gate_up, down, b_gate_up, b_down,
                        router, b_router, shared gate_up, shared down, shared gate) */
    tkind kind;
    char name[200];  /* dense: the checkpoint's name */
    float *g, *m, *v;
    bool own_g;      /* g is this entry's (an MoE array's lives in its block's hp_moe_grads) */
    bool in_flat;    /* g lies in the training state's flat array (its cp and dp sums one call for all) */
    /* ZeRO-1: this rank's block [zlo, zlo + zn) of the optimizer state over zc (dp, or the expert-data-parallel
     * group for experts); zc NULL: the whole state */
    const hp_comm *zc;
    int64_t zlo, zn, zblk;
    bool sum_dp, sum_cp, sum_tp;
    bool tied_pp;    /* the tied embedding under a pipeline: held by the first and the last stage, its gradient the
                        sum of both (the embedding's and the head's) */
} tparam;

/* An MoE block of the rank in training: its gradients, and the expert-data-parallel group of its experts. */
typedef struct tmoe {
    int64_t layer;
    moe_w *m;
    hp_moe_grads *g;
    hp_comm *edp;    /* the ranks holding the same experts (and the same tp block when cut) */
    double escale;   /* 1 / how many times that group's EP groups saw each row */
} tmoe;

typedef struct hp__train {
    hp__ctx *ctx; /* the runner's: every buffer of the backward is counted in ctx->mem */
    tparam *p;
    int n, cap;
    tmoe *moe;
    int n_moe;
    float *flat;  /* the dense gradients summed over cp and dp, one after another in registration order (train.c's
                     flatten_grads; NULL: none) */
    int64_t flat_n;
    int64_t step; /* AdamW steps taken */
    int zero;     /* the ZeRO stage of the optimizer state (0 or 1), fixed at the first step */
    int pending;  /* micro-batches accumulated since the last apply */
    int64_t scored; /* the scored positions the step's loss is the mean over */
    double fwd_s, bwd_s, bwd_comm_s; /* summed over the step's micro-batches */
    hp__act dh, dt, da, x, h1, dk, dv; /* gradients; the recompute's stream (h1) */
    bool dh_live;                      /* dh holds the stream's gradient (a norm's backward adds into it) */
    float *f[HP__NBWD];                /* the backward's scratch blocks (hp__step_bwd_widths) */
    size_t fcap[HP__NBWD];
    /* the recompute of a layer: per position in the layer, what a later step of the layer would overwrite */
    hp__bio *src;                      /* [n_pos] what each step's backward reads */
    hp__act *sv_h, *sv_t;              /* [n_pos] a norm's input stream, a module's input */
    float **sv_buf;                    /* [n_pos · HP__NBUF] a module's intermediates */
    size_t *sv_cap;
    int n_pos;
    bool grads; /* the gradients of a step are in p[].g */
} hp__train;

/* *buf grown to at least n floats (kept across steps; *cap its floats; counted in t->ctx), or NULL and err. */
float *hp__t_grow(hp__train *t, float **buf, size_t *cap, int64_t n, hp_err *err);
/* Scratch block i of at least n floats, kept across steps. */
float *hp__t_fbuf(hp__train *t, int i, int64_t n, hp_err *err);
/* The gradient of a registered slice (NULL: not trained), and its values as the backward multiplies by them. */
float *hp__t_grad(const hp_runner *r, const hp__w *w);
const float *hp__t_w32(const hp_runner *r, const hp__w *w);
/* The training block of the MoE step of layer, or NULL. */
tmoe *hp__t_moe(const hp_runner *r, int64_t layer);
/* The backward of the program's steps in reverse, from the gradient of the loss (bwd.c). */
hp_status hp__backward(hp_runner *r, const int64_t *ids, const uint8_t *mask, int64_t S, hp_err *err);
/* The backward of steps [lo, hi) in reverse (whole layers: a pipeline chunk), from the gradient state as it is
 * (t->dh the stream's when t->dh_live). */
hp_status hp__backward_steps(hp_runner *r, const int64_t *ids, const uint8_t *mask, int64_t S, size_t lo, size_t hi,
                             hp_err *err);
/* A micro-batch's (or a pipeline step's) start: the training state made (agreed over every rank), the buffers
 * released, the gradients zeroed at a step's first. Its end: every buffer freed (the count checked back at 0),
 * agreed, n_micro more micro-batches pending, the times added. */
hp_status hp__train_begin(hp_runner *r, hp_err *err);
hp_status hp__train_end(hp_runner *r, hp_status st, int64_t n_micro, double fwd_s, double bwd_s, double bwd_comm_s,
                        hp_err *err);
/* Frees the backward's buffers (gradients, scratch blocks, the recompute's copies), uncounting them; the state
 * stays usable: the next backward allocates them again. */
void hp__bwd_release(hp__train *t);

#endif
