/*
 * test_moe_hostile.c — the MoE runtime against hostile but well-formed inputs: checkpoints whose config.json
 * or tensors disagree, hold non-finite router weights or degenerate shapes (each must give HP_ERR_INPUT with a
 * clear message, never a crash or a silent wrong answer), and the public entry points with dimensions whose
 * size products overflow (each must refuse, never allocate a short buffer).
 *
 * Hostile checkpoints are `hyperpar gen` checkpoints with config.json edited as text and model.safetensors
 * rewritten through the safetensors writer with one tensor's values or shape changed.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyperpar/gen.h"
#include "hyperpar/moe.h"
#include "testlib.h"

/* One scratch folder for the whole run, removed at exit (testlib.h). */
static const char *base(void) { return test_work_dir("moe_hostile"); }

/* A fresh checkpoint of `family` in base()/name; returns its folder (static buffer) or NULL. */
static const char *gen(const char *family, hp_expert_layout layout, const char *name)
{
    static char dir[200];
    snprintf(dir, sizeof dir, "%s/%s", base(), name);
    hp_gen_opts o;
    hp_gen_opts_default(&o);
    o.family = family;
    o.layout = layout;
    o.seed = 5;
    o.force = true;
    hp_err err;
    if (hp_gen_checkpoint(&o, dir, &err) != HP_OK) {
        fprintf(stderr, "  gen %s: %s\n", family, err.msg);
        return NULL;
    }
    return dir;
}

/* Sets "key": value (JSON text) in dir/config.json, adding the key when it is absent. */
static bool set_config(const char *dir, const char *key, const char *value)
{
    char path[300], pat[96];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    char out[8400];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    char *at = strstr(text, pat);
    if (at) {
        char *end = at + strlen(pat);
        while (*end && *end != ',' && *end != '\n' && *end != '}') end++;
        snprintf(out, sizeof out, "%.*s\"%s\": %s%s", (int)(at - text), text, key, value, end);
    } else {
        char *brace = strchr(text, '{');
        if (!brace) return false;
        snprintf(out, sizeof out, "{\n  \"%s\": %s,%s", key, value, brace + 1);
    }
    f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fputs(out, f) >= 0;
    return fclose(f) == 0 && ok;
}

/* How rewrite() changes the tensor it is asked about: new values (f32 only) and / or a new shape. */
typedef struct edit {
    const char *name;      /* tensor to change (exact name) */
    int64_t elem;          /* element to overwrite, or -1 */
    float value;
    int n_dims;            /* > 0: the new shape (the data is zero-filled) */
    int64_t shape[4];
} edit;

/* Rewrites dir/model.safetensors applying every edit of the NULL-name terminated list; the names must
 * exist. Returns false on any failure. */
static bool rewrite(const char *dir, const edit *edits)
{
    char path[300], tmp[320];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    snprintf(tmp, sizeof tmp, "%s/new.safetensors", dir);
    hp_err err;
    hp_st_file *src = NULL;
    if (hp_st_open(&src, path, &err) != HP_OK) return false;
    hp_st_writer *w = hp_st_writer_create();
    bool ok = w != NULL;
    int used = 0;
    void *bufs[64] = {0};
    int n_bufs = 0;
    for (size_t i = 0; ok && i < hp_st_count(src); i++) {
        const hp_st_tensor *t = hp_st_tensor_at(src, i);
        const edit *e = NULL;
        for (const edit *x = edits; x->name; x++)
            if (!strcmp(x->name, t->name)) e = x;
        if (!e) {
            ok = hp_st_writer_add(w, t->name, t->dtype, t->n_dims, t->shape, hp_st_data(src, t), &err) == HP_OK;
            continue;
        }
        used++;
        int n_dims = e->n_dims > 0 ? e->n_dims : t->n_dims;
        const int64_t *shape = e->n_dims > 0 ? e->shape : t->shape;
        int64_t n = 1;
        for (int d = 0; d < n_dims; d++) n *= shape[d];
        float *data = calloc((size_t)(n > 0 ? n : 1), sizeof *data);
        if (!data || n_bufs == 64 || t->dtype != HP_DT_F32) {
            free(data);
            ok = false;
            break;
        }
        bufs[n_bufs++] = data;
        if (e->n_dims <= 0) memcpy(data, hp_st_data(src, t), (size_t)n * sizeof *data);
        if (e->elem >= 0 && e->elem < n) data[e->elem] = e->value;
        ok = hp_st_writer_add(w, t->name, HP_DT_F32, n_dims, shape, data, &err) == HP_OK;
    }
    int wanted = 0;
    for (const edit *x = edits; x->name; x++) wanted++;
    ok = ok && used == wanted && hp_st_writer_write(w, tmp, &err) == HP_OK;
    hp_st_writer_destroy(w);
    hp_st_close(src);
    for (int i = 0; i < n_bufs; i++) free(bufs[i]);
    return ok && rename(tmp, path) == 0;
}

/* Loads sparse layer 1 of dir (opts may be NULL): expects HP_ERR_INPUT, no layer, and `want` in the message. */
static void expect_load_error(const char *dir, const hp_moe_load_opts *opts, const char *want)
{
    hp_err err;
    hp_model *m = NULL;
    CHECK(dir != NULL);
    if (!dir) return;
    /* hp_model_open checks config.json against itself and the weights too: a refusal there (HP_ERR_INPUT
     * naming config.json) is the earlier of the two guards and equally right. */
    hp_status ost = hp_model_open(&m, dir, NULL, &err);
    if (ost != HP_OK) {
        CHECK_MSG(ost == HP_ERR_INPUT, "%s: open status %d: %s", dir, (int)ost, err.msg);
        CHECK_STR_CONTAINS(err.msg, "config.json");
        return;
    }
    hp_moe_layer *l = (hp_moe_layer *)1;
    hp_status st = hp_moe_layer_load(&l, m, 1, opts, &err);
    CHECK_MSG(st == HP_ERR_INPUT, "%s: status %d, want HP_ERR_INPUT (%s)", dir, (int)st, st ? err.msg : "loaded");
    CHECK(l == NULL);
    if (st != HP_OK) CHECK_STR_CONTAINS(err.msg, want);
    hp_moe_layer_free(st == HP_OK ? l : NULL);
    hp_model_close(m);
}

/* Loads layer 1 and runs one forward: both must succeed (the unedited control). */
static void expect_load_ok(const char *dir)
{
    hp_err err;
    hp_model *m = NULL;
    hp_moe_layer *l = NULL;
    hp_moe_ws *ws = NULL;
    CHECK_MSG(dir && hp_model_open(&m, dir, NULL, &err) == HP_OK, "%s", dir ? err.msg : "no folder");
    if (m) CHECK_MSG(hp_moe_layer_load(&l, m, 1, NULL, &err) == HP_OK, "%s: %s", dir, err.msg);
    if (l) CHECK_MSG(hp_moe_ws_create(&ws, l, 4, &err) == HP_OK, "%s", err.msg);
    if (ws) {
        float x[4 * 64], y[4 * 64];
        for (int i = 0; i < 4 * 64; i++) x[i] = (float)sin(0.3 * i);
        CHECK_MSG(hp_moe_forward(l, ws, x, 4, 64, y, NULL, &err) == HP_OK, "%s", err.msg);
    }
    hp_moe_ws_destroy(ws);
    hp_moe_layer_free(l);
    hp_model_close(m);
}

/* ---- config.json values the tensors or the router cannot honour ---- */

TEST(config_router_settings_out_of_range)
{
    static const struct {
        const char *key, *value, *want;
    } cases[] = {
        {"n_group", "3", "n_group (3) must divide the 8 routed experts"},
        {"topk_group", "5", "topk_group (5) must be between 1 and n_group (4)"},
        {"num_experts_per_tok", "9", "num_experts_per_tok (9) must be between 1 and the 8 experts"},
        {"n_routed_experts", "16", "config.json says 16 routed experts"},
        {"hidden_size", "32", "config.json hidden_size is 32"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *dir = gen("deepseek_v3", HP_LAYOUT_PER_EXPERT, "cfg");
        CHECK(dir && set_config(dir, cases[i].key, cases[i].value));
        expect_load_error(dir, NULL, cases[i].want);
    }
    /* topk_group groups too small for K: 1 group of 2 experts cannot supply 4. */
    const char *dir = gen("deepseek_v3", HP_LAYOUT_PER_EXPERT, "cfg");
    CHECK(dir && set_config(dir, "num_experts_per_tok", "4") && set_config(dir, "topk_group", "1"));
    expect_load_error(dir, NULL, "topk_group (1) groups of 2 experts cannot supply num_experts_per_tok = 4");
}

/* moe_intermediate_size (or Mixtral's intermediate_size) that disagrees with the expert tensors is refused,
 * in both layouts, naming the tensor, its width and the config value. */
TEST(config_expert_width_disagrees_with_tensors)
{
    const char *dir = gen("qwen3_moe", HP_LAYOUT_PER_EXPERT, "mi_pe");
    CHECK(dir && set_config(dir, "moe_intermediate_size", "16"));
    expect_load_error(dir, NULL, "config.json moe_intermediate_size is 16");
    dir = gen("qwen3_moe", HP_LAYOUT_BATCHED, "mi_ba");
    CHECK(dir && set_config(dir, "moe_intermediate_size", "48"));
    expect_load_error(dir, NULL, "config.json moe_intermediate_size is 48");
    dir = gen("mixtral", HP_LAYOUT_PER_EXPERT, "mi_mx");
    CHECK(dir && set_config(dir, "intermediate_size", "64"));
    expect_load_error(dir, NULL, "config.json moe_intermediate_size is 64");
    /* The shared expert's width against shared_expert_intermediate_size. */
    dir = gen("qwen2_moe", HP_LAYOUT_PER_EXPERT, "si_q2");
    CHECK(dir && set_config(dir, "shared_expert_intermediate_size", "40"));
    expect_load_error(dir, NULL, "config.json gives the shared expert width 40");
    /* Controls: the unedited checkpoints load and run. */
    const char *fams[] = {"qwen3_moe", "mixtral", "qwen2_moe", "deepseek_v3", "glm4_moe", "gpt_oss"};
    for (size_t i = 0; i < sizeof fams / sizeof *fams; i++)
        expect_load_ok(gen(fams[i], i == 5 ? HP_LAYOUT_BATCHED : HP_LAYOUT_PER_EXPERT, "ctl"));
}

/* The first expert's tensor missing while config.json claims an enormous width: a missing-tensor error, not
 * an attempt to allocate config-sized buffers (which was HP_ERR_NOMEM, or an ASan abort). */
TEST(missing_expert_with_huge_config_width)
{
    const char *dir = gen("qwen3_moe", HP_LAYOUT_PER_EXPERT, "huge");
    CHECK(dir && set_config(dir, "moe_intermediate_size", "1099511627776"));
    edit e[] = {{.name = "model.layers.1.mlp.experts.0.gate_proj.weight", .elem = -1, .n_dims = 1, .shape = {3}},
                {0}};
    CHECK(dir && rewrite(dir, e));
    expect_load_error(dir, NULL, "experts.0.gate_proj.weight");
}

/* ---- tensors with non-finite router values or degenerate shapes ---- */

TEST(non_finite_router_weights_are_refused)
{
    const char *dir = gen("qwen3_moe", HP_LAYOUT_PER_EXPERT, "nan_gate");
    edit e1[] = {{.name = "model.layers.1.mlp.gate.weight", .elem = 70, .value = NAN}, {0}};
    CHECK(dir && rewrite(dir, e1));
    expect_load_error(dir, NULL, "tensor 'model.layers.1.mlp.gate.weight' holds NaN at element 70 (row 1, column 6)");
    dir = gen("deepseek_v3", HP_LAYOUT_PER_EXPERT, "inf_bias");
    edit e2[] = {{.name = "model.layers.1.mlp.gate.e_score_correction_bias", .elem = 3, .value = INFINITY}, {0}};
    CHECK(dir && rewrite(dir, e2));
    expect_load_error(dir, NULL, "gate.e_score_correction_bias' holds Inf at element 3");
    dir = gen("gpt_oss", HP_LAYOUT_BATCHED, "inf_rbias");
    edit e3[] = {{.name = "model.layers.1.mlp.router.bias", .elem = 0, .value = -INFINITY}, {0}};
    CHECK(dir && rewrite(dir, e3));
    expect_load_error(dir, NULL, "router.bias' holds Inf at element 0");
}

/* A layer of zero width (H = 0: router [E, 0], experts [I, 0] and [0, I]) with config.json silent about
 * hidden_size loaded and reached BLAS with leading dimension 0; zero experts are refused by name. */
TEST(degenerate_router_shapes)
{
    const char *dir = gen("qwen3_moe", HP_LAYOUT_PER_EXPERT, "h0");
    static char names[25][96];
    edit e1[26];
    memset(e1, 0, sizeof e1);
    snprintf(names[0], sizeof names[0], "model.layers.1.mlp.gate.weight");
    e1[0] = (edit){.name = names[0], .elem = -1, .n_dims = 2, .shape = {8, 0}};
    for (int e = 0; e < 8; e++)
        for (int p = 0; p < 3; p++) {
            int k = 1 + e * 3 + p;
            snprintf(names[k], sizeof names[k], "model.layers.1.mlp.experts.%d.%s.weight", e,
                     p == 0 ? "gate_proj" : p == 1 ? "up_proj" : "down_proj");
            e1[k] = (edit){.name = names[k], .elem = -1, .n_dims = 2, .shape = {p < 2 ? 32 : 0, p < 2 ? 0 : 32}};
        }
    CHECK(dir && rewrite(dir, e1) && set_config(dir, "hidden_size", "null"));
    expect_load_error(dir, NULL, "needs at least one expert and a positive hidden size");
    dir = gen("qwen3_moe", HP_LAYOUT_PER_EXPERT, "e0");
    edit e2[] = {{.name = "model.layers.1.mlp.gate.weight", .elem = -1, .n_dims = 2, .shape = {0, 64}}, {0}};
    CHECK(dir && rewrite(dir, e2));
    expect_load_error(dir, NULL, "has 0 rows but config.json says 8 routed experts");
}

/* A shared expert of width 0 loaded, then failed every forward with "workspace was created for another
 * layer shape"; it is refused at load. */
TEST(zero_width_shared_expert)
{
    const char *dir = gen("qwen2_moe", HP_LAYOUT_PER_EXPERT, "s0");
    const char *p = "model.layers.1.mlp.shared_expert.";
    char g[128], u[128], d[128];
    snprintf(g, sizeof g, "%sgate_proj.weight", p);
    snprintf(u, sizeof u, "%sup_proj.weight", p);
    snprintf(d, sizeof d, "%sdown_proj.weight", p);
    edit e[] = {{.name = g, .elem = -1, .n_dims = 2, .shape = {0, 64}},
                {.name = u, .elem = -1, .n_dims = 2, .shape = {0, 64}},
                {.name = d, .elem = -1, .n_dims = 2, .shape = {64, 0}},
                {0}};
    CHECK(dir && rewrite(dir, e) && set_config(dir, "shared_expert_intermediate_size", "null"));
    expect_load_error(dir, NULL, "shared_expert.gate_proj.weight' has 0 rows");
}

TEST(unknown_archetype_in_options)
{
    const char *dir = gen("qwen3_moe", HP_LAYOUT_PER_EXPERT, "arch");
    hp_moe_load_opts lo;
    hp_moe_load_opts_default(&lo);
    lo.archetype = HP_MOE_ARCHETYPE_COUNT + 3;
    expect_load_error(dir, &lo, "unknown archetype 9");
}

/* ---- the router's group selection is total ---- */

/* Correction biases of +Inf (possible in a layer built in memory) made group scores equal the "already
 * chosen" marker: groups were kept beyond topk_group and the arg-max wrote one element before the group
 * scores (the last expert's selection score). Every token must use experts of at most topk_group groups. */
TEST(sigmoid_group_selection_with_infinite_scores)
{
    hp_moe_dims d = {.n_hidden = 4, .n_experts = 8, .top_k = 4, .d_expert = 2, .n_group = 4, .topk_group = 2};
    hp_moe_layer *l = NULL;
    hp_moe_ws *ws = NULL;
    hp_err err;
    CHECK(hp_moe_layer_create(&l, HP_MOE_DEEPSEEKV3_SIGMOID_GROUP_SHARED, &d, &err) == HP_OK);
    if (!l) return;
    /* One expert of each of groups 0, 1, 2 (experts 0, 2, 4) gets +Inf; group 3 stays finite. */
    l->b_correction[0] = l->b_correction[2] = l->b_correction[4] = INFINITY;
    l->b_correction[6] = -INFINITY;
    l->b_correction[1] = NAN;
    CHECK(hp_moe_ws_create(&ws, l, 3, &err) == HP_OK);
    float x[3 * 4] = {0.1f, -0.2f, 0.3f, 0.4f, 1, 2, 3, 4, -1, 0, 1, 0};
    int32_t idx[3 * 4];
    float w[3 * 4];
    if (ws) CHECK(hp_moe_route(l, ws, x, 3, idx, w, &err) == HP_OK);
    for (int t = 0; ws && t < 3; t++) {
        int groups = 0, seen[4] = {0};
        for (int k = 0; k < 4; k++) {
            CHECK(idx[t * 4 + k] >= 0 && idx[t * 4 + k] < 8);
            int g = idx[t * 4 + k] / 2;
            if (g >= 0 && g < 4 && !seen[g]++) groups++;
        }
        CHECK_MSG(groups <= 2, "token %d uses experts of %d groups (topk_group 2): %d %d %d %d", t, groups,
                  idx[t * 4], idx[t * 4 + 1], idx[t * 4 + 2], idx[t * 4 + 3]);
    }
    hp_moe_ws_destroy(ws);
    hp_moe_layer_free(l);
}

/* ---- size products that overflow ---- */

/* E·H of the router wrapped to 0: the layer was created with a 1-byte router for 2^40 x 2^24 weights. */
TEST(layer_create_refuses_overflowing_dims)
{
    hp_moe_dims d = {.n_hidden = (int64_t)1 << 24, .n_experts = (int64_t)1 << 40, .top_k = 1, .d_expert = 1,
                     .n_local = 1};
    hp_moe_layer *l = NULL;
    hp_err err;
    hp_status st = hp_moe_layer_create(&l, HP_MOE_QWEN3MOE_TOPK_ROUTER, &d, &err);
    CHECK_MSG(st != HP_OK, "a layer of 2^64 router weights was created");
    CHECK(l == NULL);
    hp_moe_layer_free(st == HP_OK ? l : NULL);
    /* Shared width whose 2·sI·H wraps. */
    hp_moe_dims s = {.n_hidden = 8, .n_experts = 2, .top_k = 1, .d_expert = 1, .d_shared = (int64_t)1 << 61};
    st = hp_moe_layer_create(&l, HP_MOE_QWEN2MOE_SHARED_EXPERT_GATE, &s, &err);
    CHECK_MSG(st != HP_OK, "a shared expert of 2^65 weights was created");
    hp_moe_layer_free(st == HP_OK ? l : NULL);
}

/* T·E of the logits wrapped to 0 for a layer described by hand; the workspace must refuse. Dimensions past
 * what BLAS's int arguments can take are refused as well. */
TEST(workspace_refuses_overflowing_dims)
{
    hp_moe_layer l;
    memset(&l, 0, sizeof l);
    l.n_hidden = 1;
    l.top_k = 1;
    l.n_experts = (int64_t)1 << 62;
    l.n_local = 1;
    l.d_expert = 1;
    hp_moe_ws *ws = NULL;
    hp_err err;
    hp_status st = hp_moe_ws_create(&ws, &l, 4, &err);
    CHECK_MSG(st == HP_ERR_INPUT, "status %d for 4 x 2^62 logits", (int)st);
    CHECK(ws == NULL);
    if (st == HP_ERR_INPUT) CHECK_STR_CONTAINS(err.msg, "too large");
    hp_moe_ws_destroy(st == HP_OK ? ws : NULL);
    l.n_experts = 4;
    l.d_expert = (int64_t)1 << 31;
    st = hp_moe_ws_create(&ws, &l, 4, &err);
    CHECK_MSG(st == HP_ERR_INPUT, "status %d for an expert width of 2^31", (int)st);
    hp_moe_ws_destroy(st == HP_OK ? ws : NULL);
}

/* ---- stage entry points with degenerate arguments ---- */

TEST(balanced_router_with_no_experts)
{
    int32_t idx[2] = {0, 0};
    float w[2] = {1, 1};
    hp_err err;
    CHECK(hp_moe_route_balance(idx, w, 2, 1, 0, 1, &err) == HP_ERR_INPUT); /* was a division by zero */
    CHECK_STR_CONTAINS(err.msg, "balanced router");
    CHECK(hp_moe_route_balance(idx, w, 2, 1, 2, 4, &err) == HP_ERR_INPUT); /* more local experts than experts */
    CHECK(hp_moe_route_balance(idx, w, 2, 1, 4, 2, &err) == HP_OK);
    CHECK(idx[0] == 0 && idx[1] == 2);
}

/* A workspace of a layer with the same shared width but a smaller H: shared_out [Tmax, H_small] would be
 * written H_big wide. */
TEST(shared_forward_checks_the_workspace_width)
{
    hp_moe_dims small = {.n_hidden = 4, .n_experts = 2, .top_k = 1, .d_expert = 2, .d_shared = 2};
    hp_moe_dims big = small;
    big.n_hidden = 64;
    hp_moe_layer *ls = NULL, *lb = NULL;
    hp_moe_ws *ws = NULL;
    hp_err err;
    CHECK(hp_moe_layer_create(&ls, HP_MOE_QWEN2MOE_SHARED_EXPERT_GATE, &small, &err) == HP_OK);
    CHECK(hp_moe_layer_create(&lb, HP_MOE_QWEN2MOE_SHARED_EXPERT_GATE, &big, &err) == HP_OK);
    if (ls) CHECK(hp_moe_ws_create(&ws, ls, 4, &err) == HP_OK);
    if (ws && lb) {
        float x[4 * 64] = {0}, y[4 * 64] = {0};
        CHECK(hp_moe_shared_forward(lb, ws, x, 4, y, &err) == HP_ERR_INPUT);
        CHECK_STR_CONTAINS(err.msg, "another layer shape");
    }
    hp_moe_ws_destroy(ws);
    hp_moe_layer_free(ls);
    hp_moe_layer_free(lb);
}

/* The reference figures with nothing to measure report "no figure" (< 0) instead of dividing by zero. */
TEST(reference_figures_with_empty_sizes)
{
    CHECK(hp_moe_ref_memcpy_gbps(0, 1) < 0);
    CHECK(hp_moe_ref_gemm_gflops(0, HP_LINALG_EXACT, 1) < 0);
    CHECK(hp_moe_ref_gemm_gflops(-5, HP_LINALG_BF16, 1) < 0);
    CHECK(hp_moe_ref_memcpy_gbps(1 << 16, 1) > 0);
}

/* ---- issue 10: non-finite weights, a folder without config.json, the weights' identity ---- */

/* A NaN in a shared expert is refused at load (the tensor, element, row and column named); a NaN in a routed
 * expert loads (expert weights are not scanned at load) and the forward fails naming the expert, never
 * returning NaN as a result. */
TEST(non_finite_expert_weights_fail_with_the_expert_named)
{
    const char *dir = gen("qwen2_moe", HP_LAYOUT_PER_EXPERT, "nan_shared");
    edit e1[] = {{.name = "model.layers.1.mlp.shared_expert.down_proj.weight", .elem = 67, .value = NAN}, {0}};
    CHECK(dir && rewrite(dir, e1));
    expect_load_error(dir, NULL, "shared_expert.down_proj.weight' holds NaN at element 67 (row 1, column 3)");
    dir = gen("qwen3_moe", HP_LAYOUT_PER_EXPERT, "nan_expert");
    static char names[8][96];
    edit e2[9];
    memset(e2, 0, sizeof e2);
    for (int e = 0; e < 8; e++) {
        snprintf(names[e], sizeof names[e], "model.layers.1.mlp.experts.%d.up_proj.weight", e);
        e2[e] = (edit){.name = names[e], .elem = 2 * 64 + 9, .value = INFINITY};
    }
    CHECK(dir && rewrite(dir, e2));
    hp_err err;
    hp_model *m = NULL;
    hp_moe_layer *l = NULL;
    hp_moe_ws *ws = NULL;
    CHECK(dir && hp_model_open(&m, dir, NULL, &err) == HP_OK);
    if (m) CHECK_MSG(hp_moe_layer_load(&l, m, 1, NULL, &err) == HP_OK, "%s", err.msg);
    if (l) CHECK(hp_moe_ws_create(&ws, l, 4, &err) == HP_OK);
    if (ws) {
        float x[4 * 64], y[4 * 64];
        for (int i = 0; i < 4 * 64; i++) x[i] = (float)sin(0.3 * i);
        CHECK_EQ_INT(hp_moe_forward(l, ws, x, 4, 64, y, NULL, &err), HP_ERR_INPUT);
        CHECK_STR_CONTAINS(err.msg, "layer 1: output row 0 is not finite");
        CHECK_STR_CONTAINS(err.msg, "gate/up projection [2I, H] holds +Inf at row 34, column 9"); /* up row 2 = row I+2 */
        CHECK_STR_CONTAINS(err.msg, "model.layers.1.mlp.experts (expert ");
    }
    hp_moe_ws_destroy(ws);
    hp_moe_layer_free(l);
    hp_model_close(m);
}

/* A weights-only folder: the message says config.json is missing, not "the model has 0 layers (0..-1)". */
TEST(folder_without_config_json)
{
    const char *dir = gen("qwen3_moe", HP_LAYOUT_PER_EXPERT, "nocfg");
    char cfg[300];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir ? dir : "");
    CHECK(dir && unlink(cfg) == 0);
    hp_err err;
    hp_model *m = NULL;
    hp_moe_layer *l = NULL;
    hp_status st = dir ? hp_model_open(&m, dir, NULL, &err) : HP_ERR_INPUT;
    if (st == HP_OK) st = hp_moe_layer_load(&l, m, 0, NULL, &err);
    CHECK_EQ_INT(st, HP_ERR_INPUT);
    CHECK(l == NULL);
    CHECK_STR_CONTAINS(err.msg, "config.json");
    CHECK(strstr(err.msg, "0..-1") == NULL);
    if (m) CHECK_STR_CONTAINS(err.msg, "declares no decoder layers: the folder has no config.json");
    hp_model_close(m);
}

/* hp_moe_layer_identity: the same on every rank of a checkpoint whatever its local experts; another seed,
 * or one changed byte in one expert the rank does not hold, gives another. */
TEST(layer_identity_tells_checkpoints_apart)
{
    static const struct {
        const char *name;
        uint64_t seed;
        int64_t poke; /* byte of expert 6's down_proj to change, or -1 */
    } ck[] = {{"id_a", 5, -1}, {"id_b", 7, -1}, {"id_c", 5, 40}};
    uint64_t id[3][2] = {{0}};
    for (int c = 0; c < 3; c++) {
        char dir[200];
        snprintf(dir, sizeof dir, "%s/%s", base(), ck[c].name);
        hp_gen_opts o;
        hp_gen_opts_default(&o);
        o.family = "qwen3_moe";
        o.seed = ck[c].seed;
        o.force = true;
        hp_err err;
        CHECK_MSG(hp_gen_checkpoint(&o, dir, &err) == HP_OK, "%s", err.msg);
        if (ck[c].poke >= 0) {
            edit e[] = {{.name = "model.layers.1.mlp.experts.6.down_proj.weight", .elem = ck[c].poke, .value = 0.5f},
                        {0}};
            CHECK(rewrite(dir, e));
        }
        hp_model *m = NULL;
        CHECK(hp_model_open(&m, dir, NULL, &err) == HP_OK);
        for (int half = 0; m && half < 2; half++) { /* ep=2: rank 0 holds experts [0, 4), rank 1 [4, 8) */
            hp_moe_load_opts lo;
            hp_moe_load_opts_default(&lo);
            lo.first_expert = 4 * half;
            lo.n_local = 4;
            hp_moe_layer *l = NULL;
            CHECK_MSG(hp_moe_layer_load(&l, m, 1, &lo, &err) == HP_OK, "%s", err.msg);
            if (l) CHECK(hp_moe_layer_identity(l, m, NULL, &id[c][half], &err) == HP_OK);
            hp_moe_layer_free(l);
        }
        hp_model_close(m);
    }
    CHECK(id[0][0] != 0 && id[0][0] == id[0][1]); /* ranks of one checkpoint agree */
    CHECK(id[1][0] == id[1][1]);
    CHECK(id[0][0] != id[1][0]);                  /* another seed */
    CHECK(id[0][0] != id[2][0]);                  /* rank 0 tells a changed expert of rank 1 */
}

TEST_MAIN()
