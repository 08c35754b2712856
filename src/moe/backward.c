/*
 * backward.c — the gradient of one sparse layer (issue 22, spec/training.md): the experts' backward on
 * expert-major rows, the token side (dx from the rows, the routing weights' gradient), the routers' backward
 * per kind, the shared expert's, and hp_moe_backward, the one-process composition. ep.c composes the same
 * pieces with the exchanges between them (hp_moe_ep_backward).
 *
 * The routing of the last forward (topk_idx, topk_w, keep) is a constant of the step: the selection has no
 * gradient, a dropped slot contributes nothing. Everything else is recomputed from x: the router's logits (in
 * f64, as the forward), each expert's gate/up and activation, the shared expert's. Notation for one token t
 * with kept slots k (expert e_k, weight w_k), dy = ∂L/∂y[t]:
 *
 *   experts   G = X·W_guᵀ + b_gu [c, 2I], A = act(G) [c, I], O = A·W_dᵀ + b_d [c, H]; with dO = w_k·dy:
 *             dW_d += dOᵀ·A, db_d += Σ dO, dA = dO·W_d, dG = act'(G)·dA, dW_gu += dGᵀ·X, db_gu += Σ dG,
 *             dX = dG·W_gu
 *   tokens    dx[t] += Σ_k dX(t,k),   dw_k = dy·O(t,k)        (O before weighting)
 *   routers   from dw to dz = ∂L/∂logits (z = x·W_rᵀ; p, s, l below are recomputed from z):
 *     softmax, renormalised   p = softmax(z), S = Σ_k p_{e_k}, w_k = p_{e_k}/S:
 *                             dp_{e_k} = (dw_k − Σ_j dw_j·w_j) / S   (S clamped to 1e-20 as the forward:
 *                             then dp = dw / 1e-20); dz_e = p_e·(dp_e − Σ_f p_f·dp_f)
 *     softmax, not renorm.    w_k = p_{e_k}: dp_{e_k} = dw_k, same softmax backward (every logit gets some)
 *     gpt-oss                 l = z + b_r, w = softmax(l_{e_1..e_K}): dl_{e_k} = w_k·(dw_k − Σ_j w_j·dw_j),
 *                             dz = dl, db_r += dl (other experts: 0)
 *     sigmoid (DeepSeek/GLM)  s = σ(z), D = Σ_k s_{e_k} + 1e-20 (or 1 without norm), w_k = ρ·s_{e_k}/D:
 *                             ds_{e_k} = ρ·(dw_k/D − Σ_j dw_j·s_{e_j}/D²) (no norm: ρ·dw_k),
 *                             dz = ds·s·(1 − s); the correction bias only selects: no gradient
 *             dW_r += dzᵀ·x, dx += dz·W_r   (f64)
 *   shared    y[t] += g·S(x[t]), g = σ(x·w_sg) or 1: dS = g·dy through the SwiGLU MLP's backward (as the
 *             experts'), dg = dy·S(x[t]), dw_sg += dg·g(1−g)·x[t], dx[t] += dg·g(1−g)·w_sg
 *
 * Scratch (hp__moe_bwd): one per workspace, allocated by the first backward for the most rows it must hold,
 * and kept; the expert and shared products run in chunks of at most HP__MOE_BWD_CHUNK rows.
 */
#include "moe/moe_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backward.h"

void hp__moe_bwd_free(hp__moe_bwd *b)
{
    if (!b) return;
    free(b->drows);
    free(b->dw);
    free(b->dlog);
    free(b->g);
    free(b->dg);
    free(b->a);
    free(b->da);
    free(b->o);
    free(b->dxc);
    free(b->sdo);
    free(b->wgu);
    free(b->wd);
    free(b);
}

hp_status hp__moe_bwd_get(hp_moe_ws *ws, const hp_moe_ep_shape *s, hp__moe_bwd **out, hp_err *err)
{
    const int64_t rows_max = hp__moe_ep_x_rows(s);
    if (ws->bwd && ws->bwd->rows_max >= rows_max) {
        *out = ws->bwd;
        return HP_OK;
    }
    hp__moe_bwd_free(ws->bwd);
    ws->bwd = NULL;
    hp__moe_bwd *b = hp_calloc(1, sizeof *b);
    if (!b) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    hp_moe_ep_array a[HP_MOE_ARR_COUNT];
    void *p[HP_MOE_ARR_COUNT] = {0};
    int n = hp_moe_bwd_layout(s, a);
    bool ok = hp__moe_alloc_layout(a, n, HP_MOE_ARR_BWD_FIRST, HP_MOE_ARR_COUNT, p, &b->bytes);
    b->rows_max = rows_max;
    b->drows = p[HP_MOE_ARR_BWD_DROWS];
    b->dw = p[HP_MOE_ARR_BWD_DW];
    b->dlog = p[HP_MOE_ARR_BWD_DLOG];
    b->g = p[HP_MOE_ARR_BWD_G];
    b->dg = p[HP_MOE_ARR_BWD_DG];
    b->a = p[HP_MOE_ARR_BWD_A];
    b->da = p[HP_MOE_ARR_BWD_DA];
    b->o = p[HP_MOE_ARR_BWD_O];
    b->dxc = p[HP_MOE_ARR_BWD_DXC];
    b->sdo = p[HP_MOE_ARR_BWD_SDO];
    b->wgu = p[HP_MOE_ARR_BWD_WGU];
    b->wd = p[HP_MOE_ARR_BWD_WD];
    if (!ok) {
        hp__moe_bwd_free(b);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory sizing the MoE backward's scratch for %lld rows",
                          (long long)rows_max);
    }
    ws->bwd = b;
    *out = b;
    return HP_OK;
}

/* The f32 matrix e of a stacked expert weight [n_local, rows, cols]: the layer's own when it holds f32, else
 * widened from bf16 into buf (bf16 → f32 is exact: the 16 bits become the high half). */
static const float *expert_matrix(const hp_moe_layer *l, const void *w, int64_t e, int64_t n, float *buf)
{
    if (l->w_dtype != HP_DT_BF16) return (const float *)w + e * n;
    const uint16_t *s = (const uint16_t *)w + e * n;
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)s[i] << 16;
        memcpy(&buf[i], &u, sizeof u);
    }
    return buf;
}

static void act_forward(hp_moe_act act, float lim, float alpha, const float *g, int64_t m, int64_t d, float *a)
{
    for (int64_t r = 0; r < m; r++) {
        const float *gr = g + r * 2 * d, *ur = gr + d;
        float *ar = a + r * d;
        for (int64_t i = 0; i < d; i++) {
            if (act == HP_MOE_ACT_SWIGLU) {
                ar[i] = gr[i] / (1.0f + expf(-gr[i])) * ur[i];
            } else {
                float gg = gr[i] < lim ? gr[i] : lim;
                float uu = ur[i] < -lim ? -lim : ur[i] > lim ? lim : ur[i];
                ar[i] = (uu + 1.0f) * (gg / (1.0f + expf(-alpha * gg)));
            }
        }
    }
}

/* x as a product of the layer's compute reads it: rounded to bf16 in BF16 mode. */
static float operand(bool r16, float x)
{
    return r16 ? hp_linalg_round_bf16(x) : x;
}

/* One MLP's backward on m rows (the routed experts' and the shared expert's shape): X [m, H] (ldx H),
 * dO [m, H]; recomputes G, A and O (into b->o), writes dX into b->dxc, accumulates dW_gu [2d, H], dW_d [H, d]
 * and the biases (NULL: none). */
static hp_status mlp_backward(const hp_moe_layer *l, hp__moe_bwd *b, hp_moe_act act, int64_t m, int64_t d,
                              const float *X, const float *dO, const float *Wgu, const float *bgu, const float *Wd,
                              const float *bd, float *dWgu, float *dbgu, float *dWd, float *dbd, hp_err *err)
{
    int64_t H = l->n_hidden;
    hp_linalg_mode md = l->compute;
    hp_status st = hp_linalg_gemm(md, false, true, m, 2 * d, H, 1.0f, X, H, Wgu, H, 0.0f, b->g, 2 * d, err);
    if (st != HP_OK) return st;
    if (bgu)
        for (int64_t r = 0; r < m; r++)
            for (int64_t j = 0; j < 2 * d; j++) b->g[r * 2 * d + j] += bgu[j];
    act_forward(act, l->swiglu_limit, l->swiglu_alpha, b->g, m, d, b->a);
    if ((st = hp_linalg_gemm(md, false, true, m, H, d, 1.0f, b->a, d, Wd, d, 0.0f, b->o, H, err)) != HP_OK) return st;
    if (bd)
        for (int64_t r = 0; r < m; r++)
            for (int64_t h = 0; h < H; h++) b->o[r * H + h] += bd[h];
    if ((st = hp__linear_backward(md, m, H, d, dO, H, Wd, b->a, d, b->da, d, dWd, dbd, err)) != HP_OK) return st;
    if (act == HP_MOE_ACT_SWIGLU)
        hp__swiglu_backward(b->g, 2 * d, b->g + d, 2 * d, b->da, d, m, d, b->dg, 2 * d, b->dg + d, 2 * d);
    else
        hp__swiglu_clamped_backward(b->g, 2 * d, b->g + d, 2 * d, b->da, d, m, d, l->swiglu_limit, l->swiglu_alpha,
                                    b->dg, 2 * d, b->dg + d, 2 * d);
    return hp__linear_backward(md, m, 2 * d, H, b->dg, 2 * d, Wgu, X, H, b->dxc, H, dWgu, dbgu, err);
}

hp_status hp__moe_experts_backward(const hp_moe_layer *l, hp__moe_bwd *b, float *rows, float *drows,
                                   const int64_t *counts, hp_moe_grads *g, hp_err *err)
{
    int64_t H = l->n_hidden, I = l->d_expert, r0 = 0;
    for (int64_t e = 0; e < l->n_local; e++) {
        if (counts[e] == 0) continue;
        const float *Wgu = expert_matrix(l, l->w_gate_up, e, 2 * I * H, b->wgu);
        const float *Wd = expert_matrix(l, l->w_down, e, H * I, b->wd);
        for (int64_t done = 0; done < counts[e];) {
            int64_t m = counts[e] - done < HP__MOE_BWD_CHUNK ? counts[e] - done : HP__MOE_BWD_CHUNK;
            float *X = rows + (r0 + done) * H, *dO = drows + (r0 + done) * H;
            hp_status st = mlp_backward(l, b, l->act, m, I, X, dO, Wgu, l->b_gate_up ? l->b_gate_up + e * 2 * I : NULL,
                                        Wd, l->b_down ? l->b_down + e * H : NULL, g->d_gate_up + e * 2 * I * H,
                                        g->d_b_gate_up ? g->d_b_gate_up + e * 2 * I : NULL, g->d_down + e * H * I,
                                        g->d_b_down ? g->d_b_down + e * H : NULL, err);
            if (st != HP_OK) return st;
            memcpy(X, b->dxc, (size_t)(m * H) * sizeof(float));
            memcpy(dO, b->o, (size_t)(m * H) * sizeof(float));
            done += m;
        }
        r0 += counts[e];
    }
    return HP_OK;
}

void hp__moe_dout_rows(const int32_t *row_slot, int64_t n_rows, const float *topk_w, int64_t top_k,
                       const float *dy, int64_t n_hidden, float *drows)
{
    for (int64_t i = 0; i < n_rows; i++) {
        int64_t s = row_slot[i], t = s / top_k;
        for (int64_t h = 0; h < n_hidden; h++) drows[i * n_hidden + h] = topk_w[s] * dy[t * n_hidden + h];
    }
}

void hp__moe_rows_to_dx(const float *dxrows, const int32_t *slot_row, int64_t n_tokens, int64_t top_k,
                        int64_t n_hidden, float *dx)
{
    for (int64_t s = 0; s < n_tokens * top_k; s++) {
        if (slot_row[s] < 0) continue;
        const float *r = dxrows + (int64_t)slot_row[s] * n_hidden;
        float *d = dx + (s / top_k) * n_hidden;
        for (int64_t h = 0; h < n_hidden; h++) d[h] += r[h];
    }
}

void hp__moe_rows_to_dw(const float *outrows, const int32_t *slot_row, int64_t n_tokens, int64_t top_k,
                        int64_t n_hidden, const float *dy, double *dw)
{
    for (int64_t s = 0; s < n_tokens * top_k; s++) {
        dw[s] = 0.0;
        if (slot_row[s] < 0) continue;
        const float *o = outrows + (int64_t)slot_row[s] * n_hidden, *d = dy + (s / top_k) * n_hidden;
        for (int64_t h = 0; h < n_hidden; h++) dw[s] += (double)d[h] * o[h];
    }
}

/* dz [E] of one token from dw [K] (see the file header), z [E] the token's logits (overwritten). */
static void router_row_backward(const hp_moe_layer *l, double *z, const int32_t *idx, const double *dw, double *dz)
{
    int64_t E = l->n_experts, K = l->top_k;
    memset(dz, 0, (size_t)E * sizeof *dz);
    if (l->router == HP_MOE_ROUTER_SOFTMAX_TOPK) {
        double mx = z[0], sum = 0.0;
        for (int64_t e = 1; e < E; e++) mx = z[e] > mx ? z[e] : mx;
        for (int64_t e = 0; e < E; e++) sum += (z[e] = exp(z[e] - mx));
        for (int64_t e = 0; e < E; e++) z[e] /= sum;
        double S = 0.0, dot = 0.0;
        for (int64_t k = 0; k < K; k++) S += z[idx[k]];
        bool clamp = S <= 1e-20;
        for (int64_t k = 0; k < K; k++) dot += dw[k] * z[idx[k]] / (clamp ? 1e-20 : S);
        /* dp over the chosen experts, then the softmax's backward: dz_e = p_e·(dp_e − Σ_f p_f·dp_f). */
        double pdp = 0.0;
        for (int64_t k = 0; k < K; k++) {
            double dp = !l->norm_topk_prob ? dw[k] : clamp ? dw[k] / 1e-20 : (dw[k] - dot) / S;
            dz[idx[k]] = dp;
            pdp += z[idx[k]] * dp;
        }
        for (int64_t e = 0; e < E; e++) dz[e] = z[e] * (dz[e] - pdp);
    } else if (l->router == HP_MOE_ROUTER_SIGMOID_GROUP) {
        double D = 0.0, dot = 0.0, rho = l->routed_scaling_factor;
        for (int64_t k = 0; k < K; k++) D += (z[idx[k]] = 1.0 / (1.0 + exp(-z[idx[k]])));
        D = l->norm_topk_prob ? D + 1e-20 : 1.0;
        for (int64_t k = 0; k < K; k++) dot += dw[k] * z[idx[k]];
        for (int64_t k = 0; k < K; k++) {
            double s = z[idx[k]], ds = l->norm_topk_prob ? rho * (dw[k] / D - dot / (D * D)) : rho * dw[k];
            dz[idx[k]] = ds * s * (1.0 - s);
        }
    } else {
        double mx = -INFINITY, sum = 0.0, dot = 0.0;
        for (int64_t k = 0; k < K; k++) {
            z[idx[k]] += l->b_router ? l->b_router[idx[k]] : 0.0;
            mx = z[idx[k]] > mx ? z[idx[k]] : mx;
        }
        for (int64_t k = 0; k < K; k++) sum += exp(z[idx[k]] - mx);
        for (int64_t k = 0; k < K; k++) dot += dw[k] * exp(z[idx[k]] - mx) / sum;
        for (int64_t k = 0; k < K; k++) {
            double w = exp(z[idx[k]] - mx) / sum;
            dz[idx[k]] = w * (dw[k] - dot);
        }
    }
}

void hp__moe_router_backward(const hp_moe_layer *l, hp_moe_ws *ws, hp__moe_bwd *b, const float *x, int64_t n_tokens,
                             float *dx, hp_moe_grads *g)
{
    int64_t T = n_tokens, H = l->n_hidden, E = l->n_experts, K = l->top_k;
    if (T == 0) return;
    for (int64_t i = 0; i < T * H; i++) ws->x64[i] = x[i];
    hp_linalg_dgemm_nt(T, E, H, ws->x64, H, l->w_router, H, ws->logits, E);
    for (int64_t t = 0; t < T; t++) {
        double *dz = b->dlog + t * E;
        router_row_backward(l, ws->logits + t * E, ws->topk_idx + t * K, b->dw + t * K, dz);
        for (int64_t e = 0; e < E; e++) {
            if (dz[e] == 0.0) continue;
            const double *w = l->w_router + e * H, *xt = ws->x64 + t * H;
            float *dW = g->d_w_router + e * H, *dxt = dx + t * H;
            for (int64_t h = 0; h < H; h++) {
                dW[h] += (float)(dz[e] * xt[h]);
                dxt[h] += (float)(dz[e] * w[h]);
            }
            if (g->d_b_router) g->d_b_router[e] += (float)dz[e];
        }
    }
}

hp_status hp__moe_shared_backward(const hp_moe_layer *l, hp__moe_bwd *b, const float *x, int64_t n_tokens,
                                  const float *dy, float *dx, hp_moe_grads *g, hp_err *err)
{
    if (l->shared == HP_MOE_SHARED_NONE || !l->ws_gate_up || l->d_shared < 1) return HP_OK;
    bool r16 = l->compute == HP_LINALG_BF16; /* the gate's product as the forward's linear multiplied */
    int64_t H = l->n_hidden, sI = l->d_shared;
    for (int64_t t0 = 0; t0 < n_tokens; t0 += HP__MOE_BWD_CHUNK) {
        int64_t m = n_tokens - t0 < HP__MOE_BWD_CHUNK ? n_tokens - t0 : HP__MOE_BWD_CHUNK;
        const float *xt = x + t0 * H, *dyt = dy + t0 * H;
        /* The gate g_t (1 without one) scales dS; the recomputed S comes back in b->o. Without a gate dO is dy. */
        const float *dO = dyt;
        if (l->ws_gate) {
            for (int64_t t = 0; t < m; t++) {
                double z = 0.0;
                for (int64_t h = 0; h < H; h++) z += (double)operand(r16, xt[t * H + h]) * operand(r16, l->ws_gate[h]);
                float gt = (float)(1.0 / (1.0 + exp(-z)));
                for (int64_t h = 0; h < H; h++) b->sdo[t * H + h] = gt * dyt[t * H + h];
            }
            dO = b->sdo;
        }
        hp_status st = mlp_backward(l, b, HP_MOE_ACT_SWIGLU, m, sI, xt, dO, l->ws_gate_up, NULL, l->ws_down, NULL,
                                    g->d_ws_gate_up, NULL, g->d_ws_down, NULL, err);
        if (st != HP_OK) return st;
        for (int64_t t = 0; t < m; t++) {
            float *dxt = dx + (t0 + t) * H;
            for (int64_t h = 0; h < H; h++) dxt[h] += b->dxc[t * H + h];
            if (!l->ws_gate) continue;
            double z = 0.0, dg = 0.0;
            for (int64_t h = 0; h < H; h++) {
                z += (double)operand(r16, xt[t * H + h]) * operand(r16, l->ws_gate[h]);
                dg += (double)dyt[t * H + h] * b->o[t * H + h];
            }
            double gt = 1.0 / (1.0 + exp(-z)), dzg = dg * gt * (1.0 - gt);
            for (int64_t h = 0; h < H; h++) {
                if (g->d_ws_gate) g->d_ws_gate[h] += (float)(dzg * xt[t * H + h]);
                dxt[h] += (float)(dzg * l->ws_gate[h]);
            }
        }
    }
    return HP_OK;
}

hp_status hp__moe_bwd_check(const hp_moe_layer *l, const hp_moe_ws *ws, int64_t n_tokens, const hp_moe_grads *g,
                            hp_err *err)
{
    if (ws->fwd_tokens < 0)
        return hp_err_set(err, HP_ERR_INPUT, "MoE backward: no forward ran on this workspace; run the forward first");
    if (ws->fwd_tokens != n_tokens)
        return hp_err_set(err, HP_ERR_INPUT,
                          "MoE backward of %lld tokens, but the last forward routed %lld; the backward uses the "
                          "routing of the forward on the same x",
                          (long long)n_tokens, (long long)ws->fwd_tokens);
    if (ws->fwd_balanced)
        return hp_err_set(err, HP_ERR_INPUT,
                          "MoE backward: the last forward used the balanced benchmark router, whose indices are not "
                          "the router's; the backward has no gradient for them");
    if (!g || g->n_hidden != l->n_hidden || g->n_experts != l->n_experts || g->n_local != l->n_local ||
        g->d_expert != l->d_expert || g->d_shared != l->d_shared || (l->b_gate_up && !g->d_b_gate_up) ||
        (l->b_router && !g->d_b_router) || (l->ws_gate_up && !g->d_ws_gate_up))
        return hp_err_set(err, HP_ERR_INPUT,
                          "MoE backward: the gradient buffers were created for another layer shape; create them "
                          "with hp_moe_grads_create for this layer");
    return HP_OK;
}

hp_status hp_moe_grads_create(hp_moe_grads **out, const hp_moe_layer *l, hp_err *err)
{
    *out = NULL;
    hp_moe_grads *g = hp_calloc(1, sizeof *g);
    if (!g) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    int64_t H = l->n_hidden, E = l->n_experts, n = l->n_local, I = l->d_expert, sI = l->d_shared;
    g->n_hidden = H;
    g->n_experts = E;
    g->n_local = n;
    g->d_expert = I;
    g->d_shared = sI;
    int64_t n_gu = 0, n_r = 0, n_bgu = 0, n_bd = 0, n_s = 0;
    bool ok = hp_mul_i64(n, 2 * I, &n_bgu) && hp_mul_i64(n_bgu, H, &n_gu) && hp_mul_i64(E, H, &n_r) &&
              hp_mul_i64(n, H, &n_bd) && hp_mul_i64(sI, H, &n_s);
    g->d_gate_up = hp__moe_alloc(n_gu, sizeof(float), &ok);
    g->d_down = hp__moe_alloc(n_gu / 2, sizeof(float), &ok);
    g->d_w_router = hp__moe_alloc(n_r, sizeof(float), &ok);
    if (l->b_gate_up) g->d_b_gate_up = hp__moe_alloc(n_bgu, sizeof(float), &ok);
    if (l->b_down) g->d_b_down = hp__moe_alloc(n_bd, sizeof(float), &ok);
    if (l->b_router) g->d_b_router = hp__moe_alloc(E, sizeof(float), &ok);
    if (l->ws_gate_up && sI > 0) {
        g->d_ws_gate_up = hp__moe_alloc(2 * n_s, sizeof(float), &ok);
        g->d_ws_down = hp__moe_alloc(n_s, sizeof(float), &ok);
        if (l->ws_gate) g->d_ws_gate = hp__moe_alloc(H, sizeof(float), &ok);
    }
    if (!ok) {
        hp_moe_grads_free(g);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory creating the gradients of a layer with %lld local experts",
                          (long long)n);
    }
    *out = g;
    return HP_OK;
}

void hp_moe_grads_zero(hp_moe_grads *g)
{
    if (!g) return;
    int64_t H = g->n_hidden, n = g->n_local, I = g->d_expert, sI = g->d_shared;
    memset(g->d_gate_up, 0, (size_t)(n * 2 * I * H) * sizeof(float));
    memset(g->d_down, 0, (size_t)(n * I * H) * sizeof(float));
    memset(g->d_w_router, 0, (size_t)(g->n_experts * H) * sizeof(float));
    if (g->d_b_gate_up) memset(g->d_b_gate_up, 0, (size_t)(n * 2 * I) * sizeof(float));
    if (g->d_b_down) memset(g->d_b_down, 0, (size_t)(n * H) * sizeof(float));
    if (g->d_b_router) memset(g->d_b_router, 0, (size_t)g->n_experts * sizeof(float));
    if (g->d_ws_gate_up) memset(g->d_ws_gate_up, 0, (size_t)(2 * sI * H) * sizeof(float));
    if (g->d_ws_down) memset(g->d_ws_down, 0, (size_t)(sI * H) * sizeof(float));
    if (g->d_ws_gate) memset(g->d_ws_gate, 0, (size_t)H * sizeof(float));
}

void hp_moe_grads_free(hp_moe_grads *g)
{
    if (!g) return;
    free(g->d_gate_up);
    free(g->d_down);
    free(g->d_b_gate_up);
    free(g->d_b_down);
    free(g->d_w_router);
    free(g->d_b_router);
    free(g->d_ws_gate_up);
    free(g->d_ws_down);
    free(g->d_ws_gate);
    free(g);
}

hp_status hp_moe_backward(const hp_moe_layer *l, hp_moe_ws *ws, const float *x, int64_t n_tokens, const float *dy,
                          float *dx, hp_moe_grads *g, hp_err *err)
{
    int64_t T = n_tokens, H = l->n_hidden, K = l->top_k;
    if (l->first_expert != 0 || l->n_local != l->n_experts)
        return hp_err_set(err, HP_ERR_INPUT,
                          "hp_moe_backward runs every expert in one process, but this layer holds experts [%lld, "
                          "%lld) of %lld; use hp_moe_ep_backward",
                          (long long)l->first_expert, (long long)(l->first_expert + l->n_local),
                          (long long)l->n_experts);
    hp_status st = hp__moe_bwd_check(l, ws, T, g, err);
    hp__moe_bwd *b = NULL;
    hp_moe_ep_shape sh = hp__moe_shape_of(l, ws->max_tokens);
    if (st == HP_OK) st = hp__moe_bwd_get(ws, &sh, &b, err);
    if (st != HP_OK) return st;
    memset(dx, 0, (size_t)(T * H) * sizeof(float));
    if (T == 0) return HP_OK;
    int64_t n = hp_moe_dispatch_prepare(ws->topk_idx, ws->fwd_keep ? ws->keep : NULL, T, K, 0, l->n_local, ws->counts,
                                        ws->offsets, ws->row_slot, ws->slot_row);
    hp_moe_gather(x, H, K, ws->row_slot, n, ws->rows);
    hp__moe_dout_rows(ws->row_slot, n, ws->topk_w, K, dy, H, b->drows);
    if ((st = hp__moe_experts_backward(l, b, ws->rows, b->drows, ws->counts, g, err)) != HP_OK) return st;
    hp__moe_rows_to_dx(ws->rows, ws->slot_row, T, K, H, dx);
    hp__moe_rows_to_dw(b->drows, ws->slot_row, T, K, H, dy, b->dw);
    hp__moe_router_backward(l, ws, b, x, T, dx, g);
    return hp__moe_shared_backward(l, b, x, T, dy, dx, g, err);
}
