/*
 * test_model.c — config parsing, meta-mode synthesis (parameter totals of the eight real configs), the
 * parameter table and module tree of real checkpoints, ordering, freezing, architecture names, gen.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyperpar/gen.h"
#include "hyperpar/model.h"
#include "model/model_int.h"
#include "testlib.h"

static const struct {
    const char *file;
    uint64_t params;
} g_real[] = {
    {"mixtral-8x7b.json", 46702792704ull},   {"qwen1.5-moe-a2.7b.json", 14315784192ull},
    {"qwen3-30b-a3b.json", 30532122624ull},  {"deepseek-v3.json", 671026419200ull},
    {"glm-4.5-air.json", 106852251264ull},   {"llama-3-8b.json", 8030261248ull},
    {"qwen2.5-7b.json", 7615616512ull},      {"gpt-oss-20b.json", 20914757184ull},
};

static const char *g_golden[] = {
    "deepseek_v3_per_expert_f32", "glm4_moe_batched_bf16", "gpt_oss_batched_f32", "mixtral_batched_bf16",
    "mixtral_per_expert_f32",     "qwen2_moe_per_expert_f32", "qwen3_moe_batched_bf16",
};

static hp_model *open_text(const char *text, hp_err *err)
{
    hp_model *m = NULL;
    hp_model_from_config_text(&m, text, strlen(text), "config.json", NULL, err);
    return m;
}

TEST(real_configs_reproduce_published_parameter_totals)
{
    for (size_t i = 0; i < sizeof g_real / sizeof *g_real; i++) {
        for (int layout = 0; layout < 2; layout++) {
            char path[256];
            snprintf(path, sizeof path, "data/configs/%s", g_real[i].file);
            hp_model_opts o = {.layout = layout ? HP_LAYOUT_BATCHED : HP_LAYOUT_PER_EXPERT};
            hp_model *m = NULL;
            hp_err err;
            hp_status st = hp_model_open(&m, path, &o, &err);
            CHECK_MSG(st == HP_OK, "%s: %s", path, err.msg);
            if (st != HP_OK) continue;
            CHECK(m->meta);
            CHECK_MSG(hp_model_num_params(m) == g_real[i].params, "%s layout %d: %llu vs %llu", path, layout,
                      (unsigned long long)hp_model_num_params(m), (unsigned long long)g_real[i].params);
            hp_model_close(m);
        }
    }
}

TEST(deepseek_v3_shapes_and_tensor_count)
{
    hp_model *m = NULL;
    hp_err err;
    CHECK(hp_model_open(&m, "data/configs/deepseek-v3.json", NULL, &err) == HP_OK);
    if (!m) return;
    /* 61 layers: 3 dense (7 MLA + 2 norms + 3 MLP), 58 sparse (9 + router 2 + 256 x 3 experts + shared 3). */
    CHECK_EQ_INT(m->n_params, 3 + 3 * 12 + 58 * (9 + 2 + 256 * 3 + 3));
    const hp_param *p = hp_model_find_param(m, "model.layers.3.mlp.experts.255.down_proj.weight");
    CHECK(p && p->n_dims == 2 && p->shape[0] == 7168 && p->shape[1] == 2048);
    p = hp_model_find_param(m, "model.layers.5.self_attn.kv_b_proj.weight");
    CHECK(p && p->shape[0] == 128 * (128 + 128) && p->shape[1] == 512);
    p = hp_model_find_param(m, "model.layers.5.mlp.gate.e_score_correction_bias");
    CHECK(p && p->dtype == HP_DT_F32);
    CHECK(hp_model_find_param(m, "model.layers.2.mlp.gate.weight") == NULL);
    CHECK(hp_model_layer_is_sparse(m, 3) && !hp_model_layer_is_sparse(m, 2));
    /* The name table finds every parameter, and nothing that is a prefix or an extension of a name. */
    CHECK(m->name_hash != NULL);
    size_t found = 0;
    for (size_t i = 0; i < m->n_params; i++) found += hp_model_find_param(m, m->params[i].name) == &m->params[i];
    CHECK(found == m->n_params);
    CHECK(hp_model_find_param(m, "model.layers.3.mlp.experts.255.down_proj") == NULL);
    CHECK(hp_model_find_param(m, "model.layers.3.mlp.experts.255.down_proj.weight.") == NULL);
    CHECK(hp_model_find_param(m, "") == NULL);
    hp_model_close(m);
}

TEST(batched_layout_names)
{
    hp_model_opts o = {.layout = HP_LAYOUT_BATCHED};
    hp_model *m = NULL;
    hp_err err;
    CHECK(hp_model_open(&m, "data/configs/mixtral-8x7b.json", &o, &err) == HP_OK);
    if (!m) return;
    const hp_param *p = hp_model_find_param(m, "model.layers.0.mlp.experts.gate_up_proj");
    CHECK(p && p->n_dims == 3 && p->shape[0] == 8 && p->shape[1] == 2 * 14336 && p->shape[2] == 4096);
    CHECK(hp_model_find_param(m, "model.layers.0.block_sparse_moe.gate.weight") == NULL);
    CHECK(m->layout == HP_LAYOUT_BATCHED);
    hp_model_close(m);
    CHECK(hp_model_open(&m, "data/configs/mixtral-8x7b.json", NULL, &err) == HP_OK);
    if (!m) return;
    CHECK(hp_model_find_param(m, "model.layers.31.block_sparse_moe.experts.7.w2.weight") != NULL);
    hp_model_close(m);
    /* gpt-oss has only the batched layout: transposed gate_up [E, H, 2I] with biases. */
    CHECK(hp_model_open(&m, "data/configs/gpt-oss-20b.json", NULL, &err) == HP_OK);
    if (!m) return;
    p = hp_model_find_param(m, "model.layers.0.mlp.experts.gate_up_proj");
    CHECK(p && p->shape[0] == 32 && p->shape[1] == 2880 && p->shape[2] == 5760);
    CHECK(hp_model_find_param(m, "model.layers.0.mlp.experts.down_proj_bias") != NULL);
    CHECK(hp_model_find_param(m, "model.layers.0.self_attn.sinks") != NULL);
    hp_model_close(m);
}

TEST(golden_checkpoints_list_exactly_their_tensors)
{
    for (size_t i = 0; i < sizeof g_golden / sizeof *g_golden; i++) {
        char dir[256], file[300];
        snprintf(dir, sizeof dir, "data/golden/%s", g_golden[i]);
        snprintf(file, sizeof file, "%s/model.safetensors", dir);
        hp_model *m = NULL;
        hp_st_file *f = NULL;
        hp_err err;
        CHECK_MSG(hp_model_open(&m, dir, NULL, &err) == HP_OK, "%s", err.msg);
        CHECK(hp_st_open(&f, file, &err) == HP_OK);
        if (!m || !f) {
            hp_model_close(m);
            hp_st_close(f);
            continue;
        }
        CHECK(!m->meta && m->family != NULL);
        CHECK_EQ_INT(m->n_params, hp_st_count(f));
        for (size_t k = 0; k < hp_st_count(f); k++) {
            const hp_st_tensor *t = hp_st_tensor_at(f, k);
            const hp_param *p = hp_model_find_param(m, t->name);
            CHECK_MSG(p != NULL, "%s missing", t->name);
            if (!p) continue;
            CHECK(p->dtype == t->dtype && p->n_dims == t->n_dims);
            CHECK(memcmp(p->shape, t->shape, (size_t)t->n_dims * sizeof *t->shape) == 0);
            CHECK(p->offset == hp_st_data_offset(f) + t->begin && p->nbytes == t->end - t->begin);
        }
        /* Meta mode from the folder's config.json synthesises the same table (same layout). */
        hp_model *meta = NULL;
        hp_model_opts o = {.layout = m->layout};
        char cfg[300];
        snprintf(cfg, sizeof cfg, "%s/config.json", dir);
        CHECK_MSG(hp_model_open(&meta, cfg, &o, &err) == HP_OK, "%s", err.msg);
        if (meta) {
            CHECK_EQ_INT(meta->n_params, m->n_params);
            for (size_t k = 0; k < m->n_params && k < meta->n_params; k++)
                CHECK_MSG(strcmp(m->params[k].name, meta->params[k].name) == 0, "%s: %s vs %s", g_golden[i],
                          m->params[k].name, meta->params[k].name);
        }
        hp_model_close(meta);
        hp_model_close(m);
        hp_st_close(f);
    }
}

TEST(registration_and_natural_order)
{
    hp_model *m = NULL;
    hp_err err;
    CHECK(hp_model_open(&m, "data/configs/llama-3-8b.json", NULL, &err) == HP_OK);
    if (!m) return;
    CHECK_STR_EQ(m->params[0].name, "model.embed_tokens.weight");
    CHECK_STR_EQ(m->params[1].name, "model.layers.0.self_attn.q_proj.weight");
    CHECK_STR_EQ(m->params[4].name, "model.layers.0.self_attn.o_proj.weight");
    CHECK_STR_EQ(m->params[5].name, "model.layers.0.mlp.gate_proj.weight");
    CHECK_STR_EQ(m->params[8].name, "model.layers.0.input_layernorm.weight");
    CHECK_STR_EQ(m->params[m->n_params - 2].name, "model.norm.weight");
    CHECK_STR_EQ(m->params[m->n_params - 1].name, "lm_head.weight");
    /* layers.2 before layers.10 */
    int i2 = -1, i10 = -1;
    for (size_t i = 0; i < m->n_params; i++) {
        if (i2 < 0 && strstr(m->params[i].name, "layers.2.")) i2 = (int)i;
        if (i10 < 0 && strstr(m->params[i].name, "layers.10.")) i10 = (int)i;
    }
    CHECK(i2 >= 0 && i10 > i2);
    hp_model_close(m);
}

TEST(module_tree)
{
    hp_model *m = NULL;
    hp_err err;
    CHECK(hp_model_open(&m, "data/golden/qwen2_moe_per_expert_f32", NULL, &err) == HP_OK);
    if (!m) return;
    CHECK_STR_EQ(m->modules[0].name, "");
    CHECK_EQ_INT(m->modules[0].parent, -1);
    int mlp = hp_model_find_module(m, "model.layers.1.mlp");
    int experts = hp_model_find_module(m, "model.layers.1.mlp.experts");
    int e3 = hp_model_find_module(m, "model.layers.1.mlp.experts.3");
    CHECK(mlp > 0 && experts > mlp && e3 > experts);
    if (e3 > 0) {
        CHECK_EQ_INT(m->modules[e3].parent, experts);
        CHECK_STR_EQ(m->modules[e3].leaf, "3");
        CHECK_EQ_INT(m->modules[e3].depth, 6);
    }
    int q = hp_model_find_module(m, "model.layers.0.self_attn.q_proj");
    CHECK(q > 0);
    if (q > 0) {
        CHECK_EQ_INT(m->modules[q].n_params, 2);
        CHECK_STR_EQ(m->params[m->modules[q].params[0]].name, "model.layers.0.self_attn.q_proj.weight");
        CHECK_STR_EQ(m->params[m->modules[q].params[1]].name, "model.layers.0.self_attn.q_proj.bias");
    }
    /* Every parameter's module owns it, and children link back to parents. */
    for (size_t i = 0; i < m->n_params; i++) {
        const hp_module *mod = &m->modules[m->params[i].module];
        bool found = false;
        for (int k = 0; k < mod->n_params; k++) found |= mod->params[k] == (int)i;
        CHECK(found);
    }
    for (size_t i = 0; i < m->n_modules; i++)
        for (int c = m->modules[i].first_child; c >= 0; c = m->modules[c].next_sibling)
            CHECK_EQ_INT(m->modules[c].parent, (int)i);
    CHECK(hp_model_layer_is_sparse(m, 0) && hp_model_layer_is_sparse(m, 1));
    hp_model_close(m);
}

TEST(freeze_glob)
{
    hp_model *m = NULL;
    hp_err err;
    CHECK(hp_model_open(&m, "data/golden/mixtral_batched_bf16", NULL, &err) == HP_OK);
    if (!m) return;
    CHECK_EQ_INT(hp_model_freeze(m, "model.embed_tokens.*"), 1);
    CHECK_EQ_INT(hp_model_freeze(m, "*.experts.*"), 4);
    CHECK(!hp_model_find_param(m, "model.embed_tokens.weight")->trainable);
    CHECK(hp_model_find_param(m, "lm_head.weight")->trainable);
    hp_model_close(m);
}

TEST(architecture_names)
{
    char buf[128];
    CHECK_STR_EQ(hp_arch_canonical("Qwen2ForCausalLM", NULL, buf, sizeof buf), "qwen2");
    CHECK_STR_EQ(hp_arch_canonical("Blip2ForConditionalGeneration", NULL, buf, sizeof buf), "blip2");
    CHECK_STR_EQ(hp_arch_canonical("PaliGemmaForImageTextToText", NULL, buf, sizeof buf), "paligemma");
    CHECK_STR_EQ(hp_arch_canonical("DeepseekV3ForCausalLM", NULL, buf, sizeof buf), "deepseekv3");
    CHECK_STR_EQ(hp_arch_canonical("", "Tiny", buf, sizeof buf), "tiny");
    CHECK_STR_EQ(hp_arch_canonical(NULL, "qwen3_moe", buf, sizeof buf), "qwen3_moe");
    CHECK(hp_family_find("deepseek_v3") == hp_family_find("DeepseekV3ForCausalLM"));
    CHECK(hp_family_find("deepseekv3") == hp_family_find("deepseek_v3"));
    CHECK(hp_family_find("Qwen2MoeForCausalLM") == hp_family_find("qwen2_moe"));
    CHECK(hp_family_find("gpt2") == NULL);
    CHECK_EQ_INT(hp_family_count(), 10);
}

TEST(config_errors_are_positioned)
{
    hp_err err;
    hp_model *m = open_text("{\n  \"model_type\": \"llama\",\n  \"hidden_size\": \"4096\"\n}", &err);
    CHECK(m == NULL && err.status == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "config.json:3:18");
    CHECK_STR_CONTAINS(err.msg, "\"hidden_size\" must be a non-negative integer");
    CHECK_STR_CONTAINS(err.msg, "string \"4096\"");

    m = open_text("{\"model_type\": \"llama\",\n \"hidden_size\": 64,,}", &err);
    CHECK(m == NULL && err.status == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "config.json:2:");
    CHECK_STR_CONTAINS(err.msg, "invalid JSON");

    m = open_text("[1, 2]", &err);
    CHECK(m == NULL);
    CHECK_STR_CONTAINS(err.msg, "JSON object");

    m = open_text("{\"model_type\": \"gpt2\", \"hidden_size\": 64}", &err);
    CHECK(m == NULL && err.status == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "known families: llama, mistral");

    /* A missing size takes the config class's default (LlamaConfig: 32 layers, intermediate 11008), as in
     * transformers; an explicit 0 is refused. */
    m = open_text("{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_attention_heads\": 4, \"vocab_size\": 8}",
                  &err);
    CHECK_MSG(m != NULL, "%s", err.msg);
    if (m) CHECK(m->cfg.num_hidden_layers == 32 && m->cfg.intermediate_size == 11008);
    hp_model_close(m);
    m = open_text("{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_attention_heads\": 4, \"vocab_size\": 8, "
                  "\"num_hidden_layers\": 0}",
                  &err);
    CHECK(m == NULL);
    CHECK_STR_CONTAINS(err.msg, "\"num_hidden_layers\" is 0, but it must be at least 1");

    m = open_text("{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 1, "
                  "\"num_attention_heads\": 5, \"vocab_size\": 8, \"intermediate_size\": 8}",
                  &err);
    CHECK(m == NULL);
    CHECK_STR_CONTAINS(err.msg, "not divisible by num_attention_heads");

    m = open_text("{\"model_type\": \"llama\", \"hidden_size\": 1e400}", &err);
    CHECK(m == NULL && err.status == HP_ERR_INPUT);
    m = open_text("{\"model_type\": \"llama\", \"hidden_size\": 99999999999999999999999}", &err);
    CHECK(m == NULL && err.status == HP_ERR_INPUT);
    m = open_text("{\"model_type\": \"llama\", \"hidden_size\": -4}", &err);
    CHECK(m == NULL);
    CHECK_STR_CONTAINS(err.msg, "found integer -4");
    m = open_text("{\"model_type\": \"ll\xff\xfe\"}", &err);
    CHECK(m == NULL && err.status == HP_ERR_INPUT);
    m = open_text("{\"model_type\": \"llama\", \"model_type\": \"qwen2\"}", &err);
    CHECK(m == NULL);
    CHECK_STR_CONTAINS(err.msg, "duplicate");
    m = open_text("{\"model_type\": 7}", &err);
    CHECK(m == NULL);
    CHECK_STR_CONTAINS(err.msg, "\"model_type\" must be a string");
    m = open_text("{\"model_type\": \"qwen3_moe\", \"num_experts\": 8,\n \"num_experts_per_tok\": 0}", &err);
    CHECK(m == NULL);
    CHECK_STR_CONTAINS(err.msg, "config.json:2:25: field \"num_experts_per_tok\" must be at least 1");
    m = open_text("{\"model_type\": \"qwen3_moe\", \"mlp_only_layers\": [\"a\"]}", &err);
    CHECK(m == NULL);
    CHECK_STR_CONTAINS(err.msg, "mlp_only_layers");

    /* Deep nesting is refused by the parser, not by the stack. */
    size_t depth = 100000;
    char *deep = malloc(2 * depth + 3);
    for (size_t i = 0; i < depth; i++) deep[i] = '[';
    for (size_t i = 0; i < depth; i++) deep[depth + i] = ']';
    deep[2 * depth] = '\0';
    m = open_text(deep, &err);
    CHECK(m == NULL && err.status == HP_ERR_INPUT);
    free(deep);

    /* A config that would synthesise an absurd table is refused up front. */
    m = open_text("{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 1000000000, "
                  "\"num_attention_heads\": 4, \"vocab_size\": 8, \"intermediate_size\": 8}",
                  &err);
    CHECK(m == NULL);
    CHECK_STR_CONTAINS(err.msg, "implausible");
}

TEST(open_errors)
{
    hp_model *m = NULL;
    hp_err err;
    CHECK(hp_model_open(&m, "data/does-not-exist", NULL, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "no such file or folder");
    CHECK(hp_model_open(&m, "data", NULL, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "neither *.safetensors files nor a config.json");
}

/* A fresh scratch folder (testlib.h), in a static buffer. */
static char *tmpdir(void)
{
    static char buf[200];
    return test_tmpdir(buf, sizeof buf);
}

static void rm_rf(const char *dir) { CHECK(test_rm_rf(dir)); }

TEST(gen_every_family_matches_meta_mode)
{
    char *base = tmpdir();
    CHECK(base != NULL);
    if (!base) return;
    for (size_t i = 0; i < hp_family_count(); i++) {
        for (int layout = 0; layout < 2; layout++) {
            hp_gen_opts o;
            hp_gen_opts_default(&o);
            o.family = hp_family_name(hp_family_at(i));
            o.layout = layout ? HP_LAYOUT_BATCHED : HP_LAYOUT_PER_EXPERT;
            o.dtype = layout ? HP_DT_BF16 : HP_DT_F32;
            o.layers = 3;
            char dir[256], cfg[300];
            snprintf(dir, sizeof dir, "%s/%s-%d", base, o.family, layout);
            snprintf(cfg, sizeof cfg, "%s/config.json", dir);
            hp_err err;
            CHECK_MSG(hp_gen_checkpoint(&o, dir, &err) == HP_OK, "%s: %s", o.family, err.msg);
            hp_model *real = NULL, *meta = NULL;
            hp_model_opts mo = {.layout = o.layout};
            CHECK_MSG(hp_model_open(&real, dir, NULL, &err) == HP_OK, "%s", err.msg);
            CHECK_MSG(hp_model_open(&meta, cfg, &mo, &err) == HP_OK, "%s", err.msg);
            if (real && meta) {
                CHECK_EQ_INT(real->n_params, meta->n_params);
                CHECK(real->family == hp_family_at(i));
                for (size_t k = 0; k < real->n_params && k < meta->n_params; k++) {
                    CHECK_STR_EQ(real->params[k].name, meta->params[k].name);
                    CHECK(real->params[k].nbytes == meta->params[k].nbytes);
                }
            }
            hp_model_close(real);
            hp_model_close(meta);
        }
    }
    rm_rf(base);
}

/* Per-expert and batched checkpoints of one seed hold the same expert weights. */
TEST(gen_layouts_hold_the_same_weights)
{
    char *base = tmpdir();
    if (!base) return;
    char a[256], b[256];
    snprintf(a, sizeof a, "%s/pe", base);
    snprintf(b, sizeof b, "%s/ba", base);
    hp_gen_opts o;
    hp_gen_opts_default(&o);
    o.family = "qwen3_moe";
    o.seed = 7;
    hp_err err;
    CHECK(hp_gen_checkpoint(&o, a, &err) == HP_OK);
    o.layout = HP_LAYOUT_BATCHED;
    CHECK(hp_gen_checkpoint(&o, b, &err) == HP_OK);
    /* Same options again: a non-empty folder is refused without force. */
    CHECK(hp_gen_checkpoint(&o, b, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "--force");

    char fa[300], fb[300];
    snprintf(fa, sizeof fa, "%s/model.safetensors", a);
    snprintf(fb, sizeof fb, "%s/model.safetensors", b);
    hp_st_file *pa = NULL, *pb = NULL;
    CHECK(hp_st_open(&pa, fa, &err) == HP_OK);
    CHECK(hp_st_open(&pb, fb, &err) == HP_OK);
    if (pa && pb) {
        const hp_st_tensor *gu = hp_st_find(pb, "model.layers.1.mlp.experts.gate_up_proj"); /* [8, 64, 64] */
        const hp_st_tensor *dn = hp_st_find(pb, "model.layers.1.mlp.experts.down_proj");    /* [8, 64, 32] */
        const hp_st_tensor *g5 = hp_st_find(pa, "model.layers.1.mlp.experts.5.gate_proj.weight");
        const hp_st_tensor *u5 = hp_st_find(pa, "model.layers.1.mlp.experts.5.up_proj.weight");
        const hp_st_tensor *d5 = hp_st_find(pa, "model.layers.1.mlp.experts.5.down_proj.weight");
        CHECK(gu && dn && g5 && u5 && d5);
        if (gu && dn && g5 && u5 && d5) {
            const float *GU = hp_st_data(pb, gu), *DN = hp_st_data(pb, dn);
            const float *G = hp_st_data(pa, g5), *U = hp_st_data(pa, u5), *D = hp_st_data(pa, d5);
            const size_t per = 32 * 64;
            CHECK(memcmp(GU + 5 * 2 * per, G, per * sizeof(float)) == 0);
            CHECK(memcmp(GU + 5 * 2 * per + per, U, per * sizeof(float)) == 0);
            CHECK(memcmp(DN + 5 * per, D, per * sizeof(float)) == 0);
            CHECK(G[0] != G[1] && G[0] != U[0]);
            const hp_st_tensor *emb_a = hp_st_find(pa, "model.embed_tokens.weight");
            const hp_st_tensor *emb_b = hp_st_find(pb, "model.embed_tokens.weight");
            CHECK(memcmp(hp_st_data(pa, emb_a), hp_st_data(pb, emb_b), emb_a->end - emb_a->begin) == 0);
        }
    }
    hp_st_close(pa);
    hp_st_close(pb);

    /* Determinism: the same options give the same bytes; another seed does not. */
    char c[256];
    snprintf(c, sizeof c, "%s/again", base);
    CHECK(hp_gen_checkpoint(&o, c, &err) == HP_OK);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "cmp -s '%s/model.safetensors' '%s/model.safetensors'", b, c);
    CHECK(system(cmd) == 0);
    o.seed = 8;
    o.force = true;
    CHECK(hp_gen_checkpoint(&o, c, &err) == HP_OK);
    CHECK(system(cmd) != 0);
    rm_rf(base);
}

TEST(gen_rejects_bad_options)
{
    hp_gen_opts o;
    hp_gen_opts_default(&o);
    char *text = NULL;
    hp_err err;
    o.family = "gpt2";
    CHECK(hp_gen_config_text(&o, &text, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "unknown family \"gpt2\"");
    hp_gen_opts_default(&o);
    o.top_k = 9;
    CHECK(hp_gen_config_text(&o, &text, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "top-k");
    hp_gen_opts_default(&o);
    o.heads = 6;
    o.kv_heads = 4;
    CHECK(hp_gen_config_text(&o, &text, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "multiple of --kv-heads");
    CHECK(text == NULL);
}

/* hp__model_dir / hp__model_config_path (generate's generation_config.json, cost's config.json): one rule for
 * every form hp_model_open takes. */
TEST(model_dir_and_config_path)
{
    static const struct {
        const char *open, *dir, *cfg;
    } cases[] = {
        {"data/golden/mixtral_batched_bf16", "data/golden/mixtral_batched_bf16",
         "data/golden/mixtral_batched_bf16/config.json"},
        {"data/golden/mixtral_batched_bf16/model.safetensors", "data/golden/mixtral_batched_bf16",
         "data/golden/mixtral_batched_bf16/config.json"},
        {"data/golden/mixtral_batched_bf16/config.json", "data/golden/mixtral_batched_bf16",
         "data/golden/mixtral_batched_bf16/config.json"},
        {"data/configs/llama-3-8b.json", "data/configs", "data/configs/llama-3-8b.json"},
    };
    char dir[4096], cfg[4096];
    hp_err err;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        hp_model *m = NULL;
        CHECK_MSG(hp_model_open(&m, cases[i].open, NULL, &err) == HP_OK, "%s: %s", cases[i].open, err.msg);
        if (!m) continue;
        CHECK_STR_EQ(hp__model_dir(m, dir, sizeof dir), cases[i].dir);
        CHECK_STR_EQ(hp__model_config_path(m, cfg, sizeof cfg), cases[i].cfg);
        hp_model_close(m);
    }
    hp_model *m = open_text("{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 128, "
                            "\"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"vocab_size\": 32}", &err);
    CHECK_MSG(m != NULL, "%s", err.msg);
    if (m) { /* config text labelled "config.json": the label is the file, its folder the current one */
        CHECK_STR_EQ(hp__model_dir(m, dir, sizeof dir), ".");
        CHECK_STR_EQ(hp__model_config_path(m, cfg, sizeof cfg), "config.json");
    }
    hp_model_close(m);
}

TEST_MAIN()
