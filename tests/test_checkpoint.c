/* test_checkpoint.c — hp_ckpt_*: golden folders, single files, a sharded checkpoint with its index, and every
 * index / folder error. */
#include "hyperpar/safetensors.h"
#include "testlib.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

/* The current test's scratch folder (testlib.h). */
static char tmpdir[200];

static const char *make_tmpdir(void) { return test_tmpdir(tmpdir, sizeof tmpdir); }

static void remove_tmpdir(void) { CHECK(test_rm_rf(tmpdir)); }

static void put_text(const char *name, const char *text)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    FILE *f = fopen(p, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* Writes tmpdir/file holding F32 [2] tensors with the given comma-separated names, in that order. */
static void put_shard(const char *file, const char *names)
{
    char p[256], buf[256];
    snprintf(p, sizeof p, "%s/%s", tmpdir, file);
    snprintf(buf, sizeof buf, "%s", names);
    static const float v[2] = {1, 2};
    int64_t shape[1] = {2};
    hp_st_writer *w = hp_st_writer_create();
    hp_err e;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ","))
        CHECK(hp_st_writer_add(w, tok, HP_DT_F32, 1, shape, v, &e) == HP_OK);
    CHECK_MSG(hp_st_writer_write(w, p, &e) == HP_OK, "%s", e.msg);
    hp_st_writer_destroy(w);
}

#define S1 "model-00001-of-00002.safetensors"
#define S2 "model-00002-of-00002.safetensors"
#define IDX "model.safetensors.index.json"

/* A valid two-shard checkpoint: shard 1 holds z.first, a.second; shard 2 holds m.third, b.fourth. */
static void put_two_shards(void)
{
    put_shard(S1, "z.first,a.second");
    put_shard(S2, "m.third,b.fourth");
    put_text(IDX, "{\n  \"metadata\": {\"total_size\": 32},\n  \"weight_map\": {\n"
                  "    \"a.second\": \"" S1 "\",\n    \"b.fourth\": \"" S2 "\",\n"
                  "    \"m.third\": \"" S2 "\",\n    \"z.first\": \"" S1 "\"\n  }\n}\n");
}

/* Opens path and expects HP_ERR_INPUT with needle in the message. */
static void expect_bad_at(const char *path, const char *needle, int line)
{
    hp_ckpt *c = (hp_ckpt *)1;
    hp_err e;
    hp_err_clear(&e);
    hp_status st = hp_ckpt_open(&c, path, &e);
    CHECK_MSG(st == HP_ERR_INPUT, "line %d: status %d (%s)", line, (int)st, e.msg);
    CHECK_MSG(c == NULL, "line %d: out not NULL", line);
    CHECK_MSG(strstr(e.msg, needle) != NULL, "line %d: \"%s\" does not contain \"%s\"", line, e.msg, needle);
    if (st == HP_OK) hp_ckpt_close(c);
}
#define EXPECT_BAD(path, needle) expect_bad_at(path, needle, __LINE__)

TEST(golden_folders)
{
    static const struct {
        const char *folder;
        size_t n;
    } g[] = {{"deepseek_v3_per_expert_f32", 139}, {"glm4_moe_batched_bf16", 31}, {"gpt_oss_batched_f32", 20},
             {"mixtral_batched_bf16", 21},        {"mixtral_per_expert_f32", 65}, {"qwen2_moe_per_expert_f32", 79},
             {"qwen3_moe_batched_bf16", 25}};
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
        char dir[256];
        snprintf(dir, sizeof dir, "data/golden/%s", g[i].folder);
        hp_ckpt *c = NULL;
        hp_err e;
        CHECK_MSG(hp_ckpt_open(&c, dir, &e) == HP_OK, "%s", e.msg);
        if (!c) continue;
        /* model.safetensors is preferred over moe_io.safetensors in the same folder. */
        CHECK_EQ_INT(hp_ckpt_count(c), g[i].n);
        CHECK_EQ_INT(hp_ckpt_file_count(c), 1);
        CHECK_STR_EQ(hp_ckpt_dir(c), dir);
        CHECK_STR_CONTAINS(hp_st_path(hp_ckpt_file(c, 0)), "/model.safetensors");
        CHECK(hp_ckpt_file(c, 1) == NULL);
        const hp_ckpt_tensor *t0 = hp_ckpt_at(c, 0);
        CHECK(t0 && strcmp(t0->t->name, "model.embed_tokens.weight") == 0 && t0->file_index == 0);
        for (size_t j = 0; j < hp_ckpt_count(c); j++) {
            const hp_ckpt_tensor *t = hp_ckpt_at(c, j);
            CHECK(hp_ckpt_find(c, t->t->name) == t);
            CHECK(t->t == hp_st_tensor_at(t->file, j));
        }
        CHECK(hp_ckpt_at(c, hp_ckpt_count(c)) == NULL);
        CHECK(hp_ckpt_find(c, "nope") == NULL);
        hp_ckpt_close(c);
    }
    hp_ckpt_close(NULL);
}

TEST(single_file_path)
{
    hp_ckpt *c = NULL;
    hp_err e;
    CHECK(hp_ckpt_open(&c, "data/golden/mixtral_batched_bf16/moe_io.safetensors", &e) == HP_OK);
    CHECK(c && hp_ckpt_count(c) == 7 && hp_ckpt_file_count(c) == 1);
    CHECK(c && strcmp(hp_ckpt_dir(c), "data/golden/mixtral_batched_bf16") == 0);
    CHECK(c && hp_ckpt_find(c, "x") != NULL);
    hp_ckpt_close(c);
}

TEST(sharded_checkpoint)
{
    const char *dir = make_tmpdir();
    put_two_shards();
    char idx[256];
    snprintf(idx, sizeof idx, "%s/" IDX, dir);
    const char *paths[2] = {dir, idx};
    for (int k = 0; k < 2; k++) {
        hp_ckpt *c = NULL;
        hp_err e;
        CHECK_MSG(hp_ckpt_open(&c, paths[k], &e) == HP_OK, "%s", e.msg);
        if (!c) continue;
        CHECK_STR_EQ(hp_ckpt_dir(c), dir);
        CHECK_EQ_INT(hp_ckpt_file_count(c), 2);
        CHECK_STR_CONTAINS(hp_st_path(hp_ckpt_file(c, 0)), S1);
        CHECK_STR_CONTAINS(hp_st_path(hp_ckpt_file(c, 1)), S2);
        CHECK_EQ_INT(hp_ckpt_count(c), 4);
        static const char *order[4] = {"z.first", "a.second", "m.third", "b.fourth"};
        static const int file[4] = {0, 0, 1, 1};
        for (int i = 0; i < 4; i++) {
            const hp_ckpt_tensor *t = hp_ckpt_at(c, (size_t)i);
            CHECK_STR_EQ(t->t->name, order[i]);
            CHECK_EQ_INT(t->file_index, file[i]);
            CHECK(t->file == hp_ckpt_file(c, (size_t)file[i]));
            CHECK(hp_ckpt_find(c, order[i]) == t);
            float v[2];
            CHECK(hp_dtype_to_f32(t->t->dtype, hp_st_data(t->file, t->t), v, 2, &e) == HP_OK && v[1] == 2.0f);
        }
        hp_ckpt_close(c);
    }
    remove_tmpdir();
}

TEST(index_disagreements)
{
    const char *dir = make_tmpdir();
    char idx[256];
    snprintf(idx, sizeof idx, "%s/" IDX, dir);

    put_two_shards();
    put_text(IDX, "{\"weight_map\": {\"z.first\": \"" S1 "\", \"a.second\": \"" S1 "\", \"m.third\": \"" S2
                  "\", \"b.fourth\": \"" S2 "\", \"e.extra\": \"" S1 "\"}}");
    EXPECT_BAD(dir, "tensor 'e.extra' is listed in " IDX " for shard " S1 " but " S1 " does not contain it");

    put_text(IDX, "{\"weight_map\": {\"z.first\": \"" S1 "\", \"a.second\": \"" S1 "\", \"m.third\": \"" S2 "\"}}");
    EXPECT_BAD(dir, "shard " S2 " contains tensor 'b.fourth', which the weight_map of " IDX " does not list");

    put_shard(S2, "m.third,b.fourth,a.second");
    put_text(IDX, "{\"weight_map\": {\"z.first\": \"" S1 "\", \"a.second\": \"" S1 "\", \"m.third\": \"" S2
                  "\", \"b.fourth\": \"" S2 "\"}}");
    EXPECT_BAD(dir, "tensor 'a.second' appears in both shard " S2 " and shard " S1 " (the index maps it to " S1 ")");

    put_two_shards();
    put_text(IDX, "{\"weight_map\": {\"z.first\": \"" S1 "\", \"a.second\": \"" S1 "\", \"m.third\": \"" S2
                  "\", \"b.fourth\": \"" S2 "\", \"q\": \"model-00003-of-00003.safetensors\"}}");
    EXPECT_BAD(idx, "the weight_map lists shard model-00003-of-00003.safetensors but");
    EXPECT_BAD(idx, "model-00003-of-00003.safetensors does not exist; the checkpoint is incomplete");

    /* A corrupt shard: the reader's message comes through. */
    put_text(S2, "garbage!");
    put_two_shards();
    put_text(S2, "tiny");
    EXPECT_BAD(dir, S2 ": the file is 4 bytes, smaller than the 8-byte header length");
    remove_tmpdir();
}

TEST(index_format_errors)
{
    const char *dir = make_tmpdir();
    char idx[256];
    snprintf(idx, sizeof idx, "%s/" IDX, dir);
    put_two_shards();

    put_text(IDX, "{\"weight_map\": []}");
    EXPECT_BAD(dir, "\"weight_map\" is not an object, expected an object mapping tensor names to shard file names");
    put_text(IDX, "{\"metadata\": {}}");
    EXPECT_BAD(dir, "\"weight_map\" is missing");
    put_text(IDX, "{\"weight_map\": {\"a\": 3}}");
    EXPECT_BAD(dir, "weight_map entry for tensor 'a' is not a string");
    put_text(IDX, "{\"weight_map\": {\"a\": \"../" S1 "\"}}");
    EXPECT_BAD(dir, "weight_map maps tensor 'a' to '../" S1 "', which is not a plain file name");
    put_text(IDX, "{\"weight_map\": {\"a\": \"..\"}}");
    EXPECT_BAD(dir, "to '..', which is not a plain file name");
    put_text(IDX, "{\"weight_map\": {\"a\": \"/etc/passwd\"}}");
    EXPECT_BAD(dir, "must not contain '/'");
    put_text(IDX, "{\"weight_map\": {}, \"metadata\": 5}");
    EXPECT_BAD(dir, "\"metadata\" is not an object");
    put_text(IDX, "[1, 2]");
    EXPECT_BAD(dir, "the index is not a JSON object with a \"weight_map\"");
    put_text(IDX, "{\"weight_map\": {\"a\": \"x\",}}");
    EXPECT_BAD(idx, "the index is not valid JSON: ");
    EXPECT_BAD(idx, "(line 1, column");
    put_text(IDX, "{\"weight_map\": {\"a\": \"" S1 "\", \"a\": \"" S2 "\"}}");
    EXPECT_BAD(idx, "duplicate object key");

    /* An empty weight_map lists no tensor: not a checkpoint (it used to open as "parameters 0"). */
    put_text(IDX, "{\"weight_map\": {}}");
    EXPECT_BAD(idx, "\"weight_map\" is empty, so the checkpoint holds no tensors");
    put_text(IDX, "{\"weight_map\": {}, \"metadata\": {\"total_size\": 0}}");
    EXPECT_BAD(dir, "\"weight_map\" is empty");
    remove_tmpdir();
}

TEST(folder_discovery)
{
    const char *dir = make_tmpdir();
    EXPECT_BAD(dir, "no checkpoint here: looked for " IDX ", model.safetensors and any *.safetensors file");

    put_shard("only.safetensors", "w");
    hp_ckpt *c = NULL;
    hp_err e;
    CHECK_MSG(hp_ckpt_open(&c, dir, &e) == HP_OK, "%s", e.msg);
    CHECK(c && hp_ckpt_count(c) == 1 && strcmp(hp_ckpt_at(c, 0)->t->name, "w") == 0);
    hp_ckpt_close(c);

    put_shard("b.safetensors", "v");
    put_shard("a.safetensors", "u");
    EXPECT_BAD(dir, "holds 3 .safetensors files (a.safetensors, b.safetensors, only.safetensors) but no " IDX);

    put_shard("model.safetensors", "m1,m2");
    CHECK(hp_ckpt_open(&c, dir, &e) == HP_OK);
    CHECK(c && hp_ckpt_count(c) == 2);
    hp_ckpt_close(c);

    char p[256];
    snprintf(p, sizeof p, "%s/missing", dir);
    EXPECT_BAD(p, "missing: cannot open: the path does not exist; pass a checkpoint folder");
    snprintf(p, sizeof p, "%s/missing.index.json", dir);
    EXPECT_BAD(p, "cannot open: the path does not exist");
    remove_tmpdir();
}

/* transformers loads model.safetensors when a folder also holds an index; so do we, and we say so. */
TEST(folder_with_single_file_and_index_prefers_the_single_file)
{
    const char *dir = make_tmpdir();
    put_two_shards();
    put_shard("model.safetensors", "m1,m2,m3");
    hp_ckpt *c = NULL;
    hp_err e;
    CHECK_MSG(hp_ckpt_open(&c, dir, &e) == HP_OK, "%s", e.msg);
    if (c) {
        CHECK_EQ_INT(hp_ckpt_count(c), 3);
        CHECK(hp_ckpt_find(c, "m1") != NULL && hp_ckpt_find(c, "z.first") == NULL);
        CHECK_STR_CONTAINS(hp_ckpt_source(c), "/model.safetensors");
        CHECK(hp_ckpt_ignored(c) != NULL);
        if (hp_ckpt_ignored(c)) CHECK_STR_CONTAINS(hp_ckpt_ignored(c), "/" IDX);
    }
    hp_ckpt_close(c);
    /* Without the single file the index is used, and nothing is ignored. */
    char p[256];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    CHECK(unlink(p) == 0);
    CHECK_MSG(hp_ckpt_open(&c, dir, &e) == HP_OK, "%s", e.msg);
    if (c) {
        CHECK_EQ_INT(hp_ckpt_count(c), 4);
        CHECK_STR_CONTAINS(hp_ckpt_source(c), IDX);
        CHECK(hp_ckpt_ignored(c) == NULL);
    }
    hp_ckpt_close(c);
    remove_tmpdir();
}

/* A FIFO, a dangling link or a folder where a checkpoint file should be: refused at once, by what it is
 * (a FIFO used to block open() forever). */
TEST(non_regular_inputs_never_block)
{
    const char *dir = make_tmpdir();
    char p[256], q[256];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    CHECK(mkfifo(p, 0600) == 0);
    EXPECT_BAD(dir, "model.safetensors: cannot open: the path is a FIFO (named pipe), not a regular file");
    EXPECT_BAD(p, "is a FIFO");
    CHECK(unlink(p) == 0);
    snprintf(q, sizeof q, "%s/" IDX, dir);
    CHECK(mkfifo(q, 0600) == 0);
    EXPECT_BAD(dir, IDX ": cannot open: the path is a FIFO");
    EXPECT_BAD(q, "is a FIFO");
    CHECK(unlink(q) == 0);
    CHECK(symlink("nowhere.safetensors", p) == 0);
    EXPECT_BAD(dir, "is a dangling symbolic link");
    CHECK(unlink(p) == 0);
    CHECK(symlink("loop_b", p) == 0);
    snprintf(q, sizeof q, "%s/loop_b", dir);
    CHECK(symlink("model.safetensors", q) == 0);
    EXPECT_BAD(dir, "symbolic-link loop");
    EXPECT_BAD(p, "symbolic-link loop");
    CHECK(unlink(p) == 0 && unlink(q) == 0);
    /* A shard of an index that is a FIFO. */
    put_two_shards();
    snprintf(p, sizeof p, "%s/" S2, dir);
    CHECK(unlink(p) == 0 && mkfifo(p, 0600) == 0);
    EXPECT_BAD(dir, S2 " is a FIFO (named pipe)");
    remove_tmpdir();
}

TEST_MAIN()
