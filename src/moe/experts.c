/*
 * experts.c — local expert compute (spec §10.7) and the shared expert(s) (§10.2 combine functions).
 *
 * For local expert e with c rows X_e [c, H] (a contiguous block of the expert-major rows), in chunks of at
 * most ws->max_tokens rows:
 *
 *   G   = X_e · W_gu[e]ᵀ (+ b_gu[e])        [c, 2I]   one sgemm (sgemv when c == 1)
 *   A   = act(G[:, :I], G[:, I:])            [c, I]    written over G's first half (row stride 2I)
 *   Y_e = A · W_d[e]ᵀ (+ b_d[e])             [c, H]    one sgemm (sgemv when c == 1)
 *
 *   SwiGLU   act(g, u) = g·σ(g) · u
 *   gpt-oss  act(g, u) = (clamp(u, ±lim) + 1) · g'·σ(α·g'),  g' = min(g, lim)   (α = 1.702, lim = 7)
 *
 * Y_e may overwrite X_e (X_e is consumed by the first product). Experts with no rows are skipped.
 * Threads: the BLAS calls use OpenBLAS's threads; the activations use OpenMP.
 */
#include "moe/moe_internal.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

/* C [m, n] = A [m, k] · Wᵀ (W [n, k]) (+ bias): sgemm, or for m = 1 a matrix-vector product that reads
 * the weight once without packing it (the decode case). */
static void linear(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *w, const float *bias,
                   float *c, int64_t ldc)
{
    float beta = 0.0f;
    if (bias) {
        for (int64_t r = 0; r < m; r++) memcpy(c + r * ldc, bias, (size_t)n * sizeof *c);
        beta = 1.0f;
    }
    if (m == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)n, (int)k, 1.0f, w, (int)k, a, 1, beta, c, 1);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)n, (int)k, 1.0f, a, (int)lda, w, (int)k,
                    beta, c, (int)ldc);
}

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

/* Expert e's rows [off, off + count) in chunks of at most `chunk` rows through the scratch act. */
static void run_expert(const hp_moe_layer *l, int64_t e, const float *rows, int64_t off, int64_t count,
                       int64_t chunk, float *act, float *out)
{
    int64_t H = l->n_hidden, di = l->d_expert;
    const float *wgu = l->w_gate_up + e * 2 * di * H, *wd = l->w_down + e * H * di;
    const float *bgu = l->b_gate_up ? l->b_gate_up + e * 2 * di : NULL;
    const float *bd = l->b_down ? l->b_down + e * H : NULL;
    for (int64_t r0 = 0; r0 < count; r0 += chunk) {
        int64_t m = count - r0 < chunk ? count - r0 : chunk;
        linear(m, 2 * di, H, rows + (off + r0) * H, H, wgu, bgu, act, 2 * di);
        activate(l->act, l->swiglu_limit, l->swiglu_alpha, act, m, di);
        linear(m, H, di, act, 2 * di, wd, bd, out + (off + r0) * H, H);
    }
}

hp_status hp_moe_experts_forward(const hp_moe_layer *l, hp_moe_ws *ws, const float *rows, const int64_t *counts,
                                 float *out, hp_err *err)
{
    int64_t H = l->n_hidden, di = l->d_expert, chunk = ws->max_tokens, n = l->n_local;
    if (ws->n_hidden != H || ws->d_expert != di || ws->n_local != n)
        return hp_err_set(err, HP_ERR_INPUT, "the workspace was created for another layer shape");
    int64_t n_active = 0;
    ws->offsets[0] = 0;
    for (int64_t e = 0; e < n; e++) {
        ws->offsets[e + 1] = ws->offsets[e] + counts[e];
        n_active += counts[e] > 0;
    }
    int nt = ws->n_threads;
    /* Few rows per expert (decode): matrix-vector products are memory bound and BLAS's own threads split
     * each weight read evenly; the expert-parallel schedule pays off once the products are compute bound. */
    bool many_rows = n_active > 0 && ws->offsets[n] >= 8 * n_active;
    if (nt > 1 && n_active >= nt && many_rows && !omp_in_parallel()) {
        /* Experts in parallel, one BLAS thread each: while one core streams an expert's weights into its
         * packing buffers the other computes, instead of all cores packing then all computing. */
        int saved = openblas_get_num_threads();
        openblas_set_num_threads(1);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
        for (int64_t e = 0; e < n; e++)
            if (counts[e])
                run_expert(l, e, rows, ws->offsets[e], counts[e], chunk,
                           ws->act + (int64_t)omp_get_thread_num() * chunk * 2 * di, out);
        openblas_set_num_threads(saved);
    } else {
        for (int64_t e = 0; e < n; e++)
            if (counts[e]) run_expert(l, e, rows, ws->offsets[e], counts[e], chunk, ws->act, out);
    }
    return HP_OK;
}

hp_status hp_moe_shared_forward(const hp_moe_layer *l, hp_moe_ws *ws, const float *x, int64_t n_tokens, float *y,
                                hp_err *err)
{
    if (l->shared == HP_MOE_SHARED_NONE || !l->ws_gate_up) return HP_OK;
    int64_t H = l->n_hidden, sI = l->d_shared, chunk = ws->max_tokens;
    if (ws->d_shared != sI || ws->n_hidden != H || !ws->shared_act)
        return hp_err_set(err, HP_ERR_INPUT, "the workspace was created for another layer shape");
    for (int64_t t0 = 0; t0 < n_tokens; t0 += chunk) {
        int64_t m = n_tokens - t0 < chunk ? n_tokens - t0 : chunk;
        const float *xt = x + t0 * H;
        linear(m, 2 * sI, H, xt, H, l->ws_gate_up, NULL, ws->shared_act, 2 * sI);
        activate(HP_MOE_ACT_SWIGLU, 0.0f, 0.0f, ws->shared_act, m, sI);
        linear(m, H, sI, ws->shared_act, 2 * sI, l->ws_down, NULL, ws->shared_out, H);
#pragma omp parallel for schedule(static) if (m * H > 65536)
        for (int64_t t = 0; t < m; t++) {
            float g = 1.0f;
            if (l->ws_gate) {
                /* Qwen2-MoE: σ(shared_expert_gate · x), one scalar per token (dot in f64). */
                double d = 0.0;
                for (int64_t h = 0; h < H; h++) d += (double)xt[t * H + h] * l->ws_gate[h];
                g = (float)(1.0 / (1.0 + exp(-d)));
            }
            float *yt = y + (t0 + t) * H;
            const float *st = ws->shared_out + t * H;
            for (int64_t h = 0; h < H; h++) yt[h] += g * st[h];
        }
    }
    return HP_OK;
}
