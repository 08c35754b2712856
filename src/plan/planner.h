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
 *   memo.c                name templates: phase 1 and 3 results once per template (indices stripped)
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

/* roles: one per model parameter; a role of HP_ROLE_COUNT excludes the parameter (isolated roots). memo: m's
 * name templates (NULL: every module is inferred from its own name). */
typedef struct hp__memo hp__memo;
hp_status hp__group_params(const hp_model *m, const hp_role *roles, hp__memo *memo, hp_arena *arena,
                           hp__group **out, size_t *n_out, hp_err *err);

/* Phase 3: boundary type of a group anchored at fqn whose params have the given roles. */
hp_btype hp__infer_type(const char *fqn, const hp_role *roles, int n);

/* Name templates (memo.c): a name's template writes each all-digit dotted segment (a layer or expert index) as
 * "0". Phases 1 and 3 never look at those segments, so their results are kept per (template, tag). The memo
 * numbers the templates of one model's parameters and modules once, from its module tree. */
hp__memo *hp__memo_create(const hp_model *m); /* NULL when out of memory: callers then compute every name */
void hp__memo_destroy(hp__memo *m);
/* The value slot of (parameter i's or module mi's template, tag); *fresh is true when it was just made and the
 * caller must fill it. NULL (compute directly) when m is NULL or memory runs out. */
int *hp__memo_param(hp__memo *m, size_t i, uint32_t tag, bool *fresh);
int *hp__memo_module(hp__memo *m, size_t mi, uint32_t tag, bool *fresh);
/* Parameter i's template id (equal ids: equal templates); UINT32_MAX when m is NULL. */
uint32_t hp__memo_param_id(const hp__memo *m, size_t i);

/* Phase 6: special handler name for a SPECIAL parameter. */
const char *hp__special_handler(const char *fqn);

/* The transformers parallel-style registries by release (hf_registry.c), for the plan export (hf.c). */
enum {
    HP__HF_COLWISE,
    HP__HF_ROWWISE,
    HP__HF_COLWISE_GATHER_OUTPUT,
    HP__HF_COLWISE_REP,
    HP__HF_PACKED_COLWISE,
    HP__HF_PACKED_ROWWISE,
    HP__HF_EMBEDDING_ROWWISE,
    HP__HF_EMBEDDING_COLWISE,
    HP__HF_SEQUENCE_PARALLEL,
    HP__HF_REPLICATED_WITH_GRAD_ALLREDUCE,
    HP__HF_REPLICATE,
    HP__HF_GROUPED_GEMM,
    HP__HF_EP_ROUTER,
    HP__HF_MOE_TP_EXPERTS,
    HP__HF_EP_DISPATCH_EXPERTS,
    HP__HF_STYLE_COUNT
};
/* How a release combines its TP and EP plans: REPLACE (<= 5.18: the EP plan replaces the TP plan),
 * SEPARATE (5.19-5.22: side by side, router masking with ep_router + moe_tp_experts), DISPATCH (>= 5.23:
 * side by side, grouped_gemm + ep_dispatch_experts, no ep_router). */
enum { HP__HF_ERA_REPLACE, HP__HF_ERA_SEPARATE, HP__HF_ERA_DISPATCH };
typedef struct hp__hf_target {
    int major, minor, patch;
    char text[40];         /* "5.25.0" */
    unsigned styles;       /* bit i: style i is in the release's registry */
    int era;
    bool newer_than_known; /* past the newest release read: taken as that release less announced removals */
} hp__hf_target;
/* version: "MAJOR.MINOR" or "MAJOR.MINOR.PATCH" in plain digits, >= 5.0; NULL is HP_HF_DEFAULT_VERSION.
 * HP_ERR_INPUT with the accepted forms otherwise. */
hp_status hp__hf_target_init(hp__hf_target *t, const char *version, hp_err *err);
bool hp__hf_target_has(const hp__hf_target *t, int style);
const char *hp__hf_style_name(int style);
int hp__hf_style_parse(const char *name); /* -1 when not one of the styles above */

#endif
