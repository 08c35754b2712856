/*
 * advise.c — which mesh of N ranks to pick (hp_advise, docs/cost.md "hyperpar advise"): every mesh of N ranks the
 * model accepts, the others rejected with their reason, the accepted ranked by predicted step time, then by the
 * bytes sent over links, then by memory (decode with prefer_headroom: by the sequences that fit first).
 *
 * A template plan is derived on a template mesh where every axis the model can use is active, one per way the
 * experts of a MoE model are placed (a dense model has only the first):
 *   EP     tp, cp and TP-extend EP over the dense region: whole experts per EP rank (ep >= 2 without tp, and
 *          every ep of a candidate with tp = 1);
 *   NOEP   tp and cp, no EP: the experts cut over tp (the candidates with tp > 1 and no EP);
 *   AXIS   tp, cp and an explicit ep axis: the experts split over ep and cut over tp (ep axis with tp > 1).
 * Their contracts and placements do not depend on the axis sizes, so each candidate is its template's cost at the
 * candidate's sizes: the dry executor (hp_cost_eval with another mesh) for the communication, activations and
 * FLOPs of rank 0 and the last rank, and the weight bytes from the template's shard layout, tensor by tensor
 * divided by the sizes of the axes that shard it (the layout refuses uneven splits, so the division is exact).
 * A template the planner refuses (e.g. a fused gate/up cut over tp without packed_fused) rejects the candidates
 * that need it with the planner's reason.
 *
 *   template tensors ──(mask of the axes that shard each: tp | cp | ep)──> bytes[mask]
 *   candidate (dp, cp, tp, ep) ──> its template ──> rules 1..6 ──> hp_cost_eval(ranks 0, N-1) ──> budget
 */
#include "cost/fit.h"
#include "cost/held.h"

#include "hyperpar/cost.h"
#include "hyperpar/model.h"
#include "hyperpar/plan.h"
#include "hyperpar/shard.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void hp_advise_opts_default(hp_advise_opts *o)
{
    memset(o, 0, sizeof *o);
    hp_cost_opts_default(&o->cost);
    o->cost.B = 0; /* the default: a row per rank (hp_advise) */
    hp_plan_opts_default(&o->plan);
}

/* ---- the templates: one plan each, its tensors grouped by the axes that shard them ---- */

enum { M_TP = 1, M_CP = 2, M_EP = 4 };

/* At most this many distinct split requirements are kept; a model has a handful (heads, widths, experts, vocab). */
#define MAX_REQ 64

typedef struct dimreq { /* a dim some tensor shards: its length must divide by (2x) the axis size */
    int mask;
    int64_t len;
    bool packed;
    char name[200];
} dimreq;

/* One tensor of a template: the axes that shard it, its bytes as stored and as hyperpar's runtime holds them (a
 * tensor it holds whole under hmask 0), for the stages a pipeline puts it on (hp_pipeline_param_stages). */
typedef struct ttensor {
    const char *name; /* the model's parameter name (outlives the template) */
    int mask, hmask;
    uint64_t bytes, held[2];
} ttensor;

typedef struct tmpl {
    ttensor *tt;
    size_t n_tt;
    hp_err refused;     /* status HP_OK, or the planner's refusal of this template (p and k are then NULL) */
    hp_plan *p;
    hp_cost_plan *k;    /* the dry executor's view of p */
    uint64_t bytes[8];  /* global bytes of the tensors sharded on exactly the axes of the mask */
    uint64_t held[2][8]; /* the same as hyperpar's runtime holds them in inference and in training (held.c), a
                            tensor it holds whole under mask 0; all 0 when the runtime refuses the template */
    dimreq req[MAX_REQ];
    int n_req;
} tmpl;

static void add_req(tmpl *t, int mask, int64_t len, bool packed, const char *name)
{
    for (int i = 0; i < t->n_req; i++)
        if (t->req[i].mask == mask && t->req[i].len == len && t->req[i].packed == packed) return;
    if (t->n_req == MAX_REQ) return;
    dimreq *r = &t->req[t->n_req++];
    *r = (dimreq){.mask = mask, .len = len, .packed = packed};
    snprintf(r->name, sizeof r->name, "%s", name);
}

static bool is_moe(const hp_model *m)
{
    return m->family && hp_family_is_moe(m->family) && m->cfg.n_experts > 1;
}

/* The ways the experts are placed, one template each (the header above). */
enum { T_EP, T_NOEP, T_AXIS, T_COUNT };

static hp_status build_template(tmpl *t, int kind, const hp_model *m, const hp_plan_opts *po_in, hp_err *err)
{
    const hp_model_config *c = &m->cfg;
    int64_t nkv = c->num_key_value_heads ? c->num_key_value_heads : c->num_attention_heads;
    int64_t tp = c->num_attention_heads % 2 == 0 && nkv % 2 == 0 ? 2 : 1;
    int64_t ep = is_moe(m) && c->n_experts % 2 == 0 && kind != T_NOEP ? 2 : 0;
    hp_plan_opts po = *po_in;
    if (kind == T_AXIS && ep) {
        hp_mesh_from_sizes(&po.mesh, 1, 2, tp, ep, true);
    } else {
        hp_mesh_from_sizes(&po.mesh, 1, 2, tp, 0, false);
        po.mesh.ep = ep;
    }
    hp_status st = hp_plan_derive(&t->p, m, &po, err);
    if (st != HP_OK) return st;
    hp_shard_layout *l = NULL;
    if ((st = hp_cost_plan_create(&t->k, m, t->p, err)) != HP_OK) return st;
    if ((st = hp_shard_layout_build(&l, m, t->p, err)) != HP_OK) return st;
    hp__cost_held *held = NULL;
    hp_err herr;
    if ((st = hp__cost_held_of(m, t->p, l, &held, &herr)) == HP_ERR_NOMEM) {
        hp_shard_layout_free(l);
        return hp_err_set(err, st, "%s", herr.msg);
    }
    if (!(t->tt = calloc(l->n_tensors ? l->n_tensors : 1, sizeof *t->tt))) {
        free(held);
        hp_shard_layout_free(l);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    }
    t->n_tt = l->n_tensors;
    for (size_t i = 0; i < l->n_tensors; i++) {
        const hp_shard_tensor *x = &l->tensors[i];
        int mask = 0;
        for (int a = 0; a < HP_AXIS_COUNT; a++) {
            hp_placement pl = x->pl.ax[a];
            if (pl.kind != HP_PL_S && pl.kind != HP_PL_S2) continue;
            int bit = a == HP_AXIS_TP ? M_TP : a == HP_AXIS_CP ? M_CP : M_EP;
            if (bit == M_EP && !(x->ep_size > 1 || l->mesh.ep_axis)) continue;
            mask |= bit;
            int d = pl.dim < 0 ? pl.dim + x->n_dims : pl.dim;
            if (d >= 0 && d < x->n_dims) add_req(t, bit, x->global_shape[d], pl.kind == HP_PL_S2, x->name);
        }
        int64_t nb = 0, n = 1;
        for (int d = 0; d < x->n_dims; d++) n *= x->global_shape[d]; /* the layout checked these sizes */
        if (hp_dtype_nbytes(x->dtype, n, &nb)) t->bytes[mask] += (uint64_t)nb;
        for (int md = 0; held && md < 2; md++)
            t->held[md][held[i].whole ? 0 : mask] += (uint64_t)n * held[i].el[md];
        ttensor *y = &t->tt[i];
        *y = (ttensor){m->params[x->params[0]].name, mask, held && held[i].whole ? 0 : mask, (uint64_t)nb, {0, 0}};
        for (int md = 0; held && md < 2; md++) y->held[md] = (uint64_t)n * held[i].el[md];
    }
    free(held);
    hp_shard_layout_free(l);
    return HP_OK;
}

/* The product of the sizes of the axes of mask. */
static uint64_t mask_div(int mask, int64_t tp, int64_t cp, int64_t ep)
{
    return (uint64_t)((mask & M_TP) ? tp : 1) * (uint64_t)((mask & M_CP) ? cp : 1) * (uint64_t)((mask & M_EP) ? ep : 1);
}

/* A rank's share of bytes[mask]: each divided by the sizes of the axes of its mask. */
static uint64_t weight_bytes(const uint64_t *bytes, int64_t tp, int64_t cp, int64_t ep)
{
    uint64_t w = 0;
    for (int mask = 0; mask < 8; mask++) w += bytes[mask] / mask_div(mask, tp, cp, ep);
    return w;
}

/* With a pipeline q: each stage's weights as stored (sw) and as the runtime holds them (sh, train: held[1]), each
 * tensor on the stages hp_pipeline_param_stages puts it on (the template's plan with q's chunks). */
static void stage_weights(const tmpl *t, const hp_pipeline *q, const hp_advise_cand *c, bool train, uint64_t *sw,
                          uint64_t *sh)
{
    hp_plan pq = *t->p;
    pq.pipe = *q;
    memset(sw, 0, (size_t)q->pp * sizeof *sw);
    memset(sh, 0, (size_t)q->pp * sizeof *sh);
    for (size_t i = 0; i < t->n_tt; i++) {
        const ttensor *y = &t->tt[i];
        int64_t st[2];
        int n = hp_pipeline_param_stages(&pq, y->name, st);
        for (int k = 0; k < n; k++) {
            sw[st[k]] += y->bytes / mask_div(y->mask, c->tp, c->cp, c->ep);
            sh[st[k]] += y->held[train] / mask_div(y->hmask, c->tp, c->cp, c->ep);
        }
    }
}

/* ---- candidates ---- */

typedef struct ctx {
    const hp_model *m;
    const tmpl *t[T_COUNT]; /* T_NOEP and T_AXIS: NULL for a dense model */
    const hp_advise_opts *o;
    hp_err *batch_err; /* the first refusal of the batch itself by the dry executor (e.g. past 64 bits), if any */
} ctx;

static bool reject(hp_advise_cand *c, hp_advise_why why, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool reject(hp_advise_cand *c, hp_advise_why why, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->reason, sizeof c->reason, fmt, ap);
    va_end(ap);
    c->ok = false;
    c->why = why;
    return false;
}

static void name_inner(const hp_advise_cand *c, char *buf, size_t cap);

static void name_mesh(hp_advise_cand *c)
{
    char pp[48] = "";
    if (c->pp > 1 && c->pp_virtual > 1) snprintf(pp, sizeof pp, "pp=%lld(v%lld),", (long long)c->pp, (long long)c->pp_virtual);
    else if (c->pp > 1) snprintf(pp, sizeof pp, "pp=%lld,", (long long)c->pp);
    size_t n = strlen(pp);
    memcpy(c->mesh, pp, n + 1);
    name_inner(c, c->mesh + n, sizeof c->mesh - n);
}

/* The mesh without pp ("dp=2,cp=1,tp=4 ep=8 (TP-extend)") into buf. */
static void name_inner(const hp_advise_cand *c, char *buf, size_t cap)
{
    if (c->ep_axis)
        snprintf(buf, cap, "dp=%lld,cp=%lld,tp=%lld,ep=%lld (ep axis)", (long long)c->dp,
                 (long long)c->cp, (long long)c->tp, (long long)c->ep);
    else if (c->ep > 1) /* at tp = 1 the EP group rides on dp alone: nothing is extended */
        snprintf(buf, cap, c->tp > 1 ? "dp=%lld,cp=%lld,tp=%lld ep=%lld (TP-extend)"
                                                     : "dp=%lld,cp=%lld,tp=%lld ep=%lld", (long long)c->dp,
                 (long long)c->cp, (long long)c->tp, (long long)c->ep);
    else
        snprintf(buf, cap, "dp=%lld,cp=%lld,tp=%lld", (long long)c->dp, (long long)c->cp,
                 (long long)c->tp);
}

/* The template that places c's experts as a plan derived for c's mesh does. */
static const tmpl *template_of(const ctx *x, const hp_advise_cand *c)
{
    if (!x->t[T_NOEP] || c->tp < 2) return x->t[T_EP];
    return x->t[c->ep_axis ? T_AXIS : c->ep < 2 ? T_NOEP : T_EP];
}

/* The rules that need no evaluation, in docs/cost.md's order: false (c rejected) at the first that fails. */
static bool admissible(const ctx *x, const tmpl *t, hp_advise_cand *c)
{
    const hp_model *m = x->m;
    const hp_cost_opts *co = &x->o->cost;
    int64_t rpn = co->mdl.ranks_per_node;
    hp_err err;
    /* decode: the runtime pads each sequence's new token to 2·cp positions, so S needs no divisor */
    if (hp_plan_check_compat(m, c->tp, c->cp, c->ep, co->decode ? 0 : co->S, &err) != HP_OK)
        return reject(c, HP_ADVISE_COMPAT, "%s", err.msg);
    if (t->refused.status != HP_OK)
        return reject(c, HP_ADVISE_PLAN, "the planner refuses a plan that cuts the experts over tp%s: %s",
                      c->ep_axis ? " on an ep axis" : " without EP", t->refused.msg);
    hp_mesh mesh;
    hp_mesh_from_sizes(&mesh, c->dp, c->cp, c->tp, c->ep, c->ep_axis);
    int64_t reps = hp_mesh_batch_split(&mesh); /* an explicit ep axis splits the batch with dp */
    if (co->B < reps)
        return reject(c, HP_ADVISE_DP_ROWS, c->ep_axis ? "dp x ep = %lld replicas but the batch has %lld rows"
                                                      : "dp=%lld replicas but the batch has %lld rows",
                      (long long)reps, (long long)co->B);
    if (rpn > 0 && (c->tp > rpn || rpn % c->tp))
        return reject(c, HP_ADVISE_TP_NODE, "tp=%lld does not fit inside a node of %lld ranks (TP stays inside a "
                      "node)", (long long)c->tp, (long long)rpn);
    for (int i = 0; i < t->n_req; i++) {
        const dimreq *r = &t->req[i];
        int64_t size = r->mask == M_TP ? c->tp : r->mask == M_CP ? c->cp : c->ep, parts = r->packed ? 2 * size : size;
        if (size > 1 && r->len % parts)
            return reject(c, HP_ADVISE_SPLIT, "'%s' has a dim of %lld that does not split into %s%s=%lld", r->name,
                          (long long)r->len, r->packed ? "2 x " : "",
                          r->mask == M_TP ? "tp" : r->mask == M_CP ? "cp" : "ep", (long long)size);
    }
    return true;
}

/* c's pipeline (pp > 1): the split of the layers into pp x virtual chunks, the pp axis on mesh, and in training
 * the schedule for c's micro-batches (the one asked, else hp_pp_sched_default); false (c rejected) when the layers
 * cannot be cut so or the schedule cannot run them. */
static bool pipeline_of(const ctx *x, hp_advise_cand *c, hp_mesh *mesh, hp_pipeline *q, hp_arena *ar)
{
    const hp_cost_opts *co = &x->o->cost;
    hp_err err;
    if (hp_pipeline_split(q, x->m->cfg.num_hidden_layers, c->pp, c->pp_virtual, NULL, 0, ar, &err) != HP_OK ||
        hp_mesh_add_pp(mesh, c->pp, &err) != HP_OK)
        return reject(c, HP_ADVISE_PIPE, "%s", err.msg);
    if (!co->train) return true;
    int64_t reps = hp_mesh_batch_split(mesh), mb = hp_cost_default_micro_batch(co, reps), n = 1;
    if (mb > 0 && co->B % (mb * reps) == 0) n = co->B / (mb * reps);
    if (hp_pp_sched_check(q, co->pp_sched_given ? co->pp_sched : hp_pp_sched_default(q), n, &err) != HP_OK)
        return reject(c, HP_ADVISE_PIPE, "%lld micro-batches: %s", (long long)n, err.msg);
    return true;
}

/* Evaluates candidate c (sizes set): accepted, or rejected with the reason. */
static bool evaluate(const ctx *x, hp_advise_cand *c)
{
    const hp_cost_opts *co = &x->o->cost;
    const tmpl *t = template_of(x, c);
    name_mesh(c);
    if (!admissible(x, t, c)) return false;
    hp_mesh mesh;
    hp_mesh_from_sizes(&mesh, c->dp, c->cp, c->tp, c->ep, c->ep_axis);
    hp_cost_opts o = *co;
    hp_arena ar;
    hp_arena_init(&ar);
    hp_pipeline pipe;
    if (c->pp > 1 && !pipeline_of(x, c, &mesh, &pipe, &ar)) {
        hp_arena_free(&ar);
        return false;
    }
    /* ranks 0 and N-1; with a pipeline, the first and last rank of every stage (a middle stage may hold the most) */
    int64_t world = hp_mesh_world(&mesh), per = world / c->pp, n_r = 0;
    int64_t *ranks = malloc((size_t)(2 * c->pp) * sizeof *ranks);
    uint64_t *sw = c->pp > 1 ? malloc((size_t)(2 * c->pp) * sizeof *sw) : NULL;
    if (!ranks || (c->pp > 1 && !sw)) {
        free(ranks), free(sw), hp_arena_free(&ar);
        return reject(c, HP_ADVISE_EVAL, "out of memory");
    }
    for (int64_t g = 0; g < c->pp; g++) {
        ranks[n_r++] = g * per;
        if (per > 1) ranks[n_r++] = g * per + per - 1;
    }
    o.mesh = &mesh;
    o.ranks = ranks;
    o.n_ranks = n_r;
    o.weights_given = true;
    o.weight_bytes = weight_bytes(t->bytes, c->tp, c->cp, c->ep);
    o.held_weight_bytes = weight_bytes(t->held[co->train], c->tp, c->cp, c->ep);
    if (c->pp > 1) {
        stage_weights(t, &pipe, c, co->train, sw, sw + c->pp);
        o.pipe = &pipe, o.stage_weight_bytes = sw, o.stage_held_bytes = sw + c->pp;
    }
    o.layout = NULL;
    hp_cost *k = NULL;
    hp_err err;
    hp_status est = hp_cost_eval(&k, t->k, &o, &err);
    free(ranks), free(sw), hp_arena_free(&ar);
    if (est != HP_OK) {
        if (err.status == HP_ERR_INPUT && x->batch_err->status == HP_OK) *x->batch_err = err;
        return reject(c, HP_ADVISE_EVAL, "%s", err.msg);
    }
    if (k->refused[0]) {
        reject(c, HP_ADVISE_EVAL, "%s", k->refused);
        hp_cost_free(k);
        return false;
    }
    const hp_cost_rank *r = &k->ranks[k->max_rank];
    c->max_bytes = r->total_bytes;
    c->binding = hp_cost_rank_binding(r, k->train, &c->binding_bytes);
    c->weight_bytes = r->weight_bytes;
    c->act_bytes = r->act_bytes;
    c->state_bytes = k->train ? r->grad_bytes + r->optim_bytes + r->master_bytes + r->saved_bytes + r->gather_bytes
                              : r->kv_bytes;
    for (int64_t i = 0; i < k->n_ranks; i++) {
        const hp_cost_rank *q = &k->ranks[i];
        if (q->sent_bytes > c->sent_bytes) c->sent_bytes = q->sent_bytes;
        if (q->wire_bytes > c->wire_bytes) c->wire_bytes = q->wire_bytes;
        /* the slowest rank; a pipeline's ranks all take the makespan (to rounding): then its busiest stage's */
        if (q->t_step > c->t_step * (1 + 1e-12) || (q->t_step >= c->t_step * (1 - 1e-12) && q->t_busy > c->t_busy))
            c->t_step = q->t_step, c->t_compute = q->t_compute, c->t_comm = q->t_comm, c->t_memory = q->t_memory,
            c->t_bubble = q->t_bubble, c->t_busy = q->t_busy;
        if (q->kv_seq_bytes > c->kv_seq_bytes) c->kv_seq_bytes = q->kv_seq_bytes;
    }
    c->seqs = k->decode ? hp_cost_seqs(k, x->o->mem_per_rank) : -1;
    c->micro_batch = k->train ? k->micro_batch : 0, c->n_micro = k->train ? k->n_micro : 0;
    hp_cost_free(k);
    uint64_t budget = x->o->mem_per_rank, usable = hp_cost_usable(&co->mdl, budget);
    if (budget && c->max_bytes > usable) {
        char b[8][32], of[96] = "";
        if (co->mdl.mem_reserve) /* the budget less the runtime's reserve is what the figures must fit */
            snprintf(of, sizeof of, " (%s less a reserve of %s)", hp_format_bytes(budget, b[6], 32),
                     hp_format_bytes(co->mdl.mem_reserve, b[7], 32));
        return reject(c, HP_ADVISE_MEMORY, "the most-loaded rank needs %s of %s%s (weights %s + activations %s + %s %s; "
                      "the largest: %s %s)", hp_format_bytes(c->max_bytes, b[0], 32), hp_format_bytes(usable, b[1], 32),
                      of, hp_format_bytes(c->weight_bytes, b[2], 32), hp_format_bytes(c->act_bytes, b[3], 32),
                      co->train ? "training state" : "KV cache", hp_format_bytes(c->state_bytes, b[4], 32),
                      c->binding, hp_format_bytes(c->binding_bytes, b[5], 32));
    }
    if (co->train && c->pp > 1 && c->t_bubble > c->t_busy) {
        char tb[2][24];
        return reject(c, HP_ADVISE_BUBBLE, "the pipeline bubble (%s) is longer than the stage's own work (%s) over %lld "
                      "micro-batches: the stages idle more than they compute; more micro-batches (a smaller "
                      "--micro-batch or a larger --batch) or fewer stages", hp_format_seconds(c->t_bubble, tb[0], 24),
                      hp_format_seconds(c->t_busy, tb[1], 24), (long long)c->n_micro);
    }
    c->ok = true;
    c->why = HP_ADVISE_OK;
    return true;
}

/* The ranking (hp_advice.cands): accepted first, by time as printed (3 significant digits, hp_format_seconds:
 * equal there is a tie, so #1 is never shown slower than #2), wire bytes, memory; then the
 * rejected, the nearest misses (evaluated, least memory) first, then the rest as found (qsort is not stable:
 * the enumeration index decides). */
typedef struct ranked {
    hp_advise_cand c;
    int idx;
    int64_t first; /* decode with prefer_headroom: the sequences that fit (more first); else 0 */
} ranked;

static int by_rank(const void *a, const void *b)
{
    const ranked *rx = a, *ry = b;
    const hp_advise_cand *x = &rx->c, *y = &ry->c;
    if (x->ok != y->ok) return x->ok ? -1 : 1;
    if (x->ok && rx->first != ry->first) return rx->first > ry->first ? -1 : 1;
    if (x->ok) {
        double tx = hp_seconds_as_printed(x->t_step), ty = hp_seconds_as_printed(y->t_step);
        if (tx != ty) return tx < ty ? -1 : 1;
        if (x->wire_bytes != y->wire_bytes) return x->wire_bytes < y->wire_bytes ? -1 : 1;
    } else if ((x->max_bytes > 0) != (y->max_bytes > 0)) {
        return x->max_bytes > 0 ? -1 : 1;
    }
    if (x->max_bytes != y->max_bytes) return x->max_bytes < y->max_bytes ? -1 : 1;
    return rx->idx < ry->idx ? -1 : rx->idx > ry->idx;
}

/* The divisors of N, ascending, into a new array; their count into *n. */
static int64_t *divisors(int64_t N, int *n)
{
    int cap = 16;
    int64_t *d = malloc((size_t)cap * sizeof *d);
    *n = 0;
    for (int64_t e = 1; d && e <= N; e++) {
        if (N % e) continue;
        if (*n == cap) {
            int64_t *nd = realloc(d, (size_t)(cap *= 2) * sizeof *nd);
            if (!nd) {
                free(d);
                return NULL;
            }
            d = nd;
        }
        d[(*n)++] = e;
    }
    return d;
}

/* Every (dp, cp, tp[, ep]) of N ranks, evaluated, into a->cands (sorted). */
static hp_status enumerate(const ctx *x, int64_t N, hp_advice *a, hp_err *err)
{
    bool moe = is_moe(x->m);
    int nd = 0;
    int64_t *dv = divisors(N, &nd);
    size_t cap = 64, n = 0;
    ranked *v = dv ? malloc(cap * sizeof *v) : NULL;
    if (!v) {
        free(dv);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    }
    /* pp outermost (its stages' mesh is the rest, N / pp ranks), with 2 virtual stages too in training */
    for (int z = 0; z < nd * 2; z++) {
        int64_t pp = dv[z / 2], virt = 1 + z % 2, Np = N / pp;
        if ((virt == 2 && (pp < 2 || !x->o->cost.train)) || (x->o->max_pp > 0 && pp > x->o->max_pp)) continue;
    for (int i = 0; i < nd; i++) {
        int64_t tp = dv[i];
        if (Np % tp) continue;
        for (int j = 0; j < nd; j++) {
            int64_t cp = dv[j];
            if ((Np / tp) % cp) continue;
            int64_t rest = Np / tp / cp; /* dp, or dp x ep on its own axis */
            for (int q = 0; q < (moe ? nd : 1); q++) {
                int64_t e = dv[q];
                for (int axis = 0; axis < 2; axis++) {
                    hp_advise_cand c = {.cp = cp, .tp = tp, .ep = e, .ep_axis = axis == 1, .pp = pp, .pp_virtual = virt};
                    if (axis == 0) { /* ep = 1, or TP-extend-EP over the whole dense region */
                        if (Np % e) continue;
                        c.dp = rest;
                    } else {
                        if (e < 2 || rest % e) continue;
                        c.dp = rest / e;
                    }
                    if (n == cap) {
                        ranked *nv = realloc(v, (cap *= 2) * sizeof *nv);
                        if (!nv) {
                            free(v);
                            free(dv);
                            return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
                        }
                        v = nv;
                    }
                    evaluate(x, &c);
                    v[n] = (ranked){c, (int)n, x->o->prefer_headroom ? c.seqs : 0};
                    n++;
                }
            }
        }
    }
    }
    free(dv);
    qsort(v, n, sizeof *v, by_rank);
    a->cands = malloc((n ? n : 1) * sizeof *a->cands);
    if (!a->cands) {
        free(v);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        a->cands[i] = v[i].c;
        a->n_ok += v[i].c.ok;
    }
    a->n_cands = (int)n;
    free(v);
    return HP_OK;
}

static double seconds_since(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + (double)(t1.tv_nsec - t0->tv_nsec) * 1e-9;
}

/* The templates of m under the plan options (the header): n_t of them into *out (a template the planner refuses
 * keeps its refusal; the EP one's refusal is the error). */
static hp_status templates_build(tmpl **out, int *n_out, const hp_model *m, const hp_plan_opts *po, hp_err *err)
{
    int n_t = is_moe(m) ? T_COUNT : 1;
    tmpl *t = calloc((size_t)n_t, sizeof *t);
    hp_status st = t ? HP_OK : hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n_t && st == HP_OK; i++) {
        hp_err e = {.status = HP_OK};
        t[i].refused.status = HP_OK;
        st = build_template(&t[i], i, m, po, &e);
        if (st != HP_OK && i == T_EP) hp_err_set(err, st, "%s", e.msg);
        if (i > T_EP && st == HP_ERR_INPUT) { /* only the candidates that need it are refused */
            t[i].refused = e;
            hp_cost_plan_free(t[i].k);
            hp_plan_free(t[i].p);
            t[i].k = NULL, t[i].p = NULL;
            st = HP_OK;
        } else if (st != HP_OK && i > T_EP) {
            hp_err_set(err, st, "%s", e.msg);
        }
    }
    *out = t, *n_out = t ? n_t : 0;
    return st;
}

struct hp__advise_tmpls {
    tmpl *t;
    int n_t;
};

static void templates_free(tmpl *t, int n_t)
{
    for (int i = 0; t && i < n_t; i++) {
        hp_cost_plan_free(t[i].k);
        hp_plan_free(t[i].p);
        free(t[i].tt);
    }
    free(t);
}

/* What the figures of o use, and where each setting comes from, into buf: "micro-batch 1 row per replica (the
 * default, Megatron's), recompute selective (the GPU default)". */
static void describe(char *buf, size_t cap, const hp_advise_opts *o)
{
    int64_t mb = hp_cost_default_micro_batch(&o->cost, 1);
    bool gpu = hp_cost_model_gpu(&o->cost.mdl);
    char m[96];
    if (o->cost.micro_batch == 0)
        snprintf(m, sizeof m, "micro-batch 1 row per replica (the default, Megatron's)");
    else
        snprintf(m, sizeof m, "micro-batch%s %lld row%s per replica (%s)", "", (long long)mb, mb == 1 ? "" : "s",
                 o->fixed_micro_batch ? "as given" : "the caller's");
    snprintf(buf, cap, "%s, recompute %s (%s)", m, hp_cost_recompute_name(o->cost.mdl.recompute),
             !gpu ? "hyperpar's runtime recomputes nothing" : o->fixed_recompute ? "as given" : "the GPU default");
}

/* Every mesh of o->world ranks, each the cost of its template in t. */
static hp_status advise_with(hp_advice **out, const hp_model *m, const tmpl *t, int n_t, const hp_advise_opts *o,
                             hp_err *err)
{
    *out = NULL;
    if (o->world < 1 || o->world > HP_MESH_MAX_SIZE)
        return hp_err_set(err, HP_ERR_INPUT, "advise: a world of %lld ranks; give between 1 and %d ranks",
                          (long long)o->world, HP_MESH_MAX_SIZE);
    /* The default batch: a row per rank, which every dp divides, and one batch for every candidate, so that their
     * step times compare (a row per replica would give each mesh its own batch). */
    if (o->prefer_headroom && !(o->cost.decode && o->mem_per_rank))
        return hp_err_set(err, HP_ERR_INPUT, "advise: preferring headroom ranks meshes by the sequences that fit; it "
                          "needs decode mode and a memory budget per rank");
    hp_advise_opts oo = *o;
    if (oo.cost.B == 0) oo.cost.B = o->world;
    o = &oo;
    hp_advice *a = calloc(1, sizeof *a);
    if (!a) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    a->world = o->world, a->mem_per_rank = o->mem_per_rank, a->B = o->cost.B, a->S = o->cost.S;
    a->train = o->cost.train;
    a->mdl = o->cost.mdl;
    a->micro_batch = hp_cost_default_micro_batch(&o->cost, 1); /* train: as given, else 1 row */
    a->decode = o->cost.decode, a->context = o->cost.decode ? o->cost.context : 0;
    a->prefer_headroom = o->prefer_headroom;
    if (a->train) describe(a->chosen, sizeof a->chosen, o);
    a->batch_err.status = HP_OK;
    a->batch_err.msg[0] = '\0';
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ctx x = {.m = m, .o = o, .batch_err = &a->batch_err};
    for (int i = 0; i < n_t; i++) x.t[i] = &t[i];
    hp_status st = enumerate(&x, o->world, a, err);
    a->search_seconds = seconds_since(&t0);
    if (st != HP_OK) {
        hp_advice_free(a);
        return st;
    }
    *out = a;
    return HP_OK;
}

/* ---- when nothing fits as asked: smaller micro-batches, then stronger recompute ----
 *
 * Training only, and only what the caller did not fix: for the recompute asked and then each stronger one (a GPU
 * profile; hyperpar's runtime has none), the micro-batch asked and then each power of two below it that divides it,
 * largest first (fewer, larger micro-batches run faster; recompute costs a forward more). The first setting under
 * which some mesh fits replaces the advice, which says so (hp_advice.relaxed, .chosen); when none does, the advice
 * as asked stands and says what was tried. */
static void relax(hp_advice **a, const hp_model *m, const tmpl *t, int n_t, const hp_advise_opts *o)
{
    hp_advice *first = *a;
    const hp_advise_cand *miss = first->n_cands ? &first->cands[0] : NULL;
    if (!o->cost.train || first->n_ok > 0 || !miss || !miss->binding) return; /* no mesh was over memory alone */
    bool gpu = hp_cost_model_gpu(&o->cost.mdl);
    int r0 = (int)o->cost.mdl.recompute, r1 = gpu && !o->fixed_recompute ? (int)HP_COST_RECOMPUTE_FULL : r0;
    int64_t mb0 = o->cost.micro_batch, mbs[64];
    int n_mb = 0;
    mbs[n_mb++] = mb0;
    for (int64_t q = (int64_t)1 << 30; !o->fixed_micro_batch && mb0 >= 2 && q >= 1; q /= 2)
        if (q < mb0 && mb0 % q == 0) mbs[n_mb++] = q;
    char was[560], now[640], b[2][32];
    snprintf(was, sizeof was, "nothing fitted with %.280s (the nearest: %.128s needs %s of %s)", first->chosen, miss->mesh,
             hp_format_bytes(miss->max_bytes, b[0], 32),
             hp_format_bytes(hp_cost_usable(&o->cost.mdl, o->mem_per_rank), b[1], 32));
    for (int r = r0; r <= r1; r++) {
        for (int i = 0; i < n_mb; i++) {
            if (r == r0 && i == 0) continue; /* the advice as asked */
            hp_advise_opts x = *o;
            x.cost.mdl.recompute = (hp_cost_recompute)r;
            x.cost.micro_batch = mbs[i];
            hp_advice *nx = NULL;
            hp_err e;
            if (advise_with(&nx, m, t, n_t, &x, &e) == HP_OK && nx->n_ok > 0) {
                nx->relaxed = true;
                nx->search_seconds += first->search_seconds;
                int64_t mb = nx->micro_batch;
                snprintf(nx->chosen, sizeof nx->chosen, "micro-batch %lld row%s per replica, recompute %s: chosen by "
                         "advise because %.500s", (long long)mb, mb == 1 ? "" : "s", hp_cost_recompute_name(x.cost.mdl.recompute),
                         was);
                hp_advice_free(first);
                *a = nx;
                return;
            }
            hp_advice_free(nx);
        }
    }
    char tried[96] = "nothing else was tried", kept[160] = "";
    if (r1 > r0 && n_mb > 1)
        snprintf(tried, sizeof tried, "nor with micro-batch %lld or recompute %s", (long long)mbs[n_mb - 1],
                 hp_cost_recompute_name((hp_cost_recompute)r1));
    else if (r1 > r0)
        snprintf(tried, sizeof tried, "nor with recompute %s", hp_cost_recompute_name((hp_cost_recompute)r1));
    else if (n_mb > 1)
        snprintf(tried, sizeof tried, "nor with micro-batch %lld", (long long)mbs[n_mb - 1]);
    if (o->fixed_micro_batch || o->fixed_recompute)
        snprintf(kept, sizeof kept, "; the %s%s%s given %s kept", o->fixed_micro_batch ? "--micro-batch" : "",
                 o->fixed_micro_batch && o->fixed_recompute ? " and " : "", o->fixed_recompute ? "--recompute" : "",
                 o->fixed_micro_batch && o->fixed_recompute ? "are" : "is");
    snprintf(now, sizeof now, "%s", first->chosen);
    snprintf(first->chosen, sizeof first->chosen, "%.300s; nothing fits, %s%s%s", now, tried, kept,
             gpu ? "" : " (hyperpar's runtime has no recompute)");
}

hp_status hp_advise(hp_advice **out, const hp_model *m, const hp_advise_opts *o, hp_err *err)
{
    *out = NULL;
    if (o->world < 1 || o->world > HP_MESH_MAX_SIZE)
        return hp_err_set(err, HP_ERR_INPUT, "advise: a world of %lld ranks; give between 1 and %d ranks",
                          (long long)o->world, HP_MESH_MAX_SIZE);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    tmpl *t = NULL;
    int n_t = 0;
    hp_status st = templates_build(&t, &n_t, m, &o->plan, err);
    double plan_s = seconds_since(&t0);
    struct hp__advise_tmpls *keep = st == HP_OK ? malloc(sizeof *keep) : NULL;
    if (st == HP_OK && !keep) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    if (st == HP_OK) st = advise_with(out, m, t, n_t, o, err);
    if (st == HP_OK) relax(out, m, t, n_t, o);
    if (st != HP_OK) {
        free(keep);
        templates_free(t, n_t);
        return st;
    }
    (*out)->plan_seconds = plan_s;
    *keep = (struct hp__advise_tmpls){t, n_t};
    (*out)->tmpls = keep; /* hp_advise_fit reruns the search on them */
    return HP_OK;
}

/* ---- hp_advise_fit: when no mesh fits, the nearest change under which one does ---- */

typedef struct fit_ctx {
    const hp_model *m;
    const tmpl *t;
    int n_t;
    const hp_advise_opts *o;
} fit_ctx;

static bool advise_try(void *vx, const hp_cost_opts *co, int64_t world, hp_fit_change *ch)
{
    const fit_ctx *x = vx;
    hp_advise_opts o = *x->o;
    o.cost = *co;
    o.world = world;
    if (o.cost.mdl.ranks_per_node > 0 && o.cost.mdl.ranks_per_node < world && world % o.cost.mdl.ranks_per_node)
        return false;
    hp_advice *a = NULL;
    hp_err err;
    bool fits = false;
    if (advise_with(&a, x->m, x->t, x->n_t, &o, &err) == HP_OK && a->n_ok > 0) {
        fits = true;
        ch->bytes = a->cands[0].max_bytes;
        snprintf(ch->mesh, sizeof ch->mesh, "%s", a->cands[0].mesh);
    }
    hp_advice_free(a);
    return fits;
}

hp_status hp_advise_fit(hp_fit *f, const hp_model *m, const hp_advise_opts *o, const hp_advice *a, hp_err *err)
{
    memset(f, 0, sizeof *f);
    f->budget = a->mem_per_rank, f->reserve = a->mem_per_rank ? a->mdl.mem_reserve : 0;
    if (a->n_ok > 0 || !a->n_cands) return HP_OK;
    const hp_advise_cand *c = &a->cands[0]; /* the nearest miss */
    f->binding = c->binding, f->binding_bytes = c->binding_bytes, f->total_bytes = c->max_bytes;
    if (!c->binding) return HP_OK; /* no mesh was evaluated: no memory to trade */
    tmpl *t = a->tmpls ? a->tmpls->t : NULL;
    int n_t = a->tmpls ? a->tmpls->n_t : 0;
    hp_status st = t ? HP_OK : templates_build(&t, &n_t, m, &o->plan, err);
    if (st == HP_OK) {
        fit_ctx x = {.m = m, .t = t, .n_t = n_t, .o = o};
        /* B 0 (the default, a row per rank) stays 0: with more ranks the batch follows the world, as the printed
         * command's would */
        int64_t B = o->cost.B ? o->cost.B : o->world;
        int64_t mb = !o->cost.train ? B : o->cost.micro_batch > 0 ? o->cost.micro_batch : 1; /* train: 1 row */
        hp__fit_search(f, &o->cost, mb, 0, 1, o->world, true, advise_try, &x);
    }
    if (!a->tmpls) templates_free(t, n_t);
    return st;
}

hp_status hp_advice_verdict(const hp_advice *a, hp_err *err)
{
    if (a->n_ok > 0) return HP_OK;
    bool figures = a->n_cands > 0 && a->cands[0].max_bytes > 0; /* the nearest miss was evaluated */
    if (a->batch_err.status != HP_OK && !figures) /* no mesh got figures, and the batch itself was refused */
        return hp_err_set(err, a->batch_err.status, "%s", a->batch_err.msg);
    char fb[32];
    return hp_err_set(err, HP_ERR_INPUT, "no mesh of %lld ranks fits in %s per rank (all %d rejected%s%.520s); give "
                      "more memory per rank (--mem-per-rank), another --world, or a smaller --batch / --seq",
                      (long long)a->world, hp_format_bytes(a->mem_per_rank, fb, sizeof fb), a->n_cands,
                      a->n_cands ? "; the nearest: " : "", a->n_cands ? a->cands[0].reason : "");
}

void hp_advice_free(hp_advice *a)
{
    if (!a) return;
    if (a->tmpls) templates_free(a->tmpls->t, a->tmpls->n_t);
    free(a->tmpls);
    free(a->cands);
    free(a);
}
