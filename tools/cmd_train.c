/*
 * cmd_train.c — `hyperpar train MODEL (--input IDS | (--data FILE | --text FILE [--tokenizer T] [--loss-mask]) --seq
 * S --global-batch GB) [--steps N] [--out DIR]
 * [--grad-out G] [AdamW] [schedule] [mesh flags]`: the command line of the library trainer (hyperpar/train.h,
 * src/train: the loop, the data, the schedule, evaluation, checkpoints, resume, the memory check; docs/train.md).
 * This file holds the options, their parsing into the trainer's config, the ranks' agreement on them, the hooks
 * the trainer calls (the plan from the plan flags, the output files' checks, signals) and what the user sees.
 *
 *   --grad-out G   rank 0: grad.<name> F32 at the checkpoint's name and shape for every trainable parameter,
 *                  the first step's gradient, and loss F32 [N], each step's loss (one atomic file).
 *   --out DIR      rank 0: DIR/config.json (the model's, "torch_dtype": "float32") and DIR/model.safetensors,
 *                  every parameter after N steps as F32 under its own name (what was not trained copied as
 *                  stored), written as one folder atomically (hyperpar/outdir.h, as shard --out).
 *
 * What the user sees (rank 0, stderr), from the trainer's events: a step line every --log-every steps (tokens/s
 * and MFU over the steps since the previous line; MFU against the same-run GEMM limit, hyperpar/cost.h); on a
 * terminal a progress line with the ETA, rewritten in place between them; --plot FILE.html at the end, the curves
 * of the steps this run took (tools/html.c). --log-json FILE, one JSON object per step, is the trainer's.
 */
#include <errno.h>
#include <stdarg.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "signals.h"
#include "testhooks.h"
#include "hyperpar/comm.h"
#include "hyperpar/data.h"
#include "hyperpar/overrides.h"
#include "hyperpar/run.h"
#include "hyperpar/train.h"
#include "hyperpar/trainckpt.h"

/* A line of train's own on stderr (rank 0 calls it): "train: <fmt>" with the user's paths in it escaped as every
 * message is (a newline or a control byte in a name shows as \xNN, never breaking or driving the terminal). */
static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cli_vsay("train: ", 0, fmt, ap);
    va_end(ap);
}

enum {
    O_PLAN = 300, O_STEPS, O_OUT, O_GRAD, O_LR, O_B1, O_B2, O_EPS, O_WD, O_FORCE, O_ZERO, O_CLIP, O_DATA, O_DDTYPE,
    O_SEQ, O_GB, O_MB, O_PPSCHED, O_SHUFFLE, O_SEED, O_WARMUP, O_SCHED, O_MINLR, O_EVAL, O_EVERY, O_LOGJSON, O_SKIPNF,
    O_SAVE, O_RESUME, O_STOP, O_STATS, O_LOGEVERY, O_PLOT, O_COMPUTE, O_TEXT, O_TOK, O_LMASK
};
#define G_PLAN "the plan (as 'hyperpar plan' derives it; default: a shard folder's own, else --tp = the processes)"
#define G_OPT "AdamW (torch.optim.AdamW's defaults)"
#define G_DATA "token data (docs/train.md, \"Data, batches and schedule\")"
#define G_SCHED "the learning-rate schedule, for step t = 1..N"
/* The table of train's options is below, after train_args (g_opts): its entries store into it. */

/* --help says how the GEMM limit MFU is measured against is taken (hyperpar/train.h: HP_TRAIN_GEMM_N, _REPS). */
#define TRAIN_GEMM_REPS HP_TRAIN_GEMM_REPS

typedef struct train_args {
    const char *model, *input, *out, *grad_out, *plan;
    const char *data, *eval_data, *log_json, *stats_json, *plot;
    const char *text, *tokenizer; /* --text, --tokenizer */
    bool loss_mask;               /* --loss-mask */
    hp_data_dtype dtype;
    int64_t seq, gb, mb, eval_every; /* mb: parse's placeholder (the trainer derives the micro-step from dp) */
    int64_t mb_rows;                 /* --micro-batch as given: rows per replica (0: one micro-batch a step) */
    hp_data_order order;
    hp_lr_schedule sched;
    bool data_opts, sched_given; /* a --data option / --schedule was given */
    bool dtype_given, seed_given; /* --data-dtype, --seed was given (the trainer's warnings) */
    cli_plan_flags pf;
    bool default_mesh, force;
    int64_t steps;
    int64_t save_every, stop_after;
    int64_t log_every; /* --log-every (default 1) */
    const char *resume;
    int threads;
    hp_linalg_mode compute;
    hp_pp_sched pp_sched;
    bool pp_sched_given;
    hp_train_opts to;
    char cmdline[2048];   /* "hyperpar train ..." as given (shell-quoted): what a checkpoint records */
} train_args;

/* ---- what the user sees: the step lines, the progress line, --plot ---- */

typedef struct train_view {
    bool root, tty;              /* rank 0; its stderr is a terminal (the progress line) */
    int64_t every, steps;        /* --log-every, --steps */
    double flop_step, limit;     /* model FLOPs per step; the GEMM limit, FLOP/s over all ranks */
    int64_t n;                   /* steps since the last step line */
    double tokens, secs;         /* their scored positions and seconds */
    double t0;                   /* when this process's first step began */
    int64_t k0, last;            /* the steps it takes: k0 + 1 .. last */
    int shown;                   /* characters of the progress line on the terminal (0: none) */
    /* --plot (rank 0): this run's steps */
    int64_t n_pts, n_eval;
    int64_t n_prev;              /* of them, steps before --resume, read from --log-json */
    int64_t *step, *eval_step;   /* [last - k0] */
    double *loss, *norm, *eval;  /* [last - k0] */
} train_view;

static hp_status view_init(train_view *v, const train_args *a, bool root, int64_t k0, int64_t last, hp_err *err)
{
    *v = (train_view){.root = root, .tty = root && isatty(STDERR_FILENO), .every = a->log_every, .steps = a->steps,
                      .k0 = k0, .last = last};
    if (!root || !a->plot) return HP_OK;
    size_t n = (size_t)(last - k0);
    v->step = hp_calloc(n, sizeof *v->step);
    v->eval_step = hp_calloc(n, sizeof *v->eval_step);
    v->loss = hp_calloc(n, sizeof *v->loss);
    v->norm = hp_calloc(n, sizeof *v->norm);
    v->eval = hp_calloc(n, sizeof *v->eval);
    if (!v->step || !v->eval_step || !v->loss || !v->norm || !v->eval)
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory for --plot's %zu steps", n);
    return HP_OK;
}

static void view_free(train_view *v)
{
    free(v->step);
    free(v->eval_step);
    free(v->loss);
    free(v->norm);
    free(v->eval);
}

/* Removes the progress line from the terminal, before anything else is printed. */
static void view_clear(train_view *v)
{
    if (!v->shown) return;
    fprintf(stderr, "\r%*s\r", v->shown, "");
    fflush(stderr);
    v->shown = 0;
}

/* "1:02:03" or "2:03". */
static const char *hms(double s, char *buf, size_t cap)
{
    long t = s > 0 && s < 1e9 ? (long)(s + 0.5) : 0;
    if (t >= 3600) snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, cap, "%ld:%02ld", t / 60, t % 60);
    return buf;
}

/* On a terminal, after step t: "train: step t/N, 0:12 elapsed, ETA 1:05", the ETA from this process's mean
 * seconds per step (evaluations and checkpoints included) over the steps left until the run's last. */
static void view_progress(train_view *v, int64_t t, double now)
{
    if (!v->tty || t >= v->last) return;
    char el[32], eta[32], line[160];
    double elapsed = now - v->t0, per = elapsed / (double)(t - v->k0);
    int len = snprintf(line, sizeof line, "train: step %lld/%lld, %s elapsed, ETA %s", (long long)t,
                       (long long)v->steps, hms(elapsed, el, sizeof el), hms(per * (double)(v->last - t), eta,
                                                                             sizeof eta));
    view_clear(v);
    fputs(line, stderr);
    fflush(stderr);
    v->shown = len;
}

/* Step t took dt seconds for `tokens` scored positions: rank 0 keeps it for --plot and prints its line when due
 * (every --log-every steps, the last step, a skipped step, one that evaluates). */
static void view_step(train_view *v, int64_t t, double loss, double norm, double lr, double tokens, double dt,
                      const char *event, bool force)
{
    v->n++;
    v->tokens += tokens;
    v->secs += dt;
    if (v->step) {
        v->step[v->n_pts] = t;
        v->loss[v->n_pts] = loss;
        v->norm[v->n_pts++] = norm;
    }
    if (!v->root || !(force || t % v->every == 0 || t == v->last)) return;
    double tps = v->secs > 0 ? v->tokens / v->secs : 0;
    double mean = v->limit > 0 && v->secs > 0 ? v->flop_step * (double)v->n / v->secs / v->limit : 0;
    fprintf(stderr, "train: step %lld/%lld loss %.7g grad-norm %.6g%s lr %.6g tokens/s %.1f mfu %.4g (%.3f s/step)\n",
            (long long)t, (long long)v->steps, loss, norm, event, lr, tps, mean, v->secs / (double)v->n);
    v->n = 0;
    v->tokens = v->secs = 0;
}

static void view_eval(train_view *v, int64_t t, double loss)
{
    if (!v->eval_step) return;
    v->eval_step[v->n_eval] = t;
    v->eval[v->n_eval++] = loss;
}

/* --plot: rank 0's page of the steps this run took, written atomically (a signal meanwhile removes the
 * temporary). */
static hp_status write_plot(const train_args *a, const hp_train_info *in, const train_view *v, int world, hp_err *err)
{
    char title[PATH_MAX + 200], summary[600], tmp[PATH_MAX + 40];
    snprintf(title, sizeof title, "%s on %s", in->model_path, in->mesh);
    int64_t n = v->n_pts;
    char before[120] = "";
    if (v->n_prev)
        snprintf(before, sizeof before, " (steps 1 to %lld before --resume, from --log-json)", (long long)v->n_prev);
    snprintf(summary, sizeof summary, "Steps %lld to %lld of %lld, taken on %d process%s%s%s; the last: loss %.7g, "
             "gradient norm %.6g.", (long long)(n ? v->step[0] : 0), (long long)(n ? v->step[n - 1] : 0),
             (long long)a->steps, world, world == 1 ? "" : "es", a->resume && !v->n_prev ? " after --resume" : "",
             before, n ? v->loss[n - 1] : 0.0, n ? v->norm[n - 1] : 0.0);
    cli_train_curves c = {.n = n, .step = v->step, .loss = v->loss, .grad_norm = v->norm, .n_eval = v->n_eval,
                          .eval_step = v->eval_step, .eval_loss = v->eval, .clip = a->to.clip, .summary = summary,
                          .note = "The steps this run took (after --resume, those after the checkpoint, and "
                                  "the earlier ones when the run's --log-json is continued); --log-json keeps every "
                                  "step's figures."};
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    int rc = cli_html_train(f, title, &c);
    fclose(f);
    hp_status st = rc == 0 && buf ? HP_OK : hp_err_set(err, HP_ERR_NOMEM, "--plot %s: out of memory for the page",
                                                       a->plot);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", a->plot, (long)getpid()); /* cli_write_atomic_err's temporary */
    const char *rm[1] = {tmp};
    if (st == HP_OK) {
        cli_signals_catch();
        cli_signals_remove_on_signal(rm, 1);
        st = cli_write_atomic_err(a->plot, buf, len, "the page", err);
        cli_signals_remove_on_signal(NULL, 0);
        cli_signals_release(0);
    }
    free(buf);
    return st;
}

/* ---- the command: the library trainer (hyperpar/train.h) with the CLI's hooks ---- */

/* What the hooks share: the options, the view, the --overrides the plan callback loaded. */
typedef struct train_cli {
    train_args *a;
    int world;
    train_view v;
    hp_overrides *ov;
} train_cli;

/* The trainer's events, printed as train always printed them (rank 0; warnings once). */
static void on_event(void *ctx, const hp_train_event *ev)
{
    train_cli *c = ctx;
    train_view *v = &c->v;
    const train_args *a = c->a;
    switch (ev->kind) {
    case HP_TRAIN_EV_NOTE:
        view_clear(v);
        say("%s", ev->text);
        break;
    case HP_TRAIN_EV_WARNING: cli_warn_cmd("train", "%s", ev->text); break;
    case HP_TRAIN_EV_LIMIT: {
        const hp_gemm_limit *lim = ev->limit;
        char kernels[512];
        int N = c->world;
        v->flop_step = ev->flop_step;
        v->limit = lim->sum_gflops * 1e9;
        fprintf(stderr, "train: model FLOPs %.4g G per step (6 x %.4g weights per token x %lld tokens); MFU limit "
                "%.1f GFLOP/s: a%s %lld^3 GEMM, best of %d on every rank at once, summed over %d rank%s (slowest "
                "rank %.1f; %.2f s)\n",
                v->flop_step * 1e-9, ev->weights, (long long)ev->tokens, lim->sum_gflops,
                a->compute == HP_LINALG_BF16 ? " bf16" : "n f32", (long long)lim->n, lim->reps, N, N == 1 ? "" : "s",
                lim->min_gflops, lim->seconds);
        fprintf(stderr, "train: GEMM kernels: %s\n", hp_linalg_describe(NULL, kernels, sizeof kernels));
        v->t0 = hp_comm_wtime();
        break;
    }
    case HP_TRAIN_EV_STEP:
        view_clear(v);
        view_step(v, ev->step, ev->loss, ev->grad_norm, ev->lr, ev->tokens, ev->seconds,
                  ev->skipped ? " (not finite: step skipped)" : ev->clipped ? " (clipped)" : "",
                  ev->skipped || ev->evaluates);
        break;
    case HP_TRAIN_EV_EVAL:
        view_eval(v, ev->step, ev->loss);
        say("step %lld/%lld eval loss %.7g (%s, %lld windows)", (long long)ev->step, (long long)a->steps, ev->loss,
            a->eval_data, (long long)ev->windows);
        break;
    case HP_TRAIN_EV_STEP_END: view_progress(v, ev->step, hp_comm_wtime()); break;
    }
}

/* The plan: --plan, the shard folder's own (the flags checked against it), or the one the flags derive. */
static hp_status resolve_plan(void *ctx, hp_model *m, const char *shard_dir, int world, hp_plan **p, hp_err *err)
{
    train_cli *c = ctx;
    train_args *a = c->a;
    return cli_plan_resolve(&a->pf, a->plan, shard_dir, a->default_mesh, world, m, p, &c->ov, err);
}

/* The output files' names before any work (the trainer checks --out and the rest): usable, none an input, no two
 * outputs in one file. */
static hp_status check_output_files(void *ctx, hp_err *err)
{
    const train_args *a = ((train_cli *)ctx)->a;
    const char *const inputs[] = {a->input, a->pf.overrides, a->plan, a->model, a->data, a->eval_data, a->text,
                                  a->tokenizer};
    const char *name[] = {"--plot", "--log-json", "--grad-out", "--stats-json"};
    const char *path[] = {a->plot, a->log_json, a->grad_out, a->stats_json};
    static const int order[] = {2, 1, 0, 3}; /* --grad-out, --log-json, --plot, --stats-json */
    char omsg[8400];
    for (int k = 0; k < 4; k++) {
        int i = order[k];
        if (path[i] && cli_output_problem(name[i], path[i], a->model, inputs, 8, omsg, sizeof omsg))
            return hp_err_set(err, HP_ERR_INPUT, "%s", omsg);
    }
    for (int i = 0; i < 4; i++)
        for (int j = i + 1; j < 4; j++)
            if (cli_same_output(path[i], path[j]))
                return hp_err_set(err, HP_ERR_INPUT, "%s and %s name the same file %s", name[i], name[j], path[i]);
    return HP_OK;
}

static void signals_catch(void *ctx)
{
    (void)ctx;
    cli_signals_catch();
}

static void signals_release(void *ctx)
{
    (void)ctx;
    cli_signals_release(0);
}

/* The trainer's config from the command line. */
static void config_of(train_cli *c, hp_train_config *cfg)
{
    const train_args *a = c->a;
    hp_train_config_default(cfg);
    cfg->model = a->model, cfg->input = a->input, cfg->data = a->data, cfg->eval_data = a->eval_data;
    cfg->text = a->text, cfg->tokenizer = a->tokenizer, cfg->loss_mask = a->loss_mask;
    cfg->dtype = a->dtype, cfg->order = a->order, cfg->seq = a->seq, cfg->global_batch = a->gb;
    cfg->micro_batch = a->mb_rows, cfg->eval_every = a->eval_every;
    cfg->steps = a->steps, cfg->stop_after = a->stop_after, cfg->sched = a->sched, cfg->opt = a->to;
    cfg->compute = a->compute;
    cfg->pp_sched = a->pp_sched, cfg->pp_sched_given = a->pp_sched_given;
    cfg->out = a->out, cfg->save_every = a->save_every, cfg->resume = a->resume, cfg->grad_out = a->grad_out;
    cfg->log_json = a->log_json, cfg->force = a->force, cfg->plot = a->plot, cfg->stats_json = a->stats_json;
    cfg->plan_file = a->plan, cfg->overrides = a->pf.overrides;
    cfg->sched_given = a->sched_given, cfg->dtype_given = a->dtype_given, cfg->seed_given = a->seed_given;
    cfg->command = a->cmdline;
    cfg->test_nan_grad = cli_test_env_get().nan_grad; /* the non-finite test's hook (testhooks.c) */
    cfg->plan = resolve_plan, cfg->check = check_output_files, cfg->on_event = on_event;
    cfg->signals_catch = signals_catch, cfg->signals_release = signals_release, cfg->ctx = c;
}

static int finish(hp_comm *w, hp_status st, hp_err *err)
{
    int code = cli_collective_exit(w, st, err, true);
    hp_comm_free(w);
    return code;
}

/* --resume's identity for the ranks' agreement: the checkpoint it means (hp_train_ckpt_find), by its state.json,
 * which records the step and the run's flags; 0 (not compared) when there is none. */
static uint64_t resume_identity(const char *arg)
{
    char ckpt[PATH_MAX + 64], path[PATH_MAX + 80];
    hp_err e;
    if (hp_train_ckpt_find("--resume", arg, ckpt, sizeof ckpt, &e) != HP_OK) return 0;
    snprintf(path, sizeof path, "%s/state.json", ckpt);
    return cli_file_identity(path);
}

/* --tokenizer's identity for the ranks' agreement: its tokenizer.json (the file, or the one in the folder) and the
 * tokenizer_config.json beside it (its EOS and chat template); 0 (not compared) when there is no tokenizer.json. */
static uint64_t tokenizer_identity(const char *arg)
{
    char json[PATH_MAX + 32], cfg[PATH_MAX + 32];
    size_t n = strlen(arg);
    bool file = n >= 5 && !strcmp(arg + n - 5, ".json");
    const char *slash = strrchr(arg, '/');
    snprintf(json, sizeof json, file ? "%s" : "%s/tokenizer.json", arg);
    if (file) snprintf(cfg, sizeof cfg, "%.*stokenizer_config.json", slash ? (int)(slash - arg) + 1 : 0, arg);
    else snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", arg);
    uint64_t a = cli_file_identity(json), b = cli_file_identity(cfg);
    return a ? a ^ (b * 0x9E3779B97F4A7C15ull) : 0;
}

/* The view of the run prepare describes: --plot's points of the steps the resumed run's log records first. */
static hp_status view_start(train_cli *c, hp_comm *w, const hp_train_info *in, hp_err *err)
{
    train_view *v = &c->v;
    bool root = hp_comm_rank(w) == 0;
    hp_status st = hp_comm_agree(w, view_init(v, c->a, root, in->k0 - in->n_logged, in->last, err), err);
    for (int64_t t = 1; st == HP_OK && t <= in->n_logged && v->step; t++) { /* --plot: the whole run */
        v->step[v->n_pts] = t, v->loss[v->n_pts] = in->logged_loss[t - 1];
        v->norm[v->n_pts++] = in->logged_norm[t - 1], v->n_prev++;
        if (!isnan(in->logged_eval[t - 1])) view_eval(v, t, in->logged_eval[t - 1]);
    }
    v->k0 = in->k0;
    return st;
}

/* The run's outputs after its last step: the trainer's (--out, --grad-out) and --stats-json. Rank 0 writes with
 * no collective in between: a signal there removes what it had half-written (the trainer's temporaries) and ends
 * the process at once. */
static hp_status write_outputs(hp_trainer *t, hp_comm *w, const train_args *a, hp_err *err)
{
    const char *rm_list[8];
    int n_rm = hp_train_temporaries(t, rm_list, 8);
    bool caught = hp_comm_rank(w) == 0 && n_rm > 0;
    if (caught) {
        cli_signals_catch();
        cli_signals_remove_on_signal(rm_list, n_rm);
    }
    hp_status st = hp_train_write(t, err);
    if (st == HP_OK && a->stats_json) st = cli_write_run_stats(w, hp_train_runner(t), a->stats_json, -1, err);
    if (caught) {
        cli_signals_remove_on_signal(NULL, 0);
        cli_signals_release(0); /* the signals' earlier actions back (one caught meanwhile ended the process) */
    }
    return st;
}

static int train(train_args *a, const cli_parser *cp, const char *usage_msg, int *argc, char ***argv)
{
    hp_err err;
    hp_err_clear(&err);
    hp_comm *w = NULL;
    if (hp_comm_world(&w, argc, argv, &err) != HP_OK) return cli_fail(&err);
    int N = hp_comm_size(w);
    bool root = hp_comm_rank(w) == 0;
    /* Before anything that differs by rank: every option but --threads as rank 0's, inputs by their identity. */
    static const int free_vals[] = {'t'};
    static const cli_agree_input agree_inputs[] = {{'i', cli_file_identity}, {O_DATA, cli_file_identity},
                                                   {O_EVAL, cli_file_identity}, {O_PLAN, cli_file_identity},
                                                   {CLI_O_OVERRIDES, cli_file_identity}, {O_RESUME, resume_identity},
                                                   {O_TEXT, cli_file_identity}, {O_TOK, tokenizer_identity}};
    hp_status st = cli_agree_flags(w, cp, free_vals, 1, agree_inputs,
                                   (int)(sizeof agree_inputs / sizeof *agree_inputs), &err);
    /* the same options: the same usage error on every rank, printed once */
    if (st == HP_OK) st = hp_comm_agree(w, usage_msg ? hp_err_set(&err, HP_ERR_INPUT, "%s", usage_msg) : HP_OK, &err);
    if (st != HP_OK) return finish(w, st, &err);
    train_cli c = {.a = a, .world = N};
    hp_train_config cfg;
    config_of(&c, &cfg);
    hp_trainer *t = NULL;
    st = hp_train_open(&t, w, &cfg, &err);
    cli_threads_info ti = {0};
    if (st == HP_OK) {
        char tb[128];
        cli_threads(w, a->threads, &ti); /* collective: every rank asks */
        if (root) fprintf(stderr, "train: threads: %s\n", cli_threads_str(&ti, tb, sizeof tb));
    }
    if (st == HP_OK) st = hp_train_prepare(t, ti.local_ranks, &err);
    if (st == HP_OK) st = view_start(&c, w, hp_train_info_of(t), &err);
    if (st == HP_OK) st = hp_train_run(t, &err);
    view_clear(&c.v);
    if (st == HP_OK) st = write_outputs(t, w, a, &err);
    if (st == HP_OK) st = hp_train_end(t, &err);
    if (st == HP_OK && a->plot) {
        const train_view *v = &c.v;
        if (root) st = write_plot(a, hp_train_info_of(t), v, N, &err);
        st = hp_comm_agree(w, st, &err);
        if (st == HP_OK && root)
            say("wrote %s (%lld step%s)", a->plot, (long long)v->n_pts, v->n_pts == 1 ? "" : "s");
    }
    view_free(&c.v);
    hp_train_close(t);
    hp_overrides_free(c.ov);
    return finish(w, st, &err);
}

static bool log_every_fn(const cli_ctx *x);
static bool data_dtype_fn(const cli_ctx *x);
static bool seed_fn(const cli_ctx *x);
static bool schedule_fn(const cli_ctx *x);
static bool pp_sched_fn(const cli_ctx *x);

static const cli_enum g_shuffle = {NULL, {{"none", HP_DATA_IN_ORDER, false}, {"seeded", HP_DATA_SEEDED, false}}};
#define STEPS(m) CLI_INT(train_args, m, 1, 1000000000)
#define POSITIVE(m) CLI_REAL(train_args, m, 0, HUGE_VAL, CLI_LO_OPEN | CLI_HI_OPEN, "a finite number > 0")
#define NONNEGATIVE(m) CLI_REAL(train_args, m, 0, HUGE_VAL, CLI_HI_OPEN, "a finite number >= 0")
#define BETA(m) CLI_REAL(train_args, m, 0, 1, CLI_HI_OPEN, "a number in [0, 1)")

static const cli_opt g_opts[] = {
    CLI_OPT_HELP,
    {"input", 'i', "IDS", "safetensors with input_ids I64 (or I32) [B, S]; the same file on every rank; every\n"
                          "step trains on this batch", CLI_SHORT, NULL, CLI_STR(train_args, input)},
    {"steps", O_STEPS, "N", "training steps (default 1); the schedule runs over them", 0, NULL, STEPS(steps)},
    {"save-every", O_SAVE, "K", "with --out DIR: every K steps (and at the last one) a checkpoint DIR/step-<t>: a\n"
                                "model folder (config.json, model.safetensors) and every rank's training state,\n"
                                "written whole or not at all (a kill or a full disk mid-save leaves the earlier\n"
                                "ones intact); 'hyperpar merge DIR' turns the last into a Hugging Face folder",
     0, NULL, STEPS(save_every)},
    {"resume", O_RESUME, "CKPT", "continue the run of checkpoint CKPT (a DIR/step-<t> folder, or DIR: its last\n"
                                 "complete one) with the same flags, model config and data (by its bytes): the\n"
                                 "same parameters, optimizer state and step, so the result equals the\n"
                                 "uninterrupted run's bit for bit; every file is checked against the sizes and\n"
                                 "hashes its state.json records", 0, NULL, CLI_STR(train_args, resume)},
    {"stop-after", O_STOP, "K", "end after step K (with --save-every: its checkpoint), as a time limit would;\n"
                                "the schedule still follows --steps", 0, NULL, STEPS(stop_after)},
    {"log-json", O_LOGJSON, "FILE", "rank 0 writes one JSON object per line and step: step, loss, grad_norm\n"
                                    "(before clipping), lr, tokens_per_s, step_s, mfu (and eval_loss where\n"
                                    "evaluated, run_id with checkpoints); a new file (--force replaces one),\n"
                                    "or after --resume the run's own log, continued", 0, NULL,
     CLI_STR(train_args, log_json)},
    {"log-every", O_LOGEVERY, "N", "rank 0 prints a step line every N steps (default 1), and always at the last\n"
                                   "step, a skipped one and one that evaluates; its tokens/s and mfu are over the\n"
                                   "steps since the previous line", 0, NULL,
     CLI_FN(train_args, log_every, log_every_fn)},
    {"plot", O_PLOT, "FILE.html", "rank 0 writes the loss (and eval loss) and gradient-norm curves of the steps\n"
                                  "this run took as one self-contained page (inline SVG, no network), atomically,\n"
                                  "when the run ends well", 0, NULL, CLI_STR(train_args, plot)},
    {"stats-json", O_STATS, "FILE", "rank 0 writes every rank's statistics after the last step, run's\n"
                                    "--stats-json with the training state's bytes (grad_bytes, optim_bytes,\n"
                                    "master_bytes, saved_bytes: what 'hyperpar cost --mode train' predicts)", 0, NULL,
     CLI_STR(train_args, stats_json)},
    {"data", O_DATA, "FILE", "train on a token file instead of --input: a flat little-endian token stream\n"
                             "(.bin, see --data-dtype) or a .safetensors with input_ids I64/I32 [N, S]",
     0, G_DATA, CLI_STR(train_args, data)},
    {"text", O_TEXT, "FILE", "train on text instead: FILE tokenized with the model's tokenizer.json into the\n"
                             "token stream --data would read, EOS after each document; one document, or a\n"
                             "FILE.jsonl of one {\"text\": ...} or {\"messages\": [...]} (ChatML) a line", 0, G_DATA,
     CLI_STR_NONEMPTY(train_args, text, "a file")},
    {"tokenizer", O_TOK, "PATH", "--text's tokenizer.json (or its folder; default: MODEL's)", 0, G_DATA,
     CLI_STR_NONEMPTY(train_args, tokenizer, "a tokenizer.json or its folder")},
    {"loss-mask", O_LMASK, NULL, "with --text FILE.jsonl of {\"messages\": [...]}: only the assistant messages'\n"
                                 "tokens (content and <|im_end|>) count in the loss, the mean over them", 0, G_DATA,
     CLI_FLAG(train_args, loss_mask)},
    {"data-dtype", O_DDTYPE, "T", "uint16 (default) or uint32: the stream's token type", 0, G_DATA,
     CLI_FN(train_args, dtype, data_dtype_fn)},
    {"seq", O_SEQ, "S", "window length: a stream's window is S + 1 tokens (S scored positions);\n"
                        "a safetensors input_ids must be [N, S]", 0, G_DATA,
     CLI_INT(train_args, seq, 1, (int64_t)1 << 30)},
    {"global-batch", O_GB, "GB", "windows per step (every rank reads the same; dp splits them)", 0, G_DATA,
     CLI_INT(train_args, gb, 1, (int64_t)1 << 30)},
    {"micro-batch", O_MB, "MB", "rows per dp replica in one forward/backward (Megatron's and cost's meaning); MB x dp\n"
                                "divides GB: GB/(MB x dp) accumulated (default: GB/dp, one micro-batch a step)", 0,
     G_DATA, CLI_INT(train_args, mb_rows, 1, (int64_t)1 << 30)},
    {"shuffle", O_SHUFFLE, "M", "seeded (default: each epoch's windows shuffled from --seed) or none", 0, G_DATA,
     CLI_ENUM(train_args, order.shuffle, g_shuffle)},
    {"seed", O_SEED, "N", "the shuffle's seed, an unsigned 64-bit integer (default 0)", 0, G_DATA,
     CLI_FN(train_args, order.seed, seed_fn)},
    {"eval-data", O_EVAL, "FILE", "a held-out token file (same --data-dtype and --seq; with --text a text file,\n"
                                  "read as --text is): every --eval-every K steps, its mean loss over all its\n"
                                  "windows (forward only)", 0, G_DATA,
     CLI_STR(train_args, eval_data)},
    {"eval-every", O_EVERY, "K", "steps between evaluations of --eval-data", 0, G_DATA, STEPS(eval_every)},
    {"schedule", O_SCHED, "KIND", "cosine (default with --data), linear or constant (default with --input)", 0,
     G_SCHED, CLI_FN(train_args, sched.kind, schedule_fn)},
    {"warmup", O_WARMUP, "W", "warmup steps: lr·t/W for t <= W (default 0)", 0, G_SCHED,
     CLI_INT(train_args, sched.warmup, 0, 1000000000)},
    {"min-lr", O_MINLR, "X", "where cosine and linear end at step N, in [0, --lr] (default 0)", 0, G_SCHED,
     NONNEGATIVE(sched.min_lr)},
    {"out", 'o', "DIR", "rank 0 writes a checkpoint folder: config.json and model.safetensors, every\n"
                        "parameter after the last step as F32 (atomically; refused when DIR is not empty)", CLI_SHORT,
     NULL, CLI_STR(train_args, out)},
    {"force", O_FORCE, NULL, "replace an earlier 'hyperpar train' output in DIR (its marker and nothing but\n"
                             "its files; never any other folder), and an existing --log-json file", 0, NULL,
     CLI_FLAG(train_args, force)},
    {"grad-out", O_GRAD, "G", "rank 0 writes grad.<name> F32 (the first step's gradient of every trainable\n"
                              "parameter) and loss F32 [N] (each step's loss), atomically", 0, NULL,
     CLI_STR(train_args, grad_out)},
    {"threads", 't', "N", "threads per rank for the GEMMs (default: OMP_NUM_THREADS when set, else this\n"
                          "process's cores divided by the ranks on its node)", 0, NULL,
     CLI_INT(train_args, threads, 1, 1024)},
    {"lr", O_LR, "X", "learning rate, > 0 (1e-3)", 0, G_OPT, POSITIVE(to.lr)},
    {"beta1", O_B1, "X", "first moment decay, in [0, 1) (0.9)", 0, G_OPT, BETA(to.beta1)},
    {"beta2", O_B2, "X", "second moment decay, in [0, 1) (0.999)", 0, G_OPT, BETA(to.beta2)},
    {"eps", O_EPS, "X", "added to the denominator, > 0 (1e-8)", 0, G_OPT, POSITIVE(to.eps)},
    {"weight-decay", O_WD, "X", "decoupled weight decay, >= 0 (0.01)", 0, G_OPT, NONNEGATIVE(to.weight_decay)},
    {"clip", O_CLIP, "NORM", "scale the gradients by NORM / (norm + 1e-6) when their global norm (every\n"
                             "element counted once over the ranks) exceeds NORM, as torch's clip_grad_norm_;\n"
                             "the norm is printed every step (default: off)", 0, G_OPT, POSITIVE(to.clip)},
    {"skip-nonfinite", O_SKIPNF, NULL, "skip a step whose gradients, or AdamW update, are not all finite (no\n"
                                       "update: parameters and moments as they were; counted) instead of ending\n"
                                       "the run with exit 3 naming the first such parameter", 0, G_OPT,
     CLI_FLAG(train_args, to.skip_nonfinite)},
    {"compute", O_COMPUTE, "M", "exact (default: f32 products) or bf16: both operands of every matrix product\n"
                                "rounded to bf16, f32 sums, as torch.autocast(bfloat16) multiplies; f32 master\n"
                                "weights, AdamW state, norms, softmax, router and loss", 0, G_OPT,
     CLI_ENUM(train_args, compute, cli_enum_compute)},
    {"zero", O_ZERO, "S", "0 (default) or 1: ZeRO-1, each rank keeps AdamW's moments of its block of what it\n"
                          "shares with the other dp ranks (routed experts: with their expert-data-parallel\n"
                          "group); the same numbers", 0, G_OPT, CLI_INT(train_args, to.zero, 0, 1)},
    {"pp-schedule", O_PPSCHED, "K", "a pipeline's schedule (pp > 1) over the step's micro-batches: 1f1b (default;\n"
                                    "min(pp - s, m) in flight on stage s), gpipe (every forward, then every\n"
                                    "backward) or interleaved (the default with --pp-virtual; m a multiple of pp);\n"
                                    "the same gradients as one process (docs/pipeline.md)", 0, G_PLAN,
     CLI_FN(train_args, pp_sched, pp_sched_fn)},
    CLI_OPTS_MESH(G_PLAN, train_args, pf),
    CLI_OPTS_EP(G_PLAN, train_args, pf),
    CLI_OPTS_PLAN(G_PLAN, train_args, pf),
    {"plan", O_PLAN, "plan.json", "a plan written by 'hyperpar plan' instead of deriving one", 0, G_PLAN,
     CLI_STR(train_args, plan)},
    {0},
};
#undef STEPS
#undef POSITIVE
#undef NONNEGATIVE
#undef BETA

static void epilog(FILE *out)
{
    fprintf(out,
              "stderr (rank 0): first the model FLOPs per step and the GEMM limit MFU is measured against (an f32\n"
              "512x512x512 product through the GEMM layer, best of %d, on every rank at once, summed over the ranks;\n"
              "a fraction of a second, and its kernels); then a line every --log-every steps: the step's loss, gradient\n"
              "norm and lr, and over the steps since the previous line tokens/s (scored positions per second) and\n"
              "mfu (model FLOPs per second over the limit; a measured limit, so it may pass 1); on a terminal a\n"
              "progress line with the elapsed time and the ETA, rewritten in place (never when stderr is not one,\n"
              "as under mpirun).\n"
              "Under mpirun every rank must be given the same options but --threads (inputs: the same files): a\n"
              "difference exits 2 before any work, naming the rank and the option. A batch this machine cannot hold,\n"
              "a token outside the vocabulary anywhere the run reads, and a last checkpoint that cannot be saved are\n"
              "refused before step 1, creating nothing.\n"
              "Exit codes: 0 ok, 1 runtime failure, 2 bad input or usage (a checkpoint that is not the run's among\n"
              "them), 3 a non-finite gradient or update.\n",
            TRAIN_GEMM_REPS);
}

static const cli_arg g_args[] = {
    {"MODEL", "a checkpoint folder, or a folder written by 'hyperpar shard' for the mesh"},
    {NULL, NULL},
};

const cli_command cli_cmd_train = {
    .cmd = "train",
    .summary = "train a checkpoint (dense or MoE) for N AdamW steps across MPI ranks",
    .forms = {{"[mpirun -np N]", "MODEL --input"}, {"[mpirun -np N]", "MODEL --data --seq --global-batch"},
              {"[mpirun -np N]", "MODEL --text [--loss-mask] --seq --global-batch"}},
    .about = "Trains MODEL for N steps, on the same batch (--input) or on the global batches of a token file\n"
             "(--data) or of a text tokenized on the fly (--text), across the ranks exactly as its plan says:\n"
             "each step runs the forward, the backward of every boundary in reverse (each collective by its\n"
             "dual), sums every parameter's gradient over the ranks that saw other rows of it, and takes an\n"
             "AdamW step on each rank's slices (docs/train.md). Every family 'hyperpar run' runs, dense and MoE\n"
             "(listed in its --help).\n",
    .args = g_args,
    .opts = g_opts,
    .epilog_more = epilog,
    .run = cmd_train,
};

/* --log-every N: a whole number of steps, its refusal saying what a large N does. */
static bool log_every_fn(const cli_ctx *x)
{
    char *end = NULL;
    errno = 0;
    long long n = strtoll(x->arg, &end, 10);
    if (!*x->arg || *end || errno || n < 1 || n > 1000000000)
        return cli_usage_error("train", "--log-every expects a whole number of steps in [1, 1000000000], got '%s' (the "
                               "last step's line is always printed, so a large N prints little else)", x->arg), false;
    *(int64_t *)cli_target(x) = n;
    return true;
}

static bool data_dtype_fn(const cli_ctx *x)
{
    if (hp_data_dtype_parse(x->arg, cli_target(x))) return true;
    return cli_usage_error("train", "--data-dtype expects uint16 or uint32, got '%s'", x->arg), false;
}

/* --seed: strtoull's unsigned 64-bit integer, no sign. */
static bool seed_fn(const cli_ctx *x)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(x->arg, &end, 10);
    if (!*x->arg || *end || errno || x->arg[0] == '-')
        return cli_usage_error("train", "--seed expects an unsigned 64-bit integer, got '%s'", x->arg), false;
    *(uint64_t *)cli_target(x) = (uint64_t)v;
    return true;
}

static bool schedule_fn(const cli_ctx *x)
{
    if (hp_lr_kind_parse(x->arg, cli_target(x))) return true;
    return cli_usage_error("train", "--schedule expects constant, linear or cosine, got '%s'", x->arg), false;
}

static bool pp_sched_fn(const cli_ctx *x)
{
    if (hp_pp_sched_parse(x->arg, cli_target(x))) return true;
    return cli_usage_error("train", "--pp-schedule expects 1f1b, gpipe or interleaved, got '%s'", x->arg), false;
}

/* --help printed: exit 0 without training. */
#define PARSE_HELP CLI_HELP

/* The command line into *a: HP_EXIT_OK, PARSE_HELP, or a usage error's exit code (the error printed, or deferred:
 * cli_usage_defer). */
static int parse(train_args *a, cli_parser *cp, int argc, char **argv)
{
    cp->command = &cli_cmd_train;
    int prc = cli_parse(cp, a, argc, argv);
    if (prc != HP_EXIT_OK) return prc; /* CLI_HELP is PARSE_HELP */
    static const int data_opts[] = {O_EVAL, O_DDTYPE, O_SHUFFLE, O_SEED, O_SEQ, O_GB, O_MB, O_EVERY, O_TOK,
                                    O_LMASK};
    for (size_t i = 0; i < sizeof data_opts / sizeof *data_opts; i++) a->data_opts |= cli_given(cp, data_opts[i]);
    a->dtype_given = cli_given(cp, O_DDTYPE);
    a->seed_given = cli_given(cp, O_SEED);
    a->sched_given = cli_given(cp, O_SCHED);
    a->pp_sched_given = cli_given(cp, O_PPSCHED);
    if (optind >= argc) return cli_usage_error("train", "missing MODEL");
    if (optind + 1 < argc) return cli_usage_error("train", "unexpected argument '%s'", argv[optind + 1]);
    a->model = argv[optind];
    if (!a->input && !a->data && !a->text)
        return cli_usage_error("train", "missing --input IDS.safetensors, --data FILE or --text FILE");
    if ((a->input != NULL) + (a->data != NULL) + (a->text != NULL) > 1)
        return cli_usage_error("train", "give one of --input (the same batch every step), --data (a token file) and "
                               "--text (a text file, tokenized), not %s", a->input && a->data && a->text ? "all three"
                                                                          : "both");
    if (a->input && a->data_opts)
        return cli_usage_error("train", "--seq, --global-batch, --micro-batch, --data-dtype, --shuffle, --seed and "
                               "--eval-data/--eval-every go with --data or --text, not --input");
    if (!a->text && (a->tokenizer || a->loss_mask))
        return cli_usage_error("train", "%s goes with --text FILE", a->tokenizer ? "--tokenizer" : "--loss-mask");
    if (a->text && a->dtype_given)
        return cli_usage_error("train", "--data-dtype goes with --data: --text makes its tokens itself");
    if (a->data || a->text) {
        const char *src = a->data ? "--data" : "--text";
        if (!a->seq) return cli_usage_error("train", "%s needs --seq S (the window length)", src);
        if (!a->gb) return cli_usage_error("train", "%s needs --global-batch GB (windows per step)", src);
        a->mb = a->gb; /* one micro-step a step until the plan's dp sets it (open_data) */
        if (!a->eval_data != !a->eval_every)
            return cli_usage_error("train", "--eval-data and --eval-every go together");
        a->order.global_batch = a->gb;
    } else if (!a->sched_given) {
        a->sched.kind = HP_LR_CONSTANT; /* --input: a constant lr unless a schedule is asked for, as before */
    }
    if (a->sched.min_lr > a->to.lr)
        return cli_usage_error("train", "--min-lr %g is above --lr %g", a->sched.min_lr, a->to.lr);
    if (a->force && !a->out && !a->log_json)
        return cli_usage_error("train", "--force replaces an earlier --out DIR or --log-json FILE; give one");
    if (a->save_every && !a->out)
        return cli_usage_error("train", "--save-every needs --out DIR: the run folder its checkpoints go in");
    if (a->stop_after > a->steps)
        return cli_usage_error("train", "--stop-after %lld is past --steps %lld", (long long)a->stop_after,
                               (long long)a->steps);
    if (a->plan && cli_plan_flags_any(&a->pf))
        return cli_usage_error("train", "give either --plan or the plan flags (--mesh, --tp, ...), not both");
    a->default_mesh = cli_plan_flags_default_mesh(&a->pf);
    if (!a->default_mesh) {
        int rc = cli_plan_flags_mesh("train", &a->pf, 1);
        if (rc != HP_EXIT_OK) return rc;
    }
    return HP_EXIT_OK;
}

/* "hyperpar train ARGS" as typed, each argument that needs it in single quotes: what a checkpoint records of the
 * command that saved it. Cut at cap. */
static void cmdline_of(int argc, char **argv, char *out, size_t cap)
{
    size_t n = (size_t)snprintf(out, cap, "hyperpar train");
    for (int i = 1; i < argc && n < cap; i++) {
        const char *x = argv[i];
        bool plain = *x && strspn(x, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=.,/:@+%") ==
                               strlen(x);
        n += (size_t)snprintf(out + n, cap - n, plain ? " %s" : " '", x);
        for (const char *c = x; !plain && *c && n + 5 < cap; c++)
            n += (size_t)(*c == '\'' ? snprintf(out + n, cap - n, "'\\''") : snprintf(out + n, cap - n, "%c", *c));
        if (!plain && n < cap) n += (size_t)snprintf(out + n, cap - n, "'");
    }
}

int cmd_train(int argc, char **argv)
{
    train_args a = {.steps = 1, .log_every = 1};
    hp_train_opts_default(&a.to);
    cli_plan_flags_init(&a.pf);
    cli_parser cp = {.cmd = "train", .opts = g_opts};
    /* Under a launcher a usage error is said after the ranks agreed on their options: one rank's bad value (an
     * MPMD launch) is then named as the option that differs, where otherwise it would end the job unsaid. The
     * options after the bad one are still read, so that every rank's list is whole. */
    char usage_msg[HP_ERR_MSG_MAX] = "";
    bool launched = hp_comm_launched();
    if (launched) cli_usage_defer(usage_msg, sizeof usage_msg);
    cmdline_of(argc, argv, a.cmdline, sizeof a.cmdline);
    int rc = parse(&a, &cp, argc, argv), c;
    while (rc > 0 && launched && (c = cli_getopt(&cp, argc, argv)) != -1 && c != '?') continue;
    cli_usage_defer(NULL, 0);
    if (rc == PARSE_HELP) return HP_EXIT_OK;
    if (rc != HP_EXIT_OK && !launched) return rc;
    if (rc != HP_EXIT_OK && !usage_msg[0]) /* every path above says why; this only guards the message */
        snprintf(usage_msg, sizeof usage_msg, "train: bad usage; see 'hyperpar train --help'");
    return train(&a, &cp, rc != HP_EXIT_OK ? usage_msg : NULL, &argc, &argv);
}
