/*
 * tol.c — the one tolerance check: max|got − ref| ≤ rtol·max|ref|, with the worst coordinates reported.
 */
#include "hyperpar/run.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

bool hp_tol_check(const float *got, const float *ref, int n_dims, const int64_t *shape, double rtol, hp_tol *out)
{
    memset(out, 0, sizeof *out);
    out->n_dims = n_dims;
    int64_t n = 1;
    for (int d = 0; d < n_dims; d++) {
        out->shape[d] = shape[d];
        n *= shape[d];
    }
    double mx = 0, md = 0;
    int64_t worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double r = fabs((double)ref[i]);
        if (r > mx) mx = r;
        double d = fabs((double)got[i] - (double)ref[i]);
        if (!isfinite(d)) d = INFINITY;
        if (d > md || (i == 0 && d == md)) {
            md = d;
            worst = i;
        }
    }
    out->max_diff = md;
    out->max_ref = mx;
    out->tol = rtol * mx;
    out->worst = worst;
    out->ok = md <= out->tol;
    return out->ok;
}

const char *hp_tol_str(const hp_tol *t, char *buf, size_t cap)
{
    char at[160] = "";
    int64_t c[HP_MAX_DIMS], w = t->worst;
    for (int d = t->n_dims - 1; d >= 0; d--) {
        c[d] = t->shape[d] ? w % t->shape[d] : 0;
        w = t->shape[d] ? w / t->shape[d] : 0;
    }
    for (int d = 0; d < t->n_dims; d++)
        snprintf(at + strlen(at), sizeof at - strlen(at), "%s%lld", d ? ", " : "", (long long)c[d]);
    snprintf(buf, cap, "max diff %.3g at [%s] (tolerance %.3g = %.0e x max|ref| %.4g): %s", t->max_diff, at, t->tol,
             t->max_ref > 0 ? t->tol / t->max_ref : 0.0, t->max_ref, t->ok ? "OK" : "MISMATCH");
    return buf;
}
