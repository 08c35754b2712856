/*
 * test_shard.c — shard + merge round trips (golden and generated checkpoints of every family, five meshes),
 * per-rank slices checked element by element against the source, manifests, dp replica links.
 */
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hyperpar/gen.h"
#include "hyperpar/shard.h"
#include "shard/shard_int.h"
#include "testlib.h"

static const char *const g_golden[] = {
    "deepseek_v3_per_expert_f32", "glm4_moe_batched_bf16",    "gpt_oss_batched_f32",   "mixtral_batched_bf16",
    "mixtral_per_expert_f32",     "qwen2_moe_per_expert_f32", "qwen3_moe_batched_bf16"};

enum { M_TP2, M_TP2_EP2, M_DP2_TP2_EP4, M_TP2_EPAXIS, M_CP2, M_COUNT };
static const char *const g_mesh_names[] = {"tp=2", "tp=2 ep=2", "dp=2,tp=2 ep=4", "mesh tp=2,ep=2", "cp=2"};
static int g_exercised[M_COUNT];

static void mesh_opts(int which, hp_plan_opts *o)
{
    hp_plan_opts_default(o);
    hp_err err;
    switch (which) {
    case M_TP2: hp_mesh_from_sizes(&o->mesh, 1, 1, 2, 1, false); break;
    case M_TP2_EP2: hp_mesh_from_sizes(&o->mesh, 1, 1, 2, 2, false); break;
    case M_DP2_TP2_EP4: hp_mesh_from_sizes(&o->mesh, 2, 1, 2, 4, false); break;
    case M_TP2_EPAXIS: HP_ASSERT(hp_mesh_parse("tp=2,ep=2", &o->mesh, &err) == HP_OK); break;
    default: hp_mesh_from_sizes(&o->mesh, 1, 2, 1, 1, false); break;
    }
}


/* Every tensor of the merged checkpoint equals the source's: names in model order, dtypes, shapes, bytes. */
static void check_same(const hp_model *m, const char *merged, const char *label)
{
    hp_ckpt *c = NULL;
    hp_err err;
    CHECK_MSG(hp_ckpt_open(&c, merged, &err) == HP_OK, "%s: %s", label, err.msg);
    if (!c) return;
    CHECK_EQ_INT(hp_ckpt_count(c), m->n_params);
    /* Order: file by file, header order; the files are written in model order. */
    size_t k = 0;
    for (size_t f = 0; f < hp_ckpt_file_count(c); f++) {
        const hp_st_file *sf = hp_ckpt_file(c, f);
        for (size_t i = 0; i < hp_st_count(sf) && k < m->n_params; i++, k++)
            CHECK_STR_EQ(hp_st_tensor_at(sf, i)->name, m->params[k].name);
    }
    for (size_t i = 0; i < m->n_params; i++) {
        const hp_param *p = &m->params[i];
        const hp_ckpt_tensor *a = hp_ckpt_find(c, p->name), *b = hp_ckpt_find(m->ckpt, p->name);
        CHECK_MSG(a != NULL, "%s: '%s' missing after merge", label, p->name);
        if (!a || !b) continue;
        bool same = a->t->dtype == b->t->dtype && a->t->n_dims == b->t->n_dims &&
                    !memcmp(a->t->shape, b->t->shape, sizeof(int64_t) * (size_t)a->t->n_dims) &&
                    a->t->end - a->t->begin == b->t->end - b->t->begin &&
                    !memcmp(hp_st_data(a->file, a->t), hp_st_data(b->file, b->t), a->t->end - a->t->begin);
        CHECK_MSG(same, "%s: tensor '%s' differs after the round trip", label, p->name);
    }
    hp_ckpt_close(c);
}

/* Element-by-element: each rank file tensor equals the global tensor at the indices its slices give. */
static void check_rank_files(const hp_model *m, const hp_shard_layout *l, const char *dir, const char *label)
{
    for (int64_t r = 0; r < l->world; r++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/rank-%05lld.safetensors", dir, (long long)r);
        hp_st_file *f = NULL;
        hp_err err;
        CHECK_MSG(hp_st_open(&f, path, &err) == HP_OK, "%s: %s", label, err.msg);
        if (!f) continue;
        CHECK_EQ_INT(hp_st_count(f), l->n_tensors);
        for (size_t i = 0; i < l->n_tensors; i++) {
            hp_shard_tensor t;
            CHECK(hp_shard_rank_tensor(l, r, i, &t, &err) == HP_OK);
            const hp_st_tensor *ft = hp_st_find(f, t.name);
            CHECK_MSG(ft != NULL, "%s: rank %lld lacks '%s'", label, (long long)r, t.name);
            if (!ft) continue;
            CHECK(ft->n_dims == t.n_dims && !memcmp(ft->shape, t.local_shape, sizeof(int64_t) * (size_t)t.n_dims));
            int es = hp_dtype_bits(t.dtype) / 8;
            if (es == 0) continue;
            hp__segs s;
            CHECK(hp__segs_from_tensor(&t, &s, &err) == HP_OK);
            const uint8_t *local = hp_st_data(f, ft);
            int64_t n = ft->n_elems, idx[HP_MAX_DIMS] = {0};
            bool ok = true;
            for (int64_t e = 0; e < n && ok; e++) {
                /* local multi-index -> global multi-index through the segments */
                int64_t rem = e, g[HP_MAX_DIMS];
                for (int d = t.n_dims - 1; d >= 0; d--) {
                    idx[d] = rem % t.local_shape[d];
                    rem /= t.local_shape[d];
                    int64_t li = idx[d];
                    for (int q = 0; q < s.n[d]; q++) {
                        if (li < s.len[d][q]) {
                            g[d] = s.off[d][q] + li;
                            break;
                        }
                        li -= s.len[d][q];
                    }
                }
                int first = t.stacked ? 1 : 0;
                int pi = t.params[t.stacked ? g[0] : 0];
                const hp_ckpt_tensor *src = hp_ckpt_find(m->ckpt, m->params[pi].name);
                int64_t off = 0;
                for (int d = first; d < t.n_dims; d++) off = off * t.global_shape[d] + g[d];
                ok = !memcmp(local + e * es, (const uint8_t *)hp_st_data(src->file, src->t) + off * es, (size_t)es);
            }
            CHECK_MSG(ok, "%s: rank %lld tensor '%s' holds the wrong elements", label, (long long)r, t.name);
        }
        hp_st_close(f);
    }
}

/* The manifest lists every rank with its file; returns the number of ranks listed. */
static size_t manifest_ranks(const char *dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) return 0;
    json_t *ranks = json_object_get(root, "ranks");
    size_t n = json_array_size(ranks);
    for (size_t i = 0; i < n; i++) {
        char want[64];
        snprintf(want, sizeof want, "rank-%05zu.safetensors", i);
        CHECK_STR_EQ(json_string_value(json_object_get(json_array_get(ranks, i), "file")), want);
    }
    CHECK_STR_EQ(json_string_value(json_object_get(root, "format")), "hyperpar-shards");
    json_decref(root);
    return n;
}

/* Shards model_dir under one mesh and merges back; returns false when the planner refuses the combination. */
static bool round_trip(const char *model_dir, int mesh, bool deep)
{
    hp_model *m = NULL;
    hp_err err;
    CHECK_MSG(hp_model_open(&m, model_dir, NULL, &err) == HP_OK, "%s: %s", model_dir, err.msg);
    if (!m) return false;
    hp_plan_opts po;
    mesh_opts(mesh, &po);
    hp_plan *p = NULL;
    if (hp_plan_derive(&p, m, &po, &err) != HP_OK) {
        po.packed_fused = true; /* fused batched gate_up under tp without ep */
        if (hp_plan_derive(&p, m, &po, &err) != HP_OK) {
            hp_model_close(m);
            return false;
        }
    }
    char work[160], shards[200], merged[200], label[512];
    CHECK(test_tmpdir(work, sizeof work) != NULL);
    snprintf(shards, sizeof shards, "%s/shards", work);
    snprintf(merged, sizeof merged, "%s/merged", work);
    snprintf(label, sizeof label, "%s [%s]", model_dir, g_mesh_names[mesh]);
    hp_shard_opts so = {.threads = 2};
    hp_shard_stats stats;
    CHECK_MSG(hp_shard_write(m, p, shards, &so, &stats, &err) == HP_OK, "%s: %s", label, err.msg);
    hp_shard_layout *l = NULL;
    CHECK(hp_shard_layout_build(&l, m, p, &err) == HP_OK);
    if (l) {
        CHECK_EQ_INT(manifest_ranks(shards), l->world);
        CHECK_EQ_INT(stats.files + stats.links, l->world);
        if (deep) check_rank_files(m, l, shards, label);
    }
    hp_merge_opts mo = {0};
    CHECK_MSG(hp_shard_merge(shards, merged, &mo, NULL, &err) == HP_OK, "%s: merge: %s", label, err.msg);
    check_same(m, merged, label);
    char cfg[256];
    snprintf(cfg, sizeof cfg, "%s/config.json", merged);
    CHECK(access(cfg, R_OK) == 0);
    hp_shard_layout_free(l);
    test_rm_rf(work);
    hp_plan_free(p);
    hp_model_close(m);
    g_exercised[mesh]++;
    return true;
}

TEST(round_trip_golden_all_meshes)
{
    for (size_t i = 0; i < sizeof g_golden / sizeof *g_golden; i++) {
        char dir[256];
        snprintf(dir, sizeof dir, "data/golden/%s", g_golden[i]);
        for (int mesh = 0; mesh < M_COUNT; mesh++) round_trip(dir, mesh, true);
    }
}

TEST(round_trip_generated_every_family)
{
    char work[160];
    CHECK(test_tmpdir(work, sizeof work) != NULL);
    int families = 0;
    for (size_t f = 0; f < hp_family_count(); f++) {
        const hp_family *fam = hp_family_at(f);
        for (int layout = 0; layout < (hp_family_is_moe(fam) ? 2 : 1); layout++) {
            hp_gen_opts o;
            hp_gen_opts_default(&o);
            o.family = hp_family_name(fam);
            o.layout = layout ? HP_LAYOUT_BATCHED : HP_LAYOUT_PER_EXPERT;
            o.dtype = layout ? HP_DT_BF16 : HP_DT_F32;
            o.seed = f;
            char dir[256];
            snprintf(dir, sizeof dir, "%s/%s_%d", work, o.family, layout);
            hp_err err;
            CHECK_MSG(hp_gen_checkpoint(&o, dir, &err) == HP_OK, "%s: %s", o.family, err.msg);
            int ok = 0;
            for (int mesh = 0; mesh < M_COUNT; mesh++) ok += round_trip(dir, mesh, mesh == M_TP2_EPAXIS);
            CHECK_MSG(ok >= 2, "%s: only %d meshes could be planned", o.family, ok);
        }
        families++;
    }
    CHECK(families >= 10);
    test_rm_rf(work);
}

TEST(every_mesh_exercised_by_several_models)
{
    /* Runs after the round trips (tests run in registration order). */
    for (int mesh = 0; mesh < M_COUNT; mesh++) printf("mesh %-16s %d models\n", g_mesh_names[mesh], g_exercised[mesh]);
    for (int mesh = 0; mesh < M_COUNT; mesh++)
        CHECK_MSG(g_exercised[mesh] >= 6, "mesh %s exercised by %d models", g_mesh_names[mesh], g_exercised[mesh]);
}

/* Expected local shape of a parameter from its placement, computed here from the plan alone. */
static void expect_local(const hp_shard_layout *l, const hp_plan *p, int64_t rank, const char *name,
                         const int64_t *global, int n_dims, const char *stack_of)
{
    hp_nplace pl;
    CHECK_MSG(hp_plan_param_placement(p, stack_of ? stack_of : name, &pl) != NULL, "%s not covered", name);
    int64_t want[HP_MAX_DIMS];
    memcpy(want, global, sizeof(int64_t) * (size_t)n_dims);
    const int64_t sizes[HP_AXIS_COUNT] = {l->tp, l->cp, l->ep};
    for (int a = 0; a < HP_AXIS_COUNT; a++)
        if (pl.ax[a].kind == HP_PL_S || pl.ax[a].kind == HP_PL_S2) {
            int d = pl.ax[a].dim < 0 ? pl.ax[a].dim + n_dims : pl.ax[a].dim;
            want[d] /= sizes[a];
        }
    for (size_t i = 0; i < l->n_tensors; i++) {
        if (strcmp(l->tensors[i].name, name)) continue;
        hp_shard_tensor t;
        hp_err err;
        CHECK(hp_shard_rank_tensor(l, rank, i, &t, &err) == HP_OK);
        CHECK_EQ_INT(t.n_dims, n_dims);
        for (int d = 0; d < n_dims; d++)
            CHECK_MSG(t.local_shape[d] == want[d], "%s dim %d: %lld vs %lld", name, d, (long long)t.local_shape[d],
                      (long long)want[d]);
        return;
    }
    CHECK_MSG(false, "no rank tensor named %s", name);
}

TEST(local_shapes_and_slices_follow_the_plan)
{
    hp_model *m = NULL;
    hp_err err;
    CHECK(hp_model_open(&m, "data/golden/qwen2_moe_per_expert_f32", NULL, &err) == HP_OK);
    hp_plan_opts po;
    mesh_opts(M_TP2_EPAXIS, &po);
    hp_plan *p = NULL;
    CHECK(hp_plan_derive(&p, m, &po, &err) == HP_OK);
    hp_shard_layout *l = NULL;
    CHECK(hp_shard_layout_build(&l, m, p, &err) == HP_OK);
    if (!l) return;
    CHECK_EQ_INT(l->world, 4);
    const hp_param *q = hp_model_find_param(m, "model.layers.0.self_attn.q_proj.weight");
    const hp_param *g0 = hp_model_find_param(m, "model.layers.0.mlp.experts.0.gate_proj.weight");
    int64_t E = m->cfg.n_experts, stack_shape[3] = {E, g0->shape[0], g0->shape[1]};
    for (int64_t r = 0; r < 4; r++) {
        expect_local(l, p, r, q->name, q->shape, q->n_dims, NULL);
        expect_local(l, p, r, "model.layers.0.mlp.experts.gate_proj", stack_shape, 3, g0->name);
    }
    /* rank 3 = (tp=1, ep=1): q rows [H/2, H), experts [E/2, E) and gate rows [I/2, I) */
    for (size_t i = 0; i < l->n_tensors; i++) {
        hp_shard_tensor t;
        CHECK(hp_shard_rank_tensor(l, 3, i, &t, &err) == HP_OK);
        if (!strcmp(t.name, q->name)) {
            CHECK_EQ_INT(t.n_slices, 1);
            CHECK(t.slices[0].dim == 0 && t.slices[0].offset == q->shape[0] / 2 &&
                  t.slices[0].length == q->shape[0] / 2);
        }
        if (!strcmp(t.name, "model.layers.0.mlp.experts.gate_proj")) {
            CHECK(t.stacked && t.n_globals == E);
            CHECK(t.expert_first == E / 2 && t.expert_count == E / 2);
            CHECK_EQ_INT(t.n_slices, 2);
            CHECK(t.slices[1].dim == 1 && t.slices[1].offset == g0->shape[0] / 2);
        }
    }
    char buf[64];
    CHECK_STR_EQ(hp_shard_coords_str(l, 3, buf, sizeof buf), "tp=1,ep=1");
    hp_shard_layout_free(l);
    hp_plan_free(p);

    /* D-10: dp=2,tp=2 with ep=4 -> one EP group of all four ranks; rank r holds experts [r·E/4, (r+1)·E/4). */
    mesh_opts(M_DP2_TP2_EP4, &po);
    CHECK(hp_plan_derive(&p, m, &po, &err) == HP_OK);
    CHECK(hp_shard_layout_build(&l, m, p, &err) == HP_OK);
    for (int64_t r = 0; l && r < 4; r++) {
        for (size_t i = 0; i < l->n_tensors; i++) {
            hp_shard_tensor t;
            CHECK(hp_shard_rank_tensor(l, r, i, &t, &err) == HP_OK);
            if (!strcmp(t.name, "model.layers.1.mlp.experts.down_proj"))
                CHECK(t.expert_first == r * E / 4 && t.expert_count == E / 4);
        }
        CHECK_EQ_INT(l->ranks[r].file_rank, r);
    }
    hp_shard_layout_free(l);
    hp_plan_free(p);
    hp_model_close(m);
}

TEST(dp_replicas_are_hard_links)
{
    hp_model *m = NULL;
    hp_err err;
    CHECK(hp_model_open(&m, "data/golden/mixtral_per_expert_f32", NULL, &err) == HP_OK);
    hp_plan_opts po;
    hp_plan_opts_default(&po);
    hp_mesh_from_sizes(&po.mesh, 2, 1, 2, 1, false);
    hp_plan *p = NULL;
    CHECK(hp_plan_derive(&p, m, &po, &err) == HP_OK);
    char work[160], out[200];
    CHECK(test_tmpdir(work, sizeof work) != NULL);
    snprintf(out, sizeof out, "%s/shards", work);
    hp_shard_stats stats;
    CHECK_MSG(hp_shard_write(m, p, out, NULL, &stats, &err) == HP_OK, "%s", err.msg);
    CHECK_EQ_INT(stats.files, 2);
    CHECK_EQ_INT(stats.links, 2);
    for (int r = 0; r < 2; r++) {
        char a[256], b[256];
        snprintf(a, sizeof a, "%s/rank-%05d.safetensors", out, r);
        snprintf(b, sizeof b, "%s/rank-%05d.safetensors", out, r + 2);
        struct stat sa, sb;
        CHECK(stat(a, &sa) == 0 && stat(b, &sb) == 0);
        CHECK(sa.st_ino == sb.st_ino);
        hp_st_file *f = NULL;
        CHECK(hp_st_open(&f, b, &err) == HP_OK);
        char want[16];
        snprintf(want, sizeof want, "%d,%d", r, r + 2);
        CHECK_STR_EQ(hp_st_metadata_get(f, "hyperpar_rank"), want);
        CHECK_STR_EQ(hp_st_metadata_get(f, "hyperpar_mesh"), "dp=2,cp=1,tp=2");
        CHECK_STR_EQ(hp_st_metadata_get(f, "hyperpar_world"), "4");
        CHECK_STR_EQ(hp_st_metadata_get(f, "format"), "pt");
        hp_st_close(f);
    }
    test_rm_rf(work);
    hp_plan_free(p);
    hp_model_close(m);
}

TEST(parse_size)
{
    uint64_t v = 0;
    CHECK(hp_shard_parse_size("5GB", &v) && v == 5000000000ull);
    CHECK(hp_shard_parse_size("2GiB", &v) && v == 2147483648ull);
    CHECK(hp_shard_parse_size("500mb", &v) && v == 500000000ull);
    CHECK(hp_shard_parse_size("123", &v) && v == 123);
    CHECK(!hp_shard_parse_size("0", &v));
    CHECK(!hp_shard_parse_size("5 parsecs", &v));
    CHECK(!hp_shard_parse_size("", &v));
}

TEST_MAIN()
