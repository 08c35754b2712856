/*
 * common.c — facts several commands share, written once: the error exit of a command that ran collectives,
 * reading input_ids, and the moe.<l>.topk_idx key of the routed experts.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "hyperpar/comm.h"
#include "hyperpar/safetensors.h"

int cli_collective_exit(hp_comm *w, hp_status st, hp_err *err, bool agreed)
{
    if (st == HP_OK) return HP_EXIT_OK;
    const int R = hp_comm_rank(w), N = hp_comm_size(w);
    int code = hp_status_exit_code(st);
    if (!agreed) { /* this rank's own failure: only it knows, so it says so itself, naming its rank */
        if (N > 1) hp_err_prefix(err, "rank %d", R);
        return cli_fail(err);
    }
    /* every rank holds the same message: rank 0 prints it, and no rank exits before it has (mpirun may end
     * the whole job as soon as one rank exits with a non-zero status) */
    if (R == 0) code = cli_fail(err);
    fflush(stderr);
    hp_err e2;
    if (N > 1) (void)hp_comm_barrier(w, &e2);
    return code;
}

const char *cli_topk_key(int64_t layer, char *buf, size_t cap)
{
    snprintf(buf, cap, "moe.%lld.topk_idx", (long long)layer);
    return buf;
}

int cli_threads(const hp_comm *w, int64_t requested, cli_threads_info *info)
{
    cli_threads_info t = {.cores = hp_linalg_cores(), .local_ranks = hp_comm_launch_local_size()};
    if (t.local_ranks < 1) t.local_ranks = w ? hp_comm_node_size(w) : 1; /* collective: every rank asks */
    const char *env = getenv("OMP_NUM_THREADS");
    if (requested > 0) {
        t.threads = (int)requested;
        t.why = "--threads";
    } else if (env && *env) {
        t.threads = hp_linalg_set_threads(0); /* OpenMP read it */
        t.why = "OMP_NUM_THREADS";
    } else {
        t.threads = t.cores / t.local_ranks;
        if (t.threads < 1) t.threads = 1;
    }
    hp_linalg_set_threads(t.threads);
    hp_linalg_blas_threads(t.threads);
    if (info) *info = t;
    return t.threads;
}

const char *cli_threads_str(const cli_threads_info *t, char *buf, size_t cap)
{
    snprintf(buf, cap, "%d per rank (%s%s%d core%s, %d rank%s on this node)", t->threads, t->why ? t->why : "",
             t->why ? "; " : "", t->cores, t->cores == 1 ? "" : "s", t->local_ranks, t->local_ranks == 1 ? "" : "s");
    return buf;
}
