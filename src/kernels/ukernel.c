/*
 * ukernel.c — hyperpar's own blocked GEMM for the large products (m > small_m_max rows) on AVX-512 CPUs:
 *
 *   C [M, N] (ldc) (+)= A [M, K] (lda, f32) · W[N, K]ᵀ (+ bias)        W: [N, K] rows, as the layer stores it
 *
 * Two loop nests (hp__uk_algo), each in three variants that differ only in their packers and microkernel. The
 * first, HP__UK_PACK_W, packs W per call:
 *
 *   kind    W     A            packed W panel (per NR = 64 columns)      microkernel (MR = 6 rows × 64 columns)
 *   F32     f32   f32 in place [kc][64] f32                              24 zmm accumulators, f32 FMA
 *   WIDEN   bf16  f32 in place [kc][64] f32, widened exactly (<< 16)     the F32 microkernel
 *   BF16    bf16  rounded to   [kc/2][64][2] bf16 (VNNI pairs, odd K     vdpbf16ps (avx512_bf16), f32 sums
 *                 bf16 (RNE)   padded with a zero)
 *
 * The loop nest (one OpenMP parallel region per call; a work item is one column block of one product):
 *
 *   item (product g, columns [j0, j0 + nc))            nc ≤ NC_MAX, a multiple of NR; items: dynamic schedule
 *     C[g rows, j0..] = bias / += bias / kept          (the start value, when there is one)
 *     for each k block pc of KC (ascending)
 *       pack W[j0.., pc] into this thread's scratch     a 16×16 32-bit transpose per 16 rows × 16 words
 *       for each row block ic of MC rows
 *         (BF16: round A[ic, pc] into this thread's scratch)
 *         (F32, WIDEN: copy A[ic, pc] there, rows KC apart: no cache-set conflicts whatever lda; with round_a,
 *          BF16 mode where vdpbf16ps is slower than FMA, the copy is A rounded to bf16 values, still f32)
 *         for each panel of 64 columns, for each MR rows: microkernel: the block's sum from zero in registers,
 *         then C = C + sum (C's lines prefetched when the tile starts), or C = sum in the first block without
 *         a start value
 *
 * The second, HP__UK_PACK_A, packs A instead and reads W in place: for few rows, where packing W costs as much as
 * the product (see "the second loop nest" below):
 *
 *   item (product g, columns [j0, j0 + nc))            the same items, start values and k blocks
 *     for each k block pc (ascending), each row block ic of MC rows
 *       (BF16: round A[ic, pc]); pack it as W is packed above: [k word][64 rows] words per 64 rows
 *       for each NB = 12 columns, each 32 rows: microkernel: each W word (an f32, or a bf16 pair) broadcast from W
 *       itself into 2 × 12 accumulators of 16 rows each; then transposed (16×16) and added into C's rows
 *
 * Summation order (the invariant the tests check): every C element sums each k block's products from zero, one k
 * (F32, WIDEN: one FMA) or one k pair (BF16: one vdpbf16ps) at a time in ascending k, and adds the block sums to
 * its start value in ascending block order. That order depends on K (and the constant KC) alone: not on M, the
 * row's position, N, the column's position, nc, the loop nest, or the thread count. So
 * rows split over calls, columns split over linears, either nest and any thread count give byte-equal results; and
 * WIDEN equals F32 run on the widened weight bit for bit (the same microkernel on the same numbers).
 *
 * The functions are compiled with __attribute__((target(...))), so the library builds for any x86-64;
 * hp__uk_available says whether this CPU and OS run them.
 */
#include "kernels/linalg_int.h"

#include <immintrin.h>
#include <omp.h>
#include <string.h>

enum {
    NR = 64,      /* columns per panel: 4 zmm */
    MR = 6,       /* rows per register tile: 6 × 4 = 24 accumulators */
    KC = 1024,    /* k per block (F32, WIDEN): a 256 KiB f32 panel, read from L2 */
    KC16 = 1024,  /* k per block (BF16): 512 pairs, a 128 KiB panel */
    MC = 192,     /* rows per row block: A's block (copied, or rounded to bf16) is MC × KC */
    NC_MAX = 512, /* columns per work item */
    ALIGN = 64,
};
/* Measured on the 2-core Zen 5 (1 thread, 2048³, CPU time, the machine shared): KC = 256 gave 151 GFLOP/s f32 and
 * 272 bf16, 512: 190 and 333, 1024: 207-219 and 357 (with KC16 = 1024; 2048: 318). Fewer k blocks mean fewer
 * passes over C, whose tiles come from L3 or memory; the panel read from L2 instead of L1 cost nothing visible.
 * MC = 96 and 384 were no better than 192; NC_MAX = 256 no better than 512. */

/* Below this many multiply-adds a call runs on the calling thread. */
#define PAR_MIN_WORK ((int64_t)1 << 18)

#define HP__UK __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl")))
#define HP__UK16 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")))
#define INLINE inline __attribute__((always_inline))

bool hp__uk_available(hp__uk_kind kind)
{
    hp__cpu cpu;
    hp__cpu_detect(&cpu);
    bool base = cpu.avx512f && cpu.avx512bw && cpu.avx2 && cpu.fma;
    return kind == HP__UK_BF16 ? base && cpu.avx512_bf16 : base;
}

const char *hp__uk_name(hp__uk_kind kind, hp__uk_algo algo)
{
    if (algo == HP__UK_PACK_A) switch (kind) {
        case HP__UK_F32: return "hyperpar avx512 f32 32x12, A packed, W read in place";
        case HP__UK_WIDEN: return "hyperpar avx512 f32 32x12, A packed, bf16 W read in place and widened";
        default: return "hyperpar avx512_bf16 vdpbf16ps 32x12, A rounded to bf16 and packed, W read in place";
        }
    switch (kind) {
    case HP__UK_F32: return "hyperpar avx512 f32 6x64 blocked, W packed per call";
    case HP__UK_WIDEN: return "hyperpar avx512 f32 6x64 blocked, bf16 W widened while packed per call";
    default: return "hyperpar avx512_bf16 vdpbf16ps 6x64 blocked, A rounded to bf16, W packed per call";
    }
}

static size_t align_up(size_t n)
{
    return (n + ALIGN - 1) / ALIGN * ALIGN;
}

/* Per thread: the packed W block, then (BF16) the rounded A block. */
static size_t w_block_bytes(hp__uk_kind kind)
{
    return kind == HP__UK_BF16 ? (size_t)NC_MAX * KC16 * 2 : (size_t)NC_MAX * KC * 4;
}

size_t hp__uk_scratch_bytes(hp__uk_kind kind)
{
    return align_up(w_block_bytes(kind)) + align_up(kind == HP__UK_BF16 ? (size_t)MC * KC16 * 2 : (size_t)MC * KC * 4);
}

/* ---- packing W: 16 rows × 16 32-bit words → 16 vectors of the same word of 16 rows ---- */

static HP__UK INLINE void transpose16(__m512 r[16])
{
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* t[4q + 0..3]: rows 4q..4q+3 interleaved in pairs; gather 4-row groups of each word */
    for (int q = 0; q < 4; q++) {
        __m512d a = _mm512_castps_pd(t[4 * q]), b = _mm512_castps_pd(t[4 * q + 2]);
        __m512d c = _mm512_castps_pd(t[4 * q + 1]), d = _mm512_castps_pd(t[4 * q + 3]);
        r[4 * q] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        r[4 * q + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        r[4 * q + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
        r[4 * q + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
    /* r[4q + s]: in each 128-bit lane L, word 4L + s of rows 4q..4q+3. Now gather the lanes across q. */
    for (int s = 0; s < 4; s++) {
        __m512 a = _mm512_shuffle_f32x4(r[s], r[4 + s], 0x88), b = _mm512_shuffle_f32x4(r[s], r[4 + s], 0xdd);
        __m512 c = _mm512_shuffle_f32x4(r[8 + s], r[12 + s], 0x88), d = _mm512_shuffle_f32x4(r[8 + s], r[12 + s], 0xdd);
        t[s] = _mm512_shuffle_f32x4(a, c, 0x88);      /* lane 0 of every q: word s */
        t[8 + s] = _mm512_shuffle_f32x4(a, c, 0xdd);  /* lane 2: word 8 + s */
        t[4 + s] = _mm512_shuffle_f32x4(b, d, 0x88);  /* lane 1: word 4 + s */
        t[12 + s] = _mm512_shuffle_f32x4(b, d, 0xdd); /* lane 3: word 12 + s */
    }
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* One panel's k block: dst [kw][NR] words (kw = k words of this block, a multiple of 16 is not needed) from
 * rows j0..j0+nr-1 (nr ≤ NR; missing rows are zero) of W. A word is an f32 (F32), a widened bf16 (WIDEN) or a
 * bf16 pair (BF16: words of a row are pairs of k, the last one half zero when K is odd). `w` points at row j0's
 * element k0; ld is the row length in elements; kel the elements of this block (≤ KC or KC16). */
static HP__UK void pack_panel(hp__uk_kind kind, const void *w, int64_t ld, int64_t nr, int64_t kel, uint32_t *dst)
{
    int64_t kw = kind == HP__UK_BF16 ? (kel + 1) / 2 : kel, kw16 = (kw + 15) / 16 * 16;
    for (int64_t j = 0; j < NR; j += 16) {
        for (int64_t kk = 0; kk < kw16; kk += 16) {
            __m512 r[16];
            int64_t left = kw - kk < 16 ? kw - kk : 16; /* words of each row in this 16 */
            for (int i = 0; i < 16; i++) {
                if (j + i >= nr) {
                    r[i] = _mm512_setzero_ps();
                    continue;
                }
                if (kind == HP__UK_F32) {
                    const float *src = (const float *)w + (j + i) * ld + kk;
                    r[i] = _mm512_maskz_loadu_ps((__mmask16)((1u << left) - 1u), src);
                } else if (kind == HP__UK_WIDEN) {
                    const uint16_t *src = (const uint16_t *)w + (j + i) * ld + kk;
                    __m256i h = _mm256_maskz_loadu_epi16((__mmask16)((1u << left) - 1u), src);
                    r[i] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
                } else {
                    const uint16_t *src = (const uint16_t *)w + (j + i) * ld + 2 * kk;
                    int64_t el = kel - 2 * kk < 32 ? kel - 2 * kk : 32; /* bf16 elements left in this row */
                    __mmask32 m = el >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << el) - 1u);
                    r[i] = _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(m, src));
                }
            }
            transpose16(r);
            for (int64_t t = 0; t < 16 && kk + t < kw; t++) _mm512_store_ps((float *)dst + (kk + t) * NR + j, r[t]);
        }
    }
}

/* ---- the microkernels: C [mr, 64] (+)= A [mr, k block] · panel ---- */

/* The accumulators of both microkernels: zero at the start of a k block (C's lines prefetched when the block's
 * sum is to be added to them), then C [mr, 64] = or += them under the column masks. */
static HP__UK INLINE void acc_start(int mr, __m512 acc[MR][4], const float *c, int64_t ldc, bool load_c)
{
#pragma GCC unroll 6
    for (int r = 0; r < mr; r++) {
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) acc[r][v] = _mm512_setzero_ps();
        if (load_c) /* C is added after the k loop: its lines arrive meanwhile */
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) _mm_prefetch((const char *)(c + r * ldc + 16 * v), _MM_HINT_T0);
    }
}

static HP__UK INLINE void acc_finish(int mr, __m512 acc[MR][4], float *c, int64_t ldc, bool load_c,
                                     const __mmask16 msk[4])
{
#pragma GCC unroll 6
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            __m512 x = acc[r][v];
            if (load_c) x = _mm512_add_ps(_mm512_maskz_loadu_ps(msk[v], c + r * ldc + 16 * v), x);
            _mm512_mask_storeu_ps(c + r * ldc + 16 * v, msk[v], x);
        }
}

/* F32 and WIDEN: a [mr][as] f32 (A in place), p [kc][NR] f32. */
static HP__UK INLINE void ukernel_f32(int mr, int64_t kc, const float *a, int64_t as, const float *p, float *c,
                                     int64_t ldc, bool load_c, const __mmask16 msk[4])
{
    __m512 acc[MR][4];
    acc_start(mr, acc, c, ldc, load_c);
    for (int64_t k = 0; k < kc; k++) {
        __m512 w0 = _mm512_load_ps(p + k * NR), w1 = _mm512_load_ps(p + k * NR + 16);
        __m512 w2 = _mm512_load_ps(p + k * NR + 32), w3 = _mm512_load_ps(p + k * NR + 48);
#pragma GCC unroll 6
        for (int r = 0; r < mr; r++) {
            __m512 b = _mm512_set1_ps(a[r * as + k]);
            acc[r][0] = _mm512_fmadd_ps(b, w0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(b, w1, acc[r][1]);
            acc[r][2] = _mm512_fmadd_ps(b, w2, acc[r][2]);
            acc[r][3] = _mm512_fmadd_ps(b, w3, acc[r][3]);
        }
    }
    acc_finish(mr, acc, c, ldc, load_c, msk);
}

static HP__UK void tile_f32(int mr, int64_t kc, const float *a, int64_t as, const float *p, float *c, int64_t ldc,
                            bool load_c, const __mmask16 msk[4])
{
    switch (mr) {
    case 6: ukernel_f32(6, kc, a, as, p, c, ldc, load_c, msk); break;
    case 5: ukernel_f32(5, kc, a, as, p, c, ldc, load_c, msk); break;
    case 4: ukernel_f32(4, kc, a, as, p, c, ldc, load_c, msk); break;
    case 3: ukernel_f32(3, kc, a, as, p, c, ldc, load_c, msk); break;
    case 2: ukernel_f32(2, kc, a, as, p, c, ldc, load_c, msk); break;
    default: ukernel_f32(1, kc, a, as, p, c, ldc, load_c, msk); break;
    }
}

/* BF16: a [mr][as] bf16 (rounded, pairs of k as 32-bit words), p [kp][NR] pairs. */
static HP__UK16 INLINE void ukernel_bf16(int mr, int64_t kp, const uint16_t *a, int64_t as, const uint32_t *p,
                                        float *c, int64_t ldc, bool load_c, const __mmask16 msk[4])
{
    __m512 acc[MR][4];
    acc_start(mr, acc, c, ldc, load_c);
    for (int64_t k = 0; k < kp; k++) {
        __m512bh w0 = (__m512bh)_mm512_load_si512(p + k * NR), w1 = (__m512bh)_mm512_load_si512(p + k * NR + 16);
        __m512bh w2 = (__m512bh)_mm512_load_si512(p + k * NR + 32);
        __m512bh w3 = (__m512bh)_mm512_load_si512(p + k * NR + 48);
#pragma GCC unroll 6
        for (int r = 0; r < mr; r++) {
            uint32_t pair;
            memcpy(&pair, a + r * as + 2 * k, sizeof pair);
            __m512bh b = (__m512bh)_mm512_set1_epi32((int)pair);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], b, w0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], b, w1);
            acc[r][2] = _mm512_dpbf16_ps(acc[r][2], b, w2);
            acc[r][3] = _mm512_dpbf16_ps(acc[r][3], b, w3);
        }
    }
    acc_finish(mr, acc, c, ldc, load_c, msk);
}

static HP__UK16 void tile_bf16(int mr, int64_t kp, const uint16_t *a, int64_t as, const uint32_t *p, float *c,
                               int64_t ldc, bool load_c, const __mmask16 msk[4])
{
    switch (mr) {
    case 6: ukernel_bf16(6, kp, a, as, p, c, ldc, load_c, msk); break;
    case 5: ukernel_bf16(5, kp, a, as, p, c, ldc, load_c, msk); break;
    case 4: ukernel_bf16(4, kp, a, as, p, c, ldc, load_c, msk); break;
    case 3: ukernel_bf16(3, kp, a, as, p, c, ldc, load_c, msk); break;
    case 2: ukernel_bf16(2, kp, a, as, p, c, ldc, load_c, msk); break;
    default: ukernel_bf16(1, kp, a, as, p, c, ldc, load_c, msk); break;
    }
}

/* A [m, kel] (lda) rounded to bf16 (nearest even, NaN kept quiet: hp__bf16_from_f32's bits) into dst [m][as]
 * bf16, with a zero after an odd kel (the pad of the last pair). */
static HP__UK void round_block(int64_t m, int64_t kel, const float *a, int64_t lda, uint16_t *dst, int64_t as)
{
    const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1), absm = _mm512_set1_epi32(0x7fffffff);
    const __m512i inf = _mm512_set1_epi32(0x7f800000), quiet = _mm512_set1_epi32(0x0040);
    for (int64_t r = 0; r < m; r++) {
        for (int64_t i = 0; i < kel; i += 16) {
            int64_t left = kel - i < 16 ? kel - i : 16;
            __mmask16 mk = (__mmask16)((1u << left) - 1u);
            __m512i u = _mm512_castps_si512(_mm512_maskz_loadu_ps(mk, a + r * lda + i));
            __m512i hi = _mm512_srli_epi32(u, 16);
            __m512i rnd = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(hi, one))), 16);
            __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, absm), inf);
            rnd = _mm512_mask_mov_epi32(rnd, nan, _mm512_or_si512(hi, quiet));
            _mm256_mask_storeu_epi16(dst + r * as + i, mk, _mm512_cvtepi32_epi16(rnd));
        }
        if (kel & 1) dst[r * as + kel] = 0;
    }
}

/* ---- the second loop nest (HP__UK_PACK_A): A packed, W read in place ----
 *
 * For few rows per product (a MoE expert's 16..128) packing W costs as much as the product. Here A's block is
 * packed instead, by pack_panel itself (A's rows in place of W's: [k word][64 rows] words; BF16 rounds the block
 * first), and each W word (f32, or a bf16 pair: two adjacent elements of a W row) is broadcast from W itself into
 * a tile of 16·MV rows × NB columns: acc[v][n] holds C[16 rows, column n], summed by the same instruction on the
 * same two operands as in the packed-W kernel (vdpbf16ps and FMA are symmetric in their multiplicands, and bf16
 * products are exact), in the same order (the same k blocks, from zero, ascending): so both kernels give the same
 * bytes, and a linear may choose either by row count. At the end of each k block the tile is transposed (16×16)
 * and added into C's rows. */

enum {
    MV = 2,  /* 16-row vectors per tile (1, 2 or 4: a tile lies in one 64-row panel of A) */
    NB = 12, /* columns per tile: MV × NB accumulators */
};
_Static_assert(64 % (16 * MV) == 0 && MC % 64 == 0 && MC <= NC_MAX, "A's packed block fits the W panel's part");
_Static_assert(16 * MV == 32 && NB == 12, "hp__uk_name names the tile 32x12");

/* C [rows, ncol] at c (ldc) (+)= acc [MV][NB], columns in groups of 16, transposed. */
static HP__UK INLINE void tile_t_finish(int mv, __m512 acc[MV][NB], int rows, int ncol, float *c, int64_t ldc,
                                        bool load_c)
{
    for (int v = 0; v < mv; v++)
        for (int n0 = 0; n0 < NB; n0 += 16) {
            __m512 r[16];
            for (int n = 0; n < 16; n++) r[n] = n0 + n < NB ? acc[v][n0 + n] : _mm512_setzero_ps();
            transpose16(r); /* r[t]: row 16v + t, columns n0.. in lanes */
            int cols = ncol - n0 > 16 ? 16 : ncol - n0;
            if (cols <= 0) break;
            __mmask16 msk = (__mmask16)(cols >= 16 ? 0xffffu : (1u << cols) - 1u);
            for (int t = 0; t < 16 && 16 * v + t < rows; t++) {
                float *ct = c + (16 * v + t) * ldc + n0;
                __m512 x = r[t];
                if (load_c) x = _mm512_add_ps(_mm512_maskz_loadu_ps(msk, ct), x);
                _mm512_mask_storeu_ps(ct, msk, x);
            }
        }
}

/* BF16: ap [kw][64] pairs of 64 rows (this tile's at +16v); W rows at w (bf16, ldw apart; columns past ncol read
 * the last one's); kel elements of this k block (odd: the last pair's second half is zero, as packed). */
static HP__UK16 INLINE void ukernel_t16(int mv, int64_t kel, const uint32_t *ap, const uint16_t *w, int64_t ldw,
                                       int rows, int ncol, float *c, int64_t ldc, bool load_c)
{
    __m512 acc[MV][NB];
    const uint16_t *wn[NB];
#pragma GCC unroll 12
    for (int n = 0; n < NB; n++) {
        wn[n] = w + (n < ncol ? n : ncol - 1) * ldw;
#pragma GCC unroll 4
        for (int v = 0; v < mv; v++) acc[v][n] = _mm512_setzero_ps();
    }
    int64_t kp = kel / 2;
    for (int64_t p = 0; p < kp; p++) {
        __m512bh a[MV];
#pragma GCC unroll 4
        for (int v = 0; v < mv; v++) a[v] = (__m512bh)_mm512_load_si512(ap + p * 64 + 16 * v);
#pragma GCC unroll 12
        for (int n = 0; n < NB; n++) {
            uint32_t pair;
            memcpy(&pair, wn[n] + 2 * p, sizeof pair);
            __m512bh b = (__m512bh)_mm512_set1_epi32((int)pair);
#pragma GCC unroll 4
            for (int v = 0; v < mv; v++) acc[v][n] = _mm512_dpbf16_ps(acc[v][n], a[v], b);
        }
    }
    if (kel & 1) { /* the last pair: (W[n][kel - 1], 0), as pack_panel pads it */
        __m512bh a[MV];
        for (int v = 0; v < mv; v++) a[v] = (__m512bh)_mm512_load_si512(ap + kp * 64 + 16 * v);
        for (int n = 0; n < NB; n++) {
            __m512bh b = (__m512bh)_mm512_set1_epi32((int)wn[n][2 * kp]);
            for (int v = 0; v < mv; v++) acc[v][n] = _mm512_dpbf16_ps(acc[v][n], a[v], b);
        }
    }
    tile_t_finish(mv, acc, rows, ncol, c, ldc, load_c);
}

/* F32 (widen false) and WIDEN: ap [kel][64] f32 of 64 rows; W rows f32 or bf16 (widened as broadcast). */
static HP__UK INLINE void ukernel_t32(int mv, bool widen, int64_t kel, const float *ap, const void *w, int64_t ldw,
                                     int rows, int ncol, float *c, int64_t ldc, bool load_c)
{
    __m512 acc[MV][NB];
    const float *wf[NB];
    const uint16_t *wh[NB];
#pragma GCC unroll 12
    for (int n = 0; n < NB; n++) {
        int64_t off = (n < ncol ? n : ncol - 1) * ldw;
        wf[n] = (const float *)w + off;
        wh[n] = (const uint16_t *)w + off;
#pragma GCC unroll 4
        for (int v = 0; v < mv; v++) acc[v][n] = _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < kel; k++) {
        __m512 a[MV];
#pragma GCC unroll 4
        for (int v = 0; v < mv; v++) a[v] = _mm512_load_ps(ap + k * 64 + 16 * v);
#pragma GCC unroll 12
        for (int n = 0; n < NB; n++) {
            __m512 b = widen ? _mm512_castsi512_ps(_mm512_set1_epi32((int)((uint32_t)wh[n][k] << 16)))
                             : _mm512_set1_ps(wf[n][k]);
#pragma GCC unroll 4
            for (int v = 0; v < mv; v++) acc[v][n] = _mm512_fmadd_ps(a[v], b, acc[v][n]);
        }
    }
    tile_t_finish(mv, acc, rows, ncol, c, ldc, load_c);
}

/* A tile of `rows` ≤ 16·MV rows: the full-width microkernel, or one 16-row microkernel per 16 rows. */
static HP__UK16 void tile_t16(int64_t kel, const uint32_t *ap, const uint16_t *w, int64_t ldw, int rows, int ncol,
                              float *c, int64_t ldc, bool load_c)
{
    if (rows > 16 * (MV - 1)) {
        ukernel_t16(MV, kel, ap, w, ldw, rows, ncol, c, ldc, load_c);
        return;
    }
    for (int r0 = 0; r0 < rows; r0 += 16)
        ukernel_t16(1, kel, ap + r0, w, ldw, rows - r0 < 16 ? rows - r0 : 16, ncol, c + r0 * ldc, ldc, load_c);
}

static HP__UK void tile_t32(bool widen, int64_t kel, const float *ap, const void *w, int64_t ldw, int rows, int ncol,
                            float *c, int64_t ldc, bool load_c)
{
    if (rows > 16 * (MV - 1)) {
        if (widen) ukernel_t32(MV, true, kel, ap, w, ldw, rows, ncol, c, ldc, load_c);
        else ukernel_t32(MV, false, kel, ap, w, ldw, rows, ncol, c, ldc, load_c);
        return;
    }
    for (int r0 = 0; r0 < rows; r0 += 16) {
        int rr = rows - r0 < 16 ? rows - r0 : 16;
        if (widen) ukernel_t32(1, true, kel, ap + r0, w, ldw, rr, ncol, c + r0 * ldc, ldc, load_c);
        else ukernel_t32(1, false, kel, ap + r0, w, ldw, rr, ncol, c + r0 * ldc, ldc, load_c);
    }
}

/* ---- the driver ---- */

typedef struct item {
    int64_t g, j0;
} item;

/* The start value of C [gr rows, j0 .. j0 + nc): C = bias, C += bias, C kept, or C = 0 (only when nothing else:
 * then the first k block stores its sum without a load). Returns whether C is loaded. */
static bool start_value(const hp__uk_call *call, const hp_linear_group *gr, int64_t j0, int64_t nc)
{
    const float *bias = call->bias ? call->bias + gr->mat * call->n + j0 : NULL;
    if (bias)
        for (int64_t r = 0; r < gr->m; r++) {
            float *cr = gr->c + r * gr->ldc + j0;
            if (call->acc)
                for (int64_t j = 0; j < nc; j++) cr[j] += bias[j];
            else
                memcpy(cr, bias, (size_t)nc * sizeof *cr);
        }
    return call->acc || bias;
}

/* What both loop nests start a work item (product gr, columns [j0, j0 + nc)) with: W's rows j0.. of the group's
 * matrix, the scratch slot's two parts, C's start value written, the k block. */
typedef struct item_start {
    const char *w;    /* W's row j0 of matrix gr->mat */
    size_t es;        /* bytes per W element */
    uint32_t *packed; /* the slot's first part: W's panels (W packed) or A's (A packed) */
    uint16_t *a16;    /* its second: A's block rounded to bf16 (BF16), or copied as f32 (W packed) */
    bool load_c;      /* C holds a start value (start_value) */
    int64_t kc;       /* elements per k block */
} item_start;

static item_start item_begin(const hp__uk_call *call, const hp_linear_group *gr, int64_t j0, int64_t nc, char *part)
{
    hp__uk_kind kind = call->kind;
    size_t es = kind == HP__UK_F32 ? 4 : 2;
    return (item_start){.w = (const char *)call->w + (size_t)(gr->mat * call->n + j0) * (size_t)call->k * es,
                        .es = es,
                        .packed = (uint32_t *)part,
                        .a16 = (uint16_t *)(part + align_up(w_block_bytes(kind))),
                        .load_c = start_value(call, gr, j0, nc),
                        .kc = kind == HP__UK_BF16 ? KC16 : KC};
}

/* One work item of HP__UK_PACK_A: product `g`, columns [j0, j0 + nc). A's row block packed per k block into the
 * W-panel part of the scratch (BF16: rounded into the A part first); then for each NB columns, each 16·MV rows,
 * the tile from W in place. */
static HP__UK void run_item_a(const hp__uk_call *call, const hp_linear_group *gr, int64_t j0, int64_t nc,
                              char *part)
{
    hp__uk_kind kind = call->kind;
    int64_t k = call->k, m = gr->m;
    const item_start is = item_begin(call, gr, j0, nc, part);
    uint32_t *ap = is.packed; /* A's panels */
    for (int64_t k0 = 0; k0 < k; k0 += is.kc) {
        int64_t kel = k - k0 < is.kc ? k - k0 : is.kc, kw = kind == HP__UK_BF16 ? (kel + 1) / 2 : kel;
        bool first = k0 == 0 && !is.load_c;
        for (int64_t i0 = 0; i0 < m; i0 += MC) {
            int64_t mb = m - i0 < MC ? m - i0 : MC;
            const float *a = gr->a + i0 * gr->lda + k0;
            if (kind == HP__UK_BF16) round_block(mb, kel, a, gr->lda, is.a16, 2 * kw);
            int64_t lda = gr->lda;
            if (kind != HP__UK_BF16 && call->round_a) { /* A's block rounded to bf16 values, kept in f32 */
                hp__round_rows_bf16_f32(mb, kel, a, lda, (float *)is.a16);
                a = (const float *)is.a16, lda = kel;
            }
            for (int64_t q0 = 0; q0 < mb; q0 += 64) { /* 64-row panels of A: [kw][64] words each */
                int64_t nr = mb - q0 < 64 ? mb - q0 : 64;
                if (kind == HP__UK_BF16) pack_panel(kind, is.a16 + q0 * 2 * kw, 2 * kw, nr, kel, ap + q0 * kw);
                else pack_panel(HP__UK_F32, a + q0 * lda, lda, nr, kel, ap + q0 * kw);
            }
            for (int64_t c0 = 0; c0 < nc; c0 += NB) {
                int ncol = nc - c0 < NB ? (int)(nc - c0) : NB;
                const char *wc = is.w + (size_t)(c0 * k + k0) * is.es;
                float *c = gr->c + i0 * gr->ldc + j0 + c0;
                for (int64_t r0 = 0; r0 < mb; r0 += 16 * MV) {
                    int rows = mb - r0 < 16 * MV ? (int)(mb - r0) : 16 * MV;
                    const uint32_t *at = ap + r0 / 64 * 64 * kw + r0 % 64;
                    if (kind == HP__UK_BF16)
                        tile_t16(kel, at, (const uint16_t *)wc, k, rows, ncol, c + r0 * gr->ldc, gr->ldc, !first);
                    else
                        tile_t32(kind == HP__UK_WIDEN, kel, (const float *)at, wc, k, rows, ncol, c + r0 * gr->ldc,
                                 gr->ldc, !first);
                }
            }
        }
    }
}

/* One work item: product `g` (a group of the call), columns [j0, j0 + nc). */
static HP__UK void run_item(const hp__uk_call *call, const hp_linear_group *gr, int64_t j0, int64_t nc, char *part)
{
    hp__uk_kind kind = call->kind;
    int64_t k = call->k, m = gr->m;
    const item_start is = item_begin(call, gr, j0, nc, part);
    uint32_t *wp = is.packed; /* W's panels */
    float *a32 = (float *)is.a16;
    for (int64_t k0 = 0; k0 < k; k0 += is.kc) {
        int64_t kel = k - k0 < is.kc ? k - k0 : is.kc, kw = kind == HP__UK_BF16 ? (kel + 1) / 2 : kel;
        for (int64_t p0 = 0; p0 < nc; p0 += NR) {
            int64_t nr = nc - p0 < NR ? nc - p0 : NR;
            pack_panel(kind, is.w + (size_t)(p0 * k + k0) * is.es, k, nr, kel, wp + p0 / NR * kw * NR);
        }
        bool first = k0 == 0 && !is.load_c;
        for (int64_t i0 = 0; i0 < m; i0 += MC) {
            int64_t mb = m - i0 < MC ? m - i0 : MC;
            const float *a = gr->a + i0 * gr->lda + k0;
            if (kind == HP__UK_BF16) round_block(mb, kel, a, gr->lda, is.a16, 2 * kw);
            else if (call->round_a) /* rounded to bf16 values, kept in f32, rows kel apart as below */
                hp__round_rows_bf16_f32(mb, kel, a, gr->lda, a32);
            else /* rows kel apart: no cache-set conflicts between the tile's rows, whatever lda */
                for (int64_t r = 0; r < mb; r++) memcpy(a32 + r * kel, a + r * gr->lda, (size_t)kel * sizeof *a32);
            for (int64_t p0 = 0; p0 < nc; p0 += NR) {
                int64_t nr = nc - p0 < NR ? nc - p0 : NR;
                __mmask16 msk[4];
                for (int v = 0; v < 4; v++) {
                    int64_t cols = nr - 16 * v;
                    msk[v] = (__mmask16)(cols >= 16 ? 0xffffu : cols <= 0 ? 0u : (1u << cols) - 1u);
                }
                const uint32_t *p = wp + p0 / NR * kw * NR;
                float *c = gr->c + i0 * gr->ldc + j0 + p0;
                for (int64_t r0 = 0; r0 < mb; r0 += MR) {
                    int mr = mb - r0 < MR ? (int)(mb - r0) : MR;
                    if (kind == HP__UK_BF16)
                        tile_bf16(mr, kw, is.a16 + r0 * 2 * kw, 2 * kw, p, c + r0 * gr->ldc, gr->ldc, !first, msk);
                    else
                        tile_f32(mr, kel, a32 + r0 * kel, kel, (const float *)p, c + r0 * gr->ldc, gr->ldc, !first,
                                 msk);
                }
            }
        }
    }
}

void hp__uk_gemm(const hp__uk_call *call, const hp_linear_group *groups, int64_t n_groups)
{
    int nt = call->threads < 1 ? 1 : call->threads;
    /* Column blocks: about a thread's share of N (whole panels), at most NC_MAX. Any nc gives the same sums. */
    int64_t n = call->n, share = (n + nt - 1) / nt, nc = (share + NR - 1) / NR * NR;
    if (nc > NC_MAX) nc = NC_MAX;
    int64_t blocks = (n + nc - 1) / nc, items = 0;
    double work = 0;
    for (int64_t g = 0; g < n_groups; g++)
        if (hp__uk_takes(call, groups[g].m)) {
            items += blocks;
            work += (double)groups[g].m * (double)n * (double)call->k;
        }
    if (items == 0) return;
    bool par = nt > 1 && items > 1 && work >= (double)PAR_MIN_WORK;
#pragma omp parallel num_threads(nt) if (par)
    {
        char *part = call->scratch + (size_t)omp_get_thread_num() * call->slot_bytes;
        /* item i: the (i / blocks)-th large group, block i % blocks: walk the groups once per thread */
        int64_t g = 0, seen = 0; /* large groups before g */
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < items; i++) {
            int64_t want = i / blocks;
            if (want < seen) g = 0, seen = 0; /* never with a monotonic schedule; kept for safety */
            while (!hp__uk_takes(call, groups[g].m) || seen < want) {
                if (hp__uk_takes(call, groups[g].m)) seen++;
                g++;
            }
            int64_t j0 = i % blocks * nc, cols = n - j0 < nc ? n - j0 : nc;
            if (hp__uk_algo_of(call, groups[g].m) == HP__UK_PACK_A) run_item_a(call, &groups[g], j0, cols, part);
            else run_item(call, &groups[g], j0, cols, part);
        }
    }
}
