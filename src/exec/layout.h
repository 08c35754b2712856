/*
 * exec/layout.h — layouts of activations and their transitions, decided without moving data: a placement per
 * mesh axis, a boundary's contract as layouts, the block a rank holds, and the lowering of a transition to a
 * collective with the bytes each rank sends (docs/run.md's table). Pure: no MPI, no data, no linalg. The runtime
 * (src/run/redist.c) executes these decisions; the program (exec/prog.h) and cost read them.
 */
#ifndef HP_EXEC_LAYOUT_H
#define HP_EXEC_LAYOUT_H

#include "hyperpar/plan.h"
#include "hyperpar/comm.h"

/* The mesh axes an activation can be laid out over (dp splits the batch before anything runs). */
enum { HP__TP = 0, HP__CP = 1, HP__NAX = 2 };

/* An activation's layout: a placement per axis (R, P or S(d) with d in 0..2 of [B, S, X]). */
typedef struct hp__lay {
    hp_placement ax[HP__NAX];
} hp__lay;

/* A boundary's single-input, single-output contract as layouts (has_in / has_out: it declares them). */
typedef struct hp__contract {
    const char *fqn;
    bool has_in, has_out;
    hp__lay in_src, in_dst, out_src, out_dst;
} hp__contract;

hp__contract hp__contract_of(const hp_boundary *b);
/* l must be c's in_src (in) or out_src (!in); else HP_ERR_INPUT naming the boundary and both layouts. */
hp_status hp__contract_check(const hp__contract *c, const hp__lay *l, bool in, hp_err *err);

/* Where a rank sits on the axes an activation is laid out over: each group's size and the rank's index in it. */
typedef struct hp__axes {
    int64_t n[HP__NAX], r[HP__NAX];
} hp__axes;

/* Block i of n of a length L: [i·L/n, (i+1)·L/n) (as the shard layout cuts weights). */
static inline int64_t hp__blk_lo(int64_t L, int64_t n, int64_t i)
{
    return (int64_t)((__int128)L * i / n);
}

const char *hp__lay_str(const hp__lay *l, char *buf, size_t cap); /* "{tp: S(1), cp: S(1)}" */
bool hp__lay_eq(const hp__lay *a, const hp__lay *b);
/* The layout a plan's NamedPlacement gives (absent axes are R; S(-1) becomes S(2)). */
hp__lay hp__lay_from(const hp_nplace *pl);

/* Global range [lo, lo+n) of dim d held by (tp index, cp index) under layout lay. */
void hp__lay_range(const hp__axes *x, const hp__lay *lay, const int64_t g[3], int d, int64_t tp_i, int64_t cp_i,
                   int64_t *lo, int64_t *n);

/* The lowering of one axis's transition (docs/run.md's table), decided without moving data: what
 * hp__redistribute runs for it and the bytes this rank sends into it (what the statistics count).
 * The dry executor (cost.c) asks the same question for any rank of the mesh. */
typedef enum hp__low_kind {
    HP__LOW_NONE,           /* the placements are equal */
    HP__LOW_ALL_GATHER,     /* S(d) -> R */
    HP__LOW_ALL_REDUCE,     /* P -> R */
    HP__LOW_REDUCE_SCATTER, /* P -> S(d), even blocks */
    HP__LOW_RS_UNEVEN,      /* P -> S(d), uneven: all-reduce + slice (counted as the all-reduce) */
    HP__LOW_SLICE,          /* R -> S(d): local */
    HP__LOW_REFUSE          /* not lowered; why says so */
} hp__low_kind;

typedef struct hp__low {
    hp__low_kind kind;
    int d;          /* the dim, or -1 */
    uint64_t bytes; /* this rank's bytes into the collective (UINT64_MAX: past what 64 bits hold) */
    const char *why;
} hp__low;

/* x: the group sizes and this rank's index on each axis. */
hp__low hp__lower_axis(const hp__axes *x, const hp__lay *from, const int64_t g[3], int ax, hp_placement dst);
/* Whether an all-gather's member blocks along its dim (lo: their starts, n: their lengths; gn members) are even
 * and follow each other in member order, so that MPI receives them straight into the result (run/redist.c;
 * cost/cost.c then sizes no scratch for it). */
bool hp__gather_in_place(const int64_t *lo, const int64_t *n, int64_t gn);
/* Whether the rank at index 0 of both axes holds all of a tensor of global dims g laid out as lay (every dim
 * unsharded): its block is then the whole, and every other rank's a replica. */
bool hp__lay_first_whole(const hp__axes *x, const hp__lay *lay, const int64_t g[3]);
/* The error for a transition the lowering refuses on axis ax (`what` names it, `why` is hp__low.why). */
hp_status hp__refuse(const hp__lay *from, const hp__lay *to, int ax, const char *what, const char *why, hp_err *err);
/* The statistics kind of a lowering (HP_RUN_COLL_COUNT: no collective). */
hp_run_coll hp__low_coll(hp__low_kind k);

#endif
