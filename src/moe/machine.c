/*
 * machine.c — threads and the same-run reference figures benchmarks compare against. Absolute numbers on a
 * shared machine are noise; ratios to these are the figures benchmarks print.
 *
 *   dense   one dense gate/up + down product with the FLOPs of a MoE layer's experts, through the GEMM layer
 *           in the layer's weight dtype and compute mode: what the layer's backend reaches on these shapes
 *           without the split into experts (the compute limit of `bench moe`)
 *   read    a read-only sweep, every OpenMP thread summing its share of a buffer larger than the caches:
 *           what reading weights from memory can reach (the memory limit of decode)
 *   sgemm   one big square f32 product through the GEMM layer (an older, shape-free yardstick)
 *   memcpy  memcpy bandwidth (moves every byte twice: not the yardstick for reading weights)
 *
 * Nothing here calls a BLAS: every product goes through hyperpar/linalg.h.
 */
#include "moe/moe_internal.h"
#include "hyperpar/comm.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

double hp_moe_ref_gemm_gflops(int64_t n, hp_linalg_mode mode, int reps)
{
    return hp_moe_ref_gemm_run(n, mode, reps, NULL, 0);
}

double hp_moe_ref_gemm_run(int64_t n, hp_linalg_mode mode, int reps, char *impl, size_t cap)
{
    if (impl && cap) impl[0] = '\0';
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
    hp_linear_desc d = {.n_out = n, .n_in = n, .n_mats = 1, .dtype = HP_DT_F32, .w = b, .mode = mode};
    if (a && b && c && hp_linalg_create(&la, &err) == HP_OK && hp_linear_init(&lin, la, &d, &err) == HP_OK) {
        for (size_t i = 0; i < sz; i++) {
            a[i] = (float)((i * 7) % 13) * 0.01f;
            b[i] = (float)((i * 5) % 11) * 0.01f;
        }
        for (int r = 0; r < reps + 1; r++) { /* the first run warms the threads and caches up */
            double t0 = hp_comm_wtime();
            if (hp_linear_forward(lin, 0, n, a, n, c, n, false, &err) != HP_OK) break;
            double g = 2.0 * (double)n * (double)n * (double)n / (hp_comm_wtime() - t0) * 1e-9;
            if (r > 0 && g > best) best = g;
        }
        hp_linear_info li;
        hp_linear_get_info(lin, &li);
        const char *uk = hp_linear_blocked_path(lin, n);
        if (impl && cap && best > 0) /* hyperpar's blocked kernel, the fixed-shape primitive, or the large path */
            snprintf(impl, cap, "%s%s", uk || !li.fixed_impl ? "" : "oneDNN ",
                     uk ? uk : li.fixed_impl ? li.fixed_impl : li.large_path);
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
            double t0 = hp_comm_wtime();
            /* Every OpenMP thread copies its share, as the layer reads weights with every thread. */
#pragma omp parallel
            {
                size_t nt = (size_t)omp_get_num_threads(), id = (size_t)omp_get_thread_num();
                size_t lo = nbytes / nt * id, hi = id + 1 == nt ? nbytes : nbytes / nt * (id + 1);
                memcpy(b + lo, a + lo, hi - lo);
            }
            /* Bytes read per second: the figure compared with expert bytes read by the layer. */
            double g = (double)nbytes / (hp_comm_wtime() - t0) * 1e-9;
            if (r > 0 && g > best) best = g;
            a[(size_t)r % nbytes] ^= b[((size_t)r * 31) % nbytes]; /* keep the copies observable */
        }
    }
    free(a);
    free(b);
    return best;
}

/* The same-run compute limit. The weights are patterned, not random: the time of a dense product does not
 * depend on the values, and these keep every sum far from overflow and from subnormals. */
double hp_moe_ref_dense_gflops(int64_t m, int64_t n_hidden, int64_t d_inner, hp_dtype dtype, hp_linalg_mode mode,
                               int reps, char *path, size_t cap)
{
    if (path && cap) snprintf(path, cap, "none");
    int64_t H = n_hidden, I = d_inner;
    size_t n_a, n_c1, n_c2, n_w1, n_w2, n_w, b_a, b_c1, b_c2, b_w;
    if (m < 1 || H < 1 || I < 1 || I > INT32_MAX / 2 || (dtype != HP_DT_F32 && dtype != HP_DT_BF16) ||
        !hp_mul_size((size_t)m, (size_t)H, &n_a) || !hp_mul_size((size_t)m, (size_t)(2 * I), &n_c1) ||
        !hp_mul_size((size_t)m, (size_t)H, &n_c2) || !hp_mul_size((size_t)(2 * I), (size_t)H, &n_w1) ||
        !hp_mul_size((size_t)H, (size_t)I, &n_w2) || !hp_add_size(n_w1, n_w2, &n_w) ||
        !hp_mul_size(n_a, sizeof(float), &b_a) || !hp_mul_size(n_c1, sizeof(float), &b_c1) ||
        !hp_mul_size(n_c2, sizeof(float), &b_c2) || !hp_mul_size(n_w, sizeof(float), &b_w))
        return -1.0;
    float *a = malloc(b_a), *c1 = malloc(b_c1), *c2 = malloc(b_c2), *w32 = malloc(b_w);
    uint16_t *w16 = dtype == HP_DT_BF16 ? malloc(n_w * sizeof(uint16_t)) : NULL;
    hp_linalg *la = NULL;
    hp_linear *gate_up = NULL, *down = NULL;
    hp_err err;
    double best = -1.0;
    if (reps < 1) reps = 1;
    bool ok = a && c1 && c2 && w32 && (dtype == HP_DT_F32 || w16);
    if (ok) {
        for (size_t i = 0; i < n_a; i++) a[i] = (float)((i * 7) % 13) * 0.01f;
        for (size_t i = 0; i < n_w; i++) w32[i] = (float)((i * 5) % 11) * 0.001f;
        ok = dtype == HP_DT_F32 || hp_dtype_from_f32(HP_DT_BF16, w32, w16, (int64_t)n_w, &err) == HP_OK;
    }
    const char *w = dtype == HP_DT_BF16 ? (const char *)w16 : (const char *)w32;
    size_t el = dtype == HP_DT_BF16 ? sizeof(uint16_t) : sizeof(float);
    hp_linear_desc d1 = {.n_out = 2 * I, .n_in = H, .n_mats = 1, .dtype = dtype, .w = w, .mode = mode,
                         .pack = HP_LINEAR_PACK_AUTO};
    hp_linear_desc d2 = {.n_out = H, .n_in = I, .n_mats = 1, .dtype = dtype, .w = w ? w + n_w1 * el : NULL,
                         .mode = mode, .pack = HP_LINEAR_PACK_AUTO};
    if (ok && hp_linalg_create(&la, &err) == HP_OK && hp_linear_init(&gate_up, la, &d1, &err) == HP_OK &&
        hp_linear_init(&down, la, &d2, &err) == HP_OK) {
        if (path && cap) {
            hp_linear_info info;
            hp_linear_get_info(gate_up, &info);
            snprintf(path, cap, "%s", m <= info.small_m_max ? info.small_path : info.large_path);
        }
        double flops = 6.0 * (double)m * (double)H * (double)I;
        for (int r = 0; r < reps + 1; r++) { /* the first run warms the threads and caches up */
            double t0 = hp_comm_wtime();
            /* The down product reads the first I columns of the gate/up result, at its row stride 2I, as the
             * layer reads its activations. */
            if (hp_linear_forward(gate_up, 0, m, a, H, c1, 2 * I, false, &err) != HP_OK ||
                hp_linear_forward(down, 0, m, c1, 2 * I, c2, H, false, &err) != HP_OK) {
                best = -1.0;
                break;
            }
            double g = flops / (hp_comm_wtime() - t0) * 1e-9;
            if (r > 0 && g > best) best = g;
        }
    }
    hp_linear_free(gate_up);
    hp_linear_free(down);
    hp_linalg_destroy(la);
    free(a);
    free(c1);
    free(c2);
    free(w32);
    free(w16);
    return best;
}

/* Every thread sums its share 16 floats at a time in 4-lane vectors (GCC/Clang vector extension, SSE on any
 * x86-64) whose adds do not depend on each other: one dependent chain of float adds would measure the adder,
 * not memory. The sum goes to a volatile, so it is not dropped. */
typedef float v4f __attribute__((vector_size(16)));
double hp_moe_ref_read_gbps(size_t nbytes, int reps)
{
    size_t n = nbytes / sizeof(float);
    if (n == 0) return -1.0;
    float *x = malloc(n * sizeof *x);
    if (!x) return -1.0;
    for (size_t i = 0; i < n; i++) x[i] = (float)(i % 7); /* also faults every page in before timing */
    double best = -1.0;
    if (reps < 1) reps = 1;
    volatile float sink = 0.0f;
    for (int r = 0; r < reps + 1; r++) {
        double t0 = hp_comm_wtime();
        float total = 0.0f;
        const size_t nb = n / 16;
#pragma omp parallel for reduction(+ : total) schedule(static)
        for (size_t b = 0; b < nb; b++) { /* four independent 4-lane sums: the adds keep up with memory */
            v4f acc[4];
            memcpy(acc, x + 16 * b, sizeof acc);
            v4f t = (acc[0] + acc[1]) + (acc[2] + acc[3]);
            total += (t[0] + t[1]) + (t[2] + t[3]);
        }
        for (size_t i = 16 * nb; i < n; i++) total += x[i];
        double g = (double)(n * sizeof *x) / (hp_comm_wtime() - t0) * 1e-9;
        sink += total;
        if (r > 0 && g > best) best = g;
    }
    (void)sink;
    free(x);
    return best;
}
