/*
 * test_moe_shard.c — MoE layers loaded from the rank files of `hyperpar shard` equal, bit for bit, the same
 * local experts loaded from the full checkpoint (per-expert stacks and ep-cut batched tensors, every golden
 * layout, every sparse layer, both ranks of an ep=2 mesh); a zero-copy f32 load outlives nothing it points
 * into; and every refusal (TP-sliced shared expert, ep mismatch, missing rank file / config / manifest, a
 * one-process run from an ep>1 folder) has its status and message checked.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyperpar/gen.h"
#include "hyperpar/moe.h"
#include "hyperpar/shard.h"
#include "testlib.h"

#define GOLDEN "data/golden"

static const char *work(void) { return test_work_dir("moe_shard"); }

/* Shards model_dir for the mesh dp x tp with ep (TP-extend-EP) into out; false (with a failed check) when the
 * plan or the write fails. */
static bool shard(const char *model_dir, int64_t dp, int64_t tp, int64_t ep, const char *out)
{
    hp_model *m = NULL;
    hp_err err;
    CHECK_MSG(hp_model_open(&m, model_dir, NULL, &err) == HP_OK, "%s: %s", model_dir, err.msg);
    if (!m) return false;
    hp_plan_opts po;
    hp_plan_opts_default(&po);
    hp_mesh_from_sizes(&po.mesh, dp, 1, tp, ep, false);
    hp_plan *p = NULL;
    hp_status st = hp_plan_derive(&p, m, &po, &err);
    if (st != HP_OK) {
        po.packed_fused = true; /* fused batched gate_up under tp without ep */
        st = hp_plan_derive(&p, m, &po, &err);
    }
    CHECK_MSG(st == HP_OK, "%s: plan: %s", model_dir, err.msg);
    if (st == HP_OK) {
        st = hp_shard_write(m, p, out, NULL, NULL, &err);
        CHECK_MSG(st == HP_OK, "%s: shard: %s", model_dir, err.msg);
    }
    hp_plan_free(p);
    hp_model_close(m);
    return st == HP_OK;
}

static bool same_f32(const float *a, const float *b, int64_t n)
{
    if (!a || !b) return a == b;
    return !memcmp(a, b, (size_t)n * sizeof *a);
}

static bool same_f64(const double *a, const double *b, int64_t n)
{
    if (!a || !b) return a == b;
    return !memcmp(a, b, (size_t)n * sizeof *a);
}

/* Every field and weight of the two layers is identical (bitwise for the weights). */
static void check_same_layer(const hp_moe_layer *a, const hp_moe_layer *b, const char *label)
{
    CHECK_MSG(a->archetype == b->archetype && a->router == b->router && a->shared == b->shared && a->act == b->act,
              "%s: archetype", label);
    CHECK_MSG(a->layer == b->layer && a->n_hidden == b->n_hidden && a->n_experts == b->n_experts &&
                  a->top_k == b->top_k && a->d_expert == b->d_expert && a->d_shared == b->d_shared,
              "%s: dims", label);
    CHECK_MSG(a->first_expert == b->first_expert && a->n_local == b->n_local, "%s: range", label);
    CHECK_MSG(a->norm_topk_prob == b->norm_topk_prob && a->routed_scaling_factor == b->routed_scaling_factor &&
                  a->n_group == b->n_group && a->topk_group == b->topk_group && a->swiglu_limit == b->swiglu_limit,
              "%s: router settings", label);
    CHECK_MSG(a->dtype == b->dtype, "%s: dtype %s vs %s", label, hp_dtype_name(a->dtype), hp_dtype_name(b->dtype));
    CHECK_STR_EQ(a->prefix, b->prefix);
    int64_t H = a->n_hidden, E = a->n_experts, I = a->d_expert, n = a->n_local, sI = a->d_shared;
    CHECK_MSG(same_f64(a->w_router, b->w_router, E * H), "%s: router weight differs", label);
    CHECK_MSG(same_f64(a->b_router, b->b_router, E), "%s: router bias differs", label);
    CHECK_MSG(same_f64(a->b_correction, b->b_correction, E), "%s: correction bias differs", label);
    CHECK_MSG(a->w_dtype == b->w_dtype, "%s: resident dtypes differ", label);
    size_t el = a->w_dtype == HP_DT_BF16 ? 2 : 4;
    CHECK_MSG(!memcmp(a->w_gate_up, b->w_gate_up, (size_t)(n * 2 * I * H) * el), "%s: w_gate_up differs", label);
    CHECK_MSG(!memcmp(a->w_down, b->w_down, (size_t)(n * H * I) * el), "%s: w_down differs", label);
    CHECK_MSG(same_f32(a->b_gate_up, b->b_gate_up, n * 2 * I), "%s: b_gate_up differs", label);
    CHECK_MSG(same_f32(a->b_down, b->b_down, n * H), "%s: b_down differs", label);
    CHECK_MSG(same_f32(a->ws_gate_up, b->ws_gate_up, 2 * sI * H), "%s: shared gate/up differs", label);
    CHECK_MSG(same_f32(a->ws_down, b->ws_down, H * sI), "%s: shared down differs", label);
    CHECK_MSG(same_f32(a->ws_gate, b->ws_gate, H), "%s: shared gate differs", label);
}

/* For every sparse layer and each of the `ep` ranks: the rank file's layer equals the full checkpoint's
 * layer for that rank's expert range. Returns the number of (layer, rank) pairs compared. */
static int compare_folder(const char *model_dir, const char *shards, int64_t ep)
{
    hp_model *m = NULL;
    hp_err err;
    CHECK_MSG(hp_model_open(&m, model_dir, NULL, &err) == HP_OK, "%s: %s", model_dir, err.msg);
    if (!m) return 0;
    hp_model *cfg = NULL;
    CHECK_MSG(hp_moe_shard_config_open(&cfg, shards, &err) == HP_OK, "%s: %s", shards, err.msg);
    int n = 0;
    int64_t E = m->cfg.n_experts;
    for (int64_t L = 0; L < m->cfg.num_hidden_layers; L++) {
        if (!hp_model_layer_is_sparse(m, L)) continue;
        for (int64_t r = 0; r < ep; r++) {
            hp_moe_load_opts o;
            hp_moe_load_opts_default(&o);
            o.first_expert = r * (E / ep);
            o.n_local = ep > 1 ? E / ep : 0;
            hp_moe_layer *full = NULL, *sh = NULL;
            char label[512];
            snprintf(label, sizeof label, "%s layer %lld rank %lld of ep=%lld", model_dir, (long long)L, (long long)r,
                     (long long)ep);
            CHECK_MSG(hp_moe_layer_load(&full, m, L, &o, &err) == HP_OK, "%s: full: %s", label, err.msg);
            /* Both with the folder's own config model and with the loader opening config.json itself. */
            CHECK_MSG(hp_moe_layer_load_shard(&sh, shards, (r % 2) ? cfg : NULL, r, L, &o, &err) == HP_OK,
                      "%s: shard: %s", label, err.msg);
            if (full && sh) {
                check_same_layer(full, sh, label);
                CHECK_STR_CONTAINS(sh->storage, "(shard)");
                n++;
            }
            hp_moe_layer_free(full);
            hp_moe_layer_free(sh);
        }
    }
    hp_model_close(cfg);
    hp_model_close(m);
    return n;
}

TEST(golden_ep2_ranks_equal_full_checkpoint)
{
    static const char *const folders[] = {"qwen2_moe_per_expert_f32", "mixtral_per_expert_f32",
                                          "deepseek_v3_per_expert_f32", "qwen3_moe_batched_bf16",
                                          "glm4_moe_batched_bf16",     "gpt_oss_batched_f32"};
    int pairs = 0;
    for (size_t i = 0; i < sizeof folders / sizeof *folders; i++) {
        char src[256], out[512];
        snprintf(src, sizeof src, GOLDEN "/%s", folders[i]);
        snprintf(out, sizeof out, "%s/%s_ep2", work(), folders[i]);
        /* D-10: dp=2 world 2 with --ep 2: the EP group is both ranks, rank r holds experts [r·E/2, (r+1)·E/2). */
        if (!shard(src, 2, 1, 2, out)) continue;
        int n = compare_folder(src, out, 2);
        CHECK_MSG(n >= 2, "%s: only %d layer/rank pairs compared", folders[i], n);
        pairs += n;
        test_rm_rf(out);
    }
    printf("compared %d layer/rank pairs\n", pairs);
    CHECK(pairs >= 18); /* 6 folders, at least one sparse layer each, 2 ranks */
}

TEST(one_process_from_ep1_folder)
{
    /* ep=1 shards hold every expert in rank 0's file: a one-process run loads it whole. */
    static const char *const folders[] = {"qwen2_moe_per_expert_f32", "qwen3_moe_batched_bf16"};
    for (size_t i = 0; i < 2; i++) {
        char src[256], out[512];
        snprintf(src, sizeof src, GOLDEN "/%s", folders[i]);
        snprintf(out, sizeof out, "%s/%s_ep1", work(), folders[i]);
        if (!shard(src, 2, 1, 1, out)) continue;
        CHECK(compare_folder(src, out, 1) >= 1);
        test_rm_rf(out);
    }
}

TEST(zero_copy_f32_batched_outlives_nothing)
{
    /* An f32 batched checkpoint: the shard loader points into the rank file's mapping, which the layer keeps. */
    char src[512], out[512];
    snprintf(src, sizeof src, "%s/gen_qwen3_f32_batched", work());
    snprintf(out, sizeof out, "%s/gen_qwen3_f32_batched_ep2", work());
    hp_gen_opts g;
    hp_gen_opts_default(&g);
    g.family = "qwen3_moe";
    g.layout = HP_LAYOUT_BATCHED;
    g.dtype = HP_DT_F32;
    g.seed = 7;
    hp_err err;
    CHECK_MSG(hp_gen_checkpoint(&g, src, &err) == HP_OK, "%s", err.msg);
    if (!shard(src, 2, 1, 2, out)) return;
    hp_model *m = NULL;
    CHECK(hp_model_open(&m, src, NULL, &err) == HP_OK);
    hp_moe_load_opts o;
    hp_moe_load_opts_default(&o);
    o.first_expert = m->cfg.n_experts / 2;
    o.n_local = m->cfg.n_experts / 2;
    int64_t L = 0;
    while (L < m->cfg.num_hidden_layers && !hp_model_layer_is_sparse(m, L)) L++;
    hp_moe_layer *full = NULL, *sh = NULL;
    CHECK(hp_moe_layer_load(&full, m, L, &o, &err) == HP_OK);
    CHECK_MSG(hp_moe_layer_load_shard(&sh, out, NULL, 1, L, &o, &err) == HP_OK, "%s", err.msg);
    if (full && sh) {
        CHECK(sh->zero_copy);
        check_same_layer(full, sh, "generated f32 batched, rank 1");
        /* A forward through the mapped weights equals, bit for bit, the same experts loaded from the
         * checkpoint: every local expert gets rows (expert e: e % 3 + 1 of them), whatever the dimensions. */
        const int64_t H = sh->n_hidden, n = sh->n_local;
        int64_t *counts = calloc((size_t)n, sizeof *counts), N = 0;
        for (int64_t e = 0; counts && e < n; e++) N += counts[e] = e % 3 + 1;
        float *rows = calloc((size_t)(N * H), sizeof *rows), *y_sh = calloc((size_t)(N * H), sizeof *y_sh);
        float *y_full = calloc((size_t)(N * H), sizeof *y_full);
        hp_moe_ws *ws = NULL, *ws_full = NULL;
        CHECK(counts && rows && y_sh && y_full);
        CHECK(hp_moe_ws_create(&ws, sh, 3, &err) == HP_OK);
        CHECK(hp_moe_ws_create(&ws_full, full, 3, &err) == HP_OK);
        if (counts && rows && y_sh && y_full && ws && ws_full) {
            for (int64_t i = 0; i < N * H; i++) rows[i] = (float)(i % 7) * 0.125f - 0.375f;
            CHECK(hp_moe_experts_forward(sh, ws, rows, counts, y_sh, &err) == HP_OK);
            CHECK(hp_moe_experts_forward(full, ws_full, rows, counts, y_full, &err) == HP_OK);
            int64_t differ = 0, nonfinite = 0, nonzero = 0;
            for (int64_t i = 0; i < N * H; i++) {
                differ += y_sh[i] != y_full[i];
                nonfinite += !isfinite(y_sh[i]);
                nonzero += y_sh[i] != 0.0f;
            }
            CHECK_EQ_INT(differ, 0);
            CHECK_EQ_INT(nonfinite, 0);
            CHECK(nonzero > N * H / 2); /* the weights were really read, not zeros */
        }
        hp_moe_ws_destroy(ws);
        hp_moe_ws_destroy(ws_full);
        free(counts);
        free(rows);
        free(y_sh);
        free(y_full);
    }
    hp_moe_layer_free(full);
    hp_moe_layer_free(sh);
    hp_model_close(m);
}

/* Loads layer L of rank r from shards with the given range; expects HP_ERR_INPUT and each needle. */
static void expect_error(const char *shards, int64_t r, int64_t L, int64_t first, int64_t n_local,
                         const char *const *needles)
{
    hp_moe_load_opts o;
    hp_moe_load_opts_default(&o);
    o.first_expert = first;
    o.n_local = n_local;
    hp_moe_layer *l = NULL;
    hp_err err;
    hp_err_clear(&err);
    hp_status st = hp_moe_layer_load_shard(&l, shards, NULL, r, L, &o, &err);
    CHECK_EQ_INT(st, HP_ERR_INPUT);
    CHECK(l == NULL);
    for (int i = 0; needles[i]; i++) CHECK_STR_CONTAINS(err.msg, needles[i]);
    hp_moe_layer_free(l);
}

TEST(tp_sliced_shared_expert_is_refused)
{
    /* tp=2 with ep=2 (TP-extend-EP): the experts are cut by ep, but the shared expert by tp. */
    char out[512];
    snprintf(out, sizeof out, "%s/qwen2_tp2_ep2", work());
    if (!shard(GOLDEN "/qwen2_moe_per_expert_f32", 1, 2, 2, out)) return;
    const char *const needles[] = {"model.layers.1.mlp.shared_expert.gate_proj.weight", "dim 0 [0, 32)",
                                   "shard with --tp 1 for MoE runs", "or run from the full checkpoint", NULL};
    expect_error(out, 0, 1, 0, 4, needles);
    const char *const needles1[] = {"rank-00001.safetensors", "dim 0 [32, 64)", NULL};
    expect_error(out, 1, 1, 4, 4, needles1);
    test_rm_rf(out);
}

TEST(ep_mismatch_names_both_ranges)
{
    /* Sharded for ep=4 (dp=4), run as ep=2: rank 1 holds experts [2, 4) but needs [4, 8). */
    char out[512];
    snprintf(out, sizeof out, "%s/qwen2_ep4", work());
    if (!shard(GOLDEN "/qwen2_moe_per_expert_f32", 4, 1, 4, out)) return;
    const char *const needles[] = {"rank 1's file holds experts [2, 4)", "needs experts [4, 8)", "ep=2",
                                   "--ep 4", NULL};
    expect_error(out, 1, 1, 4, 4, needles);
    test_rm_rf(out);

    /* Batched: the same check reads the ep-cut tensor. */
    snprintf(out, sizeof out, "%s/qwen3_ep4", work());
    if (!shard(GOLDEN "/qwen3_moe_batched_bf16", 4, 1, 4, out)) return;
    const char *const needles_b[] = {"holds experts [4, 8)", "needs experts [8, 16)", "experts.gate_up_proj", NULL};
    expect_error(out, 1, 0, 8, 8, needles_b);
    /* One process (all experts) from an ep>1 folder. */
    const char *const needles_one[] = {"rank 0's file holds experts [0, 4)", "needs experts [0, 16)",
                                       "a run without mpirun needs every expert", "shard with ep=1", NULL};
    expect_error(out, 0, 0, 0, 0, needles_one);
    test_rm_rf(out);
}

TEST(missing_pieces_are_named)
{
    char out[512], path[600];
    snprintf(out, sizeof out, "%s/mixtral_ep2", work());
    if (!shard(GOLDEN "/mixtral_per_expert_f32", 2, 1, 2, out)) return;
    /* A rank outside the folder's world. */
    const char *const world[] = {"rank 2 has no file", "world of 2 ranks", NULL};
    expect_error(out, 2, 0, 0, 4, world);
    /* The rank file missing. */
    snprintf(path, sizeof path, "%s/rank-00001.safetensors", out);
    CHECK(unlink(path) == 0);
    char want[700];
    snprintf(want, sizeof want, "rank 1: %s is missing", path);
    const char *const missing[] = {want, "re-run 'hyperpar shard'", NULL};
    expect_error(out, 1, 0, 4, 4, missing);
    /* Rank 0 still loads. */
    hp_moe_layer *l = NULL;
    hp_moe_load_opts o;
    hp_moe_load_opts_default(&o);
    o.n_local = 4;
    hp_err err;
    CHECK_MSG(hp_moe_layer_load_shard(&l, out, NULL, 0, 0, &o, &err) == HP_OK, "%s", err.msg);
    hp_moe_layer_free(l);
    /* config.json missing. */
    snprintf(path, sizeof path, "%s/config.json", out);
    CHECK(unlink(path) == 0);
    const char *const cfg[] = {"config.json is missing", NULL};
    expect_error(out, 0, 0, 0, 4, cfg);
    /* Not a shard folder. */
    const char *const man[] = {"manifest.json is missing", NULL};
    expect_error(GOLDEN "/mixtral_per_expert_f32", 0, 0, 0, 4, man);
    test_rm_rf(out);
}

TEST_MAIN()
