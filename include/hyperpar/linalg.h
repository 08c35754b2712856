/*
 * hyperpar/linalg.h — the GEMM layer: every matrix product of the runtimes goes through here, and only
 * src/kernels/ calls a BLAS (oneDNN).
 *
 * A linear is one weight, or a stack of same-shape weights (the experts of a MoE layer), prepared once:
 *
 *   W    [n_mats, N, K]  row-major, in the weight's own dtype (F32 or BF16; F16 is widened to f32 once)
 *   bias [n_mats, N]     f32, optional
 *
 * and applied as often as needed to f32 activations with any row count:
 *
 *   C [M, N] (ldc)  =  A [M, K] (lda) · W[mat]ᵀ (+ bias[mat])          accumulate = false
 *   C [M, N] (ldc) +=  A [M, K] (lda) · W[mat]ᵀ (+ bias[mat])          accumulate = true
 *
 * Numerics (hp_linalg_mode):
 *   EXACT (default)  A stays f32; a BF16 weight is widened exactly (bf16 → f32 is a 16-bit shift) inside the
 *                    kernel; f32 accumulation. Only the summation order differs from a plain loop.
 *   BF16             A is rounded to bf16 (nearest, ties to even) first, and so is an F32 weight (an owned
 *                    bf16 copy made at init), as PyTorch's bf16 model and autocast multiply; f32 accumulation.
 *                    Each product then carries both operands' rounding errors, at most 2^-9 relative each.
 *
 * Memory: F32 and BF16 weights are borrowed — the caller keeps them alive and unchanged until
 * hp_linear_free (an mmap'd checkpoint is fine) — unless oneDNN prefers a blocked layout, in which case
 * init reorders each matrix once into an owned copy of the same dtype (hp_linear_info says which, and how
 * many bytes each side holds). BF16 is never copied to f32. F16 weights, F32 weights in BF16 mode and all biases
 * are copied at init.
 *
 * Threads: a context (hp_linalg) holds oneDNN's engine and one stream per OpenMP thread, the primitives shared
 * by every linear of the same shape, and scratch for each thread, sized at init for the OpenMP threads then in
 * effect. One thread at a time calls into a context and its linears; inside a call, oneDNN and the bf16
 * kernels use the process's OpenMP pool (libgomp, the pool the rest of hyperpar uses). The layer allocates nothing on the forward path, and the streaming
 * kernel (few rows, bf16 weights) makes no heap allocation at all; oneDNN 2.6 still allocates inside its
 * own calls (argument descriptors, gemm:jit's packing buffers: measured in docs/kernels.md).
 */
#ifndef HYPERPAR_LINALG_H
#define HYPERPAR_LINALG_H

#include "hyperpar/core.h"
#include "hyperpar/safetensors.h" /* hp_dtype */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hp_linalg hp_linalg;
typedef struct hp_linear hp_linear;

typedef enum hp_linalg_mode {
    HP_LINALG_EXACT = 0, /* f32 activations, exact bf16 widening, f32 accumulation */
    HP_LINALG_BF16,      /* both operands of every product rounded to bf16 (f32 weights too), f32 accumulation */
} hp_linalg_mode;

/* Whether init may reorder a weight into oneDNN's preferred layout (an owned copy of the same dtype). */
typedef enum hp_linear_pack {
    HP_LINEAR_PACK_AUTO = 0, /* when oneDNN's preferred layout is blocked (what its brgemm kernels want) */
    HP_LINEAR_PACK_NEVER,    /* never copy: use the caller's [N, K] rows as they are */
    HP_LINEAR_PACK_ALWAYS,   /* whenever oneDNN's preferred layout differs from [N, K] rows */
} hp_linear_pack;

typedef struct hp_linear_desc {
    int64_t n_out;       /* N: output features (rows of W) */
    int64_t n_in;        /* K: input features (columns of W) */
    int64_t n_mats;      /* stacked matrices (experts); 0 counts as 1 */
    hp_dtype dtype;      /* HP_DT_F32, HP_DT_BF16 or HP_DT_F16 */
    const void *w;       /* [n_mats, n_out, n_in] row-major, naturally aligned for dtype */
    const float *bias;   /* [n_mats, n_out] or NULL */
    hp_linalg_mode mode;
    hp_linear_pack pack;
} hp_linear_desc;

/* One product of a grouped call: C_g = A_g · W[mat]ᵀ (+ bias[mat]), m rows (0 is allowed). */
typedef struct hp_linear_group {
    int64_t mat;     /* which matrix of the stack */
    int64_t m;       /* rows of A and C */
    const float *a;  /* [m, lda] */
    int64_t lda;     /* ≥ K */
    float *c;        /* [m, ldc]; the C blocks of one call must not overlap */
    int64_t ldc;     /* ≥ N */
} hp_linear_group;

/* What a linear does, for benchmarks and resident-memory reports. The strings live as long as the linear. */
typedef struct hp_linear_info {
    hp_dtype dtype;          /* the dtype the kernels read: F32 (also for F16 input) or BF16 */
    hp_linalg_mode mode;
    bool packed;             /* weights reordered into an owned copy at init */
    size_t owned_bytes;      /* bytes this linear allocated: packed or widened weights, bias */
    size_t borrowed_bytes;   /* caller bytes it reads on every call (weights not copied) */
    int64_t small_m_max;     /* row counts 1..small_m_max run the streaming kernel, larger ones large_path */
    const char *small_path;  /* e.g. "avx2+fma bf16 dot" ("none" when small_m_max is 0) */
    const char *large_path;  /* e.g. "oneDNN gemm:jit f32, bf16 widened in blocks of 256 rows", or "hyperpar
                                avx512 f32 6x64 blocked, ... at >= 128 rows; below: oneDNN ..." */
    const char *fixed_impl;  /* oneDNN's implementation of the first fixed-shape product this linear ran (e.g.
                                "brg:avx512_core_bf16"), or NULL when none has run */
} hp_linear_info;
/* The name of hyperpar's blocked kernel when a product of m rows runs on it (e.g. "hyperpar avx512 f32 6x64
 * blocked, bf16 W widened while packed per call"), else NULL: the streaming kernel or oneDNN (hp_linear_info). */
const char *hp_linear_blocked_path(const hp_linear *lin, int64_t m);

/* ---- the context ---- */
hp_status hp_linalg_create(hp_linalg **out, hp_err *err);
/* Frees the context; every linear made from it must have been freed. Accepts NULL. */
void hp_linalg_destroy(hp_linalg *ctx);

/* "oneDNN 2.6.3 (isa avx2), cpu AMD EPYC: avx2 fma, no avx512f avx512_bf16 amx, 2 OpenMP threads". */
const char *hp_linalg_describe(const hp_linalg *ctx, char *buf, size_t cap);
/* The CPU features this process may use, a space-separated subset of "avx2 fma avx512f avx512bw avx512_bf16
 * amx_bf16 amx_tile" ("" when none), into buf; cpuid and the OS's saved-register state both checked. */
const char *hp_linalg_cpu_isa(char *buf, size_t cap);
/* The cores this process may run on (its CPU affinity). */
int hp_linalg_cores(void);
/* Sets the OpenMP threads of later calls (n <= 0: leave as is); returns the count in effect. Set it before
 * creating linears: some oneDNN kernels fix their thread count when the primitive is made. */
int hp_linalg_set_threads(int n);

/* ---- linears ---- */
/* Checks the description (dtype, positive N and K, sizes that fit, alignment), prepares the primitives (one
 * per shape, dtype and mode, shared through ctx) and grows ctx's scratch. HP_ERR_INPUT for a bad
 * description, with a sentence naming the field; HP_ERR_NOMEM; HP_ERR_IO when oneDNN refuses a shape. */
hp_status hp_linear_init(hp_linear **out, hp_linalg *ctx, const hp_linear_desc *d, hp_err *err);
/* Accepts NULL. */
void hp_linear_free(hp_linear *lin);

/* C = A · W[mat]ᵀ (+ bias), or C += that with accumulate. m = 0 does nothing. HP_ERR_INPUT for a bad mat,
 * m < 0, lda < K or ldc < N, or NULL A / C with m > 0. */
hp_status hp_linear_forward(hp_linear *lin, int64_t mat, int64_t m, const float *a, int64_t lda, float *c,
                            int64_t ldc, bool accumulate, hp_err *err);
/* The products of n_groups groups in one call (the experts of a MoE layer): groups with few rows share one
 * parallel pass of the streaming kernel; those the blocked AVX-512 kernel takes (docs/kernels.md) share one
 * parallel loop over (group, column block), each byte-equal to its own hp_linear_forward whatever the thread
 * count; of the others for oneDNN, when two or more have at most 1024 rows, one
 * parallel loop runs each of those on one thread (oneDNN single-threaded inside it), bit-equal to its own
 * hp_linear_forward on one thread whatever the thread count; the rest reuse the one oneDNN primitive in turn
 * over all threads. The result equals n_groups calls of hp_linear_forward up to f32 summation order (exactly,
 * on one thread). */
hp_status hp_linear_forward_grouped(hp_linear *lin, const hp_linear_group *groups, int64_t n_groups,
                                    bool accumulate, hp_err *err);

void hp_linear_get_info(const hp_linear *lin, hp_linear_info *info);

/* ---- plain products (f64 and thread count: blas.c; f32: gemm_dnnl.c) ---- */
/* C [m, n] = A [m, k] · Bᵀ (B [n, k]), all f64 row-major (the router's exact logits). Dimensions must fit an
 * int (the caller checks). */
void hp_linalg_dgemm_nt(int64_t m, int64_t n, int64_t k, const double *a, int64_t lda, const double *b, int64_t ldb,
                        double *c, int64_t ldc);
/* Sets OpenBLAS's threads (n <= 0: leave as is); returns the count in effect. */
int hp_linalg_blas_threads(int n);
/* C = alpha·A·B + beta·C (trans_b: A·Bᵀ), f32 row-major with leading dimensions: attention's Q·Kᵀ and P·V,
 * products of two activations (no weight to pre-pack), and the backward's dX = dY·W. oneDNN's sgemm (its JIT
 * kernels: 1.2-2x OpenBLAS 0.3.21 on the backward's shapes, docs/kernels.md), OpenBLAS should it refuse a call. */
void hp_linalg_sgemm(bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                     const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
/* C [m, n] = alpha·Aᵀ·B + beta·C with A [k, m] (lda) and B [k, n] (ldb), f32 row-major: the backward's weight
 * gradients (dW += dYᵀ·X, with dY [rows, out] and X [rows, in]) and attention's dK, dV; the transposed operand
 * is read in place, never copied. */
void hp_linalg_sgemm_tn(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                        int64_t ldb, float beta, float *c, int64_t ldc);
/* C [m, n] = alpha·op(A)·op(B) + beta·C, f32 row-major, op(X) = Xᵀ when trans_x (read in place): EXACT is the two
 * calls above; BF16 multiplies A and B rounded to bf16 (to nearest even) with f32 sums, as a bf16 autocast
 * product does — what every product of the runtime's BF16 mode that has no weight to pre-pack runs (the linear
 * backward; the fused attention kernel instead rounds its blocks with hp_linalg_round_rows_bf16 and calls
 * hp_linalg_sgemm from many threads at once, which this function's one shared bf16 context does not allow).
 * Fails only for want of memory (BF16 mode rounds copies of both operands). */
hp_status hp_linalg_gemm(hp_linalg_mode mode, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                         float alpha, const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                         int64_t ldc, hp_err *err);
/* x rounded to the nearest bf16 value (ties to even; NaN stays NaN, quiet), as f32: what BF16 mode multiplies. */
float hp_linalg_round_bf16(float x);
/* dst [rows, cols] (packed, cols apart) = the block a [rows, cols] (lda) with hp_linalg_round_bf16 applied to each
 * value, at memory speed; dst may be a when lda == cols. What a BF16-mode kernel outside this layer multiplies. */
void hp_linalg_round_rows_bf16(int64_t rows, int64_t cols, const float *a, int64_t lda, float *dst);
/* Σ_i exp(z[i] − mx) over n floats, each term and the sum in f64: the loss's normalizer over a row of logits
 * (mx its max). On the vector units (src/kernels/vmath.c): at most a few ulp from glibc's exp per term. */
double hp_linalg_sumexp(const float *z, int64_t n, float mx);
/* x[i] = exp(x[i] − sub)·mul over n floats, f32, on the vector units: softmax's numerators (attention). Within 2
 * ulp of expf; an argument below −87 gives about 1e-38 instead of less (−inf included), NaN stays NaN. */
void hp_linalg_exp_rows(float *x, int64_t n, float sub, float mul);
/* out[i] = silu(g[i])·u[i] = g[i] / (1 + exp(−g[i]))·u[i] over n floats, f32, on the vector units: SwiGLU. out
 * may be g or u. */
void hp_linalg_silu_mul(const float *g, const float *u, int64_t n, float *out);
/* The arithmetic peak of this process's OpenMP threads in mode, GFLOP/s summed over them: every thread at once runs
 * multiply-adds on registers only for about `seconds` (src/kernels/peak.c). EXACT: f32 FMA (AVX-512F, else AVX2+FMA);
 * BF16: vdpbf16ps where the CPU has AVX512_BF16, else as EXACT (BF16 mode then multiplies f32 values). 0 on a CPU
 * without AVX2+FMA. A bound for benchmarks to print next to GEMM rates. */
double hp_linalg_peak_gflops(hp_linalg_mode mode, double seconds);
/* The instruction hp_linalg_peak_gflops times in mode, e.g. "avx512_bf16 vdpbf16ps". */
const char *hp_linalg_peak_name(hp_linalg_mode mode);
/* What BF16 mode's products run on in this process, into buf: "vdpbf16ps (vdpbf16ps measured at 2.00 of the f32
 * FMA rate)", or "f32 FMA on widened bf16 (... 0.49 ...)" where vdpbf16ps is the slower (src/kernels/peak.c). */
const char *hp_linalg_bf16_products(char *buf, size_t cap);
/* "OpenBLAS Haswell kernels (OpenBLAS 0.3.21 ..., 2 threads)", with a warning appended (and *generic_fallback
 * set, when not NULL) when OpenBLAS runs a generic kernel on a CPU that has AVX2 or AVX-512. */
const char *hp_linalg_blas_describe(char *buf, size_t cap, bool *generic_fallback);

#ifdef __cplusplus
}
#endif
#endif
