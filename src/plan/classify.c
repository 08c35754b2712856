/*
 * classify.c — Phase 1 of the planner: one parameter FQN -> one role (spec §3), and the Phase 6 special
 * handler name of a SPECIAL parameter (spec §8.4).
 *
 * Two data tables drive everything; no family name appears in code:
 *
 *   g_families[]      arch spelling(s) -> list of family rules {patterns, role}. Legacy semantics: a rule
 *                     fires when any pattern is a raw substring of the whole lower-cased FQN; the first
 *                     rule that fires wins (§3.3 step 1, §3.5).
 *   g_default_rules[] the 12 default rules of §3.4 in priority order, each with a match mode:
 *
 *        pattern has a '.'  -> raw substring of the whole FQN, whatever the mode
 *        HP__SEG_EXACT      -> some dot-separated segment equals the pattern
 *        HP__SEG_SUBSTRING  -> the pattern lies inside one segment (never spans a dot)
 *
 * Priority for one FQN (lower-cased first): family rules (looked up by arch, then by model_type) ->
 * structural rules (none in this revision, §13 is optional) -> default rules -> SKIP.
 *
 * Invariants: classification is a pure function of (fqn, arch, model_type) and allocates nothing. Names
 * are compared case-insensitively against lower-case patterns, which is the spec's "lower-case the FQN"
 * without a copy (so no length limit). Arch spellings are matched case-insensitively too.
 */
#include <string.h>
#include <strings.h>

#include "plan/planner.h"

/* Names of hp_role, in enum order (§3.2). */
static const char *const g_role_names[HP_ROLE_COUNT] = {
    "COLWISE",    "ROWWISE",   "NORM",          "EMBED", "LM_HEAD",    "MOE_GATE", "MOE_EXPERT",
    "SHARED_EXPERT", "FUSED_QKV", "FUSED_GATE_UP", "BIAS",  "REPLICATED", "SPECIAL",  "SKIP",
};

const char *hp_role_name(hp_role r)
{
    if ((int)r < 0 || r >= HP_ROLE_COUNT) return "?";
    return g_role_names[r];
}

/* ---- tables ---- */

/* Patterns per rule: the longest default rule (10, COLWISE) has 7. NULL-terminated lists. */
#define HP__MAX_PATTERNS 8

typedef enum hp__match_mode {
    HP__RAW,           /* raw substring of the whole FQN (family rules, dotted patterns) */
    HP__SEG_EXACT,     /* a segment equals the pattern */
    HP__SEG_SUBSTRING, /* the pattern is inside one segment */
} hp__match_mode;

typedef struct hp__rule {
    const char *patterns[HP__MAX_PATTERNS]; /* lower-case, NULL-terminated */
    hp_role role;
    hp__match_mode mode;
} hp__rule;

/* Family rules of §3.5. A family lists every spelling it is registered under (canonical arch names and
 * model_type spellings) and its rules in priority order. Families with empty rule lists (llama, qwen2,
 * qwen3, ...) need no entry: a missing family means "defaults only". */
#define HP__MAX_SPELLINGS 4
#define HP__MAX_FAMILY_RULES 4

typedef struct hp__family_rules {
    const char *spellings[HP__MAX_SPELLINGS + 1]; /* NULL-terminated */
    hp__rule rules[HP__MAX_FAMILY_RULES];
    int n_rules;
} hp__family_rules;

/* DeepSeek's multi-head latent attention: the low-rank down-projections are replicated, the
 * up-projections are column-parallel; o_proj (ROWWISE) and the a-layernorms (NORM) come from defaults. */
#define HP__MLA_RULES                                                                              \
    {.patterns = {"q_a_proj", "kv_a_proj_with_mqa", NULL}, .role = HP_ROLE_REPLICATED, .mode = HP__RAW}, \
    {.patterns = {"q_b_proj", "kv_b_proj", NULL}, .role = HP_ROLE_COLWISE, .mode = HP__RAW}

static const hp__family_rules g_families[] = {
    {
        .spellings = {"deepseekv2", "deepseekv3", "deepseek_v2", "deepseek_v3", NULL},
        .rules = {HP__MLA_RULES},
        .n_rules = 2,
    },
    {
        /* The shared expert's scalar gate is a tiny Linear(H, 1): replicated, not a router. */
        .spellings = {"qwen2moe", "qwen2_moe", NULL},
        .rules = {{.patterns = {"shared_expert_gate", NULL}, .role = HP_ROLE_REPLICATED, .mode = HP__RAW}},
        .n_rules = 1,
    },
    {
        /* Kimi K2.5/K2.6: DeepSeek-V3 text model plus a vision tower and projector kept replicated. */
        .spellings = {"kimi_k25", "kimi_k26", NULL},
        .rules = {HP__MLA_RULES,
                  {.patterns = {"vision_tower.", NULL}, .role = HP_ROLE_REPLICATED, .mode = HP__RAW},
                  {.patterns = {"mm_projector.", NULL}, .role = HP_ROLE_REPLICATED, .mode = HP__RAW}},
        .n_rules = 4,
    },
    {
        /* Beyond the seed: hub Mixtral checkpoints name the router block_sparse_moe.gate, which no default
         * router pattern (.mlp.gate.) matches; without this rule it is SKIP and the coverage lint fails. */
        .spellings = {"mixtral", NULL},
        .rules = {{.patterns = {"block_sparse_moe.gate.", NULL}, .role = HP_ROLE_MOE_GATE, .mode = HP__RAW}},
        .n_rules = 1,
    },
    {
        /* Beyond the seed: gpt-oss attention sinks are one learned logit per head [nH], so they shard with
         * the heads (column-wise, like q_proj); otherwise they are SKIP and uncovered. */
        .spellings = {"gptoss", "gpt_oss", NULL},
        .rules = {{.patterns = {"self_attn.sinks", NULL}, .role = HP_ROLE_COLWISE, .mode = HP__RAW}},
        .n_rules = 1,
    },
};

/* No pattern here or in g_families holds an all-digit dotted segment (a layer or expert index): the planner
 * classifies each name template once (memo.c) and relies on it. */
/* The default rules of §3.4, in priority order. Dotted patterns are raw substrings whatever the mode
 * (so `.mlp.gate.` and `mlp.router` in rule 5 are raw while `moe_gate` is matched inside a segment). */
static const hp__rule g_default_rules[] = {
    /* 1 */ {{"embed_tokens.weight", "wte.weight", "tok_embeddings.weight", "embed_in.weight",
              "word_embeddings.weight", NULL},
             HP_ROLE_EMBED, HP__RAW},
    /* 2 */ {{"lm_head.weight", "embed_out.weight", "output_layer.weight", NULL}, HP_ROLE_LM_HEAD, HP__RAW},
    /* 3 */ {{"shared_expert", "shared_experts", NULL}, HP_ROLE_SHARED_EXPERT, HP__SEG_EXACT},
    /* 4 */ {{"experts", NULL}, HP_ROLE_MOE_EXPERT, HP__SEG_SUBSTRING},
    /* 5 */ {{".mlp.gate.", ".router.", "moe_gate", "mlp.router", NULL}, HP_ROLE_MOE_GATE, HP__SEG_SUBSTRING},
    /* 6 */ {{"fused_qkv", "linear_qkv", "qkv_proj", "query_key_value", NULL}, HP_ROLE_FUSED_QKV,
             HP__SEG_SUBSTRING},
    /* 7 */ {{"gate_up_proj", "fused_gate_up", ".w13.", NULL}, HP_ROLE_FUSED_GATE_UP, HP__SEG_SUBSTRING},
    /* 8 */ {{"a_log", "dt_bias", "gated_delta", NULL}, HP_ROLE_SPECIAL, HP__SEG_SUBSTRING},
    /* 9 */ {{"norm", "layernorm", "rmsnorm", "ln_", NULL}, HP_ROLE_NORM, HP__SEG_SUBSTRING},
    /* 10 */ {{"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", ".w1.", ".w3.", NULL}, HP_ROLE_COLWISE,
              HP__SEG_SUBSTRING},
    /* 11 */ {{".bias", NULL}, HP_ROLE_BIAS, HP__RAW},
    /* 12 */ {{"o_proj", "down_proj", ".w2.", NULL}, HP_ROLE_ROWWISE, HP__SEG_SUBSTRING},
};

/* Special handlers of §8.4: first pattern that is a raw substring of the lower-cased FQN wins. */
static const struct {
    const char *pattern;
    const char *handler;
} g_special_handlers[] = {
    {"gated_delta", "gated_delta_tp_shard"},
    {"a_log", "gated_delta_tp_shard"},
    {"dt_bias", "gated_delta_tp_shard"},
};

/* ---- matching ---- */

/* Patterns are lower-case; names are compared through this, so no lower-cased copy is ever made. */
static bool has_upper(const char *s)
{
    for (; *s; s++)
        if (*s >= 'A' && *s <= 'Z') return true;
    return false;
}

/* Case-insensitive raw substring test over the whole name; lo: s has no upper-case letter, so libc's
 * strstr (the common, fast path) gives the same answer. */
static bool contains_ci(const char *s, bool lo, const char *pat)
{
    if (lo) return strstr(s, pat) != NULL;
    size_t lp = strlen(pat), ls = strlen(s);
    for (size_t i = 0; i + lp <= ls; i++)
        if (hp_eq_ci(s + i, pat, lp)) return true;
    return false;
}

/* True when pat occurs inside one dot-separated segment of s (exact: the segment equals pat). */
static bool seg_match(const char *s, const char *pat, bool exact)
{
    size_t lp = strlen(pat);
    for (;;) {
        const char *dot = strchr(s, '.');
        size_t ls = dot ? (size_t)(dot - s) : strlen(s);
        if (exact) {
            if (ls == lp && hp_eq_ci(s, pat, lp)) return true;
        } else {
            for (size_t i = 0; i + lp <= ls; i++)
                if (hp_eq_ci(s + i, pat, lp)) return true;
        }
        if (!dot) return false;
        s = dot + 1;
    }
}

/* One pattern against a name under a rule's mode (§3.4: a dotted pattern is always a raw substring). */
static bool pattern_match(const char *fqn, bool lo, const char *pat, hp__match_mode mode)
{
    if (mode == HP__RAW || strchr(pat, '.')) return contains_ci(fqn, lo, pat);
    return seg_match(fqn, pat, mode == HP__SEG_EXACT);
}

static bool rule_match(const char *fqn, bool lo, const hp__rule *r)
{
    for (int i = 0; i < HP__MAX_PATTERNS && r->patterns[i]; i++)
        if (pattern_match(fqn, lo, r->patterns[i], r->mode)) return true;
    return false;
}

/* The family registered under name (any registered spelling, case-insensitive), or NULL. */
static const hp__family_rules *family_rules(const char *name)
{
    if (!name || !*name) return NULL;
    for (size_t i = 0; i < sizeof g_families / sizeof *g_families; i++)
        for (int k = 0; k < HP__MAX_SPELLINGS && g_families[i].spellings[k]; k++)
            if (strcasecmp(name, g_families[i].spellings[k]) == 0) return &g_families[i];
    return NULL;
}

/* Role of one parameter (§3.3): family rules (by arch, else by model_type; either may be NULL or ""),
 * then the default rules, else SKIP. The name is matched case-insensitively, i.e. lower-cased. */
hp_role hp__classify(const char *fqn, const char *arch, const char *model_type)
{
    if (!fqn) return HP_ROLE_SKIP;
    bool lo = !has_upper(fqn);
    const hp__family_rules *fam = family_rules(arch);
    if (!fam) fam = family_rules(model_type);
    if (fam)
        for (int i = 0; i < fam->n_rules; i++)
            if (rule_match(fqn, lo, &fam->rules[i])) return fam->rules[i].role;
    for (size_t i = 0; i < sizeof g_default_rules / sizeof *g_default_rules; i++)
        if (rule_match(fqn, lo, &g_default_rules[i])) return g_default_rules[i].role;
    return HP_ROLE_SKIP;
}

/* Handler of a SPECIAL parameter (§8.4): "gated_delta_tp_shard" when a known pattern occurs in the
 * lower-cased FQN, else "default". */
const char *hp__special_handler(const char *fqn)
{
    if (!fqn) return "default";
    bool lo = !has_upper(fqn);
    for (size_t i = 0; i < sizeof g_special_handlers / sizeof *g_special_handlers; i++)
        if (contains_ci(fqn, lo, g_special_handlers[i].pattern)) return g_special_handlers[i].handler;
    return "default";
}
