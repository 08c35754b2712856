/*
 * capacity.c — the capacity factor of spec §10.10 with the golden README's selection rule.
 *
 *   capacity = ceil(factor · T·K / E)          (T·K = this rank's slots; computed as in Python, f64)
 *   an expert routed c > capacity slots keeps `capacity` of them:
 *     score  the heaviest by routing weight, ties to the lower flat slot t*K + k   (default)
 *     first  the first ones in flat slot order
 *   dropped slots contribute nothing; weights are not renormalised.
 *
 * Scratch layout (int32, hp_moe_capacity_scratch_count elements):
 *   [0, S)        slots grouped by expert (counting sort, stable: slot order inside an expert)
 *   [S, 2S)       merge-sort buffer
 *   [2S, 2S+E+1)  per-expert counts, then block starts
 * with S = T*K. Both policies keep min(count_e, capacity) slots of every expert.
 */
#include "moe/moe_internal.h"

#include <math.h>
#include <string.h>

int64_t hp_moe_capacity_scratch_count(int64_t n_tokens, int64_t top_k, int64_t n_experts)
{
    int64_t s, n;
    if (!hp_mul_i64(n_tokens, top_k, &s) || !hp_mul_i64(s, 2, &n) || !hp_add_i64(n, n_experts, &n) ||
        !hp_add_i64(n, 1, &n))
        return INT64_MAX; /* past 64 bits: no allocation holds it (cost's sizes check it, the runtime's fail) */
    return n;
}

/* Stable sort of a[0..n) by weight descending (ties keep their order), bottom-up merge through tmp. */
static void sort_by_weight(int32_t *a, int32_t *tmp, int64_t n, const float *w)
{
    for (int64_t width = 1; width < n; width *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * width) {
            int64_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            int64_t i = lo, j = mid, o = lo;
            while (i < mid && j < hi) tmp[o++] = (w[a[j]] > w[a[i]]) ? a[j++] : a[i++];
            while (i < mid) tmp[o++] = a[i++];
            while (j < hi) tmp[o++] = a[j++];
        }
        memcpy(a, tmp, (size_t)n * sizeof *a);
    }
}

hp_status hp_moe_capacity(const int32_t *topk_idx, const float *topk_w, int64_t n_tokens, int64_t top_k,
                          int64_t n_experts, double factor, hp_moe_cap_policy policy, uint8_t *keep, int32_t *scratch,
                          int64_t *dropped, int64_t *capacity_out, hp_err *err)
{
    int64_t S = n_tokens * top_k, E = n_experts;
    *dropped = 0;
    if (capacity_out) *capacity_out = 0;
    if (E <= 0)
        return hp_err_set(err, HP_ERR_INPUT, "capacity factor: num_experts must be positive, got %lld", (long long)E);
    memset(keep, 1, (size_t)S);
    if (!(factor > 0.0)) return HP_OK;
    if (S > INT32_MAX)
        return hp_err_set(err, HP_ERR_INPUT, "capacity factor: %lld slots exceed the 2^31 this stage supports",
                          (long long)S);
    double c = ceil(factor * (double)S / (double)E);
    int64_t cap = c >= (double)S ? S : (int64_t)c;
    if (capacity_out) *capacity_out = cap;
    int32_t *order = scratch, *tmp = scratch + S, *start = scratch + 2 * S;
    memset(start, 0, (size_t)(E + 1) * sizeof *start);
    for (int64_t s = 0; s < S; s++) {
        if (topk_idx[s] < 0 || topk_idx[s] >= E)
            return hp_err_set(err, HP_ERR_INPUT, "capacity factor: slot %lld routes to expert %d, outside [0, %lld)",
                              (long long)s, topk_idx[s], (long long)E);
        start[topk_idx[s] + 1]++;
    }
    for (int64_t e = 0; e < E; e++) start[e + 1] += start[e];
    /* Counting sort, start[e] as the cursor of expert e; afterwards shift the cursors back to starts. */
    for (int64_t s = 0; s < S; s++) order[start[topk_idx[s]]++] = (int32_t)s;
    for (int64_t e = E; e > 0; e--) start[e] = start[e - 1];
    start[0] = 0;
    bool by_score = policy == HP_MOE_CAP_SCORE && topk_w;
    for (int64_t e = 0; e < E; e++) {
        int64_t n = start[e + 1] - start[e];
        if (n <= cap) continue;
        int32_t *seg = order + start[e];
        if (by_score) sort_by_weight(seg, tmp, n, topk_w);
        for (int64_t i = cap; i < n; i++) keep[seg[i]] = 0;
        *dropped += n - cap;
    }
    return HP_OK;
}
