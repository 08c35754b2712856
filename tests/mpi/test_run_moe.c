/*
 * test_run_moe.c — hp_run_moe, the one library function behind `hyperpar moe` under mpirun: every golden MoE
 * folder's first sparse layer at this world size (ep = the world when it divides the experts) against the golden
 * y and topk_idx; a wrong archetype or a missing layer fails every rank with the same message.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperpar/run.h"
#include "hyperpar/safetensors.h"
#include "mpitest.h"

static hp_comm *g_world;

static const struct {
    const char *dir, *arch;
    int64_t layer;
} g_cases[] = {
    {"data/golden/mixtral_per_expert_f32", "mixtral_topk_router", 0},
    {"data/golden/qwen3_moe_batched_bf16", "qwen3moe_topk_router", 1},
    {"data/golden/deepseek_v3_per_expert_f32", "deepseekv3_sigmoid_group_shared", 1},
    {"data/golden/gpt_oss_batched_f32", "gptoss_topk_router", 0},
};

static void golden_layers(void)
{
    int N = hp_comm_size(g_world), R = hp_comm_rank(g_world);
    for (size_t i = 0; i < sizeof g_cases / sizeof *g_cases; i++) {
        char io[256], key[64];
        snprintf(io, sizeof io, "%s/moe_io.safetensors", g_cases[i].dir);
        hp_st_file *f = NULL;
        hp_err err;
        CHECK_MSG(hp_st_open(&f, io, &err) == HP_OK, "%s", err.msg);
        if (!f) continue;
        const hp_st_tensor *tx = hp_st_find(f, "x");
        hp_run_moe_opts o = {.model = g_cases[i].dir, .layer = g_cases[i].layer, .archetype = g_cases[i].arch,
                             .ep = 8 % N == 0 ? N : 1};
        hp_run_moe_result res;
        hp_status st = hp_run_moe(g_world, &o, hp_st_data(f, tx), tx->shape[0], tx->shape[1], &res, &err);
        CHECK_MSG(st == HP_OK, "%s: %s", g_cases[i].dir, err.msg);
        if (st == HP_OK && R == 0) {
            snprintf(key, sizeof key, "layers.%lld.y", (long long)o.layer);
            const hp_st_tensor *ty = hp_st_find(f, key);
            hp_tol t;
            int64_t shape[2] = {res.T, res.H};
            CHECK_MSG(ty && hp_tol_check(res.y, hp_st_data(f, ty), 2, shape, 1e-4, &t), "%s: y off by %.3g",
                      g_cases[i].dir, t.max_diff);
            snprintf(key, sizeof key, "layers.%lld.topk_idx", (long long)o.layer);
            const hp_st_tensor *ti = hp_st_find(f, key);
            CHECK(ti && !memcmp(hp_st_data(f, ti), res.topk_idx, (size_t)(res.T * res.K) * sizeof(int32_t)));
            CHECK_EQ_INT(res.ep, o.ep);
        }
        hp_run_moe_result_free(&res);
        hp_st_close(f);
    }
}

static void failures_agree(void)
{
    float x[64] = {0};
    hp_err err;
    hp_run_moe_result res;
    hp_run_moe_opts o = {.model = "data/golden/mixtral_per_expert_f32", .layer = 7, .archetype = "mixtral_topk_router"};
    CHECK(hp_run_moe(g_world, &o, x, 1, 64, &res, &err) == HP_ERR_INPUT && res.agreed);
    o.layer = 0;
    o.archetype = "no_such_archetype";
    CHECK(hp_run_moe(g_world, &o, x, 1, 64, &res, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "unknown archetype");
}

int main(int argc, char **argv)
{
    hp_err err;
    if (hp_comm_world(&g_world, &argc, &argv, &err) != HP_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    static const mpi_test tests[] = {{"golden_layers", golden_layers}, {"failures_agree", failures_agree}};
    int rc = mpi_run_tests(g_world, tests, sizeof tests / sizeof *tests);
    hp_comm_free(g_world);
    return rc;
}
