/*
 * test_cost_api.c — hp_cost_* and hp_advise in C, against figures computed here by hand from the configs
 * (tests/data/configs): the wire bytes of a tp = 2/4/8 llama against the textbook TP/SP analysis (per layer, SP
 * runs 2 all-gathers and 2 reduce-scatters of B·S·H elements, without SP 2 all-reduces; ring: (p-1)/p·n per rank
 * each, 2(p-1)/p·n for an all-reduce), the all-to-all's and the gather's wire bytes, weights, KV cache and training
 * state of dense and MoE meshes, advise's rejections with their reasons, its ranking, and its verdict.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "hyperpar/cost.h"
#include "hyperpar/model.h"
#include "hyperpar/plan.h"
#include "testlib.h"

#define L3 "data/configs/llama-3-8b.json"
#define MIXTRAL "data/configs/mixtral-8x7b.json"

/* llama-3-8b: hidden 4096, 32 layers, vocab 128256, 32 heads, 8 KV heads of 128, MLP 14336, bf16, untied. The
 * runtime holds its bf16 matrices as stored, its norm weights widened to f32 (4 bytes each) and a MoE block's router
 * in f64 (8 bytes each): the weights below count them so. */
enum { L3_H = 4096, L3_L = 32, L3_V = 128256, L3_KV = 8 * 128, L3_I = 14336 };
/* mixtral-8x7b: the same attention widths, vocab 32000, 8 experts of 14336 and a router per layer. */
enum { MX_V = 32000, MX_E = 8 };

static uint64_t l3_norms(void) { return (uint64_t)(2 * L3_L + 1) * L3_H; } /* replicated on every rank */
static uint64_t attn(void) { return 2ull * L3_H * L3_H + 2ull * L3_H * L3_KV; }

static hp_model *open_model(const char *path)
{
    hp_model *m = NULL;
    hp_err err;
    CHECK_MSG(hp_model_open(&m, path, NULL, &err) == HP_OK, "%s", err.msg);
    return m;
}

/* The cost of m at the mesh (dp, cp, tp, TP-extend ep) for a batch B x S; NULL (a failed check) on error. */
static hp_cost_state g_state; /* the training state's model cost_at uses */

static hp_cost *cost_at(const hp_model *m, int64_t dp, int64_t cp, int64_t tp, int64_t ep, bool sp, int64_t B,
                        int64_t S, bool train, int zero)
{
    hp_plan_opts po;
    hp_plan_opts_default(&po);
    hp_mesh_from_sizes(&po.mesh, dp, cp, tp, 0, false);
    po.mesh.ep = ep;
    po.sequence_parallel = sp;
    hp_plan *p = NULL;
    hp_cost *c = NULL;
    hp_err err;
    CHECK_MSG(hp_plan_derive(&p, m, &po, &err) == HP_OK, "%s", err.msg);
    hp_cost_opts o;
    hp_cost_opts_default(&o);
    o.B = B, o.S = S, o.train = train, o.mdl.zero = zero, o.mdl.state = g_state;
    if (p) CHECK_MSG(hp_cost_compute(&c, m, p, &o, &err) == HP_OK, "%s", err.msg);
    if (c) CHECK_MSG(!c->refused[0], "%s", c->refused);
    hp_plan_free(p);
    return c;
}

/* Σ over a rank's events in decoder layers of kind k (k < 0: every kind) of wire bytes, and their count. */
static uint64_t layer_wire(const hp_cost_rank *r, int k, int *n)
{
    uint64_t w = 0;
    *n = 0;
    for (size_t i = 0; i < r->n_ev; i++) {
        const hp_cost_event *e = &r->ev[i];
        if (e->layer < 0 || (k >= 0 && (int)e->kind != k)) continue;
        w += e->wire_bytes;
        (*n)++;
    }
    return w;
}

static uint64_t layer_sent(const hp_cost_rank *r)
{
    uint64_t s = 0;
    for (size_t i = 0; i < r->n_ev; i++)
        if (r->ev[i].layer >= 0 && r->ev[i].group > 1) s += r->ev[i].bytes;
    return s;
}

TEST(wire_bytes_of_tp_against_the_textbook)
{
    hp_model *m = open_model(L3);
    if (!m) return;
    const int64_t B = 2, S = 64;
    const uint64_t n = (uint64_t)B * (uint64_t)S * (uint64_t)L3_H * 4; /* one activation [B, S, H] in f32 */
    uint64_t prev_sent = UINT64_MAX, prev_wire = 0;
    for (int64_t tp = 2; tp <= 8; tp *= 2) {
        /* SP: per layer, 2 all-gathers (attention and MLP entries) and 2 reduce-scatters (their exits) */
        hp_cost *c = cost_at(m, 1, 1, tp, 0, true, B, S, false, 0);
        if (!c) continue;
        for (int64_t ri = 0; ri < c->n_ranks; ri++) {
            const hp_cost_rank *r = &c->ranks[ri];
            int nag, nrs, nall;
            uint64_t ag = layer_wire(r, HP_RUN_ALL_GATHER, &nag), rs = layer_wire(r, HP_RUN_REDUCE_SCATTER, &nrs);
            uint64_t all = layer_wire(r, -1, &nall);
            CHECK_EQ_INT(all, ag + rs);
            CHECK_EQ_INT(nag, 2 * L3_L);
            CHECK_EQ_INT(nrs, 2 * L3_L);
            CHECK_EQ_INT(nall, 4 * L3_L);
            CHECK_EQ_INT(ag, (uint64_t)L3_L * 2 * (n / (uint64_t)tp) * (uint64_t)(tp - 1));
            CHECK_EQ_INT(rs, (uint64_t)L3_L * 2 * (n / (uint64_t)tp) * (uint64_t)(tp - 1));
            uint64_t ev_sum = 0;
            for (size_t i = 0; i < r->n_ev; i++) ev_sum += r->ev[i].wire_bytes;
            CHECK_EQ_INT(r->wire_bytes, ev_sum);
        }
        /* what a rank puts into the layers' collectives (the AG block n/tp, the RS input n) falls as tp grows,
         * while the ring's traffic rises: the two are different figures */
        const hp_cost_rank *r0 = &c->ranks[0];
        int nn;
        uint64_t sent = layer_sent(r0), wire = layer_wire(r0, -1, &nn);
        CHECK_EQ_INT(sent, (uint64_t)L3_L * 2 * (n / (uint64_t)tp + n));
        CHECK(sent < prev_sent && wire > prev_wire);
        prev_sent = sent, prev_wire = wire;
        hp_cost_free(c);
        /* no SP: 2 all-reduces of the whole activation per layer, 2(p-1)/p·n each */
        c = cost_at(m, 1, 1, tp, 0, false, B, S, false, 0);
        if (!c) continue;
        for (int64_t ri = 0; ri < c->n_ranks; ri++) {
            int nar, nall;
            uint64_t ar = layer_wire(&c->ranks[ri], HP_RUN_ALL_REDUCE, &nar);
            layer_wire(&c->ranks[ri], -1, &nall);
            CHECK_EQ_INT(nar, 2 * L3_L);
            CHECK_EQ_INT(nall, 2 * L3_L);
            CHECK_EQ_INT(ar, (uint64_t)L3_L * 2 * 2 * (n / (uint64_t)tp) * (uint64_t)(tp - 1));
        }
        hp_cost_free(c);
    }
    hp_model_close(m);
}

TEST(wire_bytes_of_the_gather_and_the_exchange)
{
    hp_model *m = open_model(MIXTRAL);
    if (!m) return;
    /* dp=2: each replica's routing [B/2, S, K] of each of the 32 sparse layers goes to rank 0 (inference takes no
     * logits: none are gathered); rank 0 sends nothing over a link */
    hp_cost *c = cost_at(m, 2, 1, 1, 0, true, 2, 16, false, 0);
    if (c) {
        for (int64_t ri = 0; ri < 2; ri++) {
            const hp_cost_rank *r = &c->ranks[ri];
            uint64_t g = 0, gw = 0;
            for (size_t i = 0; i < r->n_ev; i++)
                if (r->ev[i].kind == HP_RUN_GATHER) g += r->ev[i].bytes, gw += r->ev[i].wire_bytes;
            CHECK_EQ_INT(g, 32ull * 16 * 2 * 4);
            CHECK_EQ_INT(gw, ri == 0 ? 0 : g);
            CHECK_EQ_INT(r->wire_bytes, gw); /* dp alone (EP groups of one) runs no other collective over a link */
        }
        hp_cost_free(c);
    }
    /* dp2 x tp2 with ep=4 over the dense region: the exchange keeps 1/4 of what a rank sends on the rank */
    c = cost_at(m, 2, 1, 2, 4, true, 4, 32, false, 0);
    if (c) {
        int n_a2a = 0;
        for (int64_t ri = 0; ri < c->n_ranks; ri++)
            for (size_t i = 0; i < c->ranks[ri].n_ev; i++) {
                const hp_cost_event *e = &c->ranks[ri].ev[i];
                if (e->kind != HP_RUN_ALL_TO_ALL) continue;
                n_a2a++;
                CHECK_EQ_INT(e->group, 4);
                CHECK_EQ_INT(e->wire_bytes, (uint64_t)((double)e->bytes * 3 / 4));
            }
        CHECK_EQ_INT(n_a2a, 4 * L3_L); /* one event (dispatch and return) per layer and rank */
        hp_cost_free(c);
    }
    hp_model_close(m);
}

TEST(weights_kv_and_training_state_by_hand)
{
    hp_model *m = open_model(L3);
    if (m) {
        uint64_t sharded = 2ull * L3_V * L3_H + (uint64_t)L3_L * (attn() + 3ull * L3_H * L3_I);
        for (int64_t tp = 1; tp <= 8; tp *= 2) {
            hp_cost *c = cost_at(m, 1, 1, tp, 0, true, 2, 64, false, 0);
            if (!c) continue;
            CHECK_EQ_INT(c->ranks[0].weight_bytes, 4 * l3_norms() + 2 * (sharded / (uint64_t)tp));
            /* K and V of every layer, the rank's KV heads, bf16 */
            CHECK_EQ_INT(c->ranks[0].kv_bytes, 2ull * L3_L * 2 * 64 * (uint64_t)(L3_KV / tp) * 2);
            hp_cost_free(c);
        }
        /* training, dp2 x tp2 with ZeRO-1, Megatron's byte model: f32 gradients whole, Adam's moments and the f32
         * master split over dp */
        g_state = HP_COST_STATE_MEGATRON;
        hp_cost *c = cost_at(m, 2, 1, 2, 0, true, 2, 64, true, 1);
        uint64_t numel = l3_norms() + sharded / 2;
        if (c) {
            CHECK_EQ_INT(c->ranks[0].grad_bytes, numel * 4);
            CHECK_EQ_INT(c->ranks[0].optim_bytes, numel * 8 / 2);
            CHECK_EQ_INT(c->ranks[0].master_bytes, numel * 4 / 2);
            hp_cost_free(c);
        }
        /* hyperpar train's own state (the default): the moments split tensor by tensor (rank 0 takes the rounded-up
         * halves), every bf16 tensor an f32 master (issue 36: the forward reads it; no widened copy beside it) */
        g_state = HP_COST_STATE_RUNTIME;
        if ((c = cost_at(m, 2, 1, 2, 0, true, 2, 64, true, 1))) {
            CHECK_EQ_INT(c->ranks[0].grad_bytes, numel * 4);
            CHECK(c->ranks[0].optim_bytes >= numel * 4 && c->ranks[0].optim_bytes <= numel * 4 + 8 * 1000);
            CHECK_EQ_INT(c->ranks[0].master_bytes, 4 * (sharded / 2) + 4 * l3_norms());
            hp_cost_free(c);
        }
        hp_model_close(m);
    }
    m = open_model(MIXTRAL);
    if (!m) return;
    /* router and norms replicated, attention, embedding and head over tp, the experts over ep */
    uint64_t norms = l3_norms(), router = (uint64_t)L3_L * MX_E * L3_H;
    uint64_t dense = 2ull * MX_V * L3_H + (uint64_t)L3_L * attn(), experts = (uint64_t)L3_L * MX_E * 3 * L3_H * L3_I;
    hp_cost *c = cost_at(m, 2, 1, 2, 4, true, 4, 32, false, 0);
    if (c) {
        for (int64_t ri = 0; ri < c->n_ranks; ri++)
            CHECK_EQ_INT(c->ranks[ri].weight_bytes, 4 * norms + 8 * router + 2 * (dense / 2 + experts / 4));
        hp_cost_free(c);
    }
    hp_model_close(m);
}

/* Advise of m at N ranks: budget, batch and the step-time model given; NULL on error. */
static hp_advice *advise(const hp_model *m, int64_t N, uint64_t budget, int64_t B, int64_t S, bool flat_time)
{
    hp_advise_opts o;
    hp_advise_opts_default(&o);
    o.world = N, o.mem_per_rank = budget, o.cost.B = B, o.cost.S = S;
    if (flat_time) { /* every step takes no time: the ranking is the tie-breakers' */
        o.cost.mdl.gemm_flops = INFINITY;
        o.cost.mdl.bw_intra = o.cost.mdl.bw_inter = INFINITY;
        o.cost.mdl.lat_intra = o.cost.mdl.lat_inter = 0;
    }
    hp_advice *a = NULL;
    hp_err err;
    CHECK_MSG(hp_advise(&a, m, &o, &err) == HP_OK, "%s", err.msg);
    return a;
}

static const hp_advise_cand *find(const hp_advice *a, int64_t dp, int64_t cp, int64_t tp, int64_t ep, bool axis)
{
    for (int i = 0; i < a->n_cands; i++) {
        const hp_advise_cand *c = &a->cands[i];
        if (c->dp == dp && c->cp == cp && c->tp == tp && c->ep == ep && c->ep_axis == axis) return c;
    }
    return NULL;
}

/* The ranking's contract: accepted first, by time as printed (3 significant digits), then wire bytes, then memory
 * (so #1 is never shown slower than #2); rejected with figures
 * (nearest misses, least memory first) before those without. */
static void check_order(const hp_advice *a)
{
    int ok = 0;
    for (int i = 0; i < a->n_cands; i++) ok += a->cands[i].ok;
    CHECK_EQ_INT(ok, a->n_ok);
    for (int i = 0; i + 1 < a->n_cands; i++) {
        const hp_advise_cand *x = &a->cands[i], *y = &a->cands[i + 1];
        CHECK(x->ok || !y->ok);
        if (x->ok && y->ok) {
            double tx = hp_seconds_as_printed(x->t_step), ty = hp_seconds_as_printed(y->t_step);
            CHECK_MSG(tx == ty ? x->wire_bytes < y->wire_bytes ||
                                     (x->wire_bytes == y->wire_bytes && x->max_bytes <= y->max_bytes)
                               : tx < ty,
                      "#%d %s before #%d %s", i, x->mesh, i + 1, y->mesh);
        } else if (!x->ok && !y->ok) {
            CHECK(x->max_bytes > 0 || y->max_bytes == 0);
            if (x->max_bytes && y->max_bytes) CHECK(x->max_bytes <= y->max_bytes);
        }
    }
}

/* Decode: the KV cache of C positions per sequence, the sequences that fit, the memory-bound step; its refusals. */
TEST(decode_kv_fit_and_step)
{
    hp_model *m = open_model(L3);
    hp_plan_opts po;
    hp_plan_opts_default(&po);
    hp_mesh_from_sizes(&po.mesh, 1, 1, 2, 0, false);
    hp_plan *p = NULL;
    hp_err err;
    if (m) CHECK_MSG(hp_plan_derive(&p, m, &po, &err) == HP_OK, "%s", err.msg);
    if (!p) {
        hp_model_close(m);
        return;
    }
    hp_cost_opts o;
    hp_cost_opts_default(&o);
    o.decode = true, o.context = 1000, o.B = 3, o.S = 1;
    hp_cost *c = NULL;
    CHECK_MSG(hp_cost_compute(&c, m, p, &o, &err) == HP_OK, "%s", err.msg);
    if (c) {
        const hp_cost_rank *r = &c->ranks[0];
        uint64_t per = 2ull * L3_L * 1000 * (uint64_t)(L3_KV / 2) * 2; /* K and V, 4 of 8 KV heads, bf16 */
        CHECK(c->decode && c->context == 1000 && c->S == 1);
        CHECK_EQ_INT(r->kv_seq_bytes, per);
        CHECK_EQ_INT(r->kv_bytes, 3 * per);
        CHECK(r->t_memory > r->t_compute && r->t_step == r->t_memory + r->t_comm);
        CHECK_EQ_INT(r->read_bytes, r->weight_bytes - (uint64_t)L3_V * L3_H * 2 / 2 + r->kv_bytes);
        uint64_t budget = r->weight_bytes + r->act_bytes + 5 * per + per / 2;
        CHECK_EQ_INT(hp_cost_rank_seqs(r, budget), 5);
        CHECK_EQ_INT(hp_cost_rank_seqs(r, r->weight_bytes), 0);
        CHECK_EQ_INT(hp_cost_rank_seqs(r, 0), -1);
        CHECK_EQ_INT(hp_cost_seqs(c, 0), -1);
        CHECK(hp_cost_seqs(c, budget) >= 4 && hp_cost_seqs(c, budget) <= 5);
        hp_cost_free(c);
        c = NULL;
    }
    o.S = 2; /* more than one new token */
    CHECK(hp_cost_compute(&c, m, p, &o, &err) == HP_ERR_INPUT && !c);
    CHECK_STR_CONTAINS(err.msg, "decode takes one new token per sequence");
    o.S = 1, o.train = true;
    CHECK(hp_cost_compute(&c, m, p, &o, &err) == HP_ERR_INPUT && !c);
    o.train = false, o.context = 0;
    CHECK(hp_cost_compute(&c, m, p, &o, &err) == HP_ERR_INPUT && !c);
    hp_plan_free(p);
    hp_model_close(m);
}

TEST(advise_dense_reasons_figures_and_order)
{
    hp_model *m = open_model(L3);
    if (!m) return;
    /* 16 ranks, one row: dp > 1 has too few rows, tp=16 does not divide the 8 KV heads */
    hp_advice *a = advise(m, 16, 80000000000ull, 1, 4096, false);
    if (a) {
        const hp_advise_cand *c = find(a, 1, 1, 16, 1, false);
        CHECK(c && !c->ok && c->why == HP_ADVISE_COMPAT);
        if (c) CHECK_STR_CONTAINS(c->reason, "num_key_value_heads (8) is not divisible by tp (16)");
        c = find(a, 2, 1, 8, 1, false);
        CHECK(c && !c->ok && c->why == HP_ADVISE_DP_ROWS);
        if (c) CHECK_STR_CONTAINS(c->reason, "dp=2 replicas but the batch has 1 rows");
        c = find(a, 1, 2, 8, 1, false);
        CHECK(c && c->ok && c->why == HP_ADVISE_OK);
        if (c) { /* the figures of the template at these sizes are the mesh's own plan's */
            hp_cost *k = cost_at(m, 1, 2, 8, 0, true, 1, 4096, false, 0);
            if (k) {
                const hp_cost_rank *r0 = &k->ranks[0], *rl = &k->ranks[k->n_ranks - 1];
                CHECK_EQ_INT(c->weight_bytes, k->ranks[k->max_rank].weight_bytes);
                CHECK_EQ_INT(c->weight_bytes, 4 * l3_norms() + 2 * ((2ull * L3_V * L3_H + (uint64_t)L3_L *
                                                                     (attn() + 3ull * L3_H * L3_I)) / 8));
                CHECK_EQ_INT(c->state_bytes, r0->kv_bytes);
                CHECK_EQ_INT(c->wire_bytes, r0->wire_bytes > rl->wire_bytes ? r0->wire_bytes : rl->wire_bytes);
                CHECK_EQ_INT(c->sent_bytes, r0->sent_bytes > rl->sent_bytes ? r0->sent_bytes : rl->sent_bytes);
                hp_cost_free(k);
            }
        }
        check_order(a);
        CHECK(hp_advice_verdict(a, NULL) == HP_OK);
        hp_advice_free(a);
    }
    /* the budget: 8 GB per rank rejects the meshes whose most-loaded rank needs more, with their figures, and
     * these nearest misses come first among the rejected */
    a = advise(m, 4, 8000000000ull, 4, 256, false);
    if (a) {
        const hp_advise_cand *c = find(a, 4, 1, 1, 1, false);
        CHECK(c && !c->ok && c->why == HP_ADVISE_MEMORY && c->max_bytes > 8000000000ull);
        if (c) CHECK_STR_CONTAINS(c->reason, "the most-loaded rank needs");
        CHECK(a->n_ok > 0 && a->n_ok < a->n_cands);
        CHECK(a->n_ok < a->n_cands && a->cands[a->n_ok].why == HP_ADVISE_MEMORY);
        check_order(a);
        hp_advice_free(a);
    }
    /* every step equally fast: the accepted are ranked by wire bytes, then memory */
    a = advise(m, 8, 0, 8, 64, true);
    if (a) {
        check_order(a);
        for (int i = 0; i + 1 < a->n_ok; i++) CHECK(a->cands[i].wire_bytes <= a->cands[i + 1].wire_bytes);
        const hp_advise_cand *t2 = find(a, 4, 1, 2, 1, false), *t4 = find(a, 2, 1, 4, 1, false);
        CHECK(t2 && t4 && t2->ok && t4->ok);
        if (t2 && t4) {
            CHECK(t2->wire_bytes < t4->wire_bytes);
            CHECK(t2 < t4); /* ranked before it */
        }
        hp_advice_free(a);
    }
    /* nothing fits: the verdict names the nearest miss */
    a = advise(m, 2, 1000000000ull, 1, 4096, false);
    if (a) {
        hp_err err;
        CHECK_EQ_INT(a->n_ok, 0);
        CHECK(hp_advice_verdict(a, &err) == HP_ERR_INPUT);
        CHECK_STR_CONTAINS(err.msg, "no mesh of 2 ranks fits in 953.67 MiB per rank (all 4 rejected; the nearest: "
                                    "the most-loaded rank needs");
        hp_advice_free(a);
    }
    /* a batch past 64 bits: no mesh gets figures, and the verdict is the batch's refusal */
    a = advise(m, 2, 80000000000ull, 2147483647, 2147483647, false);
    if (a) {
        hp_err err;
        CHECK_EQ_INT(a->n_ok, 0);
        CHECK(a->batch_err.status == HP_ERR_INPUT);
        CHECK(hp_advice_verdict(a, &err) == HP_ERR_INPUT);
        CHECK_STR_CONTAINS(err.msg, "is past what the cost model can hold");
        hp_advice_free(a);
    }
    hp_model_close(m);
}

TEST(advise_moe_reasons_and_weights)
{
    hp_model *m = open_model(MIXTRAL);
    if (!m) return;
    hp_advice *a = advise(m, 8, 80000000000ull, 4, 64, false);
    if (a) {
        uint64_t norms = l3_norms(), router = (uint64_t)L3_L * MX_E * L3_H;
        uint64_t dense = 2ull * MX_V * L3_H + (uint64_t)L3_L * attn(), experts = (uint64_t)L3_L * MX_E * 3 * L3_H * L3_I;
        /* the experts cut over tp: tp > 1 without EP (all 8 experts per rank, each cut over tp), and the explicit
         * ep axis with tp (split over ep, cut over tp): evaluated and accepted, the weights exact */
        const hp_advise_cand *c;
        static const int64_t cut[][5] = {{4, 1, 2, 1, 0}, {2, 1, 4, 1, 0}, {1, 1, 8, 1, 0}, {1, 2, 4, 1, 0},
                                         {2, 1, 2, 2, 1}, {1, 1, 2, 4, 1}, {1, 1, 4, 2, 1}};
        for (size_t i = 0; i < sizeof cut / sizeof *cut; i++) {
            const int64_t *s = cut[i];
            c = find(a, s[0], s[1], s[2], s[3], s[4] != 0);
            CHECK_MSG(c && c->ok, "cut mesh %zu", i);
            if (c)
                CHECK_EQ_INT(c->weight_bytes, 4 * norms + 8 * router + 2 * (dense / (uint64_t)s[2] +
                                                                            experts / (uint64_t)(s[2] * s[3])));
            if (c) CHECK(c->sent_bytes > 0 && c->wire_bytes > 0 && c->t_step > 0);
        }
        c = find(a, 8, 1, 1, 2, false);
        CHECK(c && !c->ok && c->why == HP_ADVISE_DP_ROWS);
        /* no EP: every rank holds all 8 experts, past 80 GB */
        c = find(a, 4, 2, 1, 1, false);
        CHECK(c && !c->ok && c->why == HP_ADVISE_MEMORY);
        if (c) CHECK_EQ_INT(c->weight_bytes, 4 * norms + 8 * router + 2 * (dense + experts));
        /* TP-extend ep over the dense region: the experts split over ep */
        static const int64_t mesh[][5] = {{4, 1, 2, 4, 0}, {4, 2, 1, 8, 0}, {1, 1, 8, 8, 0}};
        for (size_t i = 0; i < sizeof mesh / sizeof *mesh; i++) {
            const int64_t *s = mesh[i];
            c = find(a, s[0], s[1], s[2], s[3], s[4] != 0);
            CHECK_MSG(c && c->ok, "mesh %zu", i);
            if (c)
                CHECK_EQ_INT(c->weight_bytes,
                             4 * norms + 8 * router + 2 * (dense / (uint64_t)s[2] + experts / (uint64_t)s[3]));
        }
        /* an explicit ep axis splits the batch with dp: dp x ep = 8 replicas above the 4 rows */
        c = find(a, 1, 1, 1, 8, true);
        CHECK(c && !c->ok && c->why == HP_ADVISE_DP_ROWS);
        if (c) CHECK_STR_CONTAINS(c->reason, "dp x ep = 8 replicas but the batch has 4 rows");
        check_order(a);
        hp_advice_free(a);
    }
    /* every step equally fast: ranked by wire bytes, which here order some neighbours otherwise than the bytes
     * put into collectives would (the all-to-all keeps 1/ep of its bytes on the rank) */
    a = advise(m, 8, 0, 8, 64, true);
    if (a) {
        /* the explicit ep axis at 8 rows: the experts split over ep */
        uint64_t norms = l3_norms(), router = (uint64_t)L3_L * MX_E * L3_H;
        uint64_t dense = 2ull * MX_V * L3_H + (uint64_t)L3_L * attn(), experts = (uint64_t)L3_L * MX_E * 3 * L3_H * L3_I;
        static const int64_t axis[][4] = {{1, 1, 1, 8}, {2, 1, 1, 4}};
        for (size_t i = 0; i < sizeof axis / sizeof *axis; i++) {
            const int64_t *s = axis[i];
            const hp_advise_cand *c = find(a, s[0], s[1], s[2], s[3], true);
            CHECK_MSG(c && c->ok, "ep axis mesh %zu", i);
            if (c) CHECK_EQ_INT(c->weight_bytes, 4 * norms + 8 * router + 2 * (dense + experts / (uint64_t)s[3]));
        }
        check_order(a);
        int flips = 0;
        for (int i = 0; i + 1 < a->n_ok; i++) flips += a->cands[i].sent_bytes > a->cands[i + 1].sent_bytes;
        CHECK(a->n_ok > 10 && flips > 0);
        hp_advice_free(a);
    }
    /* 16 ranks: ep=16 does not divide the 8 experts */
    a = advise(m, 16, 80000000000ull, 16, 64, false);
    if (a) {
        const hp_advise_cand *c = find(a, 1, 1, 1, 16, true);
        CHECK(c && !c->ok && c->why == HP_ADVISE_COMPAT);
        if (c) CHECK_STR_CONTAINS(c->reason, "num_experts (8) must be divisible");
        hp_advice_free(a);
    }
    hp_model_close(m);
}

/* The default batch is a row per rank (world rows): the same for every candidate, and no dp above it, so the
 * dp > 1 meshes are ranked, not all rejected for the batch. */
TEST(advise_default_batch_is_a_row_per_rank)
{
    hp_model *m = open_model(L3);
    if (!m) return;
    hp_advise_opts o;
    hp_advise_opts_default(&o);
    o.world = 8, o.mem_per_rank = 80ull << 30;
    hp_advice *a = NULL;
    hp_err err;
    CHECK_MSG(hp_advise(&a, m, &o, &err) == HP_OK, "%s", err.msg);
    if (!a) return hp_model_close(m);
    CHECK_EQ_INT(a->B, 8);
    int dp_ok = 0;
    for (int i = 0; i < a->n_cands; i++) {
        CHECK(a->cands[i].why != HP_ADVISE_DP_ROWS);
        dp_ok += a->cands[i].ok && a->cands[i].dp > 1;
    }
    CHECK(dp_ok > 0);
    hp_advice_free(a);
    hp_model_close(m);
}

/* Seconds as printed: 3 significant digits in s, ms or us, whole units from 1000 on; the ranking compares that. */
TEST(format_seconds_and_as_printed)
{
    char b[48];
    CHECK_STR_EQ(hp_format_seconds(44.94, b, sizeof b), "44.9 s");
    CHECK_STR_EQ(hp_format_seconds(1134.6, b, sizeof b), "1130 s");
    CHECK_STR_EQ(hp_format_seconds(0.012345, b, sizeof b), "12.3 ms");
    CHECK_STR_EQ(hp_format_seconds(4.5e-5, b, sizeof b), "45 us");
    CHECK_STR_EQ(hp_format_seconds(0, b, sizeof b), "0 ms");
    CHECK(hp_seconds_as_printed(44.94) == hp_seconds_as_printed(44.86)); /* both 44.9 s */
    CHECK(hp_seconds_as_printed(44.94) > hp_seconds_as_printed(44.6));
    CHECK(hp_seconds_as_printed(0.012345) == hp_seconds_as_printed(0.01226)); /* 12.3 ms */
}

TEST(advise_refuses_a_world_out_of_range)
{
    hp_model *m = open_model(L3);
    if (!m) return;
    hp_advise_opts o;
    hp_advise_opts_default(&o);
    hp_advice *a = (hp_advice *)&o; /* set to NULL on failure */
    hp_err err;
    o.world = 0;
    CHECK(hp_advise(&a, m, &o, &err) == HP_ERR_INPUT && a == NULL);
    CHECK_STR_CONTAINS(err.msg, "a world of 0 ranks");
    hp_advice_free(NULL);
    hp_model_close(m);
}

/* hp_cost_gemm_weights against the configs by hand: llama-3-8b's per-layer attention and MLP and lm_head;
 * mixtral's router and top-2 of 8 experts; DeepSeek-V3's MLA projections, 3 dense layers, 58 sparse ones with
 * the top-8 of 256 experts and the shared expert (36.6 G: its 37 G active parameters less the embedding). */
TEST(gemm_weights_by_hand)
{
    const double H = L3_H;
    hp_model *m = open_model(L3);
    if (m) {
        double w = L3_L * ((double)attn() + 3 * H * L3_I) + (double)L3_V * H;
        CHECK_MSG(hp_cost_gemm_weights(m) == w, "%.17g != %.17g", hp_cost_gemm_weights(m), w);
        CHECK(hp_cost_train_flops(m, 1000) == 6 * w * 1000);
        hp_model_close(m);
    }
    if ((m = open_model(MIXTRAL))) {
        double w = L3_L * ((double)attn() + H * MX_E + 2 * 3 * H * 14336) + (double)MX_V * H;
        CHECK_MSG(hp_cost_gemm_weights(m) == w, "%.17g != %.17g", hp_cost_gemm_weights(m), w);
        hp_model_close(m);
    }
    if ((m = open_model("data/configs/deepseek-v3.json"))) {
        const double D = 7168, att = D * 1536 + 1536.0 * 128 * (128 + 64) + D * (512 + 64) + 512.0 * 128 * 256 +
                                     128.0 * 128 * D;
        double w = 61 * att + 3 * 3 * D * 18432 + 58 * (D * 256 + (8 + 1) * 3 * D * 2048) + 129280 * D;
        CHECK_MSG(hp_cost_gemm_weights(m) == w, "%.17g != %.17g", hp_cost_gemm_weights(m), w);
        CHECK(w > 36.6e9 && w < 36.7e9);
        hp_model_close(m);
    }
}

/* hp_cost_gemm_limit on one process: the limit is this rank's rate (sum = min = own), a positive time; a bad n is
 * refused with the reason. */
TEST(gemm_limit_one_process)
{
    hp_comm *w = NULL;
    hp_err err;
    CHECK_MSG(hp_comm_self(&w, &err) == HP_OK, "%s", err.msg);
    if (!w) return;
    hp_gemm_limit lim;
    CHECK_MSG(hp_cost_gemm_limit(w, 64, HP_LINALG_EXACT, 2, &lim, &err) == HP_OK, "%s", err.msg);
    CHECK(lim.n == 64 && lim.reps == 2 && lim.rank_gflops > 0 && lim.seconds > 0);
    CHECK(lim.sum_gflops == lim.rank_gflops && lim.min_gflops == lim.rank_gflops);
    CHECK(hp_cost_gemm_limit(w, 0, HP_LINALG_EXACT, 2, &lim, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "the reference GEMM needs n >= 1 and reps >= 1, got n 0, reps 2");
    hp_comm_free(w);
}

/* The hardware profiles: names case-insensitive, the memory spellings of each, nothing else; a GPU profile sets the
 * model's figures and Megatron's accounting; the library refuses recompute under cpu and a ZeRO level past 3. */
TEST(hardware_profiles)
{
    size_t n = 0;
    const hp_cost_hardware *list = hp_cost_hardware_list(&n);
    CHECK(n == 5 && !strcmp(list[0].name, "cpu") && !list[0].gpu);
    const char *ok[] = {"cpu", "CPU", "H100", "h100", "H100-80G", "h100-80gb", "H200", "H200-141G", "A100",
                        "A100-80G", "a100-80GB", "MI300X", "mi300x"};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) CHECK_MSG(hp_cost_hardware_find(ok[i]) != NULL, "%s", ok[i]);
    const char *bad[] = {"", "foo", "H10", "H100-40G", "H100-", "A100-80GiB", "cpu-80G", "MI300", "H100x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) CHECK_MSG(hp_cost_hardware_find(bad[i]) == NULL, "%s", bad[i]);
    const hp_cost_hardware *h = hp_cost_hardware_find("h100-80g");
    CHECK(h && !strcmp(h->name, "H100") && h->mem_bytes == 80ull << 30 && h->flops == 989e12);
    hp_cost_model m;
    hp_cost_model_default(&m);
    CHECK(!hp_cost_model_gpu(&m) && m.recompute == HP_COST_RECOMPUTE_NONE);
    hp_cost_model_hardware(&m, hp_cost_hardware_find("MI300X"));
    CHECK(hp_cost_model_gpu(&m) && m.gemm_flops == 1307e12 && m.bw_intra == 448e9 && m.ranks_per_node == 8);
    CHECK(m.recompute == HP_COST_RECOMPUTE_SELECTIVE && m.state == HP_COST_STATE_MEGATRON);
    hp_model *md = open_model("data/configs/llama-3-8b.json");
    if (!md) return;
    hp_plan_opts po;
    hp_plan_opts_default(&po);
    hp_plan *p = NULL;
    hp_err err;
    CHECK_MSG(hp_plan_derive(&p, md, &po, &err) == HP_OK, "%s", err.msg);
    hp_cost_opts o;
    hp_cost_opts_default(&o);
    o.train = true;
    o.mdl.recompute = HP_COST_RECOMPUTE_FULL;
    hp_cost *c = NULL;
    CHECK(p && hp_cost_compute(&c, md, p, &o, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "recompute full describes a GPU engine's backward");
    o.mdl.recompute = HP_COST_RECOMPUTE_NONE;
    o.mdl.zero = 4;
    CHECK(p && hp_cost_compute(&c, md, p, &o, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "ZeRO level 4");
    hp_plan_free(p);
    hp_model_close(md);
}

/* Training defaults (issue 36): the micro-batch is 1 row per replica unless given (one micro-batch of each replica's
 * rows when dp does not divide B), a GPU profile reserves a tenth of its memory, and when nothing fits hp_advise walks
 * the micro-batches below a larger one not fixed, then stronger recompute, and says what it chose. */
TEST(train_defaults_reserve_and_relaxing)
{
    hp_cost_opts o;
    hp_cost_opts_default(&o);
    CHECK(hp_cost_default_micro_batch(&o, 2) == 0); /* inference */
    o.train = true, o.B = 8;
    CHECK(hp_cost_default_micro_batch(&o, 2) == 1 && hp_cost_default_micro_batch(&o, 3) == 0);
    o.micro_batch = 4;
    CHECK(hp_cost_default_micro_batch(&o, 3) == 4);
    hp_cost_model m;
    hp_cost_model_default(&m);
    CHECK(m.mem_reserve == 0 && hp_cost_usable(&m, 100) == 100);
    hp_cost_model_hardware(&m, hp_cost_hardware_find("H100"));
    CHECK(m.mem_reserve == 8ull << 30 && hp_cost_usable(&m, 80ull << 30) == 72ull << 30 && hp_cost_usable(&m, 1) == 0);

    hp_model *md = open_model("data/configs/llama-3-8b.json");
    if (!md) return;
    hp_advise_opts ao;
    hp_advise_opts_default(&ao);
    ao.world = 8, ao.mem_per_rank = 32ull << 30;
    ao.cost.train = true, ao.cost.S = 16384, ao.cost.B = 64, ao.cost.mdl.zero = 1;
    hp_cost_model_hardware(&ao.cost.mdl, hp_cost_hardware_find("H100"));
    ao.cost.micro_batch = 8; /* not fixed: the ladder may go below it */
    hp_advice *a = NULL;
    hp_err err;
    CHECK_MSG(hp_advise(&a, md, &ao, &err) == HP_OK, "%s", err.msg);
    /* 8 and its powers of two below at selective do not fit 24 GiB (32 less the 8 reserved); full recompute does */
    CHECK(a && a->n_ok > 0 && a->relaxed && a->mdl.recompute == HP_COST_RECOMPUTE_FULL);
    if (a && a->n_ok) {
        CHECK(a->cands[0].micro_batch == a->micro_batch && a->micro_batch >= 1 && a->micro_batch <= 8);
        CHECK(a->cands[0].max_bytes <= 24ull << 30);
        CHECK_STR_CONTAINS(a->chosen, "chosen by advise because nothing fitted with micro-batch 8 rows");
    }
    hp_advice_free(a);
    ao.fixed_recompute = ao.fixed_micro_batch = true; /* both kept: nothing fits, and the advice says so */
    CHECK_MSG(hp_advise(&a, md, &ao, &err) == HP_OK, "%s", err.msg);
    CHECK(a && a->n_ok == 0 && !a->relaxed && a->micro_batch == 8);
    if (a) CHECK_STR_CONTAINS(a->chosen, "nothing fits, nothing else was tried; the --micro-batch and --recompute given are kept");
    hp_advice_free(a);
    ao.fixed_recompute = false, ao.cost.mdl.recompute = HP_COST_RECOMPUTE_SELECTIVE;
    ao.mem_per_rank = 48ull << 30, ao.fixed_micro_batch = false; /* 40 GiB usable: a smaller micro-batch suffices */
    CHECK_MSG(hp_advise(&a, md, &ao, &err) == HP_OK, "%s", err.msg);
    CHECK(a && a->n_ok > 0);
    CHECK(a && a->relaxed && a->micro_batch < 8 && a->mdl.recompute == HP_COST_RECOMPUTE_SELECTIVE);
    if (a) CHECK_STR_CONTAINS(a->chosen, "recompute selective: chosen by advise");
    hp_advice_free(a);
    hp_model_close(md);
}

TEST_MAIN()
