/*
 * test_pp_schedule.c — the pipeline schedules (src/plan/schedule.c): each stage's list runs every forward and
 * backward of its chunks once, a chunk's backwards in micro-batch order; the in-flight counts (1F1B min(p − s, m),
 * GPipe m, interleaved Megatron's warm-up + 1); the simulated bubble (p − 1)/(v·m) for even stages; and that the
 * runtime's exchanges (each send fused with the next operation's receive, rendezvous semantics) never deadlock.
 */
#include <stdlib.h>
#include <string.h>

#include "hyperpar/plan.h"
#include "testlib.h"

static hp_pipeline pipe_of(hp_arena *a, int64_t L, int64_t pp, int64_t v)
{
    hp_pipeline q;
    hp_err e;
    CHECK(hp_pipeline_split(&q, L, pp, v, NULL, 0, a, &e) == HP_OK);
    return q;
}

/* Every (chunk of stage s, micro-batch) forward once and backward once, the backward after the forward, and each
 * chunk's forwards and backwards in micro-batch order. */
static void check_lists(const hp_pipeline *q, hp_pp_sched k, int64_t m)
{
    int64_t per = 2 * q->virt * m, C = q->n_chunks;
    hp_pp_op *ops = malloc((size_t)per * sizeof *ops);
    int64_t *nf = calloc((size_t)C, sizeof *nf), *nb = calloc((size_t)C, sizeof *nb);
    for (int64_t s = 0; s < q->pp; s++) {
        hp_pp_sched_ops(q, k, m, s, ops);
        memset(nf, 0, (size_t)C * sizeof *nf);
        memset(nb, 0, (size_t)C * sizeof *nb);
        for (int64_t i = 0; i < per; i++) {
            int64_t c = ops[i].chunk;
            CHECK_MSG(c >= 0 && c < C && c % q->pp == s, "%s stage %lld op %lld: chunk %lld", hp_pp_sched_name(k),
                      (long long)s, (long long)i, (long long)c);
            if (c < 0 || c >= C) break;
            if (ops[i].bwd) {
                CHECK_EQ_INT(ops[i].mb, nb[c]);
                CHECK(nb[c] < nf[c]); /* its forward ran */
                nb[c]++;
            } else {
                CHECK_EQ_INT(ops[i].mb, nf[c]);
                nf[c]++;
            }
        }
        for (int64_t c = s; c < C; c += q->pp) CHECK(nf[c] == m && nb[c] == m);
    }
    free(ops), free(nf), free(nb);
}

TEST(lists_run_each_operation_once_in_micro_batch_order)
{
    hp_arena a;
    hp_arena_init(&a);
    hp_err e;
    int64_t ms[] = {1, 2, 3, 4, 8};
    for (int64_t pp = 2; pp <= 5; pp++)
        for (size_t i = 0; i < sizeof ms / sizeof *ms; i++) {
            hp_pipeline q = pipe_of(&a, 12, pp, 1);
            check_lists(&q, HP_PP_1F1B, ms[i]);
            check_lists(&q, HP_PP_GPIPE, ms[i]);
            for (int64_t v = 2; v <= 3; v++) {
                hp_pipeline qv = pipe_of(&a, 24, pp, v);
                if (ms[i] % pp == 0) check_lists(&qv, HP_PP_INTERLEAVED, ms[i]);
                else CHECK(hp_pp_sched_check(&qv, HP_PP_INTERLEAVED, ms[i], &e) == HP_ERR_INPUT);
            }
        }
    hp_arena_free(&a);
}

TEST(the_1f1b_order)
{
    hp_arena a;
    hp_arena_init(&a);
    hp_pipeline q = pipe_of(&a, 8, 4, 1);
    hp_pp_op ops[16];
    /* stage 0: 3 warm-up forwards, then F3 B0 F4 B1 ... , then the last backwards */
    hp_pp_sched_ops(&q, HP_PP_1F1B, 8, 0, ops);
    const char *want0 = "F0F1F2F3B0F4B1F5B2F6B3F7B4B5B6B7";
    char got[64] = "", *p = got;
    for (int i = 0; i < 16; i++) p += sprintf(p, "%c%lld", ops[i].bwd ? 'B' : 'F', (long long)ops[i].mb);
    CHECK_STR_EQ(got, want0);
    /* the last stage: one forward, its backward, and so on */
    hp_pp_sched_ops(&q, HP_PP_1F1B, 8, 3, ops);
    p = got;
    for (int i = 0; i < 16; i++) p += sprintf(p, "%c%lld", ops[i].bwd ? 'B' : 'F', (long long)ops[i].mb);
    CHECK_STR_EQ(got, "F0B0F1B1F2B2F3B3F4B4F5B5F6B6F7B7");
    hp_arena_free(&a);
}

TEST(in_flight_counts)
{
    hp_arena a;
    hp_arena_init(&a);
    for (int64_t pp = 2; pp <= 6; pp++)
        for (int64_t m = 1; m <= 9; m++) {
            hp_pipeline q = pipe_of(&a, 16, pp, 1);
            for (int64_t s = 0; s < pp; s++) {
                int64_t want = pp - s < m ? pp - s : m;
                CHECK_MSG(hp_pp_sched_in_flight(&q, HP_PP_1F1B, m, s, NULL) == (double)want,
                          "1f1b pp=%lld m=%lld stage %lld", (long long)pp, (long long)m, (long long)s);
                CHECK(hp_pp_sched_in_flight(&q, HP_PP_GPIPE, m, s, NULL) == (double)m);
            }
            for (int64_t v = 2; v <= 3 && m % pp == 0; v++) {
                hp_pipeline qv = pipe_of(&a, 32, pp, v);
                for (int64_t s = 0; s < pp; s++) {
                    int64_t total = m * v, warm = m == pp ? total : (pp - s - 1) * 2 + (v - 1) * pp;
                    int64_t want = warm >= total ? total : warm + 1;
                    CHECK_MSG(hp_pp_sched_in_flight(&qv, HP_PP_INTERLEAVED, m, s, NULL) == (double)want,
                              "interleaved pp=%lld v=%lld m=%lld stage %lld", (long long)pp, (long long)v,
                              (long long)m, (long long)s);
                }
            }
        }
    hp_arena_free(&a);
}

TEST(simulated_bubble_is_p_minus_1_over_v_m_for_even_stages)
{
    hp_arena a;
    hp_arena_init(&a);
    hp_err e;
    double tf[64], tb[64];
    for (int i = 0; i < 64; i++) tf[i] = 1, tb[i] = 2;
    for (int64_t pp = 2; pp <= 8; pp *= 2)
        for (int64_t m = pp; m <= 4 * pp; m += pp) {
            hp_pipeline q = pipe_of(&a, 64, pp, 1);
            for (int k = 0; k < 2; k++) {
                double span, busy;
                CHECK(hp_pp_sched_simulate(&q, (hp_pp_sched)k, m, tf, tb, 0, &span, &busy, &e) == HP_OK);
                CHECK_CLOSE_MSG(&busy, &(double){3.0 * (double)m}, 1, 1e-12, 0, "busy");
                double want = (double)(pp - 1) / (double)m;
                CHECK_CLOSE_MSG(&(double){(span - busy) / busy}, &want, 1, 1e-12, 0, "%s pp=%lld m=%lld",
                                hp_pp_sched_name((hp_pp_sched)k), (long long)pp, (long long)m);
            }
            /* interleaved: each chunk takes 1/v of a stage's time */
            for (int64_t v = 2; v <= 4; v *= 2) {
                hp_pipeline qv = pipe_of(&a, 64, pp, v);
                double f[64], b[64], span, busy;
                for (int i = 0; i < 64; i++) f[i] = 1.0 / (double)v, b[i] = 2.0 / (double)v;
                CHECK(hp_pp_sched_simulate(&qv, HP_PP_INTERLEAVED, m, f, b, 0, &span, &busy, &e) == HP_OK);
                double want = (double)(pp - 1) / (double)(v * m);
                CHECK_CLOSE_MSG(&(double){(span - busy) / busy}, &want, 1, 1e-12, 0, "interleaved pp=%lld v=%lld "
                                "m=%lld", (long long)pp, (long long)v, (long long)m);
            }
        }
    hp_arena_free(&a);
}

/* ---- the runtime's exchanges under rendezvous semantics ----
 *
 * A stage's operations form units: one operation, or a steady-state pair (a backward joined to the forward before
 * it). Stage s posts phase u before unit u: unit u − 1's sends fused with unit u's receives. A message completes
 * once both its sender and its receiver have posted the phase holding it; a phase completes once all its messages
 * did. Message keys: a forward from chunk c to c + 1 for micro-batch j, or a backward from chunk c + 1 to c. */
static int64_t in_key(const hp_pp_op *o, int64_t C, int64_t m)
{
    if (!o->bwd) return o->chunk > 0 ? (o->chunk - 1) * m + o->mb : -1;
    return o->chunk + 1 < C ? (C + o->chunk) * m + o->mb : -1;
}

static int64_t out_key(const hp_pp_op *o, int64_t C, int64_t m)
{
    if (!o->bwd) return o->chunk + 1 < C ? o->chunk * m + o->mb : -1;
    return o->chunk > 0 ? (C + o->chunk - 1) * m + o->mb : -1;
}

static bool no_deadlock(const hp_pipeline *q, hp_pp_sched k, int64_t m)
{
    int64_t pp = q->pp, C = q->n_chunks, per = 2 * q->virt * m, keys = 2 * C * m;
    hp_pp_op *ops = malloc((size_t)(pp * per) * sizeof *ops);
    int64_t *unit = malloc((size_t)(pp * per) * sizeof *unit), *n_units = calloc((size_t)pp, sizeof *n_units);
    int64_t *send_ph = malloc((size_t)keys * sizeof *send_ph), *recv_ph = malloc((size_t)keys * sizeof *recv_ph);
    int64_t *send_st = malloc((size_t)keys * sizeof *send_st), *recv_st = malloc((size_t)keys * sizeof *recv_st);
    int64_t *phase = calloc((size_t)pp, sizeof *phase);
    for (int64_t s = 0; s < pp; s++) {
        hp_pp_sched_ops(q, k, m, s, ops + s * per);
        for (int64_t i = 0; i < per; i++) {
            const hp_pp_op *o = &ops[s * per + i];
            if (!o->joined || i == 0) n_units[s]++;
            int64_t u = unit[s * per + i] = n_units[s] - 1;
            int64_t ik = in_key(o, C, m), ok = out_key(o, C, m);
            if (ik >= 0) recv_ph[ik] = u, recv_st[ik] = s;     /* posted before its unit */
            if (ok >= 0) send_ph[ok] = u + 1, send_st[ok] = s; /* posted after it */
        }
    }
    for (bool moved = true; moved;) {
        moved = false;
        for (int64_t s = 0; s < pp; s++) {
            int64_t ph = phase[s];
            if (ph > n_units[s]) continue;
            bool done = true; /* phase ph: unit ph − 1's sends, unit ph's receives */
            for (int64_t i = 0; i < per; i++) {
                const hp_pp_op *o = &ops[s * per + i];
                int64_t u = unit[s * per + i], ok = out_key(o, C, m), ik = in_key(o, C, m);
                if (u == ph - 1 && ok >= 0 && phase[recv_st[ok]] < recv_ph[ok]) done = false;
                if (u == ph && ik >= 0 && phase[send_st[ik]] < send_ph[ik]) done = false;
            }
            if (done) phase[s]++, moved = true;
        }
    }
    bool all = true;
    for (int64_t s = 0; s < pp; s++) all = all && phase[s] > n_units[s];
    free(ops), free(unit), free(n_units), free(send_ph), free(recv_ph), free(send_st), free(recv_st), free(phase);
    return all;
}

TEST(fused_exchanges_never_deadlock)
{
    hp_arena a;
    hp_arena_init(&a);
    for (int64_t pp = 2; pp <= 8; pp++)
        for (int64_t m = 1; m <= 12; m++) {
            hp_pipeline q = pipe_of(&a, 40, pp, 1);
            CHECK_MSG(no_deadlock(&q, HP_PP_1F1B, m), "1f1b pp=%lld m=%lld", (long long)pp, (long long)m);
            CHECK_MSG(no_deadlock(&q, HP_PP_GPIPE, m), "gpipe pp=%lld m=%lld", (long long)pp, (long long)m);
            for (int64_t v = 2; v <= 3 && m % pp == 0; v++) {
                hp_pipeline qv = pipe_of(&a, 60, pp, v);
                CHECK_MSG(no_deadlock(&qv, HP_PP_INTERLEAVED, m), "interleaved pp=%lld v=%lld m=%lld", (long long)pp,
                          (long long)v, (long long)m);
            }
        }
    hp_arena_free(&a);
}

TEST(names_and_refusals)
{
    hp_arena a;
    hp_arena_init(&a);
    hp_err e;
    hp_pp_sched k;
    CHECK(hp_pp_sched_parse("gpipe", &k) && k == HP_PP_GPIPE);
    CHECK(hp_pp_sched_parse("interleaved", &k) && k == HP_PP_INTERLEAVED);
    CHECK(!hp_pp_sched_parse("zb-v", &k));
    hp_pipeline q = pipe_of(&a, 8, 2, 1), qv = pipe_of(&a, 8, 2, 2);
    CHECK(hp_pp_sched_default(&q) == HP_PP_1F1B && hp_pp_sched_default(&qv) == HP_PP_INTERLEAVED);
    CHECK(hp_pp_sched_check(&q, HP_PP_INTERLEAVED, 4, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "--pp-virtual");
    CHECK(hp_pp_sched_check(&qv, HP_PP_1F1B, 4, &e) == HP_ERR_INPUT);
    CHECK(hp_pp_sched_check(&qv, HP_PP_INTERLEAVED, 3, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "multiple");
    CHECK(hp_pp_sched_check(&q, HP_PP_GPIPE, 0, &e) == HP_ERR_INPUT);
    CHECK(hp_pp_sched_check(&q, HP_PP_GPIPE, 3, &e) == HP_OK);
    hp_arena_free(&a);
}

TEST_MAIN()
