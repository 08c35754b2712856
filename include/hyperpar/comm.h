/*
 * hyperpar/comm.h — the communication layer: MPI when launched by mpirun, one process otherwise.
 *
 * Only src/comm/comm_mpi.c includes <mpi.h>. Every other module talks to an hp_comm, so the same code runs
 * from one rank on a laptop (no mpirun, no MPI_Init) to many nodes. Counts are bytes in size_t; messages
 * larger than an MPI int are split into pieces, never truncated.
 *
 * Error agreement: hp_comm_agree() is a collective that every rank calls at a phase boundary with its own
 * status; when any rank failed, every rank returns the failing rank's status and message (prefixed with
 * "rank R"), so one rank's bad input ends all ranks cleanly instead of leaving them waiting in a collective.
 */
#ifndef HYPERPAR_COMM_H
#define HYPERPAR_COMM_H

#include "hyperpar/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Collective kinds the runtime counts (bytes each rank sends into them). */
typedef enum hp_run_coll {
    HP_RUN_ALL_GATHER = 0,
    HP_RUN_ALL_REDUCE,
    HP_RUN_REDUCE_SCATTER,
    HP_RUN_GATHER,   /* the logits (and validate's tensors) to rank 0 */
    HP_RUN_ALL_TO_ALL, /* the MoE token exchange of the EP group: dispatch and return, 2 calls per sparse layer */
    HP_RUN_COLL_COUNT
} hp_run_coll;

const char *hp_run_coll_name(hp_run_coll k); /* "all-gather", ... */

typedef struct hp_comm hp_comm;
typedef struct hp_comm_req hp_comm_req;

/* The world: MPI_COMM_WORLD under a launcher (mpirun sets OMPI_COMM_WORLD_SIZE / PMI_SIZE / PMIX_RANK),
 * the one-process backend otherwise. Free the world last; it finalizes MPI. */
hp_status hp_comm_world(hp_comm **out, int *argc, char ***argv, hp_err *err);
/* Whether a launcher (mpirun, srun, ...) started this process, from its environment; hp_comm_world takes MPI
 * exactly then. Callable before MPI starts. */
bool hp_comm_launched(void);
/* The rank the launcher's environment names for this process (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK: the
 * first that holds a number), or -1 when none does. Callable before MPI starts (to print once, on rank 0, what
 * every rank would print alike). */
int hp_comm_launch_rank(void);
/* How many ranks the launcher started on this node (OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS, PMI_LOCAL_SIZE:
 * the first that holds a positive number); 1 when no launcher started this process, 0 when one did but says
 * nothing (ask hp_comm_node_size then). Callable before MPI starts. */
int hp_comm_launch_local_size(void);
/* The one-process backend, whatever the environment (tests). */
hp_status hp_comm_self(hp_comm **out, hp_err *err);
void hp_comm_free(hp_comm *c);

int hp_comm_rank(const hp_comm *c);
int hp_comm_size(const hp_comm *c);
bool hp_comm_is_mpi(const hp_comm *c);
/* "MPI (Open MPI 4.1.4)" or "single process". */
const char *hp_comm_backend(const hp_comm *c);
/* Seconds on the monotonic clock (CLOCK_MONOTONIC), for intervals; needs no communicator and no MPI start, so
 * commands without one (tokenize, bench moe, cost --measure) time with it too. */
double hp_comm_wtime(void);

/* How many ranks of c run on this rank's node (the same host name), at least 1. Collective. */
int hp_comm_node_size(const hp_comm *c);
/* Ranks with the same color form a communicator, ordered by key then rank. Collective. */
hp_status hp_comm_split(const hp_comm *c, int color, int key, hp_comm **out, hp_err *err);

/* Collective error agreement (see above). Returns HP_OK only when every rank passed HP_OK. */
hp_status hp_comm_agree(const hp_comm *c, hp_status local, hp_err *err);
/* Every rank found, from data they all gathered, that the ranks were given different commands (the same
 * verdict on every rank, each holding its message): from now on hp_comm_agree returns the caller's failing
 * status at once, without communicating, because ranks running different commands may reach a different
 * number of agreements on their way out. Other collectives (the CLI's last barrier) still communicate. */
void hp_comm_diverged(const hp_comm *c);

hp_status hp_comm_barrier(const hp_comm *c, hp_err *err);
hp_status hp_comm_bcast(const hp_comm *c, void *buf, size_t bytes, int root, hp_err *err);
/* recv holds size * bytes: rank r's block at r * bytes. */
hp_status hp_comm_allgather(const hp_comm *c, const void *send, size_t bytes, void *recv, hp_err *err);
/* An all-gather into place along a non-leading dim: every rank sends `rows` contiguous rows of `bytes` (the
 * same on every rank); row o of rank r lands at recv + o * stride + r * bytes (stride >= size * bytes). Two
 * or more MPI ranks on one node pass the blocks through a shared-memory window the communicator keeps (rows *
 * bytes per rank, grown to the largest call: hp_comm_window_size; tmp unused). Otherwise the peers' blocks
 * pass through tmp (size * rows * bytes), each copied once into place, this rank's own while the peers' are in
 * flight; one row with stride size * bytes (contiguous blocks) is hp_comm_allgather, and tmp may be NULL. */
hp_status hp_comm_allgather_rows(const hp_comm *c, const void *send, size_t rows, size_t bytes, void *recv,
                                 size_t stride, void *tmp, hp_err *err);
/* hp_comm_allgather_rows through the shared window alone: *done false, on every rank alike, when the blocks must
 * take the exchange instead (the ranks span nodes, a one-rank or one-process communicator, the window off);
 * nothing moved then, and the caller calls hp_comm_allgather_rows with a tmp it reserves only then. */
hp_status hp_comm_allgather_rows_shared(const hp_comm *c, const void *send, size_t rows, size_t bytes, void *recv,
                                        size_t stride, bool *done, hp_err *err);
/* The bytes one rank maps for a communicator's shared window (the all-gathers above and the two-rank
 * reduce-scatter on one node) whose largest call put `largest` bytes per rank: two halves (calls alternate),
 * each a 64-byte header and the data in whole MiB, at least one. The one sizing rule: the MPI backend allocates
 * by it, hyperpar cost counts by it. UINT64_MAX past 64 bits. */
uint64_t hp_comm_window_size(uint64_t largest);
/* What this rank allocated for c's shared window (MPI_Win_allocate_shared: hp_comm_window_size of the largest
 * call so far), 0 when c has none. Shared memory, not anonymous: it shows as RssShmem, not RssAnon. */
uint64_t hp_comm_window_bytes(const hp_comm *c);
/* Every rank sends `bytes` to each rank: send and recv hold size * bytes. */
hp_status hp_comm_alltoall(const hp_comm *c, const void *send, size_t bytes, void *recv, hp_err *err);
/* Byte counts and displacements per peer (arrays of size entries). */
hp_status hp_comm_alltoallv(const hp_comm *c, const void *send, const size_t *scounts, const size_t *sdispls,
                            void *recv, const size_t *rcounts, const size_t *rdispls, hp_err *err);
/* Non-blocking alltoallv: the buffers and count arrays must stay valid until hp_comm_wait returns. */
hp_status hp_comm_ialltoallv(const hp_comm *c, const void *send, const size_t *scounts, const size_t *sdispls,
                             void *recv, const size_t *rcounts, const size_t *rdispls, hp_comm_req **req,
                             hp_err *err);
/* Completes req (it may not be used afterwards). */
hp_status hp_comm_wait(hp_comm_req *req, hp_err *err);
/* Lets the library progress req without blocking (MPI only moves data inside MPI calls); *done tells
 * whether it completed. hp_comm_wait must still be called. */
hp_status hp_comm_test(hp_comm_req *req, bool *done, hp_err *err);
hp_status hp_comm_allreduce_sum_f64(const hp_comm *c, double *buf, size_t n, hp_err *err);
hp_status hp_comm_allreduce_max_f64(const hp_comm *c, double *buf, size_t n, hp_err *err);
/* Root receives every rank's block (rcounts/rdispls in bytes, meaningful at root only). Collective: the
 * ranks first check every rank's `bytes` against the root's rcounts, and a mismatch fails every rank with
 * HP_ERR_INPUT naming the rank (never a short or overrun receive). */
/* f32 in place over every rank of c (sum or max). */
hp_status hp_comm_allreduce_sum_f32(const hp_comm *c, float *buf, size_t n, hp_err *err);
hp_status hp_comm_allreduce_max_f32(const hp_comm *c, float *buf, size_t n, hp_err *err);
/* send holds size(c) blocks of n floats; rank r receives the sum over ranks of block r into recv [n]. The
 * backend's own collective (MPI_Reduce_scatter_block: what `bench run` compares with). */
hp_status hp_comm_reduce_scatter_sum_f32(const hp_comm *c, const float *send, float *recv, size_t n, hp_err *err);
/* The same bytes; two MPI ranks on one node add through the communicator's shared window (the one of
 * hp_comm_allgather_rows, grown to n floats per rank) instead of the kernel copy of MPI's. */
hp_status hp_comm_reduce_scatter_sum_f32_shared(const hp_comm *c, const float *send, float *recv, size_t n,
                                                hp_err *err);
hp_status hp_comm_gatherv(const hp_comm *c, const void *send, size_t bytes, void *recv, const size_t *rcounts,
                          const size_t *rdispls, int root, hp_err *err);
/* Point to point (a pipeline's activations between stages): bytes to rank dst of c, or from rank src into buf,
 * blocking, under tag (0..32767). The two ranks agree on bytes and tag beforehand (the schedule says them); a
 * receive of another size is HP_ERR_INPUT naming both sizes. A rank cannot send to itself (a one-rank
 * communicator has no peer): HP_ERR_INPUT. */
hp_status hp_comm_send(const hp_comm *c, int dst, const void *buf, size_t bytes, int tag, hp_err *err);
hp_status hp_comm_recv(const hp_comm *c, int src, void *buf, size_t bytes, int tag, hp_err *err);
/* One message of hp_comm_exchange: bytes to (send) or from peer, under tag (0..32767). A receive into buf NULL
 * takes the bytes and drops them (a stage that failed still takes what its peer sends it). */
typedef struct hp_comm_msg {
    int peer;
    bool send;
    void *buf;
    size_t bytes;
    int tag;
} hp_comm_msg;
/* Posts every message (sends and receives, in the backend's pieces), then waits for all of them: they complete
 * in any order, so two ranks that each send to the other in the same exchange do not deadlock (what Megatron's
 * batched isend/irecv does between pipeline stages). Sizes checked as hp_comm_recv checks them. */
hp_status hp_comm_exchange(const hp_comm *c, const hp_comm_msg *msgs, int n, hp_err *err);

#ifdef __cplusplus
}
#endif
#endif
