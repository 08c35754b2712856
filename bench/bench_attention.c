/*
 * bench_attention.c — the fused attention kernel (hp__attention, src/kernels/attention.c) alone on random q, k and v:
 *
 *   bench_attention S NH NKV HD [exact|bf16] [WINDOW] [REPS]
 *
 * one batch row of S tokens, causal (and windowed when WINDOW > 0), on OMP_NUM_THREADS threads. Prints the best of
 * REPS calls in wall time and in this process's CPU time, and the useful FLOPs per CPU second: 4·NH·HD per visible
 * (query, key) pair (q·kᵀ and P·v), 1.5 times that in BF16 mode (its second q·kᵀ pass). CPU time is the figure to
 * compare on a shared machine: it does not count the time other jobs hold the cores.
 */
#include "kernels/modules.h"

#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int64_t arg(const char *s, const char *what, int64_t lo, int64_t hi)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "bench_attention: %s must be an integer in [%lld, %lld], not '%s'\n", what, (long long)lo,
                (long long)hi, s);
        exit(2);
    }
    return (int64_t)v;
}

int main(int argc, char **argv)
{
    if (argc < 5 || argc > 8) {
        fprintf(stderr, "usage: bench_attention S NH NKV HD [exact|bf16] [WINDOW] [REPS]\n");
        return 2;
    }
    int64_t S = arg(argv[1], "S", 1, 1 << 20), nh = arg(argv[2], "NH", 1, 1024), nkv = arg(argv[3], "NKV", 1, nh);
    int64_t hd = arg(argv[4], "HD", 1, 1024);
    if (nh % nkv) {
        fprintf(stderr, "bench_attention: NH (%lld) must be a multiple of NKV (%lld)\n", (long long)nh, (long long)nkv);
        return 2;
    }
    bool bf = false;
    if (argc > 5 && strcmp(argv[5], "exact") && !(bf = !strcmp(argv[5], "bf16"))) {
        fprintf(stderr, "bench_attention: mode must be exact or bf16, not '%s'\n", argv[5]);
        return 2;
    }
    int64_t win = argc > 6 ? arg(argv[6], "WINDOW", 0, S) : 0;
    int reps = argc > 7 ? (int)arg(argv[7], "REPS", 1, 1000) : 1;
    size_t nq = (size_t)(S * nh * hd), nk = (size_t)(S * nkv * hd);
    float *q = malloc(nq * sizeof *q), *k = malloc(nk * sizeof *k), *v = malloc(nk * sizeof *v);
    float *o = malloc(nq * sizeof *o);
    if (!q || !k || !v || !o) {
        fprintf(stderr, "bench_attention: out of memory for q, k, v and out (%zu bytes)\n",
                (2 * nq + 2 * nk) * sizeof(float));
        return 2;
    }
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < nq + 2 * nk; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        float r = (float)(x >> 40) / (float)(1 << 24) - 0.5f;
        if (i < nq) q[i] = r;
        else if (i < nq + nk) k[i - nq] = r;
        else v[i - nq - nk] = r;
    }
    hp__attn_args a = {.B = 1, .sq = S, .sk = S, .nh = nh, .nkv = nkv, .hd = hd, .q = q, .k = k, .v = v,
                       .window = win, .out = o, .mode = bf ? HP_LINALG_BF16 : HP_LINALG_EXACT};
    double wall = 1e30, cpu = 1e30;
    for (int r = 0; r < reps; r++) {
        hp_err err;
        double w0 = omp_get_wtime(), c0 = cpu_s();
        if (hp__attention(&a, &err) != HP_OK) {
            fprintf(stderr, "bench_attention: %s\n", err.msg);
            return 1;
        }
        double c = cpu_s() - c0, w = omp_get_wtime() - w0;
        cpu = c < cpu ? c : cpu;
        wall = w < wall ? w : wall;
    }
    double Sd = (double)S, W = (double)win;
    double pairs = win > 0 && win < S ? Sd * W - W * (W - 1) / 2 : Sd * (Sd + 1) / 2;
    double flops = 4.0 * (double)(nh * hd) * pairs * (bf ? 1.5 : 1.0);
    printf("S %lld, heads %lld / kv %lld x %lld, %s, window %lld, %d thread%s: best of %d %.3f s wall, %.3f s cpu "
           "-> %.1f GFLOP/s per cpu second\n",
           (long long)S, (long long)nh, (long long)nkv, (long long)hd, bf ? "bf16" : "exact", (long long)win,
           omp_get_max_threads(), omp_get_max_threads() == 1 ? "" : "s", reps, wall, cpu, flops / cpu / 1e9);
    free(q), free(k), free(v), free(o);
    return 0;
}
