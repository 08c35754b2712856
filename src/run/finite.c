/*
 * finite.c — non-finite activations are errors, never results.
 *
 * One NaN or Inf weight (a corrupt checkpoint or rank file), or values past f32's range, poison every
 * activation after them: the logits and the loss come out NaN. The runner therefore scans every boundary's
 * local output as it leaves (hp__nf_watch, one pass over memory the boundary just wrote) and remembers the
 * first non-finite value of the forward. A rank does not stop there: its peers are already in the next
 * collectives, and stopping alone would leave them waiting. The forward runs to its end (NaN flows through
 * the arithmetic; sparse blocks are told that the caller checks, and get the bad rows zeroed so the routing
 * stays meaningful), and at the end every rank gathers every rank's first sighting (hp__nf_verdict, one
 * allgather): the earliest boundary in execution order is named, with its coordinates and the likely cause,
 * the first non-finite weight the rank that saw it holds (scanned only on this error path), else an overflow.
 * The verdict is HP_ERR_VERIFY (exit 3): a numeric failure, and the output files are not written.
 */
#include "run/finite.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/moe_internal.h"

hp_status hp__wreg_add(hp__wreg *g, const hp__w *w, const hp_moe_layer *moe, const char *name, hp_err *err)
{
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 64;
        struct hp__wreg_entry *v = realloc(g->v, (size_t)cap * sizeof *v);
        if (!v) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        g->v = v;
        g->cap = cap;
    }
    char *s = strdup(name);
    if (!s) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    g->v[g->n++] = (struct hp__wreg_entry){w, moe, s};
    return HP_OK;
}

void hp__wreg_free(hp__wreg *g)
{
    for (int i = 0; i < g->n; i++) free(g->v[i].name);
    free(g->v);
    memset(g, 0, sizeof *g);
}

void hp__nf_reset(hp__nf *nf)
{
    memset(nf, 0, sizeof *nf);
    nf->idx = -1;
}

void hp__nf_watch(hp__nf *nf, const char *what, const hp__act *a, int64_t dp_lo)
{
    int64_t visit = nf->n_visit++;
    if (a->d) hp__nf_watch_rows(nf, visit, what, a, a->d, 0, a->n[0] * a->n[1], dp_lo);
}

void hp__nf_watch_rows(hp__nf *nf, int64_t visit, const char *what, const hp__act *a, const float *d, int64_t r0,
                       int64_t rows, int64_t dp_lo)
{
    if (nf->idx >= 0) return;
    const int64_t X = a->n[2], n = rows * X;
    enum { BLOCK = 1024 };
    int64_t i = 0;
    for (; i < n; i += BLOCK) { /* x·0 is 0 for a finite x and NaN for ±Inf and NaN: a block's sum says if it has one */
        int64_t e = n - i < BLOCK ? n - i : BLOCK;
        float z = 0;
#pragma omp simd reduction(+ : z)
        for (int64_t j = 0; j < e; j++) z += d[i + j] * 0.0f;
        if (z != 0) break;
    }
    for (; i < n; i++)
        if (!isfinite(d[i])) {
            int64_t x = i % X, row = r0 + i / X, s = row % a->n[1], b = row / a->n[1];
            nf->idx = visit;
            nf->at[0] = dp_lo + a->lo[0] + b;
            nf->at[1] = a->lo[1] + s;
            nf->at[2] = a->lo[2] + x;
            nf->value = d[i];
            snprintf(nf->what, sizeof nf->what, "%s", what);
            return;
        }
}

void hp__nf_watch_scalar(hp__nf *nf, const char *what, double v)
{
    int64_t visit = nf->n_visit++;
    if (nf->idx >= 0 || isfinite(v)) return;
    nf->idx = visit;
    nf->at[0] = nf->at[1] = nf->at[2] = -1;
    nf->value = (float)v;
    snprintf(nf->what, sizeof nf->what, "%s", what);
}

static const char *kind(float v) { return isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf"; }

/* The first non-finite element of a slice: " holds NaN at [i, j]" (global coordinates); false if none. */
static bool slice_bad(const hp__w *w, char *buf, size_t cap)
{
    if (!w->present || !w->d) return false;
    for (int64_t i = 0; i < w->n; i++) {
        float v;
        if (w->dt == HP_DT_F32) v = ((const float *)w->d)[i];
        else if (w->dt == HP_DT_BF16) {
            uint32_t u = (uint32_t)((const uint16_t *)w->d)[i] << 16;
            memcpy(&v, &u, sizeof v);
        } else return false;
        if (isfinite(v)) continue;
        int64_t idx[HP_MAX_DIMS], rem = i;
        for (int d = w->n_dims - 1; d >= 0; d--) {
            int64_t e = w->shape[d] > 0 ? w->shape[d] : 1;
            idx[d] = rem % e + w->lo[d];
            rem /= e;
        }
        int k = snprintf(buf, cap, "holds %s at [", kind(v));
        for (int d = 0; d < w->n_dims && k > 0 && (size_t)k < cap; d++)
            k += snprintf(buf + k, cap - (size_t)k, "%s%lld", d ? ", " : "", (long long)idx[d]);
        if (k > 0 && (size_t)k < cap) snprintf(buf + k, cap - (size_t)k, "]");
        return true;
    }
    return false;
}

/* The likely cause on this rank: its first non-finite weight in load order, else an overflow. */
static void cause_of(const hp__wreg *g, char *buf, size_t cap)
{
    char at[200];
    for (int i = 0; i < g->n; i++) {
        const struct hp__wreg_entry *e = &g->v[i];
        if (e->w && slice_bad(e->w, at, sizeof at)) {
            snprintf(buf, cap, "the weight '%s' %s: the checkpoint (or shard file) is corrupt; restore it from the "
                     "original", e->name, at);
            return;
        }
        if (e->moe && hp__moe_layer_weights_bad(e->moe, at, sizeof at)) {
            snprintf(buf, cap, "%s", at);
            return;
        }
    }
    snprintf(buf, cap, "every weight this rank holds is finite, so values overflowed f32 (largest finite 3.4e38): "
             "check the weights' scale and config.json's scaling factors");
}

typedef struct sighting {
    int64_t idx, at[3];
    float value;
    int32_t rank;
    char what[128], cause[400], desc[160];
} sighting;

hp_status hp__nf_verdict(const hp_comm *world, const hp__nf *nf, const hp__wreg *g, const char *rank_desc,
                         hp_status st, hp_err *err)
{
    const int n = hp_comm_size(world);
    sighting mine, *all = calloc((size_t)n, sizeof *all);
    memset(&mine, 0, sizeof mine);
    mine.idx = nf->idx;
    mine.rank = hp_comm_rank(world);
    if (nf->idx >= 0) {
        memcpy(mine.at, nf->at, sizeof mine.at);
        mine.value = nf->value;
        snprintf(mine.what, sizeof mine.what, "%s", nf->what);
        snprintf(mine.desc, sizeof mine.desc, "%s", rank_desc);
        cause_of(g, mine.cause, sizeof mine.cause);
    }
    /* Every rank takes part in the allgather, or none does (a rank without memory for the result). */
    hp_err e2;
    hp_status gs = hp_comm_agree(world, all ? HP_OK : hp_err_set(&e2, HP_ERR_NOMEM, "out of memory"), &e2);
    if (gs == HP_OK) gs = hp_comm_allgather(world, &mine, sizeof mine, all, &e2);
    if (gs != HP_OK) {
        free(all);
        if (st != HP_OK) return st;
        *err = e2;
        return gs;
    }
    const sighting *first = NULL;
    for (int r = 0; r < n; r++)
        if (all[r].idx >= 0 && (!first || all[r].idx < first->idx)) first = &all[r];
    if (first) {
        char where[160] = "";
        if (first->at[0] >= 0)
            snprintf(where, sizeof where, " at [%lld, %lld, %lld] of [batch, position, channel]",
                     (long long)first->at[0], (long long)first->at[1], (long long)first->at[2]);
        st = hp_err_set(err, HP_ERR_VERIFY,
                        "the forward pass is not finite: %s is the first boundary whose output holds %s%s, on %s; "
                        "likely cause: %s",
                        first->what, kind(first->value), where, first->desc, first->cause);
    }
    free(all);
    return st;
}
