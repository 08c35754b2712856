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
    if (c->explicit_shape && !c->quantized && L > 0 && c->hidden_size > 0) {
        v.seen = calloc(m->n_params ? m->n_params : 1, sizeof *v.seen);
        if (!v.seen) {
            hp_buf_free(&head);
            hp_buf_free(&v.list);
            return hp_err_set(err, HP_ERR_NOMEM, "out of memory comparing config.json with the weights");
        }
        hp_err serr;
        /* A config meta mode could not synthesise (a size the family needs is absent) is not compared. */
        if (hp__synth_params(f, c, m->layout, on_synth, &v, &serr) != HP_OK) v.n_diff = 0;
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
                            cfg_label, hp_ckpt_source(m->ckpt), msg.data);
        hp_buf_free(&msg);
    }
    hp_buf_free(&head);
    hp_buf_free(&v.list);
    return st;
}
