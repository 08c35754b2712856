/* test_core.c — errors, checked math, arena, buffer, natural order, glob, formatting, hashing. */
#include "hyperpar/core.h"
#include "testlib.h"

TEST(err_set_and_prefix)
{
    hp_err e;
    hp_err_clear(&e);
    CHECK(hp_err_set(&e, HP_ERR_INPUT, "tensor '%s' is bad", "x") == HP_ERR_INPUT);
    hp_err_prefix(&e, "%s", "model.safetensors");
    CHECK_STR_EQ(e.msg, "model.safetensors: tensor 'x' is bad");
    CHECK_EQ_INT(hp_status_exit_code(HP_ERR_INPUT), 2);
    CHECK_EQ_INT(hp_status_exit_code(HP_ERR_IO), 1);
    CHECK_EQ_INT(hp_status_exit_code(HP_ERR_VERIFY), 3);
    CHECK_EQ_INT(hp_status_exit_code(HP_OK), 0);
}

TEST(checked_math)
{
    int64_t r;
    CHECK(hp_mul_i64(1 << 20, 1 << 20, &r) && r == (int64_t)1 << 40);
    CHECK(!hp_mul_i64(INT64_MAX / 2, 3, &r));
    CHECK(!hp_mul_i64(-1, 3, &r));
    CHECK(!hp_add_i64(INT64_MAX, 1, &r));
    size_t s;
    CHECK(!hp_mul_size(SIZE_MAX, 2, &s));
    CHECK(hp_add_size(1, 2, &s) && s == 3);
}

TEST(arena_and_buf)
{
    hp_arena a;
    hp_arena_init(&a);
    char *p = hp_arena_printf(&a, "layers.%d", 7);
    CHECK_STR_EQ(p, "layers.7");
    for (int i = 0; i < 10000; i++) CHECK(hp_arena_alloc(&a, 100) != NULL);
    void *big = hp_arena_alloc(&a, 1 << 20);
    CHECK(big != NULL && ((uintptr_t)big % 16) == 0);
    hp_arena_free(&a);
    hp_arena_free(NULL);

    hp_buf b;
    hp_buf_init(&b);
    for (int i = 0; i < 1000; i++) hp_buf_printf(&b, "%d,", i);
    CHECK(b.len > 3000 && strncmp(b.data, "0,1,2,", 6) == 0);
    hp_buf_free(&b);
}

TEST(natural_order)
{
    CHECK(hp_natural_cmp("layers.2.x", "layers.10.x") < 0);
    CHECK(hp_natural_cmp("layers.10", "layers.2") > 0);
    CHECK(hp_natural_cmp("a", "a") == 0);
    CHECK(hp_natural_cmp("a", "ab") < 0);
    CHECK(hp_natural_cmp("x007", "x7") == 0);
}

TEST(glob)
{
    CHECK(hp_glob_match("model.layers.*.mlp", "model.layers.3.mlp"));
    CHECK(hp_glob_match("*.experts.*", "model.layers.0.mlp.experts.1.w1"));
    CHECK(!hp_glob_match("model.layers.?.mlp", "model.layers.10.mlp"));
    CHECK(hp_glob_match("*", ""));
    CHECK(!hp_glob_match("a*b", "ac"));
    CHECK(hp_glob_match("model.layers.[12].mlp", "model.layers.2.mlp"));
    CHECK(!hp_glob_match("model.layers.[12].mlp", "model.layers.3.mlp"));
    CHECK(hp_glob_match("layers.[!0].x", "layers.5.x") && !hp_glob_match("layers.[!0].x", "layers.0.x"));
    CHECK(hp_glob_match("l[0-9]*", "l7abc") && !hp_glob_match("l[0-9]", "lx"));
    CHECK(hp_glob_match("a[b", "a[b")); /* malformed class: literal */
}

TEST(format)
{
    char buf[64];
    CHECK_STR_EQ(hp_format_count(46702792704ull, buf, sizeof buf), "46,702,792,704");
    CHECK_STR_EQ(hp_format_count(7, buf, sizeof buf), "7");
    CHECK_STR_EQ(hp_format_bytes(1536, buf, sizeof buf), "1.50 KiB");
    CHECK_STR_EQ(hp_format_bytes(12, buf, sizeof buf), "12 B");
}

/* Text from files shown on a terminal: controls, DEL, C1, bidi overrides and invalid UTF-8 become \xNN; printable
 * ASCII and other UTF-8 pass unchanged; a backslash is doubled only on request; a cut never splits an escape. */
TEST(escape_text_from_files)
{
    char buf[256];
    CHECK_STR_EQ(hp_escape("model.layers.0.mlp.up_proj.weight", buf, sizeof buf), "model.layers.0.mlp.up_proj.weight");
    CHECK_STR_EQ(hp_escape("up\x1b[31mproj", buf, sizeof buf), "up\\x1B[31mproj");
    CHECK_STR_EQ(hp_escape("a\nb\tc\x7f\x07", buf, sizeof buf), "a\\x0Ab\\x09c\\x7F\\x07");
    CHECK_STR_EQ(hp_escape("caf\xc3\xa9 \xe6\x97\xa5", buf, sizeof buf), "caf\xc3\xa9 \xe6\x97\xa5"); /* UTF-8 kept */
    CHECK_STR_EQ(hp_escape("\xc2\x9b" "2J", buf, sizeof buf), "\\xC2\\x9B2J");             /* C1 CSI */
    CHECK_STR_EQ(hp_escape("x\xe2\x80\xaey", buf, sizeof buf), "x\\xE2\\x80\\xAEy");      /* U+202E */
    CHECK_STR_EQ(hp_escape("\xff\xc3", buf, sizeof buf), "\\xFF\\xC3");                      /* invalid, cut */
    CHECK_STR_EQ(hp_escape("\xc0\xaf", buf, sizeof buf), "\\xC0\\xAF");                      /* overlong */
    CHECK_STR_EQ(hp_escape("a\\b", buf, sizeof buf), "a\\b");
    CHECK_STR_EQ(hp_escape(NULL, buf, sizeof buf), "");
    /* Cut to fit: whole escapes only, ending in "...". */
    char small[10];
    CHECK_STR_EQ(hp_escape("\x1b\x1b\x1b\x1b", small, sizeof small), "\\x1B...");
    CHECK_STR_EQ(hp_escape("abcdefghijkl", small, sizeof small), "abcdef...");
    CHECK_STR_EQ(hp_escape("abcdefghi", small, sizeof small), "abcdefghi");
    char tiny[3];
    CHECK(strlen(hp_escape("\x1b", tiny, sizeof tiny)) < sizeof tiny && !strchr(tiny, 0x1b));

    hp_buf b;
    hp_buf_init(&b);
    hp_buf_escape(&b, "a\\b\x1b\n", HP_ESC_BACKSLASH);
    hp_buf_append(&b, "", 1);
    CHECK_STR_EQ(b.data, "a\\\\b\\x1B\\x0A");
    b.len = 0;
    hp_buf_escape(&b, "line 1\n\tline \x1b[2J2", HP_ESC_KEEP_LINES);
    hp_buf_append(&b, "", 1);
    CHECK_STR_EQ(b.data, "line 1\n\tline \\x1B[2J2");
    hp_buf_free(&b);
    CHECK(hp_is_safe_text("plain \xc3\xa9", 0) && !hp_is_safe_text("e\x1b", 0) && !hp_is_safe_text("a\nb", 0));
    CHECK(hp_is_safe_text("a\nb", HP_ESC_KEEP_LINES) && !hp_is_safe_text("a\\b", HP_ESC_BACKSLASH));
}

/* hp_hash64 is XXH64: the reference digests (xxHash's own and python-xxhash's documented vectors). */
TEST(hash64_known_vectors)
{
    CHECK(hp_hash64_bytes("", 0, 0) == 0xEF46DB3751D8E999ull);
    CHECK(hp_hash64_bytes("a", 1, 0) == 0xD24EC4F1A98C6E5Bull);
    CHECK(hp_hash64_bytes("abc", 3, 0) == 0x44BC2CF5AD770999ull);
    const char *s = "Nobody inspects the spammish repetition"; /* 39 bytes: one 32-byte stripe and a tail */
    CHECK(hp_hash64_bytes(s, strlen(s), 0) == 0xFBCEA83C8A378BF1ull);
    CHECK(hp_hash64_bytes("abc", 3, 1) != hp_hash64_bytes("abc", 3, 0)); /* the seed is hashed */
}

/* The digest depends only on the bytes: any split of them into updates gives the one-shot value, and final()
 * leaves the state usable for more updates. */
TEST(hash64_streaming_is_split_independent)
{
    unsigned char buf[777];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)(i * 131 + 7);
    for (size_t n = 0; n <= sizeof buf; n += 37) {
        uint64_t want = hp_hash64_bytes(buf, n, 42);
        for (size_t piece = 1; piece <= 40; piece += 3) {
            hp_hash64 h;
            hp_hash64_init(&h, 42);
            for (size_t o = 0; o < n; o += piece) hp_hash64_update(&h, buf + o, n - o < piece ? n - o : piece);
            CHECK_MSG(hp_hash64_final(&h) == want, "n %zu in pieces of %zu", n, piece);
        }
    }
    hp_hash64 h;
    hp_hash64_init(&h, 0);
    hp_hash64_update(&h, buf, 100);
    CHECK(hp_hash64_final(&h) == hp_hash64_bytes(buf, 100, 0));
    hp_hash64_update(&h, buf + 100, 200);
    CHECK(hp_hash64_final(&h) == hp_hash64_bytes(buf, 300, 0));
    /* One flipped bit anywhere changes the digest. */
    uint64_t base = hp_hash64_bytes(buf, sizeof buf, 0);
    for (size_t i = 0; i < sizeof buf; i += 50) {
        buf[i] ^= 1;
        CHECK_MSG(hp_hash64_bytes(buf, sizeof buf, 0) != base, "bit 0 of byte %zu", i);
        buf[i] ^= 1;
    }
}

/* FNV-1a 64, kept for values files store (the manifest's plan fingerprint, gen's values): the published vectors,
 * and continuing from a running value equals hashing the concatenation. */
TEST(fnv1a64_known_vectors)
{
    CHECK(hp_fnv1a64(HP_FNV1A64_BASIS, "", 0) == 0xcbf29ce484222325ull);
    CHECK(hp_fnv1a64(HP_FNV1A64_BASIS, "a", 1) == 0xaf63dc4c8601ec8cull);
    CHECK(hp_fnv1a64(HP_FNV1A64_BASIS, "foobar", 6) == 0x85944171f73967e8ull);
    CHECK(hp_fnv1a64(hp_fnv1a64(HP_FNV1A64_BASIS, "foo", 3), "bar", 3) == 0x85944171f73967e8ull);
}

TEST(contains_ci)
{
    CHECK(hp_contains_ci("Model.Layers.0.Q_PROJ.weight", "q_proj"));
    CHECK(hp_contains_ci("down_proj", "down_proj"));
    CHECK(hp_contains_ci("abc", ""));
    CHECK(hp_contains_ci("", ""));
    CHECK(!hp_contains_ci("", "a"));
    CHECK(!hp_contains_ci("xxA", "ab")); /* the name ends inside the pattern */
    CHECK(hp_contains_ci("xxAB", "ab"));
    CHECK(!hp_contains_ci("w_2", "w2"));
    CHECK(hp_eq_ci("GATE", "gate", 4) && !hp_eq_ci("GATE", "gatf", 4));
}

TEST_MAIN()
