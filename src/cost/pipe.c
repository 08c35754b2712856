/*
 * pipe.c — what a pipeline (a pp axis) adds to a plan's cost (docs/cost.md "Pipeline parallelism"):
 *
 *   - each rank is walked as a rank of its stage's mesh (the plan's mesh less pp: every tp, cp, dp and EP group
 *     lies inside one stage) on its stage's chunks only (cost.c), receiving and sending the stream's block at each
 *     boundary as src/run/pipe.c does;
 *   - a stage keeps the activations of the micro-batches its schedule has in flight (hp_pp_sched_in_flight);
 *   - the step is the schedule's timeline (hp_pp_sched_simulate) over every chunk's forward and backward seconds
 *     per micro-batch, and a rank's bubble is that makespan less its own stage's busy seconds.
 *
 * The chunk times of one position in a stage (a stage-local rank j) are the same whichever stage asks, so they are
 * kept in a table by (j, chunk); a rank of a stage that was not evaluated (advise evaluates ranks 0 and N-1 only)
 * is walked for them.
 */
#include "cost/cost_int.h"

#include <stdlib.h>

void hp__cost_stage_mesh(const hp_mesh *m, hp_mesh *out)
{
    *out = *m;
    out->n_dims = 0;
    for (int i = 0; i < m->n_dims; i++) {
        if (!strcmp(m->names[i], "pp")) continue;
        memcpy(out->names[out->n_dims], m->names[i], sizeof m->names[i]);
        out->sizes[out->n_dims++] = m->sizes[i];
    }
}

uint64_t hp__cost_in_flight(walk *w, hp_cost_rank *r, const double *bytes)
{
    double n = hp_pp_sched_in_flight(w->pipe, w->sched, w->n_micro, w->stage, NULL);
    double b = hp_pp_sched_in_flight(w->pipe, w->sched, w->n_micro, w->stage, bytes);
    r->in_flight = n > 0 ? (int64_t)n : 0;
    if (n < 0 || b < 0 || b >= 18446744073709551616.0) { /* no memory for the list, or past 64 bits */
        if (!w->ovf) w->ovf = "saved activations";
        return UINT64_MAX;
    }
    return (uint64_t)b;
}

/* The chunk times by stage-local rank: tf and tb [per][n_chunks], seconds per micro-batch; have [per][pp]: that
 * stage's chunks are set; block [per]: the largest stream block (floats) at that position; span [per]: the
 * timeline's makespan, < 0 until simulated. */
typedef struct hp__cost_tab {
    int64_t per, C, pp;
    double *tf, *tb, *span;
    int64_t *block;
    unsigned char *have;
} tab;

/* Rank r's own chunks' seconds into t (as walked just now: w's chunk FLOPs, r's events with their predicted
 * seconds): a chunk's forward is its FLOPs at the sustained rate and its forward collectives; its backward twice
 * the FLOPs, what it recomputes and its backward collectives. The gradients' dp reduction (chunk -1) comes after
 * the micro-batches. r->t_busy: the stage's sum over every micro-batch. */
static void record(walk *w, tab *t, hp_cost_rank *r)
{
    const hp_cost_model *md = &w->o->mdl;
    double rate = md->gemm_flops * md->gemm_eff, m = (double)w->n_micro;
    hp_cost_recompute rc = hp_cost_model_gpu(md) ? md->recompute : HP_COST_RECOMPUTE_NONE;
    double *tf = t->tf + w->lrank * t->C, *tb = t->tb + w->lrank * t->C;
    for (int64_t c = w->stage; c < t->C; c += t->pp) {
        double f = w->ch_flops[c], again = rc == HP_COST_RECOMPUTE_FULL ? f
                                          : rc == HP_COST_RECOMPUTE_SELECTIVE ? w->ch_attn[c] : 0;
        tf[c] = rate > 0 ? f / rate : 0;
        tb[c] = rate > 0 && w->o->train ? (2 * f + again) / rate : 0;
    }
    for (size_t i = 0; i < r->n_ev; i++) {
        const hp_cost_event *e = &r->ev[i];
        if (e->chunk < 0 || e->chunk >= t->C) continue;
        (strcmp(e->step, "backward") ? tf : tb)[e->chunk] += e->seconds / m;
    }
    r->t_busy = 0;
    for (int64_t c = w->stage; c < t->C; c += t->pp) r->t_busy += m * (tf[c] + tb[c]);
    t->have[w->lrank * t->pp + w->stage] = 1;
    if (w->p2p_block > t->block[w->lrank]) t->block[w->lrank] = w->p2p_block;
}

/* The seconds of one boundary's transfer at position j: the block in the engine's dtype over the link (between
 * nodes when the world spans nodes: a stage's neighbour is a stage's width of ranks away). */
static double p2p_seconds(const walk *w, const tab *t, int64_t j)
{
    const hp_cost_model *md = &w->o->mdl;
    bool inter = md->ranks_per_node > 0 && t->per * t->pp > md->ranks_per_node;
    double bw = (inter ? md->bw_inter : md->bw_intra) * md->link_eff, lat = inter ? md->lat_inter : md->lat_intra;
    double bytes = (double)t->block[j] * (hp_cost_model_gpu(md) ? 2 : 4);
    return bw > 0 ? lat + bytes / bw : lat;
}

/* The makespan at position j: training, the schedule's simulated timeline; inference, one batch through the
 * chunks in turn (each forward, and a transfer at each boundary). */
static hp_status span_of(walk *w, tab *t, int64_t j, hp_err *err)
{
    if (t->span[j] >= 0) return HP_OK;
    double tp = p2p_seconds(w, t, j), *tf = t->tf + j * t->C, *tb = t->tb + j * t->C, busy = 0;
    if (w->o->train) return hp_pp_sched_simulate(w->pipe, w->sched, w->n_micro, tf, tb, tp, &t->span[j], &busy, err);
    t->span[j] = (double)(t->C - 1) * tp;
    for (int64_t c = 0; c < t->C; c++) t->span[j] += tf[c];
    return HP_OK;
}

/* Every stage's chunk times at r's position: a stage none of whose ranks at it was walked is walked now. */
static hp_status fill(walk *w, tab *t, int64_t j, hp__cost_eval_fn eval)
{
    hp_status st = HP_OK;
    for (int64_t s = 0; s < t->pp && st == HP_OK; s++) {
        if (t->have[j * t->pp + s]) continue;
        hp_cost_rank tmp = {0};
        size_t cap = w->ev_cap;
        st = eval(w, &tmp, s * t->per + j, w->n_micro, HP_OK);
        if (st == HP_OK) record(w, t, &tmp);
        free(tmp.ev);
        w->ev_cap = cap;
    }
    return st;
}

/* The stages' summary: each the most-loaded of its evaluated ranks. */
static hp_status stages(walk *w, hp_cost *c)
{
    const hp_pipeline *q = w->pipe;
    if (!(c->stages = hp_calloc((size_t)q->pp, sizeof *c->stages))) return hp_err_set(w->err, HP_ERR_NOMEM, "out of memory");
    for (int64_t s = 0; s < q->pp; s++) {
        hp_cost_stage *g = &c->stages[s];
        g->stage = s, g->rank_lo = s * w->per, g->rank_hi = (s + 1) * w->per, g->n_chunks = q->virt;
        g->first_layer = q->first[s];
        for (int64_t k = s; k < q->n_chunks; k += q->pp) g->n_layers += q->count[k];
        g->head = s == q->pp - 1;
        g->embedding = s == 0 || (g->head && w->g->tied);
    }
    for (int64_t i = 0; i < c->n_ranks; i++) {
        const hp_cost_rank *r = &c->ranks[i];
        hp_cost_stage *g = &c->stages[r->stage];
        if (g->evaluated && r->total_bytes <= c->ranks[g->max_rank].total_bytes) continue;
        g->evaluated = true, g->max_rank = i;
        g->weight_bytes = r->weight_bytes, g->act_bytes = r->act_bytes, g->saved_bytes = r->saved_bytes;
        g->total_bytes = r->total_bytes, g->p2p_bytes = r->p2p_bytes, g->in_flight = r->in_flight;
        g->t_busy = r->t_busy;
    }
    return HP_OK;
}

hp_status hp__cost_pipe_record(walk *w, hp_cost_rank *r)
{
    tab *t = w->tab;
    if (!t) {
        if (!(t = w->tab = hp_calloc(1, sizeof *t))) return hp_err_set(w->err, HP_ERR_NOMEM, "out of memory");
        t->per = w->per, t->C = w->pipe->n_chunks, t->pp = w->pp;
        size_t n = (size_t)(t->per * t->C);
        t->tf = hp_calloc(n, sizeof *t->tf), t->tb = hp_calloc(n, sizeof *t->tb);
        t->span = hp_calloc((size_t)t->per, sizeof *t->span), t->block = hp_calloc((size_t)t->per, sizeof *t->block);
        t->have = hp_calloc((size_t)(t->per * t->pp), 1);
        if (!t->tf || !t->tb || !t->span || !t->block || !t->have) return hp_err_set(w->err, HP_ERR_NOMEM, "out of memory");
        for (int64_t j = 0; j < t->per; j++) t->span[j] = -1;
    }
    record(w, t, r);
    return HP_OK;
}

void hp__cost_pipe_free(walk *w)
{
    tab *t = w->tab;
    if (t) free(t->tf), free(t->tb), free(t->span), free(t->block), free(t->have);
    free(t);
    w->tab = NULL;
}

hp_status hp__cost_pipe_finish(walk *w, hp_cost *c, hp__cost_eval_fn eval)
{
    tab *t = w->tab;
    hp_status st = t ? HP_OK : hp_err_set(w->err, HP_ERR_INPUT, "internal error: no pipeline times recorded");
    for (int64_t i = 0; st == HP_OK && i < c->n_ranks; i++) {
        hp_cost_rank *r = &c->ranks[i];
        int64_t j = r->rank % t->per;
        if ((st = fill(w, t, j, eval)) != HP_OK || (st = span_of(w, t, j, w->err)) != HP_OK) break;
        r->t_bubble = t->span[j] > r->t_busy ? t->span[j] - r->t_busy : 0;
        r->t_step = r->t_compute + r->t_exposed + r->t_bubble;
        if (t->span[j] > c->t_makespan) c->t_makespan = t->span[j];
    }
    if (st == HP_OK) st = stages(w, c);
    return st;
}
