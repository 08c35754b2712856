/*
 * layout.c — which slice of which tensor each rank of the mesh holds.
 *
 *   plan boundaries ──▶ per parameter: (placement, stack membership) ──▶ tensors[] in model order
 *                                                                          │  a stack at its first member
 *   rank r ──coords (row-major, last axis fastest)──▶ tp / cp / ep index ──┴─▶ hp_shard_rank_tensor(r, i)
 *
 * Invariants: every model parameter is in exactly one tensor (its own, or one stack); a tensor's slices
 * depend only on the rank's (tp, cp, ep) indices, so ranks that differ only in dp (or in an axis no tensor
 * is sharded on) hold identical files and share file_rank. Divisibility is checked once, at build time,
 * for every tensor: the plan's lints guarantee it, a hand-edited plan may not.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard/shard_int.h"

/* How the plan covers one model parameter. */
typedef struct pinfo {
    int boundary; /* -1: uncovered */
    int spec;     /* index into the boundary's params */
    int stack;    /* -1, or index into the boundary's ep_stack */
    int expert;   /* position inside the stack */
} pinfo;


const char *hp_shard_coords_str(const hp_shard_layout *l, int64_t rank, char *buf, size_t cap)
{
    size_t o = 0;
    buf[0] = '\0';
    for (int d = 0; d < l->mesh.n_dims && o < cap; d++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%s=%lld", d ? "," : "", l->mesh.names[d],
                              (long long)l->ranks[rank].coords[d]);
    return buf;
}

/* The size of axis a for tensor t and rank's index along it. */
static void axis_index(const hp_shard_layout *l, const hp_shard_tensor *t, int64_t rank, int a, int64_t *size,
                       int64_t *idx)
{
    if (a == HP_AXIS_TP) {
        *size = l->tp;
        *idx = hp_mesh_coord(&l->mesh, rank, "tp");
    } else if (a == HP_AXIS_CP) {
        *size = l->cp;
        *idx = hp_mesh_coord(&l->mesh, rank, "cp");
    } else {
        int64_t group;
        *size = l->mesh.ep_axis ? l->ep : t->ep_size > 1 ? t->ep_size : 1;
        hp_mesh_ep_index(&l->mesh, *size, rank, &group, idx);
    }
}

/* Keeps the local ranges [a_i, a_i + n_i) of the segments of dim d (local order), mapped back to global. */
static hp_status select_local(hp__segs *s, int d, int n_r, const int64_t *a, const int64_t *n, const char *name,
                              hp_err *err)
{
    int64_t off[HP__SEG_MAX], len[HP__SEG_MAX];
    int k = 0;
    for (int r = 0; r < n_r; r++) {
        int64_t want = a[r], left = n[r], base = 0;
        for (int q = 0; q < s->n[d] && left > 0; q++) {
            int64_t seg_end = base + s->len[d][q];
            if (want < seg_end) {
                int64_t take = seg_end - want < left ? seg_end - want : left;
                int64_t g = s->off[d][q] + (want - base);
                if (k && off[k - 1] + len[k - 1] == g) {
                    len[k - 1] += take;
                } else {
                    if (k == HP__SEG_MAX)
                        return hp_err_set(err, HP_ERR_INPUT,
                                          "tensor '%s': dim %d would be split into more than %d "
                                          "blocks; the plan shards it on too many axes",
                                          name, d, HP__SEG_MAX);
                    off[k] = g;
                    len[k++] = take;
                }
                want += take;
                left -= take;
            }
            base = seg_end;
        }
    }
    s->n[d] = k;
    memcpy(s->off[d], off, (size_t)k * sizeof *off);
    memcpy(s->len[d], len, (size_t)k * sizeof *len);
    return HP_OK;
}

static int64_t segs_total(const hp__segs *s, int d)
{
    int64_t t = 0;
    for (int q = 0; q < s->n[d]; q++) t += s->len[d][q];
    return t;
}

static bool segs_whole(const hp__segs *s, int d)
{
    return s->n[d] == 1 && s->off[d][0] == 0 && s->len[d][0] == s->shape[d];
}

hp_status hp__segs_from_tensor(const hp_shard_tensor *t, hp__segs *s, hp_err *err)
{
    memset(s, 0, sizeof *s);
    s->n_dims = t->n_dims;
    for (int d = 0; d < t->n_dims; d++) {
        s->shape[d] = t->global_shape[d];
        s->n[d] = 1;
        s->len[d][0] = t->global_shape[d];
    }
    int prev = -1;
    for (int i = 0; i < t->n_slices; i++) {
        const hp_shard_slice *sl = &t->slices[i];
        if (sl->dim < 0 || sl->dim >= t->n_dims || sl->dim < prev || sl->offset < 0 || sl->length <= 0 ||
            sl->offset > t->global_shape[sl->dim] - sl->length)
            return hp_err_set(err, HP_ERR_INPUT,
                              "tensor '%s': slice %d (dim %d, offset %lld, length %lld) does not fit "
                              "the global shape",
                              t->name, i, sl->dim, (long long)sl->offset, (long long)sl->length);
        int d = sl->dim;
        if (d != prev) s->n[d] = 0;
        if (s->n[d] == HP__SEG_MAX)
            return hp_err_set(err, HP_ERR_INPUT, "tensor '%s': more than %d slices on dim %d", t->name, HP__SEG_MAX, d);
        s->off[d][s->n[d]] = sl->offset;
        s->len[d][s->n[d]++] = sl->length;
        prev = d;
    }
    return HP_OK;
}

hp_status hp_shard_rank_tensor(const hp_shard_layout *l, int64_t rank, size_t i, hp_shard_tensor *out, hp_err *err)
{
    HP_ASSERT(rank >= 0 && rank < l->world && i < l->n_tensors);
    *out = l->tensors[i];
    if (out->n_stages > 0) { /* a pipeline: only the stages that hold it */
        int64_t stage = hp_mesh_coord(&l->mesh, rank, "pp");
        out->absent = true;
        for (int k = 0; k < out->n_stages; k++) out->absent = out->absent && out->stages[k] != stage;
        if (out->absent) {
            out->nbytes = 0;
            out->n_slices = 0;
            return HP_OK;
        }
    }
    hp__segs s;
    hp_status st = hp__segs_from_tensor(out, &s, err);
    if (st != HP_OK) return st;
    for (int a = 0; a < HP_AXIS_COUNT; a++) {
        hp_placement pl = out->pl.ax[a];
        if (pl.kind != HP_PL_S && pl.kind != HP_PL_S2) continue;
        int64_t size, idx;
        axis_index(l, out, rank, a, &size, &idx);
        if (size <= 1) continue;
        int d = pl.dim < 0 ? pl.dim + out->n_dims : pl.dim;
        char pbuf[16];
        if (d < 0 || d >= out->n_dims)
            return hp_err_set(err, HP_ERR_INPUT,
                              "tensor '%s' has %d dims but the plan shards it %s on %s; the plan "
                              "does not fit this checkpoint",
                              out->name, out->n_dims, hp_placement_str(pl, pbuf, sizeof pbuf),
                              hp_axis_name((hp_axis)a));
        int64_t len = segs_total(&s, d), parts = pl.kind == HP_PL_S2 ? 2 * size : size;
        if (len % parts)
            return hp_err_set(err, HP_ERR_INPUT,
                              "tensor '%s': dim %d (%lld) is not divisible by %s%s=%lld (placement "
                              "%s); the plan does not fit this tensor",
                              out->name, d, (long long)len, pl.kind == HP_PL_S2 ? "2 x " : "", hp_axis_name((hp_axis)a),
                              (long long)size, hp_placement_str(pl, pbuf, sizeof pbuf));
        int64_t c = len / parts, a0[2], n0[2];
        a0[0] = idx * c;
        n0[0] = n0[1] = c;
        a0[1] = len / 2 + idx * c;
        st = select_local(&s, d, pl.kind == HP_PL_S2 ? 2 : 1, a0, n0, out->name, err);
        if (st != HP_OK) return st;
    }
    out->n_slices = 0;
    int64_t n_elems = 1;
    for (int d = 0; d < out->n_dims; d++) {
        out->local_shape[d] = segs_total(&s, d);
        n_elems *= out->local_shape[d]; /* <= the global count, which fits */
        if (segs_whole(&s, d)) continue;
        for (int q = 0; q < s.n[d]; q++) out->slices[out->n_slices++] = (hp_shard_slice){d, s.off[d][q], s.len[d][q]};
    }
    int64_t nb = 0;
    if (!hp_dtype_nbytes(out->dtype, n_elems, &nb)) {
        /* Sub-byte dtype: the byte geometry decides (only dim-0 slicing keeps whole bytes). */
        hp__geom g;
        st = hp__geom_make(out->name, out->dtype, &s, &g, err);
        if (st != HP_OK) return st;
        nb = g.esize;
        for (int d = 0; d < g.n_dims; d++) nb *= segs_total(&g.segs, d);
    }
    out->nbytes = (uint64_t)nb;
    bool ep_dim0 = out->pl.ax[HP_AXIS_EP].kind == HP_PL_S && out->n_dims > 0 &&
                   (out->pl.ax[HP_AXIS_EP].dim == 0 || out->pl.ax[HP_AXIS_EP].dim == -out->n_dims);
    if (out->n_dims > 0 && (out->stacked || (ep_dim0 && !segs_whole(&s, 0)))) {
        out->expert_first = s.off[0][0];
        out->expert_count = out->local_shape[0];
    }
    return HP_OK;
}

/* ---- build ---- */

static const char *join_name(hp_arena *a, const char *fqn, const char *rel)
{
    return fqn[0] ? hp_arena_printf(a, "%s.%s", fqn, rel) : hp_arena_strdup(a, rel);
}

static int param_index(const hp_model *m, const char *name)
{
    const hp_param *p = hp_model_find_param(m, name);
    return p ? (int)(p - m->params) : -1;
}

/* Maps every model parameter to its boundary / spec / stack. */
static hp_status map_params(const hp_model *m, const hp_plan *p, hp_arena *a, pinfo *info, hp_err *err)
{
    for (size_t i = 0; i < m->n_params; i++) info[i] = (pinfo){-1, -1, -1, -1};
    for (size_t b = 0; b < p->n_boundaries; b++) {
        const hp_boundary *bd = &p->boundaries[b];
        for (int k = 0; k < bd->n_params; k++) {
            int stack = -1;
            for (int s = 0; s < bd->n_ep_stack; s++)
                if (strcmp(bd->ep_stack[s].name, bd->params[k].rel) == 0) stack = s;
            int n = stack < 0 ? 1 : bd->ep_stack[stack].n_src;
            for (int e = 0; e < n; e++) {
                const char *rel = stack < 0 ? bd->params[k].rel : bd->ep_stack[stack].src[e];
                const char *full = join_name(a, bd->fqn, rel);
                if (!full) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
                int pi = param_index(m, full);
                if (pi < 0)
                    return hp_err_set(err, HP_ERR_INPUT,
                                      "the plan names parameter '%s' (boundary '%s') but the "
                                      "checkpoint %s has no such tensor; the plan was made for another model",
                                      full, bd->fqn, m->path);
                if (info[pi].boundary < 0) info[pi] = (pinfo){(int)b, k, stack, e};
            }
        }
    }
    return HP_OK;
}

typedef struct rkey {
    int64_t key, rank;
} rkey;

static int rkey_cmp(const void *a, const void *b)
{
    const rkey *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return x->rank < y->rank ? -1 : x->rank > y->rank;
}

/* Ranks with the same (tp, cp, ep) indices on the axes some tensor is sharded on hold the same bytes. */
static hp_status assign_file_ranks(hp_shard_layout *l, hp_err *err)
{
    bool used[HP_AXIS_COUNT] = {false};
    int ep_probe = -1;
    for (size_t i = 0; i < l->n_tensors; i++)
        for (int a = 0; a < HP_AXIS_COUNT; a++) {
            int k = l->tensors[i].pl.ax[a].kind;
            if (k == HP_PL_S || k == HP_PL_S2) {
                used[a] = true;
                if (a == HP_AXIS_EP && ep_probe < 0) ep_probe = (int)i;
            }
        }
    rkey *keys = malloc((size_t)l->world * sizeof *keys);
    if (!keys) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    for (int64_t r = 0; r < l->world; r++) {
        int64_t key = hp_mesh_coord(&l->mesh, r, "pp"), size, idx; /* pipeline stages hold other tensors */
        for (int a = 0; a < HP_AXIS_COUNT; a++) {
            if (!used[a]) continue;
            axis_index(l, a == HP_AXIS_EP ? &l->tensors[ep_probe] : &l->tensors[0], r, a, &size, &idx);
            key = key * size + idx; /* mixed radix: pp x tp x cp x ep sizes, each <= 2^16, fit */
        }
        keys[r] = (rkey){key, r};
    }
    qsort(keys, (size_t)l->world, sizeof *keys, rkey_cmp);
    for (int64_t i = 0; i < l->world; i++) {
        int64_t first = (i > 0 && keys[i - 1].key == keys[i].key) ? l->ranks[keys[i - 1].rank].file_rank : keys[i].rank;
        l->ranks[keys[i].rank].file_rank = first;
    }
    free(keys);
    return HP_OK;
}

static hp_status fill_tensor(hp_shard_layout *l, const hp_model *m, const hp_plan *p, const pinfo *info, size_t i,
                             hp_shard_tensor *t, hp_err *err)
{
    const hp_param *pm = &m->params[i];
    memset(t, 0, sizeof *t);
    t->dtype = pm->dtype;
    t->ep_size = 1;
    int n = 1;
    const hp_boundary *bd = info[i].boundary >= 0 ? &p->boundaries[info[i].boundary] : NULL;
    if (bd) {
        t->pl = bd->params[info[i].spec].pl;
        t->ep_size = l->mesh.ep_axis ? (int)l->ep : bd->ep_size > 1 ? bd->ep_size : (int)l->ep;
    }
    if (bd && info[i].stack >= 0) {
        const hp_ep_stack *s = &bd->ep_stack[info[i].stack];
        n = s->n_src;
        t->stacked = true;
        t->name = join_name(&l->arena, bd->fqn, s->name);
        if (t->name && param_index(m, t->name) >= 0)
            return hp_err_set(err, HP_ERR_INPUT,
                              "stacked expert name '%s' is also a tensor of the checkpoint; "
                              "the rank file could not hold both",
                              t->name);
        if (pm->n_dims + 1 > HP_MAX_DIMS)
            return hp_err_set(err, HP_ERR_INPUT, "tensor '%s': stacking %d-dim experts exceeds %d dims", t->name,
                              pm->n_dims, HP_MAX_DIMS);
    } else {
        t->name = pm->name;
    }
    const char **globals = hp_arena_alloc(&l->arena, (size_t)n * sizeof *globals);
    int *params = hp_arena_alloc(&l->arena, (size_t)n * sizeof *params);
    if (!t->name || !globals || !params) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    for (int e = 0; e < n; e++) {
        int pi = (int)i;
        if (t->stacked) {
            pi = param_index(m, join_name(&l->arena, bd->fqn, bd->ep_stack[info[i].stack].src[e]));
            if (pi < 0) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
            const hp_param *q = &m->params[pi];
            if (q->dtype != pm->dtype || q->n_dims != pm->n_dims ||
                memcmp(q->shape, pm->shape, (size_t)pm->n_dims * sizeof *pm->shape) != 0)
                return hp_err_set(err, HP_ERR_INPUT,
                                  "stack '%s': expert tensor '%s' differs in dtype or shape from "
                                  "'%s'; experts of one stack must match",
                                  t->name, q->name, pm->name);
        }
        globals[e] = m->params[pi].name;
        params[e] = pi;
    }
    if (p->pipe.pp > 1) t->n_stages = hp_pipeline_param_stages(p, globals[0], t->stages);
    t->n_globals = n;
    t->globals = globals;
    t->params = params;
    t->n_dims = pm->n_dims + (t->stacked ? 1 : 0);
    if (t->stacked) t->global_shape[0] = n;
    memcpy(t->global_shape + (t->stacked ? 1 : 0), pm->shape, (size_t)pm->n_dims * sizeof *pm->shape);
    memcpy(t->local_shape, t->global_shape, sizeof t->local_shape);
    int64_t total = 0;
    if (!hp_mul_i64((int64_t)pm->nbytes, n, &total))
        return hp_err_set(err, HP_ERR_INPUT, "stack '%s' is too large", t->name);
    t->nbytes = (uint64_t)total;
    return HP_OK;
}

hp_status hp_shard_layout_build(hp_shard_layout **out, const hp_model *m, const hp_plan *p, hp_err *err)
{
    *out = NULL;
    /* A meta model (config.json) has the shapes too: the runtime cuts a shard folder's view with it; writing
     * needs weights, which hp_shard_write checks. */
    int64_t world = 1;
    for (int d = 0; d < p->mesh.n_dims; d++)
        if (!hp_mul_i64(world, p->mesh.sizes[d], &world) || world > HP_SHARD_MAX_WORLD)
            return hp_err_set(err, HP_ERR_INPUT,
                              "the mesh has more than %d ranks; rank files are numbered with five "
                              "digits",
                              HP_SHARD_MAX_WORLD);
    hp_shard_layout *l = hp_calloc(1, sizeof *l);
    pinfo *info = hp_calloc(m->n_params ? m->n_params : 1, sizeof *info);
    bool *emitted = NULL;
    if (!l || !info) {
        free(l);
        free(info);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    }
    hp_arena_init(&l->arena);
    l->mesh = p->mesh;
    l->world = world;
    l->tp = hp_mesh_size(&p->mesh, "tp");
    l->cp = hp_mesh_size(&p->mesh, "cp");
    l->ep = hp_plan_ep_size(p);
    hp_status st = HP_OK;
    if (!p->mesh.ep_axis && l->ep > 1 && world % l->ep)
        st = hp_err_set(err, HP_ERR_INPUT, "ep_size (%lld) must divide the dense region (%lld)", (long long)l->ep,
                        (long long)world);
    if (st == HP_OK) st = map_params(m, p, &l->arena, info, err);
    l->tensors = hp_arena_alloc(&l->arena, (m->n_params ? m->n_params : 1) * sizeof *l->tensors);
    l->ranks = hp_arena_alloc(&l->arena, (size_t)world * sizeof *l->ranks);
    emitted = hp_calloc(m->n_params ? m->n_params : 1, sizeof *emitted); /* by the stack's expert-0 parameter */
    if (st == HP_OK && (!l->tensors || !l->ranks || !emitted)) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; st == HP_OK && i < m->n_params; i++) {
        if (info[i].stack >= 0) {
            /* A stack is described by its expert 0 and placed where its first member comes in model order. */
            const hp_boundary *bd = &p->boundaries[info[i].boundary];
            int first = param_index(m, join_name(&l->arena, bd->fqn, bd->ep_stack[info[i].stack].src[0]));
            if (first < 0) first = (int)i;
            if (emitted[first]) continue;
            emitted[first] = true;
            st = fill_tensor(l, m, p, info, (size_t)first, &l->tensors[l->n_tensors], err);
        } else {
            if (info[i].boundary < 0) l->n_uncovered++;
            st = fill_tensor(l, m, p, info, i, &l->tensors[l->n_tensors], err);
        }
        if (st == HP_OK) l->n_tensors++;
    }
    for (int64_t r = 0; st == HP_OK && r < world; r++) {
        l->ranks[r].rank = r;
        int64_t rem = r;
        for (int d = p->mesh.n_dims - 1; d >= 0; d--) {
            l->ranks[r].coords[d] = rem % p->mesh.sizes[d];
            rem /= p->mesh.sizes[d];
        }
    }
    /* Checks every slice of every rank (divisibility, sub-byte dtypes) and totals each rank's bytes. */
    for (int64_t r = 0; st == HP_OK && r < world; r++)
        for (size_t i = 0; st == HP_OK && i < l->n_tensors; i++) {
            hp_shard_tensor t;
            st = hp_shard_rank_tensor(l, r, i, &t, err);
            if (st == HP_OK) l->ranks[r].nbytes += t.nbytes;
        }
    if (st == HP_OK) st = assign_file_ranks(l, err);
    free(info);
    free(emitted);
    if (st != HP_OK) {
        hp_shard_layout_free(l);
        return st;
    }
    *out = l;
    return HP_OK;
}

void hp_shard_layout_free(hp_shard_layout *l)
{
    if (!l) return;
    hp_arena_free(&l->arena);
    free(l);
}
