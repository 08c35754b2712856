/*
 * test_overrides.c — plan overrides (spec §7, §11 scenarios 17-24): YAML/JSON parsing, merge / insert / glob,
 * sentinels, derive=false, TP-local attributes, archetypes and preflight, and golden plans with an EP
 * archetype declared.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperpar/overrides.h"
#include "testlib.h"

typedef struct run {
    hp_model *m;
    hp_plan *p;
    hp_err err;
    hp_status st;
} run;

/* Plans path (tiny model) at dp x tp with ep (D-10) under the given YAML overrides. */
static run plan_with(const char *path, const char *yaml, int64_t dp, int64_t tp, int64_t ep, bool derive)
{
    run r = {0};
    hp_overrides *o = NULL;
    r.st = yaml ? hp_overrides_parse(&o, yaml, strlen(yaml), "ov.yaml", &r.err) : HP_OK;
    if (r.st == HP_OK) r.st = hp_model_open(&r.m, path, NULL, &r.err);
    if (r.st == HP_OK) {
        hp_plan_opts po;
        hp_plan_opts_default(&po);
        hp_mesh_from_sizes(&po.mesh, dp, 1, tp, ep, false);
        po.overrides = o;
        po.derive = derive;
        r.st = hp_plan_derive(&r.p, r.m, &po, &r.err);
    }
    hp_overrides_free(o);
    return r;
}

static void run_free(run *r)
{
    hp_plan_free(r->p);
    hp_model_close(r->m);
}

/* Plans with the overrides and expects HP_ERR_INPUT whose message holds needle. */
static void expect_plan_error(const char *path, const char *yaml, int64_t tp, int64_t ep, bool derive,
                              const char *needle)
{
    run r = plan_with(path, yaml, 1, tp, ep, derive);
    CHECK_MSG(r.st == HP_ERR_INPUT, "expected an error containing '%s'", needle);
    CHECK_STR_CONTAINS(r.err.msg, needle);
    run_free(&r);
}

static const char *pl(hp_placement x)
{
    static char buf[8][16];
    static int k;
    return hp_placement_str(x, buf[k++ % 8], 16);
}

static const char *ppl(const hp_plan *p, const char *fqn, const char *rel, hp_axis a)
{
    const hp_boundary *b = p ? hp_plan_find(p, fqn) : NULL;
    if (!b) return "no-boundary";
    for (int i = 0; i < b->n_params; i++)
        if (!strcmp(b->params[i].rel, rel)) return pl(b->params[i].pl.ax[a]);
    return "undeclared";
}

static bool warned(const hp_plan *p, const char *needle)
{
    for (int i = 0; p && i < p->n_warnings; i++)
        if (strstr(p->warnings[i], needle)) return true;
    return false;
}

#define LLAMA "data/configs/llama-3-8b.json"
#define QWEN2MOE "data/golden/qwen2_moe_per_expert_f32"
#define QWEN3MOE "data/golden/qwen3_moe_batched_bf16"

TEST(scenario_18_merge_keeps_internal_fields_and_sentinels)
{
    /* A full declaration on attention keeps needs_cp_attn; "auto" inherits; "none" clears; {} clears params. */
    run r = plan_with(LLAMA,
                      "- match: model.layers.0.self_attn\n"
                      "  params: {q_proj.weight: {tp: shard(0)}, k_proj.weight: {tp: shard(0)},\n"
                      "           v_proj.weight: {tp: shard(0)}, o_proj.weight: {tp: shard(1)}}\n"
                      "  in_src: auto\n"
                      "  out_dst: {tp: replicate}\n"
                      "- match: model.layers.1.self_attn\n"
                      "  in_dst: {hidden_states: {tp: shard(1)}}\n"
                      "- match: model.layers.2.self_attn\n"
                      "  out_src: none\n"
                      "  in_src: none\n"
                      "  in_dst: none\n"
                      "- match: model.layers.3.mlp\n"
                      "  region_dispatch: false\n",
                      1, 2, 1, true);
    CHECK_MSG(r.st == HP_OK, "%s", r.err.msg);
    if (r.p) {
        const hp_boundary *a = hp_plan_find(r.p, "model.layers.0.self_attn");
        CHECK(a && a->needs_cp_attn && a->type == HP_BT_ATTENTION && a->n_params == 4);
        CHECK(a && !strcmp(pl(a->in_src.e[0].pl.ax[HP_AXIS_TP]), "S(1)"));  /* inherited */
        CHECK(a && !strcmp(pl(a->out_dst.e[0].pl.ax[HP_AXIS_TP]), "R"));    /* shorthand -> {output: ...} */
        CHECK(a && !strcmp(a->out_dst.e[0].name, "output"));
        const hp_boundary *b = hp_plan_find(r.p, "model.layers.1.self_attn");
        CHECK(b && !strcmp(pl(b->in_dst.e[0].pl.ax[HP_AXIS_TP]), "S(1)") && b->n_params == 4); /* rest inherited */
        CHECK(b && !strcmp(pl(b->out_src.e[0].pl.ax[HP_AXIS_TP]), "P"));
        const hp_boundary *c = hp_plan_find(r.p, "model.layers.2.self_attn");
        CHECK(c && c->out_src.is_null && c->in_src.n == 0 && c->in_dst.n == 0 && !c->out_dst.is_null);
        CHECK(c && c->n_deferred == 0);
        const hp_boundary *d = hp_plan_find(r.p, "model.layers.3.mlp");
        CHECK(d && d->n_params == 3 && d->region_dispatch == 0);
    }
    run_free(&r);
    /* {} on params strips the derived sharding: the mlp weights are then uncovered. */
    expect_plan_error(LLAMA, "- match: model.layers.3.mlp\n  params: {}\n", 2, 1, true, "coverage check failed");
}

TEST(scenario_18_ep_internal_fields_are_inherited)
{
    run r = plan_with(QWEN2MOE,
                      "- match: model.layers.0.mlp\n  region_dispatch: false\n"
                      "  local_compute_fn: {_target_: qwen2moe_shared_expert_gate}\n",
                      1, 2, 2, true);
    CHECK_MSG(r.st == HP_OK, "%s", r.err.msg);
    if (r.p) {
        const hp_boundary *b = hp_plan_find(r.p, "model.layers.0.mlp");
        CHECK(b && b->ep_size == 2 && b->n_ep_stack == 3 && b->region_dispatch == 0);
        CHECK(b && b->local_compute_fn && !strcmp(b->local_compute_fn, "qwen2moe_shared_expert_gate"));
        CHECK(b && b->injected);
    }
    run_free(&r);
}

TEST(scenario_19_glob_merge_exact_wins_and_warnings)
{
    run r = plan_with(LLAMA,
                      "- match: \"model.layers.*.self_attn\"\n"
                      "  out_dst: {tp: replicate}\n"
                      "- match: model.layers.5.self_attn\n"
                      "  out_dst: {tp: shard(1)}\n"
                      "- match: \"*.nothing_here\"\n"
                      "  region_dispatch: false\n"
                      "- match: model.layers.7.self_attn\n"
                      "  params: {q_proj.weight: {tp: shard(0)}, k_proj.weight: {tp: shard(0)},\n"
                      "           v_proj.weight: {tp: shard(0)}}\n",
                      1, 2, 1, true);
    /* layers.7 lost o_proj.weight's sharding: warned, then uncovered. */
    CHECK(r.st == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(r.err.msg, "model.layers.7.self_attn.o_proj.weight");
    run_free(&r);
    r = plan_with(LLAMA,
                  "- match: \"model.layers.*.self_attn\"\n"
                  "  out_dst: {tp: replicate}\n"
                  "- match: model.layers.5.self_attn\n"
                  "  out_dst: {tp: shard(1)}\n"
                  "- match: \"*.nothing_here\"\n"
                  "  region_dispatch: false\n"
                  "- match: model.layers.7.self_attn\n"
                  "  params: {q_proj.weight: {tp: shard(0)}, k_proj.weight: {tp: shard(0)},\n"
                  "           v_proj.weight: {tp: shard(0)}, o_proj.weight: {tp: shard(1)}}\n",
                  1, 2, 1, true);
    CHECK_MSG(r.st == HP_OK, "%s", r.err.msg);
    if (r.p) {
        for (int l = 0; l < 32; l++) {
            char f[64];
            snprintf(f, sizeof f, "model.layers.%d.self_attn", l);
            const hp_boundary *b = hp_plan_find(r.p, f);
            CHECK(b && !strcmp(pl(b->out_dst.e[0].pl.ax[HP_AXIS_TP]), l == 5 ? "S(1)" : "R"));
        }
        CHECK(warned(r.p, "hit no boundary spec or model module"));
        CHECK(!warned(r.p, "strips the derived sharding")); /* full params: no warning */
    }
    run_free(&r);
    r = plan_with(LLAMA,
                  "- match: model.layers.7.self_attn\n"
                  "  params: {q_proj.weight: {tp: shard(0)}, k_proj.weight: {tp: shard(0)},\n"
                  "           v_proj.weight: {tp: shard(0)}, o_proj.weight: {tp: replicate}}\n"
                  "- match: model.layers.8.self_attn\n"
                  "  params: {q_proj.weight: {tp: shard(0)}}\n",
                  1, 2, 1, true);
    CHECK(r.st == HP_ERR_INPUT); /* layer 8 lost k/v/o */
    run_free(&r);
}

TEST(scenario_19_partial_params_warn_strips)
{
    hp_overrides *o = NULL;
    hp_err err;
    const char *y = "- match: model.layers.7.self_attn\n  params: {q_proj.weight: {tp: shard(0)}}\n";
    CHECK(hp_overrides_parse(&o, y, strlen(y), "ov.yaml", &err) == HP_OK);
    hp_model *m = NULL;
    CHECK(hp_model_open(&m, LLAMA, NULL, &err) == HP_OK);
    hp_plan_opts po;
    hp_plan_opts_default(&po);
    hp_mesh_from_sizes(&po.mesh, 1, 1, 2, 1, false);
    po.overrides = o;
    po.allow_uncovered = true;
    hp_plan *p = NULL;
    CHECK(hp_plan_derive(&p, m, &po, &err) == HP_OK);
    CHECK(warned(p, "strips the derived sharding from 3 parameter(s)"));
    CHECK(warned(p, "o_proj.weight"));
    hp_plan_free(p);
    hp_model_close(m);
    hp_overrides_free(o);
}

TEST(scenario_20_errors)
{
    static const struct {
        const char *yaml, *needle;
    } cases[] = {
        {"- match: model.layers.0.self_attn\n  params: auto2\n", "('auto', 'none')"},
        {"- match: model.layers.0.self_attn.rotary\n  params: {}\n", "named_modules"},
        {"- match: model.layers.0.self_attn.q_proj\n  params: auto\n", "insert"},
        {"- match: model.layers.0.self_attn.q_proj\n  region_dispatch: false\n", "hit no planner-derived boundary"},
        {"- 42\n", "ModuleShardingSpec"},
        {"- match: model.layers.0.self_attn\n  out_dst: {tp2: replicate}\n", "unknown axis 'tp2'"},
        {"- match: model.layers.0.self_attn\n  params: {q_proj.weight: \"shard(0)\"}\n", "Placement"},
        {"- match: model.layers.0.self_attn\n  params: {q_proj.weight: {dp: replicate}}\n",
         "declaring a DP placement is not allowed"},
        {"- match: model.layers.0.self_attn\n  in_src: {hidden_states: {dp: shard(1)}}\n",
         "declaring a DP placement is not allowed"},
        {"- match: model.layers.0.self_attn\n  out_dst: {dp: replicate}\n", "declaring a DP placement is not allowed"},
        {"- match: model.layers.0.self_attn\n  params: {q_proj.weight: {tp: shard(-1)}}\n", "malformed placement"},
        {"- match: model.layers.0.self_attn\n  params: {q_proj.weight: {tp: shardd(0)}}\n", "shard(N)"},
        {"- match: model.layers.0.mlp\n  local_compute_fn: {_target_: nope}\n", "known archetypes: routed_only"},
        {"- match: model.layers.0.mlp\n  local_compute_fn: {_target_: mixtral_topk_router, ep_mesh: 1}\n",
         "framework-reserved context keys"},
        {"- match: model.layers.0.mlp\n  local_compute_fn: {_target_: mixtral_topk_router, speed: 2}\n",
         "undeclared keys"},
        {"- match: model.layers.0.mlp\n  local_compute_fn: {_target_: mixtral_topk_router, capacity_factor: -1}\n",
         "capacity_factor"},
        {"- match: model.layers.0.mlp\n  colour: red\n", "unknown key 'colour'"},
        {"- when: ep\n", "needs match"},
        {"- match: x\n  when: sometimes\n", "when must be one of"},
        {"- match: [a\n", "invalid YAML"},
        {"- &a {match: x}\n- *a\n", "aliases"},
        {"{plan_overrides: 3}\n", "must be a list"},
        {"- match: model.layers.0.mlp\n  tp_divide_attrs: [9lives]\n", "not an identifier"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        run r = plan_with(LLAMA, cases[i].yaml, 1, 2, 1, true);
        CHECK_MSG(r.st == HP_ERR_INPUT, "case %zu", i);
        CHECK_STR_CONTAINS(r.err.msg, cases[i].needle);
        run_free(&r);
    }
    /* Parse errors carry file:line:col. */
    run r = plan_with(LLAMA, "- match: model.layers.0.self_attn\n  params:\n    q_proj.weight: {tp: shard(x)}\n", 1, 2,
                      1, true);
    CHECK_STR_CONTAINS(r.err.msg, "ov.yaml:3:");
    run_free(&r);
    /* The ep axis is accepted even when ep is not a mesh dim. */
    r = plan_with(QWEN3MOE,
                  "- match: model.layers.0.mlp\n  params: {gate.weight: {tp: replicate},"
                  " experts.gate_up_proj: {ep: shard(0)}, experts.down_proj: {ep: shard(0)}}\n"
                  "  region_dispatch: false\n  local_compute_fn: {_target_: qwen3moe_topk_router}\n",
                  1, 2, 2, true);
    CHECK_MSG(r.st == HP_OK, "%s", r.err.msg);
    run_free(&r);
}

TEST(scenario_21_derive_false)
{
    const char *y = "- match: model.layers.0.self_attn\n"
                    "  params: {q_proj.weight: {tp: shard(0)}, o_proj.weight: {tp: shard(1)}}\n"
                    "  in_src: {hidden_states: {tp: replicate}}\n"
                    "  in_dst: {hidden_states: {tp: replicate}}\n"
                    "  out_src: {tp: partial}\n"
                    "  out_dst: {tp: replicate}\n";
    run r = plan_with(LLAMA, y, 1, 2, 1, false);
    CHECK_MSG(r.st == HP_OK, "%s", r.err.msg);
    if (r.p) {
        CHECK_EQ_INT(r.p->n_boundaries, 1);
        CHECK_STR_EQ(r.p->boundaries[0].fqn, "model.layers.0.self_attn");
        CHECK(r.p->boundaries[0].type == HP_BT_CUSTOM && r.p->boundaries[0].terminal);
        CHECK_STR_EQ(ppl(r.p, "model.layers.0.self_attn", "o_proj.weight", HP_AXIS_TP), "S(1)");
    }
    run_free(&r);
    expect_plan_error(LLAMA, "- match: model.layers.0.self_attn\n  region_dispatch: false\n", 2, 1, false,
                      "hit no planner-derived boundary");
    expect_plan_error(LLAMA, "- match: model.layers.0.self_attn\n  params: auto\n", 2, 1, false, "derive=False");
    expect_plan_error(LLAMA, "- match: \"*.self_attn\"\n  region_dispatch: false\n", 2, 1, false, "derive=False");
}

TEST(scenario_22_tp_local_attributes)
{
    run r = plan_with(LLAMA, "- match: model.layers.0.self_attn\n  tp_divide_attrs: [hidden_size]\n", 1, 2, 1, true);
    CHECK_MSG(r.st == HP_OK, "%s", r.err.msg);
    if (r.p) {
        const hp_boundary *b = hp_plan_find(r.p, "model.layers.0.self_attn");
        CHECK(b && b->n_tp_attrs == 3);
        if (b && b->n_tp_attrs == 3) {
            CHECK_STR_EQ(b->tp_attrs[0].name, "num_attention_heads"); /* auto */
            CHECK(!b->tp_attrs[0].user);
            CHECK_STR_EQ(b->tp_attrs[2].name, "hidden_size");
            CHECK(b->tp_attrs[2].user && b->tp_attrs[2].global == 4096 && b->tp_attrs[2].local == 2048);
        }
    }
    run_free(&r);
    expect_plan_error(LLAMA, "- match: model.layers.0.self_attn\n  tp_divide_attrs: [num_attention_heads]\n", 2, 1,
                      true, "D-17");
    expect_plan_error(LLAMA, "- match: model.layers.0.self_attn\n  tp_divide_attrs: [num_wheels]\n", 2, 1, true,
                      "plain int");
    expect_plan_error(LLAMA, "- match: model.layers.0.mlp\n  tp_divide_attrs: [head_dim]\n", 2, 1, true,
                      "tp_divide_attrs");
    /* Same match: later tp_divide_attrs: [] replaces the earlier list. */
    r = plan_with(LLAMA,
                  "- match: model.layers.0.mlp\n  tp_divide_attrs: [intermediate_size]\n"
                  "- match: model.layers.0.mlp\n  tp_divide_attrs: []\n",
                  1, 2, 1, true);
    CHECK_MSG(r.st == HP_OK, "%s", r.err.msg);
    if (r.p) CHECK_EQ_INT(hp_plan_find(r.p, "model.layers.0.mlp")->n_tp_attrs, 0);
    run_free(&r);
    r = plan_with(LLAMA, "- match: model.layers.0.mlp\n  tp_divide_attrs: [num_key_value_heads]\n", 1, 16, 1, true);
    CHECK(r.st == HP_ERR_INPUT); /* 8 kv heads, tp 16: the compatibility check refuses first */
    run_free(&r);
}

TEST(scenario_23_region_dispatch_and_ep_mesh)
{
    /* D-10 clears region_dispatch (None) for per-expert and batched layouts; ep=1 keeps the template's false. */
    run r = plan_with(QWEN2MOE, NULL, 1, 2, 2, true);
    if (r.p) CHECK_EQ_INT(hp_plan_find(r.p, "model.layers.0.mlp")->region_dispatch, -1);
    run_free(&r);
    r = plan_with(QWEN3MOE, NULL, 1, 2, 2, true);
    if (r.p) CHECK_EQ_INT(hp_plan_find(r.p, "model.layers.0.mlp")->region_dispatch, -1);
    run_free(&r);
    r = plan_with(QWEN2MOE, NULL, 1, 2, 1, true);
    if (r.p) CHECK_EQ_INT(hp_plan_find(r.p, "model.layers.0.mlp")->region_dispatch, 0);
    run_free(&r);
    /* The expert mesh is the framework's to pass: configuring it in local_compute_fn is refused. */
    expect_plan_error(QWEN2MOE,
                      "- match: \"*.mlp\"\n  local_compute_fn: {_target_: qwen2moe_shared_expert_gate, ep_mesh: x}\n", 2,
                      2, true, "ep_mesh");
}

TEST(scenario_24_preflight)
{
    run r = plan_with(QWEN2MOE, NULL, 1, 2, 2, true);
    CHECK(r.st == HP_OK);
    hp_err err;
    if (r.p) {
        CHECK(hp_plan_preflight(r.p, NULL, &err) == HP_ERR_INPUT);
        CHECK_STR_CONTAINS(err.msg, "recipes.qwen2moe_ep_compute_fn");
        CHECK_STR_CONTAINS(err.msg, "region_dispatch");
        CHECK_STR_CONTAINS(err.msg, "_target_: qwen2moe_shared_expert_gate");
        hp_buf b;
        hp_buf_init(&b);
        CHECK(hp_plan_suggest_overrides(r.p, &b, &err) == HP_OK);
        CHECK_STR_CONTAINS(b.data, "- match: \"model.layers.*.mlp\"");
        /* The suggestion, applied, passes preflight. */
        run s = plan_with(QWEN2MOE, b.data, 1, 2, 2, true);
        CHECK_MSG(s.st == HP_OK, "%s", s.err.msg);
        if (s.p) CHECK(hp_plan_preflight(s.p, NULL, &err) == HP_OK);
        run_free(&s);
        hp_buf_free(&b);
    }
    run_free(&r);
    r = plan_with(QWEN2MOE, "- match: \"*.mlp\"\n  local_compute_fn: {_target_: qwen2moe_shared_expert_gate}\n", 1, 2, 2,
                  true);
    CHECK(r.st == HP_OK);
    if (r.p) {
        CHECK(hp_plan_preflight(r.p, NULL, &err) == HP_ERR_INPUT);
        CHECK_STR_CONTAINS(err.msg, "without region_dispatch");
    }
    run_free(&r);
    r = plan_with(LLAMA, "- match: model.layers.0.mlp\n  region_dispatch: true\n", 1, 2, 1, true);
    CHECK(r.st == HP_OK);
    if (r.p) {
        CHECK(hp_plan_preflight(r.p, NULL, &err) == HP_ERR_INPUT);
        CHECK_STR_CONTAINS(err.msg, "redundant");
    }
    run_free(&r);
    /* DeepSeek: the glob would also hit the dense layer-0 mlp, so the suggestion names layers exactly. */
    r = plan_with("data/golden/deepseek_v3_per_expert_f32", NULL, 1, 2, 2, true);
    if (r.p) {
        hp_buf b;
        hp_buf_init(&b);
        CHECK(hp_plan_suggest_overrides(r.p, &b, &err) == HP_OK);
        CHECK_STR_CONTAINS(b.data, "- match: \"model.layers.1.mlp\"");
        CHECK_STR_CONTAINS(b.data, "deepseekv3_sigmoid_group_shared");
        CHECK(strstr(b.data, "layers.*") == NULL);
        hp_buf_free(&b);
    }
    run_free(&r);
}

/* The refusal names the command that executes the plan and each family's own recipe, never another's. */
TEST(preflight_names_command_and_family_recipe)
{
    static const struct { const char *model, *cmd, *recipe, *other; } cases[] = {
        {"data/golden/mixtral_per_expert_f32", "run", "recipes.mixtral_ep_compute_fn", "qwen2moe_ep_compute_fn"},
        {QWEN3MOE, "moe", "qwen3moe_ep_compute_fn", "qwen2moe_ep_compute_fn"},
        {"data/golden/deepseek_v3_per_expert_f32", "run", "recipes.deepseekv3_ep_compute_fn", "qwen2moe_ep_compute_fn"},
        {QWEN2MOE, NULL, "recipes.qwen2moe_ep_compute_fn", "mixtral_ep_compute_fn"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        run r = plan_with(cases[i].model, NULL, 1, 2, 2, true);
        CHECK_MSG(r.st == HP_OK, "%s: %s", cases[i].model, r.err.msg);
        hp_err err;
        if (r.p) {
            CHECK(hp_plan_preflight(r.p, cases[i].cmd, &err) == HP_ERR_INPUT);
            char want[64];
            snprintf(want, sizeof want, "pass it with: hyperpar %s ... --overrides FILE", cases[i].cmd ? cases[i].cmd : "plan");
            CHECK_STR_CONTAINS(err.msg, want);
            snprintf(want, sizeof want, "# Review, then pass with: hyperpar %s ...", cases[i].cmd ? cases[i].cmd : "plan");
            CHECK_STR_CONTAINS(err.msg, want);
            CHECK_STR_CONTAINS(err.msg, cases[i].recipe);
            CHECK_MSG(strstr(err.msg, cases[i].other) == NULL, "%s: %s", cases[i].model, err.msg);
        }
        run_free(&r);
    }
}

TEST(archetypes_interface_assertion_and_factory_paths)
{
    CHECK_EQ_INT(hp_archetype_count(), 6);
    CHECK_STR_EQ(hp_archetype_resolve("qwen2moe_shared_expert_gate"), "qwen2moe_shared_expert_gate");
    CHECK_STR_EQ(hp_archetype_resolve("hyper_parallel.distributed.expert_parallel.recipes.qwen2moe_ep_compute_fn"),
                 "qwen2moe_shared_expert_gate");
    CHECK_STR_EQ(hp_archetype_resolve("recipes.deepseekv3_ep_compute_fn"), "deepseekv3_sigmoid_group_shared");
    CHECK_STR_EQ(hp_archetype_resolve("qwen3moe_ep_compute_fn"), "qwen3moe_topk_router");
    CHECK(hp_archetype_resolve("ep_compute_fn") == NULL);
    CHECK(hp_archetype_resolve("bogus") == NULL);
    /* qwen2moe's archetype on a Qwen3-MoE block: the block has no shared expert. */
    run r = plan_with(QWEN3MOE,
                      "- match: \"*.mlp\"\n  region_dispatch: false\n"
                      "  local_compute_fn: {_target_: recipes.qwen2moe_ep_compute_fn}\n",
                      1, 2, 2, true);
    CHECK(r.st == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(r.err.msg, "missing submodule(s) shared_expert, shared_expert_gate");
    CHECK_STR_CONTAINS(r.err.msg, "the module has: gate, experts");
    CHECK_STR_CONTAINS(r.err.msg, "suggested: qwen3moe_topk_router");
    run_free(&r);
    /* when: ep entries are skipped without ep. */
    r = plan_with(QWEN3MOE,
                  "- match: \"*.mlp\"\n  when: ep\n  region_dispatch: false\n"
                  "  local_compute_fn: {_target_: recipes.qwen2moe_ep_compute_fn}\n",
                  1, 2, 1, true);
    CHECK(r.st == HP_ERR_INPUT); /* tp only: fused batched gate_up guard, not the override */
    CHECK_STR_CONTAINS(r.err.msg, "fused gate/up");
    run_free(&r);
    /* JSON works too, and a mapping with plan_overrides. */
    r = plan_with(QWEN3MOE,
                  "{\"plan_overrides\": [{\"match\": \"*.mlp\", \"region_dispatch\": false, \"local_compute_fn\": "
                  "{\"_target_\": \"qwen3moe_topk_router\", \"use_grouped_gemm\": true, \"capacity_factor\": 1.25}}]}",
                  1, 2, 2, true);
    CHECK_MSG(r.st == HP_OK, "%s", r.err.msg);
    if (r.p) {
        const hp_boundary *b = hp_plan_find(r.p, "model.layers.1.mlp");
        CHECK(b && b->compute.has_use_grouped_gemm && b->compute.use_grouped_gemm && b->compute.capacity_factor == 1.25);
    }
    run_free(&r);
}

TEST(scenario_17_nested_boundaries)
{
    /* An outer insert may own params nothing else declares, but not a nested boundary's. */
    expect_plan_error(LLAMA,
                      "- match: model.layers.0\n  params: {self_attn.q_proj.weight: {tp: shard(0)}}\n"
                      "  in_src: {hidden_states: {tp: replicate}}\n  in_dst: {hidden_states: {tp: replicate}}\n",
                      2, 1, true, "exactly one boundary");
    expect_plan_error(LLAMA,
                      "- match: model.layers.0.self_attn.q_proj\n  params: {weight: {tp: shard(0)}}\n"
                      "  in_src: {hidden_states: {tp: replicate}}\n  in_dst: {hidden_states: {tp: replicate}}\n",
                      2, 1, true, "exactly one boundary");
    expect_plan_error(LLAMA, "- match: model.layers.0\n  params: {}\n  in_dst: {hidden_states: {tp: replicate}}\n", 2,
                      1, true, "in_src");
    /* Outer nested boundary with params {} is fine; only lm_head is terminal; root "" is allowed. */
    run r = plan_with(LLAMA,
                  "- match: model.layers.0\n  params: {}\n  in_src: {hidden_states: {tp: shard(1)}}\n"
                  "  in_dst: {hidden_states: {tp: shard(1)}}\n"
                  "- match: \"\"\n  params: {}\n  in_src: {input: {tp: replicate}}\n  in_dst: {input: {tp: replicate}}\n",
                  1, 2, 1, true);
    CHECK_MSG(r.st == HP_OK, "%s", r.err.msg);
    if (r.p) {
        const hp_boundary *o = hp_plan_find(r.p, "model.layers.0");
        CHECK(o && !o->terminal && o->n_params == 0);
        CHECK(hp_plan_find(r.p, "") && !hp_plan_find(r.p, "")->terminal);
        CHECK(hp_plan_find(r.p, "lm_head")->terminal);
        CHECK_STR_EQ(r.p->boundaries[0].fqn, ""); /* registration order: the root first */
    }
    run_free(&r);
}

/* Golden plans with an EP archetype declared (regenerate on purpose with HP_REGEN_GOLDEN=1). */
TEST(golden_plans_with_ep_archetype)
{
    static const struct {
        const char *model, *overrides, *golden;
    } cases[] = {
        {"data/golden/qwen3_moe_batched_bf16", "data/overrides/qwen3_moe_ep.yaml", "data/plans/qwen3_moe_tp2_ep2.json"},
        {"data/golden/deepseek_v3_per_expert_f32", "data/overrides/deepseek_v3_ep.yaml",
         "data/plans/deepseek_v3_tp2_ep2.json"},
        {"data/golden/mixtral_per_expert_f32", "data/overrides/mixtral_ep.yaml", "data/plans/mixtral_tp2_ep2.json"},
    };
    bool regen = getenv("HP_REGEN_GOLDEN") != NULL;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        hp_err err;
        hp_overrides *o = NULL;
        hp_model *m = NULL;
        hp_plan *p = NULL;
        CHECK_MSG(hp_overrides_load(&o, cases[i].overrides, &err) == HP_OK, "%s", err.msg);
        CHECK(hp_model_open(&m, cases[i].model, NULL, &err) == HP_OK);
        hp_plan_opts po;
        hp_plan_opts_default(&po);
        hp_mesh_from_sizes(&po.mesh, 1, 1, 2, 2, false);
        po.overrides = o;
        if (m) CHECK_MSG(hp_plan_derive(&p, m, &po, &err) == HP_OK, "%s", err.msg);
        if (p) {
            CHECK_MSG(hp_plan_preflight(p, NULL, &err) == HP_OK, "%s: %s", cases[i].model, err.msg);
            hp_buf j, e;
            hp_buf_init(&j);
            hp_buf_init(&e);
            CHECK(hp_plan_to_json(p, &j, &err) == HP_OK);
            CHECK(hp_plan_explain(p, NULL, &e, &err) == HP_OK);
            CHECK_STR_CONTAINS(e.data, "injection: local_compute_fn=");
            CHECK_STR_CONTAINS(j.data, "\"_target_\"");
            if (regen) {
                FILE *f = fopen(cases[i].golden, "wb");
                CHECK(f != NULL);
                if (f) {
                    fwrite(j.data, 1, j.len, f);
                    fclose(f);
                }
            }
            FILE *f = fopen(cases[i].golden, "rb");
            CHECK_MSG(f != NULL, "%s missing (run with HP_REGEN_GOLDEN=1 once)", cases[i].golden);
            if (f) {
                char *want = calloc(1, j.len + 2);
                size_t got = fread(want, 1, j.len + 1, f);
                fclose(f);
                CHECK_MSG(got == j.len && memcmp(want, j.data, j.len) == 0, "%s differs from the golden plan",
                          cases[i].golden);
                free(want);
            }
            hp_buf_free(&j);
            hp_buf_free(&e);
        }
        hp_plan_free(p);
        hp_model_close(m);
        hp_overrides_free(o);
    }
}

TEST_MAIN()
