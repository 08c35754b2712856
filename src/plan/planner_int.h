/*
 * planner_int.h — internal: helpers shared by the derivation phases (templates.c, ep.c, lints.c, plan.c).
 */
#ifndef HP_PLAN_PLANNER_INT_H
#define HP_PLAN_PLANNER_INT_H

#include <stdio.h>

#include "plan/planner.h"

/* Whether axis a is one of the plan's mesh dims (size > 1). */
bool hp__plan_has_dim(const hp_plan *p, hp_axis a);
/* Records a warning (also logged at WARN level). */
void hp__plan_warn(hp_plan *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* templates.c */
bool hp__has_template(hp_btype t);
bool hp__rowwise_by_name(const char *rel);
hp_placement hp__expert_tp_placement(const char *rel, int ndim, bool transposed);
bool hp__placement_for_role(hp_role role, const char *rel, int ndim, bool has_tp, bool has_ep, bool transposed,
                            hp_nplace *out);
/* memo: the model's name templates (may be NULL), to place each template of b's subtree once. */
hp_status hp__build_from_template(hp_plan *p, hp_boundary *b, const int *param_idx, int n, hp__memo *memo,
                                  hp_err *err);

/* ep.c: §6.8 MoE EP marking of one moe_mlp boundary (only called when ep > 1). */
hp_status hp__mark_moe_ep(hp_plan *p, hp_boundary *b, hp_err *err);
/* §6.8(3a) / §10.1: ep must divide the dense region (all non-pp axes) and the expert count. */
hp_status hp__validate_ep_extend(const hp_plan *p, hp_err *err);

/* lints.c: §7.3-§8 in order. */
hp_status hp__finalize(hp_plan *p, const hp_plan_opts *o, hp_err *err);
/* What finalisation derives for one boundary from its params, I/O contracts, the mesh and the model: the
 * TP-local attributes (auto head counts; b's "user" attributes checked and recomputed as tp_divide_attrs) and
 * the deferred biases, into *out (a copy of *b; allocations in p's arena). A plan read back from a file must
 * hold exactly these (src/shard/plan_read.c). HP_ERR_INPUT as finalisation's own messages. */
hp_status hp__boundary_finals(hp_plan *p, const hp_boundary *b, hp_boundary *out, hp_err *err);

/* Shape of a boundary parameter (model param, or an ep_stack entry); false when unknown. */
bool hp__param_shape(const hp_plan *p, const hp_boundary *b, const char *rel, int *ndim, int64_t *shape);

#endif
