/*
 * test_archetypes.c — the planner and the MoE runtime expand one archetype table (src/core/archetypes.def)
 * and agree on what runs when nothing is declared: the planner's suggestion for every golden MoE checkpoint is
 * the archetype the runtime loads by default, and an unknown family falls back to the same archetype in both.
 */
#include <stdio.h>
#include <string.h>

#include "hyperpar/moe.h"
#include "hyperpar/overrides.h"
#include "hyperpar/shard.h"
#include "testlib.h"

TEST(same_keys_same_order)
{
    CHECK_EQ_INT(hp_archetype_count(), HP_MOE_ARCHETYPE_COUNT);
    for (size_t i = 0; i < hp_archetype_count(); i++) {
        hp_moe_archetype a;
        CHECK(hp_moe_archetype_parse(hp_archetype_key(i), &a));
        CHECK_EQ_INT(a, i);
        CHECK_STR_EQ(hp_moe_archetype_name(a), hp_archetype_key(i));
    }
    CHECK_STR_EQ(hp_archetype_list(), hp_moe_archetype_list());
}

TEST(default_is_the_suggestion)
{
    static const char *const dirs[] = {"deepseek_v3_per_expert_f32", "glm4_moe_batched_bf16", "gpt_oss_batched_f32",
                                       "mixtral_per_expert_f32", "qwen2_moe_per_expert_f32", "qwen3_moe_batched_bf16"};
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
        char path[256];
        snprintf(path, sizeof path, "data/golden/%s", dirs[i]);
        hp_model *m = NULL;
        hp_err err;
        if (hp_model_open(&m, path, NULL, &err) != HP_OK) {
            CHECK_MSG(false, "%s", err.msg);
            continue;
        }
        int64_t layer = m->cfg.first_k_dense_replace; /* the first sparse layer */
        hp_moe_load_opts o;
        hp_moe_load_opts_default(&o);
        o.archetype = -1;
        hp_moe_layer *l = NULL;
        CHECK_MSG(hp_moe_layer_load(&l, m, layer, &o, &err) == HP_OK, "%s: %s", dirs[i], err.msg);
        if (l) CHECK_STR_EQ(hp_moe_archetype_name(l->archetype), hp_archetype_suggest(m));
        hp_moe_layer_free(l);
        hp_model_close(m);
    }
}

TEST(unknown_family_falls_back_alike)
{
    const char *cfg = "{\"architectures\": [\"FooMoeForCausalLM\"], \"model_type\": \"foo_moe\", \"hidden_size\": 8}";
    hp_model *m = NULL;
    hp_err err;
    if (hp_model_from_config_text(&m, cfg, strlen(cfg), "foo.json", NULL, &err) != HP_OK) {
        /* a meta model of an unknown family may be refused; the rule itself is still one function */
        CHECK_STR_EQ(hp_model_suggested_archetype(&(hp_model){0}), "routed_only_softmax_topk");
        return;
    }
    CHECK_STR_EQ(hp_archetype_suggest(m), "routed_only_softmax_topk");
    CHECK_STR_EQ(hp_model_suggested_archetype(m), hp_archetype_suggest(m));
    hp_model_close(m);
}

/* Which experts a rank holds is said in one place: the shard layout's cut equals hp_ep_local_experts of the
 * rank's hp_mesh_ep_index, for TP-extend-EP and for an explicit ep axis. */
TEST(ep_slots_one_place)
{
    hp_model *m = NULL;
    hp_err err;
    if (hp_model_open(&m, "data/golden/mixtral_per_expert_f32", NULL, &err) != HP_OK) {
        CHECK_MSG(false, "%s", err.msg);
        return;
    }
    static const char *const meshes[] = {"dp=2,tp=2", "dp=2,ep=2", "ep=2,tp=2"};
    static const int64_t eps[] = {2, 2, 2};
    for (size_t k = 0; k < 3; k++) {
        hp_plan_opts po;
        hp_plan_opts_default(&po);
        CHECK(hp_mesh_parse(meshes[k], &po.mesh, &err) == HP_OK);
        if (!po.mesh.ep_axis) po.mesh.ep = eps[k];
        po.allow_uncovered = true;
        hp_plan *p = NULL;
        hp_shard_layout *l = NULL;
        if (hp_plan_derive(&p, m, &po, &err) != HP_OK || hp_shard_layout_build(&l, m, p, &err) != HP_OK) {
            CHECK_MSG(false, "%s: %s", meshes[k], err.msg);
            hp_plan_free(p);
            continue;
        }
        int checked = 0;
        for (int64_t r = 0; r < l->world; r++)
            for (size_t i = 0; i < l->n_tensors; i++) {
                hp_shard_tensor t;
                if (!l->tensors[i].stacked || hp_shard_rank_tensor(l, r, i, &t, &err) != HP_OK) continue;
                int64_t g, idx, first, n;
                hp_mesh_ep_index(&po.mesh, eps[k], r, &g, &idx);
                hp_ep_local_experts(m->cfg.n_experts, eps[k], idx, &first, &n);
                CHECK_EQ_INT(t.expert_first, first);
                CHECK_EQ_INT(t.expert_count, n);
                checked++;
            }
        CHECK_MSG(checked > 0, "%s: no stacked expert tensor", meshes[k]);
        hp_shard_layout_free(l);
        hp_plan_free(p);
    }
    hp_model_close(m);
}

TEST_MAIN()
