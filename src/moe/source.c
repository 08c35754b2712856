/*
 * source.c — where a sparse layer's tensors come from: a checkpoint, or one rank file of a shard folder.
 *
 * The loader (load.c) never touches a file directly. It asks for `<block>.<suffix>` and gets a view
 * (hp__moe_tview) that gives the tensor's global name and shape and maps global element indices to the
 * stored ones:
 *
 *   checkpoint   hp_model + its hp_ckpt: every tensor whole                       stored = global
 *   shard folder rank-XXXXX.safetensors of `hyperpar shard` (hp_shard_rank_file) + config.json (meta model):
 *                plain tensors whole (router, shared expert)                      stored = global
 *                batched experts cut on dim 0: [E, ...] held as [f0, f0 + n0)     stored = global - f0·inner
 *                per-expert names stacked: <block>.experts.gate_proj [n0, I, H]   expert e's element j is
 *                                                                                 stored at (e - f0)·I·H + j
 *
 * Invariant: a view holds the global elements [lo, hi); reading outside them (a TP-sliced router or shared
 * expert, an expert of another rank) is an error that names the tensor and its slice, never a silent zero.
 * Shapes come from readers that overflow-checked their element counts (hp_st_open, hp_shard_rank_open), so
 * products of one tensor's dims fit in int64.
 */
#include "moe/source.h"
#include "io/json.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- tensor access ---- */

static int64_t prod(const int64_t *shape, int from, int to)
{
    int64_t n = 1;
    for (int d = from; d < to; d++) n *= shape[d]; /* shapes are overflow-checked by their readers */
    return n;
}

/* "dim 0 [8, 16), dim 1 [0, 32)" of a manifest entry into buf. */
static const char *slices_str(const hp_shard_tensor *sh, char *buf, size_t cap)
{
    buf[0] = 0;
    for (int i = 0; i < sh->n_slices; i++)
        snprintf(buf + strlen(buf), cap - strlen(buf), "%sdim %d [%lld, %lld)", i ? ", " : "", sh->slices[i].dim,
                 (long long)sh->slices[i].offset, (long long)(sh->slices[i].offset + sh->slices[i].length));
    return buf;
}

static const char *shape_str(int n_dims, const int64_t *shape, char *buf, size_t cap)
{
    snprintf(buf, cap, "[");
    for (int d = 0; d < n_dims; d++)
        snprintf(buf + strlen(buf), cap - strlen(buf), "%s%lld", d ? ", " : "", (long long)shape[d]);
    snprintf(buf + strlen(buf), cap - strlen(buf), "]");
    return buf;
}

/* The view of global tensor `name` in a shard rank file; false when the file holds no such tensor. */
static bool view_shard(const hp_shard_rank_file *rf, const char *name, hp__moe_tview *v)
{
    int64_t e = -1;
    const hp_shard_tensor *sh = hp_shard_rank_find(rf, name, &e);
    if (!sh) return false;
    memset(v, 0, sizeof *v);
    v->sh = sh;
    v->file = rf->file;
    v->t = hp_st_find(rf->file, sh->name); /* present: hp_shard_rank_open checked every entry */
    v->dtype = sh->dtype;
    /* Dim 0 held: its one slice, or whole. */
    int64_t f0 = 0, n0 = sh->global_shape[0];
    bool other = false; /* slices beyond one on dim 0 */
    for (int i = 0; i < sh->n_slices; i++) {
        if (sh->slices[i].dim == 0 && i == 0) {
            f0 = sh->slices[i].offset;
            n0 = sh->slices[i].length;
        } else {
            other = true;
        }
    }
    /* The held box, per view dim (a stack member's dims are the stored dims after the stack's). */
    const int d0 = e >= 0 ? 1 : 0;
    int64_t per_local = 1;
    for (int d = d0; d < sh->n_dims; d++) {
        int k = 0;
        for (int i = 0; i < sh->n_slices; i++)
            if (sh->slices[i].dim == d && k < 2) {
                v->seg_lo[d - d0][k] = sh->slices[i].offset;
                v->seg_n[d - d0][k++] = sh->slices[i].length;
            }
        if (!k) {
            v->seg_lo[d - d0][0] = 0;
            v->seg_n[d - d0][k++] = sh->global_shape[d];
        }
        v->nseg[d - d0] = k;
        v->lshape[d - d0] = v->seg_n[d - d0][0] + (k > 1 ? v->seg_n[d - d0][1] : 0);
        per_local *= v->lshape[d - d0];
    }
    if (e >= 0) {
        int64_t s0 = 0, sn = sh->global_shape[0]; /* the stack's experts held */
        for (int i = 0; i < sh->n_slices; i++)
            if (sh->slices[i].dim == 0) {
                s0 = sh->slices[i].offset;
                sn = sh->slices[i].length;
                break;
            }
        v->absent = e < s0 || e >= s0 + sn;
        v->base = (e - s0) * per_local;
    }
    if (e >= 0) { /* one expert of a stack [E, per-expert shape...] */
        v->name = sh->globals[e];
        v->n_dims = sh->n_dims - 1;
        memcpy(v->shape, sh->global_shape + 1, (size_t)v->n_dims * sizeof *v->shape);
        int64_t per = prod(v->shape, 0, v->n_dims);
        bool held = !other && e >= f0 && e < f0 + n0;
        v->lo = 0;
        v->hi = held ? per : 0;
        v->shift = (e - f0) * per;
    } else {
        v->name = sh->globals[0];
        v->n_dims = sh->n_dims;
        memcpy(v->shape, sh->global_shape, (size_t)v->n_dims * sizeof *v->shape);
        int64_t inner = prod(v->shape, 1, v->n_dims);
        v->lo = other ? 0 : f0 * inner;
        v->hi = other ? 0 : (f0 + n0) * inner;
        v->shift = -v->lo;
    }
    return true;
}

bool hp__moe_src_find(hp__moe_src *ld, const char *suffix, hp__moe_tview *v)
{
    char name[256];
    snprintf(name, sizeof name, "%s.%s", ld->block, suffix);
    if (ld->rf) return view_shard(ld->rf, name, v);
    const hp_ckpt_tensor *ct = hp_ckpt_find(ld->m->ckpt, name);
    if (!ct) return false;
    memset(v, 0, sizeof *v);
    v->name = ct->t->name;
    v->file = ct->file;
    v->t = ct->t;
    v->dtype = ct->t->dtype;
    v->n_dims = ct->t->n_dims;
    memcpy(v->shape, ct->t->shape, (size_t)v->n_dims * sizeof *v->shape);
    v->lo = 0;
    v->hi = ct->t->n_elems;
    for (int d = 0; d < v->n_dims; d++) {
        v->nseg[d] = 1;
        v->seg_n[d][0] = v->lshape[d] = v->shape[d];
    }
    return true;
}

bool hp__moe_src_has(hp__moe_src *ld, const char *suffix)
{
    hp__moe_tview v;
    return hp__moe_src_find(ld, suffix, &v);
}

hp_status hp__moe_src_need(hp__moe_src *ld, const char *suffix, int n_dims, const int64_t *shape, hp__moe_tview *out)
{
    char want[96], got[96];
    shape_str(n_dims, shape, want, sizeof want);
    if (!hp__moe_src_find(ld, suffix, out))
        return hp_err_set(ld->err, HP_ERR_INPUT,
                          "tensor '%s.%s' %s is missing%s%s; archetype %s needs it for layer %lld "
                          "(check the checkpoint is complete, or choose another --archetype)",
                          ld->block, suffix, want, ld->rf ? " from " : "", ld->rf ? ld->rf->path : "",
                          hp_moe_archetype_name(ld->l->archetype), (long long)ld->l->layer);
    bool ok = out->n_dims == n_dims;
    for (int d = 0; ok && d < n_dims; d++) ok = out->shape[d] == shape[d];
    if (!ok)
        return hp_err_set(ld->err, HP_ERR_INPUT,
                          "tensor '%s.%s' has shape %s but layer %lld of this config needs %s; the checkpoint and "
                          "config.json disagree",
                          ld->block, suffix, shape_str(out->n_dims, out->shape, got, sizeof got),
                          (long long)ld->l->layer, want);
    return HP_OK;
}

/* Elements [elem_off, elem_off + n) of v must be held; the error explains a rank file's slice. */
static hp_status check_held(hp__moe_src *ld, const hp__moe_tview *v, int64_t elem_off, int64_t n)
{
    if (elem_off >= v->lo && n <= v->hi - elem_off) return HP_OK;
    char sl[160], gs[96];
    if (!v->sh)
        return hp_err_set(ld->err, HP_ERR_INPUT, "tensor '%s': elements [%lld, %lld) are outside the tensor", v->name,
                          (long long)elem_off, (long long)(elem_off + n));
    return hp_err_set(ld->err, HP_ERR_INPUT,
                      "%s: tensor '%s'%s is held only as the slice %s of global shape %s (rank %lld's file holds "
                      "no whole copy), but this load needs it whole (the router always; the experts and the shared "
                      "expert unless the load cuts them over tp, as hyperpar run does for a plan that cuts them): "
                      "shard with --tp 1 for MoE runs of whole experts (e.g. hyperpar shard MODEL --dp N --ep N), "
                      "shard again with the flags of the run, or run from the full checkpoint",
                      ld->rf->path, v->sh->name, v->sh->stacked ? " (a stack of per-expert weights)" : "",
                      v->sh->n_slices ? slices_str(v->sh, sl, sizeof sl) : "(none)",
                      shape_str(v->sh->n_dims, v->sh->global_shape, gs, sizeof gs), (long long)ld->rf->rank);
}

/* Widens n elements starting at global element elem_off of v into dst (f32). The stored bytes are copied out
 * of the mapping with hp_st_read (a file truncated meanwhile is an error, not SIGBUS): F32 straight into dst,
 * other dtypes through a bounce buffer of READ_PIECE bytes. */
#define READ_PIECE ((size_t)64 << 10)
static hp_status read_stored_f32(hp__moe_src *ld, const hp__moe_tview *v, int64_t stored_off, int64_t n, float *dst);

hp_status hp__moe_src_read_f32(hp__moe_src *ld, const hp__moe_tview *v, int64_t elem_off, int64_t n, float *dst)
{
    hp_status st = check_held(ld, v, elem_off, n);
    if (st) return st;
    return read_stored_f32(ld, v, elem_off + v->shift, n, dst);
}

/* n stored elements from stored element stored_off of v, widened to f32 into dst. */
static hp_status read_stored_f32(hp__moe_src *ld, const hp__moe_tview *v, int64_t stored_off, int64_t n, float *dst)
{
    hp_status st = HP_OK;
    int64_t bytes_off, n_bytes;
    if (!hp_dtype_nbytes(v->dtype, stored_off, &bytes_off) || !hp_dtype_nbytes(v->dtype, n, &n_bytes))
        return hp_err_set(ld->err, HP_ERR_INPUT, "tensor '%s': offset overflow", v->name);
    if (v->dtype == HP_DT_F32) return hp_st_read(v->file, v->t, (uint64_t)bytes_off, dst, (size_t)n_bytes, ld->err);
    const int bits = hp_dtype_bits(v->dtype);
    if (bits % 8 || (v->dtype != HP_DT_BF16 && v->dtype != HP_DT_F16 && v->dtype != HP_DT_F64)) {
        st = hp_err_set(ld->err, HP_ERR_INPUT, "%s is not a float dtype the runtime widens", hp_dtype_name(v->dtype));
        hp_err_prefix(ld->err, "tensor '%s' (%s): the MoE runtime reads BF16, F16, F32 or F64 weights", v->name,
                      hp_dtype_name(v->dtype));
        return st;
    }
    const size_t el = (size_t)bits / 8, per = READ_PIECE / el;
    unsigned char *buf = malloc(READ_PIECE);
    if (!buf) return hp_err_set(ld->err, HP_ERR_NOMEM, "out of memory reading '%s'", v->name);
    for (int64_t done = 0; st == HP_OK && done < n;) {
        int64_t m = n - done < (int64_t)per ? n - done : (int64_t)per;
        st = hp_st_read(v->file, v->t, (uint64_t)bytes_off + (uint64_t)done * el, buf, (size_t)m * el, ld->err);
        if (st == HP_OK) st = hp_dtype_to_f32(v->dtype, buf, dst + done, m, ld->err);
        done += m;
    }
    free(buf);
    return st;
}

hp_status hp__moe_src_read_f64(hp__moe_src *ld, const hp__moe_tview *v, int64_t n, double **out)
{
    float *tmp = hp__moe_alloc_f32(n);
    *out = hp__moe_alloc_f64(n);
    if (!tmp || !*out) {
        free(tmp);
        return hp_err_set(ld->err, HP_ERR_NOMEM, "out of memory reading '%s'", v->name);
    }
    hp_status st = hp__moe_src_read_f32(ld, v, 0, n, tmp);
    for (int64_t i = 0; st == HP_OK && i < n; i++) (*out)[i] = tmp[i];
    free(tmp);
    return st;
}

/* A pointer into the mapping when the n elements from elem_off are held, stored as wdt (F32 or BF16) and
 * aligned for it (zero copy), else NULL (the caller then reads, which reports a slice that is not held). The
 * GEMM reads it in place: a file truncated meanwhile cannot be returned as an error there, so the SIGBUS
 * guard's last resort ends the process with exit 1 naming the file (core/guard.c); hp_moe_opts.no_zero_copy
 * avoids it. */
const void *hp__moe_src_mapped(const hp__moe_tview *v, hp_dtype wdt, int64_t elem_off, int64_t n, bool allowed)
{
    size_t el = wdt == HP_DT_BF16 ? 2 : sizeof(float);
    if (!allowed || v->dtype != wdt || (wdt != HP_DT_F32 && wdt != HP_DT_BF16) || elem_off < v->lo ||
        n > v->hi - elem_off)
        return NULL;
    const uint8_t *p = (const uint8_t *)hp_st_data(v->file, v->t) + (size_t)(elem_off + v->shift) * el;
    return ((uintptr_t)p % el) ? NULL : p;
}

/* n elements from global element elem_off of v into dst as wdt: F32 widens (hp__moe_src_read_f32); BF16
 * copies the stored bf16 bytes as they are (v must be BF16). */
hp_status hp__moe_src_read_w(hp__moe_src *ld, const hp__moe_tview *v, hp_dtype wdt, int64_t elem_off, int64_t n,
                             void *dst)
{
    if (wdt == HP_DT_F32) return hp__moe_src_read_f32(ld, v, elem_off, n, dst);
    if (wdt != HP_DT_BF16 || v->dtype != HP_DT_BF16)
        return hp_err_set(ld->err, HP_ERR_INPUT, "tensor '%s' is %s where the layer's other expert weights are %s; "
                          "a layer's experts share one dtype", v->name, hp_dtype_name(v->dtype), hp_dtype_name(wdt));
    hp_status st = check_held(ld, v, elem_off, n);
    if (st) return st;
    return hp_st_read(v->file, v->t, (uint64_t)(elem_off + v->shift) * 2, dst, (size_t)n * 2, ld->err);
}

/* The stored index of global index g of dim d of v, or -1 when the view does not hold it. */
static int64_t local_index(const hp__moe_tview *v, int d, int64_t g)
{
    int64_t before = 0;
    for (int k = 0; k < v->nseg[d]; k++) {
        if (g >= v->seg_lo[d][k] && g < v->seg_lo[d][k] + v->seg_n[d][k]) return before + g - v->seg_lo[d][k];
        before += v->seg_n[d][k];
    }
    return -1;
}

hp_status hp__moe_src_read_box(hp__moe_src *ld, const hp__moe_tview *v, hp_dtype wdt, const int64_t *lo,
                               const int64_t *n, void *dst)
{
    const int nd = v->n_dims;
    if (nd < 1 || (wdt == HP_DT_BF16 && v->dtype != HP_DT_BF16))
        return hp_err_set(ld->err, HP_ERR_INPUT, "tensor '%s' is %s where the layer's other expert weights are %s; "
                          "a layer's experts share one dtype", v->name, hp_dtype_name(v->dtype), hp_dtype_name(wdt));
    const size_t el = wdt == HP_DT_BF16 ? 2 : sizeof(float);
    bool held = !v->absent;
    for (int d = 0; held && d < nd; d++)
        held = lo[d] >= 0 && n[d] >= 1 && n[d] <= v->shape[d] - lo[d] && local_index(v, d, lo[d]) >= 0 &&
               local_index(v, d, lo[d] + n[d] - 1) == local_index(v, d, lo[d]) + n[d] - 1;
    if (!held) {
        char sl[160] = "", gs[96], box[160] = "";
        for (int d = 0; d < nd; d++)
            snprintf(box + strlen(box), sizeof box - strlen(box), "%sdim %d [%lld, %lld)", d ? ", " : "", d,
                     (long long)lo[d], (long long)(lo[d] + n[d]));
        if (v->sh && v->sh->n_slices) slices_str(v->sh, sl, sizeof sl);
        return hp_err_set(ld->err, HP_ERR_INPUT,
                          "%s%stensor '%s' is held %s%s of global shape %s, but this run needs its elements %s; the "
                          "shard folder was made for another mesh or plan (shard the model again with this run's "
                          "flags, or run from the checkpoint)",
                          ld->rf ? ld->rf->path : "", ld->rf ? ": " : "", v->name,
                          v->absent ? "by another rank (this file holds other experts)" : "as the slice ",
                          v->absent ? "" : (sl[0] ? sl : "(whole)"), shape_str(v->n_dims, v->shape, gs, sizeof gs),
                          box);
    }
    /* Rows of the box: every index tuple of dims 0..nd-2, each one run along the last dim. */
    int64_t idx[HP_MAX_DIMS] = {0}, rows = 1;
    for (int d = 0; d < nd - 1; d++) rows *= n[d];
    const int64_t run = n[nd - 1];
    uint8_t *out = dst;
    for (int64_t r = 0; r < rows; r++) {
        int64_t off = 0;
        for (int d = 0; d < nd; d++) off = off * v->lshape[d] + local_index(v, d, lo[d] + (d < nd - 1 ? idx[d] : 0));
        off += v->base;
        hp_status st = wdt == HP_DT_F32 ? read_stored_f32(ld, v, off, run, (float *)(void *)out)
                                        : hp_st_read(v->file, v->t, (uint64_t)off * 2, out, (size_t)run * 2, ld->err);
        if (st) return st;
        out += (size_t)run * el;
        for (int d = nd - 2; d >= 0; d--) { /* next index tuple */
            if (++idx[d] < n[d]) break;
            idx[d] = 0;
        }
    }
    return HP_OK;
}

/* ---- the block's modules ---- */

/* Leaf names of the block's child modules, in parameter order: from the module tree of a checkpoint, or
 * from the global names a rank file lists (a stack lists every expert, so the rank file names them all). */
int hp__moe_src_children(hp__moe_src *ld, char leaf[][48])
{
    int n = 0;
    if (!ld->rf) {
        int mod = hp_model_find_module(ld->m, ld->block);
        for (int ch = mod >= 0 ? ld->m->modules[mod].first_child : -1; ch >= 0 && n < HP__MOE_MAX_CHILDREN;
             ch = ld->m->modules[ch].next_sibling)
            snprintf(leaf[n++], 48, "%s", ld->m->modules[ch].leaf);
        return n;
    }
    size_t bl = strlen(ld->block);
    for (size_t i = 0; i < ld->rf->n_tensors; i++) {
        const hp_shard_tensor *t = &ld->rf->tensors[i];
        for (int g = 0; g < t->n_globals; g++) {
            const char *name = t->globals[g];
            if (strncmp(name, ld->block, bl) != 0 || name[bl] != '.') continue;
            const char *a = name + bl + 1, *dot = strchr(a, '.');
            int len = dot ? (int)(dot - a) : (int)strlen(a);
            bool seen = len >= 48;
            for (int k = 0; k < n && !seen; k++)
                seen = (int)strlen(leaf[k]) == len && !strncmp(leaf[k], a, (size_t)len);
            if (!seen && n < HP__MOE_MAX_CHILDREN) snprintf(leaf[n++], 48, "%.*s", len, a);
            if (t->stacked) break; /* one member names the stack's module */
        }
    }
    return n;
}

/* Whether the source has a module of that name (a checkpoint) or tensors under it (a rank file). */
bool hp__moe_src_has_module(hp__moe_src *ld, const char *name)
{
    if (!ld->rf) return hp_model_find_module(ld->m, name) >= 0;
    size_t len = strlen(name);
    for (size_t i = 0; i < ld->rf->n_tensors; i++)
        if (!strncmp(ld->rf->tensors[i].globals[0], name, len) && ld->rf->tensors[i].globals[0][len] == '.')
            return true;
    return false;
}


/* Shard mode: the experts the rank file holds (dim 0 of the layer's first stacked or batched expert tensor)
 * must be exactly the local range this process needs. Per-expert names that were not stacked (shards made
 * without ep) hold every expert whole and pass. */
hp_status hp__moe_src_check_experts(hp__moe_src *ld)
{
    const hp_moe_layer *l = ld->l;
    char pfx[100];
    snprintf(pfx, sizeof pfx, "%s.experts.", ld->block);
    const hp_shard_tensor *t = NULL;
    for (size_t i = 0; i < ld->rf->n_tensors && !t; i++) {
        const hp_shard_tensor *x = &ld->rf->tensors[i];
        bool under = !strncmp(x->globals[0], pfx, strlen(pfx));
        bool stack = x->stacked && under;                                                 /* experts.gate_proj */
        bool batched = !x->stacked && under && !strchr(x->globals[0] + strlen(pfx), '.'); /* experts.down_proj */
        if ((stack || batched) && x->n_dims >= 1 && x->global_shape[0] == l->n_experts) t = x;
    }
    if (!t) return HP_OK;
    int64_t f0 = 0, n0 = t->global_shape[0];
    if (t->n_slices > 0 && t->slices[0].dim == 0) {
        f0 = t->slices[0].offset;
        n0 = t->slices[0].length;
    }
    if (f0 == l->first_expert && n0 == l->n_local) return HP_OK;
    int64_t E = l->n_experts, ep_run = E / l->n_local, ep_file = n0 > 0 && E % n0 == 0 ? E / n0 : 0;
    char hint[400];
    if (ep_file == 0)
        snprintf(hint, sizeof hint, "%lld experts per rank divide no EP size of %lld experts: the folder is corrupt "
                 "or was edited; shard the source again", (long long)n0, (long long)E);
    else if (l->n_local == E)
        snprintf(hint, sizeof hint, "a run without mpirun needs every expert in rank 0's file: shard with ep=1, or run "
                 "under mpirun with --ep %lld", (long long)ep_file);
    else if (ep_file != ep_run)
        snprintf(hint, sizeof hint, "the folder was sharded for ep=%lld: run with --ep %lld, or shard again with "
                 "--ep %lld", (long long)ep_file, (long long)ep_file, (long long)ep_run);
    else
        snprintf(hint, sizeof hint, "the folder was sharded for this same ep=%lld, so the rank files are not where "
                 "the manifest puts them: the mesh of this run orders the ranks differently from the one the folder "
                 "was sharded with (run with that --mesh), or the rank files were swapped, renamed or edited (shard "
                 "the source again)", (long long)ep_file);
    return hp_err_set(ld->err, HP_ERR_INPUT,
                      "%s: rank %lld's file holds experts [%lld, %lld) of layer %lld's %lld ('%s'), but this process "
                      "needs experts [%lld, %lld) (ep=%lld, ep rank %lld); %s",
                      ld->rf->path, (long long)ld->rf->rank, (long long)f0, (long long)(f0 + n0), (long long)l->layer,
                      (long long)E, t->name, (long long)l->first_expert, (long long)(l->first_expert + l->n_local),
                      (long long)ep_run, (long long)(l->first_expert / l->n_local), hint);
}

/* The expert layout of the checkpoint a shard folder was written from, as its plan.json records it
 * (model.expert_layout), so that the model's parameter names are the plan's; per-expert (config.json's default)
 * for a folder without one. A plan.json that cannot be read is left to hp_shard_folder_plan to name. */
static hp_expert_layout folder_layout(const char *dir)
{
    hp_expert_layout lay = HP_LAYOUT_PER_EXPERT;
    char path[4200], *text = NULL;
    size_t len = 0;
    hp_err e;
    json_t *root = NULL;
    snprintf(path, sizeof path, "%s/plan.json", dir);
    if (hp__read_file(path, HP_JSON_MAX_FILE, &text, &len, &e) == HP_OK &&
        hp__json_parse(text, len, path, &root, &e) == HP_OK) {
        const char *s = json_string_value(json_object_get(json_object_get(root, "model"), "expert_layout"));
        if (s && !hp_expert_layout_parse(s, &lay)) lay = HP_LAYOUT_PER_EXPERT;
    }
    json_decref(root);
    free(text);
    return lay;
}

hp_status hp_moe_shard_config_open(hp_model **out, const char *dir, hp_err *err)
{
    *out = NULL;
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    struct stat sb;
    if (stat(path, &sb) != 0 && errno == ENOENT)
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: config.json is missing from this shard folder; running or loading from it needs the "
                          "model's hyperparameters (hyperpar shard copies config.json when the source folder has "
                          "one): copy the source checkpoint's config.json there",
                          dir);
    int fd = -1; /* a FIFO or a folder named config.json is refused here, without blocking */
    hp_status st = hp_open_regular(path, &fd, err);
    if (st != HP_OK) return st;
    close(fd);
    st = hp_shard_check_config(dir, err); /* an edited config.json is named as such, before its values mislead */
    hp_model_opts mo = {.layout = folder_layout(dir)};
    if (st == HP_OK) st = hp_model_open(out, path, &mo, err);
    if (st == HP_OK && !(*out)->meta) { /* a config.json is always opened in meta mode; guard the invariant */
        hp_model_close(*out);
        *out = NULL;
        st = hp_err_set(err, HP_ERR_INPUT, "%s: expected a config.json", path);
    }
    return st;
}
