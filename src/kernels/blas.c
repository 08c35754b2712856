/*
 * blas.c — what hyperpar still asks of OpenBLAS, kept here so that src/kernels is the only place that calls a
 * BLAS: the router's f64 product (top-k must not flip with the row count or the summation order, so routing
 * sums in f64 as the golden reference does; it is E·H per token, a small share of a layer's work), OpenBLAS's
 * thread count, the fallback of the plain products should oneDNN's sgemm refuse one (hp__blas_sgemm; gemm_dnnl.c
 * runs them), and the description benchmarks print, with a warning when OpenBLAS runs its generic kernels on a CPU
 * that has AVX2 or AVX-512 (Debian 12's 0.3.21 does not know every recent CPU).
 */
#include "kernels/linalg_int.h"

#include <cblas.h>
#include <stdio.h>
#include <string.h>

void hp_linalg_dgemm_nt(int64_t m, int64_t n, int64_t k, const double *a, int64_t lda, const double *b, int64_t ldb,
                        double *c, int64_t ldc)
{
    if (m <= 0 || n <= 0) return;
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)n, (int)k, 1.0, a, (int)lda, b, (int)ldb, 0.0,
                c, (int)ldc);
}

void hp__blas_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                    int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (int)m,
                (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

int hp_linalg_blas_threads(int n)
{
    if (n > 0) openblas_set_num_threads(n);
    return openblas_get_num_threads();
}

/* OpenBLAS core names of its portable, non-vector-tuned kernels. */
static bool generic_core(const char *core)
{
    static const char *const generic[] = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Katmai",
                                          "Coppermine", "Northwood", "Banias", "Atom", "Generic", "Opteron",
                                          "Barcelona", "Athlon"};
    for (size_t i = 0; i < sizeof generic / sizeof *generic; i++)
        if (!strcmp(core, generic[i])) return true;
    return false;
}

const char *hp_linalg_blas_describe(char *buf, size_t cap, bool *generic_fallback)
{
    const char *core = openblas_get_corename();
    char isa[128];
    hp_linalg_cpu_isa(isa, sizeof isa);
    bool vec = strstr(isa, "avx2") || strstr(isa, "avx512f");
    bool fallback = core && generic_core(core) && vec;
    if (generic_fallback) *generic_fallback = fallback;
    snprintf(buf, cap, "OpenBLAS %s kernels (%s, %d threads)%s", core ? core : "?", openblas_get_config(),
             openblas_get_num_threads(),
             fallback ? "; WARNING: a generic fallback kernel on a CPU with AVX2/AVX-512 (this OpenBLAS does not "
                        "know the CPU); its figures are far below what the machine can do"
                      : "");
    return buf;
}
