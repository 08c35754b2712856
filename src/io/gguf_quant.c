/*
 * gguf_quant.c — ggml's tensor types (names, block sizes) and dequantization of the common ones to f32.
 *
 * A quantized tensor is a sequence of blocks; each block encodes a fixed number of consecutive elements of one
 * row (a row, ne[0] elements, is a whole number of blocks). Layouts (all little-endian; f16 = IEEE half):
 *
 *   Q8_0  34 B / 32:   f16 d | i8 q[32]                       x[j] = q[j] * d
 *   Q4_0  18 B / 32:   f16 d | u8 qs[16]                      x[j] = d * ((qs[j] & 15) - 8),
 *                                                              x[j + 16] = d * ((qs[j] >> 4) - 8)
 *   Q4_1  20 B / 32:   f16 d | f16 m | u8 qs[16]              x[j] = d * (qs[j] & 15) + m, x[j + 16] likewise
 *                                                              with the high nibble
 *   Q4_K 144 B / 256:  f16 d | f16 dmin | u8 scales[12] | u8 qs[128]
 *                      eight sub-blocks of 32 with 6-bit scale sc[k] and min m[k] packed in scales:
 *                        k < 4:  sc = s[k] & 63,                          m = s[k + 4] & 63
 *                        k >= 4: sc = (s[k + 4] & 15) | (s[k - 4] >> 6) << 4, m = (s[k + 4] >> 4) | (s[k] >> 6) << 4
 *                      sub-block k takes the low (k even) or high (k odd) nibbles of qs[32 (k / 2) ...+ 32]:
 *                        x[32 k + l] = (d * sc[k]) * q - dmin * m[k]
 *   Q6_K 210 B / 256:  u8 ql[128] | u8 qh[64] | i8 scales[16] | f16 d
 *                      element e = 128 h + 32 s + l (h < 2, s < 4, l < 32):
 *                        low 4 bits  (ql[64 h + 32 (s % 2) + l] >> 4 (s / 2)) & 15
 *                        high 2 bits (qh[32 h + l] >> 2 s) & 3
 *                        x[e] = (d * scales[e / 16]) * (q - 32)
 *   BF16: the top half of an f32; F16: IEEE half; F32: as is.
 *
 * Bit-exactness: the gguf Python package (gguf.quants.dequantize) computes each of these in float32 numpy, one
 * rounding per operation in the order written above. This file does the same operations in the same order and
 * turns floating-point contraction off, so that no compiler fuses a multiply and an add into one rounding.
 */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "hyperpar/gguf.h"

#include <string.h>

typedef struct type_info {
    const char *name; /* NULL: not a type (a number ggml removed or never used) */
    int64_t block_elems, block_bytes;
    bool dequant;
} type_info;

/* Sizes from ggml's type traits (the gguf package's GGML_QUANT_SIZES); QK_K, the super-block, is 256. */
static const type_info g_types[HP_GGML_TYPE_END] = {
    [HP_GGML_F32] = {"F32", 1, 4, true},
    [HP_GGML_F16] = {"F16", 1, 2, true},
    [HP_GGML_Q4_0] = {"Q4_0", 32, 18, true},
    [HP_GGML_Q4_1] = {"Q4_1", 32, 20, true},
    [HP_GGML_Q5_0] = {"Q5_0", 32, 22, false},
    [HP_GGML_Q5_1] = {"Q5_1", 32, 24, false},
    [HP_GGML_Q8_0] = {"Q8_0", 32, 34, true},
    [HP_GGML_Q8_1] = {"Q8_1", 32, 40, false},
    [HP_GGML_Q2_K] = {"Q2_K", 256, 84, false},
    [HP_GGML_Q3_K] = {"Q3_K", 256, 110, false},
    [HP_GGML_Q4_K] = {"Q4_K", 256, 144, true},
    [HP_GGML_Q5_K] = {"Q5_K", 256, 176, false},
    [HP_GGML_Q6_K] = {"Q6_K", 256, 210, true},
    [HP_GGML_Q8_K] = {"Q8_K", 256, 292, false},
    [HP_GGML_IQ2_XXS] = {"IQ2_XXS", 256, 66, false},
    [HP_GGML_IQ2_XS] = {"IQ2_XS", 256, 74, false},
    [HP_GGML_IQ3_XXS] = {"IQ3_XXS", 256, 98, false},
    [HP_GGML_IQ1_S] = {"IQ1_S", 256, 50, false},
    [HP_GGML_IQ4_NL] = {"IQ4_NL", 32, 18, false},
    [HP_GGML_IQ3_S] = {"IQ3_S", 256, 110, false},
    [HP_GGML_IQ2_S] = {"IQ2_S", 256, 82, false},
    [HP_GGML_IQ4_XS] = {"IQ4_XS", 256, 136, false},
    [HP_GGML_I8] = {"I8", 1, 1, false},
    [HP_GGML_I16] = {"I16", 1, 2, false},
    [HP_GGML_I32] = {"I32", 1, 4, false},
    [HP_GGML_I64] = {"I64", 1, 8, false},
    [HP_GGML_F64] = {"F64", 1, 8, false},
    [HP_GGML_IQ1_M] = {"IQ1_M", 256, 56, false},
    [HP_GGML_BF16] = {"BF16", 1, 2, true},
    [HP_GGML_TQ1_0] = {"TQ1_0", 256, 54, false},
    [HP_GGML_TQ2_0] = {"TQ2_0", 256, 66, false},
    [HP_GGML_MXFP4] = {"MXFP4", 32, 17, false},
    [HP_GGML_NVFP4] = {"NVFP4", 64, 36, false},
    [HP_GGML_Q1_0] = {"Q1_0", 128, 18, false},
};

bool hp_ggml_type_known(uint32_t t) { return t < HP_GGML_TYPE_END && g_types[t].name; }

const char *hp_ggml_type_name(uint32_t t) { return hp_ggml_type_known(t) ? g_types[t].name : "?"; }

bool hp_ggml_type_block(uint32_t t, int64_t *block_elems, int64_t *block_bytes)
{
    if (!hp_ggml_type_known(t)) return false;
    *block_elems = g_types[t].block_elems;
    *block_bytes = g_types[t].block_bytes;
    return true;
}

bool hp_ggml_type_dequantizable(uint32_t t) { return hp_ggml_type_known(t) && g_types[t].dequant; }

const char *hp_ggml_dequantizable_list(void) { return "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K and Q6_K"; }

/* ---- scalars ---- */

static float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint16_t load_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* IEEE half to f32, exactly (every half is an f32); a NaN keeps its payload, as numpy's astype does. */
static float half(const uint8_t *p)
{
    uint16_t h = load_u16(p);
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) { /* zero or subnormal: mant * 2^-24, exact */
        float v = (float)mant * 0x1p-24f;
        return sign ? -v : v;
    }
    if (exp == 31) return f32_from_bits(sign | 0x7f800000u | (mant << 13));
    return f32_from_bits(sign | ((exp + 112) << 23) | (mant << 13)); /* rebias 15 -> 127 */
}

/* ---- blocks ---- */

static void deq_q8_0(const uint8_t *b, float *y)
{
    float d = half(b);
    for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)b[2 + j] * d;
}

static void deq_q4_0(const uint8_t *b, float *y)
{
    float d = half(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)((qs[j] & 15) - 8);
        y[j + 16] = d * (float)((qs[j] >> 4) - 8);
    }
}

static void deq_q4_1(const uint8_t *b, float *y)
{
    float d = half(b), m = half(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        float lo = d * (float)(qs[j] & 15), hi = d * (float)(qs[j] >> 4);
        y[j] = lo + m;
        y[j + 16] = hi + m;
    }
}

static void deq_q4_k(const uint8_t *b, float *y)
{
    float d = half(b), dmin = half(b + 2);
    const uint8_t *s = b + 4, *qs = b + 16;
    for (int k = 0; k < 8; k++) {
        int sc, m;
        if (k < 4) {
            sc = s[k] & 63;
            m = s[k + 4] & 63;
        } else {
            sc = (s[k + 4] & 15) | ((s[k - 4] >> 6) << 4);
            m = (s[k + 4] >> 4) | ((s[k] >> 6) << 4);
        }
        float dk = d * (float)sc, mk = dmin * (float)m;
        const uint8_t *q = qs + 32 * (k / 2);
        int shift = 4 * (k % 2);
        for (int l = 0; l < 32; l++) {
            float t = dk * (float)((q[l] >> shift) & 15);
            y[32 * k + l] = t - mk;
        }
    }
}

static void deq_q6_k(const uint8_t *b, float *y)
{
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = half(b + 208);
    for (int h = 0; h < 2; h++)
        for (int s = 0; s < 4; s++)
            for (int l = 0; l < 32; l++) {
                int e = 128 * h + 32 * s + l;
                int lo = (ql[64 * h + 32 * (s % 2) + l] >> (4 * (s / 2))) & 15;
                int hi = (qh[32 * h + l] >> (2 * s)) & 3;
                float dg = d * (float)sc[e / 16];
                y[e] = dg * (float)((lo | (hi << 4)) - 32);
            }
}

bool hp_gguf_dequantize(uint32_t t, const void *src, float *dst, int64_t n)
{
    const uint8_t *p = src;
    if (!hp_ggml_type_dequantizable(t) || n < 0 || n % g_types[t].block_elems) return false;
    switch ((hp_ggml_type)t) {
    case HP_GGML_F32: memcpy(dst, p, (size_t)n * sizeof *dst); return true;
    case HP_GGML_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = half(p + 2 * i);
        return true;
    case HP_GGML_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = f32_from_bits((uint32_t)load_u16(p + 2 * i) << 16);
        return true;
    default: break;
    }
    void (*block)(const uint8_t *, float *) = NULL;
    switch ((hp_ggml_type)t) {
    case HP_GGML_Q8_0: block = deq_q8_0; break;
    case HP_GGML_Q4_0: block = deq_q4_0; break;
    case HP_GGML_Q4_1: block = deq_q4_1; break;
    case HP_GGML_Q4_K: block = deq_q4_k; break;
    case HP_GGML_Q6_K: block = deq_q6_k; break;
    default: return false;
    }
    const int64_t be = g_types[t].block_elems, bb = g_types[t].block_bytes;
    for (int64_t i = 0; i < n / be; i++) block(p + i * bb, dst + i * be);
    return true;
}
