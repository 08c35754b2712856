/*
 * kernel.c — the streaming kernel for few rows (decode: m ≤ 16), and the bf16 conversions.
 *
 *   C[r, j] (+)= Σ_k A[r, k] · W[j, k]        A [m, lda] f32,  W [n, k] rows of f32 or bf16,  f32 sums
 *
 * With few rows the product is bound by reading W, so W is read once, in its stored dtype: a bf16 row
 * element becomes f32 by a 16-bit left shift (exact), multiplied into f32 accumulators by FMA. The loop
 * works on a register tile of MR rows of A × NR rows of W, k in steps of one vector:
 *
 *        k ─────────────▶                     acc[r][j] += A[r, k:k+L] * widen(W[j, k:k+L])
 *   A  r0 ▓▓▓▓▓▓▓▓▓▓▓▓▓   (MR rows, L lanes)
 *   W  j0 ░░░░░░░░░░░░░   (NR rows)           AVX2:    L = 8,  MR = 2, NR = 4: 8 acc + 2 A + 1 W = 11 ymm
 *                                             AVX-512: L = 16, MR = 4, NR = 4: 16 acc + 4 A + 1 W = 21 zmm
 *
 * then sums each accumulator's lanes and the k tail (k mod L) in scalar f32. A tile of W (NR rows) stays in
 * L1/L2 while the row blocks of A pass over it, so memory sees each weight byte once. Each 64-byte line of
 * the next tile is prefetched while this one is computed: a tile's rows are short streams (1.5 KiB at
 * K = 768), too short for the hardware prefetcher to ramp up on (measured: +20–40% at M = 1, K = 768 when
 * reading from memory; no change at K = 2048).
 *
 * The AVX2 and AVX-512 variants are compiled with __attribute__((target(...))), so the binary needs no
 * -march flag and runs them only where hp__isa_available says the CPU and OS allow. The portable variant
 * sums each output in k order and is the reference the vector variants are tested against.
 */
#include "kernels/linalg_int.h"

#include <immintrin.h>
#include <string.h>

float hp__bf16_to_f32(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* An f32's bits rounded to bf16's (the low 16 bits zero): to nearest, ties to even — add 0x7fff plus the lowest
 * kept bit, then truncate; values near the top round to infinity, as they should. NaN stays NaN, quiet.
 * Branch-free, so that the row loops vectorize. */
static inline uint32_t round_bits(uint32_t u)
{
    uint32_t nan = ((u >> 16) | 0x0040u) << 16, r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    return (u & 0x7fffffffu) > 0x7f800000u ? nan : r;
}

uint16_t hp__bf16_from_f32(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (uint16_t)(round_bits(u) >> 16);
}

float hp_linalg_round_bf16(float x)
{
    return hp__bf16_to_f32(hp__bf16_from_f32(x));
}

/* One row of n values rounded to bf16 bits (ROUND16) or to bf16 values held as f32 (ROUND32), written once and
 * compiled for AVX-512, AVX2 and plain C: round_bits is branch-free, so `omp simd` turns it into vector integer
 * operations (at -O2 too), the same bits on every instruction set. */
#define ROUND16_BODY                                                                                                    \
    {                                                                                                                   \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                                                           \
            uint32_t u;                                                                                                 \
            memcpy(&u, &a[i], sizeof u);                                                                                \
            dst[i] = (uint16_t)(round_bits(u) >> 16);                                                                   \
        }                                                                                                               \
    }
#define ROUND32_BODY                                                                                                    \
    {                                                                                                                   \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                                                           \
            uint32_t u;                                                                                                 \
            memcpy(&u, &a[i], sizeof u);                                                                                \
            u = round_bits(u);                                                                                          \
            memcpy(&dst[i], &u, sizeof u);                                                                              \
        }                                                                                                               \
    }
__attribute__((target("avx512f"))) static void round16_avx512(const float *a, int64_t n, uint16_t *dst)
    ROUND16_BODY
__attribute__((target("avx2"))) static void round16_avx2(const float *a, int64_t n, uint16_t *dst) ROUND16_BODY
static void round16_portable(const float *a, int64_t n, uint16_t *dst) ROUND16_BODY
__attribute__((target("avx512f"))) static void round32_avx512(const float *a, int64_t n, float *dst) ROUND32_BODY
__attribute__((target("avx2"))) static void round32_avx2(const float *a, int64_t n, float *dst) ROUND32_BODY
static void round32_portable(const float *a, int64_t n, float *dst) ROUND32_BODY

static void round16_row(hp__isa isa, const float *a, int64_t n, uint16_t *dst)
{
    if (isa == HP__ISA_AVX512) round16_avx512(a, n, dst);
    else if (isa == HP__ISA_AVX2) round16_avx2(a, n, dst);
    else round16_portable(a, n, dst);
}

static void round32_row(hp__isa isa, const float *a, int64_t n, float *dst)
{
    if (isa == HP__ISA_AVX512) round32_avx512(a, n, dst);
    else if (isa == HP__ISA_AVX2) round32_avx2(a, n, dst);
    else round32_portable(a, n, dst);
}

void hp__round_rows_bf16(int64_t m, int64_t k, const float *a, int64_t lda, uint16_t *dst)
{
    hp__isa isa = hp__isa_best();
#pragma omp parallel for schedule(static) if (m * k >= (int64_t)1 << 16)
    for (int64_t r = 0; r < m; r++) round16_row(isa, a + r * lda, k, dst + r * k);
}

void hp__round_cols_bf16(int64_t m, int64_t k, const float *a, int64_t lda, uint16_t *dst)
{
    enum { T = 32 }; /* tiles of T x T: both sides stay in cache */
    int64_t tm = (m + T - 1) / T, tk = (k + T - 1) / T;
    hp__isa isa = hp__isa_best();
#pragma omp parallel for schedule(static) if (m * k >= (int64_t)1 << 16)
    for (int64_t t = 0; t < tm * tk; t++) {
        int64_t r0 = t / tk * T, i0 = t % tk * T;
        int64_t r1 = r0 + T < m ? r0 + T : m, i1 = i0 + T < k ? i0 + T : k;
        uint16_t tile[T][T]; /* the tile's rows rounded in vectors, then written transposed */
        for (int64_t r = r0; r < r1; r++) round16_row(isa, a + r * lda + i0, i1 - i0, tile[r - r0]);
        for (int64_t i = i0; i < i1; i++)
            for (int64_t r = r0; r < r1; r++) dst[i * m + r] = tile[r - r0][i - i0];
    }
}

void hp__round_rows_bf16_f32(int64_t m, int64_t k, const float *a, int64_t lda, float *dst)
{
    hp__isa isa = hp__isa_best();
    for (int64_t r = 0; r < m; r++) round32_row(isa, a + r * lda, k, dst + r * k);
}

void hp_linalg_round_rows_bf16(int64_t rows, int64_t cols, const float *a, int64_t lda, float *dst)
{
    hp__round_rows_bf16_f32(rows, cols, a, lda, dst);
}

/* ---- portable ---- */

static float w_at(hp_dtype wdt, const void *w, int64_t i)
{
    if (wdt == HP_DT_BF16) {
        uint16_t b;
        memcpy(&b, (const char *)w + 2 * i, sizeof b);
        return hp__bf16_to_f32(b);
    }
    return ((const float *)w)[i];
}

static void dot_portable(hp_dtype wdt, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                         const void *w, float *c, int64_t ldc, bool acc)
{
    for (int64_t r = 0; r < m; r++) {
        for (int64_t j = 0; j < n; j++) {
            float s = 0.0f;
            for (int64_t i = 0; i < k; i++) s += a[r * lda + i] * w_at(wdt, w, j * k + i);
            c[r * ldc + j] = acc ? c[r * ldc + j] + s : s;
        }
    }
}

static void widen_portable(const uint16_t *src, float *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = hp__bf16_to_f32(src[i]);
}

/* ---- AVX2 + FMA ---- */

#define HP__AVX2 __attribute__((target("avx2,fma")))
#define HP__INLINE static inline __attribute__((always_inline))
/* The tile loops run MR or NR (≤ 4) times: unrolled, the accumulator arrays become registers (-O2 alone
 * does not unroll a loop when that grows the code). */
#define HP__UNROLL _Pragma("GCC unroll 4")

HP__INLINE HP__AVX2 __m256 avx2_load_w(bool bf16, const void *w, int64_t i)
{
    if (bf16) {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    return _mm256_loadu_ps((const float *)w + i);
}

HP__INLINE HP__AVX2 float avx2_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* One MR × NR tile; MR and NR are constants at every call site, so the arrays live in registers. */
HP__INLINE HP__AVX2 void avx2_tile(bool bf16, int MR, int NR, int64_t k, const float *a, int64_t lda,
                                   const void *w, float *c, int64_t ldc, bool acc)
{
    __m256 s[2][4];
    HP__UNROLL
    for (int r = 0; r < MR; r++)
        HP__UNROLL
        for (int j = 0; j < NR; j++) s[r][j] = _mm256_setzero_ps();
    int64_t i = 0;
    const char *pf = (const char *)w + (size_t)(NR * k) * (bf16 ? 2 : 4); /* the next tile, same place */
    for (; i + 8 <= k; i += 8) {
        if ((i & 31) == 0) {
            HP__UNROLL
            for (int j = 0; j < NR; j++) _mm_prefetch(pf + (size_t)(j * k + i) * (bf16 ? 2 : 4), _MM_HINT_T0);
        }
        __m256 av[2];
        HP__UNROLL
        for (int r = 0; r < MR; r++) av[r] = _mm256_loadu_ps(a + r * lda + i);
        HP__UNROLL
        for (int j = 0; j < NR; j++) {
            __m256 wv = avx2_load_w(bf16, w, j * k + i);
            HP__UNROLL
            for (int r = 0; r < MR; r++) s[r][j] = _mm256_fmadd_ps(av[r], wv, s[r][j]);
        }
    }
    HP__UNROLL
    for (int r = 0; r < MR; r++) {
        HP__UNROLL
        for (int j = 0; j < NR; j++) {
            float t = avx2_hsum(s[r][j]);
            for (int64_t q = i; q < k; q++) t += a[r * lda + q] * w_at(bf16 ? HP_DT_BF16 : HP_DT_F32, w, j * k + q);
            c[r * ldc + j] = acc ? c[r * ldc + j] + t : t;
        }
    }
}

HP__INLINE HP__AVX2 void avx2_rows(bool bf16, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                                   const void *w, float *c, int64_t ldc, bool acc)
{
    size_t es = bf16 ? 2 : 4;
    for (int64_t j = 0; j < n; j += 4) {
        const void *wj = (const char *)w + (size_t)(j * k) * es;
        int64_t nr = n - j < 4 ? n - j : 4;
        for (int64_t r = 0; r < m; r += 2) {
            const float *ar = a + r * lda;
            float *cr = c + r * ldc + j;
            if (m - r >= 2) {
                switch (nr) {
                case 4: avx2_tile(bf16, 2, 4, k, ar, lda, wj, cr, ldc, acc); break;
                case 3: avx2_tile(bf16, 2, 3, k, ar, lda, wj, cr, ldc, acc); break;
                case 2: avx2_tile(bf16, 2, 2, k, ar, lda, wj, cr, ldc, acc); break;
                default: avx2_tile(bf16, 2, 1, k, ar, lda, wj, cr, ldc, acc); break;
                }
            } else {
                switch (nr) {
                case 4: avx2_tile(bf16, 1, 4, k, ar, lda, wj, cr, ldc, acc); break;
                case 3: avx2_tile(bf16, 1, 3, k, ar, lda, wj, cr, ldc, acc); break;
                case 2: avx2_tile(bf16, 1, 2, k, ar, lda, wj, cr, ldc, acc); break;
                default: avx2_tile(bf16, 1, 1, k, ar, lda, wj, cr, ldc, acc); break;
                }
            }
        }
    }
}

static HP__AVX2 void dot_avx2_bf16(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const void *w,
                                   float *c, int64_t ldc, bool acc)
{
    avx2_rows(true, m, n, k, a, lda, w, c, ldc, acc);
}

static HP__AVX2 void dot_avx2_f32(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const void *w,
                                  float *c, int64_t ldc, bool acc)
{
    avx2_rows(false, m, n, k, a, lda, w, c, ldc, acc);
}

static HP__AVX2 void widen_avx2(const uint16_t *src, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, avx2_load_w(true, src, i));
    for (; i < n; i++) dst[i] = hp__bf16_to_f32(src[i]);
}

/* ---- AVX-512F ---- */

#define HP__AVX512 __attribute__((target("avx512f,avx2,fma")))

HP__INLINE HP__AVX512 __m512 avx512_load_w(bool bf16, const void *w, int64_t i)
{
    if (bf16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    return _mm512_loadu_ps((const float *)w + i);
}

HP__INLINE HP__AVX512 void avx512_tile(bool bf16, int MR, int NR, int64_t k, const float *a, int64_t lda,
                                       const void *w, float *c, int64_t ldc, bool acc)
{
    __m512 s[4][4];
    HP__UNROLL
    for (int r = 0; r < MR; r++)
        HP__UNROLL
        for (int j = 0; j < NR; j++) s[r][j] = _mm512_setzero_ps();
    int64_t i = 0;
    const char *pf = (const char *)w + (size_t)(NR * k) * (bf16 ? 2 : 4);
    for (; i + 16 <= k; i += 16) {
        if ((i & 31) == 0) {
            HP__UNROLL
            for (int j = 0; j < NR; j++) _mm_prefetch(pf + (size_t)(j * k + i) * (bf16 ? 2 : 4), _MM_HINT_T0);
        }
        __m512 av[4];
        HP__UNROLL
        for (int r = 0; r < MR; r++) av[r] = _mm512_loadu_ps(a + r * lda + i);
        HP__UNROLL
        for (int j = 0; j < NR; j++) {
            __m512 wv = avx512_load_w(bf16, w, j * k + i);
            HP__UNROLL
            for (int r = 0; r < MR; r++) s[r][j] = _mm512_fmadd_ps(av[r], wv, s[r][j]);
        }
    }
    HP__UNROLL
    for (int r = 0; r < MR; r++) {
        HP__UNROLL
        for (int j = 0; j < NR; j++) {
            float t = _mm512_reduce_add_ps(s[r][j]);
            for (int64_t q = i; q < k; q++) t += a[r * lda + q] * w_at(bf16 ? HP_DT_BF16 : HP_DT_F32, w, j * k + q);
            c[r * ldc + j] = acc ? c[r * ldc + j] + t : t;
        }
    }
}

/* Row blocks of 4, then the 1–3 rows left; column blocks of 4, then the 1–3 left. */
#define HP__AVX512_NR(bf16, MR, nr, ...)                                                                       \
    do {                                                                                                       \
        switch (nr) {                                                                                          \
        case 4: avx512_tile(bf16, MR, 4, __VA_ARGS__); break;                                                  \
        case 3: avx512_tile(bf16, MR, 3, __VA_ARGS__); break;                                                  \
        case 2: avx512_tile(bf16, MR, 2, __VA_ARGS__); break;                                                  \
        default: avx512_tile(bf16, MR, 1, __VA_ARGS__); break;                                                 \
        }                                                                                                      \
    } while (0)

HP__INLINE HP__AVX512 void avx512_rows(bool bf16, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                                       const void *w, float *c, int64_t ldc, bool acc)
{
    size_t es = bf16 ? 2 : 4;
    for (int64_t j = 0; j < n; j += 4) {
        const void *wj = (const char *)w + (size_t)(j * k) * es;
        int64_t nr = n - j < 4 ? n - j : 4;
        for (int64_t r = 0; r < m;) {
            const float *ar = a + r * lda;
            float *cr = c + r * ldc + j;
            int64_t left = m - r;
            if (left >= 4) {
                HP__AVX512_NR(bf16, 4, nr, k, ar, lda, wj, cr, ldc, acc);
                r += 4;
            } else if (left == 3) {
                HP__AVX512_NR(bf16, 3, nr, k, ar, lda, wj, cr, ldc, acc);
                r += 3;
            } else if (left == 2) {
                HP__AVX512_NR(bf16, 2, nr, k, ar, lda, wj, cr, ldc, acc);
                r += 2;
            } else {
                HP__AVX512_NR(bf16, 1, nr, k, ar, lda, wj, cr, ldc, acc);
                r += 1;
            }
        }
    }
}

static HP__AVX512 void dot_avx512_bf16(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                                       const void *w, float *c, int64_t ldc, bool acc)
{
    avx512_rows(true, m, n, k, a, lda, w, c, ldc, acc);
}

static HP__AVX512 void dot_avx512_f32(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                                      const void *w, float *c, int64_t ldc, bool acc)
{
    avx512_rows(false, m, n, k, a, lda, w, c, ldc, acc);
}

/* ---- dispatch ---- */

void hp__dot_rows(hp__isa isa, hp_dtype wdt, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                  const void *w, float *c, int64_t ldc, bool accumulate)
{
    bool bf16 = wdt == HP_DT_BF16;
    switch (isa) {
    case HP__ISA_AVX512:
        (bf16 ? dot_avx512_bf16 : dot_avx512_f32)(m, n, k, a, lda, w, c, ldc, accumulate);
        break;
    case HP__ISA_AVX2:
        (bf16 ? dot_avx2_bf16 : dot_avx2_f32)(m, n, k, a, lda, w, c, ldc, accumulate);
        break;
    default: dot_portable(wdt, m, n, k, a, lda, w, c, ldc, accumulate); break;
    }
}

void hp__bf16_widen(hp__isa isa, const uint16_t *src, float *dst, int64_t n)
{
    if (isa == HP__ISA_AVX2 || isa == HP__ISA_AVX512)
        widen_avx2(src, dst, n);
    else
        widen_portable(src, dst, n);
}
