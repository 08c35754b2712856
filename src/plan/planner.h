/*
 * planner.h — internal: the planner's phases as separate functions (one file per phase).
 *
 *   classify.c   Phase 1  parameter FQN -> role (family rules, default rules)
 *   group.c      Phase 2  roles -> groups (deepest-first merge upward)
 *   infer.c      Phase 3  group -> boundary type
 *   templates.c  Phase 4  type -> contract (8 templates), role -> placement
 *   ep.c         §6.8     MoE EP marking (per-expert stacking, batched, D-10 identity contract)
 *   lints.c      §7.3-§8  finalisation and lints
 *   plan.c                the pipeline, mesh, lookup helpers
 */
#ifndef HP_PLAN_PLANNER_H
#define HP_PLAN_PLANNER_H

#include "hyperpar/plan.h"

/* Phase 1: role of one parameter. fqn is matched lower-cased. arch is the canonical architecture name
 * (hp_model.arch) or the model_type; family rules apply when either spelling is registered. */
hp_role hp__classify(const char *fqn, const char *arch, const char *model_type);

/* Phase 2. A group: the module FQN that anchors it and the indices (into model->params) of its params,
 * in parameter order. Groups come out ordered by module registration order (first parameter's index). */
typedef struct hp__group {
    const char *fqn; /* arena-owned */
    int n;
    int *params;     /* arena-owned */
} hp__group;

/* roles: one per model parameter; a role of HP_ROLE_COUNT excludes the parameter (isolated roots). */
hp_status hp__group_params(const hp_model *m, const hp_role *roles, hp_arena *arena, hp__group **out,
                           size_t *n_out, hp_err *err);

/* Phase 3: boundary type of a group anchored at fqn whose params have the given roles. */
hp_btype hp__infer_type(const char *fqn, const hp_role *roles, int n);

/* Phase 6: special handler name for a SPECIAL parameter. */
const char *hp__special_handler(const char *fqn);

#endif
