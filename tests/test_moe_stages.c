/*
 * test_moe_stages.c — the MoE stages one at a time on hand-made inputs: capacity (spec §10.10 example,
 * score ties, first policy), dispatch (§10.12 worked example), balanced router (§10.4), router tie-breaks
 * and group-limited selection, combine order, gpt-oss activation, layer creation errors.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperpar/moe.h"
#include "testlib.h"

TEST(capacity_spec_example)
{
    /* §10.10: slots [[0,0],[0,1],[0,1],[1,2]], E = 4, factor 1 → capacity 2, kept [2,2,1,0], 5 of 8. */
    int32_t idx[8] = {0, 0, 0, 1, 0, 1, 1, 2};
    float w[8] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f};
    uint8_t keep[8];
    int32_t scratch[64];
    int64_t dropped = -1, cap = -1;
    hp_err err;
    CHECK(hp_moe_capacity_scratch_count(4, 2, 4) <= 64);
    CHECK(hp_moe_capacity(idx, w, 4, 2, 4, 1.0, HP_MOE_CAP_FIRST, keep, scratch, &dropped, &cap, &err) == HP_OK);
    CHECK_EQ_INT(cap, 2);
    CHECK_EQ_INT(dropped, 3);
    uint8_t first[8] = {1, 1, 0, 1, 0, 1, 0, 1};
    CHECK(memcmp(keep, first, 8) == 0);
    /* Score: expert 0 keeps its heaviest (slots 4 and 2), expert 1 its heaviest (6 and 5). */
    CHECK(hp_moe_capacity(idx, w, 4, 2, 4, 1.0, HP_MOE_CAP_SCORE, keep, scratch, &dropped, &cap, &err) == HP_OK);
    uint8_t score[8] = {0, 0, 1, 0, 1, 1, 1, 1};
    CHECK(memcmp(keep, score, 8) == 0);
    CHECK_EQ_INT(dropped, 3);
    /* Off, and a factor larger than the skew: keep everything. */
    CHECK(hp_moe_capacity(idx, w, 4, 2, 4, 0.0, HP_MOE_CAP_SCORE, keep, scratch, &dropped, &cap, &err) == HP_OK);
    CHECK(dropped == 0 && cap == 0 && keep[0] && keep[7]);
    CHECK(hp_moe_capacity(idx, w, 4, 2, 4, 2.0, HP_MOE_CAP_SCORE, keep, scratch, &dropped, &cap, &err) == HP_OK);
    CHECK(dropped == 0 && cap == 4);
    /* Errors. */
    CHECK(hp_moe_capacity(idx, w, 4, 2, 0, 1.0, HP_MOE_CAP_SCORE, keep, scratch, &dropped, NULL, &err) ==
          HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "num_experts must be positive");
    idx[3] = 9;
    CHECK(hp_moe_capacity(idx, w, 4, 2, 4, 1.0, HP_MOE_CAP_SCORE, keep, scratch, &dropped, NULL, &err) ==
          HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "slot 3 routes to expert 9, outside [0, 4)");
}

TEST(capacity_score_ties_go_to_lower_slot)
{
    int32_t idx[6] = {1, 1, 1, 1, 1, 1};
    float w[6] = {0.5f, 0.9f, 0.5f, 0.9f, 0.5f, 0.1f};
    uint8_t keep[6];
    int32_t scratch[64];
    int64_t dropped, cap;
    hp_err err;
    /* capacity = ceil(0.75 * 6 / 2) = 3: slots 1, 3 (0.9) then slot 0 (first of the 0.5 ties). */
    CHECK(hp_moe_capacity(idx, w, 6, 1, 2, 0.75, HP_MOE_CAP_SCORE, keep, scratch, &dropped, &cap, &err) == HP_OK);
    uint8_t want[6] = {1, 1, 0, 1, 0, 0};
    CHECK_EQ_INT(cap, 3);
    CHECK(memcmp(keep, want, 6) == 0);
    /* Without weights the policy is first-come. */
    CHECK(hp_moe_capacity(idx, NULL, 6, 1, 2, 0.75, HP_MOE_CAP_SCORE, keep, scratch, &dropped, &cap, &err) == HP_OK);
    uint8_t want_first[6] = {1, 1, 1, 0, 0, 0};
    CHECK(memcmp(keep, want_first, 6) == 0);
    hp_moe_cap_policy p;
    CHECK(hp_moe_cap_policy_parse("first", &p) && p == HP_MOE_CAP_FIRST);
    CHECK(hp_moe_cap_policy_parse("score", &p) && p == HP_MOE_CAP_SCORE);
    CHECK(!hp_moe_cap_policy_parse("heaviest", &p));
}

TEST(dispatch_worked_example)
{
    /* §10.12: idx [[2,0],[1,1],[3,0]] → expert-major order s1, s5, s2, s3, s0, s4. */
    int32_t idx[6] = {2, 0, 1, 1, 3, 0};
    int64_t counts[4], offsets[5];
    int32_t row_slot[6], slot_row[6];
    int64_t n = hp_moe_dispatch_prepare(idx, NULL, 3, 2, 0, 4, counts, offsets, row_slot, slot_row);
    CHECK_EQ_INT(n, 6);
    int32_t want[6] = {1, 5, 2, 3, 0, 4};
    CHECK(memcmp(row_slot, want, sizeof want) == 0);
    CHECK(counts[0] == 2 && counts[1] == 2 && counts[2] == 1 && counts[3] == 1);
    CHECK(offsets[4] == 6 && offsets[2] == 4);
    for (int r = 0; r < 6; r++) CHECK(slot_row[row_slot[r]] == r);
    /* Rank 1 of ep = 2 (experts 2, 3) sees only its slots; a keep mask removes slot 4. */
    uint8_t keep[6] = {1, 1, 1, 1, 0, 1};
    n = hp_moe_dispatch_prepare(idx, keep, 3, 2, 2, 2, counts, offsets, row_slot, slot_row);
    CHECK_EQ_INT(n, 1);
    CHECK(row_slot[0] == 0 && counts[0] == 1 && counts[1] == 0);
    CHECK(slot_row[0] == 0 && slot_row[1] == -1 && slot_row[4] == -1);
    /* Gather and combine: y[t] = Σ_k w·out[row]. */
    float x[3 * 2] = {1, 2, 3, 4, 5, 6}, rows[6 * 2], y[3 * 2];
    float w[6] = {0.5f, 0.25f, 1, 1, 2, 0};
    n = hp_moe_dispatch_prepare(idx, NULL, 3, 2, 0, 4, counts, offsets, row_slot, slot_row);
    hp_moe_gather(x, 2, 2, row_slot, n, rows);
    CHECK(rows[0] == 1 && rows[2] == 5 && rows[8] == 1); /* s1 → t0, s5 → t2, s0 → t0 */
    hp_moe_combine(rows, slot_row, w, 3, 2, 2, y);
    CHECK(y[0] == 0.75f && y[1] == 1.5f && y[2] == 6 && y[3] == 8 && y[4] == 10 && y[5] == 12);
}

TEST(balanced_router)
{
    int32_t idx[4 * 2];
    float w[4 * 2] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f};
    hp_err err;
    /* E = 8, L = 4 (ep = 2): Q = 2, expert(s) = (s mod 2)·4 + (s div 2) mod 4. */
    CHECK(hp_moe_route_balance(idx, w, 4, 2, 8, 4, &err) == HP_OK);
    int32_t want[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    CHECK(memcmp(idx, want, sizeof want) == 0);
    CHECK(w[0] == 0.1f && w[7] == 0.8f);
    CHECK(hp_moe_route_balance(idx, w, 4, 2, 8, 3, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "8 experts are not a multiple of the 3 local experts");
}

static hp_moe_layer *make(hp_moe_archetype a, int64_t H, int64_t E, int64_t K, int64_t I, int64_t G, int64_t TG)
{
    hp_moe_dims d = {.n_hidden = H, .n_experts = E, .top_k = K, .d_expert = I, .n_group = G, .topk_group = TG};
    hp_moe_layer *l = NULL;
    hp_err err;
    if (hp_moe_layer_create(&l, a, &d, &err) != HP_OK) fprintf(stderr, "  %s\n", err.msg);
    return l;
}

TEST(router_ties_go_to_lower_expert_and_rows_are_sorted)
{
    /* H = 1, x = 1: logits = router column. Experts 1, 3, 5 tie for the top. */
    hp_moe_layer *l = make(HP_MOE_QWEN3MOE_TOPK_ROUTER, 1, 6, 2, 2, 1, 1);
    CHECK(l != NULL);
    if (!l) return;
    double logits[6] = {0.0, 2.0, 1.0, 2.0, -1.0, 2.0};
    memcpy(l->w_router, logits, sizeof logits);
    hp_moe_ws *ws = NULL;
    hp_err err;
    CHECK(hp_moe_ws_create(&ws, l, 1, &err) == HP_OK);
    float x[1] = {1.0f};
    int32_t idx[2];
    float w[2];
    CHECK(hp_moe_route(l, ws, x, 1, idx, w, &err) == HP_OK);
    CHECK(idx[0] == 1 && idx[1] == 3);
    double p = exp(2.0) / (exp(0.0) + 3 * exp(2.0) + exp(1.0) + exp(-1.0));
    CHECK(fabs(w[0] - p) < 1e-7 && w[0] == w[1]);
    /* norm_topk_prob renormalises. */
    l->norm_topk_prob = true;
    CHECK(hp_moe_route(l, ws, x, 1, idx, w, &err) == HP_OK);
    CHECK(w[0] == 0.5f && w[1] == 0.5f);
    /* Descending selection but ascending output order. */
    double l2[6] = {5.0, 0.0, 0.0, 0.0, 0.0, 6.0};
    memcpy(l->w_router, l2, sizeof l2);
    CHECK(hp_moe_route(l, ws, x, 1, idx, w, &err) == HP_OK);
    CHECK(idx[0] == 0 && idx[1] == 5 && w[0] < w[1]);
    hp_moe_ws_destroy(ws);
    hp_moe_layer_free(l);
}

TEST(sigmoid_group_router)
{
    /* E = 8 in 4 groups of 2, keep 2 groups, K = 2. Scores chosen so that the best single expert lies in a
     * group whose top-2 sum loses: group scores (biased) decide, then the top-2 inside the kept groups. */
    hp_moe_layer *l = make(HP_MOE_DEEPSEEKV3_SIGMOID_GROUP_SHARED, 1, 8, 2, 2, 4, 2);
    CHECK(l != NULL);
    if (!l) return;
    double logit[8] = {3.0, -3.0, 1.0, 1.0, 0.5, 0.4, 0.9, 0.8};
    memcpy(l->w_router, logit, sizeof logit);
    l->b_correction[4] = 0.5; /* lifts group 2 (experts 4, 5) above group 3 for selection only */
    l->norm_topk_prob = true;
    l->routed_scaling_factor = 2.5;
    hp_moe_ws *ws = NULL;
    hp_err err;
    CHECK(hp_moe_ws_create(&ws, l, 1, &err) == HP_OK);
    float x[1] = {1.0f};
    int32_t idx[2];
    float w[2];
    CHECK(hp_moe_route(l, ws, x, 1, idx, w, &err) == HP_OK);
    /* Group sums: g0 = σ(3)+σ(-3) = 1.0, g1 = 2σ(1) = 1.46, g2 = σ(.5)+.5+σ(.4) = 1.72, g3 = σ(.9)+σ(.8) = 1.40.
     * Kept: g2, g1. Biased scores there: 4 → σ(.5)+.5 = 1.12 best, then 2 and 3 tie at σ(1) → 2. */
    CHECK_MSG(idx[0] == 2 && idx[1] == 4, "got %d %d", idx[0], idx[1]);
    double s2 = 1 / (1 + exp(-1.0)), s4 = 1 / (1 + exp(-0.5));
    CHECK(fabs(w[0] - s2 / (s2 + s4 + 1e-20) * 2.5) < 1e-6);
    CHECK(fabs(w[1] - s4 / (s2 + s4 + 1e-20) * 2.5) < 1e-6);
    hp_moe_ws_destroy(ws);
    hp_moe_layer_free(l);
    /* Settings that cannot work are refused. */
    hp_moe_dims d = {.n_hidden = 1, .n_experts = 8, .top_k = 4, .d_expert = 2, .n_group = 4, .topk_group = 1};
    CHECK(hp_moe_layer_create(&l, HP_MOE_DEEPSEEKV3_SIGMOID_GROUP_SHARED, &d, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "topk_group (1) groups of 2 experts cannot supply num_experts_per_tok = 4");
    d.n_group = 3;
    CHECK(hp_moe_layer_create(&l, HP_MOE_DEEPSEEKV3_SIGMOID_GROUP_SHARED, &d, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "n_group (3) must divide the 8 routed experts");
    d.n_group = 1;
    d.top_k = 9;
    CHECK(hp_moe_layer_create(&l, HP_MOE_MIXTRAL_TOPK_ROUTER, &d, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "num_experts_per_tok (9) must be between 1 and the 8 experts");
}

TEST(gptoss_activation_and_biases)
{
    /* One expert, H = 1, I = 2: gate_up rows (g0, g1, u0, u1) = (10, -1, 9, 0.5)·x + bias, down = identity sum. */
    hp_moe_layer *l = make(HP_MOE_GPTOSS_TOPK_ROUTER, 1, 1, 1, 2, 1, 1);
    CHECK(l != NULL);
    if (!l) return;
    float *gu = (float *)l->w_gate_up, *bgu = (float *)l->b_gate_up, *dn = (float *)l->w_down, *bd = (float *)l->b_down;
    gu[0] = 10, gu[1] = -1, gu[2] = 9, gu[3] = 0.5f;
    bgu[3] = 0.25f;
    dn[0] = 1, dn[1] = 1;
    bd[0] = 0.125f;
    hp_moe_ws *ws = NULL;
    hp_err err;
    CHECK(hp_moe_ws_create(&ws, l, 2, &err) == HP_OK);
    float x[1] = {1.0f}, y[1];
    CHECK(hp_moe_forward(l, ws, x, 1, 1, y, NULL, &err) == HP_OK);
    double g0 = 7.0, u0 = 7.0, g1 = -1.0, u1 = 0.75;
    double want = (u0 + 1) * g0 / (1 + exp(-1.702 * g0)) + (u1 + 1) * g1 / (1 + exp(-1.702 * g1)) + 0.125;
    CHECK_MSG(fabs(y[0] - want) < 1e-5, "%g vs %g", y[0], want);
    CHECK(ws->topk_w[0] == 1.0f && ws->stats.n_rows == 1 && ws->stats.n_active == 1);
    hp_moe_ws_destroy(ws);
    hp_moe_layer_free(l);
}

/* Experts run in chunks of max_tokens rows: an expert with more rows than that gives the same result. */
TEST(experts_forward_chunks)
{
    hp_moe_layer *l = make(HP_MOE_MIXTRAL_TOPK_ROUTER, 4, 2, 1, 3, 1, 1);
    CHECK(l != NULL);
    if (!l) return;
    float *gu = (float *)l->w_gate_up, *dn = (float *)l->w_down;
    for (int i = 0; i < 2 * 6 * 4; i++) gu[i] = 0.05f * (float)((i * 7) % 11) - 0.2f;
    for (int i = 0; i < 2 * 4 * 3; i++) dn[i] = 0.03f * (float)((i * 5) % 13) - 0.15f;
    hp_moe_ws *small = NULL, *big = NULL;
    hp_err err;
    CHECK(hp_moe_ws_create(&small, l, 2, &err) == HP_OK && hp_moe_ws_create(&big, l, 8, &err) == HP_OK);
    float rows[7 * 4], a[7 * 4], b[7 * 4];
    for (int i = 0; i < 28; i++) rows[i] = (float)sin(i);
    int64_t counts[2] = {5, 2};
    CHECK(hp_moe_experts_forward(l, small, rows, counts, a, &err) == HP_OK);
    CHECK(hp_moe_experts_forward(l, big, rows, counts, b, &err) == HP_OK);
    CHECK_CLOSE(a, b, 28, 1e-6, 0);
    CHECK(a[0] != 0);
    hp_moe_ws_destroy(small);
    hp_moe_ws_destroy(big);
    hp_moe_layer_free(l);
    hp_moe_dims bad = {.n_hidden = 0, .n_experts = 2, .top_k = 1, .d_expert = 2};
    CHECK(hp_moe_layer_create(&l, HP_MOE_MIXTRAL_TOPK_ROUTER, &bad, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "layer dimensions must be positive");
}

TEST_MAIN()
