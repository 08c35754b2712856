/*
 * hyperpar/overrides.h — plan overrides (spec §7.1-§7.2): users steer the planner with a YAML (or JSON)
 * list of entries, each matching a module FQN or glob and declaring contract fields, injection fields and
 * an EP compute archetype (`local_compute_fn`). The EP runtime is only ever selected explicitly.
 *
 *   - match: "model.layers.*.mlp"        # exact FQN or glob ('*' spans dots)
 *     when: ep                           # optional: apply only when that axis is active (ep, tp, cp)
 *     region_dispatch: false
 *     local_compute_fn:
 *       _target_: qwen3moe_topk_router   # archetype key, or hyper_parallel's factory path
 *       capacity_factor: 1.25
 *     params: {q_proj.weight: {tp: shard(0)}}   # or "auto" (inherit) / "none" (clear)
 *     out_src: {tp: partial}             # shorthand for {output: {tp: partial}}
 */
#ifndef HYPERPAR_OVERRIDES_H
#define HYPERPAR_OVERRIDES_H

#include "hyperpar/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hp_overrides hp_overrides;

/* Parses YAML or JSON; errors carry file:line:col. A top-level list, or a mapping with `plan_overrides`. */
hp_status hp_overrides_load(hp_overrides **out, const char *path, hp_err *err);
hp_status hp_overrides_parse(hp_overrides **out, const char *text, size_t len, const char *label, hp_err *err);
void hp_overrides_free(hp_overrides *o);
size_t hp_overrides_count(const hp_overrides *o);

/* ---- EP compute archetypes (§10.2) ---- */

size_t hp_archetype_count(void);
const char *hp_archetype_key(size_t i);
/* An archetype key or a hyper_parallel factory path -> the key; NULL when unknown. */
const char *hp_archetype_resolve(const char *target);
/* "routed_only_softmax_topk, mixtral_topk_router, ..." for messages. */
const char *hp_archetype_list(void);
/* The archetype suggested for a model (by family), e.g. "qwen3moe_topk_router". */
const char *hp_archetype_suggest(const hp_model *m);

/* An EP-marked boundary (ep_size > 0) without local_compute_fn cannot run: HP_ERR_INPUT whose message
 * names "hyperpar <command> ... --ep-compute suggested" (the family's archetype) and the family's own recipe, and
 * holds a ready-to-paste YAML override for this model, to pass with "hyperpar <command> ... --overrides FILE"
 * (command: the one that executes the plan, "run", "validate", "train", "moe"; NULL: "plan"). Commands that
 * execute a plan call this. */
hp_status hp_plan_preflight(const hp_plan *p, const char *command, hp_err *err);
/* The YAML that declares the suggested archetype for every EP-marked boundary of the plan. */
hp_status hp_plan_suggest_overrides(const hp_plan *p, hp_buf *out, hp_err *err);

#ifdef __cplusplus
}
#endif
#endif
