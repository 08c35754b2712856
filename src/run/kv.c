/*
 * kv.c — generation's KV cache (docs/generate.md): each attention step keeps the keys and values (after rope,
 * whole over cp) of every position of the rank's rows, so a forward of the next tokens alone (a decode step)
 * attends to all of them. The cache lives beside the forward's workspace (hp_run_stats.kv_bytes), never in it.
 */
#include "run/runner_int.h"

#include <stdlib.h>
#include <string.h>

void hp__kv_free(hp_runner *r)
{
    for (size_t i = 0; r->kv.k && i < r->g.n_steps; i++) free(r->kv.k[i]), free(r->kv.v[i]);
    free(r->kv.k), free(r->kv.v);
    memset(&r->kv, 0, sizeof r->kv);
}

/* Step i's cache of rows × cap × width floats, made at its first use. */
static float *kv_buf(hp_runner *r, float **slot, int64_t width, hp_err *err)
{
    if (!*slot) {
        size_t n = (size_t)(r->kv.rows * r->kv.cap * width);
        if (!(*slot = malloc(n * sizeof **slot + 1))) {
            hp_err_set(err, HP_ERR_NOMEM, "out of memory for a KV cache of %lld positions", (long long)r->kv.cap);
            return NULL;
        }
        r->kv.bytes += n * sizeof **slot;
    }
    return *slot;
}

/* This forward's n positions (from src, [rows, n, width]) into the cache at positions [at, at + n). */
static void kv_put(const hp_runner *r, float *cache, const float *src, int64_t n, int64_t at, int64_t width)
{
    for (int64_t b = 0; b < r->kv.rows; b++)
        memcpy(cache + (b * r->kv.cap + at) * width, src + b * n * width, (size_t)(n * width) * sizeof *cache);
}

hp_status hp__kv_attend(hp_runner *r, const hp__step *s, hp__attn_args *aa, const hp__act *k, const hp__act *v,
                        hp_err *err)
{
    int64_t kw = aa->nkv * aa->hd, vw = aa->nkv * (aa->hdv ? aa->hdv : aa->hd);
    if (!r->kv.cap) { /* no cache: this forward's keys alone */
        aa->k = k->d, aa->v = v->d, aa->sk = k->n[1], aa->k_pos0 = k->lo[1];
        return hp__r_attention(r, aa, err);
    }
    size_t i = (size_t)(s - r->g.steps);
    if (!r->kv.rows) r->kv.rows = k->n[0]; /* the rank's rows of the batch (every attention step's) */
    float *ck = kv_buf(r, &r->kv.k[i], kw, err), *cv = ck ? kv_buf(r, &r->kv.v[i], vw, err) : NULL;
    if (!cv) return HP_ERR_NOMEM;
    int64_t at = r->pos0 + k->lo[1], n = k->n[1];
    if (k->n[0] != r->kv.rows || at + n > r->kv.cap)
        return hp_err_set(err, HP_ERR_INPUT, "KV cache of %lld rows x %lld positions given %lld rows at %lld..%lld",
                          (long long)r->kv.rows, (long long)r->kv.cap, (long long)k->n[0], (long long)at,
                          (long long)(at + n));
    kv_put(r, ck, k->d, n, at, kw);
    kv_put(r, cv, v->d, n, at, vw);
    /* each row over its cached positions [0, at + n): the rows lie cap positions apart, so one call per row */
    int64_t hdv = aa->hdv ? aa->hdv : aa->hd;
    hp__attn_args one = *aa;
    one.B = 1, one.sk = at + n, one.k_pos0 = 0;
    hp_status st = HP_OK;
    for (int64_t b = 0; b < aa->B && st == HP_OK; b++) {
        one.q = aa->q + b * aa->sq * aa->nh * aa->hd;
        one.out = aa->out + b * aa->sq * aa->nh * hdv;
        one.k = ck + b * r->kv.cap * kw;
        one.v = cv + b * r->kv.cap * vw;
        st = hp__r_attention(r, &one, err);
    }
    return st;
}

hp_status hp_runner_forward_at(hp_runner *r, const int64_t *ids, int64_t B, int64_t S, int64_t pos0,
                               hp_run_output *out, hp_err *err)
{
    memset(out, 0, sizeof *out);
    int64_t cap = r->o.kv_cache;
    if (cap <= 0) {
        if (pos0 != 0)
            return hp_err_set(err, HP_ERR_INPUT, "a forward at position %lld needs a runner with a KV cache "
                              "(hp_run_opts.kv_cache)", (long long)pos0);
        return hp_runner_forward(r, ids, B, S, out, err);
    }
    if (r->o.keep_activations || r->o.record)
        return hp_err_set(err, HP_ERR_INPUT, "a KV cache serves generation: not a training or validate runner");
    if (pos0 != 0 && (pos0 != r->kv.len || B != r->kv.B))
        return hp_err_set(err, HP_ERR_INPUT, "a forward at position %lld of %lld rows: the KV cache holds %lld "
                          "positions of %lld rows (start again at 0)", (long long)pos0, (long long)B,
                          (long long)r->kv.len, (long long)r->kv.B);
    if (S < 1 || pos0 + S > cap)
        return hp_err_set(err, HP_ERR_INPUT, "positions %lld..%lld do not fit the KV cache of %lld positions",
                          (long long)pos0, (long long)(pos0 + S), (long long)cap);
    if (pos0 == 0) { /* a new batch: the cache made again, for the rank's rows, at each attention step's first use */
        hp__kv_free(r);
        r->kv.B = B;
        if (!(r->kv.k = calloc(r->g.n_steps + 1, sizeof *r->kv.k)) ||
            !(r->kv.v = calloc(r->g.n_steps + 1, sizeof *r->kv.v))) {
            hp__kv_free(r);
            return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        }
        /* the cp padding of the last forward's tokens lies past its positions: slack for it */
        r->kv.cap = cap + 2 * r->x.pos.n[HP__CP];
    }
    r->pos0 = pos0;
    hp_status st = hp_runner_forward(r, ids, B, S, out, err);
    r->pos0 = 0;
    r->kv.len = st == HP_OK ? pos0 + S : 0; /* a failed forward leaves no usable cache: start again at 0 */
    if (st != HP_OK) r->kv.B = 0;
    r->tr.stats.kv_bytes = r->kv.bytes;
    return st;
}
