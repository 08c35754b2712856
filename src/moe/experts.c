/*
 * experts.c — local expert compute (spec §10.7) and the shared expert(s) (§10.2 combine functions).
 *
 * For local expert e with c rows X_e [c, H] (a contiguous block of the expert-major rows):
 *
 *   G   = X_e · W_gu[e]ᵀ (+ b_gu[e])        [c, 2I]   the layer's stacked gate/up linear, matrix e
 *   A   = act(G[:, :I], G[:, I:])            [c, I]    written over G's first half (row stride 2I)
 *   Y_e = A · W_d[e]ᵀ (+ b_d[e])             [c, H]    the stacked down linear, matrix e
 *
 * The experts go in passes of at most ws->act_rows rows (Tr·K: every row of a one-process call, one chunk's own
 * rows in an EP runtime bounded by dispatch chunks): one grouped
 * gate/up call for every expert of the pass, one activation over the pass's rows, one grouped down call. An
 * expert with more rows than a pass (an EP rank receiving from many ranks) is split over passes. The weights
 * are read in their resident dtype (bf16 stays bf16) by the GEMM layer (hyperpar/linalg.h).
 *
 *   SwiGLU   act(g, u) = g·σ(g) · u
 *   gpt-oss  act(g, u) = (clamp(u, ±lim) + 1) · g'·σ(α·g'),  g' = min(g, lim)   (α = 1.702, lim = 7)
 *
 * Y_e may overwrite X_e (a pass's gate/up products all run before its down products). Experts with no rows
 * are skipped. Threads: the GEMM layer and the activations use the OpenMP pool.
 */
#include "moe/moe_internal.h"

#include <math.h>
#include <omp.h>
#include <string.h>

static void activate(hp_moe_act act, float lim, float alpha, float *g, int64_t m, int64_t d)
{
#pragma omp parallel for schedule(static) if (m * d > 32768)
    for (int64_t r = 0; r < m; r++) {
        float *gr = g + r * 2 * d, *ur = gr + d;
        if (act == HP_MOE_ACT_SWIGLU) {
            for (int64_t i = 0; i < d; i++) gr[i] = gr[i] / (1.0f + expf(-gr[i])) * ur[i];
        } else {
            for (int64_t i = 0; i < d; i++) {
                float gg = gr[i] < lim ? gr[i] : lim;
                float uu = ur[i] < -lim ? -lim : ur[i] > lim ? lim : ur[i];
                gr[i] = (uu + 1.0f) * (gg / (1.0f + expf(-alpha * gg)));
            }
        }
    }
}

/* One pass: groups ws->groups[0..n_g) hold each piece's matrix and row count, row0[i] piece i's first row in
 * rows/out. The pieces lie one after another in act. Runs gate/up, the activation, then down. */
static hp_status run_pass(const hp_moe_layer *l, hp_moe_ws *ws, const float *rows, float *out, int64_t n_g,
                          const int64_t *row0, hp_err *err)
{
    int64_t H = l->n_hidden, di = l->d_expert, pass_rows = 0;
    hp_linear_group *g = ws->groups;
    for (int64_t i = 0; i < n_g; i++) {
        g[i].a = rows + row0[i] * H;
        g[i].lda = H;
        g[i].c = ws->act + pass_rows * 2 * di;
        g[i].ldc = 2 * di;
        pass_rows += g[i].m;
    }
    hp_status st = hp_linear_forward_grouped(ws->lin_gate_up, g, n_g, false, err);
    if (st != HP_OK) return st;
    activate(l->act, l->swiglu_limit, l->swiglu_alpha, ws->act, pass_rows, di);
    for (int64_t i = 0; i < n_g; i++) {
        g[i].a = g[i].c;
        g[i].lda = 2 * di;
        g[i].c = out + row0[i] * H;
        g[i].ldc = H;
    }
    return hp_linear_forward_grouped(ws->lin_down, g, n_g, false, err);
}

hp_status hp_moe_experts_forward(const hp_moe_layer *l, hp_moe_ws *ws, const float *rows, const int64_t *counts,
                                 float *out, hp_err *err)
{
    int64_t H = l->n_hidden, di = l->d_expert, n = l->n_local, cap = ws->act_rows;
    if (ws->n_hidden != H || ws->d_expert != di || ws->n_local != n || !ws->lin_gate_up || !ws->lin_down)
        return hp_err_set(err, HP_ERR_INPUT, "the workspace was created for another layer shape");
    ws->offsets[0] = 0;
    for (int64_t e = 0; e < n; e++) ws->offsets[e + 1] = ws->offsets[e] + counts[e];
    /* A pass holds at most one piece per expert (it ends before an expert would repeat), so n groups. */
    int64_t n_g = 0, pass_rows = 0, *row0 = ws->pass_row0;
    hp_status st = HP_OK;
    for (int64_t e = 0; e < n && st == HP_OK; e++) {
        for (int64_t done = 0; done < counts[e] && st == HP_OK;) {
            if (pass_rows == cap || n_g == n) {
                st = run_pass(l, ws, rows, out, n_g, row0, err);
                n_g = pass_rows = 0;
                if (st != HP_OK) break;
            }
            int64_t m = counts[e] - done < cap - pass_rows ? counts[e] - done : cap - pass_rows;
            ws->groups[n_g] = (hp_linear_group){.mat = e, .m = m};
            row0[n_g] = ws->offsets[e] + done;
            n_g++;
            pass_rows += m;
            done += m;
        }
    }
    if (st == HP_OK && n_g) st = run_pass(l, ws, rows, out, n_g, row0, err);
    return st;
}

hp_status hp_moe_shared_forward(const hp_moe_layer *l, hp_moe_ws *ws, const float *x, int64_t n_tokens, float *y,
                                hp_err *err)
{
    if (l->shared == HP_MOE_SHARED_NONE || !l->ws_gate_up) return HP_OK;
    int64_t H = l->n_hidden, sI = l->d_shared, chunk = ws->row_tokens;
    if (ws->d_shared != sI || ws->n_hidden != H || !ws->shared_act || !ws->lin_sh_gate_up || !ws->lin_sh_down ||
        (l->ws_gate && (!ws->lin_sh_gate || !ws->shared_g)))
        return hp_err_set(err, HP_ERR_INPUT, "the workspace was created for another layer shape");
    hp_status st = HP_OK;
    for (int64_t t0 = 0; t0 < n_tokens && st == HP_OK; t0 += chunk) {
        int64_t m = n_tokens - t0 < chunk ? n_tokens - t0 : chunk;
        const float *xt = x + t0 * H;
        st = hp_linear_forward(ws->lin_sh_gate_up, 0, m, xt, H, ws->shared_act, 2 * sI, false, err);
        if (st != HP_OK) break;
        activate(HP_MOE_ACT_SWIGLU, 0.0f, 0.0f, ws->shared_act, m, sI);
        st = hp_linear_forward(ws->lin_sh_down, 0, m, ws->shared_act, 2 * sI, ws->shared_out, H, false, err);
        /* Qwen2-MoE: σ(shared_expert_gate · x), one scalar per token. */
        if (st == HP_OK && l->ws_gate) st = hp_linear_forward(ws->lin_sh_gate, 0, m, xt, H, ws->shared_g, 1, false, err);
        if (st != HP_OK) break;
#pragma omp parallel for schedule(static) if (m * H > 65536)
        for (int64_t t = 0; t < m; t++) {
            float g = l->ws_gate ? (float)(1.0 / (1.0 + exp(-(double)ws->shared_g[t]))) : 1.0f;
            float *yt = y + (t0 + t) * H;
            const float *so = ws->shared_out + t * H;
            for (int64_t h = 0; h < H; h++) yt[h] += g * so[h];
        }
    }
    return st;
}
