/*
 * ep.c — expert parallelism: the one-process stages with two all-to-all exchanges between them.
 *
 * Buffers (P ranks in the EP group, L = E / P local experts, Tmax local tokens, K slots per token, H):
 *
 *   send      [Tmax·K, H]     gathered rows in expert-major order = grouped by destination rank; after
 *                             the return exchange it holds the expert outputs in the same order
 *   recv      [P·Tmax·K, H]   rows received, one block per source rank (each block expert-major)
 *   xrows     [P·Tmax·K, H]   the same rows expert-major over all sources (what the experts consume)
 *   cnt_send  [P·L]           rows this rank sends to (dest, local expert of dest)
 *   cnt_recv  [P·L]           rows this rank receives from (source, local expert)
 *
 * The order of the rows a rank sends is fixed by hp_moe_dispatch_prepare (stable, expert-major), so the
 * rows that come back line up with slot_row and hp_moe_combine finishes exactly as in one process.
 */
#include <stdlib.h>
#include <string.h>

#include "moe/moe_internal.h"

struct hp_moe_ep {
    const hp_moe_layer *l;
    hp_comm *comm;
    int P, rank;
    int64_t E, L, K, H, Tmax;
    hp_moe_ws *ws;
    int64_t *counts_all, *offsets_all; /* [E], [E + 1] */
    int64_t *cnt_send, *cnt_recv;      /* [P * L] */
    int64_t *cnt_local;                /* [L] rows per local expert over all sources */
    size_t *sc, *sd, *rc, *rd;         /* [P] byte counts / displacements of the forward exchange */
    float *send, *recv, *xrows, *y_shared;
    hp_moe_ep_stats stats;
};

void hp_moe_ep_destroy(hp_moe_ep *ep)
{
    if (!ep) return;
    hp_moe_ws_destroy(ep->ws);
    free(ep->counts_all);
    free(ep->offsets_all);
    free(ep->cnt_send);
    free(ep->cnt_recv);
    free(ep->cnt_local);
    free(ep->sc);
    free(ep->send);
    free(ep->recv);
    free(ep->xrows);
    free(ep->y_shared);
    free(ep);
}

hp_status hp_moe_ep_create(hp_moe_ep **out, const hp_moe_layer *l, hp_comm *comm, int64_t max_tokens, hp_err *err)
{
    *out = NULL;
    const int P = hp_comm_size(comm), r = hp_comm_rank(comm);
    if (l->n_experts % P != 0)
        return hp_err_set(err, HP_ERR_INPUT, "num_experts (%lld) must be divisible by the EP group size (%d)",
                          (long long)l->n_experts, P);
    const int64_t L = l->n_experts / P;
    if (l->n_local != L || l->first_expert != (int64_t)r * L)
        return hp_err_set(err, HP_ERR_INPUT,
                          "EP rank %d of %d must hold experts [%lld, %lld), but the layer holds [%lld, %lld)", r, P,
                          (long long)(r * L), (long long)((r + 1) * L), (long long)l->first_expert,
                          (long long)(l->first_expert + l->n_local));
    hp_moe_ep *ep = hp_calloc(1, sizeof *ep);
    if (!ep) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    ep->l = l;
    ep->comm = comm;
    ep->P = P;
    ep->rank = r;
    ep->E = l->n_experts;
    ep->L = L;
    ep->K = l->top_k;
    ep->H = l->n_hidden;
    ep->Tmax = max_tokens;
    hp_status st = hp_moe_ws_create(&ep->ws, l, max_tokens, err);
    if (st != HP_OK) {
        hp_moe_ep_destroy(ep);
        return st;
    }
    bool ok = true;
    int64_t slots = max_tokens * ep->K, recv_rows;
    if (!hp_mul_i64(slots, P, &recv_rows)) ok = false;
    ep->counts_all = hp__moe_alloc(ep->E, sizeof(int64_t), &ok);
    ep->offsets_all = hp__moe_alloc(ep->E + 1, sizeof(int64_t), &ok);
    ep->cnt_send = hp__moe_alloc((int64_t)P * L, sizeof(int64_t), &ok);
    ep->cnt_recv = hp__moe_alloc((int64_t)P * L, sizeof(int64_t), &ok);
    ep->cnt_local = hp__moe_alloc(L, sizeof(int64_t), &ok);
    ep->sc = hp__moe_alloc(4 * (int64_t)P, sizeof(size_t), &ok);
    int64_t send_f = 0, recv_f = 0;
    if (ok && (!hp_mul_i64(slots, ep->H, &send_f) || !hp_mul_i64(recv_rows, ep->H, &recv_f))) ok = false;
    ep->send = hp__moe_alloc(send_f, sizeof(float), &ok);
    ep->recv = hp__moe_alloc(recv_f, sizeof(float), &ok);
    ep->xrows = hp__moe_alloc(recv_f, sizeof(float), &ok);
    ep->y_shared = hp__moe_alloc(max_tokens * ep->H, sizeof(float), &ok);
    if (!ok) {
        hp_moe_ep_destroy(ep);
        char b[32];
        return hp_err_set(err, HP_ERR_NOMEM,
                          "out of memory sizing EP buffers for %lld local tokens over %d ranks (%s of receive rows); "
                          "lower the token count per call",
                          (long long)max_tokens, P, hp_format_bytes((uint64_t)recv_f * 4, b, sizeof b));
    }
    ep->sd = ep->sc + P;
    ep->rc = ep->sd + P;
    ep->rd = ep->rc + P;
    *out = ep;
    return HP_OK;
}

const hp_moe_ws *hp_moe_ep_ws(const hp_moe_ep *ep) { return ep->ws; }
const hp_moe_ep_stats *hp_moe_ep_get_stats(const hp_moe_ep *ep) { return &ep->stats; }

/* The shared expert runs in HP_EP_SHARED_CHUNKS pieces of rows in both schedules, so that overlapping it
 * with the exchange changes nothing in the numbers; between pieces the in-flight exchange is given a
 * chance to progress (MPI moves data only inside MPI calls). */
#define HP_EP_SHARED_CHUNKS 8

static hp_status shared_chunked(hp_moe_ep *ep, const float *x, int64_t T, float *y, hp_comm_req *req, hp_err *err)
{
    const int64_t H = ep->H, step = (T + HP_EP_SHARED_CHUNKS - 1) / HP_EP_SHARED_CHUNKS;
    for (int64_t t0 = 0; t0 < T; t0 += step) {
        int64_t m = T - t0 < step ? T - t0 : step;
        hp_status st = hp_moe_shared_forward(ep->l, ep->ws, x + t0 * H, m, y + t0 * H, err);
        if (st != HP_OK) return st;
        bool done;
        if (req && (st = hp_comm_test(req, &done, err)) != HP_OK) return st;
    }
    return HP_OK;
}

/* recv (blocks per source, each expert-major) <-> xrows (expert-major over sources). to_x picks the
 * direction; row offsets are recomputed from cnt_recv both ways. */
static void reorder(hp_moe_ep *ep, bool to_x)
{
    const int64_t L = ep->L, H = ep->H;
    int64_t x_off = 0;
    for (int64_t e = 0; e < L; e++) {
        int64_t src_off = 0;
        for (int s = 0; s < ep->P; s++) {
            int64_t before = 0;
            for (int64_t k = 0; k < e; k++) before += ep->cnt_recv[(int64_t)s * L + k];
            int64_t n = ep->cnt_recv[(int64_t)s * L + e];
            float *a = ep->recv + (src_off + before) * H, *b = ep->xrows + x_off * H;
            if (n) {
                if (to_x) memcpy(b, a, (size_t)(n * H) * sizeof(float));
                else memcpy(a, b, (size_t)(n * H) * sizeof(float));
            }
            x_off += n;
            for (int64_t k = 0; k < L; k++) src_off += ep->cnt_recv[(int64_t)s * L + k];
        }
    }
}

hp_status hp_moe_ep_forward(hp_moe_ep *ep, const float *x, int64_t n_tokens, float *y, const hp_moe_run_opts *opts,
                            bool overlap, hp_err *err)
{
    static const hp_moe_run_opts none = {0};
    if (!opts) opts = &none;
    const hp_moe_layer *l = ep->l;
    hp_moe_ws *ws = ep->ws;
    const int64_t T = n_tokens, K = ep->K, H = ep->H, E = ep->E, L = ep->L;
    const int P = ep->P;
    hp_status st = HP_OK;
    if (T < 0 || T > ep->Tmax)
        st = hp_err_set(err, HP_ERR_INPUT, "%lld local tokens exceed the %lld the EP buffers were sized for",
                        (long long)T, (long long)ep->Tmax);
    if (st == HP_OK) st = hp_moe_check_finite(x, T, H, "input x", err);
    memset(&ep->stats, 0, sizeof ep->stats);
    ep->stats.n_tokens = T;
    ep->stats.n_slots = T * K;

    double t0 = hp_comm_wtime();
    if (st == HP_OK && T > 0) st = hp_moe_route(l, ws, x, T, ws->topk_idx, ws->topk_w, err);
    if (st == HP_OK && T > 0 && opts->balanced_router)
        st = hp_moe_route_balance(ws->topk_idx, ws->topk_w, T, K, E, L, err);
    const uint8_t *keep = NULL;
    if (st == HP_OK && T > 0 && opts->capacity_factor > 0) {
        st = hp_moe_capacity(ws->topk_idx, ws->topk_w, T, K, E, opts->capacity_factor, opts->policy, ws->keep,
                             ws->cap_scratch, &ep->stats.n_dropped, NULL, err);
        keep = ws->keep;
    }
    /* Every rank must reach the exchanges, so agree on the local checks first. */
    if ((st = hp_comm_agree(ep->comm, st, err)) != HP_OK) return st;

    /* Expert-major over all E experts = grouped by destination rank. */
    int64_t n_send = hp_moe_dispatch_prepare(ws->topk_idx, keep, T, K, 0, E, ep->counts_all, ep->offsets_all,
                                             ws->row_slot, ws->slot_row);
    hp_moe_gather(x, H, K, ws->row_slot, n_send, ep->send);
    memcpy(ep->cnt_send, ep->counts_all, (size_t)E * sizeof(int64_t));
    double t1 = hp_comm_wtime();
    ep->stats.t_route = t1 - t0;

    if ((st = hp_comm_alltoall(ep->comm, ep->cnt_send, (size_t)L * sizeof(int64_t), ep->cnt_recv, err))) return st;
    size_t so = 0, ro = 0;
    int64_t n_recv = 0;
    const size_t row_bytes = (size_t)H * sizeof(float);
    for (int p = 0; p < P; p++) {
        int64_t ns = 0, nr = 0;
        for (int64_t e = 0; e < L; e++) {
            ns += ep->cnt_send[(int64_t)p * L + e];
            nr += ep->cnt_recv[(int64_t)p * L + e];
        }
        ep->sc[p] = (size_t)ns * row_bytes;
        ep->sd[p] = so;
        ep->rc[p] = (size_t)nr * row_bytes;
        ep->rd[p] = ro;
        so += ep->sc[p];
        ro += ep->rc[p];
        n_recv += nr;
    }
    for (int64_t e = 0; e < L; e++) {
        ep->cnt_local[e] = 0;
        for (int p = 0; p < P; p++) ep->cnt_local[e] += ep->cnt_recv[(int64_t)p * L + e];
    }
    ep->stats.rows_sent = n_send;
    ep->stats.rows_recv = n_recv;
    ep->stats.bytes_exchanged = (int64_t)(so + ro);

    hp_comm_req *req = NULL;
    if ((st = hp_comm_ialltoallv(ep->comm, ep->send, ep->sc, ep->sd, ep->recv, ep->rc, ep->rd, &req, err))) return st;
    double t2 = hp_comm_wtime();
    if (overlap) {
        /* The shared expert needs only local tokens: run it while the rows are in flight. */
        memset(ep->y_shared, 0, (size_t)(T * H) * sizeof(float));
        st = shared_chunked(ep, x, T, ep->y_shared, req, err);
        ep->stats.t_shared = hp_comm_wtime() - t2;
    }
    double tw = hp_comm_wtime();
    hp_status wst = hp_comm_wait(req, err);
    ep->stats.t_wait = hp_comm_wtime() - tw;
    if (st == HP_OK) st = wst;
    double t3 = hp_comm_wtime();
    ep->stats.t_dispatch = (t3 - t1) - ep->stats.t_shared; /* counts + rows exchange, shared compute excluded */

    if (st == HP_OK) {
        reorder(ep, true);
        st = hp_moe_experts_forward(l, ws, ep->xrows, ep->cnt_local, ep->xrows, err);
        if (st == HP_OK) reorder(ep, false);
    }
    ep->stats.t_experts = hp_comm_wtime() - t3;
    /* A failing expert compute must not leave peers in the return exchange. The return is timed after
     * this agreement, so waiting for the slowest rank's experts is not counted as exchange time. */
    if ((st = hp_comm_agree(ep->comm, st, err)) != HP_OK) return st;
    double t4 = hp_comm_wtime();
    if ((st = hp_comm_alltoallv(ep->comm, ep->recv, ep->rc, ep->rd, ep->send, ep->sc, ep->sd, err))) return st;
    double t5 = hp_comm_wtime();
    ep->stats.t_return = t5 - t4;

    if (T > 0) hp_moe_combine(ep->send, ws->slot_row, ws->topk_w, T, K, H, y);
    double t6 = hp_comm_wtime();
    ep->stats.t_combine = t6 - t5;
    if (overlap) {
        for (int64_t i = 0; i < T * H; i++) y[i] += ep->y_shared[i];
    } else {
        st = shared_chunked(ep, x, T, y, NULL, err);
        ep->stats.t_shared = hp_comm_wtime() - t6;
    }
    ws->stats.n_tokens = T;
    ws->stats.n_slots = T * K;
    ws->stats.n_dropped = ep->stats.n_dropped;
    ws->stats.n_rows = n_recv;
    return st;
}
