/*
 * backward.c — the backward of the module computations of modules.c on local tensors: RMSNorm (and the
 * per-head q/k norm), the rotary embedding in its three layouts, SwiGLU and gpt-oss's clamped SwiGLU, the
 * cross-entropy of a vocabulary slice, the vocab-parallel embedding and the linear. Attention's backward is
 * attention.c's, next to the forward kernel whose blocks and masks it shares. The math of each is above its declaration in backward.h.
 *
 * Each function is a pure function of its inputs (no rank, no mesh): the runner calls them on the local shards
 * and adds the collectives that the layouts ask for. Reductions that decide a gradient's accuracy (the norm's
 * Σ w·dy·x, attention's D = Σ P·dP, the sinks' sums) run in double, like the forward's.
 */
#include "kernels/backward.h"
#include "kernels/linalg_int.h"
#include "hyperpar/linalg.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void hp__rmsnorm_backward(const float *x, int64_t rows, int64_t H, const float *w, double eps, const float *dy,
                          float *dx, float *dw)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * H, *gr = dy + r * H;
        double ss = 0, dot = 0;
        for (int64_t i = 0; i < H; i++) {
            ss += (double)xr[i] * xr[i];
            dot += (double)w[i] * gr[i] * xr[i];
        }
        double inv = 1.0 / sqrt(ss / (double)H + eps);
        double c = dot * inv * inv * inv / (double)H;
        if (dw)
            for (int64_t i = 0; i < H; i++) dw[i] += (float)((double)gr[i] * xr[i] * inv);
        float *o = dx + r * H;
        for (int64_t i = 0; i < H; i++) o[i] = (float)(inv * w[i] * gr[i] - c * xr[i]);
    }
}

void hp__rope_backward(float *dx, int64_t tokens, int64_t heads, int64_t hd, int64_t rot, const float *cos_t,
                       const float *sin_t)
{
    hp__rope_backward_at(dx, tokens, heads, hd, 0, rot, cos_t, sin_t);
}

/* Forward: (a, b) → (a·c − b·s, b·c + a·s). Its transpose: (da, db) = (dy0·c + dy1·s, dy1·c − dy0·s). */
void hp__rope_backward_at(float *dx, int64_t tokens, int64_t heads, int64_t stride, int64_t off, int64_t rot,
                          const float *cos_t, const float *sin_t)
{
    int64_t half = rot / 2;
    for (int64_t t = 0; t < tokens; t++) {
        const float *c = cos_t + t * half, *s = sin_t + t * half;
        for (int64_t h = 0; h < heads; h++) {
            float *v = dx + (t * heads + h) * stride + off;
            for (int64_t i = 0; i < half; i++) {
                float g0 = v[i], g1 = v[i + half];
                v[i] = g0 * c[i] + g1 * s[i];
                v[i + half] = g1 * c[i] - g0 * s[i];
            }
        }
    }
}

/* Forward: pair i = (x[2i], x[2i+1]) → out[i], out[i + half]. Backward reads the gradient at out[i],
 * out[i + half] and writes x's gradient at 2i, 2i+1. The forward handles at most 256 pairs (rot ≤ 512). */
void hp__rope_backward_pairs(float *dx, int64_t tokens, int64_t heads, int64_t stride, int64_t off, int64_t rot,
                             const float *cos_t, const float *sin_t)
{
    int64_t half = rot / 2;
    float tmp[512];
    for (int64_t t = 0; t < tokens; t++) {
        const float *c = cos_t + t * half, *s = sin_t + t * half;
        for (int64_t h = 0; h < heads; h++) {
            float *v = dx + (t * heads + h) * stride + off;
            for (int64_t i = 0; i < half && i < 256; i++) {
                float g0 = v[i], g1 = v[i + half];
                tmp[2 * i] = g0 * c[i] + g1 * s[i];
                tmp[2 * i + 1] = g1 * c[i] - g0 * s[i];
            }
            memcpy(v, tmp, (size_t)rot * sizeof *v);
        }
    }
}

void hp__swiglu_backward(const float *g, int64_t ldg, const float *u, int64_t ldu, const float *dy, int64_t ldy,
                         int64_t rows, int64_t n, float *dg, int64_t lddg, float *du, int64_t lddu)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++) {
            float x = g[r * ldg + i], y = u[r * ldu + i], d = dy[r * ldy + i];
            float s = 1.0f / (1.0f + expf(-x));
            dg[r * lddg + i] = d * y * s * (1.0f + x * (1.0f - s));
            du[r * lddu + i] = d * x * s;
        }
}

void hp__swiglu_clamped_backward(const float *g, int64_t ldg, const float *u, int64_t ldu, const float *dy,
                                 int64_t ldy, int64_t rows, int64_t n, float lim, float alpha, float *dg,
                                 int64_t lddg, float *du, int64_t lddu)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++) {
            float x = g[r * ldg + i], y = u[r * ldu + i], d = dy[r * ldy + i];
            float gg = x < lim ? x : lim;
            float uu = y < -lim ? -lim : y > lim ? lim : y;
            float s = 1.0f / (1.0f + expf(-alpha * gg));
            dg[r * lddg + i] = x <= lim ? d * (uu + 1.0f) * (s + alpha * gg * s * (1.0f - s)) : 0.0f;
            du[r * lddu + i] = (y >= -lim && y <= lim) ? d * gg * s : 0.0f;
        }
}

void hp__xent_backward(const float *z, int64_t ldz, int64_t rows, int64_t n, int64_t vlo, const float *mx,
                       const double *sumexp, const int64_t *label, double scale, float *dz, int64_t lddz)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *zr = z + r * ldz;
        float *o = dz + r * lddz;
        if (label[r] < 0) {
            for (int64_t j = 0; j < n; j++) o[j] = 0.0f;
            continue;
        }
        double inv = scale / sumexp[r];
        if (o != zr) memmove(o, zr, (size_t)n * sizeof *o);
        hp_linalg_exp_rows(o, n, mx[r], (float)inv);
        int64_t lj = label[r] - vlo;
        if (lj >= 0 && lj < n) o[lj] = (float)((double)o[lj] - scale);
    }
}

void hp__embedding_backward(const int64_t *ids, int64_t n_tokens, const float *dy, int64_t H, int64_t vlo,
                            int64_t n_rows, float *dW)
{
    for (int64_t t = 0; t < n_tokens; t++) {
        int64_t r = ids[t] - vlo;
        if (r < 0 || r >= n_rows) continue;
        float *w = dW + r * H;
        const float *g = dy + t * H;
        for (int64_t i = 0; i < H; i++) w[i] += g[i];
    }
}

hp_status hp__linear_backward(hp_linalg_mode mode, int64_t M, int64_t N, int64_t K, const float *dy, int64_t ldy,
                              const float *W, const float *x, int64_t ldx, float *dx, int64_t lddx, float *dW, float *db,
                              hp_err *err)
{
    hp_status st = HP_OK;
    /* a dense linear's shapes repeat step after step: its large products may take fixed-shape primitives */
    if (dx) st = hp__linalg_gemm(mode, true, false, false, M, K, N, 1.0f, dy, ldy, W, K, 0.0f, dx, lddx, err);
    if (dW && st == HP_OK)
        st = hp__linalg_gemm(mode, true, true, false, N, K, M, 1.0f, dy, ldy, x, ldx, 1.0f, dW, K, err);
    if (st != HP_OK) return st;
    if (db)
        for (int64_t j = 0; j < N; j++) {
            double s = 0;
            for (int64_t r = 0; r < M; r++) s += dy[r * ldy + j];
            db[j] += (float)s;
        }
    return HP_OK;
}
