/*
 * router.c — the routers of spec §10.3 / hf_reference §3 and the balanced benchmark router of §10.4.
 *
 * All three kinds start from logits = x·W_rᵀ [T, E], computed in f64 (dgemm) so that the selection and the
 * weights agree with the f64 golden reference to ~1e-12 rather than f32's ~1e-6:
 *
 *   softmax top-k   p = softmax(logits); idx = top-k(p); w = p[idx]; if norm: w /= max(Σw, 1e-20)
 *   sigmoid group   s = σ(logits); c = s + b_corr (selection only); group score = sum of the top-2 c in
 *                   each of n_group contiguous blocks; keep topk_group groups; c = −inf elsewhere;
 *                   idx = top-k(c); w = s[idx]; if norm: w /= (Σw + 1e-20); w *= routed_scaling_factor
 *   top-k softmax   l = logits + b_r; idx = top-k(l); w = softmax(l[idx])   (gpt-oss)
 *
 * Every top-k (experts and groups) orders by value descending, ties to the lower index. Comparisons with a
 * NaN are false, so NaNs only perturb the order: every selection is still K distinct indices in range (the
 * loader refuses non-finite router weights; layers built in memory may hold anything). The K selected
 * (idx, w) pairs of a row are then sorted by expert id ascending, the order the golden files and the
 * combine stage use.
 */
#include "moe/moe_internal.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* idx[0..k) = the k largest of v[0..n), descending, ties to the lower index (v scanned ascending, a new value
 * moves ahead only of strictly smaller ones). */
static void topk_desc(const double *v, int64_t n, int64_t k, int32_t *idx)
{
    int64_t have = 0;
    for (int64_t i = 0; i < n; i++) {
        if (have == k && !(v[i] > v[idx[k - 1]])) continue;
        int64_t j = have < k ? have++ : k - 1;
        while (j > 0 && v[i] > v[idx[j - 1]]) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = (int32_t)i;
    }
}

/* Sorts the K pairs of one row by expert id ascending (insertion sort: K is small). */
static void sort_row(int32_t *idx, float *w, int64_t k)
{
    for (int64_t i = 1; i < k; i++) {
        int32_t e = idx[i];
        float x = w[i];
        int64_t j = i;
        for (; j > 0 && idx[j - 1] > e; j--) {
            idx[j] = idx[j - 1];
            w[j] = w[j - 1];
        }
        idx[j] = e;
        w[j] = x;
    }
}

static void route_softmax(const hp_moe_layer *l, double *row, int32_t *idx, float *w)
{
    int64_t E = l->n_experts, K = l->top_k;
    double mx = row[0], sum = 0.0;
    for (int64_t e = 1; e < E; e++) mx = row[e] > mx ? row[e] : mx;
    for (int64_t e = 0; e < E; e++) sum += (row[e] = exp(row[e] - mx));
    for (int64_t e = 0; e < E; e++) row[e] /= sum;
    topk_desc(row, E, K, idx);
    double ws = 0.0;
    for (int64_t j = 0; j < K; j++) ws += row[idx[j]];
    double div = l->norm_topk_prob ? (ws > 1e-20 ? ws : 1e-20) : 1.0;
    for (int64_t j = 0; j < K; j++) w[j] = (float)(row[idx[j]] / div);
}

static void route_sigmoid(const hp_moe_layer *l, double *row, double *sel, int32_t *idx, float *w)
{
    int64_t E = l->n_experts, K = l->top_k, G = l->n_group, per = E / G;
    double *gscore = sel + E;
    for (int64_t e = 0; e < E; e++) {
        row[e] = 1.0 / (1.0 + exp(-row[e]));
        sel[e] = row[e] + (l->b_correction ? l->b_correction[e] : 0.0);
    }
    if (G > 1 && l->topk_group < G) {
        for (int64_t g = 0; g < G; g++) {
            /* Sum of the top-2 biased scores of the group (HF's topk(2).sum()). */
            double a = -INFINITY, b = -INFINITY;
            for (int64_t e = g * per; e < (g + 1) * per; e++) {
                if (sel[e] > a) {
                    b = a;
                    a = sel[e];
                } else if (sel[e] > b) {
                    b = sel[e];
                }
            }
            double sc = per >= 2 ? a + b : a;
            /* +inf is the "kept" mark below, so a score must never equal it: an infinite score ranks as the
             * largest finite one (ties to the lower group), a NaN score (inf - inf) below every other. */
            gscore[g] = isnan(sc) ? -INFINITY : sc == INFINITY ? DBL_MAX : sc;
        }
        /* Keep the topk_group best groups (repeated arg-max: ties to the lower group), marked +inf. There
         * are topk_group < G rounds and one more unmarked group each round, so best is always found. */
        for (int64_t t = 0; t < l->topk_group; t++) {
            int64_t best = -1;
            for (int64_t g = 0; g < G; g++)
                if (gscore[g] != INFINITY && (best < 0 || gscore[g] > gscore[best])) best = g;
            gscore[best] = INFINITY;
        }
        for (int64_t g = 0; g < G; g++)
            if (gscore[g] != INFINITY)
                for (int64_t e = g * per; e < (g + 1) * per; e++) sel[e] = -INFINITY;
    }
    topk_desc(sel, E, K, idx);
    double ws = 0.0;
    for (int64_t j = 0; j < K; j++) ws += row[idx[j]];
    double div = l->norm_topk_prob ? ws + 1e-20 : 1.0;
    for (int64_t j = 0; j < K; j++) w[j] = (float)(row[idx[j]] / div * l->routed_scaling_factor);
}

static void route_topk_softmax(const hp_moe_layer *l, double *row, int32_t *idx, float *w)
{
    int64_t E = l->n_experts, K = l->top_k;
    if (l->b_router)
        for (int64_t e = 0; e < E; e++) row[e] += l->b_router[e];
    topk_desc(row, E, K, idx);
    double mx = row[idx[0]], sum = 0.0;
    for (int64_t j = 0; j < K; j++) sum += exp(row[idx[j]] - mx);
    for (int64_t j = 0; j < K; j++) w[j] = (float)(exp(row[idx[j]] - mx) / sum);
}

hp_status hp__moe_check_finite_at(const float *x, int64_t n_tokens, int64_t n_hidden, const char *name,
                                  int64_t row_base, hp_err *err)
{
    for (int64_t t = 0; t < n_tokens; t++)
        for (int64_t h = 0; h < n_hidden; h++)
            if (!isfinite(x[t * n_hidden + h]))
                return hp_err_set(err, HP_ERR_INPUT,
                                  "%s row %lld column %lld holds %s; the MoE layer needs finite inputs (check the "
                                  "producer of this tensor)",
                                  name, (long long)(row_base + t), (long long)h,
                                  isnan(x[t * n_hidden + h]) ? "NaN" : "Inf");
    return HP_OK;
}

hp_status hp_moe_check_finite(const float *x, int64_t n_tokens, int64_t n_hidden, const char *name, hp_err *err)
{
    return hp__moe_check_finite_at(x, n_tokens, n_hidden, name, 0, err);
}

hp_status hp_moe_route(const hp_moe_layer *l, hp_moe_ws *ws, const float *x, int64_t n_tokens, int32_t *topk_idx,
                       float *topk_w, hp_err *err)
{
    int64_t T = n_tokens, H = l->n_hidden, E = l->n_experts, K = l->top_k;
    if (T < 0 || T > ws->max_tokens)
        return hp_err_set(err, HP_ERR_INPUT, "%lld tokens exceed the workspace's %lld; create it for more",
                          (long long)T, (long long)ws->max_tokens);
    if (ws->n_experts != E || ws->n_hidden != H || ws->top_k != K)
        return hp_err_set(err, HP_ERR_INPUT, "the workspace was created for another layer shape");
    if (T == 0) return HP_OK;
    for (int64_t i = 0; i < T * H; i++) ws->x64[i] = x[i];
    hp_linalg_dgemm_nt(T, E, H, ws->x64, H, l->w_router, H, ws->logits, E);
    for (int64_t t = 0; t < T; t++) {
        double *row = ws->logits + t * E;
        int32_t *idx = topk_idx + t * K;
        float *w = topk_w + t * K;
        switch (l->router) {
        case HP_MOE_ROUTER_SOFTMAX_TOPK: route_softmax(l, row, idx, w); break;
        case HP_MOE_ROUTER_SIGMOID_GROUP: route_sigmoid(l, row, ws->sel, idx, w); break;
        case HP_MOE_ROUTER_TOPK_SOFTMAX: route_topk_softmax(l, row, idx, w); break;
        }
        sort_row(idx, w, K);
    }
    return HP_OK;
}

hp_status hp_moe_route_balance(int32_t *topk_idx, float *topk_w, int64_t n_tokens, int64_t top_k, int64_t n_experts,
                               int64_t n_local, hp_err *err)
{
    if (n_local < 1 || n_experts < n_local) /* Q = E / L below must be positive: it is a divisor */
        return hp_err_set(err, HP_ERR_INPUT,
                          "balanced router: %lld experts and %lld local experts per rank; need 1 <= local <= experts",
                          (long long)n_experts, (long long)n_local);
    if (n_experts % n_local)
        return hp_err_set(err, HP_ERR_INPUT,
                          "balanced router: %lld experts are not a multiple of the %lld local experts per rank",
                          (long long)n_experts, (long long)n_local);
    int64_t Q = n_experts / n_local, L = n_local;
    for (int64_t s = 0; s < n_tokens * top_k; s++) topk_idx[s] = (int32_t)((s % Q) * L + (s / Q) % L);
    for (int64_t t = 0; t < n_tokens; t++) sort_row(topk_idx + t * top_k, topk_w + t * top_k, top_k);
    return HP_OK;
}
