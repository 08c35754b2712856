/*
 * fit.h — the search for the nearest change that fits (fit.c; docs/cost.md "When nothing fits"), shared by
 * hp_cost_fit (one mesh) and hp_advise_fit (every mesh of a world).
 */
#ifndef HP_RUN_FIT_H
#define HP_RUN_FIT_H
#include "hyperpar/cost.h"

/* Tries one request: o (the cost options, changed) on world ranks. true and ch->bytes (and ch->mesh) when it fits. */
typedef bool (*hp__fit_try)(void *ctx, const hp_cost_opts *o, int64_t world, hp_fit_change *ch);

/* Each kind of change in turn, the nearest of each that fits into f: a higher --zero (train), a stronger
 * --recompute (train, GPU), a smaller --micro-batch (train; rows per replica now: mb, dp_rows the rows per
 * replica they must divide, 0: any, -1: none can) or --batch (inference), a shorter --seq (seq_step: what it must
 * stay a multiple of), and when worlds, more ranks (2 and 4 times world). The rows and the sequence are
 * bisected over powers of two (memory falls with them). When none fits alone, the kinds but ZeRO again, each
 * with the lowest higher ZeRO level (flag2) under which one does. */
void hp__fit_search(hp_fit *f, const hp_cost_opts *o, int64_t mb, int64_t dp_rows, int64_t seq_step,
                    int64_t world, bool worlds, hp__fit_try try_it, void *ctx);
#endif
