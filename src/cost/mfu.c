/*
 * mfu.c — what a training step is measured against (`hyperpar train`'s MFU, `hyperpar bench train`'s ratio):
 *
 *   hp_cost_gemm_weights(m)        W, the weights one token goes through in the forward's GEMMs
 *   hp_cost_train_flops(m, T)      model FLOPs of a training step over T tokens: 6·W·T
 *   hp_cost_attn_train_flops(m, B, S) the attention scores' model FLOPs of a step of B rows of S positions,
 *                                  which cost's MFU adds to 6·W·T (PaLM's 6N + 12·L·H·S per token; train's MFU
 *                                  leaves them out)
 *   hp_cost_gemm_limit(w, n, m, R) the same-run GEMM limit: an n×n×n product (f32, or bf16 in mode m) through the
 *                                  GEMM layer on every rank at once, best of R after a warm-up; the sum over ranks
 *                                  is the limit. Then the arithmetic peak of mode on every rank at once (registers
 *                                  only, src/kernels/peak.c), summed: what the limit itself sits under
 *
 * MFU = model FLOPs / step seconds / the limit's sum (FLOP/s). The forward counts 2 FLOPs per weight and token
 * and the backward 4 (the input's and the weight's gradient). W holds per decoder layer the attention
 * projections (q, k, v, o; MLA's five: q_a, q_b or q, kv_a, kv_b, o), a dense layer's MLP (gate, up, down), a
 * sparse layer's router, its top-k routed experts (gate, up, down each) and its shared expert, and lm_head. MoE
 * counts only the active experts, as if routing were balanced. Not counted: the attention scores (Q·Kᵀ, P·V),
 * norms, rope, activations, the embedding lookup, AdamW, and the backward's recomputation of each layer's
 * forward — model FLOPs as MFU counts them, not the hardware's.
 *
 * The limit is a measurement on this machine, not a datasheet peak, so a step's GEMMs can beat it (their
 * shapes may suit the kernel better, or the machine was busier while it was measured): MFU may pass 1.
 */
#include "hyperpar/comm.h"
#include "hyperpar/cost.h"
#include "hyperpar/linalg.h"
#include "hyperpar/moe.h"

/* How long the peak's register loop runs on each rank. */
#define PEAK_SECONDS 0.25

double hp_cost_gemm_weights(const hp_model *m)
{
    const hp_model_config *c = &m->cfg;
    double H = (double)c->hidden_size, nh = (double)c->num_attention_heads, att;
    if (c->hidden_size <= 0) return 0.0;
    if (c->kv_lora_rank > 0) { /* MLA */
        double qk = (double)(c->qk_nope_head_dim + c->qk_rope_head_dim), q_lora = (double)c->q_lora_rank;
        att = (c->q_lora_rank > 0 ? H * q_lora + q_lora * nh * qk : H * nh * qk) +
              H * (double)(c->kv_lora_rank + c->qk_rope_head_dim) +
              (double)c->kv_lora_rank * nh * (double)(c->qk_nope_head_dim + c->v_head_dim) +
              nh * (double)c->v_head_dim * H;
    } else {
        att = 2.0 * H * (double)c->head_dim * (double)(c->num_attention_heads + c->num_key_value_heads);
    }
    double dense = 3.0 * H * (double)c->intermediate_size;
    double sparse = H * (double)c->n_experts + 3.0 * H * (double)c->moe_intermediate_size *
                                                   (double)c->num_experts_per_tok +
                    3.0 * H * (double)c->shared_intermediate_size;
    double w = 0.0;
    for (int64_t l = 0; l < c->num_hidden_layers; l++)
        w += att + (hp_model_layer_is_sparse(m, l) ? sparse : dense);
    return w + (double)c->vocab_size * H;
}

double hp_cost_train_flops(const hp_model *m, int64_t tokens)
{
    return 6.0 * hp_cost_gemm_weights(m) * (double)tokens;
}

double hp_cost_attn_train_flops(const hp_model *m, int64_t B, int64_t S)
{
    const hp_model_config *c = &m->cfg;
    double nh = (double)c->num_attention_heads, per_key; /* FLOPs per query, key and layer: Q·Kᵀ and P·V */
    if (c->kv_lora_rank > 0) per_key = 2.0 * nh * (double)(c->qk_nope_head_dim + c->qk_rope_head_dim + c->v_head_dim);
    else per_key = 4.0 * nh * (double)c->head_dim;
    /* forward and backward (the backward's two products per forward one): 3 x, every key of the row */
    double L = (double)(c->num_hidden_layers > 0 ? c->num_hidden_layers : 0);
    return 3.0 * per_key * (double)S * (double)S * (double)B * L;
}

hp_status hp_cost_gemm_limit(const hp_comm *w, int64_t n, hp_linalg_mode mode, int reps, hp_gemm_limit *out,
                             hp_err *err)
{
    *out = (hp_gemm_limit){.n = n, .reps = reps, .mode = mode};
    if (n < 1 || reps < 1)
        return hp_comm_agree(w, hp_err_set(err, HP_ERR_INPUT, "the reference GEMM needs n >= 1 and reps >= 1, got "
                                           "n %lld, reps %d", (long long)n, reps), err);
    /* After a barrier, so that the ranks of one node share its cores as they do in a step. */
    hp_status st = hp_comm_barrier(w, err);
    if (st) return st;
    double t0 = hp_comm_wtime(), g = hp_moe_ref_gemm_run(n, mode, reps, out->impl, sizeof out->impl), v[2] = {-g, hp_comm_wtime() - t0};
    st = hp_comm_agree(w, g > 0 ? HP_OK
                                : hp_err_set(err, HP_ERR_NOMEM, "rank %d: the %lldx%lldx%lld reference GEMM could not "
                                             "run (out of memory?)", hp_comm_rank(w), (long long)n, (long long)n,
                                             (long long)n),
                       err);
    if (st == HP_OK) st = hp_comm_allreduce_max_f64(w, v, 2, err); /* min over ranks = -max(-x); the slowest time */
    out->rank_gflops = g;
    out->sum_gflops = g;
    if (st == HP_OK) st = hp_comm_allreduce_sum_f64(w, &out->sum_gflops, 1, err);
    out->min_gflops = -v[0];
    out->seconds = v[1];
    out->peak_name = hp_linalg_peak_name(mode);
    if (st == HP_OK) st = hp_comm_barrier(w, err);
    if (st == HP_OK) {
        out->peak_gflops = hp_linalg_peak_gflops(mode, PEAK_SECONDS);
        st = hp_comm_allreduce_sum_f64(w, &out->peak_gflops, 1, err);
    }
    return st;
}
