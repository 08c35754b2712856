/*
 * verify.c — does config.json describe the weights beside it?
 *
 * A checkpoint folder carries two descriptions of one model: config.json (what transformers builds) and the
 * tensors (what it loads into it). When they disagree (`num_experts: 16` on 8-expert weights, 5 layers
 * declared and 2 present) transformers refuses to load, and every plan hyperpar would derive is wrong. So
 * for a known family the meta-mode synthesis of the same config, in the layout the weights use, is compared
 * with the tensors present:
 *
 *   a layer count or expert count that differs -> the headline (a whole layer or expert missing)
 *   present in both with different shapes     -> "shape"      (hidden size, expert count of a batched tensor)
 *   in the weights, layer >= num_hidden_layers -> "extra layer" (MTP layers num_nextn_predict_layers allow)
 *   in the weights, expert >= the expert count -> "extra expert"
 *
 * A single missing tensor of a present layer is left to the code that needs it (transformers only warns and
 * initialises it), and other extra tensors (FP8 scale_inv, rotary inv_freq buffers) are ignored, as
 * transformers ignores unexpected keys. Only what config.json states itself is compared: a config naming
 * just the family (no hidden_size, num_hidden_layers, expert count) says nothing to disagree with. A quantized checkpoint (quantization_config) stores packed tensors under other names and
 * shapes, so only its layer count is compared. The message leads with the headline count that differs
 * (layers, experts, hidden size), then lists the first differences, and says which side to fix.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/family.h"

#define MAX_LISTED 3

typedef struct verify {
    const hp_model *m;
    bool *seen;        /* [m->n_params]: a synthesised tensor of that name exists */
    size_t n_diff;
    hp_buf list;       /* the first MAX_LISTED differences */
    size_t n_synth;
} verify;

static void shape_text(int n_dims, const int64_t *shape, char *buf, size_t cap)
{
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < n_dims && o < cap; d++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

static void note(verify *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void note(verify *v, const char *fmt, ...)
{
    if (v->n_diff++ >= MAX_LISTED) return;
    char line[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    hp_buf_printf(&v->list, "%s%s", v->n_diff > 1 ? "; " : "", line);
}

static hp_status on_synth(void *ctx, const char *name, hp_dtype dt, int n_dims, const int64_t *shape,
                          const hp_synth_tag *tag, hp_err *err)
{
    (void)dt, (void)tag, (void)err;
    verify *v = ctx;
    v->n_synth++;
    const hp_param *p = hp_model_find_param(v->m, name);
    if (!p) return HP_OK; /* a missing tensor alone is transformers' "newly initialized" warning */
    v->seen[p - v->m->params] = true;
    bool same = p->n_dims == n_dims;
    for (int d = 0; same && d < n_dims; d++) same = p->shape[d] == shape[d];
    if (!same) {
        char a[96], b[96];
        shape_text(p->n_dims, p->shape, a, sizeof a);
        shape_text(n_dims, shape, b, sizeof b);
        note(v, "tensor '%s' is %s in the weights but %s by config.json", name, a, b);
    }
    return HP_OK;
}

/* The number after `key` in name ("model.layers.12.mlp" with key ".layers." -> 12), or -1. */
static int64_t index_after(const char *name, const char *key)
{
    const char *s = strstr(name, key);
    if (!s || !isdigit((unsigned char)s[strlen(key)])) return -1;
    return strtoll(s + strlen(key), NULL, 10);
}

/* Layers the weights hold: 1 + the largest model.layers.N below the MTP layers; 0 when none. */
static int64_t weight_layers(const hp_model *m, int64_t limit)
{
    int64_t n = 0;
    for (size_t i = 0; i < m->n_params; i++) {
        if (strncmp(m->params[i].name, "model.layers.", 13) != 0) continue;
        int64_t l = index_after(m->params[i].name, "model.layers.");
        if (l >= 0 && l < limit && l + 1 > n) n = l + 1;
    }
    return n;
}

/* The routed-expert count of the weights, from the first router tensor [E, H]; -1 when there is none. */
static int64_t weight_experts(const hp_model *m, char *how, size_t cap)
{
    const hp_family *f = m->family;
    char sfx[64];
    snprintf(sfx, sizeof sfx, ".%s.weight", f->router ? f->router : "gate");
    for (size_t i = 0; i < m->n_params; i++) {
        const hp_param *p = &m->params[i];
        size_t n = strlen(p->name), ls = strlen(sfx);
        if (p->n_dims == 2 && n > ls && strcmp(p->name + n - ls, sfx) == 0 && !strstr(p->name, "shared_expert")) {
            snprintf(how, cap, "router '%s' has %lld rows", p->name, (long long)p->shape[0]);
            return p->shape[0];
        }
    }
    int64_t n = -1;
    for (size_t i = 0; i < m->n_params; i++) {
        int64_t e = index_after(m->params[i].name, ".experts.");
        if (e + 1 > n) n = e + 1;
    }
    if (n >= 0) snprintf(how, cap, "counted from the per-expert tensors; there is no router");
    return n;
}

/* ---- the layer layout: which layers are sparse, which optional tensors exist, where the output head is ---- */

/* What makes a layer dense or sparse for this family, in config.json's words: "decoder_sparse_step 2". */
static void sparse_rule_text(const hp_model *m, char *buf, size_t cap)
{
    const hp_model_config *c = &m->cfg;
    switch (m->family->sparse) {
    case HP_SPARSE_STEP: {
        size_t o = (size_t)snprintf(buf, cap, "decoder_sparse_step %lld", (long long)c->decoder_sparse_step);
        for (int64_t i = 0; i < c->n_mlp_only_layers && o < cap; i++)
            o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : ", mlp_only_layers [",
                                  (long long)c->mlp_only_layers[i]);
        if (c->n_mlp_only_layers && o < cap) snprintf(buf + o, cap - o, "]");
        return;
    }
    case HP_SPARSE_AFTER_DENSE:
        snprintf(buf, cap, "first_k_dense_replace %lld", (long long)c->first_k_dense_replace);
        return;
    case HP_SPARSE_ALL: snprintf(buf, cap, "every %s layer is sparse", hp_family_name(m->family)); return;
    case HP_SPARSE_NONE: break;
    }
    snprintf(buf, cap, "a dense family");
}

/* Every layer below num_hidden_layers that the weights hold is sparse (holds routed experts) exactly when the
 * family's rule says so (hp__family_layer_sparse, the one function the planner, runtime and cost ask). The
 * names are walked in sorted order, where each layer's tensors are contiguous; differences are reported from
 * the lowest layer up. */
static void check_sparse_layers(verify *v)
{
    const hp_model *m = v->m;
    const int64_t L = m->cfg.num_hidden_layers;
    int64_t bad[MAX_LISTED];
    const char *example[MAX_LISTED];
    bool has_bad[MAX_LISTED];
    size_t n_bad = 0, n_all = 0;
    for (size_t i = 0; i < m->n_params;) {
        const char *name = m->params[m->name_index[i]].name;
        int64_t l = strncmp(name, "model.layers.", 13) == 0 ? index_after(name, "model.layers.") : -1;
        const char *expert = NULL;
        size_t j = i;
        for (; j < m->n_params; j++) {
            const char *n = m->params[m->name_index[j]].name;
            if (l < 0 || index_after(n, "model.layers.") != l || strncmp(n, "model.layers.", 13) != 0) break;
            if (!expert && strstr(n, ".experts.")) expert = n;
        }
        if (j == i) j = i + 1;
        i = j;
        if (l < 0 || l >= L) continue;
        bool want = hp__family_layer_sparse(m->family, &m->cfg, l), have = expert != NULL;
        if (want == have) continue;
        n_all++;
        /* Keep the MAX_LISTED lowest layers, sorted. */
        size_t k = n_bad < MAX_LISTED ? n_bad++ : MAX_LISTED;
        if (k == MAX_LISTED && l > bad[MAX_LISTED - 1]) continue;
        if (k == MAX_LISTED) k = MAX_LISTED - 1;
        for (; k > 0 && bad[k - 1] > l; k--) {
            bad[k] = bad[k - 1], example[k] = example[k - 1], has_bad[k] = has_bad[k - 1];
        }
        bad[k] = l, example[k] = expert, has_bad[k] = have;
    }
    char rule[256];
    if (n_all) sparse_rule_text(m, rule, sizeof rule);
    for (size_t k = 0; k < n_bad; k++)
        if (has_bad[k])
            note(v, "layer %lld is dense by config.json (%s) but the weights hold experts for it ('%s')",
                 (long long)bad[k], rule, example[k]);
        else
            note(v, "layer %lld is sparse by config.json (%s) but the weights hold no experts for it",
                 (long long)bad[k], rule);
    v->n_diff += n_all - n_bad; /* counted, not listed */
}

static bool config_has_flag(const hp_model_config *c, const char *key)
{
    for (int i = 0; i < c->n_flags; i++)
        if (strcmp(c->flags[i].key, key) == 0) return true;
    return false;
}

/* The first tensor of the decoder stack whose name ends with suffix, or NULL. */
static const char *layer_tensor(const hp_model *m, const char *suffix)
{
    size_t ls = strlen(suffix);
    for (size_t i = 0; i < m->n_params; i++) {
        const char *n = m->params[i].name;
        size_t ln = strlen(n);
        if (strncmp(n, "model.layers.", 13) == 0 && ln > ls && strcmp(n + ln - ls, suffix) == 0) return n;
    }
    return NULL;
}

/* One optional tensor kind: the family's rule for it (family.h hp_opt_rule) and a name suffix that finds it. */
typedef struct optional {
    const hp_opt_rule *r;
    const char *suffix;
    bool applies; /* the model has the module that would hold it */
} optional;

static bool same_rule(const hp_opt_rule *a, const hp_opt_rule *b)
{
    return a == b || (a->kind == HP_OPT_CONFIG && b->kind == HP_OPT_CONFIG && !strcmp(a->key, b->key));
}

/* An optional tensor kind is in the weights exactly when its rule, read from config.json, says so. Kinds
 * under one rule (attention_bias: q, k, v and o biases) give one difference, for the first kind that differs. */
static void check_optional(verify *v, const optional *o, size_t n)
{
    const hp_model *m = v->m;
    bool done[16] = {false};
    for (size_t i = 0; i < n && i < 16; i++) {
        if (done[i]) continue;
        const hp_opt_rule *r = o[i].r;
        bool want = r->kind == HP_OPT_ALWAYS || (r->kind == HP_OPT_CONFIG && hp__config_bool(&m->cfg, r->key, r->dflt));
        const char *first_missing = NULL, *first_extra = NULL;
        for (size_t j = i; j < n && j < 16; j++) {
            if (done[j] || !same_rule(r, o[j].r)) continue;
            done[j] = true;
            if (!o[j].applies) continue;
            const char *have = layer_tensor(m, o[j].suffix);
            if (want && !have && !first_missing) first_missing = o[j].suffix;
            if (!want && have && !first_extra) first_extra = have;
        }
        if (!first_missing && !first_extra) continue;
        char why[200];
        if (r->kind == HP_OPT_CONFIG)
            snprintf(why, sizeof why, "%s is %s%s", r->key, want ? "true" : "false",
                     config_has_flag(&m->cfg, r->key) ? "" : " (its default: config.json leaves it out)");
        else
            snprintf(why, sizeof why, "a %s model %s has them", hp_family_name(m->family), want ? "always" : "never");
        if (first_missing) note(v, "%s, but the weights hold no '*%s' tensor", why, first_missing);
        else note(v, "the weights hold '%s', but %s", first_extra, why);
    }
}

/* Which layers are sparse, the optional attention and MLP tensors, and the output head against
 * tie_word_embeddings: the differences a shape comparison cannot see (a missing tensor alone is allowed). */
static void check_layout(verify *v)
{
    const hp_model *m = v->m;
    const hp_family *f = m->family;
    const hp_model_config *c = &m->cfg;
    if (f->moe) check_sparse_layers(v);
    if (c->quantized) return; /* packed tensors under other names: only the layer structure is compared */
    bool any_layer = layer_tensor(m, ".weight") != NULL;
    bool any_dense = false;
    for (int64_t l = 0; l < c->num_hidden_layers && !any_dense; l++) any_dense = !hp__family_layer_sparse(f, c, l);
    const bool mla = f->attn == HP_ATTN_MLA;
    static const hp_opt_rule always = {HP_OPT_ALWAYS, NULL, true}, never = {HP_OPT_NEVER, NULL, false};
    const optional kinds[] = {
        {&f->qkv_bias, mla ? ".self_attn.q_a_proj.bias" : ".self_attn.q_proj.bias", any_layer && (!mla || c->q_lora_rank > 0)},
        {&f->qkv_bias, mla ? ".self_attn.kv_a_proj_with_mqa.bias" : ".self_attn.k_proj.bias", any_layer},
        {&f->qkv_bias, mla ? ".self_attn.kv_a_proj_with_mqa.bias" : ".self_attn.v_proj.bias", any_layer},
        {&f->o_bias, ".self_attn.o_proj.bias", any_layer},
        {&f->qk_norm, ".self_attn.q_norm.weight", any_layer && !mla}, /* MLA's q/k norms are not optional */
        {&f->mlp_bias, ".mlp.gate_proj.bias", any_layer && any_dense},
        {f->attn_sinks ? &always : &never, ".self_attn.sinks", any_layer},
    };
    check_optional(v, kinds, sizeof kinds / sizeof *kinds);
    bool head = hp_model_find_param(m, "lm_head.weight") != NULL;
    if (c->tie_word_embeddings && head)
        note(v, "tie_word_embeddings is true (lm_head shares model.embed_tokens.weight) but the weights hold a "
             "separate lm_head.weight");
    else if (!c->tie_word_embeddings && !head && hp_model_find_param(m, "model.embed_tokens.weight"))
        note(v, "tie_word_embeddings is false%s but the weights hold no lm_head.weight",
             config_has_flag(c, "tie_word_embeddings") ? "" : " (its default: config.json leaves it out)");
}

hp_status hp__model_check_weights(const hp_model *m, const char *cfg_label, hp_err *err)
{
    const hp_model_config *c = &m->cfg;
    const hp_family *f = m->family;
    if (!f || (!c->explicit_shape && !c->explicit_experts)) return HP_OK;
    const int64_t L = c->num_hidden_layers;
    const int64_t mtp = c->n_nextn_layers > 0 ? c->n_nextn_layers : 0;
    /* Layers beyond the stack and its MTP layers, and the stack's own count. */
    const int64_t held = weight_layers(m, INT64_MAX), held_stack = weight_layers(m, L > 0 ? L : INT64_MAX);
    hp_buf head;
    hp_buf_init(&head);
    if (c->explicit_shape && L > 0 && (held_stack < L || held > L + mtp)) {
        hp_buf_printf(&head, "it says num_hidden_layers %lld%s but the weights hold ", (long long)L,
                      mtp ? " (plus num_nextn_predict_layers)" : "");
        if (held == 0) hp_buf_puts(&head, "no model.layers.N tensors");
        else hp_buf_printf(&head, "layers 0..%lld", (long long)held - 1);
    }

    verify v = {.m = m};
    hp_buf_init(&v.list);
    hp_status st = HP_OK;
    if (c->explicit_shape && L > 0) check_layout(&v);
    if (c->explicit_shape && !c->quantized && L > 0 && c->hidden_size > 0) {
        v.seen = calloc(m->n_params ? m->n_params : 1, sizeof *v.seen);
        if (!v.seen) {
            hp_buf_free(&head);
            hp_buf_free(&v.list);
            return hp_err_set(err, HP_ERR_NOMEM, "out of memory comparing config.json with the weights");
        }
        size_t n_layout = v.n_diff, len_layout = v.list.len;
        hp_err serr;
        /* A config meta mode could not synthesise (a size the family needs is absent) is not compared; what
         * the layout check found stays. */
        if (hp__synth_params(f, c, m->layout, on_synth, &v, &serr) != HP_OK) {
            v.n_diff = n_layout;
            v.list.len = len_layout;
            if (v.list.data) v.list.data[len_layout] = '\0';
        }
        for (size_t i = 0; i < m->n_params && v.n_synth; i++) {
            if (v.seen[i]) continue;
            const char *name = m->params[i].name;
            int64_t l = index_after(name, "model.layers.");
            int64_t e = index_after(name, ".experts.");
            if (l >= L + mtp)
                note(&v, "tensor '%s' is in layer %lld, beyond num_hidden_layers %lld", name,
                     (long long)l, (long long)L);
            else if (e >= 0 && e >= c->n_experts && l >= 0 && l < L)
                note(&v, "tensor '%s' is expert %lld, beyond the %lld routed experts config.json declares", name,
                     (long long)e, (long long)c->n_experts);
        }
        free(v.seen);
    }
    char how[400];
    int64_t E_w = f->moe ? weight_experts(m, how, sizeof how) : -1;
    if (c->explicit_experts && E_w >= 0 && c->n_experts > 0 && E_w != c->n_experts)
        hp_buf_printf(&head, "%sit says %lld routed experts (%s) but the weights hold %lld (%s)",
                      head.len ? "; " : "", (long long)c->n_experts, f->experts_key, (long long)E_w, how);
    const hp_param *emb = hp_model_find_param(m, "model.embed_tokens.weight");
    if (c->explicit_shape && emb && emb->n_dims == 2 && c->hidden_size > 0 && emb->shape[1] != c->hidden_size)
        hp_buf_printf(&head, "%sit says hidden_size %lld but model.embed_tokens.weight is [%lld, %lld]",
                      head.len ? "; " : "", (long long)c->hidden_size, (long long)emb->shape[0],
                      (long long)emb->shape[1]);

    if (head.len || v.n_diff) {
        hp_buf msg;
        hp_buf_init(&msg);
        if (head.len) hp_buf_printf(&msg, ": %s", head.data);
        if (v.n_diff)
            hp_buf_printf(&msg, "%s (%zu in all): %s", head.len ? ". First differences" : ": first differences",
                          v.n_diff, v.list.data);
        if (head.oom || v.list.oom || msg.oom)
            st = hp_err_set(err, HP_ERR_NOMEM, "out of memory comparing config.json with the weights");
        else
            st = hp_err_set(err, HP_ERR_INPUT,
                            "%s does not describe the weights beside it (%s)%s. Fix config.json to match the weights "
                            "(or use the weights it was written for): hyperpar will not plan or shard a model whose "
                            "two descriptions disagree",
                            cfg_label, m->ckpt ? hp_ckpt_source(m->ckpt) : "the model's parameters", msg.data);
        hp_buf_free(&msg);
    }
    hp_buf_free(&head);
    hp_buf_free(&v.list);
    return st;
}
