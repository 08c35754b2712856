/*
 * prog.c — the forward pass of a plan as a program (exec/prog.h).
 *
 *   embed → for each layer: input_layernorm → self_attn → (+ residual) → post_attention_layernorm → mlp →
 *   (+ residual) → norm → lm_head → loss
 *
 * For every module (docs/run.md): the incoming layout must equal in_src; the entry moves it to in_dst; the
 * computation runs on local tensors and its result's layout follows from the weights' placements and must equal
 * out_src; the exit moves it to out_dst. Every transition is lowered here once (with rank 0's position: whether
 * a transition lowers depends on the placements only), so the runner and cost never meet one they cannot run.
 * Nothing about the family decides a collective: an override that changes a contract changes the program.
 */
#include "exec/prog.h"

#include "hyperpar/moe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct bld {
    hp__prog *g;
    const hp_model *m;
    const hp_plan *p;
    const hp_mesh *mesh;
    bool other;     /* another mesh than the plan's (advise) */
    hp__axes pos;   /* rank 0's: the lowering's refusals depend on the placements only */
    size_t cap;
    hp_err *err;
} bld;

const char *hp__op_name(hp__op op)
{
    static const char *const n[HP__OP_COUNT] = {"embed", "norm", "attention", "mla", "mlp", "moe", "residual",
                                                "head", "loss"};
    return (unsigned)op < HP__OP_COUNT ? n[op] : "?";
}

bool hp__seq_pad(int64_t S, int64_t cp, int64_t *S_pad)
{
    *S_pad = S;
    if (cp <= 1) return true;
    int64_t s;
    if (!hp_add_i64(S, 2 * cp - 1, &s)) return false;
    *S_pad = s / (2 * cp) * (2 * cp);
    return true;
}

void hp__dp_rows(int64_t B, int64_t dp, int64_t *rows)
{
    for (int64_t i = 0; i <= dp; i++) rows[i] = hp__blk_lo(B, dp, i);
}

int64_t hp__step_local_I(const hp__prog *g, const hp__step *s, int64_t ti)
{
    return s->split ? hp__blk_lo(s->I, g->tp, ti + 1) - hp__blk_lo(s->I, g->tp, ti) : s->I;
}

/* 1024 rows: at Llama-3-8B's widths (I 14336) one chunk's gate|up and hidden are 168 MiB, against 5.3 GiB for a
 * 32k-token sequence, and a GEMM of 1024 rows runs at the rate of a longer one (a 4096-token forward of that layer
 * took no longer chunked: docs/run.md "Long prefill").
 * The outputs are the unchunked ones, bit for bit: chunks start at multiples of 1024, so BF16 mode's row pieces
 * (HP__ROW_CHUNK, 256, in src/kernels) fall where the unchunked call puts them, and a chunk is never so short (256
 * rows at least) that the GEMM layer would take its few-row path (at most 16 rows) for it. */
int64_t hp__mlp_chunk_end(int64_t rows, int64_t r0, bool whole)
{
    if (whole || rows - r0 < HP__MLP_CHUNK_ROWS + HP__MLP_CHUNK_MIN) return rows;
    return r0 + HP__MLP_CHUNK_ROWS;
}

/* In O(1) (cost sizes sequences up to 2^62 rows): k full chunks, k the least with fewer than C + MIN rows left
 * after them, then the rest, which is at least MIN and less than C + MIN. */
int64_t hp__mlp_chunk_rows(int64_t rows, bool whole)
{
    const int64_t C = HP__MLP_CHUNK_ROWS;
    if (whole || rows < C + HP__MLP_CHUNK_MIN) return rows;
    int64_t k = (rows - C - HP__MLP_CHUNK_MIN) / C + 1, rest = rows - k * C;
    return rest > C ? rest : C;
}

int64_t hp__mlp_chunk_count(int64_t rows, bool whole)
{
    if (rows <= 0) return 0;
    if (whole || rows < HP__MLP_CHUNK_ROWS + HP__MLP_CHUNK_MIN) return 1;
    return (rows - HP__MLP_CHUNK_ROWS - HP__MLP_CHUNK_MIN) / HP__MLP_CHUNK_ROWS + 2;
}

void hp__step_row_widths(const hp__prog *g, const hp__step *s, int64_t ti, int64_t w[HP__NBUF])
{
    const hp__rcfg *c = &g->cfg;
    memset(w, 0, HP__NBUF * sizeof *w);
    if (s->op == HP__OP_ATTN) {
        w[0] = w[1] = s->nh * c->hd; /* q, the attention output */
    } else if (s->op == HP__OP_MLA) {
        const hp__mla *a = &g->mla;
        w[0] = s->nh * (a->nope + a->rope);
        w[1] = s->nh * a->vd;
        /* kv_a's output (latent | k_rot), q_a's, the normed latent, kv_b's output */
        w[2] = a->kvl + a->rope + a->ql + a->kvl + s->nh * (a->nope + a->vd);
    } else if (s->op == HP__OP_MLP) {
        int64_t I = hp__step_local_I(g, s, ti);
        w[2] = 2 * I; /* gate | up */
        w[3] = I;     /* silu(gate) · up */
    }
}

void hp__step_bwd_widths(const hp__prog *g, const hp__step *s, int64_t ti, int64_t w[HP__NBWD])
{
    const hp__rcfg *c = &g->cfg;
    memset(w, 0, HP__NBWD * sizeof *w);
    if (s->op == HP__OP_ATTN) {
        w[0] = w[1] = s->nh * c->hd;
        w[2] = s->qk_norm ? s->nh * c->hd : 0;
        w[3] = c->H;
    } else if (s->op == HP__OP_MLA) {
        const hp__mla *a = &g->mla;
        int64_t qa = a->ql > 0 ? a->ql : 0;
        w[0] = s->nh * a->vd;
        w[1] = s->nh * (a->nope + a->rope);
        w[2] = a->kvl + a->rope + qa + s->nh * (a->nope + a->vd);
        w[3] = a->kvl > c->H ? a->kvl : c->H;
        w[5] = a->kvl > qa ? a->kvl : qa;
    } else if (s->op == HP__OP_MLP) {
        int64_t I = hp__step_local_I(g, s, ti);
        w[0] = I;
        w[1] = 2 * I;
        w[3] = s->fused ? 0 : c->H;
    }
}

bool hp__recompute_overwrites(const hp__prog *g, size_t i, size_t e, hp__op op, int buf, int64_t ti)
{
    int64_t w0[HP__NBUF], w1[HP__NBUF];
    if (buf >= 0) hp__step_row_widths(g, &g->steps[i], ti, w0);
    for (size_t j = i + 1; j < e; j++) {
        const hp__step *s = &g->steps[j];
        if (buf < 0 && s->op == op) return true;
        if (buf >= 0 && hp__op_is_module(s->op)) {
            hp__step_row_widths(g, s, ti, w1);
            if (w0[buf] > 0 && w1[buf] > 0) return true;
        }
    }
    return false;
}

bool hp__op_is_module(hp__op op)
{
    return op == HP__OP_ATTN || op == HP__OP_MLA || op == HP__OP_MLP || op == HP__OP_MOE;
}

/* ---- the plan's facts ---- */

static const hp_boundary *planned(const bld *b, const char *fqn)
{
    const hp_boundary *x = hp_plan_find(b->p, fqn);
    return x && x->is_boundary ? x : NULL;
}

static const hp_boundary *need(const bld *b, const char *fqn)
{
    const hp_boundary *x = planned(b, fqn);
    if (!x)
        hp_err_set(b->err, HP_ERR_INPUT,
                   "the plan has no boundary for %s; the runtime executes modules through their boundaries "
                   "(derive the plan again, or add one with an override)",
                   fqn);
    return x;
}

/* The contract on this mesh: on another mesh (advise) an axis of size 1 places nothing (a plan derived for that
 * mesh has no placement on it). */
static hp__contract contract(const bld *b, const hp_boundary *x)
{
    hp__contract c = hp__contract_of(x);
    if (!b->other) return c;
    hp__lay *ls[4] = {&c.in_src, &c.in_dst, &c.out_src, &c.out_dst};
    for (int i = 0; i < 4; i++) {
        if (b->g->tp == 1) ls[i]->ax[HP__TP] = hp_pl_r();
        if (b->g->cp == 1) ls[i]->ax[HP__CP] = hp_pl_r();
    }
    return c;
}

/* A 2-D weight's tp placement in its boundary: 'R' (whole), '0' (S(0)), '1' (S(1)), '2' (packed S(0)x2), '?'
 * (anything else); tp = 1 and a weight the boundary does not place are whole. */
static char tp_kind(const bld *b, const hp_boundary *x, const char *rel)
{
    if (b->g->tp == 1) return 'R';
    for (int i = 0; i < x->n_params; i++) {
        if (strcmp(x->params[i].rel, rel)) continue;
        hp_placement p = x->params[i].pl.ax[HP_AXIS_TP];
        if (p.kind == HP_PL_ABSENT || p.kind == HP_PL_R) return 'R';
        int d = p.dim < 0 ? p.dim + 2 : p.dim;
        if (p.kind == HP_PL_S2) return d == 0 ? '2' : '?';
        if (p.kind == HP_PL_S) return d == 0 ? '0' : d == 1 ? '1' : '?';
        return '?';
    }
    return 'R';
}

static bool deferred(const hp_boundary *x, const char *rel)
{
    for (int i = 0; i < x->n_deferred; i++)
        if (!strcmp(x->deferred_biases[i], rel)) return true;
    return false;
}

static int64_t local_attr(const hp_boundary *x, const char *name, int64_t dflt)
{
    for (int i = 0; i < x->n_tp_attrs; i++)
        if (!strcmp(x->tp_attrs[i].name, name)) return x->tp_attrs[i].local;
    return dflt;
}

static bool has_param(const bld *b, const char *fqn, const char *rel)
{
    char name[300];
    snprintf(name, sizeof name, "%s.%s", fqn, rel);
    return hp_model_find_param(b->m, name) != NULL;
}

static hp_status pattern_error(const bld *b, const char *fqn, const char *what)
{
    return hp_err_set(b->err, HP_ERR_INPUT,
                      "boundary %s: the runtime computes it column-parallel into row-parallel (%s) or fully "
                      "replicated; its params' tp placements are neither (change the override)",
                      fqn, what);
}

/* ---- the layout flow ---- */

static hp__step *push(bld *b, hp__op op, int64_t layer, const char *fqn)
{
    hp__prog *g = b->g;
    if (g->n_steps == b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 32;
        hp__step *ns = realloc(g->steps, nc * sizeof *ns);
        if (!ns) {
            hp_err_set(b->err, HP_ERR_NOMEM, "out of memory");
            return NULL;
        }
        g->steps = ns;
        b->cap = nc;
    }
    hp__step *s = &g->steps[g->n_steps++];
    memset(s, 0, sizeof *s);
    s->op = op;
    s->layer = (int32_t)layer;
    s->c.fqn = fqn;
    s->X = g->cfg.H;
    s->archetype = -1;
    const hp_pipeline *q = &b->p->pipe;
    if (q->n_chunks > 1)
        s->chunk = (int32_t)(layer >= 0 ? hp_pipeline_chunk_of(q, layer) : op == HP__OP_EMBED ? 0 : q->n_chunks - 1);
    return s;
}

/* from -> to, axis by axis (tp first, as hp__redistribute runs them): refused here when an axis does not lower. */
static hp_status transition(const bld *b, const hp__lay *from, const hp__lay *to, const char *what)
{
    static const int64_t g[3] = {1, 1, 1}; /* the refusals do not depend on the sizes */
    hp__lay cur = *from;
    for (int ax = 0; ax < HP__NAX; ax++) {
        hp__low lw = hp__lower_axis(&b->pos, &cur, g, ax, to->ax[ax]);
        if (lw.kind == HP__LOW_REFUSE) {
            hp__lay next = cur;
            next.ax[ax] = to->ax[ax];
            return hp__refuse(&cur, &next, ax, what, lw.why, b->err);
        }
        cur.ax[ax] = to->ax[ax];
    }
    return HP_OK;
}

/* s->in arrived: checked against in_src and moved to in_dst (s->run). */
static hp_status enter(const bld *b, hp__step *s)
{
    s->run = s->in;
    if (!s->c.has_in) return HP_OK;
    hp_status st = hp__contract_check(&s->c, &s->in, true, b->err);
    char what[200];
    snprintf(what, sizeof what, "boundary %s (entry)", s->c.fqn);
    if (st == HP_OK) st = transition(b, &s->in, &s->c.in_dst, what);
    s->run = s->c.in_dst;
    return st;
}

/* s->out computed: checked against out_src and moved to out_dst (s->leave). */
static hp_status leave(const bld *b, hp__step *s)
{
    s->leave = s->out;
    if (!s->c.has_out) return HP_OK;
    hp_status st = hp__contract_check(&s->c, &s->out, false, b->err);
    char what[200];
    snprintf(what, sizeof what, "boundary %s (exit)", s->c.fqn);
    if (st == HP_OK) st = transition(b, &s->out, &s->c.out_dst, what);
    s->leave = s->c.out_dst;
    return st;
}

/* The computation needs whole rows: no partial sum, no cut of the channels, no cut of the batch on tp, and
 * (seq_ok false: attention) the whole sequence on tp. */
static hp_status whole_rows(const bld *b, const hp__step *s, bool seq_ok)
{
    char t[64];
    for (int ax = 0; ax < HP__NAX; ax++) {
        hp_placement p = s->run.ax[ax];
        bool bad = p.kind == HP_PL_P || p.kind == HP_PL_S2 || (p.kind == HP_PL_S && p.dim == 2) ||
                   (p.kind == HP_PL_S && p.dim == 1 && !seq_ok && ax == HP__TP) ||
                   (p.kind == HP_PL_S && p.dim == 0 && ax == HP__TP);
        if (bad)
            return hp_err_set(b->err, HP_ERR_INPUT,
                              "boundary %s: its computation cannot run on an input laid out %s (%s axis); its "
                              "in_dst must keep whole rows%s",
                              s->c.fqn, hp__lay_str(&s->run, t, sizeof t), ax == HP__TP ? "tp" : "cp",
                              seq_ok ? "" : " and the whole sequence on tp");
    }
    return HP_OK;
}

/* The layout of a module's output on the rows it ran on: {tp: tp_pl, cp: the input's}. */
static hp__lay rows_out(const hp__step *s, hp_placement tp_pl)
{
    return (hp__lay){{tp_pl, s->run.ax[HP__CP]}};
}

/* ---- the modules ---- */

static hp_status embed(bld *b)
{
    hp__prog *g = b->g;
    const hp_boundary *x = need(b, "model.embed_tokens");
    if (!x) return HP_ERR_INPUT;
    char k = tp_kind(b, x, "weight");
    if (k != '0' && k != 'R') return pattern_error(b, "model.embed_tokens", "weight S(0): vocab-parallel");
    g->embed_split = k == '0';
    hp__step *s = push(b, HP__OP_EMBED, -1, x->fqn);
    if (!s) return HP_ERR_NOMEM;
    s->c = contract(b, x);
    s->split = g->embed_split;
    hp__contract *c = &s->c;
    char t1[64], t2[64];
    if (c->has_in && !hp__lay_eq(&c->in_src, &c->in_dst)) /* the ids arrive as the data pipeline cuts them (D-05) */
        return hp_err_set(b->err, HP_ERR_INPUT, "boundary %s: the ids' entry %s -> %s is not supported (the ids "
                          "arrive as the data pipeline cuts them)", c->fqn, hp__lay_str(&c->in_src, t1, sizeof t1),
                          hp__lay_str(&c->in_dst, t2, sizeof t2));
    s->in = s->run = c->has_in ? c->in_dst : (hp__lay){{hp_pl_r(), hp_pl_r()}};
    hp_placement cpl = s->run.ax[HP__CP];
    if (s->run.ax[HP__TP].kind != HP_PL_R || (cpl.kind == HP_PL_S && cpl.dim != 1) || cpl.kind == HP_PL_P ||
        cpl.kind == HP_PL_S2)
        return hp_err_set(b->err, HP_ERR_INPUT, "boundary %s: the ids can be laid out {tp: R, cp: S(1) or R}, not %s",
                          c->fqn, hp__lay_str(&s->run, t1, sizeof t1));
    s->out = rows_out(s, g->embed_split ? hp_pl_p() : hp_pl_r());
    hp_status st = leave(b, s);
    g->stream = s->leave;
    return st;
}

static hp_status norm(bld *b, int64_t layer, const char *fqn, bool keep)
{
    const hp_boundary *x = planned(b, fqn);
    int mi = x ? -1 : hp_model_find_module(b->m, fqn); /* no boundary: the model's name for it */
    hp__step *s = push(b, HP__OP_NORM, layer, x ? x->fqn : mi >= 0 ? b->m->modules[mi].name : "model.norm");
    if (!s) return HP_ERR_NOMEM;
    if (x) s->c = contract(b, x);
    s->keep = keep;
    s->in = b->g->stream;
    hp_status st = enter(b, s);
    if (st == HP_OK && s->c.has_in) st = whole_rows(b, s, true);
    s->out = s->run;
    return st == HP_OK ? leave(b, s) : st;
}

static hp_status attn_facts(bld *b, const hp_boundary *x, hp__step *s)
{
    const hp__prog *g = b->g;
    const hp__rcfg *c = &g->cfg;
    const hp_model_config *mc = &b->m->cfg;
    const char *fqn = x->fqn;
    int64_t tp = g->tp;
    if (s->op == HP__OP_MLA) {
        bool ql = mc->q_lora_rank > 0;
        char kq = tp_kind(b, x, ql ? "q_b_proj.weight" : "q_proj.weight"), kb = tp_kind(b, x, "kv_b_proj.weight");
        char ko = tp_kind(b, x, "o_proj.weight"), ka = tp_kind(b, x, "kv_a_proj_with_mqa.weight");
        char kqa = ql ? tp_kind(b, x, "q_a_proj.weight") : 'R';
        if (kq == '0' && kb == '0' && ko == '1' && ka == 'R' && kqa == 'R') s->split = true;
        else if (!(kq == 'R' && kb == 'R' && ko == 'R' && ka == 'R' && kqa == 'R'))
            return pattern_error(b, fqn, "q_b_proj / kv_b_proj S(0) by heads, o_proj S(1), the latent projections R");
        if (s->split && c->nh % tp)
            return hp_err_set(b->err, HP_ERR_INPUT, "%s: %lld heads do not split over tp=%lld", fqn,
                              (long long)c->nh, (long long)tp);
        s->nh = s->nkv = s->split ? c->nh / tp : c->nh;
        if (!b->other && local_attr(x, "num_attention_heads", s->nh) != s->nh)
            return hp_err_set(b->err, HP_ERR_INPUT,
                              "%s: the plan's TP-local head count disagrees with its weights' slices", fqn);
        s->kw = s->nh * (g->mla.nope + g->mla.rope);
        s->vw = s->nh * g->mla.vd;
    } else {
        char kq = tp_kind(b, x, "q_proj.weight"), kk = tp_kind(b, x, "k_proj.weight");
        char kv = tp_kind(b, x, "v_proj.weight"), ko = tp_kind(b, x, "o_proj.weight");
        if (kq == '0' && kk == '0' && kv == '0' && ko == '1') s->split = true;
        else if (!(kq == 'R' && kk == 'R' && kv == 'R' && ko == 'R'))
            return pattern_error(b, fqn, "q/k/v_proj S(0), o_proj S(1)");
        if (s->split && (c->nh % tp || c->nkv % tp))
            return hp_err_set(b->err, HP_ERR_INPUT, "%s: %lld query / %lld kv heads do not split over tp=%lld", fqn,
                              (long long)c->nh, (long long)c->nkv, (long long)tp);
        s->nh = s->split ? c->nh / tp : c->nh;
        s->nkv = s->split ? c->nkv / tp : c->nkv;
        int64_t an = local_attr(x, "num_attention_heads", s->nh), ak = local_attr(x, "num_key_value_heads", s->nkv);
        if (!b->other && (an != s->nh || ak != s->nkv))
            return hp_err_set(b->err, HP_ERR_INPUT,
                              "%s: the plan's TP-local head counts (%lld/%lld) disagree with its weights' slices "
                              "(%lld/%lld heads on this rank)",
                              fqn, (long long)an, (long long)ak, (long long)s->nh, (long long)s->nkv);
        s->kw = s->vw = s->nkv * c->hd;
        s->qk_norm = has_param(b, fqn, "q_norm.weight") || has_param(b, fqn, "k_norm.weight");
    }
    s->bias_deferred = deferred(x, "o_proj.bias");
    return HP_OK;
}

static hp_status attention(bld *b, int64_t layer, hp__lay t)
{
    char fq[128];
    snprintf(fq, sizeof fq, "model.layers.%lld.self_attn", (long long)layer);
    const hp_boundary *x = need(b, fq);
    if (!x) return HP_ERR_INPUT;
    hp__step *s = push(b, has_param(b, x->fqn, "kv_a_proj_with_mqa.weight") ? HP__OP_MLA : HP__OP_ATTN, layer,
                       x->fqn);
    if (!s) return HP_ERR_NOMEM;
    s->c = contract(b, x);
    hp_status st = attn_facts(b, x, s);
    s->in = t;
    if (st == HP_OK) st = enter(b, s);
    if (st == HP_OK) st = whole_rows(b, s, false);
    if (st == HP_OK && s->run.ax[HP__TP].kind != HP_PL_R)
        st = hp_err_set(b->err, HP_ERR_INPUT, "boundary %s: attention needs every token's whole hidden state on tp "
                        "(in_dst tp R)", s->c.fqn);
    s->out = rows_out(s, s->split ? hp_pl_p() : hp_pl_r());
    return st == HP_OK ? leave(b, s) : st;
}

static hp_status mlp_facts(bld *b, const hp_boundary *x, hp__step *s)
{
    const char *fqn = x->fqn;
    s->fused = has_param(b, fqn, "gate_up_proj.weight");
    char kd = tp_kind(b, x, "down_proj.weight");
    if (s->fused) {
        char k = tp_kind(b, x, "gate_up_proj.weight");
        if (k == '2' && kd == '1') s->split = true;
        else if (k == '0' && kd == '1')
            return hp_err_set(b->err, HP_ERR_INPUT,
                              "boundary %s: gate_up_proj is fused and S(0) would give one rank only gate rows; "
                              "plan with --packed-fused (S(0)x2)",
                              fqn);
        else if (!(k == 'R' && kd == 'R')) return pattern_error(b, fqn, "gate_up_proj S(0)x2, down_proj S(1)");
    } else {
        char kg = tp_kind(b, x, "gate_proj.weight"), ku = tp_kind(b, x, "up_proj.weight");
        if (kg == '0' && ku == '0' && kd == '1') s->split = true;
        else if (!(kg == 'R' && ku == 'R' && kd == 'R')) return pattern_error(b, fqn, "gate/up_proj S(0), down_proj S(1)");
    }
    s->I = b->g->cfg.I;
    s->bias_deferred = deferred(x, "down_proj.bias");
    return HP_OK;
}

/* Experts cut over tp (the plan without EP, or the explicit ep axis with tp): each tp rank holds a column block
 * of every local expert (gate/up column-parallel, down row-parallel) and of the shared expert, routes all its rows
 * with the replicated router, and the block's output is a partial sum over tp that its exit reduces. */
static hp_status moe_facts(bld *b, const hp_boundary *x, hp__step *s)
{
    const hp__prog *g = b->g;
    const char *fqn = x->fqn;
    for (int i = 0; i < x->n_params && g->tp > 1; i++) {
        hp_placement t = x->params[i].pl.ax[HP_AXIS_TP];
        if (t.kind != HP_PL_S && t.kind != HP_PL_S2) continue;
        const char *rel = x->params[i].rel;
        if (!strncmp(rel, "gate.", 5) || !strncmp(rel, "router.", 7) || !strncmp(rel, "shared_expert_gate.", 19))
            return hp_err_set(b->err, HP_ERR_INPUT,
                              "boundary %s: '%s' is sharded over tp; the router must be replicated (tp R): every tp "
                              "rank routes the same rows (override its params to R)",
                              fqn, rel);
        s->split = true;
    }
    if (s->split && g->ep > 1 && !b->mesh->ep_axis)
        return hp_err_set(b->err, HP_ERR_INPUT,
                          "boundary %s: its experts are both spread over the tp group (TP-extend-EP, --ep %lld) and "
                          "cut over tp; plan either --ep without a tp cut of the experts, or "
                          "an explicit ep axis of its own ranks (--mesh ...,ep=N,...) with experts cut over tp",
                          fqn, (long long)g->ep);
    if (!b->other && x->ep_size > 0 && x->ep_size != g->ep)
        return hp_err_set(b->err, HP_ERR_INPUT, "boundary %s: its EP group has %d ranks but the mesh's has %lld", fqn,
                          x->ep_size, (long long)g->ep);
    int64_t E = b->m->cfg.n_experts;
    if (E > 0 && E % g->ep)
        return hp_err_set(b->err, HP_ERR_INPUT, "num_experts (%lld) must be divisible by ep (%lld)", (long long)E,
                          (long long)g->ep);
    if (x->local_compute_fn) {
        hp_moe_archetype a;
        if (!hp_moe_archetype_parse(x->local_compute_fn, &a))
            return hp_err_set(b->err, HP_ERR_INPUT, "boundary %s: archetype '%s' has no runtime", fqn,
                              x->local_compute_fn);
        s->archetype = (int)a;
    }
    s->cf = x->compute.capacity_factor;
    s->overlap = x->compute.has_overlap_shared_expert && x->compute.overlap_shared_expert;
    s->I = b->m->cfg.moe_intermediate_size;
    return HP_OK;
}

/* The experts' tensors sharded over tp by the plan (TP-extend-EP's expert mesh on the tp ranks counts too): the
 * tp ranks then split the experts' work instead of each repeating it. */
static bool experts_on_tp(const bld *b, const hp_boundary *x)
{
    if (b->g->tp == 1) return false;
    for (int i = 0; i < x->n_params; i++) {
        const hp_param_spec *ps = &x->params[i];
        hp_pl_kind k = (hp_pl_kind)ps->pl.ax[HP_AXIS_TP].kind;
        if (k != HP_PL_S && k != HP_PL_S2) continue;
        bool expert = ps->pl.ax[HP_AXIS_EP].kind == HP_PL_S || ps->pl.ax[HP_AXIS_EP].kind == HP_PL_S2;
        for (int q = 0; q < x->n_ep_stack && !expert; q++) expert = !strcmp(x->ep_stack[q].name, ps->rel);
        char full[600];
        snprintf(full, sizeof full, "%s.%s", x->fqn, ps->rel);
        const hp_param *par = hp_model_find_param(b->m, full);
        if (!expert && par && b->p->roles && b->p->roles[par - b->m->params] == HP_ROLE_MOE_EXPERT) expert = true;
        if (expert) return true;
    }
    return false;
}

static hp_status feed_forward(bld *b, int64_t layer, hp__lay t)
{
    const hp_model *m = b->m;
    bool sparse = m->family && hp_family_is_moe(m->family) && hp_model_layer_is_sparse(m, layer);
    char fq[128];
    snprintf(fq, sizeof fq, "model.layers.%lld.block_sparse_moe", (long long)layer);
    if (!sparse || (hp_model_find_module(m, fq) < 0 && !hp_plan_find(b->p, fq)))
        snprintf(fq, sizeof fq, "model.layers.%lld.mlp", (long long)layer);
    const hp_boundary *x = need(b, fq);
    if (!x) return HP_ERR_INPUT;
    hp__step *s = push(b, sparse ? HP__OP_MOE : HP__OP_MLP, layer, x->fqn);
    if (!s) return HP_ERR_NOMEM;
    s->c = contract(b, x);
    hp_status st = sparse ? moe_facts(b, x, s) : mlp_facts(b, x, s);
    s->in = t;
    if (st == HP_OK) st = enter(b, s);
    if (st == HP_OK) st = whole_rows(b, s, true);
    if (st != HP_OK) return st;
    if (sparse) {
        if (s->split && s->run.ax[HP__TP].kind != HP_PL_R)
            return hp_err_set(b->err, HP_ERR_INPUT, "boundary %s: its experts are cut over tp, so every tp rank needs "
                              "the same whole rows (in_dst tp R), but they arrive laid out otherwise", s->c.fqn);
        if (b->g->tp > 1 && s->run.ax[HP__TP].kind == HP_PL_R && !s->split && !experts_on_tp(b, x) &&
            !b->g->moe_whole)
            b->g->moe_whole = x->fqn;
        s->out = rows_out(s, s->split ? hp_pl_p() : s->run.ax[HP__TP]);
    } else {
        s->out = rows_out(s, s->split ? hp_pl_p() : hp_pl_r());
    }
    return leave(b, s);
}

static hp_status residual(bld *b, int64_t layer, const hp__step *branch)
{
    const char *fqn = branch->c.fqn;
    hp__lay from = branch->leave;
    bool ff = branch->op == HP__OP_MLP || branch->op == HP__OP_MOE;
    hp__step *s = push(b, HP__OP_RESIDUAL, layer, fqn);
    if (!s) return HP_ERR_NOMEM;
    s->ends_layer = ff;
    s->in = s->run = s->out = from;
    s->leave = b->g->stream;
    char what[200];
    snprintf(what, sizeof what, "the residual add after %s", fqn);
    return transition(b, &s->in, &s->leave, what);
}

static hp_status head(bld *b)
{
    hp__prog *g = b->g;
    const hp__lay t = g->steps[g->n_steps - 1].leave; /* the final norm's */
    g->tied = !hp_model_find_param(b->m, "lm_head.weight");
    hp__step *s;
    if (!g->tied) {
        const hp_boundary *x = need(b, "lm_head");
        if (!x) return HP_ERR_INPUT;
        char k = tp_kind(b, x, "weight");
        if (k != '0' && k != 'R') return pattern_error(b, "lm_head", "weight S(0): vocab-parallel");
        g->head_split = k == '0';
        if (!(s = push(b, HP__OP_HEAD, -1, x->fqn))) return HP_ERR_NOMEM;
        s->c = contract(b, x);
    } else { /* no boundary: the column-parallel head contract on whatever the final norm gives */
        g->head_split = g->embed_split;
        if (!(s = push(b, HP__OP_HEAD, -1, "lm_head (tied to model.embed_tokens)"))) return HP_ERR_NOMEM;
        hp_placement cpl = t.ax[HP__CP];
        s->c.has_in = s->c.has_out = true;
        s->c.in_src = t;
        s->c.in_dst = (hp__lay){{hp_pl_r(), cpl}};
        s->c.out_src = (hp__lay){{g->head_split ? hp_pl_s(2) : hp_pl_r(), cpl}};
        s->c.out_dst = (hp__lay){{g->head_split && b->p->loss_parallel ? hp_pl_s(2) : hp_pl_r(), cpl}};
    }
    s->split = g->head_split;
    s->X = g->cfg.V;
    s->in = t;
    hp_status st = enter(b, s);
    if (st == HP_OK) st = whole_rows(b, s, true);
    s->out = rows_out(s, g->head_split ? hp_pl_s(2) : hp_pl_r());
    if (st == HP_OK) st = leave(b, s);
    if (st != HP_OK) return st;
    g->head_chunks = s->run.ax[HP__TP].kind == HP_PL_R && hp_placement_eq(s->out.ax[HP__CP], s->leave.ax[HP__CP]);
    hp__step *z = push(b, HP__OP_LOSS, -1, "loss");
    if (!z) return HP_ERR_NOMEM;
    z->X = g->cfg.V;
    z->in = z->run = z->out = z->leave = g->steps[g->n_steps - 2].leave;
    hp_placement zt = z->in.ax[HP__TP];
    if (zt.kind == HP_PL_P || zt.kind == HP_PL_S2 || z->in.ax[HP__CP].kind == HP_PL_P ||
        (zt.kind == HP_PL_S && zt.dim != 2))
        return hp_err_set(b->err, HP_ERR_INPUT, "the logits leave lm_head in a layout the loss cannot use");
    z->split = zt.kind == HP_PL_S && g->tp > 1;
    return HP_OK;
}

hp_status hp__prog_build(hp__prog *g, const hp_model *m, const hp_plan *p, const hp_mesh *mesh, const char *label,
                         hp_err *err)
{
    memset(g, 0, sizeof *g);
    if (!m->has_config)
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: config.json is missing; the runtime needs the model's hyperparameters (family, "
                          "heads, norms, rotary settings) from it: copy the model's config.json next to the weights",
                          m->path);
    hp_status st = hp__run_family_check(m, err);
    if (st == HP_OK) st = hp__rcfg_read(m, label, &g->cfg, err);
    if (st != HP_OK) return st;
    bld b = {.g = g, .m = m, .p = p, .mesh = mesh ? mesh : &p->mesh, .other = mesh && mesh != &p->mesh, .err = err};
    g->tp = hp_mesh_size(b.mesh, "tp"), g->cp = hp_mesh_size(b.mesh, "cp"), g->dp = hp_mesh_batch_split(b.mesh);
    g->ep = b.other ? hp_mesh_ep_size(b.mesh) : hp_plan_ep_size(p);
    b.pos = (hp__axes){{g->tp, g->cp}, {0, 0}};
    const hp_model_config *mc = &m->cfg;
    g->mla = (hp__mla){mc->qk_nope_head_dim, mc->qk_rope_head_dim, mc->v_head_dim,
                       mc->q_lora_rank > 0 ? mc->q_lora_rank : 0, mc->kv_lora_rank};
    st = embed(&b);
    for (int64_t l = 0; st == HP_OK && l < g->cfg.L; l++) {
        char fq[128];
        snprintf(fq, sizeof fq, "model.layers.%lld.input_layernorm", (long long)l);
        st = norm(&b, l, fq, true);
        if (st == HP_OK) st = attention(&b, l, g->steps[g->n_steps - 1].leave);
        if (st == HP_OK) st = residual(&b, l, &g->steps[g->n_steps - 1]);
        snprintf(fq, sizeof fq, "model.layers.%lld.post_attention_layernorm", (long long)l);
        if (st == HP_OK) st = norm(&b, l, fq, false);
        if (st == HP_OK) st = feed_forward(&b, l, g->steps[g->n_steps - 1].leave);
        if (st == HP_OK) st = residual(&b, l, &g->steps[g->n_steps - 1]);
    }
    if (st == HP_OK) st = norm(&b, -1, "model.norm", true);
    if (st == HP_OK) st = head(&b);
    if (st != HP_OK) hp__prog_free(g);
    return st;
}

void hp__prog_free(hp__prog *g)
{
    if (!g) return;
    hp__rcfg_free(&g->cfg);
    free(g->steps);
    memset(g, 0, sizeof *g);
}

bool hp__rows_split(hp_placement p)
{
    return p.kind == HP_PL_S && (p.dim == 0 || p.dim == 1);
}

bool hp__grad_sum_tp(const hp__step *s, int64_t tp, bool cut, bool tp_partial)
{
    return tp > 1 && !cut && (hp__rows_split(s->run.ax[HP__TP]) || tp_partial);
}

const hp__pdef *hp__op_params(hp__op op, size_t *n)
{
    enum { O = HP__P_OPT, V = HP__P_VEC, T = HP__P_TP_PARTIAL, QL = HP__P_QLORA, NQ = HP__P_NO_QLORA };
    enum { F = HP__P_FUSED, U = HP__P_UNFUSED };
    static const hp__pdef one[] = {{"weight", HP__PS_W, 0, HP__LEN_NONE}};
    static const hp__pdef norm[] = {{"weight", HP__PS_W, V, HP__LEN_H}};
    static const hp__pdef attn[] = {
        {"q_proj.weight", HP__PS_Q, 0, HP__LEN_NONE},      {"q_proj.bias", HP__PS_BQ, O | V, HP__LEN_Q},
        {"k_proj.weight", HP__PS_K, 0, HP__LEN_NONE},      {"k_proj.bias", HP__PS_BK, O | V, HP__LEN_KV},
        {"v_proj.weight", HP__PS_V, 0, HP__LEN_NONE},      {"v_proj.bias", HP__PS_BV, O | V, HP__LEN_KV},
        {"o_proj.weight", HP__PS_O, 0, HP__LEN_NONE},      {"o_proj.bias", HP__PS_BO, O | V, HP__LEN_H},
        {"q_norm.weight", HP__PS_QN, O | V | T, HP__LEN_HD}, {"k_norm.weight", HP__PS_KN, O | V | T, HP__LEN_HD},
        {"sinks", HP__PS_SINKS, O | V, HP__LEN_HEADS}, /* gpt-oss, cut with the heads */
    };
    static const hp__pdef mla[] = {
        {"q_a_proj.weight", HP__PS_QA, QL | T, HP__LEN_NONE},
        {"q_a_layernorm.weight", HP__PS_QAN, QL | V | T, HP__LEN_QL},
        {"q_b_proj.weight", HP__PS_Q, QL, HP__LEN_NONE},
        {"q_proj.weight", HP__PS_Q, NQ, HP__LEN_NONE},
        {"kv_a_proj_with_mqa.weight", HP__PS_KVA, T, HP__LEN_NONE},
        {"kv_a_layernorm.weight", HP__PS_KVAN, V | T, HP__LEN_KVL},
        {"kv_b_proj.weight", HP__PS_KVB, 0, HP__LEN_NONE},
        {"o_proj.weight", HP__PS_O, 0, HP__LEN_NONE},
        {"o_proj.bias", HP__PS_BO, O | V, HP__LEN_H},
    };
    static const hp__pdef mlp[] = {
        {"gate_up_proj.weight", HP__PS_GU, F, HP__LEN_NONE}, {"gate_up_proj.bias", HP__PS_BGU, F | O | V, HP__LEN_2I},
        {"gate_proj.weight", HP__PS_G, U, HP__LEN_NONE},     {"gate_proj.bias", HP__PS_BG, U | O | V, HP__LEN_I},
        {"up_proj.weight", HP__PS_U, U, HP__LEN_NONE},       {"up_proj.bias", HP__PS_BU, U | O | V, HP__LEN_I},
        {"down_proj.weight", HP__PS_D, 0, HP__LEN_NONE},     {"down_proj.bias", HP__PS_BD, O | V, HP__LEN_H},
    };
#define HP__TAB(t) (*n = sizeof t / sizeof *t, t)
    switch (op) {
    case HP__OP_EMBED:
    case HP__OP_HEAD: return HP__TAB(one);
    case HP__OP_NORM: return HP__TAB(norm);
    case HP__OP_ATTN: return HP__TAB(attn);
    case HP__OP_MLA: return HP__TAB(mla);
    case HP__OP_MLP: return HP__TAB(mlp);
    default: *n = 0; return NULL;
    }
#undef HP__TAB
}

bool hp__pdef_on(const hp__pdef *d, const hp__prog *g, const hp__step *s)
{
    if ((d->flags & HP__P_QLORA) && g->mla.ql <= 0) return false;
    if ((d->flags & HP__P_NO_QLORA) && g->mla.ql > 0) return false;
    if ((d->flags & HP__P_FUSED) && !s->fused) return false;
    if ((d->flags & HP__P_UNFUSED) && s->fused) return false;
    return true;
}
