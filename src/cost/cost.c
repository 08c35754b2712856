/*
 * cost.c — the dry executor: what a plan costs each rank, without weights, data or MPI (docs/cost.md).
 *
 * For every rank of the mesh it walks the forward hp_runner_forward executes (embed, per layer input norm,
 * attention with its CP K/V all-gathers, residual, post norm, MLP or MoE, residual, final norm, head, loss,
 * the logits and routing gathers to rank 0), carrying only each activation's global dims and layout. Every
 * transition is asked of hp__lower_axis, the function the runtime's redistribution itself lowers with, for that
 * rank's coordinates: the communication is the runtime's by construction, boundary by boundary, and an
 * override that changes a contract changes the cost. A plan the runtime refuses gets its weights only, with
 * the runtime's reason (hp_cost.refused). The MoE token exchange is counted as the EP runtime counts it (rows
 * sent plus rows received in the dispatch, times H·4 bytes), from a given routing or the balanced router of
 * spec §10.4.
 */
#include "exec/prog.h"
#include "kernels/backward.h"
#include "kernels/modules.h"

#include "hyperpar/comm.h"
#include "hyperpar/cost.h"
#include "hyperpar/linalg.h"
#include "hyperpar/moe.h"
#include "hyperpar/shard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void hp_cost_model_default(hp_cost_model *m)
{
    *m = (hp_cost_model){.grad_bytes = 4, .master_bytes = 4, .optim_bytes = 8, .zero = 0, .kv_bytes = 2};
    hp_cost_model_hardware(m, hp_cost_hardware_find("cpu")); /* the rates of hyperpar's own runtime */
    m->hw = NULL;
}

void hp_cost_opts_default(hp_cost_opts *o)
{
    memset(o, 0, sizeof *o);
    o->B = 1;
    o->S = 4096;
    hp_cost_model_default(&o->mdl);
}

/* Megatron-LM's --micro-batch-size defaults to 1 and its global batch must divide into micro-batches of it on every
 * replica; a batch dp does not divide keeps the older meaning, one micro-batch of each replica's (uneven) rows. */
int64_t hp_cost_default_micro_batch(const hp_cost_opts *o, int64_t dp)
{
    if (!o->train) return 0;
    if (o->micro_batch > 0) return o->micro_batch;
    return dp > 0 && o->B % dp == 0 ? 1 : 0;
}

uint64_t hp_cost_usable(const hp_cost_model *m, uint64_t mem_per_rank)
{
    return mem_per_rank > m->mem_reserve ? mem_per_rank - m->mem_reserve : 0;
}

#include "cost/cost_int.h"

/* The decoder layer a module's fqn lies in ("model.layers.7.mlp" -> 7), or -1. */
static int64_t layer_of(const char *fqn)
{
    const char *q = strstr(fqn, "layers.");
    if (!q) return -1;
    char *end;
    long long l = strtoll(q + 7, &end, 10);
    return end != q + 7 && l >= 0 ? (int64_t)l : -1;
}

static int mask_of(const hp_nplace *pl)
{
    int mask = 0;
    for (int a = 0; a < HP_AXIS_COUNT; a++) {
        hp_pl_kind kd = (hp_pl_kind)pl->ax[a].kind;
        if (kd != HP_PL_S && kd != HP_PL_S2) continue;
        mask |= a == HP_AXIS_TP ? M_TP : a == HP_AXIS_CP ? M_CP : M_EP;
    }
    return mask;
}

/* The frozen tensors of spec ps of boundary b (its ep_stack's sources, or itself) into k->frozen_*bytes[mask], each
 * parameter once (seen[i]: counted already). */
static void frozen_of(hp_cost_plan *k, const hp_boundary *b, const hp_param_spec *ps, int mask, bool expert, bool *seen,
                      char *full, size_t cap)
{
    const hp_model *m = k->m;
    int n = 1;
    const hp_ep_stack *st = NULL;
    for (int q = 0; q < b->n_ep_stack && !st; q++)
        if (!strcmp(b->ep_stack[q].name, ps->rel)) st = &b->ep_stack[q], n = st->n_src;
    for (int e = 0; e < n; e++) {
        snprintf(full, cap, "%s%s%s", b->fqn, b->fqn[0] ? "." : "", st ? st->src[e] : ps->rel);
        const hp_param *par = hp_model_find_param(m, full);
        if (!par || seen[par - m->params]) continue;
        seen[par - m->params] = true;
        if (par->trainable) continue;
        k->frozen_bytes[mask] += par->nbytes;
        if (expert) k->frozen_expert_bytes[mask] += par->nbytes;
    }
}

/* k->expert_bytes from the plan's boundaries (one pass over their parameter specs); the frozen parameters' bytes
 * too, those no boundary declares (written whole to every rank) by mask 0. */
bool hp__cost_experts_scan(hp_cost_plan *k)
{
    bool *seen = hp_calloc(k->m->n_params ? k->m->n_params : 1, sizeof *seen);
    if (!seen) return false;
    const hp_model *m = k->m;
    const hp_plan *p = k->p;
    char full[1200];
    for (size_t i = 0; i < p->n_boundaries; i++) {
        const hp_boundary *b = &p->boundaries[i];
        for (int s = 0; s < b->n_params; s++) {
            const hp_param_spec *ps = &b->params[s];
            int mask = mask_of(&ps->pl);
            uint64_t bytes = 0;
            bool expert = (mask & M_EP) != 0, stacked = false;
            for (int q = 0; q < b->n_ep_stack && !stacked; q++) {
                if (strcmp(b->ep_stack[q].name, ps->rel)) continue;
                stacked = expert = true;
                for (int e = 0; e < b->ep_stack[q].n_src; e++) {
                    snprintf(full, sizeof full, "%s%s%s", b->fqn, b->fqn[0] ? "." : "", b->ep_stack[q].src[e]);
                    const hp_param *par = hp_model_find_param(m, full);
                    if (par) bytes += par->nbytes;
                }
            }
            if (!stacked) {
                snprintf(full, sizeof full, "%s%s%s", b->fqn, b->fqn[0] ? "." : "", ps->rel);
                const hp_param *par = hp_model_find_param(m, full);
                if (!par) continue;
                if (p->roles && p->roles[par - m->params] == HP_ROLE_MOE_EXPERT) expert = true;
                if (p->roles && p->roles[par - m->params] == HP_ROLE_EMBED && !m->cfg.tie_word_embeddings)
                    k->embed_bytes[mask] += par->nbytes;
                bytes = par->nbytes;
            }
            if (expert) k->expert_bytes[mask] += bytes;
            frozen_of(k, b, ps, mask, expert, seen, full, sizeof full);
            if (k->layer_bytes) {
                int64_t l = layer_of(b->fqn);
                k->layer_bytes[l >= 0 && l < k->n_layers ? l : k->n_layers][mask] += bytes;
            }
        }
    }
    for (size_t i = 0; seen && i < m->n_params; i++) /* uncovered: whole on every rank */
        if (!seen[i] && !m->params[i].trainable) k->frozen_bytes[0] += m->params[i].nbytes;
    free(seen);
    return true;
}

/* The EP index that holds each expert (the exchange's receivers). */
hp_status hp__cost_owners(walk *w)
{
    if (w->E <= 0 || !w->m->family || !hp_family_is_moe(w->m->family)) return HP_OK;
    if (!(w->owner = hp_calloc((size_t)w->E * 2, sizeof *w->owner)))
        return hp_err_set(w->err, HP_ERR_NOMEM, "out of memory");
    for (int64_t q = 0; q < w->ep; q++) {
        int64_t first, n;
        hp_ep_local_experts(w->E, w->ep, q, &first, &n);
        for (int64_t e = first; e < first + n && e < w->E; e++) w->owner[e] = q;
    }
    w->ecnt = w->owner + w->E;
    return HP_OK;
}

/* ---- the walk of one rank ---- */


static int64_t count_of(walk *w, const dact *a, int64_t tp_i, int64_t cp_i)
{
    int64_t c = 1, lo, n;
    for (int d = 0; d < 3; d++) {
        hp__lay_range(&w->pos, &a->lay, a->g, d, tp_i, cp_i, &lo, &n);
        c = ck_mul(w, "activation blocks", c, n);
    }
    return c;
}

static int64_t local_count(walk *w, const dact *a)
{
    return count_of(w, a, w->pos.r[HP__TP], w->pos.r[HP__CP]);
}

/* ---- the workspace: the runner's buffers, in the order its forward sizes them ---- */

/* The counter of hp__mem_count: a buffer of old bytes becomes one of nw bytes. */
static void mem_count(walk *w, uint64_t old, uint64_t nw)
{
    w->m_cur = ck_addu(w, "workspace", w->m_cur - old, nw);
    if (w->m_cur > w->m_peak) w->m_peak = w->m_cur;
}

/* A buffer kept across calls grown to n floats (at least 1), as reserve/scratch/rbuf grow theirs. */
static void grow(walk *w, int64_t *cap, int64_t n)
{
    if (n < 1) n = 1;
    if (n <= *cap) return;
    mem_count(w, ck_bytes(w, "workspace", *cap, sizeof(float)), ck_bytes(w, "workspace", n, sizeof(float)));
    *cap = n;
}

static void act_grow(walk *w, dact *a)
{
    grow(w, &a->cap, local_count(w, a));
}

/* The walked rank's local extent of a's dim d. */
static int64_t local_dim(walk *w, const dact *a, int d)
{
    int64_t lo, n;
    hp__lay_range(&w->pos, &a->lay, a->g, d, w->pos.r[HP__TP], w->pos.r[HP__CP], &lo, &n);
    return n;
}

/* A scratch of bytes held only while one step runs (attention's scores, the loss's sums). */
static void transient(walk *w, uint64_t bytes)
{
    mem_count(w, 0, bytes);
    mem_count(w, bytes, 0);
}

/* Whether the group of rank on a mesh axis spans nodes (ranks_per_node R: node = rank / R; 0: one node). */
bool hp__cost_axis_spans_nodes(const walk *w, int64_t rank, const char *axis)
{
    int64_t R = w->o->mdl.ranks_per_node;
    const hp_mesh *m = w->mesh;
    if (R <= 0 || hp_mesh_world(m) <= R) return false;
    int64_t lo = hp_mesh_group_rank(m, rank, axis, 0);
    return lo / R != hp_mesh_group_rank(m, rank, axis, hp_mesh_size(m, axis) - 1) / R;
}

/* Whether the walked rank's group on ax passes its collectives through the communicator's shared window
 * (comm_mpi.c's shm_on): two ranks or more, on one node. */
static bool window_on(const walk *w, int ax)
{
    return w->pos.n[ax] > 1 && !hp__cost_axis_spans_nodes(w, w->lrank, ax == HP__TP ? "tp" : "cp");
}

/* A call of `bytes` per rank through ax's window: the window grows to the largest. */
static void window_call(walk *w, int ax, uint64_t bytes)
{
    w->win_used[ax] = true;
    if (bytes > w->win_max[ax]) w->win_max[ax] = bytes;
}

/* The buffers of one axis's transition (one_axis in redist.c): the result goes into the spare activation, sized
 * for the new layout; an all-gather packs through the two scratch blocks unless its blocks are even and in order
 * (hp__gather_in_place): then through the group's shared window on one node (window_on), else none along an
 * outermost dim and the peers' blocks through scratch 1 otherwise; a reduce-scatter through scratch 0 unless
 * outermost, and through the window too in a group of two on one node; the source's buffer becomes the spare. */
static void trans_buffers(walk *w, dact *a, int ax, hp__low lw, hp_placement dst)
{
    if (lw.kind == HP__LOW_NONE || lw.kind == HP__LOW_REFUSE || lw.kind == HP__LOW_ALL_REDUCE) return;
    dact b = *a;
    b.lay.ax[ax] = dst;
    b.cap = w->c_spare;
    act_grow(w, &b);
    int d = lw.d;
    int64_t outer = 1, inner = 1, gn = w->pos.n[ax];
    for (int i = 0; i < 3; i++)
        if (i != d) {
            int64_t n = local_dim(w, a, i);
            if (i < d) outer = ck_mul(w, "workspace", outer, n);
            else inner = ck_mul(w, "workspace", inner, n);
        }
    const hp__lay *sh = lw.kind == HP__LOW_ALL_GATHER ? &a->lay : &b.lay; /* the layout the members' blocks cut */
    int64_t mx = 0, n0 = 0, *lo = calloc((size_t)gn * 2, sizeof *lo), *n = lo ? lo + gn : NULL;
    if (!lo) { /* out of memory for 2·gn integers: the figure is unknown, reported as an overflow is */
        w->ws_ovf = true;
        return;
    }
    for (int64_t i = 0; i < gn; i++) {
        int64_t t = ax == HP__TP ? i : w->pos.r[HP__TP], c = ax == HP__CP ? i : w->pos.r[HP__CP];
        hp__lay_range(&w->pos, sh, a->g, d, t, c, &lo[i], &n[i]);
        mx = n[i] > mx ? n[i] : mx;
    }
    n0 = n[0];
    bool in_place = hp__gather_in_place(lo, n, gn), win = window_on(w, ax);
    free(lo);
    if (lw.kind == HP__LOW_ALL_GATHER) {
        int64_t blk = ck_mul3(w, "workspace", outer, mx, inner);
        if (in_place && win) window_call(w, ax, ck_bytes(w, "workspace", blk, sizeof(float)));
        else if (!(in_place && outer == 1)) {
            if (!in_place) grow(w, &w->c_s0, blk);
            grow(w, &w->c_s1, ck_mul(w, "workspace", blk, gn));
        }
    } else if (lw.kind == HP__LOW_REDUCE_SCATTER) {
        int64_t blk = ck_mul3(w, "workspace", outer, n0, inner);
        if (gn == 2 && win) window_call(w, ax, ck_bytes(w, "workspace", blk, sizeof(float)));
        if (outer != 1) grow(w, &w->c_s0, ck_mul(w, "workspace", blk, gn));
    }
    w->c_spare = a->cap;
    a->cap = b.cap;
}

/* The rotary tables of the rows [pos0, pos0 + n) (rope_for: rebuilt when they change), (n·rot/2 + 1) floats each. */
static void rope_tables(walk *w, int64_t pos0, int64_t n)
{
    if (w->rope_b && w->rope_pos0 == pos0 && w->rope_n == n) return;
    mem_count(w, ck_addu(w, "workspace", w->rope_b, w->rope_b), 0);
    w->rope_b = ck_bytes(w, "workspace", ck_add(w, "workspace", ck_mul(w, "workspace", n, w->g->cfg.rot / 2), 1),
                         sizeof(float));
    mem_count(w, 0, ck_addu(w, "workspace", w->rope_b, w->rope_b));
    w->rope_pos0 = pos0, w->rope_n = n;
}

/* Whether a sparse layer of these shapes makes an EP runtime of its own: always in training (one per layer, each
 * backward reads its own), else only the first layer of each shape (the others borrow its buffers). */
static bool ep_own_runtime(walk *w, const char *fqn, int64_t I, int64_t sI)
{
    if (w->o->train) return true;
    char gate[160];
    snprintf(gate, sizeof gate, "%s.shared_expert_gate.weight", fqn);
    int64_t key[3] = {I, sI, sI > 0 && hp_model_find_param(w->m, gate) ? 1 : 0};
    for (int i = 0; i < w->n_ep_shape; i++)
        if (!memcmp(w->ep_shape[i], key, sizeof key)) return false;
    if (w->n_ep_shape < HP__COST_EP_SHAPES) memcpy(w->ep_shape[w->n_ep_shape++], key, sizeof key);
    return true;
}

/* hp_moe_ep_workspace_bytes of a sparse layer's EP runtime: the sum of its arrays (hp_moe_ep_layout, the table the
 * runtime allocates by). T the most rows any rank of the group holds, in the runner's dispatch chunks (moe_chunks:
 * hp__mlp_chunk_count; training one); with C > 1 chunks the runtime is bounded (hp_moe_ep_create_bounded). P the EP
 * group, L = E / P local experts, I and sI the rank's expert widths (fqn: the block). */
static hp_moe_ep_shape ep_shape(walk *w, const char *fqn, int64_t T, int64_t I, int64_t sI)
{
    char gate[160];
    snprintf(gate, sizeof gate, "%s.shared_expert_gate.weight", fqn);
    int64_t C = hp__mlp_chunk_count(T, w->o->train);
    return (hp_moe_ep_shape){.max_tokens = T, .n_hidden = w->g->cfg.H, .n_experts = w->E, .top_k = w->K,
                             .n_local = w->E / w->ep, .d_expert = I, .d_shared = sI,
                             .shared_gate = sI > 0 && hp_model_find_param(w->m, gate), .ep_size = w->ep,
                             .chunks = C, .bounded = C > 1};
}

static uint64_t ep_workspace(walk *w, const char *fqn, int64_t T, int64_t I, int64_t sI)
{
    hp_moe_ep_shape s = ep_shape(w, fqn, T, I, sI);
    hp_moe_ep_array a[HP_MOE_ARR_COUNT];
    uint64_t bytes;
    if (!hp_moe_ep_layout_bytes(a, hp_moe_ep_layout(&s, a), &bytes)) mark(w, "MoE workspace");
    return bytes;
}

/* Rank 0's receive of hp__gather_full for a: the blocks of every other first holder (bytes). */
static uint64_t gathered_recv(walk *w, const dact *a)
{
    const hp_mesh *mesh = w->mesh;
    uint64_t tot = 0;
    for (int64_t r = 1; r < hp_mesh_world(mesh); r++) { /* rank 0 places its own block straight from a */
        int64_t t = hp_mesh_coord(mesh, r, "tp"), c = hp_mesh_coord(mesh, r, "cp"), nb, dpi;
        hp_mesh_batch_index(mesh, r, &nb, &dpi, NULL);
        if ((a->lay.ax[HP__TP].kind == HP_PL_R && t) || (a->lay.ax[HP__CP].kind == HP_PL_R && c)) continue;
        int64_t g[3] = {w->dp_rows[dpi + 1] - w->dp_rows[dpi], a->g[1], a->g[2]}, lo, n, cnt = 1;
        for (int d = 0; d < 3; d++) {
            hp__lay_range(&w->pos, &a->lay, g, d, t, c, &lo, &n);
            cnt = ck_mul(w, "workspace", cnt, n);
        }
        tot = ck_addu(w, "workspace", tot, ck_bytes(w, "workspace", cnt, sizeof(float)));
    }
    return tot;
}

/* hp__gather_full's buffers on rank 0: the whole [B, S_pad, X] + 1 floats and the receive block in scratch 1;
 * returns the bytes of the whole. */
static uint64_t gather_buffers(walk *w, const dact *a)
{
    if (w->lrank != 0) return 0; /* the stage's first rank */
    uint64_t full = ck_bytes(w, "workspace", ck_add(w, "workspace", ck_mul3(w, "workspace", w->B_all, a->g[1],
                                                                            a->g[2]), 1), sizeof(float));
    mem_count(w, 0, full);
    grow(w, &w->c_s1, (int64_t)(gathered_recv(w, a) / sizeof(float)) + 1);
    return full;
}

static void track(walk *w, const dact *a)
{
    int64_t n = local_count(w, a);
    if (a->g[2] == w->g->cfg.H) w->w_hidden = n > w->w_hidden ? n : w->w_hidden;
    else w->w_wide = n > w->w_wide ? n : w->w_wide;
}

/* (n-1)/n of b, without the product passing 64 bits. */
static uint64_t share(uint64_t b, uint64_t n)
{
    return b / n * (n - 1) + b % n * (n - 1) / n;
}

/* The bytes the walked rank sends over links for one collective of `bytes` (what it puts in, as hp_run_stats
 * counts) in a group of n, under the ring algorithms (docs/cost.md "Wire bytes"). An all-gather's input is the
 * rank's block of the n·bytes result, and the ring forwards n-1 blocks; a reduce-scatter's input is the whole
 * tensor, and the ring sends n-1 of its n chunks; an all-reduce is the two; an all-to-all keeps its own share of
 * what it sends (the EP exchange counts the dispatch and the return together); a gather's senders send their
 * block to rank 0, which sends nothing. */
static uint64_t wire_of(walk *w, hp_run_coll kind, int64_t group, uint64_t bytes)
{
    if (group <= 1) return 0;
    uint64_t n = (uint64_t)group;
    switch (kind) {
    case HP_RUN_ALL_GATHER: return ck_bytes(w, "wire bytes", (int64_t)(n - 1), bytes);
    case HP_RUN_REDUCE_SCATTER: return share(bytes, n);
    case HP_RUN_ALL_REDUCE: return ck_addu(w, "wire bytes", share(bytes, n), share(bytes, n));
    case HP_RUN_ALL_TO_ALL: return share(bytes, n);
    case HP_RUN_GATHER: return w->lrank == 0 ? 0 : bytes; /* the gather's root: the stage's first rank */
    default: return 0;
    }
}

hp_status hp__cost_add_event(walk *w, int32_t layer, const char *where, const char *step, hp_run_coll kind,
                           const char *axis, int64_t group, int64_t calls, uint64_t bytes, bool est)
{
    hp_cost_rank *r = w->cr;
    if (r->n_ev == w->ev_cap) {
        size_t nc = w->ev_cap ? w->ev_cap * 2 : 64;
        hp_cost_event *ne = realloc(r->ev, nc * sizeof *ne);
        if (!ne) return hp_err_set(w->err, HP_ERR_NOMEM, "out of memory");
        r->ev = ne;
        w->ev_cap = nc;
    }
    uint64_t wire = wire_of(w, kind, group, bytes);
    r->ev[r->n_ev++] = (hp_cost_event){.layer = layer, .where = where, .step = step, .kind = kind, .axis = axis,
                                       .group = (int32_t)group, .calls = calls, .bytes = bytes, .estimated = est,
                                       .chunk = w->cur_chunk, .wire_bytes = wire};
    r->bytes[kind] = ck_addu(w, "collective bytes", r->bytes[kind], bytes);
    r->calls[kind] += (uint64_t)calls;
    if (group > 1) r->sent_bytes = ck_addu(w, "collective bytes", r->sent_bytes, bytes);
    r->wire_bytes = ck_addu(w, "wire bytes", r->wire_bytes, wire);
    uint64_t all = 0; /* the reports print the sum over kinds: it must fit too */
    for (int k = 0; k < HP_RUN_COLL_COUNT; k++) all = ck_addu(w, "collective bytes", all, r->bytes[k]);
    return HP_OK;
}

/* a -> to, axis by axis (tp first), as hp__redistribute does; each collective becomes an event. */
static hp_status trans(walk *w, dact *a, const hp__lay *to, int32_t layer, const char *where, const char *step)
{
    static const char *const axn[HP__NAX] = {"tp", "cp"}; /* the event's axis */
    for (int ax = 0; ax < HP__NAX; ax++) {
        hp__low lw = hp__lower_axis(&w->pos, &a->lay, a->g, ax, to->ax[ax]);
        if (lw.kind == HP__LOW_REFUSE) {
            char what[300];
            hp__lay t2 = a->lay;
            t2.ax[ax] = to->ax[ax];
            snprintf(what, sizeof what, "boundary %s (%s)", where, step);
            return hp__refuse(&a->lay, &t2, ax, what, lw.why, w->err);
        }
        hp_run_coll k = hp__low_coll(lw.kind);
        if (lw.kind != HP__LOW_NONE && lw.kind != HP__LOW_ALL_REDUCE) { /* a new buffer; the source one is spare */
            int64_t src = local_count(w, a);
            w->w_spare = src > w->w_spare ? src : w->w_spare;
        }
        if (lw.bytes == UINT64_MAX && !w->ovf) w->ovf = "collective bytes"; /* saturated (redist.c) */
        trans_buffers(w, a, ax, lw, to->ax[ax]);
        if (lw.kind == HP__LOW_ALL_GATHER) { /* its scratch blocks as trans_buffers sized them */
            w->w_s0 = w->c_s0 > w->w_s0 ? w->c_s0 : w->w_s0;
            w->w_s1 = w->c_s1 > w->w_s1 ? w->c_s1 : w->w_s1;
        } else if (lw.kind == HP__LOW_REDUCE_SCATTER && !(w->pos.n[ax] == 2 && window_on(w, ax))) {
            int64_t blk = (int64_t)(lw.bytes / sizeof(float)); /* MPI's: the window's is counted apart */
            if (blk > w->w_s1) w->w_s1 = blk;
        }
        hp_status st = HP_OK;
        if (k < HP_RUN_COLL_COUNT && w->ev_times > 0)
            st = hp__cost_add_event(w, layer, where, step, k, axn[ax], w->pos.n[ax], w->ev_times,
                           ck_bytes(w, "collective bytes", w->ev_times, lw.bytes), false);
        if (st != HP_OK) return st;
        a->lay.ax[ax] = to->ax[ax];
        track(w, a);
    }
    return HP_OK;
}

/* The step's entry: its input moved to the layout it runs on. */
static hp_status enter(walk *w, const hp__step *s, dact *a)
{
    return s->c.has_in ? trans(w, a, &s->run, s->layer, s->c.fqn, "entry") : HP_OK;
}

/* The step's exit: its output moved to the layout it leaves in. */
static hp_status leave(walk *w, const hp__step *s, dact *a)
{
    return s->c.has_out ? trans(w, a, &s->leave, s->layer, s->c.fqn, "exit") : HP_OK;
}

/* The step's output on the rows of its input t, laid out as the program says. */
static void output_of(const hp__step *s, const dact *t, dact *out)
{
    out->g[0] = t->g[0], out->g[1] = t->g[1], out->g[2] = s->X;
    out->lay = s->out;
}

/* The token rows [b, s] rank (tp_i, cp_i, dp_i) holds of an activation laid out lay. */
static void rows_of(const walk *w, const hp__lay *lay, int64_t dp_i, int64_t tp_i, int64_t cp_i, int64_t *b0,
                    int64_t *nb, int64_t *s0, int64_t *ns)
{
    int64_t g[3] = {w->dp_rows[dp_i + 1] - w->dp_rows[dp_i], w->S_pad, w->g->cfg.H};
    hp__lay_range(&w->pos, lay, g, 0, tp_i, cp_i, b0, nb);
    hp__lay_range(&w->pos, lay, g, 1, tp_i, cp_i, s0, ns);
    *b0 += w->dp_rows[dp_i];
}

/* The rank holding EP index i of rank's EP group (hp_mesh_ep_index's groups): the ep coordinate set to i on an
 * explicit ep axis, else the i-th of the group's consecutive ranks. */
int64_t hp__cost_ep_member(const hp_mesh *m, int64_t P, int64_t rank, int64_t i)
{
    return m->ep_axis ? hp_mesh_group_rank(m, rank, "ep", i) : rank / P * P + i;
}

/* Slots of n that the balanced router (spec §10.4; hp_moe_route_balance) sends to EP index q of P, kept under a
 * capacity of cap per expert: slot s goes to expert (s mod P)·L + (s div P) mod L, so EP index q gets the slots
 * s ≡ q (mod P), and its local expert j every L-th of them. */
static int64_t balanced_to(int64_t n, int64_t P, int64_t L, int64_t q, int64_t cap)
{
    int64_t nq = n > q ? (n - q - 1) / P + 1 : 0;
    if (cap == INT64_MAX) return nq;
    int64_t kept = 0;
    for (int64_t j = 0; j < L; j++) {
        int64_t c = nq > j ? (nq - j - 1) / L + 1 : 0;
        kept += c < cap ? c : cap;
    }
    return kept;
}

/* capacity = ceil(factor·T·K / E) per expert (hp_moe_capacity), or none. */
static int64_t capacity_of(const walk *w, const hp__step *y, int64_t T)
{
    if (!(y->cf > 0) || T <= 0 || w->E <= 0) return INT64_MAX;
    double c = y->cf * (double)T * (double)w->K / (double)w->E;
    if (!(c < 9.2e18)) return INT64_MAX; /* past int64: no expert can reach it */
    int64_t cap = (int64_t)c;
    return (double)cap < c ? cap + 1 : cap;
}

/* The slots member `rank` sends to EP index q (all q when q < 0: the sum), kept under the capacity factor. */
static int64_t member_sends(walk *w, const hp__step *y, int64_t layer, const hp__lay *lay, int64_t rank,
                            int64_t q, bool *est)
{
    const hp_mesh *mesh = w->mesh;
    int64_t b0, nb, s0, ns, K = w->K, E = w->E, P = w->ep, L = E / P, n_blk, blk;
    hp_mesh_batch_index(mesh, rank, &n_blk, &blk, NULL);
    rows_of(w, lay, blk, hp_mesh_coord(mesh, rank, "tp"), hp_mesh_coord(mesh, rank, "cp"), &b0, &nb, &s0, &ns);
    int64_t T = ck_mul(w, "MoE rows", nb, ns), cap = capacity_of(w, y, T), n = 0;
    const int32_t *rt = w->o->routing && layer < w->o->routing_layers ? w->o->routing[layer] : NULL;
    if (!rt) { /* the balanced router, in closed form */
        *est = true;
        int64_t slots = ck_mul(w, "MoE routed slots", T, K);
        for (int64_t d = q < 0 ? 0 : q; d < (q < 0 ? P : q + 1); d++) n += balanced_to(slots, P, L, d, cap);
        return n;
    }
    int64_t *ecnt = w->ecnt;
    memset(ecnt, 0, (size_t)E * sizeof *ecnt);
    for (int64_t t = 0; t < T; t++) {
        int64_t b = b0 + t / ns, s = s0 + t % ns;
        for (int64_t k = 0; k < K; k++) {
            int64_t e;
            if (s < w->o->S) {
                e = rt[(b * w->o->S + s) * K + k];
            } else { /* a padded position (CP): its routing is not in the file; balanced */
                int64_t slot = t * K + k;
                *est = true;
                e = (slot % P) * L + (slot / P) % L;
            }
            ecnt[e]++;
        }
    }
    for (int64_t e = 0; e < E; e++)
        if (q < 0 || w->owner[e] == q) n += ecnt[e] < cap ? ecnt[e] : cap;
    return n;
}

static hp_status moe_exchange(walk *w, const hp__step *y, int64_t layer, const dact *t)
{
    const hp_mesh *mesh = w->mesh;
    int64_t me = w->lrank, P = w->ep, grp, idx;
    hp_mesh_ep_index(mesh, P, me, &grp, &idx);
    bool est = false;
    int64_t sent = member_sends(w, y, layer, &t->lay, me, -1, &est), recv = 0;
    if (P == 1) recv = sent;
    for (int64_t i = 0; i < P && P > 1; i++) /* the members of this rank's EP group */
        recv = ck_add(w, "MoE exchange", recv, member_sends(w, y, layer, &t->lay, hp__cost_ep_member(mesh, P, me, i), idx, &est));
    int64_t H = w->g->cfg.H, T = local_count(w, t) / H;
    /* the rank's widths: its tp block of each expert's (hp_moe_load_opts.tp_size) */
    int64_t tr = y->split ? w->pos.r[HP__TP] : 0, tn = y->split ? w->tp : 1;
    int64_t mI = w->mI * (tr + 1) / tn - w->mI * tr / tn, sI = w->sI * (tr + 1) / tn - w->sI * tr / tn;
    /* the EP runtime's buffers as touched, in C dispatch chunks (ep_workspace's; training: one): send (the rows
     * sent) and recv (received) in two stages of a chunk's rows, xrows and the expert activations (one chunk's
     * received rows, · H and · 2I), the router's f64 copies (all rows), the shared expert's scratch (a chunk) and
     * its overlap output (all rows); a chunk taken as the MLP's longest (hp__mlp_chunk_rows, at most 1279 rows,
     * constant at large T) where the runtime's is ceil(T / C). Inference runs every sparse layer on one runtime:
     * the largest counts, once. */
    const char *mb = "MoE buffers";
    int64_t Tc = hp__mlp_chunk_rows(T, w->o->train), st = Tc < T ? 2 : 1; /* a chunk's rows, about the runner's */
    double f = T > 0 ? (double)Tc / (double)T : 1.0;
    int64_t th = ck_mul(w, mb, T, H), cs = (int64_t)((double)sent * f), cr = (int64_t)((double)recv * f), terms[6] = {
        ck_mul3(w, mb, cs, H, st), ck_mul3(w, mb, cr, H, st + 1), ck_mul3(w, mb, cr, 2, mI),
        sI > 0 ? ck_add(w, mb, th, ck_mul3(w, mb, Tc, 2, sI)) : 0,
        ck_mul(w, mb, 2, ck_add(w, mb, th, ck_mul(w, mb, T, w->E))), 0};
    int64_t moe = 0;
    for (int i = 0; i < 6; i++) moe = ck_add(w, mb, moe, terms[i]);
    w->w_moe = w->o->train ? ck_add(w, mb, w->w_moe, moe) : moe > w->w_moe ? moe : w->w_moe;
    w->cr->flops += 2.0 * (double)T * (double)H * (double)w->E + 6.0 * (double)recv * (double)H * (double)mI +
                    6.0 * (double)T * (double)H * (double)sI;
    w->cr->ep_estimated = w->cr->ep_estimated || est;
    /* decode reads only the local experts some slot reaches: balanced, every L-th received slot is one expert's */
    int64_t Lx = w->E / P > 0 ? w->E / P : 1;
    w->touched += (double)(recv < Lx ? recv : Lx) / (double)Lx;
    w->n_sparse++;
    return hp__cost_add_event(w, (int32_t)layer, y->c.fqn, "EP dispatch+return", HP_RUN_ALL_TO_ALL, "ep", P, 2,
                     ck_bytes(w, "MoE exchange", ck_mul(w, "MoE exchange",
                                                                    ck_add(w, "MoE exchange", sent, recv), H),
                              sizeof(float)),
                     est);
}

/* The positions of layer l's KV cache a rank holds for one sequence of n positions: a sliding-window layer keeps
 * its last W (hp__rcfg.window), and cp splits them, the most-loaded member holding ceil(n / cp). */
int64_t hp__cost_cache_positions(const walk *w, int32_t l, int64_t n)
{
    int64_t W = l >= 0 && l < w->g->cfg.L && w->g->cfg.window ? w->g->cfg.window[l] : 0;
    if (W > 0 && W < n) n = W;
    return n / w->cp + (n % w->cp != 0);
}

static hp_status attention(walk *w, const hp__step *y, dact *t, dact *out)
{
    const hp__rcfg *c = &w->g->cfg;
    const hp_model_config *mc = &w->m->cfg;
    int32_t l = y->layer;
    bool mla = y->op == HP__OP_MLA;
    hp_status st = enter(w, y, t);
    if (st != HP_OK) return st;
    int64_t rows = local_count(w, t) / c->H, H = c->H;
    dact k = {{t->g[0], t->g[1], y->kw}, {{hp_pl_r(), t->lay.ax[HP__CP]}}, w->c_k};
    dact v = {{t->g[0], t->g[1], y->vw}, {{hp_pl_r(), t->lay.ax[HP__CP]}}, w->c_v};
    /* the runner's buffers: q and the attention output (MLA: and its latent block), K and V, the rotary tables */
    const char *wb = "workspace";
    int64_t sq = local_dim(w, t, 1), tlo, tn;
    hp__lay_range(&w->pos, &t->lay, t->g, 1, w->pos.r[HP__TP], w->pos.r[HP__CP], &tlo, &tn);
    int64_t bw[HP__NBUF];
    hp__step_row_widths(w->g, y, w->pos.r[HP__TP], bw);
    for (int i = 0; i < HP__NBUF; i++)
        if (bw[i]) grow(w, &w->c_buf[i], ck_mul(w, wb, rows, bw[i]));
    if (mla) { /* mla_apply builds its rotary tables before K and V; attn_apply after */
        rope_tables(w, tlo, sq);
        act_grow(w, &k);
        act_grow(w, &v);
    } else {
        act_grow(w, &k);
        act_grow(w, &v);
        rope_tables(w, tlo, sq);
    }
    hp__lay whole = {{hp_pl_r(), hp_pl_r()}};
    if (k.lay.ax[HP__CP].kind == HP_PL_S) {
        if ((st = trans(w, &k, &whole, l, y->c.fqn, "cp K/V")) != HP_OK) return st;
        if ((st = trans(w, &v, &whole, l, y->c.fqn, "cp K/V")) != HP_OK) return st;
    }
    w->c_k = k.cap, w->c_v = v.cap;
    w->fk = k, w->fv = v; /* what the backward's dK and dV are shaped like */
    /* hp__attention's block scratch while it runs: the kernel's own figure for these shapes */
    hp__attn_args sh = {.B = local_dim(w, t, 0), .sq = sq, .sk = local_dim(w, &k, 1), .nh = y->nh, .nkv = y->nkv,
                        .hd = c->hd};
    if (mla) sh.nkv = y->nh, sh.hd = mc->qk_nope_head_dim + mc->qk_rope_head_dim, sh.hdv = mc->v_head_dim;
    transient(w, hp__attention_scratch_bytes(&sh));
    int64_t kvn = ck_add(w, "K and V blocks", local_count(w, &k), local_count(w, &v)), lb = 1, lo;
    w->w_kv = kvn > w->w_kv ? kvn : w->w_kv;
    /* the keys each query row sees: the K block's rows per local batch row */
    hp__lay_range(&w->pos, &t->lay, t->g, 0, w->pos.r[HP__TP], w->pos.r[HP__CP], &lo, &lb);
    int64_t sk = lb > 0 && y->kw > 0 ? local_count(w, &k) / y->kw / lb : 0;
    if (w->o->decode) sk = hp__cost_cache_positions(w, l, w->o->context); /* each new token attends over the cache */
    double f, core; /* per row: the projections' FLOPs, and the attention core's (the scores and P·V) */
    if (mla) {
        int64_t ql = mc->q_lora_rank > 0 ? mc->q_lora_rank : 0, kvl = mc->kv_lora_rank, rope = mc->qk_rope_head_dim;
        int64_t qk = mc->qk_nope_head_dim + rope, vd = mc->v_head_dim, nh = y->nh;
        /* FLOPs are estimates: in double from the start (a product of sizes may pass 2^53, never 2^1023) */
        const double dH = (double)H, dql = (double)ql, dnh = (double)nh, dqk = (double)qk, dvd = (double)vd;
        f = (ql ? 2.0 * dH * dql + 2.0 * dql * dnh * dqk : 2.0 * dH * dnh * dqk) + 2.0 * dH * (double)(kvl + rope) +
            2.0 * (double)kvl * dnh * (double)(mc->qk_nope_head_dim + vd) + 2.0 * dnh * dvd * dH;
        /* the scores and values: decode attends in the latent space (the up-projections absorbed into q and the
         * output, the terms above), over kvl + rope channels per key for the scores and kvl for the values */
        core = w->o->decode ? 2.0 * (double)sk * dnh * (double)(2 * kvl + rope) : 2.0 * (double)sk * dnh * (dqk + dvd);
        const char *ab = "attention buffers";
        int64_t q = ck_mul3(w, ab, rows, nh, qk), o = ck_mul3(w, ab, rows, nh, vd);
        int64_t tmp = ck_mul(w, ab, rows, kvl + rope + ql + kvl + nh * (mc->qk_nope_head_dim + vd));
        w->w_q = q > w->w_q ? q : w->w_q;
        w->w_o = o > w->w_o ? o : w->w_o;
        w->w_gu = tmp > w->w_gu ? tmp : w->w_gu;
    } else {
        int64_t nh = y->nh, hd = c->hd;
        const double dH = (double)H, dnh = (double)nh, dhd = (double)hd;
        f = 2.0 * dH * (double)(nh + 2 * y->nkv) * dhd + 2.0 * dnh * dhd * dH;
        core = 4.0 * (double)sk * dnh * dhd;
        int64_t q = ck_mul3(w, "attention buffers", rows, nh, hd);
        w->w_q = q > w->w_q ? q : w->w_q;
        w->w_o = w->w_q;
    }
    w->cr->flops += (f + core) * (double)rows;
    w->cr->attn_flops += core * (double)rows;
    output_of(y, t, out);
    act_grow(w, out);
    track(w, out);
    return leave(w, y, out);
}

/* A sparse block's EP runtime's rows (the most any rank holds) and the rank's expert widths (its tp block of each
 * expert's when tp cuts them: hp_moe_load_opts.tp_size). */
static int64_t moe_dims(walk *w, const hp__step *y, int64_t *I, int64_t *sI)
{
    int64_t T = 0;
    for (int64_t i = 0; i < w->dp; i++) T = w->dp_rows[i + 1] - w->dp_rows[i] > T ? w->dp_rows[i + 1] - w->dp_rows[i] : T;
    int64_t tr = y->split ? w->pos.r[HP__TP] : 0, tn = y->split ? w->tp : 1;
    *I = w->mI * (tr + 1) / tn - w->mI * tr / tn, *sI = w->sI * (tr + 1) / tn - w->sI * tr / tn;
    return ck_mul(w, "MoE workspace", T, w->S_pad);
}

static hp_status feed_forward(walk *w, const hp__step *y, dact *t, dact *out)
{
    int64_t H = w->g->cfg.H, l = y->layer;
    hp_status st = enter(w, y, t);
    if (st != HP_OK) return st;
    int64_t rows = local_count(w, t) / H;
    if (y->op == HP__OP_MOE) {
        /* the EP runtime, created at the layer's first forward for the most rows any rank holds */
        int64_t I, sI, T = moe_dims(w, y, &I, &sI);
        if (!w->recompute && ep_own_runtime(w, y->c.fqn, I, sI)) mem_count(w, 0, ep_workspace(w, y->c.fqn, T, I, sI));
        if ((st = moe_exchange(w, y, l, t)) != HP_OK) return st;
        output_of(y, t, out);
        act_grow(w, out);
        dact tk = {{t->g[0], t->g[1], w->K}, t->lay, 0}; /* the routed experts, kept for gather_topk */
        if (!w->recompute) act_grow(w, &tk);
    } else {
        /* the rank's block of the intermediate width (the shard layout's cut) */
        int64_t bw[HP__NBUF], I = hp__step_local_I(w->g, y, w->pos.r[HP__TP]);
        hp__step_row_widths(w->g, y, w->pos.r[HP__TP], bw);
        w->cr->flops += 6.0 * (double)rows * (double)H * (double)I;
        /* its buffers hold one row chunk (hp__mlp_chunk_rows; training: every row, which its backward reads) */
        int64_t C = hp__mlp_chunk_rows(rows, w->o->train);
        int64_t gu = ck_mul(w, "MLP buffers", C, bw[2]), hh = ck_mul(w, "MLP buffers", C, bw[3]);
        w->w_gu = gu > w->w_gu ? gu : w->w_gu;
        w->w_h = hh > w->w_h ? hh : w->w_h;
        grow(w, &w->c_buf[2], gu);
        grow(w, &w->c_buf[3], hh);
        output_of(y, t, out);
        act_grow(w, out);
    }
    track(w, out);
    return leave(w, y, out);
}

static hp_status norm(walk *w, const hp__step *s, const dact *h, dact *t)
{
    int64_t cap = t->cap; /* act_copy: t's own buffer, sized like h */
    *t = *h;
    t->cap = cap;
    act_grow(w, t);
    hp_status st = enter(w, s, t);
    return st == HP_OK ? leave(w, s, t) : st;
}

/* The gather of an activation to rank 0 (hp__gather_full): a sender is the first holder of its block. */
static hp_status gather(walk *w, const dact *a, const char *where, int32_t layer)
{
    bool sender = true;
    for (int ax = 0; ax < HP__NAX; ax++)
        if (a->lay.ax[ax].kind == HP_PL_R && w->pos.r[ax] != 0) sender = false;
    uint64_t b = sender ? ck_bytes(w, "gathers", local_count(w, a), sizeof(float)) : 0;
    return hp__cost_add_event(w, layer, where, "gather", HP_RUN_GATHER, "all", hp_mesh_world(w->mesh), 1, b, false);
}

/* lm_head on the final norm's output t: the logits z. */
static hp_status head(walk *w, const hp__step *s, dact *t, dact *z)
{
    hp_status st = enter(w, s, t);
    if (st != HP_OK) return st;
    int64_t H = w->g->cfg.H, rows = local_count(w, t) / H;
    int64_t cap = z->cap; /* the logits go into a's buffer */
    output_of(s, t, z);
    z->cap = cap;
    act_grow(w, z);
    track(w, z);
    int64_t vloc = local_count(w, z) / (rows ? rows : 1);
    w->cr->flops += 2.0 * (double)rows * (double)H * (double)(rows ? vloc : 0);
    return leave(w, s, z);
}

/* loss_sums' bytes for n rows: the per-row max (f32) and sum-exp and target (f64). */
static uint64_t loss_sums(walk *w, int64_t n)
{
    int64_t n1 = ck_add(w, "workspace", n, 1); /* n may be saturated: checked like every size */
    return ck_addu(w, "workspace", ck_bytes(w, "workspace", n1, sizeof(float)),
                   ck_bytes(w, "workspace", ck_mul(w, "workspace", 2, n1), sizeof(double)));
}

/* loss_rows' vocab-parallel max and (sum-exp, target) all-reduces of n rows, times calls (s->split: the logits are
 * cut over tp). */
static hp_status loss_events(walk *w, const hp__step *s, int64_t n, int64_t calls)
{
    if (!s->split || calls <= 0) return HP_OK;
    const char *lb = "loss all-reduces";
    hp_status st = hp__cost_add_event(w, -1, "loss", "loss", HP_RUN_ALL_REDUCE, "tp", w->tp, calls,
                             ck_bytes(w, lb, ck_mul(w, lb, calls, n), sizeof(float)), false);
    if (st == HP_OK)
        st = hp__cost_add_event(w, -1, "loss", "loss", HP_RUN_ALL_REDUCE, "tp", w->tp, calls,
                       ck_bytes(w, lb, ck_mul(w, lb, calls, n), 2 * sizeof(double)), false);
    return st;
}

/* The loss on the whole logits z (loss_of). */
static hp_status loss(walk *w, const hp__step *s, const dact *z)
{
    int64_t lrows = ck_mul(w, "workspace", local_dim(w, z, 0), local_dim(w, z, 1));
    uint64_t sums = loss_sums(w, lrows);
    mem_count(w, 0, sums);
    if (w->o->train && lrows + 1 > w->loss_cap) { /* keep_loss: the backward's max and Σexp, a float and a double */
        uint64_t had = ck_bytes(w, "workspace", w->loss_cap, sizeof(float) + sizeof(double));
        mem_count(w, had, ck_bytes(w, "workspace", lrows + 1, sizeof(float) + sizeof(double)));
        w->loss_cap = lrows + 1;
    }
    mem_count(w, sums, 0);
    return loss_events(w, s, lrows, 1);
}

/* One row chunk of n rows of head_loss_chunks, its collectives counted times times: the logits' buffer [1, n, V]
 * as the vocabulary's tp placement cuts it, the head's exit, the loss's all-reduces. */
static hp_status head_chunk(walk *w, const hp__step *s, const hp__step *ls, dact *z, int64_t n, int64_t times)
{
    int64_t cap = z->cap;
    *z = (dact){{1, n, s->X}, {{s->out.ax[HP__TP], hp_pl_r()}}, cap};
    act_grow(w, z);
    track(w, z);
    hp__lay cx = {{s->leave.ax[HP__TP], hp_pl_r()}};
    w->ev_times = times;
    hp_status st = s->c.has_out ? trans(w, z, &cx, s->layer, s->c.fqn, "exit") : HP_OK;
    w->ev_times = 1;
    return st == HP_OK ? loss_events(w, ls, n, times) : st;
}

/* lm_head and the loss one row chunk at a time (the runner's head_loss_chunks, inference: hp__prog.head_chunks).
 * The chunks' buffers only grow, and a transition swaps two of them, so after two full chunks every other one
 * is alike: the walk takes the full chunks up to that parity, counting the collectives of all of them at the
 * first, then the last chunk (O(1) in the rows). */
static hp_status head_loss_chunks(walk *w, const hp__step *s, const hp__step *ls, dact *t, dact *z)
{
    hp_status st = enter(w, s, t);
    if (st != HP_OK) return st;
    int64_t H = w->g->cfg.H, rows = local_count(w, t) / H, k = hp__mlp_chunk_count(rows, false);
    int64_t lo, nv;
    hp__lay_range(&w->pos, &s->out, (int64_t[3]){t->g[0], t->g[1], s->X}, 2, w->pos.r[HP__TP], w->pos.r[HP__CP], &lo,
                  &nv);
    w->cr->flops += 2.0 * (double)rows * (double)H * (double)nv;
    uint64_t sums = loss_sums(w, hp__mlp_chunk_rows(rows, false));
    mem_count(w, 0, sums);
    int64_t full = k - 1, walked = full <= 3 ? full : 2 + full % 2;
    for (int64_t i = 0; st == HP_OK && i < walked; i++)
        st = head_chunk(w, s, ls, z, HP__MLP_CHUNK_ROWS, i ? 0 : full);
    if (st == HP_OK && k > 0) st = head_chunk(w, s, ls, z, rows - full * HP__MLP_CHUNK_ROWS, 1);
    mem_count(w, sums, 0);
    return st;
}

/* One rank's walk of the program: h the residual stream, t a module's input, a its output (the runner's). */
/* ---- the dry walk: one entry per op of the program, the cost half of its record (the runtime's is ops.c) ----
 *
 * Each entry walks its step for the rank being walked as the runner executes it: the same transitions lowered
 * for bytes, the runner's buffers sized in the same order. h is the residual stream, t a module's input, a its
 * output. Inference is run's without the logits taken (hp_run_opts.no_logits: nothing gathered, and the head and
 * the loss in row chunks when the plan's head allows); training computes the loss on the whole logits. */
typedef struct dio {
    dact h, t, a;
    bool chunks;
    const hp__step *next;
} dio;

/* One end of a pipeline boundary: the stream's local block (its layout on this rank, f32) that src/run/pipe.c
 * sends after a chunk or receives before one, one transfer each (hp_run_stats.p2p_bytes and p2p_calls). */
static void p2p(walk *w, const dact *h)
{
    int64_t n = local_count(w, h);
    const char *pb = "point-to-point bytes";
    w->cr->p2p_bytes = ck_addu(w, pb, w->cr->p2p_bytes, ck_bytes(w, pb, n, sizeof(float)));
    w->cr->p2p_calls++;
    w->p2p_block = n > w->p2p_block ? n : w->p2p_block;
}

/* The stream arriving from the previous chunk's stage, in the stream's layout: the rank's block of its replica's
 * rows [B_r, S_pad, H], into the runner's stream buffer (recv_stream's hp__act_alloc). */
static void recv_stream(walk *w, dio *io)
{
    int64_t cap = io->h.cap;
    io->h = (dact){{w->dp_rows[w->cr->dp + 1] - w->dp_rows[w->cr->dp], w->S_pad, w->g->cfg.H}, w->g->stream, cap};
    act_grow(w, &io->h);
    track(w, &io->h);
    p2p(w, &io->h);
}

static hp_status dry_embed(walk *w, const hp__step *s, dio *io)
{
    int64_t Bl = w->dp_rows[w->cr->dp + 1] - w->dp_rows[w->cr->dp];
    io->h = (dact){{Bl, w->S_pad, s->X}, s->out, 0};
    act_grow(w, &io->h);
    track(w, &io->h);
    return leave(w, s, &io->h);
}

static hp_status dry_norm(walk *w, const hp__step *s, dio *io)
{
    if (s->keep && !w->recompute) { /* a layer's input (the final norm's): what the backward keeps */
        w->w_saved = ck_add(w, "saved activations", w->w_saved, local_count(w, &io->h));
        if (w->kept) {
            dact *k = &w->kept[s->layer >= 0 ? s->layer : w->g->cfg.L];
            *k = io->h;
            k->cap = 0;
            act_grow(w, k);
        }
    }
    return norm(w, s, &io->h, &io->t);
}

static hp_status dry_attn(walk *w, const hp__step *s, dio *io)
{
    return attention(w, s, &io->t, &io->a);
}

static hp_status dry_ffn(walk *w, const hp__step *s, dio *io)
{
    return feed_forward(w, s, &io->t, &io->a);
}

static hp_status dry_residual(walk *w, const hp__step *s, dio *io)
{
    return trans(w, &io->a, &s->leave, s->layer, s->c.fqn, "residual");
}

static hp_status dry_head(walk *w, const hp__step *s, dio *io)
{
    return io->chunks ? head_loss_chunks(w, s, io->next, &io->t, &io->a) : head(w, s, &io->t, &io->a);
}

static hp_status dry_loss(walk *w, const hp__step *s, dio *io)
{
    return io->chunks ? HP_OK : loss(w, s, &io->a);
}

static hp_status (*const dry[HP__OP_COUNT])(walk *w, const hp__step *s, dio *io) = {
    [HP__OP_EMBED] = dry_embed, [HP__OP_NORM] = dry_norm,         [HP__OP_ATTN] = dry_attn,
    [HP__OP_MLA] = dry_attn,    [HP__OP_MLP] = dry_ffn,           [HP__OP_MOE] = dry_ffn,
    [HP__OP_RESIDUAL] = dry_residual, [HP__OP_HEAD] = dry_head, [HP__OP_LOSS] = dry_loss,
};

/* ---- the backward's dry walk (training): src/run/bwd.c's buffers, sized in its order ----
 *
 * The backward walks the program in reverse; at a layer's last step it walks the layer's forward again from its
 * kept input (the recompute: the same dry entries, creating nothing twice), saving what a later step of the layer
 * overwrites (hp__recompute_overwrites, the rule bwd.c saves by). Each op's entry then sizes the gradients (dh the
 * stream's, dt a module input's, da a module output's), the backward's scratch blocks, and moves each gradient
 * through its transitions' duals: the buffers those take are trans's. The collectives' bytes are the training
 * events' (cost_eval.c), so the walk adds no event (ev_times 0). */

typedef struct bwalk {
    dact dh, dt, da, x, h1, dk, dv; /* bwd.c's hp__train fields of the same names */
    int64_t f[HP__NBWD];            /* its scratch blocks (hp__step_bwd_widths), floats */
    int n_pos;                      /* the recompute's slots: per position in the layer */
    dact *sv_h, *sv_t;              /* a norm's input stream, a module's input, copied */
    int64_t *sv_buf;                /* [n_pos · HP__NBUF] a module's buffers, copied (floats) */
    dact *hin, *tin;                /* what each position's backward reads (dims and layout) */
    bool dh_live;
} bwalk;

/* The layout a gradient of an activation laid out l is held in: P read as R (bwd.c's glay). */
static hp__lay glay(hp__lay l)
{
    for (int ax = 0; ax < HP__NAX; ax++)
        if (l.ax[ax].kind == HP_PL_P) l.ax[ax] = hp_pl_r();
    return l;
}

/* bwd.c's dual: g, held as from, moved to the gradient layout of to. */
static hp_status dual(walk *w, const hp__step *s, dact *g, hp__lay from, const hp__lay *to)
{
    g->lay = from;
    hp__lay want = glay(*to);
    return trans(w, g, &want, s->layer, s->c.fqn, "backward");
}

/* An activation like a (its rows) of width X laid out lay, in buffer d (bwd.c's like, hp__r_act_copy). */
static void like(walk *w, dact *d, const dact *a, int64_t X, hp__lay lay)
{
    d->g[0] = a->g[0], d->g[1] = a->g[1], d->g[2] = X;
    d->lay = lay;
    act_grow(w, d);
}

static int64_t rows_of_act(walk *w, const dact *a)
{
    return ck_mul(w, "workspace", local_dim(w, a, 0), local_dim(w, a, 1));
}

/* The step's backward scratch blocks for rows rows (hp__step_bwd_widths), reserved at its backward's start. */
static void reserve(walk *w, bwalk *b, const hp__step *s, int64_t rows)
{
    int64_t bw[HP__NBWD];
    hp__step_bwd_widths(w->g, s, w->pos.r[HP__TP], bw);
    for (int k = 0; k < HP__NBWD; k++)
        if (bw[k] > 0) grow(w, &b->f[k], ck_mul(w, "workspace", rows, bw[k]));
}

/* The parameter of slot in step s's table, when the model has it (a checkpoint may lack an optional one). */
static const hp_param *step_param(walk *w, const hp__step *s, hp__pslot slot)
{
    size_t n;
    const hp__pdef *d = hp__op_params(s->op, &n);
    for (size_t i = 0; i < n; i++)
        if (d[i].slot == slot) {
            char name[400];
            snprintf(name, sizeof name, "%s.%s", s->c.fqn, d[i].rel);
            return hp_model_find_param(w->m, name);
        }
    return NULL;
}

/* attn_core_bwd: dK and dV of every key the rank's queries saw, the kernel's scratch while it runs, and the
 * reduce-scatter back to the keys' own block under cp. */
static hp_status core_bwd(walk *w, bwalk *b, const hp__step *s, const dact *tin, hp__attn_args aa, bool dsinks)
{
    b->dk.g[0] = w->fk.g[0], b->dk.g[1] = w->fk.g[1], b->dk.g[2] = w->fk.g[2], b->dk.lay = w->fk.lay;
    b->dv.g[0] = w->fv.g[0], b->dv.g[1] = w->fv.g[1], b->dv.g[2] = w->fv.g[2], b->dv.lay = w->fv.lay;
    act_grow(w, &b->dk);
    act_grow(w, &b->dv);
    aa.B = local_dim(w, tin, 0), aa.sq = local_dim(w, tin, 1), aa.sk = local_dim(w, &w->fk, 1);
    transient(w, hp__attention_backward_scratch_bytes(&aa, dsinks));
    hp__lay kl = {{hp_pl_r(), tin->lay.ax[HP__CP]}}, part = {{hp_pl_r(), hp_pl_p()}};
    if (kl.ax[HP__CP].kind != HP_PL_S) return HP_OK;
    hp_status st = dual(w, s, &b->dk, part, &kl);
    return st == HP_OK ? dual(w, s, &b->dv, part, &kl) : st;
}

/* The module's input's gradient: like its input, a partial sum over tp when tp cuts the module. */
static void module_dt(walk *w, bwalk *b, const hp__step *s, const dact *tin)
{
    like(w, &b->dt, tin, w->g->cfg.H, (hp__lay){{s->split ? hp_pl_p() : hp_pl_r(), tin->lay.ax[HP__CP]}});
}

/* A module's backward (bwd.c's attn_bwd, mla_bwd, mlp_bwd): its scratch blocks, attention's dK, dV and block
 * scratch, its input's gradient. */
static hp_status dense_bwd(walk *w, bwalk *b, const hp__step *s, const dact *tin)
{
    reserve(w, b, s, rows_of_act(w, tin));
    hp_status st = HP_OK;
    if (s->op == HP__OP_ATTN) {
        const hp_param *sk = step_param(w, s, HP__PS_SINKS);
        st = core_bwd(w, b, s, tin, (hp__attn_args){.nh = s->nh, .nkv = s->nkv, .hd = w->g->cfg.hd},
                      sk && sk->trainable);
    } else if (s->op == HP__OP_MLA) {
        const hp__mla *a = &w->g->mla;
        st = core_bwd(w, b, s, tin, (hp__attn_args){.nh = s->nh, .nkv = s->nh, .hd = a->nope + a->rope, .hdv = a->vd},
                      false);
    }
    if (st == HP_OK) module_dt(w, b, s, tin);
    return st;
}

/* The sparse block: its input's gradient, then the EP runtime's backward scratch (made by the layer's first
 * backward after its runtime was made: every step, as the optimizer step releases the runtimes). */
static hp_status moe_bwd(walk *w, bwalk *b, const hp__step *s, const dact *tin)
{
    hp__lay lay = tin->lay;
    if (s->split) lay.ax[HP__TP] = hp_pl_p();
    like(w, &b->dt, tin, w->g->cfg.H, lay);
    int64_t I, sI, T = moe_dims(w, s, &I, &sI);
    hp_moe_ep_shape sh = ep_shape(w, s->c.fqn, T, I, sI);
    hp_moe_ep_array a[HP_MOE_ARR_COUNT];
    uint64_t bytes;
    if (!hp_moe_ep_layout_bytes(a, hp_moe_bwd_layout(&sh, a), &bytes)) mark(w, "MoE workspace");
    mem_count(w, 0, bytes);
    return HP_OK;
}

/* A backward entry: s's step, hin / tin what it reads (a norm's input stream, a module's or the head's input). */
typedef hp_status (*bdry_fn)(walk *w, bwalk *b, const hp__step *s, const dact *hin, const dact *tin, dio *io);

static hp_status bdry_loss(walk *w, bwalk *b, const hp__step *s, const dact *hin, const dact *tin, dio *io)
{
    (void)s, (void)hin, (void)tin;
    const dact *z = &io->a;
    uint64_t lab = ck_bytes(w, "workspace", ck_add(w, "workspace", rows_of_act(w, z), 1), sizeof(int64_t));
    mem_count(w, 0, lab); /* the targets, while dz is formed */
    like(w, &b->da, z, z->g[2], z->lay);
    mem_count(w, lab, 0);
    return HP_OK;
}

static hp_status bdry_head(walk *w, bwalk *b, const hp__step *s, const dact *hin, const dact *tin, dio *io)
{
    (void)hin, (void)io;
    hp_status st = dual(w, s, &b->da, glay(s->leave), &s->out);
    if (st != HP_OK) return st;
    module_dt(w, b, s, tin);
    return dual(w, s, &b->dt, b->dt.lay, &s->in);
}

static hp_status bdry_norm(walk *w, bwalk *b, const hp__step *s, const dact *hin, const dact *tin, dio *io)
{
    (void)tin, (void)io;
    hp_status st = dual(w, s, &b->dt, glay(s->leave), &s->out);
    if (st != HP_OK) return st;
    like(w, &b->x, hin, hin->g[2], hin->lay); /* the normed input: the stream copied, then entered */
    if ((st = enter(w, s, &b->x)) != HP_OK) return st;
    if ((st = dual(w, s, &b->dt, s->run, &s->in)) != HP_OK) return st;
    if (!b->dh_live) like(w, &b->dh, &b->dt, b->dt.g[2], b->dt.lay);
    b->dh_live = true;
    return HP_OK;
}

static hp_status bdry_residual(walk *w, bwalk *b, const hp__step *s, const dact *hin, const dact *tin, dio *io)
{
    (void)hin, (void)tin, (void)io;
    like(w, &b->da, &b->dh, b->dh.g[2], b->dh.lay);
    return dual(w, s, &b->da, w->g->stream, &s->in);
}

static hp_status bdry_module(walk *w, bwalk *b, const hp__step *s, const dact *hin, const dact *tin, dio *io)
{
    (void)hin, (void)io;
    hp_status st = dual(w, s, &b->da, glay(s->leave), &s->out);
    if (st != HP_OK) return st;
    st = s->op == HP__OP_MOE ? moe_bwd(w, b, s, tin) : dense_bwd(w, b, s, tin);
    return st == HP_OK ? dual(w, s, &b->dt, b->dt.lay, &s->in) : st;
}

static hp_status bdry_embed(walk *w, bwalk *b, const hp__step *s, const dact *hin, const dact *tin, dio *io)
{
    (void)hin, (void)tin, (void)io;
    hp_status st = dual(w, s, &b->dh, w->g->stream, &s->out);
    if (st == HP_OK) /* the ids of the gradient's rows, while they are added into the table */
        transient(w, ck_bytes(w, "workspace", ck_add(w, "workspace", rows_of_act(w, &b->dh), 1), sizeof(int64_t)));
    return st;
}

static const bdry_fn bdry[HP__OP_COUNT] = {
    [HP__OP_EMBED] = bdry_embed,   [HP__OP_NORM] = bdry_norm,         [HP__OP_ATTN] = bdry_module,
    [HP__OP_MLA] = bdry_module,    [HP__OP_MLP] = bdry_module,        [HP__OP_MOE] = bdry_module,
    [HP__OP_RESIDUAL] = bdry_residual, [HP__OP_HEAD] = bdry_head,     [HP__OP_LOSS] = bdry_loss,
};

/* The recompute of layer steps [f, e] (bwd.c's recompute): the forward's dry entries from the kept input, the
 * copies of what a later step overwrites, and each position's hin / tin. */
static hp_status recompute(walk *w, bwalk *b, dio *io, size_t f, size_t e)
{
    const hp__prog *g = w->g;
    size_t end = g->steps[e].op == HP__OP_RESIDUAL ? e : e + 1;
    int64_t ti = w->pos.r[HP__TP];
    dact kept = w->kept[g->steps[f].layer];
    dio r = *io;
    r.h = kept;
    bool on_kept = true;
    hp_status st = HP_OK;
    w->recompute = true;
    for (size_t i = f; i < end && st == HP_OK; i++) {
        const hp__step *s = &g->steps[i];
        size_t p = i - f;
        if (s->op == HP__OP_RESIDUAL && on_kept) { /* the stream's own copy from here on */
            b->h1.g[0] = kept.g[0], b->h1.g[1] = kept.g[1], b->h1.g[2] = kept.g[2], b->h1.lay = kept.lay;
            act_grow(w, &b->h1);
            r.h.cap = 0;
            on_kept = false;
        }
        if (s->op == HP__OP_NORM) {
            b->hin[p] = r.h;
            if (!on_kept && hp__recompute_overwrites(g, i, end, HP__OP_RESIDUAL, -1, ti))
                like(w, &b->sv_h[p], &r.h, r.h.g[2], r.h.lay);
        }
        r.next = i + 1 < g->n_steps ? &g->steps[i + 1] : NULL;
        st = dry[s->op](w, s, &r);
        if (st != HP_OK || !hp__op_is_module(s->op)) continue;
        b->tin[p] = r.t;
        if (hp__recompute_overwrites(g, i, end, HP__OP_NORM, -1, ti)) like(w, &b->sv_t[p], &r.t, r.t.g[2], r.t.lay);
        int64_t bw[HP__NBUF], rows = rows_of_act(w, &r.t);
        hp__step_row_widths(g, s, ti, bw);
        for (int k = 0; k < HP__NBUF; k++)
            if (bw[k] > 0 && hp__recompute_overwrites(g, i, end, HP__OP_COUNT, k, ti))
                grow(w, &b->sv_buf[p * HP__NBUF + (size_t)k], ck_mul(w, "workspace", rows, bw[k]));
    }
    w->recompute = false;
    io->t.cap = r.t.cap, io->a.cap = r.a.cap; /* the runner's t and a, as the recompute left them */
    return st;
}

/* The backward of the whole program after its forward (io: the forward's activations as it left them). The walk's
 * estimates (FLOPs, events, the working-set model) are the forward's: the recompute's are put back. */
static hp_status backward(walk *w, dio *io)
{
    const hp__prog *g = w->g;
    size_t most = 1; /* the most steps of a layer */
    for (size_t i = 0, f = 0; i < g->n_steps; i++) {
        if (i > 0 && g->steps[i].layer != g->steps[i - 1].layer) f = i;
        if (i - f + 1 > most) most = i - f + 1;
    }
    bwalk b = {.n_pos = (int)most};
    b.sv_h = hp_calloc(most, sizeof *b.sv_h), b.sv_t = hp_calloc(most, sizeof *b.sv_t);
    b.hin = hp_calloc(most, sizeof *b.hin), b.tin = hp_calloc(most, sizeof *b.tin);
    b.sv_buf = hp_calloc(most * HP__NBUF, sizeof *b.sv_buf);
    hp_cost_rank keep_r = *w->cr;
    walk keep_w = *w;
    hp_status st = b.sv_h && b.sv_t && b.hin && b.tin && b.sv_buf ? HP_OK
                                                                  : hp_err_set(w->err, HP_ERR_NOMEM, "out of memory");
    w->ev_times = 0;
    size_t f = 0;
    int64_t C = w->pipe->n_chunks > 1 ? w->pipe->n_chunks : 1, cur = -1;
    for (size_t i = g->n_steps; st == HP_OK && i-- > 0;) {
        const hp__step *s = &g->steps[i];
        if (s->chunk % w->pp != w->stage) continue; /* another stage's */
        if (s->chunk != cur && (cur = s->chunk) + 1 < C) { /* the stream's gradient from the next chunk's stage */
            dact h = {{w->dp_rows[w->cr->dp + 1] - w->dp_rows[w->cr->dp], w->S_pad, g->cfg.H}, g->stream, 0};
            like(w, &b.dh, &h, g->cfg.H, g->stream);
            b.dh_live = true;
        }
        dact hin = w->kept[g->cfg.L], tin = io->t;
        if (s->layer >= 0) {
            if (i + 1 == g->n_steps || g->steps[i + 1].layer != s->layer) {
                for (f = i; f > 0 && g->steps[f - 1].layer == s->layer;) f--;
                if ((st = recompute(w, &b, io, f, i)) != HP_OK) break;
            }
            hin = b.hin[i - f], tin = b.tin[i - f];
        }
        st = bdry[s->op](w, &b, s, &hin, &tin, io);
    }
    /* the estimates as the forward left them; the buffers' and windows' figures as the backward grew them */
    hp_cost_event *ev = w->cr->ev;
    size_t cap = w->ev_cap;
    *w->cr = keep_r;
    w->cr->ev = ev;
    w->ev_cap = cap;
    w->w_hidden = keep_w.w_hidden, w->w_wide = keep_w.w_wide, w->w_spare = keep_w.w_spare, w->w_kv = keep_w.w_kv;
    w->w_q = keep_w.w_q, w->w_o = keep_w.w_o, w->w_gu = keep_w.w_gu, w->w_h = keep_w.w_h, w->w_s0 = keep_w.w_s0;
    w->w_s1 = keep_w.w_s1, w->w_moe = keep_w.w_moe, w->w_saved = keep_w.w_saved, w->touched = keep_w.touched;
    w->n_sparse = keep_w.n_sparse;
    w->ev_times = 1;
    free(b.sv_h), free(b.sv_t), free(b.hin), free(b.tin), free(b.sv_buf);
    return st;
}

hp_status hp__cost_walk_rank(walk *w)
{
    const hp__prog *g = w->g;
    hp_status st = HP_OK;
    dio io = {.chunks = !w->o->train && g->head_chunks};
    w->loss_cap = 0;
    w->cur_chunk = 0;
    w->kept = NULL;
    if (w->o->train && !(w->kept = hp_calloc((size_t)g->cfg.L + 1, sizeof *w->kept)))
        return hp_err_set(w->err, HP_ERR_NOMEM, "out of memory");
    /* the chunks in order, as src/run/pipe.c runs them: a stage walks its own, receiving the stream before each
     * (but the first) and sending it after each (but the last); without a pipeline, one chunk of every step */
    int64_t C = w->pipe->n_chunks > 1 ? w->pipe->n_chunks : 1;
    for (size_t i = 0, lo, c = 0; st == HP_OK && (int64_t)c < C; c++) {
        w->cur_chunk = (int32_t)c;
        for (lo = i; i < g->n_steps && g->steps[i].chunk == (int32_t)c;) i++;
        if ((int64_t)c % w->pp != w->stage) continue;
        double f0 = w->cr->flops, a0 = w->cr->attn_flops;
        int64_t s0 = w->w_saved;
        if (c > 0) recv_stream(w, &io);
        for (size_t j = lo; st == HP_OK && j < i; j++) {
            io.next = j + 1 < g->n_steps ? &g->steps[j + 1] : NULL;
            st = dry[g->steps[j].op](w, &g->steps[j], &io);
        }
        if ((int64_t)c + 1 < C) p2p(w, &io.h);
        w->ch_flops[c] = w->cr->flops - f0, w->ch_attn[c] = w->cr->attn_flops - a0, w->ch_saved[c] = w->w_saved - s0;
    }
    if (st == HP_OK && w->o->train) st = backward(w, &io);
    free(w->kept);
    w->kept = NULL;
    return st;
}

/* The routing gathers (gather_topk) need each sparse layer's entry layout: a second, short pass. Each layer is
 * gathered over its stage onto the stage's first rank; under a pipeline that rank relays the int32 routing to world
 * rank 0 (output, not the pipeline's traffic: no p2p counted), which holds it as its own stage's first rank does. */
hp_status hp__cost_topk_gathers(walk *w, const hp__step *s)
{
    uint64_t ti = ck_addu(w, "workspace", ck_bytes(w, "workspace", ck_mul3(w, "workspace", w->B_all, w->S_orig, w->K),
                                                   sizeof(int32_t)), 1); /* the int32 routing [B, S, K] */
    if (s->chunk % w->pp != w->stage) { /* another stage's layer: world rank 0 receives it */
        if (w->cr->rank == 0) transient(w, ti);
        return HP_OK;
    }
    const hp__lay *moe_lay = &s->run; /* the block's input after its entry: how the routing is laid out */
    int64_t Bl = w->dp_rows[w->cr->dp + 1] - w->dp_rows[w->cr->dp];
    dact tk = {{Bl, w->S_pad, w->K}, *moe_lay, 0};
    uint64_t full = gather_buffers(w, &tk);
    if (w->lrank == 0) transient(w, ti); /* handed to the caller, or (a later stage's) relayed to rank 0 */
    mem_count(w, full, 0);
    return gather(w, &tk, s->c.fqn, s->layer);
}

