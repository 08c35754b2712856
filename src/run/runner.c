/*
 * runner.c — the executor: the decoder's forward graph, each module run through its boundary's contract.
 *
 *   embed → for each layer: input_layernorm → self_attn → (+ residual) → post_attention_layernorm → mlp →
 *   (+ residual) → norm → lm_head → loss
 *
 * For every module call (docs/run.md): the incoming layout must equal in_src; entry redistribution to in_dst;
 * the computation on local tensors, whose result layout follows from the weights' placements and must equal
 * out_src; exit redistribution to out_dst; deferred biases. Nothing about the family decides a collective:
 * an override that changes a contract changes what runs.
 */
#include "exec/prog.h"
#include "run/agree.h"
#include "run/finite.h"
#include "kernels/backward.h"
#include "kernels/modules.h"
#include "run/runner_int.h"

#include "hyperpar/overrides.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the program's transitions ---- */

/* The activation arrives as the program says (anything else is a runner defect, named); the entry moves it to
 * the layout the computation runs on. */
hp_status hp__r_enter(hp_runner *r, const hp__step *s, hp__act *a, hp_err *err)
{
    r->x.where = s->c.fqn;
    char t1[64], t2[64];
    if (!hp__lay_eq(&a->lay, &s->in))
        return hp_err_set(err, HP_ERR_INPUT, "internal error: %s: the input arrives as %s where the program says %s", s->c.fqn,
                          hp__lay_str(&a->lay, t1, sizeof t1), hp__lay_str(&s->in, t2, sizeof t2));
    if (!s->c.has_in) return HP_OK;
    char what[200];
    snprintf(what, sizeof what, "boundary %s (entry)", s->c.fqn);
    const char *coll;
    return hp__redistribute(&r->x, a, &s->run, what, &coll, err);
}

/* The computation's output, as the program says, moved to the layout it leaves in. */
hp_status hp__r_leave(hp_runner *r, const hp__step *s, hp__act *a, hp_err *err)
{
    snprintf(r->tr.exit_coll, sizeof r->tr.exit_coll, "none");
    char t1[64], t2[64];
    if (!hp__lay_eq(&a->lay, &s->out))
        return hp_err_set(err, HP_ERR_INPUT, "internal error: %s: the computation gives %s where the program says %s", s->c.fqn,
                          hp__lay_str(&a->lay, t1, sizeof t1), hp__lay_str(&s->out, t2, sizeof t2));
    if (!s->c.has_out) return HP_OK;
    char what[200];
    snprintf(what, sizeof what, "boundary %s (exit)", s->c.fqn);
    const char *coll = "identity";
    hp_status st = hp__redistribute(&r->x, a, &s->leave, what, &coll, err);
    snprintf(r->tr.exit_coll, sizeof r->tr.exit_coll, "%s", coll);
    return st;
}

/* Adds bias[lo2 + i] to every row; on an axis where a is a partial sum only index 0 adds it. */
static void add_bias(const hp_runner *r, hp__act *a, const hp__w *b)
{
    if (!b->present) return;
    for (int ax = 0; ax < HP__NAX; ax++)
        if (a->lay.ax[ax].kind == HP_PL_P && r->x.pos.r[ax] != 0) return;
    const float *bv = b->d;
    int64_t rows = a->n[0] * a->n[1], X = a->n[2], lo = a->lo[2];
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < X; j++) a->d[i * X + j] += bv[lo + j];
}

/* The bytes hp__gather_full allocates on rank 0 for a: [B_all, S, X] + 1 floats. */
static size_t gathered_bytes(int64_t B_all, const hp__act *a)
{
    return ((size_t)(B_all * a->g[1] * a->g[2]) + 1) * sizeof(float);
}

hp_status hp__r_record(hp_runner *r, const char *what, const char *coll, hp__act *a, hp_err *err)
{
    hp__nf_watch(&r->tr.nf, what, a, r->x.dp_rows[r->x.dp_r]);
    if (!r->o.record || r->tr.quiet) return HP_OK;
    if (r->tr.perturb && !strcmp(r->tr.perturb, what) && hp_comm_size(r->pipe.all) > 1 && hp__act_count(a) > 0)
        a->d[0] += 1e-2f; /* a wrong collective in miniature: validate must name this boundary first */
    for (int ax = 0; ax < HP__NAX; ax++)
        if (a->lay.ax[ax].kind == HP_PL_P) return HP_OK; /* nothing to compare until it is reduced */
    float *full = NULL;
    hp_status st = hp__gather_full(&r->x, a, r->x.B_all, r->x.dp_rows, &full, err);
    if (st == HP_OK && full) {
        int64_t S = r->x.S_orig, Sp = a->g[1], X = a->g[2]; /* cp pads the sequence: the padding is not handed on */
        for (int64_t b = 0; Sp != S && b < r->x.B_all; b++)
            memmove(full + b * S * X, full + b * Sp * X, (size_t)(S * X) * sizeof *full);
        char at[128]; /* under a pipeline, the stage that ran it */
        if (r->pipe.pp > 1) snprintf(at, sizeof at, "%s (stage %lld)", coll, (long long)r->pipe.stage);
        r->o.record(r->o.record_ctx, what, r->pipe.pp > 1 ? at : coll, full, r->x.B_all, S, X);
    }
    hp__mem_free(&r->x, full, gathered_bytes(r->x.B_all, a));
    return st;
}

/* ---- loading: the weights of every step, checked against the program's local dims ---- */

hp_status hp__r_linear(hp_runner *r, hp__w *w, const hp__w *bias, hp_linear **out, hp_err *err)
{
    hp_linear_desc d = {.n_out = w->shape[0], .n_in = w->shape[1], .n_mats = 1, .dtype = w->dt, .w = w->d,
                        .bias = bias && bias->present ? bias->d : NULL, .mode = r->o.compute};
    return hp_linear_init(out, r->w.la, &d, err);
}

typedef struct loader {
    hp_runner *r;
    char name[256];
    hp_err *err;
} loader;

/* keep_bf16: a matrix the products read as bf16. Training keeps it so only where it trains in BF16 compute (its
 * bf16 copy is then the master's rounding, train.c); otherwise the forward reads f32: the master it trains, or a
 * frozen tensor widened, whose input gradient the backward multiplies by it. */
static hp_status load(loader *L, const char *fqn, const char *rel, bool required, bool keep_bf16, hp__w *w)
{
    snprintf(L->name, sizeof L->name, "%s.%s", fqn, rel);
    if (keep_bf16 && L->r->o.keep_activations) {
        const hp_param *mp = hp_model_find_param(L->r->m, L->name);
        keep_bf16 = L->r->o.compute == HP_LINALG_BF16 && mp && mp->trainable;
    }
    hp_status st = hp__w_load(&L->r->w.ws, L->name, required, keep_bf16, w, L->err);
    if (st == HP_OK && w->present) st = hp__wreg_add(&L->r->w.wreg, w, NULL, L->name, L->err);
    return st;
}

/* A vector (bias, norm weight) as f32 of the expected local length. */
static hp_status load_vec(loader *L, const char *fqn, const char *rel, bool required, int64_t n, hp__w *w)
{
    hp_status st = load(L, fqn, rel, required, false, w);
    if (st == HP_OK && w->present && (w->n_dims != 1 || w->shape[0] != n))
        st = hp_err_set(L->err, HP_ERR_INPUT, "'%s' holds %lld values on this rank where %lld are needed",
                        L->name, (long long)(w->n_dims ? w->shape[0] : 1), (long long)n);
    return st;
}

hp__w *hp__slot_w(step_w *w, hp__op op, hp__pslot slot)
{
    attn_w *a = &w->at;
    mlp_w *m = &w->mlp;
    switch (slot) {
    case HP__PS_W: return op == HP__OP_NORM ? &w->norm.w : &w->table;
    case HP__PS_Q: return &a->wq;
    case HP__PS_K: return &a->wk;
    case HP__PS_V: return &a->wv;
    case HP__PS_O: return &a->wo;
    case HP__PS_BQ: return &a->bq;
    case HP__PS_BK: return &a->bk;
    case HP__PS_BV: return &a->bv;
    case HP__PS_BO: return &a->bo;
    case HP__PS_QN: return &a->qn;
    case HP__PS_KN: return &a->kn;
    case HP__PS_SINKS: return &a->sinks;
    case HP__PS_QA: return &a->wqa;
    case HP__PS_QAN: return &a->qan;
    case HP__PS_KVA: return &a->wkva;
    case HP__PS_KVAN: return &a->kvan;
    case HP__PS_KVB: return &a->wkvb;
    case HP__PS_GU: return &m->wgu;
    case HP__PS_BGU: return &m->bgu;
    case HP__PS_G: return &m->wg;
    case HP__PS_BG: return &m->bg;
    case HP__PS_U: return &m->wu;
    case HP__PS_BU: return &m->bu;
    case HP__PS_D: return &m->wd;
    case HP__PS_BD: return &m->bd;
    }
    return NULL;
}

/* A vector's local length on this rank (the parameter table's hp__plen). */
static int64_t plen(const hp_runner *r, const hp__step *s, const step_w *w, hp__plen len)
{
    const hp__rcfg *c = &r->g.cfg;
    switch (len) {
    case HP__LEN_H: return c->H;
    case HP__LEN_Q: return s->nh * c->hd;
    case HP__LEN_KV: return s->nkv * c->hd;
    case HP__LEN_HD: return c->hd;
    case HP__LEN_HEADS: return s->nh;
    case HP__LEN_QL: return r->g.mla.ql;
    case HP__LEN_KVL: return r->g.mla.kvl;
    case HP__LEN_I: return w->mlp.I;
    case HP__LEN_2I: return 2 * w->mlp.I;
    case HP__LEN_NONE: break;
    }
    return 0;
}

/* Step s's parameters from the op's table (exec/prog.h): the required ones, or (optional) the optional ones, whose
 * lengths follow from the required ones' shapes. Matrices are read as the products read them (bf16 kept where
 * training allows: load), vectors as f32 of their local length. */
static hp_status load_params(loader *L, const hp__step *s, step_w *w, bool optional)
{
    size_t n;
    const hp__pdef *d = hp__op_params(s->op, &n);
    hp_status st = HP_OK;
    for (size_t i = 0; i < n && st == HP_OK; i++) {
        if (!hp__pdef_on(&d[i], &L->r->g, s) || !(d[i].flags & HP__P_OPT) != !optional) continue;
        hp__w *t = hp__slot_w(w, s->op, d[i].slot);
        st = d[i].flags & HP__P_VEC ? load_vec(L, s->c.fqn, d[i].rel, !optional, plen(L->r, s, w, d[i].len), t)
                                    : load(L, s->c.fqn, d[i].rel, true, true, t);
    }
    return st;
}

static hp_status load_mla(loader *L, const hp__step *s, step_w *w)
{
    hp_runner *r = L->r;
    hp_err *err = L->err;
    attn_w *a = &w->at;
    const hp_model_config *mc = &r->m->cfg;
    const char *fqn = s->c.fqn;
    int64_t H = r->g.cfg.H;
    a->mla = true;
    a->nope = mc->qk_nope_head_dim, a->rope = mc->qk_rope_head_dim, a->vd = mc->v_head_dim;
    a->ql = mc->q_lora_rank, a->kvl = mc->kv_lora_rank;
    int64_t qk = a->nope + a->rope;
    hp_status st = load_params(L, s, w, false);
    if (st != HP_OK) return st;
    int64_t qin = a->ql > 0 ? a->ql : H;
    if ((a->ql > 0 && (a->wqa.shape[0] != a->ql || a->wqa.shape[1] != H)) || a->wq.shape[0] != a->nh * qk ||
        a->wq.shape[1] != qin || a->wkva.shape[0] != a->kvl + a->rope || a->wkva.shape[1] != H ||
        a->wkvb.shape[0] != a->nh * (a->nope + a->vd) || a->wkvb.shape[1] != a->kvl || a->wo.shape[0] != H ||
        a->wo.shape[1] != a->nh * a->vd)
        return hp_err_set(err, HP_ERR_INPUT, "%s: the MLA projections' shapes on this rank do not fit %lld heads of "
                          "nope %lld + rope %lld, v %lld, q_lora %lld, kv_lora %lld (check config.json)", fqn,
                          (long long)a->nh, (long long)a->nope, (long long)a->rope, (long long)a->vd,
                          (long long)a->ql, (long long)a->kvl);
    if ((st = load_params(L, s, w, true)) != HP_OK) return st;
    if (a->ql > 0 && (st = hp__r_linear(r, &a->wqa, NULL, &a->qa, err)) != HP_OK) return st;
    if ((st = hp__r_linear(r, &a->wq, NULL, &a->q, err)) != HP_OK) return st;
    if ((st = hp__r_linear(r, &a->wkva, NULL, &a->kva, err)) != HP_OK) return st;
    if ((st = hp__r_linear(r, &a->wkvb, NULL, &a->kvb, err)) != HP_OK) return st;
    return hp__r_linear(r, &a->wo, NULL, &a->o, err);
}

static hp_status load_attn(loader *L, const hp__step *s, step_w *w)
{
    hp_runner *r = L->r;
    hp_err *err = L->err;
    attn_w *a = &w->at;
    const hp__rcfg *c = &r->g.cfg;
    const char *fqn = s->c.fqn;
    a->s = s;
    a->split = s->split, a->nh = s->nh, a->nkv = s->nkv, a->bo_deferred = s->bias_deferred;
    if (s->op == HP__OP_MLA) return load_mla(L, s, w);
    hp_status st = load_params(L, s, w, false);
    if (st != HP_OK) return st;
    int64_t hd = c->hd, H = c->H;
    if (a->wq.shape[0] != a->nh * hd || a->wq.shape[1] != H || a->wk.shape[0] != a->nkv * hd || a->wk.shape[1] != H ||
        a->wv.shape[0] != a->nkv * hd || a->wo.shape[0] != H || a->wo.shape[1] != a->nh * hd)
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: the projections' shapes on this rank do not fit %lld heads of %lld (q %lldx%lld, k "
                          "%lldx%lld, o %lldx%lld; check head_dim in config.json)",
                          fqn, (long long)a->nh, (long long)hd, (long long)a->wq.shape[0], (long long)a->wq.shape[1],
                          (long long)a->wk.shape[0], (long long)a->wk.shape[1], (long long)a->wo.shape[0],
                          (long long)a->wo.shape[1]);
    st = load_params(L, s, w, true);
    if (st == HP_OK) st = hp__r_linear(r, &a->wq, &a->bq, &a->q, err);
    if (st == HP_OK) st = hp__r_linear(r, &a->wk, &a->bk, &a->k, err);
    if (st == HP_OK) st = hp__r_linear(r, &a->wv, &a->bv, &a->v, err);
    if (st == HP_OK) st = hp__r_linear(r, &a->wo, NULL, &a->o, err);
    return st;
}

static hp_status load_mlp(loader *L, const hp__step *s, step_w *w)
{
    hp_runner *r = L->r;
    hp_err *err = L->err;
    mlp_w *m = &w->mlp;
    const char *fqn = s->c.fqn;
    int64_t H = r->g.cfg.H;
    m->s = s;
    m->split = s->split, m->bd_deferred = s->bias_deferred;
    hp_status st = load_params(L, s, w, false);
    if (st != HP_OK) return st;
    if (s->fused) {
        m->I = m->wgu.shape[0] / 2;
        if (m->wgu.shape[0] % 2 || m->wgu.shape[1] != H)
            return hp_err_set(err, HP_ERR_INPUT, "%s.gate_up_proj.weight has an odd row count or a width other than "
                              "hidden_size", fqn);
    } else {
        m->I = m->wg.shape[0];
        if (m->wg.shape[1] != H || m->wu.shape[0] != m->I || m->wu.shape[1] != H)
            return hp_err_set(err, HP_ERR_INPUT, "%s: gate_proj and up_proj shapes disagree on this rank", fqn);
    }
    int64_t want = hp__step_local_I(&r->g, s, r->x.pos.r[HP__TP]);
    if (m->I != want)
        return hp_err_set(err, HP_ERR_INPUT, "%s: this rank holds %lld intermediate columns where the plan's cut of "
                          "%lld over tp=%lld gives it %lld", fqn, (long long)m->I, (long long)s->I,
                          (long long)r->x.pos.n[HP__TP], (long long)want);
    if (m->wd.shape[0] != H || m->wd.shape[1] != m->I)
        return hp_err_set(err, HP_ERR_INPUT, "%s.down_proj.weight is [%lld, %lld] on this rank where [%lld, %lld] "
                          "is needed", fqn, (long long)m->wd.shape[0], (long long)m->wd.shape[1], (long long)H,
                          (long long)m->I);
    if ((st = load_params(L, s, w, true)) != HP_OK) return st;
    if (s->fused) st = hp__r_linear(r, &m->wgu, &m->bgu, &m->gate_up, err);
    else {
        st = hp__r_linear(r, &m->wg, &m->bg, &m->gate, err);
        if (st == HP_OK) st = hp__r_linear(r, &m->wu, &m->bu, &m->up, err);
    }
    if (st == HP_OK) st = hp__r_linear(r, &m->wd, NULL, &m->down, err);
    return st;
}

/* A sparse block: its EP compute runs the EP runtime on the rank's local rows; with experts cut over tp (the
 * program's split) each tp rank holds a column block of every local expert and of the shared expert. */
static hp_status load_moe(loader *L, const hp__step *s, moe_w *w)
{
    hp_runner *r = L->r;
    hp_err *err = L->err;
    const char *fqn = s->c.fqn;
    w->s = s;
    w->tp_cut = s->split;
    hp_moe_load_opts lo;
    hp_moe_load_opts_default(&lo);
    lo.compute = r->o.compute;
    lo.archetype = s->archetype;
    if (r->o.keep_activations) { /* training: the experts owned and f32 (the optimizer updates them) */
        lo.no_zero_copy = true;
        lo.widen_f32 = true;
    }
    hp_ep_local_experts(r->m->cfg.n_experts, r->ep, r->ep_index, &lo.first_expert, &lo.n_local);
    if (w->tp_cut) {
        lo.tp_size = r->x.pos.n[HP__TP];
        lo.tp_rank = r->x.pos.r[HP__TP];
    }
    /* Whole experts over a tp group from a shard folder (TP-extend-EP): shard cuts the shared expert over tp,
     * but the rows here are split by sequence, so each rank needs it whole: its rank file's block is read now
     * and the others are gathered over tp once every rank has loaded (gather_shared). */
    lo.shared_tp_slice = r->o.shards && !w->tp_cut && r->x.pos.n[HP__TP] > 1;
    hp_status st = r->o.shards ? hp_moe_layer_load_shard(&w->l, r->o.shards, r->m, hp_comm_rank(r->x.world),
                                                         s->layer, &lo, err)
                               : hp_moe_layer_load(&w->l, r->m, s->layer, &lo, err);
    if (st == HP_OK) st = hp__wreg_add(&r->w.wreg, NULL, w->l, fqn, err);
    if (st != HP_OK) return st;
    w->cf = s->cf;
    w->overlap = r->o.overlap || s->overlap;
    /* The resident figure counts every array the layer holds, each in its resident dtype (the router in f64, a
     * shared expert whole under TP-extend-EP); the share as stored counts its routed experts only. */
    r->w.ws.resident += hp_moe_layer_resident_bytes(w->l);
    r->w.ws.share += hp_moe_layer_expert_bytes(w->l);
    return HP_OK;
}

/* The shared experts a shard folder holds as tp blocks (load_moe's shared_tp_slice), made whole over each tp
 * group. Every rank takes the same branches: the plan and config decide, not what a rank file holds. The
 * whole shared expert is what the checkpoint path holds too, so resident and step figures are unchanged. */
static hp_status gather_shared(hp_runner *r, hp_err *err)
{
    hp_status st = HP_OK;
    if (!r->o.shards || r->x.pos.n[HP__TP] <= 1) return HP_OK;
    for (size_t i = 0; i < r->g.n_steps && st == HP_OK; i++)
        if (r->g.steps[i].op == HP__OP_MOE && !r->w.sw[i].moe.tp_cut)
            st = hp_moe_layer_gather_shared(r->w.sw[i].moe.l, r->x.axc[HP__TP], err);
    return st;
}

static hp_status load_norm(loader *L, const hp__step *s, step_w *w)
{
    w->norm.s = s;
    return load_params(L, s, w, false);
}

/* The embedding (or an untied head): [vocab_size, hidden_size], this rank's rows. */
static hp_status load_table(loader *L, const char *fqn, hp__w *w)
{
    const hp__rcfg *c = &L->r->g.cfg;
    /* training holds it f32: the lookup reads the master itself in either compute (autocast leaves it f32) */
    hp_status st = load(L, fqn, "weight", true, !L->r->o.keep_activations, w);
    if (st == HP_OK && (w->n_dims != 2 || w->shape[1] != c->H || w->global[0] != c->V))
        st = hp_err_set(L->err, HP_ERR_INPUT, "%s.weight is not [vocab_size, hidden_size]", fqn);
    return st;
}

/* The op record's load entries (ops.c). */
hp_status hp__load_embed(hp_runner *r, const hp__step *s, step_w *w, hp_err *err)
{
    loader L = {.r = r, .err = err};
    hp_status st = load_table(&L, s->c.fqn, &w->table);
    r->w.embed = &w->table;
    return st;
}

hp_status hp__load_norm(hp_runner *r, const hp__step *s, step_w *w, hp_err *err)
{
    loader L = {.r = r, .err = err};
    return load_norm(&L, s, w);
}

hp_status hp__load_attn(hp_runner *r, const hp__step *s, step_w *w, hp_err *err)
{
    loader L = {.r = r, .err = err};
    return load_attn(&L, s, w);
}

hp_status hp__load_mlp(hp_runner *r, const hp__step *s, step_w *w, hp_err *err)
{
    loader L = {.r = r, .err = err};
    return load_mlp(&L, s, w);
}

hp_status hp__load_moe(hp_runner *r, const hp__step *s, step_w *w, hp_err *err)
{
    loader L = {.r = r, .err = err};
    return load_moe(&L, s, &w->moe);
}

/* lm_head, or (tied) the embedding's slice under the column-parallel contract */
hp_status hp__load_head(hp_runner *r, const hp__step *s, step_w *w, hp_err *err)
{
    loader L = {.r = r, .err = err};
    hp_status st = r->g.tied ? HP_OK : load_table(&L, s->c.fqn, &w->table);
    if (st != HP_OK) return st;
    r->w.head_w = r->g.tied ? r->w.embed : &w->table;
    hp__w hcopy = *r->w.head_w;
    return hp__r_linear(r, &hcopy, NULL, &r->w.head, err);
}

void hp__free_step_w(step_w *w)
{
    attn_w *a = &w->at;
    hp_linear_free(a->q), hp_linear_free(a->k), hp_linear_free(a->v), hp_linear_free(a->o);
    hp_linear_free(a->qa), hp_linear_free(a->kva), hp_linear_free(a->kvb);
    mlp_w *m = &w->mlp;
    hp_linear_free(m->gate), hp_linear_free(m->up), hp_linear_free(m->gate_up), hp_linear_free(m->down);
    hp__w *v[] = {&a->wq, &a->wk, &a->wv, &a->wo, &a->bq, &a->bk, &a->bv, &a->bo, &a->qn, &a->kn, &a->sinks,
                  &a->wqa, &a->qan, &a->wkva, &a->kvan, &a->wkvb, &m->wg, &m->wu, &m->wgu, &m->wd, &m->bg,
                  &m->bu, &m->bgu, &m->bd, &w->norm.w, &w->table};
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) hp__w_free(v[i]);
    hp_moe_layer_free(w->moe.l);
    hp__act_free(&w->moe.topk);
}

static hp_status load_all(hp_runner *r, hp_err *err)
{
    const hp__prog *g = &r->g;
    r->w.sw = hp_calloc(g->n_steps + 1, sizeof *r->w.sw);
    if (!r->w.sw) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    hp_status st = HP_OK;
    for (size_t i = 0; i < g->n_steps && st == HP_OK; i++) {
        const hp__step *s = &g->steps[i];
        const hp__op_rt *o = &hp__op_rt_table[s->op];
        if (o->load && hp__r_step_loaded(r, s)) st = o->load(r, s, &r->w.sw[i], err);
    }
    return st;
}

bool hp__r_step_loaded(const hp_runner *r, const hp__step *s)
{
    return r->pipe.pp == 1 || s->chunk % r->pipe.pp == r->pipe.stage ||
           (s->op == HP__OP_EMBED && r->g.tied && r->pipe.stage == r->pipe.pp - 1);
}

/* ---- forward ---- */

/* Runner buffer i of at least n floats (contents undefined), kept across calls. */
float *hp__r_buf(hp_runner *r, int i, int64_t n, hp_err *err)
{
    size_t want = (size_t)(n > 0 ? n : 1);
    if (want > r->sc.buf_cap[i]) {
        float *p = hp__mem_realloc(&r->x, r->sc.buf[i], r->sc.buf_cap[i] * sizeof *p, want * sizeof *p);
        if (!p) {
            hp_err_set(err, HP_ERR_NOMEM, "out of memory for %zu floats", want);
            return NULL;
        }
        r->sc.buf[i] = p;
        r->sc.buf_cap[i] = want;
    }
    return r->sc.buf[i];
}

hp_status hp__r_act_copy(hp_runner *r, hp__act *dst, const hp__act *src, hp_err *err)
{
    hp_status st = hp__act_alloc(&r->x, dst, src->g[0], src->g[1], src->g[2], src->lay, err);
    if (st == HP_OK) memcpy(dst->d, src->d, (size_t)hp__act_count(src) * sizeof *dst->d);
    return st;
}

void hp__gu_layout(bool fused, int64_t rows, int64_t I, int64_t *ld, int64_t *up)
{
    *ld = fused ? 2 * I : I;
    *up = fused ? I : rows * I;
}

static hp_status lin_fwd(hp_linear *l, int64_t rows, const float *a, int64_t lda, float *c, int64_t ldc, hp_err *err)
{
    return hp_linear_forward(l, 0, rows, a, lda, c, ldc, false, err);
}

/* The step's output [B, S, X] on the input's rows, laid out as the program says. */
static hp_status out_of(hp_runner *r, const hp__step *s, const hp__act *in, hp__act *out, hp_err *err)
{
    return hp__act_alloc(&r->x, out, in->g[0], in->g[1], s->X, s->out, err);
}

hp_status hp__r_norm(hp_runner *r, norm_w *n, const hp__act *in, hp__act *out, hp_err *err)
{
    hp_status st = hp__r_act_copy(r, out, in, err);
    if (st == HP_OK) st = hp__r_enter(r, n->s, out, err);
    if (st != HP_OK) return st;
    hp__rmsnorm(out->d, out->n[0] * out->n[1], out->n[2], n->w.d, r->g.cfg.eps, out->d);
    if ((st = hp__r_leave(r, n->s, out, err)) != HP_OK) return st;
    return hp__r_record(r, n->s->c.fqn, r->tr.exit_coll, out, err);
}

/* MLA's rope, forward (rotate) or backward (rotate back) over Bl rows of sq positions: the one rope head kr (channels
 * [0, rope) of rows of kstride floats) and q's rope channels [nope, nope + rope) of nh heads of qk; the tables are
 * hp__r_rope's, made for these positions. */
void hp__mla_rope(hp_runner *r, bool interleave, float *kr, int64_t kstride, float *q, int64_t nh, int64_t qk,
                  int64_t nope, int64_t rope, int64_t Bl, int64_t sq, bool backward)
{
    const float *cs = r->sc.rope_cos, *sn = r->sc.rope_sin;
    for (int64_t b = 0; b < Bl; b++) {
        float *kb = kr + b * sq * kstride, *qb = q + b * sq * nh * qk;
        if (interleave && backward) {
            hp__rope_backward_pairs(kb, sq, 1, kstride, 0, rope, cs, sn);
            hp__rope_backward_pairs(qb, sq, nh, qk, nope, rope, cs, sn);
        } else if (interleave) {
            hp__rope_apply_pairs(kb, sq, 1, kstride, 0, rope, cs, sn);
            hp__rope_apply_pairs(qb, sq, nh, qk, nope, rope, cs, sn);
        } else if (backward) {
            hp__rope_backward_at(kb, sq, 1, kstride, 0, rope, cs, sn);
            hp__rope_backward_at(qb, sq, nh, qk, nope, rope, cs, sn);
        } else {
            hp__rope_apply_at(kb, sq, 1, kstride, 0, rope, cs, sn);
            hp__rope_apply_at(qb, sq, nh, qk, nope, rope, cs, sn);
        }
    }
}

hp_status hp__r_rope(hp_runner *r, int64_t pos0, int64_t n, hp_err *err)
{
    if (r->sc.rope_cos && r->sc.rope_pos0 == pos0 && r->sc.rope_n == n) return HP_OK;
    /* the two tables of hp__rope_table: (n·rot/2 + 1) floats each */
    size_t tab = ((size_t)(n * (r->g.cfg.rot / 2)) + 1) * sizeof(float);
    hp__mem_free(&r->x, r->sc.rope_cos, r->sc.rope_bytes);
    hp__mem_free(&r->x, r->sc.rope_sin, r->sc.rope_bytes);
    r->sc.rope_cos = r->sc.rope_sin = NULL;
    r->sc.rope_bytes = 0;
    hp_status st = hp__rope_table(&r->g.cfg, pos0, n, &r->sc.rope_cos, &r->sc.rope_sin, err);
    if (st == HP_OK) {
        r->sc.rope_bytes = tab;
        hp__mem_count(&r->x, 0, 2 * tab);
    }
    r->sc.rope_pos0 = pos0;
    r->sc.rope_n = n;
    return st;
}

/* hp__attention with its block scratch (hp__attention_scratch_bytes, held while it runs) counted. */
hp_status hp__r_attention(hp_runner *r, const hp__attn_args *aa, hp_err *err)
{
    size_t sc = hp__attention_scratch_bytes(aa);
    hp__mem_count(&r->x, 0, sc);
    hp_status st = hp__attention(aa, err);
    hp__mem_count(&r->x, sc, 0);
    return st;
}

/* DeepSeek-V3's multi-head latent attention on local tensors (spec/transformers_forward.md, DeepSeek-V3). */
static hp_status mla_apply(hp_runner *r, int64_t layer, attn_w *a, hp__act *t, hp__act *out, hp_err *err)
{
    const hp__rcfg *c = &r->g.cfg;
    int64_t Bl = t->n[0], sq = t->n[1], rows = Bl * sq, H = c->H, nh = a->nh;
    int64_t nope = a->nope, rope = a->rope, vd = a->vd, qk = nope + rope, kvl = a->kvl;
    hp_status st = HP_OK;
    hp__act *k = &r->sc.k, *v = &r->sc.v;
    hp__lay kl = {{hp_pl_r(), t->lay.ax[HP__CP]}};
    int64_t lat = kvl + rope, qa_n = a->ql > 0 ? a->ql : 0;
    int64_t bw[HP__NBUF];
    hp__step_row_widths(&r->g, a->s, r->x.pos.r[HP__TP], bw);
    float *q = hp__r_buf(r, 0, rows * bw[0], err), *o = q ? hp__r_buf(r, 1, rows * bw[1], err) : NULL;
    float *tmp = o ? hp__r_buf(r, 2, rows * bw[2], err) : NULL;
    if (!tmp) return HP_ERR_NOMEM;
    float *kva = tmp, *qa = kva + rows * lat, *ckv = qa + rows * qa_n, *kv = ckv + rows * kvl;
    if (a->ql > 0) {
        st = lin_fwd(a->qa, rows, t->d, H, qa, a->ql, err);
        if (st == HP_OK) hp__rmsnorm(qa, rows, a->ql, a->qan.d, 1e-6, qa); /* DeepseekV3RMSNorm's default eps */
        if (st == HP_OK) st = lin_fwd(a->q, rows, qa, a->ql, q, nh * qk, err);
    } else {
        st = lin_fwd(a->q, rows, t->d, H, q, nh * qk, err);
    }
    if (st == HP_OK) st = lin_fwd(a->kva, rows, t->d, H, kva, lat, err);
    if (st != HP_OK) return st;
    for (int64_t i = 0; i < rows; i++) memcpy(ckv + i * kvl, kva + i * lat, (size_t)kvl * sizeof *ckv);
    hp__rmsnorm(ckv, rows, kvl, a->kvan.d, 1e-6, ckv);
    if ((st = lin_fwd(a->kvb, rows, ckv, kvl, kv, nh * (nope + vd), err)) != HP_OK) return st;
    int64_t p0 = r->pos0 + t->lo[1]; /* the first query's position (after a KV cache's) */
    if ((st = hp__r_rope(r, p0, sq, err)) != HP_OK) return st;
    /* k_rot: one head, rotated, then broadcast to every head; q's rope channels rotated per head */
    hp__mla_rope(r, c->interleave, kva + kvl, lat, q, nh, qk, nope, rope, Bl, sq, false);
    if ((st = hp__act_alloc(&r->x, k, t->g[0], t->g[1], nh * qk, kl, err)) != HP_OK) return st;
    if ((st = hp__act_alloc(&r->x, v, t->g[0], t->g[1], nh * vd, kl, err)) != HP_OK) return st;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t h = 0; h < nh; h++) {
            const float *src = kv + (i * nh + h) * (nope + vd);
            float *kd = k->d + (i * nh + h) * qk;
            memcpy(kd, src, (size_t)nope * sizeof *kd);
            memcpy(kd + nope, kva + i * lat + kvl, (size_t)rope * sizeof *kd);
            memcpy(v->d + (i * nh + h) * vd, src + nope, (size_t)vd * sizeof *kd);
        }
    hp__lay whole = {{hp_pl_r(), hp_pl_r()}};
    const char *coll;
    char what[200];
    snprintf(what, sizeof what, "boundary %s (cp K/V all-gather)", a->s->c.fqn);
    if (kl.ax[HP__CP].kind == HP_PL_S) st = hp__redistribute(&r->x, k, &whole, what, &coll, err);
    if (st == HP_OK && kl.ax[HP__CP].kind == HP_PL_S) st = hp__redistribute(&r->x, v, &whole, what, &coll, err);
    double scale = hp__mla_scale(c, qk);
    if (st == HP_OK) {
        hp__attn_args aa = {.B = Bl, .sq = sq, .nh = nh, .nkv = nh, .hd = qk, .hdv = vd, .scale = scale, .q = q,
                            .q_pos0 = p0, .window = c->window[layer], .out = o, .mode = r->o.compute};
        st = hp__kv_attend(r, a->s, &aa, k, v, err);
    }
    if (st == HP_OK) st = out_of(r, a->s, t, out, err);
    if (st == HP_OK) st = lin_fwd(a->o, rows, o, nh * vd, out->d, H, err);
    return st;
}

hp_status hp__r_attn(hp_runner *r, int64_t layer, attn_w *a, hp__act *t, hp__act *out, hp_err *err)
{
    const hp__rcfg *c = &r->g.cfg;
    hp_status st = hp__r_enter(r, a->s, t, err);
    if (st != HP_OK) return st;
    if (a->mla) {
        if ((st = mla_apply(r, layer, a, t, out, err)) != HP_OK) return st;
        if (!a->bo_deferred) add_bias(r, out, &a->bo);
        if ((st = hp__r_leave(r, a->s, out, err)) != HP_OK) return st;
        if (a->bo_deferred) add_bias(r, out, &a->bo);
        return hp__r_record(r, a->s->c.fqn, r->tr.exit_coll, out, err);
    }
    int64_t Bl = t->n[0], sq = t->n[1], rows = Bl * sq, hd = c->hd, H = c->H, nh = a->nh, nkv = a->nkv;
    hp__act *k = &r->sc.k, *v = &r->sc.v;
    int64_t bw[HP__NBUF];
    hp__step_row_widths(&r->g, a->s, r->x.pos.r[HP__TP], bw);
    float *q = hp__r_buf(r, 0, rows * bw[0], err), *o = q ? hp__r_buf(r, 1, rows * bw[1], err) : NULL;
    hp__lay kl = {{hp_pl_r(), t->lay.ax[HP__CP]}};
    if (!q || !o) st = HP_ERR_NOMEM;
    if (st == HP_OK) st = hp__act_alloc(&r->x, k, t->g[0], t->g[1], nkv * hd, kl, err);
    if (st == HP_OK) st = hp__act_alloc(&r->x, v, t->g[0], t->g[1], nkv * hd, kl, err);
    if (st == HP_OK) st = lin_fwd(a->q, rows, t->d, H, q, nh * hd, err);
    if (st == HP_OK) st = lin_fwd(a->k, rows, t->d, H, k->d, nkv * hd, err);
    if (st == HP_OK) st = lin_fwd(a->v, rows, t->d, H, v->d, nkv * hd, err);
    if (st == HP_OK && a->qn.present) hp__rmsnorm(q, rows * nh, hd, a->qn.d, c->eps, q);
    if (st == HP_OK && a->kn.present) hp__rmsnorm(k->d, rows * nkv, hd, a->kn.d, c->eps, k->d);
    int64_t p0 = r->pos0 + t->lo[1]; /* the first query's position (after a KV cache's) */
    if (st == HP_OK) st = hp__r_rope(r, p0, sq, err);
    if (st == HP_OK)
        for (int64_t b = 0; b < Bl; b++) {
            hp__rope_apply(q + b * sq * nh * hd, sq, nh, hd, c->rot, r->sc.rope_cos, r->sc.rope_sin);
            hp__rope_apply(k->d + b * sq * nkv * hd, sq, nkv, hd, c->rot, r->sc.rope_cos, r->sc.rope_sin);
        }
    /* CP: every rank of the group needs the keys and values of the whole sequence (after rope). */
    hp__lay whole = {{hp_pl_r(), hp_pl_r()}};
    const char *coll;
    char what[200];
    snprintf(what, sizeof what, "boundary %s (cp K/V all-gather)", a->s->c.fqn);
    if (st == HP_OK && kl.ax[HP__CP].kind == HP_PL_S) st = hp__redistribute(&r->x, k, &whole, what, &coll, err);
    if (st == HP_OK && kl.ax[HP__CP].kind == HP_PL_S) st = hp__redistribute(&r->x, v, &whole, what, &coll, err);
    if (st == HP_OK) {
        hp__attn_args aa = {.B = Bl, .sq = sq, .nh = nh, .nkv = nkv, .hd = hd, .q = q, .q_pos0 = p0,
                            .window = c->window[layer], .out = o, .sinks = a->sinks.present ? a->sinks.d : NULL,
                            .mode = r->o.compute};
        st = hp__kv_attend(r, a->s, &aa, k, v, err);
    }
    if (st == HP_OK) st = out_of(r, a->s, t, out, err);
    if (st == HP_OK) st = lin_fwd(a->o, rows, o, nh * hd, out->d, H, err);
    if (st != HP_OK) return st;
    if (!a->bo_deferred) add_bias(r, out, &a->bo);
    if ((st = hp__r_leave(r, a->s, out, err)) != HP_OK) return st;
    if (a->bo_deferred) add_bias(r, out, &a->bo);
    return hp__r_record(r, a->s->c.fqn, r->tr.exit_coll, out, err);
}

/* gate|up, silu(gate)·up and down on rows [r0, r0 + n) of t into the same rows of out; the intermediates of those
 * rows in gu and h [n, I]. gu holds 2I floats per row: a fused gate_up weight writes rows [n, 2I] (gate, then up,
 * in each row); separate gate and up weights write two blocks [n, I], gate then up (hp__gu_layout), each product
 * with dense rows: oneDNN 2.6 runs brgemm only when C's rows are dense (with ldc = 2I it ran gemm:jit, issue 40). */
static hp_status mlp_rows(mlp_w *m, int64_t r0, int64_t n, int64_t H, const float *t, float *gu, float *h, float *out,
                          hp_err *err)
{
    int64_t I = m->I, ld, up;
    hp__gu_layout(m->gate_up != NULL, n, I, &ld, &up);
    const float *x = t + r0 * H;
    hp_status st = HP_OK;
    if (m->gate_up) st = lin_fwd(m->gate_up, n, x, H, gu, 2 * I, err);
    if (st == HP_OK && !m->gate_up) st = lin_fwd(m->gate, n, x, H, gu, ld, err);
    if (st == HP_OK && !m->gate_up) st = lin_fwd(m->up, n, x, H, gu + up, ld, err);
    if (st == HP_OK) hp__swiglu(gu, ld, gu + up, ld, n, I, h, I);
    if (st == HP_OK) st = lin_fwd(m->down, n, h, I, out + r0 * H, H, err);
    return st;
}

hp_status hp__r_mlp(hp_runner *r, mlp_w *m, hp__act *t, hp__act *out, hp_err *err)
{
    hp_status st = hp__r_enter(r, m->s, t, err);
    if (st != HP_OK) return st;
    /* in row chunks (hp__mlp_chunk_end); a training runner keeps every row's intermediates for its backward */
    bool whole = r->o.keep_activations || r->o.test_mlp_whole;
    int64_t rows = t->n[0] * t->n[1], H = r->g.cfg.H, C = hp__mlp_chunk_rows(rows, whole);
    int64_t bw[HP__NBUF];
    hp__step_row_widths(&r->g, m->s, r->x.pos.r[HP__TP], bw);
    float *gu = hp__r_buf(r, 2, C * bw[2], err), *h = gu ? hp__r_buf(r, 3, C * bw[3], err) : NULL;
    if (!gu || !h) st = HP_ERR_NOMEM;
    if (st == HP_OK) st = out_of(r, m->s, t, out, err);
    for (int64_t r0 = 0, r1; st == HP_OK && r0 < rows; r0 = r1) {
        r1 = hp__mlp_chunk_end(rows, r0, whole);
        st = mlp_rows(m, r0, r1 - r0, H, t->d, gu, h, out->d, err);
    }
    if (st != HP_OK) return st;
    if (!m->bd_deferred) add_bias(r, out, &m->bd);
    if ((st = hp__r_leave(r, m->s, out, err)) != HP_OK) return st;
    if (m->bd_deferred) add_bias(r, out, &m->bd);
    return hp__r_record(r, m->s->c.fqn, r->tr.exit_coll, out, err);
}

void hp__r_moe_release(hp_runner *r)
{
    for (int pass = 0; pass < 2; pass++) /* the borrowers, then the owners of the buffers */
        for (size_t i = 0; r->w.sw && i < r->g.n_steps; i++) {
            moe_w *m = &r->w.sw[i].moe;
            if (!m->ep || m->shared != (pass == 0)) continue;
            hp__mem_count(&r->x, hp_moe_ep_workspace_bytes(m->ep) + hp_moe_ep_backward_bytes(m->ep), 0);
            hp_moe_ep_destroy(m->ep);
            m->ep = NULL;
            m->shared = false;
        }
}

void hp__r_release(hp_runner *r)
{
    hp__r_moe_release(r);
    for (size_t i = 0; r->w.sw && i < r->g.n_steps; i++)
        if (r->g.steps[i].op == HP__OP_MOE) hp__act_release(&r->x, &r->w.sw[i].moe.topk);
    hp__act *acts[] = {&r->sc.h, &r->sc.t, &r->sc.a, &r->sc.k, &r->sc.v};
    for (size_t i = 0; i < sizeof acts / sizeof *acts; i++) hp__act_release(&r->x, acts[i]);
    for (int64_t l = 0; r->sc.kept && l <= r->g.cfg.L; l++) hp__act_release(&r->x, &r->sc.kept[l]);
    for (int i = 0; i < HP__NBUF; i++) {
        hp__mem_free(&r->x, r->sc.buf[i], r->sc.buf_cap[i] * sizeof(float));
        r->sc.buf[i] = NULL;
        r->sc.buf_cap[i] = 0;
    }
    hp__mem_free(&r->x, r->sc.rope_cos, r->sc.rope_bytes);
    hp__mem_free(&r->x, r->sc.rope_sin, r->sc.rope_bytes);
    r->sc.rope_cos = r->sc.rope_sin = NULL;
    r->sc.rope_bytes = 0, r->sc.rope_n = 0;
    hp__mem_free(&r->x, r->sc.loss_mx, (size_t)r->sc.loss_cap * sizeof *r->sc.loss_mx);
    hp__mem_free(&r->x, r->sc.loss_se, (size_t)r->sc.loss_cap * sizeof *r->sc.loss_se);
    r->sc.loss_mx = NULL, r->sc.loss_se = NULL;
    r->sc.loss_cap = r->sc.loss_rows = 0;
    hp__ctx_free(&r->x);
}

/* Layer m's EP runtime for max_rows local rows in `chunks` dispatch chunks (> 1: its buffers hold one chunk,
 * hp_moe_ep_create_bounded). In inference the sparse layers run one after another, so a layer borrows the
 * buffers of the first earlier one of its shapes (hp_moe_ep_create_shared) and the model holds one runtime's
 * workspace per distinct shape; training keeps one per layer (each backward reads its own layer's). The same on
 * every rank of the group: a collective. */
static hp_status moe_runtime(hp_runner *r, moe_w *m, int64_t max_rows, int chunks, hp_err *err)
{
    if (m->ep) hp__r_moe_release(r); /* resized: every layer's, as they are made again in this forward */
    m->max_tokens = max_rows;
    m->chunks = chunks;
    for (size_t i = 0; !r->o.keep_activations && i < r->g.n_steps; i++) {
        moe_w *o = &r->w.sw[i].moe;
        if (o == m || !o->ep || o->shared || o->max_tokens != max_rows || o->chunks != chunks) continue;
        hp_err e;
        hp_status st = hp_moe_ep_create_shared(&m->ep, m->l, o->ep, &e);
        m->shared = st == HP_OK;
        if (st != HP_ERR_INPUT) { /* other shapes try the next owner; out of memory fails, never makes one */
            if (st != HP_OK && err) *err = e;
            return st;
        }
    }
    hp_status st = hp_moe_ep_create_bounded(&m->ep, m->l, r->ep_grp, max_rows, chunks, err);
    if (st == HP_OK) hp__mem_count(&r->x, 0, hp_moe_ep_workspace_bytes(m->ep));
    return st;
}

/* The dispatch chunks of a sparse block: the dense MLP's row chunks (hp__mlp_chunk_count) of the most rows any
 * rank of the group holds, so every rank passes the same count (each cuts its own rows into that many) and a
 * chunk holds at most ceil(max_rows / chunks) <= 1152 tokens; one for training, whose backward reads all rows. */
static int moe_chunks(const hp_runner *r, int64_t max_rows)
{
    int64_t c = hp__mlp_chunk_count(max_rows, r->o.keep_activations || r->o.test_mlp_whole);
    return c < 1 ? 1 : c > INT_MAX ? INT_MAX : (int)c;
}

/* m's runtime serves max_rows rows in `chunks` chunks: made for as many, chunked if asked, each chunk fits a stage. */
static bool moe_runtime_serves(const moe_w *m, int64_t max_rows, int chunks)
{
    if (!m->ep || max_rows > m->max_tokens || (chunks > 1 && m->chunks < 2)) return false;
    int64_t stage = m->chunks > 1 ? (m->max_tokens + m->chunks - 1) / m->chunks : m->max_tokens;
    return (max_rows + chunks - 1) / chunks <= stage;
}

/* The first sparse block this rank runs (its stage's, under a pipeline), or NULL. */
static const moe_w *first_moe(const hp_runner *r)
{
    for (size_t i = 0; i < r->g.n_steps; i++)
        if (r->g.steps[i].op == HP__OP_MOE && hp__r_step_loaded(r, &r->g.steps[i])) return &r->w.sw[i].moe;
    return NULL;
}

/* The rows a sparse block routes on this rank, into the statistics (hp_run_stats.moe_rows); under
 * hp_run_opts.moe_cap_block, the block of each local row (*blk, malloc'd) when the block limits capacity. */
static hp_status moe_rows(hp_runner *r, const moe_w *m, const hp__act *t, int32_t **blk, hp_err *err)
{
    hp_run_stats *rs = &r->tr.stats;
    int64_t b0 = r->x.dp_rows[r->x.dp_r] + t->lo[0], now[4] = {b0, t->n[0], t->lo[1], t->n[1]};
    if (m == first_moe(r)) { /* the forward's first sparse block */
        memcpy(rs->moe_rows, now, sizeof now);
        rs->moe_rows_vary = false;
        rs->moe_cap_factor = m->cf > 0 ? m->cf : 0;
    } else if (memcmp(rs->moe_rows, now, sizeof now) || rs->moe_cap_factor != (m->cf > 0 ? m->cf : 0)) {
        rs->moe_rows_vary = true;
    }
    const int32_t *map = r->o.moe_cap_block;
    if (!map || r->o.moe_cap_factor <= 0) return HP_OK;
    int64_t S = r->x.S_orig;
    if (t->lo[1] + t->n[1] > S)
        return hp_err_set(err, HP_ERR_INPUT, "capacity blocks: the sparse block routes padded positions");
    if (!(*blk = malloc((size_t)(t->n[0] * t->n[1]) * sizeof **blk + 1)))
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    for (int64_t b = 0; b < t->n[0]; b++)
        for (int64_t s = 0; s < t->n[1]; s++) (*blk)[b * t->n[1] + s] = map[(b0 + b) * S + t->lo[1] + s];
    return HP_OK;
}

/* The EP compute of a sparse block on the rank's local rows (the tokens stay where they are). */
hp_status hp__r_moe(hp_runner *r, moe_w *m, hp__act *t, hp__act *out, int64_t max_rows, hp_err *err)
{
    hp_status st = hp__r_enter(r, m->s, t, err);
    if (st != HP_OK) return st;
    int64_t rows = t->n[0] * t->n[1], H = r->g.cfg.H, K = m->l->top_k;
    int chunks = moe_chunks(r, max_rows);
    if (!moe_runtime_serves(m, max_rows, chunks)) st = moe_runtime(r, m, max_rows, chunks, err);
    if (st == HP_OK) st = out_of(r, m->s, t, out, err);
    hp_moe_run_opts ro = {.capacity_factor = m->cf, .policy = HP_MOE_CAP_SCORE,
                          .balanced_router = r->o.balanced_router, .caller_checks_finite = true};
    int32_t *blk = NULL;
    if (st == HP_OK) st = moe_rows(r, m, t, &blk, err);
    ro.cap_block = blk;
    if (r->o.moe_cap_block) ro.capacity_factor = r->o.moe_cap_factor; /* validate's reference: the distributed one */
    /* This rank's forward is already non-finite (its verdict comes at the end): route zeros instead of NaN. */
    for (int64_t i = 0; r->tr.nf.idx >= 0 && i < rows * H; i++)
        if (!isfinite(t->d[i])) t->d[i] = 0.0f;
    /* sync_collectives: the exchanges have no barrier of their own, so one before the block (the routing in
     * front of the dispatch is the same work on every rank); its time goes to wait_s, as redist's do. */
    if (st == HP_OK && r->x.sync && hp_comm_size(r->ep_grp) > 1) {
        double tb = hp_comm_wtime();
        hp_err e;
        (void)hp_comm_barrier(r->ep_grp, &e); /* a failure shows in the exchange that follows */
        tb = hp_comm_wtime() - tb;
        r->x.st.wait_s += tb;
        r->x.st.comm_s += tb;
    }
    if (st == HP_OK) st = hp_moe_ep_forward_chunks(m->ep, t->d, rows, out->d, &ro, m->overlap, chunks, err);
    free(blk);
    if (st == HP_OK) { /* the token exchange counts as communication, as the all-to-all kind */
        const hp_moe_ep_stats *es = hp_moe_ep_get_stats(m->ep);
        double ex = es->t_dispatch + es->t_return; /* t_dispatch holds the wait for the rows (t_wait) */
        r->x.st.comm_s += ex;
        r->x.st.coll_s[HP_RUN_ALL_TO_ALL] += ex;
        r->x.st.bytes[HP_RUN_ALL_TO_ALL] += (uint64_t)es->bytes_exchanged;
        r->x.st.calls[HP_RUN_ALL_TO_ALL] += 2;
        /* Phase times, summed over the sparse layers: the first one of the forward starts the sums. */
        double *ph = r->tr.stats.moe_phase_s;
        if (m == first_moe(r)) memset(ph, 0, sizeof r->tr.stats.moe_phase_s);
        ph[0] += es->t_route, ph[1] += es->t_dispatch, ph[2] += es->t_experts;
        ph[3] += es->t_return, ph[4] += es->t_combine, ph[5] += es->t_shared;
    }
    /* every group must stop when one fails: the next collectives mix the EP groups */
    st = hp_comm_agree(r->x.world, st, err);
    if (st == HP_OK) st = hp__act_alloc(&r->x, &m->topk, t->g[0], t->g[1], K, t->lay, err);
    if (st != HP_OK) return st;
    const int32_t *ti = hp_moe_ep_ws(m->ep)->topk_idx;
    for (int64_t i = 0; i < rows * K; i++) m->topk.d[i] = (float)ti[i];
    if ((st = hp__r_leave(r, m->s, out, err)) != HP_OK) return st;
    if (r->ep > 1) { /* the token exchange inside the region is what validate's table should name */
        char ex[40];
        snprintf(ex, sizeof ex, "%.39s", r->tr.exit_coll);
        snprintf(r->tr.exit_coll, sizeof r->tr.exit_coll, "EP all-to-all x2%s%.39s", strcmp(ex, "none") ? ", then " : "",
                 strcmp(ex, "none") ? ex : "");
    }
    return hp__r_record(r, m->s->c.fqn, r->tr.exit_coll, out, err);
}

/* h += branch, the branch first brought to the residual stream's layout. */
hp_status hp__r_residual(hp_runner *r, const hp__step *s, hp__act *h, hp__act *br, hp_err *err)
{
    char what[200];
    snprintf(what, sizeof what, "the residual add after %s", s->c.fqn);
    const char *coll;
    hp_status st = hp__redistribute(&r->x, br, &h->lay, what, &coll, err);
    if (st != HP_OK) return st;
    int64_t n = hp__act_count(h);
#pragma omp parallel for schedule(static) if (n >= HP__PAR_MIN)
    for (int64_t i = 0; i < n; i++) h->d[i] += br->d[i];
    return HP_OK;
}

static hp_status embed_apply(hp_runner *r, const hp__step *e, const int64_t *ids, int64_t S, hp__act *h,
                             hp_err *err)
{
    r->x.where = e->c.fqn;
    int64_t H = r->g.cfg.H, dp_lo = r->x.dp_rows[r->x.dp_r], Bl = r->x.dp_rows[r->x.dp_r + 1] - dp_lo;
    hp_status st = hp__act_alloc(&r->x, h, Bl, r->x.S_pad, H, e->out, err); /* the ids' rows, as e->run cuts them */
    if (st != HP_OK) return st;
    int64_t vlo = r->w.embed->lo[0], vn = r->w.embed->shape[0];
    for (int64_t b = 0; b < h->n[0]; b++)
        for (int64_t s = 0; s < h->n[1]; s++) {
            int64_t p = h->lo[1] + s;
            int64_t id = p < S ? ids[(dp_lo + h->lo[0] + b) * S + p] : 0;
            float *o = h->d + (b * h->n[1] + s) * H;
            if (id < vlo || id >= vlo + vn) {
                memset(o, 0, (size_t)H * sizeof *o);
                continue;
            }
            if (r->w.embed->dt == HP_DT_F32) memcpy(o, (const float *)r->w.embed->d + (id - vlo) * H, (size_t)H * sizeof *o);
            else if ((st = hp_dtype_to_f32(r->w.embed->dt, (const uint16_t *)r->w.embed->d + (id - vlo) * H, o, H, err)) != HP_OK)
                return st;
        }
    if ((st = hp__r_leave(r, e, h, err)) != HP_OK) return st;
    return hp__r_record(r, e->c.fqn, r->tr.exit_coll, h, err);
}

static hp_status head_apply(hp_runner *r, const hp__step *s, hp__act *t, hp__act *out, hp_err *err)
{
    hp_status st = hp__r_enter(r, s, t, err);
    if (st != HP_OK) return st;
    int64_t rows = t->n[0] * t->n[1];
    if ((st = out_of(r, s, t, out, err)) != HP_OK) return st;
    if ((st = lin_fwd(r->w.head, rows, t->d, r->g.cfg.H, out->d, out->n[2], err)) != HP_OK) return st;
    if ((st = hp__r_leave(r, s, out, err)) != HP_OK) return st;
    return hp__r_record(r, s->c.fqn, r->tr.exit_coll, out, err);
}

/* Whether the forward hands the logits on (to rank 0): unless the caller takes none (hp_run_opts.no_logits) and
 * validate does not record them (a backward reads the rank's own block, kept in a). */
static bool logits_taken(const hp_runner *r)
{
    return !r->o.no_logits || r->o.record;
}

/* Whether it runs lm_head and the loss in row chunks: no logits taken, no backward to read them (it reads the
 * whole block and the loss's sums), and the plan's head allows it (hp__prog.head_chunks). */
static bool head_in_chunks(const hp_runner *r)
{
    return !logits_taken(r) && !r->o.keep_activations && r->g.head_chunks;
}

/* Sparse layer m's routed experts gathered onto its stage's first rank as int32 [B·S, K] (*ti, malloc'd there, handed
 * on: counted only while the gathered floats are), the cp padding cut. Collective over the stage. */
static hp_status topk_of(hp_runner *r, moe_w *m, int64_t B, int64_t S, int32_t **ti, hp_err *err)
{
    float *full = NULL;
    int64_t K = m->l->top_k, Sp = r->x.S_pad;
    hp_status st = hp__gather_full(&r->x, &m->topk, B, r->x.dp_rows, &full, err);
    if (st == HP_OK && full) {
        size_t ti_b = (size_t)(B * S * K) * sizeof(int32_t) + 1;
        if (!(*ti = malloc(ti_b))) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        else hp__mem_count(&r->x, 0, ti_b), hp__mem_count(&r->x, ti_b, 0); /* handed to the caller */
        for (int64_t b = 0; *ti && b < B; b++)
            for (int64_t s = 0; s < S; s++)
                for (int64_t k = 0; k < K; k++) (*ti)[(b * S + s) * K + k] = (int32_t)full[(b * Sp + s) * K + k];
    }
    hp__mem_free(&r->x, full, gathered_bytes(B, &m->topk));
    return st;
}

/* World rank 0 gets every sparse layer's routed experts as moe.<l>.topk_idx [B·S, K], in the program's order. Each
 * layer is gathered on its stage's first rank (every rank without a pipeline: one stage), which relays it to world
 * rank 0 under a pipeline (hp__pipe_relay_i32). Collective over every rank; a failure is kept and the layers still
 * go round, so no rank waits for one that stopped. */
static hp_status gather_topk(hp_runner *r, int64_t B, int64_t S, hp_run_output *out, hp_err *err)
{
    int n = 0;
    for (size_t i = 0; i < r->g.n_steps; i++) n += r->g.steps[i].op == HP__OP_MOE;
    if (!n) return HP_OK;
    bool root = hp_comm_rank(r->pipe.all) == 0;
    hp_status st = HP_OK;
    if (root && (!(out->moe_layer = calloc((size_t)n, sizeof *out->moe_layer)) ||
                 !(out->topk_idx = calloc((size_t)n, sizeof *out->topk_idx))))
        st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < r->g.n_steps; i++) {
        const hp__step *s = &r->g.steps[i];
        if (s->op != HP__OP_MOE) continue;
        int32_t *ti = NULL;
        hp_err quiet, *e = st == HP_OK ? err : &quiet; /* the first failure's message is kept */
        int64_t K = hp__r_step_loaded(r, s) ? r->w.sw[i].moe.l->top_k : 0;
        hp_status ls = K > 0 ? topk_of(r, &r->w.sw[i].moe, B, S, &ti, e) : HP_OK;
        if (r->pipe.pp > 1) ls = hp__pipe_relay_i32(r, s->chunk % r->pipe.pp, ls, &ti, &K, B * S, e);
        if (st == HP_OK) st = ls;
        if (root && st == HP_OK) {
            out->moe_layer[out->n_moe] = s->layer;
            out->topk_idx[out->n_moe++] = ti;
            out->K = K;
        } else {
            free(ti);
        }
    }
    return st;
}

void hp_run_output_free(hp_run_output *out)
{
    free(out->logits);
    for (int i = 0; i < out->n_moe; i++) free(out->topk_idx[i]);
    free(out->topk_idx);
    free(out->moe_layer);
    out->logits = NULL;
    out->topk_idx = NULL;
    out->moe_layer = NULL;
    out->n_moe = 0;
}

void hp_runner_recycle_output(hp_runner *r, hp_run_output *out)
{
    hp__act *a = &r->sc.a;
    if (out->logits && out->logits == r->sc.handed && !a->d) {
        a->d = out->logits;
        a->cap = r->sc.handed_cap;
        hp__mem_count(&r->x, 0, a->cap * sizeof(float));
        out->logits = NULL;
    }
    r->sc.handed = NULL;
    hp_run_output_free(out);
}

static uint64_t ids_hash(const int64_t *ids, int64_t n, int64_t B, int64_t S)
{
    return hp_hash64_bytes(ids, (size_t)n * sizeof *ids, (uint64_t)B ^ ((uint64_t)S << 32));
}

static hp_status check_ids(hp_runner *r, const int64_t *ids, int64_t B, int64_t S, hp_err *err)
{
    hp_status st = HP_OK;
    if (B < 1 || S < 1) st = hp_err_set(err, HP_ERR_INPUT, "input_ids is [%lld, %lld]; it needs at least one row and "
                                        "one position", (long long)B, (long long)S);
    for (int64_t i = 0; st == HP_OK && i < B * S; i++)
        if (ids[i] < 0 || ids[i] >= r->g.cfg.V)
            st = hp_err_set(err, HP_ERR_INPUT,
                            "input_ids[%lld][%lld] = %lld is outside the vocabulary [0, %lld) of the model",
                            (long long)(i / S), (long long)(i % S), (long long)ids[i], (long long)r->g.cfg.V);
    if (st == HP_OK && B < r->x.dp)
        st = hp_err_set(err, HP_ERR_INPUT, "the batch has %lld rows for %s=%lld replicas%s; every replica needs at "
                        "least one row (use a smaller %s or a larger batch)", (long long)B,
                        r->p->mesh.ep_axis ? "dp x ep" : "dp", (long long)r->x.dp,
                        r->p->mesh.ep_axis ? " (an explicit ep axis splits the rows with dp)" : "",
                        r->p->mesh.ep_axis ? "dp x ep" : "dp");
    st = hp_comm_agree(r->x.world, st, err);
    if (st != HP_OK) return st;
    int world = hp_comm_size(r->x.world);
    uint64_t mine = ids_hash(ids, B * S, B, S), *all = hp_calloc((size_t)world, sizeof *all);
    if (!all) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    st = hp_comm_agree(r->x.world, st, err);
    if (st == HP_OK) st = hp_comm_allgather(r->x.world, &mine, sizeof mine, all, err);
    for (int i = 0; st == HP_OK && i < world; i++)
        if (all[i] != all[0])
            st = hp_err_set(err, HP_ERR_INPUT, "rank %d was given other input ids than rank 0 (every rank must read "
                            "the same input)", i);
    free(all);
    return st;
}

/* Every buffer the forward sizes is some of the batch's B·S_pad tokens times a per-token width. One checked product
 * of all the tokens (rank 0 gathers every row's logits), a width at least the widest of them (their sum) and 16
 * (bytes per float, and the small factors the buffers multiply by) refuses a batch whose buffers 64-bit sizes
 * cannot hold, before anything is sized. */
static hp_status buffers_fit(const hp_runner *r, int64_t B, int64_t S, hp_err *err)
{
    const hp_model_config *mc = &r->m->cfg;
    const hp__rcfg *c = &r->g.cfg;
    int64_t K = mc->num_experts_per_tok, mI = mc->moe_intermediate_size;
    int64_t ws[] = {c->V, c->H, 2 * c->I, 2 * (c->nh + c->nkv) * c->hd, mc->n_experts, (K + 2) * c->H, 2 * K * mI,
                    2 * mc->shared_intermediate_size, mc->q_lora_rank + 2 * mc->kv_lora_rank + mc->qk_rope_head_dim,
                    2 * c->nh * (mc->qk_nope_head_dim + mc->qk_rope_head_dim + mc->v_head_dim)};
    int64_t width = 0, n;
    bool ok = hp_mul_i64(B, r->x.S_pad, &n);
    for (size_t i = 0; ok && i < sizeof ws / sizeof *ws; i++) ok = hp_add_i64(width, ws[i] > 0 ? ws[i] : 0, &width);
    if (ok && hp_mul_i64(n, width, &n) && hp_mul_i64(n, 16, &n)) return HP_OK;
    return hp_err_set(err, HP_ERR_INPUT, "the batch %lld x %lld (input_ids) is past what the runtime's buffers can "
                      "hold: its tokens times the model's widths exceed 64-bit sizes; use a smaller batch or sequence",
                      (long long)B, (long long)S);
}

/* The op record's forward entries (ops.c): h is the residual stream, t a module's input, a its output. */
hp_status hp__fwd_embed(hp_runner *r, const hp__step *s, step_w *w, hp__fio *io, hp_err *err)
{
    (void)w;
    return embed_apply(r, s, io->ids, io->S, io->h, err);
}

hp_status hp__fwd_norm(hp_runner *r, const hp__step *s, step_w *w, hp__fio *io, hp_err *err)
{
    hp_status st = HP_OK;
    if (s->keep && r->sc.kept && !io->recompute) /* the layer's input (the final norm's: L), for a backward pass */
        st = hp__r_act_copy(r, &r->sc.kept[s->layer >= 0 ? s->layer : r->g.cfg.L], io->h, err);
    return st == HP_OK ? hp__r_norm(r, &w->norm, io->h, io->t, err) : st;
}

hp_status hp__fwd_attn(hp_runner *r, const hp__step *s, step_w *w, hp__fio *io, hp_err *err)
{
    return hp__r_attn(r, s->layer, &w->at, io->t, io->a, err);
}

hp_status hp__fwd_mlp(hp_runner *r, const hp__step *s, step_w *w, hp__fio *io, hp_err *err)
{
    (void)s;
    return hp__r_mlp(r, &w->mlp, io->t, io->a, err);
}

hp_status hp__fwd_moe(hp_runner *r, const hp__step *s, step_w *w, hp__fio *io, hp_err *err)
{
    (void)s;
    return hp__r_moe(r, &w->moe, io->t, io->a, io->max_rows, err);
}

hp_status hp__fwd_residual(hp_runner *r, const hp__step *s, step_w *w, hp__fio *io, hp_err *err)
{
    (void)w;
    hp_status st = hp__r_residual(r, s, io->h, io->a, err);
    if (st == HP_OK && s->ends_layer) {
        char key[64];
        snprintf(key, sizeof key, "model.layers.%lld", (long long)s->layer);
        st = hp__r_record(r, key, "residual add", io->h, err);
    }
    return st;
}

hp_status hp__fwd_head(hp_runner *r, const hp__step *s, step_w *w, hp__fio *io, hp_err *err)
{
    (void)w; /* the loss follows it */
    return io->chunks ? hp__r_head_loss_chunks(r, s, io->next, io->t, io->a, io->ids, io->mask, io->S, io->loss, err)
                      : head_apply(r, s, io->t, io->a, err);
}

hp_status hp__fwd_loss(hp_runner *r, const hp__step *s, step_w *w, hp__fio *io, hp_err *err)
{
    (void)w;
    return io->chunks ? HP_OK : hp__r_loss(r, s, io->a, io->ids, io->mask, io->S, io->loss, err);
}

hp_status hp__r_steps(hp_runner *r, hp__fio *io, size_t lo, size_t hi, hp_err *err)
{
    const hp__prog *g = &r->g;
    hp_status st = HP_OK;
    for (size_t i = lo; st == HP_OK && i < hi; i++) {
        io->next = i + 1 < g->n_steps ? &g->steps[i + 1] : NULL;
        st = hp__op_rt_table[g->steps[i].op].fwd(r, &g->steps[i], &r->w.sw[i], io, err);
    }
    return st;
}

hp_status hp__r_begin(hp_runner *r, const int64_t *ids, int64_t n_batches, int64_t B, int64_t S, int64_t *max_rows,
                      hp_err *err)
{
    memset(&r->x.st, 0, sizeof r->x.st);
    if (!r->train) r->x.mem.peak = r->x.mem.cur; /* this forward's high-water mark; training's: every step's */
    hp_status st = HP_OK;
    for (int64_t k = 0; k < n_batches && st == HP_OK; k++) st = check_ids(r, ids + k * B * S, B, S, err);
    if (st != HP_OK) return st;
    hp__nf_reset(&r->tr.nf);
    int64_t cp = r->x.pos.n[HP__CP];
    r->x.B_all = B;
    r->x.S_orig = S;
    if (!hp__seq_pad(S, cp, &r->x.S_pad)) r->x.S_pad = S; /* buffers_fit refuses it */
    if ((st = buffers_fit(r, B, S, err)) != HP_OK) return st;
    hp__dp_rows(B, r->x.dp, r->x.dp_rows);
    *max_rows = 0; /* the most rows any rank holds: every replica's rows times the whole sequence */
    for (int64_t i = 0; i < r->x.dp; i++)
        if (r->x.dp_rows[i + 1] - r->x.dp_rows[i] > *max_rows) *max_rows = r->x.dp_rows[i + 1] - r->x.dp_rows[i];
    *max_rows *= r->x.S_pad;
    r->sc.moe_rows = *max_rows;
    return HP_OK;
}

hp_status hp_runner_forward(hp_runner *r, const int64_t *ids, int64_t B, int64_t S, hp_run_output *out, hp_err *err)
{
    return hp_runner_forward_masked(r, ids, NULL, B, S, out, err);
}

hp_status hp_runner_forward_masked(hp_runner *r, const int64_t *ids, const uint8_t *mask, int64_t B, int64_t S,
                                   hp_run_output *out, hp_err *err)
{
    memset(out, 0, sizeof *out);
    double t0 = hp_comm_wtime();
    int64_t max_rows = 0;
    hp_status st = hp__r_begin(r, ids, 1, B, S, &max_rows, err);
    if (st != HP_OK) return st;
    hp__act *h = &r->sc.h, *t = &r->sc.t, *a = &r->sc.a; /* kept across forwards: warm pages */
    /* the program, step by step: h is the residual stream, t a module's input, a its output */
    const hp__prog *g = &r->g;
    hp__fio io = {.ids = ids, .mask = mask, .S = S, .h = h, .t = t, .a = a, .max_rows = max_rows,
                  .chunks = head_in_chunks(r), .loss = &out->loss};
    float *full = NULL;
    if (r->pipe.pp > 1) { /* the stages in turn; the loss and the logits from the last one */
        st = hp__pipe_finish(r, hp__pipe_steps(r, &io, err), B, logits_taken(r) ? &full : NULL, &out->loss, err);
        if (st == HP_OK && full) out->logits = full;
    } else {
        st = hp__r_steps(r, &io, 0, g->n_steps, err);
    }
    if (st == HP_OK && hp__r_scored(mask, B, S) > 0) hp__nf_watch_scalar(&r->tr.nf, "the loss", out->loss);
    /* handed to the caller (unless it takes none); a backward (keep_activations) reads the logits again: a copy
     * then */
    size_t a_cap = a->cap;
    if (st == HP_OK && logits_taken(r) && r->pipe.pp == 1)
        st = hp__gather_out(&r->x, a, B, r->x.dp_rows, !r->o.keep_activations, &full, err);
    r->sc.handed = st == HP_OK && full && !a->d ? full : NULL; /* the buffer itself went (hp_runner_recycle_output) */
    r->sc.handed_cap = r->sc.handed ? a_cap : 0;
    if (st == HP_OK && full) {
        int64_t V = r->g.cfg.V, Sp = r->x.S_pad;
        if (Sp != S)
            for (int64_t b = 0; b < B; b++) memmove(full + b * S * V, full + b * Sp * V, (size_t)(S * V) * sizeof *full);
        out->logits = full;
    }
    out->B = B, out->S = S, out->V = r->g.cfg.V;
    /* the routing too, unless this is a training forward (its caller reads the loss alone) */
    if (st == HP_OK && (logits_taken(r) || !r->o.keep_activations))
        st = gather_topk(r, B, S, out, err);
    st = hp__nf_verdict(r->x.world, &r->tr.nf, &r->w.wreg, r->tr.desc, st, err);
    st = hp_comm_agree(r->pipe.all, st, err);
    if (st != HP_OK) {
        hp_run_output_free(out);
        return st;
    }
    hp_run_stats *s = &r->tr.stats;
    s->seconds = hp_comm_wtime() - t0;
    s->comm_s = r->x.st.comm_s;
    s->compute_s = s->seconds - s->comm_s;
    memcpy(s->bytes, r->x.st.bytes, sizeof s->bytes);
    memcpy(s->calls, r->x.st.calls, sizeof s->calls);
    memcpy(s->coll_s, r->x.st.coll_s, sizeof s->coll_s);
    s->p2p_bytes = r->x.st.p2p_bytes, s->p2p_calls = r->x.st.p2p_calls;
    s->tokens = B * S;
    s->loss = out->loss;
    s->wait_s = r->x.st.wait_s;
    s->workspace_bytes = r->x.mem.peak;
    s->window_bytes = 0;
    for (int ax = 0; ax < HP__NAX; ax++) s->window_bytes += hp_comm_window_bytes(r->x.axc[ax]);
    return HP_OK;
}

/* ---- create / free ---- */

static hp_status split_groups(hp_runner *r, hp_err *err)
{
    const hp_mesh *mesh = &r->p->mesh;
    int64_t rank = hp_comm_rank(r->x.world);
    int64_t tp = hp_mesh_size(mesh, "tp"), cp = hp_mesh_size(mesh, "cp"), dp, di, dg;
    int64_t ti = hp_mesh_coord(mesh, rank, "tp"), ci = hp_mesh_coord(mesh, rank, "cp");
    hp_mesh_batch_index(mesh, rank, &dp, &di, &dg); /* dp x an explicit ep axis split the rows */
    r->x.pos = (hp__axes){{tp, cp}, {ti, ci}};
    r->x.dp = dp;
    r->x.dp_r = di;
    hp_status st = hp_comm_split(r->x.world, (int)hp_mesh_group_rank(mesh, rank, "tp", 0), (int)ti, &r->x.axc[HP__TP], err);
    if (st == HP_OK) st = hp_comm_split(r->x.world, (int)hp_mesh_group_rank(mesh, rank, "cp", 0), (int)ci, &r->x.axc[HP__CP], err);
    if (st == HP_OK) st = hp_comm_split(r->x.world, (int)dg, (int)di, &r->x.dp_c, err);
    return st;
}

/* What a rank can check and read on its own, before any collective: the family, the mesh's size, the
 * declared EP compute, the runtime's config and (shard mode) the rank's file. */
static hp_status prepare(hp_runner *r, const hp_run_opts *o, hp_err *err)
{
    const hp_model *m = r->m;
    const hp_plan *p = r->p;
    int world = hp_comm_size(r->x.world);
    hp_status st = HP_OK;
    if (m->meta && !o->shards)
        return hp_err_set(err, HP_ERR_INPUT, "%s holds no weights (a config.json); run needs a checkpoint or a "
                          "shard folder", m->path);
    char hint[600];
    if (hp_mesh_world(&p->mesh) != world)
        return hp_err_set(err, HP_ERR_INPUT,
                          "the plan's mesh has %lld ranks but %d processes run it; start it with mpirun -np %lld "
                          "or give a mesh of %d ranks%s",
                          (long long)hp_mesh_world(&p->mesh), world, (long long)hp_mesh_world(&p->mesh), world,
                          hp_mesh_world_hint(&p->mesh, world, hint, sizeof hint));
    bool moe = m->family && hp_family_is_moe(m->family);
    if (!moe && hp_plan_ep_size(p) > 1)
        return hp_err_set(err, HP_ERR_INPUT, "%s is a dense model; expert parallelism (ep=%lld) has nothing to split",
                          m->path, (long long)hp_plan_ep_size(p));
    r->x.mesh = &p->mesh;
    /* An EP-marked block runs the compute its boundary declares, never one chosen silently (spec §9.4). */
    st = moe && hp_plan_ep_size(p) > 1 ? hp_plan_preflight(p, o->command ? o->command : "run", err) : HP_OK;
    if (st != HP_OK) return st;
    char cfg_path[4200];
    if (o->shards) snprintf(cfg_path, sizeof cfg_path, "%s/config.json", o->shards);
    else snprintf(cfg_path, sizeof cfg_path, "%s/config.json", hp_ckpt_dir(m->ckpt));
    if ((st = hp__prog_build(&r->g, m, p, NULL, cfg_path, err)) != HP_OK) return st;
    int64_t rank = hp_comm_rank(r->x.world);
    if (o->shards) {
        if ((st = hp_shard_rank_open(&r->w.rf, o->shards, rank, err)) != HP_OK) return st;
        if (r->w.rf->world != world)
            return hp_err_set(err, HP_ERR_INPUT, "%s was sharded for %lld ranks; %d run it", o->shards,
                              (long long)r->w.rf->world, world);
    }
    return HP_OK;
}

/* After the ranks agreed on what they run: the axis and EP groups (collectives), then the weights. */
static hp_status create(hp_runner *r, const hp_run_opts *o, hp_err *err)
{
    const hp_plan *p = r->p;
    int world = hp_comm_size(r->x.world);
    hp_status st = HP_OK;
    if (r->pipe.pp > 1) { /* the runner of this stage's ranks (runner_pipe) */
        st = hp_comm_split(r->pipe.all, (int)r->pipe.stage, hp_comm_rank(r->pipe.all), &r->pipe.stage_c, err);
        if (st != HP_OK) return st;
        r->x.world = r->pipe.stage_c;
    }
    st = split_groups(r, err);
    if (st != HP_OK) return st;
    int64_t group;
    r->ep = hp_plan_ep_size(p);
    hp_mesh_ep_index(&p->mesh, r->ep, hp_comm_rank(r->x.world), &group, &r->ep_index);
    if ((st = hp_comm_split(r->x.world, (int)group, (int)r->ep_index, &r->ep_grp, err)) != HP_OK) return st;
    if (!(r->x.dp_rows = hp_calloc((size_t)r->x.dp + 1, sizeof *r->x.dp_rows)))
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    if ((st = hp_linalg_create(&r->w.la, err)) != HP_OK) return st;
    if ((st = hp_shard_layout_build(&r->w.layout, r->m, p, err)) != HP_OK) return st;
    int64_t rank = hp_comm_rank(r->pipe.all); /* the layout's: its stage's tensors */
    r->w.ws = (hp__wsrc){.m = r->m, .layout = r->w.layout, .rank = rank, .rf = r->w.rf};
    if ((st = load_all(r, err)) != HP_OK) return st;
    if (o->keep_activations && !(r->sc.kept = hp_calloc((size_t)r->g.cfg.L + 1, sizeof *r->sc.kept)))
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    r->tr.stats.resident_bytes = r->w.ws.resident;
    r->tr.stats.share_bytes = r->w.ws.share;
    char stage[32] = ""; /* a pipeline's stage, when there is one */
    if (r->pipe.pp > 1) snprintf(stage, sizeof stage, "pp %lld, ", (long long)r->pipe.stage);
    snprintf(r->tr.desc, sizeof r->tr.desc, "rank %lld of %d (%sdp %lld, cp %lld, tp %lld)", (long long)rank,
             hp_comm_size(r->pipe.all), stage, (long long)r->x.dp_r, (long long)r->x.pos.r[HP__CP],
             (long long)r->x.pos.r[HP__TP]);
    (void)world;
    return HP_OK;
}

hp_status hp_runner_create(hp_runner **out, const hp_comm *world, const hp_model *m, const hp_plan *p,
                           const hp_run_opts *o, hp_err *err)
{
    *out = NULL;
    hp_run_opts dflt = {0};
    if (!o) o = &dflt;
    hp_runner *r = hp_calloc(1, sizeof *r);
    hp_status st = r ? HP_OK : hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    if (st == HP_OK) {
        r->x.world = world;
        r->pipe.all = world;
        r->pipe.pp = hp_mesh_size(&p->mesh, "pp");
        r->pipe.per = hp_comm_size(world) / r->pipe.pp;
        r->pipe.stage = r->pipe.per > 0 ? hp_comm_rank(world) / r->pipe.per : 0;
        r->m = m;
        r->p = p;
        r->o = *o;
        r->tr.perturb = o->test_perturb_boundary;
        r->x.sync = o->sync_collectives;
        st = prepare(r, o, err);
    }
    /* Every rank was given the same thing as rank 0, before the first collective that depends on it. */
    st = hp__run_agree(world, m, p, o, r ? &r->g.cfg : NULL, r ? r->w.rf : NULL, st, err);
    if (st == HP_OK) st = create(r, o, err);
    st = hp_comm_agree(world, st, err);
    /* after every rank loaded: the shared experts a shard folder cut over tp, gathered over each tp group */
    if (st == HP_OK) st = hp_comm_agree(world, gather_shared(r, err), err);
    if (st != HP_OK) {
        hp_runner_free(r);
        return st;
    }
    *out = r;
    return HP_OK;
}

void hp_runner_free(hp_runner *r)
{
    if (!r) return;
    hp__r_moe_release(r);
    for (size_t i = 0; r->w.sw && i < r->g.n_steps; i++) hp__free_step_w(&r->w.sw[i]);
    free(r->w.sw);
    hp_linear_free(r->w.head);
    hp_linalg_destroy(r->w.la);
    hp_shard_rank_close(r->w.rf);
    hp_shard_layout_free(r->w.layout);
    hp__wreg_free(&r->w.wreg);
    for (int ax = 0; ax < HP__NAX; ax++) hp_comm_free(r->x.axc[ax]);
    hp_comm_free(r->x.dp_c);
    hp_comm_free(r->ep_grp);
    hp_comm_free(r->pipe.stage_c);
    free(r->x.dp_rows);
    hp__ctx_free(&r->x);
    free(r->sc.rope_cos);
    free(r->sc.rope_sin);
    for (int64_t l = 0; r->sc.kept && l <= r->g.cfg.L; l++) hp__act_free(&r->sc.kept[l]);
    hp__act *acts[] = {&r->sc.h, &r->sc.t, &r->sc.a, &r->sc.k, &r->sc.v};
    for (size_t i = 0; i < sizeof acts / sizeof *acts; i++) hp__act_free(acts[i]);
    for (int i = 0; i < 4; i++) free(r->sc.buf[i]);
    free(r->sc.kept);
    free(r->sc.loss_mx);
    free(r->sc.loss_se);
    hp__kv_free(r);
    if (r->train) r->train_free(r->train);
    hp__prog_free(&r->g); /* last: the layers and kept activations above are counted by its L */
    free(r);
}

const float *hp_runner_activation(const hp_runner *r, int64_t l, int64_t g[3], int64_t lo[3], int64_t n[3])
{
    if (!r->sc.kept || l < 0 || l > r->g.cfg.L || !r->sc.kept[l].d) return NULL;
    const hp__act *a = &r->sc.kept[l];
    for (int d = 0; d < 3; d++) g[d] = a->g[d], lo[d] = a->lo[d], n[d] = a->n[d];
    return a->d;
}

void hp_runner_sync_collectives(hp_runner *r, bool on)
{
    r->x.sync = on;
}

const hp_run_stats *hp_runner_stats(const hp_runner *r)
{
    return &r->tr.stats;
}

const char *hp_runner_describe(const hp_runner *r, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", r->tr.desc);
    return buf;
}
