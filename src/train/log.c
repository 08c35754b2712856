/*
 * log.c — --log-json of a training run (rank 0): one JSON object a line and step (loop.c writes them). A new run's
 * log is a new file (another run's is never overwritten, but with --force); a resumed run continues its own log:
 * the lines of steps 1..k0 kept (those after the checkpoint were of steps it takes again), every line of this run
 * (its run_id, when it has one) and none missing.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "trainer.h"

void hp__trn_log_prev_free(hp__trn_log_prev *l)
{
    free(l->kept), free(l->loss), free(l->norm), free(l->eval);
    memset(l, 0, sizeof *l);
}

/* Line `no` of the resumed run's log, object o of step t (<= k0, the next one), kept: its text into k and its
 * figures into prev. */
static hp_status keep_line(hp__trn_log_prev *prev, FILE *k, const char *line, size_t len, json_t *o, hp_err *err)
{
    int64_t want = prev->n + 1;
    fwrite(line, 1, len, k);
    if (line[len - 1] != '\n') fputc('\n', k);
    double *l3[3];
    for (int i = 0; i < 3; i++) {
        double **arr = i == 0 ? &prev->loss : i == 1 ? &prev->norm : &prev->eval;
        l3[i] = realloc(*arr, (size_t)want * sizeof **arr);
        if (l3[i]) *arr = l3[i];
    }
    if (!l3[0] || !l3[1] || !l3[2]) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    json_t *ev = json_object_get(o, "eval_loss");
    prev->loss[want - 1] = json_number_value(json_object_get(o, "loss"));
    prev->norm[want - 1] = json_number_value(json_object_get(o, "grad_norm"));
    prev->eval[want - 1] = json_is_number(ev) ? json_number_value(ev) : NAN;
    prev->n = want;
    return HP_OK;
}

/* The log's file before the run: absent or empty (a new log), another run's (refused unless --force), or with
 * --resume this run's own, read into t->prev (steps 1..k0, checked). Rank 0. */
hp_status hp__trn_log_check(hp_trainer *t, hp_err *err)
{
    const hp_train_config *a = &t->c;
    hp__trn_log_prev *prev = &t->prev;
    memset(prev, 0, sizeof *prev);
    struct stat sb;
    if (stat(a->log_json, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size == 0) return HP_OK; /* a new file */
    if (!a->resume && !a->force)
        return hp_err_set(err, HP_ERR_INPUT, "--log-json %s holds a log already (%lld bytes: another run's); name "
                          "another file, or pass --force to replace it", a->log_json, (long long)sb.st_size);
    if (!a->resume) return HP_OK;
    FILE *f = fopen(a->log_json, "r");
    if (!f) return hp_err_set(err, HP_ERR_IO, "--log-json %s: cannot read it (%s)", a->log_json, strerror(errno));
    FILE *k = open_memstream(&prev->kept, &prev->kept_len);
    hp_status st = k ? HP_OK : hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int64_t k0 = t->k0;
    for (int64_t no = 1; st == HP_OK && (len = getline(&line, &cap, f)) > 0; no++) {
        json_error_t je;
        json_t *o = json_loadb(line, (size_t)len, 0, &je), *js = json_object_get(o, "step");
        json_t *id = json_object_get(o, "run_id");
        int64_t step = json_is_integer(js) ? (int64_t)json_integer_value(js) : -1, want = prev->n + 1;
        if (!json_is_object(o) || step < 1)
            st = hp_err_set(err, HP_ERR_INPUT, "--log-json %s: line %lld is not a step's record; it is not this "
                            "run's log: name another file", a->log_json, (long long)no);
        else if (id && (!json_is_string(id) || strcmp(json_string_value(id), t->run_id)))
            st = hp_err_set(err, HP_ERR_INPUT, "--log-json %s: line %lld is of run %s, not of the run resumed (%s); "
                            "name another file", a->log_json, (long long)no,
                            json_is_string(id) ? json_string_value(id) : "?", t->run_id);
        else if (step <= k0 && step != want)
            st = hp_err_set(err, HP_ERR_INPUT, "--log-json %s: line %lld records step %lld where step %lld follows; "
                            "it is not this run's log (steps 1 to %lld): name another file", a->log_json,
                            (long long)no, (long long)step, (long long)want, (long long)k0);
        else if (step <= k0)
            st = keep_line(prev, k, line, (size_t)len, o, err);
        json_decref(o);
    }
    free(line);
    fclose(f);
    if (k) fclose(k);
    if (st == HP_OK && prev->n != k0)
        st = hp_err_set(err, HP_ERR_INPUT, "--log-json %s records steps 1 to %lld where the checkpoint resumed is at "
                        "step %lld: it is not this run's whole log; name another file", a->log_json,
                        (long long)prev->n, (long long)k0);
    if (st != HP_OK) hp__trn_log_prev_free(prev);
    return st;
}

/* Opens the log: a new file, or the resumed run's log rewritten to its kept lines (atomically), to append to. */
hp_status hp__trn_log_open(hp_trainer *t, hp_err *err)
{
    const hp_train_config *a = &t->c;
    const hp__trn_log_prev *prev = &t->prev;
    hp_status st = HP_OK;
    if (a->resume && prev->kept_len)
        st = hp_file_write_atomic(a->log_json, prev->kept, prev->kept_len, "the log", err);
    if (st == HP_OK && !(t->log = fopen(a->log_json, a->resume && prev->kept_len ? "a" : "w")))
        st = hp_err_set(err, HP_ERR_IO, "--log-json %s: cannot create it (%s)", a->log_json, strerror(errno));
    return st;
}
