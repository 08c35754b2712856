/*
 * finite.c — non-finite outputs are errors, never results: the checks after the expert compute and after
 * the combine, and the diagnosis that names the likely cause.
 *
 * A finite input can still give a non-finite output: f32 overflows past 3.4e38, and one NaN weight poisons
 * every row that meets it. The forwards (hp_moe_forward, hp_moe_ep_forward[_chunks]) therefore scan what
 * they produce (O(rows · H), small next to the products) and fail with HP_ERR_INPUT naming the first bad row
 * and the first of these causes that holds:
 *
 *   1. the row's routing weights are not finite          (routed_scaling_factor past f32, a corrupt router)
 *   2. an expert the row used holds a non-finite weight  (its tensor, row and column; scanned only here,
 *                                                         on the error path: expert weights can be GBs)
 *   3. the shared expert holds a non-finite weight
 *   4. otherwise the magnitudes: the input row's largest |x| and the largest routing weight, whose
 *      products overflowed f32
 *
 * Cost on success: one pass over y (and, under EP, over the expert outputs a rank computed).
 */
#include "moe/moe_internal.h"

#include <math.h>
#include <stdio.h>

int64_t hp__moe_first_nonfinite(const float *v, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(v[i])) return i;
    return -1;
}

static float max_abs(const float *v, int64_t n)
{
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++) m = fabsf(v[i]) > m ? fabsf(v[i]) : m;
    return m;
}

static const char *kind(float v) { return isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf"; }

/* The first non-finite element of a [rows, cols] matrix as " holds NaN at row r, column c"; false if none. */
static bool find_bad(const float *w, int64_t rows, int64_t cols, char *buf, size_t cap)
{
    if (!w) return false;
    int64_t i = hp__moe_first_nonfinite(w, rows * cols);
    if (i < 0) return false;
    snprintf(buf, cap, "holds %s at row %lld, column %lld", kind(w[i]), (long long)(i / cols), (long long)(i % cols));
    return true;
}

/* The same for a [rows, cols] matrix of w_dtype elements (bf16: exponent bits all ones is NaN or Inf). */
static bool find_bad_w(const hp_moe_layer *l, const void *base, int64_t off, int64_t rows, int64_t cols, char *buf,
                       size_t cap)
{
    if (!base) return false;
    if (l->w_dtype != HP_DT_BF16) return find_bad((const float *)base + off, rows, cols, buf, cap);
    const uint16_t *w = (const uint16_t *)base + off;
    for (int64_t i = 0; i < rows * cols; i++)
        if ((w[i] & 0x7f80u) == 0x7f80u) {
            snprintf(buf, cap, "holds %s at row %lld, column %lld", (w[i] & 0x007fu) ? "NaN" : "Inf",
                     (long long)(i / cols), (long long)(i % cols));
            return true;
        }
    return false;
}

/* Local expert e's weights: a sentence naming the first non-finite one into buf; false when all are finite. */
static bool expert_weights_bad(const hp_moe_layer *l, int64_t e, char *buf, size_t cap)
{
    const int64_t H = l->n_hidden, I = l->d_expert;
    char at[96];
    const char *what = NULL;
    if (find_bad_w(l, l->w_gate_up, e * 2 * I * H, 2 * I, H, at, sizeof at)) what = "gate/up projection [2I, H]";
    else if (l->b_gate_up && find_bad(l->b_gate_up + e * 2 * I, 1, 2 * I, at, sizeof at)) what = "gate/up bias";
    else if (find_bad_w(l, l->w_down, e * H * I, H, I, at, sizeof at)) what = "down projection [H, I]";
    else if (l->b_down && find_bad(l->b_down + e * H, 1, H, at, sizeof at)) what = "down bias";
    if (!what) return false;
    snprintf(buf, cap,
             "expert %lld's %s %s (canonical layout); the checkpoint's weights for %sexperts (expert %lld) are "
             "corrupt: restore them from the original checkpoint",
             (long long)(l->first_expert + e), what, at, l->prefix, (long long)(l->first_expert + e));
    return true;
}

static bool shared_weights_bad(const hp_moe_layer *l, char *buf, size_t cap)
{
    const int64_t H = l->n_hidden, sI = l->d_shared;
    char at[96];
    const char *what = NULL;
    if (find_bad(l->ws_gate_up, 2 * sI, H, at, sizeof at)) what = "gate/up projection";
    else if (find_bad(l->ws_down, H, sI, at, sizeof at)) what = "down projection";
    else if (find_bad(l->ws_gate, 1, H, at, sizeof at)) what = "gate (shared_expert_gate)";
    if (!what) return false;
    snprintf(buf, cap, "the shared expert's %s %s; the checkpoint's shared-expert weights under %s are corrupt", what,
             at, l->prefix);
    return true;
}

bool hp__moe_layer_weights_bad(const hp_moe_layer *l, char *buf, size_t cap)
{
    const int64_t E = l->n_experts, H = l->n_hidden;
    for (int64_t i = 0; l->w_router && i < E * H; i++)
        if (!isfinite(l->w_router[i])) {
            snprintf(buf, cap, "the router weight of %s holds %s at row %lld, column %lld", l->prefix,
                     isnan(l->w_router[i]) ? "NaN" : "Inf", (long long)(i / H), (long long)(i % H));
            return true;
        }
    for (int64_t i = 0; l->b_router && i < E; i++)
        if (!isfinite(l->b_router[i])) {
            snprintf(buf, cap, "the router bias of %s holds %s at %lld", l->prefix, isnan(l->b_router[i]) ? "NaN" : "Inf",
                     (long long)i);
            return true;
        }
    for (int64_t e = 0; e < l->n_local; e++)
        if (expert_weights_bad(l, e, buf, cap)) return true;
    return shared_weights_bad(l, buf, cap);
}

/* The magnitude sentence of cause 4. */
static void overflow_cause(const hp_moe_layer *l, float x_max, float w_max, char *buf, size_t cap)
{
    snprintf(buf, cap,
             "the weights it met are finite, but its input reaches %.3g in magnitude and its routing weights %.3g%s, "
             "and the products overflow f32 (largest finite 3.4e38); hidden states of a real model stay many "
             "orders of magnitude below that: check the scale of the input%s",
             x_max, w_max, l->routed_scaling_factor != 1.0 ? " (after routed_scaling_factor)" : "",
             l->routed_scaling_factor > 1e6 ? " and config.json routed_scaling_factor" : "");
}

hp_status hp__moe_expert_nonfinite(const hp_moe_layer *l, int64_t e, const float *in_row, const float *out_row,
                                   const char *whose, hp_err *err)
{
    const int64_t H = l->n_hidden;
    int64_t c = hp__moe_first_nonfinite(out_row, H);
    char cause[400];
    if (!expert_weights_bad(l, e, cause, sizeof cause))
        snprintf(cause, sizeof cause,
                 "its weights are finite, but the input row reaches %.3g in magnitude and the expert's products "
                 "overflow f32 (largest finite 3.4e38); hidden states of a real model stay many orders of magnitude "
                 "below that: check the scale of the input",
                 max_abs(in_row, H));
    return hp_err_set(err, HP_ERR_INPUT, "layer %lld: expert %lld gives a non-finite output (%s at column %lld) for %s: %s",
                      (long long)l->layer, (long long)(l->first_expert + e), kind(out_row[c < 0 ? 0 : c]),
                      (long long)(c < 0 ? 0 : c), whose, cause);
}

hp_status hp__moe_check_output(const hp_moe_layer *l, const float *x, const float *y, int64_t n_tokens,
                               const int32_t *topk_idx, const float *topk_w, const uint8_t *keep, int64_t row_base,
                               hp_err *err)
{
    const int64_t H = l->n_hidden, K = l->top_k;
    int64_t i = hp__moe_first_nonfinite(y, n_tokens * H);
    if (i < 0) return HP_OK;
    const int64_t t = i / H;
    const float *w = topk_w + t * K;
    char cause[480];
    bool found = false;
    float w_max = 0.0f;
    for (int64_t k = 0; k < K && !found; k++) {
        if (!isfinite(w[k])) {
            found = true;
            if (l->router == HP_MOE_ROUTER_SIGMOID_GROUP && l->routed_scaling_factor != 1.0)
                snprintf(cause, sizeof cause,
                         "its routing weight for expert %d is %s: config.json routed_scaling_factor %.3g takes the "
                         "weights past f32's range (3.4e38); use the model's real factor (DeepSeek-V3: 2.5)",
                         topk_idx[t * K + k], kind(w[k]), l->routed_scaling_factor);
            else
                snprintf(cause, sizeof cause, "its routing weight for expert %d is %s; the router's weights are corrupt",
                         topk_idx[t * K + k], kind(w[k]));
        }
        w_max = fabsf(w[k]) > w_max ? fabsf(w[k]) : w_max;
    }
    for (int64_t k = 0; k < K && !found; k++) {
        int64_t e = topk_idx[t * K + k] - l->first_expert;
        if ((!keep || keep[t * K + k]) && e >= 0 && e < l->n_local) found = expert_weights_bad(l, e, cause, sizeof cause);
    }
    if (!found) found = shared_weights_bad(l, cause, sizeof cause);
    if (!found) overflow_cause(l, max_abs(x + t * H, H), w_max, cause, sizeof cause);
    return hp_err_set(err, HP_ERR_INPUT, "layer %lld: output row %lld is not finite (%s at column %lld): %s",
                      (long long)l->layer, (long long)(row_base + t), kind(y[i]), (long long)(i % H), cause);
}
