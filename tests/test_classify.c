/*
 * test_classify.c — planner phases 1-3 (spec §3-§5) and Phase 6 handler names (§8.4): parameter roles,
 * family rules, grouping into boundaries, boundary type inference. Tests are named after the acceptance
 * scenarios of spec §11 (items 1-4, 10, 11). Grouping runs on real models: the golden checkpoints under
 * data/golden, meta-mode configs under data/configs, and tiny synthetic safetensors files written here.
 */
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "hyperpar/plan.h"
#include "plan/planner.h"
#include "testlib.h"

/* ---- helpers ---- */

/* A model with its roles and groups, all owned here. */
typedef struct grouped {
    hp_model *m;
    hp_role *roles;
    hp_arena arena;
    hp__group *g;
    size_t n;
} grouped;

static void grouped_free(grouped *x)
{
    hp_model_close(x->m);
    free(x->roles);
    hp_arena_free(&x->arena);
    memset(x, 0, sizeof *x);
}

/* Classifies every parameter of an opened model (family rules by arch, then model_type) and groups them. */
static bool group_model(grouped *x, hp_model *m)
{
    memset(x, 0, sizeof *x);
    hp_arena_init(&x->arena);
    x->m = m;
    x->roles = malloc((m->n_params ? m->n_params : 1) * sizeof *x->roles);
    if (!x->roles) return false;
    for (size_t i = 0; i < m->n_params; i++) x->roles[i] = hp__classify(m->params[i].name, m->arch, m->model_type);
    hp_err err;
    hp_status st = hp__group_params(m, x->roles, NULL, &x->arena, &x->g, &x->n, &err);
    CHECK_MSG(st == HP_OK, "%s", err.msg);
    if (st != HP_OK) return false;
    /* The same groups with phase 3 kept per name template (as hp_plan_derive groups). */
    hp__memo *memo = hp__memo_create(m);
    hp__group *g = NULL;
    size_t n = 0;
    CHECK(memo != NULL);
    st = hp__group_params(m, x->roles, memo, &x->arena, &g, &n, &err);
    hp__memo_destroy(memo);
    CHECK_MSG(st == HP_OK, "%s", err.msg);
    CHECK_EQ_INT(n, x->n);
    for (size_t k = 0; st == HP_OK && k < n && k < x->n; k++) {
        CHECK_STR_EQ(g[k].fqn, x->g[k].fqn);
        CHECK(g[k].n == x->g[k].n && !memcmp(g[k].params, x->g[k].params, (size_t)g[k].n * sizeof *g[k].params));
    }
    return st == HP_OK;
}

static bool open_and_group(grouped *x, const char *path)
{
    hp_model *m = NULL;
    hp_err err;
    hp_status st = hp_model_open(&m, path, NULL, &err);
    CHECK_MSG(st == HP_OK, "%s: %s", path, err.msg);
    if (st != HP_OK) {
        memset(x, 0, sizeof *x);
        return false;
    }
    return group_model(x, m);
}

static const hp__group *find_group(const grouped *x, const char *fqn)
{
    for (size_t i = 0; i < x->n; i++)
        if (strcmp(x->g[i].fqn, fqn) == 0) return &x->g[i];
    return NULL;
}

/* Boundary type of a group, inferred from its parameters' roles. */
static hp_btype group_type(const grouped *x, const hp__group *g)
{
    hp_role *r = malloc((size_t)(g->n ? g->n : 1) * sizeof *r);
    if (!r) return HP_BT_COUNT;
    for (int i = 0; i < g->n; i++) r[i] = x->roles[g->params[i]];
    hp_btype t = hp__infer_type(g->fqn, r, g->n);
    free(r);
    return t;
}

/* Role of the parameter at fqn + "." + rel inside group g, or HP_ROLE_COUNT when g does not hold it. */
static hp_role role_in_group(const grouped *x, const hp__group *g, const char *rel)
{
    char full[512];
    snprintf(full, sizeof full, "%s%s%s", g->fqn, *g->fqn ? "." : "", rel);
    for (int i = 0; i < g->n; i++)
        if (strcmp(x->m->params[g->params[i]].name, full) == 0) return x->roles[g->params[i]];
    return HP_ROLE_COUNT;
}

/* Asserts group fqn exists with n params and type t. */
#define CHECK_GROUP(x, fqn, n_params, t)                                                           \
    do {                                                                                           \
        const hp__group *cg__ = find_group((x), (fqn));                                            \
        CHECK_MSG(cg__ != NULL, "no group '%s'", (fqn));                                           \
        if (cg__) {                                                                                \
            CHECK_EQ_INT(cg__->n, (n_params));                                                     \
            CHECK_STR_EQ(hp_btype_name(group_type((x), cg__)), hp_btype_name(t));                  \
        }                                                                                          \
    } while (0)

/* Invariants every grouping must keep: each non-excluded parameter in exactly one group, parameters in
 * increasing order inside a group, groups ordered by their first parameter, group FQN a module prefix. */
static void check_partition(const grouped *x, bool allow_excluded)
{
    size_t np = x->m->n_params;
    int *seen = calloc(np ? np : 1, sizeof *seen);
    if (!seen) return;
    int prev_first = -1;
    for (size_t k = 0; k < x->n; k++) {
        const hp__group *g = &x->g[k];
        CHECK(g->n > 0);
        CHECK_MSG(g->params[0] > prev_first, "group '%s' out of order", g->fqn);
        prev_first = g->params[0];
        size_t lf = strlen(g->fqn);
        for (int i = 0; i < g->n; i++) {
            int p = g->params[i];
            CHECK(p >= 0 && (size_t)p < np);
            if (p < 0 || (size_t)p >= np) continue;
            if (i > 0) CHECK(p > g->params[i - 1]);
            seen[p]++;
            const char *name = x->m->params[p].name;
            CHECK_MSG(lf == 0 || (strncmp(name, g->fqn, lf) == 0 && name[lf] == '.'), "%s not under %s", name,
                      g->fqn);
        }
    }
    for (size_t i = 0; i < np; i++)
        if (!allow_excluded || x->roles[i] != HP_ROLE_COUNT)
            CHECK_MSG(seen[i] == 1, "%s is in %d groups", x->m->params[i].name, seen[i]);
    free(seen);
}

/* Writes a tiny safetensors checkpoint (every tensor F32 [2]) with an optional config.json into a fresh
 * scratch folder (testlib.h); returns the folder (static buffer) or NULL. */
static const char *write_tiny(const char *const *names, size_t n, const char *config_json)
{
    static char dir[200];
    if (!test_tmpdir(dir, sizeof dir)) return NULL;
    static const float data[2] = {1.0f, 2.0f};
    int64_t shape[1] = {2};
    hp_st_writer *w = hp_st_writer_create();
    hp_err err;
    bool ok = w != NULL;
    for (size_t i = 0; ok && i < n; i++) ok = hp_st_writer_add(w, names[i], HP_DT_F32, 1, shape, data, &err) == HP_OK;
    char path[256];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (ok) ok = hp_st_writer_write(w, path, &err) == HP_OK;
    hp_st_writer_destroy(w);
    if (ok && config_json) {
        snprintf(path, sizeof path, "%s/config.json", dir);
        FILE *f = fopen(path, "w");
        ok = f && fputs(config_json, f) >= 0;
        if (f) ok = fclose(f) == 0 && ok;
    }
    CHECK(ok);
    return ok ? dir : NULL;
}

static void remove_tiny(const char *dir) { CHECK(test_rm_rf(dir)); }

/* Builds and groups a synthetic model from a name list. */
static bool tiny_grouped(grouped *x, const char *const *names, size_t n, const char *config_json)
{
    memset(x, 0, sizeof *x);
    const char *dir = write_tiny(names, n, config_json);
    if (!dir) return false;
    char copy[200];
    snprintf(copy, sizeof copy, "%s", dir);
    bool ok = open_and_group(x, copy);
    remove_tiny(copy);
    return ok;
}

#define N_OF(a) (sizeof(a) / sizeof *(a))

/* ---- §11 item 1: default roles ---- */

TEST(scenario_01_default_roles)
{
    static const struct {
        const char *fqn;
        hp_role role;
    } cases[] = {
        {"model.embed_tokens.weight", HP_ROLE_EMBED},
        {"lm_head.weight", HP_ROLE_LM_HEAD},
        {"model.layers.0.self_attn.q_proj.weight", HP_ROLE_COLWISE},
        {"model.layers.0.self_attn.o_proj.weight", HP_ROLE_ROWWISE},
        {"model.layers.0.input_layernorm.weight", HP_ROLE_NORM},
        {"model.layers.0.mlp.gate.weight", HP_ROLE_MOE_GATE},
        {"model.layers.0.mlp.experts.w1", HP_ROLE_MOE_EXPERT},
        {"model.layers.0.mlp.shared_experts.w2", HP_ROLE_SHARED_EXPERT},
        {"model.layers.0.attn.fused_qkv.weight", HP_ROLE_FUSED_QKV},
        {"model.layers.0.mlp.gate_up_proj.weight", HP_ROLE_FUSED_GATE_UP},
        {"model.layers.0.gated_delta.a_log", HP_ROLE_SPECIAL},
        {"model.rotary_emb.inv_freq", HP_ROLE_SKIP},
        {"model.linear.weight", HP_ROLE_SKIP},
        {"model.kernel.weight", HP_ROLE_SKIP},
        {"transformer.h.0.ln_1.weight", HP_ROLE_NORM},
        {"model.layers.0.mlp.experts.0.gate_proj.weight", HP_ROLE_MOE_EXPERT},
        {"model.layers.0.self_attn.q_proj.bias", HP_ROLE_COLWISE}, /* D-19: rule 10 precedes rule 11 */
        {"model.layers.0.self_attn.o_proj.bias", HP_ROLE_BIAS},
        /* Further consequences listed in §3.4. */
        {"model.layers.0.mlp.gate_proj.weight", HP_ROLE_COLWISE},
        {"model.layers.0.mlp.shared_expert_gate.weight", HP_ROLE_SKIP}, /* segment-exact rule 3 */
        {"model.layers.0.mlp.shared_expert.down_proj.weight", HP_ROLE_SHARED_EXPERT},
        {"model.layers.0.mlp.down_proj.bias", HP_ROLE_BIAS},
        {"lm_head.bias", HP_ROLE_BIAS},
        {"model.layers.0.mlp.router.weight", HP_ROLE_MOE_GATE},
        {"model.layers.0.block.moe_gate_w.weight", HP_ROLE_MOE_GATE}, /* moe_gate inside a segment */
        {"transformer.wte.weight", HP_ROLE_EMBED},
        {"gpt_neox.embed_out.weight", HP_ROLE_LM_HEAD},
        {"transformer.h.0.attn.qkv_proj.weight", HP_ROLE_FUSED_QKV},
        {"model.layers.0.feed_forward.w13.weight", HP_ROLE_FUSED_GATE_UP},
        {"model.layers.0.feed_forward.w1.weight", HP_ROLE_COLWISE},
        {"model.layers.0.feed_forward.w3.weight", HP_ROLE_COLWISE},
        {"model.layers.0.feed_forward.w2.weight", HP_ROLE_ROWWISE},
        {"model.layers.0.linear_attn.dt_bias", HP_ROLE_SPECIAL},
        {"model.layers.0.self_attn.q_a_proj.weight", HP_ROLE_SKIP}, /* MLA without family rules */
        {"model.layers.0.self_attn.kv_b_proj.weight", HP_ROLE_SKIP},
        {"Model.Embed_Tokens.Weight", HP_ROLE_EMBED},                /* the FQN is lower-cased */
        {"model.layers.0.linear_attn.A_log", HP_ROLE_SPECIAL},
        {"model.layers.0.custom.bias", HP_ROLE_BIAS},
        {"model.layers.0.mlp.w1", HP_ROLE_SKIP}, /* ".w1." needs the trailing dot (raw substring) */
        {"x.y_k_proj_z.weight", HP_ROLE_COLWISE}, /* segment substring */
        {"", HP_ROLE_SKIP},
    };
    for (size_t i = 0; i < N_OF(cases); i++) {
        hp_role r = hp__classify(cases[i].fqn, "llama", "llama");
        CHECK_MSG(r == cases[i].role, "%s: %s, expected %s", cases[i].fqn, hp_role_name(r),
                  hp_role_name(cases[i].role));
        /* No family given at all: the same defaults. */
        CHECK(hp__classify(cases[i].fqn, NULL, NULL) == cases[i].role);
        CHECK(hp__classify(cases[i].fqn, "", "") == cases[i].role);
    }
    /* The enum has 14 roles, named as in §3.2. */
    CHECK_EQ_INT(HP_ROLE_COUNT, 14);
    static const char *names[] = {"COLWISE", "ROWWISE",   "NORM",          "EMBED", "LM_HEAD",
                                  "MOE_GATE", "MOE_EXPERT", "SHARED_EXPERT", "FUSED_QKV", "FUSED_GATE_UP",
                                  "BIAS",     "REPLICATED", "SPECIAL",       "SKIP"};
    for (int r = 0; r < HP_ROLE_COUNT; r++) CHECK_STR_EQ(hp_role_name((hp_role)r), names[r]);
    CHECK_STR_EQ(hp_role_name(HP_ROLE_COUNT), "?");
    /* REPLICATED is never produced by the default rules. */
    CHECK(hp__classify("model.layers.0.mlp.shared_expert_gate.weight", NULL, NULL) != HP_ROLE_REPLICATED);
}

/* ---- §11 item 2: architecture overrides ---- */

TEST(scenario_02_arch_overrides)
{
    const char *q_b = "model.layers.0.self_attn.q_b_proj.weight";
    /* Override beats default: SKIP by default, COLWISE under the DeepSeek family. */
    CHECK(hp__classify(q_b, "llama", "llama") == HP_ROLE_SKIP);
    CHECK(hp__classify(q_b, "deepseekv3", "deepseek_v3") == HP_ROLE_COLWISE);
    /* A pattern list: every pattern of the entry applies. */
    CHECK(hp__classify("model.layers.0.self_attn.q_a_proj.weight", "deepseekv3", NULL) == HP_ROLE_REPLICATED);
    CHECK(hp__classify("model.layers.0.self_attn.kv_a_proj_with_mqa.weight", "deepseekv3", NULL) ==
          HP_ROLE_REPLICATED);
    /* Miss -> default rules. */
    CHECK(hp__classify("model.layers.0.self_attn.o_proj.weight", "deepseekv3", NULL) == HP_ROLE_ROWWISE);
    CHECK(hp__classify("model.layers.0.self_attn.q_a_layernorm.weight", "deepseekv3", NULL) == HP_ROLE_NORM);
    CHECK(hp__classify("model.embed_tokens.weight", "deepseekv3", NULL) == HP_ROLE_EMBED);
    /* Another family's rules are ignored. */
    CHECK(hp__classify("model.layers.0.mlp.shared_expert_gate.weight", "deepseekv3", NULL) == HP_ROLE_SKIP);
    CHECK(hp__classify(q_b, "qwen2moe", "qwen2_moe") == HP_ROLE_SKIP);
    CHECK(hp__classify("model.vision_tower.blocks.0.attn.qkv.weight", "deepseekv3", NULL) == HP_ROLE_SKIP);
    /* Family rules are legacy raw substrings: they fire over the whole FQN and before the defaults. */
    CHECK(hp__classify("model.layers.0.mlp.shared_expert_gate.weight", "qwen2moe", NULL) == HP_ROLE_REPLICATED);
    /* Kimi: MLA rules plus the vision tower and projector replicated, ahead of the default rules. */
    CHECK(hp__classify("vision_tower.blocks.0.norm1.weight", "kimi_k25", NULL) == HP_ROLE_REPLICATED);
    CHECK(hp__classify("mm_projector.linear_1.weight", "kimi_k26", NULL) == HP_ROLE_REPLICATED);
    CHECK(hp__classify("language_model.model.layers.0.self_attn.kv_b_proj.weight", "kimi_k25", NULL) ==
          HP_ROLE_COLWISE);
    CHECK(hp__classify("language_model.model.layers.0.self_attn.q_a_proj.weight", "kimi_k26", NULL) ==
          HP_ROLE_REPLICATED);
    CHECK(hp__classify("vision_tower_x.weight", "kimi_k25", NULL) == HP_ROLE_SKIP); /* needs the dot */
    /* Lookup: arch first, then model_type. */
    CHECK(hp__classify(q_b, "", "deepseek_v3") == HP_ROLE_COLWISE);
    CHECK(hp__classify(q_b, NULL, "deepseek_v2") == HP_ROLE_COLWISE);
    CHECK(hp__classify(q_b, "somethingelse", "deepseek_v3") == HP_ROLE_COLWISE);
    CHECK(hp__classify("model.layers.0.mlp.shared_expert_gate.weight", "qwen2moe", "deepseek_v3") ==
          HP_ROLE_REPLICATED);
}

/* ---- §11 item 3: architecture names (§3.1) ---- */

TEST(scenario_03_architecture_names)
{
    char buf[64];
    CHECK_STR_EQ(hp_arch_canonical("Qwen2ForCausalLM", "qwen2", buf, sizeof buf), "qwen2");
    CHECK_STR_EQ(hp_arch_canonical("Blip2ForConditionalGeneration", NULL, buf, sizeof buf), "blip2");
    CHECK_STR_EQ(hp_arch_canonical("PaliGemmaForImageTextToText", NULL, buf, sizeof buf), "paligemma");
    CHECK_STR_EQ(hp_arch_canonical("LlamaForSequenceClassification", NULL, buf, sizeof buf), "llama");
    CHECK_STR_EQ(hp_arch_canonical("DeepseekV3ForCausalLM", "deepseek_v3", buf, sizeof buf), "deepseekv3");
    /* No architectures: the model_type (or the class name) is used, lower-cased. */
    CHECK_STR_EQ(hp_arch_canonical("", "Tiny", buf, sizeof buf), "tiny");
    CHECK_STR_EQ(hp_arch_canonical(NULL, "deepseek_v3", buf, sizeof buf), "deepseek_v3");
    /* The canonical name selects the family rules. */
    CHECK(hp__classify("model.layers.0.self_attn.kv_b_proj.weight",
                       hp_arch_canonical("DeepseekV2ForCausalLM", NULL, buf, sizeof buf), NULL) == HP_ROLE_COLWISE);
    CHECK(hp__classify("model.layers.0.mlp.shared_expert_gate.weight",
                       hp_arch_canonical("Qwen2MoeForCausalLM", NULL, buf, sizeof buf), NULL) == HP_ROLE_REPLICATED);
}

/* ---- §11 item 4: grouping (§4) ---- */

static const char *const g_tiny_llama[] = {
    "model.embed_tokens.weight",
    "model.layers.0.input_layernorm.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.self_attn.k_proj.weight",
    "model.layers.0.self_attn.v_proj.weight",
    "model.layers.0.self_attn.o_proj.weight",
    "model.layers.0.post_attention_layernorm.weight",
    "model.layers.0.mlp.gate_proj.weight",
    "model.layers.0.mlp.up_proj.weight",
    "model.layers.0.mlp.down_proj.weight",
    "model.layers.1.input_layernorm.weight",
    "model.layers.1.self_attn.q_proj.weight",
    "model.layers.1.self_attn.k_proj.weight",
    "model.layers.1.self_attn.v_proj.weight",
    "model.layers.1.self_attn.o_proj.weight",
    "model.layers.1.post_attention_layernorm.weight",
    "model.layers.1.mlp.gate_proj.weight",
    "model.layers.1.mlp.up_proj.weight",
    "model.layers.1.mlp.down_proj.weight",
    "model.norm.weight",
    "lm_head.weight",
};

TEST(scenario_04_grouping_tiny_llama)
{
    grouped x;
    if (!tiny_grouped(&x, g_tiny_llama, N_OF(g_tiny_llama),
                      "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\"}"))
        return;
    CHECK_EQ_INT(x.n, 11);
    CHECK_GROUP(&x, "model.embed_tokens", 1, HP_BT_EMBED);
    CHECK_GROUP(&x, "model.norm", 1, HP_BT_NORM);
    CHECK_GROUP(&x, "lm_head", 1, HP_BT_LM_HEAD);
    for (int l = 0; l < 2; l++) {
        char f[96];
        snprintf(f, sizeof f, "model.layers.%d.input_layernorm", l);
        CHECK_GROUP(&x, f, 1, HP_BT_NORM);
        snprintf(f, sizeof f, "model.layers.%d.self_attn", l);
        CHECK_GROUP(&x, f, 4, HP_BT_ATTENTION);
        snprintf(f, sizeof f, "model.layers.%d.post_attention_layernorm", l);
        CHECK_GROUP(&x, f, 1, HP_BT_NORM);
        snprintf(f, sizeof f, "model.layers.%d.mlp", l);
        CHECK_GROUP(&x, f, 3, HP_BT_MLP);
    }
    /* Registration order: embed first, lm_head last. */
    if (x.n == 11) {
        CHECK_STR_EQ(x.g[0].fqn, "model.embed_tokens");
        CHECK_STR_EQ(x.g[10].fqn, "lm_head");
    }
    check_partition(&x, false);
    grouped_free(&x);
}

TEST(scenario_04_grouping_small_cases)
{
    grouped x;
    /* {model.norm.weight: NORM} -> model.norm. */
    static const char *const norm_only[] = {"model.norm.weight"};
    if (tiny_grouped(&x, norm_only, 1, NULL)) {
        CHECK_EQ_INT(x.n, 1);
        CHECK_GROUP(&x, "model.norm", 1, HP_BT_NORM);
        grouped_free(&x);
    }
    /* {zzz.qqq.weight: SKIP} -> group zzz.qqq (unknown at the top, anchored at the owning module). */
    static const char *const zzz[] = {"zzz.qqq.weight"};
    if (tiny_grouped(&x, zzz, 1, NULL)) {
        CHECK(x.roles[0] == HP_ROLE_SKIP);
        CHECK_EQ_INT(x.n, 1);
        CHECK_GROUP(&x, "zzz.qqq", 1, HP_BT_UNKNOWN);
        grouped_free(&x);
    }
    /* SKIP params inside an mlp fold into the mlp group; a top-level parameter owned by the root and a
     * top-level module owning its own params each anchor their own (unknown) group. */
    static const char *const mixed[] = {
        "logit_scale",
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
        "model.layers.0.mlp.act.scale",
        "model.layers.0.mlp.extra.weight",
        "zzz.own",
        "zzz.sub.weight",
    };
    if (tiny_grouped(&x, mixed, N_OF(mixed), NULL)) {
        CHECK_GROUP(&x, "model.layers.0.mlp", 5, HP_BT_MLP);
        CHECK(role_in_group(&x, find_group(&x, "model.layers.0.mlp"), "act.scale") == HP_ROLE_SKIP);
        CHECK_GROUP(&x, "", 1, HP_BT_UNKNOWN);
        CHECK_GROUP(&x, "zzz", 2, HP_BT_UNKNOWN); /* its own parameter comes first (Python: own list first) */
        CHECK_EQ_INT(x.n, 3);
        check_partition(&x, false);
        grouped_free(&x);
    }
    /* MoE: gate + experts -> the mlp group; shared_experts -> its own nested mlp group. */
    static const char *const moe[] = {
        "model.layers.0.mlp.gate.weight",
        "model.layers.0.mlp.experts.w1",
        "model.layers.0.mlp.experts.w2",
        "model.layers.0.mlp.shared_experts.w1",
    };
    if (tiny_grouped(&x, moe, N_OF(moe), NULL)) {
        CHECK_EQ_INT(x.n, 2);
        CHECK_GROUP(&x, "model.layers.0.mlp", 3, HP_BT_MOE_MLP);
        CHECK_GROUP(&x, "model.layers.0.mlp.shared_experts", 1, HP_BT_MLP);
        check_partition(&x, false);
        grouped_free(&x);
    }
    /* A MOE_GATE-only mlp.gate never anchors an mlp group: it climbs to the top and lands at its own module. */
    static const char *const gate_only[] = {"model.layers.0.mlp.gate.weight"};
    if (tiny_grouped(&x, gate_only, 1, NULL)) {
        CHECK(x.roles[0] == HP_ROLE_MOE_GATE);
        CHECK_EQ_INT(x.n, 1);
        CHECK(find_group(&x, "model.layers.0.mlp") == NULL);
        CHECK_GROUP(&x, "model.layers.0.mlp.gate", 1, HP_BT_UNKNOWN);
        grouped_free(&x);
    }
}

/* Per-expert checkpoints: experts.N.* climb over the numeric and leaf guards into the MoE container. */
TEST(scenario_04_grouping_golden_per_expert)
{
    grouped x;
    if (open_and_group(&x, "data/golden/qwen2_moe_per_expert_f32")) {
        CHECK_EQ_INT(x.n, 13);
        for (int l = 0; l < 2; l++) {
            char f[96];
            snprintf(f, sizeof f, "model.layers.%d.mlp", l);
            /* gate + 8 experts x 3 + shared_expert_gate */
            CHECK_GROUP(&x, f, 26, HP_BT_MOE_MLP);
            const hp__group *g = find_group(&x, f);
            if (g) {
                CHECK(role_in_group(&x, g, "gate.weight") == HP_ROLE_MOE_GATE);
                CHECK(role_in_group(&x, g, "shared_expert_gate.weight") == HP_ROLE_REPLICATED);
                CHECK(role_in_group(&x, g, "experts.7.down_proj.weight") == HP_ROLE_MOE_EXPERT);
            }
            snprintf(f, sizeof f, "model.layers.%d.mlp.shared_expert", l);
            CHECK_GROUP(&x, f, 3, HP_BT_MLP);
            snprintf(f, sizeof f, "model.layers.%d.self_attn", l);
            CHECK_GROUP(&x, f, 7, HP_BT_ATTENTION); /* q/k/v biases ride with their weights */
        }
        check_partition(&x, false);
        grouped_free(&x);
    }
    if (open_and_group(&x, "data/golden/mixtral_per_expert_f32")) {
        CHECK_EQ_INT(x.n, 11);
        /* block_sparse_moe: an MoE container by its own segment; its gate is MOE_GATE by the mixtral family
         * rule (no default router pattern matches block_sparse_moe.gate). */
        CHECK_GROUP(&x, "model.layers.1.block_sparse_moe", 25, HP_BT_MOE_MLP);
        const hp__group *g = find_group(&x, "model.layers.1.block_sparse_moe");
        if (g) {
            CHECK(role_in_group(&x, g, "gate.weight") == HP_ROLE_MOE_GATE);
            CHECK(role_in_group(&x, g, "experts.3.w2.weight") == HP_ROLE_MOE_EXPERT);
        }
        check_partition(&x, false);
        grouped_free(&x);
    }
}

/* Batched (transformers >= 5) checkpoints: stacked experts.gate_up_proj / experts.down_proj. */
TEST(scenario_04_grouping_golden_batched)
{
    grouped x;
    if (open_and_group(&x, "data/golden/gpt_oss_batched_f32")) {
        CHECK_EQ_INT(x.n, 8);
        CHECK_GROUP(&x, "model.layers.0.mlp.router", 2, HP_BT_MOE_GATE);
        CHECK_GROUP(&x, "model.layers.0.mlp", 4, HP_BT_MOE_MLP);
        const hp__group *g = find_group(&x, "model.layers.0.mlp");
        if (g) {
            CHECK(role_in_group(&x, g, "experts.gate_up_proj") == HP_ROLE_MOE_EXPERT);
            CHECK(role_in_group(&x, g, "experts.down_proj_bias") == HP_ROLE_MOE_EXPERT);
        }
        CHECK_GROUP(&x, "model.layers.0.self_attn", 9, HP_BT_ATTENTION);
        g = find_group(&x, "model.layers.0.self_attn");
        if (g) CHECK(role_in_group(&x, g, "o_proj.bias") == HP_ROLE_BIAS);
        check_partition(&x, false);
        grouped_free(&x);
    }
    if (open_and_group(&x, "data/golden/qwen3_moe_batched_bf16")) {
        CHECK_GROUP(&x, "model.layers.1.mlp", 3, HP_BT_MOE_MLP);
        CHECK_GROUP(&x, "model.layers.1.self_attn", 4, HP_BT_ATTENTION);
        CHECK_GROUP(&x, "model.layers.1.self_attn.q_norm", 1, HP_BT_NORM);
        CHECK_GROUP(&x, "model.layers.1.self_attn.k_norm", 1, HP_BT_NORM);
        check_partition(&x, false);
        grouped_free(&x);
    }
    if (open_and_group(&x, "data/golden/glm4_moe_batched_bf16")) {
        CHECK_EQ_INT(x.n, 12);
        CHECK_GROUP(&x, "model.layers.0.mlp", 3, HP_BT_MLP); /* first_k_dense_replace: dense layer 0 */
        CHECK_GROUP(&x, "model.layers.1.mlp", 4, HP_BT_MOE_MLP);
        const hp__group *g = find_group(&x, "model.layers.1.mlp");
        if (g) CHECK(role_in_group(&x, g, "gate.e_score_correction_bias") == HP_ROLE_MOE_GATE);
        CHECK_GROUP(&x, "model.layers.1.mlp.shared_experts", 3, HP_BT_MLP);
        check_partition(&x, false);
        grouped_free(&x);
    }
    if (open_and_group(&x, "data/golden/mixtral_batched_bf16")) {
        CHECK_EQ_INT(x.n, 11);
        CHECK_GROUP(&x, "model.layers.0.mlp", 3, HP_BT_MOE_MLP);
        check_partition(&x, false);
        grouped_free(&x);
    }
}

/* Meta mode at full size: DeepSeek-V3 has 45,395 parameters in ~60k modules. (Speed is measured by
 * bench/bench_plan, never by a timed test.) */
TEST(scenario_04_grouping_meta_deepseek_v3)
{
    hp_model *m = NULL;
    hp_err err;
    CHECK_MSG(hp_model_open(&m, "data/configs/deepseek-v3.json", NULL, &err) == HP_OK, "%s", err.msg);
    if (!m) return;
    CHECK_EQ_INT(m->n_params, 45395);
    grouped x;
    memset(&x, 0, sizeof x);
    x.m = m;
    hp_arena_init(&x.arena);
    x.roles = malloc(m->n_params * sizeof *x.roles);
    if (!x.roles) {
        grouped_free(&x);
        return;
    }
    for (size_t i = 0; i < m->n_params; i++) x.roles[i] = hp__classify(m->params[i].name, m->arch, m->model_type);
    CHECK(hp__group_params(m, x.roles, NULL, &x.arena, &x.g, &x.n, &err) == HP_OK);
    CHECK_EQ_INT(x.n, 427); /* 61 x (attention, 2 MLA norms, mlp, 2 norms) + 58 shared + 3 */
    int counts[HP_BT_COUNT] = {0};
    for (size_t k = 0; k < x.n; k++) {
        hp_btype t = group_type(&x, &x.g[k]);
        if (t < HP_BT_COUNT) counts[t]++;
    }
    CHECK_EQ_INT(counts[HP_BT_ATTENTION], 61);
    CHECK_EQ_INT(counts[HP_BT_MOE_MLP], 58); /* first_k_dense_replace = 3 */
    CHECK_EQ_INT(counts[HP_BT_MLP], 3 + 58);
    CHECK_EQ_INT(counts[HP_BT_NORM], 61 * 4 + 1);
    CHECK_EQ_INT(counts[HP_BT_UNKNOWN], 0);
    CHECK_GROUP(&x, "model.layers.60.mlp", 2 + 256 * 3, HP_BT_MOE_MLP);
    CHECK_GROUP(&x, "model.layers.60.self_attn", 5, HP_BT_ATTENTION);
    check_partition(&x, false);
    grouped_free(&x);
}

TEST(scenario_04_grouping_meta_llama)
{
    grouped x;
    if (!open_and_group(&x, "data/configs/llama-3-8b.json")) return;
    CHECK_EQ_INT(x.n, 32 * 4 + 3);
    CHECK_GROUP(&x, "model.layers.31.self_attn", 4, HP_BT_ATTENTION);
    CHECK_GROUP(&x, "model.layers.31.mlp", 3, HP_BT_MLP);
    CHECK_STR_EQ(x.g[x.n - 1].fqn, "lm_head");
    check_partition(&x, false);
    grouped_free(&x);
}

/* A role outside the enum (HP_ROLE_COUNT) excludes the parameter (isolated roots, §6.9). */
TEST(scenario_04_grouping_excluded_params)
{
    grouped x;
    if (!tiny_grouped(&x, g_tiny_llama, N_OF(g_tiny_llama), NULL)) return;
    /* Exclude layer 1's q_proj and the whole of model.norm, then regroup. */
    for (size_t i = 0; i < x.m->n_params; i++)
        if (strcmp(x.m->params[i].name, "model.layers.1.self_attn.q_proj.weight") == 0 ||
            strcmp(x.m->params[i].name, "model.norm.weight") == 0)
            x.roles[i] = HP_ROLE_COUNT;
    hp_err err;
    CHECK(hp__group_params(x.m, x.roles, NULL, &x.arena, &x.g, &x.n, &err) == HP_OK);
    CHECK_EQ_INT(x.n, 10);
    CHECK(find_group(&x, "model.norm") == NULL);
    CHECK_GROUP(&x, "model.layers.1.self_attn", 3, HP_BT_ATTENTION);
    check_partition(&x, true);
    grouped_free(&x);
}

/* ---- §11 item 4: the inference table of §5 ---- */

TEST(scenario_04_inference_table)
{
    static const struct {
        const char *fqn;
        hp_role roles[4];
        int n;
        hp_btype type;
    } cases[] = {
        {"model.embed_tokens", {HP_ROLE_EMBED}, 1, HP_BT_EMBED},
        {"model.wte", {HP_ROLE_EMBED}, 1, HP_BT_EMBED},
        {"model.embed.proj", {HP_ROLE_SKIP}, 1, HP_BT_EMBED}, /* ".embed." raw */
        {"lm_head", {HP_ROLE_LM_HEAD}, 1, HP_BT_LM_HEAD},
        {"model.embed_out", {HP_ROLE_LM_HEAD}, 1, HP_BT_LM_HEAD},
        {"model.layers.0.input_layernorm", {HP_ROLE_NORM}, 1, HP_BT_NORM},
        {"model.norm", {HP_ROLE_NORM}, 1, HP_BT_NORM},
        {"model.layers.0.mlp.router", {HP_ROLE_MOE_GATE}, 1, HP_BT_MOE_GATE},
        {"model.layers.0.self_attn", {HP_ROLE_COLWISE, HP_ROLE_COLWISE, HP_ROLE_COLWISE, HP_ROLE_ROWWISE}, 4,
         HP_BT_ATTENTION},
        {"model.layers.0.mlp", {HP_ROLE_COLWISE, HP_ROLE_COLWISE, HP_ROLE_ROWWISE}, 3, HP_BT_MLP},
        {"model.layers.0.block", {HP_ROLE_COLWISE, HP_ROLE_ROWWISE}, 2, HP_BT_ATTENTION},
        {"model.layers.0.mlp", {HP_ROLE_COLWISE, HP_ROLE_COLWISE}, 2, HP_BT_MLP},
        {"model.layers.0.self_attn.q_proj", {HP_ROLE_COLWISE}, 1, HP_BT_UNKNOWN},
        {"model.layers.0.mlp", {HP_ROLE_MOE_GATE, HP_ROLE_MOE_EXPERT}, 2, HP_BT_MOE_MLP},
        {"model.layers.0.mlp.experts", {HP_ROLE_MOE_EXPERT}, 1, HP_BT_UNKNOWN},
        {"model.layers.0", {HP_ROLE_SKIP}, 1, HP_BT_UNKNOWN},
        /* Further rules of §5. */
        {"model.layers.0.mlp.experts.3", {HP_ROLE_MOE_EXPERT}, 1, HP_BT_UNKNOWN},     /* numeric guard */
        {"model.layers.0", {HP_ROLE_COLWISE, HP_ROLE_ROWWISE}, 2, HP_BT_UNKNOWN},  /* numeric guard */
        {"model.layers.0.mlp.experts.3", {HP_ROLE_COLWISE, HP_ROLE_ROWWISE}, 2, HP_BT_UNKNOWN},
        {"model.layers.0.mlp.experts", {HP_ROLE_COLWISE, HP_ROLE_ROWWISE}, 2, HP_BT_UNKNOWN}, /* leaf guard */
        {"model.layers.0.self_attn.o_proj", {HP_ROLE_COLWISE, HP_ROLE_ROWWISE}, 2, HP_BT_UNKNOWN},
        {"model.layers.0.layer3a", {HP_ROLE_COLWISE, HP_ROLE_ROWWISE}, 2, HP_BT_ATTENTION}, /* not all digits */
        {"model.layers.0.mlp.gate", {HP_ROLE_MOE_GATE}, 1, HP_BT_UNKNOWN},            /* leaf guard */
        {"model.layers.0.mlp", {HP_ROLE_MOE_GATE}, 1, HP_BT_UNKNOWN},                 /* gate only */
        {"model.layers.0.mlp.shared_experts", {HP_ROLE_SHARED_EXPERT}, 1, HP_BT_MLP}, /* not guarded */
        {"model.layers.0.block_sparse_moe", {HP_ROLE_SKIP, HP_ROLE_MOE_EXPERT}, 2, HP_BT_MOE_MLP},
        {"model.layers.0.moe_layer", {HP_ROLE_MOE_EXPERT}, 1, HP_BT_MOE_MLP},
        {"model.mlp.blk", {HP_ROLE_MOE_EXPERT}, 1, HP_BT_UNKNOWN}, /* "mlp" only in a parent segment */
        {"model.layers.0.mlp.shared_expert_gate", {HP_ROLE_MOE_EXPERT}, 1, HP_BT_UNKNOWN},
        {"model.layers.0.feed_forward", {HP_ROLE_FUSED_GATE_UP, HP_ROLE_ROWWISE}, 2, HP_BT_MLP},
        {"model.layers.0.attention", {HP_ROLE_FUSED_QKV, HP_ROLE_ROWWISE}, 2, HP_BT_ATTENTION},
        {"model.layers.0.ffn", {HP_ROLE_COLWISE}, 1, HP_BT_MLP},
        {"model.layers.0.self_attn", {HP_ROLE_COLWISE}, 1, HP_BT_UNKNOWN}, /* colwise only, not mlp */
        {"model.layers.0.self_attn", {HP_ROLE_ROWWISE}, 1, HP_BT_UNKNOWN},
        {"model.layers.0.mlp", {HP_ROLE_BIAS, HP_ROLE_REPLICATED}, 2, HP_BT_UNKNOWN},
        {"Model.Layers.0.MLP", {HP_ROLE_COLWISE, HP_ROLE_ROWWISE}, 2, HP_BT_MLP}, /* lower-cased */
        {"model.layers.0.dense", {HP_ROLE_COLWISE, HP_ROLE_ROWWISE}, 2, HP_BT_UNKNOWN},
        {"transformer.h.0.ln_1", {HP_ROLE_NORM}, 1, HP_BT_NORM},
        {"", {HP_ROLE_SKIP}, 1, HP_BT_UNKNOWN},
        {"", {HP_ROLE_COLWISE, HP_ROLE_ROWWISE}, 2, HP_BT_ATTENTION},
        {"model.layers.0.mlp", {HP_ROLE_COLWISE}, 0, HP_BT_UNKNOWN}, /* empty group */
    };
    for (size_t i = 0; i < N_OF(cases); i++) {
        hp_btype t = hp__infer_type(cases[i].fqn, cases[i].roles, cases[i].n);
        CHECK_MSG(t == cases[i].type, "case %zu '%s': %s, expected %s", i, cases[i].fqn, hp_btype_name(t),
                  hp_btype_name(cases[i].type));
    }
    static const char *names[] = {"attention", "linear_attention", "mlp",      "norm",   "embed",
                                  "lm_head",   "moe_gate",         "moe_mlp", "unknown", "custom"};
    CHECK_EQ_INT(HP_BT_COUNT, 10);
    for (int t = 0; t < HP_BT_COUNT; t++) CHECK_STR_EQ(hp_btype_name((hp_btype)t), names[t]);
    CHECK_STR_EQ(hp_btype_name(HP_BT_COUNT), "?");
}

/* ---- §11 item 10: DeepSeek MLA and Qwen2-MoE family rules ---- */

TEST(scenario_10_deepseek_mla_roles)
{
    static const char *const spellings[] = {"deepseekv2", "deepseekv3", "deepseek_v2", "deepseek_v3"};
    for (size_t s = 0; s < N_OF(spellings); s++) {
        const char *a = spellings[s];
        /* By arch, and by model_type when the arch is unknown or empty. */
        const char *archs[2][2] = {{a, NULL}, {"", a}};
        for (int k = 0; k < 2; k++) {
            const char *ar = archs[k][0], *mt = archs[k][1];
            CHECK(hp__classify("model.layers.0.self_attn.q_a_proj.weight", ar, mt) == HP_ROLE_REPLICATED);
            CHECK(hp__classify("model.layers.0.self_attn.kv_a_proj_with_mqa.weight", ar, mt) ==
                  HP_ROLE_REPLICATED);
            CHECK(hp__classify("model.layers.0.self_attn.q_b_proj.weight", ar, mt) == HP_ROLE_COLWISE);
            CHECK(hp__classify("model.layers.0.self_attn.kv_b_proj.weight", ar, mt) == HP_ROLE_COLWISE);
            CHECK(hp__classify("model.layers.0.self_attn.o_proj.weight", ar, mt) == HP_ROLE_ROWWISE);
            CHECK(hp__classify("model.layers.0.self_attn.q_a_layernorm.weight", ar, mt) == HP_ROLE_NORM);
            CHECK(hp__classify("model.layers.0.self_attn.kv_a_layernorm.weight", ar, mt) == HP_ROLE_NORM);
            CHECK(hp__classify("model.layers.3.mlp.gate.e_score_correction_bias", ar, mt) == HP_ROLE_MOE_GATE);
        }
    }
    /* The golden checkpoint: a 5-param MLA attention group in both layers. */
    grouped x;
    if (!open_and_group(&x, "data/golden/deepseek_v3_per_expert_f32")) return;
    for (int l = 0; l < 2; l++) {
        char f[96];
        snprintf(f, sizeof f, "model.layers.%d.self_attn", l);
        CHECK_GROUP(&x, f, 5, HP_BT_ATTENTION);
        const hp__group *g = find_group(&x, f);
        if (g) {
            CHECK(role_in_group(&x, g, "q_a_proj.weight") == HP_ROLE_REPLICATED);
            CHECK(role_in_group(&x, g, "kv_a_proj_with_mqa.weight") == HP_ROLE_REPLICATED);
            CHECK(role_in_group(&x, g, "q_b_proj.weight") == HP_ROLE_COLWISE);
            CHECK(role_in_group(&x, g, "kv_b_proj.weight") == HP_ROLE_COLWISE);
            CHECK(role_in_group(&x, g, "o_proj.weight") == HP_ROLE_ROWWISE);
        }
        snprintf(f, sizeof f, "model.layers.%d.self_attn.q_a_layernorm", l);
        CHECK_GROUP(&x, f, 1, HP_BT_NORM);
        snprintf(f, sizeof f, "model.layers.%d.self_attn.kv_a_layernorm", l);
        CHECK_GROUP(&x, f, 1, HP_BT_NORM);
    }
    CHECK_GROUP(&x, "model.layers.0.mlp", 3, HP_BT_MLP);
    CHECK_GROUP(&x, "model.layers.1.mlp", 2 + 16 * 3, HP_BT_MOE_MLP);
    CHECK_GROUP(&x, "model.layers.1.mlp.shared_experts", 3, HP_BT_MLP);
    CHECK_STR_EQ(x.g[x.n - 1].fqn, "lm_head");
    check_partition(&x, false);
    grouped_free(&x);
}

TEST(scenario_10_qwen2moe_roles)
{
    static const char *const spellings[] = {"qwen2moe", "qwen2_moe"};
    for (size_t s = 0; s < N_OF(spellings); s++) {
        const char *a = spellings[s];
        CHECK(hp__classify("model.layers.0.mlp.shared_expert_gate.weight", a, NULL) == HP_ROLE_REPLICATED);
        CHECK(hp__classify("model.layers.0.mlp.shared_expert_gate.weight", NULL, a) == HP_ROLE_REPLICATED);
        CHECK(hp__classify("model.layers.0.mlp.shared_expert.gate_proj.weight", a, NULL) == HP_ROLE_SHARED_EXPERT);
        CHECK(hp__classify("model.layers.0.mlp.gate.weight", a, NULL) == HP_ROLE_MOE_GATE);
        CHECK(hp__classify("model.layers.0.mlp.experts.w1", a, NULL) == HP_ROLE_MOE_EXPERT);
        CHECK(hp__classify("model.layers.0.mlp.experts.0.up_proj.weight", a, NULL) == HP_ROLE_MOE_EXPERT);
    }
    /* Families with empty rule lists use the defaults only. */
    CHECK(hp__classify("model.layers.0.mlp.shared_expert_gate.weight", "qwen3moe", "qwen3_moe") == HP_ROLE_SKIP);
    CHECK(hp__classify("model.layers.0.mlp.shared_expert_gate.weight", "mixtral", "mixtral") == HP_ROLE_SKIP);
    /* Beyond the seed: the hub Mixtral router and gpt-oss attention sinks. */
    CHECK(hp__classify("model.layers.0.block_sparse_moe.gate.weight", "mixtral", "mixtral") == HP_ROLE_MOE_GATE);
    CHECK(hp__classify("model.layers.0.block_sparse_moe.gate.weight", "llama", "llama") == HP_ROLE_SKIP);
    CHECK(hp__classify("model.layers.0.self_attn.sinks", "gptoss", "gpt_oss") == HP_ROLE_COLWISE);
    CHECK(hp__classify("model.layers.0.self_attn.sinks", "llama", NULL) == HP_ROLE_SKIP);
}

/* ---- §11 item 11: special handlers (§8.4) ---- */

TEST(scenario_11_special_handlers)
{
    CHECK_STR_EQ(hp__special_handler("model.layers.0.gated_delta.a_log"), "gated_delta_tp_shard");
    CHECK_STR_EQ(hp__special_handler("model.layers.0.linear_attn.A_log"), "gated_delta_tp_shard");
    CHECK_STR_EQ(hp__special_handler("model.layers.0.linear_attn.dt_bias"), "gated_delta_tp_shard");
    CHECK_STR_EQ(hp__special_handler("model.layers.0.gated_delta.conv.weight"), "gated_delta_tp_shard");
    /* An unregistered pattern gets the "default" handler. */
    CHECK_STR_EQ(hp__special_handler("model.layers.0.mamba.d_param"), "default");
    CHECK_STR_EQ(hp__special_handler(""), "default");

    /* As the planner collects them: only SPECIAL-role parameters get a handler. */
    static const char *const names[] = {
        "model.layers.0.linear_attn.A_log",
        "model.layers.0.linear_attn.dt_bias",
        "model.layers.0.linear_attn.in_proj_qkvz.weight",
        "model.layers.0.linear_attn.out_proj.weight",
        "model.layers.0.self_attn.q_proj.weight",
    };
    int n_special = 0;
    for (size_t i = 0; i < N_OF(names); i++) {
        if (hp__classify(names[i], "qwen3next", "qwen3_next") != HP_ROLE_SPECIAL) continue;
        n_special++;
        CHECK_STR_EQ(hp__special_handler(names[i]), "gated_delta_tp_shard");
    }
    CHECK_EQ_INT(n_special, 2);
}

/* The memo slot of the parameter named name in m (NULL when there is none). */
static int *memo_of(hp__memo *memo, const hp_model *m, const char *name, uint32_t tag, bool *fresh)
{
    const hp_param *p = hp_model_find_param(m, name);
    CHECK_MSG(p != NULL, "no parameter %s", name);
    return p ? hp__memo_param(memo, (size_t)(p - m->params), tag, fresh) : NULL;
}

TEST(memo_templates)
{
    /* A name's all-digit segments are its template's "0": layers and experts share one slot; a segment with
     * letters ("w2", "3x"), an empty one, or another tag does not. Modules share slots the same way. */
    static const char *const names[] = {
        "model.layers.12.mlp.experts.7.w2.weight", "model.layers.3.mlp.experts.250.w2.weight",
        "model.layers.3.mlp.experts.250.w1.weight", "model.layers.3x.mlp.experts.250.w2.weight",
        "model.layers.0", "model.layers..w", "model.layers.00.w", "w", "0",
    };
    const char *dir = write_tiny(names, N_OF(names), NULL);
    if (!dir) return;
    char copy[200];
    snprintf(copy, sizeof copy, "%s", dir);
    hp_model *m = NULL;
    hp_err err;
    hp_status st = hp_model_open(&m, copy, NULL, &err);
    remove_tiny(copy);
    CHECK_MSG(st == HP_OK, "%s", err.msg);
    if (st != HP_OK) return;
    hp__memo *memo = hp__memo_create(m);
    CHECK(memo != NULL);
    bool fresh = false;
    int *a = memo_of(memo, m, names[0], 0, &fresh);
    CHECK(a && fresh);
    if (a) *a = 42;
    int *b = memo_of(memo, m, names[1], 0, &fresh);
    CHECK(b == a && !fresh && b && *b == 42);
    CHECK(memo_of(memo, m, names[2], 0, &fresh) != a && fresh);
    CHECK(memo_of(memo, m, names[3], 0, &fresh) != a && fresh);
    CHECK(memo_of(memo, m, names[0], 1, &fresh) != a && fresh);
    int *z = memo_of(memo, m, "model.layers.0", 0, &fresh);
    CHECK(z && fresh);
    CHECK(memo_of(memo, m, "model.layers..w", 0, &fresh) && fresh); /* an empty segment is no index */
    CHECK(memo_of(memo, m, "model.layers.00.w", 0, &fresh) && fresh);
    CHECK(memo_of(memo, m, "w", 0, &fresh) && fresh);
    CHECK(memo_of(memo, m, "0", 0, &fresh) && fresh);
    CHECK(memo_of(memo, m, "w", 0, &fresh) && !fresh);
    /* Modules: experts 7 of layer 12 and 250 of layer 3 share a template, layer 3x's does not. */
    int e7 = hp_model_find_module(m, "model.layers.12.mlp.experts.7");
    int e250 = hp_model_find_module(m, "model.layers.3.mlp.experts.250");
    int x250 = hp_model_find_module(m, "model.layers.3x.mlp.experts.250");
    CHECK(e7 >= 0 && e250 >= 0 && x250 >= 0);
    if (e7 >= 0 && e250 >= 0 && x250 >= 0) {
        int *c = hp__memo_module(memo, (size_t)e7, 5, &fresh);
        CHECK(c && fresh);
        CHECK(hp__memo_module(memo, (size_t)e250, 5, &fresh) == c && !fresh);
        CHECK(hp__memo_module(memo, (size_t)x250, 5, &fresh) != c && fresh);
    }
    CHECK(hp__memo_param(NULL, 0, 0, &fresh) == NULL); /* no memo: computed directly */
    hp__memo_destroy(memo);
    hp__memo_destroy(NULL);
    hp_model_close(m);

    /* Many templates: the tables grow and keep every slot's value. */
    enum { N = 600 };
    static char buf[2 * N][32];
    const char *many[2 * N];
    for (int i = 0; i < N; i++) {
        snprintf(buf[2 * i], sizeof buf[0], "t%d.0.w", i);
        snprintf(buf[2 * i + 1], sizeof buf[0], "t%d.%d.w", i, i + 5);
        many[2 * i] = buf[2 * i], many[2 * i + 1] = buf[2 * i + 1];
    }
    if (!(dir = write_tiny(many, N_OF(many), NULL))) return;
    snprintf(copy, sizeof copy, "%s", dir);
    st = hp_model_open(&m, copy, NULL, &err);
    remove_tiny(copy);
    CHECK_MSG(st == HP_OK, "%s", err.msg);
    if (st != HP_OK) return;
    memo = hp__memo_create(m);
    CHECK(memo != NULL);
    int ok = 0;
    for (int i = 0; i < N; i++) {
        int *v = memo_of(memo, m, many[2 * i], 0, &fresh);
        ok += v && fresh;
        if (v) *v = i;
    }
    for (int i = 0; i < N; i++) {
        int *v = memo_of(memo, m, many[2 * i + 1], 0, &fresh);
        ok += v && !fresh && *v == i;
    }
    CHECK_EQ_INT(ok, 2 * N);
    hp__memo_destroy(memo);
    hp_model_close(m);
}

TEST_MAIN()
