/*
 * test_cost_sizes.c — size arithmetic on the user's batch (issue 20, #9): the dry executor refuses a batch whose
 * figures 64 bits cannot hold instead of wrapping them, and the largest batch it accepts gives exact figures (they
 * scale linearly with the batch, but for the MLP's one row chunk); the lowering's bytes saturate instead of
 * wrapping; an activation block past 64-bit sizes is refused before anything is allocated.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "exec/prog.h"
#include "hyperpar/cost.h"
#include "hyperpar/model.h"
#include "hyperpar/plan.h"
#include "run/run_int.h"
#include "testlib.h"

#define L3 "data/configs/llama-3-8b.json"
#define SCRATCH ((uint64_t)4 << 20) /* HP__COST_RUNTIME_SCRATCH in cost.c */

static hp_status cost_at(const hp_model *m, const hp_plan *p, int64_t B, int64_t S, hp_cost **c, hp_err *err)
{
    hp_cost_opts o;
    hp_cost_opts_default(&o);
    o.B = B, o.S = S;
    return hp_cost_compute(c, m, p, &o, err);
}

TEST(cost_refuses_a_batch_past_64_bits)
{
    hp_model *m = NULL;
    hp_plan *p = NULL;
    hp_err err;
    CHECK(hp_model_open(&m, L3, NULL, &err) == HP_OK);
    hp_plan_opts po;
    hp_plan_opts_default(&po);
    CHECK(m && hp_plan_derive(&p, m, &po, &err) == HP_OK);
    if (!p) {
        hp_model_close(m);
        return;
    }
    /* 2^24 x 2^22 tokens: rank 0's activations (the 33 layer inputs alone are 33·B·S·H floats) pass 2^64 */
    const int64_t refused[][2] = {{16777216, 4194304}, {INT32_MAX, INT32_MAX}, {INT64_MAX / 2, 2}};
    for (int i = 0; i < 3; i++) {
        hp_cost *c = (hp_cost *)&err; /* must come back NULL */
        CHECK(cost_at(m, p, refused[i][0], refused[i][1], &c, &err) == HP_ERR_INPUT);
        CHECK(c == NULL);
        CHECK_STR_CONTAINS(err.msg, "is past what the cost model can hold");
    }
    /* the largest power of two it holds at this sequence: exact, linear in the batch */
    hp_cost *big = NULL, *small = NULL;
    CHECK(cost_at(m, p, 2097152, 4194304, &big, &err) == HP_OK);
    CHECK(cost_at(m, p, 262144, 4194304, &small, &err) == HP_OK);
    if (big && small) {
        const hp_cost_rank *a = &big->ranks[0], *b = &small->ranks[0];
        /* less the MLP's buffers, one row chunk's gate|up and hidden whatever the batch (exec/prog.h) */
        uint64_t fixed = SCRATCH + (uint64_t)hp__mlp_chunk_rows(262144 * (int64_t)4194304, false) * 3 *
                                       (uint64_t)m->cfg.intermediate_size * sizeof(float);
        CHECK(a->act_bytes > fixed && b->act_bytes > fixed);
        CHECK(a->act_bytes - fixed == 8 * (b->act_bytes - fixed));
        CHECK(a->kv_bytes == 8 * b->kv_bytes && a->kv_bytes > 0);
        CHECK(a->total_bytes == a->weight_bytes + a->act_bytes + a->kv_bytes); /* inference: the KV cache counts */
        CHECK(a->flops > 0 && a->t_step > 0);
        CHECK(a->bytes[HP_RUN_GATHER] == 0 && b->bytes[HP_RUN_GATHER] == 0); /* inference takes no logits */
    }
    hp_cost_free(big);
    hp_cost_free(small);
    /* the longest sequence the flags take, one row: positive figures */
    hp_cost *one = NULL;
    CHECK(cost_at(m, p, 1, INT32_MAX, &one, &err) == HP_OK);
    if (one) /* at least h and t, [S, H] f32 each */
        CHECK(one->ranks[0].act_bytes > 2 * (uint64_t)INT32_MAX * (uint64_t)m->cfg.hidden_size * sizeof(float) &&
              one->ranks[0].flops > 0);
    hp_cost_free(one);
    hp_plan_free(p);
    hp_model_close(m);
}

TEST(lowering_bytes_saturate_past_64_bits)
{
    hp__axes x = {{2, 1}, {0, 0}};
    hp__lay from = {{hp_pl_s(2), hp_pl_r()}};
    int64_t g[3] = {2, 3, 8};
    hp__low w = hp__lower_axis(&x, &from, g, HP__TP, hp_pl_r());
    CHECK(w.kind == HP__LOW_ALL_GATHER);
    CHECK(w.bytes == 2 * 3 * 4 * sizeof(float)); /* this rank's block of [2, 3, 4] */
    int64_t huge[3] = {INT64_MAX / 2, 4, 8};
    w = hp__lower_axis(&x, &from, huge, HP__TP, hp_pl_r());
    CHECK(w.kind == HP__LOW_ALL_GATHER && w.bytes == UINT64_MAX);
    hp__lay part = {{hp_pl_p(), hp_pl_r()}};
    w = hp__lower_axis(&x, &part, huge, HP__TP, hp_pl_r());
    CHECK(w.kind == HP__LOW_ALL_REDUCE && w.bytes == UINT64_MAX);
    w = hp__lower_axis(&x, &part, huge, HP__TP, hp_pl_s(2));
    CHECK(w.kind == HP__LOW_REDUCE_SCATTER && w.bytes == UINT64_MAX);
}

TEST(activation_blocks_past_64_bits_are_refused)
{
    hp__ctx x = {0};
    x.pos = (hp__axes){{1, 1}, {0, 0}};
    hp__act a;
    memset(&a, 0, sizeof a);
    hp_err err;
    hp__lay whole = {{hp_pl_r(), hp_pl_r()}};
    CHECK(hp__act_alloc(&x, &a, INT64_MAX / 2, 4, 8, whole, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "past what 64-bit sizes hold");
    CHECK(a.d == NULL);
    CHECK(hp__act_alloc(&x, &a, (int64_t)1 << 40, (int64_t)1 << 40, 8, whole, &err) == HP_ERR_INPUT);
    CHECK(hp__act_alloc(&x, &a, 2, 3, 4, whole, &err) == HP_OK && a.d != NULL && a.cap >= 24);
    hp__act_free(&a);
}

TEST_MAIN()
