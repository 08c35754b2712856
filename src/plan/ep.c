/*
 * ep.c — §6.8 MoE EP marking of a derived moe_mlp boundary (D-09 / D-10 / D-11), run when ep > 1.
 *
 * Layout of the boundary's expert parameters (paths relative to the boundary):
 *   per-expert   experts.<e>.<proj>.weight            -> stacked into experts.<proj> [E, ...] (ep_stack)
 *   batched      experts.gate_up_proj / down_proj ... -> kept, ndim >= 3 (gpt-oss biases join them)
 *   custom       anything else (experts.w1 ...)       -> kept; the module is EP-aware by construction
 *
 * TP-extend-EP (D-10, no ep mesh axis): expert params become {cp: R, ep: S(0)} with no tp key, and the
 * boundary gets the identity contract (in_dst = in_src, out_src = out_dst = the input layout) with
 * ep_size = ep: all EP communication happens inside the region. Old-style EP (explicit ep axis): only the
 * per-expert layout changes, to stacked {tp: expert-TP, cp: R, ep: S(0)}.
 *
 * Beyond the seed: expert biases (gpt-oss experts.gate_up_proj_bias, experts.down_proj_bias) are sharded
 * with their experts ({ep: S(0)}) instead of disabling EP marking for the whole layer.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "plan/planner_int.h"

static bool all_digits(const char *s, size_t n)
{
    if (n == 0) return false;
    for (size_t i = 0; i < n; i++)
        if (!isdigit((unsigned char)s[i])) return false;
    return true;
}

/* experts.<idx>.<proj>.weight -> idx and proj (pointer into rel, length). */
static bool parse_per_expert(const char *rel, long *idx, const char **proj, size_t *proj_len)
{
    if (strncmp(rel, "experts.", 8) != 0) return false;
    const char *a = rel + 8, *dot = strchr(a, '.');
    if (!dot || !all_digits(a, (size_t)(dot - a))) return false;
    const char *p = dot + 1, *dot2 = strchr(p, '.');
    if (!dot2 || dot2 == p || strcmp(dot2, ".weight") != 0) return false;
    long v = 0;
    if (dot - a <= 9) /* fits any long: summed here, strtol beyond */
        for (const char *d = a; d < dot; d++) v = 10 * v + (*d - '0');
    else
        v = strtol(a, NULL, 10);
    *idx = v;
    *proj = p;
    *proj_len = (size_t)(dot2 - p);
    return true;
}

static bool is_batched_name(const char *rel, bool bias)
{
    static const char *const weights[] = {"gate_up_proj", "gate_and_up_projs", "down_proj", "down_projs",
                                          "gate_proj", "up_proj"};
    static const char *const biases[] = {"gate_up_proj_bias", "down_proj_bias"};
    if (strncmp(rel, "experts.", 8) != 0) return false;
    const char *leaf = rel + 8;
    const char *const *list = bias ? biases : weights;
    size_t n = bias ? 2 : 6;
    for (size_t i = 0; i < n; i++)
        if (strcmp(leaf, list[i]) == 0) return true;
    return false;
}

typedef struct src_ref {
    long idx;
    const char *rel;
    int param1;       /* hp_param_spec.param1 */
    const char *proj; /* parse_per_expert's projection: proj_len bytes into rel */
    size_t proj_len;
    int k;            /* the projection's index in order of first appearance */
} src_ref;

static int src_cmp(const void *a, const void *b)
{
    const src_ref *x = a, *y = b;
    if (x->idx != y->idx) return x->idx < y->idx ? -1 : 1;
    return strcmp(x->rel, y->rel);
}

hp_status hp__validate_ep_extend(const hp_plan *p, hp_err *err)
{
    int64_t domain = 1; /* one pipeline stage's ranks: every axis but pp */
    for (int i = 0; i < p->mesh.n_dims; i++)
        if (strcmp(p->mesh.names[i], "pp")) domain *= p->mesh.sizes[i];
    if (p->ep > domain || domain % p->ep != 0)
        return hp_err_set(err, HP_ERR_INPUT,
                          "ep_size (%lld) must not exceed and must divide the dense region (dp_replicate x dp_cp x "
                          "tp = %lld); EP groups are consecutive ranks of the dense region, so choose an ep that "
                          "divides %lld",
                          (long long)p->ep, (long long)domain, (long long)domain);
    int64_t E = p->model->cfg.n_experts;
    if (E > 0 && E % p->ep != 0)
        return hp_err_set(err, HP_ERR_INPUT,
                          "num_experts (%lld) must be divisible by ep_size (%lld); each EP rank holds E/ep "
                          "complete experts",
                          (long long)E, (long long)p->ep);
    return HP_OK;
}

hp_status hp__mark_moe_ep(hp_plan *p, hp_boundary *b, hp_err *err)
{
    const bool old_style = p->mesh.ep_axis;
    const bool has_tp = hp__plan_has_dim(p, HP_AXIS_TP);
    int n = b->n_params;
    src_ref *per = calloc((size_t)(n ? n : 1), sizeof *per);
    int *kind = calloc((size_t)(n ? n : 1), sizeof *kind); /* 0 other, 1 per-expert, 2 batched, 3 custom */
    if (!per || !kind) {
        free(per);
        free(kind);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory marking '%s' for EP", b->fqn);
    }
    int n_per = 0, n_batched = 0, n_custom = 0;
    size_t skip = b->fqn[0] ? strlen(b->fqn) + 1 : 0;
    for (int i = 0; i < n; i++) {
        const char *rel = b->params[i].rel;
        const hp_param *par = NULL;
        if (b->params[i].param1 > 0) {
            par = &p->model->params[b->params[i].param1 - 1];
        } else {
            char full[1024];
            snprintf(full, sizeof full, "%s%s%s", b->fqn, skip ? "." : "", rel);
            par = hp_model_find_param(p->model, full);
        }
        int role_idx = par ? (int)(par - p->model->params) : -1;
        if (role_idx < 0 || p->roles[role_idx] != HP_ROLE_MOE_EXPERT) continue;
        long idx;
        const char *proj;
        size_t plen;
        if (parse_per_expert(rel, &idx, &proj, &plen)) {
            kind[i] = 1;
            per[n_per] = (src_ref){.idx = idx, .rel = rel, .param1 = role_idx + 1, .proj = proj, .proj_len = plen};
            n_per++;
        } else if ((is_batched_name(rel, false) && par->n_dims >= 3) || (is_batched_name(rel, true) && par->n_dims >= 2)) {
            kind[i] = 2;
            n_batched++;
        } else {
            kind[i] = 3;
            n_custom++;
        }
    }
    hp_status st = HP_OK;
    if (n_per && n_batched) {
        hp__plan_warn(p, "%s: MoE experts mix per-expert and batched layouts; no EP marking", b->fqn);
        goto done;
    }
    if (old_style && !n_per) goto done;

    /* Per-expert: group sources by projection, sort by expert index, replace with one stacked entry. */
    if (n_per) {
        /* Projections in order of first appearance (registration order: gate, up, down); per is in parameter
         * order until it is sorted below. */
        int n_proj = 0;
        const char *projs[16];
        size_t plens[16];
        long last[16];       /* the last expert index seen per projection */
        bool in_order = true; /* every projection's experts come in increasing index order */
        for (int i = 0; i < n_per; i++) {
            const char *proj = per[i].proj;
            size_t plen = per[i].proj_len;
            int k = 0;
            while (k < n_proj && !(plens[k] == plen && memcmp(projs[k], proj, plen) == 0)) k++;
            if (k == n_proj) {
                if (n_proj == 16) {
                    st = hp_err_set(err, HP_ERR_INPUT, "%s: more than 16 expert projections; not an MoE layout "
                                    "hyperpar understands", b->fqn);
                    goto done;
                }
                projs[n_proj] = proj;
                plens[n_proj++] = plen;
            } else {
                in_order = in_order && per[i].idx > last[k];
            }
            last[k] = per[i].idx;
            per[i].k = k;
        }
        /* Each stack lists its experts by (index, name). Parameter order has them so already unless one
         * projection's indices repeat ("7" and "07") or go down: then sort. */
        if (!in_order) qsort(per, (size_t)n_per, sizeof *per, src_cmp);
        b->ep_stack = hp_arena_alloc(&p->arena, (size_t)n_proj * sizeof *b->ep_stack);
        if (!b->ep_stack) {
            st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
            goto done;
        }
        /* Keep non-per-expert params in place; append the stacked entries after them. */
        int w = 0;
        for (int i = 0; i < n; i++)
            if (kind[i] != 1) b->params[w++] = b->params[i];
        for (int k = 0; k < n_proj; k++) {
            hp_ep_stack *es = &b->ep_stack[k];
            es->name = hp_arena_printf(&p->arena, "experts.%.*s", (int)plens[k], projs[k]);
            es->src = hp_arena_alloc(&p->arena, (size_t)n_per * sizeof *es->src);
            es->src_param1 = hp_arena_alloc(&p->arena, (size_t)n_per * sizeof *es->src_param1);
            if (!es->name || !es->src || !es->src_param1) {
                st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
                goto done;
            }
            for (int i = 0; i < n_per; i++) {
                if (per[i].k == k) {
                    es->src_param1[es->n_src] = per[i].param1;
                    es->src[es->n_src++] = per[i].rel;
                }
            }
            hp_nplace pl;
            memset(&pl, 0, sizeof pl);
            pl.ax[HP_AXIS_CP] = hp_pl_r();
            pl.ax[HP_AXIS_EP] = hp_pl_s(0);
            if (old_style && has_tp) pl.ax[HP_AXIS_TP] = hp__expert_tp_placement(es->name, 3, false);
            b->params[w].rel = es->name;
            b->params[w].pl = pl;
            b->params[w].param1 = 0; /* a stacked entry, no one parameter */
            w++;
        }
        b->n_params = w;
        b->n_ep_stack = n_proj;
        if (!old_style) b->region_dispatch = -1;
    }
    if (old_style) goto done;

    /* D-10: batched and custom expert params go to the expert mesh; no tp key. */
    for (int i = 0; i < b->n_params; i++) {
        if (i < n && (kind[i] == 2 || kind[i] == 3) && !n_per) {
            hp_nplace pl;
            memset(&pl, 0, sizeof pl);
            pl.ax[HP_AXIS_CP] = hp_pl_r();
            pl.ax[HP_AXIS_EP] = hp_pl_s(0);
            b->params[i].pl = pl;
        }
    }
    if (n_batched && !n_per) b->region_dispatch = -1;
    /* Identity contract: every rank routes and combines its own tokens inside the region. */
    b->in_dst = b->in_src;
    hp_io_map out = {0};
    out.n = 1;
    snprintf(out.e[0].name, sizeof out.e[0].name, "output");
    out.e[0].pl = b->in_src.e[0].pl;
    b->out_src = out;
    b->out_dst = out;
    b->ep_size = (int)p->ep;
    (void)n_custom;
done:
    free(per);
    free(kind);
    return st;
}
