/*
 * test_backward.c — the local backward kernels (src/kernels/backward.c) against central finite differences of an
 * f64 reference forward, and the AdamW step against PyTorch's (tests/data/forward/llama/train_io.safetensors).
 *
 * Each kernel test draws small random inputs, builds a scalar L = Σ dy·f(x) with a random dy, and compares the
 * kernel's gradient (f32) with (L(x + h) − L(x − h)) / 2h computed in double (h = 1e-5: truncation ~h², far
 * below the f32 kernels' own rounding). The error measure is max|analytic − fd| / max|fd| over the tensor, and
 * the bar is 1e-4 unless stated: f32 kernels on O(1) data reach ~1e-6, while any wrong sign, transposition or
 * missing term gives an error of order 1. The f64 reference forwards are also checked against the library's
 * f32 forwards (modules.c), so that the gradient is of the forward the runner actually runs.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_ref.h"
#include "hyperpar/safetensors.h"
#include "kernels/backward.h"
#include "kernels/linalg_int.h"
#include "testlib.h"

#define FD_H 1e-5
#define BAR 1e-4

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double urand(void) /* uniform in [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 4503599627370496.0 - 1.0;
}
static void fill(float *f, double *d, int64_t n, double amp)
{
    for (int64_t i = 0; i < n; i++) {
        f[i] = (float)(amp * urand());
        if (d) d[i] = f[i];
    }
}

typedef double (*loss_fn)(void *ctx);

/* max|an − fd| / max|fd| over x[0..n) (max|an − fd| when fd is all zero; a NaN is +inf), perturbing x (a double
 * copy the loss reads) one element at a time. */
static double fd_err(double *x, int64_t n, loss_fn L, void *ctx, const float *an, const char *what)
{
    double *fd = malloc((size_t)(n > 0 ? n : 1) * sizeof *fd);
    CHECK(fd != NULL);
    if (!fd) return INFINITY;
    for (int64_t i = 0; i < n; i++) {
        double x0 = x[i];
        x[i] = x0 + FD_H;
        double lp = L(ctx);
        x[i] = x0 - FD_H;
        double lm = L(ctx);
        x[i] = x0;
        fd[i] = (lp - lm) / (2 * FD_H);
    }
    test_diff d = test_compare(an, fd, n);
    free(fd);
    double e = d.max_ref > 0 ? d.max_diff / d.max_ref : d.max_diff;
    printf("  %-28s rel err %.2e (max|fd| %.3g, worst at [%lld])\n", what, e, d.max_ref, (long long)d.at);
    return e;
}

/* ---------------- RMSNorm ---------------- */
typedef struct {
    int64_t rows, H;
    double eps, *x, *w, *dy;
} norm_ctx;

static void rmsnorm_ref(const norm_ctx *c, double *out)
{
    for (int64_t r = 0; r < c->rows; r++) {
        double ss = 0;
        for (int64_t i = 0; i < c->H; i++) ss += c->x[r * c->H + i] * c->x[r * c->H + i];
        double inv = 1.0 / sqrt(ss / (double)c->H + c->eps);
        for (int64_t i = 0; i < c->H; i++) out[r * c->H + i] = c->w[i] * c->x[r * c->H + i] * inv;
    }
}
static double norm_loss(void *p)
{
    norm_ctx *c = p;
    double out[256], L = 0;
    rmsnorm_ref(c, out);
    for (int64_t i = 0; i < c->rows * c->H; i++) L += c->dy[i] * out[i];
    return L;
}

static void check_rmsnorm(int64_t rows, int64_t H, const char *label)
{
    float x[256], w[64], dy[256], dx[256], dw[64], y[256];
    double xd[256], wd[64], dyd[256], yd[256];
    fill(x, xd, rows * H, 1.5);
    fill(w, wd, H, 1.0);
    fill(dy, dyd, rows * H, 1.0);
    for (int64_t i = 0; i < H; i++) dw[i] = 0.5f; /* dw accumulates: start from a known value */
    norm_ctx c = {rows, H, 1e-5, xd, wd, dyd};
    hp__rmsnorm(x, rows, H, w, c.eps, y);
    rmsnorm_ref(&c, yd);
    CHECK_CLOSE(y, yd, rows * H, 1e-5, 0);
    hp__rmsnorm_backward(x, rows, H, w, c.eps, dy, dx, dw);
    for (int64_t i = 0; i < H; i++) dw[i] -= 0.5f;
    char what[64];
    snprintf(what, sizeof what, "%s dx", label);
    CHECK(fd_err(xd, rows * H, norm_loss, &c, dx, what) < BAR);
    snprintf(what, sizeof what, "%s dw", label);
    CHECK(fd_err(wd, H, norm_loss, &c, dw, what) < BAR);
}

TEST(rmsnorm_backward)
{
    check_rmsnorm(5, 16, "rmsnorm");
    check_rmsnorm(3 * 4, 8, "q/k norm (tokens*heads, hd)"); /* per-head norm: rows = tokens·heads, H = hd */
}

/* ---------------- rotary ---------------- */
enum { ROPE_HALF, ROPE_AT, ROPE_PAIRS };
typedef struct {
    int kind;
    int64_t tokens, heads, stride, off, rot;
    const float *cs, *sn;
    double *x, *dy;
} rope_ctx;

static void rope_ref(const rope_ctx *c, double *out)
{
    int64_t half = c->rot / 2, n = c->tokens * c->heads * c->stride;
    memcpy(out, c->x, (size_t)n * sizeof *out);
    for (int64_t t = 0; t < c->tokens; t++)
        for (int64_t h = 0; h < c->heads; h++) {
            const double *v = c->x + (t * c->heads + h) * c->stride + c->off;
            double *o = out + (t * c->heads + h) * c->stride + c->off;
            for (int64_t i = 0; i < half; i++) {
                double cc = c->cs[t * half + i], ss = c->sn[t * half + i];
                double a = c->kind == ROPE_PAIRS ? v[2 * i] : v[i], b = c->kind == ROPE_PAIRS ? v[2 * i + 1] : v[i + half];
                o[i] = a * cc - b * ss;
                o[i + half] = b * cc + a * ss;
            }
        }
}
static double rope_loss(void *p)
{
    rope_ctx *c = p;
    double out[512], L = 0;
    rope_ref(c, out);
    for (int64_t i = 0; i < c->tokens * c->heads * c->stride; i++) L += c->dy[i] * out[i];
    return L;
}

static void check_rope(int kind, int64_t stride, int64_t off, int64_t rot, const char *label)
{
    int64_t tokens = 3, heads = 2, n = tokens * heads * stride, half = rot / 2;
    float x[512], dy[512], cs[64], sn[64];
    double xd[512], dyd[512], yd[512];
    for (int64_t i = 0; i < tokens * half; i++) {
        double ang = 3.0 * urand();
        cs[i] = (float)cos(ang);
        sn[i] = (float)sin(ang);
    }
    fill(x, xd, n, 1.0);
    fill(dy, dyd, n, 1.0);
    rope_ctx c = {kind, tokens, heads, stride, off, rot, cs, sn, xd, dyd};
    rope_ref(&c, yd);
    float y[512], dx[512];
    memcpy(y, x, sizeof y);
    memcpy(dx, dy, sizeof dx);
    if (kind == ROPE_HALF) {
        hp__rope_apply(y, tokens, heads, stride, rot, cs, sn);
        hp__rope_backward(dx, tokens, heads, stride, rot, cs, sn);
    } else if (kind == ROPE_AT) {
        hp__rope_apply_at(y, tokens, heads, stride, off, rot, cs, sn);
        hp__rope_backward_at(dx, tokens, heads, stride, off, rot, cs, sn);
    } else {
        hp__rope_apply_pairs(y, tokens, heads, stride, off, rot, cs, sn);
        hp__rope_backward_pairs(dx, tokens, heads, stride, off, rot, cs, sn);
    }
    CHECK_CLOSE(y, yd, n, 1e-6, 0);
    CHECK(fd_err(xd, n, rope_loss, &c, dx, label) < BAR);
}

TEST(rope_backward)
{
    check_rope(ROPE_HALF, 8, 0, 8, "rope full");
    check_rope(ROPE_HALF, 8, 0, 4, "rope partial (rot 4 of 8)");
    check_rope(ROPE_AT, 10, 2, 6, "rope_at (off 2, rot 6 of 10)");
    check_rope(ROPE_PAIRS, 10, 4, 6, "rope_pairs (off 4, rot 6)");
}

/* ---------------- attention ---------------- */
typedef struct {
    hp__attn_args a; /* shapes, offsets, window, scale; pointers are the f32 inputs */
    double *q, *k, *v, *sinks, *dout;
} attn_ctx;

static void attn_ref(const attn_ctx *c, double *out)
{
    attn_ref_f64(&c->a, c->q, c->k, c->v, c->sinks, out);
}

static double attn_loss(void *p)
{
    attn_ctx *c = p;
    int64_t hdv = c->a.hdv > 0 ? c->a.hdv : c->a.hd, n = c->a.B * c->a.sq * c->a.nh * hdv;
    double *out = malloc((size_t)n * sizeof *out), L = 0;
    attn_ref(c, out);
    for (int64_t i = 0; i < n; i++) L += c->dout[i] * out[i];
    free(out);
    return L;
}

static void check_attention(hp__attn_args a, bool sinks, const char *label)
{
    int64_t hdv = a.hdv > 0 ? a.hdv : a.hd;
    int64_t nq = a.B * a.sq * a.nh * a.hd, nk = a.B * a.sk * a.nkv * a.hd, nv = a.B * a.sk * a.nkv * hdv;
    int64_t no = a.B * a.sq * a.nh * hdv;
    float *q = malloc((size_t)nq * sizeof *q), *k = malloc((size_t)nk * sizeof *k), *v = malloc((size_t)nv * sizeof *v);
    float *go = malloc((size_t)no * sizeof *go), *o = malloc((size_t)no * sizeof *o);
    float *dq = malloc((size_t)nq * sizeof *dq), *dk = malloc((size_t)nk * sizeof *dk), *dv = malloc((size_t)nv * sizeof *dv);
    double *qd = malloc((size_t)nq * sizeof *qd), *kd = malloc((size_t)nk * sizeof *kd), *vd = malloc((size_t)nv * sizeof *vd);
    double *god = malloc((size_t)no * sizeof *god), *od = malloc((size_t)no * sizeof *od);
    float sk[8], dsk[8];
    double skd[8];
    fill(q, qd, nq, 1.5);
    fill(k, kd, nk, 1.5);
    fill(v, vd, nv, 1.0);
    fill(go, god, no, 1.0);
    fill(sk, skd, a.nh, 1.0);
    for (int64_t h = 0; h < a.nh; h++) dsk[h] = 0.25f; /* dsinks accumulates */
    a.q = q;
    a.k = k;
    a.v = v;
    a.sinks = sinks ? sk : NULL;
    a.out = o;
    attn_ctx c = {a, qd, kd, vd, sinks ? skd : NULL, god};
    hp_err err;
    CHECK(hp__attention(&a, &err) == HP_OK);
    attn_ref(&c, od);
    CHECK_CLOSE(o, od, no, 1e-5, 0);
    CHECK(hp__attention_backward(&a, go, dq, dk, dv, sinks ? dsk : NULL, &err) == HP_OK);
    char what[96];
    snprintf(what, sizeof what, "%s dq", label);
    CHECK(fd_err(qd, nq, attn_loss, &c, dq, what) < BAR);
    snprintf(what, sizeof what, "%s dk", label);
    CHECK(fd_err(kd, nk, attn_loss, &c, dk, what) < BAR);
    snprintf(what, sizeof what, "%s dv", label);
    CHECK(fd_err(vd, nv, attn_loss, &c, dv, what) < BAR);
    if (sinks) {
        for (int64_t h = 0; h < a.nh; h++) dsk[h] -= 0.25f;
        snprintf(what, sizeof what, "%s dsinks", label);
        CHECK(fd_err(skd, a.nh, attn_loss, &c, dsk, what) < BAR);
    }
    free(q), free(k), free(v), free(go), free(o), free(dq), free(dk), free(dv);
    free(qd), free(kd), free(vd), free(god), free(od);
}

TEST(attention_backward)
{
    /* Plain causal, MHA, sq = sk. */
    check_attention((hp__attn_args){.B = 2, .sq = 4, .sk = 4, .nh = 2, .nkv = 2, .hd = 4}, false, "attn causal");
    /* GQA nh=4 over nkv=2, hdv != hd, explicit scale, a window, sinks, and CP-like offsets with sq != sk:
     * queries at positions 4..6, keys at 2..6. */
    check_attention((hp__attn_args){.B = 2, .sq = 3, .sk = 5, .nh = 4, .nkv = 2, .hd = 4, .hdv = 3, .scale = 0.4,
                                    .q_pos0 = 4, .k_pos0 = 2, .window = 3},
                    true, "attn gqa+window+sinks+offsets");
    /* A query row that sees no key at all (its position precedes every key): no sink, output and gradient 0. */
    check_attention((hp__attn_args){.B = 1, .sq = 3, .sk = 4, .nh = 4, .nkv = 1, .hd = 3, .q_pos0 = 0, .k_pos0 = 1},
                    false, "attn masked row, MQA");
    /* The same with sinks and a window: the masked row sees only its sink (output 0, and its D is 0). */
    check_attention((hp__attn_args){.B = 1, .sq = 3, .sk = 4, .nh = 2, .nkv = 1, .hd = 3, .q_pos0 = 0, .k_pos0 = 1,
                                    .window = 2},
                    true, "attn masked row + sinks");
}

/* ---------------- SwiGLU ---------------- */
typedef struct {
    bool clamped;
    float lim, alpha;
    int64_t rows, n;
    double *g, *u, *dy;
} glu_ctx;

static double glu_ref(const glu_ctx *c, double g, double u)
{
    if (!c->clamped) return g / (1 + exp(-g)) * u;
    double gg = fmin(g, c->lim), uu = fmax(-c->lim, fmin(u, c->lim));
    return (uu + 1) * gg / (1 + exp(-c->alpha * gg));
}
static double glu_loss(void *p)
{
    glu_ctx *c = p;
    double L = 0;
    for (int64_t i = 0; i < c->rows * c->n; i++) L += c->dy[i] * glu_ref(c, c->g[i], c->u[i]);
    return L;
}

static void check_glu(bool clamped, const char *label)
{
    enum { R = 4, N = 12 };
    /* g and u interleaved in one [R, 2N] buffer as the experts' gate_up output is; dy and the gradients dense. */
    float gu[R * 2 * N], dy[R * N], dg[R * N], du[R * N], out[R * N];
    double g[R * N], u[R * N], dyd[R * N];
    for (int64_t r = 0; r < R; r++)
        for (int64_t i = 0; i < N; i++) {
            gu[r * 2 * N + i] = (float)(3.0 * urand()); /* wide enough to cross the clamp at ±1.5 */
            gu[r * 2 * N + N + i] = (float)(3.0 * urand());
            g[r * N + i] = gu[r * 2 * N + i];
            u[r * N + i] = gu[r * 2 * N + N + i];
        }
    fill(dy, dyd, R * N, 1.0);
    glu_ctx c = {clamped, 1.5f, 1.702f, R, N, g, u, dyd};
    if (clamped) {
        hp__swiglu_clamped_backward(gu, 2 * N, gu + N, 2 * N, dy, N, R, N, c.lim, c.alpha, dg, N, du, N);
        int zg = 0, zu = 0;
        for (int64_t i = 0; i < R * N; i++) {
            zg += g[i] > c.lim && dg[i] == 0.0f;
            zu += fabs(u[i]) > c.lim && du[i] == 0.0f;
        }
        CHECK(zg > 0 && zu > 0); /* the data crossed both clamps, and those gradients are zero */
    } else {
        hp__swiglu(gu, 2 * N, gu + N, 2 * N, R, N, out, N);
        double ref[R * N];
        for (int64_t i = 0; i < R * N; i++) ref[i] = glu_ref(&c, g[i], u[i]);
        CHECK_CLOSE(out, ref, R * N, 1e-5, 0);
        hp__swiglu_backward(gu, 2 * N, gu + N, 2 * N, dy, N, R, N, dg, N, du, N);
    }
    char what[64];
    snprintf(what, sizeof what, "%s dg", label);
    CHECK(fd_err(g, R * N, glu_loss, &c, dg, what) < BAR);
    snprintf(what, sizeof what, "%s du", label);
    CHECK(fd_err(u, R * N, glu_loss, &c, du, what) < BAR);
}

TEST(swiglu_backward)
{
    check_glu(false, "swiglu");
    check_glu(true, "swiglu clamped (gpt-oss)");
}

/* ---------------- cross-entropy on a vocabulary slice ---------------- */
enum { XR = 4, XV = 11, XLO = 3, XN = 5 };
typedef struct {
    double *z; /* [XR, XV], the whole vocabulary */
    const int64_t *label;
    double scale;
} xent_ctx;

static double xent_loss(void *p)
{
    xent_ctx *c = p;
    double L = 0;
    for (int64_t r = 0; r < XR; r++) {
        if (c->label[r] < 0) continue;
        double mx = -INFINITY, s = 0;
        for (int64_t j = 0; j < XV; j++) mx = fmax(mx, c->z[r * XV + j]);
        for (int64_t j = 0; j < XV; j++) s += exp(c->z[r * XV + j] - mx);
        L += c->scale * (mx + log(s) - c->z[r * XV + c->label[r]]);
    }
    return L;
}

TEST(xent_backward_vocab_slice)
{
    float z[XR * XV], mx[XR], dz[XR * XN];
    double zd[XR * XV], se[XR];
    fill(z, zd, XR * XV, 3.0);
    /* Labels inside the slice [3, 8), outside it, and −1 (not scored): 3 scored positions. */
    const int64_t label[XR] = {5, 9, -1, 3};
    for (int64_t r = 0; r < XR; r++) hp__row_max_sumexp(z + r * XV, XV, 0.0f, false, &mx[r], &se[r]);
    xent_ctx c = {zd, label, 1.0 / 3.0};
    hp__xent_backward(z + XLO, XV, XR, XN, XLO, mx, se, label, c.scale, dz, XN);
    /* Finite differences over the whole row; compare the slice's columns. */
    double fd[XR * XN];
    for (int64_t r = 0; r < XR; r++)
        for (int64_t j = 0; j < XN; j++) {
            double *x = &zd[r * XV + XLO + j], x0 = *x;
            *x = x0 + FD_H;
            double lp = xent_loss(&c);
            *x = x0 - FD_H;
            double lm = xent_loss(&c);
            *x = x0;
            fd[r * XN + j] = (lp - lm) / (2 * FD_H);
        }
    test_diff d = test_compare(dz, fd, XR * XN);
    double rel = d.max_diff / d.max_ref;
    printf("  %-28s rel err %.2e (max|fd| %.3g)\n", "xent slice dz", rel, d.max_ref);
    CHECK(rel < BAR);
    for (int64_t j = 0; j < XN; j++) CHECK(dz[2 * XN + j] == 0.0f); /* the unscored row */
    CHECK(dz[0 * XN + 5 - XLO] < 0); /* the label's column carries the −1 */
}

/* ---------------- embedding ---------------- */
TEST(embedding_backward_vocab_slice)
{
    enum { T = 6, H = 3, LO = 4, NR = 3 };
    const int64_t ids[T] = {5, 1, 4, 5, 7, 6}; /* 1 and 7 are outside [4, 7) */
    float dy[T * H], dW[NR * H];
    fill(dy, NULL, T * H, 1.0);
    for (int64_t i = 0; i < NR * H; i++) dW[i] = 1.0f;
    hp__embedding_backward(ids, T, dy, H, LO, NR, dW);
    for (int64_t i = 0; i < H; i++) {
        CHECK(fabsf(dW[0 * H + i] - (1.0f + dy[2 * H + i])) < 1e-6f);               /* id 4 */
        CHECK(fabsf(dW[1 * H + i] - (1.0f + dy[0 * H + i] + dy[3 * H + i])) < 1e-6f); /* id 5, twice */
        CHECK(fabsf(dW[2 * H + i] - (1.0f + dy[5 * H + i])) < 1e-6f);               /* id 6 */
    }
}

/* ---------------- linear through the GEMM layer ---------------- */
/* v as mode multiplies it. */
static double opnd(hp_linalg_mode mode, float v)
{
    return mode == HP_LINALG_BF16 ? (double)hp_linalg_round_bf16(v) : (double)v;
}

TEST(linear_backward_vs_loops)
{
    enum { M = 7, N = 5, K = 9, LDY = 6, LDX = 11 };
    float dy[M * LDY], W[N * K], x[M * LDX], dx[2][M * K], dW[2][N * K], db[N];
    fill(dy, NULL, M * LDY, 1.0);
    fill(W, NULL, N * K, 1.0);
    fill(x, NULL, M * LDX, 1.0);
    /* EXACT multiplies the f32 values; BF16 both operands of each product rounded to bf16 (f32 sums) */
    for (int md = 0; md < 2; md++) {
        hp_linalg_mode mode = md ? HP_LINALG_BF16 : HP_LINALG_EXACT;
        for (int64_t i = 0; i < N * K; i++) dW[md][i] = 0.5f;
        for (int64_t i = 0; i < N; i++) db[i] = -0.25f;
        hp_err err;
        CHECK(hp__linear_backward(mode, M, N, K, dy, LDY, W, x, LDX, dx[md], K, dW[md], db, &err) == HP_OK);
        double rdx[M * K], rdW[N * K], rdb[N]; /* the loops' dx, dW and db */
        for (int64_t r = 0; r < M; r++)
            for (int64_t i = 0; i < K; i++) {
                double s = 0;
                for (int64_t j = 0; j < N; j++) s += opnd(mode, dy[r * LDY + j]) * opnd(mode, W[j * K + i]);
                rdx[r * K + i] = s;
            }
        for (int64_t j = 0; j < N; j++)
            for (int64_t i = 0; i < K; i++) {
                double s = 0.5;
                for (int64_t r = 0; r < M; r++) s += opnd(mode, dy[r * LDY + j]) * opnd(mode, x[r * LDX + i]);
                rdW[j * K + i] = s;
            }
        for (int64_t j = 0; j < N; j++) {
            double s = -0.25;
            for (int64_t r = 0; r < M; r++) s += dy[r * LDY + j]; /* a sum, not a product: never rounded */
            rdb[j] = s;
        }
        double e = fmax(test_max_abs_diff(dx[md], rdx, M * K),
                        fmax(test_max_abs_diff(dW[md], rdW, N * K), test_max_abs_diff(db, rdb, N)));
        printf("  linear backward (%s) max abs err %.2e\n", md ? "bf16" : "exact", e);
        CHECK(e < 1e-5); /* sums of ≤ 9 products of O(1) values in f32 */
    }
    /* the rounding is visible: bf16 operands move the products by far more than f32 sums do */
    double d = test_max_abs_diff(dx[1], dx[0], M * K);
    printf("  bf16 vs exact dx: max abs diff %.2e\n", d);
    CHECK(d > 1e-4);
}

/* hp_linalg_gemm: every transpose pair, alpha and beta, in both modes, against f64 loops over the operands as the
 * mode multiplies them (BF16: rounded; on a CPU with oneDNN's bf16 matmul that path, else rounded f32 copies). */
TEST(gemm_modes_vs_loops)
{
    enum { M = 37, N = 29, K = 300 }; /* K past a bf16 kernel's block, odd M and N */
    static float a[K * M + M * K], b[K * N + N * K], c0[M * N], c[M * (N + 3)];
    fill(a, NULL, 2 * M * K, 1.0);
    fill(b, NULL, 2 * N * K, 1.0);
    fill(c0, NULL, M * N, 1.0);
    for (int md = 0; md < 2; md++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int v = 0; v < 3; v++) {
                    hp_linalg_mode mode = md ? HP_LINALG_BF16 : HP_LINALG_EXACT;
                    float alpha = v == 2 ? 0.375f : v == 1 ? 1.0f : 0.7f, beta = v == 0 ? 0.0f : 1.0f;
                    int64_t lda = (ta ? M : K) + 2, ldb = (tb ? K : N) + 1, ldc = N + 3;
                    for (int64_t r = 0; r < M; r++)
                        for (int64_t j = 0; j < N; j++) c[r * ldc + j] = c0[r * N + j];
                    hp_err err;
                    CHECK(hp_linalg_gemm(mode, ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc, &err) == HP_OK);
                    double e = 0, scale = 0;
                    for (int64_t r = 0; r < M; r++)
                        for (int64_t j = 0; j < N; j++) {
                            double s = 0, t = 0;
                            for (int64_t p = 0; p < K; p++) {
                                double x = opnd(mode, ta ? a[p * lda + r] : a[r * lda + p]);
                                double y = opnd(mode, tb ? b[j * ldb + p] : b[p * ldb + j]);
                                s += x * y;
                                t += fabs(x * y);
                            }
                            double want = alpha * s + beta * c0[r * N + j];
                            e = fmax(e, fabs(c[r * ldc + j] - want));
                            scale = fmax(scale, t);
                        }
                    if (e > 1e-5 * scale)
                        printf("  %s ta %d tb %d alpha %g beta %g: max err %.2e of %.2e\n", md ? "bf16" : "exact", ta,
                               tb, alpha, beta, e, scale);
                    CHECK(e <= 1e-5 * scale); /* f32 sums of 300 products */
                }
}

/* ---------------- AdamW against PyTorch ---------------- */
#define GOLD_DIR "data/forward/llama/"

static float *read_f32(const hp_st_file *f, const hp_st_tensor *t)
{
    float *out = malloc((size_t)t->n_elems * sizeof *out);
    hp_err err;
    if (out && hp_dtype_to_f32(t->dtype, hp_st_data(f, t), out, t->n_elems, &err) != HP_OK) {
        free(out);
        return NULL;
    }
    return out;
}

/* Runs one AdamW step from fresh state on every parameter of the golden; returns how many tensors are outside
 * the bar 1e-6·max|p_ref| + 1e-7, and counts the tensors seen in *n_seen. */
static int adamw_golden(double weight_decay, int *n_seen)
{
    hp_err err;
    hp_st_file *model = NULL, *io = NULL;
    CHECK(hp_st_open(&model, GOLD_DIR "model.safetensors", &err) == HP_OK);
    CHECK(hp_st_open(&io, GOLD_DIR "train_io.safetensors", &err) == HP_OK);
    if (!model || !io) {
        hp_st_close(model);
        hp_st_close(io);
        return -1;
    }
    const char *hp = hp_st_metadata_get(io, "hparams");
    CHECK(hp != NULL);
    if (hp) { /* the hyperparameters below are the file's */
        CHECK_STR_CONTAINS(hp, "\"lr\":0.001");
        CHECK_STR_CONTAINS(hp, "\"betas\":[0.9,0.95]");
        CHECK_STR_CONTAINS(hp, "\"eps\":1e-08");
        CHECK_STR_CONTAINS(hp, "\"weight_decay\":0.1");
        CHECK_STR_CONTAINS(hp, "\"state\":\"fresh\"");
    }
    hp__adamw opt = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = weight_decay};
    int bad = 0;
    *n_seen = 0;
    for (size_t i = 0; hp_st_tensor_at(io, i); i++) {
        const hp_st_tensor *ref = hp_st_tensor_at(io, i);
        if (strncmp(ref->name, "adamw.", 6) != 0) continue;
        const char *name = ref->name + 6;
        char gname[512];
        snprintf(gname, sizeof gname, "grad.%s", name);
        const hp_st_tensor *tp = hp_st_find(model, name), *tg = hp_st_find(io, gname);
        CHECK_MSG(tp && tg && tp->n_elems == ref->n_elems && tg->n_elems == ref->n_elems, "%s", name);
        if (!tp || !tg || tp->n_elems != ref->n_elems || tg->n_elems != ref->n_elems) {
            bad++;
            continue;
        }
        int64_t n = ref->n_elems;
        float *p = read_f32(model, tp), *g = read_f32(io, tg), *want = read_f32(io, ref);
        float *m = calloc((size_t)n, sizeof *m), *v = calloc((size_t)n, sizeof *v);
        CHECK(p && g && want && m && v);
        if (p && g && want && m && v) {
            hp__adamw_step(p, g, m, v, n, &opt, 1);
            test_diff d = test_compare(p, want, n);
            if (!(d.max_diff <= 1e-6 * d.max_ref + 1e-7)) bad++;
            if (weight_decay > 0 && !(d.max_diff <= 1e-6 * d.max_ref + 1e-7))
                fprintf(stderr, "  %s: max diff %.3g > bar %.3g at [%lld]\n", name, d.max_diff, 1e-6 * d.max_ref + 1e-7,
                        (long long)d.at);
            (*n_seen)++;
        }
        free(p), free(g), free(want), free(m), free(v);
    }
    hp_st_close(model);
    hp_st_close(io);
    return bad;
}

TEST(adamw_matches_pytorch)
{
    int seen = 0;
    CHECK_EQ_INT(adamw_golden(0.1, &seen), 0);
    CHECK_EQ_INT(seen, 21); /* every parameter of the tiny llama: embed, 2 × 9, norm, lm_head */
    /* The bar is tight enough to see the decay: without it, tensors fall outside. */
    int bad = adamw_golden(0.0, &seen);
    CHECK(bad > 0);
}

TEST(adamw_second_step_bias_correction)
{
    /* Two steps on one element against the formula written out: t = 2 exercises β^t. */
    float p = 0.5f, m = 0, v = 0;
    const float g1 = 0.3f, g2 = -0.2f;
    hp__adamw opt = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    hp__adamw_step(&p, &g1, &m, &v, 1, &opt, 1);
    hp__adamw_step(&p, &g2, &m, &v, 1, &opt, 2);
    double P = 0.5, M = 0, V = 0;
    const double G[2] = {g1, g2};
    for (int t = 1; t <= 2; t++) {
        P *= 1 - 1e-2 * 0.1;
        M = 0.9 * M + 0.1 * G[t - 1];
        V = 0.95 * V + 0.05 * G[t - 1] * G[t - 1];
        P -= 1e-2 * (M / (1 - pow(0.9, t))) / (sqrt(V / (1 - pow(0.95, t))) + 1e-8);
    }
    CHECK(fabs(p - P) < 1e-7);
    CHECK(fabs(m - M) < 1e-8 && fabs(v - V) < 1e-9);
}

/* A uniform double in [0, 1) from a 64-bit LCG state (Knuth's MMIX constants). */
static double unif(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(*s >> 11) * 0x1p-53;
}

/* The AVX-512, AVX2 and plain C forms of the step store the same bits, and the check finds the same first bad
 * element (inside a vector, in the tail, in a later block) on each. */
TEST(adamw_every_isa_stores_the_same_bits)
{
    enum { N = 3 * (1 << 14) + 21 }; /* three whole blocks and a tail that is no multiple of 8 */
    float *p0 = malloc(N * sizeof *p0), *g = malloc(N * sizeof *g), *m0 = malloc(N * sizeof *m0),
          *v0 = malloc(N * sizeof *v0), *p = malloc(N * sizeof *p), *m = malloc(N * sizeof *m),
          *v = malloc(N * sizeof *v), *pw = malloc(N * sizeof *pw), *mw = malloc(N * sizeof *mw),
          *vw = malloc(N * sizeof *vw);
    CHECK(p0 && g && m0 && v0 && p && m && v && pw && mw && vw);
    if (!(p0 && g && m0 && v0 && p && m && v && pw && mw && vw)) return;
    uint64_t s = 12345;
    for (int i = 0; i < N; i++) {
        p0[i] = (float)(unif(&s) - 0.5);
        g[i] = (float)((unif(&s) - 0.5) * pow(10.0, (double)(i % 7) - 3));
        m0[i] = (float)((unif(&s) - 0.5) * 1e-2);
        v0[i] = (float)(unif(&s) * 1e-4);
    }
    hp__adamw opt = {.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    const hp__isa isas[3] = {HP__ISA_PORTABLE, HP__ISA_AVX2, HP__ISA_AVX512};
    int ran = 0;
    for (int a = 0; a < 3; a++) {
        if (!hp__isa_available(isas[a])) continue;
        hp__adamw_force(isas[a]);
        memcpy(p, p0, N * sizeof *p), memcpy(m, m0, N * sizeof *m), memcpy(v, v0, N * sizeof *v);
        CHECK_EQ_INT((int)hp__adamw_check(p, g, m, v, N, &opt, 3, NULL), N);
        hp__adamw_step(p, g, m, v, N, &opt, 3);
        if (ran++ == 0) {
            memcpy(pw, p, N * sizeof *p), memcpy(mw, m, N * sizeof *m), memcpy(vw, v, N * sizeof *v);
        } else {
            CHECK_MSG(memcmp(p, pw, N * sizeof *p) == 0 && memcmp(m, mw, N * sizeof *m) == 0 &&
                          memcmp(v, vw, N * sizeof *v) == 0, "%s", hp__isa_name(isas[a]));
        }
        /* the first bad element: a huge gradient (v overflows), a NaN moment, an infinite parameter */
        const int at[4] = {N - 3, 3 * (1 << 14) + 2, 20000 + 5, 13};
        float *const arr[4] = {g, m0, p0, g};
        const float bad[4] = {3e30f, NAN, INFINITY, -4e30f};
        for (int b = 0; b < 4; b++) {
            float keep = arr[b][at[b]];
            arr[b][at[b]] = bad[b];
            hp__adamw_bad info;
            CHECK_EQ_INT((int)hp__adamw_check(p0, g, m0, v0, N, &opt, 3, &info), at[b]);
            arr[b][at[b]] = keep;
        }
    }
    hp__adamw_force(hp__isa_best());
    CHECK(ran >= 1);
    printf("  adamw forms compared: %d\n", ran);
    free(p0), free(g), free(m0), free(v0), free(p), free(m), free(v), free(pw), free(mw), free(vw);
}

TEST_MAIN()
