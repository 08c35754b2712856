/*
 * pipe.c — the transport between pipeline stages and the forward across them (docs/pipeline.md).
 *
 * The transport (hp__pipe_exchange) is one for run and train: every message is a status word (tag t) and the
 * payload (tag t + 1), a block of the residual stream or of its gradient in the stream's own layout (every rank
 * sends its local block, SP- and CP-local as the plan lays the stream out, f32) to or from the rank at the same
 * position of another stage (hp__pipe_peer). All of an exchange's messages are posted together and waited for
 * together (hp_comm_exchange). A stage that failed keeps going through its exchanges, sending bad statuses, so
 * that no stage waits forever and every rank reaches the agreement that ends the forward or the step.
 *
 * The forward: a stage runs its chunks of the program in chunk order; chunk c's input arrives from chunk c − 1's
 * stage, and its output goes to chunk c + 1's. The loss and the logits come from the last stage.
 */
#include "run/runner_int.h"

#include <stdlib.h>
#include <string.h>

int hp__pipe_peer(const hp_runner *r, int64_t stage)
{
    return (int)(stage * r->pipe.per + hp_comm_rank(r->x.world));
}

int hp__pipe_first(const hp_runner *r, int64_t stage)
{
    return (int)(stage * r->pipe.per);
}

hp_status hp__pipe_exchange(hp_runner *r, hp__pipe_msg *const *m, int n, hp_status st, hp_err *err)
{
    hp_comm_msg msg[2 * HP__PIPE_MSGS];
    int k = 0, live = 0;
    uint64_t bytes = 0;
    HP_ASSERT(n <= HP__PIPE_MSGS);
    for (int i = 0; i < n; i++) {
        hp__pipe_msg *g = m[i];
        if (!g->live) continue;
        if (g->send) g->ok = st == HP_OK;
        msg[k++] = (hp_comm_msg){g->peer, g->send, &g->ok, sizeof g->ok, g->tag};
        msg[k++] = (hp_comm_msg){g->peer, g->send, g->d, g->bytes, g->tag + 1};
        live++;
        bytes += g->bytes;
    }
    double t0 = hp_comm_wtime();
    hp_status es = hp_comm_exchange(r->pipe.all, msg, k, err);
    r->x.st.comm_s += hp_comm_wtime() - t0;
    if (es == HP_OK) r->x.st.p2p_bytes += bytes, r->x.st.p2p_calls += (uint64_t)live;
    if (st == HP_OK) st = es;
    for (int i = 0; i < n && st == HP_OK; i++)
        if (m[i]->live && !m[i]->send && !m[i]->ok)
            st = hp_err_set(err, HP_ERR_INPUT, "pipeline stage %lld (rank %d) failed; its error is reported by that "
                            "rank", (long long)(m[i]->peer / r->pipe.per), m[i]->peer);
    for (int i = 0; i < n; i++) m[i]->live = false;
    return st;
}

/* The rank's rows of its replica: the stream's first dimension. */
static int64_t replica_rows(const hp_runner *r)
{
    return r->x.dp_rows[r->x.dp_r + 1] - r->x.dp_rows[r->x.dp_r];
}

int64_t hp__pipe_block(const hp_runner *r)
{
    hp__act probe = {0};
    probe.g[0] = replica_rows(r), probe.g[1] = r->x.S_pad, probe.g[2] = r->g.cfg.H, probe.lay = r->g.stream;
    hp__act_shape(&r->x, &probe);
    return hp__act_count(&probe);
}

/* One transfer of the stream: chunk c's input, from the previous chunk's stage into h (send false), or this
 * stage's output h to chunk c's stage (send true). Each is posted alone: a forward's chunks run one after another,
 * so a sender's receiver has always posted, or will, before it waits for anything else. A stage that failed still
 * sends h's bytes behind its bad status (the block's whenever h holds them, so the receiver reports the failed
 * stage; a shorter message fails the receiver on its size, which ends it all the same) and receives into h, or
 * drops the bytes when h cannot hold them. */
static hp_status stream_xfer(hp_runner *r, hp__act *h, int64_t c, bool send, hp_status st, hp_err *err)
{
    int64_t block = hp__pipe_block(r);
    size_t bytes = (size_t)block * sizeof(float), have;
    hp__pipe_msg g = {.live = true, .send = send, .tag = (int)(c % 16384) * 2, .bytes = bytes};
    g.peer = hp__pipe_peer(r, (send ? c : c - 1) % r->pipe.pp);
    if (send) {
        if (st == HP_OK && hp__act_count(h) != block)
            st = hp_err_set(err, HP_ERR_INPUT, "internal error: chunk %lld's output holds %lld floats, the stream's "
                            "block %lld", (long long)(c - 1), (long long)hp__act_count(h), (long long)block);
        static float none; /* what a stage that failed before h held anything sends: no bytes */
        have = h->d ? h->cap * sizeof(float) : 0;
        g.d = h->d ? h->d : &none;
        if (have < bytes) g.bytes = have; /* a failed stage's (st is not HP_OK: the count above) */
    } else {
        hp_err quiet; /* a stage that failed keeps its first error */
        hp_status as = hp__act_alloc(&r->x, h, replica_rows(r), r->x.S_pad, r->g.cfg.H, r->g.stream,
                                     st == HP_OK ? err : &quiet);
        if (st == HP_OK) st = as;
        g.d = h->d && h->cap * sizeof(float) >= bytes ? h->d : NULL;
    }
    hp__pipe_msg *one[1] = {&g};
    return hp__pipe_exchange(r, one, 1, st, err);
}

hp_status hp__pipe_steps(hp_runner *r, hp__fio *io, hp_err *err)
{
    const hp__prog *g = &r->g;
    int64_t C = r->p->pipe.n_chunks, pp = r->pipe.pp;
    hp_status st = HP_OK;
    size_t i = 0;
    for (int64_t c = 0; c < C; c++) {
        size_t lo = i;
        while (i < g->n_steps && g->steps[i].chunk == c) i++;
        if (c % pp != r->pipe.stage) continue;
        if (c > 0) st = stream_xfer(r, io->h, c, false, st, err);
        if (st == HP_OK) st = hp__r_steps(r, io, lo, i, err);
        st = hp_comm_agree(r->x.world, st, err); /* the stage's ranks in step: one status for what they send */
        if (c + 1 < C) st = stream_xfer(r, io->h, c + 1, true, st, err);
    }
    return st;
}

hp_status hp__pipe_finish(hp_runner *r, hp_status st, int64_t B, float **logits, double *loss, hp_err *err)
{
    int64_t last = r->pipe.pp - 1;
    int root = hp__pipe_first(r, last), me = hp_comm_rank(r->pipe.all);
    st = hp_comm_agree(r->pipe.all, st, err);
    if (st == HP_OK) st = hp_comm_bcast(r->pipe.all, loss, sizeof *loss, root, err);
    if (st != HP_OK || !logits) return st;
    /* the logits, gathered on the last stage's first rank (a collective of that stage), go to rank 0 */
    float *full = NULL;
    int64_t V = r->g.cfg.V;
    size_t bytes = ((size_t)(B * r->x.S_pad * V) + 1) * sizeof(float);
    hp_status gs = HP_OK;
    if (r->pipe.stage == last) gs = hp__gather_out(&r->x, &r->sc.a, B, r->x.dp_rows, false, &full, err);
    if (me == 0 && !(*logits = malloc(bytes))) gs = hp_err_set(err, HP_ERR_NOMEM, "out of memory for the logits");
    if ((st = hp_comm_agree(r->pipe.all, gs, err)) == HP_OK && me == root) { /* both ends are ready */
        double t0 = hp_comm_wtime();
        st = hp_comm_send(r->pipe.all, 0, full, bytes, 0, err);
        r->x.st.comm_s += hp_comm_wtime() - t0; /* the output's delivery, not the pipeline's traffic (p2p_*) */
    } else if (st == HP_OK && me == 0) {
        double t0 = hp_comm_wtime();
        st = hp_comm_recv(r->pipe.all, root, *logits, bytes, 0, err);
        r->x.st.comm_s += hp_comm_wtime() - t0;
    }
    hp__mem_free(&r->x, full, bytes);
    if ((st = hp_comm_agree(r->pipe.all, st, err)) != HP_OK) {
        free(*logits);
        *logits = NULL;
    }
    return st;
}

/* The header of a relayed array: the sender's status and the array's columns. */
typedef struct relay_head {
    int32_t status, pad;
    int64_t cols;
} relay_head;

hp_status hp__pipe_relay_i32(hp_runner *r, int64_t stage, hp_status st, int32_t **v, int64_t *cols, int64_t rows,
                             hp_err *err)
{
    int from = hp__pipe_first(r, stage), me = hp_comm_rank(r->pipe.all);
    if (from == 0 || (me != from && me != 0)) return st;
    relay_head h = {.status = (int32_t)st, .cols = *cols};
    hp_err quiet, *e = st == HP_OK ? err : &quiet; /* a failed stage keeps its own message */
    double t0 = hp_comm_wtime();
    hp_status ss;
    if (me == from) { /* the header, then (its status good) the values */
        ss = hp_comm_send(r->pipe.all, 0, &h, sizeof h, 5, e);
        if (ss == HP_OK && st == HP_OK)
            ss = hp_comm_send(r->pipe.all, 0, *v, (size_t)(rows * *cols) * sizeof **v, 6, e);
        free(*v);
        *v = NULL;
    } else if ((ss = hp_comm_recv(r->pipe.all, from, &h, sizeof h, 5, e)) == HP_OK && h.status != HP_OK) {
        ss = hp_err_set(e, HP_ERR_INPUT, "pipeline stage %lld (rank %d) failed gathering the routing; its error is "
                        "reported by that rank", (long long)stage, from);
    } else if (ss == HP_OK) { /* into a buffer handed to the caller (counted as the stage's own gather counts it) */
        size_t bytes = (size_t)(rows * h.cols) * sizeof **v;
        if ((*v = malloc(bytes + 1))) hp__mem_count(&r->x, 0, bytes + 1), hp__mem_count(&r->x, bytes + 1, 0);
        hp_comm_msg m = {from, false, *v, bytes, 6}; /* NULL: taken and dropped */
        ss = hp_comm_exchange(r->pipe.all, &m, 1, e);
        if (ss == HP_OK && !*v) ss = hp_err_set(e, HP_ERR_NOMEM, "out of memory for the routing of stage %lld",
                                                (long long)stage);
        *cols = h.cols;
    }
    r->x.st.comm_s += hp_comm_wtime() - t0; /* the output's delivery, not the pipeline's traffic (p2p_*) */
    return st != HP_OK ? st : ss;
}
