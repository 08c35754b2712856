/*
 * testhooks.c — the HP_TEST_* environment, read in one place (testhooks.h).
 *
 * hyperpar's shell tests make a process pause at a named point (to kill it, signal it or truncate its input
 * there), fail its writes as a full disk would, or perturb one value of a run, by setting environment variables.
 * The library takes these hooks only from its callers (hp_test_hooks_install, hp_run_opts.test_*): a library
 * that read its environment would change behaviour inside any program that links it, and its tests could not set
 * a hook for one call. The CLI is the program the shell tests run, so it reads the variables here:
 *
 *   HP_TEST_ONLY_RANK=R             the hooks act only in the process of world rank R (not a number: none)
 *   HP_TEST_ENOSPC_AFTER=BYTES      the file writers fail with ENOSPC after BYTES in all (not a number: off)
 *   HP_TEST_PAUSE_BEFORE_READ=P     pause at the first read of a mapped file; HP_TEST_PAUSE_READ_OF=NAME: only
 *                                   of a file whose path holds NAME
 *   HP_TEST_PAUSE_MID_WRITE=P       pause the safetensors writer with its temporary holding the header;
 *                                   HP_TEST_PAUSE_WRITE_OF=TEXT: only for a file whose path holds TEXT
 *   HP_TEST_PAUSE_BEFORE_COMMIT=P   pause an output folder complete, before its rename into place
 *   HP_TEST_PAUSE_IN_STEP=P         with HP_TEST_PAUSE_STEP=T: pause `train --data` reading step T's batch
 *   HP_TEST_PERTURB_BOUNDARY=<fqn>  validate: perturb this boundary on a run of more than one rank
 *   HP_TEST_PERTURB_GRAD=<fqn>      validate --backward: nudge this parameter's gradient
 *   HP_TEST_MLP_WHOLE=1             run: the dense MLP on all rows at once, as training does
 *   HP_TEST_NAN_GRAD=<fqn>          train: this parameter's gradient becomes NaN after its sums
 *   HP_MPI_CHUNK_BYTES=N            the MPI backend sends messages of at most N bytes (1 GiB by default)
 *   HP_MPI_FORCE_PIECES=1           every collective goes as such messages, none through a shared window
 *   HP_MPI_SHM_AVAIL=BYTES          /dev/shm is taken to have BYTES free (the windows' fallback)
 *
 * A pause at P creates P.ready (holding the pid) and waits for P.go, a signal, or 120 s.
 */
#include "testhooks.h"

#include <stdlib.h>
#include <string.h>

#include "hyperpar/core.h"

/* The variable's value, NULL when unset or empty. */
static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* The MPI backend's hooks, HP_MPI_*. */
static void mpi_hooks(hp_test_hooks *h)
{
    const char *v;
    if ((v = env("HP_MPI_CHUNK_BYTES"))) h->mpi_chunk_bytes = atoll(v);
    h->mpi_force_pieces = (v = env("HP_MPI_FORCE_PIECES")) && !strcmp(v, "1");
    if ((v = env("HP_MPI_SHM_AVAIL"))) h->mpi_shm_set = true, h->mpi_shm_avail = atoll(v);
}

void cli_test_hooks_install(void)
{
    hp_test_hooks h = {0};
    const char *v = env("HP_TEST_ONLY_RANK");
    if (v) {
        char *end = NULL;
        long r = strtol(v, &end, 10);
        h.one_rank = true;
        h.only_rank = !*end && r >= 0 && r <= 1L << 30 ? (int)r : -1; /* not a rank: no process is selected */
    }
    if ((v = env("HP_TEST_ENOSPC_AFTER"))) {
        char *end = NULL;
        long long b = strtoll(v, &end, 10);
        h.full_disk = !*end && b >= 0;
        h.enospc_after = b;
    }
    h.pause_before_read = env("HP_TEST_PAUSE_BEFORE_READ");
    h.pause_read_of = env("HP_TEST_PAUSE_READ_OF");
    h.pause_mid_write = env("HP_TEST_PAUSE_MID_WRITE");
    h.pause_write_of = env("HP_TEST_PAUSE_WRITE_OF");
    h.pause_before_commit = env("HP_TEST_PAUSE_BEFORE_COMMIT");
    h.pause_in_step = env("HP_TEST_PAUSE_IN_STEP");
    if ((v = env("HP_TEST_PAUSE_STEP"))) h.pause_step = atoll(v);
    mpi_hooks(&h);
    hp_test_hooks_install(&h);
}

cli_test_env cli_test_env_get(void)
{
    const char *whole = getenv("HP_TEST_MLP_WHOLE");
    return (cli_test_env){.perturb_boundary = getenv("HP_TEST_PERTURB_BOUNDARY"),
                          .perturb_grad = getenv("HP_TEST_PERTURB_GRAD"),
                          .mlp_whole = whole && !strcmp(whole, "1"),
                          .nan_grad = getenv("HP_TEST_NAN_GRAD")};
}
