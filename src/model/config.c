/*
 * config.c — config.json into hp_model_config: positioned type errors, transformers' defaults, and the
 * impossible values transformers would crash on (or silently build a different model from).
 *
 * Field names are those of the published configs (spec/hf_reference.md §4). Values come from, in order:
 *   1. config.json itself;
 *   2. for a key config.json leaves out, the family's transformers default (families.c `defaults`, the
 *      field defaults of configuration_<family>.py: Qwen3 head_dim 128, Mistral 8 kv heads, ...);
 *   3. what transformers derives from None: num_key_value_heads = num_attention_heads, head_dim =
 *      hidden_size // num_attention_heads. An explicit `null` means None (DeepSeek's "q_lora_rank": null).
 * An explicit 0 is never "absent": a zero size, head count or group count is refused with the key's
 * line:col, and so are values that contradict each other (more kv heads than heads, top-k above the expert
 * count, groups that do not divide the experts, model_type naming another family than architectures[0]).
 *
 * What only the forward pass reads (rms_norm_eps, hidden_act, the rope dict, sliding_window, layer_types, ...)
 * is kept as written in cfg->fwd, from this one parse: the runtime (src/run/rcfg.c) applies the family's
 * defaults from the family table and refuses what it cannot run, so such a model still opens and plans.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "io/json.h"
#include "model/family.h"

typedef enum { F_INT, F_REAL, F_BOOL } field_kind;

typedef struct field {
    const char *key;
    field_kind kind;
    size_t offset;
    int64_t min; /* F_INT: the smallest value that makes sense; 0 where zero means "none" */
} field;

#define INT_FIELD(k, m, lo) {k, F_INT, offsetof(hp_model_config, m), lo}
#define REAL_FIELD(k, m) {k, F_REAL, offsetof(hp_model_config, m), 0}
#define BOOL_FIELD(k, m) {k, F_BOOL, offsetof(hp_model_config, m), 0}

/* Several keys may feed one member (expert count): the first present wins, in table order. */
static const field g_fields[] = {
    INT_FIELD("hidden_size", hidden_size, 1),
    INT_FIELD("intermediate_size", intermediate_size, 1),
    INT_FIELD("num_hidden_layers", num_hidden_layers, 1),
    INT_FIELD("num_attention_heads", num_attention_heads, 1),
    INT_FIELD("num_key_value_heads", num_key_value_heads, 1),
    INT_FIELD("head_dim", head_dim, 1),
    INT_FIELD("vocab_size", vocab_size, 1),
    INT_FIELD("max_position_embeddings", max_position_embeddings, 0),
    INT_FIELD("num_local_experts", n_experts, 0), /* Qwen-MoE: 0 experts is a dense model */
    INT_FIELD("num_experts", n_experts, 0),
    INT_FIELD("n_routed_experts", n_experts, 0),
    INT_FIELD("num_experts_per_tok", num_experts_per_tok, 0), /* 0 is refused below when there are experts */
    INT_FIELD("moe_intermediate_size", moe_intermediate_size, 1),
    INT_FIELD("shared_expert_intermediate_size", shared_intermediate_size, 0),
    INT_FIELD("n_shared_experts", n_shared_experts, 0),
    INT_FIELD("first_k_dense_replace", first_k_dense_replace, 0),
    INT_FIELD("decoder_sparse_step", decoder_sparse_step, 1),
    INT_FIELD("n_group", n_group, 1),
    INT_FIELD("topk_group", topk_group, 1),
    INT_FIELD("q_lora_rank", q_lora_rank, 0), /* 0 or null: no query LoRA (q_proj) */
    INT_FIELD("kv_lora_rank", kv_lora_rank, 1),
    INT_FIELD("qk_rope_head_dim", qk_rope_head_dim, 1),
    INT_FIELD("qk_nope_head_dim", qk_nope_head_dim, 0),
    INT_FIELD("v_head_dim", v_head_dim, 1),
    INT_FIELD("num_nextn_predict_layers", n_nextn_layers, 0),
    REAL_FIELD("routed_scaling_factor", routed_scaling_factor),
    REAL_FIELD("swiglu_limit", swiglu_limit),
    BOOL_FIELD("norm_topk_prob", norm_topk_prob),
    BOOL_FIELD("tie_word_embeddings", tie_word_embeddings),
};
#define N_FIELDS (sizeof g_fields / sizeof *g_fields)

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

static void apply_family(const hp_family *f, hp_model_config *cfg);

/* Where a key's value sits, for messages: "label:line:col" or just "label". */
static const char *where(const char *text, size_t len, const char *label, const char *key, char *buf, size_t cap)
{
    int line = 0, col = 0;
    const char *path[1] = {key};
    if (key && text && hp__json_locate(text, len, path, 1, &line, &col))
        snprintf(buf, cap, "%s:%d:%d", label, line, col);
    else
        snprintf(buf, cap, "%s", label);
    return buf;
}

typedef struct parse_ctx {
    const char *text;
    size_t len;
    const char *label;
    hp_err *err;
} parse_ctx;

static hp_status bad(const parse_ctx *p, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* "<file>:<line>:<col>: <sentence>; fix the config.json", positioned at key's value. */
static hp_status bad(const parse_ctx *p, const char *key, const char *fmt, ...)
{
    char loc[1200], msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return hp_err_set(p->err, HP_ERR_INPUT, "%s: %s; fix the config.json", where(p->text, p->len, p->label, key, loc,
                      sizeof loc), msg);
}

/* Stores the value v of field fd into cfg; type and range errors name the key at its position. */
static hp_status store(const parse_ctx *p, const field *fd, const json_t *v, bool from_defaults, hp_model_config *cfg)
{
    char *base = (char *)cfg + fd->offset;
    switch (fd->kind) {
    case F_INT:
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > HP_DIM_MAX)
            return type_error(p->text, p->len, p->label, fd->key, v, "a non-negative integer no larger than 2^40",
                              p->err);
        if (json_integer_value(v) < fd->min && !from_defaults)
            return bad(p, fd->key, "field \"%s\" is %lld, but it must be at least %lld (an explicit 0 is not \"absent\": "
                       "remove the key to get transformers' default)",
                       fd->key, (long long)json_integer_value(v), (long long)fd->min);
        *(int64_t *)base = json_integer_value(v);
        break;
    case F_REAL:
        if (!json_is_number(v)) return type_error(p->text, p->len, p->label, fd->key, v, "a number", p->err);
        *(double *)base = json_number_value(v);
        break;
    case F_BOOL:
        if (!json_is_boolean(v)) return type_error(p->text, p->len, p->label, fd->key, v, "true or false", p->err);
        *(bool *)base = json_is_true(v);
        break;
    }
    return HP_OK;
}

/* model_type and architectures[0] name the family; when both name a known family they must agree. */
static hp_status resolve_family(const parse_ctx *p, const char *architecture, const char *model_type,
                                const hp_family **out)
{
    const hp_family *fm = hp_family_find(model_type), *fa = hp_family_find(architecture);
    *out = fm ? fm : fa;
    if (fm && fa && fm != fa)
        return bad(p, "model_type",
                   "model_type \"%s\" (family %s) contradicts architectures[0] \"%s\" (family %s): transformers would "
                   "build a %s model from a %s config; make the two name the same family",
                   model_type, hp_family_name(fm), architecture, hp_family_name(fa), hp_family_name(fm),
                   hp_family_name(fa));
    return HP_OK;
}

/* Values that contradict each other, each named with the key to fix. */
static hp_status check_consistency(const parse_ctx *p, const hp_family *f, const hp_model_config *c, bool rsf_given)
{
    const long long nH = c->num_attention_heads, nKV = c->num_key_value_heads, E = c->n_experts;
    const long long K = c->num_experts_per_tok;
    if (f && f->attn == HP_ATTN_MLA) {
        if (nKV && nH && nKV != nH)
            return bad(p, "num_key_value_heads",
                       "num_key_value_heads %lld differs from num_attention_heads %lld; %s attention (MLA) expands k "
                       "and v to every head, so the two must be equal",
                       nKV, nH, hp_family_name(f));
    } else if (nKV && nH && (nKV > nH || nH % nKV != 0)) {
        return bad(p, "num_key_value_heads",
                   "num_key_value_heads %lld %s num_attention_heads %lld; each key/value head serves a whole group of "
                   "query heads, so it must divide num_attention_heads",
                   nKV, nKV > nH ? "is greater than" : "does not divide", nH);
    }
    if (f && f->heads_divide_hidden && nH && c->hidden_size % nH != 0)
        return bad(p, "num_attention_heads",
                   "hidden_size %lld is not divisible by num_attention_heads %lld, which %s's config class refuses",
                   (long long)c->hidden_size, nH, hp_family_name(f));
    if (E > 0 && K > E)
        return bad(p, "num_experts_per_tok", "num_experts_per_tok %lld is greater than the %lld routed experts", K, E);
    if (c->routed_scaling_factor < 0 || (c->routed_scaling_factor == 0 && rsf_given))
        return bad(p, "routed_scaling_factor",
                   "routed_scaling_factor %g would %s every routed expert's output; it must be a positive number",
                   c->routed_scaling_factor, c->routed_scaling_factor < 0 ? "negate" : "zero");
    if (c->swiglu_limit < 0)
        return bad(p, "swiglu_limit", "swiglu_limit %g is negative; it must be a positive clamp", c->swiglu_limit);
    if (f && f->correction_bias && E > 0) {
        /* DeepseekV3TopkRouter: view(-1, n_group, E // n_group), top-2 per group, keep topk_group groups. */
        const long long G = c->n_group, TG = c->topk_group;
        if (E % G != 0)
            return bad(p, "n_group", "n_group %lld does not divide the %lld routed experts into equal groups", G, E);
        if (TG > G)
            return bad(p, "topk_group", "topk_group %lld is greater than n_group %lld", TG, G);
        if (E / G < 2)
            return bad(p, "n_group",
                       "n_group %lld leaves groups of %lld expert; the router scores each group by its top 2 experts, "
                       "so every group needs at least 2",
                       G, E / G);
        if (K > TG * (E / G))
            return bad(p, "num_experts_per_tok",
                       "num_experts_per_tok %lld is more than the %lld experts of the topk_group %lld groups a token "
                       "may use",
                       K, TG * (E / G), TG);
    }
    if (f && f->attn != HP_ATTN_MLA && c->head_dim == 0 && nH)
        return bad(p, "num_attention_heads",
                   "hidden_size %lld is smaller than num_attention_heads %lld, so the default head_dim (hidden_size // "
                   "num_attention_heads) is 0; add \"head_dim\"",
                   (long long)c->hidden_size, nH);
    return HP_OK;
}

/* ---- what the forward pass reads (hp_model_forward): kept as written, checked by the runtime ---- */

static hp_config_num num_of(const json_t *o, const char *key)
{
    const json_t *v = o ? json_object_get(o, key) : NULL;
    hp_config_num n = {false, 0.0};
    if (v && json_is_number(v)) n.given = true, n.value = json_number_value(v);
    return n;
}

static hp_config_kind kind_of(const json_t *v)
{
    return !v ? HP_CFG_ABSENT : json_is_null(v) ? HP_CFG_NULL : HP_CFG_VALUE;
}

/* Fills cfg->fwd from root; the strings and the layer_types entries live in arena. */
static hp_status read_forward(const json_t *root, hp_arena *arena, hp_model_config *cfg, hp_err *err)
{
    hp_model_forward *w = &cfg->fwd;
    w->rms_norm_eps = num_of(root, "rms_norm_eps");
    const json_t *act = json_object_get(root, "hidden_act");
    if (act && json_is_string(act) && !(w->hidden_act = hp_arena_strdup(arena, json_string_value(act))))
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    w->rope_theta = num_of(root, "rope_theta");
    w->partial_rotary_factor = num_of(root, "partial_rotary_factor");

    /* The hub's rope_scaling, else transformers 5's rope_parameters. */
    const json_t *d = json_object_get(root, "rope_scaling");
    if (!json_is_object(d)) d = json_object_get(root, "rope_parameters");
    w->rope = kind_of(d);
    if (w->rope == HP_CFG_VALUE && !json_is_object(d)) w->rope = HP_CFG_WRONG;
    if (w->rope != HP_CFG_VALUE) d = NULL;
    const json_t *t = d ? json_object_get(d, "rope_type") : NULL;
    if (!t && d) t = json_object_get(d, "type");
    if (t && json_is_string(t) && !(w->rope_type = hp_arena_strdup(arena, json_string_value(t))))
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    w->dict_rope_theta = num_of(d, "rope_theta");
    w->dict_partial_rotary_factor = num_of(d, "partial_rotary_factor");
    w->factor = num_of(d, "factor");
    w->original_max_position_embeddings = num_of(d, "original_max_position_embeddings");
    w->low_freq_factor = num_of(d, "low_freq_factor");
    w->high_freq_factor = num_of(d, "high_freq_factor");
    w->beta_fast = num_of(d, "beta_fast");
    w->beta_slow = num_of(d, "beta_slow");
    w->attention_factor = num_of(d, "attention_factor");
    w->mscale = num_of(d, "mscale");
    w->mscale_all_dim = num_of(d, "mscale_all_dim");
    const json_t *tr = d ? json_object_get(d, "truncate") : NULL;
    w->truncate = !tr || json_is_true(tr);

    const json_t *sw = json_object_get(root, "sliding_window");
    w->sliding_window = kind_of(sw);
    if (w->sliding_window == HP_CFG_VALUE) {
        /* 0: no window (transformers 5 writes it for Qwen2-MoE without use_sliding_window) */
        if (json_is_integer(sw) && json_integer_value(sw) >= 0) w->sliding_window_value = json_integer_value(sw);
        else w->sliding_window = HP_CFG_WRONG;
    }
    const json_t *lt = json_object_get(root, "layer_types");
    w->layer_types = kind_of(lt);
    if (w->layer_types == HP_CFG_VALUE && !json_is_array(lt)) w->layer_types = HP_CFG_WRONG;
    if (w->layer_types == HP_CFG_VALUE) {
        size_t n = json_array_size(lt);
        uint8_t *e = n ? hp_arena_alloc(arena, n) : NULL;
        if (n && !e) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        for (size_t i = 0; i < n; i++) {
            const json_t *x = json_array_get(lt, i);
            const char *s = json_is_string(x) ? json_string_value(x) : "";
            e[i] = !strcmp(s, "sliding_attention") ? HP_LAYER_SLIDING
                 : !strcmp(s, "full_attention")    ? HP_LAYER_FULL
                                                   : HP_LAYER_OTHER;
        }
        w->n_layer_types = (int64_t)n;
        w->layer_type = e;
    }
    w->use_sliding_window = json_is_true(json_object_get(root, "use_sliding_window"));
    w->max_window_layers = num_of(root, "max_window_layers");
    const json_t *ri = json_object_get(root, "rope_interleave");
    w->rope_interleave_written = ri != NULL;
    w->rope_interleave = json_is_true(ri);
    return HP_OK;
}

/* eos_token_id as transformers writes it: absent or null (none), an id, or a list of ids; a negative id is none,
 * as for pad_token_id. Anything else (or more than 8 ids) is n_eos = -1: only generation reads it, and refuses. */
static void config_eos(hp_model_config *cfg, const json_t *v)
{
    cfg->n_eos = 0;
    if (!v || json_is_null(v)) return;
    if (json_is_integer(v)) {
        if (json_integer_value(v) >= 0) cfg->eos_token_id[cfg->n_eos++] = json_integer_value(v);
        return;
    }
    if (!json_is_array(v) || json_array_size(v) > 8) {
        cfg->n_eos = -1;
        return;
    }
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_integer(e)) {
            cfg->n_eos = -1;
            return;
        }
        if (json_integer_value(e) >= 0) cfg->eos_token_id[cfg->n_eos++] = json_integer_value(e);
    }
}

hp_status hp__config_parse(const char *text, size_t len, const char *label, hp_arena *arena, hp_model_config *cfg,
                           const char **architecture, const char **model_type, const hp_family **family,
                           hp_err *err)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->pad_token_id = -1;
    *architecture = "";
    *model_type = "";
    *family = NULL;
    parse_ctx pc = {text, len, label, err};
    json_t *root = NULL, *dflt = NULL;
    hp_status st = hp__json_parse(text, len, label, &root, err);
    if (st != HP_OK) return st;
    if (!json_is_object(root)) {
        json_decref(root);
        return hp_err_set(err, HP_ERR_INPUT, "%s: a config.json must hold a JSON object at the top level", label);
    }

    /* architectures[0] and model_type first: they choose the family, whose defaults fill absent keys. */
    json_t *archs = json_object_get(root, "architectures");
    if (archs && !json_is_null(archs)) {
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
    if (st == HP_OK && (!*architecture || !*model_type)) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    if (st == HP_OK) st = resolve_family(&pc, *architecture, *model_type, family);
    const hp_family *f = *family;
    if (st == HP_OK && f && f->defaults) {
        json_error_t je;
        dflt = json_loads(f->defaults, 0, &je);
        HP_ASSERT(dflt != NULL);
    }

    bool given[N_FIELDS] = {false}; /* the member got a value from config.json (null included) */
    bool rsf_given = false;         /* routed_scaling_factor was written (a 0 there is refused) */
    for (size_t i = 0; i < N_FIELDS && st == HP_OK; i++) {
        const field *fd = &g_fields[i];
        json_t *v = json_object_get(root, fd->key);
        if (!v) continue;
        bool taken = false; /* several keys may feed one member (expert count): the first present wins */
        for (size_t j = 0; j < i; j++) taken |= given[j] && g_fields[j].offset == fd->offset;
        if (taken) continue;
        given[i] = true;
        if (json_is_null(v)) continue; /* None: stays 0, no default (q_lora_rank: null means no LoRA) */
        st = store(&pc, fd, v, false, cfg);
        if (fd->offset == offsetof(hp_model_config, routed_scaling_factor)) rsf_given = true;
    }
    for (size_t i = 0; i < N_FIELDS && st == HP_OK && dflt; i++) {
        const field *fd = &g_fields[i];
        json_t *v = json_object_get(dflt, fd->key);
        bool taken = false;
        for (size_t j = 0; j < N_FIELDS; j++) taken |= given[j] && g_fields[j].offset == fd->offset;
        if (!v || taken) continue;
        st = store(&pc, fd, v, true, cfg);
        given[i] = true;
    }
    json_decref(dflt);

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
    cfg->explicit_shape = json_is_integer(json_object_get(root, "hidden_size")) &&
                          json_is_integer(json_object_get(root, "num_hidden_layers"));
    cfg->explicit_experts = json_is_integer(json_object_get(root, "num_local_experts")) ||
                            json_is_integer(json_object_get(root, "num_experts")) ||
                            json_is_integer(json_object_get(root, "n_routed_experts"));
    json_t *qc = json_object_get(root, "quantization_config");
    cfg->quantized = qc && !json_is_null(qc);
    /* Absent, null or negative (some configs write -1): no padding row. */
    json_t *pad = json_object_get(root, "pad_token_id");
    cfg->pad_token_id = json_is_integer(pad) && json_integer_value(pad) >= 0 ? json_integer_value(pad) : -1;
    json_t *bos = json_object_get(root, "bos_token_id");
    cfg->bos_token_id = json_is_integer(bos) && json_integer_value(bos) >= 0 ? json_integer_value(bos) : -1;
    config_eos(cfg, json_object_get(root, "eos_token_id"));
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
    if (st == HP_OK) st = read_forward(root, arena, cfg, err);
    /* An explicit top-k of 0 with routed experts is not "absent" (which means the family default). */
    json_t *k = json_object_get(root, "num_experts_per_tok");
    if (st == HP_OK && k && json_is_integer(k) && json_integer_value(k) == 0 && cfg->n_experts > 0)
        st = type_error(text, len, label, "num_experts_per_tok", k, "at least 1 for a model with routed experts", err);
    json_decref(root);
    if (st != HP_OK) return st;

    /* What transformers derives from None (§1.0): nKV = nH, head_dim = H // nH; DeepSeek-V3's config sets
     * head_dim = qk_rope_head_dim whatever config.json says. Only a missing (not a zero) value gets here. */
    if (!cfg->num_key_value_heads) cfg->num_key_value_heads = cfg->num_attention_heads;
    if (f && f->attn == HP_ATTN_MLA) cfg->head_dim = cfg->qk_rope_head_dim;
    else if (!cfg->head_dim && cfg->num_attention_heads && (f || cfg->hidden_size % cfg->num_attention_heads == 0))
        cfg->head_dim = cfg->hidden_size / cfg->num_attention_heads;
    apply_family(f, cfg);
    if ((st = check_consistency(&pc, f, cfg, rsf_given)) != HP_OK) return st;
    if (!cfg->decoder_sparse_step) cfg->decoder_sparse_step = 1;
    if (cfg->routed_scaling_factor == 0.0) cfg->routed_scaling_factor = 1.0; /* null, or a family without it */
    if (!cfg->n_group) cfg->n_group = 1;
    if (!cfg->topk_group) cfg->topk_group = 1;
    return HP_OK;
}

/* Family-specific derived sizes: expert width and shared-expert width. */
static void apply_family(const hp_family *f, hp_model_config *cfg)
{
    if (!f) return;
    if (f->moe_inter_is_intermediate && !cfg->moe_intermediate_size)
        cfg->moe_intermediate_size = cfg->intermediate_size;
    if (f->shared == HP_SHARED_MULTI) cfg->shared_intermediate_size = cfg->moe_intermediate_size * cfg->n_shared_experts;
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
