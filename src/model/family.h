/*
 * family.h — internal: what hyperpar knows about a transformers model family, as one record of data.
 *
 * Each record answers the questions shape synthesis and, later, the planner ask of a family: which
 * attention (GQA or MLA) and which optional tensors it has (biases, q/k norms, sinks), which decoder layers
 * are sparse, how its routers and experts are named in the hub (per-expert) and batched layouts, and which
 * shared expert it carries, and what its forward pass reads from config.json beyond the shapes (rope style,
 * partial rotary default, sliding-window rule and defaults) and whether the runtime runs it. The records live
 * in families.c; nothing else spells a family name.
 */
#ifndef HP_MODEL_FAMILY_H
#define HP_MODEL_FAMILY_H

#include "hyperpar/model.h"

/* An optional tensor: never present, always present, or present when a boolean config key says so. */
typedef enum { HP_OPT_NEVER = 0, HP_OPT_ALWAYS, HP_OPT_CONFIG } hp_opt_kind;
typedef struct hp_opt_rule {
    hp_opt_kind kind;
    const char *key;   /* HP_OPT_CONFIG: the config.json key */
    bool dflt;         /* HP_OPT_CONFIG: its default when absent */
} hp_opt_rule;

typedef enum { HP_ATTN_GQA = 0, HP_ATTN_MLA } hp_attn_kind;

typedef enum {
    HP_SPARSE_NONE = 0,     /* dense model */
    HP_SPARSE_ALL,          /* every layer (Mixtral, gpt-oss) */
    HP_SPARSE_STEP,         /* Qwen-MoE: not in mlp_only_layers and (i+1) % decoder_sparse_step == 0 */
    HP_SPARSE_AFTER_DENSE,  /* DeepSeek/GLM: i >= first_k_dense_replace */
} hp_sparse_rule;

typedef enum {
    HP_SHARED_NONE = 0,
    HP_SHARED_GATED,        /* Qwen2-MoE: mlp.shared_expert.* [sI] + mlp.shared_expert_gate [1, H] */
    HP_SHARED_MULTI,        /* DeepSeek/GLM: mlp.shared_experts.* [mI * n_shared_experts] */
} hp_shared_kind;

typedef enum {
    HP_EXPERTS_CONCAT = 0,  /* gate_up_proj [E, 2I, H] gate rows first, down_proj [E, H, I] */
    HP_EXPERTS_GPTOSS,      /* gate_up_proj [E, H, 2I] interleaved, down_proj [E, I, H], with biases */
} hp_experts_kind;

/* Which layers slide when config.json has no layer_types (explicit layer_types always win). W is the
 * sliding_window as written, else the family's default; null means None (no window). */
typedef enum {
    HP_WINDOW_NONE = 0,      /* no layer (Llama, DeepSeek-V3, GLM4-MoE) */
    HP_WINDOW_EVERY,         /* every layer when W is not None (Mistral, Mixtral) */
    HP_WINDOW_FROM_MAX,      /* Qwen2/Qwen3: use_sliding_window and layer >= max_window_layers */
    HP_WINDOW_ODD_BELOW_MAX, /* Qwen2-MoE: use_sliding_window, (layer+1) % 2 and layer < max_window_layers */
    HP_WINDOW_EVERY_IF_USE,  /* Qwen3-MoE: use_sliding_window applies W to every layer */
    HP_WINDOW_ALTERNATE,     /* gpt-oss: alternating, sliding first (layer 0, 2, ...) */
} hp_window_rule;

struct hp_family {
    const char *model_type;      /* config model_type: "qwen3_moe" */
    const char *architecture;    /* architectures[0] written by `gen`: "Qwen3MoeForCausalLM" */
    const char *canonical;       /* spec §3.1 name: "qwen3moe" */
    bool moe;
    hp_attn_kind attn;
    hp_opt_rule qkv_bias;        /* q/k/v (MLA: q_a_proj and kv_a_proj_with_mqa) */
    hp_opt_rule o_bias;
    hp_opt_rule qk_norm;         /* self_attn.q_norm / k_norm [hd] */
    hp_opt_rule mlp_bias;        /* dense MLP biases */
    bool attn_sinks;             /* self_attn.sinks [nH] */
    hp_sparse_rule sparse;
    const char *per_expert_block;   /* module holding the sparse block in hub names: "mlp", "block_sparse_moe" */
    const char *router;             /* "gate" or "router" */
    bool router_bias;               /* router.bias [E] */
    bool correction_bias;           /* gate.e_score_correction_bias [E], always f32 */
    const char *expert_proj[3];     /* per-expert names of gate, up, down: gate_proj.. or w1, w3, w2 */
    hp_experts_kind experts;
    bool has_per_expert_layout;     /* false: only the batched layout exists (gpt-oss) */
    hp_shared_kind shared;
    bool moe_inter_is_intermediate; /* expert width is intermediate_size (Mixtral, gpt-oss) */
    const char *suggested_archetype;/* EP compute archetype the planner suggests */
    const char *experts_key;        /* config key of the routed-expert count */
    const char *gen_extra;          /* JSON object text of family keys `gen` writes (router settings) */
    /* transformers' <Family>Config defaults for keys config.json leaves out, as JSON object text with the
     * config.json key names (configuration_<family>.py). A key missing here has no default there (None):
     * num_key_value_heads then means num_attention_heads and head_dim means hidden_size // heads. */
    const char *defaults;
    bool heads_divide_hidden;       /* the config class refuses hidden_size % num_attention_heads != 0 (Llama) */
    /* The forward pass (shared/spec/transformers_forward.md), read by the runtime (src/run/rcfg.c), cost and gen. */
    bool runs;                      /* the decoder runtime runs the family (docs/run.md) */
    hp_opt_rule rope_interleave;    /* rope on adjacent pairs (DeepSeek-V3) instead of rotate_half's halves */
    double partial_rotary;          /* partial_rotary_factor when config.json has none (GLM4-MoE 0.5); 0: 1 */
    hp_window_rule window;
    int64_t sliding_window;         /* sliding_window when the key is absent (Mistral 4096); 0: None */
    int64_t max_window_layers;      /* max_window_layers when absent (the Qwen configs' 28) */
};

/* Synthesis callback: one parameter; tag says which expert weight it is (for deterministic generation). */
typedef enum { HP_TAG_NONE = 0, HP_TAG_GATE, HP_TAG_UP, HP_TAG_DOWN, HP_TAG_GATE_UP } hp_tag_kind;
typedef struct hp_synth_tag {
    hp_tag_kind kind;
    int64_t layer;
    int64_t expert;     /* -1 for a batched tensor holding every expert */
    bool interleaved;   /* gpt-oss layout: gate_up [E,H,2I] with gate/up alternating, down [E,I,H] */
} hp_synth_tag;

typedef hp_status (*hp_synth_emit_fn)(void *ctx, const char *name, hp_dtype dt, int n_dims,
                                      const int64_t *shape, const hp_synth_tag *tag, hp_err *err);

/* Emits every parameter of the family's model for cfg and layout. */
hp_status hp__synth_params(const hp_family *f, const hp_model_config *cfg, hp_expert_layout layout,
                           hp_synth_emit_fn emit, void *ctx, hp_err *err);

/* Registration-order rank of a dotted name segment among its siblings (lower first); -1 when unknown. */
int hp__segment_rank(const char *segment, size_t len);

/* Compares a real checkpoint's tensors (m, table built) with what its config.json implies for m->family: a
 * missing layer or expert, a tensor of another shape, a layer or expert beyond the config's counts. Extra
 * tensors of other kinds (quantization scales, rotary buffers) are ignored; a quantized checkpoint is only
 * checked for its layer count. cfg_label names the config.json in the message. */
hp_status hp__model_check_weights(const hp_model *m, const char *cfg_label, hp_err *err);

/* Parses config.json's text (config.c): fills cfg, the architecture / model_type strings (arena-owned) and the
 * family (NULL when neither names a known one). label names the file in messages. */
hp_status hp__config_parse(const char *text, size_t len, const char *label, hp_arena *arena, hp_model_config *cfg,
                           const char **architecture, const char **model_type, const hp_family **family,
                           hp_err *err);

/* A boolean top-level config.json key as written, or dflt when config.json leaves it out (the opt rules). */
bool hp__config_bool(const hp_model_config *c, const char *key, bool dflt);

/* The forward facts of family f (NULL: an unknown family: rotate_half over the whole head, no windows)
 * for the config cfg, config.json's values (cfg->fwd) over the family's defaults. */
bool hp__family_rope_interleave(const hp_family *f, const hp_model_config *cfg);
double hp__family_partial_rotary(const hp_family *f, const hp_model_config *cfg);
/* Layer i's sliding window (keys j > q - W; 0: none) when config.json has no layer_types. The caller has
 * refused a sliding_window that is not a positive integer or null. */
int64_t hp__family_layer_window(const hp_family *f, const hp_model_config *cfg, int64_t layer);
/* Whether the family's rule gives some layer of L a window when the config's sliding_window is positive (whether a
 * sliding_window of 0, which transformers writes for a window that is off, would be used). */
bool hp__family_window_used(const hp_family *f, const hp_model_config *cfg, int64_t L);

/* Whether layer i is sparse for this family and config. */
bool hp__family_layer_sparse(const hp_family *f, const hp_model_config *cfg, int64_t layer);

#endif
