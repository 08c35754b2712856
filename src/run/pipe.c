/*
 * pipe.c — the forward across pipeline stages (docs/pipeline.md). A stage runs its chunks of the program in chunk
 * order; between two chunks the residual stream goes point to point to the rank at the same position of the next
 * chunk's stage, in the stream's own layout (every rank sends its local block: SP- and CP-local as the plan lays
 * the stream out). Each transfer is preceded by a status word, so that a stage that failed still releases the
 * stage waiting for it and every rank reaches the agreement that ends the forward: nothing hangs on an error.
 * The loss and the logits come from the last stage.
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

/* Counts a point-to-point transfer of bytes on either end (hp_run_stats.p2p_*: the stream's payloads between
 * stages, not the status words, nor the logits' delivery to rank 0: what cost predicts). */
static void count_p2p(hp_runner *r, uint64_t bytes, double t0)
{
    r->x.st.p2p_bytes += bytes;
    r->x.st.p2p_calls++;
    r->x.st.comm_s += hp_comm_wtime() - t0;
}

/* The stream to chunk `to`'s stage; ok false: only the status (this stage failed). */
static hp_status send_stream(hp_runner *r, const hp__act *h, int64_t to, bool ok, hp_err *err)
{
    int32_t flag = ok;
    int tag = (int)(to % 32768);
    double t0 = hp_comm_wtime();
    hp_status st = hp_comm_send(r->pipe.all, hp__pipe_peer(r, to % r->pipe.pp), &flag, sizeof flag, tag, err);
    if (st == HP_OK && ok) {
        size_t bytes = (size_t)hp__act_count(h) * sizeof(float);
        st = hp_comm_send(r->pipe.all, hp__pipe_peer(r, to % r->pipe.pp), h->d, bytes, tag, err);
        count_p2p(r, bytes, t0);
    }
    return st;
}

/* The stream of chunk c from the previous chunk's stage into h, laid out as the stream: the rank's block of its
 * replica's rows [B_r, S_pad, H]. */
static hp_status recv_stream(hp_runner *r, hp__act *h, int64_t c, hp_err *err)
{
    const hp__prog *g = &r->g;
    int32_t flag = 0;
    int tag = (int)(c % 32768), from = hp__pipe_peer(r, (c - 1) % r->pipe.pp);
    double t0 = hp_comm_wtime();
    hp_status st = hp_comm_recv(r->pipe.all, from, &flag, sizeof flag, tag, err);
    if (st != HP_OK) return st;
    if (!flag)
        return hp_err_set(err, HP_ERR_INPUT, "pipeline stage %lld (rank %d) failed before chunk %lld; its error is "
                          "reported by that rank", (long long)((c - 1) % r->pipe.pp), from, (long long)c);
    int64_t Bl = r->x.dp_rows[r->x.dp_r + 1] - r->x.dp_rows[r->x.dp_r];
    if ((st = hp__act_alloc(&r->x, h, Bl, r->x.S_pad, g->cfg.H, g->stream, err)) != HP_OK) return st;
    size_t bytes = (size_t)hp__act_count(h) * sizeof(float);
    st = hp_comm_recv(r->pipe.all, from, h->d, bytes, tag, err);
    count_p2p(r, bytes, t0);
    return st;
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
        if (c > 0) {
            hp_status rs = recv_stream(r, io->h, c, err);
            if (st == HP_OK) st = rs;
        }
        if (st == HP_OK) st = hp__r_steps(r, io, lo, i, err);
        if (c + 1 < C) {
            hp_status ss = send_stream(r, io->h, c + 1, st == HP_OK, err);
            if (st == HP_OK) st = ss;
        }
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
