/*
 * plan_read.c — reads a plan JSON written by `hyperpar plan` (docs/plan-format.md, "hyperpar-plan" v1) back
 * into an hp_plan, and checks that it was made for the checkpoint at hand.
 *
 * Only what sharding needs is read: the mesh, mesh_dim_names, and per boundary its fqn, type, params
 * (placement maps), ep_size and ep_stack. Keys this reader does not know are ignored (the format's
 * additive-change rule). The plan-vs-checkpoint check compares the plan's param_roles (every parameter
 * name), the names its boundaries and stacks use, and model.num_params (a shape that differs changes the
 * element count); the first 10 differences are listed.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "io/json.h"
#include "hyperpar/overrides.h"
#include "shard/shard_int.h"

#define MAX_DIFFS 10

typedef struct diffs {
    hp_buf b;
    int n;
} diffs;

static void diff_add(diffs *d, const char *fmt, const char *a, long long x, long long y)
{
    if (d->n++ >= MAX_DIFFS) return;
    hp_buf_puts(&d->b, "\n  - ");
    hp_buf_printf(&d->b, fmt, a, x, y);
}

static hp_status fail(hp_err *err, const char *path, const char *where, const char *what)
{
    return hp_err_set(err, HP_ERR_INPUT, "%s: %s: %s; regenerate it with 'hyperpar plan MODEL ... -o plan.json'", path,
                      where, what);
}

/* "R", "P", "S(d)" or "S(d)x2" with -HP_MAX_DIMS <= d < HP_MAX_DIMS (negative dims count from the end).
 * Parsed by hand: sscanf's %d has undefined behaviour on a number that does not fit an int. */
static bool parse_placement(const char *s, hp_placement *out)
{
    if (!strcmp(s, "R")) return *out = hp_pl_r(), true;
    if (!strcmp(s, "P")) return *out = hp_pl_p(), true;
    if (strncmp(s, "S(", 2) != 0) return false;
    const char *q = s + 2;
    bool neg = *q == '-';
    if (neg) q++;
    if (*q < '0' || *q > '9') return false;
    int d = 0;
    for (; *q >= '0' && *q <= '9'; q++) {
        if (d > HP_MAX_DIMS) return false; /* already out of range: stop before it can grow */
        d = d * 10 + (*q - '0');
    }
    if (*q++ != ')') return false;
    if (neg) d = -d;
    if (d < -HP_MAX_DIMS || d >= HP_MAX_DIMS) return false;
    if (*q == '\0') return *out = hp_pl_s(d), true;
    if (!strcmp(q, "x2")) return *out = (hp_placement){HP_PL_S2, (int8_t)d}, true;
    return false;
}

static hp_status read_nplace(const char *path, const char *where, json_t *v, hp_nplace *pl, hp_err *err)
{
    memset(pl, 0, sizeof *pl);
    if (!json_is_object(v)) return fail(err, path, where, "expected a placement map {axis: placement}");
    const char *key;
    json_t *x;
    json_object_foreach(v, key, x)
    {
        int a = !strcmp(key, "tp")   ? HP_AXIS_TP
                : !strcmp(key, "cp") ? HP_AXIS_CP
                : !strcmp(key, "ep") ? HP_AXIS_EP
                                     : -1;
        if (a < 0) continue; /* an axis this version does not place on */
        if (!json_is_string(x) || !parse_placement(json_string_value(x), &pl->ax[a])) {
            char found[64], what[200];
            snprintf(what, sizeof what, "placements must be \"R\", \"P\", \"S(d)\" or \"S(d)x2\" with -8 <= d < 8, "
                     "not %s", hp__json_describe(x, found, sizeof found));
            return fail(err, path, where, what);
        }
    }
    return HP_OK;
}

static hp_status read_mesh(hp_plan *p, const char *path, json_t *root, hp_err *err)
{
    json_t *mesh = json_object_get(root, "mesh"), *dims = json_object_get(mesh, "dims");
    if (!json_is_object(mesh) || !json_is_array(dims) || json_array_size(dims) == 0)
        return fail(err, path, "mesh.dims", "missing or not a non-empty array");
    if (json_array_size(dims) > HP_MESH_MAX_DIMS)
        return fail(err, path, "mesh.dims", "more than 8 mesh axes");
    /* The dims become a --mesh spec for hp_mesh_parse, which checks axis names and sizes; a name holding
     * ',' or '=' would change the spec's items, so such names are refused first. */
    hp_buf spec;
    hp_buf_init(&spec);
    for (size_t i = 0; i < json_array_size(dims); i++) {
        json_t *d = json_array_get(dims, i), *n = json_object_get(d, "name"), *s = json_object_get(d, "size");
        char w[64];
        snprintf(w, sizeof w, "mesh.dims[%zu]", i);
        const char *what = !json_is_string(n) || !json_is_integer(s) ? "each dim needs a name and a size"
                           : !json_string_value(n)[0] || strpbrk(json_string_value(n), ",=")
                               ? "a dim name is an axis name such as \"tp\", without ',' or '='"
                               : NULL;
        if (what) {
            hp_buf_free(&spec);
            return fail(err, path, w, what);
        }
        hp_buf_printf(&spec, "%s%s=%lld", i ? "," : "", json_string_value(n), (long long)json_integer_value(s));
    }
    hp_buf_append(&spec, "", 1);
    hp_status st = spec.oom ? hp_err_set(err, HP_ERR_NOMEM, "out of memory") : hp_mesh_parse(spec.data, &p->mesh, err);
    hp_buf_free(&spec);
    if (st != HP_OK) {
        if (st == HP_ERR_INPUT) hp_err_prefix(err, "%s: mesh", path);
        return st;
    }
    /* Bounded as the shard layout bounds it, so that no product of sizes here or later can overflow. */
    int64_t world = 1;
    for (int d = 0; d < p->mesh.n_dims; d++)
        if (!hp_mul_i64(world, p->mesh.sizes[d], &world) || world > HP_SHARD_MAX_WORLD)
            return fail(err, path, "mesh.dims", "the mesh has more than 65536 ranks (rank files are numbered with "
                        "five digits)");
    json_t *ep = json_object_get(mesh, "ep"), *mode = json_object_get(mesh, "ep_mode");
    if (!json_is_integer(ep) || json_integer_value(ep) < 1 || json_integer_value(ep) > (1 << 20) ||
        !json_is_string(mode))
        return fail(err, path, "mesh", "ep must be a positive integer and ep_mode a string");
    const char *md = json_string_value(mode);
    if (!strcmp(md, "ep-axis") != p->mesh.ep_axis)
        return fail(err, path, "mesh.ep_mode", "\"ep-axis\" exactly when the mesh has an ep axis");
    if (!p->mesh.ep_axis) p->mesh.ep = json_integer_value(ep);
    p->tp = hp_mesh_size(&p->mesh, "tp");
    p->cp = hp_mesh_size(&p->mesh, "cp");
    p->ep = p->mesh.ep_axis ? hp_mesh_size(&p->mesh, "ep") : p->mesh.ep;
    json_t *mdn = json_object_get(root, "mesh_dim_names");
    if (!json_is_array(mdn) || json_array_size(mdn) > HP_AXIS_COUNT)
        return fail(err, path, "mesh_dim_names", "expected an array of at most 3 axis names");
    for (size_t i = 0; i < json_array_size(mdn); i++) {
        const char *n = json_string_value(json_array_get(mdn, i));
        int a = !n                 ? -1
                : !strcmp(n, "tp") ? HP_AXIS_TP
                : !strcmp(n, "cp") ? HP_AXIS_CP
                : !strcmp(n, "ep") ? HP_AXIS_EP
                                   : -1;
        if (a < 0) return fail(err, path, "mesh_dim_names", "axes must be \"tp\", \"cp\" or \"ep\"");
        p->dims[p->n_dims++] = (hp_axis)a;
    }
    return HP_OK;
}

static hp_status read_boundary(hp_plan *p, const char *path, size_t idx, json_t *o, hp_boundary *b, hp_err *err)
{
    char where[96];
    snprintf(where, sizeof where, "boundaries[%zu]", idx);
    json_t *fqn = json_object_get(o, "fqn"), *type = json_object_get(o, "type"), *params = json_object_get(o, "params");
    json_t *eps = json_object_get(o, "ep_size"), *stack = json_object_get(o, "ep_stack");
    if (!json_is_object(o) || !json_is_string(fqn) || !json_is_object(params))
        return fail(err, path, where, "a boundary needs a string fqn and a params object");
    if ((eps && !json_is_integer(eps)) || (stack && !json_is_object(stack)))
        return fail(err, path, where, "ep_size must be an integer and ep_stack an object");
    memset(b, 0, sizeof *b);
    b->fqn = hp_arena_strdup(&p->arena, json_string_value(fqn));
    b->type = HP_BT_UNKNOWN;
    for (int t = 0; t < HP_BT_COUNT && json_is_string(type); t++)
        if (!strcmp(hp_btype_name((hp_btype)t), json_string_value(type))) b->type = (hp_btype)t;
    b->is_boundary = true;
    b->module = -1;
    b->region_dispatch = -1;
    if (eps && (json_integer_value(eps) < 0 || json_integer_value(eps) > (1 << 20)))
        return fail(err, path, where, "ep_size out of range (0 to 1048576)");
    b->ep_size = eps ? (int)json_integer_value(eps) : 0;
    /* The EP compute declaration, so that preflight sees what the plan declared. */
    json_t *rd = json_object_get(o, "region_dispatch"), *fn = json_object_get(o, "local_compute_fn");
    if (json_is_boolean(rd)) b->region_dispatch = json_is_true(rd) ? 1 : 0;
    json_t *target = json_is_object(fn) ? json_object_get(fn, "_target_") : fn;
    if (json_is_string(target)) {
        b->local_compute_fn = hp_archetype_resolve(json_string_value(target));
        if (!b->local_compute_fn)
            return fail(err, path, where, "local_compute_fn names an unknown EP archetype");
    }
    b->params = hp_arena_alloc(&p->arena, (json_object_size(params) + 1) * sizeof *b->params);
    b->ep_stack = hp_arena_alloc(&p->arena, (json_object_size(stack) + 1) * sizeof *b->ep_stack);
    if (!b->fqn || !b->params || !b->ep_stack) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    const char *key;
    json_t *v;
    json_object_foreach(params, key, v)
    {
        hp_param_spec *ps = &b->params[b->n_params++];
        ps->rel = hp_arena_strdup(&p->arena, key);
        char w[512];
        snprintf(w, sizeof w, "%s.params.%s", where, key);
        hp_status st = read_nplace(path, w, v, &ps->pl, err);
        if (st != HP_OK) return st;
    }
    json_object_foreach(stack, key, v)
    {
        hp_ep_stack *s = &b->ep_stack[b->n_ep_stack++];
        if (!json_is_array(v) || json_array_size(v) == 0 || json_array_size(v) > (1 << 20))
            return fail(err, path, where, "ep_stack entries must be non-empty arrays of names");
        /* A stack stands for one of the boundary's params (the writer never emits another): this keeps the
         * stack-to-param matching here and in the layout linear in the plan's size. */
        if (!json_object_get(params, key)) {
            char w[512];
            snprintf(w, sizeof w, "%s.ep_stack.%s", where, key);
            return fail(err, path, w, "a stacked name must also be a key of the boundary's params");
        }
        s->name = hp_arena_strdup(&p->arena, key);
        s->n_src = (int)json_array_size(v);
        s->src = hp_arena_alloc(&p->arena, (size_t)s->n_src * sizeof *s->src);
        if (!s->name || !s->src) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        for (int e = 0; e < s->n_src; e++) {
            json_t *x = json_array_get(v, (size_t)e);
            if (!json_is_string(x)) return fail(err, path, where, "ep_stack entries must be arrays of names");
            s->src[e] = hp_arena_strdup(&p->arena, json_string_value(x));
        }
    }
    return HP_OK;
}

static const char *full_name(hp_arena *a, const char *fqn, const char *rel)
{
    return fqn[0] ? hp_arena_printf(a, "%s.%s", fqn, rel) : rel;
}

/* Lists what differs between the plan and the checkpoint; HP_ERR_INPUT when anything does. */
static hp_status compare(const hp_plan *p, hp_arena *a, const hp_model *m, const char *path, json_t *root, hp_err *err)
{
    diffs d = {.n = 0};
    hp_buf_init(&d.b);
    json_t *roles = json_object_get(root, "param_roles");
    const char *key;
    json_t *v;
    if (json_is_object(roles)) {
        json_object_foreach(roles, key, v) if (!hp_model_find_param(m, key))
            diff_add(&d, "tensor '%s' is in the plan but not in the checkpoint", key, 0, 0);
        for (size_t i = 0; i < m->n_params; i++)
            if (!json_object_get(roles, m->params[i].name))
                diff_add(&d, "tensor '%s' is in the checkpoint but not in the plan", m->params[i].name, 0, 0);
    }
    /* Every stack is a key of its boundary's params (read_boundary), so each stack is checked once, and each
     * param that is not a stack once: linear in the plan. */
    for (size_t b = 0; b < p->n_boundaries; b++) {
        const hp_boundary *bd = &p->boundaries[b];
        for (int s = 0; s < bd->n_ep_stack; s++)
            for (int e = 0; e < bd->ep_stack[s].n_src; e++) {
                const char *n = full_name(a, bd->fqn, bd->ep_stack[s].src[e]);
                if (n && !hp_model_find_param(m, n) && !json_object_get(roles, n))
                    diff_add(&d, "expert tensor '%s' is in the plan but not in the checkpoint", n, 0, 0);
            }
        json_t *stacks = json_object_get(json_array_get(json_object_get(root, "boundaries"), b), "ep_stack");
        for (int k = 0; k < bd->n_params; k++) {
            if (json_object_get(stacks, bd->params[k].rel)) continue; /* a stack: its experts are checked above */
            const char *n = full_name(a, bd->fqn, bd->params[k].rel);
            if (n && !hp_model_find_param(m, n) && !json_object_get(roles, n))
                diff_add(&d, "tensor '%s' is in the plan but not in the checkpoint", n, 0, 0);
        }
    }
    json_t *np = json_object_get(json_object_get(root, "model"), "num_params");
    long long have = (long long)hp_model_num_params(m);
    if (json_is_integer(np) && json_integer_value(np) != have)
        diff_add(&d, "%s: the plan counts %lld elements, the checkpoint %lld (some shapes differ)", "model.num_params",
                 (long long)json_integer_value(np), have);
    hp_status st = HP_OK;
    if (d.n) {
        hp_buf_append(&d.b, "", 1);
        st = hp_err_set(err, HP_ERR_INPUT,
                        "%s does not match the checkpoint %s: %d difference%s%s%s%s\nThe plan was made "
                        "for another model; run 'hyperpar plan' on this checkpoint",
                        path, m->path, d.n, d.n > 1 ? "s" : "", d.n > MAX_DIFFS ? " (the first 10)" : "",
                        d.b.data ? d.b.data : "", d.n > MAX_DIFFS ? "\n  - ..." : "");
    }
    hp_buf_free(&d.b);
    return st;
}

static hp_status read_plan(hp_plan *p, const hp_model *m, const char *path, json_t *root, hp_err *err)
{
    if (!json_is_object(root)) return fail(err, path, "(top level)", "expected an object");
    json_t *fmt = json_object_get(root, "format"), *ver = json_object_get(root, "version");
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), "hyperpar-plan") != 0)
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: \"format\" is %s%s%s, not \"hyperpar-plan\"; pass a plan written by "
                          "'hyperpar plan --format json'",
                          path, json_is_string(fmt) ? "\"" : "",
                          json_is_string(fmt) ? json_string_value(fmt) : "missing", json_is_string(fmt) ? "\"" : "");
    if (!json_is_integer(ver)) {
        char found[64];
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: \"version\" is %s, not an integer (this hyperpar reads version 1); regenerate the plan "
                          "with this hyperpar",
                          path, ver ? hp__json_describe(ver, found, sizeof found) : "missing");
    }
    if (json_integer_value(ver) != 1)
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: plan format version %lld is not supported (this hyperpar reads "
                          "version 1); regenerate the plan with this hyperpar",
                          path, (long long)json_integer_value(ver));
    hp_status st = read_mesh(p, path, root, err);
    if (st != HP_OK) return st;
    json_t *bds = json_object_get(root, "boundaries");
    if (!json_is_array(bds)) return fail(err, path, "boundaries", "missing or not an array");
    p->boundaries = hp_arena_alloc(&p->arena, (json_array_size(bds) + 1) * sizeof *p->boundaries);
    if (!p->boundaries) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < json_array_size(bds) && st == HP_OK; i++) {
        st = read_boundary(p, path, i, json_array_get(bds, i), &p->boundaries[i], err);
        if (st == HP_OK) p->n_boundaries++;
    }
    if (st == HP_OK) st = compare(p, &p->arena, m, path, root, err);
    return st;
}

hp_status hp__shard_plan_parse(hp_plan **out, const hp_model *m, const char *text, size_t len, const char *label,
                               hp_err *err)
{
    *out = NULL;
    json_t *root = NULL;
    hp_status st = hp__json_parse(text, len, label, &root, err);
    hp_plan *p = st == HP_OK ? hp_calloc(1, sizeof *p) : NULL;
    if (st == HP_OK && !p) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    if (st == HP_OK) {
        hp_arena_init(&p->arena);
        p->model = m;
        p->sequence_parallel = json_is_true(json_object_get(root, "sequence_parallel"));
        p->loss_parallel = json_is_true(json_object_get(root, "loss_parallel"));
        st = read_plan(p, m, label, root, err);
    }
    json_decref(root);
    if (st != HP_OK) {
        hp_plan_free(p);
        return st;
    }
    *out = p;
    return HP_OK;
}

hp_status hp_shard_read_plan(hp_plan **out, const hp_model *m, const char *path, char **text_out, hp_err *err)
{
    *out = NULL;
    if (text_out) *text_out = NULL;
    char *text = NULL;
    size_t len = 0;
    hp_status st = hp__read_file(path, HP_JSON_MAX_FILE, &text, &len, err);
    if (st != HP_OK) return st;
    st = hp__shard_plan_parse(out, m, text, len, path, err);
    if (st == HP_OK && text_out)
        *text_out = text;
    else
        free(text);
    return st;
}
