/*
 * cmd_shard.c — `hyperpar shard MODEL (--plan plan.json | plan flags) --out DIR` and
 * `hyperpar merge DIR --out OUT [--max-shard-size 5GB]`: per-rank safetensors files and the exact way back;
 * `hyperpar merge RUN[/step-<t>] --out OUT [--dtype f32|bf16]`: a training checkpoint as a Hugging Face folder
 * (hyperpar/trainckpt.h decides which DIR is).
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "signals.h"
#include "hyperpar/overrides.h"
#include "hyperpar/shard.h"
#include "hyperpar/trainckpt.h"

enum { O_PLAN = 1000, O_THREADS, O_FORCE, O_QUIET, O_MAX, O_VERIFY, O_DTYPE };
#define G_PLAN "the plan, derived as 'hyperpar plan' does (see its --help), unless --plan"

typedef struct shard_args {
    cli_plan_flags pf;
    const char *plan, *out;
    int64_t threads;
    bool force, quiet;
} shard_args;

static const cli_opt g_shard_opts[] = {
    CLI_OPT_HELP,
    {"out", 'o', "DIR", "output folder (refused when non-empty unless --force)", CLI_SHORT, NULL,
     CLI_STR(shard_args, out)},
    {"threads", O_THREADS, "N", "threads over rank files, or over the tensors of a file (1)", 0, NULL,
     CLI_INT(shard_args, threads, 1, 256)},
    {"force", O_FORCE, NULL, "replace an earlier hyperpar output in DIR (one holding its .hyperpar-output\n"
                             "marker and nothing else); never any other folder. The old one is removed\n"
                             "after the new one is complete", 0, NULL, CLI_FLAG(shard_args, force)},
    {"quiet", O_QUIET, NULL, "no progress line (it is shown only on a terminal anyway)", 0, NULL,
     CLI_FLAG(shard_args, quiet)},
    {"plan", O_PLAN, "FILE", "a plan written by 'hyperpar plan --format json' for this checkpoint", 0, G_PLAN,
     CLI_STR(shard_args, plan)},
    CLI_OPTS_MESH(G_PLAN, shard_args, pf), CLI_OPTS_EP(G_PLAN, shard_args, pf), CLI_OPTS_PLAN(G_PLAN, shard_args, pf),
    {0},
};

const cli_command cli_cmd_shard = {
    .cmd = "shard",
    .summary = "write per-rank safetensors files for a mesh (from a plan)",
    .forms = {{NULL, "MODEL --out"}},
    .about = "Writes DIR/rank-XXXXX.safetensors for every rank of the mesh (world = product of the mesh, dp\n"
             "included), each holding exactly the tensors that rank needs at their local shapes, plus\n"
             "DIR/manifest.json (docs/shard-format.md), config.json and plan.json: run and train on DIR use its\n"
             "mesh and plan without flags. dp replicas are hard links to one file. The plan is --plan FILE or\n"
             "derived from the plan flags, not both.\n"
             "The source is read through mmap, one streaming pass; DIR appears only when complete.\n",
    .opts = g_shard_opts,
    .epilog = "DIR may not be, contain or lie inside MODEL, its files, --plan or --overrides. SIGINT / SIGTERM stop\n"
              "the run and remove its unfinished output.\n",
    .run = cmd_shard,
};

typedef struct merge_args {
    const char *out;
    uint64_t max_shard_size;
    hp_dtype dtype;
    bool force, quiet, verify;
} merge_args;

static bool max_size_fn(const cli_ctx *x);

static const cli_enum g_merge_dtypes = {NULL, {{"f32", HP_DT_F32, false}, {"float32", HP_DT_F32, true},
                                               {"bf16", HP_DT_BF16, false}, {"bfloat16", HP_DT_BF16, true}}};

static const cli_opt g_merge_opts[] = {
    CLI_OPT_HELP,
    {"out", 'o', "OUT", "output folder (refused when non-empty unless --force)", CLI_SHORT, NULL,
     CLI_STR(merge_args, out)},
    {"max-shard-size", O_MAX, "S", "bytes per output file: 5GB (default), 500MB, 2GiB, ...", 0, NULL,
     CLI_FN(merge_args, max_shard_size, max_size_fn)},
    {"verify", O_VERIFY, NULL, "also check every rank file's checksum from manifest.json (reads each rank\n"
                               "file once more); without it, identity, sizes, shapes and layouts are checked", 0, NULL,
     CLI_FLAG(merge_args, verify)},
    {"force", O_FORCE, NULL, "replace an earlier hyperpar output in OUT (never any other folder)", 0, NULL,
     CLI_FLAG(merge_args, force)},
    {"quiet", O_QUIET, NULL, "no progress line", 0, NULL, CLI_FLAG(merge_args, quiet)},
    {"dtype", O_DTYPE, "T", "a training checkpoint only: f32 (default: the f32 masters as trained) or bf16\n"
                            "(rounded to nearest even); config.json's torch_dtype says which", 0, NULL,
     CLI_ENUM(merge_args, dtype, g_merge_dtypes)},
    {0},
};

const cli_command cli_cmd_merge = {
    .cmd = "merge",
    .summary = "rebuild the original checkpoint from a shard folder",
    .forms = {{NULL, "DIR --out"}, {NULL, "RUN[/step-<t>] --out"}},
    .about = "Rebuilds the original checkpoint from a 'hyperpar shard' folder: every rank file is validated,\n"
             "every tensor reassembled from its slices with the original names, shapes, dtypes and bytes.\n"
             "Writes OUT/model.safetensors, or model-0000i-of-0000n.safetensors and model.safetensors.index.json\n"
             "when the total is over --max-shard-size, plus config.json. --max-shard-size and --verify go with a\n"
             "shard folder.\n"
             "\n"
             "Or turns a training checkpoint ('hyperpar train --save-every K --out RUN' wrote RUN/step-<t>; RUN\n"
             "alone means its last complete one) into a Hugging Face folder: OUT/config.json and\n"
             "OUT/model.safetensors, the parameters as trained (--dtype), the same bytes from the same checkpoint.\n"
             "An incomplete checkpoint (a file its state.json names is missing) is refused.\n",
    .opts = g_merge_opts,
    .run = cmd_merge,
};

static bool max_size_fn(const cli_ctx *x)
{
    if (hp_shard_parse_size(x->arg, cli_target(x))) return true;
    cli_usage_error(x->cmd, "--max-shard-size expects a size such as 5GB, 500MB or 2GiB, got '%s'", x->arg);
    return false;
}

static int report(const char *what, const char *out, const hp_shard_stats *s)
{
    char b[32], r[32], links[64] = "";
    double rate = s->seconds > 0 ? (double)s->bytes_written / s->seconds : 0;
    if (s->links)
        snprintf(links, sizeof links, " + %llu replica link%s", (unsigned long long)s->links, s->links == 1 ? "" : "s");
    fprintf(stderr, "%s %s: %llu file%s%s, %s in %.2fs (%s/s)\n", what, out, (unsigned long long)s->files,
            s->files == 1 ? "" : "s", links, hp_format_bytes(s->bytes_written, b, sizeof b), s->seconds,
            hp_format_bytes((uint64_t)rate, r, sizeof r));
    return HP_EXIT_OK;
}

int cmd_shard(int argc, char **argv)
{
    shard_args a = {.threads = 1};
    cli_plan_flags_init(&a.pf);
    hp_err err;
    cli_parser cp = {.command = &cli_cmd_shard};
    int prc = cli_parse(&cp, &a, argc, argv);
    if (prc != HP_EXIT_OK) return prc == CLI_HELP ? HP_EXIT_OK : prc;
    cli_plan_flags pf = a.pf;
    hp_shard_opts so = {.threads = 1, .progress = isatty(2) && !a.quiet, .force = a.force};
    const char *plan_path = a.plan, *out = a.out;
    int64_t threads = a.threads;
    if (optind != argc - 1) return cli_usage_error("shard", "expected exactly one MODEL");
    if (!out) return cli_usage_error("shard", "--out DIR is required");
    if (plan_path && cli_plan_flags_any(&pf))
        return cli_usage_error("shard", "give either --plan or the plan flags (--mesh, --tp, --ep, ...), not both");
    so.threads = (int)threads;
    int mrc = cli_plan_flags_mesh("shard", &pf, 1);
    if (mrc != HP_EXIT_OK) return mrc;
    hp_plan_opts po = pf.po;
    const char *overrides = pf.overrides;

    hp_overrides *ov = NULL;
    if (cli_plan_flags_apply(&pf, NULL, &ov, &err) != HP_OK) return cli_fail(&err);
    po.overrides = ov;
    hp_model *m = NULL;
    hp_model_opts mo = {.layout = HP_LAYOUT_PER_EXPERT};
    if (hp_model_open(&m, argv[optind], &mo, &err) != HP_OK) {
        hp_overrides_free(ov);
        return cli_fail(&err);
    }
    cli_plan_flags_freeze(&pf, m);
    hp_plan *p = NULL;
    char *plan_text = NULL;
    hp_status st = plan_path ? hp_shard_read_plan(&p, m, plan_path, &plan_text, &err) : hp_plan_derive(&p, m, &po, &err);
    hp_shard_stats stats;
    bool caught = false;
    if (st == HP_OK) {
        /* Sharding does not execute the plan: a missing EP compute declaration is only a warning here. */
        hp_err w;
        if (hp_plan_preflight(p, "shard", &w) != HP_OK) cli_warn("%s", w.msg);
        if (plan_path) {
            const char *slash = strrchr(plan_path, '/');
            so.plan_file = slash ? slash + 1 : plan_path;
        }
        so.plan_text = plan_text;
        const char *inputs[2];
        int n_inputs = 0;
        if (plan_path) inputs[n_inputs++] = plan_path;
        if (overrides) inputs[n_inputs++] = overrides;
        so.inputs = inputs;
        so.n_inputs = n_inputs;
        cli_signals_catch();
        caught = true;
        st = hp_shard_write(m, p, out, &so, &stats, &err);
    }
    int rc = st == HP_OK ? report("sharded into", out, &stats) : cli_fail(&err);
    if (caught) rc = cli_signals_release(rc);
    free(plan_text);
    hp_plan_free(p);
    hp_model_close(m);
    hp_overrides_free(ov);
    return rc;
}

int cmd_merge(int argc, char **argv)
{
    merge_args a = {.dtype = HP_DT_F32}; /* max_shard_size 0: hp_shard_merge's default */
    cli_parser cp = {.command = &cli_cmd_merge};
    int prc = cli_parse(&cp, &a, argc, argv);
    if (prc != HP_EXIT_OK) return prc == CLI_HELP ? HP_EXIT_OK : prc;
    hp_merge_opts mo = {.progress = isatty(2) && !a.quiet, .force = a.force, .verify = a.verify,
                         .max_shard_size = a.max_shard_size};
    hp_train_merge_opts to = {.dtype = a.dtype, .force = a.force};
    const char *out = a.out;
    /* options that belong to one kind of input */
    bool shard_only = cli_given(&cp, O_MAX) || cli_given(&cp, O_VERIFY), dtype_given = cli_given(&cp, O_DTYPE);
    if (optind != argc - 1)
        return cli_usage_error("merge", "expected exactly one shard folder or training checkpoint DIR");
    if (!out) return cli_usage_error("merge", "--out OUT is required");
    const char *dir = argv[optind];
    bool train = hp_train_ckpt_is(dir);
    if (train && shard_only)
        return cli_usage_error("merge", "--max-shard-size and --verify go with a shard folder; %s is a training "
                               "checkpoint", dir);
    if (!train && dtype_given)
        return cli_usage_error("merge", "--dtype goes with a training checkpoint; %s is not one (a shard folder "
                               "merges to its original dtypes)", dir);
    hp_err err;
    hp_shard_stats stats;
    int64_t step = 0;
    cli_signals_catch();
    int rc;
    if (train)
        rc = hp_train_ckpt_merge(dir, out, &to, &step, &err) == HP_OK
                 ? (fprintf(stderr, "merged the checkpoint of step %lld into %s (%s)\n", (long long)step, out,
                            to.dtype == HP_DT_BF16 ? "bfloat16" : "float32"), HP_EXIT_OK)
                 : cli_fail(&err);
    else
        rc = hp_shard_merge(dir, out, &mo, &stats, &err) == HP_OK ? report("merged into", out, &stats) : cli_fail(&err);
    return cli_signals_release(rc);
}
