/*
 * bench_ep.c — `hyperpar bench ep --preset P --tokens T`: one MoE layer at a real model's shapes, its experts
 * spread over every rank of the run (ep = number of ranks), timed phase by phase through hp_moe_ep_forward,
 * and compared with figures measured in the same run on the same communicator:
 *
 *   - dispatch + return exchange time next to a bare hp_comm_alltoallv of exactly the same per-peer byte
 *     counts (forward, then the reverse), same reps; the ratio bare / ep is the figure;
 *   - with --overlap: the same forward without and with overlap, and how much of the shared expert's time
 *     the overlap took off the critical path;
 *   - with --dispatch-chunks C: the same forward in C pipelined chunks (with overlap when --overlap) next to
 *     one chunk, and how much of the row exchange's wait the pipeline removed;
 *   - resident expert bytes per rank next to the whole layer's.
 *
 * Weights are small deterministic values (a hash of the element index), the same on every rank for the
 * router. Times are the slowest rank's (max over ranks) per rep, then the median over reps, printed with the
 * least and the greatest rep; the host's load average at the start and the end goes with them. Only rank 0
 * prints; every failure goes through hp_comm_agree so that no rank is left in a collective.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench_run.h"
#include "cli.h"
#include "hyperpar/moe.h"
#include "hyperpar/plan.h"

typedef struct ep_args {
    const char *preset;
    int64_t tokens, reps, threads, local_experts, chunks;
    double max_gib;
    bool json, overlap, real_router;
} ep_args;

enum { MAX_REPS = CLI_BENCH_MAX_REPS };

static const cli_enum g_router = {NULL, {{"balanced", 0, false}, {"real", 1, false}}}; /* into real_router */

static const cli_opt g_opts[] = {
    {"preset", 'p', "P", "a MoE preset, listed below", 0, NULL, CLI_STR(ep_args, preset)},
    {"tokens", 'T', "T", "local tokens per rank per forward", 0, NULL, CLI_INT(ep_args, tokens, 1, 1 << 20)},
    {"router", 'r', "R", "balanced (default: every rank receives the same rows; benchmark only) or real", 0, NULL,
     CLI_ENUM(ep_args, real_router, g_router)},
    {"reps", 'R', "R", "timed forwards (5)", 0, NULL, CLI_INT(ep_args, reps, 1, MAX_REPS)},
    {"overlap", 'o', NULL, "also run with the shared expert computed during the row exchange", 0, NULL,
     CLI_FLAG(ep_args, overlap)},
    {"dispatch-chunks", 'D', "C", "also run with the tokens exchanged in C pipelined chunks (1..64; with\n"
                                  "--overlap, overlapped too) and compare with one chunk", 0, NULL,
     CLI_INT(ep_args, chunks, 1, 64)},
    {"threads", 't', "N", "BLAS / OpenMP threads per rank (default: OMP_NUM_THREADS when set, else this\n"
                          "process's cores divided by the ranks the launcher started on this node)", 0, NULL,
     CLI_INT(ep_args, threads, 1, 4096)},
    {"max-gib", 'm', "G", "expert weights allowed per rank (6); a preset above it is refused", 0, NULL,
     CLI_POSITIVE(ep_args, max_gib)},
    {"local-experts", 'L', "L", "hold L experts per rank (the layer gets L*N experts; shapes, top-k, shared\n"
                                "expert unchanged) so a preset too large for this machine still runs", 0, NULL,
     CLI_INT(ep_args, local_experts, 1, 1 << 16)},
    {"json", 'j', NULL, "one JSON line instead of text", 0, NULL, CLI_FLAG(ep_args, json)},
    CLI_OPT_HELP,
    {0},
};

static void presets(FILE *out)
{
    fprintf(out, "presets:\n");
    cli_print_presets(out, true);
}

const cli_command cli_cmd_bench_ep = {
    .cmd = "bench",
    .name = "bench ep",
    .summary = "the expert-parallel layer over MPI ranks against a bare all-to-all",
    .forms = {{"mpirun -np N", "--preset --tokens"}},
    .about = "Runs one MoE layer expert-parallel over all N ranks (each holds E/N experts and T local tokens) and\n"
             "prints the dispatch + return exchange time next to a bare all-to-all of the same bytes measured in\n"
             "the same run (ratio), bytes moved, resident expert bytes per rank and, with --overlap, the share of\n"
             "the shared expert's time hidden behind the exchange. Also runs as one process without mpirun. The\n"
             "forward, the exchange and the bare all-to-all are printed with the least and the greatest of their reps\n"
             "(JSON: each phase's and the bare exchange's X_s with X_min_s and X_max_s, and the forward totals of\n"
             "overlap and chunks), and the host's 1-minute load average at the start and the end (load_start,\n"
             "load_end).\n",
    .opts = g_opts,
    .epilog_more = presets,
    .run = cmd_bench_ep,
};

/* Deterministic value in [-a, a) for element i of stream seed (splitmix64 finaliser). */
static inline float hval(uint64_t i, uint64_t seed, float a)
{
    uint64_t z = i + seed * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return a * ((float)(z >> 40) / (float)(1u << 23) - 1.0f);
}

static void fill(float *dst, int64_t n, uint64_t seed, float a)
{
    for (int64_t i = 0; i < n; i++) dst[i] = hval((uint64_t)i, seed, a);
}

/* PH_COMM_LAST: dispatch + return of the rank that reached each exchange last (min over ranks per phase),
 * i.e. the exchange itself without the wait for a slower rank's routing or experts, which the slowest-rank
 * figures (max over ranks) include. */
enum { PH_ROUTE, PH_DISPATCH, PH_EXPERTS, PH_RETURN, PH_COMBINE, PH_SHARED, PH_WAIT, PH_COMM, PH_TOTAL, PH_COMM_LAST,
       PH_N };
static const char *const g_ph_names[PH_N] = {"route", "dispatch", "experts", "return", "combine",
                                              "shared", "wait", "comm", "total", "comm_last"};

/* Warm-up, then reps forwards; med[PH_N] gets the median over reps of the slowest rank's phase times, spread[PH_N]
 * their min, median and max. */
static hp_status time_forward(hp_comm *c, hp_moe_ep *ep, const float *x, int64_t T, float *y,
                              const hp_moe_run_opts *ro, bool overlap, int chunks, int reps, double *med,
                              cli_bench_spread *spread, hp_err *err)
{
    double rows[MAX_REPS * PH_N];
    hp_status st = hp_moe_ep_forward_chunks(ep, x, T, y, ro, overlap, chunks, err);
    if ((st = hp_comm_agree(c, st, err))) return st;
    for (int r = 0; r < reps; r++) {
        if ((st = hp_comm_barrier(c, err))) return st;
        double t0 = hp_comm_wtime();
        st = hp_moe_ep_forward_chunks(ep, x, T, y, ro, overlap, chunks, err);
        double t = hp_comm_wtime() - t0;
        if ((st = hp_comm_agree(c, st, err))) return st;
        const hp_moe_ep_stats *s = hp_moe_ep_get_stats(ep);
        double *v = rows + r * PH_N;
        v[PH_ROUTE] = s->t_route;
        v[PH_DISPATCH] = s->t_dispatch;
        v[PH_EXPERTS] = s->t_experts;
        v[PH_RETURN] = s->t_return;
        v[PH_COMBINE] = s->t_combine;
        v[PH_SHARED] = s->t_shared;
        v[PH_WAIT] = s->t_wait;
        v[PH_COMM] = s->t_dispatch + s->t_return;
        v[PH_TOTAL] = t;
        double mn[2] = {-s->t_dispatch, -s->t_return};
        if ((st = hp_comm_allreduce_max_f64(c, v, PH_COMM_LAST, err))) return st;
        if ((st = hp_comm_allreduce_max_f64(c, mn, 2, err))) return st;
        v[PH_COMM_LAST] = -mn[0] - mn[1];
    }
    for (int k = 0; k < PH_N; k++) {
        spread[k] = cli_bench_spread_col(rows, reps, PH_N, k);
        med[k] = spread[k].med;
    }
    return HP_OK;
}

/* The bare baseline: the forward exchange's per-peer byte counts (from the routing of the last forward),
 * exchanged with hp_comm_alltoallv there and back, warm-up then reps; spread[0] the slowest-rank time over the
 * reps, spread[1] (min over ranks of each exchange) summed, as PH_COMM_LAST; *bytes this rank's bytes sent in both
 * directions. */
static hp_status time_bare(hp_comm *c, const hp_moe_ep *ep, const hp_moe_layer *l, int64_t T, int reps,
                           cli_bench_spread *spread, double *bytes, hp_err *err)
{
    const int P = hp_comm_size(c);
    const hp_moe_ws *ws = hp_moe_ep_ws(ep);
    const int64_t K = l->top_k, L = l->n_local;
    const size_t row = (size_t)l->n_hidden * sizeof(float);
    size_t *cnt = calloc(4 * (size_t)P, sizeof *cnt), *sc = cnt, *sd = cnt + P, *rc = cnt + 2 * P, *rd = cnt + 3 * P;
    hp_status st = hp_comm_agree(c, cnt ? HP_OK : hp_err_set(err, HP_ERR_NOMEM, "out of memory"), err);
    if (st) {
        free(cnt);
        return st;
    }
    for (int64_t s = 0; s < T * K; s++) sc[ws->topk_idx[s] / L] += row;
    st = hp_comm_alltoall(c, sc, sizeof(size_t), rc, err);
    size_t so = 0, ro = 0;
    for (int p = 0; p < P; p++) {
        sd[p] = so;
        rd[p] = ro;
        so += sc[p];
        ro += rc[p];
    }
    *bytes = (double)(so + ro);
    char *sbuf = NULL, *rbuf = NULL;
    if (st == HP_OK && (!(sbuf = malloc(so ? so : 1)) || !(rbuf = malloc(ro ? ro : 1))))
        st = hp_err_set(err, HP_ERR_NOMEM, "out of memory for the bare all-to-all buffers");
    if (sbuf) memset(sbuf, 1, so);
    if (rbuf) memset(rbuf, 2, ro);
    double t[MAX_REPS * 2];
    for (int r = -1; r < reps; r++) {
        if ((st = hp_comm_agree(c, st, err))) break;
        if ((st = hp_comm_barrier(c, err))) break;
        double t0 = hp_comm_wtime();
        st = hp_comm_alltoallv(c, sbuf, sc, sd, rbuf, rc, rd, err);
        double t1 = hp_comm_wtime();
        if (st == HP_OK) st = hp_comm_alltoallv(c, rbuf, rc, rd, sbuf, sc, sd, err);
        double t2 = hp_comm_wtime(), dt[3] = {t2 - t0, -(t1 - t0), -(t2 - t1)};
        if (st == HP_OK) st = hp_comm_allreduce_max_f64(c, dt, 3, err);
        if (r >= 0) {
            t[2 * r] = dt[0];
            t[2 * r + 1] = -dt[1] - dt[2];
        }
    }
    if (st == HP_OK) {
        spread[0] = cli_bench_spread_col(t, reps, 2, 0);
        spread[1] = cli_bench_spread_col(t, reps, 2, 1);
    }
    free(sbuf);
    free(rbuf);
    free(cnt);
    return st;
}

static double clamp01(double v) { return v < 0 ? 0 : v > 1 ? 1 : v; }

/* Overlap figures from the row-exchange wait: without overlap the wait is the whole exchange; with it, what
 * is left after the shared expert. The difference ran under the shared expert's compute. */
static double hidden_shared(const double *no, const double *ov)
{
    return no[PH_SHARED] > 0 ? clamp01((no[PH_WAIT] - ov[PH_WAIT]) / no[PH_SHARED]) : 0;
}
static double hidden_exchange(const double *no, const double *ov)
{
    return no[PH_WAIT] > 0 ? clamp01(1 - ov[PH_WAIT] / no[PH_WAIT]) : 0;
}

typedef struct ep_result {
    double ph[PH_N], ph_ov[PH_N], ph_ch[PH_N];            /* medians: one forward, with overlap, chunked */
    cli_bench_spread sp[PH_N], sp_ov[PH_N], sp_ch[PH_N];  /* the same with their min and max over the reps */
    cli_bench_spread bare[2];                             /* time_bare's: the slowest rank's, the last-in */
    double bytes_ep, bytes_bare, resident, layer_bytes;
    double rows_recv_max, rows_recv_min;
    cli_bench_load load;
} ep_result;

static void print_text(const ep_args *a, const char *name, hp_moe_archetype arch, const hp_moe_layer *l, int P,
                       int64_t E_preset, const char *backend, const char *blas, int threads, int reps,
                       const ep_result *r)
{
    const double *ph = r->ph, bare = r->bare[0].med, bare_last = r->bare[1].med;
    const cli_bench_spread *fw = &r->sp[PH_TOTAL], *ex = &r->sp[PH_COMM], *bs = &r->bare[0];
    char b1[32], b2[32];
    printf("bench ep: %s (%s) H %lld, E %lld, K %lld, I %lld%s; %lld tokens per rank, %d rank%s\n", name,
           hp_moe_archetype_name(arch), (long long)l->n_hidden, (long long)E_preset, (long long)l->top_k,
           (long long)l->d_expert, l->d_shared ? ", shared expert" : "", (long long)a->tokens, P, P == 1 ? "" : "s");
    printf("  comm     : %s, ep = %d (EP group = all ranks)\n", backend, P);
    printf("  BLAS     : %s, %d thread%s per rank\n", blas, threads, threads == 1 ? "" : "s");
    cli_bench_load_text(&r->load, 9);
    if (l->n_experts != E_preset)
        printf("  experts  : %lld per rank (--local-experts): the layer has %lld experts instead of %lld; shapes, top-k "
               "and shared expert unchanged\n",
               (long long)l->n_local, (long long)l->n_experts, (long long)E_preset);
    printf("  router   : %s; rows received per rank %.0f..%.0f\n",
           a->real_router ? "real (archetype router, deterministic weights)"
                          : "balanced (benchmark only: every rank receives the same number of rows)",
           r->rows_recv_min, r->rows_recv_max);
    printf("  phases   : median of %d, slowest rank, ms: route %.3f, dispatch %.3f, experts %.3f, return %.3f, "
           "combine %.3f, shared %.3f; forward %.3f (min %.3f, max %.3f)\n",
           reps, ph[PH_ROUTE] * 1e3, ph[PH_DISPATCH] * 1e3, ph[PH_EXPERTS] * 1e3, ph[PH_RETURN] * 1e3,
           ph[PH_COMBINE] * 1e3, ph[PH_SHARED] * 1e3, fw->med * 1e3, fw->min * 1e3, fw->max * 1e3);
    printf("  exchange : dispatch + return %.3f ms (min %.3f, max %.3f), %s, %.2f GB/s\n", ex->med * 1e3,
           ex->min * 1e3, ex->max * 1e3, hp_format_bytes((uint64_t)r->bytes_ep, b1, sizeof b1),
           r->bytes_ep / ex->med * 1e-9);
    printf("  bare     : alltoallv there and back %.3f ms (min %.3f, max %.3f), %s, %.2f GB/s (same bytes, same run)   "
           "ratio bare/ep %.2f\n",
           bare * 1e3, bs->min * 1e3, bs->max * 1e3, hp_format_bytes((uint64_t)r->bytes_bare, b2, sizeof b2),
           r->bytes_bare / bare * 1e-9, bare / ex->med);
    printf("  last in  : the rank reaching each exchange last (no wait for a slower rank's experts): ep %.3f ms, "
           "bare %.3f ms   ratio bare/ep %.2f\n",
           ph[PH_COMM_LAST] * 1e3, bare_last * 1e3, bare_last / ph[PH_COMM_LAST]);
    printf("  resident : %s of experts per rank, layer %s   ratio %.4f (1/ep = %.4f)",
           hp_format_bytes((uint64_t)r->resident, b1, sizeof b1), hp_format_bytes((uint64_t)r->layer_bytes, b2, sizeof b2),
           r->resident / r->layer_bytes, 1.0 / P);
    if (l->n_experts != E_preset)
        printf("; the real layer is %s", hp_format_bytes((uint64_t)(r->layer_bytes / (double)l->n_experts *
                                                                    (double)E_preset), b2, sizeof b2));
    printf("\n");
    if (a->chunks > 1) {
        /* Like for like: with --overlap both runs overlap the shared expert. */
        const double *one = a->overlap ? r->ph_ov : ph, *ch = r->ph_ch;
        printf("  chunks   : %lld dispatch chunks%s: forward %.3f ms vs %.3f ms in one chunk   ratio one/chunked "
               "%.2f\n"
               "             row exchange wait %.3f ms vs %.3f ms (%.2f of it removed); dispatch + return %.3f ms vs "
               "%.3f ms, experts %.3f ms vs %.3f ms\n",
               (long long)a->chunks, a->overlap ? " with overlap" : "", ch[PH_TOTAL] * 1e3, one[PH_TOTAL] * 1e3,
               one[PH_TOTAL] / ch[PH_TOTAL], ch[PH_WAIT] * 1e3, one[PH_WAIT] * 1e3, hidden_exchange(one, ch),
               ch[PH_COMM] * 1e3, one[PH_COMM] * 1e3, ch[PH_EXPERTS] * 1e3, one[PH_EXPERTS] * 1e3);
    }
    if (!a->overlap) return;
    if (!l->d_shared) {
        printf("  overlap  : %s has no shared expert: overlap has nothing to hide (forward %.3f ms without, %.3f ms "
               "with)\n",
               name, ph[PH_TOTAL] * 1e3, r->ph_ov[PH_TOTAL] * 1e3);
        return;
    }
    const double *ov = r->ph_ov;
    printf("  overlap  : row exchange wait %.3f ms without, %.3f ms after the shared expert with; shared expert "
           "%.3f ms; forward %.3f ms without, %.3f ms with\n",
           ph[PH_WAIT] * 1e3, ov[PH_WAIT] * 1e3, ph[PH_SHARED] * 1e3, ph[PH_TOTAL] * 1e3, ov[PH_TOTAL] * 1e3);
    printf("             hidden: %.2f of the shared expert's time (at most %.2f: only the row exchange can hide "
           "it), %.2f of the row exchange; from the forward totals %.2f (noisier: it holds the experts' jitter)\n",
           hidden_shared(ph, ov), clamp01(ph[PH_WAIT] / ph[PH_SHARED]), hidden_exchange(ph, ov),
           clamp01((ph[PH_TOTAL] - ov[PH_TOTAL]) / ph[PH_SHARED]));
}

static void print_json(const ep_args *a, const char *name, hp_moe_archetype arch, const hp_moe_layer *l, int P,
                       int64_t E_preset, const char *backend, const char *blas, int threads, int reps,
                       const ep_result *r)
{
    printf("{\"bench\": \"ep\", \"preset\": \"%s\", \"archetype\": \"%s\", \"ranks\": %d, \"ep\": %d, \"backend\": "
           "\"%s\", \"blas\": \"%s\", \"threads\": %d, \"tokens_per_rank\": %lld, \"router\": \"%s\", \"reps\": %d, "
           "\"experts\": %lld, \"experts_preset\": %lld, \"local_experts\": %lld, \"rows_recv_max\": %.0f",
           name, hp_moe_archetype_name(arch), P, P, backend, blas, threads, (long long)a->tokens,
           a->real_router ? "real" : "balanced", reps, (long long)l->n_experts, (long long)E_preset,
           (long long)l->n_local, r->rows_recv_max);
    cli_bench_load_json(&r->load);
    char key[32];
    for (int k = 0; k < PH_N; k++) {
        printf(", \"%s_s\": %.6g", g_ph_names[k], r->ph[k]);
        snprintf(key, sizeof key, "%s_", g_ph_names[k]);
        cli_bench_spread_json(key, &r->sp[k]);
    }
    const double bare = r->bare[0].med, bare_last = r->bare[1].med;
    printf(", \"bytes\": %.0f, \"ep_gbps\": %.6g, \"bare_s\": %.6g", r->bytes_ep, r->bytes_ep / r->ph[PH_COMM] * 1e-9,
           bare);
    cli_bench_spread_json("bare_", &r->bare[0]);
    printf(", \"bare_bytes\": %.0f, \"bare_gbps\": %.6g, \"ratio_bare_over_ep\": %.4f, \"bare_last_s\": %.6g",
           r->bytes_bare, r->bytes_bare / bare * 1e-9, bare / r->ph[PH_COMM], bare_last);
    cli_bench_spread_json("bare_last_", &r->bare[1]);
    printf(", \"ratio_last_bare_over_ep\": %.4f, \"resident_expert_bytes\": %.0f, \"layer_expert_bytes\": %.0f, "
           "\"resident_ratio\": %.6f",
           bare_last / r->ph[PH_COMM_LAST], r->resident, r->layer_bytes, r->resident / r->layer_bytes);
    if (a->overlap) {
        printf(", \"overlap\": {\"shared_expert\": %s, \"total_no_overlap_s\": %.6g, \"total_overlap_s\": %.6g",
               l->d_shared ? "true" : "false", r->ph[PH_TOTAL], r->ph_ov[PH_TOTAL]);
        cli_bench_spread_json("total_overlap_", &r->sp_ov[PH_TOTAL]);
        printf(", \"shared_s\": %.6g, \"wait_no_overlap_s\": %.6g, \"wait_overlap_s\": %.6g", r->ph[PH_SHARED],
               r->ph[PH_WAIT], r->ph_ov[PH_WAIT]);
        if (l->d_shared)
            printf(", \"hidden_of_shared\": %.4f, \"hidden_bound\": %.4f, \"hidden_of_exchange\": %.4f, "
                   "\"hidden_of_shared_from_totals\": %.4f",
                   hidden_shared(r->ph, r->ph_ov), clamp01(r->ph[PH_WAIT] / r->ph[PH_SHARED]),
                   hidden_exchange(r->ph, r->ph_ov),
                   clamp01((r->ph[PH_TOTAL] - r->ph_ov[PH_TOTAL]) / r->ph[PH_SHARED]));
        printf("}");
    }
    if (a->chunks > 1) {
        const double *one = a->overlap ? r->ph_ov : r->ph, *ch = r->ph_ch;
        printf(", \"chunks\": {\"n\": %lld, \"overlap\": %s, \"total_s\": %.6g", (long long)a->chunks,
               a->overlap ? "true" : "false", ch[PH_TOTAL]);
        cli_bench_spread_json("total_", &r->sp_ch[PH_TOTAL]);
        printf(", \"total_one_s\": %.6g, \"ratio_one_over_chunked\": %.4f, \"wait_s\": %.6g, \"wait_one_s\": %.6g, "
               "\"wait_removed\": %.4f, \"comm_s\": %.6g, \"comm_one_s\": %.6g, \"experts_s\": %.6g, "
               "\"experts_one_s\": %.6g}",
               one[PH_TOTAL], one[PH_TOTAL] / ch[PH_TOTAL], ch[PH_WAIT], one[PH_WAIT], hidden_exchange(one, ch),
               ch[PH_COMM], one[PH_COMM], ch[PH_EXPERTS], one[PH_EXPERTS]);
    }
    printf("}\n");
}

static int run(const ep_args *a, hp_moe_archetype arch, const hp_moe_dims *pd, int *argc, char ***argv)
{
    const double load_start = cli_bench_loadavg(); /* before any work, MPI's start included */
    hp_err err;
    hp_err_clear(&err);
    hp_comm *c = NULL;
    if (hp_comm_world(&c, argc, argv, &err) != HP_OK) return cli_fail(&err);
    const int P = hp_comm_size(c), R = hp_comm_rank(c);
    hp_moe_layer *l = NULL;
    hp_moe_ep *ep = NULL;
    float *x = NULL, *y = NULL;
    ep_result res = {.load = {load_start, -1}};
    hp_status st = HP_OK;
    const int64_t H = pd->n_hidden, I = pd->d_expert, T = a->tokens, reps = a->reps ? a->reps : 5;
    int threads = cli_threads(NULL, a->threads, NULL);

    /* The layer this rank holds: experts [R*L, (R+1)*L). */
    hp_moe_dims d = *pd;
    int64_t L = a->local_experts ? a->local_experts : pd->n_experts / P;
    if (a->local_experts) {
        d.n_experts = L * P;
        /* Group-limited routing needs E % n_group == 0 and enough experts in the kept groups. */
        if (d.n_group > 1 && (d.n_experts % d.n_group || d.topk_group * (d.n_experts / d.n_group) < d.top_k))
            d.n_group = d.topk_group = 1;
    } else if (pd->n_experts % P)
        st = hp_err_set(&err, HP_ERR_INPUT, "%s has %lld experts, which %d ranks cannot share evenly; run with a "
                        "number of ranks that divides it", a->preset, (long long)pd->n_experts, P);
    double local_gib = (double)L * 3.0 * (double)H * (double)I * 4.0 / (double)(1u << 30);
    if (st == HP_OK && local_gib > a->max_gib)
        st = hp_err_set(&err, HP_ERR_INPUT,
                        "%s over %d rank%s puts %lld experts (%.1f GiB of f32 weights) on each rank, above --max-gib "
                        "%.1f; run more ranks, raise --max-gib if the machine has the memory, or hold fewer experts "
                        "per rank with --local-experts (e.g. --local-experts 8)",
                        a->preset, P, P == 1 ? "" : "s", (long long)L, local_gib, a->max_gib);
    if (st == HP_OK && d.top_k > d.n_experts)
        st = hp_err_set(&err, HP_ERR_INPUT, "--local-experts %lld over %d rank(s) gives %lld experts, fewer than top-k %lld",
                        (long long)L, P, (long long)d.n_experts, (long long)d.top_k);
    if ((st = hp_comm_agree(c, st, &err))) goto done;
    hp_ep_local_experts(d.n_experts, P, R, &d.first_expert, &d.n_local); /* the one rule for every EP slot */
    st = hp_moe_layer_create(&l, arch, &d, &err);
    if (st == HP_OK) {
        float gu = 1.0f / sqrtf((float)H), dn = 1.0f / sqrtf((float)I);
        for (int64_t e = 0; e < L; e++) {
            uint64_t g = (uint64_t)(R * L + e);
            fill((float *)l->w_gate_up + e * 2 * I * H, 2 * I * H, 1000 + 2 * g, gu);
            fill((float *)l->w_down + e * H * I, H * I, 1001 + 2 * g, dn);
        }
        for (int64_t i = 0; i < d.n_experts * H; i++) l->w_router[i] = hval((uint64_t)i, 7, gu);
        if (l->b_gate_up) fill((float *)l->b_gate_up, L * 2 * I, 11 + (uint64_t)R, 0.1f);
        if (l->b_down) fill((float *)l->b_down, L * H, 13 + (uint64_t)R, 0.1f);
        if (l->ws_gate_up) {
            fill(l->ws_gate_up, 2 * d.d_shared * H, 17, gu);
            fill(l->ws_down, d.d_shared * H, 19, 1.0f / sqrtf((float)d.d_shared));
        }
        if (l->ws_gate) fill(l->ws_gate, H, 23, gu);
        if (!(x = malloc((size_t)(T * H) * sizeof *x)) || !(y = malloc((size_t)(T * H) * sizeof *y)))
            st = hp_err_set(&err, HP_ERR_NOMEM, "out of memory for %lld tokens", (long long)T);
        else fill(x, T * H, 5000 + (uint64_t)R, 1.0f);
    }
    /* With chunks the creation is a collective: agree first so that every rank reaches it. */
    if ((st = hp_comm_agree(c, st, &err))) goto done;
    st = hp_moe_ep_create_chunked(&ep, l, c, T, (int)a->chunks, &err);
    if ((st = hp_comm_agree(c, st, &err))) goto done;

    hp_moe_run_opts ro = {.balanced_router = !a->real_router};
    if ((st = time_forward(c, ep, x, T, y, &ro, false, 1, (int)reps, res.ph, res.sp, &err))) goto done;
    const hp_moe_ep_stats *s = hp_moe_ep_get_stats(ep);
    double agg[3] = {(double)s->bytes_exchanged, (double)hp_moe_layer_expert_bytes(l), 0};
    double rr[2] = {(double)s->rows_recv, -(double)s->rows_recv};
    if ((st = hp_comm_allreduce_sum_f64(c, agg, 1, &err))) goto done;
    if ((st = hp_comm_allreduce_max_f64(c, rr, 2, &err))) goto done;
    res.bytes_ep = agg[0];
    res.resident = agg[1];
    res.rows_recv_max = rr[0];
    res.rows_recv_min = -rr[1];
    res.layer_bytes = (double)d.n_experts * 3.0 * (double)H * (double)I * 4.0;
    if ((st = time_bare(c, ep, l, T, (int)reps, res.bare, &agg[2], &err))) goto done;
    if ((st = hp_comm_allreduce_sum_f64(c, &agg[2], 1, &err))) goto done;
    res.bytes_bare = agg[2];
    if (a->overlap && (st = time_forward(c, ep, x, T, y, &ro, true, 1, (int)reps, res.ph_ov, res.sp_ov, &err)))
        goto done;
    if (a->chunks > 1 &&
        (st = time_forward(c, ep, x, T, y, &ro, a->overlap, (int)a->chunks, (int)reps, res.ph_ch, res.sp_ch, &err)))
        goto done;

    res.load.end = cli_bench_loadavg();
    if (R == 0) {
        char blas[256];
        hp_moe_blas_info(blas, sizeof blas);
        if (a->json)
            print_json(a, a->preset, arch, l, P, pd->n_experts, hp_comm_backend(c), blas, threads, (int)reps, &res);
        else
            print_text(a, a->preset, arch, l, P, pd->n_experts, hp_comm_backend(c), blas, threads, (int)reps, &res);
        fflush(stdout);
    }
done:
    free(x);
    free(y);
    hp_moe_ep_destroy(ep);
    hp_moe_layer_free(l);
    int code = cli_collective_exit(c, st, &err, true); /* every failure above is agreed by all ranks */
    hp_comm_free(c);
    return code;
}

int cmd_bench_ep(int argc, char **argv)
{
    ep_args a = {.max_gib = 6.0};
    cli_parser cp = {.command = &cli_cmd_bench_ep};
    int prc = cli_parse(&cp, &a, argc, argv);
    if (prc != HP_EXIT_OK) return prc == CLI_HELP ? HP_EXIT_OK : prc;
    if (optind != argc) return cli_usage_error("bench", "unexpected argument '%s'", argv[optind]);
    const cli_preset *p = cli_preset_arg("bench", a.preset, true);
    if (!p) return HP_EXIT_USAGE;
    if (!a.tokens) return cli_usage_error("bench", "missing --tokens T");
    hp_moe_dims d = cli_preset_moe_dims(p);
    return run(&a, p->archetype, &d, &argc, &argv);
}
