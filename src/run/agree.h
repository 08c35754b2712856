/*
 * agree.h — internal to src/run: every rank agrees that it was given what rank 0 was (agree.c).
 */
#ifndef HP_RUN_AGREE_H
#define HP_RUN_AGREE_H

#include "run/run_int.h"

/* Collective over world, before the first collective that depends on the mesh, plan, options or weights:
 * local is this rank's status so far (a failure is agreed first). HP_ERR_INPUT naming the first rank that was
 * given another mesh, SP or loss-parallel setting, model, weights, plan or options than rank 0, the same on
 * every rank. rf: the rank's shard file (its folder identity), or NULL for a checkpoint. */
hp_status hp__run_agree(const hp_comm *world, const hp_model *m, const hp_plan *p, const hp_run_opts *o,
                        const hp__rcfg *c, const hp_shard_rank_file *rf, hp_status local, hp_err *err);

#endif
