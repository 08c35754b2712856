/*
 * weights.c — one rank's slices of the parameters, from the checkpoint (sliced through its mapping) or from
 * the rank's file of a `hyperpar shard` folder.
 *
 * Both go through the shard layout (hp_shard_layout) of the same model and plan, so the bytes are identical
 * either way: a checkpoint tensor is cut by the rank's slices; a rank file's tensor must already be exactly
 * that cut (same local shape and slices), else the folder was made for another plan and is refused. F32 and
 * BF16 stay as stored (BF16 weights are read by the GEMM layer as they are, docs/kernels.md); other float
 * dtypes are widened to f32.
 */
#include "run/weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct seg {
    int64_t off, len;
} seg;

/* Copies the elements of tensor t of file f (global shape g, n dims) selected by segs into *dst, row-major,
 * advancing *dst. Every read goes through hp_st_read: a file truncated meanwhile is an error, not SIGBUS. */
static hp_status copy_rec(const hp_st_file *f, const hp_st_tensor *t, const int64_t *g, int n, int d,
                          seg segs[][2], const int *nseg, int64_t base, size_t es, uint8_t **dst, hp_err *err)
{
    for (int k = 0; k < nseg[d]; k++) {
        if (d == n - 1) {
            size_t b = (size_t)segs[d][k].len * es;
            hp_status st = hp_st_read(f, t, (uint64_t)(base + segs[d][k].off) * es, *dst, b, err);
            if (st != HP_OK) return st;
            *dst += b;
            continue;
        }
        for (int64_t i = 0; i < segs[d][k].len; i++) {
            hp_status st = copy_rec(f, t, g, n, d + 1, segs, nseg, (base + segs[d][k].off + i) * g[d + 1], es, dst,
                                    err);
            if (st != HP_OK) return st;
        }
    }
    return HP_OK;
}

/* The segments of each dim that t's rank holds (at most two: a packed S(0)x2 cut), in dim order. */
static void segments_of(const hp_shard_tensor *t, seg segs[][2], int *nseg)
{
    for (int d = 0; d < t->n_dims; d++) {
        nseg[d] = 0;
        for (int k = 0; k < t->n_slices; k++)
            if (t->slices[k].dim == d && nseg[d] < 2) segs[d][nseg[d]++] = (seg){t->slices[k].offset, t->slices[k].length};
        if (!nseg[d]) segs[d][nseg[d]++] = (seg){0, t->global_shape[d]};
    }
}

static void place_rec(const hp_shard_tensor *t, int d, seg segs[][2], const int *nseg, int64_t base,
                      const float **src, float *dst)
{
    const int64_t *g = t->global_shape;
    for (int k = 0; k < nseg[d]; k++) {
        if (d == t->n_dims - 1) {
            memcpy(dst + base + segs[d][k].off, *src, (size_t)segs[d][k].len * sizeof *dst);
            *src += segs[d][k].len;
            continue;
        }
        for (int64_t i = 0; i < segs[d][k].len; i++)
            place_rec(t, d + 1, segs, nseg, (base + segs[d][k].off + i) * g[d + 1], src, dst);
    }
}

void hp__w_place(const hp_shard_tensor *t, const float *local, float *whole)
{
    if (t->n_dims == 0) {
        whole[0] = local[0];
        return;
    }
    seg segs[HP_MAX_DIMS][2];
    int nseg[HP_MAX_DIMS];
    segments_of(t, segs, nseg);
    place_rec(t, 0, segs, nseg, 0, &local, whole);
}

static int find_tensor(const hp_shard_layout *l, const char *name)
{
    for (size_t i = 0; i < l->n_tensors; i++)
        if (!strcmp(l->tensors[i].name, name)) return (int)i;
    return -1;
}

static bool same_cut(const hp_shard_tensor *a, const hp_shard_tensor *b)
{
    if (a->n_dims != b->n_dims || a->n_slices != b->n_slices) return false;
    for (int d = 0; d < a->n_dims; d++)
        if (a->local_shape[d] != b->local_shape[d] || a->global_shape[d] != b->global_shape[d]) return false;
    for (int i = 0; i < a->n_slices; i++)
        if (a->slices[i].dim != b->slices[i].dim || a->slices[i].offset != b->slices[i].offset ||
            a->slices[i].length != b->slices[i].length)
            return false;
    return true;
}

hp_status hp__w_cut(const hp__wsrc *s, const char *name, int64_t rank, hp_shard_tensor *t, hp_err *err)
{
    int i = find_tensor(s->layout, name);
    if (i < 0) return hp_err_set(err, HP_ERR_INPUT, "the plan's cut has no tensor '%s'", name);
    return hp_shard_rank_tensor(s->layout, rank, (size_t)i, t, err);
}

hp_status hp__w_load(hp__wsrc *s, const char *name, bool required, bool keep_bf16, hp__w *out, hp_err *err)
{
    memset(out, 0, sizeof *out);
    int i = find_tensor(s->layout, name);
    if (i < 0) {
        if (!required) return HP_OK;
        return hp_err_set(err, HP_ERR_INPUT, "%s: the checkpoint has no tensor '%s', which the forward pass needs",
                          s->m->path, name);
    }
    hp_shard_tensor t;
    hp_status st = hp_shard_rank_tensor(s->layout, s->rank, (size_t)i, &t, err);
    if (st != HP_OK) return st;
    if (t.stacked)
        return hp_err_set(err, HP_ERR_INPUT, "'%s' is a stack of experts; the dense runtime does not load it", name);
    int64_t n = 1;
    for (int d = 0; d < t.n_dims; d++) n *= t.local_shape[d];
    size_t es = (size_t)hp_dtype_bits(t.dtype) / 8;
    if (es == 0 || hp_dtype_bits(t.dtype) % 8)
        return hp_err_set(err, HP_ERR_INPUT, "'%s' is stored as %s, which the runtime cannot compute with", name,
                          hp_dtype_name(t.dtype));
    const hp_st_file *src_file = NULL;
    const hp_st_tensor *src_t = NULL;
    bool whole = false; /* the source already holds exactly the rank's cut */
    if (s->rf) {
        const hp_shard_tensor *sh = hp_shard_rank_find(s->rf, name, NULL);
        if (!sh || sh->stacked || !same_cut(sh, &t))
            return hp_err_set(err, HP_ERR_INPUT,
                              "%s: rank %lld's file %s '%s' as this plan cuts it; the shard folder was made for "
                              "another mesh or plan (shard the model again with the same flags, or run with the "
                              "folder's mesh)",
                              s->rf->dir, (long long)s->rank, sh ? "does not hold" : "lacks", name);
        const hp_st_tensor *ft = hp_st_find(s->rf->file, sh->name);
        src_file = s->rf->file;
        src_t = ft;
        whole = true;
        t.dtype = ft->dtype; /* a meta model's dtype is config.json's; the file's is what is stored */
        es = (size_t)hp_dtype_bits(t.dtype) / 8;
        if (es == 0 || hp_dtype_bits(t.dtype) % 8 || ft->n_elems != n)
            return hp_err_set(err, HP_ERR_INPUT, "%s: '%s' in rank %lld's file is %s with %lld elements; the runtime "
                              "needs %lld of a float dtype", s->rf->dir, name, (long long)s->rank,
                              hp_dtype_name(ft->dtype), (long long)ft->n_elems, (long long)n);
    } else {
        const hp_ckpt_tensor *ct = hp_ckpt_find(s->m->ckpt, name);
        if (!ct) return hp_err_set(err, HP_ERR_INPUT, "%s: tensor '%s' is missing", s->m->path, name);
        src_file = ct->file;
        src_t = ct->t;
    }
    bool keep = t.dtype == HP_DT_F32 || (t.dtype == HP_DT_BF16 && keep_bf16);
    size_t raw_bytes = (size_t)n * es;
    uint8_t *raw = hp_calloc(raw_bytes ? raw_bytes : 1, 1);
    if (!raw) return hp_err_set(err, HP_ERR_NOMEM, "out of memory for '%s' (%zu bytes)", name, raw_bytes);
    if (whole) {
        st = hp_st_read(src_file, src_t, 0, raw, raw_bytes, err);
    } else {
        seg segs[HP_MAX_DIMS][2];
        int nseg[HP_MAX_DIMS];
        segments_of(&t, segs, nseg);
        uint8_t *at = raw;
        if (t.n_dims == 0) st = hp_st_read(src_file, src_t, 0, raw, es, err);
        else st = copy_rec(src_file, src_t, t.global_shape, t.n_dims, 0, segs, nseg, 0, es, &at, err);
    }
    if (st != HP_OK) {
        free(raw);
        return st;
    }
    out->n_dims = t.n_dims;
    for (int d = 0; d < t.n_dims; d++) {
        out->shape[d] = t.local_shape[d];
        out->lo[d] = 0;
        out->global[d] = t.global_shape[d];
    }
    for (int k = 0; k < t.n_slices; k++)
        if (out->lo[t.slices[k].dim] == 0) out->lo[t.slices[k].dim] = t.slices[k].offset;
    out->pl = t.pl;
    out->n = n;
    out->present = true;
    if (keep) {
        out->d = raw;
        out->dt = t.dtype;
    } else {
        float *f = hp_calloc((size_t)n + 1, sizeof *f);
        if (!f) {
            free(raw);
            return hp_err_set(err, HP_ERR_NOMEM, "out of memory for '%s'", name);
        }
        st = hp_dtype_to_f32(t.dtype, raw, f, n, err);
        free(raw);
        if (st != HP_OK) {
            free(f);
            return st;
        }
        out->d = f;
        out->dt = HP_DT_F32;
    }
    s->resident += (uint64_t)n * (out->dt == HP_DT_BF16 ? 2 : 4);
    s->share += t.nbytes;
    return HP_OK;
}

void hp__w_free(hp__w *w)
{
    free(w->d);
    memset(w, 0, sizeof *w);
}
