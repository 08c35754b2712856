/*
 * adamw.c — one step of torch.optim.AdamW (decoupled weight decay, bias-corrected moments) on a flat f32
 * parameter, its gradient and its two f32 moments.
 *
 * Precision: each element is computed in double from its f32 inputs and rounded to f32 once per stored value
 * (p, m, v), in PyTorch's order of operations (_single_tensor_adamw: p·(1 − lr·wd); m lerp'd toward g;
 * v·β2 + (1 − β2)·g²; denom = √v / √(1 − β2^t) + eps; p −= (lr / (1 − β1^t)) · m / denom). PyTorch rounds to f32
 * after each of those tensor operations instead; the difference is a few f32 ulps of the update, far inside the
 * end-to-end bar (1e-6·max|p| + 1e-7 per tensor, tests/test_backward.c).
 *
 * Speed: the step is a pass over 7 f32 arrays-worth of memory per element, with a square root and two divisions
 * in double. The element function is written once over a vector of lanes (`ADAMW_LANES` below) and compiled for
 * AVX-512 (8 doubles), AVX2 (4) and plain C (1); each lane does the same IEEE operations (+, −, ×, ÷, √, each
 * correctly rounded; this file is compiled with -ffp-contract=off, so no multiply-add is fused), so every
 * instruction set stores the same bits, and the check below classifies exactly what the step will store.
 */
#include "kernels/backward.h"
#include "kernels/linalg_int.h"

#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>

/* The step's constants, shared by the update and its check so that both compute every element the same way. */
typedef struct adamw_k {
    double lr, b1, b2, step_size, bc2_sqrt, decay, eps;
} adamw_k;

static adamw_k adamw_consts(const hp__adamw *opt, int64_t step)
{
    double b1 = opt->beta1, b2 = opt->beta2;
    double bc1 = 1.0 - pow(b1, (double)step), bc2 = 1.0 - pow(b2, (double)step);
    return (adamw_k){.lr = opt->lr, .b1 = b1, .b2 = b2, .step_size = opt->lr / bc1, .bc2_sqrt = sqrt(bc2),
                     .decay = 1.0 - opt->lr * opt->weight_decay, .eps = opt->eps};
}

/* One element's new (p, m, v), each rounded to f32 once: the reference every vector form below equals. */
static inline void adamw_elem(const adamw_k *k, float param, float grad, float m, float v, float *po, float *mo,
                              float *vo)
{
    double g = grad;
    double p = (double)param * k->decay;
    double mi = (double)m + (1.0 - k->b1) * (g - (double)m);
    double vi = (double)v * k->b2 + (1.0 - k->b2) * g * g;
    double denom = sqrt(vi) / k->bc2_sqrt + k->eps;
    p -= k->step_size * mi / denom;
    *mo = (float)mi;
    *vo = (float)vi;
    *po = (float)p;
}

static inline bool elem_bad(float po, float mo, float vo)
{
    return !isfinite(po) || !isfinite(mo) || !isfinite(vo) || vo < 0;
}

/* ADAMW_LANES(D, S, ...): the element function over one vector: D the double vector type, S the float one;
 * LD/ST load/store S, W widens S to D, N narrows D to S; B broadcasts a double; ADD SUB MUL DIV SQRT. Computes
 * (po, mo, vo) for the lanes at p, g, m, v. The same operations, in the same order, as adamw_elem. */
#define ADAMW_LANES(D, S, LD, W, N, B, ADD, SUB, MUL, DIV, SQRT, k, p_, g_, m_, v_, po, mo, vo)                     \
    do {                                                                                                        \
        D g__ = W(LD(g_)), md__ = W(LD(m_)), vd__ = W(LD(v_));                                                         \
        D pp__ = MUL(W(LD(p_)), B((k)->decay));                                                                   \
        D mi__ = ADD(md__, MUL(B(1.0 - (k)->b1), SUB(g__, md__)));                                                      \
        D vi__ = ADD(MUL(vd__, B((k)->b2)), MUL(MUL(B(1.0 - (k)->b2), g__), g__));                                      \
        D den__ = ADD(DIV(SQRT(vi__), B((k)->bc2_sqrt)), B((k)->eps));                                            \
        pp__ = SUB(pp__, DIV(MUL(B((k)->step_size), mi__), den__));                                                   \
        po = N(pp__), mo = N(mi__), vo = N(vi__);                                                                     \
    } while (0)

#define L512(x) _mm256_loadu_ps(x)
#define W512(x) _mm512_cvtps_pd(x)
#define N512(x) _mm512_cvtpd_ps(x)
#define LANES512(k, p_, g_, m_, v_, po, mo, vo)                                                                  \
    ADAMW_LANES(__m512d, __m256, L512, W512, N512, _mm512_set1_pd, _mm512_add_pd, _mm512_sub_pd, _mm512_mul_pd,  \
                _mm512_div_pd, _mm512_sqrt_pd, k, p_, g_, m_, v_, po, mo, vo)
#define L256(x) _mm_loadu_ps(x)
#define W256(x) _mm256_cvtps_pd(x)
#define N256(x) _mm256_cvtpd_ps(x)
#define LANES256(k, p_, g_, m_, v_, po, mo, vo)                                                                  \
    ADAMW_LANES(__m256d, __m128, L256, W256, N256, _mm256_set1_pd, _mm256_add_pd, _mm256_sub_pd, _mm256_mul_pd,  \
                _mm256_div_pd, _mm256_sqrt_pd, k, p_, g_, m_, v_, po, mo, vo)

/* Whether every lane of (po, mo, vo) is good: |x| < inf is false for inf and NaN; v >= 0 false for negatives, NaN.
 * GOOD4 tests 4 lanes (__m128), GOOD8 8 (__m256, as two halves). inf, zero and sign are the caller's constants. */
#define GOOD4(po, mo, vo)                                                                                        \
    (_mm_movemask_ps(_mm_and_ps(_mm_and_ps(_mm_cmplt_ps(_mm_andnot_ps(sign, po), inf),                           \
                                           _mm_cmplt_ps(_mm_andnot_ps(sign, mo), inf)),                          \
                                _mm_and_ps(_mm_cmpge_ps(vo, zero), _mm_cmplt_ps(vo, inf)))) == 0xf)
#define GOOD8(po, mo, vo)                                                                                        \
    (GOOD4(_mm256_castps256_ps128(po), _mm256_castps256_ps128(mo), _mm256_castps256_ps128(vo)) &&                \
     GOOD4(_mm256_extractf128_ps(po, 1), _mm256_extractf128_ps(mo, 1), _mm256_extractf128_ps(vo, 1)))

/* The range functions of one instruction set, W lanes of S floats at a time: NAME_step stores the vector part of
 * [0, n) and returns where it stopped (the caller does the tail element by element with adamw_elem); NAME_check
 * returns the first index whose vector holds a bad lane, rounded down to its vector (the elements before it are
 * good; the caller finds the lane element by element). */
#define RANGE_FNS(NAME, TARGET, W, S, LANES, STORE, GOOD)                                                       \
    __attribute__((target(TARGET))) static int64_t NAME##_step(const adamw_k *k, float *p, const float *g,      \
                                                               float *m, float *v, int64_t n)                  \
    {                                                                                                            \
        int64_t i = 0;                                                                                           \
        for (; i + W <= n; i += W) {                                                                             \
            S po, mo, vo;                                                                                        \
            LANES(k, p + i, g + i, m + i, v + i, po, mo, vo);                                                    \
            STORE(p + i, po), STORE(m + i, mo), STORE(v + i, vo);                                                \
        }                                                                                                        \
        return i;                                                                                                \
    }                                                                                                            \
    __attribute__((target(TARGET))) static int64_t NAME##_check(const adamw_k *k, const float *p, const float *g, \
                                                                const float *m, const float *v, int64_t n)      \
    {                                                                                                            \
        const __m128 inf = _mm_set1_ps(INFINITY), zero = _mm_setzero_ps(), sign = _mm_set1_ps(-0.0f);           \
        int64_t i = 0;                                                                                           \
        for (; i + W <= n; i += W) {                                                                             \
            S po, mo, vo;                                                                                        \
            LANES(k, p + i, g + i, m + i, v + i, po, mo, vo);                                                    \
            if (!GOOD(po, mo, vo)) break;                                                                        \
        }                                                                                                        \
        return i;                                                                                                \
    }

RANGE_FNS(avx512, "avx512f", 8, __m256, LANES512, _mm256_storeu_ps, GOOD8)
RANGE_FNS(avx2, "avx2", 4, __m128, LANES256, _mm_storeu_ps, GOOD4)

/* 0: not yet known; else 1 + the hp__isa to use (hp__isa_cached). */
static _Atomic int adamw_isa;

static hp__isa isa(void) { return hp__isa_cached(&adamw_isa); }

void hp__adamw_force(hp__isa isa_) { hp__isa_force(&adamw_isa, isa_); }

static void step_range(const adamw_k *k, float *p, const float *g, float *m, float *v, int64_t n)
{
    hp__isa a = isa();
    int64_t i = a == HP__ISA_AVX512 ? avx512_step(k, p, g, m, v, n) : a == HP__ISA_AVX2 ? avx2_step(k, p, g, m, v, n)
                                                                                     : 0;
    for (; i < n; i++) adamw_elem(k, p[i], g[i], m[i], v[i], &p[i], &m[i], &v[i]);
}

/* The first bad index of [0, n), or n. */
static int64_t check_range(const adamw_k *k, const float *p, const float *g, const float *m, const float *v, int64_t n)
{
    hp__isa a = isa();
    int64_t i = a == HP__ISA_AVX512 ? avx512_check(k, p, g, m, v, n)
                : a == HP__ISA_AVX2 ? avx2_check(k, p, g, m, v, n)
                                    : 0;
    for (; i < n; i++) {
        float po, mo, vo;
        adamw_elem(k, p[i], g[i], m[i], v[i], &po, &mo, &vo);
        if (elem_bad(po, mo, vo)) return i;
    }
    return n;
}

/* Elements per work item: whole cache-friendly blocks, so that the threads split the work the same way whatever
 * their count (the result never depends on it: elements are independent). */
#define BLOCK ((int64_t)1 << 14)

void hp__adamw_step(float *param, const float *grad, float *m, float *v, int64_t n, const hp__adamw *opt,
                    int64_t step)
{
    adamw_k k = adamw_consts(opt, step);
    int64_t nb = (n + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static) if (nb > 4)
    for (int64_t b = 0; b < nb; b++) {
        int64_t lo = b * BLOCK, len = n - lo < BLOCK ? n - lo : BLOCK;
        step_range(&k, param + lo, grad + lo, m + lo, v + lo, len);
    }
}

int64_t hp__adamw_check(const float *param, const float *grad, const float *m, const float *v, int64_t n,
                        const hp__adamw *opt, int64_t step, hp__adamw_bad *bad)
{
    adamw_k k = adamw_consts(opt, step);
    int64_t first = n, nb = (n + BLOCK - 1) / BLOCK;
    /* the same element function as the step, so "finite here" is "finite there"; the lowest index wins */
#pragma omp parallel for schedule(static) reduction(min : first) if (nb > 4)
    for (int64_t b = 0; b < nb; b++) {
        int64_t lo = b * BLOCK, len = n - lo < BLOCK ? n - lo : BLOCK;
        int64_t i = check_range(&k, param + lo, grad + lo, m + lo, v + lo, len);
        if (i < len && lo + i < first) first = lo + i;
    }
    if (first < n && bad) {
        float po, mo, vo;
        adamw_elem(&k, param[first], grad[first], m[first], v[first], &po, &mo, &vo);
        *bad = (hp__adamw_bad){.param = po, .m = mo, .v = vo, .old = param[first], .grad = grad[first],
                               .decay = k.decay};
    }
    return first;
}
