/*
 * train.c — the training state (docs/train.md): every trainable slice registered in the program's order (the op
 * record's reg entries), its gradient summed over the ranks that saw other rows of it, the global norm, AdamW on
 * each rank's slices (ZeRO-1 over dp and the experts' groups), the state's save and load. The backward itself is
 * bwd.c's.
 */
#include "kernels/backward.h"
#include "kernels/linalg_int.h"
#include "kernels/modules.h"
#include "run/train_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void hp_train_opts_default(hp_train_opts *o)
{
    *o = (hp_train_opts){.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 1e-2};
}

static void train_free(hp__train *t)
{
    if (!t) return;
    for (int i = 0; i < t->n; i++) {
        if (t->p[i].own_g) free(t->p[i].g);
        free(t->p[i].m), free(t->p[i].v);
        if (t->p[i].own) free(t->p[i].data);
    }
    free(t->p);
    free(t->flat);
    for (int i = 0; i < t->n_moe; i++) {
        hp_moe_grads_free(t->moe[i].g);
        hp_comm_free(t->moe[i].edp);
    }
    free(t->moe);
    hp__bwd_release(t);
    free(t);
}

float *hp__t_grow(hp__train *t, float **buf, size_t *cap, int64_t n, hp_err *err)
{
    size_t want = (size_t)(n > 0 ? n : 1);
    if (want > *cap) {
        float *p = hp__mem_realloc(t->ctx, *buf, *cap * sizeof *p, want * sizeof *p);
        if (!p) {
            hp_err_set(err, HP_ERR_NOMEM, "out of memory for %zu floats of the backward", want);
            return NULL;
        }
        *buf = p;
        *cap = want;
    }
    return *buf;
}

float *hp__t_fbuf(hp__train *t, int i, int64_t n, hp_err *err)
{
    return hp__t_grow(t, &t->f[i], &t->fcap[i], n, err);
}

/* ---- the parameters ---- */

/* A new entry of n values at data (g: its gradient buffer, or NULL: one of its own), summed over dp, over cp
 * and tp where step s ran on other rows per rank (tp also when tp_partial), unless cut (tp holds slices). */
static hp_status new_param(hp_runner *r, float *data, int64_t n, float *g, const hp__step *s, bool cut,
                           bool tp_partial, tparam **out, hp_err *err)
{
    hp__train *t = r->train;
    if (t->n == t->cap) {
        int nc = t->cap ? 2 * t->cap : 64;
        tparam *np = realloc(t->p, (size_t)nc * sizeof *np);
        if (!np) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        t->p = np;
        t->cap = nc;
    }
    tparam *q = &t->p[t->n];
    memset(q, 0, sizeof *q);
    q->data = data;
    q->n = n;
    q->own_g = !g;
    q->g = g ? g : hp_calloc((size_t)n + 1, sizeof *q->g);
    if (!q->g) return hp_err_set(err, HP_ERR_NOMEM, "out of memory for a gradient of %s", s->c.fqn);
    t->n++;
    q->sum_dp = r->x.dp > 1;
    q->sum_cp = r->x.pos.n[HP__CP] > 1 && hp__rows_split(s->run.ax[HP__CP]);
    q->sum_tp = hp__grad_sum_tp(s, r->x.pos.n[HP__TP], cut, tp_partial);
    *out = q;
    return HP_OK;
}

/* Registers w (when present) as a parameter of step s. tp_partial: tp cuts the module but not w, so each tp
 * rank's gradient of w comes from its own heads (q/k norms). */
static hp_status add_param(hp_runner *r, hp__w *w, const char *fqn, const char *rel, const hp__step *s,
                           bool tp_partial, hp_err *err)
{
    if (!w->present) return HP_OK;
    char name[200];
    snprintf(name, sizeof name, "%s.%s", fqn, rel);
    const hp_param *mp = hp_model_find_param(r->m, name);
    if (mp && !mp->trainable) return HP_OK; /* frozen (--freeze): no gradient, never updated */
    if (w->dt != HP_DT_F32 && w->dt != HP_DT_BF16)
        return hp_err_set(err, HP_ERR_INPUT, "%s.%s is held as %s: the training step updates f32 or bf16 weights",
                          fqn, rel, hp_dtype_name(w->dt));
    hp_placement tpl = w->pl.ax[HP_AXIS_TP];
    bool cut = r->x.pos.n[HP__TP] > 1 && (tpl.kind == HP_PL_S || tpl.kind == HP_PL_S2);
    /* A bf16 checkpoint trains on f32 masters, as PyTorch trains the model loaded in float32: the forward reads
     * the master itself (exact compute loads the slice widened, runner.c's load), or in BF16 compute its bf16
     * copy (w->d, made again after each update: the rounding every product applies, as autocast casts). */
    float *master = w->d;
    if (w->dt == HP_DT_BF16) {
        master = hp_calloc((size_t)w->n + 1, sizeof *master);
        hp_status cs = master ? hp_dtype_to_f32(HP_DT_BF16, w->d, master, w->n, err)
                              : hp_err_set(err, HP_ERR_NOMEM, "out of memory for %s.%s's master weights", fqn, rel);
        if (cs != HP_OK) {
            free(master);
            return cs;
        }
    }
    tparam *q;
    hp_status st = new_param(r, master, w->n, NULL, s, cut, tp_partial, &q, err);
    if (st != HP_OK) {
        if (master != w->d) free(master);
        return st;
    }
    q->w = w;
    q->tied_pp = s->op == HP__OP_EMBED && r->g.tied && r->pipe.pp > 1;
    q->own = master != w->d;
    q->b16 = w->dt == HP_DT_BF16 || (mp && mp->dtype == HP_DT_BF16);
    w->train_ix = r->train->n; /* 1 + its index: new_param appended it */
    snprintf(q->name, sizeof q->name, "%s", name);
    return HP_OK;
}

/* An MoE block's arrays: the routed experts (summed over their expert-data-parallel group), the router and its
 * bias and Qwen2-MoE's shared gate (whole on every rank; partial over tp when tp cuts the experts), the shared
 * expert (whole, or cut over tp with the experts), gpt-oss's down bias (whole on every rank even when cut). The
 * expert-data-parallel communicator is split here: a collective, reached by every rank in the same order. */
static hp_status add_moe(hp_runner *r, const hp__step *s, moe_w *mw, hp_err *err)
{
    hp__train *t = r->train;
    hp_moe_layer *l = mw->l;
    int mi = hp_model_find_module(r->m, s->c.fqn);
    for (int k = mi >= 0 ? r->m->modules[mi].subtree_first : 0; mi >= 0 && k < r->m->modules[mi].subtree_end; k++)
        if (!r->m->params[k].trainable)
            return hp_err_set(err, HP_ERR_INPUT, "%s is frozen (--freeze), but the training step does not freeze "
                              "the tensors of an MoE block (%s) yet: leave them out of --freeze",
                              r->m->params[k].name, s->c.fqn);
    if (l->w_dtype != HP_DT_F32)
        return hp_err_set(err, HP_ERR_INPUT, "%s: its experts are not held as f32; the training step updates f32 "
                          "weights (internal: load them with widen_f32)", s->c.fqn);
    tmoe *nm = realloc(t->moe, (size_t)(t->n_moe + 1) * sizeof *nm);
    if (!nm) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    t->moe = nm;
    tmoe *b = &t->moe[t->n_moe++];
    memset(b, 0, sizeof *b);
    b->layer = s->layer;
    b->m = mw;
    hp_status st = hp_moe_grads_create(&b->g, l, err);
    /* the holders of the same experts: the same EP index, and the same tp index when tp cuts them */
    int64_t rank = hp_comm_rank(r->x.world), tp = r->x.pos.n[HP__TP], ti = r->x.pos.r[HP__TP];
    int64_t color = r->ep_index * (mw->tp_cut ? tp : 1) + (mw->tp_cut ? ti : 0);
    if (st == HP_OK) st = hp_comm_split(r->x.world, (int)color, (int)rank, &b->edp, err);
    if (st != HP_OK) return st;
    /* The group's EP groups (G holders times P members each) saw each distinct row block G·P / D times, D the
     * number of distinct row blocks of the mesh (dp x an explicit ep axis, and cp and tp where they split the
     * rows): 1 for TP-extend-EP and for an ep axis, whose members take rows of their own. */
    int64_t G = hp_comm_size(b->edp), P = r->ep;
    int64_t D = r->x.dp * (hp__rows_split(s->run.ax[HP__CP]) ? r->x.pos.n[HP__CP] : 1) *
                (hp__rows_split(s->run.ax[HP__TP]) ? tp : 1);
    b->escale = (double)D / (double)(G * P);
    hp_moe_grads *g = b->g;
    int64_t E = l->n_experts, H = l->n_hidden, n = l->n_local, I = l->d_expert, sI = l->d_shared;
    struct {
        void *data;
        int64_t n;
        float *g;
        tkind kind;
    } a[] = {
        {(void *)(uintptr_t)l->w_gate_up, n * 2 * I * H, g->d_gate_up, K_EXPERT},
        {(void *)(uintptr_t)l->w_down, n * H * I, g->d_down, K_EXPERT},
        {(void *)(uintptr_t)l->b_gate_up, n * 2 * I, g->d_b_gate_up, K_EXPERT},
        {(void *)(uintptr_t)l->b_down, n * H, g->d_b_down, K_BDOWN},
        {NULL, E * H, g->d_w_router, K_ROUTER},
        {NULL, E, g->d_b_router, K_ROUTER},
        {l->ws_gate_up, 2 * sI * H, g->d_ws_gate_up, K_SHARED},
        {l->ws_down, H * sI, g->d_ws_down, K_SHARED},
        {l->ws_gate, H, g->d_ws_gate, K_ROUTER},
    };
    double *router[] = {l->w_router, l->b_router};
    /* a bf16 checkpoint's block is held widened (its experts are the f32 masters the forward reads) or in f64
     * (the router: an f32 master trains, the f64 copy is its value widened) */
    bool b16 = false;
    for (int k = mi >= 0 ? r->m->modules[mi].subtree_first : 0; mi >= 0 && k < r->m->modules[mi].subtree_end; k++)
        b16 = b16 || r->m->params[k].dtype == HP_DT_BF16;
    for (size_t k = 0; k < sizeof a / sizeof *a && st == HP_OK; k++) {
        double *wide = k == 4 || k == 5 ? router[k - 4] : NULL;
        if (!a[k].g || (!a[k].data && !wide)) continue;
        float *data = a[k].data;
        if (wide) {
            if (!(data = hp_calloc((size_t)a[k].n + 1, sizeof *data))) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
            for (int64_t i = 0; i < a[k].n; i++) data[i] = (float)wide[i];
        }
        tparam *q;
        bool cut = mw->tp_cut && (a[k].kind == K_EXPERT || a[k].kind == K_SHARED);
        st = new_param(r, data, a[k].n, a[k].g, s, cut, mw->tp_cut && a[k].kind == K_ROUTER, &q, err);
        if (st != HP_OK) {
            if (wide) free(data);
            return st;
        }
        q->wide = wide;
        q->own = wide != NULL;
        q->b16 = b16 && !wide;
        q->moe = t->n_moe;
        q->kind = a[k].kind;
        if (q->kind == K_EXPERT || q->kind == K_BDOWN) q->sum_dp = q->sum_cp = q->sum_tp = false; /* the group's */
        static const char *const what[] = {"experts' gate/up", "experts' down", "experts' gate/up bias",
                                           "experts' down bias", "router", "router bias", "shared expert's gate/up",
                                           "shared expert's down", "shared expert gate"};
        q->slot = (int)k;
        snprintf(q->name, sizeof q->name, "%s (%s)", s->c.fqn, what[k]);
    }
    return st;
}

float *hp__t_grad(const hp_runner *r, const hp__w *w)
{
    return w->train_ix > 0 ? r->train->p[w->train_ix - 1].g : NULL;
}

/* A slice's values as the backward multiplies by them: f32 as held, or a bf16 slice's master (a bf16 slice is
 * held only in BF16 compute, whose products round the master to the bf16 copy's values). */
const float *hp__t_w32(const hp_runner *r, const hp__w *w)
{
    return w->dt == HP_DT_BF16 && w->train_ix > 0 ? r->train->p[w->train_ix - 1].data : w->d;
}

tmoe *hp__t_moe(const hp_runner *r, int64_t layer)
{
    for (int i = 0; i < r->train->n_moe; i++)
        if (r->train->moe[i].layer == layer) return &r->train->moe[i];
    return NULL;
}

/* The op record's registration entries (ops.c): each step's trainable tensors, in the program's order. */
hp_status hp__reg_table(hp_runner *r, const hp__step *s, step_w *w, hp_err *err)
{
    if (s->op == HP__OP_HEAD && r->g.tied) return HP_OK; /* the embedding's, registered by its step */
    return add_param(r, &w->table, s->c.fqn, "weight", s, false, err);
}

/* A step's tensors from the op's parameter table (exec/prog.h), in its order: what the checkpoint holds of them is
 * registered (add_param skips the absent ones), each whole tensor of a module tp cuts as a partial sum over tp. */
hp_status hp__reg_params(hp_runner *r, const hp__step *s, step_w *w, hp_err *err)
{
    size_t n;
    const hp__pdef *d = hp__op_params(s->op, &n);
    hp_status st = HP_OK;
    for (size_t i = 0; i < n && st == HP_OK; i++)
        if (hp__pdef_on(&d[i], &r->g, s))
            st = add_param(r, hp__slot_w(w, s->op, d[i].slot), s->c.fqn, d[i].rel, s,
                           s->split && (d[i].flags & HP__P_TP_PARTIAL), err);
    return st;
}

hp_status hp__reg_moe(hp_runner *r, const hp__step *s, step_w *w, hp_err *err)
{
    return add_moe(r, s, &w->moe, err);
}

/* The dense gradients summed over cp and dp (the usual case: every one a rank's rows touch) moved into one flat
 * array in registration order, so one all-reduce per axis sums them all, as a GPU engine's gradient buffer does;
 * a gradient summed over other axes than those keeps its own calls. The gradients are still zero here. */
static bool flat_member(const hp_runner *r, const tparam *q)
{
    bool cp = r->x.pos.n[HP__CP] > 1, dp = r->x.dp > 1;
    return q->own_g && (cp || dp) && q->sum_cp == cp && q->sum_dp == dp;
}

static hp_status flatten_grads(hp_runner *r, hp_err *err)
{
    hp__train *t = r->train;
    int64_t n = 0;
    for (int i = 0; i < t->n; i++)
        if (flat_member(r, &t->p[i])) n += t->p[i].n;
    if (n == 0) return HP_OK;
    if (!(t->flat = hp_calloc((size_t)n + 1, sizeof *t->flat)))
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory for %lld gradients summed in one call", (long long)n);
    t->flat_n = n;
    int64_t off = 0;
    for (int i = 0; i < t->n; i++) {
        tparam *q = &t->p[i];
        if (!flat_member(r, q)) continue;
        free(q->g);
        q->g = t->flat + off;
        q->own_g = false, q->in_flat = true;
        off += q->n;
    }
    return HP_OK;
}

/* The training state of r: its parameters in the program's order. What the backward cannot run yet is refused
 * here, before any step, on every rank alike. */
static hp_status train_init(hp_runner *r, hp_err *err)
{
    if (r->train) return HP_OK;
    if (!r->sc.kept)
        return hp_err_set(err, HP_ERR_INPUT, "the runner keeps no activations: create it with keep_activations "
                          "to train");
    if (!(r->train = hp_calloc(1, sizeof *r->train))) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    r->train_free = train_free;
    r->train->ctx = &r->x;
    const hp__prog *g = &r->g;
    hp_status st = HP_OK;
    for (size_t i = 0; i < g->n_steps && st == HP_OK; i++) {
        const hp__op_rt *o = &hp__op_rt_table[g->steps[i].op];
        if (o->reg && hp__r_step_loaded(r, &g->steps[i])) st = o->reg(r, &g->steps[i], &r->w.sw[i], err);
    }
    if (st == HP_OK) st = flatten_grads(r, err);
    if (st != HP_OK) {
        for (int i = 0; i < r->train->n; i++)
            if (r->train->p[i].w) r->train->p[i].w->train_ix = 0;
        train_free(r->train);
        r->train = NULL;
    }
    return st;
}

/* A tied embedding under a pipeline: the first stage's gradient (the embedding's) and the last stage's (the
 * head's) summed, each rank with the rank at its position in the other stage; both add in the same order (a + b
 * = b + a), so both hold the same sum. */
static hp_status tied_sum(hp_runner *r, tparam *q, hp_err *err)
{
    int64_t other = r->pipe.stage == 0 ? r->pipe.pp - 1 : 0;
    int peer = hp__pipe_peer(r, other);
    size_t bytes = (size_t)q->n * sizeof *q->g;
    float *in = hp__mem_realloc(&r->x, NULL, 0, bytes + sizeof *in);
    if (!in) return hp_err_set(err, HP_ERR_NOMEM, "out of memory for the tied embedding's gradient");
    hp_comm_msg m[2] = {{peer, true, q->g, bytes, 32767}, {peer, false, in, bytes, 32767}};
    double t0 = hp_comm_wtime();
    hp_status st = hp_comm_exchange(r->pipe.all, m, 2, err);
    r->x.st.comm_s += hp_comm_wtime() - t0;
    for (int64_t k = 0; st == HP_OK && k < q->n; k++) q->g[k] += in[k];
    hp__mem_free(&r->x, in, bytes + sizeof *in);
    return st;
}

/* One parameter's gradient summed over tp, cp and dp (the flat array's: over tp only); an MoE array's over its
 * group. */
static hp_status reduce_one(hp_runner *r, tparam *q, hp_err *err)
{
    size_t n = (size_t)q->n;
    hp_status st = HP_OK;
    if (q->kind == K_EXPERT || q->kind == K_BDOWN) {
        const tmoe *b = &r->train->moe[q->moe - 1];
        if (q->kind == K_BDOWN && b->m->tp_cut && r->x.pos.r[HP__TP] != 0)
            memset(q->g, 0, n * sizeof *q->g); /* tp rank 0 holds the bias; the others keep zeros */
        if (hp_comm_size(b->edp) > 1) st = hp__allreduce(&r->x, b->edp, q->g, n, err);
        if (b->escale != 1.0)
            for (size_t k = 0; k < n; k++) q->g[k] = (float)(q->g[k] * b->escale);
    }
    if (st == HP_OK && q->sum_tp) st = hp__allreduce(&r->x, r->x.axc[HP__TP], q->g, n, err);
    if (q->in_flat) return st; /* its cp and dp sums are the flat array's */
    if (st == HP_OK && q->sum_cp) st = hp__allreduce(&r->x, r->x.axc[HP__CP], q->g, n, err);
    if (st == HP_OK && q->sum_dp) st = hp__allreduce(&r->x, r->x.dp_c, q->g, n, err);
    return st;
}

/* Every parameter's gradient summed over the ranks that computed it from other rows, once per axis in the order
 * tp, cp, dp (the flat array's cp and dp sums one call each), and a tied embedding's over the two stages that
 * hold it. */
static hp_status reduce_grads(hp_runner *r, hp_err *err)
{
    hp__train *t = r->train;
    hp_status st = HP_OK;
    for (int i = 0; i < t->n && st == HP_OK; i++) st = reduce_one(r, &t->p[i], err);
    if (st == HP_OK && t->flat && r->x.pos.n[HP__CP] > 1)
        st = hp__allreduce(&r->x, r->x.axc[HP__CP], t->flat, (size_t)t->flat_n, err);
    if (st == HP_OK && t->flat && r->x.dp > 1) st = hp__allreduce(&r->x, r->x.dp_c, t->flat, (size_t)t->flat_n, err);
    for (int i = 0; i < t->n && st == HP_OK; i++) {
        tparam *q = &t->p[i];
        if (r->o.test_perturb_grad && !strcmp(r->o.test_perturb_grad, q->name) && hp_comm_size(r->pipe.all) > 1)
            q->g[0] += 1e-2f * (1.0f + fabsf(q->g[0]));
        if (r->o.test_nan_grad && !strcmp(r->o.test_nan_grad, q->name) && q->n > 0) q->g[q->n - 1] = NAN;
        if (q->tied_pp) st = tied_sum(r, q, err);
    }
    return st;
}

/* The linears read their weights (and copy their biases) when made: after an update they are made again. */
static hp_status relink(hp_runner *r, hp_err *err)
{
    hp_status st = HP_OK;
    for (size_t i = 0; i < r->g.n_steps && st == HP_OK; i++) {
        hp__op op = r->g.steps[i].op;
        step_w *w = &r->w.sw[i];
        if (!hp__r_step_loaded(r, &r->g.steps[i])) continue; /* another stage's */
        if (op == HP__OP_MLP) {
            mlp_w *m = &w->mlp;
            hp_linear_free(m->gate), hp_linear_free(m->up), hp_linear_free(m->gate_up), hp_linear_free(m->down);
            m->gate = m->up = m->gate_up = m->down = NULL;
            if (m->wgu.present) st = hp__r_linear(r, &m->wgu, &m->bgu, &m->gate_up, err);
            else {
                st = hp__r_linear(r, &m->wg, &m->bg, &m->gate, err);
                if (st == HP_OK) st = hp__r_linear(r, &m->wu, &m->bu, &m->up, err);
            }
            if (st == HP_OK) st = hp__r_linear(r, &m->wd, NULL, &m->down, err);
        }
        if (op != HP__OP_ATTN && op != HP__OP_MLA) continue;
        attn_w *a = &w->at;
        hp_linear_free(a->q), hp_linear_free(a->k), hp_linear_free(a->v), hp_linear_free(a->o);
        hp_linear_free(a->qa), hp_linear_free(a->kva), hp_linear_free(a->kvb);
        a->q = a->k = a->v = a->o = a->qa = a->kva = a->kvb = NULL;
        if (a->mla) {
            if (a->ql > 0) st = hp__r_linear(r, &a->wqa, NULL, &a->qa, err);
            if (st == HP_OK) st = hp__r_linear(r, &a->wq, NULL, &a->q, err);
            if (st == HP_OK) st = hp__r_linear(r, &a->wkva, NULL, &a->kva, err);
            if (st == HP_OK) st = hp__r_linear(r, &a->wkvb, NULL, &a->kvb, err);
            if (st == HP_OK) st = hp__r_linear(r, &a->wo, NULL, &a->o, err);
            continue;
        }
        st = hp__r_linear(r, &a->wq, &a->bq, &a->q, err);
        if (st == HP_OK) st = hp__r_linear(r, &a->wk, &a->bk, &a->k, err);
        if (st == HP_OK) st = hp__r_linear(r, &a->wv, &a->bv, &a->v, err);
        if (st == HP_OK) st = hp__r_linear(r, &a->wo, NULL, &a->o, err);
    }
    if (st == HP_OK && r->w.head_w && r->w.head_w->present) {
        hp_linear_free(r->w.head);
        r->w.head = NULL;
        hp__w hw = *r->w.head_w;
        st = hp__r_linear(r, &hw, NULL, &r->w.head, err);
    }
    return st;
}

/* n zero floats, written here: calloc's untouched pages map the shared zero page, and AdamW's first step reads m
 * and v (the check) before it writes them, so each page would then be copied on write with a TLB shootdown on
 * every thread (perf: do_wp_page, ptep_clear_flush in the first step's AdamW). */
static float *zeroed(size_t n)
{
    float *p = malloc(n * sizeof *p);
    if (!p) return NULL;
    enum { CHUNK = 1 << 16 }; /* floats per task; the loop also keeps the compiler from making this a calloc */
#pragma omp parallel for schedule(static) if (n >= 4 * (size_t)CHUNK)
    for (size_t i = 0; i < n; i += CHUNK) memset(p + i, 0, (n - i < CHUNK ? n - i : CHUNK) * sizeof *p);
    return p;
}

/* AdamW's moments, allocated at the first step: whole, or (ZeRO-1) this rank's block over the ranks that hold
 * the same slice of the parameter: dp for a dense slice, the expert-data-parallel group for routed experts. */
static hp_status opt_state(hp_runner *r, hp_err *err)
{
    hp__train *t = r->train;
    for (int i = 0; i < t->n; i++) {
        tparam *q = &t->p[i];
        if (q->m) continue;
        const hp_comm *zc = NULL;
        if (t->zero) zc = q->kind == K_EXPERT || q->kind == K_BDOWN ? t->moe[q->moe - 1].edp : r->x.dp_c;
        if (zc && hp_comm_size(zc) < 2) zc = NULL;
        q->zn = q->n;
        if (zc) {
            int64_t P = hp_comm_size(zc), k = hp_comm_rank(zc);
            q->zblk = (q->n + P - 1) / P;
            q->zlo = k * q->zblk < q->n ? k * q->zblk : q->n;
            q->zn = q->zlo + q->zblk <= q->n ? q->zblk : q->n - q->zlo;
        }
        q->zc = zc;
        q->m = zeroed((size_t)q->zn + 1);
        q->v = zeroed((size_t)q->zn + 1);
        if (!q->m || !q->v) return hp_err_set(err, HP_ERR_NOMEM, "out of memory for the optimizer state");
    }
    return HP_OK;
}

/* The training state's bytes into the statistics (hp_run_stats.train_*_bytes). */
static void state_bytes(hp_runner *r)
{
    const hp__train *t = r->train;
    hp_run_stats *rs = &r->tr.stats;
    uint64_t g = 0, o = 0, ms = 0;
    for (int i = 0; i < t->n; i++) {
        const tparam *q = &t->p[i];
        uint64_t n = (uint64_t)q->n * sizeof(float);
        g += n;
        o += q->m ? 2 * (uint64_t)q->zn * sizeof(float) : 0;
        ms += q->b16 || q->wide ? n : 0;
    }
    rs->train_grad_bytes = g, rs->train_optim_bytes = o, rs->train_master_bytes = ms;
}

/* ZeRO-1: AdamW on this rank's block, then the updated blocks all-gathered over the group. */
static hp_status zero_step(hp_runner *r, tparam *q, const hp__adamw *ao, hp_err *err)
{
    int64_t P = hp_comm_size(q->zc);
    hp__adamw_step(q->data + q->zlo, q->g + q->zlo, q->m, q->v, q->zn, ao, r->train->step);
    size_t sb = ((size_t)q->zblk + 1) * sizeof(float), ab = ((size_t)(P * q->zblk) + 1) * sizeof(float);
    float *send = hp__mem_realloc(&r->x, NULL, 0, sb), *all = send ? hp__mem_realloc(&r->x, NULL, 0, ab) : NULL;
    hp_status st = send && all ? HP_OK : hp_err_set(err, HP_ERR_NOMEM, "out of memory for ZeRO's all-gather");
    if (st == HP_OK) {
        memcpy(send, q->data + q->zlo, (size_t)q->zn * sizeof *send);
        st = hp_comm_allgather(q->zc, send, (size_t)q->zblk * sizeof *send, all, err);
    }
    if (st == HP_OK) memcpy(q->data, all, (size_t)q->n * sizeof *all);
    hp__mem_free(&r->x, send, sb);
    hp__mem_free(&r->x, all, ab);
    return st;
}

hp_status hp__train_begin(hp_runner *r, hp_err *err)
{
    hp_status st = hp_comm_agree(r->pipe.all, train_init(r, err), err);
    if (st != HP_OK) return st;
    hp__train *t = r->train;
    hp__r_release(r); /* what an evaluation's forward left: every micro-batch starts from no buffer */
    if (!t->pending) { /* the step's first micro-batch */
        t->grads = false;
        for (int i = 0; i < t->n; i++) memset(t->p[i].g, 0, (size_t)t->p[i].n * sizeof *t->p[i].g);
        t->fwd_s = t->bwd_s = t->bwd_comm_s = 0;
    }
    return HP_OK;
}

hp_status hp__train_end(hp_runner *r, hp_status st, int64_t n_micro, double fwd_s, double bwd_s, double bwd_comm_s,
                        hp_err *err)
{
    hp__train *t = r->train;
    hp__bwd_release(t); /* the micro-batch's buffers: the next one allocates what this one did */
    hp__r_release(r);
    if (st == HP_OK && r->x.mem.cur != 0) /* every counted buffer is one of those: the count must be back at 0 */
        st = hp_err_set(err, HP_ERR_INPUT, "internal error: %zu bytes of the step's buffers are counted after they "
                        "were all freed", (size_t)r->x.mem.cur);
    st = hp_comm_agree(r->pipe.all, st, err);
    if (st != HP_OK) return st;
    t->pending += (int)n_micro;
    t->fwd_s += fwd_s;
    t->bwd_s += bwd_s;
    t->bwd_comm_s += bwd_comm_s;
    r->tr.stats.workspace_bytes = r->x.mem.peak; /* the training's high-water mark (hp_runner_forward) */
    return HP_OK;
}

hp_status hp_runner_accumulate(hp_runner *r, const int64_t *ids, int64_t B, int64_t S, int64_t n_scored,
                               double *loss, hp_err *err)
{
    return hp_runner_accumulate_masked(r, ids, NULL, B, S, n_scored, loss, err);
}

hp_status hp_runner_accumulate_masked(hp_runner *r, const int64_t *ids, const uint8_t *mask, int64_t B, int64_t S,
                                      int64_t n_scored, double *loss, hp_err *err)
{
    if (r->pipe.pp > 1) /* one micro-batch through the stages, by the plan's default schedule */
        return hp_runner_accumulate_pipe(r, ids, mask, 1, B, S, n_scored, hp_pp_sched_default(&r->p->pipe), loss,
                                         err);
    hp_status st = hp__train_begin(r, err);
    if (st != HP_OK) return st;
    hp__train *t = r->train;
    hp_run_output out;
    double t0 = hp_comm_wtime();
    if ((st = hp_runner_forward_masked(r, ids, mask, B, S, &out, err)) != HP_OK) return st;
    double t1 = hp_comm_wtime(), c1 = r->x.st.comm_s;
    *loss = out.loss;
    hp_run_output_free(&out);
    t->scored = n_scored > 0 ? n_scored : hp__r_scored(mask, B, S);
    r->tr.quiet = true; /* the layers' recomputed forwards are not recorded again */
    st = hp__backward(r, ids, mask, S, err);
    r->tr.quiet = false;
    uint64_t sv = 0; /* the kept activations' bytes (hp_run_stats.train_saved_bytes) */
    for (int64_t l = 0; l <= r->g.cfg.L; l++) sv += (uint64_t)hp__act_count(&r->sc.kept[l]) * sizeof(float);
    r->tr.stats.train_saved_bytes = sv;
    return hp__train_end(r, st, 1, t1 - t0, hp_comm_wtime() - t1, r->x.st.comm_s - c1, err);
}

/* The global gradient norm, every element counted once: each rank's sum of squares weighted by 1 / the ranks that
 * hold the same (already summed) slice, added over the world (every stage: a tied embedding, on two of them, by
 * halves). */
static hp_status grad_norm(hp_runner *r, double *norm, hp_err *err)
{
    const hp__train *t = r->train;
    double world = hp_comm_size(r->x.world), tp = (double)r->x.pos.n[HP__TP], sum = 0;
    for (int i = 0; i < t->n; i++) {
        const tparam *q = &t->p[i];
        double holders = world;
        if (q->kind == K_EXPERT || q->kind == K_BDOWN) holders = hp_comm_size(t->moe[q->moe - 1].edp);
        else if (q->w) {
            hp_placement p = q->w->pl.ax[HP_AXIS_TP];
            if (tp > 1 && (p.kind == HP_PL_S || p.kind == HP_PL_S2)) holders = world / tp;
        } else if (q->kind == K_SHARED && t->moe[q->moe - 1].m->tp_cut) holders = world / tp;
        double s2 = 0;
        for (int64_t k = 0; k < q->n; k++) s2 += (double)q->g[k] * q->g[k];
        sum += s2 / (q->tied_pp ? 2 * holders : holders);
    }
    hp_status st = hp_comm_allreduce_sum_f64(r->pipe.all, &sum, 1, err);
    *norm = sqrt(sum);
    return st;
}

/* What the forward reads of an entry after its values changed: the router's f64 copy, a bf16 slice's copy (the
 * master rounded to nearest even). */
static void sync_copies(tparam *q)
{
    if (q->wide) /* the router: E x H, small */
        for (int64_t k = 0; k < q->n; k++) q->wide[k] = q->data[k];
    if (!q->w || q->w->dt != HP_DT_BF16) return;
    /* a bf16 model's copies are a pass over every weight: the vector rounding of the GEMM layer, over rows of
     * 4096 that the threads split, and the rest as one row */
    enum { ROW = 4096 };
    int64_t rows = q->n / ROW, rest = q->n - rows * ROW;
    uint16_t *dst = q->w->d;
    hp__round_rows_bf16(rows, ROW, q->data, ROW, dst);
    if (rest) hp__round_rows_bf16(1, rest, q->data + rows * ROW, rest, dst + rows * ROW);
}

/* Before AdamW's step t->step touches anything: whether it would store a value that is not finite (or a negative
 * second moment) anywhere, agreed over the world. None: HP_OK. Otherwise, with opts->skip_nonfinite, the step
 * is dropped (*skip, counted, t->step back) and every parameter and moment stays as it was; without it
 * HP_ERR_VERIFY naming the step, the first such entry (in the program's order, any rank), its values and the
 * likely cause. Collective. */
static hp_status update_check(hp_runner *r, const hp__adamw *ao, const hp_train_opts *opts, bool *skip, hp_err *err)
{
    hp__train *t = r->train;
    int fi = t->n;
    int64_t fk = 0;
    hp__adamw_bad bad = {0};
    for (int i = 0; i < t->n && fi == t->n; i++) {
        const tparam *q = &t->p[i];
        int64_t lo = q->zc ? q->zlo : 0, n = q->zc ? q->zn : q->n;
        int64_t k = hp__adamw_check(q->data + lo, q->g + lo, q->m, q->v, n, ao, t->step, &bad);
        if (k < n) fi = i, fk = lo + k;
    }
    /* the lowest such entry over the world (entries are in the program's order; 1e9: none on this rank) */
    double mine = fi < t->n ? (double)fi : 1e9, first = -mine;
    hp_status st = hp_comm_allreduce_max_f64(r->pipe.all, &first, 1, err);
    if (st != HP_OK) return st;
    if (-first >= 1e9) return HP_OK;
    if (opts->skip_nonfinite) { /* nothing was written: the step is left whole */
        r->tr.stats.train_skipped++;
        t->step--;
        *skip = true;
        return HP_OK;
    }
    if (mine == -first) { /* the ranks that hold it say it; the lowest one's message reaches every rank */
        char cause[400];
        double lw = ao->lr * ao->weight_decay;
        if (!isfinite(bad.old))
            snprintf(cause, sizeof cause, "the parameter's value was already not finite");
        else if (!isfinite(bad.m) || !isfinite(bad.v) || bad.v < 0)
            snprintf(cause, sizeof cause, "its gradient %g is too large for AdamW's f32 moments (the second moment "
                     "would be %g); --clip NORM bounds it", (double)bad.grad, (double)bad.v);
        else if (lw >= 1)
            snprintf(cause, sizeof cause, "the learning rate or the weight decay is too large (--lr %g x "
                     "--weight-decay %g = %g, so the decay factor 1 - lr*wd is %g); lower --lr or --weight-decay",
                     ao->lr, ao->weight_decay, lw, bad.decay);
        else
            snprintf(cause, sizeof cause, "the learning rate is likely too large (--lr %g); lower --lr", ao->lr);
        st = hp_err_set(err, HP_ERR_VERIFY, "step %lld: the AdamW update of %s is not finite (element %lld: %g "
                        "would become %g); the parameters and the optimizer state were not updated and nothing "
                        "of this step was saved: %s, or --skip-nonfinite to skip such steps", (long long)t->step,
                        t->p[fi].name, (long long)fk, (double)bad.old, (double)bad.param, cause);
    }
    t->step--;
    return hp_comm_agree(r->pipe.all, st, err);
}

hp_status hp_runner_apply(hp_runner *r, const hp_train_opts *opts, double *norm_out, hp_err *err)
{
    hp__train *t = r->train;
    if (!t || !t->pending)
        return hp_err_set(err, HP_ERR_INPUT, "no gradients to apply: accumulate a micro-batch first");
    double t2 = hp_comm_wtime();
    hp_status st = hp_comm_agree(r->pipe.all, reduce_grads(r, err), err);
    t->pending = 0;
    if (st != HP_OK) return st;
    t->grads = true;
    double norm = 0;
    if ((st = grad_norm(r, &norm, err)) != HP_OK) return st;
    if (norm_out) *norm_out = norm;
    if (!isfinite(norm)) { /* the first parameter (in the program's order) whose gradient is not finite, any rank */
        double first = t->n;
        for (int i = 0; i < t->n && first == t->n; i++)
            for (int64_t k = 0; k < t->p[i].n; k++)
                if (!isfinite(t->p[i].g[k])) {
                    first = i;
                    break;
                }
        first = -first;
        if ((st = hp_comm_allreduce_max_f64(r->pipe.all, &first, 1, err)) != HP_OK) return st;
        int fi = (int)-first;
        const char *name = fi < t->n ? t->p[fi].name : "?";
        if (opts && opts->skip_nonfinite) { /* no update; the gradients start again at the next step */
            r->tr.stats.train_skipped++;
            return HP_OK;
        }
        return hp_err_set(err, HP_ERR_VERIFY, "step %lld: the gradient of %s is not finite (global norm %g); the "
                          "parameters were not updated (lower --lr, --clip, or --skip-nonfinite to skip such steps)",
                          (long long)t->step + 1, name, norm);
    }
    hp_run_stats *rs = &r->tr.stats;
    rs->train_fwd_s = t->fwd_s;
    rs->train_bwd_s = t->bwd_s + (hp_comm_wtime() - t2);
    rs->train_bwd_comm_s = t->bwd_comm_s;
    rs->train_opt_s = 0;
    if (!opts) return HP_OK;
    double t3 = hp_comm_wtime();
    if (opts->clip > 0 && norm > opts->clip) { /* torch.nn.utils.clip_grad_norm_: × max / (norm + 1e-6) */
        float c = (float)(opts->clip / (norm + 1e-6));
        for (int i = 0; i < t->n; i++)
            for (int64_t k = 0; k < t->p[i].n; k++) t->p[i].g[k] *= c;
    }
    t->step++;
    if (t->step == 1) t->zero = opts->zero;
    else if (opts->zero != t->zero)
        return hp_err_set(err, HP_ERR_INPUT, "--zero %d after steps with --zero %d: the optimizer state is laid out "
                          "once", opts->zero, t->zero);
    if ((st = hp_comm_agree(r->pipe.all, opt_state(r, err), err)) != HP_OK) return st;
    hp__adamw ao = {.lr = opts->lr, .beta1 = opts->beta1, .beta2 = opts->beta2, .eps = opts->eps,
                    .weight_decay = opts->weight_decay};
    bool skip = false;
    if ((st = update_check(r, &ao, opts, &skip, err)) != HP_OK || skip) return st;
    for (int i = 0; i < t->n && st == HP_OK; i++) {
        tparam *q = &t->p[i];
        if (!q->zc) hp__adamw_step(q->data, q->g, q->m, q->v, q->n, &ao, t->step);
        else st = zero_step(r, q, &ao, err);
        sync_copies(q);
    }
    if ((st = hp_comm_agree(r->pipe.all, st, err)) != HP_OK) return st;
    state_bytes(r);
    st = hp_comm_agree(r->pipe.all, relink(r, err), err);
    rs->train_opt_s = hp_comm_wtime() - t3;
    rs->workspace_bytes = r->x.mem.peak; /* ZeRO's all-gathers included */
    return st;
}

hp_status hp_runner_train_step(hp_runner *r, const int64_t *ids, int64_t B, int64_t S, const hp_train_opts *opts,
                               double *loss, hp_err *err)
{
    if (r->train) r->train->pending = 0; /* a step of its own */
    hp_status st = hp_runner_accumulate(r, ids, B, S, 0, loss, err);
    return st == HP_OK ? hp_runner_apply(r, opts, NULL, err) : st;
}

/* ---- the parameters, whole, on rank 0 ---- */

/* Every rank's n floats at data gathered onto world rank 0: *all (rank 0: malloc'd) with rank k's block at
 * dsp[k] floats, cnt[k] floats long. Collective. */
static hp_status gather_blocks(hp_runner *r, const float *data, int64_t n, float **all, int64_t *cnt, int64_t *dsp,
                               hp_err *err)
{
    int world = hp_comm_size(r->x.world), me = hp_comm_rank(r->x.world);
    *all = NULL;
    hp_status st = hp_comm_allgather(r->x.world, &n, sizeof n, cnt, err);
    size_t *bc = st == HP_OK ? hp_calloc((size_t)world * 2, sizeof *bc) : NULL, *bd = bc ? bc + world : NULL;
    if (st == HP_OK && !bc) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    int64_t total = 0;
    for (int k = 0; st == HP_OK && k < world; k++) {
        dsp[k] = total;
        total += cnt[k];
        bc[k] = (size_t)cnt[k] * sizeof(float);
        bd[k] = (size_t)dsp[k] * sizeof(float);
    }
    if (st == HP_OK && me == 0 && !(*all = malloc((size_t)total * sizeof(float) + 1)))
        st = hp_err_set(err, HP_ERR_NOMEM, "out of memory gathering the parameters");
    st = hp_comm_agree(r->x.world, st, err);
    if (st == HP_OK) st = hp_comm_gatherv(r->x.world, data, (size_t)n * sizeof(float), *all, bc, bd, 0, err);
    free(bc);
    return st;
}

/* The columns [*lo, *lo + *n) of an expert width w that tp index j of tp holds when tp cuts the experts (gpt-oss:
 * its interleaved gate/up pairs are cut as 2w is, hp_moe_load_opts.tp_size). */
static void expert_block(const hp_moe_layer *l, int64_t w, int64_t tp, int64_t j, int64_t *lo, int64_t *n)
{
    if (l->act == HP_MOE_ACT_GPTOSS) {
        *lo = hp__blk_lo(2 * w, tp, j) / 2;
        *n = (hp__blk_lo(2 * w, tp, j + 1) - hp__blk_lo(2 * w, tp, j)) / 2;
    } else {
        *lo = hp__blk_lo(w, tp, j);
        *n = hp__blk_lo(w, tp, j + 1) - *lo;
    }
}

/* Places rank k's local [n_loc, rows(il), cols] block of a stacked [E, rows(I), cols] array: gate/up rows come in
 * two halves (half true) or columns are cut (rows_cut false: a [.., H, il] down projection). */
static void place_experts(float *whole, const float *loc, int64_t first, int64_t n_loc, int64_t I, int64_t c0,
                          int64_t il, int64_t H, int kind)
{
    for (int64_t e = 0; e < n_loc; e++) {
        float *we = whole + (first + e) * (kind == 1 ? H * I : kind == 0 ? 2 * I * H : kind == 2 ? 2 * I : H);
        const float *le = loc + e * (kind == 1 ? H * il : kind == 0 ? 2 * il * H : kind == 2 ? 2 * il : H);
        if (kind == 0) { /* gate_up [2I, H]: rows c0.. of each half */
            memcpy(we + c0 * H, le, (size_t)(il * H) * sizeof *we);
            memcpy(we + (I + c0) * H, le + il * H, (size_t)(il * H) * sizeof *we);
        } else if (kind == 1) { /* down [H, I]: columns c0.. */
            for (int64_t h = 0; h < H; h++) memcpy(we + h * I + c0, le + h * il, (size_t)il * sizeof *we);
        } else if (kind == 2) { /* gate_up bias [2I] */
            memcpy(we + c0, le, (size_t)il * sizeof *we);
            memcpy(we + I + c0, le + il, (size_t)il * sizeof *we);
        } else {
            memcpy(we, le, (size_t)H * sizeof *we); /* down bias [H] */
        }
    }
}

typedef struct fwd_ctx {
    hp_param_fn fn;
    void *ctx;
} fwd_ctx;

static hp_status forward_tensor(void *c, const char *name, const float *d, const int64_t *shape, int nd, hp_err *err)
{
    const fwd_ctx *f = c;
    return f->fn(f->ctx, name, d, shape, nd, err);
}

/* An MoE block whole on rank 0 (its routed experts from every EP rank and tp block, the rest as rank 0 holds it),
 * handed to fn under the checkpoint's names and layouts (hp_moe_layer_export). Collective. */
static hp_status gather_moe(hp_runner *r, const tmoe *b, int first_param, bool grads, hp_param_fn fn, void *ctx,
                            hp_err *err)
{
    const hp__train *t = r->train;
    const hp_moe_layer *l = b->m->l;
    int world = hp_comm_size(r->x.world), me = hp_comm_rank(r->x.world);
    int64_t E = l->n_experts, H = l->n_hidden, tp = r->x.pos.n[HP__TP];
    int64_t I = l->d_expert, sI = l->d_shared;
    if (b->m->tp_cut) { /* the whole widths */
        I = r->m->cfg.moe_intermediate_size;
        sI = sI > 0 ? r->m->cfg.shared_intermediate_size : 0;
    }
    hp_status st = HP_OK;
    hp_moe_grads whole = {.n_hidden = H, .n_experts = E, .n_local = E, .d_expert = I, .d_shared = sI};
    int64_t *cnt = hp_calloc((size_t)world * 2, sizeof *cnt), *dsp = cnt ? cnt + world : NULL;
    if (!cnt) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    /* the entries of the block in add_moe's order */
    const tparam *q = &t->p[first_param];
    int nq = 0;
    while (first_param + nq < t->n && q[nq].moe == q[0].moe) nq++;
    float *bufs[9] = {0};
    for (int k = 0; k < nq && st == HP_OK; k++) {
        const tparam *e = &q[k];
        const float *mine = grads ? e->g : e->data;
        float *all = NULL;
        if (e->kind == K_EXPERT || e->kind == K_BDOWN || (e->kind == K_SHARED && b->m->tp_cut)) {
            st = gather_blocks(r, mine, e->n, &all, cnt, dsp, err);
        }
        float *w = NULL;
        int64_t wn = 0, slot = e->slot; /* the whole array's size */
        switch (slot) {
        case 0: wn = E * 2 * I * H; break;
        case 1: wn = E * H * I; break;
        case 2: wn = E * 2 * I; break;
        case 3: wn = E * H; break;
        case 4: wn = E * H; break;
        case 5: wn = E; break;
        case 6: wn = 2 * sI * H; break;
        case 7: wn = H * sI; break;
        case 8: wn = H; break;
        default: st = hp_err_set(err, HP_ERR_INPUT, "internal error: %s", e->name);
        }
        if (st == HP_OK && me == 0 && !(w = hp_calloc((size_t)wn + 1, sizeof *w)))
            st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        for (int rk = 0; st == HP_OK && me == 0 && all && rk < world; rk++) {
            int64_t g0, idx, first, n_loc, j = hp_mesh_coord(&r->p->mesh, rk, "tp"), c0 = 0, il = slot >= 6 ? sI : I;
            hp_mesh_ep_index(&r->p->mesh, r->ep, rk, &g0, &idx);
            hp_ep_local_experts(E, r->ep, idx, &first, &n_loc);
            if (b->m->tp_cut) {
                if (slot >= 6) {
                    c0 = hp__blk_lo(sI, tp, j);
                    il = hp__blk_lo(sI, tp, j + 1) - c0;
                } else {
                    expert_block(l, I, tp, j, &c0, &il);
                }
            }
            const float *loc = all + dsp[rk];
            if (slot == 3 && b->m->tp_cut && j != 0) continue; /* the down bias: tp rank 0's */
            if (slot <= 3) place_experts(w, loc, first, n_loc, I, c0, il, H, (int)slot);
            else if (slot == 6) {
                memcpy(w + c0 * H, loc, (size_t)(il * H) * sizeof *w);
                memcpy(w + (sI + c0) * H, loc + il * H, (size_t)(il * H) * sizeof *w);
            } else if (slot == 7) {
                for (int64_t h = 0; h < H; h++) memcpy(w + h * sI + c0, loc + h * il, (size_t)il * sizeof *w);
            }
        }
        if (st == HP_OK && me == 0 && !all) memcpy(w, mine, (size_t)wn * sizeof *w); /* whole on every rank */
        free(all);
        if (slot >= 0 && slot < 9) bufs[slot] = w;
        else free(w);
    }
    whole.d_gate_up = bufs[0], whole.d_down = bufs[1], whole.d_b_gate_up = bufs[2], whole.d_b_down = bufs[3];
    whole.d_w_router = bufs[4], whole.d_b_router = bufs[5], whole.d_ws_gate_up = bufs[6], whole.d_ws_down = bufs[7];
    whole.d_ws_gate = bufs[8];
    fwd_ctx f = {fn, ctx};
    if (st == HP_OK && me == 0) st = hp_moe_layer_export(l, r->m, &whole, forward_tensor, &f, err);
    if (st == HP_OK && me == 0 && !grads && l->b_correction) { /* not trained, but part of the weights: as held */
        char name[200];
        float *cb = hp_calloc((size_t)E + 1, sizeof *cb);
        if (!cb) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        for (int64_t e = 0; cb && e < E; e++) cb[e] = (float)l->b_correction[e];
        snprintf(name, sizeof name, "%sgate.e_score_correction_bias", l->prefix);
        int64_t shape[1] = {E};
        if (st == HP_OK) st = fn(ctx, name, cb, shape, 1, err);
        free(cb);
    }
    for (int k = 0; k < 9; k++) free(bufs[k]);
    free(cnt);
    return hp_comm_agree(r->x.world, st, err);
}

/* The parameters of the rank's stage (every parameter without a pipeline) whole on the stage's first rank, handed
 * to fn there. Collective over the stage. */
static hp_status stage_gather(hp_runner *r, bool grads, hp_param_fn fn, void *ctx, hp_err *err)
{
    hp_status st = hp_comm_agree(r->x.world, train_init(r, err), err);
    if (st == HP_OK && grads && !r->train->grads)
        st = hp_err_set(err, HP_ERR_INPUT, "no gradients yet: take a training step first");
    if (st != HP_OK) return st;
    hp__train *t = r->train;
    int world = hp_comm_size(r->x.world), me = hp_comm_rank(r->x.world);
    int64_t base = r->pipe.stage * r->pipe.per; /* the layout's ranks are the world's */
    size_t *cnt = hp_calloc((size_t)world * 2, sizeof *cnt), *dsp = cnt ? cnt + world : NULL;
    if (!cnt) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < t->n && (st = hp_comm_agree(r->x.world, st, err)) == HP_OK; i++) {
        const tparam *q = &t->p[i];
        if (q->tied_pp && r->pipe.stage != 0) continue; /* the first stage hands it */
        if (q->moe) { /* the block's entries, together */
            st = gather_moe(r, &t->moe[q->moe - 1], i, grads, fn, ctx, err);
            while (i + 1 < t->n && t->p[i + 1].moe == q->moe) i++;
            continue;
        }
        hp_shard_tensor cut[1];
        float *all = NULL, *whole = NULL;
        size_t total = 0, gn = 1;
        if (me == 0) { /* every rank's cut of this parameter, from the plan's layout */
            for (int k = 0; k < world && st == HP_OK; k++) {
                st = hp__w_cut(&r->w.ws, q->name, base + k, cut, err);
                dsp[k] = total;
                size_t ln = 1;
                for (int d = 0; d < cut->n_dims; d++) ln *= (size_t)cut->local_shape[d];
                cnt[k] = ln * sizeof(float);
                total += cnt[k];
            }
            for (int d = 0; st == HP_OK && d < q->w->n_dims; d++) gn *= (size_t)q->w->global[d];
            if (st == HP_OK && (!(all = malloc(total + 1)) || !(whole = hp_calloc(gn + 1, sizeof *whole))))
                st = hp_err_set(err, HP_ERR_NOMEM, "out of memory gathering %s", q->name);
        }
        st = hp_comm_agree(r->x.world, st, err);
        const float *mine = grads ? q->g : q->data; /* the f32 master of a bf16 slice */
        if (st == HP_OK) st = hp_comm_gatherv(r->x.world, mine, (size_t)q->w->n * sizeof(float), all, cnt, dsp, 0, err);
        for (int k = 0; me == 0 && st == HP_OK && k < world; k++) {
            if ((st = hp__w_cut(&r->w.ws, q->name, base + k, cut, err)) == HP_OK)
                hp__w_place(cut, (const float *)((const char *)all + dsp[k]), whole);
        }
        if (me == 0 && st == HP_OK) st = fn(ctx, q->name, whole, q->w->global, q->w->n_dims, err);
        free(all);
        free(whole);
    }
    free(cnt);
    return hp_comm_agree(r->x.world, st, err);
}

/* A whole tensor from a stage's first rank to world rank 0 (a pipeline's gather): this header, then the values. */
typedef struct relay_head {
    int32_t end, status, n_dims, pad;
    int64_t shape[8];
    char name[200];
} relay_head;

typedef struct relay {
    hp_runner *r;
    hp_param_fn fn;
    void *ctx;
} relay;

static hp_status relay_send(void *c, const char *name, const float *d, const int64_t *shape, int nd, hp_err *err)
{
    const relay *rl = c;
    relay_head h = {.n_dims = nd};
    size_t n = 1;
    if (nd > 8) return hp_err_set(err, HP_ERR_INPUT, "internal error: %s has %d dimensions", name, nd);
    for (int k = 0; k < nd; k++) n *= (size_t)(h.shape[k] = shape[k]);
    snprintf(h.name, sizeof h.name, "%s", name);
    hp_status st = hp_comm_send(rl->r->pipe.all, 0, &h, sizeof h, 1, err);
    return st == HP_OK ? hp_comm_send(rl->r->pipe.all, 0, d, n * sizeof *d, 2, err) : st;
}

/* World rank 0: the tensors stage s's first rank relays, handed to fn until its end marker (fn's first failure
 * kept; the rest still received). */
static hp_status relay_recv(hp_runner *r, int64_t s, hp_param_fn fn, void *ctx, hp_err *err)
{
    int from = hp__pipe_first(r, s);
    hp_status st = HP_OK;
    for (;;) {
        relay_head h;
        hp_status rs = hp_comm_recv(r->pipe.all, from, &h, sizeof h, 1, err);
        if (rs != HP_OK) return rs;
        if (h.end) return st != HP_OK ? st : h.status == HP_OK ? HP_OK : HP_ERR_INPUT;
        size_t n = 1;
        for (int k = 0; k < h.n_dims && k < 8; k++) n *= (size_t)h.shape[k];
        float *d = malloc(n * sizeof *d + 1);
        if (!d) return hp_err_set(err, HP_ERR_NOMEM, "out of memory gathering %s", h.name);
        if ((rs = hp_comm_recv(r->pipe.all, from, d, n * sizeof *d, 2, err)) == HP_OK && st == HP_OK) {
            h.name[sizeof h.name - 1] = '\0';
            st = fn(ctx, h.name, d, h.shape, h.n_dims, err);
        }
        free(d);
        if (rs != HP_OK) return rs;
    }
}

hp_status hp_runner_gather_params(hp_runner *r, bool grads, hp_param_fn fn, void *ctx, hp_err *err)
{
    if (r->pipe.pp == 1) return stage_gather(r, grads, fn, ctx, err);
    /* a pipeline: stage by stage, each gathered on its first rank, relayed to world rank 0 */
    hp_status st = HP_OK;
    int me = hp_comm_rank(r->pipe.all);
    for (int64_t s = 0; s < r->pipe.pp; s++) {
        hp_status ss = HP_OK;
        if (r->pipe.stage == s && s == 0) {
            ss = stage_gather(r, grads, fn, ctx, err);
        } else if (r->pipe.stage == s) {
            relay rl = {r, fn, ctx};
            ss = stage_gather(r, grads, relay_send, &rl, err);
            if (me == hp__pipe_first(r, s)) { /* the end marker, with the stage's status */
                relay_head h = {.end = 1, .status = (int32_t)ss};
                hp_status es = hp_comm_send(r->pipe.all, 0, &h, sizeof h, 1, err);
                if (ss == HP_OK) ss = es;
            }
        } else if (me == 0) {
            ss = relay_recv(r, s, fn, ctx, err);
        }
        if ((st = hp_comm_agree(r->pipe.all, ss, err)) != HP_OK) return st;
    }
    return st;
}

/* ---- the training state, saved and restored (a resumed run continues bit for bit) ---- */

/* Entry i's tensors in a rank's state file: "<kind>.<i>" with the entry's name in the metadata. */
static void state_key(char *buf, size_t cap, const char *kind, int i)
{
    snprintf(buf, cap, "%s.%d", kind, i);
}

/* A state file that names its rank (every one saved since it does) must be this rank's: two swapped files have
 * the same sizes and names. */
static hp_status state_rank_check(const hp_st_file *f, int rank, const char *path, hp_err *err)
{
    const char *rk = hp_st_metadata_get(f, "rank");
    char want[32];
    snprintf(want, sizeof want, "%d", rank);
    if (rk && strcmp(rk, want))
        return hp_err_set(err, HP_ERR_INPUT, "%s: the training state of rank %s, where rank %d's is needed (the rank "
                          "files were swapped or renamed)", path, rk, rank);
    return HP_OK;
}

hp_status hp_runner_save_train_meta(hp_runner *r, const char *dir, const char *const *meta, int n_meta, hp_err *err)
{
    hp_status st = hp_comm_agree(r->pipe.all, train_init(r, err), err);
    if (st != HP_OK) return st;
    hp__train *t = r->train;
    if (t->pending) st = hp_err_set(err, HP_ERR_INPUT, "a step is half accumulated; save after hp_runner_apply");
    st = hp_comm_agree(r->pipe.all, st, err);
    if (st != HP_OK) return st;
    if ((st = hp_comm_agree(r->pipe.all, opt_state(r, err), err)) != HP_OK) return st;
    hp_st_writer *w = hp_st_writer_create();
    char path[4200], key[64], val[64];
    snprintf(path, sizeof path, "%s/rank-%d.safetensors", dir, hp_comm_rank(r->pipe.all));
    if (!w) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    snprintf(val, sizeof val, "%lld", (long long)t->step);
    if (st == HP_OK) st = hp_st_writer_set_metadata(w, "step", val, err);
    snprintf(val, sizeof val, "%d", t->zero);
    if (st == HP_OK) st = hp_st_writer_set_metadata(w, "zero", val, err);
    snprintf(val, sizeof val, "%d", hp_comm_size(r->pipe.all));
    if (st == HP_OK) st = hp_st_writer_set_metadata(w, "world", val, err);
    snprintf(val, sizeof val, "%d", hp_comm_rank(r->pipe.all));
    if (st == HP_OK) st = hp_st_writer_set_metadata(w, "rank", val, err);
    snprintf(val, sizeof val, "%lld", (long long)r->pipe.pp);
    if (st == HP_OK) st = hp_st_writer_set_metadata(w, "pp", val, err);
    for (int i = 0; i < n_meta && st == HP_OK; i++)
        st = hp_st_writer_set_metadata(w, meta[2 * i], meta[2 * i + 1], err);
    for (int i = 0; i < t->n && st == HP_OK; i++) {
        const tparam *q = &t->p[i];
        int64_t n = q->n, zn = q->zn;
        state_key(key, sizeof key, "name", i);
        st = hp_st_writer_set_metadata(w, key, q->name, err);
        state_key(key, sizeof key, "param", i);
        if (st == HP_OK) st = hp_st_writer_add(w, key, HP_DT_F32, 1, &n, q->data, err);
        state_key(key, sizeof key, "adam_m", i);
        if (st == HP_OK) st = hp_st_writer_add(w, key, HP_DT_F32, 1, &zn, q->m, err);
        state_key(key, sizeof key, "adam_v", i);
        if (st == HP_OK) st = hp_st_writer_add(w, key, HP_DT_F32, 1, &zn, q->v, err);
    }
    if (st == HP_OK) st = hp_st_writer_write(w, path, err);
    hp_st_writer_destroy(w);
    return hp_comm_agree(r->pipe.all, st, err);
}

/* Copies tensor key of f (n f32 values) into dst; a missing or other-sized tensor is the folder's error. */
static hp_status state_read(const hp_st_file *f, const char *key, const char *what, float *dst, int64_t n,
                            const char *path, hp_err *err)
{
    const hp_st_tensor *t = hp_st_find(f, key);
    if (!t || t->dtype != HP_DT_F32 || t->n_elems != n)
        return hp_err_set(err, HP_ERR_INPUT, "%s: %s of '%s' is %s where %lld f32 values are needed (a training "
                          "state of another model, plan or mesh)", path, key, what, t ? "another size" : "missing",
                          (long long)n);
    return hp_st_read(f, t, 0, dst, (size_t)n * sizeof *dst, err);
}

/* A restored entry's values must be finite, and its second moment >= 0: a state file holding anything else was
 * not written by a step hyperpar took (AdamW never stores one), and training on from it would fail later with a
 * message about the gradients. The file and the tensor are named. */
static hp_status state_check(const tparam *q, int i, const char *path, hp_err *err)
{
    const float *arr[3] = {q->data, q->m, q->v};
    const char *kind[3] = {"param", "adam_m", "adam_v"};
    int64_t len[3] = {q->n, q->zn, q->zn};
    for (int a = 0; a < 3; a++)
        for (int64_t k = 0; k < len[a]; k++)
            if (!isfinite(arr[a][k]) || (a == 2 && arr[a][k] < 0))
                return hp_err_set(err, HP_ERR_INPUT, "%s: %s.%d of '%s' holds %g at element %lld, where %s; the file "
                                  "is damaged or not a training state hyperpar wrote: resume from an earlier "
                                  "checkpoint", path, kind[a], i, q->name, (double)arr[a][k], (long long)k,
                                  a == 2 ? "AdamW's second moment is finite and >= 0" : "every value is finite");
    return HP_OK;
}

hp_status hp_runner_load_train(hp_runner *r, const char *dir, hp_err *err)
{
    hp_status st = hp_comm_agree(r->pipe.all, train_init(r, err), err);
    if (st != HP_OK) return st;
    hp__train *t = r->train;
    char path[4200], key[64];
    snprintf(path, sizeof path, "%s/rank-%d.safetensors", dir, hp_comm_rank(r->pipe.all));
    hp_st_file *f = NULL;
    st = hp_st_open(&f, path, err);
    const char *step = f ? hp_st_metadata_get(f, "step") : NULL, *zero = f ? hp_st_metadata_get(f, "zero") : NULL;
    const char *world = f ? hp_st_metadata_get(f, "world") : NULL;
    long long wv = world ? atoll(world) : -1, sv = step ? atoll(step) : -1, zv = zero ? atoll(zero) : -1;
    if (st == HP_OK && (sv < 0 || (zv != 0 && zv != 1) || wv != hp_comm_size(r->pipe.all)))
        st = hp_err_set(err, HP_ERR_INPUT, "%s: not a training state of %d ranks (step %s, zero %s, world %s)", path,
                        hp_comm_size(r->pipe.all), step ? step : "?", zero ? zero : "?", world ? world : "?");
    if (st == HP_OK) st = state_rank_check(f, hp_comm_rank(r->pipe.all), path, err);
    const char *pp = f ? hp_st_metadata_get(f, "pp") : NULL; /* a state saved before pipelines: pp 1 */
    if (st == HP_OK && (pp ? atoll(pp) : 1) != r->pipe.pp)
        st = hp_err_set(err, HP_ERR_INPUT, "%s: a training state saved under pipeline parallelism pp=%s, where this "
                        "run has pp=%lld: each rank holds its stage's parameters, so resume with the same --pp "
                        "(hyperpar does not reshard a training state across pipelines)", path, pp ? pp : "1",
                        (long long)r->pipe.pp);
    if (st == HP_OK) {
        t->step = sv;
        t->zero = (int)zv;
        t->pending = 0;
        for (int i = 0; i < t->n; i++) { /* the moments are laid out again for the saved ZeRO stage */
            free(t->p[i].m), free(t->p[i].v);
            t->p[i].m = t->p[i].v = NULL;
            t->p[i].zc = NULL;
        }
        st = opt_state(r, err);
    }
    for (int i = 0; i < t->n && st == HP_OK; i++) {
        tparam *q = &t->p[i];
        state_key(key, sizeof key, "name", i);
        const char *nm = hp_st_metadata_get(f, key);
        if (!nm || strcmp(nm, q->name)) {
            st = hp_err_set(err, HP_ERR_INPUT, "%s: entry %d is '%s' where this run trains '%s' (a training state "
                            "of another model, plan or mesh)", path, i, nm ? nm : "missing", q->name);
            break;
        }
        state_key(key, sizeof key, "param", i);
        st = state_read(f, key, q->name, q->data, q->n, path, err);
        state_key(key, sizeof key, "adam_m", i);
        if (st == HP_OK) st = state_read(f, key, q->name, q->m, q->zn, path, err);
        state_key(key, sizeof key, "adam_v", i);
        if (st == HP_OK) st = state_read(f, key, q->name, q->v, q->zn, path, err);
        if (st == HP_OK) st = state_check(q, i, path, err);
        if (st == HP_OK) sync_copies(q);
    }
    hp_st_close(f);
    if ((st = hp_comm_agree(r->pipe.all, st, err)) != HP_OK) return st;
    state_bytes(r);
    hp__r_moe_release(r); /* as after a step */
    return hp_comm_agree(r->pipe.all, relink(r, err), err);
}

int64_t hp_runner_train_steps(const hp_runner *r)
{
    return r->train ? r->train->step : 0;
}

hp_status hp_runner_save_train(hp_runner *r, const char *dir, hp_err *err)
{
    return hp_runner_save_train_meta(r, dir, NULL, 0, err);
}
