/*
 * gguf_build.h — GGUF files built in memory for the tests (test_gguf.c, test_convert.c): key/values and tensor
 * infos are encoded as they are added, the tensor data is placed at 32-byte aligned offsets, and gf_image lays
 * out header + key/values + infos + padding + data. Raw byte helpers (gb_*) build deliberately broken files.
 *
 *   gfile g = {0};
 *   gf_kv_str(&g, "general.architecture", "llama");
 *   gf_tensor(&g, "w", 2, (uint64_t[]){4, 2}, HP_GGML_F32, data, 32);
 *   size_t len; unsigned char *img = gf_image(&g, &len);   (free it; gf_free(&g))
 */
#ifndef HP_TESTS_GGUF_BUILD_H
#define HP_TESTS_GGUF_BUILD_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hyperpar/gguf.h"

typedef struct gb {
    unsigned char *b;
    size_t n, cap;
} gb;

static void gb_put(gb *g, const void *p, size_t n)
{
    if (g->n + n > g->cap) {
        g->cap = (g->n + n) * 2 + 64;
        g->b = realloc(g->b, g->cap);
    }
    if (n) memcpy(g->b + g->n, p, n);
    g->n += n;
}

static void gb_u8(gb *g, uint8_t v) { gb_put(g, &v, 1); }

static void gb_u32(gb *g, uint32_t v)
{
    unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16), (unsigned char)(v >> 24)};
    gb_put(g, b, 4);
}

static void gb_u64(gb *g, uint64_t v)
{
    gb_u32(g, (uint32_t)v);
    gb_u32(g, (uint32_t)(v >> 32));
}

static void gb_strn(gb *g, const char *s, size_t n)
{
    gb_u64(g, n);
    gb_put(g, s, n);
}

static void gb_str(gb *g, const char *s) { gb_strn(g, s, strlen(s)); }

static void gb_pad(gb *g, size_t align)
{
    while (g->n % align) gb_u8(g, 0);
}

typedef struct gfile {
    gb kv, ti, data;
    uint64_t n_kv, n_t;
    uint32_t version; /* 0: 3 */
} gfile;

static void gf_key(gfile *f, const char *key, hp_gguf_vtype t)
{
    gb_str(&f->kv, key);
    gb_u32(&f->kv, (uint32_t)t);
    f->n_kv++;
}

static void gf_kv_u32(gfile *f, const char *key, uint32_t v)
{
    gf_key(f, key, HP_GGUF_U32);
    gb_u32(&f->kv, v);
}

static void gf_kv_f32(gfile *f, const char *key, float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    gf_key(f, key, HP_GGUF_F32);
    gb_u32(&f->kv, u);
}

static void gf_kv_bool(gfile *f, const char *key, int v)
{
    gf_key(f, key, HP_GGUF_BOOL);
    gb_u8(&f->kv, (uint8_t)v);
}

static void gf_kv_str(gfile *f, const char *key, const char *v)
{
    gf_key(f, key, HP_GGUF_STRING);
    gb_str(&f->kv, v);
}

static void gf_kv_strs(gfile *f, const char *key, const char *const *v, size_t n)
{
    gf_key(f, key, HP_GGUF_ARRAY);
    gb_u32(&f->kv, HP_GGUF_STRING);
    gb_u64(&f->kv, n);
    for (size_t i = 0; i < n; i++) gb_str(&f->kv, v[i]);
}

static void gf_kv_i32s(gfile *f, const char *key, const int32_t *v, size_t n)
{
    gf_key(f, key, HP_GGUF_ARRAY);
    gb_u32(&f->kv, HP_GGUF_I32);
    gb_u64(&f->kv, n);
    for (size_t i = 0; i < n; i++) gb_u32(&f->kv, (uint32_t)v[i]);
}

/* A tensor of nbytes bytes (zeros when data is NULL) at the next 32-byte aligned offset of the data section. */
static void gf_tensor(gfile *f, const char *name, int n_dims, const uint64_t *ne, uint32_t type, const void *data,
                      size_t nbytes)
{
    gb_str(&f->ti, name);
    gb_u32(&f->ti, (uint32_t)n_dims);
    for (int d = 0; d < n_dims; d++) gb_u64(&f->ti, ne[d]);
    gb_u32(&f->ti, type);
    gb_u64(&f->ti, f->data.n);
    if (data) {
        gb_put(&f->data, data, nbytes);
    } else {
        for (size_t i = 0; i < nbytes; i++) gb_u8(&f->data, 0);
    }
    gb_pad(&f->data, 32);
    f->n_t++;
}

/* The whole file (malloc'd); *data_at: where the data section begins. */
static unsigned char *gf_image_at(const gfile *f, size_t *len, size_t *data_at)
{
    gb o = {0};
    gb_put(&o, "GGUF", 4);
    gb_u32(&o, f->version ? f->version : 3);
    gb_u64(&o, f->n_t);
    gb_u64(&o, f->n_kv);
    gb_put(&o, f->kv.b, f->kv.n);
    gb_put(&o, f->ti.b, f->ti.n);
    gb_pad(&o, 32);
    if (data_at) *data_at = o.n;
    gb_put(&o, f->data.b, f->data.n);
    *len = o.n;
    return o.b ? o.b : calloc(1, 1);
}

static unsigned char *gf_image(const gfile *f, size_t *len) { return gf_image_at(f, len, NULL); }

static void gf_free(gfile *f)
{
    free(f->kv.b);
    free(f->ti.b);
    free(f->data.b);
    memset(f, 0, sizeof *f);
}

#endif
