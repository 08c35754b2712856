/*
 * vmath.c — exp over whole rows on the vector units: the loss's Σ exp(z − max) over the vocabulary, SwiGLU's
 * silu and attention's exp(s − m) per key block, where glibc's scalar exp and expf cost more than the
 * arithmetic around them (measured on one thread, 16.4M values: the sum 66–95 → 11–15 ms, silu·u 41–78 →
 * 8–9 ms).
 *
 * One function of each kind, written once in plain C that the compiler vectorizes under `omp simd`, built
 * three times (AVX-512F, AVX2+FMA, portable) and picked at the first call from cpuid (cpu.c):
 *
 *   x  → clamped to [lo, hi] (NaN stays NaN: every comparison with it is false)
 *      → n = round(x / ln 2) with the 1.5·2^m trick: t = x·log2(e) + 1.5·2^m, n = t − 1.5·2^m, and t's low
 *        mantissa bits hold n, so 2^n is (bits(t) << m) + bits(1.0) in integer arithmetic — no conversion
 *      → r = x − n·ln2 (ln 2 in two parts, Cody–Waite), |r| ≤ ln2/2
 *      → exp(r) by its Taylor polynomial (f64: degree 13, f32: degree 7; the first term left out is below
 *        half an ulp of the format at |r| = ln2/2), times 2^n
 *
 * The clamp keeps 2^n a normal number: below lo the result is exp(lo) instead of a subnormal or 0 (the f64
 * lo is −708: 3e-308, nothing next to the sum's largest term 1), above hi exp(hi) instead of overflow
 * (f32: 2.4e38). Measured against glibc's exp/expf over [lo, hi]: at most 2 ulp (tests/test_gemm.c).
 */
#include "kernels/linalg_int.h"

#include <stdatomic.h>
#include <string.h>

static inline double exp_f64(double x)
{
    x = x < -708.0 ? -708.0 : x;
    x = x > 709.0 ? 709.0 : x;
    const double magic = 6755399441055744.0; /* 1.5 · 2^52 */
    double t = x * 1.4426950408889634 + magic, n = t - magic;
    double r = x - n * 6.93147180369123816490e-01 - n * 1.90821492927058770002e-10;
    double p = 1.0 / 6227020800;
    p = p * r + 1.0 / 479001600;
    p = p * r + 1.0 / 39916800;
    p = p * r + 1.0 / 3628800;
    p = p * r + 1.0 / 362880;
    p = p * r + 1.0 / 40320;
    p = p * r + 1.0 / 5040;
    p = p * r + 1.0 / 720;
    p = p * r + 1.0 / 120;
    p = p * r + 1.0 / 24;
    p = p * r + 1.0 / 6;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    uint64_t b;
    memcpy(&b, &t, sizeof b);
    b = (b << 52) + 0x3ff0000000000000ull;
    double s;
    memcpy(&s, &b, sizeof s);
    return p * s;
}

static inline float exp_f32(float x)
{
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    const float magic = 12582912.0f; /* 1.5 · 2^23 */
    float t = x * 1.44269502f + magic, n = t - magic;
    float r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
    float p = 1.0f / 5040;
    p = p * r + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    uint32_t b;
    memcpy(&b, &t, sizeof b);
    b = (b << 23) + 0x3f800000u;
    float s;
    memcpy(&s, &b, sizeof s);
    return p * s;
}

/* The bodies, once; each instantiated below for one instruction set. */
#define SUMEXP_BODY                                                                                                     \
    {                                                                                                                   \
        double s = 0, m = (double)mx;                                                                                   \
        _Pragma("omp simd reduction(+ : s)") for (int64_t i = 0; i < n; i++) s += exp_f64((double)z[i] - m);           \
        return s;                                                                                                       \
    }
#define EXP_ROWS_BODY                                                                                                   \
    {                                                                                                                   \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) x[i] = exp_f32(x[i] - sub) * mul;                          \
    }
#define SILU_BODY                                                                                                       \
    {                                                                                                                   \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                                                           \
            float x = g[i];                                                                                             \
            out[i] = x / (1.0f + exp_f32(-x)) * u[i];                                                                   \
        }                                                                                                               \
    }

__attribute__((target("avx512f"))) static double sumexp_avx512(const float *z, int64_t n, float mx) SUMEXP_BODY
__attribute__((target("avx2,fma"))) static double sumexp_avx2(const float *z, int64_t n, float mx) SUMEXP_BODY
static double sumexp_portable(const float *z, int64_t n, float mx) SUMEXP_BODY

__attribute__((target("avx512f"))) static void silu_avx512(const float *g, const float *u, int64_t n, float *out)
    SILU_BODY
__attribute__((target("avx2,fma"))) static void silu_avx2(const float *g, const float *u, int64_t n, float *out)
    SILU_BODY
static void silu_portable(const float *g, const float *u, int64_t n, float *out) SILU_BODY

__attribute__((target("avx512f"))) static void exp_avx512(float *x, int64_t n, float sub, float mul) EXP_ROWS_BODY
__attribute__((target("avx2,fma"))) static void exp_avx2(float *x, int64_t n, float sub, float mul) EXP_ROWS_BODY
static void exp_portable(float *x, int64_t n, float sub, float mul) EXP_ROWS_BODY

/* 0: not yet known; else 1 + the hp__isa to use (hp__isa_cached). */
static _Atomic int vmath_isa;

static hp__isa isa(void) { return hp__isa_cached(&vmath_isa); }

double hp_linalg_sumexp(const float *z, int64_t n, float mx)
{
    switch (isa()) {
    case HP__ISA_AVX512: return sumexp_avx512(z, n, mx);
    case HP__ISA_AVX2: return sumexp_avx2(z, n, mx);
    default: return sumexp_portable(z, n, mx);
    }
}

void hp_linalg_exp_rows(float *x, int64_t n, float sub, float mul)
{
    switch (isa()) {
    case HP__ISA_AVX512: exp_avx512(x, n, sub, mul); break;
    case HP__ISA_AVX2: exp_avx2(x, n, sub, mul); break;
    default: exp_portable(x, n, sub, mul); break;
    }
}

void hp_linalg_silu_mul(const float *g, const float *u, int64_t n, float *out)
{
    switch (isa()) {
    case HP__ISA_AVX512: silu_avx512(g, u, n, out); break;
    case HP__ISA_AVX2: silu_avx2(g, u, n, out); break;
    default: silu_portable(g, u, n, out); break;
    }
}

void hp__vmath_force(hp__isa isa_) { hp__isa_force(&vmath_isa, isa_); }

double hp__exp_f64_ref(double x) { return exp_f64(x); }
float hp__exp_f32_ref(float x) { return exp_f32(x); }
