/*
 * trainer.c — the library trainer's phases before the steps (hyperpar/train.h): open checks the options against
 * the file system and opens the model, the plan and the data's headers; prepare refuses what this node cannot
 * hold, creates the runner, binds and resumes the run, reads every token it will read, and only then creates the
 * run folder and the log. Every phase ends in an agreement of the ranks, so a phase fails on every rank or on
 * none; nothing is created before every check passed.
 *
 * What the user sees goes through the caller's event callback (hp__trn_note on rank 0, hp__trn_warn on every
 * rank); the library prints nothing itself.
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "trainer.h"
#include "hyperpar/moe.h"
#include "hyperpar/shard.h"
#include "hyperpar/trainckpt.h"

const char *const hp__trn_out_names[] = {"config.json", "model.safetensors", NULL};
const char *const hp__trn_ckpt_names[] = {"config.json", "model.safetensors", "state.json", "rank-*.safetensors",
                                          NULL};

void hp_train_config_default(hp_train_config *c)
{
    memset(c, 0, sizeof *c);
    c->steps = 1;
    hp_train_opts_default(&c->opt);
    c->sched.kind = HP_LR_COSINE;
    c->order.shuffle = HP_DATA_SEEDED;
    c->compute = HP_LINALG_EXACT;
}

/* ---- events ---- */

void hp__trn_event(hp_trainer *t, const hp_train_event *ev)
{
    if (t->c.on_event) t->c.on_event(t->c.ctx, ev);
}

/* A sentence of kind k, formatted as a message is (16 KiB: a path of PATH_MAX bytes and more fits). */
static void text_event(hp_trainer *t, hp_train_event_kind k, const char *fmt, va_list ap)
{
    if (!t->c.on_event) return;
    char msg[16384];
    vsnprintf(msg, sizeof msg, fmt, ap);
    hp_train_event ev = {.kind = k, .text = msg};
    t->c.on_event(t->c.ctx, &ev);
}

void hp__trn_note(hp_trainer *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    text_event(t, HP_TRAIN_EV_NOTE, fmt, ap);
    va_end(ap);
}

void hp__trn_warn(hp_trainer *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    text_event(t, HP_TRAIN_EV_WARNING, fmt, ap);
    va_end(ap);
}

int64_t hp__trn_last_step(const hp_trainer *t)
{
    const hp_train_config *a = &t->c;
    return a->stop_after > 0 && a->stop_after < a->steps ? a->stop_after : a->steps;
}

/* ---- open ---- */

/* Whether the file path is the output folder of, or lies inside it (its folder resolved, links followed). */
static bool inside_outdir(const char *path, const hp_outdir *of)
{
    char g[PATH_MAX], rg[PATH_MAX], full[2 * PATH_MAX + 2];
    const char *slash = strrchr(path, '/');
    snprintf(g, sizeof g, "%.*s", slash ? (int)(slash - path) + 1 : 1, slash ? path : ".");
    const char *canon = hp_outdir_path(of);
    size_t cl = strlen(canon);
    if (!realpath(g, rg)) return false;
    if (!strncmp(rg, canon, cl) && (rg[cl] == '\0' || rg[cl] == '/')) return true;
    snprintf(full, sizeof full, "%s/%s", strcmp(rg, "/") ? rg : "", slash ? slash + 1 : path);
    return !strcmp(full, canon);
}

/* --out and --resume before any work: a resume into its own run folder continues there, --out's folder checked
 * (hyperpar/outdir.h) or, with --save-every, a folder or nothing; the checkpoint --resume means found; no file
 * output inside --out's folder (its rename would take it along). */
static hp_status check_outputs(hp_trainer *t, hp_err *err)
{
    const hp_train_config *a = &t->c;
    hp_status st = HP_OK;
    /* --resume into the run's own folder: it stays the run folder, with or without --save-every (the last step is
     * then its one new checkpoint; hyperpar merge makes the Hugging Face folder) */
    if (a->resume && a->out && !t->save_every && hp_train_ckpt_is(a->out)) {
        t->save_every = a->steps;
        if (t->root)
            hp__trn_note(t, "--out %s is a run folder: the run continues in it, its last step saved as a checkpoint "
                         "there ('hyperpar merge %s' makes the Hugging Face folder)", a->out, a->out);
    }
    if (a->out && !t->save_every) { /* with --save-every DIR holds the checkpoints instead */
        hp_outdir_spec os = {.cmd = "train", .out = a->out, .names = hp__trn_out_names, .example = "trained",
                             .force = a->force, .inputs = t->inputs, .n_inputs = 4};
        st = hp_outdir_open(&t->of, &os, err);
    }
    struct stat sb; /* the run folder: made just before step 1 */
    if (st == HP_OK && a->out && t->save_every && stat(a->out, &sb) == 0 && !S_ISDIR(sb.st_mode))
        st = hp_err_set(err, HP_ERR_INPUT, "--out %s is not a folder; with --save-every it holds the run's "
                        "checkpoints", a->out);
    if (st == HP_OK && a->resume) st = hp_train_ckpt_find("--resume", a->resume, t->ckpt, sizeof t->ckpt, err);
    /* A file inside --out DIR would go with the folder's rename (with --save-every the run folder is not renamed). */
    hp_outdir *of = t->of;
    if (st == HP_OK && of && a->grad_out && inside_outdir(a->grad_out, of))
        st = hp_err_set(err, HP_ERR_INPUT, "--grad-out %s is or lies inside --out %s; write it elsewhere", a->grad_out,
                        a->out);
    if (st == HP_OK && of && a->log_json && inside_outdir(a->log_json, of))
        st = hp_err_set(err, HP_ERR_INPUT, "--log-json %s is or lies inside --out %s, whose folder replaces what is "
                        "there when the model is written; write it elsewhere", a->log_json, a->out);
    if (st == HP_OK && of && a->plot && inside_outdir(a->plot, of))
        st = hp_err_set(err, HP_ERR_INPUT, "--plot %s is or lies inside --out %s; write it elsewhere", a->plot,
                        a->out);
    if (st == HP_OK && of && a->stats_json && inside_outdir(a->stats_json, of))
        st = hp_err_set(err, HP_ERR_INPUT, "--stats-json %s is or lies inside --out %s; write it elsewhere",
                        a->stats_json, a->out);
    return st;
}

/* What the batch comes from: exactly one of input, data and text; the text's options with text only. */
static hp_status check_sources(const hp_train_config *a, hp_err *err)
{
    if ((a->input != NULL) + (a->data != NULL) + (a->text != NULL) != 1)
        return hp_err_set(err, HP_ERR_INPUT, "give one of --input (the same batch every step), --data (a token file) "
                          "and --text (a text file, tokenized), not %s", a->input || a->data || a->text ? "several"
                                                                                                           : "none");
    if (!a->text && (a->tokenizer || a->loss_mask))
        return hp_err_set(err, HP_ERR_INPUT, "%s goes with --text", a->tokenizer ? "--tokenizer" : "--loss-mask");
    return HP_OK;
}

/* The plan without a caller's callback: derived at its defaults, tp = the world. */
static hp_status default_plan(hp_model *m, int world, hp_plan **p, hp_err *err)
{
    hp_plan_opts po;
    hp_plan_opts_default(&po);
    hp_mesh_from_sizes(&po.mesh, 1, 1, world, 0, false);
    return hp_plan_derive(p, m, &po, err);
}

/* The model (a checkpoint, or a shard folder's config), its plan, and the batch: --input's ids, or --data's and
 * --eval-data's headers. */
static hp_status open_model(hp_trainer *t, hp_err *err)
{
    const hp_train_config *a = &t->c;
    t->shard = hp_shard_is_folder(a->model);
    hp_status st = t->shard ? hp_moe_shard_config_open(&t->m, a->model, err) : hp_model_open(&t->m, a->model, NULL, err);
    if (st == HP_OK && a->out && !t->m->has_config)
        st = hp_err_set(err, HP_ERR_INPUT, "%s has no config.json beside its weights; --out copies it into the "
                        "checkpoint it writes, so train the checkpoint folder", a->model);
    /* the caller's plan (--plan, the shard folder's own, or the one the flags derive), else the default */
    if (st == HP_OK)
        st = a->plan ? a->plan(a->ctx, t->m, t->shard ? a->model : NULL, t->world, &t->p, err)
                     : default_plan(t->m, t->world, &t->p, err);
    if (st == HP_OK) hp_mesh_str(&t->p->mesh, t->mesh, sizeof t->mesh);
    if (st == HP_OK && a->input) st = hp_data_read_input_ids(a->input, 0, &t->ids, &t->B, &t->S, err);
    if (st == HP_OK && (a->data || a->text)) st = hp__trn_open_data(t, err);
    if (st == HP_OK && (t->data ? hp_data_row_scored(t->data) : t->S - 1) <= 0) /* S = 1: a mean of nothing */
        st = hp_err_set(err, HP_ERR_INPUT, "%s: its rows are 1 token long, so no position is scored (each predicts "
                        "the next token) and a step would only decay the weights; give rows of 2 tokens or more",
                        t->data ? hp_data_path(t->data) : a->input);
    return st;
}

/* An option that changes nothing in this run: one warning each, before step 1 (every rank). */
static void warn_no_effect(hp_trainer *t)
{
    const hp_train_config *a = &t->c;
    int64_t last = hp__trn_last_step(t);
    if (a->sched.min_lr > 0 && a->sched.kind == HP_LR_CONSTANT)
        hp__trn_warn(t, "--min-lr has no effect with --schedule constant (it is where linear and cosine end)");
    else if (a->sched.kind != HP_LR_CONSTANT && a->sched.warmup >= a->steps && (a->sched.min_lr > 0 || a->sched_given))
        hp__trn_warn(t, "%s has no effect: --warmup %lld spans all --steps %lld, so the schedule never decays",
                     a->sched.min_lr > 0 ? "--min-lr" : "--schedule", (long long)a->sched.warmup, (long long)a->steps);
    if (a->eval_every > last)
        hp__trn_warn(t, "--eval-every %lld has no effect: it is past the last step this run takes (%lld), so "
                     "--eval-data is never evaluated", (long long)a->eval_every, (long long)last);
    if (a->dtype_given && a->text)
        hp__trn_warn(t, "--data-dtype has no effect with --text: its tokens are made in memory");
    if (a->dtype_given && a->data && hp_data_is_safetensors(a->data))
        hp__trn_warn(t, "--data-dtype has no effect with a safetensors --data (%s): its input_ids carry their own "
                     "dtype", a->data);
    if (a->seed_given && a->order.shuffle == HP_DATA_IN_ORDER)
        hp__trn_warn(t, "--seed has no effect with --shuffle none (it seeds the shuffle)");
    if (a->opt.zero && hp_mesh_size(&t->p->mesh, "dp") == 1 && (t->m->cfg.n_experts == 0 || t->world == 1))
        hp__trn_warn(t, "--zero 1 has no effect at dp=1: no other rank holds the same parameters to share AdamW's "
                     "moments with");
    if (a->pp_sched_given && hp_mesh_size(&t->p->mesh, "pp") < 2)
        hp__trn_warn(t, "--pp-schedule has no effect: the mesh has no pipeline (pp=1)");
    if (a->stop_after && a->stop_after == a->steps)
        hp__trn_warn(t, "--stop-after %lld has no effect: it is --steps, the run's last step anyway",
                     (long long)a->stop_after);
    hp_lr_schedule ls = a->sched; /* a run whose every step has lr 0 writes the model unchanged (its gradients may
                                     be what is wanted: --grad-out), so it is said, not refused */
    ls.lr = a->opt.lr, ls.steps = a->steps;
    bool moves = false;
    for (int64_t s = 1; s <= a->steps && !moves; s++) moves = hp_lr_at(&ls, s) > 0;
    if (!moves)
        hp__trn_warn(t, "every step's learning rate is 0 (--schedule %s over --steps %lld ends at --min-lr %g%s): the "
                     "weights will not change; give more --steps, a --min-lr above 0 or --schedule constant",
                     hp_lr_kind_name(ls.kind), (long long)a->steps, ls.min_lr, a->steps == 1 ? " on its only step" : "");
}

hp_status hp_train_open(hp_trainer **out, const hp_comm *w, const hp_train_config *cfg, hp_err *err)
{
    *out = NULL;
    hp_trainer *t = hp_calloc(1, sizeof *t);
    if (!t) return hp_comm_agree(w, hp_err_set(err, HP_ERR_NOMEM, "out of memory"), err);
    t->c = *cfg;
    t->w = w;
    t->world = hp_comm_size(w);
    t->root = hp_comm_rank(w) == 0;
    t->to = cfg->opt;
    t->sched = cfg->sched;
    t->save_every = cfg->save_every;
    const char *inputs[8] = {cfg->input, cfg->overrides, cfg->plan_file, cfg->model, cfg->data, cfg->eval_data,
                             cfg->text, cfg->tokenizer};
    memcpy(t->inputs, inputs, sizeof inputs);
    hp_status st = check_sources(cfg, err);
    if (st == HP_OK && cfg->check) st = cfg->check(cfg->ctx, err);
    if (st == HP_OK) st = check_outputs(t, err);
    t->last = hp__trn_last_step(t);
    if (st == HP_OK) st = open_model(t, err);
    st = hp_comm_agree(w, st, err);
    if (st == HP_OK && cfg->text) st = hp__trn_same_text(t, err);
    if (st == HP_OK) warn_no_effect(t);
    if (st != HP_OK) hp_train_close(t);
    else *out = t;
    return st;
}

/* ---- prepare ---- */

/* The batch buffers (--data: a micro-batch's ids and the largest --eval-data batch's) and the losses. */
static hp_status alloc_buffers(hp_trainer *t, hp_err *err)
{
    if (t->data) {
        /* every micro-batch of a step: a pipeline takes them together (hp_runner_accumulate_pipe) */
        t->ids = hp_calloc((size_t)(t->c.global_batch * t->S), sizeof *t->ids);
        if (t->eval) t->eval_ids = hp_calloc((size_t)(t->eval_rows * t->S), sizeof *t->eval_ids);
        if (!t->ids || (t->eval && !t->eval_ids)) return hp_err_set(err, HP_ERR_NOMEM, "out of memory for the batch");
        /* a masked source's masks, parallel to the ids */
        if (hp_data_masked(t->data) && !(t->mask = hp_calloc((size_t)(t->c.global_batch * t->S), 1)))
            return hp_err_set(err, HP_ERR_NOMEM, "out of memory for the batch's mask");
        if (t->eval && hp_data_masked(t->eval) && !(t->eval_mask = hp_calloc((size_t)(t->eval_rows * t->S), 1)))
            return hp_err_set(err, HP_ERR_NOMEM, "out of memory for the evaluation's mask");
    }
    t->losses = hp_calloc((size_t)t->c.steps, sizeof *t->losses);
    if (!t->losses) return hp_err_set(err, HP_ERR_NOMEM, "out of memory for %lld losses", (long long)t->c.steps);
    return HP_OK;
}

/* Only now, every check passed, does the run create anything: the run folder, the log. Rank 0. */
static hp_status create_outputs(hp_trainer *t, hp_err *err)
{
    const hp_train_config *a = &t->c;
    hp_status st = HP_OK;
    if (a->out && t->save_every) {
        if (mkdir(a->out, 0777) != 0 && errno != EEXIST)
            st = hp_err_set(err, HP_ERR_INPUT, "--out %s: cannot create the run folder (%s)", a->out, strerror(errno));
        else /* what a killed run left there (a save it never finished) */
            hp_outdir_remove_stale(a->out);
    }
    if (st == HP_OK && a->log_json) st = hp__trn_log_open(t, err);
    return st;
}

hp_status hp_train_prepare(hp_trainer *t, int local_ranks, hp_err *err)
{
    const hp_train_config *a = &t->c;
    const hp_comm *w = t->w;
    /* a batch this node cannot hold is refused before it is read or allocated */
    t->eval_rows = t->eval ? hp__trn_eval_batch_max(hp_data_windows(t->eval), a->global_batch) : 0;
    hp_status st = hp__trn_memory_check(t, local_ranks, err);
    /* a pipeline's schedule must run the step's micro-batches (interleaved: a multiple of pp) */
    t->pp_sched = a->pp_sched_given ? a->pp_sched : hp_pp_sched_default(&t->p->pipe);
    if (st == HP_OK && t->p->pipe.pp > 1)
        st = hp_pp_sched_check(&t->p->pipe, t->pp_sched, t->data ? a->global_batch / t->mb : 1, err);
    if (st == HP_OK) st = alloc_buffers(t, err);
    st = hp_comm_agree(w, st, err);
    if (st == HP_OK && (t->save_every || a->resume)) st = hp__trn_bind_start(t, err);
    st = hp_comm_agree(w, st, err);
    if (st == HP_OK) {
        hp_run_opts ro = {.command = "train", .shards = t->shard ? a->model : NULL, .keep_activations = true,
                          .no_logits = true, .compute = a->compute, .test_nan_grad = a->test_nan_grad};
        st = hp_runner_create(&t->r, w, t->m, t->p, &ro, err);
        st = hp_comm_agree(w, st, err);
    }
    if (st == HP_OK && a->resume) st = hp__trn_resume(t, err);
    if (st == HP_OK && t->last <= t->k0)
        st = hp_err_set(err, HP_ERR_INPUT, "--stop-after %lld: the run resumed at step %lld is already past it",
                        (long long)a->stop_after, (long long)t->k0);
    /* Every token the run will read, before step 1: a bad one found at step k would end the run after k - 1 steps
     * of work, and one in --eval-data after the first evaluation's; so would a last checkpoint it cannot save. */
    if (st == HP_OK && a->out && t->save_every) st = hp__trn_check_checkpoint_out(t, err);
    if (st == HP_OK && t->data) st = hp__trn_scan_data(t, err);
    if (st == HP_OK && t->root && a->log_json) st = hp__trn_log_check(t, err);
    st = hp_comm_agree(w, st, err);
    if (st == HP_OK && t->root) st = create_outputs(t, err);
    st = hp_comm_agree(w, st, err);
    t->sched.steps = a->steps;
    t->sched.lr = t->to.lr;
    t->info = (hp_train_info){.k0 = t->k0, .last = t->last, .save_every = t->save_every, .n_logged = t->prev.n,
                              .logged_loss = t->prev.loss, .logged_norm = t->prev.norm, .logged_eval = t->prev.eval,
                              .model_path = t->m->path, .mesh = t->mesh, .run_id = t->run_id,
                              .eval_windows = t->eval ? hp_data_windows(t->eval) : 0};
    return st;
}

const hp_train_info *hp_train_info_of(const hp_trainer *t) { return &t->info; }

hp_runner *hp_train_runner(hp_trainer *t) { return t->r; }

void hp_train_close(hp_trainer *t)
{
    if (!t) return;
    if (t->log) fclose(t->log);
    hp__trn_log_prev_free(&t->prev);
    hp__trn_list_free(&t->grads);
    hp__trn_list_free(&t->params);
    hp_data_close(t->data);
    hp_data_close(t->eval);
    free(t->eval_ids);
    free(t->losses);
    free(t->ids);
    free(t->mask);
    free(t->eval_mask);
    hp_runner_free(t->r);
    hp_plan_free(t->p);
    hp_model_close(t->m);
    hp_outdir_close(t->of);
    free(t->model_config);
    free(t);
}
