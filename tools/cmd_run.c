/*
 * cmd_run.c — `hyperpar run MODEL --input IDS [--output OUT] [--compare REF] [mesh flags]`: the whole forward
 * pass across the ranks of mpirun (or one process), executed as the plan says (src/run, docs/run.md).
 */
#include <math.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "costflags.h"
#include "hyperpar/comm.h"
#include "hyperpar/data.h"
#include "hyperpar/moe.h"
#include "hyperpar/overrides.h"
#include "hyperpar/run.h"
#include "hyperpar/safetensors.h"
#include "hyperpar/shard.h"
#include "inputflags.h"
#include "testhooks.h"

enum { O_PLAN = 300, O_COMPUTE, O_RTOL, O_OVERLAP, O_ROUTER, O_STATS, O_BACKWARD, O_SEQ, O_BATCH };
#define G_INPUT "the input: one of --input, --ids, --random-input (docs/run.md, \"Inputs\")"
#define G_PLAN "the plan (as 'hyperpar plan' derives it; default: a shard folder's own, else --tp = the processes)"

typedef struct run_args {
    const char *model, *output, *compare, *plan;
    cli_plan_flags pf;  /* the shared plan and mesh flags */
    cli_input_flags in; /* the token input */
    int64_t seq, batch; /* --seq, --batch: a token stream's rows (0: not given) */
    bool default_mesh; /* no mesh flags: every process a tp rank */
    double rtol;
    int threads;
    hp_linalg_mode compute;
    bool validate;
    bool overlap;
    bool balanced;          /* --router balanced */
    bool backward;          /* validate --backward */
    const char *stats_json; /* --stats-json FILE */
} run_args;

static bool rtol_fn(const cli_ctx *x);
static const cli_enum g_router = {NULL, {{"balanced", 1, false}, {"real", 0, false}}}; /* into run_args.balanced */

/* run's and validate's options: one table (validate refuses the "run only" group after parsing). */
static const cli_opt g_opts[] = {
    CLI_OPT_HELP,
    {"threads", 't', "N", "threads per rank for the GEMMs (default: OMP_NUM_THREADS when set, else this\n"
                          "process's cores divided by the ranks on its node)", 0, NULL,
     CLI_INT(run_args, threads, 1, 1024)},
    {"overlap", O_OVERLAP, NULL, "MoE blocks run the shared expert while their tokens are exchanged (also\n"
                                 "when the declared compute sets overlap_shared_expert); the same numbers", 0, NULL,
     CLI_FLAG(run_args, overlap)},
    {"compare-rtol", O_RTOL, "R", "run --compare: tolerances R * max|ref| for the logits and R * |ref| for the\n"
                                  "loss instead of 1e-4 and 1e-5; validate: a boundary diverges when\n"
                                  "max|diff| > R * max|one-process output| (1e-5)", 0, NULL,
     CLI_FN(run_args, rtol, rtol_fn)},
    {"rtol", O_RTOL, "R", NULL, 0, NULL, CLI_ALIAS},
    CLI_OPTS_INPUT(G_INPUT, run_args, in),
    {"seq", O_SEQ, "S", "--input is a token stream cut into rows of S tokens", 0, G_INPUT,
     CLI_INT(run_args, seq, 1, INT32_MAX)},
    {"batch", O_BATCH, "B", "rows of S tokens read from the stream (default 1)", 0, G_INPUT,
     CLI_INT(run_args, batch, 1, INT32_MAX)},
    CLI_OPTS_MESH(G_PLAN, run_args, pf),
    CLI_OPTS_EP(G_PLAN, run_args, pf),
    CLI_OPTS_PLAN(G_PLAN, run_args, pf),
    {"plan", O_PLAN, "plan.json", "a plan written by 'hyperpar plan' instead of deriving one", 0, G_PLAN,
     CLI_STR(run_args, plan)},
    {"output", 'o', "OUT", "rank 0 writes logits F32 [B, S, V], loss F32 [] and, for every sparse layer\n"
                           "l, its routed experts moe.<l>.topk_idx I32 [B*S, K] (atomically)", CLI_SHORT, "run only",
     CLI_STR(run_args, output)},
    {"compare", 'C', "REF", "check logits (|d| <= 1e-4 * max|ref|) and loss (|d| <= 1e-5 * |ref|)\n"
                            "against REF's 'logits' and 'loss', and the routed experts of every\n"
                            "moe.<l>.topk_idx REF has (exactly); exit 3 on a mismatch", 0, "run only",
     CLI_STR(run_args, compare)},
    {"compute", O_COMPUTE, "M", "exact (default: f32 activations, bf16 weights widened exactly) or bf16\n"
                                "(activations rounded to bf16 for the GEMMs)", 0, "run only",
     CLI_ENUM(run_args, compute, cli_enum_compute)},
    {"router", O_ROUTER, "R", "real (default) or balanced: MoE blocks route slot s of a rank's tokens to\n"
                              "expert (s mod Q)*L + (s div Q) mod L (spec 10.4; the outputs are not the\n"
                              "model's): for benchmarks and to check 'hyperpar cost' exchange bytes", 0, "run only",
     CLI_ENUM(run_args, balanced, g_router)},
    {"backward", O_BACKWARD, NULL, "compare every parameter's gradient of one training step (no update) with\n"
                                   "one process's instead of the forward's boundaries: the first parameter\n"
                                   "whose gradient diverges is named (a wrong dual or a missed sum)", 0,
     "validate only", CLI_FLAG(run_args, backward)},
    {"stats-json", O_STATS, "FILE", "rank 0 writes the loss (17 digits) and every rank's statistics (bytes and\n"
                                    "calls per collective kind, resident weights, workspace, anonymous memory\n"
                                    "grown) as JSON, atomically", 0, "run only", CLI_STR(run_args, stats_json)},
    {0},
};

/* --compare-rtol of run, --rtol of validate: either spelling, named as the command's own in a refusal. */
static bool rtol_fn(const cli_ctx *x)
{
    return cli_parse_rtol(x->cmd, strcmp(x->cmd, "validate") ? "--compare-rtol" : "--rtol", x->arg, cli_target(x));
}

/* The families run takes, MoE ones marked *, and the rule of their expert compute. */
static void families(FILE *out)
{
    int col = 0;
    for (size_t i = 0; i < hp_family_count(); i++) {
        const hp_family *f = hp_family_at(i);
        if (!hp_family_runs(f)) continue;
        const char *name = hp_family_name(f);
        int w = (int)strlen(name) + (hp_family_is_moe(f) ? 1 : 0) + 2;
        if (col && col + w > 104) fprintf(out, "\n"), col = 0;
        col += fprintf(out, "%s%s%s", col ? " " : "", name, hp_family_is_moe(f) ? "*" : "") ;
    }
    fprintf(out,
            "\n"
            "Under expert parallelism (--ep) a MoE model's expert compute is declared, never chosen silently\n"
            "(--overrides with local_compute_fn; docs/moe.md); the refusal prints the YAML to declare.\n");
}

static const cli_arg g_args[] = {
    {"MODEL", "a checkpoint folder (each rank slices it through its mapping), or a folder\n"
              "written by 'hyperpar shard' (each rank reads its file): it brings its mesh\n"
              "and plan, and a plan flag that contradicts them is refused"},
    {NULL, NULL},
};

const cli_command cli_cmd_run = {
    .cmd = "run",
    .summary = "run the whole forward pass across MPI ranks as the plan says",
    .forms = {{"[mpirun -np N]", "MODEL --input"}, {"[mpirun -np N]", "MODEL --ids"},
              {"[mpirun -np N]", "MODEL --random-input"}},
    .about = "Runs MODEL's whole forward pass (embedding, every decoder layer, final norm, lm_head, loss) across\n"
             "the ranks exactly as its plan says: each rank loads only its slices of the weights, and every\n"
             "collective is the one a boundary's contract asks for (docs/run.md). Families (MoE ones marked *):\n",
    .about_more = families,
    .args = g_args,
    .opts = g_opts,
    .epilog = "stderr: tokens/s, compute vs communication time, bytes per collective kind, resident weight bytes.\n"
              "Exit codes: 0 ok, 1 runtime failure, 2 bad input, 3 --compare mismatch.\n",
    .run = cmd_run,
};

const cli_command cli_cmd_validate = {
    .cmd = "validate",
    .summary = "run the plan distributed and in one process, compare every boundary",
    .forms = {{"[mpirun -np N]", "MODEL --input"}, {"[mpirun -np N]", "MODEL --ids"},
              {"[mpirun -np N]", "MODEL --random-input"}},
    .about = "Checks a plan against one process: runs MODEL's plan across the ranks and, on rank 0, the one-process\n"
             "model on the same input; every boundary's output (and each layer's residual stream) is reassembled to\n"
             "the full layout and compared. Prints a table (boundary, its exit collective, max error) and names the\n"
             "first boundary that diverges, so a wrong override or placement is found in one run. With --backward\n"
             "it compares every parameter's gradient of one training step instead. The options are 'hyperpar\n"
             "run's; those under \"run only\" are refused.\n",
    .opts = g_opts,
    .epilog = "Exit codes: 0 every boundary agrees, 1 runtime failure, 2 bad input, 3 a boundary diverges.\n",
    .run = cmd_validate,
};


static hp_status write_output(const char *path, const hp_run_output *o, hp_err *err)
{
    hp_st_writer *w = hp_st_writer_create();
    if (!w) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    int64_t shape[3] = {o->B, o->S, o->V};
    float loss = (float)o->loss;
    hp_status st = hp_st_writer_add(w, "logits", HP_DT_F32, 3, shape, o->logits, err);
    if (st == HP_OK) st = hp_st_writer_add(w, "loss", HP_DT_F32, 0, shape, &loss, err);
    char key[CLI_TOPK_KEY_MAX];
    for (int i = 0; st == HP_OK && i < o->n_moe; i++) {
        int64_t ks[2] = {o->B * o->S, o->K};
        cli_topk_key(o->moe_layer[i], key, sizeof key);
        st = hp_st_writer_add(w, key, HP_DT_I32, 2, ks, o->topk_idx[i], err);
    }
    if (st == HP_OK) st = hp_st_writer_write(w, path, err);
    hp_st_writer_destroy(w);
    return st;
}

/* Whether the --compare file f holds what a run of [B, S] over vocab V compares with: logits F32 [B, S, V] and a
 * scalar loss F32. Checked before the forward too, so that a wrong reference costs no run. */
static hp_status reference_fits(const char *path, const hp_st_file *f, int64_t B, int64_t S, int64_t V, hp_err *err)
{
    const hp_st_tensor *tl = hp_st_find(f, "logits"), *ts = hp_st_find(f, "loss");
    if (!tl || tl->dtype != HP_DT_F32 || tl->n_dims != 3 || tl->shape[0] != B || tl->shape[1] != S || tl->shape[2] != V)
        return hp_err_set(err, HP_ERR_INPUT, "%s: needs 'logits' F32 [%lld, %lld, %lld] to compare with", path,
                          (long long)B, (long long)S, (long long)V);
    if (!ts || ts->dtype != HP_DT_F32 || ts->n_elems != 1)
        return hp_err_set(err, HP_ERR_INPUT, "%s: needs a scalar 'loss' F32 to compare with", path);
    return HP_OK;
}

static hp_status reference_check(const char *path, int64_t B, int64_t S, int64_t V, hp_err *err)
{
    hp_st_file *f = NULL;
    hp_status st = hp_st_open(&f, path, err);
    if (st == HP_OK) st = reference_fits(path, f, B, S, V, err);
    hp_st_close(f);
    return st;
}

static hp_status compare(const run_args *a, const hp_run_output *o, hp_err *err)
{
    hp_st_file *f = NULL;
    hp_status st = hp_st_open(&f, a->compare, err);
    if (st != HP_OK) return st;
    const hp_st_tensor *tl = hp_st_find(f, "logits"), *ts = hp_st_find(f, "loss");
    st = reference_fits(a->compare, f, o->B, o->S, o->V, err);
    if (st == HP_OK) {
        int64_t n = o->B * o->S * o->V;
        float *ref = malloc((size_t)n * sizeof *ref), rl;
        if (!ref) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        if (st == HP_OK) {
            st = hp_st_read(f, tl, 0, ref, (size_t)n * sizeof *ref, err);
            if (st == HP_OK) st = hp_st_read(f, ts, 0, &rl, sizeof rl, err);
        }
        if (st == HP_OK) {
            int64_t shape[3] = {o->B, o->S, o->V};
            hp_tol t;
            bool ok = hp_tol_check(o->logits, ref, 3, shape, a->rtol > 0 ? a->rtol : 1e-4, &t);
            double dl = o->loss - (double)rl, ltol = (a->rtol > 0 ? a->rtol : 1e-5) * (rl < 0 ? -rl : rl);
            /* no scored position (S = 1): both losses are the mean of nothing, NaN, and agree; otherwise a NaN
             * on either side is a mismatch (NaN compares false) */
            bool none = o->B * (o->S - 1) == 0;
            bool lok = none ? isnan(o->loss) && isnan(rl) : (dl < 0 ? -dl : dl) <= ltol;
            char buf[300];
            fprintf(stderr, "compare %s: logits %s\n", a->compare, hp_tol_str(&t, buf, sizeof buf));
            fprintf(stderr, "compare %s: loss %.7g vs %.7g, diff %.3g (tolerance %.3g): %s\n", a->compare, o->loss,
                    (double)rl, dl, ltol, lok ? "OK" : "MISMATCH");
            /* the routed experts of every sparse layer the reference has: exactly equal */
            int64_t bad_layers = 0;
            for (int i = 0; i < o->n_moe; i++) {
                char key[CLI_TOPK_KEY_MAX];
                cli_topk_key(o->moe_layer[i], key, sizeof key);
                const hp_st_tensor *tk = hp_st_find(f, key);
                if (!tk) continue;
                int64_t nk = o->B * o->S * o->K, diff = 0;
                int32_t *ref_idx = NULL;
                if (tk->dtype != HP_DT_I32 || tk->n_elems != nk) diff = nk;
                else if (!(ref_idx = malloc((size_t)nk * sizeof *ref_idx + 1)))
                    st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
                else if ((st = hp_st_read(f, tk, 0, ref_idx, (size_t)nk * sizeof *ref_idx, err)) == HP_OK)
                    for (int64_t j = 0; j < nk; j++) diff += ref_idx[j] != o->topk_idx[i][j];
                free(ref_idx);
                if (st != HP_OK) break;
                fprintf(stderr, "compare %s: %s %lld of %lld entries differ: %s\n", a->compare, key, (long long)diff,
                        (long long)nk, diff ? "MISMATCH" : "OK");
                bad_layers += diff > 0;
            }
            if (st == HP_OK && (!ok || !lok || bad_layers)) {
                char what[80] = "";
                if (!ok) strcat(what, "logits");
                if (!lok) strcat(what, *what ? ", loss" : "loss");
                if (bad_layers) strcat(what, *what ? ", routed experts" : "routed experts");
                st = hp_err_set(err, HP_ERR_VERIFY, "the forward pass differs from %s in its %s", a->compare, what);
            }
        }
        free(ref);
    }
    hp_st_close(f);
    return st;
}

static void print_stats(const hp_comm *w, const hp_runner *r, const hp_plan *p)
{
    const hp_run_stats *s = hp_runner_stats(r);
    double v[4] = {s->seconds, s->comm_s, (double)s->resident_bytes, (double)s->share_bytes};
    hp_err e;
    (void)hp_comm_allreduce_max_f64(w, v, 4, &e);
    if (hp_comm_rank(w) != 0) return;
    char mesh[128], b1[32], b2[32];
    fprintf(stderr, "run: %s, %lld tokens in %.3f s (%.1f tokens/s); slowest rank: compute %.3f s, communication "
                    "%.3f s\n",
            hp_mesh_str(&p->mesh, mesh, sizeof mesh), (long long)s->tokens, v[0], v[0] > 0 ? (double)s->tokens / v[0] : 0.0,
            v[0] - v[1], v[1]);
    fprintf(stderr, "run: rank 0 sent");
    for (int k = 0; k < HP_RUN_COLL_COUNT; k++) {
        hp_format_bytes(s->bytes[k], b1, sizeof b1);
        fprintf(stderr, "%s %s %s in %llu calls", k ? "," : "", hp_run_coll_name((hp_run_coll)k), b1,
                (unsigned long long)s->calls[k]);
    }
    hp_format_bytes((uint64_t)v[2], b1, sizeof b1);
    hp_format_bytes((uint64_t)v[3], b2, sizeof b2);
    fprintf(stderr, "\nrun: resident weights %s on the largest rank (its plan share as stored: %s)\n", b1, b2);
}

/* Every failure here went through an agreement: the same message on every rank, printed once. */
static int finish(hp_comm *w, hp_status st, hp_err *err)
{
    int code = cli_collective_exit(w, st, err, true);
    hp_comm_free(w);
    return code;
}

/* validate's table on stdout (rank 0). */
static hp_status report(const hp_validate_report *rep, double rtol, bool scored, bool backward, hp_err *err)
{
    printf("%-44s %-34s %12s %12s  %s\n", backward ? "boundary (gradient) or parameter" : "boundary",
           backward ? "step (distributed)" : "collective (distributed)", "max |diff|", "rel", "");
    for (int i = 0; i < rep->n; i++) {
        const hp_validate_row *w = &rep->rows[i];
        double rel = w->max_ref > 0 ? w->max_diff / w->max_ref : w->max_diff;
        printf("%-44s %-34s %12.3g %12.3g  %s%s\n", w->what, w->coll, w->max_diff, rel, w->ok ? "ok" : "DIVERGES",
               i == rep->first_bad ? "  <- first divergence" : "");
    }
    double dl = rep->loss - rep->loss_ref;
    /* NaN is never ok: a NaN loss fails the comparison (NaN <= x is false); no scored position has no loss */
    bool lok = !scored || fabs(dl) <= rtol * fabs(rep->loss_ref);
    if (scored)
        printf("loss: distributed %.7g, one process %.7g, diff %.3g: %s\n", rep->loss, rep->loss_ref, dl,
               lok ? "ok" : "DIVERGES");
    else printf("loss: none (no scored position: every row has one token)\n");
    fflush(stdout);
    if (rep->first_bad >= 0 && backward)
        return hp_err_set(err, HP_ERR_VERIFY,
                          "the distributed gradients diverge from one process first at %s: max |diff| %.3g > %.0e x "
                          "max|ref| %.4g; the backward of the step that uses it (its boundary's duals, or the sum of "
                          "its gradient over the ranks that saw other rows) is wrong",
                          rep->rows[rep->first_bad].what, rep->rows[rep->first_bad].max_diff, rtol,
                          rep->rows[rep->first_bad].max_ref);
    if (rep->first_bad >= 0)
        return hp_err_set(err, HP_ERR_VERIFY,
                          "the distributed run diverges from one process first at %s (after %s): max |diff| %.3g "
                          "> %.0e x max|ref| %.4g; check that boundary's placements and overrides "
                          "(hyperpar plan --format explain --fqn %s)",
                          rep->rows[rep->first_bad].what, rep->rows[rep->first_bad].coll,
                          rep->rows[rep->first_bad].max_diff, rtol, rep->rows[rep->first_bad].max_ref,
                          rep->rows[rep->first_bad].what);
    if (!lok) return hp_err_set(err, HP_ERR_VERIFY, "the distributed loss differs from one process");
    return HP_OK;
}

static int run(run_args *a, int *argc, char ***argv)
{
    hp_err err;
    hp_err_clear(&err);
    hp_comm *w = NULL;
    if (hp_comm_world(&w, argc, argv, &err) != HP_OK) return cli_fail(&err);
    int N = hp_comm_size(w);
    hp_model *m = NULL;
    hp_plan *p = NULL;
    hp_overrides *ov = NULL;
    hp_runner *r = NULL;
    int64_t *ids = NULL, B = 0, S = 0;
    hp_run_output o = {0};
    hp_status st = HP_OK;
    char omsg[8400];
    const char *const inputs[] = {a->in.input, a->compare, a->pf.overrides, a->plan, a->output};
    if (a->output && cli_output_problem("--output", a->output, a->model, inputs, 4, omsg, sizeof omsg))
        st = hp_err_set(&err, HP_ERR_INPUT, "%s", omsg);
    if (st == HP_OK && cli_same_output(a->stats_json, a->output))
        st = hp_err_set(&err, HP_ERR_INPUT, "--stats-json and --output name the same file '%s'", a->output);
    if (st == HP_OK && a->stats_json &&
        cli_output_problem("--stats-json", a->stats_json, a->model, inputs, 5, omsg, sizeof omsg))
        st = hp_err_set(&err, HP_ERR_INPUT, "%s", omsg);
    int64_t anon0 = cli_anon_kib();
    bool shard = hp_shard_is_folder(a->model);
    if (st == HP_OK) st = shard ? hp_moe_shard_config_open(&m, a->model, &err) : hp_model_open(&m, a->model, NULL, &err);
    hp_plan *p1 = NULL; /* validate: the one-process plan */
    if (st == HP_OK && a->validate && shard)
        st = hp_err_set(&err, HP_ERR_INPUT, "%s is a shard folder; validate runs the one-process model too, which "
                        "needs the checkpoint (run validate on the checkpoint with the same mesh flags)", a->model);
    /* --plan, the shard folder's own plan (the flags checked against it), or the one the flags derive */
    if (st == HP_OK)
        st = cli_plan_resolve(&a->pf, a->plan, shard ? a->model : NULL, a->default_mesh, N, m, &p, &ov, &err);
    if (st == HP_OK && a->validate) {
        hp_plan_opts po;
        hp_plan_opts_default(&po);
        hp_mesh_from_sizes(&po.mesh, 1, 1, 1, 0, false);
        po.sequence_parallel = p->sequence_parallel;
        po.loss_parallel = p->loss_parallel;
        st = hp_plan_derive(&p1, m, &po, &err);
    }
    /* --random-input's ids alone may pass the memory (a file bounds them); sizes out of range or whose bytes
     * overflow are left to hp_ids_load, whose message names them. */
    uint64_t id_bytes;
    if (st == HP_OK && a->in.src.kind == HP_IDS_RANDOM && a->in.src.B > 0 && a->in.src.S > 0 &&
        !__builtin_mul_overflow((uint64_t)a->in.src.B, (uint64_t)a->in.src.S, &id_bytes) &&
        !__builtin_mul_overflow(id_bytes, (uint64_t)sizeof *ids, &id_bytes)) {
        char what[160];
        snprintf(what, sizeof what, "--random-input %lld,%lld (its ids alone)", (long long)a->in.src.B,
                 (long long)a->in.src.S);
        st = hp_memory_fits(what, (double)id_bytes, 1, "give fewer rows or tokens", &err);
    }
    if (st == HP_OK) st = hp_ids_load(&a->in.src, m->cfg.vocab_size, &ids, &B, &S, &err);
    if (st == HP_OK && a->compare && hp_comm_rank(w) == 0) /* rank 0 compares: a wrong reference costs no run */
        st = reference_check(a->compare, B, S, m->cfg.vocab_size, &err);
    st = hp_comm_agree(w, st, &err);
    if (st == HP_OK) {
        cli_threads_info ti;
        cli_threads(w, a->threads, &ti);
        hp_run_opts ro = {.command = a->validate ? "validate" : "run", .shards = shard ? a->model : NULL,
                          .compute = a->compute, .overlap = a->overlap, .balanced_router = a->balanced,
                          .test_perturb_boundary = cli_test_env_get().perturb_boundary, /* testhooks.c */
                          .test_perturb_grad = cli_test_env_get().perturb_grad,
                          .test_mlp_whole = cli_test_env_get().mlp_whole,
                          /* only --output and --compare read the logits: without them none are kept whole */
                          .no_logits = !a->output && !a->compare};
        if (a->validate) {
            hp_validate_report rep;
            double rtol = a->rtol > 0 ? a->rtol : 1e-5;
            st = a->backward ? hp_validate_backward(w, m, p, p1, &ro, ids, B, S, rtol, &rep, &err)
                             : hp_validate(w, m, p, p1, &ro, ids, B, S, rtol, &rep, &err);
            if (st == HP_OK && hp_comm_rank(w) == 0) st = report(&rep, rtol, B * (S - 1) > 0, a->backward, &err);
            hp_validate_report_free(&rep);
            st = hp_comm_agree(w, st, &err);
            free(ids);
            hp_plan_free(p1);
            hp_plan_free(p);
            hp_overrides_free(ov);
            hp_model_close(m);
            return finish(w, st, &err);
        }
        st = hp_runner_create(&r, w, m, p, &ro, &err);
        /* A batch this node cannot hold is refused before the forward allocates: after the runner's agreement
         * (every rank runs this command), the weights already held; rank 0 gathers the whole logits when they
         * are taken. */
        if (st == HP_OK) {
            char what[160];
            snprintf(what, sizeof what, "run of %s on a batch of %lld x %lld tokens", a->model, (long long)B,
                     (long long)S);
            double lg = a->output || a->compare ? (double)B * (double)S * (double)m->cfg.vocab_size * 4.0 : 0.0;
            st = hp_cost_forward_fits(w, m, p, B, S, false, true, lg, ti.local_ranks, what,
                                         "give a shorter input, fewer rows, or more ranks", &err);
        }
    }
    if (st == HP_OK) st = hp_runner_forward(r, ids, B, S, &o, &err);
    if (st == HP_OK) print_stats(w, r, p);
    if (st == HP_OK && a->stats_json) st = cli_write_run_stats(w, r, a->stats_json, cli_anon_kib() - anon0, &err);
    if (st == HP_OK && hp_comm_rank(w) == 0) {
        fprintf(stderr, "run: loss %.7g over %lld positions\n", o.loss, (long long)(B * (S - 1)));
        if (a->output) st = write_output(a->output, &o, &err);
        /* the run failed: the --stats-json just written goes too (a run leaves all its files or none) */
        if (st != HP_OK && a->stats_json) unlink(a->stats_json);
        if (st == HP_OK && a->compare) st = compare(a, &o, &err);
    }
    st = hp_comm_agree(w, st, &err);
    hp_run_output_free(&o);
    free(ids);
    hp_runner_free(r);
    hp_plan_free(p1);
    hp_plan_free(p);
    hp_overrides_free(ov);
    hp_model_close(m);
    return finish(w, st, &err);
}


static int parse(int argc, char **argv, bool validate)
{
    const char *cmd = validate ? "validate" : "run";
    run_args a = {.validate = validate};
    cli_plan_flags_init(&a.pf);
    cli_parser cp = {.command = validate ? &cli_cmd_validate : &cli_cmd_run};
    int prc = cli_parse(&cp, &a, argc, argv);
    if (prc != HP_EXIT_OK) return prc == CLI_HELP ? HP_EXIT_OK : prc;
    if (optind >= argc) return cli_usage_error(cmd, "missing MODEL");
    if (optind + 1 < argc) return cli_usage_error(cmd, "unexpected argument '%s'", argv[optind + 1]);
    a.model = argv[optind];
    int irc = cli_input_check(cmd, &a.in, a.seq, a.batch);
    if (irc != HP_EXIT_OK) return irc;
    if (validate && (a.output || a.compare || a.compute != HP_LINALG_EXACT || a.balanced || a.stats_json))
        return cli_usage_error(cmd, "--output, --compare, --compute, --router and --stats-json belong to 'hyperpar run'");
    if (!validate && a.backward) return cli_usage_error(cmd, "--backward belongs to 'hyperpar validate'");
    if (a.balanced && a.compare)
        return cli_usage_error(cmd, "--router balanced changes the outputs; it cannot be --compare'd with a reference");
    if (a.plan && cli_plan_flags_any(&a.pf))
        return cli_usage_error(cmd, "give either --plan or the plan flags (--mesh, --tp, ...), not both");
    a.default_mesh = cli_plan_flags_default_mesh(&a.pf);
    if (!a.default_mesh) {
        int rc = cli_plan_flags_mesh(cmd, &a.pf, 1);
        if (rc != HP_EXIT_OK) return rc;
    }
    return run(&a, &argc, &argv);
}

int cmd_run(int argc, char **argv)
{
    return parse(argc, argv, false);
}

int cmd_validate(int argc, char **argv)
{
    return parse(argc, argv, true);
}
