/*
 * held.h — internal to src/cost: a rank's weights as hyperpar's runtime holds them (held.c), for cost's ranks and
 * advise's candidates.
 */
#ifndef HP_COST_HELD_H
#define HP_COST_HELD_H

#include "exec/prog.h"

#include "hyperpar/plan.h"
#include "hyperpar/shard.h"

/* How the runtime holds one tensor of a shard layout: bytes per element in inference ([0]) and in training ([1]),
 * 0 when it does not load the tensor, and whether it holds the tensor whole whatever the layout's cut. */
typedef struct hp__cost_held {
    uint8_t el[2];
    bool whole;
} hp__cost_held;

/* How the runtime holds every tensor of L (p's layout, g p's program), into *out (L->n_tensors entries, freed by the
 * caller). */
hp_status hp__cost_held_plan(const hp_model *m, const hp__prog *g, const hp_shard_layout *L, hp__cost_held **out,
                             hp_err *err);
/* The same for a plan whose program the caller has not built: HP_ERR_INPUT when the runtime refuses the plan. */
hp_status hp__cost_held_of(const hp_model *m, const hp_plan *p, const hp_shard_layout *L, hp__cost_held **out,
                           hp_err *err);
/* Rank rk's weights as the runtime holds them (train: as hyperpar train holds them) into *out. */
hp_status hp__cost_held_rank(const hp_model *m, const hp_shard_layout *L, const hp__cost_held *h, bool train,
                             int64_t rk, uint64_t *out, hp_err *err);

#endif
