/*
 * bench_decode.c — `hyperpar bench run --decode N`: generation's decode step (docs/generate.md) timed in the same
 * run as its limits. The prompt batch [B, T] fills the KV cache (prefill), then N steps of one token per row run
 * over it (hp_runner_forward_at); each step reads every weight the rank holds and the cache once, so its floor is
 * those bytes over the memory bandwidth, measured here by the read sweep (hp_moe_ref_read_gbps). hyperpar cost
 * --mode decode predicts the step from the same bytes (its read_bytes at the mid-point context, with the measured
 * bandwidth and hyperpar's f32 cache), and PyTorch's generate runs the same checkpoint and batch.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_run.h"
#include "hyperpar/cost.h"
#include "hyperpar/moe.h"

typedef struct dec_result {
    cli_bench_spread prefill, step;               /* over the reps' prefills; over every decode step of every rep */
    double read_gbps;                             /* the read sweep, best of reps */
    uint64_t kv_bytes, weight_bytes;              /* rank 0's */
    uint64_t pred_read;                           /* cost --mode decode: rank 0's read_bytes at the mid context */
    double pred_step;                             /* and its step time with the measured bandwidth */
    char cost_note[256];
} dec_result;

/* reps × (a prefill of ids [B, T], then N one-token steps); the step times of every rep pooled. */
static hp_status time_decode(const hp_comm *w, hp_runner *r, const int64_t *ids, const cli_bench_args *a,
                             dec_result *d, hp_err *err)
{
    int64_t B = a->batch, T = a->tokens, N = a->decode, reps = a->reps;
    double *pre = calloc((size_t)reps + 1, sizeof *pre), *steps = calloc((size_t)(reps * N) + 1, sizeof *steps);
    int64_t *tok = calloc((size_t)B + 1, sizeof *tok);
    hp_status st = pre && steps && tok ? HP_OK : hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    hp_run_output o = {0};
    for (int64_t k = -1; k < reps && st == HP_OK; k++) { /* k = -1: the warm-up */
        double t0 = hp_comm_wtime();
        st = hp_runner_forward_at(r, ids, B, T, 0, &o, err);
        hp_runner_recycle_output(r, &o);
        if (k >= 0) pre[k] = hp_comm_wtime() - t0;
        for (int64_t s = 0; s < N && st == HP_OK; s++) {
            for (int64_t b = 0; b < B; b++) tok[b] = ids[(b * T + s) % (B * T)]; /* any ids: the work is the same */
            double t1 = hp_comm_wtime();
            st = hp_runner_forward_at(r, tok, B, 1, T + s, &o, err);
            hp_runner_recycle_output(r, &o);
            if (k >= 0) steps[k * N + s] = hp_comm_wtime() - t1;
        }
    }
    st = hp_comm_agree(w, st, err);
    if (st == HP_OK) {
        d->prefill = cli_bench_spread_sort(pre, (size_t)reps);
        d->step = cli_bench_spread_sort(steps, (size_t)(reps * N));
        const hp_run_stats *s = hp_runner_stats(r);
        d->kv_bytes = s->kv_bytes;
        d->weight_bytes = s->resident_bytes;
    }
    free(pre), free(steps), free(tok);
    return st;
}

/* cost --mode decode on this plan: B sequences at the mid-point context, hyperpar's f32 cache, the measured
 * bandwidth. */
static void predict(const hp_model *m, const hp_plan *p, const cli_bench_args *a, dec_result *d)
{
    hp_cost_opts o;
    hp_cost_opts_default(&o);
    o.B = a->batch, o.S = 1, o.decode = true, o.context = a->tokens + a->decode / 2;
    o.mdl.kv_bytes = 4;
    o.mdl.mem_bw = d->read_gbps * 1e9;
    hp_cost *c = NULL;
    hp_err err;
    if (hp_cost_compute(&c, m, p, &o, &err) != HP_OK || !c->n_ranks) {
        snprintf(d->cost_note, sizeof d->cost_note, "cost --mode decode: %.200s", c ? c->refused : err.msg);
        hp_cost_free(c);
        return;
    }
    d->pred_read = c->ranks[0].read_bytes;
    d->pred_step = c->ranks[0].t_step;
    hp_cost_free(c);
}

static void print_text(const cli_bench_args *a, const cli_bench_info *in, const dec_result *d,
                       const cli_torch_eager *pt)
{
    cli_bench_print_head("decode", a, in);
    double tps = (double)a->batch / d->step.med, mid = (double)a->tokens + (double)a->decode / 2;
    /* the bytes a step reads: cost's (the weights a token goes through and the filled cache at the mid-point) */
    double read = d->pred_read ? (double)d->pred_read : (double)(d->weight_bytes + d->kv_bytes);
    double floor_s = read / (d->read_gbps * 1e9);
    printf("  prefill   : %lld x %lld tokens in %.3f ms (median of %lld; min %.3f, max %.3f)\n", (long long)a->batch,
           (long long)a->tokens, d->prefill.med * 1e3, (long long)a->reps, d->prefill.min * 1e3,
           d->prefill.max * 1e3);
    printf("  decode    : %.3f ms per step median (min %.3f, max %.3f; %lld steps x %lld reps) -> %.1f tokens/s\n",
           d->step.med * 1e3, d->step.min * 1e3, d->step.max * 1e3, (long long)a->decode, (long long)a->reps, tps);
    printf("  read      : %.2f MiB per step at context %.0f (%s; weights held %.2f MiB, KV cache %.2f MiB)\n",
           read / 1048576.0, mid, d->pred_read ? "cost --mode decode's read_bytes" : "weights + the whole cache",
           (double)d->weight_bytes / 1048576.0, (double)d->kv_bytes / 1048576.0);
    printf("  limit     : read sweep %.1f GB/s (%zu MiB, best of %lld) -> %.3f ms per step; decode at %.2f of it\n",
           d->read_gbps, CLI_BENCH_SWEEP_BYTES >> 20, (long long)a->reps, floor_s * 1e3, floor_s / d->step.med);
    if (d->cost_note[0]) printf("  %s\n", d->cost_note);
    else
        printf("  cost      : --mode decode predicts %.3f ms per step at the measured bandwidth (measured/predicted "
               "%.2f)\n", d->pred_step * 1e3, d->step.med / d->pred_step);
    cli_bench_torch_text(pt, tps, "tokens/s (generate, decode steps)");
}

static void print_json(const cli_bench_args *a, const cli_bench_info *in, const dec_result *d,
                       const cli_torch_eager *pt)
{
    cli_bench_json_head("decode", a, in);
    double tps = (double)a->batch / d->step.med;
    printf(", \"decode\": {\"new_tokens\": %lld, \"prefill_s\": %.6g", (long long)a->decode, d->prefill.med);
    cli_bench_spread_json("prefill_", &d->prefill);
    printf(", \"step_s\": %.6g", d->step.med);
    cli_bench_spread_json("step_", &d->step);
    printf(", \"tokens_per_s\": %.6g, \"weight_bytes\": %llu, \"kv_bytes\": %llu, \"read_gbps\": %.6g, "
           "\"cost_read_bytes\": %llu, \"cost_step_s\": %.6g}",
           tps,
           (unsigned long long)d->weight_bytes, (unsigned long long)d->kv_bytes, d->read_gbps,
           (unsigned long long)d->pred_read, d->pred_step);
    cli_bench_torch_json(pt, tps);
    printf("}\n");
}

hp_status cli_bench_decode(const hp_comm *w, hp_runner *r, const hp_model *m, const hp_plan *p, const int64_t *ids,
                           const cli_bench_args *a, cli_bench_info *in, hp_err *err)
{
    dec_result d = {0};
    hp_status st = time_decode(w, r, ids, a, &d, err);
    if (st != HP_OK) return st;
    d.read_gbps = hp_moe_ref_read_gbps(CLI_BENCH_SWEEP_BYTES, (int)a->reps);
    if (hp_comm_rank(w) == 0 && d.read_gbps > 0) predict(m, p, a, &d);
    cli_torch_eager pt;
    if ((st = cli_bench_torch(w, a, in, &pt, err)) != HP_OK) return st;
    in->load.end = cli_bench_loadavg();
    if (hp_comm_rank(w) == 0) {
        if (d.read_gbps <= 0) return hp_err_set(err, HP_ERR_NOMEM, "out of memory for the read sweep");
        if (a->json) print_json(a, in, &d, &pt);
        else print_text(a, in, &d, &pt);
        fflush(stdout);
    }
    return HP_OK;
}
