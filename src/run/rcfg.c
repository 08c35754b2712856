/*
 * rcfg.c — what the forward pass reads from config.json beyond the planner's hyperparameters: norm eps, the
 * rotary parameters, sliding windows per layer and the activation, with transformers' defaults and traps
 * (shared/spec/transformers_forward.md, golden/README.md):
 *
 *   rope          rope_scaling (or rope_parameters) replaces the default; "type" is accepted for "rope_type";
 *                 rope_theta from the dict, else top level, else 10000; llama3/yarn original_max_position_
 *                 embeddings defaults to max_position_embeddings; partial_rotary_factor (top level or dict)
 *   mistral       sliding_window 4096 when absent, null disables; every layer
 *   qwen2/qwen3   sliding only if use_sliding_window, from layer max_window_layers (28) on; explicit
 *                 layer_types win
 *   others        explicit layer_types with sliding_window; none otherwise
 *
 * Rotary tables are built in f32 as transformers builds them (rope.c's callers get cos/sin per position).
 */
#include "run/run_int.h"

#include "io/json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double num(const json_t *o, const char *key, double dflt, bool *given)
{
    const json_t *v = o ? json_object_get(o, key) : NULL;
    if (given) *given = v && json_is_number(v);
    return v && json_is_number(v) ? json_number_value(v) : dflt;
}

static hp_status bad(const char *label, const char *key, const char *what, hp_err *err)
{
    return hp_err_set(err, HP_ERR_INPUT, "%s: \"%s\" %s; fix the config.json", label, key, what);
}

static hp_status read_rope(const json_t *root, const char *label, const hp_model *m, hp__rcfg *c, hp_err *err)
{
    const json_t *d = json_object_get(root, "rope_scaling");
    if (!json_is_object(d)) d = json_object_get(root, "rope_parameters");
    if (d && !json_is_object(d) && !json_is_null(d))
        return bad(label, "rope_scaling", "must be an object or null", err);
    if (d && !json_is_object(d)) d = NULL;
    c->theta = num(d, "rope_theta", num(root, "rope_theta", 10000.0, NULL), NULL);
    if (!(c->theta > 1.0) || !isfinite(c->theta)) return bad(label, "rope_theta", "must be a number > 1", err);
    const char *type = "default";
    const json_t *t = d ? json_object_get(d, "rope_type") : NULL;
    if (!t && d) t = json_object_get(d, "type");
    if (t && json_is_string(t)) type = json_string_value(t);
    /* GLM4-MoE's config sets partial_rotary_factor 0.5 when config.json lacks it */
    double pdef = !strcmp(m->model_type, "glm4_moe") ? 0.5 : 1.0;
    c->partial = num(d, "partial_rotary_factor", num(root, "partial_rotary_factor", pdef, NULL), NULL);
    if (!(c->partial > 0.0 && c->partial <= 1.0)) return bad(label, "partial_rotary_factor", "must be in (0, 1]", err);
    c->factor = num(d, "factor", 1.0, NULL);
    c->orig_max = (int64_t)num(d, "original_max_position_embeddings", (double)m->cfg.max_position_embeddings, NULL);
    c->attn_scale = 1.0;
    if (!strcmp(type, "default")) {
        c->rope = HP__ROPE_DEFAULT;
    } else if (!strcmp(type, "linear")) {
        c->rope = HP__ROPE_LINEAR;
    } else if (!strcmp(type, "llama3")) {
        c->rope = HP__ROPE_LLAMA3;
        c->low = num(d, "low_freq_factor", 1.0, NULL);
        c->high = num(d, "high_freq_factor", 4.0, NULL);
        if (!(c->high > c->low) || !(c->low > 0)) return bad(label, "rope_scaling", "needs high_freq_factor > low_freq_factor > 0", err);
        if (c->orig_max < 1) return bad(label, "original_max_position_embeddings", "must be positive", err);
    } else if (!strcmp(type, "yarn")) {
        c->rope = HP__ROPE_YARN;
        c->beta_fast = num(d, "beta_fast", 32.0, NULL);
        c->beta_slow = num(d, "beta_slow", 1.0, NULL);
        const json_t *tr = json_object_get(d, "truncate");
        c->truncate = !tr || json_is_true(tr); /* yarn's default when the key is absent */
        if (c->orig_max < 1) return bad(label, "original_max_position_embeddings", "must be positive", err);
        /* attention_factor scales cos and sin: given, else from mscale / mscale_all_dim (modeling_rope_utils) */
        bool g1, g2, g3;
        double af = num(d, "attention_factor", 0, &g1), ms = num(d, "mscale", 0, &g2), msa = num(d, "mscale_all_dim", 0, &g3);
        double f = c->factor;
#define HP__MSCALE(scale, m) ((scale) <= 1 ? 1.0 : 0.1 * (m) * log(scale) + 1.0)
        c->mscale_all_dim = g3 ? msa : 0;
        if (g1) c->attn_scale = af;
        else if (g2 && g3 && ms != 0 && msa != 0) c->attn_scale = HP__MSCALE(f, ms) / HP__MSCALE(f, msa);
        else c->attn_scale = HP__MSCALE(f, 1.0);
#undef HP__MSCALE
    } else {
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: rope type \"%s\" is not supported by the runtime yet (default, linear, llama3 and "
                          "yarn are)",
                          label, type);
    }
    if (!(c->factor > 0) || !isfinite(c->factor)) return bad(label, "rope_scaling.factor", "must be a number > 0", err);
    return HP_OK;
}

static bool is_type(const hp_model *m, const char *a, const char *b)
{
    return !strcmp(m->model_type, a) || (b && !strcmp(m->model_type, b));
}

static hp_status read_windows(const json_t *root, const char *label, const hp_model *m, hp__rcfg *c, hp_err *err)
{
    int64_t L = c->L;
    const json_t *sw = json_object_get(root, "sliding_window");
    bool sw_null = !sw || json_is_null(sw);
    if (sw && !sw_null && !(json_is_integer(sw) && json_integer_value(sw) > 0))
        return bad(label, "sliding_window", "must be a positive integer or null", err);
    int64_t W = sw_null ? 0 : (int64_t)json_integer_value(sw);
    const json_t *lt = json_object_get(root, "layer_types");
    if (lt && !json_is_null(lt)) {
        if (!json_is_array(lt) || (int64_t)json_array_size(lt) != L)
            return bad(label, "layer_types", "must list one type per layer", err);
        for (int64_t i = 0; i < L; i++) {
            const json_t *e = json_array_get(lt, (size_t)i);
            const char *s = json_is_string(e) ? json_string_value(e) : "";
            if (!strcmp(s, "sliding_attention")) c->window[i] = W;
            else if (!strcmp(s, "full_attention")) c->window[i] = 0;
            else return bad(label, "layer_types", "entries must be \"sliding_attention\" or \"full_attention\"", err);
        }
        return HP_OK;
    }
    const json_t *u = json_object_get(root, "use_sliding_window");
    bool use = u && json_is_true(u);
    int64_t mwl = (int64_t)num(root, "max_window_layers", 28, NULL);
    if (is_type(m, "mistral", NULL)) {
        if (!sw) W = 4096; /* MistralConfig's default when the key is absent; only null disables it */
        for (int64_t i = 0; i < L; i++) c->window[i] = W;
    } else if (is_type(m, "mixtral", NULL)) { /* MixtralConfig: None when absent; every layer otherwise */
        for (int64_t i = 0; i < L; i++) c->window[i] = W;
    } else if (is_type(m, "qwen2", "qwen3")) { /* sliding from layer max_window_layers on */
        for (int64_t i = 0; i < L; i++) c->window[i] = use && W > 0 && i >= mwl ? W : 0;
    } else if (is_type(m, "qwen2_moe", NULL)) { /* (i+1) % 2 and i < max_window_layers */
        for (int64_t i = 0; i < L; i++) c->window[i] = use && W > 0 && (i + 1) % 2 && i < mwl ? W : 0;
    } else if (is_type(m, "qwen3_moe", NULL)) { /* use_sliding_window applies the window to every layer */
        for (int64_t i = 0; i < L; i++) c->window[i] = use && W > 0 ? W : 0;
    } else if (is_type(m, "gpt_oss", NULL)) { /* layer_types default: alternating, sliding first */
        for (int64_t i = 0; i < L; i++) c->window[i] = i % 2 == 0 ? W : 0;
    }
    return HP_OK;
}

hp_status hp__rcfg_read(const hp_model *m, const char *config_path, hp__rcfg *c, hp_err *err)
{
    memset(c, 0, sizeof *c);
    const hp_model_config *mc = &m->cfg;
    c->H = mc->hidden_size;
    c->L = mc->num_hidden_layers;
    c->nh = mc->num_attention_heads;
    c->nkv = mc->num_key_value_heads ? mc->num_key_value_heads : mc->num_attention_heads;
    c->hd = mc->head_dim;
    c->V = mc->vocab_size;
    c->I = mc->intermediate_size;
    if (c->H < 1 || c->L < 1 || c->nh < 1 || c->hd < 1 || c->V < 1 || c->nh % c->nkv)
        return hp_err_set(err, HP_ERR_INPUT, "%s: the model's shape (hidden %lld, layers %lld, heads %lld/%lld, "
                          "head_dim %lld, vocab %lld) cannot run", config_path, (long long)c->H, (long long)c->L,
                          (long long)c->nh, (long long)c->nkv, (long long)c->hd, (long long)c->V);
    char *text = NULL;
    size_t len = 0;
    json_t *root = NULL;
    hp_status st = hp__read_file(config_path, HP_JSON_MAX_FILE, &text, &len, err);
    if (st == HP_OK) st = hp__json_parse(text, len, config_path, &root, err);
    free(text);
    if (st != HP_OK) return st;
    c->window = hp_calloc((size_t)c->L, sizeof *c->window);
    if (!c->window) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    bool given = false;
    c->eps = num(root, "rms_norm_eps", 1e-6, &given);
    if (st == HP_OK && !(c->eps > 0) ) st = bad(config_path, "rms_norm_eps", "must be a number > 0", err);
    const json_t *act = json_object_get(root, "hidden_act");
    const char *a = act && json_is_string(act) ? json_string_value(act) : "silu";
    if (st == HP_OK && strcmp(a, "silu") && strcmp(a, "swish"))
        st = hp_err_set(err, HP_ERR_INPUT, "%s: hidden_act \"%s\" is not supported by the runtime (silu is)",
                        config_path, a);
    if (st == HP_OK) st = read_rope(root, config_path, m, c, err);
    if (st == HP_OK) st = read_windows(root, config_path, m, c, err);
    if (st == HP_OK && !strcmp(m->model_type, "deepseek_v3")) { /* rope_interleave: true when absent */
        const json_t *ri = json_object_get(root, "rope_interleave");
        c->interleave = !ri || json_is_true(ri);
        if (c->hd > 512) st = bad(config_path, "qk_rope_head_dim", "is above the 512 rope channels the runtime rotates", err);
    }
    if (st == HP_OK) {
        c->rot = (int64_t)((double)c->hd * c->partial);
        c->rot -= c->rot % 2;
        if (c->rot < 2) st = bad(config_path, "partial_rotary_factor", "leaves no rotary channels", err);
    }
    json_decref(root);
    if (st != HP_OK) hp__rcfg_free(c);
    return st;
}

void hp__rcfg_free(hp__rcfg *c)
{
    free(c->window);
    c->window = NULL;
}

/* inv_freq in f32, as transformers' ROPE_INIT_FUNCTIONS compute it. */
static void inv_freq(const hp__rcfg *c, float *inv)
{
    int64_t dim = c->rot;
    for (int64_t i = 0; i < dim / 2; i++) {
        float e = (float)(2 * i) / (float)dim;
        inv[i] = 1.0f / powf((float)c->theta, e);
    }
    if (c->rope == HP__ROPE_LINEAR) {
        for (int64_t i = 0; i < dim / 2; i++) inv[i] /= (float)c->factor;
    } else if (c->rope == HP__ROPE_YARN) { /* _compute_yarn_parameters, in f32 as torch computes it */
        float base = (float)c->theta, f = (float)c->factor;
        double lo = (double)dim * log((double)c->orig_max / (c->beta_fast * 2 * M_PI)) / (2 * log(c->theta));
        double hi = (double)dim * log((double)c->orig_max / (c->beta_slow * 2 * M_PI)) / (2 * log(c->theta));
        if (c->truncate) lo = floor(lo), hi = ceil(hi);
        if (lo < 0) lo = 0;
        if (hi > (double)(dim - 1)) hi = (double)(dim - 1);
        if (lo == hi) hi += 0.001;
        for (int64_t i = 0; i < dim / 2; i++) {
            float pos = powf(base, (float)(2 * i) / (float)dim);
            float extra = 1.0f / pos, inter = 1.0f / (f * pos);
            float ramp = (float)(((double)i - lo) / (hi - lo));
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            float ef = 1.0f - ramp; /* inv_freq_extrapolation_factor */
            inv[i] = inter * (1.0f - ef) + extra * ef;
        }
    } else if (c->rope == HP__ROPE_LLAMA3) {
        float old = (float)c->orig_max, lo = (float)c->low, hi = (float)c->high, f = (float)c->factor;
        float low_wl = old / lo, high_wl = old / hi;
        for (int64_t i = 0; i < dim / 2; i++) {
            float wl = 2.0f * (float)M_PI / inv[i];
            float v = wl > low_wl ? inv[i] / f : inv[i];
            if (!(wl < high_wl) && !(wl > low_wl)) {
                float smooth = (old / wl - lo) / (hi - lo);
                v = (1.0f - smooth) * v / f + smooth * v;
            }
            inv[i] = v;
        }
    }
}

hp_status hp__rope_table(const hp__rcfg *c, int64_t pos0, int64_t n, float **cos_out, float **sin_out, hp_err *err)
{
    int64_t half = c->rot / 2;
    float *inv = hp_calloc((size_t)half, sizeof *inv);
    float *co = hp_calloc((size_t)(n * half) + 1, sizeof *co), *si = hp_calloc((size_t)(n * half) + 1, sizeof *si);
    if (!inv || !co || !si) {
        free(inv), free(co), free(si);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory for the rotary table");
    }
    inv_freq(c, inv);
    float sc = (float)c->attn_scale;
    for (int64_t p = 0; p < n; p++)
        for (int64_t i = 0; i < half; i++) {
            float fr = inv[i] * (float)(pos0 + p);
            co[p * half + i] = cosf(fr) * sc;
            si[p * half + i] = sinf(fr) * sc;
        }
    free(inv);
    *cos_out = co;
    *sin_out = si;
    return HP_OK;
}
