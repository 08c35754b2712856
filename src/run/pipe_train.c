/*
 * pipe_train.c — a training step across pipeline stages (docs/pipeline.md): each stage walks its schedule's list
 * (src/plan/schedule.c), a forward or a backward of one of its chunks on one micro-batch at a time.
 *
 * Between units (one operation, or a steady-state forward and backward pair) a stage exchanges, in one
 * hp_comm_exchange, the outputs of the unit it finished and the inputs of the unit it starts: the stream to the
 * next chunk's stage after a forward, the stream's gradient to the previous chunk's stage after a backward. Each
 * message is a status word, then (when the status is good) the payload; a stage that failed keeps walking its
 * list, sending bad statuses and taking what it is sent, so that no stage waits forever and every rank reaches
 * the agreement that ends the step.
 *
 * Micro-batch j's kept values (the layer inputs, and on the last stage the head's input, the logits and the
 * loss's statistics) live in slot j between its forward and its backward: a slot is swapped into the runner for
 * each of j's operations, and a chunk's kept values are freed when its backward ends.
 */
#include "run/train_int.h"

#include <stdlib.h>
#include <string.h>

/* What micro-batch j keeps between its forward and its backward. */
typedef struct pslot {
    hp__act *kept; /* [L + 1] */
    hp__act t, a;
    float *loss_mx;
    double *loss_se;
    int64_t loss_rows, loss_cap;
} pslot;

/* Exchanges slot p with the runner's own: the kept inputs, and for the last chunk's operations (head) also the
 * head's input, the logits and the loss's statistics (other chunks use the runner's module buffers as scratch). */
static void slot_swap(hp_runner *r, pslot *p, bool head)
{
    runner_scratch *c = &r->sc;
    hp__act *k = c->kept;
    c->kept = p->kept, p->kept = k;
    if (!head) return;
    hp__act t = c->t, a = c->a;
    float *mx = c->loss_mx;
    double *se = c->loss_se;
    int64_t rows = c->loss_rows, cap = c->loss_cap;
    c->t = p->t, c->a = p->a, c->loss_mx = p->loss_mx, c->loss_se = p->loss_se;
    c->loss_rows = p->loss_rows, c->loss_cap = p->loss_cap;
    p->t = t, p->a = a, p->loss_mx = mx, p->loss_se = se, p->loss_rows = rows, p->loss_cap = cap;
}

typedef struct pstep {
    hp_runner *r;
    const int64_t *ids;
    const uint8_t *mask;  /* [m][B, S] parallel to ids, or NULL */
    int64_t m, B, S, C, L, max_rows, block; /* block: the stream's local floats */
    size_t *lo, *hi;      /* [C] each chunk's steps */
    pslot *slots;         /* [m] */
    double *losses;       /* [m] */
    hp__pipe_msg out[2], in[2]; /* [0] the forward's stream, [1] the backward's gradient */
    uint64_t saved, saved_peak;
    double fwd_s, bwd_s;  /* the operations' wall time (the exchanges' is the statistics' comm_s) */
} pstep;

/* Tag pairs (status, payload) per message: the direction, the chunk boundary and the micro-batch. */
static int tag_of(const pstep *p, bool bwd, int64_t boundary, int64_t mb)
{
    return (int)((((bwd ? p->C : 0) + boundary) * p->m + mb) % 16384) * 2;
}

static hp_status grow(pstep *p, hp__pipe_msg *g, hp_err *err)
{
    size_t want = (size_t)p->block * sizeof(float) + sizeof(float);
    g->bytes = (size_t)p->block * sizeof(float);
    if (g->cap >= want) return HP_OK;
    float *d = hp__mem_realloc(&p->r->x, g->d, g->cap, want);
    if (!d) return hp_err_set(err, HP_ERR_NOMEM, "out of memory for the pipeline's stream buffers");
    g->d = d, g->cap = want;
    return HP_OK;
}

/* The exchange between two units: the finished unit's outputs (out[]) and the next unit's inputs (in[]), all
 * posted at once (hp__pipe_exchange: a failed stage sends its buffer's stale contents behind a bad status). */
static hp_status exchange(pstep *p, hp_status st, hp_err *err)
{
    hp__pipe_msg *m[HP__PIPE_MSGS] = {&p->out[0], &p->in[0], &p->out[1], &p->in[1]};
    return hp__pipe_exchange(p->r, m, HP__PIPE_MSGS, st, err);
}

/* Marks op's input as expected in the next exchange. */
static hp_status want_input(pstep *p, const hp_pp_op *o, hp_err *err)
{
    bool bwd = o->bwd;
    if (bwd ? o->chunk + 1 >= p->C : o->chunk == 0) return HP_OK;
    hp__pipe_msg *g = &p->in[bwd];
    g->live = true;
    g->peer = hp__pipe_peer(p->r, (bwd ? o->chunk + 1 : o->chunk - 1) % p->r->pipe.pp);
    g->tag = tag_of(p, bwd, bwd ? o->chunk : o->chunk - 1, o->mb);
    return HP_OK;
}

/* Marks op's output (already in out[]) to be sent in the next exchange. */
static void give_output(pstep *p, const hp_pp_op *o)
{
    bool bwd = o->bwd;
    if (bwd ? o->chunk == 0 : o->chunk + 1 >= p->C) return;
    hp__pipe_msg *g = &p->out[bwd];
    g->live = true;
    g->peer = hp__pipe_peer(p->r, (bwd ? o->chunk - 1 : o->chunk + 1) % p->r->pipe.pp);
    g->tag = tag_of(p, bwd, bwd ? o->chunk - 1 : o->chunk, o->mb);
}

static uint64_t kept_bytes(const hp_runner *r)
{
    uint64_t b = 0;
    for (int64_t l = 0; l <= r->g.cfg.L; l++) b += (uint64_t)hp__act_count(&r->sc.kept[l]) * sizeof(float);
    return b;
}

/* Chunk c's forward of micro-batch j, its input (c > 0) in in[0], its output (c < C − 1) into out[0]. */
static hp_status op_forward(pstep *p, int64_t c, int64_t j, hp_err *err)
{
    hp_runner *r = p->r;
    const hp__prog *g = &r->g;
    hp__act *h = &r->sc.h;
    const int64_t *ids = p->ids + j * p->B * p->S;
    hp_status st = HP_OK;
    if (c > 0) {
        int64_t Bl = r->x.dp_rows[r->x.dp_r + 1] - r->x.dp_rows[r->x.dp_r];
        if ((st = hp__act_alloc(&r->x, h, Bl, r->x.S_pad, g->cfg.H, g->stream, err)) != HP_OK) return st;
        memcpy(h->d, p->in[0].d, (size_t)p->block * sizeof *h->d);
    }
    double t0 = hp_comm_wtime();
    bool head = c + 1 == p->C;
    slot_swap(r, &p->slots[j], head);
    uint64_t before = kept_bytes(r);
    hp__fio io = {.ids = ids, .mask = p->mask ? p->mask + j * p->B * p->S : NULL, .S = p->S, .h = h,
                  .t = &r->sc.t, .a = &r->sc.a, .max_rows = p->max_rows, .loss = &p->losses[j]};
    st = hp__r_steps(r, &io, p->lo[c], p->hi[c], err);
    p->saved += kept_bytes(r) - before;
    if (p->saved > p->saved_peak) p->saved_peak = p->saved;
    slot_swap(r, &p->slots[j], head);
    p->fwd_s += hp_comm_wtime() - t0;
    if (st == HP_OK && c + 1 < p->C) {
        if (hp__act_count(h) != p->block)
            return hp_err_set(err, HP_ERR_INPUT, "internal error: chunk %lld's output holds %lld floats, the stream's "
                              "block %lld", (long long)c, (long long)hp__act_count(h), (long long)p->block);
        memcpy(p->out[0].d, h->d, (size_t)p->block * sizeof *h->d);
    }
    return st;
}

/* Frees what chunk c of the swapped-in slot kept (its layers' inputs; on the last chunk the head's state too). */
static void release_chunk(pstep *p, int64_t c)
{
    hp_runner *r = p->r;
    for (size_t i = p->lo[c]; i < p->hi[c]; i++) {
        const hp__step *s = &r->g.steps[i];
        if (s->op != HP__OP_NORM || !s->keep) continue;
        hp__act *k = &r->sc.kept[s->layer >= 0 ? s->layer : p->L];
        p->saved -= (uint64_t)hp__act_count(k) * sizeof(float);
        hp__act_release(&r->x, k);
    }
    if (c + 1 < p->C) return;
    hp__act_release(&r->x, &r->sc.t);
    hp__act_release(&r->x, &r->sc.a);
    hp__mem_free(&r->x, r->sc.loss_mx, (size_t)r->sc.loss_cap * sizeof *r->sc.loss_mx);
    hp__mem_free(&r->x, r->sc.loss_se, (size_t)r->sc.loss_cap * sizeof *r->sc.loss_se);
    r->sc.loss_mx = NULL, r->sc.loss_se = NULL;
    r->sc.loss_cap = r->sc.loss_rows = 0;
}

/* Chunk c's backward of micro-batch j: from the loss (the last chunk) or the stream's gradient in in[1]; the
 * gradient of its input stream (c > 0) into out[1]. */
static hp_status op_backward(pstep *p, int64_t c, int64_t j, hp_err *err)
{
    hp_runner *r = p->r;
    hp__train *t = r->train;
    const hp__prog *g = &r->g;
    hp_status st = HP_OK;
    t->dh_live = c + 1 < p->C;
    if (t->dh_live) {
        int64_t Bl = r->x.dp_rows[r->x.dp_r + 1] - r->x.dp_rows[r->x.dp_r];
        if ((st = hp__act_alloc(&r->x, &t->dh, Bl, r->x.S_pad, g->cfg.H, g->stream, err)) != HP_OK) return st;
        memcpy(t->dh.d, p->in[1].d, (size_t)p->block * sizeof *t->dh.d);
    }
    double t0 = hp_comm_wtime();
    bool head = c + 1 == p->C;
    slot_swap(r, &p->slots[j], head);
    r->tr.quiet = true;
    st = hp__backward_steps(r, p->ids + j * p->B * p->S, p->mask ? p->mask + j * p->B * p->S : NULL, p->S, p->lo[c],
                            p->hi[c], err);
    r->tr.quiet = false;
    release_chunk(p, c);
    slot_swap(r, &p->slots[j], head);
    p->bwd_s += hp_comm_wtime() - t0;
    if (st == HP_OK && c > 0) {
        if (hp__act_count(&t->dh) != p->block)
            return hp_err_set(err, HP_ERR_INPUT, "internal error: chunk %lld's input gradient holds %lld floats, the "
                              "stream's block %lld", (long long)c, (long long)hp__act_count(&t->dh), (long long)p->block);
        memcpy(p->out[1].d, t->dh.d, (size_t)p->block * sizeof *t->dh.d);
    }
    return st;
}

/* The stage's list, unit by unit; st the stage's status so far (agreed within the stage after each operation, so
 * its ranks stay in step). */
static hp_status walk(pstep *p, const hp_pp_op *ops, int64_t n, hp_err *err)
{
    hp_runner *r = p->r;
    hp_status st = HP_OK;
    for (int64_t i = 0; i < n;) {
        int64_t e = i + 1; /* the unit [i, e) */
        while (e < n && ops[e].joined) e++;
        for (int64_t k = i; k < e; k++) {
            hp_status ws = want_input(p, &ops[k], err);
            if (st == HP_OK) st = ws;
        }
        st = exchange(p, st, err);
        for (int64_t k = i; k < e; k++) {
            if (st == HP_OK)
                st = ops[k].bwd ? op_backward(p, ops[k].chunk, ops[k].mb, err) : op_forward(p, ops[k].chunk, ops[k].mb, err);
            st = hp_comm_agree(r->x.world, st, err);
            give_output(p, &ops[k]);
        }
        i = e;
    }
    return exchange(p, st, err); /* the last unit's outputs */
}

static hp_status step_run(pstep *p, hp_pp_sched k, hp_err *err)
{
    hp_runner *r = p->r;
    const hp_pipeline *q = &r->p->pipe;
    int64_t n = 2 * q->virt * p->m;
    hp_pp_op *ops = malloc((size_t)n * sizeof *ops);
    if (!ops) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    hp_pp_sched_ops(q, k, p->m, r->pipe.stage, ops);
    hp_status st = walk(p, ops, n, err);
    free(ops);
    return st;
}

/* Each chunk's steps [lo, hi), the slots, the stream's block. */
static hp_status step_init(pstep *p, hp_err *err)
{
    hp_runner *r = p->r;
    const hp__prog *g = &r->g;
    p->lo = calloc((size_t)p->C, sizeof *p->lo);
    p->hi = calloc((size_t)p->C, sizeof *p->hi);
    p->slots = calloc((size_t)p->m, sizeof *p->slots);
    if (!p->lo || !p->hi || !p->slots) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    size_t i = 0;
    for (int64_t c = 0; c < p->C; c++) {
        p->lo[c] = i;
        while (i < g->n_steps && g->steps[i].chunk == c) i++;
        p->hi[c] = i;
    }
    for (int64_t j = 0; j < p->m; j++)
        if (!(p->slots[j].kept = calloc((size_t)p->L + 1, sizeof *p->slots[j].kept)))
            return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    p->block = hp__pipe_block(r);
    hp_status st = HP_OK; /* the four stream buffers, before any exchange: a failure is agreed, nothing sent */
    for (int k = 0; k < 2 && st == HP_OK; k++) {
        p->out[k].send = true, p->in[k].send = false;
        if ((st = grow(p, &p->out[k], err)) == HP_OK) st = grow(p, &p->in[k], err);
    }
    return st;
}

/* Everything the step allocated, uncounted (a slot a failed step left holds kept values still). */
static void step_free(pstep *p)
{
    hp_runner *r = p->r;
    for (int64_t j = 0; p->slots && j < p->m; j++) {
        if (!p->slots[j].kept) continue;
        slot_swap(r, &p->slots[j], true);
        for (int64_t c = 0; c < p->C; c++) release_chunk(p, c);
        slot_swap(r, &p->slots[j], true);
        free(p->slots[j].kept);
    }
    for (int k = 0; k < 2; k++) {
        hp__mem_free(&r->x, p->out[k].d, p->out[k].cap);
        hp__mem_free(&r->x, p->in[k].d, p->in[k].cap);
    }
    free(p->slots), free(p->lo), free(p->hi);
}

hp_status hp_runner_accumulate_pipe(hp_runner *r, const int64_t *ids, const uint8_t *mask, int64_t m, int64_t B,
                                    int64_t S, int64_t n_scored, hp_pp_sched sched, double *losses, hp_err *err)
{
    if (n_scored <= 0) n_scored = hp__r_scored(mask, m * B, S); /* the whole step's */
    if (r->pipe.pp == 1) { /* no pipeline: the micro-batches in turn */
        hp_status st = HP_OK;
        for (int64_t j = 0; j < m && st == HP_OK; j++)
            st = hp_runner_accumulate_masked(r, ids + j * B * S, mask ? mask + j * B * S : NULL, B, S, n_scored,
                                             &losses[j], err);
        return st;
    }
    hp_status st = hp_comm_agree(r->pipe.all, hp_pp_sched_check(&r->p->pipe, sched, m, err), err);
    if (st == HP_OK) st = hp__train_begin(r, err);
    if (st != HP_OK) return st;
    hp__train *t = r->train;
    pstep p = {.r = r, .ids = ids, .mask = mask, .m = m, .B = B, .S = S, .C = r->p->pipe.n_chunks, .L = r->g.cfg.L,
               .losses = losses};
    memset(losses, 0, (size_t)m * sizeof *losses);
    st = hp__r_begin(r, ids, m, B, S, &p.max_rows, err);
    t->scored = n_scored;
    if (st == HP_OK) st = step_init(&p, err);
    st = hp_comm_agree(r->pipe.all, st, err);
    if (st == HP_OK) st = step_run(&p, sched, err);
    step_free(&p);
    st = hp_comm_agree(r->pipe.all, st, err);
    /* the losses are the last stage's */
    if (st == HP_OK)
        st = hp_comm_bcast(r->pipe.all, losses, (size_t)m * sizeof *losses, hp__pipe_first(r, r->pipe.pp - 1), err);
    r->tr.stats.train_saved_bytes = p.saved_peak;
    r->tr.stats.p2p_bytes = r->x.st.p2p_bytes, r->tr.stats.p2p_calls = r->x.st.p2p_calls;
    return hp__train_end(r, st, m, p.fwd_s, p.bwd_s, r->x.st.comm_s, err);
}
