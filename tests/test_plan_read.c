/*
 * test_plan_read.c — the plan reader (`shard --plan`, src/shard/plan_read.c) against hand-edited plans: every
 * field it accepts must be one the writer (src/plan/plan_json.c) can produce and agree with the rest of the
 * plan (issue 10, item 15). Each case starts from a plan `hyperpar plan` wrote for a golden checkpoint,
 * changes one thing, and checks the status, the JSON path and a stable part of the reason. The writer's own
 * plans, on every golden and several meshes, must still read back.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperpar/overrides.h"
#include "shard/shard_int.h"
#include "testlib.h"

typedef struct fx {
    hp_model *m;
    json_t *j; /* the writer's plan */
} fx;

/* Plans golden for mesh (a --mesh spec) with TP-extend ep (1: none). */
static fx make(const char *golden, const char *mesh, int64_t ep, bool packed)
{
    fx f = {0};
    char dir[256];
    hp_err err;
    snprintf(dir, sizeof dir, "data/golden/%s", golden);
    CHECK_MSG(hp_model_open(&f.m, dir, NULL, &err) == HP_OK, "%s", err.msg);
    if (!f.m) return f;
    hp_plan_opts po;
    hp_plan_opts_default(&po);
    po.packed_fused = packed;
    CHECK_MSG(hp_mesh_parse(mesh, &po.mesh, &err) == HP_OK, "%s", err.msg);
    if (!po.mesh.ep_axis) po.mesh.ep = ep;
    hp_plan *p = NULL;
    CHECK_MSG(hp_plan_derive(&p, f.m, &po, &err) == HP_OK, "%s %s: %s", golden, mesh, err.msg);
    hp_buf b;
    hp_buf_init(&b);
    if (p) CHECK(hp_plan_to_json(p, &b, &err) == HP_OK);
    json_error_t je;
    f.j = b.data ? json_loadb(b.data, b.len, 0, &je) : NULL;
    CHECK(f.j != NULL);
    hp_buf_free(&b);
    hp_plan_free(p);
    return f;
}

static void done(fx *f)
{
    json_decref(f->j);
    hp_model_close(f->m);
}

static hp_status read_back(const fx *f, const json_t *j, hp_err *err)
{
    char *text = json_dumps(j, JSON_PRESERVE_ORDER);
    hp_plan *p = (hp_plan *)&text; /* must come back NULL on failure */
    hp_status st = text ? hp__shard_plan_parse(&p, f->m, text, strlen(text), "plan.json", err) : HP_ERR_NOMEM;
    if (st != HP_OK) CHECK(p == NULL);
    if (st == HP_OK) CHECK(hp_plan_preflight(p, NULL, err) == HP_OK || err->status == HP_ERR_INPUT);
    if (st == HP_OK) hp_plan_free(p);
    free(text);
    return st;
}

/* j is consumed. */
static void refused(const fx *f, json_t *j, const char *needle, int line)
{
    hp_err err;
    err.msg[0] = '\0';
    hp_status st = read_back(f, j, &err);
    if (st != HP_ERR_INPUT || !strstr(err.msg, needle)) {
        fprintf(stderr, "  line %d: status %d, message: %s\n  expected: %s\n", line, (int)st, err.msg, needle);
        hp__failed_checks++;
    }
    json_decref(j);
}
#define REFUSED(j, needle) refused(&f, (j), (needle), __LINE__)

static json_t *bd(json_t *j, size_t i) { return json_array_get(json_object_get(j, "boundaries"), i); }
static json_t *params(json_t *j, size_t i) { return json_object_get(bd(j, i), "params"); }
static json_t *mesh(json_t *j) { return json_object_get(j, "mesh"); }

/* The index of the boundary with this fqn. */
static size_t find(json_t *j, const char *fqn)
{
    json_t *bds = json_object_get(j, "boundaries");
    for (size_t i = 0; i < json_array_size(bds); i++)
        if (!strcmp(json_string_value(json_object_get(json_array_get(bds, i), "fqn")), fqn)) return i;
    CHECK_MSG(0, "no boundary %s", fqn);
    return 0;
}

static void set_pl(json_t *j, size_t b, const char *param, const char *axis, const char *pl)
{
    json_object_set_new(json_object_get(params(j, b), param), axis, json_string(pl));
}

TEST(writer_plans_read_back)
{
    static const struct {
        const char *golden, *mesh;
        int64_t ep;
        bool packed;
    } cases[] = {
        {"qwen3_moe_batched_bf16", "tp=2", 1, true},      {"qwen3_moe_batched_bf16", "dp=1,cp=1,tp=2", 2, false},
        {"qwen3_moe_batched_bf16", "tp=2,ep=2", 1, true},  {"qwen3_moe_batched_bf16", "dp=2,cp=2,tp=2", 1, true},
        {"qwen2_moe_per_expert_f32", "dp=2,tp=2", 4, false}, {"qwen2_moe_per_expert_f32", "tp=2,ep=2", 1, false},
        {"mixtral_per_expert_f32", "dp=2,tp=2", 2, false}, {"mixtral_batched_bf16", "tp=2", 1, true},
        {"deepseek_v3_per_expert_f32", "tp=2", 2, false}, {"glm4_moe_batched_bf16", "tp=2", 2, false},
        {"gpt_oss_batched_f32", "tp=2", 2, false},          {"mixtral_per_expert_f32", "dp=4", 1, false},
        {"qwen3_moe_batched_bf16", "cp=2", 1, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        fx f = make(cases[i].golden, cases[i].mesh, cases[i].ep, cases[i].packed);
        hp_err err;
        if (f.j) CHECK_MSG(read_back(&f, f.j, &err) == HP_OK, "%s %s ep %lld: %s", cases[i].golden, cases[i].mesh,
                           (long long)cases[i].ep, err.msg);
        done(&f);
    }
}

TEST(placement_axes)
{
    fx f = make("qwen2_moe_per_expert_f32", "tp=2", 1, false);
    if (!f.j) return;
    json_t *j;
    /* An axis a placement map cannot hold was skipped. */
    j = json_deep_copy(f.j);
    set_pl(j, 0, "weight", "xx", "S(0)");
    REFUSED(j, "boundaries[0].params.weight: unknown axis 'xx' in a placement map");
    j = json_deep_copy(f.j);
    set_pl(j, 0, "weight", "dp", "R");
    REFUSED(j, "unknown axis 'dp'");
    /* ep on a plan without expert parallelism. */
    j = json_deep_copy(f.j);
    set_pl(j, 0, "weight", "ep", "S(0)");
    REFUSED(j, "boundaries[0].params.weight: an 'ep' placement, but the plan has no expert parallelism");
    /* cp is not a plan axis. */
    j = json_deep_copy(f.j);
    set_pl(j, 0, "weight", "cp", "R");
    REFUSED(j, "a 'cp' placement, but 'cp' is not in mesh_dim_names");
    /* Shard dims must fit the tensor; "S(d)x2" is tp's. */
    j = json_deep_copy(f.j);
    set_pl(j, 0, "weight", "tp", "S(5)");
    REFUSED(j, "tp placement S(5) is out of range for a 2-dim tensor");
    j = json_deep_copy(f.j);
    set_pl(j, 0, "weight", "tp", "S(-3)");
    REFUSED(j, "out of range for a 2-dim tensor");
    /* The I/O contracts are placement maps too. */
    j = json_deep_copy(f.j);
    json_object_set_new(json_object_get(json_object_get(bd(j, 1), "in_src"), "hidden_states"), "qq",
                        json_string("R"));
    REFUSED(j, "boundaries[1].in_src.hidden_states: unknown axis 'qq'");
    j = json_deep_copy(f.j);
    json_object_set_new(bd(j, 1), "out_src", json_string("auto"));
    REFUSED(j, "boundaries[1].out_src: expected null or {name: {axis: placement}}");
    done(&f);
}

TEST(ep_placements_and_sizes)
{
    fx f = make("qwen3_moe_batched_bf16", "dp=1,cp=1,tp=2", 2, false); /* TP-extend-EP */
    if (!f.j) return;
    size_t mlp = find(f.j, "model.layers.0.mlp");
    json_t *j;
    j = json_deep_copy(f.j);
    set_pl(j, 0, "weight", "ep", "S(0)"); /* embed_tokens is not EP-marked */
    REFUSED(j, "an 'ep' Shard on a boundary whose ep_size is 0");
    j = json_deep_copy(f.j);
    set_pl(j, 0, "weight", "ep", "R");
    REFUSED(j, "an 'ep' placement other than S(d) on a TP-extend-EP plan");
    j = json_deep_copy(f.j);
    set_pl(j, mlp, "experts.gate_up_proj", "ep", "S(0)x2");
    REFUSED(j, "\"S(d)x2\" (packed fused halves) is a tp placement, not a ep one");
    j = json_deep_copy(f.j);
    json_object_set_new(bd(j, mlp), "ep_size", json_integer(4));
    REFUSED(j, "ep_size 4, but mesh.ep differs");
    /* mesh.ep / ep_mode / world agree with the axes. */
    j = json_deep_copy(f.j);
    json_object_set_new(mesh(j), "ep_mode", json_string("none"));
    REFUSED(j, "mesh.ep_mode: \"none\" with ep 2 and no ep axis; it is \"tp-extend-ep\"");
    j = json_deep_copy(f.j);
    json_object_set_new(mesh(j), "ep_mode", json_string("bogus"));
    REFUSED(j, "mesh.ep_mode");
    j = json_deep_copy(f.j);
    json_object_set_new(mesh(j), "ep", json_integer(3));
    REFUSED(j, "mesh.ep: ep 3 does not divide the dense region (world 2)");
    j = json_deep_copy(f.j);
    json_object_set_new(mesh(j), "world", json_integer(7));
    REFUSED(j, "mesh.world: 7, but the product of mesh.dims sizes is 2");
    j = json_deep_copy(f.j);
    json_object_set_new(mesh(j), "world", json_string("2"));
    REFUSED(j, "mesh.world: not an integer");
    done(&f);

    f = make("qwen2_moe_per_expert_f32", "tp=2,ep=2", 1, false); /* an ep axis; stacks */
    if (!f.j) return;
    mlp = find(f.j, "model.layers.0.mlp");
    j = json_deep_copy(f.j);
    json_object_set_new(mesh(j), "ep", json_integer(4));
    REFUSED(j, "mesh.ep: 4, but the ep mesh axis has size 2");
    j = json_deep_copy(f.j);
    set_pl(j, mlp, "experts.gate_proj", "ep", "S(1)");
    REFUSED(j, "its ep placement must be S(0)");
    j = json_deep_copy(f.j);
    json_object_set_new(bd(j, mlp), "ep_size", json_integer(2));
    REFUSED(j, "the plan uses an ep mesh axis");
    done(&f);
}

TEST(mesh_dim_names_follow_the_mesh)
{
    fx f = make("qwen2_moe_per_expert_f32", "tp=2", 1, false);
    if (!f.j) return;
    json_t *j = json_deep_copy(f.j);
    json_object_set_new(j, "mesh_dim_names", json_pack("[s]", "cp"));
    REFUSED(j, "mesh_dim_names: [cp], but the mesh's tp/cp/ep axes of size > 1, in mesh order, are [tp]");
    j = json_deep_copy(f.j);
    json_object_set_new(j, "mesh_dim_names", json_pack("[ss]", "tp", "tp"));
    REFUSED(j, "mesh_dim_names: [tp,tp]");
    j = json_deep_copy(f.j);
    json_object_set_new(j, "mesh_dim_names", json_array());
    REFUSED(j, "mesh_dim_names: [], but");
    /* A pp axis must be the outermost and come with the pipeline's stages; a pipeline without one is refused. */
    j = json_deep_copy(f.j);
    json_array_append_new(json_object_get(mesh(j), "dims"), json_pack("{s:s,s:i}", "name", "pp", "size", 2));
    json_object_set_new(mesh(j), "world", json_integer(4));
    REFUSED(j, "pp is not the first (outermost) axis");
    j = json_deep_copy(f.j);
    json_array_insert_new(json_object_get(mesh(j), "dims"), 0, json_pack("{s:s,s:i}", "name", "pp", "size", 2));
    json_object_set_new(mesh(j), "world", json_integer(4));
    REFUSED(j, "pipeline: missing or not");
    j = json_deep_copy(f.j);
    json_object_set_new(j, "pipeline", json_pack("{s:i}", "pp", 2));
    REFUSED(j, "pipeline: present, but the mesh has no pp axis");
    done(&f);
}

TEST(boundaries_cover_once)
{
    fx f = make("qwen2_moe_per_expert_f32", "tp=2", 1, false);
    if (!f.j) return;
    json_t *j = json_deep_copy(f.j);
    json_object_set_new(j, "boundaries", json_array());
    REFUSED(j, "plan.json: boundaries: empty; a plan without boundaries shards nothing");
    j = json_deep_copy(f.j);
    json_t *bds = json_object_get(j, "boundaries");
    for (size_t i = 0; i < json_array_size(bds); i++) json_object_set_new(json_array_get(bds, i), "params", json_object());
    REFUSED(j, "no boundary declares a parameter");
    /* The same boundary twice. */
    j = json_deep_copy(f.j);
    json_array_append_new(json_object_get(j, "boundaries"), json_deep_copy(bd(j, 1)));
    REFUSED(j, "fqn 'model.layers.0.self_attn' is also the fqn of boundaries[1]");
    /* A parameter declared by two boundaries (an ancestor names it too). */
    j = json_deep_copy(f.j);
    json_array_append_new(json_object_get(j, "boundaries"),
                          json_pack("{s:s,s:s,s:{s:{s:s}}}", "fqn", "model.layers.0", "type", "custom", "params",
                                    "input_layernorm.weight", "tp", "R"));
    REFUSED(j, "parameter 'model.layers.0.input_layernorm.weight' is declared by this boundary ('model.layers.0') "
               "and by boundaries[");
    /* A removed boundary (or a parameter removed from one) leaves trainable parameters uncovered: refused,
     * unless the plan says it was made with --allow-uncovered. */
    j = json_deep_copy(f.j);
    json_array_remove(json_object_get(j, "boundaries"), find(j, "model.layers.0.self_attn"));
    REFUSED(j, "parameter 'model.layers.0.self_attn.q_proj.weight' is declared by no boundary");
    j = json_deep_copy(f.j);
    json_object_del(params(j, find(j, "model.layers.0.self_attn")), "o_proj.weight");
    REFUSED(j, "parameter 'model.layers.0.self_attn.o_proj.weight' is declared by no boundary");
    j = json_deep_copy(f.j);
    json_array_remove(json_object_get(j, "boundaries"), find(j, "model.layers.0.self_attn"));
    json_object_set_new(j, "allow_uncovered_params", json_true());
    {
        hp_err err;
        CHECK_MSG(read_back(&f, j, &err) == HP_OK, "%s", err.msg);
    }
    json_decref(j);
    j = json_deep_copy(f.j);
    json_object_set_new(j, "allow_uncovered_params", json_string("yes"));
    REFUSED(j, "allow_uncovered_params: expected true or false");
    /* fqn and type name real things. */
    j = json_deep_copy(f.j);
    json_object_set_new(bd(j, 0), "fqn", json_string("model.embed"));
    REFUSED(j, "does not match the checkpoint");
    j = json_deep_copy(f.j);
    json_object_set_new(bd(j, 0), "type", json_string("embedding"));
    REFUSED(j, "boundaries[0].type: not a boundary type");
    j = json_deep_copy(f.j);
    json_object_set_new(bd(j, 0), "terminal", json_string("no"));
    REFUSED(j, "boundaries[0].terminal: expected true or false");
    j = json_deep_copy(f.j);
    json_object_set_new(bd(j, 0), "local_compute_fn", json_pack("{s:b}", "fix_router", 1));
    REFUSED(j, "boundaries[0].local_compute_fn: expected null or");
    j = json_deep_copy(f.j);
    json_object_set_new(bd(j, 0), "deferred_biases", json_pack("[i]", 3));
    REFUSED(j, "boundaries[0].deferred_biases: expected an array of parameter names");
    done(&f);
}

TEST(top_level_fields_have_the_writers_types)
{
    fx f = make("qwen2_moe_per_expert_f32", "tp=2", 1, false);
    if (!f.j) return;
    json_t *j = json_deep_copy(f.j);
    json_object_set_new(j, "sequence_parallel", json_string("yes"));
    REFUSED(j, "plan.json: sequence_parallel: expected true or false");
    j = json_deep_copy(f.j);
    json_object_set_new(json_object_get(j, "param_roles"), "lm_head.weight", json_string("HEAD"));
    REFUSED(j, "param_roles.lm_head.weight: not a role name");
    j = json_deep_copy(f.j);
    json_object_set_new(json_object_get(j, "model"), "num_tensors", json_integer(3));
    REFUSED(j, "model.num_tensors: the plan counts 3 tensors");
    j = json_deep_copy(f.j);
    json_object_set_new(j, "warnings", json_string("none"));
    REFUSED(j, "warnings: expected an array");
    done(&f);
}

TEST_MAIN()
