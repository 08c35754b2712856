/*
 * test_pipeline.c — the pp axis's stages (src/plan/pipeline.c): the even split with the embedding and the loss
 * counted as a layer each, virtual stages round robin, --pp-layers, the refusals, and which stages hold each
 * parameter; and a plan derived with pp, its JSON and explain.
 */
#include <string.h>

#include "hyperpar/plan.h"
#include "testlib.h"

static void counts(const hp_pipeline *q, const int64_t *want, int n)
{
    CHECK_EQ_INT(q->n_chunks, n);
    int64_t first = 0;
    for (int c = 0; c < n && c < q->n_chunks; c++) {
        CHECK_MSG(q->count[c] == want[c], "chunk %d: %lld layers, want %lld", c, (long long)q->count[c],
                  (long long)want[c]);
        CHECK_EQ_INT(q->first[c], first); /* contiguous, in chunk order */
        first += q->count[c];
    }
}

TEST(even_split_counts_embedding_and_loss)
{
    hp_arena a;
    hp_arena_init(&a);
    hp_err e;
    hp_pipeline q;
    /* 32 layers + 2 = 34 units over 4 stages: 8, 8, 9, 9 (the last 34 mod 4 take one more); the first and the last
     * give one to the embedding and the loss */
    CHECK(hp_pipeline_split(&q, 32, 4, 1, NULL, 0, &a, &e) == HP_OK);
    counts(&q, (int64_t[]){7, 8, 9, 8}, 4);
    CHECK(!q.given && q.pp == 4 && q.virt == 1);
    /* Llama 3 405B's 126 layers over pp=16: 128 units, 8 each: 7, 8 x 14, 7 */
    CHECK(hp_pipeline_split(&q, 126, 16, 1, NULL, 0, &a, &e) == HP_OK);
    CHECK(q.count[0] == 7 && q.count[15] == 7 && q.count[1] == 8 && q.count[14] == 8);
    /* virtual stages: 8 chunks of 34 units; chunk c on stage c mod 4 */
    CHECK(hp_pipeline_split(&q, 32, 4, 2, NULL, 0, &a, &e) == HP_OK);
    counts(&q, (int64_t[]){3, 4, 4, 4, 4, 4, 5, 4}, 8);
    CHECK_EQ_INT(hp_pipeline_stage_of(&q, 0), 0);
    CHECK_EQ_INT(hp_pipeline_stage_of(&q, 15), 0); /* chunk 4 */
    CHECK_EQ_INT(hp_pipeline_stage_of(&q, 31), 3); /* chunk 7 */
    CHECK_EQ_INT(hp_pipeline_chunk_of(&q, 3), 1);
    /* a stage may hold only the embedding: 2 layers over pp=4 */
    CHECK(hp_pipeline_split(&q, 2, 4, 1, NULL, 0, &a, &e) == HP_OK);
    counts(&q, (int64_t[]){0, 1, 1, 0}, 4);
    /* no pipeline: one chunk of every layer */
    CHECK(hp_pipeline_split(&q, 5, 1, 1, NULL, 0, &a, &e) == HP_OK);
    counts(&q, (int64_t[]){5}, 1);
    hp_arena_free(&a);
}

TEST(given_counts_and_refusals)
{
    hp_arena a;
    hp_arena_init(&a);
    hp_err e;
    hp_pipeline q;
    CHECK(hp_pipeline_split(&q, 22, 4, 1, (int64_t[]){5, 6, 6, 5}, 4, &a, &e) == HP_OK);
    counts(&q, (int64_t[]){5, 6, 6, 5}, 4);
    CHECK(q.given);
    CHECK(hp_pipeline_split(&q, 22, 4, 1, (int64_t[]){5, 6, 6, 4}, 4, &a, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "the counts sum to 21, but the model has 22 decoder layers");
    CHECK(hp_pipeline_split(&q, 22, 4, 1, (int64_t[]){5, 6, 11}, 3, &a, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "gives 3 counts; pp=4 x 1 virtual stages has 4 chunks");
    CHECK(hp_pipeline_split(&q, 22, 2, 1, (int64_t[]){-1, 23}, 2, &a, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "chunk 0 has -1 layers");
    CHECK(hp_pipeline_split(&q, 2, 4, 2, NULL, 0, &a, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "makes 8 chunks, but the model has only 2 decoder layers");
    CHECK(hp_pipeline_split(&q, 8, 1, 2, NULL, 0, &a, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "needs a pipeline (pp >= 2)");
    hp_arena_free(&a);
}

static hp_model *open_model(const char *path)
{
    hp_model *m = NULL;
    hp_err e;
    CHECK_MSG(hp_model_open(&m, path, NULL, &e) == HP_OK, "%s", e.msg);
    return m;
}

static hp_plan *derive(hp_model *m, const char *mesh, int64_t virt, hp_err *e)
{
    hp_plan_opts o;
    hp_plan_opts_default(&o);
    CHECK(hp_mesh_parse(mesh, &o.mesh, e) == HP_OK);
    o.pp_virtual = virt;
    hp_plan *p = NULL;
    return hp_plan_derive(&p, m, &o, e) == HP_OK ? p : NULL;
}

TEST(param_stages_and_the_plan)
{
    hp_model *m = open_model("data/forward/llama"); /* 2 layers, its own lm_head */
    hp_err e;
    hp_plan *p = m ? derive(m, "pp=2,tp=2", 1, &e) : NULL;
    CHECK_MSG(p != NULL, "%s", e.msg);
    if (p) {
        int64_t st[2];
        CHECK(hp_pipeline_param_stages(p, "model.embed_tokens.weight", st) == 1 && st[0] == 0);
        CHECK(hp_pipeline_param_stages(p, "model.layers.0.self_attn.q_proj.weight", st) == 1 && st[0] == 0);
        CHECK(hp_pipeline_param_stages(p, "model.layers.1.mlp.down_proj.weight", st) == 1 && st[0] == 1);
        CHECK(hp_pipeline_param_stages(p, "model.norm.weight", st) == 1 && st[0] == 1);
        CHECK(hp_pipeline_param_stages(p, "lm_head.weight", st) == 1 && st[0] == 1);
        hp_buf b;
        hp_buf_init(&b);
        CHECK(hp_plan_explain(p, NULL, &b, &e) == HP_OK);
        hp_buf_append(&b, "", 1);
        CHECK_STR_CONTAINS(b.data, "stage 0 (ranks 0-1): embedding, chunk 0: layers 0-0 (1);");
        CHECK_STR_CONTAINS(b.data, "stage 1 (ranks 2-3): chunk 1: layers 1-1 (1); final norm, lm_head and the loss");
        hp_buf_free(&b);
        hp_buf_init(&b);
        CHECK(hp_plan_to_json(p, &b, &e) == HP_OK);
        hp_buf_append(&b, "", 1);
        CHECK_STR_CONTAINS(b.data, "\"pipeline\"");
        hp_buf_free(&b);
        hp_plan_free(p);
    }
    /* pp after another axis is refused: pp is the outermost */
    CHECK(m && !derive(m, "tp=2,pp=2", 1, &e));
    CHECK_STR_CONTAINS(e.msg, "pp must be the mesh's first (outermost) axis");
    hp_model_close(m);
    /* a tied head: the last stage holds the embedding too */
    m = open_model("data/forward/qwen2");
    p = m ? derive(m, "pp=2", 1, &e) : NULL;
    CHECK_MSG(p != NULL, "%s", e.msg);
    if (p) {
        int64_t st[2];
        CHECK(hp_pipeline_param_stages(p, "model.embed_tokens.weight", st) == 2 && st[0] == 0 && st[1] == 1);
        hp_plan_free(p);
    }
    hp_model_close(m);
}

TEST_MAIN()
