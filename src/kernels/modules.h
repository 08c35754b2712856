/*
 * modules.h — internal to src/run: the module computations on local tensors (modules.c).
 */
#ifndef HP_RUN_MODULES_H
#define HP_RUN_MODULES_H

#include "hyperpar/core.h"
#include "hyperpar/linalg.h"

/* Loops over rows of at least this many elements in all run on the OpenMP threads (each row's arithmetic is the
 * same whatever the thread count: bit-identical results). Below it the calling thread runs them: a parallel
 * region costs a few µs, and 2^16 elements are tens of µs of work. */
#define HP__PAR_MIN ((int64_t)1 << 16)

/* out [rows, H] = w · (x · rsqrt(mean(x²) + eps)); out may be x. */
void hp__rmsnorm(const float *x, int64_t rows, int64_t H, const float *w, double eps, float *out);

/* In place on x [tokens, heads, hd]: rotate_half rotary on the first rot channels; cos/sin [tokens, rot/2]. */
void hp__rope_apply(float *x, int64_t tokens, int64_t heads, int64_t hd, int64_t rot, const float *cos_t,
                    const float *sin_t);

/* In place on the channels [off, off + rot) of each head of x [tokens, heads, stride]: DeepSeek's interleaved
 * rope: pair i = (x[2i], x[2i+1]) rotated by frequency i, written de-interleaved (evens' results first). */
void hp__rope_apply_pairs(float *x, int64_t tokens, int64_t heads, int64_t stride, int64_t off, int64_t rot,
                          const float *cos_t, const float *sin_t);
/* hp__rope_apply on the channels [off, off + rot) of heads of `stride` channels. */
void hp__rope_apply_at(float *x, int64_t tokens, int64_t heads, int64_t stride, int64_t off, int64_t rot,
                       const float *cos_t, const float *sin_t);

typedef struct hp__attn_args {
    int64_t B, sq, sk;      /* batch rows, query tokens, key tokens (per row) */
    int64_t nh, nkv, hd;    /* local query heads, local kv heads, head dim of q and k */
    int64_t hdv;            /* head dim of v and the output (0: hd) */
    double scale;           /* softmax scale (0: hd^-½) */
    const float *q;         /* [B, sq, nh, hd] (after rope) */
    const float *k, *v;     /* [B, sk, nkv, hd] and [B, sk, nkv, hdv] */
    int64_t q_pos0, k_pos0; /* global positions of the first query and the first key */
    int64_t window;         /* keys j > q − window; 0 = none */
    const float *sinks;     /* [nh] gpt-oss attention sinks (a softmax column per head, then dropped), or NULL */
    float *out;             /* [B, sq, nh, hdv] */
    hp_linalg_mode mode;    /* the products' numerics (BF16: q, k, P and v rounded to bf16) */
} hp__attn_args;

/* Causal softmax attention (eager semantics), scaling hd^-½, as one fused kernel (attention.c): query blocks ×
 * key blocks with an online softmax, masked blocks skipped, no [sq, sk] matrix. Parallel over (batch row, head,
 * query block) on the OpenMP pool. Allocates hp__attention_scratch_bytes(a) while it runs, and nothing else. */
hp_status hp__attention(const hp__attn_args *a, hp_err *err);
/* The bytes hp__attention allocates for a's shapes (B, sq, sk, nh, hd, hdv): a fixed number of block slots,
 * independent of the thread count and of S beyond one block (the runner counts it; so does the cost model). */
size_t hp__attention_scratch_bytes(const hp__attn_args *a);
/* The masks, once: the keys [j0, j1) that some query of rows [i0, i1) sees (j1 == j0: none). For one row it is
 * exactly the row's visible keys: positions kp = k_pos0 + j with kp <= qp (qp = q_pos0 + i) and, with a window,
 * kp > qp − window. The block skipping and the row masks of the forward and of the backward all come from it. */
void hp__attn_key_range(const hp__attn_args *a, int64_t i0, int64_t i1, int64_t *j0, int64_t *j1);

/* out[r, i] = silu(g[r, i]) · u[r, i] for i < n. */
void hp__swiglu(const float *g, int64_t ldg, const float *u, int64_t ldu, int64_t rows, int64_t n, float *out,
                int64_t ldo);

/* Max (or mx_in when use_mx) and Σ exp(z − max) of z [n]. */
void hp__row_max_sumexp(const float *z, int64_t n, float mx_in, bool use_mx, float *mx, double *sumexp);

#endif
