/* test_dtype.c — dtype names, sizes, and BF16 / F16 / F32 / F64 conversions (rounding, inf, nan, subnormals). */
#include "hyperpar/safetensors.h"
#include "testlib.h"

#include <float.h>

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t to_bf16(float f)
{
    uint16_t h;
    CHECK(hp_dtype_from_f32(HP_DT_BF16, &f, &h, 1, NULL) == HP_OK);
    return h;
}

static uint16_t to_f16(float f)
{
    uint16_t h;
    CHECK(hp_dtype_from_f32(HP_DT_F16, &f, &h, 1, NULL) == HP_OK);
    return h;
}

static float from16(hp_dtype dt, uint16_t h)
{
    float f = -12345.0f;
    CHECK(hp_dtype_to_f32(dt, &h, &f, 1, NULL) == HP_OK);
    return f;
}

TEST(names_bits_parse)
{
    static const char *names[HP_DT_COUNT] = {"BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2",
                                             "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16",
                                             "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64"};
    static const int bits[HP_DT_COUNT] = {8, 4, 6, 6, 8, 8, 8, 8, 8, 8, 8, 16, 16, 16, 16, 32, 32, 32, 64, 64, 64, 64};
    for (int i = 0; i < HP_DT_COUNT; i++) {
        CHECK_STR_EQ(hp_dtype_name((hp_dtype)i), names[i]);
        CHECK_EQ_INT(hp_dtype_bits((hp_dtype)i), bits[i]);
        hp_dtype dt = HP_DT_COUNT;
        CHECK(hp_dtype_parse(names[i], &dt) && dt == (hp_dtype)i);
    }
    hp_dtype dt;
    CHECK(!hp_dtype_parse("bf16", &dt));
    CHECK(!hp_dtype_parse("F8", &dt));
    CHECK(!hp_dtype_parse("", &dt));
    CHECK(!hp_dtype_parse(NULL, &dt));
    CHECK_EQ_INT(hp_dtype_bits(HP_DT_COUNT), 0);
}

TEST(nbytes)
{
    int64_t n = -1;
    CHECK(hp_dtype_nbytes(HP_DT_BF16, 10, &n) && n == 20);
    CHECK(hp_dtype_nbytes(HP_DT_F32, 0, &n) && n == 0);
    CHECK(hp_dtype_nbytes(HP_DT_C64, 3, &n) && n == 24);
    CHECK(hp_dtype_nbytes(HP_DT_F4, 6, &n) && n == 3);
    CHECK(!hp_dtype_nbytes(HP_DT_F4, 5, &n));
    CHECK(hp_dtype_nbytes(HP_DT_F6_E2M3, 8, &n) && n == 6);
    CHECK(!hp_dtype_nbytes(HP_DT_F6_E3M2, 6, &n));
    CHECK(!hp_dtype_nbytes(HP_DT_F32, -1, &n));
    CHECK(!hp_dtype_nbytes(HP_DT_F64, INT64_MAX / 4, &n));
    CHECK(hp_dtype_nbytes(HP_DT_F64, INT64_MAX / 8, &n) && n == (INT64_MAX / 8) * 8);
    CHECK(hp_dtype_nbytes(HP_DT_F4, INT64_MAX - 1, &n) && n == (INT64_MAX - 1) / 2);
}

TEST(bf16_round_to_nearest_even)
{
    CHECK_EQ_INT(to_bf16(1.0f), 0x3f80);
    CHECK_EQ_INT(to_bf16(-2.0f), 0xc000);
    CHECK_EQ_INT(to_bf16(-0.0f), 0x8000);
    CHECK_EQ_INT(to_bf16(from_bits(0x3f808000u)), 0x3f80); /* tie, even below */
    CHECK_EQ_INT(to_bf16(from_bits(0x3f818000u)), 0x3f82); /* tie, odd below: round up */
    CHECK_EQ_INT(to_bf16(from_bits(0x3f808001u)), 0x3f81); /* above the tie */
    CHECK_EQ_INT(to_bf16(from_bits(0x3f807fffu)), 0x3f80); /* below the tie */
    CHECK_EQ_INT(to_bf16(from_bits(0x7f7fffffu)), 0x7f80); /* FLT_MAX rounds up to inf */
    CHECK_EQ_INT(to_bf16(INFINITY), 0x7f80);
    CHECK_EQ_INT(to_bf16(-INFINITY), 0xff80);
    uint16_t n = to_bf16(NAN);
    CHECK((n & 0x7f80) == 0x7f80 && (n & 0x7f) != 0);
    n = to_bf16(from_bits(0x7f800001u)); /* a nan whose payload is all in the dropped bits */
    CHECK((n & 0x7f80) == 0x7f80 && (n & 0x7f) != 0);
    CHECK(isnan(from16(HP_DT_BF16, n)));
    CHECK(from16(HP_DT_BF16, 0x3f80) == 1.0f);
    CHECK(from16(HP_DT_BF16, 0x4049) == from_bits(0x40490000u));
    CHECK(isinf(from16(HP_DT_BF16, 0xff80)) && from16(HP_DT_BF16, 0xff80) < 0);
}

TEST(bf16_all_values_round_trip)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = from16(HP_DT_BF16, (uint16_t)h);
        CHECK(bits_of(f) == h << 16);
        if (isnan(f)) continue;
        if (to_bf16(f) != h) bad++;
    }
    CHECK_EQ_INT(bad, 0);
}

TEST(f16_normals_rounding_overflow)
{
    CHECK_EQ_INT(to_f16(1.0f), 0x3c00);
    CHECK_EQ_INT(to_f16(-2.0f), 0xc000);
    CHECK_EQ_INT(to_f16(0.0f), 0x0000);
    CHECK_EQ_INT(to_f16(-0.0f), 0x8000);
    CHECK_EQ_INT(to_f16(65504.0f), 0x7bff);
    CHECK_EQ_INT(to_f16(65519.0f), 0x7bff);  /* below the midpoint to 65536 */
    CHECK_EQ_INT(to_f16(65520.0f), 0x7c00);  /* the midpoint rounds to even: inf */
    CHECK_EQ_INT(to_f16(1e6f), 0x7c00);
    CHECK_EQ_INT(to_f16(-1e6f), 0xfc00);
    CHECK_EQ_INT(to_f16(INFINITY), 0x7c00);
    CHECK_EQ_INT(to_f16(-INFINITY), 0xfc00);
    CHECK_EQ_INT(to_f16(1.0f + 0x1p-11f), 0x3c00);        /* tie, even below */
    CHECK_EQ_INT(to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);    /* tie, odd below: up */
    CHECK_EQ_INT(to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
    uint16_t n = to_f16(NAN);
    CHECK((n & 0x7c00) == 0x7c00 && (n & 0x3ff) != 0);
    n = to_f16(from_bits(0x7f800001u));
    CHECK((n & 0x7c00) == 0x7c00 && (n & 0x3ff) != 0);
    CHECK(from16(HP_DT_F16, 0x3c00) == 1.0f);
    CHECK(from16(HP_DT_F16, 0x7bff) == 65504.0f);
    CHECK(isinf(from16(HP_DT_F16, 0x7c00)) && from16(HP_DT_F16, 0x7c00) > 0);
    CHECK(isinf(from16(HP_DT_F16, 0xfc00)) && from16(HP_DT_F16, 0xfc00) < 0);
    CHECK(isnan(from16(HP_DT_F16, 0x7e00)));
    CHECK(isnan(from16(HP_DT_F16, 0xfc01)));
    CHECK(signbit(from16(HP_DT_F16, 0x8000)) && from16(HP_DT_F16, 0x8000) == 0.0f);
}

TEST(f16_subnormals)
{
    CHECK(from16(HP_DT_F16, 0x0001) == 0x1p-24f);
    CHECK(from16(HP_DT_F16, 0x03ff) == 1023 * 0x1p-24f);
    CHECK(from16(HP_DT_F16, 0x0400) == 0x1p-14f);
    CHECK(from16(HP_DT_F16, 0x8001) == -0x1p-24f);
    CHECK_EQ_INT(to_f16(0x1p-24f), 0x0001);
    CHECK_EQ_INT(to_f16(0x1p-25f), 0x0000);          /* tie between 0 and 1: even */
    CHECK_EQ_INT(to_f16(1.5f * 0x1p-25f), 0x0001);
    CHECK_EQ_INT(to_f16(3 * 0x1p-25f), 0x0002);      /* tie between 1 and 2: even */
    CHECK_EQ_INT(to_f16(5 * 0x1p-25f), 0x0002);      /* tie between 2 and 3: even */
    CHECK_EQ_INT(to_f16(1023 * 0x1p-24f), 0x03ff);
    CHECK_EQ_INT(to_f16(1023.5f * 0x1p-24f), 0x0400); /* tie, odd below: up to the smallest normal */
    CHECK_EQ_INT(to_f16(-0x1p-24f), 0x8001);
    CHECK_EQ_INT(to_f16(1e-10f), 0x0000);
    CHECK_EQ_INT(to_f16(-1e-10f), 0x8000);
}

TEST(f16_all_values_round_trip)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = from16(HP_DT_F16, (uint16_t)h);
        if (isnan(f)) {
            CHECK((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0);
            continue;
        }
        if (to_f16(f) != h) bad++;
    }
    CHECK_EQ_INT(bad, 0);
}

TEST(f32_f64_and_unaligned)
{
    unsigned char buf[1 + 3 * 8];
    double d[3] = {1.5, -1e300, 0x1p-30};
    memcpy(buf + 1, d, sizeof d);
    float out[3];
    CHECK(hp_dtype_to_f32(HP_DT_F64, buf + 1, out, 3, NULL) == HP_OK);
    CHECK(out[0] == 1.5f && isinf(out[1]) && out[1] < 0 && out[2] == 0x1p-30f);

    float in[3] = {1.25f, -3.0f, FLT_MIN}, back[3];
    unsigned char b32[1 + 12];
    CHECK(hp_dtype_from_f32(HP_DT_F32, in, b32 + 1, 3, NULL) == HP_OK);
    CHECK(hp_dtype_to_f32(HP_DT_F32, b32 + 1, back, 3, NULL) == HP_OK);
    CHECK(memcmp(in, back, sizeof in) == 0);
    CHECK(b32[1] == 0x00 && b32[2] == 0x00 && b32[3] == 0xa0 && b32[4] == 0x3f); /* 1.25f little-endian */

    uint16_t h[2];
    CHECK(hp_dtype_from_f32(HP_DT_BF16, in, h, 2, NULL) == HP_OK);
    CHECK(h[0] == 0x3fa0 && h[1] == 0xc040);
    CHECK(hp_dtype_to_f32(HP_DT_F16, h, back, 0, NULL) == HP_OK);
}

TEST(unsupported_conversions)
{
    hp_err e;
    hp_err_clear(&e);
    float f = 0;
    int32_t i = 0;
    CHECK(hp_dtype_to_f32(HP_DT_I32, &i, &f, 1, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "cannot convert dtype I32 to F32");
    CHECK(hp_dtype_from_f32(HP_DT_F64, &f, &i, 1, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "cannot convert F32 to dtype F64");
    CHECK(hp_dtype_to_f32(HP_DT_F32, &i, &f, -1, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "negative count");
    CHECK(hp_dtype_from_f32(HP_DT_F32, &f, &i, -2, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "negative count (-2)");
}

TEST_MAIN()
