/*
 * rcfg.c — what the forward pass reads from config.json beyond the planner's hyperparameters: norm eps, the
 * rotary parameters, sliding windows per layer and the activation, with transformers' defaults and traps
 * (shared/spec/transformers_forward.md, golden/README.md). config.json is parsed once, by hp_model_open: the
 * values come as written from the model's config (hp_model_forward) and the family's facts from the family
 * table (src/model/families.c: rope style, partial rotary default, window rule and defaults, which families
 * run); this file applies the generic rules and refuses what the runtime cannot run:
 *
 *   rope          rope_scaling (or rope_parameters) replaces the default; "type" is accepted for "rope_type";
 *                 rope_theta from the dict, else top level, else 10000; llama3/yarn original_max_position_
 *                 embeddings defaults to max_position_embeddings; partial_rotary_factor (dict, top level, or
 *                 the family's default)
 *   windows       explicit layer_types with sliding_window win; otherwise the family's rule
 *
 * Rotary tables are built in f32 as transformers builds them (rope.c's callers get cos/sin per position).
 */
#include "exec/rcfg.h"

#include "model/family.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double num(hp_config_num v, double dflt) { return v.given ? v.value : dflt; }

/* A count from a config number, clamped so that the conversion is defined for any value a file holds. */
static int64_t count_of(double v)
{
    return v > 4e18 ? (int64_t)4e18 : v < -4e18 ? -(int64_t)4e18 : (int64_t)v;
}

static hp_status bad(const char *label, const char *key, const char *what, hp_err *err)
{
    return hp_err_set(err, HP_ERR_INPUT, "%s: \"%s\" %s; fix the config.json", label, key, what);
}

static hp_status read_rope(const char *label, const hp_model *m, hp__rcfg *c, hp_err *err)
{
    const hp_model_forward *w = &m->cfg.fwd;
    if (w->rope == HP_CFG_WRONG) return bad(label, "rope_scaling", "must be an object or null", err);
    c->theta = num(w->dict_rope_theta, num(w->rope_theta, 10000.0));
    if (!(c->theta > 1.0) || !isfinite(c->theta)) return bad(label, "rope_theta", "must be a number > 1", err);
    const char *type = w->rope_type ? w->rope_type : "default";
    c->partial = hp__family_partial_rotary(m->family, &m->cfg);
    if (!(c->partial > 0.0 && c->partial <= 1.0)) return bad(label, "partial_rotary_factor", "must be in (0, 1]", err);
    c->factor = num(w->factor, 1.0);
    c->orig_max = count_of(num(w->original_max_position_embeddings, (double)m->cfg.max_position_embeddings));
    c->attn_scale = 1.0;
    if (!strcmp(type, "default")) {
        c->rope = HP__ROPE_DEFAULT;
    } else if (!strcmp(type, "linear")) {
        c->rope = HP__ROPE_LINEAR;
    } else if (!strcmp(type, "llama3")) {
        c->rope = HP__ROPE_LLAMA3;
        c->low = num(w->low_freq_factor, 1.0);
        c->high = num(w->high_freq_factor, 4.0);
        if (!(c->high > c->low) || !(c->low > 0)) return bad(label, "rope_scaling", "needs high_freq_factor > low_freq_factor > 0", err);
        if (c->orig_max < 1) return bad(label, "original_max_position_embeddings", "must be positive", err);
    } else if (!strcmp(type, "yarn")) {
        c->rope = HP__ROPE_YARN;
        c->beta_fast = num(w->beta_fast, 32.0);
        c->beta_slow = num(w->beta_slow, 1.0);
        c->truncate = w->truncate; /* yarn's default when the key is absent: true */
        if (c->orig_max < 1) return bad(label, "original_max_position_embeddings", "must be positive", err);
        /* attention_factor scales cos and sin: given, else from mscale / mscale_all_dim (modeling_rope_utils) */
        double af = num(w->attention_factor, 0), ms = num(w->mscale, 0), msa = num(w->mscale_all_dim, 0);
        double f = c->factor;
#define HP__MSCALE(scale, m) ((scale) <= 1 ? 1.0 : 0.1 * (m) * log(scale) + 1.0)
        c->mscale_all_dim = w->mscale_all_dim.given ? msa : 0;
        if (w->attention_factor.given) c->attn_scale = af;
        else if (w->mscale.given && w->mscale_all_dim.given && ms != 0 && msa != 0)
            c->attn_scale = HP__MSCALE(f, ms) / HP__MSCALE(f, msa);
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

static hp_status read_windows(const char *label, const hp_model *m, hp__rcfg *c, hp_err *err)
{
    const hp_model_forward *w = &m->cfg.fwd;
    int64_t L = c->L;
    if (w->sliding_window == HP_CFG_WRONG)
        return bad(label, "sliding_window", "must be a positive integer or null", err);
    if (w->layer_types == HP_CFG_WRONG || (w->layer_types == HP_CFG_VALUE && w->n_layer_types != L))
        return bad(label, "layer_types", "must list one type per layer", err);
    if (w->layer_types == HP_CFG_VALUE) { /* explicit layer_types win over the family's rule */
        int64_t W = w->sliding_window == HP_CFG_VALUE ? w->sliding_window_value : 0;
        for (int64_t i = 0; i < L; i++) {
            if (w->layer_type[i] == HP_LAYER_OTHER)
                return bad(label, "layer_types", "entries must be \"sliding_attention\" or \"full_attention\"", err);
            if (w->layer_type[i] == HP_LAYER_SLIDING && W < 1)
                return bad(label, "sliding_window", "must be a positive integer or null", err);
            c->window[i] = w->layer_type[i] == HP_LAYER_SLIDING ? W : 0;
        }
        return HP_OK;
    }
    if (w->sliding_window == HP_CFG_VALUE && w->sliding_window_value == 0 &&
        hp__family_window_used(m->family, &m->cfg, L))
        return bad(label, "sliding_window", "must be a positive integer or null", err);
    for (int64_t i = 0; i < L; i++) c->window[i] = hp__family_layer_window(m->family, &m->cfg, i);
    return HP_OK;
}

hp_status hp__run_family_check(const hp_model *m, hp_err *err)
{
    if (hp_family_runs(m->family)) return HP_OK;
    char list[512];
    size_t o = 0, n = 0, k = 0;
    for (size_t i = 0; i < hp_family_count(); i++) n += hp_family_runs(hp_family_at(i));
    for (size_t i = 0; i < hp_family_count() && o < sizeof list; i++) {
        const hp_family *f = hp_family_at(i);
        if (!hp_family_runs(f)) continue;
        k++;
        o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", k == 1 ? "" : k == n ? " and " : ", ",
                              hp_family_name(f));
    }
    const char *name = m->family ? hp_family_name(m->family) : m->model_type[0] ? m->model_type : "this architecture";
    return hp_err_set(err, HP_ERR_INPUT, "%s: the runtime runs %s decoders; %s%s", m->path, list, name,
                      m->family && hp_family_is_moe(m->family) ? " is not yet: run its MoE layers with 'hyperpar moe'"
                                                               : " is not one of them");
}

hp_status hp__rcfg_read(const hp_model *m, const char *label, hp__rcfg *c, hp_err *err)
{
    memset(c, 0, sizeof *c);
    const hp_model_config *mc = &m->cfg;
    const hp_model_forward *w = &mc->fwd;
    if (!label) label = m->path;
    c->H = mc->hidden_size;
    c->L = mc->num_hidden_layers;
    c->nh = mc->num_attention_heads;
    c->nkv = mc->num_key_value_heads ? mc->num_key_value_heads : mc->num_attention_heads;
    c->hd = mc->head_dim;
    c->V = mc->vocab_size;
    c->I = mc->intermediate_size;
    if (c->H < 1 || c->L < 1 || c->nh < 1 || c->hd < 1 || c->V < 1 || c->nh % c->nkv)
        return hp_err_set(err, HP_ERR_INPUT, "%s: the model's shape (hidden %lld, layers %lld, heads %lld/%lld, "
                          "head_dim %lld, vocab %lld) cannot run", label, (long long)c->H, (long long)c->L,
                          (long long)c->nh, (long long)c->nkv, (long long)c->hd, (long long)c->V);
    hp_status st = HP_OK;
    c->window = hp_calloc((size_t)c->L, sizeof *c->window);
    if (!c->window) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    c->eps = num(w->rms_norm_eps, 1e-6);
    if (st == HP_OK && !(c->eps > 0) ) st = bad(label, "rms_norm_eps", "must be a number > 0", err);
    const char *a = w->hidden_act ? w->hidden_act : "silu";
    if (st == HP_OK && strcmp(a, "silu") && strcmp(a, "swish"))
        st = hp_err_set(err, HP_ERR_INPUT, "%s: hidden_act \"%s\" is not supported by the runtime (silu is)",
                        label, a);
    if (st == HP_OK) st = read_rope(label, m, c, err);
    if (st == HP_OK) st = read_windows(label, m, c, err);
    if (st == HP_OK) c->interleave = hp__family_rope_interleave(m->family, mc);
    if (st == HP_OK && c->interleave && c->hd > 512)
        st = bad(label, "qk_rope_head_dim", "is above the 512 rope channels the runtime rotates", err);
    if (st == HP_OK) {
        c->rot = (int64_t)((double)c->hd * c->partial);
        c->rot -= c->rot % 2;
        if (c->rot < 2) st = bad(label, "partial_rotary_factor", "leaves no rotary channels", err);
    }
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

double hp__mla_scale(const hp__rcfg *c, int64_t qk)
{
    double scale = 1.0 / sqrt((double)qk);
    if (c->rope != HP__ROPE_DEFAULT && c->mscale_all_dim != 0 && c->factor > 1) {
        double mm = 0.1 * c->mscale_all_dim * log(c->factor) + 1.0;
        scale *= mm * mm;
    }
    return scale;
}
