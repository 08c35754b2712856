/*
 * test_run.c — pieces of the runtime on their own: the tolerance check's worst coordinates, the config-default
 * traps the forward pass reads (Mistral's window when absent, Qwen's use_sliding_window / max_window_layers,
 * explicit layer_types, rope_scaling replacing rope_theta's dict), llama3 rope in its three bands against the
 * formula, and the nested cp-major sequence layout of spec §9.6.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperpar/run.h"
#include "run/run_int.h"
#include "testlib.h"

TEST(tolerance_worst_coordinates)
{
    float ref[2 * 3 * 4], got[2 * 3 * 4];
    for (int i = 0; i < 24; i++) ref[i] = got[i] = (float)(i - 10);
    got[1 * 12 + 2 * 4 + 3] += 0.5f; /* [1, 2, 3] */
    int64_t shape[3] = {2, 3, 4};
    hp_tol t;
    CHECK(!hp_tol_check(got, ref, 3, shape, 1e-4, &t));
    CHECK(fabs(t.max_diff - 0.5) < 1e-6 && t.max_ref == 13);
    char buf[256];
    CHECK_STR_CONTAINS(hp_tol_str(&t, buf, sizeof buf), "at [1, 2, 3]");
    CHECK_STR_CONTAINS(buf, "MISMATCH");
    CHECK(hp_tol_check(got, ref, 3, shape, 0.5 / 13 + 1e-9, &t));
    got[0] = NAN;
    CHECK(!hp_tol_check(got, ref, 3, shape, 1.0, &t)); /* a NaN never passes */
}

/* Windows per layer from a config text (meta model of the family). */
static bool windows(const char *text, int64_t *w, int64_t L)
{
    hp_model *m = NULL;
    hp_err err;
    char path[256];
    snprintf(path, sizeof path, "%s/config.json", test_work_dir("run"));
    FILE *f = fopen(path, "w");
    if (!f) return false;
    fputs(text, f);
    fclose(f);
    bool ok = hp_model_from_config_text(&m, text, strlen(text), path, NULL, &err) == HP_OK;
    hp__rcfg c;
    ok = ok && hp__rcfg_read(m, path, &c, &err) == HP_OK;
    if (!ok) fprintf(stderr, "  %s\n", err.msg);
    for (int64_t i = 0; ok && i < L; i++) w[i] = c.window[i];
    if (ok) hp__rcfg_free(&c);
    hp_model_close(m);
    remove(path);
    return ok;
}

#define BASE "\"hidden_size\": 64, \"num_hidden_layers\": 3, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, " \
             "\"intermediate_size\": 128, \"vocab_size\": 128"

TEST(sliding_window_defaults)
{
    int64_t w[3];
    CHECK(windows("{\"model_type\": \"mistral\", " BASE "}", w, 3));
    CHECK(w[0] == 4096 && w[2] == 4096); /* MistralConfig's default when the key is absent */
    CHECK(windows("{\"model_type\": \"mistral\", \"sliding_window\": null, " BASE "}", w, 3));
    CHECK(w[0] == 0 && w[1] == 0);
    CHECK(windows("{\"model_type\": \"qwen2\", \"sliding_window\": 8, " BASE "}", w, 3));
    CHECK(w[0] == 0 && w[2] == 0); /* use_sliding_window false by default */
    CHECK(windows("{\"model_type\": \"qwen2\", \"use_sliding_window\": true, \"sliding_window\": 8, "
                  "\"max_window_layers\": 1, " BASE "}", w, 3));
    CHECK(w[0] == 0 && w[1] == 8 && w[2] == 8);
    CHECK(windows("{\"model_type\": \"qwen3\", \"sliding_window\": 5, \"layer_types\": [\"sliding_attention\", "
                  "\"full_attention\", \"sliding_attention\"], " BASE "}", w, 3));
    CHECK(w[0] == 5 && w[1] == 0 && w[2] == 5); /* explicit layer_types win */
    CHECK(windows("{\"model_type\": \"llama\", \"sliding_window\": 8, " BASE "}", w, 3));
    CHECK(w[0] == 0); /* llama has no window */
    CHECK(!windows("{\"model_type\": \"llama\", \"layer_types\": [\"x\"], " BASE "}", w, 3));
    CHECK(!windows("{\"model_type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"longrope\"}, " BASE "}", w, 3));
    CHECK(!windows("{\"model_type\": \"llama\", \"hidden_act\": \"relu\", " BASE "}", w, 3));
}

TEST(llama3_rope_bands)
{
    hp__rcfg c = {.hd = 16, .rot = 16, .theta = 10000, .rope = HP__ROPE_LLAMA3, .factor = 8, .low = 1, .high = 4,
                  .orig_max = 256, .attn_scale = 1};
    float *co, *si;
    hp_err err;
    CHECK(hp__rope_table(&c, 3, 2, &co, &si, &err) == HP_OK);
    int bands[3] = {0, 0, 0};
    for (int i = 0; i < 8; i++) {
        double inv = 1.0 / pow(10000.0, 2.0 * i / 16), wl = 2 * M_PI / inv, v = inv;
        if (wl > 256.0 / 1) v = inv / 8, bands[2]++;
        else if (wl < 256.0 / 4) bands[0]++;
        else {
            double sm = (256.0 / wl - 1) / (4 - 1);
            v = (1 - sm) * inv / 8 + sm * inv;
            bands[1]++;
        }
        for (int p = 0; p < 2; p++) CHECK(fabs(co[p * 8 + i] - cos(v * (3 + p))) < 2e-6);
    }
    CHECK(bands[0] && bands[1] && bands[2]); /* all three bands occur */
    free(co);
    free(si);
}

TEST(nested_cp_major_layout)
{
    hp__axes x = {{2, 2}, {0, 0}};
    hp__lay l = {{hp_pl_s(1), hp_pl_s(1)}};
    int64_t g[3] = {1, 16, 8};
    /* chunk id cp_rank * tp + tp_rank holds [4 id, 4 id + 4) */
    for (int c = 0; c < 2; c++)
        for (int t = 0; t < 2; t++) {
            int64_t lo, n;
            hp__lay_range(&x, &l, g, 1, t, c, &lo, &n);
            CHECK_EQ_INT(lo, 4 * (c * 2 + t));
            CHECK_EQ_INT(n, 4);
        }
    int64_t g2[3] = {1, 15, 8}, lo, n; /* uneven: cp blocks 7/8, then tp */
    hp__lay_range(&x, &l, g2, 1, 1, 1, &lo, &n);
    CHECK_EQ_INT(lo, 11);
    CHECK_EQ_INT(n, 4);
}

/* A one-process runner of the golden model in dir under opts, with its forward_io file open. */
typedef struct golden_run {
    hp_model *m;
    hp_plan *p;
    hp_comm *c;
    hp_runner *r;
    hp_st_file *f;
    const hp_st_tensor *ids; /* input_ids */
} golden_run;

static bool golden_open(golden_run *g, const char *dir, const hp_run_opts *ro, hp_err *err)
{
    char io[200];
    snprintf(io, sizeof io, "%s/forward_io.safetensors", dir);
    memset(g, 0, sizeof *g);
    hp_plan_opts po;
    hp_plan_opts_default(&po);
    bool ok = hp_model_open(&g->m, dir, NULL, err) == HP_OK && hp_plan_derive(&g->p, g->m, &po, err) == HP_OK &&
              hp_comm_self(&g->c, err) == HP_OK && hp_st_open(&g->f, io, err) == HP_OK &&
              hp_runner_create(&g->r, g->c, g->m, g->p, ro, err) == HP_OK;
    g->ids = ok ? hp_st_find(g->f, "input_ids") : NULL;
    return g->ids != NULL;
}

static bool golden_forward(golden_run *g, hp_run_output *out, hp_err *err)
{
    return hp_runner_forward(g->r, hp_st_data(g->f, g->ids), g->ids->shape[0], g->ids->shape[1], out, err) == HP_OK;
}

static void golden_close(golden_run *g)
{
    hp_runner_free(g->r);
    hp_st_close(g->f);
    hp_comm_free(g->c);
    hp_plan_free(g->p);
    hp_model_close(g->m);
}

/* keep_activations: each layer's input is the golden residual stream (embed, layer.0, ...) in one process,
 * also a per-layer check of the forward against transformers' semantics. */
TEST(kept_activations_are_the_golden_stream)
{
    static const char *const fams[] = {"llama", "mistral", "qwen2", "qwen3"};
    for (size_t k = 0; k < 4; k++) {
        char dir[128];
        snprintf(dir, sizeof dir, "data/forward/%s", fams[k]);
        hp_err err;
        golden_run g;
        hp_run_opts ro = {.keep_activations = true};
        hp_run_output out = {0};
        bool ok = golden_open(&g, dir, &ro, &err) && golden_forward(&g, &out, &err);
        CHECK_MSG(ok, "%s: %s", fams[k], err.msg);
        hp_model *m = g.m;
        hp_runner *r = g.r;
        hp_st_file *f = g.f;
        for (int64_t l = 0; ok && l <= m->cfg.num_hidden_layers; l++) {
            char key[32];
            if (l == 0) snprintf(key, sizeof key, "embed");
            else snprintf(key, sizeof key, "layer.%lld", (long long)(l - 1));
            const hp_st_tensor *t = hp_st_find(f, key);
            int64_t gs[3], lo[3], n[3];
            const float *a = hp_runner_activation(r, l, gs, lo, n);
            CHECK(t && a && n[0] * n[1] * n[2] == t->n_elems);
            if (!t || !a) continue;
            hp_tol tol;
            CHECK_MSG(hp_tol_check(a, hp_st_data(f, t), 1, &t->n_elems, 1e-4, &tol), "%s %s: %.3g", fams[k], key,
                      tol.max_diff);
        }
        CHECK(!r || !hp_runner_activation(r, 99, (int64_t[3]){0}, (int64_t[3]){0}, (int64_t[3]){0}));
        hp_run_output_free(&out);
        golden_close(&g);
    }
}

/* hp_runner_recycle_output: the one-process logits buffer goes back to the runner, and the next forward writes the
 * same logits into it (no fresh buffer); an output that is not the handed buffer is only freed. */
TEST(recycled_logits_buffer_is_reused_with_the_same_logits)
{
    hp_err err;
    golden_run g;
    hp_run_opts ro = {0};
    hp_run_output o1 = {0}, o2 = {0}, o3 = {0};
    bool ok = golden_open(&g, "data/forward/llama", &ro, &err) && golden_forward(&g, &o1, &err);
    CHECK_MSG(ok, "%s", err.msg);
    hp_runner *r = g.r;
    size_t n = ok ? (size_t)(o1.B * o1.S * o1.V) : 0;
    float *first = ok ? malloc(n * sizeof *first) : NULL, *buf = o1.logits;
    if (first) memcpy(first, o1.logits, n * sizeof *first);
    hp_runner_recycle_output(r, &o1);
    CHECK(o1.logits == NULL);
    ok = ok && golden_forward(&g, &o2, &err);
    CHECK_MSG(ok, "%s", err.msg);
    CHECK(!ok || o2.logits == buf);
    CHECK(!ok || memcmp(o2.logits, first, n * sizeof *first) == 0);
    ok = ok && golden_forward(&g, &o3, &err);
    hp_runner_recycle_output(r, &o2); /* not the last forward's buffer: freed, not kept */
    hp_runner_recycle_output(r, &o3);
    CHECK(o2.logits == NULL && o3.logits == NULL);
    free(first);
    golden_close(&g);
}

/* A sparse model's runners (qwen3_moe: two sparse layers on one EP runtime) keep their runtime across forwards of
 * fewer rows: a 3000-token prefill (3 dispatch chunks of 1000), then 7 tokens (one chunk: the prefill's runtime
 * serves it, no new one), then the prefill again. The 7-token logits equal a fresh runner's byte for byte (the same
 * expert passes), and the second prefill's the first's; the routing of both sparse layers is returned. */
TEST(moe_runtime_serves_fewer_rows_after_a_long_prefill)
{
    hp_err err;
    golden_run g = {0}, f = {0};
    hp_run_opts ro = {0};
    enum { T = 3000, S = 7 };
    int64_t *ids = malloc(T * sizeof *ids);
    hp_run_output a = {0}, b = {0}, c = {0}, d = {0};
    bool ok = ids && golden_open(&g, "data/forward/qwen3_moe", &ro, &err) &&
              golden_open(&f, "data/forward/qwen3_moe", &ro, &err);
    CHECK_MSG(ok, "%s", ok ? "" : err.msg);
    for (int64_t i = 0; ids && i < T; i++) ids[i] = (i * 7919 + 13) % (ok ? g.m->cfg.vocab_size : 1);
    ok = ok && hp_runner_forward(g.r, ids, 1, T, &a, &err) == HP_OK && hp_runner_forward(g.r, ids, 1, S, &b, &err) == HP_OK &&
         hp_runner_forward(f.r, ids, 1, S, &c, &err) == HP_OK && hp_runner_forward(g.r, ids, 1, T, &d, &err) == HP_OK;
    CHECK_MSG(ok, "%s", ok ? "" : err.msg);
    if (ok) {
        CHECK_EQ_INT(a.n_moe, 2);
        CHECK(!memcmp(b.logits, c.logits, (size_t)(S * b.V) * sizeof *b.logits));
        CHECK(!memcmp(a.logits, d.logits, (size_t)(T * a.V) * sizeof *a.logits));
        CHECK(!memcmp(b.topk_idx[1], c.topk_idx[1], (size_t)(S * b.K) * sizeof(int32_t)));
    }
    hp_run_output_free(&a), hp_run_output_free(&b), hp_run_output_free(&c), hp_run_output_free(&d);
    free(ids);
    golden_close(&g);
    golden_close(&f);
}

TEST_MAIN()
