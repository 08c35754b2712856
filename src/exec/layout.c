/*
 * layout.c — layouts and the lowering of their transitions, decided without moving data (exec/layout.h).
 *
 * The block a rank holds along dim d: cp's block of the dim if cp shards it, then tp's block of that if tp
 * shards it (nested cp-major, spec §9.6). Transitions (docs/run.md, lowering table):
 *
 *   S(d) -> R     all-gather along d (blocks padded to the largest; uneven splits work)
 *   P    -> R     all-reduce
 *   P    -> S(d)  reduce-scatter along d (even blocks: one MPI_Reduce_scatter_block; else all-reduce + slice)
 *   R    -> S(d)  local slice
 *
 * Everything else is refused with the transition named. A cp transition of a dim tp also shards would break
 * the nesting (the result would be tp-major) and is refused too.
 */
#include "exec/layout.h"

#include <stdio.h>
#include <string.h>

static const char *const k_axis[HP__NAX] = {"tp", "cp"};

const char *hp__lay_str(const hp__lay *l, char *buf, size_t cap)
{
    char a[16], b[16];
    snprintf(buf, cap, "{tp: %s, cp: %s}", hp_placement_str(l->ax[HP__TP], a, sizeof a),
             hp_placement_str(l->ax[HP__CP], b, sizeof b));
    return buf;
}

bool hp__lay_eq(const hp__lay *a, const hp__lay *b)
{
    for (int i = 0; i < HP__NAX; i++)
        if (!hp_placement_eq(a->ax[i], b->ax[i])) return false;
    return true;
}

static hp_placement norm_pl(hp_placement p)
{
    if (p.kind == HP_PL_ABSENT) return hp_pl_r();
    if ((p.kind == HP_PL_S || p.kind == HP_PL_S2) && p.dim < 0) p.dim = (int8_t)(p.dim + 3);
    return p;
}

hp__lay hp__lay_from(const hp_nplace *pl)
{
    hp__lay l;
    l.ax[HP__TP] = norm_pl(pl->ax[HP_AXIS_TP]);
    l.ax[HP__CP] = norm_pl(pl->ax[HP_AXIS_CP]);
    return l;
}

static const hp_io_entry *io_entry(const hp_io_map *m)
{
    return !m->is_null && m->n > 0 ? &m->e[0] : NULL;
}

hp__contract hp__contract_of(const hp_boundary *b)
{
    hp__contract c = {.fqn = b->fqn};
    const hp_io_entry *is = io_entry(&b->in_src), *id = io_entry(&b->in_dst);
    hp_nplace none = {0};
    if (is || id) {
        c.has_in = true;
        c.in_src = hp__lay_from(is ? &is->pl : &none);
        c.in_dst = hp__lay_from(id ? &id->pl : &none);
    }
    const hp_io_entry *os = io_entry(&b->out_src), *od = io_entry(&b->out_dst);
    if (os && od) {
        c.has_out = true;
        c.out_src = hp__lay_from(&os->pl);
        c.out_dst = hp__lay_from(&od->pl);
    } else if (os) { /* no exit communication, but the computed layout is still declared */
        c.has_out = true;
        c.out_src = c.out_dst = hp__lay_from(&os->pl);
    }
    return c;
}

hp_status hp__contract_check(const hp__contract *c, const hp__lay *l, bool in, hp_err *err)
{
    const hp__lay *want = in ? &c->in_src : &c->out_src;
    if (hp__lay_eq(l, want)) return HP_OK;
    char s1[64], s2[64];
    hp__lay_str(l, s1, sizeof s1);
    hp__lay_str(want, s2, sizeof s2);
    if (in)
        return hp_err_set(err, HP_ERR_INPUT,
                          "boundary %s: its input arrives as %s but the plan's in_src says %s; the plan is "
                          "inconsistent (fix the override that changed the producer's out_dst or this in_src)",
                          c->fqn, s1, s2);
    return hp_err_set(err, HP_ERR_INPUT,
                      "boundary %s: its computation gives %s (from its weights' placements) but the plan's "
                      "out_src says %s; make the override of its params and out_src agree",
                      c->fqn, s1, s2);
}

static bool shards(hp_placement p, int d)
{
    return p.kind == HP_PL_S && p.dim == d;
}

void hp__lay_range(const hp__axes *x, const hp__lay *lay, const int64_t g[3], int d, int64_t tp_i, int64_t cp_i,
                   int64_t *lo, int64_t *n)
{
    int64_t a = 0, L = g[d];
    if (shards(lay->ax[HP__CP], d)) {
        int64_t b0 = hp__blk_lo(L, x->n[HP__CP], cp_i), b1 = hp__blk_lo(L, x->n[HP__CP], cp_i + 1);
        a += b0;
        L = b1 - b0;
    }
    if (shards(lay->ax[HP__TP], d)) {
        int64_t b0 = hp__blk_lo(L, x->n[HP__TP], tp_i), b1 = hp__blk_lo(L, x->n[HP__TP], tp_i + 1);
        a += b0;
        L = b1 - b0;
    }
    *lo = a;
    *n = L;
}

hp_status hp__refuse(const hp__lay *from, const hp__lay *to, int ax, const char *what, const char *why, hp_err *err)
{
    char s1[64], s2[64];
    return hp_err_set(err, HP_ERR_INPUT,
                      "%s: the transition %s -> %s on the %s axis is not one the runtime lowers (%s); change the "
                      "boundary's contract with an override (docs/overrides.md) so that each transition is "
                      "S(d)->R, P->R, P->S(d), R->S(d) or none",
                      what, hp__lay_str(from, s1, sizeof s1), hp__lay_str(to, s2, sizeof s2), k_axis[ax], why);
}

/* n[0]·n[1]·n[2] floats as bytes, or UINT64_MAX past 64 bits (hp__low.bytes). */
static uint64_t f32_bytes(int64_t a, int64_t b, int64_t c)
{
    int64_t n;
    uint64_t r;
    if (!hp_mul_i64(a, b, &n) || !hp_mul_i64(n, c, &n) || __builtin_mul_overflow((uint64_t)n, sizeof(float), &r))
        return UINT64_MAX;
    return r;
}

hp__low hp__lower_axis(const hp__axes *x, const hp__lay *from, const int64_t g[3], int ax, hp_placement dst)
{
    hp__low w = {.kind = HP__LOW_NONE, .d = -1, .bytes = 0, .why = NULL};
    hp_placement src = from->ax[ax];
    if (hp_placement_eq(src, dst)) return w;
    int other = ax == HP__TP ? HP__CP : HP__TP;
    bool s_src = src.kind == HP_PL_S, s_dst = dst.kind == HP_PL_S;
    w.kind = HP__LOW_REFUSE;
    if (src.kind == HP_PL_S2 || dst.kind == HP_PL_S2) return w.why = "a packed placement", w;
    if ((s_src && src.dim > 2) || (s_dst && dst.dim > 2)) return w.why = "an activation has 3 dims", w;
    int d = s_src ? src.dim : s_dst ? dst.dim : -1;
    if (ax == HP__CP && d >= 0 && shards(from->ax[other], d))
        return w.why = "tp shards the same dim; the cp-major nesting would break", w;
    w.d = d;
    int64_t n[3], lo;
    for (int i = 0; i < 3; i++) hp__lay_range(x, from, g, i, x->r[HP__TP], x->r[HP__CP], &lo, &n[i]);
    int64_t gn = x->n[ax], oi = 1; /* oi: the block's elements outside dim d (saturated: bytes UINT64_MAX) */
    for (int i = 0; i < 3; i++)
        if (i != d && !hp_mul_i64(oi, n[i], &oi)) oi = INT64_MAX;
    hp__lay to = *from;
    to.ax[ax] = dst;
    if (s_src && dst.kind == HP_PL_R) { /* all-gather: every member sends the largest block (padded) */
        int64_t mx = 0;
        for (int64_t i = 0; i < gn; i++) {
            int64_t t = ax == HP__TP ? i : x->r[HP__TP], c = ax == HP__CP ? i : x->r[HP__CP], bl;
            hp__lay_range(x, from, g, d, t, c, &lo, &bl);
            mx = bl > mx ? bl : mx;
        }
        w.kind = HP__LOW_ALL_GATHER;
        w.bytes = f32_bytes(oi, mx, 1);
    } else if (src.kind == HP_PL_P && dst.kind == HP_PL_R) {
        w.kind = HP__LOW_ALL_REDUCE;
        w.bytes = f32_bytes(n[0], n[1], n[2]);
    } else if (s_dst && src.kind == HP_PL_R) {
        w.kind = HP__LOW_SLICE;
    } else if (s_dst && src.kind == HP_PL_P) { /* reduce-scatter: even blocks, else all-reduce + slice */
        bool even = true;
        int64_t b0 = 0;
        for (int64_t i = 0; i < gn; i++) {
            int64_t t = ax == HP__TP ? i : x->r[HP__TP], c = ax == HP__CP ? i : x->r[HP__CP], bl;
            hp__lay_range(x, &to, g, d, t, c, &lo, &bl);
            if (i == 0) b0 = bl;
            even = even && bl == b0;
        }
        w.kind = even ? HP__LOW_REDUCE_SCATTER : HP__LOW_RS_UNEVEN;
        w.bytes = even ? f32_bytes(oi, b0, gn) : f32_bytes(n[0], n[1], n[2]);
    } else {
        w.why = src.kind == HP_PL_S && dst.kind == HP_PL_S ? "a shard-to-shard move is an all-to-all"
                : dst.kind == HP_PL_P                      ? "nothing produces a partial sum"
                                                           : "no collective for it";
    }
    return w;
}

hp_run_coll hp__low_coll(hp__low_kind k)
{
    return k == HP__LOW_ALL_GATHER       ? HP_RUN_ALL_GATHER
           : k == HP__LOW_REDUCE_SCATTER ? HP_RUN_REDUCE_SCATTER
           : k == HP__LOW_ALL_REDUCE || k == HP__LOW_RS_UNEVEN ? HP_RUN_ALL_REDUCE
                                                               : HP_RUN_COLL_COUNT;
}

bool hp__gather_in_place(const int64_t *lo, const int64_t *n, int64_t gn)
{
    for (int64_t i = 1; i < gn; i++)
        if (n[i] != n[0] || lo[i] != lo[0] + i * n[0]) return false;
    return true;
}

bool hp__lay_first_whole(const hp__axes *x, const hp__lay *lay, const int64_t g[3])
{
    for (int d = 0; d < 3; d++) {
        int64_t lo, n;
        hp__lay_range(x, lay, g, d, 0, 0, &lo, &n);
        if (lo != 0 || n != g[d]) return false;
    }
    return true;
}
