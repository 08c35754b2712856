/*
 * archetypes.c — the EP compute archetype registry (spec §10.2), preflight, and suggested overrides.
 *
 * An archetype names how a MoE block computes under expert parallelism: which router, which shared expert.
 * The planner knows each archetype's key, the hyper_parallel factory paths that name it in existing YAML
 * files, and the submodules the block must have (the seed's interface assertion). The runtime (src/moe)
 * implements the same keys. The EP runtime is never chosen silently: an EP-marked boundary without
 * local_compute_fn fails preflight with a ready-to-paste YAML override.
 */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "plan/overrides.h"

typedef struct archetype {
    const char *key;
    const char *factory;        /* the hyper_parallel factory path that names it (function names are unique) */
    const char *children[5];    /* expected submodules ("a|b": either), NULL-terminated */
} archetype;

/* The shared table (src/core/archetypes.def); the runtime's columns are not the planner's business. */
#define HP_ARCHETYPE(id, key, factory, router, shared, act, norm, n0, n1, n2, n3) {key, factory, {n0, n1, n2, n3, NULL}},
static const archetype g_archetypes[] = {
#include "core/archetypes.def"
};
#undef HP_ARCHETYPE

#define N_ARCH (sizeof g_archetypes / sizeof *g_archetypes)

size_t hp_archetype_count(void) { return N_ARCH; }
const char *hp_archetype_key(size_t i) { return i < N_ARCH ? g_archetypes[i].key : NULL; }

/* ", key" for every row of the table, joined by the compiler; the list starts after the first ", ". */
#define HP_ARCHETYPE(id, key, ...) ", " key
static const char g_key_list[] =
#include "core/archetypes.def"
    ;
#undef HP_ARCHETYPE

const char *hp_archetype_list(void) { return g_key_list + 2; }

/* The key itself, a full factory path, or any dotted suffix of one ("recipes.qwen2moe_ep_compute_fn"). */
const char *hp_archetype_resolve(const char *target)
{
    for (size_t i = 0; i < N_ARCH; i++) {
        if (!strcmp(target, g_archetypes[i].key)) return g_archetypes[i].key;
        for (int f = 0; f < 1 && g_archetypes[i].factory; f++) {
            const char *path = g_archetypes[i].factory;
            size_t lp = strlen(path), lt = strlen(target);
            if (lt <= lp && !strcmp(path + lp - lt, target) && (lt == lp || path[lp - lt - 1] == '.'))
                return g_archetypes[i].key;
        }
    }
    return NULL;
}

const char *const *hp__archetype_children(const char *key)
{
    for (size_t i = 0; i < N_ARCH; i++)
        if (!strcmp(key, g_archetypes[i].key)) return g_archetypes[i].children;
    return NULL;
}

const char *hp_archetype_suggest(const hp_model *m)
{
    return hp_model_suggested_archetype(m);
}

/* Layer and expert indices become '*': model.layers.7.mlp -> model.layers.*.mlp */
static void globify(const char *fqn, char *out, size_t cap)
{
    size_t o = 0;
    for (const char *s = fqn; *s && o + 2 < cap;) {
        bool seg_start = s == fqn || s[-1] == '.';
        if (seg_start && isdigit((unsigned char)*s)) {
            const char *e = s;
            while (isdigit((unsigned char)*e)) e++;
            if (*e == '.' || *e == '\0') {
                out[o++] = '*';
                s = e;
                continue;
            }
        }
        out[o++] = *s++;
    }
    out[o] = '\0';
}

static bool needs_compute(const hp_boundary *b) { return b->ep_size > 0 && !b->local_compute_fn; }

/* The hyper_parallel factory path of archetype key (the family's own recipe), or NULL. */
static const char *factory_of(const char *key)
{
    for (size_t i = 0; key && i < N_ARCH; i++)
        if (!strcmp(key, g_archetypes[i].key)) return g_archetypes[i].factory;
    return NULL;
}

/* Patterns for the boundaries that need a compute: a glob when it hits only such boundaries, else exact.
 * command: the hyperpar command the file is to be passed to ("run"; "plan" when NULL). */
static void suggestion_yaml(const hp_plan *p, const char *command, hp_buf *out)
{
    const char *arch = hp_archetype_suggest(p->model);
    hp_buf_printf(out, "# hyperpar plan overrides for %s (ep=%lld): declare the EP compute of every MoE boundary.\n",
                  p->model->path, (long long)p->ep);
    hp_buf_printf(out, "# Review, then pass with: hyperpar %s ... --overrides FILE\n", command ? command : "plan");
    char done[64][160];
    int n_done = 0;
    for (size_t i = 0; i < p->n_boundaries; i++) {
        const hp_boundary *b = &p->boundaries[i];
        if (!needs_compute(b)) continue;
        char pat[160];
        globify(b->fqn, pat, sizeof pat);
        bool glob_ok = true;
        for (size_t k = 0; k < p->n_boundaries && glob_ok; k++)
            if (hp_glob_match(pat, p->boundaries[k].fqn) && !needs_compute(&p->boundaries[k])) glob_ok = false;
        const char *m = glob_ok ? pat : b->fqn;
        bool seen = false;
        for (int k = 0; k < n_done; k++) seen |= !strcmp(done[k], m);
        if (seen) continue;
        if (n_done < 64) snprintf(done[n_done++], sizeof done[0], "%s", m);
        hp_buf_printf(out,
                      "- match: \"%s\"\n"
                      "  when: ep\n"
                      "  region_dispatch: false\n"
                      "  local_compute_fn:\n"
                      "    _target_: %s\n",
                      m, arch);
    }
}

hp_status hp_plan_suggest_overrides(const hp_plan *p, hp_buf *out, hp_err *err)
{
    suggestion_yaml(p, NULL, out);
    if (out->oom) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    return HP_OK;
}

hp_status hp_plan_preflight(const hp_plan *p, const char *command, hp_err *err)
{
    for (size_t i = 0; i < p->n_boundaries; i++) {
        const hp_boundary *b = &p->boundaries[i];
        if (b->local_compute_fn && b->region_dispatch < 0)
            return hp_err_set(err, HP_ERR_INPUT,
                              "boundary '%s' declares local_compute_fn=%s without region_dispatch; add "
                              "'region_dispatch: false' (compute on local tensors) to its override",
                              b->fqn, b->local_compute_fn);
        if (!b->local_compute_fn && b->region_dispatch > 0)
            return hp_err_set(err, HP_ERR_INPUT,
                              "boundary '%s' sets region_dispatch=true without any injection; it is redundant — "
                              "remove it or declare a local_compute_fn",
                              b->fqn);
    }
    int n = 0;
    const char *first = NULL;
    for (size_t i = 0; i < p->n_boundaries; i++)
        if (needs_compute(&p->boundaries[i])) {
            if (!first) first = p->boundaries[i].fqn;
            n++;
        }
    if (!n) return HP_OK;
    hp_buf y;
    hp_buf_init(&y);
    suggestion_yaml(p, command, &y);
    const char *arch = hp_archetype_suggest(p->model), *factory = factory_of(arch);
    const char *cmd = command ? command : "plan";
    char eg[300] = "", flag[200];
    if (factory) snprintf(eg, sizeof eg, " (the family's recipe: %s)", factory);
    else if (arch) snprintf(eg, sizeof eg, " (the family's archetype %s)", arch);
    if (arch) snprintf(flag, sizeof flag, "--ep-compute suggested (this family's archetype %s) or --ep-compute "
                       "ARCHETYPE", arch);
    else snprintf(flag, sizeof flag, "--ep-compute ARCHETYPE");
    hp_status st = hp_err_set(err, HP_ERR_INPUT,
                              "%d EP-marked boundar%s (first: '%s') ha%s no local_compute_fn: the expert-parallel "
                              "compute is never chosen silently; declare it with: hyperpar %s ... %s; or with "
                              "region_dispatch in an overrides file and pass it with: hyperpar %s ... --overrides "
                              "FILE, e.g.%s:\n%s",
                              n, n == 1 ? "y" : "ies", first, n == 1 ? "s" : "ve", cmd, flag, cmd, eg,
                              y.data ? y.data : "");
    hp_buf_free(&y);
    return st;
}
