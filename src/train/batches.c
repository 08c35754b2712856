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
#include <stdlib.h>
#include <string.h>

#include "trainer.h"
#include "hyperpar/cost.h"
#include "hyperpar/tokenizer.h"

/* The rows of --eval-data's batch at window w0 of W (the remainder joined to the batch before it, so no batch
 * has fewer rows than dp replicas unless the file does). */
int64_t hp__trn_eval_batch(int64_t W, int64_t w0, int64_t gb) { return W - w0 < 2 * gb ? W - w0 : gb; }
/* The largest of them: min(W, 2·GB − 1). */
int64_t hp__trn_eval_batch_max(int64_t W, int64_t gb) { return W < 2 * gb - 1 ? W : 2 * gb - 1; }

/* One --text file (opt: "--text" or "--eval-data") tokenized into an in-memory source *d; the training text's
 * token stream (its ids, then its mask) is the run's data identity (t->data_sum, t->data_bytes). */
static hp_status open_text(hp_trainer *t, hp_tok *tok, const char *opt, const char *path, hp_data **d, hp_err *err)
{
    const hp_train_config *a = &t->c;
    hp_text_tokens tt;
    hp_status st = hp_data_text(tok, path, a->loss_mask, &tt, err);
    if (st != HP_OK) return st;
    char label[PATH_MAX + 32];
    snprintf(label, sizeof label, "%s %s", opt, path);
    st = hp_data_open_ids(d, label, tt.ids, tt.mask, tt.n, a->seq, err);
    if (st == HP_OK && !strcmp(opt, "--text")) {
        hp_hash64 h;
        hp_hash64_init(&h, 0);
        hp_hash64_update(&h, tt.ids, (size_t)tt.n * sizeof *tt.ids);
        if (tt.mask) hp_hash64_update(&h, tt.mask, (size_t)tt.n);
        snprintf(t->data_sum, sizeof t->data_sum, "%016llx", (unsigned long long)hp_hash64_final(&h));
        t->data_bytes = (uint64_t)tt.n * (sizeof *tt.ids + (tt.mask ? 1 : 0));
    }
    if (st == HP_OK && t->root) {
        char marked[96] = "";
        if (tt.mask) snprintf(marked, sizeof marked, " (%lld of them the assistant's, counted in the loss)",
                              (long long)tt.n_marked);
        hp__trn_note(t, "%s: %lld document%s, %lld tokens with EOS after each%s", label, (long long)tt.n_docs,
                     tt.n_docs == 1 ? "" : "s", (long long)tt.n, marked);
    }
    if (st == HP_OK && tt.n_dropped)
        hp__trn_warn(t, "%s: %lld byte%s without a token in the tokenizer (the first 0x%02X) left out, as Hugging Face "
                     "tokenizers leaves them out", label, (long long)tt.n_dropped, tt.n_dropped == 1 ? "" : "s",
                     (unsigned)tt.first_dropped);
    hp_text_tokens_free(&tt);
    return st;
}

/* --text and, read the same way, its --eval-data, with the tokenizer (--tokenizer, else the model's folder). */
static hp_status open_texts(hp_trainer *t, hp_err *err)
{
    const hp_train_config *a = &t->c;
    hp_tok *tok = NULL;
    hp_status st = hp_tok_load(a->tokenizer ? a->tokenizer : a->model, &tok, err);
    if (st == HP_ERR_INPUT && !a->tokenizer) {
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        hp_err_set(err, st, "--text is tokenized with the model's tokenizer: %s; give --tokenizer PATH to name one",
                   msg);
    }
    if (st == HP_OK) st = open_text(t, tok, "--text", a->text, &t->data, err);
    if (st == HP_OK && a->eval_data) st = open_text(t, tok, "--eval-data", a->eval_data, &t->eval, err);
    hp_tok_free(tok);
    return st;
}

/* --text's token stream is the same on every rank (each tokenized it): rank 0's hash against this rank's.
 * Collective; agreed. */
hp_status hp__trn_same_text(hp_trainer *t, hp_err *err)
{
    char sum[sizeof t->data_sum];
    memcpy(sum, t->data_sum, sizeof sum);
    hp_status st = hp_comm_bcast(t->w, sum, sizeof sum, 0, err);
    if (st == HP_OK && memcmp(sum, t->data_sum, sizeof sum))
        st = hp_err_set(err, HP_ERR_INPUT, "rank %d tokenized --text %s into another token stream than rank 0's "
                        "(XXH64 %s there, %s here): give every rank the same file and tokenizer",
                        hp_comm_rank(t->w), t->c.text, sum, t->data_sum);
    return hp_comm_agree(t->w, st, err);
}

/* Opens the training data (and the eval data) on every rank, reading their headers only, and checks what the
 * plan needs of them before step 1: rows of one length, a vocabulary to check tokens against, and as many rows
 * as dp replicas in every micro-batch and every --eval-data batch. t->B: rows a micro-batch, t->S: ids a row. */
hp_status hp__trn_open_data(hp_trainer *t, hp_err *err)
{
    const hp_train_config *a = &t->c;
    hp_status st = a->text ? open_texts(t, err) : hp_data_open(&t->data, a->data, a->dtype, a->seq, err);
    if (st == HP_OK && a->eval_data && !a->text) st = hp_data_open(&t->eval, a->eval_data, a->dtype, a->seq, err);
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

/* With a mask (--loss-mask): every step k0 + 1 .. last must score a target, and so must --eval-data, else its
 * loss is a mean over nothing. */
static hp_status scan_masked(hp_trainer *t, hp_err *err)
{
    int64_t gb = t->c.global_batch, n = 0;
    hp_status st = HP_OK;
    for (int64_t q = t->k0 * gb, w; st == HP_OK && q < t->last * gb; q++) {
        if ((st = hp_data_window_at(t->data, &t->c.order, q, &w, err)) != HP_OK) break;
        n += hp_data_window_scored(t->data, w);
        if ((q + 1) % gb == 0 && n == 0)
            st = hp_err_set(err, HP_ERR_INPUT, "--loss-mask: step %lld's %lld windows of --text %s hold no assistant "
                            "token, so its loss would be a mean over nothing; give conversations with more assistant "
                            "replies, or a larger --global-batch", (long long)((q + 1) / gb), (long long)gb,
                            t->c.text);
        if ((q + 1) % gb == 0) n = 0;
    }
    int64_t We = t->eval ? hp_data_windows(t->eval) : 0;
    for (int64_t w = 0; st == HP_OK && w < We; w++) n += hp_data_window_scored(t->eval, w);
    if (st == HP_OK && t->eval && n == 0)
        st = hp_err_set(err, HP_ERR_INPUT, "--loss-mask: the windows of --eval-data %s hold no assistant token to "
                        "evaluate", t->c.eval_data);
    return st;
}

/* Reads every token this run will read, checking each against the vocabulary (hp_data_rows, the read of the
 * run's own hp_data_batch and evaluation: the same messages): the training windows of steps k0 + 1 .. last (the
 * whole file when they cover it) and all of --eval-data, into the run's buffers ids [MB, S] and eval_ids
 * [eval_batch_max, S]. */
hp_status hp__trn_scan_data(hp_trainer *t, hp_err *err)
{
    int64_t W = hp_data_windows(t->data), gb = t->c.global_batch, vocab = t->m->cfg.vocab_size;
    hp_status st = hp_data_masked(t->data) ? scan_masked(t, err) : HP_OK;
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
 * mean weighted by its rows (every row scores the same number of positions), or with a mask by the targets it
 * marks (the mean over every marked target). Collective. */
hp_status hp__trn_evaluate(hp_trainer *t, double *mean, hp_err *err)
{
    int64_t W = hp_data_windows(t->eval), S = hp_data_row_len(t->eval);
    bool masked = hp_data_masked(t->eval);
    double sum = 0, total = 0;
    hp_status st = HP_OK;
    for (int64_t w0 = 0; st == HP_OK && w0 < W;) {
        int64_t n = hp__trn_eval_batch(W, w0, t->c.global_batch), scored = 0;
        st = hp_data_rows(t->eval, w0, n, t->m->cfg.vocab_size, t->eval_ids, err);
        for (int64_t r = 0; masked && r < n; r++) {
            hp_data_window_mask(t->eval, w0 + r, t->eval_mask + r * S);
            scored += hp_data_window_scored(t->eval, w0 + r);
        }
        st = hp_comm_agree(t->w, st, err);
        hp_run_output out = {0};
        if (st == HP_OK) st = hp_runner_forward_masked(t->r, t->eval_ids, t->eval_mask, n, S, &out, err);
        st = hp_comm_agree(t->w, st, err);
        if (!masked) sum += out.loss * (double)n;
        else if (scored > 0) sum += out.loss * (double)scored, total += (double)scored;
        hp_run_output_free(&out);
        w0 += n;
    }
    *mean = sum / (masked ? total : (double)W);
    return st;
}

/* Step k + 1's micro-batches into t->ids (and, with a mask, t->mask): global batch k's rows j·MB .. (j+1)·MB − 1
 * for j < n_micro; scored[j] the targets micro-batch j scores and *n_scored the step's (with a mask, those it
 * marks). */
hp_status hp__trn_batch(hp_trainer *t, int64_t k, int64_t n_micro, int64_t *scored, int64_t *n_scored, hp_err *err)
{
    const hp_train_config *a = &t->c;
    int64_t rows = t->mb, S = t->S;
    bool masked = hp_data_masked(t->data);
    hp_status st = HP_OK;
    *n_scored = 0;
    for (int64_t j = 0; st == HP_OK && j < n_micro; j++) {
        st = hp_data_batch(t->data, &a->order, k, j * rows, rows, t->m->cfg.vocab_size, t->ids + j * rows * S, err);
        scored[j] = masked ? 0 : rows * (S - 1);
        for (int64_t r = 0, w; st == HP_OK && masked && r < rows; r++) {
            if ((st = hp_data_window_at(t->data, &a->order, k * a->global_batch + j * rows + r, &w, err)) != HP_OK)
                break;
            hp_data_window_mask(t->data, w, t->mask + (j * rows + r) * S);
            scored[j] += hp_data_window_scored(t->data, w);
        }
        *n_scored += scored[j];
    }
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
             t->data ? "micro-batches" : "a batch", (long long)t->B, (long long)t->S);
    hp_status st = hp_cost_forward_fits(t->w, t->m, t->p, t->B, t->S, true, false, gathered, local_ranks, what,
                                t->data ? "give a smaller --micro-batch (each step still trains on --global-batch "
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
