/*
 * test_moe_ep.c — expert parallelism under mpirun (1, 2, 4 ranks; also run without a launcher): for every
 * golden folder and sparse layer, each rank's EP output on its block of tokens equals the one-process
 * layer applied to that block (max |Δy| <= 1e-5 · max|y|, topk_idx identical) — without a capacity factor
 * and with capacity factors 1.0 and 1.5 applied per rank to its own slots — and --overlap gives exactly the
 * same numbers as without it. Also an EP group split out of the world (two groups at 4 ranks).
 *
 * Dispatch chunks: 2 and 3 chunks, with and without overlap, against one chunk on the same rank. Routing,
 * capacity (topk_idx, dropped slots) and the rows exchanged are identical. y is NOT bitwise identical:
 * OpenBLAS 0.3.21's sgemm gives bitwise-different rows for different row counts m (its kernels for the m
 * tail accumulate in another order; a chunk hands each expert fewer rows per call), so y is checked to
 * max |Δy| <= 1e-6 · max|y| (seen: at most 6.2e-7 over the golden folders at 1, 2 and 4 ranks). With
 * the same chunking, overlap is bitwise identical. Also: ranks with different token counts (one with none,
 * chunks emptier than others), and the errors every rank must share.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperpar/comm.h"
#include "hyperpar/moe.h"
#include "mpitest.h"

static hp_comm *W;

static const char *g_golden[] = {"deepseek_v3_per_expert_f32", "glm4_moe_batched_bf16", "gpt_oss_batched_f32",
                                 "mixtral_batched_bf16", "mixtral_per_expert_f32", "qwen2_moe_per_expert_f32",
                                 "qwen3_moe_batched_bf16"};

/* Dispatch chunks 2 and 3, without and with overlap, against y of one chunk: same routing, same dropped
 * slots, same rows exchanged; y within 1e-6 · max|y| (see the file header); overlap bitwise equal to its
 * chunking without overlap. rows_sent < 0: not checked. yo, yv: scratch of T·H floats. */
static void check_chunks(hp_moe_ep *ep, const char *what, int64_t layer, double cf, const float *x, int64_t T,
                         const float *y, const int32_t *topk_ref, int64_t K, int64_t H, const hp_moe_run_opts *ro,
                         int64_t rows_sent, float *yo)
{
    hp_err err;
    float *yv = calloc((size_t)((T + 1) * H), sizeof *yv);
    CHECK(yv != NULL);
    if (!yv) return;
    for (int C = 2; C <= 3; C++) {
        for (int ov = 0; ov < 2; ov++) {
            float *out = ov ? yv : yo;
            CHECK_MSG(hp_moe_ep_forward_chunks(ep, x, T, out, ro, ov, C, &err) == HP_OK, "%s", err.msg);
            CHECK_CLOSE_MSG(out, y, T * H, 0, 1e-6, "%s layer %lld cf %.1f: %d chunks%s", what, (long long)layer, cf, C,
                            ov ? " with overlap" : "");
            CHECK(memcmp(topk_ref, hp_moe_ep_ws(ep)->topk_idx, (size_t)(T * K) * sizeof(int32_t)) == 0);
            if (rows_sent >= 0) CHECK_EQ_INT(hp_moe_ep_get_stats(ep)->rows_sent, rows_sent);
        }
        bool same = true;
        for (int64_t i = 0; i < T * H; i++) same &= yo[i] == yv[i];
        CHECK_MSG(same, "%s layer %lld cf %.1f: %d chunks: overlap differs", what, (long long)layer, cf, C);
    }
    free(yv);
}

/* One layer on group g (size P, rank r): block of x, EP vs one process, three capacity settings, overlap. */
static void check_layer(hp_comm *g, const hp_model *m, int64_t layer, const float *x, int64_t T)
{
    const int P = hp_comm_size(g), r = hp_comm_rank(g);
    hp_err err;
    hp_moe_layer *full = NULL, *local = NULL;
    hp_moe_ws *ws = NULL;
    hp_moe_ep *ep = NULL;
    hp_status st = hp_moe_layer_load(&full, m, layer, NULL, &err);
    hp_moe_load_opts lo;
    hp_moe_load_opts_default(&lo);
    int64_t E = full ? full->n_experts : 0;
    lo.first_expert = r * (E / P);
    lo.n_local = E / P;
    if (st == HP_OK) st = hp_moe_layer_load(&local, m, layer, &lo, &err);
    const int64_t H = m->cfg.hidden_size, lo_row = T * r / P, hi_row = T * (r + 1) / P, Tl = hi_row - lo_row;
    const int64_t K = full ? full->top_k : 1;
    if (st == HP_OK) st = hp_moe_ws_create(&ws, full, Tl > 0 ? Tl : 1, &err);
    if (st == HP_OK) st = hp_moe_ep_create_chunked(&ep, local, g, Tl > 0 ? Tl : 1, 3, &err);
    CHECK_MSG(st == HP_OK, "%s", err.msg);
    float *yref = calloc((size_t)((Tl + 1) * H), sizeof *yref), *y = calloc((size_t)((Tl + 1) * H), sizeof *y);
    float *yo = calloc((size_t)((Tl + 1) * H), sizeof *yo);
    static const double factors[] = {0.0, 1.0, 1.5};
    for (size_t f = 0; st == HP_OK && f < 3; f++) {
        hp_moe_run_opts ro = {.capacity_factor = factors[f], .policy = HP_MOE_CAP_SCORE};
        if (Tl > 0) CHECK(hp_moe_forward(full, ws, x + lo_row * H, Tl, H, yref, &ro, &err) == HP_OK);
        CHECK_MSG(hp_moe_ep_forward(ep, x + lo_row * H, Tl, y, &ro, false, &err) == HP_OK, "%s", err.msg);
        CHECK_CLOSE_MSG(y, yref, Tl * H, 0, 1e-5, "%s layer %lld cf %.1f rank %d/%d", m->path, (long long)layer,
                        factors[f], r, P);
        CHECK(memcmp(ws->topk_idx, hp_moe_ep_ws(ep)->topk_idx, (size_t)(Tl * K) * sizeof(int32_t)) == 0);
        if (factors[f] > 0) CHECK_EQ_INT(hp_moe_ep_get_stats(ep)->n_dropped, ws->stats.n_dropped);
        /* --overlap: the same numbers. */
        CHECK(hp_moe_ep_forward(ep, x + lo_row * H, Tl, yo, &ro, true, &err) == HP_OK);
        bool same = true;
        for (int64_t i = 0; i < Tl * H; i++) same &= yo[i] == y[i];
        CHECK_MSG(same, "%s layer %lld: overlap differs", m->path, (long long)layer);
        /* One chunk through hp_moe_ep_forward_chunks is hp_moe_ep_forward exactly. */
        CHECK(hp_moe_ep_forward_chunks(ep, x + lo_row * H, Tl, yo, &ro, false, 1, &err) == HP_OK);
        for (int64_t i = 0; i < Tl * H; i++) same &= yo[i] == y[i];
        CHECK_MSG(same, "%s layer %lld: one chunk differs from the plain forward", m->path, (long long)layer);
        const int64_t rows_sent = hp_moe_ep_get_stats(ep)->rows_sent;
        check_chunks(ep, m->path, layer, factors[f], x + lo_row * H, Tl, y, ws->topk_idx, K, H, &ro, rows_sent, yo);
    }
    free(yref);
    free(y);
    free(yo);
    hp_moe_ep_destroy(ep);
    hp_moe_ws_destroy(ws);
    hp_moe_layer_free(local);
    hp_moe_layer_free(full);
}

static void run_on(hp_comm *g)
{
    for (size_t i = 0; i < sizeof g_golden / sizeof *g_golden; i++) {
        char dir[128], io[160];
        snprintf(dir, sizeof dir, "data/golden/%s", g_golden[i]);
        snprintf(io, sizeof io, "%s/moe_io.safetensors", dir);
        hp_model *m = NULL;
        hp_st_file *f = NULL;
        hp_err err;
        CHECK(hp_model_open(&m, dir, NULL, &err) == HP_OK);
        CHECK(hp_st_open(&f, io, &err) == HP_OK);
        if (m && f && m->cfg.n_experts % hp_comm_size(g) == 0) {
            const hp_st_tensor *t = hp_st_find(f, "x");
            CHECK(t != NULL);
            if (t)
                for (int64_t L = 0; L < m->cfg.num_hidden_layers; L++)
                    if (hp_model_layer_is_sparse(m, L)) check_layer(g, m, L, hp_st_data(f, t), t->shape[0]);
        }
        hp_st_close(f);
        hp_model_close(m);
    }
}

static void test_world_group(void) { run_on(W); }

/* qwen2_moe layer 0 (shared expert, 8 experts) for the tests below: the whole layer and rank r's experts
 * of the world group. Returns the model and the input file (x [32, 64]); NULL pieces on failure. */
static void open_qwen2(hp_model **m, hp_st_file **f, hp_moe_layer **full, hp_moe_layer **local)
{
    hp_err err;
    const int P = hp_comm_size(W), r = hp_comm_rank(W);
    const char *dir = "data/golden/qwen2_moe_per_expert_f32";
    char io[160];
    snprintf(io, sizeof io, "%s/moe_io.safetensors", dir);
    *m = NULL, *f = NULL, *full = NULL, *local = NULL;
    CHECK(hp_model_open(m, dir, NULL, &err) == HP_OK);
    CHECK(hp_st_open(f, io, &err) == HP_OK);
    if (!*m || !*f) return;
    CHECK(hp_moe_layer_load(full, *m, 0, NULL, &err) == HP_OK);
    hp_moe_load_opts lo;
    hp_moe_load_opts_default(&lo);
    lo.first_expert = r * (8 / P);
    lo.n_local = 8 / P;
    CHECK_MSG(hp_moe_layer_load(local, *m, 0, &lo, &err) == HP_OK, "%s", err.msg);
}

static void close_qwen2(hp_model *m, hp_st_file *f, hp_moe_layer *full, hp_moe_layer *local)
{
    hp_moe_layer_free(local);
    hp_moe_layer_free(full);
    hp_st_close(f);
    hp_model_close(m);
}

/* Ranks with different token counts: rank r holds {0, 7, 3, 9}[r % 4] rows (rank 0 none; 9 on one rank
 * alone), every rank's
 * runtime sized for 9, so chunks differ in size between ranks and some are empty (8 chunks of 3 tokens).
 * Chunked equals one chunk (1e-6 · max|y|) and one chunk equals the one-process layer (1e-5). */
static void test_chunks_uneven(void)
{
    static const int64_t n_of[4] = {0, 7, 3, 9}, first_of[4] = {0, 0, 7, 10};
    const int r = hp_comm_rank(W), who = hp_comm_size(W) == 1 ? 3 : r % 4;
    hp_model *m;
    hp_st_file *f;
    hp_moe_layer *full, *local;
    open_qwen2(&m, &f, &full, &local);
    const hp_st_tensor *t = f ? hp_st_find(f, "x") : NULL;
    hp_err err;
    hp_moe_ep *ep = NULL;
    hp_moe_ws *ws = NULL;
    const int64_t H = 64, K = full ? full->top_k : 1, T = n_of[who];
    const float *x = t ? (const float *)hp_st_data(f, t) + (first_of[who] + 16 * (r / 4)) * H : NULL;
    CHECK(full && local && t);
    if (full && local && t) {
        CHECK(hp_moe_ws_create(&ws, full, 9, &err) == HP_OK);
        CHECK_MSG(hp_moe_ep_create_chunked(&ep, local, W, 9, 8, &err) == HP_OK, "%s", err.msg);
    }
    float *yref = calloc(10 * 64, sizeof *yref), *y = calloc(10 * 64, sizeof *y), *yo = calloc(10 * 64, sizeof *yo);
    static const double factors[] = {0.0, 1.0};
    for (size_t fi = 0; ep && ws && fi < 2; fi++) {
        hp_moe_run_opts ro = {.capacity_factor = factors[fi]};
        if (T > 0) CHECK(hp_moe_forward(full, ws, x, T, H, yref, &ro, &err) == HP_OK);
        CHECK_MSG(hp_moe_ep_forward(ep, x, T, y, &ro, false, &err) == HP_OK, "%s", err.msg);
        double mx = test_max_abs(yref, T * H);
        CHECK_CLOSE_MSG(y, yref, T * H, 0, 1e-5, "uneven rank %d cf %.1f", r, factors[fi]);
        int64_t rows = hp_moe_ep_get_stats(ep)->rows_sent;
        check_chunks(ep, "uneven", 0, factors[fi], x, T, y, ws->topk_idx, K, H, &ro, rows, yo);
        /* More chunks than a rank has tokens: empty chunks still join every exchange. */
        CHECK_MSG(hp_moe_ep_forward_chunks(ep, x, T, yo, &ro, true, 8, &err) == HP_OK, "%s", err.msg);
        CHECK_CLOSE_MSG(yo, y, T * H, 1e-6 * mx, 0, "uneven rank %d: 8 chunks (1e-6 of max |yref|)", r);
        CHECK_EQ_INT(hp_moe_ep_get_stats(ep)->rows_sent, rows);
    }
    free(yref);
    free(y);
    free(yo);
    hp_moe_ep_destroy(ep);
    hp_moe_ws_destroy(ws);
    close_qwen2(m, f, full, local);
}

/* Errors of the chunked forward end every rank with the same status, and the runtime stays usable. */
static void test_chunks_errors(void)
{
    const int P = hp_comm_size(W), r = hp_comm_rank(W);
    hp_model *m;
    hp_st_file *f;
    hp_moe_layer *full, *local;
    open_qwen2(&m, &f, &full, &local);
    const hp_st_tensor *t = f ? hp_st_find(f, "x") : NULL;
    hp_err err;
    hp_moe_ep *ep = NULL, *plain = NULL;
    const float *x = t ? (const float *)hp_st_data(f, t) + r * 8 * 64 : NULL;
    float *y = calloc(8 * 64, sizeof *y);
    if (!(full && local && t && y)) goto out;
    /* Rank 0 is sized for 1 token, the others for 8: their 2-chunk halves (4) do not fit rank 0's stages. */
    CHECK_MSG(hp_moe_ep_create_chunked(&ep, local, W, r == 0 ? 1 : 8, 2, &err) == HP_OK, "%s", err.msg);
    CHECK(hp_moe_ep_create(&plain, local, W, 8, &err) == HP_OK);
    if (!ep || !plain) goto out;
    CHECK_EQ_INT(hp_moe_ep_forward_chunks(plain, x, 8 * (r > 0), y, NULL, false, 2, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "created for at most 1; create it with hp_moe_ep_create_chunked");
    CHECK_EQ_INT(hp_moe_ep_forward_chunks(ep, x, 0, y, NULL, false, 3, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "3 dispatch chunks requested but the EP runtime was created for at most 2");
    if (P > 1) {
        CHECK_EQ_INT(hp_moe_ep_forward_chunks(ep, x, 0, y, NULL, false, r == 0 ? 2 : 3, &err), HP_ERR_INPUT);
        CHECK_STR_CONTAINS(err.msg, "disagree on the number of dispatch chunks (2 to 3)");
        CHECK_EQ_INT(hp_moe_ep_forward_chunks(ep, x, 8 * (r > 0), y, NULL, true, 2, &err), HP_ERR_INPUT);
        CHECK_STR_CONTAINS(err.msg, "holds 8 local tokens: its chunks of up to 4 tokens exceed the 1 this rank's");
        if (r > 0) CHECK_STR_CONTAINS(err.msg, "rank 0: ");
    }
    /* Nothing stayed in flight: the same runtime still works, here with one token per rank. */
    CHECK_MSG(hp_moe_ep_forward_chunks(ep, x, 1, y, NULL, true, 2, &err) == HP_OK, "%s", err.msg);
out:
    free(y);
    hp_moe_ep_destroy(ep);
    hp_moe_ep_destroy(plain);
    close_qwen2(m, f, full, local);
}

/* Two EP groups of consecutive ranks (TP-extend-EP with tp = 2): each group exchanges only internally. */
static void test_split_groups(void)
{
    if (hp_comm_size(W) < 4) return;
    hp_comm *g = NULL;
    hp_err err;
    CHECK(hp_comm_split(W, hp_comm_rank(W) / 2, hp_comm_rank(W) % 2, &g, &err) == HP_OK);
    if (g) run_on(g);
    hp_comm_free(g);
}

/* A rank sized for fewer tokens than a peer sends it is refused on every rank, never overrun. */
static void test_undersized_receiver(void)
{
    if (hp_comm_size(W) != 2) return;
    const int r = hp_comm_rank(W);
    hp_err err;
    hp_model *m = NULL;
    hp_moe_layer *l = NULL;
    hp_moe_ep *ep = NULL;
    CHECK(hp_model_open(&m, "data/golden/qwen3_moe_batched_bf16", NULL, &err) == HP_OK);
    hp_moe_load_opts lo;
    hp_moe_load_opts_default(&lo);
    lo.first_expert = r * 8;
    lo.n_local = 8;
    if (m) CHECK(hp_moe_layer_load(&l, m, 1, &lo, &err) == HP_OK);
    const int64_t T = r == 0 ? 1 : 4, H = 64;
    if (l) CHECK(hp_moe_ep_create(&ep, l, W, T, &err) == HP_OK);
    if (ep) {
        float x[4 * 64], y[4 * 64];
        for (int i = 0; i < 4 * 64; i++) x[i] = (float)((i * 37) % 17) * 0.05f - 0.4f;
        hp_moe_run_opts ro = {.balanced_router = true};
        CHECK(hp_moe_ep_forward(ep, x, T, y, &ro, false, &err) == HP_ERR_INPUT);
        CHECK_STR_CONTAINS(err.msg, "its runtime was created for 1 tokens per rank");
        (void)H;
    }
    hp_moe_ep_destroy(ep);
    hp_moe_layer_free(l);
    hp_model_close(m);
}

/* hp_moe_ep_create_shared: layer 1 of qwen2_moe (shared expert and its gate) on the buffers of layer 0's runtime
 * gives bitwise what its own runtime gives, forward and backward, on rank r's block of tokens (with and without
 * capacity, with overlap, at 2 chunks), and the owner's own forward is unchanged by the borrower's; the borrower
 * counts no bytes; a backward after another layer's forward on the shared buffers, and a layer of other shapes,
 * are refused. */
static void test_shared_runtime(void)
{
    const int P = hp_comm_size(W), r = hp_comm_rank(W);
    hp_err err;
    hp_model *m = NULL, *m3 = NULL;
    hp_st_file *f = NULL;
    hp_moe_layer *l0 = NULL, *l1 = NULL, *l3 = NULL;
    hp_moe_ep *own0 = NULL, *own1 = NULL, *sh1 = NULL, *bad = NULL;
    CHECK(hp_model_open(&m, "data/golden/qwen2_moe_per_expert_f32", NULL, &err) == HP_OK);
    CHECK(hp_model_open(&m3, "data/golden/qwen3_moe_batched_bf16", NULL, &err) == HP_OK);
    CHECK(hp_st_open(&f, "data/golden/qwen2_moe_per_expert_f32/moe_io.safetensors", &err) == HP_OK);
    hp_moe_load_opts lo;
    hp_moe_load_opts_default(&lo);
    lo.first_expert = r * (8 / P);
    lo.n_local = 8 / P;
    if (m) CHECK(hp_moe_layer_load(&l0, m, 0, &lo, &err) == HP_OK);
    if (m) CHECK(hp_moe_layer_load(&l1, m, 1, &lo, &err) == HP_OK);
    lo.first_expert = r * (16 / P);
    lo.n_local = 16 / P;
    if (m3) CHECK(hp_moe_layer_load(&l3, m3, 1, &lo, &err) == HP_OK);
    const hp_st_tensor *t = f ? hp_st_find(f, "x") : NULL;
    const int64_t H = 64, T = 32 / P, lo_row = T * r;
    const float *x = t ? (const float *)hp_st_data(f, t) + lo_row * H : NULL;
    float *y0 = calloc((size_t)(T * H), sizeof *y0), *y0b = calloc((size_t)(T * H), sizeof *y0b);
    float *ya = calloc((size_t)(T * H), sizeof *ya), *yb = calloc((size_t)(T * H), sizeof *yb);
    float *dy = calloc((size_t)(T * H), sizeof *dy), *dxa = calloc((size_t)(T * H), sizeof *dxa);
    float *dxb = calloc((size_t)(T * H), sizeof *dxb);
    hp_moe_grads *ga = NULL, *gb = NULL;
    if (!(l0 && l1 && l3 && x && y0 && y0b && ya && yb && dy && dxa && dxb)) goto out;
    CHECK(hp_moe_ep_create_chunked(&own0, l0, W, T, 2, &err) == HP_OK);
    CHECK(hp_moe_ep_create_chunked(&own1, l1, W, T, 2, &err) == HP_OK);
    CHECK_MSG(hp_moe_ep_create_shared(&sh1, l1, own0, &err) == HP_OK, "%s", err.msg);
    CHECK(hp_moe_grads_create(&ga, l1, &err) == HP_OK && hp_moe_grads_create(&gb, l1, &err) == HP_OK);
    if (!own0 || !own1 || !sh1 || !ga || !gb) goto out;
    CHECK(hp_moe_ep_workspace_bytes(own0) > 0);
    CHECK_EQ_INT((long long)hp_moe_ep_workspace_bytes(sh1), 0);
    for (int64_t i = 0; i < T * H; i++) dy[i] = (float)((i * 29) % 13) * 0.01f - 0.06f;
    static const double factors[] = {0.0, 1.0};
    for (int fi = 0; fi < 2; fi++)
        for (int mode = 0; mode < 3; mode++) { /* plain, overlap, 2 chunks */
            hp_moe_run_opts ro = {.capacity_factor = factors[fi], .policy = HP_MOE_CAP_SCORE};
            int C = mode == 2 ? 2 : 1;
            bool ov = mode == 1;
            CHECK(hp_moe_ep_forward_chunks(own0, x, T, y0, &ro, ov, C, &err) == HP_OK);
            CHECK(hp_moe_ep_forward_chunks(own1, x, T, ya, &ro, ov, C, &err) == HP_OK);
            CHECK(hp_moe_ep_forward_chunks(sh1, x, T, yb, &ro, ov, C, &err) == HP_OK);
            CHECK_MSG(!memcmp(ya, yb, (size_t)(T * H) * sizeof *ya), "shared runtime: cf %.1f mode %d differs",
                      factors[fi], mode);
            CHECK(!memcmp(hp_moe_ep_ws(own1)->topk_idx, hp_moe_ep_ws(sh1)->topk_idx, (size_t)(T * 4) * 4));
            if (mode == 1) continue;
            hp_moe_grads_zero(ga);
            hp_moe_grads_zero(gb);
            CHECK(hp_moe_ep_backward(own1, x, T, dy, dxa, ga, &err) == HP_OK);
            CHECK_MSG(hp_moe_ep_backward(sh1, x, T, dy, dxb, gb, &err) == HP_OK, "%s", err.msg);
            CHECK(!memcmp(dxa, dxb, (size_t)(T * H) * sizeof *dxa));
            CHECK(!memcmp(ga->d_gate_up, gb->d_gate_up, (size_t)(l1->n_local * 2 * l1->d_expert * H) * sizeof(float)));
            CHECK(!memcmp(ga->d_ws_gate, gb->d_ws_gate, (size_t)H * sizeof(float)));
            /* the owner's forward after the borrower's is its own again */
            CHECK(hp_moe_ep_forward_chunks(own0, x, T, y0b, &ro, ov, C, &err) == HP_OK);
            CHECK(!memcmp(y0, y0b, (size_t)(T * H) * sizeof *y0));
            CHECK_EQ_INT(hp_moe_ep_backward(sh1, x, T, dy, dxb, gb, &err), HP_ERR_INPUT);
            CHECK_STR_CONTAINS(err.msg, "layer 1: the EP buffers it shares hold another layer's forward");
        }
    CHECK_EQ_INT(hp_moe_ep_create_shared(&bad, l3, own0, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "cannot share the EP buffers of layer 0: its number of experts differs");
    CHECK(bad == NULL);
out:
    hp_moe_grads_free(ga);
    hp_moe_grads_free(gb);
    free(y0), free(y0b), free(ya), free(yb), free(dy), free(dxa), free(dxb);
    hp_moe_ep_destroy(sh1);
    hp_moe_ep_destroy(own1);
    hp_moe_ep_destroy(own0);
    hp_moe_layer_free(l0), hp_moe_layer_free(l1), hp_moe_layer_free(l3);
    hp_st_close(f);
    hp_model_close(m);
    hp_model_close(m3);
}

/* hp_moe_ep_create_bounded: buffers for one chunk. qwen2_moe layer 0 (shared expert and its gate), runtimes
 * made for 9 tokens per rank in 3 chunks (stages of 3 tokens), rank r holding {0, 7, 3, 9}[r % 4] tokens (below,
 * at and above a chunk; 9 on one rank alone): with and without a capacity factor, with and without overlap, in 3
 * and 5 chunks (more than made for: they fit), the routing equals the plain forward's and y is within 1e-6 · max|y| of it (the expert products
 * run on fewer rows per call, see check_chunks); it holds fewer bytes than the unbounded runtime; a plain forward,
 * a forward in 2 chunks (of up to 5 tokens) and a backward of more tokens than one exchange holds are refused on every
 * rank, and a backward of what fits matches the unbounded runtime's. */
static void test_bounded(void)
{
    static const int64_t n_of[4] = {0, 7, 3, 9}, first_of[4] = {0, 0, 7, 10};
    const int r = hp_comm_rank(W), who = hp_comm_size(W) == 1 ? 3 : r % 4;
    hp_model *m;
    hp_st_file *f;
    hp_moe_layer *full, *local;
    open_qwen2(&m, &f, &full, &local);
    const hp_st_tensor *t = f ? hp_st_find(f, "x") : NULL;
    hp_err err;
    hp_moe_ep *bd = NULL, *un = NULL;
    const int64_t H = 64, K = full ? full->top_k : 1, T = n_of[who];
    const float *x = t ? (const float *)hp_st_data(f, t) + (first_of[who] + 16 * (r / 4)) * H : NULL;
    float *y = calloc(10 * 64, sizeof *y), *yb = calloc(10 * 64, sizeof *yb), *dy = calloc(10 * 64, sizeof *dy);
    float *dxa = calloc(10 * 64, sizeof *dxa), *dxb = calloc(10 * 64, sizeof *dxb);
    hp_moe_grads *ga = NULL, *gb = NULL;
    int32_t topk[9 * 8];
    if (!(full && local && t && y && yb && dy && dxa && dxb)) goto out;
    CHECK_MSG(hp_moe_ep_create_bounded(&bd, local, W, 9, 3, &err) == HP_OK, "%s", err.msg);
    CHECK(hp_moe_ep_create_chunked(&un, local, W, 9, 5, &err) == HP_OK);
    CHECK(hp_moe_grads_create(&ga, local, &err) == HP_OK && hp_moe_grads_create(&gb, local, &err) == HP_OK);
    if (!bd || !un || !ga || !gb) goto out;
    CHECK_MSG(hp_moe_ep_workspace_bytes(bd) < hp_moe_ep_workspace_bytes(un), "bounded %zu vs %zu bytes",
              hp_moe_ep_workspace_bytes(bd), hp_moe_ep_workspace_bytes(un));
    static const double factors[] = {0.0, 1.0};
    for (int fi = 0; fi < 2; fi++) {
        hp_moe_run_opts ro = {.capacity_factor = factors[fi], .policy = HP_MOE_CAP_SCORE};
        CHECK(hp_moe_ep_forward(un, x, T, y, &ro, false, &err) == HP_OK);
        memcpy(topk, hp_moe_ep_ws(un)->topk_idx, (size_t)(T * K) * sizeof *topk);
        for (int C = 3; C <= 5; C += 2)
            for (int ov = 0; ov < 2; ov++) {
                CHECK_MSG(hp_moe_ep_forward_chunks(bd, x, T, yb, &ro, ov, C, &err) == HP_OK, "%s", err.msg);
                CHECK_CLOSE_MSG(yb, y, T * H, 0, 1e-6, "bounded rank %d cf %.1f %d chunks%s", r, factors[fi], C,
                                ov ? " overlap" : "");
                CHECK(!memcmp(topk, hp_moe_ep_ws(bd)->topk_idx, (size_t)(T * K) * sizeof *topk));
            }
    }
    /* Refused on every rank: one dispatch of 9 tokens (the buffers hold 2 stages of 3), 2 chunks of 5. */
    CHECK_EQ_INT(hp_moe_ep_forward(bd, x, T, yb, NULL, false, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "local tokens in one dispatch exceed the 6 the EP runtime's buffers hold");
    CHECK_EQ_INT(hp_moe_ep_forward_chunks(bd, x, T, yb, NULL, false, 2, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "tokens exceed the 3 this rank's chunk buffers hold");
    for (int64_t i = 0; i < 9 * H; i++) dy[i] = (float)((i * 29) % 13) * 0.01f - 0.06f;
    CHECK(hp_moe_ep_forward_chunks(bd, x, T, yb, NULL, false, 3, &err) == HP_OK);
    CHECK_EQ_INT(hp_moe_ep_backward(bd, x, T, dy, dxb, gb, &err), HP_ERR_INPUT);
    /* What fits one exchange (2 tokens a rank: 2·K rows to send, at most P·3·K to receive) is the same backward. */
    CHECK(hp_moe_ep_forward_chunks(bd, x, T < 2 ? T : 2, yb, NULL, false, 3, &err) == HP_OK);
    CHECK_MSG(hp_moe_ep_backward(bd, x, T < 2 ? T : 2, dy, dxb, gb, &err) == HP_OK, "%s", err.msg);
    CHECK(hp_moe_ep_forward(un, x, T < 2 ? T : 2, y, NULL, false, &err) == HP_OK);
    CHECK(hp_moe_ep_backward(un, x, T < 2 ? T : 2, dy, dxa, ga, &err) == HP_OK);
    CHECK(!memcmp(dxa, dxb, (size_t)((T < 2 ? T : 2) * H) * sizeof *dxa));
out:
    hp_moe_grads_free(ga);
    hp_moe_grads_free(gb);
    free(y), free(yb), free(dy), free(dxa), free(dxb);
    hp_moe_ep_destroy(bd);
    hp_moe_ep_destroy(un);
    close_qwen2(m, f, full, local);
}

int main(int argc, char **argv)
{
    hp_err err;
    if (hp_comm_world(&W, &argc, &argv, &err) != HP_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    hp_moe_set_threads(1);
    static const mpi_test tests[] = {{"undersized_receiver", test_undersized_receiver}, {"world_group", test_world_group},
                 {"split_groups", test_split_groups},
                 {"chunks_uneven", test_chunks_uneven},
                 {"chunks_errors", test_chunks_errors}, {"shared_runtime", test_shared_runtime},
                 {"bounded", test_bounded}};
    int rc = mpi_run_tests(W, tests, sizeof tests / sizeof *tests);
    hp_comm_free(W);
    return rc;
}
