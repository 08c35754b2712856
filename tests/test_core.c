/* test_core.c — errors, checked math, arena, buffer, natural order, glob, formatting. */
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

TEST_MAIN()
