/*
 * attention.c — causal (windowed) GQA softmax attention over the keys a rank holds, as one fused kernel: the
 * queries in blocks of about HP__ATTN_BM rows (tokens × the query heads of one kv head), the keys in blocks of
 * HP__ATTN_BK, an online softmax over the key blocks, and never a [sq, sk] score matrix.
 *
 * Data (one query block: batch row b, kv head g, query tokens [i0, i0 + bq); a work item holds up to
 * HP__ATTN_GROUP of them, which share each packed K and V block):
 *
 *   q   [B, sq, nh, hd]   tokens i0.., heads g·rep..g·rep+rep−1 ─┐ packed: rows ρ = (token, head) [bq·rep, hd]
 *   k   [B, sk, nkv, hd]  keys j..j+BK of kv head g             ├─ s [rows, BK] = scale · q·kᵀ, masked
 *   v   [B, sk, nkv, hdv] the same keys (k, v blocks packed)    │  p = exp(s − m)          (running max m)
 *   o   [rows, hdv]       the slot's accumulator               ─┘  o = o·exp(m_old − m) + p·v
 *
 * and per row its running max m (f32) and sum l (f64); at the end out = o / l, written into out [B, sq, nh, hdv].
 * A thread owns one slot (s, the packed k and v blocks, and m, l, q, o per query block of its item), so memory
 * is O(rows·BK) per slot, a fixed number of slots, and nothing per [sq, sk]: hp__attention_scratch_bytes is
 * everything the kernel allocates.
 *
 * Masks: query i (position q_pos0 + i) sees key j (position k_pos0 + j) when kp <= qp and, with a window W,
 * kp > qp − W. For any query rows that is one contiguous key range (hp__attn_key_range): key blocks outside the
 * range of a query block are never computed, and inside it each row masks the columns outside its own range
 * (row_cols). The backward walks the same blocks with the same functions, so the two cannot disagree.
 *
 * Sinks (gpt-oss): the sink logit starts each row's max and sum (m = sink, l = 1) and is never added to out.
 *
 * Numerics: the products are f32 GEMMs with f32 sums (EXACT); in BF16 mode q, k, v and P are rounded to bf16
 * first (products of bf16 values are exact in f32, so this is a bf16 product with f32 sums, what hp_linalg_gemm's
 * BF16 mode computes). BF16 mode takes two passes over the key blocks, the rows' max and sum first, so that P is
 * rounded once normalized, where PyTorch's bf16 model rounds softmax's output (rounding the running, unnormalized
 * p instead moves a bf16 training step's gradients 4x further from that reference). exp in f32 against the row's
 * max, row sums in double.
 *
 * The backward (hp__attention_backward): per unit (batch row, kv head), per query block, pass 1 recomputes the
 * rows' m, l and D = Σ_j P_j·dP_j online (s and dP = dO·vᵀ per key block), pass 2 recomputes P and dP per key
 * block, dS = scale·P·(dP − D), and adds dq += dS·k, dk += dSᵀ·q, dv += Pᵀ·dO; the unit owns its kv head's dk
 * and dv rows, so the units run in parallel without sharing a byte. Its slot adds dp, the packed dO rows and the
 * dq accumulator: O(rows·BK) again.
 */
#include "kernels/backward.h"
#include "kernels/modules.h"
#include "hyperpar/linalg.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* Block sizes. A work item's rows are its query tokens × the rep query heads of one kv head (GQA: each K and V
 * block is read and, in BF16 mode, rounded once for all of them): about HP__ATTN_BM rows, so a block's scores
 * (128 × 256 f32 = 128 KiB), its q rows and its accumulator stay in L2 next to the K and V blocks (256 × 128 f32
 * = 128 KiB each); 256 keys make each product long enough for the GEMM kernels' packing to pay. Key blocks stop
 * at the query block's last visible key, so the causal diagonal wastes at most a triangle of the block's tokens. */
enum { HP__ATTN_BM = 128, HP__ATTN_BK = 256 };
/* Slots (threads) at most: the scratch is sized from the shapes alone, so the runner's count and the cost model
 * agree whatever the thread count; a machine with more cores than this runs attention on HP__ATTN_SLOTS. */
enum { HP__ATTN_SLOTS = 32 };
/* Query blocks per work item at most: they share each packed K and V block (key_blocks). */
enum { HP__ATTN_GROUP = 4 };

void hp__attn_key_range(const hp__attn_args *a, int64_t i0, int64_t i1, int64_t *j0, int64_t *j1)
{
    int64_t lo = 0, hi = a->q_pos0 + i1 - a->k_pos0; /* the last query's position is q_pos0 + i1 − 1 */
    if (a->window > 0) lo = a->q_pos0 + i0 - a->window + 1 - a->k_pos0;
    if (lo < 0) lo = 0;
    if (hi > a->sk) hi = a->sk;
    *j0 = lo;
    *j1 = hi > lo ? hi : lo;
}

static int64_t min64(int64_t x, int64_t y)
{
    return x < y ? x : y;
}

/* A work item's geometry and a slot's parts, in floats from the slot's start (l, f64, first: aligned). */
typedef struct slot_layout {
    int64_t rep, hdv;          /* query heads per kv head; v's head dim */
    int64_t bq, rows, bk;      /* query tokens per block, its rows (bq · rep), keys per block */
    size_t l, m, s, q, o, k, v; /* offsets in floats */
    size_t floats;             /* one slot */
    int64_t nqb, items, slots; /* query blocks per (row, kv head); query blocks alone; slots */
    int64_t grp;               /* query blocks a slot holds (HP__ATTN_GROUP, or nqb when fewer) */
} slot_layout;

static slot_layout layout_of(const hp__attn_args *a)
{
    slot_layout L;
    L.rep = a->nkv > 0 ? a->nh / a->nkv : 1;
    if (L.rep < 1) L.rep = 1;
    L.hdv = a->hdv > 0 ? a->hdv : a->hd;
    L.bq = HP__ATTN_BM / L.rep > 1 ? HP__ATTN_BM / L.rep : 1;
    L.bq = min64(L.bq, a->sq > 0 ? a->sq : 1);
    L.rows = L.bq * L.rep;
    L.bk = min64(HP__ATTN_BK, a->sk > 0 ? a->sk : 1);
    L.nqb = a->sq > 0 ? (a->sq + L.bq - 1) / L.bq : 0;
    L.grp = L.nqb < 1 ? 1 : min64(HP__ATTN_GROUP, L.nqb);
    size_t grows = (size_t)(L.grp * L.rows); /* the rows of the slot's query blocks */
    L.l = 0;
    L.m = L.l + 2 * grows;
    L.s = L.m + grows;
    L.q = L.s + (size_t)(L.rows * L.bk);
    L.o = L.q + grows * (size_t)a->hd;
    L.k = L.o + grows * (size_t)L.hdv;
    L.v = L.k + (size_t)(L.bk * a->hd);
    L.floats = L.v + (size_t)(L.bk * L.hdv);
    L.floats += L.floats & 1; /* keep the next slot's doubles aligned */
    int64_t units;
    if (!hp_mul_i64(a->B, a->nkv, &units) || !hp_mul_i64(units, L.nqb, &L.items))
        L.items = INT64_MAX; /* the cost model's sizes only: no runnable batch has that many */
    L.slots = L.items < 1 ? 1 : min64(L.items, HP__ATTN_SLOTS);
    return L;
}

size_t hp__attention_scratch_bytes(const hp__attn_args *a)
{
    slot_layout L = layout_of(a);
    return (size_t)L.slots * L.floats * sizeof(float);
}

/* max(m, x[0..n)), eight lanes at a time so that it vectorizes (max is exact in any order). */
static float row_max(const float *x, int64_t n, float m)
{
    float lane[8] = {m, m, m, m, m, m, m, m};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int u = 0; u < 8; u++) lane[u] = x[j + u] > lane[u] ? x[j + u] : lane[u];
    for (; j < n; j++) lane[0] = x[j] > lane[0] ? x[j] : lane[0];
    for (int u = 1; u < 8; u++) lane[0] = lane[u] > lane[0] ? lane[u] : lane[0];
    return lane[0];
}

/* Whether x[0..n) holds a NaN (the max above skips them). */
static bool any_nan(const float *x, int64_t n)
{
    for (int64_t j = 0; j < n; j++)
        if (isnan(x[j])) return true;
    return false;
}

/* Σ x[0..n) in double, in four lanes. */
static double row_sum(const float *x, int64_t n)
{
    double lane[4] = {0, 0, 0, 0};
    int64_t j = 0;
    for (; j + 4 <= n; j += 4)
        for (int u = 0; u < 4; u++) lane[u] += x[j + u];
    for (; j < n; j++) lane[0] += x[j];
    return (lane[0] + lane[1]) + (lane[2] + lane[3]);
}

/* dst [n, w] = the rows of src (stride ld), packed: the rows (token, head) of a block's rep query heads, which
 * are w = rep·hd contiguous floats per token. Rounded to bf16 values in BF16 mode. */
static void pack_rows(bool bf, int64_t n, int64_t w, const float *src, int64_t ld, float *dst)
{
    if (bf) hp_linalg_round_rows_bf16(n, w, src, ld, dst);
    else
        for (int64_t t = 0; t < n; t++) memcpy(dst + t * w, src + t * ld, (size_t)w * sizeof *dst);
}

/* The w-wide rows [jb, je) of kv head g of batch row b of x ([B, sk, nkv, w]) as a product reads them: packed
 * into buf (*ld = w), rounded to bf16 values in BF16 mode. Read in place, the rows lie nkv·w floats apart, 4 KiB
 * at Llama's 8 kv heads × 128: every row of the block falls in the same few cache sets, and oneDNN's sgemm ran at
 * 0.55 (P·v) and 0.8 (q·kᵀ) of its rate on the packed block (one thread, 128 rows × 256 keys × 128); the copy is
 * one pass over 2·256·128 floats per 8 MFLOP product. */
static const float *kv_block(const hp__attn_args *a, const float *x, int64_t w, int64_t b, int64_t g, int64_t jb,
                             int64_t je, float *buf, int64_t *ld)
{
    const float *p = x + ((b * a->sk + jb) * a->nkv + g) * w;
    pack_rows(a->mode == HP_LINALG_BF16, je - jb, w, p, a->nkv * w, buf);
    *ld = w;
    return buf;
}

/* The columns [*c0, *c1) of key block [jb, je) that query token i sees (*c1 <= *c0: none). */
static void row_cols(const hp__attn_args *a, int64_t i, int64_t jb, int64_t je, int64_t *c0, int64_t *c1)
{
    int64_t j0, j1;
    hp__attn_key_range(a, i, i + 1, &j0, &j1);
    *c0 = j0 < jb ? 0 : j0 - jb;
    *c1 = (j1 > je ? je : j1) - jb;
}

/* The online statistics over one key block of rows ρ (token i0 + ρ / rep): each row's max m and sum l (and, with
 * dp, D += Σ_j e_j·dp_j), rescaled when the max grows, from its visible scores in s [rows, nk] (overwritten by
 * e = exp(s − m)). A row whose visible scores are all −inf or NaN keeps its state, but a NaN makes l NaN: it must
 * reach the output. */
static void block_stats(const hp__attn_args *a, int64_t rep, int64_t i0, int64_t rows, int64_t jb, int64_t je,
                        float *s, const float *dp, float *m, double *l, double *D)
{
    int64_t nk = je - jb;
    for (int64_t r = 0; r < rows; r++) {
        int64_t c0, c1;
        row_cols(a, i0 + r / rep, jb, je, &c0, &c1);
        if (c1 <= c0) continue;
        float *sr = s + r * nk, bm = row_max(sr + c0, c1 - c0, m[r]);
        if (bm == -INFINITY) {
            if (any_nan(sr + c0, c1 - c0)) l[r] = NAN;
            continue;
        }
        if (bm > m[r]) { /* m = −inf: l and D are still 0 */
            double f = m[r] == -INFINITY ? 0.0 : (double)expf(m[r] - bm);
            l[r] *= f, m[r] = bm;
            if (D) D[r] *= f;
        }
        hp_linalg_exp_rows(sr + c0, c1 - c0, bm, 1.0f);
        l[r] += row_sum(sr + c0, c1 - c0);
        if (D) {
            double d = 0;
            for (int64_t j = c0; j < c1; j++) d += (double)sr[j] * dp[r * nk + j];
            D[r] += d;
        }
    }
}

/* P over one key block: s [rows, nk] <- exp(s − m) / l on each row's visible columns, 0 elsewhere, with the rows'
 * final m and l (l <= 0: nothing visible, P = 0; l NaN: P NaN). */
static void block_probs(const hp__attn_args *a, int64_t rep, int64_t i0, int64_t rows, int64_t jb, int64_t je,
                        float *s, const float *m, const double *l)
{
    int64_t nk = je - jb;
    for (int64_t r = 0; r < rows; r++) {
        int64_t c0, c1;
        row_cols(a, i0 + r / rep, jb, je, &c0, &c1);
        if (c1 <= c0 || l[r] <= 0) c0 = c1 = 0;
        float *sr = s + r * nk, inv = (float)(1.0 / l[r]), mr = isnan(l[r]) ? NAN : m[r];
        for (int64_t j = 0; j < c0; j++) sr[j] = 0.0f;
        hp_linalg_exp_rows(sr + c0, c1 - c0, mr, inv);
        for (int64_t j = c1 > c0 ? c1 : 0; j < nk; j++) sr[j] = 0.0f;
    }
}

/* One query block of a work item: tokens [i0, i0 + nt) of batch row b, kv head g; its rows (nt · rep), the keys
 * [k0, k1) they see (hp__attn_key_range), and its part of the slot: packed q rows, accumulator o, max m, sum l. */
typedef struct qblock {
    int64_t i0, nt, rows, k0, k1;
    float *q, *o, *m;
    double *l;
} qblock;

/* EXACT mode, one key block [jb, je) of query block Q, on the packed K and V blocks kp [je − jb, hd] and vp
 * [je − jb, hdv] (rows from jb): s = scale·q·kᵀ over Q's packed q rows (row ρ: token i0 + ρ / rep, head
 * g·rep + ρ % rep), each row masked to its own key range, then the online softmax step: m, l and the accumulator
 * rows rescaled to the new max, p = exp(s − m) and o += p·v; the division by l comes at the end. */
static void key_block_online(const hp__attn_args *a, const slot_layout *L, float *s, const qblock *Q, int64_t jb,
                             int64_t je, const float *kp, const float *vp, float scale)
{
    int64_t hd = a->hd, hdv = L->hdv, nk = je - jb, rows = Q->rows;
    float *m = Q->m, *o = Q->o;
    double *l = Q->l;
    hp_linalg_sgemm(true, rows, nk, hd, scale, Q->q, hd, kp, hd, 0.0f, s, nk);
    for (int64_t r = 0; r < rows; r++) {
        float *sr = s + r * nk;
        int64_t c0, c1;
        row_cols(a, Q->i0 + r / L->rep, jb, je, &c0, &c1);
        float bm = c1 > c0 ? row_max(sr + c0, c1 - c0, m[r]) : -INFINITY;
        if (bm == -INFINITY) { /* nothing visible, or only −inf or NaN scores: p is 0, the row unchanged */
            if (c1 > c0 && any_nan(sr + c0, c1 - c0)) l[r] = NAN; /* but a NaN must reach the output */
            memset(sr, 0, (size_t)nk * sizeof *sr);
            continue;
        }
        float *orow = o + r * hdv;
        if (bm > m[r]) { /* rescale to the new max (m = −inf: l and the row are still 0) */
            float c = m[r] == -INFINITY ? 0.0f : expf(m[r] - bm);
            l[r] *= c;
            for (int64_t e = 0; e < hdv; e++) orow[e] *= c;
            m[r] = bm;
        }
        for (int64_t j = 0; j < c0; j++) sr[j] = 0.0f;
        hp_linalg_exp_rows(sr + c0, c1 - c0, bm, 1.0f);
        for (int64_t j = c1; j < nk; j++) sr[j] = 0.0f;
        l[r] += row_sum(sr + c0, c1 - c0);
    }
    hp_linalg_sgemm(false, rows, hdv, nk, 1.0f, s, nk, vp, hdv, 1.0f, o, hdv);
}

/* BF16 mode, one key block of query block Q in pass 0 (the rows' max and sum from the scores alone) or pass 1
 * (P = exp(s − m) / l with the final m and l, rounded to bf16, and o += P·v): two passes, so that P is rounded
 * once normalized, as PyTorch's bf16 model rounds softmax's output before P·v. kp and vp are rounded already. */
static void key_block_bf16(const hp__attn_args *a, const slot_layout *L, float *s, const qblock *Q, int pass,
                           int64_t jb, int64_t je, const float *kp, const float *vp, float scale)
{
    int64_t hd = a->hd, hdv = L->hdv, nk = je - jb, rows = Q->rows;
    hp_linalg_sgemm(true, rows, nk, hd, scale, Q->q, hd, kp, hd, 0.0f, s, nk);
    if (pass == 0) {
        block_stats(a, L->rep, Q->i0, rows, jb, je, s, NULL, Q->m, Q->l, NULL);
        return;
    }
    block_probs(a, L->rep, Q->i0, rows, jb, je, s, Q->m, Q->l);
    hp_linalg_round_rows_bf16(rows, nk, s, nk, s);
    hp_linalg_sgemm(false, rows, hdv, nk, 1.0f, s, nk, vp, hdv, 1.0f, Q->o, hdv);
}

/* The key blocks of the query blocks qs[0..n) that start at the same key (k0): each K and V block [jb, jb + bk) is
 * packed (rounded in BF16 mode) once, and every query block that sees keys there takes its own key block
 * [jb, min(jb + bk, its k1)), the block it would take alone: the same products in the same order, so grouping
 * changes no bit; it saves the packing, one pass over the K and V rows per query block, which cost about as much
 * as a fifth of the products did. BF16 mode walks the keys twice (pass 0, pass 1). */
static void key_blocks(const hp__attn_args *a, const slot_layout *L, float *slot, int64_t b, int64_t g,
                       const qblock *qs, int n, float scale)
{
    bool bf = a->mode == HP_LINALG_BF16;
    int64_t hd = a->hd, hdv = L->hdv, k0 = qs[0].k0, k1 = k0;
    for (int i = 0; i < n; i++) k1 = qs[i].k1 > k1 ? qs[i].k1 : k1;
    const float *kx = a->k + (b * a->sk * a->nkv + g) * hd, *vx = a->v + (b * a->sk * a->nkv + g) * hdv;
    float *kp = slot + L->k, *vp = slot + L->v, *s = slot + L->s;
    for (int pass = bf ? 0 : 1; pass < 2; pass++)
        for (int64_t jb = k0; jb < k1; jb += L->bk) {
            int64_t je = min64(jb + L->bk, k1);
            pack_rows(bf, je - jb, hd, kx + jb * a->nkv * hd, a->nkv * hd, kp);
            if (pass == 1) pack_rows(bf, je - jb, hdv, vx + jb * a->nkv * hdv, a->nkv * hdv, vp);
            for (int i = 0; i < n; i++) {
                if (jb >= qs[i].k1) continue;
                int64_t e = min64(jb + L->bk, qs[i].k1);
                if (bf) key_block_bf16(a, L, s, &qs[i], pass, jb, e, kp, vp, scale);
                else key_block_online(a, L, s, &qs[i], jb, e, kp, vp, scale);
            }
        }
}

/* Work item (b, kv head g, query blocks [qb0, qb1)) on one thread's slot: per query block, the rep query heads of
 * g over the block's tokens, whose q rows are one [nt, rep·hd] block of q (packed, rounded in BF16 mode) and whose
 * outputs are one [nt, rep·hdv] block of out. Query blocks whose keys start at the same key share the K and V
 * blocks (key_blocks); a window's blocks, which start apart, run one at a time. */
static void query_blocks(const hp__attn_args *a, const slot_layout *L, float *slot, int64_t b, int64_t g, int64_t qb0,
                         int64_t qb1)
{
    int64_t sq = a->sq, nh = a->nh, hd = a->hd, hdv = L->hdv, rep = L->rep;
    bool bf = a->mode == HP_LINALG_BF16;
    float scale = (float)(a->scale > 0 ? a->scale : 1.0 / sqrt((double)hd));
    qblock qs[HP__ATTN_GROUP];
    int n = (int)(qb1 - qb0);
    for (int i = 0; i < n; i++) {
        qblock *Q = &qs[i];
        Q->i0 = (qb0 + i) * L->bq;
        Q->nt = min64(L->bq, sq - Q->i0);
        Q->rows = Q->nt * rep;
        Q->l = (double *)(slot + L->l) + i * L->rows;
        Q->m = slot + L->m + i * L->rows;
        Q->q = slot + L->q + (size_t)(i * L->rows * hd);
        Q->o = slot + L->o + (size_t)(i * L->rows * hdv);
        hp__attn_key_range(a, Q->i0, Q->i0 + Q->nt, &Q->k0, &Q->k1);
        pack_rows(bf, Q->nt, rep * hd, a->q + ((b * sq + Q->i0) * nh + g * rep) * hd, nh * hd, Q->q);
        /* the sink opens each row's softmax: max = sink, sum = exp(0) */
        for (int64_t r = 0; r < Q->rows; r++) {
            Q->m[r] = a->sinks ? a->sinks[g * rep + r % rep] : -INFINITY;
            Q->l[r] = a->sinks ? 1.0 : 0.0;
        }
        memset(Q->o, 0, (size_t)(Q->rows * hdv) * sizeof *Q->o);
    }
    for (int i = 0, j; i < n; i = j) { /* runs of query blocks whose keys start at the same key */
        for (j = i + 1; j < n && qs[j].k0 == qs[i].k0; j++) {}
        key_blocks(a, L, slot, b, g, qs + i, j - i, scale);
    }
    for (int i = 0; i < n; i++) {
        const qblock *Q = &qs[i];
        float *out = a->out + ((b * sq + Q->i0) * nh + g * rep) * hdv;
        for (int64_t r = 0; r < Q->rows; r++) { /* BF16 mode's P is already normalized */
            float inv = bf ? 1.0f : Q->l[r] <= 0 ? 0.0f : (float)(1.0 / Q->l[r]);
            float *dst = out + (r / rep) * nh * hdv + (r % rep) * hdv;
            for (int64_t e = 0; e < hdv; e++) dst[e] = Q->o[r * hdv + e] * inv;
        }
    }
}

hp_status hp__attention(const hp__attn_args *a, hp_err *err)
{
    slot_layout L = layout_of(a);
    float *scratch = malloc(L.floats * (size_t)L.slots * sizeof *scratch);
    if (!scratch)
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory for attention's block scratch (%zu bytes)",
                          hp__attention_scratch_bytes(a));
    int64_t per = a->B * a->nkv;
    int nt = (int)min64(omp_get_max_threads(), L.slots);
    /* query blocks per item: L.grp, fewer while that leaves under 4 items per thread (the slots hold L.grp; the
     * grouping changes no result) */
    int64_t G = L.grp;
    while (G > 1 && per * ((L.nqb + G - 1) / G) < 4 * (int64_t)nt) G--;
    int64_t ng = L.nqb > 0 ? (L.nqb + G - 1) / G : 0, items = per * ng;
    /* the last query blocks see the most keys: they go first, so the dynamic schedule ends on short items */
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *slot = scratch + (size_t)omp_get_thread_num() * L.floats;
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            int64_t qg = ng - 1 - it / per, bg = it % per;
            query_blocks(a, &L, slot, bg / a->nkv, bg % a->nkv, qg * G, min64(qg * G + G, L.nqb));
        }
    }
    free(scratch);
    return HP_OK;
}

/* ---- the backward ---- */

/* A backward unit's slot: per row its max m, sum l and D (l, D f64, first: aligned), then s and dp [rows, bk], the
 * packed q and dO rows, the dq accumulator, the rounded k and v blocks (BF16 mode). */
typedef struct bwd_layout {
    slot_layout f;               /* the forward's geometry: rep, hdv, bq, rows, bk, nqb */
    size_t l, d, m, s, dp, q, go, dq, k, v;
    size_t floats;
    int64_t units, slots;        /* (batch row, kv head) units; slots */
} bwd_layout;

static bwd_layout bwd_layout_of(const hp__attn_args *a)
{
    bwd_layout L;
    L.f = layout_of(a);
    size_t rows = (size_t)L.f.rows, bk = (size_t)L.f.bk, hd = (size_t)a->hd, hdv = (size_t)L.f.hdv;
    L.l = 0;
    L.d = L.l + 2 * rows;
    L.m = L.d + 2 * rows;
    L.s = L.m + rows;
    L.dp = L.s + rows * bk;
    L.q = L.dp + rows * bk;
    L.go = L.q + rows * hd;
    L.dq = L.go + rows * hdv;
    L.k = L.dq + rows * hd;
    L.v = L.k + bk * hd;
    L.floats = L.v + bk * hdv;
    L.floats += L.floats & 1;
    if (!hp_mul_i64(a->B, a->nkv, &L.units)) L.units = INT64_MAX;
    L.slots = L.units < 1 ? 1 : min64(L.units, HP__ATTN_SLOTS);
    return L;
}

/* One thread's view of a backward unit. */
typedef struct bwd_ctx {
    const hp__attn_args *a;
    const bwd_layout *L;
    float *slot;
    const float *dout;
    float *dq, *dk, *dv;
    double *gsink; /* [B, nh] the sinks' gradient per batch row, or NULL */
    float scale;
} bwd_ctx;

/* s = scale·q·kᵀ and dp = dO·vᵀ for key block [jb, je) of the packed rows (k and v rounded first in BF16 mode);
 * *kp, *ldk: the k block the products read (for dq = dS·k). */
static void bwd_products(const bwd_ctx *c, int64_t b, int64_t g, int64_t rows, int64_t jb, int64_t je,
                         const float **kp, int64_t *ldk)
{
    const hp__attn_args *a = c->a;
    const bwd_layout *L = c->L;
    int64_t hd = a->hd, hdv = L->f.hdv, nk = je - jb, ldv;
    *kp = kv_block(a, a->k, hd, b, g, jb, je, c->slot + L->k, ldk);
    const float *vp = kv_block(a, a->v, hdv, b, g, jb, je, c->slot + L->v, &ldv);
    hp_linalg_sgemm(true, rows, nk, hd, c->scale, c->slot + L->q, hd, *kp, *ldk, 0.0f, c->slot + L->s, nk);
    hp_linalg_sgemm(true, rows, nk, hdv, 1.0f, c->slot + L->go, hdv, vp, ldv, 0.0f, c->slot + L->dp, nk);
}

/* Pass 1 over the key blocks of query block [i0, i0 + nt): each row's max m, sum l (the sink's term included) and
 * D = Σ_j P_j·dP_j, accumulated online as the forward accumulates o, then D final (divided by l). */
static void bwd_stats(const bwd_ctx *c, int64_t b, int64_t g, int64_t i0, int64_t nt, int64_t k0, int64_t k1)
{
    const bwd_layout *L = c->L;
    int64_t rows = nt * L->f.rep, ldk;
    double *l = (double *)(c->slot + L->l), *D = (double *)(c->slot + L->d);
    const float *kp;
    for (int64_t jb = k0; jb < k1; jb += L->f.bk) {
        int64_t je = min64(jb + L->f.bk, k1);
        bwd_products(c, b, g, rows, jb, je, &kp, &ldk);
        block_stats(c->a, L->f.rep, i0, rows, jb, je, c->slot + L->s, c->slot + L->dp, c->slot + L->m, l, D);
    }
    for (int64_t r = 0; r < rows; r++) D[r] = l[r] <= 0 ? 0.0 : D[r] / l[r];
}

/* Pass 2: per key block P = exp(s − m) / l, dS = scale·P·(dP − D) (P and dS rounded in BF16 mode), then
 * dq += dS·k (the slot's accumulator), dk += dSᵀ·q and dv += Pᵀ·dO (the unit's own kv head, in place). */
static void bwd_grads(const bwd_ctx *c, int64_t b, int64_t g, int64_t i0, int64_t nt, int64_t k0, int64_t k1)
{
    const hp__attn_args *a = c->a;
    const bwd_layout *L = c->L;
    int64_t rows = nt * L->f.rep, nkv = a->nkv, hd = a->hd, hdv = L->f.hdv;
    float *s = c->slot + L->s, *dp = c->slot + L->dp;
    double *l = (double *)(c->slot + L->l), *D = (double *)(c->slot + L->d);
    for (int64_t jb = k0; jb < k1; jb += L->f.bk) {
        int64_t je = min64(jb + L->f.bk, k1), nk = je - jb, ldk;
        const float *kp;
        bwd_products(c, b, g, rows, jb, je, &kp, &ldk);
        block_probs(a, L->f.rep, i0, rows, jb, je, s, c->slot + L->m, l);
        for (int64_t r = 0; r < rows; r++) /* P is 0 wherever the row sees nothing, and so is dS */
            for (int64_t j = 0; j < nk; j++) {
                float p = s[r * nk + j];
                double dpj = dp[r * nk + j];
                dp[r * nk + j] = p == 0.0f ? 0.0f : (float)((double)c->scale * (double)p * (dpj - D[r]));
            }
        if (a->mode == HP_LINALG_BF16) {
            hp_linalg_round_rows_bf16(rows, nk, s, nk, s);
            hp_linalg_round_rows_bf16(rows, nk, dp, nk, dp);
        }
        hp_linalg_sgemm(false, rows, hd, nk, 1.0f, dp, nk, kp, ldk, 1.0f, c->slot + L->dq, hd);
        hp_linalg_sgemm_tn(nk, hd, rows, 1.0f, dp, nk, c->slot + L->q, hd, 1.0f,
                           c->dk + ((b * a->sk + jb) * nkv + g) * hd, nkv * hd);
        hp_linalg_sgemm_tn(nk, hdv, rows, 1.0f, s, nk, c->slot + L->go, hdv, 1.0f,
                           c->dv + ((b * a->sk + jb) * nkv + g) * hdv, nkv * hdv);
    }
}

/* Unit (b, g): every query block of the rep query heads of kv head g, in turn (dk and dv of g are this unit's). */
static void bwd_unit(const bwd_ctx *c, int64_t b, int64_t g)
{
    const hp__attn_args *a = c->a;
    const bwd_layout *L = c->L;
    int64_t sq = a->sq, nh = a->nh, hd = a->hd, hdv = L->f.hdv, rep = L->f.rep;
    bool bf = a->mode == HP_LINALG_BF16;
    float *m = c->slot + L->m, *dq = c->slot + L->dq;
    double *l = (double *)(c->slot + L->l), *D = (double *)(c->slot + L->d);
    for (int64_t qb = 0; qb < L->f.nqb; qb++) {
        int64_t i0 = qb * L->f.bq, nt = min64(L->f.bq, sq - i0), rows = nt * rep;
        const float *qp = a->q + ((b * sq + i0) * nh + g * rep) * hd;
        const float *gp = c->dout + ((b * sq + i0) * nh + g * rep) * hdv;
        pack_rows(bf, nt, rep * hd, qp, nh * hd, c->slot + L->q);
        pack_rows(bf, nt, rep * hdv, gp, nh * hdv, c->slot + L->go);
        for (int64_t r = 0; r < rows; r++) {
            m[r] = a->sinks ? a->sinks[g * rep + r % rep] : -INFINITY;
            l[r] = a->sinks ? 1.0 : 0.0;
            D[r] = 0.0;
        }
        memset(dq, 0, (size_t)(rows * hd) * sizeof *dq);
        int64_t k0, k1;
        hp__attn_key_range(a, i0, i0 + nt, &k0, &k1);
        bwd_stats(c, b, g, i0, nt, k0, k1);
        bwd_grads(c, b, g, i0, nt, k0, k1);
        for (int64_t r = 0; r < rows; r++) {
            int64_t h = g * rep + r % rep;
            memcpy(c->dq + ((b * sq + i0 + r / rep) * nh + h) * hd, dq + r * hd, (size_t)hd * sizeof *dq);
            if (c->gsink && !(l[r] <= 0)) /* the sink's probability exp(sink − m) / l */
                c->gsink[b * nh + h] -= exp((double)a->sinks[h] - (double)m[r]) / l[r] * D[r];
        }
    }
}

size_t hp__attention_backward_scratch_bytes(const hp__attn_args *a, bool dsinks)
{
    bwd_layout L = bwd_layout_of(a);
    size_t b = L.floats * (size_t)L.slots * sizeof(float);
    return dsinks ? b + ((size_t)(a->B * a->nh) + 1) * sizeof(double) : b;
}

hp_status hp__attention_backward(const hp__attn_args *a, const float *dout, float *dq, float *dk, float *dv,
                                 float *dsinks, hp_err *err)
{
    bwd_layout L = bwd_layout_of(a);
    float *scratch = malloc(L.floats * (size_t)L.slots * sizeof *scratch);
    double *gsink = dsinks && a->sinks ? hp_calloc((size_t)(a->B * a->nh) + 1, sizeof *gsink) : NULL;
    if (!scratch || (dsinks && a->sinks && !gsink)) {
        free(scratch), free(gsink);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory for the attention backward's block scratch (%zu bytes)",
                          L.floats * (size_t)L.slots * sizeof *scratch);
    }
    int64_t hdv = L.f.hdv;
    memset(dk, 0, (size_t)(a->B * a->sk * a->nkv * a->hd) * sizeof *dk);
    memset(dv, 0, (size_t)(a->B * a->sk * a->nkv * hdv) * sizeof *dv);
    float scale = (float)(a->scale > 0 ? a->scale : 1.0 / sqrt((double)a->hd));
    int nt = (int)min64(omp_get_max_threads(), L.slots);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        bwd_ctx c = {a, &L, scratch + (size_t)omp_get_thread_num() * L.floats, dout, dq, dk, dv, gsink, scale};
#pragma omp for schedule(dynamic, 1)
        for (int64_t u = 0; u < L.units; u++) bwd_unit(&c, u / a->nkv, u % a->nkv);
    }
    if (gsink)
        for (int64_t b = 0; b < a->B; b++) /* in batch order, whatever the threads did */
            for (int64_t h = 0; h < a->nh; h++) dsinks[h] += (float)gsink[b * a->nh + h];
    free(scratch), free(gsink);
    return HP_OK;
}
