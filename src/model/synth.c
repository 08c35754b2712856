/*
 * synth.c — meta mode: the parameter table of a known family from config.json alone.
 *
 * Shapes follow spec/hf_reference.md §1 for each family record of families.c:
 *
 *   model.embed_tokens.weight                 [V, H]
 *   model.layers.{i}.self_attn.*              GQA q/k/v/o (+ biases, q/k norms, sinks) or MLA
 *   model.layers.{i}.mlp.*                    dense gate/up/down [I, H] / [H, I], or the sparse block:
 *       router [E, H] (+ bias | e_score_correction_bias), experts per-expert or batched, shared expert
 *   model.layers.{i}.{input,post_attention}_layernorm.weight [H]
 *   model.norm.weight [H], lm_head.weight [V, H] (absent when tied)
 *
 * The emitter is called once per parameter; element counts are overflow-checked by the caller.
 */
#include "model/family.h"

#include <stdio.h>
#include <string.h>

typedef struct synth {
    const hp_family *f;
    const hp_model_config *c;
    hp_dtype dt;
    hp_synth_emit_fn emit;
    void *ctx;
    hp_err *err;
    char name[512];
} synth;

static hp_status put(synth *s, const hp_synth_tag *tag, hp_dtype dt, int n_dims, int64_t d0, int64_t d1,
                     int64_t d2, const char *fmt, ...) __attribute__((format(printf, 8, 9)));

static hp_status put(synth *s, const hp_synth_tag *tag, hp_dtype dt, int n_dims, int64_t d0, int64_t d1,
                     int64_t d2, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->name, sizeof s->name, fmt, ap);
    va_end(ap);
    int64_t shape[3] = {d0, d1, d2};
    static const hp_synth_tag none = {HP_TAG_NONE, -1, -1, false};
    return s->emit(s->ctx, s->name, dt, n_dims, shape, tag ? tag : &none, s->err);
}

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        hp_status st_ = (expr);                                                                    \
        if (st_ != HP_OK) return st_;                                                              \
    } while (0)

/* Linear weight [out, in] and its optional bias [out]. */
static hp_status linear(synth *s, const char *prefix, const char *name, int64_t out, int64_t in, bool bias)
{
    TRY(put(s, NULL, s->dt, 2, out, in, 0, "%s.%s.weight", prefix, name));
    if (bias) TRY(put(s, NULL, s->dt, 1, out, 0, 0, "%s.%s.bias", prefix, name));
    return HP_OK;
}

static bool opt(const hp_opt_rule *r, const hp_model_config *c, bool config_value)
{
    (void)c;
    switch (r->kind) {
    case HP_OPT_NEVER: return false;
    case HP_OPT_ALWAYS: return true;
    case HP_OPT_CONFIG: return config_value;
    }
    return false;
}

/* The config booleans the opt rules refer to are resolved by config.c into these flags. */
typedef struct flags {
    bool qkv_bias, o_bias, qk_norm, mlp_bias;
} flags;

static hp_status attention(synth *s, const char *p, const flags *fl)
{
    const hp_model_config *c = s->c;
    const int64_t H = c->hidden_size, nH = c->num_attention_heads, nKV = c->num_key_value_heads;
    const int64_t hd = c->head_dim;
    if (s->f->attn == HP_ATTN_MLA) {
        const int64_t qk_head = c->qk_nope_head_dim + c->qk_rope_head_dim;
        if (c->q_lora_rank > 0) {
            TRY(linear(s, p, "q_a_proj", c->q_lora_rank, H, fl->qkv_bias));
            TRY(put(s, NULL, s->dt, 1, c->q_lora_rank, 0, 0, "%s.q_a_layernorm.weight", p));
            TRY(linear(s, p, "q_b_proj", nH * qk_head, c->q_lora_rank, false));
        } else {
            TRY(linear(s, p, "q_proj", nH * qk_head, H, false));
        }
        TRY(linear(s, p, "kv_a_proj_with_mqa", c->kv_lora_rank + c->qk_rope_head_dim, H, fl->qkv_bias));
        TRY(put(s, NULL, s->dt, 1, c->kv_lora_rank, 0, 0, "%s.kv_a_layernorm.weight", p));
        TRY(linear(s, p, "kv_b_proj", nH * (c->qk_nope_head_dim + c->v_head_dim), c->kv_lora_rank, false));
        TRY(linear(s, p, "o_proj", H, nH * c->v_head_dim, fl->o_bias));
        return HP_OK;
    }
    TRY(linear(s, p, "q_proj", nH * hd, H, fl->qkv_bias));
    TRY(linear(s, p, "k_proj", nKV * hd, H, fl->qkv_bias));
    TRY(linear(s, p, "v_proj", nKV * hd, H, fl->qkv_bias));
    TRY(linear(s, p, "o_proj", H, nH * hd, fl->o_bias));
    if (fl->qk_norm) {
        TRY(put(s, NULL, s->dt, 1, hd, 0, 0, "%s.q_norm.weight", p));
        TRY(put(s, NULL, s->dt, 1, hd, 0, 0, "%s.k_norm.weight", p));
    }
    if (s->f->attn_sinks) TRY(put(s, NULL, s->dt, 1, nH, 0, 0, "%s.sinks", p));
    return HP_OK;
}

static hp_status swiglu(synth *s, const char *p, int64_t inter, bool bias)
{
    const int64_t H = s->c->hidden_size;
    TRY(linear(s, p, "gate_proj", inter, H, bias));
    TRY(linear(s, p, "up_proj", inter, H, bias));
    TRY(linear(s, p, "down_proj", H, inter, bias));
    return HP_OK;
}

static hp_status sparse_block(synth *s, int64_t layer, hp_expert_layout layout)
{
    const hp_family *f = s->f;
    const hp_model_config *c = s->c;
    const int64_t H = c->hidden_size, E = c->n_experts, mI = c->moe_intermediate_size;
    const bool per_expert = layout == HP_LAYOUT_PER_EXPERT && f->has_per_expert_layout;
    char p[160];
    snprintf(p, sizeof p, "model.layers.%lld.%s", (long long)layer, per_expert ? f->per_expert_block : "mlp");

    TRY(put(s, NULL, s->dt, 2, E, H, 0, "%s.%s.weight", p, f->router));
    if (f->router_bias) TRY(put(s, NULL, s->dt, 1, E, 0, 0, "%s.%s.bias", p, f->router));
    if (f->correction_bias) TRY(put(s, NULL, HP_DT_F32, 1, E, 0, 0, "%s.%s.e_score_correction_bias", p, f->router));

    if (per_expert) {
        for (int64_t e = 0; e < E; e++) {
            hp_synth_tag g = {HP_TAG_GATE, layer, e, false}, u = {HP_TAG_UP, layer, e, false},
                         d = {HP_TAG_DOWN, layer, e, false};
            TRY(put(s, &g, s->dt, 2, mI, H, 0, "%s.experts.%lld.%s.weight", p, (long long)e, f->expert_proj[0]));
            TRY(put(s, &u, s->dt, 2, mI, H, 0, "%s.experts.%lld.%s.weight", p, (long long)e, f->expert_proj[1]));
            TRY(put(s, &d, s->dt, 2, H, mI, 0, "%s.experts.%lld.%s.weight", p, (long long)e, f->expert_proj[2]));
        }
    } else if (f->experts == HP_EXPERTS_GPTOSS) {
        hp_synth_tag gu = {HP_TAG_GATE_UP, layer, -1, true}, d = {HP_TAG_DOWN, layer, -1, true};
        TRY(put(s, &gu, s->dt, 3, E, H, 2 * mI, "%s.experts.gate_up_proj", p));
        TRY(put(s, NULL, s->dt, 2, E, 2 * mI, 0, "%s.experts.gate_up_proj_bias", p));
        TRY(put(s, &d, s->dt, 3, E, mI, H, "%s.experts.down_proj", p));
        TRY(put(s, NULL, s->dt, 2, E, H, 0, "%s.experts.down_proj_bias", p));
    } else {
        hp_synth_tag gu = {HP_TAG_GATE_UP, layer, -1, false}, d = {HP_TAG_DOWN, layer, -1, false};
        TRY(put(s, &gu, s->dt, 3, E, 2 * mI, H, "%s.experts.gate_up_proj", p));
        TRY(put(s, &d, s->dt, 3, E, H, mI, "%s.experts.down_proj", p));
    }

    char q[192];
    if (f->shared == HP_SHARED_GATED && c->shared_intermediate_size > 0) {
        snprintf(q, sizeof q, "%s.shared_expert", p);
        TRY(swiglu(s, q, c->shared_intermediate_size, false));
        TRY(put(s, NULL, s->dt, 2, 1, H, 0, "%s.shared_expert_gate.weight", p));
    } else if (f->shared == HP_SHARED_MULTI && c->shared_intermediate_size > 0) {
        snprintf(q, sizeof q, "%s.shared_experts", p);
        TRY(swiglu(s, q, c->shared_intermediate_size, false));
    }
    return HP_OK;
}

hp_status hp__synth_params(const hp_family *f, const hp_model_config *c, hp_expert_layout layout,
                           hp_synth_emit_fn emit, void *ctx, hp_err *err)
{
    synth s = {.f = f, .c = c, .dt = c->dtype, .emit = emit, .ctx = ctx, .err = err};
    flags fl = {
        .qkv_bias = opt(&f->qkv_bias, c, f->qkv_bias.key ? hp__config_bool(c, f->qkv_bias.key, f->qkv_bias.dflt) : false),
        .o_bias = opt(&f->o_bias, c, f->o_bias.key ? hp__config_bool(c, f->o_bias.key, f->o_bias.dflt) : false),
        .qk_norm = opt(&f->qk_norm, c, f->qk_norm.key ? hp__config_bool(c, f->qk_norm.key, f->qk_norm.dflt) : false),
        .mlp_bias = opt(&f->mlp_bias, c, f->mlp_bias.key ? hp__config_bool(c, f->mlp_bias.key, f->mlp_bias.dflt) : false),
    };
    const int64_t H = c->hidden_size, V = c->vocab_size;

    TRY(put(&s, NULL, s.dt, 2, V, H, 0, "model.embed_tokens.weight"));
    for (int64_t i = 0; i < c->num_hidden_layers; i++) {
        char p[128];
        snprintf(p, sizeof p, "model.layers.%lld.self_attn", (long long)i);
        TRY(attention(&s, p, &fl));
        if (hp__family_layer_sparse(f, c, i)) {
            TRY(sparse_block(&s, i, layout));
        } else {
            snprintf(p, sizeof p, "model.layers.%lld.mlp", (long long)i);
            TRY(swiglu(&s, p, c->intermediate_size, fl.mlp_bias));
        }
        TRY(put(&s, NULL, s.dt, 1, H, 0, 0, "model.layers.%lld.input_layernorm.weight", (long long)i));
        TRY(put(&s, NULL, s.dt, 1, H, 0, 0, "model.layers.%lld.post_attention_layernorm.weight", (long long)i));
    }
    TRY(put(&s, NULL, s.dt, 1, H, 0, 0, "model.norm.weight"));
    if (!c->tie_word_embeddings) TRY(put(&s, NULL, s.dt, 2, V, H, 0, "lm_head.weight"));
    return HP_OK;
}
