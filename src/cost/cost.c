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

/* ---- what the walk needs of the plan, the same for every rank ---- */

enum { HP__COST_EP_SHAPES = 64 };

typedef struct walk {
    const hp_cost_plan *k;
    const hp_model *m;
    const hp_plan *p;
    const hp_cost_opts *o;
    const hp__prog *g; /* the program the walk follows (exec/prog.h) */
    int64_t tp, cp, dp, ep, E, K, mI, sI;
    int64_t *owner;    /* [E]: the EP index holding expert e */
    int64_t *ecnt;     /* [E]: scratch, slots per expert */
    const hp_mesh *mesh; /* the plan's, or opts.mesh */
    const hp_shard_layout *lay; /* the plan's cut of every tensor, or NULL (advise: the weights are given) */
    int64_t *dp_rows;  /* [dp + 1] */
    hp__axes pos;      /* the walked rank's position on tp and cp */
    int64_t B_all, S_orig, S_pad; /* the batch, its sequence, and that padded for cp (hp__seq_pad) */
    hp_cost_rank *cr;  /* the rank being walked */
    size_t ev_cap;
    hp_err *err;
    /* the rank's working-set model (floats) */
    int64_t w_hidden, w_wide, w_spare, w_kv, w_q, w_o, w_gu, w_h, w_s0, w_s1, w_moe;
    int64_t w_saved;   /* train: the residual stream's local blocks the backward keeps (L layer inputs + final) */
    double touched;    /* decode: Σ over sparse layers of the share of the rank's local experts some slot reaches */
    int64_t n_sparse;  /* decode: sparse layers walked */
    const char *ovf;   /* the first figure of the rank past 64 bits (NULL: none); hp_cost_eval refuses the batch */
    /* The runner's workspace, buffer by buffer as the forward sizes it (capacities in floats, kept across the
     * steps as the runner keeps them), and the counter its allocation wrapper keeps (hp__mem_*, bytes). */
    int64_t c_spare, c_s0, c_s1, c_k, c_v, c_buf[4];
    int64_t rope_pos0, rope_n;
    uint64_t rope_b, m_cur, m_peak;
    bool ws_ovf; /* a workspace figure passed 64 bits: workspace_bytes is UINT64_MAX */
    /* The tp and cp groups' shared windows (hp_comm_window_size): whether a collective went through one, and the
     * largest call's bytes per rank */
    bool win_used[HP__NAX];
    uint64_t win_max[HP__NAX];
    int64_t ev_times;  /* trans counts each collective this many times (a row chunk standing for several); 0: none */
    uint64_t w_full;   /* the rank's weights as held (bf16 under a GPU profile), before --zero 3 shards them */
    /* Inference: the shapes (I, sI, shared-expert gate) of the EP runtimes counted so far; a sparse layer of one
     * of them borrows that runtime's buffers (the runner's moe_runtime). */
    int64_t ep_shape[HP__COST_EP_SHAPES][3];
    int n_ep_shape;
} walk;

/* ---- checked size math ----
 *
 * Every product and sum of the batch's sizes (B, S and the widths they multiply) goes through these: a figure
 * that 64 bits cannot hold saturates and marks the walk with what it was, and hp_cost_eval refuses the batch
 * instead of printing a wrapped number. Estimates in FLOPs and seconds are doubles and need no check. */

/* A figure past 64 bits: the workspace (a model of run's buffers, which run itself would refuse to size) saturates
 * and says so in its own figure; any other refuses the batch. */
static void mark(walk *w, const char *what)
{
    if (!strcmp(what, "workspace") || !strcmp(what, "MoE workspace")) w->ws_ovf = true;
    else if (!w->ovf) w->ovf = what;
}

static int64_t ck_mul(walk *w, const char *what, int64_t a, int64_t b)
{
    int64_t r;
    if (hp_mul_i64(a, b, &r)) return r;
    mark(w, what);
    return INT64_MAX;
}

static int64_t ck_mul3(walk *w, const char *what, int64_t a, int64_t b, int64_t c)
{
    return ck_mul(w, what, ck_mul(w, what, a, b), c);
}

static int64_t ck_add(walk *w, const char *what, int64_t a, int64_t b)
{
    int64_t r;
    if (hp_add_i64(a, b, &r)) return r;
    mark(w, what);
    return INT64_MAX;
}

/* Elements n as bytes of esize each, or UINT64_MAX (marked) past 64 bits. */
static uint64_t ck_bytes(walk *w, const char *what, int64_t n, uint64_t esize)
{
    uint64_t r;
    if (n >= 0 && !__builtin_mul_overflow((uint64_t)n, esize, &r)) return r;
    mark(w, what);
    return UINT64_MAX;
}

static uint64_t ck_addu(walk *w, const char *what, uint64_t a, uint64_t b)
{
    uint64_t r;
    if (!__builtin_add_overflow(a, b, &r)) return r;
    mark(w, what);
    return UINT64_MAX;
}

/* The mask of the mesh axes that shard a tensor (experts_scan): bits of tp, cp and ep. */
enum { M_TP = 1, M_CP = 2, M_EP = 4, M_COUNT = 8 };

struct hp_cost_plan {
    const hp_model *m;
    const hp_plan *p;
    /* The routed experts' tensors (an ep_stack, an ep placement or the MOE_EXPERT role): their global bytes by
     * the mask of the axes that shard them. A rank holds bytes / (the product of those axes' sizes) of each,
     * and the ranks holding the same slice, world / that product, are the expert-data-parallel group that
     * reduces its gradients and shares its ZeRO state. */
    uint64_t expert_bytes[M_COUNT];
    /* Of every parameter, and of the routed experts' (a part of it), the frozen ones (--freeze: not trainable):
     * global bytes by the same masks. A frozen tensor gets no gradient, no optimizer state and no master in the
     * byte model, as in hyperpar train (runtime_state). */
    uint64_t frozen_bytes[M_COUNT], frozen_expert_bytes[M_COUNT];
    /* Every parameter's global bytes by decoder layer (index L: outside the layers) and the mask of the axes that
     * shard it: --zero 3 gathers one layer's weights at a time, the largest of which is its transient. */
    uint64_t (*layer_bytes)[M_COUNT];
    int64_t n_layers;
    /* The embedding table (untied), by the same masks: a decode step reads only its B rows of it. */
    uint64_t embed_bytes[M_COUNT];
};

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
static bool experts_scan(hp_cost_plan *k)
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
static hp_status owners(walk *w)
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

typedef struct dact {
    int64_t g[3];
    hp__lay lay;
    int64_t cap; /* floats of the runner's buffer that holds it */
} dact;

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
static bool axis_spans_nodes(const walk *w, int64_t rank, const char *axis)
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
    return w->pos.n[ax] > 1 && !axis_spans_nodes(w, w->cr->rank, ax == HP__TP ? "tp" : "cp");
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

/* n elements of sz bytes as hp__moe_alloc allocates them (at least 1 byte). */
static uint64_t moe_arr(walk *w, int64_t n, uint64_t sz)
{
    uint64_t b = ck_bytes(w, "MoE workspace", n, sz);
    return b ? b : 1;
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

/* hp_moe_ep_workspace_bytes of a sparse layer's EP runtime (hp__moe_ws_make and ep_build): T the most rows any
 * rank of the group holds, in the runner's dispatch chunks (moe_chunks: hp__mlp_chunk_count; training one); with
 * C > 1 chunks the runtime is bounded (hp_moe_ep_create_bounded): the exchange holds two stages of
 * Th = ceil(T / C) tokens, the experts' rows, activations and the shared expert's scratch one chunk. P the EP
 * group, L = E / P local experts, I and sI the rank's expert widths (fqn: the block). */
static uint64_t ep_workspace(walk *w, const char *fqn, int64_t T, int64_t I, int64_t sI)
{
    int64_t P = w->ep, E = w->E, L = E / P, K = w->K, H = w->g->cfg.H;
    const char *mb = "MoE workspace";
    int64_t C = hp__mlp_chunk_count(T, w->o->train), Th = C > 1 ? T / C + (T % C != 0) : T;
    int64_t tb = C > 1 ? ck_mul(w, mb, 2, Th) : T; /* tokens send holds; xrows holds Th of them */
    int64_t TK = ck_mul(w, mb, T, K), TH = ck_mul(w, mb, T, H), rK = ck_mul(w, mb, Th, K);
    int64_t sendf = ck_mul3(w, mb, tb, K, H), xf = ck_mul3(w, mb, P, ck_mul(w, mb, Th, K), H);
    char gate[160];
    snprintf(gate, sizeof gate, "%s.shared_expert_gate.weight", fqn);
    uint64_t v[] = {moe_arr(w, TH, 8), moe_arr(w, ck_mul(w, mb, T, E), 8), moe_arr(w, 2 * E, 8), moe_arr(w, TK, 4),
                    moe_arr(w, TK, 4), moe_arr(w, TK, 1), moe_arr(w, hp_moe_capacity_scratch_count(T, K, E), 4),
                    moe_arr(w, L, 8), moe_arr(w, L + 1, 8), moe_arr(w, TK, 4), moe_arr(w, TK, 4),
                    moe_arr(w, ck_mul3(w, mb, rK, 2, I), 4), moe_arr(w, L, sizeof(hp_linear_group)), moe_arr(w, L, 8),
                    sI > 0 ? moe_arr(w, ck_mul3(w, mb, Th, 2, sI), 4) : 0,
                    sI > 0 ? moe_arr(w, ck_mul(w, mb, Th, H), 4) : 0,
                    sI > 0 && hp_model_find_param(w->m, gate) ? moe_arr(w, Th, 4) : 0,
                    /* ep_build */
                    C > 1 ? moe_arr(w, 4 * P * L, 8) : 0, C > 1 ? moe_arr(w, 8 * P, sizeof(size_t)) : 0,
                    moe_arr(w, E, 8), moe_arr(w, E + 1, 8), moe_arr(w, P * L, 8), moe_arr(w, P * L, 8), moe_arr(w, L, 8),
                    moe_arr(w, 4 * P, sizeof(size_t)), moe_arr(w, sendf, 4), moe_arr(w, ck_mul(w, mb, P, sendf), 4),
                    moe_arr(w, C > 1 ? xf : ck_mul(w, mb, P, sendf), 4), sI > 0 ? moe_arr(w, TH, 4) : 0};
    uint64_t s = 0;
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) s = ck_addu(w, mb, s, v[i]);
    return s;
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
    if (w->cr->rank != 0) return 0;
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
    case HP_RUN_GATHER: return w->cr->rank == 0 ? 0 : bytes;
    default: return 0;
    }
}

static hp_status add_event(walk *w, int32_t layer, const char *where, const char *step, hp_run_coll kind,
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
                                       .wire_bytes = wire};
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
            st = add_event(w, layer, where, step, k, axn[ax], w->pos.n[ax], w->ev_times,
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
static int64_t ep_member(const hp_mesh *m, int64_t P, int64_t rank, int64_t i)
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
    int64_t me = w->cr->rank, P = w->ep, grp, idx;
    hp_mesh_ep_index(mesh, P, me, &grp, &idx);
    bool est = false;
    int64_t sent = member_sends(w, y, layer, &t->lay, me, -1, &est), recv = 0;
    if (P == 1) recv = sent;
    for (int64_t i = 0; i < P && P > 1; i++) /* the members of this rank's EP group */
        recv = ck_add(w, "MoE exchange", recv, member_sends(w, y, layer, &t->lay, ep_member(mesh, P, me, i), idx, &est));
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
    return add_event(w, (int32_t)layer, y->c.fqn, "EP dispatch+return", HP_RUN_ALL_TO_ALL, "ep", P, 2,
                     ck_bytes(w, "MoE exchange", ck_mul(w, "MoE exchange",
                                                                    ck_add(w, "MoE exchange", sent, recv), H),
                              sizeof(float)),
                     est);
}

/* The positions of layer l's KV cache a rank holds for one sequence of n positions: a sliding-window layer keeps
 * its last W (hp__rcfg.window), and cp splits them, the most-loaded member holding ceil(n / cp). */
static int64_t cache_positions(const walk *w, int32_t l, int64_t n)
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
    if (w->o->decode) sk = cache_positions(w, l, w->o->context); /* each new token attends over the cache */
    double f;
    if (mla) {
        int64_t ql = mc->q_lora_rank > 0 ? mc->q_lora_rank : 0, kvl = mc->kv_lora_rank, rope = mc->qk_rope_head_dim;
        int64_t qk = mc->qk_nope_head_dim + rope, vd = mc->v_head_dim, nh = y->nh;
        /* FLOPs are estimates: in double from the start (a product of sizes may pass 2^53, never 2^1023) */
        const double dH = (double)H, dql = (double)ql, dnh = (double)nh, dqk = (double)qk, dvd = (double)vd;
        f = (ql ? 2.0 * dH * dql + 2.0 * dql * dnh * dqk : 2.0 * dH * dnh * dqk) + 2.0 * dH * (double)(kvl + rope) +
            2.0 * (double)kvl * dnh * (double)(mc->qk_nope_head_dim + vd) + 2.0 * dnh * dvd * dH;
        /* the scores and values: decode attends in the latent space (the up-projections absorbed into q and the
         * output, the terms above), over kvl + rope channels per key for the scores and kvl for the values */
        f += w->o->decode ? 2.0 * (double)sk * dnh * (double)(2 * kvl + rope) : 2.0 * (double)sk * dnh * (dqk + dvd);
        const char *ab = "attention buffers";
        int64_t q = ck_mul3(w, ab, rows, nh, qk), o = ck_mul3(w, ab, rows, nh, vd);
        int64_t tmp = ck_mul(w, ab, rows, kvl + rope + ql + kvl + nh * (mc->qk_nope_head_dim + vd));
        w->w_q = q > w->w_q ? q : w->w_q;
        w->w_o = o > w->w_o ? o : w->w_o;
        w->w_gu = tmp > w->w_gu ? tmp : w->w_gu;
    } else {
        int64_t nh = y->nh, hd = c->hd;
        const double dH = (double)H, dnh = (double)nh, dhd = (double)hd;
        f = 2.0 * dH * (double)(nh + 2 * y->nkv) * dhd + 4.0 * (double)sk * dnh * dhd + 2.0 * dnh * dhd * dH;
        int64_t q = ck_mul3(w, "attention buffers", rows, nh, hd);
        w->w_q = q > w->w_q ? q : w->w_q;
        w->w_o = w->w_q;
    }
    w->cr->flops += f * (double)rows;
    output_of(y, t, out);
    act_grow(w, out);
    track(w, out);
    return leave(w, y, out);
}

static hp_status feed_forward(walk *w, const hp__step *y, dact *t, dact *out)
{
    int64_t H = w->g->cfg.H, l = y->layer;
    hp_status st = enter(w, y, t);
    if (st != HP_OK) return st;
    int64_t rows = local_count(w, t) / H;
    if (y->op == HP__OP_MOE) {
        /* the EP runtime, created at the layer's first forward for the most rows any rank holds */
        int64_t T = 0;
        for (int64_t i = 0; i < w->dp; i++) T = w->dp_rows[i + 1] - w->dp_rows[i] > T ? w->dp_rows[i + 1] - w->dp_rows[i] : T;
        T = ck_mul(w, "MoE workspace", T, w->S_pad);
        int64_t tr = y->split ? w->pos.r[HP__TP] : 0, tn = y->split ? w->tp : 1;
        int64_t I = w->mI * (tr + 1) / tn - w->mI * tr / tn, sI = w->sI * (tr + 1) / tn - w->sI * tr / tn;
        if (ep_own_runtime(w, y->c.fqn, I, sI)) mem_count(w, 0, ep_workspace(w, y->c.fqn, T, I, sI));
        if ((st = moe_exchange(w, y, l, t)) != HP_OK) return st;
        output_of(y, t, out);
        act_grow(w, out);
        dact tk = {{t->g[0], t->g[1], w->K}, t->lay, 0}; /* the routed experts, kept for gather_topk */
        act_grow(w, &tk);
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
    return add_event(w, layer, where, "gather", HP_RUN_GATHER, "all", hp_mesh_world(w->mesh), 1, b, false);
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
    hp_status st = add_event(w, -1, "loss", "loss", HP_RUN_ALL_REDUCE, "tp", w->tp, calls,
                             ck_bytes(w, lb, ck_mul(w, lb, calls, n), sizeof(float)), false);
    if (st == HP_OK)
        st = add_event(w, -1, "loss", "loss", HP_RUN_ALL_REDUCE, "tp", w->tp, calls,
                       ck_bytes(w, lb, ck_mul(w, lb, calls, n), 2 * sizeof(double)), false);
    return st;
}

/* The loss on the whole logits z (loss_of). */
static hp_status loss(walk *w, const hp__step *s, const dact *z)
{
    int64_t lrows = ck_mul(w, "workspace", local_dim(w, z, 0), local_dim(w, z, 1));
    transient(w, loss_sums(w, lrows));
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
static hp_status walk_rank(walk *w)
{
    const hp__prog *g = w->g;
    hp_cost_rank *r = w->cr;
    hp_status st = HP_OK;
    int64_t Bl = w->dp_rows[r->dp + 1] - w->dp_rows[r->dp];
    dact h = {0}, t = {0}, a = {0};
    bool chunks = !w->o->train && g->head_chunks;
    for (size_t i = 0; st == HP_OK && i < g->n_steps; i++) {
        const hp__step *s = &g->steps[i];
        switch (s->op) {
        case HP__OP_EMBED:
            h = (dact){{Bl, w->S_pad, s->X}, s->out, 0};
            act_grow(w, &h);
            track(w, &h);
            st = leave(w, s, &h);
            break;
        case HP__OP_NORM:
            if (s->keep) /* a layer's input (the final norm's): what the backward keeps */
                w->w_saved = ck_add(w, "saved activations", w->w_saved, local_count(w, &h));
            st = norm(w, s, &h, &t);
            break;
        case HP__OP_ATTN:
        case HP__OP_MLA: st = attention(w, s, &t, &a); break;
        case HP__OP_MLP:
        case HP__OP_MOE: st = feed_forward(w, s, &t, &a); break;
        case HP__OP_RESIDUAL: st = trans(w, &a, &s->leave, s->layer, s->c.fqn, "residual"); break;
        /* inference is run's without the logits taken (hp_run_opts.no_logits: nothing gathered, and the head and
         * the loss in row chunks when the plan's head allows); training computes the loss on the whole logits */
        case HP__OP_HEAD:
            st = chunks ? head_loss_chunks(w, s, &g->steps[i + 1], &t, &a) : head(w, s, &t, &a);
            break;
        case HP__OP_LOSS:
            if (!chunks) st = loss(w, s, &a);
            break;
        default: break;
        }
    }
    return st;
}

/* The routing gathers (gather_topk) need each sparse layer's entry layout: a second, short pass. */
static hp_status topk_gathers(walk *w, const hp__step *s)
{
    const hp__lay *moe_lay = &s->run; /* the block's input after its entry: how the routing is laid out */
    int64_t Bl = w->dp_rows[w->cr->dp + 1] - w->dp_rows[w->cr->dp];
    dact tk = {{Bl, w->S_pad, w->K}, *moe_lay, 0};
    uint64_t full = gather_buffers(w, &tk);
    if (w->cr->rank == 0) /* the int32 routing [B, S, K] handed to the caller */
        transient(w, ck_addu(w, "workspace", ck_bytes(w, "workspace", ck_mul3(w, "workspace", w->B_all, w->S_orig,
                                                                              w->K), sizeof(int32_t)), 1));
    mem_count(w, full, 0);
    return gather(w, &tk, s->c.fqn, s->layer);
}

/* ---- the training state's classes ---- */

/* Bytes of one parameter in the checkpoint's dtype (torch_dtype): stored bytes / this = elements. */
static uint64_t param_bytes(const hp_model *m)
{
    int bits = hp_dtype_bits(m->cfg.dtype);
    return bits >= 8 ? (uint64_t)bits / 8 : 2;
}

/* Bytes of one parameter as the rank holds it: the checkpoint's dtype, bf16 under a GPU profile. */
static uint64_t held_bytes(const walk *w)
{
    return hp_cost_model_gpu(&w->o->mdl) ? 2 : param_bytes(w->m);
}

/* A class of a rank's weights for the training state: its elements on the rank, and the data-parallel group that
 * reduces their gradients and shares their ZeRO state (mask: the axes that shard it; -1 the dense parameters). */
typedef struct zclass {
    uint64_t numel;
    uint64_t trained; /* of numel, the trainable elements (--freeze: the rest has no gradient, state or master) */
    int64_t group;
    int mask;
} zclass;

/* The product of the sizes of the axes of mask. */
static int64_t mask_div(const walk *w, int mask)
{
    return ((mask & M_TP) ? w->tp : 1) * ((mask & M_CP) ? w->cp : 1) * ((mask & M_EP) ? w->ep : 1);
}

/* Rank r's classes (Megatron's model): the dense parameters, whose group is every rank with r's tp coordinate
 * (world / tp: dp, cp and an explicit ep axis), then the routed experts by the axes that shard them, whose group
 * is the ranks holding the same slice (world / (those axes' sizes): the expert-data-parallel group). Elements are
 * bytes / bytes(torch_dtype); each class's frozen elements are its frozen tensors' bytes divided likewise.
 * Returns the count; z[0] is the dense class. */
static int zero_classes(const walk *w, zclass *z)
{
    uint64_t pb = param_bytes(w->m), numel = w->w_full / held_bytes(w), ex = 0, fz = 0, fx = 0;
    int64_t world = hp_mesh_world(w->mesh);
    int n = 1;
    for (int mask = 0; mask < M_COUNT; mask++) {
        uint64_t b = w->k->expert_bytes[mask], div = (uint64_t)mask_div(w, mask);
        fz += w->k->frozen_bytes[mask] / div / pb; /* every frozen element of the rank, experts' too */
        if (!b) continue;
        uint64_t e = b / div / pb, f = w->k->frozen_expert_bytes[mask] / div / pb;
        if (e > numel - ex) e = numel - ex; /* a plan whose weights the layout counted otherwise: never below 0 */
        f = f < e ? f : e;
        z[n++] = (zclass){e, e - f, world / (int64_t)div > 0 ? world / (int64_t)div : 1, mask};
        ex += e, fx += f;
    }
    uint64_t dense = numel - ex, fd = fz > fx ? fz - fx : 0;
    z[0] = (zclass){dense, dense - (fd < dense ? fd : dense), world / w->tp > 0 ? world / w->tp : 1, -1};
    return n;
}

/* ---- predicted time ---- */

static double coll_time(const walk *w, const hp_cost_event *e, bool inter)
{
    const hp_cost_model *md = &w->o->mdl;
    int64_t n = e->group;
    if (n <= 1 || e->bytes == 0) return 0;
    double bw = inter ? md->bw_inter : md->bw_intra, a = inter ? md->lat_inter : md->lat_intra;
    double b = (double)e->bytes, nn = (double)n;
    switch (e->kind) {
    case HP_RUN_ALL_GATHER: return (nn - 1) * (a + b / bw);                   /* ring: n-1 blocks in */
    case HP_RUN_REDUCE_SCATTER: return (nn - 1) * (a + b / nn / bw);          /* ring: n-1 of n blocks */
    case HP_RUN_ALL_REDUCE: return 2 * (nn - 1) * (a + b / nn / bw);          /* reduce-scatter + all-gather */
    case HP_RUN_ALL_TO_ALL: return (double)e->calls * (nn - 1) * a + b / 2 * (nn - 1) / nn / bw; /* off-rank share */
    case HP_RUN_GATHER: return a + b / bw;
    default: return 0;
    }
}

/* Whether rank's group of the event spans nodes (ranks_per_node R: node = rank / R). A tp, cp or dp group
 * is the ranks that differ from rank on that coordinate only (axis_spans_nodes); an EP group is
 * hp_mesh_ep_index's. */
static bool spans_nodes(const walk *w, int64_t rank, const hp_cost_event *e)
{
    int64_t R = w->o->mdl.ranks_per_node;
    const hp_mesh *m = w->mesh;
    int64_t world = hp_mesh_world(m);
    if (R <= 0 || e->group <= 1 || world <= R) return false;
    if (!strcmp(e->axis, "all")) return true;
    if (!strcmp(e->axis, "dp") || !strcmp(e->axis, "edp")) { /* the gradients' groups (zero_classes) */
        zclass z[1 + M_COUNT];
        int nz = zero_classes(w, z), c = 0;
        for (int i = 1; i < nz && !strcmp(e->axis, "edp"); i++)
            if (z[i].group == e->group) { c = i; break; }
        int mask = z[c].mask < 0 ? M_TP : z[c].mask; /* dense: the ranks with rank's tp coordinate */
        int64_t t = hp_mesh_coord(m, rank, "tp"), cc = hp_mesh_coord(m, rank, "cp"), g, q, q2;
        hp_mesh_ep_index(m, w->ep, rank, &g, &q);
        for (int64_t o = 0; o < world; o++) { /* a member on another node */
            if (o / R == rank / R) continue;
            if ((mask & M_TP) && hp_mesh_coord(m, o, "tp") != t) continue;
            if ((mask & M_CP) && hp_mesh_coord(m, o, "cp") != cc) continue;
            if (mask & M_EP) {
                hp_mesh_ep_index(m, w->ep, o, &g, &q2);
                if (q2 != q) continue;
            }
            return true;
        }
        return false;
    }
    if (!strcmp(e->axis, "ep")) {
        for (int64_t i = 0; i < w->ep; i++)
            if (ep_member(m, w->ep, rank, i) / R != rank / R) return true;
        return false;
    }
    return axis_spans_nodes(w, rank, e->axis);
}

/* Bytes of the plan's tensors of bytes[mask] that one rank holds: each divided by the sizes of its axes. */
static uint64_t rank_share(const walk *w, const uint64_t *bytes)
{
    uint64_t s = 0;
    for (int mask = 0; mask < M_COUNT; mask++) {
        int64_t div = ((mask & M_TP) ? w->tp : 1) * ((mask & M_CP) ? w->cp : 1) * ((mask & M_EP) ? w->ep : 1);
        s += bytes[mask] / (uint64_t)(div > 0 ? div : 1);
    }
    return s;
}

/* Decode: what a step reads from memory. Every weight the rank holds once, less the embedding table (a step looks
 * up B rows of it) and the share of the routed experts no slot reaches (the balanced router's: w->touched), and the
 * batch's whole KV cache. */
static uint64_t decode_reads(const walk *w, const hp_cost_rank *r)
{
    uint64_t wb = r->weight_bytes, emb = rank_share(w, w->k->embed_bytes), ex = rank_share(w, w->k->expert_bytes);
    wb -= emb < wb ? emb : wb;
    ex = ex < wb ? ex : wb;
    if (w->n_sparse > 0) wb -= (uint64_t)((double)ex * (1.0 - w->touched / (double)w->n_sparse));
    uint64_t s;
    return __builtin_add_overflow(wb, r->kv_bytes, &s) ? UINT64_MAX : s;
}

static void predict(walk *w, hp_cost_rank *r)
{
    r->t_comm = 0;
    for (size_t i = 0; i < r->n_ev; i++) {
        hp_cost_event *e = &r->ev[i];
        e->seconds = coll_time(w, e, spans_nodes(w, r->rank, e));
        r->t_comm += e->seconds;
    }
    r->t_compute = w->o->mdl.gemm_flops > 0 ? r->flops / w->o->mdl.gemm_flops : 0;
    r->t_step = r->t_compute + r->t_comm;
    if (!w->o->decode) return;
    /* decode is bound by memory more than by FLOPs: the step takes the longer of the two */
    r->read_bytes = decode_reads(w, r);
    r->t_memory = w->o->mdl.mem_bw > 0 ? (double)r->read_bytes / w->o->mdl.mem_bw : 0;
    r->t_step = (r->t_compute > r->t_memory ? r->t_compute : r->t_memory) + r->t_comm;
}

/* ---- the training state as hyperpar train holds it (src/run/train.c) ---- */

/* A member's share of n elements of AdamW's moments: ZeRO-1 over a group of P gives member k the block
 * [k·⌈n/P⌉, (k+1)·⌈n/P⌉) ∩ [0, n) (train.c's opt_state); P < 2: all of it. */
static uint64_t zshare(uint64_t n, int64_t P, int64_t k)
{
    if (P < 2) return n;
    uint64_t blk = (n + (uint64_t)P - 1) / (uint64_t)P, lo = (uint64_t)k * blk < n ? (uint64_t)k * blk : n;
    return lo + blk <= n ? blk : n - lo;
}

/* The step whose module holds parameter name (its fqn and a dot lead the name), or -1: a tensor the program
 * does not use, which trains nowhere. A residual names the branch it adds, the module's own step comes first. */
static int64_t owner_step(const hp__prog *g, const char *name)
{
    for (size_t i = 0; i < g->n_steps; i++) {
        const char *f = g->steps[i].c.fqn;
        size_t n = f ? strlen(f) : 0;
        if (g->steps[i].op != HP__OP_RESIDUAL && n && !strncmp(name, f, n) && name[n] == '.') return (int64_t)i;
    }
    return -1;
}

/* grad_bytes, optim_bytes and master_bytes of rank r as train.c allocates them, from the rank's cut of every
 * tensor: each trainable tensor of a module of the program has an f32 gradient and AdamW's two f32 moments
 * (ZeRO-1: the rank's block over dp, or over the experts' expert-data-parallel group); the f32 masters: 4 bytes
 * per element of a tensor stored as bf16 (what the forward reads in exact compute; in BF16 compute a matrix's
 * bf16 copy, the weights, is its rounding), and 4 per router element always (the router is held in f64). An MoE block's routed experts train as four arrays (gate|up, down and their biases) and its
 * shared expert as two (gate|up, down), whose ZeRO blocks are cut whole; the expert gate gets no gradient. */
static hp_status runtime_state(walk *w, hp_cost_rank *r)
{
    const hp__prog *g = w->g;
    const hp_model *m = w->m;
    const hp_shard_layout *L = w->lay;
    int64_t world = hp_mesh_world(w->mesh), P1 = w->o->mdl.zero >= 1 ? w->dp : 1, k1 = r->dp;
    /* per MoE step: routed experts' weights, their gate|up and down biases, the shared gate|up and down */
    uint64_t (*acc)[5] = hp_calloc(g->n_steps + 1, sizeof *acc);
    if (!acc) return hp_err_set(w->err, HP_ERR_NOMEM, "out of memory");
    uint64_t gb = 0, ob = 0, mb = 0;
    hp_status st = HP_OK;
    for (size_t i = 0; i < L->n_tensors && st == HP_OK; i++) {
        hp_shard_tensor t;
        if ((st = hp_shard_rank_tensor(L, r->rank, i, &t, w->err)) != HP_OK) break;
        const hp_param *p = &m->params[t.params[0]];
        size_t nl = strlen(p->name), sl = strlen("e_score_correction_bias");
        if (!p->trainable || t.nbytes == 0 || (nl >= sl && !strcmp(p->name + nl - sl, "e_score_correction_bias")))
            continue;
        int64_t si = owner_step(g, p->name);
        if (si < 0) continue;
        uint64_t n = 1;
        for (int d = 0; d < t.n_dims; d++) n *= (uint64_t)t.local_shape[d];
        bool b16 = p->dtype == HP_DT_BF16;
        hp_role role = w->p->roles ? w->p->roles[t.params[0]] : HP_ROLE_REPLICATED;
        gb += 4 * n;
        if (g->steps[si].op != HP__OP_MOE) { /* a dense slice */
            mb += b16 ? 4 * n : 0;
            ob += 8 * zshare(n, P1, k1);
        } else if (role == HP_ROLE_MOE_GATE) { /* the router and its bias: an f32 master of the f64 held */
            mb += 4 * n;
            ob += 8 * zshare(n, P1, k1);
        } else {
            mb += b16 ? 4 * n : 0;
            bool down = strstr(p->name, "down") || strstr(p->name, ".w2.");
            bool bias = nl >= 4 && !strcmp(p->name + nl - 4, "bias");
            if (role == HP_ROLE_MOE_EXPERT) acc[si][bias ? (down ? 2 : 1) : 0] += n;
            else if (role == HP_ROLE_SHARED_EXPERT) acc[si][down ? 4 : 3] += n;
            else ob += 8 * zshare(n, P1, k1); /* Qwen2-MoE's shared expert gate */
        }
    }
    for (size_t si = 0; si < g->n_steps && st == HP_OK; si++) {
        if (g->steps[si].op != HP__OP_MOE) continue;
        /* the holders of r's experts: its EP index, and its tp index when tp cuts them (train.c's add_moe) */
        bool cut = g->steps[si].split;
        int64_t grp, q, q2, ti = r->tp, G = 0, k = 0;
        hp_mesh_ep_index(w->mesh, w->ep, r->rank, &grp, &q);
        for (int64_t o = 0; o < world; o++) {
            hp_mesh_ep_index(w->mesh, w->ep, o, &grp, &q2);
            if (q2 != q || (cut && hp_mesh_coord(w->mesh, o, "tp") != ti)) continue;
            G++;
            k += o < r->rank;
        }
        int64_t Pe = w->o->mdl.zero >= 1 ? G : 1;
        uint64_t we = acc[si][0]; /* gate|up is two thirds of the experts' weights, down one third */
        ob += 8 * (zshare(we - we / 3, Pe, k) + zshare(we / 3, Pe, k) + zshare(acc[si][1], Pe, k) +
                   zshare(acc[si][2], Pe, k));
        ob += 8 * (zshare(acc[si][3], P1, k1) + zshare(acc[si][4], P1, k1));
    }
    free(acc);
    r->grad_bytes = gb, r->optim_bytes = ob, r->master_bytes = mb;
    return st;
}

/* ---- memory ---- */

/* The GEMM layer's scratch (a widened 2 MiB block of bf16 weights, oneDNN's scratchpad) and the libraries'
 * working memory: a constant, measured as the anonymous memory a forward of the smallest golden adds beyond its
 * buffers (docs/cost.md). */
#define HP__COST_RUNTIME_SCRATCH ((uint64_t)4 << 20)

/* ---- activations on a GPU engine (docs/cost.md, "Activations under a GPU profile") ----
 *
 * Megatron's accounting (Korthikanti et al. 2022), bf16, per decoder layer of the rank's micro-batch of b rows and
 * s = S_pad / cp positions (T = s·b tokens), tp = t, f = t under sequence parallelism (else 1: the norms, the
 * inputs of the first projections and the dropout masks are whole on every tp rank):
 *   attention  5·T·H/f + 2·T·(q + k + v + o) [+ MLA: 2·T·(q_lora + kv_lora + rope)]  kept
 *              5·a·b·s·S_pad                                                        scores (softmax, mask, dropout)
 *   dense MLP  5·T·H/f + 6·T·I                      (gated: gate|up 4·T·I, the down input 2·T·I)
 *   MoE        5·T·H/f + 4·Tm·E + Tm·K·(4·H + 6·mI) + 6·Tm·sI   (router f32; the routed rows in and out, their
 *              gated intermediate; the shared expert), Tm the rows the block routes on the rank
 * q, k, v, o, I, mI, sI and a are the rank's local widths and heads. With H = a·d, k = v = H and I = 8H/3 the
 * layer is s·b·h·(34 + 5·a·s/h)/t, Korthikanti's. After the layers: the final norm's and the head's inputs
 * 4·T·H/f and the f32 logits 4·T·V_local. */
typedef struct gpu_acts {
    int64_t kept, scores; /* one layer's: what recompute none keeps, and of it the attention scores' part */
} gpu_acts;

static void gpu_step(walk *w, const hp__step *y, int64_t b, gpu_acts *a)
{
    const hp__rcfg *c = &w->g->cfg;
    const hp__mla *ml = &w->g->mla;
    const char *ab = "activations";
    int64_t s = w->S_pad / w->cp, T = ck_mul(w, ab, s, b), H = c->H, t = w->tp;
    int64_t f = w->p->sequence_parallel && t > 1 ? t : 1, base = ck_mul3(w, ab, 5, T, H) / f, k = 0;
    if (y->op == HP__OP_ATTN || y->op == HP__OP_MLA) {
        bool mla = y->op == HP__OP_MLA;
        int64_t q = y->nh * (mla ? ml->nope + ml->rope : c->hd), o = y->nh * (mla ? ml->vd : c->hd);
        k = ck_mul3(w, ab, 2, T, q + y->kw + y->vw + o);
        if (mla) k = ck_add(w, ab, k, ck_mul3(w, ab, 2, T, ml->ql + ml->kvl + ml->rope));
        a->scores = ck_add(w, ab, a->scores, ck_mul(w, ab, ck_mul3(w, ab, 5, y->nh, b), ck_mul(w, ab, s, w->S_pad)));
    } else if (y->op == HP__OP_MLP) {
        k = ck_mul3(w, ab, 6, T, y->split ? y->I / t : y->I); /* the step's I is the global width */
    } else if (y->op == HP__OP_MOE) {
        /* cut over tp: every tp rank takes every token and a 1/t of each expert's columns; whole experts: the
         * rank's rows (1/t of them under sequence parallelism), routed to whole experts */
        int64_t Tm = y->split ? T : T / f, mI = y->split ? w->mI / t : w->mI, sI = y->split ? w->sI / t : w->sI;
        k = ck_add(w, ab, ck_mul3(w, ab, 4, Tm, w->E), ck_mul3(w, ab, Tm, w->K, 4 * H + 6 * mI));
        k = ck_add(w, ab, k, ck_mul3(w, ab, 6, Tm, sI));
    } else {
        return;
    }
    a->kept = ck_add(w, ab, a->kept, ck_add(w, ab, base, k));
}

/* saved_bytes and act_bytes of rank r under a GPU profile: training keeps every layer's activations as the
 * recompute mode says, plus the final norm's and the head's inputs and the logits; act_bytes is the transient the
 * backward rebuilds for one layer (full: the whole layer; selective: its scores; none: nothing). Inference keeps
 * nothing across layers: act_bytes is the largest layer's activations and the bf16 logits. */
static void gpu_memory(walk *w, hp_cost_rank *r, int64_t b)
{
    const hp__prog *g = w->g;
    const char *ab = "activations";
    int64_t L = g->cfg.L, t = w->tp, f = w->p->sequence_parallel && t > 1 ? t : 1;
    int64_t T = ck_mul(w, ab, w->S_pad / w->cp, b), V = g->head_split ? g->cfg.V / t : g->cfg.V;
    int64_t kept = 0, biggest = 0, biggest_scores = 0;
    hp_cost_recompute rc = w->o->mdl.recompute;
    for (int64_t l = 0; l < L; l++) {
        gpu_acts a = {0};
        for (size_t i = 0; i < g->n_steps; i++)
            if (g->steps[i].layer == l) gpu_step(w, &g->steps[i], b, &a);
        int64_t all = ck_add(w, ab, a.kept, a.scores);
        biggest = all > biggest ? all : biggest;
        biggest_scores = a.scores > biggest_scores ? a.scores : biggest_scores;
        int64_t keep = rc == HP_COST_RECOMPUTE_FULL ? ck_mul3(w, ab, 2, T, g->cfg.H) / f
                       : rc == HP_COST_RECOMPUTE_SELECTIVE ? a.kept : all;
        kept = ck_add(w, ab, kept, keep);
    }
    if (!w->o->train) {
        r->act_bytes = (uint64_t)ck_add(w, ab, biggest, ck_mul3(w, ab, 2, T, V));
        return;
    }
    int64_t tail = ck_add(w, ab, ck_mul3(w, ab, 4, T, g->cfg.H) / f, ck_mul3(w, ab, 4, T, V));
    r->saved_bytes = (uint64_t)ck_add(w, ab, kept, tail);
    r->act_bytes = rc == HP_COST_RECOMPUTE_FULL ? (uint64_t)biggest
                   : rc == HP_COST_RECOMPUTE_SELECTIVE ? (uint64_t)biggest_scores : 0;
}

/* --zero 3: the largest layer's weights on the rank (the axes that shard each tensor divide it), in the held
 * dtype: gathered while the layer runs. */
static uint64_t zero3_gather(const walk *w)
{
    const hp_cost_plan *k = w->k;
    uint64_t best = 0, pb = param_bytes(w->m), hb = held_bytes(w);
    for (int64_t l = 0; l <= k->n_layers; l++) {
        uint64_t b = 0;
        for (int mask = 0; mask < M_COUNT; mask++) {
            int64_t div = ((mask & M_TP) ? w->tp : 1) * ((mask & M_CP) ? w->cp : 1) * ((mask & M_EP) ? w->ep : 1);
            b += k->layer_bytes[l][mask] / (uint64_t)div / pb * hb;
        }
        best = b > best ? b : best;
    }
    return best;
}

static void memory(walk *w, hp_cost_rank *r, const hp_cost_opts *o)
{
    bool gpu = hp_cost_model_gpu(&o->mdl);
    const hp__rcfg *c = &w->g->cfg;
    const hp_model_config *mc = &w->m->cfg;
    /* h and t hold hidden-width blocks, a the widest block (the logits: one row chunk's in inference), the
     * transitions' spare the largest block a transition started from; k, v; the module buffers; the collectives'
     * two scratch blocks; the MoE buffers of every sparse layer; and the groups' shared windows on one node */
    int64_t wide = w->w_wide > w->w_hidden ? w->w_wide : w->w_hidden;
    int64_t spare = w->w_spare > w->w_hidden ? w->w_spare : w->w_hidden;
    const char *ab = "activations", *kb = "KV cache", *tb = "total memory";
    int64_t terms[] = {w->w_hidden, w->w_hidden, wide, spare, w->w_kv, w->w_q, w->w_o, w->w_gu, w->w_h, w->w_s0,
                       w->w_s1, w->w_moe}, f = 0;
    for (size_t i = 0; i < sizeof terms / sizeof *terms; i++) f = ck_add(w, ab, f, terms[i]);
    r->act_bytes = ck_addu(w, ab, ck_addu(w, ab, ck_bytes(w, ab, f, sizeof(float)), HP__COST_RUNTIME_SCRATCH),
                           r->window_bytes);
    if (gpu) gpu_memory(w, r, w->dp_rows[r->dp + 1] - w->dp_rows[r->dp]);
    /* KV cache: per layer, one sequence's K and V of the rank's cached positions (MLA: the latent and the rope key,
     * not split by tp), times the rank's sequences */
    int64_t Bl = w->dp_rows[r->dp + 1] - w->dp_rows[r->dp], npos = o->decode ? o->context : w->S_pad, per_seq = 0;
    for (size_t i = 0; i < w->g->n_steps; i++) {
        const hp__step *y = &w->g->steps[i];
        if (y->op != HP__OP_ATTN && y->op != HP__OP_MLA) continue;
        int64_t width = y->op == HP__OP_MLA ? mc->kv_lora_rank + mc->qk_rope_head_dim : ck_mul3(w, kb, 2, y->nkv, c->hd);
        per_seq = ck_add(w, kb, per_seq, ck_mul(w, kb, cache_positions(w, y->layer, npos), width));
    }
    r->kv_seq_bytes = ck_bytes(w, kb, per_seq, (uint64_t)o->mdl.kv_bytes);
    r->kv_bytes = ck_bytes(w, kb, ck_mul(w, kb, per_seq, Bl), (uint64_t)o->mdl.kv_bytes);
    r->total_bytes = ck_addu(w, tb, r->weight_bytes, r->act_bytes);
    /* total: what counts against a budget, one meaning in cost, advise and the pages (docs/cost.md "Total");
     * serving keeps the KV cache of the batch */
    if (!o->train) {
        r->total_bytes = ck_addu(w, tb, r->total_bytes, r->kv_bytes);
        return;
    }
    /* activations kept for the backward: every layer's input and the final norm's, the residual stream's local
     * block as the runtime keeps it (hp_run_opts.keep_activations; sharded on tp under sequence parallelism) */
    if (!gpu) r->saved_bytes = ck_bytes(w, "saved activations", w->w_saved, sizeof(float));
    if (!gpu && o->mdl.state == HP_COST_STATE_RUNTIME && w->lay && o->mdl.zero <= 1 && runtime_state(w, r) == HP_OK) {
        uint64_t st = ck_addu(w, tb, ck_addu(w, tb, r->grad_bytes, r->optim_bytes),
                              ck_addu(w, tb, r->master_bytes, r->saved_bytes));
        r->total_bytes = ck_addu(w, tb, r->total_bytes, st);
        return;
    }
    zclass z[1 + M_COUNT];
    int nz = zero_classes(w, z);
    uint64_t pb = held_bytes(w), g = 0, op = 0, ms = 0, wz = 0;
    int zero = o->mdl.zero;
    /* ZeRO-1 splits the optimizer state and the master weights over each class's data-parallel group, ZeRO-2 the
     * gradients too; a rank keeps ceil(elements / group) of a class (the shards are padded to whole elements) */
    for (int i = 0; i < nz; i++) { /* the state of the trained elements; ZeRO-3 shards every weight */
        uint64_t n = z[i].trained, g1 = zero >= 1 ? (uint64_t)z[i].group : 1, g2 = zero >= 2 ? (uint64_t)z[i].group : 1;
        g = ck_addu(w, tb, g, ck_bytes(w, tb, (int64_t)((n + g2 - 1) / g2), (uint64_t)o->mdl.grad_bytes));
        op = ck_addu(w, tb, op, ck_bytes(w, tb, (int64_t)((n + g1 - 1) / g1), (uint64_t)o->mdl.optim_bytes));
        if (pb != 4) ms = ck_addu(w, tb, ms, ck_bytes(w, tb, (int64_t)((n + g1 - 1) / g1), (uint64_t)o->mdl.master_bytes));
        wz = ck_addu(w, tb, wz, ck_bytes(w, tb, (int64_t)((z[i].numel + g1 - 1) / g1), pb));
    }
    r->grad_bytes = g, r->optim_bytes = op, r->master_bytes = ms;
    if (zero >= 3) { /* FSDP: the weights sharded as the optimizer state, one layer gathered at a time */
        r->gather_bytes = zero3_gather(w);
        r->weight_bytes = wz;
        r->total_bytes = ck_addu(w, tb, ck_addu(w, tb, wz, r->act_bytes), r->gather_bytes);
    }
    uint64_t st = ck_addu(w, tb, ck_addu(w, tb, r->grad_bytes, r->optim_bytes), ck_addu(w, tb, r->master_bytes,
                                                                                      r->saved_bytes));
    r->total_bytes = ck_addu(w, tb, r->total_bytes, st);
}

/* The walk counted one forward of one micro-batch in hyperpar's f32: a step of n micro-batches runs each
 * collective n times, and a bf16 engine (a GPU profile) moves half the bytes (num / den = 1/2). */
static void scale_events(walk *w, hp_cost_rank *r, int64_t n, uint64_t num, uint64_t den)
{
    if (n == 1 && num == den) return;
    memset(r->bytes, 0, sizeof r->bytes);
    memset(r->calls, 0, sizeof r->calls);
    r->sent_bytes = r->wire_bytes = 0;
    const char *cb = "collective bytes";
    for (size_t i = 0; i < r->n_ev; i++) {
        hp_cost_event *e = &r->ev[i];
        e->bytes = ck_bytes(w, cb, (int64_t)(e->bytes / den * num + e->bytes % den * num / den), (uint64_t)n);
        e->wire_bytes = ck_bytes(w, cb, (int64_t)(e->wire_bytes / den * num + e->wire_bytes % den * num / den),
                                 (uint64_t)n);
        e->calls = ck_mul(w, "collective calls", e->calls, n); /* past 64 bits: the batch is refused */
        r->bytes[e->kind] = ck_addu(w, cb, r->bytes[e->kind], e->bytes);
        r->calls[e->kind] += (uint64_t)e->calls;
        if (e->group > 1) r->sent_bytes = ck_addu(w, cb, r->sent_bytes, e->bytes);
        r->wire_bytes = ck_addu(w, cb, r->wire_bytes, e->wire_bytes);
    }
    r->flops *= (double)n;
}

/* Train: the backward runs each forward collective's transpose, of the same bytes: an entry's all-gather (the
 * module then computes on whole rows with cut weights, so its input's gradient is a partial sum) is a
 * reduce-scatter; an exit's all-gather (what follows runs whole on every rank, the loss among it, so the gradient
 * is the same everywhere) is a slice and moves nothing; a reduce-scatter is an all-gather; an all-reduce stays one
 * (an exit's transposes to nothing and the matching entry's identity to an all-reduce: the count is the same); an
 * all-to-all is one back. Then dp all-reduces the gradients (estimates, added as events). */
static hp_status train_events(walk *w, hp_cost_rank *r)
{
    size_t n = r->n_ev;
    for (size_t i = 0; i < n; i++) {
        hp_cost_event e = r->ev[i];
        hp_run_coll kind = e.kind;
        if (e.kind == HP_RUN_GATHER) continue;
        if (e.kind == HP_RUN_ALL_GATHER) {
            if (!strcmp(e.step, "exit")) continue;
            kind = HP_RUN_REDUCE_SCATTER;
        } else if (e.kind == HP_RUN_REDUCE_SCATTER) {
            kind = HP_RUN_ALL_GATHER;
        }
        hp_status st = add_event(w, e.layer, e.where, "backward", kind, e.axis, e.group, e.calls, e.bytes, true);
        if (st != HP_OK) return st;
    }
    /* the tp sums of the gradients hyperpar train runs, one call each (hp__grad_sum_tp): the norm weights on rows
     * split over tp (SP), and the parameters whole on every tp rank of a module tp cuts (hp__tp_partial_params) */
    for (size_t i = 0; i < w->g->n_steps; i++) {
        const hp__step *s = &w->g->steps[i];
        static const char *const norm[] = {"weight", NULL};
        const char *const *rel = s->op == HP__OP_NORM ? norm : hp__tp_partial_params(s->op);
        for (; *rel; rel++) {
            char full[1200];
            snprintf(full, sizeof full, "%s%s%s", s->c.fqn, s->c.fqn[0] ? "." : "", *rel);
            const hp_param *par = hp_model_find_param(w->m, full);
            if (!par || !par->trainable || !hp__grad_sum_tp(s, w->tp, false, s->op != HP__OP_NORM && s->split)) continue;
            uint64_t gb = ck_bytes(w, "gradient tp sum", par->n_elems, (uint64_t)w->o->mdl.grad_bytes);
            hp_status st = add_event(w, s->layer, par->name, "backward", HP_RUN_ALL_REDUCE, "tp", w->tp, 1, gb, true);
            if (st != HP_OK) return st;
        }
    }
    /* the gradients' all-reduce: the dense parameters' over the data-parallel group, the experts' over the
     * expert-data-parallel group (the ranks holding the same experts) */
    zclass z[1 + M_COUNT];
    int nz = zero_classes(w, z);
    for (int i = 0; i < nz; i++) {
        if (z[i].group <= 1 || !z[i].trained) continue; /* frozen tensors have no gradient to reduce */
        uint64_t gb = ck_bytes(w, "gradient all-reduce", (int64_t)z[i].trained, (uint64_t)w->o->mdl.grad_bytes);
        hp_status st = add_event(w, -1, i ? "expert gradients" : "gradients", i ? "edp all-reduce" : "dp all-reduce",
                                 HP_RUN_ALL_REDUCE, i ? "edp" : "dp", z[i].group, 1, gb, true);
        if (st != HP_OK) return st;
    }
    return HP_OK;
}

/* ---- entry ---- */

static const char *config_path(const hp_model *m, char *buf, size_t cap)
{
    size_t n = strlen(m->path);
    if (m->meta && n > 5 && !strcmp(m->path + n - 5, ".json")) snprintf(buf, cap, "%s", m->path);
    else snprintf(buf, cap, "%s/config.json", m->ckpt ? hp_ckpt_dir(m->ckpt) : m->path);
    return buf;
}

int64_t hp_cost_rank_seqs(const hp_cost_rank *r, uint64_t mem_per_rank)
{
    if (!mem_per_rank) return -1;
    uint64_t fixed = r->weight_bytes + r->act_bytes; /* each below 2^64, as is their sum (hp_cost_eval checks it) */
    if (fixed >= mem_per_rank) return 0;
    if (!r->kv_seq_bytes) return INT64_MAX;
    uint64_t n = (mem_per_rank - fixed) / r->kv_seq_bytes;
    return n > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)n;
}

int64_t hp_cost_seqs(const hp_cost *c, uint64_t mem_per_rank)
{
    if (!mem_per_rank || c->refused[0] || c->n_ranks < 1) return -1;
    uint64_t usable = hp_cost_usable(&c->mdl, mem_per_rank); /* the reserve is the runtime's, not the cache's */
    if (!usable) return 0;
    int64_t fewest = INT64_MAX, all;
    for (int64_t i = 0; i < c->n_ranks; i++) {
        int64_t n = hp_cost_rank_seqs(&c->ranks[i], usable);
        fewest = n < fewest ? n : fewest;
    }
    return hp_mul_i64(fewest, c->dp, &all) ? all : INT64_MAX;
}

void hp_cost_free(hp_cost *c)
{
    if (!c) return;
    for (int64_t r = 0; r < c->n_ranks && c->ranks; r++) free(c->ranks[r].ev);
    free(c->ranks);
    free(c);
}

void hp_cost_plan_free(hp_cost_plan *k)
{
    if (!k) return;
    free(k->layer_bytes);
    free(k);
}

hp_status hp_cost_plan_create(hp_cost_plan **out, const hp_model *m, const hp_plan *p, hp_err *err)
{
    *out = NULL;
    hp_cost_plan *k = hp_calloc(1, sizeof *k);
    if (!k) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    k->m = m, k->p = p;
    k->n_layers = m->cfg.num_hidden_layers > 0 ? m->cfg.num_hidden_layers : 0;
    if (!(k->layer_bytes = hp_calloc((size_t)k->n_layers + 1, sizeof *k->layer_bytes))) {
        free(k);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    }
    if (!experts_scan(k)) {
        hp_cost_plan_free(k);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    }
    *out = k;
    return HP_OK;
}

hp_status hp_cost_compute(hp_cost **out, const hp_model *m, const hp_plan *p, const hp_cost_opts *o, hp_err *err)
{
    hp_cost_plan *k = NULL;
    hp_status st = hp_cost_plan_create(&k, m, p, err);
    if (st == HP_OK) st = hp_cost_eval(out, k, o, err);
    hp_cost_plan_free(k);
    return st;
}

/* The refusal of a batch whose figures 64 bits cannot hold (what: the first such figure, of rank rk when >= 0). */
static hp_status past_64_bits(const hp_cost_opts *o, int64_t rk, const char *what, hp_err *err)
{
    char who[48] = "";
    if (rk >= 0) snprintf(who, sizeof who, "rank %lld's ", (long long)rk);
    return hp_err_set(err, HP_ERR_INPUT, "the batch %lld x %lld (--batch x --seq) is past what the cost model can "
                      "hold: %s%s would need more than 2^64 bytes (or 2^63 elements); use a smaller batch or sequence",
                      (long long)o->B, (long long)o->S, who, what);
}

hp_status hp_cost_eval(hp_cost **out, const hp_cost_plan *k, const hp_cost_opts *o, hp_err *err)
{
    *out = NULL;
    const hp_model *m = k->m;
    const hp_plan *p = k->p;
    if (o->B < 1 || o->S < 1)
        return hp_err_set(err, HP_ERR_INPUT, "the batch is %lld x %lld; it needs at least one row and one position",
                          (long long)o->B, (long long)o->S);
    bool gpu = hp_cost_model_gpu(&o->mdl);
    if (!gpu && o->mdl.recompute != HP_COST_RECOMPUTE_NONE)
        return hp_err_set(err, HP_ERR_INPUT, "recompute %s describes a GPU engine's backward; hyperpar's runtime "
                          "(--hardware cpu) keeps its activations (--recompute none); give a GPU --hardware",
                          hp_cost_recompute_name(o->mdl.recompute));
    if (o->mdl.zero < 0 || o->mdl.zero > 3)
        return hp_err_set(err, HP_ERR_INPUT, "ZeRO level %d; give 0, 1, 2 or 3", o->mdl.zero);
    if (o->decode && (o->train || o->S != 1 || o->context < 1))
        return hp_err_set(err, HP_ERR_INPUT, "decode takes one new token per sequence (S = 1, here %lld) against a KV "
                          "cache of at least one position (context %lld), and no training (%s)", (long long)o->S,
                          (long long)o->context, o->train ? "train is set" : "not set");
    const hp_mesh *mesh = o->mesh ? o->mesh : &p->mesh;
    hp__prog g = {0};
    walk w = {.k = k, .m = m, .p = p, .o = o, .err = err, .mesh = mesh, .g = &g};
    w.tp = hp_mesh_size(mesh, "tp"), w.cp = hp_mesh_size(mesh, "cp"), w.dp = hp_mesh_batch_split(mesh);
    w.ep = o->mesh ? hp_mesh_ep_size(mesh) : hp_plan_ep_size(p);
    w.E = m->cfg.n_experts, w.K = m->cfg.num_experts_per_tok, w.mI = m->cfg.moe_intermediate_size;
    w.sI = m->cfg.shared_intermediate_size;
    const char *dpn = mesh->ep_axis ? "dp x ep" : "dp"; /* an ep axis splits the rows with dp */
    if (o->B < w.dp)
        return hp_err_set(err, HP_ERR_INPUT, "the batch has %lld rows for %s=%lld replicas; every replica needs at "
                          "least one row (use a smaller %s or a larger --batch)", (long long)o->B, dpn,
                          (long long)w.dp, dpn);
    /* gradient accumulation: the walk is one micro-batch of every replica; the step runs n_micro of them */
    int64_t n_micro = 1, mb = hp_cost_default_micro_batch(o, w.dp);
    hp_cost_opts om = *o;
    if (mb > 0) {
        if (mb > o->B / w.dp || o->B % (mb * w.dp))
            return hp_err_set(err, HP_ERR_INPUT, "the global batch of %lld rows does not divide into micro-batches of "
                              "%lld rows on each of %s=%lld replicas (%lld x %lld = %lld rows a round); give a "
                              "--micro-batch or a --global-batch that makes %lld a multiple of %lld",
                              (long long)o->B, (long long)mb, dpn, (long long)w.dp, (long long)mb, (long long)w.dp,
                              (long long)(mb * w.dp), (long long)o->B, (long long)(mb * w.dp));
        n_micro = o->B / (mb * w.dp);
        om.B = mb * w.dp;
    }
    const hp_cost_opts *oo = o; /* the global batch, for the report */
    o = &om;
    w.o = o;
    int64_t rpn = o->mdl.ranks_per_node, world = hp_mesh_world(mesh);
    if (rpn < 0 || (rpn > 0 && rpn < world && world % rpn))
        return hp_err_set(err, HP_ERR_INPUT, "--ranks-per-node %lld does not divide the world of %lld ranks (the last "
                          "node would hold %lld); give a divisor of %lld, or %lld or more for one node", (long long)rpn,
                          (long long)world, (long long)(rpn > 0 ? world % rpn : 0), (long long)world,
                          (long long)world);
    int64_t S_pad;
    if (!hp__seq_pad(o->S, w.cp, &S_pad)) return past_64_bits(oo, -1, "the padded sequence", err);
    hp_status st = HP_OK;
    hp_shard_layout *lay = NULL;
    hp_cost *c = NULL;
    const hp_shard_layout *lay_use = o->layout;
    if (st == HP_OK && !o->weights_given && !lay_use && (st = hp_shard_layout_build(&lay, m, p, err)) == HP_OK)
        lay_use = lay;
    w.lay = lay_use;
    int64_t n_eval = o->n_ranks > 0 ? o->n_ranks : world;
    for (int64_t i = 0; st == HP_OK && o->n_ranks > 0 && i < o->n_ranks; i++)
        if (o->ranks[i] < 0 || o->ranks[i] >= world)
            st = hp_err_set(err, HP_ERR_INPUT, "rank %lld is outside the mesh of %lld ranks", (long long)o->ranks[i],
                            (long long)world);
    if (st == HP_OK && (!(c = hp_calloc(1, sizeof *c)) || !(c->ranks = hp_calloc((size_t)n_eval, sizeof *c->ranks)) ||
                        !(w.dp_rows = hp_calloc((size_t)w.dp + 1, sizeof *w.dp_rows))))
        st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    if (st == HP_OK) {
        c->world = world, c->n_ranks = n_eval, c->B = oo->B, c->S = o->S, c->train = o->train, c->mdl = o->mdl;
        c->n_micro = n_micro;
        c->micro_batch = mb > 0 ? mb : (oo->B + w.dp - 1) / w.dp;
        c->decode = o->decode, c->context = o->decode ? o->context : 0, c->dp = w.dp;
        w.S_orig = o->S;
        w.S_pad = S_pad;
        w.B_all = o->B;
        c->S_pad = w.S_pad;
        hp__dp_rows(o->B, w.dp, w.dp_rows);
    }
    /* A plan the runtime refuses still has its weights: the rest is not derived, and says why. */
    char cfgp[4200];
    hp_status wst = HP_OK;
    if (st == HP_OK) wst = hp__prog_build(&g, m, p, o->mesh, config_path(m, cfgp, sizeof cfgp), err);
    if (st == HP_OK && wst == HP_OK) wst = owners(&w);
    for (int64_t ri = 0; st == HP_OK && ri < n_eval; ri++) {
        int64_t rk = o->n_ranks > 0 ? o->ranks[ri] : ri;
        hp_cost_rank *r = &c->ranks[ri];
        int64_t grp, nb;
        r->rank = rk;
        hp_mesh_batch_index(mesh, rk, &nb, &r->dp, NULL);
        r->cp = hp_mesh_coord(mesh, rk, "cp"), r->tp = hp_mesh_coord(mesh, rk, "tp");
        hp_mesh_ep_index(mesh, w.ep, rk, &grp, &r->ep);
        r->weight_bytes = lay_use ? lay_use->ranks[rk].nbytes : o->weight_bytes;
        if (gpu) r->weight_bytes = r->weight_bytes / param_bytes(m) * 2; /* a bf16 engine holds bf16 weights */
        w.w_full = r->weight_bytes;
        w.pos = (hp__axes){{w.tp, w.cp}, {r->tp, r->cp}};
        w.cr = r;
        w.ev_cap = 0;
        w.w_hidden = w.w_wide = w.w_spare = w.w_kv = w.w_q = w.w_o = w.w_gu = w.w_h = w.w_s0 = w.w_s1 = w.w_moe = 0;
        w.w_saved = 0;
        w.touched = 0, w.n_sparse = 0, w.n_ep_shape = 0;
        w.c_spare = w.c_s0 = w.c_s1 = w.c_k = w.c_v = 0;
        memset(w.c_buf, 0, sizeof w.c_buf);
        w.rope_b = w.m_cur = w.m_peak = 0;
        w.ws_ovf = false;
        memset(w.win_used, 0, sizeof w.win_used);
        memset(w.win_max, 0, sizeof w.win_max);
        w.ev_times = 1;
        w.ovf = NULL;
        r->total_bytes = r->weight_bytes;
        if (wst == HP_OK) wst = walk_rank(&w);
        /* gather_topk: the routed experts of each sparse layer, laid out as the block's input after entry (an
         * output of inference; training gathers none) */
        for (size_t i = 0; wst == HP_OK && !o->train && i < g.n_steps; i++)
            if (g.steps[i].op == HP__OP_MOE) wst = topk_gathers(&w, &g.steps[i]);
        if (wst == HP_OK) r->workspace_bytes = w.ws_ovf ? UINT64_MAX : w.m_peak;
        for (int ax = 0; wst == HP_OK && ax < HP__NAX; ax++) /* the windows run keeps beside its workspace */
            if (w.win_used[ax])
                r->window_bytes = ck_addu(&w, "workspace", r->window_bytes, hp_comm_window_size(w.win_max[ax]));
        if (wst == HP_OK) scale_events(&w, r, n_micro, gpu ? 1 : 4, 4);
        if (wst == HP_OK) memory(&w, r, o);
        if (wst == HP_OK && o->train) {
            r->flops *= 3; /* backward: twice the forward's GEMMs */
            wst = train_events(&w, r);
        }
        if (wst == HP_OK) predict(&w, r);
        if (w.ovf) { /* a batch too large to count is the caller's input, whatever the plan: not a refused plan */
            st = past_64_bits(oo, rk, w.ovf, err);
        }
    }
    if (st == HP_OK && wst == HP_OK && g.moe_whole)
        snprintf(c->note, sizeof c->note, "the MoE blocks (%s, ...) take every token's whole hidden state on each of "
                 "the tp=%lld ranks (sequence parallelism is off): every tp rank routes and runs the experts of every "
                 "token, so the expert FLOPs and the token exchange are tp times what they are with sequence "
                 "parallelism; plan without --no-sequence-parallel", g.moe_whole, (long long)w.tp);
    if (st == HP_OK && wst != HP_OK) {
        if (wst != HP_ERR_INPUT) st = wst;
        snprintf(c->refused, sizeof c->refused, "%s", err->msg);
        for (int64_t ri = 0; ri < n_eval; ri++) { /* only the weights stand */
            hp_cost_rank *r = &c->ranks[ri];
            free(r->ev);
            uint64_t wb = r->weight_bytes;
            int64_t rk = r->rank, d = r->dp, cc = r->cp, t = r->tp, e = r->ep;
            memset(r, 0, sizeof *r);
            r->rank = rk, r->dp = d, r->cp = cc, r->tp = t, r->ep = e;
            r->weight_bytes = r->total_bytes = wb;
        }
        hp_err_clear(err);
    }
    if (st == HP_OK) {
        for (int64_t ri = 1; ri < n_eval; ri++)
            if (c->ranks[ri].total_bytes > c->ranks[c->max_rank].total_bytes) c->max_rank = ri;
        *out = c;
        c = NULL;
    }
    hp_cost_free(c);
    hp_shard_layout_free(lay);
    hp__prog_free(&g);
    free(w.owner);
    free(w.dp_rows);
    return st;
}

const char *hp_cost_rank_binding(const hp_cost_rank *r, bool train, uint64_t *bytes)
{
    const struct {
        const char *name;
        uint64_t b;
    } it[] = {{"weights", r->weight_bytes},          {"activations", r->act_bytes},
              {"KV cache", train ? 0 : r->kv_bytes}, {"gradients", r->grad_bytes},
              {"optimizer state", r->optim_bytes},   {"master weights", r->master_bytes},
              {"saved activations", r->saved_bytes}, {"gathered weights", r->gather_bytes}};
    size_t best = 0;
    for (size_t i = 1; i < sizeof it / sizeof *it; i++)
        if (it[i].b > it[best].b) best = i;
    *bytes = it[best].b;
    return it[best].name;
}
