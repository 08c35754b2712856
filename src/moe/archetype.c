/*
 * archetype.c — the EP compute archetypes of spec §10.2 as data: router kind, shared-expert kind,
 * activation and the child modules the interface assertion requires.
 *
 * The archetype is chosen by the caller (CLI --archetype, a plan's local_compute_fn, or the family's
 * suggestion); nothing here compares family names. The loader (load.c) checks the layer's children
 * against `needs` before reading any tensor.
 */
#include "moe/moe_internal.h"

#include <string.h>

static const hp__moe_archetype_info g_info[HP_MOE_ARCHETYPE_COUNT] = {
    [HP_MOE_ROUTED_ONLY_SOFTMAX_TOPK] = {"routed_only_softmax_topk", HP_MOE_ROUTER_SOFTMAX_TOPK,
                                         HP_MOE_SHARED_NONE, HP_MOE_ACT_SWIGLU, HP__NORM_DEFAULT_TRUE,
                                         {"gate|router", "experts"}},
    [HP_MOE_MIXTRAL_TOPK_ROUTER] = {"mixtral_topk_router", HP_MOE_ROUTER_SOFTMAX_TOPK, HP_MOE_SHARED_NONE,
                                    HP_MOE_ACT_SWIGLU, HP__NORM_ALWAYS, {"gate", "experts"}},
    [HP_MOE_QWEN2MOE_SHARED_EXPERT_GATE] = {"qwen2moe_shared_expert_gate", HP_MOE_ROUTER_SOFTMAX_TOPK,
                                            HP_MOE_SHARED_GATED, HP_MOE_ACT_SWIGLU, HP__NORM_CONFIG,
                                            {"gate", "experts", "shared_expert", "shared_expert_gate"}},
    [HP_MOE_DEEPSEEKV3_SIGMOID_GROUP_SHARED] = {"deepseekv3_sigmoid_group_shared", HP_MOE_ROUTER_SIGMOID_GROUP,
                                                HP_MOE_SHARED_PLAIN, HP_MOE_ACT_SWIGLU, HP__NORM_CONFIG,
                                                {"gate", "experts", "shared_experts"}},
    [HP_MOE_QWEN3MOE_TOPK_ROUTER] = {"qwen3moe_topk_router", HP_MOE_ROUTER_SOFTMAX_TOPK, HP_MOE_SHARED_NONE,
                                     HP_MOE_ACT_SWIGLU, HP__NORM_CONFIG, {"gate", "experts"}},
    [HP_MOE_GPTOSS_TOPK_ROUTER] = {"gptoss_topk_router", HP_MOE_ROUTER_TOPK_SOFTMAX, HP_MOE_SHARED_NONE,
                                   HP_MOE_ACT_GPTOSS, HP__NORM_NEVER, {"router", "experts"}},
};

const hp__moe_archetype_info *hp__moe_archetype_info_of(hp_moe_archetype a)
{
    HP_ASSERT((int)a >= 0 && a < HP_MOE_ARCHETYPE_COUNT);
    return &g_info[a];
}

const char *hp_moe_archetype_name(hp_moe_archetype a)
{
    return ((int)a >= 0 && a < HP_MOE_ARCHETYPE_COUNT) ? g_info[a].name : "?";
}

bool hp_moe_archetype_parse(const char *name, hp_moe_archetype *out)
{
    for (int a = 0; a < HP_MOE_ARCHETYPE_COUNT; a++)
        if (name && !strcmp(name, g_info[a].name)) {
            *out = (hp_moe_archetype)a;
            return true;
        }
    return false;
}

const char *hp_moe_archetype_list(void)
{
    return "routed_only_softmax_topk, mixtral_topk_router, qwen2moe_shared_expert_gate, "
           "deepseekv3_sigmoid_group_shared, qwen3moe_topk_router, gptoss_topk_router";
}

hp_moe_router_kind hp_moe_archetype_router(hp_moe_archetype a) { return hp__moe_archetype_info_of(a)->router; }
hp_moe_shared_kind hp_moe_archetype_shared(hp_moe_archetype a) { return hp__moe_archetype_info_of(a)->shared; }
hp_moe_act hp_moe_archetype_act(hp_moe_archetype a) { return hp__moe_archetype_info_of(a)->act; }

bool hp_moe_cap_policy_parse(const char *s, hp_moe_cap_policy *out)
{
    if (s && !strcmp(s, "score")) {
        *out = HP_MOE_CAP_SCORE;
        return true;
    }
    if (s && !strcmp(s, "first")) {
        *out = HP_MOE_CAP_FIRST;
        return true;
    }
    return false;
}
