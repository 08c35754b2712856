/*
 * test_plan_output.c — the plan's three outputs: plan JSON (plan_json.c), the explain report (explain.c)
 * and the transformers-style plan (hf.c).
 *
 * Most tests build hp_plan values by hand (static arrays, no planner), so each output is checked against a
 * contract we wrote down ourselves; the last tests derive plans for the qwen3_moe golden checkpoint and
 * check the outputs of the real pipeline.
 */
#include <jansson.h>

#include "hyperpar/overrides.h"
#include "hyperpar/plan.h"
#include "testlib.h"

/* ---- hand-built plans ---- */

#define R_ {HP_PL_R, 0}
#define P_ {HP_PL_P, 0}
#define S0 {HP_PL_S, 0}
#define S1 {HP_PL_S, 1}
#define SM1 {HP_PL_S, -1}
#define NA {HP_PL_ABSENT, 0}
#define S1X2 {HP_PL_S2, 1}
/* A NamedPlacement {tp, cp, ep}. */
#define NP(t, c, e) {{t, c, e}}

static hp_io_map io1(const char *name, hp_nplace pl)
{
    hp_io_map m = {.is_null = false, .n = 1};
    snprintf(m.e[0].name, sizeof m.e[0].name, "%s", name);
    m.e[0].pl = pl;
    return m;
}

static const hp_io_map io_null = {.is_null = true};

static hp_param_spec embed_params[] = {{"weight", NP(S0, R_, NA), 0}};
static hp_param_spec attn_params[] = {
    {"q_proj.weight", NP(S0, R_, NA), 0}, {"k_proj.weight", NP(S0, R_, NA), 0}, {"v_proj.weight", NP(S0, R_, NA), 0},
    {"o_proj.weight", NP(S1, R_, NA), 0}, {"o_proj.bias", NP(R_, R_, NA), 0},
};
static const char *attn_deferred[] = {"o_proj.bias"};
static hp_tp_attr attn_attrs[] = {{"num_attention_heads", 8, 4, false}, {"num_key_value_heads", 4, 2, false}};
static hp_param_spec norm_params[] = {{"weight", NP(R_, R_, NA), 0}};
static hp_param_spec lm_params[] = {{"weight", NP(S0, R_, NA), 0}};
static hp_param_spec enc_params[] = {{"proj.weight", NP(R_, NA, NA), 0}};

static hp_boundary attention(const char *fqn, bool sp)
{
    hp_boundary b = {.fqn = fqn, .type = HP_BT_ATTENTION, .module = -1, .is_boundary = true, .needs_cp_attn = true};
    b.n_params = 5, b.params = attn_params;
    b.in_src = io1("hidden_states", sp ? (hp_nplace)NP(S1, S1, R_) : (hp_nplace)NP(R_, S1, R_));
    b.in_dst = io1("hidden_states", (hp_nplace)NP(R_, S1, R_));
    b.out_src = io1("output", (hp_nplace)NP(P_, S1, R_));
    b.out_dst = io1("output", sp ? (hp_nplace)NP(S1, S1, R_) : (hp_nplace)NP(R_, S1, R_));
    b.n_deferred = 1, b.deferred_biases = attn_deferred;
    b.n_tp_attrs = 2, b.tp_attrs = attn_attrs;
    b.region_dispatch = -1;
    return b;
}

static hp_boundary norm(const char *fqn, bool sp)
{
    hp_boundary b = {.fqn = fqn, .type = HP_BT_NORM, .module = -1, .is_boundary = true, .region_dispatch = -1};
    b.n_params = 1, b.params = norm_params;
    hp_nplace pl = sp ? (hp_nplace)NP(S1, S1, R_) : (hp_nplace)NP(R_, S1, R_);
    b.in_src = b.in_dst = io1("hidden_states", pl);
    b.out_src = b.out_dst = io1("output", pl);
    return b;
}

/* A dense two-layer toy under mesh (tp=2), plus a parameter-only encoder spec with null out fields. */
typedef struct toy {
    hp_boundary b[7];
    hp_plan p;
} toy;

static void toy_init(toy *t, bool sp, bool loss_parallel)
{
    memset(t, 0, sizeof *t);
    hp_boundary *b = t->b;
    b[0] = (hp_boundary){.fqn = "model.embed_tokens", .type = HP_BT_EMBED, .module = -1, .is_boundary = true,
                         .region_dispatch = -1, .n_params = 1, .params = embed_params};
    b[0].in_src = b[0].in_dst = io1("input", (hp_nplace)NP(R_, S1, R_));
    b[0].out_src = io1("output", (hp_nplace)NP(P_, S1, R_));
    b[0].out_dst = io1("output", sp ? (hp_nplace)NP(S1, S1, R_) : (hp_nplace)NP(R_, S1, R_));
    b[1] = norm("model.layers.0.input_layernorm", sp);
    b[2] = attention("model.layers.0.self_attn", sp);
    b[3] = norm("model.layers.1.input_layernorm", sp);
    b[4] = attention("model.layers.1.self_attn", sp);
    b[5] = (hp_boundary){.fqn = "lm_head", .type = HP_BT_LM_HEAD, .module = -1, .is_boundary = true,
                         .terminal = true, .region_dispatch = -1, .n_params = 1, .params = lm_params};
    b[5].in_src = io1("hidden_states", sp ? (hp_nplace)NP(S1, R_, R_) : (hp_nplace)NP(R_, R_, R_));
    b[5].in_dst = io1("hidden_states", (hp_nplace)NP(R_, R_, R_));
    b[5].out_src = io1("output", (hp_nplace)NP(SM1, R_, R_));
    b[5].out_dst = io1("output", loss_parallel ? (hp_nplace)NP(SM1, R_, R_) : (hp_nplace)NP(R_, R_, R_));
    b[6] = (hp_boundary){.fqn = "encoder", .type = HP_BT_UNKNOWN, .module = -1, .is_boundary = false,
                         .region_dispatch = -1, .n_params = 1, .params = enc_params};
    b[6].out_src = b[6].out_dst = io_null;

    hp_plan *p = &t->p;
    p->mesh.n_dims = 2;
    snprintf(p->mesh.names[0], sizeof p->mesh.names[0], "dp");
    snprintf(p->mesh.names[1], sizeof p->mesh.names[1], "tp");
    p->mesh.sizes[0] = 1, p->mesh.sizes[1] = 2;
    p->n_dims = 1, p->dims[0] = HP_AXIS_TP;
    p->tp = 2, p->cp = 1, p->ep = 1;
    p->sequence_parallel = sp, p->loss_parallel = loss_parallel;
    p->n_boundaries = 7, p->boundaries = t->b;
    static const char *warnings[] = {"No template for boundary_type=unknown at encoder"};
    p->n_warnings = 1, p->warnings = warnings;
    static hp_special special[] = {{"model.layers.0.self_attn.A_log", "gated_delta_tp_shard"}};
    p->n_special = 1, p->special = special;
    p->n_tied = 1, p->tied[0][0] = "model.embed_tokens.weight", p->tied[0][1] = "lm_head.weight";
}

/* The output of one call as a NUL-terminated string (caller frees). */
static char *render(int which, const hp_plan *p, const char *fqn)
{
    hp_buf b;
    hp_err err;
    hp_buf_init(&b);
    hp_status st = which == 0 ? hp_plan_to_json(p, &b, &err) : which == 1 ? hp_plan_explain(p, fqn, &b, &err)
                                                                          : hp_plan_to_hf(p, &b, &err);
    CHECK_EQ_INT(st, HP_OK);
    hp_buf_append(&b, "", 1);
    return b.data;
}

/* The transformers export for release version (NULL: the default) as a NUL-terminated string (caller frees). */
static char *render_hf(const hp_plan *p, const char *version)
{
    hp_buf b;
    hp_err err;
    hp_buf_init(&b);
    hp_status st = hp_plan_to_hf_target(p, version, &b, &err);
    CHECK_MSG(st == HP_OK, "%s", err.msg);
    hp_buf_append(&b, "", 1);
    return b.data;
}

static json_t *parse(const char *text)
{
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    CHECK_MSG(j != NULL, "JSON does not parse: %s (line %d)", je.text, je.line);
    return j;
}

/* The report section of boundary fqn: from "[fqn]" to the next line starting with '['. */
static char *section(const char *report, const char *fqn)
{
    char head[128];
    snprintf(head, sizeof head, "\n[%s]\n", fqn);
    const char *s = strstr(report, head);
    if (!s) return strdup("");
    const char *e = strstr(s + strlen(head), "\n[");
    size_t n = e ? (size_t)(e - s) + 1 : strlen(s);
    char *out = malloc(n + 1);
    memcpy(out, s, n);
    out[n] = '\0';
    return out;
}

/* ---- plan JSON ---- */

TEST(json_top_level_keys_in_order)
{
    toy t;
    toy_init(&t, true, false);
    char *text = render(0, &t.p, NULL);
    json_t *j = parse(text);
    static const char *const keys[] = {"format", "version", "model", "mesh", "mesh_dim_names", "sequence_parallel",
                                       "loss_parallel", "boundaries", "special_handlers", "tied_pairs",
                                       "param_roles", "warnings"};
    const char *k;
    json_t *v;
    size_t i = 0;
    json_object_foreach(j, k, v) {
        CHECK_MSG(i < 12 && strcmp(k, keys[i]) == 0, "key %zu is '%s'", i, k);
        i++;
    }
    CHECK_EQ_INT(i, 12);
    CHECK_STR_EQ(json_string_value(json_object_get(j, "format")), "hyperpar-plan");
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "version")), 1);
    CHECK(json_is_null(json_object_get(j, "model")));
    json_t *mesh = json_object_get(j, "mesh");
    CHECK_EQ_INT(json_integer_value(json_object_get(mesh, "world")), 2);
    CHECK_STR_EQ(json_string_value(json_object_get(mesh, "ep_mode")), "none");
    CHECK_STR_EQ(json_string_value(json_object_get(json_array_get(json_object_get(mesh, "dims"), 1), "name")), "tp");
    CHECK_STR_EQ(json_string_value(json_array_get(json_object_get(j, "mesh_dim_names"), 0)), "tp");
    CHECK_STR_EQ(json_string_value(json_array_get(json_array_get(json_object_get(j, "tied_pairs"), 0), 1)),
                 "lm_head.weight");
    CHECK_STR_EQ(json_string_value(json_object_get(json_object_get(j, "special_handlers"),
                                                   "model.layers.0.self_attn.A_log")),
                 "gated_delta_tp_shard");
    CHECK_EQ_INT(json_array_size(json_object_get(j, "warnings")), 1);
    CHECK(text[strlen(text) - 1] == '\n');
    json_decref(j);
    free(text);
}

TEST(json_boundary_fields)
{
    toy t;
    toy_init(&t, true, false);
    char *text = render(0, &t.p, NULL);
    json_t *j = parse(text);
    json_t *bs = json_object_get(j, "boundaries");
    CHECK_EQ_INT(json_array_size(bs), 7);
    json_t *attn = json_array_get(bs, 2);
    static const char *const keys[] = {"fqn", "type", "is_boundary", "terminal", "params", "in_src", "in_dst",
                                       "out_src", "out_dst", "ep_size", "ep_stack", "deferred_biases",
                                       "tp_local_attrs", "local_compute_fn", "region_dispatch", "needs_cp_attn"};
    const char *k;
    json_t *v;
    size_t i = 0;
    json_object_foreach(attn, k, v) {
        CHECK_MSG(i < 16 && strcmp(k, keys[i]) == 0, "boundary key %zu is '%s'", i, k);
        i++;
    }
    CHECK_EQ_INT(i, 16);
    CHECK_STR_EQ(json_string_value(json_object_get(attn, "type")), "attention");
    /* Placement maps hold only the plan dims (tp here): cp and ep entries are not written. */
    json_t *q = json_object_get(json_object_get(attn, "params"), "q_proj.weight");
    CHECK_STR_EQ(json_string_value(json_object_get(q, "tp")), "S(0)");
    CHECK_EQ_INT(json_object_size(q), 1);
    CHECK_STR_EQ(json_string_value(json_object_get(json_object_get(json_object_get(attn, "out_src"), "output"), "tp")),
                 "P");
    CHECK_STR_EQ(json_string_value(json_array_get(json_object_get(attn, "deferred_biases"), 0)), "o_proj.bias");
    json_t *heads = json_object_get(json_object_get(attn, "tp_local_attrs"), "num_attention_heads");
    CHECK_EQ_INT(json_integer_value(json_object_get(heads, "global")), 8);
    CHECK_EQ_INT(json_integer_value(json_object_get(heads, "local")), 4);
    CHECK_STR_EQ(json_string_value(json_object_get(heads, "source")), "auto");
    CHECK(json_is_null(json_object_get(attn, "local_compute_fn")));
    CHECK(json_is_null(json_object_get(attn, "region_dispatch")));
    CHECK(json_is_true(json_object_get(attn, "needs_cp_attn")));
    json_t *lm = json_array_get(bs, 5);
    CHECK_STR_EQ(json_string_value(json_object_get(json_object_get(json_object_get(lm, "out_src"), "output"), "tp")),
                 "S(-1)");
    CHECK(json_is_true(json_object_get(lm, "terminal")));
    json_t *enc = json_array_get(bs, 6);
    CHECK(json_is_null(json_object_get(enc, "out_src")));
    CHECK(json_is_null(json_object_get(enc, "out_dst")));
    CHECK(json_is_false(json_object_get(enc, "is_boundary")));
    CHECK_EQ_INT(json_object_size(json_object_get(enc, "in_src")), 0);
    json_decref(j);
    free(text);
}

TEST(json_ep_and_packed_placements)
{
    static hp_param_spec moe_params[] = {{"gate.weight", NP(R_, NA, NA), 0},
                                         {"experts.gate_up_proj", NP(NA, NA, S0), 0},
                                         {"experts.down_proj", NP(S1X2, NA, NA), 0}};
    hp_boundary b = {.fqn = "model.layers.0.mlp", .type = HP_BT_MOE_MLP, .module = -1, .is_boundary = true,
                     .n_params = 3, .params = moe_params, .ep_size = 4, .region_dispatch = 1,
                     .local_compute_fn = "recipes.qwen3moe_topk_router"};
    b.in_src = b.in_dst = io1("x_BLD", (hp_nplace)NP(S1, NA, NA));
    b.out_src = b.out_dst = io1("output", (hp_nplace)NP(S1, NA, NA));
    hp_plan p = {.n_dims = 1, .dims = {HP_AXIS_TP}, .tp = 2, .ep = 4, .n_boundaries = 1, .boundaries = &b};
    p.mesh.ep = 4;
    char *text = render(0, &p, NULL);
    json_t *j = parse(text);
    json_t *jb = json_array_get(json_object_get(j, "boundaries"), 0);
    json_t *params = json_object_get(jb, "params");
    /* ep is kept although it is not a plan dim (D-10). */
    CHECK_STR_EQ(json_string_value(json_object_get(json_object_get(params, "experts.gate_up_proj"), "ep")), "S(0)");
    CHECK_STR_EQ(json_string_value(json_object_get(json_object_get(params, "experts.down_proj"), "tp")), "S(1)x2");
    CHECK_EQ_INT(json_integer_value(json_object_get(jb, "ep_size")), 4);
    CHECK(json_is_true(json_object_get(jb, "region_dispatch")));
    json_t *fn = json_object_get(jb, "local_compute_fn");
    CHECK_STR_EQ(json_string_value(json_object_get(fn, "_target_")), "recipes.qwen3moe_topk_router");
    CHECK(json_object_get(fn, "capacity_factor") == NULL); /* only options that were set */
    CHECK_STR_EQ(json_string_value(json_object_get(json_object_get(j, "mesh"), "ep_mode")), "tp-extend-ep");
    json_decref(j);
    free(text);
}

TEST(json_is_byte_identical_twice)
{
    toy t;
    toy_init(&t, true, false);
    char *a = render(0, &t.p, NULL), *b = render(0, &t.p, NULL);
    CHECK(strlen(a) > 1000);
    CHECK_STR_EQ(a, b);
    free(a);
    free(b);
    a = render(1, &t.p, NULL), b = render(1, &t.p, NULL);
    CHECK_STR_EQ(a, b);
    free(a);
    free(b);
    a = render(2, &t.p, NULL), b = render(2, &t.p, NULL);
    CHECK_STR_EQ(a, b);
    free(a);
    free(b);
}

/* ---- explain ---- */

TEST(explain_header)
{
    toy t;
    toy_init(&t, true, false);
    char *r = render(1, &t.p, NULL);
    CHECK(strncmp(r, "=== ShardingPlan introspection report ===\n"
                     "mesh_dim_names=('tp',)  sequence_parallel=True  loss_parallel=False\n"
                     "boundaries: 7  tied_pairs: model.embed_tokens.weight<->lm_head.weight\n",
                  strlen("=== ShardingPlan introspection report ===\n"
                         "mesh_dim_names=('tp',)  sequence_parallel=True  loss_parallel=False\n"
                         "boundaries: 7  tied_pairs: model.embed_tokens.weight<->lm_head.weight\n")) == 0);
    free(r);
}

TEST(scenario_31_compiled_collectives_attention_sp)
{
    toy t;
    toy_init(&t, true, false);
    char *r = render(1, &t.p, NULL);
    char *s = section(r, "model.layers.0.self_attn");
    CHECK_STR_CONTAINS(s, "  parameter sharding:\n    q_proj.weight: {tp: S(0)}\n");
    CHECK_STR_CONTAINS(s, "    o_proj.weight: {tp: S(1)}\n");
    CHECK_STR_CONTAINS(s, "  TP-local attribute division:\n    auto(D-17): num_attention_heads, num_key_value_heads\n");
    CHECK_STR_CONTAINS(s, "  deferred bias (D-22, no bias inside the region, added exactly once after the TP "
                          "reduction): o_proj.bias\n");
    CHECK_STR_CONTAINS(s, "  input communication plan (in_src -> in_dst):\n"
                          "    hidden_states: (S(1)) -> (R)  [all_gather]  tp lowering: all_gather dim 1\n");
    CHECK_STR_CONTAINS(s, "  output communication plan (out_src -> out_dst):\n"
                          "    output(tuple[0]): (P) -> (S(1))  [reduce_scatter]  tp lowering: reduce_scatter dim 1\n");
    CHECK_STR_CONTAINS(s, "  injection: none (ordinary boundary, dispatch-through under validate)\n");
    CHECK_STR_CONTAINS(s, "  special handling: A_log -> gated_delta_tp_shard\n");
    CHECK(strstr(s, "expert parallel") == NULL);
    free(s);
    /* The special handler belongs to layer 0 only. */
    s = section(r, "model.layers.1.self_attn");
    CHECK(s[0] != '\0' && strstr(s, "special handling") == NULL);
    free(s);
    free(r);
}

TEST(explain_attention_no_sp)
{
    toy t;
    toy_init(&t, false, false);
    char *r = render(1, &t.p, "model.layers.0.self_attn");
    CHECK_STR_CONTAINS(r, "    hidden_states: (R) -> (R)  [passthrough]\n");
    CHECK_STR_CONTAINS(r, "    output(tuple[0]): (P) -> (R)  [all_reduce]  tp lowering: all_reduce\n");
    /* Only the selected boundary. */
    CHECK(strstr(r, "[model.layers.1.self_attn]") == NULL);
    CHECK(strstr(r, "[lm_head]") == NULL);
    free(r);
}

TEST(explain_norm_and_no_communication)
{
    toy t;
    toy_init(&t, true, false);
    char *r = render(1, &t.p, NULL);
    char *s = section(r, "model.layers.0.input_layernorm");
    CHECK_STR_CONTAINS(s, "    weight: {tp: R}\n");
    CHECK_STR_CONTAINS(s, "    hidden_states: (S(1)) -> (S(1))  [passthrough]\n");
    CHECK_STR_CONTAINS(s, "  output communication plan (out_src -> out_dst): none");
    CHECK(strstr(s, "tp lowering") == NULL);
    free(s);
    s = section(r, "encoder");
    CHECK_STR_CONTAINS(s, "  boundary communication: none\n");
    free(s);
    free(r);
}

TEST(explain_lm_head_loss_parallel)
{
    toy t;
    toy_init(&t, true, true);
    char *r = render(1, &t.p, "lm_head");
    CHECK_STR_CONTAINS(r, "loss_parallel=True");
    CHECK_STR_CONTAINS(r, "    hidden_states: (S(1)) -> (R)  [all_gather]  tp lowering: all_gather dim 1\n");
    CHECK_STR_CONTAINS(r, "  output communication plan (out_src -> out_dst): none (identity)\n");
    free(r);
    toy_init(&t, true, false);
    r = render(1, &t.p, "lm_head");
    CHECK_STR_CONTAINS(r, "    output(tuple[0]): (S(-1)) -> (R)  [all_gather]  tp lowering: all_gather dim -1\n");
    free(r);
}

TEST(scenario_31_compiled_collectives_moe_gate_redistribute)
{
    static hp_param_spec gate_params[] = {{"weight", NP(R_, R_, R_), 0}};
    hp_boundary b = {.fqn = "model.layers.0.mlp.router", .type = HP_BT_MOE_GATE, .module = -1, .is_boundary = true,
                     .n_params = 1, .params = gate_params, .region_dispatch = -1};
    b.in_src = io1("hidden_states", (hp_nplace)NP(S1, R_, R_));
    b.in_dst = io1("hidden_states", (hp_nplace)NP(R_, R_, R_));
    b.out_src = io1("output", (hp_nplace)NP(R_, R_, R_));
    b.out_dst = io1("output", (hp_nplace)NP(R_, R_, S0));
    hp_plan p = {.n_dims = 2, .dims = {HP_AXIS_TP, HP_AXIS_EP}, .tp = 2, .ep = 2, .sequence_parallel = true,
                 .n_boundaries = 1, .boundaries = &b};
    char *r = render(1, &p, NULL);
    CHECK_STR_CONTAINS(r, "mesh_dim_names=('tp', 'ep')");
    CHECK_STR_CONTAINS(r, "    weight: {tp: R, ep: R}\n");
    CHECK_STR_CONTAINS(r, "    hidden_states: (S(1), R) -> (R, R)  [all_gather]  tp lowering: all_gather dim 1\n");
    CHECK_STR_CONTAINS(r, "    output(tuple[0]): (R, R) -> (R, S(0))  [redistribute]  tp lowering: generic "
                          "redistribution (a non-tp axis changes too)\n");
    free(r);
}

TEST(explain_ep_boundary)
{
    static const char *src_g[] = {"experts.0.gate_proj.weight", "experts.1.gate_proj.weight",
                                  "experts.2.gate_proj.weight", "experts.3.gate_proj.weight"};
    static hp_ep_stack stack[] = {{"experts.gate_proj", 4, src_g, NULL}, {"experts.up_proj", 4, src_g, NULL}};
    static hp_param_spec params[] = {{"gate.weight", NP(R_, NA, NA), 0},
                                     {"experts.gate_proj", NP(NA, NA, S0), 0},
                                     {"experts.up_proj", NP(NA, NA, S0), 0}};
    hp_boundary b = {.fqn = "model.layers.0.mlp", .type = HP_BT_MOE_MLP, .module = -1, .is_boundary = true,
                     .n_params = 3, .params = params, .ep_size = 2, .n_ep_stack = 2, .ep_stack = stack,
                     .region_dispatch = -1};
    b.in_src = b.in_dst = io1("x_BLD", (hp_nplace)NP(S1, NA, NA));
    b.out_src = b.out_dst = io1("output", (hp_nplace)NP(S1, NA, NA));
    hp_plan p = {.n_dims = 1, .dims = {HP_AXIS_TP}, .tp = 2, .ep = 2, .n_boundaries = 1, .boundaries = &b};
    char *r = render(1, &p, NULL);
    CHECK_STR_CONTAINS(r, "    experts.gate_proj: {ep: S(0)}\n");
    CHECK_STR_CONTAINS(r, "  expert parallel: ep_size=2, stacked: experts.gate_proj (4 experts), experts.up_proj "
                          "(4 experts)\n");
    CHECK_STR_CONTAINS(r, "  [!] EP-marked boundary without local_compute_fn: declare one with --overrides (see "
                          "'hyperpar plan --suggest-overrides')\n");
    free(r);
    b.local_compute_fn = "recipes.mixtral_topk_router";
    b.region_dispatch = 1;
    r = render(1, &p, NULL);
    CHECK_STR_CONTAINS(r, "  injection: local_compute_fn=recipes.mixtral_topk_router; region_dispatch=True -> ");
    CHECK(strstr(r, "[!]") == NULL);
    free(r);
}

TEST(explain_not_a_boundary)
{
    toy t;
    toy_init(&t, true, false);
    char *r = render(1, &t.p, "model.layers.0.mlp");
    CHECK_STR_CONTAINS(r, "boundaries: 7");
    CHECK_STR_CONTAINS(r, "\n[!] 'model.layers.0.mlp' is not a boundary of this plan");
    CHECK(strstr(r, "parameter sharding") == NULL);
    free(r);
}

/* ---- transformers plan ---- */

TEST(hf_dense_styles)
{
    toy t;
    toy_init(&t, true, false);
    char *text = render(2, &t.p, NULL);
    json_t *j = parse(text);
    CHECK_STR_EQ(json_string_value(json_object_get(j, "format")), "hyperpar-hf-tp-plan");
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "version")), 2);
    CHECK_STR_EQ(json_string_value(json_object_get(j, "transformers_version")), "5.25.0");
    json_t *tp = json_object_get(j, "base_model_tp_plan");
    CHECK_STR_EQ(json_string_value(json_object_get(tp, "layers.*.self_attn.q_proj")), "colwise");
    CHECK_STR_EQ(json_string_value(json_object_get(tp, "layers.*.self_attn.o_proj")), "rowwise");
    CHECK_STR_EQ(json_string_value(json_object_get(tp, "embed_tokens")), "embedding_rowwise");
    /* 5.25 has no sequence-parallel norms: no key, and a note says why. */
    CHECK(json_object_get(tp, "layers.*.input_layernorm") == NULL);
    CHECK_STR_CONTAINS(json_string_value(json_array_get(json_object_get(j, "notes"), 0)),
                       "sequence parallelism: transformers 5.25.0 has no sequence-parallel norms");
    CHECK(json_object_get(j, "unmapped") == NULL);
    /* No concrete layer keys, no bias keys, no model. prefix, lm_head apart. */
    CHECK(json_object_get(tp, "layers.0.self_attn.q_proj") == NULL);
    CHECK(json_object_get(tp, "layers.*.self_attn.o_proj.bias") == NULL);
    CHECK(json_object_get(tp, "model.layers.*.self_attn.q_proj") == NULL);
    CHECK(json_object_get(tp, "lm_head") == NULL);
    CHECK_EQ_INT(json_object_size(tp), 5);
    /* DistributedConfig: full module paths, lm_head in the same tp_plan, tp_size from the mesh. */
    json_t *dc = json_object_get(j, "distributed_config");
    CHECK_EQ_INT(json_integer_value(json_object_get(dc, "tp_size")), 2);
    json_t *dtp = json_object_get(dc, "tp_plan");
    CHECK_STR_EQ(json_string_value(json_object_get(dtp, "model.embed_tokens")), "embedding_rowwise");
    CHECK_STR_EQ(json_string_value(json_object_get(dtp, "model.layers.*.self_attn.q_proj")), "colwise");
    CHECK_STR_EQ(json_string_value(json_object_get(dtp, "lm_head")), "colwise_gather_output");
    CHECK(json_object_get(dtp, "layers.*.self_attn.q_proj") == NULL);
    CHECK_EQ_INT(json_object_size(dtp), 6);
    CHECK(json_object_get(dc, "ep_size") == NULL && json_object_get(dc, "ep_plan") == NULL);
    CHECK_STR_EQ(json_string_value(json_object_get(json_object_get(j, "lm_head"), "lm_head")), "colwise_gather_output");
    CHECK(json_object_get(j, "base_model_ep_plan") == NULL);
    /* First appearance order. */
    const char *first = NULL;
    json_t *v;
    json_object_foreach(tp, first, v) break;
    CHECK_STR_EQ(first, "embed_tokens");
    json_decref(j);
    free(text);

    /* Before 5.23: the old output, norms sequence_parallel. */
    text = render_hf(&t.p, "5.22");
    j = parse(text);
    tp = json_object_get(j, "base_model_tp_plan");
    CHECK_STR_EQ(json_string_value(json_object_get(tp, "layers.*.input_layernorm")), "sequence_parallel");
    CHECK_EQ_INT(json_object_size(tp), 6);
    CHECK_STR_EQ(json_string_value(json_object_get(j, "transformers_version")), "5.22.0");
    CHECK(json_object_get(j, "notes") == NULL);
    json_decref(j);
    free(text);

    toy_init(&t, false, true);
    text = render(2, &t.p, NULL);
    j = parse(text);
    CHECK(json_object_get(json_object_get(j, "base_model_tp_plan"), "layers.*.input_layernorm") == NULL);
    CHECK_STR_EQ(json_string_value(json_object_get(json_object_get(j, "lm_head"), "lm_head")), "colwise");
    json_decref(j);
    free(text);
}

TEST(hf_disagreeing_layer_keeps_its_index)
{
    static hp_param_spec odd[] = {{"q_proj.weight", NP(S1, R_, R_), 0}, {"o_proj.weight", NP(S1, R_, R_), 0}};
    toy t;
    toy_init(&t, true, false);
    hp_boundary extra[9];
    memcpy(extra, t.b, sizeof t.b);
    extra[7] = attention("model.layers.2.self_attn", true);
    extra[8] = attention("model.layers.3.self_attn", true);
    extra[8].n_params = 2, extra[8].params = odd;
    t.p.boundaries = extra, t.p.n_boundaries = 9;
    char *text = render(2, &t.p, NULL);
    json_t *j = parse(text);
    json_t *tp = json_object_get(j, "base_model_tp_plan");
    CHECK_STR_EQ(json_string_value(json_object_get(tp, "layers.*.self_attn.q_proj")), "colwise");
    CHECK_STR_EQ(json_string_value(json_object_get(tp, "layers.3.self_attn.q_proj")), "rowwise");
    CHECK_STR_EQ(json_string_value(json_object_get(tp, "layers.*.self_attn.o_proj")), "rowwise");
    CHECK(json_object_get(tp, "layers.3.self_attn.o_proj") == NULL);
    json_decref(j);
    free(text);
}

TEST(hf_ep_plan)
{
    static hp_param_spec moe_params[] = {{"gate.weight", NP(R_, NA, NA), 0},
                                         {"experts.gate_up_proj", NP(NA, NA, S0), 0},
                                         {"experts.down_proj", NP(NA, NA, S0), 0}};
    hp_boundary b[2];
    b[0] = attention("model.layers.0.self_attn", true);
    b[1] = (hp_boundary){.fqn = "model.layers.0.mlp", .type = HP_BT_MOE_MLP, .module = -1, .is_boundary = true,
                         .n_params = 3, .params = moe_params, .ep_size = 2, .region_dispatch = -1};
    hp_plan p = {.n_dims = 1, .dims = {HP_AXIS_TP}, .tp = 2, .ep = 2, .sequence_parallel = true,
                 .n_boundaries = 2, .boundaries = b};
    char *text = render(2, &p, NULL);
    json_t *j = parse(text);
    json_t *tp = json_object_get(j, "base_model_tp_plan"), *ep = json_object_get(j, "base_model_ep_plan");
    /* 5.25 (default): grouped_gemm + ep_dispatch_experts, no router key, no dense entries repeated. */
    CHECK(json_object_get(tp, "layers.*.mlp.experts.gate_up_proj") == NULL);
    CHECK(json_object_get(ep, "layers.*.mlp.gate") == NULL);
    CHECK_STR_EQ(json_string_value(json_object_get(ep, "layers.*.mlp.experts.gate_up_proj")), "grouped_gemm");
    CHECK_STR_EQ(json_string_value(json_object_get(ep, "layers.*.mlp.experts.down_proj")), "grouped_gemm");
    CHECK_STR_EQ(json_string_value(json_object_get(ep, "layers.*.mlp.experts")), "ep_dispatch_experts");
    CHECK_EQ_INT(json_object_size(ep), 3);
    json_t *dc = json_object_get(j, "distributed_config");
    CHECK_EQ_INT(json_integer_value(json_object_get(dc, "tp_size")), 2);
    CHECK_EQ_INT(json_integer_value(json_object_get(dc, "ep_size")), 2);
    CHECK(json_object_get(dc, "fsdp_size") == NULL && json_object_get(dc, "dp_replicate_size") == NULL);
    CHECK_STR_EQ(json_string_value(json_object_get(json_object_get(dc, "ep_plan"), "model.layers.*.mlp.experts")),
                 "ep_dispatch_experts");
    CHECK_STR_EQ(json_string_value(json_object_get(json_object_get(dc, "tp_plan"), "model.layers.*.self_attn.q_proj")),
                 "colwise");
    /* Nothing 5.25 refuses: no ep_router anywhere, no moe_tp_experts in an EP plan. */
    CHECK(strstr(text, "ep_router") == NULL);
    CHECK(strstr(text, "moe_tp_experts") == NULL);
    json_decref(j);
    free(text);

    /* 5.19-5.22: router masking (ep_router + moe_tp_experts), the EP plan beside the TP plan. */
    text = render_hf(&p, "5.22.2");
    j = parse(text);
    ep = json_object_get(j, "base_model_ep_plan");
    CHECK_STR_EQ(json_string_value(json_object_get(ep, "layers.*.mlp.gate")), "ep_router");
    CHECK_STR_EQ(json_string_value(json_object_get(ep, "layers.*.mlp.experts.gate_up_proj")), "grouped_gemm");
    CHECK_STR_EQ(json_string_value(json_object_get(ep, "layers.*.mlp.experts")), "moe_tp_experts");
    CHECK(json_object_get(ep, "layers.*.self_attn.q_proj") == NULL);
    CHECK_STR_EQ(json_string_value(json_object_get(json_object_get(json_object_get(j, "distributed_config"), "ep_plan"),
                                                   "model.layers.*.mlp.gate")),
                 "ep_router");
    json_decref(j);
    free(text);

    /* Up to 5.18 the EP plan replaces the TP plan: it repeats the dense entries; no DistributedConfig form. */
    text = render_hf(&p, "5.16");
    j = parse(text);
    ep = json_object_get(j, "base_model_ep_plan");
    CHECK_STR_EQ(json_string_value(json_object_get(ep, "layers.*.mlp.gate")), "ep_router");
    CHECK_STR_EQ(json_string_value(json_object_get(ep, "layers.*.mlp.experts")), "moe_tp_experts");
    CHECK_STR_EQ(json_string_value(json_object_get(ep, "layers.*.self_attn.q_proj")), "colwise");
    CHECK(json_object_get(j, "distributed_config") == NULL);
    json_decref(j);
    free(text);
}

/* Each release's registry: a style it lacks is replaced by one that does the same, or listed as unmapped. */
TEST(hf_target_registries)
{
    static hp_param_spec embed_cols[] = {{"weight", NP(S1, R_, NA), 0}};
    toy t;
    toy_init(&t, false, false);
    t.b[0].params = embed_cols; /* embedding sharded on its hidden dim: embedding_colwise */
    char *text = render_hf(&t.p, "5.21");
    CHECK_STR_CONTAINS(text, "\"embed_tokens\": \"embedding_colwise\"");
    free(text);
    /* 5.16-5.20 have no embedding_colwise (5.17-5.19 lie between releases without it). */
    const char *const without[] = {"5.16", "5.18.1", "5.20"};
    for (int i = 0; i < 3; i++) {
        text = render_hf(&t.p, without[i]);
        json_t *j = parse(text);
        CHECK(json_object_get(json_object_get(j, "base_model_tp_plan"), "embed_tokens") == NULL);
        CHECK_STR_CONTAINS(json_string_value(json_array_get(json_object_get(j, "unmapped"), 0)),
                           "embed_tokens: style 'embedding_colwise' is not in the registry of transformers");
        CHECK(strstr(text, "embedding_colwise\"") == NULL);
        json_decref(j);
        free(text);
    }
    /* 5.0 has no colwise_gather_output, but its colwise_rep is the same (a colwise layer with a gathered output). */
    text = render_hf(&t.p, "5.0.0");
    json_t *j = parse(text);
    CHECK_STR_EQ(json_string_value(json_object_get(json_object_get(j, "lm_head"), "lm_head")), "colwise_rep");
    CHECK_STR_EQ(json_string_value(json_object_get(json_object_get(j, "base_model_tp_plan"),
                                                   "layers.*.self_attn.q_proj")), "colwise");
    json_decref(j);
    free(text);
    /* Newer than the newest release read: its names, less moe_tp_experts (announced removed in 5.28). */
    text = render_hf(&t.p, "6.3");
    CHECK_STR_CONTAINS(text, "\"transformers_version\": \"6.3.0\"");
    CHECK_STR_CONTAINS(text, "\"lm_head\": \"colwise_gather_output\"");
    free(text);
}

/* A version that does not parse, or predates every registry read, is an input error naming the accepted forms. */
TEST(hf_bad_versions)
{
    toy t;
    toy_init(&t, false, false);
    const char *const bad[] = {"abc", "5.x", "5", "5.25.", "5..1", "", "v5.25", "5.26.0.dev0", "5.25.0.1",
                               " 5.25", "5.25 ", "-5.25", "+5.25", "1234567.1", "5,25"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        hp_buf b;
        hp_err err;
        hp_buf_init(&b);
        hp_status st = hp_plan_to_hf_target(&t.p, bad[i], &b, &err);
        CHECK_MSG(st == HP_ERR_INPUT, "'%s' gave status %d", bad[i], (int)st);
        CHECK_STR_CONTAINS(err.msg, "does not parse: give MAJOR.MINOR or MAJOR.MINOR.PATCH in plain digits");
        CHECK_EQ_INT((long long)b.len, 0);
        hp_buf_free(&b);
        CHECK_EQ_INT(hp_plan_hf_version_check(bad[i], &err), HP_ERR_INPUT);
    }
    hp_err err;
    CHECK_EQ_INT(hp_plan_hf_version_check("4.57", &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "transformers 4.57.0 is older than 5.0, the oldest release");
    const char *const good[] = {"5.25", "5.25.0", "5.22.2", "5.0", "5.17", "6.0", NULL};
    for (int i = 0; i < 7; i++) CHECK_MSG(hp_plan_hf_version_check(good[i], &err) == HP_OK, "'%s': %s", good[i], err.msg);
}

/* ---- derived plans of a real checkpoint ---- */

static hp_plan *derive_qwen3_moe(hp_model **m, int64_t tp, int64_t ep)
{
    hp_err err;
    *m = NULL;
    hp_status st = hp_model_open(m, "data/golden/qwen3_moe_batched_bf16", NULL, &err);
    CHECK_MSG(st == HP_OK, "%s", err.msg);
    if (st != HP_OK) return NULL;
    hp_plan_opts o;
    hp_plan_opts_default(&o);
    hp_mesh_from_sizes(&o.mesh, 1, 1, tp, ep, false);
    hp_plan *p = NULL;
    st = hp_plan_derive(&p, *m, &o, &err);
    CHECK_MSG(st == HP_OK, "%s", err.msg);
    return p;
}

TEST(derived_qwen3_moe_outputs)
{
    hp_model *m;
    hp_plan *p = derive_qwen3_moe(&m, 2, 2);
    if (!p) {
        hp_model_close(m);
        return;
    }
    char *text = render(0, p, NULL);
    json_t *j = parse(text);
    json_t *model = json_object_get(j, "model");
    CHECK_STR_EQ(json_string_value(json_object_get(model, "model_type")), "qwen3_moe");
    CHECK_STR_EQ(json_string_value(json_object_get(model, "expert_layout")), "batched");
    CHECK_EQ_INT(json_integer_value(json_object_get(model, "num_tensors")), (long long)m->n_params);
    CHECK_EQ_INT(json_object_size(json_object_get(j, "param_roles")), (long long)m->n_params);
    CHECK_STR_EQ(json_string_value(json_object_get(json_object_get(j, "param_roles"),
                                                   "model.layers.0.self_attn.q_proj.weight")),
                 "COLWISE");
    CHECK_STR_EQ(json_string_value(json_object_get(json_object_get(j, "mesh"), "ep_mode")), "tp-extend-ep");
    json_t *bs = json_object_get(j, "boundaries");
    CHECK_EQ_INT(json_array_size(bs), (long long)p->n_boundaries);
    bool found_ep = false;
    for (size_t i = 0; i < json_array_size(bs); i++) {
        json_t *b = json_array_get(bs, i);
        if (strcmp(json_string_value(json_object_get(b, "fqn")), "model.layers.0.mlp") != 0) continue;
        found_ep = true;
        CHECK_EQ_INT(json_integer_value(json_object_get(b, "ep_size")), 2);
        json_t *gu = json_object_get(json_object_get(b, "params"), "experts.gate_up_proj");
        CHECK_STR_EQ(json_string_value(json_object_get(gu, "ep")), "S(0)");
    }
    CHECK(found_ep);
    json_decref(j);
    free(text);

    char *r = render(1, p, NULL);
    char *s = section(r, "model.layers.0.self_attn");
    CHECK_STR_CONTAINS(s, "[all_gather]  tp lowering: all_gather dim 1");
    CHECK_STR_CONTAINS(s, "[reduce_scatter]  tp lowering: reduce_scatter dim 1");
    free(s);
    s = section(r, "model.layers.0.mlp");
    CHECK_STR_CONTAINS(s, "  expert parallel: ep_size=2, stacked: none");
    CHECK_STR_CONTAINS(s, "[!] EP-marked boundary without local_compute_fn");
    free(s);
    free(r);

    text = render(2, p, NULL);
    j = parse(text);
    json_t *tp = json_object_get(j, "base_model_tp_plan"), *ep = json_object_get(j, "base_model_ep_plan");
    CHECK_STR_EQ(json_string_value(json_object_get(tp, "layers.*.self_attn.q_proj")), "colwise");
    CHECK_STR_EQ(json_string_value(json_object_get(tp, "layers.*.self_attn.q_norm")), "replicated_with_grad_allreduce");
    CHECK(json_object_get(ep, "layers.*.mlp.gate") == NULL);
    CHECK_STR_EQ(json_string_value(json_object_get(ep, "layers.*.mlp.experts.gate_up_proj")), "grouped_gemm");
    CHECK_STR_EQ(json_string_value(json_object_get(ep, "layers.*.mlp.experts")), "ep_dispatch_experts");
    json_decref(j);
    free(text);
    text = render_hf(p, "5.20");
    j = parse(text);
    ep = json_object_get(j, "base_model_ep_plan");
    CHECK_STR_EQ(json_string_value(json_object_get(ep, "layers.*.mlp.gate")), "ep_router");
    CHECK_STR_EQ(json_string_value(json_object_get(ep, "layers.*.mlp.experts")), "moe_tp_experts");
    json_decref(j);
    free(text);
    hp_plan_free(p);
    hp_model_close(m);
}

TEST(derived_qwen3_moe_packed_tp_only)
{
    hp_model *m = NULL;
    hp_err err;
    CHECK(hp_model_open(&m, "data/golden/qwen3_moe_batched_bf16", NULL, &err) == HP_OK);
    if (!m) return;
    hp_plan_opts o;
    hp_plan_opts_default(&o);
    hp_mesh_from_sizes(&o.mesh, 1, 1, 2, 1, false);
    o.packed_fused = true;
    hp_plan *p = NULL;
    hp_status st = hp_plan_derive(&p, m, &o, &err);
    CHECK_MSG(st == HP_OK, "%s", err.msg);
    if (p) {
        char *text = render(2, p, NULL);
        json_t *j = parse(text);
        json_t *tp = json_object_get(j, "base_model_tp_plan");
        CHECK_STR_EQ(json_string_value(json_object_get(tp, "layers.*.mlp.experts.gate_up_proj")), "packed_colwise");
        CHECK_STR_EQ(json_string_value(json_object_get(tp, "layers.*.mlp.experts.down_proj")), "rowwise");
        CHECK_STR_EQ(json_string_value(json_object_get(tp, "layers.*.mlp.experts")), "moe_tp_experts");
        CHECK(json_object_get(j, "base_model_ep_plan") == NULL);
        json_decref(j);
        free(text);
        /* moe_tp_experts goes in 5.28 (announced by 5.25): from then the container is listed, not written. */
        text = render_hf(p, "5.28");
        j = parse(text);
        tp = json_object_get(j, "base_model_tp_plan");
        CHECK(json_object_get(tp, "layers.*.mlp.experts") == NULL);
        CHECK_STR_EQ(json_string_value(json_object_get(tp, "layers.*.mlp.experts.gate_up_proj")), "packed_colwise");
        CHECK_STR_CONTAINS(json_string_value(json_array_get(json_object_get(j, "unmapped"), 0)),
                           "layers.*.mlp.experts: style 'moe_tp_experts' is not in the registry of transformers 5.28.0");
        json_decref(j);
        free(text);
    }
    hp_plan_free(p);
    hp_model_close(m);
}

/* A module hyperpar keeps whole that transformers' own plans shard gets "replicate" in the DistributedConfig
 * form (which merges into the model's plan), and per-expert names, which no transformers 5 module has, are
 * listed instead of written. */
TEST(derived_replicate_and_per_expert)
{
    hp_model *m = NULL;
    hp_err err;
    CHECK(hp_model_open(&m, "data/forward/llama", NULL, &err) == HP_OK);
    hp_overrides *ov = NULL;
    CHECK(hp_overrides_load(&ov, "data/overrides/mlp_replicated.yaml", &err) == HP_OK);
    if (!m || !ov) {
        hp_overrides_free(ov);
        hp_model_close(m);
        return;
    }
    hp_plan_opts o;
    hp_plan_opts_default(&o);
    hp_mesh_from_sizes(&o.mesh, 1, 1, 2, 1, false);
    o.overrides = ov;
    hp_plan *p = NULL;
    hp_status st = hp_plan_derive(&p, m, &o, &err);
    CHECK_MSG(st == HP_OK, "%s", err.msg);
    if (p) {
        char *text = render_hf(p, NULL);
        json_t *j = parse(text);
        json_t *dtp = json_object_get(json_object_get(j, "distributed_config"), "tp_plan");
        CHECK_STR_EQ(json_string_value(json_object_get(dtp, "model.layers.*.mlp.gate_proj")), "replicate");
        CHECK_STR_EQ(json_string_value(json_object_get(dtp, "model.layers.*.mlp.down_proj")), "replicate");
        CHECK_STR_EQ(json_string_value(json_object_get(dtp, "model.layers.*.self_attn.q_proj")), "colwise");
        CHECK(json_object_get(dtp, "model.layers.*.input_layernorm") == NULL); /* norms: never default-sharded */
        json_decref(j);
        free(text);
        /* 5.20 has no "replicate" style: nothing written for them. */
        text = render_hf(p, "5.20");
        CHECK(strstr(text, "\"replicate\"") == NULL);
        free(text);
    }
    hp_plan_free(p);
    hp_overrides_free(ov);
    hp_model_close(m);

    CHECK(hp_model_open(&m, "data/forward/mixtral", NULL, &err) == HP_OK);
    if (!m) return;
    hp_plan_opts_default(&o);
    hp_mesh_from_sizes(&o.mesh, 1, 1, 2, 1, false);
    p = NULL;
    st = hp_plan_derive(&p, m, &o, &err);
    CHECK_MSG(st == HP_OK, "%s", err.msg);
    if (p) {
        char *text = render_hf(p, NULL);
        CHECK(strstr(text, "experts.*.w1\": ") == NULL);
        CHECK_STR_CONTAINS(text, "layers.*.block_sparse_moe.experts.*.w1: a per-expert name; transformers 5.25.0 holds");
        free(text);
        text = render_hf(p, "5.16"); /* the config-dictionary era keeps them, as before */
        CHECK_STR_CONTAINS(text, "\"layers.*.block_sparse_moe.experts.*.w1\": \"colwise\"");
        free(text);
    }
    hp_plan_free(p);
    hp_model_close(m);

    /* EP over a per-expert checkpoint: hyperpar's stacks are not transformers' names, so the block's EP entries
     * are listed, and distributed_config asks for no EP at all (rather than the model's own EP plan). */
    CHECK(hp_model_open(&m, "data/forward/qwen2_moe", NULL, &err) == HP_OK);
    if (!m) return;
    hp_plan_opts_default(&o);
    hp_mesh_from_sizes(&o.mesh, 1, 1, 2, 2, false);
    o.ep_compute = "suggested";
    p = NULL;
    st = hp_plan_derive(&p, m, &o, &err);
    CHECK_MSG(st == HP_OK, "%s", err.msg);
    if (p) {
        char *text = render_hf(p, NULL);
        json_t *j = parse(text);
        CHECK_EQ_INT(json_object_size(json_object_get(j, "base_model_ep_plan")), 0);
        json_t *dc = json_object_get(j, "distributed_config");
        CHECK(json_object_get(dc, "ep_size") == NULL && json_object_get(dc, "ep_plan") == NULL);
        CHECK_STR_CONTAINS(json_string_value(json_array_get(json_object_get(j, "unmapped"), 0)),
                           "layers.*.mlp.experts.gate_proj: hyperpar's stack of per-expert tensors");
        json_decref(j);
        free(text);
    }
    hp_plan_free(p);
    hp_model_close(m);
}

TEST_MAIN()
