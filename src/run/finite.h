/*
 * finite.h — internal to src/run: a non-finite activation is an error naming the first boundary where it
 * appears (finite.c).
 */
#ifndef HP_RUN_FINITE_H
#define HP_RUN_FINITE_H

#include "run/run_int.h"
#include "run/weights.h"

/* The weights a rank holds, with their names, in load order (the cause of a non-finite activation). */
typedef struct hp__wreg {
    int n, cap;
    struct hp__wreg_entry {
        const hp__w *w;          /* a dense slice, or */
        const hp_moe_layer *moe; /* a sparse block's layer object (router, local experts, shared expert) */
        char *name;
    } *v;
} hp__wreg;

hp_status hp__wreg_add(hp__wreg *g, const hp__w *w, const hp_moe_layer *moe, const char *name, hp_err *err);
void hp__wreg_free(hp__wreg *g);

/* The first non-finite value this rank saw in the forward in progress. */
typedef struct hp__nf {
    int64_t n_visit;     /* boundary outputs scanned so far in this forward */
    int64_t idx;         /* the visit where the first non-finite appeared, -1 when none */
    int64_t at[3];       /* its global coordinates [b, s, x] */
    float value;
    char what[128];
} hp__nf;

/* Starts a forward. */
void hp__nf_reset(hp__nf *nf);
/* Scans boundary `what`'s local output a (dp replica's first row dp_lo); records the first non-finite. */
void hp__nf_watch(hp__nf *nf, const char *what, const hp__act *a, int64_t dp_lo);
/* The same for a boundary scanned a chunk at a time: rows [r0, r0 + rows) of a's local block (rows b·n[1] + s),
 * held in d [rows, a->n[2]]; visit is the boundary's (nf->n_visit++ once, before its first chunk). */
void hp__nf_watch_rows(hp__nf *nf, int64_t visit, const char *what, const hp__act *a, const float *d, int64_t r0,
                       int64_t rows, int64_t dp_lo);
/* A scalar (the loss): non-finite when it is and the forward scored positions. */
void hp__nf_watch_scalar(hp__nf *nf, const char *what, double v);
/* Collective over world at the end of a forward (on success and failure alike): when any rank saw a
 * non-finite value, HP_ERR_VERIFY on every rank with one message naming the earliest boundary (in execution
 * order, then the lowest rank), its coordinates and the likely cause (the first non-finite weight that rank
 * holds, else an overflow of f32). Otherwise st. */
hp_status hp__nf_verdict(const hp_comm *world, const hp__nf *nf, const hp__wreg *g, const char *rank_desc,
                         hp_status st, hp_err *err);

#endif
