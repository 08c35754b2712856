/*
 * explain.c — the plan introspection report (spec §1.5): what each boundary shards, which collectives its
 * entry and exit compile to (spec §9.1, with the TP lowering of §9.2 in words), and what is injected.
 *
 *   === ShardingPlan introspection report ===
 *   mesh_dim_names=('tp',)  sequence_parallel=True  loss_parallel=False
 *   boundaries: 12  tied_pairs: none
 *   [model.layers.0.self_attn]
 *     parameter sharding:
 *       q_proj.weight: {tp: S(0), cp: R, ep: R}
 *     ...
 *     input communication plan (in_src -> in_dst):
 *       hidden_states: (S(1)) -> (R)  [all_gather]  tp lowering: all_gather dim 1
 *     output communication plan (out_src -> out_dst):
 *       output(tuple[0]): (P) -> (S(1))  [reduce_scatter]  tp lowering: reduce_scatter dim 1
 *     injection: none (ordinary boundary, dispatch-through under validate)
 *
 * Conventions: booleans and the mesh_dim_names tuple print as Python does (the report mirrors the
 * reference's); placement tuples list the resolved placement of every axis of mesh_dim_names in that order
 * (an axis missing from a map is Replicate, spec §1.1); placement maps list the axes tp, cp, ep that are
 * present, restricted to mesh_dim_names plus ep when mesh_dim_names is non-empty (as plan_json.c does, so
 * D-10 expert parameters keep their ep entry).
 */
#include <stdio.h>
#include <string.h>

#include "plan/planner.h"

static const char *py_bool(bool b) { return b ? "True" : "False"; }

static bool axis_visible(const hp_plan *p, hp_axis a)
{
    if (p->n_dims == 0 || a == HP_AXIS_EP) return true;
    for (int i = 0; i < p->n_dims; i++)
        if (p->dims[i] == a) return true;
    return false;
}

/* "{tp: S(0), cp: R}"; "{}" when no visible axis is present. */
static void put_nplace(hp_buf *out, const hp_plan *p, const hp_nplace *np)
{
    bool first = true;
    hp_buf_puts(out, "{");
    for (int a = 0; a < HP_AXIS_COUNT; a++) {
        if (np->ax[a].kind == HP_PL_ABSENT || !axis_visible(p, (hp_axis)a)) continue;
        char buf[16];
        hp_buf_printf(out, "%s%s: %s", first ? "" : ", ", hp_axis_name((hp_axis)a),
                      hp_placement_str(np->ax[a], buf, sizeof buf));
        first = false;
    }
    hp_buf_puts(out, "}");
}

/* resolve_placements (spec §1.1): one placement per mesh dim, absent = Replicate. */
static void resolve(const hp_plan *p, const hp_nplace *np, hp_placement *res)
{
    for (int i = 0; i < p->n_dims; i++) {
        hp_placement pl = np ? np->ax[p->dims[i]] : hp_pl_r();
        res[i] = pl.kind == HP_PL_ABSENT ? hp_pl_r() : pl;
    }
}

static void put_tuple(hp_buf *out, const hp_plan *p, const hp_placement *res)
{
    hp_buf_puts(out, "(");
    for (int i = 0; i < p->n_dims; i++) {
        char buf[16];
        hp_buf_printf(out, "%s%s", i ? ", " : "", hp_placement_str(res[i], buf, sizeof buf));
    }
    hp_buf_puts(out, ")");
}

static bool is_shard(hp_placement x) { return x.kind == HP_PL_S || x.kind == HP_PL_S2; }

/* _classify_collective (spec §9.1), over the differing axes only. */
static const char *classify(int n, const hp_placement *src, const hp_placement *dst)
{
    bool any = false, src_p = false, src_s = false, dst_s = false, dst_all_plain = true, dst_all_r = true;
    for (int i = 0; i < n; i++) {
        if (hp_placement_eq(src[i], dst[i])) continue;
        any = true;
        src_p |= src[i].kind == HP_PL_P;
        src_s |= is_shard(src[i]);
        dst_s |= is_shard(dst[i]);
        if (is_shard(dst[i]) || dst[i].kind == HP_PL_P) dst_all_plain = false;
        if (dst[i].kind != HP_PL_R) dst_all_r = false;
    }
    if (!any) return "identity";
    if (src_p && dst_s) return "reduce_scatter";
    if (src_p && dst_all_plain) return "all_reduce";
    if (src_s && dst_all_r) return "all_gather";
    return "redistribute";
}

/* The production TP lowering (spec §9.2) of a non-identity transition, in words, or NULL when tp is not a
 * plan dim. Writes into buf. */
static const char *tp_lowering(const hp_plan *p, const hp_placement *src, const hp_placement *dst, char *buf,
                               size_t cap)
{
    int t = -1;
    for (int i = 0; i < p->n_dims; i++) {
        if (p->dims[i] == HP_AXIS_TP) t = i;
    }
    if (t < 0) return NULL;
    for (int i = 0; i < p->n_dims; i++)
        if (i != t && !hp_placement_eq(src[i], dst[i]))
            return "generic redistribution (a non-tp axis changes too)";
    hp_placement s = src[t], d = dst[t];
    if (hp_placement_eq(s, d)) return "none on tp";
    if (s.kind == HP_PL_S && d.kind == HP_PL_R) {
        snprintf(buf, cap, "all_gather dim %d", s.dim);
        return buf;
    }
    if (s.kind == HP_PL_P && d.kind == HP_PL_R) return "all_reduce";
    if (s.kind == HP_PL_P && d.kind == HP_PL_S) {
        snprintf(buf, cap, "reduce_scatter dim %d", d.dim);
        return buf;
    }
    if (s.kind == HP_PL_R && d.kind == HP_PL_S) return "generic redistribution (a local slice)";
    return "generic redistribution";
}

static const hp_io_entry *io_find(const hp_io_map *m, const char *name, int *idx)
{
    if (m->is_null) return NULL;
    for (int i = 0; i < m->n && i < HP_MAX_IO; i++)
        if (strcmp(m->e[i].name, name) == 0) {
            if (idx) *idx = i;
            return &m->e[i];
        }
    return NULL;
}

/* Sorted union of the names of two maps (Python's sorted(keys(a) | keys(b))). Returns the count. */
static int name_union(const hp_io_map *a, const hp_io_map *b, const char *names[2 * HP_MAX_IO])
{
    int n = 0;
    const hp_io_map *ms[2] = {a, b};
    for (int k = 0; k < 2; k++) {
        if (ms[k]->is_null) continue;
        for (int i = 0; i < ms[k]->n && i < HP_MAX_IO; i++) {
            bool dup = false;
            for (int j = 0; j < n; j++) dup |= strcmp(names[j], ms[k]->e[i].name) == 0;
            if (!dup) names[n++] = ms[k]->e[i].name;
        }
    }
    for (int i = 1; i < n; i++) /* insertion sort: at most 2 * HP_MAX_IO names */
        for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            const char *t = names[j];
            names[j] = names[j - 1];
            names[j - 1] = t;
        }
    return n;
}

/* One compiled op line. tag NULL: the collective label. */
static void put_op(hp_buf *out, const hp_plan *p, const char *label, const hp_placement *src,
                   const hp_placement *dst, bool input)
{
    const char *kind = classify(p->n_dims, src, dst);
    bool identity = strcmp(kind, "identity") == 0;
    hp_buf_printf(out, "    %s: ", label);
    put_tuple(out, p, src);
    hp_buf_puts(out, " -> ");
    put_tuple(out, p, dst);
    hp_buf_printf(out, "  [%s]", identity && input ? "passthrough" : kind);
    char buf[48];
    const char *low = identity ? NULL : tp_lowering(p, src, dst, buf, sizeof buf);
    if (low) hp_buf_printf(out, "  tp lowering: %s", low);
    hp_buf_puts(out, "\n");
}

static void put_comm(hp_buf *out, const hp_plan *p, const hp_boundary *b)
{
    hp_placement src[HP_AXIS_COUNT], dst[HP_AXIS_COUNT];
    const char *in_names[2 * HP_MAX_IO], *out_names[2 * HP_MAX_IO];
    int n_in = name_union(&b->in_src, &b->in_dst, in_names);
    bool out_null = b->out_src.is_null || b->out_dst.is_null;
    int n_out = out_null ? 0 : name_union(&b->out_src, &b->out_dst, out_names);

    /* Count the out ops that survive (identity pairs are skipped, spec §9.1). */
    int n_out_ops = 0;
    for (int i = 0; i < n_out; i++) {
        const hp_io_entry *s = io_find(&b->out_src, out_names[i], NULL), *d = io_find(&b->out_dst, out_names[i], NULL);
        resolve(p, s ? &s->pl : NULL, src);
        resolve(p, d ? &d->pl : NULL, dst);
        if (strcmp(classify(p->n_dims, src, dst), "identity") != 0) n_out_ops++;
    }
    if (n_in == 0 && n_out_ops == 0) {
        hp_buf_puts(out, "  boundary communication: none\n");
        return;
    }

    hp_buf_printf(out, "  input communication plan (in_src -> in_dst):%s\n", n_in ? "" : " none");
    for (int i = 0; i < n_in; i++) {
        const hp_io_entry *s = io_find(&b->in_src, in_names[i], NULL), *d = io_find(&b->in_dst, in_names[i], NULL);
        resolve(p, s ? &s->pl : NULL, src);
        resolve(p, d ? &d->pl : NULL, dst);
        put_op(out, p, in_names[i], src, dst, true);
    }

    if (out_null) {
        hp_buf_puts(out, "  output communication plan (out_src -> out_dst): none (out_src or out_dst is None: no exit "
                         "communication)\n");
        return;
    }
    if (n_out_ops == 0) {
        hp_buf_puts(out, "  output communication plan (out_src -> out_dst): none (identity)\n");
        return;
    }
    hp_buf_puts(out, "  output communication plan (out_src -> out_dst):\n");
    for (int i = 0; i < n_out; i++) {
        int idx = 0;
        const hp_io_entry *s = io_find(&b->out_src, out_names[i], &idx), *d = io_find(&b->out_dst, out_names[i], NULL);
        resolve(p, s ? &s->pl : NULL, src);
        resolve(p, d ? &d->pl : NULL, dst);
        if (strcmp(classify(p->n_dims, src, dst), "identity") == 0) continue;
        char label[64];
        snprintf(label, sizeof label, "%s(tuple[%d])", out_names[i], s ? idx : 0);
        put_op(out, p, label, src, dst, false);
    }
}

/* region_dispatch meaning per spec §9.5 (resolution chain). */
static void put_injection(hp_buf *out, const hp_boundary *b)
{
    const char *rd = b->region_dispatch < 0 ? "None" : b->region_dispatch ? "True" : "False";
    const char *meaning = NULL;
    if (b->local_compute_fn) {
        meaning = b->region_dispatch < 0   ? "invalid: a local_compute_fn needs an explicit region_dispatch "
                                             "(apply fails)"
                  : b->region_dispatch > 0 ? "local region; local_compute_fn replaces the forward and validate "
                                             "mode dispatches through it"
                                           : "local region; local_compute_fn replaces the forward on local tensors";
    } else if (b->region_dispatch == 0) {
        meaning = "local region running the module's own forward on local tensors";
    } else if (b->region_dispatch > 0) {
        meaning = "invalid: region_dispatch=True without an injection is redundant (apply fails)";
    }
    if (!meaning) hp_buf_puts(out, "  injection: none (ordinary boundary, dispatch-through under validate)\n");
    else
        hp_buf_printf(out, "  injection: local_compute_fn=%s; region_dispatch=%s -> %s\n",
                      b->local_compute_fn ? b->local_compute_fn : "none", rd, meaning);
    if (b->ep_size > 0 && !b->local_compute_fn)
        hp_buf_puts(out, "  [!] EP-marked boundary without local_compute_fn: declare one with --overrides (see "
                         "'hyperpar plan --suggest-overrides')\n");
}

/* The boundary that owns special-handled parameter fqn: the deepest spec whose FQN prefixes it. */
static size_t special_owner(const hp_plan *p, const char *param)
{
    size_t best = p->n_boundaries, best_len = 0;
    for (size_t i = 0; i < p->n_boundaries; i++) {
        const char *f = p->boundaries[i].fqn ? p->boundaries[i].fqn : "";
        size_t n = strlen(f);
        bool match = n == 0 || (strncmp(param, f, n) == 0 && param[n] == '.');
        if (match && (best == p->n_boundaries || n > best_len)) best = i, best_len = n;
    }
    return best;
}

static void put_boundary(hp_buf *out, const hp_plan *p, size_t bi)
{
    const hp_boundary *b = &p->boundaries[bi];
    hp_buf_printf(out, "[%s]\n", b->fqn ? b->fqn : "");

    if (b->n_params == 0) {
        hp_buf_puts(out, "  parameter sharding: none ({} = this boundary shards no parameters, I/O stitching only)\n");
    } else {
        hp_buf_puts(out, "  parameter sharding:\n");
        for (int i = 0; i < b->n_params; i++) {
            hp_buf_printf(out, "    %s: ", b->params[i].rel);
            put_nplace(out, p, &b->params[i].pl);
            hp_buf_puts(out, "\n");
        }
    }

    if (b->ep_size > 0) {
        hp_buf_printf(out, "  expert parallel: ep_size=%d, stacked: ", b->ep_size);
        if (b->n_ep_stack == 0) hp_buf_puts(out, "none (batched or custom expert layout)");
        for (int i = 0; i < b->n_ep_stack; i++)
            hp_buf_printf(out, "%s%s (%d experts)", i ? ", " : "", b->ep_stack[i].name, b->ep_stack[i].n_src);
        hp_buf_puts(out, "\n");
    }

    if (b->n_tp_attrs > 0) {
        hp_buf_puts(out, "  TP-local attribute division:\n");
        for (int user = 0; user < 2; user++) {
            int k = 0;
            for (int i = 0; i < b->n_tp_attrs; i++) {
                if (b->tp_attrs[i].user != (user == 1)) continue;
                hp_buf_printf(out, "%s%s", k++ ? ", " : (user ? "    user(plan_overrides): " : "    auto(D-17): "),
                              b->tp_attrs[i].name);
            }
            if (k) hp_buf_puts(out, "\n");
        }
    }

    if (b->n_deferred > 0) {
        hp_buf_puts(out, "  deferred bias (D-22, no bias inside the region, added exactly once after the TP "
                         "reduction): ");
        for (int i = 0; i < b->n_deferred; i++) hp_buf_printf(out, "%s%s", i ? ", " : "", b->deferred_biases[i]);
        hp_buf_puts(out, "\n");
    }

    put_comm(out, p, b);
    put_injection(out, b);

    for (int i = 0; i < p->n_special; i++) {
        if (special_owner(p, p->special[i].param) != bi) continue;
        size_t n = b->fqn ? strlen(b->fqn) : 0;
        hp_buf_printf(out, "  special handling: %s -> %s\n", p->special[i].param + (n ? n + 1 : 0),
                      p->special[i].handler);
    }
}

/* The pipeline's stages: each one's ranks and its chunks' decoder layers, and where the embedding and the head live
 * (hyperpar's own addition to the report; nothing without a pp axis). */
static void put_pipeline(hp_buf *out, const hp_plan *p)
{
    const hp_pipeline *q = &p->pipe;
    if (q->pp <= 1) return;
    int64_t per = hp_mesh_world(&p->mesh) / q->pp;
    hp_buf_printf(out, "pipeline: pp=%lld, %lld virtual stage%s per stage, layers %s\n", (long long)q->pp,
                  (long long)q->virt, q->virt == 1 ? "" : "s", q->given ? "as given (--pp-layers)" :
                  "split evenly (the embedding and the loss counted as a layer each)");
    for (int64_t s = 0; s < q->pp; s++) {
        hp_buf_printf(out, "  stage %lld (ranks %lld-%lld):", (long long)s, (long long)(s * per),
                      (long long)((s + 1) * per - 1));
        if (s == 0) hp_buf_puts(out, " embedding,");
        for (int64_t c = s; c < q->n_chunks; c += q->pp) {
            if (q->count[c] == 0) hp_buf_printf(out, " chunk %lld: no layer;", (long long)c);
            else hp_buf_printf(out, " chunk %lld: layers %lld-%lld (%lld);", (long long)c, (long long)q->first[c],
                               (long long)(q->first[c] + q->count[c] - 1), (long long)q->count[c]);
        }
        if (s == q->pp - 1)
            hp_buf_puts(out, hp_model_find_param(p->model, "lm_head.weight")
                                 ? " final norm, lm_head and the loss"
                                 : " final norm, the embedding again (lm_head is tied to it) and the loss");
        hp_buf_puts(out, "\n");
    }
}

/* Appends the §1.5 report for every boundary (fqn NULL) or for the one named fqn. An fqn that names no
 * boundary gives the `[!]` line after the header and HP_OK: the report says so, nothing failed. */
hp_status hp_plan_explain(const hp_plan *p, const char *fqn, hp_buf *out, hp_err *err)
{
    HP_ASSERT(p && out);
    hp_buf_puts(out, "=== ShardingPlan introspection report ===\n");
    hp_buf_puts(out, "mesh_dim_names=(");
    for (int i = 0; i < p->n_dims; i++) hp_buf_printf(out, "%s'%s'", i ? ", " : "", hp_axis_name(p->dims[i]));
    hp_buf_printf(out, "%s)  sequence_parallel=%s  loss_parallel=%s\n", p->n_dims == 1 ? "," : "",
                  py_bool(p->sequence_parallel), py_bool(p->loss_parallel));
    hp_buf_printf(out, "boundaries: %zu  tied_pairs: ", p->n_boundaries);
    if (p->n_tied == 0) hp_buf_puts(out, "none");
    for (int i = 0; i < p->n_tied && i < 1; i++)
        hp_buf_printf(out, "%s%s<->%s", i ? ", " : "", p->tied[i][0], p->tied[i][1]);
    hp_buf_puts(out, "\n");
    put_pipeline(out, p);

    if (fqn) {
        size_t i = 0;
        while (i < p->n_boundaries && strcmp(p->boundaries[i].fqn ? p->boundaries[i].fqn : "", fqn) != 0) i++;
        if (i == p->n_boundaries) {
            hp_buf_printf(out, "[!] '%s' is not a boundary of this plan (%zu boundaries; explain without an fqn "
                               "lists them all)\n", fqn, p->n_boundaries);
        } else {
            put_boundary(out, p, i);
        }
    } else {
        for (size_t i = 0; i < p->n_boundaries; i++) put_boundary(out, p, i);
    }
    if (out->oom) return hp_err_set(err, HP_ERR_NOMEM, "plan explain: out of memory while writing the report");
    return HP_OK;
}
