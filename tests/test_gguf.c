/* test_gguf.c — the GGUF reader on good and hostile files (truncated at every byte, every single-byte change of
 * the header region, lying counts, sizes and offsets, unknown types, misalignment, overlap), the typed lookups,
 * and dequantization of hand-made blocks. Every bad file is HP_ERR_INPUT naming the field, never a crash (the
 * sanitizer build runs this too). Bit-exactness against the gguf Python package: tests/python/test_gguf_convert.py. */
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf_build.h"
#include "hyperpar/gguf.h"
#include "testlib.h"

static uint16_t f16_bits(float x)
{
    /* exact for the values used here (small integers and powers of two) */
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t sign = (u >> 16) & 0x8000u, exp = (u >> 23) & 0xffu, mant = u & 0x7fffffu;
    if (!exp) return (uint16_t)sign;
    return (uint16_t)(sign | ((exp - 112) << 10) | (mant >> 13));
}

static void put_f16(unsigned char *p, float x)
{
    uint16_t h = f16_bits(x);
    p[0] = (unsigned char)h;
    p[1] = (unsigned char)(h >> 8);
}

/* A file with a key/value of every type (arrays too) and two tensors: "w" F32 [2 rows of 4] and "q" Q8_0 [1 row
 * of 32] (34 bytes: its 2-byte scale 0.5, then q[j] = j - 16). */
static unsigned char *sample(size_t *len, size_t *data_at)
{
    gfile g = {0};
    gf_kv_str(&g, "general.architecture", "test");
    gf_kv_u32(&g, "general.alignment", 32);
    gf_key(&g, "u8", HP_GGUF_U8), gb_u8(&g.kv, 200);
    gf_key(&g, "i8", HP_GGUF_I8), gb_u8(&g.kv, 0xfe);
    gf_key(&g, "u16", HP_GGUF_U16), gb_u32(&g.kv, 0), g.kv.n -= 2; /* two bytes */
    gf_key(&g, "i16", HP_GGUF_I16), gb_u8(&g.kv, 0xff), gb_u8(&g.kv, 0xff);
    gf_key(&g, "i32", HP_GGUF_I32), gb_u32(&g.kv, (uint32_t)-7);
    gf_kv_f32(&g, "f32", 1.5f);
    gf_kv_bool(&g, "b", 1);
    gf_key(&g, "u64", HP_GGUF_U64), gb_u64(&g.kv, 1ull << 40);
    gf_key(&g, "i64", HP_GGUF_I64), gb_u64(&g.kv, (uint64_t)-3);
    double d = 0.25;
    uint64_t du;
    memcpy(&du, &d, 8);
    gf_key(&g, "f64", HP_GGUF_F64), gb_u64(&g.kv, du);
    const char *s[] = {"a", "", "ccc"};
    gf_kv_strs(&g, "strs", s, 3);
    const int32_t iv[] = {1, -2, 3};
    gf_kv_i32s(&g, "ints", iv, 3);
    gf_key(&g, "bools", HP_GGUF_ARRAY), gb_u32(&g.kv, HP_GGUF_BOOL), gb_u64(&g.kv, 2), gb_u8(&g.kv, 0),
        gb_u8(&g.kv, 1);
    float w[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    gf_tensor(&g, "w", 2, (uint64_t[]){4, 2}, HP_GGML_F32, w, sizeof w);
    unsigned char q[64] = {0};
    put_f16(q, 0.5f);
    for (int j = 0; j < 32; j++) q[2 + j] = (unsigned char)(int8_t)(j - 16);
    gf_tensor(&g, "q", 1, (uint64_t[]){32}, HP_GGML_Q8_0, q, 34);
    g.data.n = 32 + 34; /* no padding after the last tensor: every shorter prefix cuts into it */
    unsigned char *b = gf_image_at(&g, len, data_at);
    gf_free(&g);
    return b;
}

static hp_gguf_file *open_ok(const unsigned char *b, size_t n)
{
    hp_gguf_file *f = NULL;
    hp_err e;
    e.msg[0] = 0;
    hp_status st = hp_gguf_open_memory(&f, b, n, "t.gguf", &e);
    CHECK_MSG(st == HP_OK && f, "%s", e.msg);
    return f;
}

#define EXPECT_BAD(buf, n, needle)                                                                 \
    do {                                                                                           \
        hp_gguf_file *bf_ = (hp_gguf_file *)1;                                                     \
        hp_err e_;                                                                                 \
        e_.msg[0] = 0;                                                                             \
        hp_status st_ = hp_gguf_open_memory(&bf_, (buf), (n), "t.gguf", &e_);                      \
        CHECK_MSG(st_ == HP_ERR_INPUT && bf_ == NULL, "status %d", (int)st_);                      \
        CHECK_STR_CONTAINS(e_.msg, needle);                                                        \
        CHECK_STR_CONTAINS(e_.msg, "t.gguf: ");                                                    \
    } while (0)

TEST(good_file_values)
{
    size_t len, at;
    unsigned char *b = sample(&len, &at);
    hp_gguf_file *f = open_ok(b, len);
    if (!f) return;
    CHECK_EQ_INT(hp_gguf_version(f), 3);
    CHECK_EQ_INT(hp_gguf_alignment(f), 32);
    CHECK_EQ_INT(hp_gguf_data_offset(f), at);
    CHECK_EQ_INT(hp_gguf_kv_count(f), 15);
    CHECK_STR_EQ(hp_gguf_kv_at(f, 0)->key, "general.architecture");
    CHECK_EQ_INT(hp_gguf_find_kv(f, "u8")->v.u, 200);
    CHECK_EQ_INT(hp_gguf_find_kv(f, "i8")->v.i, -2);
    CHECK_EQ_INT(hp_gguf_find_kv(f, "u16")->v.u, 0);
    CHECK_EQ_INT(hp_gguf_find_kv(f, "i16")->v.i, -1);
    CHECK_EQ_INT(hp_gguf_find_kv(f, "i32")->v.i, -7);
    CHECK(hp_gguf_find_kv(f, "f32")->v.f == 1.5);
    CHECK(hp_gguf_find_kv(f, "b")->v.b);
    CHECK_EQ_INT(hp_gguf_find_kv(f, "u64")->v.u, 1ull << 40);
    CHECK_EQ_INT(hp_gguf_find_kv(f, "i64")->v.i, -3);
    CHECK(hp_gguf_find_kv(f, "f64")->v.f == 0.25);
    const hp_gguf_kv *kv = hp_gguf_find_kv(f, "strs");
    CHECK(kv && kv->type == HP_GGUF_ARRAY && kv->elem == HP_GGUF_STRING && kv->n == 3);
    if (kv) {
        const hp_gguf_str *a = kv->arr;
        CHECK_STR_EQ(a[2].s, "ccc");
        CHECK_EQ_INT(a[1].len, 0);
    }
    kv = hp_gguf_find_kv(f, "ints");
    CHECK(kv && ((const int32_t *)kv->arr)[1] == -2);
    kv = hp_gguf_find_kv(f, "bools");
    CHECK(kv && !((const bool *)kv->arr)[0] && ((const bool *)kv->arr)[1]);
    CHECK(hp_gguf_find_kv(f, "nothing") == NULL);

    CHECK_EQ_INT(hp_gguf_tensor_count(f), 2);
    const hp_gguf_tensor *w = hp_gguf_find_tensor(f, "w"), *q = hp_gguf_find_tensor(f, "q");
    CHECK(w && q && hp_gguf_find_tensor(f, "x") == NULL);
    if (!w || !q) goto out;
    CHECK(w->n_dims == 2 && w->ne[0] == 4 && w->ne[1] == 2 && w->n_elems == 8 && w->nbytes == 32);
    CHECK(q->type == HP_GGML_Q8_0 && q->nbytes == 34 && q->offset == 32);
    float row[32];
    hp_err e;
    CHECK(hp_gguf_read_f32(f, w, 1, 1, row, &e) == HP_OK && row[0] == 5 && row[3] == 8);
    CHECK(hp_gguf_read_f32(f, q, 0, 1, row, &e) == HP_OK && row[0] == -8.0f && row[31] == 7.5f);
    CHECK(hp_gguf_read_f32(f, w, 1, 2, row, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "tensor 'w': rows [1, 3) asked for are outside its 2 rows");
    unsigned char raw[4];
    CHECK(hp_gguf_read(f, q, 32, raw, 4, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "bytes [32, 36) asked for are outside its 34 bytes");
out:
    hp_gguf_close(f);
    free(b);
}

TEST(typed_lookups)
{
    size_t len;
    unsigned char *b = sample(&len, NULL);
    hp_gguf_file *f = open_ok(b, len);
    if (!f) return;
    hp_err e;
    int64_t i = 0;
    double d = 0;
    bool found = false, bv = false;
    const hp_gguf_str *s = NULL;
    const hp_gguf_kv *kv = NULL;
    CHECK(hp_gguf_get_int(f, "u64", &i, &found, &e) == HP_OK && found && i == 1ll << 40);
    CHECK(hp_gguf_get_int(f, "i8", &i, &found, &e) == HP_OK && i == -2);
    CHECK(hp_gguf_get_int(f, "absent", &i, &found, &e) == HP_OK && !found);
    CHECK(hp_gguf_get_int(f, "f32", &i, &found, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "t.gguf: metadata key 'f32' is a FLOAT32; expected an integer.");
    CHECK(hp_gguf_get_float(f, "f64", &d, &found, &e) == HP_OK && d == 0.25);
    CHECK(hp_gguf_get_float(f, "u8", &d, &found, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "is a UINT8; expected a FLOAT32 or FLOAT64");
    CHECK(hp_gguf_get_bool(f, "b", &bv, &found, &e) == HP_OK && bv);
    CHECK(hp_gguf_get_string(f, "general.architecture", &s, &e) == HP_OK && s && !strcmp(s->s, "test"));
    CHECK(hp_gguf_get_string(f, "strs", &s, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "metadata key 'strs' is an ARRAY of STRING; expected a STRING");
    CHECK(hp_gguf_get_array(f, "ints", HP_GGUF_I32, &kv, &e) == HP_OK && kv && kv->n == 3);
    CHECK(hp_gguf_get_array(f, "ints", HP_GGUF_STRING, &kv, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "is an ARRAY of INT32; expected an ARRAY of STRING");
    hp_gguf_close(f);
    free(b);
}

/* A sweep's try (testlib.h): the file opens with its invariants, or fails with HP_ERR_INPUT naming it ("t.gguf"). */
static int open_or_refuse(const unsigned char *b, size_t len)
{
    hp_gguf_file *f = (hp_gguf_file *)1;
    hp_err e;
    e.msg[0] = 0;
    hp_status st = hp_gguf_open_memory(&f, b, len, "t.gguf", &e);
    if (st != HP_OK) {
        if (st == HP_ERR_INPUT && f == NULL && strncmp(e.msg, "t.gguf: ", 8) == 0) return 0;
        fprintf(stderr, "  %zu bytes: status %d: %s\n", len, (int)st, e.msg);
        return -1;
    }
    int wrong = 0;
    for (size_t i = 0; i < hp_gguf_tensor_count(f); i++) {
        const hp_gguf_tensor *t = hp_gguf_tensor_at(f, i);
        wrong += hp_gguf_find_tensor(f, t->name) != t || hp_gguf_data_offset(f) + t->offset + t->nbytes > len;
    }
    hp_gguf_close(f);
    return wrong ? -1 : 1;
}

TEST(truncation_sweep)
{
    size_t len;
    unsigned char *b = sample(&len, NULL);
    CHECK_EQ_INT(test_prefix_sweep(b, len, open_or_refuse), 0);
    free(b);
}

/* Every value of every byte before the data section: the file opens with its invariants, or fails with
 * HP_ERR_INPUT naming the file. */
TEST(header_byte_corruption_sweep)
{
    size_t len, at;
    unsigned char *b = sample(&len, &at);
    test_sweep s = test_byte_sweep(b, len, at, TEST_SANITIZED ? 3 : 1, open_or_refuse);
    CHECK_EQ_INT(s.wrong, 0);
    CHECK(s.opened > 0 && s.refused > s.opened);
    free(b);
}

/* Raw files: magic, version, counts. */
TEST(bad_header)
{
    EXPECT_BAD((const unsigned char *)"", 0, "the file is 0 bytes, too small to hold the GGUF magic");
    EXPECT_BAD((const unsigned char *)"GGUX\3\0\0\0", 8, "not the GGUF magic 'GGUF'; not a GGUF file");
    gb g = {0};
    gb_put(&g, "GGUF", 4);
    gb_u32(&g, 1);
    gb_u64(&g, 0), gb_u64(&g, 0);
    EXPECT_BAD(g.b, g.n, "GGUF version 1 (32-bit counts) is not supported");
    g.b[7] = 3, g.b[4] = 0;
    EXPECT_BAD(g.b, g.n, "big-endian GGUF file, which is not supported");
    g.b[7] = 0, g.b[4] = 9;
    EXPECT_BAD(g.b, g.n, "unknown GGUF version 9; versions 2 and 3 are supported");
    g.b[4] = 2;
    hp_gguf_file *f = open_ok(g.b, g.n); /* version 2, nothing in it */
    hp_gguf_close(f);
    EXPECT_BAD(g.b, 12, "the header: tensor_count needs 8 bytes at byte 8 but the file ends at byte 12");
    /* counts far beyond what the bytes left can hold */
    g.n = 8;
    gb_u64(&g, 1ull << 60), gb_u64(&g, 0);
    EXPECT_BAD(g.b, g.n, "the header claims 1152921504606846976 tensors and 0 metadata key/values, which cannot fit");
    g.n = 8;
    gb_u64(&g, 0), gb_u64(&g, UINT64_MAX);
    EXPECT_BAD(g.b, g.n, "metadata key/values, which cannot fit in the 0 bytes after it");
    g.n = 8;
    gb_u64(&g, 1), gb_u64(&g, 2);
    for (int i = 0; i < 40; i++) gb_u8(&g, 0); /* 40 bytes: not 25 + 2 * 14 */
    EXPECT_BAD(g.b, g.n, "cannot fit in the 40 bytes after it");
    free(g.b);
}

/* A file of one key/value whose encoding follows "GGUF", version 3, 0 tensors, 1 key/value. */
static gb one_kv(void)
{
    gb g = {0};
    gb_put(&g, "GGUF", 4);
    gb_u32(&g, 3);
    gb_u64(&g, 0), gb_u64(&g, 1);
    return g;
}

TEST(bad_metadata)
{
    gb g = one_kv();
    gb_str(&g, "k"), gb_u32(&g, 13), gb_u64(&g, 0);
    EXPECT_BAD(g.b, g.n, "metadata key 0 ('k'): unknown value type 13; GGUF value types are 0..12");
    free(g.b);
    g = one_kv();
    gb_str(&g, "k"), gb_u32(&g, HP_GGUF_ARRAY), gb_u32(&g, 77), gb_u64(&g, 0);
    EXPECT_BAD(g.b, g.n, "metadata key 0 ('k'): unknown array element type 77");
    free(g.b);
    g = one_kv();
    gb_str(&g, "k"), gb_u32(&g, HP_GGUF_ARRAY), gb_u32(&g, HP_GGUF_ARRAY), gb_u64(&g, 0);
    EXPECT_BAD(g.b, g.n, "an array of arrays; nested arrays are not supported");
    free(g.b);
    g = one_kv();
    gb_str(&g, "k"), gb_u32(&g, HP_GGUF_BOOL), gb_u8(&g, 2), gb_u8(&g, 0);
    EXPECT_BAD(g.b, g.n, "metadata key 0 ('k'): a BOOL holds the byte 2; booleans must be 0 or 1");
    free(g.b);
    g = one_kv();
    gb_str(&g, "k"), gb_u32(&g, HP_GGUF_ARRAY), gb_u32(&g, HP_GGUF_U32), gb_u64(&g, 1ull << 62), gb_u32(&g, 0);
    EXPECT_BAD(g.b, g.n, "the array claims 4611686018427387904 elements of UINT32 (at least 4 bytes each) but only 4 "
                         "bytes are left");
    free(g.b);
    g = one_kv();
    gb_str(&g, "k"), gb_u32(&g, HP_GGUF_ARRAY), gb_u32(&g, HP_GGUF_STRING), gb_u64(&g, 2), gb_str(&g, "ab"),
        gb_u64(&g, UINT64_MAX - 3), gb_u32(&g, 0);
    EXPECT_BAD(g.b, g.n, "metadata key 0 ('k'): string 1 needs 18446744073709551612 bytes at byte");
    free(g.b);
    g = one_kv();
    gb_u64(&g, 1ull << 20);
    for (int i = 0; i < 16; i++) gb_u8(&g, 0);
    EXPECT_BAD(g.b, g.n, "metadata key/value 0: the key is 1048576 bytes, more than the 65535 the GGUF "
                         "specification allows");
    free(g.b);
    g = one_kv();
    gb_str(&g, ""), gb_u32(&g, HP_GGUF_U8), gb_u8(&g, 0), gb_u8(&g, 0);
    EXPECT_BAD(g.b, g.n, "metadata key/value 0: the key is empty");
    free(g.b);
    g = one_kv();
    gb_strn(&g, "a\0b", 3), gb_u32(&g, HP_GGUF_U8), gb_u8(&g, 0);
    EXPECT_BAD(g.b, g.n, "the key is holds a NUL byte");
    free(g.b);
    gfile f = {0};
    gf_kv_u32(&f, "x", 1);
    gf_kv_u32(&f, "x", 2);
    size_t len;
    unsigned char *b = gf_image(&f, &len);
    EXPECT_BAD(b, len, "metadata key 'x' appears twice; keys must be unique");
    free(b);
    gf_free(&f);
    gf_kv_u32(&f, "general.alignment", 48);
    b = gf_image(&f, &len);
    EXPECT_BAD(b, len, "general.alignment is 48; it must be a power of two");
    free(b);
    gf_free(&f);
    gf_key(&f, "general.alignment", HP_GGUF_U64), gb_u64(&f.kv, 32);
    b = gf_image(&f, &len);
    EXPECT_BAD(b, len, "general.alignment is a UINT64; it must be a UINT32");
    free(b);
    gf_free(&f);
}

/* A file with one tensor info as given and `data` zero bytes of data after the aligned header. */
static unsigned char *one_tensor(size_t *len, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                                 uint64_t offset, size_t data)
{
    gb g = {0};
    gb_put(&g, "GGUF", 4);
    gb_u32(&g, 3);
    gb_u64(&g, 1), gb_u64(&g, 0);
    gb_str(&g, name);
    gb_u32(&g, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) gb_u64(&g, ne[d]);
    gb_u32(&g, type);
    gb_u64(&g, offset);
    gb_pad(&g, 32);
    for (size_t i = 0; i < data; i++) gb_u8(&g, 0);
    *len = g.n;
    return g.b;
}

TEST(bad_tensor_infos)
{
    size_t len;
    unsigned char *b;
#define ONE(nm, nd, ne, ty, off, data, needle)                                                     \
    do {                                                                                           \
        b = one_tensor(&len, nm, nd, ne, ty, off, data);                                           \
        EXPECT_BAD(b, len, needle);                                                                \
        free(b);                                                                                   \
    } while (0)
    const uint64_t ne4[] = {4, 2};
    b = one_tensor(&len, "w", 2, ne4, HP_GGML_F32, 0, 32);
    hp_gguf_file *f = open_ok(b, len);
    hp_gguf_close(f);
    free(b);
    ONE("w", 2, ne4, HP_GGML_F32, 0, 31, "tensor 'w': its 32 bytes at offset 0 run past the end of the 31-byte data "
                                         "section; the file is truncated or the offset is corrupt");
    ONE("w", 2, ne4, HP_GGML_F32, 64, 64, "its 32 bytes at offset 64 run past the end of the 64-byte data section");
    ONE("w", 2, ne4, HP_GGML_F32, 0xffffffffffffffe0ull, 64, "at offset 18446744073709551584 run past the end");
    ONE("w", 2, ne4, HP_GGML_F32, 4, 64, "tensor 'w': offset 4 is not a multiple of the alignment 32");
    ONE("w", 5, ((uint64_t[]){1, 1, 1, 1, 1}), HP_GGML_F32, 0, 32, "tensor 'w': n_dims is 5, more than ggml's 4");
    ONE("w", 3, ((uint64_t[]){1ull << 40, 1ull << 30, 1ull << 10}), HP_GGML_F32, 0, 32,
        "tensor 'w': dimension 1 is 1073741824; the element count overflows a 64-bit integer");
    ONE("w", 1, ((uint64_t[]){1ull << 63}), HP_GGML_F32, 0, 32, "dimension 0 is 9223372036854775808");
    ONE("w", 1, ((uint64_t[]){1ull << 62}), HP_GGML_F32, 0, 32,
        "the byte size of 4611686018427387904 F32 elements overflows");
    ONE("w", 2, ne4, 4, 0, 32, "tensor 'w': unknown ggml type 4; the file is from a newer ggml or corrupt");
    ONE("w", 2, ne4, 99, 0, 32, "unknown ggml type 99");
    ONE("w", 1, ((uint64_t[]){16}), HP_GGML_Q8_0, 0, 32, "tensor 'w': the row length ne[0] = 16 is not a multiple "
                                                         "of Q8_0's block of 32 elements");
    ONE("", 2, ne4, HP_GGML_F32, 0, 32, "tensor info 0: the tensor name is empty");
    char longname[80];
    memset(longname, 'n', 65);
    longname[65] = 0;
    ONE(longname, 2, ne4, HP_GGML_F32, 0, 32, "tensor info 0: the name is 65 bytes, more than the 64");
#undef ONE
    /* two tensors: a duplicate name, an overlap */
    gfile g = {0};
    gf_tensor(&g, "a", 1, (uint64_t[]){8}, HP_GGML_F32, NULL, 32);
    gf_tensor(&g, "a", 1, (uint64_t[]){8}, HP_GGML_F32, NULL, 32);
    b = gf_image(&g, &len);
    EXPECT_BAD(b, len, "tensor 'a' appears twice; names must be unique");
    free(b);
    gf_free(&g);
    gf_tensor(&g, "a", 1, (uint64_t[]){16}, HP_GGML_F32, NULL, 64);
    gf_tensor(&g, "b", 1, (uint64_t[]){8}, HP_GGML_F32, NULL, 32);
    g.ti.b[g.ti.n - 8] = 32; /* b's offset 64 -> 32: inside a */
    b = gf_image(&g, &len);
    EXPECT_BAD(b, len, "tensors 'a' [0, 64) and 'b' [32, 64) overlap in the data section");
    free(b);
    gf_free(&g);
    /* the data section would begin past the end of the file */
    b = one_tensor(&len, "w", 2, ne4, HP_GGML_F32, 0, 0);
    EXPECT_BAD(b, len - 1, "the file ends at byte");
    free(b);
}

TEST(type_table)
{
    int64_t be, bb;
    CHECK(hp_ggml_type_block(HP_GGML_Q4_K, &be, &bb) && be == 256 && bb == 144);
    CHECK(hp_ggml_type_block(HP_GGML_Q6_K, &be, &bb) && be == 256 && bb == 210);
    CHECK(hp_ggml_type_block(HP_GGML_Q4_1, &be, &bb) && be == 32 && bb == 20);
    CHECK(!hp_ggml_type_known(4) && !hp_ggml_type_known(31) && !hp_ggml_type_known(1000));
    CHECK_STR_EQ(hp_ggml_type_name(HP_GGML_BF16), "BF16");
    CHECK_STR_EQ(hp_ggml_type_name(5), "?");
    CHECK(hp_ggml_type_dequantizable(HP_GGML_Q6_K) && !hp_ggml_type_dequantizable(HP_GGML_Q5_K));
    CHECK_STR_EQ(hp_gguf_vtype_name(HP_GGUF_F64), "FLOAT64");
}

TEST(dequantize_blocks)
{
    unsigned char b[256] = {0};
    float y[256];
    /* Q4_0: d = 2, qs[j] = j | (15 - j) << 4: x[j] = 2 (j - 8), x[j + 16] = 2 (7 - j) */
    put_f16(b, 2.0f);
    for (int j = 0; j < 16; j++) b[2 + j] = (unsigned char)(j | (15 - j) << 4);
    CHECK(hp_gguf_dequantize(HP_GGML_Q4_0, b, y, 32));
    CHECK(y[0] == -16 && y[15] == 14 && y[16] == 14 && y[31] == -16);
    /* Q4_1: d = 0.5, m = -1: x = 0.5 q - 1 */
    put_f16(b + 2, -1.0f);
    put_f16(b, 0.5f);
    for (int j = 0; j < 16; j++) b[4 + j] = (unsigned char)(j | (15 - j) << 4);
    CHECK(hp_gguf_dequantize(HP_GGML_Q4_1, b, y, 32));
    CHECK(y[0] == -1 && y[15] == 6.5f && y[16] == 6.5f);
    /* Q4_K: d = 1, dmin = 0.5; sub-block 0 scale 3 min 2; sub-block 5: scale (s[9] & 15) | (s[1] >> 6) << 4 */
    memset(b, 0, sizeof b);
    put_f16(b, 1.0f);
    put_f16(b + 2, 0.5f);
    b[4 + 0] = 3;             /* sc[0] */
    b[4 + 4] = 2;             /* m[0] */
    b[4 + 1] = 1u << 6;       /* high bits of sc[5] = 1 */
    b[4 + 9] = 0x4 | 0x10;    /* sc[5] low 4, m[5] low 4 = 1 */
    b[16 + 0] = 0x07;         /* sub-block 0, element 0: q = 7; sub-block 1 element 0: q = 0 */
    b[16 + 64 + 1] = 0x50;    /* chunk 2, byte 1, high nibble: sub-block 5 element 1: q = 5 */
    CHECK(hp_gguf_dequantize(HP_GGML_Q4_K, b, y, 256));
    CHECK(y[0] == 3 * 7 - 1);
    CHECK(y[1] == -1);                    /* q = 0: -dmin m */
    CHECK(y[32 * 5 + 1] == 20 * 5 - 0.5f); /* sc[5] = 4 | 1 << 4 = 20, m[5] = 1 */
    /* Q6_K: d = 0.25, scales[e/16]; element e = 128 h + 32 s + l */
    memset(b, 0, sizeof b);
    put_f16(b + 208, 0.25f);
    for (int i = 0; i < 16; i++) b[192 + i] = (unsigned char)(int8_t)(i - 8);
    b[0] = 0x3f;          /* ql[0]: element 0 low 4 = 15, element 64 (s = 2) low 4 = 3 */
    b[128] = 0x03 | 0x20; /* qh[0]: element 0 high 2 = 3, element 64 high 2 = 2 */
    CHECK(hp_gguf_dequantize(HP_GGML_Q6_K, b, y, 256));
    CHECK(y[0] == 0.25f * -8 * ((15 | 3 << 4) - 32));
    CHECK(y[64] == 0.25f * (64 / 16 - 8) * ((3 | 2 << 4) - 32));
    CHECK(y[1] == 0.25f * -8 * -32);
    /* BF16 and F16 */
    unsigned char h[4] = {0x80, 0x3f, 0x00, 0xc0}; /* bf16 1.0, f16 -2.0 */
    CHECK(hp_gguf_dequantize(HP_GGML_BF16, h, y, 1) && y[0] == 1.0f);
    CHECK(hp_gguf_dequantize(HP_GGML_F16, h + 2, y, 1) && y[0] == -2.0f);
    CHECK(!hp_gguf_dequantize(HP_GGML_Q5_K, b, y, 256));
    CHECK(!hp_gguf_dequantize(HP_GGML_Q8_0, b, y, 16)); /* not whole blocks */
}

TEST(read_of_an_undequantizable_type)
{
    size_t len;
    unsigned char *b = one_tensor(&len, "k5", 1, (uint64_t[]){256}, HP_GGML_Q5_K, 0, 176);
    hp_gguf_file *f = open_ok(b, len);
    if (f) {
        float y[256];
        hp_err e;
        CHECK(hp_gguf_read_f32(f, hp_gguf_tensor_at(f, 0), 0, 1, y, &e) == HP_ERR_INPUT);
        CHECK_STR_CONTAINS(e.msg, "tensor 'k5' is Q5_K, which hyperpar cannot dequantize (it reads F32, F16, BF16");
    }
    hp_gguf_close(f);
    free(b);
}

/* A file truncated by another process after it was opened: the read is HP_ERR_IO, not SIGBUS. */
TEST(file_truncated_meanwhile)
{
    char dir[256], p[300];
    test_tmpdir(dir, sizeof dir);
    snprintf(p, sizeof p, "%s/t.gguf", dir);
    gfile g = {0};
    static float big[4096];
    gf_tensor(&g, "a", 1, (uint64_t[]){4096}, HP_GGML_F32, big, sizeof big);
    gf_tensor(&g, "b", 1, (uint64_t[]){4096}, HP_GGML_F32, big, sizeof big);
    size_t len;
    unsigned char *b = gf_image(&g, &len);
    gf_free(&g);
    FILE *fp = fopen(p, "wb");
    CHECK(fp && fwrite(b, 1, len, fp) == len);
    if (fp) fclose(fp);
    free(b);
    CHECK(hp_gguf_is_gguf(p));
    hp_gguf_file *f = NULL;
    hp_err e;
    CHECK(hp_gguf_open(&f, p, &e) == HP_OK);
    if (!f) return;
    CHECK(truncate(p, 20000) == 0);
    float row[4096];
    CHECK(hp_gguf_read_f32(f, hp_gguf_find_tensor(f, "b"), 0, 1, row, &e) == HP_ERR_IO);
    CHECK_STR_CONTAINS(e.msg, "t.gguf changed while reading (truncated or rewritten by another process)");
    hp_gguf_close(f);
    CHECK(hp_gguf_open(&f, p, &e) == HP_ERR_INPUT && f == NULL);
    CHECK_STR_CONTAINS(e.msg, "tensor 'b': its 16384 bytes at offset 16384 run past the end");
    snprintf(p, sizeof p, "%s/missing.gguf", dir);
    CHECK(!hp_gguf_is_gguf(p));
    CHECK(hp_gguf_open(&f, p, &e) == HP_ERR_INPUT);
}

TEST_MAIN()
