/*
 * plan_read.c — reads a plan JSON written by `hyperpar plan` (docs/plan-format.md, "hyperpar-plan" v1) back
 * into an hp_plan, and checks that it was made for the checkpoint at hand.
 *
 * Read: the mesh, mesh_dim_names, sequence_parallel and loss_parallel, and per boundary everything the shard
 * layout and the runtime use: fqn, type, is_boundary, params (placement maps), the I/O contracts, ep_size and
 * ep_stack, deferred biases, TP-local attributes, and the EP compute with its options. Keys this reader does not
 * know are ignored (the format's additive-change rule). The plan-vs-checkpoint check compares the plan's param_roles (every parameter
 * name), the names its boundaries and stacks use, and model.num_params (a shape that differs changes the
 * element count); the first 10 differences are listed.
 *
 * Then validate() holds the plan to what the writer (src/plan/plan_json.c) can produce and to itself, so that
 * a hand edit is either one `hyperpar plan` could have made or an error naming its JSON path: mesh.world and
 * ep_mode agree with the dims, mesh_dim_names is exactly the tp/cp/ep axes of size > 1, boundaries are
 * non-empty with unique module fqns, placement maps use only the plan's axes (an ep Shard only on an
 * EP-marked boundary of a TP-extend-EP plan) with Shard dims that fit the tensor, and no parameter is declared
 * twice. Absent optional keys stay allowed (a hand-written plan may omit what sharding does not use).
 *
 * What finalisation derives from the rest (the TP-local head counts, tp_divide_attrs, deferred biases, terminal)
 * is derived again here by the planner's own code (hp__boundary_finals) for this model and mesh: a key the plan
 * gives must equal it (else the error names boundaries[i].tp_local_attrs.NAME and the value `hyperpar plan`
 * writes), and a key it leaves out takes it, so shard, cost and run never use a figure the planner would not.
 */
#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "io/json.h"
#include "hyperpar/overrides.h"
#include "plan/planner_int.h"
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
    int64_t world = 1;
    bool world_big = false;
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
        /* Bounded as the shard layout bounds it, so that no product of sizes here or later can overflow; checked
         * before hp_mesh_parse so that the message names the shard limit. */
        int64_t v = json_integer_value(s);
        if (v >= 1 && v <= HP_MESH_MAX_SIZE && (!hp_mul_i64(world, v, &world) || world > HP_SHARD_MAX_WORLD))
            world_big = true;
    }
    if (world_big) {
        hp_buf_free(&spec);
        return fail(err, path, "mesh.dims", "the mesh has more than 65536 ranks (rank files are numbered with "
                    "five digits)");
    }
    hp_buf_append(&spec, "", 1);
    hp_status st = spec.oom ? hp_err_set(err, HP_ERR_NOMEM, "out of memory") : hp_mesh_parse(spec.data, &p->mesh, err);
    hp_buf_free(&spec);
    if (st != HP_OK) {
        if (st == HP_ERR_INPUT) hp_err_prefix(err, "%s: mesh", path);
        return st;
    }
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
    p->ep = hp_mesh_ep_size(&p->mesh);
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

/* An I/O contract {name: {axis: placement}}; null: is_null; absent: none. The shapes were checked by validate's
 * check_io only later, so this reads what it can and leaves the errors to it. */
static hp_status read_io(hp_plan *p, const char *path, const char *where, json_t *v, hp_io_map *m, hp_err *err)
{
    (void)p;
    memset(m, 0, sizeof *m);
    if (!v) return HP_OK;
    if (json_is_null(v)) {
        m->is_null = true;
        return HP_OK;
    }
    if (!json_is_object(v) || json_object_size(v) > HP_MAX_IO) return HP_OK; /* refused by check_io */
    const char *key;
    json_t *x;
    json_object_foreach(v, key, x)
    {
        if (!key[0] || strlen(key) >= sizeof m->e[0].name) return HP_OK; /* refused by check_io */
        char w[512];
        snprintf(w, sizeof w, "%s.%s", where, key);
        snprintf(m->e[m->n].name, sizeof m->e[m->n].name, "%s", key);
        hp_status st = read_nplace(path, w, x, &m->e[m->n].pl, err);
        if (st != HP_OK) return st;
        m->n++;
    }
    return HP_OK;
}

/* What the runtime executes besides the params: the I/O contracts, deferred biases, TP-local attributes and
 * the EP compute's options (the writer's shapes; check_boundary_fields refuses other types). */
static hp_status read_runtime_fields(hp_plan *p, const char *path, const char *where, json_t *o, hp_boundary *b,
                                     hp_err *err)
{
    static const char *const ios[] = {"in_src", "in_dst", "out_src", "out_dst"};
    hp_io_map *maps[] = {&b->in_src, &b->in_dst, &b->out_src, &b->out_dst};
    for (int i = 0; i < 4; i++) {
        char w[160];
        snprintf(w, sizeof w, "%s.%s", where, ios[i]);
        hp_status st = read_io(p, path, w, json_object_get(o, ios[i]), maps[i], err);
        if (st != HP_OK) return st;
    }
    json_t *v = json_object_get(o, "is_boundary");
    if (json_is_boolean(v)) b->is_boundary = json_is_true(v);
    b->terminal = json_is_true(json_object_get(o, "terminal"));
    b->needs_cp_attn = json_is_true(json_object_get(o, "needs_cp_attn"));
    json_t *db = json_object_get(o, "deferred_biases");
    if (json_is_array(db) && json_array_size(db) > 0) {
        b->deferred_biases = hp_arena_alloc(&p->arena, json_array_size(db) * sizeof *b->deferred_biases);
        if (!b->deferred_biases) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        for (size_t i = 0; i < json_array_size(db); i++) {
            json_t *x = json_array_get(db, i);
            if (!json_is_string(x)) continue; /* refused by check_boundary_fields */
            if (!(b->deferred_biases[b->n_deferred++] = hp_arena_strdup(&p->arena, json_string_value(x))))
                return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        }
    }
    json_t *ta = json_object_get(o, "tp_local_attrs");
    if (json_is_object(ta) && json_object_size(ta) > 0) {
        b->tp_attrs = hp_arena_alloc(&p->arena, json_object_size(ta) * sizeof *b->tp_attrs);
        if (!b->tp_attrs) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        const char *key;
        json_t *x;
        json_object_foreach(ta, key, x)
        {
            json_t *g = json_object_get(x, "global"), *l = json_object_get(x, "local"), *src = json_object_get(x, "source");
            bool src_ok = !src || (json_is_string(src) && (!strcmp(json_string_value(src), "auto") ||
                                                           !strcmp(json_string_value(src), "user")));
            if (!json_is_integer(g) || !json_is_integer(l) || !src_ok) {
                char w[600];
                snprintf(w, sizeof w, "%.300s.tp_local_attrs.%.200s", where, key);
                return fail(err, path, w, "expected {\"global\": N, \"local\": N, \"source\": \"auto\" or \"user\"}");
            }
            hp_tp_attr *t = &b->tp_attrs[b->n_tp_attrs++];
            t->name = hp_arena_strdup(&p->arena, key);
            t->global = json_integer_value(g);
            t->local = json_integer_value(l);
            t->user = json_is_string(src) && !strcmp(json_string_value(src), "user");
            if (!t->name) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        }
    }
    json_t *fn = json_object_get(o, "local_compute_fn");
    if (json_is_object(fn)) {
        hp_compute_opts *c = &b->compute;
        json_t *x;
        if (json_is_boolean(x = json_object_get(fn, "use_grouped_gemm")))
            c->has_use_grouped_gemm = true, c->use_grouped_gemm = json_is_true(x);
        if (json_is_boolean(x = json_object_get(fn, "overlap_shared_expert")))
            c->has_overlap_shared_expert = true, c->overlap_shared_expert = json_is_true(x);
        if (json_is_boolean(x = json_object_get(fn, "fix_router"))) c->has_fix_router = true, c->fix_router = json_is_true(x);
        if (json_is_number(x = json_object_get(fn, "capacity_factor"))) {
            double cf = json_number_value(x);
            if (!(cf > 0 && cf <= 1e6)) {
                char w[400];
                snprintf(w, sizeof w, "%.300s.local_compute_fn.capacity_factor", where);
                return fail(err, path, w, "expected a number in (0, 1e6]");
            }
            c->capacity_factor = cf;
        }
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
    hp_status rst = read_runtime_fields(p, path, where, o, b, err);
    if (rst != HP_OK) return rst;
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

/* ---- consistency: what the writer (src/plan/plan_json.c) can produce, and what agrees with itself ---- */

static int axis_of(const char *key)
{
    return !strcmp(key, "tp") ? HP_AXIS_TP : !strcmp(key, "cp") ? HP_AXIS_CP : !strcmp(key, "ep") ? HP_AXIS_EP : -1;
}

static bool in_dims(const hp_plan *p, int a)
{
    for (int i = 0; i < p->n_dims; i++)
        if ((int)p->dims[i] == a) return true;
    return false;
}

/* fail() with a formatted "what". */
static hp_status failf(hp_err *err, const char *path, const char *where, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static hp_status failf(hp_err *err, const char *path, const char *where, const char *fmt, ...)
{
    char what[HP_ERR_MSG_MAX / 2];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return fail(err, path, where, what);
}

/* One placement map (a param's when ndim >= 0, else an I/O entry's): its axes are tp, cp and ep only, and
 * only those the writer keeps (plan.c normalise): an axis of mesh_dim_names, or an ep Shard of a TP-extend-EP
 * plan, which for a param needs an EP-marked boundary. "S(d)x2" is a tp placement; d fits the tensor. */
static hp_status check_map(const hp_plan *p, const hp_boundary *b, const char *path, const char *where, json_t *map,
                           bool param, int ndim, hp_err *err)
{
    if (!json_is_object(map)) return fail(err, path, where, "expected a placement map {axis: placement}");
    hp_nplace pl;
    hp_status st = read_nplace(path, where, map, &pl, err);
    if (st != HP_OK) return st;
    const char *key;
    json_t *v;
    json_object_foreach(map, key, v)
    {
        int a = axis_of(key);
        if (a < 0)
            return failf(err, path, where, "unknown axis '%.40s' in a placement map; plans place on tp, cp and ep "
                         "only (dp and pp never appear)", key);
        hp_placement x = pl.ax[a];
        bool ep_extend = a == HP_AXIS_EP && !p->mesh.ep_axis && p->ep > 1;
        if (!in_dims(p, a) && !ep_extend)
            return a == HP_AXIS_EP
                       ? failf(err, path, where, "an 'ep' placement, but the plan has no expert parallelism "
                               "(mesh.ep is %lld%s)", (long long)p->ep,
                               p->mesh.ep_axis ? " on its ep axis" : ", ep_mode \"none\"")
                       : failf(err, path, where, "a '%s' placement, but '%s' is not in mesh_dim_names (its mesh "
                               "size is %lld); placements use the plan's axes only", key, key,
                               (long long)hp_mesh_size(&p->mesh, key));
        if (x.kind == HP_PL_S2 && a != HP_AXIS_TP)
            return failf(err, path, where, "\"S(d)x2\" (packed fused halves) is a tp placement, not a %s one", key);
        if (ep_extend && x.kind != HP_PL_S)
            return fail(err, path, where, "an 'ep' placement other than S(d) on a TP-extend-EP plan (ep_mode "
                        "\"tp-extend-ep\"); only expert-sharded tensors carry ep there");
        if (ep_extend && param && b->ep_size == 0)
            return fail(err, path, where, "an 'ep' Shard on a boundary whose ep_size is 0; an EP-marked boundary "
                        "has ep_size equal to mesh.ep");
        if ((x.kind == HP_PL_S || x.kind == HP_PL_S2) && ndim >= 0 && (x.dim < -ndim || x.dim >= ndim))
            return failf(err, path, where, "%s placement S(%d) is out of range for a %d-dim tensor (dims %d to %d)",
                         key, x.dim, ndim, -ndim, ndim - 1);
    }
    return HP_OK;
}

static hp_status check_io(const hp_plan *p, const hp_boundary *b, const char *path, const char *where, json_t *io,
                          bool nullable, hp_err *err)
{
    if (!io || (nullable && json_is_null(io))) return HP_OK;
    if (!json_is_object(io) || json_object_size(io) > HP_MAX_IO)
        return failf(err, path, where, "expected %s{name: {axis: placement}} with at most %d names",
                     nullable ? "null or " : "", HP_MAX_IO);
    const char *key;
    json_t *v;
    json_object_foreach(io, key, v)
    {
        char w[512];
        snprintf(w, sizeof w, "%.200s.%.200s", where, key);
        if (!key[0] || strlen(key) >= sizeof b->in_src.e[0].name)
            return failf(err, path, w, "I/O names are 1 to %zu characters", sizeof b->in_src.e[0].name - 1);
        hp_status st = check_map(p, b, path, w, v, false, -1, err);
        if (st != HP_OK) return st;
    }
    return HP_OK;
}

/* The fields the reader does not use still have the writer's types (a hand edit that breaks them is refused
 * rather than half-read). Absent fields are allowed: a hand-written plan may omit what sharding does not use. */
static hp_status check_boundary_fields(const hp_plan *p, const hp_boundary *b, const char *path, const char *where,
                                       json_t *o, hp_err *err)
{
    static const char *const bools[] = {"is_boundary", "terminal", "needs_cp_attn"};
    char w[160];
    for (size_t i = 0; i < sizeof bools / sizeof *bools; i++) {
        json_t *v = json_object_get(o, bools[i]);
        snprintf(w, sizeof w, "%s.%s", where, bools[i]);
        if (v && !json_is_boolean(v)) return fail(err, path, w, "expected true or false");
    }
    json_t *t = json_object_get(o, "type");
    snprintf(w, sizeof w, "%s.type", where);
    if (t && (!json_is_string(t) || b->type == HP_BT_UNKNOWN) &&
        !(json_is_string(t) && !strcmp(json_string_value(t), hp_btype_name(HP_BT_UNKNOWN))))
        return fail(err, path, w, "not a boundary type (attention, linear_attention, mlp, norm, embed, lm_head, "
                    "moe_gate, moe_mlp, unknown, custom)");
    json_t *rd = json_object_get(o, "region_dispatch");
    snprintf(w, sizeof w, "%s.region_dispatch", where);
    if (rd && !json_is_boolean(rd) && !json_is_null(rd)) return fail(err, path, w, "expected true, false or null");
    json_t *fn = json_object_get(o, "local_compute_fn");
    snprintf(w, sizeof w, "%s.local_compute_fn", where);
    if (fn && !json_is_null(fn) && !json_is_string(fn) &&
        !(json_is_object(fn) && json_is_string(json_object_get(fn, "_target_"))))
        return fail(err, path, w, "expected null or {\"_target_\": ARCHETYPE, options...}");
    static const char *const ios[] = {"in_src", "in_dst", "out_src", "out_dst"};
    for (int i = 0; i < 4; i++) {
        snprintf(w, sizeof w, "%s.%s", where, ios[i]);
        hp_status st = check_io(p, b, path, w, json_object_get(o, ios[i]), i >= 2, err);
        if (st != HP_OK) return st;
    }
    json_t *db = json_object_get(o, "deferred_biases"), *ta = json_object_get(o, "tp_local_attrs");
    bool ok = !db || json_is_array(db);
    for (size_t i = 0; ok && i < json_array_size(db); i++) ok = json_is_string(json_array_get(db, i));
    snprintf(w, sizeof w, "%s.deferred_biases", where);
    if (!ok) return fail(err, path, w, "expected an array of parameter names");
    snprintf(w, sizeof w, "%s.tp_local_attrs", where);
    if (ta && !json_is_object(ta)) return fail(err, path, w, "expected an object {attribute: {global, local, source}}");
    return HP_OK;
}

typedef struct owned {
    const char *name; /* full parameter name */
    size_t b;         /* boundary index */
} owned;

static int owned_cmp(const void *x, const void *y)
{
    const owned *a = x, *b = y;
    int c = strcmp(a->name, b->name);
    return c ? c : (a->b > b->b) - (a->b < b->b);
}

/* Every parameter (or stacked expert) is declared by one boundary, and the boundaries declare at least one. */
static hp_status check_ownership(const hp_plan *p, json_t *bds, bool complete, const char *path, hp_err *err)
{
    size_t n = 0;
    for (size_t b = 0; b < p->n_boundaries; b++) {
        const hp_boundary *bd = &p->boundaries[b];
        n += (size_t)bd->n_params;
        for (int s = 0; s < bd->n_ep_stack; s++) n += (size_t)bd->ep_stack[s].n_src;
    }
    if (n == 0)
        return fail(err, path, "boundaries", "no boundary declares a parameter; the plan would shard nothing");
    owned *o = malloc(n * sizeof *o);
    if (!o) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    hp_arena a;
    hp_arena_init(&a);
    size_t k = 0;
    bool oom = false;
    for (size_t b = 0; b < p->n_boundaries; b++) {
        const hp_boundary *bd = &p->boundaries[b];
        json_t *stacks = json_object_get(json_array_get(bds, b), "ep_stack"); /* hashed: linear in the plan */
        for (int i = 0; i < bd->n_params; i++)
            if (!json_object_get(stacks, bd->params[i].rel))
                o[k++] = (owned){full_name(&a, bd->fqn, bd->params[i].rel), b};
        for (int s = 0; s < bd->n_ep_stack; s++)
            for (int e = 0; e < bd->ep_stack[s].n_src; e++)
                o[k++] = (owned){full_name(&a, bd->fqn, bd->ep_stack[s].src[e]), b};
    }
    for (size_t i = 0; i < k; i++) oom |= o[i].name == NULL;
    hp_status st = oom ? hp_err_set(err, HP_ERR_NOMEM, "out of memory") : HP_OK;
    if (st == HP_OK) qsort(o, k, sizeof *o, owned_cmp);
    for (size_t i = 1; st == HP_OK && i < k; i++)
        if (!strcmp(o[i - 1].name, o[i].name)) {
            char w[64];
            snprintf(w, sizeof w, "boundaries[%zu]", o[i].b);
            st = o[i].b == o[i - 1].b
                     ? failf(err, path, w, "parameter '%.300s' is declared twice by this boundary ('%.200s'); each "
                             "parameter belongs to exactly one boundary", o[i].name, p->boundaries[o[i].b].fqn)
                     : failf(err, path, w, "parameter '%.300s' is declared by this boundary ('%.200s') and by "
                             "boundaries[%zu] ('%.200s'); each parameter belongs to exactly one boundary", o[i].name,
                             p->boundaries[o[i].b].fqn, o[i - 1].b, p->boundaries[o[i - 1].b].fqn);
        }
    /* A plan `hyperpar plan` wrote (it lists every parameter in param_roles) gives every trainable parameter a
     * boundary, unless made with --allow-uncovered: a deleted boundary would otherwise leave its parameters
     * silently replicated. A hand-written plan without param_roles declares only what it shards. o is sorted. */
    for (size_t i = 0; st == HP_OK && complete && !p->allow_uncovered && i < p->model->n_params; i++) {
        const hp_param *q = &p->model->params[i];
        if (!q->trainable) continue;
        owned key = {q->name, 0};
        size_t lo = 0, hi = k;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (strcmp(o[mid].name, key.name) < 0) lo = mid + 1;
            else hi = mid;
        }
        if (lo == k || strcmp(o[lo].name, q->name) != 0)
            st = failf(err, path, "boundaries", "parameter '%.300s' is declared by no boundary (was a boundary "
                       "removed?); every trainable parameter belongs to one, unless the plan was made with "
                       "--allow-uncovered (\"allow_uncovered_params\": true)", q->name);
    }
    hp_arena_free(&a);
    free(o);
    return st;
}

/* A module has at most one boundary: sorted, so that a plan of many boundaries stays fast. */
static hp_status check_unique_fqns(const hp_plan *p, const char *path, hp_err *err)
{
    owned *o = malloc((p->n_boundaries ? p->n_boundaries : 1) * sizeof *o);
    if (!o) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < p->n_boundaries; i++) o[i] = (owned){p->boundaries[i].fqn, i};
    qsort(o, p->n_boundaries, sizeof *o, owned_cmp);
    hp_status st = HP_OK;
    for (size_t i = 1; st == HP_OK && i < p->n_boundaries; i++)
        if (!strcmp(o[i - 1].name, o[i].name)) {
            char where[64];
            snprintf(where, sizeof where, "boundaries[%zu]", o[i].b);
            st = failf(err, path, where, "fqn '%.300s' is also the fqn of boundaries[%zu]; a module has at most one "
                       "boundary", o[i].name, o[i - 1].b);
        }
    free(o);
    return st;
}

static const hp_tp_attr *find_attr(const hp_tp_attr *a, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(a[i].name, name)) return &a[i];
    return NULL;
}

static bool has_str(const char *const *a, int n, const char *s)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(a[i], s)) return true;
    return false;
}

/* What finalisation derives from the boundary's params and contracts, the mesh and the model
 * (hp__boundary_finals, the planner's own code): the TP-local attributes and the deferred biases. A key the plan
 * gives must hold exactly what `hyperpar plan` writes; a key it leaves out takes the derived value, so that the
 * runtime and cost never compute with a head count or a bias placement the planner would not have chosen. */
static hp_status check_finals(hp_plan *p, size_t i, json_t *o, const char *path, hp_err *err)
{
    hp_boundary *b = &p->boundaries[i], d;
    char where[64], w[600];
    snprintf(where, sizeof where, "boundaries[%zu]", i);
    hp_err e = {0};
    hp_status st = hp__boundary_finals(p, b, &d, &e);
    if (st == HP_ERR_NOMEM) return hp_err_set(err, st, "%s", e.msg);
    if (st != HP_OK) {
        snprintf(w, sizeof w, "%s.tp_local_attrs", where);
        return failf(err, path, json_object_get(o, "tp_local_attrs") && strstr(e.msg, "tp_divide_attrs") ? w : where,
                     "%s", e.msg);
    }
    const long long tp = (long long)p->tp;
    if (json_object_get(o, "tp_local_attrs")) {
        for (int k = 0; k < b->n_tp_attrs; k++) {
            const hp_tp_attr *t = &b->tp_attrs[k], *x = find_attr(d.tp_attrs, d.n_tp_attrs, t->name);
            snprintf(w, sizeof w, "%s.tp_local_attrs.%.400s", where, t->name);
            if (!x)
                return failf(err, path, w, "{global %lld, local %lld}, but hyperpar plan writes no '%.200s' for this "
                             "boundary at tp=%lld (the TP-local head counts belong to attention boundaries whose "
                             "q/k/v weights are split over tp along dim 0, and only when tp divides them)",
                             (long long)t->global, (long long)t->local, t->name, tp);
            if (x->global != t->global || x->local != t->local)
                return failf(err, path, w, "{global %lld, local %lld}, but hyperpar plan writes {global %lld, local "
                             "%lld} for this model at tp=%lld (global: config.json's value; local: global / tp)",
                             (long long)t->global, (long long)t->local, (long long)x->global, (long long)x->local, tp);
        }
        for (int k = 0; k < d.n_tp_attrs; k++)
            if (!find_attr(b->tp_attrs, b->n_tp_attrs, d.tp_attrs[k].name)) {
                snprintf(w, sizeof w, "%s.tp_local_attrs", where);
                return failf(err, path, w, "'%s' is missing; hyperpar plan writes {global %lld, local %lld} for this "
                             "model at tp=%lld (the runtime would otherwise run every head on each rank's slice)",
                             d.tp_attrs[k].name, (long long)d.tp_attrs[k].global, (long long)d.tp_attrs[k].local, tp);
            }
    }
    b->n_tp_attrs = d.n_tp_attrs;
    b->tp_attrs = d.tp_attrs;
    if (json_object_get(o, "deferred_biases")) {
        snprintf(w, sizeof w, "%s.deferred_biases", where);
        for (int k = 0; k < b->n_deferred; k++)
            if (!has_str(d.deferred_biases, d.n_deferred, b->deferred_biases[k]))
                return failf(err, path, w, "'%.300s' is not a bias hyperpar plan defers here (only the bias of a "
                             "weight split over tp along its input dim, under a Partial output, is added after the "
                             "reduction)", b->deferred_biases[k]);
        for (int k = 0; k < d.n_deferred; k++)
            if (!has_str(b->deferred_biases, b->n_deferred, d.deferred_biases[k]))
                return failf(err, path, w, "'%.300s' is missing; hyperpar plan defers it (its weight is split over "
                             "tp along its input dim, so the bias is added once, after the reduction)",
                             d.deferred_biases[k]);
        if (b->n_deferred != d.n_deferred)
            return fail(err, path, w, "a bias is listed twice");
    }
    b->n_deferred = d.n_deferred;
    b->deferred_biases = d.deferred_biases;
    return HP_OK;
}

static hp_status check_boundary(hp_plan *p, const hp_model *m, const char *path, size_t i, json_t *o,
                                hp_err *err)
{
    const hp_boundary *b = &p->boundaries[i];
    char where[64], w[600];
    snprintf(where, sizeof where, "boundaries[%zu]", i);
    if (b->fqn[0] && hp_model_find_module(m, b->fqn) < 0)
        return failf(err, path, where, "fqn '%.300s' is not a module of the checkpoint %.300s", b->fqn, m->path);
    if (b->ep_size && (p->mesh.ep_axis || b->ep_size != p->ep))
        return failf(err, path, where, "ep_size %d, but %s; an EP-marked boundary of a TP-extend-EP plan has ep_size "
                     "= mesh.ep, every other boundary 0", b->ep_size,
                     p->mesh.ep_axis ? "the plan uses an ep mesh axis (ep_mode \"ep-axis\")" : "mesh.ep differs");
    if (b->n_ep_stack && p->ep <= 1)
        return fail(err, path, where, "ep_stack, but the plan has no expert parallelism (mesh.ep is 1)");
    hp_status st = check_boundary_fields(p, b, path, where, o, err);
    for (int k = 0; st == HP_OK && k < b->n_params; k++) {
        const hp_param_spec *ps = &b->params[k];
        snprintf(w, sizeof w, "%s.params.%.400s", where, ps->rel);
        int ndim = -1;
        json_t *stack = json_object_get(json_object_get(o, "ep_stack"), ps->rel); /* hashed, not a scan */
        const char *member = stack ? json_string_value(json_array_get(stack, 0)) : ps->rel;
        const char *full = full_name((hp_arena *)&p->arena, b->fqn, member);
        const hp_param *par = full ? hp_model_find_param(m, full) : NULL;
        if (!full) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        if (par) ndim = par->n_dims + (stack ? 1 : 0);
        if (!ps->rel[0]) return fail(err, path, w, "an empty parameter name");
        if (stack && full && hp_model_find_param(m, full_name((hp_arena *)&p->arena, b->fqn, ps->rel)))
            return fail(err, path, w, "a stacked name that is also a tensor of the checkpoint");
        st = check_map(p, b, path, w, json_object_get(json_object_get(o, "params"), ps->rel), true, ndim, err);
        if (st == HP_OK && stack) {
            hp_placement e = ps->pl.ax[HP_AXIS_EP];
            if (e.kind != HP_PL_S || (e.dim != 0 && e.dim != -ndim))
                st = fail(err, path, w, "a stack of experts is split over ep along its expert dim: its ep placement "
                          "must be S(0)");
            else if (json_array_size(stack) % (size_t)p->ep)
                st = failf(err, path, w, "%zu stacked experts do not split over ep=%lld", json_array_size(stack),
                           (long long)p->ep);
        }
    }
    return st;
}

/* After compare(): the plan is for this checkpoint; now it must agree with itself, field by field. */
/* The pipeline's stages (plan_json.c's "pipeline"): present exactly when the mesh has a pp axis of size > 1, its
 * outermost; each stage's rank block and chunks as hp_pipeline_split lays them out, the counts checked by it. */
static hp_status read_pipeline(hp_plan *p, const hp_model *m, const char *path, json_t *root, hp_err *err)
{
    int64_t pp = hp_mesh_size(&p->mesh, "pp"), L = m->cfg.num_hidden_layers;
    json_t *pj = json_object_get(root, "pipeline");
    if (pp <= 1) {
        if (pj) return fail(err, path, "pipeline", "present, but the mesh has no pp axis of size > 1");
        return hp_pipeline_split(&p->pipe, L, 1, 1, NULL, 0, &p->arena, err);
    }
    if (strcmp(p->mesh.names[0], "pp"))
        return fail(err, path, "mesh.dims", "pp is not the first (outermost) axis; hyperpar orders pp outermost");
    json_t *stages = json_object_get(pj, "stages"), *v = json_object_get(pj, "virtual");
    if (!json_is_object(pj) || !json_is_integer(json_object_get(pj, "pp")) || !json_is_integer(v) ||
        !json_is_array(stages))
        return fail(err, path, "pipeline", "missing or not {\"pp\", \"virtual\", \"stages\": [...]} (the mesh has a pp axis)");
    if (json_integer_value(json_object_get(pj, "pp")) != pp || (int64_t)json_array_size(stages) != pp)
        return failf(err, path, "pipeline", "pp or its stages are not the mesh's pp=%lld", (long long)pp);
    int64_t virt = json_integer_value(v), per = hp_mesh_world(&p->mesh) / pp;
    if (virt < 1 || virt > HP_MESH_MAX_SIZE || pp * virt > (1 << 20))
        return fail(err, path, "pipeline.virtual", "not a count of virtual stages in [1, 2^20 / pp]");
    int64_t n = pp * virt, *counts = hp_arena_alloc(&p->arena, (size_t)n * sizeof *counts), *firsts = hp_arena_alloc(&p->arena, (size_t)n * sizeof *firsts);
    if (!counts || !firsts) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    for (int64_t s = 0; s < pp; s++) {
        json_t *st = json_array_get(stages, (size_t)s), *ch = json_object_get(st, "chunks"), *rk = json_object_get(st, "ranks");
        char w[64];
        snprintf(w, sizeof w, "pipeline.stages[%lld]", (long long)s);
        if (json_integer_value(json_object_get(st, "stage")) != s || !json_is_array(ch) ||
            (int64_t)json_array_size(ch) != virt || json_integer_value(json_array_get(rk, 0)) != s * per ||
            json_integer_value(json_array_get(rk, 1)) != (s + 1) * per)
            return failf(err, path, w, "not stage %lld of ranks [%lld, %lld) with %lld chunks", (long long)s,
                         (long long)(s * per), (long long)((s + 1) * per), (long long)virt);
        for (int64_t k = 0; k < virt; k++) {
            json_t *c = json_array_get(ch, (size_t)k), *f = json_object_get(c, "first_layer"), *l = json_object_get(c, "layers");
            int64_t ci = s + k * pp;
            if (json_integer_value(json_object_get(c, "chunk")) != ci || !json_is_integer(f) || !json_is_integer(l))
                return failf(err, path, w, "chunk %lld: expected {\"chunk\": %lld, \"first_layer\", \"layers\"}",
                             (long long)k, (long long)ci);
            counts[ci] = json_integer_value(l), firsts[ci] = json_integer_value(f);
        }
    }
    hp_err e;
    if (hp_pipeline_split(&p->pipe, L, pp, virt, counts, (int)n, &p->arena, &e) != HP_OK)
        return fail(err, path, "pipeline", e.msg);
    for (int64_t c = 0; c < n; c++)
        if (p->pipe.first[c] != firsts[c])
            return failf(err, path, "pipeline", "chunk %lld starts at layer %lld, but the chunks before it hold %lld "
                         "layers; the chunks are contiguous", (long long)c, (long long)firsts[c],
                         (long long)p->pipe.first[c]);
    p->pipe.given = json_is_true(json_object_get(pj, "layers_given"));
    return HP_OK;
}

static hp_status validate(hp_plan *p, const hp_model *m, const char *path, json_t *root, hp_err *err)
{
    static const char *const flags[] = {"sequence_parallel", "loss_parallel", "allow_uncovered_params"};
    for (int i = 0; i < 3; i++) {
        json_t *v = json_object_get(root, flags[i]);
        if (v && !json_is_boolean(v)) return fail(err, path, flags[i], "expected true or false");
    }
    json_t *model = json_object_get(root, "model"), *roles = json_object_get(root, "param_roles");
    if (model && !json_is_object(model)) return fail(err, path, "model", "expected an object");
    json_t *nt = json_object_get(model, "num_tensors"), *np = json_object_get(model, "num_params");
    if ((nt && !json_is_integer(nt)) || (np && !json_is_integer(np)))
        return fail(err, path, "model", "num_params and num_tensors are integers");
    if (nt && json_integer_value(nt) != (json_int_t)m->n_params)
        return failf(err, path, "model.num_tensors", "the plan counts %lld tensors, the checkpoint %zu; the plan was "
                     "made for another model", (long long)json_integer_value(nt), m->n_params);
    if (roles && !json_is_object(roles)) return fail(err, path, "param_roles", "expected an object {param: ROLE}");
    const char *key;
    json_t *v;
    json_object_foreach(roles, key, v)
    {
        bool ok = false;
        for (int r = 0; r < HP_ROLE_COUNT && json_is_string(v); r++)
            ok |= !strcmp(json_string_value(v), hp_role_name((hp_role)r));
        if (!ok) {
            char w[400];
            snprintf(w, sizeof w, "param_roles.%.300s", key);
            return fail(err, path, w, "not a role name (COLWISE, ROWWISE, NORM, EMBED, ...)");
        }
    }
    static const char *const lists[] = {"tied_pairs", "warnings"};
    for (int i = 0; i < 2; i++) {
        json_t *l = json_object_get(root, lists[i]);
        if (l && !json_is_array(l)) return fail(err, path, lists[i], "expected an array");
    }
    json_t *sh = json_object_get(root, "special_handlers");
    if (sh && !json_is_object(sh)) return fail(err, path, "special_handlers", "expected an object {param: handler}");

    /* The mesh: world, the EP mode, and mesh_dim_names as plan.c's setup_mesh derives them. */
    json_t *mesh = json_object_get(root, "mesh"), *w = json_object_get(mesh, "world");
    int64_t world = hp_mesh_world(&p->mesh);
    if (w && (!json_is_integer(w) || json_integer_value(w) != world))
        return failf(err, path, "mesh.world", "%s%lld, but the product of mesh.dims sizes is %lld; the world size "
                     "is that product", json_is_integer(w) ? "" : "not an integer: ",
                     json_is_integer(w) ? (long long)json_integer_value(w) : 0LL, (long long)world);
    hp_status pst = read_pipeline(p, m, path, root, err);
    if (pst != HP_OK) return pst;
    const char *mode = json_string_value(json_object_get(mesh, "ep_mode"));
    int64_t ep_json = json_integer_value(json_object_get(mesh, "ep"));
    if (p->mesh.ep_axis && ep_json != p->ep)
        return failf(err, path, "mesh.ep", "%lld, but the ep mesh axis has size %lld; they are the same number",
                     (long long)ep_json, (long long)p->ep);
    if (!p->mesh.ep_axis && strcmp(mode, p->ep > 1 ? "tp-extend-ep" : "none") != 0)
        return failf(err, path, "mesh.ep_mode", "\"%.40s\" with ep %lld and no ep axis; it is \"%s\"", mode,
                     (long long)p->ep, p->ep > 1 ? "tp-extend-ep" : "none");
    if (!p->mesh.ep_axis && p->ep > 1 && world % p->ep)
        return failf(err, path, "mesh.ep", "ep %lld does not divide the dense region (world %lld); TP-extend-EP groups "
                     "are ep consecutive ranks", (long long)p->ep, (long long)world);
    if (p->ep > 1 && (m->cfg.n_experts <= 0 || m->cfg.n_experts % p->ep))
        return failf(err, path, "mesh.ep", "ep %lld, but the checkpoint has %lld routed experts; ep must divide the "
                     "expert count", (long long)p->ep, (long long)m->cfg.n_experts);
    int n_expect = 0;
    hp_axis expect[HP_AXIS_COUNT];
    for (int d = 0; d < p->mesh.n_dims; d++) {
        int a = axis_of(p->mesh.names[d]);
        if (a >= 0 && p->mesh.sizes[d] > 1 && n_expect < HP_AXIS_COUNT) expect[n_expect++] = (hp_axis)a;
    }
    bool same = n_expect == p->n_dims;
    for (int i = 0; same && i < n_expect; i++) same = expect[i] == p->dims[i];
    if (!same) {
        char want[32] = "", got[32] = "";
        for (int i = 0; i < n_expect; i++) snprintf(want + strlen(want), 8, "%s%s", i ? "," : "", hp_axis_name(expect[i]));
        for (int i = 0; i < p->n_dims; i++) snprintf(got + strlen(got), 8, "%s%s", i ? "," : "", hp_axis_name(p->dims[i]));
        return failf(err, path, "mesh_dim_names", "[%s], but the mesh's tp/cp/ep axes of size > 1, in mesh order, are "
                     "[%s]; mesh_dim_names lists exactly those", got, want);
    }

    json_t *bds = json_object_get(root, "boundaries");
    if (p->n_boundaries == 0)
        return fail(err, path, "boundaries", "empty; a plan without boundaries shards nothing");
    hp_status st = check_unique_fqns(p, path, err);
    for (size_t i = 0; st == HP_OK && i < p->n_boundaries; i++) st = check_boundary(p, m, path, i, json_array_get(bds, i), err);
    if (st == HP_OK) st = check_ownership(p, bds, roles != NULL, path, err);
    for (size_t i = 0; st == HP_OK && i < p->n_boundaries; i++) st = check_finals(p, i, json_array_get(bds, i), path, err);
    /* terminal: the last real boundary (lints.c terminal()); a plan that says otherwise was edited. */
    size_t last = p->n_boundaries;
    for (size_t i = 0; i < p->n_boundaries; i++)
        if (p->boundaries[i].is_boundary) last = i;
    for (size_t i = 0; st == HP_OK && i < p->n_boundaries; i++) {
        json_t *t = json_object_get(json_array_get(bds, i), "terminal");
        char tw[64];
        snprintf(tw, sizeof tw, "boundaries[%zu].terminal", i);
        if (t && json_is_true(t) != (i == last))
            st = failf(err, path, tw, "%s, but %s; terminal marks the last boundary with is_boundary true",
                       json_is_true(t) ? "true" : "false",
                       last == p->n_boundaries ? "no boundary has is_boundary true"
                       : i == last             ? "this is the last boundary with is_boundary true"
                                               : "a later boundary has is_boundary true");
        p->boundaries[i].terminal = i == last;
    }
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
    if (st == HP_OK) st = validate(p, m, path, root, err);
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
        p->allow_uncovered = json_is_true(json_object_get(root, "allow_uncovered_params"));
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
