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
 * Every buffer (these and the small count arrays) is an entry of hp_moe_ep_layout (layout.c): ep_build allocates
 * by walking that table, as `hyperpar cost` sums it.
 *
 * The order of the rows a rank sends is fixed by hp_moe_dispatch_prepare (stable, expert-major), so the
 * rows that come back line up with slot_row and hp_moe_combine finishes exactly as in one process.
 *
 * Dispatch chunks (hp_moe_ep_forward_chunks, C > 1): routing and the capacity limit run once over all T
 * local tokens; then the tokens go through the exchange in C contiguous chunks [T·c/C, T·(c+1)/C), two
 * stages alternating between two communicators (the MPI backend allows one exchange in flight on each):
 *
 *             stage 0 (comm)            stage 1 (comm2)
 *   post 0    counts, rows in flight
 *   c = 0     wait, experts, return     post 1: counts, rows in flight
 *   c = 1     post 2: counts, rows      wait, experts, return
 *   ...
 *
 * so chunk c+1's rows travel while chunk c's experts compute. A stage is a view into the buffers above:
 * send and recv hold two stages of Th = ceil((Tmax + 1) / 2) tokens each (Tmax + 1: a peer may hold one
 * token more than this rank, as the CLI's row blocks do), xrows is shared (one chunk's experts run at a
 * time), and each chunk keeps its slot_row / row_slot in the chunk's own range of the workspace's arrays.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/moe_internal.h"

struct hp_moe_ep {
    const hp_moe_layer *l;
    hp_moe_ep_shape shape;             /* what its arrays were made for (hp_moe_ep_layout, hp_moe_bwd_layout) */
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
    size_t bytes;                      /* what ep_build allocated (hp_moe_ep_workspace_bytes adds the ws's) */
    /* Dispatch chunks (max_chunks > 1 only). */
    int max_chunks;
    int64_t Th;                        /* tokens per chunk a stage holds */
    bool bounded;                      /* hp_moe_ep_create_bounded: xrows and the per-row scratch hold one chunk */
    int64_t send_rows, x_rows;         /* rows send and xrows hold (recv: P·send_rows) */
    hp_comm *comm2;                    /* hp_comm_split of comm: stage 1's exchanges */
    int64_t *stage_cnt;                /* [2 stages][2][P * L] cnt_send, cnt_recv */
    size_t *stage_sz;                  /* [2 stages][4][P] sc, sd, rc, rd */
    hp_moe_ep *share;                  /* the runtime whose buffers this one borrows (NULL: its own) */
};

/* One chunk's exchange: views into the hp_moe_ep buffers, and the chunk's tokens [t0, t0 + n). */
typedef struct ep_stage {
    hp_comm *comm;
    float *send, *recv;                /* [Th*K, H], [P*Th*K, H] */
    int64_t *cnt_send, *cnt_recv;      /* [P * L] */
    size_t *sc, *sd, *rc, *rd;         /* [P] */
    hp_comm_req *req;                  /* the row exchange in flight, or NULL */
    int64_t t0, n, n_send, n_recv;
} ep_stage;

void hp_moe_ep_destroy(hp_moe_ep *ep)
{
    if (!ep) return;
    hp_moe_ws_destroy(ep->ws);
    if (ep->share) { /* every buffer and the communicators are the owner's */
        free(ep);
        return;
    }
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
    free(ep->stage_cnt);
    free(ep->stage_sz);
    hp_comm_free(ep->comm2);
    free(ep);
}

/* The rank-local part of creation: checks and buffers (max_chunks > 1: two stages' worth). No collective. */
static hp_status ep_build(hp_moe_ep **out, const hp_moe_layer *l, hp_comm *comm, int64_t max_tokens, int max_chunks,
                          bool bounded, hp_err *err)
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
    ep->max_chunks = max_chunks > 1 ? max_chunks : 1;
    ep->bounded = bounded && ep->max_chunks > 1;
    /* Chunked: send and recv hold two stages of Th tokens; 2·Th >= Tmax + 1, so the plain path fits too, unless
     * bounded: then Th = ceil(Tmax / C) and xrows and the per-row scratch hold one chunk (hp_moe_ep_layout). */
    hp_moe_ep_shape s = hp__moe_shape_of(l, max_tokens);
    s.one_process = false;
    s.ep_size = P;
    s.chunks = ep->max_chunks;
    s.bounded = ep->bounded;
    ep->Th = hp__moe_ep_stage_tokens(&s);
    ep->shape = s;
    hp_status st = hp__moe_ws_make(&ep->ws, l, &s, err);
    if (st != HP_OK) {
        hp_moe_ep_destroy(ep);
        return st;
    }
    hp_moe_ep_array a[HP_MOE_ARR_COUNT];
    int n = hp_moe_ep_layout(&s, a);
    void *p[HP_MOE_ARR_COUNT] = {0};
    bool ok = hp__moe_alloc_layout(a, n, HP_MOE_ARR_EP_FIRST, HP_MOE_ARR_COUNT, p, &ep->bytes);
    ep->stage_cnt = p[HP_MOE_ARR_STAGE_CNT];
    ep->stage_sz = p[HP_MOE_ARR_STAGE_SZ];
    ep->counts_all = p[HP_MOE_ARR_COUNTS_ALL];
    ep->offsets_all = p[HP_MOE_ARR_OFFSETS_ALL];
    ep->cnt_send = p[HP_MOE_ARR_CNT_SEND];
    ep->cnt_recv = p[HP_MOE_ARR_CNT_RECV];
    ep->cnt_local = p[HP_MOE_ARR_CNT_LOCAL];
    ep->sc = p[HP_MOE_ARR_SC];
    ep->send = p[HP_MOE_ARR_SEND];
    ep->recv = p[HP_MOE_ARR_RECV];
    ep->xrows = p[HP_MOE_ARR_XROWS];
    ep->y_shared = p[HP_MOE_ARR_Y_SHARED];
    if (!ok) {
        hp_moe_ep_destroy(ep);
        char b[32];
        uint64_t recv_b = 0;
        for (int i = 0; i < n; i++)
            if (a[i].id == HP_MOE_ARR_RECV) (void)hp_moe_ep_layout_bytes(&a[i], 1, &recv_b);
        return hp_err_set(err, HP_ERR_NOMEM,
                          "out of memory sizing EP buffers for %lld local tokens over %d ranks (%s of receive rows); "
                          "lower the token count per call",
                          (long long)max_tokens, P, hp_format_bytes(recv_b, b, sizeof b));
    }
    /* The rows send and xrows hold (the counts fit: their arrays were allocated). */
    ep->send_rows = (ep->max_chunks > 1 ? 2 * ep->Th : max_tokens) * ep->K;
    ep->x_rows = hp__moe_ep_x_rows(&s);
    ep->sd = ep->sc + P;
    ep->rc = ep->sd + P;
    ep->rd = ep->rc + P;
    *out = ep;
    return HP_OK;
}

hp_status hp_moe_ep_create(hp_moe_ep **out, const hp_moe_layer *l, hp_comm *comm, int64_t max_tokens, hp_err *err)
{
    return ep_build(out, l, comm, max_tokens, 1, false, err);
}

static hp_status create_chunked(hp_moe_ep **out, const hp_moe_layer *l, hp_comm *comm, int64_t max_tokens,
                                int max_chunks, bool bounded, hp_err *err)
{
    if (max_chunks <= 1) return ep_build(out, l, comm, max_tokens, 1, false, err);
    hp_status st = ep_build(out, l, comm, max_tokens, max_chunks, bounded, err);
    /* Every rank must reach the split: agree on the local part first. */
    st = hp_comm_agree(comm, st, err);
    if (st == HP_OK) st = hp_comm_split(comm, 0, hp_comm_rank(comm), &(*out)->comm2, err);
    if (st != HP_OK) {
        hp_moe_ep_destroy(*out);
        *out = NULL;
    }
    return st;
}

hp_status hp_moe_ep_create_chunked(hp_moe_ep **out, const hp_moe_layer *l, hp_comm *comm, int64_t max_tokens,
                                   int max_chunks, hp_err *err)
{
    return create_chunked(out, l, comm, max_tokens, max_chunks, false, err);
}

hp_status hp_moe_ep_create_bounded(hp_moe_ep **out, const hp_moe_layer *l, hp_comm *comm, int64_t max_tokens,
                                   int chunks, hp_err *err)
{
    return create_chunked(out, l, comm, max_tokens, chunks, true, err);
}

hp_status hp_moe_ep_create_shared(hp_moe_ep **out, const hp_moe_layer *l, hp_moe_ep *owner, hp_err *err)
{
    *out = NULL;
    if (owner->share) owner = owner->share;
    const hp_moe_layer *o = owner->l;
    const char *what = l->n_hidden != o->n_hidden        ? "hidden size"
                       : l->n_experts != o->n_experts    ? "number of experts"
                       : l->top_k != o->top_k            ? "top-k"
                       : l->d_expert != o->d_expert      ? "expert width"
                       : l->d_shared != o->d_shared      ? "shared-expert width"
                       : l->n_local != o->n_local || l->first_expert != o->first_expert ? "local experts"
                       : (l->ws_gate != NULL) != (o->ws_gate != NULL) ? "shared-expert gate"
                                                                   : NULL;
    if (what)
        return hp_err_set(err, HP_ERR_INPUT, "layer %lld cannot share the EP buffers of layer %lld: its %s differs",
                          (long long)l->layer, (long long)o->layer, what);
    hp_moe_ep *ep = hp_calloc(1, sizeof *ep);
    if (!ep) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    *ep = *owner;
    ep->l = l;
    ep->share = owner;
    ep->bytes = 0;
    memset(&ep->stats, 0, sizeof ep->stats);
    ep->ws = NULL;
    hp_status st = hp__moe_ws_share(&ep->ws, l, owner->ws, err);
    if (st != HP_OK) {
        free(ep);
        return st;
    }
    *out = ep;
    return HP_OK;
}

const hp_moe_ws *hp_moe_ep_ws(const hp_moe_ep *ep) { return ep->ws; }
size_t hp_moe_ep_workspace_bytes(const hp_moe_ep *ep) { return ep ? ep->bytes + ep->ws->bytes : 0; }
size_t hp_moe_ep_backward_bytes(const hp_moe_ep *ep) { return ep && ep->ws->bwd ? ep->ws->bwd->bytes : 0; }
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
 * direction; row offsets are recomputed from cnt_recv [P * L] both ways. */
static void reorder_buf(hp_moe_ep *ep, const int64_t *cnt_recv, float *recv, float *xrows, bool to_x)
{
    const int64_t L = ep->L, H = ep->H;
    int64_t x_off = 0;
    for (int64_t e = 0; e < L; e++) {
        int64_t src_off = 0;
        for (int s = 0; s < ep->P; s++) {
            int64_t before = 0;
            for (int64_t k = 0; k < e; k++) before += cnt_recv[(int64_t)s * L + k];
            int64_t n = cnt_recv[(int64_t)s * L + e];
            float *a = recv + (src_off + before) * H, *b = xrows + x_off * H;
            if (n) {
                if (to_x) memcpy(b, a, (size_t)(n * H) * sizeof(float));
                else memcpy(a, b, (size_t)(n * H) * sizeof(float));
            }
            x_off += n;
            for (int64_t k = 0; k < L; k++) src_off += cnt_recv[(int64_t)s * L + k];
        }
    }
}

static void reorder(hp_moe_ep *ep, const int64_t *cnt_recv, float *recv, bool to_x)
{
    reorder_buf(ep, cnt_recv, recv, ep->xrows, to_x);
}

/* The expert outputs in xrows (expert-major over sources) must be finite; the inputs of the same rows are
 * still in recv (blocks per source, each expert-major). The first bad row fails with its expert, source rank
 * and likely cause (hp__moe_expert_nonfinite). */
static hp_status check_expert_rows(const hp_moe_ep *ep, const int64_t *cnt_recv, const float *recv, hp_err *err)
{
    const int64_t L = ep->L, H = ep->H;
    int64_t n = 0;
    for (int64_t i = 0; i < (int64_t)ep->P * L; i++) n += cnt_recv[i];
    if (hp__moe_first_nonfinite(ep->xrows, n * H) < 0) return HP_OK;
    int64_t x_off = 0;
    for (int64_t e = 0; e < L; e++) {
        int64_t src_off = 0;
        for (int s = 0; s < ep->P; s++) {
            int64_t before = 0;
            for (int64_t k = 0; k < e; k++) before += cnt_recv[(int64_t)s * L + k];
            for (int64_t j = 0; j < cnt_recv[(int64_t)s * L + e]; j++) {
                const float *out = ep->xrows + (x_off + j) * H;
                if (hp__moe_first_nonfinite(out, H) >= 0) {
                    char whose[64];
                    snprintf(whose, sizeof whose, "a token of EP rank %d", s);
                    return hp__moe_expert_nonfinite(ep->l, e, recv + (src_off + before + j) * H, out, whose, err);
                }
            }
            x_off += cnt_recv[(int64_t)s * L + e];
            for (int64_t k = 0; k < L; k++) src_off += cnt_recv[(int64_t)s * L + k];
        }
    }
    return HP_OK;
}

/* Byte counts and displacements of the row exchange from the per-(peer, local expert) row counts; returns
 * the rows received, *bytes the bytes sent plus received. */
static int64_t plan_exchange(const hp_moe_ep *ep, const int64_t *cnt_send, const int64_t *cnt_recv, size_t *sc,
                             size_t *sd, size_t *rc, size_t *rd, int64_t *bytes)
{
    const int64_t L = ep->L;
    const size_t row_bytes = (size_t)ep->H * sizeof(float);
    size_t so = 0, ro = 0;
    int64_t n_recv = 0;
    for (int p = 0; p < ep->P; p++) {
        int64_t ns = 0, nr = 0;
        for (int64_t e = 0; e < L; e++) {
            ns += cnt_send[(int64_t)p * L + e];
            nr += cnt_recv[(int64_t)p * L + e];
        }
        sc[p] = (size_t)ns * row_bytes;
        sd[p] = so;
        rc[p] = (size_t)nr * row_bytes;
        rd[p] = ro;
        so += sc[p];
        ro += rc[p];
        n_recv += nr;
    }
    *bytes = (int64_t)(so + ro);
    return n_recv;
}

/* cnt_local[e] = rows for local expert e over all sources. */
static void count_local(hp_moe_ep *ep, const int64_t *cnt_recv)
{
    for (int64_t e = 0; e < ep->L; e++) {
        ep->cnt_local[e] = 0;
        for (int p = 0; p < ep->P; p++) ep->cnt_local[e] += cnt_recv[(int64_t)p * ep->L + e];
    }
}

/* The capacity limit within each block of rows (opts->cap_block), each block's slots gathered in row order, limited
 * as one rank's would be, and the mask scattered back into ws->keep. */
static hp_status capacity_by_block(hp_moe_ws *ws, int64_t T, int64_t K, int64_t E, const hp_moe_run_opts *opts,
                                   int64_t *dropped, hp_err *err)
{
    int32_t nb = 0;
    for (int64_t t = 0; t < T; t++) {
        if (opts->cap_block[t] < 0)
            return hp_err_set(err, HP_ERR_INPUT, "capacity blocks: row %lld belongs to no block", (long long)t);
        if (opts->cap_block[t] >= nb) nb = opts->cap_block[t] + 1;
    }
    int32_t *idx = malloc((size_t)(T * K) * sizeof *idx + 1), *rows = malloc((size_t)T * sizeof *rows + 1);
    float *w = malloc((size_t)(T * K) * sizeof *w + 1);
    uint8_t *kp = malloc((size_t)(T * K) + 1);
    hp_status st = idx && rows && w && kp ? HP_OK : hp_err_set(err, HP_ERR_NOMEM, "out of memory for capacity blocks");
    *dropped = 0;
    for (int32_t b = 0; b < nb && st == HP_OK; b++) {
        int64_t n = 0;
        for (int64_t t = 0; t < T; t++)
            if (opts->cap_block[t] == b) {
                memcpy(idx + n * K, ws->topk_idx + t * K, (size_t)K * sizeof *idx);
                memcpy(w + n * K, ws->topk_w + t * K, (size_t)K * sizeof *w);
                rows[n++] = (int32_t)t;
            }
        int64_t d = 0;
        if (n) st = hp_moe_capacity(idx, w, n, K, E, opts->capacity_factor, opts->policy, kp, ws->cap_scratch, &d,
                                    NULL, err);
        for (int64_t i = 0; i < n && st == HP_OK; i++) memcpy(ws->keep + (int64_t)rows[i] * K, kp + i * K, (size_t)K);
        *dropped += d;
    }
    free(idx), free(rows), free(w), free(kp);
    return st;
}

/* The rank-local start of a forward, identical with and without chunks: checks x, routes all T tokens,
 * applies the capacity limit to this rank's slots (*keep: the mask or NULL). Resets the statistics; *t0
 * is when routing began. No collective: the caller agrees on the status. */
static hp_status route_local(hp_moe_ep *ep, const float *x, int64_t T, const hp_moe_run_opts *opts,
                             const uint8_t **keep, double *t0, hp_err *err)
{
    const hp_moe_layer *l = ep->l;
    hp_moe_ws *ws = ep->ws;
    const int64_t K = ep->K, H = ep->H, E = ep->E, L = ep->L;
    hp_status st = HP_OK;
    if (T < 0 || T > ep->Tmax)
        st = hp_err_set(err, HP_ERR_INPUT, "%lld local tokens exceed the %lld the EP buffers were sized for",
                        (long long)T, (long long)ep->Tmax);
    if (st == HP_OK && !opts->caller_checks_finite)
        st = hp__moe_check_finite_at(x, T, H, "input x", opts->row_base, err);
    memset(&ep->stats, 0, sizeof ep->stats);
    ep->stats.n_tokens = T;
    ep->stats.n_slots = T * K;

    *t0 = hp_comm_wtime();
    if (st == HP_OK && T > 0) st = hp_moe_route(l, ws, x, T, ws->topk_idx, ws->topk_w, err);
    if (st == HP_OK && T > 0 && opts->balanced_router)
        st = hp_moe_route_balance(ws->topk_idx, ws->topk_w, T, K, E, L, err);
    *keep = NULL;
    if (st == HP_OK && T > 0 && opts->capacity_factor > 0) {
        st = opts->cap_block ? capacity_by_block(ws, T, K, E, opts, &ep->stats.n_dropped, err)
                             : hp_moe_capacity(ws->topk_idx, ws->topk_w, T, K, E, opts->capacity_factor, opts->policy,
                                               ws->keep, ws->cap_scratch, &ep->stats.n_dropped, NULL, err);
        *keep = ws->keep;
    }
    /* What the backward needs to know of this forward's routing, and whose forward shared arrays hold. */
    (ws->share ? ws->share : ws)->last_fwd = ws;
    ws->fwd_tokens = st == HP_OK ? T : -1;
    ws->fwd_keep = *keep != NULL;
    ws->fwd_balanced = opts->balanced_router;
    return st;
}

/* The end of every forward: y must be finite (hp__moe_check_output), and the ranks agree on the outcome, so
 * that a rank's failing shared expert or non-finite row ends the call on every rank with the same status. */
static hp_status finish(hp_moe_ep *ep, const float *x, int64_t T, const float *y, const uint8_t *keep,
                        const hp_moe_run_opts *opts, hp_status st, hp_err *err)
{
    if (st == HP_OK && T > 0 && !opts->caller_checks_finite)
        st = hp__moe_check_output(ep->l, x, y, T, ep->ws->topk_idx, ep->ws->topk_w, keep, opts->row_base, err);
    return hp_comm_agree(ep->comm, st, err);
}

hp_status hp_moe_ep_forward(hp_moe_ep *ep, const float *x, int64_t n_tokens, float *y, const hp_moe_run_opts *opts,
                            bool overlap, hp_err *err)
{
    static const hp_moe_run_opts none = {0};
    if (!opts) opts = &none;
    overlap = overlap && ep->y_shared;
    const hp_moe_layer *l = ep->l;
    hp_moe_ws *ws = ep->ws;
    const int64_t T = n_tokens, K = ep->K, H = ep->H, E = ep->E, L = ep->L;
    const uint8_t *keep = NULL;
    double t0 = 0;
    hp_status st = route_local(ep, x, T, opts, &keep, &t0, err);
    if (st == HP_OK && T * K > ep->send_rows)
        st = hp_err_set(err, HP_ERR_INPUT, "%lld local tokens in one dispatch exceed the %lld the EP runtime's buffers "
                        "hold (it holds %d chunks of %lld tokens): forward them with hp_moe_ep_forward_chunks",
                        (long long)T, (long long)(ep->send_rows / K), ep->max_chunks, (long long)ep->Th);
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
    int64_t n_recv = plan_exchange(ep, ep->cnt_send, ep->cnt_recv, ep->sc, ep->sd, ep->rc, ep->rd,
                                   &ep->stats.bytes_exchanged);
    count_local(ep, ep->cnt_recv);
    ep->stats.rows_sent = n_send;
    ep->stats.rows_recv = n_recv;
    /* The receive side holds P·Tmax·K rows (x_rows): enough unless a peer has more tokens than this rank was
     * sized for. Refuse (on every rank) rather than overrun. */
    if (n_recv > ep->x_rows)
        st = hp_err_set(err, HP_ERR_INPUT,
                        "EP rank %d would receive %lld rows but its buffers hold %lld (its runtime was created "
                        "for %lld tokens per rank%s): a peer holds more tokens than that; pass the largest token "
                        "count any rank of the group holds as max_tokens to hp_moe_ep_create on every rank",
                        ep->rank, (long long)n_recv, (long long)ep->x_rows, (long long)ep->Tmax,
                        ep->bounded ? ", in dispatch chunks: use hp_moe_ep_forward_chunks" : "");
    if ((st = hp_comm_agree(ep->comm, st, err)) != HP_OK) return st;

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
        reorder(ep, ep->cnt_recv, ep->recv, true);
        st = hp_moe_experts_forward(l, ws, ep->xrows, ep->cnt_local, ep->xrows, err);
        if (st == HP_OK && !opts->caller_checks_finite) st = check_expert_rows(ep, ep->cnt_recv, ep->recv, err);
        if (st == HP_OK) reorder(ep, ep->cnt_recv, ep->recv, false);
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
    return finish(ep, x, T, y, keep, opts, st, err);
}

/* ---- dispatch chunks ---- */

/* Stage i (0 or 1) of the pipeline: its communicator and its views into the shared buffers. */
static void stage_init(hp_moe_ep *ep, int i, ep_stage *s)
{
    const int64_t PL = (int64_t)ep->P * ep->L, rows = ep->Th * ep->K;
    memset(s, 0, sizeof *s);
    s->comm = i ? ep->comm2 : ep->comm;
    s->send = ep->send + (int64_t)i * rows * ep->H;
    s->recv = ep->recv + (int64_t)i * ep->P * rows * ep->H;
    s->cnt_send = ep->stage_cnt + (int64_t)i * 2 * PL;
    s->cnt_recv = s->cnt_send + PL;
    s->sc = ep->stage_sz + (int64_t)i * 4 * ep->P;
    s->sd = s->sc + ep->P;
    s->rc = s->sd + ep->P;
    s->rd = s->rc + ep->P;
}

/* Dispatches chunk [t0, t0 + n) on stage s: expert-major order of its kept slots (slot_row / row_slot in
 * the chunk's range of the workspace's arrays), gather, counts exchange, and the row exchange posted
 * non-blocking. A rank whose chunk is empty still takes part in both exchanges. */
static hp_status stage_post(hp_moe_ep *ep, ep_stage *s, const float *x, const uint8_t *keep, int64_t t0, int64_t n,
                            hp_err *err)
{
    hp_moe_ws *ws = ep->ws;
    const int64_t K = ep->K, H = ep->H;
    double ta = hp_comm_wtime();
    s->t0 = t0;
    s->n = n;
    s->n_send = hp_moe_dispatch_prepare(ws->topk_idx + t0 * K, keep ? keep + t0 * K : NULL, n, K, 0, ep->E,
                                        ep->counts_all, ep->offsets_all, ws->row_slot + t0 * K, ws->slot_row + t0 * K);
    if (s->n_send) hp_moe_gather(x + t0 * H, H, K, ws->row_slot + t0 * K, s->n_send, s->send);
    memcpy(s->cnt_send, ep->counts_all, (size_t)ep->E * sizeof(int64_t));
    double tb = hp_comm_wtime();
    ep->stats.t_route += tb - ta;
    hp_status st = hp_comm_alltoall(s->comm, s->cnt_send, (size_t)ep->L * sizeof(int64_t), s->cnt_recv, err);
    if (st != HP_OK) return st;
    int64_t bytes = 0;
    s->n_recv = plan_exchange(ep, s->cnt_send, s->cnt_recv, s->sc, s->sd, s->rc, s->rd, &bytes);
    ep->stats.rows_sent += s->n_send;
    ep->stats.rows_recv += s->n_recv;
    ep->stats.bytes_exchanged += bytes;
    st = hp_comm_ialltoallv(s->comm, s->send, s->sc, s->sd, s->recv, s->rc, s->rd, &s->req, err);
    ep->stats.t_dispatch += hp_comm_wtime() - tb;
    return st;
}

/* Waits for stage s's row exchange if it is in flight (the error path: nothing may stay in flight). */
static void stage_drain(ep_stage *s)
{
    hp_err e2;
    if (s->req) (void)hp_comm_wait(s->req, &e2);
    s->req = NULL;
}

/* Chunk c's row exchange completes, the local experts run on its rows, the ranks agree, and the outputs
 * go back and are combined into y's rows [t0, t0 + n). st is the status so far (a failed shared expert
 * under overlap): the collectives still run so that every rank reaches the agreement. */
static hp_status stage_finish(hp_moe_ep *ep, ep_stage *s, float *y, bool check, hp_status st, hp_err *err)
{
    hp_moe_ws *ws = ep->ws;
    const int64_t K = ep->K, H = ep->H;
    double tw = hp_comm_wtime();
    hp_status wst = hp_comm_wait(s->req, err);
    s->req = NULL;
    double t3 = hp_comm_wtime();
    ep->stats.t_wait += t3 - tw;
    ep->stats.t_dispatch += t3 - tw;
    if (st == HP_OK) st = wst;
    if (st == HP_OK) {
        count_local(ep, s->cnt_recv);
        reorder(ep, s->cnt_recv, s->recv, true);
        st = hp_moe_experts_forward(ep->l, ws, ep->xrows, ep->cnt_local, ep->xrows, err);
        if (st == HP_OK && check) st = check_expert_rows(ep, s->cnt_recv, s->recv, err);
        if (st == HP_OK) reorder(ep, s->cnt_recv, s->recv, false);
        ws->stats.n_rows += s->n_recv;
    }
    ep->stats.t_experts += hp_comm_wtime() - t3;
    if ((st = hp_comm_agree(s->comm, st, err)) != HP_OK) return st;
    double t4 = hp_comm_wtime();
    if ((st = hp_comm_alltoallv(s->comm, s->recv, s->rc, s->rd, s->send, s->sc, s->sd, err))) return st;
    double t5 = hp_comm_wtime();
    ep->stats.t_return += t5 - t4;
    if (s->n > 0) hp_moe_combine(s->send, ws->slot_row + s->t0 * K, ws->topk_w + s->t0 * K, s->n, K, H, y + s->t0 * H);
    ep->stats.t_combine += hp_comm_wtime() - t5;
    return HP_OK;
}

hp_status hp_moe_ep_forward_chunks(hp_moe_ep *ep, const float *x, int64_t n_tokens, float *y,
                                   const hp_moe_run_opts *opts, bool overlap, int chunks, hp_err *err)
{
    if (chunks <= 1) return hp_moe_ep_forward(ep, x, n_tokens, y, opts, overlap, err);
    static const hp_moe_run_opts none = {0};
    if (!opts) opts = &none;
    overlap = overlap && ep->y_shared;
    hp_moe_ws *ws = ep->ws;
    const int64_t T = n_tokens, H = ep->H, C = chunks;
    const uint8_t *keep = NULL;
    double t0 = 0;
    hp_status st = route_local(ep, x, T, opts, &keep, &t0, err);
    ep->stats.t_route = hp_comm_wtime() - t0;
    /* One reduction: every peer's largest chunk, ceil(T_peer / C), must fit this rank's stages, and the
     * ranks must agree on C (a rank with another C would post a different sequence of exchanges). */
    double red[3] = {(double)(T > 0 ? T : 0), (double)C, -(double)C};
    hp_status rst = hp_comm_allreduce_max_f64(ep->comm, red, 3, err);
    if (rst != HP_OK) return rst;
    const int64_t peak = (int64_t)red[0], peak_chunk = (peak + C - 1) / C;
    if (st == HP_OK && red[1] != -red[2])
        st = hp_err_set(err, HP_ERR_INPUT, "the ranks of the EP group disagree on the number of dispatch chunks "
                        "(%g to %g); every rank must use the same", -red[2], red[1]);
    else if (st == HP_OK && chunks > ep->max_chunks && !ep->bounded) /* bounded: more chunks fit its stages */
        st = hp_err_set(err, HP_ERR_INPUT,
                        "%d dispatch chunks requested but the EP runtime was created for at most %d; create it "
                        "with hp_moe_ep_create_chunked and max_chunks >= %d",
                        chunks, ep->max_chunks, chunks);
    else if (st == HP_OK && peak_chunk > ep->Th)
        st = hp_err_set(err, HP_ERR_INPUT,
                        "a rank of the EP group holds %lld local tokens: its chunks of up to %lld tokens exceed the "
                        "%lld this rank's chunk buffers hold (created for %lld tokens); pass the largest token count "
                        "any rank of the group holds as max_tokens to hp_moe_ep_create_chunked on every rank",
                        (long long)peak, (long long)peak_chunk, (long long)ep->Th, (long long)ep->Tmax);
    if ((st = hp_comm_agree(ep->comm, st, err)) != HP_OK) return st;
    ws->stats.n_rows = 0;

    ep_stage stage[2];
    stage_init(ep, 0, &stage[0]);
    stage_init(ep, 1, &stage[1]);
    if ((st = stage_post(ep, &stage[0], x, keep, 0, T / C, err)) != HP_OK) {
        stage_drain(&stage[0]);
        return st;
    }
    if (overlap) {
        /* The shared expert needs only local tokens: run it while the first chunk's rows are in flight. */
        double ts = hp_comm_wtime();
        memset(ep->y_shared, 0, (size_t)(T * H) * sizeof(float));
        st = shared_chunked(ep, x, T, ep->y_shared, stage[0].req, err);
        ep->stats.t_shared = hp_comm_wtime() - ts;
    }
    for (int64_t c = 0; c < C; c++) {
        ep_stage *cur = &stage[c & 1], *next = &stage[(c + 1) & 1];
        hp_status pst = HP_OK;
        /* Chunk c + 1 goes out on the other communicator before chunk c's experts run. */
        if (c + 1 < C) pst = stage_post(ep, next, x, keep, T * (c + 1) / C, T * (c + 2) / C - T * (c + 1) / C, err);
        if (pst != HP_OK) {
            stage_drain(cur);
            stage_drain(next);
            return pst;
        }
        if ((st = stage_finish(ep, cur, y, !opts->caller_checks_finite, st, err)) != HP_OK) {
            stage_drain(next);
            return st;
        }
    }
    double t6 = hp_comm_wtime();
    if (overlap) {
        for (int64_t i = 0; i < T * H; i++) y[i] += ep->y_shared[i];
    } else {
        st = shared_chunked(ep, x, T, y, NULL, err);
        ep->stats.t_shared = hp_comm_wtime() - t6;
    }
    ws->stats.n_tokens = T;
    ws->stats.n_slots = T * ep->K;
    ws->stats.n_dropped = ep->stats.n_dropped;
    return finish(ep, x, T, y, keep, opts, st, err);
}

/* ---- backward ----
 *
 * The forward's data flow reversed (src/moe/backward.c has the math). The token side recomputes the forward's
 * expert-major order over all E experts (= grouped by destination rank) and sends, on the forward's dispatch
 * plan, first the rows of x again (the experts recompute their activations) and then the dOut rows w·dy; the
 * expert side runs hp__moe_experts_backward on the rows expert-major over sources, and sends back, on the
 * forward's return plan, first d(rows), which the token side adds into dx, then the experts' outputs O, from
 * which it forms dw = dy·O. The router's and the shared expert's backward are local. */
hp_status hp_moe_ep_backward(hp_moe_ep *ep, const float *x, int64_t n_tokens, const float *dy, float *dx,
                             hp_moe_grads *g, hp_err *err)
{
    const hp_moe_layer *l = ep->l;
    hp_moe_ws *ws = ep->ws;
    const int64_t T = n_tokens, K = ep->K, H = ep->H, E = ep->E, L = ep->L;
    /* The receive side holds as many rows as the forward's buffers (two stages of Th tokens when chunked, one
     * chunk when bounded): the backward runs all T at once, so a bounded runtime takes at most what they hold. */
    const int64_t recv_max = ep->x_rows;
    hp__moe_bwd *b = NULL;
    hp_status st = hp__moe_bwd_check(l, ws, T, g, err);
    if (st == HP_OK && (ws->share ? ws->share : ws)->last_fwd != ws)
        st = hp_err_set(err, HP_ERR_INPUT, "MoE backward of layer %lld: the EP buffers it shares hold another "
                        "layer's forward since its own; run its forward again first", (long long)l->layer);
    if (st == HP_OK && T * K > ep->send_rows)
        st = hp_err_set(err, HP_ERR_INPUT, "MoE backward: %lld local tokens exceed the %lld the EP runtime's buffers "
                        "hold in one exchange (it was made for dispatch chunks of %lld tokens)", (long long)T,
                        (long long)(ep->send_rows / K), (long long)ep->Th);
    if (st == HP_OK) st = hp__moe_bwd_get(ws, &ep->shape, &b, err);
    if ((st = hp_comm_agree(ep->comm, st, err)) != HP_OK) return st;

    int64_t n_send = hp_moe_dispatch_prepare(ws->topk_idx, ws->fwd_keep ? ws->keep : NULL, T, K, 0, E,
                                             ep->counts_all, ep->offsets_all, ws->row_slot, ws->slot_row);
    memcpy(ep->cnt_send, ep->counts_all, (size_t)E * sizeof(int64_t));
    if ((st = hp_comm_alltoall(ep->comm, ep->cnt_send, (size_t)L * sizeof(int64_t), ep->cnt_recv, err))) return st;
    int64_t bytes = 0;
    int64_t n_recv = plan_exchange(ep, ep->cnt_send, ep->cnt_recv, ep->sc, ep->sd, ep->rc, ep->rd, &bytes);
    count_local(ep, ep->cnt_recv);
    if (n_recv > recv_max)
        st = hp_err_set(err, HP_ERR_INPUT,
                        "MoE backward: EP rank %d would receive %lld rows but its buffers hold %lld; a peer holds "
                        "more tokens than this rank's runtime was created for",
                        ep->rank, (long long)n_recv, (long long)recv_max);
    if ((st = hp_comm_agree(ep->comm, st, err)) != HP_OK) return st;

    /* Dispatch plan: x rows into xrows, then dOut rows into b->drows (both expert-major over sources). */
    hp_moe_gather(x, H, K, ws->row_slot, n_send, ep->send);
    if ((st = hp_comm_alltoallv(ep->comm, ep->send, ep->sc, ep->sd, ep->recv, ep->rc, ep->rd, err))) return st;
    reorder_buf(ep, ep->cnt_recv, ep->recv, ep->xrows, true);
    hp__moe_dout_rows(ws->row_slot, n_send, ws->topk_w, K, dy, H, ep->send);
    if ((st = hp_comm_alltoallv(ep->comm, ep->send, ep->sc, ep->sd, ep->recv, ep->rc, ep->rd, err))) return st;
    reorder_buf(ep, ep->cnt_recv, ep->recv, b->drows, true);

    /* xrows becomes d(rows), b->drows the outputs O. */
    st = hp__moe_experts_backward(l, b, ep->xrows, b->drows, ep->cnt_local, g, err);
    if ((st = hp_comm_agree(ep->comm, st, err)) != HP_OK) return st;

    /* Return plan: d(rows) into dx, then O into dw. */
    if (T > 0) memset(dx, 0, (size_t)(T * H) * sizeof(float));
    reorder_buf(ep, ep->cnt_recv, ep->recv, ep->xrows, false);
    if ((st = hp_comm_alltoallv(ep->comm, ep->recv, ep->rc, ep->rd, ep->send, ep->sc, ep->sd, err))) return st;
    if (T > 0) hp__moe_rows_to_dx(ep->send, ws->slot_row, T, K, H, dx);
    reorder_buf(ep, ep->cnt_recv, ep->recv, b->drows, false);
    if ((st = hp_comm_alltoallv(ep->comm, ep->recv, ep->rc, ep->rd, ep->send, ep->sc, ep->sd, err))) return st;
    if (T > 0) {
        hp__moe_rows_to_dw(ep->send, ws->slot_row, T, K, H, dy, b->dw);
        hp__moe_router_backward(l, ws, b, x, T, dx, g);
        st = hp__moe_shared_backward(l, b, x, T, dy, dx, g, err);
    }
    return hp_comm_agree(ep->comm, st, err);
}
