/*
 * hf.c — the plan as a transformers TP/EP plan for one transformers release: the config dictionaries
 * (`base_model_tp_plan` / `base_model_ep_plan` of a config, `_tp_plan` of the CausalLM class; spec
 * hf_reference.md §2) and, from 5.19 on, the `DistributedConfig` arguments that apply the plan at
 * `from_pretrained`. docs/plan-format.md, section "Transformers plan export", is the reference.
 *
 *   {
 *     "format": "hyperpar-hf-tp-plan", "version": 2, "transformers_version": "5.25.0",
 *     "base_model_tp_plan": {"layers.*.self_attn.q_proj": "colwise", ...},
 *     "lm_head": {"lm_head": "colwise_gather_output"},            (omitted when lm_head has no key)
 *     "base_model_ep_plan": {"layers.*.mlp.experts.gate_up_proj": "grouped_gemm", ...},
 *                                                                  (only when experts are EP-marked)
 *     "distributed_config": {"tp_size": 2, "tp_plan": {"model.layers.*.self_attn.q_proj": "colwise", ...,
 *                            "lm_head": "..."}, "ep_size": 2, "ep_plan": {...}},   (target >= 5.19)
 *     "unmapped": ["..."],                                         (only when some shard has no style)
 *     "notes": ["..."]                                             (what the target runs differently)
 *   }
 *
 * How: every declared parameter (boundary FQN + relative path) gets a style from its role, boundary type,
 * tp placement and rank (hf_style below, in the names of the newest registry); target_style then keeps it
 * when the target release has it, swaps in a style of the target that does the same, or lists the
 * parameter under "unmapped" (hf_registry.c says which release has which name). The key is its module path
 * (the parameter name without ".weight"; a batched or stacked expert tensor keeps its own name, as
 * transformers' keys do), with the base-model prefix ("model.") stripped in the config dictionaries and
 * kept in distributed_config, whose keys transformers checks against the model's own module names. Bias
 * parameters get no key: transformers gives a bias the style of its owner module. Then keys are
 * generalised (every all-digit path component becomes "*", as transformers' lookup does) and
 * deduplicated: a pattern takes the style most of its concrete keys have (first appearance breaks ties),
 * and the keys that disagree stay with their concrete indices. Order: first appearance, boundaries in
 * forward order.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "plan/planner.h"

enum { PLAN_TP = 0, PLAN_EP, PLAN_LM, PLAN_COUNT };
static const char *const plan_keys[PLAN_COUNT] = {"base_model_tp_plan", "base_model_ep_plan", "lm_head"};

typedef struct entry {
    const char *key;     /* concrete module path, base prefix stripped: layers.3.self_attn.q_proj */
    const char *generic; /* layers.*.self_attn.q_proj */
    const char *prefix;  /* the stripped base-model prefix ("model.") or "" */
    const char *style;   /* a style string of the target's registry */
    int plan;
} entry;

#define MAX_GROUP_STYLES 8
typedef struct group {
    int n;
    const char *style[MAX_GROUP_STYLES];
    int count[MAX_GROUP_STYLES];
} group;

typedef struct hf_ctx {
    const hp_plan *p;
    const hp__hf_target *t;
    hp_arena arena;
    entry *e;
    size_t n, cap;
    json_t *unmapped;
    json_t *notes; /* what the target runs differently without changing a number */
    bool tp_active;
    bool dc; /* the target takes DistributedConfig(tp_plan=, ep_plan=) overrides (>= 5.19) */
    bool ok;
} hf_ctx;

/* Appends one line to "unmapped" unless the same line is there already (one line per pattern). */
static void note(hf_ctx *c, const char *msg)
{
    size_t i;
    json_t *v;
    json_array_foreach(c->unmapped, i, v) if (strcmp(json_string_value(v), msg) == 0) return;
    if (json_array_append_new(c->unmapped, json_string(msg)) != 0) c->ok = false;
}

/* key with each dotted component made only of digits written as "*" (arena-owned). */
static const char *generalise(hf_ctx *c, const char *key)
{
    size_t len = strlen(key);
    char *g = hp_arena_alloc(&c->arena, len + 1), *w = g;
    for (const char *s = key; *s;) {
        const char *end = strchr(s, '.');
        size_t n = end ? (size_t)(end - s) : strlen(s);
        bool digits = n > 0;
        for (size_t i = 0; i < n; i++) digits &= s[i] >= '0' && s[i] <= '9';
        if (digits) *w++ = '*';
        else memcpy(w, s, n), w += n;
        s += n;
        if (*s == '.') *w++ = *s++;
    }
    *w = '\0';
    return g;
}

static void add_entry(hf_ctx *c, const char *key, const char *prefix, const char *style, int plan)
{
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 256;
        entry *e = realloc(c->e, cap * sizeof *e);
        if (!e) {
            c->ok = false;
            return;
        }
        c->e = e, c->cap = cap;
    }
    c->e[c->n++] = (entry){.key = key, .generic = generalise(c, key), .prefix = prefix, .style = style, .plan = plan};
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* The module path a parameter's style is keyed by, base prefix stripped (lm_head keeps its name); *prefix
 * is what was stripped. */
static const char *param_key(hf_ctx *c, const char *full, bool lm_head, const char **prefix)
{
    static const char *const prefixes[] = {"model.", "transformer.", "gpt_neox."};
    const char *s = full;
    *prefix = "";
    for (size_t i = 0; !lm_head && i < sizeof prefixes / sizeof *prefixes; i++)
        if (strncmp(s, prefixes[i], strlen(prefixes[i])) == 0) {
            s += strlen(prefixes[i]);
            *prefix = prefixes[i];
            break;
        }
    size_t n = strlen(s);
    if (ends_with(s, ".weight")) n -= strlen(".weight");
    return hp_arena_strndup(&c->arena, s, n);
}

/* The parameter's role and rank (ndim), looked up in the model; stacked EP names (not model parameters)
 * take the rank of their first source plus one (*stacked: such a name, hyperpar's stack of per-expert tensors).
 * Defaults: role HP_ROLE_COUNT (unknown; MOE_EXPERT for stacked names), rank 2 (spec §6.3). */
static void param_info(hf_ctx *c, const hp_boundary *b, const hp_param_spec *ps, const char *full, hp_role *role,
                       int *ndim, bool *stacked)
{
    const hp_plan *p = c->p;
    *role = HP_ROLE_COUNT, *ndim = 2, *stacked = false;
    const hp_param *mp = p->model ? hp_model_find_param(p->model, full) : NULL;
    if (mp) {
        *ndim = mp->n_dims;
        if (p->roles) *role = p->roles[mp - p->model->params];
        return;
    }
    for (int i = 0; i < b->n_ep_stack; i++) {
        if (strcmp(b->ep_stack[i].name, ps->rel) != 0) continue;
        *role = HP_ROLE_MOE_EXPERT;
        *stacked = true;
        if (p->model && b->ep_stack[i].n_src > 0) {
            const char *fqn = b->fqn ? b->fqn : "";
            char *src = hp_arena_printf(&c->arena, "%s%s%s", fqn, *fqn ? "." : "",
                                        b->ep_stack[i].src[0]);
            const hp_param *sp = hp_model_find_param(p->model, src);
            *ndim = sp ? sp->n_dims + 1 : 3;
        } else {
            *ndim = 3;
        }
    }
}

/* Whether the module owning parameter full ("....q_norm.weight") is named leaf. */
static bool owner_leaf_is(const char *full, const char *leaf)
{
    const char *last = strrchr(full, '.');
    if (!last) return false;
    size_t k = strlen(leaf);
    if ((size_t)(last - full) < k || strncmp(last - k, leaf, k) != 0) return false;
    return last - k == full || *(last - k - 1) == '.';
}

static bool is_attention_nested(const hp_plan *p, const char *fqn)
{
    for (size_t i = 0; i < p->n_boundaries; i++) {
        const hp_boundary *a = &p->boundaries[i];
        if (a->type != HP_BT_ATTENTION && a->type != HP_BT_LINEAR_ATTENTION) continue;
        size_t n = a->fqn ? strlen(a->fqn) : 0;
        if (n && strncmp(fqn, a->fqn, n) == 0 && fqn[n] == '.') return true;
    }
    return false;
}

/* The tp style of one declared parameter (in the names of the newest registry), NULL when transformers would
 * leave it replicated. *unmapped is set when the parameter is sharded on tp but no style expresses it. */
static const char *hf_style(hf_ctx *c, const hp_boundary *b, const hp_param_spec *ps, const char *full,
                            hp_role role, int ndim, bool *unmapped)
{
    const hp_plan *p = c->p;
    hp_placement t = ps->pl.ax[HP_AXIS_TP];
    *unmapped = false;
    if (!c->tp_active) return NULL;
    if (t.kind != HP_PL_S && t.kind != HP_PL_S2) {
        if (role != HP_ROLE_NORM && b->type != HP_BT_NORM) return NULL;
        /* Per-head norms (qwen3 q_norm/k_norm) see head-sharded activations, so their weight gradients are
         * partial per TP rank: transformers' own qwen3 plans say "replicated_with_grad_allreduce". Other norms
         * inside attention (MLA q_a_layernorm) run on the gathered sequence and stay replicated; the rest run
         * sequence-sharded under SP. */
        if (owner_leaf_is(full, "q_norm") || owner_leaf_is(full, "k_norm")) return "replicated_with_grad_allreduce";
        if (is_attention_nested(p, full)) return NULL;
        return p->sequence_parallel ? "sequence_parallel" : NULL;
    }
    int d = t.dim < 0 ? t.dim + ndim : t.dim;
    bool row = d == ndim - 1, col = ndim >= 2 && d == ndim - 2;
    if (b->type == HP_BT_LM_HEAD || role == HP_ROLE_LM_HEAD) {
        if (col) return p->loss_parallel ? "colwise" : "colwise_gather_output";
        if (row) return "rowwise";
    } else if (role == HP_ROLE_EMBED || b->type == HP_BT_EMBED) {
        if (d == 0) return "embedding_rowwise";
        if (d == 1) return "embedding_colwise";
    } else if (t.kind == HP_PL_S2) {
        if (row) return "packed_rowwise";
        if (col) return "packed_colwise";
    } else {
        if (row) return "rowwise";
        if (col) return "colwise";
    }
    *unmapped = true;
    return NULL;
}

static bool is_bias(const char *rel) { return strcmp(rel, "bias") == 0 || ends_with(rel, ".bias"); }

/* A router parameter: MOE_GATE role or moe_gate boundary; without a role (no model), a module named
 * gate or router. */
static bool is_router(const hp_boundary *b, hp_role role, const char *full)
{
    if (role == HP_ROLE_MOE_GATE || b->type == HP_BT_MOE_GATE) return true;
    return role == HP_ROLE_COUNT && (owner_leaf_is(full, "gate") || owner_leaf_is(full, "router"));
}

/* The experts container of a stacked or batched expert key ("layers.0.mlp.experts.gate_up_proj" ->
 * "layers.0.mlp.experts"), or NULL (per-expert keys such as "...experts.0.gate_proj" have none). */
static const char *experts_container(hf_ctx *c, const char *key)
{
    const char *dot = strrchr(key, '.');
    if (!dot) return NULL;
    size_t n = (size_t)(dot - key);
    if (n < 7 || strncmp(dot - 7, "experts", 7) != 0 || (n > 7 && dot[-8] != '.')) return NULL;
    return hp_arena_strndup(&c->arena, key, n);
}

static bool boundary_ep_marked(const hp_boundary *b)
{
    if (b->ep_size > 0) return true;
    for (int i = 0; i < b->n_params; i++)
        if (b->params[i].pl.ax[HP_AXIS_EP].kind == HP_PL_S) return true;
    if (b->type == HP_BT_MOE_GATE && !b->out_dst.is_null)
        for (int i = 0; i < b->out_dst.n && i < HP_MAX_IO; i++)
            if (b->out_dst.e[i].pl.ax[HP_AXIS_EP].kind == HP_PL_S) return true;
    return false;
}

/* The style the target writes for want (a style of the newest registry): want itself when the target's
 * registry has it, else a style of the target that does the same (colwise_rep for colwise_gather_output:
 * both are ColwiseParallel with a replicated output), else NULL after listing the parameter (its generic
 * name) under "unmapped". */
static const char *target_style(hf_ctx *c, const char *want, const char *generic)
{
    int s = hp__hf_style_parse(want);
    HP_ASSERT(s >= 0);
    if (hp__hf_target_has(c->t, s)) return want;
    if (s == HP__HF_COLWISE_GATHER_OUTPUT && hp__hf_target_has(c->t, HP__HF_COLWISE_REP))
        return hp__hf_style_name(HP__HF_COLWISE_REP);
    note(c, hp_arena_printf(&c->arena, "%s: style '%s' is not in the registry of transformers %s, and no style of "
                                       "it does the same; left out (transformers would replicate it)",
                            generic, want, c->t->text));
    return NULL;
}

/* A per-expert key ("layers.*.mlp.experts.*.gate_proj"): transformers 5 holds a block's experts batched in one
 * module (experts.gate_up_proj, experts.down_proj) and converts per-expert checkpoints at load, so such a key
 * names no module of the model. */
static bool per_expert_key(const char *generic)
{
    for (const char *s = strstr(generic, "experts.*"); s; s = strstr(s + 1, "experts.*"))
        if ((s == generic || s[-1] == '.') && (s[9] == '.' || s[9] == '\0')) return true;
    return false;
}

/* Roles whose modules transformers' own plans shard (attention and MLP projections, embeddings, lm_head):
 * when hyperpar keeps one whole, a DistributedConfig override must say "replicate", since transformers
 * merges the override into the model's own plan instead of replacing it. */
static bool default_sharded_role(hp_role role)
{
    switch (role) {
    case HP_ROLE_COLWISE: case HP_ROLE_ROWWISE: case HP_ROLE_EMBED: case HP_ROLE_LM_HEAD:
    case HP_ROLE_SHARED_EXPERT: case HP_ROLE_FUSED_QKV: case HP_ROLE_FUSED_GATE_UP: return true;
    default: return false;
    }
}

/* One pass over the boundaries in forward order: TP and lm_head entries always, EP entries when some
 * boundary is EP-marked (any_ep). Up to 5.18 transformers' EP plan replaces its TP plan, so the EP plan
 * repeats the dense TP entries; from 5.19 the two apply side by side and the EP plan holds only the MoE
 * entries. In EP-marked boundaries the expert tensors become grouped_gemm; before 5.23 the router gets
 * ep_router and the experts container moe_tp_experts (router masking), from 5.23 the container gets
 * ep_dispatch_experts and the router no key. */
static void collect(hf_ctx *c, bool any_ep)
{
    const hp_plan *p = c->p;
    int era = c->t->era;
    bool note_sp = false;
    for (size_t bi = 0; bi < p->n_boundaries; bi++) {
        const hp_boundary *b = &p->boundaries[bi];
        bool ep = boundary_ep_marked(b);
        const char *tp_container = NULL, *ep_container = NULL, *tp_prefix = "", *ep_prefix = "";
        bool skip_ep_container = false;
        for (int i = 0; i < b->n_params; i++) {
            const hp_param_spec *ps = &b->params[i];
            if (is_bias(ps->rel)) continue;
            const char *full = b->fqn && *b->fqn ? hp_arena_printf(&c->arena, "%s.%s", b->fqn, ps->rel) : ps->rel;
            hp_role role;
            int ndim;
            bool stacked;
            param_info(c, b, ps, full, &role, &ndim, &stacked);
            bool lm = b->type == HP_BT_LM_HEAD || role == HP_ROLE_LM_HEAD;
            const char *prefix;
            const char *key = param_key(c, full, lm, &prefix);
            bool unmapped;
            const char *style = hf_style(c, b, ps, full, role, ndim, &unmapped);
            if (unmapped) {
                char buf[16];
                note(c, hp_arena_printf(&c->arena, "%s: tp %s of a %d-D tensor has no transformers style; left out "
                                                   "(transformers would replicate it)", full,
                                        hp_placement_str(ps->pl.ax[HP_AXIS_TP], buf, sizeof buf), ndim));
            }
            bool ep_param = any_ep && !lm && ep && ps->pl.ax[HP_AXIS_EP].kind == HP_PL_S;
            bool router = any_ep && !lm && ep && !ep_param && is_router(b, role, full);
            const char *generic = generalise(c, key);
            if (era != HP__HF_ERA_REPLACE && (style || ep_param) && (stacked || per_expert_key(generic))) {
                note(c, stacked ? hp_arena_printf(&c->arena, "%s: hyperpar's stack of per-expert tensors, which "
                                                             "transformers %s holds batched under its own names "
                                                             "(experts.gate_up_proj, experts.down_proj); left out "
                                                             "with its block (plan the batched layout to export it)",
                                                  generic, c->t->text)
                                : hp_arena_printf(&c->arena, "%s: a per-expert name; transformers %s holds each "
                                                             "block's experts batched (experts.gate_up_proj, "
                                                             "experts.down_proj), so no module has this name; left "
                                                             "out (plan the batched layout to export it)",
                                                  generic, c->t->text));
                /* Without its expert tensors the experts module must not be split either. */
                if (ep_param) skip_ep_container = true;
                continue;
            }
            if (style && era == HP__HF_ERA_DISPATCH && strcmp(style, "sequence_parallel") == 0) {
                /* transformers >= 5.23 runs tensor parallelism without sequence parallelism: its rowwise layers
                 * all-reduce to a replicated output (`enable_sequence_parallel` is "not wired up"), and a
                 * "sequence_parallel" norm then multiplies its DTensor weight with a plain tensor and fails
                 * (5.25: "aten.mul.Tensor got mixed torch.Tensor and DTensor"). The norm weight is replicated
                 * either way, so the norm gets no key and runs on the whole sequence: same numbers. */
                note_sp = true;
                style = NULL;
            }
            if (style) style = target_style(c, style, generic);
            const char *container = style ? experts_container(c, key) : NULL;
            if (style) {
                add_entry(c, key, prefix, style, lm ? PLAN_LM : PLAN_TP);
                if (!tp_container) tp_container = container, tp_prefix = prefix;
            } else if (c->dc && c->tp_active && !unmapped && !ep_param && default_sharded_role(role) &&
                       hp__hf_target_has(c->t, HP__HF_REPLICATE)) {
                add_entry(c, key, prefix, hp__hf_style_name(HP__HF_REPLICATE), lm ? PLAN_LM : PLAN_TP);
            }
            if (!any_ep || lm) continue;
            if (ep_param) {
                const char *gg = target_style(c, hp__hf_style_name(HP__HF_GROUPED_GEMM), generic);
                if (gg) add_entry(c, key, prefix, gg, PLAN_EP);
                if (!ep_container) ep_container = experts_container(c, key), ep_prefix = prefix;
            } else if (router) {
                if (era == HP__HF_ERA_DISPATCH) continue; /* the ep_dispatch_experts module routes by itself */
                /* The router module: gate.weight and gate.e_score_correction_bias both key "...gate". */
                const char *dot = strrchr(key, '.');
                bool module_key = ends_with(full, ".weight") || !dot;
                const char *rkey = module_key ? key : hp_arena_strndup(&c->arena, key, (size_t)(dot - key));
                const char *rs = target_style(c, hp__hf_style_name(HP__HF_EP_ROUTER), generalise(c, rkey));
                if (rs) add_entry(c, rkey, prefix, rs, PLAN_EP);
            } else if (style && era == HP__HF_ERA_REPLACE) {
                add_entry(c, key, prefix, style, PLAN_EP);
                if (!ep_container) ep_container = container, ep_prefix = prefix;
            }
        }
        if (tp_container) {
            const char *st = target_style(c, hp__hf_style_name(HP__HF_MOE_TP_EXPERTS), generalise(c, tp_container));
            if (st) add_entry(c, tp_container, tp_prefix, st, PLAN_TP);
        }
        if (ep_container && !skip_ep_container) {
            int want = era == HP__HF_ERA_DISPATCH ? HP__HF_EP_DISPATCH_EXPERTS : HP__HF_MOE_TP_EXPERTS;
            const char *st = target_style(c, hp__hf_style_name(want), generalise(c, ep_container));
            if (st) add_entry(c, ep_container, ep_prefix, st, PLAN_EP);
        }
    }
    if (note_sp && json_array_append_new(c->notes, json_string(hp_arena_printf(
                       &c->arena, "sequence parallelism: transformers %s has no sequence-parallel norms (its rowwise "
                                  "layers all-reduce to a replicated output), so the norms get no key and run on "
                                  "the whole sequence: the same numbers, more activation memory", c->t->text))) != 0)
        c->ok = false;
}

/* Generalises and deduplicates the entries of one plan into obj (see the file header); full: keys with their
 * base-model prefix (the DistributedConfig form). */
static void emit(hf_ctx *c, int plan, json_t *obj, bool full)
{
    json_t *index = json_object(); /* generic pattern -> group id */
    group *groups = calloc(c->n ? c->n : 1, sizeof *groups);
    size_t n_groups = 0;
    int *gid = calloc(c->n ? c->n : 1, sizeof *gid);
    if (!index || !groups || !gid) {
        c->ok = false;
        goto done;
    }
    for (size_t i = 0; i < c->n; i++) {
        if (c->e[i].plan != plan) continue;
        json_t *v = json_object_get(index, c->e[i].generic);
        if (!v) {
            v = json_integer((json_int_t)n_groups++);
            if (json_object_set_new(index, c->e[i].generic, v) != 0) {
                c->ok = false;
                goto done;
            }
        }
        group *g = &groups[gid[i] = (int)json_integer_value(v)];
        int k = 0;
        while (k < g->n && strcmp(g->style[k], c->e[i].style) != 0) k++;
        if (k == g->n && g->n < MAX_GROUP_STYLES) g->style[g->n++] = c->e[i].style;
        if (k < g->n) g->count[k]++;
    }
    for (size_t i = 0; i < c->n; i++) {
        if (c->e[i].plan != plan) continue;
        const group *g = &groups[gid[i]];
        int win = 0;
        for (int k = 1; k < g->n; k++)
            if (g->count[k] > g->count[win]) win = k;
        const char *key = strcmp(g->style[win], c->e[i].style) == 0 ? c->e[i].generic : c->e[i].key;
        if (full && *c->e[i].prefix) key = hp_arena_printf(&c->arena, "%s%s", c->e[i].prefix, key);
        if (json_object_get(obj, key)) continue;
        if (json_object_set_new(obj, key, json_string(c->e[i].style)) != 0) c->ok = false;
    }
done:
    json_decref(index);
    free(groups);
    free(gid);
}

/* The DistributedConfig arguments (>= 5.19): tp_size and tp_plan (the TP entries and lm_head, keys with their
 * base-model prefix), then the data-parallel sizes and, with EP, ep_size and ep_plan. transformers lays the
 * ranks out as pp x fsdp x tp == pp x efsdp x ep and wants ep_size to be a multiple of tp_size dividing
 * fsdp_size * tp_size (distributed/configuration_utils.py): so an EP group wider than tp (TP-extend-EP over dp,
 * or an explicit ep axis) spans ep/tp fsdp ranks, and hyperpar's remaining batch split becomes
 * dp_replicate_size. Sizes of 1 other than tp_size are left out. What the config cannot say goes to
 * "unmapped". */
static json_t *distributed_config(hf_ctx *c, bool any_ep)
{
    const hp_plan *p = c->p;
    int64_t tp = c->tp_active ? p->tp : 1, cp = p->cp > 1 ? p->cp : 1;
    int64_t world = hp_mesh_world(&p->mesh), ep = any_ep ? hp_plan_ep_size(p) : 1;
    int64_t batch = world / (tp * cp), fsdp = 1, rep = batch;
    bool with_ep = any_ep;
    if (cp > 1)
        note(c, hp_arena_printf(&c->arena, "cp=%lld: DistributedConfig has no context parallelism, so "
                                           "distributed_config leaves the cp axis out (launch world/cp ranks)",
                                (long long)cp));
    if (any_ep && ep % tp != 0) {
        note(c, hp_arena_printf(&c->arena, "ep=%lld is not a multiple of tp=%lld, which DistributedConfig requires "
                                           "of ep_size; distributed_config leaves expert parallelism out",
                                (long long)ep, (long long)tp));
        with_ep = false;
    } else if (any_ep && c->t->era == HP__HF_ERA_SEPARATE && ep != tp) {
        note(c, hp_arena_printf(&c->arena, "ep=%lld differs from tp=%lld: the router-masking expert parallelism "
                                           "of transformers %s (ep_router + moe_tp_experts) needs ep_size == "
                                           "tp_size; distributed_config leaves expert parallelism out (target "
                                           "5.23 or later for token dispatch)",
                                (long long)ep, (long long)tp, c->t->text));
        with_ep = false;
    } else if (any_ep && batch % (ep / tp) != 0) {
        note(c, hp_arena_printf(&c->arena, "ep=%lld over tp=%lld spans %lld of the %lld batch ranks unevenly; "
                                           "distributed_config leaves expert parallelism out",
                                (long long)ep, (long long)tp, (long long)(ep / tp), (long long)batch));
        with_ep = false;
    } else if (any_ep) {
        fsdp = ep / tp, rep = batch / fsdp;
    }
    json_t *dc = json_object(), *tp_plan = json_object(), *ep_plan = json_object();
    if (!dc || !tp_plan || !ep_plan) {
        c->ok = false;
        json_decref(tp_plan);
        json_decref(ep_plan);
        return dc;
    }
    emit(c, PLAN_TP, tp_plan, true);
    emit(c, PLAN_LM, tp_plan, true);
    emit(c, PLAN_EP, ep_plan, true);
    if (with_ep && json_object_size(ep_plan) == 0) { /* every EP entry unmapped: no EP rather than the model's own */
        with_ep = false, fsdp = 1, rep = batch;
    }
    int rc = json_object_set_new(dc, "tp_size", json_integer(tp));
    if (tp > 1) rc |= json_object_set(dc, "tp_plan", tp_plan);
    if (fsdp > 1) rc |= json_object_set_new(dc, "fsdp_size", json_integer(fsdp));
    if (rep > 1) rc |= json_object_set_new(dc, "dp_replicate_size", json_integer(rep));
    if (with_ep) {
        rc |= json_object_set_new(dc, "ep_size", json_integer(ep));
        rc |= json_object_set(dc, "ep_plan", ep_plan);
    }
    if (rc) c->ok = false;
    json_decref(tp_plan);
    json_decref(ep_plan);
    return dc;
}

hp_status hp_plan_to_hf(const hp_plan *p, hp_buf *out, hp_err *err) { return hp_plan_to_hf_target(p, NULL, out, err); }

/* Appends the transformers plan for release hf_version (docs/plan-format.md) to out. */
hp_status hp_plan_to_hf_target(const hp_plan *p, const char *hf_version, hp_buf *out, hp_err *err)
{
    HP_ASSERT(p && out);
    hp__hf_target target;
    hp_status st = hp__hf_target_init(&target, hf_version, err);
    if (st != HP_OK) return st;
    hf_ctx c = {.p = p, .t = &target, .ok = true, .dc = target.era != HP__HF_ERA_REPLACE};
    hp_arena_init(&c.arena);
    c.unmapped = json_array();
    c.notes = json_array();
    if (!c.unmapped || !c.notes) c.ok = false;
    c.tp_active = p->n_dims == 0 ? p->tp > 1 : false;
    for (int i = 0; i < p->n_dims; i++) c.tp_active |= p->dims[i] == HP_AXIS_TP;

    bool any_ep = false;
    for (size_t i = 0; i < p->n_boundaries; i++) any_ep |= boundary_ep_marked(&p->boundaries[i]);
    if (c.ok) collect(&c, any_ep);

    json_t *root = json_object(), *plans[PLAN_COUNT], *dc = NULL;
    for (int k = 0; k < PLAN_COUNT; k++) {
        plans[k] = json_object();
        if (!plans[k]) c.ok = false;
        else if (c.ok) emit(&c, k, plans[k], false);
    }
    if (c.ok && c.dc) dc = distributed_config(&c, any_ep);
    if (root && c.ok && (!c.dc || dc)) {
        int rc = json_object_set_new(root, "format", json_string("hyperpar-hf-tp-plan"));
        rc |= json_object_set_new(root, "version", json_integer(2));
        rc |= json_object_set_new(root, "transformers_version", json_string(target.text));
        rc |= json_object_set(root, plan_keys[PLAN_TP], plans[PLAN_TP]);
        if (json_object_size(plans[PLAN_LM])) rc |= json_object_set(root, plan_keys[PLAN_LM], plans[PLAN_LM]);
        if (any_ep) rc |= json_object_set(root, plan_keys[PLAN_EP], plans[PLAN_EP]);
        if (dc) rc |= json_object_set(root, "distributed_config", dc);
        if (json_array_size(c.unmapped)) rc |= json_object_set(root, "unmapped", c.unmapped);
        if (json_array_size(c.notes)) rc |= json_object_set(root, "notes", c.notes);
        if (rc) c.ok = false;
    } else {
        c.ok = false;
    }
    char *text = root && c.ok ? json_dumps(root, JSON_PRESERVE_ORDER | JSON_INDENT(2)) : NULL;
    for (int k = 0; k < PLAN_COUNT; k++) json_decref(plans[k]);
    json_decref(dc);
    json_decref(c.unmapped);
    json_decref(c.notes);
    json_decref(root);
    free(c.e);
    hp_arena_free(&c.arena);
    if (!text) return hp_err_set(err, HP_ERR_NOMEM, "transformers plan: out of memory while serialising the plan");
    hp_buf_puts(out, text);
    hp_buf_puts(out, "\n");
    free(text);
    if (out->oom) return hp_err_set(err, HP_ERR_NOMEM, "transformers plan: out of memory while writing the output");
    return HP_OK;
}
