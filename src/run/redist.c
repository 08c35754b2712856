/*
 * redist.c — activations and their layouts, and the lowering of layout transitions to collectives.
 *
 * An activation is the local block of a global [B, S, X] tensor (B = this dp replica's rows). Its layout has a
 * placement per axis (tp, cp). The block a rank holds along dim d: cp's block of the dim if cp shards it, then
 * tp's block of that if tp shards it (nested cp-major, spec §9.6). Transitions (docs/run.md, lowering table):
 *
 *   S(d) -> R     all-gather along d (blocks padded to the largest; uneven splits work)
 *   P    -> R     all-reduce
 *   P    -> S(d)  reduce-scatter along d (even blocks: one MPI_Reduce_scatter_block; else all-reduce + slice)
 *   R    -> S(d)  local slice
 *
 * Everything else is refused with the transition named. A cp transition of a dim tp also shards would break
 * the nesting (the result would be tp-major) and is refused too.
 */
#include "run/run_int.h"

#include "core/rows.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>



void hp__act_shape(const hp__ctx *x, hp__act *a)
{
    for (int d = 0; d < 3; d++) hp__lay_range(&x->pos, &a->lay, a->g, d, x->pos.r[HP__TP], x->pos.r[HP__CP], &a->lo[d], &a->n[d]);
}

int64_t hp__act_count(const hp__act *a)
{
    return a->n[0] * a->n[1] * a->n[2];
}

void hp__mem_count(hp__ctx *x, size_t old_bytes, size_t new_bytes)
{
    x->mem.cur = x->mem.cur - old_bytes + new_bytes;
    if (x->mem.cur > x->mem.peak) x->mem.peak = x->mem.cur;
}

void *hp__mem_realloc(hp__ctx *x, void *p, size_t old_bytes, size_t new_bytes)
{
    void *q = realloc(p, new_bytes ? new_bytes : 1);
    if (q) hp__mem_count(x, old_bytes, new_bytes);
    return q;
}

void hp__mem_free(hp__ctx *x, void *p, size_t bytes)
{
    if (p) hp__mem_count(x, bytes, 0);
    free(p);
}

static hp_status reserve(hp__ctx *x, hp__act *a, size_t n, hp_err *err)
{
    if (n <= a->cap) return HP_OK;
    size_t bytes;
    if (!hp_mul_size(n, sizeof(float), &bytes))
        return hp_err_set(err, HP_ERR_INPUT, "an activation of %zu floats is past what this machine can address; use "
                          "a smaller batch or sequence", n);
    float *p = hp__mem_realloc(x, a->d, a->cap * sizeof(float), bytes);
    if (!p) return hp_err_set(err, HP_ERR_NOMEM, "out of memory for an activation of %zu floats", n);
    a->d = p;
    a->cap = n;
    return HP_OK;
}

hp_status hp__act_alloc(hp__ctx *x, hp__act *a, int64_t B, int64_t S, int64_t X, hp__lay lay, hp_err *err)
{
    a->g[0] = B, a->g[1] = S, a->g[2] = X;
    a->lay = lay;
    hp__act_shape(x, a);
    int64_t n;
    if (!hp_mul_i64(a->n[0], a->n[1], &n) || !hp_mul_i64(n, a->n[2], &n))
        return hp_err_set(err, HP_ERR_INPUT, "an activation block of [%lld, %lld, %lld] is past what 64-bit sizes "
                          "hold; use a smaller batch or sequence", (long long)a->n[0], (long long)a->n[1],
                          (long long)a->n[2]);
    return reserve(x, a, n ? (size_t)n : 1, err);
}

void hp__act_free(hp__act *a)
{
    free(a->d);
    memset(a, 0, sizeof *a);
}

void hp__act_release(hp__ctx *x, hp__act *a)
{
    if (a->d) hp__mem_count(x, a->cap * sizeof(float), 0);
    hp__act_free(a);
}

void hp__ctx_free(hp__ctx *x)
{
    hp__act_release(x, &x->spare);
    for (int i = 0; i < 2; i++) {
        hp__mem_free(x, x->scratch[i], x->scratch_cap[i] * sizeof(float));
        x->scratch[i] = NULL;
        x->scratch_cap[i] = 0;
    }
}

/* Scratch buffer i of at least n floats (contents undefined), kept for later calls. */
static float *scratch(hp__ctx *x, int i, size_t n, hp_err *err)
{
    if (n == 0) n = 1;
    size_t bytes;
    if (!hp_mul_size(n, sizeof(float), &bytes)) {
        hp_err_set(err, HP_ERR_INPUT, "a collective's buffer of %zu floats is past what this machine can address", n);
        return NULL;
    }
    if (n > x->scratch_cap[i]) {
        float *p = hp__mem_realloc(x, x->scratch[i], x->scratch_cap[i] * sizeof(float), bytes);
        if (!p) {
            hp_err_set(err, HP_ERR_NOMEM, "out of memory for a collective's buffer of %zu floats", n);
            return NULL;
        }
        x->scratch[i] = p;
        x->scratch_cap[i] = n;
    }
    return x->scratch[i];
}

/* ---- timed collectives ---- */

/* One collective: its bytes and calls; its time counts as communication. The kind's time (coll_s) is the
 * whole transition and is added by the caller (one_axis), or here for a bare call (t_kind true). */
static void count_kind(hp__ctx *x, hp_run_coll k, uint64_t bytes, double t0, bool t_kind)
{
    double dt = hp_comm_wtime() - t0;
    x->st.comm_s += dt;
    if (t_kind) x->st.coll_s[k] += dt;
    x->st.bytes[k] += bytes;
    x->st.calls[k]++;
}

/* sync_collectives: waits for the group; the seconds spent go to wait_s (and communication), not a kind. */
static double sync_wait(hp__ctx *x, const hp_comm *c)
{
    if (!x->sync || hp_comm_size(c) < 2) return 0;
    double t0 = hp_comm_wtime();
    hp_err e;
    (void)hp_comm_barrier(c, &e); /* a failure shows in the collective that follows */
    double dt = hp_comm_wtime() - t0;
    x->st.wait_s += dt;
    x->st.comm_s += dt;
    return dt;
}

static void count(hp__ctx *x, hp_run_coll k, uint64_t bytes, double t0)
{
    count_kind(x, k, bytes, t0, false);
}

hp_status hp__allreduce(hp__ctx *x, const hp_comm *c, float *buf, size_t n, hp_err *err)
{
    sync_wait(x, c);
    double t0 = hp_comm_wtime();
    hp_status st = hp_comm_allreduce_sum_f32(c, buf, n, err);
    count_kind(x, HP_RUN_ALL_REDUCE, n * sizeof *buf, t0, true);
    return st;
}

hp_status hp__allreduce_max(hp__ctx *x, const hp_comm *c, float *buf, size_t n, hp_err *err)
{
    sync_wait(x, c);
    double t0 = hp_comm_wtime();
    hp_status st = hp_comm_allreduce_max_f32(c, buf, n, err);
    count_kind(x, HP_RUN_ALL_REDUCE, n * sizeof *buf, t0, true);
    return st;
}

/* ---- block copies along one dim of a local [n0, n1, n2] block ---- */

typedef struct geom {
    int64_t outer, len, inner; /* dims before d, dim d, dims after d */
} geom;

static geom geom_of(const int64_t n[3], int d)
{
    geom g = {1, n[d], 1};
    for (int i = 0; i < d; i++) g.outer *= n[i];
    for (int i = d + 1; i < 3; i++) g.inner *= n[i];
    return g;
}

/* dst [outer, cnt, inner] <- src rows [off, off+cnt) of [outer, len, inner]. */
static void take(float *dst, const float *src, geom g, int64_t off, int64_t cnt)
{
    if (cnt <= 0) return;
    size_t row = (size_t)(cnt * g.inner) * sizeof *dst;
    hp__copy_rows(dst, row, src + off * g.inner, (size_t)(g.len * g.inner) * sizeof *dst, (size_t)g.outer, row);
}

/* dst rows [off, off+cnt) of [outer, len, inner] <- src [outer, cnt, inner]. */
static void put(float *dst, const float *src, geom g, int64_t off, int64_t cnt)
{
    if (cnt <= 0) return;
    size_t row = (size_t)(cnt * g.inner) * sizeof *dst;
    hp__copy_rows(dst + off * g.inner, (size_t)(g.len * g.inner) * sizeof *dst, src, row, (size_t)g.outer, row);
}

/* The blocks of the group members along dim d after the transition (to = the new layout on that axis): member
 * i holds [lo[i], lo[i] + n[i]) of the range the rank holds before, relative to its start. */
static void member_blocks(const hp__ctx *x, const hp__act *a, int ax, const hp__lay *sharded, int d, int64_t *lo,
                          int64_t *n)
{
    int64_t self_lo, self_n; /* the all-gather subtracts member 0's start instead (its range is the result's) */
    hp__lay_range(&x->pos, &a->lay, a->g, d, x->pos.r[HP__TP], x->pos.r[HP__CP], &self_lo, &self_n);
    for (int64_t i = 0; i < x->pos.n[ax]; i++) {
        int64_t t = ax == HP__TP ? i : x->pos.r[HP__TP], c = ax == HP__CP ? i : x->pos.r[HP__CP];
        hp__lay_range(&x->pos, sharded, a->g, d, t, c, &lo[i], &n[i]);
        lo[i] -= self_lo;
    }
    (void)self_n;
}

/* One axis: a's placement on ax becomes `dst`, as hp__lower_axis decides (its bytes are what is counted). */
static hp_status one_axis(hp__ctx *x, hp__act *a, int ax, hp_placement dst, const char *what, const char **coll,
                          hp_err *err)
{
    hp__low lw = hp__lower_axis(&x->pos, &a->lay, a->g, ax, dst);
    if (lw.kind == HP__LOW_NONE) return HP_OK;
    hp__lay to = a->lay;
    to.ax[ax] = dst;
    if (lw.kind == HP__LOW_REFUSE) return hp__refuse(&a->lay, &to, ax, what, lw.why, err);
    const hp_comm *gc = x->axc[ax];
    int64_t gn = x->pos.n[ax], gr_r = x->pos.r[ax];
    int d = lw.d;
    int64_t *lo = hp_calloc((size_t)gn * 2, sizeof *lo);
    if (!lo) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    int64_t *n = lo + gn;
    hp_status st = HP_OK;
    hp__act b = x->spare; /* the result goes into the spare buffer; a's becomes the spare */
    memset(&x->spare, 0, sizeof x->spare);

    sync_wait(x, gc); /* its time is wait_s, not the kind's */
    double t_all = hp_comm_wtime();
    if (lw.kind == HP__LOW_ALL_GATHER) {
        *coll = "all-gather";
        member_blocks(x, a, ax, &a->lay, d, lo, n);
        int64_t mx = 0, base = lo[0];
        for (int64_t i = 0; i < gn; i++) mx = n[i] > mx ? n[i] : mx;
        geom g = geom_of(a->n, d);
        size_t blk = (size_t)(g.outer * mx * g.inner);
        /* Even blocks in member order go straight from a into the result (hp_comm_allgather_rows: through
         * the communicator's shared window on one node, scratch 1 not reserved); else one MPI all-gather when d
         * is outermost (the blocks are contiguous there), or the peers' blocks through scratch 1, reserved when
         * the window declines (off one node, or fallen back to MPI's collectives), each placed once. Uneven
         * blocks are padded to the largest through scratch 0 and 1, then placed. */
        bool direct = hp__gather_in_place(lo, n, gn), contiguous = direct && g.outer == 1;
        float *send = NULL, *recv = NULL;
        if (st == HP_OK) st = hp__act_alloc(x, &b, a->g[0], a->g[1], a->g[2], to, err);
        if (st == HP_OK && !direct && !(send = scratch(x, 0, blk, err))) st = HP_ERR_NOMEM;
        if (st == HP_OK && !direct && !(recv = scratch(x, 1, blk * (size_t)gn, err))) st = HP_ERR_NOMEM;
        if (st == HP_OK && !direct && blk > (size_t)hp__act_count(a)) memset(send, 0, blk * sizeof *send); /* padding */
        if (st == HP_OK) {
            if (!direct) take(send, a->d, g, 0, a->n[d]);
            geom gb = geom_of(b.n, d);
            size_t row = (size_t)(mx * g.inner) * sizeof(float), stride = (size_t)(gb.len * gb.inner) * sizeof(float);
            double t0 = hp_comm_wtime();
            bool done = false;
            if (!direct) st = hp_comm_allgather(gc, send, blk * sizeof *send, recv, err);
            else if (contiguous)
                st = hp_comm_allgather_rows(gc, a->d, 1, blk * sizeof *send, b.d, blk * sizeof *send * (size_t)gn,
                                            NULL, err);
            else if ((st = hp_comm_allgather_rows_shared(gc, a->d, (size_t)g.outer, row, b.d, stride, &done, err)) ==
                         HP_OK && !done) {
                if (!(recv = scratch(x, 1, blk * (size_t)gn, err))) st = HP_ERR_NOMEM;
                else st = hp_comm_allgather_rows(gc, a->d, (size_t)g.outer, row, b.d, stride, recv, err);
            }
            count(x, HP_RUN_ALL_GATHER, lw.bytes, t0);
            for (int64_t i = 0; st == HP_OK && !direct && i < gn; i++)
                put(b.d, recv + (size_t)i * blk, gb, lo[i] - base, n[i]);
        }
        x->st.coll_s[HP_RUN_ALL_GATHER] += hp_comm_wtime() - t_all;
    } else if (lw.kind == HP__LOW_ALL_REDUCE) {
        *coll = "all-reduce";
        st = hp__allreduce(x, gc, a->d, (size_t)hp__act_count(a), err);
        if (st == HP_OK) a->lay = to;
        goto done;
    } else { /* reduce-scatter or slice along d */
        member_blocks(x, a, ax, &to, d, lo, n);
        geom g = geom_of(a->n, d);
        if ((st = hp__act_alloc(x, &b, a->g[0], a->g[1], a->g[2], to, err)) != HP_OK) goto done;
        int64_t me = gr_r;
        if (lw.kind == HP__LOW_SLICE) {
            *coll = "slice";
            take(b.d, a->d, g, lo[me], n[me]);
        } else if (lw.kind == HP__LOW_REDUCE_SCATTER) {
            *coll = "reduce-scatter";
            size_t blk = (size_t)(g.outer * n[0] * g.inner);
            bool direct = g.outer == 1; /* the blocks are contiguous in a already: no packing */
            float *send = direct ? NULL : scratch(x, 0, blk * (size_t)gn, err);
            if (!direct && !send) st = HP_ERR_NOMEM;
            if (st == HP_OK) {
                for (int64_t i = 0; !direct && i < gn; i++) take(send + (size_t)i * blk, a->d, g, lo[i], n[i]);
                double t0 = hp_comm_wtime();
                st = hp_comm_reduce_scatter_sum_f32_shared(gc, direct ? a->d : send, b.d, blk, err);
                count(x, HP_RUN_REDUCE_SCATTER, lw.bytes, t0);
            }
            x->st.coll_s[HP_RUN_REDUCE_SCATTER] += hp_comm_wtime() - t_all;
        } else { /* uneven blocks: all-reduce, then keep this rank's block */
            *coll = "reduce-scatter (all-reduce + slice)";
            st = hp__allreduce(x, gc, a->d, (size_t)hp__act_count(a), err);
            if (st == HP_OK) take(b.d, a->d, g, lo[me], n[me]);
        }
    }
    if (st == HP_OK) { /* the result becomes a; a's buffer the spare */
        float *t = a->d;
        size_t cap = a->cap;
        *a = b;
        b.d = t;
        b.cap = cap;
    }
done:
    if (!x->spare.d) x->spare = b; /* kept for the next transition */
    else hp__act_release(x, &b);
    free(lo);
    return st;
}

hp_status hp__redistribute(hp__ctx *x, hp__act *a, const hp__lay *to, const char *what, const char **coll,
                           hp_err *err)
{
    const char *parts[HP__NAX] = {NULL, NULL};
    hp_status st = HP_OK;
    /* tp first: it is the inner split, so a cp transition never sees a tp-sharded dim it must not touch
     * unless the layouts really nest that way (then it is refused). */
    for (int ax = 0; ax < HP__NAX && st == HP_OK; ax++) st = one_axis(x, a, ax, to->ax[ax], what, &parts[ax], err);
    if (coll) {
        if (!parts[0] && !parts[1]) *coll = "identity";
        else if (parts[0] && parts[1]) {
            snprintf(x->coll_label, sizeof x->coll_label, "%s (tp) + %s (cp)", parts[0], parts[1]);
            *coll = x->coll_label;
        } else *coll = parts[0] ? parts[0] : parts[1];
    }
    return st;
}

/* ---- the whole tensor on rank 0 ---- */

/* Rank r's block of a (its rows of dp replica dpi, the box lo/n of [B_r, S, X]) into full [B_all, S, X]: n0·n1
 * rows of n2 floats, one strided copy per batch row. */
static void place(float *full, const float *src, int64_t row0, int64_t S, int64_t X, const int64_t lo[3],
                  const int64_t n[3])
{
    for (int64_t b = 0; b < n[0]; b++)
        hp__copy_rows(full + ((row0 + lo[0] + b) * S + lo[1]) * X + lo[2], (size_t)X * sizeof *full,
                      src + b * n[1] * n[2], (size_t)n[2] * sizeof *src, (size_t)n[1], (size_t)n[2] * sizeof *src);
}

/* Rank r's box in the whole tensor (global dims g of its dp replica) and whether it sends it. */
static bool rank_box(const hp__ctx *x, const hp__act *a, int r, const int64_t *dp_rows, int64_t *dpi, int64_t lo[3],
                     int64_t n[3])
{
    const hp_mesh *mesh = x->mesh;
    int64_t t = hp_mesh_coord(mesh, r, "tp"), c = hp_mesh_coord(mesh, r, "cp"), nb;
    hp_mesh_batch_index(mesh, r, &nb, dpi, NULL);
    int64_t g[3] = {dp_rows[*dpi + 1] - dp_rows[*dpi], a->g[1], a->g[2]};
    for (int d = 0; d < 3; d++) hp__lay_range(&x->pos, &a->lay, g, d, t, c, &lo[d], &n[d]);
    return !(a->lay.ax[HP__TP].kind == HP_PL_R && t) && !(a->lay.ax[HP__CP].kind == HP_PL_R && c);
}

/* Rank 0 holds its own block: it is placed straight from a (never through the gather's receive buffer); the
 * others' blocks are received into scratch 1 and placed from there. */
hp_status hp__gather_full(hp__ctx *x, const hp__act *a, int64_t B_all, const int64_t *dp_rows, float **out,
                          hp_err *err)
{
    *out = NULL;
    for (int ax = 0; ax < HP__NAX; ax++)
        if (a->lay.ax[ax].kind == HP_PL_P)
            return hp_err_set(err, HP_ERR_INPUT, "%s: a partial sum cannot be gathered (reduce it first)", x->where);
    int world = hp_comm_size(x->world), me = hp_comm_rank(x->world);
    /* A rank sends its block when it is the first holder of it: index 0 on every axis that replicates. */
    bool sender = true;
    for (int ax = 0; ax < HP__NAX; ax++)
        if (a->lay.ax[ax].kind == HP_PL_R && x->pos.r[ax] != 0) sender = false;
    size_t mine = sender ? (size_t)hp__act_count(a) * sizeof(float) : 0;
    size_t *rc = NULL, *rd = NULL;
    float *recv = NULL, *full = NULL;
    hp_status st = HP_OK;
    int64_t X = a->g[2], S = a->g[1], dpi, lo[3], n[3];
    if (me == 0) {
        rc = hp_calloc((size_t)world * 2, sizeof *rc);
        full = hp_calloc((size_t)(B_all * S * X) + 1, sizeof *full);
        if (full) hp__mem_count(x, 0, ((size_t)(B_all * S * X) + 1) * sizeof *full);
        if (!rc || !full) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory for the gathered tensor");
        rd = rc ? rc + world : NULL;
        size_t tot = 0;
        for (int r = 1; st == HP_OK && r < world; r++) {
            bool snd = rank_box(x, a, r, dp_rows, &dpi, lo, n);
            rd[r] = tot;
            rc[r] = snd ? (size_t)(n[0] * n[1] * n[2]) * sizeof(float) : 0;
            tot += rc[r];
        }
        if (st == HP_OK && !(recv = scratch(x, 1, tot / sizeof(float) + 1, err))) st = HP_ERR_NOMEM;
    }
    st = hp_comm_agree(x->world, st, err);
    sync_wait(x, x->world); /* its time is wait_s, not the kind's */
    if (st == HP_OK) {
        double t0 = hp_comm_wtime();
        st = hp_comm_gatherv(x->world, a->d, me == 0 ? 0 : mine, recv, rc, rd, 0, err);
        count_kind(x, HP_RUN_GATHER, mine, t0, true); /* the transfer; placing the blocks is the caller's work */
    }
    for (int r = 0; st == HP_OK && me == 0 && r < world; r++)
        if (rank_box(x, a, r, dp_rows, &dpi, lo, n))
            place(full, r == 0 ? a->d : recv + rd[r] / sizeof(float), dp_rows[dpi], S, X, lo, n);
    if (st == HP_OK && me == 0) {
        *out = full;
        full = NULL;
    }
    free(rc);
    hp__mem_free(x, full, ((size_t)(B_all * S * X) + 1) * sizeof(float));
    return st;
}

hp_status hp__gather_out(hp__ctx *x, hp__act *a, int64_t B_all, const int64_t *dp_rows, bool may_take, float **out,
                         hp_err *err)
{
    *out = NULL;
    bool partial = a->lay.ax[HP__TP].kind == HP_PL_P || a->lay.ax[HP__CP].kind == HP_PL_P;
    if (!may_take || partial || hp_comm_size(x->world) > 1 || !hp__lay_first_whole(&x->pos, &a->lay, a->g)) {
        hp_status st = hp__gather_full(x, a, B_all, dp_rows, out, err);
        if (st == HP_OK && *out) hp__mem_count(x, ((size_t)(B_all * a->g[1] * a->g[2]) + 1) * sizeof(float), 0);
        return st;
    }
    /* One process holding the whole tensor: its buffer is handed on, no byte moves. Counted as the gather it
     * replaces. Not done on more ranks: rank 0's next forward would take the fresh buffer's page faults inside
     * the all-gather that rebuilds the logits (measured: 0.42 of bare, synchronized) instead of here. */
    double t0 = hp_comm_wtime();
    uint64_t mine = (uint64_t)hp__act_count(a) * sizeof(float);
    *out = a->d;
    hp__mem_count(x, a->cap * sizeof(float), 0);
    a->d = NULL;
    a->cap = 0;
    count_kind(x, HP_RUN_GATHER, mine, t0, true);
    return HP_OK;
}
