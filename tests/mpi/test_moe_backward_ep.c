/*
 * test_moe_backward_ep.c — hp_moe_ep_backward under mpirun (1, 2, 4 ranks; also without a launcher) against the
 * one-process backward (hp_moe_backward, itself checked against central differences by test_moe_backward).
 *
 * Every rank builds the same in-memory layer (same seed) and its EP slice (experts [r·E/P, (r+1)·E/P)), and
 * takes its block of a global batch. On its own block the one-process layer gives dx_ref and gradients g_ref;
 * the EP backward must give:
 *   - dx equal to dx_ref (the rank's own tokens),
 *   - the router's and the shared expert's gradients equal to g_ref (they come from the rank's own tokens),
 *   - the local experts' gradients equal to the sum over ranks of g_ref's slice for those experts (an expert
 *     sees the rows of every rank),
 * each within 1e-5 · max|ref| (the products run on other row counts, so not bitwise). Cases: Qwen2-MoE (softmax
 * without renormalisation, gated shared expert), DeepSeek-V3 (sigmoid groups, scaling 2.5, shared expert),
 * gpt-oss (router and expert biases), Mixtral with a capacity factor that drops slots, a batch that leaves a
 * rank without tokens, and a forward in dispatch chunks. The checks also require non-zero gradients.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperpar/comm.h"
#include "hyperpar/moe.h"
#include "mpitest.h"

static hp_comm *W;

static uint64_t g_rng;
static double rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static void fill(float *p, int64_t n, double s)
{
    for (int64_t i = 0; p && i < n; i++) p[i] = (float)(s * rnd());
}

/* Whether the case has enough tokens that every rank's experts get rows (then no gradient may be zero). */
static bool g_need_nz;

/* max |a − b| <= 1e-5 · max |b|, and b not all zero (when g_need_nz). */
static void check_close(const char *what, const char *name, const float *a, const float *b, int64_t n)
{
    CHECK_CLOSE_MSG(a, b, n, 0, 1e-5, "rank %d: %s: %s", hp_comm_rank(W), what, name);
    CHECK_MSG(test_max_abs(b, n) > 0 || n == 0 || !g_need_nz, "rank %d: %s: %s is zero", hp_comm_rank(W), what, name);
}

static void run_case(const char *what, hp_moe_archetype a, hp_moe_dims d, int64_t T_all, const hp_moe_run_opts *ro,
                     int chunks)
{
    const int P = hp_comm_size(W), r = hp_comm_rank(W);
    hp_err err;
    g_rng = 0x9E3779B97F4A7C15ull;
    g_need_nz = T_all >= 10;
    hp_moe_layer *full = NULL, *loc = NULL;
    CHECK_MSG(hp_moe_layer_create(&full, a, &d, &err) == HP_OK, "%s", err.msg);
    hp_moe_dims dl = d;
    dl.first_expert = r * (d.n_experts / P);
    dl.n_local = d.n_experts / P;
    CHECK_MSG(hp_moe_layer_create(&loc, a, &dl, &err) == HP_OK, "%s", err.msg);
    if (!full || !loc) {
        hp_moe_layer_free(full);
        hp_moe_layer_free(loc);
        return;
    }
    const int64_t H = d.n_hidden, E = d.n_experts, I = d.d_expert, sI = full->d_shared, L = loc->n_local;
    const int64_t f0 = loc->first_expert;
    double sh = 1.0 / sqrt((double)H);
    for (int64_t i = 0; i < E * H; i++) full->w_router[i] = loc->w_router[i] = 2.0 * sh * rnd();
    for (int64_t e = 0; full->b_router && e < E; e++) full->b_router[e] = loc->b_router[e] = 0.3 * rnd();
    for (int64_t e = 0; full->b_correction && e < E; e++) full->b_correction[e] = loc->b_correction[e] = 0.1 * rnd();
    fill((float *)full->w_gate_up, E * 2 * I * H, sh);
    fill((float *)full->w_down, E * H * I, 1.0 / sqrt((double)I));
    fill((float *)full->b_gate_up, E * 2 * I, 0.2);
    fill((float *)full->b_down, E * H, 0.2);
    memcpy((float *)loc->w_gate_up, (const float *)full->w_gate_up + f0 * 2 * I * H, (size_t)(L * 2 * I * H) * 4);
    memcpy((float *)loc->w_down, (const float *)full->w_down + f0 * H * I, (size_t)(L * H * I) * 4);
    if (full->b_gate_up) memcpy((float *)loc->b_gate_up, full->b_gate_up + f0 * 2 * I, (size_t)(L * 2 * I) * 4);
    if (full->b_down) memcpy((float *)loc->b_down, full->b_down + f0 * H, (size_t)(L * H) * 4);
    if (sI > 0) {
        fill(full->ws_gate_up, 2 * sI * H, sh);
        fill(full->ws_down, H * sI, 1.0 / sqrt((double)sI));
        memcpy(loc->ws_gate_up, full->ws_gate_up, (size_t)(2 * sI * H) * 4);
        memcpy(loc->ws_down, full->ws_down, (size_t)(H * sI) * 4);
        if (full->ws_gate) {
            fill(full->ws_gate, H, sh);
            memcpy(loc->ws_gate, full->ws_gate, (size_t)H * 4);
        }
    }
    float *x_all = malloc((size_t)(T_all * H) * 4), *dy_all = malloc((size_t)(T_all * H) * 4);
    fill(x_all, T_all * H, 1.0);
    fill(dy_all, T_all * H, 1.0);
    const int64_t lo = T_all * r / P, T = T_all * (r + 1) / P - lo, Tc = T > 0 ? T : 1;
    const float *x = x_all + lo * H, *dy = dy_all + lo * H;
    float *y = calloc((size_t)(Tc * H), 4), *dx = calloc((size_t)(Tc * H), 4), *dx_ref = calloc((size_t)(Tc * H), 4);
    hp_moe_ws *ws = NULL;
    hp_moe_ep *ep = NULL;
    hp_moe_grads *gr = NULL, *ge = NULL;
    CHECK_MSG(hp_moe_ws_create(&ws, full, Tc, &err) == HP_OK, "%s", err.msg);
    CHECK_MSG(hp_moe_ep_create_chunked(&ep, loc, W, T_all, chunks, &err) == HP_OK, "%s", err.msg);
    CHECK(hp_moe_grads_create(&gr, full, &err) == HP_OK && hp_moe_grads_create(&ge, loc, &err) == HP_OK);
    if (!ws || !ep || !gr || !ge) goto out;
    /* The reference: the one-process layer on this rank's block. */
    CHECK_MSG(hp_moe_forward(full, ws, x, T, H, y, ro, &err) == HP_OK, "%s", err.msg);
    int64_t dropped = ws->stats.n_dropped;
    CHECK_MSG(hp_moe_backward(full, ws, x, T, dy, dx_ref, gr, &err) == HP_OK, "%s", err.msg);
    /* EP. */
    CHECK_MSG(hp_moe_ep_forward_chunks(ep, x, T, y, ro, false, chunks, &err) == HP_OK, "%s", err.msg);
    CHECK_MSG(hp_moe_ep_backward(ep, x, T, dy, dx, ge, &err) == HP_OK, "%s: %s", what, err.msg);
    if (ro && ro->capacity_factor > 0) {
        double dr = (double)dropped;
        CHECK(hp_comm_allreduce_sum_f64(W, &dr, 1, &err) == HP_OK);
        CHECK_MSG(dr > 0, "%s: no slot dropped on any rank", what);
    }
    if (T > 0) {
        check_close(what, "dx", dx, dx_ref, T * H);
        check_close(what, "d_w_router", ge->d_w_router, gr->d_w_router, E * H);
        if (ge->d_b_router) check_close(what, "d_b_router", ge->d_b_router, gr->d_b_router, E);
        if (sI > 0) {
            check_close(what, "d_ws_gate_up", ge->d_ws_gate_up, gr->d_ws_gate_up, 2 * sI * H);
            check_close(what, "d_ws_down", ge->d_ws_down, gr->d_ws_down, H * sI);
            if (ge->d_ws_gate) check_close(what, "d_ws_gate", ge->d_ws_gate, gr->d_ws_gate, H);
        }
    }
    /* The experts see every rank's rows: sum the references. */
    CHECK(hp_comm_allreduce_sum_f32(W, gr->d_gate_up, (size_t)(E * 2 * I * H), &err) == HP_OK);
    CHECK(hp_comm_allreduce_sum_f32(W, gr->d_down, (size_t)(E * H * I), &err) == HP_OK);
    check_close(what, "d_gate_up", ge->d_gate_up, gr->d_gate_up + f0 * 2 * I * H, L * 2 * I * H);
    check_close(what, "d_down", ge->d_down, gr->d_down + f0 * H * I, L * H * I);
    if (gr->d_b_gate_up) {
        CHECK(hp_comm_allreduce_sum_f32(W, gr->d_b_gate_up, (size_t)(E * 2 * I), &err) == HP_OK);
        CHECK(hp_comm_allreduce_sum_f32(W, gr->d_b_down, (size_t)(E * H), &err) == HP_OK);
        check_close(what, "d_b_gate_up", ge->d_b_gate_up, gr->d_b_gate_up + f0 * 2 * I, L * 2 * I);
        check_close(what, "d_b_down", ge->d_b_down, gr->d_b_down + f0 * H, L * H);
    }
out:
    hp_moe_grads_free(gr);
    hp_moe_grads_free(ge);
    hp_moe_ep_destroy(ep);
    hp_moe_ws_destroy(ws);
    hp_moe_layer_free(full);
    hp_moe_layer_free(loc);
    free(x_all);
    free(dy_all);
    free(y);
    free(dx);
    free(dx_ref);
}

static const hp_moe_run_opts g_plain = {0};

static void test_qwen2(void)
{
    hp_moe_dims d = {.n_hidden = 8, .n_experts = 8, .top_k = 3, .d_expert = 4, .d_shared = 6};
    run_case("qwen2 gated shared", HP_MOE_QWEN2MOE_SHARED_EXPERT_GATE, d, 10, &g_plain, 1);
}

static void test_deepseek(void)
{
    hp_moe_dims d = {.n_hidden = 8, .n_experts = 8, .top_k = 3, .d_expert = 4, .d_shared = 5, .n_group = 4,
                     .topk_group = 2, .routed_scaling_factor = 2.5, .norm_topk_prob = true};
    run_case("deepseek sigmoid group", HP_MOE_DEEPSEEKV3_SIGMOID_GROUP_SHARED, d, 10, &g_plain, 1);
}

static void test_gptoss(void)
{
    hp_moe_dims d = {.n_hidden = 8, .n_experts = 8, .top_k = 2, .d_expert = 4};
    run_case("gpt-oss", HP_MOE_GPTOSS_TOPK_ROUTER, d, 10, &g_plain, 1);
}

static void test_capacity(void)
{
    hp_moe_dims d = {.n_hidden = 8, .n_experts = 8, .top_k = 2, .d_expert = 4, .norm_topk_prob = true};
    hp_moe_run_opts ro = {.capacity_factor = 0.5};
    run_case("mixtral capacity 0.5", HP_MOE_MIXTRAL_TOPK_ROUTER, d, 24, &ro, 1);
}

static void test_empty_rank_and_chunks(void)
{
    hp_moe_dims d = {.n_hidden = 8, .n_experts = 8, .top_k = 2, .d_expert = 4, .norm_topk_prob = true};
    /* Three tokens: at 4 ranks one rank holds none (its gradients of the shared parts stay zero). */
    run_case("three tokens", HP_MOE_QWEN3MOE_TOPK_ROUTER, d, 3, &g_plain, 1);
    run_case("two dispatch chunks", HP_MOE_QWEN3MOE_TOPK_ROUTER, d, 10, &g_plain, 2);
}

int main(int argc, char **argv)
{
    hp_err err;
    if (hp_comm_world(&W, &argc, &argv, &err) != HP_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    hp_moe_set_threads(1);
    static const mpi_test tests[] = {{"qwen2", test_qwen2},
                                     {"deepseek", test_deepseek},
                                     {"gptoss", test_gptoss},
                                     {"capacity", test_capacity},
                                     {"empty_rank_and_chunks", test_empty_rank_and_chunks}};
    int rc = mpi_run_tests(W, tests, sizeof tests / sizeof *tests);
    hp_comm_free(W);
    return rc;
}
