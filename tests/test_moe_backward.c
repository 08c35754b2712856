/*
 * test_moe_backward.c — the sparse layer's backward (hp_moe_backward) against central differences.
 *
 * For a layer, a random x [T, H] and a random dy [T, H], the scalar L = Σ dy·y(x, params) (summed in f64 over
 * the f32 forward) is differentiated numerically: a sample of the entries of x and of every parameter tensor
 * (the largest analytic entry and random ones) is perturbed by ±eps and (L+ − L−) / 2eps compared with the
 * analytic gradient, |fd − an| <= 2e-4 + 2e-3·|an|. The selection is a constant of the step, so a perturbation
 * that changes topk_idx (or the capacity mask) is skipped, and at least half of every tensor's samples must
 * be checked. Every tensor's gradient must also be non-trivial (max |an| > 1e-3): a zero backward fails.
 *
 * Cases: softmax renormalised (Mixtral), softmax without renormalisation (Qwen3-MoE, norm_topk_prob false),
 * Qwen2-MoE's σ-gated shared expert, the sigmoid group router with routed_scaling_factor 2.5 and a plain shared
 * expert (DeepSeek-V3), gpt-oss (router bias, expert biases, clamped SwiGLU), capacity dropping, the first sparse
 * layer of every tests/data/forward/<family> checkpoint (weights widened to f32), bf16 expert weights, the
 * accumulation of two backwards, and the errors.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperpar/model.h"
#include "hyperpar/moe.h"
#include "testlib.h"

#ifndef HP_TEST_DATA
#define HP_TEST_DATA "data"
#endif

static uint64_t g_rng = 88172645463325252ull;
static double rnd(void) /* uniform in [-1, 1) */
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static void fill_f32(float *p, int64_t n, double scale)
{
    for (int64_t i = 0; p && i < n; i++) p[i] = (float)(scale * rnd());
}

/* A layer built in memory with random weights (scaled so that pre-activations stay O(1)). */
static hp_moe_layer *make_layer(hp_moe_archetype a, const hp_moe_dims *d)
{
    hp_err err;
    hp_moe_layer *l = NULL;
    CHECK_MSG(hp_moe_layer_create(&l, a, d, &err) == HP_OK, "%s", err.msg);
    if (!l) return NULL;
    int64_t H = l->n_hidden, E = l->n_experts, I = l->d_expert, n = l->n_local, sI = l->d_shared;
    double sh = 1.0 / sqrt((double)H);
    for (int64_t i = 0; i < E * H; i++) l->w_router[i] = 2.0 * sh * rnd();
    for (int64_t e = 0; l->b_router && e < E; e++) l->b_router[e] = 0.3 * rnd();
    for (int64_t e = 0; l->b_correction && e < E; e++) l->b_correction[e] = 0.1 * rnd();
    if (l->w_dtype == HP_DT_F32) {
        fill_f32((float *)l->w_gate_up, n * 2 * I * H, sh);
        fill_f32((float *)l->w_down, n * H * I, 1.0 / sqrt((double)I));
    }
    fill_f32((float *)l->b_gate_up, n * 2 * I, 0.2);
    fill_f32((float *)l->b_down, n * H, 0.2);
    fill_f32(l->ws_gate_up, 2 * sI * H, sh);
    fill_f32(l->ws_down, H * sI, 1.0 / sqrt((double)(sI > 0 ? sI : 1)));
    fill_f32(l->ws_gate, H, sh);
    return l;
}

/* L = Σ dy·y for a fresh workspace (the workspace may pack the weights, so every evaluation makes its own);
 * idx / keep receive the routing (keep only with a capacity factor). */
static double loss(const hp_moe_layer *l, const float *x, int64_t T, const float *dy, const hp_moe_run_opts *ro,
                   int32_t *idx, uint8_t *keep)
{
    hp_err err;
    hp_moe_ws *ws = NULL;
    int64_t H = l->n_hidden;
    float *y = calloc((size_t)(T * H), sizeof *y);
    double L = NAN;
    if (y && hp_moe_ws_create(&ws, l, T, &err) == HP_OK && hp_moe_forward(l, ws, x, T, H, y, ro, &err) == HP_OK) {
        L = 0.0;
        for (int64_t i = 0; i < T * H; i++) L += (double)dy[i] * y[i];
        memcpy(idx, ws->topk_idx, (size_t)(T * l->top_k) * sizeof *idx);
        if (ro->capacity_factor > 0) memcpy(keep, ws->keep, (size_t)(T * l->top_k));
    }
    hp_moe_ws_destroy(ws);
    free(y);
    return L;
}

typedef struct tensor {
    const char *name;
    float *f;   /* the values (f32) or NULL */
    double *d;  /* the values (f64: the router) or NULL */
    int64_t n;
    const float *grad;
} tensor;

/* Central differences of L over a sample of t's entries against t.grad; returns the worst |fd − an| seen. */
static double check_tensor(const char *what, const hp_moe_layer *l, float *x, int64_t T, const float *dy,
                           const hp_moe_run_opts *ro, const int32_t *idx0, const uint8_t *keep0, tensor t)
{
    int64_t K = l->top_k, S = T * K;
    int32_t *idx = malloc((size_t)S * sizeof *idx);
    uint8_t *keep = calloc((size_t)S, 1);
    double amax = 0.0, worst = 0.0;
    int64_t imax = 0;
    for (int64_t i = 0; i < t.n; i++)
        if (fabs(t.grad[i]) > amax) amax = fabs(t.grad[i]), imax = i;
    CHECK_MSG(amax > 1e-3, "%s: d%s is zero everywhere (max %.3g)", what, t.name, amax);
    const int n_samp = 8;
    int checked = 0;
    const double eps = 1e-2;
    for (int s = 0; s < n_samp && idx && keep; s++) {
        int64_t i = s == 0 ? imax : (int64_t)((rnd() + 1.0) * 0.5 * (double)t.n) % t.n;
        double v0 = t.f ? t.f[i] : t.d[i], Lp = 0, Lm = 0;
        bool same = true;
        for (int side = 0; side < 2; side++) {
            double v = side ? v0 - eps : v0 + eps;
            if (t.f) t.f[i] = (float)v;
            else t.d[i] = v;
            double Ls = loss(l, x, T, dy, ro, idx, keep);
            if (side) Lm = Ls;
            else Lp = Ls;
            same &= memcmp(idx, idx0, (size_t)S * sizeof *idx) == 0 &&
                    (ro->capacity_factor <= 0 || memcmp(keep, keep0, (size_t)S) == 0);
        }
        /* The exact step in the f32 parameter (eps is not a representable f32 offset of every value). */
        double h = t.f ? ((double)(float)(v0 + eps) - (double)(float)(v0 - eps)) : 2 * eps;
        if (t.f) t.f[i] = (float)v0;
        else t.d[i] = v0;
        if (!same) continue;
        checked++;
        double fd = (Lp - Lm) / h, an = t.grad[i], d = fabs(fd - an);
        worst = fmax(worst, d);
        CHECK_MSG(d <= 2e-4 + 2e-3 * fabs(an), "%s: d%s[%lld]: analytic %.6g, central difference %.6g", what, t.name,
                  (long long)i, an, fd);
    }
    CHECK_MSG(checked * 2 >= n_samp, "%s: d%s: only %d of %d perturbations kept the selection", what, t.name, checked,
              n_samp);
    free(idx);
    free(keep);
    return worst;
}

/* The whole check on layer l: forward + backward on random x, dy; central differences for x and every
 * parameter. Returns the number of dropped slots of the forward (capacity cases check it). */
static int64_t check_layer(const char *what, hp_moe_layer *l, int64_t T, const hp_moe_run_opts *ro)
{
    hp_err err;
    int64_t H = l->n_hidden, K = l->top_k, I = l->d_expert, n = l->n_local, E = l->n_experts, sI = l->d_shared;
    float *x = malloc((size_t)(T * H) * sizeof *x), *dy = malloc((size_t)(T * H) * sizeof *dy);
    float *y = calloc((size_t)(T * H), sizeof *y), *dx = calloc((size_t)(T * H), sizeof *dx);
    int32_t *idx0 = malloc((size_t)(T * K) * sizeof *idx0);
    uint8_t *keep0 = calloc((size_t)(T * K), 1);
    hp_moe_ws *ws = NULL;
    hp_moe_grads *g = NULL;
    int64_t dropped = -1;
    if (!x || !dy || !y || !dx || !idx0 || !keep0) goto done;
    fill_f32(x, T * H, 1.0);
    fill_f32(dy, T * H, 1.0);
    CHECK_MSG(hp_moe_ws_create(&ws, l, T, &err) == HP_OK, "%s", err.msg);
    CHECK_MSG(hp_moe_grads_create(&g, l, &err) == HP_OK, "%s", err.msg);
    if (!ws || !g) goto done;
    CHECK_MSG(hp_moe_forward(l, ws, x, T, H, y, ro, &err) == HP_OK, "%s: %s", what, err.msg);
    dropped = ws->stats.n_dropped;
    memcpy(idx0, ws->topk_idx, (size_t)(T * K) * sizeof *idx0);
    if (ro->capacity_factor > 0) memcpy(keep0, ws->keep, (size_t)(T * K));
    CHECK_MSG(hp_moe_backward(l, ws, x, T, dy, dx, g, &err) == HP_OK, "%s: %s", what, err.msg);
    tensor ts[] = {
        {"x", x, NULL, T * H, dx},
        {"w_router", NULL, l->w_router, E * H, g->d_w_router},
        {"b_router", NULL, l->b_router, E, g->d_b_router},
        {"gate_up", l->w_dtype == HP_DT_F32 ? (float *)l->w_gate_up : NULL, NULL, n * 2 * I * H, g->d_gate_up},
        {"down", l->w_dtype == HP_DT_F32 ? (float *)l->w_down : NULL, NULL, n * H * I, g->d_down},
        {"b_gate_up", (float *)l->b_gate_up, NULL, n * 2 * I, g->d_b_gate_up},
        {"b_down", (float *)l->b_down, NULL, n * H, g->d_b_down},
        {"ws_gate_up", l->ws_gate_up, NULL, 2 * sI * H, g->d_ws_gate_up},
        {"ws_down", l->ws_down, NULL, H * sI, g->d_ws_down},
        {"ws_gate", l->ws_gate, NULL, H, g->d_ws_gate},
    };
    double worst = 0.0;
    int n_t = 0;
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) {
        if (!ts[i].f && !ts[i].d) continue;
        CHECK_MSG(ts[i].grad != NULL, "%s: no gradient buffer for %s", what, ts[i].name);
        if (!ts[i].grad) continue;
        worst = fmax(worst, check_tensor(what, l, x, T, dy, ro, idx0, keep0, ts[i]));
        n_t++;
    }
    printf("  %s: %d tensors, worst |fd - an| %.3g, %lld slots dropped\n", what, n_t, worst, (long long)dropped);
done:
    hp_moe_grads_free(g);
    hp_moe_ws_destroy(ws);
    free(x);
    free(dy);
    free(y);
    free(dx);
    free(idx0);
    free(keep0);
    return dropped;
}

static const hp_moe_run_opts g_plain = {0};

static void run_case(const char *what, hp_moe_archetype a, hp_moe_dims d, const hp_moe_run_opts *ro)
{
    hp_moe_layer *l = make_layer(a, &d);
    if (l) check_layer(what, l, 9, ro);
    hp_moe_layer_free(l);
}

TEST(softmax_renormalised_mixtral)
{
    hp_moe_dims d = {.n_hidden = 8, .n_experts = 6, .top_k = 2, .d_expert = 5, .norm_topk_prob = true};
    run_case("mixtral", HP_MOE_MIXTRAL_TOPK_ROUTER, d, &g_plain);
}

TEST(softmax_without_renormalisation_qwen3)
{
    hp_moe_dims d = {.n_hidden = 8, .n_experts = 6, .top_k = 2, .d_expert = 5, .norm_topk_prob = false};
    run_case("qwen3 norm_topk_prob false", HP_MOE_QWEN3MOE_TOPK_ROUTER, d, &g_plain);
}

TEST(gated_shared_expert_qwen2)
{
    hp_moe_dims d = {.n_hidden = 8, .n_experts = 6, .top_k = 3, .d_expert = 4, .d_shared = 6};
    run_case("qwen2 gated shared", HP_MOE_QWEN2MOE_SHARED_EXPERT_GATE, d, &g_plain);
}

TEST(sigmoid_group_deepseek)
{
    hp_moe_dims d = {.n_hidden = 8, .n_experts = 8, .top_k = 3, .d_expert = 4, .d_shared = 5, .n_group = 4,
                     .topk_group = 2, .routed_scaling_factor = 2.5, .norm_topk_prob = true};
    run_case("deepseek sigmoid group", HP_MOE_DEEPSEEKV3_SIGMOID_GROUP_SHARED, d, &g_plain);
    d.norm_topk_prob = false;
    run_case("deepseek sigmoid group, no renormalisation", HP_MOE_DEEPSEEKV3_SIGMOID_GROUP_SHARED, d, &g_plain);
}

TEST(gptoss_biases_clamped)
{
    hp_moe_dims d = {.n_hidden = 8, .n_experts = 6, .top_k = 2, .d_expert = 4};
    hp_moe_layer *l = make_layer(HP_MOE_GPTOSS_TOPK_ROUTER, &d);
    if (!l) return;
    /* A low clamp so that some gate/up entries are clamped (their gradient is zero), as in the real model. */
    l->swiglu_limit = 0.8f;
    check_layer("gpt-oss", l, 9, &g_plain);
    hp_moe_layer_free(l);
}

TEST(capacity_dropping)
{
    hp_moe_dims d = {.n_hidden = 8, .n_experts = 4, .top_k = 2, .d_expert = 4, .norm_topk_prob = true};
    hp_moe_layer *l = make_layer(HP_MOE_QWEN3MOE_TOPK_ROUTER, &d);
    if (!l) return;
    hp_moe_run_opts ro = {.capacity_factor = 0.6};
    int64_t dropped = check_layer("qwen3 capacity 0.6", l, 12, &ro);
    CHECK_MSG(dropped > 0, "no slot was dropped (%lld): the case does not exercise dropping", (long long)dropped);
    hp_moe_layer_free(l);
}

/* The first sparse layer of every checkpoint under tests/data/forward, weights widened to f32 copies. */
TEST(checkpoint_layers)
{
    static const char *fams[] = {"mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss", "glm4_moe", "deepseek_v3"};
    for (size_t f = 0; f < sizeof fams / sizeof *fams; f++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/forward/%s", HP_TEST_DATA, fams[f]);
        hp_err err;
        hp_model *m = NULL;
        CHECK_MSG(hp_model_open(&m, dir, NULL, &err) == HP_OK, "%s: %s", dir, err.msg);
        if (!m) continue;
        int64_t layer = 0;
        while (layer < m->cfg.num_hidden_layers && !hp_model_layer_is_sparse(m, layer)) layer++;
        hp_moe_load_opts lo;
        hp_moe_load_opts_default(&lo);
        lo.no_zero_copy = true;
        lo.widen_f32 = true;
        hp_moe_layer *l = NULL;
        CHECK_MSG(hp_moe_layer_load(&l, m, layer, &lo, &err) == HP_OK, "%s: %s", dir, err.msg);
        if (l) {
            CHECK(l->w_dtype == HP_DT_F32);
            check_layer(fams[f], l, 6, &g_plain);
        }
        hp_moe_layer_free(l);
        hp_model_close(m);
    }
}

/* bf16 expert weights: the backward widens them, so it equals the backward of an f32 layer holding the same
 * (bf16-representable) values; and gradients accumulate over two calls. */
TEST(bf16_weights_and_accumulation)
{
    hp_moe_dims d = {.n_hidden = 8, .n_experts = 4, .top_k = 2, .d_expert = 4, .norm_topk_prob = true};
    hp_moe_layer *lf = make_layer(HP_MOE_MIXTRAL_TOPK_ROUTER, &d);
    d.bf16_weights = true;
    hp_moe_layer *lb = NULL;
    hp_err err;
    CHECK(hp_moe_layer_create(&lb, HP_MOE_MIXTRAL_TOPK_ROUTER, &d, &err) == HP_OK);
    if (!lf || !lb) goto out;
    int64_t H = 8, T = 5, n_gu = 4 * 8 * 8, n_dn = 4 * 8 * 4;
    memcpy(lb->w_router, lf->w_router, (size_t)(4 * H) * sizeof(double));
    /* Round the f32 weights to bf16 (truncation keeps them representable), store both ways. */
    float *fw[2] = {(float *)lf->w_gate_up, (float *)lf->w_down};
    uint16_t *bw[2] = {(uint16_t *)lb->w_gate_up, (uint16_t *)lb->w_down};
    int64_t nw[2] = {n_gu, n_dn};
    for (int k = 0; k < 2; k++)
        for (int64_t i = 0; i < nw[k]; i++) {
            uint32_t u;
            memcpy(&u, &fw[k][i], 4);
            u &= 0xffff0000u;
            memcpy(&fw[k][i], &u, 4);
            bw[k][i] = (uint16_t)(u >> 16);
        }
    float x[5 * 8], dy[5 * 8], y[5 * 8], dxf[5 * 8], dxb[5 * 8];
    fill_f32(x, T * H, 1.0);
    fill_f32(dy, T * H, 1.0);
    hp_moe_ws *wf = NULL, *wb = NULL;
    hp_moe_grads *gf = NULL, *gb = NULL;
    CHECK(hp_moe_ws_create(&wf, lf, T, &err) == HP_OK && hp_moe_ws_create(&wb, lb, T, &err) == HP_OK);
    CHECK(hp_moe_grads_create(&gf, lf, &err) == HP_OK && hp_moe_grads_create(&gb, lb, &err) == HP_OK);
    if (wf && wb && gf && gb) {
        CHECK(hp_moe_forward(lf, wf, x, T, H, y, NULL, &err) == HP_OK);
        CHECK(hp_moe_backward(lf, wf, x, T, dy, dxf, gf, &err) == HP_OK);
        CHECK(hp_moe_forward(lb, wb, x, T, H, y, NULL, &err) == HP_OK);
        CHECK(hp_moe_backward(lb, wb, x, T, dy, dxb, gb, &err) == HP_OK);
        CHECK_CLOSE_MSG(dxb, dxf, T * H, 1e-5, 0, "bf16 vs f32: dx");
        CHECK_CLOSE_MSG(gb->d_gate_up, gf->d_gate_up, n_gu, 1e-5, 0, "bf16 vs f32: d_gate_up");
        /* A second backward adds the same again. */
        float first[4 * 8];
        memcpy(first, gf->d_w_router, sizeof first);
        float d0 = gf->d_down[3];
        CHECK(hp_moe_backward(lf, wf, x, T, dy, dxf, gf, &err) == HP_OK);
        for (int i = 0; i < 32; i++) CHECK(fabsf(gf->d_w_router[i] - 2 * first[i]) <= 1e-6f * (1 + fabsf(first[i])));
        CHECK(test_max_abs(first, 32) > 1e-3);
        CHECK(fabsf(gf->d_down[3] - 2 * d0) <= 1e-6f * (1 + fabsf(d0)));
        hp_moe_grads_zero(gf);
        CHECK(gf->d_w_router[0] == 0.0f && gf->d_gate_up[n_gu - 1] == 0.0f);
    }
    hp_moe_grads_free(gf);
    hp_moe_grads_free(gb);
    hp_moe_ws_destroy(wf);
    hp_moe_ws_destroy(wb);
out:
    hp_moe_layer_free(lf);
    hp_moe_layer_free(lb);
}

TEST(errors)
{
    hp_moe_dims d = {.n_hidden = 8, .n_experts = 4, .top_k = 2, .d_expert = 4};
    hp_moe_layer *l = make_layer(HP_MOE_QWEN3MOE_TOPK_ROUTER, &d), *other = NULL;
    d.d_expert = 6;
    other = make_layer(HP_MOE_QWEN3MOE_TOPK_ROUTER, &d);
    hp_err err;
    hp_moe_ws *ws = NULL;
    hp_moe_grads *g = NULL, *go = NULL;
    if (!l || !other) goto out;
    CHECK(hp_moe_ws_create(&ws, l, 4, &err) == HP_OK);
    CHECK(hp_moe_grads_create(&g, l, &err) == HP_OK);
    CHECK(hp_moe_grads_create(&go, other, &err) == HP_OK);
    if (!ws || !g || !go) goto out;
    float x[4 * 8], dy[4 * 8], y[4 * 8], dx[4 * 8];
    fill_f32(x, 32, 1.0);
    fill_f32(dy, 32, 1.0);
    CHECK(hp_moe_backward(l, ws, x, 4, dy, dx, g, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "no forward ran");
    CHECK(hp_moe_forward(l, ws, x, 4, 8, y, NULL, &err) == HP_OK);
    CHECK(hp_moe_backward(l, ws, x, 3, dy, dx, g, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "last forward routed 4");
    CHECK(hp_moe_backward(l, ws, x, 4, dy, dx, go, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "another layer shape");
    hp_moe_run_opts ro = {.balanced_router = true};
    CHECK(hp_moe_forward(l, ws, x, 4, 8, y, &ro, &err) == HP_OK);
    CHECK(hp_moe_backward(l, ws, x, 4, dy, dx, g, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "balanced");
out:
    hp_moe_grads_free(g);
    hp_moe_grads_free(go);
    hp_moe_ws_destroy(ws);
    hp_moe_layer_free(l);
    hp_moe_layer_free(other);
}

/* The tensor-parallel cut: two layers each holding half of every expert's width (and of the shared expert's;
 * b_down on part 0 only, zeros on part 1, as the loader cuts it) give partial sums whose total is the whole
 * layer's: dx, the router's and the shared gate's gradients add up to the whole layer's, the expert gradients
 * are the whole layer's columns, and d_b_down is whole on both parts. */
static void check_tp_cut(hp_moe_archetype a, hp_moe_dims d)
{
    hp_err err;
    hp_moe_layer *w = make_layer(a, &d), *p[2] = {NULL, NULL};
    int64_t H = d.n_hidden, E = d.n_experts, I = d.d_expert, sI = d.d_shared, h2 = I / 2, s2 = sI / 2, T = 7;
    hp_moe_dims dp = d;
    dp.d_expert = h2;
    dp.d_shared = s2;
    for (int q = 0; q < 2; q++) CHECK(hp_moe_layer_create(&p[q], a, &dp, &err) == HP_OK);
    float x[7 * 8], dy[7 * 8], y[7 * 8], dxw[7 * 8], dxp[2][7 * 8];
    hp_moe_grads *gw = NULL, *gp[2] = {NULL, NULL};
    hp_moe_ws *ws = NULL;
    if (!w || !p[0] || !p[1] || H != 8) goto out;
    fill_f32(x, T * H, 1.0);
    fill_f32(dy, T * H, 1.0);
    for (int q = 0; q < 2; q++) {
        hp_moe_layer *l = p[q];
        memcpy(l->w_router, w->w_router, (size_t)(E * H) * sizeof(double));
        if (w->b_router) memcpy(l->b_router, w->b_router, (size_t)E * sizeof(double));
        if (w->b_correction) memcpy(l->b_correction, w->b_correction, (size_t)E * sizeof(double));
        for (int64_t e = 0; e < E; e++)
            for (int64_t j = 0; j < h2; j++) {
                for (int half = 0; half < 2; half++) {
                    memcpy((float *)l->w_gate_up + (e * 2 * h2 + half * h2 + j) * H,
                           (const float *)w->w_gate_up + (e * 2 * I + half * I + q * h2 + j) * H, (size_t)H * 4);
                    if (w->b_gate_up)
                        ((float *)l->b_gate_up)[e * 2 * h2 + half * h2 + j] =
                            w->b_gate_up[e * 2 * I + half * I + q * h2 + j];
                }
                for (int64_t h = 0; h < H; h++)
                    ((float *)l->w_down)[(e * H + h) * h2 + j] =
                        ((const float *)w->w_down)[(e * H + h) * I + q * h2 + j];
            }
        if (w->b_down && q == 0) memcpy((float *)l->b_down, w->b_down, (size_t)(E * H) * 4);
        for (int64_t j = 0; j < s2; j++) {
            for (int half = 0; half < 2; half++)
                memcpy(l->ws_gate_up + (half * s2 + j) * H, w->ws_gate_up + (half * sI + q * s2 + j) * H,
                       (size_t)H * 4);
            for (int64_t h = 0; h < H; h++) l->ws_down[h * s2 + j] = w->ws_down[h * sI + q * s2 + j];
        }
        if (w->ws_gate) memcpy(l->ws_gate, w->ws_gate, (size_t)H * 4);
    }
    hp_moe_layer *ls[3] = {w, p[0], p[1]};
    float *dxs[3] = {dxw, dxp[0], dxp[1]};
    hp_moe_grads **gs[3] = {&gw, &gp[0], &gp[1]};
    for (int q = 0; q < 3; q++) {
        CHECK(hp_moe_ws_create(&ws, ls[q], T, &err) == HP_OK && hp_moe_grads_create(gs[q], ls[q], &err) == HP_OK);
        if (!ws || !*gs[q]) goto out;
        CHECK(hp_moe_forward(ls[q], ws, x, T, H, y, NULL, &err) == HP_OK);
        CHECK_MSG(hp_moe_backward(ls[q], ws, x, T, dy, dxs[q], *gs[q], &err) == HP_OK, "%s", err.msg);
        hp_moe_ws_destroy(ws);
        ws = NULL;
    }
    {
        /* The two halves put together in the whole layer's layout: dx, the router's and the shared gate's gradients
         * summed, the experts' columns placed (rows [0, h2) of half q's gate and up blocks are the whole's rows
         * [q h2, (q + 1) h2) of its blocks, as the weights were cut above). */
        const char *an = hp_moe_archetype_name(a);
        float dxsum[7 * 8], rsum[8 * 8], gsum[8], gu[8 * 2 * 8 * 8], dn[8 * 8 * 8];
        CHECK(E * H <= 64 && E * 2 * I * H <= 8 * 2 * 8 * 8 && E * H * I <= 8 * 8 * 8);
        if (E * H > 64 || E * 2 * I * H > 8 * 2 * 8 * 8 || E * H * I > 8 * 8 * 8) goto out;
        for (int64_t i = 0; i < T * H; i++) dxsum[i] = dxp[0][i] + dxp[1][i];
        for (int64_t i = 0; i < E * H; i++) rsum[i] = gp[0]->d_w_router[i] + gp[1]->d_w_router[i];
        for (int q = 0; q < 2; q++)
            for (int64_t e = 0; e < E; e++)
                for (int64_t j = 0; j < h2; j++)
                    for (int64_t h = 0; h < H; h++) {
                        for (int half = 0; half < 2; half++)
                            gu[(e * 2 * I + half * I + q * h2 + j) * H + h] =
                                gp[q]->d_gate_up[(e * 2 * h2 + half * h2 + j) * H + h];
                        dn[(e * H + h) * I + q * h2 + j] = gp[q]->d_down[(e * H + h) * h2 + j];
                    }
        CHECK_MSG(test_max_abs(dxw, T * H) > 1e-3, "dx is zero");
        CHECK_CLOSE_MSG(dxsum, dxw, T * H, 1e-5, 0, "%s tp cut: dx", an);
        CHECK_CLOSE_MSG(rsum, gw->d_w_router, E * H, 1e-5, 0, "%s tp cut: router", an);
        CHECK_CLOSE_MSG(gu, gw->d_gate_up, E * 2 * I * H, 1e-5, 0, "%s tp cut: experts' gate_up", an);
        CHECK_CLOSE_MSG(dn, gw->d_down, E * H * I, 1e-5, 0, "%s tp cut: experts' down", an);
        for (int q = 0; gw->d_b_down && q < 2; q++)
            CHECK_CLOSE_MSG(gp[q]->d_b_down, gw->d_b_down, E * H, 1e-5, 0, "%s tp cut: b_down of half %d", an, q);
        if (gw->d_ws_gate) {
            for (int64_t i = 0; i < H; i++) gsum[i] = gp[0]->d_ws_gate[i] + gp[1]->d_ws_gate[i];
            CHECK_CLOSE_MSG(gsum, gw->d_ws_gate, H, 1e-5, 0, "%s tp cut: shared gate", an);
        }
    }
out:
    hp_moe_ws_destroy(ws);
    hp_moe_grads_free(gw);
    for (int q = 0; q < 2; q++) {
        hp_moe_grads_free(gp[q]);
        hp_moe_layer_free(p[q]);
    }
    hp_moe_layer_free(w);
}

TEST(tp_cut_partial_sums)
{
    hp_moe_dims d = {.n_hidden = 8, .n_experts = 4, .top_k = 2, .d_expert = 4, .d_shared = 6};
    check_tp_cut(HP_MOE_QWEN2MOE_SHARED_EXPERT_GATE, d);
    d.d_shared = 0;
    check_tp_cut(HP_MOE_GPTOSS_TOPK_ROUTER, d);
}

TEST_MAIN()
