/* test_safetensors.c — the safetensors reader (golden files, every validation error, truncation and
 * corruption sweeps) and the writer (round trip, streaming, errors). */
#include "hyperpar/safetensors.h"
#include "testlib.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- helpers ---- */

/* A fresh scratch folder (testlib.h), in a static buffer. */
static char *make_tmpdir(void)
{
    static char dir[200];
    return test_tmpdir(dir, sizeof dir);
}

static void remove_tmpdir(const char *dir) { CHECK(test_rm_rf(dir)); }

static int count_files(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static unsigned char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    *len = 0;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(n > 0 ? (size_t)n : 1);
    *len = fread(b, 1, (size_t)n, f);
    fclose(f);
    return b;
}

static void write_all(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    CHECK(fwrite(b, 1, n, f) == n);
    fclose(f);
}

/* A file image: u64 LE strlen(hdr), hdr, then data_len bytes of a pattern. Caller frees. */
static unsigned char *mk(const char *hdr, size_t data_len, size_t *len)
{
    size_t n = strlen(hdr);
    *len = 8 + n + data_len;
    unsigned char *b = malloc(*len);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(b + 8, hdr, n);
    for (size_t i = 0; i < data_len; i++) b[8 + n + i] = (unsigned char)(i * 7 + 1);
    return b;
}

/* Opens the image and expects HP_ERR_INPUT with needle (and the label) in the message. */
static void expect_bad_at(const unsigned char *b, size_t len, const char *needle, int line)
{
    hp_st_file *f = (hp_st_file *)1;
    hp_err e;
    hp_err_clear(&e);
    hp_status st = hp_st_open_memory(&f, b, len, "bad.safetensors", &e);
    CHECK_MSG(st == HP_ERR_INPUT, "line %d: status %d", line, (int)st);
    CHECK_MSG(f == NULL, "line %d: out not NULL", line);
    CHECK_MSG(strstr(e.msg, needle) != NULL, "line %d: \"%s\" does not contain \"%s\"", line, e.msg, needle);
    CHECK_MSG(strncmp(e.msg, "bad.safetensors: ", 17) == 0, "line %d: no label in \"%s\"", line, e.msg);
    if (st == HP_OK) hp_st_close(f);
}
#define EXPECT_BAD(b, len, needle) expect_bad_at(b, len, needle, __LINE__)

/* Builds the image from hdr and data_len and expects the error. */
static void expect_hdr_bad_at(const char *hdr, size_t data_len, const char *needle, int line)
{
    size_t len;
    unsigned char *b = mk(hdr, data_len, &len);
    expect_bad_at(b, len, needle, line);
    free(b);
}
#define EXPECT_HDR_BAD(hdr, data_len, needle) expect_hdr_bad_at(hdr, data_len, needle, __LINE__)

static hp_st_file *open_ok(const unsigned char *b, size_t len)
{
    hp_st_file *f = NULL;
    hp_err e;
    hp_err_clear(&e);
    hp_status st = hp_st_open_memory(&f, b, len, "ok.safetensors", &e);
    CHECK_MSG(st == HP_OK, "%s", e.msg);
    return f;
}

/* ---- golden files ---- */

static const struct {
    const char *folder;
    size_t n_tensors;
} golden[] = {
    {"deepseek_v3_per_expert_f32", 139}, {"glm4_moe_batched_bf16", 31}, {"gpt_oss_batched_f32", 20},
    {"mixtral_batched_bf16", 21},        {"mixtral_per_expert_f32", 65}, {"qwen2_moe_per_expert_f32", 79},
    {"qwen3_moe_batched_bf16", 25},
};

/* Counts "data_offsets" in the raw header: an oracle independent of the parser. */
static size_t raw_count(const unsigned char *b, size_t len, const char *needle)
{
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | b[i];
    size_t c = 0, m = strlen(needle);
    for (size_t i = 8; i + m <= 8 + n && i + m <= len; i++) c += memcmp(b + i, needle, m) == 0;
    return c;
}

TEST(golden_files_open)
{
    for (size_t g = 0; g < sizeof golden / sizeof golden[0]; g++) {
        char path[256];
        snprintf(path, sizeof path, "data/golden/%s/model.safetensors", golden[g].folder);
        hp_st_file *f = NULL;
        hp_err e;
        hp_err_clear(&e);
        CHECK_MSG(hp_st_open(&f, path, &e) == HP_OK, "%s", e.msg);
        if (!f) continue;
        size_t len;
        unsigned char *raw = read_all(path, &len);
        CHECK_EQ_INT(hp_st_count(f), golden[g].n_tensors);
        CHECK_EQ_INT(hp_st_count(f), raw_count(raw, len, "\"data_offsets\""));
        CHECK_EQ_INT(hp_st_file_size(f), len);
        CHECK_STR_EQ(hp_st_path(f), path);
        CHECK_STR_EQ(hp_st_tensor_at(f, 0)->name, "model.embed_tokens.weight");
        CHECK_STR_EQ(hp_st_metadata_get(f, "format"), "pt");
        CHECK(hp_st_tensor_at(f, hp_st_count(f)) == NULL);
        /* Header order: each name appears in the raw header after the previous one. */
        const char *prev = (const char *)raw + 8;
        uint64_t total = 0;
        for (size_t i = 0; i < hp_st_count(f); i++) {
            const hp_st_tensor *t = hp_st_tensor_at(f, i);
            char quoted[300];
            snprintf(quoted, sizeof quoted, "\"%s\":", t->name);
            const char *at = strstr(prev, quoted);
            CHECK_MSG(at != NULL && at >= prev, "%s out of header order", t->name);
            if (at) prev = at;
            CHECK(hp_st_find(f, t->name) == t);
            CHECK(t->dtype == HP_DT_F32 || t->dtype == HP_DT_BF16);
            int64_t nb;
            CHECK(hp_dtype_nbytes(t->dtype, t->n_elems, &nb) && (uint64_t)nb == t->end - t->begin);
            const unsigned char *d = hp_st_data(f, t);
            CHECK(memcmp(d, raw + hp_st_data_offset(f) + t->begin, t->end - t->begin) == 0);
            total += t->end - t->begin;
        }
        CHECK_EQ_INT(hp_st_data_offset(f) + total, len);
        CHECK(hp_st_find(f, "no.such.tensor") == NULL);
        free(raw);
        hp_st_close(f);

        snprintf(path, sizeof path, "data/golden/%s/moe_io.safetensors", golden[g].folder);
        CHECK_MSG(hp_st_open(&f, path, &e) == HP_OK, "%s", e.msg);
        CHECK(f && hp_st_find(f, "x") != NULL);
        CHECK(f && hp_st_metadata_count(f) == 4);
        hp_st_close(f);
    }
}

TEST(golden_specific_tensors)
{
    hp_st_file *f = NULL;
    hp_err e;
    CHECK(hp_st_open(&f, "data/golden/qwen3_moe_batched_bf16/model.safetensors", &e) == HP_OK);
    if (!f) return;
    const hp_st_tensor *t = hp_st_find(f, "model.layers.0.mlp.experts.gate_up_proj");
    CHECK(t != NULL);
    if (t) {
        CHECK(t->dtype == HP_DT_BF16 && t->n_dims == 3 && t->n_elems == 16 * 96 * 64);
        CHECK(t->shape[0] == 16 && t->shape[1] == 96 && t->shape[2] == 64);
        CHECK_EQ_INT(t->begin, 84480);
        CHECK_EQ_INT(t->end, 281088);
        /* to_f32 of BF16 equals the manual widening (bits << 16). */
        float *out = malloc((size_t)t->n_elems * sizeof *out);
        CHECK(hp_dtype_to_f32(t->dtype, hp_st_data(f, t), out, t->n_elems, &e) == HP_OK);
        const unsigned char *d = hp_st_data(f, t);
        int bad = 0, nonzero = 0;
        for (int64_t i = 0; i < t->n_elems; i++) {
            uint32_t u = (uint32_t)(d[2 * i] | (d[2 * i + 1] << 8)) << 16;
            float m;
            memcpy(&m, &u, 4);
            bad += memcmp(&m, &out[i], 4) != 0;
            nonzero += m != 0.0f;
        }
        CHECK_EQ_INT(bad, 0);
        CHECK(nonzero > 0);
        free(out);
    }
    hp_st_close(f);

    CHECK(hp_st_open(&f, "data/golden/glm4_moe_batched_bf16/model.safetensors", &e) == HP_OK);
    if (!f) return;
    t = hp_st_find(f, "model.layers.1.mlp.gate.e_score_correction_bias");
    CHECK(t && t->dtype == HP_DT_F32 && t->n_dims == 1 && t->shape[0] == 8);
    t = hp_st_find(f, "model.embed_tokens.weight");
    CHECK(t && t->dtype == HP_DT_BF16 && t->shape[0] == 128 && t->shape[1] == 64);
    hp_st_close(f);
}

/* ---- writer ---- */

typedef struct {
    uint64_t produced;
    int calls;
    int fail_at; /* call number that fails, or 0 */
} fill_state;

static unsigned char pattern(uint64_t i) { return (unsigned char)((i * 2654435761u) >> 13); }

static hp_status fill_pattern(void *ctx, void *dst, size_t nbytes, hp_err *err)
{
    fill_state *s = ctx;
    if (++s->calls == s->fail_at) return hp_err_set(err, HP_ERR_IO, "source went away");
    unsigned char *d = dst;
    for (size_t i = 0; i < nbytes; i++) d[i] = pattern(s->produced + i);
    s->produced += nbytes;
    return HP_OK;
}

/* Writes a small file of several dtypes to path; returns the number of tensors. */
static size_t write_sample(const char *path)
{
    static const float f32[6] = {1, -2, 3.5f, 0, 1e-3f, -7};
    static const uint16_t bf16[4] = {0x3f80, 0xc000, 0x7f80, 0x0001};
    static const uint16_t f16[4] = {0x3c00, 0x7bff, 0x0001, 0x8000};
    static const int64_t i64[3] = {-1, 0, INT64_MAX};
    static const uint8_t u8[5] = {1, 2, 3, 4, 5}, f4[2] = {0x12, 0x34}, bools[3] = {1, 0, 1};
    static const float scalar = 42.0f;
    hp_st_writer *w = hp_st_writer_create();
    hp_err e;
    hp_err_clear(&e);
    int64_t s23[2] = {2, 3}, s4[1] = {4}, s22[2] = {2, 2}, s3[1] = {3}, s5[1] = {5}, s04[2] = {0, 4};
    CHECK(hp_st_writer_set_metadata(w, "format", "pt", &e) == HP_OK);
    CHECK(hp_st_writer_set_metadata(w, "note", "first", &e) == HP_OK);
    CHECK(hp_st_writer_set_metadata(w, "note", "caf\xc3\xa9 \"quoted\"", &e) == HP_OK); /* replaces */
    CHECK(hp_st_writer_add(w, "w.f32", HP_DT_F32, 2, s23, f32, &e) == HP_OK);
    CHECK(hp_st_writer_add(w, "b.bf16", HP_DT_BF16, 1, s4, bf16, &e) == HP_OK);
    CHECK(hp_st_writer_add(w, "h.f16", HP_DT_F16, 2, s22, f16, &e) == HP_OK);
    CHECK(hp_st_writer_add(w, "scalar", HP_DT_F32, 0, NULL, &scalar, &e) == HP_OK);
    CHECK(hp_st_writer_add(w, "empty", HP_DT_F32, 2, s04, NULL, &e) == HP_OK);
    CHECK(hp_st_writer_add(w, "i.i64", HP_DT_I64, 1, s3, i64, &e) == HP_OK);
    CHECK(hp_st_writer_add(w, "u.u8", HP_DT_U8, 1, s5, u8, &e) == HP_OK);
    CHECK(hp_st_writer_add(w, "q.f4", HP_DT_F4, 2, s22, f4, &e) == HP_OK);
    CHECK(hp_st_writer_add(w, "m\xc3\xa4sk \"x\"", HP_DT_BOOL, 1, s3, bools, &e) == HP_OK);
    CHECK_MSG(hp_st_writer_write(w, path, &e) == HP_OK, "%s", e.msg);
    hp_st_writer_destroy(w);
    return 9;
}

TEST(writer_round_trip)
{
    char *dir = make_tmpdir();
    char p1[256], p2[256];
    snprintf(p1, sizeof p1, "%s/a.safetensors", dir);
    snprintf(p2, sizeof p2, "%s/b.safetensors", dir);
    write_all(p1, "old contents", 12);
    size_t n = write_sample(p1); /* replaces the existing file */
    CHECK_EQ_INT(count_files(dir), 1); /* no temporary left behind */
    hp_st_file *f = NULL;
    hp_err e;
    CHECK_MSG(hp_st_open(&f, p1, &e) == HP_OK, "%s", e.msg);
    if (!f) {
        remove_tmpdir(dir);
        return;
    }
    CHECK_EQ_INT(hp_st_count(f), n);
    CHECK_EQ_INT(hp_st_data_offset(f) % 8, 0);
    static const char *order[] = {"w.f32", "b.bf16", "h.f16", "scalar", "empty", "i.i64", "u.u8", "q.f4",
                                  "m\xc3\xa4sk \"x\""};
    for (size_t i = 0; i < n; i++) CHECK_STR_EQ(hp_st_tensor_at(f, i)->name, order[i]);
    const hp_st_tensor *t = hp_st_find(f, "scalar");
    CHECK(t && t->n_dims == 0 && t->n_elems == 1 && t->end - t->begin == 4);
    CHECK(t && *(const float *)hp_st_data(f, t) == 42.0f);
    t = hp_st_find(f, "empty");
    CHECK(t && t->n_dims == 2 && t->shape[0] == 0 && t->shape[1] == 4 && t->n_elems == 0 && t->begin == t->end);
    t = hp_st_find(f, "w.f32");
    float out[6];
    CHECK(t && hp_dtype_to_f32(t->dtype, hp_st_data(f, t), out, 6, &e) == HP_OK && out[2] == 3.5f && out[5] == -7);
    t = hp_st_find(f, "i.i64");
    int64_t i64[3];
    if (t) memcpy(i64, hp_st_data(f, t), sizeof i64);
    CHECK(t && t->dtype == HP_DT_I64 && i64[0] == -1 && i64[2] == INT64_MAX);
    t = hp_st_find(f, "q.f4");
    CHECK(t && t->dtype == HP_DT_F4 && t->end - t->begin == 2 && ((const uint8_t *)hp_st_data(f, t))[1] == 0x34);
    CHECK(hp_st_find(f, "m\xc3\xa4sk \"x\"") != NULL);
    CHECK_EQ_INT(hp_st_metadata_count(f), 2);
    const char *k, *v;
    hp_st_metadata_at(f, 1, &k, &v);
    CHECK_STR_EQ(k, "note");
    CHECK_STR_EQ(v, "caf\xc3\xa9 \"quoted\"");
    hp_st_metadata_at(f, 2, &k, &v);
    CHECK(k == NULL && v == NULL);
    CHECK(hp_st_metadata_get(f, "missing") == NULL);

    /* Rewriting what we read gives the same bytes. */
    hp_st_writer *w = hp_st_writer_create();
    for (size_t i = 0; i < hp_st_metadata_count(f); i++) {
        hp_st_metadata_at(f, i, &k, &v);
        CHECK(hp_st_writer_set_metadata(w, k, v, &e) == HP_OK);
    }
    for (size_t i = 0; i < n; i++) {
        t = hp_st_tensor_at(f, i);
        CHECK(hp_st_writer_add(w, t->name, t->dtype, t->n_dims, t->shape, hp_st_data(f, t), &e) == HP_OK);
    }
    CHECK_MSG(hp_st_writer_write(w, p2, &e) == HP_OK, "%s", e.msg);
    hp_st_writer_destroy(w);
    size_t l1, l2;
    unsigned char *b1 = read_all(p1, &l1), *b2 = read_all(p2, &l2);
    CHECK(l1 == l2 && l1 > 0 && memcmp(b1, b2, l1) == 0);
    CHECK(l1 == hp_st_file_size(f));
    /* The header is padded with spaces, compact and starts with the metadata. */
    CHECK(memcmp(b1 + 8, "{\"__metadata__\":{\"format\":\"pt\",", 31) == 0);
    CHECK(b1[hp_st_data_offset(f) - 1] == ' ' || b1[hp_st_data_offset(f) - 1] == '}');
    free(b1);
    free(b2);
    hp_st_close(f);
    remove_tmpdir(dir);
}

TEST(writer_empty_and_streaming)
{
    char *dir = make_tmpdir();
    char p[256];
    snprintf(p, sizeof p, "%s/empty.safetensors", dir);
    hp_err e;
    hp_st_writer *w = hp_st_writer_create();
    CHECK(hp_st_writer_write(w, p, &e) == HP_OK);
    hp_st_writer_destroy(w);
    size_t len;
    unsigned char *b = read_all(p, &len);
    CHECK(len == 16 && b && memcmp(b, "\x08\0\0\0\0\0\0\0{}      ", 16) == 0);
    free(b);

    /* A 9 MiB + 3 byte tensor from a fill callback arrives in order, in bounded pieces. */
    snprintf(p, sizeof p, "%s/big.safetensors", dir);
    fill_state s = {0, 0, 0};
    int64_t shape[1] = {(9 << 20) + 3};
    static const float one = 1.0f;
    w = hp_st_writer_create();
    CHECK(hp_st_writer_add(w, "first", HP_DT_F32, 0, NULL, &one, &e) == HP_OK);
    CHECK(hp_st_writer_add_fill(w, "big", HP_DT_U8, 1, shape, fill_pattern, &s, &e) == HP_OK);
    CHECK_MSG(hp_st_writer_write(w, p, &e) == HP_OK, "%s", e.msg);
    hp_st_writer_destroy(w);
    CHECK_EQ_INT(s.calls, 3);
    CHECK_EQ_INT(s.produced, shape[0]);
    hp_st_file *f = NULL;
    CHECK(hp_st_open(&f, p, &e) == HP_OK);
    const hp_st_tensor *t = f ? hp_st_find(f, "big") : NULL;
    CHECK(t && t->begin == 4 && t->end == 4 + (uint64_t)shape[0]);
    if (t) {
        const unsigned char *d = hp_st_data(f, t);
        int bad = 0;
        for (int64_t i = 0; i < shape[0]; i++) bad += d[i] != pattern((uint64_t)i);
        CHECK_EQ_INT(bad, 0);
    }
    hp_st_close(f);
    remove_tmpdir(dir);
}

TEST(writer_errors)
{
    char *dir = make_tmpdir();
    hp_err e;
    hp_st_writer *w = hp_st_writer_create();
    float x[4] = {0};
    int64_t s4[1] = {4}, neg[1] = {-1}, s3[1] = {3}, big[2] = {INT64_MAX, 2}, s9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    CHECK(hp_st_writer_add(w, "a", HP_DT_F32, 1, s4, x, &e) == HP_OK);
    CHECK(hp_st_writer_add(w, "a", HP_DT_F32, 1, s4, x, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "tensor 'a' was added twice");
    CHECK(hp_st_writer_add(w, "", HP_DT_F32, 1, s4, x, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "names must be non-empty UTF-8");
    CHECK(hp_st_writer_add(w, "__metadata__", HP_DT_F32, 1, s4, x, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "not \"__metadata__\"");
    CHECK(hp_st_writer_add(w, "bad\xff", HP_DT_F32, 1, s4, x, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "is not usable");
    CHECK(hp_st_writer_add(w, "n", HP_DT_F32, 1, neg, x, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "dimension 0 is -1");
    CHECK(hp_st_writer_add(w, "o", HP_DT_F32, 2, big, x, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "dimension 1 is 2, negative or overflowing");
    CHECK(hp_st_writer_add(w, "r", HP_DT_F32, 9, s9, x, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "rank 9 is outside 0..8");
    CHECK(hp_st_writer_add(w, "f4", HP_DT_F4, 1, s3, x, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "3 elements of F4 are not a whole number of bytes");
    CHECK(hp_st_writer_add(w, "nodata", HP_DT_F32, 1, s4, NULL, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "no data for 16 bytes");
    CHECK(hp_st_writer_add(w, "dt", HP_DT_COUNT, 1, s4, x, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "is not a known dtype");
    CHECK(hp_st_writer_add_fill(w, "nofill", HP_DT_F32, 1, s4, NULL, NULL, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "fill callback is NULL");
    CHECK(hp_st_writer_set_metadata(w, "k", NULL, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "metadata key and value must be");

    /* A folder that does not exist: HP_ERR_IO with strerror. */
    char p[256];
    snprintf(p, sizeof p, "%s/no/such/x.safetensors", dir);
    CHECK(hp_st_writer_write(w, p, &e) == HP_ERR_IO);
    CHECK_STR_CONTAINS(e.msg, "cannot create: No such file or directory");
    hp_st_writer_destroy(w);

    /* A failing fill callback: its status and message come back, the temporary is removed. */
    snprintf(p, sizeof p, "%s/x.safetensors", dir);
    fill_state s = {0, 0, 2};
    int64_t shape[1] = {(5 << 20)};
    w = hp_st_writer_create();
    CHECK(hp_st_writer_add_fill(w, "big", HP_DT_U8, 1, shape, fill_pattern, &s, &e) == HP_OK);
    CHECK(hp_st_writer_write(w, p, &e) == HP_ERR_IO);
    CHECK_STR_CONTAINS(e.msg, "x.safetensors: tensor 'big': source went away");
    CHECK_EQ_INT(count_files(dir), 0);
    hp_st_writer_destroy(w);
    hp_st_writer_destroy(NULL);
    remove_tmpdir(dir);
}

/* ---- corrupt input ---- */

static unsigned char *sample_image(size_t *len)
{
    char *dir = make_tmpdir();
    char p[256];
    snprintf(p, sizeof p, "%s/s.safetensors", dir);
    write_sample(p);
    unsigned char *b = read_all(p, len);
    remove_tmpdir(dir);
    return b;
}

/* A sweep's try (testlib.h): the file opens with its invariants, or fails with HP_ERR_INPUT naming it ("t"). */
static int open_or_refuse(const unsigned char *b, size_t len)
{
    hp_st_file *f = (hp_st_file *)1;
    hp_err e;
    e.msg[0] = '\0';
    hp_status st = hp_st_open_memory(&f, b, len, "t", &e);
    if (st != HP_OK) return st == HP_ERR_INPUT && f == NULL && strncmp(e.msg, "t: ", 3) == 0 ? 0 : -1;
    int wrong = 0;
    for (size_t i = 0; i < hp_st_count(f); i++) {
        const hp_st_tensor *t = hp_st_tensor_at(f, i);
        wrong += hp_st_find(f, t->name) != t || hp_st_data_offset(f) + t->end > len;
    }
    hp_st_close(f);
    return wrong ? -1 : 1;
}

TEST(truncation_sweep)
{
    size_t len;
    unsigned char *b = sample_image(&len);
    CHECK(b && len > 100);
    hp_st_file *f = open_ok(b, len);
    hp_st_close(f);
    CHECK_EQ_INT(test_prefix_sweep(b, len, open_or_refuse), 0);
    free(b);
}

TEST(header_byte_corruption_sweep)
{
    size_t len;
    unsigned char *b = sample_image(&len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | b[i];
    test_sweep s = test_byte_sweep(b, len, 8 + n, 1, open_or_refuse);
    CHECK_EQ_INT(s.wrong, 0);
    CHECK(s.opened > 0 && s.refused > s.opened);
    free(b);
}

TEST(corrupt_framing)
{
    EXPECT_BAD((const unsigned char *)"", 0, "the file is 0 bytes, smaller than the 8-byte header length; not a "
                                             "safetensors file");
    EXPECT_BAD((const unsigned char *)"abc", 3, "is 3 bytes, smaller than the 8-byte header length");
    unsigned char b[32] = {0xe8, 0x03}; /* N = 1000 in a 32-byte file */
    EXPECT_BAD(b, sizeof b, "header length 1000 runs past the end of the file (32 bytes, 24 after the length "
                            "field); the file looks truncated");
    unsigned char huge[16] = {0x00, 0xc2, 0xeb, 0x0b}; /* 200,000,000 */
    EXPECT_BAD(huge, sizeof huge, "header length 200000000 is larger than the 100000000-byte limit");
    unsigned char zip[64] = {'P', 'K', 3, 4, 20, 0, 0, 0};
    EXPECT_BAD(zip, sizeof zip, "looks like a zip/PyTorch .bin archive, not safetensors; convert it");
    unsigned char pickle[64] = {0x80, 0x02, '}', 'q', 0, '(', 'X', 1};
    EXPECT_BAD(pickle, sizeof pickle, "looks like a pickle/PyTorch .bin file, not safetensors");
    EXPECT_HDR_BAD("[]", 0, "the JSON header must begin with '{' but it does not; not a safetensors file");
    EXPECT_HDR_BAD(" {}", 0, "must begin with '{'");
    EXPECT_HDR_BAD("", 0, "must begin with '{' but it is empty");
    EXPECT_HDR_BAD("{\"a\":", 0, "the header is not valid JSON: ");
    EXPECT_HDR_BAD("{\"a\":", 0, "(line 1, column 5)");
    EXPECT_HDR_BAD("{}x", 0, "the header is not valid JSON: end of file expected");
    EXPECT_HDR_BAD("{\"a\":\"\\u0000\"}", 0, "not valid JSON");
    size_t len;
    unsigned char *nul = mk("{\"a\x00\":1}", 0, &len); /* strlen stops at the NUL: "{\"a" */
    EXPECT_BAD(nul, len, "not valid JSON");
    free(nul);
    /* Trailing JSON whitespace after the object is accepted, as serde_json in the reference reader does. */
    nul = mk("{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}} \t\n", 4, &len);
    hp_st_file *f = open_ok(nul, len);
    CHECK(f && hp_st_count(f) == 1);
    hp_st_close(f);
    free(nul);
}

TEST(corrupt_entries)
{
    EXPECT_HDR_BAD("{\"w\":{\"dtype\":\"F12\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                   "tensor 'w': unknown dtype 'F12'; known dtypes are BOOL, F4, F6_E2M3");
    EXPECT_HDR_BAD("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'w': \"dtype\" is missing");
    EXPECT_HDR_BAD("{\"w\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "\"dtype\" is integer");
    EXPECT_HDR_BAD("{\"w\":3}", 0, "tensor 'w': the header entry is a JSON integer, not an object");
    EXPECT_HDR_BAD("{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "a tensor has an empty name");
    EXPECT_HDR_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":\"1\",\"data_offsets\":[0,4]}}", 4,
                   "tensor 'w': \"shape\" is string, expected an array");
    EXPECT_HDR_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,4]}}", 4,
                   "tensor 'w': shape dimension 0 is -2; dimensions must be non-negative");
    EXPECT_HDR_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,2.0],\"data_offsets\":[0,8]}}", 8,
                   "shape dimension 1 is a JSON real number");
    EXPECT_HDR_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,4]}}", 4,
                   "tensor 'w': the element count of shape [4294967296, 4294967296]... overflows a 64-bit integer");
    EXPECT_HDR_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,4]}}", 4,
                   "the byte size of F32 shape [4611686018427387904] overflows a 64-bit integer");
    EXPECT_HDR_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,4]}}", 4,
                   "too big integer");
    EXPECT_HDR_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
                   "tensor 'w': shape has 9 dimensions, more than the 8 this reader supports");
    EXPECT_HDR_BAD("{\"w\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2,
                   "tensor 'w': 3 elements of F4 (4 bits each) are not a whole number of bytes");
    EXPECT_HDR_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 4,
                   "tensor 'w': \"data_offsets\" is an array of 3 values, expected [begin, end]");
    EXPECT_HDR_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "\"data_offsets\" is missing");
    EXPECT_HDR_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":{}}}", 4,
                   "\"data_offsets\" is a JSON object");
    EXPECT_HDR_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4,
                   "\"data_offsets\" is not two non-negative integers");
    EXPECT_HDR_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8,
                   "tensor 'w': data_offsets [8, 4] end before they begin");
    EXPECT_HDR_BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,8]}}", 8,
                   "tensor 'w': data_offsets [0, 8] span 8 bytes but F32 shape [4] needs 16 bytes");
    EXPECT_HDR_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                   "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
                   "tensor 'a' appears twice in the header (line 1, column");
    EXPECT_HDR_BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                   "\"q\\\"\\u00e9\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
                   "\"q\\\"\\u00e9\":{}}", 8, "tensor 'q\"\xc3\xa9' appears twice");
    EXPECT_HDR_BAD("{\"__metadata__\":{\"n\":1}}", 0, "__metadata__ key 'n' holds a JSON integer, but metadata "
                   "values must be strings");
    EXPECT_HDR_BAD("{\"__metadata__\":[]}", 0, "__metadata__ is a JSON array, but it must be an object");
}

TEST(corrupt_layout)
{
    static const char *e4 = "{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":";
    char h[512];
    snprintf(h, sizeof h, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":%s[12,16]}}", e4);
    EXPECT_HDR_BAD(h, 16, "bytes [8, 12) of the data section, between tensor 'a' (ends at 8) and tensor 'b' "
                          "(begins at 12), belong to no tensor");
    snprintf(h, sizeof h, "{\"b\":%s[4,8]},\"a\":%s[0,4]}}", e4, e4);
    hp_st_file *f = NULL;
    size_t len;
    unsigned char *b = mk(h, 8, &len);
    f = open_ok(b, len); /* out of order in the header is fine */
    CHECK(f && hp_st_count(f) == 2 && strcmp(hp_st_tensor_at(f, 0)->name, "b") == 0);
    hp_st_close(f);
    free(b);
    snprintf(h, sizeof h, "{\"a\":%s[0,4]},\"b\":%s[0,4]}}", e4, e4);
    EXPECT_HDR_BAD(h, 4, "tensors 'a' [0, 4) and 'b' [0, 4) overlap in the data section");
    snprintf(h, sizeof h, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":%s[4,8]}}", e4);
    EXPECT_HDR_BAD(h, 8, "tensors 'a' [0, 8) and 'b' [4, 8) overlap");
    snprintf(h, sizeof h, "{\"a\":%s[4,8]}}", e4);
    EXPECT_HDR_BAD(h, 8, "tensor 'a' begins at byte 4 but the first tensor must begin at 0");
    snprintf(h, sizeof h, "{\"a\":%s[0,4]}}", e4);
    EXPECT_HDR_BAD(h, 8, "4 trailing bytes follow the last tensor 'a' (which ends at 4 of a 8-byte data section)");
    EXPECT_HDR_BAD("{}", 4, "the header lists no tensors but 4 trailing bytes follow it");
    snprintf(h, sizeof h, "{\"a\":%s[0,4]},\"b\":%s[4,8]}}", e4, e4);
    EXPECT_HDR_BAD(h, 6, "tensor 'b': data_offsets end 8 is past the data section (6 bytes); the file looks "
                         "truncated.");
    /* Empty tensors: data size 0 is fine, and an empty tensor may sit at the end of the data. */
    b = mk("{\"__metadata__\":{},\"e\":{\"dtype\":\"BF16\",\"shape\":[0,3],\"data_offsets\":[0,0]}}", 0, &len);
    f = open_ok(b, len);
    CHECK(f && hp_st_count(f) == 1 && hp_st_metadata_count(f) == 0 && hp_st_tensor_at(f, 0)->n_elems == 0);
    hp_st_close(f);
    free(b);
    snprintf(h, sizeof h, "{\"a\":%s[0,4]},\"e\":{\"dtype\":\"I8\",\"shape\":[0],\"data_offsets\":[4,4]}}", e4);
    b = mk(h, 4, &len);
    f = open_ok(b, len);
    CHECK(f && hp_st_count(f) == 2);
    hp_st_close(f);
    free(b);
    /* Unknown extra keys in an entry are ignored, as the reference reader does. */
    b = mk("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"extra\":1}}", 1, &len);
    f = open_ok(b, len);
    hp_st_close(f);
    free(b);
}

TEST(open_from_disk_errors)
{
    hp_st_file *f = (hp_st_file *)1;
    hp_err e;
    CHECK(hp_st_open(&f, "data/golden/no-such.safetensors", &e) == HP_ERR_INPUT && f == NULL);
    CHECK_STR_CONTAINS(e.msg, "data/golden/no-such.safetensors: cannot open: the path does not exist");
    CHECK(hp_st_open(&f, "data/golden", &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "data/golden: cannot open: the path is a folder");
    /* A FIFO used to block open() forever; now it is refused at once, by what it is. */
    {
        char *fd = make_tmpdir();
        char fifo[256];
        snprintf(fifo, sizeof fifo, "%s/pipe.safetensors", fd);
        CHECK(mkfifo(fifo, 0600) == 0);
        CHECK(hp_st_open(&f, fifo, &e) == HP_ERR_INPUT && f == NULL);
        CHECK_STR_CONTAINS(e.msg, "pipe.safetensors: cannot open: the path is a FIFO (named pipe)");
        test_rm_rf(fd);
    }
    char *dir = make_tmpdir();
    char p[256];
    snprintf(p, sizeof p, "%s/small.safetensors", dir);
    write_all(p, "abc", 3);
    CHECK(hp_st_open(&f, p, &e) == HP_ERR_INPUT && f == NULL);
    CHECK_STR_CONTAINS(e.msg, "small.safetensors: the file is 3 bytes, smaller than the 8-byte header length");
    write_all(p, "", 0);
    CHECK(hp_st_open(&f, p, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "is 0 bytes");
    size_t len;
    unsigned char *b = mk("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 2, &len);
    write_all(p, b, len);
    CHECK(hp_st_open(&f, p, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "small.safetensors: tensor 'a': data_offsets end 4 is past the data section (2 bytes)");
    free(b);
    remove_tmpdir(dir);
}

/* A file truncated by another process after hp_st_open: hp_st_read of the lost part is HP_ERR_IO "changed while
 * reading" (not SIGBUS), reads of what is left still work, and a read outside the tensor is HP_ERR_INPUT. A
 * direct read through hp_st_data of the lost part ends the process with exit 1 and the file's name (the
 * guard's last resort), never signal 7. */
TEST(read_of_a_file_truncated_meanwhile_is_an_error)
{
    char *dir = make_tmpdir();
    char p[256];
    snprintf(p, sizeof p, "%s/t.safetensors", dir);
    enum { N = 64 << 10 }; /* 256 KiB of f32: several pages */
    float *v = malloc(N * sizeof *v);
    for (int i = 0; i < N; i++) v[i] = (float)i;
    hp_st_writer *w = hp_st_writer_create();
    hp_err e;
    int64_t shape[1] = {N};
    CHECK(hp_st_writer_add(w, "w", HP_DT_F32, 1, shape, v, &e) == HP_OK && hp_st_writer_write(w, p, &e) == HP_OK);
    hp_st_writer_destroy(w);
    hp_st_file *f = NULL;
    CHECK(hp_st_open(&f, p, &e) == HP_OK);
    const hp_st_tensor *t = f ? hp_st_find(f, "w") : NULL;
    CHECK(t != NULL);
    float got[1024];
    if (t) {
        CHECK(hp_st_read(f, t, 4096 * sizeof(float), got, sizeof got, &e) == HP_OK && got[7] == 4096 + 7);
        CHECK(truncate(p, 8192) == 0);
        CHECK_EQ_INT(hp_st_read(f, t, (N - 1024) * sizeof(float), got, sizeof got, &e), HP_ERR_IO);
        CHECK_STR_CONTAINS(e.msg, "t.safetensors changed while reading (truncated or rewritten by another process)");
        CHECK_STR_CONTAINS(e.msg, "tensor 'w'");
        CHECK(hp_st_read(f, t, 0, got, 16, &e) == HP_OK && got[3] == 3); /* the guard keeps working */
        CHECK_EQ_INT(hp_st_read(f, t, N * sizeof(float) - 8, got, 16, &e), HP_ERR_INPUT);
        CHECK_STR_CONTAINS(e.msg, "outside its 262144 bytes");
        int pipefd[2];
        CHECK(pipe(pipefd) == 0);
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            dup2(pipefd[1], 2);
            volatile float x = ((const float *)hp_st_data(f, t))[N - 1]; /* past the new end */
            (void)x;
            _exit(0);
        }
        close(pipefd[1]);
        char msg[1024] = "";
        size_t len = 0;
        for (ssize_t k; len < sizeof msg - 1 && (k = read(pipefd[0], msg + len, sizeof msg - 1 - len)) > 0;)
            len += (size_t)k;
        msg[len] = '\0';
        close(pipefd[0]);
        int status = 0;
        CHECK(waitpid(pid, &status, 0) == pid);
        CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 1, "status %#x", status);
        CHECK_STR_CONTAINS(msg, "hyperpar: error: ");
        CHECK_STR_CONTAINS(msg, "t.safetensors changed while reading");
    }
    hp_st_close(f);
    /* Closed: the guard is gone with the last mapping, and the file opens as what it now is. */
    CHECK_EQ_INT(hp_st_open(&f, p, &e), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "the file looks truncated");
    free(v);
    remove_tmpdir(dir);
}

TEST_MAIN()
