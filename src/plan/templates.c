/*
 * templates.c — Phase 4: the eight boundary templates, role -> parameter placement, and spec building.
 *
 * A template (spec §6.2) fixes a boundary's I/O contract with and without sequence parallelism; every cell
 * declares tp / cp / ep. Parameters get placements from their roles (§6.3). Notation below: R Replicate,
 * P Partial, S1 Shard(1), SL Shard(-1).
 *
 *   template          in key          SP: in_src  in_dst  out_src out_dst   no SP: in_src in_dst out_src out_dst
 *   attention, mlp    hidden_states       S1/S1/R R/S1/R  P/S1/R  S1/S1/R          R/S1/R R/S1/R P/S1/R  R/S1/R
 *   norm              hidden_states       S1/S1/R (all four)                       R/S1/R (all four)
 *   embed             input               R/S1/R  R/S1/R  P/S1/R  S1/S1/R          R/S1/R R/S1/R P/S1/R  R/S1/R
 *   lm_head           hidden_states       S1/S1/R R/S1/R  SL/S1/R SL/S1/R          R/S1/R R/S1/R SL/S1/R R/S1/R
 *   moe_gate          hidden_states       S1/S1/R R/R/R   R/R/R   R/R/S0           R/S1/R R/R/R  R/R/R   R/R/S0
 *   moe_mlp           x_BLD               as mlp; region_dispatch false
 */
#include <ctype.h>
#include <string.h>

#include "plan/planner_int.h"

#define R_ {HP_PL_R, 0}
#define P_ {HP_PL_P, 0}
#define S0 {HP_PL_S, 0}
#define S1 {HP_PL_S, 1}
#define SL {HP_PL_S, -1}
#define NP(tp, cp, ep) {{tp, cp, ep}}

typedef struct tmpl {
    hp_btype type;
    const char *in_key;
    hp_nplace sp[4];   /* in_src, in_dst, out_src, out_dst */
    hp_nplace nosp[4];
    int8_t region_dispatch;
    bool needs_cp_attn;
} tmpl;

#define DENSE_SP {NP(S1, S1, R_), NP(R_, S1, R_), NP(P_, S1, R_), NP(S1, S1, R_)}
#define DENSE_NOSP {NP(R_, S1, R_), NP(R_, S1, R_), NP(P_, S1, R_), NP(R_, S1, R_)}

static const tmpl g_templates[] = {
    {HP_BT_ATTENTION, "hidden_states", DENSE_SP, DENSE_NOSP, -1, true},
    {HP_BT_LINEAR_ATTENTION, "hidden_states", DENSE_SP, DENSE_NOSP, -1, true},
    {HP_BT_MLP, "hidden_states", DENSE_SP, DENSE_NOSP, -1, false},
    {HP_BT_NORM, "hidden_states", {NP(S1, S1, R_), NP(S1, S1, R_), NP(S1, S1, R_), NP(S1, S1, R_)},
     {NP(R_, S1, R_), NP(R_, S1, R_), NP(R_, S1, R_), NP(R_, S1, R_)}, -1, false},
    {HP_BT_EMBED, "input", {NP(R_, S1, R_), NP(R_, S1, R_), NP(P_, S1, R_), NP(S1, S1, R_)}, DENSE_NOSP, -1, false},
    {HP_BT_LM_HEAD, "hidden_states", {NP(S1, S1, R_), NP(R_, S1, R_), NP(SL, S1, R_), NP(SL, S1, R_)},
     {NP(R_, S1, R_), NP(R_, S1, R_), NP(SL, S1, R_), NP(R_, S1, R_)}, -1, false},
    {HP_BT_MOE_GATE, "hidden_states", {NP(S1, S1, R_), NP(R_, R_, R_), NP(R_, R_, R_), NP(R_, R_, S0)},
     {NP(R_, S1, R_), NP(R_, R_, R_), NP(R_, R_, R_), NP(R_, R_, S0)}, -1, false},
    {HP_BT_MOE_MLP, "x_BLD", DENSE_SP, DENSE_NOSP, 0, false},
};

static const tmpl *find_template(hp_btype t)
{
    for (size_t i = 0; i < sizeof g_templates / sizeof *g_templates; i++)
        if (g_templates[i].type == t) return &g_templates[i];
    return NULL;
}

bool hp__has_template(hp_btype t) { return find_template(t) != NULL; }

bool hp__rowwise_by_name(const char *rel)
{
    return hp_contains_ci(rel, "w2") || hp_contains_ci(rel, "down_proj") || hp_contains_ci(rel, "down.");
}

hp_placement hp__expert_tp_placement(const char *rel, int ndim, bool transposed)
{
    bool row = hp__rowwise_by_name(rel);
    if (transposed) {
        /* gpt-oss stores [E, in, out] for x @ W: gate_up [E, H, 2I] splits its output dim 2 (gate/up pairs
         * are adjacent, so a contiguous split keeps them together), down [E, I, H] its input dim 1; the
         * gate_up bias [E, 2I] follows its output dim, the down bias [E, H] is whole on every rank. */
        size_t n = strlen(rel);
        if (n >= 5 && strcmp(rel + n - 5, "_bias") == 0) return row ? hp_pl_r() : hp_pl_s(1);
        return hp_pl_s(row ? 1 : 2);
    }
    if (ndim >= 3) return hp_pl_s(row ? 2 : 1); /* D-08: stacked [E, out, in] */
    return hp_pl_s(row ? 1 : 0);
}

/* §6.3. has_tp / has_ep: the axis is a mesh dim (ep only in old-style EP). Returns false for SPECIAL/SKIP. */
bool hp__placement_for_role(hp_role role, const char *rel, int ndim, bool has_tp, bool has_ep, bool transposed,
                            hp_nplace *out)
{
    memset(out, 0, sizeof *out);
    out->ax[HP_AXIS_CP] = hp_pl_r();
    out->ax[HP_AXIS_EP] = hp_pl_r();
    hp_placement *tp = &out->ax[HP_AXIS_TP];
    switch (role) {
    case HP_ROLE_COLWISE:
    case HP_ROLE_EMBED:
    case HP_ROLE_LM_HEAD:
    case HP_ROLE_FUSED_QKV:
    case HP_ROLE_FUSED_GATE_UP:
        if (has_tp) *tp = hp_pl_s(0);
        return true;
    case HP_ROLE_ROWWISE:
        if (has_tp) *tp = hp_pl_s(1);
        return true;
    case HP_ROLE_NORM:
    case HP_ROLE_MOE_GATE:
        if (has_tp) *tp = hp_pl_r();
        return true;
    case HP_ROLE_MOE_EXPERT:
        *tp = has_tp ? hp__expert_tp_placement(rel, ndim, transposed) : hp_pl_r();
        out->ax[HP_AXIS_EP] = has_ep ? hp_pl_s(0) : (hp_placement){HP_PL_ABSENT, 0};
        return true;
    case HP_ROLE_SHARED_EXPERT:
        if (has_tp) *tp = hp_pl_s(hp__rowwise_by_name(rel) ? 1 : 0);
        return true;
    case HP_ROLE_BIAS:
    case HP_ROLE_REPLICATED:
        *tp = hp_pl_r();
        return true;
    case HP_ROLE_SPECIAL:
    case HP_ROLE_SKIP:
    case HP_ROLE_COUNT:
        return false;
    }
    return false;
}

static void io_single(hp_io_map *m, const char *name, hp_nplace pl)
{
    memset(m, 0, sizeof *m);
    m->n = 1;
    snprintf(m->e[0].name, sizeof m->e[0].name, "%s", name);
    m->e[0].pl = pl;
}

/* The placements of the last few name templates of one boundary's subtree: §6.3's role and name tests never
 * look at an index segment, and below the anchor a parameter's path relative to it has the same template
 * whenever its full name has (the anchor's name is a whole-segment prefix of both). */
#define PL_SEEN 8
typedef struct pl_seen {
    uint32_t id[PL_SEEN];
    int ndim[PL_SEEN];
    hp_role role[PL_SEEN];
    bool ok[PL_SEEN];
    hp_nplace pl[PL_SEEN];
    int n, next;
} pl_seen;

/* hp__placement_for_role of parameter i (rel its path in b), looked up in seen when id is a template id. */
static bool place_param(pl_seen *seen, uint32_t id, hp_role role, const char *rel, int ndim, bool has_tp,
                        bool has_ep, bool transposed, hp_nplace *out)
{
    for (int k = 0; id != UINT32_MAX && k < seen->n; k++)
        if (seen->id[k] == id && seen->ndim[k] == ndim && seen->role[k] == role) {
            *out = seen->pl[k];
            return seen->ok[k];
        }
    bool ok = hp__placement_for_role(role, rel, ndim, has_tp, has_ep, transposed, out);
    if (id == UINT32_MAX) return ok;
    int k = seen->n < PL_SEEN ? seen->n++ : seen->next++ % PL_SEEN;
    seen->id[k] = id, seen->ndim[k] = ndim, seen->role[k] = role, seen->ok[k] = ok, seen->pl[k] = *out;
    return ok;
}

/* Builds boundary b (type already set, b->module its anchor or -1) from its template; params listed by model
 * index with roles. */
hp_status hp__build_from_template(hp_plan *p, hp_boundary *b, const int *param_idx, int n, hp__memo *memo,
                                  hp_err *err)
{
    const tmpl *t = find_template(b->type);
    HP_ASSERT(t != NULL);
    const hp_model *m = p->model;
    const bool has_tp = hp__plan_has_dim(p, HP_AXIS_TP), has_ep = hp__plan_has_dim(p, HP_AXIS_EP);
    const bool has_cp = hp__plan_has_dim(p, HP_AXIS_CP);
    size_t skip = b->fqn[0] ? strlen(b->fqn) + 1 : 0;

    b->params = hp_arena_alloc(&p->arena, (size_t)(n ? n : 1) * sizeof *b->params);
    if (!b->params) return hp_err_set(err, HP_ERR_NOMEM, "out of memory building boundary '%s'", b->fqn);
    b->n_params = 0;
    const bool transposed = hp_family_experts_transposed(m->family);
    const hp_module *anchor = b->module >= 0 ? &m->modules[b->module] : NULL;
    pl_seen seen = {0};
    for (int i = 0; i < n; i++) {
        const hp_param *par = &m->params[param_idx[i]];
        const char *rel = par->name + skip;
        bool below = anchor && param_idx[i] >= anchor->subtree_first && param_idx[i] < anchor->subtree_end;
        uint32_t id = below ? hp__memo_param_id(memo, (size_t)param_idx[i]) : UINT32_MAX;
        hp_nplace pl;
        if (!place_param(&seen, id, p->roles[param_idx[i]], rel, par->n_dims, has_tp, has_ep, transposed, &pl))
            continue;
        b->params[b->n_params].rel = rel;
        b->params[b->n_params].pl = pl;
        b->params[b->n_params].param1 = param_idx[i] + 1;
        b->n_params++;
    }

    const hp_nplace *c = p->sequence_parallel ? t->sp : t->nosp;
    io_single(&b->in_src, t->in_key, c[0]);
    io_single(&b->in_dst, t->in_key, c[1]);
    io_single(&b->out_src, "output", c[2]);
    io_single(&b->out_dst, "output", c[3]);
    if (b->type == HP_BT_LM_HEAD) {
        /* §6.4 step 3: CP S1 only when cp is a mesh dim; out fields follow loss_parallel. */
        hp_placement cp_p = has_cp ? hp_pl_s(1) : hp_pl_r();
        b->in_src.e[0].pl.ax[HP_AXIS_CP] = cp_p;
        b->in_dst.e[0].pl.ax[HP_AXIS_CP] = cp_p;
        hp_nplace os = {{hp_pl_s(-1), cp_p, hp_pl_r()}};
        hp_nplace od = {{p->loss_parallel ? hp_pl_s(-1) : hp_pl_r(), cp_p, hp_pl_r()}};
        b->out_src.e[0].pl = os;
        b->out_dst.e[0].pl = od;
    } else if (b->type == HP_BT_EMBED && has_cp) {
        /* §6.4 step 4 (D-05): input ids arrive CP-sharded and must not be re-scattered. */
        hp_nplace in = {{hp_pl_r(), hp_pl_s(1), hp_pl_r()}};
        io_single(&b->in_src, "input", in);
        io_single(&b->in_dst, "input", in);
        hp_nplace os = {{hp_pl_p(), hp_pl_s(1), hp_pl_r()}};
        b->out_src.e[0].pl = os;
    }
    b->region_dispatch = t->region_dispatch;
    b->needs_cp_attn = t->needs_cp_attn;
    b->is_boundary = true;
    return HP_OK;
}
