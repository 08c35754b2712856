/*
 * comm_int.h — internal: the backend table behind hp_comm (comm.c: dispatch and the one-process backend;
 * comm_mpi.c: MPI, the only file that includes <mpi.h>).
 */
#ifndef HP_COMM_INT_H
#define HP_COMM_INT_H

#include "hyperpar/comm.h"

typedef enum { HP_RED_SUM, HP_RED_MAX } hp_red_op;

typedef struct hp_comm_ops {
    const char *(*name)(const hp_comm *c); /* held by c (or a constant): valid while c lives */
    hp_status (*split)(const hp_comm *c, int color, int key, hp_comm **out, hp_err *err);
    hp_status (*barrier)(const hp_comm *c, hp_err *err);
    hp_status (*bcast)(const hp_comm *c, void *buf, size_t bytes, int root, hp_err *err);
    hp_status (*allgather)(const hp_comm *c, const void *send, size_t bytes, void *recv, hp_err *err);
    hp_status (*ialltoallv)(const hp_comm *c, const void *send, const size_t *sc, const size_t *sd, void *recv,
                            const size_t *rc, const size_t *rd, hp_comm_req **req, hp_err *err);
    hp_status (*wait)(hp_comm_req *req, hp_err *err);
    hp_status (*test)(hp_comm_req *req, bool *done, hp_err *err);
    hp_status (*allreduce_f64)(const hp_comm *c, double *buf, size_t n, hp_red_op op, hp_err *err);
    hp_status (*allreduce_f32)(const hp_comm *c, float *buf, size_t n, hp_red_op op, hp_err *err);
    hp_status (*reduce_scatter_f32)(const hp_comm *c, const float *send, float *recv, size_t n, hp_err *err);
    hp_status (*gatherv)(const hp_comm *c, const void *send, size_t bytes, void *recv, const size_t *rc,
                         const size_t *rd, int root, hp_err *err);
    /* hp_comm_allgather_rows through memory that every rank of c maps (NULL: none). *done is false, on every
     * rank alike, when the backend cannot (the ranks span nodes, or the forced piecewise path): the caller
     * then takes the exchange. */
    hp_status (*allgather_rows)(const hp_comm *c, const void *send, size_t rows, size_t bytes, void *recv,
                                size_t stride, bool *done, hp_err *err);
    /* hp_comm_reduce_scatter_sum_f32_shared through that memory (NULL: none); *done as above. */
    hp_status (*reduce_scatter_shared)(const hp_comm *c, const float *send, float *recv, size_t n, bool *done,
                                       hp_err *err);
    /* hp_comm_send / hp_comm_recv to or from another rank (NULL: no peer, one process) */
    hp_status (*send)(const hp_comm *c, int dst, const void *buf, size_t bytes, int tag, hp_err *err);
    hp_status (*recv)(const hp_comm *c, int src, void *buf, size_t bytes, int tag, hp_err *err);
    /* hp_comm_exchange (NULL: no peer) */
    hp_status (*exchange)(const hp_comm *c, const hp_comm_msg *msgs, int n, hp_err *err);
    /* hp_comm_window_bytes (NULL: none, 0) */
    uint64_t (*window_bytes)(const hp_comm *c);
    void (*free)(hp_comm *c);
} hp_comm_ops;

struct hp_comm {
    const hp_comm_ops *ops;
    int rank, size;
    bool world;  /* freeing it finalizes the backend */
    bool diverged; /* hp_comm_diverged: every rank holds the same verdict; agreements return it at once */
    void *impl;
};

/* The shared window's layout (hp_comm_window_size is its size): a half is a header of HP__WIN_HEAD bytes and
 * hp__window_cap(largest) data bytes, the largest call's bytes per rank in whole MiB (at least one);
 * UINT64_MAX past 64 bits. */
#define HP__WIN_HEAD ((uint64_t)64)
uint64_t hp__window_cap(uint64_t largest);

/* comm_mpi.c */
hp_status hp__mpi_world(hp_comm **out, int *argc, char ***argv, hp_err *err);

#endif
