/*
 * overrides.h — internal: parsed plan override entries and the Phase 4.5 application (§7.1).
 *
 * A contract field is unset (None: inherit on merge), a sentinel ("auto" = inherit explicitly, "none" =
 * clear), or a concrete map ({} included). Same-match entries are merged field-wise (later set fields win)
 * after `when` filtering, at derive time, because `when` depends on the mesh.
 */
#ifndef HP_PLAN_OVERRIDES_H
#define HP_PLAN_OVERRIDES_H

#include "hyperpar/overrides.h"
#include "plan/planner_int.h"

typedef enum { HP_OV_UNSET = 0, HP_OV_AUTO, HP_OV_NONE, HP_OV_MAP } hp_ov_kind;

typedef struct hp_ov_params {
    hp_ov_kind kind;
    int n;
    hp_param_spec *e; /* rel path -> placement */
} hp_ov_params;

typedef struct hp_ov_io {
    hp_ov_kind kind;
    hp_io_map map;
} hp_ov_io;

typedef struct hp_override {
    const char *match;
    bool glob;
    int line, col;            /* of the entry, for messages */
    const char *when;         /* NULL, "ep", "tp", "cp", "low_precision" */
    hp_ov_params params;
    hp_ov_io in_src, in_dst, out_src, out_dst;
    hp_ov_kind out_names_kind;
    int n_out_names;
    const char **out_names;
    bool tp_divide_set;
    int n_tp_divide;
    const char **tp_divide;
    int8_t is_boundary;       /* -1 unset */
    int8_t region_dispatch;   /* -1 unset, 0 false, 1 true */
    const char *local_compute_fn; /* archetype key, or NULL */
    hp_compute_opts compute;
} hp_override;

struct hp_overrides {
    hp_arena arena;
    const char *label;
    int n;
    hp_override *e;
};

/* Phase 4.5: applies o to the derived boundaries of p (derive=false: p has none and every key inserts). */
hp_status hp__apply_overrides(hp_plan *p, const hp_overrides *o, bool derive, hp_err *err);
/* hp_plan_opts.ep_compute (after the overrides): the archetype (or "suggested", the family's) declared with
 * region_dispatch false on every EP-marked boundary without a local_compute_fn; HP_ERR_INPUT for a dense model,
 * a family without a suggestion, an unknown archetype, one that does not fit the block, or a boundary whose
 * overrides declare another. */
hp_status hp__apply_ep_compute(hp_plan *p, const char *ep_compute, hp_err *err);

/* archetypes.c: the expected submodules of an archetype ("gate", "experts", ...); NULL-terminated. */
const char *const *hp__archetype_children(const char *key);

#endif
