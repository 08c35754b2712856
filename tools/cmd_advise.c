/*
 * cmd_advise.c — `hyperpar advise MODEL --world N --mem-per-rank SIZE`: every mesh of N ranks the model
 * accepts, the others rejected with their reason, the accepted ranked by predicted step time (docs/cost.md).
 *
 * The search, the rejection rules and the ranking are the library's (hp_advise, src/cost/advise.c); this file
 * parses the flags, prints the advice as text, JSON or HTML (html.c), and writes the plan and shard command
 * lines of the candidates. `hyperpar cost` with the printed flags gives a candidate's figures from its own plan.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "costflags.h"
#include "hyperpar/cost.h"
#include "hyperpar/overrides.h"
#include "hyperpar/plan.h"

enum { O_WORLD = 1000, O_TOP, O_ALL, O_PREFER, O_MAX_PP };

typedef struct advise_args {
    cli_plan_flags pf;
    cli_cost_flags cf;
    int64_t world, top, max_pp;
    bool prefer_headroom;
} advise_args;

static const cli_enum g_prefer = {NULL, {{"time", 0, false}, {"headroom", 1, false}}};

static const cli_opt g_opts[] = {
    {"world", O_WORLD, "N", "ranks in all", 0, NULL, CLI_INT(advise_args, world, 1, 1 << 20)},
    {"top", O_TOP, "K", "candidates printed (5)", 0, NULL, CLI_INT(advise_args, top, 1, 1000)},
    {"all", O_ALL, NULL, "print every candidate: each accepted mesh and each rejected one with its reason", 0,
     NULL, CLI_CONST(advise_args, top, 0)},
    {"prefer", O_PREFER, "P", "decode: time (default: the fastest step first) or headroom (the most\n"
                              "concurrent sequences that fit first, then time)", 0, NULL,
     CLI_ENUM(advise_args, prefer_headroom, g_prefer)},
    {"max-pp", O_MAX_PP, "P", "the most pipeline stages a candidate may have (default: any; 1: no pipeline)", 0,
     NULL, CLI_INT(advise_args, max_pp, 1, 1 << 20)},
    CLI_OPT_HELP,
    CLI_OPTS_COST("the batch and the byte and time model (docs/cost.md)", CLI_ADVISE_BATCH, advise_args, cf),
    CLI_OPTS_PLAN("the plan flags of every candidate (as 'hyperpar plan')", advise_args, pf),
    {0},
};

const cli_command cli_cmd_advise = {
    .cmd = "advise",
    .summary = "which mesh of N ranks to pick: every mesh ranked, the others rejected with why",
    .forms = {{NULL, "MODEL --world --mem-per-rank"}},
    .about = "Every mesh of N ranks for MODEL (a checkpoint or a config.json): pp x dp x cp x tp (pp: pipeline\n"
             "stages, outermost, with 2 virtual stages too in training; --max-pp caps it), with expert parallelism\n"
             "for MoE models both over the dense region (TP-extend-EP, --ep) and as its own axis (--ep-axis). A\n"
             "mesh the model or the runtime cannot take is rejected with the reason (tp does not divide the KV\n"
             "heads, ep does not divide the experts, the most-loaded rank needs more than SIZE, tp spans nodes,\n"
             "...); the rest are ranked by predicted step time, then by the bytes each rank sends over links (ring\n"
             "algorithms: the wire bytes, next to the bytes it puts into collectives). Prints the best K\n"
             "with their per-rank memory and communication, and the commands that make the plan and the shards\n"
             "of the first. Memory: weights exact, activations and state estimated (docs/cost.md).\n"
             "A GPU --hardware (H100, H200, A100, MI300X) states the memory (then --mem-per-rank may be left out),\n"
             "the bf16 rate and the links; the figures are then estimates for a bf16 GPU engine (Megatron-style\n"
             "accounting), not hyperpar's runtime; the figures must fit SIZE less --mem-reserve (a GPU: a tenth\n"
             "of its memory by default, for the runtime and fragmentation).\n"
             "--mode train: micro-batches of 1 row per replica (Megatron's default). When no mesh fits, advise\n"
             "first tries smaller micro-batches (from a larger --micro-batch) and, on a GPU, stronger recompute\n"
             "(selective, then full), and says which it chose and why; a --micro-batch or --recompute given is\n"
             "kept. When still none fits, it prints the binding constraint and the nearest changes that fit (a\n"
             "ZeRO level, recompute, a smaller micro-batch, a shorter sequence, more ranks), each as a command\n"
             "line, and exits 2. --freeze GLOB: the matching tensors train without gradient, optimizer state or\n"
             "master weights.\n"
             "--mode decode (serving): --batch sequences of one new token against a KV cache of --context\n"
             "positions each; every mesh also gets the concurrent sequences that fit in SIZE, and the ranking is\n"
             "by step time (max(compute, memory reads / --mem-bw) + communication) or, with --prefer headroom,\n"
             "by the sequences that fit.\n"
             "The flags of the byte and time model (--gemm-gflops ... --kv-bytes, listed below), given, override\n"
             "--hardware's figures.\n",
    .opts = g_opts,
    .run = cmd_advise,
};

typedef struct ctx {
    const hp_model *m;
    const hp_advice *a;
    const cli_cost_flags *cf;
    const cli_plan_flags *pf;
    const char *model_arg;
    const hp_fit *fit;  /* when nothing fits: the binding constraint and the nearest changes */
    int argc;           /* the command line, for the changes' commands */
    char **argv;
} ctx;

/* The plan + shard command line that makes candidate c (hp_advise_command). */
static void command_of(const ctx *x, const hp_advise_cand *c, char *buf, size_t cap)
{
    hp_advise_command(buf, cap, x->m, c, x->model_arg, x->pf->ep_compute, x->pf->overrides);
}

/* ---- output ---- */

static void print_text(FILE *o, const ctx *x, int top)
{
    const hp_advice *a = x->a;
    const hp_advise_cand *v = a->cands;
    int n = a->n_cands, ok = a->n_ok;
    char b[6][32];
    const hp_cost_opts *co = &x->cf->s.co;
    double secs = a->search_seconds;
    char dec[120];
    snprintf(dec, sizeof dec, "decode: one new token per sequence, a KV cache of %lld positions each",
             (long long)a->context);
    fprintf(o, "model    %s (%s)\nworld    %lld ranks, %s per rank; batch %lld x %lld (%s)", x->m->path,
            x->m->model_type[0] ? x->m->model_type : "?", (long long)a->world,
            hp_format_bytes(a->mem_per_rank, b[0], 32), (long long)a->B, (long long)a->S,
            a->train ? "training" : a->decode ? dec : "inference");
    if (a->train && a->micro_batch)
        fprintf(o, "; micro-batches of %lld row%s per replica", (long long)a->micro_batch, a->micro_batch == 1 ? "" : "s");
    if (a->train && hp_cost_model_gpu(&a->mdl))
        fprintf(o, "; ZeRO-%d, recompute %s", a->mdl.zero, hp_cost_recompute_name(a->mdl.recompute));
    else if (a->train && a->mdl.zero) fprintf(o, "; ZeRO-%d", a->mdl.zero);
    if (co->mdl.ranks_per_node) fprintf(o, "; %lld ranks per node", (long long)co->mdl.ranks_per_node);
    fprintf(o, "\n");
    cli_cost_engine_text(o, &a->mdl, a->train);
    cli_cost_reserve_text(o, &a->mdl, a->mem_per_rank);
    if (a->train) fprintf(o, "chosen   %s\n", a->chosen);
    fprintf(o, "meshes   %d considered, %d accepted, %d rejected (%.3f s, %.2f ms per mesh)\n\n", n, ok, n - ok, secs,
            n ? secs * 1e3 / n : 0.0);
    if (ok) {
        fprintf(o, "best first (%spredicted step time* as printed; equal: fewer bytes over the wire, then less memory; "
                   "memory of the most-loaded rank;\nsent: bytes into collectives, wire: bytes sent over links by the ring "
                   "algorithms%s):\n", a->prefer_headroom ? "the most sequences that fit, then " : "",
                a->decode ? "; seqs: concurrent sequences that fit" : "");
        fprintf(o, "  %-4s %-40s %11s %11s %11s %11s %11s %11s %10s%s\n", "#", "mesh", "memory", "weights", "activ.*",
                a->train ? "state*" : "KV cache*", "sent/step", "wire/step", "step*", a->decode ? "      seqs*" : "");
        for (int i = 0; i < ok && (top <= 0 || i < top); i++) {
            const hp_advise_cand *c = &v[i];
            char ts[24];
            fprintf(o, "  %-4d %-40s %11s %11s %11s %11s %11s %11s %10s", i + 1, c->mesh,
                    hp_format_bytes(c->max_bytes, b[0], 32), hp_format_bytes(c->weight_bytes, b[1], 32),
                    hp_format_bytes(c->act_bytes, b[2], 32), hp_format_bytes(c->state_bytes, b[3], 32),
                    hp_format_bytes(c->sent_bytes, b[4], 32), hp_format_bytes(c->wire_bytes, b[5], 32),
                    cli_seconds(c->t_step, ts, sizeof ts));
            if (a->decode) fprintf(o, " %10lld", (long long)c->seqs);
            fprintf(o, "\n");
        }
        char cmd[HP_ADVISE_COMMAND_MAX], fl[300];
        command_of(x, &v[0], cmd, sizeof cmd);
        fprintf(o, "\nmake the plan and the shards of #1:\n  %s\n", cmd);
        if (x->m->meta) fprintf(o, "  %s\n", HP_ADVISE_CKPT_NOTE);
        hp_advise_flags(fl, sizeof fl, x->m, &v[0], x->pf->ep_compute, x->pf->overrides);
        char extra[200] = "";
        if (a->mdl.hw && a->mdl.hw->gpu)
            snprintf(extra, sizeof extra, " --hardware %s%s%s", a->mdl.hw->name, a->train ? " --recompute " : "",
                     a->train ? hp_cost_recompute_name(a->mdl.recompute) : "");
        size_t el = strlen(extra);
        if (a->train && a->mdl.zero) snprintf(extra + el, sizeof extra - el, " --zero %d", a->mdl.zero);
        el = strlen(extra);
        if (a->micro_batch) snprintf(extra + el, sizeof extra - el, " --micro-batch %lld", (long long)a->micro_batch);
        char mode[80]; /* decode's --seq is the new token: the context is the flag */
        snprintf(mode, sizeof mode, " --seq %lld%s", (long long)a->S, a->train ? " --mode train" : "");
        if (a->decode) snprintf(mode, sizeof mode, " --mode decode --context %lld", (long long)a->context);
        char budget_arg[32];
        snprintf(budget_arg, sizeof budget_arg, "%lluB", (unsigned long long)x->cf->s.budget);
        fprintf(o, "its own plan's figures: hyperpar cost %s %s --batch %lld%s%s%s%s%s%s\n", x->model_arg, fl,
                (long long)a->B, mode, a->decode && x->cf->s.budget ? " --mem-per-rank " : "",
                a->decode && x->cf->s.budget ? budget_arg : "", x->pf->overrides ? " --overrides " : "",
                x->pf->overrides ? x->pf->overrides : "", extra);
    } else {
        fprintf(o, "no mesh of %lld ranks fits; the reasons follow\n", (long long)a->world);
    }
    int shown = 0, most = top <= 0 ? n : 12; /* --all (top 0): every rejection */
    if (n - ok) {
        if (n - ok <= most) fprintf(o, "\nrejected (all %d):\n", n - ok);
        else fprintf(o, "\nrejected (first %d of %d; --all lists every one):\n", most, n - ok);
    }
    for (int i = ok; i < n && shown < most; i++, shown++) fprintf(o, "  %-40s %s\n", v[i].mesh, v[i].reason);
    if (!ok && x->fit) cli_fit_text(o, x->fit, "advise", x->argc, x->argv);
    fprintf(o, "\n* estimate, from the model stated in docs/cost.md; weights are exact. Each candidate is the\n"
               "  template plan's cost at its sizes; 'hyperpar cost' with its flags gives its own plan's figures.\n");
}

/* The page: html.c draws the library's advice, with the commands made here. */
static int print_html(FILE *o, const ctx *x)
{
    const hp_advice *a = x->a;
    char title[400];
    bool gpu = hp_cost_model_gpu(&a->mdl);
    snprintf(title, sizeof title, "%s on %lld ranks%s%s%s", x->m->path, (long long)a->world,
             gpu ? ": estimates for a bf16 GPU engine (" : "", gpu ? a->mdl.hw->name : "",
             gpu ? ", Megatron-style accounting), not hyperpar's runtime" : "");
    char *cmds = calloc(a->n_cands ? (size_t)a->n_cands : 1, HP_ADVISE_COMMAND_MAX);
    const char **pc = calloc(a->n_cands ? (size_t)a->n_cands : 1, sizeof *pc);
    int rc = -1;
    if (cmds && pc) {
        for (int i = 0; i < a->n_cands; i++) {
            pc[i] = cmds + (size_t)i * HP_ADVISE_COMMAND_MAX;
            if (!a->cands[i].ok) continue;
            char *ci = cmds + (size_t)i * HP_ADVISE_COMMAND_MAX;
            command_of(x, &a->cands[i], ci, HP_ADVISE_COMMAND_MAX);
            size_t l = strlen(ci);
            if (x->m->meta) snprintf(ci + l, HP_ADVISE_COMMAND_MAX - l, "  # %s", HP_ADVISE_CKPT_NOTE);
        }
        rc = cli_html_advise(o, title, a, pc);
    }
    free(cmds);
    free(pc);
    return rc;
}

/* ---- the command ---- */

static int cli_advise_run(const char *model_arg, cli_plan_flags *pf, cli_cost_flags *cf, int64_t N, int top, int argc,
                          char **argv, bool prefer_headroom, int64_t max_pp)
{
    hp_err err;
    hp_model *m = NULL;
    hp_overrides *ov = NULL;
    hp_advice *a = NULL;
    hp_fit fit = {0};
    hp_advise_opts ao;
    hp_advise_opts_default(&ao);
    hp_status st = cli_plan_flags_apply(pf, NULL, &ov, &err);
    if (st == HP_OK) st = hp_model_open(&m, model_arg, NULL, &err);
    if (st == HP_OK) cli_plan_flags_freeze(pf, m); /* frozen tensors train without state */
    if (st == HP_OK) st = cli_cost_measure(cf, m, &err);
    if (st == HP_OK) {
        ao.world = N;
        ao.mem_per_rank = cf->s.budget;
        ao.cost = cf->s.co;
        if (!cf->s.batch_given) ao.cost.B = 0; /* the default: a row per rank (hp_advise) */
        ao.plan = pf->po;
        ao.prefer_headroom = prefer_headroom;
        ao.max_pp = max_pp;
        ao.fixed_micro_batch = cf->s.micro_given, ao.fixed_recompute = cf->s.recompute_given;
        st = hp_advise(&a, m, &ao, &err);
    }
    if (st == HP_OK && !a->n_ok && cf->format != 2) st = hp_advise_fit(&fit, m, &ao, a, &err);
    int rc = HP_EXIT_OK;
    if (st != HP_OK) rc = cli_fail(&err);
    else {
        char *buf = NULL;
        size_t len = 0;
        FILE *o = open_memstream(&buf, &len);
        ctx x = {.m = m, .a = a, .cf = cf, .pf = pf, .model_arg = model_arg, .fit = &fit, .argc = argc, .argv = argv};
        if (!o) rc = HP_EXIT_RUNTIME;
        else {
            if (cf->format == 1) hp_advice_json(o, m, a, &fit, model_arg, pf->ep_compute, pf->overrides, argc, argv);
            else if (cf->format == 2) rc = print_html(o, &x) == 0 ? HP_EXIT_OK : HP_EXIT_RUNTIME;
            else print_text(o, &x, top);
            fclose(o);
            if (rc == HP_EXIT_OK) rc = cli_write_atomic(cf->output, buf, len, "the advice");
            free(buf);
        }
        /* the report lists every reason; when nothing fits, the request as given cannot be met */
        if (rc == HP_EXIT_OK && hp_advice_verdict(a, &err) != HP_OK) rc = cli_fail(&err);
    }
    hp_advice_free(a);
    hp_model_close(m);
    hp_overrides_free(ov);
    return rc;
}

/* --ranks-per-node R must tile the world in whole nodes (R divides N), or hold it all (R >= N). */
bool cli_advise_rpn_divides(const char *cmd, int64_t rpn, int64_t N)
{
    hp_cost_settings s;
    hp_cost_settings_init(&s);
    s.co.mdl.ranks_per_node = rpn, s.budget = 1;
    hp_err err;
    if (hp_advise_settings_check(&s, N, false, &err) == HP_OK) return true;
    cli_usage_error(cmd, "%s", err.msg);
    return false;
}

int cmd_advise(int argc, char **argv)
{
    advise_args a = {.top = 5};
    cli_plan_flags_init(&a.pf);
    cli_cost_flags_init(&a.cf);
    cli_parser cp = {.command = &cli_cmd_advise};
    int prc = cli_parse(&cp, &a, argc, argv);
    if (prc != HP_EXIT_OK) return prc == CLI_HELP ? HP_EXIT_OK : prc;
    cli_plan_flags pf = a.pf;
    cli_cost_flags cf = a.cf;
    int64_t N = a.world, top = a.top;
    bool prefer_headroom = a.prefer_headroom;
    if (optind != argc - 1) return cli_usage_error("advise", "expected exactly one MODEL");
    if (N < 1) return cli_usage_error("advise", "missing --world N (the number of ranks)");
    if (!cli_cost_flags_done("advise", &cf)) return HP_EXIT_USAGE;
    hp_err err;
    if (hp_advise_settings_check(&cf.s, N, prefer_headroom, &err) != HP_OK) return cli_usage_error("advise", "%s", err.msg);
    const char *const inputs[] = {pf.overrides};
    if (cf.output && cli_check_output_file("advise", "--output", cf.output, argv[optind], inputs, 1) != 0)
        return HP_EXIT_USAGE;
    int rc = cli_advise_run(argv[optind], &pf, &cf, N, (int)top, argc, argv, prefer_headroom, a.max_pp);
    cli_cost_flags_free(&cf);
    return rc;
}
