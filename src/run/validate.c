/*
 * validate.c — the seed's validate mode: the plan run distributed and the model run in one process on the
 * same input, every boundary's output reassembled to the full layout and compared, the first boundary that
 * diverges named. Recording happens on rank 0 (hp_run_opts.record); under a pipeline on each stage's first rank,
 * each recording its own layers, whose tapes then go to world rank 0 (relay_tapes). The tapes are matched by
 * name (the stages record in their own order) and reported in the one-process order; the one-process run is
 * rank 0's alone.
 * With the backward (hp_validate_backward) the same is done for one training step: the forward's boundaries, then
 * in the backward's order each module's input gradient and the residual stream's, then every parameter's
 * gradient, gathered whole on rank 0 in the program's order.
 */
#include "hyperpar/run.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct rec {
    char what[128], coll[96];
    float *t;
    int64_t n;
} rec;

typedef struct tape {
    rec *v;
    int n, cap;
    bool oom;
} tape;

/* Appends a record of n values (a failure marks the tape oom: its caller reports it). */
static void tape_add(tape *tp, const char *what, const char *coll, const float *t, int64_t n)
{
    if (tp->oom) return;
    if (tp->n == tp->cap) {
        int cap = tp->cap ? 2 * tp->cap : 64;
        rec *v = realloc(tp->v, (size_t)cap * sizeof *v);
        if (!v) {
            tp->oom = true;
            return;
        }
        tp->v = v;
        tp->cap = cap;
    }
    rec *r = &tp->v[tp->n];
    memset(r, 0, sizeof *r);
    snprintf(r->what, sizeof r->what, "%s", what);
    snprintf(r->coll, sizeof r->coll, "%s", coll);
    r->n = n;
    if (!(r->t = malloc((size_t)r->n * sizeof *r->t + 1))) {
        tp->oom = true;
        return;
    }
    memcpy(r->t, t, (size_t)r->n * sizeof *r->t);
    tp->n++;
}

static void on_record(void *ctx, const char *what, const char *coll, const float *t, int64_t B, int64_t S, int64_t X)
{
    tape_add(ctx, what, coll, t, B * S * X);
}

static void tape_free(tape *t)
{
    for (int i = 0; i < t->n; i++) free(t->v[i].t);
    free(t->v);
    memset(t, 0, sizeof *t);
}

static hp_status run_one(const hp_comm *c, const hp_model *m, const hp_plan *p, const hp_run_opts *o, tape *t,
                         const int64_t *ids, int64_t B, int64_t S, double *loss, hp_run_stats *stats, hp_err *err)
{
    hp_run_opts ro = *o;
    ro.record = on_record;
    ro.record_ctx = t;
    hp_runner *r = NULL;
    hp_run_output out = {0};
    hp_status st = hp_runner_create(&r, c, m, p, &ro, err);
    if (st == HP_OK) st = hp_runner_forward(r, ids, B, S, &out, err);
    if (st == HP_OK && t->oom) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory recording the boundaries");
    if (st == HP_OK && stats) *stats = *hp_runner_stats(r);
    *loss = out.loss;
    hp_run_output_free(&out);
    hp_runner_free(r);
    return st;
}

/* The index in dist of one's record i: the record of the same name and the same occurrence of that name (a
 * pipeline's stages record their own layers, in their own order: the tapes match by name, not by position), or -1. */
static int counterpart(const tape *dist, const tape *one, int i)
{
    int k = 0;
    for (int j = 0; j < i; j++) k += !strcmp(one->v[j].what, one->v[i].what);
    for (int j = 0; j < dist->n; j++)
        if (!strcmp(dist->v[j].what, one->v[i].what) && k-- == 0) return j;
    return -1;
}

/* Rank 0: the distributed tape against the one-process one, in the one-process order (rep->rows,
 * rep->first_bad). */
static hp_status compare_tapes(const tape *dist_t, const tape *one_t, double rtol, hp_validate_report *rep, hp_err *err)
{
    const tape dist = *dist_t, one = *one_t;
    hp_status st = HP_OK;
    if (st == HP_OK && one.n != dist.n)
        st = hp_err_set(err, HP_ERR_INPUT, "the distributed run recorded %d boundaries, one process %d", dist.n,
                        one.n);
    if (st == HP_OK && !(rep->rows = calloc((size_t)one.n + 1, sizeof *rep->rows)))
        st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    for (int i = 0; st == HP_OK && i < one.n; i++) {
        hp_validate_row *row = &rep->rows[i];
        int j = counterpart(&dist, &one, i);
        if (j < 0) {
            st = hp_err_set(err, HP_ERR_INPUT, "%s is recorded in one process but not in the distributed run",
                            one.v[i].what);
            break;
        }
        if (dist.v[j].n != one.v[i].n) {
            st = hp_err_set(err, HP_ERR_INPUT, "%s holds %lld values distributed but %lld in one process",
                            one.v[i].what, (long long)dist.v[j].n, (long long)one.v[i].n);
            break;
        }
        snprintf(row->what, sizeof row->what, "%s", dist.v[j].what);
        snprintf(row->coll, sizeof row->coll, "%s", dist.v[j].coll);
        hp_tol t;
        int64_t shape[1] = {one.v[i].n};
        row->ok = hp_tol_check(dist.v[j].t, one.v[i].t, 1, shape, rtol, &t);
        row->max_diff = t.max_diff;
        row->max_ref = t.max_ref;
        if (!row->ok && rep->first_bad < 0) rep->first_bad = i;
        rep->n = i + 1;
    }
    return st;
}

/* ---- a pipeline's tape: each stage records its own layers on its first rank; world rank 0 gathers them ---- */

/* One record on the wire: its names and length, then its values. */
typedef struct wire_rec {
    char what[128], coll[96];
    int64_t n;
} wire_rec;

/* The tape as one buffer (*buf malloc'd, *bytes long). */
static bool tape_pack(const tape *t, char **buf, uint64_t *bytes)
{
    uint64_t b = 0;
    for (int i = 0; i < t->n; i++) b += sizeof(wire_rec) + (uint64_t)t->v[i].n * sizeof(float);
    char *p = *buf = malloc(b + 1);
    if (!p) return false;
    for (int i = 0; i < t->n; i++) {
        wire_rec w;
        memset(&w, 0, sizeof w);
        memcpy(w.what, t->v[i].what, sizeof w.what);
        memcpy(w.coll, t->v[i].coll, sizeof w.coll);
        w.n = t->v[i].n;
        memcpy(p, &w, sizeof w);
        memcpy(p + sizeof w, t->v[i].t, (size_t)w.n * sizeof(float));
        p += sizeof w + (size_t)w.n * sizeof(float);
    }
    *bytes = b;
    return true;
}

/* Appends the records of a packed tape (from a rank of ours: its lengths are its own records'). */
static void tape_unpack(tape *t, const char *buf, uint64_t bytes)
{
    for (uint64_t off = 0; off + sizeof(wire_rec) <= bytes;) {
        wire_rec w;
        memcpy(&w, buf + off, sizeof w);
        w.what[sizeof w.what - 1] = w.coll[sizeof w.coll - 1] = '\0';
        off += sizeof w;
        if (w.n < 0 || (uint64_t)w.n > (bytes - off) / sizeof(float)) break;
        float *v = malloc((size_t)w.n * sizeof *v + 1);
        if (!v) {
            t->oom = true;
            return;
        }
        memcpy(v, buf + off, (size_t)w.n * sizeof *v);
        tape_add(t, w.what, w.coll, v, w.n);
        free(v);
        off += (uint64_t)w.n * sizeof(float);
    }
}

/* Under a pipeline (pp > 1) every stage's first rank sends its tape to world rank 0, stage by stage, which appends
 * it to its own (its stage's and, with the backward, every parameter's gradient: hp_runner_gather_params relays
 * them there). Each tape goes as its length (UINT64_MAX: the sender could not pack it), then its bytes. Collective. */
static hp_status relay_tapes(const hp_comm *world, const hp_plan *p, tape *t, hp_err *err)
{
    int64_t pp = p->pipe.pp > 1 ? p->pipe.pp : 1;
    int per = hp_comm_size(world) / (int)pp, me = hp_comm_rank(world);
    hp_status st = HP_OK;
    for (int64_t s = 1; s < pp; s++) {
        int from = (int)s * per;
        hp_status ss = HP_OK;
        uint64_t bytes = 0;
        char *buf = NULL;
        if (me == from) {
            if (t->oom || !tape_pack(t, &buf, &bytes)) bytes = UINT64_MAX;
            ss = hp_comm_send(world, 0, &bytes, sizeof bytes, 3, err);
            if (ss == HP_OK && bytes != UINT64_MAX) ss = hp_comm_send(world, 0, buf, bytes, 4, err);
            if (ss == HP_OK && bytes == UINT64_MAX)
                ss = hp_err_set(err, HP_ERR_NOMEM, "out of memory recording the boundaries of stage %lld",
                                (long long)s);
        } else if (me == 0) {
            ss = hp_comm_recv(world, from, &bytes, sizeof bytes, 3, err);
            if (ss == HP_OK && bytes == UINT64_MAX)
                ss = hp_err_set(err, HP_ERR_NOMEM, "stage %lld could not send its recorded boundaries (out of "
                                "memory on rank %d)", (long long)s, from);
            else if (ss == HP_OK) {
                hp_comm_msg m = {from, false, buf = malloc(bytes + 1), bytes, 4}; /* NULL: taken and dropped */
                ss = hp_comm_exchange(world, &m, 1, err);
                if (ss == HP_OK && buf) tape_unpack(t, buf, bytes);
                if (ss == HP_OK && (!buf || t->oom))
                    ss = hp_err_set(err, HP_ERR_NOMEM, "out of memory gathering the boundaries of stage %lld",
                                    (long long)s);
            }
        }
        free(buf);
        if (st == HP_OK) st = ss;
    }
    return hp_comm_agree(world, st, err);
}

/* One way of running the model that fills a tape (the forward's boundaries, or a training step's gradients). */
typedef hp_status (*tape_fn)(const hp_comm *c, const hp_model *m, const hp_plan *p, const hp_run_opts *o, tape *t,
                             const int64_t *ids, int64_t B, int64_t S, double *loss, hp_run_stats *stats, hp_err *err);

static hp_status on_param(void *ctx, const char *name, const float *d, const int64_t *shape, int n_dims, hp_err *err)
{
    int64_t n = 1;
    for (int i = 0; i < n_dims; i++) n *= shape[i];
    tape *t = ctx;
    on_record(ctx, name, "gradient", d, 1, 1, n);
    return t->oom ? hp_err_set(err, HP_ERR_NOMEM, "out of memory recording the gradients") : HP_OK;
}

/* One training step's gradients (no update) of plan p over c, every parameter gathered onto c's rank 0. */
static hp_status grads_of(const hp_comm *c, const hp_model *m, const hp_plan *p, const hp_run_opts *o, tape *t,
                          const int64_t *ids, int64_t B, int64_t S, double *loss, hp_run_stats *stats, hp_err *err)
{
    if (p->pipe.pp > 1 && p->pipe.virt > 1)
        return hp_err_set(err, HP_ERR_INPUT, "validate --backward takes one training step of one micro-batch, which a "
                          "pipeline of %lld virtual stages per stage cannot schedule (the interleaved schedule sends "
                          "micro-batches round in groups of pp=%lld); validate --backward without --pp-virtual, or "
                          "the forward (without --backward) with it", (long long)p->pipe.virt, (long long)p->pipe.pp);
    hp_run_opts ro = *o;
    ro.keep_activations = true;
    ro.record = on_record; /* the forward's boundaries, then each boundary's input gradient in the backward */
    ro.record_ctx = t;
    hp_runner *r = NULL;
    hp_status st = hp_runner_create(&r, c, m, p, &ro, err);
    if (st == HP_OK) st = hp_runner_train_step(r, ids, B, S, NULL, loss, err);
    if (st == HP_OK && t->oom) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory recording the boundaries");
    st = hp_comm_agree(c, st, err); /* every rank reaches it: the gather's collectives follow */
    if (st == HP_OK) st = hp_runner_gather_params(r, true, on_param, t, err);
    if (st == HP_OK && stats) *stats = *hp_runner_stats(r);
    hp_runner_free(r);
    return st;
}

/* A capacity limit is applied by each rank to the rows it routes; the one-process reference applies it within the
 * same blocks of rows (hp_run_opts.moe_cap_block) or the comparison is not defined. Collective: every rank's rows
 * (hp_run_stats.moe_rows) and factor to every rank; *map ([B·S], malloc'd) on rank 0 when a block limited
 * capacity, *factor the factor (under a pipeline the ranks of a stage without sparse layers report none). */
static hp_status capacity_blocks(const hp_comm *world, const hp_run_stats *st, int64_t B, int64_t S, int32_t **map,
                                 double *factor, hp_err *err)
{
    int n = hp_comm_size(world);
    int64_t mine[7] = {st->moe_rows[0], st->moe_rows[1], st->moe_rows[2], st->moe_rows[3], st->moe_rows_vary,
                       st->moe_cap_factor > 0, 0};
    memcpy(&mine[6], &st->moe_cap_factor, sizeof(double));
    int64_t *all = malloc((size_t)n * sizeof mine);
    if (!all) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    hp_status s = hp_comm_allgather(world, mine, sizeof mine, all, err);
    bool cap = false, vary = false;
    *factor = 0;
    for (int i = 0; s == HP_OK && i < n; i++) {
        double f;
        memcpy(&f, &all[7 * i + 6], sizeof f);
        if (all[7 * i + 5] && *factor > 0 && f != *factor) vary = true; /* stages of other factors */
        if (all[7 * i + 5]) *factor = f;
        cap = cap || all[7 * i + 5], vary = vary || all[7 * i + 4];
    }
    if (s == HP_OK && cap && hp_comm_rank(world) == 0) {
        if (vary)
            s = hp_err_set(err, HP_ERR_INPUT, "the comparison is not defined: a capacity factor limits each rank's "
                           "slots among the rows it routes, and the sparse layers route different rows on one "
                           "rank, so one process cannot apply the same limit; validate a plan without "
                           "capacity_factor");
        if (s == HP_OK && !(*map = malloc((size_t)(B * S) * sizeof **map + 1)))
            s = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        for (int64_t k = 0; s == HP_OK && k < B * S; k++) (*map)[k] = -1;
        /* ranks routing the same rows (tp without SP) are one block; others must not overlap */
        for (int i = 0; s == HP_OK && i < n; i++) {
            const int64_t *q = all + 7 * i;
            int32_t id = i;
            for (int j = 0; j < i; j++)
                if (!memcmp(all + 7 * j, q, 4 * sizeof *q)) id = j;
            for (int64_t b = q[0]; s == HP_OK && b < q[0] + q[1]; b++)
                for (int64_t x = q[2]; s == HP_OK && x < q[2] + q[3]; x++) {
                    int32_t *c = &(*map)[b * S + x];
                    if (b >= B || x >= S || (*c >= 0 && *c != id))
                        s = hp_err_set(err, HP_ERR_INPUT, "the comparison is not defined: a capacity factor limits "
                                       "each rank's slots among the rows it routes, and rank %d routes row %lld, "
                                       "position %lld, which %s; validate a plan without capacity_factor", i,
                                       (long long)b, (long long)x, b >= B || x >= S ? "is padding (cp)"
                                                                                  : "another rank routes with other rows");
                    else *c = id;
                }
        }
        for (int64_t k = 0; s == HP_OK && k < B * S; k++)
            if ((*map)[k] < 0)
                s = hp_err_set(err, HP_ERR_INPUT, "the comparison is not defined: no rank routes row %lld, position "
                               "%lld through the sparse blocks", (long long)(k / S), (long long)(k % S));
    }
    free(all);
    return s;
}

/* run over world with plan p and, on rank 0, over one process with plan p1; the tapes compared there. */
static hp_status validate_with(tape_fn run, const hp_comm *world, const hp_model *m, const hp_plan *p,
                               const hp_plan *p1, const hp_run_opts *o, const int64_t *ids, int64_t B, int64_t S,
                               double rtol, hp_validate_report *rep, hp_err *err)
{
    memset(rep, 0, sizeof *rep);
    rep->first_bad = -1;
    tape dist = {0}, one = {0};
    int32_t *cap_map = NULL;
    hp_status st = hp_comm_agree(world, run(world, m, p, o, &dist, ids, B, S, &rep->loss, &rep->stats, err), err);
    if (st == HP_OK) st = relay_tapes(world, p, &dist, err);
    double cap_factor = 0;
    if (st == HP_OK) st = capacity_blocks(world, &rep->stats, B, S, &cap_map, &cap_factor, err);
    if (st == HP_OK && hp_comm_rank(world) == 0) {
        hp_comm *self = NULL;
        hp_run_opts o1 = *o;
        o1.shards = NULL; /* the one-process model reads the checkpoint whole */
        o1.moe_cap_block = cap_map;
        o1.moe_cap_factor = cap_factor;
        st = hp_comm_self(&self, err);
        if (st == HP_OK) st = run(self, m, p1, &o1, &one, ids, B, S, &rep->loss_ref, NULL, err);
        hp_comm_free(self);
        if (st == HP_OK) st = compare_tapes(&dist, &one, rtol, rep, err);
    }
    free(cap_map);
    tape_free(&dist);
    tape_free(&one);
    st = hp_comm_agree(world, st, err);
    if (st != HP_OK) hp_validate_report_free(rep);
    return st;
}

hp_status hp_validate(const hp_comm *world, const hp_model *m, const hp_plan *p, const hp_plan *p1,
                      const hp_run_opts *o, const int64_t *ids, int64_t B, int64_t S, double rtol,
                      hp_validate_report *rep, hp_err *err)
{
    return validate_with(run_one, world, m, p, p1, o, ids, B, S, rtol, rep, err);
}

hp_status hp_validate_backward(const hp_comm *world, const hp_model *m, const hp_plan *p, const hp_plan *p1,
                               const hp_run_opts *o, const int64_t *ids, int64_t B, int64_t S, double rtol,
                               hp_validate_report *rep, hp_err *err)
{
    return validate_with(grads_of, world, m, p, p1, o, ids, B, S, rtol, rep, err);
}

void hp_validate_report_free(hp_validate_report *rep)
{
    free(rep->rows);
    rep->rows = NULL;
    rep->n = 0;
}
