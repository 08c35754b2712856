/*
 * cmd_bench.c — `hyperpar bench moe --preset P --tokens T [...]`: one MoE layer at a real model's shapes
 * with random weights built in memory, timed, and compared with limits measured in the same run:
 *
 *   dense  one dense gate/up + down product with the layer's FLOPs (M = the routed rows) through the same
 *          GEMM layer, weight dtype and compute mode: the compute limit (prefill)
 *   read   a read-only sweep over 512 MiB, every thread summing its share: the memory limit for reading
 *          the expert weights (decode)
 *
 * It also prints which kernels ran (oneDNN's implementation, the streaming kernel's ISA, OpenBLAS's core
 * for the router, with a warning on stderr when OpenBLAS runs a generic kernel on an AVX2/AVX-512 CPU) and
 * the resident expert bytes, and times PyTorch eager on the same shapes when python imports torch
 * (bench_torch.c, bench/torch_moe.py). Benchmarks print ratios, never pass/fail.
 *
 * Memory: expert weights are resident in the generated dtype (--dtype bf16 holds bf16, as a bf16 checkpoint
 * is held; f32 stays f32). A preset whose experts exceed --max-gib (default 6) is run as one rank of an
 * expert-parallel group: the layer holds E/ep experts and the balanced router gives that rank exactly its
 * T*K/ep slots, so the compute per expert is the real one. DeepSeek-V3 (256 x 3 x 7168 x 2048 f32 = 42 GiB
 * of experts) runs as rank 0 of ep = 8 by default (ep = 4 with bf16).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_run.h"
#include "cli.h"
#include "costflags.h"
#include "hyperpar/cost.h"
#include "hyperpar/linalg.h"
#include "hyperpar/moe.h"
#include "hyperpar/overrides.h"

static const cli_opt g_opts[] = {
    {"preset", 'p', "P", "a MoE preset, listed below", 0, NULL},
    {"tokens", 'T', "T", "tokens per forward", 0, NULL},
    {"dtype", 'd', "D", "dtype the expert weights are generated and held in (f32 default; bf16 stays bf16)", 0, NULL},
    {"compute", 'X', "M", "exact (default: f32 activations, bf16 weights widened exactly, f32 sums) or bf16\n"
                          "(activations rounded to bf16 for the products, f32 sums)", 0, NULL},
    {"router", 'r', "R", "balanced (default: T*K/E slots per expert, benchmark only) or real (the\n"
                         "archetype's router on random weights)", 0, NULL},
    {"reps", 'R', "R", "timed forwards (default: as many as fit in ~2 s, 3 to 50)", 0, NULL},
    {"max-gib", 'm', "G", "expert weights allowed in memory (6); above it, run one rank of ep ranks", 0, NULL},
    {"ep", 'e', "N", "force the simulated expert-parallel group size", 0, NULL},
    {"threads", 't', "N", "OpenMP threads (oneDNN, the kernels and the MoE loop share one pool; default:\n"
                          "OMP_NUM_THREADS when set, else this process's cores divided by the ranks the\n"
                          "launcher started on this node)", 0, NULL},
    {"json", 'j', NULL, "one JSON object instead of text", 0, NULL},
    CLI_OPT_HELP,
    {0},
};

static void usage(FILE *out)
{
    fprintf(out,
            "usage: hyperpar bench moe --preset P --tokens T [--dtype bf16|f32] [--compute exact|bf16] [--json]\n"
            "                          [--threads N] [--router balanced|real] [--reps R] [--max-gib G] [--ep N]\n"
            "\n"
            "Times one MoE layer at a real model's shapes with random weights built in memory, and prints it\n"
            "next to limits measured in the same run: one dense GEMM with the layer's FLOPs through the same\n"
            "backend, dtype and compute mode (GFLOP/s), and a read-only sweep over 512 MiB (GB/s). When\n"
            "$HP_BENCH_PYTHON (default python3) can import torch, it also times PyTorch eager's sparse block of the\n"
            "preset's family (transformers' own, or a plain-torch loop over the experts) on the same shapes and\n"
            "threads, in the weights' dtype (autocast for f32 weights with --compute bf16), and prints the ratio;\n"
            "not for a simulated expert-parallel rank. HP_GEMM=onednn|hyperpar runs every large product on oneDNN,\n"
            "or on hyperpar's blocked AVX-512 kernel (docs/kernels.md).\n"
            "\n");
    cli_print_options(out, g_opts);
    fprintf(out, "\npresets:\n");
    cli_print_presets(out, true);
    fprintf(out,
            "\n"
            "hyperpar bench ep --help: the expert-parallel layer over MPI ranks against a bare all-to-all.\n"
            "hyperpar bench run --help: the runtime's whole forward pass over MPI ranks against bare collectives.\n"
            "hyperpar bench train --help: the training step over MPI ranks against the same-run GEMM rate.\n"
            "hyperpar bench advise --help: hyperpar advise's time per mesh against one plan derivation.\n");
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* xorshift64* uniform in [-a, a). */
static float urand(uint64_t *s, float a)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return a * ((float)((*s * 2685821657736338717ull) >> 40) / (float)(1ull << 23) - 1.0f);
}

/* Fills n weights with uniform values in [-a, a): f32, or (dt bf16) bf16 values held as bf16, as a bf16
 * checkpoint's experts are resident (no widened copy). */
static hp_status fill(void *dst, int64_t n, float a, uint64_t seed, hp_dtype dt, hp_err *err)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    if (dt == HP_DT_F32) {
        float *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = urand(&s, a);
        return HP_OK;
    }
    float tmp[256];
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i += 256) {
        int64_t k = n - i < 256 ? n - i : 256;
        for (int64_t j = 0; j < k; j++) tmp[j] = urand(&s, a);
        hp_status st = hp_dtype_from_f32(HP_DT_BF16, tmp, d + i, k, err);
        if (st) return st;
    }
    return HP_OK;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct bench_args {
    const cli_preset *p;
    int64_t tokens, threads, reps, ep;
    double max_gib;
    hp_dtype dtype;
    hp_linalg_mode compute;
    bool json, real_router;
} bench_args;

/* One rank's forward through the stages (ep > 1), or hp_moe_forward (ep == 1). */
static hp_status forward(const hp_moe_layer *l, hp_moe_ws *ws, const float *x, int64_t T, float *y, bool balanced,
                         hp_err *err)
{
    if (l->n_local == l->n_experts) {
        hp_moe_run_opts ro = {.balanced_router = balanced};
        return hp_moe_forward(l, ws, x, T, l->n_hidden, y, &ro, err);
    }
    int64_t K = l->top_k, H = l->n_hidden;
    hp_status st = hp_moe_route(l, ws, x, T, ws->topk_idx, ws->topk_w, err);
    if (!st && balanced) st = hp_moe_route_balance(ws->topk_idx, ws->topk_w, T, K, l->n_experts, l->n_local, err);
    if (st) return st;
    int64_t n = hp_moe_dispatch_prepare(ws->topk_idx, NULL, T, K, l->first_expert, l->n_local, ws->counts,
                                        ws->offsets, ws->row_slot, ws->slot_row);
    ws->stats.n_rows = n;
    ws->stats.n_active = 0;
    for (int64_t e = 0; e < l->n_local; e++) ws->stats.n_active += ws->counts[e] > 0;
    hp_moe_gather(x, H, K, ws->row_slot, n, ws->rows);
    if ((st = hp_moe_experts_forward(l, ws, ws->rows, ws->counts, ws->rows, err))) return st;
    hp_moe_combine(ws->rows, ws->slot_row, ws->topk_w, T, K, H, y);
    return hp_moe_shared_forward(l, ws, x, T, y, err);
}


/* A figure, or null when it was not measured (< 0). */
static void json_num(const char *key, double v)
{
    if (v < 0)
        printf(", \"%s\": null", key);
    else
        printf(", \"%s\": %.6g", key, v);
}

static double ratio(double x, double limit)
{
    return x >= 0 && limit > 0 ? x / limit : -1.0;
}

/* "0.87", or "n/a" when there is no figure. */
static const char *fmt_ratio(char *buf, size_t cap, double r)
{
    if (r < 0)
        snprintf(buf, cap, "n/a");
    else
        snprintf(buf, cap, "%.2f", r);
    return buf;
}

/* One linear's paths as text: "m <= 16: <small>; m > 16: <large>" (only the large one without a small path). */
static void print_paths(const char *what, const hp_linear_info *in, int64_t n, int64_t k, int64_t n_mats)
{
    printf("  %-9s: %lld x [%lld, %lld]: ", what, (long long)n_mats, (long long)n, (long long)k);
    if (in->small_m_max > 0)
        printf("m <= %lld: %s; m > %lld: %s", (long long)in->small_m_max, in->small_path, (long long)in->small_m_max,
               in->large_path);
    else
        printf("%s", in->large_path);
    printf("%s\n", in->packed ? " (packed at init)" : "");
}

/* Bytes of the read sweep: larger than any last-level cache this runs on (32 MiB here), so it reads memory. */
#define READ_SWEEP_BYTES ((size_t)512 << 20)

/* PyTorch eager's sparse block of the preset's family on the same shapes and threads (bench_torch.c): a bf16 block
 * for bf16 weights, autocast for f32 weights with --compute bf16, else f32. At most 5 timed forwards. */
static void torch_moe(const bench_args *a, int threads, int reps, cli_torch_eager *pt)
{
    const cli_preset *p = a->p;
    cli_torch_moe m = {.family = p->family, .hidden = p->hidden, .experts = p->experts, .top_k = p->top_k,
                       .intermediate = p->moe_intermediate, .shared = p->shared_intermediate,
                       .groups = p->n_group ? p->n_group : 1, .topk_group = p->topk_group ? p->topk_group : 1,
                       .tokens = a->tokens, .threads = threads, .reps = reps < 5 ? reps : 5};
    m.dtype = a->dtype == HP_DT_BF16 ? "bf16" : a->compute == HP_LINALG_BF16 ? "autocast" : "f32";
    cli_bench_torch_moe(&m, pt);
}

static int run(const bench_args *a)
{
    const cli_preset *p = a->p;
    hp_err err;
    cli_threads_info ti;
    char tb[128];
    int threads = cli_threads(NULL, a->threads, &ti);
    const double wbytes = a->dtype == HP_DT_BF16 ? 2.0 : 4.0; /* resident bytes per expert weight */
    double expert_gib = (double)p->experts * 3.0 * (double)p->hidden * (double)p->moe_intermediate * wbytes / (1u << 30);
    int64_t ep = a->ep;
    if (ep <= 0)
        for (ep = 1; ep < p->experts && expert_gib / (double)ep > a->max_gib; ep *= 2) {
        }
    if (p->experts % ep)
        return cli_usage_error("bench", "--ep %lld does not divide the %lld experts of %s", (long long)ep,
                               (long long)p->experts, p->name);
    { /* what the run holds at once, refused before any of it is allocated (would be killed for memory) */
        double T = (double)a->tokens, H = (double)p->hidden, I = (double)p->moe_intermediate,
               sI = (double)p->shared_intermediate, E = (double)p->experts, slots = T * (double)p->top_k;
        double need = expert_gib * (double)(1u << 30) / (double)ep + E * H * 4   /* the local experts, the router */
                      + 2 * T * H * 4                                            /* x, y */
                      + T * H * 8 + T * E * 8 + slots * 17 + slots * (H + 2 * I) * 4 /* the workspace (routing, rows) */
                      + (sI > 0 ? T * (2 * sI + H + 1) * 4 : 0)                  /* the shared expert's */
                      + slots * (2 * H + 2 * I) * 4 + (double)READ_SWEEP_BYTES;   /* the dense limit, the read sweep */
        char what[160];
        snprintf(what, sizeof what, "bench moe of %s at %lld tokens (%lld of %lld experts held, %s)", p->name,
                 (long long)a->tokens, (long long)(p->experts / ep), (long long)p->experts,
                 a->dtype == HP_DT_BF16 ? "bf16" : "f32");
        hp_status ms = cli_memory_fits(what, need, 1,
                                       "give fewer --tokens, or hold fewer experts (--ep N, --max-gib G)", &err);
        if (ms != HP_OK) return cli_fail(&err);
    }
    hp_moe_dims d = cli_preset_moe_dims(p);
    d.n_local = p->experts / ep;
    d.bf16_weights = a->dtype == HP_DT_BF16;
    hp_moe_layer *l = NULL;
    hp_moe_ws *ws = NULL;
    float *x = NULL, *y = NULL;
    hp_status st = hp_moe_layer_create(&l, p->archetype, &d, &err);
    double t_build = now_s();
    int64_t H = p->hidden, I = p->moe_intermediate, T = a->tokens, nl = l ? l->n_local : 0;
    if (!st) {
        float gu = 1.0f / sqrtf((float)H), dn = 1.0f / sqrtf((float)I);
        for (int64_t e = 0; e < nl && !st; e++) {
            size_t el = a->dtype == HP_DT_BF16 ? 2 : 4;
            st = fill((char *)l->w_gate_up + (size_t)(e * 2 * I * H) * el, 2 * I * H, gu, 100 + (uint64_t)e, a->dtype,
                      &err);
            if (!st) st = fill((char *)l->w_down + (size_t)(e * H * I) * el, H * I, dn, 900 + (uint64_t)e, a->dtype, &err);
        }
        uint64_t s = 7;
        for (int64_t i = 0; i < p->experts * H; i++) l->w_router[i] = urand(&s, gu);
        if (l->b_gate_up)
            for (int64_t i = 0; i < nl * 2 * I; i++) ((float *)l->b_gate_up)[i] = urand(&s, 0.1f);
        if (l->b_down)
            for (int64_t i = 0; i < nl * H; i++) ((float *)l->b_down)[i] = urand(&s, 0.1f);
        if (l->ws_gate_up) {
            for (int64_t i = 0; i < 2 * p->shared_intermediate * H; i++) l->ws_gate_up[i] = urand(&s, gu);
            for (int64_t i = 0; i < p->shared_intermediate * H; i++) l->ws_down[i] = urand(&s, 1.0f / sqrtf((float)p->shared_intermediate));
        }
        /* The numerics of the workspace's products: set before the workspace prepares them. */
        l->compute = a->compute;
    }
    t_build = now_s() - t_build;
    if (!st) st = hp_moe_ws_create(&ws, l, T, &err);
    if (!st && (!(x = malloc((size_t)(T * H) * sizeof *x)) || !(y = malloc((size_t)(T * H) * sizeof *y))))
        st = hp_err_set(&err, HP_ERR_NOMEM, "out of memory");
    if (st) goto done;
    uint64_t s = 99;
    for (int64_t i = 0; i < T * H; i++) x[i] = urand(&s, 1.0f);
    bool balanced = !a->real_router;
    /* Warm-up (threads, page faults of the workspace), then timed forwards. */
    if ((st = forward(l, ws, x, T, y, balanced, &err))) goto done;
    enum { MAXR = 50 };
    double times[MAXR];
    int reps = 0;
    double t_all = now_s();
    while (reps < MAXR && (a->reps ? reps < a->reps : (reps < 3 || now_s() - t_all < 2.0))) {
        double t0 = now_s();
        if ((st = forward(l, ws, x, T, y, balanced, &err))) goto done;
        times[reps++] = now_s() - t0;
    }
    qsort(times, (size_t)reps, sizeof *times, cmp_double);
    double med = times[reps / 2];
    int64_t n_rows = ws->stats.n_rows, n_active = ws->stats.n_active;
    /* Work of one forward: 6·H·I flops per routed row, 6·H·sI per token for the shared expert. */
    double flops = 6.0 * (double)H * (double)I * (double)n_rows + 6.0 * (double)H * (double)p->shared_intermediate * (double)T;
    double gflops = flops / med * 1e-9;
    double bytes = (double)n_active * 3.0 * (double)H * (double)I * wbytes + 3.0 * (double)H * (double)p->shared_intermediate * 4.0;
    double gbps = bytes / med * 1e-9;
    /* The limits, measured after the layer so that they do not disturb its timings. The dense product has the
     * layer's FLOPs: its routed rows, plus T·sI/I rows for a shared expert (whose weights are f32). */
    enum { LIMIT_REPS = 3 };
    int64_t dense_m = n_rows + (p->shared_intermediate ? (T * p->shared_intermediate + I - 1) / I : 0);
    char dense_path[512]; /* hp_linear_info.large_path: up to 511 characters */
    double dense = hp_moe_ref_dense_gflops(dense_m, H, I, a->dtype, a->compute, LIMIT_REPS, dense_path,
                                           sizeof dense_path);
    double read = hp_moe_ref_read_gbps(READ_SWEEP_BYTES, LIMIT_REPS);
    double peak = hp_linalg_peak_gflops(a->compute, 0.25);
    cli_torch_eager pt = {0};
    if (ep == 1)
        torch_moe(a, threads, reps, &pt);
    else
        snprintf(pt.note, sizeof pt.note, "PyTorch eager: not measured (the layer runs as one rank of a simulated "
                 "expert-parallel group; PyTorch would hold all %lld experts)", (long long)p->experts);
    char blas[1024], openblas[512];
    bool generic = false;
    hp_moe_blas_info(blas, sizeof blas);
    hp_linalg_blas_describe(openblas, sizeof openblas, &generic);
    if (generic) {
        /* hp_linalg_blas_describe starts "OpenBLAS <core> kernels". */
        char core[64] = "?";
        sscanf(openblas, "OpenBLAS %63s kernels", core);
        cli_warn("OpenBLAS runs its generic %s kernels on a CPU with AVX2/AVX-512 (this OpenBLAS does not know the "
                 "CPU), so the router's f64 product runs far below this machine's speed; set "
                 "OPENBLAS_CORETYPE=Haswell (AVX2) or SkylakeX (AVX-512), or use an OpenBLAS that knows the CPU",
                 core);
    }
    hp_linear_info gu_info, dn_info;
    hp_linear_get_info(ws->lin_gate_up, &gu_info);
    hp_linear_get_info(ws->lin_down, &dn_info);
    /* Resident: the layer's expert weights plus whatever the GEMM layer copied (packed layouts, biases),
     * against the bytes the generated dtype stores (a checkpoint's expert bytes in that dtype). */
    double owned = (double)gu_info.owned_bytes + (double)dn_info.owned_bytes;
    double resident = (double)hp_moe_layer_expert_bytes(l) + owned;
    double stored = (double)nl * 3.0 * (double)H * (double)I * wbytes;
    double tok_s = (double)T / med;
    const char *dt = a->dtype == HP_DT_BF16 ? "bf16" : "f32", *cm = a->compute == HP_LINALG_BF16 ? "bf16" : "exact";
    char r1[16], r2[16], r3[16], r4[16], b1[32], b2[32], b3[32];
    if (a->json) {
        printf("{\"preset\": \"%s\", \"archetype\": \"%s\", \"tokens\": %lld, \"ep\": %lld, \"local_experts\": %lld, "
               "\"router\": \"%s\", \"dtype\": \"%s\", \"compute\": \"%s\", \"reps\": %d, \"median_s\": %.6g, "
               "\"tokens_per_s\": %.6g, \"gflops\": %.6g",
               p->name, hp_moe_archetype_name(p->archetype), (long long)T, (long long)ep, (long long)nl,
               balanced ? "balanced" : "real", dt, cm, reps, med, tok_s, gflops);
        json_num("dense_gflops", dense);
        json_num("dense_ratio", ratio(gflops, dense));
        json_num("peak_gflops", peak);
        json_num("peak_ratio", ratio(gflops, peak));
        printf(", \"dense_rows\": %lld, \"dense_path\": ", (long long)dense_m);
        cli_json_str(dense_path);
        printf(", \"expert_bytes\": %.6g, \"expert_gbps\": %.6g", bytes, gbps);
        json_num("read_gbps", read);
        json_num("read_ratio", ratio(gbps, read));
        printf(", \"read_sweep_bytes\": %zu, \"resident_expert_bytes\": %.0f, \"stored_expert_bytes\": %.0f, "
               "\"resident_ratio\": %.4f, \"linear_owned_bytes\": %.0f, \"linear_borrowed_bytes\": %.0f, "
               "\"small_m_max\": %lld, \"gate_up_small_path\": ",
               READ_SWEEP_BYTES, resident, stored, resident / stored, owned,
               (double)gu_info.borrowed_bytes + (double)dn_info.borrowed_bytes, (long long)gu_info.small_m_max);
        cli_json_str(gu_info.small_path);
        printf(", \"gate_up_large_path\": ");
        cli_json_str(gu_info.large_path);
        printf(", \"down_small_path\": ");
        cli_json_str(dn_info.small_path);
        printf(", \"down_large_path\": ");
        cli_json_str(dn_info.large_path);
        printf(", \"rows\": %lld, \"active_experts\": %lld, \"blas\": ", (long long)n_rows, (long long)n_active);
        cli_json_str(blas);
        printf(", \"openblas_generic_fallback\": %s, \"threads\": %d", generic ? "true" : "false", threads);
        cli_bench_torch_json(&pt, tok_s);
        printf("}\n");
    } else {
        printf("bench moe: %s (%s) H %lld, E %lld, K %lld, I %lld%s; %lld tokens\n", p->name,
               hp_moe_archetype_name(p->archetype), (long long)H, (long long)p->experts, (long long)p->top_k, (long long)I,
               p->shared_intermediate ? ", shared expert" : "", (long long)T);
        if (ep > 1)
            printf("  experts  : %lld of %lld local: rank 0 of a simulated ep = %lld (all %lld would need %.1f GiB > "
                   "--max-gib %.1f)\n",
                   (long long)nl, (long long)p->experts, (long long)ep, (long long)p->experts, expert_gib, a->max_gib);
        printf("  weights  : %s generated and held, built in %.1f s; resident %s of experts = %.2f x their %s "
               "bytes (the GEMM layer owns %s of it)\n",
               dt, t_build, hp_format_bytes((uint64_t)(resident), b1, sizeof b1), resident / stored, dt,
               hp_format_bytes((uint64_t)(owned), b2, sizeof b2));
        printf("  compute  : %s (%s)\n", cm,
               a->compute == HP_LINALG_BF16 ? "activations rounded to bf16 for the products, f32 sums"
                                            : "f32 activations, bf16 weights widened exactly, f32 sums");
        printf("  router   : %s\n", balanced ? "balanced (benchmark only: every expert gets T*K/E slots)"
                                              : "real (archetype router, random weights)");
        printf("  threads  : %s\n", cli_threads_str(&ti, tb, sizeof tb));
        printf("  kernels  : %s\n", blas);
        print_paths("gate/up", &gu_info, 2 * I, H, nl);
        print_paths("down", &dn_info, H, I, nl);
        printf("  layer    : %.3f ms median of %d -> %.0f tokens/s, %.1f GFLOP/s (%lld rows on %lld experts)\n",
               med * 1e3, reps, tok_s, gflops, (long long)n_rows, (long long)n_active);
        if (dense >= 0)
            printf("  dense    : %.1f GFLOP/s, one %lld-row gate/up + down, %s %s, best of %d (%s)   ratio %s\n",
                   dense, (long long)dense_m, dt, cm, LIMIT_REPS, dense_path,
                   fmt_ratio(r1, sizeof r1, ratio(gflops, dense)));
        else
            printf("  dense    : n/a (no rows, or the dense product could not be prepared)\n");
        if (peak > 0)
            printf("  cpu peak : %.1f GFLOP/s, %s on registers only, every thread at once   ratio %s (dense %s)\n",
                   peak, hp_linalg_peak_name(a->compute), fmt_ratio(r3, sizeof r3, ratio(gflops, peak)),
                   fmt_ratio(r4, sizeof r4, ratio(dense, peak)));
        printf("  memory   : %s of expert weights read per forward, %.1f GB/s; ", hp_format_bytes((uint64_t)(bytes), b3, sizeof b3),
               gbps);
        if (read >= 0)
            printf("read sweep %.1f GB/s (%s, best of %d)   ratio %s\n", read,
                   hp_format_bytes((uint64_t)((double)READ_SWEEP_BYTES), b2, sizeof b2), LIMIT_REPS,
                   fmt_ratio(r2, sizeof r2, ratio(gbps, read)));
        else
            printf("read sweep n/a (out of memory)\n");
        cli_bench_torch_text(&pt, tok_s, "tokens/s");
    }
done:
    free(x);
    free(y);
    hp_moe_ws_destroy(ws);
    hp_moe_layer_free(l);
    return st ? cli_fail(&err) : HP_EXIT_OK;
}

static int bench_moe(int argc, char **argv)
{
    bench_args a = {.dtype = HP_DT_F32, .compute = HP_LINALG_EXACT, .max_gib = 6.0};
    const char *preset_name = NULL;
    int c;
    optind = 1;
    cli_parser cp = {.cmd = "bench", .opts = g_opts};
    while ((c = cli_getopt(&cp, argc, argv)) != -1) {
        switch (c) {
        case 'p': preset_name = optarg; break;
        case 'T':
            if (!cli_parse_i64("bench", "--tokens", optarg, 1, 1 << 20, &a.tokens)) return HP_EXIT_USAGE;
            break;
        case 'd': {
            static const hp_dtype dts[] = {HP_DT_BF16, HP_DT_F32};
            if (!cli_parse_dtype("bench", optarg, dts, 2, &a.dtype)) return HP_EXIT_USAGE;
            break;
        }
        case 'X': if (!cli_parse_compute("bench", optarg, &a.compute)) return HP_EXIT_USAGE; break;
        case 'j': a.json = true; break;
        case 't':
            if (!cli_parse_i64("bench", "--threads", optarg, 1, 4096, &a.threads)) return HP_EXIT_USAGE;
            break;
        case 'r':
            if (!cli_parse_router("bench", optarg, &a.real_router)) return HP_EXIT_USAGE;
            break;
        case 'R':
            if (!cli_parse_i64("bench", "--reps", optarg, 1, 50, &a.reps)) return HP_EXIT_USAGE;
            break;
        case 'm':
            if (!cli_parse_positive("bench", "--max-gib", optarg, &a.max_gib)) return HP_EXIT_USAGE;
            break;
        case 'e':
            if (!cli_parse_i64("bench", "--ep", optarg, 1, 1 << 16, &a.ep)) return HP_EXIT_USAGE;
            break;
        case 'h': usage(stdout); return HP_EXIT_OK;
        default: return cli_bad_option("bench", argv);
        }
    }
    if (optind != argc) return cli_usage_error("bench", "unexpected argument '%s'", argv[optind]);
    if (!(a.p = cli_preset_arg("bench", preset_name, true))) return HP_EXIT_USAGE;
    if (!a.tokens) return cli_usage_error("bench", "missing --tokens T");
    return run(&a);
}

enum { O_WORLD = 1000, O_REPS };
static const cli_opt g_advise_opts[] = {
    {"world", O_WORLD, "N", "ranks in all", 0, NULL},
    {"reps", O_REPS, "R", "runs of the search; the best is reported (3)", 0, NULL},
    CLI_OPT_HELP,
    CLI_OPTS_COST("advise's flags: the batch and the byte and time model (docs/cost.md)", CLI_ADVISE_BATCH),
    CLI_OPTS_PLAN("advise's flags: the plan flags of every candidate"),
    {0},
};

/* `hyperpar bench advise MODEL --world N [advise flags]`: the time hp_advise takes per mesh against one plan
 * derivation of the same model in the same run (its template's, with the shard layout), as hp_advise measures
 * them (hp_advice.plan_seconds, search_seconds). */
int cmd_bench_advise(int argc, char **argv)
{
    cli_plan_flags pf;
    cli_plan_flags_init(&pf);
    cli_cost_flags cf;
    cli_cost_flags_init(&cf);
    int64_t N = 0, reps = 3;
    int c;
    optind = 1;
    cli_parser cp = {.cmd = "bench advise", .opts = g_advise_opts};
    while ((c = cli_getopt(&cp, argc, argv)) != -1) {
        int pr = cli_plan_flag("bench advise", c, optarg, &pf);
        if (pr == 0) pr = cli_cost_flag("bench advise", c, optarg, &cf);
        if (pr < 0) return HP_EXIT_USAGE;
        if (pr > 0) continue;
        switch (c) {
        case O_WORLD:
            if (!cli_parse_i64("bench advise", "--world", optarg, 1, 1 << 20, &N)) return HP_EXIT_USAGE;
            break;
        case O_REPS:
            if (!cli_parse_i64("bench advise", "--reps", optarg, 1, 100, &reps)) return HP_EXIT_USAGE;
            break;
        case 'h':
            printf("usage: hyperpar bench advise MODEL --world N [--reps R] [advise flags]\n\n"
                   "Times 'hyperpar advise' over every mesh of N ranks (the best of R runs) against one plan\n"
                   "derivation of MODEL in the same run, and prints both and their ratio.\n\n");
            cli_print_options(stdout, g_advise_opts);
            return HP_EXIT_OK;
        default: return cli_bad_option("bench advise", argv);
        }
    }
    if (optind != argc - 1) return cli_usage_error("bench advise", "expected exactly one MODEL");
    if (N < 1) return cli_usage_error("bench advise", "missing --world N");
    if (!cli_cost_flags_done("bench advise", &cf)) return HP_EXIT_USAGE;
    if (!cli_advise_rpn_divides("bench advise", cf.s.co.mdl.ranks_per_node, N)) return HP_EXIT_USAGE;
    hp_err err;
    hp_model *m = NULL;
    hp_overrides *ov = NULL;
    hp_status st = cli_plan_flags_apply(&pf, NULL, &ov, &err);
    if (st == HP_OK) st = hp_model_open(&m, argv[optind], NULL, &err);
    hp_advise_opts ao;
    hp_advise_opts_default(&ao);
    ao.world = N;
    ao.mem_per_rank = cf.s.budget; /* 0 without --mem-per-rank: every mesh the model takes is evaluated in full */
    ao.cost = cf.s.co;
    if (!cf.s.batch_given) ao.cost.B = 0; /* advise's default batch */
    ao.plan = pf.po;
    double best_mesh = 0, best_plan = 0;
    int n = 0;
    int64_t B = 0;
    for (int64_t i = 0; st == HP_OK && i < reps; i++) {
        hp_advice *a = NULL;
        if ((st = hp_advise(&a, m, &ao, &err)) != HP_OK) break;
        double per = a->n_cands ? a->search_seconds / a->n_cands : 0;
        if (!i || per < best_mesh) best_mesh = per;
        if (!i || a->plan_seconds < best_plan) best_plan = a->plan_seconds;
        n = a->n_cands, B = a->B;
        hp_advice_free(a);
    }
    hp_model_close(m);
    hp_overrides_free(ov);
    cli_cost_flags_free(&cf);
    if (st != HP_OK) return cli_fail(&err);
    printf("bench advise: %s, world %lld, batch %lld x %lld, %d meshes\n", argv[optind], (long long)N,
           (long long)B, (long long)cf.s.co.S, n);
    printf("  one plan (the template, with its shard layout): %9.3f ms\n", best_plan * 1e3);
    printf("  advise, per mesh:                               %9.3f ms   (%.4f of one plan; best of %lld)\n",
           best_mesh * 1e3, best_plan > 0 ? best_mesh / best_plan : 0.0, (long long)reps);
    return HP_EXIT_OK;
}

int cmd_bench(int argc, char **argv)
{
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return HP_EXIT_OK;
    }
    if (argc < 2) return cli_usage_error("bench", "missing the benchmark name (moe, ep, run, train, advise)");
    if (!strcmp(argv[1], "moe")) return bench_moe(argc - 1, argv + 1);
    if (!strcmp(argv[1], "ep")) return cmd_bench_ep(argc - 1, argv + 1);
    if (!strcmp(argv[1], "run")) return cmd_bench_run(argc - 1, argv + 1);
    if (!strcmp(argv[1], "train")) return cmd_bench_train(argc - 1, argv + 1);
    if (!strcmp(argv[1], "advise")) return cmd_bench_advise(argc - 1, argv + 1);
    return cli_usage_error("bench", "unknown benchmark '%s'; known: moe, ep, run, train, advise", argv[1]);
}
