/*
 * overrides_yaml.c — the YAML/JSON transport of plan overrides (spec §7.2) into hp_override entries.
 *
 * Grammar of one entry (a mapping):
 *   match            string (exact module FQN, "" = root, or a glob with * ? [)       required
 *   when             ep | tp | cp | low_precision                                     optional
 *   params           {rel_path: {axis: placement}} | "auto" | "none"
 *   in_src, in_dst   {input_name: {axis: placement}} | "auto" | "none"
 *   out_src, out_dst {output_name: {axis: placement}} | {axis: placement} (shorthand) | "auto" | "none"
 *   out_names        [name, ...]                 tp_divide_attrs  [identifier, ...]
 *   is_boundary      bool                        region_dispatch  bool | null
 *   local_compute_fn {_target_: archetype-or-factory-path, use_grouped_gemm, overlap_shared_expert,
 *                     fix_router: bool, capacity_factor: number > 0}
 *   placement        replicate | partial | shard(N)   (case-insensitive, whitespace ignored, N >= 0)
 *
 * Top level: a list of entries, or a mapping whose only key is plan_overrides; a null document or a null
 * plan_overrides is refused ([] is the empty list).
 *
 * Checks made here, each with file:line:col: unknown keys, malformed globs (hp_glob_valid), DP placements ("declaring a DP placement is not
 * allowed"), unknown axes, malformed placements, sentinel typos, archetype names, option types.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "io/json.h"
#include "io/yaml.h"
#include "plan/overrides.h"

typedef struct pctx {
    hp_overrides *o;
    const char *label;
    hp_err *err;
} pctx;

static hp_status at(pctx *c, const hp_ynode *n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static hp_status at(pctx *c, const hp_ynode *n, const char *fmt, ...)
{
    char msg[HP_ERR_MSG_MAX - 300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return hp_err_set(c->err, HP_ERR_INPUT, "%s:%d:%d: %s", c->label, n ? n->line : 0, n ? n->col : 0, msg);
}

static const char *kind_word(const hp_ynode *n)
{
    if (n->kind == HP_Y_MAP) return "a mapping";
    if (n->kind == HP_Y_SEQ) return "a list";
    return "a string";
}

/* Canonical mesh axis names (§1.2); anything else is a typo. dp names are refused separately. */
static const char *const g_axes[] = {"tp", "cp", "ep", "pp", "dp", "dp_replicate", "dp_shard", "dp_cp", "ep_shard"};

static bool is_dp_axis(const char *a) { return strcmp(a, "dp") == 0; }

static hp_status parse_placement(pctx *c, const hp_ynode *v, const char *axis, const char *where, hp_placement *out)
{
    if (v->kind != HP_Y_SCALAR)
        return at(c, v, "%s: the placement of axis '%s' must be a string (replicate, partial or shard(N)), got %s",
                  where, axis, kind_word(v));
    char buf[64];
    size_t k = 0;
    for (const char *s = v->str; *s && k + 1 < sizeof buf; s++)
        if (!isspace((unsigned char)*s)) buf[k++] = (char)tolower((unsigned char)*s);
    buf[k] = '\0';
    if (!strcmp(buf, "replicate")) *out = hp_pl_r();
    else if (!strcmp(buf, "partial")) *out = hp_pl_p();
    else {
        char *end = NULL;
        long d = -1;
        if (!strncmp(buf, "shard(", 6) && isdigit((unsigned char)buf[6])) d = strtol(buf + 6, &end, 10);
        if (d < 0 || d > 64 || !end || strcmp(end, ")") != 0)
            return at(c, v,
                      "%s: malformed placement '%s' for axis '%s': expected replicate, partial or shard(N) with N a "
                      "non-negative integer (negative dims are not expressible)",
                      where, v->str, axis);
        *out = hp_pl_s((int)d);
    }
    return HP_OK;
}

/* {axis: placement} -> hp_nplace. Axes other than tp/cp/ep are canonical but have no placement here. */
static hp_status parse_nplace(pctx *c, const hp_ynode *m, const char *where, hp_nplace *out)
{
    memset(out, 0, sizeof *out);
    if (m->kind != HP_Y_MAP)
        return at(c, m, "%s must be a Placement map {axis: placement}, got %s", where, kind_word(m));
    if (m->n == 0) return at(c, m, "%s: a Placement map needs at least one axis", where);
    for (int i = 0; i < m->n; i++) {
        const char *axis = m->keys[i];
        if (is_dp_axis(axis))
            return at(c, m->items[i],
                      "%s: declaring a DP placement is not allowed — the plan describes one data-parallel slice; "
                      "remove the '%s' axis",
                      where, axis);
        bool known = false;
        for (size_t a = 0; a < sizeof g_axes / sizeof *g_axes; a++) known |= strcmp(axis, g_axes[a]) == 0;
        if (!known)
            return at(c, m->items[i], "%s uses the unknown axis '%s'; known axes: tp, cp, ep, pp, dp_replicate, "
                      "dp_shard, dp_cp, ep_shard", where, axis);
        hp_placement p;
        hp_status st = parse_placement(c, m->items[i], axis, where, &p);
        if (st != HP_OK) return st;
        if (!strcmp(axis, "tp")) out->ax[HP_AXIS_TP] = p;
        else if (!strcmp(axis, "cp")) out->ax[HP_AXIS_CP] = p;
        else if (!strcmp(axis, "ep")) out->ax[HP_AXIS_EP] = p;
    }
    return HP_OK;
}

static hp_status sentinel(pctx *c, const hp_ynode *v, const char *field, hp_ov_kind *kind)
{
    if (!strcmp(v->str, "auto")) *kind = HP_OV_AUTO;
    else if (!strcmp(v->str, "none")) *kind = HP_OV_NONE;
    else
        return at(c, v, "%s must be a mapping or one of the sentinels ('auto', 'none'), got '%s'", field, v->str);
    return HP_OK;
}

static hp_status parse_params(pctx *c, const hp_ynode *v, hp_ov_params *out)
{
    if (hp__yscalar_is_null(v)) return HP_OK;
    if (v->kind == HP_Y_SCALAR) return sentinel(c, v, "params", &out->kind);
    if (v->kind != HP_Y_MAP) return at(c, v, "params must be a mapping {param: {axis: placement}}, got a list");
    out->kind = HP_OV_MAP;
    out->e = hp_arena_alloc(&c->o->arena, (size_t)(v->n ? v->n : 1) * sizeof *out->e);
    if (!out->e) return hp_err_set(c->err, HP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < v->n; i++) {
        char where[300];
        snprintf(where, sizeof where, "params['%.200s']", v->keys[i]);
        hp_status st = parse_nplace(c, v->items[i], where, &out->e[i].pl);
        if (st != HP_OK) return st;
        out->e[i].rel = v->keys[i];
    }
    out->n = v->n;
    return HP_OK;
}

/* An I/O contract. out_* accept the shorthand {axis: placement}: a non-empty map any of whose values is not
 * itself a map (§1.3 detection rule). */
static hp_status parse_io(pctx *c, const hp_ynode *v, const char *field, bool out_field, hp_ov_io *out)
{
    if (hp__yscalar_is_null(v)) return HP_OK;
    if (v->kind == HP_Y_SCALAR) return sentinel(c, v, field, &out->kind);
    if (v->kind != HP_Y_MAP) return at(c, v, "%s must be a mapping {name: {axis: placement}}, got a list", field);
    out->kind = HP_OV_MAP;
    bool shorthand = false;
    for (int i = 0; i < v->n; i++) shorthand |= v->items[i]->kind != HP_Y_MAP;
    if (shorthand && out_field) {
        out->map.n = 1;
        snprintf(out->map.e[0].name, sizeof out->map.e[0].name, "output");
        return parse_nplace(c, v, field, &out->map.e[0].pl);
    }
    if (v->n > HP_MAX_IO) return at(c, v, "%s: at most %d names", field, HP_MAX_IO);
    for (int i = 0; i < v->n; i++) {
        char where[200];
        snprintf(where, sizeof where, "%s['%.100s']", field, v->keys[i]);
        if (strlen(v->keys[i]) >= sizeof out->map.e[0].name) return at(c, v, "%s: name too long", where);
        snprintf(out->map.e[i].name, sizeof out->map.e[i].name, "%s", v->keys[i]);
        hp_status st = parse_nplace(c, v->items[i], where, &out->map.e[i].pl);
        if (st != HP_OK) return st;
    }
    out->map.n = v->n;
    return HP_OK;
}

static hp_status parse_names(pctx *c, const hp_ynode *v, const char *field, bool identifiers, int *n,
                             const char ***out)
{
    if (v->kind != HP_Y_SEQ) return at(c, v, "%s must be a list of names, got %s", field, kind_word(v));
    *out = hp_arena_alloc(&c->o->arena, (size_t)(v->n ? v->n : 1) * sizeof **out);
    if (!*out) return hp_err_set(c->err, HP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < v->n; i++) {
        const hp_ynode *it = v->items[i];
        if (it->kind != HP_Y_SCALAR || !it->str[0]) return at(c, it, "%s entries must be non-empty strings", field);
        if (identifiers) {
            bool ok = isalpha((unsigned char)it->str[0]) || it->str[0] == '_';
            for (const char *s = it->str; *s; s++) ok &= isalnum((unsigned char)*s) || *s == '_';
            if (!ok) return at(c, it, "%s: '%s' is not an identifier", field, it->str);
        }
        for (int k = 0; k < i; k++)
            if (!strcmp((*out)[k], it->str)) return at(c, it, "%s lists '%s' twice", field, it->str);
        (*out)[i] = it->str;
    }
    *n = v->n;
    return HP_OK;
}

static hp_status parse_bool_opt(pctx *c, const hp_ynode *v, const char *field, bool *has, bool *val)
{
    int b = hp__yscalar_bool(v);
    if (b < 0) return at(c, v, "%s must be true or false", field);
    *has = true;
    *val = b == 1;
    return HP_OK;
}

static hp_status parse_compute(pctx *c, const hp_ynode *v, hp_override *e)
{
    static const char *const reserved[] = {"mesh", "tp_mesh", "cp_mesh", "ep_mesh", "module"};
    if (v->kind != HP_Y_MAP)
        return at(c, v, "local_compute_fn must be a mapping with _target_ (one of %s)", hp_archetype_list());
    const hp_ynode *t = hp__ymap_get(v, "_target_");
    if (!t || t->kind != HP_Y_SCALAR)
        return at(c, v, "local_compute_fn needs _target_: one of %s (or hyper_parallel's factory path)",
                  hp_archetype_list());
    e->local_compute_fn = hp_archetype_resolve(t->str);
    if (!e->local_compute_fn)
        return at(c, t, "unknown EP archetype '%s'; known archetypes: %s", t->str, hp_archetype_list());
    for (int i = 0; i < v->n; i++) {
        const char *k = v->keys[i];
        const hp_ynode *x = v->items[i];
        hp_status st = HP_OK;
        if (!strcmp(k, "_target_")) continue;
        for (size_t r = 0; r < sizeof reserved / sizeof *reserved; r++)
            if (!strcmp(k, reserved[r]))
                return at(c, x, "local_compute_fn sets '%s', one of the framework-reserved context keys (mesh, "
                          "tp_mesh, cp_mesh, ep_mesh, module) that hyperpar passes itself", k);
        if (!strcmp(k, "use_grouped_gemm"))
            st = parse_bool_opt(c, x, k, &e->compute.has_use_grouped_gemm, &e->compute.use_grouped_gemm);
        else if (!strcmp(k, "overlap_shared_expert"))
            st = parse_bool_opt(c, x, k, &e->compute.has_overlap_shared_expert, &e->compute.overlap_shared_expert);
        else if (!strcmp(k, "fix_router"))
            st = parse_bool_opt(c, x, k, &e->compute.has_fix_router, &e->compute.fix_router);
        else if (!strcmp(k, "capacity_factor")) {
            char *end = NULL;
            double f = x->kind == HP_Y_SCALAR && !x->quoted ? strtod(x->str, &end) : -1;
            if (!end || *end || !(f > 0) || f > 1e6)
                return at(c, x, "capacity_factor must be a number > 0, got '%s'",
                          x->kind == HP_Y_SCALAR ? x->str : kind_word(x));
            e->compute.capacity_factor = f;
        } else
            return at(c, x, "local_compute_fn has undeclared keys: '%s'; the archetype options are "
                      "use_grouped_gemm, overlap_shared_expert, fix_router, capacity_factor", k);
        if (st != HP_OK) return st;
    }
    return HP_OK;
}

static const char *const g_entry_keys[] = {"match", "when", "params", "in_src", "in_dst", "out_src", "out_dst",
                                           "out_names", "tp_divide_attrs", "is_boundary", "region_dispatch",
                                           "local_compute_fn"};

static hp_status parse_entry(pctx *c, const hp_ynode *n, hp_override *e)
{
    if (n->kind != HP_Y_MAP)
        return at(c, n, "each plan_overrides entry must be a mapping (a ModuleShardingSpec with match: ...), got %s",
                  kind_word(n));
    memset(e, 0, sizeof *e);
    e->line = n->line;
    e->col = n->col;
    e->is_boundary = -1;
    e->region_dispatch = -1;
    for (int i = 0; i < n->n; i++) {
        bool known = false;
        for (size_t k = 0; k < sizeof g_entry_keys / sizeof *g_entry_keys; k++) known |= !strcmp(n->keys[i], g_entry_keys[k]);
        if (!known)
            return at(c, n->items[i], "unknown key '%s' in an override entry; known keys: match, when, params, in_src, "
                      "in_dst, out_src, out_dst, out_names, tp_divide_attrs, is_boundary, region_dispatch, "
                      "local_compute_fn", n->keys[i]);
    }
    const hp_ynode *v = hp__ymap_get(n, "match");
    if (!v || v->kind != HP_Y_SCALAR) return at(c, n, "an override entry needs match: <module FQN or glob>");
    e->match = v->str;
    e->glob = strpbrk(v->str, "*?[") != NULL;
    size_t bad = 0;
    const char *why = NULL;
    if (e->glob && !hp_glob_valid(v->str, &bad, &why))
        return at(c, v, "match '%s' is not a valid glob: %s at character %zu; fix the pattern (a literal '[' is "
                  "written [[])", v->str, why, bad + 1);
    hp_status st = HP_OK;
    if ((v = hp__ymap_get(n, "when")) && !hp__yscalar_is_null(v)) {
        if (v->kind != HP_Y_SCALAR ||
            (strcmp(v->str, "ep") && strcmp(v->str, "tp") && strcmp(v->str, "cp") && strcmp(v->str, "low_precision")))
            return at(c, v, "when must be one of ep, tp, cp, low_precision");
        e->when = v->str;
    }
    if ((v = hp__ymap_get(n, "params")) && (st = parse_params(c, v, &e->params))) return st;
    if ((v = hp__ymap_get(n, "in_src")) && (st = parse_io(c, v, "in_src", false, &e->in_src))) return st;
    if ((v = hp__ymap_get(n, "in_dst")) && (st = parse_io(c, v, "in_dst", false, &e->in_dst))) return st;
    if ((v = hp__ymap_get(n, "out_src")) && (st = parse_io(c, v, "out_src", true, &e->out_src))) return st;
    if ((v = hp__ymap_get(n, "out_dst")) && (st = parse_io(c, v, "out_dst", true, &e->out_dst))) return st;
    if ((v = hp__ymap_get(n, "out_names")) && !hp__yscalar_is_null(v)) {
        e->out_names_kind = HP_OV_MAP;
        if ((st = parse_names(c, v, "out_names", false, &e->n_out_names, &e->out_names))) return st;
    }
    if ((v = hp__ymap_get(n, "tp_divide_attrs")) && !hp__yscalar_is_null(v)) {
        e->tp_divide_set = true;
        if ((st = parse_names(c, v, "tp_divide_attrs", true, &e->n_tp_divide, &e->tp_divide))) return st;
    }
    if ((v = hp__ymap_get(n, "is_boundary")) && !hp__yscalar_is_null(v)) {
        int b = hp__yscalar_bool(v);
        if (b < 0) return at(c, v, "is_boundary must be true or false");
        e->is_boundary = (int8_t)b;
    }
    if ((v = hp__ymap_get(n, "region_dispatch")) && !hp__yscalar_is_null(v)) {
        int b = hp__yscalar_bool(v);
        if (b < 0) return at(c, v, "region_dispatch must be true, false or null");
        e->region_dispatch = (int8_t)b;
    }
    if ((v = hp__ymap_get(n, "local_compute_fn")) && !hp__yscalar_is_null(v) && (st = parse_compute(c, v, e))) return st;
    return HP_OK;
}

hp_status hp_overrides_parse(hp_overrides **out, const char *text, size_t len, const char *label, hp_err *err)
{
    *out = NULL;
    hp_overrides *o = hp_calloc(1, sizeof *o);
    if (!o) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    hp_arena_init(&o->arena);
    o->label = hp_arena_strdup(&o->arena, label);
    pctx c = {o, o->label ? o->label : label, err};
    hp_ynode *root = NULL;
    hp_status st = hp__yaml_parse(text, len, c.label, &o->arena, &root, err);
    const hp_ynode *list = root;
    if (st == HP_OK && hp__yscalar_is_null(root))
        st = at(&c, root, "the overrides document is null ('%s'); an overrides file holds a list of override entries, "
                "or a mapping with a plan_overrides list ([] for none)", root->str);
    if (st == HP_OK && root->kind == HP_Y_MAP) {
        /* The transport has one top-level key; anything else is a typo that would silently drop entries. */
        for (int i = 0; i < root->n && st == HP_OK; i++)
            if (strcmp(root->keys[i], "plan_overrides") != 0)
                st = at(&c, root->items[i], "unknown top-level key '%s'; the only top-level key is plan_overrides "
                        "(or make the whole document the list of entries)", root->keys[i]);
        list = hp__ymap_get(root, "plan_overrides");
        if (st == HP_OK && !list)
            st = at(&c, root, "expected a list of override entries, or a mapping with a plan_overrides list");
    }
    if (st == HP_OK && list != root && hp__yscalar_is_null(list))
        st = at(&c, list, "plan_overrides is null; give a list of override entries ([] for none)");
    if (st == HP_OK && list->kind != HP_Y_SEQ)
        st = at(&c, list, "plan_overrides must be a list of entries, got %s", kind_word(list));
    if (st == HP_OK && list->kind == HP_Y_SEQ) {
        o->e = hp_arena_alloc(&o->arena, (size_t)(list->n ? list->n : 1) * sizeof *o->e);
        if (!o->e) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        for (int i = 0; st == HP_OK && i < list->n; i++) st = parse_entry(&c, list->items[i], &o->e[o->n++]);
    }
    if (st != HP_OK) {
        hp_overrides_free(o);
        return st;
    }
    *out = o;
    return HP_OK;
}

hp_status hp_overrides_load(hp_overrides **out, const char *path, hp_err *err)
{
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    hp_status st = hp__read_file(path, HP_JSON_MAX_FILE, &text, &len, err);
    if (st == HP_OK) st = hp_overrides_parse(out, text, len, path, err);
    free(text);
    return st;
}

void hp_overrides_free(hp_overrides *o)
{
    if (!o) return;
    hp_arena_free(&o->arena);
    free(o);
}

size_t hp_overrides_count(const hp_overrides *o) { return o ? (size_t)o->n : 0; }
