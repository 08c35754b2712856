/*
 * test_plan.c — the planner end to end: spec §11 scenarios (templates, role placements, golden tiny Llama,
 * SP x loss_parallel, compatibility, deferred biases, head counts, F4a, F4b, EP marking), the eight real
 * configs at tp = 2, 4, 8 and with EP, and agreement with transformers' own base_model_tp_plan.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hyperpar/gen.h"
#include "hyperpar/plan.h"
#include "plan/planner_int.h"
#include "testlib.h"

/* One scratch folder for the whole run, removed at exit (testlib.h). */
static const char *tmp_base(void) { return test_work_dir("plan"); }

/* tiny_llama of §11: hidden 16, 4 heads, 4 kv heads, 2 layers, vocab 32, intermediate 32. */
static const char *tiny_llama(void)
{
    static char dir[256];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "%s/tiny_llama", tmp_base());
        hp_gen_opts o;
        hp_gen_opts_default(&o);
        o.family = "llama";
        o.hidden = 16, o.heads = 4, o.kv_heads = 4, o.head_dim = 4, o.layers = 2, o.vocab = 32, o.intermediate = 32;
        hp_err err;
        if (hp_gen_checkpoint(&o, dir, &err) != HP_OK) abort();
    }
    return dir;
}

/* A checkpoint with exactly the given names and shapes (zeros) plus a config.json text. */
static const char *write_ckpt(const char *name, const char *config, int n, const char *const *names,
                              const int64_t (*shapes)[4], const int *ndims)
{
    static char dir[160];
    snprintf(dir, sizeof dir, "%s/%s", tmp_base(), name);
    mkdir(dir, 0755);
    hp_st_writer *w = hp_st_writer_create();
    static float zeros[65536];
    hp_err err;
    for (int i = 0; i < n; i++)
        if (hp_st_writer_add(w, names[i], HP_DT_F32, ndims[i], shapes[i], zeros, &err) != HP_OK) abort();
    char path[256];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (hp_st_writer_write(w, path, &err) != HP_OK) abort();
    hp_st_writer_destroy(w);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    fputs(config, f);
    fclose(f);
    return dir;
}

typedef struct setup {
    int64_t dp, cp, tp, ep;
    bool ep_axis, nosp, lp, packed, uncovered;
    hp_expert_layout layout;
} setup;

/* A plan points into its model, so a model opened for a caller that does not keep it stays open until the
 * next such call (and the last one until the final test). */
static hp_model *g_kept_model;

static hp_plan *plan(const char *path, setup s, hp_model **mo, hp_err *err)
{
    hp_model_opts o = {.layout = s.layout};
    hp_model *m = NULL;
    if (hp_model_open(&m, path, &o, err) != HP_OK) return NULL;
    hp_plan_opts po;
    hp_plan_opts_default(&po);
    hp_mesh_from_sizes(&po.mesh, s.dp, s.cp, s.tp, s.ep, s.ep_axis);
    po.sequence_parallel = !s.nosp;
    po.loss_parallel = s.lp;
    po.packed_fused = s.packed;
    po.allow_uncovered = s.uncovered;
    hp_plan *p = NULL;
    hp_plan_derive(&p, m, &po, err);
    if (!p) {
        hp_model_close(m);
    } else if (mo) {
        *mo = m;
    } else {
        hp_model_close(g_kept_model);
        g_kept_model = m;
    }
    return p;
}

static void done(hp_plan *p, hp_model *m)
{
    hp_plan_free(p);
    hp_model_close(m);
}

static const char *pl(hp_placement x)
{
    static char buf[8][16];
    static int k;
    return hp_placement_str(x, buf[k++ % 8], 16);
}

/* Placement string of param rel in boundary fqn on axis a ("-" when absent or not declared). */
static const char *param_pl(const hp_plan *p, const char *fqn, const char *rel, hp_axis a)
{
    const hp_boundary *b = hp_plan_find(p, fqn);
    if (!b) return "no-boundary";
    for (int i = 0; i < b->n_params; i++)
        if (!strcmp(b->params[i].rel, rel)) return pl(b->params[i].pl.ax[a]);
    return "undeclared";
}

static const char *io_pl(const hp_io_map *m, hp_axis a) { return m->is_null || !m->n ? "null" : pl(m->e[0].pl.ax[a]); }

TEST(scenario_06_templates_and_08_golden_tiny_llama_sp)
{
    hp_model *m = NULL;
    hp_err err;
    hp_plan *p = plan(tiny_llama(), (setup){.tp = 2}, &m, &err);
    CHECK_MSG(p != NULL, "%s", err.msg);
    if (!p) return;
    /* exactly {embed_tokens, norm, lm_head, and per layer input_layernorm, self_attn, post_attention_layernorm, mlp} */
    CHECK_EQ_INT(p->n_boundaries, 3 + 2 * 4);
    CHECK_EQ_INT(p->n_dims, 1);
    const char *a = "model.layers.0.self_attn";
    CHECK_STR_EQ(param_pl(p, a, "q_proj.weight", HP_AXIS_TP), "S(0)");
    CHECK_STR_EQ(param_pl(p, a, "k_proj.weight", HP_AXIS_TP), "S(0)");
    CHECK_STR_EQ(param_pl(p, a, "o_proj.weight", HP_AXIS_TP), "S(1)");
    const hp_boundary *b = hp_plan_find(p, a);
    CHECK(b && b->type == HP_BT_ATTENTION && b->needs_cp_attn && b->region_dispatch == -1);
    if (b) {
        CHECK_STR_EQ(b->in_src.e[0].name, "hidden_states");
        CHECK_STR_EQ(io_pl(&b->in_src, HP_AXIS_TP), "S(1)");
        CHECK_STR_EQ(io_pl(&b->in_dst, HP_AXIS_TP), "R");
        CHECK_STR_EQ(io_pl(&b->out_src, HP_AXIS_TP), "P");
        CHECK_STR_EQ(io_pl(&b->out_dst, HP_AXIS_TP), "S(1)");
        CHECK_STR_EQ(io_pl(&b->in_src, HP_AXIS_CP), "-"); /* cp is not a mesh dim: dropped */
        CHECK_EQ_INT(b->n_tp_attrs, 2);
        if (b->n_tp_attrs == 2) CHECK(b->tp_attrs[0].global == 4 && b->tp_attrs[0].local == 2);
    }
    CHECK_STR_EQ(param_pl(p, "model.layers.1.mlp", "gate_proj.weight", HP_AXIS_TP), "S(0)");
    CHECK_STR_EQ(param_pl(p, "model.layers.1.mlp", "down_proj.weight", HP_AXIS_TP), "S(1)");
    CHECK_STR_EQ(param_pl(p, "model.norm", "weight", HP_AXIS_TP), "R");
    b = hp_plan_find(p, "model.norm");
    CHECK(b && b->type == HP_BT_NORM);
    if (b) CHECK(!strcmp(io_pl(&b->in_src, HP_AXIS_TP), "S(1)") && !strcmp(io_pl(&b->out_dst, HP_AXIS_TP), "S(1)"));
    b = hp_plan_find(p, "model.embed_tokens");
    CHECK(b && b->type == HP_BT_EMBED);
    if (b) {
        CHECK_STR_EQ(param_pl(p, "model.embed_tokens", "weight", HP_AXIS_TP), "S(0)");
        CHECK_STR_EQ(io_pl(&b->out_src, HP_AXIS_TP), "P");
        CHECK_STR_EQ(io_pl(&b->out_dst, HP_AXIS_TP), "S(1)");
        CHECK_STR_EQ(b->in_src.e[0].name, "input");
    }
    b = hp_plan_find(p, "lm_head");
    CHECK(b && b->type == HP_BT_LM_HEAD && b->terminal);
    if (b) {
        CHECK_STR_EQ(io_pl(&b->out_src, HP_AXIS_TP), "S(-1)");
        CHECK_STR_EQ(io_pl(&b->out_dst, HP_AXIS_TP), "R");
    }
    int terminals = 0;
    for (size_t i = 0; i < p->n_boundaries; i++) terminals += p->boundaries[i].terminal;
    CHECK_EQ_INT(terminals, 1);
    done(p, m);
}

TEST(scenario_08_golden_tiny_llama_sp_off_and_cp_only)
{
    hp_err err;
    hp_plan *p = plan(tiny_llama(), (setup){.tp = 2, .nosp = true}, NULL, &err);
    CHECK(p != NULL);
    if (p) {
        const hp_boundary *b = hp_plan_find(p, "model.layers.0.self_attn");
        CHECK(b && !strcmp(io_pl(&b->in_src, HP_AXIS_TP), "R") && !strcmp(io_pl(&b->in_dst, HP_AXIS_TP), "R"));
        CHECK(b && !strcmp(io_pl(&b->out_src, HP_AXIS_TP), "P") && !strcmp(io_pl(&b->out_dst, HP_AXIS_TP), "R"));
        b = hp_plan_find(p, "model.norm");
        CHECK(b && !strcmp(io_pl(&b->in_src, HP_AXIS_TP), "R") && !strcmp(io_pl(&b->out_dst, HP_AXIS_TP), "R"));
    }
    hp_plan_free(p);
    /* CP only, SP off: every first-input and output CP entry is S(1). */
    p = plan(tiny_llama(), (setup){.cp = 2, .nosp = true}, NULL, &err);
    CHECK_MSG(p != NULL, "%s", err.msg);
    if (p) {
        const char *fq[] = {"model.embed_tokens", "model.layers.0.input_layernorm", "model.layers.0.self_attn",
                            "model.layers.0.mlp", "model.norm", "lm_head"};
        for (size_t i = 0; i < 6; i++) {
            const hp_boundary *b = hp_plan_find(p, fq[i]);
            CHECK_MSG(b != NULL, "%s", fq[i]);
            if (!b) continue;
            CHECK_STR_EQ(io_pl(&b->in_src, HP_AXIS_CP), "S(1)");
            CHECK_STR_EQ(io_pl(&b->in_dst, HP_AXIS_CP), "S(1)");
            CHECK_STR_EQ(io_pl(&b->out_src, HP_AXIS_CP), "S(1)");
            CHECK_STR_EQ(io_pl(&b->out_dst, HP_AXIS_CP), "S(1)");
            CHECK_STR_EQ(io_pl(&b->in_src, HP_AXIS_TP), "-");
        }
    }
    hp_plan_free(p);
}

TEST(scenario_09_sp_and_loss_parallel_matrix)
{
    for (int sp = 0; sp < 2; sp++)
        for (int lp = 0; lp < 2; lp++) {
            hp_err err;
            hp_plan *p = plan(tiny_llama(), (setup){.tp = 2, .nosp = !sp, .lp = lp}, NULL, &err);
            CHECK(p != NULL);
            if (!p) continue;
            const hp_boundary *e = hp_plan_find(p, "model.embed_tokens");
            CHECK_STR_EQ(io_pl(&e->in_src, HP_AXIS_TP), "R");
            CHECK_STR_EQ(io_pl(&e->out_src, HP_AXIS_TP), "P");
            CHECK_STR_EQ(io_pl(&e->out_dst, HP_AXIS_TP), sp ? "S(1)" : "R");
            const hp_boundary *a = hp_plan_find(p, "model.layers.1.self_attn");
            CHECK_STR_EQ(io_pl(&a->in_src, HP_AXIS_TP), sp ? "S(1)" : "R");
            CHECK_STR_EQ(io_pl(&a->out_dst, HP_AXIS_TP), sp ? "S(1)" : "R");
            const hp_boundary *h = hp_plan_find(p, "lm_head");
            CHECK_STR_EQ(io_pl(&h->out_src, HP_AXIS_TP), "S(-1)");
            CHECK_STR_EQ(io_pl(&h->out_dst, HP_AXIS_TP), lp ? "S(-1)" : "R");
            hp_plan_free(p);
        }
}

TEST(scenario_07_role_placements)
{
    hp_nplace o;
    /* dense roles with and without tp */
    CHECK(hp__placement_for_role(HP_ROLE_COLWISE, "q_proj.weight", 2, true, false, false, &o));
    CHECK_STR_EQ(pl(o.ax[HP_AXIS_TP]), "S(0)");
    CHECK_STR_EQ(pl(o.ax[HP_AXIS_CP]), "R");
    CHECK(hp__placement_for_role(HP_ROLE_COLWISE, "q_proj.weight", 2, false, false, false, &o));
    CHECK_STR_EQ(pl(o.ax[HP_AXIS_TP]), "-"); /* tp key dropped for dense without tp */
    CHECK(hp__placement_for_role(HP_ROLE_ROWWISE, "o_proj.weight", 2, true, false, false, &o));
    CHECK_STR_EQ(pl(o.ax[HP_AXIS_TP]), "S(1)");
    CHECK(hp__placement_for_role(HP_ROLE_NORM, "weight", 1, true, false, false, &o));
    CHECK_STR_EQ(pl(o.ax[HP_AXIS_TP]), "R");
    CHECK(hp__placement_for_role(HP_ROLE_BIAS, "o_proj.bias", 1, false, false, false, &o));
    CHECK_STR_EQ(pl(o.ax[HP_AXIS_TP]), "R"); /* BIAS keeps its tp key */
    /* experts: 2-D vs 3-D TP dims (D-08), explicit tp R without tp, ep key only with an ep axis */
    CHECK(hp__placement_for_role(HP_ROLE_MOE_EXPERT, "experts.w1", 3, true, true, false, &o));
    CHECK_STR_EQ(pl(o.ax[HP_AXIS_TP]), "S(1)");
    CHECK_STR_EQ(pl(o.ax[HP_AXIS_EP]), "S(0)");
    CHECK(hp__placement_for_role(HP_ROLE_MOE_EXPERT, "experts.w2", 3, true, true, false, &o));
    CHECK_STR_EQ(pl(o.ax[HP_AXIS_TP]), "S(2)");
    CHECK(hp__placement_for_role(HP_ROLE_MOE_EXPERT, "experts.0.down_proj.weight", 2, true, false, false, &o));
    CHECK_STR_EQ(pl(o.ax[HP_AXIS_TP]), "S(1)");
    CHECK_STR_EQ(pl(o.ax[HP_AXIS_EP]), "-");
    CHECK(hp__placement_for_role(HP_ROLE_MOE_EXPERT, "experts.0.gate_proj.weight", 2, false, false, false, &o));
    CHECK_STR_EQ(pl(o.ax[HP_AXIS_TP]), "R");
    CHECK(hp__placement_for_role(HP_ROLE_SHARED_EXPERT, "shared_experts.w2", 2, true, false, false, &o));
    CHECK_STR_EQ(pl(o.ax[HP_AXIS_TP]), "S(1)");
    CHECK(hp__placement_for_role(HP_ROLE_SHARED_EXPERT, "shared_experts.fc2", 2, true, false, false, &o));
    CHECK_STR_EQ(pl(o.ax[HP_AXIS_TP]), "S(0)"); /* fc2 counts as colwise by the name rule */
    CHECK(!hp__placement_for_role(HP_ROLE_SKIP, "x", 2, true, false, false, &o));
    CHECK(!hp__placement_for_role(HP_ROLE_SPECIAL, "a_log", 1, true, false, false, &o));
}

TEST(scenario_05_mesh_dims)
{
    hp_err err;
    hp_model *m = NULL;
    CHECK(hp_model_open(&m, tiny_llama(), NULL, &err) == HP_OK);
    if (!m) return;
    hp_plan_opts po;
    hp_plan_opts_default(&po);
    CHECK(hp_mesh_parse("dp=1,cp=2,tp=2", &po.mesh, &err) == HP_OK);
    hp_plan *p = NULL;
    CHECK(hp_plan_derive(&p, m, &po, &err) == HP_OK);
    if (p) {
        CHECK_EQ_INT(p->n_dims, 2);
        CHECK(p->dims[0] == HP_AXIS_CP && p->dims[1] == HP_AXIS_TP);
    }
    hp_plan_free(p);
    CHECK(hp_mesh_parse("tp=2,cp=1", &po.mesh, &err) == HP_OK);
    CHECK(hp_plan_derive(&p, m, &po, &err) == HP_OK);
    if (p) CHECK(p->n_dims == 1 && p->dims[0] == HP_AXIS_TP);
    hp_plan_free(p);
    CHECK(hp_mesh_parse("dp=4", &po.mesh, &err) == HP_OK);
    CHECK(hp_plan_derive(&p, m, &po, &err) == HP_OK);
    if (p) CHECK_EQ_INT(p->n_dims, 0);
    hp_plan_free(p);
    hp_model_close(m);
    CHECK(hp_mesh_parse("tp2", &po.mesh, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "NAME=SIZE");
    CHECK(hp_mesh_parse("tq=2", &po.mesh, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "unknown axis 'tq'");
    CHECK(hp_mesh_parse("tp=2,tp=2", &po.mesh, &err) == HP_ERR_INPUT);
    CHECK(hp_mesh_parse("tp=0", &po.mesh, &err) == HP_ERR_INPUT);
    CHECK(hp_mesh_parse("tp=2,ep=2", &po.mesh, &err) == HP_OK && po.mesh.ep_axis && po.mesh.ep == 2);
}

TEST(scenario_12_model_compatibility)
{
    hp_err err;
    hp_model *m = NULL;
    CHECK(hp_model_open(&m, "data/golden/qwen3_moe_batched_bf16", NULL, &err) == HP_OK); /* 4 heads, 2 kv, 16 experts */
    if (!m) return;
    CHECK(hp_plan_check_compat(m, 2, 2, 2, 16, &err) == HP_OK);
    CHECK(hp_plan_check_compat(m, 4, 1, 1, 0, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "num_key_value_heads");
    CHECK(hp_plan_check_compat(m, 8, 1, 1, 0, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "num_attention_heads");
    CHECK(hp_plan_check_compat(m, 1, 2, 1, 10, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "2*cp");
    CHECK(hp_plan_check_compat(m, 1, 1, 3, 0, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "num_experts (16) must be divisible by EP (3)");
    m->cfg.moe_intermediate_size = 7;
    CHECK(hp_plan_check_compat(m, 2, 1, 2, 0, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "moe_intermediate_size");
    hp_model_close(m);
    CHECK(hp_model_open(&m, tiny_llama(), NULL, &err) == HP_OK);
    if (!m) return;
    CHECK(hp_plan_check_compat(m, 1, 1, 2, 0, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "EP>1 requires MoE model (num_experts > 0)");
    hp_model_close(m);
}

TEST(scenario_13_deferred_row_wise_bias)
{
    /* gpt-oss attention has q/k/v/o biases: o_proj.bias is deferred at tp=2, q/k/v biases follow their weights. */
    hp_err err;
    hp_plan *p = plan("data/golden/gpt_oss_batched_f32", (setup){.tp = 2}, NULL, &err);
    CHECK_MSG(p != NULL, "%s", err.msg);
    if (p) {
        const hp_boundary *b = hp_plan_find(p, "model.layers.0.self_attn");
        CHECK(b && b->n_deferred == 1 && !strcmp(b->deferred_biases[0], "o_proj.bias"));
        CHECK_STR_EQ(param_pl(p, "model.layers.0.self_attn", "q_proj.bias", HP_AXIS_TP), "S(0)");
        CHECK_STR_EQ(param_pl(p, "model.layers.0.self_attn", "o_proj.bias", HP_AXIS_TP), "R");
    }
    hp_plan_free(p);
    p = plan("data/golden/gpt_oss_batched_f32", (setup){.tp = 1}, NULL, &err);
    CHECK(p != NULL);
    if (p) CHECK_EQ_INT(hp_plan_find(p, "model.layers.0.self_attn")->n_deferred, 0);
    hp_plan_free(p);
    /* An lm_head with a bias classified BIAS (Replicate) under a column split: template mismatch. */
    static const char *const names[] = {"model.embed_tokens.weight", "lm_head.weight", "lm_head.bias"};
    static const int64_t shapes[][4] = {{32, 16}, {32, 16}, {32}};
    static const int nd[] = {2, 2, 1};
    const char *dir = write_ckpt("lm_bias", "{\"architectures\": [\"TinyForCausalLM\"]}", 3, names, shapes, nd);
    p = plan(dir, (setup){.tp = 2}, NULL, &err);
    CHECK(p == NULL && err.status == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "template mismatch");
}

TEST(scenario_15_f4a_divisibility)
{
    static const char *const names[] = {"model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
                                        "model.layers.0.mlp.down_proj.weight"};
    static const int64_t shapes[][4] = {{3, 8}, {3, 8}, {8, 3}};
    static const int nd[] = {2, 2, 2};
    const char *dir = write_ckpt("f4a", "{\"model_type\": \"tiny\"}", 3, names, shapes, nd);
    hp_err err;
    hp_plan *p = plan(dir, (setup){.tp = 2}, NULL, &err);
    CHECK(p == NULL && err.status == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "not divisible by tp size 2");
    CHECK_STR_CONTAINS(err.msg, "classification");
    CHECK_STR_CONTAINS(err.msg, "gate_proj.weight");
}

TEST(scenario_16_f4b_coverage)
{
    static const char *const names[] = {"model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
                                        "model.layers.0.mlp.down_proj.weight", "model.layers.0.extra.weight"};
    static const int64_t shapes[][4] = {{8, 8}, {8, 8}, {8, 8}, {8, 8}};
    static const int nd[] = {2, 2, 2, 2};
    const char *dir = write_ckpt("f4b", "{\"model_type\": \"tiny\"}", 4, names, shapes, nd);
    hp_err err;
    hp_plan *p = plan(dir, (setup){.tp = 2}, NULL, &err);
    CHECK(p == NULL && err.status == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "coverage check failed");
    CHECK_STR_CONTAINS(err.msg, "model.layers.0.extra.weight");
    CHECK_STR_CONTAINS(err.msg, "allow_uncovered_params");
    p = plan(dir, (setup){.tp = 2, .uncovered = true}, NULL, &err);
    CHECK(p != NULL && p->n_warnings >= 1);
    if (p) {
        bool found = false;
        for (int i = 0; i < p->n_warnings; i++) found |= strstr(p->warnings[i], "coverage check failed") != NULL;
        CHECK(found);
    }
    hp_plan_free(p);
    /* Frozen parameters are exempt. */
    hp_model *m = NULL;
    CHECK(hp_model_open(&m, dir, NULL, &err) == HP_OK);
    if (!m) return;
    CHECK_EQ_INT(hp_model_freeze(m, "*.extra.*"), 1);
    hp_plan_opts po;
    hp_plan_opts_default(&po);
    hp_mesh_from_sizes(&po.mesh, 1, 1, 2, 1, false);
    CHECK(hp_plan_derive(&p, m, &po, &err) == HP_OK);
    done(p, m);
}

TEST(scenario_25_ep_marking_per_expert_d10)
{
    hp_err err;
    hp_plan *p = plan("data/golden/qwen2_moe_per_expert_f32", (setup){.dp = 2, .tp = 2, .ep = 2}, NULL, &err);
    CHECK_MSG(p != NULL, "%s", err.msg);
    if (!p) return;
    const char *mlp = "model.layers.0.mlp";
    const hp_boundary *b = hp_plan_find(p, mlp);
    CHECK(b && b->type == HP_BT_MOE_MLP && b->ep_size == 2 && b->region_dispatch == -1);
    CHECK(hp_plan_find(p, "model.layers.0.mlp.experts.0") == NULL);
    CHECK_STR_EQ(param_pl(p, mlp, "experts.gate_proj", HP_AXIS_EP), "S(0)");
    CHECK_STR_EQ(param_pl(p, mlp, "experts.gate_proj", HP_AXIS_TP), "-");
    CHECK_STR_EQ(param_pl(p, mlp, "experts.down_proj", HP_AXIS_EP), "S(0)");
    CHECK_STR_EQ(param_pl(p, mlp, "experts.0.gate_proj.weight", HP_AXIS_EP), "undeclared");
    CHECK_STR_EQ(param_pl(p, mlp, "gate.weight", HP_AXIS_TP), "R");
    CHECK_STR_EQ(param_pl(p, mlp, "shared_expert_gate.weight", HP_AXIS_TP), "R");
    if (b) {
        CHECK_EQ_INT(b->n_ep_stack, 3);
        CHECK_STR_EQ(b->ep_stack[0].name, "experts.gate_proj");
        CHECK_EQ_INT(b->ep_stack[0].n_src, 8);
        CHECK_STR_EQ(b->ep_stack[0].src[0], "experts.0.gate_proj.weight");
        CHECK_STR_EQ(b->ep_stack[0].src[7], "experts.7.gate_proj.weight");
        CHECK_STR_EQ(io_pl(&b->in_dst, HP_AXIS_TP), "S(1)"); /* identity contract under SP */
        CHECK_STR_EQ(io_pl(&b->out_src, HP_AXIS_TP), "S(1)");
        CHECK_STR_EQ(io_pl(&b->out_dst, HP_AXIS_TP), "S(1)");
    }
    /* The shared expert stays an ordinary nested mlp boundary. */
    const hp_boundary *s = hp_plan_find(p, "model.layers.0.mlp.shared_expert");
    CHECK(s && s->type == HP_BT_MLP && s->ep_size == 0);
    CHECK_STR_EQ(param_pl(p, "model.layers.0.mlp.shared_expert", "down_proj.weight", HP_AXIS_TP), "S(1)");
    hp_nplace np;
    CHECK(hp_plan_param_placement(p, "model.layers.1.mlp.experts.5.up_proj.weight", &np) != NULL);
    CHECK_STR_EQ(pl(np.ax[HP_AXIS_EP]), "S(0)");
    hp_plan_free(p);
}

TEST(scenario_25_ep_marking_batched_custom_and_invalid)
{
    hp_err err;
    hp_plan *p = plan("data/golden/qwen3_moe_batched_bf16", (setup){.tp = 2, .ep = 4, .dp = 2}, NULL, &err);
    CHECK_MSG(p != NULL, "%s", err.msg);
    if (p) {
        const hp_boundary *b = hp_plan_find(p, "model.layers.1.mlp");
        CHECK(b && b->ep_size == 4 && b->n_ep_stack == 0 && b->region_dispatch == -1);
        CHECK_STR_EQ(param_pl(p, "model.layers.1.mlp", "experts.gate_up_proj", HP_AXIS_EP), "S(0)");
        CHECK_STR_EQ(param_pl(p, "model.layers.1.mlp", "experts.down_proj", HP_AXIS_TP), "-");
        if (b) CHECK_STR_EQ(io_pl(&b->out_dst, HP_AXIS_TP), "S(1)");
    }
    hp_plan_free(p);
    /* custom w1/w2/w3 (tiny_moe): ep_size set, no stack, region_dispatch stays false */
    static const char *const names[] = {"model.layers.0.mlp.gate.weight", "model.layers.0.mlp.experts.w1",
                                        "model.layers.0.mlp.experts.w2", "model.layers.0.mlp.experts.w3"};
    static const int64_t shapes[][4] = {{4, 16}, {4, 8, 16}, {4, 16, 8}, {4, 8, 16}};
    static const int nd[] = {2, 3, 3, 3};
    const char *dir = write_ckpt("tiny_moe", "{\"model_type\": \"tiny\", \"num_experts\": 4}", 4, names, shapes, nd);
    p = plan(dir, (setup){.tp = 2, .ep = 2}, NULL, &err);
    CHECK_MSG(p != NULL, "%s", err.msg);
    if (p) {
        const hp_boundary *b = hp_plan_find(p, "model.layers.0.mlp");
        CHECK(b && b->ep_size == 2 && b->n_ep_stack == 0 && b->region_dispatch == 0);
    }
    hp_plan_free(p);
    /* tiny_moe old style, mesh (tp, ep): experts.w1 ep S0 tp S1; w2 tp S2; gate tp R. */
    p = plan(dir, (setup){.tp = 2, .ep = 2, .ep_axis = true}, NULL, &err);
    CHECK_MSG(p != NULL, "%s", err.msg);
    if (p) {
        const char *mlp = "model.layers.0.mlp";
        CHECK_STR_EQ(param_pl(p, mlp, "experts.w1", HP_AXIS_TP), "S(1)");
        CHECK_STR_EQ(param_pl(p, mlp, "experts.w1", HP_AXIS_EP), "S(0)");
        CHECK_STR_EQ(param_pl(p, mlp, "experts.w2", HP_AXIS_TP), "S(2)");
        CHECK_STR_EQ(param_pl(p, mlp, "gate.weight", HP_AXIS_TP), "R");
        const hp_boundary *b = hp_plan_find(p, mlp);
        CHECK(b && b->region_dispatch == 0 && b->ep_size == 0 && !strcmp(b->in_src.e[0].name, "x_BLD"));
        if (b) CHECK(!strcmp(io_pl(&b->out_src, HP_AXIS_TP), "P") && !strcmp(io_pl(&b->out_dst, HP_AXIS_TP), "S(1)"));
    }
    hp_plan_free(p);
    /* ep = 1: no marking; per-expert entries stay. */
    p = plan("data/golden/mixtral_per_expert_f32", (setup){.tp = 2}, NULL, &err);
    CHECK_MSG(p != NULL, "%s", err.msg);
    if (p) CHECK_STR_EQ(param_pl(p, "model.layers.0.block_sparse_moe", "experts.0.w1.weight", HP_AXIS_TP), "S(0)");
    hp_plan_free(p);
    /* invalid: mesh (dp=1, tp=2) with ep=4 and (4, 2) with ep=3 -> dense; 16 experts with ep=32 */
    p = plan(dir, (setup){.tp = 2, .ep = 4}, NULL, &err);
    CHECK(p == NULL);
    CHECK_STR_CONTAINS(err.msg, "must divide the dense region");
    p = plan(dir, (setup){.dp = 4, .tp = 2, .ep = 3}, NULL, &err);
    CHECK(p == NULL);
    CHECK_STR_CONTAINS(err.msg, "dense");
    p = plan("data/golden/qwen3_moe_batched_bf16", (setup){.dp = 16, .tp = 2, .ep = 32}, NULL, &err);
    CHECK(p == NULL);
    CHECK_STR_CONTAINS(err.msg, "num_experts");
}

TEST(fused_gate_up_guard_and_packed)
{
    hp_err err;
    hp_plan *p = plan("data/golden/mixtral_batched_bf16", (setup){.tp = 2}, NULL, &err);
    CHECK(p == NULL && err.status == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "fused gate/up");
    CHECK_STR_CONTAINS(err.msg, "--packed-fused");
    p = plan("data/golden/mixtral_batched_bf16", (setup){.tp = 2, .packed = true}, NULL, &err);
    CHECK_MSG(p != NULL, "%s", err.msg);
    if (p) CHECK_STR_EQ(param_pl(p, "model.layers.0.mlp", "experts.gate_up_proj", HP_AXIS_TP), "S(1)x2");
    hp_plan_free(p);
    /* Dense fused gate/up (Phi-3 style) is refused too without the flag. */
    static const char *const names[] = {"model.layers.0.mlp.gate_up_proj.weight", "model.layers.0.mlp.down_proj.weight"};
    static const int64_t shapes[][4] = {{16, 8}, {8, 8}};
    static const int nd[] = {2, 2};
    const char *dir = write_ckpt("phi3", "{\"model_type\": \"phi3\"}", 2, names, shapes, nd);
    p = plan(dir, (setup){.tp = 2}, NULL, &err);
    CHECK(p == NULL);
    CHECK_STR_CONTAINS(err.msg, "model.layers.0.mlp.gate_up_proj.weight");
    p = plan(dir, (setup){.tp = 2, .packed = true}, NULL, &err);
    CHECK(p != NULL);
    if (p) CHECK_STR_EQ(param_pl(p, "model.layers.0.mlp", "gate_up_proj.weight", HP_AXIS_TP), "S(0)x2");
    hp_plan_free(p);
}

TEST(scenario_14_head_counts)
{
    hp_err err;
    /* q/k/v S(0) -> head counts divided by tp; mlp and norms have none; tp=1 (no tp dim) has none. */
    hp_plan *p = plan("data/configs/qwen3-30b-a3b.json", (setup){.tp = 4}, NULL, &err);
    CHECK_MSG(p != NULL, "%s", err.msg);
    if (p) {
        const hp_boundary *a = hp_plan_find(p, "model.layers.3.self_attn");
        CHECK(a && a->n_tp_attrs == 2);
        if (a && a->n_tp_attrs == 2) {
            CHECK_STR_EQ(a->tp_attrs[0].name, "num_attention_heads");
            CHECK(a->tp_attrs[0].global == 32 && a->tp_attrs[0].local == 8 && !a->tp_attrs[0].user);
            CHECK_STR_EQ(a->tp_attrs[1].name, "num_key_value_heads");
            CHECK(a->tp_attrs[1].global == 4 && a->tp_attrs[1].local == 1);
        }
        CHECK_EQ_INT(hp_plan_find(p, "model.layers.3.mlp")->n_tp_attrs, 0);
        CHECK_EQ_INT(hp_plan_find(p, "model.norm")->n_tp_attrs, 0);
    }
    hp_plan_free(p);
    /* MLA: q_b_proj S(0) is head-sharded too. */
    p = plan("data/golden/deepseek_v3_per_expert_f32", (setup){.tp = 2}, NULL, &err);
    CHECK_MSG(p != NULL, "%s", err.msg);
    if (p) {
        const hp_boundary *a = hp_plan_find(p, "model.layers.1.self_attn");
        CHECK(a && a->n_tp_attrs >= 1 && a->tp_attrs[0].local == 2);
        CHECK_EQ_INT(a ? a->n_params : 0, 5);
        CHECK_STR_EQ(param_pl(p, "model.layers.1.self_attn", "q_a_proj.weight", HP_AXIS_TP), "R");
        CHECK_STR_EQ(param_pl(p, "model.layers.1.self_attn", "kv_b_proj.weight", HP_AXIS_TP), "S(0)");
    }
    hp_plan_free(p);
    p = plan("data/configs/qwen3-30b-a3b.json", (setup){.cp = 2}, NULL, &err);
    CHECK(p != NULL);
    if (p) CHECK_EQ_INT(hp_plan_find(p, "model.layers.3.self_attn")->n_tp_attrs, 0);
    hp_plan_free(p);
}

TEST(scenario_17_only_lm_head_is_terminal)
{
    hp_err err;
    hp_plan *p = plan("data/golden/glm4_moe_batched_bf16", (setup){.tp = 2, .ep = 2}, NULL, &err);
    CHECK_MSG(p != NULL, "%s", err.msg);
    if (!p) return;
    for (size_t i = 0; i < p->n_boundaries; i++)
        CHECK_MSG(p->boundaries[i].terminal == !strcmp(p->boundaries[i].fqn, "lm_head"), "%s",
                  p->boundaries[i].fqn);
    CHECK_STR_EQ(p->boundaries[p->n_boundaries - 1].fqn, "lm_head");
    CHECK_STR_EQ(p->boundaries[0].fqn, "model.embed_tokens");
    hp_plan_free(p);
}

/* Beyond the seed: gpt-oss expert biases shard with their experts; under TP the transposed experts split
 * their output (gate_up) and input (down) dims, and the down bias is deferred. */
TEST(gpt_oss_experts_and_biases)
{
    hp_err err;
    hp_plan *p = plan("data/golden/gpt_oss_batched_f32", (setup){.tp = 2, .ep = 2}, NULL, &err);
    CHECK_MSG(p != NULL, "%s", err.msg);
    if (p) {
        const char *mlp = "model.layers.0.mlp";
        CHECK_STR_EQ(param_pl(p, mlp, "experts.gate_up_proj_bias", HP_AXIS_EP), "S(0)");
        CHECK_STR_EQ(param_pl(p, mlp, "experts.down_proj_bias", HP_AXIS_EP), "S(0)");
        CHECK_STR_EQ(param_pl(p, mlp, "experts.gate_up_proj", HP_AXIS_EP), "S(0)");
        CHECK(hp_plan_find(p, mlp)->ep_size == 2);
        CHECK(hp_plan_find(p, "model.layers.0.mlp.router") && hp_plan_find(p, "model.layers.0.mlp.router")->type == HP_BT_MOE_GATE);
        CHECK_STR_EQ(param_pl(p, "model.layers.0.self_attn", "sinks", HP_AXIS_TP), "S(0)");
    }
    hp_plan_free(p);
    p = plan("data/golden/gpt_oss_batched_f32", (setup){.tp = 2}, NULL, &err);
    CHECK_MSG(p != NULL, "%s", err.msg);
    if (p) {
        const char *mlp = "model.layers.0.mlp";
        CHECK_STR_EQ(param_pl(p, mlp, "experts.gate_up_proj", HP_AXIS_TP), "S(2)");
        CHECK_STR_EQ(param_pl(p, mlp, "experts.gate_up_proj_bias", HP_AXIS_TP), "S(1)");
        CHECK_STR_EQ(param_pl(p, mlp, "experts.down_proj", HP_AXIS_TP), "S(1)");
        CHECK_STR_EQ(param_pl(p, mlp, "experts.down_proj_bias", HP_AXIS_TP), "R");
        const hp_boundary *b = hp_plan_find(p, mlp);
        CHECK(b && b->n_deferred == 1 && !strcmp(b->deferred_biases[0], "experts.down_proj_bias"));
    }
    hp_plan_free(p);
}

static const char *g_configs[] = {"mixtral-8x7b.json", "qwen1.5-moe-a2.7b.json", "qwen3-30b-a3b.json", "deepseek-v3.json",
                                  "glm-4.5-air.json", "llama-3-8b.json", "qwen2.5-7b.json", "gpt-oss-20b.json"};

/* Every trainable parameter is covered (the lint would fail otherwise) and every boundary parameter exists. */
TEST(real_configs_plan_at_tp_2_4_8_and_with_ep)
{
    for (size_t c = 0; c < sizeof g_configs / sizeof *g_configs; c++) {
        char path[128];
        snprintf(path, sizeof path, "data/configs/%s", g_configs[c]);
        for (int layout = 0; layout < 2; layout++) {
            hp_model_opts mo = {.layout = layout ? HP_LAYOUT_BATCHED : HP_LAYOUT_PER_EXPERT};
            hp_model *m = NULL;
            hp_err err;
            CHECK(hp_model_open(&m, path, &mo, &err) == HP_OK);
            if (!m) continue;
            int64_t tps[] = {2, 4, 8};
            for (int t = 0; t < 3; t++) {
                int64_t tp = tps[t];
                if (m->cfg.num_attention_heads % tp || m->cfg.num_key_value_heads % tp) continue;
                for (int with_ep = 0; with_ep < 2; with_ep++) {
                    if (with_ep && !m->cfg.n_experts) continue;
                    hp_plan_opts po;
                    hp_plan_opts_default(&po);
                    po.packed_fused = true; /* Mixtral batched gate_up under TP */
                    int64_t E = m->cfg.n_experts, ep = 1;
                    if (with_ep) ep = E % (2 * tp) == 0 ? 2 * tp : E % tp == 0 ? tp : 2;
                    hp_mesh_from_sizes(&po.mesh, 2, 1, tp, ep, false);
                    hp_plan *p = NULL;
                    CHECK_MSG(hp_plan_derive(&p, m, &po, &err) == HP_OK, "%s layout %d tp %lld ep %d: %s", path, layout,
                              (long long)tp, with_ep, err.msg);
                    if (!p) continue;
                    for (size_t i = 0; i < m->n_params; i++)
                        CHECK_MSG(hp_plan_param_placement(p, m->params[i].name, NULL) != NULL, "%s: %s uncovered",
                                  path, m->params[i].name);
                    if (with_ep)
                        for (size_t i = 0; i < p->n_boundaries; i++)
                            if (p->boundaries[i].type == HP_BT_MOE_MLP) CHECK(p->boundaries[i].ep_size == ep);
                    hp_plan_free(p);
                }
            }
            hp_model_close(m);
        }
    }
}

/* transformers' newest base_model_tp_plan (hf_reference §2.4 A): colwise -> S(0), rowwise -> S(1). */
TEST(agrees_with_transformers_base_model_tp_plan)
{
    static const struct {
        const char *config, *module, *style;
    } hf[] = {
        {"llama-3-8b.json", "self_attn.q_proj", "colwise"}, {"llama-3-8b.json", "self_attn.k_proj", "colwise"},
        {"llama-3-8b.json", "self_attn.v_proj", "colwise"}, {"llama-3-8b.json", "self_attn.o_proj", "rowwise"},
        {"llama-3-8b.json", "mlp.gate_proj", "colwise"},    {"llama-3-8b.json", "mlp.up_proj", "colwise"},
        {"llama-3-8b.json", "mlp.down_proj", "rowwise"},    {"qwen2.5-7b.json", "self_attn.q_proj", "colwise"},
        {"qwen2.5-7b.json", "self_attn.o_proj", "rowwise"}, {"qwen2.5-7b.json", "mlp.down_proj", "rowwise"},
        {"mixtral-8x7b.json", "self_attn.q_proj", "colwise"}, {"mixtral-8x7b.json", "self_attn.o_proj", "rowwise"},
        {"qwen3-30b-a3b.json", "self_attn.q_proj", "colwise"}, {"qwen3-30b-a3b.json", "self_attn.o_proj", "rowwise"},
        {"qwen1.5-moe-a2.7b.json", "self_attn.v_proj", "colwise"},
        {"qwen1.5-moe-a2.7b.json", "mlp.shared_expert.gate_proj", "colwise"},
        {"qwen1.5-moe-a2.7b.json", "mlp.shared_expert.down_proj", "rowwise"},
        {"deepseek-v3.json", "self_attn.q_b_proj", "colwise"}, {"deepseek-v3.json", "self_attn.kv_b_proj", "colwise"},
        {"deepseek-v3.json", "self_attn.o_proj", "rowwise"},   {"deepseek-v3.json", "mlp.shared_experts.gate_proj", "colwise"},
        {"deepseek-v3.json", "mlp.shared_experts.down_proj", "rowwise"}, {"deepseek-v3.json", "mlp.gate_proj", "colwise"},
        {"glm-4.5-air.json", "self_attn.k_proj", "colwise"}, {"glm-4.5-air.json", "self_attn.o_proj", "rowwise"},
        {"glm-4.5-air.json", "mlp.shared_experts.up_proj", "colwise"},
        {"gpt-oss-20b.json", "self_attn.q_proj", "colwise"}, {"gpt-oss-20b.json", "self_attn.o_proj", "rowwise"},
    };
    const char *last = NULL;
    hp_model *m = NULL;
    hp_plan *p = NULL;
    for (size_t i = 0; i < sizeof hf / sizeof *hf; i++) {
        hp_err err;
        if (!last || strcmp(last, hf[i].config)) {
            done(p, m);
            p = NULL;
            m = NULL;
            char path[128];
            snprintf(path, sizeof path, "data/configs/%s", hf[i].config);
            CHECK(hp_model_open(&m, path, NULL, &err) == HP_OK);
            hp_plan_opts po;
            hp_plan_opts_default(&po);
            hp_mesh_from_sizes(&po.mesh, 1, 1, 2, 1, false);
            if (m) CHECK_MSG(hp_plan_derive(&p, m, &po, &err) == HP_OK, "%s: %s", path, err.msg);
            last = hf[i].config;
        }
        if (!p) continue;
        /* the last layer has every module kind (DeepSeek's dense mlp lives in layer 0) */
        char fqn[256];
        int64_t layer = strstr(hf[i].module, "mlp.gate_proj") ? 0 : m->cfg.num_hidden_layers - 1;
        snprintf(fqn, sizeof fqn, "model.layers.%lld.%s.weight", (long long)layer, hf[i].module);
        hp_nplace np;
        CHECK_MSG(hp_plan_param_placement(p, fqn, &np) != NULL, "%s not declared", fqn);
        const char *want = strcmp(hf[i].style, "colwise") == 0 ? "S(0)" : "S(1)";
        CHECK_MSG(!strcmp(pl(np.ax[HP_AXIS_TP]), want), "%s %s: %s, transformers says %s", hf[i].config, fqn,
                  pl(np.ax[HP_AXIS_TP]), hf[i].style);
    }
    done(p, m);
}

TEST(deterministic_json)
{
    hp_err err;
    hp_buf a, b;
    hp_buf_init(&a);
    hp_buf_init(&b);
    for (int k = 0; k < 2; k++) {
        hp_model *m = NULL;
        hp_plan *p = plan("data/golden/deepseek_v3_per_expert_f32", (setup){.tp = 2, .ep = 4, .dp = 2}, &m, &err);
        CHECK_MSG(p != NULL, "%s", err.msg);
        if (p) CHECK(hp_plan_to_json(p, k ? &b : &a, &err) == HP_OK);
        done(p, m);
    }
    CHECK(a.len > 1000 && a.len == b.len && memcmp(a.data, b.data, a.len) == 0);
    hp_buf_free(&a);
    hp_buf_free(&b);
    hp_model_close(g_kept_model);
    g_kept_model = NULL;
}

TEST_MAIN()
