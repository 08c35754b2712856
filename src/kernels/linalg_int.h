/*
 * linalg_int.h — internal to src/kernels: the context and linear records, the oneDNN wrapper (gemm_dnnl.c,
 * the only file that includes <oneapi/dnnl/dnnl.h>), the streaming kernels (kernel.c), CPU detection
 * (cpu.c), the f64 reference (ref.c) and the test hooks.
 *
 * Paths a linear can take (chosen once, at init):
 *
 *   rows m      F32 weight              BF16 weight, EXACT               BF16 weight, BF16 mode
 *   1..small    oneDNN f32 (small = 0)  dot kernel: widen W, f32 FMA     A rounded, dot kernel
 *   > small     oneDNN f32 matmul       W widened in row blocks into     oneDNN bf16×bf16 where it exists,
 *                                       scratch, oneDNN f32 on each      else A rounded + the EXACT path
 *   > small,    ukernel.c F32           ukernel.c WIDEN                  ukernel.c BF16 (avx512_bf16)
 *   AVX-512
 *
 * In BF16 mode an F32 weight takes the F32 column with A rounded to bf16 first.
 */
#ifndef HP_LINALG_INT_H
#define HP_LINALG_INT_H

#include "hyperpar/linalg.h"

/* ---- CPU features (cpu.c) ---- */
typedef struct hp__cpu {
    bool avx2, fma, avx512f, avx512bw, avx512_bf16, amx_bf16, amx_tile;
    char brand[49]; /* cpuid's processor name, trimmed; "" when the CPU has none */
} hp__cpu;
void hp__cpu_detect(hp__cpu *cpu);

/* The streaming kernel's instruction sets. */
typedef enum hp__isa {
    HP__ISA_PORTABLE = 0, /* plain C, sequential f32 sums over k */
    HP__ISA_AVX2,         /* AVX2 + FMA, 8 lanes */
    HP__ISA_AVX512,       /* AVX-512F, 16 lanes */
    HP__ISA_COUNT
} hp__isa;
bool hp__isa_available(hp__isa isa);
const char *hp__isa_name(hp__isa isa);
hp__isa hp__isa_best(void);
/* A module's instruction set held in *slot (0: not yet known, else 1 + the hp__isa): hp__isa_best at the first call,
 * or what a test forced with hp__isa_force. Relaxed atomics: every thread computes the same answer. */
hp__isa hp__isa_cached(_Atomic int *slot);
void hp__isa_force(_Atomic int *slot, hp__isa isa);

/* Whether BF16 mode multiplies on the CPU's bf16 instructions (vdpbf16ps, oneDNN's bf16 × bf16), or, where
 * vdpbf16ps gives fewer flops than f32 FMA, as f32 FMA on the bf16 operands widened exactly (peak.c): measured once
 * per process. hp__bf16_dot_force (a test hook): 0 measure, 1 native, 2 widened; set it before any linear exists. */
bool hp__bf16_dot_native(void);
void hp__bf16_dot_force(int how);

/* ---- streaming kernels (kernel.c) ---- */
/* C[r, j] = Σ_k A[r, k]·W[j, k] (C += with accumulate) for r < m, j < n. W holds n rows of k elements of
 * wdt (HP_DT_F32 or HP_DT_BF16), contiguous; A [m, lda] f32. Sums are f32; products are exact for bf16 W. */
void hp__dot_rows(hp__isa isa, hp_dtype wdt, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                  const void *w, float *c, int64_t ldc, bool accumulate);
/* dst[i] = the f32 value of bf16 src[i] (exact). */
void hp__bf16_widen(hp__isa isa, const uint16_t *src, float *dst, int64_t n);
/* Round-to-nearest-even f32 → bf16, NaN kept quiet: as bits, or as the f32 value the bf16 stands for. */
uint16_t hp__bf16_from_f32(float x);
float hp__bf16_to_f32(uint16_t b);
void hp__round_rows_bf16(int64_t m, int64_t k, const float *a, int64_t lda, uint16_t *dst);   /* [m, k] */
void hp__round_rows_bf16_f32(int64_t m, int64_t k, const float *a, int64_t lda, float *dst); /* [m, k] */
/* The transpose, rounded: dst [k, m] (dst[i·m + r] = a[r·lda + i] rounded) of a [m, k] block at lda. */
void hp__round_cols_bf16(int64_t m, int64_t k, const float *a, int64_t lda, uint16_t *dst);
/* C = alpha·op(A)·op(B) + beta·C with both operands rounded to bf16 into scratch and multiplied by a oneDNN bf16
 * matmul (f32 sums), through a process-wide context made at the first call (its primitive cache and scratch live
 * to the process's end). false, with nothing written, when this CPU's oneDNN has no bf16 matmul or memory runs
 * out: the caller then multiplies rounded f32 copies (the same numbers at the f32 rate). linear.c. */
bool hp__plain_bf16(bool fixed, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
/* hp_linalg_gemm with `fixed` (hp__plain_bf16's): a BF16-mode product of HP__FIXED_M_MIN rows or more may take a
 * primitive made for its shape (brgemm). Only for callers whose shapes are a small set that repeats (the dense
 * backward: hp__linear_backward): the cache is bounded (HP__FIXED_MAX) and filled in call order, so with shapes
 * that vary from call to call (a MoE's experts) which path a product takes would depend on the calls before it,
 * and a resumed run would not repeat an uninterrupted one to the bit. hp_linalg_gemm passes false. */
hp_status hp__linalg_gemm(hp_linalg_mode mode, bool fixed, bool trans_a, bool trans_b, int64_t m, int64_t n,
                          int64_t k, float alpha, const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                          float *c, int64_t ldc, hp_err *err);

/* ---- the blocked AVX-512 kernel for large products (ukernel.c) ---- */
typedef enum hp__uk_kind {
    HP__UK_F32 = 0, /* f32 W, f32 A: f32 FMA (avx512f, avx512bw) */
    HP__UK_WIDEN,   /* bf16 W widened exactly while packed, then HP__UK_F32's microkernel: bit-equal to it on the
                       f32 widening of the same weight */
    HP__UK_BF16,    /* bf16 W in VNNI pairs, A rounded to bf16 (nearest even): vdpbf16ps (avx512_bf16) */
} hp__uk_kind;
/* The blocked kernel's two loop nests (ukernel.c), which give the same bytes for every product: */
typedef enum hp__uk_algo {
    HP__UK_PACK_A = 0, /* A packed per call, W read in place (each word broadcast); 32 rows × 12 columns */
    HP__UK_PACK_W,     /* W packed per call (a 16×16 transpose per 256 words); 6 rows × 64 columns per tile */
    HP__UK_ALGOS
} hp__uk_algo;
/* One call: every group whose rows m satisfy min_m[a] < m ≤ max_m[a] for an algo a (the first such, in the
 * enum's order),
 * C_g (+)= A_g · W[mat]ᵀ (+ bias[mat]) (acc: C +=), in one OpenMP parallel region of `threads` threads; thread t
 * uses the hp__uk_scratch_bytes(kind) bytes at scratch + t·slot_bytes (64-byte aligned). W [n_mats, n, k] rows
 * (f32 for HP__UK_F32, else bf16); bias [n_mats, n] or NULL. Each C element sums its products in ascending k from
 * its start value, whatever M, N, the element's position, the algo or the thread count (see ukernel.c). */
typedef struct hp__uk_call {
    hp__uk_kind kind;
    int64_t n, k;
    const void *w;
    const float *bias;
    bool acc;
    int64_t min_m[HP__UK_ALGOS], max_m[HP__UK_ALGOS];
    bool round_a; /* F32, WIDEN: A rounded to bf16 first (BF16 mode on widened weights) */
    char *scratch;
    size_t slot_bytes;
    int threads;
} hp__uk_call;
/* The algo that takes a group of m rows, or -1: none. */
static inline int hp__uk_algo_of(const hp__uk_call *c, int64_t m)
{
    for (int a = 0; a < HP__UK_ALGOS; a++)
        if (m > c->min_m[a] && m <= c->max_m[a]) return a;
    return -1;
}
static inline bool hp__uk_takes(const hp__uk_call *c, int64_t m) { return hp__uk_algo_of(c, m) >= 0; }
bool hp__uk_available(hp__uk_kind kind); /* this CPU and OS run it */
const char *hp__uk_name(hp__uk_kind kind, hp__uk_algo algo); /* hp_linear_info.large_path */
size_t hp__uk_scratch_bytes(hp__uk_kind kind);
void hp__uk_gemm(const hp__uk_call *call, const hp_linear_group *groups, int64_t n_groups);

/* ---- oneDNN (gemm_dnnl.c) ---- */
typedef struct hp__dnnl hp__dnnl;       /* engine + stream */
typedef struct hp__dnnl_mm hp__dnnl_mm; /* one matmul primitive, runtime M */

#define HP__DNNL_RUNTIME_N (-1)

typedef struct hp__dnnl_mm_key {
    hp_dtype src, wei; /* HP_DT_F32 or HP_DT_BF16 each; dst is always f32 */
    int64_t n;         /* N, or HP__DNNL_RUNTIME_N (then the weight is plain [N, K] rows) */
    int64_t k;
    bool beta;         /* C += A·Wᵀ (a sum post-op) instead of C = A·Wᵀ */
    bool packed;       /* weights in oneDNN's preferred layout (format_tag_any) instead of [N, K] rows */
    int64_t m, lda, ldc; /* a fixed shape: M rows at these row strides (m > 0, N not runtime, weights as [N, K]
                            rows), for which oneDNN 2.6 runs brgemm; m = 0: runtime M and strides (gemm:jit) */
} hp__dnnl_mm_key;

/* What oneDNN would like the weights of this key to look like. */
typedef enum hp__dnnl_layout {
    HP__LAYOUT_UNSUPPORTED = 0, /* no implementation for these data types on this CPU */
    HP__LAYOUT_ROWS,            /* [N, K] rows: the caller's layout */
    HP__LAYOUT_PLAIN_OTHER,     /* another plain (strided) layout, e.g. [K, N] */
    HP__LAYOUT_BLOCKED,         /* a blocked layout (inner blocks) */
} hp__dnnl_layout;

hp_status hp__dnnl_create(hp__dnnl **out, hp_err *err);
/* Makes sure streams 0..n-1 exist (hp__dnnl_mm_run's slots); one at creation. */
hp_status hp__dnnl_reserve_streams(hp__dnnl *d, int n, hp_err *err);
void hp__dnnl_destroy(hp__dnnl *d);
/* "oneDNN 2.6.3 (isa avx2)". */
const char *hp__dnnl_version(char *buf, size_t cap);
/* The preferred weight layout for key (key->packed is ignored: asks with format_tag_any). */
hp__dnnl_layout hp__dnnl_preferred(hp__dnnl *d, const hp__dnnl_mm_key *key);
/* Creates the primitive. *unsupported (may be NULL) is set when oneDNN has no implementation for it; that
 * and every other refusal return HP_ERR_IO with oneDNN's status named. */
hp_status hp__dnnl_mm_create(hp__dnnl *d, const hp__dnnl_mm_key *key, hp__dnnl_mm **out, bool *unsupported,
                             hp_err *err);
void hp__dnnl_mm_destroy(hp__dnnl_mm *mm);
const hp__dnnl_mm_key *hp__dnnl_mm_key_of(const hp__dnnl_mm *mm);
const char *hp__dnnl_mm_impl(const hp__dnnl_mm *mm); /* oneDNN's implementation name, e.g. "gemm:jit" */
size_t hp__dnnl_mm_scratch_bytes(const hp__dnnl_mm *mm);
size_t hp__dnnl_mm_packed_bytes(const hp__dnnl_mm *mm); /* one matrix in the packed layout (packed keys) */
bool hp__dnnl_mm_same_weights(const hp__dnnl_mm *a, const hp__dnnl_mm *b); /* the same weight layout */
/* Reorders one [N, K] matrix (key's wei dtype) into the packed layout of mm. */
hp_status hp__dnnl_pack(hp__dnnl *d, const hp__dnnl_mm *mm, const void *w_rows, void *w_packed, hp_err *err);
/* C [m, n] (ldc) (+)= A [m, k] (lda) · Wᵀ on stream `slot` (< the streams reserved). n must equal the key's N
 * unless that is runtime; m, lda and ldc the key's when it has a fixed shape. scratch holds hp__dnnl_mm_scratch_bytes(mm) bytes (64-byte aligned). Threads may run
 * the same primitive at once on different slots with different scratch; inside an OpenMP parallel region
 * oneDNN (OpenMP runtime) runs the call on the calling thread alone. */
/* OpenBLAS's f32 product (blas.c): the fallback of hp_linalg_sgemm / _tn should oneDNN's sgemm refuse a call. */
void hp__blas_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                    int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
hp_status hp__dnnl_mm_run(hp__dnnl *d, int slot, const hp__dnnl_mm *mm, int64_t m, int64_t n, const void *a,
                          int64_t lda, const void *w, float *c, int64_t ldc, void *scratch, hp_err *err);

/* ---- records ---- */
typedef enum hp__large {
    HP__LARGE_F32 = 0, /* oneDNN f32 × f32 on the (possibly packed) f32 weight */
    HP__LARGE_WIDEN,   /* bf16 weight widened in blocks of widen_rows rows, oneDNN f32 on each block */
    HP__LARGE_BF16,    /* oneDNN bf16 × bf16 (BF16 mode only) */
} hp__large;

struct hp_linalg {
    hp__dnnl *dnnl;
    hp__dnnl_mm **mms; /* the primitive cache: one per key, shared by every linear */
    int64_t n_mms, cap_mms;
    int64_t n_fixed;   /* of them, fixed-shape primitives (at most HP__FIXED_MAX) */
    void *scratch;     /* [n_slots] parts of slot_bytes, 64-byte aligned, grown by hp_linear_init (and by a fixed
                          shape's first call, on the calling thread): part s is
                          thread s's in a loop over groups (part 0 the calling thread's otherwise) */
    size_t slot_bytes;
    int n_slots;       /* also the oneDNN streams reserved */
    int64_t n_linears; /* live linears (hp_linalg_destroy checks it) */
};

struct hp_linear {
    hp_linalg *ctx;
    int64_t n, k, n_mats;
    hp_dtype wdt;            /* F32 or BF16: what the kernels read */
    hp_linalg_mode mode;
    const void *w;           /* [n_mats, n, k] rows: the caller's, or w_owned */
    void *w_owned;           /* F16 widened to f32, or (BF16 mode) F32 rounded to bf16 */
    void *packed;            /* [n_mats] × packed_mat_bytes, or NULL */
    size_t packed_mat_bytes;
    float *bias;             /* [n_mats, n] owned copy, or NULL */
    hp__large large;         /* the oneDNN path of large products */
    bool uk_ok;              /* the blocked kernel can run here (its ISA) */
    hp__uk_kind uk_kind;
    int64_t uk_min_m[HP__UK_ALGOS]; /* [algo]: large products of at least this many rows run the blocked kernel's
                                       algo (INT64_MAX: none; see HP__UK_RULES) */
    int64_t uk_max_m[HP__UK_ALGOS]; /* ... and at most this many */
    const char *fixed_impl;  /* oneDNN's implementation at the first fixed shape made, or NULL */
    const hp__dnnl_mm *mm[2]; /* [beta]: mm[0] is NULL when there is a bias (the bias is written first) */
    int64_t widen_rows;
    int64_t small_m_max;
    hp__isa isa;
    size_t owned_bytes;
    char small_desc[64], large_desc[512];
};

/* Rows of A per pass when A must be rounded to bf16 first (BF16 mode): bounds the scratch (512 × K f32 per thread).
 * 512, not 256: oneDNN 2.6 runs llama-3-8b's gate/up product (N 14336, K 4096) on gemm:jit at 256 fixed rows and
 * on brgemm at 512 (issue 40). */
#define HP__ROW_CHUNK 512
/* Groups of a grouped call with more rows than small_m_max and at most this many run one per thread when there
 * are two or more (linear.c, run_large_groups): above it oneDNN's own threads split one product efficiently. A
 * fixed bound, not one derived from the thread count, so that which path a group takes never depends on it. */
#define HP__SPREAD_ROWS_MAX 1024
/* Large products of at least HP__FIXED_M_MIN rows, outside a loop over groups, run a primitive made for their
 * exact shape (M, lda, ldc) at the first call with it: oneDNN 2.6 runs its brgemm kernels only on fixed shapes,
 * and gemm:jit on runtime ones. Measured on the 2-core AVX-512 EPYC at M = 512 (llama-3-8b's projections and a
 * 32000-row head): brgemm 1.2-1.6x gemm:jit in f32 and 1.1-1.6x in bf16 (docs/kernels.md). At most HP__FIXED_MAX
 * such primitives per context; past it, the runtime-shape primitive. */
#define HP__FIXED_M_MIN 128
#define HP__FIXED_MAX 64
/* Row counts up to this run the streaming kernel on bf16 weights (measured: docs/kernels.md). With AVX-512 the
 * kernel also won at 24..96 rows, but 16 stays: above it (and below WIDEN's rows in HP__UK_RULES) a bf16 weight
 * takes the same oneDNN f32 product as its f32 widening, which training's bf16-vs-f32 equivalence test
 * (cli/test_train.sh, 24 rows) relies on: at 17..64 rows both take the A-packed nest of HP__UK_RULES. (The
 * blocked kernel's WIDEN variant equals its F32 one bit for bit; but F32 weights stay on oneDNN above 64 rows, so
 * at WIDEN's W-packed rows of HP__UK_RULES the two differ in summation order, as the fixed-shape brgemm already
 * made them differ at 128 rows and more.) */
#define HP__SMALL_M_MAX 16

/* Where the blocked kernel (ukernel.c) is the default: the rows of this table, {kind, algo, min K, min M, max M};
 * a linear takes, for each algo, the first row of its kind with min K ≤ K, for products of min M..max M rows (and
 * more than small_m_max); where two algos' ranges overlap, the first algo of hp__uk_algo takes the rows. Measured (docs/kernels.md, bench_gemm --large-only):
 * - bf16 weights in EXACT mode, at least 128 rows: it beat oneDNN f32 on the widened blocks by 1.12-1.70x on two
 *   threads (0.90x at K = 14336; at K = 768 it lost, 0.56-0.76x, at 32 and 128 rows);
 * - BF16 mode, 17 to 128 rows (a MoE prefill's experts, a small batch): 1.10-1.29x oneDNN's bf16 matmul at 32 and
 *   128 rows (K = 2048); above 128 rows oneDNN's fixed-shape brgemm won (0.84-0.95x at 512 rows);
 * - BF16 mode, 17 to 64 rows, K >= 768: the A-packed nest, faster than both the W-packed one and oneDNN on a MoE's
 *   experts (gate/up K = 2048, down K = 768) at 16 to 64 rows; at 96 and 128 rows it was level or behind.
 * - f32 weights, and bf16 weights in EXACT mode, 17 to 64 rows, K >= 768: the A-packed nest, 1.3-4.7x oneDNN's
 *   runtime-shape f32 product (qwen3's experts; llama q/o, gate/up and down at 32 and 64 rows; mixtral's down),
 *   both kinds alike, so a bf16 weight still equals its f32 widening bit for bit there (the nests and the two
 *   kinds are byte-equal); at 96 and 128 rows oneDNN was level or ahead (0.96-0.98x).
 * At more rows F32 weights stay on oneDNN: its brgemm was as fast or faster (0.85-1.07x). */
typedef struct hp__uk_rule {
    hp__uk_kind kind;
    hp__uk_algo algo;
    int64_t min_k, min_m, max_m;
} hp__uk_rule;
#define HP__UK_RULES                                                                                                 \
    {                                                                                                                \
        {HP__UK_F32, HP__UK_PACK_A, 768, HP__SMALL_M_MAX + 1, 64},                                                   \
        {HP__UK_WIDEN, HP__UK_PACK_A, 768, HP__SMALL_M_MAX + 1, 64},                                                 \
        {HP__UK_WIDEN, HP__UK_PACK_W, 1024, 128, INT64_MAX},                                                         \
        {HP__UK_BF16, HP__UK_PACK_A, 768, HP__SMALL_M_MAX + 1, 64},                                                  \
        {HP__UK_BF16, HP__UK_PACK_W, 1024, HP__SMALL_M_MAX + 1, 128},                                                \
    }

/* ---- test hooks ---- */
/* Routes row counts 1..small_m_max through the streaming kernel of isa (0: never; INT64_MAX: always),
 * F32 weights included. HP_ERR_INPUT when this CPU lacks isa. */
hp_status hp__linear_force(hp_linear *lin, hp__isa isa, int64_t small_m_max, hp_err *err);
/* Routes every large row count through oneDNN (HP__FORCE_ONEDNN = 0: false) or the blocked kernel (1: true, its
 * HP__UK_PACK_W nest; 2: its HP__UK_PACK_A nest), whatever HP_GEMM and HP__UK_RULES say. HP_ERR_INPUT when the
 * blocked kernel is asked for and this CPU lacks its ISA. */
typedef enum hp__force { HP__FORCE_ONEDNN = 0, HP__FORCE_PACK_W = 1, HP__FORCE_PACK_A = 2 } hp__force;
hp_status hp__linear_force_large(hp_linear *lin, hp__force how, hp_err *err);

/* ---- vmath.c's exp, one value, and its instruction set (tests; the caller checks hp__isa_available) ---- */
void hp__vmath_force(hp__isa isa);
/* adamw.c's instruction set for every later step and check (tests; the caller checks hp__isa_available). */
void hp__adamw_force(hp__isa isa);
double hp__exp_f64_ref(double x);
float hp__exp_f32_ref(float x);

/* ---- the reference (ref.c) ---- */
/* c[r, j] = Σ_k a[r, k]·w[j, k] (+ bias[j]) summed in f64, with A and W rounded to bf16 first in bf16_mode; and
 * abs_sum[r, j] = Σ_k |a[r, k]·w[j, k]| (+ |bias[j]|), the scale of the rounding error (may be NULL).
 * w is [n, k] rows of wdt (F32, BF16 or F16); c and abs_sum are [m, n] dense. */
void hp__gemm_ref(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, hp_dtype wdt, const void *w,
                  const float *bias, bool bf16_mode, double *c, double *abs_sum);

#endif
