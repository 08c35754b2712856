/*
 * attention.c — causal (windowed) GQA softmax attention over the keys a rank holds, as one fused kernel: the
 * queries in blocks of HP__ATTN_BQ rows, the keys in blocks of HP__ATTN_BK, an online softmax over the key
 * blocks, and never a [sq, sk] score matrix.
 *
 * Data (one work item: batch row b, query head h, query block [i0, i1); kv head h / rep read in place):
 *
 *   q   [B, sq, nh, hd]   rows i0..i1 of head h (stride nh·hd)  ─┐
 *   k   [B, sk, nkv, hd]  rows j..j+BK of kv head h/rep          ├─ s [BQ, BK] = scale · q·kᵀ, masked
 *   v   [B, sk, nkv, hdv] the same rows                          │  p = exp(s − m)       (running max m)
 *   out [B, sq, nh, hdv]  rows i0..i1 of head h: the accumulator ┘  out = out·exp(m_old − m) + p·v
 *
 * and per query row its running max m (f32) and sum l (f64); at the end out /= l. A thread owns one slot (s, m,
 * l and, in BF16 mode, its rounded q, k and v blocks), so memory is O(BQ·BK) per slot, a fixed number of slots,
 * and nothing per [sq, sk]: hp__attention_scratch_bytes is everything the kernel allocates.
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

/* Block sizes. 64 query rows keep a block's scores (64 × 256 f32 = 64 KiB) and its q rows in L2 next to the
 * K and V blocks (256 × 128 f32 = 128 KiB each); 256 keys make each product long enough for the GEMM kernels'
 * packing to pay. Causal blocks on the diagonal waste at most half a block's work. */
enum { HP__ATTN_BQ = 64, HP__ATTN_BK = 256 };
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

/* A slot's parts, in floats from its start: l (f64) first, so it is aligned. */
typedef struct slot_layout {
    int64_t bq, bk;           /* the block sizes for these shapes (at most the dims) */
    size_t l, m, s, q, k, v;  /* offsets in floats */
    size_t floats;            /* one slot */
    int64_t slots;
} slot_layout;

static int64_t min64(int64_t x, int64_t y)
{
    return x < y ? x : y;
}

static slot_layout layout_of(const hp__attn_args *a)
{
    slot_layout L;
    int64_t hdv = a->hdv > 0 ? a->hdv : a->hd;
    L.bq = a->sq < HP__ATTN_BQ ? (a->sq > 0 ? a->sq : 1) : HP__ATTN_BQ;
    L.bk = a->sk < HP__ATTN_BK ? (a->sk > 0 ? a->sk : 1) : HP__ATTN_BK;
    L.l = 0;
    L.m = L.l + 2 * (size_t)L.bq;
    L.s = L.m + (size_t)L.bq;
    L.q = L.s + (size_t)(L.bq * L.bk);
    L.k = L.q + (size_t)(L.bq * a->hd);
    L.v = L.k + (size_t)(L.bk * a->hd);
    L.floats = L.v + (size_t)(L.bk * hdv);
    L.floats += L.floats & 1; /* keep the next slot's doubles aligned */
    int64_t items = a->B * a->nh * ((a->sq + L.bq - 1) / L.bq);
    L.slots = items < 1 ? 1 : min64(items, HP__ATTN_SLOTS);
    return L;
}

size_t hp__attention_scratch_bytes(const hp__attn_args *a)
{
    slot_layout L = layout_of(a);
    return (size_t)L.slots * L.floats * sizeof(float);
}

/* dst [rows, cols] (packed) = src rows (stride ld) rounded to bf16 values: BF16 mode's operands. */
static void round_block(const float *src, int64_t ld, int64_t rows, int64_t cols, float *dst)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) dst[r * cols + c] = hp_linalg_round_bf16(src[r * ld + c]);
}

/* One key block [jb, je) of a query block [i0, i0 + nq): s = scale·q·kᵀ (q already placed: qp, ldq), each row
 * masked to its own key range, then the online softmax step: m, l and the output rows (o, ldo) rescaled to the
 * new max, p = exp(s − m) (rounded in BF16 mode) and o += p·v. */
static void key_block(const hp__attn_args *a, const slot_layout *L, float *slot, int64_t b, int64_t h, int64_t i0,
                      int64_t nq, const float *qp, int64_t ldq, int64_t jb, int64_t je, float *o, int64_t ldo)
{
    int64_t nkv = a->nkv, rep = a->nh / nkv, hd = a->hd, hdv = a->hdv > 0 ? a->hdv : hd, nk = je - jb;
    bool bf = a->mode == HP_LINALG_BF16;
    const float *kp = a->k + ((b * a->sk + jb) * nkv + h / rep) * hd, *vp = a->v + ((b * a->sk + jb) * nkv + h / rep) * hdv;
    int64_t ldk = nkv * hd, ldv = nkv * hdv;
    if (bf) {
        round_block(kp, ldk, nk, hd, slot + L->k);
        round_block(vp, ldv, nk, hdv, slot + L->v);
        kp = slot + L->k, vp = slot + L->v, ldk = hd, ldv = hdv;
    }
    float *s = slot + L->s, *m = slot + L->m;
    double *l = (double *)(slot + L->l);
    float scale = (float)(a->scale > 0 ? a->scale : 1.0 / sqrt((double)hd));
    hp_linalg_sgemm(true, nq, nk, hd, scale, qp, ldq, kp, ldk, 0.0f, s, nk);
    for (int64_t r = 0; r < nq; r++) {
        float *sr = s + r * nk;
        int64_t j0, j1;
        hp__attn_key_range(a, i0 + r, i0 + r + 1, &j0, &j1);
        j0 = j0 < jb ? 0 : j0 - jb; /* this row's visible columns of the block: [j0, j1) */
        j1 = j1 > je ? nk : j1 - jb;
        if (j1 <= j0) { /* nothing visible here: p is 0 and the row keeps its state */
            memset(sr, 0, (size_t)nk * sizeof *sr);
            continue;
        }
        float bm = m[r];
        for (int64_t j = j0; j < j1; j++) bm = sr[j] > bm ? sr[j] : bm;
        if (bm == -INFINITY) { /* every visible score is −inf (an infinite input): they add nothing */
            memset(sr, 0, (size_t)nk * sizeof *sr);
            continue;
        }
        float *orow = o + r * ldo;
        if (bm > m[r]) { /* rescale to the new max (m = −inf: l and the row are still 0) */
            float c = m[r] == -INFINITY ? 0.0f : expf(m[r] - bm);
            l[r] *= c;
            for (int64_t c2 = 0; c2 < hdv; c2++) orow[c2] *= c;
            m[r] = bm;
        }
        double sum = 0;
        for (int64_t j = 0; j < j0; j++) sr[j] = 0.0f;
        for (int64_t j = j0; j < j1; j++) {
            float e = expf(sr[j] - bm);
            sum += e;
            sr[j] = bf ? hp_linalg_round_bf16(e) : e;
        }
        for (int64_t j = j1; j < nk; j++) sr[j] = 0.0f;
        l[r] += sum;
    }
    hp_linalg_sgemm(false, nq, hdv, nk, 1.0f, s, nk, vp, ldv, 1.0f, o, ldo);
}

/* Work item (b, h, query block qb) on one thread's slot. */
static void query_block(const hp__attn_args *a, const slot_layout *L, float *slot, int64_t b, int64_t h, int64_t qb)
{
    int64_t sq = a->sq, nh = a->nh, hd = a->hd, hdv = a->hdv > 0 ? a->hdv : hd;
    int64_t i0 = qb * L->bq, nq = min64(L->bq, sq - i0);
    const float *qp = a->q + ((b * sq + i0) * nh + h) * hd;
    int64_t ldq = nh * hd, ldo = nh * hdv;
    float *o = a->out + ((b * sq + i0) * nh + h) * hdv, *m = slot + L->m;
    double *l = (double *)(slot + L->l);
    if (a->mode == HP_LINALG_BF16) {
        round_block(qp, ldq, nq, hd, slot + L->q);
        qp = slot + L->q, ldq = hd;
    }
    /* the sink opens each row's softmax: max = sink, sum = exp(0) */
    for (int64_t r = 0; r < nq; r++) {
        m[r] = a->sinks ? a->sinks[h] : -INFINITY;
        l[r] = a->sinks ? 1.0 : 0.0;
        memset(o + r * ldo, 0, (size_t)hdv * sizeof *o);
    }
    int64_t k0, k1;
    hp__attn_key_range(a, i0, i0 + nq, &k0, &k1);
    for (int64_t jb = k0; jb < k1; jb += L->bk)
        key_block(a, L, slot, b, h, i0, nq, qp, ldq, jb, min64(jb + L->bk, k1), o, ldo);
    for (int64_t r = 0; r < nq; r++) {
        float inv = l[r] > 0 ? (float)(1.0 / l[r]) : 0.0f;
        for (int64_t c = 0; c < hdv; c++) o[r * ldo + c] *= inv;
    }
}

hp_status hp__attention(const hp__attn_args *a, hp_err *err)
{
    slot_layout L = layout_of(a);
    float *scratch = malloc(L.floats * (size_t)L.slots * sizeof *scratch);
    if (!scratch)
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory for attention's block scratch (%zu bytes)",
                          hp__attention_scratch_bytes(a));
    int64_t nqb = (a->sq + L.bq - 1) / L.bq, per = a->B * a->nh, items = nqb * per;
    int nt = omp_get_max_threads();
    nt = (int)min64(nt, L.slots);
    /* the last query blocks see the most keys: they go first, so the dynamic schedule ends on short items */
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *slot = scratch + (size_t)omp_get_thread_num() * L.floats;
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            int64_t qb = nqb - 1 - it / per, bh = it % per;
            query_block(a, &L, slot, bh / a->nh, bh % a->nh, qb);
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
