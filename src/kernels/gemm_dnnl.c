/*
 * gemm_dnnl.c — the oneDNN backend, and the only file that includes <oneapi/dnnl/dnnl.h> (C API v2, as in
 * Debian 12's oneDNN 2.6): a move to the v3 API is this file's work.
 *
 * One matmul primitive per key (src and weight dtypes, N, K, beta, layout), made with a runtime M
 * (DNNL_RUNTIME_DIM_VAL) and runtime row strides, so the one primitive serves every call whatever its row
 * count, lda and ldc; or, for large products, with the fixed M and strides of the key (oneDNN 2.6 picks its
 * brgemm kernels only for fixed shapes, gemm:jit for runtime ones). oneDNN's matmul sees
 *
 *   src     [M, K]  f32 or bf16, row stride lda          (runtime)
 *   weights [K, N]  the caller's W [N, K] rows are the strides {1, K} of this; or a packed layout
 *   dst     [M, N]  f32, row stride ldc                  (runtime)
 *
 * beta adds a sum post-op: dst += src · weights. The scratchpad is in user mode, so oneDNN takes the
 * caller's scratch instead of allocating one per execution (which is what library mode does in a build
 * with concurrent execution, as Debian's is).
 *
 * Per call, oneDNN v2 needs a memory object for each argument (a descriptor and a pointer; it cannot be
 * re-pointed at another shape), so each call creates and destroys three or four small objects; the data
 * buffers are the caller's. (gemm:jit, the only f32 matmul on AVX2, also mallocs its packing buffers
 * inside each execution, whatever the scratchpad mode: docs/kernels.md has the counts.)
 */
#include "kernels/linalg_int.h"

#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct hp__dnnl {
    dnnl_engine_t engine;
    dnnl_stream_t *streams; /* [n_streams]: one per slot, so that the threads of a parallel loop each run
                               primitives on their own stream */
    int n_streams;
};

struct hp__dnnl_mm {
    hp__dnnl_mm_key key;
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t prim;
    dnnl_memory_desc_t wmd; /* the weights as the primitive reads them (packed or [N, K] rows) */
    size_t scratch_bytes, packed_bytes;
    char impl[64];
};

static const char *status_name(dnnl_status_t s)
{
    switch (s) {
    case dnnl_success: return "success";
    case dnnl_out_of_memory: return "out of memory";
    case dnnl_invalid_arguments: return "invalid arguments";
    case dnnl_unimplemented: return "unimplemented (no kernel for these data types on this CPU)";
    case dnnl_runtime_error: return "runtime error";
    default: return "error";
    }
}

static dnnl_data_type_t dt_of(hp_dtype dt)
{
    return dt == HP_DT_BF16 ? dnnl_bf16 : dnnl_f32;
}

hp_status hp__dnnl_create(hp__dnnl **out, hp_err *err)
{
    *out = NULL;
    hp__dnnl *d = hp_calloc(1, sizeof *d);
    if (!d) return hp_err_set(err, HP_ERR_NOMEM, "out of memory creating the oneDNN context");
    dnnl_status_t s = dnnl_engine_create(&d->engine, dnnl_cpu, 0);
    if (s != dnnl_success) {
        hp__dnnl_destroy(d);
        return hp_err_set(err, HP_ERR_IO, "oneDNN could not create its CPU engine: %s", status_name(s));
    }
    hp_status st = hp__dnnl_reserve_streams(d, 1, err);
    if (st != HP_OK) {
        hp__dnnl_destroy(d);
        return st;
    }
    *out = d;
    return HP_OK;
}

hp_status hp__dnnl_reserve_streams(hp__dnnl *d, int n, hp_err *err)
{
    if (n <= d->n_streams) return HP_OK;
    dnnl_stream_t *p = realloc(d->streams, (size_t)n * sizeof *p);
    if (!p) return hp_err_set(err, HP_ERR_NOMEM, "out of memory growing oneDNN's streams");
    d->streams = p;
    for (; d->n_streams < n; d->n_streams++) {
        dnnl_status_t s = dnnl_stream_create(&d->streams[d->n_streams], d->engine, dnnl_stream_default_flags);
        if (s != dnnl_success)
            return hp_err_set(err, HP_ERR_IO, "oneDNN could not create a CPU stream: %s", status_name(s));
    }
    return HP_OK;
}

void hp__dnnl_destroy(hp__dnnl *d)
{
    if (!d) return;
    for (int i = 0; i < d->n_streams; i++) dnnl_stream_destroy(d->streams[i]);
    free(d->streams);
    if (d->engine) dnnl_engine_destroy(d->engine);
    free(d);
}

static const char *isa_name(dnnl_cpu_isa_t isa)
{
    switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "generic";
    }
}

const char *hp__dnnl_version(char *buf, size_t cap)
{
    const dnnl_version_t *v = dnnl_version();
    snprintf(buf, cap, "oneDNN %d.%d.%d (isa %s)", v->major, v->minor, v->patch,
             isa_name(dnnl_get_effective_cpu_isa()));
    return buf;
}

/* The matmul descriptor of key: runtime M and row strides, or the key's fixed ones; N runtime when the key says
 * so. */
static dnnl_status_t desc_of(const hp__dnnl_mm_key *key, bool any_weights, dnnl_matmul_desc_t *md)
{
    const dnnl_dim_t RT = DNNL_RUNTIME_DIM_VAL, n = key->n == HP__DNNL_RUNTIME_N ? RT : key->n;
    bool fixed = key->m > 0;
    dnnl_dims_t sdims = {fixed ? key->m : RT, key->k}, sstr = {fixed ? key->lda : RT, 1};
    dnnl_dims_t wdims = {key->k, n}, wstr = {1, key->k};
    dnnl_dims_t ddims = {fixed ? key->m : RT, n}, dstr = {fixed ? key->ldc : RT, 1};
    dnnl_memory_desc_t s, w, dst;
    dnnl_status_t st = dnnl_memory_desc_init_by_strides(&s, 2, sdims, dt_of(key->src), sstr);
    if (st == dnnl_success) {
        if (any_weights)
            st = dnnl_memory_desc_init_by_tag(&w, 2, wdims, dt_of(key->wei), dnnl_format_tag_any);
        else
            st = dnnl_memory_desc_init_by_strides(&w, 2, wdims, dt_of(key->wei), wstr);
    }
    if (st == dnnl_success) st = dnnl_memory_desc_init_by_strides(&dst, 2, ddims, dnnl_f32, dstr);
    if (st == dnnl_success) st = dnnl_matmul_desc_init(md, &s, &w, NULL, &dst);
    return st;
}

static dnnl_status_t pd_of(hp__dnnl *d, const hp__dnnl_mm_key *key, bool any_weights, dnnl_primitive_desc_t *pd)
{
    *pd = NULL;
    dnnl_matmul_desc_t md;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_status_t st = desc_of(key, any_weights, &md);
    if (st == dnnl_success) st = dnnl_primitive_attr_create(&attr);
    if (st == dnnl_success) st = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (st == dnnl_success && key->beta) {
        st = dnnl_post_ops_create(&po);
        if (st == dnnl_success) st = dnnl_post_ops_append_sum(po, 1.0f);
        if (st == dnnl_success) st = dnnl_primitive_attr_set_post_ops(attr, po);
    }
    if (st == dnnl_success) st = dnnl_primitive_desc_create(pd, &md, attr, d->engine, NULL);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return st;
}

hp__dnnl_layout hp__dnnl_preferred(hp__dnnl *d, const hp__dnnl_mm_key *key)
{
    if (key->n == HP__DNNL_RUNTIME_N) return HP__LAYOUT_ROWS; /* no layout choice without N */
    dnnl_primitive_desc_t pd;
    if (pd_of(d, key, true, &pd) != dnnl_success) return HP__LAYOUT_UNSUPPORTED;
    const dnnl_memory_desc_t *w = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    hp__dnnl_layout l = HP__LAYOUT_BLOCKED;
    if (w && w->format_kind == dnnl_blocked && w->format_desc.blocking.inner_nblks == 0) {
        /* The same bytes as [N, K] rows when every dimension longer than 1 has the rows' stride. */
        const dnnl_dim_t *s = w->format_desc.blocking.strides;
        bool rows = (key->k == 1 || s[0] == 1) && (key->n == 1 || s[1] == key->k);
        l = rows ? HP__LAYOUT_ROWS : HP__LAYOUT_PLAIN_OTHER;
    }
    dnnl_primitive_desc_destroy(pd);
    return l;
}

hp_status hp__dnnl_mm_create(hp__dnnl *d, const hp__dnnl_mm_key *key, hp__dnnl_mm **out, bool *unsupported,
                             hp_err *err)
{
    *out = NULL;
    if (unsupported) *unsupported = false;
    hp__dnnl_mm *mm = hp_calloc(1, sizeof *mm);
    if (!mm) return hp_err_set(err, HP_ERR_NOMEM, "out of memory creating a oneDNN matmul");
    mm->key = *key;
    bool any = key->packed && key->n != HP__DNNL_RUNTIME_N;
    dnnl_status_t st = pd_of(d, key, any, &mm->pd);
    if (st == dnnl_success) st = dnnl_primitive_create(&mm->prim, mm->pd);
    if (st != dnnl_success) {
        if (unsupported) *unsupported = st == dnnl_unimplemented;
        hp__dnnl_mm_destroy(mm);
        char n[32];
        if (key->n == HP__DNNL_RUNTIME_N)
            snprintf(n, sizeof n, "runtime");
        else
            snprintf(n, sizeof n, "%lld", (long long)key->n);
        return hp_err_set(err, HP_ERR_IO,
                          "oneDNN refused the matmul [M, K=%lld] x [K, N=%s] (src %s, weights %s, dst F32%s): %s",
                          (long long)key->k, n, hp_dtype_name(key->src), hp_dtype_name(key->wei),
                          key->beta ? ", accumulate" : "", status_name(st));
    }
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(mm->pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success || !impl) impl = "?";
    snprintf(mm->impl, sizeof mm->impl, "%s", impl);
    const dnnl_memory_desc_t *w = dnnl_primitive_desc_query_md(mm->pd, dnnl_query_weights_md, 0);
    const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(mm->pd, dnnl_query_scratchpad_md, 0);
    mm->wmd = *w;
    mm->packed_bytes = any ? dnnl_memory_desc_get_size(w) : 0;
    mm->scratch_bytes = sp ? dnnl_memory_desc_get_size(sp) : 0;
    *out = mm;
    return HP_OK;
}

void hp__dnnl_mm_destroy(hp__dnnl_mm *mm)
{
    if (!mm) return;
    if (mm->prim) dnnl_primitive_destroy(mm->prim);
    if (mm->pd) dnnl_primitive_desc_destroy(mm->pd);
    free(mm);
}

const hp__dnnl_mm_key *hp__dnnl_mm_key_of(const hp__dnnl_mm *mm)
{
    return &mm->key;
}

const char *hp__dnnl_mm_impl(const hp__dnnl_mm *mm)
{
    return mm->impl;
}

size_t hp__dnnl_mm_scratch_bytes(const hp__dnnl_mm *mm)
{
    return mm->scratch_bytes;
}

size_t hp__dnnl_mm_packed_bytes(const hp__dnnl_mm *mm)
{
    return mm->packed_bytes;
}

bool hp__dnnl_mm_same_weights(const hp__dnnl_mm *a, const hp__dnnl_mm *b)
{
    return dnnl_memory_desc_equal(&a->wmd, &b->wmd) != 0;
}

/* The caller's [N, K] rows of the weights as oneDNN's [K, N] with strides {1, K}. */
static dnnl_status_t rows_md(const hp__dnnl_mm_key *key, int64_t n, dnnl_memory_desc_t *md)
{
    dnnl_dims_t dims = {key->k, n}, str = {1, key->k};
    return dnnl_memory_desc_init_by_strides(md, 2, dims, dt_of(key->wei), str);
}

hp_status hp__dnnl_pack(hp__dnnl *d, const hp__dnnl_mm *mm, const void *w_rows, void *w_packed, hp_err *err)
{
    dnnl_memory_desc_t src;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_memory_t ms = NULL, md = NULL;
    dnnl_status_t st = rows_md(&mm->key, mm->key.n, &src);
    if (st == dnnl_success) st = dnnl_reorder_primitive_desc_create(&pd, &src, d->engine, &mm->wmd, d->engine, NULL);
    if (st == dnnl_success) st = dnnl_primitive_create(&prim, pd);
    if (st == dnnl_success) st = dnnl_memory_create(&ms, &src, d->engine, (void *)w_rows);
    if (st == dnnl_success) st = dnnl_memory_create(&md, &mm->wmd, d->engine, w_packed);
    if (st == dnnl_success) {
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, ms}, {DNNL_ARG_TO, md}};
        st = dnnl_primitive_execute(prim, d->streams[0], 2, args);
    }
    if (st == dnnl_success) st = dnnl_stream_wait(d->streams[0]);
    if (md) dnnl_memory_destroy(md);
    if (ms) dnnl_memory_destroy(ms);
    if (prim) dnnl_primitive_destroy(prim);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (st != dnnl_success)
        return hp_err_set(err, HP_ERR_IO,
                          "oneDNN could not reorder a [%lld, %lld] %s weight into its packed layout: %s",
                          (long long)mm->key.n, (long long)mm->key.k, hp_dtype_name(mm->key.wei), status_name(st));
    return HP_OK;
}

hp_status hp__dnnl_mm_run(hp__dnnl *d, int slot, const hp__dnnl_mm *mm, int64_t m, int64_t n, const void *a,
                          int64_t lda, const void *w, float *c, int64_t ldc, void *scratch, hp_err *err)
{
    HP_ASSERT(slot >= 0 && slot < d->n_streams);
    dnnl_stream_t stream = d->streams[slot];
    const hp__dnnl_mm_key *key = &mm->key;
    HP_ASSERT(key->m == 0 || (m == key->m && lda == key->lda && ldc == key->ldc));
    dnnl_dims_t sdims = {m, key->k}, sstr = {lda, 1}, ddims = {m, n}, dstr = {ldc, 1};
    dnnl_memory_desc_t smd, wmd = mm->wmd, dmd;
    dnnl_memory_t ms = NULL, mw = NULL, md = NULL, msp = NULL;
    dnnl_status_t st = dnnl_memory_desc_init_by_strides(&smd, 2, sdims, dt_of(key->src), sstr);
    if (st == dnnl_success) st = dnnl_memory_desc_init_by_strides(&dmd, 2, ddims, dnnl_f32, dstr);
    if (st == dnnl_success && key->n == HP__DNNL_RUNTIME_N) st = rows_md(key, n, &wmd);
    if (st == dnnl_success) st = dnnl_memory_create(&ms, &smd, d->engine, (void *)a);
    if (st == dnnl_success) st = dnnl_memory_create(&mw, &wmd, d->engine, (void *)w);
    if (st == dnnl_success) st = dnnl_memory_create(&md, &dmd, d->engine, c);
    if (st == dnnl_success && mm->scratch_bytes > 0) {
        const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(mm->pd, dnnl_query_scratchpad_md, 0);
        st = dnnl_memory_create(&msp, sp, d->engine, scratch);
    }
    if (st == dnnl_success) {
        dnnl_exec_arg_t args[4] = {
            {DNNL_ARG_SRC, ms}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DST, md}, {DNNL_ARG_SCRATCHPAD, msp}};
        st = dnnl_primitive_execute(mm->prim, stream, msp ? 4 : 3, args);
    }
    if (st == dnnl_success) st = dnnl_stream_wait(stream);
    if (msp) dnnl_memory_destroy(msp);
    if (md) dnnl_memory_destroy(md);
    if (mw) dnnl_memory_destroy(mw);
    if (ms) dnnl_memory_destroy(ms);
    if (st != dnnl_success)
        return hp_err_set(err, HP_ERR_IO, "oneDNN matmul [%lld, %lld] x [%lld, %lld] (%s) failed: %s", (long long)m,
                          (long long)key->k, (long long)key->k, (long long)n, mm->impl, status_name(st));
    return HP_OK;
}

/* ---- plain f32 products (hyperpar/linalg.h): oneDNN's BLAS-like sgemm, row-major, transposes read in place ---- */

static void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                  const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (m <= 0 || n <= 0) return;
    if (dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) != dnnl_success)
        hp__blas_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void hp_linalg_sgemm(bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                     const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    sgemm(false, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void hp_linalg_sgemm_tn(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                        int64_t ldb, float beta, float *c, int64_t ldc)
{
    sgemm(true, false, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* A's stored block ([rows, cols] at lda) rounded to bf16 values, packed into r: the operand of a BF16-mode
 * product. */
static void round_into(int64_t rows, int64_t cols, const float *a, int64_t lda, float *r)
{
    enum { BLOCK = 64 }; /* rows per task */
#pragma omp parallel for schedule(static) if (rows * cols >= (int64_t)1 << 16)
    for (int64_t r0 = 0; r0 < rows; r0 += BLOCK)
        hp__round_rows_bf16_f32(rows - r0 < BLOCK ? rows - r0 : BLOCK, cols, a + r0 * lda, lda, r + r0 * cols);
}

/* The rounded operands' buffer: outside a parallel region the process's, grown and kept (a training step calls
 * with the same shapes every step; fresh pages would be zeroed by the kernel on every call, ~6% of a llama-3-8b
 * layer's bf16 step), inside one a buffer of the caller's own (*own, freed by it). The calling thread is the only
 * one outside a parallel region, as for hp__plain_bf16's context. */
static float *g_round;
static size_t g_round_n;

static float *round_buffer(size_t n, bool *own)
{
    *own = omp_in_parallel();
    if (*own) return malloc(n * sizeof(float));
    if (n > g_round_n) {
        float *p = realloc(g_round, n * sizeof *p);
        if (!p) return NULL;
        g_round = p, g_round_n = n;
    }
    return g_round;
}

hp_status hp_linalg_gemm(hp_linalg_mode mode, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                         float alpha, const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                         int64_t ldc, hp_err *err)
{
    return hp__linalg_gemm(mode, false, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, err);
}

hp_status hp__linalg_gemm(hp_linalg_mode mode, bool fixed, bool trans_a, bool trans_b, int64_t m, int64_t n,
                          int64_t k, float alpha, const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                          float *c, int64_t ldc, hp_err *err)
{
    if (mode != HP_LINALG_BF16 || m <= 0 || n <= 0 || k <= 0) {
        sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return HP_OK;
    }
    if (hp__plain_bf16(fixed, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)) return HP_OK;
    /* Without oneDNN's bf16 matmul, or where f32 FMA outruns vdpbf16ps (hp__bf16_dot_native): products of bf16
     * values are exact in f32, so an f32 product of the rounded operands is a bf16 product with f32 sums. */
    int64_t ar = trans_a ? k : m, ac = trans_a ? m : k, br = trans_b ? n : k, bc = trans_b ? k : n;
    bool own;
    float *ra = round_buffer((size_t)(ar * ac) + (size_t)(br * bc), &own), *rb = ra ? ra + ar * ac : NULL;
    if (!ra)
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory rounding the operands of a [%lld, %lld] x [%lld, %lld] "
                          "product to bf16", (long long)m, (long long)k, (long long)k, (long long)n);
    round_into(ar, ac, a, lda, ra);
    round_into(br, bc, b, ldb, rb);
    sgemm(trans_a, trans_b, m, n, k, alpha, ra, ac, rb, bc, beta, c, ldc);
    if (own) free(ra);
    return HP_OK;
}
