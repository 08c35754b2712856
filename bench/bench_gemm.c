/*
 * bench_gemm.c — the GEMM layer (src/kernels, oneDNN + the bf16 streaming kernel) against OpenBLAS's
 * cblas_sgemm on the same shapes, in the same run, and against a read-only memory sweep.
 *
 * Shapes: M ∈ {1, 16, 128, 512} rows × (N=768, K=2048) and (N=2048, K=768) — a Qwen3-30B-A3B expert's
 * down and gate/up projections — with F32 and BF16 weights. Each weight set is a stack of matrices larger
 * than the last-level cache (--mib, 96 MiB by default) and each timed sweep multiplies by every matrix of
 * it once, so small M reads its weights from memory, as decode does. OpenBLAS always gets the f32 copy of
 * the weights (what hyperpar does with a bf16 checkpoint today: widen at load, then sgemm; sgemv at M=1).
 *
 * Printed per row: GFLOP/s of the layer, of OpenBLAS, their ratio, and for the layer the weight bytes read
 * per second as a fraction of the read-only bandwidth measured in the same run.
 *
 * Then the large products, hyperpar's blocked AVX-512 kernel (ukernel.c) against oneDNN in the same run (both
 * through the layer, switched with hp__linear_force_large): 2048³; llama-3-8b's projections at M = 512 (q/o
 * 4096×4096, k/v 1024×4096, gate and up 14336×4096 each: the runner keeps them separate, down 4096×14336, the
 * 32000-row head); and a grouped call of 16 Qwen3-30B-A3B experts (gate/up 1536×2048, down 2048×768) with 32 or
 * 128 rows each. Each in three numerics: f32 W; bf16 W, exact (widened); bf16 W, BF16 mode (bf16 × bf16).
 * (`hyperpar bench run` compares the two with HP_GEMM=onednn, docs/kernels.md.)
 *
 *   usage: bench_gemm [--reps R] [--threads N] [--mib MIB] [--large-only] [--only SHAPE] [--numerics 0|1|2]
 *                     [--cpu-time]
 */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hyperpar/linalg.h"
#include "hyperpar/moe.h"
#include "kernels/linalg_int.h" /* hp__linear_force: the crossover table */

/* --cpu-time: the process's CPU time instead of the wall clock (with --threads 1: less disturbed by other jobs) */
static clockid_t clock_id = CLOCK_MONOTONIC;

static double now(void)
{
    struct timespec ts;
    clock_gettime(clock_id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what, const hp_err *err)
{
    fprintf(stderr, "bench_gemm: %s: %s\n", what, err->msg);
    exit(1);
}

typedef struct shape {
    int64_t n, k;
} shape;

/* The large products: blocked kernel vs oneDNN, same linear, same run. */
/* only: run the shapes whose name contains it (NULL: all); mode_only: that numerics alone (-1: all three). */
static void large_table(hp_linalg *ctx, int reps, const char *only, int mode_only)
{
    typedef struct big {
        const char *name;
        int64_t m, n, k, groups; /* groups > 1: a grouped call of that many experts, m rows each */
    } big;
    const big shapes[] = {
        {"2048^3", 2048, 2048, 2048, 1},          {"llama q/o", 512, 4096, 4096, 1},
        {"llama k/v", 512, 1024, 4096, 1},        {"llama gate, up", 512, 14336, 4096, 1},
        {"llama down", 512, 4096, 14336, 1},      {"llama head", 512, 32000, 4096, 1},
        {"qwen3 gate/up x16", 16, 1536, 2048, 16}, {"qwen3 gate/up x16", 32, 1536, 2048, 16},
        {"qwen3 gate/up x16", 64, 1536, 2048, 16}, {"qwen3 gate/up x16", 96, 1536, 2048, 16},
        {"qwen3 gate/up x16", 128, 1536, 2048, 16}, {"qwen3 down x16", 16, 2048, 768, 16},
        {"qwen3 down x16", 32, 2048, 768, 16},     {"qwen3 down x16", 64, 2048, 768, 16},
        {"qwen3 down x16", 128, 2048, 768, 16},    {"llama q/o", 64, 4096, 4096, 1},
        {"llama gate, up", 64, 14336, 4096, 1},    {"llama q/o", 128, 4096, 4096, 1},
        {"llama q/o", 32, 4096, 4096, 1},          {"llama down", 32, 4096, 14336, 1},
        {"llama down", 64, 4096, 14336, 1},        {"mixtral down x8", 32, 4096, 14336, 8},
    };
    const char *modes[] = {"f32", "bf16 W exact", "bf16 mode"};
    hp_err err;
    printf("\nlarge products, GFLOP/s (best of %d): hyperpar blocked kernel (W packed; A packed, W in place) vs "
           "oneDNN, through the layer\n", reps);
    printf("%-18s %5s %6s %6s %-13s %9s %9s %9s %6s %6s\n", "shape", "M", "N", "K", "numerics", "W packed",
           "A packed", "oneDNN", "W/dnn", "A/dnn");
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const big *b = &shapes[si];
        if (only && !strstr(b->name, only)) continue;
        int64_t nk = b->n * b->k, ma = b->m * b->groups;
        float *w32 = malloc((size_t)(b->groups * nk) * sizeof *w32);
        uint16_t *w16 = malloc((size_t)(b->groups * nk) * sizeof *w16);
        float *a = malloc((size_t)(ma * b->k) * sizeof *a), *c = malloc((size_t)(ma * b->n) * sizeof *c);
        if (!w32 || !w16 || !a || !c) {
            fprintf(stderr, "bench_gemm: out of memory\n");
            exit(1);
        }
        for (int64_t i = 0; i < b->groups * nk; i++) {
            w32[i] = (float)((i * 7) % 13) * 0.01f - 0.06f;
            w16[i] = hp__bf16_from_f32(w32[i]);
        }
        for (int64_t i = 0; i < ma * b->k; i++) a[i] = (float)(i % 17) * 0.03f - 0.2f;
        hp_linear_group g[16];
        for (int64_t e = 0; e < b->groups; e++)
            g[e] = (hp_linear_group){.mat = e, .m = b->m, .a = a + e * b->m * b->k, .lda = b->k,
                                     .c = c + e * b->m * b->n, .ldc = b->n};
        for (int mode = 0; mode < 3; mode++) {
            if (mode_only >= 0 && mode != mode_only) continue;
            hp_linear_desc d = {.n_out = b->n, .n_in = b->k, .n_mats = b->groups,
                                .dtype = mode ? HP_DT_BF16 : HP_DT_F32, .w = mode ? (const void *)w16 : w32,
                                .mode = mode == 2 ? HP_LINALG_BF16 : HP_LINALG_EXACT};
            hp_linear *lin = NULL;
            if (hp_linear_init(&lin, ctx, &d, &err) != HP_OK) die("linear", &err);
            /* the streaming kernel off: at 16 rows too, the large paths are compared */
            if (hp__linear_force(lin, hp__isa_best(), 0, &err) != HP_OK) die("force", &err);
            double gf[3] = {0, 0, 0}; /* W packed, oneDNN, A packed (hp__force 1, 0, 2) */
            for (int impl = 0; impl < 3; impl++) {
                hp__force how = impl == 0 ? HP__FORCE_PACK_W : impl == 1 ? HP__FORCE_ONEDNN : HP__FORCE_PACK_A;
                if (hp__linear_force_large(lin, how, &err) != HP_OK) continue; /* no AVX-512: oneDNN only */
                double best = 1e30;
                for (int r = 0; r < reps + 1; r++) {
                    double t0 = now();
                    if (hp_linear_forward_grouped(lin, g, b->groups, false, &err) != HP_OK) die("forward", &err);
                    double t = now() - t0;
                    if (r > 0 && t < best) best = t;
                }
                gf[impl] = 2.0 * (double)ma * (double)nk / best * 1e-9;
            }
            printf("%-18s %5lld %6lld %6lld %-13s %9.1f %9.1f %9.1f %6.2f %6.2f\n", b->name, (long long)b->m,
                   (long long)b->n, (long long)b->k, modes[mode], gf[0], gf[2], gf[1], gf[1] > 0 ? gf[0] / gf[1] : 0.0,
                   gf[1] > 0 ? gf[2] / gf[1] : 0.0);
            fflush(stdout);
            hp_linear_free(lin);
        }
        free(w32);
        free(w16);
        free(a);
        free(c);
    }
}

int main(int argc, char **argv)
{
    int reps = 5, threads = 0, mode_only = -1;
    bool large_only = false;
    const char *only = NULL;
    double mib = 96.0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--mib") && i + 1 < argc) mib = atof(argv[++i]);
        else if (!strcmp(argv[i], "--large-only")) large_only = true;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--cpu-time")) clock_id = CLOCK_PROCESS_CPUTIME_ID;
        else if (!strcmp(argv[i], "--numerics") && i + 1 < argc) mode_only = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_gemm [--reps R] [--threads N] [--mib MIB] [--large-only] [--only SHAPE]\n"
                            "                  [--numerics 0|1|2] [--cpu-time]\n"
                            "  (--only: the large products whose name contains SHAPE, e.g. qwen3; --numerics: f32 W,\n"
                            "  bf16 W exact or bf16 mode alone; --cpu-time: the process's CPU time, for --threads 1;\n"
                            "  the large-products table switches between the blocked kernel's two loop nests and\n"
                            "  oneDNN itself;\n"
                            "  HP_GEMM=onednn|hyperpar, read by the layer, changes the default of the other "
                            "tables)\n");
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    if (threads > 0) {
        hp_linalg_set_threads(threads);
        openblas_set_num_threads(threads);
    }
    hp_err err;
    hp_linalg *ctx = NULL;
    if (hp_linalg_create(&ctx, &err) != HP_OK) die("context", &err);
    char desc[512], isa[128];
    printf("layer:    %s\n", hp_linalg_describe(ctx, desc, sizeof desc));
    printf("cpu isa:  %s\n", hp_linalg_cpu_isa(isa, sizeof isa)[0] ? isa : "(no avx2)");
    printf("OpenBLAS: %s, core %s, %d threads\n", openblas_get_config(), openblas_get_corename(),
           openblas_get_num_threads());
    if (large_only) {
        large_table(ctx, reps, only, mode_only);
        hp_linalg_destroy(ctx);
        return 0;
    }
    double bw = hp_moe_ref_read_gbps((size_t)(mib * 2 * 1048576.0), reps); /* the library's read sweep */
    printf("read-only sweep over %.0f MiB: %.1f GB/s\n", mib * 2, bw);
    printf("weights: stacks of %.0f MiB per set (swept once per timing), best of %d sweeps\n\n", mib, reps);
    printf("%-5s %-11s %5s %10s %10s %7s %9s %6s  %s\n", "W", "N x K", "M", "layer", "OpenBLAS", "ratio",
           "W GB/s", "of bw", "layer path");

    const shape shapes[] = {{768, 2048}, {2048, 768}};
    const int64_t Ms[] = {1, 16, 128, 512};
    for (size_t si = 0; si < 2; si++) {
        int64_t n = shapes[si].n, k = shapes[si].k;
        int64_t g32 = (int64_t)(mib * 1048576.0 / (double)(n * k * 4)) + 1, g16 = 2 * g32;
        size_t n32 = (size_t)(g32 * n * k), n16 = (size_t)(g16 * n * k);
        float *w32 = malloc(n32 * sizeof *w32);
        uint16_t *w16 = malloc(n16 * sizeof *w16);
        float *w16f = malloc(n16 * sizeof *w16f); /* the f32 copy OpenBLAS gets for the bf16 set */
        float *a = malloc((size_t)(512 * k) * sizeof *a), *c = malloc((size_t)(512 * n) * sizeof *c);
        if (!w32 || !w16 || !w16f || !a || !c) {
            fprintf(stderr, "bench_gemm: out of memory\n");
            return 1;
        }
        for (size_t i = 0; i < n32; i++) w32[i] = (float)((i * 7) % 13) * 0.01f - 0.06f;
        for (size_t i = 0; i < n16; i++) {
            w16f[i] = (float)((i * 5) % 11) * 0.01f - 0.05f;
            uint32_t u;
            memcpy(&u, &w16f[i], 4);
            w16[i] = (uint16_t)(u >> 16);
            u &= 0xffff0000u;
            memcpy(&w16f[i], &u, 4);
        }
        for (int64_t i = 0; i < 512 * k; i++) a[i] = (float)(i % 17) * 0.03f - 0.2f;
        /* Where the streaming kernel stops paying: bf16 weights at small M, kernel vs widen + oneDNN. */
        {
            hp_linear_desc d = {.n_out = n, .n_in = k, .n_mats = g16, .dtype = HP_DT_BF16, .w = w16};
            hp_linear *lin = NULL;
            if (hp_linear_init(&lin, ctx, &d, &err) != HP_OK) die("linear", &err);
            printf("BF16  %lldx%lld crossover, GFLOP/s: M     kernel  widen+oneDNN\n", (long long)n, (long long)k);
            const int64_t cm[] = {1, 2, 4, 8, 12, 16, 24, 32};
            for (size_t mi = 0; mi < sizeof cm / sizeof cm[0]; mi++) {
                double g[2];
                for (int path = 0; path < 2; path++) {
                    hp__linear_force(lin, hp__isa_best(), path == 0 ? INT64_MAX : 0, &err);
                    double best = 1e30;
                    for (int r = 0; r < reps + 1; r++) {
                        double t0 = now();
                        for (int64_t e = 0; e < g16; e++)
                            if (hp_linear_forward(lin, e, cm[mi], a, k, c, n, false, &err) != HP_OK)
                                die("forward", &err);
                        double t = (now() - t0) / (double)g16;
                        if (r > 0 && t < best) best = t;
                    }
                    g[path] = 2.0 * (double)(cm[mi] * n * k) / best * 1e-9;
                }
                printf("%39lld %10.1f %13.1f\n", (long long)cm[mi], g[0], g[1]);
            }
            hp_linear_free(lin);
        }
        for (int dt = 0; dt < 2; dt++) {
            bool bf16 = dt == 1;
            int64_t nm = bf16 ? g16 : g32;
            hp_linear_desc d = {.n_out = n, .n_in = k, .n_mats = nm, .dtype = bf16 ? HP_DT_BF16 : HP_DT_F32,
                                .w = bf16 ? (const void *)w16 : (const void *)w32};
            hp_linear *lin = NULL;
            if (hp_linear_init(&lin, ctx, &d, &err) != HP_OK) die("linear", &err);
            hp_linear_info info;
            hp_linear_get_info(lin, &info);
            const float *wf = bf16 ? w16f : w32;
            for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
                int64_t m = Ms[mi];
                /* Fewer matrices per sweep at large M: compute-bound there, and the cache no longer matters. */
                int64_t sweep = m >= 128 ? (nm < 4 ? nm : 4) : nm;
                double best_l = 1e30, best_b = 1e30;
                for (int r = 0; r < reps + 1; r++) {
                    double t0 = now();
                    for (int64_t e = 0; e < sweep; e++)
                        if (hp_linear_forward(lin, e, m, a, k, c, n, false, &err) != HP_OK) die("forward", &err);
                    double t = (now() - t0) / (double)sweep;
                    if (r > 0 && t < best_l) best_l = t;
                }
                for (int r = 0; r < reps + 1; r++) {
                    double t0 = now();
                    for (int64_t e = 0; e < sweep; e++) {
                        const float *we = wf + e * n * k;
                        if (m == 1)
                            cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)n, (int)k, 1.0f, we, (int)k, a, 1, 0.0f, c,
                                        1);
                        else
                            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)n, (int)k, 1.0f, a,
                                        (int)k, we, (int)k, 0.0f, c, (int)n);
                    }
                    double t = (now() - t0) / (double)sweep;
                    if (r > 0 && t < best_b) best_b = t;
                }
                double flop = 2.0 * (double)m * (double)n * (double)k, gl = flop / best_l * 1e-9,
                       gb = flop / best_b * 1e-9;
                double wgbs = (double)(n * k) * (bf16 ? 2.0 : 4.0) / best_l * 1e-9;
                char nk[32];
                snprintf(nk, sizeof nk, "%lldx%lld", (long long)n, (long long)k);
                printf("%-5s %-11s %5lld %10.1f %10.1f %7.2f %9.1f %6.2f  %s\n", bf16 ? "BF16" : "F32", nk,
                       (long long)m, gl, gb, gl / gb, wgbs, wgbs / bw,
                       m <= info.small_m_max ? info.small_path : info.large_path);
            }
            hp_linear_free(lin);
        }
        free(w32);
        free(w16);
        free(w16f);
        free(a);
        free(c);
    }
    large_table(ctx, reps, only, mode_only);
    printf("\nGFLOP/s = 2·M·N·K / time per matrix; ratio = layer / OpenBLAS (sgemv at M = 1; bf16 rows:\n"
           "OpenBLAS on the f32 copy); W GB/s = the layer's weight bytes read per second; of bw = that / the\n"
           "read-only sweep.\n");
    hp_linalg_destroy(ctx);
    return 0;
}
