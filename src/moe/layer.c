/*
 * layer.c — the sparse layer object: its lifecycle, the router settings every layer must satisfy, and
 * layers built in memory (benchmarks, tests).
 *
 * A layer owns its router (f64), its shared expert and, through hp__moe_owned, the expert weights it
 * copied; zero-copy expert weights point into a checkpoint mapping or into a shard rank file the layer
 * keeps open (hp__moe_owned.rf). Loading from files is load.c's job; both it and hp_moe_layer_create end
 * in the same invariants: K in [1, E], E % n_group == 0, topk_group in [1, n_group], and the local range
 * [first_expert, first_expert + n_local) inside [0, E).
 */
#include "moe/moe_internal.h"

#include <float.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperpar/shard.h"

void hp_moe_load_opts_default(hp_moe_load_opts *o)
{
    memset(o, 0, sizeof *o);
    o->archetype = -1;
}

void hp_moe_layer_free(hp_moe_layer *l)
{
    if (!l) return;
    hp__moe_owned *ow = l->owned;
    if (ow) {
        free(ow->w_gate_up);
        free(ow->b_gate_up);
        free(ow->w_down);
        free(ow->b_down);
        hp_shard_rank_close(ow->rf);
        free(ow);
    }
    free(l->w_router);
    free(l->b_router);
    free(l->b_correction);
    free(l->ws_gate_up);
    free(l->ws_down);
    free(l->ws_gate);
    free(l);
}

uint64_t hp_moe_layer_expert_bytes(const hp_moe_layer *l)
{
    size_t el = l->w_dtype == HP_DT_BF16 ? 2 : sizeof(float);
    return (uint64_t)l->n_local * (uint64_t)(3 * l->d_expert) * (uint64_t)l->n_hidden * el;
}

uint64_t hp_moe_layer_resident_bytes(const hp_moe_layer *l)
{
    const uint64_t E = (uint64_t)l->n_experts, H = (uint64_t)l->n_hidden, n = (uint64_t)l->n_local;
    const uint64_t I = (uint64_t)l->d_expert, sI = (uint64_t)l->d_shared, f = sizeof(float), d = sizeof(double);
    uint64_t b = hp_moe_layer_expert_bytes(l);
    b += l->w_router ? E * H * d : 0;
    b += l->b_router ? E * d : 0;
    b += l->b_correction ? E * d : 0;
    b += l->b_gate_up ? n * 2 * I * f : 0;
    b += l->b_down ? n * H * f : 0;
    b += l->ws_gate_up ? 2 * sI * H * f : 0;
    b += l->ws_down ? H * sI * f : 0;
    b += l->ws_gate ? H * f : 0;
    return b;
}

hp_status hp__moe_layer_check_router(const hp_moe_layer *l, hp_err *err)
{
    if (l->top_k < 1 || l->top_k > l->n_experts)
        return hp_err_set(err, HP_ERR_INPUT, "num_experts_per_tok (%lld) must be between 1 and the %lld experts",
                          (long long)l->top_k, (long long)l->n_experts);
    if (l->router != HP_MOE_ROUTER_SIGMOID_GROUP) return HP_OK;
    /* The weights are scores in [0, 1] (renormalised: summing to 1) times the factor, rounded to f32. */
    if (!(l->routed_scaling_factor <= FLT_MAX))
        return hp_err_set(err, HP_ERR_INPUT,
                          "routed_scaling_factor %.3g (config.json) takes the routing weights past f32's range "
                          "(3.4e38), so every output would be non-finite; use the model's real factor (DeepSeek-V3: "
                          "2.5, GLM-4.5: 2.5)",
                          l->routed_scaling_factor);
    if (l->n_group < 1 || l->n_experts % l->n_group)
        return hp_err_set(err, HP_ERR_INPUT, "n_group (%lld) must divide the %lld routed experts",
                          (long long)l->n_group, (long long)l->n_experts);
    if (l->topk_group < 1 || l->topk_group > l->n_group)
        return hp_err_set(err, HP_ERR_INPUT, "topk_group (%lld) must be between 1 and n_group (%lld)",
                          (long long)l->topk_group, (long long)l->n_group);
    if (l->topk_group * (l->n_experts / l->n_group) < l->top_k)
        return hp_err_set(err, HP_ERR_INPUT,
                          "topk_group (%lld) groups of %lld experts cannot supply num_experts_per_tok = %lld",
                          (long long)l->topk_group, (long long)(l->n_experts / l->n_group), (long long)l->top_k);
    return HP_OK;
}

hp_status hp__moe_layer_set_range(hp_moe_layer *l, int64_t first, int64_t n_local, hp_err *err)
{
    if (first >= 0 && first <= l->n_experts && n_local == 0) n_local = l->n_experts - first;
    /* n_local > E - first rather than first + n_local > E: the sum of two caller values may overflow. */
    if (first < 0 || first > l->n_experts || n_local < 1 || n_local > l->n_experts - first)
        return hp_err_set(err, HP_ERR_INPUT, "local expert range [%lld, %lld) is outside the layer's %lld experts",
                          (long long)first, (long long)((uint64_t)first + (uint64_t)n_local), (long long)l->n_experts);
    l->first_expert = first;
    l->n_local = n_local;
    return HP_OK;
}

void hp__moe_layer_apply_archetype(hp_moe_layer *l, hp_moe_archetype a)
{
    const hp__moe_archetype_info *info = hp__moe_archetype_info_of(a);
    l->archetype = a;
    l->router = info->router;
    l->shared = info->shared;
    l->act = info->act;
    l->swiglu_alpha = 1.702f;
    l->swiglu_limit = 7.0f;
}

hp_status hp_moe_layer_create(hp_moe_layer **out, hp_moe_archetype a, const hp_moe_dims *d, hp_err *err)
{
    *out = NULL;
    if ((int)a < 0 || a >= HP_MOE_ARCHETYPE_COUNT)
        return hp_err_set(err, HP_ERR_INPUT, "unknown archetype %d; known: %s", (int)a, hp_moe_archetype_list());
    if (d->n_hidden < 1 || d->n_experts < 1 || d->d_expert < 1 || d->d_shared < 0)
        return hp_err_set(err, HP_ERR_INPUT, "layer dimensions must be positive (H %lld, E %lld, I %lld)",
                          (long long)d->n_hidden, (long long)d->n_experts, (long long)d->d_expert);
    hp_moe_layer *l = hp_calloc(1, sizeof *l);
    hp__moe_owned *ow = hp_calloc(1, sizeof *ow);
    if (!l || !ow) {
        free(l);
        free(ow);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    }
    l->owned = ow;
    l->layer = -1;
    hp__moe_layer_apply_archetype(l, a);
    l->n_hidden = d->n_hidden;
    l->n_experts = d->n_experts;
    l->top_k = d->top_k;
    l->d_expert = d->d_expert;
    l->n_group = d->n_group > 0 ? d->n_group : 1;
    l->topk_group = d->topk_group > 0 ? d->topk_group : 1;
    l->routed_scaling_factor = d->routed_scaling_factor > 0 ? d->routed_scaling_factor : 1.0;
    l->norm_topk_prob = d->norm_topk_prob;
    l->storage = "memory";
    l->dtype = HP_DT_F32;
    snprintf(l->prefix, sizeof l->prefix, "(memory).");
    hp_status st = hp__moe_layer_check_router(l, err);
    if (!st) st = hp__moe_layer_set_range(l, d->first_expert, d->n_local, err);
    if (st) {
        hp_moe_layer_free(l);
        return st;
    }
    int64_t H = l->n_hidden, E = l->n_experts, I = l->d_expert, n = l->n_local;
    int64_t sI = l->shared != HP_MOE_SHARED_NONE ? d->d_shared : 0;
    /* Every element count, overflow-checked before anything is allocated. */
    int64_t n_router, n_gu, n_dn, n_bgu, n_bd, n_sgu, n_sdn;
    bool fits = I <= INT64_MAX / 2 && hp_mul_i64(E, H, &n_router) && hp_mul_i64(n, 2 * I, &n_bgu) &&
                hp_mul_i64(n_bgu, H, &n_gu) && hp_mul_i64(n, H, &n_bd) && hp_mul_i64(n_bd, I, &n_dn) &&
                hp_mul_i64(sI, H, &n_sdn) && hp_mul_i64(2, n_sdn, &n_sgu);
    if (!fits) {
        hp_moe_layer_free(l);
        return hp_err_set(err, HP_ERR_INPUT,
                          "layer dimensions overflow a size (H %lld, E %lld, I %lld, shared %lld, %lld local experts)",
                          (long long)H, (long long)E, (long long)I, (long long)sI, (long long)n);
    }
    size_t el = d->bf16_weights ? sizeof(uint16_t) : sizeof(float);
    l->w_dtype = d->bf16_weights ? HP_DT_BF16 : HP_DT_F32;
    l->dtype = l->w_dtype;
    bool ok = true;
    ok = (l->w_router = hp__moe_alloc_f64(n_router)) && (ow->w_gate_up = hp__moe_alloc(n_gu, el, &ok)) &&
         (ow->w_down = hp__moe_alloc(n_dn, el, &ok));
    if (ok && l->router == HP_MOE_ROUTER_TOPK_SOFTMAX) ok = (l->b_router = hp__moe_alloc_f64(E)) != NULL;
    if (ok && l->router == HP_MOE_ROUTER_SIGMOID_GROUP) ok = (l->b_correction = hp__moe_alloc_f64(E)) != NULL;
    if (ok && l->act == HP_MOE_ACT_GPTOSS)
        ok = (ow->b_gate_up = hp__moe_alloc_f32(n_bgu)) && (ow->b_down = hp__moe_alloc_f32(n_bd));
    if (ok && sI > 0) {
        l->d_shared = sI;
        ok = (l->ws_gate_up = hp__moe_alloc_f32(n_sgu)) && (l->ws_down = hp__moe_alloc_f32(n_sdn));
        if (ok && l->shared == HP_MOE_SHARED_GATED) ok = (l->ws_gate = hp__moe_alloc_f32(H)) != NULL;
    }
    if (!ok) {
        hp_moe_layer_free(l);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory building a layer with %lld local experts of %lld x %lld",
                          (long long)n, (long long)I, (long long)H);
    }
    l->w_gate_up = ow->w_gate_up;
    l->w_down = ow->w_down;
    l->b_gate_up = ow->b_gate_up;
    l->b_down = ow->b_down;
    *out = l;
    return HP_OK;
}
