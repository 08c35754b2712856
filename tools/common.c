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

int cli_threads(const hp_comm *w, int64_t requested, const char **why)
{
    int n, local = hp_comm_node_size(w); /* collective: every rank asks */
    const char *env = getenv("OMP_NUM_THREADS");
    if (requested > 0) {
        n = (int)requested;
        if (why) *why = "--threads";
    } else if (env && *env) {
        n = hp_linalg_set_threads(0); /* OpenMP read it */
        if (why) *why = "OMP_NUM_THREADS";
    } else {
        n = hp_linalg_cores() / local;
        if (n < 1) n = 1;
        if (why) *why = local > 1 ? "this node's cores shared by its ranks" : "this process's cores";
    }
    hp_linalg_set_threads(n);
    hp_linalg_blas_threads(n);
    return n;
}
