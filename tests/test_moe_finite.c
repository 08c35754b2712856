/*
 * test_moe_finite.c — a non-finite output is an error, never a result (issue 10 item 2): hp_moe_forward on
 * layers built in memory fails with HP_ERR_INPUT naming the first bad row and its likely cause — a huge finite
 * input, a NaN router, a routed_scaling_factor past f32 (refused when the layer is made) or one large enough to
 * overflow the combine, a non-finite shared-expert weight — and a finite output is untouched by the check.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperpar/moe.h"
#include "testlib.h"

enum { H = 16, E = 4, K = 2, I = 8, SI = 8, T = 6 };

/* A small layer with smooth deterministic weights. */
static hp_moe_layer *make(hp_moe_archetype a, double scaling, hp_err *err)
{
    hp_moe_dims d = {.n_hidden = H, .n_experts = E, .top_k = K, .d_expert = I,
                     .d_shared = hp_moe_archetype_shared(a) != HP_MOE_SHARED_NONE ? SI : 0,
                     .routed_scaling_factor = scaling, .norm_topk_prob = true};
    hp_moe_layer *l = NULL;
    if (hp_moe_layer_create(&l, a, &d, err) != HP_OK) return NULL;
    for (int i = 0; i < E * H; i++) l->w_router[i] = sin(0.7 * i);
    float *gu = (float *)l->w_gate_up, *dn = (float *)l->w_down;
    for (int i = 0; i < E * 2 * I * H; i++) gu[i] = 0.3f * (float)cos(0.11 * i);
    for (int i = 0; i < E * H * I; i++) dn[i] = 0.3f * (float)sin(0.13 * i);
    for (int i = 0; l->ws_gate_up && i < 2 * SI * H; i++) l->ws_gate_up[i] = 0.2f * (float)cos(0.17 * i);
    for (int i = 0; l->ws_down && i < H * SI; i++) l->ws_down[i] = 0.2f * (float)sin(0.19 * i);
    for (int i = 0; l->ws_gate && i < H; i++) l->ws_gate[i] = 0.1f;
    return l;
}

/* Runs the layer on x; returns the status, err filled. */
static hp_status run(const hp_moe_layer *l, const float *x, float *y, hp_err *err)
{
    hp_moe_ws *ws = NULL;
    hp_status st = hp_moe_ws_create(&ws, l, T, err);
    if (st == HP_OK) st = hp_moe_forward(l, ws, x, T, H, y, NULL, err);
    hp_moe_ws_destroy(ws);
    return st;
}

static void fill_x(float *x)
{
    for (int i = 0; i < T * H; i++) x[i] = (float)sin(0.37 * i);
}

TEST(finite_output_passes)
{
    hp_err err;
    hp_moe_layer *l = make(HP_MOE_QWEN2MOE_SHARED_EXPERT_GATE, 0, &err);
    float x[T * H], y[T * H];
    fill_x(x);
    CHECK_MSG(l && run(l, x, y, &err) == HP_OK, "%s", err.msg);
    bool any = false;
    for (int i = 0; i < T * H; i++) any |= y[i] != 0.0f;
    CHECK(any);
    hp_moe_layer_free(l);
}

/* x finite but 3e38 in one row: the experts' f32 products overflow. */
TEST(huge_input_row_is_named)
{
    hp_err err;
    hp_moe_layer *l = make(HP_MOE_QWEN3MOE_TOPK_ROUTER, 0, &err);
    float x[T * H], y[T * H];
    fill_x(x);
    for (int i = 4 * H; i < 5 * H; i++) x[i] = 3e38f;
    CHECK(l != NULL);
    if (l) CHECK_EQ_INT(run(l, x, y, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "output row 4 is not finite");
    CHECK_STR_CONTAINS(err.msg, "its input reaches 3e+38 in magnitude");
    CHECK_STR_CONTAINS(err.msg, "check the scale of the input");
    hp_moe_layer_free(l);
}

/* A NaN in the router (a layer built in memory is not checked at creation): the routing weights are NaN. */
TEST(nan_router_gives_named_routing_weights)
{
    hp_err err;
    hp_moe_layer *l = make(HP_MOE_QWEN3MOE_TOPK_ROUTER, 0, &err);
    float x[T * H], y[T * H];
    fill_x(x);
    if (l) l->w_router[3] = NAN;
    CHECK(l != NULL);
    if (l) CHECK_EQ_INT(run(l, x, y, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "output row 0 is not finite");
    CHECK_STR_CONTAINS(err.msg, "is NaN; the router's weights are corrupt");
    hp_moe_layer_free(l);
}

/* routed_scaling_factor past f32 is refused when the layer is made; 1e37 passes creation, and the combine
 * overflows: the message points at the factor. */
TEST(routed_scaling_factor_overflow)
{
    hp_err err;
    hp_moe_layer *l = make(HP_MOE_DEEPSEEKV3_SIGMOID_GROUP_SHARED, 1e308, &err);
    CHECK(l == NULL);
    CHECK_STR_CONTAINS(err.msg, "routed_scaling_factor 1e+308 (config.json) takes the routing weights past f32");
    l = make(HP_MOE_DEEPSEEKV3_SIGMOID_GROUP_SHARED, 1e37, &err);
    float x[T * H], y[T * H];
    fill_x(x);
    for (int i = 0; i < T * H; i++) x[i] *= 1000.0f; /* expert outputs of ~1e3..1e6: times 1e37 overflow f32 */
    CHECK_MSG(l != NULL, "%s", err.msg);
    if (l) CHECK_EQ_INT(run(l, x, y, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "is not finite");
    CHECK_STR_CONTAINS(err.msg, "(after routed_scaling_factor)");
    CHECK_STR_CONTAINS(err.msg, "config.json routed_scaling_factor");
    hp_moe_layer_free(l);
}

/* A non-finite shared-expert weight in a layer built in memory (the loader refuses it from a file). */
TEST(nan_shared_expert_is_named)
{
    hp_err err;
    hp_moe_layer *l = make(HP_MOE_QWEN2MOE_SHARED_EXPERT_GATE, 0, &err);
    float x[T * H], y[T * H];
    fill_x(x);
    if (l) l->ws_down[H * 0 + 5] = -INFINITY;
    CHECK(l != NULL);
    if (l) CHECK_EQ_INT(run(l, x, y, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "the shared expert's down projection holds -Inf at row 0, column 5");
    hp_moe_layer_free(l);
}

TEST_MAIN()
