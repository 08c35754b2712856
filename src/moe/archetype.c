/*
 * archetype.c — the EP compute archetypes of spec §10.2 as data: router kind, shared-expert kind,
 * activation and the child modules the interface assertion requires.
 *
 * The archetype is chosen by the caller (CLI --archetype, a plan's local_compute_fn, or the family's
 * suggestion); nothing here compares family names. The loader (load.c) checks the layer's children
 * against `needs` before reading any tensor.
 */
#include "moe/moe_internal.h"

#include <stdio.h>
#include <string.h>

/* The shared table (src/core/archetypes.def); the planner's factory paths are not the runtime's business. */
#define HP_ARCHETYPE(id, key, factory, router, shared, act, norm, n0, n1, n2, n3) \
    [id] = {key, router, shared, act, norm, {n0, n1, n2, n3}},
static const hp__moe_archetype_info g_info[HP_MOE_ARCHETYPE_COUNT] = {
#include "core/archetypes.def"
};
#undef HP_ARCHETYPE

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

/* ", key" for every row of the table, joined by the compiler; the list starts after the first ", ". */
#define HP_ARCHETYPE(id, key, ...) ", " key
static const char g_key_list[] =
#include "core/archetypes.def"
    ;
#undef HP_ARCHETYPE

const char *hp_moe_archetype_list(void) { return g_key_list + 2; }

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
