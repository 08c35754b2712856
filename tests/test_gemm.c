/*
 * test_gemm.c — the GEMM layer (src/kernels) against the plain C f64 reference (hp__gemm_ref), on odd shapes:
 * M = 0, 1, 7, 33, 130; K = 19, 65, 200; N = 1, 23, 96 (none a multiple of 16); F32, BF16 and F16 weights
 * in stacks of 3; with and without bias; accumulate on and off; lda and ldc equal to and larger than K and N;
 * both numeric modes; the grouped form; and every path: the default choice, the streaming kernel of each
 * instruction set this CPU has (forced for every row count) and oneDNN alone (forced for every row count).
 *
 * Bounds, per output element, with S = Σ_k |a_k·w_k| + |bias| + |C before| (the scale of the sum):
 *   EXACT   |C − ref| ≤ 1e-5·S         (an f32 sum of k ≤ 200 terms: worst case k·2^-24·S ≈ 1.2e-5·S,
 *                                        typical √k·2^-24·S ≈ 1e-6·S)
 *   BF16    |C − ref| ≤ (2^-8 + 1e-5)·S  against the reference on unrounded A (each product carries A's
 *                                        bf16 rounding, ≤ 2^-9 relative, plus the f32 sum), and
 *           |C − ref_r| ≤ 1e-5·S         against the reference on A rounded to bf16 (the products are then
 *                                        exact in f32: only the sum's rounding is left).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperpar/linalg.h"
#include "kernels/linalg_int.h"
#include "testlib.h"

enum { G = 3 }; /* matrices per stack: the tests use the last one, so the stack offsets are exercised */

static const int64_t Ms[] = {0, 1, 7, 33, 130};
static const int64_t Ks[] = {19, 65, 200};
static const int64_t Ns[] = {1, 23, 96};

#define EXACT_TOL 1e-5
#define BF16_TOL (1.0 / 256 + 1e-5)

static hp_linalg *ctx_or_die(void)
{
    hp_err err;
    hp_linalg *ctx = NULL;
    if (hp_linalg_create(&ctx, &err) != HP_OK) {
        fprintf(stderr, "hp_linalg_create: %s\n", err.msg);
        exit(1);
    }
    return ctx;
}

/* Smooth values of mixed sign and magnitude (some not representable in bf16, so rounding shows). */
static float val(int64_t i, double f, double scale)
{
    return (float)(scale * sin(f * (double)i + 0.3) * (1.0 + 0.5 * cos(0.013 * (double)i)));
}

/* W [G, N, K] in dtype dt, from f32 values (narrowed to bf16 / f16 with round-to-nearest). */
static void *make_w(hp_dtype dt, int64_t n, int64_t k)
{
    int64_t total = G * n * k;
    float *f = malloc((size_t)total * sizeof *f);
    for (int64_t i = 0; i < total; i++) f[i] = val(i, 0.71, 0.5);
    if (dt == HP_DT_F32) return f;
    void *w = malloc((size_t)total * 2);
    hp_dtype_from_f32(dt, f, w, total, NULL);
    free(f);
    return w;
}

static float *make_f(int64_t n, double freq, double scale)
{
    float *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = val(i, freq, scale);
    return x;
}

static const void *mat_of(hp_dtype dt, const void *w, int64_t mat, int64_t n, int64_t k)
{
    return (const char *)w + (size_t)(mat * n * k) * (size_t)(hp_dtype_bits(dt) / 8);
}

/* Compares c [m, ldc] with c0 (the values before, for accumulate) + ref. Returns the worst error / bound. */
static double compare(int64_t m, int64_t n, const float *c, int64_t ldc, const float *c0, bool acc,
                      const double *ref, const double *abs_sum, double tol)
{
    double worst = 0.0;
    for (int64_t r = 0; r < m; r++) {
        for (int64_t j = 0; j < n; j++) {
            double before = acc ? c0[r * ldc + j] : 0.0;
            double want = before + ref[r * n + j];
            double bound = tol * (abs_sum[r * n + j] + fabs(before)) + 1e-30;
            double e = fabs((double)c[r * ldc + j] - want) / bound;
            if (!(e <= worst)) worst = e; /* NaN counts as the worst */
        }
    }
    return worst;
}

typedef struct path {
    const char *name;
    bool force;
    hp__isa isa;
    int64_t small; /* small_m_max when forced */
    int large;     /* large rows: -1 as chosen at init, 0 oneDNN, 1 the blocked kernel */
} path;

enum { MAX_PATHS = HP__ISA_COUNT + 3 };

static void force_path(hp_linear *lin, const path *p)
{
    hp_err err;
    if (p->force) CHECK(hp__linear_force(lin, p->isa, p->small, &err) == HP_OK);
    if (p->large >= 0) CHECK_MSG(hp__linear_force_large(lin, p->large == 1, &err) == HP_OK, "%s", err.msg);
}

/* The paths to run on this CPU: default, each ISA's kernel for every m, oneDNN for every m, the blocked kernel
 * for every m (where this CPU has it). */
static int paths_of(path *p)
{
    static bool told;
    int n = 0;
    p[n++] = (path){"default", false, HP__ISA_PORTABLE, 0, -1};
    for (int isa = 0; isa < HP__ISA_COUNT; isa++) {
        if (!hp__isa_available((hp__isa)isa)) {
            if (!told) printf("  (the %s kernel is not available on this CPU: skipped)\n", hp__isa_name((hp__isa)isa));
            continue;
        }
        p[n++] = (path){hp__isa_name((hp__isa)isa), true, (hp__isa)isa, INT64_MAX, -1};
    }
    p[n++] = (path){"oneDNN only", true, hp__isa_best(), 0, 0};
    if (hp__uk_available(HP__UK_BF16)) p[n++] = (path){"blocked kernel only", true, hp__isa_best(), 0, 1};
    else if (!told) printf("  (skipped: no avx512f/avx512bw/avx512_bf16: the blocked kernel does not run here)\n");
    told = true;
    return n;
}

/* One linear (K, N, dtype, mode, bias) through every path, every M, accumulate off and on, tight and padded
 * strides. */
static void run_linear(hp_linalg *ctx, int64_t k, int64_t n, hp_dtype dt, hp_linalg_mode mode, bool with_bias)
{
    hp_err err;
    void *w = make_w(dt, n, k);
    float *bias = with_bias ? make_f(G * n, 0.37, 0.25) : NULL;
    hp_linear_desc d = {.n_out = n, .n_in = k, .n_mats = G, .dtype = dt, .w = w, .bias = bias, .mode = mode};
    const int64_t mat = G - 1, mmax = 130, pad_a = 5, pad_c = 3;
    float *a = make_f(mmax * (k + pad_a), 0.113, 1.0);
    size_t c_bytes = (size_t)(mmax * (n + pad_c)) * sizeof(float);
    float *c = malloc(c_bytes), *c0 = malloc(c_bytes);
    double *ref = malloc((size_t)(mmax * n) * sizeof *ref), *abs_sum = malloc((size_t)(mmax * n) * sizeof *abs_sum);
    double *ref_r = malloc((size_t)(mmax * n) * sizeof *ref_r);
    const void *wm = mat_of(dt, w, mat, n, k);
    const float *bm = bias ? bias + mat * n : NULL;
    path paths[MAX_PATHS];
    int n_paths = paths_of(paths);
    for (int pad = 0; pad < 2; pad++) {
        int64_t lda = k + (pad ? pad_a : 0), ldc = n + (pad ? pad_c : 0);
        /* The references for the largest M hold those of every smaller M in their first rows. */
        hp__gemm_ref(mmax, n, k, a, lda, dt, wm, bm, false, ref, abs_sum);
        if (mode == HP_LINALG_BF16) hp__gemm_ref(mmax, n, k, a, lda, dt, wm, bm, true, ref_r, NULL);
        hp_linear *lin = NULL; /* fresh, so the first path is the default choice */
        CHECK_MSG(hp_linear_init(&lin, ctx, &d, &err) == HP_OK, "%s", err.msg);
        for (int pi = 0; lin && pi < n_paths; pi++) {
            const path *p = &paths[pi];
            force_path(lin, p);
            for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
                int64_t m = Ms[mi];
                for (int acc = 0; acc < 2; acc++) {
                    for (int64_t i = 0; i < mmax * ldc; i++) c0[i] = c[i] = val(i, 0.29, 2.0);
                    hp_status st = hp_linear_forward(lin, mat, m, a, lda, c, ldc, acc, &err);
                    CHECK_MSG(st == HP_OK, "%s", err.msg);
                    double tol = mode == HP_LINALG_BF16 ? BF16_TOL : EXACT_TOL;
                    double e = compare(m, n, c, ldc, c0, acc, ref, abs_sum, tol);
                    double er = mode == HP_LINALG_BF16 ? compare(m, n, c, ldc, c0, acc, ref_r, abs_sum, EXACT_TOL) : 0;
                    CHECK_MSG(e <= 1.0 && er <= 1.0,
                              "%s, %s W, %s mode, bias %d, M=%lld K=%lld N=%lld lda=%lld ldc=%lld accumulate %d: error "
                              "%.3g and %.3g of the bound",
                              p->name, hp_dtype_name(dt), mode ? "bf16" : "exact", with_bias, (long long)m,
                              (long long)k, (long long)n, (long long)lda, (long long)ldc, acc, e, er);
                    /* Rows past m and columns past N are never written. */
                    bool untouched = true;
                    for (int64_t r = 0; r < mmax; r++)
                        for (int64_t j = 0; j < ldc; j++)
                            if ((r >= m || j >= n) && c[r * ldc + j] != c0[r * ldc + j]) untouched = false;
                    CHECK_MSG(untouched, "%s: M=%lld N=%lld wrote outside C", p->name, (long long)m, (long long)n);
                }
            }
        }
        hp_linear_free(lin);
    }
    free(w);
    free(bias);
    free(a);
    free(c);
    free(c0);
    free(ref);
    free(abs_sum);
    free(ref_r);
}

TEST(every_shape_dtype_mode_and_path)
{
    hp_linalg *ctx = ctx_or_die();
    const hp_dtype dts[] = {HP_DT_F32, HP_DT_BF16, HP_DT_F16};
    int before = hp__failed_checks;
    for (size_t ki = 0; ki < 3; ki++)
        for (size_t ni = 0; ni < 3; ni++)
            for (size_t di = 0; di < 3; di++)
                for (int mode = 0; mode < 3; mode++) /* EXACT; BF16 on vdpbf16ps, then widened to f32 FMA */
                    for (int bias = 0; bias < 2; bias++) {
                        /* sanitized: with or without bias by turns (each shape, dtype and mode still runs) */
                        if (TEST_SANITIZED && (ki + ni + di + (size_t)mode + (size_t)bias) % 2) continue;
                        hp__bf16_dot_force(mode);
                        run_linear(ctx, Ks[ki], Ns[ni], dts[di], mode ? HP_LINALG_BF16 : HP_LINALG_EXACT, bias);
                        if (hp__failed_checks - before > 20) goto out; /* enough to diagnose */
                    }
out:
    hp__bf16_dot_force(0);
    hp_linalg_destroy(ctx);
}

/* Groups of M = 0, 1, 5, 40 on different matrices, one call, against separate references; through the
 * default paths and with every row count forced through each kernel and through oneDNN. */
static void run_grouped(hp_linalg *ctx, hp_dtype dt, hp_linalg_mode mode, bool with_bias, bool acc)
{
    enum { NG = 4 };
    const int64_t k = 65, n = 23, gm[NG] = {0, 1, 5, 40}, gmat[NG] = {1, 0, 2, 1}, lda = 70, ldc = 29;
    hp_err err;
    void *w = make_w(dt, n, k);
    float *bias = with_bias ? make_f(G * n, 0.37, 0.25) : NULL;
    hp_linear_desc d = {.n_out = n, .n_in = k, .n_mats = G, .dtype = dt, .w = w, .bias = bias, .mode = mode};
    hp_linear *lin = NULL;
    CHECK_MSG(hp_linear_init(&lin, ctx, &d, &err) == HP_OK, "%s", err.msg);
    path paths[MAX_PATHS];
    int n_paths = paths_of(paths);
    float *a[NG], *c[NG], *c0[NG];
    double *ref[NG], *abs_sum[NG];
    hp_linear_group g[NG];
    for (int i = 0; i < NG; i++) {
        a[i] = make_f(gm[i] * lda, 0.05 + 0.01 * i, 1.0);
        c[i] = make_f(gm[i] * ldc, 0.3, 1.0);
        c0[i] = make_f(gm[i] * ldc, 0.3, 1.0);
        ref[i] = malloc((size_t)(gm[i] * n + 1) * sizeof(double));
        abs_sum[i] = malloc((size_t)(gm[i] * n + 1) * sizeof(double));
        hp__gemm_ref(gm[i], n, k, a[i], lda, dt, mat_of(dt, w, gmat[i], n, k), bias ? bias + gmat[i] * n : NULL,
                     false, ref[i], abs_sum[i]);
        g[i] = (hp_linear_group){.mat = gmat[i], .m = gm[i], .a = a[i], .lda = lda, .c = c[i], .ldc = ldc};
    }
    for (int pi = 0; lin && pi < n_paths; pi++) {
        force_path(lin, &paths[pi]);
        for (int i = 0; i < NG; i++) memcpy(c[i], c0[i], (size_t)(gm[i] * ldc) * sizeof(float));
        CHECK_MSG(hp_linear_forward_grouped(lin, g, NG, acc, &err) == HP_OK, "%s", err.msg);
        for (int i = 0; i < NG; i++) {
            double e = compare(gm[i], n, c[i], ldc, c0[i], acc, ref[i], abs_sum[i],
                               mode == HP_LINALG_BF16 ? BF16_TOL : EXACT_TOL);
            CHECK_MSG(e <= 1.0, "grouped, %s, %s W, %s mode, bias %d, accumulate %d, group %d (M=%lld): error %.3g of "
                      "the bound", paths[pi].name, hp_dtype_name(dt), mode ? "bf16" : "exact", with_bias, acc, i,
                      (long long)gm[i], e);
        }
    }
    hp_linear_free(lin);
    for (int i = 0; i < NG; i++) {
        free(a[i]);
        free(c[i]);
        free(c0[i]);
        free(ref[i]);
        free(abs_sum[i]);
    }
    free(w);
    free(bias);
}

TEST(grouped_equals_separate_products)
{
    hp_linalg *ctx = ctx_or_die();
    const hp_dtype dts[] = {HP_DT_F32, HP_DT_BF16};
    for (int di = 0; di < 2; di++)
        for (int mode = 0; mode < 2; mode++)
            for (int bias = 0; bias < 2; bias++)
                for (int acc = 0; acc < 2; acc++) run_grouped(ctx, dts[di], (hp_linalg_mode)mode, bias, acc);
    hp_linalg_destroy(ctx);
}

/* Groups of 65 to 130 rows (more than the streaming kernel's range of any ISA, at most HP__SPREAD_ROWS_MAX) run
 * one per thread in one parallel loop: each must be bit-equal whatever the thread count of the grouped call (2, 3
 * against 1), for every weight dtype and mode, with bias and accumulate, and within the rounding bound of the
 * reference. (Not bit-equal to its own one-group hp_linear_forward: that call may take another oneDNN kernel — on
 * an AMX host a brgemm made for the shape, whose tiles sum K in another order — as the one-thread loop need not.)
 * A group above HP__SPREAD_ROWS_MAX in the same call runs alone over all threads: checked against the reference. */
static void run_spread(hp_linalg *ctx, hp_dtype dt, hp_linalg_mode mode, bool acc)
{
    enum { NG = 9 };
    const int64_t k = 200, n = 96, big = HP__SPREAD_ROWS_MAX + 3;
    const int64_t gm[NG] = {65, 97, 0, 70, 130, 1, 80, big, 100};
    hp_err err;
    void *w = make_w(dt, n, k);
    float *bias = make_f(G * n, 0.37, 0.25);
    hp_linear_desc d = {.n_out = n, .n_in = k, .n_mats = G, .dtype = dt, .w = w, .bias = bias, .mode = mode};
    hp_linear *lin = NULL;
    CHECK_MSG(hp_linear_init(&lin, ctx, &d, &err) == HP_OK, "%s", err.msg);
    int64_t total = 0, off[NG];
    for (int i = 0; i < NG; i++) {
        off[i] = total;
        total += gm[i];
    }
    float *a = make_f(total * k, 0.043, 1.0), *c0 = make_f(total * n, 0.3, 1.0);
    float *c1 = malloc((size_t)(total * n) * sizeof *c1), *c = malloc((size_t)(total * n) * sizeof *c);
    hp_linear_group g[NG];
    int was = hp_linalg_set_threads(0);
    for (int i = 0; lin && i < NG; i++)
        g[i] = (hp_linear_group){.mat = i % G, .m = gm[i], .a = a + off[i] * k, .lda = k, .c = c1 + off[i] * n, .ldc = n};
    hp_linalg_set_threads(1);
    memcpy(c1, c0, (size_t)(total * n) * sizeof *c1);
    CHECK_MSG(!lin || hp_linear_forward_grouped(lin, g, NG, acc, &err) == HP_OK, "%s", err.msg);
    for (int i = 0; lin && i < NG; i++) g[i].c = c + off[i] * n;
    for (int th = 2; lin && th <= 3; th++) {
        hp_linalg_set_threads(th);
        memcpy(c, c0, (size_t)(total * n) * sizeof *c);
        CHECK_MSG(hp_linear_forward_grouped(lin, g, NG, acc, &err) == HP_OK, "%s", err.msg);
        for (int i = 0; i < NG; i++) {
            if (gm[i] == big) continue; /* oneDNN's own threads may sum in another order */
            CHECK_MSG(memcmp(c + off[i] * n, c1 + off[i] * n, (size_t)(gm[i] * n) * sizeof *c) == 0,
                      "%s W, %s mode, accumulate %d, %d threads: group %d (M=%lld) differs from the one-thread "
                      "grouped call", hp_dtype_name(dt), mode ? "bf16" : "exact", acc, th, i, (long long)gm[i]);
        }
    }
    hp_linalg_set_threads(was);
    double *ref = malloc((size_t)(big * n) * sizeof *ref), *abs_sum = malloc((size_t)(big * n) * sizeof *abs_sum);
    for (int i = 0; lin && i < NG; i++) {
        hp__gemm_ref(gm[i], n, k, a + off[i] * k, k, dt, mat_of(dt, w, i % G, n, k), bias + (i % G) * n, false, ref,
                     abs_sum);
        double e = compare(gm[i], n, c + off[i] * n, n, c0 + off[i] * n, acc, ref, abs_sum,
                           mode == HP_LINALG_BF16 ? BF16_TOL : EXACT_TOL);
        CHECK_MSG(e <= 1.0, "spread, %s W, %s mode, accumulate %d, group %d (M=%lld): error %.3g of the bound",
                  hp_dtype_name(dt), mode ? "bf16" : "exact", acc, i, (long long)gm[i], e);
    }
    hp_linear_free(lin);
    free(ref);
    free(abs_sum);
    free(w);
    free(bias);
    free(a);
    free(c0);
    free(c1);
    free(c);
}

TEST(grouped_spread_groups_are_thread_count_independent)
{
    int was = hp_linalg_set_threads(0);
    hp_linalg_set_threads(3); /* the context's scratch and streams are sized for the threads at init */
    hp_linalg *ctx = ctx_or_die();
    const hp_dtype dts[] = {HP_DT_F32, HP_DT_BF16};
    for (int di = 0; di < 2; di++)
        for (int mode = 0; mode < 2; mode++)
            for (int acc = 0; acc < 2; acc++) run_spread(ctx, dts[di], (hp_linalg_mode)mode, acc);
    hp_linalg_destroy(ctx);
    hp_linalg_set_threads(was);
}

/* Many small groups in BF16 mode: their rounded rows exceed the scratch's HP__ROW_CHUNK rows, so batches
 * split (a group may straddle two); and one group of 300 rows forced through the kernel. Each result must
 * equal hp_linear_forward group by group exactly (same kernel, same order of sums). */
TEST(grouped_batches_split_at_the_scratch_size)
{
    hp_linalg *ctx = ctx_or_die();
    hp_err err;
    enum { NG = 200 };
    const int64_t k = 40, n = 19;
    void *w = make_w(HP_DT_BF16, n, k);
    hp_linear_desc d = {.n_out = n, .n_in = k, .n_mats = G, .dtype = HP_DT_BF16, .w = w, .mode = HP_LINALG_BF16};
    hp_linear *lin = NULL;
    CHECK_MSG(hp_linear_init(&lin, ctx, &d, &err) == HP_OK, "%s", err.msg);
    int64_t total = 0, gm[NG + 1];
    for (int i = 0; i < NG; i++) total += gm[i] = i % 3; /* 0, 1, 2, ...: 199 rows with empty groups between */
    gm[NG] = 300;
    total += gm[NG];
    float *a = make_f(total * k, 0.07, 1.0), *c = malloc((size_t)(total * n) * sizeof *c);
    float *c1 = malloc((size_t)(total * n) * sizeof *c1);
    hp_linear_group g[NG + 1];
    for (int force = 0; lin && force < 2; force++) {
        if (force) CHECK(hp__linear_force(lin, hp__isa_best(), INT64_MAX, &err) == HP_OK);
        int64_t off = 0;
        for (int i = 0; i <= NG; i++) {
            g[i] = (hp_linear_group){.mat = i % G, .m = gm[i], .a = a + off * k, .lda = k, .c = c + off * n, .ldc = n};
            CHECK(hp_linear_forward(lin, i % G, gm[i], a + off * k, k, c1 + off * n, n, false, &err) == HP_OK);
            off += gm[i];
        }
        CHECK_MSG(hp_linear_forward_grouped(lin, g, NG + 1, false, &err) == HP_OK, "%s", err.msg);
        CHECK(memcmp(c, c1, (size_t)(total * n) * sizeof *c) == 0);
    }
    hp_linear_free(lin);
    free(w);
    free(a);
    free(c);
    free(c1);
    hp_linalg_destroy(ctx);
}

/* Large products run a primitive made for their exact shape (M, lda, ldc) at its first call, up to HP__FIXED_MAX of
 * them per context; past that bound they take the runtime-shape primitive. Every row count from HP__FIXED_M_MIN
 * to past the bound, each at other strides, in both modes, against the reference; the same shape again reuses
 * its primitive. */
TEST(fixed_shapes_up_to_and_past_the_cache_bound)
{
    hp_linalg *ctx = ctx_or_die();
    hp_err err;
    const int64_t k = 65, n = 23, m_max = HP__FIXED_M_MIN + HP__FIXED_MAX + 5, lda_max = k + 2, ldc_max = n + 1;
    float *w = make_w(HP_DT_F32, n, k), *a = make_f(m_max * lda_max, 0.113, 1.0);
    float *c = malloc((size_t)(m_max * ldc_max) * sizeof *c);
    double *ref = malloc((size_t)(m_max * n) * sizeof *ref), *abs_sum = malloc((size_t)(m_max * n) * sizeof *abs_sum);
    for (int mode = 0; mode < 2; mode++) {
        hp_linear_desc d = {.n_out = n, .n_in = k, .n_mats = 1, .dtype = HP_DT_F32, .w = w,
                            .mode = (hp_linalg_mode)mode};
        hp_linear *lin = NULL;
        CHECK_MSG(hp_linear_init(&lin, ctx, &d, &err) == HP_OK, "%s", err.msg);
        if (lin) CHECK(hp__linear_force_large(lin, false, &err) == HP_OK); /* the fixed shapes are oneDNN's */
        for (int64_t m = HP__FIXED_M_MIN; lin && m <= m_max; m++) {
            int64_t lda = k + m % 3, ldc = n + m % 2;
            hp__gemm_ref(m, n, k, a, lda, HP_DT_F32, w, NULL, false, ref, abs_sum);
            for (int again = 0; again < 2; again++) {
                for (int64_t i = 0; i < m * ldc; i++) c[i] = 7.0f;
                CHECK_MSG(hp_linear_forward(lin, 0, m, a, lda, c, ldc, false, &err) == HP_OK, "%s", err.msg);
                double e = compare(m, n, c, ldc, NULL, false, ref, abs_sum, mode ? BF16_TOL : EXACT_TOL);
                CHECK_MSG(e <= 1.0, "%s mode, M=%lld lda=%lld ldc=%lld (call %d): error %.3g of the bound",
                          mode ? "bf16" : "exact", (long long)m, (long long)lda, (long long)ldc, again + 1, e);
            }
        }
        hp_linear_free(lin);
        if (mode == 0) /* each new shape made one primitive until the bound; the repeats made none */
            CHECK_MSG(ctx->n_fixed == HP__FIXED_MAX, "%lld fixed-shape primitives, expected %d",
                      (long long)ctx->n_fixed, HP__FIXED_MAX);
    }
    hp_linalg_destroy(ctx);
    free(w);
    free(a);
    free(c);
    free(ref);
    free(abs_sum);
}

TEST(m_zero_is_a_no_op)
{
    hp_linalg *ctx = ctx_or_die();
    hp_err err;
    float w[4 * 3] = {0}, c[2] = {7.0f, 8.0f};
    hp_linear_desc d = {.n_out = 4, .n_in = 3, .dtype = HP_DT_F32, .w = w};
    hp_linear *lin = NULL;
    CHECK(hp_linear_init(&lin, ctx, &d, &err) == HP_OK);
    CHECK(hp_linear_forward(lin, 0, 0, NULL, 3, c, 4, false, &err) == HP_OK);
    CHECK(c[0] == 7.0f && c[1] == 8.0f);
    CHECK(hp_linear_forward_grouped(lin, NULL, 0, false, &err) == HP_OK);
    hp_linear_free(lin);
    hp_linalg_destroy(ctx);
}

TEST(bf16_rounding_is_nearest_even)
{
    struct {
        float x;
        uint16_t b;
    } t[] = {
        {1.0f, 0x3f80},
        {1.0f + 0x1p-8f, 0x3f80},         /* a tie: to the even 0x3f80 */
        {1.0f + 3 * 0x1p-8f, 0x3f82},     /* a tie: to the even 0x3f82 */
        {1.0f + 0x1p-8f + 0x1p-20f, 0x3f81}, /* above the tie */
        {-2.0f, 0xc000},
        {FLT_MAX, 0x7f80},                /* rounds up to infinity */
        {INFINITY, 0x7f80},
        {-INFINITY, 0xff80},
        {1e-45f, 0x0000},                 /* the smallest subnormal rounds to zero */
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        CHECK_MSG(hp__bf16_from_f32(t[i].x) == t[i].b, "%a -> 0x%04x, want 0x%04x", t[i].x, hp__bf16_from_f32(t[i].x),
                  t[i].b);
    uint16_t nan = hp__bf16_from_f32(NAN);
    CHECK((nan & 0x7f80) == 0x7f80 && (nan & 0x007f) != 0);
    CHECK(isnan(hp__bf16_to_f32(nan)));
}

/* BF16 mode rounds A: on A values that bf16 cannot hold, its result differs from EXACT's. */
TEST(bf16_mode_differs_from_exact)
{
    hp_linalg *ctx = ctx_or_die();
    hp_err err;
    const int64_t k = 64, n = 8, m = 3;
    float *w = make_w(HP_DT_F32, n, k), *a = make_f(m * k, 0.113, 1.0), c1[3 * 8], c2[3 * 8];
    hp_linear *l1 = NULL, *l2 = NULL;
    hp_linear_desc d = {.n_out = n, .n_in = k, .dtype = HP_DT_F32, .w = w};
    CHECK(hp_linear_init(&l1, ctx, &d, &err) == HP_OK);
    d.mode = HP_LINALG_BF16;
    CHECK(hp_linear_init(&l2, ctx, &d, &err) == HP_OK);
    CHECK(l1 && l2 && hp_linear_forward(l1, 0, m, a, k, c1, n, false, &err) == HP_OK);
    CHECK(l1 && l2 && hp_linear_forward(l2, 0, m, a, k, c2, n, false, &err) == HP_OK);
    CHECK(memcmp(c1, c2, sizeof c1) != 0);
    hp_linear_free(l1);
    hp_linear_free(l2);
    free(w);
    free(a);
    hp_linalg_destroy(ctx);
}

/* PACK_ALWAYS reorders the weights into an owned copy (oneDNN's preferred layout on this CPU differs from
 * [N, K] rows at this shape), PACK_NEVER keeps the caller's; both compute the same product. */
TEST(packing_owns_a_copy_and_matches)
{
    hp_linalg *ctx = ctx_or_die();
    hp_err err;
    const int64_t k = 65, n = 96, m = 33;
    float *w = make_w(HP_DT_F32, n, k), *a = make_f(m * k, 0.113, 1.0);
    float *c1 = malloc((size_t)(m * n) * sizeof *c1), *c2 = malloc((size_t)(m * n) * sizeof *c2);
    double *ref = malloc((size_t)(m * n) * sizeof *ref), *abs_sum = malloc((size_t)(m * n) * sizeof *abs_sum);
    hp_linear *never = NULL, *always = NULL;
    hp_linear_desc d = {.n_out = n, .n_in = k, .n_mats = G, .dtype = HP_DT_F32, .w = w, .pack = HP_LINEAR_PACK_NEVER};
    CHECK(hp_linear_init(&never, ctx, &d, &err) == HP_OK);
    d.pack = HP_LINEAR_PACK_ALWAYS;
    CHECK(hp_linear_init(&always, ctx, &d, &err) == HP_OK);
    hp_linear_info in, ia;
    if (never && always) {
        hp_linear_get_info(never, &in);
        hp_linear_get_info(always, &ia);
        CHECK(!in.packed && in.owned_bytes == 0 && in.borrowed_bytes == (size_t)(G * n * k) * 4);
        CHECK(ia.packed && ia.owned_bytes >= (size_t)(G * n * k) * 4 && ia.borrowed_bytes == 0);
        CHECK_STR_CONTAINS(ia.large_path, "weights packed");
        hp__gemm_ref(m, n, k, a, k, HP_DT_F32, mat_of(HP_DT_F32, w, 1, n, k), NULL, false, ref, abs_sum);
        CHECK(hp_linear_forward(never, 1, m, a, k, c1, n, false, &err) == HP_OK);
        CHECK(hp_linear_forward(always, 1, m, a, k, c2, n, false, &err) == HP_OK);
        CHECK(compare(m, n, c1, n, NULL, false, ref, abs_sum, EXACT_TOL) <= 1.0);
        CHECK(compare(m, n, c2, n, NULL, false, ref, abs_sum, EXACT_TOL) <= 1.0);
    }
    hp_linear_free(never);
    hp_linear_free(always);
    free(w);
    free(a);
    free(c1);
    free(c2);
    free(ref);
    free(abs_sum);
    hp_linalg_destroy(ctx);
}

/* BF16 weights stay bf16: nothing widened is kept, the caller's bytes are read. */
TEST(bf16_weights_are_borrowed_not_widened)
{
    hp_linalg *ctx = ctx_or_die();
    hp_err err;
    const int64_t k = 200, n = 96;
    void *w = make_w(HP_DT_BF16, n, k);
    hp_linear *lin = NULL;
    hp_linear_desc d = {.n_out = n, .n_in = k, .n_mats = G, .dtype = HP_DT_BF16, .w = w};
    CHECK(hp_linear_init(&lin, ctx, &d, &err) == HP_OK);
    if (lin) {
        hp_linear_info info;
        hp_linear_get_info(lin, &info);
        CHECK(info.dtype == HP_DT_BF16);
        CHECK(info.borrowed_bytes == (size_t)(G * n * k) * 2);
        CHECK(info.owned_bytes < (size_t)(G * n * k) * 2);
        CHECK(info.small_m_max == HP__SMALL_M_MAX);
        CHECK_STR_CONTAINS(info.small_path, "bf16 dot");
        CHECK_STR_CONTAINS(info.large_path, "oneDNN"); /* K = 200: below HP__UK_RULES' min K */
        printf("  bf16 linear: small rows: %s; large rows: %s\n", info.small_path, info.large_path);
    }
    hp_linear_free(lin);
    free(w);
    hp_linalg_destroy(ctx);
}

TEST(describe_names_backend_and_cpu)
{
    hp_linalg *ctx = ctx_or_die();
    char buf[512], isa[128];
    hp_linalg_describe(ctx, buf, sizeof buf);
    printf("  %s\n", buf);
    CHECK_STR_CONTAINS(buf, "oneDNN ");
    CHECK_STR_CONTAINS(buf, "(isa ");
    CHECK_STR_CONTAINS(buf, "OpenMP threads");
    hp_linalg_cpu_isa(isa, sizeof isa);
    CHECK(hp__isa_available(HP__ISA_AVX2) == (strstr(isa, "avx2") != NULL && strstr(isa, "fma") != NULL));
    char tiny[3];
    hp_linalg_cpu_isa(tiny, sizeof tiny); /* truncates, stays terminated */
    CHECK(strlen(tiny) < sizeof tiny);
    int was = hp_linalg_set_threads(0);
    CHECK(was >= 1);
    CHECK(hp_linalg_set_threads(1) == 1);
    CHECK(hp_linalg_set_threads(was) == was);
    hp_linalg_destroy(ctx);
}

TEST(bad_descriptions_are_input_errors)
{
    hp_linalg *ctx = ctx_or_die();
    hp_err err;
    float w[8] = {0};
    hp_linear *lin = NULL;
    hp_linear_desc d = {.n_out = 2, .n_in = 4, .dtype = HP_DT_I32, .w = w};
    CHECK_EQ_INT(hp_linear_init(&lin, ctx, &d, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "weight dtype I32 is not supported");
    CHECK(lin == NULL);
    d.dtype = HP_DT_F32;
    d.n_out = 0;
    CHECK_EQ_INT(hp_linear_init(&lin, ctx, &d, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "[N=0, K=4] has a dimension <= 0");
    d.n_out = 2;
    d.n_in = -3;
    CHECK_EQ_INT(hp_linear_init(&lin, ctx, &d, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "[N=2, K=-3] has a dimension <= 0");
    d.n_in = (int64_t)1 << 32;
    d.n_out = (int64_t)1 << 30;
    CHECK_EQ_INT(hp_linear_init(&lin, ctx, &d, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "overflow a 64-bit byte count");
    d.n_in = 4;
    d.n_out = 2;
    d.n_mats = -1;
    CHECK_EQ_INT(hp_linear_init(&lin, ctx, &d, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "n_mats is -1");
    d.n_mats = 1;
    d.w = (const char *)w + 2;
    CHECK_EQ_INT(hp_linear_init(&lin, ctx, &d, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "not 4-byte aligned");
    d.w = NULL;
    CHECK_EQ_INT(hp_linear_init(&lin, ctx, &d, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "weight pointer is NULL");
    CHECK_EQ_INT(hp_linear_init(&lin, ctx, NULL, &err), HP_ERR_INPUT);
    CHECK(lin == NULL);
    hp_linalg_destroy(ctx); /* no linear was left behind by the failures */
}

TEST(bad_forward_arguments_are_input_errors)
{
    hp_linalg *ctx = ctx_or_die();
    hp_err err;
    float w[3 * 2 * 4] = {0}, a[8] = {0}, c[8] = {0};
    hp_linear *lin = NULL;
    hp_linear_desc d = {.n_out = 2, .n_in = 4, .n_mats = 3, .dtype = HP_DT_F32, .w = w};
    CHECK(hp_linear_init(&lin, ctx, &d, &err) == HP_OK);
    if (lin) {
        CHECK_EQ_INT(hp_linear_forward(lin, 3, 1, a, 4, c, 2, false, &err), HP_ERR_INPUT);
        CHECK_STR_CONTAINS(err.msg, "group 0 asks for matrix 3 of a stack of 3");
        CHECK_EQ_INT(hp_linear_forward(lin, 0, -1, a, 4, c, 2, false, &err), HP_ERR_INPUT);
        CHECK_STR_CONTAINS(err.msg, "group 0 has -1 rows");
        CHECK_EQ_INT(hp_linear_forward(lin, 0, 2, a, 3, c, 2, false, &err), HP_ERR_INPUT);
        CHECK_STR_CONTAINS(err.msg, "they must be at least K = 4 and N = 2");
        CHECK_EQ_INT(hp_linear_forward(lin, 0, 2, a, 4, c, 1, false, &err), HP_ERR_INPUT);
        CHECK_STR_CONTAINS(err.msg, "ldc 1");
        CHECK_EQ_INT(hp_linear_forward(lin, 0, 1, NULL, 4, c, 2, false, &err), HP_ERR_INPUT);
        CHECK_STR_CONTAINS(err.msg, "a NULL A");
        hp_linear_group g[2] = {{.mat = 0, .m = 1, .a = a, .lda = 4, .c = c, .ldc = 2},
                                {.mat = 1, .m = 1, .a = a, .lda = 4, .c = NULL, .ldc = 2}};
        CHECK_EQ_INT(hp_linear_forward_grouped(lin, g, 2, false, &err), HP_ERR_INPUT);
        CHECK_STR_CONTAINS(err.msg, "group 1 has 1 rows but a NULL C");
        CHECK_EQ_INT(hp_linear_forward_grouped(lin, g, -1, false, &err), HP_ERR_INPUT);
        if (!hp__isa_available(HP__ISA_AVX512)) {
            CHECK_EQ_INT(hp__linear_force(lin, HP__ISA_AVX512, 16, &err), HP_ERR_INPUT);
            CHECK_STR_CONTAINS(err.msg, "cannot run the avx512f kernel");
        }
    }
    hp_linear_free(lin);
    hp_linalg_destroy(ctx);
}

/* ---- the blocked AVX-512 kernel (ukernel.c) ---- */

typedef struct uk_variant {
    const char *name;
    hp_dtype dt;
    hp_linalg_mode mode;
    hp__uk_kind kind;
    int dot; /* hp__bf16_dot_force: BF16 mode on vdpbf16ps (1) or widened to f32 FMA (2); 0 in EXACT mode */
} uk_variant;

static const uk_variant UK_VARIANTS[] = {
    {"f32 W, exact", HP_DT_F32, HP_LINALG_EXACT, HP__UK_F32, 0},
    {"bf16 W, exact", HP_DT_BF16, HP_LINALG_EXACT, HP__UK_WIDEN, 0},
    {"bf16 W, bf16 mode", HP_DT_BF16, HP_LINALG_BF16, HP__UK_BF16, 1},
    {"f32 W, bf16 mode", HP_DT_F32, HP_LINALG_BF16, HP__UK_BF16, 1},
    {"bf16 W, bf16 mode widened", HP_DT_BF16, HP_LINALG_BF16, HP__UK_WIDEN, 2},
    {"f32 W, bf16 mode widened", HP_DT_F32, HP_LINALG_BF16, HP__UK_WIDEN, 2},
};
enum { N_UK_VARIANTS = sizeof UK_VARIANTS / sizeof UK_VARIANTS[0] };

/* Whether v runs on this CPU; if so, BF16 mode's path is set to v's for the linears made next (uk_end resets it). */
static bool uk_runs(const uk_variant *v)
{
    hp__bf16_dot_force(v->dot);
    if (hp__uk_available(v->kind)) return true;
    printf("  skipped: no avx512f/avx512bw%s on this CPU: the blocked kernel's %s variant does not run here\n",
           v->kind == HP__UK_BF16 ? "/avx512_bf16" : "", v->name);
    return false;
}

/* A linear whose every row count (1 included) goes through the blocked kernel's loop nest `how`. */
static hp_linear *uk_linear_as(hp_linalg *ctx, const hp_linear_desc *d, hp__force how)
{
    hp_err err;
    hp_linear *lin = NULL;
    hp_status st = hp_linear_init(&lin, ctx, d, &err);
    CHECK_MSG(st == HP_OK, "%s", err.msg);
    if (st != HP_OK) return NULL;
    CHECK(hp__linear_force(lin, hp__isa_best(), 0, &err) == HP_OK);
    CHECK_MSG(hp__linear_force_large(lin, how, &err) == HP_OK, "%s", err.msg);
    hp_linear_info info;
    hp_linear_get_info(lin, &info);
    CHECK_STR_CONTAINS(info.large_path, "hyperpar avx512");
    CHECK_STR_CONTAINS(info.large_path, how == HP__FORCE_PACK_A ? "W read in place" : "packed per call");
    return lin;
}

static hp_linear *uk_linear(hp_linalg *ctx, const hp_linear_desc *d)
{
    return uk_linear_as(ctx, d, HP__FORCE_PACK_W);
}

/* Every edge of the loop nests against the reference: M across the 6-row tiles, the 16- and 32-row tiles (A
 * packed) and the 192-row blocks, N across the 12-column tiles, 16-column vectors and 64-column panels, K across
 * the 16-word transposes and the 1024-element k blocks (odd K: the zero pad of the last bf16 pair), padded lda and
 * ldc, accumulate, bias, the last matrix of a stack. A representative cross product: every (K, N) pair, three row
 * counts each, the options varying with the pair; both loop nests. Under the sanitizers (TEST_SANITIZED) each
 * variant takes every other K, the variants alternating, so that each pair still runs in two of them. */
TEST(blocked_kernel_every_edge_against_reference)
{
    static const int64_t ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
                                 31, 32, 33, 127, 128, 129, 300};
    static const int64_t ns[] = {1, 15, 16, 17, 63, 64, 65, 100, 1000};
    static const int64_t ks[] = {1, 2, 3, 15, 16, 17, 255, 256, 257, 1000, 1025, 2100};
    enum { NM = sizeof ms / sizeof ms[0], NN = sizeof ns / sizeof ns[0], NK = sizeof ks / sizeof ks[0] };
    hp_linalg *ctx = ctx_or_die();
    hp_err err;
    int before = hp__failed_checks;
    for (int vi = 0; vi < N_UK_VARIANTS; vi++) {
        const uk_variant *v = &UK_VARIANTS[vi];
        if (!uk_runs(v)) continue;
        for (int ki = 0; ki < NK; ki++)
            for (int ni = 0; ni < NN; ni++) {
                if (TEST_SANITIZED && (ki + vi) % 2) continue; /* idx's parity still varies with ni: pad too */
                int idx = ki * NN + ni + vi;
                int64_t k = ks[ki], n = ns[ni], mat = G - 1;
                bool pad = idx % 2, acc = idx / 2 % 2, with_bias = idx / 4 % 2;
                int64_t lda = k + (pad ? 3 : 0), ldc = n + (pad ? 5 : 0), m3[3], mmax = 0;
                for (int t = 0; t < 3; t++) {
                    m3[t] = ms[(idx * 7 + 9 * t) % NM];
                    int64_t cap = n * k > 500000 ? 33 : n * k > 50000 ? 129 : 300; /* the reference's time */
                    if (m3[t] > cap) m3[t] = cap;
                    if (m3[t] > mmax) mmax = m3[t];
                }
                void *w = make_w(v->dt, n, k);
                float *bias = with_bias ? make_f(G * n, 0.37, 0.25) : NULL;
                hp_linear_desc d = {.n_out = n, .n_in = k, .n_mats = G, .dtype = v->dt, .w = w, .bias = bias,
                                    .mode = v->mode};
                hp_linear *lin = uk_linear(ctx, &d);
                float *a = make_f(mmax * lda, 0.113, 1.0), *c = malloc((size_t)(mmax * ldc) * sizeof *c);
                float *c0 = malloc((size_t)(mmax * ldc) * sizeof *c0);
                double *ref = malloc((size_t)(mmax * n) * sizeof *ref), *abs_sum = malloc((size_t)(mmax * n) * 8);
                double *ref_r = malloc((size_t)(mmax * n) * sizeof *ref_r);
                const void *wm = mat_of(v->dt, w, mat, n, k);
                const float *bm = bias ? bias + mat * n : NULL;
                hp__gemm_ref(mmax, n, k, a, lda, v->dt, wm, bm, false, ref, abs_sum);
                bool b16 = v->mode == HP_LINALG_BF16;
                if (b16) hp__gemm_ref(mmax, n, k, a, lda, v->dt, wm, bm, true, ref_r, NULL);
                for (int t = 0; lin && t < 6; t++) {
                    int64_t m = m3[t % 3];
                    if (t == 3) CHECK(hp__linear_force_large(lin, HP__FORCE_PACK_A, &err) == HP_OK);
                    for (int64_t i = 0; i < mmax * ldc; i++) c0[i] = c[i] = val(i, 0.29, 2.0);
                    CHECK_MSG(hp_linear_forward(lin, mat, m, a, lda, c, ldc, acc, &err) == HP_OK, "%s", err.msg);
                    /* an F32 weight in BF16 mode is rounded too: two roundings of at most 2^-8 relative each */
                    double tol = !b16 ? EXACT_TOL : v->dt == HP_DT_F32 ? 2.0 * BF16_TOL : BF16_TOL;
                    double e = compare(m, n, c, ldc, c0, acc, ref, abs_sum, tol);
                    double er = b16 ? compare(m, n, c, ldc, c0, acc, ref_r, abs_sum, EXACT_TOL) : 0;
                    bool untouched = true;
                    for (int64_t r = 0; r < mmax; r++)
                        for (int64_t j = 0; j < ldc; j++)
                            if ((r >= m || j >= n) && c[r * ldc + j] != c0[r * ldc + j]) untouched = false;
                    CHECK_MSG(e <= 1.0 && er <= 1.0 && untouched,
                              "blocked kernel, %s, %s, bias %d, M=%lld K=%lld N=%lld lda=%lld ldc=%lld accumulate "
                              "%d: error %.3g and %.3g of the bound, outside C untouched %d",
                              v->name, t < 3 ? "W packed" : "A packed", with_bias, (long long)m, (long long)k, (long long)n, (long long)lda,
                              (long long)ldc, acc, e, er, untouched);
                }
                hp_linear_free(lin);
                free(w);
                free(bias);
                free(a);
                free(c);
                free(c0);
                free(ref);
                free(abs_sum);
                free(ref_r);
                if (hp__failed_checks - before > 20) goto out;
            }
    }
out:
    hp__bf16_dot_force(0);
    hp_linalg_destroy(ctx);
}

/* The kernel's invariant: each C element sums its k terms in an order fixed by K alone. Rows split over calls,
 * columns split over two linears (the halves of W's rows, not at a panel boundary), 1, 2 or 3 threads: byte-equal
 * to one call; and a bf16 weight in EXACT mode byte-equal to its f32 widening. K = 2100 spans several k blocks
 * in every variant; N = 200 ends in a partial panel. */
static void run_uk_invariant(hp_linalg *ctx, const uk_variant *v, bool acc)
{
    const int64_t m = 300, n = 200, k = 2100, half = 100, mat = 1, lda = k + 1, ldc = n + 2;
    const int64_t cuts[] = {0, 1, 8, 140, 197, 300};
    hp_err err;
    void *w = make_w(v->dt, n, k);
    float *bias = make_f(G * n, 0.37, 0.25);
    float *a = make_f(m * lda, 0.071, 1.0), *c0 = make_f(m * ldc, 0.3, 1.0);
    size_t cb = (size_t)(m * ldc) * sizeof(float);
    float *c1 = malloc(cb), *c = malloc(cb);
    hp_linear_desc d = {.n_out = n, .n_in = k, .n_mats = G, .dtype = v->dt, .w = w, .bias = bias, .mode = v->mode};
    hp_linear *lin = uk_linear(ctx, &d);
    int was = hp_linalg_set_threads(0);
    memcpy(c1, c0, cb);
    if (lin) CHECK(hp_linear_forward(lin, mat, m, a, lda, c1, ldc, acc, &err) == HP_OK);
    /* rows over several calls */
    memcpy(c, c0, cb);
    for (size_t i = 0; lin && i + 1 < sizeof cuts / sizeof cuts[0]; i++)
        CHECK(hp_linear_forward(lin, mat, cuts[i + 1] - cuts[i], a + cuts[i] * lda, lda, c + cuts[i] * ldc, ldc, acc,
                                &err) == HP_OK);
    CHECK_MSG(memcmp(c, c1, cb) == 0, "%s, accumulate %d: rows split over calls differ", v->name, acc);
    /* thread counts */
    for (int th = 1; lin && th <= 3; th++) {
        hp_linalg_set_threads(th);
        memcpy(c, c0, cb);
        CHECK(hp_linear_forward(lin, mat, m, a, lda, c, ldc, acc, &err) == HP_OK);
        CHECK_MSG(memcmp(c, c1, cb) == 0, "%s, accumulate %d: %d threads differ", v->name, acc, th);
    }
    hp_linalg_set_threads(was);
    /* columns: two linears on W's row halves (a stack's matrices are [n, k] apart, so one matrix each) */
    size_t es = (size_t)hp_dtype_bits(v->dt) / 8;
    for (int h = 0; lin && h < 2; h++) {
        int64_t j0 = h ? half : 0, nn = h ? n - half : half;
        hp_linear_desc dh = {.n_out = nn, .n_in = k, .n_mats = 1, .dtype = v->dt,
                             .w = (const char *)mat_of(v->dt, w, mat, n, k) + (size_t)(j0 * k) * es,
                             .bias = bias + mat * n + j0, .mode = v->mode};
        hp_linear *lh = uk_linear(ctx, &dh);
        memcpy(c, c0, cb);
        if (lh) CHECK(hp_linear_forward(lh, 0, m, a, lda, c + j0, ldc, acc, &err) == HP_OK);
        bool same = true;
        for (int64_t r = 0; r < m; r++)
            if (memcmp(c + r * ldc + j0, c1 + r * ldc + j0, (size_t)nn * sizeof *c) != 0) same = false;
        CHECK_MSG(same, "%s, accumulate %d: columns %lld.. as a linear of their own differ", v->name, acc,
                  (long long)j0);
        hp_linear_free(lh);
    }
    /* a bf16 weight in EXACT mode (or BF16 mode widened) equals its f32 widening */
    if (v->kind == HP__UK_WIDEN && v->dt == HP_DT_BF16) {
        float *wf = malloc((size_t)(G * n * k) * sizeof *wf);
        hp_dtype_to_f32(HP_DT_BF16, w, wf, G * n * k, NULL);
        hp_linear_desc df = d;
        df.dtype = HP_DT_F32;
        df.w = wf;
        hp_linear *lf = uk_linear(ctx, &df);
        memcpy(c, c0, cb);
        if (lf) CHECK(hp_linear_forward(lf, mat, m, a, lda, c, ldc, acc, &err) == HP_OK);
        CHECK_MSG(memcmp(c, c1, cb) == 0, "accumulate %d: a bf16 weight differs from its f32 widening", acc);
        hp_linear_free(lf);
        free(wf);
    }
    hp_linear_free(lin);
    free(w);
    free(bias);
    free(a);
    free(c0);
    free(c1);
    free(c);
}

TEST(blocked_kernel_sums_in_an_order_fixed_by_k)
{
    int was = hp_linalg_set_threads(0);
    hp_linalg_set_threads(3); /* the context's scratch is sized for the threads at init */
    hp_linalg *ctx = ctx_or_die();
    for (int vi = 0; vi < N_UK_VARIANTS; vi++)
        if (uk_runs(&UK_VARIANTS[vi]))
            for (int acc = 0; acc < 2; acc++) run_uk_invariant(ctx, &UK_VARIANTS[vi], acc);
    hp__bf16_dot_force(0);
    hp_linalg_destroy(ctx);
    hp_linalg_set_threads(was);
}

/* The two loop nests (W packed; A packed, W read in place) give the same bytes: every (M, N, K) of the cross
 * product below, in each variant, with padded strides, accumulate and bias varying with the shape; then many
 * groups in one grouped call, and 1 against 2 threads. Under the sanitizers (TEST_SANITIZED: the kernel at -O0
 * takes minutes there) each (K, N) pair runs every fourth M, the offset turning with the pair so that every M
 * still meets every K and every N, with accumulate alternating instead of both; the grouped calls stay whole. */
TEST(blocked_kernel_nests_are_byte_equal)
{
    static const int64_t ms[] = {1, 2, 15, 16, 17, 31, 32, 33, 64, 100, 128, 129};
    static const int64_t ns[] = {1, 11, 12, 13, 16, 64, 65, 100, 1536};
    static const int64_t ks[] = {1, 2, 3, 17, 768, 1023, 1024, 1025, 2048};
    enum { NM = sizeof ms / sizeof ms[0], NN = sizeof ns / sizeof ns[0], NK = sizeof ks / sizeof ks[0] };
    int was = hp_linalg_set_threads(0);
    hp_linalg_set_threads(2); /* the context's scratch is sized for the threads at init */
    hp_linalg *ctx = ctx_or_die();
    hp_err err;
    int before = hp__failed_checks;
    for (int vi = 0; vi < N_UK_VARIANTS; vi++) {
        const uk_variant *v = &UK_VARIANTS[vi];
        if (!uk_runs(v)) continue;
        for (int ki = 0; ki < NK; ki++)
            for (int ni = 0; ni < NN; ni++) {
                int64_t k = ks[ki], n = ns[ni], mat = G - 1, mmax = ms[NM - 1];
                int idx = ki * NN + ni + vi;
                bool pad = idx % 2, with_bias = idx / 2 % 2;
                int64_t lda = k + (pad ? 7 : 0), ldc = n + (pad ? 3 : 0);
                void *w = make_w(v->dt, n, k);
                float *bias = with_bias ? make_f(G * n, 0.37, 0.25) : NULL;
                hp_linear_desc d = {.n_out = n, .n_in = k, .n_mats = G, .dtype = v->dt, .w = w, .bias = bias,
                                    .mode = v->mode};
                hp_linear *lin = uk_linear(ctx, &d);
                size_t cb = (size_t)(mmax * ldc) * sizeof(float);
                float *a = make_f(mmax * lda, 0.113, 1.0), *c0 = make_f(mmax * ldc, 0.29, 2.0);
                float *cw = malloc(cb), *ca = malloc(cb);
                for (int mi = 0; lin && mi < NM; mi++)
                    for (int acc = 0; acc < 2; acc++) {
                        if (TEST_SANITIZED && ((mi + 5 * ki + 3 * ni + vi) % 4 || (mi / 4 + ki + ni) % 2 != acc))
                            continue;
                        int64_t m = ms[mi];
                        memcpy(cw, c0, cb);
                        memcpy(ca, c0, cb);
                        CHECK(hp__linear_force_large(lin, HP__FORCE_PACK_W, &err) == HP_OK);
                        CHECK(hp_linear_forward(lin, mat, m, a, lda, cw, ldc, acc, &err) == HP_OK);
                        CHECK(hp__linear_force_large(lin, HP__FORCE_PACK_A, &err) == HP_OK);
                        CHECK(hp_linear_forward(lin, mat, m, a, lda, ca, ldc, acc, &err) == HP_OK);
                        CHECK_MSG(memcmp(cw, ca, cb) == 0,
                                  "%s, bias %d, M=%lld N=%lld K=%lld lda=%lld ldc=%lld accumulate %d: the nests differ",
                                  v->name, with_bias, (long long)m, (long long)n, (long long)k, (long long)lda,
                                  (long long)ldc, acc);
                    }
                hp_linear_free(lin);
                free(w);
                free(bias);
                free(a);
                free(c0);
                free(cw);
                free(ca);
                if (hp__failed_checks - before > 20) goto out;
            }
        /* many groups in one call (every matrix, 0..129 rows: the small ones take the blocked kernel too), A packed on 1 and 2 threads, W packed on 2 */
        enum { NG = 60 };
        const int64_t n = 100, k = 1100;
        int64_t gm[NG], off[NG], total = 0;
        for (int i = 0; i < NG; i++) {
            gm[i] = (i * 37) % 130; /* 0..129 */
            off[i] = total;
            total += gm[i];
        }
        void *w = make_w(v->dt, n, k);
        float *bias = make_f(G * n, 0.37, 0.25), *a = make_f(total * k, 0.043, 1.0), *c0 = make_f(total * n, 0.3, 1.0);
        size_t cb = (size_t)(total * n) * sizeof(float);
        float *c[3] = {malloc(cb), malloc(cb), malloc(cb)};
        hp_linear_desc d = {.n_out = n, .n_in = k, .n_mats = G, .dtype = v->dt, .w = w, .bias = bias,
                            .mode = v->mode};
        hp_linear *lin = uk_linear(ctx, &d);
        for (int acc = 0; lin && acc < 2; acc++) {
            for (int run = 0; run < 3; run++) { /* A packed on 2 threads, on 1, W packed on 2 */
                hp_linear_group g[NG];
                for (int i = 0; i < NG; i++)
                    g[i] = (hp_linear_group){.mat = (i * 7) % G, .m = gm[i], .a = a + off[i] * k, .lda = k,
                                             .c = c[run] + off[i] * n, .ldc = n};
                memcpy(c[run], c0, cb);
                hp_linalg_set_threads(run == 1 ? 1 : 2);
                CHECK(hp__linear_force_large(lin, run < 2 ? HP__FORCE_PACK_A : HP__FORCE_PACK_W, &err) == HP_OK);
                CHECK_MSG(hp_linear_forward_grouped(lin, g, NG, acc, &err) == HP_OK, "%s", err.msg);
            }
            CHECK_MSG(memcmp(c[0], c[1], cb) == 0, "%s, accumulate %d: A packed, 1 and 2 threads differ", v->name,
                      acc);
            CHECK_MSG(memcmp(c[0], c[2], cb) == 0, "%s, accumulate %d: grouped, the nests differ", v->name, acc);
        }
        hp_linalg_set_threads(2);
        hp_linear_free(lin);
        free(w);
        free(bias);
        free(a);
        free(c0);
        for (int i = 0; i < 3; i++) free(c[i]);
    }
out:
    hp__bf16_dot_force(0);
    hp_linalg_destroy(ctx);
    hp_linalg_set_threads(was);
}

/* Many groups of 17..200 rows (and some of the streaming kernel's 0..16) on the default paths, one grouped call:
 * byte-equal to one hp_linear_forward per group. K = 1100 (at least the min K of HP__UK_RULES): a bf16 weight in
 * EXACT mode runs its groups of 128 rows and more on the blocked kernel and the others on oneDNN, BF16 mode its
 * groups of 17..64 rows on the A-packed nest, 65..128 on the W-packed one and the others on oneDNN, in the same
 * call (the blocked kernel's groups checked); then every variant again with the blocked kernel forced (every
 * group). */
TEST(blocked_kernel_grouped_equals_per_group_calls)
{
    enum { NG = 41 };
    const int64_t n = 150, k = 1100;
    hp_linalg *ctx = ctx_or_die();
    hp_err err;
    int64_t gm[NG], off[NG], total = 0;
    for (int i = 0; i < NG; i++) {
        gm[i] = i % 5 == 4 ? i % 17 : 17 + (i * 37) % 184; /* 17..200, every fifth 0..16 */
        off[i] = total;
        total += gm[i];
    }
    for (int vi = 0; vi < N_UK_VARIANTS; vi++) {
        const uk_variant *v = &UK_VARIANTS[vi];
        if (!uk_runs(v)) continue;
        void *w = make_w(v->dt, n, k);
        float *bias = make_f(G * n, 0.37, 0.25), *a = make_f(total * k, 0.043, 1.0), *c0 = make_f(total * n, 0.3, 1.0);
        float *c = malloc((size_t)(total * n) * sizeof *c), *c1 = malloc((size_t)(total * n) * sizeof *c1);
        hp_linear_desc d = {.n_out = n, .n_in = k, .n_mats = G, .dtype = v->dt, .w = w, .bias = bias,
                            .mode = v->mode};
        hp_linear *lin = NULL;
        CHECK_MSG(hp_linear_init(&lin, ctx, &d, &err) == HP_OK, "%s", err.msg);
        if (lin && v->kind != HP__UK_F32) {
            hp_linear_info info;
            hp_linear_get_info(lin, &info);
            if (v->kind == HP__UK_WIDEN) CHECK_STR_CONTAINS(info.large_path, "at >= 128 rows; otherwise: oneDNN");
            else CHECK_STR_CONTAINS(info.large_path, "W read in place at 17..64 rows; ");
            if (v->kind == HP__UK_BF16) CHECK_STR_CONTAINS(info.large_path, "per call at 65..128 rows; otherwise: oneDNN");
        }
        hp_linear_group g[NG];
        for (int acc = 0; lin && acc < 4; acc++) {
            if (acc == 2) CHECK(hp__linear_force_large(lin, true, &err) == HP_OK);
            memcpy(c, c0, (size_t)(total * n) * sizeof *c);
            memcpy(c1, c0, (size_t)(total * n) * sizeof *c1);
            for (int i = 0; i < NG; i++) {
                g[i] = (hp_linear_group){.mat = (i * 7) % G, .m = gm[i], .a = a + off[i] * k, .lda = k,
                                         .c = c + off[i] * n, .ldc = n};
                CHECK(hp_linear_forward(lin, g[i].mat, gm[i], g[i].a, k, c1 + off[i] * n, n, acc % 2, &err) ==
                      HP_OK);
            }
            CHECK_MSG(hp_linear_forward_grouped(lin, g, NG, acc % 2, &err) == HP_OK, "%s", err.msg);
            for (int i = 0; i < NG; i++)
                /* by default only WIDEN's groups of 128 rows and more and BF16's of 17..128 run the blocked
                 * kernel (both nests); oneDNN's groups equal their own calls only up to summation order */
                CHECK_MSG((acc < 2 && !(v->kind == HP__UK_WIDEN && gm[i] >= 128) &&
                           !(v->kind == HP__UK_BF16 && gm[i] > 16 && gm[i] <= 128)) ||
                              memcmp(c + off[i] * n, c1 + off[i] * n, (size_t)(gm[i] * n) * sizeof *c) == 0,
                          "%s, accumulate %d, forced %d: group %d (M=%lld) differs from its own call", v->name,
                          acc % 2, acc / 2, i, (long long)gm[i]);
        }
        hp_linear_free(lin);
        free(w);
        free(bias);
        free(a);
        free(c0);
        free(c);
        free(c1);
    }
    hp__bf16_dot_force(0);
    hp_linalg_destroy(ctx);
}

/* Where f32 FMA outruns vdpbf16ps (hp__bf16_dot_native false), BF16 mode is "A rounded to bf16, then the EXACT
 * path": byte-equal to an EXACT-mode linear on A rounded first, at every row count (the streaming kernel, both
 * nests of the blocked kernel, oneDNN on widened blocks), for a bf16 weight and for an f32 weight (rounded at
 * init, as an EXACT linear on its bf16 rounding). And the plain products (hp_linalg_gemm) equal an f32 product of
 * both operands rounded, whatever their transposes. Forced, so that it runs on every host. */
TEST(bf16_mode_widened_is_the_exact_path_on_rounded_operands)
{
    static const int64_t ms[] = {1, 16, 17, 40, 64, 65, 100, 127, 128, 300, 600};
    const int64_t n = 150, k = 1100, mmax = 600;
    hp_linalg *ctx = ctx_or_die();
    hp_err err;
    hp__bf16_dot_force(2);
    float *a = make_f(mmax * k, 0.043, 1.0), *ar = malloc((size_t)(mmax * k) * sizeof *ar);
    float *c1 = malloc((size_t)(mmax * n) * sizeof *c1), *c2 = malloc((size_t)(mmax * n) * sizeof *c2);
    hp_linalg_round_rows_bf16(mmax, k, a, k, ar);
    for (int dt = 0; dt < 2; dt++) {
        hp_dtype wdt = dt ? HP_DT_F32 : HP_DT_BF16;
        void *w = make_w(wdt, n, k);
        uint16_t *w16 = malloc((size_t)(G * n * k) * sizeof *w16); /* the f32 weight's rounding */
        if (dt) {
            float *r = malloc((size_t)(G * n * k) * sizeof *r);
            hp_linalg_round_rows_bf16(G * n, k, w, k, r);
            for (int64_t i = 0; i < G * n * k; i++) {
                uint32_t u;
                memcpy(&u, &r[i], sizeof u);
                w16[i] = (uint16_t)(u >> 16);
            }
            free(r);
        }
        float *bias = make_f(G * n, 0.37, 0.25);
        hp_linear_desc db = {.n_out = n, .n_in = k, .n_mats = G, .dtype = wdt, .w = w, .bias = bias,
                             .mode = HP_LINALG_BF16};
        hp_linear_desc de = {.n_out = n, .n_in = k, .n_mats = G, .dtype = HP_DT_BF16, .w = dt ? (void *)w16 : w,
                             .bias = bias, .mode = HP_LINALG_EXACT};
        hp_linear *lb = NULL, *le = NULL;
        CHECK_MSG(hp_linear_init(&lb, ctx, &db, &err) == HP_OK, "%s", err.msg);
        CHECK_MSG(hp_linear_init(&le, ctx, &de, &err) == HP_OK, "%s", err.msg);
        if (lb) {
            hp_linear_info info;
            hp_linear_get_info(lb, &info);
            CHECK_STR_CONTAINS(info.large_path, "A rounded to bf16");
            CHECK_MSG(!strstr(info.large_path, "vdpbf16ps") && !strstr(info.large_path, "bf16 x bf16"),
                      "widened BF16 mode still names a bf16 product: %s", info.large_path);
        }
        for (size_t mi = 0; lb && le && mi < sizeof ms / sizeof ms[0]; mi++)
            for (int acc = 0; acc < 2; acc++) {
                int64_t m = ms[mi];
                for (int64_t i = 0; i < m * n; i++) c1[i] = c2[i] = val(i, 0.29, 2.0);
                CHECK(hp_linear_forward(lb, 1, m, a, k, c1, n, acc, &err) == HP_OK);
                CHECK(hp_linear_forward(le, 1, m, ar, k, c2, n, acc, &err) == HP_OK);
                CHECK_MSG(memcmp(c1, c2, (size_t)(m * n) * sizeof *c1) == 0,
                          "%s W, M=%lld, accumulate %d: widened BF16 mode differs from EXACT on rounded A",
                          dt ? "f32" : "bf16", (long long)m, acc);
            }
        hp_linear_free(lb);
        hp_linear_free(le);
        free(w);
        free(w16);
        free(bias);
    }
    /* the plain products: C = 0.5·op(A)·op(B) + 0.25·C on operands rounded by hand */
    const int64_t pm = 300, pn = 70, pk = 260;
    float *pa = make_f(pm * pk, 0.031, 1.0), *pb = make_f(pk * pn, 0.057, 1.0);
    float *ra = malloc((size_t)(pm * pk) * sizeof *ra), *rb = malloc((size_t)(pk * pn) * sizeof *rb);
    for (int t = 0; t < 4; t++) {
        bool ta = t & 1, tb = t & 2;
        int64_t ar_ = ta ? pk : pm, ac = ta ? pm : pk, br = tb ? pn : pk, bc = tb ? pk : pn;
        hp_linalg_round_rows_bf16(ar_, ac, pa, ac, ra);
        hp_linalg_round_rows_bf16(br, bc, pb, bc, rb);
        for (int64_t i = 0; i < pm * pn; i++) c1[i] = c2[i] = val(i, 0.21, 1.0);
        CHECK(hp_linalg_gemm(HP_LINALG_BF16, ta, tb, pm, pn, pk, 0.5f, pa, ac, pb, bc, 0.25f, c1, pn, &err) == HP_OK);
        CHECK(hp_linalg_gemm(HP_LINALG_EXACT, ta, tb, pm, pn, pk, 0.5f, ra, ac, rb, bc, 0.25f, c2, pn, &err) == HP_OK);
        CHECK_MSG(memcmp(c1, c2, (size_t)(pm * pn) * sizeof *c1) == 0,
                  "hp_linalg_gemm trans %d%d: widened BF16 mode differs from the f32 product of rounded operands",
                  ta, tb);
    }
    hp__bf16_dot_force(0);
    free(pa), free(pb), free(ra), free(rb), free(a), free(ar), free(c1), free(c2);
    hp_linalg_destroy(ctx);
}

TEST_MAIN()
