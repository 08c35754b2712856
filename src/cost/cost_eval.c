/*
 * cost_eval.c — what the dry walk of each rank (cost.c) adds up to: the training state's bytes as hyperpar train
 * holds them, the rank's memory, the training step's events, the predicted time; and the entry points
 * (hp_cost_plan_create, hp_cost_eval, hp_cost_compute). docs/cost.md.
 */
#include "cost/cost_int.h"
#include "kernels/modules.h"
#include "model/model_int.h"

#include "hyperpar/comm.h"
#include "hyperpar/linalg.h"
#include "hyperpar/moe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the training state's classes ---- */

/* Bytes of one parameter in the checkpoint's dtype (torch_dtype): stored bytes / this = elements. */
static uint64_t param_bytes(const hp_model *m)
{
    int bits = hp_dtype_bits(m->cfg.dtype);
    return bits >= 8 ? (uint64_t)bits / 8 : 2;
}

/* Whether a rank's weights are counted as hyperpar's runtime holds them (held.c): not under a GPU profile, whose
 * engine holds bf16 weights, nor under Megatron-LM's byte model of the training state, which counts them as stored. */
static bool runtime_weights(const hp_cost_opts *o)
{
    return !hp_cost_model_gpu(&o->mdl) && o->mdl.state == HP_COST_STATE_RUNTIME;
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
    double bw = (inter ? md->bw_inter : md->bw_intra) * md->link_eff, a = inter ? md->lat_inter : md->lat_intra;
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
            if (hp__cost_ep_member(m, w->ep, rank, i) / R != rank / R) return true;
        return false;
    }
    return hp__cost_axis_spans_nodes(w, rank, e->axis);
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

/* The step time (docs/cost.md "FLOPs and step time"): the FLOPs at the sustained rate, the collectives at the
 * links' reachable bandwidth, and of those what the step waits for. A GPU engine (Megatron-LM's distributed
 * optimizer, PyTorch DDP/FSDP) reduces the gradients over dp in buckets while the backward still computes, so the
 * dp and edp events hide behind the backward's compute and only their excess is exposed; tp, cp and ep
 * collectives sit on the critical path. hyperpar's own runtime (cpu) reduces after the backward: nothing hides. */
static void predict(walk *w, hp_cost_rank *r)
{
    const hp_cost_model *md = &w->o->mdl;
    r->t_comm = r->t_overlap = 0;
    bool overlaps = w->o->train && hp_cost_model_gpu(md);
    for (size_t i = 0; i < r->n_ev; i++) {
        hp_cost_event *e = &r->ev[i];
        e->seconds = coll_time(w, e, spans_nodes(w, w->lrank, e));
        r->t_comm += e->seconds;
        if (overlaps && (!strcmp(e->axis, "dp") || !strcmp(e->axis, "edp"))) r->t_overlap += e->seconds;
    }
    double rate = md->gemm_flops * md->gemm_eff;
    r->t_compute = rate > 0 ? r->flops / rate : 0;
    /* the backward's share of the FLOPs: twice the forward's GEMMs and what it recomputes (flops = 3 F + rc) */
    double fwd = (r->flops - r->recompute_flops) / 3, t_bwd = rate > 0 && w->o->train ? (r->flops - fwd) / rate : 0;
    double hidden = r->t_overlap < t_bwd ? r->t_overlap : t_bwd;
    r->t_exposed = r->t_comm - hidden;
    r->t_bubble = 0; /* a pipeline's: set once every stage's times are known (pipe.c) */
    r->t_step = r->t_compute + r->t_exposed + r->t_bubble;
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

/* zero_step's buffers for an array of n elements ZeRO-1 shards over P: the rank's block and the gathered blocks,
 * each with train.c's one spare float, into the largest so far (*mx). */
static void zero_tmp(uint64_t *mx, uint64_t n, int64_t P)
{
    if (P < 2) return;
    uint64_t blk = (n + (uint64_t)P - 1) / (uint64_t)P, b = (blk + 1 + (uint64_t)P * blk + 1) * sizeof(float);
    if (b > *mx) *mx = b;
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
    uint64_t gb = 0, ob = 0, mb = 0, zt = 0;
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
        /* TP-extend-EP: the plan cuts the shared expert over tp, but each rank runs it whole on its own rows (the
         * runner's load_moe gathers it), and trains it whole */
        if (role == HP_ROLE_SHARED_EXPERT && g->steps[si].op == HP__OP_MOE && !g->steps[si].split)
            n = (uint64_t)p->n_elems;
        gb += 4 * n;
        if (g->steps[si].op != HP__OP_MOE) { /* a dense slice */
            mb += b16 ? 4 * n : 0;
            ob += 8 * zshare(n, P1, k1);
            zero_tmp(&zt, n, P1);
        } else if (role == HP_ROLE_MOE_GATE) { /* the router and its bias: an f32 master of the f64 held */
            mb += 4 * n;
            ob += 8 * zshare(n, P1, k1);
            zero_tmp(&zt, n, P1);
        } else {
            mb += b16 ? 4 * n : 0;
            bool down = strstr(p->name, "down") || strstr(p->name, ".w2.");
            bool bias = nl >= 4 && !strcmp(p->name + nl - 4, "bias");
            if (role == HP_ROLE_MOE_EXPERT) acc[si][bias ? (down ? 2 : 1) : 0] += n;
            else if (role == HP_ROLE_SHARED_EXPERT) acc[si][down ? 4 : 3] += n;
            else { /* Qwen2-MoE's shared expert gate */
                ob += 8 * zshare(n, P1, k1);
                zero_tmp(&zt, n, P1);
            }
        }
    }
    for (size_t si = 0; si < g->n_steps && st == HP_OK; si++) {
        if (g->steps[si].op != HP__OP_MOE) continue;
        /* the holders of r's experts: its EP index, and its tp index when tp cuts them (train.c's add_moe) */
        bool cut = g->steps[si].split;
        int64_t grp, q, q2, ti = r->tp, G = 0, k = 0;
        hp_mesh_ep_index(w->mesh, w->ep, w->lrank, &grp, &q);
        for (int64_t o = 0; o < world; o++) {
            hp_mesh_ep_index(w->mesh, w->ep, o, &grp, &q2);
            if (q2 != q || (cut && hp_mesh_coord(w->mesh, o, "tp") != ti)) continue;
            G++;
            k += o < w->lrank;
        }
        int64_t Pe = w->o->mdl.zero >= 1 ? G : 1;
        uint64_t we = acc[si][0]; /* gate|up is two thirds of the experts' weights, down one third */
        ob += 8 * (zshare(we - we / 3, Pe, k) + zshare(we / 3, Pe, k) + zshare(acc[si][1], Pe, k) +
                   zshare(acc[si][2], Pe, k));
        ob += 8 * (zshare(acc[si][3], P1, k1) + zshare(acc[si][4], P1, k1));
        uint64_t arr[] = {we - we / 3, we / 3, acc[si][1], acc[si][2]};
        for (int a = 0; a < 4; a++)
            if (arr[a]) zero_tmp(&zt, arr[a], Pe);
        for (int a = 3; a < 5; a++)
            if (acc[si][a]) zero_tmp(&zt, acc[si][a], P1);
    }
    free(acc);
    r->grad_bytes = gb, r->optim_bytes = ob, r->master_bytes = mb;
    w->zero_tmp = zt;
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
    int64_t kept = 0, biggest = 0, biggest_scores = 0, C = w->pipe->n_chunks > 1 ? w->pipe->n_chunks : 1;
    bool last = (C - 1) % w->pp == w->stage; /* the stage of the head */
    hp_cost_recompute rc = w->o->mdl.recompute;
    memset(w->ch_gpu_saved, 0, (size_t)C * sizeof *w->ch_gpu_saved);
    for (int64_t l = 0; l < L; l++) {
        if (w->pp > 1 && hp_pipeline_stage_of(w->pipe, l) != w->stage) continue; /* another stage's layer */
        gpu_acts a = {0};
        for (size_t i = 0; i < g->n_steps; i++)
            if (g->steps[i].layer == l) gpu_step(w, &g->steps[i], b, &a);
        int64_t all = ck_add(w, ab, a.kept, a.scores);
        biggest = all > biggest ? all : biggest;
        biggest_scores = a.scores > biggest_scores ? a.scores : biggest_scores;
        int64_t keep = rc == HP_COST_RECOMPUTE_FULL ? ck_mul3(w, ab, 2, T, g->cfg.H) / f
                       : rc == HP_COST_RECOMPUTE_SELECTIVE ? a.kept : all;
        kept = ck_add(w, ab, kept, keep);
        int64_t c = w->pp > 1 ? hp_pipeline_chunk_of(w->pipe, l) : 0;
        w->ch_gpu_saved[c] = (uint64_t)ck_add(w, ab, (int64_t)w->ch_gpu_saved[c], keep);
    }
    if (!w->o->train) {
        r->act_bytes = (uint64_t)ck_add(w, ab, biggest, last ? ck_mul3(w, ab, 2, T, V) : 0);
        return;
    }
    int64_t tail = last ? ck_add(w, ab, ck_mul3(w, ab, 4, T, g->cfg.H) / f, ck_mul3(w, ab, 4, T, V)) : 0;
    w->ch_gpu_saved[C - 1] = (uint64_t)ck_add(w, ab, (int64_t)w->ch_gpu_saved[C - 1], tail);
    r->saved_bytes = (uint64_t)ck_add(w, ab, kept, tail);
    if (w->pp > 1) { /* each chunk's, times the micro-batches the schedule keeps in flight */
        for (int64_t c = 0; c < C; c++) w->ch_by[c] = (double)w->ch_gpu_saved[c];
        r->saved_bytes = hp__cost_in_flight(w, r, w->ch_by);
    }
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
        if (w->pp > 1 && l < k->n_layers && hp_pipeline_stage_of(w->pipe, l) != w->stage) continue;
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
        if ((y->op != HP__OP_ATTN && y->op != HP__OP_MLA) || y->chunk % w->pp != w->stage) continue;
        int64_t width = y->op == HP__OP_MLA ? mc->kv_lora_rank + mc->qk_rope_head_dim : ck_mul3(w, kb, 2, y->nkv, c->hd);
        per_seq = ck_add(w, kb, per_seq, ck_mul(w, kb, hp__cost_cache_positions(w, y->layer, npos), width));
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
    if (!gpu && w->pp > 1) { /* each chunk's, times the micro-batches the schedule keeps in flight */
        for (int64_t k = 0; k < w->pipe->n_chunks; k++) w->ch_by[k] = (double)w->ch_saved[k] * sizeof(float);
        r->saved_bytes = hp__cost_in_flight(w, r, w->ch_by);
    }
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
    r->attn_flops *= (double)n;
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
        w->cur_chunk = e.chunk;
        hp_status st = hp__cost_add_event(w, e.layer, e.where, "backward", kind, e.axis, e.group, e.calls, e.bytes, true);
        if (st != HP_OK) return st;
    }
    /* the tp sums of the gradients hyperpar train runs, one call each (hp__grad_sum_tp): the norm weights on rows
     * split over tp (SP), and the parameters whole on every tp rank of a module tp cuts (HP__P_TP_PARTIAL) */
    for (size_t i = 0; i < w->g->n_steps; i++) {
        const hp__step *s = &w->g->steps[i];
        if (s->chunk % w->pp != w->stage) continue; /* another stage's parameters */
        w->cur_chunk = s->chunk;
        size_t np;
        const hp__pdef *d = hp__op_params(s->op, &np);
        for (size_t k = 0; k < np; k++) {
            if (s->op != HP__OP_NORM && !(d[k].flags & HP__P_TP_PARTIAL)) continue;
            char full[1200];
            snprintf(full, sizeof full, "%s%s%s", s->c.fqn, s->c.fqn[0] ? "." : "", d[k].rel);
            const hp_param *par = hp_model_find_param(w->m, full);
            if (!par || !par->trainable || !hp__grad_sum_tp(s, w->tp, false, s->op != HP__OP_NORM && s->split)) continue;
            uint64_t gb = ck_bytes(w, "gradient tp sum", par->n_elems, (uint64_t)w->o->mdl.grad_bytes);
            hp_status st = hp__cost_add_event(w, s->layer, par->name, "backward", HP_RUN_ALL_REDUCE, "tp", w->tp, 1, gb, true);
            if (st != HP_OK) return st;
        }
    }
    /* the gradients' all-reduce: the dense parameters' over the data-parallel group, the experts' over the
     * expert-data-parallel group (the ranks holding the same experts) */
    zclass z[1 + M_COUNT];
    int nz = zero_classes(w, z);
    w->cur_chunk = -1; /* after the micro-batches */
    for (int i = 0; i < nz; i++) {
        if (z[i].group <= 1 || !z[i].trained) continue; /* frozen tensors have no gradient to reduce */
        uint64_t gb = ck_bytes(w, "gradient all-reduce", (int64_t)z[i].trained, (uint64_t)w->o->mdl.grad_bytes);
        hp_status st = hp__cost_add_event(w, -1, i ? "expert gradients" : "gradients", i ? "edp all-reduce" : "dp all-reduce",
                                 HP_RUN_ALL_REDUCE, i ? "edp" : "dp", z[i].group, 1, gb, true);
        if (st != HP_OK) return st;
    }
    return HP_OK;
}

/* ---- entry ---- */

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
    free(c->stages);
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
    if (!hp__cost_experts_scan(k)) {
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

/* The options a batch's cost needs, checked before anything is derived. */
static hp_status opts_check(const hp_cost_opts *o, hp_err *err)
{
    if (o->B < 1 || o->S < 1)
        return hp_err_set(err, HP_ERR_INPUT, "the batch is %lld x %lld; it needs at least one row and one position",
                          (long long)o->B, (long long)o->S);
    if (!hp_cost_model_gpu(&o->mdl) && o->mdl.recompute != HP_COST_RECOMPUTE_NONE)
        return hp_err_set(err, HP_ERR_INPUT, "recompute %s describes a GPU engine's backward; hyperpar's runtime "
                          "(--hardware cpu) keeps its activations (--recompute none); give a GPU --hardware",
                          hp_cost_recompute_name(o->mdl.recompute));
    if (o->mdl.zero < 0 || o->mdl.zero > 3)
        return hp_err_set(err, HP_ERR_INPUT, "ZeRO level %d; give 0, 1, 2 or 3", o->mdl.zero);
    if (o->decode && (o->train || o->S != 1 || o->context < 1))
        return hp_err_set(err, HP_ERR_INPUT, "decode takes one new token per sequence (S = 1, here %lld) against a KV "
                          "cache of at least one position (context %lld), and no training (%s)", (long long)o->S,
                          (long long)o->context, o->train ? "train is set" : "not set");
    return HP_OK;
}

/* Rank rk walked into r (w's per-rank state reset first): its steps, routing gathers, workspace, memory, training
 * events and time. wst: the program's state so far (a refused plan walks nothing); returns it. */
static hp_status eval_rank(walk *w, hp_cost_rank *r, int64_t rk, int64_t n_micro, hp_status wst)
{
    const hp_cost_opts *o = w->o;
    const hp__prog *g = w->g;
    const hp_mesh *mesh = w->mesh;
    bool gpu = hp_cost_model_gpu(&o->mdl);
    int64_t grp, nb;
    r->rank = rk;
    w->stage = r->stage = rk / w->per, w->lrank = rk % w->per; /* the walk's mesh is the stage's */
    hp_mesh_batch_index(mesh, w->lrank, &nb, &r->dp, NULL);
    r->cp = hp_mesh_coord(mesh, w->lrank, "cp"), r->tp = hp_mesh_coord(mesh, w->lrank, "tp");
    hp_mesh_ep_index(mesh, w->ep, w->lrank, &grp, &r->ep);
    r->weight_bytes = r->stored_bytes = w->lay                                   ? w->lay->ranks[rk].nbytes
                                        : o->stage_weight_bytes && w->pp > 1 ? o->stage_weight_bytes[r->stage]
                                                                             : o->weight_bytes;
    r->in_flight = 1;
    w->p2p_block = 0;
    if (gpu) r->weight_bytes = r->weight_bytes / param_bytes(w->m) * 2; /* a bf16 engine holds bf16 weights */
    w->w_full = r->weight_bytes;
    /* hyperpar's runtime holds some tensors in another dtype than stored, or whole where the layout cuts them, so
     * the rank's weights are what it holds (held.c). The bytes as stored (w_full) still count the elements that
     * the training state's classes divide. */
    if (w->held && wst == HP_OK)
        wst = hp__cost_held_rank(w->m, w->lay, w->held, o->train, rk, &r->weight_bytes, w->err);
    else if (o->weights_given && w->pp > 1 && o->stage_held_bytes && o->stage_held_bytes[r->stage] && runtime_weights(o))
        r->weight_bytes = o->stage_held_bytes[r->stage];
    else if (o->weights_given && o->held_weight_bytes && runtime_weights(o)) r->weight_bytes = o->held_weight_bytes;
    w->pos = (hp__axes){{w->tp, w->cp}, {r->tp, r->cp}};
    w->cr = r;
    w->ev_cap = 0;
    w->w_hidden = w->w_wide = w->w_spare = w->w_kv = w->w_q = w->w_o = w->w_gu = w->w_h = w->w_s0 = w->w_s1 = 0;
    w->w_moe = w->w_saved = 0;
    w->touched = 0, w->n_sparse = 0, w->n_ep_shape = 0;
    w->c_spare = w->c_s0 = w->c_s1 = w->c_k = w->c_v = 0;
    memset(w->c_buf, 0, sizeof w->c_buf);
    w->rope_b = w->m_cur = w->m_peak = 0;
    w->ws_ovf = false;
    memset(w->win_used, 0, sizeof w->win_used);
    memset(w->win_max, 0, sizeof w->win_max);
    w->ev_times = 1;
    w->ovf = NULL;
    r->total_bytes = r->weight_bytes;
    if (wst == HP_OK) wst = hp__cost_walk_rank(w);
    /* gather_topk: the routed experts of each sparse layer, laid out as the block's input after entry (an output
     * of inference; training gathers none), on its stage */
    for (size_t i = 0; wst == HP_OK && !o->train && i < g->n_steps; i++)
        if (g->steps[i].op == HP__OP_MOE) wst = hp__cost_topk_gathers(w, &g->steps[i]);
    if (wst == HP_OK) r->workspace_bytes = w->ws_ovf ? UINT64_MAX : w->m_peak;
    for (int ax = 0; wst == HP_OK && ax < HP__NAX; ax++) /* the windows run keeps beside its workspace */
        if (w->win_used[ax])
            r->window_bytes = ck_addu(w, "workspace", r->window_bytes, hp_comm_window_size(w->win_max[ax]));
    if (wst == HP_OK) scale_events(w, r, n_micro, gpu ? 1 : 4, 4);
    if (wst == HP_OK) { /* the stream per micro-batch, and in training its gradient back; a bf16 engine's half */
        int64_t k = o->train ? 2 * n_micro : n_micro;
        r->p2p_bytes = ck_bytes(w, "point-to-point bytes", (int64_t)(gpu ? r->p2p_bytes / 2 : r->p2p_bytes), (uint64_t)k);
        r->p2p_calls = ck_bytes(w, "point-to-point calls", (int64_t)r->p2p_calls, (uint64_t)k);
    }
    w->zero_tmp = 0;
    if (wst == HP_OK) memory(w, r, o);
    /* the optimizer step, after the micro-batches released their buffers (train.c): ZeRO's all-gathers alone */
    if (wst == HP_OK && !w->ws_ovf && w->zero_tmp > r->workspace_bytes) r->workspace_bytes = w->zero_tmp;
    if (wst == HP_OK && o->train) {
        /* the backward: twice the forward's GEMMs, and under a GPU engine what it recomputes of the forward, the
         * whole forward (full) or the attention core (selective: the scores and P·V, Korthikanti et al. 2022) */
        hp_cost_recompute rc = gpu ? o->mdl.recompute : HP_COST_RECOMPUTE_NONE;
        r->recompute_flops = rc == HP_COST_RECOMPUTE_FULL        ? r->flops
                             : rc == HP_COST_RECOMPUTE_SELECTIVE ? r->attn_flops
                                                                 : 0;
        r->flops = 3 * r->flops + r->recompute_flops;
        wst = train_events(w, r);
    }
    if (wst == HP_OK) predict(w, r);
    return wst;
}

/* MFU of a training step of B rows of S positions: the model's FLOPs (mfu.c's 6·W·T and the attention scores',
 * no recompute) over what the world's peak (gemm_flops, not the sustained rate) does in the step's time; each rank
 * against an equal share of them, the step against its slowest rank. */
static void step_mfu(hp_cost *c, const hp_model *m, int64_t B, int64_t S)
{
    c->model_flops = hp_cost_train_flops(m, B * S) + hp_cost_attn_train_flops(m, B, S);
    double peak = c->mdl.gemm_flops * (double)c->world, slowest = 0;
    for (int64_t i = 0; i < c->n_ranks; i++) {
        hp_cost_rank *r = &c->ranks[i];
        r->mfu = r->t_step > 0 && peak > 0 ? c->model_flops / (r->t_step * peak) : 0;
        slowest = r->t_step > slowest ? r->t_step : slowest;
    }
    c->mfu = slowest > 0 && peak > 0 ? c->model_flops / (slowest * peak) : 0;
}

/* A pipeline: each rank is walked as a rank of its stage's mesh (inner: the plan's less pp), on its stage's chunks;
 * opts' pipeline (advise) replaces the plan's in pq. */
static hp_status pipe_setup(walk *w, hp_plan *pq, hp_mesh *inner, hp_err *err)
{
    const hp_cost_opts *o = w->o;
    w->pipe = o->pipe ? o->pipe : &w->p->pipe, w->pp = hp_mesh_size(w->mesh, "pp");
    if (w->pp > 1 && w->pipe->pp != w->pp)
        return hp_err_set(err, HP_ERR_INPUT, "the mesh has pp=%lld but the pipeline's split has %lld stages",
                          (long long)w->pp, (long long)w->pipe->pp);
    if (w->pp > 1 && o->decode)
        return hp_err_set(err, HP_ERR_INPUT, "cost --mode decode does not model a pipeline (pp=%lld) yet: a decode "
                          "step's figures are per token through every stage; use --mode infer or train, or drop pp",
                          (long long)w->pp);
    if (o->pipe) {
        *pq = *w->p;
        pq->pipe = *o->pipe;
        w->p = pq;
    }
    hp__cost_stage_mesh(w->mesh, inner);
    w->mesh = inner;
    w->per = hp_mesh_world(inner);
    return HP_OK;
}

hp_status hp_cost_eval(hp_cost **out, const hp_cost_plan *k, const hp_cost_opts *o, hp_err *err)
{
    *out = NULL;
    const hp_model *m = k->m;
    const hp_plan *p = k->p;
    hp_status st = opts_check(o, err);
    if (st != HP_OK) return st;
    const hp_mesh *mesh = o->mesh ? o->mesh : &p->mesh;
    hp__prog g = {0};
    walk w = {.k = k, .m = m, .p = p, .o = o, .err = err, .mesh = mesh, .g = &g};
    hp_plan pq; /* the plan with another pipeline's chunks (advise) */
    hp_mesh inner;
    if ((st = pipe_setup(&w, &pq, &inner, err)) != HP_OK) return st;
    p = w.p, mesh = w.mesh;
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
    w.n_micro = n_micro;
    w.sched = o->pp_sched_given ? o->pp_sched : hp_pp_sched_default(w.pipe);
    if (w.pp > 1 && o->train && (st = hp_pp_sched_check(w.pipe, w.sched, n_micro, err)) != HP_OK) return st;
    const hp_cost_opts *oo = o; /* the global batch, for the report */
    o = &om;
    w.o = o;
    int64_t rpn = o->mdl.ranks_per_node, world = hp_mesh_world(mesh) * w.pp;
    if (rpn < 0 || (rpn > 0 && rpn < world && world % rpn))
        return hp_err_set(err, HP_ERR_INPUT, "--ranks-per-node %lld does not divide the world of %lld ranks (the last "
                          "node would hold %lld); give a divisor of %lld, or %lld or more for one node", (long long)rpn,
                          (long long)world, (long long)(rpn > 0 ? world % rpn : 0), (long long)world,
                          (long long)world);
    int64_t S_pad;
    if (!hp__seq_pad(o->S, w.cp, &S_pad)) return past_64_bits(oo, -1, "the padded sequence", err);
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
    size_t nc = (size_t)(w.pipe->n_chunks > 1 ? w.pipe->n_chunks : 1);
    if (st == HP_OK && (!(c = hp_calloc(1, sizeof *c)) || !(c->ranks = hp_calloc((size_t)n_eval, sizeof *c->ranks)) ||
                        !(w.dp_rows = hp_calloc((size_t)w.dp + 1, sizeof *w.dp_rows)) ||
                        !(w.ch_flops = hp_calloc(nc, sizeof *w.ch_flops)) || !(w.ch_attn = hp_calloc(nc, sizeof *w.ch_attn)) ||
                        !(w.ch_saved = hp_calloc(nc, sizeof *w.ch_saved)) || !(w.ch_by = hp_calloc(nc, sizeof *w.ch_by)) ||
                        !(w.ch_gpu_saved = hp_calloc(nc, sizeof *w.ch_gpu_saved))))
        st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    if (st == HP_OK) {
        c->world = world, c->n_ranks = n_eval, c->B = oo->B, c->S = o->S, c->train = o->train, c->mdl = o->mdl;
        c->n_micro = n_micro;
        c->micro_batch = mb > 0 ? mb : (oo->B + w.dp - 1) / w.dp;
        c->decode = o->decode, c->context = o->decode ? o->context : 0, c->dp = w.dp;
        c->pp = w.pp, c->pp_virtual = w.pp > 1 ? w.pipe->virt : 1, c->pp_sched = w.sched;
        w.S_orig = o->S;
        w.S_pad = S_pad;
        w.B_all = o->B;
        c->S_pad = w.S_pad;
        hp__dp_rows(o->B, w.dp, w.dp_rows);
    }
    /* A plan the runtime refuses still has its weights: the rest is not derived, and says why. */
    char cfgp[4200];
    hp_status wst = HP_OK;
    if (st == HP_OK && wst == HP_OK)
        wst = hp__prog_build(&g, m, p, o->mesh, hp__model_config_path(m, cfgp, sizeof cfgp), err);
    if (st == HP_OK && wst == HP_OK) wst = hp__cost_owners(&w);
    hp__cost_held *held = NULL;
    if (st == HP_OK && wst == HP_OK && lay_use && runtime_weights(o))
        wst = hp__cost_held_plan(m, &g, lay_use, &held, err);
    w.held = held;
    for (int64_t ri = 0; st == HP_OK && ri < n_eval; ri++) {
        int64_t rk = o->n_ranks > 0 ? o->ranks[ri] : ri;
        wst = eval_rank(&w, &c->ranks[ri], rk, n_micro, wst);
        if (wst == HP_OK && w.pp > 1 && (st = hp__cost_pipe_record(&w, &c->ranks[ri])) != HP_OK) break;
        if (w.ovf) /* a batch too large to count is the caller's input, whatever the plan: not a refused plan */
            st = past_64_bits(oo, rk, w.ovf, err);
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
            uint64_t wb = r->weight_bytes, sb = r->stored_bytes;
            int64_t rk = r->rank, d = r->dp, cc = r->cp, t = r->tp, e = r->ep, sg = r->stage;
            memset(r, 0, sizeof *r);
            r->rank = rk, r->dp = d, r->cp = cc, r->tp = t, r->ep = e, r->stage = sg;
            r->weight_bytes = r->total_bytes = wb;
            r->stored_bytes = sb;
        }
        hp_err_clear(err);
    }
    if (st == HP_OK && !c->refused[0] && w.pp > 1) st = hp__cost_pipe_finish(&w, c, eval_rank);
    if (st == HP_OK && o->train && !c->refused[0]) step_mfu(c, m, oo->B, o->S);
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
    free(held);
    free(w.dp_rows);
    hp__cost_pipe_free(&w);
    free(w.ch_flops), free(w.ch_attn), free(w.ch_saved), free(w.ch_by), free(w.ch_gpu_saved);
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
