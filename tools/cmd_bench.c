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
 * (bench_torch.c, bench/torch_moe.py). The layer's median is printed with the least and the greatest of its
 * forwards, and the host's load average at the start and the end. Benchmarks print ratios, never pass/fail.
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

#include "bench_run.h"
#include "cli.h"
#include "costflags.h"
#include "hyperpar/cost.h"
#include "hyperpar/linalg.h"
#include "hyperpar/moe.h"
#include "hyperpar/overrides.h"

typedef struct bench_args {
    const cli_preset *p;
    const char *preset;
    int64_t tokens, threads, reps, ep;
    double max_gib;
    hp_dtype dtype;
    hp_linalg_mode compute;
    bool json, real_router;
} bench_args;

static const cli_enum g_dtypes = {"must be", {{"bf16", HP_DT_BF16, false}, {"f32", HP_DT_F32, false}}};
static const cli_enum g_router = {NULL, {{"balanced", 0, false}, {"real", 1, false}}}; /* into real_router */

static const cli_opt g_opts[] = {
    {"preset", 'p', "P", "a MoE preset, listed below", 0, NULL, CLI_STR(bench_args, preset)},
    {"tokens", 'T', "T", "tokens per forward", 0, NULL, CLI_INT(bench_args, tokens, 1, 1 << 20)},
    {"dtype", 'd', "D", "dtype the expert weights are generated and held in (f32 default; bf16 stays bf16)", 0, NULL,
     CLI_ENUM(bench_args, dtype, g_dtypes)},
    {"compute", 'X', "M", "exact (default: f32 activations, bf16 weights widened exactly, f32 sums) or bf16\n"
                          "(activations rounded to bf16 for the products, f32 sums)", 0, NULL,
     CLI_ENUM(bench_args, compute, cli_enum_compute)},
    {"router", 'r', "R", "balanced (default: T*K/E slots per expert, benchmark only) or real (the\n"
                         "archetype's router on random weights)", 0, NULL, CLI_ENUM(bench_args, real_router, g_router)},
    {"reps", 'R', "R", "timed forwards (default: as many as fit in ~2 s, 3 to 50)", 0, NULL,
     CLI_INT(bench_args, reps, 1, 50)},
    {"max-gib", 'm', "G", "expert weights allowed in memory (6); above it, run one rank of ep ranks", 0, NULL,
     CLI_POSITIVE(bench_args, max_gib)},
    {"ep", 'e', "N", "force the simulated expert-parallel group size", 0, NULL, CLI_INT(bench_args, ep, 1, 1 << 16)},
    {"threads", 't', "N", "OpenMP threads (oneDNN, the kernels and the MoE loop share one pool; default:\n"
                          "OMP_NUM_THREADS when set, else this process's cores divided by the ranks the\n"
                          "launcher started on this node)", 0, NULL, CLI_INT(bench_args, threads, 1, 4096)},
    {"json", 'j', NULL, "one JSON object instead of text", 0, NULL, CLI_FLAG(bench_args, json)},
    CLI_OPT_HELP,
    {0},
};

/* The presets, then the other benchmarks (bench --help is bench moe's). */
static void bench_moe_epilog(FILE *out)
{
    fprintf(out, "presets:\n");
    cli_print_presets(out, true);
    fprintf(out, "\n");
    for (const cli_command *const *b = cli_cmd_bench.subs; *b; b++)
        if (*b != &cli_cmd_bench_moe) fprintf(out, "hyperpar %s --help: %s.\n", (*b)->name, (*b)->summary);
}

static int bench_moe(int argc, char **argv);

const cli_command cli_cmd_bench_moe = {
    .cmd = "bench",
    .name = "bench moe",
    .summary = "one MoE layer against a dense GEMM and a memory sweep",
    .forms = {{NULL, "--preset --tokens"}},
    .about = "Times one MoE layer at a real model's shapes with random weights built in memory, and prints it\n"
             "next to limits measured in the same run: one dense GEMM with the layer's FLOPs through the same\n"
             "backend, dtype and compute mode (GFLOP/s), and a read-only sweep over 512 MiB (GB/s). When\n"
             "$HP_BENCH_PYTHON (default python3) can import torch, it also times PyTorch eager's sparse block of the\n"
             "preset's family (transformers' own, or a plain-torch loop over the experts) on the same shapes and\n"
             "threads, in the weights' dtype (autocast for f32 weights with --compute bf16), and prints the ratio;\n"
             "not for a simulated expert-parallel rank. HP_GEMM=onednn|hyperpar runs every large product on oneDNN,\n"
             "or on hyperpar's blocked AVX-512 kernel (docs/kernels.md). The layer's median is printed with the\n"
             "least and the greatest of its reps (JSON: min_s, max_s), and the host's 1-minute load average at the\n"
             "start and the end (load_start, load_end).\n",
    .opts = g_opts,
    .epilog_more = bench_moe_epilog,
    .run = bench_moe,
};

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

/* Runs of each limit (the dense product, the read sweep); the best is reported. */
enum { LIMIT_REPS = 3 };

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

/* What one bench moe run measured, for the report. */
typedef struct moe_result {
    cli_threads_info ti;
    int threads, reps;
    int64_t ep, nl;                     /* the simulated EP group, the experts this rank holds */
    double expert_gib, t_build;         /* all experts' GiB; seconds to build the layer */
    cli_bench_spread layer;             /* the layer's forward over the reps */
    double tok_s, gflops, bytes, gbps;  /* the rates of its median */
    int64_t n_rows, n_active;           /* routed rows, experts that got any */
    int64_t dense_m;                    /* rows of the dense limit */
    char dense_path[512];               /* hp_linear_info.large_path: up to 511 characters */
    double dense, read, peak;           /* the limits: GFLOP/s, GB/s, GFLOP/s (< 0: not measured) */
    cli_torch_eager pt;
    char blas[1024];
    bool generic;                       /* OpenBLAS runs its generic kernels */
    hp_linear_info gu_info, dn_info;
    double owned, resident, stored;     /* expert bytes: owned by the GEMM layer, resident, as stored */
    cli_bench_load load;                /* the host's load at the start and the end */
} moe_result;

/* Refuses (HP_ERR_INPUT) a run this machine cannot hold, before any of it is allocated (it would be killed for
 * memory): the local experts and router, x and y, the workspace, the shared expert, the dense limit, the sweep. */
static hp_status check_memory(const bench_args *a, int64_t ep, double expert_gib, hp_err *err)
{
    const cli_preset *p = a->p;
    double T = (double)a->tokens, H = (double)p->hidden, I = (double)p->moe_intermediate,
           sI = (double)p->shared_intermediate, E = (double)p->experts, slots = T * (double)p->top_k;
    double need = expert_gib * (double)(1u << 30) / (double)ep + E * H * 4   /* the local experts, the router */
                  + 2 * T * H * 4                                            /* x, y */
                  + T * H * 8 + T * E * 8 + slots * 17 + slots * (H + 2 * I) * 4 /* the workspace (routing, rows) */
                  + (sI > 0 ? T * (2 * sI + H + 1) * 4 : 0)                  /* the shared expert's */
                  + slots * (2 * H + 2 * I) * 4 + (double)CLI_BENCH_SWEEP_BYTES; /* the dense limit, the sweep */
    char what[160];
    snprintf(what, sizeof what, "bench moe of %s at %lld tokens (%lld of %lld experts held, %s)", p->name,
             (long long)a->tokens, (long long)(p->experts / ep), (long long)p->experts,
             a->dtype == HP_DT_BF16 ? "bf16" : "f32");
    return hp_memory_fits(what, need, 1, "give fewer --tokens, or hold fewer experts (--ep N, --max-gib G)", err);
}

/* The layer of a's preset holding its first experts / ep experts, random weights in a's dtype (*l), and the
 * seconds its weights took (*t_build). */
static hp_status build_layer(const bench_args *a, int64_t ep, hp_moe_layer **l, double *t_build, hp_err *err)
{
    const cli_preset *p = a->p;
    hp_moe_dims d = cli_preset_moe_dims(p);
    d.n_local = p->experts / ep;
    d.bf16_weights = a->dtype == HP_DT_BF16;
    hp_status st = hp_moe_layer_create(l, p->archetype, &d, err);
    double t0 = hp_comm_wtime();
    int64_t H = p->hidden, I = p->moe_intermediate, nl = *l ? (*l)->n_local : 0;
    if (!st) {
        hp_moe_layer *m = *l;
        float gu = 1.0f / sqrtf((float)H), dn = 1.0f / sqrtf((float)I);
        for (int64_t e = 0; e < nl && !st; e++) {
            size_t el = a->dtype == HP_DT_BF16 ? 2 : 4;
            st = fill((char *)m->w_gate_up + (size_t)(e * 2 * I * H) * el, 2 * I * H, gu, 100 + (uint64_t)e, a->dtype,
                      err);
            if (!st) st = fill((char *)m->w_down + (size_t)(e * H * I) * el, H * I, dn, 900 + (uint64_t)e, a->dtype, err);
        }
        uint64_t s = 7;
        for (int64_t i = 0; i < p->experts * H; i++) m->w_router[i] = urand(&s, gu);
        if (m->b_gate_up)
            for (int64_t i = 0; i < nl * 2 * I; i++) ((float *)m->b_gate_up)[i] = urand(&s, 0.1f);
        if (m->b_down)
            for (int64_t i = 0; i < nl * H; i++) ((float *)m->b_down)[i] = urand(&s, 0.1f);
        if (m->ws_gate_up) {
            for (int64_t i = 0; i < 2 * p->shared_intermediate * H; i++) m->ws_gate_up[i] = urand(&s, gu);
            for (int64_t i = 0; i < p->shared_intermediate * H; i++) m->ws_down[i] = urand(&s, 1.0f / sqrtf((float)p->shared_intermediate));
        }
        /* The numerics of the workspace's products: set before the workspace prepares them. */
        m->compute = a->compute;
    }
    *t_build = hp_comm_wtime() - t0;
    return st;
}

/* A warm-up (threads, page faults of the workspace), then the timed forwards of l on x [T, H]: r->layer, r->reps,
 * and the work of one forward (rows, active experts, FLOPs, expert bytes read). */
static hp_status time_layer(const bench_args *a, const hp_moe_layer *l, hp_moe_ws *ws, const float *x, float *y,
                            moe_result *r, hp_err *err)
{
    const cli_preset *p = a->p;
    int64_t H = p->hidden, I = p->moe_intermediate, T = a->tokens;
    bool balanced = !a->real_router;
    hp_status st = forward(l, ws, x, T, y, balanced, err);
    enum { MAXR = CLI_BENCH_MAX_REPS };
    double times[MAXR];
    int reps = 0;
    double t_all = hp_comm_wtime();
    while (!st && reps < MAXR && (a->reps ? reps < a->reps : (reps < 3 || hp_comm_wtime() - t_all < 2.0))) {
        double t0 = hp_comm_wtime();
        if ((st = forward(l, ws, x, T, y, balanced, err))) break;
        times[reps++] = hp_comm_wtime() - t0;
    }
    if (st) return st;
    r->layer = cli_bench_spread_sort(times, (size_t)reps);
    const double wbytes = a->dtype == HP_DT_BF16 ? 2.0 : 4.0; /* resident bytes per expert weight */
    r->reps = reps;
    r->n_rows = ws->stats.n_rows, r->n_active = ws->stats.n_active;
    /* Work of one forward: 6·H·I flops per routed row, 6·H·sI per token for the shared expert. */
    double flops = 6.0 * (double)H * (double)I * (double)r->n_rows + 6.0 * (double)H * (double)p->shared_intermediate * (double)T;
    r->gflops = flops / r->layer.med * 1e-9;
    r->bytes = (double)r->n_active * 3.0 * (double)H * (double)I * wbytes + 3.0 * (double)H * (double)p->shared_intermediate * 4.0;
    r->gbps = r->bytes / r->layer.med * 1e-9;
    r->tok_s = (double)T / r->layer.med;
    return HP_OK;
}

/* The limits, measured after the layer so that they do not disturb its timings, PyTorch, the kernels and the
 * resident bytes. The dense product has the layer's FLOPs: its routed rows, plus T·sI/I rows for a shared expert
 * (whose weights are f32). */
static void measure_limits(const bench_args *a, const hp_moe_layer *l, const hp_moe_ws *ws, moe_result *r)
{
    const cli_preset *p = a->p;
    int64_t H = p->hidden, I = p->moe_intermediate, T = a->tokens;
    r->dense_m = r->n_rows + (p->shared_intermediate ? (T * p->shared_intermediate + I - 1) / I : 0);
    r->dense = hp_moe_ref_dense_gflops(r->dense_m, H, I, a->dtype, a->compute, LIMIT_REPS, r->dense_path,
                                       sizeof r->dense_path);
    r->read = hp_moe_ref_read_gbps(CLI_BENCH_SWEEP_BYTES, LIMIT_REPS);
    r->peak = hp_linalg_peak_gflops(a->compute, 0.25);
    if (r->ep == 1)
        torch_moe(a, r->threads, r->reps, &r->pt);
    else
        snprintf(r->pt.note, sizeof r->pt.note, "PyTorch eager: not measured (the layer runs as one rank of a simulated "
                 "expert-parallel group; PyTorch would hold all %lld experts)", (long long)p->experts);
    char openblas[512];
    hp_moe_blas_info(r->blas, sizeof r->blas);
    hp_linalg_blas_describe(openblas, sizeof openblas, &r->generic);
    if (r->generic) {
        /* hp_linalg_blas_describe starts "OpenBLAS <core> kernels". */
        char core[64] = "?";
        sscanf(openblas, "OpenBLAS %63s kernels", core);
        cli_warn("OpenBLAS runs its generic %s kernels on a CPU with AVX2/AVX-512 (this OpenBLAS does not know the "
                 "CPU), so the router's f64 product runs far below this machine's speed; set "
                 "OPENBLAS_CORETYPE=Haswell (AVX2) or SkylakeX (AVX-512), or use an OpenBLAS that knows the CPU",
                 core);
    }
    hp_linear_get_info(ws->lin_gate_up, &r->gu_info);
    hp_linear_get_info(ws->lin_down, &r->dn_info);
    /* Resident: the layer's expert weights plus whatever the GEMM layer copied (packed layouts, biases),
     * against the bytes the generated dtype stores (a checkpoint's expert bytes in that dtype). */
    const double wbytes = a->dtype == HP_DT_BF16 ? 2.0 : 4.0;
    r->owned = (double)r->gu_info.owned_bytes + (double)r->dn_info.owned_bytes;
    r->resident = (double)hp_moe_layer_expert_bytes(l) + r->owned;
    r->stored = (double)r->nl * 3.0 * (double)H * (double)I * wbytes;
}

static void print_json(const bench_args *a, const moe_result *r)
{
    const cli_preset *p = a->p;
    const char *dt = a->dtype == HP_DT_BF16 ? "bf16" : "f32", *cm = a->compute == HP_LINALG_BF16 ? "bf16" : "exact";
    printf("{\"preset\": \"%s\", \"archetype\": \"%s\", \"tokens\": %lld, \"ep\": %lld, \"local_experts\": %lld, "
           "\"router\": \"%s\", \"dtype\": \"%s\", \"compute\": \"%s\", \"reps\": %d, \"median_s\": %.6g",
           p->name, hp_moe_archetype_name(p->archetype), (long long)a->tokens, (long long)r->ep, (long long)r->nl,
           a->real_router ? "real" : "balanced", dt, cm, r->reps, r->layer.med);
    cli_bench_spread_json("", &r->layer);
    printf(", \"tokens_per_s\": %.6g, \"gflops\": %.6g", r->tok_s, r->gflops);
    json_num("dense_gflops", r->dense);
    json_num("dense_ratio", ratio(r->gflops, r->dense));
    json_num("peak_gflops", r->peak);
    json_num("peak_ratio", ratio(r->gflops, r->peak));
    printf(", \"dense_rows\": %lld, \"dense_path\": ", (long long)r->dense_m);
    cli_json_str(r->dense_path);
    printf(", \"expert_bytes\": %.6g, \"expert_gbps\": %.6g", r->bytes, r->gbps);
    json_num("read_gbps", r->read);
    json_num("read_ratio", ratio(r->gbps, r->read));
    printf(", \"read_sweep_bytes\": %zu, \"resident_expert_bytes\": %.0f, \"stored_expert_bytes\": %.0f, "
           "\"resident_ratio\": %.4f, \"linear_owned_bytes\": %.0f, \"linear_borrowed_bytes\": %.0f, "
           "\"small_m_max\": %lld, \"gate_up_small_path\": ",
           CLI_BENCH_SWEEP_BYTES, r->resident, r->stored, r->resident / r->stored, r->owned,
           (double)r->gu_info.borrowed_bytes + (double)r->dn_info.borrowed_bytes, (long long)r->gu_info.small_m_max);
    cli_json_str(r->gu_info.small_path);
    printf(", \"gate_up_large_path\": ");
    cli_json_str(r->gu_info.large_path);
    printf(", \"down_small_path\": ");
    cli_json_str(r->dn_info.small_path);
    printf(", \"down_large_path\": ");
    cli_json_str(r->dn_info.large_path);
    printf(", \"rows\": %lld, \"active_experts\": %lld, \"blas\": ", (long long)r->n_rows, (long long)r->n_active);
    cli_json_str(r->blas);
    printf(", \"openblas_generic_fallback\": %s, \"threads\": %d", r->generic ? "true" : "false", r->threads);
    cli_bench_load_json(&r->load);
    cli_bench_torch_json(&r->pt, r->tok_s);
    printf("}\n");
}

static void print_text(const bench_args *a, const moe_result *r)
{
    const cli_preset *p = a->p;
    int64_t H = p->hidden, I = p->moe_intermediate;
    const char *dt = a->dtype == HP_DT_BF16 ? "bf16" : "f32", *cm = a->compute == HP_LINALG_BF16 ? "bf16" : "exact";
    char r1[16], r2[16], r3[16], r4[16], b1[32], b2[32], b3[32], tb[128];
    printf("bench moe: %s (%s) H %lld, E %lld, K %lld, I %lld%s; %lld tokens\n", p->name,
           hp_moe_archetype_name(p->archetype), (long long)H, (long long)p->experts, (long long)p->top_k, (long long)I,
           p->shared_intermediate ? ", shared expert" : "", (long long)a->tokens);
    if (r->ep > 1)
        printf("  experts  : %lld of %lld local: rank 0 of a simulated ep = %lld (all %lld would need %.1f GiB > "
               "--max-gib %.1f)\n",
               (long long)r->nl, (long long)p->experts, (long long)r->ep, (long long)p->experts, r->expert_gib,
               a->max_gib);
    printf("  weights  : %s generated and held, built in %.1f s; resident %s of experts = %.2f x their %s "
           "bytes (the GEMM layer owns %s of it)\n",
           dt, r->t_build, hp_format_bytes((uint64_t)(r->resident), b1, sizeof b1), r->resident / r->stored, dt,
           hp_format_bytes((uint64_t)(r->owned), b2, sizeof b2));
    printf("  compute  : %s (%s)\n", cm,
           a->compute == HP_LINALG_BF16 ? "activations rounded to bf16 for the products, f32 sums"
                                        : "f32 activations, bf16 weights widened exactly, f32 sums");
    printf("  router   : %s\n", a->real_router ? "real (archetype router, random weights)"
                                               : "balanced (benchmark only: every expert gets T*K/E slots)");
    printf("  threads  : %s\n", cli_threads_str(&r->ti, tb, sizeof tb));
    cli_bench_load_text(&r->load, 9);
    printf("  kernels  : %s\n", r->blas);
    print_paths("gate/up", &r->gu_info, 2 * I, H, r->nl);
    print_paths("down", &r->dn_info, H, I, r->nl);
    printf("  layer    : %.3f ms median of %d (min %.3f, max %.3f) -> %.0f tokens/s, %.1f GFLOP/s (%lld rows on %lld "
           "experts)\n",
           r->layer.med * 1e3, r->reps, r->layer.min * 1e3, r->layer.max * 1e3, r->tok_s, r->gflops,
           (long long)r->n_rows, (long long)r->n_active);
    if (r->dense >= 0)
        printf("  dense    : %.1f GFLOP/s, one %lld-row gate/up + down, %s %s, best of %d (%s)   ratio %s\n",
               r->dense, (long long)r->dense_m, dt, cm, LIMIT_REPS, r->dense_path,
               fmt_ratio(r1, sizeof r1, ratio(r->gflops, r->dense)));
    else
        printf("  dense    : n/a (no rows, or the dense product could not be prepared)\n");
    if (r->peak > 0)
        printf("  cpu peak : %.1f GFLOP/s, %s on registers only, every thread at once   ratio %s (dense %s)\n",
               r->peak, hp_linalg_peak_name(a->compute), fmt_ratio(r3, sizeof r3, ratio(r->gflops, r->peak)),
               fmt_ratio(r4, sizeof r4, ratio(r->dense, r->peak)));
    printf("  memory   : %s of expert weights read per forward, %.1f GB/s; ",
           hp_format_bytes((uint64_t)(r->bytes), b3, sizeof b3), r->gbps);
    if (r->read >= 0)
        printf("read sweep %.1f GB/s (%s, best of %d)   ratio %s\n", r->read,
               hp_format_bytes((uint64_t)((double)CLI_BENCH_SWEEP_BYTES), b2, sizeof b2), LIMIT_REPS,
               fmt_ratio(r2, sizeof r2, ratio(r->gbps, r->read)));
    else
        printf("read sweep n/a (out of memory)\n");
    cli_bench_torch_text(&r->pt, r->tok_s, "tokens/s");
}

/* bench moe: the layer of a->p at a->tokens tokens, timed, next to its limits; printed as text or JSON. */
static int run(const bench_args *a)
{
    const cli_preset *p = a->p;
    hp_err err;
    moe_result r = {.load = {cli_bench_loadavg(), -1}}; /* before any work */
    r.threads = cli_threads(NULL, a->threads, &r.ti);
    const double wbytes = a->dtype == HP_DT_BF16 ? 2.0 : 4.0; /* resident bytes per expert weight */
    r.expert_gib = (double)p->experts * 3.0 * (double)p->hidden * (double)p->moe_intermediate * wbytes / (1u << 30);
    r.ep = a->ep;
    if (r.ep <= 0)
        for (r.ep = 1; r.ep < p->experts && r.expert_gib / (double)r.ep > a->max_gib; r.ep *= 2) {
        }
    if (p->experts % r.ep)
        return cli_usage_error("bench", "--ep %lld does not divide the %lld experts of %s", (long long)r.ep,
                               (long long)p->experts, p->name);
    if (check_memory(a, r.ep, r.expert_gib, &err) != HP_OK) return cli_fail(&err);
    hp_moe_layer *l = NULL;
    hp_moe_ws *ws = NULL;
    float *x = NULL, *y = NULL;
    int64_t H = p->hidden, T = a->tokens;
    hp_status st = build_layer(a, r.ep, &l, &r.t_build, &err);
    r.nl = l ? l->n_local : 0;
    if (!st) st = hp_moe_ws_create(&ws, l, T, &err);
    if (!st && (!(x = malloc((size_t)(T * H) * sizeof *x)) || !(y = malloc((size_t)(T * H) * sizeof *y))))
        st = hp_err_set(&err, HP_ERR_NOMEM, "out of memory");
    if (!st) {
        uint64_t s = 99;
        for (int64_t i = 0; i < T * H; i++) x[i] = urand(&s, 1.0f);
        st = time_layer(a, l, ws, x, y, &r, &err);
    }
    if (!st) {
        measure_limits(a, l, ws, &r);
        r.load.end = cli_bench_loadavg(); /* after PyTorch, the last of the limits */
        if (a->json) print_json(a, &r);
        else print_text(a, &r);
    }
    free(x);
    free(y);
    hp_moe_ws_destroy(ws);
    hp_moe_layer_free(l);
    return st ? cli_fail(&err) : HP_EXIT_OK;
}

static int bench_moe(int argc, char **argv)
{
    bench_args a = {.dtype = HP_DT_F32, .compute = HP_LINALG_EXACT, .max_gib = 6.0};
    cli_parser cp = {.command = &cli_cmd_bench_moe};
    int prc = cli_parse(&cp, &a, argc, argv);
    if (prc != HP_EXIT_OK) return prc == CLI_HELP ? HP_EXIT_OK : prc;
    const char *preset_name = a.preset;
    if (optind != argc) return cli_usage_error("bench", "unexpected argument '%s'", argv[optind]);
    if (!(a.p = cli_preset_arg("bench", preset_name, true))) return HP_EXIT_USAGE;
    if (!a.tokens) return cli_usage_error("bench", "missing --tokens T");
    return run(&a);
}

enum { O_WORLD = 1000, O_REPS };

typedef struct advise_args {
    cli_plan_flags pf;
    cli_cost_flags cf;
    int64_t world, reps;
} advise_args;

static const cli_opt g_advise_opts[] = {
    {"world", O_WORLD, "N", "ranks in all", 0, NULL, CLI_INT(advise_args, world, 1, 1 << 20)},
    {"reps", O_REPS, "R", "runs of the search; the best is reported (3)", 0, NULL, CLI_INT(advise_args, reps, 1, 100)},
    CLI_OPT_HELP,
    CLI_OPTS_COST("advise's flags: the batch and the byte and time model (docs/cost.md)", CLI_ADVISE_BATCH,
                  advise_args, cf),
    CLI_OPTS_PLAN("advise's flags: the plan flags of every candidate", advise_args, pf),
    {0},
};

const cli_command cli_cmd_bench_advise = {
    .cmd = "bench advise",
    .name = "bench advise",
    .summary = "hyperpar advise's time per mesh against one plan derivation",
    .forms = {{NULL, "MODEL --world"}},
    .about = "Times 'hyperpar advise' over every mesh of N ranks (the best of R runs) against one plan\n"
             "derivation of MODEL in the same run, and prints both and their ratio, each with the median and the\n"
             "greatest of the R runs, and the host's 1-minute load average at the start and the end.\n",
    .opts = g_advise_opts,
    .run = cmd_bench_advise,
};

/* `hyperpar bench advise MODEL --world N [advise flags]`: the time hp_advise takes per mesh against one plan
 * derivation of the same model in the same run (its template's, with the shard layout), as hp_advise measures
 * them (hp_advice.plan_seconds, search_seconds). */
int cmd_bench_advise(int argc, char **argv)
{
    cli_bench_load load = {cli_bench_loadavg(), -1}; /* before any work */
    advise_args o = {.reps = 3};
    cli_plan_flags_init(&o.pf);
    cli_cost_flags_init(&o.cf);
    cli_parser cp = {.command = &cli_cmd_bench_advise};
    int prc = cli_parse(&cp, &o, argc, argv);
    if (prc != HP_EXIT_OK) return prc == CLI_HELP ? HP_EXIT_OK : prc;
    cli_plan_flags pf = o.pf;
    cli_cost_flags cf = o.cf;
    int64_t N = o.world, reps = o.reps;
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
    double per_mesh[100], plan[100]; /* --reps is at most 100 */
    int n = 0;
    int64_t B = 0;
    for (int64_t i = 0; st == HP_OK && i < reps; i++) {
        hp_advice *a = NULL;
        if ((st = hp_advise(&a, m, &ao, &err)) != HP_OK) break;
        per_mesh[i] = a->n_cands ? a->search_seconds / a->n_cands : 0;
        plan[i] = a->plan_seconds;
        n = a->n_cands, B = a->B;
        hp_advice_free(a);
    }
    hp_model_close(m);
    hp_overrides_free(ov);
    cli_cost_flags_free(&cf);
    if (st != HP_OK) return cli_fail(&err);
    /* The best of the runs is the figure; the median and the greatest show how far the others were from it. */
    const cli_bench_spread sm = cli_bench_spread_sort(per_mesh, (size_t)reps);
    const cli_bench_spread sp = cli_bench_spread_sort(plan, (size_t)reps);
    load.end = cli_bench_loadavg();
    printf("bench advise: %s, world %lld, batch %lld x %lld, %d meshes\n", argv[optind], (long long)N,
           (long long)B, (long long)cf.s.co.S, n);
    cli_bench_load_text(&load, 0); /* "  load: ...", as "  advise, per mesh:" has its colon */
    printf("  one plan (the template, with its shard layout): %9.3f ms   (best of %lld; median %.3f, max %.3f)\n",
           sp.min * 1e3, (long long)reps, sp.med * 1e3, sp.max * 1e3);
    printf("  advise, per mesh:                               %9.3f ms   (%.4f of one plan; best of %lld; median %.3f, "
           "max %.3f)\n",
           sm.min * 1e3, sp.min > 0 ? sm.min / sp.min : 0.0, (long long)reps, sm.med * 1e3, sm.max * 1e3);
    return HP_EXIT_OK;
}

static const cli_command *const g_benches[] = {&cli_cmd_bench_moe, &cli_cmd_bench_ep, &cli_cmd_bench_run,
                                                &cli_cmd_bench_train, &cli_cmd_bench_advise, NULL};

const cli_command cli_cmd_bench = {
    .cmd = "bench",
    .summary = "benchmarks, each next to a limit measured in the same run:",
    .run = cmd_bench,
    .subs = g_benches,
};

/* `hyperpar bench NAME ...`: the benchmark of that name; --help is bench moe's (it lists the others). */
int cmd_bench(int argc, char **argv)
{
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        cli_help(stdout, &cli_cmd_bench_moe);
        return HP_EXIT_OK;
    }
    char names[128] = "";
    for (const cli_command *const *b = g_benches; *b; b++) {
        const char *nm = (*b)->name + strlen("bench ");
        if (argc >= 2 && !strcmp(argv[1], nm)) return (*b)->run(argc - 1, argv + 1);
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", names[0] ? ", " : "", nm);
    }
    if (argc < 2) return cli_usage_error("bench", "missing the benchmark name (%s)", names);
    return cli_usage_error("bench", "unknown benchmark '%s'; known: %s", argv[1], names);
}
