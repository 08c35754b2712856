/*
 * lints.c — finalisation and plan-time lints (spec §7.3-§8), in the seed's order:
 *
 *   virtual-EP marking (§7.3) -> TP-local attribute plans (§7.4, D-17) -> deferred row-wise biases (§7.5,
 *   D-22) -> fused gate/up TP guard (§7.6, or packed placements with --packed-fused) -> full declaration
 *   (§8.1) -> parameter uniqueness (§8.2) -> terminal marking (§8.3) -> special handlers (§8.4) -> shard
 *   divisibility F4a (§8.5) -> coverage F4b (§8.6) -> tied pairs (§8.8) -> MoE without sequence parallelism
 *   (a warning).
 *
 * Every failure is HP_ERR_INPUT with the seed's wording (tests match on it) plus what to do.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "plan/planner_int.h"

static const char *full_name(const hp_boundary *b, const char *rel, char *buf, size_t cap)
{
    if (snprintf(buf, cap, "%s%s%s", b->fqn, b->fqn[0] ? "." : "", rel) >= (int)cap) buf[cap - 1] = '\0';
    return buf;
}

/* Role of a boundary parameter; stacked expert names (not model params) are MOE_EXPERT. */
static hp_role role_of(const hp_plan *p, const char *full)
{
    const hp_param *par = hp_model_find_param(p->model, full);
    return par ? p->roles[par - p->model->params] : HP_ROLE_MOE_EXPERT;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

bool hp__param_shape(const hp_plan *p, const hp_boundary *b, const char *rel, int *ndim, int64_t *shape)
{
    char full[1024];
    const hp_param *par = hp_model_find_param(p->model, full_name(b, rel, full, sizeof full));
    if (par) {
        *ndim = par->n_dims;
        memcpy(shape, par->shape, (size_t)par->n_dims * sizeof *shape);
        return true;
    }
    for (int k = 0; k < b->n_ep_stack; k++) {
        if (strcmp(b->ep_stack[k].name, rel) != 0 || b->ep_stack[k].n_src == 0) continue;
        par = hp_model_find_param(p->model, full_name(b, b->ep_stack[k].src[0], full, sizeof full));
        if (!par || par->n_dims + 1 > HP_MAX_DIMS) return false;
        *ndim = par->n_dims + 1;
        shape[0] = b->ep_stack[k].n_src;
        memcpy(shape + 1, par->shape, (size_t)par->n_dims * sizeof *shape);
        return true;
    }
    return false;
}

static hp_param_spec *find_spec_param(hp_boundary *b, const char *rel)
{
    for (int i = 0; i < b->n_params; i++)
        if (strcmp(b->params[i].rel, rel) == 0) return &b->params[i];
    return NULL;
}

/* §7.3: hand-written specs with ep shards join the expert mesh. */
static hp_status virtual_ep(hp_plan *p, hp_err *err)
{
    if (p->ep <= 1 || p->mesh.ep_axis) return HP_OK;
    bool marked = false;
    for (size_t i = 0; i < p->n_boundaries; i++) {
        hp_boundary *b = &p->boundaries[i];
        if (b->ep_size) continue;
        for (int k = 0; k < b->n_params; k++)
            if (b->params[k].pl.ax[HP_AXIS_EP].kind == HP_PL_S) {
                b->ep_size = (int)p->ep;
                marked = true;
                break;
            }
    }
    return marked ? hp__validate_ep_extend(p, err) : HP_OK;
}

/* §7.4 user: tp_divide_attrs from overrides: plain int hyperparameters, disjoint from auto, divisible. */
static hp_status user_attrs(hp_plan *p, hp_boundary *b, hp_err *err)
{
    static const char *const reserved[] = {"head_dim", "attention_head_size", "head_size", "num_key_value_groups",
                                           "training", "dtype", "device"};
    for (int i = 0; i < b->n_user_attrs; i++) {
        const char *a = b->user_attrs[i];
        bool bad = strncmp(a, "_hp_", 4) == 0;
        for (size_t r = 0; r < sizeof reserved / sizeof *reserved; r++) bad |= strcmp(a, reserved[r]) == 0;
        if (bad)
            return hp_err_set(err, HP_ERR_INPUT, "boundary '%s': tp_divide_attrs may not name '%s' (reserved: "
                              "head_dim and per-head sizes stay global)", b->fqn, a);
        for (int k = 0; k < b->n_tp_attrs; k++)
            if (!strcmp(b->tp_attrs[k].name, a))
                return hp_err_set(err, HP_ERR_INPUT,
                                  "boundary '%s': tp_divide_attrs names '%s', which the planner already divides "
                                  "(D-17 head counts); remove it from tp_divide_attrs",
                                  b->fqn, a);
        int64_t v;
        if (!hp_model_config_int(p->model, a, &v))
            return hp_err_set(err, HP_ERR_INPUT,
                              "boundary '%s': tp_divide_attrs names '%s', which is not a plain int hyperparameter of "
                              "this model (config.json integer field)", b->fqn, a);
        if (p->tp > 1 && v % p->tp)
            return hp_err_set(err, HP_ERR_INPUT, "boundary '%s': %s=%lld is incompatible with tp_size=%lld (not "
                              "divisible)", b->fqn, a, (long long)v, (long long)p->tp);
        hp_tp_attr *t = hp_arena_alloc(&p->arena, (size_t)(b->n_tp_attrs + 1) * sizeof *t);
        if (!t) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        if (b->n_tp_attrs) memcpy(t, b->tp_attrs, (size_t)b->n_tp_attrs * sizeof *t);
        t[b->n_tp_attrs].name = a;
        t[b->n_tp_attrs].global = v;
        t[b->n_tp_attrs].local = p->tp > 1 ? v / p->tp : v;
        t[b->n_tp_attrs].user = true;
        b->tp_attrs = t;
        b->n_tp_attrs++;
    }
    return HP_OK;
}

/* §7.4 auto: attention boundaries whose q/k/v weight is tp S(0) run with head counts divided by tp. */
static hp_status auto_attrs(hp_plan *p, hp_boundary *b, const hp_model_config *c, bool warn, hp_err *err)
{
    static const char *const head_weights[] = {"q_proj.weight", "q_b_proj.weight", "k_proj.weight",
                                               "v_proj.weight", "qkv_proj.weight", "linear_qkv.weight",
                                               "qkv.weight"};
    bool head_sharded = false;
    for (int k = 0; k < b->n_params && !head_sharded; k++) {
        const hp_placement tp = b->params[k].pl.ax[HP_AXIS_TP];
        if (tp.kind != HP_PL_S || tp.dim != 0) continue;
        for (size_t h = 0; h < sizeof head_weights / sizeof *head_weights; h++) {
            const char *rel = b->params[k].rel;
            size_t lr = strlen(rel), lh = strlen(head_weights[h]);
            if (lr >= lh && strcmp(rel + lr - lh, head_weights[h]) == 0 &&
                (lr == lh || rel[lr - lh - 1] == '.'))
                head_sharded = true;
        }
    }
    if (!head_sharded) return HP_OK;
    const char *names[2] = {"num_attention_heads", "num_key_value_heads"};
    const int64_t vals[2] = {c->num_attention_heads, c->num_key_value_heads};
    b->tp_attrs = hp_arena_alloc(&p->arena, 2 * sizeof *b->tp_attrs);
    if (!b->tp_attrs) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    for (int a = 0; a < 2; a++) {
        if (vals[a] <= 0) continue;
        if (vals[a] % p->tp != 0) {
            if (warn)
                hp__plan_warn(p, "%s: %s=%lld is not divisible by tp=%lld; left unchanged", b->fqn, names[a],
                          (long long)vals[a], (long long)p->tp);
            continue;
        }
        hp_tp_attr *t = &b->tp_attrs[b->n_tp_attrs++];
        t->name = names[a];
        t->global = vals[a];
        t->local = vals[a] / p->tp;
    }
    return HP_OK;
}

/* §7.4: the TP-local attribute plan of every boundary. */
static hp_status tp_local_attrs(hp_plan *p, hp_err *err)
{
    const hp_model_config *c = &p->model->cfg;
    for (size_t i = 0; i < p->n_boundaries; i++) {
        hp_boundary *b = &p->boundaries[i];
        hp_status st = HP_OK;
        if (hp__plan_has_dim(p, HP_AXIS_TP)) st = auto_attrs(p, b, c, true, err);
        if (st == HP_OK) st = user_attrs(p, b, err);
        if (st != HP_OK) return st;
    }
    return HP_OK;
}


/* §7.5 (D-22): a row-wise Linear's bias under a Partial output is added once, after the reduction. */
static hp_status deferred_of(hp_plan *p, hp_boundary *b, hp_err *err)
{
    const hp_model *m = p->model;
    b->n_deferred = 0;
    if (!b->is_boundary || b->module < 0) return HP_OK;
    int n_partial = 0;
    if (!b->out_src.is_null)
        for (int k = 0; k < b->out_src.n; k++) n_partial += b->out_src.e[k].pl.ax[HP_AXIS_TP].kind == HP_PL_P;
    size_t skip = b->fqn[0] ? strlen(b->fqn) + 1 : 0;
    const hp_module *mod = &m->modules[b->module];
    for (int q = mod->subtree_first; q < mod->subtree_end; q++) {
        const char *rel = m->params[q].name + skip;
        if (strcmp(rel, "bias") != 0 && !ends_with(rel, ".bias")) continue;
        char weight[1024];
        size_t owner_len = strlen(rel) - 4; /* keeps the dot */
        snprintf(weight, sizeof weight, "%.*sweight", (int)owner_len, rel);
        hp_param_spec *ws = find_spec_param(b, weight);
        if (!ws) continue;
        hp_placement wt = ws->pl.ax[HP_AXIS_TP];
        if (wt.kind != HP_PL_S && wt.kind != HP_PL_S2) continue;
        char wfull[1024];
        const hp_param *wp = hp_model_find_param(m, full_name(b, weight, wfull, sizeof wfull));
        if (!wp) continue;
        int wdim = wt.dim < 0 ? wt.dim + wp->n_dims : wt.dim;
        hp_param_spec *bs = find_spec_param(b, rel);
        if (wdim == wp->n_dims - 1) {
            if (n_partial == 0) continue;
            if (b->out_src.n > 1)
                return hp_err_set(err, HP_ERR_INPUT,
                                  "boundary '%s': deferred row-wise bias '%s' only supports single-output "
                                  "boundaries (out_src has %d outputs)",
                                  b->fqn, rel, b->out_src.n);
            if (bs && bs->pl.ax[HP_AXIS_TP].kind != HP_PL_R && bs->pl.ax[HP_AXIS_TP].kind != HP_PL_ABSENT)
                return hp_err_set(err, HP_ERR_INPUT,
                                  "boundary '%s': bias '%s' of a row-wise sharded weight must be declared "
                                  "Replicate on tp (it is added once after the reduction)",
                                  b->fqn, rel);
            if (wp->n_dims != 2) {
                hp__plan_warn(p, "%s: owner of '%s' is not nn.Linear-shaped; bias not deferred", b->fqn, rel);
                continue;
            }
            if (!b->deferred_biases) {
                b->deferred_biases = hp_arena_alloc(&p->arena, 8 * sizeof *b->deferred_biases);
                if (!b->deferred_biases) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
            }
            if (b->n_deferred < 8) b->deferred_biases[b->n_deferred++] = rel;
        } else {
            bool ok = bs && (bs->pl.ax[HP_AXIS_TP].kind == HP_PL_S || bs->pl.ax[HP_AXIS_TP].kind == HP_PL_S2);
            if (ok) {
                int bd = bs->pl.ax[HP_AXIS_TP].dim;
                ok = (bd < 0 ? bd + m->params[q].n_dims : bd) == (wdim == 0 ? 0 : wdim);
            }
            if (!ok)
                return hp_err_set(err, HP_ERR_INPUT,
                                  "boundary '%s': bias '%s' is not sharded like its column-sharded weight "
                                  "'%s' (template mismatch); declare the bias Shard(%d) or classify it with "
                                  "its weight",
                                  b->fqn, rel, weight, wdim);
        }
    }
    return HP_OK;
}

static hp_status deferred_biases(hp_plan *p, hp_err *err)
{
    if (!hp__plan_has_dim(p, HP_AXIS_TP)) return HP_OK;
    for (size_t i = 0; i < p->n_boundaries; i++) {
        hp_status st = deferred_of(p, &p->boundaries[i], err);
        if (st != HP_OK) return st;
    }
    return HP_OK;
}

/* gpt-oss: the down bias of row-split experts is added once, after the reduction, like a Linear's. */
static hp_status deferred_expert_of(hp_plan *p, hp_boundary *b, hp_err *err)
{
    hp_param_spec *w = find_spec_param(b, "experts.down_proj"), *bias = find_spec_param(b, "experts.down_proj_bias");
    if (!w || !bias || w->pl.ax[HP_AXIS_TP].kind != HP_PL_S || b->ep_size) return HP_OK;
    const char **d = hp_arena_alloc(&p->arena, (size_t)(b->n_deferred + 1) * sizeof *d);
    if (!d) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    if (b->n_deferred) memcpy(d, b->deferred_biases, (size_t)b->n_deferred * sizeof *d);
    d[b->n_deferred++] = bias->rel;
    b->deferred_biases = d;
    return HP_OK;
}

static hp_status deferred_expert_bias(hp_plan *p, hp_err *err)
{
    if (!hp__plan_has_dim(p, HP_AXIS_TP) || !hp_family_experts_transposed(p->model->family)) return HP_OK;
    for (size_t i = 0; i < p->n_boundaries; i++) {
        hp_status st = deferred_expert_of(p, &p->boundaries[i], err);
        if (st != HP_OK) return st;
    }
    return HP_OK;
}

hp_status hp__boundary_finals(hp_plan *p, const hp_boundary *b, hp_boundary *out, hp_err *err)
{
    *out = *b;
    out->n_tp_attrs = 0;
    out->tp_attrs = NULL;
    out->n_deferred = 0;
    out->deferred_biases = NULL;
    out->n_user_attrs = 0;
    out->user_attrs = b->n_tp_attrs ? hp_arena_alloc(&p->arena, (size_t)b->n_tp_attrs * sizeof *out->user_attrs) : NULL;
    if (b->n_tp_attrs && !out->user_attrs) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < b->n_tp_attrs; i++)
        if (b->tp_attrs[i].user) out->user_attrs[out->n_user_attrs++] = b->tp_attrs[i].name;
    if (out->module < 0) out->module = hp_model_find_module(p->model, b->fqn);
    const bool tp = hp__plan_has_dim(p, HP_AXIS_TP);
    hp_status st = tp ? auto_attrs(p, out, &p->model->cfg, false, err) : HP_OK;
    if (st == HP_OK) st = user_attrs(p, out, err);
    if (st == HP_OK && tp) st = deferred_of(p, out, err);
    if (st == HP_OK && tp && hp_family_experts_transposed(p->model->family)) st = deferred_expert_of(p, out, err);
    return st;
}

/* Dense fused gate/up: mlp.gate_up_proj.weight; fused experts: experts[.<e>].gate_up_proj[.weight] ... */
static bool is_fused_gate_up(const char *rel, bool *expert)
{
    static const char *const fused[] = {"gate_up_proj", "gate_and_up_projs", "fused_gate_up", "w13"};
    const char *s = rel;
    *expert = strncmp(s, "experts.", 8) == 0;
    if (*expert) {
        s += 8;
        while (isdigit((unsigned char)*s)) s++;
        if (*s == '.') s++;
    } else {
        const char *last = strrchr(rel, '.');
        if (!last || strcmp(last, ".weight") != 0) return false;
        const char *prev = last;
        while (prev > rel && prev[-1] != '.') prev--;
        for (size_t i = 0; i < sizeof fused / sizeof *fused; i++)
            if ((size_t)(last - prev) == strlen(fused[i]) && strncmp(prev, fused[i], (size_t)(last - prev)) == 0)
                return true;
        return false;
    }
    for (size_t i = 0; i < sizeof fused / sizeof *fused; i++) {
        size_t n = strlen(fused[i]);
        if (strncmp(s, fused[i], n) == 0 && (s[n] == '\0' || strcmp(s + n, ".weight") == 0)) return true;
    }
    return false;
}

/* §7.6 plus the packed extension: a contiguous tp split of [gate; up] gives rank 0 only gate rows. */
static hp_status fused_guard(hp_plan *p, bool packed, hp_err *err)
{
    /* Interleaved gate/up (gpt-oss) splits contiguously into whole (gate_j, up_j) pairs: nothing to guard. */
    if (p->tp <= 1 || hp_family_experts_transposed(p->model->family)) return HP_OK;
    hp_buf offenders;
    hp_buf_init(&offenders);
    int n_off = 0;
    for (size_t i = 0; i < p->n_boundaries; i++) {
        hp_boundary *b = &p->boundaries[i];
        if (b->ep_size) continue;
        for (int k = 0; k < b->n_params; k++) {
            hp_placement *tp = &b->params[k].pl.ax[HP_AXIS_TP];
            bool expert;
            if (tp->kind != HP_PL_S || !is_fused_gate_up(b->params[k].rel, &expert)) continue;
            if (packed) {
                tp->kind = HP_PL_S2;
                continue;
            }
            if (n_off < 8) hp_buf_printf(&offenders, "%s'%s%s%s'", n_off ? ", " : "", b->fqn, b->fqn[0] ? "." : "",
                                         b->params[k].rel);
            n_off++;
        }
    }
    hp_status st = HP_OK;
    if (n_off)
        st = hp_err_set(err, HP_ERR_INPUT,
                        "%d fused gate/up weight(s) would be split contiguously over tp=%lld, giving some ranks "
                        "only gate rows and others only up rows: %s. Remedies: pass --packed-fused (each rank keeps "
                        "[gate_r; up_r], written S(d)x2); or use expert parallelism (--ep, D-10); or override the "
                        "fused weight and out_src to tp Replicate",
                        n_off, (long long)p->tp, offenders.data ? offenders.data : "");
    hp_buf_free(&offenders);
    return st;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* §8.1, §8.2. */
static hp_status declaration_and_uniqueness(hp_plan *p, hp_err *err)
{
    size_t total = 0;
    for (size_t i = 0; i < p->n_boundaries; i++) {
        const hp_boundary *b = &p->boundaries[i];
        if (b->in_dst.n > 0 && b->in_src.n == 0)
            return hp_err_set(err, HP_ERR_INPUT,
                              "boundary '%s' declares in_dst but an empty in_src; declare in_src (the layout the "
                              "input arrives with) too",
                              b->fqn);
        total += (size_t)b->n_params;
    }
    char **names = calloc(total ? total : 1, sizeof *names);
    const char **owner = calloc(total ? total : 1, sizeof *owner);
    if (!names || !owner) {
        free(names);
        free(owner);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    }
    size_t n = 0;
    for (size_t i = 0; i < p->n_boundaries; i++)
        for (int k = 0; k < p->boundaries[i].n_params; k++) {
            const hp_boundary *b = &p->boundaries[i];
            names[n] = hp_arena_printf(&p->arena, "%s%s%s\x1f%s", b->fqn, b->fqn[0] ? "." : "", b->params[k].rel,
                                       b->fqn);
            if (!names[n]) {
                free(names);
                free(owner);
                return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
            }
            n++;
        }
    qsort(names, n, sizeof *names, cmp_str);
    hp_status st = HP_OK;
    for (size_t i = 1; i < n && st == HP_OK; i++) {
        size_t la = strcspn(names[i - 1], "\x1f"), lb = strcspn(names[i], "\x1f");
        if (la == lb && strncmp(names[i - 1], names[i], la) == 0)
            st = hp_err_set(err, HP_ERR_INPUT,
                            "param '%.*s' is declared by two boundaries: '%s' and '%s' — each parameter must be "
                            "sharded by exactly one boundary",
                            (int)la, names[i - 1], names[i - 1] + la + 1, names[i] + lb + 1);
    }
    free(names);
    free(owner);
    return st;
}

/* §8.3: boundaries are kept in registration order; the last real boundary is terminal. */
static void terminal(hp_plan *p)
{
    for (size_t i = 0; i < p->n_boundaries; i++) p->boundaries[i].terminal = false;
    for (size_t i = p->n_boundaries; i-- > 0;)
        if (p->boundaries[i].is_boundary) {
            p->boundaries[i].terminal = true;
            break;
        }
}

static hp_status special_handlers(hp_plan *p, hp_err *err)
{
    const hp_model *m = p->model;
    int n = 0;
    for (size_t i = 0; i < m->n_params; i++) n += p->roles[i] == HP_ROLE_SPECIAL;
    if (!n) return HP_OK;
    p->special = hp_arena_alloc(&p->arena, (size_t)n * sizeof *p->special);
    if (!p->special) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < m->n_params; i++)
        if (p->roles[i] == HP_ROLE_SPECIAL) {
            p->special[p->n_special].param = m->params[i].name;
            p->special[p->n_special++].handler = hp__special_handler(m->params[i].name);
        }
    return HP_OK;
}

/* §8.5 F4a. */
static hp_status divisibility(hp_plan *p, hp_err *err)
{
    for (size_t i = 0; i < p->n_boundaries; i++) {
        const hp_boundary *b = &p->boundaries[i];
        for (int k = 0; k < b->n_params; k++) {
            int ndim;
            int64_t shape[HP_MAX_DIMS + 1];
            if (!hp__param_shape(p, b, b->params[k].rel, &ndim, shape)) continue;
            for (int a = 0; a < HP_AXIS_COUNT; a++) {
                hp_placement pl = b->params[k].pl.ax[a];
                if (pl.kind != HP_PL_S && pl.kind != HP_PL_S2) continue;
                int64_t size = a == HP_AXIS_TP ? p->tp : a == HP_AXIS_CP ? p->cp : (b->ep_size ? b->ep_size : p->ep);
                if (size <= 1) continue;
                int dim = pl.dim < 0 ? pl.dim + ndim : pl.dim;
                char full[1024];
                if (dim < 0 || dim >= ndim)
                    return hp_err_set(err, HP_ERR_INPUT, "param '%s': Shard dim %d is out of range for a %d-d tensor",
                                      full_name(b, b->params[k].rel, full, sizeof full), pl.dim, ndim);
                int64_t parts = pl.kind == HP_PL_S2 ? 2 * size : size;
                if (shape[dim] % parts != 0) {
                    full_name(b, b->params[k].rel, full, sizeof full); /* before role_of reads it */
                    return hp_err_set(err, HP_ERR_INPUT,
                                      "param '%s' (role %s): dim %d of size %lld is not divisible by %s size %lld%s; "
                                      "check the parameter's classification or choose a mesh that divides it",
                                      full, hp_role_name(role_of(p, full)),
                                      dim, (long long)shape[dim], hp_axis_name((hp_axis)a), (long long)size,
                                      pl.kind == HP_PL_S2 ? " (x2, packed halves)" : "");
                }
            }
        }
    }
    return HP_OK;
}

/* §8.6 F4b: every trainable parameter is declared, stacked, or specially handled. */
static hp_status coverage(hp_plan *p, const hp_plan_opts *o, hp_err *err)
{
    const hp_model *m = p->model;
    char *covered = calloc(m->n_params ? m->n_params : 1, 1);
    if (!covered) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    char full[1024];
    for (size_t i = 0; i < p->n_boundaries; i++) {
        const hp_boundary *b = &p->boundaries[i];
        for (int k = 0; k < b->n_params; k++) {
            const hp_param *par = b->params[k].param1 > 0
                                      ? &m->params[b->params[k].param1 - 1]
                                      : hp_model_find_param(m, full_name(b, b->params[k].rel, full, sizeof full));
            if (par) covered[par - m->params] = 1;
        }
        for (int s = 0; s < b->n_ep_stack; s++) {
            const hp_ep_stack *es = &b->ep_stack[s];
            for (int k = 0; k < es->n_src; k++) {
                const hp_param *par = es->src_param1 && es->src_param1[k] > 0
                                          ? &m->params[es->src_param1[k] - 1]
                                          : hp_model_find_param(m, full_name(b, es->src[k], full, sizeof full));
                if (par) covered[par - m->params] = 1;
            }
        }
    }
    for (size_t i = 0; i < m->n_params; i++)
        if (p->roles[i] == HP_ROLE_SPECIAL) covered[i] = 1;
    hp_buf list;
    hp_buf_init(&list);
    size_t n = 0;
    for (size_t i = 0; i < m->n_params; i++) {
        if (covered[i] || !m->params[i].trainable) continue;
        if (n < 20) { /* one name a line: escaped, so that a name can neither drive the terminal nor add lines */
            hp_buf_puts(&list, "\n  ");
            hp_buf_escape(&list, m->params[i].name, 0);
            hp_buf_printf(&list, " (role %s)", hp_role_name(p->roles[i]));
        }
        n++;
    }
    free(covered);
    hp_status st = HP_OK;
    if (n) {
        char msg[HP_ERR_MSG_MAX];
        snprintf(msg, sizeof msg,
                 "plan-time coverage check failed: %zu trainable parameter(s) are not declared by any boundary%s%s\n"
                 "Declare them with an override, freeze them (--freeze GLOB), or accept replicated, unsharded "
                 "handling with --allow-uncovered (allow_uncovered_params)",
                 n, list.data ? list.data : "", n > 20 ? "\n  ..." : "");
        if (o->allow_uncovered) hp__plan_warn(p, "%s", msg);
        else st = hp_err_set(err, HP_ERR_INPUT, "%s", msg);
    }
    hp_buf_free(&list);
    return st;
}

static void tied_pairs(hp_plan *p)
{
    if (!p->model->cfg.tie_word_embeddings) return;
    const char *embed = NULL, *head = NULL;
    for (size_t i = 0; i < p->model->n_params; i++) {
        if (ends_with(p->model->params[i].name, "embed_tokens.weight")) embed = p->model->params[i].name;
        if (ends_with(p->model->params[i].name, "lm_head.weight")) head = p->model->params[i].name;
    }
    /* Hub checkpoints of tied models omit lm_head.weight; the pair is still tied at load time. */
    if (embed) {
        p->tied[0][0] = embed;
        p->tied[0][1] = head ? head : "lm_head.weight";
        p->n_tied = 1;
    }
}

/* A MoE block under tp > 1 without sequence parallelism takes every token's whole hidden state on each tp rank:
 * unless its experts are themselves sharded over tp, every tp rank routes and runs the experts of every token
 * (the expert FLOPs and the token exchange are tp times those with sequence parallelism). Megatron-LM refuses
 * this combination; the plan runs, so it is a warning, given once for the first such block. */
static void moe_without_sp(hp_plan *p)
{
    if (p->tp <= 1 || p->sequence_parallel || !p->roles) return;
    const hp_model *m = p->model;
    for (size_t i = 0; i < p->n_boundaries; i++) {
        const hp_boundary *b = &p->boundaries[i];
        bool experts = false, on_tp = false;
        for (int k = 0; k < b->n_params; k++) {
            char full[1024];
            const hp_param *par = hp_model_find_param(m, full_name(b, b->params[k].rel, full, sizeof full));
            bool ex = !par || p->roles[par - m->params] == HP_ROLE_MOE_EXPERT; /* a stacked name is experts */
            if (par && !ex) continue;
            if (!par && b->n_ep_stack == 0) continue;
            experts = true;
            hp_placement t = b->params[k].pl.ax[HP_AXIS_TP];
            if (t.kind == HP_PL_S || t.kind == HP_PL_S2) on_tp = true;
        }
        if (!experts || on_tp) continue;
        hp__plan_warn(p, "%s: a MoE block with tp=%lld and sequence parallelism off: every tp rank routes and runs "
                      "the experts of every token (expert FLOPs and the token exchange x%lld); drop "
                      "--no-sequence-parallel", b->fqn, (long long)p->tp, (long long)p->tp);
        return;
    }
}

hp_status hp__finalize(hp_plan *p, const hp_plan_opts *o, hp_err *err)
{
    hp_status st;
    if ((st = virtual_ep(p, err)) || (st = tp_local_attrs(p, err)) || (st = deferred_biases(p, err)) || (st = deferred_expert_bias(p, err)) ||
        (st = fused_guard(p, o->packed_fused, err)) || (st = declaration_and_uniqueness(p, err)))
        return st;
    terminal(p);
    if ((st = special_handlers(p, err)) || (st = divisibility(p, err))) return st;
    if (o->derive && (st = coverage(p, o, err))) return st;
    tied_pairs(p);
    moe_without_sp(p);
    return HP_OK;
}
