/*
 * moe_internal.h — internal to src/moe: the archetype records and helpers shared by the stage files.
 */
#ifndef HP_MOE_INTERNAL_H
#define HP_MOE_INTERNAL_H

#include "hyperpar/moe.h"

/* How the top-k weights of a softmax router are renormalised. */
typedef enum {
    HP__NORM_NEVER = 0,
    HP__NORM_ALWAYS,       /* Mixtral */
    HP__NORM_CONFIG,       /* config.json norm_topk_prob, false when absent (Qwen2/3-MoE, DeepSeek/GLM) */
    HP__NORM_DEFAULT_TRUE, /* config.json norm_topk_prob, true when absent (§10.3 default adapter) */
} hp__norm_rule;

#define HP__MOE_MAX_NEEDS 4

typedef struct hp__moe_archetype_info {
    const char *name;
    hp_moe_router_kind router;
    hp_moe_shared_kind shared;
    hp_moe_act act;
    hp__norm_rule norm;
    /* Child modules of the MoE block the interface assertion requires; "a|b" accepts either name. */
    const char *needs[HP__MOE_MAX_NEEDS];
} hp__moe_archetype_info;

const hp__moe_archetype_info *hp__moe_archetype_info_of(hp_moe_archetype a);

/* n zeroed elements of size sz, overflow-checked; on failure returns NULL and sets *ok false (a no-op
 * once *ok is false, so a run of allocations needs one check at the end). */
void *hp__moe_alloc(int64_t n, size_t sz, bool *ok);

/* layout.c: allocates, each by its entry and in their order, the arrays of a[0..n) whose ids are in [first, end)
 * into p[id] (the others untouched), adding the bytes of each one allocated to *bytes by hp_moe_ep_layout_bytes'
 * rule. false when one failed (the caller frees p's arrays, as it would its own). */
bool hp__moe_alloc_layout(const hp_moe_ep_array *a, int n, hp_moe_arr_id first, hp_moe_arr_id end,
                          void *p[HP_MOE_ARR_COUNT], size_t *bytes);
/* layout.c: the tokens one stage of the exchange holds (Th; 0 unless chunked) and those the per-row scratch
 * holds (Tr: T, or Th when bounded), as hp_moe_ep_layout counts them. */
int64_t hp__moe_ep_stage_tokens(const hp_moe_ep_shape *s);
int64_t hp__moe_ep_row_tokens(const hp_moe_ep_shape *s);
/* The rows an EP runtime's xrows holds (one process: T·K, its rows'): what its backward receives. */
int64_t hp__moe_ep_x_rows(const hp_moe_ep_shape *s);
/* Rows per chunk of the backward's recomputed expert and shared-expert products: bounds its scratch to a few
 * [chunk, 2·max(I, sI)] and [chunk, H] buffers whatever the token count. */
#define HP__MOE_BWD_CHUNK 256
/* layout.c: the shape of l's one-process workspace for max_tokens tokens (an EP runtime sets one_process false,
 * ep_size, chunks and bounded). */
hp_moe_ep_shape hp__moe_shape_of(const hp_moe_layer *l, int64_t max_tokens);

/* n zeroed floats / doubles, overflow-checked; NULL on failure. */
static inline float *hp__moe_alloc_f32(int64_t n)
{
    bool ok = true;
    return hp__moe_alloc(n, sizeof(float), &ok);
}

static inline double *hp__moe_alloc_f64(int64_t n)
{
    bool ok = true;
    return hp__moe_alloc(n, sizeof(double), &ok);
}

/* Allocations a layer owns besides the pointers of hp_moe_layer itself (hp_moe_layer.owned). */
typedef struct hp__moe_owned {
    void *w_gate_up, *w_down;   /* in the layer's w_dtype */
    float *b_gate_up, *b_down;
    struct hp_shard_rank_file *rf; /* a shard folder's rank file the expert weights point into, or NULL */
} hp__moe_owned;

/* Layer settings shared by the loader (load.c) and hp_moe_layer_create (layer.c). */
void hp__moe_layer_apply_archetype(hp_moe_layer *l, hp_moe_archetype a);
/* top_k, n_group and topk_group against n_experts; HP_ERR_INPUT naming the config key. */
hp_status hp__moe_layer_check_router(const hp_moe_layer *l, hp_err *err);
/* Sets the local range [first, first + n_local) (n_local 0: the rest); HP_ERR_INPUT when outside the layer. */
hp_status hp__moe_layer_set_range(hp_moe_layer *l, int64_t first, int64_t n_local, hp_err *err);

/* hp_moe_check_finite with rows numbered from row_base (router.c). */
hp_status hp__moe_check_finite_at(const float *x, int64_t n_tokens, int64_t n_hidden, const char *name,
                                  int64_t row_base, hp_err *err);
/* finite.c: a sentence naming the first non-finite weight the layer object holds (router, its bias, the local
 * experts, the shared expert) into buf; false when every one is finite. */
bool hp__moe_layer_weights_bad(const hp_moe_layer *l, char *buf, size_t cap);
/* finite.c: the index of the first non-finite of v[0..n), or -1. */
int64_t hp__moe_first_nonfinite(const float *v, int64_t n);
/* Expert output row out_row [H] of local expert e (input in_row [H]) is not finite: HP_ERR_INPUT naming the
 * expert, `whose` row ("a token of EP rank 1") and the cause (its non-finite weight, else the magnitudes). */
hp_status hp__moe_expert_nonfinite(const hp_moe_layer *l, int64_t e, const float *in_row, const float *out_row,
                                   const char *whose, hp_err *err);
/* HP_OK when y [T, H] is finite; otherwise HP_ERR_INPUT naming the first bad row (row_base + t) and its likely
 * cause: non-finite routing weights, a non-finite weight of a local expert the row used or of the shared
 * expert, else the input's and the routing weights' magnitudes. keep may be NULL. */
hp_status hp__moe_check_output(const hp_moe_layer *l, const float *x, const float *y, int64_t n_tokens,
                               const int32_t *topk_idx, const float *topk_w, const uint8_t *keep, int64_t row_base,
                               hp_err *err);

/* ---- backward.c ---- */

/* The backward's scratch of a workspace (hp_moe_ws.bwd): drows [rows_max, H] (dOut rows, then the experts'
 * outputs), dw [Tmax·K] and dlog [Tmax, E] in f64, chunk buffers for the recomputed products, and one
 * expert's weights widened to f32 when the layer holds bf16. */
typedef struct hp__moe_bwd {
    int64_t rows_max;
    size_t bytes; /* of the arrays (hp_moe_bwd_layout) */
    float *drows;
    double *dw, *dlog;
    float *g, *dg, *a, *da, *o, *dxc, *sdo;
    float *wgu, *wd;
} hp__moe_bwd;

/* The workspace of shape s for layer l (s: hp__moe_shape_of(l, T), and an EP runtime's settings): its arrays,
 * those of hp_moe_ep_layout(s) before HP_MOE_ARR_EP_FIRST — rows only in one process (an EP runtime gathers
 * into its own buffers), the per-row scratch (act, shared_*) for hp__moe_ep_row_tokens(s) tokens. */
hp_status hp__moe_ws_make(hp_moe_ws **out, const hp_moe_layer *l, const hp_moe_ep_shape *s, hp_err *err);
/* A workspace for layer l on owner's arrays and GEMM context (owner: one that owns them, or one that borrows
 * them, which stands for its owner); only l's linears are its own. The caller checks l's shapes against
 * owner's. Destroy it before the owner. */
hp_status hp__moe_ws_share(hp_moe_ws **out, const hp_moe_layer *l, hp_moe_ws *owner, hp_err *err);
void hp__moe_bwd_free(hp__moe_bwd *b);
/* ws->bwd, allocated by hp_moe_bwd_layout(s) (s: the shape ws was made for) unless it holds those rows already. */
hp_status hp__moe_bwd_get(hp_moe_ws *ws, const hp_moe_ep_shape *s, hp__moe_bwd **out, hp_err *err);
/* The last forward on ws routed n_tokens with the real router, and g fits l: else HP_ERR_INPUT. */
hp_status hp__moe_bwd_check(const hp_moe_layer *l, const hp_moe_ws *ws, int64_t n_tokens, const hp_moe_grads *g,
                            hp_err *err);
/* drows[i] = topk_w[s]·dy[s / K] for the slot s = row_slot[i] of each row. */
void hp__moe_dout_rows(const int32_t *row_slot, int64_t n_rows, const float *topk_w, int64_t top_k,
                       const float *dy, int64_t n_hidden, float *drows);
/* The local experts' backward on expert-major rows (counts [n_local]): rows holds X and receives dX, drows
 * holds dOut and receives the experts' outputs O (before weighting); g accumulates. */
hp_status hp__moe_experts_backward(const hp_moe_layer *l, hp__moe_bwd *b, float *rows, float *drows,
                              const int64_t *counts, hp_moe_grads *g, hp_err *err);
/* dx[t] += dX row of each kept slot of t; dw[s] = dy[t]·O row of slot s (0 for a dropped slot). */
void hp__moe_rows_to_dx(const float *dxrows, const int32_t *slot_row, int64_t n_tokens, int64_t top_k,
                        int64_t n_hidden, float *dx);
void hp__moe_rows_to_dw(const float *outrows, const int32_t *slot_row, int64_t n_tokens, int64_t top_k,
                        int64_t n_hidden, const float *dy, double *dw);
/* From b->dw [T, K] to the router's parameters and dx (+=), the logits recomputed in ws. */
void hp__moe_router_backward(const hp_moe_layer *l, hp_moe_ws *ws, hp__moe_bwd *b, const float *x, int64_t n_tokens,
                             float *dx, hp_moe_grads *g);
/* The shared expert's backward: dx (+=) and its gradients. */
hp_status hp__moe_shared_backward(const hp_moe_layer *l, hp__moe_bwd *b, const float *x, int64_t n_tokens,
                             const float *dy, float *dx, hp_moe_grads *g, hp_err *err);

#endif
