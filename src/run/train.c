/*
 * train.c — the training step (docs/train.md): the backward of the program's steps in reverse, every
 * parameter's gradient summed over the ranks that saw other rows of it, and AdamW on each rank's slices.
 *
 * Gradients carry layouts like activations. The gradient of an activation laid out L is held in L with every
 * P read as R (the gradient of a partial sum is the whole sum's, on every rank); a computation's backward may
 * give its input's gradient as a partial sum (P on tp when tp cuts the module's heads or width; P on cp for
 * K and V, which every cp rank's queries read). Each forward transition F -> T then has one dual: the gradient
 * moves from T's gradient layout to F's by the same lowering table (S(d)->R all-gather becomes a slice or,
 * from a partial sum, a reduce-scatter; P->R all-reduce becomes the identity; P->S(d) reduce-scatter becomes an
 * all-gather; R->S(d) a slice becomes an all-gather). Nothing is decided per module.
 *
 * Memory: each layer's input is kept by the forward (keep_activations); its backward recomputes the layer's
 * forward from it through the runner's own steps (so the intermediates are the forward's, bit for bit) and
 * then walks the layer's steps in reverse.
 */
#include "kernels/backward.h"
#include "kernels/modules.h"
#include "run/runner_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The kinds of an MoE block's arrays: how their gradients are summed over the mesh (reduce_grads). */
typedef enum {
    K_DENSE,  /* a dense slice */
    K_EXPERT, /* routed experts: summed over the expert-data-parallel group */
    K_BDOWN,  /* gpt-oss's expert down bias: the same, but held by tp rank 0 alone when tp cuts the experts */
    K_ROUTER, /* the router, its bias, Qwen2-MoE's shared gate: whole on every rank */
    K_SHARED  /* the shared expert: whole, or cut over tp with the experts */
} tkind;

/* One trainable parameter slice of the rank: its values (what AdamW updates), its gradient and AdamW's moments,
 * and how its gradient is summed over the ranks. A dense slice is summed over each mesh axis whose ranks
 * computed it from other rows, once; an MoE block's routed experts over the ranks that hold the same experts
 * (the expert-data-parallel group), scaled by how often those ranks saw each row. */
typedef struct tparam {
    hp__w *w;        /* a dense slice, or NULL: an array of an MoE layer object */
    float *data;     /* what AdamW updates: w->d, the layer's f32 array, or the router's f32 master */
    double *wide;    /* the router's f64 copy the forward reads (rewritten after each update), or NULL */
    bool b16;        /* stored as bf16: data is its f32 master (what trains; what the forward reads, or in BF16
                        compute the bf16 copy w->d the products would round it to anyway) */
    bool own;        /* data is this entry's own array (the router's master, a bf16 slice's master) */
    int64_t n;
    int moe;         /* 1 + the index of its MoE block in t->moe; 0: dense */
    int slot;        /* an MoE array: which of the block's (add_moe's table: gate_up, down, b_gate_up, b_down,
                        router, b_router, shared gate_up, shared down, shared gate) */
    tkind kind;
    char name[200];  /* dense: the checkpoint's name */
    float *g, *m, *v;
    bool own_g;      /* g is this entry's (an MoE array's lives in its block's hp_moe_grads) */
    /* ZeRO-1: this rank's block [zlo, zlo + zn) of the optimizer state over zc (dp, or the expert-data-parallel
     * group for experts); zc NULL: the whole state */
    const hp_comm *zc;
    int64_t zlo, zn, zblk;
    bool sum_dp, sum_cp, sum_tp;
} tparam;

/* An MoE block of the rank in training: its gradients, and the expert-data-parallel group of its experts. */
typedef struct tmoe {
    int64_t layer;
    moe_w *m;
    hp_moe_grads *g;
    hp_comm *edp;    /* the ranks holding the same experts (and the same tp block when cut) */
    double escale;   /* 1 / how many times that group's EP groups saw each row */
} tmoe;

typedef struct hp__train {
    tparam *p;
    int n, cap;
    tmoe *moe;
    int n_moe;
    int64_t step; /* AdamW steps taken */
    int zero;     /* the ZeRO stage of the optimizer state (0 or 1), fixed at the first step */
    int pending;  /* micro-batches accumulated since the last apply */
    int64_t scored; /* the scored positions the step's loss is the mean over */
    double fwd_s, bwd_s, bwd_comm_s; /* summed over the step's micro-batches */
    float *mx;    /* the loss's per-row max and Σexp (hp__train_keep_loss) */
    double *se;
    int64_t rows, rows_cap;
    hp__act dh, dt, da, x, ta, h1, dk, dv; /* gradients and recomputed inputs */
    float *f[6];                           /* scratch blocks (4, 5: MLA's latent block and q_a's input, kept) */
    size_t fcap[6];
    bool grads; /* the gradients of a step are in p[].g */
} hp__train;

void hp_train_opts_default(hp_train_opts *o)
{
    *o = (hp_train_opts){.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 1e-2};
}

hp_status hp__train_keep_loss(hp__train *t, const float *mx, const double *se, int64_t rows, hp_err *err)
{
    if (rows + 1 > t->rows_cap) {
        float *a = realloc(t->mx, (size_t)(rows + 1) * sizeof *a);
        if (a) t->mx = a;
        double *b = a ? realloc(t->se, (size_t)(rows + 1) * sizeof *b) : NULL;
        if (!a || !b) return hp_err_set(err, HP_ERR_NOMEM, "out of memory for the loss's statistics");
        t->se = b;
        t->rows_cap = rows + 1;
    }
    memcpy(t->mx, mx, (size_t)rows * sizeof *mx);
    memcpy(t->se, se, (size_t)rows * sizeof *se);
    t->rows = rows;
    return HP_OK;
}

void hp__train_free(hp__train *t)
{
    if (!t) return;
    for (int i = 0; i < t->n; i++) {
        if (t->p[i].own_g) free(t->p[i].g);
        free(t->p[i].m), free(t->p[i].v);
        if (t->p[i].own) free(t->p[i].data);
    }
    free(t->p);
    for (int i = 0; i < t->n_moe; i++) {
        hp_moe_grads_free(t->moe[i].g);
        hp_comm_free(t->moe[i].edp);
    }
    free(t->moe);
    free(t->mx);
    free(t->se);
    hp__act *acts[] = {&t->dh, &t->dt, &t->da, &t->x, &t->ta, &t->h1, &t->dk, &t->dv};
    for (size_t i = 0; i < sizeof acts / sizeof *acts; i++) hp__act_free(acts[i]);
    for (int i = 0; i < 6; i++) free(t->f[i]);
    free(t);
}

/* Scratch block i of at least n floats, kept across steps. */
static float *fbuf(hp__train *t, int i, int64_t n, hp_err *err)
{
    size_t want = (size_t)(n > 0 ? n : 1);
    if (want > t->fcap[i]) {
        float *p = realloc(t->f[i], want * sizeof *p);
        if (!p) {
            hp_err_set(err, HP_ERR_NOMEM, "out of memory for %zu floats of the backward", want);
            return NULL;
        }
        t->f[i] = p;
        t->fcap[i] = want;
    }
    return t->f[i];
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

static float *grad_of(const hp_runner *r, const hp__w *w)
{
    return w->train_ix > 0 ? r->train->p[w->train_ix - 1].g : NULL;
}

/* A slice's values as the backward multiplies by them: f32 as held, or a bf16 slice's master (a bf16 slice is
 * held only in BF16 compute, whose products round the master to the bf16 copy's values). */
static const float *W32(const hp_runner *r, const hp__w *w)
{
    return w->dt == HP_DT_BF16 && w->train_ix > 0 ? r->train->p[w->train_ix - 1].data : w->d;
}

static tmoe *moe_of(const hp_runner *r, int64_t layer)
{
    for (int i = 0; i < r->train->n_moe; i++)
        if (r->train->moe[i].layer == layer) return &r->train->moe[i];
    return NULL;
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
    const hp__prog *g = &r->g;
    hp_status st = HP_OK;
    for (size_t i = 0; i < g->n_steps && st == HP_OK; i++) {
        const hp__step *s = &g->steps[i];
        layer_w *w = s->layer >= 0 ? &r->w.layers[s->layer] : NULL;
        const char *f = s->c.fqn;
        switch (s->op) {
        case HP__OP_EMBED: st = add_param(r, &r->w.embed, f, "weight", s, false, err); break;
        case HP__OP_NORM: {
            norm_w *n = !w ? &r->w.fnorm : s->keep ? &w->in : &w->post;
            st = add_param(r, &n->w, f, "weight", s, false, err);
            break;
        }
        case HP__OP_ATTN: {
            attn_w *a = &w->at;
            hp__w *v[] = {&a->wq, &a->bq, &a->wk, &a->bk, &a->wv, &a->bv, &a->wo, &a->bo, &a->qn, &a->kn, &a->sinks};
            const char *rel[] = {"q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias", "v_proj.weight",
                                 "v_proj.bias", "o_proj.weight", "o_proj.bias", "q_norm.weight", "k_norm.weight",
                                 "sinks"};
            for (size_t k = 0; k < sizeof v / sizeof *v && st == HP_OK; k++)
                st = add_param(r, v[k], f, rel[k], s, s->split && hp__is_tp_partial(s->op, rel[k]), err);
            break;
        }
        case HP__OP_MLP: {
            mlp_w *m = &w->mlp;
            hp__w *v[] = {&m->wgu, &m->bgu, &m->wg, &m->bg, &m->wu, &m->bu, &m->wd, &m->bd};
            const char *rel[] = {"gate_up_proj.weight", "gate_up_proj.bias", "gate_proj.weight", "gate_proj.bias",
                                 "up_proj.weight", "up_proj.bias", "down_proj.weight", "down_proj.bias"};
            for (size_t k = 0; k < sizeof v / sizeof *v && st == HP_OK; k++)
                st = add_param(r, v[k], f, rel[k], s, false, err);
            break;
        }
        case HP__OP_MLA: {
            attn_w *a = &w->at;
            bool ql = a->ql > 0;
            hp__w *v[] = {&a->wqa, &a->qan, &a->wq, &a->wkva, &a->kvan, &a->wkvb, &a->wo, &a->bo};
            const char *rel[] = {"q_a_proj.weight", "q_a_layernorm.weight", ql ? "q_b_proj.weight" : "q_proj.weight",
                                 "kv_a_proj_with_mqa.weight", "kv_a_layernorm.weight", "kv_b_proj.weight",
                                 "o_proj.weight", "o_proj.bias"};
            /* the latent projections and norms are whole on every tp rank but feed only its heads */
            for (size_t k = 0; k < sizeof v / sizeof *v && st == HP_OK; k++)
                st = add_param(r, v[k], f, rel[k], s, s->split && hp__is_tp_partial(s->op, rel[k]), err);
            break;
        }
        case HP__OP_MOE: st = add_moe(r, s, &w->moe, err); break;
        case HP__OP_HEAD:
            if (!g->tied) st = add_param(r, &r->w.head_w, f, "weight", s, false, err);
            break;
        default: break;
        }
    }
    if (st != HP_OK) {
        for (int i = 0; i < r->train->n; i++)
            if (r->train->p[i].w) r->train->p[i].w->train_ix = 0;
        hp__train_free(r->train);
        r->train = NULL;
    }
    return st;
}

/* ---- gradients and their layouts ---- */

/* The layout a gradient of an activation laid out l is held in: P read as R. */
static hp__lay glay(hp__lay l)
{
    for (int ax = 0; ax < HP__NAX; ax++)
        if (l.ax[ax].kind == HP_PL_P) l.ax[ax] = hp_pl_r();
    return l;
}

/* The dual of a forward transition into `to`: the gradient g, held as `from` (P: a partial sum), moved to the
 * gradient layout of the forward's source `to` by the lowering table. */
static hp_status dual(hp_runner *r, hp__act *g, hp__lay from, const hp__lay *to, const char *what, hp_err *err)
{
    g->lay = from; /* P and R hold the same block: only the meaning changes */
    hp__act_shape(&r->x, g);
    hp__lay want = glay(*to);
    const char *coll;
    return hp__redistribute(&r->x, g, &want, what, &coll, err);
}

/* An activation like a (global dims, layout), contents undefined. */
static hp_status like(hp_runner *r, hp__act *dst, const hp__act *a, int64_t X, hp__lay lay, hp_err *err)
{
    return hp__act_alloc(&r->x, dst, a->g[0], a->g[1], X, lay, err);
}

static void add_into(hp__act *dst, const hp__act *src)
{
    int64_t n = hp__act_count(dst);
    for (int64_t i = 0; i < n; i++) dst->d[i] += src->d[i];
}

/* dx = dy·W and dW += dyᵀ·x, db += Σ dy, with dx added into acc (the sum over several projections of x). */
static hp_status lin_bwd_add(const hp_runner *r, hp__train *t, int64_t rows, int64_t N, int64_t K, const float *dy, int64_t ldy,
                             const hp__w *W, float *gW, const hp__w *b, float *gb, const float *x, float *acc,
                             bool first, hp_err *err)
{
    float *dx = first ? acc : fbuf(t, 3, rows * K, err);
    if (!dx) return HP_ERR_NOMEM;
    hp_status st = hp__linear_backward(r->o.compute, rows, N, K, dy, ldy, W32(r, W), x, K, dx, K, gW,
                                       b && b->present ? gb : NULL, err);
    if (st != HP_OK) return st;
    if (!first)
        for (int64_t i = 0; i < rows * K; i++) acc[i] += dx[i];
    return HP_OK;
}

/* The normed input of a norm step: h moved to the layout the norm ran on (its entry, recomputed). */
static hp_status norm_input(hp_runner *r, const hp__step *s, const hp__act *h, hp__act *x, hp_err *err)
{
    hp_status st = hp__r_act_copy(r, x, h, err);
    return st == HP_OK ? hp__r_enter(r, s, x, err) : st;
}

/* A norm step's backward: dy (the gradient of its output, held as s->leave's gradient layout) becomes the
 * gradient of its input in the stream's layout, added into dh (add) or written there. */
static hp_status norm_bwd(hp_runner *r, const hp__step *s, norm_w *n, const hp__act *h, hp__act *dy, hp__act *dh,
                          bool add, hp_err *err)
{
    hp__train *t = r->train;
    char what[200];
    snprintf(what, sizeof what, "%s (backward of its exit)", s->c.fqn);
    hp_status st = dual(r, dy, glay(s->leave), &s->out, what, err);
    if (st == HP_OK) st = norm_input(r, s, h, &t->x, err);
    if (st != HP_OK) return st;
    int64_t rows = t->x.n[0] * t->x.n[1], H = r->g.cfg.H;
    hp__rmsnorm_backward(t->x.d, rows, H, n->w.d, r->g.cfg.eps, dy->d, dy->d, grad_of(r, &n->w));
    snprintf(what, sizeof what, "%s (backward of its entry)", s->c.fqn);
    if ((st = dual(r, dy, s->run, &s->in, what, err)) != HP_OK) return st;
    if (add) add_into(dh, dy);
    else st = hp__r_act_copy(r, dh, dy, err);
    return st;
}

/* The attention core's backward shared by GQA and MLA: aa is the forward's call on the runner's K and V (q, k, v
 * set); dK and dV of every key this rank's queries saw come out in t->dk / t->dv, brought back to the keys' own
 * block by the reduce-scatter that is CP's K/V all-gather's dual. */
static hp_status attn_core_bwd(hp_runner *r, const hp__step *s, const hp__attn_args *aa, const hp__act *ta,
                               const float *d_o, float *dq, float *dsinks, hp_err *err)
{
    hp__train *t = r->train;
    const hp__act *K = &r->sc.k, *V = &r->sc.v;
    hp_status st = hp__act_alloc(&r->x, &t->dk, K->g[0], K->g[1], K->g[2], K->lay, err);
    if (st == HP_OK) st = hp__act_alloc(&r->x, &t->dv, V->g[0], V->g[1], V->g[2], V->lay, err);
    if (st == HP_OK) st = hp__attention_backward(aa, d_o, dq, t->dk.d, t->dv.d, dsinks, err);
    hp__lay kl = {{hp_pl_r(), ta->lay.ax[HP__CP]}};
    if (st != HP_OK || kl.ax[HP__CP].kind != HP_PL_S) return st;
    char what[200];
    snprintf(what, sizeof what, "%s (backward of the cp K/V all-gather)", s->c.fqn);
    hp__lay part = {{hp_pl_r(), hp_pl_p()}};
    if ((st = dual(r, &t->dk, part, &kl, what, err)) != HP_OK) return st;
    return dual(r, &t->dv, part, &kl, what, err);
}

/* Attention's backward (GQA): da the gradient of its output (G(out)), ta its input on the run layout; the
 * forward's q (after rope), output, K and V are in the runner's buffers (recomputed). dt receives the input's
 * gradient: a partial sum over tp when tp cuts the heads. */
static hp_status attn_bwd(hp_runner *r, const hp__step *s, attn_w *a, const hp__act *ta, const hp__act *da,
                          hp__act *dt, hp_err *err)
{
    hp__train *t = r->train;
    const hp__rcfg *c = &r->g.cfg;
    int64_t Bl = ta->n[0], sq = ta->n[1], rows = Bl * sq, H = c->H, hd = c->hd, nh = a->nh, nkv = a->nkv;
    const float *q = r->sc.buf[0], *o = r->sc.buf[1];
    hp__act *K = &r->sc.k, *V = &r->sc.v;
    float *d_o = fbuf(t, 0, rows * nh * hd, err), *dq = d_o ? fbuf(t, 1, rows * nh * hd, err) : NULL;
    if (!dq) return HP_ERR_NOMEM;
    /* o_proj */
    hp_status st = hp__linear_backward(r->o.compute, rows, H, nh * hd, da->d, H, W32(r, &a->wo), o, nh * hd, d_o,
                                       nh * hd, grad_of(r, &a->wo), a->bo.present ? grad_of(r, &a->bo) : NULL, err);
    if (st != HP_OK) return st;
    /* the attention itself */
    hp__attn_args aa = {.B = Bl, .sq = sq, .sk = K->n[1], .nh = nh, .nkv = nkv, .hd = hd, .q = q, .k = K->d,
                        .v = V->d, .q_pos0 = ta->lo[1], .k_pos0 = K->lo[1], .window = c->window[s->layer],
                        .out = NULL, .sinks = a->sinks.present ? a->sinks.d : NULL, .mode = r->o.compute};
    st = attn_core_bwd(r, s, &aa, ta, d_o, dq, a->sinks.present ? grad_of(r, &a->sinks) : NULL, err);
    if (st != HP_OK) return st;
    /* rope (the tables of these positions are the forward's, rebuilt by its recompute) */
    if ((st = hp__r_rope(r, ta->lo[1], sq, err)) != HP_OK) return st;
    for (int64_t b = 0; b < Bl; b++) {
        hp__rope_backward(dq + b * sq * nh * hd, sq, nh, hd, c->rot, r->sc.rope_cos, r->sc.rope_sin);
        hp__rope_backward(t->dk.d + b * sq * nkv * hd, sq, nkv, hd, c->rot, r->sc.rope_cos, r->sc.rope_sin);
    }
    /* q/k norms: their inputs are the projections, recomputed */
    if (a->qn.present || a->kn.present) {
        float *pre = fbuf(t, 2, rows * nh * hd, err);
        if (!pre) return HP_ERR_NOMEM;
        if (a->qn.present) {
            if ((st = hp_linear_forward(a->q, 0, rows, ta->d, H, pre, nh * hd, false, err)) != HP_OK) return st;
            hp__rmsnorm_backward(pre, rows * nh, hd, a->qn.d, c->eps, dq, dq, grad_of(r, &a->qn));
        }
        if (a->kn.present) {
            if ((st = hp_linear_forward(a->k, 0, rows, ta->d, H, pre, nkv * hd, false, err)) != HP_OK) return st;
            hp__rmsnorm_backward(pre, rows * nkv, hd, a->kn.d, c->eps, t->dk.d, t->dk.d, grad_of(r, &a->kn));
        }
    }
    /* the projections: dt = dq·Wq + dk·Wk + dv·Wv */
    if ((st = like(r, dt, ta, H, (hp__lay){{s->split ? hp_pl_p() : hp_pl_r(), ta->lay.ax[HP__CP]}}, err)) != HP_OK)
        return st;
    st = lin_bwd_add(r, t, rows, nh * hd, H, dq, nh * hd, &a->wq, grad_of(r, &a->wq), &a->bq, grad_of(r, &a->bq), ta->d,
                     dt->d, true, err);
    if (st == HP_OK)
        st = lin_bwd_add(r, t, rows, nkv * hd, H, t->dk.d, nkv * hd, &a->wk, grad_of(r, &a->wk), &a->bk,
                         grad_of(r, &a->bk), ta->d, dt->d, false, err);
    if (st == HP_OK)
        st = lin_bwd_add(r, t, rows, nkv * hd, H, t->dv.d, nkv * hd, &a->wv, grad_of(r, &a->wv), &a->bv,
                         grad_of(r, &a->bv), ta->d, dt->d, false, err);
    return st;
}

/* DeepSeek-V3's latent attention backward (the forward is runner.c's mla_apply): da the gradient of its output,
 * ta its input on the run layout; q (after rope) in buffer 0, the attention output in buffer 1, K and V in
 * sc.k / sc.v, and the latent block (kv_a's output with k_rot rotated, q_a's normed output, the normed latent,
 * kv_b's output) kept in scratch 4. dt receives the input's gradient (a partial sum over tp when tp cuts the
 * heads; the latent projections' gradients are then partial too, and summed over tp). */
static hp_status mla_bwd(hp_runner *r, const hp__step *s, attn_w *a, const hp__act *ta, const hp__act *da,
                         hp__act *dt, hp_err *err)
{
    hp__train *t = r->train;
    const hp__rcfg *c = &r->g.cfg;
    int64_t Bl = ta->n[0], sq = ta->n[1], rows = Bl * sq, H = c->H, nh = a->nh;
    int64_t nope = a->nope, rope = a->rope, vd = a->vd, qk = nope + rope, kvl = a->kvl, lat = kvl + rope;
    int64_t qa_n = a->ql > 0 ? a->ql : 0;
    const float *q = r->sc.buf[0], *o = r->sc.buf[1], *tmp = t->f[4];
    const float *kva = tmp, *qa = kva + rows * lat, *ckv = qa + rows * qa_n;
    hp__act *K = &r->sc.k, *V = &r->sc.v;
    float *d_o = fbuf(t, 0, rows * nh * vd, err), *dq = d_o ? fbuf(t, 1, rows * nh * qk, err) : NULL;
    float *dlat = dq ? fbuf(t, 2, rows * (lat + qa_n + nh * (nope + vd)), err) : NULL;
    if (!dlat) return HP_ERR_NOMEM;
    float *dkva = dlat, *dqa = dkva + rows * lat, *dkv = dqa + rows * qa_n;
    hp_status st = hp__linear_backward(r->o.compute, rows, H, nh * vd, da->d, H, W32(r, &a->wo), o, nh * vd, d_o,
                                       nh * vd, grad_of(r, &a->wo), a->bo.present ? grad_of(r, &a->bo) : NULL, err);
    if (st != HP_OK) return st;
    hp__attn_args aa = {.B = Bl, .sq = sq, .sk = K->n[1], .nh = nh, .nkv = nh, .hd = qk, .hdv = vd,
                        .scale = hp__mla_scale(c, qk), .q = q, .k = K->d, .v = V->d, .q_pos0 = ta->lo[1],
                        .k_pos0 = K->lo[1], .window = c->window[s->layer], .mode = r->o.compute};
    st = attn_core_bwd(r, s, &aa, ta, d_o, dq, NULL, err);
    if (st != HP_OK) return st;
    /* K = [k_nope | k_rot broadcast to every head], V: back into kv_b's output and kv_a's rope channels */
    memset(dkva, 0, (size_t)(rows * lat) * sizeof *dkva);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t h = 0; h < nh; h++) {
            const float *dk = t->dk.d + (i * nh + h) * qk;
            float *dst = dkv + (i * nh + h) * (nope + vd);
            memcpy(dst, dk, (size_t)nope * sizeof *dst);
            memcpy(dst + nope, t->dv.d + (i * nh + h) * vd, (size_t)vd * sizeof *dst);
            for (int64_t j = 0; j < rope; j++) dkva[i * lat + kvl + j] += dk[nope + j];
        }
    if ((st = hp__r_rope(r, ta->lo[1], sq, err)) != HP_OK) return st;
    for (int64_t b = 0; b < Bl; b++) {
        float *kr = dkva + b * sq * lat + kvl, *qb = dq + b * sq * nh * qk;
        if (c->interleave) {
            hp__rope_backward_pairs(kr, sq, 1, lat, 0, rope, r->sc.rope_cos, r->sc.rope_sin);
            hp__rope_backward_pairs(qb, sq, nh, qk, nope, rope, r->sc.rope_cos, r->sc.rope_sin);
        } else {
            hp__rope_backward_at(kr, sq, 1, lat, 0, rope, r->sc.rope_cos, r->sc.rope_sin);
            hp__rope_backward_at(qb, sq, nh, qk, nope, rope, r->sc.rope_cos, r->sc.rope_sin);
        }
    }
    /* kv_b, then the latent's norm (its input: kv_a's first kvl channels, as the forward left them) */
    float *dckv = fbuf(t, 3, rows * kvl, err);
    if (!dckv) return HP_ERR_NOMEM;
    st = hp__linear_backward(r->o.compute, rows, nh * (nope + vd), kvl, dkv, nh * (nope + vd), W32(r, &a->wkvb), ckv,
                             kvl, dckv, kvl, grad_of(r, &a->wkvb), NULL, err);
    if (st != HP_OK) return st;
    float *pre = fbuf(t, 5, rows * (kvl > qa_n ? kvl : qa_n), err);
    if (!pre) return HP_ERR_NOMEM;
    for (int64_t i = 0; i < rows; i++) memcpy(pre + i * kvl, kva + i * lat, (size_t)kvl * sizeof *pre);
    hp__rmsnorm_backward(pre, rows, kvl, a->kvan.d, 1e-6, dckv, dckv, grad_of(r, &a->kvan)); /* in place */
    for (int64_t i = 0; i < rows; i++) memcpy(dkva + i * lat, dckv + i * kvl, (size_t)kvl * sizeof *dkva);
    /* dt = dkva·W_kva + (q's path) */
    if ((st = like(r, dt, ta, H, (hp__lay){{s->split ? hp_pl_p() : hp_pl_r(), ta->lay.ax[HP__CP]}}, err)) != HP_OK)
        return st;
    st = lin_bwd_add(r, t, rows, lat, H, dkva, lat, &a->wkva, grad_of(r, &a->wkva), NULL, NULL, ta->d, dt->d, true,
                     err);
    if (st != HP_OK || a->ql <= 0)
        return st == HP_OK ? lin_bwd_add(r, t, rows, nh * qk, H, dq, nh * qk, &a->wq, grad_of(r, &a->wq), NULL, NULL,
                                         ta->d, dt->d, false, err)
                           : st;
    st = hp__linear_backward(r->o.compute, rows, nh * qk, a->ql, dq, nh * qk, W32(r, &a->wq), qa, a->ql, dqa, a->ql,
                             grad_of(r, &a->wq), NULL, err);
    if (st != HP_OK) return st;
    /* q_a's norm: its input recomputed */
    if ((st = hp_linear_forward(a->qa, 0, rows, ta->d, H, pre, a->ql, false, err)) != HP_OK) return st;
    hp__rmsnorm_backward(pre, rows, a->ql, a->qan.d, 1e-6, dqa, dqa, grad_of(r, &a->qan));
    return lin_bwd_add(r, t, rows, a->ql, H, dqa, a->ql, &a->wqa, grad_of(r, &a->wqa), NULL, NULL, ta->d, dt->d, false,
                       err);
}

/* The MLP's backward: tm its input on the run layout (the runner's t after the recompute), gate|up in buffer 2
 * and the hidden in buffer 3; dt receives the input's gradient (a partial sum over tp when tp cuts the width). */
static hp_status mlp_bwd(hp_runner *r, const hp__step *s, mlp_w *m, const hp__act *tm, const hp__act *da,
                         hp__act *dt, hp_err *err)
{
    hp__train *t = r->train;
    int64_t rows = tm->n[0] * tm->n[1], H = r->g.cfg.H, I = m->I;
    const float *gu = r->sc.buf[2], *hid = r->sc.buf[3];
    float *dhid = fbuf(t, 0, rows * I, err), *dgu = dhid ? fbuf(t, 1, rows * 2 * I, err) : NULL;
    if (!dgu) return HP_ERR_NOMEM;
    hp_status st = hp__linear_backward(r->o.compute, rows, H, I, da->d, H, W32(r, &m->wd), hid, I, dhid, I,
                                       grad_of(r, &m->wd), m->bd.present ? grad_of(r, &m->bd) : NULL, err);
    if (st != HP_OK) return st;
    hp__swiglu_backward(gu, 2 * I, gu + I, 2 * I, dhid, I, rows, I, dgu, 2 * I, dgu + I, 2 * I);
    st = like(r, dt, tm, H, (hp__lay){{s->split ? hp_pl_p() : hp_pl_r(), tm->lay.ax[HP__CP]}}, err);
    if (st != HP_OK) return st;
    if (s->fused)
        return lin_bwd_add(r, t, rows, 2 * I, H, dgu, 2 * I, &m->wgu, grad_of(r, &m->wgu), &m->bgu, grad_of(r, &m->bgu),
                           tm->d, dt->d, true, err);
    st = lin_bwd_add(r, t, rows, I, H, dgu, 2 * I, &m->wg, grad_of(r, &m->wg), &m->bg, grad_of(r, &m->bg), tm->d, dt->d,
                     true, err);
    if (st == HP_OK)
        st = lin_bwd_add(r, t, rows, I, H, dgu + I, 2 * I, &m->wu, grad_of(r, &m->wu), &m->bu, grad_of(r, &m->bu), tm->d,
                         dt->d, false, err);
    return st;
}

/* The MoE block's backward: the EP runtime's reverse of its last forward (recomputed on these rows). dt receives
 * the input's gradient on the block's rows: a partial sum over tp when tp cuts the experts. */
static hp_status moe_bwd(hp_runner *r, const hp__step *s, moe_w *m, const hp__act *tm, const hp__act *da,
                         hp__act *dt, hp_err *err)
{
    tmoe *b = moe_of(r, s->layer);
    if (!b) return hp_err_set(err, HP_ERR_INPUT, "internal error: %s has no training state", s->c.fqn);
    hp__lay lay = tm->lay;
    if (m->tp_cut) lay.ax[HP__TP] = hp_pl_p();
    hp_status st = like(r, dt, tm, r->g.cfg.H, lay, err);
    if (st == HP_OK) st = hp_moe_ep_backward(m->ep, tm->d, tm->n[0] * tm->n[1], da->d, dt->d, b->g, err);
    return hp_comm_agree(r->x.world, st, err); /* the next collectives mix the EP groups */
}

/* A module step's backward between its boundaries: the gradient of the stream dh (G(stream)) through the
 * residual's and the exit's duals to the output, the module's backward, and its entry's dual. */
static hp_status module_bwd(hp_runner *r, const hp__step *s, layer_w *w, const hp__act *tin, hp_err *err)
{
    hp__train *t = r->train;
    char what[200];
    snprintf(what, sizeof what, "the residual add after %s (backward)", s->c.fqn);
    hp_status st = hp__r_act_copy(r, &t->da, &t->dh, err);
    if (st == HP_OK) st = dual(r, &t->da, r->g.stream, &s->leave, what, err);
    snprintf(what, sizeof what, "%s (backward of its exit)", s->c.fqn);
    if (st == HP_OK) st = dual(r, &t->da, glay(s->leave), &s->out, what, err);
    if (st != HP_OK) return st;
    st = s->op == HP__OP_MLP   ? mlp_bwd(r, s, &w->mlp, tin, &t->da, &t->dt, err)
         : s->op == HP__OP_MOE ? moe_bwd(r, s, &w->moe, tin, &t->da, &t->dt, err)
         : s->op == HP__OP_MLA ? mla_bwd(r, s, &w->at, tin, &t->da, &t->dt, err)
                               : attn_bwd(r, s, &w->at, tin, &t->da, &t->dt, err);
    snprintf(what, sizeof what, "%s (backward of its entry)", s->c.fqn);
    return st == HP_OK ? dual(r, &t->dt, t->dt.lay, &s->in, what, err) : st;
}

/* A gradient for validate --backward's tape (named "<what> (gradient)"), the recompute's records being off. */
static hp_status grad_record(hp_runner *r, const char *what, const char *coll, hp__act *g, hp_err *err)
{
    char name[200];
    snprintf(name, sizeof name, "%s (gradient)", what);
    r->tr.quiet = false;
    hp_status st = hp__r_record(r, name, coll, g, err);
    r->tr.quiet = true;
    return st;
}

/* Layer l's backward: its forward recomputed from the kept input, then its steps in reverse; t->dh holds the
 * gradient of its output on entry and of its input on return. */
static hp_status layer_bwd(hp_runner *r, const hp__step *ls, hp_err *err)
{
    hp__train *t = r->train;
    int64_t l = ls[0].layer;
    layer_w *w = &r->w.layers[l];
    const hp__act *h0 = &r->sc.kept[l];
    hp__act *tt = &r->sc.t, *a = &r->sc.a;
    /* recompute */
    hp_status st = hp__r_norm(r, &w->in, h0, tt, err);
    if (st == HP_OK) st = hp__r_attn(r, l, &w->at, tt, a, err);
    if (st == HP_OK) st = hp__r_act_copy(r, &t->ta, tt, err);
    if (st == HP_OK && ls[1].op == HP__OP_MLA) { /* its latent block, before the MLP reuses the buffer */
        int64_t bw[HP__NBUF], rows = t->ta.n[0] * t->ta.n[1];
        hp__step_row_widths(&r->g, &ls[1], r->x.pos.r[HP__TP], bw);
        float *keep = fbuf(t, 4, rows * bw[2], err);
        if (!keep) st = HP_ERR_NOMEM;
        else memcpy(keep, r->sc.buf[2], (size_t)(rows * bw[2]) * sizeof *keep);
    }
    if (st == HP_OK) st = hp__r_act_copy(r, &t->h1, h0, err);
    if (st == HP_OK) st = hp__r_residual(r, &ls[2], &t->h1, a, err);
    if (st == HP_OK) st = hp__r_norm(r, &w->post, &t->h1, tt, err);
    if (st == HP_OK)
        st = ls[4].op == HP__OP_MOE ? hp__r_moe(r, &w->moe, tt, a, r->sc.moe_rows, err) : hp__r_mlp(r, &w->mlp, tt, a, err);
    /* the feed-forward half, then the attention half: each module's input gradient and the stream's recorded */
    if (st == HP_OK) st = module_bwd(r, &ls[4], w, tt, err);
    if (st == HP_OK) st = grad_record(r, ls[4].c.fqn, "dual of its entry", &t->dt, err);
    if (st == HP_OK) st = norm_bwd(r, &ls[3], &w->post, &t->h1, &t->dt, &t->dh, true, err);
    if (st == HP_OK) st = grad_record(r, ls[3].c.fqn, "+ residual", &t->dh, err);
    if (st == HP_OK) st = module_bwd(r, &ls[1], w, &t->ta, err);
    if (st == HP_OK) st = grad_record(r, ls[1].c.fqn, "dual of its entry", &t->dt, err);
    if (st == HP_OK) st = norm_bwd(r, &ls[0], &w->in, h0, &t->dt, &t->dh, true, err);
    if (st == HP_OK) st = grad_record(r, ls[0].c.fqn, "+ residual", &t->dh, err);
    return st;
}

/* The loss and the head: dz = (softmax − onehot) / scored positions on the logits' block, through the head's
 * exit, its linear and its entry; then the final norm. t->dh receives the gradient of the stream. */
static hp_status head_bwd(hp_runner *r, const hp__step *fn, const hp__step *hs, const int64_t *ids, int64_t S,
                          hp_err *err)
{
    hp__train *t = r->train;
    const hp__act *z = &r->sc.a, *th = &r->sc.t;
    int64_t rows = z->n[0] * z->n[1], vn = z->n[2], vlo = z->lo[2], H = r->g.cfg.H;
    int64_t dp_lo = r->x.dp_rows[r->x.dp_r], scored = t->scored;
    if (rows != t->rows)
        return hp_err_set(err, HP_ERR_INPUT, "internal error: the loss kept %lld rows where the logits hold %lld",
                          (long long)t->rows, (long long)rows);
    int64_t *lab = hp_calloc((size_t)rows + 1, sizeof *lab);
    if (!lab) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < rows; i++) {
        int64_t b = i / z->n[1], p = z->lo[1] + i % z->n[1];
        lab[i] = p + 1 < S ? ids[(dp_lo + z->lo[0] + b) * S + p + 1] : -1;
    }
    hp_status st = hp__act_alloc(&r->x, &t->da, z->g[0], z->g[1], z->g[2], z->lay, err);
    if (st == HP_OK)
        hp__xent_backward(z->d, vn, rows, vn, vlo, t->mx, t->se, lab, scored > 0 ? 1.0 / (double)scored : 0.0,
                          t->da.d, vn);
    free(lab);
    char what[200];
    snprintf(what, sizeof what, "%s (backward of its exit)", hs->c.fqn);
    if (st == HP_OK) st = dual(r, &t->da, glay(hs->leave), &hs->out, what, err);
    if (st != HP_OK) return st;
    hp__w *W = r->g.tied ? &r->w.embed : &r->w.head_w;
    if ((st = like(r, &t->dt, th, H, (hp__lay){{hs->split ? hp_pl_p() : hp_pl_r(), th->lay.ax[HP__CP]}}, err)) !=
        HP_OK)
        return st;
    int64_t vl = t->da.n[2]; /* the rank's vocabulary block, as the head computed it */
    if ((st = hp__linear_backward(r->o.compute, rows, vl, H, t->da.d, vl, W32(r, W), th->d, H, t->dt.d, H,
                                  grad_of(r, W), NULL, err)) != HP_OK)
        return st;
    snprintf(what, sizeof what, "%s (backward of its entry)", hs->c.fqn);
    if ((st = dual(r, &t->dt, t->dt.lay, &hs->in, what, err)) != HP_OK) return st;
    return norm_bwd(r, fn, &r->w.fnorm, &r->sc.kept[r->g.cfg.L], &t->dt, &t->dh, false, err);
}

/* The embedding: the stream's gradient through its exit's dual, added into the rank's vocabulary rows. */
static hp_status embed_bwd(hp_runner *r, const hp__step *s, const int64_t *ids, int64_t S, hp_err *err)
{
    hp__train *t = r->train;
    char what[200];
    snprintf(what, sizeof what, "%s (backward of its exit)", s->c.fqn);
    hp_status st = dual(r, &t->dh, r->g.stream, &s->out, what, err);
    if (st != HP_OK) return st;
    const hp__act *d = &t->dh;
    int64_t n = d->n[0] * d->n[1], dp_lo = r->x.dp_rows[r->x.dp_r];
    int64_t *id = hp_calloc((size_t)n + 1, sizeof *id);
    if (!id) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    /* The padding token's row gets no gradient from the embedding, as transformers' nn.Embedding(padding_idx =
     * pad_token_id) of every family gives it none (a tied lm_head still adds its own). */
    const int64_t pad = r->m->cfg.pad_token_id;
    for (int64_t i = 0; i < n; i++) {
        int64_t b = i / d->n[1], p = d->lo[1] + i % d->n[1];
        id[i] = p < S ? ids[(dp_lo + d->lo[0] + b) * S + p] : -1; /* a padded position (CP) reads no row */
        if (id[i] == pad) id[i] = -1;
    }
    const hp__w *E = &r->w.embed;
    float *gE = grad_of(r, E);
    if (gE) hp__embedding_backward(id, n, d->d, r->g.cfg.H, E->lo[0], E->shape[0], gE);
    free(id);
    return HP_OK;
}

/* Every parameter's gradient summed over the ranks that computed it from other rows, once per axis. */
static hp_status reduce_grads(hp_runner *r, hp_err *err)
{
    hp__train *t = r->train;
    hp_status st = HP_OK;
    for (int i = 0; i < t->n && st == HP_OK; i++) {
        tparam *q = &t->p[i];
        size_t n = (size_t)q->n;
        if (q->kind == K_EXPERT || q->kind == K_BDOWN) {
            const tmoe *b = &t->moe[q->moe - 1];
            if (q->kind == K_BDOWN && b->m->tp_cut && r->x.pos.r[HP__TP] != 0)
                memset(q->g, 0, n * sizeof *q->g); /* tp rank 0 holds the bias; the others keep zeros */
            if (hp_comm_size(b->edp) > 1) st = hp__allreduce(&r->x, b->edp, q->g, n, err);
            if (b->escale != 1.0)
                for (size_t k = 0; k < n; k++) q->g[k] = (float)(q->g[k] * b->escale);
        }
        if (q->sum_tp) st = hp__allreduce(&r->x, r->x.axc[HP__TP], q->g, n, err);
        if (st == HP_OK && q->sum_cp) st = hp__allreduce(&r->x, r->x.axc[HP__CP], q->g, n, err);
        if (st == HP_OK && q->sum_dp) st = hp__allreduce(&r->x, r->x.dp_c, q->g, n, err);
        if (r->o.test_perturb_grad && !strcmp(r->o.test_perturb_grad, q->name) && hp_comm_size(r->x.world) > 1)
            q->g[0] += 1e-2f * (1.0f + fabsf(q->g[0]));
        if (r->o.test_nan_grad && !strcmp(r->o.test_nan_grad, q->name) && q->n > 0) q->g[q->n - 1] = NAN;
    }
    return st;
}

/* The linears read their weights (and copy their biases) when made: after an update they are made again. */
static hp_status relink(hp_runner *r, hp_err *err)
{
    hp_status st = HP_OK;
    for (int64_t l = 0; l < r->g.cfg.L && st == HP_OK; l++) {
        layer_w *w = &r->w.layers[l];
        if (!w->sparse) {
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
        attn_w *a = &w->at;
        if (st != HP_OK) continue;
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
    if (st == HP_OK) {
        hp_linear_free(r->w.head);
        r->w.head = NULL;
        hp__w hw = r->g.tied ? r->w.embed : r->w.head_w;
        st = hp__r_linear(r, &hw, NULL, &r->w.head, err);
    }
    return st;
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
        q->m = hp_calloc((size_t)q->zn + 1, sizeof *q->m);
        q->v = hp_calloc((size_t)q->zn + 1, sizeof *q->v);
        if (!q->m || !q->v) return hp_err_set(err, HP_ERR_NOMEM, "out of memory for the optimizer state");
    }
    return HP_OK;
}

/* The training state's bytes into the statistics (hp_run_stats.train_*_bytes). */
static void state_bytes(hp_runner *r)
{
    const hp__train *t = r->train;
    hp_run_stats *rs = &r->tr.stats;
    uint64_t g = 0, o = 0, ms = 0, sv = 0;
    for (int i = 0; i < t->n; i++) {
        const tparam *q = &t->p[i];
        uint64_t n = (uint64_t)q->n * sizeof(float);
        g += n;
        o += q->m ? 2 * (uint64_t)q->zn * sizeof(float) : 0;
        ms += q->b16 || q->wide ? n : 0;
    }
    for (int64_t l = 0; r->sc.kept && l <= r->g.cfg.L; l++) sv += (uint64_t)hp__act_count(&r->sc.kept[l]) * sizeof(float);
    rs->train_grad_bytes = g, rs->train_optim_bytes = o, rs->train_master_bytes = ms, rs->train_saved_bytes = sv;
}

/* ZeRO-1: AdamW on this rank's block, then the updated blocks all-gathered over the group. */
static hp_status zero_step(hp_runner *r, tparam *q, const hp__adamw *ao, hp_err *err)
{
    int64_t P = hp_comm_size(q->zc);
    hp__adamw_step(q->data + q->zlo, q->g + q->zlo, q->m, q->v, q->zn, ao, r->train->step);
    float *send = hp_calloc((size_t)q->zblk + 1, sizeof *send), *all = hp_calloc((size_t)(P * q->zblk) + 1, sizeof *all);
    hp_status st = send && all ? HP_OK : hp_err_set(err, HP_ERR_NOMEM, "out of memory for ZeRO's all-gather");
    if (st == HP_OK) {
        memcpy(send, q->data + q->zlo, (size_t)q->zn * sizeof *send);
        st = hp_comm_allgather(q->zc, send, (size_t)q->zblk * sizeof *send, all, err);
    }
    if (st == HP_OK) memcpy(q->data, all, (size_t)q->n * sizeof *all);
    free(send);
    free(all);
    return st;
}

hp_status hp_runner_accumulate(hp_runner *r, const int64_t *ids, int64_t B, int64_t S, int64_t n_scored,
                               double *loss, hp_err *err)
{
    hp_status st = hp_comm_agree(r->x.world, train_init(r, err), err);
    if (st != HP_OK) return st;
    hp__train *t = r->train;
    if (!t->pending) { /* the step's first micro-batch */
        t->grads = false;
        for (int i = 0; i < t->n; i++) memset(t->p[i].g, 0, (size_t)t->p[i].n * sizeof *t->p[i].g);
        t->fwd_s = t->bwd_s = t->bwd_comm_s = 0;
    }
    hp_run_output out;
    double t0 = hp_comm_wtime();
    if ((st = hp_runner_forward(r, ids, B, S, &out, err)) != HP_OK) return st;
    double t1 = hp_comm_wtime(), c1 = r->x.st.comm_s;
    *loss = out.loss;
    hp_run_output_free(&out);
    t->scored = n_scored > 0 ? n_scored : B * (S - 1);
    const hp__prog *g = &r->g;
    const hp__step *steps = g->steps;
    size_t n = g->n_steps; /* ... final norm, head, loss */
    r->tr.quiet = true; /* the layers' recomputed forwards are not recorded again */
    st = head_bwd(r, &steps[n - 3], &steps[n - 2], ids, S, err);
    if (st == HP_OK) st = grad_record(r, steps[n - 3].c.fqn, "dual of its entry", &t->dh, err);
    for (int64_t l = g->cfg.L - 1; st == HP_OK && l >= 0; l--) st = layer_bwd(r, &steps[1 + 6 * l], err);
    if (st == HP_OK) st = embed_bwd(r, &steps[0], ids, S, err);
    r->tr.quiet = false;
    st = hp_comm_agree(r->x.world, st, err);
    if (st != HP_OK) return st;
    t->pending++;
    t->fwd_s += t1 - t0;
    t->bwd_s += hp_comm_wtime() - t1;
    t->bwd_comm_s += r->x.st.comm_s - c1;
    return HP_OK;
}

/* The global gradient norm, every element counted once: each rank's sum of squares weighted by 1 / the ranks that
 * hold the same (already summed) slice, added over the world. */
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
        sum += s2 / holders;
    }
    hp_status st = hp_comm_allreduce_sum_f64(r->x.world, &sum, 1, err);
    *norm = sqrt(sum);
    return st;
}

/* What the forward reads of an entry after its values changed: the router's f64 copy, a bf16 slice's copy (the
 * master rounded to nearest even). */
static void sync_copies(tparam *q)
{
    bool r16 = q->w && q->w->dt == HP_DT_BF16;
    if (!r16 && !q->wide) return;
    /* element-wise, so the threads split the elements (a bf16 model's copies are a pass over every weight) */
#pragma omp parallel for schedule(static) if (q->n > 65536)
    for (int64_t k = 0; k < q->n; k++) {
        float v = q->data[k];
        if (q->wide) q->wide[k] = v;
        if (r16) {
            uint32_t u; /* the rounded value is a bf16 value: its top half is the bf16 bits */
            v = hp_linalg_round_bf16(v);
            memcpy(&u, &v, sizeof u);
            ((uint16_t *)q->w->d)[k] = (uint16_t)(u >> 16);
        }
    }
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
    hp_status st = hp_comm_allreduce_max_f64(r->x.world, &first, 1, err);
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
    return hp_comm_agree(r->x.world, st, err);
}

hp_status hp_runner_apply(hp_runner *r, const hp_train_opts *opts, double *norm_out, hp_err *err)
{
    hp__train *t = r->train;
    if (!t || !t->pending)
        return hp_err_set(err, HP_ERR_INPUT, "no gradients to apply: accumulate a micro-batch first");
    double t2 = hp_comm_wtime();
    hp_status st = hp_comm_agree(r->x.world, reduce_grads(r, err), err);
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
        if ((st = hp_comm_allreduce_max_f64(r->x.world, &first, 1, err)) != HP_OK) return st;
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
    if ((st = hp_comm_agree(r->x.world, opt_state(r, err), err)) != HP_OK) return st;
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
    if ((st = hp_comm_agree(r->x.world, st, err)) != HP_OK) return st;
    state_bytes(r);
    hp__r_moe_release(r); /* the EP runtimes made their linears from the old experts: made again at the next forward */
    st = hp_comm_agree(r->x.world, relink(r, err), err);
    rs->train_opt_s = hp_comm_wtime() - t3;
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

hp_status hp_runner_gather_params(hp_runner *r, bool grads, hp_param_fn fn, void *ctx, hp_err *err)
{
    hp_status st = hp_comm_agree(r->x.world, train_init(r, err), err);
    if (st == HP_OK && grads && !r->train->grads)
        st = hp_err_set(err, HP_ERR_INPUT, "no gradients yet: take a training step first");
    if (st != HP_OK) return st;
    hp__train *t = r->train;
    int world = hp_comm_size(r->x.world), me = hp_comm_rank(r->x.world);
    size_t *cnt = hp_calloc((size_t)world * 2, sizeof *cnt), *dsp = cnt ? cnt + world : NULL;
    if (!cnt) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < t->n && (st = hp_comm_agree(r->x.world, st, err)) == HP_OK; i++) {
        const tparam *q = &t->p[i];
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
                st = hp__w_cut(&r->w.ws, q->name, k, cut, err);
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
            if ((st = hp__w_cut(&r->w.ws, q->name, k, cut, err)) == HP_OK)
                hp__w_place(cut, (const float *)((const char *)all + dsp[k]), whole);
        }
        if (me == 0 && st == HP_OK) st = fn(ctx, q->name, whole, q->w->global, q->w->n_dims, err);
        free(all);
        free(whole);
    }
    free(cnt);
    return hp_comm_agree(r->x.world, st, err);
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
    hp_status st = hp_comm_agree(r->x.world, train_init(r, err), err);
    if (st != HP_OK) return st;
    hp__train *t = r->train;
    if (t->pending) st = hp_err_set(err, HP_ERR_INPUT, "a step is half accumulated; save after hp_runner_apply");
    st = hp_comm_agree(r->x.world, st, err);
    if (st != HP_OK) return st;
    if ((st = hp_comm_agree(r->x.world, opt_state(r, err), err)) != HP_OK) return st;
    hp_st_writer *w = hp_st_writer_create();
    char path[4200], key[64], val[64];
    snprintf(path, sizeof path, "%s/rank-%d.safetensors", dir, hp_comm_rank(r->x.world));
    if (!w) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    snprintf(val, sizeof val, "%lld", (long long)t->step);
    if (st == HP_OK) st = hp_st_writer_set_metadata(w, "step", val, err);
    snprintf(val, sizeof val, "%d", t->zero);
    if (st == HP_OK) st = hp_st_writer_set_metadata(w, "zero", val, err);
    snprintf(val, sizeof val, "%d", hp_comm_size(r->x.world));
    if (st == HP_OK) st = hp_st_writer_set_metadata(w, "world", val, err);
    snprintf(val, sizeof val, "%d", hp_comm_rank(r->x.world));
    if (st == HP_OK) st = hp_st_writer_set_metadata(w, "rank", val, err);
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
    return hp_comm_agree(r->x.world, st, err);
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
    hp_status st = hp_comm_agree(r->x.world, train_init(r, err), err);
    if (st != HP_OK) return st;
    hp__train *t = r->train;
    char path[4200], key[64];
    snprintf(path, sizeof path, "%s/rank-%d.safetensors", dir, hp_comm_rank(r->x.world));
    hp_st_file *f = NULL;
    st = hp_st_open(&f, path, err);
    const char *step = f ? hp_st_metadata_get(f, "step") : NULL, *zero = f ? hp_st_metadata_get(f, "zero") : NULL;
    const char *world = f ? hp_st_metadata_get(f, "world") : NULL;
    long long wv = world ? atoll(world) : -1, sv = step ? atoll(step) : -1, zv = zero ? atoll(zero) : -1;
    if (st == HP_OK && (sv < 0 || (zv != 0 && zv != 1) || wv != hp_comm_size(r->x.world)))
        st = hp_err_set(err, HP_ERR_INPUT, "%s: not a training state of %d ranks (step %s, zero %s, world %s)", path,
                        hp_comm_size(r->x.world), step ? step : "?", zero ? zero : "?", world ? world : "?");
    if (st == HP_OK) st = state_rank_check(f, hp_comm_rank(r->x.world), path, err);
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
    if ((st = hp_comm_agree(r->x.world, st, err)) != HP_OK) return st;
    state_bytes(r);
    hp__r_moe_release(r); /* as after a step */
    return hp_comm_agree(r->x.world, relink(r, err), err);
}

int64_t hp_runner_train_steps(const hp_runner *r)
{
    return r->train ? r->train->step : 0;
}

hp_status hp_runner_save_train(hp_runner *r, const char *dir, hp_err *err)
{
    return hp_runner_save_train_meta(r, dir, NULL, 0, err);
}
