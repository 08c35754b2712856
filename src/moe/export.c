/*
 * export.c — the inverse of the loader's layout mapping: a whole layer's canonical f32 arrays (parameters or
 * gradients, an hp_moe_grads) handed out tensor by tensor under the checkpoint's own names and shapes, for
 * `hyperpar train --grad-out / --out` and the training goldens (golden/README.md: grad.<name>).
 *
 *   canonical (hp_moe_grads)                      checkpoint tensor (per storage)
 *   d_w_router [E, H], d_b_router [E]          →  <p>gate.weight | <p>router.weight [E, H], router.bias [E]
 *   d_gate_up [E, 2I, H] rows 0..I-1 gate      →  per-expert <p>experts.e.{gate_proj|w1}.weight [I, H]
 *             rows I..2I-1 up                     per-expert <p>experts.e.{up_proj|w3}.weight   [I, H]
 *   d_down [E, H, I]                           →  per-expert <p>experts.e.{down_proj|w2}.weight [H, I]
 *                                                 batched    <p>experts.gate_up_proj [E, 2I, H], down_proj [E, H, I]
 *                                                 gpt-oss    <p>experts.gate_up_proj [E, H, 2I] (col 2j gate j,
 *                                                            2j+1 up j), down_proj [E, I, H] (transposed)
 *   d_b_gate_up [E, 2I], d_b_down [E, H]       →  gpt-oss    gate_up_proj_bias [E, 2I] (interleaved), down_proj_bias
 *   d_ws_gate_up [2sI, H], d_ws_down [H, sI]   →  <p>{shared_expert|shared_experts}.{gate,up,down}_proj.weight
 *   d_ws_gate [H]                              →  <p>shared_expert_gate.weight (stored [1, H])
 *
 * Names come from the model (hp_model_find_param), not from how the layer object was loaded, so a layer read
 * from a shard folder exports under the checkpoint's names. The export runs twice over the same list: a dry pass
 * that checks every name and shape against the model and marks the parameters it covers (a block tensor left
 * unmarked, other than gate.e_score_correction_bias, is refused by name), then the pass that calls fn. So fn
 * is never called for a layer that cannot be exported whole.
 */
#include "moe/moe_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct export_run {
    const hp_moe_layer *l;
    const hp_model *m;
    const hp_moe_grads *g;
    hp_moe_tensor_fn fn; /* NULL: the dry pass */
    void *ctx;
    hp_err *err;
    bool *covered;       /* [m->n_params]: the dry pass marks each parameter it emits */
    float *scratch;      /* gpt-oss: one tensor re-laid out at a time (real pass only) */
} export_run;

/* One tensor: its name is l->prefix + suffix; the model must hold it at exactly this shape. */
static hp_status emit(export_run *r, const char *suffix, const float *data, int n_dims, const int64_t *shape)
{
    char name[256];
    int k = snprintf(name, sizeof name, "%s%s", r->l->prefix, suffix);
    if (k < 0 || (size_t)k >= sizeof name)
        return hp_err_set(r->err, HP_ERR_INPUT, "tensor name '%s%s' is longer than %zu bytes", r->l->prefix, suffix,
                          sizeof name - 1);
    const hp_param *p = hp_model_find_param(r->m, name);
    if (!p)
        return hp_err_set(r->err, HP_ERR_INPUT,
                          "layer %lld: %s has no tensor '%s', which the layer's %s archetype exports; export the "
                          "layer against the model it was loaded from",
                          (long long)r->l->layer, r->m->path, name, hp_moe_archetype_name(r->l->archetype));
    bool same = p->n_dims == n_dims;
    for (int d = 0; same && d < n_dims; d++) same = p->shape[d] == shape[d];
    if (!same) {
        char want[96] = "", have[96] = "";
        for (int d = 0; d < n_dims; d++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", d ? ", " : "", (long long)shape[d]);
        for (int d = 0; d < p->n_dims && d < HP_MAX_DIMS; d++)
            snprintf(have + strlen(have), sizeof have - strlen(have), "%s%lld", d ? ", " : "", (long long)p->shape[d]);
        return hp_err_set(r->err, HP_ERR_INPUT,
                          "layer %lld: tensor '%s' is [%s] in %s but the arrays to export give it [%s]; the "
                          "gradients were gathered for another shape (whole layer: E=%lld, I=%lld, sI=%lld, H=%lld)",
                          (long long)r->l->layer, name, have, r->m->path, want, (long long)r->g->n_experts,
                          (long long)r->g->d_expert, (long long)r->g->d_shared, (long long)r->g->n_hidden);
    }
    if (!r->fn) {
        r->covered[p - r->m->params] = true;
        return HP_OK;
    }
    return r->fn(r->ctx, name, data, shape, n_dims, r->err);
}

/* The routed experts in whichever storage the model uses. */
static hp_status emit_experts(export_run *r)
{
    const hp_moe_grads *g = r->g;
    const int64_t E = g->n_experts, H = g->n_hidden, I = g->d_expert;
    char sfx[128], probe[256];
    hp_status st;
    snprintf(probe, sizeof probe, "%sexperts.gate_up_proj", r->l->prefix);
    bool batched = hp_model_find_param(r->m, probe) != NULL;
    if (batched && r->l->act != HP_MOE_ACT_GPTOSS) { /* already the canonical layout */
        const int64_t s_gu[3] = {E, 2 * I, H}, s_dn[3] = {E, H, I};
        if ((st = emit(r, "experts.gate_up_proj", g->d_gate_up, 3, s_gu))) return st;
        return emit(r, "experts.down_proj", g->d_down, 3, s_dn);
    }
    if (batched) { /* gpt-oss: interleave gate/up on the last axis, transpose down */
        const int64_t s_gu[3] = {E, H, 2 * I}, s_gub[2] = {E, 2 * I}, s_dn[3] = {E, I, H}, s_dnb[2] = {E, H};
        float *t = r->scratch;
        if (t)
            for (int64_t e = 0; e < E; e++)
                for (int64_t j = 0; j < I; j++)
                    for (int64_t h = 0; h < H; h++) {
                        t[(e * H + h) * 2 * I + 2 * j] = g->d_gate_up[(e * 2 * I + j) * H + h];
                        t[(e * H + h) * 2 * I + 2 * j + 1] = g->d_gate_up[(e * 2 * I + I + j) * H + h];
                    }
        if ((st = emit(r, "experts.gate_up_proj", t, 3, s_gu))) return st;
        if (t)
            for (int64_t e = 0; e < E; e++)
                for (int64_t j = 0; j < I; j++) {
                    t[e * 2 * I + 2 * j] = g->d_b_gate_up[e * 2 * I + j];
                    t[e * 2 * I + 2 * j + 1] = g->d_b_gate_up[e * 2 * I + I + j];
                }
        if ((st = emit(r, "experts.gate_up_proj_bias", t, 2, s_gub))) return st;
        if (t)
            for (int64_t e = 0; e < E; e++)
                for (int64_t i = 0; i < I; i++)
                    for (int64_t h = 0; h < H; h++) t[(e * I + i) * H + h] = g->d_down[(e * H + h) * I + i];
        if ((st = emit(r, "experts.down_proj", t, 3, s_dn))) return st;
        return emit(r, "experts.down_proj_bias", g->d_b_down, 2, s_dnb);
    }
    /* Per expert: transformers' gate_proj/up_proj/down_proj, or Mixtral's w1/w3/w2. The gate and up rows of
     * one expert are contiguous blocks of d_gate_up, and down is d_down's block: no copy. */
    static const char *names[2][3] = {{"gate_proj", "up_proj", "down_proj"}, {"w1", "w3", "w2"}};
    snprintf(probe, sizeof probe, "%sexperts.0.w1.weight", r->l->prefix);
    const int which = hp_model_find_param(r->m, probe) ? 1 : 0;
    const int64_t s_in[2] = {I, H}, s_out[2] = {H, I};
    for (int64_t e = 0; e < E; e++) {
        const float *gu = g->d_gate_up + e * 2 * I * H;
        const float *part[3] = {gu, gu + I * H, g->d_down + e * H * I};
        for (int p = 0; p < 3; p++) {
            snprintf(sfx, sizeof sfx, "experts.%lld.%s.weight", (long long)e, names[which][p]);
            if ((st = emit(r, sfx, part[p], 2, p < 2 ? s_in : s_out))) return st;
        }
    }
    return HP_OK;
}

/* Every tensor of the layer, in the order documented at hp_moe_layer_export. */
static hp_status emit_all(export_run *r)
{
    const hp_moe_layer *l = r->l;
    const hp_moe_grads *g = r->g;
    const int64_t E = g->n_experts, H = g->n_hidden, sI = g->d_shared;
    char probe[256];
    hp_status st;
    snprintf(probe, sizeof probe, "%sgate.weight", l->prefix);
    const bool gate = hp_model_find_param(r->m, probe) != NULL;
    const int64_t s_r[2] = {E, H};
    if ((st = emit(r, gate ? "gate.weight" : "router.weight", g->d_w_router, 2, s_r))) return st;
    if (g->d_b_router && (st = emit(r, gate ? "gate.bias" : "router.bias", g->d_b_router, 1, &E))) return st;
    if ((st = emit_experts(r))) return st;
    if (l->shared == HP_MOE_SHARED_NONE) return HP_OK;
    const char *mod = l->shared == HP_MOE_SHARED_GATED ? "shared_expert" : "shared_experts";
    const int64_t s_in[2] = {sI, H}, s_out[2] = {H, sI};
    char sfx[64];
    snprintf(sfx, sizeof sfx, "%s.gate_proj.weight", mod);
    if ((st = emit(r, sfx, g->d_ws_gate_up, 2, s_in))) return st;
    snprintf(sfx, sizeof sfx, "%s.up_proj.weight", mod);
    if ((st = emit(r, sfx, g->d_ws_gate_up + sI * H, 2, s_in))) return st;
    snprintf(sfx, sizeof sfx, "%s.down_proj.weight", mod);
    if ((st = emit(r, sfx, g->d_ws_down, 2, s_out))) return st;
    if (l->shared != HP_MOE_SHARED_GATED) return HP_OK;
    /* Qwen2-MoE stores the gate as a Linear(H, 1): [1, H]; a checkpoint holding it as [H] keeps its shape. */
    snprintf(probe, sizeof probe, "%sshared_expert_gate.weight", l->prefix);
    const hp_param *p = hp_model_find_param(r->m, probe);
    const int64_t s_g2[2] = {1, H};
    if (p && p->n_dims == 1) return emit(r, "shared_expert_gate.weight", g->d_ws_gate, 1, &H);
    return emit(r, "shared_expert_gate.weight", g->d_ws_gate, 2, s_g2);
}

/* whole against the layer: the whole-layer dimensions and exactly the arrays the archetype has. */
static hp_status check_whole(const hp_moe_layer *l, const hp_moe_grads *g, hp_err *err)
{
    const char *need = NULL, *extra = NULL;
    const bool gpt = l->act == HP_MOE_ACT_GPTOSS, brouter = l->router == HP_MOE_ROUTER_TOPK_SOFTMAX;
    const bool shared = l->shared != HP_MOE_SHARED_NONE, sgate = l->shared == HP_MOE_SHARED_GATED;
    if (g->n_hidden != l->n_hidden || g->n_experts != l->n_experts || g->n_local != l->n_experts ||
        g->d_expert < 1 || (shared ? g->d_shared < 1 : g->d_shared != 0))
        return hp_err_set(err, HP_ERR_INPUT,
                          "layer %lld: the arrays to export are of H=%lld, %lld of %lld experts, I=%lld, sI=%lld but "
                          "the layer has H=%lld and %lld experts%s; export takes the whole layer (gather the EP "
                          "ranks' experts and the tp blocks first)",
                          (long long)l->layer, (long long)g->n_hidden, (long long)g->n_local, (long long)g->n_experts,
                          (long long)g->d_expert, (long long)g->d_shared, (long long)l->n_hidden,
                          (long long)l->n_experts, shared ? " and a shared expert" : ", no shared expert");
    if (!g->d_gate_up) need = "d_gate_up";
    else if (!g->d_down) need = "d_down";
    else if (!g->d_w_router) need = "d_w_router";
    else if (brouter && !g->d_b_router) need = "d_b_router";
    else if (gpt && !g->d_b_gate_up) need = "d_b_gate_up";
    else if (gpt && !g->d_b_down) need = "d_b_down";
    else if (shared && !g->d_ws_gate_up) need = "d_ws_gate_up";
    else if (shared && !g->d_ws_down) need = "d_ws_down";
    else if (sgate && !g->d_ws_gate) need = "d_ws_gate";
    else if (!brouter && g->d_b_router) extra = "d_b_router";
    else if (!gpt && g->d_b_gate_up) extra = "d_b_gate_up";
    else if (!gpt && g->d_b_down) extra = "d_b_down";
    else if (!shared && (g->d_ws_gate_up || g->d_ws_down)) extra = "d_ws_gate_up / d_ws_down";
    else if (!sgate && g->d_ws_gate) extra = "d_ws_gate";
    if (need)
        return hp_err_set(err, HP_ERR_INPUT, "layer %lld: %s is NULL but archetype %s has that parameter",
                          (long long)l->layer, need, hp_moe_archetype_name(l->archetype));
    if (extra)
        return hp_err_set(err, HP_ERR_INPUT,
                          "layer %lld: %s is given but archetype %s has no such parameter; it would not be exported",
                          (long long)l->layer, extra, hp_moe_archetype_name(l->archetype));
    int64_t n;
    if (g->d_expert > INT64_MAX / 2 || g->d_shared > INT64_MAX / 2 ||
        !hp_mul_i64(g->n_experts, 2 * g->d_expert, &n) || !hp_mul_i64(n, g->n_hidden, &n) ||
        (uint64_t)n > SIZE_MAX / sizeof(float) || !hp_mul_i64(2 * g->d_shared, g->n_hidden, &n))
        return hp_err_set(err, HP_ERR_INPUT, "layer %lld: E=%lld, I=%lld, sI=%lld, H=%lld overflow a size",
                          (long long)l->layer, (long long)g->n_experts, (long long)g->d_expert,
                          (long long)g->d_shared, (long long)g->n_hidden);
    return HP_OK;
}

hp_status hp_moe_layer_export(const hp_moe_layer *l, const hp_model *m, const hp_moe_grads *whole,
                              hp_moe_tensor_fn fn, void *ctx, hp_err *err)
{
    hp_status st = check_whole(l, whole, err);
    if (st) return st;
    export_run r = {.l = l, .m = m, .g = whole, .fn = NULL, .ctx = ctx, .err = err};
    if (!(r.covered = hp_calloc(m->n_params ? m->n_params : 1, sizeof *r.covered)))
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    if ((st = emit_all(&r))) goto out;
    /* Every other tensor of the block would be left out of the gradients: refuse it by name. */
    const size_t np = strlen(l->prefix);
    static const char nograd[] = "gate.e_score_correction_bias";
    for (size_t i = 0; i < m->n_params; i++) {
        const char *name = m->params[i].name;
        if (r.covered[i] || strncmp(name, l->prefix, np) || !strcmp(name + np, nograd)) continue;
        st = hp_err_set(err, HP_ERR_INPUT,
                        "layer %lld: tensor '%s' of %s belongs to the block but archetype %s has no array for it, so "
                        "its gradient would be missing; choose the archetype that matches the checkpoint",
                        (long long)l->layer, name, m->path, hp_moe_archetype_name(l->archetype));
        goto out;
    }
    if (l->act == HP_MOE_ACT_GPTOSS) { /* the largest re-laid-out tensor is gate_up [E, H, 2I] */
        int64_t n = whole->n_experts * 2 * whole->d_expert * whole->n_hidden; /* checked by check_whole */
        if (!(r.scratch = malloc((size_t)n * sizeof *r.scratch))) {
            st = hp_err_set(err, HP_ERR_NOMEM, "out of memory exporting layer %lld", (long long)l->layer);
            goto out;
        }
    }
    r.fn = fn;
    st = emit_all(&r);
out:
    free(r.scratch);
    free(r.covered);
    return st;
}
