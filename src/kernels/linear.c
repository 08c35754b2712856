/*
 * linear.c — the GEMM layer's objects: the context (engine, primitive cache, scratch) and linears (a weight
 * or a stack of experts' weights), their init-time path choice and the forward calls.
 *
 * A forward call splits its work by row count (see linalg_int.h for the table of paths):
 *
 *   groups ──▶ m = 0            skipped
 *          ──▶ m ≤ small_m_max  "pieces" of at most HP__ROW_CHUNK rows, batched: one OpenMP loop over
 *                               (piece, tile of 16 W rows) runs the streaming kernel for the whole batch;
 *                               static schedule, so each thread streams one contiguous run of W
 *          ──▶ uk_min_m ≤ m ≤ uk_max_m (AVX-512, where measured faster: HP__UK_RULES) the blocked kernel, every such
 *                               group in one OpenMP loop over (group, column block) items (ukernel.c)
 *          ──▶ m > small_m_max  through the one cached primitive: groups of at most HP__SPREAD_ROWS_MAX rows,
 *                               when two or more, one per thread in one OpenMP loop (oneDNN single-threaded
 *                               inside it, each thread with its own scratch part and stream); the others one
 *                               oneDNN call each over all threads (per row chunk in BF16 mode; per block of W
 *                               rows when a bf16 weight is widened)
 *
 * Bias: written into C before the product, which then accumulates (beta = 1); without bias and without
 * accumulate the beta = 0 primitive writes C directly.
 *
 * Scratch (one buffer in the context, one part per OpenMP thread, each sized by hp_linear_init for the largest
 * linear; 64-byte aligned parts; the streaming kernel's batches use part 0):
 *
 *   [ pieces: HP__ROW_CHUNK records ][ A rounded to bf16: HP__ROW_CHUNK × K f32 ][ W block: widen_rows × K
 *   f32 ][ oneDNN scratchpad ][ blocked kernel: packed W and A blocks ]   (the middle two and the last only when
 *   the linear's mode, dtype and CPU need them)
 */
#include "kernels/linalg_int.h"

#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    ALIGN = 64,      /* scratch parts and packed weights: a cache line, what oneDNN asks for */
    TILE = 16,       /* W rows per work item of the streaming kernel: 4 register tiles */
};
/* Below this many multiply-adds a batch runs on the calling thread: a parallel region costs a few µs. */
#define PAR_MIN_WORK ((int64_t)1 << 15)
/* Target bytes of one widened block of W (f32). Measured here (N = 768, K = 2048, M = 17..512): blocks of
 * 256 rows (2 MiB) ran at 80–98% of the f32 matmul on an f32 copy of W, blocks of 32 rows at 62–80%
 * (docs/kernels.md). */
#define WIDEN_BLOCK_BYTES ((int64_t)2 << 20)

typedef struct piece {
    const float *a;
    int64_t lda;
    float *c;
    int64_t ldc;
    int64_t m;
    const void *w;      /* the matrix's first row */
    const float *bias;  /* [N] or NULL */
} piece;

static size_t align_up(size_t n)
{
    return (n + ALIGN - 1) / ALIGN * ALIGN;
}

static size_t dtype_size(hp_dtype dt)
{
    return dt == HP_DT_F32 ? 4 : 2;
}

/* ---- the context ---- */

hp_status hp_linalg_create(hp_linalg **out, hp_err *err)
{
    *out = NULL;
    hp_linalg *ctx = hp_calloc(1, sizeof *ctx);
    if (!ctx) return hp_err_set(err, HP_ERR_NOMEM, "out of memory creating the GEMM context");
    hp_status st = hp__dnnl_create(&ctx->dnnl, err);
    if (st != HP_OK) {
        free(ctx);
        return st;
    }
    *out = ctx;
    return HP_OK;
}

void hp_linalg_destroy(hp_linalg *ctx)
{
    if (!ctx) return;
    HP_ASSERT(ctx->n_linears == 0);
    for (int64_t i = 0; i < ctx->n_mms; i++) hp__dnnl_mm_destroy(ctx->mms[i]);
    free(ctx->mms);
    free(ctx->scratch);
    hp__dnnl_destroy(ctx->dnnl);
    free(ctx);
}

const char *hp_linalg_describe(const hp_linalg *ctx, char *buf, size_t cap)
{
    (void)ctx; /* the process's figures: one context or another says the same */
    char v[64], isa[128];
    hp__cpu cpu;
    hp__cpu_detect(&cpu);
    hp_linalg_cpu_isa(isa, sizeof isa);
    char prod[160];
    snprintf(buf, cap, "%s, cpu %s [%s], bf16 kernel %s, bf16 products %s, %d OpenMP threads",
             hp__dnnl_version(v, sizeof v), cpu.brand[0] ? cpu.brand : "unknown", isa[0] ? isa : "no avx2",
             hp__isa_name(hp__isa_best()), hp_linalg_bf16_products(prod, sizeof prod), omp_get_max_threads());
    return buf;
}

static bool key_eq(const hp__dnnl_mm_key *a, const hp__dnnl_mm_key *b)
{
    return a->src == b->src && a->wei == b->wei && a->n == b->n && a->k == b->k && a->beta == b->beta &&
           a->packed == b->packed && a->m == b->m && a->lda == b->lda && a->ldc == b->ldc;
}

/* The cached primitive of key, if ctx has made it. */
static bool find_mm(const hp_linalg *ctx, const hp__dnnl_mm_key *key, const hp__dnnl_mm **out)
{
    for (int64_t i = 0; i < ctx->n_mms; i++)
        if (key_eq(hp__dnnl_mm_key_of(ctx->mms[i]), key)) {
            *out = ctx->mms[i];
            return true;
        }
    return false;
}

/* The cached primitive of key, made on first use; *unsupported (may be NULL) as hp__dnnl_mm_create sets it. */
static hp_status get_mm(hp_linalg *ctx, const hp__dnnl_mm_key *key, const hp__dnnl_mm **out, bool *unsupported,
                        hp_err *err)
{
    if (unsupported) *unsupported = false;
    if (find_mm(ctx, key, out)) return HP_OK;
    if (ctx->n_mms == ctx->cap_mms) {
        int64_t cap = ctx->cap_mms ? 2 * ctx->cap_mms : 8;
        hp__dnnl_mm **p = realloc(ctx->mms, (size_t)cap * sizeof *p);
        if (!p) return hp_err_set(err, HP_ERR_NOMEM, "out of memory growing the primitive cache");
        ctx->mms = p;
        ctx->cap_mms = cap;
    }
    hp__dnnl_mm *mm = NULL;
    hp_status st = hp__dnnl_mm_create(ctx->dnnl, key, &mm, unsupported, err);
    if (st != HP_OK) return st;
    ctx->mms[ctx->n_mms++] = mm;
    ctx->n_fixed += key->m > 0;
    *out = mm;
    return HP_OK;
}

/* The primitive of a fixed shape (key->m > 0, see HP__FIXED_M_MIN): cached, or made while ctx holds fewer than
 * HP__FIXED_MAX of them. False past the bound or when oneDNN refuses the shape: the caller then runs its
 * runtime-shape primitive. */
static bool fixed_mm(hp_linalg *ctx, const hp__dnnl_mm_key *key, const hp__dnnl_mm **out)
{
    hp_err e;
    return find_mm(ctx, key, out) || (ctx->n_fixed < HP__FIXED_MAX && get_mm(ctx, key, out, NULL, &e) == HP_OK);
}

/* Scratch of at least `bytes` for each of the OpenMP threads a call may use (and as many oneDNN streams). */
static hp_status reserve_scratch(hp_linalg *ctx, size_t bytes, hp_err *err)
{
    int slots = omp_get_max_threads() > ctx->n_slots ? omp_get_max_threads() : ctx->n_slots;
    size_t per = align_up(bytes > ctx->slot_bytes ? bytes : ctx->slot_bytes), total;
    if (per == ctx->slot_bytes && slots == ctx->n_slots) return HP_OK;
    hp_status st = hp__dnnl_reserve_streams(ctx->dnnl, slots, err);
    if (st != HP_OK) return st;
    if (!hp_mul_size(per, (size_t)slots, &total))
        return hp_err_set(err, HP_ERR_NOMEM, "GEMM scratch of %zu bytes for %d threads overflows a byte count", per,
                          slots);
    void *p = aligned_alloc(ALIGN, total ? total : ALIGN);
    if (!p) return hp_err_set(err, HP_ERR_NOMEM, "out of memory reserving %zu bytes of GEMM scratch", total);
    free(ctx->scratch);
    ctx->scratch = p;
    ctx->slot_bytes = per;
    ctx->n_slots = slots;
    return HP_OK;
}

/* ---- plain bf16 products (hp_linalg_gemm's BF16 mode) ---- */

/* The process's context of hp__plain_bf16: made at its first call, never freed (the primitives and the scratch
 * are reused by every later product; a process that trains keeps calling). g_plain_off: oneDNN has no bf16
 * matmul here, asked once. One thread calls at a time, as for every context. */
static hp_linalg *g_plain;
static bool g_plain_off;

static void scale_rows(int64_t m, int64_t n, float s, float *c, int64_t ldc)
{
    for (int64_t r = 0; r < m; r++)
        for (int64_t j = 0; j < n; j++) c[r * ldc + j] *= s;
}

bool hp__plain_bf16(bool fixed_ok, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    hp_err err;
    if (g_plain_off || !hp__bf16_dot_native()) return false; /* the caller's f32 product of rounded operands */
    if (!g_plain && hp_linalg_create(&g_plain, &err) != HP_OK) {
        g_plain_off = true;
        return false;
    }
    /* C (+)= A16 [m, k] · W16ᵀ with W16 [n, k] rows: B's transpose, whatever B's own layout */
    bool acc = beta != 0.0f;
    hp__dnnl_mm_key key = {.src = HP_DT_BF16, .wei = HP_DT_BF16, .n = HP__DNNL_RUNTIME_N, .k = k, .beta = acc};
    const hp__dnnl_mm *mm = NULL;
    /* With fixed_ok (hp__linalg_gemm), a large product takes a primitive of its own shape (brgemm; with a runtime
     * M oneDNN 2.6 runs gemm:jit, which measured 150-175 GFLOP/s against brgemm's ~400 on the backward of a
     * llama-3-8b layer); refused or past the bound, the runtime-shape one. The operands are packed in scratch: lda = k. */
    hp__dnnl_mm_key fixed = key;
    fixed.n = n, fixed.m = m, fixed.lda = k, fixed.ldc = ldc;
    if (fixed_ok && m >= HP__FIXED_M_MIN && fixed_mm(g_plain, &fixed, &mm)) key = fixed;
    bool unsupported = false;
    if (!mm && get_mm(g_plain, &key, &mm, &unsupported, &err) != HP_OK) {
        g_plain_off = unsupported;
        return false;
    }
    size_t a_off = 0, w_off = align_up((size_t)(m * k) * 2), d_off = w_off + align_up((size_t)(n * k) * 2);
    if (reserve_scratch(g_plain, d_off + hp__dnnl_mm_scratch_bytes(mm), &err) != HP_OK) return false;
    char *s = g_plain->scratch;
    uint16_t *a16 = (uint16_t *)(s + a_off), *w16 = (uint16_t *)(s + w_off);
    if (trans_a) hp__round_cols_bf16(k, m, a, lda, a16); /* A is stored [k, m] */
    else hp__round_rows_bf16(m, k, a, lda, a16);
    if (trans_b) hp__round_rows_bf16(n, k, b, ldb, w16); /* B is stored [n, k]: already W's rows */
    else hp__round_cols_bf16(k, n, b, ldb, w16);
    /* alpha·AB + beta·C = alpha·(AB + (beta / alpha)·C): C scaled first, the product added, then scaled */
    if (acc && beta != alpha) scale_rows(m, n, beta / alpha, c, ldc);
    if (hp__dnnl_mm_run(g_plain->dnnl, 0, mm, m, n, a16, k, w16, c, ldc, s + d_off, &err) != HP_OK) {
        if (acc && beta != alpha) scale_rows(m, n, alpha / beta, c, ldc); /* nearly as it was; never reached in
                                                                             practice (a created primitive runs) */
        return false;
    }
    if (alpha != 1.0f) scale_rows(m, n, alpha, c, ldc);
    return true;
}

/* ---- linears ---- */

/* Scratch parts of lin, as byte offsets from the context's buffer. */
typedef struct layout {
    size_t pieces, a, w, dnnl, uk, total;
} layout;

static layout layout_of(const hp_linear *lin)
{
    layout l;
    l.pieces = 0;
    l.a = align_up(l.pieces + HP__ROW_CHUNK * sizeof(piece));
    size_t a_bytes = lin->mode == HP_LINALG_BF16 ? (size_t)HP__ROW_CHUNK * (size_t)lin->k * sizeof(float) : 0;
    l.w = align_up(l.a + a_bytes);
    size_t w_bytes = lin->large == HP__LARGE_WIDEN ? (size_t)lin->widen_rows * (size_t)lin->k * sizeof(float) : 0;
    l.dnnl = align_up(l.w + w_bytes);
    size_t d = 0;
    for (int b = 0; b < 2; b++)
        if (lin->mm[b] && hp__dnnl_mm_scratch_bytes(lin->mm[b]) > d) d = hp__dnnl_mm_scratch_bytes(lin->mm[b]);
    l.uk = align_up(l.dnnl + d);
    l.total = l.uk + (lin->uk_ok ? hp__uk_scratch_bytes(lin->uk_kind) : 0);
    return l;
}

static void describe(hp_linear *lin)
{
    if (lin->small_m_max > 0)
        snprintf(lin->small_desc, sizeof lin->small_desc, "%s %s dot%s", hp__isa_name(lin->isa),
                 lin->wdt == HP_DT_BF16 ? "bf16" : "f32", lin->mode == HP_LINALG_BF16 ? ", A rounded to bf16" : "");
    else
        snprintf(lin->small_desc, sizeof lin->small_desc, "none");
    const char *impl = hp__dnnl_mm_impl(lin->mm[1]);
    const char *round = lin->mode == HP_LINALG_BF16 ? ", A rounded to bf16" : "";
    const char *packed = lin->packed ? ", weights packed" : "";
    char fixed[80] = "";
    if (lin->fixed_impl)
        snprintf(fixed, sizeof fixed, "; %s at fixed shapes of >= %d rows", lin->fixed_impl, HP__FIXED_M_MIN);
    char *d = lin->large_desc;
    size_t cap = sizeof lin->large_desc;
    /* the rows each algo of the blocked kernel takes, in hp__uk_algo_of's order: above the streaming kernel's
     * (small_m_max may be INT64_MAX: none) and above those of the algos before when they start there */
    int64_t lo_all = lin->small_m_max < INT64_MAX ? lin->small_m_max + 1 : INT64_MAX, next = lo_all;
    bool rest = true; /* some large rows are left for oneDNN */
    for (int a = 0; a < HP__UK_ALGOS; a++) {
        int64_t lo = lin->uk_min_m[a] > lo_all ? lin->uk_min_m[a] : lo_all, hi = lin->uk_max_m[a];
        if (lo < next) lo = next; /* the rows from lo_all to next are the algos' before */
        if (lin->uk_min_m[a] == INT64_MAX || lo > hi) continue;
        const char *name = hp__uk_name(lin->uk_kind, (hp__uk_algo)a);
        const char *uk_round = lin->uk_kind != HP__UK_BF16 ? round : ""; /* the BF16 kind's name says it */
        if (lo <= next && hi == INT64_MAX && d == lin->large_desc) { /* every large row count */
            snprintf(d, cap, "%s%s", name, uk_round);
            return;
        }
        if (lo <= next && hi == INT64_MAX) rest = false;
        int w = hi == INT64_MAX ? snprintf(d, cap, "%s%s at >= %lld rows; ", name, uk_round, (long long)lo)
                                : snprintf(d, cap, "%s%s at %lld..%lld rows; ", name, uk_round, (long long)lo,
                                           (long long)hi);
        if (lo <= next) next = hi == INT64_MAX ? INT64_MAX : hi + 1;
        if (w < 0 || (size_t)w >= cap) return;
        d += w;
        cap -= (size_t)w;
    }
    if (!rest) {
        d[-2] = '\0'; /* no "; " after the last */
        return;
    }
    if (d != lin->large_desc) {
        int w = snprintf(d, cap, "otherwise: ");
        d += w;
        cap -= (size_t)w;
    }
    switch (lin->large) {
    case HP__LARGE_WIDEN:
        snprintf(d, cap, "oneDNN %s f32, bf16 W widened in blocks of %lld rows%s",
                 impl, (long long)lin->widen_rows, round);
        break;
    case HP__LARGE_BF16:
        snprintf(d, cap, "oneDNN %s bf16 x bf16%s%s%s", impl, packed, round,
                 fixed);
        break;
    default:
        snprintf(d, cap, "oneDNN %s f32%s%s%s", impl, packed, round, fixed);
        break;
    }
}

static hp_status check_desc(const hp_linear_desc *d, int64_t *n_mats, size_t *w_bytes, hp_err *err)
{
    if (!d) return hp_err_set(err, HP_ERR_INPUT, "hp_linear_init: no description (NULL) was given.");
    if (d->dtype != HP_DT_F32 && d->dtype != HP_DT_BF16 && d->dtype != HP_DT_F16)
        return hp_err_set(err, HP_ERR_INPUT,
                          "hp_linear_init: weight dtype %s is not supported; the GEMM layer takes F32, BF16 or "
                          "F16 weights (convert other dtypes first).",
                          hp_dtype_name(d->dtype));
    if (d->n_out <= 0 || d->n_in <= 0)
        return hp_err_set(err, HP_ERR_INPUT,
                          "hp_linear_init: weight shape [N=%lld, K=%lld] has a dimension <= 0; both must be "
                          "at least 1.",
                          (long long)d->n_out, (long long)d->n_in);
    if (d->n_mats < 0)
        return hp_err_set(err, HP_ERR_INPUT, "hp_linear_init: n_mats is %lld; it must be >= 1 (0 counts as 1).",
                          (long long)d->n_mats);
    if ((unsigned)d->mode > HP_LINALG_BF16 || (unsigned)d->pack > HP_LINEAR_PACK_ALWAYS)
        return hp_err_set(err, HP_ERR_INPUT, "hp_linear_init: unknown mode (%d) or pack (%d) value.", (int)d->mode,
                          (int)d->pack);
    *n_mats = d->n_mats ? d->n_mats : 1;
    /* Element counts and the largest byte count anyone computes (f32, widened F16) must fit int64 and size_t. */
    int64_t nk, total, bytes;
    if (!hp_mul_i64(d->n_out, d->n_in, &nk) || !hp_mul_i64(nk, *n_mats, &total) || !hp_mul_i64(total, 4, &bytes) ||
        (uint64_t)bytes > (uint64_t)SIZE_MAX || !hp_mul_i64(d->n_in, HP__ROW_CHUNK * 4, &bytes))
        return hp_err_set(err, HP_ERR_INPUT,
                          "hp_linear_init: weights [%lld, %lld, %lld] of %s overflow a 64-bit byte count; the shape "
                          "is corrupt or far too large.",
                          (long long)*n_mats, (long long)d->n_out, (long long)d->n_in, hp_dtype_name(d->dtype));
    *w_bytes = (size_t)total * dtype_size(d->dtype);
    if (!d->w) return hp_err_set(err, HP_ERR_INPUT, "hp_linear_init: the weight pointer is NULL.");
    if ((uintptr_t)d->w % dtype_size(d->dtype) != 0)
        return hp_err_set(err, HP_ERR_INPUT,
                          "hp_linear_init: the %s weights at %p are not %zu-byte aligned; copy them to aligned "
                          "memory first.",
                          hp_dtype_name(d->dtype), d->w, dtype_size(d->dtype));
    if (d->bias && (uintptr_t)d->bias % sizeof(float) != 0)
        return hp_err_set(err, HP_ERR_INPUT, "hp_linear_init: the bias at %p is not 4-byte aligned.",
                          (const void *)d->bias);
    return HP_OK;
}

/* HP_GEMM in the environment (read once per process: contexts may be made on several threads at once): "onednn"
 * keeps every large product on oneDNN, "hyperpar" runs every one the blocked kernel can on it (HP__UK_PACK_A
 * where HP__UK_RULES says, HP__UK_PACK_W for the others); unset or empty, the defaults (HP__UK_RULES); anything
 * else -1, refused by hp_linear_init (a misspelt choice would otherwise measure the default silently). For
 * benchmarks (`hyperpar bench run` compares the two); tests use hp__linear_force_large instead. */
static int gemm_env;
static pthread_once_t gemm_env_once = PTHREAD_ONCE_INIT;

static void read_gemm_env(void)
{
    const char *e = getenv("HP_GEMM");
    gemm_env = !e || !e[0] ? 0 : !strcmp(e, "onednn") ? 1 : !strcmp(e, "hyperpar") ? 2 : -1;
}

static int env_gemm(void)
{
    pthread_once(&gemm_env_once, read_gemm_env);
    return gemm_env;
}

/* Chooses the large paths: the rows from which the blocked kernel takes a product (uk_min_m), and oneDNN's path
 * for the others, whose primitives are made in any case (hp__linear_force_large may switch to them); packs the
 * weights when that is oneDNN's choice. */
static hp_status prepare_large(hp_linear *lin, hp_linear_pack pack, hp_err *err)
{
    hp_linalg *ctx = lin->ctx;
    static const hp__uk_rule rules[] = HP__UK_RULES;
    if (env_gemm() < 0) {
        char v[64];
        hp_escape(getenv("HP_GEMM"), v, sizeof v);
        return hp_err_set(err, HP_ERR_INPUT, "HP_GEMM='%s' in the environment is neither 'onednn' nor 'hyperpar'; "
                          "unset it for the default choice of kernel by row count", v);
    }
    /* BF16 mode on a CPU whose vdpbf16ps is slower than f32 FMA: A rounded, then the EXACT path (WIDEN) */
    bool native = lin->mode == HP_LINALG_BF16 && hp__bf16_dot_native();
    lin->uk_kind = lin->wdt == HP_DT_F32 ? HP__UK_F32 : native ? HP__UK_BF16 : HP__UK_WIDEN;
    lin->uk_ok = hp__uk_available(lin->uk_kind);
    for (int a = 0; a < HP__UK_ALGOS; a++) lin->uk_min_m[a] = lin->uk_max_m[a] = INT64_MAX;
    bool set[HP__UK_ALGOS] = {false};
    for (size_t i = 0; lin->uk_ok && env_gemm() != 1 && i < sizeof rules / sizeof rules[0]; i++) {
        const hp__uk_rule *r = &rules[i];
        if (r->kind != lin->uk_kind || lin->k < r->min_k || set[r->algo]) continue;
        set[r->algo] = true;
        lin->uk_min_m[r->algo] = r->min_m;
        lin->uk_max_m[r->algo] = r->max_m;
    }
    if (lin->uk_ok && env_gemm() == 2) lin->uk_min_m[HP__UK_PACK_W] = 0, lin->uk_max_m[HP__UK_PACK_W] = INT64_MAX;
    hp__dnnl_mm_key key = {.src = HP_DT_F32, .wei = HP_DT_F32, .n = lin->n, .k = lin->k, .beta = true};
    lin->large = HP__LARGE_F32;
    if (lin->wdt == HP_DT_BF16) {
        key.src = key.wei = HP_DT_BF16;
        if (native && hp__dnnl_preferred(ctx->dnnl, &key) != HP__LAYOUT_UNSUPPORTED) {
            lin->large = HP__LARGE_BF16;
        } else {
            /* oneDNN 2.6 has no f32 × bf16 matmul (and no bf16 one without avx512_core), and BF16 mode may
             * multiply in f32 (hp__bf16_dot_native): widen. */
            lin->large = HP__LARGE_WIDEN;
            key.src = key.wei = HP_DT_F32;
            key.n = HP__DNNL_RUNTIME_N;
            int64_t rows = WIDEN_BLOCK_BYTES / (4 * lin->k) / 16 * 16;
            lin->widen_rows = rows < 16 ? 16 : rows > lin->n ? lin->n : rows;
        }
    }
    if (key.n != HP__DNNL_RUNTIME_N && pack != HP_LINEAR_PACK_NEVER) {
        hp__dnnl_layout l = hp__dnnl_preferred(ctx->dnnl, &key);
        key.packed = l == HP__LAYOUT_BLOCKED || (pack == HP_LINEAR_PACK_ALWAYS && l == HP__LAYOUT_PLAIN_OTHER);
    }
    hp_status st = get_mm(ctx, &key, &lin->mm[1], NULL, err);
    if (st != HP_OK) return st;
    if (!lin->bias) {
        key.beta = false;
        st = get_mm(ctx, &key, &lin->mm[0], NULL, err);
        if (st != HP_OK) return st;
        /* A packed layout chosen per primitive could differ between the two; then only beta = 1 is used. */
        if (key.packed && !hp__dnnl_mm_same_weights(lin->mm[0], lin->mm[1])) lin->mm[0] = NULL;
    }
    if (key.packed) {
        size_t per = hp__dnnl_mm_packed_bytes(lin->mm[1]), total;
        if (!hp_mul_size(align_up(per), (size_t)lin->n_mats, &total))
            return hp_err_set(err, HP_ERR_INPUT, "hp_linear_init: the packed weights overflow a byte count");
        lin->packed_mat_bytes = align_up(per);
        lin->packed = aligned_alloc(ALIGN, total ? total : ALIGN);
        if (!lin->packed) return hp_err_set(err, HP_ERR_NOMEM, "out of memory packing %zu bytes of weights", total);
        lin->owned_bytes += total;
        size_t es = dtype_size(lin->wdt);
        for (int64_t e = 0; e < lin->n_mats; e++) {
            const char *src = (const char *)lin->w + (size_t)e * (size_t)(lin->n * lin->k) * es;
            st = hp__dnnl_pack(ctx->dnnl, lin->mm[1], src, (char *)lin->packed + (size_t)e * lin->packed_mat_bytes,
                               err);
            if (st != HP_OK) return st;
        }
    }
    return HP_OK;
}

hp_status hp_linear_init(hp_linear **out, hp_linalg *ctx, const hp_linear_desc *d, hp_err *err)
{
    *out = NULL;
    int64_t n_mats = 1;
    size_t w_bytes = 0;
    if (!ctx) return hp_err_set(err, HP_ERR_INPUT, "hp_linear_init: no context (NULL) was given.");
    hp_status st = check_desc(d, &n_mats, &w_bytes, err);
    if (st != HP_OK) return st;
    hp_linear *lin = hp_calloc(1, sizeof *lin);
    if (!lin) return hp_err_set(err, HP_ERR_NOMEM, "out of memory creating a linear");
    lin->ctx = ctx;
    ctx->n_linears++;
    lin->n = d->n_out;
    lin->k = d->n_in;
    lin->n_mats = n_mats;
    lin->mode = d->mode;
    lin->w = d->w;
    lin->wdt = d->dtype == HP_DT_BF16 ? HP_DT_BF16 : HP_DT_F32;
    int64_t total = n_mats * d->n_out * d->n_in;
    if (d->dtype == HP_DT_F16) {
        lin->w_owned = malloc((size_t)total * sizeof(float));
        if (!lin->w_owned) {
            st = hp_err_set(err, HP_ERR_NOMEM, "out of memory widening %zu bytes of F16 weights", w_bytes);
            goto fail;
        }
        hp_dtype_to_f32(HP_DT_F16, d->w, lin->w_owned, total, NULL);
        lin->w = lin->w_owned;
        lin->owned_bytes += (size_t)total * sizeof(float);
    }
    if (lin->wdt == HP_DT_F32 && d->mode == HP_LINALG_BF16) {
        /* BF16 mode multiplies bf16 weights, as autocast casts an f32 weight for each product: an owned copy
         * rounded to nearest even, which then takes the bf16 paths (oneDNN bf16 x bf16, the streaming kernel) */
        uint16_t *r16 = malloc((size_t)total * sizeof *r16);
        if (!r16) {
            st = hp_err_set(err, HP_ERR_NOMEM, "out of memory rounding %zu bytes of weights to bf16", w_bytes);
            goto fail;
        }
        hp__round_rows_bf16(n_mats * d->n_out, d->n_in, lin->w, d->n_in, r16);
        if (lin->w_owned) lin->owned_bytes -= (size_t)total * sizeof(float);
        free(lin->w_owned);
        lin->w = lin->w_owned = r16;
        lin->wdt = HP_DT_BF16;
        lin->owned_bytes += (size_t)total * sizeof *r16;
    }
    if (d->bias) {
        size_t nb = (size_t)(n_mats * d->n_out) * sizeof(float);
        lin->bias = malloc(nb);
        if (!lin->bias) {
            st = hp_err_set(err, HP_ERR_NOMEM, "out of memory copying the bias");
            goto fail;
        }
        memcpy(lin->bias, d->bias, nb);
        lin->owned_bytes += nb;
    }
    lin->isa = hp__isa_best();
    lin->small_m_max = lin->wdt == HP_DT_BF16 ? HP__SMALL_M_MAX : 0;
    st = prepare_large(lin, d->pack, err);
    if (st != HP_OK) goto fail;
    st = reserve_scratch(ctx, layout_of(lin).total, err);
    if (st != HP_OK) goto fail;
    describe(lin);
    *out = lin;
    return HP_OK;
fail:
    hp_linear_free(lin);
    return st;
}

void hp_linear_free(hp_linear *lin)
{
    if (!lin) return;
    lin->ctx->n_linears--;
    free(lin->w_owned);
    free(lin->packed);
    free(lin->bias);
    free(lin);
}

const char *hp_linear_blocked_path(const hp_linear *lin, int64_t m)
{
    if (m <= lin->small_m_max) return NULL;
    for (int a = 0; a < HP__UK_ALGOS; a++) /* on_dnnl's rule: the first algo whose rows hold m */
        if (m >= lin->uk_min_m[a] && m <= lin->uk_max_m[a]) return hp__uk_name(lin->uk_kind, (hp__uk_algo)a);
    return NULL;
}

void hp_linear_get_info(const hp_linear *lin, hp_linear_info *info)
{
    memset(info, 0, sizeof *info);
    info->dtype = lin->wdt;
    info->mode = lin->mode;
    info->packed = lin->packed != NULL;
    info->owned_bytes = lin->owned_bytes;
    /* The caller's weights are read unless every path reads an owned copy. */
    bool reads_caller = lin->w != lin->w_owned && (!lin->packed || lin->small_m_max > 0);
    info->borrowed_bytes = reads_caller ? (size_t)(lin->n_mats * lin->n * lin->k) * dtype_size(lin->wdt) : 0;
    info->small_m_max = lin->small_m_max;
    info->small_path = lin->small_desc;
    info->large_path = lin->large_desc;
    info->fixed_impl = lin->fixed_impl;
}

hp_status hp__linear_force(hp_linear *lin, hp__isa isa, int64_t small_m_max, hp_err *err)
{
    if ((unsigned)isa >= HP__ISA_COUNT || !hp__isa_available(isa))
        return hp_err_set(err, HP_ERR_INPUT, "this CPU cannot run the %s kernel", hp__isa_name(isa));
    lin->isa = isa;
    lin->small_m_max = small_m_max < 0 ? 0 : small_m_max;
    describe(lin);
    return HP_OK;
}

hp_status hp__linear_force_large(hp_linear *lin, hp__force how, hp_err *err)
{
    if (how != HP__FORCE_ONEDNN && !lin->uk_ok)
        return hp_err_set(err, HP_ERR_INPUT, "the blocked kernel (%s) cannot run for this linear",
                          hp__uk_name(lin->uk_kind, HP__UK_PACK_W));
    for (int a = 0; a < HP__UK_ALGOS; a++) lin->uk_min_m[a] = lin->uk_max_m[a] = INT64_MAX;
    if (how != HP__FORCE_ONEDNN) {
        hp__uk_algo a = how == HP__FORCE_PACK_A ? HP__UK_PACK_A : HP__UK_PACK_W;
        lin->uk_min_m[a] = 0;
    }
    describe(lin);
    return HP_OK;
}

/* ---- forward ---- */

static const void *mat_rows(const hp_linear *lin, int64_t mat)
{
    return (const char *)lin->w + (size_t)(mat * lin->n * lin->k) * dtype_size(lin->wdt);
}

/* Before a beta = 1 product: C = bias (or C += bias with accumulate), or C = 0 when neither. */
static void prefill(int64_t m, int64_t n, const float *bias, float *c, int64_t ldc, bool acc)
{
    for (int64_t r = 0; r < m; r++) {
        float *cr = c + r * ldc;
        if (bias && acc)
            for (int64_t j = 0; j < n; j++) cr[j] += bias[j];
        else if (bias)
            memcpy(cr, bias, (size_t)n * sizeof *cr);
        else if (!acc)
            memset(cr, 0, (size_t)n * sizeof *cr);
    }
}

/* The streaming kernel over a batch of pieces: one parallel loop over (piece, tile of TILE W rows). */
static void run_pieces(const hp_linear *lin, const piece *p, int64_t n_pieces, int64_t rows, bool acc)
{
    int64_t n = lin->n, k = lin->k, tiles = (n + TILE - 1) / TILE, items = n_pieces * tiles;
    size_t es = dtype_size(lin->wdt);
    bool par = (double)rows * (double)n * (double)k >= (double)PAR_MIN_WORK;
#pragma omp parallel for schedule(static) if (par)
    for (int64_t it = 0; it < items; it++) {
        const piece *q = &p[it / tiles];
        int64_t j0 = it % tiles * TILE, nn = n - j0 < TILE ? n - j0 : TILE;
        float *c = q->c + j0;
        bool a2 = acc;
        if (q->bias) {
            prefill(q->m, nn, q->bias + j0, c, q->ldc, acc);
            a2 = true;
        }
        hp__dot_rows(lin->isa, lin->wdt, q->m, nn, k, q->a, q->lda, (const char *)q->w + (size_t)(j0 * k) * es, c,
                     q->ldc, a2);
    }
}

/* The primitive for a product of m rows at lda, ldc: mm[beta] itself, or (see HP__FIXED_M_MIN) the one made for
 * this exact shape, with the scratch grown for it. Only the calling thread, outside a loop over groups, may ask
 * for a fixed shape. A fixed shape that oneDNN refuses, or one past HP__FIXED_MAX, takes mm[beta]. */
static const hp__dnnl_mm *shaped(hp_linear *lin, bool beta, bool may_fix, int64_t m, int64_t lda, int64_t ldc)
{
    const hp__dnnl_mm *mm = lin->mm[beta];
    if (!may_fix || m < HP__FIXED_M_MIN || lin->packed || lin->large == HP__LARGE_WIDEN) return mm;
    hp_linalg *ctx = lin->ctx;
    hp__dnnl_mm_key key = *hp__dnnl_mm_key_of(mm);
    key.m = m, key.lda = lda, key.ldc = ldc;
    const hp__dnnl_mm *f = NULL;
    hp_err e;
    if (!fixed_mm(ctx, &key, &f)) return mm;
    if (reserve_scratch(ctx, layout_of(lin).dnnl + hp__dnnl_mm_scratch_bytes(f), &e) != HP_OK) return mm;
    if (!lin->fixed_impl) {
        lin->fixed_impl = hp__dnnl_mm_impl(f);
        describe(lin);
    }
    return f;
}

/* One group through oneDNN: m > small_m_max rows, with the scratch part and stream of `slot`; may_fix when the
 * calling thread runs it alone (slot 0, no loop over groups): then a large product takes a fixed-shape primitive. */
static hp_status run_large(hp_linear *lin, const hp_linear_group *g, bool acc, int slot, bool may_fix, hp_err *err)
{
    hp_linalg *ctx = lin->ctx;
    layout l = layout_of(lin);
    const float *bias = lin->bias ? lin->bias + g->mat * lin->n : NULL;
    bool beta = bias || acc || !lin->mm[0];
    const void *w = lin->packed ? (const char *)lin->packed + (size_t)g->mat * lin->packed_mat_bytes
                                : mat_rows(lin, g->mat);
    int64_t chunk = lin->mode == HP_LINALG_BF16 ? HP__ROW_CHUNK : g->m;
    for (int64_t r0 = 0; r0 < g->m; r0 += chunk) {
        int64_t m = g->m - r0 < chunk ? g->m - r0 : chunk;
        const void *a = g->a + r0 * g->lda;
        int64_t lda = g->lda;
        float *c = g->c + r0 * g->ldc;
        bool round = lin->mode == HP_LINALG_BF16;
        const hp__dnnl_mm *mm = shaped(lin, beta, may_fix, m, round ? lin->k : lda, g->ldc);
        char *scratch = (char *)ctx->scratch + (size_t)slot * ctx->slot_bytes; /* after shaped: it may grow */
        if (round) {
            if (lin->large == HP__LARGE_BF16)
                hp__round_rows_bf16(m, lin->k, a, lda, (uint16_t *)(scratch + l.a));
            else
                hp__round_rows_bf16_f32(m, lin->k, a, lda, (float *)(scratch + l.a));
            a = scratch + l.a;
            lda = lin->k;
        }
        if (beta) prefill(m, lin->n, bias, c, g->ldc, acc);
        hp_status st = HP_OK;
        if (lin->large != HP__LARGE_WIDEN) {
            st = hp__dnnl_mm_run(ctx->dnnl, slot, mm, m, lin->n, a, lda, w, c, g->ldc, scratch + l.dnnl, err);
        } else {
            float *wb = (float *)(scratch + l.w);
            for (int64_t n0 = 0; n0 < lin->n && st == HP_OK; n0 += lin->widen_rows) {
                int64_t bn = lin->n - n0 < lin->widen_rows ? lin->n - n0 : lin->widen_rows;
                const uint16_t *src = (const uint16_t *)w + n0 * lin->k;
#pragma omp parallel for schedule(static) if (bn * lin->k >= PAR_MIN_WORK)
                for (int64_t j = 0; j < bn; j++) hp__bf16_widen(lin->isa, src + j * lin->k, wb + j * lin->k, lin->k);
                st = hp__dnnl_mm_run(ctx->dnnl, slot, mm, m, bn, a, lda, wb, c + n0, g->ldc, scratch + l.dnnl, err);
            }
        }
        if (st != HP_OK) return st;
    }
    return HP_OK;
}

/* Every group of at most small_m_max rows, in batches for the streaming kernel: consecutive small groups (larger
 * ones are skipped), cut into pieces; in BF16 mode their rounded rows share the HP__ROW_CHUNK rows of slot 0's
 * scratch, so a group may be split across batches. */
static void run_small_batches(hp_linear *lin, const hp_linear_group *groups, int64_t n_groups, bool acc)
{
    layout l = layout_of(lin);
    char *scratch = lin->ctx->scratch;
    piece *pieces = (piece *)(scratch + l.pieces);
    bool round = lin->mode == HP_LINALG_BF16;
    int64_t g = 0, done = 0; /* group g, of which `done` rows are already computed */
    while (g < n_groups) {
        int64_t n_pieces = 0, rows = 0;
        while (g < n_groups && n_pieces < HP__ROW_CHUNK) {
            const hp_linear_group *gr = &groups[g];
            if (gr->m == 0 || gr->m > lin->small_m_max) {
                g++;
                continue;
            }
            int64_t take = gr->m - done;
            if (round && take > HP__ROW_CHUNK - rows) take = HP__ROW_CHUNK - rows;
            if (take == 0) break;
            piece *p = &pieces[n_pieces++];
            p->a = gr->a + done * gr->lda;
            p->lda = gr->lda;
            p->c = gr->c + done * gr->ldc;
            p->ldc = gr->ldc;
            p->m = take;
            p->w = mat_rows(lin, gr->mat);
            p->bias = lin->bias ? lin->bias + gr->mat * lin->n : NULL;
            if (round) {
                float *dst = (float *)(scratch + l.a) + rows * lin->k;
                hp__round_rows_bf16_f32(take, lin->k, p->a, p->lda, dst);
                p->a = dst;
                p->lda = lin->k;
            }
            rows += take;
            done += take;
            if (done == gr->m) {
                g++;
                done = 0;
            }
        }
        if (n_pieces) run_pieces(lin, pieces, n_pieces, rows, acc);
    }
}

/* Whether group g runs on oneDNN: more rows than the streaming kernel's, outside the blocked kernel's. */
static bool on_dnnl(const hp_linear *lin, const hp_linear_group *g)
{
    if (g->m <= lin->small_m_max) return false;
    for (int a = 0; a < HP__UK_ALGOS; a++)
        if (g->m >= lin->uk_min_m[a] && g->m <= lin->uk_max_m[a]) return false;
    return true;
}

/* Whether group g runs on one thread of a loop over groups (see run_large_groups). */
static bool spread(const hp_linear *lin, const hp_linear_group *g)
{
    return on_dnnl(lin, g) && g->m <= HP__SPREAD_ROWS_MAX;
}

/* Every group of more than small_m_max rows through oneDNN. When two or more have at most HP__SPREAD_ROWS_MAX
 * rows (the experts of a prefill: ~32 rows each at T = 512), one OpenMP loop over them runs each on one thread
 * (oneDNN runs single-threaded inside a parallel region) with that thread's scratch and stream: one parallel
 * region instead of one per group, and each expert's weights read by one core. Dynamic schedule, but each group's
 * result depends only on its own rows: bit-equal whatever the thread count (a one-group call may take another
 * oneDNN kernel for the shape, on AMX hosts a brgemm, and agrees within rounding only). The other large groups run
 * one after another, each over all threads. */
static hp_status run_large_groups(hp_linear *lin, const hp_linear_group *groups, int64_t n_groups, bool acc,
                                  hp_err *err)
{
    if (lin->uk_min_m[HP__UK_PACK_A] < INT64_MAX || lin->uk_min_m[HP__UK_PACK_W] < INT64_MAX) {
        /* the groups for the blocked kernel, in one parallel region over (group, column block) items */
        hp_linalg *ctx = lin->ctx;
        int nt = omp_get_max_threads() < ctx->n_slots ? omp_get_max_threads() : ctx->n_slots;
        hp__uk_call call = {.kind = lin->uk_kind, .n = lin->n, .k = lin->k, .w = lin->w, .bias = lin->bias,
                            .acc = acc, .round_a = lin->mode == HP_LINALG_BF16 && lin->uk_kind != HP__UK_BF16, .scratch = (char *)ctx->scratch + layout_of(lin).uk,
                            .slot_bytes = ctx->slot_bytes, .threads = nt};
        for (int a = 0; a < HP__UK_ALGOS; a++) {
            call.min_m[a] = lin->uk_min_m[a] == INT64_MAX           ? INT64_MAX /* none */
                            : lin->uk_min_m[a] - 1 > lin->small_m_max ? lin->uk_min_m[a] - 1
                                                                      : lin->small_m_max;
            call.max_m[a] = lin->uk_max_m[a];
        }
        hp__uk_gemm(&call, groups, n_groups);
    }
    int64_t n_spread = 0;
    for (int64_t i = 0; i < n_groups; i++) n_spread += spread(lin, &groups[i]);
    hp_status st = HP_OK;
    for (int64_t i = 0; i < n_groups && st == HP_OK; i++)
        if (on_dnnl(lin, &groups[i]) && (n_spread < 2 || !spread(lin, &groups[i])))
            st = run_large(lin, &groups[i], acc, 0, true, err);
    if (st != HP_OK || n_spread < 2) return st;
    int nt = omp_get_max_threads() < lin->ctx->n_slots ? omp_get_max_threads() : lin->ctx->n_slots;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
    for (int64_t i = 0; i < n_groups; i++) {
        hp_status seen;
#pragma omp atomic read
        seen = st;
        if (seen != HP_OK || !spread(lin, &groups[i])) continue;
        hp_err e;
        hp_status s = run_large(lin, &groups[i], acc, omp_get_thread_num(), false, &e);
        if (s != HP_OK) {
#pragma omp critical(hp_linear_group_err)
            if (st == HP_OK) {
                if (err) *err = e;
#pragma omp atomic write
                st = s;
            }
        }
    }
    return st;
}

static hp_status check_group(const hp_linear *lin, const hp_linear_group *g, int64_t i, hp_err *err)
{
    if (g->mat < 0 || g->mat >= lin->n_mats)
        return hp_err_set(err, HP_ERR_INPUT, "linear forward: group %lld asks for matrix %lld of a stack of %lld.",
                          (long long)i, (long long)g->mat, (long long)lin->n_mats);
    if (g->m < 0) return hp_err_set(err, HP_ERR_INPUT, "linear forward: group %lld has %lld rows.", (long long)i,
                                    (long long)g->m);
    if (g->m == 0) return HP_OK;
    if (!g->a || !g->c)
        return hp_err_set(err, HP_ERR_INPUT, "linear forward: group %lld has %lld rows but a NULL %s.", (long long)i,
                          (long long)g->m, g->a ? "C" : "A");
    int64_t span;
    if (g->lda < lin->k || g->ldc < lin->n || !hp_mul_i64(g->m, g->lda, &span) || !hp_mul_i64(g->m, g->ldc, &span))
        return hp_err_set(err, HP_ERR_INPUT,
                          "linear forward: group %lld has lda %lld and ldc %lld for %lld rows; they must be at least "
                          "K = %lld and N = %lld.",
                          (long long)i, (long long)g->lda, (long long)g->ldc, (long long)g->m, (long long)lin->k,
                          (long long)lin->n);
    return HP_OK;
}

hp_status hp_linear_forward_grouped(hp_linear *lin, const hp_linear_group *groups, int64_t n_groups, bool acc,
                                    hp_err *err)
{
    if (n_groups < 0 || (n_groups > 0 && !groups))
        return hp_err_set(err, HP_ERR_INPUT, "linear forward: %lld groups at %p.", (long long)n_groups,
                          (const void *)groups);
    for (int64_t i = 0; i < n_groups; i++) {
        hp_status st = check_group(lin, &groups[i], i, err);
        if (st != HP_OK) return st;
    }
    run_small_batches(lin, groups, n_groups, acc);
    return run_large_groups(lin, groups, n_groups, acc, err);
}

hp_status hp_linear_forward(hp_linear *lin, int64_t mat, int64_t m, const float *a, int64_t lda, float *c,
                            int64_t ldc, bool accumulate, hp_err *err)
{
    hp_linear_group g = {.mat = mat, .m = m, .a = a, .lda = lda, .c = c, .ldc = ldc};
    return hp_linear_forward_grouped(lin, &g, 1, accumulate, err);
}
