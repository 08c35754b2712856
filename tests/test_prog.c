/*
 * test_prog.c — the program (exec/prog.h): the step list of every golden family in execution order, the layouts
 * it carries under sequence parallelism, without it and with loss-parallel, the MoE settings, and the refusals
 * it owns (written once: the runner and cost both print these).
 */
#include <stdio.h>
#include <string.h>

#include "exec/prog.h"
#include "hyperpar/model.h"
#include "hyperpar/overrides.h"
#include "hyperpar/plan.h"
#include "testlib.h"

static const char *const k_fams[] = {"llama", "mistral", "qwen2", "qwen3", "gpt_oss", "mixtral", "qwen2_moe",
                                     "qwen3_moe", "glm4_moe", "deepseek_v3"};

static hp_plan *plan_of(const hp_model *m, int64_t tp, int64_t cp, bool sp, bool lp, hp_err *err)
{
    hp_plan_opts po;
    hp_plan_opts_default(&po);
    hp_mesh_from_sizes(&po.mesh, 1, cp, tp, 1, false);
    po.sequence_parallel = sp;
    po.loss_parallel = lp;
    po.packed_fused = true;
    hp_plan *p = NULL;
    return hp_plan_derive(&p, m, &po, err) == HP_OK ? p : NULL;
}

static bool lay_is(const hp__lay *l, const char *want)
{
    char s[64];
    return !strcmp(hp__lay_str(l, s, sizeof s), want);
}

/* embed, then per layer norm, attention, residual, norm, feed-forward, residual (the layer's end), then the final
 * norm, the head and the loss: each module once, in order, with its local dims. */
TEST(every_family_is_one_step_list_in_execution_order)
{
    for (size_t f = 0; f < sizeof k_fams / sizeof *k_fams; f++) {
        char dir[128];
        snprintf(dir, sizeof dir, "data/forward/%s", k_fams[f]);
        hp_model *m = NULL;
        hp_err err;
        CHECK(hp_model_open(&m, dir, NULL, &err) == HP_OK);
        if (!m) continue;
        hp_plan *p = plan_of(m, 2, 1, true, false, &err);
        CHECK(p != NULL);
        hp__prog g;
        if (!p || hp__prog_build(&g, m, p, NULL, NULL, &err) != HP_OK) {
            fprintf(stderr, "  %s: %s\n", k_fams[f], err.msg);
            CHECK(false);
            hp_plan_free(p);
            hp_model_close(m);
            continue;
        }
        int64_t L = g.cfg.L;
        CHECK_EQ_INT((int64_t)g.n_steps, 1 + 6 * L + 3);
        CHECK(g.steps[0].op == HP__OP_EMBED && g.steps[0].layer == -1);
        bool mla = !strcmp(k_fams[f], "deepseek_v3");
        for (int64_t l = 0; l < L; l++) {
            const hp__step *s = &g.steps[1 + 6 * l];
            CHECK(s[0].op == HP__OP_NORM && s[0].keep && s[0].layer == l);
            CHECK(s[1].op == (mla ? HP__OP_MLA : HP__OP_ATTN) && s[1].split);
            CHECK(s[2].op == HP__OP_RESIDUAL && !s[2].ends_layer && !strcmp(s[2].c.fqn, s[1].c.fqn));
            CHECK(s[3].op == HP__OP_NORM && !s[3].keep);
            CHECK(s[4].op == HP__OP_MLP || s[4].op == HP__OP_MOE);
            CHECK(s[5].op == HP__OP_RESIDUAL && s[5].ends_layer);
            CHECK_EQ_INT(s[1].nh * 2, g.cfg.nh); /* tp = 2 cuts the heads */
            if (!mla) CHECK_EQ_INT(s[1].nkv * 2, g.cfg.nkv);
            char want[96];
            snprintf(want, sizeof want, "model.layers.%lld.self_attn", (long long)l);
            CHECK(!strcmp(s[1].c.fqn, want) && true);
            /* sequence parallelism: the stream is cut along the sequence on tp, attention runs on whole rows,
             * gives a partial sum and leaves reduce-scattered back onto the sequence */
            CHECK(lay_is(&s[0].in, "{tp: S(1), cp: R}"));
            CHECK(lay_is(&s[1].run, "{tp: R, cp: R}"));
            CHECK(lay_is(&s[1].out, "{tp: P, cp: R}"));
            CHECK(lay_is(&s[1].leave, "{tp: S(1), cp: R}"));
            if (s[4].op == HP__OP_MOE) CHECK(s[4].I == m->cfg.moe_intermediate_size);
            else CHECK(s[4].I == g.cfg.I && s[4].split);
        }
        const hp__step *t = &g.steps[g.n_steps - 3];
        CHECK(t[0].op == HP__OP_NORM && t[0].keep && t[0].layer == -1);
        CHECK(t[1].op == HP__OP_HEAD && t[1].X == g.cfg.V && t[1].split == g.head_split);
        CHECK(t[2].op == HP__OP_LOSS);
        CHECK(lay_is(&t[2].in, "{tp: R, cp: R}")); /* without loss-parallel the logits are gathered */
        CHECK(!t[2].split);
        hp__prog_free(&g);
        hp_plan_free(p);
        hp_model_close(m);
    }
}

TEST(loss_parallel_and_context_parallel_layouts)
{
    hp_model *m = NULL;
    hp_err err;
    CHECK(hp_model_open(&m, "data/forward/llama", NULL, &err) == HP_OK);
    if (!m) return;
    hp_plan *p = plan_of(m, 2, 2, true, true, &err);
    CHECK(p != NULL);
    hp__prog g;
    CHECK(p && hp__prog_build(&g, m, p, NULL, NULL, &err) == HP_OK);
    if (p && g.steps) {
        const hp__step *z = &g.steps[g.n_steps - 1];
        CHECK(z->op == HP__OP_LOSS && z->split);
        CHECK(lay_is(&z->in, "{tp: S(2), cp: S(1)}"));
        CHECK(lay_is(&g.stream, "{tp: S(1), cp: S(1)}"));
        hp__prog_free(&g);
    }
    hp_plan_free(p);
    /* without sequence parallelism the stream is whole on tp and the attention's exit all-reduces */
    p = plan_of(m, 2, 1, false, false, &err);
    CHECK(p && hp__prog_build(&g, m, p, NULL, NULL, &err) == HP_OK);
    if (p && g.steps) {
        CHECK(lay_is(&g.stream, "{tp: R, cp: R}"));
        CHECK(lay_is(&g.steps[2].leave, "{tp: R, cp: R}"));
        hp__prog_free(&g);
    }
    hp_plan_free(p);
    hp_model_close(m);
}

/* MoE without EP at tp = 2: the experts are cut over tp, the block's output is a partial sum its exit reduces. */
TEST(moe_experts_cut_over_tp)
{
    hp_model *m = NULL;
    hp_err err;
    CHECK(hp_model_open(&m, "data/forward/qwen3_moe", NULL, &err) == HP_OK);
    if (!m) return;
    hp_plan *p = plan_of(m, 2, 1, true, false, &err);
    hp__prog g;
    CHECK(p && hp__prog_build(&g, m, p, NULL, NULL, &err) == HP_OK);
    if (p && g.steps) {
        int moe = 0;
        for (size_t i = 0; i < g.n_steps; i++) {
            const hp__step *s = &g.steps[i];
            if (s->op != HP__OP_MOE) continue;
            moe++;
            CHECK(s->split && s->archetype == -1 && s->cf == 0);
            CHECK(lay_is(&s->run, "{tp: R, cp: R}"));
            CHECK(lay_is(&s->out, "{tp: P, cp: R}"));
        }
        CHECK(moe > 0);
        CHECK(g.moe_whole == NULL); /* the experts split the tp ranks' work */
        hp__prog_free(&g);
    }
    hp_plan_free(p);
    hp_model_close(m);
}

/* The refusals the program owns: a router cut over tp, a plan without a module's boundary, an out_src the
 * weights' placements cannot give. Each is refused once, here, with the reason. */
TEST(refusals)
{
    hp_model *m = NULL;
    hp_err err;
    CHECK(hp_model_open(&m, "data/forward/qwen3_moe", NULL, &err) == HP_OK);
    if (!m) return;
    hp_plan *p = plan_of(m, 2, 1, true, false, &err);
    hp__prog g;
    if (p) { /* the router cut over tp by hand */
        for (size_t i = 0; i < p->n_boundaries; i++) {
            hp_boundary *b = &p->boundaries[i];
            for (int k = 0; k < b->n_params; k++)
                if (!strcmp(b->params[k].rel, "gate.weight")) b->params[k].pl.ax[HP_AXIS_TP] = hp_pl_s(0);
        }
        CHECK(hp__prog_build(&g, m, p, NULL, NULL, &err) == HP_ERR_INPUT);
        CHECK_STR_CONTAINS(err.msg, "the router must be replicated");
        CHECK(g.steps == NULL && g.n_steps == 0);
    }
    hp_plan_free(p);
    p = plan_of(m, 2, 1, true, false, &err);
    if (p) { /* attention's boundary gone */
        for (size_t i = 0; i < p->n_boundaries; i++)
            if (!strcmp(p->boundaries[i].fqn, "model.layers.1.self_attn")) p->boundaries[i].is_boundary = false;
        CHECK(hp__prog_build(&g, m, p, NULL, NULL, &err) == HP_ERR_INPUT);
        CHECK_STR_CONTAINS(err.msg, "the plan has no boundary for model.layers.1.self_attn");
    }
    hp_plan_free(p);
    p = plan_of(m, 2, 1, true, false, &err);
    if (p) { /* attention's out_src says S(1) where its row-parallel o_proj gives a partial sum */
        for (size_t i = 0; i < p->n_boundaries; i++) {
            hp_boundary *b = &p->boundaries[i];
            if (strcmp(b->fqn, "model.layers.0.self_attn") || b->out_dst.is_null || !b->out_dst.n) continue;
            b->out_src.e[0].pl.ax[HP_AXIS_TP] = hp_pl_s(1);
        }
        CHECK(hp__prog_build(&g, m, p, NULL, NULL, &err) == HP_ERR_INPUT);
        CHECK_STR_CONTAINS(err.msg, "boundary model.layers.0.self_attn: its computation gives {tp: P, cp: R}");
    }
    hp_plan_free(p);
    hp_model_close(m);
}

TEST(sequence_padding_and_dp_rows)
{
    int64_t sp;
    CHECK(hp__seq_pad(7, 1, &sp) && sp == 7);
    CHECK(hp__seq_pad(7, 2, &sp) && sp == 8);
    CHECK(hp__seq_pad(9, 2, &sp) && sp == 12);
    CHECK(!hp__seq_pad(INT64_MAX - 1, 2, &sp));
    int64_t rows[4];
    hp__dp_rows(5, 3, rows);
    CHECK(rows[0] == 0 && rows[1] == 1 && rows[2] == 3 && rows[3] == 5);
}

/* The MLP's row chunks: they tile the rows from row 0, start at multiples of HP__MLP_CHUNK_ROWS, none shorter than
 * HP__MLP_CHUNK_MIN unless the rows are, and hp__mlp_chunk_rows (O(1)) is the longest; whole is one chunk. */
static bool chunks_hold(int64_t rows)
{
    int64_t most = 0, n = 0, r1;
    bool ok = true;
    for (int64_t r0 = 0; r0 < rows; r0 = r1, n++) {
        r1 = hp__mlp_chunk_end(rows, r0, false);
        ok = ok && r1 > r0 && r1 <= rows && r0 % HP__MLP_CHUNK_ROWS == 0 &&
             (r1 - r0 >= HP__MLP_CHUNK_MIN || r1 - r0 == rows);
        most = r1 - r0 > most ? r1 - r0 : most;
    }
    int64_t full = rows / HP__MLP_CHUNK_ROWS - (rows % HP__MLP_CHUNK_ROWS < HP__MLP_CHUNK_MIN);
    return ok && most == hp__mlp_chunk_rows(rows, false) && most < HP__MLP_CHUNK_ROWS + HP__MLP_CHUNK_MIN &&
           (rows == 0 || n == 1 || n == full + 1);
}

TEST(mlp_row_chunks)
{
    bool ok = true;
    for (int64_t rows = 0; rows <= 6 * HP__MLP_CHUNK_ROWS; rows++) ok = ok && chunks_hold(rows);
    CHECK(ok);
    CHECK(chunks_hold(1000003));
    CHECK(hp__mlp_chunk_rows(1279, false) == 1279);
    CHECK(hp__mlp_chunk_rows(1280, false) == 1024);
    CHECK(hp__mlp_chunk_end(1280, 1024, false) == 1280);
    CHECK(hp__mlp_chunk_rows(2303, false) == 1279);
    CHECK(hp__mlp_chunk_rows(32768, false) == 1024);
    CHECK(hp__mlp_chunk_rows(32768, true) == 32768);
    CHECK(hp__mlp_chunk_end(32768, 0, true) == 32768);
    /* cost sizes sequences far past memory: the longest chunk in O(1) */
    CHECK(hp__mlp_chunk_rows(INT64_MAX / 2, false) < HP__MLP_CHUNK_ROWS + HP__MLP_CHUNK_MIN);
    CHECK(hp__mlp_chunk_rows(INT64_MAX, false) >= HP__MLP_CHUNK_MIN);
}

TEST_MAIN()
