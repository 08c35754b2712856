/*
 * load.c — assembling one sparse layer of a checkpoint or shard folder into the canonical f32 layout.
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
 * The tensors come through a source (source.c), so one loader serves checkpoints and shard rank files.
 * Invariant after a successful load: every pointer the archetype needs is non-NULL and sized as commented
 * in hyperpar/moe.h; H equals config.json hidden_size; K <= E; E % n_group == 0.
 */
#include "moe/source.h"

#include <sys/stat.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool config_has_flag(const hp_model_config *c, const char *key, bool *value)
{
    for (int i = 0; i < c->n_flags; i++)
        if (!strcmp(c->flags[i].key, key)) {
            *value = c->flags[i].value;
            return true;
        }
    return false;
}

/* n = a·b·c with an overflow check; false when it does not fit in int64. */
static bool count3(int64_t a, int64_t b, int64_t c, int64_t *n)
{
    return hp_mul_i64(a, b, n) && hp_mul_i64(*n, c, n);
}

/* The expert width I read from tensor `name` against config.json (I_cfg 0: not given). */
static hp_status check_expert_width(hp__moe_src *ld, const char *name, int64_t I, int64_t I_cfg)
{
    if (I < 1)
        return hp_err_set(ld->err, HP_ERR_INPUT,
                          "tensor '%s' gives the experts of layer %lld a width of %lld; an expert needs a positive "
                          "width (the checkpoint is corrupt)",
                          name, (long long)ld->l->layer, (long long)I);
    if (I_cfg > 0 && I != I_cfg)
        return hp_err_set(ld->err, HP_ERR_INPUT,
                          "tensor '%s' gives the experts a width of %lld but config.json moe_intermediate_size is %lld "
                          "(Mixtral and gpt-oss: intermediate_size); the checkpoint and config.json disagree",
                          name, (long long)I, (long long)I_cfg);
    return HP_OK;
}

/* Router values are ranked, so a NaN or Inf would make the selection meaningless: refuse them at load,
 * naming the first one (row and column for a matrix of `cols` columns, cols 0 for a vector). */
static hp_status check_router_finite(hp__moe_src *ld, const char *name, const double *v, int64_t n, int64_t cols)
{
    for (int64_t i = 0; i < n; i++) {
        if (isfinite(v[i])) continue;
        char where[80] = "";
        if (cols > 0)
            snprintf(where, sizeof where, " (row %lld, column %lld)", (long long)(i / cols), (long long)(i % cols));
        return hp_err_set(ld->err, HP_ERR_INPUT,
                          "tensor '%s' holds %s at element %lld%s; the router cannot rank experts with non-finite "
                          "values: the checkpoint is corrupt (re-export or re-download it)",
                          name, isnan(v[i]) ? "NaN" : "Inf", (long long)i, where);
    }
    return HP_OK;
}

/* Shared-expert tensor `name` [rows, cols] as read (f32): small, so checked whole at load. */
static hp_status check_shared_finite(hp__moe_src *ld, const char *name, const float *v, int64_t rows, int64_t cols)
{
    int64_t i = hp__moe_first_nonfinite(v, rows * cols);
    if (i < 0) return HP_OK;
    return hp_err_set(ld->err, HP_ERR_INPUT,
                      "tensor '%s' holds %s at element %lld (row %lld, column %lld); the shared expert would turn "
                      "every output row non-finite: the checkpoint is corrupt (re-export or re-download it)",
                      name, isnan(v[i]) ? "NaN" : "Inf", (long long)i, (long long)(i / cols), (long long)(i % cols));
}

/* ---- interface assertion ---- */

/* Checks the block module has every child the archetype needs; the error lists what it has. */
static hp_status check_interface(hp__moe_src *ld, const hp__moe_archetype_info *info)
{
    char leaf[HP__MOE_MAX_CHILDREN][48];
    int n = hp__moe_src_children(ld, leaf);
    char have[512] = "";
    for (int k = 0; k < n; k++)
        snprintf(have + strlen(have), sizeof have - strlen(have), "%s%.47s", k ? ", " : "", leaf[k]);
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
                      hp_model_suggested_archetype(ld->m));
}

/* ---- experts ---- */

/* The end of a batched loader: frees its scratch and points the layer at the expert arrays it owns. */
static hp_status adopt_experts(hp_moe_layer *l, const hp__moe_owned *ow, void *tmp, void *tb, hp_status st)
{
    free(tmp);
    free(tb);
    l->w_gate_up = ow->w_gate_up;
    l->w_down = ow->w_down;
    l->b_gate_up = ow->b_gate_up;
    l->b_down = ow->b_down;
    return st;
}

static hp_status load_batched(hp__moe_src *ld, hp__moe_owned *ow, bool zero_copy_ok, int64_t I_cfg)
{
    hp_moe_layer *l = ld->l;
    int64_t E = l->n_experts, H = l->n_hidden, n = l->n_local, f = l->first_expert;
    hp__moe_tview gu = {0}, dn = {0}, gub = {0}, dnb = {0};
    hp__moe_src_find(ld, "experts.gate_up_proj", &gu); /* present: the caller chose this layout by it */
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
    if ((st = check_expert_width(ld, gu.name, I, I_cfg))) return st;
    l->d_expert = I;
    int64_t s_gu[3] = {E, 2 * I, H}, s_dn[3] = {E, H, I};
    if (gptoss) {
        int64_t g_gu[3] = {E, H, 2 * I}, g_dn[3] = {E, I, H}, s_gub[2] = {E, 2 * I}, s_dnb[2] = {E, H};
        if ((st = hp__moe_src_need(ld, "experts.gate_up_proj", 3, g_gu, &gu)) ||
            (st = hp__moe_src_need(ld, "experts.down_proj", 3, g_dn, &dn)) ||
            (st = hp__moe_src_need(ld, "experts.gate_up_proj_bias", 2, s_gub, &gub)) ||
            (st = hp__moe_src_need(ld, "experts.down_proj_bias", 2, s_dnb, &dnb)))
            return st;
        l->storage = "batched gpt-oss";
    } else {
        if ((st = hp__moe_src_need(ld, "experts.gate_up_proj", 3, s_gu, &gu)) ||
            (st = hp__moe_src_need(ld, "experts.down_proj", 3, s_dn, &dn)))
            return st;
        l->storage = "batched";
    }
    l->dtype = gu.dtype;
    if (dn.dtype != gu.dtype)
        return hp_err_set(ld->err, HP_ERR_INPUT, "tensor '%s' is %s but '%s' is %s; a layer's experts share one dtype",
                          dn.name, hp_dtype_name(dn.dtype), gu.name, hp_dtype_name(gu.dtype));
    const hp_dtype wdt = l->w_dtype = hp__moe_src_wdtype(ld, gu.dtype);
    const size_t el = wdt == HP_DT_BF16 ? 2 : sizeof(float);
    /* n <= E, so these are at most the element counts of the tensors need() just checked. */
    int64_t n_gu = n * 2 * I * H, n_dn = n * H * I;
    bool ok = true;
    if (!gptoss) {
        l->w_gate_up = hp__moe_src_mapped(&gu, wdt, f * 2 * I * H, n_gu, zero_copy_ok);
        l->w_down = hp__moe_src_mapped(&dn, wdt, f * H * I, n_dn, zero_copy_ok);
        l->zero_copy = l->w_gate_up && l->w_down;
        if (!l->w_gate_up) {
            if (!(ow->w_gate_up = hp__moe_alloc(n_gu, el, &ok))) return hp_err_set(ld->err, HP_ERR_NOMEM, "out of memory");
            if ((st = hp__moe_src_read_w(ld, &gu, wdt, f * 2 * I * H, n_gu, ow->w_gate_up))) return st;
            l->w_gate_up = ow->w_gate_up;
        }
        if (!l->w_down) {
            if (!(ow->w_down = hp__moe_alloc(n_dn, el, &ok))) return hp_err_set(ld->err, HP_ERR_NOMEM, "out of memory");
            if ((st = hp__moe_src_read_w(ld, &dn, wdt, f * H * I, n_dn, ow->w_down))) return st;
            l->w_down = ow->w_down;
        }
        return HP_OK;
    }
    /* gpt-oss: de-interleave and transpose one expert at a time through a scratch matrix, element by element
     * in the resident dtype (bf16 moves as its 2 bytes, unchanged). */
    uint8_t *tmp = hp__moe_alloc(2 * I * H, el, &ok);
    float *tb = hp__moe_alloc_f32(2 * I);
    ow->w_gate_up = hp__moe_alloc(n_gu, el, &ok);
    ow->w_down = hp__moe_alloc(n_dn, el, &ok);
    ow->b_gate_up = hp__moe_alloc_f32(n * 2 * I);
    ow->b_down = hp__moe_alloc_f32(n * H);
    st = (tmp && tb && ow->w_gate_up && ow->w_down && ow->b_gate_up && ow->b_down)
             ? HP_OK
             : hp_err_set(ld->err, HP_ERR_NOMEM, "out of memory loading layer %lld", (long long)l->layer);
#define EL(base, i) ((base) + (size_t)(i) * el)
    for (int64_t e = 0; st == HP_OK && e < n; e++) {
        uint8_t *wgu = EL((uint8_t *)ow->w_gate_up, e * 2 * I * H), *wdn = EL((uint8_t *)ow->w_down, e * H * I);
        if ((st = hp__moe_src_read_w(ld, &gu, wdt, (f + e) * H * 2 * I, H * 2 * I, tmp))) break;
        for (int64_t h = 0; h < H; h++)
            for (int64_t j = 0; j < I; j++) {
                memcpy(EL(wgu, j * H + h), EL(tmp, h * 2 * I + 2 * j), el);
                memcpy(EL(wgu, (I + j) * H + h), EL(tmp, h * 2 * I + 2 * j + 1), el);
            }
        if ((st = hp__moe_src_read_f32(ld, &gub, (f + e) * 2 * I, 2 * I, tb))) break;
        for (int64_t j = 0; j < I; j++) {
            ow->b_gate_up[e * 2 * I + j] = tb[2 * j];
            ow->b_gate_up[e * 2 * I + I + j] = tb[2 * j + 1];
        }
        if ((st = hp__moe_src_read_w(ld, &dn, wdt, (f + e) * I * H, I * H, tmp))) break;
        for (int64_t i = 0; i < I; i++)
            for (int64_t h = 0; h < H; h++) memcpy(EL(wdn, h * I + i), EL(tmp, i * H + h), el);
        if ((st = hp__moe_src_read_f32(ld, &dnb, (f + e) * H, H, ow->b_down + e * H))) break;
    }
#undef EL
    return adopt_experts(l, ow, tmp, tb, st);
}

/* Block o->tp_rank of o->tp_size of a width w: [r·w/n, (r+1)·w/n), as the shard layout cuts (hp__blk_lo). */
static hp_status tp_cut(hp__moe_src *ld, const char *what, int64_t w, const hp_moe_load_opts *o, int64_t *lo,
                        int64_t *n)
{
    int64_t a, b;
    if (o->tp_rank < 0 || o->tp_rank >= o->tp_size || !hp_mul_i64(w, o->tp_rank + 1, &b))
        return hp_err_set(ld->err, HP_ERR_INPUT, "layer %lld: tp rank %lld of %lld is not a block of %s (%lld)",
                          (long long)ld->l->layer, (long long)o->tp_rank, (long long)o->tp_size, what, (long long)w);
    a = w * o->tp_rank / o->tp_size; /* w·r <= w·(r+1), which fits */
    b /= o->tp_size;
    if (b - a < 1)
        return hp_err_set(ld->err, HP_ERR_INPUT,
                          "layer %lld: %s (%lld) is narrower than tp=%lld, so tp rank %lld holds no column of it; "
                          "choose a tp of at most %lld", (long long)ld->l->layer, what, (long long)w,
                          (long long)o->tp_size, (long long)o->tp_rank, (long long)w);
    *lo = a, *n = b - a;
    return HP_OK;
}

/* The routed experts cut over tp: columns [c0, c0 + n) of every local expert's width I, from any of the three
 * storages, through box reads (a checkpoint's whole tensors, or a rank file's cut of the same plan). Never zero
 * copy: the local block of a checkpoint tensor is not contiguous. */
static hp_status load_experts_cut(hp__moe_src *ld, hp__moe_owned *ow, int64_t I_cfg, const hp_moe_load_opts *o)
{
    hp_moe_layer *l = ld->l;
    const int64_t H = l->n_hidden, f = l->first_expert, nl = l->n_local, E = l->n_experts;
    bool gptoss = l->act == HP_MOE_ACT_GPTOSS, batched = hp__moe_src_has(ld, "experts.gate_up_proj");
    static const char *names[2][3] = {{"gate_proj", "up_proj", "down_proj"}, {"w1", "w3", "w2"}};
    char sfx[128];
    hp__moe_tview gu = {0}, dn = {0}, gub = {0}, dnb = {0}, g0 = {0};
    hp_status st;
    int which = 0;
    int64_t I;
    if (batched) {
        hp__moe_src_find(ld, "experts.gate_up_proj", &gu);
        int64_t two_i = gu.n_dims == 3 ? gu.shape[gptoss ? 2 : 1] : 0;
        if (two_i <= 0 || two_i % 2)
            return hp_err_set(ld->err, HP_ERR_INPUT, "tensor '%s' must be 3-D with an even gate/up axis (%s), found %d "
                              "dims; archetype %s", gu.name, gptoss ? "[E, H, 2I]" : "[E, 2I, H]", gu.n_dims,
                              hp_moe_archetype_name(l->archetype));
        I = two_i / 2;
        if ((st = check_expert_width(ld, gu.name, I, I_cfg))) return st;
        int64_t s_gu[3] = {E, 2 * I, H}, s_dn[3] = {E, H, I}, g_gu[3] = {E, H, 2 * I}, g_dn[3] = {E, I, H};
        int64_t s_gub[2] = {E, 2 * I}, s_dnb[2] = {E, H};
        if ((st = hp__moe_src_need(ld, "experts.gate_up_proj", 3, gptoss ? g_gu : s_gu, &gu)) ||
            (st = hp__moe_src_need(ld, "experts.down_proj", 3, gptoss ? g_dn : s_dn, &dn)))
            return st;
        if (gptoss && ((st = hp__moe_src_need(ld, "experts.gate_up_proj_bias", 2, s_gub, &gub)) ||
                       (st = hp__moe_src_need(ld, "experts.down_proj_bias", 2, s_dnb, &dnb))))
            return st;
        l->storage = gptoss ? "batched gpt-oss" : "batched";
    } else if (gptoss) {
        return hp_err_set(ld->err, HP_ERR_INPUT, "tensor '%s.experts.gate_up_proj' [E, H, 2I] is missing; archetype %s "
                          "needs gpt-oss's batched, interleaved experts with biases", ld->block,
                          hp_moe_archetype_name(l->archetype));
    } else {
        snprintf(sfx, sizeof sfx, "experts.%lld.w1.weight", (long long)f);
        if (hp__moe_src_has(ld, sfx)) which = 1;
        snprintf(sfx, sizeof sfx, "experts.%lld.%s.weight", (long long)f, names[which][0]);
        if (!hp__moe_src_find(ld, sfx, &g0) || g0.n_dims != 2)
            return hp_err_set(ld->err, HP_ERR_INPUT, "tensor '%s.%s' [I, H] is missing; archetype %s needs the experts "
                              "of layer %lld", ld->block, sfx, hp_moe_archetype_name(l->archetype), (long long)l->layer);
        I = g0.shape[0];
        if ((st = check_expert_width(ld, g0.name, I, I_cfg))) return st;
        int64_t s_in[2] = {I, H}, s_out[2] = {H, I};
        for (int64_t e = 0; e < nl; e++)
            for (int p = 0; p < 3; p++) {
                snprintf(sfx, sizeof sfx, "experts.%lld.%s.weight", (long long)(f + e), names[which][p]);
                if ((st = hp__moe_src_need(ld, sfx, 2, p < 2 ? s_in : s_out, &gu))) return st;
            }
        l->storage = "per-expert";
    }
    int64_t c0, n;
    if ((st = tp_cut(ld, "the experts' width", gptoss ? 2 * I : I, o, &c0, &n))) return st;
    if (gptoss) { /* the layout cuts the interleaved 2I: whole gate/up pairs only */
        if (c0 % 2 || n % 2)
            return hp_err_set(ld->err, HP_ERR_INPUT,
                              "layer %lld: tp=%lld cuts gpt-oss's interleaved gate/up axis (2I = %lld) at column %lld, "
                              "between a gate column and its up column; choose a tp that divides the expert width I "
                              "(%lld)", (long long)l->layer, (long long)o->tp_size, (long long)(2 * I),
                              (long long)(n % 2 ? c0 + n : c0), (long long)I);
        c0 /= 2, n /= 2;
    }
    hp__moe_tview *dt_of = batched ? &gu : &g0;
    l->dtype = dt_of->dtype;
    const hp_dtype wdt = l->w_dtype = hp__moe_src_wdtype(ld, dt_of->dtype);
    const size_t el = wdt == HP_DT_BF16 ? 2 : sizeof(float);
    l->d_expert = n;
    bool ok = true;
    ow->w_gate_up = hp__moe_alloc(nl * 2 * n * H, el, &ok);
    ow->w_down = hp__moe_alloc(nl * H * n, el, &ok);
    uint8_t *tmp = hp__moe_alloc(2 * n * H, el, &ok);
    float *tb = gptoss ? hp__moe_alloc_f32(2 * n) : NULL;
    if (gptoss) {
        ow->b_gate_up = hp__moe_alloc_f32(nl * 2 * n);
        ow->b_down = hp__moe_alloc_f32(nl * H);
    }
    st = ow->w_gate_up && ow->w_down && tmp && (!gptoss || (tb && ow->b_gate_up && ow->b_down))
             ? HP_OK
             : hp_err_set(ld->err, HP_ERR_NOMEM, "out of memory loading layer %lld", (long long)l->layer);
#define EL(base, i) ((base) + (size_t)(i) * el)
    for (int64_t e = 0; st == HP_OK && e < nl; e++) {
        uint8_t *wgu = EL((uint8_t *)ow->w_gate_up, e * 2 * n * H), *wdn = EL((uint8_t *)ow->w_down, e * H * n);
        if (batched && !gptoss) { /* [E, 2I, H] gate rows then up rows; [E, H, I] */
            int64_t lg[3] = {f + e, c0, 0}, lu[3] = {f + e, I + c0, 0}, nr[3] = {1, n, H};
            int64_t ld3[3] = {f + e, 0, c0}, nd3[3] = {1, H, n};
            if ((st = hp__moe_src_read_box(ld, &gu, wdt, lg, nr, wgu)) ||
                (st = hp__moe_src_read_box(ld, &gu, wdt, lu, nr, EL(wgu, n * H))) ||
                (st = hp__moe_src_read_box(ld, &dn, wdt, ld3, nd3, wdn)))
                break;
        } else if (batched) { /* gpt-oss: [E, H, 2I] interleaved pairs, [E, 2I] bias, [E, I, H] down, [E, H] bias */
            int64_t lg[3] = {f + e, 0, 2 * c0}, ng[3] = {1, H, 2 * n}, lb[2] = {f + e, 2 * c0}, nb[2] = {1, 2 * n};
            int64_t ld3[3] = {f + e, c0, 0}, nd3[3] = {1, n, H};
            if ((st = hp__moe_src_read_box(ld, &gu, wdt, lg, ng, tmp))) break;
            for (int64_t h = 0; h < H; h++)
                for (int64_t j = 0; j < n; j++) {
                    memcpy(EL(wgu, j * H + h), EL(tmp, h * 2 * n + 2 * j), el);
                    memcpy(EL(wgu, (n + j) * H + h), EL(tmp, h * 2 * n + 2 * j + 1), el);
                }
            if ((st = hp__moe_src_read_box(ld, &gub, HP_DT_F32, lb, nb, tb))) break;
            for (int64_t j = 0; j < n; j++) {
                ow->b_gate_up[e * 2 * n + j] = tb[2 * j];
                ow->b_gate_up[e * 2 * n + n + j] = tb[2 * j + 1];
            }
            if ((st = hp__moe_src_read_box(ld, &dn, wdt, ld3, nd3, tmp))) break;
            for (int64_t i = 0; i < n; i++)
                for (int64_t h = 0; h < H; h++) memcpy(EL(wdn, h * n + i), EL(tmp, i * H + h), el);
            int64_t lbd[2] = {f + e, 0}, nbd[2] = {1, H};
            if (o->tp_rank == 0 && (st = hp__moe_src_read_box(ld, &dnb, HP_DT_F32, lbd, nbd, ow->b_down + e * H)))
                break;
        } else { /* per-expert [I, H], [I, H], [H, I] */
            for (int p = 0; p < 3 && st == HP_OK; p++) {
                snprintf(sfx, sizeof sfx, "experts.%lld.%s.weight", (long long)(f + e), names[which][p]);
                hp__moe_src_find(ld, sfx, &gu); /* present with its shape: checked above */
                int64_t lr[2] = {c0, 0}, nr[2] = {n, H}, lc[2] = {0, c0}, nc[2] = {H, n};
                st = hp__moe_src_read_box(ld, &gu, wdt, p < 2 ? lr : lc, p < 2 ? nr : nc,
                                          p == 0 ? wgu : p == 1 ? EL(wgu, n * H) : wdn);
            }
        }
    }
#undef EL
    return adopt_experts(l, ow, tmp, tb, st);
}

static hp_status load_per_expert(hp__moe_src *ld, hp__moe_owned *ow, int64_t I_cfg)
{
    hp_moe_layer *l = ld->l;
    int64_t H = l->n_hidden, f = l->first_expert;
    /* Projection names: transformers' gate_proj/up_proj/down_proj, or Mixtral's w1/w3/w2. */
    static const char *names[2][3] = {{"gate_proj", "up_proj", "down_proj"}, {"w1", "w3", "w2"}};
    int which = 0;
    char sfx[128];
    snprintf(sfx, sizeof sfx, "experts.%lld.w1.weight", (long long)f);
    if (hp__moe_src_has(ld, sfx)) which = 1;
    snprintf(sfx, sizeof sfx, "experts.%lld.%s.weight", (long long)f, names[which][0]);
    hp__moe_tview g0;
    if (!hp__moe_src_find(ld, sfx, &g0))
        return hp_err_set(ld->err, HP_ERR_INPUT,
                          "tensor '%s.%s' is missing; archetype %s needs the experts of layer %lld "
                          "(per-expert names or a batched experts.gate_up_proj)",
                          ld->block, sfx, hp_moe_archetype_name(l->archetype), (long long)l->layer);
    /* I from the first expert's gate; a gate that is not a matrix shows need()'s shape error. */
    int64_t I = g0.n_dims == 2 ? g0.shape[0] : I_cfg;
    int64_t s_in[2] = {I, H}, s_out[2] = {H, I};
    hp_status st = g0.n_dims == 2 ? check_expert_width(ld, g0.name, I, I_cfg)
                                  : hp__moe_src_need(ld, sfx, 2, s_in, &g0);
    if (st) return st;
    l->d_expert = I;
    l->storage = "per-expert";
    l->dtype = g0.dtype;
    const hp_dtype wdt = l->w_dtype = hp__moe_src_wdtype(ld, g0.dtype);
    const size_t el = wdt == HP_DT_BF16 ? 2 : sizeof(float);
    /* Every local expert's three tensors exist with their shapes before anything is allocated, so a
     * checkpoint missing experts is an input error however large the buffers would have been. */
    hp__moe_tview t;
    for (int64_t e = 0; e < l->n_local; e++)
        for (int p = 0; p < 3; p++) {
            snprintf(sfx, sizeof sfx, "experts.%lld.%s.weight", (long long)(f + e), names[which][p]);
            if ((st = hp__moe_src_need(ld, sfx, 2, p < 2 ? s_in : s_out, &t))) return st;
        }
    int64_t n_gu, n_dn;
    if (!count3(l->n_local, 2 * I, H, &n_gu) || !count3(l->n_local, H, I, &n_dn))
        return hp_err_set(ld->err, HP_ERR_INPUT, "layer %lld: %lld experts of %lld x %lld weights overflow a size",
                          (long long)l->layer, (long long)l->n_local, (long long)I, (long long)H);
    bool ok = true;
    if (!(ow->w_gate_up = hp__moe_alloc(n_gu, el, &ok)) || !(ow->w_down = hp__moe_alloc(n_dn, el, &ok)))
        return hp_err_set(ld->err, HP_ERR_NOMEM, "out of memory loading layer %lld", (long long)l->layer);
    for (int64_t e = 0; e < l->n_local; e++) {
        uint8_t *wgu = (uint8_t *)ow->w_gate_up + (size_t)(e * 2 * I * H) * el;
        for (int p = 0; p < 3; p++) {
            snprintf(sfx, sizeof sfx, "experts.%lld.%s.weight", (long long)(f + e), names[which][p]);
            hp__moe_src_find(ld, sfx, &t); /* present with its shape: checked above */
            void *dst = p == 0   ? (void *)wgu
                        : p == 1 ? (void *)(wgu + (size_t)(I * H) * el)
                                 : (void *)((uint8_t *)ow->w_down + (size_t)(e * H * I) * el);
            if ((st = hp__moe_src_read_w(ld, &t, wdt, 0, I * H, dst))) return st;
        }
    }
    l->w_gate_up = ow->w_gate_up;
    l->w_down = ow->w_down;
    return HP_OK;
}

/* The one block [*lo, *lo + *n) of the shared expert's width sI that a rank file holds of all three tensors
 * (gate and up [sI, H] on dim 0, down [H, sI] on dim 1, the other dim whole); false when the three disagree or
 * a tensor is held in pieces (the whole read then names the slice). */
static bool held_block(const hp__moe_tview *g, const hp__moe_tview *u, const hp__moe_tview *d, int64_t sI, int64_t H,
                       int64_t *lo, int64_t *n)
{
    const hp__moe_tview *v[3] = {g, u, d};
    *lo = *n = 0;
    for (int i = 0; i < 3; i++) {
        int cut = i < 2 ? 0 : 1, whole = 1 - cut;
        if (v[i]->absent || v[i]->n_dims != 2 || v[i]->nseg[cut] != 1 || v[i]->nseg[whole] != 1 ||
            v[i]->seg_lo[whole][0] != 0 || v[i]->seg_n[whole][0] != H)
            return false;
        int64_t a = v[i]->seg_lo[cut][0], m = v[i]->seg_n[cut][0];
        if (a < 0 || m < 1 || m > sI - a || (i > 0 && (a != *lo || m != *n))) return false;
        *lo = a, *n = m;
    }
    return true;
}

/* Shared expert(s): <block>.<name>.{gate,up,down}_proj.weight, and Qwen2-MoE's shared_expert_gate. */
static hp_status load_shared(hp__moe_src *ld, const hp_moe_load_opts *o)
{
    hp_moe_layer *l = ld->l;
    if (l->shared == HP_MOE_SHARED_NONE) return HP_OK;
    const char *mod = l->shared == HP_MOE_SHARED_GATED ? "shared_expert" : "shared_experts";
    int64_t H = l->n_hidden;
    char sfx[128];
    snprintf(sfx, sizeof sfx, "%s.gate_proj.weight", mod);
    hp__moe_tview g, u, d;
    bool g_found = hp__moe_src_find(ld, sfx, &g);
    int64_t sI = g_found && g.n_dims == 2 ? g.shape[0] : 1;
    int64_t s_in[2] = {sI, H}, s_out[2] = {H, sI}, sI_cfg = ld->m->cfg.shared_intermediate_size;
    hp_status st;
    if ((st = hp__moe_src_need(ld, sfx, 2, s_in, &g))) return st;
    if (sI < 1)
        return hp_err_set(ld->err, HP_ERR_INPUT,
                          "tensor '%s' has 0 rows; a shared expert needs a positive width (the checkpoint is corrupt)",
                          g.name);
    if (sI_cfg > 0 && sI != sI_cfg)
        return hp_err_set(ld->err, HP_ERR_INPUT,
                          "tensor '%s' has %lld rows but config.json gives the shared expert width %lld "
                          "(shared_expert_intermediate_size, or moe_intermediate_size x n_shared_experts); the "
                          "checkpoint and config.json disagree",
                          g.name, (long long)sI, (long long)sI_cfg);
    snprintf(sfx, sizeof sfx, "%s.up_proj.weight", mod);
    if ((st = hp__moe_src_need(ld, sfx, 2, s_in, &u))) return st;
    snprintf(sfx, sizeof sfx, "%s.down_proj.weight", mod);
    if ((st = hp__moe_src_need(ld, sfx, 2, s_out, &d))) return st;
    int64_t h0 = 0, hn = 0;
    if (o->tp_size < 2 && o->shared_tp_slice && ld->rf && held_block(&g, &u, &d, sI, H, &h0, &hn) &&
        hn < sI) { /* a rank file's tp block of the width: read into whole buffers, the rest gathered later */
        l->d_shared = sI, l->shared_lo = h0, l->shared_n = hn;
        float *tmp = NULL;
        if (!(l->ws_gate_up = hp__moe_alloc_f32(2 * sI * H)) || !(l->ws_down = hp__moe_alloc_f32(H * sI)) ||
            !(tmp = hp__moe_alloc_f32(H * hn))) { /* zeroed */
            free(tmp);
            return hp_err_set(ld->err, HP_ERR_NOMEM, "out of memory");
        }
        float *wg = l->ws_gate_up + h0 * H, *wu = l->ws_gate_up + (sI + h0) * H;
        int64_t lr[2] = {h0, 0}, nr[2] = {hn, H}, lc[2] = {0, h0}, nc[2] = {H, hn};
        if ((st = hp__moe_src_read_box(ld, &g, HP_DT_F32, lr, nr, wg)) ||
            (st = check_shared_finite(ld, g.name, wg, hn, H)) ||
            (st = hp__moe_src_read_box(ld, &u, HP_DT_F32, lr, nr, wu)) ||
            (st = check_shared_finite(ld, u.name, wu, hn, H)) ||
            (st = hp__moe_src_read_box(ld, &d, HP_DT_F32, lc, nc, tmp)) ||
            (st = check_shared_finite(ld, d.name, tmp, H, hn))) {
            free(tmp);
            return st;
        }
        for (int64_t i = 0; i < H; i++) memcpy(l->ws_down + i * sI + h0, tmp + i * hn, (size_t)hn * sizeof(float));
        free(tmp);
        sI = 0; /* read */
    } else if (o->tp_size > 1) { /* cut over tp: columns [c0, c0 + n) of the width, read as boxes */
        int64_t c0, n;
        if ((st = tp_cut(ld, "the shared expert's width", sI, o, &c0, &n))) return st;
        l->d_shared = n;
        if (!(l->ws_gate_up = hp__moe_alloc_f32(2 * n * H)) || !(l->ws_down = hp__moe_alloc_f32(H * n)))
            return hp_err_set(ld->err, HP_ERR_NOMEM, "out of memory");
        int64_t lr[2] = {c0, 0}, nr[2] = {n, H}, lc[2] = {0, c0}, nc[2] = {H, n};
        if ((st = hp__moe_src_read_box(ld, &g, HP_DT_F32, lr, nr, l->ws_gate_up)) ||
            (st = check_shared_finite(ld, g.name, l->ws_gate_up, n, H)) ||
            (st = hp__moe_src_read_box(ld, &u, HP_DT_F32, lr, nr, l->ws_gate_up + n * H)) ||
            (st = check_shared_finite(ld, u.name, l->ws_gate_up + n * H, n, H)) ||
            (st = hp__moe_src_read_box(ld, &d, HP_DT_F32, lc, nc, l->ws_down)) ||
            (st = check_shared_finite(ld, d.name, l->ws_down, H, n)))
            return st;
        l->shared_lo = 0, l->shared_n = n;
        sI = 0; /* read */
    } else {
        l->d_shared = sI, l->shared_lo = 0, l->shared_n = sI;
        if (!(l->ws_gate_up = hp__moe_alloc_f32(2 * sI * H)) || !(l->ws_down = hp__moe_alloc_f32(H * sI)))
            return hp_err_set(ld->err, HP_ERR_NOMEM, "out of memory");
    }
    /* sI·H is the element count of a tensor need() checked; 2·sI·H is two of them. */
    if (sI > 0 && ((st = hp__moe_src_read_f32(ld, &g, 0, sI * H, l->ws_gate_up)) ||
        (st = check_shared_finite(ld, g.name, l->ws_gate_up, sI, H)) ||
        (st = hp__moe_src_read_f32(ld, &u, 0, sI * H, l->ws_gate_up + sI * H)) ||
        (st = check_shared_finite(ld, u.name, l->ws_gate_up + sI * H, sI, H)) ||
        (st = hp__moe_src_read_f32(ld, &d, 0, H * sI, l->ws_down)) ||
        (st = check_shared_finite(ld, d.name, l->ws_down, H, sI))))
        return st;
    if (l->shared == HP_MOE_SHARED_GATED) {
        int64_t s_g[2] = {1, H};
        if ((st = hp__moe_src_need(ld, "shared_expert_gate.weight", 2, s_g, &g))) return st;
        if (!(l->ws_gate = hp__moe_alloc_f32(H))) return hp_err_set(ld->err, HP_ERR_NOMEM, "out of memory");
        if ((st = hp__moe_src_read_f32(ld, &g, 0, H, l->ws_gate)) ||
            (st = check_shared_finite(ld, g.name, l->ws_gate, 1, H)))
            return st;
    }
    return HP_OK;
}

static hp_status load(hp__moe_src *ld, const hp_moe_load_opts *o)
{
    const hp_model *m = ld->m;
    hp_moe_layer *l = ld->l;
    hp_err *err = ld->err;
    const hp_model_config *c = &m->cfg;
    if (!ld->rf && (m->meta || !m->ckpt))
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s is a config-only (meta) model; running an MoE layer needs a checkpoint with weights",
                          m->path);
    if (c->num_hidden_layers < 1) {
        /* A weights-only folder opens with no config (every hyperparameter 0): say that, not "0 layers". */
        char cfg[4200];
        struct stat sb;
        snprintf(cfg, sizeof cfg, "%s/config.json", m->ckpt ? hp_ckpt_dir(m->ckpt) : m->path);
        bool has_cfg = m->meta || stat(cfg, &sb) == 0;
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s declares no decoder layers: %s; the MoE runtime reads the layer count, hidden size "
                          "and expert settings from config.json: put the model's config.json next to its weights",
                          m->path, has_cfg ? "its config.json lacks num_hidden_layers (or gives 0)"
                                           : "the folder has no config.json");
    }
    if (l->layer < 0 || l->layer >= c->num_hidden_layers)
        return hp_err_set(err, HP_ERR_INPUT, "layer %lld is out of range: the model has %lld layers (0..%lld)",
                          (long long)l->layer, (long long)c->num_hidden_layers, (long long)c->num_hidden_layers - 1);
    if (!hp_model_layer_is_sparse(m, l->layer)) {
        char sparse[256] = "";
        for (int64_t i = 0; i < c->num_hidden_layers && strlen(sparse) < 200; i++)
            if (hp_model_layer_is_sparse(m, i))
                snprintf(sparse + strlen(sparse), sizeof sparse - strlen(sparse), "%s%lld", sparse[0] ? ", " : "",
                         (long long)i);
        if (!sparse[0])
            return hp_err_set(err, HP_ERR_INPUT,
                              "layer %lld of %s is dense, and so is every layer: the model has no routed experts "
                              "(num_experts is %lld in its config.json); hyperpar moe runs the MoE layers of "
                              "mixture-of-experts models only",
                              (long long)l->layer, m->path, (long long)c->n_experts);
        return hp_err_set(err, HP_ERR_INPUT,
                          "layer %lld of %s is dense (a plain MLP, no routed experts); choose a sparse layer: %s",
                          (long long)l->layer, m->path, sparse);
    }
    hp_moe_archetype a;
    if (o->archetype < -1 || o->archetype >= HP_MOE_ARCHETYPE_COUNT)
        return hp_err_set(err, HP_ERR_INPUT, "unknown archetype %d in the load options; known: %s (or -1: the "
                          "family's suggestion)",
                          o->archetype, hp_moe_archetype_list());
    if (o->archetype >= 0) {
        a = (hp_moe_archetype)o->archetype;
    } else {
        const char *s = hp_model_suggested_archetype(m); /* the planner's suggestion too */
        if (!hp_moe_archetype_parse(s, &a))
            return hp_err_set(err, HP_ERR_INPUT, "internal: archetype '%s' has no runtime", s);
    }
    hp__moe_layer_apply_archetype(l, a);
    const hp__moe_archetype_info *info = hp__moe_archetype_info_of(a);

    /* The block: transformers >= 5 names it mlp; Mixtral hub checkpoints block_sparse_moe. */
    snprintf(ld->block, sizeof ld->block, "model.layers.%lld.block_sparse_moe", (long long)l->layer);
    if (!hp__moe_src_has_module(ld, ld->block))
        snprintf(ld->block, sizeof ld->block, "model.layers.%lld.mlp", (long long)l->layer);
    snprintf(l->prefix, sizeof l->prefix, "%s.", ld->block);
    hp_status st = check_interface(ld, info);
    if (st) return st;

    /* Router. */
    const char *rname = hp__moe_src_has(ld, "gate.weight") ? "gate" : "router";
    char sfx[64];
    snprintf(sfx, sizeof sfx, "%s.weight", rname);
    hp__moe_tview rw;
    if (!hp__moe_src_find(ld, sfx, &rw) || rw.n_dims != 2)
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
    if (l->n_experts < 1 || l->n_hidden < 1)
        return hp_err_set(err, HP_ERR_INPUT,
                          "tensor '%s' has shape [%lld, %lld]; an MoE layer needs at least one expert and a positive "
                          "hidden size (the checkpoint is corrupt)",
                          rw.name, (long long)l->n_experts, (long long)l->n_hidden);
    l->top_k = c->num_experts_per_tok ? c->num_experts_per_tok : 2; /* §10.3: K defaults to 2 */
    l->n_group = c->n_group > 0 ? c->n_group : 1;
    l->topk_group = c->topk_group > 0 ? c->topk_group : 1;
    l->routed_scaling_factor = c->routed_scaling_factor > 0 ? c->routed_scaling_factor : 1.0;
    if (c->swiglu_limit > 0) l->swiglu_limit = (float)c->swiglu_limit;
    bool flag = false, given = config_has_flag(c, "norm_topk_prob", &flag);
    l->norm_topk_prob = info->norm == HP__NORM_ALWAYS || ((info->norm == HP__NORM_CONFIG ||
                                                           info->norm == HP__NORM_DEFAULT_TRUE) && given && flag) ||
                        (info->norm == HP__NORM_DEFAULT_TRUE && !given);
    if ((st = hp__moe_layer_check_router(l, err)) ||
        (st = hp__moe_layer_set_range(l, o->first_expert, o->n_local, err)))
        return st;
    int64_t E = l->n_experts, H = l->n_hidden; /* E·H: the element count of the router tensor */
    if ((st = hp__moe_src_read_f64(ld, &rw, E * H, &l->w_router)) ||
        (st = check_router_finite(ld, rw.name, l->w_router, E * H, H)))
        return st;
    if (l->router == HP_MOE_ROUTER_TOPK_SOFTMAX) {
        snprintf(sfx, sizeof sfx, "%s.bias", rname);
        hp__moe_tview rb;
        if ((st = hp__moe_src_need(ld, sfx, 1, &E, &rb)) || (st = hp__moe_src_read_f64(ld, &rb, E, &l->b_router)) ||
            (st = check_router_finite(ld, rb.name, l->b_router, E, 0)))
            return st;
    }
    if (l->router == HP_MOE_ROUTER_SIGMOID_GROUP && hp__moe_src_has(ld, "gate.e_score_correction_bias")) {
        hp__moe_tview cb;
        if ((st = hp__moe_src_need(ld, "gate.e_score_correction_bias", 1, &E, &cb)) ||
            (st = hp__moe_src_read_f64(ld, &cb, E, &l->b_correction)) ||
            (st = check_router_finite(ld, cb.name, l->b_correction, E, 0)))
            return st;
    }
    if (ld->rf && (st = hp__moe_src_check_experts(ld))) return st;

    /* Experts. */
    hp__moe_owned *ow = hp_calloc(1, sizeof *ow);
    if (!ow) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    l->owned = ow;
    if (o->tp_size > 1) {
        st = load_experts_cut(ld, ow, c->moe_intermediate_size, o);
    } else if (hp__moe_src_has(ld, "experts.gate_up_proj")) {
        st = load_batched(ld, ow, !o->no_zero_copy, c->moe_intermediate_size);
    } else if (l->act == HP_MOE_ACT_GPTOSS) {
        st = hp_err_set(err, HP_ERR_INPUT,
                        "tensor '%s.experts.gate_up_proj' [E, H, 2I] is missing; archetype %s needs gpt-oss's "
                        "batched, interleaved experts with biases",
                        ld->block, info->name);
    } else {
        st = load_per_expert(ld, ow, c->moe_intermediate_size);
    }
    if (st) return st;
    l->compute = o->compute;
    return load_shared(ld, o);
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
    hp__moe_src ld = {.m = m, .l = l, .widen = opts->widen_f32, .err = err};
    hp_status st = load(&ld, opts);
    if (st) {
        hp_moe_layer_free(l);
        return st;
    }
    *out = l;
    return HP_OK;
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
        hp__moe_src ld = {.m = cfg ? cfg : own_cfg, .rf = rf, .l = l, .widen = opts->widen_f32, .err = err};
        st = load(&ld, opts);
    }
    if (st == HP_OK && l->zero_copy) { /* the expert weights point into the rank file: it lives with the layer */
        ((hp__moe_owned *)l->owned)->rf = rf;
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

hp_status hp_moe_layer_gather_shared(hp_moe_layer *l, const hp_comm *c, hp_err *err)
{
    if (!l->ws_gate_up || !l->ws_down || l->d_shared < 1) return HP_OK;
    const int P = hp_comm_size(c), me = hp_comm_rank(c);
    const int64_t sI = l->d_shared, H = l->n_hidden, mine[2] = {l->shared_lo, l->shared_n};
    int64_t *all = hp_calloc((size_t)P * 2, sizeof *all);
    if (!all) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    hp_status st = hp_comm_allgather(c, mine, sizeof mine, all, err);
    bool whole = true;
    for (int q = 0; st == HP_OK && q < P; q++) whole = whole && all[2 * q] == 0 && all[2 * q + 1] == sI;
    if (st != HP_OK || whole) {
        free(all);
        return st;
    }
    /* Column j belongs to the lowest rank holding it: zero the held columns another rank owns, and refuse a
     * width nobody holds (every rank sees the same table, so every rank refuses). */
    for (int64_t j = 0; j < sI && st == HP_OK; j++) {
        int owner = -1;
        for (int q = 0; q < P && owner < 0; q++)
            if (j >= all[2 * q] && j - all[2 * q] < all[2 * q + 1]) owner = q;
        if (owner < 0) {
            int64_t k = j;
            while (k + 1 < sI) {
                bool held = false;
                for (int q = 0; q < P; q++) held = held || (k + 1 >= all[2 * q] && k + 1 - all[2 * q] < all[2 * q + 1]);
                if (held) break;
                k++;
            }
            st = hp_err_set(err, HP_ERR_INPUT,
                            "layer %lld: no rank of the tp group holds columns [%lld, %lld) of the shared expert's "
                            "width (%lld); the shard folder was cut for another mesh (shard again with this run's "
                            "flags, or run from the checkpoint)",
                            (long long)l->layer, (long long)j, (long long)(k + 1), (long long)sI);
        } else if (owner != me && j >= mine[0] && j - mine[0] < mine[1]) {
            for (int64_t i = 0; i < H; i++) l->ws_down[i * sI + j] = 0.0f;
            memset(l->ws_gate_up + j * H, 0, (size_t)H * sizeof(float));
            memset(l->ws_gate_up + (sI + j) * H, 0, (size_t)H * sizeof(float));
        }
    }
    free(all);
    if (st != HP_OK) return st;
    /* sizes of buffers this layer allocated, so they fit size_t */
    if ((st = hp_comm_allreduce_sum_f32(c, l->ws_gate_up, (size_t)(2 * sI * H), err)) ||
        (st = hp_comm_allreduce_sum_f32(c, l->ws_down, (size_t)(H * sI), err)))
        return st;
    l->shared_lo = 0, l->shared_n = sI;
    return HP_OK;
}
