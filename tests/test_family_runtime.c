/*
 * test_family_runtime.c — the family table's forward facts (rope style, interleave default, partial rotary
 * default, sliding-window rule and default, which families the runtime runs) against
 * shared/spec/transformers_forward.md, and the runtime's config (hp__rcfg) read from the model's one parse
 * of config.json: unchanged for every golden forward model (every tests/data/forward model) and for a sweep of config
 * variants per family (tests/data/rcfg/variants.txt, recorded from the runtime before the family facts moved
 * into the table; regenerate only on purpose, with -DHP_RCFG_PRINT).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "hyperpar/gen.h"
#include "hyperpar/model.h"
#include "model/family.h"
#include "run/run_int.h"
#include "testlib.h"

/* One line describing c, every field the forward pass reads (doubles to 17 digits: exact). */
static void rcfg_line(const hp__rcfg *c, char *buf, size_t cap)
{
    int o = snprintf(buf, cap,
                     "shape %lld %lld %lld %lld %lld %lld %lld eps %.17g rope %d theta %.17g factor %.17g low %.17g "
                     "high %.17g partial %.17g scale %.17g beta %.17g/%.17g mscale_all %.17g interleave %d "
                     "truncate %d orig %lld rot %lld windows",
                     (long long)c->H, (long long)c->L, (long long)c->nh, (long long)c->nkv, (long long)c->hd,
                     (long long)c->V, (long long)c->I, c->eps, (int)c->rope, c->theta, c->factor, c->low, c->high,
                     c->partial, c->attn_scale, c->beta_fast, c->beta_slow, c->mscale_all_dim, (int)c->interleave,
                     (int)c->truncate, (long long)c->orig_max, (long long)c->rot);
    for (int64_t i = 0; i < c->L && o > 0 && (size_t)o < cap; i++)
        o += snprintf(buf + o, cap - (size_t)o, " %lld", (long long)c->window[i]);
}

/* The config variants: keys set (a JSON object text) or removed ("-key"), applied to gen's config. */
static const char *const g_variants[] = {
    "{}",
    "-rms_norm_eps -rope_theta -hidden_act -partial_rotary_factor",
    "{\"sliding_window\": 8}",
    "{\"sliding_window\": null}",
    "{\"sliding_window\": 8, \"use_sliding_window\": true}",
    "{\"sliding_window\": 8, \"use_sliding_window\": true, \"max_window_layers\": 1}",
    "{\"sliding_window\": 2, \"use_sliding_window\": true, \"max_window_layers\": 2}",
    "{\"sliding_window\": 8, \"layer_types\": [\"full_attention\", \"sliding_attention\", \"sliding_attention\"]}",
    "{\"sliding_window\": 4, \"layer_types\": null}",
    "{\"sliding_window\": 0}",
    "{\"sliding_window\": 3.5}",
    "{\"layer_types\": [\"x\", \"y\", \"z\"]}",
    "{\"layer_types\": [\"full_attention\"]}",
    "{\"layer_types\": \"full_attention\"}",
    "{\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4, \"original_max_position_embeddings\": 64}}",
    "{\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2}, \"rope_theta\": 500000}",
    "{\"rope_parameters\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, \"high_freq_factor\": 4, "
    "\"rope_theta\": 20000}}",
    "{\"rope_scaling\": null, \"partial_rotary_factor\": 0.25}",
    "{\"rope_scaling\": {\"rope_type\": \"default\", \"partial_rotary_factor\": 0.5}, \"partial_rotary_factor\": 0.25}",
    "{\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 40, \"mscale\": 1, \"mscale_all_dim\": 0.5, "
    "\"truncate\": false, \"beta_fast\": 16}}",
    "{\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 8, \"attention_factor\": 0.9, \"beta_slow\": 2}}",
    "{\"rope_scaling\": {\"rope_type\": 7, \"type\": \"linear\", \"factor\": 2}}",
    "{\"rope_scaling\": \"bad\"}",
    "{\"rope_scaling\": \"bad\", \"rope_parameters\": {\"rope_type\": \"linear\", \"factor\": 3}}",
    "{\"rope_parameters\": 5}",
    "{\"rope_scaling\": {\"rope_type\": \"longrope\"}}",
    "{\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 4, \"high_freq_factor\": 1}}",
    "{\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 0}}",
    "{\"rope_theta\": \"x\"}",
    "{\"rope_theta\": 1}",
    "{\"rope_interleave\": false}",
    "{\"rope_interleave\": null}",
    "{\"rope_interleave\": true}",
    "{\"partial_rotary_factor\": 0.05}",
    "{\"partial_rotary_factor\": 1.5}",
    "{\"hidden_act\": \"gelu\"}",
    "{\"hidden_act\": \"swish\"}",
    "{\"hidden_act\": 3}",
    "{\"rms_norm_eps\": 0}",
    "{\"rms_norm_eps\": 1e-5}",
    "{\"max_window_layers\": \"2\", \"use_sliding_window\": true, \"sliding_window\": 3}",
    "{\"use_sliding_window\": \"yes\", \"sliding_window\": 3}",
};
#define N_VARIANTS (sizeof g_variants / sizeof *g_variants)

/* gen's config of family f (three layers) with variant v applied, as text (malloc'd). */
static char *variant_text(const char *family, const char *v)
{
    hp_gen_opts go;
    hp_gen_opts_default(&go);
    go.family = family;
    go.layers = 3;
    char *text = NULL;
    hp_err err;
    if (hp_gen_config_text(&go, &text, &err) != HP_OK) return NULL;
    json_error_t je;
    json_t *root = json_loads(text, 0, &je);
    free(text);
    if (!root) return NULL;
    if (v[0] == '-') {
        char keys[256];
        snprintf(keys, sizeof keys, "%s", v);
        for (char *k = strtok(keys, " "); k; k = strtok(NULL, " ")) json_object_del(root, k + 1);
    } else {
        json_t *add = json_loads(v, 0, &je);
        if (!add) {
            json_decref(root);
            return NULL;
        }
        json_object_update(root, add);
        json_decref(add);
    }
    text = json_dumps(root, JSON_PRESERVE_ORDER);
    json_decref(root);
    return text;
}

/* "family | variant | <rcfg line or ERR message>", the config labelled "cfg.json" in messages. */
static bool variant_line(const char *family, const char *v, char *buf, size_t cap)
{
    char *text = variant_text(family, v);
    if (!text) return false;
    char path[256];
    snprintf(path, sizeof path, "%s/cfg.json", test_work_dir("family_runtime"));
    FILE *f = fopen(path, "w");
    if (!f) {
        free(text);
        return false;
    }
    fputs(text, f);
    fclose(f);
    hp_model *m = NULL;
    hp_err err;
    char line[4096];
    hp_status st = hp_model_from_config_text(&m, text, strlen(text), path, NULL, &err);
    if (st == HP_OK) {
        hp__rcfg c;
        st = hp__rcfg_read(m, path, &c, &err);
        if (st == HP_OK) {
            rcfg_line(&c, line, sizeof line);
            hp__rcfg_free(&c);
        }
    }
    if (st != HP_OK) {
        const char *msg = err.msg, *at = strstr(msg, path);
        if (at) snprintf(line, sizeof line, "ERR %d %.*scfg.json%s", (int)st, (int)(at - msg), msg, at + strlen(path));
        else snprintf(line, sizeof line, "ERR %d %s", (int)st, msg);
    }
    hp_model_close(m);
    remove(path);
    free(text);
    snprintf(buf, cap, "%s | %s | %s", family, v, line);
    return true;
}

TEST(rcfg_variants_unchanged)
{
#ifdef HP_RCFG_PRINT
    FILE *out = fopen("data/rcfg/variants.txt", "w");
#else
    FILE *in = fopen("data/rcfg/variants.txt", "r");
    CHECK(in != NULL);
    if (!in) return;
#endif
    int n_lines = 0;
    for (size_t i = 0; i < hp_family_count(); i++) {
        const char *fam = hp_family_name(hp_family_at(i));
        for (size_t v = 0; v < N_VARIANTS; v++) {
            char got[8192];
            bool ok = variant_line(fam, g_variants[v], got, sizeof got);
            CHECK_MSG(ok, "%s %s: no config", fam, g_variants[v]);
            if (!ok) continue;
            n_lines++;
#ifdef HP_RCFG_PRINT
            fprintf(out, "%s\n", got);
#else
            char want[8192];
            bool have = fgets(want, sizeof want, in) != NULL;
            if (have) want[strcspn(want, "\n")] = '\0';
            CHECK_MSG(have && !strcmp(got, want), "\n   got  %s\n   want %s", got, have ? want : "(end of file)");
#endif
        }
    }
#ifdef HP_RCFG_PRINT
    fclose(out);
#else
    char extra[16];
    CHECK(fgets(extra, sizeof extra, in) == NULL); /* every recorded line was compared */
    fclose(in);
#endif
    CHECK_EQ_INT(n_lines, (long long)(hp_family_count() * N_VARIANTS));
}

/* Each golden forward model's runtime config, as the runner reads it (checkpoint folder, its config.json). */
TEST(golden_forward_rcfg_unchanged)
{
#ifdef HP_RCFG_PRINT
    FILE *out = fopen("data/rcfg/forward.txt", "w");
#else
    FILE *in = fopen("data/rcfg/forward.txt", "r");
    CHECK(in != NULL);
    if (!in) return;
#endif
    int n = 0;
    for (size_t i = 0; i < hp_family_count(); i++) {
        const char *fam = hp_family_name(hp_family_at(i));
        char dir[256], cfg[300], line[4096], got[8192];
        snprintf(dir, sizeof dir, "data/forward/%s", fam);
        snprintf(cfg, sizeof cfg, "%s/config.json", dir);
        hp_model *m = NULL;
        hp_err err;
        hp__rcfg c;
        bool ok = hp_model_open(&m, dir, NULL, &err) == HP_OK && hp__rcfg_read(m, cfg, &c, &err) == HP_OK;
        CHECK_MSG(ok, "%s: %s", dir, err.msg);
        hp_model_close(m);
        if (!ok) continue;
        rcfg_line(&c, line, sizeof line);
        hp__rcfg_free(&c);
        snprintf(got, sizeof got, "%s | %s", fam, line);
        n++;
#ifdef HP_RCFG_PRINT
        fprintf(out, "%s\n", got);
#else
        char want[8192];
        bool have = fgets(want, sizeof want, in) != NULL;
        if (have) want[strcspn(want, "\n")] = '\0';
        CHECK_MSG(have && !strcmp(got, want), "\n   got  %s\n   want %s", got, have ? want : "(end of file)");
#endif
    }
#ifdef HP_RCFG_PRINT
    fclose(out);
#else
    fclose(in);
#endif
    CHECK_EQ_INT(n, 10); /* the ten golden families */
}

/* The forward facts of every family, as shared/spec/transformers_forward.md states them. */
static const struct {
    const char *family;
    bool interleave;         /* rope_interleave absent: DeepSeek-V3 rotates adjacent pairs */
    double partial;          /* partial_rotary_factor absent: GLM4-MoE's setdefault 0.5 */
    int64_t w_absent[4];     /* windows of 4 layers, sliding_window absent, use_sliding_window absent */
    int64_t w_given[4];      /* sliding_window 8, use_sliding_window absent */
    int64_t w_use[4];        /* sliding_window 8, use_sliding_window true, max_window_layers 2 */
} g_spec[] = {
    {"llama", false, 1.0, {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}},
    {"mistral", false, 1.0, {4096, 4096, 4096, 4096}, {8, 8, 8, 8}, {8, 8, 8, 8}},       /* 4096 when absent */
    {"qwen2", false, 1.0, {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 8, 8}},                    /* i >= max_window_layers */
    {"qwen3", false, 1.0, {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 8, 8}},                    /* as Qwen2 */
    {"mixtral", false, 1.0, {0, 0, 0, 0}, {8, 8, 8, 8}, {8, 8, 8, 8}},                  /* None when absent */
    {"qwen2_moe", false, 1.0, {0, 0, 0, 0}, {0, 0, 0, 0}, {8, 0, 0, 0}},                /* (i+1)%2, i < mwl */
    {"qwen3_moe", false, 1.0, {0, 0, 0, 0}, {0, 0, 0, 0}, {8, 8, 8, 8}},                /* every layer */
    {"deepseek_v3", true, 1.0, {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}},
    {"glm4_moe", false, 0.5, {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}},
    {"gpt_oss", false, 1.0, {0, 0, 0, 0}, {8, 0, 8, 0}, {8, 0, 8, 0}},                  /* sliding first */
};

/* A meta model of family fam (four layers) from gen's config with its rope and window keys removed, plus
 * extra keys. */
static hp_model *spec_model(const char *fam, const char *extra)
{
    hp_gen_opts go;
    hp_gen_opts_default(&go);
    go.family = fam;
    go.layers = 4;
    char *text = NULL;
    hp_err err;
    if (hp_gen_config_text(&go, &text, &err) != HP_OK) return NULL;
    json_error_t je;
    json_t *root = json_loads(text, 0, &je), *add = json_loads(extra, 0, &je);
    free(text);
    if (!root || !add) {
        json_decref(root);
        json_decref(add);
        return NULL;
    }
    json_object_del(root, "partial_rotary_factor");
    json_object_update(root, add);
    json_decref(add);
    text = json_dumps(root, 0);
    json_decref(root);
    hp_model *m = NULL;
    if (hp_model_from_config_text(&m, text, strlen(text), "spec.json", NULL, &err) != HP_OK) {
        fprintf(stderr, "  %s: %s\n", fam, err.msg);
        m = NULL;
    }
    free(text);
    return m;
}

static bool windows_are(const char *fam, const char *extra, const int64_t want[4])
{
    hp_model *m = spec_model(fam, extra);
    hp__rcfg c;
    hp_err err;
    bool ok = m && hp__rcfg_read(m, NULL, &c, &err) == HP_OK;
    for (int i = 0; ok && i < 4; i++) ok = c.window[i] == want[i];
    if (m && ok) hp__rcfg_free(&c);
    hp_model_close(m);
    return ok;
}

TEST(family_table_forward_facts)
{
    CHECK_EQ_INT(hp_family_count(), sizeof g_spec / sizeof *g_spec); /* a new family gets a row here */
    for (size_t i = 0; i < sizeof g_spec / sizeof *g_spec; i++) {
        const char *fam = g_spec[i].family;
        const hp_family *f = hp_family_find(fam);
        CHECK_MSG(f != NULL, "%s", fam);
        if (!f) continue;
        CHECK_MSG(hp_family_runs(f), "%s runs in the runtime", fam);
        hp_model *m = spec_model(fam, "{}");
        CHECK_MSG(m != NULL, "%s", fam);
        if (!m) continue;
        hp__rcfg c;
        hp_err err;
        CHECK_MSG(hp__run_family_check(m, &err) == HP_OK, "%s", fam);
        bool ok = hp__rcfg_read(m, NULL, &c, &err) == HP_OK;
        CHECK_MSG(ok, "%s: %s", fam, err.msg);
        if (ok) {
            CHECK_MSG(c.interleave == g_spec[i].interleave, "%s: interleave %d", fam, (int)c.interleave);
            CHECK_MSG(c.partial == g_spec[i].partial, "%s: partial %g", fam, c.partial);
            CHECK_MSG(c.rot == (int64_t)(16 * g_spec[i].partial) || f == hp_family_find("deepseek_v3"), "%s: rot %lld",
                      fam, (long long)c.rot); /* gen's head_dim 16; DeepSeek's is qk_rope_head_dim */
            hp__rcfg_free(&c);
        }
        hp_model_close(m);
        CHECK_MSG(windows_are(fam, "{}", g_spec[i].w_absent), "%s: windows, sliding_window absent", fam);
        CHECK_MSG(windows_are(fam, "{\"sliding_window\": 8}", g_spec[i].w_given), "%s: windows, sliding_window 8", fam);
        CHECK_MSG(windows_are(fam, "{\"sliding_window\": 8, \"use_sliding_window\": true, \"max_window_layers\": 2}",
                              g_spec[i].w_use),
                  "%s: windows, use_sliding_window", fam);
        static const int64_t none[4] = {0, 0, 0, 0}, lt[4] = {5, 0, 0, 5};
        CHECK_MSG(windows_are(fam, "{\"sliding_window\": null}", none), "%s: windows, sliding_window null", fam);
        CHECK_MSG(windows_are(fam, "{\"sliding_window\": 5, \"layer_types\": [\"sliding_attention\", \"full_attention\", "
                                   "\"full_attention\", \"sliding_attention\"]}", lt),
                  "%s: explicit layer_types win", fam);
        /* the dict's and the top level's partial_rotary_factor win over the family's default */
        m = spec_model(fam, "{\"partial_rotary_factor\": 0.25, \"rope_interleave\": false}");
        ok = m && hp__rcfg_read(m, NULL, &c, &err) == HP_OK;
        CHECK_MSG(ok && c.partial == 0.25 && !c.interleave, "%s: explicit partial / interleave", fam);
        if (ok) hp__rcfg_free(&c);
        hp_model_close(m);
    }
}

/* A family the runtime does not run is refused, naming it and the families that run (drawn from the table). */
TEST(unknown_family_refused_with_the_table_list)
{
    hp_model *m = spec_model("llama", "{}"); /* then made a model of a family the table does not know */
    CHECK(m != NULL);
    if (!m) return;
    m->family = NULL;
    m->model_type = "gpt2";
    hp_err err;
    CHECK(hp__run_family_check(m, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "gpt2 is not one of them");
    for (size_t i = 0; i < hp_family_count(); i++) CHECK_STR_CONTAINS(err.msg, hp_family_name(hp_family_at(i)));
    hp_model_close(m);
}

TEST_MAIN()
