/*
 * group.c — Phase 2 of the planner: parameters with roles -> boundary groups (spec §4).
 *
 * One deepest-first sweep over the module tree. Every parameter starts in the list of the module that
 * owns it (hp_param.module; top-level parameters belong to the root ""). Modules are visited in strictly
 * decreasing depth, so a module is inferred only after all its descendants have merged into it:
 *
 *        model.layers.0.mlp.experts.3     unknown (numeric guard) -> merge into experts
 *        model.layers.0.mlp.experts       unknown (leaf guard)    -> merge into mlp
 *        model.layers.0.mlp.gate          unknown (gate only)     -> merge into mlp
 *        model.layers.0.mlp               moe_mlp                 -> group
 *
 *   - type != unknown                   -> the module's merged list becomes a group anchored at it;
 *   - unknown, module has a parent      -> the whole list moves into the parent (depth = dots > 0);
 *   - unknown at a top-level module or the root -> a group anchored at the "origin": the owning module
 *     of the list's first parameter, unless a group already sits there (no template will match such a
 *     group later: the planner warns and skips it).
 *
 * "Depth" is the number of dots of the FQN: hp_module.depth - 1 for every non-root module, and 0 for the
 * root, which therefore shares a level with the top-level modules and never receives merged parameters.
 *
 * Determinism (the Python sweeps a set, so some choices there are unspecified):
 *   - the first parameter of a merged list is taken as the Python does when the module owns parameters
 *     (its own come first), and otherwise from the earliest module in pre-order (registration order) that
 *     still contributes its own parameters: origin[m] = min module index over the contributors, which
 *     works because pre-order numbers a module before all its descendants;
 *   - groups come out ordered by their smallest parameter index (first appearance in registration order),
 *     and each group lists its parameters in parameter order.
 *
 * Cost: O(n_params + n_modules) plus one inference per visited module's name template and role set (a
 * handful of substring scans; the other modules of a template look it up, memo.c); merged lists are singly linked through next[] so a merge is O(1). The inference sees
 * the set of roles as a bit mask, never the whole list. All memory (scratch included) comes from the
 * caller's arena.
 *
 * Excluded parameters: a role outside the enum (HP_ROLE_COUNT) marks a parameter excluded from grouping
 * (isolated roots, §6.9); it appears in no group.
 */
#include <string.h>

#include "plan/planner.h"

/* Arena array of n elements of size sz, overflow-checked; NULL on overflow or out of memory. */
static void *arena_array(hp_arena *a, size_t n, size_t sz)
{
    size_t bytes;
    if (!hp_mul_size(n ? n : 1, sz, &bytes)) return NULL;
    return hp_arena_alloc(a, bytes);
}

/* Scratch state of one sweep. Per-module lists are linked through next[] (indices into params, -1 ends). */
typedef struct sweep {
    const hp_model *m;
    int *next;      /* [n_params] next parameter in the same list */
    int *group_of;  /* [n_params] group id, -1 when in none (excluded, or dropped by a collision) */
    int *head;      /* [n_modules] first parameter of the module's merged list, -1 when empty */
    int *tail;      /* [n_modules] last parameter of the list */
    int *count;     /* [n_modules] list length */
    unsigned *mask; /* [n_modules] bit r set: role r occurs in the list */
    int *origin;    /* [n_modules] earliest (pre-order) module whose own params are in the list */
    int *group_at;  /* [n_modules] group id anchored at the module, -1 when none */
    int *anchor;    /* [n_modules] module of group id g (at most one group per module) */
    int n_groups;
    hp__memo *memo; /* phase 3 per (module name template, role mask); the caller's, may be NULL */
} sweep;

/* Infers the type of module mi's merged list from its role set. */
static hp_btype infer_list(const sweep *s, int mi)
{
    hp_role set[HP_ROLE_COUNT];
    int n = 0;
    for (int r = 0; r < HP_ROLE_COUNT; r++)
        if (s->mask[mi] & (1u << r)) set[n++] = (hp_role)r;
    bool fresh = true;
    int *v = hp__memo_module(s->memo, (size_t)mi, s->mask[mi], &fresh);
    if (v && !fresh) return (hp_btype)*v;
    hp_btype t = hp__infer_type(s->m->modules[mi].name, set, n);
    if (v) *v = (int)t;
    return t;
}

/* Makes module anchor the home of the list that currently hangs off module mi. */
static void claim(sweep *s, int mi, int anchor)
{
    HP_ASSERT(s->group_at[anchor] < 0); /* one group per module, so n_groups <= n_modules */
    int g = s->n_groups++;
    s->group_at[anchor] = g;
    s->anchor[g] = anchor;
    for (int p = s->head[mi]; p >= 0; p = s->next[p]) s->group_of[p] = g;
}

/* Appends child c's list to its parent's (O(1)) and empties c. */
static void merge_up(sweep *s, int c, int parent)
{
    if (s->head[parent] < 0) s->head[parent] = s->head[c];
    else s->next[s->tail[parent]] = s->head[c];
    s->tail[parent] = s->tail[c];
    s->count[parent] += s->count[c];
    s->mask[parent] |= s->mask[c];
    if (s->origin[c] < s->origin[parent]) s->origin[parent] = s->origin[c];
    s->head[c] = s->tail[c] = -1;
    s->count[c] = 0;
}

/* Groups m's parameters (§4). roles[i] is parameter i's role (HP_ROLE_COUNT: excluded). On success *out
 * holds *n_out groups (arena-owned; NULL when there are none) in first-appearance order. */
hp_status hp__group_params(const hp_model *m, const hp_role *roles, hp__memo *memo, hp_arena *arena,
                           hp__group **out, size_t *n_out, hp_err *err)
{
    *out = NULL;
    *n_out = 0;
    size_t np = m->n_params, nm = m->n_modules;
    if (np == 0) return HP_OK;
    HP_ASSERT(roles && nm > 0 && np <= (size_t)INT32_MAX && nm <= (size_t)INT32_MAX);

    sweep s = {.m = m, .memo = memo};
    s.next = arena_array(arena, np, sizeof(int));
    s.group_of = arena_array(arena, np, sizeof(int));
    s.head = arena_array(arena, nm, sizeof(int));
    s.tail = arena_array(arena, nm, sizeof(int));
    s.count = arena_array(arena, nm, sizeof(int));
    s.mask = arena_array(arena, nm, sizeof(unsigned));
    s.origin = arena_array(arena, nm, sizeof(int));
    s.group_at = arena_array(arena, nm, sizeof(int));
    s.anchor = arena_array(arena, nm, sizeof(int));
    int *order = arena_array(arena, nm, sizeof(int));     /* modules by decreasing depth */
    int *first = arena_array(arena, nm + 1, sizeof(int)); /* bucket starts per depth */
    if (!s.next || !s.group_of || !s.head || !s.tail || !s.count || !s.mask || !s.origin || !s.group_at ||
        !s.anchor || !order || !first)
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory grouping %zu parameters into boundaries", np);

    for (size_t i = 0; i < nm; i++) {
        s.head[i] = s.tail[i] = s.group_at[i] = -1;
        s.origin[i] = INT32_MAX;
    }

    /* Pass 1: each module's own list, in parameter order. */
    for (size_t i = 0; i < np; i++) {
        s.next[i] = s.group_of[i] = -1;
        if ((int)roles[i] < 0 || roles[i] >= HP_ROLE_COUNT) continue; /* excluded */
        int mi = m->params[i].module;
        HP_ASSERT(mi >= 0 && (size_t)mi < nm);
        if (s.head[mi] < 0) s.head[mi] = (int)i;
        else s.next[s.tail[mi]] = (int)i;
        s.tail[mi] = (int)i;
        s.count[mi]++;
        s.mask[mi] |= 1u << roles[i];
        s.origin[mi] = mi;
    }

    /* Counting sort of modules by dot depth, deepest first, stable in module order. The root (depth 0)
     * shares dot depth 0 with the top-level modules. */
    int max_dots = 0;
    for (size_t i = 0; i < nm; i++) {
        int d = m->modules[i].depth > 0 ? m->modules[i].depth - 1 : 0;
        HP_ASSERT(d >= 0 && (size_t)d < nm);
        if (d > max_dots) max_dots = d;
        first[d]++;
    }
    /* first[d] = start of bucket d in order[], buckets laid out from max_dots down to 0. */
    for (int d = max_dots, at = 0; d >= 0; d--) {
        int c = first[d];
        first[d] = at;
        at += c;
    }
    for (size_t i = 0; i < nm; i++) {
        int d = m->modules[i].depth > 0 ? m->modules[i].depth - 1 : 0;
        order[first[d]++] = (int)i;
    }

    /* Pass 2: the deepest-first sweep. */
    for (size_t k = 0; k < nm; k++) {
        int mi = order[k];
        if (s.count[mi] == 0) continue;
        const hp_module *mod = &m->modules[mi];
        if (infer_list(&s, mi) != HP_BT_UNKNOWN) {
            claim(&s, mi, mi);
        } else if (mod->depth >= 2) {
            merge_up(&s, mi, mod->parent);
        } else {
            /* Still unknown at a top-level module (or the root): anchor at the origin, first come first
             * served; a collision cannot happen with a tree-derived model but mirrors setdefault. */
            int o = s.origin[mi];
            HP_ASSERT(o >= 0 && (size_t)o < nm);
            if (s.group_at[o] < 0) claim(&s, mi, o);
        }
    }

    /* Output: groups in order of their first parameter; parameters in parameter order. */
    int *slot = s.count; /* reuse: group id -> output slot */
    int *size = s.tail;  /* reuse: group id -> number of params */
    for (int g = 0; g < s.n_groups; g++) slot[g] = -1, size[g] = 0;
    size_t n_groups = 0;
    for (size_t i = 0; i < np; i++) {
        int g = s.group_of[i];
        if (g < 0) continue;
        if (slot[g] < 0) slot[g] = (int)n_groups++;
        size[g]++;
    }
    hp__group *groups = arena_array(arena, n_groups, sizeof *groups);
    if (!groups) return hp_err_set(err, HP_ERR_NOMEM, "out of memory grouping %zu parameters", np);
    for (int g = 0; g < s.n_groups; g++) {
        if (slot[g] < 0) continue;
        hp__group *gr = &groups[slot[g]];
        gr->fqn = hp_arena_strdup(arena, m->modules[s.anchor[g]].name);
        gr->params = arena_array(arena, (size_t)size[g], sizeof(int));
        if (!gr->fqn || !gr->params)
            return hp_err_set(err, HP_ERR_NOMEM, "out of memory grouping %zu parameters", np);
    }
    for (size_t i = 0; i < np; i++) {
        int g = s.group_of[i];
        if (g < 0) continue;
        hp__group *gr = &groups[slot[g]];
        gr->params[gr->n++] = (int)i;
    }
    *out = groups;
    *n_out = n_groups;
    return HP_OK;
}
