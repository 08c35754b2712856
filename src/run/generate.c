/*
 * generate.c — text generation over a runner (docs/generate.md): the prompts' rows run forward under the plan,
 * rank 0 picks each row's next token from the last position's logits (greedy, or sampled as transformers' warpers
 * filter: temperature, then top-k, then top-p, from a seeded splitmix64), every rank receives the tokens, and the
 * rows grow until each has produced an end-of-sequence id or the count is reached.
 */
#include "run/runner_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyperpar/data.h"
#include "io/json.h"
#include "model/model_int.h"

void hp_generate_opts_default(hp_generate_opts *o)
{
    *o = (hp_generate_opts){.max_new = 32, .temperature = 0.0, .top_k = 0, .top_p = 1.0, .seed = 0};
}

hp_status hp_generate_default_eos(const hp_model *m, hp_generate_opts *o, hp_err *err)
{
    o->n_eos = m->cfg.n_eos > 0 ? m->cfg.n_eos : 0;
    memcpy(o->eos, m->cfg.eos_token_id, sizeof o->eos);
    char dir[4096], path[4200];
    hp__model_dir(m, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (access(path, F_OK) != 0) { /* none there: config.json's */
        if (m->cfg.n_eos < 0)
            return hp_err_set(err, HP_ERR_INPUT, "%s: config.json's eos_token_id is not an id or a list of at most 8 "
                              "ids (give --eos)", dir);
        return HP_OK;
    }
    char *text = NULL;
    size_t len = 0;
    json_t *root = NULL;
    hp_status st = hp__read_file(path, 1 << 20, &text, &len, err);
    if (st == HP_OK) st = hp__json_parse(text, len, path, &root, err);
    free(text);
    if (st != HP_OK) return st;
    const json_t *v = json_object_get(root, "eos_token_id");
    int n = 0;
    int64_t ids[8];
    if (json_is_integer(v)) {
        if (json_integer_value(v) >= 0) ids[n++] = json_integer_value(v);
    } else if (json_is_array(v) && json_array_size(v) <= 8) {
        for (size_t i = 0; i < json_array_size(v) && st == HP_OK; i++) {
            const json_t *e = json_array_get(v, i);
            if (!json_is_integer(e)) st = hp_err_set(err, HP_ERR_INPUT, "%s: eos_token_id[%zu] is not an id", path, i);
            else if (json_integer_value(e) >= 0) ids[n++] = json_integer_value(e);
        }
    } else if (v && !json_is_null(v)) {
        st = hp_err_set(err, HP_ERR_INPUT, "%s: eos_token_id is not an id or a list of at most 8 ids", path);
    }
    bool given = v && !json_is_null(v);
    json_decref(root);
    if (st == HP_OK && given) {
        o->n_eos = n;
        memcpy(o->eos, ids, (size_t)n * sizeof *ids);
    } else if (st == HP_OK && m->cfg.n_eos < 0) {
        st = hp_err_set(err, HP_ERR_INPUT, "%s: config.json's eos_token_id is not an id or a list of at most 8 ids "
                        "(give --eos)", dir);
    }
    return st;
}

/* The greedy pick: the first index of the largest logit (torch.argmax's). */
static int64_t argmax(const float *x, int64_t V)
{
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
        if (x[v] > x[best]) best = v;
    return best;
}

typedef struct cand {
    float logit;
    int64_t id;
} cand;

static int by_logit_desc(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* A sampled pick (transformers' order of warpers): logits / temperature; top-k keeps every logit at least the
 * k-th largest; top-p drops, from the smallest up, the tokens whose cumulative probability stays within 1 − p
 * (the largest always kept); then one draw from the softmax of what is left. c: V entries of scratch. */
static int64_t sample(const float *x, int64_t V, const hp_generate_opts *o, uint64_t *rng, cand *c)
{
    for (int64_t v = 0; v < V; v++) c[v] = (cand){(float)(x[v] / o->temperature), v};
    qsort(c, (size_t)V, sizeof *c, by_logit_desc);
    int64_t n = V;
    if (o->top_k > 0 && o->top_k < V) {
        float kth = c[o->top_k - 1].logit;
        for (n = o->top_k; n < V && c[n].logit >= kth; n++) {
        }
    }
    double mx = c[0].logit, z = 0;
    for (int64_t i = 0; i < n; i++) z += exp((double)c[i].logit - mx);
    if (o->top_p < 1.0) {
        /* ascending cumulative probability: drop while it stays <= 1 - p */
        double cum = 0;
        int64_t keep = n;
        for (int64_t i = n - 1; i > 0; i--) {
            cum += exp((double)c[i].logit - mx) / z;
            if (cum > 1.0 - o->top_p) break;
            keep = i;
        }
        n = keep;
        z = 0;
        for (int64_t i = 0; i < n; i++) z += exp((double)c[i].logit - mx);
    }
    double u = (double)(hp_splitmix64(rng) >> 11) * 0x1.0p-53 * z, acc = 0;
    for (int64_t i = 0; i < n; i++) {
        acc += exp((double)c[i].logit - mx);
        if (u < acc) return c[i].id;
    }
    return c[n - 1].id;
}

static bool is_eos(const hp_generate_opts *o, int64_t t)
{
    for (int i = 0; i < o->n_eos; i++)
        if (o->eos[i] == t) return true;
    return false;
}

/* Rank 0's picks for every row from the logits [B, n, V]: each row's last position. A finished row keeps its last
 * pick (its eos; never read). */
static void pick(const hp_generate_opts *o, const float *logits, int64_t B, int64_t n, int64_t V, const bool *done,
                 uint64_t *rng, cand *c, int64_t *next)
{
    for (int64_t b = 0; b < B; b++) {
        const float *x = logits + ((b * n) + (n - 1)) * V;
        if (!done[b]) next[b] = o->temperature > 0 ? sample(x, V, o, rng, c) : argmax(x, V);
    }
}

/* The step's forward: with a KV cache, the positions not yet cached (the prompts, then each row's last pick) at
 * their position; without, the whole rows. *n: the positions it ran. */
static hp_status step_forward(hp_runner *r, const int64_t *ids, int64_t B, int64_t S, int64_t cached, int64_t *feed,
                              hp_run_output *ro, int64_t *n, hp_err *err)
{
    if (cached < 0) {
        *n = S;
        return hp_runner_forward(r, ids, B, S, ro, err);
    }
    *n = S - cached;
    for (int64_t b = 0; b < B; b++) memcpy(feed + b * *n, ids + b * S + cached, (size_t)*n * sizeof *feed);
    return hp_runner_forward_at(r, feed, B, *n, cached, ro, err);
}

hp_status hp_generate(hp_runner *r, const int64_t *prompt, int64_t B, int64_t S0, const hp_generate_opts *o,
                      hp_generate_token_fn fn, void *ctx, int64_t **out, int64_t *out_len, hp_err *err)
{
    *out = NULL, *out_len = 0;
    const hp_comm *w = r->pipe.all; /* every rank (x.world is a pipeline stage's) */
    bool root = hp_comm_rank(w) == 0;
    /* the loop's length and its ends are rank 0's on every rank: ranks given others cannot hang the steps */
    hp_generate_opts o0 = *o;
    hp_status bs = hp_comm_bcast(w, &o0, sizeof o0, 0, err);
    if (bs != HP_OK) return bs;
    o = &o0;
    int64_t V = r->m->cfg.vocab_size, Smax = S0 + o->max_new;
    if (B < 1 || S0 < 1 || o->max_new < 0)
        return hp_err_set(err, HP_ERR_INPUT, "generate: %lld prompts of %lld tokens, %lld new", (long long)B,
                          (long long)S0, (long long)o->max_new);
    if (o->temperature < 0 || !(o->top_p > 0 && o->top_p <= 1) || o->top_k < 0)
        return hp_err_set(err, HP_ERR_INPUT, "generate: temperature %g (>= 0), top-k %lld (>= 0) and top-p %g "
                          "(in (0, 1]) out of range", o->temperature, (long long)o->top_k, o->top_p);
    int64_t *ids = calloc((size_t)(B * Smax) + 1, sizeof *ids), *nxt = calloc((size_t)B + 1, sizeof *nxt);
    bool *done = calloc((size_t)B + 1, sizeof *done);
    cand *c = root && o->temperature > 0 ? malloc((size_t)V * sizeof *c) : NULL;
    hp_status st = ids && nxt && done && (!root || o->temperature <= 0 || c)
                       ? HP_OK
                       : hp_err_set(err, HP_ERR_NOMEM, "out of memory for generation");
    for (int64_t b = 0; st == HP_OK && b < B; b++) memcpy(ids + b * S0, prompt + b * S0, (size_t)S0 * sizeof *ids);
    /* with a cache long enough for every row, each step feeds the new positions only */
    bool use_kv = r->o.kv_cache >= Smax;
    int64_t *feed = use_kv ? calloc((size_t)(B * S0) + 1, sizeof *feed) : NULL;
    if (st == HP_OK && use_kv && !feed) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory for generation");
    uint64_t rng = o->seed;
    int64_t S = S0, cached = use_kv ? 0 : -1, n = 0;
    hp_run_output ro = {0};
    while (st == HP_OK && S < Smax) {
        /* the buffer holds B rows of S ids */
        st = step_forward(r, ids, B, S, cached, feed, &ro, &n, err);
        if (st == HP_OK && root) pick(o, ro.logits, B, n, V, done, &rng, c, nxt);
        hp_runner_recycle_output(r, &ro);
        if (st == HP_OK) st = hp_comm_bcast(w, nxt, (size_t)B * sizeof *nxt, 0, err);
        if (st != HP_OK) break;
        if (use_kv) cached = S;
        /* widen each row by one: row b moves from b·S to b·(S + 1), last row first */
        for (int64_t b = B - 1; b >= 0; b--) {
            memmove(ids + b * (S + 1), ids + b * S, (size_t)S * sizeof *ids);
            ids[b * (S + 1) + S] = nxt[b];
        }
        bool all = true;
        for (int64_t b = 0; b < B; b++) {
            if (!done[b] && root && fn) fn(ctx, b, nxt[b]);
            if (!done[b] && is_eos(o, nxt[b])) done[b] = true;
            all = all && done[b];
        }
        S++;
        if (all) break;
    }
    free(feed);
    free(nxt), free(done), free(c);
    if (st != HP_OK) {
        free(ids);
        return st;
    }
    *out = ids, *out_len = S;
    return HP_OK;
}
