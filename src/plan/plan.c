/*
 * plan.c — the planner pipeline (spec §2): mesh dims, Phase 1-4, EP marking, finalisation, lints.
 *
 *   hp_plan_derive(model, opts)
 *     mesh check + dims           tp/cp/ep axes of size > 1 in mesh order; dp and pp never appear
 *     compatibility (§8.9)        heads, kv heads, experts, expert width, sequence length
 *     Phase 1  roles[]            classify.c
 *     Phase 2  groups             group.c (registration order)
 *     Phase 3+4 boundaries        infer.c + templates.c; "unknown" groups warn and stay uncovered
 *     §6.8     EP marking         ep.c, for moe_mlp boundaries when ep > 1
 *     §7.1     overrides          overrides.c (merge / insert / glob; derive=false inserts only)
 *     §7.3-§8  finalise + lints   lints.c
 *     normalise                   axes that are not plan dims are dropped from every placement map,
 *                                 except an ep Shard (EP-marked params carry ep although D-10 has no ep dim)
 *
 * Also the small value helpers of plan.h: placements, axis names, the mesh.
 */
#include <ctype.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "plan/overrides.h"
#include "plan/planner_int.h"

/* ---- values ---- */

hp_placement hp_pl_r(void) { return (hp_placement){HP_PL_R, 0}; }
hp_placement hp_pl_p(void) { return (hp_placement){HP_PL_P, 0}; }
hp_placement hp_pl_s(int dim) { return (hp_placement){HP_PL_S, (int8_t)dim}; }

bool hp_placement_eq(hp_placement a, hp_placement b)
{
    if (a.kind != b.kind) return false;
    return (a.kind != HP_PL_S && a.kind != HP_PL_S2) || a.dim == b.dim;
}

const char *hp_placement_str(hp_placement p, char *buf, size_t cap)
{
    switch (p.kind) {
    case HP_PL_R: snprintf(buf, cap, "R"); break;
    case HP_PL_P: snprintf(buf, cap, "P"); break;
    case HP_PL_S: snprintf(buf, cap, "S(%d)", p.dim); break;
    case HP_PL_S2: snprintf(buf, cap, "S(%d)x2", p.dim); break;
    default: snprintf(buf, cap, "-"); break;
    }
    return buf;
}

const char *hp_axis_name(hp_axis a)
{
    static const char *const names[] = {"tp", "cp", "ep"};
    return a < HP_AXIS_COUNT ? names[a] : "?";
}

/* ---- mesh ---- */

/* Canonical axis names (§1.2); anything else in a mesh is a typo worth refusing. */
static const char *const g_mesh_axes[] = {"dp", "cp", "tp", "ep", "pp", "dp_replicate", "dp_shard", "dp_cp",
                                          "ep_shard"};

static bool known_axis(const char *name)
{
    for (size_t i = 0; i < sizeof g_mesh_axes / sizeof *g_mesh_axes; i++)
        if (strcmp(name, g_mesh_axes[i]) == 0) return true;
    return false;
}

/* Reads one SIZE of a --mesh item: a plain decimal integer in [1, HP_MESH_MAX_SIZE], no sign, no spaces, no
 * leading zero. Digits are accumulated by hand so that no overflow is possible (strtoll would skip spaces
 * and accept a sign). */
static bool mesh_size(const char *s, size_t n, int64_t *out)
{
    if (n == 0 || s[0] == '0') return false;
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        v = v * 10 + (s[i] - '0');
        if (v > HP_MESH_MAX_SIZE) return false;
    }
    *out = v;
    return true;
}

hp_status hp_mesh_parse(const char *spec, hp_mesh *out, hp_err *err)
{
    memset(out, 0, sizeof *out);
    out->ep = 1;
    if (!spec[0]) return hp_err_set(err, HP_ERR_INPUT, "--mesh is empty; e.g. --mesh dp=2,tp=4");
    for (const char *w = spec; *w; w++)
        if (isspace((unsigned char)*w) || !isprint((unsigned char)*w))
            return hp_err_set(err, HP_ERR_INPUT, "--mesh '%s': a space or control character at position %d; write "
                              "NAME=SIZE items separated by commas without spaces, e.g. dp=2,cp=1,tp=4",
                              spec, (int)(w - spec) + 1);
    const char *s = spec;
    int item = 1;
    int64_t world = 1;
    for (;; item++) {
        const char *comma = strchr(s, ',');
        if (!comma) comma = s + strlen(s);
        size_t ilen = (size_t)(comma - s);
        if (ilen == 0)
            return hp_err_set(err, HP_ERR_INPUT, "--mesh '%s': item %d is empty (a %s comma); write NAME=SIZE "
                              "items separated by single commas, e.g. dp=2,cp=1,tp=4",
                              spec, item, item == 1 ? "leading" : *comma ? "doubled" : "trailing");
        const char *eq = memchr(s, '=', ilen);
        if (!eq)
            return hp_err_set(err, HP_ERR_INPUT, "--mesh '%s': item %d ('%.*s') is not NAME=SIZE; expected NAME=SIZE "
                              "items separated by commas, e.g. dp=2,cp=1,tp=4", spec, item, (int)ilen, s);
        if (out->n_dims == HP_MESH_MAX_DIMS)
            return hp_err_set(err, HP_ERR_INPUT, "--mesh '%s': at most %d axes", spec, HP_MESH_MAX_DIMS);
        size_t nlen = (size_t)(eq - s);
        char name[16];
        if (nlen == 0 || nlen >= sizeof name)
            return hp_err_set(err, HP_ERR_INPUT, "--mesh '%s': item %d has %s axis name; known axes: dp, cp, tp, ep, "
                              "pp, dp_replicate, dp_shard, dp_cp, ep_shard", spec, item, nlen ? "an unknown" : "no");
        memcpy(name, s, nlen);
        name[nlen] = '\0';
        if (!known_axis(name))
            return hp_err_set(err, HP_ERR_INPUT, "--mesh '%s': unknown axis '%s'; known axes: dp, cp, tp, ep, pp, "
                              "dp_replicate, dp_shard, dp_cp, ep_shard", spec, name);
        for (int i = 0; i < out->n_dims; i++)
            if (strcmp(out->names[i], name) == 0)
                return hp_err_set(err, HP_ERR_INPUT, "--mesh '%s': axis '%s' appears twice; give each axis once",
                                  spec, name);
        int64_t v = 0;
        if (!mesh_size(eq + 1, (size_t)(comma - eq - 1), &v))
            return hp_err_set(err, HP_ERR_INPUT, "--mesh '%s': size of '%s' must be an integer in [1, %d] written "
                              "as plain digits, got '%.*s'", spec, name, HP_MESH_MAX_SIZE, (int)(comma - eq - 1),
                              eq + 1);
        if (!hp_mul_i64(world, v, &world) || world > HP_MESH_MAX_WORLD)
            return hp_err_set(err, HP_ERR_INPUT, "--mesh '%s': the mesh has more than %d ranks (the product of the "
                              "sizes); choose smaller sizes", spec, HP_MESH_MAX_WORLD);
        snprintf(out->names[out->n_dims], sizeof out->names[0], "%s", name);
        out->sizes[out->n_dims++] = v;
        if (strcmp(name, "ep") == 0) {
            out->ep_axis = true;
            out->ep = v;
        }
        if (!*comma) break;
        s = comma + 1;
    }
    return HP_OK;
}

hp_status hp_mesh_check(const hp_mesh *m, hp_err *err)
{
    char buf[256];
    if (m->n_dims < 1 || m->n_dims > HP_MESH_MAX_DIMS)
        return hp_err_set(err, HP_ERR_INPUT, "the mesh has %d axes; give 1 to %d", m->n_dims, HP_MESH_MAX_DIMS);
    int64_t world = 1;
    for (int i = 0; i < m->n_dims; i++) {
        if (m->sizes[i] < 1 || m->sizes[i] > HP_MESH_MAX_SIZE)
            return hp_err_set(err, HP_ERR_INPUT, "mesh axis '%.16s' has size %lld; sizes must be in [1, %d]",
                              m->names[i], (long long)m->sizes[i], HP_MESH_MAX_SIZE);
        if (!hp_mul_i64(world, m->sizes[i], &world) || world > HP_MESH_MAX_WORLD) {
            size_t o = 0;
            for (int k = 0; k < m->n_dims && o < sizeof buf; k++)
                o += (size_t)snprintf(buf + o, sizeof buf - o, "%s%.16s=%lld", k ? "," : "", m->names[k],
                                      (long long)m->sizes[k]);
            return hp_err_set(err, HP_ERR_INPUT, "the mesh %s has more than %d ranks (the product of the sizes); "
                              "choose smaller sizes", buf, HP_MESH_MAX_WORLD);
        }
    }
    if (m->ep < 0 || m->ep > HP_MESH_MAX_SIZE) /* 0: unset, taken as 1 */
        return hp_err_set(err, HP_ERR_INPUT, "ep %lld is out of range; it must be in [1, %d]", (long long)m->ep,
                          HP_MESH_MAX_SIZE);
    return HP_OK;
}

hp_status hp_mesh_add_pp(hp_mesh *m, int64_t pp, hp_err *err)
{
    if (hp_mesh_size(m, "pp") > 1 || m->n_dims >= HP_MESH_MAX_DIMS)
        return hp_err_set(err, HP_ERR_INPUT, "--pp %lld: the mesh has a pp axis already (give pp once)", (long long)pp);
    int64_t w = hp_mesh_world(m);
    if (pp < 1 || pp > HP_MESH_MAX_SIZE || !hp_mul_i64(w, pp, &w) || w > HP_MESH_MAX_WORLD)
        return hp_err_set(err, HP_ERR_INPUT, "--pp %lld: the world would pass %d ranks", (long long)pp,
                          HP_MESH_MAX_WORLD);
    memmove(m->names[1], m->names[0], (size_t)m->n_dims * sizeof m->names[0]);
    memmove(&m->sizes[1], &m->sizes[0], (size_t)m->n_dims * sizeof m->sizes[0]);
    snprintf(m->names[0], sizeof m->names[0], "pp");
    m->sizes[0] = pp;
    m->n_dims++;
    return HP_OK;
}

void hp_mesh_from_sizes(hp_mesh *out, int64_t dp, int64_t cp, int64_t tp, int64_t ep, bool ep_axis)
{
    memset(out, 0, sizeof *out);
    const char *names[] = {"dp", "cp", "tp"};
    const int64_t sizes[] = {dp, cp, tp};
    for (int i = 0; i < 3; i++) {
        snprintf(out->names[out->n_dims], sizeof out->names[0], "%s", names[i]);
        out->sizes[out->n_dims++] = sizes[i] > 0 ? sizes[i] : 1;
    }
    out->ep = ep > 0 ? ep : 1;
    out->ep_axis = ep_axis;
    if (ep_axis) {
        snprintf(out->names[out->n_dims], sizeof out->names[0], "ep");
        out->sizes[out->n_dims++] = out->ep;
    }
}

int64_t hp_mesh_size(const hp_mesh *m, const char *name)
{
    for (int i = 0; i < m->n_dims; i++)
        if (strcmp(m->names[i], name) == 0) return m->sizes[i];
    return 1;
}

int64_t hp_mesh_coord(const hp_mesh *m, int64_t rank, const char *axis)
{
    int64_t c = rank;
    for (int i = m->n_dims - 1; i >= 0; i--) {
        if (!strcmp(m->names[i], axis)) return c % m->sizes[i];
        c /= m->sizes[i];
    }
    return 0;
}

void hp_mesh_ep_index(const hp_mesh *m, int64_t ep, int64_t rank, int64_t *group, int64_t *index)
{
    if (m->ep_axis) { /* the group: ranks sharing every coordinate but ep */
        int64_t rest = rank, g = 0, mul = 1;
        *index = 0;
        for (int d = m->n_dims - 1; d >= 0; d--) {
            int64_t c = rest % m->sizes[d];
            rest /= m->sizes[d];
            if (!strcmp(m->names[d], "ep")) *index = c;
            else {
                g += c * mul;
                mul *= m->sizes[d];
            }
        }
        *group = g;
        return;
    }
    if (ep < 1) ep = 1; /* TP-extend-EP (spec §10.1): flat blocks of ep consecutive ranks */
    *group = rank / ep;
    *index = rank % ep;
}

int64_t hp_mesh_batch_split(const hp_mesh *m)
{
    return hp_mesh_size(m, "dp") * (m->ep_axis ? hp_mesh_size(m, "ep") : 1);
}

void hp_mesh_batch_index(const hp_mesh *m, int64_t rank, int64_t *n, int64_t *index, int64_t *group)
{
    int64_t ep = m->ep_axis ? hp_mesh_size(m, "ep") : 1, e = m->ep_axis ? hp_mesh_coord(m, rank, "ep") : 0;
    *n = hp_mesh_batch_split(m);
    *index = hp_mesh_coord(m, rank, "dp") * ep + e;
    if (group) {
        int64_t g = hp_mesh_group_rank(m, rank, "dp", 0);
        *group = m->ep_axis ? hp_mesh_group_rank(m, g, "ep", 0) : g;
    }
}

void hp_ep_local_experts(int64_t n_experts, int64_t ep, int64_t index, int64_t *first, int64_t *count)
{
    if (ep < 1) ep = 1;
    int64_t a = (int64_t)((__int128)n_experts * index / ep), b = (int64_t)((__int128)n_experts * (index + 1) / ep);
    *first = a;
    *count = b - a;
}

static int64_t ep_rule(const hp_mesh *m, int64_t ep) { return m->ep_axis ? hp_mesh_size(m, "ep") : ep > 1 ? ep : 1; }

int64_t hp_mesh_ep_size(const hp_mesh *m) { return ep_rule(m, m->ep); }

int64_t hp_plan_ep_size(const hp_plan *p) { return ep_rule(&p->mesh, p->ep); }

int64_t hp_mesh_group_rank(const hp_mesh *m, int64_t rank, const char *axis, int64_t coord)
{
    int64_t stride = 1; /* ranks between neighbours on axis: row-major, the last dim fastest */
    for (int d = m->n_dims - 1; d >= 0; d--) {
        if (!strcmp(m->names[d], axis)) return rank + (coord - hp_mesh_coord(m, rank, axis)) * stride;
        stride *= m->sizes[d];
    }
    return rank;
}

hp_status hp_mesh_check_pp(const hp_mesh *m, const char *what, hp_err *err)
{
    int64_t pp = hp_mesh_size(m, "pp");
    if (pp <= 1) return HP_OK;
    return hp_err_set(err, HP_ERR_INPUT, "pipeline parallelism (pp=%lld): plan, explain, shard, merge, run, validate, "
                      "train, cost and advise take it, but %s does not execute or model a pipeline yet; drop pp from "
                      "the mesh (docs/pipeline.md)", (long long)pp, what);
}

int64_t hp_mesh_world(const hp_mesh *m)
{
    int64_t w = 1;
    for (int i = 0; i < m->n_dims && i < HP_MESH_MAX_DIMS; i++)
        if (!hp_mul_i64(w, m->sizes[i], &w)) return INT64_MAX; /* saturates: sizes from callers are not checked */
    return w;
}

const char *hp_mesh_str(const hp_mesh *m, char *buf, size_t cap)
{
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; i < m->n_dims && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%s=%lld", i ? "," : "", m->names[i], (long long)m->sizes[i]);
    if (o < cap) o += (size_t)snprintf(buf + o, cap - o, " (world %lld)", (long long)hp_mesh_world(m));
    if (m->ep > 1 && !m->ep_axis && o < cap)
        snprintf(buf + o, cap - o, ", ep=%lld (TP-extend-EP)", (long long)m->ep);
    return buf;
}

const char *hp_mesh_world_hint(const hp_mesh *m, int64_t world, char *buf, size_t cap)
{
    buf[0] = '\0';
    int64_t have = hp_mesh_world(m), ep = m->ep;
    if (m->ep_axis || ep <= 1 || world == have || world < 1 || world % have) return buf;
    /* the ranks the user seems to have counted ep into: dp grows by the factor, ep stays on the dense ranks; or
     * the factor is an ep axis of its own */
    int64_t dp = hp_mesh_size(m, "dp") * (world / have), cp = hp_mesh_size(m, "cp"), tp = hp_mesh_size(m, "tp");
    char cps[48] = "", axis[160] = "";
    if (cp > 1) snprintf(cps, sizeof cps, " --cp %lld", (long long)cp);
    size_t o = 0;
    for (int i = 0; i < m->n_dims && o < sizeof axis; i++)
        if (m->sizes[i] > 1) o += (size_t)snprintf(axis + o, sizeof axis - o, "%s=%lld,", m->names[i], (long long)m->sizes[i]);
    snprintf(buf, cap, "; --ep %lld adds no ranks: TP-extend-EP rides on the ranks of the dense region (dp x cp x tp "
             "= %lld), in EP groups of %lld consecutive ones. For %lld ranks, --dp %lld%s --tp %lld --ep %lld was "
             "meant (or an ep axis of its own ranks: --mesh %sep=%lld)", (long long)ep, (long long)have, (long long)ep,
             (long long)world, (long long)dp, cps, (long long)tp, (long long)ep, axis, (long long)(world / have));
    return buf;
}

/* ---- plan helpers ---- */

bool hp__plan_has_dim(const hp_plan *p, hp_axis a)
{
    for (int i = 0; i < p->n_dims; i++)
        if (p->dims[i] == a) return true;
    return false;
}

void hp__plan_warn(hp_plan *p, const char *fmt, ...)
{
    char buf[HP_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    hp_log(HP_LOG_WARN, "%s", buf);
    const char **w = hp_arena_alloc(&p->arena, (size_t)(p->n_warnings + 1) * sizeof *w);
    char *copy = hp_arena_strdup(&p->arena, buf);
    if (!w || !copy) return;
    if (p->n_warnings) memcpy(w, p->warnings, (size_t)p->n_warnings * sizeof *w);
    w[p->n_warnings++] = copy;
    p->warnings = w;
}

const hp_boundary *hp_plan_find(const hp_plan *p, const char *fqn)
{
    for (size_t i = 0; i < p->n_boundaries; i++)
        if (strcmp(p->boundaries[i].fqn, fqn) == 0) return &p->boundaries[i];
    return NULL;
}

const hp_boundary *hp_plan_param_placement(const hp_plan *p, const char *param_fqn, hp_nplace *out)
{
    for (size_t i = 0; i < p->n_boundaries; i++) {
        const hp_boundary *b = &p->boundaries[i];
        size_t n = strlen(b->fqn);
        if (n && (strncmp(param_fqn, b->fqn, n) != 0 || param_fqn[n] != '.')) continue;
        const char *rel = param_fqn + (n ? n + 1 : 0);
        for (int k = 0; k < b->n_params; k++)
            if (strcmp(b->params[k].rel, rel) == 0) {
                if (out) *out = b->params[k].pl;
                return b;
            }
        for (int s = 0; s < b->n_ep_stack; s++)
            for (int k = 0; k < b->ep_stack[s].n_src; k++)
                if (strcmp(b->ep_stack[s].src[k], rel) == 0) {
                    for (int q = 0; q < b->n_params && out; q++)
                        if (strcmp(b->params[q].rel, b->ep_stack[s].name) == 0) *out = b->params[q].pl;
                    return b;
                }
    }
    return NULL;
}

void hp_plan_opts_default(hp_plan_opts *o)
{
    memset(o, 0, sizeof *o);
    hp_mesh_from_sizes(&o->mesh, 1, 1, 1, 1, false);
    o->sequence_parallel = true;
    o->derive = true;
}

/* ---- compatibility (§8.9) ---- */

hp_status hp_plan_check_compat(const hp_model *m, int64_t tp, int64_t cp, int64_t ep, int64_t seq_len, hp_err *err)
{
    const hp_model_config *c = &m->cfg;
    if (tp > 1) {
        if (c->num_attention_heads && c->num_attention_heads % tp)
            return hp_err_set(err, HP_ERR_INPUT,
                              "num_attention_heads (%lld) is not divisible by tp (%lld): tensor parallelism splits "
                              "whole heads; choose a tp that divides %lld",
                              (long long)c->num_attention_heads, (long long)tp, (long long)c->num_attention_heads);
        if (c->num_key_value_heads && c->num_key_value_heads % tp)
            return hp_err_set(err, HP_ERR_INPUT,
                              "num_key_value_heads (%lld) is not divisible by tp (%lld): key/value heads are split "
                              "whole; choose a tp that divides %lld",
                              (long long)c->num_key_value_heads, (long long)tp, (long long)c->num_key_value_heads);
        if (ep > 1 && c->moe_intermediate_size && c->moe_intermediate_size % tp)
            return hp_err_set(err, HP_ERR_INPUT,
                              "moe_intermediate_size (%lld) is not divisible by tp (%lld)",
                              (long long)c->moe_intermediate_size, (long long)tp);
    }
    if (cp > 1 && seq_len > 0 && seq_len % (2 * cp))
        return hp_err_set(err, HP_ERR_INPUT,
                          "sequence length %lld is not divisible by 2*cp (%lld): context parallelism splits the "
                          "sequence into 2*cp load-balanced chunks",
                          (long long)seq_len, (long long)(2 * cp));
    if (ep > 1) {
        if (c->n_experts <= 0)
            return hp_err_set(err, HP_ERR_INPUT,
                              "EP>1 requires MoE model (num_experts > 0); %s has no routed experts", m->path);
        if (c->n_experts % ep)
            return hp_err_set(err, HP_ERR_INPUT, "num_experts (%lld) must be divisible by EP (%lld)",
                              (long long)c->n_experts, (long long)ep);
    }
    return HP_OK;
}

/* ---- the pipeline ---- */

static hp_status setup_mesh(hp_plan *p, const hp_plan_opts *o, hp_err *err)
{
    hp_status st = hp_mesh_check(&o->mesh, err);
    if (st != HP_OK) return st;
    p->mesh = o->mesh;
    p->tp = hp_mesh_size(&o->mesh, "tp");
    p->cp = hp_mesh_size(&o->mesh, "cp");
    p->ep = hp_mesh_ep_size(&o->mesh);
    if (hp_mesh_size(&o->mesh, "pp") > 1 && strcmp(o->mesh.names[0], "pp"))
        return hp_err_set(err, HP_ERR_INPUT, "pp must be the mesh's first (outermost) axis, as Megatron orders it (tp "
                          "innermost, pp outermost): e.g. --mesh pp=4,dp=2,tp=8");
    for (int i = 0; i < o->mesh.n_dims; i++) {
        const char *n = o->mesh.names[i];
        hp_axis a = strcmp(n, "tp") == 0 ? HP_AXIS_TP : strcmp(n, "cp") == 0 ? HP_AXIS_CP
                  : strcmp(n, "ep") == 0 ? HP_AXIS_EP : HP_AXIS_COUNT;
        if (a != HP_AXIS_COUNT && o->mesh.sizes[i] > 1) p->dims[p->n_dims++] = a;
    }
    return HP_OK;
}

/* Drops axes that are not plan dims (an ep Shard stays: EP-marked params carry it under D-10). */
static void mask_nplace(const hp_plan *p, hp_nplace *pl)
{
    for (int a = 0; a < HP_AXIS_COUNT; a++) {
        if (hp__plan_has_dim(p, (hp_axis)a)) continue;
        if (a == HP_AXIS_EP && pl->ax[a].kind == HP_PL_S && p->ep > 1) continue;
        pl->ax[a].kind = HP_PL_ABSENT;
        pl->ax[a].dim = 0;
    }
}

static void mask_io(const hp_plan *p, hp_io_map *m)
{
    for (int i = 0; i < m->n; i++) mask_nplace(p, &m->e[i].pl);
}

static void normalise(hp_plan *p)
{
    for (size_t i = 0; i < p->n_boundaries; i++) {
        hp_boundary *b = &p->boundaries[i];
        for (int k = 0; k < b->n_params; k++) mask_nplace(p, &b->params[k].pl);
        mask_io(p, &b->in_src);
        mask_io(p, &b->in_dst);
        mask_io(p, &b->out_src);
        mask_io(p, &b->out_dst);
    }
}

static hp_status derive_boundaries(hp_plan *p, hp__memo *memo, hp_err *err)
{
    const hp_model *m = p->model;
    hp__group *groups = NULL;
    size_t n_groups = 0;
    hp_status st = hp__group_params(m, p->roles, memo, &p->arena, &groups, &n_groups, err);
    if (st != HP_OK) return st;
    p->boundaries = hp_arena_alloc(&p->arena, (n_groups ? n_groups : 1) * sizeof *p->boundaries);
    if (!p->boundaries) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    hp_role *gr = malloc((m->n_params ? m->n_params : 1) * sizeof *gr);
    if (!gr) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    for (size_t g = 0; g < n_groups && st == HP_OK; g++) {
        for (int k = 0; k < groups[g].n; k++) gr[k] = p->roles[groups[g].params[k]];
        hp_btype t = hp__infer_type(groups[g].fqn, gr, groups[g].n);
        if (!hp__has_template(t)) {
            hp__plan_warn(p, "No template for boundary_type=%s at %s", hp_btype_name(t),
                          groups[g].fqn[0] ? groups[g].fqn : "(root)");
            continue;
        }
        hp_boundary *b = &p->boundaries[p->n_boundaries];
        memset(b, 0, sizeof *b);
        b->fqn = groups[g].fqn;
        b->type = t;
        b->module = hp_model_find_module(m, b->fqn);
        st = hp__build_from_template(p, b, groups[g].params, groups[g].n, memo, err);
        if (st == HP_OK && t == HP_BT_MOE_MLP && p->ep > 1) st = hp__mark_moe_ep(p, b, err);
        if (st == HP_OK) p->n_boundaries++;
    }
    free(gr);
    return st;
}

/* Phase 1 over every parameter, once per name template (memo.c). */
static void classify_all(hp_plan *p, hp__memo *memo)
{
    const hp_model *m = p->model;
    for (size_t i = 0; i < m->n_params; i++) {
        bool fresh = true;
        int *v = hp__memo_param(memo, i, 0, &fresh);
        p->roles[i] = v && !fresh ? (hp_role)*v : hp__classify(m->params[i].name, m->arch, m->model_type);
        if (v && fresh) *v = (int)p->roles[i];
    }
}

hp_status hp_plan_derive(hp_plan **out, const hp_model *m, const hp_plan_opts *o, hp_err *err)
{
    *out = NULL;
    hp_plan *p = hp_calloc(1, sizeof *p);
    if (!p) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    hp_arena_init(&p->arena);
    p->model = m;
    p->sequence_parallel = o->sequence_parallel;
    p->loss_parallel = o->loss_parallel;
    p->allow_uncovered = o->allow_uncovered;
    hp_status st = setup_mesh(p, o, err);
    if (st == HP_OK)
        st = hp_pipeline_split(&p->pipe, m->cfg.num_hidden_layers, hp_mesh_size(&o->mesh, "pp"), o->pp_virtual,
                               o->pp_layers, o->n_pp_layers, &p->arena, err);
    if (st == HP_OK && p->ep > 1 && !o->mesh.ep_axis) st = hp__validate_ep_extend(p, err);
    if (st == HP_OK) st = hp_plan_check_compat(m, p->tp, p->cp, p->ep, o->seq_len, err);
    if (st == HP_OK) {
        p->roles = hp_arena_alloc(&p->arena, (m->n_params ? m->n_params : 1) * sizeof *p->roles);
        if (!p->roles) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    }
    hp__memo *memo = st == HP_OK ? hp__memo_create(m) : NULL; /* phases 1 and 3 once per name template */
    if (st == HP_OK) classify_all(p, memo);
    if (st == HP_OK && o->derive) st = derive_boundaries(p, memo, err);
    hp__memo_destroy(memo);
    if (st == HP_OK && !o->derive) hp_log(HP_LOG_INFO, "derive=False: template derivation skipped; the plan holds only the overrides");
    if (st == HP_OK) st = hp__apply_overrides(p, o->overrides, o->derive, err);
    if (st == HP_OK && o->ep_compute) st = hp__apply_ep_compute(p, o->ep_compute, err);
    /* A plan of no boundary shards nothing, and `shard --plan` would copy the model to every rank: with
     * derive=False that means no override applied, which is a mistake worth stopping on. */
    if (st == HP_OK && !o->derive && p->n_boundaries == 0)
        st = hp_err_set(err, HP_ERR_INPUT,
                        "derive=False: the plan holds only the overrides, and %s; the plan would cover nothing. "
                        "Give overrides that declare boundaries (and check their 'when'), or derive the plan",
                        !o->overrides || !hp_overrides_count(o->overrides)
                            ? "no override entry was given"
                            : "no override entry applied (each one's 'when' is inactive on this mesh)");
    if (st == HP_OK) st = hp__finalize(p, o, err);
    if (st == HP_OK) normalise(p);
    if (st != HP_OK) {
        hp_plan_free(p);
        return st;
    }
    *out = p;
    return HP_OK;
}

void hp_plan_free(hp_plan *p)
{
    if (!p) return;
    hp_arena_free(&p->arena);
    free(p);
}
