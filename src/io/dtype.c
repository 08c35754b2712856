/*
 * dtype.c — safetensors element types: names, sizes, and conversions between f32 and BF16 / F16 / F32 /
 * F64.
 *
 * Bit layouts (little-endian in files; we assemble bytes explicitly so unaligned mmap data is fine):
 *
 *   F32   s eeeeeeee mmmmmmmmmmmmmmmmmmmmmmm   bias 127
 *   BF16  s eeeeeeee mmmmmmm                   the top half of an F32
 *   F16   s eeeee mmmmmmmmmm                   bias 15, subnormals below 2^-14, max 65504
 *
 * Narrowing rounds to nearest, ties to even. NaN stays NaN (quiet); values too large for F16 become inf.
 */
#include "hyperpar/safetensors.h"

#include <string.h>

/* Indexed by hp_dtype; the names are safetensors' own spelling. */
static const struct {
    const char *name;
    int bits;
} dtype_info[HP_DT_COUNT] = {
    [HP_DT_BOOL] = {"BOOL", 8},
    [HP_DT_F4] = {"F4", 4},
    [HP_DT_F6_E2M3] = {"F6_E2M3", 6},
    [HP_DT_F6_E3M2] = {"F6_E3M2", 6},
    [HP_DT_U8] = {"U8", 8},
    [HP_DT_I8] = {"I8", 8},
    [HP_DT_F8_E5M2] = {"F8_E5M2", 8},
    [HP_DT_F8_E4M3] = {"F8_E4M3", 8},
    [HP_DT_F8_E8M0] = {"F8_E8M0", 8},
    [HP_DT_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8},
    [HP_DT_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8},
    [HP_DT_I16] = {"I16", 16},
    [HP_DT_U16] = {"U16", 16},
    [HP_DT_F16] = {"F16", 16},
    [HP_DT_BF16] = {"BF16", 16},
    [HP_DT_I32] = {"I32", 32},
    [HP_DT_U32] = {"U32", 32},
    [HP_DT_F32] = {"F32", 32},
    [HP_DT_C64] = {"C64", 64},
    [HP_DT_F64] = {"F64", 64},
    [HP_DT_I64] = {"I64", 64},
    [HP_DT_U64] = {"U64", 64},
};

const char *hp_dtype_name(hp_dtype dt)
{
    if ((unsigned)dt >= HP_DT_COUNT) return "?";
    return dtype_info[dt].name;
}

int hp_dtype_bits(hp_dtype dt)
{
    if ((unsigned)dt >= HP_DT_COUNT) return 0;
    return dtype_info[dt].bits;
}

bool hp_dtype_parse(const char *s, hp_dtype *out)
{
    if (!s) return false;
    for (int i = 0; i < HP_DT_COUNT; i++) {
        if (strcmp(s, dtype_info[i].name) == 0) {
            if (out) *out = (hp_dtype)i;
            return true;
        }
    }
    return false;
}

/* For whole-byte types this is n * bytes; F4 packs 2 elements a byte and F6 packs 4 elements in 3 bytes,
 * so those need n to be a multiple of 2 and 4. Dividing before multiplying keeps the overflow check exact. */
bool hp_dtype_nbytes(hp_dtype dt, int64_t n_elems, int64_t *out)
{
    int bits = hp_dtype_bits(dt);
    if (bits == 0 || n_elems < 0) return false;
    int64_t r;
    if (bits % 8 == 0) {
        if (!hp_mul_i64(n_elems, bits / 8, &r)) return false;
    } else if (bits == 4) {
        if (n_elems % 2 != 0) return false;
        r = n_elems / 2;
    } else { /* 6 bits */
        if (n_elems % 4 != 0) return false;
        if (!hp_mul_i64(n_elems / 4, 3, &r)) return false;
    }
    if (out) *out = r;
    return true;
}

static float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        /* Zero or subnormal: mant * 2^-24, exact in f32. */
        float v = (float)mant * 0x1p-24f;
        return f32_from_bits(f32_bits(v) | sign);
    }
    if (exp == 31) return f32_from_bits(sign | 0x7f800000u | (mant << 13)); /* inf or nan (payload kept) */
    return f32_from_bits(sign | ((exp + 112) << 23) | (mant << 13));    /* rebias 15 -> 127 */
}

/* Round-to-nearest-even f32 -> f16 (after F. Giesen's float_to_half_fast3_rtne). */
static uint16_t f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint32_t sign = x & 0x80000000u;
    x ^= sign;
    uint16_t o;
    if (x >= 0x47800000u) {
        /* |f| >= 2^16 (always overflows), inf, or nan. */
        o = x > 0x7f800000u ? (uint16_t)(0x7e00u | ((x >> 13) & 0x3ffu)) : 0x7c00u;
    } else if (x < 0x38800000u) {
        /* Below 2^-14: the result is subnormal or zero. Adding 0.5 shifts the value so the FPU's own
         * round-to-nearest-even drops exactly the bits f16 cannot hold. */
        float v = f32_from_bits(x) + 0.5f;
        o = (uint16_t)(f32_bits(v) - 0x3f000000u);
    } else {
        uint32_t mant_odd = (x >> 13) & 1u;
        x += 0xc8000fffu; /* rebias 127 -> 15 ((15 - 127) << 23, mod 2^32) plus the rounding bias 0xfff */
        x += mant_odd;
        o = (uint16_t)(x >> 13); /* a carry out of the mantissa rounds 65520.. up to inf, as it should */
    }
    return (uint16_t)(o | (sign >> 16));
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* keep it a (quiet) nan */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static uint16_t load_u16(const unsigned char *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static uint32_t load_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static void store_u16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)(v & 0xff);
    p[1] = (unsigned char)(v >> 8);
}

static void store_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

hp_status hp_dtype_to_f32(hp_dtype dt, const void *src, float *dst, int64_t n, hp_err *err)
{
    if (n < 0) return hp_err_set(err, HP_ERR_INPUT, "cannot convert a negative count (%lld) of elements.",
                                 (long long)n);
    const unsigned char *s = src;
    switch (dt) {
    case HP_DT_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = f32_from_bits((uint32_t)load_u16(s + 2 * i) << 16);
        return HP_OK;
    case HP_DT_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = f16_to_f32(load_u16(s + 2 * i));
        return HP_OK;
    case HP_DT_F32:
        for (int64_t i = 0; i < n; i++) dst[i] = f32_from_bits(load_u32(s + 4 * i));
        return HP_OK;
    case HP_DT_F64:
        for (int64_t i = 0; i < n; i++) {
            uint64_t u = (uint64_t)load_u32(s + 8 * i) | ((uint64_t)load_u32(s + 8 * i + 4) << 32);
            double d;
            memcpy(&d, &u, sizeof d);
            dst[i] = (float)d; /* IEEE narrowing: rounds to nearest, out-of-range values become inf */
        }
        return HP_OK;
    default:
        return hp_err_set(err, HP_ERR_INPUT,
                          "cannot convert dtype %s to F32; only BF16, F16, F32 and F64 can be widened to F32.",
                          hp_dtype_name(dt));
    }
}

hp_status hp_dtype_from_f32(hp_dtype dt, const float *src, void *dst, int64_t n, hp_err *err)
{
    if (n < 0) return hp_err_set(err, HP_ERR_INPUT, "cannot convert a negative count (%lld) of elements.",
                                 (long long)n);
    unsigned char *d = dst;
    switch (dt) {
    case HP_DT_BF16:
        for (int64_t i = 0; i < n; i++) store_u16(d + 2 * i, f32_to_bf16(src[i]));
        return HP_OK;
    case HP_DT_F16:
        for (int64_t i = 0; i < n; i++) store_u16(d + 2 * i, f32_to_f16(src[i]));
        return HP_OK;
    case HP_DT_F32:
        for (int64_t i = 0; i < n; i++) store_u32(d + 4 * i, f32_bits(src[i]));
        return HP_OK;
    default:
        return hp_err_set(err, HP_ERR_INPUT,
                          "cannot convert F32 to dtype %s; only BF16, F16 and F32 can be produced from F32.",
                          hp_dtype_name(dt));
    }
}
