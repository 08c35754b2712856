/*
 * plan_json.c — the plan as versioned JSON ("hyperpar-plan", version 1); docs/plan-format.md is the
 * reference for every field.
 *
 *   {
 *     "format": "hyperpar-plan", "version": 1,
 *     "model": {...}, "mesh": {...}, "mesh_dim_names": [...],
 *     "sequence_parallel": b, "loss_parallel": b,
 *     "boundaries": [ {fqn, type, ..., params, in_src, in_dst, out_src, out_dst, ep_*, ...}, ... ],
 *     "special_handlers": {...}, "tied_pairs": [[a, b]], "param_roles": {...}, "warnings": [...]
 *   }
 *
 * Invariants: the same plan gives the same bytes. Every object is built key by key in a fixed order
 * and dumped with JSON_PRESERVE_ORDER, boundaries in forward order, params in boundary order,
 * param_roles in model order; nothing depends on hashing, addresses or the clock.
 *
 * Placement maps hold only the axes the plan works on, as the explain report does (spec §1.5): when
 * mesh_dim_names is non-empty, the axes in it plus "ep" (D-10 expert parameters carry an ep key although
 * ep is not a mesh dim of the dense region); when it is empty, every axis present. Axis order tp, cp, ep.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "plan/planner.h"

/* Builder state: ok turns false on the first allocation failure, so one check at the end suffices. */
typedef struct jb {
    bool ok;
} jb;

static json_t *jb_chk(jb *b, json_t *v)
{
    if (!v) b->ok = false;
    return v;
}

static void jb_set(jb *b, json_t *obj, const char *key, json_t *v)
{
    if (json_object_set_new(obj, key, v) != 0) b->ok = false; /* frees v when obj is NULL */
}

static void jb_push(jb *b, json_t *arr, json_t *v)
{
    if (json_array_append_new(arr, v) != 0) b->ok = false;
}

static json_t *jb_str(jb *b, const char *s) { return jb_chk(b, json_string(s ? s : "")); }
static json_t *jb_int(jb *b, int64_t v) { return jb_chk(b, json_integer((json_int_t)v)); }
static json_t *jb_obj(jb *b) { return jb_chk(b, json_object()); }
static json_t *jb_arr(jb *b) { return jb_chk(b, json_array()); }

/* Whether axis a of a placement map is written (see the file header). */
static bool axis_visible(const hp_plan *p, hp_axis a)
{
    if (p->n_dims == 0 || a == HP_AXIS_EP) return true;
    for (int i = 0; i < p->n_dims; i++)
        if (p->dims[i] == a) return true;
    return false;
}

static json_t *nplace_json(jb *b, const hp_plan *p, const hp_nplace *np)
{
    json_t *o = jb_obj(b);
    for (int a = 0; a < HP_AXIS_COUNT; a++) {
        if (np->ax[a].kind == HP_PL_ABSENT || !axis_visible(p, (hp_axis)a)) continue;
        char buf[16];
        jb_set(b, o, hp_axis_name((hp_axis)a), jb_str(b, hp_placement_str(np->ax[a], buf, sizeof buf)));
    }
    return o;
}

static json_t *io_json(jb *b, const hp_plan *p, const hp_io_map *m)
{
    if (m->is_null) return jb_chk(b, json_null());
    json_t *o = jb_obj(b);
    for (int i = 0; i < m->n && i < HP_MAX_IO; i++) jb_set(b, o, m->e[i].name, nplace_json(b, p, &m->e[i].pl));
    return o;
}

static json_t *boundary_json(jb *b, const hp_plan *p, const hp_boundary *bd)
{
    json_t *o = jb_obj(b);
    jb_set(b, o, "fqn", jb_str(b, bd->fqn));
    jb_set(b, o, "type", jb_str(b, hp_btype_name(bd->type)));
    jb_set(b, o, "is_boundary", jb_chk(b, json_boolean(bd->is_boundary)));
    jb_set(b, o, "terminal", jb_chk(b, json_boolean(bd->terminal)));

    json_t *params = jb_obj(b);
    for (int i = 0; i < bd->n_params; i++)
        jb_set(b, params, bd->params[i].rel, nplace_json(b, p, &bd->params[i].pl));
    jb_set(b, o, "params", params);

    jb_set(b, o, "in_src", io_json(b, p, &bd->in_src));
    jb_set(b, o, "in_dst", io_json(b, p, &bd->in_dst));
    jb_set(b, o, "out_src", io_json(b, p, &bd->out_src));
    jb_set(b, o, "out_dst", io_json(b, p, &bd->out_dst));
    jb_set(b, o, "ep_size", jb_int(b, bd->ep_size));

    json_t *stack = jb_obj(b);
    for (int i = 0; i < bd->n_ep_stack; i++) {
        const hp_ep_stack *s = &bd->ep_stack[i];
        json_t *srcs = jb_arr(b);
        for (int j = 0; j < s->n_src; j++) jb_push(b, srcs, jb_str(b, s->src[j]));
        jb_set(b, stack, s->name, srcs);
    }
    jb_set(b, o, "ep_stack", stack);

    json_t *deferred = jb_arr(b);
    for (int i = 0; i < bd->n_deferred; i++) jb_push(b, deferred, jb_str(b, bd->deferred_biases[i]));
    jb_set(b, o, "deferred_biases", deferred);

    json_t *attrs = jb_obj(b);
    for (int i = 0; i < bd->n_tp_attrs; i++) {
        const hp_tp_attr *t = &bd->tp_attrs[i];
        json_t *a = jb_obj(b);
        jb_set(b, a, "global", jb_int(b, t->global));
        jb_set(b, a, "local", jb_int(b, t->local));
        jb_set(b, a, "source", jb_str(b, t->user ? "user" : "auto"));
        jb_set(b, attrs, t->name, a);
    }
    jb_set(b, o, "tp_local_attrs", attrs);

    if (bd->local_compute_fn) {
        /* {"_target_": archetype, options...}: the YAML override's shape, only the options that were set. */
        json_t *fn = jb_obj(b);
        jb_set(b, fn, "_target_", jb_str(b, bd->local_compute_fn));
        const hp_compute_opts *c = &bd->compute;
        if (c->has_use_grouped_gemm) jb_set(b, fn, "use_grouped_gemm", jb_chk(b, json_boolean(c->use_grouped_gemm)));
        if (c->has_overlap_shared_expert)
            jb_set(b, fn, "overlap_shared_expert", jb_chk(b, json_boolean(c->overlap_shared_expert)));
        if (c->has_fix_router) jb_set(b, fn, "fix_router", jb_chk(b, json_boolean(c->fix_router)));
        if (c->capacity_factor > 0) jb_set(b, fn, "capacity_factor", jb_chk(b, json_real(c->capacity_factor)));
        jb_set(b, o, "local_compute_fn", fn);
    } else {
        jb_set(b, o, "local_compute_fn", jb_chk(b, json_null()));
    }
    jb_set(b, o, "region_dispatch",
           bd->region_dispatch < 0 ? jb_chk(b, json_null()) : jb_chk(b, json_boolean(bd->region_dispatch > 0)));
    jb_set(b, o, "needs_cp_attn", jb_chk(b, json_boolean(bd->needs_cp_attn)));
    return o;
}

static json_t *model_json(jb *b, const hp_model *m)
{
    if (!m) return jb_chk(b, json_null());
    json_t *o = jb_obj(b);
    jb_set(b, o, "path", jb_str(b, m->path));
    jb_set(b, o, "architecture", jb_str(b, m->architecture));
    jb_set(b, o, "model_type", jb_str(b, m->model_type));
    jb_set(b, o, "arch", jb_str(b, m->arch));
    jb_set(b, o, "expert_layout", jb_str(b, hp_expert_layout_name(m->layout)));
    jb_set(b, o, "num_params", jb_int(b, (int64_t)hp_model_num_params(m)));
    jb_set(b, o, "num_tensors", jb_int(b, (int64_t)m->n_params));
    return o;
}

static json_t *mesh_json(jb *b, const hp_mesh *m)
{
    json_t *o = jb_obj(b);
    json_t *dims = jb_arr(b);
    int64_t world = 1;
    for (int i = 0; i < m->n_dims && i < HP_MESH_MAX_DIMS; i++) {
        json_t *d = jb_obj(b);
        jb_set(b, d, "name", jb_str(b, m->names[i]));
        jb_set(b, d, "size", jb_int(b, m->sizes[i]));
        jb_push(b, dims, d);
        world *= m->sizes[i];
    }
    jb_set(b, o, "dims", dims);
    jb_set(b, o, "world", jb_int(b, world));
    jb_set(b, o, "ep", jb_int(b, m->ep));
    jb_set(b, o, "ep_mode", jb_str(b, m->ep_axis ? "ep-axis" : m->ep > 1 ? "tp-extend-ep" : "none"));
    return o;
}

/* The pipeline's stages (pp > 1): each stage's ranks (pp is the mesh's outermost axis: a contiguous block), its
 * chunks' decoder layers, and whether it holds the embedding and the head. */
static json_t *pipeline_json(jb *b, const hp_plan *p)
{
    const hp_pipeline *q = &p->pipe;
    json_t *o = jb_obj(b), *stages = jb_arr(b);
    jb_set(b, o, "pp", jb_int(b, q->pp));
    jb_set(b, o, "virtual", jb_int(b, q->virt));
    jb_set(b, o, "layers_given", jb_chk(b, json_boolean(q->given)));
    int64_t per = hp_mesh_world(&p->mesh) / q->pp;
    for (int64_t s = 0; s < q->pp; s++) {
        json_t *st = jb_obj(b), *ranks = jb_arr(b), *chunks = jb_arr(b);
        jb_set(b, st, "stage", jb_int(b, s));
        jb_push(b, ranks, jb_int(b, s * per));
        jb_push(b, ranks, jb_int(b, (s + 1) * per));
        jb_set(b, st, "ranks", ranks);
        for (int64_t c = s; c < q->n_chunks; c += q->pp) {
            json_t *ch = jb_obj(b);
            jb_set(b, ch, "chunk", jb_int(b, c));
            jb_set(b, ch, "first_layer", jb_int(b, q->first[c]));
            jb_set(b, ch, "layers", jb_int(b, q->count[c]));
            jb_push(b, chunks, ch);
        }
        jb_set(b, st, "chunks", chunks);
        jb_set(b, st, "embedding", jb_chk(b, json_boolean(s == 0)));
        jb_set(b, st, "head", jb_chk(b, json_boolean(s == q->pp - 1)));
        jb_push(b, stages, st);
    }
    jb_set(b, o, "stages", stages);
    return o;
}

/* Serialises the plan (docs/plan-format.md) and appends it, with a final newline, to out. */
hp_status hp_plan_to_json(const hp_plan *p, hp_buf *out, hp_err *err)
{
    HP_ASSERT(p && out);
    jb b = {.ok = true};
    json_t *root = jb_obj(&b);
    jb_set(&b, root, "format", jb_str(&b, "hyperpar-plan"));
    jb_set(&b, root, "version", jb_int(&b, 1));
    jb_set(&b, root, "model", model_json(&b, p->model));
    jb_set(&b, root, "mesh", mesh_json(&b, &p->mesh));

    json_t *dims = jb_arr(&b);
    for (int i = 0; i < p->n_dims; i++) jb_push(&b, dims, jb_str(&b, hp_axis_name(p->dims[i])));
    jb_set(&b, root, "mesh_dim_names", dims);
    if (p->pipe.pp > 1) jb_set(&b, root, "pipeline", pipeline_json(&b, p));
    jb_set(&b, root, "sequence_parallel", jb_chk(&b, json_boolean(p->sequence_parallel)));
    jb_set(&b, root, "loss_parallel", jb_chk(&b, json_boolean(p->loss_parallel)));
    if (p->allow_uncovered) jb_set(&b, root, "allow_uncovered_params", jb_chk(&b, json_true()));

    json_t *bds = jb_arr(&b);
    for (size_t i = 0; i < p->n_boundaries; i++) jb_push(&b, bds, boundary_json(&b, p, &p->boundaries[i]));
    jb_set(&b, root, "boundaries", bds);

    json_t *special = jb_obj(&b);
    for (int i = 0; i < p->n_special; i++)
        jb_set(&b, special, p->special[i].param, jb_str(&b, p->special[i].handler));
    jb_set(&b, root, "special_handlers", special);

    json_t *tied = jb_arr(&b);
    for (int i = 0; i < p->n_tied && i < 1; i++) {
        json_t *pair = jb_arr(&b);
        jb_push(&b, pair, jb_str(&b, p->tied[i][0]));
        jb_push(&b, pair, jb_str(&b, p->tied[i][1]));
        jb_push(&b, tied, pair);
    }
    jb_set(&b, root, "tied_pairs", tied);

    json_t *roles = jb_obj(&b);
    if (p->model && p->roles)
        for (size_t i = 0; i < p->model->n_params; i++)
            jb_set(&b, roles, p->model->params[i].name, jb_str(&b, hp_role_name(p->roles[i])));
    jb_set(&b, root, "param_roles", roles);

    json_t *warn = jb_arr(&b);
    for (int i = 0; i < p->n_warnings; i++) jb_push(&b, warn, jb_str(&b, p->warnings[i]));
    jb_set(&b, root, "warnings", warn);

    char *text = b.ok ? json_dumps(root, JSON_PRESERVE_ORDER | JSON_INDENT(2)) : NULL;
    json_decref(root);
    if (!text)
        return hp_err_set(err, HP_ERR_NOMEM, "plan JSON: could not serialise the plan: out of memory, or a name "
                                             "that is not valid UTF-8 (jansson accepts UTF-8 strings only)");
    hp_buf_puts(out, text);
    hp_buf_puts(out, "\n");
    free(text);
    if (out->oom) return hp_err_set(err, HP_ERR_NOMEM, "plan JSON: out of memory while writing the output");
    return HP_OK;
}
