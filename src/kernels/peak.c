/*
 * peak.c — the arithmetic peak of this process's threads: what no GEMM can pass, measured rather than taken
 * from a datasheet (clocks under a hypervisor, turbo and the vector units' width vary from one machine to
 * the next).
 *
 * Every OpenMP thread runs a loop of independent multiply-adds on registers only (12 accumulators, more than
 * the latency × throughput of any x86 FMA unit needs), no loads, no stores, for a fixed count of iterations;
 * the wall time of the slowest thread gives the rate of all of them together, the best of five such runs:
 *
 *   mode   instruction (best the CPU has)             flops per instruction
 *   EXACT  vfmadd231ps zmm (AVX-512F) | ymm (FMA)      32 | 16
 *   BF16   vdpbf16ps zmm (AVX512_BF16); without it,    64 (16 lanes × 2 products × 2)
 *          BF16 mode multiplies f32 values: as EXACT
 *
 * The figure is a bound for benchmarks to print next to the GEMM rates (bench run, bench moe), not a
 * promise: memory, packing and edges keep real products below it.
 */
#include "kernels/linalg_int.h"

#include <immintrin.h>
#include <omp.h>
#include <time.h>

enum { ACC = 12 };

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Each loop returns a sum of its accumulators so that the compiler keeps the work; the empty asm keeps one
 * operand unknown to it, so nothing is hoisted out of the loop. The inner loop is unrolled at every
 * optimisation level: rolled (gcc -O2), the accumulators live in memory and the loop measures store
 * forwarding, 186 for 447 GFLOP/s. */
__attribute__((target("avx512f"))) static float loop_avx512(long n)
{
    __m512 acc[ACC], x = _mm512_set1_ps(1.0001f), y = _mm512_set1_ps(0.9999f);
    for (int i = 0; i < ACC; i++) acc[i] = _mm512_setzero_ps();
    for (long i = 0; i < n; i++) {
#pragma GCC unroll 12
        for (int j = 0; j < ACC; j++) acc[j] = _mm512_fmadd_ps(x, y, acc[j]);
        __asm__ volatile("" : "+v"(x));
    }
    for (int i = 1; i < ACC; i++) acc[0] = _mm512_add_ps(acc[0], acc[i]);
    return _mm512_reduce_add_ps(acc[0]);
}

__attribute__((target("avx2,fma"))) static float loop_avx2(long n)
{
    __m256 acc[ACC], x = _mm256_set1_ps(1.0001f), y = _mm256_set1_ps(0.9999f);
    for (int i = 0; i < ACC; i++) acc[i] = _mm256_setzero_ps();
    for (long i = 0; i < n; i++) {
#pragma GCC unroll 12
        for (int j = 0; j < ACC; j++) acc[j] = _mm256_fmadd_ps(x, y, acc[j]);
        __asm__ volatile("" : "+x"(x));
    }
    for (int i = 1; i < ACC; i++) acc[0] = _mm256_add_ps(acc[0], acc[i]);
    float v[8];
    _mm256_storeu_ps(v, acc[0]);
    return v[0];
}

__attribute__((target("avx512f,avx512bf16"))) static float loop_bf16(long n)
{
    __m512 acc[ACC];
    __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), y = (__m512bh)_mm512_set1_epi32(0x3f803f81);
    for (int i = 0; i < ACC; i++) acc[i] = _mm512_setzero_ps();
    for (long i = 0; i < n; i++) {
#pragma GCC unroll 12
        for (int j = 0; j < ACC; j++) acc[j] = _mm512_dpbf16_ps(acc[j], x, y);
        __asm__ volatile("" : "+v"(x));
    }
    for (int i = 1; i < ACC; i++) acc[0] = _mm512_add_ps(acc[0], acc[i]);
    return _mm512_reduce_add_ps(acc[0]);
}

typedef enum { PEAK_NONE, PEAK_AVX2, PEAK_AVX512, PEAK_BF16 } peak_kind;

static peak_kind kind_of(hp_linalg_mode mode)
{
    hp__cpu cpu;
    hp__cpu_detect(&cpu);
    if (mode == HP_LINALG_BF16 && cpu.avx512f && cpu.avx512_bf16) return PEAK_BF16;
    if (cpu.avx512f) return PEAK_AVX512;
    if (cpu.avx2 && cpu.fma) return PEAK_AVX2;
    return PEAK_NONE;
}

static float run_loop(peak_kind k, long n)
{
    switch (k) {
    case PEAK_AVX512: return loop_avx512(n);
    case PEAK_AVX2: return loop_avx2(n);
    case PEAK_BF16: return loop_bf16(n);
    default: return 0.0f;
    }
}

const char *hp_linalg_peak_name(hp_linalg_mode mode)
{
    switch (kind_of(mode)) {
    case PEAK_AVX512: return "avx512 vfmadd231ps";
    case PEAK_AVX2: return "avx2 vfmadd231ps";
    case PEAK_BF16: return "avx512_bf16 vdpbf16ps";
    default: return "none (no avx2+fma)";
    }
}

double hp_linalg_peak_gflops(hp_linalg_mode mode, double seconds)
{
    peak_kind k = kind_of(mode);
    if (k == PEAK_NONE) return 0.0;
    double lanes = k == PEAK_AVX2 ? 8 : 16, flops_per = lanes * 2 * (k == PEAK_BF16 ? 2 : 1) * ACC;
    /* Calibrate on the calling thread: iterations that take about a tenth of the time asked for. */
    long n = 1 << 16;
    for (;;) {
        double t0 = now_s();
        volatile float sink = run_loop(k, n);
        (void)sink;
        double t = now_s() - t0;
        if (t > seconds / 10 || n > (1L << 40)) {
            n = (long)((double)n * (seconds / (t > 1e-9 ? t : 1e-9)));
            break;
        }
        n *= 4;
    }
    /* The best of TRIALS parallel runs of a fifth of the time each: a thread that the hypervisor or another
     * process preempts in one run must not lower the bound. */
    enum { TRIALS = 5 };
    n /= TRIALS;
    if (n < 1) n = 1;
    int threads = omp_get_max_threads();
    double t = 0;
    for (int trial = 0; trial < TRIALS; trial++) {
        double t0 = now_s();
        float sum = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sum)
        sum += run_loop(k, n);
        double dt = now_s() - t0;
        volatile float sink = sum;
        (void)sink;
        if (trial == 0 || dt < t) t = dt;
    }
    return t > 0 ? (double)threads * (double)n * flops_per / t * 1e-9 : 0.0;
}
