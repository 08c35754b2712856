/*
 * hyperpar/model.h — the model as the planner sees it: a parameter table and a module tree.
 *
 * A model comes from a real checkpoint (tensors read from safetensors, any architecture) or, in meta mode,
 * from config.json alone (shapes synthesised for the known families, no weights). Either way:
 *
 *   hp_model
 *    ├─ cfg          hyperparameters read from config.json (0 / defaults where absent)
 *    ├─ params[]     one row per parameter: FQN, dtype, shape, storage, trainable; deterministic order
 *    └─ modules[]    the module tree derived from the dotted names; modules[0] is the root ""
 *
 * Order: transformers' registration order for the names it knows (embed_tokens, layers, norm, lm_head;
 * self_attn before mlp before the norms; q, k, v, o; weight before bias), numeric-aware natural order
 * otherwise, so `layers.2` comes before `layers.10`. Same input, same order, whatever the file order.
 */
#ifndef HYPERPAR_MODEL_H
#define HYPERPAR_MODEL_H

#include "hyperpar/core.h"
#include "hyperpar/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum hp_expert_layout {
    HP_LAYOUT_PER_EXPERT = 0, /* hub names: mlp.experts.{e}.gate_proj.weight (the default) */
    HP_LAYOUT_BATCHED,        /* transformers >= 5: mlp.experts.gate_up_proj [E, 2I, H] */
} hp_expert_layout;

const char *hp_expert_layout_name(hp_expert_layout l);
bool hp_expert_layout_parse(const char *s, hp_expert_layout *out);

/* A number as config.json writes it: given is false when the key is absent or not a number. */
typedef struct hp_config_num {
    bool given;
    double value;
} hp_config_num;

/* How config.json writes a key the runtime checks itself. */
typedef enum hp_config_kind {
    HP_CFG_ABSENT = 0, /* not written */
    HP_CFG_NULL,       /* written as null (transformers' None) */
    HP_CFG_VALUE,      /* written with a value of the expected type */
    HP_CFG_WRONG,      /* written with a value the runtime refuses */
} hp_config_kind;

/* A layer_types entry. */
typedef enum hp_layer_attn { HP_LAYER_FULL = 0, HP_LAYER_SLIDING, HP_LAYER_OTHER } hp_layer_attn;

/* What the forward pass reads beyond the shapes (norm eps, activation, rotary parameters, sliding windows), as
 * config.json writes it, kept from the one parse of config.json. The family's defaults (the family table) and
 * the runtime's checks apply when the runtime reads them (src/run/rcfg.c), so a model the runtime refuses still
 * opens and plans. The rope dict is rope_scaling when that is an object, else rope_parameters. */
typedef struct hp_model_forward {
    hp_config_num rms_norm_eps;
    const char *hidden_act;           /* NULL: absent or not a string */
    hp_config_num rope_theta;         /* top level */
    hp_config_num partial_rotary_factor; /* top level */
    hp_config_kind rope;              /* the rope dict (HP_CFG_WRONG: neither an object nor null) */
    const char *rope_type;            /* the dict's "rope_type" (else its "type") when a string; NULL otherwise */
    hp_config_num dict_rope_theta, dict_partial_rotary_factor; /* the dict's; they win over the top level */
    hp_config_num factor, original_max_position_embeddings, low_freq_factor, high_freq_factor;
    hp_config_num beta_fast, beta_slow, attention_factor, mscale, mscale_all_dim;
    bool truncate;                    /* the dict's "truncate": true unless written and not true */
    hp_config_kind sliding_window;    /* HP_CFG_VALUE: a positive integer in sliding_window_value */
    int64_t sliding_window_value;
    hp_config_kind layer_types;       /* HP_CFG_VALUE: an array (its entries in layer_type) */
    int64_t n_layer_types;
    const uint8_t *layer_type;        /* [n_layer_types] hp_layer_attn (the model's arena) */
    bool use_sliding_window;          /* written true */
    hp_config_num max_window_layers;
    bool rope_interleave_written;     /* the key is there (null included) */
    bool rope_interleave;             /* written true */
} hp_model_forward;

/* Hyperparameters. Integer fields are 0 when the config does not give them (and no default applies). */
typedef struct hp_model_config {
    int64_t hidden_size;           /* H */
    int64_t intermediate_size;     /* I of dense MLPs */
    int64_t num_hidden_layers;
    int64_t num_attention_heads;   /* nH */
    int64_t num_key_value_heads;   /* nKV (defaults to nH) */
    int64_t head_dim;              /* config head_dim, else H / nH */
    int64_t vocab_size;
    int64_t max_position_embeddings;
    int64_t n_experts;             /* routed experts E (num_local_experts / num_experts / n_routed_experts) */
    int64_t num_experts_per_tok;   /* K */
    int64_t moe_intermediate_size; /* mI (gpt-oss and Mixtral: intermediate_size) */
    int64_t shared_intermediate_size; /* sI (0: no shared expert) */
    int64_t n_shared_experts;
    int64_t first_k_dense_replace;
    int64_t decoder_sparse_step;
    int64_t n_group, topk_group;
    int64_t q_lora_rank, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim;
    double routed_scaling_factor;
    double swiglu_limit;
    bool norm_topk_prob;
    bool tie_word_embeddings;
    hp_dtype dtype;                /* torch_dtype (BF16 when absent) */
    int64_t n_mlp_only_layers;
    int64_t mlp_only_layers[64];   /* qwen2/3-moe: layers forced dense */
    int64_t n_nextn_layers;        /* num_nextn_predict_layers: MTP layers after the stack (DeepSeek, GLM) */
    int64_t pad_token_id;          /* -1: none. transformers' embedding (padding_idx) gives its row no gradient */
    int64_t bos_token_id;          /* -1: none */
    int n_eos;                     /* eos_token_id: an id or a list of at most 8 (generation stops at any); -1:
                                      written otherwise (generation refuses it) */
    int64_t eos_token_id[8];
    bool quantized;                /* config.json has a quantization_config (weights may be packed) */
    bool explicit_shape;           /* config.json itself gives hidden_size and num_hidden_layers */
    bool explicit_experts;         /* config.json itself gives the routed-expert count */
    int n_flags;                   /* boolean top-level config keys as written (attention_bias, ...) */
    struct {
        char key[48];
        bool value;
    } flags[32];
    hp_model_forward fwd;          /* what the forward pass reads, as written */
} hp_model_config;

typedef struct hp_param {
    const char *name;      /* fully qualified: model.layers.0.self_attn.q_proj.weight */
    hp_dtype dtype;
    int n_dims;
    int64_t shape[HP_MAX_DIMS];
    int64_t n_elems;
    uint64_t nbytes;
    int file_index;        /* index into the checkpoint's files; -1 in meta mode */
    uint64_t offset;       /* absolute byte offset in that file; 0 in meta mode */
    bool trainable;
    int module;            /* owning module (index into modules) */
} hp_param;

typedef struct hp_module {
    const char *name;      /* FQN; "" for the root */
    const char *leaf;      /* last dotted segment; "" for the root */
    int parent;            /* -1 for the root */
    int depth;             /* root 0 */
    int first_child, next_sibling; /* -1 when none; children in parameter order */
    int n_params;          /* parameters directly owned */
    const int *params;     /* their indices into hp_model.params, in order */
    int subtree_first;     /* parameters of the whole subtree: the contiguous range */
    int subtree_end;       /* [subtree_first, subtree_end) of hp_model.params (empty when equal) */
} hp_module;

typedef struct hp_family hp_family;

typedef struct hp_model {
    const char *path;          /* what was opened */
    bool meta;                 /* shapes from config.json only, no weights */
    bool has_config;           /* a config.json was read (meta mode, or the one beside the weights) */
    const char *architecture;  /* config architectures[0] as written ("MixtralForCausalLM"), or "" */
    const char *model_type;    /* config model_type, or "" */
    const char *arch;          /* canonical name per spec §3.1 ("mixtral", "deepseekv3") */
    const hp_family *family;   /* NULL when the family is not known */
    hp_expert_layout layout;   /* detected from names (real) or requested (meta) */
    hp_model_config cfg;
    size_t n_params;
    hp_param *params;
    size_t n_modules;
    hp_module *modules;
    const int *name_index;     /* params sorted by name, for O(log n) lookup */
    const uint32_t *name_hash; /* [name_hash_mask + 1] open-addressed table of param index + 1 (0: empty) over
                                * XXH64 of the name, at most half full: hp_model_find_param in O(1); NULL: none */
    size_t name_hash_mask;
    hp_ckpt *ckpt;             /* NULL in meta mode */
    hp_arena arena;            /* owns every string above */
} hp_model;

typedef struct hp_model_opts {
    hp_expert_layout layout;   /* meta mode only */
} hp_model_opts;

/* path: a checkpoint folder (with config.json beside the safetensors), a .safetensors file, an index json,
 * a config.json (meta mode), or a folder holding only config.json (meta mode). opts may be NULL.
 * Keys config.json leaves out take the defaults of the family's transformers config class; impossible values
 * are HP_ERR_INPUT. With a known family, a checkpoint whose config.json does not describe its weights (layer
 * count, expert count, shapes) is HP_ERR_INPUT naming the first differences; so is a checkpoint without
 * tensors. A path that is not a file or folder (a FIFO, a device) is refused without blocking. */
hp_status hp_model_open(hp_model **out, const char *path, const hp_model_opts *opts, hp_err *err);
void hp_model_close(hp_model *m);

/* Builds a model from a config.json text (meta mode); label names it in messages. */
hp_status hp_model_from_config_text(hp_model **out, const char *text, size_t len, const char *label,
                                    const hp_model_opts *opts, hp_err *err);

/* The number of sparse (MoE) layers; bytes by dtype; the model as `hyperpar inspect --json` prints it (with
 * tensors: every tensor), ending in a newline. */
int64_t hp_model_sparse_layers(const hp_model *m);
void hp_model_dtype_bytes(const hp_model *m, uint64_t by[HP_DT_COUNT]);
hp_status hp_model_inspect_json(const hp_model *m, bool tensors, hp_buf *out, hp_err *err);

/* One tensor of a model held elsewhere (a live torch module): its name, dtype and shape. */
typedef struct hp_tensor_desc {
    const char *name;
    hp_dtype dtype;
    int n_dims;
    int64_t shape[HP_MAX_DIMS];
    bool trainable;
} hp_tensor_desc;

/* Builds a model from a config.json text and the tensors of a model held elsewhere (meta: no weights are read);
 * label names it in messages. With a known family the tensors must be what the config describes (as for a
 * checkpoint: hp_model_open). */
hp_status hp_model_from_tensors(hp_model **out, const char *config_text, size_t len, const char *label,
                                const hp_tensor_desc *t, size_t n, hp_err *err);

const hp_param *hp_model_find_param(const hp_model *m, const char *name);
int hp_model_find_module(const hp_model *m, const char *name); /* -1 when absent */
/* Layers of the decoder stack that hold a sparse (MoE) block. */
bool hp_model_layer_is_sparse(const hp_model *m, int64_t layer);
/* Marks parameters matching the glob non-trainable; returns how many matched. */
size_t hp_model_freeze(hp_model *m, const char *glob);

uint64_t hp_model_num_params(const hp_model *m);  /* total element count */
/* An integer hyperparameter by its config.json key ("hidden_size"); false when not an integer field. */
bool hp_model_config_int(const hp_model *m, const char *key, int64_t *out);
uint64_t hp_model_total_bytes(const hp_model *m);

/* ---- families: transformers naming and shape rules as data ---- */

const hp_family *hp_family_find(const char *name); /* model_type, architecture or canonical arch */
const char *hp_family_name(const hp_family *f);    /* model_type spelling, e.g. "qwen3_moe" */
bool hp_family_is_moe(const hp_family *f);
/* Multi-head latent attention (DeepSeek-V2/V3): q/k heads of qk_nope_head_dim + qk_rope_head_dim, v heads of
 * v_head_dim; cfg.head_dim then holds qk_rope_head_dim, as transformers' config sets it. */
bool hp_family_is_mla(const hp_family *f);
/* The decoder runtime (hyperpar run, cost's walk of the forward) runs the family (docs/run.md). */
bool hp_family_runs(const hp_family *f);
/* The EP compute archetype suggested for the family ("qwen3moe_topk_router"), or NULL for dense ones. */
const char *hp_family_suggested_archetype(const hp_family *f);
/* What the planner suggests and the MoE runtime runs when nothing is declared: the family's archetype, else
 * "routed_only_softmax_topk" (one rule for both, tests/test_archetypes.c). */
const char *hp_model_suggested_archetype(const hp_model *m);
/* Batched experts stored transposed for x @ W with gate/up interleaved (gpt-oss: gate_up [E, H, 2I]). */
bool hp_family_experts_transposed(const hp_family *f);
/* Comma-separated list of known model types, for messages, into the caller's buf (HP_FAMILY_LIST_MAX bytes
 * hold it whole; a smaller one gets it cut short); returns buf. */
#define HP_FAMILY_LIST_MAX 512
const char *hp_family_known_list(char *buf, size_t cap);
size_t hp_family_count(void);
const hp_family *hp_family_at(size_t i);

/* Canonical architecture name per spec §3.1 into buf: lower-cased, one suffix stripped. */
const char *hp_arch_canonical(const char *architecture, const char *model_type, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
