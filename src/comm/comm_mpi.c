/*
 * comm_mpi.c — the MPI backend of hp_comm; the only file in hyperpar that includes <mpi.h>.
 *
 * Byte counts are size_t. MPI counts are int, so an exchange whose counts and displacements all fit in an
 * int is one MPI_(I)alltoallv over MPI_BYTE; a larger one becomes point-to-point messages of at most
 * HP_MPI_CHUNK bytes per peer and piece (split, never truncated). Errors come back as return codes
 * (MPI_ERRORS_RETURN) and become hp_err messages.
 */
#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

#include "comm/comm_int.h"
#include "core/guard.h"
#include "core/rows.h"

/* 1 GiB pieces: far below INT_MAX, large enough that the per-message overhead is negligible. Tests lower it
 * (HP_MPI_CHUNK_BYTES) and force the piecewise path (HP_MPI_FORCE_PIECES=1) to exercise it with small data. */
static size_t g_chunk = (size_t)1 << 30;
static bool g_force_pieces;
#define HP_MPI_CHUNK g_chunk

/* The window of mpi_allgather_rows and the two-rank reduce-scatter: one slot per rank, in memory every rank of
 * the communicator maps; a slot is two halves (calls alternate), each a header and cap bytes of data, sized by
 * hp_comm_window_size (comm.c: the rule hyperpar cost counts by). */
#define SHM_HEAD ((size_t)HP__WIN_HEAD)
typedef struct shm_win {
    int state;     /* 0 not asked yet; 1 the ranks share a node; -1 they do not (or the window failed) */
    MPI_Win win;   /* MPI_WIN_NULL until the first call */
    size_t cap;    /* data bytes per half */
    size_t bytes;  /* this rank's slot as allocated: 2 * (SHM_HEAD + cap), 0 without a window */
    char **slot;   /* [size]: rank r's slot as this process maps it */
    uint64_t seq;  /* calls so far: the half this call uses */
} shm_win;

typedef struct mpi_impl {
    MPI_Comm comm;
    int *ibuf;        /* [4 * size] int counts/displacements for the fast path */
    hp_comm_req *req; /* the one request a communicator has in flight */
    char name[96];    /* "MPI (<library version>)", for hp_comm_backend */
    shm_win shm;
} mpi_impl;

struct hp_comm_req {
    const hp_comm *c;
    MPI_Request *reqs;
    int n_reqs, cap;
};

static hp_status mpi_fail(hp_err *err, int rc, const char *what)
{
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, s, &len);
    return hp_err_set(err, HP_ERR_IO, "MPI %s failed: %.*s", what, len, s);
}

static MPI_Comm mc(const hp_comm *c) { return ((const mpi_impl *)c->impl)->comm; }

static const char *mpi_name(const hp_comm *c) { return ((const mpi_impl *)c->impl)->name; }

static void set_name(mpi_impl *im)
{
    char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(v, &len);
    size_t n = strcspn(v, ",\n");
    snprintf(im->name, sizeof im->name, "MPI (%.*s)", (int)(n < 60 ? n : 60), v);
}

static void mpi_free(hp_comm *c);

static hp_status wrap(MPI_Comm comm, bool world, hp_comm **out, hp_err *err);

static hp_status mpi_split(const hp_comm *c, int color, int key, hp_comm **out, hp_err *err)
{
    MPI_Comm nc;
    int rc = MPI_Comm_split(mc(c), color, key, &nc);
    if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "Comm_split");
    return wrap(nc, false, out, err);
}

static hp_status mpi_barrier(const hp_comm *c, hp_err *err)
{
    int rc = MPI_Barrier(mc(c));
    return rc == MPI_SUCCESS ? HP_OK : mpi_fail(err, rc, "Barrier");
}

static hp_status mpi_bcast(const hp_comm *c, void *buf, size_t bytes, int root, hp_err *err)
{
    for (size_t off = 0; off < bytes; off += HP_MPI_CHUNK) {
        size_t n = bytes - off < HP_MPI_CHUNK ? bytes - off : HP_MPI_CHUNK;
        int rc = MPI_Bcast((char *)buf + off, (int)n, MPI_BYTE, root, mc(c));
        if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "Bcast");
    }
    return HP_OK;
}

static hp_status mpi_allgather(const hp_comm *c, const void *send, size_t bytes, void *recv, hp_err *err)
{
    if (bytes > (size_t)INT_MAX) return hp_err_set(err, HP_ERR_INPUT, "allgather of %zu bytes per rank is too large", bytes);
    int rc = MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, mc(c));
    return rc == MPI_SUCCESS ? HP_OK : mpi_fail(err, rc, "Allgather");
}

static bool fits_int(const size_t *a, int n)
{
    for (int i = 0; i < n; i++)
        if (a[i] > (size_t)INT_MAX) return false;
    return true;
}

static hp_status req_grow(hp_comm_req *r, int need, hp_err *err)
{
    if (need <= r->cap) return HP_OK;
    MPI_Request *p = realloc(r->reqs, (size_t)need * sizeof *p);
    if (!p) return hp_err_set(err, HP_ERR_NOMEM, "out of memory for MPI requests");
    r->reqs = p;
    r->cap = need;
    return HP_OK;
}

static hp_status mpi_ialltoallv(const hp_comm *c, const void *send, const size_t *sc, const size_t *sd, void *recv,
                                const size_t *rc, const size_t *rd, hp_comm_req **out, hp_err *err)
{
    mpi_impl *im = c->impl;
    hp_comm_req *r = im->req;
    if (r->n_reqs) return hp_err_set(err, HP_ERR_INPUT, "a non-blocking exchange is already in flight on this communicator");
    const int n = c->size;
    int code;
    if (!g_force_pieces && fits_int(sc, n) && fits_int(sd, n) && fits_int(rc, n) && fits_int(rd, n)) {
        int *isc = im->ibuf, *isd = isc + n, *irc = isd + n, *ird = irc + n;
        for (int i = 0; i < n; i++) {
            isc[i] = (int)sc[i];
            isd[i] = (int)sd[i];
            irc[i] = (int)rc[i];
            ird[i] = (int)rd[i];
        }
        hp_status st = req_grow(r, 1, err);
        if (st != HP_OK) return st;
        code = MPI_Ialltoallv(send, isc, isd, MPI_BYTE, recv, irc, ird, MPI_BYTE, mc(c), &r->reqs[0]);
        if (code != MPI_SUCCESS) return mpi_fail(err, code, "Ialltoallv");
        r->n_reqs = 1;
    } else {
        /* Large exchange: pieces of at most HP_MPI_CHUNK bytes, tagged by piece index. */
        int pieces = 0;
        for (int i = 0; i < n; i++)
            pieces += (int)((sc[i] + HP_MPI_CHUNK - 1) / HP_MPI_CHUNK + (rc[i] + HP_MPI_CHUNK - 1) / HP_MPI_CHUNK);
        hp_status st = req_grow(r, pieces ? pieces : 1, err);
        if (st != HP_OK) return st;
        for (int p = 0; p < n; p++) {
            for (size_t off = 0, k = 0; off < rc[p]; off += HP_MPI_CHUNK, k++) {
                size_t len = rc[p] - off < HP_MPI_CHUNK ? rc[p] - off : HP_MPI_CHUNK;
                code = MPI_Irecv((char *)recv + rd[p] + off, (int)len, MPI_BYTE, p, (int)k, mc(c), &r->reqs[r->n_reqs]);
                if (code != MPI_SUCCESS) return mpi_fail(err, code, "Irecv");
                r->n_reqs++;
            }
            for (size_t off = 0, k = 0; off < sc[p]; off += HP_MPI_CHUNK, k++) {
                size_t len = sc[p] - off < HP_MPI_CHUNK ? sc[p] - off : HP_MPI_CHUNK;
                code = MPI_Isend((const char *)send + sd[p] + off, (int)len, MPI_BYTE, p, (int)k, mc(c),
                                 &r->reqs[r->n_reqs]);
                if (code != MPI_SUCCESS) return mpi_fail(err, code, "Isend");
                r->n_reqs++;
            }
        }
    }
    *out = r;
    return HP_OK;
}

static hp_status mpi_wait(hp_comm_req *r, hp_err *err)
{
    int code = r->n_reqs ? MPI_Waitall(r->n_reqs, r->reqs, MPI_STATUSES_IGNORE) : MPI_SUCCESS;
    r->n_reqs = 0;
    return code == MPI_SUCCESS ? HP_OK : mpi_fail(err, code, "Waitall");
}

static hp_status mpi_test(hp_comm_req *r, bool *done, hp_err *err)
{
    int flag = 1;
    int code = r->n_reqs ? MPI_Testall(r->n_reqs, r->reqs, &flag, MPI_STATUSES_IGNORE) : MPI_SUCCESS;
    *done = flag != 0;
    return code == MPI_SUCCESS ? HP_OK : mpi_fail(err, code, "Testall");
}

static hp_status mpi_allreduce(const hp_comm *c, double *buf, size_t n, hp_red_op op, hp_err *err)
{
    if (n > (size_t)INT_MAX) return hp_err_set(err, HP_ERR_INPUT, "allreduce of %zu values is too large", n);
    int code = MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_DOUBLE, op == HP_RED_SUM ? MPI_SUM : MPI_MAX, mc(c));
    return code == MPI_SUCCESS ? HP_OK : mpi_fail(err, code, "Allreduce");
}

static hp_status mpi_allreduce_f32(const hp_comm *c, float *buf, size_t n, hp_red_op op, hp_err *err)
{
    if (n > (size_t)INT_MAX) return hp_err_set(err, HP_ERR_INPUT, "allreduce of %zu values is too large", n);
    int code = MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, op == HP_RED_SUM ? MPI_SUM : MPI_MAX, mc(c));
    return code == MPI_SUCCESS ? HP_OK : mpi_fail(err, code, "Allreduce");
}

static void shm_release(shm_win *w)
{
    if (w->win != MPI_WIN_NULL) {
        MPI_Win_unlock_all(w->win);
        MPI_Win_free(&w->win);
    }
    w->win = MPI_WIN_NULL;
    w->cap = 0;
    w->bytes = 0;
}

/* Whether the window's backing file fits where Open MPI puts it (osc/sm: /dev/shm on Linux) with room to spare:
 * a tmpfs smaller than the window (a container's 64 MiB /dev/shm) maps it all the same and kills the process
 * with SIGBUS at the first page past its size. Without /dev/shm the file goes to the session directory. */
static double g_shm_avail = -1; /* tests: the bytes /dev/shm is taken to have free (HP_MPI_SHM_AVAIL) */

static bool shm_room(size_t window_bytes)
{
    struct statvfs fs;
    double avail = g_shm_avail;
    if (avail < 0) {
        if (statvfs("/dev/shm", &fs) != 0) return true;
        avail = (double)fs.f_bavail * (double)fs.f_frsize;
    }
    return (double)window_bytes <= avail / 2;
}

/* The window grown to halves of `bytes` (collective: every rank asks for the same size). It is held locked for
 * its life (MPI_Win_lock_all), so MPI_Win_sync orders this rank's stores around the barriers. When the node has
 * no room for it, or MPI cannot make it, *off: the window is dropped on every rank alike and the communicator's
 * collectives go to MPI's own from then on. */
static hp_status shm_reserve(const hp_comm *c, shm_win *w, size_t bytes, bool *off, hp_err *err)
{
    *off = false;
    if (bytes <= w->cap) return HP_OK;
    shm_release(w);
    uint64_t cap = hp__window_cap(bytes), slot = hp_comm_window_size(bytes); /* whole MiB: fewer regrowths */
    bool small = cap <= ((uint64_t)PTRDIFF_MAX / 2 - SHM_HEAD) / (uint64_t)c->size;
    int room = small && shm_room((size_t)c->size * (size_t)slot), all = 0;
    int code = MPI_Allreduce(&room, &all, 1, MPI_INT, MPI_MIN, mc(c));
    if (code != MPI_SUCCESS) return mpi_fail(err, code, "Allreduce");
    char *base = NULL;
    int ok = all && MPI_Win_allocate_shared((MPI_Aint)slot, 1, MPI_INFO_NULL, mc(c), &base, &w->win) == MPI_SUCCESS;
    if (all && (MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, mc(c)) != MPI_SUCCESS || !ok)) {
        if (w->win != MPI_WIN_NULL) MPI_Win_free(&w->win);
        ok = 0;
    }
    if (!ok) {
        w->win = MPI_WIN_NULL;
        w->state = -1;
        *off = true;
        return HP_OK;
    }
    MPI_Win_lock_all(MPI_MODE_NOCHECK, w->win);
    for (int r = 0; r < c->size; r++) {
        MPI_Aint size = 0;
        int unit = 0;
        MPI_Win_shared_query(w->win, r, &size, &unit, &w->slot[r]);
    }
    w->cap = (size_t)cap;
    w->bytes = (size_t)slot;
    return HP_OK;
}

/* This rank's stores ordered before the others' loads, at a barrier. */
static hp_status shm_fence(const hp_comm *c, hp_err *err)
{
    shm_win *w = &((mpi_impl *)c->impl)->shm;
    MPI_Win_sync(w->win);
    int code = MPI_Barrier(mc(c));
    MPI_Win_sync(w->win);
    return code == MPI_SUCCESS ? HP_OK : mpi_fail(err, code, "Barrier");
}

/* Rank r's half for this call: its header (the bytes it put) and then its data. */
static char *shm_half(const shm_win *w, int r) { return w->slot[r] + (w->seq & 1) * (SHM_HEAD + w->cap); }

/* Whether the window carries collectives on c (the same on every rank): two or more ranks share a node and the
 * piecewise path is not forced. Asked once. */
static bool shm_on(const hp_comm *c)
{
    shm_win *w = &((mpi_impl *)c->impl)->shm;
    if (w->state == 0) {
        MPI_Comm node;
        int n = 0;
        w->state = -1;
        if (!g_force_pieces && c->size > 1 &&
            MPI_Comm_split_type(mc(c), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
            MPI_Comm_size(node, &n);
            MPI_Comm_free(&node);
            w->slot = calloc((size_t)c->size, sizeof *w->slot);
            w->state = n == c->size && w->slot ? 1 : -1;
        }
        int mine = w->state, all = -1; /* the same on every rank: a rank short of memory takes the others off */
        MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, mc(c));
        w->state = all;
    }
    return w->state > 0;
}

/* One call through the window, at one barrier: put(ctx, dst) writes this rank's `bytes` into its half (when
 * they fit), the header says how many it put, the barrier, then every rank checks every header: a size that
 * differs fails every rank alike; one that did not fit grows the window on every rank and the call puts again.
 * The halves alternate between calls, so a rank writes the next call's half while a slower one still reads
 * this one's, and the barrier of the next call orders the one after. The caller reads the peers' halves
 * (shm_half) and then calls shm_done. */
static hp_status shm_put(const hp_comm *c, size_t bytes, void (*put)(void *ctx, char *dst), void *ctx, bool *off,
                         hp_err *err)
{
    shm_win *w = &((mpi_impl *)c->impl)->shm;
    for (int round = 0; round < 2; round++) {
        bool fits = w->win != MPI_WIN_NULL && bytes <= w->cap;
        if (w->win == MPI_WIN_NULL) { /* the first call: sizes agreed by a reduction instead of headers */
            unsigned long long sz[2] = {bytes, ~(unsigned long long)bytes}, mx[2];
            int code = MPI_Allreduce(sz, mx, 2, MPI_UNSIGNED_LONG_LONG, MPI_MAX, mc(c));
            if (code != MPI_SUCCESS) return mpi_fail(err, code, "Allreduce");
            if (mx[0] != bytes || ~mx[1] != bytes)
                return hp_err_set(err, HP_ERR_INPUT, "a collective through shared memory: the ranks' blocks differ "
                                  "(%llu to %llu bytes)", ~mx[1], mx[0]);
            hp_status st = shm_reserve(c, w, bytes, off, err);
            if (st != HP_OK || *off) return st;
            fits = true;
        }
        uint64_t head[2] = {bytes, fits};
        if (fits) put(ctx, shm_half(w, c->rank) + SHM_HEAD);
        memcpy(shm_half(w, c->rank), head, sizeof head);
        hp_status st = shm_fence(c, err);
        if (st != HP_OK) return st;
        size_t most = 0;
        bool all_fit = true;
        for (int r = 0; r < c->size; r++) {
            uint64_t h[2];
            memcpy(h, shm_half(w, r), sizeof h);
            if (h[0] != bytes)
                return hp_err_set(err, HP_ERR_INPUT, "a collective through shared memory: the ranks' blocks differ "
                                  "(rank %d puts %llu bytes, rank %d %zu)", r, (unsigned long long)h[0], c->rank, bytes);
            all_fit = all_fit && h[1];
            most = h[0] > most ? (size_t)h[0] : most;
        }
        if (all_fit) return HP_OK;
        /* every rank saw the same headers */
        if ((st = shm_reserve(c, w, most, off, err)) != HP_OK || *off) return st;
    }
    return hp_err_set(err, HP_ERR_INPUT, "a collective through shared memory did not fit its grown window");
}

static void shm_done(const hp_comm *c) { ((mpi_impl *)c->impl)->shm.seq++; }

typedef struct ag_put {
    const void *send;
    size_t rows, bytes, stride;
    char *own; /* this rank's rows in recv */
} ag_put;

static void ag_put_fn(void *ctx, char *dst)
{
    const ag_put *a = ctx;
    hp__copy_rows2(dst, a->bytes, a->own, a->stride, a->send, a->bytes, a->rows, a->bytes); /* read once */
}

/* Each rank copies its block into its half of a window that all the ranks map (one node) and into its own rows
 * (the block read once), then places the peers' blocks from their halves: no kernel copy. Open MPI's all-gather
 * between processes copies each block through the kernel (CMA), which on the 2-core VM moved 31 MiB at about a
 * third of memcpy's rate (docs/run.md, "Collectives through shared memory"). */
static hp_status mpi_allgather_rows(const hp_comm *c, const void *send, size_t rows, size_t bytes, void *recv,
                                    size_t stride, bool *done, hp_err *err)
{
    *done = shm_on(c);
    if (!*done) return HP_OK;
    shm_win *w = &((mpi_impl *)c->impl)->shm;
    ag_put a = {send, rows, bytes, stride, (char *)recv + (size_t)c->rank * bytes};
    bool off = false;
    hp_status st = shm_put(c, rows * bytes, ag_put_fn, &a, &off, err); /* hp_comm_allgather_rows checked the product */
    *done = !off;
    for (int r = 0; st == HP_OK && !off && r < c->size; r++)
        if (r != c->rank) hp__copy_rows((char *)recv + (size_t)r * bytes, stride, shm_half(w, r) + SHM_HEAD, bytes, rows, bytes);
    shm_done(c);
    return st;
}

static hp_status mpi_reduce_scatter_f32(const hp_comm *c, const float *send, float *recv, size_t n, hp_err *err)
{
    if (n > (size_t)INT_MAX) return hp_err_set(err, HP_ERR_INPUT, "reduce-scatter of %zu values is too large", n);
    int code = MPI_Reduce_scatter_block(send, recv, (int)n, MPI_FLOAT, MPI_SUM, mc(c));
    return code == MPI_SUCCESS ? HP_OK : mpi_fail(err, code, "Reduce_scatter_block");
}

typedef struct rs_put {
    const float *peer_half;
    size_t n;
} rs_put;

static void rs_put_fn(void *ctx, char *dst)
{
    const rs_put *a = ctx;
    memcpy(dst, a->peer_half, a->n * sizeof *a->peer_half);
}

/* Two ranks on one node: each puts the peer's half of its send into its half of the window, then adds the
 * peer's to its own (a + b is b + a: the bytes MPI's sum gives). On more ranks MPI's order of the partial sums
 * is its own, so those are left to MPI_Reduce_scatter_block (*done false). */
static hp_status mpi_reduce_scatter_shared(const hp_comm *c, const float *send, float *recv, size_t n, bool *done,
                                           hp_err *err)
{
    *done = c->size == 2 && shm_on(c);
    if (!*done) return HP_OK;
    shm_win *w = &((mpi_impl *)c->impl)->shm;
    int me = c->rank, peer = 1 - me;
    rs_put a = {send + (size_t)peer * n, n};
    bool off = false;
    hp_status st = shm_put(c, n * sizeof *send, rs_put_fn, &a, &off, err);
    *done = !off;
    if (st == HP_OK && !off) {
        const float *mine = send + (size_t)me * n, *theirs = (const float *)(shm_half(w, peer) + SHM_HEAD);
        for (size_t i = 0; i < n; i++) recv[i] = mine[i] + theirs[i];
    }
    shm_done(c);
    return st;
}

/* Root receives each rank's block with point-to-point messages (sizes beyond int are split). */
static hp_status mpi_gatherv(const hp_comm *c, const void *send, size_t bytes, void *recv, const size_t *rc,
                             const size_t *rd, int root, hp_err *err)
{
    int code;
    if (c->rank != root) {
        for (size_t off = 0, k = 0; off < bytes; off += HP_MPI_CHUNK, k++) {
            size_t len = bytes - off < HP_MPI_CHUNK ? bytes - off : HP_MPI_CHUNK;
            code = MPI_Send((const char *)send + off, (int)len, MPI_BYTE, root, (int)k, mc(c));
            if (code != MPI_SUCCESS) return mpi_fail(err, code, "Send");
        }
        return HP_OK;
    }
    for (int p = 0; p < c->size; p++) {
        if (p == root) {
            if (bytes) memmove((char *)recv + rd[p], send, bytes);
            continue;
        }
        for (size_t off = 0, k = 0; off < rc[p]; off += HP_MPI_CHUNK, k++) {
            size_t len = rc[p] - off < HP_MPI_CHUNK ? rc[p] - off : HP_MPI_CHUNK;
            code = MPI_Recv((char *)recv + rd[p] + off, (int)len, MPI_BYTE, p, (int)k, mc(c), MPI_STATUS_IGNORE);
            if (code != MPI_SUCCESS) return mpi_fail(err, code, "Recv");
        }
    }
    return HP_OK;
}

/* In pieces of HP_MPI_CHUNK bytes (at least one, so that an empty message is a message too), all under tag: MPI
 * keeps the order of one sender's messages of one tag. */
static hp_status mpi_send(const hp_comm *c, int dst, const void *buf, size_t bytes, int tag, hp_err *err)
{
    for (size_t off = 0; off == 0 || off < bytes; off += HP_MPI_CHUNK) {
        size_t len = bytes - off < HP_MPI_CHUNK ? bytes - off : HP_MPI_CHUNK;
        int code = MPI_Send((const char *)buf + off, (int)len, MPI_BYTE, dst, tag, mc(c));
        if (code != MPI_SUCCESS) return mpi_fail(err, code, "Send");
        if (bytes == 0) break;
    }
    return HP_OK;
}

static hp_status mpi_recv(const hp_comm *c, int src, void *buf, size_t bytes, int tag, hp_err *err)
{
    for (size_t off = 0; off == 0 || off < bytes; off += HP_MPI_CHUNK) {
        size_t len = bytes - off < HP_MPI_CHUNK ? bytes - off : HP_MPI_CHUNK;
        MPI_Status s;
        int got = 0, code = MPI_Recv((char *)buf + off, (int)len, MPI_BYTE, src, tag, mc(c), &s);
        if (code == MPI_SUCCESS) code = MPI_Get_count(&s, MPI_BYTE, &got);
        if (code != MPI_SUCCESS) return mpi_fail(err, code, "Recv");
        if ((size_t)got != len)
            return hp_err_set(err, HP_ERR_INPUT, "receive from rank %d: a piece of %d bytes where %zu were expected "
                              "(the ranks disagree on the message's %zu bytes)", src, got, len, bytes);
        if (bytes == 0) break;
    }
    return HP_OK;
}

/* Every message's pieces posted (MPI_Isend / MPI_Irecv), then one MPI_Waitall; the receives' sizes checked. */
static hp_status mpi_exchange(const hp_comm *c, const hp_comm_msg *msgs, int n, hp_err *err)
{
    size_t np = 0;
    for (int i = 0; i < n; i++) np += msgs[i].bytes ? (msgs[i].bytes + HP_MPI_CHUNK - 1) / HP_MPI_CHUNK : 1;
    MPI_Request *rq = malloc((np + 1) * sizeof *rq);
    MPI_Status *ss = malloc((np + 1) * sizeof *ss);
    size_t *want = malloc((np + 1) * sizeof *want);
    int *who = malloc((np + 1) * sizeof *who);
    char **drop = calloc((size_t)n + 1, sizeof *drop);
    hp_status st = HP_OK;
    size_t k = 0;
    if (!rq || !ss || !want || !who || !drop) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n && st == HP_OK; i++) {
        const hp_comm_msg *m = &msgs[i];
        char *buf = m->buf;
        if (!m->send && !buf && m->bytes && !(buf = drop[i] = malloc(m->bytes))) {
            st = hp_err_set(err, HP_ERR_NOMEM, "out of memory for %zu bytes from rank %d", m->bytes, m->peer);
            break;
        }
        for (size_t off = 0; off == 0 || off < m->bytes; off += HP_MPI_CHUNK) {
            size_t len = m->bytes - off < HP_MPI_CHUNK ? m->bytes - off : HP_MPI_CHUNK;
            int code = m->send ? MPI_Isend(buf + off, (int)len, MPI_BYTE, m->peer, m->tag, mc(c), &rq[k])
                               : MPI_Irecv(buf + off, (int)len, MPI_BYTE, m->peer, m->tag, mc(c), &rq[k]);
            if (code != MPI_SUCCESS) {
                st = mpi_fail(err, code, m->send ? "Isend" : "Irecv");
                break;
            }
            want[k] = m->send ? SIZE_MAX : len, who[k] = m->peer;
            k++;
            if (m->bytes == 0) break;
        }
    }
    if (k > 0) { /* what was posted completes, even after a failure to post the rest */
        int code = MPI_Waitall((int)k, rq, ss);
        if (code != MPI_SUCCESS && st == HP_OK) st = mpi_fail(err, code, "Waitall");
    }
    for (size_t i = 0; i < k && st == HP_OK; i++) {
        int got = 0;
        if (want[i] == SIZE_MAX) continue;
        MPI_Get_count(&ss[i], MPI_BYTE, &got);
        if ((size_t)got != want[i])
            st = hp_err_set(err, HP_ERR_INPUT, "receive from rank %d: a piece of %d bytes where %zu were expected (the "
                            "ranks disagree on the message's size)", who[i], got, want[i]);
    }
    for (int i = 0; drop && i < n; i++) free(drop[i]);
    free(rq), free(ss), free(want), free(who), free(drop);
    return st;
}

static uint64_t mpi_window_bytes(const hp_comm *c) { return ((const mpi_impl *)c->impl)->shm.bytes; }

static const hp_comm_ops g_mpi_ops = {mpi_name, mpi_split, mpi_barrier, mpi_bcast, mpi_allgather,
                                      mpi_ialltoallv, mpi_wait, mpi_test, mpi_allreduce, mpi_allreduce_f32,
                                      mpi_reduce_scatter_f32, mpi_gatherv, mpi_allgather_rows,
                                      mpi_reduce_scatter_shared, mpi_send, mpi_recv, mpi_exchange, mpi_window_bytes,
                                      mpi_free};

static hp_status wrap(MPI_Comm comm, bool world, hp_comm **out, hp_err *err)
{
    hp_comm *c = hp_calloc(1, sizeof *c);
    mpi_impl *im = hp_calloc(1, sizeof *im);
    hp_comm_req *r = hp_calloc(1, sizeof *r);
    int size = 0, rank = 0;
    MPI_Comm_size(comm, &size);
    MPI_Comm_rank(comm, &rank);
    int *ibuf = hp_calloc(4 * (size_t)size, sizeof *ibuf);
    if (!c || !im || !r || !ibuf) {
        free(c);
        free(im);
        free(r);
        free(ibuf);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    }
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    im->comm = comm;
    set_name(im);
    im->ibuf = ibuf;
    im->req = r;
    im->shm.win = MPI_WIN_NULL;
    r->c = c;
    c->ops = &g_mpi_ops;
    c->impl = im;
    c->rank = rank;
    c->size = size;
    c->world = world;
    *out = c;
    return HP_OK;
}

static void mpi_free(hp_comm *c)
{
    mpi_impl *im = c->impl;
    if (im->req->n_reqs) MPI_Waitall(im->req->n_reqs, im->req->reqs, MPI_STATUSES_IGNORE);
    free(im->req->reqs);
    free(im->req);
    free(im->ibuf);
    shm_release(&im->shm);
    free(im->shm.slot);
    if (!c->world) MPI_Comm_free(&im->comm);
    bool world = c->world;
    free(im);
    free(c);
    if (world) MPI_Finalize();
}

hp_status hp__mpi_world(hp_comm **out, int *argc, char ***argv, hp_err *err)
{
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (!inited && MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return hp_err_set(err, HP_ERR_IO, "MPI_Init failed; is this process started by mpirun?");
    const hp_test_hooks *h = hp__test_hooks(); /* the callers' (hp_test_hooks_install): no environment here */
    if (h->mpi_chunk_bytes > 0 && h->mpi_chunk_bytes <= 1LL << 30) g_chunk = (size_t)h->mpi_chunk_bytes;
    g_force_pieces = h->mpi_force_pieces;
    if (h->mpi_shm_set && h->mpi_shm_avail >= 0) g_shm_avail = (double)h->mpi_shm_avail;
    return wrap(MPI_COMM_WORLD, true, out, err);
}
