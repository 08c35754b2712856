/*
 * batches.c — the training run's data (hyperpar/data.h): --data and --eval-data opened and checked against the
 * plan before step 1, every token the run will read scanned against the vocabulary, --eval-data's batches and
 * their evaluation, and the refusal of a batch this node cannot hold.
 *
 *   --data, GB windows a step:       GB / MB micro-batches of MB = --micro-batch x dp windows each
 *   --eval-data, W windows:          batches of GB in file order, the last remainder joined to the one before it
 *                                    (| GB | GB | ... | GB + r |, r < GB), so the largest is min(W, 2·GB − 1)
 */
#include <limits.h>
#include <stdio.h>

#include "trainer.h"
#include "hyperpar/cost.h"

/* The rows of --eval-data's batch at window w0 of W (the remainder joined to the batch before it, so no batch
 * has fewer rows than dp replicas unless the file does). */
int64_t hp__trn_eval_batch(int64_t W, int64_t w0, int64_t gb) { return W - w0 < 2 * gb ? W - w0 : gb; }
/* The largest of them: min(W, 2·GB − 1). */
int64_t hp__trn_eval_batch_max(int64_t W, int64_t gb) { return W < 2 * gb - 1 ? W : 2 * gb - 1; }

/* Opens the training data (and the eval data) on every rank, reading their headers only, and checks what the
 * plan needs of them before step 1: rows of one length, a vocabulary to check tokens against, and as many rows
 * as dp replicas in every micro-batch and every --eval-data batch. t->B: rows a micro-batch, t->S: ids a row. */
hp_status hp__trn_open_data(hp_trainer *t, hp_err *err)
{
    const hp_train_config *a = &t->c;
    hp_status st = hp_data_open(&t->data, a->data, a->dtype, a->seq, err);
    if (st == HP_OK && a->eval_data) st = hp_data_open(&t->eval, a->eval_data, a->dtype, a->seq, err);
    if (st != HP_OK) return st;
    t->S = hp_data_row_len(t->data);
    if (t->eval && hp_data_row_len(t->eval) != t->S)
        return hp_err_set(err, HP_ERR_INPUT, "--eval-data %s gives rows of %lld ids and --data %s rows of %lld; "
                          "give both as token streams or both as safetensors", a->eval_data,
                          (long long)hp_data_row_len(t->eval), a->data, (long long)t->S);
    if (t->m->cfg.vocab_size <= 0)
        return hp_err_set(err, HP_ERR_INPUT, "%s: the model's config gives no vocab_size; --data checks every token "
                          "against it", a->model);
    int64_t dp = hp_mesh_size(&t->p->mesh, "dp"), gb = a->global_batch, mb_rows = a->micro_batch;
    if (gb < dp)
        return hp_err_set(err, HP_ERR_INPUT, "--global-batch %lld is fewer windows than the dp=%lld replicas; every "
                          "replica needs at least one: give a global batch of at least %lld, or a smaller dp",
                          (long long)gb, (long long)dp, (long long)dp);
    /* --micro-batch is rows per replica (as cost's and Megatron's): a micro-step takes MB x dp windows */
    if (mb_rows && (mb_rows > gb / dp || gb % (mb_rows * dp)))
        return hp_err_set(err, HP_ERR_INPUT, "--micro-batch %lld rows per replica x dp=%lld = %lld windows a "
                          "micro-step, which does not divide --global-batch %lld; give a --micro-batch that divides "
                          "%lld%s", (long long)mb_rows, (long long)dp, (long long)(mb_rows * dp),
                          (long long)gb, (long long)(gb / dp), gb % dp ? " and a global batch dp divides" : "");
    t->mb = mb_rows ? mb_rows * dp : gb;
    t->B = t->mb;
    if (t->eval && hp_data_windows(t->eval) < dp)
        return hp_err_set(err, HP_ERR_INPUT, "--eval-data %s holds %lld window%s of --seq %lld, fewer than the dp=%lld "
                          "replicas; every replica evaluates at least one: give a longer eval file or a smaller dp",
                          a->eval_data, (long long)hp_data_windows(t->eval), hp_data_windows(t->eval) == 1 ? "" : "s",
                          (long long)a->seq, (long long)dp);
    return HP_OK;
}

/* Reads every token this run will read, checking each against the vocabulary (hp_data_rows, the read of the
 * run's own hp_data_batch and evaluation: the same messages): the training windows of steps k0 + 1 .. last (the
 * whole file when they cover it) and all of --eval-data, into the run's buffers ids [MB, S] and eval_ids
 * [eval_batch_max, S]. */
hp_status hp__trn_scan_data(hp_trainer *t, hp_err *err)
{
    int64_t W = hp_data_windows(t->data), gb = t->c.global_batch, vocab = t->m->cfg.vocab_size;
    hp_status st = HP_OK;
    if ((double)(t->last - t->k0) * (double)gb >= (double)W)
        for (int64_t w0 = 0; st == HP_OK && w0 < W; w0 += t->mb)
            st = hp_data_rows(t->data, w0, W - w0 < t->mb ? W - w0 : t->mb, vocab, t->ids, err);
    else /* the windows of positions k0·GB .. last·GB − 1 of the order, as hp_data_batch reads them */
        for (int64_t q = t->k0 * gb, w; st == HP_OK && q < t->last * gb; q++)
            if ((st = hp_data_window_at(t->data, &t->c.order, q, &w, err)) == HP_OK)
                st = hp_data_rows(t->data, w, 1, vocab, t->ids, err);
    int64_t We = t->eval ? hp_data_windows(t->eval) : 0;
    for (int64_t w0 = 0; st == HP_OK && w0 < We; w0 += hp__trn_eval_batch(We, w0, gb))
        st = hp_data_rows(t->eval, w0, hp__trn_eval_batch(We, w0, gb), vocab, t->eval_ids, err);
    return st;
}

/* The mean loss over every window of --eval-data in file order (hp__trn_eval_batch), forward only; each batch's
 * mean weighted by its rows (every row scores the same number of positions). Collective. */
hp_status hp__trn_evaluate(hp_trainer *t, double *mean, hp_err *err)
{
    int64_t W = hp_data_windows(t->eval), S = hp_data_row_len(t->eval);
    double sum = 0;
    hp_status st = HP_OK;
    for (int64_t w0 = 0; st == HP_OK && w0 < W;) {
        int64_t n = hp__trn_eval_batch(W, w0, t->c.global_batch);
        st = hp_data_rows(t->eval, w0, n, t->m->cfg.vocab_size, t->eval_ids, err);
        st = hp_comm_agree(t->w, st, err);
        hp_run_output out = {0};
        if (st == HP_OK) st = hp_runner_forward(t->r, t->eval_ids, n, S, &out, err);
        st = hp_comm_agree(t->w, st, err);
        sum += out.loss * (double)n;
        hp_run_output_free(&out);
        w0 += n;
    }
    *mean = sum / (double)W;
    return st;
}

/* ---- memory ---- */

/* A step (or an evaluation) this node cannot hold is refused before its batch is read or allocated: B x S tokens
 * forward and backward with the training state, and --eval-data's largest batch (eval_rows, 0: none) forward;
 * rank 0 also gathers every parameter whole in f32 for --grad-out (the gradients) and --out (the weights).
 * Collective; the verdict is agreed. */
hp_status hp__trn_memory_check(hp_trainer *t, int local_ranks, hp_err *err)
{
    const hp_train_config *a = &t->c;
    char what[PATH_MAX + 200];
    double gathered = (double)hp_model_num_params(t->m) * sizeof(float) * ((a->grad_out ? 1 : 0) + (a->out ? 1 : 0));
    snprintf(what, sizeof what, "train of %s on %s of %lld x %lld tokens", a->model,
             a->data ? "micro-batches" : "a batch", (long long)t->B, (long long)t->S);
    hp_status st = hp_cost_forward_fits(t->w, t->m, t->p, t->B, t->S, true, false, gathered, local_ranks, what,
                                a->data ? "give a smaller --micro-batch (each step still trains on --global-batch "
                                          "windows), a shorter --seq, or more ranks"
                                        : "give an --input of fewer rows or tokens, or more ranks", err);
    if (st == HP_OK && t->eval_rows > t->B) {
        snprintf(what, sizeof what, "train of %s evaluating --eval-data %s in batches of up to %lld x %lld tokens",
                 a->model, a->eval_data, (long long)t->eval_rows, (long long)t->S);
        st = hp_cost_forward_fits(t->w, t->m, t->p, t->eval_rows, t->S, false, false, gathered, local_ranks, what,
                          "give a smaller --global-batch (an evaluation's batches hold up to 2 x GB - 1 windows), a "
                          "shorter --seq, or more ranks", err);
    }
    return st;
}
