/*
 * test_comm.c — the comm module under mpirun (1, 2, 4 ranks) and, run without a launcher, on the
 * one-process backend: alltoallv with uneven counts, the non-blocking variant, split, allgather, the
 * all-gather into place and the reduce-scatter (through the shared window on one node, through MPI with the
 * forced pieces), gatherv, reductions, and error agreement. tests/CMakeLists.txt also runs it with HP_MPI_FORCE_PIECES=1 and 3-byte
 * pieces, the path that splits messages larger than an MPI int.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperpar/comm.h"
#include "mpitest.h"

static hp_comm *W;

/* Rank r sends (r + 1) * (p + 1) bytes to rank p, each byte = 16 * r + p (mod 251). */
static void check_alltoallv(bool nonblocking)
{
    int n = hp_comm_size(W), r = hp_comm_rank(W);
    size_t *sc = calloc((size_t)n, sizeof *sc), *sd = calloc((size_t)n, sizeof *sd);
    size_t *rc = calloc((size_t)n, sizeof *rc), *rd = calloc((size_t)n, sizeof *rd);
    size_t st = 0, rt = 0;
    for (int p = 0; p < n; p++) {
        sc[p] = (size_t)(r + 1) * (size_t)(p + 1);
        sd[p] = st;
        st += sc[p];
        rc[p] = (size_t)(p + 1) * (size_t)(r + 1);
        rd[p] = rt;
        rt += rc[p];
    }
    unsigned char *send = malloc(st + 1), *recv = calloc(rt + 1, 1);
    for (int p = 0; p < n; p++) memset(send + sd[p], (16 * r + p) % 251, sc[p]);
    hp_err err;
    if (nonblocking) {
        hp_comm_req *req = NULL;
        CHECK(hp_comm_ialltoallv(W, send, sc, sd, recv, rc, rd, &req, &err) == HP_OK);
        CHECK(hp_comm_wait(req, &err) == HP_OK);
    } else {
        CHECK(hp_comm_alltoallv(W, send, sc, sd, recv, rc, rd, &err) == HP_OK);
    }
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < rc[p]; i++) CHECK_EQ_INT(recv[rd[p] + i], (16 * p + r) % 251);
    free(send);
    free(recv);
    free(sc);
    free(sd);
    free(rc);
    free(rd);
}

static void test_alltoallv(void)
{
    check_alltoallv(false);
    check_alltoallv(true);
}

static void test_alltoall_and_allgather(void)
{
    int n = hp_comm_size(W), r = hp_comm_rank(W);
    int64_t *send = malloc((size_t)n * sizeof *send), *recv = malloc((size_t)n * sizeof *recv);
    for (int p = 0; p < n; p++) send[p] = 1000 * r + p;
    hp_err err;
    CHECK(hp_comm_alltoall(W, send, sizeof *send, recv, &err) == HP_OK);
    for (int p = 0; p < n; p++) CHECK_EQ_INT(recv[p], 1000 * p + r);
    int64_t me = 7 * r + 1;
    CHECK(hp_comm_allgather(W, &me, sizeof me, recv, &err) == HP_OK);
    for (int p = 0; p < n; p++) CHECK_EQ_INT(recv[p], 7 * p + 1);
    free(send);
    free(recv);
}

/* Rank r's row o holds bytes (31 r + 7 o + j) mod 251; the stride's gap past the blocks keeps its sentinel. */
static void check_allgather_rows(const hp_comm *c, size_t rows, size_t bytes, size_t gap)
{
    int n = hp_comm_size(c), r = hp_comm_rank(c);
    size_t stride = (size_t)n * bytes + gap;
    unsigned char *send = malloc(rows * bytes + 1), *recv = malloc(rows * stride + 1);
    unsigned char *tmp = malloc(rows * bytes * (size_t)n + 1);
    for (size_t o = 0; o < rows; o++)
        for (size_t j = 0; j < bytes; j++) send[o * bytes + j] = (unsigned char)((31u * (unsigned)r + 7 * o + j) % 251);
    memset(recv, 0xEE, rows * stride + 1);
    hp_err err;
    void *t = rows == 1 && !gap ? NULL : tmp; /* contiguous blocks need no tmp */
    CHECK(hp_comm_allgather_rows(c, send, rows, bytes, recv, stride, t, &err) == HP_OK);
    size_t bad = 0;
    for (size_t o = 0; o < rows; o++) {
        for (int p = 0; p < n; p++)
            for (size_t j = 0; j < bytes; j++)
                bad += recv[o * stride + (size_t)p * bytes + j] != (unsigned char)((31u * (unsigned)p + 7 * o + j) % 251);
        for (size_t j = (size_t)n * bytes; j < stride; j++) bad += recv[o * stride + j] != 0xEE;
    }
    CHECK_EQ_INT(bad, 0);
    free(send);
    free(recv);
    free(tmp);
}

/* Growing sizes (the shared window grows past its first MiB), a smaller call after, contiguous blocks (one row,
 * no tmp), and a second communicator with its own window: every block lands in its rows, nothing else is
 * written. */
static void test_allgather_rows(void)
{
    check_allgather_rows(W, 3, 5, 0);
    check_allgather_rows(W, 1, 4099, 0);
    check_allgather_rows(W, 7, 13, 3);
    bool pieces = getenv("HP_MPI_FORCE_PIECES") != NULL; /* 3-byte pieces: a MiB would be 10^5 messages */
    if (!pieces) check_allgather_rows(W, 300, 4000, 16);
    check_allgather_rows(W, 1, 2, 1);
    hp_comm *half = NULL;
    hp_err err;
    CHECK(hp_comm_split(W, hp_comm_rank(W) % 2, hp_comm_rank(W), &half, &err) == HP_OK);
    if (half) {
        check_allgather_rows(half, 5, 9, 2);
        check_allgather_rows(W, 2, 3, 0); /* the world's window again, between the half's calls */
        if (!pieces) check_allgather_rows(half, 400, 3000, 0);
    }
    hp_comm_free(half);
}

/* n values per block: rank p's value i is an irrational-looking float, so rounding shows; MPI's collective and
 * the shared one: on two ranks the sums are a + b bit for bit, on more within MPI's order of adding. */
static void check_reduce_scatter(size_t n)
{
    int P = hp_comm_size(W), r = hp_comm_rank(W);
    float *send = malloc(n * (size_t)P * sizeof *send), *recv = malloc(n * sizeof *recv);
    for (size_t i = 0; i < n * (size_t)P; i++) send[i] = (float)(r + 1) * 0.1f + (float)i * 1.37e-3f;
    hp_err err;
    for (int shared = 0; shared < 2; shared++) {
        memset(recv, 0, n * sizeof *recv);
        CHECK((shared ? hp_comm_reduce_scatter_sum_f32_shared : hp_comm_reduce_scatter_sum_f32)(W, send, recv, n,
                                                                                               &err) == HP_OK);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) {
            float want = 0;
            for (int p = 0; p < P; p++) want += (float)(p + 1) * 0.1f + (float)((size_t)r * n + i) * 1.37e-3f;
            bad += P <= 2 ? recv[i] != want : !(fabsf(recv[i] - want) <= 1e-5f * fabsf(want));
        }
        CHECK_EQ_INT(bad, 0);
    }
    free(send);
    free(recv);
}

static void test_reduce_scatter(void)
{
    check_reduce_scatter(5);
    if (!getenv("HP_MPI_FORCE_PIECES")) check_reduce_scatter(300000); /* the window grows past its first MiB */
    check_reduce_scatter(3);
}

/* Ranks that disagree on the block size fail alike with the sizes named, on a fresh window (sizes reduced) and
 * on one in use (sizes in the headers); the MPI path (forced pieces) is not asked, it would truncate. */
static void test_allgather_rows_mismatch(void)
{
    if (hp_comm_size(W) < 2 || getenv("HP_MPI_FORCE_PIECES")) return;
    hp_comm *c = NULL;
    hp_err err;
    CHECK(hp_comm_split(W, 0, hp_comm_rank(W), &c, &err) == HP_OK);
    size_t bytes = hp_comm_rank(c) == 1 ? 24 : 16, stride = 24 * (size_t)hp_comm_size(c);
    unsigned char send[24] = {0}, *recv = calloc(stride, 1);
    for (int round = 0; round < 2; round++) {
        CHECK(hp_comm_allgather_rows(c, send, 1, bytes, recv, stride, NULL, &err) == HP_ERR_INPUT);
        CHECK_STR_CONTAINS(err.msg, "differ");
        check_allgather_rows(c, 2, 8, 0); /* the window still works */
    }
    free(recv);
    hp_comm_free(c);
}

/* The window's size rule (hp_comm_window_size), and what a communicator reports it allocated: the rule's figure for
 * its largest call when two or more ranks share the window, nothing on one rank or with MPI's collectives forced;
 * then hp_comm_allgather_rows_shared moves nothing and says so. */
static void test_window_bytes(void)
{
    const uint64_t mib = (uint64_t)1 << 20, slot1 = 2 * (64 + mib);
    CHECK(hp_comm_window_size(0) == slot1 && hp_comm_window_size(1) == slot1 && hp_comm_window_size(mib) == slot1);
    CHECK(hp_comm_window_size(mib + 1) == 2 * (64 + 2 * mib));
    CHECK(hp_comm_window_size(UINT64_MAX) == UINT64_MAX && hp_comm_window_size(UINT64_MAX / 2) == UINT64_MAX);
    hp_comm *c = NULL, *self = NULL;
    hp_err err;
    CHECK(hp_comm_self(&self, &err) == HP_OK);
    CHECK(hp_comm_window_bytes(self) == 0 && hp_comm_window_bytes(NULL) == 0);
    hp_comm_free(self);
    CHECK(hp_comm_split(W, 0, hp_comm_rank(W), &c, &err) == HP_OK);
    bool window = hp_comm_size(c) > 1 && !getenv("HP_MPI_FORCE_PIECES");
    CHECK(hp_comm_window_bytes(c) == 0); /* nothing before the first call */
    size_t sizes[] = {100, 3 * mib / 2, 1000};
    uint64_t largest = 0;
    for (int i = 0; i < 3; i++) {
        size_t n = (size_t)hp_comm_size(c), bytes = sizes[i];
        unsigned char *send = calloc(bytes, 1), *recv = malloc(bytes * n);
        memset(recv, 0xEE, bytes * n);
        bool done = true;
        CHECK(hp_comm_allgather_rows_shared(c, send, 1, bytes, recv, bytes * n, &done, &err) == HP_OK);
        largest = bytes > largest ? bytes : largest;
        if (!getenv("HP_MPI_SHM_AVAIL")) { /* a small /dev/shm takes the window away: asked in shm_small */
            CHECK(done == window);
            CHECK(hp_comm_window_bytes(c) == (window ? hp_comm_window_size(largest) : 0));
        }
        if (!done) CHECK(recv[0] == 0xEE && recv[bytes * n - 1] == 0xEE); /* nothing moved */
        free(send);
        free(recv);
    }
    hp_comm_free(c);
}

static void test_reductions_gatherv_bcast(void)
{
    int n = hp_comm_size(W), r = hp_comm_rank(W);
    double v[2] = {(double)r, (double)(10 - r)};
    hp_err err;
    CHECK(hp_comm_allreduce_sum_f64(W, v, 2, &err) == HP_OK);
    CHECK(v[0] == (double)(n * (n - 1) / 2) && v[1] == (double)(10 * n - n * (n - 1) / 2));
    double m = (double)r;
    CHECK(hp_comm_allreduce_max_f64(W, &m, 1, &err) == HP_OK && m == (double)(n - 1));
    /* rank p contributes p + 1 ints equal to p */
    int mine[8];
    for (int i = 0; i <= r; i++) mine[i] = r;
    size_t rc[8], rd[8], off = 0;
    for (int p = 0; p < n; p++) {
        rc[p] = (size_t)(p + 1) * sizeof(int);
        rd[p] = off;
        off += rc[p];
    }
    int all[64] = {0};
    CHECK(hp_comm_gatherv(W, mine, (size_t)(r + 1) * sizeof(int), all, rc, rd, 0, &err) == HP_OK);
    if (r == 0) {
        int k = 0;
        for (int p = 0; p < n; p++)
            for (int i = 0; i <= p; i++) CHECK_EQ_INT(all[k++], p);
    }
    char word[16] = "";
    if (r == n - 1) snprintf(word, sizeof word, "hello");
    CHECK(hp_comm_bcast(W, word, sizeof word, n - 1, &err) == HP_OK);
    CHECK_STR_EQ(word, "hello");
}

static void test_split(void)
{
    int n = hp_comm_size(W), r = hp_comm_rank(W);
    hp_comm *sub = NULL;
    hp_err err;
    CHECK(hp_comm_split(W, r % 2, -r, &sub, &err) == HP_OK); /* reversed order inside each color */
    if (!sub) return;
    int expect_size = (n + 1 - r % 2) / 2;
    CHECK_EQ_INT(hp_comm_size(sub), expect_size);
    int64_t me = r, got[8];
    CHECK(hp_comm_allgather(sub, &me, sizeof me, got, &err) == HP_OK);
    for (int i = 1; i < hp_comm_size(sub); i++) CHECK(got[i] < got[i - 1]);
    hp_comm_free(sub);
}

/* One rank's failure reaches every rank with that rank's message. */
static void test_agree(void)
{
    int n = hp_comm_size(W), r = hp_comm_rank(W);
    hp_err err;
    hp_err_clear(&err);
    CHECK(hp_comm_agree(W, HP_OK, &err) == HP_OK);
    int bad = n - 1;
    hp_status local = HP_OK;
    if (r == bad) local = hp_err_set(&err, HP_ERR_INPUT, "model.safetensors is truncated");
    hp_status st = hp_comm_agree(W, local, &err);
    CHECK(st == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "model.safetensors is truncated");
    if (r != bad && n > 1) {
        char want[32];
        snprintf(want, sizeof want, "rank %d:", bad);
        CHECK_STR_CONTAINS(err.msg, want);
    }
    /* Two failing ranks: the lowest wins. */
    local = r >= n - 2 ? hp_err_set(&err, HP_ERR_IO, "failure on rank %d", r) : HP_OK;
    st = hp_comm_agree(W, local, &err);
    CHECK(st == HP_ERR_IO);
    char want[32];
    snprintf(want, sizeof want, "failure on rank %d", n >= 2 ? n - 2 : 0);
    CHECK_STR_CONTAINS(err.msg, want);
}

/* A message that already names its rank ("rank 1: ...") is not prefixed a second time. */
static void test_agree_names_rank_once(void)
{
    int n = hp_comm_size(W), r = hp_comm_rank(W);
    hp_err err;
    hp_err_clear(&err);
    hp_status local = r == n - 1 ? hp_err_set(&err, HP_ERR_INPUT, "rank %d: the file is misnamed", r) : HP_OK;
    CHECK_EQ_INT(hp_comm_agree(W, local, &err), HP_ERR_INPUT);
    char want[64], twice[64];
    snprintf(want, sizeof want, "rank %d: the file is misnamed", n - 1);
    snprintf(twice, sizeof twice, "rank %d: rank %d:", n - 1, n - 1);
    CHECK_STR_CONTAINS(err.msg, want);
    CHECK(strstr(err.msg, twice) == NULL);
}

/* Issue 10 item 3: a rank sending another byte count than the root expects fails every rank with
 * HP_ERR_INPUT naming it, before any data moves (the root's buffer is exactly what it expects: ASan sees an
 * overrun), and a correct gather afterwards works. */
static void test_gatherv_count_mismatch(void)
{
    int n = hp_comm_size(W), r = hp_comm_rank(W);
    hp_err err;
    size_t *rc = calloc((size_t)n, sizeof *rc), *rd = calloc((size_t)n, sizeof *rd);
    int *all = calloc((size_t)n * 4, sizeof *all), mine[5] = {r, r, r, r, r};
    CHECK(rc && rd && all);
    if (!rc || !rd || !all) goto out;
    for (int p = 0; p < n; p++) {
        rc[p] = 4 * sizeof(int);
        rd[p] = (size_t)p * 4 * sizeof(int);
    }
    /* The last rank sends 5 ints where 4 are expected (more), then 3 (fewer). */
    for (int extra = 1; extra >= -1; extra -= 2) {
        size_t bytes = (size_t)(4 + (r == n - 1 ? extra : 0)) * sizeof(int);
        hp_status st = hp_comm_gatherv(W, mine, bytes, all, rc, rd, 0, &err);
        CHECK_EQ_INT(st, HP_ERR_INPUT);
        char want[96];
        snprintf(want, sizeof want, "rank %d sends %zu bytes but rank 0 expects %zu", n - 1,
                 (size_t)(4 + extra) * sizeof(int), 4 * sizeof(int));
        if (st != HP_OK) CHECK_STR_CONTAINS(err.msg, want);
    }
    CHECK(hp_comm_gatherv(W, mine, 4 * sizeof(int), all, rc, rd, 0, &err) == HP_OK);
    if (r == 0)
        for (int p = 0; p < n; p++) CHECK_EQ_INT(all[p * 4 + 3], p);
out:
    free(rc);
    free(rd);
    free(all);
}

/* Point to point: a message passed along the ranks 0 -> 1 -> ... -> n-1 (the way a pipeline's activations go),
 * each rank adding its rank to every element; an empty message; a receive of the wrong size; no peer alone. */
static void test_send_recv(void)
{
    hp_err err;
    int r = hp_comm_rank(W), n = hp_comm_size(W);
    size_t count = getenv("HP_MPI_FORCE_PIECES") ? 250 : 300000; /* forced pieces are 3 bytes: 10^3 messages */
    int32_t *buf = calloc(count, sizeof *buf);
    CHECK(buf != NULL);
    if (!buf) return;
    if (n == 1) {
        CHECK(hp_comm_send(W, 0, buf, 4, 0, &err) == HP_ERR_INPUT);
        CHECK_STR_CONTAINS(err.msg, "is not another rank");
        free(buf);
        return;
    }
    if (r > 0) CHECK(hp_comm_recv(W, r - 1, buf, count * sizeof *buf, 7, &err) == HP_OK);
    for (size_t i = 0; i < count; i++) buf[i] += r + (r == 0 ? (int32_t)i : 0);
    if (r + 1 < n) CHECK(hp_comm_send(W, r + 1, buf, count * sizeof *buf, 7, &err) == HP_OK);
    int32_t sum = (int32_t)(n * (n - 1) / 2);
    for (size_t i = 0; r == n - 1 && i < count; i++)
        if (buf[i] != (int32_t)i + sum) {
            CHECK_MSG(false, "element %zu: %d, want %d", i, buf[i], (int)i + sum);
            break;
        }
    /* an empty message is a message */
    if (r == 0) CHECK(hp_comm_send(W, 1, NULL, 0, 3, &err) == HP_OK);
    if (r == 1) CHECK(hp_comm_recv(W, 0, buf, 0, 3, &err) == HP_OK);
    /* a receive that expects more than was sent says both sizes (one piece: not with forced 3-byte pieces) */
    bool one_piece = !getenv("HP_MPI_FORCE_PIECES");
    if (r == 0 && one_piece) CHECK(hp_comm_send(W, 1, buf, 8, 4, &err) == HP_OK);
    if (r == 1 && one_piece) {
        CHECK(hp_comm_recv(W, 0, buf, 16, 4, &err) == HP_ERR_INPUT);
        CHECK_STR_CONTAINS(err.msg, "a piece of 8 bytes where 16 were expected");
    }
    CHECK(hp_comm_send(W, r, buf, 4, 0, &err) == HP_ERR_INPUT); /* not to itself */
    CHECK(hp_comm_send(W, (r + 1) % n, buf, 4, 40000, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "tag 40000");
    free(buf);
    CHECK(hp_comm_barrier(W, &err) == HP_OK);
}

/* Two ranks that each send to the other in one exchange (a rendezvous-sized message, in pieces when forced) do
 * not deadlock; a ring exchange reaches every rank; a dropped receive takes the bytes; a size mismatch is named. */
static void test_exchange(void)
{
    hp_err err;
    int r = hp_comm_rank(W), n = hp_comm_size(W);
    size_t count = getenv("HP_MPI_FORCE_PIECES") ? 200 : 400000;
    int32_t *out = calloc(count, sizeof *out), *in = calloc(count, sizeof *in);
    CHECK(out && in);
    if (!out || !in || n == 1) {
        if (n == 1) CHECK(hp_comm_exchange(W, &(hp_comm_msg){0, true, out, 4, 0}, 1, &err) == HP_ERR_INPUT);
        CHECK(hp_comm_exchange(W, NULL, 0, &err) == HP_OK);
        free(out), free(in);
        return;
    }
    for (size_t i = 0; i < count; i++) out[i] = r * 1000003 + (int32_t)i;
    int next = (r + 1) % n, prev = (r + n - 1) % n;
    hp_comm_msg m[2] = {{next, true, out, count * sizeof *out, 9}, {prev, false, in, count * sizeof *in, 9}};
    CHECK(hp_comm_exchange(W, m, 2, &err) == HP_OK);
    for (size_t i = 0; i < count; i++)
        if (in[i] != prev * 1000003 + (int32_t)i) {
            CHECK_MSG(false, "element %zu from rank %d: %d", i, prev, in[i]);
            break;
        }
    /* a dropped receive */
    hp_comm_msg d[2] = {{next, true, out, 64, 10}, {prev, false, NULL, 64, 10}};
    CHECK(hp_comm_exchange(W, d, 2, &err) == HP_OK);
    /* a receive that expects more than was sent (one piece) */
    if (!getenv("HP_MPI_FORCE_PIECES")) {
        hp_comm_msg b[2] = {{next, true, out, 8, 11}, {prev, false, in, 16, 11}};
        CHECK(hp_comm_exchange(W, b, 2, &err) == HP_ERR_INPUT);
        CHECK_STR_CONTAINS(err.msg, "8 bytes where 16");
    }
    CHECK(hp_comm_exchange(W, &(hp_comm_msg){r, true, out, 4, 0}, 1, &err) == HP_ERR_INPUT); /* not to itself */
    free(out), free(in);
    CHECK(hp_comm_barrier(W, &err) == HP_OK);
}

int main(int argc, char **argv)
{
    hp_err err;
    /* tests/CMakeLists.txt runs this program again with the MPI backend's hooks in the environment (as the CLI
     * takes them, tools/testhooks.c): installed before the world is made */
    const char *chunk = getenv("HP_MPI_CHUNK_BYTES"), *avail = getenv("HP_MPI_SHM_AVAIL");
    hp_test_hooks h = {.mpi_chunk_bytes = chunk ? atoll(chunk) : 0, .mpi_force_pieces = getenv("HP_MPI_FORCE_PIECES"),
                       .mpi_shm_set = avail != NULL, .mpi_shm_avail = avail ? atoll(avail) : 0};
    hp_test_hooks_install(&h);
    if (hp_comm_world(&W, &argc, &argv, &err) != HP_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    if (hp_comm_size(W) > 8) {
        hp_comm_free(W);
        return 0;
    }
    static const mpi_test tests[] = {{"alltoallv", test_alltoallv},
                 {"alltoall_and_allgather", test_alltoall_and_allgather},
                 {"allgather_rows", test_allgather_rows},
                 {"allgather_rows_mismatch", test_allgather_rows_mismatch},
                 {"window_bytes", test_window_bytes},
                 {"reduce_scatter", test_reduce_scatter},
                 {"reductions_gatherv_bcast", test_reductions_gatherv_bcast},
                 {"split", test_split},
                 {"agree", test_agree},
                 {"agree_names_rank_once", test_agree_names_rank_once},
                 {"gatherv_count_mismatch", test_gatherv_count_mismatch},
                 {"send_recv", test_send_recv},
                 {"exchange", test_exchange}};
    int rc = mpi_run_tests(W, tests, sizeof tests / sizeof *tests);
    hp_comm_free(W);
    return rc;
}
