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
    char path[] = "/tmp/hp_test_family_runtime_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        free(text);
        return false;
    }
    FILE *f = fdopen(fd, "w");
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

TEST_MAIN()
