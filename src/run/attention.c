/*
 * attention.c — causal (windowed) GQA softmax attention over the keys a rank holds, as one fused kernel: the
 * queries in blocks of about HP__ATTN_BM rows (tokens × the query heads of one kv head), the keys in blocks of
 * HP__ATTN_BK, an online softmax over the key blocks, and never a [sq, sk] score matrix.
 *
 * Data (one work item: batch row b, kv head g, query tokens [i0, i0 + bq); K and V read in place):
 *
 *   q   [B, sq, nh, hd]   tokens i0.., heads g·rep..g·rep+rep−1 ─┐ packed: rows ρ = (token, head) [bq·rep, hd]
 *   k   [B, sk, nkv, hd]  keys j..j+BK of kv head g             ├─ s [rows, BK] = scale · q·kᵀ, masked
 *   v   [B, sk, nkv, hdv] the same keys                         │  p = exp(s − m)          (running max m)
 *   o   [rows, hdv]       the slot's accumulator               ─┘  o = o·exp(m_old − m) + p·v
 *
 * and per row its running max m (f32) and sum l (f64); at the end out = o / l, written into out [B, sq, nh, hdv].
 * A thread owns one slot (s, m, l, q, o and, in BF16 mode, its rounded k and v blocks), so memory is O(rows·BK)
 * per slot, a fixed number of slots, and nothing per [sq, sk]: hp__attention_scratch_bytes is everything the
 * kernel allocates.
 *
 * Masks: query i (position q_pos0 + i) sees key j (position k_pos0 + j) when kp <= qp and, with a window W,
 * kp > qp − W. For any query rows that is one contiguous key range (hp__attn_key_range): key blocks outside the
 * range of a query block are never computed, and inside it each row masks the columns outside its own range.
 * The backward's hp__attn_probs uses the same range, so the forward and the backward cannot disagree.
 *
 * Sinks (gpt-oss): the sink logit starts each row's max and sum (m = sink, l = 1) and is never added to out.
 *
 * Numerics: the products are f32 GEMMs with f32 sums (EXACT); in BF16 mode q, k, v and p are rounded to bf16
 * first (products of bf16 values are exact in f32, so this is a bf16 product with f32 sums, as hp_linalg_gemm's
 * BF16 mode and PyTorch's bf16 SDPA math path, which rounds P, compute). exp in f32 against the running max,
 * row sums in double, the division once at the end.
 */
#include "run/modules.h"

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
    int64_t nqb, items, slots; /* query blocks per (row, kv head); work items; slots */
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
    L.l = 0;
    L.m = L.l + 2 * (size_t)L.rows;
    L.s = L.m + (size_t)L.rows;
    L.q = L.s + (size_t)(L.rows * L.bk);
    L.o = L.q + (size_t)(L.rows * a->hd);
    L.k = L.o + (size_t)(L.rows * L.hdv);
    L.v = L.k + (size_t)(L.bk * a->hd);
    L.floats = L.v + (size_t)(L.bk * L.hdv);
    L.floats += L.floats & 1; /* keep the next slot's doubles aligned */
    L.nqb = a->sq > 0 ? (a->sq + L.bq - 1) / L.bq : 0;
    L.items = a->B * a->nkv * L.nqb;
    L.slots = L.items < 1 ? 1 : min64(L.items, HP__ATTN_SLOTS);
    return L;
}

size_t hp__attention_scratch_bytes(const hp__attn_args *a)
{
    slot_layout L = layout_of(a);
    return (size_t)L.slots * L.floats * sizeof(float);
}

/* e^x for x <= 0 (a score minus its row's running max), branch-free so that a row's loop vectorizes: x = n·ln2 + r
 * with |r| <= ln2/2 (ln2 split in two parts, Cody and Waite), e^r by its degree-7 Taylor polynomial (truncation
 * below 2^-26 relative), 2^n from the exponent bits. Within 2 ulp of expf; x below −87 (e^x < 2^-125, also
 * −inf) gives about 1e-38, nothing next to the row's largest term, which is 1. */
static inline float exp_nonpos(float x)
{
    /* x = max(x, −87) on the bits (an integer select vectorizes; a float compare may trap, so it does not): a
     * negative float's bits grow with its magnitude, and −inf and NaN lie above −87's */
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u = u > 0xc2ae0000u ? 0xc2ae0000u : u;
    memcpy(&x, &u, sizeof x);
    float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f; /* round to nearest: 1.5·2^23 drops the fraction */
    float r = (x - n * 0.693145752f) - n * 1.42860677e-6f;
    const float c3 = 1.0f / 6, c4 = 1.0f / 24, c5 = 1.0f / 120, c6 = 1.0f / 720, c7 = 1.0f / 5040;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (c3 + r * (c4 + r * (c5 + r * (c6 + r * c7))))));
    int32_t bits = ((int32_t)n + 127) * (1 << 23);
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return p * two_n;
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

/* One key block [jb, je) of the item (b, kv head g, tokens [i0, i0 + nt)): s = scale·q·kᵀ over the slot's packed
 * q rows (row ρ: token i0 + ρ / rep, head g·rep + ρ % rep), each row masked to its own key range, then the online
 * softmax step: m, l and the accumulator rows rescaled to the new max, p = exp(s − m) (rounded in BF16 mode) and
 * o += p·v. */
static void key_block(const hp__attn_args *a, const slot_layout *L, float *slot, int64_t b, int64_t g, int64_t i0,
                      int64_t nt, int64_t jb, int64_t je)
{
    int64_t nkv = a->nkv, hd = a->hd, hdv = L->hdv, nk = je - jb, rows = nt * L->rep;
    bool bf = a->mode == HP_LINALG_BF16;
    const float *kp = a->k + ((b * a->sk + jb) * nkv + g) * hd, *vp = a->v + ((b * a->sk + jb) * nkv + g) * hdv;
    int64_t ldk = nkv * hd, ldv = nkv * hdv;
    if (bf) {
        hp_linalg_round_rows_bf16(nk, hd, kp, ldk, slot + L->k);
        hp_linalg_round_rows_bf16(nk, hdv, vp, ldv, slot + L->v);
        kp = slot + L->k, vp = slot + L->v, ldk = hd, ldv = hdv;
    }
    float *s = slot + L->s, *m = slot + L->m, *o = slot + L->o;
    double *l = (double *)(slot + L->l);
    float scale = (float)(a->scale > 0 ? a->scale : 1.0 / sqrt((double)hd));
    hp_linalg_sgemm(true, rows, nk, hd, scale, slot + L->q, hd, kp, ldk, 0.0f, s, nk);
    for (int64_t r = 0; r < rows; r++) {
        float *sr = s + r * nk;
        int64_t i = i0 + r / L->rep, j0, j1;
        hp__attn_key_range(a, i, i + 1, &j0, &j1);
        j0 = j0 < jb ? 0 : j0 - jb; /* this row's visible columns of the block: [j0, j1) */
        j1 = j1 > je ? nk : j1 - jb;
        float bm = row_max(sr + j0, j1 - j0, m[r]);
        if (j1 <= j0 || bm == -INFINITY) { /* nothing visible (or only −inf scores): p is 0, the row unchanged */
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
        for (int64_t j = 0; j < j0; j++) sr[j] = 0.0f;
#pragma omp simd
        for (int64_t j = j0; j < j1; j++) sr[j] = exp_nonpos(sr[j] - bm);
        for (int64_t j = j1; j < nk; j++) sr[j] = 0.0f;
        l[r] += row_sum(sr + j0, j1 - j0);
    }
    if (bf) hp_linalg_round_rows_bf16(rows, nk, s, nk, s); /* p as PyTorch's bf16 math path multiplies it */
    hp_linalg_sgemm(false, rows, hdv, nk, 1.0f, s, nk, vp, ldv, 1.0f, o, hdv);
}

/* Work item (b, kv head g, query block qb) on one thread's slot: the rep query heads of g over the block's
 * tokens, whose q rows are one [nt, rep·hd] block of q (packed, rounded in BF16 mode) and whose outputs are one
 * [nt, rep·hdv] block of out. */
static void query_block(const hp__attn_args *a, const slot_layout *L, float *slot, int64_t b, int64_t g, int64_t qb)
{
    int64_t sq = a->sq, nh = a->nh, hd = a->hd, hdv = L->hdv, rep = L->rep;
    int64_t i0 = qb * L->bq, nt = min64(L->bq, sq - i0), rows = nt * rep;
    const float *qp = a->q + ((b * sq + i0) * nh + g * rep) * hd;
    float *out = a->out + ((b * sq + i0) * nh + g * rep) * hdv, *m = slot + L->m, *o = slot + L->o;
    double *l = (double *)(slot + L->l);
    if (a->mode == HP_LINALG_BF16) hp_linalg_round_rows_bf16(nt, rep * hd, qp, nh * hd, slot + L->q);
    else
        for (int64_t t = 0; t < nt; t++) memcpy(slot + L->q + t * rep * hd, qp + t * nh * hd, (size_t)(rep * hd) * sizeof *qp);
    /* the sink opens each row's softmax: max = sink, sum = exp(0) */
    for (int64_t r = 0; r < rows; r++) {
        m[r] = a->sinks ? a->sinks[g * rep + r % rep] : -INFINITY;
        l[r] = a->sinks ? 1.0 : 0.0;
    }
    memset(o, 0, (size_t)(rows * hdv) * sizeof *o);
    int64_t k0, k1;
    hp__attn_key_range(a, i0, i0 + nt, &k0, &k1);
    for (int64_t jb = k0; jb < k1; jb += L->bk) key_block(a, L, slot, b, g, i0, nt, jb, min64(jb + L->bk, k1));
    for (int64_t r = 0; r < rows; r++) {
        float inv = l[r] > 0 ? (float)(1.0 / l[r]) : 0.0f, *dst = out + (r / rep) * nh * hdv + (r % rep) * hdv;
        for (int64_t e = 0; e < hdv; e++) dst[e] = o[r * hdv + e] * inv;
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
    /* the last query blocks see the most keys: they go first, so the dynamic schedule ends on short items */
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *slot = scratch + (size_t)omp_get_thread_num() * L.floats;
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < L.items; it++) {
            int64_t qb = L.nqb - 1 - it / per, bg = it % per;
            query_block(a, &L, slot, bg / a->nkv, bg % a->nkv, qb);
        }
    }
    free(scratch);
    return HP_OK;
}

hp_status hp__attn_probs(const hp__attn_args *a, int64_t b, int64_t h, float *p, float *psink, hp_err *err)
{
    int64_t Sq = a->sq, Sk = a->sk, hd = a->hd, nh = a->nh, nkv = a->nkv, rep = nh / nkv;
    const float *q = a->q + (b * Sq * nh + h) * hd, *k = a->k + (b * Sk * nkv + h / rep) * hd;
    float scale = (float)(a->scale > 0 ? a->scale : 1.0 / sqrt((double)hd));
    hp_status st = hp_linalg_gemm(a->mode, false, true, Sq, Sk, hd, scale, q, nh * hd, k, nkv * hd, 0.0f, p, Sk, err);
    if (st != HP_OK) return st;
    for (int64_t i = 0; i < Sq; i++) {
        float *row = p + i * Sk;
        int64_t j0, j1;
        hp__attn_key_range(a, i, i + 1, &j0, &j1);
        float mx = a->sinks ? a->sinks[h] : -INFINITY; /* the sink is never masked */
        for (int64_t j = j0; j < j1; j++) mx = row[j] > mx ? row[j] : mx;
        double es = a->sinks ? exp((double)a->sinks[h] - (double)mx) : 0, sum = es; /* its column, then dropped */
        for (int64_t j = 0; j < Sk; j++) {
            float e = j >= j0 && j < j1 ? expf(row[j] - mx) : 0.0f;
            row[j] = e;
            sum += e;
        }
        float inv = sum > 0 ? (float)(1.0 / sum) : 0.0f;
        for (int64_t j = 0; j < Sk; j++) row[j] *= inv;
        if (psink) psink[i] = sum > 0 ? (float)(es / sum) : 0.0f;
    }
    return HP_OK;
}
