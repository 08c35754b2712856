/*
 * test_moe_ep_blocks.c — expert parallelism with uneven token blocks, run at 1, 2, 3 and 4 ranks (and without
 * a launcher): issue 10 items 1, 2 and 18.
 *
 * The layer is built in memory with 24 experts (divisible by 1, 2, 3 and 4 ranks), top-6, H = 96, I = 24, as
 * the reproduction, with deterministic weights that depend only on the global element index, so the
 * whole layer and each rank's slice hold the same numbers. The input of T rows is split as the CLI splits it
 * (the first T mod P ranks one row more; ranks past the end of a short input hold none). Each rank's EP output
 * on its block equals the one-process layer on that block — capacity per rank from its own T, both policies,
 * with overlap and with dispatch chunks — for T = 29, 30, 31 (uneven, even) and 7, 3, 2, 1 (fewer rows than
 * ranks at 4). Non-finite outputs (a NaN expert weight on one rank, a huge input on one rank) fail every rank
 * with the same status and a message naming the cause, and leave the runtime usable.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperpar/comm.h"
#include "hyperpar/moe.h"
#include "mpitest.h"

static hp_comm *W;

enum { E = 24, K = 6, H = 96, I = 24, SI = 16, TMAXALL = 31 };

/* A deterministic value in [-0.5, 0.5) · scale of (tensor, global element). */
static float val(uint32_t tensor, uint64_t i, float scale)
{
    uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)tensor << 40);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return ((float)(z >> 40) / 16777216.0f - 0.5f) * scale;
}

/* The layer with experts [first, first + n); shared: the Qwen2-MoE gated shared expert. */
static hp_moe_layer *make_layer(int64_t first, int64_t n, bool shared)
{
    hp_moe_dims d = {.n_hidden = H, .n_experts = E, .top_k = K, .d_expert = I, .d_shared = shared ? SI : 0,
                     .first_expert = first, .n_local = n, .norm_topk_prob = true};
    hp_moe_layer *l = NULL;
    hp_err err;
    hp_status st = hp_moe_layer_create(&l, shared ? HP_MOE_QWEN2MOE_SHARED_EXPERT_GATE : HP_MOE_QWEN3MOE_TOPK_ROUTER,
                                       &d, &err);
    CHECK_MSG(st == HP_OK, "%s", err.msg);
    if (!l) return NULL;
    for (int64_t i = 0; i < E * H; i++) l->w_router[i] = val(1, (uint64_t)i, 2.0f);
    float *gu = (float *)l->w_gate_up, *dn = (float *)l->w_down;
    for (int64_t i = 0; i < n * 2 * I * H; i++) gu[i] = val(2, (uint64_t)(first * 2 * I * H + i), 0.4f);
    for (int64_t i = 0; i < n * H * I; i++) dn[i] = val(3, (uint64_t)(first * H * I + i), 0.4f);
    if (shared) {
        for (int64_t i = 0; i < 2 * SI * H; i++) l->ws_gate_up[i] = val(4, (uint64_t)i, 0.4f);
        for (int64_t i = 0; i < H * SI; i++) l->ws_down[i] = val(5, (uint64_t)i, 0.4f);
        for (int64_t i = 0; i < H; i++) l->ws_gate[i] = val(6, (uint64_t)i, 0.4f);
    }
    return l;
}

/* The CLI's blocks: rank r of P takes rows [lo, lo + n) of T. */
static void block(int64_t T, int P, int r, int64_t *lo, int64_t *n)
{
    int64_t q = T / P, rem = T % P;
    *lo = r * q + (r < rem ? r : rem);
    *n = q + (r < rem ? 1 : 0);
}

static void check_blocks(bool shared)
{
    const int P = hp_comm_size(W), r = hp_comm_rank(W);
    hp_err err;
    hp_moe_layer *full = make_layer(0, E, shared), *local = make_layer(r * (E / P), E / P, shared);
    float *x = malloc(TMAXALL * H * sizeof *x), *y = malloc(TMAXALL * H * sizeof *y);
    float *yref = malloc(TMAXALL * H * sizeof *yref);
    CHECK(full && local && x && y && yref);
    for (int64_t i = 0; x && i < TMAXALL * H; i++) x[i] = val(7, (uint64_t)i, 4.0f);
    static const int64_t totals[] = {29, 30, 31, 7, 3, 2, 1};
    static const double factors[] = {0.0, 1.0, 1.5};
    for (size_t ti = 0; full && local && x && y && yref && ti < sizeof totals / sizeof *totals; ti++) {
        const int64_t T = totals[ti], Tmax = (T + P - 1) / P;
        int64_t lo, n;
        block(T, P, r, &lo, &n);
        hp_moe_ws *ws = NULL;
        hp_moe_ep *ep = NULL;
        CHECK(hp_moe_ws_create(&ws, full, Tmax, &err) == HP_OK);
        CHECK_MSG(hp_moe_ep_create_chunked(&ep, local, W, Tmax, 3, &err) == HP_OK, "%s", err.msg);
        for (size_t f = 0; ws && ep && f < 3; f++)
            for (int pol = 0; pol < 2; pol++) {
                hp_moe_run_opts ro = {.capacity_factor = factors[f], .policy = pol ? HP_MOE_CAP_FIRST : HP_MOE_CAP_SCORE,
                                      .row_base = lo};
                if (n > 0) CHECK_MSG(hp_moe_forward(full, ws, x + lo * H, n, H, yref, &ro, &err) == HP_OK, "%s", err.msg);
                for (int mode = 0; mode < 3; mode++) { /* plain, overlap, 3 dispatch chunks */
                    hp_status st = hp_moe_ep_forward_chunks(ep, x + lo * H, n, y, &ro, mode == 1, mode == 2 ? 3 : 1, &err);
                    CHECK_MSG(st == HP_OK, "T %lld rank %d/%d: %s", (long long)T, r, P, err.msg);
                    if (st != HP_OK) continue;
                    CHECK_CLOSE_MSG(y, yref, n * H, 0, 1e-5,
                                    "%s T %lld rank %d/%d rows [%lld, %lld) cf %.1f %s mode %d",
                                    shared ? "shared" : "routed", (long long)T, r, P, (long long)lo,
                                    (long long)(lo + n), factors[f], pol ? "first" : "score", mode);
                    const hp_moe_ws *ews = hp_moe_ep_ws(ep);
                    CHECK(n == 0 || memcmp(ews->topk_idx, ws->topk_idx, (size_t)(n * K) * sizeof(int32_t)) == 0);
                    if (n > 0) CHECK_EQ_INT(hp_moe_ep_get_stats(ep)->n_dropped, ws->stats.n_dropped);
                }
            }
        hp_moe_ep_destroy(ep);
        hp_moe_ws_destroy(ws);
    }
    free(x);
    free(y);
    free(yref);
    hp_moe_layer_free(full);
    hp_moe_layer_free(local);
}

/* Issue 10 item 1: capacity per rank from its own T, whatever the block sizes. */
static void test_uneven_blocks_routed(void) { check_blocks(false); }
static void test_uneven_blocks_shared(void) { check_blocks(true); }

/* Issue 10 item 2: a NaN weight in the last rank's experts, then a huge input on rank 0 only. Every rank
 * returns HP_ERR_INPUT with the same cause, and a clean forward afterwards still works. */
static void test_nonfinite_outputs_fail_every_rank(void)
{
    const int P = hp_comm_size(W), r = hp_comm_rank(W);
    hp_err err;
    hp_moe_layer *good = make_layer(r * (E / P), E / P, true), *bad = make_layer(r * (E / P), E / P, true);
    if (bad && r == P - 1)
        for (int64_t e = 0; e < E / P; e++) ((float *)bad->w_down)[e * H * I + 5] = NAN;
    hp_moe_ep *ep_good = NULL, *ep_bad = NULL;
    CHECK(good && bad);
    if (good) CHECK(hp_moe_ep_create(&ep_good, good, W, 8, &err) == HP_OK);
    if (bad) CHECK(hp_moe_ep_create(&ep_bad, bad, W, 8, &err) == HP_OK);
    float x[8 * H], y[8 * H];
    for (int64_t i = 0; i < 8 * H; i++) x[i] = val(8, (uint64_t)(r * 8 * H + i), 4.0f);
    if (ep_bad) {
        CHECK_EQ_INT(hp_moe_ep_forward(ep_bad, x, 8, y, NULL, false, &err), HP_ERR_INPUT);
        CHECK_STR_CONTAINS(err.msg, "gives a non-finite output (NaN");
        CHECK_STR_CONTAINS(err.msg, "down projection [H, I] holds NaN at row 0, column 5");
        if (P > 1 && r != P - 1) {
            char who[32];
            snprintf(who, sizeof who, "rank %d: ", P - 1);
            CHECK_STR_CONTAINS(err.msg, who);
        }
    }
    if (ep_good) {
        float xh[8 * H];
        memcpy(xh, x, sizeof xh);
        if (r == 0)
            for (int64_t i = 2 * H; i < 3 * H; i++) xh[i] = 3e38f;
        hp_moe_run_opts ro = {.row_base = 100};
        CHECK_EQ_INT(hp_moe_ep_forward(ep_good, xh, 8, y, &ro, true, &err), HP_ERR_INPUT);
        CHECK_STR_CONTAINS(err.msg, "reaches 3e+38 in magnitude");
        CHECK_MSG(strstr(err.msg, "a token of EP rank 0") || strstr(err.msg, "output row 102"), "%s", err.msg);
        /* Nothing stayed in flight: the same runtime gives finite results on a clean input. */
        CHECK_MSG(hp_moe_ep_forward(ep_good, x, 8, y, NULL, true, &err) == HP_OK, "%s", err.msg);
        bool finite = true;
        for (int64_t i = 0; i < 8 * H; i++) finite &= isfinite(y[i]) != 0;
        CHECK(finite);
    }
    hp_moe_ep_destroy(ep_good);
    hp_moe_ep_destroy(ep_bad);
    hp_moe_layer_free(good);
    hp_moe_layer_free(bad);
}

int main(int argc, char **argv)
{
    hp_err err;
    if (hp_comm_world(&W, &argc, &argv, &err) != HP_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    hp_moe_set_threads(1);
    static const mpi_test tests[] = {{"uneven_blocks_routed", test_uneven_blocks_routed},
                                     {"uneven_blocks_shared", test_uneven_blocks_shared},
                                     {"nonfinite_outputs_fail_every_rank", test_nonfinite_outputs_fail_every_rank}};
    int rc = mpi_run_tests(W, tests, sizeof tests / sizeof *tests);
    hp_comm_free(W);
    return rc;
}
