/*
 * gguf_llama.c — a llama-architecture GGUF file as transformers' LlamaForCausalLM: tensor names, shapes, the
 * Q/K row order and config.json (docs/gguf.md).
 *
 * Names (the table below), GGUF → transformers:
 *
 *   token_embd.weight           model.embed_tokens.weight
 *   blk.N.attn_norm.weight      model.layers.N.input_layernorm.weight
 *   blk.N.attn_q|k|v.weight     model.layers.N.self_attn.q_proj|k_proj|v_proj.weight   (q, k: rows permuted)
 *   blk.N.attn_output.weight    model.layers.N.self_attn.o_proj.weight
 *   blk.N.ffn_norm.weight       model.layers.N.post_attention_layernorm.weight
 *   blk.N.ffn_gate|up|down      model.layers.N.mlp.gate_proj|up_proj|down_proj.weight
 *   output_norm.weight          model.norm.weight
 *   output.weight               lm_head.weight (absent: tied to the embedding)
 *
 * Shapes: GGUF lists dims innermost first (ne[0] is the row length), transformers outermost first, so the
 * shape is ne reversed. The rotary permutation: llama.cpp's converter reorders the rows of q_proj (over the
 * attention heads) and k_proj (over the key/value heads) so that each head's two rotary halves interleave —
 * the rows of head h, [h·d, (h+1)·d) with d the head dim, go from (half, i) order to (i, half) order:
 *
 *   GGUF row h·d + 2·i + half  =  transformers row h·d + half·d/2 + i      (half < 2, i < d/2)
 *
 * convert reads them back in transformers' order (hp_gguf_mapped.permute_heads).
 *
 * Metadata (prefix "llama."): context_length, embedding_length, block_count, feed_forward_length,
 * attention.head_count, attention.head_count_kv, attention.key_length / value_length, rope.dimension_count,
 * rope.freq_base, attention.layer_norm_rms_epsilon, rope.scaling.*; the vocabulary size is the number of
 * tokenizer.ggml.tokens; bos / eos / pad ids from tokenizer.ggml.*_token_id.
 */
#include "hyperpar/convert.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Which rows a tensor's permutation runs over. */
enum { PERM_NONE = 0, PERM_HEADS, PERM_KV_HEADS };
/* Shapes in units of the model's sizes. */
typedef enum dimk { D_1 = 0, D_HIDDEN, D_VOCAB, D_FFN, D_Q, D_KV } dimk;

typedef struct name_rule {
    const char *gguf, *hf; /* suffixes after "blk.N." / "model.layers.N." for the block rules */
    int permute;
    int n_dims;
    dimk shape[2];         /* transformers' order */
} name_rule;

static const name_rule g_top[] = {
    {"token_embd.weight", "model.embed_tokens.weight", PERM_NONE, 2, {D_VOCAB, D_HIDDEN}},
    {"output_norm.weight", "model.norm.weight", PERM_NONE, 1, {D_HIDDEN, D_1}},
    {"output.weight", "lm_head.weight", PERM_NONE, 2, {D_VOCAB, D_HIDDEN}},
};
enum { TOP_EMBED, TOP_NORM, TOP_OUTPUT, N_TOP };

/* In transformers' registration order within a layer. */
static const name_rule g_block[] = {
    {"attn_q.weight", "self_attn.q_proj.weight", PERM_HEADS, 2, {D_Q, D_HIDDEN}},
    {"attn_k.weight", "self_attn.k_proj.weight", PERM_KV_HEADS, 2, {D_KV, D_HIDDEN}},
    {"attn_v.weight", "self_attn.v_proj.weight", PERM_NONE, 2, {D_KV, D_HIDDEN}},
    {"attn_output.weight", "self_attn.o_proj.weight", PERM_NONE, 2, {D_HIDDEN, D_Q}},
    {"ffn_gate.weight", "mlp.gate_proj.weight", PERM_NONE, 2, {D_FFN, D_HIDDEN}},
    {"ffn_up.weight", "mlp.up_proj.weight", PERM_NONE, 2, {D_FFN, D_HIDDEN}},
    {"ffn_down.weight", "mlp.down_proj.weight", PERM_NONE, 2, {D_HIDDEN, D_FFN}},
    {"attn_norm.weight", "input_layernorm.weight", PERM_NONE, 1, {D_HIDDEN, D_1}},
    {"ffn_norm.weight", "post_attention_layernorm.weight", PERM_NONE, 1, {D_HIDDEN, D_1}},
};
#define N_BLOCK (sizeof g_block / sizeof *g_block)

/* The largest layer count and size accepted: far above any llama (405B: 126 layers, 16384 hidden, 128256
 * tokens), small enough that products of two fit easily in int64. */
#define MAX_LAYERS 100000
#define MAX_SIZE (1ll << 31)

typedef struct llama_meta {
    int64_t ctx, hidden, layers, ffn, heads, kv_heads, head_dim, vocab;
    double rope_theta, eps;
    const char *rope_type; /* NULL: no scaling */
    double rope_factor;
    int64_t rope_orig_ctx; /* 0: not given */
    int64_t bos, eos, pad; /* -1: not given */
} llama_meta;

/* ---- metadata ---- */

static hp_status need_int(const hp_gguf_file *f, const char *key, int64_t lo, int64_t hi, int64_t *out, bool required,
                          hp_err *err)
{
    bool found;
    hp_status st = hp_gguf_get_int(f, key, out, &found, err);
    if (st) return st;
    if (!found && required)
        return hp_err_set(err, HP_ERR_INPUT, "%s: metadata key '%s' is missing; a llama model needs it.",
                          hp_gguf_path(f), key);
    if (found && (*out < lo || *out > hi))
        return hp_err_set(err, HP_ERR_INPUT, "%s: metadata key '%s' is %lld; it must be in [%lld, %lld].",
                          hp_gguf_path(f), key, (long long)*out, (long long)lo, (long long)hi);
    if (!found) *out = -1;
    return HP_OK;
}

static hp_status need_float(const hp_gguf_file *f, const char *key, double *out, bool required, hp_err *err)
{
    bool found;
    hp_status st = hp_gguf_get_float(f, key, out, &found, err);
    if (st) return st;
    if (!found && required)
        return hp_err_set(err, HP_ERR_INPUT, "%s: metadata key '%s' is missing; a llama model needs it.",
                          hp_gguf_path(f), key);
    if (found && !(isfinite(*out) && *out > 0))
        return hp_err_set(err, HP_ERR_INPUT, "%s: metadata key '%s' is %g; it must be a positive number.",
                          hp_gguf_path(f), key, *out);
    return HP_OK;
}

/* rope.scaling.type (or the older rope.scale_linear): linear and yarn carry over to transformers' rope_scaling;
 * none is no scaling; anything else is refused by name. */
static hp_status read_rope_scaling(const hp_gguf_file *f, llama_meta *m, hp_err *err)
{
    const hp_gguf_str *type = NULL;
    bool found = false;
    double lin = 0;
    hp_status st = hp_gguf_get_string(f, "llama.rope.scaling.type", &type, err);
    if (!st) st = hp_gguf_get_float(f, "llama.rope.scale_linear", &lin, &found, err);
    if (st) return st;
    if (!type && found && lin != 1.0) {
        m->rope_type = "linear";
        m->rope_factor = lin;
    }
    if (!type || strcmp(type->s, "none") == 0) return HP_OK;
    char t[64];
    if (strcmp(type->s, "linear") != 0 && strcmp(type->s, "yarn") != 0)
        return hp_err_set(err, HP_ERR_INPUT, "%s: llama.rope.scaling.type is '%s'; convert carries over 'linear', "
                          "'yarn' and 'none'.", hp_gguf_path(f), hp_escape(type->s, t, sizeof t));
    m->rope_type = strcmp(type->s, "linear") == 0 ? "linear" : "yarn";
    if ((st = need_float(f, "llama.rope.scaling.factor", &m->rope_factor, true, err))) return st;
    return need_int(f, "llama.rope.scaling.original_context_length", 1, MAX_SIZE, &m->rope_orig_ctx, false, err);
}

static hp_status read_meta(const hp_gguf_file *f, llama_meta *m, hp_err *err)
{
    const char *lab = hp_gguf_path(f);
    hp_status st;
    memset(m, 0, sizeof *m);
    int64_t experts = -1, key_len = -1, val_len = -1, rope_dims = -1, vocab_key = -1;
    if ((st = need_int(f, "llama.context_length", 1, MAX_SIZE, &m->ctx, true, err)) ||
        (st = need_int(f, "llama.embedding_length", 1, MAX_SIZE, &m->hidden, true, err)) ||
        (st = need_int(f, "llama.block_count", 1, MAX_LAYERS, &m->layers, true, err)) ||
        (st = need_int(f, "llama.feed_forward_length", 1, MAX_SIZE, &m->ffn, true, err)) ||
        (st = need_int(f, "llama.attention.head_count", 1, MAX_SIZE, &m->heads, true, err)) ||
        (st = need_int(f, "llama.attention.head_count_kv", 1, MAX_SIZE, &m->kv_heads, false, err)) ||
        (st = need_int(f, "llama.attention.key_length", 1, MAX_SIZE, &key_len, false, err)) ||
        (st = need_int(f, "llama.attention.value_length", 1, MAX_SIZE, &val_len, false, err)) ||
        (st = need_int(f, "llama.rope.dimension_count", 1, MAX_SIZE, &rope_dims, false, err)) ||
        (st = need_int(f, "llama.expert_count", 0, MAX_SIZE, &experts, false, err)) ||
        (st = need_int(f, "llama.vocab_size", 1, MAX_SIZE, &vocab_key, false, err)) ||
        (st = need_float(f, "llama.attention.layer_norm_rms_epsilon", &m->eps, true, err)))
        return st;
    m->rope_theta = 10000.0; /* llama.cpp's default when rope.freq_base is absent */
    if ((st = need_float(f, "llama.rope.freq_base", &m->rope_theta, false, err))) return st;
    if (experts > 0)
        return hp_err_set(err, HP_ERR_INPUT, "%s: llama.expert_count is %lld: a mixture-of-experts model in the llama "
                          "architecture (Mixtral style), which convert does not map; it converts dense llama models.",
                          lab, (long long)experts);
    if (m->kv_heads < 0) m->kv_heads = m->heads;
    if (m->heads % m->kv_heads)
        return hp_err_set(err, HP_ERR_INPUT, "%s: llama.attention.head_count %lld is not a multiple of head_count_kv "
                          "%lld.", lab, (long long)m->heads, (long long)m->kv_heads);
    if (key_len < 0 && m->hidden % m->heads)
        return hp_err_set(err, HP_ERR_INPUT, "%s: llama.embedding_length %lld is not a multiple of "
                          "attention.head_count %lld and attention.key_length is absent.", lab, (long long)m->hidden,
                          (long long)m->heads);
    m->head_dim = key_len > 0 ? key_len : m->hidden / m->heads;
    if (val_len > 0 && val_len != m->head_dim)
        return hp_err_set(err, HP_ERR_INPUT, "%s: llama.attention.value_length %lld differs from the head dim %lld; "
                          "transformers' llama has one head dim for keys and values.", lab, (long long)val_len,
                          (long long)m->head_dim);
    if (rope_dims > 0 && rope_dims != m->head_dim)
        return hp_err_set(err, HP_ERR_INPUT, "%s: llama.rope.dimension_count %lld differs from the head dim %lld: a "
                          "partial rotary embedding, which transformers' llama does not have.", lab,
                          (long long)rope_dims, (long long)m->head_dim);
    if (m->head_dim % 2)
        return hp_err_set(err, HP_ERR_INPUT, "%s: the head dim %lld is odd; the rotary embedding needs an even one.",
                          lab, (long long)m->head_dim);
    const hp_gguf_kv *tokens = NULL;
    if ((st = hp_gguf_get_array(f, "tokenizer.ggml.tokens", HP_GGUF_STRING, &tokens, err))) return st;
    if (!tokens)
        return hp_err_set(err, HP_ERR_INPUT, "%s: tokenizer.ggml.tokens is missing: the vocabulary size comes from it "
                          "(and the tokenizer).", lab);
    m->vocab = (int64_t)tokens->n;
    if (vocab_key > 0 && vocab_key != m->vocab)
        return hp_err_set(err, HP_ERR_INPUT, "%s: llama.vocab_size is %lld but tokenizer.ggml.tokens holds %lld "
                          "tokens.", lab, (long long)vocab_key, (long long)m->vocab);
    if ((st = need_int(f, "tokenizer.ggml.bos_token_id", 0, m->vocab - 1, &m->bos, false, err)) ||
        (st = need_int(f, "tokenizer.ggml.eos_token_id", 0, m->vocab - 1, &m->eos, false, err)) ||
        (st = need_int(f, "tokenizer.ggml.padding_token_id", 0, m->vocab - 1, &m->pad, false, err)))
        return st;
    return read_rope_scaling(f, m, err);
}

/* ---- config.json ---- */

/* The shortest decimal that reads back as the same f32 (GGUF stores eps and rope theta as FLOAT32: 1e-05, not
 * 9.999999747378752e-06). */
static double f32_decimal(double v)
{
    char b[64];
    for (int p = 1; p <= 9; p++) {
        snprintf(b, sizeof b, "%.*g", p, v);
        double r = strtod(b, NULL);
        if ((float)r == (float)v) return r;
    }
    return v;
}

static void set_int(json_t *o, const char *k, int64_t v) { json_object_set_new(o, k, json_integer((json_int_t)v)); }

static char *config_text(const llama_meta *m, bool tied, hp_dtype dtype)
{
    json_t *c = json_object(), *arch = json_array();
    json_array_append_new(arch, json_string("LlamaForCausalLM"));
    json_object_set_new(c, "architectures", arch);
    json_object_set_new(c, "model_type", json_string("llama"));
    set_int(c, "hidden_size", m->hidden);
    set_int(c, "intermediate_size", m->ffn);
    set_int(c, "num_hidden_layers", m->layers);
    set_int(c, "num_attention_heads", m->heads);
    set_int(c, "num_key_value_heads", m->kv_heads);
    set_int(c, "head_dim", m->head_dim);
    set_int(c, "vocab_size", m->vocab);
    set_int(c, "max_position_embeddings", m->ctx);
    json_object_set_new(c, "rms_norm_eps", json_real(f32_decimal(m->eps)));
    json_object_set_new(c, "rope_theta", json_real(f32_decimal(m->rope_theta)));
    if (m->rope_type) {
        json_t *r = json_pack("{s:s, s:f}", "rope_type", m->rope_type, "factor", f32_decimal(m->rope_factor));
        if (m->rope_orig_ctx > 0) set_int(r, "original_max_position_embeddings", m->rope_orig_ctx);
        json_object_set_new(c, "rope_scaling", r);
    }
    json_object_set_new(c, "hidden_act", json_string("silu"));
    json_object_set_new(c, "attention_bias", json_false());
    json_object_set_new(c, "mlp_bias", json_false());
    json_object_set_new(c, "tie_word_embeddings", json_boolean(tied));
    if (m->bos >= 0) set_int(c, "bos_token_id", m->bos);
    if (m->eos >= 0) set_int(c, "eos_token_id", m->eos);
    if (m->pad >= 0) set_int(c, "pad_token_id", m->pad);
    json_object_set_new(c, "torch_dtype", json_string(dtype == HP_DT_F32 ? "float32" : "bfloat16"));
    char *s = json_dumps(c, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(c);
    return s;
}

static char *generation_text(const llama_meta *m)
{
    json_t *c = json_object();
    if (m->bos >= 0) set_int(c, "bos_token_id", m->bos);
    if (m->eos >= 0) set_int(c, "eos_token_id", m->eos);
    if (m->pad >= 0) set_int(c, "pad_token_id", m->pad);
    char *s = json_dumps(c, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(c);
    return s;
}

/* ---- tensors ---- */

static int64_t dim_value(const llama_meta *m, dimk k)
{
    switch (k) {
    case D_HIDDEN: return m->hidden;
    case D_VOCAB: return m->vocab;
    case D_FFN: return m->ffn;
    case D_Q: return m->heads * m->head_dim;
    case D_KV: return m->kv_heads * m->head_dim;
    default: return 1;
    }
}

static void shape_str(int n, const int64_t *d, char *buf, size_t cap)
{
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int k = 0; k < n && o < cap; k++) o += (size_t)snprintf(buf + o, cap - o, "%s%lld", k ? ", " : "", (long long)d[k]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

/* Fills mt from GGUF tensor t under rule r (layer: its block index, -1 for the top-level tensors), checking the
 * type and the shape the metadata implies. */
static hp_status map_one(hp_gguf_model *g, const llama_meta *m, const hp_gguf_tensor *t, const name_rule *r,
                         int64_t layer, hp_gguf_mapped *mt, hp_err *err)
{
    const char *lab = hp_gguf_path(g->file);
    char a[96], have[96], want[96];
    mt->src = t;
    mt->name = layer < 0 ? r->hf : hp_arena_printf(&g->arena, "model.layers.%lld.%s", (long long)layer, r->hf);
    if (!mt->name) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    if (!hp_ggml_type_dequantizable(t->type))
        return hp_err_set(err, HP_ERR_INPUT, "%s: tensor '%s' is %s, which hyperpar cannot dequantize; it reads %s.",
                          lab, hp_escape(t->name, a, sizeof a), hp_ggml_type_name(t->type),
                          hp_ggml_dequantizable_list());
    mt->n_dims = t->n_dims;
    for (int d = 0; d < t->n_dims; d++) mt->shape[d] = t->ne[t->n_dims - 1 - d];
    int64_t exp[2] = {dim_value(m, r->shape[0]), dim_value(m, r->shape[1])};
    bool ok = t->n_dims == r->n_dims;
    for (int d = 0; ok && d < r->n_dims; d++) ok = mt->shape[d] == exp[d];
    if (!ok) {
        shape_str(mt->n_dims, mt->shape, have, sizeof have);
        shape_str(r->n_dims, exp, want, sizeof want);
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: tensor '%s' has shape %s (transformers' order, GGUF's reversed) but the metadata "
                          "(hidden %lld, %lld heads of %lld, %lld kv heads, feed-forward %lld, %lld tokens) make %s "
                          "%s.", lab, hp_escape(t->name, a, sizeof a), have, (long long)m->hidden, (long long)m->heads,
                          (long long)m->head_dim, (long long)m->kv_heads, (long long)m->ffn, (long long)m->vocab,
                          mt->name, want);
    }
    mt->permute_heads = r->permute == PERM_HEADS ? m->heads : r->permute == PERM_KV_HEADS ? m->kv_heads : 0;
    return HP_OK;
}

/* Which rule names t: *layer is its block (-1: top level); NULL when none does. */
static const name_rule *find_rule(const char *name, int64_t n_layers, int64_t *layer)
{
    *layer = -1;
    for (size_t i = 0; i < N_TOP; i++)
        if (strcmp(name, g_top[i].gguf) == 0) return &g_top[i];
    long long n;
    int used = -1;
    if (sscanf(name, "blk.%lld.%n", &n, &used) != 1 || used < 0 || n < 0 || n >= n_layers) return NULL;
    char canon[48]; /* "blk.007." is not blk.7: the number must be written plainly */
    snprintf(canon, sizeof canon, "blk.%lld.", n);
    if ((size_t)used != strlen(canon) || strncmp(name, canon, (size_t)used) != 0) return NULL;
    for (size_t i = 0; i < N_BLOCK; i++)
        if (strcmp(name + used, g_block[i].gguf) == 0) {
            *layer = n;
            return &g_block[i];
        }
    return NULL;
}

static hp_status unknown_tensor(const hp_gguf_file *f, const hp_gguf_tensor *t, const llama_meta *m, hp_err *err)
{
    char a[96];
    const char *lab = hp_gguf_path(f);
    if (strcmp(t->name, "rope_freqs.weight") == 0)
        return hp_err_set(err, HP_ERR_INPUT, "%s: tensor 'rope_freqs.weight' holds per-frequency rotary factors "
                          "(Llama 3.1 style rope scaling), whose parameters the metadata does not carry; convert "
                          "cannot write them as transformers' rope_scaling.", lab);
    return hp_err_set(err, HP_ERR_INPUT, "%s: tensor '%s' has no transformers name in the llama mapping "
                      "(token_embd, blk.N.attn_norm / attn_q / attn_k / attn_v / attn_output / ffn_norm / ffn_gate / "
                      "ffn_up / ffn_down for N < llama.block_count = %lld, output_norm, output); convert refuses what "
                      "it cannot place.", lab, hp_escape(t->name, a, sizeof a), (long long)m->layers);
}

/* Maps the tensor of slot s (the layers' N_BLOCK slots each, then the N_TOP top-level ones) or reports it
 * missing; an absent output.weight means tied embeddings. */
static hp_status place(hp_gguf_model *g, const llama_meta *m, const hp_gguf_tensor *const *slot, size_t s, hp_err *err)
{
    const size_t top = (size_t)m->layers * N_BLOCK;
    const name_rule *r = s >= top ? &g_top[s - top] : &g_block[s % N_BLOCK];
    const int64_t layer = s >= top ? -1 : (int64_t)(s / N_BLOCK);
    if (slot[s]) {
        hp_status st = map_one(g, m, slot[s], r, layer, &g->tensors[g->n_tensors], err);
        if (!st) g->n_tensors++;
        return st;
    }
    if (s == top + TOP_OUTPUT) {
        g->tied = true;
        return HP_OK;
    }
    char gg[96];
    if (layer >= 0) snprintf(gg, sizeof gg, "blk.%lld.%s", (long long)layer, r->gguf);
    else snprintf(gg, sizeof gg, "%s", r->gguf);
    return hp_err_set(err, HP_ERR_INPUT, "%s: tensor '%s' is missing; a llama model needs it (transformers' %s%s).",
                      hp_gguf_path(g->file), gg, layer >= 0 ? "model.layers.N." : "", r->hf);
}

/* Every GGUF tensor placed once; the expected ones present. Fills g->tensors in transformers' order: the
 * embedding, the layers, the final norm, lm_head. */
static hp_status map_tensors(hp_gguf_model *g, const llama_meta *m, hp_err *err)
{
    const hp_gguf_file *f = g->file;
    const size_t top = (size_t)m->layers * N_BLOCK, n_slots = top + N_TOP;
    const hp_gguf_tensor **slot = hp_calloc(n_slots, sizeof *slot);
    g->tensors = hp_calloc(n_slots, sizeof *g->tensors);
    if (!slot || !g->tensors) {
        free(slot);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    }
    hp_status st = HP_OK;
    for (size_t i = 0; i < hp_gguf_tensor_count(f) && !st; i++) {
        const hp_gguf_tensor *t = hp_gguf_tensor_at(f, i);
        int64_t layer;
        const name_rule *r = find_rule(t->name, m->layers, &layer);
        if (!r) st = unknown_tensor(f, t, m, err);
        else slot[layer < 0 ? top + (size_t)(r - g_top) : (size_t)layer * N_BLOCK + (size_t)(r - g_block)] = t;
    }
    if (!st) st = place(g, m, slot, top + TOP_EMBED, err);
    for (size_t s = 0; s < top && !st; s++) st = place(g, m, slot, s, err);
    if (!st) st = place(g, m, slot, top + TOP_NORM, err);
    if (!st) st = place(g, m, slot, top + TOP_OUTPUT, err);
    free(slot);
    return st;
}

/* The folder's parameter table, built as `hyperpar inspect` would from it: the family's rules check config.json
 * against the shapes once more. */
static hp_status build_model(hp_gguf_model *g, hp_dtype dtype, hp_err *err)
{
    hp_tensor_desc *d = hp_calloc(g->n_tensors, sizeof *d);
    if (!d) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < g->n_tensors; i++) {
        d[i].name = g->tensors[i].name;
        d[i].dtype = dtype;
        d[i].n_dims = g->tensors[i].n_dims;
        for (int k = 0; k < d[i].n_dims; k++) d[i].shape[k] = g->tensors[i].shape[k];
        d[i].trainable = true;
    }
    hp_status st = hp_model_from_tensors(&g->model, g->config_json, strlen(g->config_json), hp_gguf_path(g->file), d,
                                         g->n_tensors, err);
    free(d);
    return st;
}

hp_status hp_gguf_model_map(hp_gguf_model **out, const hp_gguf_file *f, hp_dtype dtype, hp_err *err)
{
    *out = NULL;
    const char *lab = hp_gguf_path(f);
    const hp_gguf_str *arch = NULL;
    hp_status st = hp_gguf_get_string(f, "general.architecture", &arch, err);
    if (st) return st;
    if (!arch)
        return hp_err_set(err, HP_ERR_INPUT, "%s: general.architecture is missing; it names the model family.", lab);
    char a[96];
    if (strcmp(arch->s, "llama") != 0)
        return hp_err_set(err, HP_ERR_INPUT, "%s: architecture '%s' is not supported; hyperpar converts GGUF models "
                          "of the llama architecture (LlamaForCausalLM).", lab, hp_escape(arch->s, a, sizeof a));
    if (dtype != HP_DT_BF16 && dtype != HP_DT_F32)
        return hp_err_set(err, HP_ERR_INPUT, "convert writes BF16 or F32 weights, not %s.", hp_dtype_name(dtype));
    llama_meta m;
    if ((st = read_meta(f, &m, err))) return st;
    hp_gguf_model *g = hp_calloc(1, sizeof *g);
    if (!g) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    hp_arena_init(&g->arena);
    g->file = f;
    g->arch = arch->s;
    st = map_tensors(g, &m, err);
    if (!st) {
        g->config_json = config_text(&m, g->tied, dtype);
        g->generation_config_json = generation_text(&m);
        if (!g->config_json || !g->generation_config_json) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    }
    if (!st) st = build_model(g, dtype, err);
    if (st) {
        hp_gguf_model_free(g);
        return st;
    }
    *out = g;
    return HP_OK;
}

void hp_gguf_model_free(hp_gguf_model *m)
{
    if (!m) return;
    hp_model_close(m->model);
    free(m->config_json);
    free(m->generation_config_json);
    free(m->tensors);
    hp_arena_free(&m->arena);
    free(m);
}
