/*
 * test_moe_export.c — hp_moe_layer_export, the inverse of the loader's layout mapping.
 *
 * For every sparse layer of every tests/data/forward/<family> checkpoint (Mixtral's w1/w3/w2 per expert,
 * Qwen2-MoE's gated shared expert, Qwen3-MoE batched bf16, gpt-oss's interleaved batched experts with biases,
 * GLM4-MoE batched with shared experts, DeepSeek-V3 per expert with shared experts) and of every
 * tests/data/golden/<case> checkpoint: the layer is loaded whole with f32 weights, its own canonical weights
 * are exported, and every exported tensor must equal the checkpoint's tensor of that name element for element
 * (export∘load is the identity on the stored weights), at the stored shape. The exported names must be
 * exactly the layer's grad.<name> keys of train_io.safetensors (the forward folders), or exactly the block's
 * checkpoint tensors less gate.e_score_correction_bias (the golden folders). A meta model (config.json only)
 * gives the same names and shapes as the checkpoint. Then the errors: whole of another
 * shape, a missing and an extra array, a model of another family, and a callback's failure, which stops the
 * export and is returned.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperpar/model.h"
#include "hyperpar/moe.h"
#include "hyperpar/safetensors.h"
#include "testlib.h"

#ifndef HP_TEST_DATA
#define HP_TEST_DATA "data"
#endif

#define MAX_NAMES 1024

/* What the callback saw. */
typedef struct seen {
    const hp_model *m;
    const char *where;
    int n;
    char *names[MAX_NAMES];
    int64_t n_elems; /* compared */
    int fail_at;     /* > 0: return an error on that call (1-based) */
} seen;

/* Compares one exported tensor with the checkpoint's tensor of that name, widened to f32. */
static hp_status on_tensor(void *ctx, const char *name, const float *data, const int64_t *shape, int n_dims,
                           hp_err *err)
{
    seen *s = ctx;
    if (s->fail_at > 0 && s->n + 1 == s->fail_at)
        return hp_err_set(err, HP_ERR_IO, "test: the writer failed on '%s'", name);
    for (int i = 0; i < s->n; i++) CHECK_MSG(strcmp(s->names[i], name), "%s: '%s' exported twice", s->where, name);
    if (s->n < MAX_NAMES) s->names[s->n++] = strdup(name);
    const hp_ckpt_tensor *ct = hp_ckpt_find(s->m->ckpt, name);
    CHECK_MSG(ct != NULL, "%s: exported '%s', which the checkpoint lacks", s->where, name);
    if (!ct) return HP_OK;
    const hp_st_tensor *t = ct->t;
    CHECK_MSG(t->n_dims == n_dims, "%s: '%s' exported with %d dims, stored with %d", s->where, name, n_dims, t->n_dims);
    bool same = t->n_dims == n_dims;
    for (int d = 0; same && d < n_dims; d++) same = t->shape[d] == shape[d];
    CHECK_MSG(same, "%s: '%s' exported at another shape than stored", s->where, name);
    if (!same) return HP_OK;
    size_t nb = (size_t)(t->end - t->begin);
    void *raw = malloc(nb ? nb : 1);
    float *ref = malloc((size_t)t->n_elems * sizeof *ref + 1);
    hp_err e2;
    CHECK(raw && ref);
    if (raw && ref && hp_st_read(ct->file, t, 0, raw, nb, &e2) == HP_OK &&
        hp_dtype_to_f32(t->dtype, raw, ref, t->n_elems, &e2) == HP_OK) {
        int64_t bad = -1;
        for (int64_t i = 0; i < t->n_elems && bad < 0; i++)
            if (memcmp(&ref[i], &data[i], sizeof(float))) bad = i;
        CHECK_MSG(bad < 0, "%s: '%s' element %lld: exported %.9g, stored %.9g", s->where, name, (long long)bad,
                  bad < 0 ? 0.0 : (double)data[bad], bad < 0 ? 0.0 : (double)ref[bad]);
        s->n_elems += t->n_elems;
    } else {
        CHECK_MSG(false, "%s: reading '%s' failed", s->where, name);
    }
    free(raw);
    free(ref);
    return HP_OK;
}

static bool seen_has(const seen *s, const char *name)
{
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->names[i], name)) return true;
    return false;
}

static void seen_clear(seen *s)
{
    for (int i = 0; i < s->n; i++) free(s->names[i]);
    s->n = 0;
    s->n_elems = 0;
}

/* The carrier of a loaded whole layer's own weights (router widened from f64 to f32 into *router, *b_router). */
static void carrier(const hp_moe_layer *l, hp_moe_grads *g, float **router, float **b_router)
{
    const int64_t E = l->n_experts, H = l->n_hidden;
    *router = malloc((size_t)(E * H) * sizeof **router);
    *b_router = l->b_router ? malloc((size_t)E * sizeof **b_router) : NULL;
    for (int64_t i = 0; *router && i < E * H; i++) (*router)[i] = (float)l->w_router[i];
    for (int64_t i = 0; *b_router && i < E; i++) (*b_router)[i] = (float)l->b_router[i];
    *g = (hp_moe_grads){
        .n_hidden = H, .n_experts = E, .n_local = l->n_local, .d_expert = l->d_expert, .d_shared = l->d_shared,
        .d_gate_up = (float *)(uintptr_t)l->w_gate_up, .d_down = (float *)(uintptr_t)l->w_down,
        .d_b_gate_up = (float *)(uintptr_t)l->b_gate_up, .d_b_down = (float *)(uintptr_t)l->b_down,
        .d_w_router = *router, .d_b_router = *b_router,
        .d_ws_gate_up = l->ws_gate_up, .d_ws_down = l->ws_down, .d_ws_gate = l->ws_gate,
    };
}

static hp_moe_layer *load_whole(const hp_model *m, int64_t layer, const char *where)
{
    hp_moe_load_opts lo;
    hp_moe_load_opts_default(&lo);
    lo.no_zero_copy = true;
    lo.widen_f32 = true;
    hp_moe_layer *l = NULL;
    hp_err err;
    CHECK_MSG(hp_moe_layer_load(&l, m, layer, &lo, &err) == HP_OK, "%s layer %lld: %s", where, (long long)layer,
              err.msg);
    if (l) {
        CHECK(l->w_dtype == HP_DT_F32);
        CHECK(l->n_local == l->n_experts && l->first_expert == 0);
    }
    return l;
}

/* Every sparse layer of the checkpoint in dir: export∘load is the identity; with train_io (may be NULL) the
 * names are the layer's grad. keys, else the block's tensors less e_score_correction_bias. Returns the number
 * of sparse layers checked. */
static int check_folder(const char *dir, const char *train_io)
{
    hp_err err;
    hp_model *m = NULL;
    CHECK_MSG(hp_model_open(&m, dir, NULL, &err) == HP_OK, "%s: %s", dir, err.msg);
    if (!m) return 0;
    hp_st_file *tio = NULL;
    if (train_io) CHECK_MSG(hp_st_open(&tio, train_io, &err) == HP_OK, "%s: %s", train_io, err.msg);
    int n_layers = 0;
    for (int64_t L = 0; L < m->cfg.num_hidden_layers; L++) {
        if (!hp_model_layer_is_sparse(m, L)) continue;
        char where[600];
        snprintf(where, sizeof where, "%s layer %lld", dir, (long long)L);
        hp_moe_layer *l = load_whole(m, L, dir);
        if (!l) continue;
        n_layers++;
        hp_moe_grads g;
        float *router = NULL, *b_router = NULL;
        carrier(l, &g, &router, &b_router);
        seen s = {.m = m, .where = where};
        CHECK_MSG(hp_moe_layer_export(l, m, &g, on_tensor, &s, &err) == HP_OK, "%s: %s", where, err.msg);
        CHECK_MSG(s.n > 0, "%s: nothing exported", where);
        /* The expected set: the golden's grad. keys of the block, or the block's stored tensors. */
        size_t np = strlen(l->prefix);
        int n_expected = 0;
        if (tio) {
            for (size_t i = 0; i < hp_st_count(tio); i++) {
                const char *k = hp_st_tensor_at(tio, i)->name;
                if (strncmp(k, "grad.", 5) || strncmp(k + 5, l->prefix, np)) continue;
                n_expected++;
                CHECK_MSG(seen_has(&s, k + 5), "%s: train_io has '%s' but the export did not give '%s'", where, k,
                          k + 5);
            }
        } else {
            for (size_t i = 0; i < m->n_params; i++) {
                const char *k = m->params[i].name;
                if (strncmp(k, l->prefix, np) || strstr(k, "e_score_correction_bias")) continue;
                n_expected++;
                CHECK_MSG(seen_has(&s, k), "%s: the checkpoint has '%s' but the export did not give it", where, k);
            }
        }
        CHECK_MSG(s.n == n_expected, "%s: exported %d tensors, expected %d", where, s.n, n_expected);
        /* Every element of the layer's parameters was compared: E·3·I·H experts, E·H router, the rest. */
        int64_t E = l->n_experts, H = l->n_hidden, I = l->d_expert, sI = l->d_shared;
        int64_t want = E * 3 * I * H + E * H + (l->b_router ? E : 0) + (l->b_gate_up ? E * 2 * I + E * H : 0) +
                       3 * sI * H + (l->ws_gate ? H : 0);
        CHECK_MSG(s.n_elems == want, "%s: compared %lld elements, the layer has %lld", where, (long long)s.n_elems,
                  (long long)want);
        seen_clear(&s);
        free(router);
        free(b_router);
        hp_moe_layer_free(l);
    }
    hp_st_close(tio);
    hp_model_close(m);
    return n_layers;
}

TEST(forward_families_identity_and_names)
{
    static const char *fams[] = {"mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss", "glm4_moe", "deepseek_v3"};
    for (size_t f = 0; f < sizeof fams / sizeof *fams; f++) {
        char dir[512], tio[600];
        snprintf(dir, sizeof dir, "%s/forward/%s", HP_TEST_DATA, fams[f]);
        snprintf(tio, sizeof tio, "%s/train_io.safetensors", dir);
        int n = check_folder(dir, tio);
        CHECK_MSG(n >= 1, "%s: no sparse layer was checked", dir);
    }
}

TEST(golden_layouts_identity)
{
    static const char *cases[] = {"deepseek_v3_per_expert_f32", "glm4_moe_batched_bf16", "gpt_oss_batched_f32",
                                  "mixtral_batched_bf16", "mixtral_per_expert_f32", "qwen2_moe_per_expert_f32",
                                  "qwen3_moe_batched_bf16"};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/golden/%s", HP_TEST_DATA, cases[c]);
        int n = check_folder(dir, NULL);
        CHECK_MSG(n >= 1, "%s: no sparse layer was checked", dir);
    }
}

/* Records names and shapes only (for exports against a meta model, which has no bytes to compare). */
static hp_status on_name(void *ctx, const char *name, const float *data, const int64_t *shape, int n_dims,
                         hp_err *err)
{
    (void)err;
    seen *s = ctx;
    CHECK(data != NULL);
    char buf[512];
    int k = snprintf(buf, sizeof buf, "%s", name);
    for (int d = 0; d < n_dims && k > 0 && (size_t)k < sizeof buf; d++)
        k += snprintf(buf + k, sizeof buf - (size_t)k, "%c%lld", d ? ',' : ' ', (long long)shape[d]);
    if (s->n < MAX_NAMES) s->names[s->n++] = strdup(buf);
    return HP_OK;
}

/* A meta model (config.json only, in the checkpoint's layout) names and shapes every tensor as the checkpoint
 * does: the export against it gives the same list, in the same order, as against the checkpoint. */
TEST(meta_model_names)
{
    static const char *fams[] = {"mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss", "glm4_moe", "deepseek_v3"};
    for (size_t f = 0; f < sizeof fams / sizeof *fams; f++) {
        char dir[512], cfg[600];
        hp_err err;
        snprintf(dir, sizeof dir, "%s/forward/%s", HP_TEST_DATA, fams[f]);
        snprintf(cfg, sizeof cfg, "%s/config.json", dir);
        hp_model *m = NULL, *meta = NULL;
        CHECK_MSG(hp_model_open(&m, dir, NULL, &err) == HP_OK, "%s: %s", dir, err.msg);
        if (!m) continue;
        hp_model_opts mo = {.layout = m->layout};
        CHECK_MSG(hp_model_open(&meta, cfg, &mo, &err) == HP_OK, "%s: %s", cfg, err.msg);
        for (int64_t L = 0; meta && L < m->cfg.num_hidden_layers; L++) {
            if (!hp_model_layer_is_sparse(m, L)) continue;
            CHECK(meta->meta);
            hp_moe_layer *l = load_whole(m, L, dir);
            if (!l) continue;
            hp_moe_grads g;
            float *r = NULL, *br = NULL;
            carrier(l, &g, &r, &br);
            seen a = {.m = m, .where = dir}, b = {.m = meta, .where = cfg};
            CHECK_MSG(hp_moe_layer_export(l, m, &g, on_name, &a, &err) == HP_OK, "%s: %s", dir, err.msg);
            CHECK_MSG(hp_moe_layer_export(l, meta, &g, on_name, &b, &err) == HP_OK, "%s: %s", cfg, err.msg);
            CHECK_MSG(a.n == b.n && a.n > 0, "%s layer %lld: %d tensors from the checkpoint, %d from the meta model",
                      dir, (long long)L, a.n, b.n);
            for (int i = 0; i < a.n && i < b.n; i++)
                CHECK_MSG(!strcmp(a.names[i], b.names[i]), "%s: '%s' vs meta '%s'", dir, a.names[i], b.names[i]);
            seen_clear(&a);
            seen_clear(&b);
            free(r);
            free(br);
            hp_moe_layer_free(l);
        }
        hp_model_close(meta);
        hp_model_close(m);
    }
}

/* Opens dir and loads its first sparse layer whole, with its carrier. */
static bool open_first(const char *fam, hp_model **m, hp_moe_layer **l, hp_moe_grads *g, float **r, float **br)
{
    char dir[512];
    hp_err err;
    snprintf(dir, sizeof dir, "%s/forward/%s", HP_TEST_DATA, fam);
    *l = NULL;
    CHECK_MSG(hp_model_open(m, dir, NULL, &err) == HP_OK, "%s: %s", dir, err.msg);
    if (!*m) return false;
    int64_t L = 0;
    while (L < (*m)->cfg.num_hidden_layers && !hp_model_layer_is_sparse(*m, L)) L++;
    if (!(*l = load_whole(*m, L, dir))) return false;
    carrier(*l, g, r, br);
    return true;
}

TEST(errors)
{
    hp_model *m = NULL, *m2 = NULL;
    hp_moe_layer *l = NULL;
    hp_moe_grads g, bad;
    float *r = NULL, *br = NULL;
    hp_err err;
    seen s = {0};
    if (!open_first("gpt_oss", &m, &l, &g, &r, &br)) goto out;
    s.m = m, s.where = "errors";

    /* A slice of the experts (EP not gathered): refused before any tensor is handed out. */
    bad = g, bad.n_local = g.n_experts / 2;
    CHECK(hp_moe_layer_export(l, m, &bad, on_tensor, &s, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "export takes the whole layer");
    CHECK_EQ_INT(s.n, 0);
    /* An expert width of a tp block: the model's shapes say otherwise. */
    bad = g, bad.d_expert = g.d_expert / 2;
    CHECK(hp_moe_layer_export(l, m, &bad, on_tensor, &s, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "gradients were gathered for another shape");
    CHECK_STR_CONTAINS(err.msg, "experts.gate_up_proj");
    CHECK_EQ_INT(s.n, 0);
    /* gpt-oss's router bias missing; an array the archetype does not have. */
    bad = g, bad.d_b_router = NULL;
    CHECK(hp_moe_layer_export(l, m, &bad, on_tensor, &s, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "d_b_router is NULL");
    bad = g, bad.d_expert = INT64_MAX / 4;
    CHECK(hp_moe_layer_export(l, m, &bad, on_tensor, &s, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "overflow a size");
    bad = g, bad.d_ws_gate = r;
    CHECK(hp_moe_layer_export(l, m, &bad, on_tensor, &s, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "d_ws_gate is given");
    CHECK_EQ_INT(s.n, 0);
    /* The writer fails on the third tensor: the export stops there and returns its status and message. */
    s.fail_at = 3;
    CHECK(hp_moe_layer_export(l, m, &g, on_tensor, &s, &err) == HP_ERR_IO);
    CHECK_STR_CONTAINS(err.msg, "the writer failed on");
    CHECK_EQ_INT(s.n, 2);
    seen_clear(&s);
    s.fail_at = 0;

    /* Against a model of another family: its names are not the layer's. */
    char dir[512];
    snprintf(dir, sizeof dir, "%s/forward/mixtral", HP_TEST_DATA);
    CHECK(hp_model_open(&m2, dir, NULL, &err) == HP_OK);
    if (m2) {
        CHECK(hp_moe_layer_export(l, m2, &g, on_tensor, &s, &err) == HP_ERR_INPUT);
        CHECK_STR_CONTAINS(err.msg, "has no tensor 'model.layers.");
        CHECK_EQ_INT(s.n, 0);
    }
out:
    seen_clear(&s);
    free(r);
    free(br);
    hp_moe_layer_free(l);
    hp_model_close(m);
    hp_model_close(m2);
}

/* Any rank's layer object serves: one holding an EP slice of the experts and a tp block of their width exports
 * the whole layer's arrays exactly as the whole layer object does. */
TEST(slice_layer_object)
{
    static const char *fams[] = {"qwen2_moe", "gpt_oss", "glm4_moe"};
    for (size_t f = 0; f < sizeof fams / sizeof *fams; f++) {
        hp_model *m = NULL;
        hp_moe_layer *l = NULL, *sl = NULL;
        hp_moe_grads g;
        float *r = NULL, *br = NULL;
        hp_err err;
        if (open_first(fams[f], &m, &l, &g, &r, &br)) {
            hp_moe_load_opts lo;
            hp_moe_load_opts_default(&lo);
            lo.widen_f32 = true;
            lo.first_expert = 2, lo.n_local = 2, lo.tp_size = 2, lo.tp_rank = 1;
            CHECK_MSG(hp_moe_layer_load(&sl, m, l->layer, &lo, &err) == HP_OK, "%s: %s", fams[f], err.msg);
            if (sl) {
                CHECK(sl->n_local == 2 && sl->d_expert == l->d_expert / 2);
                seen s = {.m = m, .where = fams[f]};
                CHECK_MSG(hp_moe_layer_export(sl, m, &g, on_tensor, &s, &err) == HP_OK, "%s: %s", fams[f], err.msg);
                CHECK(s.n > 0);
                seen_clear(&s);
            }
        }
        free(r);
        free(br);
        hp_moe_layer_free(sl);
        hp_moe_layer_free(l);
        hp_model_close(m);
    }
}

/* A block tensor the archetype has no array for is refused by name: a Qwen3-MoE layer (no shared expert) over
 * Qwen2-MoE's block, loaded as qwen3moe_topk_router. */
TEST(unknown_block_tensor)
{
    char dir[512];
    hp_err err;
    hp_model *m = NULL;
    snprintf(dir, sizeof dir, "%s/forward/qwen2_moe", HP_TEST_DATA);
    CHECK(hp_model_open(&m, dir, NULL, &err) == HP_OK);
    if (!m) return;
    int64_t L = 0;
    while (L < m->cfg.num_hidden_layers && !hp_model_layer_is_sparse(m, L)) L++;
    hp_moe_load_opts lo;
    hp_moe_load_opts_default(&lo);
    lo.no_zero_copy = true;
    lo.widen_f32 = true;
    lo.archetype = HP_MOE_QWEN3MOE_TOPK_ROUTER;
    hp_moe_layer *l = NULL;
    CHECK_MSG(hp_moe_layer_load(&l, m, L, &lo, &err) == HP_OK, "%s", err.msg);
    if (l) {
        hp_moe_grads g;
        float *r = NULL, *br = NULL;
        carrier(l, &g, &r, &br);
        seen s = {.m = m, .where = "unknown"};
        CHECK(hp_moe_layer_export(l, m, &g, on_tensor, &s, &err) == HP_ERR_INPUT);
        CHECK_STR_CONTAINS(err.msg, "shared_expert");
        CHECK_STR_CONTAINS(err.msg, "has no array for it");
        CHECK_EQ_INT(s.n, 0);
        seen_clear(&s);
        free(r);
        free(br);
    }
    hp_moe_layer_free(l);
    hp_model_close(m);
}

TEST_MAIN()
