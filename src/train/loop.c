/*
 * loop.c — the training steps (hp_train_run) and what the run writes at its end (hp_train_write).
 *
 * Step t = k + 1 (k = k0 .. last − 1): the schedule's lr for t; per micro-batch (--data: GB / MB of them, global
 * batch k's rows j·MB .. (j+1)·MB − 1; --input: the one batch) hp_runner_accumulate, the loss of every
 * micro-batch's gradients being the mean over the whole step's scored positions; then hp_runner_apply (sum over the
 * mesh, norm, clip, AdamW). Then, in this order: the STEP event, the evaluation (every --eval-every steps), the
 * log's line, the first step's gradients gathered (--grad-out), the checkpoint (every --save-every steps and at the
 * last), the STEP_END event. Every rank agrees after each part that can fail on one rank.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "trainer.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The model FLOPs of a step over `tokens` forwarded positions and the same-run GEMM limit (every rank at once),
 * into t; the LIMIT event on rank 0. Collective. */
static hp_status measure_limit(hp_trainer *t, int64_t tokens, hp_err *err)
{
    hp_gemm_limit lim;
    hp_status st = hp_cost_gemm_limit(t->w, HP_TRAIN_GEMM_N, t->c.compute, HP_TRAIN_GEMM_REPS, &lim, err);
    if (st != HP_OK) return st;
    t->flop_step = hp_cost_train_flops(t->m, tokens);
    t->limit = lim.sum_gflops * 1e9;
    if (t->root) {
        hp_train_event ev = {.kind = HP_TRAIN_EV_LIMIT, .tokens = (double)tokens, .flop_step = t->flop_step,
                             .weights = hp_cost_gemm_weights(t->m), .limit = &lim};
        hp__trn_event(t, &ev);
    }
    return HP_OK;
}

/* Step t's line of --log-json (rank 0); a write error (a full disk) is said now, not lost. */
static hp_status log_line(hp_trainer *t, int64_t step, double loss, double norm, double tps, double dt, double mfu,
                          bool evaluated, double eval_loss, hp_err *err)
{
    FILE *log = t->log;
    fprintf(log, "{\"step\": %lld, \"loss\": %.9g, \"grad_norm\": %.9g, \"lr\": %.17g, \"tokens_per_s\": %.6g, "
            "\"step_s\": %.6g, \"mfu\": %.6g", (long long)step, loss, norm, t->to.lr, tps, dt, mfu);
    if (evaluated) fprintf(log, ", \"eval_loss\": %.9g", eval_loss);
    if (t->run_id[0]) fprintf(log, ", \"run_id\": \"%s\"", t->run_id);
    fprintf(log, "}\n");
    if (fflush(log) != 0 || ferror(log))
        return hp_err_set(err, HP_ERR_IO, "--log-json %s: cannot write step %lld's line (%s)", t->c.log_json,
                          (long long)step, strerror(errno ? errno : EIO));
    return HP_OK;
}

/* Step k + 1's micro-batches and update: *loss its loss, *norm the gradient norm, *skipped whether it was skipped
 * (not finite), *n_scored the targets it scored (--data: over its global batch, a mask's marked ones only; --input:
 * B·(S − 1)). Collective; the status agreed. */
static hp_status take_step(hp_trainer *t, int64_t k, int64_t n_micro, int64_t rows, int64_t *n_scored, double *loss,
                           double *norm, bool *skipped, hp_err *err)
{
    hp_status st = HP_OK;
    t->to.lr = hp_lr_at(&t->sched, k + 1);
    double *lj = hp_calloc((size_t)n_micro, sizeof *lj);
    int64_t *sj = hp_calloc((size_t)n_micro, sizeof *sj);
    if (!lj || !sj) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    *n_scored = t->B * (t->S - 1);
    if (st == HP_OK && t->data) st = hp__trn_batch(t, k, n_micro, sj, n_scored, err);
    st = hp_comm_agree(t->w, st, err);
    /* the micro-batches in turn, or through the pipeline's schedule */
    if (st == HP_OK)
        st = hp_runner_accumulate_pipe(t->r, t->ids, t->mask, n_micro, rows, t->S, t->data ? *n_scored : 0,
                                       t->pp_sched, lj, err);
    for (int64_t j = 0; st == HP_OK && j < n_micro; j++) { /* a micro-batch that scores nothing adds nothing */
        double wj = t->data ? (double)sj[j] : (double)(rows * (t->S - 1));
        *loss += wj > 0 ? lj[j] * wj / (double)*n_scored : 0;
    }
    free(lj);
    free(sj);
    int64_t skipped0 = hp_runner_stats(t->r)->train_skipped;
    if (st == HP_OK) st = hp_runner_apply(t->r, &t->to, norm, err);
    st = hp_comm_agree(t->w, st, err);
    *skipped = st == HP_OK && hp_runner_stats(t->r)->train_skipped > skipped0;
    return st;
}

hp_status hp_train_run(hp_trainer *t, hp_err *err)
{
    const hp_train_config *a = &t->c;
    const hp_comm *w = t->w;
    /* With --data: GB/MB micro-batches of MB rows, each row scoring hp_data_row_scored positions (a mask's marked
     * ones); the loss of every micro-batch's gradients is the mean over the whole step's n_scored. */
    int64_t n_micro = t->data ? a->global_batch / t->mb : 1, rows = t->data ? t->mb : t->B, n_scored = 0;
    hp_status st = measure_limit(t, n_micro * rows * t->S, err);
    for (int64_t k = t->k0; st == HP_OK && k < t->last; k++) {
        double loss = 0, norm = 0, t0 = now_s();
        bool skipped = false;
        st = take_step(t, k, n_micro, rows, &n_scored, &loss, &norm, &skipped, err);
        if (st != HP_OK) break;
        double dt = now_s() - t0, tps = dt > 0 ? (double)n_scored / dt : 0;
        double mfu = t->limit > 0 && dt > 0 ? t->flop_step / dt / t->limit : 0;
        t->losses[k] = (float)loss;
        double eval_loss = 0;
        bool evaluated = t->eval && (k + 1) % a->eval_every == 0;
        if (t->root) {
            hp_train_event ev = {.kind = HP_TRAIN_EV_STEP, .step = k + 1, .loss = loss, .grad_norm = norm,
                                 .lr = t->to.lr, .tokens = (double)n_scored, .seconds = dt, .mfu = mfu,
                                 .skipped = skipped, .clipped = t->to.clip > 0 && norm > t->to.clip,
                                 .evaluates = evaluated};
            hp__trn_event(t, &ev);
        }
        if (evaluated) {
            st = hp__trn_evaluate(t, &eval_loss, err);
            if (st != HP_OK) break;
            hp_train_event ev = {.kind = HP_TRAIN_EV_EVAL, .step = k + 1, .loss = eval_loss,
                                 .windows = hp_data_windows(t->eval)};
            if (t->root) hp__trn_event(t, &ev);
        }
        if (t->log) {
            hp_status ls = log_line(t, k + 1, loss, norm, tps, dt, mfu, evaluated, eval_loss, err);
            if (st == HP_OK) st = ls;
        }
        st = hp_comm_agree(w, st, err);
        if (k == t->k0 && a->grad_out) {
            st = hp_runner_gather_params(t->r, true, hp__trn_keep, &t->grads, err);
            st = hp_comm_agree(w, st, err);
        }
        if (st == HP_OK && t->save_every && ((k + 1) % t->save_every == 0 || k + 1 == t->last))
            st = hp__trn_save_checkpoint(t, k + 1, err);
        if (st == HP_OK && t->root) {
            hp_train_event ev = {.kind = HP_TRAIN_EV_STEP_END, .step = k + 1};
            hp__trn_event(t, &ev);
        }
    }
    return st;
}

int hp_train_temporaries(hp_trainer *t, const char **paths, int cap)
{
    int n_rm = 0;
    long pid = (long)getpid();
    if (t->root && t->of) { /* every name the writers may have made: their own temporaries, then the folder */
        snprintf(t->rm[n_rm++], sizeof t->rm[0], "%s/%s", hp_outdir_tmp(t->of), HP_OUTDIR_MARKER);
        for (int i = 0; hp__trn_out_names[i]; i++) {
            snprintf(t->rm[n_rm++], sizeof t->rm[0], "%s/%s", hp_outdir_tmp(t->of), hp__trn_out_names[i]);
            snprintf(t->rm[n_rm++], sizeof t->rm[0], "%s/%s.tmp.%ld", hp_outdir_tmp(t->of), hp__trn_out_names[i], pid);
        }
    }
    if (t->root && t->c.grad_out) snprintf(t->rm[n_rm++], sizeof t->rm[0], "%s.tmp.%ld", t->c.grad_out, pid);
    int n = 0;
    for (int i = 0; i < n_rm && n < cap; i++) paths[n++] = t->rm[i];
    if (t->root && t->of && n < cap) paths[n++] = hp_outdir_tmp(t->of);
    return n;
}

hp_status hp_train_write(hp_trainer *t, hp_err *err)
{
    const hp_train_config *a = &t->c;
    const hp_comm *w = t->w;
    hp_status st = HP_OK;
    if (a->out && !t->save_every) { /* (with --save-every the last checkpoint is the model) */
        st = hp_runner_gather_params(t->r, false, hp__trn_keep, &t->params, err);
        st = hp_comm_agree(w, st, err);
        if (st == HP_OK && t->root) st = hp__trn_write_folder(t, &t->params, t->of, NULL, err);
        st = hp_comm_agree(w, st, err);
        if (st == HP_OK && t->root) hp__trn_note(t, "wrote %s (%d trained parameters, float32)", a->out, t->params.n);
    }
    if (st == HP_OK && a->grad_out) {
        if (t->root) st = hp__trn_write_grads(a->grad_out, &t->grads, t->losses + t->k0, t->last - t->k0, err);
        st = hp_comm_agree(w, st, err);
        if (st == HP_OK && t->root)
            hp__trn_note(t, "wrote %s (%d gradients, %lld losses)", a->grad_out, t->grads.n,
                         (long long)(t->last - t->k0));
    }
    return st;
}

hp_status hp_train_end(hp_trainer *t, hp_err *err)
{
    FILE *log = t->log;
    t->log = NULL;
    if (log && fclose(log) != 0)
        return hp_err_set(err, HP_ERR_IO, "--log-json %s: write error (%s)", t->c.log_json, strerror(errno));
    return HP_OK;
}
