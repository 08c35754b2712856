/*
 * hf.c — the plan as a transformers-style TP/EP plan (`base_model_tp_plan` / `base_model_ep_plan` of a
 * config, `_tp_plan` of the CausalLM class; spec hf_reference.md §2). docs/plan-format.md, section
 * "Transformers plan export", is the reference for the mapping.
 *
 *   {
 *     "format": "hyperpar-hf-tp-plan", "version": 1,
 *     "base_model_tp_plan": {"layers.*.self_attn.q_proj": "colwise", ...},
 *     "lm_head": {"lm_head": "colwise_gather_output"},            (omitted when lm_head is not sharded)
 *     "base_model_ep_plan": {..., "layers.*.mlp.experts.gate_up_proj": "grouped_gemm", ...},
 *                                                                  (only when experts are EP-marked)
 *     "unmapped": ["..."]                                          (only when some shard has no style)
 *   }
 *
 * How: every declared parameter (boundary FQN + relative path) gets a style from its role, boundary type,
 * tp placement and rank (hf_style below); the key is its module path (the parameter name without
 * ".weight"; a batched or stacked expert tensor keeps its own name, as transformers' keys do), with the
 * base-model prefix ("model.") stripped. Bias parameters get no key: transformers gives a bias the style of
 * its owner module. Then keys are generalised (every all-digit path component becomes "*", as transformers'
 * `_get_parameter_tp_plan` does before its lookup) and deduplicated: a pattern takes the style most of its
 * concrete keys have (first appearance breaks ties), and the keys that disagree stay with their concrete
 * indices. Order: first appearance, boundaries in forward order.
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
    const char *style;   /* a style string of the NEW registry (hf_reference §2.2) */
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
    hp_arena arena;
    entry *e;
    size_t n, cap;
    json_t *unmapped;
    bool tp_active, ok;
} hf_ctx;

static void add_entry(hf_ctx *c, const char *key, const char *style, int plan)
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
    /* The generic form: each dotted component made only of digits becomes "*". */
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
    c->e[c->n++] = (entry){.key = key, .generic = g, .style = style, .plan = plan};
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* The module path a parameter's style is keyed by, base prefix stripped (lm_head keeps its name). */
static const char *param_key(hf_ctx *c, const char *full, bool lm_head)
{
    static const char *const prefixes[] = {"model.", "transformer.", "gpt_neox."};
    const char *s = full;
    for (size_t i = 0; !lm_head && i < sizeof prefixes / sizeof *prefixes; i++)
        if (strncmp(s, prefixes[i], strlen(prefixes[i])) == 0) {
            s += strlen(prefixes[i]);
            break;
        }
    size_t n = strlen(s);
    if (ends_with(s, ".weight")) n -= strlen(".weight");
    return hp_arena_strndup(&c->arena, s, n);
}

/* The parameter's role and rank (ndim), looked up in the model; stacked EP names (not model parameters)
 * take the rank of their first source plus one. Defaults: role HP_ROLE_COUNT (unknown; MOE_EXPERT for
 * stacked names), rank 2 (spec §6.3). */
static void param_info(hf_ctx *c, const hp_boundary *b, const hp_param_spec *ps, const char *full, hp_role *role,
                       int *ndim)
{
    const hp_plan *p = c->p;
    *role = HP_ROLE_COUNT, *ndim = 2;
    const hp_param *mp = p->model ? hp_model_find_param(p->model, full) : NULL;
    if (mp) {
        *ndim = mp->n_dims;
        if (p->roles) *role = p->roles[mp - p->model->params];
        return;
    }
    for (int i = 0; i < b->n_ep_stack; i++) {
        if (strcmp(b->ep_stack[i].name, ps->rel) != 0) continue;
        *role = HP_ROLE_MOE_EXPERT;
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

/* The tp style of one declared parameter (hf_reference §2.2 NEW registry), NULL when transformers would
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

/* One pass over the boundaries in forward order: TP and lm_head entries always, EP entries when some
 * boundary is EP-marked (any_ep). transformers' EP plan replaces its TP plan (hf_reference §2.1), so the EP
 * plan repeats the dense TP entries; in EP-marked boundaries experts become grouped_gemm and the router
 * ep_router, and the experts container gets moe_tp_experts after them, as transformers' own EP plans do. */
static void collect(hf_ctx *c, bool any_ep)
{
    const hp_plan *p = c->p;
    for (size_t bi = 0; bi < p->n_boundaries; bi++) {
        const hp_boundary *b = &p->boundaries[bi];
        bool ep = boundary_ep_marked(b);
        const char *tp_container = NULL, *ep_container = NULL;
        for (int i = 0; i < b->n_params; i++) {
            const hp_param_spec *ps = &b->params[i];
            if (is_bias(ps->rel)) continue;
            const char *full = b->fqn && *b->fqn ? hp_arena_printf(&c->arena, "%s.%s", b->fqn, ps->rel) : ps->rel;
            hp_role role;
            int ndim;
            param_info(c, b, ps, full, &role, &ndim);
            bool lm = b->type == HP_BT_LM_HEAD || role == HP_ROLE_LM_HEAD;
            const char *key = param_key(c, full, lm);
            bool unmapped;
            const char *style = hf_style(c, b, ps, full, role, ndim, &unmapped);
            if (unmapped) {
                char buf[16];
                const char *msg = hp_arena_printf(&c->arena, "%s: tp %s of a %d-D tensor has no transformers style; "
                                                  "left out (transformers would replicate it)", full,
                                                  hp_placement_str(ps->pl.ax[HP_AXIS_TP], buf, sizeof buf), ndim);
                if (json_array_append_new(c->unmapped, json_string(msg)) != 0) c->ok = false;
            }
            const char *container = style ? experts_container(c, key) : NULL;
            if (style) {
                add_entry(c, key, style, lm ? PLAN_LM : PLAN_TP);
                if (!tp_container) tp_container = container;
            }
            if (!any_ep || lm) continue;
            if (ep && ps->pl.ax[HP_AXIS_EP].kind == HP_PL_S) {
                add_entry(c, key, "grouped_gemm", PLAN_EP);
                if (!ep_container) ep_container = experts_container(c, key);
            } else if (ep && is_router(b, role, full)) {
                /* The router module: gate.weight and gate.e_score_correction_bias both key "...gate". */
                const char *dot = strrchr(key, '.');
                bool module_key = ends_with(full, ".weight") || !dot;
                add_entry(c, module_key ? key : hp_arena_strndup(&c->arena, key, (size_t)(dot - key)), "ep_router",
                          PLAN_EP);
            } else if (style) {
                add_entry(c, key, style, PLAN_EP);
                if (!ep_container) ep_container = container;
            }
        }
        if (tp_container) add_entry(c, tp_container, "moe_tp_experts", PLAN_TP);
        if (ep_container) add_entry(c, ep_container, "moe_tp_experts", PLAN_EP);
    }
}

/* Generalises and deduplicates the entries of one plan into obj (see the file header). */
static void emit(hf_ctx *c, int plan, json_t *obj)
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
        if (json_object_get(obj, key)) continue;
        if (json_object_set_new(obj, key, json_string(c->e[i].style)) != 0) c->ok = false;
    }
done:
    json_decref(index);
    free(groups);
    free(gid);
}

/* Appends the transformers-style plan (docs/plan-format.md) to out. */
hp_status hp_plan_to_hf(const hp_plan *p, hp_buf *out, hp_err *err)
{
    HP_ASSERT(p && out);
    hf_ctx c = {.p = p, .ok = true};
    hp_arena_init(&c.arena);
    c.unmapped = json_array();
    if (!c.unmapped) c.ok = false;
    c.tp_active = p->n_dims == 0 ? p->tp > 1 : false;
    for (int i = 0; i < p->n_dims; i++) c.tp_active |= p->dims[i] == HP_AXIS_TP;

    bool any_ep = false;
    for (size_t i = 0; i < p->n_boundaries; i++) any_ep |= boundary_ep_marked(&p->boundaries[i]);
    collect(&c, any_ep);

    json_t *root = json_object(), *plans[PLAN_COUNT];
    for (int k = 0; k < PLAN_COUNT; k++) {
        plans[k] = json_object();
        if (!plans[k]) c.ok = false;
        else emit(&c, k, plans[k]);
    }
    if (root && c.ok) {
        int rc = json_object_set_new(root, "format", json_string("hyperpar-hf-tp-plan"));
        rc |= json_object_set_new(root, "version", json_integer(1));
        rc |= json_object_set(root, plan_keys[PLAN_TP], plans[PLAN_TP]);
        if (json_object_size(plans[PLAN_LM])) rc |= json_object_set(root, plan_keys[PLAN_LM], plans[PLAN_LM]);
        if (any_ep) rc |= json_object_set(root, plan_keys[PLAN_EP], plans[PLAN_EP]);
        if (json_array_size(c.unmapped)) rc |= json_object_set(root, "unmapped", c.unmapped);
        if (rc) c.ok = false;
    }
    char *text = root && c.ok ? json_dumps(root, JSON_PRESERVE_ORDER | JSON_INDENT(2)) : NULL;
    for (int k = 0; k < PLAN_COUNT; k++) json_decref(plans[k]);
    json_decref(c.unmapped);
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
