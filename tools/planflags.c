/*
 * planflags.c — the one parser of the plan and mesh flags that plan, shard, moe and run share: --mesh,
 * --dp/--cp/--tp, --ep, --ep-axis, --no-sequence-parallel, --loss-parallel, --freeze, --allow-uncovered,
 * --packed-fused, --overrides. Sizes are plain digits in [1, HP_MESH_MAX_SIZE]. An option given twice is
 * refused by cli_getopt, which every command parses with (--freeze is the one that repeats).
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "hyperpar/overrides.h"
#include "hyperpar/plan.h"

void cli_plan_flags_init(cli_plan_flags *f)
{
    memset(f, 0, sizeof *f);
    f->dp = f->cp = f->tp = f->ep = 1;
    hp_plan_opts_default(&f->po);
}

/* Plain digits in [min, max] (strtoll alone would also take " 2" and "+2"). */
static bool count(const char *cmd, const char *opt, const char *s, int64_t max, int64_t *out)
{
    bool digits = s[0] != '\0';
    for (const char *q = s; *q && digits; q++) digits = *q >= '0' && *q <= '9';
    if (!digits) {
        cli_usage_error(cmd, "%s expects an integer in [1, %lld] written as plain digits, got '%s'", opt,
                        (long long)max, s);
        return false;
    }
    return cli_parse_i64(cmd, opt, s, 1, max, out);
}

int cli_plan_flag(const char *cmd, int c, const char *arg, cli_plan_flags *f)
{
    if (c < CLI_O_MESH || c >= CLI_O_END) return 0;
    f->any = true;
    switch (c) {
    case CLI_O_MESH: f->mesh_spec = arg; break;
    case CLI_O_DP: if (!count(cmd, "--dp", arg, HP_MESH_MAX_SIZE, &f->dp)) return -1; f->sizes_given = true; break;
    case CLI_O_CP: if (!count(cmd, "--cp", arg, HP_MESH_MAX_SIZE, &f->cp)) return -1; f->sizes_given = true; break;
    case CLI_O_TP: if (!count(cmd, "--tp", arg, HP_MESH_MAX_SIZE, &f->tp)) return -1; f->sizes_given = true; break;
    case CLI_O_EP: if (!count(cmd, "--ep", arg, HP_MESH_MAX_SIZE, &f->ep)) return -1; f->ep_given = true; break;
    case CLI_O_EP_AXIS: f->ep_axis = true; break;
    case CLI_O_NOSP: f->po.sequence_parallel = false; break;
    case CLI_O_LP: f->po.loss_parallel = true; break;
    case CLI_O_FREEZE: {
        size_t bad = 0;
        const char *why = NULL;
        if (f->n_freeze == 64) return cli_usage_error(cmd, "at most 64 --freeze patterns"), -1;
        if (!arg[0]) return cli_usage_error(cmd, "--freeze needs a glob, got an empty string"), -1;
        if (!hp_glob_valid(arg, &bad, &why))
            return cli_usage_error(cmd, "--freeze '%s' is not a valid glob: %s at character %zu", arg, why, bad + 1), -1;
        f->freeze[f->n_freeze++] = arg;
        break;
    }
    case CLI_O_UNCOV: f->po.allow_uncovered = true; break;
    case CLI_O_PACKED: f->po.packed_fused = true; break;
    case CLI_O_OVERRIDES:
        if (!arg[0]) return cli_usage_error(cmd, "--overrides needs a file name, got an empty string"), -1;
        f->overrides = arg;
        break;
    }
    return 1;
}

int cli_plan_flags_mesh(const char *cmd, cli_plan_flags *f, int64_t default_tp)
{
    if (f->mesh_spec && f->sizes_given) return cli_usage_error(cmd, "give either --mesh or --dp/--cp/--tp, not both");
    int64_t tp = f->sizes_given || f->mesh_spec ? f->tp : default_tp;
    int rc = cli_mesh(cmd, f->mesh_spec, f->dp, f->cp, tp, f->ep, f->ep_axis, &f->po.mesh);
    if (rc != HP_EXIT_OK) return rc;
    hp_err err;
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
