/*
 * comm_nompi.c — the MPI entry of the shared library the Python package loads (libhyperpar_c.so, built
 * without MPI so that `import hyperpar` works inside a torchrun process). Only the one-process backend of
 * comm.c is there; a process an MPI launcher started is told to use the CLI.
 */
#include "comm/comm_int.h"

hp_status hp__mpi_world(hp_comm **out, int *argc, char ***argv, hp_err *err)
{
    (void)argc, (void)argv;
    *out = NULL;
    return hp_err_set(err, HP_ERR_INPUT, "this build of the hyperpar library has no MPI (the Python package's "
                      "libhyperpar_c); run under mpirun with the hyperpar command instead");
}
