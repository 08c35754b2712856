/*
 * overrides.c — Phase 4.5: applying plan overrides to the derived boundaries (spec §7.1).
 *
 *   entries --when filter--> active --same match merged field-wise--> ordered list
 *   for each entry:
 *     exact key, boundary exists      merge   (unset/"auto" inherit, "none" clears, a map replaces;
 *                                              injection fields win when set; internal fields stay)
 *     exact key, no boundary          insert  (must be self-declared: no sentinels, some contract field)
 *     glob                            merge into every matching boundary; insert for matching modules
 *                                     without one when a contract field is concrete; merge-only globs that
 *                                     hit plain modules are an error; no hit at all warns
 *   derive=false: there are no derived boundaries, so every key inserts.
 *
 * The archetype named by local_compute_fn is checked against the module's real submodules (the seed's
 * interface assertion).
 */
#include <stdlib.h>
#include <string.h>

#include "plan/overrides.h"

typedef struct actx {
    hp_plan *p;
    const hp_overrides *o;
    bool derive;
    hp_err *err;
} actx;

static hp_status fail(actx *c, const hp_override *e, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static hp_status fail(actx *c, const hp_override *e, const char *fmt, ...)
{
    char msg[HP_ERR_MSG_MAX - 300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return hp_err_set(c->err, HP_ERR_INPUT, "%s:%d:%d: override match='%s': %s", c->o->label, e->line, e->col,
                      e->match, msg);
}

static bool when_active(const hp_plan *p, const hp_override *e)
{
    if (!e->when) return true;
    if (!strcmp(e->when, "ep")) return p->ep > 1;
    if (!strcmp(e->when, "tp")) return p->tp > 1;
    if (!strcmp(e->when, "cp")) return p->cp > 1;
    return false; /* low_precision: hyperpar has no low-precision mode */
}

/* Later set fields win (§7.2 desugar of same-match entries). */
static void merge_entries(hp_override *dst, const hp_override *src)
{
    if (src->params.kind) dst->params = src->params;
    if (src->in_src.kind) dst->in_src = src->in_src;
    if (src->in_dst.kind) dst->in_dst = src->in_dst;
    if (src->out_src.kind) dst->out_src = src->out_src;
    if (src->out_dst.kind) dst->out_dst = src->out_dst;
    if (src->out_names_kind) {
        dst->out_names_kind = src->out_names_kind;
        dst->n_out_names = src->n_out_names;
        dst->out_names = src->out_names;
    }
    if (src->tp_divide_set) {
        dst->tp_divide_set = true;
        dst->n_tp_divide = src->n_tp_divide;
        dst->tp_divide = src->tp_divide;
    }
    if (src->is_boundary >= 0) dst->is_boundary = src->is_boundary;
    if (src->region_dispatch >= 0) dst->region_dispatch = src->region_dispatch;
    if (src->local_compute_fn) {
        dst->local_compute_fn = src->local_compute_fn;
        dst->compute = src->compute;
    }
}

static const char *plan_str(actx *c, const char *s) { return hp_arena_strdup(&c->p->arena, s); }

static hp_status copy_params(actx *c, hp_boundary *b, const hp_ov_params *src)
{
    b->params = hp_arena_alloc(&c->p->arena, (size_t)(src->n ? src->n : 1) * sizeof *b->params);
    if (!b->params) return hp_err_set(c->err, HP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < src->n; i++) {
        b->params[i].rel = plan_str(c, src->e[i].rel);
        b->params[i].pl = src->e[i].pl;
        if (!b->params[i].rel) return hp_err_set(c->err, HP_ERR_NOMEM, "out of memory");
    }
    b->n_params = src->n;
    return HP_OK;
}

static hp_status copy_names(actx *c, int n, const char *const *src, int *n_out, const char ***out)
{
    *out = hp_arena_alloc(&c->p->arena, (size_t)(n ? n : 1) * sizeof **out);
    if (!*out) return hp_err_set(c->err, HP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++)
        if (!((*out)[i] = plan_str(c, src[i]))) return hp_err_set(c->err, HP_ERR_NOMEM, "out of memory");
    *n_out = n;
    return HP_OK;
}

/* The interface assertion: the module of b has every submodule archetype `key` reads. False with the missing
 * ones and those the module has written to missing / have. */
static bool archetype_fits(const hp_model *m, const char *key, const hp_boundary *b, char *missing, size_t cm,
                           char *have, size_t ch_cap)
{
    const char *const *need = hp__archetype_children(key);
    missing[0] = have[0] = '\0';
    if (!need || b->module < 0) return true;
    size_t lm = 0, lh = 0;
    for (int ch = m->modules[b->module].first_child; ch >= 0; ch = m->modules[ch].next_sibling)
        if (lh < ch_cap) lh += (size_t)snprintf(have + lh, ch_cap - lh, "%s%s", lh ? ", " : "", m->modules[ch].leaf);
    for (int k = 0; need[k]; k++) {
        bool found = false;
        char alts[96];
        snprintf(alts, sizeof alts, "%s", need[k]); /* "a|b": either name */
        for (char *save = NULL, *a = strtok_r(alts, "|", &save); a && !found; a = strtok_r(NULL, "|", &save))
            for (int ch = m->modules[b->module].first_child; ch >= 0 && !found; ch = m->modules[ch].next_sibling)
                found = !strcmp(m->modules[ch].leaf, a);
        if (!found && lm < cm) lm += (size_t)snprintf(missing + lm, cm - lm, "%s%s", lm ? ", " : "", need[k]);
    }
    if (!lh) snprintf(have, ch_cap, "(no submodules)");
    return lm == 0;
}

static hp_status check_archetype(actx *c, const hp_override *e, const hp_boundary *b)
{
    const hp_model *m = c->p->model;
    char missing[256], have[512];
    if (archetype_fits(m, b->local_compute_fn, b, missing, sizeof missing, have, sizeof have)) return HP_OK;
    return fail(c, e,
                "archetype '%s' does not fit module '%s': missing submodule(s) %s; the module has: %s. Pick the "
                "archetype for this family (suggested: %s) or match the MoE block itself",
                b->local_compute_fn, b->fqn, missing, have, hp_archetype_suggest(m));
}

static hp_status apply_injection(actx *c, const hp_override *e, hp_boundary *b)
{
    hp_status st = HP_OK;
    if (e->is_boundary >= 0) b->is_boundary = e->is_boundary;
    if (e->region_dispatch >= 0) b->region_dispatch = e->region_dispatch;
    if (e->tp_divide_set && (st = copy_names(c, e->n_tp_divide, e->tp_divide, &b->n_user_attrs, &b->user_attrs)))
        return st;
    if (e->out_names_kind && (st = copy_names(c, e->n_out_names, e->out_names, &b->n_out_names, &b->out_names)))
        return st;
    if (e->local_compute_fn) {
        b->local_compute_fn = e->local_compute_fn; /* a static archetype key */
        b->compute = e->compute;
        b->injected = true;
        st = check_archetype(c, e, b);
    }
    return st;
}

static void apply_io(const hp_ov_io *src, hp_io_map *dst, bool out_field)
{
    if (src->kind == HP_OV_MAP) {
        *dst = src->map;
    } else if (src->kind == HP_OV_NONE) {
        memset(dst, 0, sizeof *dst);
        dst->is_null = out_field;
    }
}

/* Whether derived param i of b is an expert that EP marking placed on the ep axis (an ep Shard): an override's
 * params map does not replace those, since the EP-marked boundary's stacks and exchange are built on them. */
static bool ep_placed(const hp_boundary *b, int i)
{
    hp_pl_kind k = (hp_pl_kind)b->params[i].pl.ax[HP_AXIS_EP].kind;
    return b->ep_size > 0 && (k == HP_PL_S || k == HP_PL_S2);
}

static bool listed(const hp_override *e, const char *rel)
{
    for (int k = 0; k < e->params.n; k++)
        if (!strcmp(e->params.e[k].rel, rel)) return true;
    return false;
}

static hp_status merge(actx *c, const hp_override *e, hp_boundary *b)
{
    int n_keep = 0; /* EP-placed experts the override does not list: kept as EP marking placed them ({} clears) */
    if (e->params.kind == HP_OV_MAP && e->params.n > 0 && b->n_params > 0) {
        hp_buf lost;
        hp_buf_init(&lost);
        int n = 0;
        for (int i = 0; i < b->n_params; i++) {
            if (listed(e, b->params[i].rel)) continue;
            if (ep_placed(b, i)) n_keep++;
            else hp_buf_printf(&lost, "%s%s", n++ ? ", " : "", b->params[i].rel);
        }
        if (n)
            hp__plan_warn(c->p, "override match='%s' on '%s' replaces params and strips the derived sharding from %d "
                          "parameter(s): %s; list them in params to keep them",
                          e->match, b->fqn, n, lost.data ? lost.data : "");
        hp_buf_free(&lost);
    }
    hp_status st = HP_OK;
    if (e->params.kind == HP_OV_MAP && n_keep) {
        const hp_boundary old = *b; /* its params array stays in the arena */
        st = copy_params(c, b, &e->params); /* the override's entries, then the kept experts */
        hp_param_spec *all = st == HP_OK ? hp_arena_alloc(&c->p->arena, (size_t)(b->n_params + n_keep) * sizeof *all)
                                          : NULL;
        if (st == HP_OK && !all) st = hp_err_set(c->err, HP_ERR_NOMEM, "out of memory");
        if (st == HP_OK) {
            memcpy(all, b->params, (size_t)b->n_params * sizeof *all);
            for (int i = 0; i < old.n_params; i++)
                if (!listed(e, old.params[i].rel) && ep_placed(&old, i)) all[b->n_params++] = old.params[i];
            b->params = all;
        }
    } else if (e->params.kind == HP_OV_MAP) {
        st = copy_params(c, b, &e->params);
    } else if (e->params.kind == HP_OV_NONE) {
        b->n_params = 0;
    }
    if (st != HP_OK) return st;
    apply_io(&e->in_src, &b->in_src, false);
    apply_io(&e->in_dst, &b->in_dst, false);
    apply_io(&e->out_src, &b->out_src, true);
    apply_io(&e->out_dst, &b->out_dst, true);
    return apply_injection(c, e, b);
}

static bool any_contract(const hp_override *e, hp_ov_kind kind, const char **field)
{
    const hp_ov_kind k[] = {e->params.kind, e->in_src.kind, e->in_dst.kind, e->out_src.kind, e->out_dst.kind};
    static const char *const names[] = {"params", "in_src", "in_dst", "out_src", "out_dst"};
    for (int i = 0; i < 5; i++)
        if (k[i] == kind || (kind == HP_OV_AUTO && k[i] == HP_OV_NONE)) {
            if (field) *field = names[i];
            return true;
        }
    return false;
}

/* A YAML skeleton declaring the module's own parameters replicated, for the "undeclared" error. */
static void skeleton(const hp_model *m, int module, const char *fqn, hp_buf *out)
{
    hp_buf_printf(out, "\n  - match: \"%s\"\n    params: {", fqn);
    const hp_module *mod = &m->modules[module];
    size_t skip = fqn[0] ? strlen(fqn) + 1 : 0;
    int n = 0;
    for (int q = mod->subtree_first; q < mod->subtree_end && n < 6; q++, n++)
        hp_buf_printf(out, "%s%s: {tp: replicate}", n ? ", " : "", m->params[q].name + skip);
    hp_buf_puts(out, "}\n    in_src: {hidden_states: {tp: replicate}}\n    in_dst: {hidden_states: {tp: replicate}}");
}

static hp_status insert(actx *c, const hp_override *e, const char *fqn, int module)
{
    hp_plan *p = c->p;
    const char *field = NULL;
    if (any_contract(e, HP_OV_AUTO, &field)) {
        const char *v = (!strcmp(field, "params") ? e->params.kind
                         : !strcmp(field, "in_src") ? e->in_src.kind
                         : !strcmp(field, "in_dst") ? e->in_dst.kind
                         : !strcmp(field, "out_src") ? e->out_src.kind
                                                     : e->out_dst.kind) == HP_OV_AUTO ? "auto" : "none";
        return fail(c, e,
                    "contract field %s='%s' is meaningless: %s — there is no derived spec to inherit from or clear "
                    "at '%s'; declare the field as a mapping",
                    field, v, c->derive ? "insert (no derived boundary was hit)" : "derive=False: every entry inserts",
                    fqn);
    }
    if (!any_contract(e, HP_OV_MAP, NULL)) {
        hp_buf sk;
        hp_buf_init(&sk);
        skeleton(p->model, module, fqn, &sk);
        hp_status st = fail(c, e,
                            "'%s' hit no planner-derived boundary and leaves params and the I/O contract all "
                            "undeclared%s; declare at least params or in_src/in_dst, e.g.:%s",
                            fqn, c->derive ? "" : " (derive=False)", sk.data ? sk.data : "");
        hp_buf_free(&sk);
        return st;
    }
    hp_boundary *nb = hp_arena_alloc(&p->arena, (p->n_boundaries + 1) * sizeof *nb);
    if (!nb) return hp_err_set(c->err, HP_ERR_NOMEM, "out of memory");
    size_t pos = 0;
    while (pos < p->n_boundaries && p->boundaries[pos].module <= module) pos++;
    if (pos) memcpy(nb, p->boundaries, pos * sizeof *nb);
    if (p->n_boundaries > pos) memcpy(nb + pos + 1, p->boundaries + pos, (p->n_boundaries - pos) * sizeof *nb);
    p->boundaries = nb;
    p->n_boundaries++;
    hp_boundary *b = &nb[pos];
    memset(b, 0, sizeof *b);
    b->fqn = plan_str(c, fqn);
    b->type = HP_BT_CUSTOM;
    b->module = module;
    b->is_boundary = true;
    b->region_dispatch = -1;
    b->out_src.is_null = b->out_dst.is_null = true;
    if (!b->fqn) return hp_err_set(c->err, HP_ERR_NOMEM, "out of memory");
    return merge(c, e, b);
}

static hp_boundary *find_boundary(hp_plan *p, const char *fqn)
{
    for (size_t i = 0; i < p->n_boundaries; i++)
        if (!strcmp(p->boundaries[i].fqn, fqn)) return &p->boundaries[i];
    return NULL;
}

static hp_status apply_glob(actx *c, const hp_override *e)
{
    hp_plan *p = c->p;
    const hp_model *m = p->model;
    bool can_insert = any_contract(e, HP_OV_MAP, NULL);
    /* Modules matching the glob that have no boundary. */
    int n_model_hits = 0;
    hp_buf list;
    hp_buf_init(&list);
    int *model_hits = malloc((m->n_modules ? m->n_modules : 1) * sizeof *model_hits);
    if (!model_hits) return hp_err_set(c->err, HP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < m->n_modules; i++)
        if (hp_glob_match(e->match, m->modules[i].name) && !find_boundary(p, m->modules[i].name)) {
            if (n_model_hits < 8) hp_buf_printf(&list, "%s'%s'", n_model_hits ? ", " : "", m->modules[i].name);
            model_hits[n_model_hits++] = (int)i;
        }
    hp_status st = HP_OK;
    if (n_model_hits && !can_insert) {
        st = fail(c, e,
                  "the glob matches %d module(s) without a derived boundary (%s%s) but configures only merge-only "
                  "fields; with derive=%s it cannot insert them. Narrow the glob to the boundaries, or declare "
                  "params / in_src / in_dst so matching modules get their own spec, e.g.:\n  - match: \"%s\"\n"
                  "    params: {}\n    in_src: {hidden_states: {tp: replicate}}\n    in_dst: {hidden_states: {tp: "
                  "replicate}}",
                  n_model_hits, list.data ? list.data : "", n_model_hits > 8 ? ", ..." : "",
                  c->derive ? "True" : "False", e->match);
    }
    /* Merge into the boundaries that existed before this entry, then insert for plain modules. */
    size_t n_before = p->n_boundaries;
    int n_hits = 0;
    char **hit_names = NULL;
    if (st == HP_OK) {
        hit_names = malloc((n_before ? n_before : 1) * sizeof *hit_names);
        if (!hit_names) st = hp_err_set(c->err, HP_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; st == HP_OK && i < n_before; i++)
        if (hp_glob_match(e->match, p->boundaries[i].fqn)) hit_names[n_hits++] = (char *)p->boundaries[i].fqn;
    for (int i = 0; st == HP_OK && i < n_hits; i++) st = merge(c, e, find_boundary(p, hit_names[i]));
    for (int i = 0; st == HP_OK && can_insert && i < n_model_hits; i++)
        st = insert(c, e, m->modules[model_hits[i]].name, model_hits[i]);
    if (st == HP_OK && !n_hits && !(can_insert && n_model_hits))
        hp__plan_warn(p, "%s:%d:%d: override match='%s' hit no boundary spec or model module; check the pattern",
                      c->o->label, e->line, e->col, e->match);
    free(hit_names);
    free(model_hits);
    hp_buf_free(&list);
    return st;
}

hp_status hp__apply_overrides(hp_plan *p, const hp_overrides *o, bool derive, hp_err *err)
{
    actx c = {p, o, derive, err};
    if (!o || !o->n) return HP_OK;
    /* Active entries, same-match entries folded into the first occurrence. */
    hp_override *act = calloc((size_t)o->n, sizeof *act);
    if (!act) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    int n = 0;
    hp_status st = HP_OK;
    for (int i = 0; i < o->n && st == HP_OK; i++) {
        const hp_override *e = &o->e[i];
        if (!when_active(p, e)) {
            hp_log(HP_LOG_INFO, "%s:%d:%d: override match='%s' skipped: when=%s is not active", o->label, e->line,
                   e->col, e->match, e->when);
            continue;
        }
        if (!e->glob && e->match[0] && hp_model_find_module(p->model, e->match) < 0) {
            st = fail(&c, e, "FQN not found in the model's named_modules: '%s'; use an exact module name (see "
                      "'hyperpar inspect --tree') or a glob", e->match);
            break;
        }
        int k = 0;
        while (k < n && strcmp(act[k].match, e->match)) k++;
        if (k == n) act[n++] = *e;
        else merge_entries(&act[k], e);
    }
    for (int i = 0; i < n && st == HP_OK; i++) {
        const hp_override *e = &act[i];
        if (e->glob) {
            st = apply_glob(&c, e);
            continue;
        }
        hp_boundary *b = find_boundary(p, e->match);
        st = b ? merge(&c, e, b) : insert(&c, e, e->match, e->match[0] ? hp_model_find_module(p->model, e->match) : 0);
    }
    free(act);
    return st;
}

hp_status hp__apply_ep_compute(hp_plan *p, const char *ep_compute, hp_err *err)
{
    const hp_model *m = p->model;
    bool moe = m->family && hp_family_is_moe(m->family);
    if (!moe)
        return hp_err_set(err, HP_ERR_INPUT, "--ep-compute %s: %s is a dense model (%s); it has no MoE block to "
                          "compute under expert parallelism; drop --ep-compute", ep_compute, m->path,
                          m->model_type ? m->model_type : "unknown type");
    const char *key;
    if (!strcmp(ep_compute, "suggested")) {
        key = hp_archetype_suggest(m);
        if (!key)
            return hp_err_set(err, HP_ERR_INPUT, "--ep-compute suggested: the family of %s (%s) suggests no EP compute "
                              "archetype; name one: %s", m->path, m->model_type, hp_archetype_list());
    } else if (!(key = hp_archetype_resolve(ep_compute))) {
        return hp_err_set(err, HP_ERR_INPUT, "--ep-compute '%s' is not an EP compute archetype; give suggested (this "
                          "family's: %s) or one of: %s", ep_compute, hp_archetype_suggest(m), hp_archetype_list());
    }
    for (size_t i = 0; i < p->n_boundaries; i++) {
        hp_boundary *b = &p->boundaries[i];
        if (b->ep_size <= 0) continue;
        if (b->local_compute_fn) {
            if (strcmp(b->local_compute_fn, key) != 0)
                return hp_err_set(err, HP_ERR_INPUT, "--ep-compute %s (%s) contradicts the overrides, which declare "
                                  "local_compute_fn %s on boundary '%s'; give one of them",
                                  ep_compute, key, b->local_compute_fn, b->fqn);
            continue;
        }
        char missing[256], have[512];
        if (!archetype_fits(m, key, b, missing, sizeof missing, have, sizeof have))
            return hp_err_set(err, HP_ERR_INPUT, "--ep-compute %s: archetype '%s' does not fit module '%s': missing "
                              "submodule(s) %s; the module has: %s (this family's archetype: %s)", ep_compute, key,
                              b->fqn, missing, have, hp_archetype_suggest(m));
        b->local_compute_fn = key; /* a static archetype key, as an override's */
        b->region_dispatch = 0;
        b->injected = true;
    }
    return HP_OK;
}
