/*
 * test_shard_errors.c — every error of shard / merge / the plan reader: status, a stable part of the message,
 * and no output folder (nor a temporary one) left behind. Also the --plan path and merge's split output, and
 * the corrupt inputs fuzz/fuzz_manifest.c and fuzz/fuzz_plan_json.c found (their seeds are in fuzz/corpus/).
 */
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hyperpar/shard.h"
#include "shard/shard_int.h"
#include "testlib.h"

static const char *work(void) { return test_work_dir("shard_err"); }

static char *path(char *buf, const char *name)
{
    snprintf(buf, 256, "%s/%s", work(), name);
    return buf;
}

#define sh test_sh

/* No "<dir>.tmp.*" exists. */
static bool no_leftovers_tmp(const char *dir)
{
    const char *base = strrchr(dir, '/') + 1;
    DIR *d = opendir(work());
    struct dirent *e;
    bool clean = true;
    while (d && (e = readdir(d)) != NULL)
        if (!strncmp(e->d_name, base, strlen(base)) && strstr(e->d_name, ".tmp.")) clean = false;
    if (d) closedir(d);
    return clean;
}

/* Neither dir nor any "<dir>.tmp.*" exists. */
static bool no_leftovers(const char *dir)
{
    struct stat st;
    return stat(dir, &st) != 0 && no_leftovers_tmp(dir);
}

typedef struct fixture {
    hp_model *m;
    hp_plan *p;
} fixture;

static fixture open_planned(const char *golden, int64_t dp, int64_t tp, int64_t ep)
{
    fixture f = {0};
    char dir[256];
    hp_err err;
    snprintf(dir, sizeof dir, "data/golden/%s", golden);
    CHECK_MSG(hp_model_open(&f.m, dir, NULL, &err) == HP_OK, "%s", err.msg);
    hp_plan_opts po;
    hp_plan_opts_default(&po);
    hp_mesh_from_sizes(&po.mesh, dp, 1, tp, ep, false);
    if (f.m) CHECK_MSG(hp_plan_derive(&f.p, f.m, &po, &err) == HP_OK, "%s", err.msg);
    return f;
}

static void close_fixture(fixture *f)
{
    hp_plan_free(f->p);
    hp_model_close(f->m);
}

/* A valid shard folder of mixtral (dp=2, tp=2) at work()/<name>. */
static void make_shards(const char *name)
{
    fixture f = open_planned("mixtral_per_expert_f32", 2, 2, 1);
    char out[256];
    hp_err err;
    CHECK_MSG(hp_shard_write(f.m, f.p, path(out, name), NULL, NULL, &err) == HP_OK, "%s", err.msg);
    close_fixture(&f);
}

TEST(non_empty_out_is_refused_without_force)
{
    fixture f = open_planned("mixtral_per_expert_f32", 1, 2, 1);
    char out[256], keep[300];
    path(out, "full");
    mkdir(out, 0755);
    snprintf(keep, sizeof keep, "%s/keep.txt", out);
    FILE *k = fopen(keep, "w");
    if (k) fclose(k);
    hp_err err;
    CHECK_EQ_INT(hp_shard_write(f.m, f.p, out, NULL, NULL, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "is not empty; choose another --out or pass --force");
    CHECK(access(keep, F_OK) == 0);
    /* --force replaces only an earlier hyperpar output, never a folder of the user's. */
    hp_shard_opts so = {.force = true};
    CHECK_EQ_INT(hp_shard_write(f.m, f.p, out, &so, NULL, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "is not empty and was not written by hyperpar; --force replaces only a folder");
    CHECK(access(keep, F_OK) == 0);
    CHECK(no_leftovers_tmp(out));
    unlink(keep);
    CHECK_MSG(hp_shard_write(f.m, f.p, out, NULL, NULL, &err) == HP_OK, "%s", err.msg); /* empty: allowed */
    CHECK_MSG(hp_shard_write(f.m, f.p, out, &so, NULL, &err) == HP_OK, "%s", err.msg);  /* ours: replaced */
    char marker[300];
    snprintf(marker, sizeof marker, "%s/" HP_SHARD_MARKER, out);
    CHECK(access(marker, F_OK) == 0);
    hp_merge_opts mo = {.force = true};
    CHECK_EQ_INT(hp_shard_merge(out, out, &mo, NULL, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "is the input");
    CHECK(access(marker, F_OK) == 0);
    close_fixture(&f);
}

TEST(plan_file_round_trip_and_mismatch)
{
    fixture q = open_planned("qwen3_moe_batched_bf16", 1, 2, 2);
    hp_buf b;
    hp_buf_init(&b);
    hp_err err;
    CHECK(hp_plan_to_json(q.p, &b, &err) == HP_OK);
    char plan[256], out[256], merged[256];
    FILE *f = fopen(path(plan, "plan.json"), "wb");
    if (f) {
        fwrite(b.data, 1, b.len, f);
        fclose(f);
    }
    hp_buf_free(&b);

    hp_plan *p = NULL;
    char *text = NULL;
    CHECK_MSG(hp_shard_read_plan(&p, q.m, plan, &text, &err) == HP_OK, "%s", err.msg);
    CHECK(text != NULL && p != NULL && p->ep == 2 && p->tp == 2);
    hp_shard_opts so = {.plan_file = "plan.json", .plan_text = text};
    CHECK_MSG(p && hp_shard_write(q.m, p, path(out, "fromplan"), &so, NULL, &err) == HP_OK, "%s", err.msg);
    /* The split merge: an index and numbered files, still the same tensors. */
    hp_merge_opts mo = {.max_shard_size = 100000};
    CHECK_MSG(hp_shard_merge(out, path(merged, "split"), &mo, NULL, &err) == HP_OK, "%s", err.msg);
    hp_ckpt *c = NULL;
    CHECK(hp_ckpt_open(&c, merged, &err) == HP_OK);
    CHECK(c && hp_ckpt_file_count(c) > 1 && hp_ckpt_count(c) == q.m->n_params);
    for (size_t i = 0; c && i < q.m->n_params; i++) {
        const hp_ckpt_tensor *x = hp_ckpt_find(c, q.m->params[i].name),
                             *y = hp_ckpt_find(q.m->ckpt, q.m->params[i].name);
        CHECK(x && x->t->end - x->t->begin == y->t->end - y->t->begin &&
              !memcmp(hp_st_data(x->file, x->t), hp_st_data(y->file, y->t), y->t->end - y->t->begin));
    }
    hp_ckpt_close(c);
    hp_plan_free(p);
    free(text);

    /* The same plan against another model: refused with the first differences. */
    fixture mx = open_planned("mixtral_per_expert_f32", 1, 2, 1);
    CHECK_EQ_INT(hp_shard_read_plan(&p, mx.m, plan, NULL, &err), HP_ERR_INPUT);
    CHECK(p == NULL);
    CHECK_STR_CONTAINS(err.msg, "does not match the checkpoint");
    CHECK_STR_CONTAINS(err.msg,
                       "tensor 'model.layers.0.mlp.experts.gate_up_proj' is in the plan but not in the checkpoint");
    CHECK_STR_CONTAINS(err.msg, "(the first 10)");
    close_fixture(&mx);
    close_fixture(&q);
}

static void plan_error(const char *json, const char *needle)
{
    fixture f = open_planned("mixtral_per_expert_f32", 1, 2, 1);
    char plan[256];
    FILE *fp = fopen(path(plan, "bad_plan.json"), "wb");
    if (fp) {
        fputs(json, fp);
        fclose(fp);
    }
    hp_plan *p = NULL;
    hp_err err;
    CHECK_EQ_INT(hp_shard_read_plan(&p, f.m, plan, NULL, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, needle);
    close_fixture(&f);
}

TEST(plan_reader_errors)
{
    plan_error("{\"format\": \"hyperpar-hf-tp-plan\", \"version\": 1}", "not \"hyperpar-plan\"");
    plan_error("{\"format\": \"hyperpar-plan\", \"version\": 2}", "plan format version 2 is not supported");
    plan_error("{\"format\": \"hyperpar-plan\", \"version\": 1}", "mesh.dims: missing");
    plan_error(
        "{\"format\": \"hyperpar-plan\", \"version\": 1, \"mesh\": {\"dims\": [{\"name\": \"tq\", \"size\": 2}], "
        "\"ep\": 1, \"ep_mode\": \"none\"}}",
        "unknown axis 'tq'");
    plan_error(
        "{\"format\": \"hyperpar-plan\", \"version\": 1, \"mesh\": {\"dims\": [{\"name\": \"tp\", \"size\": 2}], "
        "\"ep\": 1, \"ep_mode\": \"none\"}, \"mesh_dim_names\": [\"tp\"], \"boundaries\": [{\"fqn\": \"lm_head\", "
        "\"params\": {\"weight\": {\"tp\": \"S(zero)\"}}}]}",
        "placements must be");
    plan_error(
        "{\"format\": \"hyperpar-plan\", \"version\": 1, \"mesh\": {\"dims\": [{\"name\": \"tp\", \"size\": 2}], "
        "\"ep\": 1, \"ep_mode\": \"none\"}, \"mesh_dim_names\": [\"tp\"], \"boundaries\": [{\"fqn\": \"lm_head\", "
        "\"params\": {\"nope\": {\"tp\": \"S(0)\"}}}]}",
        "tensor 'lm_head.nope' is in the plan but not in the checkpoint");
    plan_error("{\"format\": ", "bad_plan.json:1:");
}

/* A plan for mixtral's lm_head on mesh `mesh_dims` with boundary `extra` keys and lm_head.weight placed `pl`. */
static void plan_error_with(const char *mesh_dims, const char *pl, const char *extra, const char *needle)
{
    char json[1024];
    snprintf(json, sizeof json,
             "{\"format\": \"hyperpar-plan\", \"version\": 1, \"mesh\": {\"dims\": [%s], \"ep\": 1, \"ep_mode\": "
             "\"none\"}, \"mesh_dim_names\": [\"tp\"], \"boundaries\": [{\"fqn\": \"lm_head\", \"params\": "
             "{\"weight\": {\"tp\": %s}}%s}]}",
             mesh_dims, pl, extra);
    plan_error(json, needle);
}

TEST(plan_reader_corrupt_inputs)
{
    const char *tp2 = "{\"name\": \"tp\", \"size\": 2}";
    /* sscanf's %d read "S(d)" before: a d past INT_MAX was undefined behaviour, "S( 1)" and "S(+1)" passed. */
    plan_error_with(tp2, "\"S(99999999999999999999)\"", "",
                    "placements must be \"R\", \"P\", \"S(d)\" or \"S(d)x2\" with -8 <= d < 8, not string "
                    "\"S(99999999999999999999)\"");
    plan_error_with(tp2, "\"S( 1)\"", "", "not string \"S( 1)\"");
    plan_error_with(tp2, "\"S(+1)\"", "", "not string \"S(+1)\"");
    plan_error_with(tp2, "\"S(-9)\"", "", "not string \"S(-9)\"");
    plan_error_with(tp2, "\"S(1)x3\"", "", "not string \"S(1)x3\"");
    plan_error_with(tp2, "7", "",
                    "boundaries[0].params.weight: placements must be \"R\", \"P\", \"S(d)\" or \"S(d)x2\" with "
                    "-8 <= d < 8, not integer 7");
    /* ep_size was cast to int before its range check: 2^32 + 2 passed as 2. */
    plan_error_with(tp2, "\"S(0)\"", ", \"ep_size\": 4294967298", "boundaries[0]: ep_size out of range (0 to 1048576)");
    plan_error_with(tp2, "\"S(0)\"", ", \"ep_size\": -1", "ep_size out of range");
    /* A stack that names no param of its boundary was ignored, yet matched against every param (quadratic). */
    plan_error_with(tp2, "\"S(0)\"", ", \"ep_stack\": {\"stacked\": [\"weight\"]}",
                    "boundaries[0].ep_stack.stacked: a stacked name must also be a key of the boundary's params");
    /* Dim names went into a --mesh spec unchecked: "tp=2,dp" made two axes out of one. */
    plan_error_with("{\"name\": \"tp=2,dp\", \"size\": 1}", "\"R\"", "",
                    "bad_plan.json: mesh.dims[0]: a dim name is an axis name such as \"tp\", without ',' or '='");
    plan_error_with("{\"name\": \"\", \"size\": 1}", "\"R\"", "", "mesh.dims[0]: a dim name is an axis name");
    plan_error_with("{\"name\": \"tp\"}", "\"R\"", "", "bad_plan.json: mesh.dims[0]: each dim needs a name and a size");
    plan_error_with("{\"name\": \"dp\", \"size\": 1048576}, {\"name\": \"tp\", \"size\": 1048576}, {\"name\": \"cp\", "
                    "\"size\": 1048576}, {\"name\": \"pp\", \"size\": 1048576}",
                    "\"R\"", "", "mesh.dims: the mesh has more than 65536 ranks");
    plan_error_with("{\"name\": \"tp\", \"size\": 9223372036854775807}", "\"R\"", "",
                    "bad_plan.json: mesh: --mesh 'tp=9223372036854775807': size of 'tp' must be an integer");
    plan_error("{\"format\": \"hyperpar-plan\", \"version\": \"1\"}",
               "\"version\" is string \"1\", not an integer (this hyperpar reads version 1)");
    plan_error("{\"format\": \"hyperpar-plan\"}", "\"version\" is missing, not an integer");
    plan_error("[1, 2]", "bad_plan.json: (top level): expected an object");
    plan_error("{\"format\": \"hyperpar-plan\", \"version\": 1, \"mesh\": {\"dims\": [{\"name\": \"tp\", \"size\": "
               "1}], \"ep\": 1, \"ep_mode\": \"none\"}, \"mesh_dim_names\": [\"tp\"], \"boundaries\": [\"x\"]}",
               "boundaries[0]: a boundary needs a string fqn and a params object");
    plan_error("{\"format\": \"hyperpar-plan\", \"version\": 1, \"mesh\": \xff}", "bad_plan.json:1:");
}

/* Every prefix of a valid text is refused with a located message and no output (a truncation sweep). */
TEST(plan_reader_truncation_sweep)
{
    fixture q = open_planned("qwen3_moe_batched_bf16", 1, 2, 2);
    hp_buf b;
    hp_buf_init(&b);
    hp_err err;
    CHECK(q.p && hp_plan_to_json(q.p, &b, &err) == HP_OK);
    hp_plan *p = NULL;
    CHECK_MSG(hp__shard_plan_parse(&p, q.m, b.data, b.len, "plan.json", &err) == HP_OK, "%s", err.msg);
    hp_plan_free(p);
    size_t refused = 0, n = 0;
    hp_plan dummy;
    for (size_t len = 0; b.data && len + 2 < b.len; len += 1 + len / 64, n++) { /* the last bytes are "}\n" */
        p = &dummy; /* must come back NULL */
        err.msg[0] = '\0';
        if (hp__shard_plan_parse(&p, q.m, b.data, len, "plan.json", &err) == HP_ERR_INPUT && p == NULL &&
            !strncmp(err.msg, "plan.json:", 10))
            refused++;
    }
    CHECK_MSG(n > 100 && refused == n, "%zu of %zu prefixes refused", refused, n);
    hp_buf_free(&b);
    close_fixture(&q);
}

static char *read_text(const char *file, size_t *len)
{
    FILE *f = fopen(file, "rb");
    char *t = f ? malloc(1 << 20) : NULL;
    *len = t ? fread(t, 1, (1 << 20) - 1, f) : 0;
    if (t) t[*len] = '\0';
    if (f) fclose(f);
    return t;
}

/* Version-2 manifest pieces: an identity and a rank's file_rank / bytes / checksum. */
#define ID32 "0123456789abcdef0123456789abcdef"
#define RANK_V2 "\"file_rank\": 0, \"bytes\": 0, \"checksum\": \"xxh64:0000000000000000\", "

static void manifest_error(const char *text, const char *needle)
{
    hp__manifest dummy, *m = &dummy; /* must come back NULL */
    hp_err err;
    CHECK_EQ_INT(hp__manifest_parse(text, strlen(text), "manifest.json", &m, &err), HP_ERR_INPUT);
    CHECK(m == NULL);
    CHECK_STR_CONTAINS(err.msg, needle);
}

/* A manifest of world 1 whose only rank holds one tensor of global_shape `shape` with slices `slices`. */
static void manifest_slices_error(const char *shape, const char *slices, const char *needle)
{
    char json[1024];
    snprintf(json, sizeof json,
             "{\"format\": \"hyperpar-shards\", \"version\": 2, \"identity\": \"" ID32 "\", \"mesh\": {\"world\": 1}, \"tensors\": [], "
             "\"ranks\": [{\"rank\": 0, " RANK_V2 "\"file\": \"rank-00000.safetensors\", \"tensors\": [{\"name\": \"w\", "
             "\"global\": \"w\", \"global_shape\": %s, \"dtype\": \"BF16\", \"slices\": [%s]}]}]}",
             shape, slices);
    manifest_error(json, needle);
}

TEST(manifest_reader_corrupt_inputs)
{
    /* Overlapping slices of one dim were accepted: four [0, 2^62) blocks overflowed the local shape's sum. */
    manifest_slices_error("[4611686018427387904, 1]",
                          "{\"dim\": 0, \"offset\": 0, \"length\": 4611686018427387904}, "
                          "{\"dim\": 0, \"offset\": 0, \"length\": 4611686018427387904}",
                          "manifest.json: ranks[0].tensors[0].slices[1]: slices must be in dim order, and ascending "
                          "without overlap along one dim");
    manifest_slices_error("[8, 8]",
                          "{\"dim\": 0, \"offset\": 4, \"length\": 4}, {\"dim\": 0, \"offset\": 0, \"length\": 4}",
                          "slices[1]: slices must be in dim order");
    manifest_slices_error("[8, 8]",
                          "{\"dim\": 1, \"offset\": 0, \"length\": 4}, {\"dim\": 0, \"offset\": 0, \"length\": 4}",
                          "slices[1]: slices must be in dim order");
    manifest_slices_error("[8, 8]",
                          "{\"dim\": 0, \"offset\": 0, \"length\": 5}, {\"dim\": 0, \"offset\": 4, \"length\": 4}",
                          "slices[1]: slices must be in dim order");
    manifest_slices_error("[8, 8]", "{\"dim\": 2, \"offset\": 0, \"length\": 4}",
                          "ranks[0].tensors[0].slices[0].dim: out of range (2, expected 0 to 1)");
    manifest_slices_error("[]", "{\"dim\": 0, \"offset\": 0, \"length\": 1}",
                          "slices[0].dim: out of range (0; nothing fits)");
    manifest_slices_error("[8, 8]", "{\"dim\": 0, \"offset\": 6, \"length\": 4}",
                          "slices[0].length: out of range (4, expected 1 to 2)");
    manifest_slices_error("[8, 8]", "{\"dim\": 0, \"offset\": -1, \"length\": 4}",
                          "slices[0].offset: out of range (-1, expected 0 to 8)");
    manifest_slices_error("[-8, 8]", "", "ranks[0].tensors[0].global_shape: expected non-negative integers");
    manifest_slices_error("[4294967296, 4294967296]", "", "global_shape: element count overflows");
    /* Adjacent blocks are fine; the local shape is their sum. */
    const char *ok = "{\"format\": \"hyperpar-shards\", \"version\": 2, \"identity\": \"" ID32 "\", \"mesh\": {\"world\": 1}, \"tensors\": [], "
                     "\"ranks\": [{\"rank\": 0, " RANK_V2 "\"file\": \"r\", \"tensors\": [{\"name\": \"w\", \"global\": \"w\", "
                     "\"global_shape\": [8, 8], \"dtype\": \"F32\", \"slices\": [{\"dim\": 0, \"offset\": 0, "
                     "\"length\": 2}, {\"dim\": 0, \"offset\": 2, \"length\": 2}, {\"dim\": 1, \"offset\": 4, "
                     "\"length\": 4}]}]}]}";
    hp__manifest *m = NULL;
    hp_err err;
    CHECK_MSG(hp__manifest_parse(ok, strlen(ok), "manifest.json", &m, &err) == HP_OK, "%s", err.msg);
    hp_shard_tensor t;
    CHECK(m && hp__manifest_tensor(&m->ranks[0].tensors[0], &t, &err) == HP_OK);
    CHECK(m && t.local_shape[0] == 4 && t.local_shape[1] == 4 && t.nbytes == 64);
    hp__manifest_free(m);

    manifest_error("{\"format\": \"hyperpar-shards\", \"version\": 2, \"identity\": \"" ID32 "\", \"mesh\": {\"world\": 1}, \"tensors\": "
                   "[{\"name\": \"w\", \"dtype\": \"F128\", \"shape\": [1]}]}",
                   "manifest.json: tensors[0].dtype: unknown dtype \"F128\"");
    manifest_error("{\"format\": \"hyperpar-shards\", \"version\": 2, \"identity\": \"" ID32 "\", \"mesh\": {\"world\": 9223372036854775807}}",
                   "mesh.world: out of range (9223372036854775807, expected 1 to 65536)");
    manifest_error("{\"format\": \"hyperpar-shards\", \"version\": 2, \"mesh\": [" , "manifest.json:1:");
    manifest_error("{\"format\": \"hyperpar-shards\", \"version\": 2, \"mesh\": {\"world\": \"\xff\"}}",
                   "manifest.json:1:");
}

/* A real manifest: every prefix is refused with a located message and no output. */
TEST(manifest_reader_truncation_sweep)
{
    char dir[256], file[300];
    make_shards("sweep");
    snprintf(file, sizeof file, "%s/manifest.json", path(dir, "sweep"));
    size_t len = 0;
    char *text = read_text(file, &len);
    CHECK(text && len > 1000);
    hp__manifest *m = NULL;
    hp_err err;
    CHECK_MSG(text && hp__manifest_parse(text, len, "manifest.json", &m, &err) == HP_OK, "%s", err.msg);
    CHECK(m && m->world == 4 && m->n_ranks == 4);
    hp__manifest_free(m);
    size_t refused = 0, n = 0;
    hp__manifest dummy;
    for (size_t k = 0; text && k + 2 < len; k += 1 + k / 64, n++) { /* the last bytes are "}\n" */
        m = &dummy; /* must come back NULL */
        if (hp__manifest_parse(text, k, "manifest.json", &m, &err) == HP_ERR_INPUT && m == NULL &&
            !strncmp(err.msg, "manifest.json:", 14))
            refused++;
    }
    CHECK_MSG(n > 100 && refused == n, "%zu of %zu prefixes refused", refused, n);
    free(text);
}

TEST(indivisible_plan_is_refused)
{
    /* A hand-edited plan that shards lm_head [vocab, H] on dim 1 over tp=3: H is not divisible by 3. */
    fixture f = open_planned("mixtral_per_expert_f32", 1, 1, 1);
    char plan[256], out[256];
    FILE *fp = fopen(path(plan, "tp3.json"), "wb");
    if (fp) {
        fputs(
            "{\"format\": \"hyperpar-plan\", \"version\": 1, \"mesh\": {\"dims\": [{\"name\": \"tp\", \"size\": 3}], "
            "\"ep\": 1, \"ep_mode\": \"none\"}, \"mesh_dim_names\": [\"tp\"], \"boundaries\": [{\"fqn\": \"lm_head\", "
            "\"params\": {\"weight\": {\"tp\": \"S(1)\"}}}]}",
            fp);
        fclose(fp);
    }
    hp_plan *p = NULL;
    hp_err err;
    CHECK_MSG(hp_shard_read_plan(&p, f.m, plan, NULL, &err) == HP_OK, "%s", err.msg);
    CHECK_EQ_INT(hp_shard_write(f.m, p, path(out, "tp3"), NULL, NULL, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "tensor 'lm_head.weight': dim 1 (64) is not divisible by tp=3");
    CHECK(no_leftovers(out));
    hp_plan_free(p);
    close_fixture(&f);
}

static void merge_error(const char *dir, const char *needle)
{
    char out[256];
    hp_err err;
    hp_merge_opts mo = {0};
    CHECK_EQ_INT(hp_shard_merge(dir, path(out, "merged_bad"), &mo, NULL, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, needle);
    CHECK(no_leftovers(out));
}

TEST(merge_errors)
{
    char g[256], b[256];
    make_shards("good");
    path(g, "good");
    path(b, "bad");

    sh("cp -r %s %s && truncate -s 200 %s/manifest.json", g, b, b);
    merge_error(b, "manifest.json:");
    sh("rm -rf %s && cp -r %s %s && sed -i 's/\"version\": 2/\"version\": 9/' %s/manifest.json", b, g, b, b);
    merge_error(b, "unsupported \"version\"");
    sh("rm -rf %s && cp -r %s %s && sed -i '0,/\"dim\": 0/s//\"dim\": 7/' %s/manifest.json", b, g, b, b);
    merge_error(b, ".slices[0].dim: out of range");
    sh("rm -rf %s && cp -r %s %s && rm %s/rank-00002.safetensors", b, g, b, b);
    merge_error(b, "rank 2: ");
    merge_error(b, "rank-00002.safetensors is missing");
    sh("rm -rf %s && cp -r %s %s && rm %s/rank-00001.safetensors", b, g, b, b);
    sh("head -c 4000 %s/rank-00001.safetensors > %s/rank-00001.safetensors", g, b);
    merge_error(b, "rank 1: ");
    sh("rm -rf %s && cp -r %s %s && rm %s/rank-00003.safetensors", b, g, b, b);
    sh("cp %s/rank-00000.safetensors %s/rank-00003.safetensors", b, b);
    merge_error(b, "rank-00003.safetensors is misnamed: it is this folder's file for rank 0,2");
    sh("rm -rf %s", b);

    char nothing[256];
    merge_error(path(nothing, "nothing"), "no such folder");
    mkdir(nothing, 0755);
    merge_error(nothing, "manifest.json is missing");
}

TEST_MAIN()
