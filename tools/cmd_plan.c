/*
 * cmd_plan.c — `hyperpar plan MODEL [mesh flags] [--format json|explain|hf [--hf-version V]] [-o FILE]`.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "hyperpar/overrides.h"
#include "hyperpar/plan.h"

enum { O_WORLD = 1000, O_FORMAT, O_HFVER, O_FQN, O_SEQ, O_LAYOUT, O_NODERIVE, O_SUGGEST, O_END };
enum { F_JSON, F_EXPLAIN, F_HF }; /* --format */

typedef struct plan_args {
    cli_plan_flags pf;
    hp_model_opts mo;
    const char *fqn, *output, *hf_version;
    int format;
    bool suggest;
    int64_t world;
} plan_args;

static const cli_enum g_formats = {"must be", {{"json", F_JSON, false}, {"explain", F_EXPLAIN, false},
                                               {"hf", F_HF, false}}};

static const cli_opt g_opts[] = {
    CLI_OPTS_MESH(NULL, plan_args, pf),
    CLI_OPTS_EP(NULL, plan_args, pf),
    {"world", O_WORLD, "N", "check that the mesh has exactly N ranks", 0, NULL,
     CLI_DIGITS(plan_args, world, 1, HP_MESH_MAX_WORLD)},
    CLI_OPTS_PLAN(NULL, plan_args, pf),
    {"format", O_FORMAT, "F", "json (default, docs/plan-format.md), explain (report with the compiled\n"
                              "boundary collectives), hf (transformers tp_plan/ep_plan and DistributedConfig)", 0, NULL,
     CLI_ENUM(plan_args, format, g_formats)},
    {"hf-version", O_HFVER, "V", "with --format hf: the transformers release the plan is for, MAJOR.MINOR[.PATCH]\n"
                                 "(default " HP_HF_DEFAULT_VERSION "; 5.0 or later): its style names, and no name it\n"
                                 "refuses", 0, NULL, CLI_STR(plan_args, hf_version)},
    {"fqn", O_FQN, "FQN", "with --format explain: only this boundary (or the one declaring this\n"
                          "parameter or module)", 0, NULL, CLI_STR_NONEMPTY(plan_args, fqn, "a boundary name")},
    {"output", 'o', "FILE", "write there (atomically) instead of stdout; never over an input", CLI_SHORT, NULL,
     CLI_STR(plan_args, output)},
    {"seq-len", O_SEQ, "N", "also check the sequence length against cp (divisible by 2*cp)", 0, NULL,
     CLI_DIGITS(plan_args, pf.po.seq_len, 1, INT64_MAX / 4)},
    {"expert-layout", O_LAYOUT, "L", "meta mode: per-expert (default) or batched expert names", 0, NULL,
     CLI_FN(plan_args, mo.layout, cli_layout_fn)},
    {"no-derive", O_NODERIVE, NULL, "derive=false: the plan holds only the overrides (needs --overrides)", 0, NULL,
     CLI_CONST(plan_args, pf.po.derive, 0)},
    {"suggest-overrides", O_SUGGEST, NULL, "print the YAML that declares the EP compute of every EP-marked boundary\n"
                                           "(the family's suggested archetype); review it, then pass it with\n"
                                           "--overrides", 0, NULL, CLI_FLAG(plan_args, suggest)},
    CLI_OPT_HELP,
    {0},
};

const cli_command cli_cmd_plan = {
    .cmd = "plan",
    .summary = "derive the sharding plan for a mesh (json, explain, hf)",
    .forms = {{NULL, "MODEL"}},
    .about = "Derives the tensor/sequence/context/expert-parallel sharding plan of MODEL (a checkpoint folder,\n"
             ".safetensors file or config.json) for a device mesh. Same input, byte-identical output.\n",
    .opts = g_opts,
    .run = cmd_plan,
};

/* Edit distance of a and b, or limit + 1 when it is larger than limit (names of at most 255 bytes). */
static size_t distance(const char *a, const char *b, size_t limit)
{
    size_t na = strlen(a), nb = strlen(b);
    if (na > 255 || nb > 255 || (na > nb ? na - nb : nb - na) > limit) return limit + 1;
    size_t row[256];
    for (size_t j = 0; j <= nb; j++) row[j] = j;
    for (size_t i = 1; i <= na; i++) {
        size_t diag = row[0], best = row[0] = i;
        for (size_t j = 1; j <= nb; j++) {
            size_t up = row[j], v = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < v) v = up + 1;
            if (row[j - 1] + 1 < v) v = row[j - 1] + 1;
            row[j] = v;
            diag = up;
            if (v < best) best = v;
        }
        if (best > limit) return limit + 1;
    }
    return row[nb];
}

typedef struct near {
    const char *name[3];
    size_t d[3];
} near;

static void near_add(near *n, const char *name, const char *want, size_t limit)
{
    size_t d = distance(name, want, limit);
    if (d > limit) return;
    for (int i = 0; i < 3; i++) {
        if (n->name[i] && !strcmp(n->name[i], name)) return;
        if (!n->name[i] || d < n->d[i]) {
            for (int k = 2; k > i; k--) n->name[k] = n->name[k - 1], n->d[k] = n->d[k - 1];
            n->name[i] = name;
            n->d[i] = d;
            return;
        }
    }
}

/* The boundary --fqn names: a boundary, the boundary that declares a parameter, or the one that declares a
 * module's parameters. Prints the error (with close names) and returns NULL when there is none. */
static const char *resolve_fqn(const hp_plan *p, const hp_model *m, const char *fqn)
{
    if (hp_plan_find(p, fqn)) return fqn;
    const hp_boundary *b = NULL;
    const char *kind = NULL;
    if (hp_model_find_param(m, fqn)) {
        kind = "parameter";
        b = hp_plan_param_placement(p, fqn, NULL);
    } else if (hp_model_find_module(m, fqn) >= 0) {
        kind = "module";
        size_t n = strlen(fqn);
        for (size_t i = 0; i < m->n_params && !b; i++)
            if (!strncmp(m->params[i].name, fqn, n) && (n == 0 || m->params[i].name[n] == '.'))
                b = hp_plan_param_placement(p, m->params[i].name, NULL);
    }
    if (b) {
        cli_note("--fqn '%s' is a %s, not a boundary; explaining the boundary '%s' that declares %s", fqn, kind,
                 b->fqn, !strcmp(kind, "module") ? "its parameters" : "it");
        return b->fqn;
    }
    if (kind) {
        cli_error("--fqn '%s' is a %s of %s, but no boundary of this plan declares %s (it is not covered); run "
                  "--format explain without --fqn to list the boundaries", fqn, kind, m->path,
                  !strcmp(kind, "module") ? "its parameters" : "it");
        return NULL;
    }
    size_t limit = strlen(fqn) / 3 + 2;
    near nr = {{NULL}, {0}};
    for (size_t i = 0; i < p->n_boundaries; i++) near_add(&nr, p->boundaries[i].fqn, fqn, limit);
    for (size_t i = 0; i < m->n_modules; i++) near_add(&nr, m->modules[i].name, fqn, limit);
    for (size_t i = 0; i < m->n_params; i++) near_add(&nr, m->params[i].name, fqn, limit);
    hp_buf close;
    hp_buf_init(&close);
    for (int i = 0; i < 3 && nr.name[i]; i++) hp_buf_printf(&close, "%s'%s'", i ? ", " : "; close names: ", nr.name[i]);
    cli_error("--fqn '%s' names no boundary, module or parameter of %s%.*s; run --format explain without --fqn to "
              "list the boundaries", fqn, m->path, (int)close.len, close.data && !close.oom ? close.data : "");
    hp_buf_free(&close);
    return NULL;
}

int cmd_plan(int argc, char **argv)
{
    plan_args a = {.mo = {.layout = HP_LAYOUT_PER_EXPERT}, .format = F_JSON};
    cli_plan_flags_init(&a.pf);
    cli_parser cp = {.command = &cli_cmd_plan};
    int prc = cli_parse(&cp, &a, argc, argv);
    if (prc != HP_EXIT_OK) return prc == CLI_HELP ? HP_EXIT_OK : prc;
    cli_plan_flags pf = a.pf;
    hp_plan_opts *pp = &pf.po;
    hp_model_opts mo = a.mo;
    const char *fqn = a.fqn, *output = a.output, *hf_version = a.hf_version;
    int format = a.format;
    bool suggest = a.suggest, format_given = cli_given(&cp, O_FORMAT);
    int64_t world = a.world;
    if (optind == argc) return cli_usage_error("plan", "expected a MODEL (a checkpoint folder or config.json)");
    if (optind != argc - 1) return cli_usage_error("plan", "expected exactly one MODEL, got '%s' too", argv[optind + 1]);
    if (fqn && (suggest || format != F_EXPLAIN))
        return cli_usage_error("plan", "--fqn selects the boundary that --format explain reports; add --format "
                               "explain%s", suggest ? " and drop --suggest-overrides" : "");
    if (hf_version && (suggest || format != F_HF))
        return cli_usage_error("plan", "--hf-version names the transformers release that --format hf writes for; add "
                               "--format hf%s", suggest ? " and drop --suggest-overrides" : "");
    if (hf_version) {
        hp_err verr;
        if (hp_plan_hf_version_check(hf_version, &verr) != HP_OK)
            return cli_usage_error("plan", "--hf-version: %s", verr.msg);
    }
    if (suggest && format_given)
        return cli_usage_error("plan", "--suggest-overrides prints YAML overrides; it does not combine with --format");
    const char *overrides = pf.overrides;
    if (!pp->derive && !overrides)
        return cli_usage_error("plan", "--no-derive makes a plan of the overrides only, and none were given: the "
                               "plan would cover nothing. Give --overrides FILE, or drop --no-derive");
    if (output) {
        const char *const inputs[] = {overrides};
        int orc = cli_check_output_file("plan", "-o", output, argv[optind], inputs, 1);
        if (orc != HP_EXIT_OK) return orc;
    }

    int mrc = cli_plan_flags_mesh("plan", &pf, 1);
    if (mrc != HP_EXIT_OK) return mrc;
    hp_plan_opts po = pf.po;
    hp_err err;
    if (world && hp_mesh_world(&po.mesh) != world) {
        char buf[256];
        err.status = HP_ERR_INPUT;
        char hint[600];
        snprintf(err.msg, sizeof err.msg,
                 "the mesh %s has %lld ranks but the world size is %lld; the product of the mesh sizes must equal "
                 "the number of ranks%s",
                 hp_mesh_str(&po.mesh, buf, sizeof buf), (long long)hp_mesh_world(&po.mesh), (long long)world,
                 hp_mesh_world_hint(&po.mesh, world, hint, sizeof hint));
        return cli_fail(&err);
    }

    hp_overrides *ov = NULL;
    if (cli_plan_flags_apply(&pf, NULL, &ov, &err) != HP_OK) return cli_fail(&err);
    po.overrides = ov;
    hp_model *m = NULL;
    if (hp_model_open(&m, argv[optind], &mo, &err) != HP_OK) {
        hp_overrides_free(ov);
        return cli_fail(&err);
    }
    cli_plan_flags_freeze(&pf, m);
    hp_plan *p = NULL;
    int rc = HP_EXIT_OK;
    if (hp_plan_derive(&p, m, &po, &err) != HP_OK) {
        rc = cli_fail(&err);
    } else if (fqn && !(fqn = resolve_fqn(p, m, fqn))) {
        rc = HP_EXIT_USAGE;
    } else {
        hp_buf b;
        hp_buf_init(&b);
        hp_status st = suggest                ? hp_plan_suggest_overrides(p, &b, &err)
                       : format == F_JSON    ? hp_plan_to_json(p, &b, &err)
                       : format == F_EXPLAIN ? hp_plan_explain(p, fqn, &b, &err)
                                             : hp_plan_to_hf_target(p, hf_version, &b, &err);
        if (st != HP_OK) rc = cli_fail(&err);
        else if (b.oom) rc = HP_EXIT_RUNTIME;
        else rc = cli_write_atomic(output, b.data ? b.data : "", b.len, "the plan");
        hp_buf_free(&b);
    }
    hp_plan_free(p);
    hp_model_close(m);
    hp_overrides_free(ov);
    return rc;
}
