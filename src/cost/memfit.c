/*
 * memfit.c — whether a run fits this node's memory, asked before anything is allocated: run, bench and the trainer
 * refuse a forward (train: a step) whose ranks would need more than MemAvailable, with cost's figures for the plan.
 */
#include "hyperpar/comm.h"
#include "hyperpar/cost.h"

#include <stdio.h>

uint64_t hp_mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kib = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu", &kib) == 1) break;
    fclose(f);
    return (uint64_t)kib * 1024;
}

hp_status hp_memory_fits(const char *what, double need, int ranks, const char *remedy, hp_err *err)
{
    uint64_t avail = hp_mem_available();
    if (!avail || ranks < 1) return HP_OK; /* unknown: the allocations themselves tell */
    if (!(need * (double)ranks > (double)avail)) return HP_OK; /* NaN: unknown too */
    char b1[32] = "more than 16 EiB", b2[32], on[64] = "";
    if (need < 0x1p64) hp_format_bytes((uint64_t)need, b1, sizeof b1); /* the one place need saturates */
    if (ranks > 1) snprintf(on, sizeof on, " x %d ranks on this node", ranks);
    return hp_err_set(err, HP_ERR_INPUT, "%s needs %s of memory per rank%s, but this machine has %s available "
                      "(MemAvailable, /proc/meminfo), so it would be killed for memory; %s",
                      what, b1, on, hp_format_bytes(avail, b2, sizeof b2), remedy);
}

hp_status hp_cost_forward_fits(const hp_comm *w, const hp_model *m, const hp_plan *p, int64_t B, int64_t S, bool train,
                               bool weights_held, double root_extra, int local_ranks, const char *what,
                               const char *remedy, hp_err *err)
{
    int64_t R = hp_comm_rank(w);
    hp_cost_opts o;
    hp_cost_opts_default(&o);
    o.B = B, o.S = S, o.train = train, o.n_ranks = 1, o.ranks = &R;
    /* the forward runs the B rows as one micro-batch (each replica its rows), not cost's default of 1 row */
    int64_t dp = hp_mesh_size(&p->mesh, "dp");
    if (train && dp > 0 && B % dp == 0) o.micro_batch = B / dp;
    hp_cost *c = NULL;
    hp_err e;
    double need = 0; /* unknown (the runtime refuses the plan, or cost could not say): the allocations tell */
    hp_status cs = hp_cost_compute(&c, m, p, &o, &e);
    if (cs == HP_OK && !c->refused[0]) {
        const hp_cost_rank *k = &c->ranks[0];
        need = k->workspace_bytes == UINT64_MAX ? 0x1p64 /* past 64 bits */
                                                : (double)k->workspace_bytes + (weights_held ? 0.0 : (double)k->weight_bytes);
        need += (double)k->window_bytes; /* the groups' shared windows: memory beside the workspace */
        if (train && (double)k->total_bytes > need) need = (double)k->total_bytes;
        if (R == 0) need += root_extra;
    } /* else unknown too: a batch past 64-bit sizes is the runtime's own refusal (exit 2) */
    hp_cost_free(c);
    hp_status st = hp_comm_allreduce_max_f64(w, &need, 1, err);
    if (st != HP_OK || need <= 0) return st;
    char rem[400];
    snprintf(rem, sizeof rem, "%s ('hyperpar cost' on the same model, mesh and --batch/--seq prints each rank's "
             "figures)", remedy);
    /* nodes may hold other numbers of ranks: the verdict is agreed, so that no rank goes on alone */
    return hp_comm_agree(w, hp_memory_fits(what, need, local_ranks > 0 ? local_ranks : 1, rem, err), err);
}
