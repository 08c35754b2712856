/*
 * test_moe_ep.c — expert parallelism under mpirun (1, 2, 4 ranks; also run without a launcher): for every
 * golden folder and sparse layer, each rank's EP output on its block of tokens equals the one-process
 * layer applied to that block (max |Δy| <= 1e-5 · max|y|, topk_idx identical) — without a capacity factor
 * and with capacity factors 1.0 and 1.5 applied per rank to its own slots — and --overlap gives exactly the
 * same numbers as without it. Also an EP group split out of the world (two groups at 4 ranks).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperpar/comm.h"
#include "hyperpar/moe.h"
#include "testlib.h"

static hp_comm *W;

static const char *g_golden[] = {"deepseek_v3_per_expert_f32", "glm4_moe_batched_bf16", "gpt_oss_batched_f32",
                                 "mixtral_batched_bf16", "mixtral_per_expert_f32", "qwen2_moe_per_expert_f32",
                                 "qwen3_moe_batched_bf16"};

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
    if (st == HP_OK) st = hp_moe_ep_create(&ep, local, g, Tl > 0 ? Tl : 1, &err);
    CHECK_MSG(st == HP_OK, "%s", err.msg);
    float *yref = calloc((size_t)((Tl + 1) * H), sizeof *yref), *y = calloc((size_t)((Tl + 1) * H), sizeof *y);
    float *yo = calloc((size_t)((Tl + 1) * H), sizeof *yo);
    static const double factors[] = {0.0, 1.0, 1.5};
    for (size_t f = 0; st == HP_OK && f < 3; f++) {
        hp_moe_run_opts ro = {.capacity_factor = factors[f], .policy = HP_MOE_CAP_SCORE};
        if (Tl > 0) CHECK(hp_moe_forward(full, ws, x + lo_row * H, Tl, H, yref, &ro, &err) == HP_OK);
        CHECK_MSG(hp_moe_ep_forward(ep, x + lo_row * H, Tl, y, &ro, false, &err) == HP_OK, "%s", err.msg);
        double mx = 0, d = 0;
        for (int64_t i = 0; i < Tl * H; i++) {
            mx = fmax(mx, fabs(yref[i]));
            d = fmax(d, fabs((double)y[i] - yref[i]));
        }
        CHECK_MSG(d <= 1e-5 * mx, "%s layer %lld cf %.1f rank %d/%d: max diff %.3g vs %.3g", m->path, (long long)layer,
                  factors[f], r, P, d, 1e-5 * mx);
        CHECK(memcmp(ws->topk_idx, hp_moe_ep_ws(ep)->topk_idx, (size_t)(Tl * K) * sizeof(int32_t)) == 0);
        if (factors[f] > 0) CHECK_EQ_INT(hp_moe_ep_get_stats(ep)->n_dropped, ws->stats.n_dropped);
        /* --overlap: the same numbers. */
        CHECK(hp_moe_ep_forward(ep, x + lo_row * H, Tl, yo, &ro, true, &err) == HP_OK);
        bool same = true;
        for (int64_t i = 0; i < Tl * H; i++) same &= yo[i] == y[i];
        CHECK_MSG(same, "%s layer %lld: overlap differs", m->path, (long long)layer);
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

int main(int argc, char **argv)
{
    hp_err err;
    if (hp_comm_world(&W, &argc, &argv, &err) != HP_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    hp_moe_set_threads(1);
    struct {
        const char *name;
        void (*fn)(void);
    } tests[] = {{"world_group", test_world_group}, {"split_groups", test_split_groups}};
    int passed = 0, failed = 0;
    for (size_t i = 0; i < sizeof tests / sizeof *tests; i++) {
        int before = hp__failed_checks;
        tests[i].fn();
        if (hp__failed_checks == before) passed++;
        else {
            failed++;
            fprintf(stderr, "rank %d: FAIL %s\n", hp_comm_rank(W), tests[i].name);
        }
    }
    double f = failed;
    hp_comm_allreduce_max_f64(W, &f, 1, &err);
    if (hp_comm_rank(W) == 0) printf("%d passed, %d failed (%d ranks)\n", passed, (int)f, hp_comm_size(W));
    int rc = f > 0 ? 1 : 0;
    hp_comm_free(W);
    return rc;
}
