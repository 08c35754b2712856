/*
 * infer.c — Phase 3 of the planner: the boundary type of a group of parameters anchored at a module
 * (spec §5). A pure function of the module FQN and the *set* of roles in the group.
 *
 * Priority, first answer wins:
 *
 *   1. explicit FQN patterns   embed / lm_head / norm (raw substrings of the lower-cased FQN),
 *                              moe_gate (the module's own last segment contains "router")
 *   2. leaf-segment guard      projection / expert leaf modules are never containers -> unknown
 *   3. numeric guard           "experts.3" style per-expert containers -> unknown
 *   4. MoE roles               MOE_EXPERT -> moe_mlp iff the last segment names an MoE container;
 *                              SHARED_EXPERT -> mlp; MOE_GATE alone -> unknown
 *   5. dense roles             colwise + rowwise -> attention / mlp by name; colwise-only mlp -> mlp
 *
 * Names are compared case-insensitively with lower-case patterns (the spec's fqn.lower()), without a copy.
 * "linear_attention" is never inferred (only overrides produce it).
 */
#include <string.h>

#include "plan/planner.h"

static const char *const g_btype_names[HP_BT_COUNT] = {
    "attention", "linear_attention", "mlp", "norm", "embed", "lm_head", "moe_gate", "moe_mlp", "unknown", "custom",
};

const char *hp_btype_name(hp_btype t)
{
    if ((int)t < 0 || t >= HP_BT_COUNT) return "?";
    return g_btype_names[t];
}

/* ---- pattern tables (§5) ---- */
/* No pattern holds an all-digit dotted segment: the result is the same for every name of one template, which
 * group.c memoizes (memo.c). */

/* Step 1: raw substrings of the whole lower-cased FQN, checked table by table in this order. */
static const char *const g_embed_patterns[] = {"embed_tokens", "wte", ".embed.", "tok_embeddings", "embed_in",
                                               "word_embeddings", NULL};
static const char *const g_lm_head_patterns[] = {"lm_head", "embed_out", "output_layer", NULL};
static const char *const g_norm_patterns[] = {"norm", "layernorm", "rmsnorm", "ln_", NULL};

static const struct {
    const char *const *patterns;
    hp_btype type;
} g_explicit[] = {
    {g_embed_patterns, HP_BT_EMBED},
    {g_lm_head_patterns, HP_BT_LM_HEAD},
    {g_norm_patterns, HP_BT_NORM},
};

/* Step 2: leaf modules that hold projections or experts and never anchor a boundary themselves.
 * "shared_experts" is deliberately absent: the shared expert is its own nested mlp boundary, whose exit
 * owns the row-wise partial reduction (fix F3). */
static const char *const g_leaf_guard[] = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "qkv_proj", "fused_qkv",
    "linear_qkv", "gate_up_proj", "query_key_value", "experts", "gate", "linear", "proj", "fc1", "fc2", "w1",
    "w2", "w3", "w13", "dense", "dense_h_to_4h", "dense_4h_to_h", NULL,
};

/* Steps 4 and 5. */
static const char *const g_moe_container_patterns[] = {"mlp", "moe", "moe_block", "moe_layer", NULL};
static const char *const g_attn_patterns[] = {"attn", "attention", NULL};
static const char *const g_mlp_patterns[] = {"mlp", "ffn", "feed_forward", NULL};

/* ---- case-insensitive matching over [s, s + n) ---- */

/* True when the lower-case pat occurs in the n bytes at s, ignoring the case of s. s[n] is '\0' (every s
 * here is a suffix of the FQN), so an all-lower-case s takes libc's strstr, the common and fast path. */
static bool contains_ci(const char *s, size_t n, bool s_lower, const char *pat)
{
    if (s_lower) return strstr(s, pat) != NULL;
    size_t lp = strlen(pat);
    for (size_t i = 0; i + lp <= n; i++)
        if (hp_eq_ci(s + i, pat, lp)) return true;
    return false;
}

static bool contains_any(const char *s, size_t n, bool s_lower, const char *const *pats)
{
    for (; *pats; pats++)
        if (contains_ci(s, n, s_lower, *pats)) return true;
    return false;
}

/* Boundary type of the group anchored at fqn (§5). roles holds the group's roles (any order,
 * duplicates allowed); only which roles are present matters. */
hp_btype hp__infer_type(const char *fqn, const hp_role *roles, int n)
{
    if (!fqn) fqn = "";
    size_t len = strlen(fqn);
    const char *dot = strrchr(fqn, '.');
    const char *seg = dot ? dot + 1 : fqn; /* "" for the root */
    size_t seg_len = len - (size_t)(seg - fqn);
    bool lo = true; /* the name has no upper-case letter */
    for (size_t i = 0; i < len && lo; i++) lo = !(fqn[i] >= 'A' && fqn[i] <= 'Z');

    /* 1. Explicit patterns. */
    for (size_t i = 0; i < sizeof g_explicit / sizeof *g_explicit; i++)
        if (contains_any(fqn, len, lo, g_explicit[i].patterns)) return g_explicit[i].type;
    if (contains_ci(seg, seg_len, lo, "router")) return HP_BT_MOE_GATE;

    /* 2. Leaf-segment guard: the whole last segment equals a guarded name. */
    for (const char *const *g = g_leaf_guard; *g; g++)
        if (strlen(*g) == seg_len && hp_eq_ci(seg, *g, seg_len)) return HP_BT_UNKNOWN;

    /* 3. Numeric guard: a non-empty all-digit segment (per-expert containers experts.N). */
    if (seg_len > 0) {
        size_t k = 0;
        while (k < seg_len && seg[k] >= '0' && seg[k] <= '9') k++;
        if (k == seg_len) return HP_BT_UNKNOWN;
    }

    unsigned present = 0;
    for (int i = 0; i < n; i++)
        if ((int)roles[i] >= 0 && roles[i] < HP_ROLE_COUNT) present |= 1u << roles[i];
#define HAS(r) ((present & (1u << (r))) != 0)

    /* 4. MoE roles: routed experts make an moe_mlp only under a module whose own segment names an MoE
     * container (a parent "mlp" must not qualify a leaf such as shared_expert_gate). */
    if (HAS(HP_ROLE_MOE_EXPERT))
        return contains_any(seg, seg_len, lo, g_moe_container_patterns) ? HP_BT_MOE_MLP : HP_BT_UNKNOWN;
    if (HAS(HP_ROLE_SHARED_EXPERT)) return HP_BT_MLP;
    if (HAS(HP_ROLE_MOE_GATE)) return HP_BT_UNKNOWN;

    /* 5. Dense roles. */
    bool colwise = HAS(HP_ROLE_COLWISE) || HAS(HP_ROLE_FUSED_QKV) || HAS(HP_ROLE_FUSED_GATE_UP);
    bool rowwise = HAS(HP_ROLE_ROWWISE);
#undef HAS
    if (colwise && rowwise) {
        if (contains_any(fqn, len, lo, g_attn_patterns)) return HP_BT_ATTENTION;
        if (contains_any(fqn, len, lo, g_mlp_patterns)) return HP_BT_MLP;
        return HP_BT_ATTENTION;
    }
    if (colwise && contains_any(fqn, len, lo, g_mlp_patterns)) return HP_BT_MLP;
    return HP_BT_UNKNOWN;
}
