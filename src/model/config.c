/*
 * config.c — config.json into hp_model_config, with positioned type errors.
 *
 * Field names are those of the published configs (spec/hf_reference.md §4). Each field is optional here;
 * meta mode then checks that the family's synthesis has what it needs (model.c). A present field of the
 * wrong type is an error naming the key, its line:col, what was found and what was expected; `null` counts
 * as absent (DeepSeek writes "q_lora_rank": null for models without a query LoRA).
 */
#include <stdio.h>
#include <string.h>

#include "io/json.h"
#include "model/family.h"

typedef enum { F_INT, F_REAL, F_BOOL } field_kind;

typedef struct field {
    const char *key;
    field_kind kind;
    size_t offset;
} field;

#define INT_FIELD(k, m) {k, F_INT, offsetof(hp_model_config, m)}
#define REAL_FIELD(k, m) {k, F_REAL, offsetof(hp_model_config, m)}
#define BOOL_FIELD(k, m) {k, F_BOOL, offsetof(hp_model_config, m)}

/* Several keys may feed one member (expert count): the first present wins, in table order. */
static const field g_fields[] = {
    INT_FIELD("hidden_size", hidden_size),
    INT_FIELD("intermediate_size", intermediate_size),
    INT_FIELD("num_hidden_layers", num_hidden_layers),
    INT_FIELD("num_attention_heads", num_attention_heads),
    INT_FIELD("num_key_value_heads", num_key_value_heads),
    INT_FIELD("head_dim", head_dim),
    INT_FIELD("vocab_size", vocab_size),
    INT_FIELD("max_position_embeddings", max_position_embeddings),
    INT_FIELD("num_local_experts", n_experts),
    INT_FIELD("num_experts", n_experts),
    INT_FIELD("n_routed_experts", n_experts),
    INT_FIELD("num_experts_per_tok", num_experts_per_tok),
    INT_FIELD("moe_intermediate_size", moe_intermediate_size),
    INT_FIELD("shared_expert_intermediate_size", shared_intermediate_size),
    INT_FIELD("n_shared_experts", n_shared_experts),
    INT_FIELD("first_k_dense_replace", first_k_dense_replace),
    INT_FIELD("decoder_sparse_step", decoder_sparse_step),
    INT_FIELD("n_group", n_group),
    INT_FIELD("topk_group", topk_group),
    INT_FIELD("q_lora_rank", q_lora_rank),
    INT_FIELD("kv_lora_rank", kv_lora_rank),
    INT_FIELD("qk_rope_head_dim", qk_rope_head_dim),
    INT_FIELD("qk_nope_head_dim", qk_nope_head_dim),
    INT_FIELD("v_head_dim", v_head_dim),
    REAL_FIELD("routed_scaling_factor", routed_scaling_factor),
    REAL_FIELD("swiglu_limit", swiglu_limit),
    BOOL_FIELD("norm_topk_prob", norm_topk_prob),
    BOOL_FIELD("tie_word_embeddings", tie_word_embeddings),
};

/* Dimensions above 2^40 are not a real model; refusing them early keeps every product far from overflow. */
#define HP_DIM_MAX ((int64_t)1 << 40)

static hp_status type_error(const char *text, size_t len, const char *label, const char *key, const json_t *v,
                            const char *expected, hp_err *err)
{
    int line = 0, col = 0;
    const char *path[1] = {key};
    char desc[96];
    hp__json_describe(v, desc, sizeof desc);
    if (hp__json_locate(text, len, path, 1, &line, &col))
        return hp_err_set(err, HP_ERR_INPUT, "%s:%d:%d: field \"%s\" must be %s, found %s; fix the config.json",
                          label, line, col, key, expected, desc);
    return hp_err_set(err, HP_ERR_INPUT, "%s: field \"%s\" must be %s, found %s; fix the config.json", label, key,
                      expected, desc);
}

bool hp__config_bool(const hp_model_config *c, const char *key, bool dflt)
{
    for (int i = 0; i < c->n_flags; i++)
        if (strcmp(c->flags[i].key, key) == 0) return c->flags[i].value;
    return dflt;
}

static hp_dtype dtype_from_torch(const char *s, bool *known)
{
    static const struct {
        const char *name;
        hp_dtype dt;
    } map[] = {{"bfloat16", HP_DT_BF16}, {"float16", HP_DT_F16}, {"half", HP_DT_F16},
               {"float32", HP_DT_F32},   {"float", HP_DT_F32},   {"float64", HP_DT_F64}};
    for (size_t i = 0; i < sizeof map / sizeof *map; i++)
        if (strcmp(s, map[i].name) == 0) {
            *known = true;
            return map[i].dt;
        }
    *known = false;
    return HP_DT_BF16;
}

/* Parses the config text; fills cfg and the architecture / model_type strings (arena-owned). */
hp_status hp__config_parse(const char *text, size_t len, const char *label, hp_arena *arena, hp_model_config *cfg,
                           const char **architecture, const char **model_type, hp_err *err)
{
    memset(cfg, 0, sizeof *cfg);
    *architecture = "";
    *model_type = "";
    json_t *root = NULL;
    hp_status st = hp__json_parse(text, len, label, &root, err);
    if (st != HP_OK) return st;
    if (!json_is_object(root)) {
        json_decref(root);
        return hp_err_set(err, HP_ERR_INPUT, "%s: a config.json must hold a JSON object at the top level", label);
    }

    bool seen_experts = false;
    cfg->n_shared_experts = -1; /* "absent": the family default applies (hp__config_apply_family) */
    for (size_t i = 0; i < sizeof g_fields / sizeof *g_fields && st == HP_OK; i++) {
        const field *fd = &g_fields[i];
        json_t *v = json_object_get(root, fd->key);
        if (!v || json_is_null(v)) continue;
        char *base = (char *)cfg + fd->offset;
        switch (fd->kind) {
        case F_INT: {
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > HP_DIM_MAX) {
                st = type_error(text, len, label, fd->key, v, "a non-negative integer no larger than 2^40", err);
                break;
            }
            if (fd->offset == offsetof(hp_model_config, n_experts)) {
                if (seen_experts) break;
                seen_experts = true;
            }
            *(int64_t *)base = json_integer_value(v);
            break;
        }
        case F_REAL:
            if (!json_is_number(v)) st = type_error(text, len, label, fd->key, v, "a number", err);
            else *(double *)base = json_number_value(v);
            break;
        case F_BOOL:
            if (!json_is_boolean(v)) st = type_error(text, len, label, fd->key, v, "true or false", err);
            else *(bool *)base = json_is_true(v);
            break;
        }
    }

    /* architectures[0], model_type, torch_dtype, mlp_only_layers, and every boolean key for family rules. */
    json_t *archs = json_object_get(root, "architectures");
    if (st == HP_OK && archs && !json_is_null(archs)) {
        if (!json_is_array(archs) || (json_array_size(archs) > 0 && !json_is_string(json_array_get(archs, 0))))
            st = type_error(text, len, label, "architectures", archs, "an array of class-name strings", err);
        else if (json_array_size(archs) > 0)
            *architecture = hp_arena_strdup(arena, json_string_value(json_array_get(archs, 0)));
    }
    json_t *mt = json_object_get(root, "model_type");
    if (st == HP_OK && mt && !json_is_null(mt)) {
        if (!json_is_string(mt)) st = type_error(text, len, label, "model_type", mt, "a string", err);
        else *model_type = hp_arena_strdup(arena, json_string_value(mt));
    }
    cfg->dtype = HP_DT_BF16;
    const char *dtype_keys[] = {"torch_dtype", "dtype"};
    for (int k = 0; k < 2 && st == HP_OK; k++) {
        json_t *v = json_object_get(root, dtype_keys[k]);
        if (!v || json_is_null(v)) continue;
        if (!json_is_string(v)) {
            st = type_error(text, len, label, dtype_keys[k], v, "a dtype name such as \"bfloat16\"", err);
            break;
        }
        bool known;
        cfg->dtype = dtype_from_torch(json_string_value(v), &known);
        if (!known)
            hp_log(HP_LOG_WARN, "%s: %s \"%s\" is not one of bfloat16, float16, float32, float64; assuming bfloat16",
                   label, dtype_keys[k], json_string_value(v));
        break;
    }
    json_t *mol = json_object_get(root, "mlp_only_layers");
    if (st == HP_OK && mol && !json_is_null(mol)) {
        if (!json_is_array(mol) || json_array_size(mol) > 64) {
            st = type_error(text, len, label, "mlp_only_layers", mol, "an array of at most 64 layer indices", err);
        } else {
            for (size_t i = 0; i < json_array_size(mol); i++) {
                json_t *e = json_array_get(mol, i);
                if (!json_is_integer(e) || json_integer_value(e) < 0) {
                    st = type_error(text, len, label, "mlp_only_layers", mol, "an array of non-negative integers", err);
                    break;
                }
                cfg->mlp_only_layers[cfg->n_mlp_only_layers++] = json_integer_value(e);
            }
        }
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        if (!json_is_boolean(v) || cfg->n_flags >= (int)(sizeof cfg->flags / sizeof *cfg->flags)) continue;
        if (strlen(key) >= sizeof cfg->flags[0].key) continue;
        snprintf(cfg->flags[cfg->n_flags].key, sizeof cfg->flags[0].key, "%s", key);
        cfg->flags[cfg->n_flags++].value = json_is_true(v);
    }
    /* An explicit top-k of 0 with routed experts is not "absent" (which means the family default). */
    json_t *k = json_object_get(root, "num_experts_per_tok");
    if (st == HP_OK && k && json_is_integer(k) && json_integer_value(k) == 0 && cfg->n_experts > 0)
        st = type_error(text, len, label, "num_experts_per_tok", k, "at least 1 for a model with routed experts", err);
    json_decref(root);
    if (st != HP_OK) return st;

    /* Defaults transformers applies (§1.0): nKV = nH, head_dim = H / nH. */
    if (!cfg->num_key_value_heads) cfg->num_key_value_heads = cfg->num_attention_heads;
    if (!cfg->head_dim && cfg->num_attention_heads && cfg->hidden_size % cfg->num_attention_heads == 0)
        cfg->head_dim = cfg->hidden_size / cfg->num_attention_heads;
    if (!cfg->decoder_sparse_step) cfg->decoder_sparse_step = 1;
    if (cfg->routed_scaling_factor == 0.0) cfg->routed_scaling_factor = 1.0;
    if (!cfg->n_group) cfg->n_group = 1;
    if (!cfg->topk_group) cfg->topk_group = 1;
    return HP_OK;
}

/* Family-specific derived sizes: expert width and shared-expert width. */
void hp__config_apply_family(const hp_family *f, hp_model_config *cfg)
{
    bool n_shared_given = cfg->n_shared_experts >= 0;
    if (!n_shared_given) cfg->n_shared_experts = 0;
    if (!f) return;
    if (f->moe_inter_is_intermediate && !cfg->moe_intermediate_size)
        cfg->moe_intermediate_size = cfg->intermediate_size;
    if (f->shared == HP_SHARED_MULTI) {
        if (!n_shared_given) cfg->n_shared_experts = 1; /* DeepseekV3Config / Glm4MoeConfig default */
        cfg->shared_intermediate_size = cfg->moe_intermediate_size * cfg->n_shared_experts;
    }
    if (f->shared == HP_SHARED_NONE) cfg->shared_intermediate_size = 0;
}

bool hp_model_config_int(const hp_model *m, const char *key, int64_t *out)
{
    for (size_t i = 0; i < sizeof g_fields / sizeof *g_fields; i++)
        if (g_fields[i].kind == F_INT && strcmp(g_fields[i].key, key) == 0) {
            *out = *(const int64_t *)((const char *)&m->cfg + g_fields[i].offset);
            return *out > 0;
        }
    return false;
}
