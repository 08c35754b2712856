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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_int.h"

/* 1 GiB pieces: far below INT_MAX, large enough that the per-message overhead is negligible. Tests lower it
 * (HP_MPI_CHUNK_BYTES) and force the piecewise path (HP_MPI_FORCE_PIECES=1) to exercise it with small data. */
static size_t g_chunk = (size_t)1 << 30;
static bool g_force_pieces;
#define HP_MPI_CHUNK g_chunk

typedef struct mpi_impl {
    MPI_Comm comm;
    int *ibuf;        /* [4 * size] int counts/displacements for the fast path */
    hp_comm_req *req; /* the one request a communicator has in flight */
    char name[96];    /* "MPI (<library version>)", for hp_comm_backend */
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

static hp_status mpi_reduce_scatter_f32(const hp_comm *c, const float *send, float *recv, size_t n, hp_err *err)
{
    if (n > (size_t)INT_MAX) return hp_err_set(err, HP_ERR_INPUT, "reduce-scatter of %zu values is too large", n);
    int code = MPI_Reduce_scatter_block(send, recv, (int)n, MPI_FLOAT, MPI_SUM, mc(c));
    return code == MPI_SUCCESS ? HP_OK : mpi_fail(err, code, "Reduce_scatter_block");
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

static const hp_comm_ops g_mpi_ops = {mpi_name, mpi_split, mpi_barrier, mpi_bcast, mpi_allgather,
                                      mpi_ialltoallv, mpi_wait, mpi_test, mpi_allreduce, mpi_allreduce_f32,
                                      mpi_reduce_scatter_f32, mpi_gatherv, mpi_free};

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
    const char *chunk = getenv("HP_MPI_CHUNK_BYTES");
    if (chunk && atoll(chunk) > 0 && (size_t)atoll(chunk) <= ((size_t)1 << 30)) g_chunk = (size_t)atoll(chunk);
    g_force_pieces = getenv("HP_MPI_FORCE_PIECES") && !strcmp(getenv("HP_MPI_FORCE_PIECES"), "1");
    return wrap(MPI_COMM_WORLD, true, out, err);
}
