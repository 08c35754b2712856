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

hp_status cli_read_ids(const char *path, int64_t **ids, int64_t *B, int64_t *S, hp_err *err)
{
    if (ids) *ids = NULL;
    hp_st_file *f = NULL;
    hp_status st = hp_st_open(&f, path, err);
    if (st != HP_OK) return st;
    const hp_st_tensor *t = hp_st_find(f, CLI_IDS_KEY);
    if (!t) st = hp_err_set(err, HP_ERR_INPUT, "%s: no tensor 'input_ids' (I64 [B, S])", path);
    else if (t->n_dims != 2 || (t->dtype != HP_DT_I64 && t->dtype != HP_DT_I32))
        st = hp_err_set(err, HP_ERR_INPUT, "%s: 'input_ids' is %s with %d dims; expected I64 (or I32) [B, S]", path,
                        hp_dtype_name(t->dtype), t->n_dims);
    else if (t->shape[0] < 1 || t->shape[1] < 1)
        st = hp_err_set(err, HP_ERR_INPUT, "%s: 'input_ids' is [%lld, %lld]; it needs at least one token", path,
                        (long long)t->shape[0], (long long)t->shape[1]);
    if (st == HP_OK) {
        *B = t->shape[0];
        *S = t->shape[1];
    }
    if (st == HP_OK && ids) {
        int64_t n = t->shape[0] * t->shape[1]; /* the reader checked shape against the file's bytes */
        *ids = malloc((size_t)n * sizeof **ids);
        if (!*ids) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory for input_ids");
        /* guarded: a file truncated meanwhile is an error, not SIGBUS; I32 widened in place from the end */
        size_t es = t->dtype == HP_DT_I64 ? 8 : 4;
        if (st == HP_OK) st = hp_st_read(f, t, 0, *ids, (size_t)n * es, err);
        for (int64_t i = n - 1; st == HP_OK && es == 4 && i >= 0; i--) {
            int32_t v;
            memcpy(&v, (const char *)*ids + i * 4, 4);
            (*ids)[i] = v;
        }
        if (st != HP_OK) {
            free(*ids);
            *ids = NULL;
        }
    }
    hp_st_close(f);
    return st;
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
