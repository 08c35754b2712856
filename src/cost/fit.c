/*
 * fit.c — when a rank does not fit its budget, the change of the request that would (docs/cost.md "When nothing
 * fits"): the binding constraint (the largest item of the most-loaded rank) and, kind by kind, the nearest value
 * that fits: a higher ZeRO level, a stronger recompute, a smaller micro-batch (or batch, in inference), a shorter
 * sequence, and for advise more ranks (2N, 4N). When no single change fits, each of the others together with the
 * lowest higher ZeRO level under which one does. Each value is tried by evaluating the changed request, so a change
 * printed is one that was seen to fit.
 */
#include "cost/fit.h"
#include "hyperpar/shard.h"

#include <stdio.h>
#include <string.h>

static bool add(hp_fit *f, hp__fit_try try_it, void *ctx, const hp_cost_opts *o, int64_t world, const char *flag,
                const char *value)
{
    if (f->n == HP_FIT_MAX) return true;
    hp_fit_change ch = {0};
    if (!try_it(ctx, o, world, &ch)) return false;
    snprintf(ch.flag, sizeof ch.flag, "%s", flag);
    snprintf(ch.value, sizeof ch.value, "%s", value);
    f->ch[f->n++] = ch;
    return true;
}

/* The largest of vals[0..n) (descending) under which the request fits, by bisection (memory falls with the
 * value: fewer rows, fewer positions), added to f; false when none does. */
static bool largest_fit(hp_fit *f, hp__fit_try try_it, void *ctx, const hp_cost_opts *o, int64_t world,
                        const char *flag, const int64_t *vals, int n)
{
    int lo = 0, hi = n - 1, best = -1;
    hp_fit_change ch, keep = {0};
    char v[32];
    while (lo <= hi) { /* vals[best] fits; every index below lo does not */
        int mid = (lo + hi) / 2;
        hp_cost_opts x = *o;
        if (!strcmp(flag, "--micro-batch")) x.micro_batch = vals[mid];
        else if (!strcmp(flag, "--batch")) x.B = vals[mid];
        else x.S = vals[mid];
        memset(&ch, 0, sizeof ch);
        if (try_it(ctx, &x, world, &ch)) best = mid, keep = ch, hi = mid - 1;
        else lo = mid + 1;
    }
    if (best < 0 || f->n == HP_FIT_MAX) return false;
    snprintf(keep.flag, sizeof keep.flag, "%s", flag);
    snprintf(v, sizeof v, "%lld", (long long)vals[best]);
    snprintf(keep.value, sizeof keep.value, "%s", v);
    f->ch[f->n++] = keep;
    return true;
}

/* The kinds of change besides ZeRO, in turn, into f (hp__fit_search). */
static void other_kinds(hp_fit *f, const hp_cost_opts *o, int64_t mb, int64_t dp_rows, int64_t seq_step,
                        int64_t world, bool worlds, hp__fit_try try_it, void *ctx)
{
    char v[32];
    hp_cost_opts x;
    int64_t vals[64];
    int n = 0;
    for (int r = (int)o->mdl.recompute + 1; hp_cost_model_gpu(&o->mdl) && o->train && r <= HP_COST_RECOMPUTE_FULL; r++) {
        x = *o;
        x.mdl.recompute = (hp_cost_recompute)r;
        if (add(f, try_it, ctx, &x, world, "--recompute", hp_cost_recompute_name(x.mdl.recompute))) break;
    }
    /* fewer rows at once: the powers of two below the current that divide the replicas' rows */
    for (int64_t m = (int64_t)1 << 30; dp_rows >= 0 && m >= 1; m /= 2)
        if (m < mb && !(dp_rows > 0 && dp_rows % m)) vals[n++] = m;
    largest_fit(f, try_it, ctx, o, world, o->train ? "--micro-batch" : "--batch", vals, n);
    n = 0;
    for (int64_t s = o->S / 2; s >= 1 && n < 64; s /= 2) { /* a shorter sequence, kept a multiple of seq_step */
        int64_t sq = seq_step > 1 ? s / seq_step * seq_step : s;
        if (sq >= 1 && sq < o->S && (!n || vals[n - 1] != sq)) vals[n++] = sq;
    }
    largest_fit(f, try_it, ctx, o, world, "--seq", vals, n);
    for (int k = 2; worlds && k <= 4; k *= 2) { /* more ranks: the next two doublings */
        if (world * k > HP_MESH_MAX_SIZE) break;
        snprintf(v, sizeof v, "%lld", (long long)(world * k));
        if (add(f, try_it, ctx, o, world * k, "--world", v)) break;
    }
}

/* o with ZeRO level z (2 and 3: Megatron's byte model, hyperpar train has ZeRO-1 only) */
static hp_cost_opts with_zero(const hp_cost_opts *o, int z)
{
    hp_cost_opts x = *o;
    x.mdl.zero = z;
    if (z >= 2) x.mdl.state = HP_COST_STATE_MEGATRON;
    return x;
}

void hp__fit_search(hp_fit *f, const hp_cost_opts *o, int64_t mb, int64_t dp_rows, int64_t seq_step,
                    int64_t world, bool worlds, hp__fit_try try_it, void *ctx)
{
    char v[32];
    bool gpu = hp_cost_model_gpu(&o->mdl), zeros = o->train && o->mdl.zero < 3;
    snprintf(f->tried, sizeof f->tried, "%s%s%s, a shorter --seq%s%s", zeros ? "a higher --zero, " : "",
             gpu && o->train && o->mdl.recompute < HP_COST_RECOMPUTE_FULL ? "a stronger --recompute, " : "",
             o->train ? "a smaller --micro-batch" : "a smaller --batch", worlds ? ", more ranks (--world)" : "",
             zeros ? "; then each of the others with a higher --zero" : "");
    for (int z = o->mdl.zero + 1; o->train && z <= 3; z++) { /* ZeRO: the state sharded further */
        hp_cost_opts x = with_zero(o, z);
        snprintf(v, sizeof v, "%d", z);
        if (add(f, try_it, ctx, &x, world, "--zero", v)) break;
    }
    other_kinds(f, o, mb, dp_rows, seq_step, world, worlds, try_it, ctx);
    /* no single change fits: the others on top of the lowest higher ZeRO level under which one does */
    for (int z = o->mdl.zero + 1; !f->n && o->train && z <= 3; z++) {
        hp_cost_opts x = with_zero(o, z);
        other_kinds(f, &x, mb, dp_rows, seq_step, world, worlds, try_it, ctx);
        for (int i = 0; i < f->n; i++) {
            snprintf(f->ch[i].flag2, sizeof f->ch[i].flag2, "--zero");
            snprintf(f->ch[i].value2, sizeof f->ch[i].value2, "%d", z);
        }
    }
}

/* ---- hp_cost_fit: one mesh ---- */

typedef struct cost_ctx {
    const hp_cost_plan *k;
    const int64_t *ranks;
    int64_t n_ranks;
    uint64_t budget;
} cost_ctx;

static bool cost_try(void *vx, const hp_cost_opts *o, int64_t world, hp_fit_change *ch)
{
    const cost_ctx *x = vx;
    (void)world;
    hp_cost_opts y = *o;
    y.ranks = x->ranks, y.n_ranks = x->n_ranks;
    hp_cost *c = NULL;
    hp_err err;
    bool fits = false;
    if (hp_cost_eval(&c, x->k, &y, &err) == HP_OK && !c->refused[0]) {
        ch->bytes = c->ranks[c->max_rank].total_bytes;
        fits = ch->bytes <= x->budget;
    }
    hp_cost_free(c);
    return fits;
}

hp_status hp_cost_fit(hp_fit *f, const hp_model *m, const hp_plan *p, const hp_cost_opts *o, const hp_cost *c,
                      uint64_t budget, hp_err *err)
{
    memset(f, 0, sizeof *f);
    const hp_cost_rank *r = &c->ranks[c->max_rank];
    f->binding = hp_cost_rank_binding(r, c->train, &f->binding_bytes);
    f->total_bytes = r->total_bytes, f->budget = budget, f->reserve = budget ? o->mdl.mem_reserve : 0;
    uint64_t usable = hp_cost_usable(&o->mdl, budget); /* the reserve is the runtime's: the figures fit the rest */
    if (!budget || c->refused[0] || r->total_bytes <= usable) return HP_OK;
    hp_cost_plan *k = NULL;
    hp_status st = hp_cost_plan_create(&k, m, p, err);
    if (st != HP_OK) return st;
    int64_t ranks[3] = {0}, n = 1; /* rank 0, the most-loaded and the last, each once */
    if (r->rank != 0) ranks[n++] = r->rank;
    if (c->world - 1 != r->rank && c->world > 1) ranks[n++] = c->world - 1;
    cost_ctx x = {.k = k, .ranks = ranks, .n_ranks = n, .budget = usable};
    int64_t dp = hp_mesh_batch_split(&p->mesh), cp = hp_mesh_size(&p->mesh, "cp");
    int64_t mb = c->train ? c->micro_batch : c->B;
    hp__fit_search(f, o, mb, c->train ? (c->B % dp ? -1 : c->B / dp) : 0, cp > 1 ? 2 * cp : 1, c->world, false,
                   cost_try, &x);
    hp_cost_plan_free(k);
    return HP_OK;
}

/* ---- hp_cost_evaluate: cost's one flow ---- */

hp_status hp_cost_evaluate(hp_cost_result *r, const hp_model *m, const hp_plan *p, hp_cost_settings *s, bool fit,
                           hp_err *err)
{
    memset(r, 0, sizeof *r);
    if (s->co.pp_sched_given && hp_mesh_size(&p->mesh, "pp") < 2)
        return hp_err_set(err, HP_ERR_INPUT, "--pp-schedule %s orders a pipeline's micro-batches, and the mesh has no pp "
                          "axis; give --pp N (N >= 2) or drop --pp-schedule", hp_pp_sched_name(s->co.pp_sched));
    if (s->co.pp_sched_given && !s->co.train)
        return hp_err_set(err, HP_ERR_INPUT, "--pp-schedule %s orders a training step's micro-batches; an inference step "
                          "is one batch through the stages in turn: give --mode train or drop --pp-schedule",
                          hp_pp_sched_name(s->co.pp_sched));
    hp_status st = hp_shard_layout_build(&r->layout, m, p, err);
    if (st != HP_OK) return st;
    hp_cost_settings_batch(s, &p->mesh);
    s->co.layout = r->layout;
    st = hp_cost_compute(&r->cost, m, p, &s->co, err);
    if (st == HP_OK && fit) st = hp_cost_fit(&r->fit, m, p, &s->co, r->cost, s->budget, err);
    s->co.layout = NULL; /* the caller's settings outlive r */
    return st;
}

void hp_cost_result_free(hp_cost_result *r)
{
    hp_cost_free(r->cost);
    hp_shard_layout_free(r->layout);
    memset(r, 0, sizeof *r);
}
