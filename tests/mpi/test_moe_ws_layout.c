/*
 * test_moe_ws_layout.c — the MoE runtime's arrays, described once (hp_moe_ep_layout), under mpirun (1, 2 and 4
 * ranks; also without a launcher): the EP group is the world, so P = 1, 2 and 4.
 *
 * For every creation (hp_moe_ep_create, _chunked with 2 and 3 chunks, _bounded with 2, 3 and 5 chunks), every kind
 * of shared expert (none, plain, gated) and several token counts, the sum of the layout a caller fills from the
 * shapes alone (as `hyperpar cost` does) equals hp_moe_ep_workspace_bytes of the runtime made, its workspace part
 * equals the workspace's bytes, and the workspace's optional arrays exist exactly where the layout lists them; the
 * same for hp_moe_ws_create's one-process workspace. Also: one small shape's bytes counted by hand from the
 * header's table, the arrays' names and order, and a count past 64 bits.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperpar/comm.h"
#include "hyperpar/moe.h"
#include "mpitest.h"

static hp_comm *W;

enum { E = 8, K = 2, H = 16, I = 8, SI = 12 };

/* 0: no shared expert; 1: plain (DeepSeek-V3); 2: gated (Qwen2-MoE). */
static hp_moe_layer *make_layer(int shared, int64_t first, int64_t n)
{
    static const hp_moe_archetype arch[3] = {HP_MOE_QWEN3MOE_TOPK_ROUTER, HP_MOE_DEEPSEEKV3_SIGMOID_GROUP_SHARED,
                                             HP_MOE_QWEN2MOE_SHARED_EXPERT_GATE};
    hp_moe_dims d = {.n_hidden = H, .n_experts = E, .top_k = K, .d_expert = I, .d_shared = shared ? SI : 0,
                     .first_expert = first, .n_local = n, .norm_topk_prob = true};
    hp_moe_layer *l = NULL;
    hp_err err;
    CHECK_MSG(hp_moe_layer_create(&l, arch[shared], &d, &err) == HP_OK, "%s", err.msg);
    return l;
}

/* The shape a caller fills without a runtime (cost's ep_workspace). */
static hp_moe_ep_shape shape(int shared, int64_t T, int64_t P, int64_t chunks, bool bounded)
{
    return (hp_moe_ep_shape){.max_tokens = T, .n_hidden = H, .n_experts = E, .top_k = K, .n_local = E / P,
                             .d_expert = I, .d_shared = shared ? SI : 0, .shared_gate = shared == 2,
                             .ep_size = P, .chunks = chunks, .bounded = bounded};
}

static bool listed(const hp_moe_ep_array *a, int n, hp_moe_arr_id id)
{
    for (int i = 0; i < n; i++)
        if (a[i].id == id) return true;
    return false;
}

/* The layout's sum against the runtime's bytes; the workspace part against the workspace's. */
static void check_runtime(const hp_moe_ep *ep, const hp_moe_ep_shape *s, const char *what)
{
    hp_moe_ep_array a[HP_MOE_ARR_COUNT];
    int n = hp_moe_ep_layout(s, a);
    uint64_t all = 0, ws_part = 0;
    CHECK(hp_moe_ep_layout_bytes(a, n, &all));
    int n_ws = 0;
    while (n_ws < n && a[n_ws].id < HP_MOE_ARR_EP_FIRST) n_ws++;
    CHECK(hp_moe_ep_layout_bytes(a, n_ws, &ws_part));
    const hp_moe_ws *ws = hp_moe_ep_ws(ep);
    CHECK_MSG(hp_moe_ep_workspace_bytes(ep) == all, "%s: runtime %zu bytes, layout %llu", what,
              hp_moe_ep_workspace_bytes(ep), (unsigned long long)all);
    CHECK_MSG(ws->bytes == ws_part, "%s: workspace %zu bytes, layout %llu", what, ws->bytes,
              (unsigned long long)ws_part);
    CHECK(ws->rows == NULL && !listed(a, n, HP_MOE_ARR_ROWS));
    CHECK((ws->shared_act != NULL) == listed(a, n, HP_MOE_ARR_SHARED_ACT));
    CHECK((ws->shared_out != NULL) == listed(a, n, HP_MOE_ARR_SHARED_OUT));
    CHECK((ws->shared_g != NULL) == listed(a, n, HP_MOE_ARR_SHARED_G));
    CHECK(ws->x64 && ws->logits && ws->sel && ws->topk_idx && ws->topk_w && ws->keep && ws->cap_scratch &&
          ws->counts && ws->offsets && ws->row_slot && ws->slot_row && ws->act && ws->groups && ws->pass_row0);
    CHECK_EQ_INT(ws->row_tokens, s->chunks > 1 && s->bounded ? (s->max_tokens + s->chunks - 1) / s->chunks
                                                             : s->max_tokens);
    CHECK(listed(a, n, HP_MOE_ARR_STAGE_CNT) == (s->chunks > 1) && listed(a, n, HP_MOE_ARR_STAGE_SZ) == (s->chunks > 1));
}

TEST(layout_sum_is_the_runtime_bytes)
{
    const int P = hp_comm_size(W), r = hp_comm_rank(W);
    static const int64_t tokens[] = {1, 2, 7, 64};
    static const struct { int chunks; bool bounded; } make[] = {{1, false}, {2, false}, {3, false},
                                                                {2, true},  {3, true},  {5, true}};
    hp_err err;
    for (int sh = 0; sh < 3; sh++) {
        hp_moe_layer *l = make_layer(sh, r * (E / P), E / P);
        if (!l) return;
        for (size_t ti = 0; ti < sizeof tokens / sizeof *tokens; ti++)
            for (size_t mi = 0; mi < sizeof make / sizeof *make; mi++) {
                int64_t T = tokens[ti];
                int C = make[mi].chunks;
                hp_moe_ep *ep = NULL;
                hp_status st = C <= 1          ? hp_moe_ep_create(&ep, l, W, T, &err)
                               : make[mi].bounded ? hp_moe_ep_create_bounded(&ep, l, W, T, C, &err)
                                                  : hp_moe_ep_create_chunked(&ep, l, W, T, C, &err);
                CHECK_MSG(st == HP_OK, "%s", err.msg);
                if (st != HP_OK) continue;
                char what[96];
                snprintf(what, sizeof what, "P %d, shared %d, T %lld, %d chunks%s", P, sh, (long long)T, C,
                         make[mi].bounded ? " bounded" : "");
                hp_moe_ep_shape s = shape(sh, T, P, C, make[mi].bounded);
                check_runtime(ep, &s, what);
                hp_moe_ep_destroy(ep);
            }
        hp_moe_layer_free(l);
    }
}

TEST(one_process_workspace)
{
    hp_err err;
    for (int sh = 0; sh < 3; sh++) {
        hp_moe_layer *l = make_layer(sh, 0, E);
        if (!l) return;
        for (int64_t T = 1; T <= 33; T += 16) {
            hp_moe_ws *ws = NULL;
            CHECK_MSG(hp_moe_ws_create(&ws, l, T, &err) == HP_OK, "%s", err.msg);
            if (!ws) continue;
            hp_moe_ep_shape s = shape(sh, T, 1, 1, false);
            s.one_process = true;
            hp_moe_ep_array a[HP_MOE_ARR_COUNT];
            int n = hp_moe_ep_layout(&s, a);
            uint64_t b = 0;
            CHECK(hp_moe_ep_layout_bytes(a, n, &b));
            CHECK_MSG(ws->bytes == b, "shared %d, T %lld: workspace %zu bytes, layout %llu", sh, (long long)T,
                      ws->bytes, (unsigned long long)b);
            CHECK(ws->rows != NULL && listed(a, n, HP_MOE_ARR_ROWS));
            CHECK(a[n - 1].id < HP_MOE_ARR_EP_FIRST);
            hp_moe_ws_destroy(ws);
        }
        hp_moe_layer_free(l);
    }
}

/* One shape by hand from the header's table: T 5, gated shared expert, P 2, bounded in 2 chunks (Th 3, Tb 6,
 * Tr 3), L 4. */
TEST(bytes_by_hand)
{
    hp_moe_ep_shape s = shape(2, 5, 2, 2, true);
    hp_moe_ep_array a[HP_MOE_ARR_COUNT];
    int n = hp_moe_ep_layout(&s, a);
    CHECK_EQ_INT(n, HP_MOE_ARR_BWD_FIRST - 1); /* everything but the one-process rows and the backward's */
    const uint64_t T = 5, L = 4, P = 2, Th = 3, Tb = 6, Tr = 3, cap = 2 * T * K + E + 1;
    uint64_t want = T * H * 8 + T * E * 8 + 2 * E * 8 + T * K * (4 + 4 + 1) + cap * 4 + L * 8 + (L + 1) * 8 +
                    T * K * 4 * 2 + Tr * K * 2 * I * 4 + L * sizeof(hp_linear_group) + L * 8 + Tr * 2 * SI * 4 +
                    Tr * H * 4 + Tr * 4 + /* EP */ 4 * P * L * 8 + 8 * P * sizeof(size_t) + E * 8 + (E + 1) * 8 +
                    2 * P * L * 8 + L * 8 + 4 * P * sizeof(size_t) + Tb * K * H * 4 + P * Tb * K * H * 4 +
                    P * Th * K * H * 4 + T * H * 4;
    uint64_t b = 0;
    CHECK(hp_moe_ep_layout_bytes(a, n, &b));
    CHECK_MSG(b == want, "%llu bytes, by hand %llu", (unsigned long long)b, (unsigned long long)want);
    /* The table's order is the enum's; names are the fields'. */
    for (int i = 1; i < n; i++) CHECK(a[i].id > a[i - 1].id);
    CHECK(!strcmp(a[0].name, "x64") && !strcmp(a[n - 1].name, "y_shared"));
    for (int i = 0; i < n; i++)
        if (a[i].id == HP_MOE_ARR_XROWS) CHECK(!strcmp(a[i].name, "xrows") && a[i].n == (int64_t)(P * Th * K * H));
    /* An array of 0 elements still takes a byte, as hp__moe_alloc allocates it. */
    hp_moe_ep_array z = {HP_MOE_ARR_SEL, "sel", 0, 8};
    CHECK(hp_moe_ep_layout_bytes(&z, 1, &b) && b == 1);
    /* The backward's scratch of the same runtime: dOut rows as xrows holds them, dw and dlog in f64, and 256-row
     * chunks of the wider expert's (w = max(I, sI)) products; bf16 experts add one expert widened. */
    const uint64_t C = 256, Wd = SI > I ? SI : I;
    uint64_t bwd = P * Th * K * H * 4 + T * K * 8 + T * E * 8 + 2 * (C * 2 * Wd * 4) + 2 * (C * Wd * 4) + 3 * (C * H * 4);
    n = hp_moe_bwd_layout(&s, a);
    CHECK_EQ_INT(n, HP_MOE_ARR_BWD_WGU - HP_MOE_ARR_BWD_FIRST);
    CHECK(hp_moe_ep_layout_bytes(a, n, &b));
    CHECK_MSG(b == bwd, "backward: %llu bytes, by hand %llu", (unsigned long long)b, (unsigned long long)bwd);
    s.bf16_experts = true;
    n = hp_moe_bwd_layout(&s, a);
    CHECK(hp_moe_ep_layout_bytes(a, n, &b));
    CHECK(n == HP_MOE_ARR_COUNT - HP_MOE_ARR_BWD_FIRST && b == bwd + 3 * I * H * 4);
    CHECK(a[0].id == HP_MOE_ARR_BWD_FIRST && !strcmp(a[n - 1].name, "wd"));
}

TEST(past_64_bits)
{
    hp_moe_ep_shape s = shape(1, (int64_t)1 << 60, 4, 1, false);
    hp_moe_ep_array a[HP_MOE_ARR_COUNT];
    int n = hp_moe_ep_layout(&s, a);
    uint64_t b = 0;
    CHECK(!hp_moe_ep_layout_bytes(a, n, &b));
    CHECK(b == UINT64_MAX);
    CHECK(a[0].id == HP_MOE_ARR_X64 && a[0].n == INT64_MAX); /* 2^60 · 16 saturates */
    /* Every count fits, but the sum's bytes do not. */
    s = shape(0, (int64_t)1 << 55, 1, 1, false);
    n = hp_moe_ep_layout(&s, a);
    for (int i = 0; i < n; i++) CHECK(a[i].n < INT64_MAX);
    CHECK(!hp_moe_ep_layout_bytes(a, n, &b) && b == UINT64_MAX);
}

int main(int argc, char **argv)
{
    hp_err err;
    if (hp_comm_world(&W, &argc, &argv, &err) != HP_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    hp_moe_set_threads(1);
    static const mpi_test tests[] = {{"layout_sum_is_the_runtime_bytes", test_layout_sum_is_the_runtime_bytes},
                                     {"one_process_workspace", test_one_process_workspace},
                                     {"bytes_by_hand", test_bytes_by_hand},
                                     {"past_64_bits", test_past_64_bits}};
    int rc = mpi_run_tests(W, tests, sizeof tests / sizeof *tests);
    hp_comm_free(W);
    return rc;
}
