/*
 * loss.c — the mean next-token cross-entropy on the logits as the plan lays them out (vocab-parallel when the head
 * cuts the vocabulary over tp: the row max and Σexp all-reduced over tp; docs/run.md, loss-parallel), lm_head and
 * the loss in row chunks (a long prefill without logits taken), and the statistics a backward's softmax keeps.
 *
 * Position p of row b is scored against ids[b][p + 1] when p + 1 < S and, with a mask (hp_runner_forward_masked),
 * mask[b][p + 1] != 0: the mean is over those targets of the whole batch, every rank indexing the batch's own
 * [B, S] mask by global row and position, so the mesh (dp rows, cp positions, tp vocabulary) changes nothing.
 */
#include "kernels/modules.h"
#include "run/runner_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int64_t hp__r_scored(const uint8_t *mask, int64_t B, int64_t S)
{
    if (!mask) return B * (S - 1);
    int64_t n = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 1; s < S; s++) n += mask[b * S + s] != 0;
    return n;
}

/* The loss's per-row sums for n rows (loss_rows): the max (f32) and the sum-exp and target (f64), counted. */
static hp_status loss_sums(hp_runner *r, int64_t n, float **mx, double **se, size_t *bytes, hp_err *err)
{
    *bytes = ((size_t)n + 1) * sizeof **mx + ((size_t)n * 2 + 2) * sizeof **se;
    *mx = hp_calloc((size_t)n + 1, sizeof **mx);
    *se = hp_calloc((size_t)n * 2 + 2, sizeof **se);
    if (!*mx || !*se) {
        free(*mx), free(*se);
        *mx = NULL, *se = NULL;
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory for the loss");
    }
    hp__mem_count(&r->x, 0, *bytes);
    return HP_OK;
}

/* A training runner keeps the loss's per-row max and Σexp for the backward's softmax. */
static hp_status keep_loss(hp_runner *r, const float *mx, const double *se, int64_t rows, hp_err *err)
{
    if (rows + 1 > r->sc.loss_cap) { /* counted: (rows + 1) floats and doubles */
        size_t had = (size_t)r->sc.loss_cap, want = (size_t)rows + 1;
        float *a = hp__mem_realloc(&r->x, r->sc.loss_mx, had * sizeof *a, want * sizeof *a);
        if (a) r->sc.loss_mx = a;
        double *b = a ? hp__mem_realloc(&r->x, r->sc.loss_se, had * sizeof *b, want * sizeof *b) : NULL;
        if (!a || !b) return hp_err_set(err, HP_ERR_NOMEM, "out of memory for the loss's statistics");
        r->sc.loss_se = b;
        r->sc.loss_cap = rows + 1;
    }
    memcpy(r->sc.loss_mx, mx, (size_t)rows * sizeof *mx);
    memcpy(r->sc.loss_se, se, (size_t)rows * sizeof *se);
    r->sc.loss_rows = rows;
    return HP_OK;
}

/* Rows [r0, r0 + n) of the loss on z's local rows (z: the logits' geometry as the loss step sees them), their
 * logits in zd [n, z->n[2]]: each row's max, sum-exp and target (the vocab-parallel max and sums all-reduced over
 * tp when z is cut along the vocabulary; docs/run.md, loss-parallel) into mx [n] and se [2n], and the rows this
 * rank scores added to acc (cross-entropy, count) in row order. */
static hp_status loss_rows(hp_runner *r, const hp__step *ls, const hp__act *z, const float *zd, int64_t r0, int64_t n,
                           const int64_t *ids, const uint8_t *mask, int64_t S, float *mx, double *se, double acc[2],
                           hp_err *err)
{
    int64_t vn = z->n[2], vlo = z->lo[2];
    int64_t dp_lo = r->x.dp_rows[r->x.dp_r];
    bool vsplit = ls->split; /* the logits are cut over tp along the vocabulary */
    double *tg = se + n;
#pragma omp parallel for schedule(static) if (n * vn >= HP__PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        int64_t b = (r0 + i) / z->n[1], s = (r0 + i) % z->n[1], p = z->lo[1] + s;
        const float *zr = zd + i * vn;
        float m = -INFINITY;
        for (int64_t j = 0; j < vn; j++) m = zr[j] > m ? zr[j] : m;
        mx[i] = m;
        tg[i] = 0;
        int64_t at = (dp_lo + z->lo[0] + b) * S + p + 1;
        if (p + 1 < S && (!mask || mask[at])) {
            int64_t lab = ids[at];
            if (lab >= vlo && lab < vlo + vn) tg[i] = zr[lab - vlo];
        }
    }
    hp_status st = HP_OK;
    if (vsplit) st = hp__allreduce_max(&r->x, r->x.axc[HP__TP], mx, (size_t)n, err);
    if (st == HP_OK) {
#pragma omp parallel for schedule(static) if (n * vn >= HP__PAR_MIN)
        for (int64_t i = 0; i < n; i++) {
            float m;
            hp__row_max_sumexp(zd + i * vn, vn, mx[i], true, &m, &se[i]);
        }
    }
    if (st == HP_OK && vsplit) {
        double t0 = hp_comm_wtime();
        st = hp_comm_allreduce_sum_f64(r->x.axc[HP__TP], se, (size_t)n * 2, err);
        r->x.st.comm_s += hp_comm_wtime() - t0;
        r->x.st.coll_s[HP_RUN_ALL_REDUCE] += hp_comm_wtime() - t0;
        r->x.st.bytes[HP_RUN_ALL_REDUCE] += (uint64_t)n * 2 * sizeof(double);
        r->x.st.calls[HP_RUN_ALL_REDUCE]++;
    }
    if (st == HP_OK && r->o.keep_activations) st = keep_loss(r, mx, se, n, err); /* the backward's softmax */
    bool contrib = r->x.pos.r[HP__TP] == 0 && (z->lay.ax[HP__CP].kind == HP_PL_S || r->x.pos.r[HP__CP] == 0);
    for (int64_t i = 0; st == HP_OK && contrib && i < n; i++) {
        int64_t b = (r0 + i) / z->n[1], p = z->lo[1] + (r0 + i) % z->n[1];
        if (p + 1 >= S || (mask && !mask[(dp_lo + z->lo[0] + b) * S + p + 1])) continue;
        acc[0] += (double)mx[i] + log(se[i]) - tg[i];
        acc[1] += 1;
    }
    return st;
}

/* The mean over the whole batch from every rank's acc (an all-reduce over the world); frees loss_sums'. */
static hp_status loss_total(hp_runner *r, hp_status st, double acc[2], float *mx, double *se, size_t bytes,
                            double *loss, hp_err *err)
{
    if (st == HP_OK) st = hp_comm_allreduce_sum_f64(r->x.world, acc, 2, err);
    free(mx);
    free(se);
    hp__mem_count(&r->x, bytes, 0);
    *loss = acc[1] > 0 ? acc[0] / acc[1] : NAN;
    return st;
}

/* Mean next-token cross-entropy over the whole batch (docs/run.md, loss-parallel). */
hp_status hp__r_loss(hp_runner *r, const hp__step *ls, const hp__act *z, const int64_t *ids, const uint8_t *mask,
                     int64_t S, double *loss, hp_err *err)
{
    int64_t rows = z->n[0] * z->n[1];
    float *mx;
    double *se, acc[2] = {0, 0};
    size_t bytes;
    hp_status st = loss_sums(r, rows, &mx, &se, &bytes, err);
    if (st != HP_OK) return st;
    st = loss_rows(r, ls, z, z->d, 0, rows, ids, mask, S, mx, se, acc, err);
    return loss_total(r, st, acc, mx, se, bytes, loss, err);
}

/* lm_head and the loss one row chunk at a time (hp__mlp_chunk_end; docs/run.md "Long prefill"): each chunk's
 * logits [n, V_local] go through the head's exit (it moves the vocabulary's tp placement only) into the loss, so
 * a holds one chunk's logits, never the whole [T, V_local]. The same sums in the same order as head_apply then
 * hp__r_loss: the loss is the same to the bit. */
hp_status hp__r_head_loss_chunks(hp_runner *r, const hp__step *s, const hp__step *ls, hp__act *t, hp__act *a,
                                 const int64_t *ids, const uint8_t *mask, int64_t S, double *loss, hp_err *err)
{
    hp_status st = hp__r_enter(r, s, t, err);
    if (st != HP_OK) return st;
    int64_t rows = t->n[0] * t->n[1], H = r->g.cfg.H;
    hp__act z = {.g = {t->g[0], t->g[1], s->X}, .lay = s->leave}; /* the whole logits as the loss sees them */
    hp__act_shape(&r->x, &z);
    float *mx;
    double *se, acc[2] = {0, 0};
    size_t bytes;
    if ((st = loss_sums(r, hp__mlp_chunk_rows(rows, false), &mx, &se, &bytes, err)) != HP_OK) return st;
    /* a chunk is [1, n, V]: its rows are the same on every tp rank, so its layout is the vocabulary's alone */
    hp__lay cl = {{s->out.ax[HP__TP], hp_pl_r()}}, cx = {{s->leave.ax[HP__TP], hp_pl_r()}};
    char what[200];
    snprintf(what, sizeof what, "boundary %s (exit)", s->c.fqn);
    int64_t visit = r->tr.nf.n_visit++, dp_lo = r->x.dp_rows[r->x.dp_r];
    for (int64_t r0 = 0, r1; st == HP_OK && r0 < rows; r0 = r1) {
        r1 = hp__mlp_chunk_end(rows, r0, false);
        const char *coll;
        st = hp__act_alloc(&r->x, a, 1, r1 - r0, s->X, cl, err);
        if (st == HP_OK) st = hp_linear_forward(r->w.head, 0, r1 - r0, t->d + r0 * H, H, a->d, a->n[2], false, err);
        if (st == HP_OK && s->c.has_out) st = hp__redistribute(&r->x, a, &cx, what, &coll, err);
        if (st == HP_OK) hp__nf_watch_rows(&r->tr.nf, visit, s->c.fqn, &z, a->d, r0, r1 - r0, dp_lo);
        if (st == HP_OK) st = loss_rows(r, ls, &z, a->d, r0, r1 - r0, ids, mask, S, mx, se, acc, err);
    }
    return loss_total(r, st, acc, mx, se, bytes, loss, err);
}

