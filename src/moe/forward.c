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

void hp_moe_ws_destroy(hp_moe_ws *ws)
{
    if (!ws) return;
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

hp_status hp_moe_ws_create(hp_moe_ws **out, const hp_moe_layer *l, int64_t max_tokens, hp_err *err)
{
    *out = NULL;
    int64_t T = max_tokens, H = l->n_hidden, E = l->n_experts, K = l->top_k, I = l->d_expert, sI = l->d_shared;
    if (T < 1 || H < 1 || E < 1 || K < 1 || K > E || l->n_local < 1 || l->n_local > E || I < 1 || sI < 0)
        return hp_err_set(err, HP_ERR_INPUT,
                          "workspace for %lld tokens of a layer with H %lld, E %lld, K %lld, %lld local experts of "
                          "width %lld: every count must be positive (K and the local experts at most E)",
                          (long long)T, (long long)H, (long long)E, (long long)K, (long long)l->n_local, (long long)I);
    /* Slot and row indices are int32 (row_slot, slot_row) and BLAS takes int dimensions and leading
     * dimensions (H, E, 2I, 2sI, and chunks of at most T rows); every buffer size is overflow-checked. */
    int n_threads = omp_get_max_threads() > 0 ? omp_get_max_threads() : 1;
    int64_t slots, rows_f, n_th, n_logits, n_act, n_sact, n_cap;
    bool fits = H <= INT32_MAX && E <= INT32_MAX && I <= INT32_MAX / 2 && sI <= INT32_MAX / 2 &&
                hp_mul_i64(T, K, &slots) && slots <= INT32_MAX && hp_mul_i64(slots, H, &rows_f) &&
                hp_mul_i64(T, H, &n_th) && hp_mul_i64(T, E, &n_logits) && hp_mul_i64(T, 2 * I, &n_act) &&
                hp_mul_i64(n_act, n_threads, &n_act) && hp_mul_i64(T, 2 * sI, &n_sact) &&
                (n_cap = hp_moe_capacity_scratch_count(T, K, E)) > 0;
    if (!fits)
        return hp_err_set(err, HP_ERR_INPUT,
                          "workspace for %lld tokens of a layer with H %lld, E %lld, K %lld, I %lld: too large "
                          "(tokens x top_k must stay below 2^31, H, E and 2I below 2^31 for BLAS, and every buffer "
                          "size must fit)",
                          (long long)T, (long long)H, (long long)E, (long long)K, (long long)I);
    hp_moe_ws *ws = hp_calloc(1, sizeof *ws);
    if (!ws) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    ws->max_tokens = max_tokens;
    ws->n_hidden = l->n_hidden;
    ws->n_experts = l->n_experts;
    ws->top_k = l->top_k;
    ws->n_local = l->n_local;
    ws->d_expert = l->d_expert;
    ws->d_shared = l->d_shared;
    bool ok = true;
    ws->x64 = hp__moe_alloc(n_th, sizeof(double), &ok);
    ws->logits = hp__moe_alloc(n_logits, sizeof(double), &ok);
    ws->sel = hp__moe_alloc(2 * E, sizeof(double), &ok);
    ws->topk_idx = hp__moe_alloc(slots, sizeof(int32_t), &ok);
    ws->topk_w = hp__moe_alloc(slots, sizeof(float), &ok);
    ws->keep = hp__moe_alloc(slots, 1, &ok);
    ws->cap_scratch = hp__moe_alloc(n_cap, sizeof(int32_t), &ok);
    ws->counts = hp__moe_alloc(l->n_local, sizeof(int64_t), &ok);
    ws->offsets = hp__moe_alloc(l->n_local + 1, sizeof(int64_t), &ok);
    ws->row_slot = hp__moe_alloc(slots, sizeof(int32_t), &ok);
    ws->slot_row = hp__moe_alloc(slots, sizeof(int32_t), &ok);
    ws->rows = hp__moe_alloc(rows_f, sizeof(float), &ok);
    ws->n_threads = n_threads;
    ws->act = hp__moe_alloc(n_act, sizeof(float), &ok);
    if (sI > 0) {
        ws->shared_act = hp__moe_alloc(n_sact, sizeof(float), &ok);
        ws->shared_out = hp__moe_alloc(n_th, sizeof(float), &ok);
    }
    if (!ok) {
        hp_moe_ws_destroy(ws);
        char b[32];
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory creating an MoE workspace for %lld tokens (%s of rows)",
                          (long long)T, hp_format_bytes((uint64_t)rows_f * sizeof(float), b, sizeof b));
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
    hp_status st = hp_moe_check_finite(x, T, H, "input x", err);
    if (st) return st;
    memset(&ws->stats, 0, sizeof ws->stats);
    ws->stats.n_tokens = T;
    ws->stats.n_slots = T * K;
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
    int64_t n = hp_moe_dispatch_prepare(ws->topk_idx, keep, T, K, l->first_expert, l->n_local, ws->counts,
                                        ws->offsets, ws->row_slot, ws->slot_row);
    ws->stats.n_rows = n;
    for (int64_t e = 0; e < l->n_local; e++) ws->stats.n_active += ws->counts[e] > 0;
    hp_moe_gather(x, H, K, ws->row_slot, n, ws->rows);
    if ((st = hp_moe_experts_forward(l, ws, ws->rows, ws->counts, ws->rows, err))) return st;
    hp_moe_combine(ws->rows, ws->slot_row, ws->topk_w, T, K, H, y);
    if ((st = hp_moe_shared_forward(l, ws, x, T, y, err))) return st;
    return hp__moe_check_output(l, x, y, T, ws->topk_idx, ws->topk_w, keep, opts->row_base, err);
}
