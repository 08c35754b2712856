/*
 * dispatch.c — expert-major permutation of the kept slots (spec §10.6), gather, and the weighted combine
 * back into token order (§10.9).
 *
 *   slots (token-major)   s = t*K + k,  expert idx[s]
 *   rows  (expert-major)  row r, r in [offsets[e], offsets[e+1]) holds a slot of local expert e; inside an
 *                         expert, rows follow slot order (a stable counting sort)
 *   row_slot[r] = s,  slot_row[s] = r or -1 (dropped by capacity, or routed to a non-local expert)
 *
 * The combine sums a token's K contributions in k order (ascending expert id), in f32, so the result does
 * not depend on how rows were computed or exchanged.
 */
#include "moe/moe_internal.h"

#include <string.h>

int64_t hp_moe_dispatch_prepare(const int32_t *topk_idx, const uint8_t *keep, int64_t n_tokens, int64_t top_k,
                                int64_t first, int64_t n_local, int64_t *counts, int64_t *offsets, int32_t *row_slot,
                                int32_t *slot_row)
{
    int64_t S = n_tokens * top_k;
    memset(counts, 0, (size_t)n_local * sizeof *counts);
    for (int64_t s = 0; s < S; s++) {
        int64_t e = (int64_t)topk_idx[s] - first;
        bool local = e >= 0 && e < n_local && (!keep || keep[s]);
        slot_row[s] = local ? 0 : -1;
        if (local) counts[e]++;
    }
    offsets[0] = 0;
    for (int64_t e = 0; e < n_local; e++) offsets[e + 1] = offsets[e] + counts[e];
    /* Second pass: counts doubles as the per-expert cursor and ends equal to itself again. */
    memset(counts, 0, (size_t)n_local * sizeof *counts);
    for (int64_t s = 0; s < S; s++) {
        if (slot_row[s] < 0) continue;
        int64_t e = (int64_t)topk_idx[s] - first;
        int64_t r = offsets[e] + counts[e]++;
        row_slot[r] = (int32_t)s;
        slot_row[s] = (int32_t)r;
    }
    return offsets[n_local];
}

void hp_moe_gather(const float *x, int64_t n_hidden, int64_t top_k, const int32_t *row_slot, int64_t n_rows,
                   float *rows)
{
#pragma omp parallel for schedule(static) if (n_rows * n_hidden > 65536)
    for (int64_t r = 0; r < n_rows; r++)
        memcpy(rows + r * n_hidden, x + (row_slot[r] / top_k) * n_hidden, (size_t)n_hidden * sizeof *rows);
}

void hp_moe_combine(const float *out, const int32_t *slot_row, const float *topk_w, int64_t n_tokens, int64_t top_k,
                    int64_t n_hidden, float *y)
{
#pragma omp parallel for schedule(static) if (n_tokens * n_hidden > 65536)
    for (int64_t t = 0; t < n_tokens; t++) {
        float *yt = y + t * n_hidden;
        memset(yt, 0, (size_t)n_hidden * sizeof *yt);
        for (int64_t k = 0; k < top_k; k++) {
            int32_t r = slot_row[t * top_k + k];
            if (r < 0) continue;
            const float w = topk_w[t * top_k + k], *o = out + (int64_t)r * n_hidden;
            for (int64_t h = 0; h < n_hidden; h++) yt[h] += w * o[h];
        }
    }
}
