/*
 * ref.c — the plain C reference for the GEMM layer: every product summed in f64 in k order, no blocking,
 * no vectors, so it is easy to check by eye. Tests compare every kernel path against it; its second
 * output, Σ|a·w|, is the scale that f32 rounding errors are measured against (an f32 sum of k products
 * is within about k·2^-24·Σ|a·w| of the exact value, and within far less on typical data).
 */
#include "kernels/linalg_int.h"

#include <math.h>

static double weight(hp_dtype wdt, const void *w, int64_t i)
{
    float f = 0.0f;
    hp_dtype_to_f32(wdt, (const char *)w + i * (hp_dtype_bits(wdt) / 8), &f, 1, NULL);
    return f;
}

void hp__gemm_ref(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, hp_dtype wdt, const void *w,
                  const float *bias, bool bf16_mode, double *c, double *abs_sum)
{
    for (int64_t r = 0; r < m; r++) {
        for (int64_t j = 0; j < n; j++) {
            double s = bias ? bias[j] : 0.0, t = bias ? fabs(bias[j]) : 0.0;
            for (int64_t i = 0; i < k; i++) {
                float x = a[r * lda + i];
                float y = (float)weight(wdt, w, j * k + i);
                if (bf16_mode) x = hp_linalg_round_bf16(x), y = hp_linalg_round_bf16(y); /* a bf16 weight stays */
                double p = (double)x * y;
                s += p;
                t += fabs(p);
            }
            c[r * n + j] = s;
            if (abs_sum) abs_sum[r * n + j] = t;
        }
    }
}
