/*
 * bench_train.c — `hyperpar bench train --preset P [...]`: the training step (hp_runner_train_step: the forward,
 * the backward with its gradient sums, AdamW) at a real model's layer shapes over the ranks of mpirun, timed, and
 * compared with the dense GEMM rate measured in the same run on the same ranks.
 *
 * bench_run.c parses the options (bench run's, the same table), writes the random checkpoint into a temporary
 * folder removed at the end (also on a signal), derives the plan for the mesh and creates the runner with
 * keep_activations; then it calls cli_bench_train with a fixed batch of ids [B, T] spread over the vocabulary.
 *
 * Per rep (after one warm-up step), one hp_runner_train_step with AdamW at PyTorch's defaults; the figures of a
 * rep are the slowest rank's (max over ranks): the step's wall time between a barrier and the step's return, and
 * hp_run_stats's train_fwd_s, train_bwd_s, train_bwd_comm_s (inside the backward) and train_opt_s. Each figure
 * is the median over reps of its own column, printed with that column's min and max, so the split need not sum
 * exactly to the median step.
 *
 * Model FLOPs per step: 6 · W · B·T (hp_cost_train_flops, src/cost/mfu.c, which says what W counts: the weights
 * one token goes through in the forward's GEMMs, MoE's active experts only; not the attention scores, norms,
 * AdamW or the backward's recomputation, so the figure is model FLOPs, as MFU counts them). Achieved GFLOP/s =
 * model FLOPs / the median step, over all ranks together.
 *
 * The GEMM limit (hp_cost_gemm_limit): every rank at once (after a barrier, so the ranks of one node share its
 * cores as they do in the step) runs an N x N x N f32 product through the GEMM layer (the best of 3 after a
 * warm-up); the limit is the sum over ranks, and the ratio is achieved / that sum. Benchmarks print ratios, never
 * pass/fail; absolute times on a shared machine are noise.
 */
#include <stdlib.h>
#include <string.h>

#include "bench_run.h"
#include "hyperpar/cost.h"

/* Columns of one timed step, each the slowest rank's. */
enum { C_STEP, C_FWD, C_BWD, C_BWD_COMM, C_OPT, C_N };


typedef struct bt_result {
    cli_bench_spread fig[C_N];    /* each column's min, median and max over reps */
    double loss_first, loss_last;
    double flop;                  /* model FLOPs per step, 6 W B T */
    double gemm_rank, gemm_min;   /* GFLOP/s: rank 0's reference GEMM, the slowest rank's */
    double gemm_sum;              /* over all ranks */
    char gemm_impl[128];          /* what ran rank 0's reference GEMM (hp_gemm_limit.impl) */
} bt_result;

/* Warm-up, then reps steps on ids [B, T]; rows[r][C_N] the slowest rank's figures of rep r. */
static hp_status time_steps(const hp_comm *w, hp_runner *r, const int64_t *ids, int64_t B, int64_t T, int reps,
                            double *rows, bt_result *res, hp_err *err)
{
    hp_train_opts o;
    hp_train_opts_default(&o);
    hp_status st = HP_OK;
    for (int k = -1; k < reps && st == HP_OK; k++) {
        double loss = 0;
        if ((st = hp_comm_barrier(w, err))) break;
        double t0 = hp_comm_wtime();
        st = hp_runner_train_step(r, ids, B, T, &o, &loss, err);
        double t = hp_comm_wtime() - t0;
        if ((st = hp_comm_agree(w, st, err))) break;
        if (k < 0) res->loss_first = loss;
        res->loss_last = loss;
        if (k < 0) continue;
        const hp_run_stats *s = hp_runner_stats(r);
        const double fig[C_N] = {t, s->train_fwd_s, s->train_bwd_s, s->train_bwd_comm_s, s->train_opt_s};
        memcpy(rows + k * C_N, fig, sizeof fig);
        st = hp_comm_allreduce_max_f64(w, rows + k * C_N, C_N, err);
    }
    return st;
}

/* The reference GEMM on every rank at once: res's per-rank, slowest-rank and summed rates. */
static hp_status time_gemm(const hp_comm *w, hp_linalg_mode compute, bt_result *res, hp_err *err)
{
    hp_gemm_limit lim;
    hp_status st = hp_cost_gemm_limit(w, CLI_BENCH_GEMM_N, compute, CLI_BENCH_GEMM_REPS, &lim, err);
    res->gemm_rank = lim.rank_gflops;
    res->gemm_min = lim.min_gflops;
    res->gemm_sum = lim.sum_gflops;
    snprintf(res->gemm_impl, sizeof res->gemm_impl, "%s", lim.impl[0] ? lim.impl : "?");
    return st;
}

static double per(double x, double y) { return y > 0 ? x / y : 0.0; }

/* "12.345 ms (min 12.001, max 13.002)": a figure of the split with its spread. */
static const char *ms_spread(const cli_bench_spread *s, char *buf, size_t cap)
{
    snprintf(buf, cap, "%.3f ms (min %.3f, max %.3f)", s->med * 1e3, s->min * 1e3, s->max * 1e3);
    return buf;
}

static void print_text(const cli_bench_args *a, const cli_bench_info *in, const bt_result *r,
                       const cli_torch_eager *pt)
{
    const cli_bench_spread *f = r->fig;
    const double step = f[C_STEP].med, tokens = (double)(a->batch * a->tokens), achieved = per(r->flop, step) * 1e-9;
    char fw[64], bw[64], op[64];
    cli_bench_print_head("train", a, in);
    printf("  optimizer : AdamW, PyTorch's defaults (lr 1e-3, betas 0.9 / 0.999, eps 1e-8, weight decay 0.01), f32 "
           "state; loss %.4f (warm-up step) -> %.4f (last step)\n",
           r->loss_first, r->loss_last);
    printf("  step      : %.3f ms median of %d (min %.3f, max %.3f; slowest rank) -> %.1f training tokens/s (%lld x "
           "%lld per step)\n",
           step * 1e3, in->reps, f[C_STEP].min * 1e3, f[C_STEP].max * 1e3, per(tokens, step), (long long)a->batch,
           (long long)a->tokens);
    printf("  split     : forward %s, backward %s (communication %.3f ms of it: min %.3f, max %.3f), optimizer %s; "
           "sum of the medians %.2f of the step\n",
           ms_spread(&f[C_FWD], fw, sizeof fw), ms_spread(&f[C_BWD], bw, sizeof bw), f[C_BWD_COMM].med * 1e3,
           f[C_BWD_COMM].min * 1e3, f[C_BWD_COMM].max * 1e3, ms_spread(&f[C_OPT], op, sizeof op),
           per(f[C_FWD].med + f[C_BWD].med + f[C_OPT].med, step));
    printf("  model     : 6 x %.4g G weights per token x %.0f tokens = %.4g GFLOP per step -> %.4g GFLOP/s achieved "
           "over all ranks\n",
           in->weights * 1e-9, tokens, r->flop * 1e-9, achieved);
    printf("  gemm      : %.1f GFLOP/s per rank (%s %dx%dx%d through the GEMM layer, rank 0: %s, best of %d, all ranks "
           "at once; slowest rank %.1f), %.1f GFLOP/s over %d rank%s   ratio achieved/gemm %.3f\n",
           r->gemm_rank, a->compute == HP_LINALG_BF16 ? "bf16" : "f32", CLI_BENCH_GEMM_N, CLI_BENCH_GEMM_N,
           CLI_BENCH_GEMM_N, r->gemm_impl, CLI_BENCH_GEMM_REPS, r->gemm_min, r->gemm_sum, in->ranks,
           in->ranks == 1 ? "" : "s", per(achieved, r->gemm_sum));
    cli_bench_torch_text(pt, per(tokens, step), "training tokens/s");
}

static void print_json(const cli_bench_args *a, const cli_bench_info *in, const bt_result *r,
                       const cli_torch_eager *pt)
{
    const cli_bench_spread *f = r->fig;
    const double step = f[C_STEP].med, tokens = (double)(a->batch * a->tokens), achieved = per(r->flop, step) * 1e-9;
    cli_bench_json_head("train", a, in);
    if (a->p->experts > 0)
        printf(", \"moe\": {\"experts\": %lld, \"experts_preset\": %lld, \"top_k\": %lld, \"moe_intermediate\": %lld, "
               "\"sparse_layers\": %lld, \"ep\": %lld, \"overrides\": %d}",
               (long long)a->experts, (long long)a->p->experts, (long long)a->p->top_k, (long long)a->moe_intermediate,
               (long long)in->n_sparse, (long long)a->ep, in->n_overrides);
    printf(", \"optimizer\": \"adamw\", \"loss_first\": %.6g, \"loss_last\": %.6g, \"step_s\": %.6g", r->loss_first,
           r->loss_last, step);
    cli_bench_spread_json("step_", &f[C_STEP]);
    printf(", \"tokens_per_s\": %.6g", per(tokens, step));
    /* the split: each column's median and its spread */
    static const char *const keys[C_N] = {NULL, "forward_", "backward_", "backward_comm_", "optimizer_"};
    for (int c = C_FWD; c < C_N; c++) {
        printf(", \"%ss\": %.6g", keys[c], f[c].med);
        cli_bench_spread_json(keys[c], &f[c]);
    }
    printf(", \"weights_per_token\": %.6g, \"model_gflop\": %.6g, \"achieved_gflops\": %.6g, \"gemm_n\": %d, "
           "\"gemm_gflops_per_rank\": %.6g, \"gemm_gflops_min_rank\": %.6g, \"gemm_gflops\": %.6g, "
           "\"ratio_achieved_over_gemm\": %.6g",
           in->weights, r->flop * 1e-9, achieved, CLI_BENCH_GEMM_N, r->gemm_rank, r->gemm_min, r->gemm_sum,
           per(achieved, r->gemm_sum));
    printf(", \"gemm_impl\": ");
    cli_json_str(r->gemm_impl);
    cli_bench_torch_json(pt, per(tokens, step));
    printf("}\n");
}

hp_status cli_bench_train(const hp_comm *w, hp_runner *r, const int64_t *ids, const cli_bench_args *a,
                          cli_bench_info *in, hp_err *err)
{
    const int reps = (int)a->reps;
    bt_result res = {.flop = in->train_flop};
    double *rows = calloc((size_t)reps * C_N, sizeof *rows);
    hp_status st = hp_comm_agree(w, rows ? HP_OK : hp_err_set(err, HP_ERR_NOMEM, "out of memory"), err);
    if (st == HP_OK) st = time_steps(w, r, ids, a->batch, a->tokens, reps, rows, &res, err);
    if (st == HP_OK) st = time_gemm(w, a->compute, &res, err);
    /* PyTorch after hyperpar's steps and the GEMM: the same batch and checkpoint, the node's cores. */
    cli_torch_eager pt;
    if (st == HP_OK) st = cli_bench_torch(w, a, in, &pt, err);
    in->load.end = cli_bench_loadavg();
    if (st == HP_OK) {
        for (int c = 0; c < C_N; c++) res.fig[c] = cli_bench_spread_col(rows, reps, C_N, c);
        if (hp_comm_rank(w) == 0) {
            if (a->json) print_json(a, in, &res, &pt);
            else print_text(a, in, &res, &pt);
            fflush(stdout);
        }
    }
    free(rows);
    return st;
}
