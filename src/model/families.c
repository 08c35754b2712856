/*
 * families.c — the family table: transformers naming and shape rules for the supported families, as data.
 *
 * Sources: spec/hf_reference.md §1 (FQNs and shapes, NEW batched and OLD per-expert layouts) and §4
 * (config.json keys); the defaults are the field defaults of transformers' configuration_<family>.py
 * (5.x: LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config, MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig,
 * DeepseekV3Config, Glm4MoeConfig, GptOssConfig). Traps they hold: Qwen3 head_dim 128 (not H/nH), Mistral and
 * Mixtral 8 kv heads, Qwen2 / Qwen3 32, Qwen3-MoE 4 (not nH), DeepSeek-V3 routed_scaling_factor 2.5 and
 * norm_topk_prob true, gpt-oss head_dim 64. One record per family; shape synthesis (synth.c) and the planner read the records and
 * never compare family names themselves.
 */
#include "model/family.h"

#include <stdio.h>
#include <string.h>

#define NEVER {HP_OPT_NEVER, NULL, false}
#define ALWAYS {HP_OPT_ALWAYS, NULL, true}
#define CONFIG(key, dflt) {HP_OPT_CONFIG, key, dflt}
#define SWIGLU_NAMES {"gate_proj", "up_proj", "down_proj"}

static const hp_family g_families[] = {
    {
        .model_type = "llama", .architecture = "LlamaForCausalLM", .canonical = "llama",
        .attn = HP_ATTN_GQA, .qkv_bias = CONFIG("attention_bias", false),
        .o_bias = CONFIG("attention_bias", false), .qk_norm = NEVER,
        .mlp_bias = CONFIG("mlp_bias", false),
        .gen_extra = "{\"attention_bias\": false, \"mlp_bias\": false}",
        .defaults = "{\"vocab_size\": 32000, \"hidden_size\": 4096, \"intermediate_size\": 11008, \"num_hidden_layers\": 32, \"num_attention_heads\": 32, \"max_position_embeddings\": 2048, \"tie_word_embeddings\": false}",
        .heads_divide_hidden = true,
        .runs = true, .window = HP_WINDOW_NONE,
    },
    {
        .model_type = "mistral", .architecture = "MistralForCausalLM", .canonical = "mistral",
        .attn = HP_ATTN_GQA, .qkv_bias = NEVER, .o_bias = NEVER, .qk_norm = NEVER, .mlp_bias = NEVER,
        .gen_extra = "{}",
        .defaults = "{\"vocab_size\": 32000, \"hidden_size\": 4096, \"intermediate_size\": 14336, \"num_hidden_layers\": 32, \"num_attention_heads\": 32, \"num_key_value_heads\": 8, \"max_position_embeddings\": 131072, \"tie_word_embeddings\": false}",
        .runs = true, .window = HP_WINDOW_EVERY, .sliding_window = 4096, /* MistralConfig: only null disables */
    },
    {
        .model_type = "qwen2", .architecture = "Qwen2ForCausalLM", .canonical = "qwen2",
        .attn = HP_ATTN_GQA, .qkv_bias = ALWAYS, .o_bias = NEVER, .qk_norm = NEVER, .mlp_bias = NEVER,
        .gen_extra = "{}",
        .defaults = "{\"vocab_size\": 151936, \"hidden_size\": 4096, \"intermediate_size\": 22016, \"num_hidden_layers\": 32, \"num_attention_heads\": 32, \"num_key_value_heads\": 32, \"max_position_embeddings\": 32768, \"tie_word_embeddings\": false}",
        .runs = true, .window = HP_WINDOW_FROM_MAX, .max_window_layers = 28,
    },
    {
        .model_type = "qwen3", .architecture = "Qwen3ForCausalLM", .canonical = "qwen3",
        .attn = HP_ATTN_GQA, .qkv_bias = CONFIG("attention_bias", false),
        .o_bias = CONFIG("attention_bias", false), .qk_norm = ALWAYS, .mlp_bias = NEVER,
        .gen_extra = "{\"attention_bias\": false}",
        .defaults = "{\"vocab_size\": 151936, \"hidden_size\": 4096, \"intermediate_size\": 22016, \"num_hidden_layers\": 32, \"num_attention_heads\": 32, \"num_key_value_heads\": 32, \"head_dim\": 128, \"max_position_embeddings\": 32768, \"tie_word_embeddings\": false}",
        .runs = true, .window = HP_WINDOW_FROM_MAX, .max_window_layers = 28,
    },
    {
        .model_type = "mixtral", .architecture = "MixtralForCausalLM", .canonical = "mixtral",
        .moe = true, .attn = HP_ATTN_GQA, .qkv_bias = NEVER, .o_bias = NEVER, .qk_norm = NEVER,
        .sparse = HP_SPARSE_ALL, .per_expert_block = "block_sparse_moe", .router = "gate",
        .expert_proj = {"w1", "w3", "w2"}, .experts = HP_EXPERTS_CONCAT, .has_per_expert_layout = true,
        .shared = HP_SHARED_NONE, .moe_inter_is_intermediate = true,
        .suggested_archetype = "mixtral_topk_router",
        .experts_key = "num_local_experts",
        .gen_extra = "{\"router_jitter_noise\": 0.0}",
        .defaults = "{\"vocab_size\": 32000, \"hidden_size\": 4096, \"intermediate_size\": 14336, \"num_hidden_layers\": 32, \"num_attention_heads\": 32, \"num_key_value_heads\": 8, \"max_position_embeddings\": 131072, \"tie_word_embeddings\": false, \"num_experts_per_tok\": 2, \"num_local_experts\": 8}",
        .runs = true, .window = HP_WINDOW_EVERY, /* MixtralConfig: None when absent */
    },
    {
        .model_type = "qwen2_moe", .architecture = "Qwen2MoeForCausalLM", .canonical = "qwen2moe",
        .moe = true, .attn = HP_ATTN_GQA, .qkv_bias = CONFIG("qkv_bias", true), .o_bias = NEVER,
        .qk_norm = NEVER, .mlp_bias = NEVER, .sparse = HP_SPARSE_STEP, .per_expert_block = "mlp",
        .router = "gate", .expert_proj = SWIGLU_NAMES, .experts = HP_EXPERTS_CONCAT,
        .has_per_expert_layout = true, .shared = HP_SHARED_GATED,
        .suggested_archetype = "qwen2moe_shared_expert_gate",
        .experts_key = "num_experts",
        .gen_extra = "{\"norm_topk_prob\": false, \"decoder_sparse_step\": 1, \"mlp_only_layers\": [], \"qkv_bias\": true}",
        .defaults = "{\"vocab_size\": 151936, \"hidden_size\": 2048, \"intermediate_size\": 5632, \"num_hidden_layers\": 24, \"num_attention_heads\": 16, \"num_key_value_heads\": 16, \"max_position_embeddings\": 32768, \"tie_word_embeddings\": false, \"decoder_sparse_step\": 1, \"moe_intermediate_size\": 1408, \"shared_expert_intermediate_size\": 5632, \"num_experts_per_tok\": 4, \"num_experts\": 60, \"norm_topk_prob\": false}",
        .runs = true, .window = HP_WINDOW_ODD_BELOW_MAX, .max_window_layers = 28,
    },
    {
        .model_type = "qwen3_moe", .architecture = "Qwen3MoeForCausalLM", .canonical = "qwen3moe",
        .moe = true, .attn = HP_ATTN_GQA, .qkv_bias = CONFIG("attention_bias", false),
        .o_bias = CONFIG("attention_bias", false), .qk_norm = ALWAYS, .mlp_bias = NEVER,
        .sparse = HP_SPARSE_STEP, .per_expert_block = "mlp", .router = "gate",
        .expert_proj = SWIGLU_NAMES, .experts = HP_EXPERTS_CONCAT, .has_per_expert_layout = true,
        .shared = HP_SHARED_NONE, .suggested_archetype = "qwen3moe_topk_router",
        .experts_key = "num_experts",
        .gen_extra = "{\"norm_topk_prob\": true, \"decoder_sparse_step\": 1, \"mlp_only_layers\": [], \"attention_bias\": false}",
        .defaults = "{\"vocab_size\": 151936, \"hidden_size\": 2048, \"intermediate_size\": 6144, \"num_hidden_layers\": 24, \"num_attention_heads\": 32, \"num_key_value_heads\": 4, \"max_position_embeddings\": 32768, \"tie_word_embeddings\": false, \"decoder_sparse_step\": 1, \"moe_intermediate_size\": 768, \"num_experts_per_tok\": 8, \"num_experts\": 128, \"norm_topk_prob\": false}",
        .runs = true, .window = HP_WINDOW_EVERY_IF_USE, .max_window_layers = 28,
    },
    {
        .model_type = "deepseek_v3", .architecture = "DeepseekV3ForCausalLM", .canonical = "deepseekv3",
        .moe = true, .attn = HP_ATTN_MLA, .qkv_bias = CONFIG("attention_bias", false),
        .o_bias = CONFIG("attention_bias", false), .qk_norm = NEVER, .mlp_bias = NEVER,
        .sparse = HP_SPARSE_AFTER_DENSE, .per_expert_block = "mlp", .router = "gate",
        .correction_bias = true, .expert_proj = SWIGLU_NAMES, .experts = HP_EXPERTS_CONCAT,
        .has_per_expert_layout = true, .shared = HP_SHARED_MULTI,
        .suggested_archetype = "deepseekv3_sigmoid_group_shared",
        .experts_key = "n_routed_experts",
        .gen_extra = "{\"norm_topk_prob\": true, \"routed_scaling_factor\": 2.5, \"first_k_dense_replace\": 1, \"topk_method\": \"noaux_tc\", \"scoring_func\": \"sigmoid\", \"attention_bias\": false, \"n_shared_experts\": 1, \"q_lora_rank\": 32, \"kv_lora_rank\": 24, \"qk_rope_head_dim\": 8, \"qk_nope_head_dim\": 16, \"v_head_dim\": 16}",
        .defaults = "{\"vocab_size\": 129280, \"hidden_size\": 7168, \"intermediate_size\": 18432, \"moe_intermediate_size\": 2048, \"num_hidden_layers\": 61, \"num_attention_heads\": 128, \"num_key_value_heads\": 128, \"n_shared_experts\": 1, \"n_routed_experts\": 256, \"routed_scaling_factor\": 2.5, \"kv_lora_rank\": 512, \"q_lora_rank\": 1536, \"qk_rope_head_dim\": 64, \"v_head_dim\": 128, \"qk_nope_head_dim\": 128, \"n_group\": 8, \"topk_group\": 4, \"num_experts_per_tok\": 8, \"first_k_dense_replace\": 3, \"norm_topk_prob\": true, \"max_position_embeddings\": 4096, \"tie_word_embeddings\": false}",
        .runs = true, .window = HP_WINDOW_NONE, .rope_interleave = CONFIG("rope_interleave", true),
    },
    {
        .model_type = "glm4_moe", .architecture = "Glm4MoeForCausalLM", .canonical = "glm4moe",
        .moe = true, .attn = HP_ATTN_GQA, .qkv_bias = CONFIG("attention_bias", false), .o_bias = NEVER,
        .qk_norm = CONFIG("use_qk_norm", false), .mlp_bias = NEVER, .sparse = HP_SPARSE_AFTER_DENSE,
        .per_expert_block = "mlp", .router = "gate", .correction_bias = true,
        .expert_proj = SWIGLU_NAMES, .experts = HP_EXPERTS_CONCAT, .has_per_expert_layout = true,
        .shared = HP_SHARED_MULTI, .suggested_archetype = "deepseekv3_sigmoid_group_shared",
        .experts_key = "n_routed_experts",
        .gen_extra = "{\"norm_topk_prob\": true, \"routed_scaling_factor\": 1.0, \"first_k_dense_replace\": 1, \"topk_method\": \"noaux_tc\", \"scoring_func\": \"sigmoid\", \"attention_bias\": true, \"use_qk_norm\": false, \"n_shared_experts\": 1}",
        .defaults = "{\"vocab_size\": 151552, \"hidden_size\": 4096, \"intermediate_size\": 10944, \"num_hidden_layers\": 46, \"num_attention_heads\": 96, \"num_key_value_heads\": 8, \"max_position_embeddings\": 131072, \"tie_word_embeddings\": false, \"moe_intermediate_size\": 1408, \"num_experts_per_tok\": 8, \"n_shared_experts\": 1, \"n_routed_experts\": 128, \"routed_scaling_factor\": 1.0, \"n_group\": 1, \"topk_group\": 1, \"first_k_dense_replace\": 1, \"norm_topk_prob\": true}",
        .runs = true, .window = HP_WINDOW_NONE, .partial_rotary = 0.5, /* Glm4MoeConfig's setdefault */
    },
    {
        .model_type = "gpt_oss", .architecture = "GptOssForCausalLM", .canonical = "gptoss",
        .moe = true, .attn = HP_ATTN_GQA, .qkv_bias = CONFIG("attention_bias", true),
        .o_bias = CONFIG("attention_bias", true), .qk_norm = NEVER, .mlp_bias = NEVER,
        .attn_sinks = true, .sparse = HP_SPARSE_ALL, .per_expert_block = "mlp", .router = "router",
        .router_bias = true, .experts = HP_EXPERTS_GPTOSS, .has_per_expert_layout = false,
        .shared = HP_SHARED_NONE, .moe_inter_is_intermediate = true,
        .suggested_archetype = "gptoss_topk_router",
        .experts_key = "num_local_experts",
        .gen_extra = "{\"attention_bias\": true, \"swiglu_limit\": 7.0}",
        .defaults = "{\"num_hidden_layers\": 36, \"num_local_experts\": 128, \"vocab_size\": 201088, \"hidden_size\": 2880, \"intermediate_size\": 2880, \"head_dim\": 64, \"num_attention_heads\": 64, \"num_key_value_heads\": 8, \"max_position_embeddings\": 131072, \"tie_word_embeddings\": false, \"num_experts_per_tok\": 4, \"swiglu_limit\": 7.0}",
        .runs = true, .window = HP_WINDOW_ALTERNATE, /* layer_types default: sliding first */
    },
};

#define N_FAMILIES (sizeof g_families / sizeof g_families[0])

size_t hp_family_count(void) { return N_FAMILIES; }
const hp_family *hp_family_at(size_t i) { return i < N_FAMILIES ? &g_families[i] : NULL; }
const char *hp_family_name(const hp_family *f) { return f ? f->model_type : ""; }
bool hp_family_is_moe(const hp_family *f) { return f && f->moe; }
bool hp_family_is_mla(const hp_family *f) { return f && f->attn == HP_ATTN_MLA; }
const char *hp_family_suggested_archetype(const hp_family *f) { return f ? f->suggested_archetype : NULL; }

const char *hp_model_suggested_archetype(const hp_model *m)
{
    const char *s = hp_family_suggested_archetype(m->family);
    return s ? s : "routed_only_softmax_topk"; /* an unknown family: plain softmax top-k over gate + experts */
}
bool hp_family_runs(const hp_family *f) { return f && f->runs; }

bool hp__family_rope_interleave(const hp_family *f, const hp_model_config *cfg)
{
    const hp_opt_rule *r = f ? &f->rope_interleave : NULL;
    if (!r || r->kind == HP_OPT_NEVER) return false;
    if (r->kind == HP_OPT_ALWAYS) return true;
    /* transformers reads the key as written: null or false is rotate_half; only an absent key takes the default */
    return cfg->fwd.rope_interleave_written ? cfg->fwd.rope_interleave : r->dflt;
}

double hp__family_partial_rotary(const hp_family *f, const hp_model_config *cfg)
{
    const hp_model_forward *w = &cfg->fwd;
    if (w->dict_partial_rotary_factor.given) return w->dict_partial_rotary_factor.value;
    if (w->partial_rotary_factor.given) return w->partial_rotary_factor.value;
    return f && f->partial_rotary > 0 ? f->partial_rotary : 1.0;
}

/* The window of layer if the config's sliding_window were W. */
static int64_t layer_window(const hp_family *f, const hp_model_config *cfg, int64_t layer, int64_t W)
{
    const hp_model_forward *w = &cfg->fwd;
    int64_t mwl = w->max_window_layers.given ? (int64_t)w->max_window_layers.value : f->max_window_layers;
    bool use = w->use_sliding_window && W > 0;
    switch (f->window) {
    case HP_WINDOW_NONE: return 0;
    case HP_WINDOW_EVERY: return W;
    case HP_WINDOW_FROM_MAX: return use && layer >= mwl ? W : 0;
    case HP_WINDOW_ODD_BELOW_MAX: return use && (layer + 1) % 2 && layer < mwl ? W : 0;
    case HP_WINDOW_EVERY_IF_USE: return use ? W : 0;
    case HP_WINDOW_ALTERNATE: return layer % 2 == 0 ? W : 0;
    }
    return 0;
}

int64_t hp__family_layer_window(const hp_family *f, const hp_model_config *cfg, int64_t layer)
{
    const hp_model_forward *w = &cfg->fwd;
    if (!f) return 0;
    int64_t W = w->sliding_window == HP_CFG_VALUE    ? w->sliding_window_value
              : w->sliding_window == HP_CFG_ABSENT ? f->sliding_window
                                                   : 0;
    return layer_window(f, cfg, layer, W);
}

bool hp__family_window_used(const hp_family *f, const hp_model_config *cfg, int64_t L)
{
    for (int64_t l = 0; f && l < L; l++)
        if (layer_window(f, cfg, l, 1) > 0) return true;
    return false;
}

bool hp_family_experts_transposed(const hp_family *f) { return f && f->experts == HP_EXPERTS_GPTOSS; }

const char *hp_family_known_list(char *buf, size_t cap)
{
    if (!buf || cap == 0) return buf;
    buf[0] = '\0';
    size_t o = 0;
    for (size_t i = 0; i < N_FAMILIES && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%s", i ? ", " : "", g_families[i].model_type);
    return buf;
}

static const char *const g_arch_suffixes[] = {"forcausallm", "forconditionalgeneration",
                                              "forsequenceclassification", "forimagetexttotext"};

const char *hp_arch_canonical(const char *architecture, const char *model_type, char *buf, size_t cap)
{
    const char *src = (architecture && *architecture) ? architecture : (model_type ? model_type : "");
    size_t n = strlen(src);
    if (n >= cap) n = cap - 1;
    for (size_t i = 0; i < n; i++) {
        char c = src[i];
        buf[i] = (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
    }
    buf[n] = '\0';
    for (size_t s = 0; s < sizeof g_arch_suffixes / sizeof *g_arch_suffixes; s++) {
        size_t ls = strlen(g_arch_suffixes[s]);
        if (n > ls && strcmp(buf + n - ls, g_arch_suffixes[s]) == 0) {
            buf[n - ls] = '\0';
            break;
        }
    }
    return buf;
}

const hp_family *hp_family_find(const char *name)
{
    if (!name || !*name) return NULL;
    char canon[128];
    hp_arch_canonical(name, NULL, canon, sizeof canon);
    for (size_t i = 0; i < N_FAMILIES; i++) {
        const hp_family *f = &g_families[i];
        if (strcmp(name, f->model_type) == 0 || strcmp(canon, f->canonical) == 0 ||
            strcmp(canon, f->model_type) == 0)
            return f;
    }
    return NULL;
}

bool hp__family_layer_sparse(const hp_family *f, const hp_model_config *cfg, int64_t layer)
{
    if (!f || !f->moe || cfg->n_experts <= 0) return false;
    switch (f->sparse) {
    case HP_SPARSE_NONE: return false;
    case HP_SPARSE_ALL: return true;
    case HP_SPARSE_STEP: {
        for (int64_t i = 0; i < cfg->n_mlp_only_layers; i++)
            if (cfg->mlp_only_layers[i] == layer) return false;
        int64_t step = cfg->decoder_sparse_step > 0 ? cfg->decoder_sparse_step : 1;
        return (layer + 1) % step == 0;
    }
    case HP_SPARSE_AFTER_DENSE: return layer >= cfg->first_k_dense_replace;
    }
    return false;
}

/*
 * Registration order of the names transformers' modules declare, siblings compared by their position in
 * this list (decoder: self_attn, mlp, norms; attention: q, k, v, o; MoE: router, experts, shared expert).
 * Names that never meet as siblings may share the list without conflict.
 */
static const char *const g_segment_order[] = {
    "model", "transformer", "gpt_neox", "lm_head",
    "embed_tokens", "wte", "wpe", "embed_in", "word_embeddings", "layers", "h", "norm", "ln_f",
    "final_layer_norm",
    "self_attn", "attention", "attn", "mlp", "block_sparse_moe", "input_layernorm",
    "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm",
    "q_proj", "q_a_proj", "q_a_layernorm", "q_b_proj", "k_proj", "v_proj", "kv_a_proj_with_mqa",
    "kv_a_layernorm", "kv_b_proj", "o_proj", "q_norm", "k_norm", "sinks",
    "gate", "router", "experts", "shared_expert", "shared_expert_gate", "shared_experts",
    "gate_proj", "up_proj", "gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias",
    "w1", "w2", "w3",
    "weight", "bias", "e_score_correction_bias",
};

int hp__segment_rank(const char *segment, size_t len)
{
    for (size_t i = 0; i < sizeof g_segment_order / sizeof *g_segment_order; i++)
        if (strlen(g_segment_order[i]) == len && memcmp(g_segment_order[i], segment, len) == 0)
            return (int)i;
    return -1;
}
