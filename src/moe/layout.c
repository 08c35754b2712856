/*
 * layout.c — the arrays of an MoE runtime, described once (hp_moe_ep_layout), and the allocation that walks them.
 *
 * hp__moe_ws_make (forward.c) and ep_build (ep.c) allocate each array of the table below by its entry, in the
 * table's order, and count its bytes by the same rule hp_moe_ep_layout_bytes sums; `hyperpar cost` sums the table
 * without making a runtime (src/cost/cost.c, ep_workspace). A runtime and its prediction cannot disagree on an
 * array, its count or its rounding: there is no second list.
 *
 *   workspace (hp_moe_ws)                                 EP runtime's own (hp_moe_ep), not one_process
 *   x64 logits sel topk_idx topk_w keep cap_scratch       [stage_cnt stage_sz]  (chunked)
 *   counts offsets row_slot slot_row [rows] act           counts_all offsets_all cnt_send cnt_recv cnt_local sc
 *   groups pass_row0 [shared_act shared_out [shared_g]]   send recv xrows [y_shared]
 *
 * Counts saturate: a product past 64 bits (or of a saturated factor) is INT64_MAX, which no allocation holds
 * and hp_moe_ep_layout_bytes reports.
 */
#include "moe/moe_internal.h"

#include <stdint.h>

/* a·b, INT64_MAX when it passes 64 bits, when a factor is negative or already saturated. */
static int64_t mul(int64_t a, int64_t b)
{
    int64_t r;
    if (a == INT64_MAX || b == INT64_MAX || !hp_mul_i64(a, b, &r)) return INT64_MAX;
    return r;
}

static int64_t mul3(int64_t a, int64_t b, int64_t c) { return mul(mul(a, b), c); }

static int64_t add(int64_t a, int64_t b)
{
    int64_t r;
    if (a == INT64_MAX || b == INT64_MAX || !hp_add_i64(a, b, &r)) return INT64_MAX;
    return r;
}

hp_moe_ep_shape hp__moe_shape_of(const hp_moe_layer *l, int64_t max_tokens)
{
    return (hp_moe_ep_shape){.max_tokens = max_tokens, .n_hidden = l->n_hidden, .n_experts = l->n_experts,
                             .top_k = l->top_k, .n_local = l->n_local, .d_expert = l->d_expert,
                             .d_shared = l->d_shared, .shared_gate = l->ws_gate != NULL, .one_process = true,
                             .ep_size = 1, .chunks = 1, .bf16_experts = l->w_dtype == HP_DT_BF16};
}

int64_t hp__moe_ep_stage_tokens(const hp_moe_ep_shape *s)
{
    if (s->one_process || s->chunks <= 1) return 0;
    int64_t T = s->max_tokens, C = s->chunks;
    /* bounded: ceil(T / C); else ceil((T + 1) / 2), so that two stages hold a peer's T + 1 tokens */
    int64_t th = s->bounded ? T / C + (T % C != 0) : T / 2 + 1;
    return th < 1 ? 1 : th;
}

int64_t hp__moe_ep_row_tokens(const hp_moe_ep_shape *s)
{
    return !s->one_process && s->chunks > 1 && s->bounded ? hp__moe_ep_stage_tokens(s) : s->max_tokens;
}

int hp_moe_ep_layout(const hp_moe_ep_shape *s, hp_moe_ep_array a[HP_MOE_ARR_COUNT])
{
    const int64_t T = s->max_tokens, H = s->n_hidden, E = s->n_experts, K = s->top_k, L = s->n_local;
    const int64_t I = s->d_expert, sI = s->d_shared, P = s->ep_size, Tr = hp__moe_ep_row_tokens(s);
    const int64_t TK = mul(T, K), TH = mul(T, H);
    int n = 0;
#define ARR(id_, field, count, size) a[n++] = (hp_moe_ep_array){(id_), (field), (count), (size)}
    ARR(HP_MOE_ARR_X64, "x64", TH, sizeof(double));
    ARR(HP_MOE_ARR_LOGITS, "logits", mul(T, E), sizeof(double));
    ARR(HP_MOE_ARR_SEL, "sel", mul(2, E), sizeof(double));
    ARR(HP_MOE_ARR_TOPK_IDX, "topk_idx", TK, sizeof(int32_t));
    ARR(HP_MOE_ARR_TOPK_W, "topk_w", TK, sizeof(float));
    ARR(HP_MOE_ARR_KEEP, "keep", TK, sizeof(uint8_t));
    ARR(HP_MOE_ARR_CAP_SCRATCH, "cap_scratch", hp_moe_capacity_scratch_count(T, K, E), sizeof(int32_t));
    ARR(HP_MOE_ARR_COUNTS, "counts", L, sizeof(int64_t));
    ARR(HP_MOE_ARR_OFFSETS, "offsets", add(L, 1), sizeof(int64_t));
    ARR(HP_MOE_ARR_ROW_SLOT, "row_slot", TK, sizeof(int32_t));
    ARR(HP_MOE_ARR_SLOT_ROW, "slot_row", TK, sizeof(int32_t));
    if (s->one_process) ARR(HP_MOE_ARR_ROWS, "rows", mul(TK, H), sizeof(float));
    ARR(HP_MOE_ARR_ACT, "act", mul3(mul(Tr, K), 2, I), sizeof(float));
    ARR(HP_MOE_ARR_GROUPS, "groups", L, sizeof(hp_linear_group));
    ARR(HP_MOE_ARR_PASS_ROW0, "pass_row0", L, sizeof(int64_t));
    if (sI > 0) {
        ARR(HP_MOE_ARR_SHARED_ACT, "shared_act", mul3(Tr, 2, sI), sizeof(float));
        ARR(HP_MOE_ARR_SHARED_OUT, "shared_out", mul(Tr, H), sizeof(float));
        if (s->shared_gate) ARR(HP_MOE_ARR_SHARED_G, "shared_g", Tr, sizeof(float));
    }
    if (s->one_process) return n;
    /* The exchange holds Tb tokens: T, or two stages of Th when chunked; xrows one stage's worth when bounded. */
    const int64_t Th = hp__moe_ep_stage_tokens(s), Tb = s->chunks > 1 ? mul(2, Th) : T;
    const int64_t send = mul3(Tb, K, H), PL = mul(P, L);
    if (s->chunks > 1) {
        ARR(HP_MOE_ARR_STAGE_CNT, "stage_cnt", mul(4, PL), sizeof(int64_t));
        ARR(HP_MOE_ARR_STAGE_SZ, "stage_sz", mul(8, P), sizeof(size_t));
    }
    ARR(HP_MOE_ARR_COUNTS_ALL, "counts_all", E, sizeof(int64_t));
    ARR(HP_MOE_ARR_OFFSETS_ALL, "offsets_all", add(E, 1), sizeof(int64_t));
    ARR(HP_MOE_ARR_CNT_SEND, "cnt_send", PL, sizeof(int64_t));
    ARR(HP_MOE_ARR_CNT_RECV, "cnt_recv", PL, sizeof(int64_t));
    ARR(HP_MOE_ARR_CNT_LOCAL, "cnt_local", L, sizeof(int64_t));
    ARR(HP_MOE_ARR_SC, "sc", mul(4, P), sizeof(size_t));
    ARR(HP_MOE_ARR_SEND, "send", send, sizeof(float));
    ARR(HP_MOE_ARR_RECV, "recv", mul(P, send), sizeof(float));
    ARR(HP_MOE_ARR_XROWS, "xrows", s->chunks > 1 && s->bounded ? mul3(P, mul(Th, K), H) : mul(P, send),
        sizeof(float));
    if (sI > 0) /* overlap's shared-expert output; without a shared expert there is nothing to overlap */
        ARR(HP_MOE_ARR_Y_SHARED, "y_shared", TH, sizeof(float));
#undef ARR
    return n;
}

int64_t hp__moe_ep_x_rows(const hp_moe_ep_shape *s)
{
    const int64_t K = s->top_k, P = s->ep_size;
    if (s->one_process) return mul(s->max_tokens, K);
    const int64_t Th = hp__moe_ep_stage_tokens(s), Tb = s->chunks > 1 ? mul(2, Th) : s->max_tokens;
    return mul(P, mul(s->chunks > 1 && s->bounded ? Th : Tb, K));
}

int hp_moe_bwd_layout(const hp_moe_ep_shape *s, hp_moe_ep_array a[HP_MOE_ARR_COUNT])
{
    const int64_t T = s->max_tokens, H = s->n_hidden, I = s->d_expert, sI = s->d_shared, C = HP__MOE_BWD_CHUNK;
    const int64_t w = I > sI ? I : sI;
    int n = 0;
#define ARR(id_, field, count, size) a[n++] = (hp_moe_ep_array){(id_), (field), (count), (size)}
    ARR(HP_MOE_ARR_BWD_DROWS, "drows", mul(hp__moe_ep_x_rows(s), H), sizeof(float));
    ARR(HP_MOE_ARR_BWD_DW, "dw", mul(T, s->top_k), sizeof(double));
    ARR(HP_MOE_ARR_BWD_DLOG, "dlog", mul(T, s->n_experts), sizeof(double));
    ARR(HP_MOE_ARR_BWD_G, "g", mul3(C, 2, w), sizeof(float));
    ARR(HP_MOE_ARR_BWD_DG, "dg", mul3(C, 2, w), sizeof(float));
    ARR(HP_MOE_ARR_BWD_A, "a", mul(C, w), sizeof(float));
    ARR(HP_MOE_ARR_BWD_DA, "da", mul(C, w), sizeof(float));
    ARR(HP_MOE_ARR_BWD_O, "o", mul(C, H), sizeof(float));
    ARR(HP_MOE_ARR_BWD_DXC, "dxc", mul(C, H), sizeof(float));
    ARR(HP_MOE_ARR_BWD_SDO, "sdo", mul(C, H), sizeof(float));
    if (s->bf16_experts) {
        ARR(HP_MOE_ARR_BWD_WGU, "wgu", mul3(2, I, H), sizeof(float));
        ARR(HP_MOE_ARR_BWD_WD, "wd", mul(H, I), sizeof(float));
    }
#undef ARR
    return n;
}

/* One array's bytes as hp__moe_alloc takes them (n·elem_size, at least 1); false past 64 bits. */
static bool array_bytes(const hp_moe_ep_array *a, uint64_t *bytes)
{
    if (a->n == INT64_MAX || a->n < 0 || __builtin_mul_overflow((uint64_t)a->n, (uint64_t)a->elem_size, bytes)) {
        *bytes = UINT64_MAX;
        return false;
    }
    if (*bytes == 0) *bytes = 1;
    return true;
}

bool hp_moe_ep_layout_bytes(const hp_moe_ep_array *a, int n, uint64_t *bytes)
{
    uint64_t sum = 0, b;
    for (int i = 0; i < n; i++)
        if (!array_bytes(&a[i], &b) || __builtin_add_overflow(sum, b, &sum)) {
            *bytes = UINT64_MAX;
            return false;
        }
    *bytes = sum;
    return true;
}

bool hp__moe_alloc_layout(const hp_moe_ep_array *a, int n, hp_moe_arr_id first, hp_moe_arr_id end,
                          void *p[HP_MOE_ARR_COUNT], size_t *bytes)
{
    bool ok = true;
    for (int i = 0; i < n; i++) {
        if (a[i].id < first || a[i].id >= end) continue;
        uint64_t b = 0;
        ok = ok && array_bytes(&a[i], &b) && b <= SIZE_MAX;
        p[a[i].id] = hp__moe_alloc(a[i].n, a[i].elem_size, &ok);
        if (p[a[i].id]) *bytes += (size_t)b;
    }
    return ok;
}
