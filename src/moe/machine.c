/*
 * machine.c — threads and the same-run reference figures benchmarks compare against: the GFLOP/s of one
 * big square f32 product through the GEMM layer (what its backend reaches on this machine at best) and memcpy bandwidth (what streaming
 * weights from memory can reach at best). Absolute numbers on a shared machine are noise; ratios to these
 * are the figures benchmarks print.
 */
#include "moe/moe_internal.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int hp_moe_set_threads(int n)
{
    if (n > 0) hp_linalg_set_threads(n);
    return hp_linalg_blas_threads(n);
}

const char *hp_moe_blas_info(char *buf, size_t cap)
{
    char dnnl[256], blas[512];
    snprintf(buf, cap, "%s; router: %s", hp_linalg_describe(NULL, dnnl, sizeof dnnl),
             hp_linalg_blas_describe(blas, sizeof blas, NULL));
    return buf;
}

double hp_moe_ref_sgemm_gflops(int64_t n, int reps)
{
    /* n·n floats must be a valid size; otherwise there is no figure. The product runs through the GEMM layer:
     * the same backend, and so the same limit, as the layer's own products. */
    size_t sz, bytes;
    if (n < 1 || n > INT32_MAX || !hp_mul_size((size_t)n, (size_t)n, &sz) || !hp_mul_size(sz, sizeof(float), &bytes))
        return -1.0;
    float *a = malloc(bytes), *b = malloc(bytes), *c = malloc(bytes);
    hp_linalg *la = NULL;
    hp_linear *lin = NULL;
    hp_err err;
    double best = -1.0;
    hp_linear_desc d = {.n_out = n, .n_in = n, .n_mats = 1, .dtype = HP_DT_F32, .w = b};
    if (a && b && c && hp_linalg_create(&la, &err) == HP_OK && hp_linear_init(&lin, la, &d, &err) == HP_OK) {
        for (size_t i = 0; i < sz; i++) {
            a[i] = (float)((i * 7) % 13) * 0.01f;
            b[i] = (float)((i * 5) % 11) * 0.01f;
        }
        for (int r = 0; r < reps + 1; r++) { /* the first run warms the threads and caches up */
            double t0 = now_s();
            if (hp_linear_forward(lin, 0, n, a, n, c, n, false, &err) != HP_OK) break;
            double g = 2.0 * (double)n * (double)n * (double)n / (now_s() - t0) * 1e-9;
            if (r > 0 && g > best) best = g;
        }
    }
    hp_linear_free(lin);
    hp_linalg_destroy(la);
    free(a);
    free(b);
    free(c);
    return best;
}

double hp_moe_ref_memcpy_gbps(size_t nbytes, int reps)
{
    if (nbytes == 0) return -1.0; /* nothing to copy: no figure (and the loop below indexes modulo nbytes) */
    char *a = malloc(nbytes), *b = malloc(nbytes);
    double best = -1.0;
    if (a && b) {
        memset(a, 1, nbytes);
        memset(b, 2, nbytes);
        for (int r = 0; r < reps + 1; r++) {
            double t0 = now_s();
            /* Every OpenMP thread copies its share, as the layer reads weights with every thread. */
#pragma omp parallel
            {
                size_t nt = (size_t)omp_get_num_threads(), id = (size_t)omp_get_thread_num();
                size_t lo = nbytes / nt * id, hi = id + 1 == nt ? nbytes : nbytes / nt * (id + 1);
                memcpy(b + lo, a + lo, hi - lo);
            }
            /* Bytes read per second: the figure compared with expert bytes read by the layer. */
            double g = (double)nbytes / (now_s() - t0) * 1e-9;
            if (r > 0 && g > best) best = g;
            a[(size_t)r % nbytes] ^= b[((size_t)r * 31) % nbytes]; /* keep the copies observable */
        }
    }
    free(a);
    free(b);
    return best;
}
