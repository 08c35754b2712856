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
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
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

/* ---- which instruction BF16 mode multiplies with ----
 *
 * vdpbf16ps does twice the work of an f32 FMA per instruction, but not every core issues it as often: the 2-core
 * AMD EPYC (Zen 4) runs it at 2.0x the FMA's flops, the 2-core Intel Xeon (family 6 model 207, no AMX exposed) at
 * 0.49x (docs/kernels.md). Where it is slower, BF16 mode's products run as f32 FMA on the bf16 operands widened
 * exactly (a product of two bf16 values is exact in f32, so only the summation order differs). The choice is made
 * once per process (pthread_once), by timing both loops on the calling thread in its own CPU time (a thread that is
 * preempted or descheduled does not count the time it waits): the best of TRIES interleaved runs of DOT_ITERS
 * iterations each (a fraction of a millisecond), with the threshold at equal flops, halfway (in ratio) between the
 * measured 2x and 0.5x. A CPU with AMX tiles keeps its bf16 paths (oneDNN's brgemm runs the tiles), as one
 * without avx512_bf16 keeps its own (oneDNN decides). */
enum { DOT_ITERS = 1 << 17, TRIES = 5 };

static float run_loop(peak_kind k, long n);

static pthread_once_t g_dot_once = PTHREAD_ONCE_INIT;
static bool g_dot_native = true; /* written once, under g_dot_once */
static double g_dot_ratio;       /* vdpbf16ps flops / FMA flops as measured (0: not measured) */
static _Atomic int g_force;      /* hp__bf16_dot_force: 0 measure, 1 native, 2 widened */

static double thread_seconds(peak_kind k)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    volatile float sink = run_loop(k, DOT_ITERS);
    (void)sink;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    return (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
}

static void measure_dot(void)
{
    hp__cpu cpu;
    hp__cpu_detect(&cpu);
    if (!cpu.avx512f || !cpu.avx512_bf16 || (cpu.amx_bf16 && cpu.amx_tile)) return;
    double tb = 0, tf = 0;
    for (int t = 0; t < TRIES; t++) {
        double b = thread_seconds(PEAK_BF16), f = thread_seconds(PEAK_AVX512);
        if (t == 0 || b < tb) tb = b;
        if (t == 0 || f < tf) tf = f;
    }
    /* per iteration: ACC x 64 flops (vdpbf16ps) against ACC x 32 (FMA) */
    g_dot_ratio = tb > 0 ? 2.0 * tf / tb : 0.0;
    g_dot_native = tb <= 0 || g_dot_ratio >= 1.0;
}

bool hp__bf16_dot_native(void)
{
    int f = atomic_load_explicit(&g_force, memory_order_relaxed);
    if (f) return f == 1;
    pthread_once(&g_dot_once, measure_dot);
    return g_dot_native;
}

void hp__bf16_dot_force(int how)
{
    atomic_store_explicit(&g_force, how, memory_order_relaxed);
}

const char *hp_linalg_bf16_products(char *buf, size_t cap)
{
    bool native = hp__bf16_dot_native();
    hp__cpu cpu;
    hp__cpu_detect(&cpu);
    if (atomic_load_explicit(&g_force, memory_order_relaxed))
        snprintf(buf, cap, "%s (forced)", native ? "bf16 instructions" : "f32 FMA on widened bf16");
    else if (g_dot_ratio > 0)
        snprintf(buf, cap, "%s (vdpbf16ps measured at %.2f of the f32 FMA rate)",
                 native ? "vdpbf16ps" : "f32 FMA on widened bf16", g_dot_ratio);
    else
        snprintf(buf, cap, "%s", cpu.amx_bf16 && cpu.amx_tile ? "AMX tiles (oneDNN) and vdpbf16ps"
                                 : cpu.avx512_bf16           ? "vdpbf16ps"
                                                              : "oneDNN's bf16 where it has one, else f32 FMA");
    return buf;
}

static peak_kind kind_of(hp_linalg_mode mode)
{
    hp__cpu cpu;
    hp__cpu_detect(&cpu);
    if (mode == HP_LINALG_BF16 && cpu.avx512f && cpu.avx512_bf16 && hp__bf16_dot_native()) return PEAK_BF16;
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
