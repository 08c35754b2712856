/*
 * modules.c — the module computations on local tensors: RMSNorm, rotary embedding, SwiGLU, and the
 * cross-entropy of local logits (attention, the fused kernel, is attention.c).
 *
 * Semantics are transformers' (shared/spec/transformers_forward.md): RMSNorm w·(x·rsqrt(mean(x²)+eps)); rotary
 * rotate_half over the first `rot` channels of each head; eager attention softmax(q·kᵀ·hd^-½ + mask)·v with kv
 * head j serving query heads j·rep .. (j+1)·rep-1; a window W keeps keys j > q − W; silu(g)·u.
 * Reductions that decide the output's accuracy (norm means, softmax sums) run in double.
 *
 * Rows (tokens) are independent, so the loops over them run on the OpenMP threads when they are large (PAR_MIN
 * elements): each row's arithmetic is the same whatever the thread count, so results are bit-identical.
 */
#include "kernels/modules.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void hp__rmsnorm(const float *x, int64_t rows, int64_t H, const float *w, double eps, float *out)
{
#pragma omp parallel for schedule(static) if (rows * H >= HP__PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * H;
        double ss = 0;
        for (int64_t i = 0; i < H; i++) ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / (double)H + eps));
        float *o = out + r * H;
        for (int64_t i = 0; i < H; i++) o[i] = w[i] * (xr[i] * inv);
    }
}

void hp__rope_apply(float *x, int64_t tokens, int64_t heads, int64_t hd, int64_t rot, const float *cos_t,
                    const float *sin_t)
{
    hp__rope_apply_at(x, tokens, heads, hd, 0, rot, cos_t, sin_t);
}

void hp__rope_apply_at(float *x, int64_t tokens, int64_t heads, int64_t stride, int64_t off, int64_t rot,
                       const float *cos_t, const float *sin_t)
{
    int64_t half = rot / 2;
#pragma omp parallel for schedule(static) if (tokens * heads * rot >= HP__PAR_MIN)
    for (int64_t t = 0; t < tokens; t++) {
        const float *c = cos_t + t * half, *s = sin_t + t * half;
        for (int64_t h = 0; h < heads; h++) {
            float *v = x + (t * heads + h) * stride + off;
            for (int64_t i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * c[i] - b * s[i];
                v[i + half] = b * c[i] + a * s[i];
            }
        }
    }
}

void hp__rope_apply_pairs(float *x, int64_t tokens, int64_t heads, int64_t stride, int64_t off, int64_t rot,
                          const float *cos_t, const float *sin_t)
{
    int64_t half = rot / 2;
    float tmp[512];
    for (int64_t t = 0; t < tokens; t++) {
        const float *c = cos_t + t * half, *s = sin_t + t * half;
        for (int64_t h = 0; h < heads; h++) {
            float *v = x + (t * heads + h) * stride + off;
            for (int64_t i = 0; i < half && i < 256; i++) {
                float a = v[2 * i], b = v[2 * i + 1];
                tmp[i] = a * c[i] - b * s[i];
                tmp[i + half] = b * c[i] + a * s[i];
            }
            memcpy(v, tmp, (size_t)rot * sizeof *v);
        }
    }
}

void hp__swiglu(const float *g, int64_t ldg, const float *u, int64_t ldu, int64_t rows, int64_t n, float *out,
                int64_t ldo)
{
#pragma omp parallel for schedule(static) if (rows * n >= HP__PAR_MIN)
    for (int64_t r = 0; r < rows; r++) hp_linalg_silu_mul(g + r * ldg, u + r * ldu, n, out + r * ldo);
}

void hp__row_max_sumexp(const float *z, int64_t n, float mx_in, bool use_mx, float *mx, double *sumexp)
{
    float m = -INFINITY;
    if (use_mx) m = mx_in;
    else
        for (int64_t i = 0; i < n; i++) m = z[i] > m ? z[i] : m;
    *mx = m;
    *sumexp = hp_linalg_sumexp(z, n, m);
}
