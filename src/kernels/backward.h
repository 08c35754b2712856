/*
 * backward.h — internal to src/run: the backward of each module computation of modules.h on local tensors
 * (backward.c), the linear's backward through the GEMM layer, and the AdamW step (adamw.c).
 *
 * Conventions are the forward's: row-major tensors, the same shapes and leading dimensions, the same argument
 * order with the incoming gradient (dy, dout) added. A gradient written "=" overwrites its buffer; one written
 * "+=" accumulates into it (parameter gradients, which several rows, heads or micro-batches add to). No
 * function here talks to other ranks: what a gradient needs from the mesh (a sum over an axis, a dual
 * collective) is the runner's business, as in the forward.
 */
#ifndef HP_RUN_BACKWARD_H
#define HP_RUN_BACKWARD_H

#include "kernels/modules.h"

/* RMSNorm backward for y = w · x · r, r = (mean(x²) + eps)^-½, over rows of H channels (also the per-head q/k
 * norm: rows = tokens·heads, H = head dim):
 *   dx_i  = r · w_i·dy_i − x_i · r³/H · Σ_j w_j·dy_j·x_j     (=, [rows, H]; dx may be dy)
 *   dw_i += Σ_rows dy_i · x_i · r                             ([H]; NULL: not wanted)
 * Sums run in double. */
void hp__rmsnorm_backward(const float *x, int64_t rows, int64_t H, const float *w, double eps, const float *dy,
                          float *dx, float *dw);

/* The rotary embedding is a rotation per channel pair, so its backward is the inverse rotation (the transpose)
 * of the gradient, in place on dx [tokens, heads, ·], with the forward's cos/sin tables [tokens, rot/2];
 * channels outside the rotated ones pass through (partial rotary). Each mirrors its forward:
 * hp__rope_apply, hp__rope_apply_at (channels [off, off + rot) of heads of `stride`) and hp__rope_apply_pairs
 * (the interleaved pairs that the forward writes de-interleaved: the backward reads the de-interleaved
 * gradient and writes it back interleaved). */
void hp__rope_backward(float *dx, int64_t tokens, int64_t heads, int64_t hd, int64_t rot, const float *cos_t,
                       const float *sin_t);
void hp__rope_backward_at(float *dx, int64_t tokens, int64_t heads, int64_t stride, int64_t off, int64_t rot,
                          const float *cos_t, const float *sin_t);
void hp__rope_backward_pairs(float *dx, int64_t tokens, int64_t heads, int64_t stride, int64_t off, int64_t rot,
                             const float *cos_t, const float *sin_t);

/* Attention backward, for the forward hp__attention(a) (a->out is not read: P is recomputed from q and k, block by
 * block as the forward computes it, never as an [sq, sk] matrix: attention.c). With S = scale·q·kᵀ (masked),
 * P = softmax over the keys and the sink column, O = P·v:
 *   dP = dO·vᵀ,  D_i = Σ_j P_ij·dP_ij (= dO_i·O_i),  dS_ij = P_ij·(dP_ij − D_i)
 *   dq = scale·dS·k  (=),  dk = scale·dSᵀ·q,  dv = Pᵀ·dO  (=, each summed over the query heads of its kv head)
 *   dsinks[h] += −Σ_i P_i,sink · D_i   (the sink's value is zero, so its dP is zero; NULL: not wanted)
 * dout [B, sq, nh, hdv]; dq [B, sq, nh, hd]; dk [B, sk, nkv, hd]; dv [B, sk, nkv, hdv]. Two passes per query
 * block: m, l and D online over the key blocks, then P, dS and the three products per key block. Parallel over
 * (batch row, kv head): each unit owns its dk and dv rows. HP_ERR_NOMEM when its block scratch cannot be
 * allocated. */
hp_status hp__attention_backward(const hp__attn_args *a, const float *dout, float *dq, float *dk, float *dv,
                                 float *dsinks, hp_err *err);
/* The bytes hp__attention_backward allocates while it runs: its block scratch, and the sinks' f64 sums when
 * dsinks (a has sinks and their gradient is wanted). */
size_t hp__attention_backward_scratch_bytes(const hp__attn_args *a, bool dsinks);

/* SwiGLU backward for out = silu(g)·u, σ = sigmoid(g):
 *   dg = dy · u · σ·(1 + g·(1 − σ)),   du = dy · g·σ     (=; dg may be g and du may be u) */
void hp__swiglu_backward(const float *g, int64_t ldg, const float *u, int64_t ldu, const float *dy, int64_t ldy,
                         int64_t rows, int64_t n, float *dg, int64_t lddg, float *du, int64_t lddu);

/* gpt-oss's clamped SwiGLU (src/moe/experts.c): g' = min(g, lim), u' = clamp(u, −lim, lim),
 * out = (u' + 1) · g'·σ(α·g'). Backward, s = σ(α·g'):
 *   dg = dy · (u' + 1) · (s + α·g'·s·(1 − s))   where g ≤ lim, else 0
 *   du = dy · g'·s                               where −lim ≤ u ≤ lim, else 0
 * (the clamp's gradient passes at the bounds themselves, as torch.clamp's does). In place as above. */
void hp__swiglu_clamped_backward(const float *g, int64_t ldg, const float *u, int64_t ldu, const float *dy,
                                 int64_t ldy, int64_t rows, int64_t n, float lim, float alpha, float *dg,
                                 int64_t lddg, float *du, int64_t lddu);

/* Cross-entropy backward on a vocabulary slice: z [rows, n] (ldz) holds columns [vlo, vlo + n) of the logits;
 * mx[r] and sumexp[r] are the row's max and Σ exp(z − mx) over the whole vocabulary (the forward's, all-reduced
 * under loss-parallel); label[r] is the target token id, or −1 for a row that is not scored. Then
 *   dz[r, j] = scale · (exp(z[r, j] − mx[r]) / sumexp[r] − [vlo + j == label[r]])     (=; 0 on unscored rows)
 * with scale = 1 / (number of scored positions of the global batch) for a mean loss. dz may be z. */
void hp__xent_backward(const float *z, int64_t ldz, int64_t rows, int64_t n, int64_t vlo, const float *mx,
                       const double *sumexp, const int64_t *label, double scale, float *dz, int64_t lddz);

/* Embedding backward (vocab-parallel): for each token t whose id lies in [vlo, vlo + n_rows),
 *   dW[id − vlo, :] += dy[t, :]     (dW [n_rows, H], dy [n_tokens, H]); other ids are skipped. */
void hp__embedding_backward(const int64_t *ids, int64_t n_tokens, const float *dy, int64_t H, int64_t vlo,
                            int64_t n_rows, float *dW);

/* Linear backward for y [M, N] = x [M, K] · Wᵀ (W [N, K] row-major f32), through the GEMM layer:
 *   dx  = dy · W      (=, [M, K] (lddx); NULL: not wanted)
 *   dW += dyᵀ · x     ([N, K]; NULL: not wanted)
 *   db += Σ_rows dy   ([N]; NULL: not wanted)
 * dy [M, N] (ldy), x [M, K] (ldx). mode BF16 rounds both operands of each product to bf16 (hp_linalg_gemm).
 * Dimensions must fit an int (the GEMM layer's BLAS). */
hp_status hp__linear_backward(hp_linalg_mode mode, int64_t M, int64_t N, int64_t K, const float *dy, int64_t ldy,
                              const float *W, const float *x, int64_t ldx, float *dx, int64_t lddx, float *dW, float *db,
                              hp_err *err);

/* torch.optim.AdamW's hyperparameters. */
typedef struct hp__adamw {
    double lr, beta1, beta2, eps, weight_decay;
} hp__adamw;

/* One AdamW step t (from 1) on n elements, PyTorch's order: p −= lr·wd·p (decoupled decay, first);
 * m = β1·m + (1−β1)·g; v = β2·v + (1−β2)·g²; p −= lr · (m / (1−β1^t)) / (√(v / (1−β2^t)) + eps).
 * param, m, v are f32 and updated in place (m, v zero before step 1). */
void hp__adamw_step(float *param, const float *grad, float *m, float *v, int64_t n, const hp__adamw *opt,
                    int64_t step);

/* What hp__adamw_step would store at the first element it would make not finite (or v < 0): the new p, m, v,
 * the element's old value and gradient, and the decay factor 1 − lr·wd (to tell a weight decay from a step). */
typedef struct hp__adamw_bad {
    float param, m, v, old, grad;
    double decay;
} hp__adamw_bad;

/* The index of the first element whose step would store a value that is not finite, or a negative v; n when
 * there is none. Reads only, and computes each element exactly as hp__adamw_step does, so a step checked here
 * first is taken or left whole. *bad (may be NULL): that element's values. */
int64_t hp__adamw_check(const float *param, const float *grad, const float *m, const float *v, int64_t n,
                        const hp__adamw *opt, int64_t step, hp__adamw_bad *bad);

#endif
