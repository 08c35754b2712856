/*
 * planflags.c — the plan and mesh flags that plan, shard, cost, advise, run, validate and train share: --mesh,
 * --dp/--cp/--tp, --ep, --ep-axis, --no-sequence-parallel, --loss-parallel, --freeze, --allow-uncovered,
 * --packed-fused, --overrides, --ep-compute (their table entries: CLI_OPTS_MESH, CLI_OPTS_EP, CLI_OPTS_PLAN in
 * cli.h, parsed by cli_parse; the two that need code are here); and the plan a command that executes one runs
 * (cli_plan_resolve: --plan, a shard folder's own plan, or derived). Sizes are plain digits in
 * [1, HP_MESH_MAX_SIZE]. An option given twice is refused by cli_getopt (--freeze is the one that repeats).
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "hyperpar/overrides.h"
#include "hyperpar/plan.h"
#include "hyperpar/shard.h"

void cli_plan_flags_init(cli_plan_flags *f)
{
    memset(f, 0, sizeof *f);
    f->dp = f->cp = f->tp = f->ep = f->pp = 1;
    hp_plan_opts_default(&f->po);
}

bool cli_plan_flags_sizes(const cli_plan_flags *f) { return f->dp_given || f->cp_given || f->tp_given || f->pp_given; }

bool cli_plan_flags_shaping(const cli_plan_flags *f)
{
    const hp_plan_opts *o = &f->po;
    return f->overrides || f->ep_compute || !o->sequence_parallel || o->loss_parallel || o->packed_fused ||
           o->allow_uncovered;
}

bool cli_plan_flags_default_mesh(const cli_plan_flags *f)
{
    return !f->mesh_spec && !cli_plan_flags_sizes(f) && !f->ep_given && !f->ep_axis;
}

bool cli_plan_flags_any(const cli_plan_flags *f)
{
    return !cli_plan_flags_default_mesh(f) || cli_plan_flags_shaping(f) || f->n_freeze > 0;
}

bool cli_plan_freeze_fn(const cli_ctx *x)
{
    cli_plan_flags *f = cli_target(x);
    size_t bad = 0;
    const char *why = NULL;
    if (f->n_freeze == 64) return cli_usage_error(x->cmd, "at most 64 --freeze patterns"), false;
    if (!x->arg[0]) return cli_usage_error(x->cmd, "--freeze needs a glob, got an empty string"), false;
    if (!hp_glob_valid(x->arg, &bad, &why))
        return cli_usage_error(x->cmd, "--freeze '%s' is not a valid glob: %s at character %zu", x->arg, why, bad + 1),
               false;
    f->freeze[f->n_freeze++] = x->arg;
    return true;
}

bool cli_plan_pp_layers_fn(const cli_ctx *x)
{
    cli_plan_flags *f = cli_target(x);
    const char *s = x->arg;
    int n = 0;
    while (*s) {
        char *end = NULL;
        if (*s < '0' || *s > '9' || n == (int)(sizeof f->pp_layers / sizeof *f->pp_layers))
            return cli_usage_error(x->cmd, "--pp-layers '%s': expected at most 1024 layer counts separated by commas, "
                                   "such as 5,6,6,5", x->arg), false;
        long long v = strtoll(s, &end, 10);
        if (v > HP_MESH_MAX_SIZE || (*end && *end != ',') || (*end == ',' && !end[1]))
            return cli_usage_error(x->cmd, "--pp-layers '%s': expected layer counts separated by commas, such as "
                                   "5,6,6,5", x->arg), false;
        f->pp_layers[n++] = v;
        s = *end ? end + 1 : end;
    }
    if (!n) return cli_usage_error(x->cmd, "--pp-layers needs layer counts, such as 5,6,6,5"), false;
    f->po.pp_layers = f->pp_layers;
    f->po.n_pp_layers = n;
    return true;
}

/* Checked against the model when the plan is derived (hp_plan_opts.ep_compute): the same for every command. */
bool cli_plan_ep_compute_fn(const cli_ctx *x)
{
    cli_plan_flags *f = cli_target(x);
    if (!x->arg[0])
        return cli_usage_error(x->cmd, "--ep-compute needs suggested or an archetype, got an empty string"), false;
    f->ep_compute = f->po.ep_compute = x->arg;
    return true;
}

int cli_plan_flags_mesh(const char *cmd, cli_plan_flags *f, int64_t default_tp)
{
    bool sizes = cli_plan_flags_sizes(f);
    if (f->mesh_spec && sizes) return cli_usage_error(cmd, "give either --mesh or --dp/--cp/--tp/--pp, not both");
    int64_t tp = sizes || f->mesh_spec ? f->tp : default_tp;
    int rc = cli_mesh(cmd, f->mesh_spec, f->dp, f->cp, tp, f->ep, f->ep_axis, &f->po.mesh);
    if (rc != HP_EXIT_OK) return rc;
    hp_err err;
    if (f->pp_given && f->pp > 1 && hp_mesh_add_pp(&f->po.mesh, f->pp, &err) != HP_OK) return cli_fail_once(&err);
    if (hp_mesh_check(&f->po.mesh, &err) != HP_OK) return cli_fail_once(&err);
    return HP_EXIT_OK;
}

hp_status cli_plan_flags_apply(cli_plan_flags *f, hp_model *m, struct hp_overrides **ov, hp_err *err)
{
    *ov = NULL;
    if (f->overrides) {
        hp_status st = hp_overrides_load(ov, f->overrides, err);
        if (st != HP_OK) return st;
    }
    f->po.overrides = *ov;
    if (m) cli_plan_flags_freeze(f, m);
    return HP_OK;
}

void cli_plan_flags_freeze(const cli_plan_flags *f, hp_model *m)
{
    for (int i = 0; i < f->n_freeze; i++)
        if (hp_model_freeze(m, f->freeze[i]) == 0)
            cli_warn("--freeze '%s' matched no parameter", f->freeze[i]);
}

/* One given mesh size against the shard folder's: HP_ERR_INPUT naming both when they differ. */
static hp_status same_size(const char *flag, int64_t given, const char *axis, int64_t folder, const char *dir,
                           const hp_mesh *fm, hp_err *err)
{
    if (given == folder) return HP_OK;
    char ms[160];
    return hp_err_set(err, HP_ERR_INPUT, "%s %lld contradicts the shard folder's %s=%lld (%s was sharded for %s); "
                      "drop the flag (the folder's mesh is used) or shard again for this mesh", flag, (long long)given,
                      axis, (long long)folder, dir, hp_mesh_str(fm, ms, sizeof ms));
}

/* The mesh flags given against the folder's mesh fm: each size given must be the folder's, and the EP mode too. */
static hp_status check_mesh(const cli_plan_flags *f, const hp_mesh *fm, const char *dir, hp_err *err)
{
    static const char *const axes[] = {"dp", "cp", "tp"};
    char ms[160], fs[160];
    hp_mesh_str(fm, fs, sizeof fs);
    if (f->mesh_spec) { /* every axis is given: absent ones are 1 */
        const hp_mesh *g = &f->po.mesh;
        for (int i = 0; i < 3; i++)
            if (hp_mesh_size(g, axes[i]) != hp_mesh_size(fm, axes[i]))
                return hp_err_set(err, HP_ERR_INPUT, "--mesh %s gives %s=%lld, which contradicts the shard folder's "
                                  "%s=%lld (%s was sharded for %s); drop --mesh (the folder's mesh is used)",
                                  f->mesh_spec, axes[i], (long long)hp_mesh_size(g, axes[i]), axes[i],
                                  (long long)hp_mesh_size(fm, axes[i]), dir, fs);
        if (hp_mesh_ep_size(g) != hp_mesh_ep_size(fm) || g->ep_axis != fm->ep_axis)
            return hp_err_set(err, HP_ERR_INPUT, "--mesh %s%s gives %s, which contradicts the shard folder's %s (%s "
                              "was sharded for it); drop the mesh flags (the folder's mesh is used)", f->mesh_spec,
                              f->ep_given ? " with --ep" : "", hp_mesh_str(g, ms, sizeof ms), fs, dir);
        return HP_OK;
    }
    const bool given[] = {f->dp_given, f->cp_given, f->tp_given};
    const int64_t size[] = {f->dp, f->cp, f->tp};
    const char *const flag[] = {"--dp", "--cp", "--tp"};
    for (int i = 0; i < 3; i++) {
        hp_status st = given[i] ? same_size(flag[i], size[i], axes[i], hp_mesh_size(fm, axes[i]), dir, fm, err) : HP_OK;
        if (st != HP_OK) return st;
    }
    if (f->ep_given) {
        hp_status st = same_size("--ep", f->ep, "ep", hp_mesh_ep_size(fm), dir, fm, err);
        if (st != HP_OK) return st;
    }
    if ((f->ep_given || f->ep_axis) && f->ep_axis != fm->ep_axis)
        return hp_err_set(err, HP_ERR_INPUT, "%s contradicts the shard folder's %s (%s was sharded for %s): %s",
                          f->ep_axis ? "--ep-axis (an explicit ep axis)" : "--ep without --ep-axis (TP-extend-EP)",
                          fm->ep_axis ? "explicit ep axis" : "TP-extend-EP", dir, fs,
                          fm->ep_axis ? "TP-extend-EP rides on the tp ranks, an ep axis adds ranks of its own"
                                      : "its EP groups ride on the dense ranks, with no ep axis of their own");
    return HP_OK;
}

/* The plan the flags derived (p) against the one the folder was written with (fp): the same sequence and loss
 * parallelism and, where the folder declares one, the same EP compute on every EP-marked block (a folder sharded
 * without one takes the flags'). The placements are held to the rank files by the runner (their layout). */
static hp_status check_same(const cli_plan_flags *f, const hp_plan *fp, const hp_plan *p, const char *dir, hp_err *err)
{
    const char *what = NULL;
    bool mine = false, theirs = false;
    if (p->sequence_parallel != fp->sequence_parallel)
        what = "sequence_parallel", mine = p->sequence_parallel, theirs = fp->sequence_parallel;
    else if (p->loss_parallel != fp->loss_parallel)
        what = "loss_parallel", mine = p->loss_parallel, theirs = fp->loss_parallel;
    if (what)
        return hp_err_set(err, HP_ERR_INPUT, "the plan flags give %s=%s, which contradicts the shard folder's plan "
                          "(%s/plan.json: %s=%s); drop the plan flags (the folder's plan is used) or shard again with "
                          "them", what, mine ? "true" : "false", dir, what, theirs ? "true" : "false");
    for (size_t i = 0; i < p->n_boundaries; i++) {
        const hp_boundary *b = &p->boundaries[i], *fb = hp_plan_find(fp, b->fqn);
        const char *a = b->local_compute_fn, *z = fb ? fb->local_compute_fn : NULL;
        /* a folder sharded without an EP compute (shard only warns) takes the one the flags declare */
        if (b->ep_size <= 0 || !z || (a && !strcmp(a, z))) continue;
        char flag[200];
        if (f->ep_compute) snprintf(flag, sizeof flag, "--ep-compute %s", f->ep_compute);
        else snprintf(flag, sizeof flag, "the plan flags");
        return hp_err_set(err, HP_ERR_INPUT, "%s give%s '%s' the EP compute %s, which contradicts the shard folder's "
                          "%s (%s/plan.json); drop the plan flags (the folder's plan is used) or shard again with them",
                          flag, f->ep_compute ? "s" : "", b->fqn, a ? a : "none", z ? z : "none", dir);
    }
    return HP_OK;
}

hp_status cli_plan_resolve(cli_plan_flags *f, const char *plan_path, const char *shard_dir, bool default_mesh,
                           int64_t n_procs, hp_model *m, hp_plan **p, hp_overrides **ov, hp_err *err)
{
    *p = NULL;
    *ov = NULL;
    if (plan_path) return hp_shard_read_plan(p, m, plan_path, NULL, err);
    hp_plan *fp = NULL;
    hp_status st = HP_OK;
    if (shard_dir) {
        hp_mesh fm;
        st = hp_shard_folder_plan(&fp, &fm, m, shard_dir, err);
        if (st == HP_OK && !default_mesh) st = check_mesh(f, &fm, shard_dir, err);
        if (st == HP_OK && fp && !cli_plan_flags_shaping(f)) { /* the folder's own plan; --freeze still marks m */
            cli_plan_flags_freeze(f, m);
            *p = fp;
            return HP_OK;
        }
        f->po.mesh = fm; /* the folder's mesh, with whatever shapes the plan beyond it */
    } else if (default_mesh) {
        hp_mesh_from_sizes(&f->po.mesh, 1, 1, n_procs, 0, false);
    }
    if (st == HP_OK) st = cli_plan_flags_apply(f, m, ov, err);
    if (st == HP_OK) st = hp_plan_derive(p, m, &f->po, err);
    if (st == HP_OK && fp) st = check_same(f, fp, *p, shard_dir, err);
    hp_plan_free(fp);
    if (st != HP_OK) {
        hp_plan_free(*p);
        *p = NULL;
    }
    return st;
}
