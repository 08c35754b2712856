/* test_data.c — token files (uint16/uint32 streams, safetensors input_ids), windows, the batch order (in order
 * and seeded per epoch), the errors (odd size, short file, a token past the vocabulary, bad input_ids), the
 * learning-rate schedule at given points, and the token inputs of run, validate and cost (hp_ids_load: --ids,
 * --random-input, a stream cut into rows) with their errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperpar/data.h"
#include "hyperpar/safetensors.h"
#include "testlib.h"

static const char *path_in(const char *name)
{
    static char p[8][256];
    static int k;
    char *s = p[k++ % 8];
    snprintf(s, 256, "%s/%s", test_work_dir("data"), name);
    return s;
}

/* n tokens t[i] = (i * 7 + 3) % mod as little-endian uint16 (es 2) or uint32 (es 4). */
static const char *write_stream(const char *name, int64_t n, int es, int64_t mod)
{
    const char *p = path_in(name);
    FILE *f = fopen(p, "wb");
    CHECK(f != NULL);
    for (int64_t i = 0; f && i < n; i++) {
        uint32_t v = (uint32_t)((i * 7 + 3) % mod);
        unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                              (unsigned char)(v >> 24)};
        fwrite(b, 1, (size_t)es, f);
    }
    if (f) fclose(f);
    return p;
}

static int64_t tok(int64_t i, int64_t mod) { return (i * 7 + 3) % mod; }

static const hp_data_order g_none = {.shuffle = HP_DATA_IN_ORDER, .global_batch = 3};

TEST(stream_windows_uint16)
{
    hp_err err;
    hp_data *d = NULL;
    /* 33 tokens, S = 8: W = floor(32 / 8) = 4; 34 tokens still 4 (the 5th window lacks its last label). */
    const char *p = write_stream("a.bin", 34, 2, 1000);
    CHECK_EQ_INT(hp_data_open(&d, p, HP_DATA_U16, 8, &err), HP_OK);
    if (!d) return;
    CHECK_EQ_INT(hp_data_windows(d), 4);
    CHECK_EQ_INT(hp_data_row_len(d), 9);
    CHECK_EQ_INT(hp_data_row_scored(d), 8);
    int64_t ids[3 * 9];
    /* Step 0 in order: windows 0, 1, 2; window i is tokens [8i, 8i + 8]. */
    CHECK_EQ_INT(hp_data_batch(d, &g_none, 0, 0, 3, 1000, ids, &err), HP_OK);
    for (int r = 0; r < 3; r++)
        for (int s = 0; s < 9; s++) CHECK_EQ_INT(ids[r * 9 + s], tok(8 * r + s, 1000));
    /* Step 1: windows 3, then 0, 1 of the next epoch (wrapping); rows 1..2 alone are windows 0, 1. */
    CHECK_EQ_INT(hp_data_batch(d, &g_none, 1, 0, 3, 1000, ids, &err), HP_OK);
    CHECK_EQ_INT(ids[0], tok(24, 1000));
    CHECK_EQ_INT(ids[9], tok(0, 1000));
    CHECK_EQ_INT(ids[18], tok(8, 1000));
    CHECK_EQ_INT(hp_data_batch(d, &g_none, 1, 1, 2, 1000, ids, &err), HP_OK);
    CHECK_EQ_INT(ids[0], tok(0, 1000));
    CHECK_EQ_INT(ids[9 + 8], tok(16, 1000));
    /* Rows past the global batch are refused. */
    CHECK_EQ_INT(hp_data_batch(d, &g_none, 0, 2, 2, 1000, ids, &err), HP_ERR_INPUT);
    hp_data_close(d);
}

TEST(stream_uint32_and_vocab)
{
    hp_err err;
    hp_data *d = NULL;
    const char *p = write_stream("b.bin", 17, 4, 70000);
    CHECK_EQ_INT(hp_data_open(&d, p, HP_DATA_U32, 4, &err), HP_OK);
    if (!d) return;
    CHECK_EQ_INT(hp_data_windows(d), 4);
    int64_t ids[5];
    CHECK_EQ_INT(hp_data_rows(d, 3, 1, 70000, ids, &err), HP_OK);
    for (int s = 0; s < 5; s++) CHECK_EQ_INT(ids[s], tok(12 + s, 70000));
    /* Token 12 is 87; a vocabulary of 80 refuses window 3, naming the token's offset and byte offset. */
    CHECK_EQ_INT(tok(12, 70000), 87);
    CHECK_EQ_INT(hp_data_rows(d, 3, 1, 80, ids, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "token 12 (byte offset 48) is 87, outside the vocabulary [0, 80)");
    hp_data_close(d);
    /* The same file read as uint16 holds 34 tokens: other values (the high halves are 0). */
    CHECK_EQ_INT(hp_data_open(&d, p, HP_DATA_U16, 4, &err), HP_OK);
    if (d) {
        CHECK_EQ_INT(hp_data_windows(d), 8);
        CHECK_EQ_INT(hp_data_rows(d, 0, 1, 70000, ids, &err), HP_OK);
        CHECK_EQ_INT(ids[1], 0);
    }
    hp_data_close(d);
}

TEST(stream_errors)
{
    hp_err err;
    hp_data *d = (hp_data *)1;
    const char *p = write_stream("odd.bin", 10, 2, 100);
    test_sh("printf 'x' >> '%s'", p);
    CHECK_EQ_INT(hp_data_open(&d, p, HP_DATA_U16, 4, &err), HP_ERR_INPUT);
    CHECK(d == NULL);
    CHECK_STR_CONTAINS(err.msg, "21 bytes is not a whole number of uint16 tokens");
    p = write_stream("u32odd.bin", 5, 2, 100); /* 10 bytes: not uint32 */
    CHECK_EQ_INT(hp_data_open(&d, p, HP_DATA_U32, 2, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "not a whole number of uint32 tokens");
    p = write_stream("short.bin", 8, 2, 100);
    CHECK_EQ_INT(hp_data_open(&d, p, HP_DATA_U16, 8, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "holds 8 uint16 tokens, fewer than one window of --seq 8 (9 tokens");
    CHECK_EQ_INT(hp_data_open(&d, p, HP_DATA_U16, 7, &err), HP_OK);
    if (d) CHECK_EQ_INT(hp_data_windows(d), 1);
    hp_data_close(d);
    CHECK_EQ_INT(hp_data_open(&d, path_in("missing.bin"), HP_DATA_U16, 4, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "missing.bin");
    CHECK_EQ_INT(hp_data_open(&d, test_work_dir("data"), HP_DATA_U16, 4, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "folder");
    hp_data_dtype dt;
    CHECK(hp_data_dtype_parse("uint32", &dt) && dt == HP_DATA_U32);
    CHECK(!hp_data_dtype_parse("int16", &dt));
}

static const char *write_st(const char *name, hp_dtype dt, int64_t N, int64_t S, int64_t bad_at, int64_t bad)
{
    const char *p = path_in(name);
    int64_t n = N * S;
    int64_t *v64 = calloc((size_t)n, 8);
    int32_t *v32 = calloc((size_t)n, 4);
    for (int64_t i = 0; i < n; i++) {
        v64[i] = i == bad_at ? bad : tok(i, 100);
        v32[i] = (int32_t)v64[i];
    }
    hp_st_writer *w = hp_st_writer_create();
    hp_err err;
    int64_t shape[2] = {N, S};
    CHECK_EQ_INT(hp_st_writer_add(w, "input_ids", dt, 2, shape, dt == HP_DT_I64 ? (void *)v64 : (void *)v32, &err),
                 HP_OK);
    CHECK_EQ_INT(hp_st_writer_write(w, p, &err), HP_OK);
    hp_st_writer_destroy(w);
    free(v64);
    free(v32);
    return p;
}

TEST(safetensors_source)
{
    hp_err err;
    hp_data *d = NULL;
    for (int k = 0; k < 2; k++) {
        hp_dtype dt = k ? HP_DT_I32 : HP_DT_I64;
        const char *p = write_st(k ? "i32.safetensors" : "i64.safetensors", dt, 5, 6, -1, 0);
        CHECK_EQ_INT(hp_data_open(&d, p, HP_DATA_U16, 6, &err), HP_OK);
        if (!d) continue;
        CHECK_EQ_INT(hp_data_windows(d), 5);
        CHECK_EQ_INT(hp_data_row_len(d), 6);
        CHECK_EQ_INT(hp_data_row_scored(d), 5);
        int64_t ids[2 * 6];
        hp_data_order o = {.shuffle = HP_DATA_IN_ORDER, .global_batch = 2};
        /* Step 2: positions 4, 5 = windows 4, 0. */
        CHECK_EQ_INT(hp_data_batch(d, &o, 2, 0, 2, 100, ids, &err), HP_OK);
        for (int s = 0; s < 6; s++) {
            CHECK_EQ_INT(ids[s], tok(24 + s, 100));
            CHECK_EQ_INT(ids[6 + s], tok(s, 100));
        }
        hp_data_close(d);
        CHECK_EQ_INT(hp_data_open(&d, p, HP_DATA_U16, 5, &err), HP_ERR_INPUT);
        CHECK_STR_CONTAINS(err.msg, "input_ids is [5, 6]; its rows must be --seq 5 ids long");
    }
    const char *p = write_st("bad.safetensors", HP_DT_I64, 3, 4, 9, 100);
    CHECK_EQ_INT(hp_data_open(&d, p, HP_DATA_U16, 4, &err), HP_OK);
    int64_t ids[4];
    CHECK_EQ_INT(hp_data_rows(d, 2, 1, 100, ids, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "input_ids[2][1] = 100 is outside the vocabulary [0, 100)");
    hp_data_close(d);
    p = write_st("neg.safetensors", HP_DT_I32, 3, 4, 0, -5);
    CHECK_EQ_INT(hp_data_open(&d, p, HP_DATA_U16, 4, &err), HP_OK);
    CHECK_EQ_INT(hp_data_rows(d, 0, 1, 100, ids, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "input_ids[0][0] = -5");
    hp_data_close(d);
    p = write_st("f.safetensors", HP_DT_F32, 3, 4, -1, 0);
    CHECK_EQ_INT(hp_data_open(&d, p, HP_DATA_U16, 4, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "input_ids is F32; expected I64 or I32");
}

TEST(seeded_order)
{
    enum { W = 37 };
    int64_t a[W], b[W], c[W];
    hp_data_permutation(42, 0, W, a);
    hp_data_permutation(42, 0, W, b);
    hp_data_permutation(42, 1, W, c);
    int seen[W] = {0};
    int moved = 0, diff = 0;
    for (int i = 0; i < W; i++) {
        CHECK(a[i] >= 0 && a[i] < W);
        if (a[i] >= 0 && a[i] < W) seen[a[i]]++;
        CHECK_EQ_INT(a[i], b[i]);
        moved += a[i] != i;
        diff += a[i] != c[i];
    }
    for (int i = 0; i < W; i++) CHECK_EQ_INT(seen[i], 1); /* a permutation */
    CHECK(moved > W / 2);                                  /* shuffled */
    CHECK(diff > W / 2);                                   /* another order per epoch */
    /* The documented algorithm, spelled out: splitmix64 from seed ^ epoch, Fisher-Yates from the back. */
    uint64_t st = 42 ^ 1;
    int64_t ref[W];
    for (int i = 0; i < W; i++) ref[i] = i;
    for (int i = W - 1; i > 0; i--) {
        uint64_t z = (st += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        int j = (int)(z % (uint64_t)(i + 1));
        int64_t t = ref[i];
        ref[i] = ref[j];
        ref[j] = t;
    }
    for (int i = 0; i < W; i++) CHECK_EQ_INT(c[i], ref[i]);
    /* splitmix64's first output from state 0 (the reference value of Vigna's splitmix64.c). */
    uint64_t s0 = 0;
    CHECK(hp_splitmix64(&s0) == 0xE220A8397B1DCDAFull);

    /* Through a file: batches of 4 over W = 5 windows; the first 5 positions are epoch 0's permutation, the
     * next 5 epoch 1's, and another seed gives another order. */
    hp_err err;
    hp_data *d = NULL;
    const char *p = write_stream("s.bin", 5 * 3 + 1, 2, 1000);
    CHECK_EQ_INT(hp_data_open(&d, p, HP_DATA_U16, 3, &err), HP_OK);
    if (!d) return;
    hp_data_order o = {.shuffle = HP_DATA_SEEDED, .seed = 7, .global_batch = 4};
    int64_t e0[5], e1[5], got[3][4 * 4];
    hp_data_permutation(7, 0, 5, e0);
    hp_data_permutation(7, 1, 5, e1);
    for (int k = 0; k < 3; k++) CHECK_EQ_INT(hp_data_batch(d, &o, k, 0, 4, 1000, got[k], &err), HP_OK);
    for (int q = 0; q < 12; q++) {
        int64_t w = q < 5 ? e0[q] : q < 10 ? e1[q - 5] : -1;
        if (w < 0) continue;
        CHECK_EQ_INT(got[q / 4][(q % 4) * 4], tok(3 * w, 1000));
        int64_t at;
        CHECK_EQ_INT(hp_data_window_at(d, &o, q, &at, &err), HP_OK);
        CHECK_EQ_INT(at, w);
    }
    hp_data_close(d);
}

static hp_lr_schedule sched(hp_lr_kind k, int64_t W, int64_t N)
{
    return (hp_lr_schedule){.kind = k, .lr = 1e-3, .min_lr = 1e-4, .warmup = W, .steps = N};
}

#define NEAR(a, b) CHECK_MSG(fabs((a) - (b)) <= 1e-15, "%.17g vs %.17g", (double)(a), (double)(b))

TEST(schedule)
{
    hp_lr_schedule s = sched(HP_LR_COSINE, 2, 6);
    NEAR(hp_lr_at(&s, 1), 5e-4);
    NEAR(hp_lr_at(&s, 2), 1e-3);
    NEAR(hp_lr_at(&s, 4), 1e-4 + 0.5 * 9e-4); /* halfway: cos(pi/2) = 0 */
    NEAR(hp_lr_at(&s, 6), 1e-4);
    NEAR(hp_lr_at(&s, 3), 1e-4 + 0.5 * 9e-4 * (1 + cos(M_PI / 4)));
    s = sched(HP_LR_COSINE, 0, 4); /* no warmup: step 1 is already past lr */
    NEAR(hp_lr_at(&s, 1), 1e-4 + 0.5 * 9e-4 * (1 + cos(M_PI / 4)));
    NEAR(hp_lr_at(&s, 4), 1e-4);
    s = sched(HP_LR_LINEAR, 2, 6);
    NEAR(hp_lr_at(&s, 1), 5e-4);
    NEAR(hp_lr_at(&s, 3), 1e-3 - 9e-4 * 0.25);
    NEAR(hp_lr_at(&s, 6), 1e-4);
    s = sched(HP_LR_LINEAR, 0, 5);
    NEAR(hp_lr_at(&s, 1), 1e-3 - 9e-4 * 0.2);
    s = sched(HP_LR_CONSTANT, 4, 6);
    NEAR(hp_lr_at(&s, 1), 2.5e-4);
    NEAR(hp_lr_at(&s, 5), 1e-3);
    NEAR(hp_lr_at(&s, 6), 1e-3);
    s = sched(HP_LR_CONSTANT, 0, 6);
    NEAR(hp_lr_at(&s, 1), 1e-3);
    s = sched(HP_LR_COSINE, 3, 3); /* N = W: lr after the warmup */
    NEAR(hp_lr_at(&s, 3), 1e-3);
    NEAR(hp_lr_at(&s, 1), 1e-3 / 3);
    hp_lr_kind k;
    CHECK(hp_lr_kind_parse("linear", &k) && k == HP_LR_LINEAR);
    CHECK(!hp_lr_kind_parse("step", &k));
    CHECK_STR_EQ(hp_lr_kind_name(HP_LR_CONSTANT), "constant");
}

/* ---- the token inputs of run, validate and cost (hp_ids_load) ---- */

/* load src against vocab; on success the ids and shape, on failure err.msg */
static hp_status ids_of(hp_ids_source src, int64_t vocab, int64_t **ids, int64_t *B, int64_t *S, hp_err *err)
{
    *ids = NULL;
    *B = *S = -1;
    return hp_ids_load(&src, vocab, ids, B, S, err);
}

TEST(ids_list)
{
    hp_err err;
    int64_t *ids, B, S;
    CHECK_EQ_INT(ids_of((hp_ids_source){.kind = HP_IDS_LIST, .arg = " 1, 2 ,3 ; 4,5,6"}, 10, &ids, &B, &S, &err), HP_OK);
    CHECK(B == 2 && S == 3);
    for (int i = 0; ids && i < 6; i++) CHECK(ids[i] == i + 1);
    free(ids);
    CHECK_EQ_INT(ids_of((hp_ids_source){.kind = HP_IDS_LIST, .arg = "7"}, 10, &ids, &B, &S, &err), HP_OK);
    CHECK(B == 1 && S == 1 && ids && ids[0] == 7);
    free(ids);
    static const struct {
        const char *text, *msg;
    } bad[] = {
        {"", "--ids is empty"},
        {"  ", "--ids is empty"},
        {"1,2;3", "row 2 has 1 id, row 1 has 2; every row must be the same length"},
        {"1;2,3", "row 2 has 2 ids, row 1 has 1"},
        {"1,a", "row 1, column 2: 'a' is not a token id"},
        {"1;2;x", "row 3, column 1: 'x' is not a token id"},
        {"1,10", "row 1, column 2: 10 is outside the vocabulary [0, 10)"},
        {"-3", "row 1, column 1: -3 is outside the vocabulary"},
        {"99999999999999999999999", "99999999999999999999999 is outside the vocabulary"},
        {"1,,2", "row 1, column 2 is empty"},
        {"1,2;", "row 2, column 1 is empty"},
        {";1", "row 1, column 1 is empty"},
        {"1 2", "'2' after 1 is neither ',' nor ';'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        hp_status st = ids_of((hp_ids_source){.kind = HP_IDS_LIST, .arg = bad[i].text}, 10, &ids, &B, &S, &err);
        CHECK_EQ_INT(st, HP_ERR_INPUT);
        CHECK(ids == NULL);
        CHECK_STR_CONTAINS(err.msg, bad[i].msg);
    }
}

/* --random-input: the documented rule, ids[i] = splitmix64 output i from state seed, mod vocab */
TEST(ids_random)
{
    hp_err err;
    int64_t *ids, B, S;
    CHECK_EQ_INT(ids_of((hp_ids_source){.kind = HP_IDS_RANDOM, .B = 3, .S = 5, .seed = 42}, 1000, &ids, &B, &S, &err),
                 HP_OK);
    CHECK(B == 3 && S == 5);
    uint64_t state = 42;
    for (int i = 0; ids && i < 15; i++) CHECK(ids[i] == (int64_t)(hp_splitmix64(&state) % 1000));
    free(ids);
    /* the first output of splitmix64 from state 0, a published constant: 0xE220A8397B1DCDAF */
    CHECK_EQ_INT(ids_of((hp_ids_source){.kind = HP_IDS_RANDOM, .B = 1, .S = 1}, 1000003, &ids, &B, &S, &err), HP_OK);
    CHECK(ids && ids[0] == (int64_t)(0xE220A8397B1DCDAFull % 1000003));
    free(ids);
    CHECK_EQ_INT(ids_of((hp_ids_source){.kind = HP_IDS_RANDOM, .B = 0, .S = 5}, 10, &ids, &B, &S, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "--random-input: 0 rows of 5 tokens; each must be in [1,");
    CHECK_EQ_INT(hp_ids_parse_shape(" 2 , 16 ", &B, &S, &err), HP_OK);
    CHECK(B == 2 && S == 16);
    const char *shape_bad[] = {"2", "2,", ",3", "2,3,4", "a,b", "2x3", ""};
    for (size_t i = 0; i < sizeof shape_bad / sizeof *shape_bad; i++) {
        CHECK_EQ_INT(hp_ids_parse_shape(shape_bad[i], &B, &S, &err), HP_ERR_INPUT);
        CHECK_STR_CONTAINS(err.msg, "expected B,S");
    }
    CHECK_EQ_INT(hp_ids_parse_shape("0,3", &B, &S, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "B (the rows) must be in [1, 2147483647]");
    CHECK_EQ_INT(hp_ids_parse_shape("3,2147483648", &B, &S, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "S (the tokens per row) must be in [1, 2147483647]");
    CHECK_EQ_INT(hp_ids_parse_shape("99999999999999999999,1", &B, &S, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "B (the rows) must be in");
    CHECK_EQ_INT(ids_of((hp_ids_source){.kind = HP_IDS_RANDOM, .B = 2147483647, .S = 2147483647}, 10, &ids, &B, &S,
                        &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "overflow");
    /* a model that does not give its vocabulary size: nothing to draw from; a list is taken unchecked */
    CHECK_EQ_INT(ids_of((hp_ids_source){.kind = HP_IDS_RANDOM, .B = 1, .S = 1}, 0, &ids, &B, &S, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "no vocabulary size");
    CHECK_EQ_INT(ids_of((hp_ids_source){.kind = HP_IDS_LIST, .arg = "5000"}, 0, &ids, &B, &S, &err), HP_OK);
    CHECK(ids && ids[0] == 5000);
    free(ids);
}

/* a stream cut into rows of S without overlap, from its start; the vocabulary and length checked */
TEST(ids_stream)
{
    hp_err err;
    int64_t *ids, B, S;
    const char *p16 = write_stream("ids16.bin", 20, 2, 50), *p32 = write_stream("ids32.bin", 20, 4, 70000);
    CHECK_EQ_INT(ids_of((hp_ids_source){.kind = HP_IDS_STREAM, .arg = p16, .B = 3, .S = 6}, 50, &ids, &B, &S, &err),
                 HP_OK);
    CHECK(B == 3 && S == 6);
    for (int i = 0; ids && i < 18; i++) CHECK(ids[i] == tok(i, 50));
    free(ids);
    CHECK_EQ_INT(ids_of((hp_ids_source){.kind = HP_IDS_STREAM, .arg = p32, .dtype = HP_DATA_U32, .B = 2, .S = 10},
                        70000, &ids, &B, &S, &err), HP_OK);
    for (int i = 0; ids && i < 20; i++) CHECK(ids[i] == tok(i, 70000));
    free(ids);
    CHECK_EQ_INT(ids_of((hp_ids_source){.kind = HP_IDS_STREAM, .arg = p16, .B = 3, .S = 7}, 50, &ids, &B, &S, &err),
                 HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "holds 20 uint16 tokens, fewer than --batch 3 rows of --seq 7 (21 tokens)");
    /* token 1 is 10 (1*7+3): past a vocabulary of 10 */
    CHECK_EQ_INT(ids_of((hp_ids_source){.kind = HP_IDS_STREAM, .arg = p16, .B = 1, .S = 4}, 10, &ids, &B, &S, &err),
                 HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "token 1 (byte offset 2) is 10, outside the vocabulary [0, 10)");
    CHECK(ids == NULL);
    /* 40 bytes are 10 uint32 tokens too: the dtype is the caller's; token 0 = 3 | 10 << 16 */
    CHECK_EQ_INT(ids_of((hp_ids_source){.kind = HP_IDS_STREAM, .arg = p16, .dtype = HP_DATA_U32, .B = 1, .S = 1},
                        1 << 20, &ids, &B, &S, &err), HP_OK);
    CHECK(ids && ids[0] == (3 | 10 << 16));
    free(ids);
    /* a safetensors file as stored, with its vocabulary checked; a token file read as one names --seq */
    CHECK_EQ_INT(ids_of((hp_ids_source){.kind = HP_IDS_SAFETENSORS, .arg = p16}, 50, &ids, &B, &S, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "give --seq S to cut it into rows");
}

TEST_MAIN()
