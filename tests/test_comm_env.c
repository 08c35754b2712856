/*
 * test_comm_env.c — the one launcher check (hp_comm_launched, hp_comm_launch_rank): which environment says
 * that mpirun started us and which rank it names, read before MPI starts. The CLI prints once on the rank it
 * names 0 (or when none), and hp_comm_world takes MPI exactly when hp_comm_launched says so.
 */
#include <stdlib.h>

#include "testlib.h"
#include "hyperpar/comm.h"

static const char *const g_vars[] = {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_SIZE", "PMIX_RANK",
                                     "PMI_RANK", "MPI_LOCALNRANKS"};

static void clear_env(void)
{
    for (size_t i = 0; i < sizeof g_vars / sizeof *g_vars; i++) unsetenv(g_vars[i]);
}

TEST(launcher_environment)
{
    clear_env();
    CHECK(!hp_comm_launched());
    CHECK_EQ_INT(hp_comm_launch_rank(), -1);
    /* each launcher's own variable is enough */
    static const char *const launched[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK",
                                           "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof launched / sizeof *launched; i++) {
        clear_env();
        setenv(launched[i], "1", 1);
        CHECK_MSG(hp_comm_launched(), "%s", launched[i]);
    }
    clear_env();
    setenv("OMPI_COMM_WORLD_RANK", "3", 1);
    CHECK_EQ_INT(hp_comm_launch_rank(), 3);
    setenv("PMIX_RANK", "5", 1); /* Open MPI's own variable first */
    CHECK_EQ_INT(hp_comm_launch_rank(), 3);
    clear_env();
    setenv("PMI_RANK", "0", 1);
    CHECK_EQ_INT(hp_comm_launch_rank(), 0);
    /* a value that is no rank is skipped, never read as 0 */
    clear_env();
    setenv("OMPI_COMM_WORLD_RANK", "x1", 1);
    CHECK_EQ_INT(hp_comm_launch_rank(), -1);
    setenv("PMIX_RANK", "2", 1);
    CHECK_EQ_INT(hp_comm_launch_rank(), 2);
    setenv("OMPI_COMM_WORLD_RANK", "", 1);
    CHECK_EQ_INT(hp_comm_launch_rank(), 2);
    setenv("OMPI_COMM_WORLD_RANK", "-4", 1);
    CHECK_EQ_INT(hp_comm_launch_rank(), 2);
    clear_env();
}

TEST_MAIN()
