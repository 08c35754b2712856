/*
 * layer.c — loading one sparse layer into the canonical f32 layout, or building one in memory.
 *
 * Storage layouts accepted (golden/README.md, spec/hf_reference.md §1):
 *
 *   per-expert   <block>.experts.{e}.{gate_proj|w1, up_proj|w3, down_proj|w2}.weight   [I, H], [I, H], [H, I]
 *   batched      <block>.experts.gate_up_proj [E, 2I, H] (gate rows first), down_proj [E, H, I]
 *   gpt-oss      <block>.experts.gate_up_proj [E, H, 2I] (even column = gate, odd = up) + gate_up_proj_bias
 *                [E, 2I], down_proj [E, I, H] + down_proj_bias [E, H]
 *
 * whatever the layout, the layer holds, for its local experts [first, first + n_local):
 *
 *   w_gate_up [n_local, 2I, H]   rows 0..I-1 = gate, rows I..2I-1 = up   (so G = X·W_guᵀ)
 *   w_down    [n_local, H, I]                                           (so Y = A·W_dᵀ)
 *
 * Only the local experts' bytes are read. bf16 / f16 / f64 are converted to f32; an f32 batched tensor whose
 * data is 4-byte aligned in the mapping is used in place (zero copy). The router weight is widened to f64.
 * Invariant after a successful load: every pointer the archetype needs is non-NULL and sized as commented
 * in hyperpar/moe.h; H equals config.json hidden_size; K <= E; E % n_group == 0.
 *
 * Two sources, one loader. Tensors are reached through a view (tview) that gives the global name and shape
 * and maps global element indices to the stored ones:
 *
 *   checkpoint   hp_model + its hp_ckpt: every tensor whole                       stored = global
 *   shard folder rank-XXXXX.safetensors of `hyperpar shard` (hp_shard_rank_file) + config.json (meta model):
 *                plain tensors whole (router, shared expert)                      stored = global
 *                batched experts cut on dim 0: [E, ...] held as [f0, f0 + n0)     stored = global - f0·inner
 *                per-expert names stacked: <block>.experts.gate_proj [n0, I, H]   expert e's element j is
 *                                                                                 stored at (e - f0)·I·H + j
 *   A view holds the global elements [lo, hi); reading outside them (a TP-sliced router or shared expert, an
 *   expert of another rank) is an error that names the tensor and its slice, never a silent zero.
 */
#include "moe/moe_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperpar/shard.h"

typedef struct owned {
    float *w_gate_up, *b_gate_up, *w_down, *b_down;
    hp_shard_rank_file *rf; /* a shard folder's rank file the expert weights point into (zero copy), or NULL */
} owned;

typedef struct loader {
    const hp_model *m;            /* the checkpoint, or a shard folder's config.json (meta model) */
    const hp_shard_rank_file *rf; /* shard mode: the rank file the tensors come from; NULL: m->ckpt */
    hp_moe_layer *l;
    char block[80]; /* "model.layers.1.mlp" */
    hp_err *err;
} loader;

/* A tensor as the loader sees it (see the file comment). */
typedef struct tview {
    const char *name;             /* global name, for messages */
    const hp_st_file *file;       /* where the bytes are */
    const hp_st_tensor *t;        /* the stored tensor */
    hp_dtype dtype;
    int n_dims;
    int64_t shape[HP_MAX_DIMS];   /* global shape (one expert's, for a member of a stack) */
    int64_t lo, hi;               /* global elements held */
    int64_t shift;                /* stored element index = global element index + shift */
    const hp_shard_tensor *sh;    /* shard mode: the rank file's manifest entry; NULL for a checkpoint */
} tview;

void hp_moe_load_opts_default(hp_moe_load_opts *o)
{
    memset(o, 0, sizeof *o);
    o->archetype = -1;
}

void hp_moe_layer_free(hp_moe_layer *l)
{
    if (!l) return;
    owned *ow = l->owned;
    if (ow) {
        free(ow->w_gate_up);
        free(ow->b_gate_up);
        free(ow->w_down);
        free(ow->b_down);
        hp_shard_rank_close(ow->rf);
        free(ow);
    }
    free(l->w_router);
    free(l->b_router);
    free(l->b_correction);
    free(l->ws_gate_up);
    free(l->ws_down);
    free(l->ws_gate);
    free(l);
}

uint64_t hp_moe_layer_expert_bytes(const hp_moe_layer *l)
{
    return (uint64_t)l->n_local * (uint64_t)(3 * l->d_expert) * (uint64_t)l->n_hidden * sizeof(float);
}

/* Allocates n floats (n > 0) after an overflow check; NULL on failure. */
static float *alloc_f32(int64_t n)
{
    size_t bytes;
    if (n < 0 || !hp_mul_size((size_t)n, sizeof(float), &bytes)) return NULL;
    return hp_calloc(bytes ? bytes : 1, 1);
}

static double *alloc_f64(int64_t n)
{
    size_t bytes;
    if (n < 0 || !hp_mul_size((size_t)n, sizeof(double), &bytes)) return NULL;
    return hp_calloc(bytes ? bytes : 1, 1);
}

static bool config_has_flag(const hp_model_config *c, const char *key, bool *value)
{
    for (int i = 0; i < c->n_flags; i++)
        if (!strcmp(c->flags[i].key, key)) {
            *value = c->flags[i].value;
            return true;
        }
    return false;
}

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
static bool view_shard(const hp_shard_rank_file *rf, const char *name, tview *v)
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

/* The view of `<block>.<suffix>`; false when the source has no such tensor. */
static bool find(loader *ld, const char *suffix, tview *v)
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
    return true;
}

static bool has(loader *ld, const char *suffix)
{
    tview v;
    return find(ld, suffix, &v);
}

/* The tensor `<block>.<suffix>` with exactly the given shape; errors name it and what was expected. */
static hp_status need(loader *ld, const char *suffix, int n_dims, const int64_t *shape, tview *out)
{
    char want[96], got[96];
    shape_str(n_dims, shape, want, sizeof want);
    if (!find(ld, suffix, out))
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
static hp_status check_held(loader *ld, const tview *v, int64_t elem_off, int64_t n)
{
    if (elem_off >= v->lo && n <= v->hi - elem_off) return HP_OK;
    char sl[160], gs[96];
    if (!v->sh)
        return hp_err_set(ld->err, HP_ERR_INPUT, "tensor '%s': elements [%lld, %lld) are outside the tensor", v->name,
                          (long long)elem_off, (long long)(elem_off + n));
    return hp_err_set(ld->err, HP_ERR_INPUT,
                      "%s: tensor '%s'%s is held only as the slice %s of global shape %s (rank %lld's file holds "
                      "no whole copy), but the MoE runtime needs the router and shared experts whole and every "
                      "local expert whole; shards made with tp > 1 slice them: shard with --tp 1 for MoE runs "
                      "(e.g. hyperpar shard MODEL --dp N --ep N), or run from the full checkpoint",
                      ld->rf->path, v->sh->name, v->sh->stacked ? " (a stack of per-expert weights)" : "",
                      v->sh->n_slices ? slices_str(v->sh, sl, sizeof sl) : "(none)",
                      shape_str(v->sh->n_dims, v->sh->global_shape, gs, sizeof gs), (long long)ld->rf->rank);
}

/* Widens n elements starting at global element elem_off of v into dst (f32). */
static hp_status read_f32(loader *ld, const tview *v, int64_t elem_off, int64_t n, float *dst)
{
    hp_status st = check_held(ld, v, elem_off, n);
    if (st) return st;
    int64_t bytes_off;
    if (!hp_dtype_nbytes(v->dtype, elem_off + v->shift, &bytes_off))
        return hp_err_set(ld->err, HP_ERR_INPUT, "tensor '%s': offset overflow", v->name);
    const uint8_t *src = (const uint8_t *)hp_st_data(v->file, v->t) + bytes_off;
    st = hp_dtype_to_f32(v->dtype, src, dst, n, ld->err);
    if (st != HP_OK)
        hp_err_prefix(ld->err, "tensor '%s' (%s): the MoE runtime reads BF16, F16, F32 or F64 weights", v->name,
                      hp_dtype_name(v->dtype));
    return st;
}

static hp_status read_f64(loader *ld, const tview *v, int64_t n, double **out)
{
    float *tmp = alloc_f32(n);
    *out = alloc_f64(n);
    if (!tmp || !*out) {
        free(tmp);
        return hp_err_set(ld->err, HP_ERR_NOMEM, "out of memory reading '%s'", v->name);
    }
    hp_status st = read_f32(ld, v, 0, n, tmp);
    for (int64_t i = 0; st == HP_OK && i < n; i++) (*out)[i] = tmp[i];
    free(tmp);
    return st;
}

/* A pointer into the mapping when the n elements from elem_off are held, f32 and aligned (zero copy), else
 * NULL (the caller then reads, which reports a slice that is not held). */
static const float *mapped_f32(const tview *v, int64_t elem_off, int64_t n, bool allowed)
{
    if (!allowed || v->dtype != HP_DT_F32 || elem_off < v->lo || n > v->hi - elem_off) return NULL;
    const uint8_t *p = (const uint8_t *)hp_st_data(v->file, v->t) + (size_t)(elem_off + v->shift) * sizeof(float);
    return ((uintptr_t)p % sizeof(float)) ? NULL : (const float *)p;
}

/* ---- interface assertion ---- */

#define MAX_CHILDREN 32

/* Leaf names of the block's child modules, in parameter order: from the module tree of a checkpoint, or
 * from the global names a rank file lists (a stack lists every expert, so the rank file names them all). */
static int block_children(loader *ld, char leaf[][48])
{
    int n = 0;
    if (!ld->rf) {
        int mod = hp_model_find_module(ld->m, ld->block);
        for (int ch = mod >= 0 ? ld->m->modules[mod].first_child : -1; ch >= 0 && n < MAX_CHILDREN;
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
            if (!seen && n < MAX_CHILDREN) snprintf(leaf[n++], 48, "%.*s", len, a);
            if (t->stacked) break; /* one member names the stack's module */
        }
    }
    return n;
}

/* Whether the source has a module of that name (a checkpoint) or tensors under it (a rank file). */
static bool has_module(loader *ld, const char *name)
{
    if (!ld->rf) return hp_model_find_module(ld->m, name) >= 0;
    size_t len = strlen(name);
    for (size_t i = 0; i < ld->rf->n_tensors; i++)
        if (!strncmp(ld->rf->tensors[i].globals[0], name, len) && ld->rf->tensors[i].globals[0][len] == '.')
            return true;
    return false;
}

/* Checks the block module has every child the archetype needs; the error lists what it has. */
static hp_status check_interface(loader *ld, const hp__moe_archetype_info *info)
{
    char leaf[MAX_CHILDREN][48];
    int n = block_children(ld, leaf);
    char have[512] = "";
    for (int k = 0; k < n; k++)
        snprintf(have + strlen(have), sizeof have - strlen(have), "%s%s", k ? ", " : "", leaf[k]);
    char missing[256] = "";
    for (int i = 0; i < HP__MOE_MAX_NEEDS && info->needs[i]; i++) {
        bool found = false;
        char alts[64];
        snprintf(alts, sizeof alts, "%s", info->needs[i]);
        for (char *save = NULL, *a = strtok_r(alts, "|", &save); a && !found; a = strtok_r(NULL, "|", &save))
            for (int k = 0; k < n && !found; k++) found = !strcmp(leaf[k], a);
        if (!found)
            snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s", missing[0] ? ", " : "",
                     info->needs[i]);
    }
    if (!missing[0]) return HP_OK;
    return hp_err_set(ld->err, HP_ERR_INPUT,
                      "layer %lld (%s) lacks %s, which archetype %s needs; the block has: %s. Choose the archetype "
                      "that matches the checkpoint (--archetype; the family suggests %s) or supply the missing "
                      "tensors",
                      (long long)ld->l->layer, ld->block, missing, info->name, have[0] ? have : "(nothing)",
                      ld->m->family && hp_family_suggested_archetype(ld->m->family)
                          ? hp_family_suggested_archetype(ld->m->family)
                          : "none");
}

/* ---- experts ---- */

static hp_status load_batched(loader *ld, owned *ow, bool zero_copy_ok)
{
    hp_moe_layer *l = ld->l;
    int64_t E = l->n_experts, H = l->n_hidden, n = l->n_local, f = l->first_expert;
    tview gu = {0}, dn = {0}, gub = {0}, dnb = {0};
    find(ld, "experts.gate_up_proj", &gu); /* present: the caller chose this layout by it */
    hp_status st;
    bool gptoss = l->act == HP_MOE_ACT_GPTOSS;
    /* I from the tensor: [E, 2I, H] or gpt-oss [E, H, 2I]. */
    int64_t two_i = gu.n_dims == 3 ? gu.shape[gptoss ? 2 : 1] : 0;
    if (two_i <= 0 || two_i % 2)
        return hp_err_set(ld->err, HP_ERR_INPUT,
                          "tensor '%s' must be 3-D with an even gate/up axis (%s), found %d dims; archetype %s",
                          gu.name, gptoss ? "[E, H, 2I]" : "[E, 2I, H]", gu.n_dims,
                          hp_moe_archetype_name(l->archetype));
    int64_t I = two_i / 2;
    l->d_expert = I;
    int64_t s_gu[3] = {E, 2 * I, H}, s_dn[3] = {E, H, I};
    if (gptoss) {
        int64_t g_gu[3] = {E, H, 2 * I}, g_dn[3] = {E, I, H}, s_gub[2] = {E, 2 * I}, s_dnb[2] = {E, H};
        if ((st = need(ld, "experts.gate_up_proj", 3, g_gu, &gu)) ||
            (st = need(ld, "experts.down_proj", 3, g_dn, &dn)) ||
            (st = need(ld, "experts.gate_up_proj_bias", 2, s_gub, &gub)) ||
            (st = need(ld, "experts.down_proj_bias", 2, s_dnb, &dnb)))
            return st;
        l->storage = "batched gpt-oss";
    } else {
        if ((st = need(ld, "experts.gate_up_proj", 3, s_gu, &gu)) || (st = need(ld, "experts.down_proj", 3, s_dn, &dn)))
            return st;
        l->storage = "batched";
    }
    l->dtype = gu.dtype;
    int64_t n_gu = n * 2 * I * H, n_dn = n * H * I;
    if (!gptoss) {
        l->w_gate_up = mapped_f32(&gu, f * 2 * I * H, n_gu, zero_copy_ok);
        l->w_down = mapped_f32(&dn, f * H * I, n_dn, zero_copy_ok);
        l->zero_copy = l->w_gate_up && l->w_down;
        if (!l->w_gate_up) {
            if (!(ow->w_gate_up = alloc_f32(n_gu))) return hp_err_set(ld->err, HP_ERR_NOMEM, "out of memory");
            if ((st = read_f32(ld, &gu, f * 2 * I * H, n_gu, ow->w_gate_up))) return st;
            l->w_gate_up = ow->w_gate_up;
        }
        if (!l->w_down) {
            if (!(ow->w_down = alloc_f32(n_dn))) return hp_err_set(ld->err, HP_ERR_NOMEM, "out of memory");
            if ((st = read_f32(ld, &dn, f * H * I, n_dn, ow->w_down))) return st;
            l->w_down = ow->w_down;
        }
        return HP_OK;
    }
    /* gpt-oss: de-interleave and transpose one expert at a time through a scratch matrix. */
    float *tmp = alloc_f32(2 * I * H);
    float *tb = alloc_f32(2 * I);
    ow->w_gate_up = alloc_f32(n_gu);
    ow->w_down = alloc_f32(n_dn);
    ow->b_gate_up = alloc_f32(n * 2 * I);
    ow->b_down = alloc_f32(n * H);
    st = (tmp && tb && ow->w_gate_up && ow->w_down && ow->b_gate_up && ow->b_down)
             ? HP_OK
             : hp_err_set(ld->err, HP_ERR_NOMEM, "out of memory loading layer %lld", (long long)l->layer);
    for (int64_t e = 0; st == HP_OK && e < n; e++) {
        float *wgu = ow->w_gate_up + e * 2 * I * H, *wdn = ow->w_down + e * H * I;
        if ((st = read_f32(ld, &gu, (f + e) * H * 2 * I, H * 2 * I, tmp))) break;
        for (int64_t h = 0; h < H; h++)
            for (int64_t j = 0; j < I; j++) {
                wgu[j * H + h] = tmp[h * 2 * I + 2 * j];
                wgu[(I + j) * H + h] = tmp[h * 2 * I + 2 * j + 1];
            }
        if ((st = read_f32(ld, &gub, (f + e) * 2 * I, 2 * I, tb))) break;
        for (int64_t j = 0; j < I; j++) {
            ow->b_gate_up[e * 2 * I + j] = tb[2 * j];
            ow->b_gate_up[e * 2 * I + I + j] = tb[2 * j + 1];
        }
        if ((st = read_f32(ld, &dn, (f + e) * I * H, I * H, tmp))) break;
        for (int64_t i = 0; i < I; i++)
            for (int64_t h = 0; h < H; h++) wdn[h * I + i] = tmp[i * H + h];
        if ((st = read_f32(ld, &dnb, (f + e) * H, H, ow->b_down + e * H))) break;
    }
    free(tmp);
    free(tb);
    l->w_gate_up = ow->w_gate_up;
    l->w_down = ow->w_down;
    l->b_gate_up = ow->b_gate_up;
    l->b_down = ow->b_down;
    return st;
}

static hp_status load_per_expert(loader *ld, owned *ow, int64_t I_cfg)
{
    hp_moe_layer *l = ld->l;
    int64_t H = l->n_hidden, f = l->first_expert;
    /* Projection names: transformers' gate_proj/up_proj/down_proj, or Mixtral's w1/w3/w2. */
    static const char *names[2][3] = {{"gate_proj", "up_proj", "down_proj"}, {"w1", "w3", "w2"}};
    int which = 0;
    char sfx[128];
    snprintf(sfx, sizeof sfx, "experts.%lld.w1.weight", (long long)f);
    if (has(ld, sfx)) which = 1;
    snprintf(sfx, sizeof sfx, "experts.%lld.%s.weight", (long long)f, names[which][0]);
    tview g0;
    bool g0_found = find(ld, sfx, &g0);
    int64_t I = g0_found && g0.n_dims == 2 ? g0.shape[0] : I_cfg;
    if (I <= 0)
        return hp_err_set(ld->err, HP_ERR_INPUT,
                          "tensor '%s.%s' is missing; archetype %s needs the experts of layer %lld "
                          "(per-expert names or a batched experts.gate_up_proj)",
                          ld->block, sfx, hp_moe_archetype_name(l->archetype), (long long)l->layer);
    l->d_expert = I;
    l->storage = "per-expert";
    l->dtype = g0_found ? g0.dtype : HP_DT_F32;
    if (!(ow->w_gate_up = alloc_f32(l->n_local * 2 * I * H)) || !(ow->w_down = alloc_f32(l->n_local * H * I)))
        return hp_err_set(ld->err, HP_ERR_NOMEM, "out of memory loading layer %lld", (long long)l->layer);
    int64_t s_in[2] = {I, H}, s_out[2] = {H, I};
    for (int64_t e = 0; e < l->n_local; e++) {
        float *wgu = ow->w_gate_up + e * 2 * I * H;
        tview t;
        hp_status st;
        for (int p = 0; p < 3; p++) {
            snprintf(sfx, sizeof sfx, "experts.%lld.%s.weight", (long long)(f + e), names[which][p]);
            if ((st = need(ld, sfx, 2, p < 2 ? s_in : s_out, &t))) return st;
            float *dst = p == 0 ? wgu : p == 1 ? wgu + I * H : ow->w_down + e * H * I;
            if ((st = read_f32(ld, &t, 0, I * H, dst))) return st;
        }
    }
    l->w_gate_up = ow->w_gate_up;
    l->w_down = ow->w_down;
    return HP_OK;
}

/* Shared expert(s): <block>.<name>.{gate,up,down}_proj.weight, and Qwen2-MoE's shared_expert_gate. */
static hp_status load_shared(loader *ld)
{
    hp_moe_layer *l = ld->l;
    if (l->shared == HP_MOE_SHARED_NONE) return HP_OK;
    const char *mod = l->shared == HP_MOE_SHARED_GATED ? "shared_expert" : "shared_experts";
    int64_t H = l->n_hidden;
    char sfx[128];
    snprintf(sfx, sizeof sfx, "%s.gate_proj.weight", mod);
    tview g, u, d;
    bool g_found = find(ld, sfx, &g);
    int64_t sI = g_found && g.n_dims == 2 ? g.shape[0] : 1;
    int64_t s_in[2] = {sI, H}, s_out[2] = {H, sI};
    hp_status st;
    if ((st = need(ld, sfx, 2, s_in, &g))) return st;
    snprintf(sfx, sizeof sfx, "%s.up_proj.weight", mod);
    if ((st = need(ld, sfx, 2, s_in, &u))) return st;
    snprintf(sfx, sizeof sfx, "%s.down_proj.weight", mod);
    if ((st = need(ld, sfx, 2, s_out, &d))) return st;
    l->d_shared = sI;
    if (!(l->ws_gate_up = alloc_f32(2 * sI * H)) || !(l->ws_down = alloc_f32(H * sI)))
        return hp_err_set(ld->err, HP_ERR_NOMEM, "out of memory");
    if ((st = read_f32(ld, &g, 0, sI * H, l->ws_gate_up)) ||
        (st = read_f32(ld, &u, 0, sI * H, l->ws_gate_up + sI * H)) || (st = read_f32(ld, &d, 0, H * sI, l->ws_down)))
        return st;
    if (l->shared == HP_MOE_SHARED_GATED) {
        int64_t s_g[2] = {1, H};
        if ((st = need(ld, "shared_expert_gate.weight", 2, s_g, &g))) return st;
        if (!(l->ws_gate = alloc_f32(H))) return hp_err_set(ld->err, HP_ERR_NOMEM, "out of memory");
        if ((st = read_f32(ld, &g, 0, H, l->ws_gate))) return st;
    }
    return HP_OK;
}

static hp_status check_router_settings(hp_moe_layer *l, hp_err *err)
{
    if (l->top_k < 1 || l->top_k > l->n_experts)
        return hp_err_set(err, HP_ERR_INPUT, "num_experts_per_tok (%lld) must be between 1 and the %lld experts",
                          (long long)l->top_k, (long long)l->n_experts);
    if (l->router != HP_MOE_ROUTER_SIGMOID_GROUP) return HP_OK;
    if (l->n_group < 1 || l->n_experts % l->n_group)
        return hp_err_set(err, HP_ERR_INPUT, "n_group (%lld) must divide the %lld routed experts",
                          (long long)l->n_group, (long long)l->n_experts);
    if (l->topk_group < 1 || l->topk_group > l->n_group)
        return hp_err_set(err, HP_ERR_INPUT, "topk_group (%lld) must be between 1 and n_group (%lld)",
                          (long long)l->topk_group, (long long)l->n_group);
    if (l->topk_group * (l->n_experts / l->n_group) < l->top_k)
        return hp_err_set(err, HP_ERR_INPUT,
                          "topk_group (%lld) groups of %lld experts cannot supply num_experts_per_tok = %lld",
                          (long long)l->topk_group, (long long)(l->n_experts / l->n_group), (long long)l->top_k);
    return HP_OK;
}

static hp_status check_range(hp_moe_layer *l, int64_t first, int64_t n_local, hp_err *err)
{
    if (n_local == 0) n_local = l->n_experts - first;
    if (first < 0 || n_local < 1 || first + n_local > l->n_experts)
        return hp_err_set(err, HP_ERR_INPUT, "local expert range [%lld, %lld) is outside the layer's %lld experts",
                          (long long)first, (long long)(first + n_local), (long long)l->n_experts);
    l->first_expert = first;
    l->n_local = n_local;
    return HP_OK;
}

static void apply_archetype(hp_moe_layer *l, hp_moe_archetype a)
{
    const hp__moe_archetype_info *info = hp__moe_archetype_info_of(a);
    l->archetype = a;
    l->router = info->router;
    l->shared = info->shared;
    l->act = info->act;
    l->swiglu_alpha = 1.702f;
    l->swiglu_limit = 7.0f;
}

/* Shard mode: the experts the rank file holds (dim 0 of the layer's first stacked or batched expert tensor)
 * must be exactly the local range this process needs. Per-expert names that were not stacked (shards made
 * without ep) hold every expert whole and pass. */
static hp_status check_shard_experts(loader *ld)
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
    char hint[200];
    if (l->n_local == E)
        snprintf(hint, sizeof hint, "a run without mpirun needs every expert in rank 0's file: shard with ep=1, or run "
                 "under mpirun with --ep %lld", (long long)(ep_file ? ep_file : 1));
    else
        snprintf(hint, sizeof hint, "run with the ep the folder was sharded for (--ep %lld), or shard again with "
                 "--ep %lld", (long long)(ep_file ? ep_file : 1), (long long)ep_run);
    return hp_err_set(ld->err, HP_ERR_INPUT,
                      "%s: rank %lld's file holds experts [%lld, %lld) of layer %lld's %lld ('%s'), but this process "
                      "needs experts [%lld, %lld) (ep=%lld, ep rank %lld); %s",
                      ld->rf->path, (long long)ld->rf->rank, (long long)f0, (long long)(f0 + n0), (long long)l->layer,
                      (long long)E, t->name, (long long)l->first_expert, (long long)(l->first_expert + l->n_local),
                      (long long)ep_run, (long long)(l->first_expert / l->n_local), hint);
}

static hp_status load(loader *ld, const hp_moe_load_opts *o)
{
    const hp_model *m = ld->m;
    hp_moe_layer *l = ld->l;
    hp_err *err = ld->err;
    const hp_model_config *c = &m->cfg;
    if (!ld->rf && (m->meta || !m->ckpt))
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s is a config-only (meta) model; running an MoE layer needs a checkpoint with weights",
                          m->path);
    if (l->layer < 0 || l->layer >= c->num_hidden_layers)
        return hp_err_set(err, HP_ERR_INPUT, "layer %lld is out of range: the model has %lld layers (0..%lld)",
                          (long long)l->layer, (long long)c->num_hidden_layers, (long long)c->num_hidden_layers - 1);
    if (!hp_model_layer_is_sparse(m, l->layer)) {
        char sparse[256] = "";
        for (int64_t i = 0; i < c->num_hidden_layers && strlen(sparse) < 200; i++)
            if (hp_model_layer_is_sparse(m, i))
                snprintf(sparse + strlen(sparse), sizeof sparse - strlen(sparse), "%s%lld", sparse[0] ? ", " : "",
                         (long long)i);
        return hp_err_set(err, HP_ERR_INPUT,
                          "layer %lld of %s is dense (a plain MLP, no routed experts); choose a sparse layer: %s",
                          (long long)l->layer, m->path, sparse[0] ? sparse : "none");
    }
    hp_moe_archetype a;
    if (o->archetype >= 0 && o->archetype < HP_MOE_ARCHETYPE_COUNT) {
        a = (hp_moe_archetype)o->archetype;
    } else {
        const char *s = m->family ? hp_family_suggested_archetype(m->family) : NULL;
        if (!s || !hp_moe_archetype_parse(s, &a))
            return hp_err_set(err, HP_ERR_INPUT,
                              "no archetype given and the family '%s' suggests none; choose one of: %s",
                              m->model_type, hp_moe_archetype_list());
    }
    apply_archetype(l, a);
    const hp__moe_archetype_info *info = hp__moe_archetype_info_of(a);

    /* The block: transformers >= 5 names it mlp; Mixtral hub checkpoints block_sparse_moe. */
    snprintf(ld->block, sizeof ld->block, "model.layers.%lld.block_sparse_moe", (long long)l->layer);
    if (!has_module(ld, ld->block))
        snprintf(ld->block, sizeof ld->block, "model.layers.%lld.mlp", (long long)l->layer);
    snprintf(l->prefix, sizeof l->prefix, "%s.", ld->block);
    hp_status st = check_interface(ld, info);
    if (st) return st;

    /* Router. */
    const char *rname = has(ld, "gate.weight") ? "gate" : "router";
    char sfx[64];
    snprintf(sfx, sizeof sfx, "%s.weight", rname);
    tview rw;
    if (!find(ld, sfx, &rw) || rw.n_dims != 2)
        return hp_err_set(err, HP_ERR_INPUT, "tensor '%s.%s' must exist with shape [E, H] for archetype %s", ld->block,
                          sfx, info->name);
    l->n_experts = rw.shape[0];
    l->n_hidden = rw.shape[1];
    if (c->hidden_size && c->hidden_size != l->n_hidden)
        return hp_err_set(err, HP_ERR_INPUT, "tensor '%s' has %lld columns but config.json hidden_size is %lld",
                          rw.name, (long long)l->n_hidden, (long long)c->hidden_size);
    if (c->n_experts && c->n_experts != l->n_experts)
        return hp_err_set(err, HP_ERR_INPUT, "tensor '%s' has %lld rows but config.json says %lld routed experts",
                          rw.name, (long long)l->n_experts, (long long)c->n_experts);
    l->top_k = c->num_experts_per_tok ? c->num_experts_per_tok : 2; /* §10.3: K defaults to 2 */
    l->n_group = c->n_group > 0 ? c->n_group : 1;
    l->topk_group = c->topk_group > 0 ? c->topk_group : 1;
    l->routed_scaling_factor = c->routed_scaling_factor > 0 ? c->routed_scaling_factor : 1.0;
    if (c->swiglu_limit > 0) l->swiglu_limit = (float)c->swiglu_limit;
    bool flag = false, given = config_has_flag(c, "norm_topk_prob", &flag);
    l->norm_topk_prob = info->norm == HP__NORM_ALWAYS || ((info->norm == HP__NORM_CONFIG ||
                                                           info->norm == HP__NORM_DEFAULT_TRUE) && given && flag) ||
                        (info->norm == HP__NORM_DEFAULT_TRUE && !given);
    if ((st = check_router_settings(l, err)) || (st = check_range(l, o->first_expert, o->n_local, err))) return st;
    int64_t E = l->n_experts;
    if ((st = read_f64(ld, &rw, E * l->n_hidden, &l->w_router))) return st;
    if (l->router == HP_MOE_ROUTER_TOPK_SOFTMAX) {
        snprintf(sfx, sizeof sfx, "%s.bias", rname);
        tview rb;
        if ((st = need(ld, sfx, 1, &E, &rb)) || (st = read_f64(ld, &rb, E, &l->b_router))) return st;
    }
    if (l->router == HP_MOE_ROUTER_SIGMOID_GROUP && has(ld, "gate.e_score_correction_bias")) {
        tview cb;
        if ((st = need(ld, "gate.e_score_correction_bias", 1, &E, &cb)) ||
            (st = read_f64(ld, &cb, E, &l->b_correction)))
            return st;
    }
    if (ld->rf && (st = check_shard_experts(ld))) return st;

    /* Experts. */
    owned *ow = hp_calloc(1, sizeof *ow);
    if (!ow) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    l->owned = ow;
    if (has(ld, "experts.gate_up_proj")) {
        st = load_batched(ld, ow, !o->no_zero_copy);
    } else if (l->act == HP_MOE_ACT_GPTOSS) {
        st = hp_err_set(err, HP_ERR_INPUT,
                        "tensor '%s.experts.gate_up_proj' [E, H, 2I] is missing; archetype %s needs gpt-oss's "
                        "batched, interleaved experts with biases",
                        ld->block, info->name);
    } else {
        st = load_per_expert(ld, ow, c->moe_intermediate_size);
    }
    if (st) return st;
    return load_shared(ld);
}

hp_status hp_moe_layer_load(hp_moe_layer **out, const hp_model *m, int64_t layer, const hp_moe_load_opts *opts,
                            hp_err *err)
{
    *out = NULL;
    hp_moe_load_opts dflt;
    if (!opts) {
        hp_moe_load_opts_default(&dflt);
        opts = &dflt;
    }
    hp_moe_layer *l = hp_calloc(1, sizeof *l);
    if (!l) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    l->layer = layer;
    loader ld = {.m = m, .l = l, .err = err};
    hp_status st = load(&ld, opts);
    if (st) {
        hp_moe_layer_free(l);
        return st;
    }
    *out = l;
    return HP_OK;
}

hp_status hp_moe_shard_config_open(hp_model **out, const char *dir, hp_err *err)
{
    *out = NULL;
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f)
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: config.json is missing; loading an MoE layer from a shard folder needs the model's "
                          "hyperparameters (hyperpar shard copies config.json when the source folder has one: copy "
                          "it there)",
                          dir);
    fclose(f);
    hp_status st = hp_model_open(out, path, NULL, err);
    if (st == HP_OK && !(*out)->meta) { /* a config.json is always opened in meta mode; guard the invariant */
        hp_model_close(*out);
        *out = NULL;
        st = hp_err_set(err, HP_ERR_INPUT, "%s: expected a config.json", path);
    }
    return st;
}

hp_status hp_moe_layer_load_shard(hp_moe_layer **out, const char *dir, const hp_model *cfg, int64_t rank,
                                  int64_t layer, const hp_moe_load_opts *opts, hp_err *err)
{
    *out = NULL;
    hp_moe_load_opts dflt;
    if (!opts) {
        hp_moe_load_opts_default(&dflt);
        opts = &dflt;
    }
    hp_model *own_cfg = NULL;
    hp_shard_rank_file *rf = NULL;
    hp_status st = cfg ? HP_OK : hp_moe_shard_config_open(&own_cfg, dir, err);
    if (st == HP_OK) st = hp_shard_rank_open(&rf, dir, rank, err);
    hp_moe_layer *l = NULL;
    if (st == HP_OK && !(l = hp_calloc(1, sizeof *l))) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    if (st == HP_OK) {
        l->layer = layer;
        loader ld = {.m = cfg ? cfg : own_cfg, .rf = rf, .l = l, .err = err};
        st = load(&ld, opts);
    }
    if (st == HP_OK && l->zero_copy) { /* the expert weights point into the rank file: it lives with the layer */
        ((owned *)l->owned)->rf = rf;
        rf = NULL;
    }
    if (st == HP_OK) l->storage = !strcmp(l->storage, "per-expert") ? "stacked per-expert (shard)"
                                  : !strcmp(l->storage, "batched")  ? "batched (shard)"
                                                                    : "batched gpt-oss (shard)";
    hp_shard_rank_close(rf);
    hp_model_close(own_cfg);
    if (st != HP_OK) {
        hp_moe_layer_free(l);
        return st;
    }
    *out = l;
    return HP_OK;
}

hp_status hp_moe_layer_create(hp_moe_layer **out, hp_moe_archetype a, const hp_moe_dims *d, hp_err *err)
{
    *out = NULL;
    if ((int)a < 0 || a >= HP_MOE_ARCHETYPE_COUNT)
        return hp_err_set(err, HP_ERR_INPUT, "unknown archetype %d; known: %s", (int)a, hp_moe_archetype_list());
    if (d->n_hidden < 1 || d->n_experts < 1 || d->d_expert < 1 || d->d_shared < 0)
        return hp_err_set(err, HP_ERR_INPUT, "layer dimensions must be positive (H %lld, E %lld, I %lld)",
                          (long long)d->n_hidden, (long long)d->n_experts, (long long)d->d_expert);
    hp_moe_layer *l = hp_calloc(1, sizeof *l);
    owned *ow = hp_calloc(1, sizeof *ow);
    if (!l || !ow) {
        free(l);
        free(ow);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    }
    l->owned = ow;
    l->layer = -1;
    apply_archetype(l, a);
    l->n_hidden = d->n_hidden;
    l->n_experts = d->n_experts;
    l->top_k = d->top_k;
    l->d_expert = d->d_expert;
    l->n_group = d->n_group > 0 ? d->n_group : 1;
    l->topk_group = d->topk_group > 0 ? d->topk_group : 1;
    l->routed_scaling_factor = d->routed_scaling_factor > 0 ? d->routed_scaling_factor : 1.0;
    l->norm_topk_prob = d->norm_topk_prob;
    l->storage = "memory";
    l->dtype = HP_DT_F32;
    snprintf(l->prefix, sizeof l->prefix, "(memory).");
    hp_status st = check_router_settings(l, err);
    if (!st) st = check_range(l, d->first_expert, d->n_local, err);
    if (st) {
        hp_moe_layer_free(l);
        return st;
    }
    int64_t H = l->n_hidden, E = l->n_experts, I = l->d_expert, n = l->n_local;
    int64_t n_gu, n_dn;
    bool ok = hp_mul_i64(n, 2 * I, &n_gu) && hp_mul_i64(n_gu, H, &n_gu) && hp_mul_i64(n * H, I, &n_dn);
    ok = ok && (l->w_router = alloc_f64(E * H)) && (ow->w_gate_up = alloc_f32(n_gu)) && (ow->w_down = alloc_f32(n_dn));
    if (ok && l->router == HP_MOE_ROUTER_TOPK_SOFTMAX) ok = (l->b_router = alloc_f64(E)) != NULL;
    if (ok && l->router == HP_MOE_ROUTER_SIGMOID_GROUP) ok = (l->b_correction = alloc_f64(E)) != NULL;
    if (ok && l->act == HP_MOE_ACT_GPTOSS)
        ok = (ow->b_gate_up = alloc_f32(n * 2 * I)) && (ow->b_down = alloc_f32(n * H));
    if (ok && l->shared != HP_MOE_SHARED_NONE && d->d_shared > 0) {
        l->d_shared = d->d_shared;
        ok = (l->ws_gate_up = alloc_f32(2 * d->d_shared * H)) && (l->ws_down = alloc_f32(H * d->d_shared));
        if (ok && l->shared == HP_MOE_SHARED_GATED) ok = (l->ws_gate = alloc_f32(H)) != NULL;
    }
    if (!ok) {
        hp_moe_layer_free(l);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory building a layer with %lld local experts of %lld x %lld",
                          (long long)n, (long long)I, (long long)H);
    }
    l->w_gate_up = ow->w_gate_up;
    l->w_down = ow->w_down;
    l->b_gate_up = ow->b_gate_up;
    l->b_down = ow->b_down;
    *out = l;
    return HP_OK;
}
