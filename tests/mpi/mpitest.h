/*
 * mpitest.h — the runner shared by the MPI tests: every rank runs every test (collectives inside tests
 * must be reached by all ranks), failures are reduced over the world, and rank 0 prints the
 * "N passed, N failed" line. Returns the process exit code.
 */
#ifndef HP_MPITEST_H
#define HP_MPITEST_H

#include <stdio.h>

#include "hyperpar/comm.h"
#include "testlib.h"

typedef struct mpi_test {
    const char *name;
    void (*fn)(void);
} mpi_test;

static int mpi_run_tests(hp_comm *w, const mpi_test *tests, size_t n)
{
    int passed = 0, failed = 0;
    for (size_t i = 0; i < n; i++) {
        int before = hp__failed_checks;
        tests[i].fn();
        if (hp__failed_checks == before) {
            passed++;
        } else {
            failed++;
            fprintf(stderr, "rank %d: FAIL %s\n", hp_comm_rank(w), tests[i].name);
        }
    }
    /* A test failing on any rank fails everywhere: the most failures seen by one rank is reported. */
    double f = failed;
    hp_err err;
    if (hp_comm_allreduce_max_f64(w, &f, 1, &err) != HP_OK) f = failed > 0 ? failed : 1;
    if (hp_comm_rank(w) == 0)
        printf("%d passed, %d failed (%d ranks, %s)\n", (int)n - (int)f, (int)f, hp_comm_size(w), hp_comm_backend(w));
    return f > 0 ? 1 : 0;
}

#endif
