/*
 * forward.c — the workspace and the one-process composition of the stages (hp_moe_forward).
 *
 * The workspace is sized once for max_tokens (Tmax) tokens; a forward call allocates nothing:
 *
 *   route ─▶ [balanced] ─▶ [capacity] ─▶ dispatch_prepare ─▶ gather ─▶ experts_forward (in place)
 *         ─▶ combine ─▶ shared_forward
 *
 * The MPI runtime calls the same stages with the all-to-all exchanges between dispatch and experts and
 * between experts and combine; nothing here is specific to one process except the check that every expert
 * is local.
 */
#include "moe/moe_internal.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* What a workspace owns even when it runs on another's arrays: its backward and its layer's linears. */
static void free_layer_objects(hp_moe_ws *ws)
{
    hp__moe_bwd_free(ws->bwd);
    hp_linear_free(ws->lin_gate_up);
    hp_linear_free(ws->lin_down);
    hp_linear_free(ws->lin_sh_gate_up);
    hp_linear_free(ws->lin_sh_down);
    hp_linear_free(ws->lin_sh_gate);
}

void hp_moe_ws_destroy(hp_moe_ws *ws)
{
    if (!ws) return;
    if (ws->share) { /* the arrays and the context are the owner's */
        free_layer_objects(ws);
        free(ws);
        return;
    }
    free(ws->x64);
    free(ws->logits);
    free(ws->sel);
    free(ws->topk_idx);
    free(ws->topk_w);
    free(ws->keep);
    free(ws->cap_scratch);
    free(ws->counts);
    free(ws->offsets);
    free(ws->row_slot);
    free(ws->slot_row);
    free(ws->rows);
    free(ws->act);
    free(ws->shared_act);
    free(ws->shared_out);
    free(ws->shared_g);
    free_layer_objects(ws);
    hp_linalg_destroy(ws->la);
    free(ws->groups);
    free(ws->pass_row0);
    free(ws);
}

void *hp__moe_alloc(int64_t n, size_t sz, bool *ok)
{
    size_t bytes;
    if (!*ok || n < 0 || !hp_mul_size((size_t)n, sz, &bytes)) {
        *ok = false;
        return NULL;
    }
    void *p = hp_calloc(bytes ? bytes : 1, 1);
    if (!p) *ok = false;
    return p;
}

/* One linear of the workspace: n_mats matrices [n, k] of dtype at w (borrowed from the layer). */
static hp_status linear(hp_linear **out, hp_linalg *la, const hp_moe_layer *l, int64_t n_mats, int64_t n, int64_t k,
                        hp_dtype dtype, const void *w, const float *bias, hp_err *err)
{
    hp_linear_desc d = {.n_out = n, .n_in = k, .n_mats = n_mats, .dtype = dtype, .w = w, .bias = bias,
                        .mode = l->compute, .pack = HP_LINEAR_PACK_AUTO};
    return hp_linear_init(out, la, &d, err);
}

/* The GEMM layer's objects for the layer's products: the local experts' gate/up [n_local, 2I, H] and down
 * [n_local, H, I] in the layer's weight dtype, the shared expert's [2sI, H] and [H, sI] and its gate [1, H]. */
static hp_status linears_init(hp_moe_ws *ws, const hp_moe_layer *l, hp_err *err)
{
    int64_t H = l->n_hidden, I = l->d_expert, sI = l->d_shared, n = l->n_local;
    hp_status st = ws->la ? HP_OK : hp_linalg_create(&ws->la, err); /* a sharing workspace borrows the owner's */
    if (st == HP_OK && (!l->w_gate_up || !l->w_down))
        st = hp_err_set(err, HP_ERR_INPUT, "the layer has no expert weights");
    if (st == HP_OK)
        st = linear(&ws->lin_gate_up, ws->la, l, n, 2 * I, H, l->w_dtype, l->w_gate_up, l->b_gate_up, err);
    if (st == HP_OK) st = linear(&ws->lin_down, ws->la, l, n, H, I, l->w_dtype, l->w_down, l->b_down, err);
    if (st == HP_OK && sI > 0 && l->ws_gate_up && l->ws_down) {
        st = linear(&ws->lin_sh_gate_up, ws->la, l, 1, 2 * sI, H, HP_DT_F32, l->ws_gate_up, NULL, err);
        if (st == HP_OK) st = linear(&ws->lin_sh_down, ws->la, l, 1, H, sI, HP_DT_F32, l->ws_down, NULL, err);
        if (st == HP_OK && l->ws_gate) st = linear(&ws->lin_sh_gate, ws->la, l, 1, 1, H, HP_DT_F32, l->ws_gate, NULL, err);
    }
    if (st != HP_OK) hp_err_prefix(err, "layer %lld: preparing its products", (long long)l->layer);
    return st;
}

hp_status hp_moe_ws_create(hp_moe_ws **out, const hp_moe_layer *l, int64_t max_tokens, hp_err *err)
{
    hp_moe_ep_shape s = hp__moe_shape_of(l, max_tokens);
    return hp__moe_ws_make(out, l, &s, err);
}

/* The workspace's fields from p, indexed by hp_moe_arr_id (NULL where its layout has no such array). */
static void ws_bind(hp_moe_ws *ws, void *const p[HP_MOE_ARR_COUNT])
{
    ws->x64 = p[HP_MOE_ARR_X64];
    ws->logits = p[HP_MOE_ARR_LOGITS];
    ws->sel = p[HP_MOE_ARR_SEL];
    ws->topk_idx = p[HP_MOE_ARR_TOPK_IDX];
    ws->topk_w = p[HP_MOE_ARR_TOPK_W];
    ws->keep = p[HP_MOE_ARR_KEEP];
    ws->cap_scratch = p[HP_MOE_ARR_CAP_SCRATCH];
    ws->counts = p[HP_MOE_ARR_COUNTS];
    ws->offsets = p[HP_MOE_ARR_OFFSETS];
    ws->row_slot = p[HP_MOE_ARR_ROW_SLOT];
    ws->slot_row = p[HP_MOE_ARR_SLOT_ROW];
    ws->rows = p[HP_MOE_ARR_ROWS];
    ws->act = p[HP_MOE_ARR_ACT];
    ws->groups = p[HP_MOE_ARR_GROUPS];
    ws->pass_row0 = p[HP_MOE_ARR_PASS_ROW0];
    ws->shared_act = p[HP_MOE_ARR_SHARED_ACT];
    ws->shared_out = p[HP_MOE_ARR_SHARED_OUT];
    ws->shared_g = p[HP_MOE_ARR_SHARED_G];
}

hp_status hp__moe_ws_make(hp_moe_ws **out, const hp_moe_layer *l, const hp_moe_ep_shape *s, hp_err *err)
{
    *out = NULL;
    int64_t T = s->max_tokens, H = l->n_hidden, E = l->n_experts, K = l->top_k, I = l->d_expert, sI = l->d_shared;
    if (T < 1 || H < 1 || E < 1 || K < 1 || K > E || l->n_local < 1 || l->n_local > E || I < 1 || sI < 0)
        return hp_err_set(err, HP_ERR_INPUT,
                          "workspace for %lld tokens of a layer with H %lld, E %lld, K %lld, %lld local experts of "
                          "width %lld: every count must be positive (K and the local experts at most E)",
                          (long long)T, (long long)H, (long long)E, (long long)K, (long long)l->n_local, (long long)I);
    /* Slot and row indices are int32 (row_slot, slot_row) and BLAS takes int dimensions and leading
     * dimensions (H, E, 2I, 2sI, and chunks of at most T rows); every array's count must fit (its layout). */
    hp_moe_ep_array a[HP_MOE_ARR_COUNT];
    int n = hp_moe_ep_layout(s, a);
    int64_t slots, rows_f;
    bool fits = H <= INT32_MAX && E <= INT32_MAX && I <= INT32_MAX / 2 && sI <= INT32_MAX / 2 &&
                hp_mul_i64(T, K, &slots) && slots <= INT32_MAX && hp_mul_i64(slots, H, &rows_f);
    for (int i = 0; i < n; i++) fits = fits && (a[i].id >= HP_MOE_ARR_EP_FIRST || a[i].n != INT64_MAX);
    if (!fits)
        return hp_err_set(err, HP_ERR_INPUT,
                          "workspace for %lld tokens of a layer with H %lld, E %lld, K %lld, I %lld: too large "
                          "(tokens x top_k must stay below 2^31, H, E and 2I below 2^31 for BLAS, and every buffer "
                          "size must fit)",
                          (long long)T, (long long)H, (long long)E, (long long)K, (long long)I);
    hp_moe_ws *ws = hp_calloc(1, sizeof *ws);
    if (!ws) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    ws->max_tokens = T;
    ws->row_tokens = hp__moe_ep_row_tokens(s);
    ws->n_hidden = l->n_hidden;
    ws->n_experts = l->n_experts;
    ws->top_k = l->top_k;
    ws->n_local = l->n_local;
    ws->d_expert = l->d_expert;
    ws->d_shared = l->d_shared;
    ws->fwd_tokens = -1;
    ws->act_rows = ws->row_tokens * K;
    void *p[HP_MOE_ARR_COUNT] = {0};
    bool ok = hp__moe_alloc_layout(a, n, HP_MOE_ARR_X64, HP_MOE_ARR_EP_FIRST, p, &ws->bytes);
    ws_bind(ws, p);
    if (!ok) {
        hp_moe_ws_destroy(ws);
        char b[32];
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory creating an MoE workspace for %lld tokens (%s of rows)",
                          (long long)T, hp_format_bytes((uint64_t)rows_f * sizeof(float), b, sizeof b));
    }
    hp_status st = linears_init(ws, l, err);
    if (st != HP_OK) {
        hp_moe_ws_destroy(ws);
        return st;
    }
    *out = ws;
    return HP_OK;
}

hp_status hp__moe_ws_share(hp_moe_ws **out, const hp_moe_layer *l, hp_moe_ws *owner, hp_err *err)
{
    *out = NULL;
    if (owner->share) owner = owner->share;
    hp_moe_ws *ws = hp_calloc(1, sizeof *ws);
    if (!ws) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    *ws = *owner; /* the arrays, the context and the shapes; nothing of the owner's own */
    ws->share = owner;
    ws->last_fwd = NULL;
    ws->bytes = 0;
    ws->bwd = NULL;
    ws->fwd_tokens = -1;
    ws->fwd_keep = ws->fwd_balanced = false;
    ws->lin_gate_up = ws->lin_down = ws->lin_sh_gate_up = ws->lin_sh_down = ws->lin_sh_gate = NULL;
    memset(&ws->stats, 0, sizeof ws->stats);
    hp_status st = linears_init(ws, l, err);
    if (st != HP_OK) {
        hp_moe_ws_destroy(ws);
        return st;
    }
    *out = ws;
    return HP_OK;
}

hp_status hp_moe_forward(const hp_moe_layer *l, hp_moe_ws *ws, const float *x, int64_t n_tokens, int64_t n_hidden,
                         float *y, const hp_moe_run_opts *opts, hp_err *err)
{
    static const hp_moe_run_opts none = {0};
    if (!opts) opts = &none;
    int64_t T = n_tokens, H = l->n_hidden, K = l->top_k;
    if (n_hidden != H)
        return hp_err_set(err, HP_ERR_INPUT,
                          "input x has %lld columns but layer %lld (%s) has hidden size %lld; pass the "
                          "post-attention hidden states of this model",
                          (long long)n_hidden, (long long)l->layer, l->prefix, (long long)H);
    if (l->first_expert != 0 || l->n_local != l->n_experts)
        return hp_err_set(err, HP_ERR_INPUT,
                          "hp_moe_forward runs every expert in one process, but this layer holds experts [%lld, %lld) "
                          "of %lld; use the stage functions with an exchange between them",
                          (long long)l->first_expert, (long long)(l->first_expert + l->n_local),
                          (long long)l->n_experts);
    if (T < 0 || T > ws->max_tokens)
        return hp_err_set(err, HP_ERR_INPUT, "%lld tokens exceed the workspace's %lld; create it for more",
                          (long long)T, (long long)ws->max_tokens);
    hp_status st = opts->caller_checks_finite ? HP_OK : hp_moe_check_finite(x, T, H, "input x", err);
    if (st) return st;
    memset(&ws->stats, 0, sizeof ws->stats);
    ws->stats.n_tokens = T;
    ws->stats.n_slots = T * K;
    /* What the backward needs to know of this forward's routing (valid once routing succeeded). */
    ws->fwd_tokens = -1;
    ws->fwd_keep = opts->capacity_factor > 0;
    ws->fwd_balanced = opts->balanced_router;
    if ((st = hp_moe_route(l, ws, x, T, ws->topk_idx, ws->topk_w, err))) return st;
    if (opts->balanced_router &&
        (st = hp_moe_route_balance(ws->topk_idx, ws->topk_w, T, K, l->n_experts, l->n_local, err)))
        return st;
    const uint8_t *keep = NULL;
    if (opts->capacity_factor > 0) {
        if ((st = hp_moe_capacity(ws->topk_idx, ws->topk_w, T, K, l->n_experts, opts->capacity_factor, opts->policy,
                                  ws->keep, ws->cap_scratch, &ws->stats.n_dropped, &ws->stats.capacity, err)))
            return st;
        keep = ws->keep;
    }
    ws->fwd_tokens = T;
    int64_t n = hp_moe_dispatch_prepare(ws->topk_idx, keep, T, K, l->first_expert, l->n_local, ws->counts,
                                        ws->offsets, ws->row_slot, ws->slot_row);
    ws->stats.n_rows = n;
    for (int64_t e = 0; e < l->n_local; e++) ws->stats.n_active += ws->counts[e] > 0;
    hp_moe_gather(x, H, K, ws->row_slot, n, ws->rows);
    if ((st = hp_moe_experts_forward(l, ws, ws->rows, ws->counts, ws->rows, err))) return st;
    hp_moe_combine(ws->rows, ws->slot_row, ws->topk_w, T, K, H, y);
    if ((st = hp_moe_shared_forward(l, ws, x, T, y, err))) return st;
    if (opts->caller_checks_finite) return HP_OK;
    return hp__moe_check_output(l, x, y, T, ws->topk_idx, ws->topk_w, keep, opts->row_base, err);
}
