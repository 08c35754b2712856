/*
 * comm.c — hp_comm dispatch, the collectives built on the backend primitives (agreement, alltoall), and
 * the one-process backend used when no launcher started us (so every non-MPI test runs without mpirun).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm_int.h"
#include "core/guard.h"
#include "core/rows.h"

/* ---- one process: every collective is a copy ---- */

struct hp_comm_req {
    const hp_comm *c;
};

static const char *self_name(const hp_comm *c)
{
    (void)c;
    return "single process";
}

static hp_status self_split(const hp_comm *c, int color, int key, hp_comm **out, hp_err *err);

static hp_status self_barrier(const hp_comm *c, hp_err *err)
{
    (void)c, (void)err;
    return HP_OK;
}

static hp_status self_bcast(const hp_comm *c, void *buf, size_t bytes, int root, hp_err *err)
{
    (void)c, (void)buf, (void)bytes, (void)root, (void)err;
    return HP_OK;
}

static hp_status self_allgather(const hp_comm *c, const void *send, size_t bytes, void *recv, hp_err *err)
{
    (void)c, (void)err;
    if (bytes) memmove(recv, send, bytes);
    return HP_OK;
}

static hp_comm_req g_self_req;

static hp_status self_ialltoallv(const hp_comm *c, const void *send, const size_t *sc, const size_t *sd, void *recv,
                                 const size_t *rc, const size_t *rd, hp_comm_req **req, hp_err *err)
{
    if (sc[0] != rc[0])
        return hp_err_set(err, HP_ERR_INPUT, "alltoallv on one process: sending %zu bytes but expecting %zu", sc[0],
                          rc[0]);
    if (sc[0]) memmove((char *)recv + rd[0], (const char *)send + sd[0], sc[0]);
    g_self_req.c = c;
    *req = &g_self_req;
    return HP_OK;
}

static hp_status self_wait(hp_comm_req *req, hp_err *err)
{
    (void)req, (void)err;
    return HP_OK;
}

static hp_status self_test(hp_comm_req *req, bool *done, hp_err *err)
{
    (void)req, (void)err;
    *done = true;
    return HP_OK;
}

static hp_status self_allreduce(const hp_comm *c, double *buf, size_t n, hp_red_op op, hp_err *err)
{
    (void)c, (void)buf, (void)n, (void)op, (void)err;
    return HP_OK;
}

static hp_status self_allreduce_f32(const hp_comm *c, float *buf, size_t n, hp_red_op op, hp_err *err)
{
    (void)c, (void)buf, (void)n, (void)op, (void)err;
    return HP_OK;
}

static hp_status self_reduce_scatter_f32(const hp_comm *c, const float *send, float *recv, size_t n, hp_err *err)
{
    (void)c, (void)err;
    if (n && send != recv) memmove(recv, send, n * sizeof *recv);
    return HP_OK;
}

static hp_status self_gatherv(const hp_comm *c, const void *send, size_t bytes, void *recv, const size_t *rc,
                              const size_t *rd, int root, hp_err *err)
{
    (void)c, (void)rc, (void)root, (void)err;
    if (bytes) memmove((char *)recv + rd[0], send, bytes);
    return HP_OK;
}

static void self_free(hp_comm *c) { free(c); }

static const hp_comm_ops g_self_ops = {self_name, self_split, self_barrier, self_bcast, self_allgather,
                                       self_ialltoallv, self_wait, self_test, self_allreduce, self_allreduce_f32,
                                       self_reduce_scatter_f32, self_gatherv, NULL, NULL, NULL, NULL, NULL,
                                       NULL, self_free};

hp_status hp_comm_self(hp_comm **out, hp_err *err)
{
    hp_comm *c = hp_calloc(1, sizeof *c);
    if (!c) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    c->ops = &g_self_ops;
    c->rank = 0;
    c->size = 1;
    *out = c;
    return HP_OK;
}

static hp_status self_split(const hp_comm *c, int color, int key, hp_comm **out, hp_err *err)
{
    (void)c, (void)color, (void)key;
    return hp_comm_self(out, err);
}

/* ---- dispatch ---- */

/* The one launcher check: Open MPI sets OMPI_COMM_WORLD_*, PMIx launchers PMIX_RANK, PMI-1/2 launchers
 * (MPICH's hydra, Slurm) PMI_RANK / PMI_SIZE, Intel MPI MPI_LOCALNRANKS. */
bool hp_comm_launched(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        if (getenv(vars[i])) return true;
    return false;
}

int hp_comm_launch_rank(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *v = getenv(vars[i]);
        if (!v || !*v) continue;
        char *end = NULL;
        long r = strtol(v, &end, 10);
        if (*end || r < 0 || r > INT32_MAX) continue; /* not a rank: ask the next variable */
        return (int)r;
    }
    return -1;
}

int hp_comm_launch_local_size(void)
{
    if (!hp_comm_launched()) return 1;
    static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *v = getenv(vars[i]);
        if (!v || !*v) continue;
        char *end = NULL;
        long n = strtol(v, &end, 10);
        if (*end || n < 1 || n > INT32_MAX) continue; /* not a count: ask the next variable */
        return (int)n;
    }
    return 0;
}

hp_status hp_comm_world(hp_comm **out, int *argc, char ***argv, hp_err *err)
{
    *out = NULL;
    hp_status st = hp_comm_launched() ? hp__mpi_world(out, argc, argv, err) : hp_comm_self(out, err);
    if (st == HP_OK && !hp_comm_launched()) (*out)->world = true;
    if (st == HP_OK) hp__test_set_rank((*out)->rank); /* the test hooks' rank (hp_test_hooks.only_rank, core/guard.h) */
    return st;
}

void hp_comm_free(hp_comm *c)
{
    if (c) c->ops->free(c);
}

int hp_comm_rank(const hp_comm *c) { return c->rank; }
int hp_comm_size(const hp_comm *c) { return c->size; }
bool hp_comm_is_mpi(const hp_comm *c) { return c->ops != &g_self_ops; }
const char *hp_comm_backend(const hp_comm *c) { return c->ops->name(c); }

double hp_comm_wtime(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

hp_status hp_comm_split(const hp_comm *c, int color, int key, hp_comm **out, hp_err *err)
{
    *out = NULL;
    return c->ops->split(c, color, key, out, err);
}

hp_status hp_comm_barrier(const hp_comm *c, hp_err *err) { return c->ops->barrier(c, err); }

hp_status hp_comm_bcast(const hp_comm *c, void *buf, size_t bytes, int root, hp_err *err)
{
    return c->ops->bcast(c, buf, bytes, root, err);
}

hp_status hp_comm_allgather(const hp_comm *c, const void *send, size_t bytes, void *recv, hp_err *err)
{
    return c->ops->allgather(c, send, bytes, recv, err);
}

static hp_status rows_check(const hp_comm *c, size_t rows, size_t bytes, size_t stride, size_t *blk, size_t *need,
                            hp_err *err)
{
    if (!hp_mul_size(bytes, (size_t)c->size, need) || stride < *need || !hp_mul_size(rows, bytes, blk) ||
        !hp_mul_size(*blk, (size_t)c->size, need))
        return hp_err_set(err, HP_ERR_INPUT, "allgather of %zu rows of %zu bytes: a row stride of %zu bytes cannot "
                          "hold %d blocks", rows, bytes, stride, c->size);
    return HP_OK;
}

hp_status hp_comm_allgather_rows_shared(const hp_comm *c, const void *send, size_t rows, size_t bytes, void *recv,
                                        size_t stride, bool *done, hp_err *err)
{
    size_t need, blk;
    *done = false;
    hp_status st = rows_check(c, rows, bytes, stride, &blk, &need, err);
    if (st != HP_OK) return st;
    if (!blk) return *done = true, HP_OK;
    return c->ops->allgather_rows ? c->ops->allgather_rows(c, send, rows, bytes, recv, stride, done, err) : HP_OK;
}

uint64_t hp__window_cap(uint64_t largest)
{
    const uint64_t mib = (uint64_t)1 << 20;
    if (largest > UINT64_MAX - (mib - 1)) return UINT64_MAX;
    uint64_t cap = (largest + mib - 1) & ~(mib - 1);
    return cap ? cap : mib;
}

uint64_t hp_comm_window_size(uint64_t largest)
{
    uint64_t cap = hp__window_cap(largest);
    return cap > UINT64_MAX / 2 - HP__WIN_HEAD ? UINT64_MAX : 2 * (HP__WIN_HEAD + cap);
}

uint64_t hp_comm_window_bytes(const hp_comm *c) { return c && c->ops->window_bytes ? c->ops->window_bytes(c) : 0; }

/* Through the backend's shared memory when it has it (MPI ranks on one node: comm_mpi.c), else built on the
 * non-blocking exchange: each peer's block arrives contiguous in tmp (shared memory: one copy by the kernel)
 * while this rank places its own block, then the peers' blocks are placed. MPI's strided receive (a vector
 * datatype) was measured to swing with the load on Open MPI 4.1's shared memory transport: it unpacks through
 * small fragments that need both ranks running at once (docs/run.md, "Collectives into place"). */
hp_status hp_comm_allgather_rows(const hp_comm *c, const void *send, size_t rows, size_t bytes, void *recv,
                                 size_t stride, void *tmp, hp_err *err)
{
    size_t need, blk;
    bool done = false;
    hp_status st = hp_comm_allgather_rows_shared(c, send, rows, bytes, recv, stride, &done, err);
    if (st != HP_OK || done) return st;
    (void)rows_check(c, rows, bytes, stride, &blk, &need, err); /* passed in hp_comm_allgather_rows_shared */
    if (rows == 1 && stride == need) return hp_comm_allgather(c, send, bytes, recv, err); /* contiguous blocks */
    size_t stack[4 * 64] = {0};
    size_t *a = c->size <= 64 ? stack : calloc(4 * (size_t)c->size, sizeof *a);
    if (!a) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    size_t *sc = a, *sd = a + c->size, *rc = sd + c->size, *rd = rc + c->size;
    for (int r = 0; r < c->size; r++) {
        sc[r] = rc[r] = r == c->rank ? 0 : blk;
        rd[r] = (size_t)r * blk;
    }
    hp_comm_req *req = NULL;
    st = hp_comm_ialltoallv(c, send, sc, sd, tmp, rc, rd, &req, err);
    if (st == HP_OK) hp__copy_rows((char *)recv + (size_t)c->rank * bytes, stride, send, bytes, rows, bytes);
    if (st == HP_OK) st = hp_comm_wait(req, err);
    for (int r = 0; st == HP_OK && r < c->size; r++)
        if (r != c->rank) hp__copy_rows((char *)recv + (size_t)r * bytes, stride, (char *)tmp + rd[r], bytes, rows, bytes);
    if (a != stack) free(a);
    return st;
}

hp_status hp_comm_ialltoallv(const hp_comm *c, const void *send, const size_t *scounts, const size_t *sdispls,
                             void *recv, const size_t *rcounts, const size_t *rdispls, hp_comm_req **req,
                             hp_err *err)
{
    *req = NULL;
    return c->ops->ialltoallv(c, send, scounts, sdispls, recv, rcounts, rdispls, req, err);
}

hp_status hp_comm_wait(hp_comm_req *req, hp_err *err)
{
    if (!req) return HP_OK;
    return req->c->ops->wait(req, err);
}

hp_status hp_comm_test(hp_comm_req *req, bool *done, hp_err *err)
{
    if (!req) {
        *done = true;
        return HP_OK;
    }
    return req->c->ops->test(req, done, err);
}

hp_status hp_comm_alltoallv(const hp_comm *c, const void *send, const size_t *scounts, const size_t *sdispls,
                            void *recv, const size_t *rcounts, const size_t *rdispls, hp_err *err)
{
    hp_comm_req *req = NULL;
    hp_status st = hp_comm_ialltoallv(c, send, scounts, sdispls, recv, rcounts, rdispls, &req, err);
    if (st != HP_OK) return st;
    return hp_comm_wait(req, err);
}

/* alltoall with equal blocks: the counts arrays live on the stack for small worlds. */
hp_status hp_comm_alltoall(const hp_comm *c, const void *send, size_t bytes, void *recv, hp_err *err)
{
    size_t stack[2 * 64] = {0};
    size_t *a = c->size <= 64 ? stack : calloc(2 * (size_t)c->size, sizeof *a);
    if (!a) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    size_t *cnt = a, *dsp = a + c->size;
    for (int r = 0; r < c->size; r++) {
        cnt[r] = bytes;
        dsp[r] = (size_t)r * bytes;
    }
    hp_status st = hp_comm_alltoallv(c, send, cnt, dsp, recv, cnt, dsp, err);
    if (a != stack) free(a);
    return st;
}

hp_status hp_comm_allreduce_sum_f64(const hp_comm *c, double *buf, size_t n, hp_err *err)
{
    return c->ops->allreduce_f64(c, buf, n, HP_RED_SUM, err);
}

hp_status hp_comm_allreduce_max_f64(const hp_comm *c, double *buf, size_t n, hp_err *err)
{
    return c->ops->allreduce_f64(c, buf, n, HP_RED_MAX, err);
}

hp_status hp_comm_allreduce_sum_f32(const hp_comm *c, float *buf, size_t n, hp_err *err)
{
    return c->ops->allreduce_f32(c, buf, n, HP_RED_SUM, err);
}

hp_status hp_comm_allreduce_max_f32(const hp_comm *c, float *buf, size_t n, hp_err *err)
{
    return c->ops->allreduce_f32(c, buf, n, HP_RED_MAX, err);
}

hp_status hp_comm_reduce_scatter_sum_f32(const hp_comm *c, const float *send, float *recv, size_t n, hp_err *err)
{
    return c->ops->reduce_scatter_f32(c, send, recv, n, err);
}

hp_status hp_comm_reduce_scatter_sum_f32_shared(const hp_comm *c, const float *send, float *recv, size_t n,
                                                hp_err *err)
{
    if (c->ops->reduce_scatter_shared) {
        bool done = false;
        hp_status st = c->ops->reduce_scatter_shared(c, send, recv, n, &done, err);
        if (st != HP_OK || done) return st;
    }
    return hp_comm_reduce_scatter_sum_f32(c, send, recv, n, err);
}

/* Every rank's byte count is checked against the root's rcounts before any data moves (an allgather of the
 * counts, then an agreement): a rank sending more than the root expects would overrun recv, one sending less
 * would leave the root waiting. A mismatch fails every rank with the same HP_ERR_INPUT. */
/* The peer of a point-to-point call: another rank of c, with a backend that has peers. */
static hp_status p2p_check(const hp_comm *c, int peer, int tag, bool can, const char *what, hp_err *err)
{
    if (peer < 0 || peer >= c->size || peer == c->rank || !can)
        return hp_err_set(err, HP_ERR_INPUT, "%s: rank %d is not another rank of this %d-rank communicator (rank %d)",
                          what, peer, c->size, c->rank);
    if (tag < 0 || tag > 32767) return hp_err_set(err, HP_ERR_INPUT, "%s: tag %d is outside [0, 32767]", what, tag);
    return HP_OK;
}

hp_status hp_comm_send(const hp_comm *c, int dst, const void *buf, size_t bytes, int tag, hp_err *err)
{
    hp_status st = p2p_check(c, dst, tag, c->ops->send != NULL, "send", err);
    return st == HP_OK ? c->ops->send(c, dst, buf, bytes, tag, err) : st;
}

hp_status hp_comm_recv(const hp_comm *c, int src, void *buf, size_t bytes, int tag, hp_err *err)
{
    hp_status st = p2p_check(c, src, tag, c->ops->recv != NULL, "receive", err);
    return st == HP_OK ? c->ops->recv(c, src, buf, bytes, tag, err) : st;
}

hp_status hp_comm_exchange(const hp_comm *c, const hp_comm_msg *msgs, int n, hp_err *err)
{
    for (int i = 0; i < n; i++) {
        hp_status st = p2p_check(c, msgs[i].peer, msgs[i].tag, c->ops->exchange != NULL,
                                 msgs[i].send ? "send" : "receive", err);
        if (st != HP_OK) return st;
    }
    return n > 0 ? c->ops->exchange(c, msgs, n, err) : HP_OK;
}

hp_status hp_comm_gatherv(const hp_comm *c, const void *send, size_t bytes, void *recv, const size_t *rcounts,
                          const size_t *rdispls, int root, hp_err *err)
{
    if (root < 0 || root >= c->size)
        return hp_err_set(err, HP_ERR_INPUT, "gather: root %d is outside the %d ranks", root, c->size);
    uint64_t mine = bytes, one, *all = c->size == 1 ? &one : calloc((size_t)c->size, sizeof *all);
    hp_status st = c->size == 1 ? HP_OK
                                : hp_comm_agree(c, all ? HP_OK : hp_err_set(err, HP_ERR_NOMEM, "out of memory"), err);
    if (st == HP_OK) st = hp_comm_allgather(c, &mine, sizeof mine, all, err);
    if (st != HP_OK) {
        if (all != &one) free(all);
        return st;
    }
    hp_status chk = HP_OK;
    for (int r = 0; c->rank == root && r < c->size && chk == HP_OK; r++)
        if (all[r] != rcounts[r])
            chk = hp_err_set(err, HP_ERR_INPUT,
                             "gather to rank %d: rank %d sends %llu bytes but rank %d expects %zu from it; the ranks "
                             "disagree on the size of their blocks (every rank must hold the block the root sized "
                             "for it)",
                             root, r, (unsigned long long)all[r], root, rcounts[r]);
    if (all != &one) free(all);
    if (st == HP_OK) st = hp_comm_agree(c, chk, err);
    if (st != HP_OK) return st;
    return c->ops->gatherv(c, send, bytes, recv, rcounts, rdispls, root, err);
}

/* The lowest failing rank is found with one max-reduction of (size - rank) over failing ranks; it then
 * broadcasts its status and message. */
void hp_comm_diverged(const hp_comm *c)
{
    ((hp_comm *)c)->diverged = true; /* every hp_comm is created non-const (hp_comm_world, split, self) */
}

hp_status hp_comm_agree(const hp_comm *c, hp_status local, hp_err *err)
{
    if (c->diverged) {
        if (local != HP_OK) return local;
        return hp_err_set(err, HP_ERR_INPUT, "the ranks were given different commands (see rank 0's message)");
    }
    double who = local != HP_OK ? (double)(c->size - c->rank) : 0.0;
    hp_err tmp;
    hp_status st = hp_comm_allreduce_max_f64(c, &who, 1, &tmp);
    if (st != HP_OK) {
        if (err) *err = tmp;
        return st;
    }
    if (who == 0.0) return HP_OK;
    int root = c->size - (int)who;
    struct {
        int32_t status;
        char msg[HP_ERR_MSG_MAX];
    } pkt;
    memset(&pkt, 0, sizeof pkt);
    if (c->rank == root) {
        pkt.status = (int32_t)local;
        if (err) snprintf(pkt.msg, sizeof pkt.msg, "%s", err->msg);
    }
    st = hp_comm_bcast(c, &pkt, sizeof pkt, root, &tmp);
    if (st != HP_OK) {
        if (err) *err = tmp;
        return st;
    }
    if (c->rank == root) return local; /* keep the original message */
    char own[24];
    snprintf(own, sizeof own, "rank %d: ", root);
    if (c->size > 1 && strncmp(pkt.msg, own, strlen(own)) != 0) /* name the rank once */
        return hp_err_set(err, (hp_status)pkt.status, "rank %d: %s", root, pkt.msg);
    if (c->size > 1) return hp_err_set(err, (hp_status)pkt.status, "%s", pkt.msg);
    return (hp_status)pkt.status;
}

int hp_comm_node_size(const hp_comm *c)
{
    /* the ranks whose host name is this rank's (FNV-1a of it, gathered) */
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "?");
    uint64_t h = 1469598103934665603ull;
    for (const char *q = host; *q; q++) h = (h ^ (unsigned char)*q) * 1099511628211ull;
    int n = hp_comm_size(c), same = 0;
    uint64_t *all = calloc((size_t)n, sizeof *all);
    hp_err err;
    if (!all || hp_comm_allgather(c, &h, sizeof h, all, &err) != HP_OK) {
        free(all);
        return 1;
    }
    for (int i = 0; i < n; i++) same += all[i] == h;
    free(all);
    return same > 0 ? same : 1;
}

const char *hp_run_coll_name(hp_run_coll k)
{
    static const char *const n[HP_RUN_COLL_COUNT] = {"all-gather", "all-reduce", "reduce-scatter", "gather",
                                                      "all-to-all"};
    return (unsigned)k < HP_RUN_COLL_COUNT ? n[k] : "?";
}
