/*
 * held.c — a rank's weights as hyperpar's runtime holds them (docs/cost.md "Weights per rank"), which is what
 * `hyperpar run --stats-json` and `hyperpar train --stats-json` count as resident_bytes.
 *
 * The shard layout gives each tensor's bytes as stored, and the runtime holds some tensors otherwise. Its dense
 * steps (src/run/runner.c) keep f32 matrices and, in inference, bf16 matrices as stored; they widen every vector
 * (norm weights, biases) and every other dtype to f32. Training widens bf16 matrices too, because in exact compute
 * (train's default, and the only compute cost models) the forward reads the f32 master. Its MoE blocks
 * (src/moe/load.c) hold the router and its biases in f64, the routed experts in bf16 (inference) or f32 with their
 * biases in f32, and the shared expert and its gate in f32. Under TP-extend-EP the shared expert is whole on every
 * rank although the layout cuts it over tp, because each rank runs it on its own rows (runner.c's load_moe). A
 * tensor the program does not read is not loaded at all.
 */
#include "cost/cost_int.h"

#include "hyperpar/moe.h"
#include "model/model_int.h"

#include <stdlib.h>
#include <string.h>

static bool ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && !strcmp(s + n - k, tail);
}

/* How the MoE loader holds tensor rel (its name below the block) of block y: its bytes per element in inference and
 * in training into el, left 0 when the block's archetype does not read it. */
static void moe_held(const hp_model *m, const hp__step *y, const char *rel, hp_dtype dt, hp__cost_held *h)
{
    hp_moe_archetype a = (hp_moe_archetype)y->archetype;
    if (y->archetype < 0 && !hp_moe_archetype_parse(hp_model_suggested_archetype(m), &a)) return;
    hp_moe_router_kind rk = hp_moe_archetype_router(a);
    hp_moe_shared_kind sk = hp_moe_archetype_shared(a);
    const char *mod = sk == HP_MOE_SHARED_GATED ? "shared_expert." : "shared_experts.";
    uint8_t el = 0, el_train = 0;
    if (!strcmp(rel, "gate.weight") || !strcmp(rel, "router.weight"))
        el = 8;
    else if (!strcmp(rel, "gate.e_score_correction_bias"))
        el = rk == HP_MOE_ROUTER_SIGMOID_GROUP ? 8 : 0;
    else if (!strcmp(rel, "gate.bias") || !strcmp(rel, "router.bias"))
        el = rk == HP_MOE_ROUTER_TOPK_SOFTMAX ? 8 : 0;
    else if (!strncmp(rel, "experts.", 8) && ends_with(rel, "_bias"))
        el = hp_moe_archetype_act(a) == HP_MOE_ACT_GPTOSS ? 4 : 0;
    else if (!strncmp(rel, "experts.", 8))
        el = dt == HP_DT_BF16 ? 2 : 4, el_train = 4;
    else if (!strcmp(rel, "shared_expert_gate.weight"))
        el = sk == HP_MOE_SHARED_GATED ? 4 : 0;
    else if (sk != HP_MOE_SHARED_NONE && !strncmp(rel, mod, strlen(mod)))
        el = 4, h->whole = !y->split;
    h->el[0] = el;
    h->el[1] = el_train ? el_train : el;
}

/* How dense step y holds tensor rel: not at all when the op's parameter table (exec/prog.h) has no such entry, 4
 * bytes for a vector or a widened matrix, and the stored 2 for a bf16 matrix in inference. */
static void dense_held(const hp__prog *g, const hp__step *y, const char *rel, hp_dtype dt, hp__cost_held *h)
{
    size_t n;
    const hp__pdef *d = hp__op_params(y->op, &n);
    for (size_t i = 0; i < n; i++) {
        if (strcmp(d[i].rel, rel) || !hp__pdef_on(&d[i], g, y)) continue;
        h->el[0] = dt == HP_DT_BF16 && !(d[i].flags & HP__P_VEC) ? 2 : 4;
        h->el[1] = 4;
        return;
    }
}

hp_status hp__cost_held_plan(const hp_model *m, const hp__prog *g, const hp_shard_layout *L, hp__cost_held **out,
                             hp_err *err)
{
    *out = NULL;
    int *step_of = hp_calloc(m->n_params + 1, sizeof *step_of);
    hp__cost_held *held = hp_calloc(L->n_tensors + 1, sizeof *held);
    if (!step_of || !held) {
        free(step_of);
        free(held);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    }
    /* Each parameter's step: the first in the program's order whose module holds it (a residual names the branch
     * it adds, whose own step comes first). */
    for (size_t k = 0; k < m->n_params; k++) step_of[k] = -1;
    for (size_t i = g->n_steps; i-- > 0;) {
        const char *f = g->steps[i].c.fqn;
        int mi = f && *f && g->steps[i].op != HP__OP_RESIDUAL ? hp_model_find_module(m, f) : -1;
        for (int k = mi >= 0 ? m->modules[mi].subtree_first : 0; mi >= 0 && k < m->modules[mi].subtree_end; k++)
            step_of[k] = (int)i;
    }
    for (size_t i = 0; i < L->n_tensors; i++) {
        const hp_shard_tensor *t = &L->tensors[i];
        int si = step_of[t->params[0]];
        if (si < 0) continue;
        const hp__step *y = &g->steps[si];
        const char *rel = m->params[t->params[0]].name + strlen(y->c.fqn) + 1;
        if (y->op == HP__OP_MOE) moe_held(m, y, rel, t->dtype, &held[i]);
        else dense_held(g, y, rel, t->dtype, &held[i]);
    }
    free(step_of);
    *out = held;
    return HP_OK;
}

hp_status hp__cost_held_of(const hp_model *m, const hp_plan *p, const hp_shard_layout *L, hp__cost_held **out,
                           hp_err *err)
{
    *out = NULL;
    hp__prog g = {0};
    char cfg[4200];
    hp_status st = hp__prog_build(&g, m, p, NULL, hp__model_config_path(m, cfg, sizeof cfg), err);
    if (st == HP_OK) st = hp__cost_held_plan(m, &g, L, out, err);
    hp__prog_free(&g);
    return st;
}

hp_status hp__cost_held_rank(const hp_model *m, const hp_shard_layout *L, const hp__cost_held *h, bool train,
                             int64_t rk, uint64_t *out, hp_err *err)
{
    uint64_t b = L->ranks[rk].nbytes;
    for (size_t i = 0; i < L->n_tensors; i++) {
        uint8_t el = h[i].el[train];
        if (!h[i].whole && (int)el * 8 == hp_dtype_bits(L->tensors[i].dtype)) continue; /* held as stored */
        hp_shard_tensor t;
        hp_status st = hp_shard_rank_tensor(L, rk, i, &t, err);
        if (st != HP_OK) return st;
        if (t.absent) continue; /* another pipeline stage's */
        uint64_t n = 1;
        for (int d = 0; d < t.n_dims; d++) n *= (uint64_t)t.local_shape[d];
        if (h[i].whole) n = (uint64_t)m->params[t.params[0]].n_elems;
        /* A model's elements number far below 2^61, so at 8 bytes each the held bytes fit 64 bits. */
        b = b - t.nbytes + n * el;
    }
    *out = b;
    return HP_OK;
}
