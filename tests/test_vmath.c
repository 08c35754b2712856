/*
 * test_vmath.c — src/kernels/vmath.c: the vector exp against glibc's exp and expf, and the two row functions
 * built on it (the loss's Σ exp(z − max), SwiGLU's silu(g)·u) against plain loops, on every instruction set
 * this CPU has (AVX-512F, AVX2+FMA, portable).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "hyperpar/linalg.h"
#include "kernels/linalg_int.h"
#include "testlib.h"

/* |a − b| in units of b's last place (the spacing of the format at b). */
static double ulps64(double a, double b) { return fabs(a - b) / (nextafter(fabs(b), INFINITY) - fabs(b)); }
static double ulps32(float a, float b) { return fabs((double)a - (double)b) / (double)(nextafterf(fabsf(b), INFINITY) - fabsf(b)); }

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double uniform(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) * 0x1p-53;
}

TEST(exp_f64_within_2_ulp_of_glibc)
{
    double worst = 0, at = 0;
    for (int i = 0; i < 200000; i++) {
        double x = -708.0 + uniform() * (709.0 + 708.0);
        if (i < 2000) x = -1.0 + i * 0.001; /* near 0, where most of the loss's terms are */
        double u = ulps64(hp__exp_f64_ref(x), exp(x));
        if (u > worst) worst = u, at = x;
    }
    CHECK_MSG(worst <= 2.0, "exp_f64: %.2f ulp at x = %.17g", worst, at);
    CHECK(hp__exp_f64_ref(0.0) == 1.0);
    CHECK(isnan(hp__exp_f64_ref(NAN)));
    CHECK(hp__exp_f64_ref(-INFINITY) < 1e-300 && hp__exp_f64_ref(-INFINITY) >= 0);
}

TEST(exp_f32_within_2_ulp_of_glibc)
{
    double worst = 0, at = 0;
    for (int i = 0; i < 200000; i++) {
        float x = (float)(-87.0 + uniform() * (88.0 + 87.0));
        double u = ulps32(hp__exp_f32_ref(x), expf(x));
        if (u > worst) worst = u, at = x;
    }
    CHECK_MSG(worst <= 2.0, "exp_f32: %.2f ulp at x = %.9g", worst, at);
    CHECK(hp__exp_f32_ref(0.0f) == 1.0f);
    CHECK(isnan(hp__exp_f32_ref(NAN)));
}

static const int64_t lens[] = {1, 7, 15, 16, 17, 63, 1000, 32001};

static void rows_on(hp__isa isa)
{
    hp__vmath_force(isa);
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
        int64_t n = lens[li];
        float *z = malloc((size_t)n * sizeof *z), *u = malloc((size_t)n * sizeof *u), *o = malloc((size_t)n * sizeof *o);
        float mx = -INFINITY;
        for (int64_t i = 0; i < n; i++) {
            z[i] = (float)((uniform() - 0.5) * 40.0);
            u[i] = (float)(uniform() - 0.5);
            mx = z[i] > mx ? z[i] : mx;
        }
        if (n > 100) z[0] = 100.0f; /* one dominant term */
        if (z[0] > mx) mx = z[0];
        double want = 0;
        for (int64_t i = 0; i < n; i++) want += exp((double)z[i] - (double)mx);
        double got = hp_linalg_sumexp(z, n, mx);
        CHECK_MSG(fabs(got - want) <= 1e-14 * want, "%s n %lld: sumexp %.17g, want %.17g", hp__isa_name(isa),
                  (long long)n, got, want);
        hp_linalg_silu_mul(z, u, n, o);
        double worst = 0;
        for (int64_t i = 0; i < n; i++) {
            double w = (double)z[i] / (1.0 + exp(-(double)z[i])) * (double)u[i];
            double e = fabs((double)o[i] - w) / (fabs(w) + 1e-30);
            worst = e > worst ? e : worst;
        }
        CHECK_MSG(worst <= 4e-7, "%s n %lld: silu·u relative error %.3g", hp__isa_name(isa), (long long)n, worst);
        /* in place, as SwiGLU may call it */
        hp_linalg_silu_mul(z, u, n, z);
        CHECK(z[n - 1] == o[n - 1]);
        free(z), free(u), free(o);
    }
    float g[4] = {NAN, 1e4f, -1e4f, 0.0f}, uu[4] = {1, 1, 1, 1}, out[4];
    hp_linalg_silu_mul(g, uu, 4, out);
    CHECK_MSG(isnan(out[0]) && out[1] == 1e4f && fabsf(out[2]) < 1e-30f && out[3] == 0.0f,
              "%s: silu(NaN, 1e4, -1e4, 0) = %g %g %g %g", hp__isa_name(isa), out[0], out[1], out[2], out[3]);
    float zn[3] = {1.0f, NAN, 0.0f};
    CHECK(isnan(hp_linalg_sumexp(zn, 3, 1.0f)));
}

TEST(rows_on_every_instruction_set)
{
    for (int isa = 0; isa < HP__ISA_COUNT; isa++)
        if (hp__isa_available((hp__isa)isa)) rows_on((hp__isa)isa);
    hp__vmath_force(hp__isa_best());
}

TEST_MAIN()
