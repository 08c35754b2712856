/*
 * schedule.c — the pipeline schedules: which forward and backward each stage runs next (docs/pipeline.md). The one
 * statement of each schedule: the training runtime walks these lists, cost counts what they keep in flight and
 * simulates their timeline for the bubble.
 */
#include "plan/planner_int.h"

#include <stdlib.h>
#include <string.h>

static const char *const g_names[] = {"1f1b", "gpipe", "interleaved"};

const char *hp_pp_sched_name(hp_pp_sched k)
{
    return (unsigned)k < sizeof g_names / sizeof *g_names ? g_names[k] : "?";
}

bool hp_pp_sched_parse(const char *s, hp_pp_sched *k)
{
    for (size_t i = 0; s && i < sizeof g_names / sizeof *g_names; i++)
        if (!strcmp(s, g_names[i])) {
            *k = (hp_pp_sched)i;
            return true;
        }
    return false;
}

hp_pp_sched hp_pp_sched_default(const hp_pipeline *q)
{
    return q->virt > 1 ? HP_PP_INTERLEAVED : HP_PP_1F1B;
}

hp_status hp_pp_sched_check(const hp_pipeline *q, hp_pp_sched k, int64_t m, hp_err *err)
{
    if (m < 1) return hp_err_set(err, HP_ERR_INPUT, "a pipeline step needs at least one micro-batch (got %lld)", (long long)m);
    /* every stage's list is held (and cost simulates them all): a bound on the operations of a step */
    if (m > HP_PP_MAX_OPS / (2 * q->virt * q->pp))
        return hp_err_set(err, HP_ERR_INPUT, "%lld micro-batches over pp=%lld x %lld virtual stages is more than a "
                          "pipeline step schedules (at most %lld operations over all stages); use larger "
                          "micro-batches", (long long)m, (long long)q->pp, (long long)q->virt, (long long)HP_PP_MAX_OPS);
    if (k == HP_PP_INTERLEAVED) {
        if (q->virt < 2)
            return hp_err_set(err, HP_ERR_INPUT, "--pp-schedule interleaved runs virtual stages: the plan has none "
                              "(plan with --pp-virtual V >= 2, or use --pp-schedule 1f1b or gpipe)");
        if (m % q->pp)
            return hp_err_set(err, HP_ERR_INPUT, "--pp-schedule interleaved sends the micro-batches round in groups of "
                              "pp=%lld: %lld micro-batches is not a multiple of it (Megatron's rule); give a "
                              "multiple of %lld", (long long)q->pp, (long long)m, (long long)q->pp);
        return HP_OK;
    }
    if (q->virt > 1)
        return hp_err_set(err, HP_ERR_INPUT, "--pp-schedule %s runs one chunk per stage; the plan has %lld virtual "
                          "stages per stage: use --pp-schedule interleaved (its default)", hp_pp_sched_name(k),
                          (long long)q->virt);
    return HP_OK;
}

/* Interleaved: the k-th forward (or backward) of stage s, Megatron's order: micro-batches go round the stage's
 * chunks in groups of pp, the backwards through the chunks in reverse. */
static hp_pp_op interleaved_op(const hp_pipeline *q, int64_t s, int64_t k, bool bwd)
{
    int64_t pp = q->pp, v = q->virt, in_group = k % (pp * v);
    int64_t local = in_group / pp;
    if (bwd) local = v - 1 - local;
    return (hp_pp_op){bwd, local * pp + s, (k / (pp * v)) * pp + in_group % pp, false};
}

void hp_pp_sched_ops(const hp_pipeline *q, hp_pp_sched k, int64_t m, int64_t s, hp_pp_op *ops)
{
    int64_t n = 0;
    if (k == HP_PP_GPIPE) {
        for (int64_t j = 0; j < m; j++) ops[n++] = (hp_pp_op){false, s, j, false};
        for (int64_t j = 0; j < m; j++) ops[n++] = (hp_pp_op){true, s, j, false};
        return;
    }
    int64_t total = k == HP_PP_INTERLEAVED ? m * q->virt : m, warm;
    if (k == HP_PP_INTERLEAVED)
        warm = m == q->pp ? total : (q->pp - s - 1) * 2 + (q->virt - 1) * q->pp;
    else
        warm = q->pp - s - 1;
    if (warm > total) warm = total;
    for (int64_t i = 0; i < total; i++) { /* forward i (after the warm-up: with backward i - warm) */
        ops[n++] = k == HP_PP_INTERLEAVED ? interleaved_op(q, s, i, false) : (hp_pp_op){false, s, i, false};
        if (i >= warm) {
            ops[n] = k == HP_PP_INTERLEAVED ? interleaved_op(q, s, i - warm, true) : (hp_pp_op){true, s, i - warm, false};
            ops[n++].joined = true;
        }
    }
    for (int64_t i = total - warm; i < total; i++)
        ops[n++] = k == HP_PP_INTERLEAVED ? interleaved_op(q, s, i, true) : (hp_pp_op){true, s, i, false};
}

double hp_pp_sched_in_flight(const hp_pipeline *q, hp_pp_sched k, int64_t m, int64_t s, const double *bytes)
{
    int64_t n = 2 * q->virt * m;
    hp_pp_op *ops = malloc((size_t)n * sizeof *ops);
    if (!ops) return -1;
    hp_pp_sched_ops(q, k, m, s, ops);
    double cur = 0, most = 0;
    for (int64_t i = 0; i < n; i++) {
        double b = bytes ? bytes[ops[i].chunk] : 1;
        cur += ops[i].bwd ? -b : b;
        if (cur > most) most = cur;
    }
    free(ops);
    return most;
}

hp_status hp_pp_sched_simulate(const hp_pipeline *q, hp_pp_sched k, int64_t m, const double *tf, const double *tb,
                               double t_p2p, double *makespan, double *busy, hp_err *err)
{
    int64_t pp = q->pp, C = q->n_chunks, per = 2 * q->virt * m;
    hp_pp_op *ops = malloc((size_t)(pp * per) * sizeof *ops);
    double *fend = malloc((size_t)(C * m) * sizeof *fend), *bend = malloc((size_t)(C * m) * sizeof *bend);
    double *free_at = calloc((size_t)pp, sizeof *free_at);
    int64_t *next = calloc((size_t)pp, sizeof *next);
    hp_status st = HP_OK;
    if (!ops || !fend || !bend || !free_at || !next) {
        st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int64_t i = 0; i < C * m; i++) fend[i] = bend[i] = -1;
    for (int64_t s = 0; s < pp; s++) hp_pp_sched_ops(q, k, m, s, ops + s * per);
    double end = 0, most = 0;
    for (int64_t s = 0; s < pp; s++) {
        double own = 0;
        for (int64_t i = 0; i < per; i++) own += ops[s * per + i].bwd ? tb[ops[s * per + i].chunk] : tf[ops[s * per + i].chunk];
        if (own > most) most = own;
    }
    for (bool moved = true; moved;) { /* each stage runs its next operation once its input is there */
        moved = false;
        for (int64_t s = 0; s < pp; s++)
            while (next[s] < per) {
                const hp_pp_op *o = &ops[s * per + next[s]];
                int64_t c = o->chunk, j = o->mb;
                double ready = free_at[s];
                if (!o->bwd && c > 0) {
                    if (fend[(c - 1) * m + j] < 0) break;
                    if (fend[(c - 1) * m + j] + t_p2p > ready) ready = fend[(c - 1) * m + j] + t_p2p;
                }
                if (o->bwd && c + 1 < C) {
                    if (bend[(c + 1) * m + j] < 0) break;
                    if (bend[(c + 1) * m + j] + t_p2p > ready) ready = bend[(c + 1) * m + j] + t_p2p;
                }
                if (o->bwd && fend[c * m + j] < 0) break;
                double t = ready + (o->bwd ? tb[c] : tf[c]);
                (o->bwd ? bend : fend)[c * m + j] = t;
                free_at[s] = t;
                if (t > end) end = t;
                next[s]++;
                moved = true;
            }
    }
    for (int64_t s = 0; s < pp && st == HP_OK; s++)
        if (next[s] < per)
            st = hp_err_set(err, HP_ERR_INPUT, "internal error: the %s schedule stalls on stage %lld at operation %lld",
                            hp_pp_sched_name(k), (long long)s, (long long)next[s]);
    *makespan = end;
    if (busy) *busy = most;
done:
    free(ops), free(fend), free(bend), free(free_at), free(next);
    return st;
}
